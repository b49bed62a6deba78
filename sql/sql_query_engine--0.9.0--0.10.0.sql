-- sql_query_engine 0.9.0 -> 0.10.0 (ALTER EXTENSION sql_query_engine UPDATE TO '0.10.0').
\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.10.0'" to load this file. \quit

-- A row of nl_history or nl_feedback that comes in under an OID that is not the role of its
-- name (restored from a dump, copied by logical replication) goes to the role of its name.
-- Before, it kept the OID it had where it was written: restored into another cluster, where
-- roles have other OIDs, a role read (and vouched for) another role's questions and SQL, and
-- its own rows were no one's. The rows already here are left as they are (README.md, "Tables of
-- the extension", gives the owner's statement for a database restored before this release).
CREATE FUNCTION @extschema@.nl_row_role() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.role_id <> 0 THEN
        NEW.role_id := coalesce(
            pg_catalog.to_regrole(pg_catalog.quote_ident(NEW.role))::pg_catalog.oid, 0);
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER nl_row_role BEFORE INSERT OR UPDATE ON @extschema@.nl_history
    FOR EACH ROW EXECUTE FUNCTION @extschema@.nl_row_role();
ALTER TABLE @extschema@.nl_history ENABLE ALWAYS TRIGGER nl_row_role;
CREATE TRIGGER nl_row_role BEFORE INSERT OR UPDATE ON @extschema@.nl_feedback
    FOR EACH ROW EXECUTE FUNCTION @extschema@.nl_row_role();
ALTER TABLE @extschema@.nl_feedback ENABLE ALWAYS TRIGGER nl_row_role;

-- A row of nl_feedback tells what happened as it did: the question is that of the answer it is
-- on, only a promoted row names an example, and then the one the role made of that answer with
-- that SQL (nl_feedback_example); a noted row (a wrong answer, no correction) vouches for no
-- SQL, the others for some. Before, a role could file its own feedback under any question,
-- naming any example, for the owner's review queue to show as such.
ALTER POLICY own_rows ON @extschema@.nl_feedback
    WITH CHECK (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid
                AND role = current_user AND at = pg_catalog.now()
                AND EXISTS (SELECT FROM @extschema@.nl_history h
                            WHERE h.id = nl_feedback.history_id
                              AND h.role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid
                              AND h.question = nl_feedback.question)
                AND (sql IS NULL) = (status = 'noted')
                AND (status <> 'noted' OR NOT correct)
                AND (status = 'promoted' OR example_id IS NULL)
                AND (status <> 'promoted' OR pg_catalog.has_table_privilege(
                         '@extschema@.nl_examples'::pg_catalog.regclass, 'INSERT')));
CREATE FUNCTION @extschema@.nl_feedback_example() RETURNS trigger
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
CREATE TRIGGER nl_feedback_example BEFORE INSERT ON @extschema@.nl_feedback
    FOR EACH ROW EXECUTE FUNCTION @extschema@.nl_feedback_example();

-- A row of nl_sessions names its own role and is of now. Before, a role could name another as
-- the writer of its sessions, or date them ahead to keep them past sql_query_engine.session_ttl.
ALTER POLICY own_sessions ON @extschema@.nl_sessions
    WITH CHECK (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid
                AND role = current_user AND updated_at = pg_catalog.now());

-- A comment on a temporary object no longer counts as a change of the schema: any role may
-- make temporary tables, and commenting on one in a loop had every backend's schema cache built
-- again at each question.
CREATE OR REPLACE FUNCTION @extschema@.nl_schema_changed() RETURNS event_trigger
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
