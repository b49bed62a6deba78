-- Conversations that survive a connection pooler: the turns of each role's named sessions, so
-- that whichever backend serves the next turn finds them. Written in the caller's transaction;
-- each role (by OID, see nl_history) sees and writes only its own rows; rows expire after
-- sql_query_engine.session_ttl. A row names its own role and is of now: a role names no other
-- as its writer, and keeps no row past the TTL by dating it ahead.
CREATE TABLE @extschema@.nl_sessions (
    role name NOT NULL DEFAULT current_user,
    session text NOT NULL,
    -- Bounded where it is written: a role may write its own row, and a backend reads the whole
    -- of it to take the last turns (compressed, its stored size says nothing).
    turns jsonb NOT NULL CHECK (pg_catalog.octet_length(turns::text) <= 16777216),
    updated_at timestamptz NOT NULL DEFAULT now(),
    role_id oid NOT NULL DEFAULT pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid,
    PRIMARY KEY (role_id, session)
);
ALTER TABLE @extschema@.nl_sessions ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_sessions ON @extschema@.nl_sessions
    USING (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid)
    WITH CHECK (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid
                AND role = current_user AND updated_at = pg_catalog.now());
GRANT SELECT, INSERT, UPDATE, DELETE ON @extschema@.nl_sessions TO PUBLIC;
-- Restored or replicated rows go to the role of their name (see nl_row_role in history.sql):
-- the OID they were written under may be another role's here.
CREATE TRIGGER nl_row_role BEFORE INSERT OR UPDATE ON @extschema@.nl_sessions
    FOR EACH ROW EXECUTE FUNCTION @extschema@.nl_row_role();
ALTER TABLE @extschema@.nl_sessions ENABLE ALWAYS TRIGGER nl_row_role;
