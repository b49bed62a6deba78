\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.7.0'" to load this file. \quit
-- 0.7.0: the COMMENT event trigger reads its table only outside a serializable transaction:
-- two serializable transactions that each commented on an object conflicted through it, and
-- one of them failed at commit.
CREATE OR REPLACE FUNCTION @extschema@.nl_schema_changed() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
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
