-- sql_query_engine 0.2.0 -> 0.3.0 (ALTER EXTENSION sql_query_engine UPDATE TO '0.3.0').
\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.3.0'" to load this file. \quit

-- Roles are told apart by OID, not by name: a role dropped and created again under the same
-- name, or renamed, never sees another role's history or sessions. Rows of roles that no
-- longer exist keep role_id 0 (history, which only its owner reads) or go (sessions).
ALTER TABLE @extschema@.nl_history ADD COLUMN role_id oid NOT NULL DEFAULT 0;
UPDATE @extschema@.nl_history h SET role_id = r.oid
    FROM pg_catalog.pg_roles r WHERE r.rolname = h.role;
ALTER TABLE @extschema@.nl_history ALTER COLUMN role_id SET DEFAULT current_user::regrole::oid;
DROP INDEX @extschema@.nl_history_role_at_idx;
CREATE INDEX nl_history_role_id_at_idx ON @extschema@.nl_history (role_id, at);
ALTER POLICY own_rows ON @extschema@.nl_history USING (role_id = current_user::regrole::oid)
    WITH CHECK (role_id = current_user::regrole::oid);

ALTER TABLE @extschema@.nl_sessions ADD COLUMN role_id oid NOT NULL DEFAULT 0;
UPDATE @extschema@.nl_sessions s SET role_id = r.oid
    FROM pg_catalog.pg_roles r WHERE r.rolname = s.role;
DELETE FROM @extschema@.nl_sessions WHERE role_id = 0;
ALTER TABLE @extschema@.nl_sessions ALTER COLUMN role_id SET DEFAULT current_user::regrole::oid;
ALTER TABLE @extschema@.nl_sessions DROP CONSTRAINT nl_sessions_pkey;
ALTER TABLE @extschema@.nl_sessions ADD PRIMARY KEY (role_id, session);
ALTER POLICY own_sessions ON @extschema@.nl_sessions USING (role_id = current_user::regrole::oid)
    WITH CHECK (role_id = current_user::regrole::oid);

-- nl_check analyses in a subtransaction now (parse analysis can run code): not in parallel mode.
ALTER FUNCTION @extschema@.nl_check(text) STABLE PARALLEL UNSAFE;

-- Verified examples are found through an index of their questions' words.
CREATE FUNCTION @extschema@.nl_example_words("question" text) RETURNS text[]
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'nl_example_words_wrapper';
ALTER TABLE @extschema@.nl_examples ADD COLUMN terms text[]
    GENERATED ALWAYS AS (@extschema@.nl_example_words(question)) STORED;
CREATE INDEX nl_examples_terms_idx ON @extschema@.nl_examples USING gin (terms)
    WITH (fastupdate = off);

-- Chat clients send the whole conversation: nl_ask and nl_call take its earlier turns, which
-- then replace the session's stored ones.
DROP FUNCTION @extschema@.nl_ask(text, text);
CREATE FUNCTION @extschema@.nl_ask("question" text, "session" text DEFAULT NULL,
    "turns" jsonb DEFAULT NULL) RETURNS jsonb
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'nl_ask_wrapper';
DROP PROCEDURE @extschema@.nl_call(text, text, jsonb);
CREATE PROCEDURE @extschema@.nl_call(question text, session text DEFAULT NULL,
    INOUT answer jsonb DEFAULT NULL, turns jsonb DEFAULT NULL)
LANGUAGE c AS 'MODULE_PATHNAME', 'nl_call_wrapper';

-- Saved questions for BI tools and dbt: answers kept as views, and answers typed as a row type.
CREATE FUNCTION @extschema@.nl_view("view_name" text, "question" text, "replace" bool DEFAULT false)
RETURNS text STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'nl_view_wrapper';
CREATE FUNCTION @extschema@.nl_view_refresh("view_name" text) RETURNS text
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'nl_view_refresh_wrapper';
CREATE FUNCTION @extschema@.nl_query_shaped("question" text, "shape" oid) RETURNS SETOF jsonb
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'nl_query_shaped_wrapper';
-- Answers typed as a row type the caller names: SELECT * FROM nl_query_as('...', NULL::my_type).
-- nl_query_shaped asks for exactly the type's columns (repairing answers with other ones) and
-- keys each row by the type's field names, column by column; jsonb_populate_record converts
-- the values (nl_query_shaped refuses types whose conversion would run code of their own).
CREATE FUNCTION @extschema@.nl_query_as("question" text, "shape" anyelement)
RETURNS SETOF anyelement
VOLATILE PARALLEL UNSAFE
LANGUAGE sql
AS $$
    SELECT pg_catalog.jsonb_populate_record(shape, r)
    FROM @extschema@.nl_query_shaped(question, pg_catalog.pg_typeof(shape)::pg_catalog.oid) AS r
$$;

-- Feedback on answers: a recorded answer marked right or corrected becomes a verified example
-- (from a role that may write them) or waits for review; examples say which answer they came
-- from.
ALTER TABLE @extschema@.nl_examples ADD COLUMN history_id bigint;
CREATE TABLE @extschema@.nl_feedback (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    role name NOT NULL DEFAULT current_user,
    role_id oid NOT NULL DEFAULT current_user::regrole::oid,
    history_id bigint NOT NULL,
    question text NOT NULL,
    correct boolean NOT NULL,
    -- the SQL the feedback vouches for: the answer's, or the correction (NULL when noted)
    sql text,
    status text NOT NULL CHECK (status IN ('promoted', 'pending', 'noted')),
    example_id bigint
);
ALTER TABLE @extschema@.nl_feedback ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_rows ON @extschema@.nl_feedback USING (role_id = current_user::regrole::oid)
    WITH CHECK (role_id = current_user::regrole::oid);
GRANT SELECT, INSERT ON @extschema@.nl_feedback TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.nl_feedback', '');
CREATE FUNCTION @extschema@.nl_feedback("history_id" bigint, "correct" bool,
    "corrected_sql" text DEFAULT NULL) RETURNS jsonb
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'nl_feedback_wrapper';
