\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.11.0'" to load this file. \quit
-- 0.10.0 -> 0.11.0

-- COMMENTs count per schema, and only those the schema context shows (on relations and their
-- columns): a backend's schema cache is built again only for a comment in a schema it reads.
-- Before, any role could have every backend's cache built again at each question by commenting
-- in a loop on a large object, or on a table of its own schema. Rows counted before have no
-- schema: caches are built once more after the update.
ALTER TABLE @extschema@.nl_schema_changes
    ADD COLUMN schema_name text NOT NULL DEFAULT '',
    DROP CONSTRAINT nl_schema_changes_pkey;
ALTER TABLE @extschema@.nl_schema_changes
    ALTER COLUMN xid SET NOT NULL,
    ADD PRIMARY KEY (xid, schema_name);

CREATE OR REPLACE FUNCTION @extschema@.nl_schema_changed() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
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

-- A session's turns are bounded where they are written (16 MB as text): a role may write its
-- own row, and every backend that serves its session read all of it to take the last turns.
-- Rows beyond the bound (none the extension wrote) are removed first.
DELETE FROM @extschema@.nl_sessions WHERE pg_catalog.octet_length(turns::text) > 16777216;
ALTER TABLE @extschema@.nl_sessions ADD CONSTRAINT nl_sessions_turns_check
    CHECK (pg_catalog.octet_length(turns::text) <= 16777216);
