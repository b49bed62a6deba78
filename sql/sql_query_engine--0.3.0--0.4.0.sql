-- sql_query_engine 0.3.0 -> 0.4.0 (ALTER EXTENSION sql_query_engine UPDATE TO '0.4.0').
\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.4.0'" to load this file. \quit

-- One deployment, several servers: nl_call runs as a role and with progress for the call only
-- (what a gateway sharing connections through a transaction-mode pooler needs), a server says
-- where it keeps sessions, and the primary records answers its standbys gave.
DROP PROCEDURE @extschema@.nl_call(text, text, jsonb, jsonb);
CREATE PROCEDURE @extschema@.nl_call(question text, session text DEFAULT NULL,
    INOUT answer jsonb DEFAULT NULL, turns jsonb DEFAULT NULL,
    run_as text DEFAULT NULL, progress boolean DEFAULT NULL)
LANGUAGE c AS 'MODULE_PATHNAME', 'nl_call_wrapper';

CREATE FUNCTION @extschema@."nl_session_store"() RETURNS TEXT
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'nl_session_store_wrapper';

CREATE FUNCTION @extschema@."nl_history_add"("answer" jsonb, "function" TEXT DEFAULT 'nl_ask',
    "session" TEXT DEFAULT NULL) RETURNS bigint
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'nl_history_add_wrapper';
