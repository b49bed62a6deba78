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
