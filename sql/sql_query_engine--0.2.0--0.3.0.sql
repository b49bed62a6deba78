-- sql_query_engine 0.2.0 -> 0.3.0 (ALTER EXTENSION sql_query_engine UPDATE TO '0.3.0').
\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.3.0'" to load this file. \quit

-- The extension's schema must be one only superusers can create in. Its install and update
-- scripts run as a superuser with that schema first on the search path: an operator or
-- function another role put there that matches a call more closely than pg_catalog's (say
-- `->>(jsonb, jsonb)` for `turn ->> 'sql'`) would run with the superuser's rights
-- (CVE-2018-1058). And the extension finds its tables by the schema's name, which the schema's
-- owner could give to a schema of its own. So its owner and every role granted CREATE on it
-- must be superusers (pg_database_owner stands for the database's owner: `public` of a
-- database a superuser owns will do), and no function or operator in it may belong to another
-- role. This block opens the install script and every update script (a test in store.rs
-- checks they are the same); each of its operators is pg_catalog's, named so.
DO $$
DECLARE
    schema_oid pg_catalog.oid := '@extschema@'::pg_catalog.regnamespace::pg_catalog.oid;
    creators text;
    their_code text;
BEGIN
    SELECT pg_catalog.string_agg(DISTINCT CASE
               WHEN c.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
               ELSE pg_catalog.quote_ident(r.rolname::pg_catalog.text) END, ', ')
      INTO creators
      FROM pg_catalog.pg_namespace n
      CROSS JOIN LATERAL (
          SELECT n.nspowner AS grantee
          UNION ALL
          SELECT a.grantee
            FROM pg_catalog.aclexplode(COALESCE(n.nspacl,
                     pg_catalog.acldefault('n'::pg_catalog."char", n.nspowner))) a
           WHERE a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'::pg_catalog.text) c
      LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) CASE
          WHEN c.grantee OPERATOR(pg_catalog.=)
               'pg_database_owner'::pg_catalog.regrole::pg_catalog.oid
          THEN (SELECT d.datdba FROM pg_catalog.pg_database d
                 WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
          ELSE c.grantee END
     WHERE n.oid OPERATOR(pg_catalog.=) schema_oid AND r.rolsuper IS NOT TRUE;
    SELECT pg_catalog.string_agg(f.what, ', ') INTO their_code FROM (
        SELECT pg_catalog.format('function %s', p.oid::pg_catalog.regprocedure) AS what
          FROM pg_catalog.pg_proc p
          JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) p.proowner
         WHERE p.pronamespace OPERATOR(pg_catalog.=) schema_oid AND NOT r.rolsuper
        UNION ALL
        SELECT pg_catalog.format('operator %s', o.oid::pg_catalog.regoperator)
          FROM pg_catalog.pg_operator o
          JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) o.oprowner
         WHERE o.oprnamespace OPERATOR(pg_catalog.=) schema_oid AND NOT r.rolsuper
         LIMIT 20) f;
    IF creators IS NOT NULL OR their_code IS NOT NULL THEN
        RAISE EXCEPTION 'sql_query_engine cannot be installed or updated in schema %: a role that is not a superuser owns it, may create in it or owns functions or operators in it',
            '@extschema@'
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('Owner or may create in it: %s. Their functions and operators in it: %s. An operator or function of theirs that matches a call of the extension''s script more closely than pg_catalog''s would run with your rights, and the schema''s owner could put tables of its own in place of the extension''s.',
                      COALESCE(creators, 'none'), COALESCE(their_code, 'none')),
                  HINT = 'Install it in a schema of its own: CREATE SCHEMA nl; GRANT USAGE ON SCHEMA nl TO PUBLIC; CREATE EXTENSION sql_query_engine SCHEMA nl; and add nl to the search path (ALTER DATABASE ... SET search_path = "$user", public, nl). To update it where it is, a superuser takes the schema (ALTER SCHEMA ... OWNER TO), revokes CREATE on it from those roles and moves their functions and operators out first.';
    END IF;
END
$$;

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
