-- 0.16.0 -> 0.17.0
\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.17.0'" to load this file. \quit

-- nl_sessions is append-only for every role but the owner (see sessions.sql): a row per turn,
-- and a reset is a row too. A role that could update or delete its own rows could also lock
-- the table in any mode, and while it held the lock every role's conversations fell back to
-- backend memory. The live turns of 0.16.0's rows are kept, in order.
ALTER TABLE @extschema@.nl_sessions RENAME TO nl_sessions_0_16;
-- Its constraints (and the primary key's index) give their names to the new table's: on
-- PostgreSQL 18, NOT NULL constraints have names too.
DO $$
DECLARE
    c record;
BEGIN
    FOR c IN SELECT conname FROM pg_catalog.pg_constraint
             WHERE conrelid = '@extschema@.nl_sessions_0_16'::pg_catalog.regclass LOOP
        EXECUTE pg_catalog.format('ALTER TABLE @extschema@.nl_sessions_0_16 RENAME CONSTRAINT %I TO %I',
                                  c.conname, 'old_' || c.conname);
    END LOOP;
END
$$;
CREATE TABLE @extschema@.nl_sessions (
    role name NOT NULL DEFAULT current_user,
    session text NOT NULL,
    id bigint GENERATED ALWAYS AS IDENTITY,
    -- NULL: the session was reset here. Bounded: a question is at most 10,000 characters, and a
    -- turn's SQL is read back whole by every backend that serves the session.
    question text CHECK (pg_catalog.octet_length(question) <= 40000),
    sql text NOT NULL DEFAULT '' CHECK (pg_catalog.octet_length(sql) <= 100000),
    at timestamptz NOT NULL DEFAULT now(),
    role_id oid NOT NULL DEFAULT pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid,
    PRIMARY KEY (role_id, session, id)
);
ALTER TABLE @extschema@.nl_sessions ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_sessions ON @extschema@.nl_sessions
    USING (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid)
    WITH CHECK (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid
                AND role = current_user AND at = pg_catalog.now());
GRANT SELECT, INSERT ON @extschema@.nl_sessions TO PUBLIC;
-- Each row under the OID it was written under (before the trigger is there: a role renamed
-- since keeps its turns, and whoever took its name gets none), none dated ahead (rows written
-- before 0.10.0 could be).
INSERT INTO @extschema@.nl_sessions (role, session, question, sql, at, role_id)
SELECT o.role, o.session, t.turn ->> 'question', COALESCE(t.turn ->> 'sql', ''),
       o.updated_at, o.role_id
FROM @extschema@.nl_sessions_0_16 o,
     pg_catalog.jsonb_array_elements(o.turns) WITH ORDINALITY AS t(turn, n)
WHERE pg_catalog.jsonb_typeof(o.turns) = 'array' AND o.updated_at <= pg_catalog.now()
  AND t.turn ->> 'question' IS NOT NULL
  AND pg_catalog.octet_length(t.turn ->> 'question') <= 40000
  AND pg_catalog.octet_length(COALESCE(t.turn ->> 'sql', '')) <= 100000
ORDER BY o.role_id, o.session, t.n;
DROP TABLE @extschema@.nl_sessions_0_16;
-- Restored or replicated rows go to the role of their name (see nl_row_role in history.sql):
-- the OID they were written under may be another role's here.
CREATE TRIGGER nl_row_role BEFORE INSERT OR UPDATE ON @extschema@.nl_sessions
    FOR EACH ROW EXECUTE FUNCTION @extschema@.nl_row_role();
ALTER TABLE @extschema@.nl_sessions ENABLE ALWAYS TRIGGER nl_row_role;
