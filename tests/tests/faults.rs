//! What a user sees when things go wrong: a clear ERROR with a proper SQLSTATE, within the time
//! limits, never a crash and never a hang.

use std::time::{Duration, Instant};

use sql_query_engine_e2e::{backend_lingers, cluster, db_error, key_file, Reply, Session};

fn error_of(s: &mut Session, question: &str) -> (String, String, Duration) {
    let started = Instant::now();
    let error = s.query(question).expect_err("an error was expected");
    let (code, message, _) = db_error(&error);
    (code, message, started.elapsed())
}

#[test]
fn an_http_error_names_the_endpoint_and_the_status() {
    let mut s = Session::new();
    s.llm.on(
        "q500",
        vec![Reply::Status(
            400,
            r#"{"error":{"message":"bad model name"}}"#.into(),
        )],
    );
    let (code, message, _) = error_of(&mut s, "q500");
    assert_eq!(code, "58000");
    assert!(message.contains(&s.llm.url()), "{message}");
    assert!(message.contains("HTTP 400: bad model name"), "{message}");
}

#[test]
fn json_mode_is_asked_for_and_dropped_for_an_endpoint_without_it() {
    let mut s = Session::new();
    s.llm.on(
        "json mode",
        vec![
            Reply::Status(
                400,
                r#"{"error":{"message":"unknown parameter: response_format"}}"#.into(),
            ),
            Reply::Content("```sql\nSELECT count(*) AS n FROM orders\n```".into()),
        ],
    );
    assert_eq!(
        s.query("json mode").unwrap(),
        vec![serde_json::json!({"n": 6})]
    );
    let requests = s.llm.requests();
    assert_eq!(requests[0].body["response_format"]["type"], "json_object");
    assert!(requests[1].body.get("response_format").is_none());
    // and not asked again in this session
    s.llm
        .on("json mode again", vec![Reply::sql("SELECT 1 AS one")]);
    s.query("json mode again").unwrap();
    assert!(s.llm.requests()[2].body.get("response_format").is_none());
}

#[test]
fn server_errors_and_rate_limits_are_retried_within_the_deadline() {
    let mut s = Session::new();
    s.llm.on(
        "busy model",
        vec![
            Reply::Status(429, r#"{"error":{"message":"slow down"}}"#.into()),
            Reply::Status(503, "overloaded".into()),
            Reply::sql("SELECT count(*) AS n FROM customers"),
        ],
    );
    assert_eq!(
        s.query("busy model").unwrap(),
        vec![serde_json::json!({"n": 4})]
    );
    assert_eq!(s.llm.requests().len(), 3);
}

#[test]
fn persistent_server_errors_end_within_the_timeout() {
    let mut s = Session::new();
    s.client
        .batch_execute("SET sql_query_engine.llm_timeout = 1500")
        .unwrap();
    s.llm.on(
        "always 500",
        (0..50).map(|_| Reply::Status(500, "down".into())).collect(),
    );
    let (code, message, took) = error_of(&mut s, "always 500");
    assert_eq!(code, "58000");
    assert!(message.contains("HTTP 500"), "{message}");
    // The timeout and a loaded machine's preparation of the first call, not 50 retries.
    assert!(took < Duration::from_millis(4000), "took {took:?}");
}

#[test]
fn garbage_and_empty_completions_are_errors() {
    let mut s = Session::new();
    s.llm
        .on("garbage", vec![Reply::Raw("<html>oops</html>".into())]);
    let (code, message, _) = error_of(&mut s, "garbage");
    assert_eq!(code, "58000");
    assert!(message.contains("not JSON"), "{message}");

    s.llm
        .on("no choices", vec![Reply::Raw(r#"{"choices": []}"#.into())]);
    let (_, message, _) = error_of(&mut s, "no choices");
    assert!(message.contains("no choices"), "{message}");

    s.llm.on(
        "not a completion",
        vec![Reply::Raw(r#"{"data": 1}"#.into())],
    );
    let (_, message, _) = error_of(&mut s, "not a completion");
    assert!(message.contains("not a chat completion"), "{message}");
}

#[test]
fn a_slow_model_times_out_within_llm_timeout() {
    let mut s = Session::new();
    s.client
        .batch_execute("SET sql_query_engine.llm_timeout = 800")
        .unwrap();
    s.llm.on(
        "slow",
        vec![Reply::Slow(
            Duration::from_secs(20),
            Box::new(Reply::sql("SELECT 1")),
        )],
    );
    let (code, message, took) = error_of(&mut s, "slow");
    assert_eq!(code, "58000");
    assert!(message.contains("llm_timeout"), "{message}");
    // Not the 20 s of the reply (with room for preparing the call on a loaded machine).
    assert!(took < Duration::from_millis(5000), "took {took:?}");
}

#[test]
fn an_unreachable_model_and_a_hang_up_are_errors() {
    let mut s = Session::new();
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    s.client
        .batch_execute(&format!(
            "SET sql_query_engine.llm_url = 'http://127.0.0.1:{closed}/v1'"
        ))
        .unwrap();
    let (code, message, took) = error_of(&mut s, "anything");
    assert_eq!(code, "58000");
    assert!(
        message.contains(&format!("127.0.0.1:{closed}")),
        "{message}"
    );
    assert!(took < Duration::from_secs(20), "took {took:?}");

    let url = s.llm.url();
    s.client
        .batch_execute(&format!("SET sql_query_engine.llm_url = '{url}'"))
        .unwrap();
    s.llm.on("hang up", vec![Reply::HangUp]);
    let (code, _, _) = error_of(&mut s, "hang up");
    assert_eq!(code, "58000");
}

#[test]
fn the_callers_statement_timeout_interrupts_the_model_wait() {
    let mut s = Session::new();
    s.llm.on(
        "wait forever",
        vec![Reply::Slow(
            Duration::from_secs(30),
            Box::new(Reply::sql("SELECT 1")),
        )],
    );
    s.client
        .batch_execute("SET statement_timeout = 500")
        .unwrap();
    let (code, _, took) = error_of(&mut s, "wait forever");
    assert_eq!(code, "57014");
    // Not the 30 s of the reply (with room for a loaded machine).
    assert!(took < Duration::from_millis(5000), "took {took:?}");
    // the session is fine afterwards
    s.client.batch_execute("RESET statement_timeout").unwrap();
    assert_eq!(s.scalar_i64("SELECT count(*) FROM orders"), 6);
}

#[test]
fn pg_cancel_backend_interrupts_the_model_wait() {
    let mut s = Session::new();
    s.llm.on(
        "cancel me",
        vec![Reply::Slow(
            Duration::from_secs(30),
            Box::new(Reply::sql("SELECT 1")),
        )],
    );
    let canceller = s.signal_after("pg_cancel_backend", Duration::from_millis(500));
    let error = s.query("cancel me").unwrap_err();
    let ended = Instant::now();
    let cancelled_at = canceller.join().unwrap();
    assert_eq!(db_error(&error).0, "57014");
    // The model would answer after 30 s: the cancel lands long before.
    assert!(ended.duration_since(cancelled_at) < Duration::from_secs(10));
}

#[test]
fn cancelled_calls_leave_at_most_four_model_requests_running() {
    let mut s = Session::new();
    let slow = || Reply::Slow(Duration::from_secs(20), Box::new(Reply::sql("SELECT 1")));
    s.llm.on("pile them up", (0..10).map(|_| slow()).collect());
    s.client
        .batch_execute("SET statement_timeout = 300")
        .unwrap();
    // Each cancel leaves its request running until the model answers (or llm_timeout); the
    // fifth call waits for one of them to end instead of sending another, and is cancelled.
    for _ in 0..10 {
        let (code, _, _) = error_of(&mut s, "pile them up");
        assert_eq!(code, "57014");
    }
    assert_eq!(s.llm.requests().len(), 4);
    assert_eq!(s.llm.most_in_flight(), 4);
}

/// Behind a transaction pooler a backend serves the next client, of any role, once a cancelled
/// call has ended: the requests one role left running hold up that role only.
#[test]
fn requests_one_role_left_running_hold_up_no_other_role() {
    let mut s = Session::new();
    let (left, other) = (
        format!("left_{}", s.database),
        format!("other_{}", s.database),
    );
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {left}; CREATE ROLE {other};
             GRANT SELECT ON customers TO {left}, {other};"
        ))
        .unwrap();
    let slow = || Reply::Slow(Duration::from_secs(20), Box::new(Reply::sql("SELECT 1")));
    s.llm.on("pile them up", (0..4).map(|_| slow()).collect());
    s.llm.on(
        "count the customers",
        vec![Reply::sql("SELECT count(*) AS n FROM customers")],
    );
    s.client
        .batch_execute(&format!("SET ROLE {left}; SET statement_timeout = 300"))
        .unwrap();
    for _ in 0..4 {
        let (code, _, _) = error_of(&mut s, "pile them up");
        assert_eq!(code, "57014");
    }
    assert_eq!(s.llm.most_in_flight(), 4);
    // Another role on the same backend is answered at once.
    s.client
        .batch_execute(&format!("RESET statement_timeout; SET ROLE {other}"))
        .unwrap();
    let started = Instant::now();
    let rows = s.query("count the customers").unwrap();
    assert_eq!(rows, vec![serde_json::json!({"n": 4})]);
    assert!(started.elapsed() < Duration::from_secs(10));
    // The role that left them waits for one of its own to end (here, until its timeout).
    s.client
        .batch_execute(&format!(
            "SET ROLE {left}; SET sql_query_engine.llm_timeout = 1000"
        ))
        .unwrap();
    let (code, message, _) = error_of(&mut s, "count the customers");
    assert_eq!(code, "58000", "{message}");
    assert!(message.contains("no request thread was free"), "{message}");
}

#[test]
fn pg_terminate_backend_ends_the_backend_cleanly() {
    let mut s = Session::new();
    s.llm.on(
        "terminate me",
        vec![Reply::Slow(
            Duration::from_secs(30),
            Box::new(Reply::sql("SELECT 1")),
        )],
    );
    let mut other = cluster().connect(&s.database);
    let started_at: String = other
        .query_one("SELECT pg_postmaster_start_time()::text", &[])
        .unwrap()
        .get(0);
    let pid: i32 = s
        .client
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    let killer = s.signal_after("pg_terminate_backend", Duration::from_millis(500));
    let error = s.query("terminate me").unwrap_err();
    let ended = Instant::now();
    let signalled = killer.join().unwrap();
    assert!(ended.duration_since(signalled) < Duration::from_secs(10));
    // FATAL 57P01 (or the connection closing)
    if let Some(db) = error.as_db_error() {
        assert_eq!(db.code().code(), "57P01");
    }
    // the backend is gone, alone: the postmaster did not restart, and an open connection goes on
    assert!(
        !backend_lingers(&mut other, pid),
        "the terminated backend is gone"
    );
    let now: String = other
        .query_one("SELECT pg_postmaster_start_time()::text", &[])
        .unwrap()
        .get(0);
    assert_eq!(now, started_at, "the postmaster restarted");
}

#[test]
fn missing_settings_and_empty_questions_are_clear_errors() {
    let mut s = Session::new();
    s.client
        .batch_execute("RESET sql_query_engine.llm_url")
        .unwrap();
    let (code, message, _) = error_of(&mut s, "anything");
    assert_eq!(code, "55000");
    assert!(message.contains("sql_query_engine.llm_url"), "{message}");

    let url = s.llm.url();
    s.client
        .batch_execute(&format!("SET sql_query_engine.llm_url = '{url}'"))
        .unwrap();
    for question in ["", "   "] {
        let (code, _, _) = error_of(&mut s, question);
        assert_eq!(code, "22023");
    }
    let error = s.client.query("SELECT nl_query(NULL)", &[]).unwrap_err();
    assert_eq!(db_error(&error).0, "22023");
    assert!(
        s.llm.requests().is_empty(),
        "no model call for a non-question"
    );
}

#[test]
fn a_mistyped_setting_is_an_error() {
    let mut s = Session::new();
    // load the library first: the prefix is reserved when it loads
    s.client
        .batch_execute("SELECT nl_trace(NULL::text) IS NULL")
        .ok();
    let error = s
        .client
        .batch_execute("SET sql_query_engine.llm_ulr = 'x'")
        .unwrap_err();
    let (code, message, detail) = db_error(&error);
    assert_eq!(code, "42602", "invalid_name: the prefix is reserved");
    assert!(
        message.contains("llm_ulr") && detail.contains("reserved prefix"),
        "{message} {detail}"
    );
}

#[test]
fn the_api_key_is_sent_as_a_bearer_token_and_shown_nowhere() {
    let mut s = Session::new();
    let key = "sk-test-e2e-0123456789";
    let file = key_file(key);
    s.client
        .batch_execute(&format!("SET sql_query_engine.llm_api_key_file = '{file}'"))
        .unwrap();
    s.llm.on("key check", vec![Reply::sql("SELECT 1 AS one")]);
    s.query("key check").unwrap();
    let request = &s.llm.requests()[0];
    assert_eq!(
        request.headers.get("authorization").map(String::as_str),
        Some(&*format!("Bearer {key}"))
    );
    assert!(
        !request.body.to_string().contains(key),
        "the key is only in the header"
    );

    // an endpoint that echoes the key in its errors does not get it printed
    s.llm.on(
        "echo key",
        vec![Reply::Status(
            500,
            format!(r#"{{"error":{{"message":"bad key {key}"}}}}"#),
        )],
    );
    s.client
        .batch_execute("SET sql_query_engine.llm_timeout = 300")
        .unwrap();
    let (_, message, _) = error_of(&mut s, "echo key");
    assert!(!message.contains(key), "{message}");

    // non-superusers can neither read nor set it
    let role = format!("nokey_{}", s.database);
    s.client
        .batch_execute(&format!("CREATE ROLE {role}; SET ROLE {role}"))
        .unwrap();
    let error = s
        .client
        .batch_execute("SHOW sql_query_engine.llm_api_key")
        .unwrap_err();
    assert_eq!(db_error(&error).0, "42501");
    let error = s
        .client
        .batch_execute("SET sql_query_engine.llm_api_key_file = '/etc/passwd'")
        .unwrap_err();
    assert_eq!(db_error(&error).0, "42501");
    let shown: i64 = s
        .client
        .query_one(
            "SELECT count(*) FROM pg_settings WHERE name LIKE 'sql_query_engine.%' AND setting LIKE '%sk-test%'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(shown, 0);
}

/// Once the library is loaded (as `shared_preload_libraries` loads it in every backend), every
/// statement passes through its planner hook, and every utility statement through its utility
/// hook: an ERROR of such a statement (DDL, `DO`, `CALL`, a function run while planning)
/// reaches the client exactly as without the extension, with its position, CONTEXT, column name
/// and the SQLSTATE a procedure chose.
#[test]
fn errors_of_other_statements_reach_the_client_as_postgresql_raised_them() {
    let s = Session::new();
    let mut c = cluster().connect(&s.database);
    c.batch_execute(
        "LOAD 'sql_query_engine';
         CREATE PROCEDURE refuse() LANGUAGE plpgsql AS $$ BEGIN
             RAISE EXCEPTION 'not today' USING ERRCODE = 'P0099', COLUMN = 'day', HINT = 'later';
         END $$;",
    )
    .unwrap();
    let error = c
        .batch_execute("CREATE VIEW v AS SELECT nosuchcol FROM pg_class")
        .unwrap_err();
    let db = error.as_db_error().unwrap();
    assert_eq!(db.code().code(), "42703");
    assert_eq!(
        db.position(),
        Some(&postgres::error::ErrorPosition::Original(25)),
        "the position of the unknown column"
    );
    for call in ["CALL refuse()", "DO $$ BEGIN CALL refuse(); END $$"] {
        let error = c.batch_execute(call).unwrap_err();
        let db = error.as_db_error().unwrap();
        assert_eq!(db.code().code(), "P0099", "{call}");
        assert_eq!(db.column(), Some("day"), "{call}");
        assert_eq!(db.hint(), Some("later"), "{call}");
        assert!(
            db.where_()
                .unwrap_or_default()
                .contains("refuse() line 2 at RAISE"),
            "{call}: {:?}",
            db.where_()
        );
    }
    // An immutable function of constants runs as the statement is planned (and planning passes
    // through the extension's planner hook).
    c.batch_execute(
        "CREATE FUNCTION planned(int) RETURNS int IMMUTABLE LANGUAGE plpgsql AS $$ BEGIN
             RAISE EXCEPTION 'not planned' USING ERRCODE = 'P0099', COLUMN = 'day';
         END $$;",
    )
    .unwrap();
    let error = c.batch_execute("SELECT planned(1)").unwrap_err();
    let db = error.as_db_error().unwrap();
    assert_eq!(db.code().code(), "P0099", "{db:?}");
    assert_eq!(db.column(), Some("day"));
    let error = c
        .batch_execute("DO $$ BEGIN PERFORM 1 / 0; END $$")
        .unwrap_err();
    let db = error.as_db_error().unwrap();
    assert_eq!(db.code().code(), "22012");
    assert!(
        db.where_()
            .unwrap_or_default()
            .contains("inline_code_block"),
        "{:?}",
        db.where_()
    );
}

/// An error with a SQLSTATE of its own (a function's `ERRCODE`) that a query meets keeps that
/// SQLSTATE: in `nl_query` it is the attempt's error, which the model is told, not an internal
/// error that ends the call; `nl_run` (which can raise only the SQLSTATEs pgrx knows) names it
/// in DETAIL.
#[test]
fn an_error_code_a_function_chose_reaches_the_caller_and_the_model() {
    let mut s = Session::new();
    s.client
        .batch_execute(
            "SET sql_query_engine.max_repairs = 1;
             CREATE FUNCTION picky() RETURNS int LANGUAGE plpgsql AS $$ BEGIN
                 RAISE EXCEPTION 'not on weekends' USING ERRCODE = 'P0099';
             END $$;
             CREATE VIEW moods AS SELECT picky() AS mood;",
        )
        .unwrap();
    let error = s
        .client
        .query("SELECT nl_run('SELECT mood FROM moods')", &[])
        .unwrap_err();
    let (code, message, detail) = db_error(&error);
    assert_eq!(code, "XX000", "{message}");
    assert!(message.contains("not on weekends"), "{message}");
    assert!(
        detail.contains("SQLSTATE of the query's error: P0099"),
        "{detail}"
    );

    // Re-thrown by a bare RAISE (no new report) after the handler met and caught another
    // error: that one's SQLSTATE is not taken for it.
    s.client
        .batch_execute(
            "CREATE FUNCTION fussy() RETURNS int LANGUAGE plpgsql AS $$ BEGIN
                 RAISE EXCEPTION 'not today' USING ERRCODE = 'P0099';
             EXCEPTION WHEN OTHERS THEN
                 BEGIN PERFORM 1 / 0; EXCEPTION WHEN division_by_zero THEN NULL; END;
                 RAISE;
             END $$;
             CREATE VIEW fussed AS SELECT fussy() AS f;",
        )
        .unwrap();
    let error = s
        .client
        .query("SELECT nl_run('SELECT f FROM fussed')", &[])
        .unwrap_err();
    let (code, message, detail) = db_error(&error);
    assert_ne!(code, "22012", "{message}");
    assert!(!detail.contains("22012"), "{detail}");

    s.llm.on(
        "the mood",
        vec![
            Reply::sql("SELECT mood FROM moods"),
            Reply::sql("SELECT 1 AS mood"),
        ],
    );
    let trace = s.trace("the mood").unwrap();
    assert_eq!(trace["attempts"][0]["sqlstate"], "P0099", "{trace}");
    assert_eq!(trace["status"], "ok", "{trace}");
    let repair = s.llm.requests().last().unwrap().text();
    assert!(repair.contains("P0099"), "{repair}");
}

/// A NUL in a model's answer (JSON's `\u0000`) is no character PostgreSQL stores: the answer
/// is taken with it replaced, so the call still answers and leaves its history row (before,
/// writing the trace failed: `nl_ask` raised 22P05 and `nl_query` left no row).
#[test]
fn a_nul_in_a_models_answer_neither_fails_the_call_nor_loses_its_history() {
    let mut s = Session::new();
    let before = s.scalar_i64("SELECT count(*) FROM nl_history");
    s.llm.on(
        "a nul in the answer",
        vec![
            Reply::sql("SELECT 1 AS one -- \u{0}"),
            Reply::sql("SELECT 2 AS two"),
        ],
    );
    let answer: String = s
        .client
        .query_one("SELECT nl_ask('a nul in the answer')::text", &[])
        .expect("nl_ask answers")
        .get(0);
    assert!(answer.contains("\"rows\": [[1]]"), "{answer}");
    assert_eq!(s.scalar_i64("SELECT count(*) FROM nl_history"), before + 1);
    s.llm.on(
        "a nul in a query's answer",
        vec![Reply::sql("SELECT 3 AS three -- \u{0}")],
    );
    s.query("a nul in a query's answer").unwrap();
    assert_eq!(s.scalar_i64("SELECT count(*) FROM nl_history"), before + 2);
}
