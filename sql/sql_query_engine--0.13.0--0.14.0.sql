-- 0.13.0 -> 0.14.0
\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.14.0'" to load this file. \quit

-- The extension's schema must be one only superusers can create in. Its install and update
-- scripts run as a superuser with that schema first on the search path: an operator or
-- function another role put there that matches a call more closely than pg_catalog's (say
-- `->>(jsonb, jsonb)` for `turn ->> 'sql'`) would run with the superuser's rights
-- (CVE-2018-1058). And the extension finds its tables by the schema's name, which the schema's
-- owner could give to a schema of its own. So its owner and every role granted CREATE on it
-- must be superusers (pg_database_owner stands for the database's owner: `public` of a
-- database a superuser owns will do), and no function or operator in it may belong to another
-- role. This block opens the install script and every update script (a test in store.rs
-- checks they are the same); each of its operators is pg_catalog's, named so.
DO $$
DECLARE
    schema_oid pg_catalog.oid := '@extschema@'::pg_catalog.regnamespace::pg_catalog.oid;
    creators text;
    their_code text;
BEGIN
    SELECT pg_catalog.string_agg(DISTINCT CASE
               WHEN c.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
               ELSE pg_catalog.quote_ident(r.rolname::pg_catalog.text) END, ', ')
      INTO creators
      FROM pg_catalog.pg_namespace n
      CROSS JOIN LATERAL (
          SELECT n.nspowner AS grantee
          UNION ALL
          SELECT a.grantee
            FROM pg_catalog.aclexplode(COALESCE(n.nspacl,
                     pg_catalog.acldefault('n'::pg_catalog."char", n.nspowner))) a
           WHERE a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'::pg_catalog.text) c
      LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) CASE
          WHEN c.grantee OPERATOR(pg_catalog.=)
               'pg_database_owner'::pg_catalog.regrole::pg_catalog.oid
          THEN (SELECT d.datdba FROM pg_catalog.pg_database d
                 WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
          ELSE c.grantee END
     WHERE n.oid OPERATOR(pg_catalog.=) schema_oid AND r.rolsuper IS NOT TRUE;
    SELECT pg_catalog.string_agg(f.what, ', ') INTO their_code FROM (
        SELECT pg_catalog.format('function %s', p.oid::pg_catalog.regprocedure) AS what
          FROM pg_catalog.pg_proc p
          JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) p.proowner
         WHERE p.pronamespace OPERATOR(pg_catalog.=) schema_oid AND NOT r.rolsuper
        UNION ALL
        SELECT pg_catalog.format('operator %s', o.oid::pg_catalog.regoperator)
          FROM pg_catalog.pg_operator o
          JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) o.oprowner
         WHERE o.oprnamespace OPERATOR(pg_catalog.=) schema_oid AND NOT r.rolsuper
         LIMIT 20) f;
    IF creators IS NOT NULL OR their_code IS NOT NULL THEN
        RAISE EXCEPTION 'sql_query_engine cannot be installed or updated in schema %: a role that is not a superuser owns it, may create in it or owns functions or operators in it',
            '@extschema@'
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('Owner or may create in it: %s. Their functions and operators in it: %s. An operator or function of theirs that matches a call of the extension''s script more closely than pg_catalog''s would run with your rights, and the schema''s owner could put tables of its own in place of the extension''s.',
                      COALESCE(creators, 'none'), COALESCE(their_code, 'none')),
                  HINT = 'Install it in a schema of its own: CREATE SCHEMA nl; GRANT USAGE ON SCHEMA nl TO PUBLIC; CREATE EXTENSION sql_query_engine SCHEMA nl; and add nl to the search path (ALTER DATABASE ... SET search_path = "$user", public, nl). To update it where it is, a superuser takes the schema (ALTER SCHEMA ... OWNER TO), revokes CREATE on it from those roles and moves their functions and operators out first.';
    END IF;
END
$$;

-- The extension finds its tables by its schema's name: its schema's owner could rename it and
-- put tables of its own (with triggers) in their place. The count of comments, written with
-- the installing superuser's rights, is written only while a superuser owns the schema; the
-- extension's functions refuse to work in a schema another role owns (a fresh install there is
-- refused).
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
        RAISE WARNING 'sql_query_engine is installed in schema %, whose owner is not a superuser: it will refuse to work there',
            '@extschema@'
            USING DETAIL = 'The owner of the extension''s schema could rename it and put tables of its own in place of the extension''s.',
                  HINT = 'A superuser: ALTER SCHEMA @extschema@ OWNER TO a superuser, or install the extension again in a schema a superuser owns.';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION @extschema@.nl_schema_changed() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- Its table is found by its schema's name, with the extension owner's rights: only if a
    -- superuser owns the extension's schema (its owner could rename it and put a table of its
    -- own, with a trigger, where this one was) and the name still finds it.
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
    -- Only comments the schema context shows count (on relations and their columns), each in
    -- its schema: a backend's cache is built again only for a comment in a schema it reads.
    -- Any role may make temporary tables, large objects and (with CREATE on the database) its
    -- own schema, and comment on them in a loop (the session's temporary schema is named
    -- pg_temp here). One row per transaction and schema (its conflict check takes no
    -- predicate lock).
    INSERT INTO @extschema@.nl_schema_changes (schema_name)
    SELECT DISTINCT c.schema_name FROM pg_catalog.pg_event_trigger_ddl_commands() c
    WHERE c.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND c.schema_name <> 'pg_temp'
    ON CONFLICT (xid, schema_name) DO NOTHING;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF pg_catalog.current_setting('transaction_isolation') <> 'serializable' THEN
        IF (SELECT count(*) FROM @extschema@.nl_schema_changes) > 100 THEN
            -- A fold that fails (rows a concurrent one folded, under REPEATABLE READ) leaves
            -- the count as it is, this transaction's row included.
            BEGIN
                WITH folded AS (
                    DELETE FROM @extschema@.nl_schema_changes
                    WHERE (xid, schema_name) IN (
                        SELECT xid, schema_name FROM @extschema@.nl_schema_changes
                        WHERE xid <> pg_current_xact_id()
                        ORDER BY xid LIMIT 100 FOR UPDATE SKIP LOCKED)
                    RETURNING schema_name, changes)
                INSERT INTO @extschema@.nl_schema_changes AS t (schema_name, changes)
                SELECT f.schema_name, sum(f.changes) FROM folded f GROUP BY f.schema_name
                ON CONFLICT (xid, schema_name) DO UPDATE SET changes = t.changes + EXCLUDED.changes;
            EXCEPTION WHEN OTHERS THEN
                NULL;
            END;
        END IF;
    END IF;
EXCEPTION WHEN OTHERS THEN
    NULL;
END
$$;

-- Examples written straight into the table (a role granted INSERT) are held to what
-- nl_example_add takes: every matching question of every role reads and checks them.
ALTER TABLE @extschema@.nl_examples ADD CONSTRAINT nl_examples_bounded
    CHECK (pg_catalog.length(question) <= 10000 AND pg_catalog.length(sql) <= 100000) NOT VALID;
