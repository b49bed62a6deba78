-- The extension's schema must be one only superusers can create in. Its install and update
-- scripts run as a superuser with that schema first on the search path: an operator or
-- function another role put there that matches a call more closely than pg_catalog's (say
-- `->>(jsonb, jsonb)` for `turn ->> 'sql'`) would run with the superuser's rights
-- (CVE-2018-1058). And the extension finds its tables by the schema's name, which the schema's
-- owner could give to a schema of its own. So no role that is not a superuser may create in
-- it or have its owner's rights (pg_database_owner stands for the database's owner: `public`
-- of a database a superuser owns will do), and no function, aggregate or operator in it may
-- run code such a role owns or may replace. Roles are asked as PostgreSQL answers for them
-- (has_schema_privilege, pg_has_role), so grants through other roles count. This block opens
-- the install script and every update script (a test in store.rs checks they are the same);
-- each of its operators is pg_catalog's, named so. An update script then resolves names in
-- pg_catalog alone, so an object committed after this check is never found.
DO $$
DECLARE
    schema_oid pg_catalog.oid := '@extschema@'::pg_catalog.regnamespace::pg_catalog.oid;
    database_owner_oid pg_catalog.oid := 'pg_database_owner'::pg_catalog.regrole::pg_catalog.oid;
    schema_owner_oid pg_catalog.oid;
    creators text;
    their_code text;
BEGIN
    SELECT CASE WHEN n.nspowner OPERATOR(pg_catalog.=) database_owner_oid
                THEN (SELECT d.datdba FROM pg_catalog.pg_database d
                       WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
                ELSE n.nspowner END
      INTO schema_owner_oid
      FROM pg_catalog.pg_namespace n WHERE n.oid OPERATOR(pg_catalog.=) schema_oid;
    SELECT pg_catalog.string_agg(w.who, ', ') INTO creators FROM (
        (SELECT 'PUBLIC' AS who
           FROM pg_catalog.pg_namespace n,
                pg_catalog.aclexplode(COALESCE(n.nspacl,
                    pg_catalog.acldefault('n'::pg_catalog."char", n.nspowner))) a
          WHERE n.oid OPERATOR(pg_catalog.=) schema_oid
            AND a.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid
            AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'::pg_catalog.text)
        UNION ALL
        (SELECT pg_catalog.quote_ident(r.rolname::pg_catalog.text)
           FROM pg_catalog.pg_roles r
          WHERE NOT r.rolsuper
            AND r.oid OPERATOR(pg_catalog.<>) database_owner_oid
            AND (pg_catalog.has_schema_privilege(r.oid, schema_oid, 'CREATE'::pg_catalog.text)
                 OR pg_catalog.pg_has_role(r.oid, schema_owner_oid, 'USAGE'::pg_catalog.text))
          ORDER BY 1 LIMIT 20)) w;
    WITH code AS (
        SELECT pg_catalog.format('function %s', p.oid::pg_catalog.regprocedure) AS what,
               p.proowner AS owner
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace OPERATOR(pg_catalog.=) schema_oid
        UNION ALL
        SELECT pg_catalog.format('aggregate %s', a.aggfnoid::pg_catalog.regprocedure),
               s.proowner
          FROM pg_catalog.pg_aggregate a
          JOIN pg_catalog.pg_proc p
            ON p.oid OPERATOR(pg_catalog.=) a.aggfnoid::pg_catalog.oid
          JOIN pg_catalog.pg_proc s ON s.oid OPERATOR(pg_catalog.=) ANY (ARRAY[
               a.aggtransfn::pg_catalog.oid, a.aggfinalfn::pg_catalog.oid,
               a.aggcombinefn::pg_catalog.oid, a.aggserialfn::pg_catalog.oid,
               a.aggdeserialfn::pg_catalog.oid, a.aggmtransfn::pg_catalog.oid,
               a.aggminvtransfn::pg_catalog.oid, a.aggmfinalfn::pg_catalog.oid])
         WHERE p.pronamespace OPERATOR(pg_catalog.=) schema_oid
        UNION ALL
        SELECT pg_catalog.format('operator %s', o.oid::pg_catalog.regoperator), c.owner
          FROM pg_catalog.pg_operator o
          CROSS JOIN LATERAL (
              SELECT o.oprowner AS owner
              UNION ALL
              SELECT s.proowner FROM pg_catalog.pg_proc s
               WHERE s.oid OPERATOR(pg_catalog.=) ANY (ARRAY[o.oprcode::pg_catalog.oid,
                     o.oprrest::pg_catalog.oid, o.oprjoin::pg_catalog.oid])) c
         WHERE o.oprnamespace OPERATOR(pg_catalog.=) schema_oid),
    owners AS (SELECT DISTINCT code.owner FROM code),
    untrusted AS (
        SELECT w.owner FROM owners w
         WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_roles s
                            WHERE s.oid OPERATOR(pg_catalog.=) w.owner AND s.rolsuper)
            OR EXISTS (SELECT FROM pg_catalog.pg_roles r
                        WHERE NOT r.rolsuper
                          AND pg_catalog.pg_has_role(r.oid, w.owner, 'USAGE'::pg_catalog.text)))
    SELECT pg_catalog.string_agg(DISTINCT f.what, ', ') INTO their_code FROM (
        SELECT code.what FROM code
          JOIN untrusted u ON u.owner OPERATOR(pg_catalog.=) code.owner
         LIMIT 20) f;
    IF creators IS NOT NULL OR their_code IS NOT NULL THEN
        RAISE EXCEPTION 'sql_query_engine cannot be installed or updated in schema %: a role that is not a superuser owns it, may create in it or owns functions or operators in it',
            '@extschema@'
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('Roles that are not superusers but may create in it or act as its owner: %s. Functions, aggregates and operators in it whose code such roles own or may replace: %s. An operator or function of theirs that matches a call of the extension''s script more closely than pg_catalog''s would run with your rights, and the schema''s owner could put tables of its own in place of the extension''s.',
                      COALESCE(creators, 'none'), COALESCE(their_code, 'none')),
                  HINT = 'Install it in a schema of its own: CREATE SCHEMA nl; GRANT USAGE ON SCHEMA nl TO PUBLIC; CREATE EXTENSION sql_query_engine SCHEMA nl; and add nl to the search path (ALTER DATABASE ... SET search_path = "$user", public, nl). To update it where it is, a superuser takes the schema (ALTER SCHEMA ... OWNER TO), revokes CREATE on it from those roles and moves their functions and operators out first.';
    END IF;
END
$$;

/* <begin connected objects> */
/*
This file is auto generated by pgrx.

The ordering of items is not stable, it is driven by a dependency graph.
*/
/* </end connected objects> */

/* <begin connected objects> */
-- src/lib.rs:25
-- The schema version: DDL bumps it, and every backend compares it with the version its cached
-- schema context was built from, so a new column is visible to the very next question.
-- A sequence, because bumping it takes no lock and never conflicts between concurrent DDL.
CREATE SEQUENCE @extschema@.nl_schema_version;
GRANT USAGE, SELECT ON SEQUENCE @extschema@.nl_schema_version TO PUBLIC;

-- Runs as the role that executed the DDL. It must never make that DDL fail.
CREATE FUNCTION @extschema@.nl_schema_changed() RETURNS event_trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM nextval('@extschema@.nl_schema_version');
EXCEPTION WHEN OTHERS THEN
    NULL;
END
$$;

CREATE EVENT TRIGGER nl_schema_changed_ddl ON ddl_command_end
    EXECUTE FUNCTION @extschema@.nl_schema_changed();
CREATE EVENT TRIGGER nl_schema_changed_drop ON sql_drop
    EXECUTE FUNCTION @extschema@.nl_schema_changed();
/* </end connected objects> */

/* <begin connected objects> */
-- src/lib.rs:31
-- The history of questions: one row per nl_query, nl_generate and nl_answer call
-- (sql_query_engine.history). Its owner reads every row; other roles see only their own (row
-- level security). Written in the caller's transaction, best effort: skipped in read-only
-- transactions and on standbys.
CREATE TABLE @extschema@.nl_history (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    role name NOT NULL DEFAULT current_user,
    function text NOT NULL,
    session text,
    question text NOT NULL,
    sql text,
    status text NOT NULL,
    attempts jsonb NOT NULL,
    row_count integer,
    ms double precision NOT NULL,
    llm_calls integer NOT NULL,
    prompt_tokens integer NOT NULL,
    completion_tokens integer NOT NULL
);
CREATE INDEX ON @extschema@.nl_history (role, at);
ALTER TABLE @extschema@.nl_history ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_rows ON @extschema@.nl_history USING (role = current_user)
    WITH CHECK (role = current_user);
GRANT SELECT, INSERT ON @extschema@.nl_history TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.nl_history', '');
/* </end connected objects> */

/* <begin connected objects> */
-- src/api.rs:65
-- sql_query_engine::api::nl_answer
CREATE  FUNCTION "nl_answer"(
	"question" TEXT, /* Option < & str > */
	"session" TEXT DEFAULT NULL /* Option < & str > */
) RETURNS TEXT /* String */
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'nl_answer_wrapper';
/* </end connected objects> */

/* <begin connected objects> */
-- src/api.rs:90
-- sql_query_engine::api::nl_check
CREATE  FUNCTION "nl_check"(
	"sql" TEXT /* & str */
) RETURNS void
STRICT
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'nl_check_wrapper';
/* </end connected objects> */

/* <begin connected objects> */
-- src/lib.rs:26
-- requires:
--   api::nl_check

-- Verified examples: question -> SQL pairs a human approved. The few most similar to a new
-- question go into the prompt. Anyone may read them; only roles that may write this table (its
-- owner, and whoever the owner grants INSERT/DELETE) can add or remove examples.
CREATE TABLE @extschema@.nl_examples (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    question text NOT NULL CHECK (btrim(question) <> ''),
    sql text NOT NULL,
    added_by name NOT NULL DEFAULT current_user,
    added_at timestamptz NOT NULL DEFAULT now()
);
GRANT SELECT ON @extschema@.nl_examples TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.nl_examples', '');

-- Adds an example after the guard accepted its SQL; returns its id.
CREATE FUNCTION @extschema@.nl_example_add(question text, sql text) RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    new_id bigint;
BEGIN
    PERFORM @extschema@.nl_check(sql);
    INSERT INTO @extschema@.nl_examples (question, sql) VALUES (question, sql)
    RETURNING nl_examples.id INTO new_id;
    RETURN new_id;
END
$$;

-- Removes an example; returns whether it existed.
CREATE FUNCTION @extschema@.nl_example_remove(example_id bigint) RETURNS boolean
LANGUAGE sql AS $$
    WITH gone AS (DELETE FROM @extschema@.nl_examples WHERE id = example_id RETURNING 1)
    SELECT count(*) > 0 FROM gone
$$;
/* </end connected objects> */

/* <begin connected objects> */
-- src/api.rs:42
-- sql_query_engine::api::nl_generate
CREATE  FUNCTION "nl_generate"(
	"question" TEXT, /* Option < & str > */
	"session" TEXT DEFAULT NULL /* Option < & str > */
) RETURNS TEXT /* String */
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'nl_generate_wrapper';
/* </end connected objects> */

/* <begin connected objects> */
-- src/api.rs:24
-- sql_query_engine::api::nl_query
CREATE  FUNCTION "nl_query"(
	"question" TEXT, /* Option < & str > */
	"session" TEXT DEFAULT NULL /* Option < & str > */
) RETURNS SETOF jsonb /* JsonB */
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'nl_query_wrapper';
/* </end connected objects> */

/* <begin connected objects> */
-- src/api.rs:99
-- sql_query_engine::api::nl_schema
CREATE  FUNCTION "nl_schema"(
	"question" TEXT DEFAULT NULL /* Option < & str > */
) RETURNS TEXT /* String */
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'nl_schema_wrapper';
/* </end connected objects> */

/* <begin connected objects> */
-- src/api.rs:82
-- sql_query_engine::api::nl_session_reset
CREATE  FUNCTION "nl_session_reset"(
	"session" TEXT /* & str */
) RETURNS void
STRICT
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'nl_session_reset_wrapper';
/* </end connected objects> */

/* <begin connected objects> */
-- src/api.rs:53
-- sql_query_engine::api::nl_trace
CREATE  FUNCTION "nl_trace"(
	"question" TEXT, /* Option < & str > */
	"session" TEXT DEFAULT NULL /* Option < & str > */
) RETURNS jsonb /* JsonB */
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'nl_trace_wrapper';
/* </end connected objects> */

