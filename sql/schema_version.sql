-- Comments made on the schema. DDL reaches every backend's schema cache through relcache
-- invalidations, but COMMENT invalidates nothing, so this event trigger counts COMMENTs: one
-- row per transaction that made one, and the sum of `changes` is part of every backend's cache
-- key. A table, not a sequence: the count moves only when the COMMENT commits, and on a hot
-- standby when that commit is replayed. Rows are only ever inserted (concurrent DDL never waits
-- on another's row); old rows are folded into the newest one, so the sum never goes back.
CREATE TABLE @extschema@.nl_schema_changes (
    xid xid8 PRIMARY KEY DEFAULT pg_catalog.pg_current_xact_id(),
    changes bigint NOT NULL DEFAULT 1
);
GRANT SELECT ON @extschema@.nl_schema_changes TO PUBLIC;

-- Runs for every role that comments on an object, with the extension owner's rights (it only
-- writes the count), on a pinned search path. It must never make the COMMENT fail, nor make a
-- serializable transaction fail at commit: it reads the table only outside one (a read there
-- would conflict with another transaction's COMMENT and cancel one of them).
CREATE FUNCTION @extschema@.nl_schema_changed() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- A comment on a temporary object is in no one else's schema: any role may make temporary
    -- tables, and would otherwise have every backend's schema cache built again at will (the
    -- session's temporary schema is named pg_temp here).
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_event_trigger_ddl_commands() c
                   WHERE c.schema_name IS NULL
                      OR c.schema_name <> 'pg_temp') THEN
        RETURN;
    END IF;
    -- One row per transaction (its conflict check takes no predicate lock).
    INSERT INTO @extschema@.nl_schema_changes DEFAULT VALUES ON CONFLICT (xid) DO NOTHING;
    IF pg_catalog.current_setting('transaction_isolation') <> 'serializable' THEN
        IF (SELECT count(*) FROM @extschema@.nl_schema_changes) > 100 THEN
            -- A fold that fails (rows a concurrent one folded, under REPEATABLE READ) leaves
            -- the count as it is, this transaction's row included.
            BEGIN
                WITH folded AS (
                    DELETE FROM @extschema@.nl_schema_changes
                    WHERE xid IN (SELECT xid FROM @extschema@.nl_schema_changes
                                  WHERE xid <> pg_current_xact_id()
                                  ORDER BY xid LIMIT 100 FOR UPDATE SKIP LOCKED)
                    RETURNING changes)
                UPDATE @extschema@.nl_schema_changes
                SET changes = changes + (SELECT coalesce(sum(changes), 0) FROM folded)
                WHERE xid = pg_current_xact_id();
            EXCEPTION WHEN OTHERS THEN
                NULL;
            END;
        END IF;
    END IF;
EXCEPTION WHEN OTHERS THEN
    NULL;
END
$$;
REVOKE ALL ON FUNCTION @extschema@.nl_schema_changed() FROM PUBLIC;

CREATE EVENT TRIGGER nl_schema_changed ON ddl_command_end WHEN TAG IN ('COMMENT')
    EXECUTE FUNCTION @extschema@.nl_schema_changed();
