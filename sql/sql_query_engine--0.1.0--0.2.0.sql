-- sql_query_engine 0.1.0 -> 0.2.0 (ALTER EXTENSION sql_query_engine UPDATE TO '0.2.0').
\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.2.0'" to load this file. \quit

-- The schema version: a COMMENT counter in a table instead of a sequence bumped by all DDL
-- (relcache invalidations now cover the rest, precisely, also on hot standbys).
DROP EVENT TRIGGER nl_schema_changed_ddl;
DROP EVENT TRIGGER nl_schema_changed_drop;
DROP FUNCTION @extschema@.nl_schema_changed();
DROP SEQUENCE @extschema@.nl_schema_version;

CREATE TABLE @extschema@.nl_schema_changes (
    xid xid8 PRIMARY KEY DEFAULT pg_catalog.pg_current_xact_id(),
    changes bigint NOT NULL DEFAULT 1
);
GRANT SELECT ON @extschema@.nl_schema_changes TO PUBLIC;

CREATE FUNCTION @extschema@.nl_schema_changed() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO @extschema@.nl_schema_changes DEFAULT VALUES ON CONFLICT (xid) DO NOTHING;
    IF (SELECT count(*) FROM @extschema@.nl_schema_changes) > 100 THEN
        WITH folded AS (
            DELETE FROM @extschema@.nl_schema_changes
            WHERE xid IN (SELECT xid FROM @extschema@.nl_schema_changes
                          WHERE xid <> pg_current_xact_id()
                          ORDER BY xid LIMIT 100 FOR UPDATE SKIP LOCKED)
            RETURNING changes)
        UPDATE @extschema@.nl_schema_changes
        SET changes = changes + (SELECT coalesce(sum(changes), 0) FROM folded)
        WHERE xid = pg_current_xact_id();
    END IF;
EXCEPTION WHEN OTHERS THEN
    NULL;
END
$$;
REVOKE ALL ON FUNCTION @extschema@.nl_schema_changed() FROM PUBLIC;

CREATE EVENT TRIGGER nl_schema_changed ON ddl_command_end WHEN TAG IN ('COMMENT')
    EXECUTE FUNCTION @extschema@.nl_schema_changed();

-- The extension's own SQL resolves names on a pinned search path. nl_example_add moves into
-- the library: it checks the caller's SQL on the caller's path and inserts on the pinned one.
ALTER FUNCTION @extschema@.nl_example_remove(bigint) SET search_path = pg_catalog, pg_temp;
DROP FUNCTION @extschema@.nl_example_add(text, text);
CREATE FUNCTION @extschema@.nl_example_add("question" text, "sql" text) RETURNS bigint
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'nl_example_add_wrapper';

-- Explicit volatility.
ALTER FUNCTION @extschema@.nl_query(text, text) VOLATILE PARALLEL UNSAFE;
ALTER FUNCTION @extschema@.nl_generate(text, text) VOLATILE PARALLEL UNSAFE;
ALTER FUNCTION @extschema@.nl_trace(text, text) VOLATILE PARALLEL UNSAFE;
ALTER FUNCTION @extschema@.nl_answer(text, text) VOLATILE PARALLEL UNSAFE;
ALTER FUNCTION @extschema@.nl_schema(text) VOLATILE PARALLEL UNSAFE;
ALTER FUNCTION @extschema@.nl_session_reset(text) VOLATILE PARALLEL UNSAFE;
ALTER FUNCTION @extschema@.nl_check(text) STABLE PARALLEL RESTRICTED;

-- The caller's own SQL through the guard and the read-only sandbox.
CREATE FUNCTION @extschema@.nl_run("sql" text) RETURNS SETOF jsonb
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'nl_run_wrapper';

-- Conversations that survive a connection pooler.
CREATE TABLE @extschema@.nl_sessions (
    role name NOT NULL DEFAULT current_user,
    session text NOT NULL,
    turns jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (role, session)
);
ALTER TABLE @extschema@.nl_sessions ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_sessions ON @extschema@.nl_sessions USING (role = current_user)
    WITH CHECK (role = current_user);
GRANT SELECT, INSERT, UPDATE, DELETE ON @extschema@.nl_sessions TO PUBLIC;

-- For API clients and BI tools.
CREATE FUNCTION @extschema@.nl_ask("question" text, "session" text DEFAULT NULL) RETURNS jsonb
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'nl_ask_wrapper';
CREATE FUNCTION @extschema@.nl_fix("sql" text, "question" text DEFAULT NULL) RETURNS text
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'nl_fix_wrapper';
CREATE FUNCTION @extschema@.nl_cursor(question text, cursor_name text DEFAULT 'nl_answer')
RETURNS refcursor VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'nl_cursor_wrapper';
CREATE PROCEDURE @extschema@.nl_call(question text, session text DEFAULT NULL,
    INOUT answer jsonb DEFAULT NULL)
LANGUAGE c AS 'MODULE_PATHNAME', 'nl_call_wrapper';
