-- sql_query_engine 0.4.0 -> 0.5.0 (ALTER EXTENSION sql_query_engine UPDATE TO '0.5.0').
\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.5.0'" to load this file. \quit

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
