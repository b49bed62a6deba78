-- 0.15.0 -> 0.16.0
\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.16.0'" to load this file. \quit

-- The rename check compares the schema's name as it is with the name @extschema@ stands for
-- (see schema_name.sql): it compared the name as the renaming session's quote_ident wrote it,
-- which quote_all_identifiers changes, so that with it on every ALTER SCHEMA was refused.
CREATE OR REPLACE FUNCTION @extschema@.nl_schema_kept() RETURNS event_trigger
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
