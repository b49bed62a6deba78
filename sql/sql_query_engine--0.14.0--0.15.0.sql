-- 0.14.0 -> 0.15.0
\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.15.0'" to load this file. \quit

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

-- A rename of the extension's schema is refused from now on (see schema_name.sql). The
-- functions that name the schema are made again, with the name it has now: one renamed
-- before this update would have left its old name to whichever schema took it.
CREATE OR REPLACE FUNCTION @extschema@.nl_examples_provenance() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF (SELECT pg_has_role(c.relowner, 'USAGE') FROM pg_class c WHERE c.oid = TG_RELID) THEN
        RETURN NEW;
    END IF;
    NEW.added_by := current_user;
    NEW.added_at := now();
    IF NEW.history_id IS NOT NULL AND NOT EXISTS (
        SELECT FROM @extschema@.nl_history h WHERE h.id = NEW.history_id) THEN
        RAISE EXCEPTION 'no answer % in your history', NEW.history_id
            USING ERRCODE = '42501';
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION @extschema@.nl_example_remove(example_id bigint) RETURNS boolean
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH gone AS (DELETE FROM @extschema@.nl_examples WHERE id = example_id RETURNING 1)
    SELECT count(*) > 0 FROM gone
$$;

CREATE OR REPLACE FUNCTION @extschema@.nl_feedback_example() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.status <> 'promoted'
       OR (SELECT pg_has_role(c.relowner, 'USAGE') FROM pg_class c WHERE c.oid = TG_RELID) THEN
        RETURN NEW;
    END IF;
    IF NOT EXISTS (SELECT FROM @extschema@.nl_examples e
                   WHERE e.id = NEW.example_id AND e.history_id = NEW.history_id
                     AND e.sql = NEW.sql AND e.added_by = current_user) THEN
        RAISE EXCEPTION 'example % is not one you made of answer % with its SQL',
            NEW.example_id, NEW.history_id USING ERRCODE = '42501';
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION @extschema@.nl_query_as("question" text, "shape" anyelement)
RETURNS SETOF anyelement
VOLATILE PARALLEL UNSAFE
LANGUAGE sql
AS $$
    SELECT pg_catalog.jsonb_populate_record(shape, r)
    FROM @extschema@.nl_query_shaped(question, pg_catalog.pg_typeof(shape)::pg_catalog.oid) AS r
$$;

-- The extension's SQL functions and triggers (nl_query_as, nl_example_remove, the examples'
-- and the feedback's checks) name its objects by the schema's name at install, and look the
-- name up again each time they are planned: renamed, the schema would leave its old name to
-- whatever schema another role with CREATE on the database then makes, whose objects those
-- functions would run as their caller. A rename of the extension's schema is refused, whoever
-- makes it; to move the extension, drop it and create it in the other schema. Reads the
-- catalog only, as the role that renames.
CREATE FUNCTION @extschema@.nl_schema_kept() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension e
               JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
               WHERE e.extname = 'sql_query_engine'
                 AND pg_catalog.quote_ident(n.nspname) <> '@extschema@') THEN
        RAISE EXCEPTION 'the schema of sql_query_engine cannot be renamed'
            USING ERRCODE = '55000',
                  DETAIL = 'The extension''s SQL finds its objects by the name @extschema@, which another schema could then take.',
                  HINT = 'To move the extension, drop it and create it in the other schema.';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION @extschema@.nl_schema_kept() FROM PUBLIC;
CREATE EVENT TRIGGER nl_schema_kept ON ddl_command_end WHEN TAG IN ('ALTER SCHEMA')
    EXECUTE FUNCTION @extschema@.nl_schema_kept();

-- Restored or replicated rows go to the role of their name (see nl_row_role in history.sql).
CREATE TRIGGER nl_row_role BEFORE INSERT OR UPDATE ON @extschema@.nl_sessions
    FOR EACH ROW EXECUTE FUNCTION @extschema@.nl_row_role();
ALTER TABLE @extschema@.nl_sessions ENABLE ALWAYS TRIGGER nl_row_role;

-- Examples written before 0.14.0 by a role granted INSERT may be longer than the table now
-- takes: they are never shown (retrieval reads examples up to that length), and a dump of the
-- table would not restore (the check refuses them, and with them every row of the COPY).
DO $$
DECLARE
    longer bigint;
BEGIN
    SELECT count(*) INTO longer FROM @extschema@.nl_examples
    WHERE pg_catalog.length(question) > 10000 OR pg_catalog.length(sql) > 100000;
    IF longer > 0 THEN
        RAISE WARNING '% verified examples of @extschema@.nl_examples are longer than 10,000 characters of question or 100,000 of SQL', longer
            USING DETAIL = 'They are never shown, and a dump of the table would not restore.',
                  HINT = 'Look at them and delete them: DELETE FROM @extschema@.nl_examples WHERE length(question) > 10000 OR length(sql) > 100000;';
    END IF;
END
$$;
