-- Comments made on the schema. DDL reaches every backend's schema cache through relcache
-- invalidations, but COMMENT invalidates nothing, so this event trigger counts COMMENTs: one
-- row per transaction and schema that had one, and the sum of `changes` over the schemas a
-- backend's cache reads is part of its key. A table, not a sequence: the count moves only when
-- the COMMENT commits, and on a hot standby when that commit is replayed. Rows are only ever
-- inserted (concurrent DDL never waits on another's row); old rows are folded into the newest
-- ones, so no schema's sum ever goes back.
CREATE TABLE @extschema@.nl_schema_changes (
    xid xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),
    changes bigint NOT NULL DEFAULT 1,
    schema_name text NOT NULL DEFAULT '',
    PRIMARY KEY (xid, schema_name)
);
-- Every question sums the rows of the schemas it reads: through this index, not a scan of every
-- schema's rows (a role that comments in a loop in SERIALIZABLE transactions, where nothing is
-- folded, adds a row each time, to its own schema's count).
CREATE INDEX nl_schema_changes_schema_idx ON @extschema@.nl_schema_changes (schema_name)
    INCLUDE (changes);
-- Its privileges: privileges.sql.

-- Runs for every role that comments on an object, with the extension owner's rights (it only
-- writes the count), on a pinned search path. It must never make the COMMENT fail, nor make a
-- serializable transaction fail at commit: it reads the table only outside one (a read there
-- would conflict with another transaction's COMMENT and cancel one of them).
CREATE FUNCTION @extschema@.nl_schema_changed() RETURNS event_trigger
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
-- Its privileges: privileges.sql.

CREATE EVENT TRIGGER nl_schema_changed ON ddl_command_end WHEN TAG IN ('COMMENT')
    EXECUTE FUNCTION @extschema@.nl_schema_changed();
-- Also in replica mode, which a role may be let set: a comment it made would go uncounted.
ALTER EVENT TRIGGER nl_schema_changed ENABLE ALWAYS;
