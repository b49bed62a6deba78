-- Comments made on the schema. DDL reaches every backend's schema cache through relcache
-- invalidations, but COMMENT invalidates nothing: this event trigger invalidates the relation
-- commented on (its own comment or a column's), so that the caches that show it are built
-- again. The invalidation is sent as the transaction commits, to every backend of the database
-- and, as the commit is replayed, to a hot standby's. Nothing is written (until 0.22.0 a table
-- counted comments, one row per transaction, which any role that owns a relation could grow
-- without bound and every call read).
--
-- Runs for every role that comments on an object, with the extension owner's rights (EXECUTE
-- on nl_relations_commented is the owner's alone), on a pinned search path. It must never make
-- the COMMENT fail.
CREATE FUNCTION @extschema@.nl_schema_changed() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- Its function is found by its schema's name, with the extension owner's rights: only if a
    -- superuser owns the extension's schema (its owner could rename it and put a function of
    -- its own where this one was) and the name still finds it.
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
    -- Only comments the schema context shows count (on relations and their columns). Any role
    -- may make temporary tables and comment on them in a loop (the session's temporary schema
    -- is named pg_temp here): no cache holds another session's.
    PERFORM @extschema@.nl_relations_commented(ARRAY(
        SELECT DISTINCT c.objid FROM pg_catalog.pg_event_trigger_ddl_commands() c
        WHERE c.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
          AND c.schema_name <> 'pg_temp'));
EXCEPTION WHEN OTHERS THEN
    NULL;
END
$$;
-- Its privileges: privileges.sql.

CREATE EVENT TRIGGER nl_schema_changed ON ddl_command_end WHEN TAG IN ('COMMENT')
    EXECUTE FUNCTION @extschema@.nl_schema_changed();
-- Also in replica mode, which a role may be let set: a comment it made would go uncaught.
ALTER EVENT TRIGGER nl_schema_changed ENABLE ALWAYS;
