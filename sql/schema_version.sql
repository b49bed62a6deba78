-- The schema version: DDL bumps it, and every backend compares it with the version its cached
-- schema context was built from, so a new column is visible to the very next question.
-- A sequence, because bumping it takes no lock and never conflicts between concurrent DDL.
CREATE SEQUENCE @extschema@.nl_schema_version;
GRANT USAGE, SELECT ON SEQUENCE @extschema@.nl_schema_version TO PUBLIC;

-- Runs as the role that executed the DDL. It must never make that DDL fail.
CREATE FUNCTION @extschema@.nl_schema_changed() RETURNS event_trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM nextval('@extschema@.nl_schema_version');
EXCEPTION WHEN OTHERS THEN
    NULL;
END
$$;

CREATE EVENT TRIGGER nl_schema_changed_ddl ON ddl_command_end
    EXECUTE FUNCTION @extschema@.nl_schema_changed();
CREATE EVENT TRIGGER nl_schema_changed_drop ON sql_drop
    EXECUTE FUNCTION @extschema@.nl_schema_changed();
