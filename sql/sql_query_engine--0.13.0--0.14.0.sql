-- 0.13.0 -> 0.14.0
\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.14.0'" to load this file. \quit

-- The extension finds its tables by its schema's name: its schema's owner could rename it and
-- put tables of its own (with triggers) in their place. The count of comments, written with
-- the installing superuser's rights, is written only while a superuser owns the schema; the
-- extension's functions refuse to work in a schema another role owns (a fresh install there is
-- refused).
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT FROM pg_catalog.pg_namespace n
        JOIN pg_catalog.pg_roles r ON r.oid = CASE
            WHEN n.nspowner = 'pg_database_owner'::pg_catalog.regrole
            THEN (SELECT d.datdba FROM pg_catalog.pg_database d
                  WHERE d.datname = pg_catalog.current_database())
            ELSE n.nspowner END
        WHERE n.oid = '@extschema@'::pg_catalog.regnamespace AND r.rolsuper) THEN
        RAISE WARNING 'sql_query_engine is installed in schema %, whose owner is not a superuser: it will refuse to work there',
            '@extschema@'
            USING DETAIL = 'The owner of the extension''s schema could rename it and put tables of its own in place of the extension''s.',
                  HINT = 'A superuser: ALTER SCHEMA @extschema@ OWNER TO a superuser, or install the extension again in a schema a superuser owns.';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION @extschema@.nl_schema_changed() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- Its table is found by its schema's name, with the extension owner's rights: only if a
    -- superuser owns the extension's schema (its owner could rename it and put a table of its
    -- own, with a trigger, where this one was) and the name still finds it.
    IF NOT EXISTS (
        SELECT FROM pg_catalog.pg_extension e
        JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
        JOIN pg_catalog.pg_roles r ON r.oid = CASE
            WHEN n.nspowner = 'pg_database_owner'::pg_catalog.regrole
            THEN (SELECT d.datdba FROM pg_catalog.pg_database d
                  WHERE d.datname = pg_catalog.current_database())
            ELSE n.nspowner END
        WHERE e.extname = 'sql_query_engine' AND r.rolsuper
          AND n.oid = '@extschema@'::pg_catalog.regnamespace) THEN
        RETURN;
    END IF;
    -- Only comments the schema context shows count (on relations and their columns), each in
    -- its schema: a backend's cache is built again only for a comment in a schema it reads.
    -- Any role may make temporary tables, large objects and (with CREATE on the database) its
    -- own schema, and comment on them in a loop (the session's temporary schema is named
    -- pg_temp here). One row per transaction and schema (its conflict check takes no
    -- predicate lock).
    INSERT INTO @extschema@.nl_schema_changes (schema_name)
    SELECT DISTINCT c.schema_name FROM pg_catalog.pg_event_trigger_ddl_commands() c
    WHERE c.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND c.schema_name <> 'pg_temp'
    ON CONFLICT (xid, schema_name) DO NOTHING;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF pg_catalog.current_setting('transaction_isolation') <> 'serializable' THEN
        IF (SELECT count(*) FROM @extschema@.nl_schema_changes) > 100 THEN
            -- A fold that fails (rows a concurrent one folded, under REPEATABLE READ) leaves
            -- the count as it is, this transaction's row included.
            BEGIN
                WITH folded AS (
                    DELETE FROM @extschema@.nl_schema_changes
                    WHERE (xid, schema_name) IN (
                        SELECT xid, schema_name FROM @extschema@.nl_schema_changes
                        WHERE xid <> pg_current_xact_id()
                        ORDER BY xid LIMIT 100 FOR UPDATE SKIP LOCKED)
                    RETURNING schema_name, changes)
                INSERT INTO @extschema@.nl_schema_changes AS t (schema_name, changes)
                SELECT f.schema_name, sum(f.changes) FROM folded f GROUP BY f.schema_name
                ON CONFLICT (xid, schema_name) DO UPDATE SET changes = t.changes + EXCLUDED.changes;
            EXCEPTION WHEN OTHERS THEN
                NULL;
            END;
        END IF;
    END IF;
EXCEPTION WHEN OTHERS THEN
    NULL;
END
$$;

-- Examples written straight into the table (a role granted INSERT) are held to what
-- nl_example_add takes: every matching question of every role reads and checks them.
ALTER TABLE @extschema@.nl_examples ADD CONSTRAINT nl_examples_bounded
    CHECK (pg_catalog.length(question) <= 10000 AND pg_catalog.length(sql) <= 100000) NOT VALID;
