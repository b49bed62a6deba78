-- sql_query_engine 0.4.0 -> 0.5.0 (ALTER EXTENSION sql_query_engine UPDATE TO '0.5.0').
\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.5.0'" to load this file. \quit

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

-- A role's rows are found by the OID of its exact name. Before, current_user::regrole read the
-- name as an identifier: the role "Alice" (or " alice", with a blank) was taken for alice, and
-- saw and wrote alice's history, sessions and feedback; a name with a dot ("john.doe") could not
-- be read at all.
ALTER TABLE @extschema@.nl_history ALTER COLUMN role_id SET DEFAULT pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid;
ALTER POLICY own_rows ON @extschema@.nl_history
    USING (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid)
    WITH CHECK (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid);
ALTER TABLE @extschema@.nl_sessions ALTER COLUMN role_id SET DEFAULT pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid;
ALTER POLICY own_sessions ON @extschema@.nl_sessions
    USING (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid)
    WITH CHECK (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid);
ALTER TABLE @extschema@.nl_feedback ALTER COLUMN role_id SET DEFAULT pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid;
ALTER POLICY own_rows ON @extschema@.nl_feedback
    USING (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid)
    WITH CHECK (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid);

-- Rows such a role wrote under another role's OID go back to the role of their exact name (0
-- when it is gone): rows whose role_id is not their name's role, but the role its name names
-- when read as an identifier (blanks trimmed; folded to lower case, or unquoted). Sessions are
-- only a conversation's context, and one role may have written into another's: they are all
-- dropped.
CREATE FUNCTION @extschema@.nl_read_as_identifier(name text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN pg_catalog.btrim(name) ~ '^".*"$'
    THEN pg_catalog.replace(pg_catalog.substr(pg_catalog.btrim(name), 2,
                                              pg_catalog.length(pg_catalog.btrim(name)) - 2),
                            '""', '"')
    ELSE pg_catalog.lower(pg_catalog.btrim(name)) END;
UPDATE @extschema@.nl_history h
    SET role_id = coalesce((SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = h.role), 0)
    WHERE h.role_id IS DISTINCT FROM (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = h.role)
      AND (SELECT r.rolname::text FROM pg_catalog.pg_roles r WHERE r.oid = h.role_id)
          = @extschema@.nl_read_as_identifier(h.role::text);
UPDATE @extschema@.nl_feedback f
    SET role_id = coalesce((SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = f.role), 0)
    WHERE f.role_id IS DISTINCT FROM (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = f.role)
      AND (SELECT r.rolname::text FROM pg_catalog.pg_roles r WHERE r.oid = f.role_id)
          = @extschema@.nl_read_as_identifier(f.role::text);
DROP FUNCTION @extschema@.nl_read_as_identifier(text);
DELETE FROM @extschema@.nl_sessions;
