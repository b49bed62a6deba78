-- Conversations that survive a connection pooler: the turns of each role's named sessions, so
-- that whichever backend serves the next turn finds them. Written in the caller's transaction;
-- each role (by OID, see nl_history) sees and adds only its own rows. A row names its own role
-- and is dated as it is written (nl_row_role): a role names no other as its writer, and keeps no
-- turn alive by dating it ahead.
--
-- Append-only for every role but the owner: a turn is a row, and so is a reset (a row with no
-- question); a session's live turns are those since its last reset, with no pause longer than
-- sql_query_engine.session_ttl between them and the newest. With no UPDATE, DELETE or
-- TRUNCATE, no role can lock the table against another's reads or writes (LOCK TABLE needs
-- one of them beyond ROW EXCLUSIVE mode). Rows past their TTL are read by no one; the owner
-- deletes them (see README, "Conversations").
CREATE TABLE @extschema@.nl_sessions (
    role name NOT NULL DEFAULT current_user,
    session text NOT NULL,
    id bigint GENERATED ALWAYS AS IDENTITY,
    -- NULL: the session was reset here. Bounded: a question is at most 10,000 characters, and a
    -- turn's SQL is read back whole by every backend that serves the session.
    question text CHECK (pg_catalog.octet_length(question) <= 40000),
    sql text NOT NULL DEFAULT '' CHECK (pg_catalog.octet_length(sql) <= 100000),
    at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    role_id oid NOT NULL DEFAULT pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid,
    PRIMARY KEY (role_id, session, id)
);
ALTER TABLE @extschema@.nl_sessions ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_sessions ON @extschema@.nl_sessions
    USING (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid)
    WITH CHECK (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid
                AND role = current_user);
-- Its privileges: privileges.sql.
-- Restored or replicated rows go to the role of their name (see nl_row_role in history.sql):
-- the OID they were written under may be another role's here.
CREATE TRIGGER nl_row_role BEFORE INSERT OR UPDATE ON @extschema@.nl_sessions
    FOR EACH ROW EXECUTE FUNCTION @extschema@.nl_row_role();
ALTER TABLE @extschema@.nl_sessions ENABLE ALWAYS TRIGGER nl_row_role;
