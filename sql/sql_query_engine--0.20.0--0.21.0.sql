-- 0.20.0 -> 0.21.0
\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.21.0'" to load this file. \quit

-- The extension's schema must be one only superusers can create in. Its install and update
-- scripts run as a superuser with that schema first on the search path: an operator or
-- function another role put there that matches a call more closely than pg_catalog's (say
-- `->>(jsonb, jsonb)` for `turn ->> 'sql'`) would run with the superuser's rights
-- (CVE-2018-1058). And the extension finds its tables by the schema's name, which the schema's
-- owner could give to a schema of its own. So no role that is not a superuser may create in
-- it or have its owner's rights (pg_database_owner stands for the database's owner: `public`
-- of a database a superuser owns will do), and no function, aggregate or operator in it may
-- run code such a role owns or may replace. Roles are asked as PostgreSQL answers for them
-- (has_schema_privilege, pg_has_role), so grants through other roles count. This block opens
-- the install script and every update script (a test in store.rs checks they are the same);
-- each of its operators is pg_catalog's, named so. An update script then resolves names in
-- pg_catalog alone, so an object committed after this check is never found.
DO $$
DECLARE
    schema_oid pg_catalog.oid := '@extschema@'::pg_catalog.regnamespace::pg_catalog.oid;
    database_owner_oid pg_catalog.oid := 'pg_database_owner'::pg_catalog.regrole::pg_catalog.oid;
    schema_owner_oid pg_catalog.oid;
    creators text;
    their_code text;
BEGIN
    SELECT CASE WHEN n.nspowner OPERATOR(pg_catalog.=) database_owner_oid
                THEN (SELECT d.datdba FROM pg_catalog.pg_database d
                       WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
                ELSE n.nspowner END
      INTO schema_owner_oid
      FROM pg_catalog.pg_namespace n WHERE n.oid OPERATOR(pg_catalog.=) schema_oid;
    SELECT pg_catalog.string_agg(w.who, ', ') INTO creators FROM (
        (SELECT 'PUBLIC' AS who
           FROM pg_catalog.pg_namespace n,
                pg_catalog.aclexplode(COALESCE(n.nspacl,
                    pg_catalog.acldefault('n'::pg_catalog."char", n.nspowner))) a
          WHERE n.oid OPERATOR(pg_catalog.=) schema_oid
            AND a.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid
            AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'::pg_catalog.text)
        UNION ALL
        (SELECT pg_catalog.quote_ident(r.rolname::pg_catalog.text)
           FROM pg_catalog.pg_roles r
          WHERE NOT r.rolsuper
            AND r.oid OPERATOR(pg_catalog.<>) database_owner_oid
            AND (pg_catalog.has_schema_privilege(r.oid, schema_oid, 'CREATE'::pg_catalog.text)
                 OR pg_catalog.pg_has_role(r.oid, schema_owner_oid, 'USAGE'::pg_catalog.text))
          ORDER BY 1 LIMIT 20)) w;
    WITH code AS (
        SELECT pg_catalog.format('function %s', p.oid::pg_catalog.regprocedure) AS what,
               p.proowner AS owner
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace OPERATOR(pg_catalog.=) schema_oid
        UNION ALL
        SELECT pg_catalog.format('aggregate %s', a.aggfnoid::pg_catalog.regprocedure),
               s.proowner
          FROM pg_catalog.pg_aggregate a
          JOIN pg_catalog.pg_proc p
            ON p.oid OPERATOR(pg_catalog.=) a.aggfnoid::pg_catalog.oid
          JOIN pg_catalog.pg_proc s ON s.oid OPERATOR(pg_catalog.=) ANY (ARRAY[
               a.aggtransfn::pg_catalog.oid, a.aggfinalfn::pg_catalog.oid,
               a.aggcombinefn::pg_catalog.oid, a.aggserialfn::pg_catalog.oid,
               a.aggdeserialfn::pg_catalog.oid, a.aggmtransfn::pg_catalog.oid,
               a.aggminvtransfn::pg_catalog.oid, a.aggmfinalfn::pg_catalog.oid])
         WHERE p.pronamespace OPERATOR(pg_catalog.=) schema_oid
        UNION ALL
        SELECT pg_catalog.format('operator %s', o.oid::pg_catalog.regoperator), c.owner
          FROM pg_catalog.pg_operator o
          CROSS JOIN LATERAL (
              SELECT o.oprowner AS owner
              UNION ALL
              SELECT s.proowner FROM pg_catalog.pg_proc s
               WHERE s.oid OPERATOR(pg_catalog.=) ANY (ARRAY[o.oprcode::pg_catalog.oid,
                     o.oprrest::pg_catalog.oid, o.oprjoin::pg_catalog.oid])) c
         WHERE o.oprnamespace OPERATOR(pg_catalog.=) schema_oid),
    owners AS (SELECT DISTINCT code.owner FROM code),
    untrusted AS (
        SELECT w.owner FROM owners w
         WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_roles s
                            WHERE s.oid OPERATOR(pg_catalog.=) w.owner AND s.rolsuper)
            OR EXISTS (SELECT FROM pg_catalog.pg_roles r
                        WHERE NOT r.rolsuper
                          AND pg_catalog.pg_has_role(r.oid, w.owner, 'USAGE'::pg_catalog.text)))
    SELECT pg_catalog.string_agg(DISTINCT f.what, ', ') INTO their_code FROM (
        SELECT code.what FROM code
          JOIN untrusted u ON u.owner OPERATOR(pg_catalog.=) code.owner
         LIMIT 20) f;
    IF creators IS NOT NULL OR their_code IS NOT NULL THEN
        RAISE EXCEPTION 'sql_query_engine cannot be installed or updated in schema %: a role that is not a superuser owns it, may create in it or owns functions or operators in it',
            '@extschema@'
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('Roles that are not superusers but may create in it or act as its owner: %s. Functions, aggregates and operators in it whose code such roles own or may replace: %s. An operator or function of theirs that matches a call of the extension''s script more closely than pg_catalog''s would run with your rights, and the schema''s owner could put tables of its own in place of the extension''s.',
                      COALESCE(creators, 'none'), COALESCE(their_code, 'none')),
                  HINT = 'Install it in a schema of its own: CREATE SCHEMA nl; GRANT USAGE ON SCHEMA nl TO PUBLIC; CREATE EXTENSION sql_query_engine SCHEMA nl; and add nl to the search path (ALTER DATABASE ... SET search_path = "$user", public, nl). To update it where it is, a superuser takes the schema (ALTER SCHEMA ... OWNER TO), revokes CREATE on it from those roles and moves their functions and operators out first.';
    END IF;
END
$$;
SET LOCAL search_path = pg_catalog, pg_temp;

-- Default privileges of the role that installed or updated the extension (ALTER DEFAULT
-- PRIVILEGES, in its schema or in all) were given to its tables, sequences and trigger
-- functions too (see privileges.sql, which a fresh install now runs last). Those no role needs
-- are revoked from every role but the owner: on the tables all but SELECT (and the INSERT every
-- role has on nl_history, nl_sessions and nl_feedback), except INSERT and DELETE on nl_examples
-- granted to a role (not PUBLIC), which the owner grants to roles that may write examples; on
-- the sequences all but SELECT; on the trigger functions EXECUTE. Those kept are listed in a
-- WARNING: a role given them by default privileges alone is to be revoked by hand.
DO $$
DECLARE
    extension_oid oid := (SELECT e.oid FROM pg_extension e
                          WHERE e.extname = 'sql_query_engine');
    revoked record;
    writers text;
BEGIN
    FOR revoked IN
        SELECT format('REVOKE %s ON %s %I.%I FROM %s CASCADE', a.privilege_type,
                   CASE c.relkind WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END,
                   n.nspname, c.relname,
                   CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                        ELSE quote_ident(r.rolname::text) END) AS command
          FROM pg_depend d
          JOIN pg_class c ON c.oid = d.objid
          JOIN pg_namespace n ON n.oid = c.relnamespace
          CROSS JOIN LATERAL aclexplode(c.relacl) a
          LEFT JOIN pg_roles r ON r.oid = a.grantee
         WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_extension'::regclass
           AND d.refobjid = extension_oid AND d.deptype = 'e'
           AND a.grantee <> c.relowner
           AND a.privilege_type <> 'SELECT'
           AND NOT (a.privilege_type = 'INSERT'
                    AND c.relname IN ('nl_history', 'nl_sessions', 'nl_feedback'))
           AND NOT (a.privilege_type IN ('INSERT', 'DELETE') AND a.grantee <> 0
                    AND c.relname = 'nl_examples')
        UNION ALL
        SELECT format('REVOKE ALL ON FUNCTION %s FROM %s CASCADE', p.oid::regprocedure,
                   CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                        ELSE quote_ident(r.rolname::text) END)
          FROM pg_depend d
          JOIN pg_proc p ON p.oid = d.objid
          CROSS JOIN LATERAL aclexplode(COALESCE(p.proacl, acldefault('f', p.proowner))) a
          LEFT JOIN pg_roles r ON r.oid = a.grantee
         WHERE d.classid = 'pg_proc'::regclass AND d.refclassid = 'pg_extension'::regclass
           AND d.refobjid = extension_oid AND d.deptype = 'e'
           AND p.prorettype IN ('trigger'::regtype, 'event_trigger'::regtype)
           AND a.grantee <> p.proowner
    LOOP
        EXECUTE revoked.command;
    END LOOP;
    SELECT string_agg(DISTINCT quote_ident(r.rolname::text), ', ') INTO writers
      FROM pg_depend d
      JOIN pg_class c ON c.oid = d.objid
      CROSS JOIN LATERAL aclexplode(c.relacl) a
      JOIN pg_roles r ON r.oid = a.grantee
     WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_extension'::regclass
       AND d.refobjid = extension_oid AND d.deptype = 'e'
       AND c.relname = 'nl_examples' AND a.grantee <> c.relowner
       AND a.privilege_type IN ('INSERT', 'DELETE');
    IF writers IS NOT NULL THEN
        RAISE WARNING 'these roles may write the verified examples every role''s model is shown: %',
            writers
            USING HINT = 'Revoke INSERT and DELETE on nl_examples from those not granted them on purpose (default privileges of the role that installed the extension gave them to its tables too, before 0.21.0).';
    END IF;
END
$$;
