-- 0.14.0 -> 0.15.0
\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.15.0'" to load this file. \quit

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
