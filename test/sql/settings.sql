-- The settings as a user meets them: their defaults and who may set them, and the errors of a
-- mistyped, a superuser-only and a raised setting, and where requests go is no other role's to
-- read (hidden from pg_settings and SHOW ALL, like redis_url).
CREATE EXTENSION sql_query_engine;
SELECT name, setting, unit, context FROM pg_settings
WHERE name LIKE 'sql_query_engine.%' ORDER BY name;
SET sql_query_engine.max_rowz = 10;
SET sql_query_engine.max_rows = 'many';
SET sql_query_engine.vote = 'sometimes';
SET sql_query_engine.llm_api_key = 'sk-not-echoed';
CREATE ROLE sqe_regress_role;
SET ROLE sqe_regress_role;
SET sql_query_engine.llm_url = 'http://elsewhere.invalid/v1';
DO $$ BEGIN
    RAISE NOTICE 'llm_url shown: %', current_setting('sql_query_engine.llm_url');
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'llm_url hidden (SQLSTATE %)', SQLSTATE;
END $$;
SET sql_query_engine.trusted_owners = 'sqe_regress_role';
SET sql_query_engine.max_rows = 100000;
SET sql_query_engine.max_rows = 10;
RESET ROLE;
DROP ROLE sqe_regress_role;
DROP EXTENSION sql_query_engine;
