-- The extension finds its own tables by its schema's name, and one of its functions writes
-- there with the installing superuser's rights: whoever owns the schema could rename it and
-- put tables of its own (with triggers) in their place. So only a schema a superuser owns
-- (for `public`, owned by pg_database_owner: a database a superuser owns) will do.
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT FROM pg_catalog.pg_namespace n
        JOIN pg_catalog.pg_roles r ON r.oid = CASE
            WHEN n.nspowner = 'pg_database_owner'::pg_catalog.regrole
            THEN (SELECT d.datdba FROM pg_catalog.pg_database d
                  WHERE d.datname = pg_catalog.current_database())
            ELSE n.nspowner END
        WHERE n.oid = '@extschema@'::pg_catalog.regnamespace AND r.rolsuper) THEN
        RAISE EXCEPTION 'sql_query_engine cannot be installed in schema %: its owner is not a superuser',
            '@extschema@'
            USING ERRCODE = '42501',
                  DETAIL = 'The owner of the extension''s schema could rename it and put tables of its own in place of the extension''s.',
                  HINT = 'Install it in a schema a superuser owns: CREATE SCHEMA nl; GRANT USAGE ON SCHEMA nl TO PUBLIC; CREATE EXTENSION sql_query_engine SCHEMA nl; and add nl to the search path (ALTER DATABASE ... SET search_path = "$user", public, nl).';
    END IF;
END
$$;
