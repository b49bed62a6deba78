//! Bounds a role cannot lift: the bytes of a result a backend collects, and the settings that
//! bound time, rows, model calls and tokens, which roles may lower for themselves but only a
//! superuser may raise above the server's setting.

use std::sync::{Arc, Mutex};

use sql_query_engine_e2e::cluster::OwnCluster;
use sql_query_engine_e2e::{cluster, db_error, Reply, Session};

/// A login role that may read the fixture, and a connection of it whose notices are kept.
fn role_connection(
    s: &mut Session,
    prefix: &str,
) -> (String, postgres::Client, Arc<Mutex<Vec<String>>>) {
    let (role, db) = (format!("{prefix}_{}", s.database), s.database.clone());
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT SELECT ON customers, orders TO {role};
             ALTER DATABASE {db} SET sql_query_engine.llm_url = '{}';
             ALTER DATABASE {db} SET sql_query_engine.vote = off;",
            s.llm.url()
        ))
        .unwrap();
    let notices = Arc::new(Mutex::new(Vec::new()));
    let client = cluster().connect_as_with_notices(&s.database, &role, Arc::clone(&notices));
    (role, client, notices)
}

/// The bytes a connection's own catalog cache holds (`pg_backend_memory_contexts`, which
/// `pg_read_all_stats` may read).
fn catalog_cache_bytes(c: &mut postgres::Client) -> i64 {
    c.query_one(
        "SELECT sum(total_bytes)::int8 FROM pg_backend_memory_contexts \
         WHERE name = 'CacheMemoryContext'",
        &[],
    )
    .unwrap()
    .get(0)
}

/// When the server last started: the same before and after a call means it did not restart.
fn postmaster_started(client: &mut postgres::Client) -> String {
    client
        .query_one("SELECT pg_postmaster_start_time()::text", &[])
        .unwrap()
        .get(0)
}

/// The peak resident memory of a live backend, in kB.
fn peak_kb(pid: i32) -> u64 {
    sql_query_engine_e2e::peak_kb(pid).expect("the backend is alive")
}

/// A login role of `prefix` that may create objects in the schema public, where the callers'
/// schema context reads them, and its connection.
fn creator_in_public(s: &mut Session, prefix: &str) -> (String, postgres::Client) {
    let creator = format!("{prefix}_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {creator} LOGIN; GRANT CREATE ON SCHEMA public TO {creator};"
        ))
        .unwrap();
    let client = cluster().connect_as(&s.database, &creator);
    (creator, client)
}

#[test]
fn a_result_is_cut_by_its_bytes_and_the_backend_stays_small() {
    let mut s = Session::new();
    let (_, mut role, _) = role_connection(&mut s, "greedy");
    let pid: i32 = role
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    let count = |client: &mut postgres::Client, sql: &str| -> i64 {
        client
            .query_one("SELECT count(*) FROM nl_run($1)", &[&sql])
            .unwrap()
            .get(0)
    };
    // 20 rows of 50 MB: a single row is larger than the default 16 MB, so none is kept, and
    // the backend never holds the rows (it took about 2 GB when only rows were counted). That
    // is an error, not an empty result (a repair would tell the model it found nothing).
    let huge = "SELECT repeat('x', 50000000) AS x FROM generate_series(1, 20)";
    let error = role
        .query_one("SELECT count(*) FROM nl_run($1)", &[&huge])
        .unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "54000", "{message}");
    assert!(
        message.contains("first row alone is larger than sql_query_engine.max_result_bytes"),
        "{message}"
    );
    let peak = peak_kb(pid);
    assert!(peak < 600 * 1024, "the backend grew to {peak} kB");

    // 1 MB rows: as many as fit in 16 MB.
    let megabytes = "SELECT repeat('x', 1000000) AS x FROM generate_series(1, 40)";
    let kept = count(&mut role, megabytes);
    assert!((14..=16).contains(&kept), "{kept} rows of 1 MB kept");
    // A role may lower the bound for itself.
    role.batch_execute("SET sql_query_engine.max_result_bytes = '3MB'")
        .unwrap();
    let kept = count(&mut role, megabytes);
    assert!(
        (2..=3).contains(&kept),
        "{kept} rows of 1 MB kept under 3 MB"
    );
    // The trace says which setting cut the result.
    s.llm.on(
        "many megabytes",
        vec![sql_query_engine_e2e::Reply::sql(megabytes)],
    );
    role.batch_execute("SET sql_query_engine.max_result_bytes = '2MB'")
        .unwrap();
    let trace: String = role
        .query_one("SELECT nl_trace('many megabytes')::text", &[])
        .unwrap()
        .get(0);
    let trace: serde_json::Value = serde_json::from_str(&trace).unwrap();
    assert_eq!(trace["truncated"], true, "{trace}");
    assert_eq!(
        trace["attempts"][0]["cut_by"], "max_result_bytes",
        "{trace}"
    );
}

/// Each value of a result counts as 16 bytes of `max_result_bytes` at least, each object 640
/// more and each array 128: what reads the rows (a vote, a trace, the rows returned) parses
/// them into trees, which take some 60 bytes for a one-byte `0,`, some 700 for a `{"":0},` and
/// some 200 for a `[0],`.
#[test]
fn a_result_of_many_small_values_counts_what_they_take_parsed() {
    let mut s = Session::new();
    let (_, mut role, _) = role_connection(&mut s, "tiny");
    // Two million zeros: 4 MB of text, 32 MB as values.
    let many = "SELECT ARRAY(SELECT 0::int2 FROM generate_series(1, 2000000)) AS a";
    let error = role
        .query_one("SELECT count(*) FROM nl_run($1)", &[&many])
        .unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "54000", "{message}");
    assert!(message.contains("first row alone"), "{message}");
    // Small objects count as what they take parsed too: 100,000 of them are 1.2 MB of text.
    let objects = "SELECT jsonb_agg(jsonb_build_object('', NULL)) AS a \
                   FROM generate_series(1, 100000)";
    let error = role
        .query_one("SELECT count(*) FROM nl_run($1)", &[&objects])
        .unwrap_err();
    assert_eq!(db_error(&error).0, "54000");
    // And small arrays: 120,000 of them are 0.6 MB of text.
    let arrays = "SELECT jsonb_agg(jsonb_build_array(0)) AS a FROM generate_series(1, 120000)";
    let error = role
        .query_one("SELECT count(*) FROM nl_run($1)", &[&arrays])
        .unwrap_err();
    assert_eq!(db_error(&error).0, "54000");
    // Positive control: 200,000 of them (3.2 MB as values) are kept.
    let fewer = "SELECT ARRAY(SELECT 0::int2 FROM generate_series(1, 200000)) AS a";
    let rows: i64 = role
        .query_one("SELECT count(*) FROM nl_run($1)", &[&fewer])
        .unwrap()
        .get(0);
    assert_eq!(rows, 1);
}

/// `to_jsonb` turns each numeric of an array into text and back, checking no interrupt and
/// freeing the text as it goes: 12 stored bytes can be 131,072 digits. Such a value's text is
/// measured first, so a row whose text would not fit is cut (or the memory bound stops it),
/// in seconds, not minutes of a backend deaf to cancel.
#[test]
fn numerics_whose_text_is_huge_are_measured_before_they_are_converted() {
    let mut s = Session::new();
    let (_, mut role, _) = role_connection(&mut s, "digits");
    role.batch_execute("SET sql_query_engine.max_result_bytes = '4MB'")
        .unwrap();
    let started = std::time::Instant::now();
    let huge = role.query(
        "SELECT * FROM nl_run('SELECT (SELECT array_agg(1e131071::numeric) \
         FROM generate_series(1, 300000)) AS a')",
        &[],
    );
    let took = started.elapsed();
    match &huge {
        Ok(rows) => assert!(rows.is_empty()),
        Err(e) => assert_eq!(db_error(e).0, "53200", "{e}"),
    }
    assert!(took < std::time::Duration::from_secs(20), "took {took:?}");
    // Arrays of ordinary numerics are still JSON numbers.
    let row: String = role
        .query_one(
            "SELECT r::text FROM nl_run('SELECT ARRAY[1.50, 2]::numeric[] AS a') r",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(row, r#"{"a": [1.50, 2]}"#);
}

#[test]
fn roles_may_lower_the_bounds_but_not_raise_them() {
    let mut s = Session::new();
    let (role_name, mut role, _) = role_connection(&mut s, "bounded");
    // Load the library first (with shared_preload_libraries it always is).
    role.batch_execute("SELECT nl_schema()").unwrap();
    for (setting, higher, lower) in [
        ("max_result_bytes", "'1GB'", "'1MB'"),
        ("max_rows", "100000", "10"),
        ("statement_timeout", "'1h'", "'1s'"),
        ("llm_timeout", "'1h'", "'1s'"),
        ("max_repairs", "10", "1"),
        ("answer_budget", "'1h'", "'1s'"),
        ("candidates", "16", "2"),
        ("max_tokens", "65536", "64"),
        ("sample_values", "10", "1"),
        ("prompt_budget", "1000000", "2000"),
        ("redis_timeout", "'1h'", "'100ms'"),
        ("session_ttl", "'3650d'", "'1h'"),
        ("examples", "20", "1"),
        ("session_turns", "100", "2"),
    ] {
        for statement in [
            format!("SET sql_query_engine.{setting} = {higher}"),
            format!("ALTER ROLE {role_name} SET sql_query_engine.{setting} = {higher}"),
        ] {
            let error = role.batch_execute(&statement).unwrap_err();
            let (code, message, _) = db_error(&error);
            assert_eq!(code, "42501", "{statement}: {message}");
            assert!(
                message.contains(&format!("sql_query_engine.{setting}")),
                "{message}"
            );
        }
        role.batch_execute(&format!("SET sql_query_engine.{setting} = {lower}"))
            .unwrap_or_else(|e| panic!("lowering {setting}: {e}"));
        // A superuser may raise it, for its own session.
        s.client
            .batch_execute(&format!("SET sql_query_engine.{setting} = {higher}"))
            .unwrap_or_else(|e| panic!("a superuser raising {setting}: {e}"));
    }
}

/// A role that lowers a setting from the server's value to one still above the built-in
/// default keeps its parallel queries: a parallel worker takes its leader's values as they are
/// (it resets each to the default first, and never reads the server's file).
#[test]
fn a_setting_lowered_from_the_servers_value_leaves_parallel_queries_working() {
    let server = OwnCluster::start(
        "sqe-parallel",
        &[
            "-c",
            "sql_query_engine.statement_timeout=60s",
            "-c",
            "sql_query_engine.llm_timeout=300s",
        ],
    );
    let mut admin = server.connect("postgres");
    admin
        .batch_execute(
            "CREATE EXTENSION sql_query_engine;
             CREATE ROLE lowering LOGIN;
             CREATE TABLE numbers AS SELECT g AS n FROM generate_series(1, 50000) g;
             GRANT SELECT ON numbers TO lowering;",
        )
        .unwrap();
    let version: i32 = admin
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .unwrap()
        .get(0);
    let parallel = if version >= 160000 {
        "debug_parallel_query"
    } else {
        "force_parallel_mode"
    };
    let mut role = server.connect_as("postgres", "lowering");
    role.batch_execute(&format!(
        "SELECT nl_schema();
         SET sql_query_engine.statement_timeout = '30s';
         SET sql_query_engine.llm_timeout = '200s';
         SET {parallel} = on;"
    ))
    .unwrap();
    let workers: String = role
        .query(
            "EXPLAIN (ANALYZE, COSTS OFF) SELECT count(*) FROM numbers",
            &[],
        )
        .unwrap_or_else(|e| panic!("a parallel query: {e}"))
        .iter()
        .map(|row| row.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(workers.contains("Workers Launched: 1"), "{workers}");
    let count: i64 = role
        .query_one("SELECT count(*) FROM numbers", &[])
        .unwrap()
        .get(0);
    assert_eq!(count, 50000);
    // Still bounded for the role's own calls: raising it past the server's value is refused.
    let error = role
        .batch_execute("SET sql_query_engine.statement_timeout = '2min'")
        .unwrap_err();
    assert_eq!(db_error(&error).0, "42501");
}

#[test]
fn a_stored_setting_above_the_bound_applies_up_to_it_without_a_warning_at_every_login() {
    let mut s = Session::new();
    let (role_name, _, _) = role_connection(&mut s, "stored");
    let db = s.database.clone();
    // Stored above the bounds for the database and for the role (the way a role stores its
    // own while the library is not loaded, unchecked).
    s.client
        .batch_execute(&format!(
            "ALTER DATABASE {db} SET sql_query_engine.max_repairs = 10;
             ALTER ROLE {role_name} IN DATABASE {db} SET sql_query_engine.max_rows = 100000;"
        ))
        .unwrap();
    let notices = Arc::new(Mutex::new(Vec::new()));
    let mut role = cluster().connect_as_with_notices(&db, &role_name, Arc::clone(&notices));
    role.batch_execute("SELECT nl_schema()").unwrap();
    let show = |client: &mut postgres::Client, setting: &str| -> String {
        client
            .query_one(&format!("SHOW sql_query_engine.{setting}"), &[])
            .unwrap()
            .get(0)
    };
    // The server's bounds (the defaults here), with nothing said to the role.
    assert_eq!(show(&mut role, "max_repairs"), "4");
    assert_eq!(show(&mut role, "max_rows"), "1000");
    let said = notices.lock().unwrap().join("\n");
    assert!(!said.contains("only a superuser"), "{said}");
    // A superuser logging in gets the database's value.
    let mut admin = cluster().connect(&db);
    admin.batch_execute("SELECT nl_schema()").unwrap();
    assert_eq!(show(&mut admin, "max_repairs"), "10");
}

/// A value a role sets before the library is loaded in its backend applies up to the bound
/// too, also when what loads the library is a superuser's SECURITY DEFINER function (the check
/// then runs as the superuser, and could not tell who set the value).
#[test]
fn a_value_set_before_the_library_loads_is_bounded_whoever_loads_it() {
    let mut s = Session::new();
    let (_, mut role, _) = role_connection(&mut s, "early");
    s.client
        .batch_execute(
            "CREATE FUNCTION public.load_it() RETURNS text LANGUAGE sql SECURITY DEFINER
                 SET search_path = pg_catalog AS $$ SELECT public.nl_schema() $$;",
        )
        .unwrap();
    role.batch_execute(
        "SET sql_query_engine.max_rows = 2000000000;
         SET sql_query_engine.max_result_bytes = '2000MB';
         SELECT public.load_it();",
    )
    .unwrap();
    for (setting, bound) in [("max_rows", "1000"), ("max_result_bytes", "16MB")] {
        let shown: String = role
            .query_one(&format!("SHOW sql_query_engine.{setting}"), &[])
            .unwrap()
            .get(0);
        assert_eq!(shown, bound, "{setting}");
    }
}

#[test]
fn what_another_role_writes_into_the_catalog_reaches_a_callers_backend_bounded() {
    let mut s = Session::new();
    let (victim, mut client, notices) = role_connection(&mut s, "reader");
    let (_, mut attacker) = creator_in_public(&mut s, "writer");
    attacker
        .batch_execute(&format!(
            "DO $$ BEGIN EXECUTE 'CREATE TYPE public.mood AS ENUM (' || (SELECT
                 string_agg(quote_literal('mood_' || g), ', ' ORDER BY g)
                 FROM generate_series(1, 500) g) || ')'; END $$;
             CREATE TABLE public.pairs (a int, b int, UNIQUE (a, b));
             CREATE TABLE public.notes (id int, feeling public.mood,
                 body text DEFAULT '{long}', a int, b int);
             DO $$ BEGIN FOR i IN 1..100 LOOP
                 EXECUTE format('ALTER TABLE public.notes ADD CONSTRAINT fk_%s
                                 FOREIGN KEY (a, b) REFERENCES public.pairs (a, b)', i);
             END LOOP; END $$;
             DO $$ BEGIN
                 EXECUTE format('COMMENT ON TABLE public.notes IS %L', repeat('tablenote ', 30000));
                 EXECUTE format('COMMENT ON COLUMN public.notes.body IS %L', repeat('colnote ', 30000));
             END $$;
             GRANT SELECT ON public.notes, public.pairs TO {victim};",
            long = "x".repeat(3000)
        ))
        .unwrap();
    let schema: String = client
        .query_one("SELECT nl_schema()", &[])
        .unwrap_or_else(|e| panic!("{:?}", db_error(&e)))
        .get(0);
    assert!(schema.contains("CREATE TABLE notes ("), "{schema}");
    let (table_notes, column_notes) = (
        schema.matches("tablenote").count(),
        schema.matches("colnote").count(),
    );
    assert!(
        (1..=100).contains(&table_notes) && (1..=63).contains(&column_notes),
        "comments are cut: {table_notes} and {column_notes} words of them shown"
    );
    assert!(
        schema.contains("'mood_100'") && !schema.contains("'mood_101'"),
        "at most 100 labels of an enum"
    );
    assert!(
        schema.contains("e.g. 'mood_1'") && !schema.contains("one of 'mood_1'"),
        "a cut enum is not shown as all its labels"
    );
    let keys = schema.matches("FOREIGN KEY (a, b)").count();
    assert!((1..=64).contains(&keys), "{keys} foreign keys shown");
    let said = notices.lock().unwrap().join("\n");
    assert!(
        said.contains("keys of its relations (at most 64 per relation"),
        "the caller is told that keys were left out: {said}"
    );
    assert!(
        !schema.contains("xxxxxxxxxx"),
        "a default longer than a line is not shown"
    );
}

/// Counts bound how many names and comments another role's objects bring into a caller's
/// backend, and bytes what they weigh: a comment of control characters is six times its length
/// as JSON, and thousands of them were all read, copied and parsed.
#[test]
fn what_another_roles_catalog_entries_weigh_is_bounded_too() {
    let mut s = Session::new();
    let (victim, mut client, notices) = role_connection(&mut s, "weigher");
    let (_, mut attacker) = creator_in_public(&mut s, "heavy");
    attacker
        .batch_execute(&format!(
            "DO $$ BEGIN FOR i IN 1..3000 LOOP
                 EXECUTE format('CREATE TABLE public.heavy_%s (a int)', i);
                 EXECUTE format('COMMENT ON TABLE public.heavy_%s IS %L', i, repeat(chr(1), 1000));
                 EXECUTE format('GRANT SELECT ON public.heavy_%s TO {victim}', i);
             END LOOP; END $$;"
        ))
        .unwrap();
    let schema: String = client
        .query_one("SELECT nl_schema()", &[])
        .unwrap_or_else(|e| panic!("{:?}", db_error(&e)))
        .get(0);
    let shown = schema.matches("CREATE TABLE heavy_").count();
    assert!(
        (1..3000).contains(&shown),
        "{shown} of the 3000 heavy tables read"
    );
    let said = notices.lock().unwrap().join("\n");
    assert!(
        said.contains("16 MB of names and comments"),
        "the caller is told that relations were left out: {said}"
    );
}

#[test]
fn a_session_holding_an_advisory_lock_very_many_times_is_told_so() {
    let mut s = Session::new();
    let (_, mut client, _) = role_connection(&mut s, "holder");
    s.llm.on(
        "How many customers are there?",
        vec![
            Reply::sql("SELECT count(*) AS n FROM customers"),
            Reply::sql("SELECT count(*) AS n FROM customers"),
        ],
    );
    // Every hold is counted, before and after each query, with no pause for a cancel.
    client
        .batch_execute("SELECT count(pg_advisory_lock(5)) FROM generate_series(1, 10001)")
        .unwrap();
    let error = client
        .query("SELECT nl_query('How many customers are there?')", &[])
        .unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "54000", "{message}");
    assert!(message.contains("advisory lock"), "{message}");
    // The session keeps every hold it had: 10,001 give-backs succeed, and no more.
    let given_back: i64 = client
        .query_one(
            "SELECT count(*) FILTER (WHERE pg_advisory_unlock(5)) FROM generate_series(1, 10002)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(given_back, 10001);
    let rows = client
        .query("SELECT nl_query('How many customers are there?')", &[])
        .unwrap_or_else(|e| panic!("{:?}", db_error(&e)));
    assert_eq!(rows.len(), 1);
    // The bound is on all of them: many locks held many times each, or very many locks.
    for (holds, said) in [
        (
            "SELECT count(pg_advisory_lock(k)) FROM generate_series(1, 11) k, \
             generate_series(1, 1000)",
            "more than 10000 times",
        ),
        (
            "SELECT count(pg_advisory_lock(k)) FROM generate_series(1, 1001) k",
            "more than 1000 advisory locks",
        ),
    ] {
        client.batch_execute(holds).unwrap();
        let error = client
            .query("SELECT nl_check('SELECT 1')", &[])
            .unwrap_err();
        let (code, message, _) = db_error(&error);
        assert_eq!(code, "54000", "{message}");
        assert!(message.contains(said), "{message}");
        client
            .batch_execute("SELECT pg_advisory_unlock_all()")
            .unwrap();
    }
}

#[test]
fn a_redis_that_floods_its_replies_costs_a_backend_nothing() {
    let mut s = Session::new();
    let (name, first, _) = role_connection(&mut s, "flooded");
    drop(first);
    let port = sql_query_engine_e2e::redis::flooding_server(1_500_000_000);
    s.client
        .batch_execute(&format!(
            "ALTER DATABASE {} SET sql_query_engine.redis_url = 'redis://127.0.0.1:{port}/0'",
            s.database
        ))
        .unwrap();
    let mut role = cluster().connect_as(&s.database, &name);
    let pid: i32 = role
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    s.llm.on(
        "How many customers are there?",
        vec![Reply::sql("SELECT count(*) AS n FROM customers")],
    );
    let trace: String = role
        .query_one(
            "SELECT nl_trace('How many customers are there?', 'talk')::text",
            &[],
        )
        .unwrap_or_else(|e| panic!("{:?}", db_error(&e)))
        .get(0);
    let trace: serde_json::Value = serde_json::from_str(&trace).unwrap();
    assert_eq!(trace["row_count"], 1, "{trace}");
    // What the server goes on sending is read by no one.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let peak = peak_kb(pid);
    assert!(peak < 400 * 1024, "the backend grew to {peak} kB");
}

#[test]
fn a_query_that_aggregates_without_bound_or_spills_without_end_is_stopped() {
    let mut s = Session::new();
    let (_, mut role, _) = role_connection(&mut s, "hoarder");
    let pid: i32 = role
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    let run = |client: &mut postgres::Client, sql: &str| {
        client.query("SELECT * FROM nl_run($1)", &[&sql])
    };
    // An aggregate PostgreSQL does not bound by work_mem: 3 GB of strings, cancelled once the
    // backend has grown by the ceiling (lowered here for the test).
    role.batch_execute("SET sql_query_engine.max_query_memory = '200MB'")
        .unwrap();
    let hoard = "SELECT cardinality(array_agg(repeat('x', 1000000))) AS n \
                 FROM generate_series(1, 3000)";
    let error = run(&mut role, hoard).expect_err("the aggregate outgrows the ceiling");
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "53200", "{message}");
    assert!(message.contains("max_query_memory (200 MB)"), "{message}");
    let peak = peak_kb(pid);
    assert!(peak < 800 * 1024, "the backend grew to {peak} kB");
    // The same connection goes on, and a query within the ceiling runs.
    let rows = run(
        &mut role,
        "SELECT cardinality(array_agg(repeat('x', 1000))) AS n FROM generate_series(1, 3000)",
    )
    .unwrap();
    assert_eq!(rows.len(), 1);
    // A role cannot raise the ceiling above the server's.
    let error = role
        .batch_execute("SET sql_query_engine.max_query_memory = '4GB'")
        .unwrap_err();
    assert_eq!(db_error(&error).0, "42501");

    // A sort that spills: its temporary files stop at the ceiling.
    role.batch_execute("SET sql_query_engine.max_query_temp_files = '1MB'")
        .unwrap();
    let spill = "SELECT count(*) AS n FROM (SELECT md5(g::text) AS m \
                 FROM generate_series(1, 300000) g ORDER BY 1) s";
    let error = run(&mut role, spill).expect_err("the sort outgrows its temporary files");
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "53400", "{message}");
    assert!(
        message.contains("temp_file_limit") && message.contains("(1024kB)"),
        "{message}"
    );
    role.batch_execute("RESET sql_query_engine.max_query_temp_files")
        .unwrap();
    assert_eq!(run(&mut role, spill).unwrap().len(), 1);
}

#[test]
fn what_a_failed_query_says_is_kept_short() {
    let mut s = Session::new();
    let (_, mut role, _) = role_connection(&mut s, "talker");
    // The value is in the message ("invalid input syntax for type integer: ..."): 1 MB of it
    // would go to the model, the trace and the history.
    let error = role
        .query(
            "SELECT * FROM nl_run($1)",
            &[&"SELECT repeat('x', 1000000)::int AS n"],
        )
        .unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "22P02", "{}", &message[..100.min(message.len())]);
    assert!(
        message.len() < 2100 && message.ends_with(" ..."),
        "{} characters",
        message.len()
    );
}

#[test]
fn a_value_nested_too_deeply_for_the_rows_reader_is_an_error_of_the_query() {
    let mut s = Session::new();
    let (_, mut role, _) = role_connection(&mut s, "nester");
    let deep = "SELECT (repeat('[', 150) || repeat(']', 150))::jsonb AS j";
    let error = role
        .query("SELECT * FROM nl_run($1)", &[&deep])
        .unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "54001", "{message}");
    assert!(message.contains("nested deeper than"), "{message}");
    // Within the bound, the value comes back whole.
    let shallow = "SELECT (repeat('[', 100) || repeat(']', 100))::jsonb AS j";
    let rows = role.query("SELECT * FROM nl_run($1)", &[&shallow]).unwrap();
    assert_eq!(rows.len(), 1);
}

/// A column that many relations have is said of the first few in a repair's hint, each with
/// how it joins (a search through the keys for each), and the hint says how many have it.
#[test]
fn a_missing_column_that_many_relations_have_is_said_of_the_first_few() {
    let mut s = Session::new();
    let tables: String = (0..20)
        .map(|i| format!("CREATE TABLE wide_{i:02} (id int, foo int);"))
        .collect();
    s.client.batch_execute(&tables).unwrap();
    s.llm.on(
        "the foos of the orders",
        vec![
            Reply::sql("SELECT o.foo FROM orders o"),
            Reply::sql("SELECT count(*) AS n FROM orders"),
        ],
    );
    let trace = s.trace("the foos of the orders").unwrap();
    assert_eq!(trace["status"], "ok", "{trace}");
    let repair = s.llm.requests().last().unwrap().last_message();
    assert!(
        repair.contains("20 relations have a column foo; the first 16:"),
        "{repair}"
    );
    assert_eq!(repair.matches("foo is a column of").count(), 16, "{repair}");
}

/// Row types that share their parts (30 columns of a row type of 30 columns ..., 5 deep, any
/// role's temporary tables): checking the types a literal may become and collecting a value of
/// them follow each type once, so the calls end at once; a walk that followed every path (30^5
/// of them, 60^8 as easily made) ran for minutes, deaf to a cancel or a statement timeout.
#[test]
fn types_that_share_their_parts_are_followed_once_each() {
    let mut s = Session::new();
    let (_, mut client, _) = role_connection(&mut s, "nester");
    client
        .batch_execute(
            "CREATE TEMP TABLE l6 (a int);
             DO $$ BEGIN FOR i IN REVERSE 5..1 LOOP
                 EXECUTE format('CREATE TEMP TABLE l%s (%s)', i, (SELECT
                     string_agg(format('c%s l%s', j, i + 1), ', ') FROM generate_series(1, 30) j));
             END LOOP; END $$;
             SET statement_timeout = '5s';",
        )
        .unwrap();
    client
        .batch_execute("SELECT nl_check('SELECT ''x'' AS x FROM l1')")
        .unwrap_or_else(|e| panic!("{:?}", db_error(&e)));
    let rows = client
        .query("SELECT * FROM nl_run('SELECT NULL::l1 AS nested')", &[])
        .unwrap_or_else(|e| panic!("{:?}", db_error(&e)));
    assert_eq!(rows.len(), 1);
}

/// Code that checks for no interrupt while it allocates (an output function printing a huge
/// array: numbers of 131,072 digits stored in 8 bytes each) is stopped by the attempt's hard
/// memory limit, as an ERROR the call reports (53200), instead of growing the backend by
/// gigabytes past `max_query_memory` until the kernel killed the server; the backend goes on.
#[test]
fn an_allocation_past_the_memory_bound_fails_where_no_interrupt_is_checked() {
    let mut s = Session::new();
    let (_, mut role, _) = role_connection(&mut s, "printer");
    let pid: i32 = role
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    role.batch_execute("SET sql_query_engine.max_query_memory = '64MB'")
        .unwrap();
    for sql in [
        "SELECT (SELECT array_agg(1e131071::numeric) FROM generate_series(1, 8000))::text AS t",
        "SELECT (SELECT array_agg(1e131071::numeric) FROM generate_series(1, 8000)) AS a",
    ] {
        let error = role.query("SELECT * FROM nl_run($1)", &[&sql]).unwrap_err();
        let (code, message, _) = db_error(&error);
        assert!(
            code == "53200" || code == "54000",
            "{sql}: {code} {message}"
        );
        let peak = peak_kb(pid);
        assert!(peak < 700 * 1024, "{sql}: the backend grew to {peak} kB");
    }
    // SQL longer than 100,000 characters is refused before anything reads it.
    for call in [
        "SELECT nl_check(repeat(' ', 300000) || 'SELECT 1')",
        "SELECT count(*) FROM nl_run(repeat(' ', 300000) || 'SELECT 1')",
    ] {
        let error = role.batch_execute(call).unwrap_err();
        assert_eq!(db_error(&error).0, "22023", "{call}");
    }
    let n: i64 = role
        .query_one("SELECT count(*) FROM nl_run('SELECT 1 AS one')", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
}

/// The hard memory limit, met where the memory a query took stays after its rollback (the
/// catalog cache's entries for relations that do not exist, one per relation name written),
/// is an ERROR of the call: the error's own handling needs memory too, and failed again and
/// again until PostgreSQL PANICked and restarted the whole server, every connection of every
/// role with it.
#[test]
fn meeting_the_hard_memory_limit_in_memory_no_rollback_frees_is_an_error_not_a_server_restart() {
    let mut s = Session::new();
    let (_, mut role, _) = role_connection(&mut s, "misses");
    let before = postmaster_started(&mut s.client);
    // Each name written leaves an entry in the catalog cache, which no rollback frees, until
    // they meet the limit (64 MB here, the least a role may set but four times: under load,
    // 256 MB took longer than the statement timeout). (An array of them written out at once
    // is refused: it would check no cancel.)
    s.llm.on(
        "Name the missing relations",
        vec![Reply::sql(
            "SELECT count(g::oid::regclass::text) AS missing \
             FROM generate_series(100000000, 110000000) g",
        )],
    );
    role.batch_execute(
        "SET sql_query_engine.max_repairs = 0; SET sql_query_engine.max_query_memory = '64MB'",
    )
    .unwrap();
    // Under load (CI runs four such tests at once) the call may also pass its deadline, or
    // meet the limit again past the reserve it is raised by: then the backend ends, as
    // `pg_terminate_backend` would end it (57P01), which is that backend alone, not the server.
    match role.query("SELECT * FROM nl_query('Name the missing relations')", &[]) {
        Err(error) => {
            let (code, message, _) = db_error(&error);
            assert!(
                ["53200", "54000", "57P01"].contains(&code.as_str()),
                "{code}: {message}"
            );
        }
        Ok(rows) => panic!("{} rows: the result was not cut", rows.len()),
    }
    let mut again = cluster().connect(&s.database);
    assert_eq!(
        postmaster_started(&mut again),
        before,
        "the server restarted"
    );
}

/// Only an out-of-memory error at the hard limit puts it back for the error's handling: a
/// view's code that reports 53200 itself (a WARNING) and then grows where no interrupt is
/// checked still meets the limit.
#[test]
fn code_that_reports_out_of_memory_itself_does_not_lift_the_hard_limit() {
    let mut s = Session::new();
    let (role_name, mut role, _) = role_connection(&mut s, "lifter");
    s.client
        .batch_execute(&format!(
            "CREATE FUNCTION public.lift_then_print() RETURNS text LANGUAGE plpgsql AS $$
             BEGIN
                 RAISE WARNING 'not really' USING ERRCODE = '53200';
                 RETURN (SELECT array_agg(1e131071::numeric) FROM generate_series(1, 8000))::text;
             END $$;
             CREATE VIEW public.printed AS SELECT public.lift_then_print() AS t;
             GRANT SELECT ON public.printed TO {role_name};"
        ))
        .unwrap();
    let pid: i32 = role
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    role.batch_execute("SET sql_query_engine.max_query_memory = '64MB'")
        .unwrap();
    let error = role
        .query(
            "SELECT * FROM nl_run('SELECT length(t) AS n FROM printed')",
            &[],
        )
        .unwrap_err();
    let (code, message, _) = db_error(&error);
    assert!(code == "53200" || code == "54000", "{code} {message}");
    let peak = peak_kb(pid);
    assert!(peak < 700 * 1024, "the backend grew to {peak} kB");
}

/// Code that catches the out-of-memory error (and the cancels) and grows on meets the hard
/// limit again: it was put back by a fixed reserve for the error's handling, and lowered again,
/// so the backend stays under it however long the code goes on (it ends when terminated: code
/// that catches every cancel is not ended by one), instead of growing until the kernel killed
/// the server.
#[test]
fn code_that_catches_out_of_memory_and_grows_on_stays_under_the_hard_limit() {
    let mut s = Session::new();
    let (role_name, mut role, _) = role_connection(&mut s, "hog");
    s.client
        .batch_execute(&format!(
            "CREATE FUNCTION public.hog() RETURNS int LANGUAGE plpgsql AS $$
             DECLARE keep text[] := '{{}}'; mb text := repeat('x', 1 << 20); n int := 64;
             BEGIN
                 LOOP
                     BEGIN
                         keep := array_append(keep, repeat(mb, n));
                         n := 64;
                     EXCEPTION WHEN out_of_memory OR query_canceled THEN
                         n := 1;
                     END;
                 END LOOP;
             END $$;
             CREATE VIEW public.hogged AS SELECT public.hog() AS n;
             GRANT SELECT ON public.hogged TO {role_name};"
        ))
        .unwrap();
    let pid: i32 = role
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    role.batch_execute("SET sql_query_engine.max_query_memory = '64MB'")
        .unwrap();
    let hogging = std::thread::spawn(move || {
        role.query("SELECT * FROM nl_run('SELECT n FROM hogged')", &[])
            .map(|_| ())
    });
    // Six seconds of it (or until an error of its own code ends it), its peak read as it runs.
    let (started, mut peak) = (std::time::Instant::now(), 0);
    while started.elapsed() < std::time::Duration::from_secs(6) {
        match sql_query_engine_e2e::peak_kb(pid) {
            Some(kb) => peak = kb,
            None => break,
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    s.client
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .unwrap();
    assert!(
        hogging.join().unwrap().is_err(),
        "the hog's query ended without an error"
    );
    assert!(peak > 0, "the backend was never seen");
    assert!(peak < 700 * 1024, "the backend grew to {peak} kB");
}

/// Another role's view whose function catches every cancel, running twenty seconds, readable
/// by `role`.
fn stubborn_view(role: &str) -> String {
    format!(
        "CREATE FUNCTION public.stubborn() RETURNS int LANGUAGE plpgsql AS $$
         BEGIN
             FOR i IN 1..40 LOOP
                 BEGIN PERFORM pg_sleep(0.5); EXCEPTION WHEN query_canceled THEN NULL; END;
             END LOOP;
             RETURN 1;
         END $$;
         CREATE VIEW public.stubborn_view AS SELECT public.stubborn() AS n;
         GRANT SELECT ON public.stubborn_view TO {role};"
    )
}

/// A statement timeout fires once, and code of the query may catch its cancel and run on
/// (another role's view, `EXCEPTION WHEN query_canceled`), holding the backend, its snapshot and
/// its locks beyond the deadline and any cancel: past the deadline each cancel the query takes
/// is asked again, and a query that takes ten ends with its connection.
#[test]
fn a_query_that_catches_every_cancel_past_its_deadline_ends_with_its_connection() {
    let mut s = Session::new();
    let (role_name, mut role, _) = role_connection(&mut s, "stubborn");
    s.client.batch_execute(&stubborn_view(&role_name)).unwrap();
    let pid: i32 = role
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    role.batch_execute("SET sql_query_engine.statement_timeout = '1s'")
        .unwrap();
    // Without the watch, the loop's twenty seconds end with its row. With it, the backend
    // ends (FATAL 57P01, which reaches the client only when no query's messages are held back
    // from it, as they are while a query of the call runs: the connection closes).
    let error = role
        .query("SELECT * FROM nl_run('SELECT n FROM stubborn_view')", &[])
        .unwrap_err();
    assert!(
        error.is_closed() || error.code().is_some_and(|c| c.code() == "57P01"),
        "{error}"
    );
    let alive = |s: &mut Session| -> i64 {
        s.client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .unwrap()
            .get(0)
    };
    let waiting = std::time::Instant::now();
    while alive(&mut s) > 0 && waiting.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(alive(&mut s), 0, "the backend still runs");
    if let Some(mut log) = cluster().server_log() {
        let why = "cancels past its deadline";
        let waiting = std::time::Instant::now();
        while !log.contains(why) && waiting.elapsed() < std::time::Duration::from_secs(30) {
            std::thread::sleep(std::time::Duration::from_millis(200));
            log = cluster().server_log().unwrap_or_default();
        }
        assert!(log.contains(why), "the server log does not say why");
    }
    // A query that takes the timeout's cancel once to clean up, and ends at the next, is an
    // error of the call as any timeout is, on a connection that lives on.
    let mut polite = cluster().connect_as(&s.database, &role_name);
    s.client
        .batch_execute(
            "CREATE FUNCTION public.polite() RETURNS int LANGUAGE plpgsql AS $$
             BEGIN
                 BEGIN PERFORM pg_sleep(30); EXCEPTION WHEN query_canceled THEN NULL; END;
                 PERFORM pg_sleep(30);
                 RETURN 1;
             END $$;
             CREATE VIEW public.polite_view AS SELECT public.polite() AS n;",
        )
        .unwrap();
    s.client
        .batch_execute(&format!(
            "GRANT SELECT ON public.polite_view TO {role_name}"
        ))
        .unwrap();
    polite
        .batch_execute("SET sql_query_engine.statement_timeout = '1s'")
        .unwrap();
    let error = polite
        .query("SELECT * FROM nl_run('SELECT n FROM polite_view')", &[])
        .unwrap_err();
    assert_eq!(db_error(&error).0, "57014", "{error}");
    polite.batch_execute("SELECT 1").unwrap();
}

/// Where the server cannot read `/proc` (a container that does not mount it), the memory
/// watch has no ceiling, but its tick still keeps the attempt's deadline: a query of another
/// role's view that catches every cancel still ends with its connection.
#[test]
fn without_proc_a_query_that_catches_every_cancel_still_ends_with_its_connection() {
    let server = OwnCluster::start("sqe-noproc", &[]);
    server.restart_without_proc();
    let mut admin = server.connect("postgres");
    let hidden = admin
        .query("SELECT pg_read_file('/proc/self/statm')", &[])
        .unwrap_err();
    assert_eq!(
        db_error(&hidden).0,
        "58P01",
        "the server reads /proc: {hidden}"
    );
    admin
        .batch_execute(&format!(
            "CREATE EXTENSION sql_query_engine; CREATE ROLE stubborn LOGIN; {}",
            stubborn_view("stubborn")
        ))
        .unwrap();
    let mut role = server.connect_as("postgres", "stubborn");
    role.batch_execute("SET sql_query_engine.statement_timeout = '1s'")
        .unwrap();
    // Without the deadline's tick, the loop's twenty seconds end with its row.
    let started = std::time::Instant::now();
    let error = role
        .query("SELECT * FROM nl_run('SELECT n FROM stubborn_view')", &[])
        .unwrap_err();
    assert!(
        error.is_closed() || error.code().is_some_and(|c| c.code() == "57P01"),
        "{error}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "ended after {:?}",
        started.elapsed()
    );
}

/// The caller's own `statement_timeout`, sooner than the attempt's, that fires during the
/// attempt and whose cancel the query's code takes (running on to an answer) still ends the
/// call: the rest of it (here a repair the model is slow to give) does not run past it.
#[test]
fn the_callers_statement_timeout_taken_by_a_querys_code_still_ends_the_call() {
    let mut s = Session::new();
    let (role_name, mut role, _) = role_connection(&mut s, "callerdeadline");
    s.client
        .batch_execute(&format!(
            "CREATE FUNCTION public.takes_one_cancel() RETURNS int LANGUAGE plpgsql AS $$
             BEGIN
                 BEGIN PERFORM pg_sleep(30); EXCEPTION WHEN query_canceled THEN NULL; END;
                 RETURN 1;
             END $$;
             CREATE VIEW public.one_cancel_view AS SELECT public.takes_one_cancel() AS n;
             CREATE FUNCTION public.takes_none() RETURNS int LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_sleep(30); RETURN 1; END $$;
             CREATE VIEW public.slow_view AS SELECT public.takes_none() AS n;
             GRANT SELECT ON public.one_cancel_view, public.slow_view TO {role_name};"
        ))
        .unwrap();
    s.llm.on(
        "anything past its time",
        vec![
            Reply::sql("SELECT n FROM one_cancel_view WHERE n = 0"),
            Reply::Slow(
                std::time::Duration::from_secs(20),
                Box::new(Reply::sql("SELECT 1 AS n")),
            ),
        ],
    );
    role.batch_execute("SET statement_timeout = '1s'").unwrap();
    // Without the caller's deadline armed again, the repair's answer after 20 s.
    let error = role
        .query("SELECT * FROM nl_query('anything past its time')", &[])
        .unwrap_err();
    assert_eq!(db_error(&error).0, "57014", "{error}");
    // A call the caller's timeout ends, its error caught by the caller's code, leaves no
    // cancel behind for the session's next statement.
    s.llm
        .on("slow to read", vec![Reply::sql("SELECT n FROM slow_view")]);
    role.batch_execute(
        "DO $$ BEGIN PERFORM nl_query('slow to read');
                 EXCEPTION WHEN query_canceled THEN NULL; END $$",
    )
    .unwrap();
    role.batch_execute("SELECT 1").unwrap();
}

/// Code that keeps a cancel of its own pending (`pg_cancel_backend(pg_backend_pid())` before a
/// computation that checks for no interrupt, in a loop that catches each) never lets the watch
/// see one taken: a query still running 10 s past its deadline ends with its connection,
/// whatever the cancel flag says.
#[test]
fn a_query_that_keeps_its_own_cancel_pending_ends_with_its_connection() {
    let mut s = Session::new();
    let (role_name, mut role, _) = role_connection(&mut s, "selfcancel");
    s.client
        .batch_execute(&format!(
            "CREATE FUNCTION public.self_cancelling() RETURNS int LANGUAGE plpgsql AS $$
             DECLARE big bytea := convert_to(repeat('x', 50000000), 'UTF8'); ok boolean;
             BEGIN
                 FOR i IN 1..400 LOOP
                     BEGIN
                         ok := pg_cancel_backend(pg_backend_pid())
                               AND length(sha256(big)) > 0 AND length(sha256(big)) > 0;
                         PERFORM pg_sleep(0);
                     EXCEPTION WHEN query_canceled THEN NULL;
                     END;
                 END LOOP;
                 RETURN 1;
             END $$;
             CREATE VIEW public.self_cancelling_view AS SELECT public.self_cancelling() AS n;
             GRANT SELECT ON public.self_cancelling_view TO {role_name};"
        ))
        .unwrap();
    role.batch_execute("SET sql_query_engine.statement_timeout = '1s'")
        .unwrap();
    // Without the time it is given past the deadline, the loop's half a minute or so ends
    // with its row.
    let error = role
        .query(
            "SELECT * FROM nl_run('SELECT n FROM self_cancelling_view')",
            &[],
        )
        .unwrap_err();
    assert!(
        error.is_closed() || error.code().is_some_and(|c| c.code() == "57P01"),
        "{error}"
    );
}

/// What an attempt leaves behind in PostgreSQL's caches outlives it (24 kB for each new time
/// zone a query names, kept as long as the backend): each attempt may add at most
/// `max_query_memory` less what earlier ones left, and once they left that much the backend
/// says so and ends after its transaction, so that whoever asks next gets a new one. Before,
/// each attempt could leave another `max_query_memory` behind, until the kernel's
/// out-of-memory killer took the server down.
#[test]
fn memory_that_attempts_leave_in_caches_ends_the_connection_once_it_reaches_the_bound() {
    let mut s = Session::new();
    let (role_name, mut role, notices) = role_connection(&mut s, "zones");
    let pid: i32 = role
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    role.batch_execute("SET sql_query_engine.max_query_memory = '64MB'")
        .unwrap();
    role.query("SELECT * FROM nl_run('SELECT 1 AS one')", &[])
        .unwrap();
    let zones = |round: i32| {
        format!(
            "SELECT count(timezone('<Z{round}x' || i || '>0', now())) AS n \
             FROM generate_series(1, 200000) i"
        )
    };
    let mut ended = None;
    for round in 0..8 {
        match role.query("SELECT * FROM nl_run($1)", &[&zones(round)]) {
            Err(e) if e.code().is_some_and(|c| c.code() == "53200") => continue,
            Err(e) => {
                ended = Some((round, e.to_string()));
                break;
            }
            Ok(_) => panic!("round {round}: the flood of time zones passed"),
        }
    }
    let heard = notices.lock().unwrap().clone();
    assert!(
        heard
            .iter()
            .any(|n| n.contains("the connection ends after this transaction")),
        "{heard:?}"
    );
    assert!(ended.is_some(), "the connection went on: {heard:?}");
    // The backend is gone, and its memory with it; a new connection starts afresh.
    let mut admin = cluster().connect(&s.database);
    let gone = (0..50).any(|_| {
        let left: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .unwrap()
            .get(0);
        left == 0 || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            false
        }
    });
    assert!(gone, "backend {pid} still runs ({ended:?})");
    let mut fresh = cluster().connect_as(&s.database, &role_name);
    let n: i64 = fresh
        .query_one("SELECT count(*) FROM nl_run('SELECT 1 AS one')", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
}

/// What a caller passes is measured before the extension copies or parses it: huge arguments
/// built on the server (nothing large crosses the network) are refused, and the backend stays
/// small. A question of parameter marks once cost sixteen times its size in Rust, and a failed
/// Rust allocation aborts the backend (PostgreSQL then restarts the server).
#[test]
fn huge_arguments_are_refused_before_they_are_copied_or_parsed() {
    let mut s = Session::new();
    let (_, mut role, _) = role_connection(&mut s, "huge");
    let pid: i32 = role
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    for call in [
        // 100 MB of parameter marks.
        "SELECT nl_example_add(repeat('{}', 50000000), 'SELECT 1')",
        // A session name of 100 MB of control characters (the audit line escapes each).
        "SELECT count(*) FROM nl_query('how many customers', repeat(chr(1), 100000000))",
        // Turns with more values than a thousand turns have.
        "SELECT nl_ask('how many customers', turns => (SELECT jsonb_agg(jsonb_build_object(
             'question', 'q', 'n', i)) FROM generate_series(1, 20000) i))",
        // 8,000 numbers of 131,072 digits each, 128 kB stored: a gigabyte of text printed.
        "SELECT nl_ask('how many customers', turns => (SELECT jsonb_agg(1e131071::numeric)
             FROM generate_series(1, 8000)))",
        "SELECT nl_history_add(jsonb_build_object('question', 'how many customers',
             'status', 'ok', 'attempts', (SELECT jsonb_agg(1e131071::numeric)
             FROM generate_series(1, 8000))))",
    ] {
        let error = role.batch_execute(call).unwrap_err();
        let (code, message, _) = db_error(&error);
        assert_eq!(code, "22023", "{call}: {message}");
    }
    let peak = peak_kb(pid);
    assert!(peak < 600 * 1024, "the backend grew to {peak} kB");

    // The SQL of a history row the role wrote itself is held to the same bound when feedback
    // would run it.
    let id: i64 = role
        .query_one(
            "INSERT INTO nl_history (function, question, sql, status, attempts, ms, llm_calls,
                 prompt_tokens, completion_tokens)
             VALUES ('nl_ask', 'how many customers', repeat(' ', 300000) || 'SELECT 1', 'ok',
                     '[]', 0, 0, 0, 0)
             RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    let error = role
        .query_one("SELECT nl_feedback($1, true)", &[&id])
        .unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "22023", "{message}");
    assert!(message.contains("100000 characters"), "{message}");
    // An answer recorded from another server keeps its rows out, unread: only the rest counts.
    let recorded: Option<i64> = role
        .query_one(
            "SELECT nl_history_add(jsonb_build_object('question', 'how many customers',
                 'status', 'ok', 'attempts', '[]'::jsonb,
                 'rows', (SELECT jsonb_agg(i) FROM generate_series(1, 300000) i)))",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(recorded.is_some());
    // An answer that is no object is said to be none.
    let error = role
        .query_one("SELECT nl_history_add('[1, 2]'::jsonb)", &[])
        .unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "22023", "{message}");
    assert!(message.contains("not a JSON object"), "{message}");
    // Its session's name is held to a session name's bound, as everywhere.
    let error = role
        .query_one(
            "SELECT nl_history_add('{\"question\": \"q\", \"status\": \"ok\"}'::jsonb, \
             'nl_query', repeat('s', 100000))",
            &[],
        )
        .unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "22023", "{message}");
    assert!(message.contains("session name"), "{message}");
}

/// A cursor's rows that meet `temp_file_limit` are an ERROR of the call (53400), and the
/// backend lives on: ending the attempt's store writes out its last buffer, which met the
/// limit again while the error unwound, and that error in a destructor aborted the backend and
/// restarted the whole server, every connection of every role with it.
#[test]
fn a_cursor_that_meets_temp_file_limit_is_an_error_not_a_server_restart() {
    let mut s = Session::new();
    let (name, _, _) = role_connection(&mut s, "spills");
    let before = postmaster_started(&mut s.client);
    s.client
        .batch_execute(&format!("ALTER ROLE {name} SET temp_file_limit = '256kB'"))
        .unwrap();
    let mut role = cluster().connect_as(&s.database, &name);
    s.llm.on(
        "a lot of filler",
        vec![Reply::sql(
            // The series in the select list: no store of its own, whose file would be
            // deleted by the rollback before the cursor's store is ended.
            "SELECT repeat('x', 1000) AS filler, generate_series(1, 2000) AS n",
        )],
    );
    // The schema context is read first, with the default work_mem (its sorts would spill at
    // 64 kB); the cursor's store then keeps 64 kB in memory and the rest in a file.
    role.batch_execute(
        "SELECT nl_schema(); SET work_mem = '64kB'; SET sql_query_engine.max_repairs = 0",
    )
    .unwrap();
    let error = role
        .batch_execute("BEGIN; SELECT nl_cursor('a lot of filler', 'filler_c')")
        .unwrap_err();
    assert_eq!(db_error(&error).0, "53400", "{error}");
    role.batch_execute("ROLLBACK").unwrap();
    assert_eq!(
        postmaster_started(&mut s.client),
        before,
        "the server restarted"
    );
    let n: i64 = role
        .query_one("SELECT count(*) FROM nl_run('SELECT 1 AS one')", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
}

/// An alternative of a vote that fails fails alone when its error is the query's: one a view's
/// code raised (PL/pgSQL `RAISE ... USING ERRCODE 'XX000'`, another role's to choose), or the
/// attempt's own temporary-file bound (53400). The first query's answer, which had rows,
/// stands; before, each of these ended the whole call with that error. When PostgreSQL itself
/// fails under an alternative (an internal error of its C code: a sequence function given a
/// relation that does not exist, in a view; an invalid `xpath` expression was one up to
/// PostgreSQL 17), the vote stops there and the call keeps its answer with a WARNING
/// (before, that error ended the call too). (A cancel still ends it: code the query runs can
/// cancel its own query anyway.)
#[test]
fn a_failing_alternative_never_ends_a_call_that_has_an_answer() {
    let mut s = Session::new();
    let (name, mut role, notices) = role_connection(&mut s, "alts");
    s.client
        .batch_execute(&format!(
            "CREATE FUNCTION boom(code text) RETURNS int LANGUAGE plpgsql AS
               $$ BEGIN RAISE EXCEPTION 'boom' USING ERRCODE = code; END $$;
             CREATE VIEW internal_boom AS SELECT boom('XX000') AS n;
             CREATE VIEW c_boom AS SELECT currval(0::oid::regclass) AS n;
             GRANT SELECT ON internal_boom, c_boom TO {name};"
        ))
        .unwrap();
    role.batch_execute(
        "SET sql_query_engine.vote = always; SET sql_query_engine.candidates = 4;
         SET sql_query_engine.max_query_temp_files = '1MB'",
    )
    .unwrap();
    let choice = |sql: &str| serde_json::json!({ "sql": sql }).to_string();
    let counted = "SELECT count(*) AS n FROM customers";
    for (i, failing) in [
        "SELECT n FROM internal_boom",
        "SELECT count(*) AS n FROM (SELECT md5(g::text) FROM generate_series(1, 300000) g \
         ORDER BY 1) s",
        "SELECT n FROM c_boom",
    ]
    .iter()
    .enumerate()
    {
        notices.lock().unwrap().clear();
        let question = format!("how many customers, take {i}");
        s.llm.on(
            &question,
            vec![
                Reply::sql(counted),
                Reply::Choices(vec![
                    choice(failing),
                    choice(counted),
                    choice(counted),
                    choice(counted),
                ]),
            ],
        );
        let answer: String = role
            .query_one("SELECT nl_ask($1)::text", &[&question])
            .unwrap_or_else(|e| panic!("{failing}: {e}"))
            .get(0);
        let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(
            answer["rows"],
            serde_json::json!([[4]]),
            "{failing}: {answer}"
        );
        let failed = answer["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["outcome"] == "error")
            .count();
        assert_eq!(failed, 1, "{failing}: {answer}");
        let postgres_failed = failing.contains("c_boom");
        // The vote stopped at the alternative PostgreSQL failed under; the others ran.
        let ran = answer["attempts"].as_array().unwrap().len();
        assert_eq!(ran, if postgres_failed { 2 } else { 5 }, "{answer}");
        let warned = notices
            .lock()
            .unwrap()
            .iter()
            .any(|n| n.contains("PostgreSQL failed under attempt 2 (XX000)"));
        assert_eq!(
            warned,
            postgres_failed,
            "{failing}: {:?}",
            notices.lock().unwrap()
        );
    }
}

/// When PostgreSQL fails under a repair (an internal error of its C code, `currval` of a
/// relation that does not exist, in a view the repair reads), the loop stops there: the first query's empty result is the answer, with a WARNING
/// that says why, and the model is not asked again. When it fails under the first query, that
/// error (its SQLSTATE) is the call's, without repairs. Before, both ended the call with it.
#[test]
fn postgres_failing_under_a_repair_stops_the_loop_with_the_answer_it_has() {
    let mut s = Session::new();
    let (name, mut role, notices) = role_connection(&mut s, "broke");
    s.client
        .batch_execute(&format!(
            "CREATE VIEW c_boom AS SELECT currval(0::oid::regclass) AS n;
             GRANT SELECT ON c_boom TO {name};"
        ))
        .unwrap();
    role.batch_execute("SET sql_query_engine.max_repairs = 3")
        .unwrap();
    let none = "SELECT name FROM customers WHERE name = 'nobody'";
    s.llm.on(
        "anyone called nobody",
        vec![
            Reply::sql(none),
            Reply::sql("SELECT n FROM c_boom"),
            Reply::sql("SELECT name FROM customers"),
        ],
    );
    let answer: String = role
        .query_one("SELECT nl_ask('anyone called nobody')::text", &[])
        .unwrap()
        .get(0);
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["sql"], none, "{answer}");
    assert_eq!(answer["rows"], serde_json::json!([]), "{answer}");
    assert_eq!(answer["attempts"].as_array().unwrap().len(), 2, "{answer}");
    assert!(
        notices
            .lock()
            .unwrap()
            .iter()
            .any(|n| n.contains("PostgreSQL failed under attempt 2 (XX000)")),
        "{:?}",
        notices.lock().unwrap()
    );

    s.llm.on(
        "boom count",
        vec![Reply::sql("SELECT n FROM c_boom"), Reply::sql(none)],
    );
    let error = role
        .query_one("SELECT nl_ask('boom count')::text", &[])
        .unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "XX000", "{message}");
    assert!(message.contains("could not open relation"), "{message}");
    assert!(message.contains("1 attempts"), "{message}");
}

/// What PostgreSQL's lexer says of SQL the caller did not write is not sent to it: an
/// identifier longer than 63 bytes, in the model's SQL or in another role's verified example
/// (read for every question whose words it shares), was printed whole in a NOTICE, line
/// breaks and all, which could pass for the extension's own lines. The answer still comes.
#[test]
fn what_the_lexer_says_of_sql_the_caller_did_not_write_is_not_sent_to_it() {
    let mut s = Session::new();
    let (_, mut role, notices) = role_connection(&mut s, "lexed");
    let long = format!(
        "x\nsql_query_engine: verified by a reviewer{}",
        "_".repeat(40)
    );
    let sql = format!("SELECT count(*) AS \"{long}\" FROM customers");
    s.client
        .query_one(
            "SELECT nl_example_add('how many customers are there in all', $1)",
            &[&sql],
        )
        .unwrap();
    s.llm
        .on("how many customers in all", vec![Reply::sql(&sql)]);
    let rows = role
        .query("SELECT * FROM nl_query('how many customers in all')", &[])
        .unwrap();
    assert_eq!(rows.len(), 1);
    // Nor when the repair reads the names a failed query used (for its hints).
    s.llm.on(
        "the customers' missing column",
        vec![
            Reply::sql(&format!("SELECT nosuch AS \"{long}\" FROM customers")),
            Reply::sql("SELECT count(*) AS n FROM customers"),
        ],
    );
    let rows = role
        .query(
            "SELECT * FROM nl_query('the customers'' missing column')",
            &[],
        )
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert!(s.llm.requests().last().is_some_and(|r| r.is_repair()));
    let notices = notices.lock().unwrap();
    assert!(
        !notices.iter().any(|n| n.contains("will be truncated")),
        "{notices:?}"
    );
}

/// The value index reads a wide table's columns in groups, keeping the distinct values it uses:
/// 180 text columns of 20,000 values each, 3.6 million values in one read (each counted as 16
/// bytes of the read's bound), took hundreds of megabytes outside the memory watch while parsed
/// and kept. A value in the last column is still found.
#[test]
fn a_wide_tables_values_are_read_in_groups_and_all_found() {
    let mut s = Session::new();
    let (role_name, mut role, _) = role_connection(&mut s, "wide");
    let columns: Vec<String> = (1..=180).map(|i| format!("c{i} text")).collect();
    let values: Vec<String> = (1..=180)
        .map(|i| match i {
            180 => "CASE WHEN g = 7 THEN 'Zanzibar' ELSE 'x' END".to_string(),
            _ => "'x'".to_string(),
        })
        .collect();
    s.client
        .batch_execute(&format!(
            "CREATE TABLE wide ({}); INSERT INTO wide SELECT {} FROM generate_series(1, 20000) g;
             GRANT SELECT ON wide TO {role_name};",
            columns.join(", "),
            values.join(", ")
        ))
        .unwrap();
    let pid: i32 = role
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    s.llm.on(
        "the wide rows in zanzibar",
        vec![Reply::sql(
            "SELECT count(*) AS n FROM wide WHERE c180 = 'Zanzibar'",
        )],
    );
    role.query("SELECT * FROM nl_query('the wide rows in zanzibar')", &[])
        .unwrap();
    let prompt = s.llm.requests().first().unwrap().text();
    assert!(
        prompt.contains("'Zanzibar'"),
        "the value was not found: {prompt}"
    );
    // 612 MB in one read, parsed whole; 138 MB measured in groups, each column's first
    // distinct values kept.
    let peak = sql_query_engine_e2e::peak_kb(pid).unwrap_or(0);
    assert!(peak < 300 * 1024, "the backend grew to {peak} kB");
}

/// Another role's tables (in a schema a superuser owns and others may create in) whose read
/// would load into the caller's connection what it keeps for as long as it lives are not read
/// on the extension's own (the value index, samples): an index that computes a value without a
/// column (computed once as the read is planned: 100 MB of `repeat`, 63 MB from `pi()`, 80 MB
/// of an array's cast to padded text), an extended statistic's expression (computed at every
/// plan), a trigger's 60 MB argument and a column's fast default (loaded as the table is
/// opened, stored compressed in a few kB). Such tables in the caller's context filled its
/// caches until `max_query_memory` ended its connection.
#[test]
fn tables_whose_read_would_fill_the_callers_caches_are_not_read_on_the_extensions_own() {
    let mut s = Session::new();
    let (role_name, mut role, _) = role_connection(&mut s, "folded");
    let planter = format!("planter_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {planter}; CREATE SCHEMA planted;
             GRANT USAGE, CREATE ON SCHEMA planted TO {planter};
             SET ROLE {planter};
             CREATE TABLE planted.notes (note text);
             CREATE INDEX ON planted.notes ((note || repeat('x', 100000000)));
             GRANT SELECT ON planted.notes TO {role_name};
             CREATE TABLE planted.memos (memo text);
             CREATE INDEX ON planted.memos ((memo || repeat('y', (pi() * 2e7)::int)));
             GRANT SELECT ON planted.memos TO {role_name};
             CREATE TABLE planted.jobs (job text);
             DO $$ BEGIN EXECUTE format('CREATE TRIGGER heavy BEFORE UPDATE ON planted.jobs
                 FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger(%L)',
                 repeat('z', 60000000)); END $$;
             GRANT SELECT ON planted.jobs TO {role_name};
             CREATE TABLE planted.codes (code text);
             CREATE INDEX ON planted.codes (code)
                 WHERE code::bpchar = ANY ('{{a,b,c,d,e,f,g,h}}'::text[]::char(10485760)[]);
             GRANT SELECT ON planted.codes TO {role_name};
             CREATE TABLE planted.tags (tag text);
             CREATE STATISTICS planted.tag_stats ON (tag || repeat('t', 100000000))
                 FROM planted.tags;
             GRANT SELECT ON planted.tags TO {role_name};
             CREATE TABLE planted.wide (id int);
             ALTER TABLE planted.wide ADD COLUMN w text DEFAULT repeat('w', 400000);
             ALTER TABLE planted.wide ALTER COLUMN w DROP DEFAULT;
             GRANT SELECT ON planted.wide TO {role_name};
             CREATE TABLE planted.stamps (a text, b text);
             INSERT INTO planted.stamps
                 SELECT x, reverse(x) FROM (SELECT (SELECT string_agg(md5(i || '/' || j), '')
                                                    FROM generate_series(1, 31) j) AS x
                                             FROM generate_series(1, 12000) i) r;
             ALTER TABLE planted.stamps ALTER COLUMN a SET STATISTICS 10000,
                 ALTER COLUMN b SET STATISTICS 10000;
             CREATE INDEX ON planted.stamps (a, b);
             ANALYZE planted.stamps;
             GRANT SELECT ON planted.stamps TO {role_name};
             CREATE TABLE planted.cities (city text);
             INSERT INTO planted.cities VALUES ('Zanzibar'), ('Oslo');
             CREATE INDEX ON planted.cities (lower(city));
             CREATE INDEX ON planted.cities (city) WHERE city IN ('Oslo', 'Bergen');
             ALTER TABLE planted.cities ADD COLUMN population numeric;
             CREATE INDEX ON planted.cities (city) WHERE population > 0;
             ALTER TABLE planted.cities ADD COLUMN status varchar(10);
             CREATE INDEX ON planted.cities (city) WHERE status IN ('open', 'closed');
             GRANT SELECT ON planted.cities TO {role_name};
             RESET ROLE;
             GRANT USAGE ON SCHEMA planted TO {role_name};
             GRANT pg_read_all_stats TO {role_name};"
        ))
        .unwrap();
    let pid: i32 = role
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    s.llm.on(
        "how many notes are there",
        vec![Reply::sql("SELECT 0 AS n")],
    );
    let context: String = role.query_one("SELECT nl_schema()", &[]).unwrap().get(0);
    assert!(context.contains("notes"), "{context}");
    role.query("SELECT * FROM nl_query('how many notes are there')", &[])
        .unwrap();
    // 245 MB at the backend's peak when it was read; 53 MB measured without.
    let peak = sql_query_engine_e2e::peak_kb(pid).unwrap_or(0);
    assert!(peak < 150 * 1024, "the backend grew to {peak} kB");
    // A read that is made loads no statistics row of its columns into the catalog cache (two
    // histograms of 10,000 values of 1 kB here), neither for their widths nor for the cost of
    // an index that covers them; read from the backend's own memory contexts, which
    // pg_read_all_stats may see.
    let cached: i64 = role
        .query_one(
            "SELECT sum(total_bytes)::bigint FROM pg_backend_memory_contexts
             WHERE name = 'CacheMemoryContext'",
            &[],
        )
        .unwrap()
        .get(0);
    // 24149784 bytes measured when the planner looked them up for the widths, 14188456 for
    // the index alone; about 4 MB without.
    assert!(cached < 8 << 20, "the catalog cache holds {cached} bytes");
    // Indexes on a column's computation, and partial ones, leave a table read.
    s.llm.on(
        "how many cities are called zanzibar",
        vec![Reply::sql("SELECT 0 AS n")],
    );
    role.query(
        "SELECT * FROM nl_query('how many cities are called zanzibar')",
        &[],
    )
    .unwrap();
    let prompt = s.llm.requests().last().unwrap().text();
    assert!(
        prompt.contains("'Zanzibar'"),
        "the value was not found: {prompt}"
    );
}

/// Another role's tables, read first, whose catalog text uses up all that reads on the
/// extension's own may load into a connection (16 tables of 1 MB of a trigger's argument, in
/// a shared schema on the search path) leave the caller's own tables read: the tables of
/// roles the caller trusts (its own, superusers') have a budget of their own.
#[test]
fn another_roles_tables_do_not_use_up_what_reads_of_the_callers_own_may_load() {
    let mut s = Session::new();
    let (role_name, mut role, _) = role_connection(&mut s, "budgeted");
    let planter = format!("filler_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {planter}; GRANT CREATE ON SCHEMA public TO {planter};
             CREATE SCHEMA zzz_own AUTHORIZATION {role_name};
             SET ROLE {planter};
             DO $$ BEGIN FOR i IN 10..25 LOOP
                 EXECUTE format('CREATE TABLE public.aaa_%s (note text)', i);
                 -- 1048575 characters and their NUL: 1 MB of catalog text each, 16 MB in all
                 EXECUTE format('CREATE TRIGGER heavy BEFORE UPDATE ON public.aaa_%s
                     FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger(%L)',
                     i, repeat('f', 1048575));
                 EXECUTE format('INSERT INTO public.aaa_%s VALUES (''filler'')', i);
                 EXECUTE format('GRANT SELECT ON public.aaa_%s TO {role_name}', i);
             END LOOP; END $$;
             RESET ROLE;"
        ))
        .unwrap();
    // The caller's own table, with a default (catalog text of its own to load), in a schema
    // read after the shared one.
    role.batch_execute(
        "CREATE TABLE zzz_own.places (place text DEFAULT 'somewhere');
         INSERT INTO zzz_own.places VALUES ('Zanzibar'), ('Oslo');",
    )
    .unwrap();
    s.llm.on(
        "how many places are in zanzibar",
        vec![Reply::sql("SELECT 0 AS n")],
    );
    role.query(
        "SELECT * FROM nl_query('how many places are in zanzibar')",
        &[],
    )
    .unwrap();
    let prompt = s.llm.requests().last().unwrap().text();
    assert!(
        prompt.contains("'Zanzibar'"),
        "the caller's own table was not read: {prompt}"
    );
}

/// What a read on the extension's own loads into the caller's catalog cache is measured again
/// as the read begins, under its lock: the schema context measured another role's tables when
/// it was read, and that role, holding a lock on a table read first, gave a second one a
/// default of 6 MB while the caller waited; the second read loaded it into the caller's
/// catalog cache (24 MB of it). It is refused now, and the cache stays small; so is a read of
/// a name that another table took meanwhile (the measured one renamed).
#[test]
fn what_an_own_read_loads_is_measured_again_under_its_lock() {
    let mut s = Session::new();
    let (victim, caller, _) = role_connection(&mut s, "waiting");
    let (owner, mut changer) = creator_in_public(&mut s, "changer");
    s.client
        .batch_execute(&format!("GRANT pg_read_all_stats TO {victim}"))
        .unwrap();
    changer
        .batch_execute(&format!(
            "CREATE TABLE public.aaa_first (note text);
             INSERT INTO public.aaa_first VALUES ('Oslo');
             CREATE TABLE public.bbb_second (place text);
             INSERT INTO public.bbb_second VALUES ('Zanzibar');
             CREATE TABLE public.ccc_first (note text);
             INSERT INTO public.ccc_first VALUES ('Oslo');
             CREATE TABLE public.ddd_second (place text);
             INSERT INTO public.ddd_second VALUES ('Zanzibar');
             GRANT SELECT ON public.aaa_first, public.bbb_second, public.ccc_first,
                 public.ddd_second TO {victim};"
        ))
        .unwrap();
    let mut caller = Some(caller);
    let pid: i32 = caller
        .as_mut()
        .unwrap()
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    s.llm.on(
        "how many places are called zanzibar",
        vec![Reply::sql("SELECT 0 AS n"), Reply::sql("SELECT 0 AS n")],
    );
    let mut locker = cluster().connect_as(&s.database, &owner);
    // The caller asks while `first` is locked; once it waits for it, `change` commits.
    let mut wait_and_change = |first: &str, change: &str| -> i64 {
        let mut asker = caller.take().unwrap();
        // The schema context is read (and kept) as it is now.
        let schema: String = asker.query_one("SELECT nl_schema()", &[]).unwrap().get(0);
        assert!(schema.contains(first), "{schema}");
        let before = catalog_cache_bytes(&mut asker);
        locker
            .batch_execute(&format!(
                "BEGIN; LOCK TABLE public.{first} IN ACCESS EXCLUSIVE MODE"
            ))
            .unwrap();
        let asking = std::thread::spawn(move || {
            let asked = asker
                .query(
                    "SELECT * FROM nl_query('how many places are called zanzibar')",
                    &[],
                )
                .map(|_| ())
                .map_err(|e| format!("{:?}", db_error(&e)));
            (asker, asked)
        });
        let started = std::time::Instant::now();
        loop {
            let waiting: i64 = s
                .client
                .query_one(
                    "SELECT count(*) FROM pg_locks
                     WHERE pid = $1 AND NOT granted AND relation = $2::text::regclass",
                    &[&pid, &format!("public.{first}")],
                )
                .unwrap()
                .get(0);
            if waiting > 0 {
                break;
            }
            assert!(
                started.elapsed() < std::time::Duration::from_secs(60),
                "the caller never waited for {first}"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        changer.batch_execute(change).unwrap();
        locker.batch_execute("ROLLBACK").unwrap();
        let (mut asker, asked) = asking.join().unwrap();
        asked.unwrap();
        let grown = catalog_cache_bytes(&mut asker) - before;
        caller = Some(asker);
        grown
    };
    let grown = wait_and_change(
        "aaa_first",
        "DO $$ BEGIN EXECUTE format('ALTER TABLE public.bbb_second ALTER COLUMN place
             SET DEFAULT %L', repeat('z', 6000000)); END $$",
    );
    assert!(
        grown < 3 << 20,
        "the caller's catalog cache grew by {grown} bytes"
    );
    let grown = wait_and_change(
        "ccc_first",
        &format!(
            "BEGIN;
             ALTER TABLE public.ddd_second RENAME TO ddd_measured;
             CREATE TABLE public.ddd_second (place text);
             INSERT INTO public.ddd_second VALUES ('Zanzibar');
             DO $$ BEGIN EXECUTE format('ALTER TABLE public.ddd_second ALTER COLUMN place
                 SET DEFAULT %L', repeat('z', 6000000)); END $$;
             GRANT SELECT ON public.ddd_second TO {victim};
             COMMIT;"
        ),
    );
    assert!(
        grown < 3 << 20,
        "the caller's catalog cache grew by {grown} bytes after the rename"
    );
}

/// Another role's tables the caller may not read cost its connection nothing: the schema
/// context checked the caller's privilege on every column in the database that had statistics
/// (pg_stats joined whole, another session's temporary tables too) and on every column of each
/// table it could not read whole (`has_any_column_privilege`), a catalog cache entry each,
/// which PostgreSQL keeps for the life of the connection; and once one column of such a table
/// was granted to the caller, every column of it as the context's columns were read. Here
/// tables of 1,600 columns of a role with no privilege but TEMP and a schema of its own the
/// caller may use, one column of each granted to PUBLIC.
#[test]
fn other_roles_wide_tables_do_not_fill_the_callers_catalog_cache() {
    let mut s = Session::new();
    let (victim, mut caller, _) = role_connection(&mut s, "cached");
    let wide = format!("wide_{}", s.database);
    s.client
        .batch_execute(&format!(
            "GRANT pg_read_all_stats TO {victim};
             CREATE ROLE {wide} LOGIN; CREATE SCHEMA wide AUTHORIZATION {wide};
             GRANT USAGE ON SCHEMA wide TO {victim};"
        ))
        .unwrap();
    let mut other = cluster().connect_as(&s.database, &wide);
    let columns = (1..=1600)
        .map(|i| format!("c{i} int"))
        .collect::<Vec<_>>()
        .join(", ");
    for i in 0..40 {
        other
            .batch_execute(&format!(
                "CREATE TEMP TABLE t{i} ({columns}); INSERT INTO t{i} (c1) VALUES (1), (1);
                 ANALYZE t{i}; CREATE TABLE wide.w{i} ({columns});
                 GRANT SELECT (c1) ON wide.w{i} TO PUBLIC;"
            ))
            .unwrap();
    }
    // The caller's own: the memory its catalog cache holds.
    let before = catalog_cache_bytes(&mut caller);
    caller
        .batch_execute("SET sql_query_engine.schemas = 'public, wide'")
        .unwrap();
    // A question that names them all: the relations it names are shown.
    let question = (0..40)
        .map(|i| format!("w{i}"))
        .collect::<Vec<_>>()
        .join(" ");
    let schema: String = caller
        .query_one("SELECT nl_schema($1)", &[&question])
        .unwrap()
        .get(0);
    assert!(schema.contains("w0"), "{schema}");
    let grown = catalog_cache_bytes(&mut caller) - before;
    assert!(
        grown < 8 << 20,
        "the caller's catalog cache grew by {grown} bytes"
    );
}

/// The guard reads the body of a function it may let run, a superuser's, for what it calls:
/// never the body of a role's own function, which it refuses by its owner anyway, and whose
/// words (any number, each a catalog look-up that stays in the caller's cache, every look-up
/// scanning those before it on PostgreSQL 15) the role chose.
#[test]
fn a_roles_function_body_is_not_read_by_the_guard() {
    let mut s = Session::new();
    let (role, mut caller, _) = role_connection(&mut s, "wordy");
    s.client
        .batch_execute(&format!("GRANT pg_read_all_stats TO {role}"))
        .unwrap();
    let words = (0..20000)
        .map(|i| format!("w{i:x}"))
        .collect::<Vec<_>>()
        .join(" ");
    caller
        .batch_execute(&format!(
            "CREATE FUNCTION pg_temp.wordy() RETURNS int LANGUAGE sql
                 AS 'SELECT 1 /* {words} */'"
        ))
        .unwrap();
    let before = catalog_cache_bytes(&mut caller);
    let error = caller
        .query("SELECT nl_check('SELECT pg_temp.wordy()')", &[])
        .unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "42501", "{message}");
    let grown = catalog_cache_bytes(&mut caller) - before;
    assert!(
        grown < 1 << 20,
        "the caller's catalog cache grew by {grown} bytes"
    );
}
