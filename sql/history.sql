-- The history of questions: one row per nl_query, nl_generate and nl_answer call
-- (sql_query_engine.history). Its owner reads every row; other roles see only their own (row
-- level security). Written in the caller's transaction, best effort: skipped in read-only
-- transactions and on standbys.
CREATE TABLE @extschema@.nl_history (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    role name NOT NULL DEFAULT current_user,
    function text NOT NULL,
    session text,
    question text NOT NULL,
    sql text,
    status text NOT NULL,
    attempts jsonb NOT NULL,
    row_count integer,
    ms double precision NOT NULL,
    llm_calls integer NOT NULL,
    prompt_tokens integer NOT NULL,
    completion_tokens integer NOT NULL
);
CREATE INDEX ON @extschema@.nl_history (role, at);
ALTER TABLE @extschema@.nl_history ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_rows ON @extschema@.nl_history USING (role = current_user)
    WITH CHECK (role = current_user);
GRANT SELECT, INSERT ON @extschema@.nl_history TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.nl_history', '');
