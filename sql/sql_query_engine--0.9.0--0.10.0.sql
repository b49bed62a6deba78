-- sql_query_engine 0.9.0 -> 0.10.0 (ALTER EXTENSION sql_query_engine UPDATE TO '0.10.0').
\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.10.0'" to load this file. \quit

-- A row of nl_history or nl_feedback restored from a dump goes to the role of its name. Before,
-- it kept the OID of the cluster that wrote it: restored into another cluster, where roles have
-- other OIDs, a role read (and vouched for) another role's questions and SQL, and its own rows
-- were no one's. Rows already here are left as they are: a row whose OID is not the role of its
-- name is a renamed role's, or one restored before this release (README.md, "Tables of the
-- extension", gives the owner's statement that hands those to the role of their name).
CREATE FUNCTION @extschema@.nl_row_role() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.role_id <> 0 AND NOT EXISTS (
           SELECT FROM pg_catalog.pg_roles r WHERE r.oid = NEW.role_id AND r.rolname = NEW.role) THEN
        NEW.role_id := coalesce(
            (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = NEW.role), 0);
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER nl_row_role BEFORE INSERT ON @extschema@.nl_history
    FOR EACH ROW EXECUTE FUNCTION @extschema@.nl_row_role();
CREATE TRIGGER nl_row_role BEFORE INSERT ON @extschema@.nl_feedback
    FOR EACH ROW EXECUTE FUNCTION @extschema@.nl_row_role();

-- A row of nl_feedback tells what happened as it did: the question is that of the answer it is
-- on, a promoted row names the example the role made of that answer with that SQL, and only a
-- promoted row names an example; a noted row (a wrong answer, no correction) vouches for no SQL,
-- the others for some. Before, a role could file its own feedback under any question, naming
-- any example, for the owner's review queue to show as such.
ALTER POLICY own_rows ON @extschema@.nl_feedback
    WITH CHECK (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid
                AND role = current_user AND at = pg_catalog.now()
                AND EXISTS (SELECT FROM @extschema@.nl_history h
                            WHERE h.id = nl_feedback.history_id
                              AND h.role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid
                              AND h.question = nl_feedback.question)
                AND (sql IS NULL) = (status = 'noted')
                AND (status <> 'noted' OR NOT correct)
                AND CASE WHEN status = 'promoted' THEN
                        pg_catalog.has_table_privilege('@extschema@.nl_examples'::pg_catalog.regclass, 'INSERT')
                        AND EXISTS (SELECT FROM @extschema@.nl_examples e
                                    WHERE e.id = nl_feedback.example_id
                                      AND e.history_id = nl_feedback.history_id
                                      AND e.sql = nl_feedback.sql
                                      AND e.added_by = current_user)
                    ELSE example_id IS NULL END);
-- A row of nl_sessions names its own role and is of now. Before, a role could name another as
-- the writer of its sessions, or date them ahead to keep them past sql_query_engine.session_ttl.
ALTER POLICY own_sessions ON @extschema@.nl_sessions
    WITH CHECK (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid
                AND role = current_user AND updated_at = pg_catalog.now());
