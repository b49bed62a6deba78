-- What nl_check says about SQL, as users read it: the refusal's SQLSTATE and message, or ok.
CREATE EXTENSION sql_query_engine;
SET client_min_messages = warning;
CREATE SCHEMA regress;
SET search_path = regress, public;
CREATE TABLE t (a int, b text);
CREATE FUNCTION regress.side_effect() RETURNS int LANGUAGE sql VOLATILE AS 'SELECT 1';
CREATE FUNCTION regress.lock_it(int) RETURNS boolean LANGUAGE plpgsql
    AS 'BEGIN PERFORM pg_advisory_lock(11); RETURN true; END';
CREATE DOMAIN regress.checked AS int CHECK (regress.lock_it(VALUE));
CREATE TYPE regress.mood AS ENUM ('happy', 'sad');
CREATE DOMAIN regress.positive AS int CHECK (VALUE > 0);
-- The verdict on one statement: "ok", or the SQLSTATE and the message it was refused with.
CREATE FUNCTION pg_temp.verdict(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM nl_check(sql);
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;
\pset format unaligned
\pset tuples_only on
SELECT pg_temp.verdict(q) FROM (VALUES
    ('SELECT a, b FROM t WHERE a > 1 ORDER BY b'),
    ('WITH x AS (SELECT count(DISTINCT a) AS n FROM t) SELECT n FROM x'),
    ('DELETE FROM t'),
    ('WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d'),
    ('SELECT 1; SELECT 2'),
    ('SELECT * FROM t FOR UPDATE'),
    ('SELECT pg_sleep(1)'),
    ('SELECT regress.side_effect()'),
    ('SELECT query_to_xml(''SELECT 1'', true, false, '''')'),
    ('SELECT relname FROM pg_class'),
    ('SELECT 1::regress.checked'),
    ('SELECT ''{1}''::regress.checked[]'),
    ('SELECT domain_in(''1'', ''regress.checked''::regtype, -1)'),
    ('SELECT ''happy''::regress.mood, 5::regress.positive'),
    ('SELECT txid_current_snapshot()'),
    ('SELEC 1'),
    ('SELECT nope FROM t')
) AS cases(q);
\pset format aligned
\pset tuples_only off
-- Nothing ran: the domain's CHECK never took its lock.
SELECT count(*) AS advisory_locks FROM pg_locks WHERE locktype = 'advisory';
DROP SCHEMA regress CASCADE;
DROP EXTENSION sql_query_engine;
