-- The extension's SQL functions and triggers (nl_query_as, nl_example_remove, the examples'
-- and the feedback's checks) name its objects by the schema's name at install, and look the
-- name up again each time they are planned: renamed, the schema would leave its old name to
-- whatever schema another role with CREATE on the database then makes, whose objects those
-- functions would run as their caller. A rename of the extension's schema is refused, whoever
-- makes it; to move the extension, drop it and create it in the other schema. Reads the
-- catalog only, as the role that renames. (@extschema@ is written quoted where the name needs
-- it, or wherever the installing session quoted all identifiers: parse_ident reads the name
-- back, whatever the renaming session's quote_all_identifiers.)
CREATE FUNCTION @extschema@.nl_schema_kept() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension e
               JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
               WHERE e.extname = 'sql_query_engine'
                 AND n.nspname <> (pg_catalog.parse_ident('@extschema@'))[1]) THEN
        RAISE EXCEPTION 'the schema of sql_query_engine cannot be renamed'
            USING ERRCODE = '55000',
                  DETAIL = 'The extension''s SQL finds its objects by the name @extschema@, which another schema could then take.',
                  HINT = 'To move the extension, drop it and create it in the other schema.';
    END IF;
END
$$;
-- Its privileges: privileges.sql.
CREATE EVENT TRIGGER nl_schema_kept ON ddl_command_end WHEN TAG IN ('ALTER SCHEMA')
    EXECUTE FUNCTION @extschema@.nl_schema_kept();
-- Also in replica mode, which a role may be let set.
ALTER EVENT TRIGGER nl_schema_kept ENABLE ALWAYS;
