//! The adversarial corpus for the guard: every statement with the SQLSTATE it must get, or
//! `OK` when it must pass (no false refusals). Objects named here are created by
//! `CORPUS_SETUP` in the schema `sqe_corpus`.

/// Expected outcome of a statement that must pass the guard.
pub const OK: &str = "ok";

pub const CORPUS_SETUP: &str = r#"
CREATE SCHEMA sqe_corpus;
CREATE TABLE sqe_corpus.t (a int);
CREATE TABLE sqe_corpus.u (a int);
CREATE SEQUENCE sqe_corpus.s;
CREATE MATERIALIZED VIEW sqe_corpus.mv AS SELECT 1 AS a;
CREATE FUNCTION sqe_corpus.f_default(x bigint DEFAULT nextval('sqe_corpus.s'))
    RETURNS bigint LANGUAGE sql STABLE AS 'SELECT x';
CREATE FUNCTION sqe_corpus.volatile_fn() RETURNS int LANGUAGE sql VOLATILE AS 'SELECT 1';
CREATE FUNCTION sqe_corpus.vol_eq(int, int) RETURNS bool LANGUAGE sql VOLATILE AS 'SELECT $1 = $2';
CREATE OPERATOR sqe_corpus.=== (leftarg = int, rightarg = int, function = sqe_corpus.vol_eq);
CREATE FUNCTION sqe_corpus.dblink_exec(text) RETURNS text LANGUAGE sql IMMUTABLE AS 'SELECT $1';
CREATE FUNCTION sqe_corpus.harmless(int) RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT $1 + 1';
CREATE PROCEDURE sqe_corpus.p() LANGUAGE sql AS 'SELECT 1';
CREATE FUNCTION sqe_corpus.crosstab(text) RETURNS SETOF record LANGUAGE sql IMMUTABLE
    AS 'SELECT 1::text, 1::text';
CREATE FUNCTION sqe_corpus.connectby(text, text, text, text, int) RETURNS SETOF record
    LANGUAGE sql IMMUTABLE AS 'SELECT 1::text, 1::text, 1';
CREATE AGGREGATE sqe_corpus.agg(int) (sfunc = int4pl, stype = int);
CREATE FUNCTION sqe_corpus.volatile_pl() RETURNS int LANGUAGE plpgsql VOLATILE
    AS 'BEGIN RETURN 1; END';
CREATE DOMAIN sqe_corpus.checked AS int CHECK (sqe_corpus.volatile_pl() = 1);
CREATE FUNCTION sqe_corpus.lock_it(int) RETURNS boolean LANGUAGE plpgsql
    AS 'BEGIN PERFORM pg_advisory_lock(4321); RETURN true; END';
CREATE DOMAIN sqe_corpus.locking AS int CHECK (sqe_corpus.lock_it(VALUE));
CREATE TYPE sqe_corpus.comp AS (a sqe_corpus.locking);
CREATE TYPE sqe_corpus.mood AS ENUM ('happy', 'sad');
CREATE FUNCTION sqe_corpus.mood_json(sqe_corpus.mood) RETURNS json LANGUAGE plpgsql
    AS 'BEGIN PERFORM pg_advisory_lock(4322); RETURN ''"x"''; END';
CREATE CAST (sqe_corpus.mood AS json) WITH FUNCTION sqe_corpus.mood_json(sqe_corpus.mood);
CREATE TABLE sqe_corpus.moods (m sqe_corpus.mood);
CREATE DOMAIN sqe_corpus.positive AS int CHECK (VALUE > 0);
CREATE TYPE sqe_corpus.color AS ENUM ('red', 'green');
CREATE TYPE sqe_corpus.plain AS (a int, b text);
CREATE TABLE sqe_corpus.colors (c sqe_corpus.color, p sqe_corpus.positive, r sqe_corpus.plain);
"#;

pub const CASES: &[(&str, &str)] = &[
    // --- writes, DDL and utility commands: 25006, never run, never repaired
    ("INSERT INTO t VALUES (1)", "25006"),
    ("INSERT INTO t SELECT 1", "25006"),
    ("UPDATE t SET a = 1", "25006"),
    ("DELETE FROM t", "25006"),
    ("MERGE INTO t USING u ON t.a = u.a WHEN MATCHED THEN DELETE", "25006"),
    ("TRUNCATE t", "25006"),
    ("CREATE TABLE x (a int)", "25006"),
    ("CREATE TEMP TABLE x AS SELECT 1", "25006"),
    ("CREATE TABLE x AS SELECT * FROM t", "25006"),
    ("CREATE MATERIALIZED VIEW mv2 AS SELECT 1", "25006"),
    ("CREATE VIEW v2 AS SELECT 1", "25006"),
    ("DROP TABLE t", "25006"),
    ("DROP TABLE IF EXISTS t;", "25006"),
    ("ALTER TABLE t ADD COLUMN z int", "25006"),
    ("CREATE INDEX ON t (a)", "25006"),
    ("COPY t TO STDOUT", "25006"),
    ("COPY t FROM '/etc/passwd'", "25006"),
    ("COPY t TO '/tmp/sqe_corpus_out'", "25006"),
    ("COPY (SELECT 1) TO PROGRAM 'id'", "25006"),
    ("DO $$ BEGIN PERFORM 1; END $$", "25006"),
    ("CALL p()", "25006"),
    ("EXPLAIN ANALYZE SELECT 1", "25006"),
    ("EXPLAIN SELECT 1", "25006"),
    ("PREPARE q AS SELECT 1", "25006"),
    ("EXECUTE q", "25006"),
    ("DEALLOCATE q", "25006"),
    ("LISTEN ch", "25006"),
    ("NOTIFY ch", "25006"),
    ("UNLISTEN *", "25006"),
    ("LOCK TABLE t", "25006"),
    ("SET search_path = x", "25006"),
    ("SET LOCAL statement_timeout = 0", "25006"),
    ("RESET ALL", "25006"),
    ("BEGIN", "25006"),
    ("COMMIT", "25006"),
    ("ROLLBACK", "25006"),
    ("SAVEPOINT s1", "25006"),
    ("START TRANSACTION READ WRITE", "25006"),
    ("VACUUM t", "25006"),
    ("ANALYZE t", "25006"),
    ("SELECT * INTO x FROM t", "25006"),
    ("SELECT 1 INTO TEMP x", "25006"),
    ("CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1'", "25006"),
    ("GRANT SELECT ON t TO PUBLIC", "25006"),
    ("REVOKE ALL ON t FROM PUBLIC", "25006"),
    ("CREATE ROLE sqe_corpus_role", "25006"),
    ("ALTER ROLE CURRENT_USER SET search_path = x", "25006"),
    ("ALTER SYSTEM SET work_mem = '1GB'", "25006"),
    ("DISCARD ALL", "25006"),
    ("REFRESH MATERIALIZED VIEW mv", "25006"),
    ("CLUSTER t", "25006"),
    ("REINDEX TABLE t", "25006"),
    ("COMMENT ON TABLE t IS 'x'", "25006"),
    ("CHECKPOINT", "25006"),
    ("LOAD 'plpgsql'", "25006"),
    ("DECLARE c CURSOR FOR SELECT 1", "25006"),
    ("FETCH ALL FROM c", "25006"),
    ("CLOSE c", "25006"),
    ("SHOW ALL", "25006"),
    ("CREATE EXTENSION dblink", "25006"),
    ("SECURITY LABEL ON TABLE t IS 'x'", "25006"),
    // writes hidden in CTEs and behind other statements
    ("WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d", "25006"),
    ("WITH i AS (INSERT INTO t VALUES (1) RETURNING a) SELECT a FROM i", "25006"),
    ("WITH u AS (UPDATE t SET a = a RETURNING a) SELECT count(*) FROM u", "25006"),
    ("SELECT * FROM (WITH d AS (DELETE FROM t RETURNING a) SELECT a FROM d) s", "25006"),
    ("SELECT (WITH d AS (DELETE FROM t RETURNING a) SELECT max(a) FROM d)", "25006"),
    ("WITH RECURSIVE r AS (SELECT 1) DELETE FROM t", "25006"),
    ("SELECT 1; DELETE FROM t", "25006"),
    ("SELECT 1;DELETE FROM t -- trailing comment", "25006"),
    ("/* leading comment */ DELETE FROM t", "25006"),
    ("-- leading comment\nDELETE FROM t", "25006"),
    ("SELECT 1 /* ; */ ; UPDATE t SET a = 2", "25006"),
    ("SELECT ';'; DROP TABLE t", "25006"),
    ("SELECT $$;$$; DROP TABLE t", "25006"),
    ("SELECT E'\\''; DROP TABLE t", "25006"),
    // several statements, or none
    ("SELECT 1; SELECT 2", "42601"),
    (";;;", "42601"),
    ("", "42601"),
    ("-- only a comment", "42601"),
    // --- locking clauses: 42501
    ("SELECT * FROM t FOR UPDATE", "42501"),
    ("SELECT * FROM t FOR SHARE", "42501"),
    ("SELECT * FROM t FOR NO KEY UPDATE", "42501"),
    ("SELECT * FROM t FOR KEY SHARE NOWAIT", "42501"),
    ("SELECT * FROM t FOR UPDATE SKIP LOCKED", "42501"),
    ("SELECT * FROM (SELECT * FROM t FOR UPDATE) s", "42501"),
    ("SELECT * FROM t WHERE a IN (SELECT a FROM t FOR UPDATE)", "42501"),
    ("WITH l AS (SELECT * FROM t FOR UPDATE) SELECT * FROM l", "42501"),
    ("SELECT 1 UNION SELECT a FROM t FOR UPDATE", "42501"),
    // --- side-effect functions: 42501, in every position
    ("SELECT nextval('s')", "42501"),
    ("SELECT setval('s', 100)", "42501"),
    ("SELECT currval('s')", "42501"),
    ("SELECT lastval()", "42501"),
    ("SELECT pg_sleep(10)", "42501"),
    ("SELECT pg_sleep_for('1 minute')", "42501"),
    ("SELECT pg_sleep_until(now() + interval '1 minute')", "42501"),
    ("SELECT pg_advisory_lock(1)", "42501"),
    ("SELECT pg_advisory_xact_lock(1)", "42501"),
    ("SELECT pg_try_advisory_lock(1)", "42501"),
    ("SELECT pg_advisory_unlock_all()", "42501"),
    ("SELECT pg_notify('ch', 'x')", "42501"),
    ("SELECT set_config('search_path', 'x', false)", "42501"),
    ("SELECT current_setting('sql_query_engine.llm_api_key')", "42501"),
    ("SELECT current_setting('work_mem', true)", "42501"),
    ("SELECT pg_terminate_backend(1)", "42501"),
    ("SELECT pg_cancel_backend(1)", "42501"),
    ("SELECT pg_reload_conf()", "42501"),
    ("SELECT pg_rotate_logfile()", "42501"),
    ("SELECT pg_read_file('/etc/passwd')", "42501"),
    ("SELECT pg_read_binary_file('/etc/passwd')", "42501"),
    ("SELECT * FROM pg_ls_dir('.')", "42501"),
    ("SELECT pg_stat_file('postgresql.conf')", "42501"),
    ("SELECT lo_import('/etc/passwd')", "42501"),
    ("SELECT lo_create(0)", "42501"),
    ("SELECT lo_unlink(1)", "42501"),
    ("SELECT pg_switch_wal()", "42501"),
    ("SELECT txid_current()", "42501"),
    ("SELECT pg_current_xact_id()", "42501"),
    ("SELECT pg_create_restore_point('x')", "42501"),
    ("SELECT pg_logical_emit_message(true, 'p', 'x')", "42501"),
    ("SELECT setseed(0.5)", "42501"),
    ("SELECT pg_export_snapshot()", "42501"),
    ("SELECT query_to_xml('DELETE FROM t', true, false, '')", "42501"),
    ("SELECT * FROM ts_stat('SELECT to_tsvector(''x'')')", "42501"),
    ("SELECT dblink_exec('DROP TABLE t')", "42501"),
    ("SELECT volatile_fn()", "42501"),
    // --- fail closed: functions that are not built in, and what runs implicitly
    ("SELECT harmless(a) FROM t", "42501"),
    ("SELECT agg(a) FROM t", "42501"),
    ("SELECT 1::checked", "42501"),
    // implicit conversions: a domain's CHECK behind arrays, records, column definition lists,
    // XMLTABLE columns, I/O functions called directly, and casts looked up at run time
    ("SELECT 12::locking", "42501"),
    ("SELECT '{12}'::locking[]", "42501"),
    ("SELECT ARRAY[1]::locking[]", "42501"),
    ("SELECT x::locking[] FROM (VALUES ('{12}'::text)) v(x)", "42501"),
    ("SELECT ('(16)'::comp).a", "42501"),
    ("SELECT '(1)'::comp", "42501"),
    ("VALUES ('{1}'::locking[])", "42501"),
    ("WITH c AS (SELECT '{1}'::locking[] AS a) SELECT 1 FROM c", "42501"),
    ("SELECT 1 WHERE '{1}'::locking[] IS NOT NULL", "42501"),
    (r#"SELECT * FROM jsonb_populate_record(NULL::comp, '{"a": 12}')"#, "42501"),
    (r#"SELECT * FROM jsonb_to_record('{"a": 12}') AS r(a locking)"#, "42501"),
    (r#"SELECT 1 FROM jsonb_to_record('{"a": 12}') AS r(a locking)"#, "42501"),
    ("SELECT * FROM xmltable('/r' PASSING ('<r><a>12</a></r>'::xml) COLUMNS a locking)", "42501"),
    ("SELECT domain_in('12', 'sqe_corpus.locking'::regtype, -1)", "42501"),
    ("SELECT record_in('(1)', 'sqe_corpus.comp'::regtype, -1)", "42501"),
    ("SELECT int4in('1')", "42501"),
    ("SELECT m FROM moods", "42501"),
    ("SELECT to_jsonb(m) FROM moods", "42501"),
    ("SELECT row_to_json(x) FROM moods x", "42501"),
    ("SELECT txid_current_snapshot()", "42501"),
    // an aggregate's DISTINCT and ORDER BY operators are checked like sort operators
    ("SELECT count(DISTINCT a), array_agg(a ORDER BY a DESC) FROM t", OK),
    // user types made only of what may run pass
    ("SELECT 5::positive", OK),
    ("SELECT c, p, r FROM colors", OK),
    ("SELECT to_jsonb(c), row_to_json(x) FROM colors x", OK),
    ("SELECT '(1,x)'::plain, 'red'::color, '{1,2}'::positive[]", OK),
    (r#"SELECT * FROM jsonb_to_record('{"a": 1}') AS r(a int, b text)"#, OK),
    // XPath's work can grow with a power of the document, without a check for cancel.
    ("SELECT * FROM xmltable('/r' PASSING ('<r><a>1</a></r>'::xml) COLUMNS a int)", "42501"),
    ("SELECT CAST(a AS checked) FROM t", "42501"),
    // functions that run SQL given as text
    ("SELECT * FROM crosstab('SELECT pg_advisory_lock(42)::text, 1::text, 1::text') AS x(a text, b text)", "42501"),
    ("SELECT * FROM connectby('t', 'a', 'a', '1', 0) AS x(a text, b text, c int)", "42501"),
    ("SELECT ts_rewrite('a'::tsquery, 'SELECT pg_advisory_lock(1)::text::tsquery, ''b''::tsquery')", "42501"),
    ("SELECT table_to_xml('sqe_corpus.t', true, false, '')", "42501"),
    ("SELECT cursor_to_xml('c', 1, true, false, '')", "42501"),
    // system accessors
    ("SELECT pg_stat_get_backend_activity(1)", "42501"),
    ("SELECT * FROM pg_config()", "42501"),
    ("SELECT version()", "42501"),
    ("SELECT * FROM pg_show_all_settings()", "42501"),
    ("SELECT pg_get_viewdef('sqe_corpus.mv'::regclass)", "42501"),
    ("SELECT a FROM t WHERE pg_sleep(1) IS NOT NULL", "42501"),
    ("SELECT a FROM t ORDER BY nextval('s')", "42501"),
    ("SELECT a FROM t ORDER BY pg_sleep(0.1)::text", "42501"),
    ("SELECT a FROM t GROUP BY a HAVING max(nextval('s')) > 0", "42501"),
    ("SELECT * FROM t, LATERAL (SELECT pg_sleep(1)) x", "42501"),
    ("SELECT * FROM pg_sleep(1)", "42501"),
    ("SELECT * FROM ROWS FROM (nextval('s'))", "42501"),
    ("SELECT coalesce(a, nextval('s')) FROM t", "42501"),
    ("SELECT abs(nextval('s'))", "42501"),
    ("SELECT (SELECT nextval('s'))", "42501"),
    ("SELECT EXISTS (SELECT pg_sleep(1))", "42501"),
    ("WITH c AS (SELECT nextval('s')) SELECT * FROM c", "42501"),
    ("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + nextval('s')::int FROM r WHERE n < 3) SELECT * FROM r", "42501"),
    ("SELECT 1 UNION ALL SELECT nextval('s')", "42501"),
    ("SELECT a FROM t EXCEPT SELECT pg_advisory_lock(1)::text::int", "42501"),
    ("VALUES (nextval('s'))", "42501"),
    ("SELECT CASE WHEN a > 0 THEN pg_sleep(1) END FROM t", "42501"),
    ("SELECT a FROM t WHERE a = ANY (ARRAY[nextval('s')::int])", "42501"),
    ("SELECT a FROM t LIMIT (SELECT nextval('s'))", "42501"),
    ("SELECT array_agg(nextval('s')) FROM t", "42501"),
    ("SELECT row_number() OVER (ORDER BY nextval('s')) FROM t", "42501"),
    ("SELECT * FROM t TABLESAMPLE SYSTEM (nextval('s'))", "42501"),
    ("SELECT nextval('s'::regclass)", "42501"),
    ("SELECT f_default()", "42501"),
    ("SELECT 1 === 2", "42501"),
    ("SELECT 1 OPERATOR(sqe_corpus.===) 2", "42501"),
    // names resolved the way the server resolves them
    ("SELECT pg_catalog.nextval('s')", "42501"),
    ("SELECT \"nextval\"('s')", "42501"),
    ("SELECT PG_CATALOG.\"pg_sleep\"(1)", "42501"),
    ("SELECT NEXTVAL('s')", "42501"),
    ("SELECT NextVal('s')", "42501"),
    ("SELECT pg_catalog . pg_sleep ( 1 )", "42501"),
    ("SELECT U&\"\\0070g_sleep\"(1)", "42501"),
    ("SELECT \"NEXTVAL\"('s')", "42883"),
    // --- system catalogs: 42501 unless sql_query_engine.allow_system_catalogs
    ("SELECT * FROM pg_class", "42501"),
    ("SELECT * FROM pg_catalog.pg_authid", "42501"),
    ("SELECT * FROM information_schema.tables", "42501"),
    ("SELECT usename, passwd FROM pg_shadow", "42501"),
    ("SELECT * FROM pg_settings", "42501"),
    ("SELECT * FROM pg_stat_activity", "42501"),
    ("SELECT * FROM t JOIN pg_namespace n ON true", "42501"),
    ("SELECT (SELECT count(*) FROM pg_proc)", "42501"),
    ("SELECT * FROM \"pg_catalog\".\"pg_class\"", "42501"),
    ("SELECT * FROM PG_CATALOG.PG_CLASS", "42501"),
    ("SELECT * FROM pg_db_role_setting", "42501"),
    ("SELECT * FROM pg_file_settings", "42501"),
    // --- parse and name errors keep the server's own SQLSTATE
    ("SELEC 1", "42601"),
    ("SELECT 'unterminated", "42601"),
    ("SELECT $$ unterminated", "42601"),
    ("SELECT 1 FROM", "42601"),
    ("SELECT * FROM nosuch", "42P01"),
    ("SELECT nosuch FROM t", "42703"),
    ("SELECT nosuchfn()", "42883"),
    // look-alikes and invisible characters never reach a real function
    ("SELECT \u{ff50}\u{ff47}_sleep(1)", "42883"),
    ("SELECT pg_sl\u{200b}eep(1)", "42883"),
    ("S\u{0435}LECT 1", "42601"),
    ("DELETE\u{00a0}FROM t", "42601"),
    ("SELECT 1\u{0}; DROP TABLE t", "22021"),
    // --- no false refusals: reads in many shapes pass
    ("SELECT 1 -- ; DROP TABLE t", OK),
    ("SELECT /* ; DROP TABLE t; */ 1", OK),
    ("SELECT 'a;b'", OK),
    ("SELECT E'\\'; DROP TABLE t; --'", OK),
    ("SELECT $tag$ ; DROP TABLE t; $tag$", OK),
    ("SELECT $a$ $b$ ; DROP $b$ $a$", OK),
    ("SELECT 1;", OK),
    ("TABLE t", OK),
    ("VALUES (1), (2)", OK),
    ("SELECT 1 UNION SELECT 2", OK),
    ("(SELECT a FROM t) EXCEPT (SELECT a FROM u)", OK),
    ("SELECT random(), gen_random_uuid(), clock_timestamp()", OK),
    ("SELECT lower('X'), date_trunc('month', now()), round(2.5)", OK),
    ("SELECT a, row_number() OVER (ORDER BY a) FROM t", OK),
    ("WITH x AS (SELECT a FROM t) SELECT count(*) FROM x", OK),
    ("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT * FROM r", OK),
    ("SELECT * FROM t, LATERAL generate_series(1, a) g", OK),
    ("SELECT json_agg(t) FROM t", OK),

    ("SELECT a FROM t WHERE a OPERATOR(pg_catalog.=) 1", OK),
    ("SELECT * FROM mv", OK),
    ("SELECT 'pg_class'::regclass::oid", OK),
    ("SELECT a FROM t ORDER BY a DESC NULLS LAST LIMIT 5 OFFSET 1", OK),
];

/// SQL/JSON, which the grammar has from PostgreSQL 16 (constructors, IS JSON) and 17 (JSON_VALUE,
/// JSON_QUERY, JSON_EXISTS, JSON_TABLE): new node kinds the walk must know, and new places a
/// type can hide. Only servers of 17 and later run them, so builds for 15 leave them unused.
#[allow(dead_code)]
pub const SQL_JSON_CASES: &[(&str, &str)] = &[
    (
        r#"SELECT JSON_OBJECT('a': 1), JSON_ARRAY(1, 2), '{"a": 1}' IS JSON OBJECT"#,
        OK,
    ),
    (
        r#"SELECT JSON_VALUE('{"a": 1}', '$.a' RETURNING int), JSON_QUERY('{"a": [1]}', '$.a')"#,
        OK,
    ),
    (r#"SELECT JSON_EXISTS('{"a": 1}', '$.a')"#, OK),
    (
        r#"SELECT * FROM JSON_TABLE('[{"a": 1}]', '$[*]' COLUMNS (a int PATH '$.a'))"#,
        OK,
    ),
    (r#"SELECT JSON_OBJECTAGG(a: a) FROM t"#, OK),
    (
        r#"SELECT JSON_VALUE('{"a": 1}', '$.a' RETURNING locking)"#,
        "42501",
    ),
    (
        r#"SELECT * FROM JSON_TABLE('[{"a": 1}]', '$[*]' COLUMNS (a locking PATH '$.a'))"#,
        "42501",
    ),
    (
        r#"SELECT JSON_VALUE('{"a": 1}', '$.a' RETURNING int DEFAULT volatile_fn() ON ERROR)"#,
        "42501",
    ),
    (r#"SELECT JSON_OBJECT('a': nextval('s'))"#, "42501"),
];
