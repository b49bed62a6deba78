//! What API clients and BI tools use: the provider fallback chain, `nl_ask`, `nl_fix` and
//! `nl_cursor`.

use postgres::types::Type;
use serde_json::json;
use sql_query_engine_e2e::{db_error, key_file, Reply, ScriptedLlm, Session};

fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn a_dead_endpoint_falls_back_to_the_next_with_its_own_key_and_is_skipped_for_a_while() {
    let mut s = Session::new();
    let dead = format!("http://127.0.0.1:{}/v1", closed_port());
    let (primary_key, fallback_key) = (key_file("sk-primary-0001"), key_file("sk-fallback-0002"));
    s.client
        .batch_execute(&format!(
            "SET sql_query_engine.llm_url = '{dead}';
             SET sql_query_engine.llm_api_key_file = '{primary_key}';
             SET sql_query_engine.llm_fallbacks = '{} model=backup key_file={fallback_key}';",
            s.llm.url()
        ))
        .unwrap();
    s.llm.on(
        "count the customers",
        vec![Reply::sql("SELECT count(*) AS n FROM customers"); 2],
    );
    let trace = s.trace("count the customers").unwrap();
    assert_eq!(trace["status"], "ok");
    let attempt = &trace["attempts"][0];
    assert_eq!(
        attempt["endpoint"],
        format!("{}/chat/completions", s.llm.url())
    );
    let failures = attempt["endpoint_failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{attempt}");
    assert!(
        failures[0].as_str().unwrap().starts_with(&dead),
        "{failures:?}"
    );
    let request = &s.llm.requests()[0];
    assert_eq!(request.body["model"], "backup");
    assert_eq!(
        request.headers.get("authorization").map(String::as_str),
        Some("Bearer sk-fallback-0002"),
        "each endpoint gets its own key"
    );
    // The dead endpoint is skipped for now: the next question does not wait for it.
    let trace = s.trace("count the customers").unwrap();
    assert!(trace["attempts"][0]["endpoint_failures"]
        .as_array()
        .unwrap()
        .is_empty());
    // The history (of nl_query; nl_trace is not recorded) says who answered.
    s.llm.on(
        "and again",
        vec![Reply::sql("SELECT count(*) AS n FROM customers")],
    );
    s.query("and again").unwrap();
    let recorded: String = s
        .client
        .query_one(
            "SELECT attempts::text FROM nl_history ORDER BY id DESC LIMIT 1",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(recorded.contains(&s.llm.url()), "{recorded}");
}

#[test]
fn a_rate_limited_endpoint_is_passed_over_without_waiting() {
    let mut s = Session::new();
    let limited = ScriptedLlm::start();
    limited.on(
        "busy question",
        (0..5)
            .map(|_| Reply::Status(429, r#"{"error":{"message":"slow down"}}"#.into()))
            .collect(),
    );
    // Rate-limited for everything: the chain's probe too (only then is the 429 the
    // endpoint's, and the question sent on).
    limited.respond_with(|_| {
        Some(Reply::Status(
            429,
            r#"{"error":{"message":"slow down"}}"#.into(),
        ))
    });
    s.client
        .batch_execute(&format!(
            "SET sql_query_engine.llm_url = '{}';
             SET sql_query_engine.llm_fallbacks = '{}';
             SET sql_query_engine.llm_circuit_breaker = 0;",
            limited.url(),
            s.llm.url()
        ))
        .unwrap();
    s.llm
        .on("busy question", vec![Reply::sql("SELECT 1 AS one")]);
    let started = std::time::Instant::now();
    let trace = s.trace("busy question").unwrap();
    assert_eq!(trace["status"], "ok");
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    let asked = limited
        .requests()
        .iter()
        .filter(|r| r.last_message() != "Reply with the word OK.")
        .count();
    assert_eq!(asked, 1, "not retried: the next endpoint was there");
    let failure = trace["attempts"][0]["endpoint_failures"][0]
        .as_str()
        .unwrap();
    assert!(failure.contains("HTTP 429"), "{failure}");

    // every endpoint failing is one error naming them all
    let dead = format!("http://127.0.0.1:{}/v1", closed_port());
    s.client
        .batch_execute(&format!("SET sql_query_engine.llm_fallbacks = '{dead}'"))
        .unwrap();
    let error = s.query("busy question").unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "58000");
    assert!(
        message.contains("every endpoint failed") && message.contains(&dead),
        "{message}"
    );
    // and a broken setting says what is wrong
    s.client
        .batch_execute("SET sql_query_engine.llm_fallbacks = 'not-a-url'")
        .unwrap();
    let (code, message, _) = db_error(&s.query("busy question").unwrap_err());
    assert_eq!(code, "55000");
    assert!(message.contains("llm_fallbacks"), "{message}");
}

/// An endpoint that answers 503 or 502, or says when to come back (`Retry-After`), to the
/// chain's probe too, may be overloaded by the roles' own requests (Ollama's full queue, a
/// proxy's upstream): the question goes on to the fallback, but the endpoint is not remembered
/// as down, or one role's load would send every role's questions elsewhere.
#[test]
fn an_overloaded_endpoint_is_passed_over_but_not_remembered_as_down() {
    let mut s = Session::new();
    let fallback = ScriptedLlm::start();
    s.client
        .batch_execute(&format!(
            "SET sql_query_engine.llm_fallbacks = '{}'; SET sql_query_engine.vote = off;",
            fallback.url()
        ))
        .unwrap();
    let overloaded = std::sync::Arc::new(std::sync::atomic::AtomicU16::new(503));
    let status = std::sync::Arc::clone(&overloaded);
    s.llm.respond_with(move |_| {
        let code = status.load(std::sync::atomic::Ordering::SeqCst);
        (code != 0).then(|| Reply::Status(code, r#"{"error":{"message":"server busy"}}"#.into()))
    });
    let count = || Reply::sql("SELECT count(*) AS n FROM customers");
    let endpoint = |trace: &serde_json::Value| {
        trace["attempts"][0]["endpoint"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    for (code, question) in [(503, "while overloaded"), (502, "while its proxy fails")] {
        overloaded.store(code, std::sync::atomic::Ordering::SeqCst);
        fallback.on(question, vec![count()]);
        let trace = s.trace(question).unwrap();
        assert!(endpoint(&trace).starts_with(&fallback.url()), "{trace}");
        overloaded.store(0, std::sync::atomic::Ordering::SeqCst);
        let again = format!("{question}, then recovered");
        s.llm.on(&again, vec![count()]);
        let trace = s.trace(&again).unwrap();
        assert!(
            endpoint(&trace).starts_with(&s.llm.url()),
            "{code}: {trace}"
        );
    }
}

#[test]
fn the_answer_budget_ends_a_slow_repair_and_the_endpoint_stays_first() {
    let mut s = Session::new();
    let backup = ScriptedLlm::start();
    s.client
        .batch_execute(&format!(
            "SET sql_query_engine.llm_fallbacks = '{}';
             SET sql_query_engine.vote = off;
             SET sql_query_engine.answer_budget = '4s';",
            backup.url()
        ))
        .unwrap();
    // The first query fails; its repair would come after 20 s, from either endpoint.
    let slow = || {
        Reply::Slow(
            std::time::Duration::from_secs(20),
            Box::new(Reply::sql("SELECT count(*) AS n FROM customers")),
        )
    };
    s.llm.on(
        "slow to repair",
        vec![Reply::sql("SELECT nosuch FROM customers"), slow()],
    );
    backup.on("slow to repair", vec![slow()]);
    let started = std::time::Instant::now();
    let trace = s.trace("slow to repair").unwrap();
    let waited = started.elapsed();
    assert!(
        waited < std::time::Duration::from_secs(15),
        "the call waited {waited:?} for the repair"
    );
    assert_eq!(trace["status"], "error", "{trace}");
    assert_eq!(trace["out_of_time"], true, "{trace}");
    assert!(trace["llm_failure"].is_null(), "{trace}");
    assert_eq!(trace["attempts"].as_array().unwrap().len(), 1, "{trace}");
    assert_eq!(
        s.llm.requests().len(),
        2,
        "the repair was asked for, then cut"
    );
    assert_eq!(
        backup.requests().len(),
        0,
        "a request the budget cut does not send the question on to the fallback"
    );
    // A request the call's own budget cut says nothing about the endpoint: the next question
    // still goes to it first, not to the fallback.
    s.llm.on(
        "count the customers",
        vec![Reply::sql("SELECT count(*) AS n FROM customers")],
    );
    let trace = s.trace("count the customers").unwrap();
    assert_eq!(trace["status"], "ok", "{trace}");
    assert_eq!(
        trace["attempts"][0]["endpoint"],
        format!("{}/chat/completions", s.llm.url())
    );
    assert_eq!(backup.requests().len(), 0, "the fallback was asked first");
}

/// A role cannot choose which of the configured endpoints gets its questions: a timeout within
/// an `llm_timeout` it lowered for itself ends the request there (before, the question went on
/// to the fallback, a faster or more distant provider, which then answered), the breaker does
/// not hear of it (the next question goes to the primary again), and a role may not make an
/// endpoint's skipping last longer than the server says (`llm_circuit_breaker`, only lower).
#[test]
fn a_role_cannot_send_its_questions_to_the_fallback_by_lowering_its_timeout() {
    let mut s = Session::new();
    let backup = ScriptedLlm::start();
    let role = format!("steer_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {role}; GRANT SELECT ON customers TO {role};
             SET sql_query_engine.llm_fallbacks = '{}';
             SET sql_query_engine.vote = off;",
            backup.url()
        ))
        .unwrap();
    let slow = Reply::Slow(
        std::time::Duration::from_secs(5),
        Box::new(Reply::sql("SELECT count(*) AS n FROM customers")),
    );
    s.llm.on("steered", vec![slow]);
    backup.on(
        "steered",
        vec![Reply::sql("SELECT count(*) AS n FROM customers")],
    );
    s.client
        .batch_execute(&format!(
            "SET ROLE {role}; SET sql_query_engine.llm_timeout = 2000"
        ))
        .unwrap();
    let (code, message, _) = db_error(&s.query("steered").unwrap_err());
    assert_eq!(code, "58000", "{message}");
    assert!(message.contains(&s.llm.url()), "{message}");
    assert_eq!(backup.requests().len(), 0, "the fallback was never asked");
    // Nor does a request the primary refuses at once, under time the role shortened, send
    // the primary the request no role shapes (which would get only what is left of that time,
    // the role's to shape): the call's error, the primary not taken for down.
    s.llm
        .on("refused quickly", vec![Reply::Status(400, "no".into())]);
    let (code, message, _) = db_error(&s.query("refused quickly").unwrap_err());
    assert_eq!(code, "58000", "{message}");
    assert!(
        !s.llm
            .requests()
            .iter()
            .any(|r| r.last_message() == "Reply with the word OK."),
        "the endpoint was probed"
    );
    assert_eq!(backup.requests().len(), 0, "the fallback was never asked");
    // The primary is not skipped for the role's next question.
    s.client
        .batch_execute("RESET sql_query_engine.llm_timeout")
        .unwrap();
    s.llm.on(
        "asked again",
        vec![Reply::sql("SELECT count(*) AS n FROM customers")],
    );
    let trace = s.trace("asked again").unwrap();
    assert_eq!(trace["status"], "ok", "{trace}");
    assert!(
        trace["attempts"][0]["endpoint"]
            .as_str()
            .unwrap_or_default()
            .starts_with(&s.llm.url()),
        "{trace}"
    );
    // Only lower: raising the breaker's time is a superuser's.
    let error = s
        .client
        .batch_execute("SET sql_query_engine.llm_circuit_breaker = 86400")
        .unwrap_err();
    assert_eq!(db_error(&error).0, "42501", "{error}");
    s.client
        .batch_execute("SET sql_query_engine.llm_circuit_breaker = 5")
        .unwrap();
}

#[test]
fn nl_ask_returns_rows_in_the_querys_column_order() {
    let mut s = Session::new();
    s.llm.on(
        "ids and names",
        vec![Reply::sql(
            "SELECT name, customer_id, country AS a FROM customers ORDER BY customer_id LIMIT 2",
        )],
    );
    let row = s
        .client
        .query_one("SELECT nl_ask('ids and names')::text", &[])
        .unwrap();
    let answer: serde_json::Value = serde_json::from_str(row.get::<_, &str>(0)).unwrap();
    assert_eq!(answer["columns"], json!(["name", "customer_id", "a"]));
    assert_eq!(
        answer["rows"],
        json!([["Ada", 1, "GB"], ["Bruno", 2, "DE"]])
    );
    assert_eq!(answer["status"], "ok");

    // Two aliases PostgreSQL cuts to the same 63 bytes stay two columns, each with its value.
    let long = "total_revenue_from_customers_located_in_the_european_union_in_year";
    s.llm.on(
        "two long totals",
        vec![Reply::sql(&format!(
            "SELECT 1 AS {long}_2023, 2 AS {long}_2024"
        ))],
    );
    let row = s
        .client
        .query_one("SELECT nl_ask('two long totals')::text", &[])
        .unwrap();
    let answer: serde_json::Value = serde_json::from_str(row.get::<_, &str>(0)).unwrap();
    let cut = &long[..63];
    assert_eq!(answer["columns"], json!([cut, format!("{}_2", &cut[..61])]));
    assert_eq!(answer["rows"], json!([[1, 2]]));
}

#[test]
fn nl_fix_runs_the_callers_sql_first_and_repairs_it() {
    let mut s = Session::new();
    s.llm.on(
        "Fix this SQL query",
        vec![Reply::sql("SELECT name FROM customers ORDER BY name")],
    );
    let fixed: String = s
        .client
        .query_one("SELECT nl_fix('SELECT nme FROM customers')", &[])
        .unwrap()
        .get(0);
    assert_eq!(fixed, "SELECT name FROM customers ORDER BY name");
    let repair = s.llm.requests()[0].last_message();
    assert!(
        repair.contains("SELECT nme FROM customers") && repair.contains("42703"),
        "{repair}"
    );
    // SQL that works is returned as it is, without asking the model
    let same: String = s
        .client
        .query_one(
            "SELECT nl_fix('SELECT count(*) FROM orders', 'how many orders')",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(same, "SELECT count(*) FROM orders");
    assert_eq!(s.llm.requests().len(), 1);
    // a write is never "fixed"
    let error = s
        .client
        .query_one("SELECT nl_fix('DELETE FROM orders')", &[])
        .unwrap_err();
    assert_eq!(db_error(&error).0, "25006");
    let functions: Vec<String> = s
        .client
        .query("SELECT function FROM nl_history ORDER BY id", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(functions, ["nl_fix", "nl_fix"]);
}

#[test]
fn nl_cursor_gives_the_querys_own_columns_and_types() {
    let notices = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut s = Session::with_notices(std::sync::Arc::clone(&notices));
    s.llm.on(
        "orders with dates",
        vec![Reply::sql(
            "SELECT order_id, ordered_on, amount, customer_id::text AS who FROM orders ORDER BY order_id",
        )],
    );
    let mut tx = s.client.transaction().unwrap();
    let name: String = tx
        .query_one(
            "SELECT nl_cursor('orders with dates', 'orders_c')::text",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(name, "orders_c");
    let first = tx.query("FETCH 2 FROM orders_c", &[]).unwrap();
    let types: Vec<Type> = first[0]
        .columns()
        .iter()
        .map(|c| c.type_().clone())
        .collect();
    assert_eq!(types, [Type::INT4, Type::DATE, Type::NUMERIC, Type::TEXT]);
    let names: Vec<&str> = first[0].columns().iter().map(|c| c.name()).collect();
    assert_eq!(names, ["order_id", "ordered_on", "amount", "who"]);
    assert_eq!(first[0].get::<_, i32>(0), 10);
    let rest = tx.query("FETCH ALL FROM orders_c", &[]).unwrap();
    assert_eq!(rest.len(), 4, "6 rows in all, FETCHed in parts");
    // it scrolls, like any cursor over a materialized result
    let again = tx.query("FETCH ABSOLUTE 1 FROM orders_c", &[]).unwrap();
    assert_eq!(again[0].get::<_, i32>(0), 10);
    // a cursor of that name already open is an error
    s.llm.on(
        "orders with dates again",
        vec![Reply::sql("SELECT 1 AS one")],
    );
    let error = tx
        .query_one(
            "SELECT nl_cursor('orders with dates again', 'orders_c')",
            &[],
        )
        .unwrap_err();
    assert_eq!(db_error(&error).0, "42P03");
    tx.rollback().unwrap();

    // a cut result says so
    s.client
        .batch_execute("SET sql_query_engine.max_rows = 2")
        .unwrap();
    s.llm.on(
        "all orders",
        vec![Reply::sql("SELECT order_id FROM orders")],
    );
    let mut tx = s.client.transaction().unwrap();
    tx.query_one("SELECT nl_cursor('all orders')", &[]).unwrap();
    assert_eq!(tx.query("FETCH ALL FROM nl_answer", &[]).unwrap().len(), 2);
    tx.commit().unwrap();
    assert!(
        notices
            .lock()
            .unwrap()
            .iter()
            .any(|n| n.contains("cut at 2 rows")),
        "{notices:?}"
    );
}

/// A cursor keeps its rows' values as they are until FETCH prints them with their types as they
/// are then: values of a composite type that is not built in (whose owner may change its
/// fields meanwhile) or of a record (whose fields may be of such a type) are refused, and the
/// model is told to select the fields; a cursor's name
/// is at most what PostgreSQL keeps of one (63 bytes).
#[test]
fn nl_cursor_keeps_no_composite_value_and_no_name_cut_short() {
    let mut s = Session::new();
    s.client
        .batch_execute("CREATE TYPE public.pair AS (a int, b int)")
        .unwrap();
    s.llm.on(
        "orders as pairs",
        vec![
            Reply::sql("SELECT ROW(order_id, customer_id)::public.pair AS p FROM orders"),
            Reply::sql("SELECT ROW(order_id, customer_id) AS p FROM orders"),
            Reply::sql("SELECT order_id AS a, customer_id AS b FROM orders"),
        ],
    );
    s.client
        .batch_execute("SET sql_query_engine.max_repairs = 2")
        .unwrap();
    let mut tx = s.client.transaction().unwrap();
    tx.query_one("SELECT nl_cursor('orders as pairs', 'pairs')", &[])
        .unwrap();
    let rows = tx.query("FETCH ALL FROM pairs", &[]).unwrap();
    assert_eq!(rows.len(), 6);
    assert_eq!(rows[0].columns().len(), 2, "the fields, as columns");
    assert_eq!(
        s.llm.requests().len(),
        3,
        "the type's and the record's refused"
    );
    tx.rollback().unwrap();
    assert!(
        s.llm
            .last_text()
            .contains("a cursor keeps them until FETCH"),
        "{}",
        s.llm.last_text()
    );
    let long = "é".repeat(40);
    let error = s
        .client
        .query_one("SELECT nl_cursor('orders as pairs', $1)", &[&long])
        .unwrap_err();
    assert_eq!(db_error(&error).0, "42622");
}

/// A value stored out of line (TOAST) is in the cursor as it was when the answer ran: a FETCH
/// reads it after the row is deleted and its storage vacuumed by another connection (the
/// transaction writes no history, so nothing it holds keeps the row from the vacuum).
#[test]
fn nl_cursor_keeps_a_long_value_its_table_no_longer_has() {
    let mut s = Session::new();
    s.client
        .batch_execute(
            "CREATE TABLE notes (id int, body text);
             ALTER TABLE notes ALTER body SET STORAGE EXTERNAL;
             INSERT INTO notes VALUES (1, repeat('x', 20000));
             SET sql_query_engine.history = off;",
        )
        .unwrap();
    s.llm.on(
        "the body of note 1",
        vec![Reply::sql("SELECT body FROM notes WHERE id = 1")],
    );
    let mut other = s.second_connection();
    // In simple queries, as psql sends them: an extended-protocol call would keep its portal,
    // and that portal's snapshot would keep the row from the vacuum.
    let mut tx = s.client.transaction().unwrap();
    tx.batch_execute("SELECT nl_cursor('the body of note 1')")
        .unwrap();
    other.batch_execute("DELETE FROM notes").unwrap();
    other.batch_execute("VACUUM notes").unwrap();
    let bodies: Vec<usize> = tx
        .simple_query("FETCH ALL FROM nl_answer")
        .unwrap_or_else(|e| panic!("{:?}", db_error(&e)))
        .iter()
        .filter_map(|message| match message {
            postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::len),
            _ => None,
        })
        .collect();
    assert_eq!(bodies, [20000]);
    tx.commit().unwrap();
}

/// Every attempt of a cursor's question keeps its rows in the cursor's memory, spilled to
/// temporary files when large: each such store is ended once, whether its attempt lost the vote
/// (also to a candidate that repeated it), failed after its first rows, or answered; after the
/// transaction the backend keeps no temporary file, and lives on.
#[test]
fn nl_cursor_ends_every_attempts_rows_once_and_leaves_no_file() {
    let mut s = Session::new();
    s.client
        .batch_execute(
            "SET work_mem = '64kB'; SET sql_query_engine.max_rows = 100000;
             SET sql_query_engine.vote = always; SET sql_query_engine.candidates = 4",
        )
        .unwrap();
    let files = |s: &mut Session| -> i64 {
        s.client
            .query_one(
                "SELECT count(*) FROM pg_ls_tmpdir() \
                 WHERE name LIKE 'pgsql_tmp' || pg_backend_pid() || '.%'",
                &[],
            )
            .unwrap()
            .get(0)
    };
    let all = "SELECT g FROM generate_series(1, 20000) AS g";
    let even = "SELECT g FROM generate_series(1, 20000) AS g WHERE g % 2 = 0";
    let choice = |sql: &str| json!({ "sql": sql }).to_string();
    // The first query is repeated by a candidate, and both lose to three others.
    s.llm.on(
        "numbers",
        vec![
            Reply::sql(all),
            Reply::Choices(vec![choice(all), choice(even), choice(even), choice(even)]),
        ],
    );
    let mut tx = s.client.transaction().unwrap();
    tx.query_one("SELECT nl_cursor('numbers', 'numbers_c')", &[])
        .unwrap();
    assert_eq!(
        tx.query("FETCH ALL FROM numbers_c", &[]).unwrap().len(),
        10000
    );
    tx.commit().unwrap();
    assert_eq!(files(&mut s), 0);

    // An attempt that fails after its first 14,999 rows, then its repair.
    s.client
        .batch_execute("SET sql_query_engine.vote = off")
        .unwrap();
    s.llm.on(
        "inverses",
        vec![
            Reply::sql("SELECT 1 / (g - 15000) AS x FROM generate_series(1, 20000) AS g"),
            Reply::sql(even),
        ],
    );
    let mut tx = s.client.transaction().unwrap();
    tx.query_one("SELECT nl_cursor('inverses', 'inverses_c')", &[])
        .unwrap();
    assert_eq!(
        tx.query("FETCH ALL FROM inverses_c", &[]).unwrap().len(),
        10000
    );
    tx.commit().unwrap();
    assert_eq!(
        files(&mut s),
        0,
        "the failed attempt's rows were left on disk"
    );

    // However high the caller sets work_mem, a store keeps at most 8 MB in memory: the rest
    // is in a temporary file while the cursor is open.
    s.client
        .batch_execute("SET work_mem = '1GB'; SET sql_query_engine.max_result_bytes = '64MB'")
        .unwrap();
    s.llm.on(
        "ten megabytes",
        vec![Reply::sql(
            "SELECT repeat('x', 1000) AS x FROM generate_series(1, 10000)",
        )],
    );
    let mut tx = s.client.transaction().unwrap();
    tx.query_one("SELECT nl_cursor('ten megabytes', 'large_c')", &[])
        .unwrap_or_else(|e| panic!("{:?}", db_error(&e)));
    let spilled: i64 = tx
        .query_one(
            "SELECT count(*) FROM pg_ls_tmpdir() \
             WHERE name LIKE 'pgsql_tmp' || pg_backend_pid() || '.%'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(spilled > 0, "the rows stayed in memory");
    tx.commit().unwrap();
    assert_eq!(files(&mut s), 0);
}

/// The `answer` of a `CALL nl_call(...)` statement (simple protocol: jsonb comes back as text).
fn call(
    client: &mut postgres::Client,
    statement: &str,
) -> Result<serde_json::Value, postgres::Error> {
    let messages = client.simple_query(statement)?;
    let text = messages
        .iter()
        .find_map(|m| match m {
            postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
            _ => None,
        })
        .expect("CALL returns its INOUT parameter");
    Ok(serde_json::from_str(&text).unwrap())
}

/// One look at a backend in `pg_stat_activity`: state, query, backend_xmin, backend_xid,
/// wait_event_type.
type Sample = (
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// The samples taken while the backend ran `nl_call` and waited on the extension's own wait
/// (the model): what it did before and after, on a slow machine too, is left out.
fn waiting_in_nl_call(samples: &[Sample]) -> Vec<&Sample> {
    samples
        .iter()
        .filter(|(state, query, _, _, wait)| {
            state == "active" && query.contains("nl_call") && wait.as_deref() == Some("Extension")
        })
        .collect()
}

/// What another backend sees of `pid` while it waits for a slow model, sampled every 100 ms
/// for `span`.
fn watch_backend(
    s: &Session,
    pid: i32,
    span: std::time::Duration,
) -> std::thread::JoinHandle<Vec<Sample>> {
    let mut watcher = s.second_connection();
    std::thread::spawn(move || {
        let started = std::time::Instant::now();
        let mut samples = Vec::new();
        while started.elapsed() < span {
            std::thread::sleep(std::time::Duration::from_millis(100));
            let row = watcher
                .query_one(
                    "SELECT state, query, backend_xmin::text, backend_xid::text, wait_event_type
                     FROM pg_stat_activity WHERE pid = $1",
                    &[&pid],
                )
                .unwrap();
            samples.push((row.get(0), row.get(1), row.get(2), row.get(3), row.get(4)));
        }
        samples
    })
}

#[test]
fn nl_call_holds_no_snapshot_while_the_model_thinks_and_nl_ask_does() {
    let mut s = Session::new();
    let slow = |sql: &str| {
        Reply::Slow(
            std::time::Duration::from_millis(2000),
            Box::new(Reply::sql(sql)),
        )
    };
    // The first query fails, so the slow model call is a repair after the sandbox ran: the
    // transaction is released again after the work in between.
    s.llm.on(
        "slow count",
        vec![
            Reply::sql("SELECT count(nickname) AS n FROM customers"),
            slow("SELECT count(*) AS n FROM customers"),
        ],
    );
    let pid: i32 = s
        .client
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    let watcher = watch_backend(&s, pid, std::time::Duration::from_millis(4000));
    let answer = call(&mut s.client, "CALL nl_call('slow count')").unwrap();
    assert_eq!(answer["status"], "ok", "{answer}");
    assert_eq!(answer["rows"], json!([[4]]), "{answer}");
    assert_eq!(answer["attempts"].as_array().unwrap().len(), 2, "{answer}");
    let samples = watcher.join().unwrap();
    let waiting = waiting_in_nl_call(&samples);
    assert!(waiting.len() >= 5, "{samples:?}");
    assert!(
        waiting
            .iter()
            .all(|(_, _, xmin, xid, _)| xmin.is_none() && xid.is_none()),
        "no snapshot and no transaction id while the model thinks: {samples:?}"
    );

    // nl_ask, a function, runs under its statement's snapshot: PostgreSQL keeps it.
    s.llm.on(
        "slow again",
        vec![slow("SELECT count(*) AS n FROM customers")],
    );
    let watcher = watch_backend(&s, pid, std::time::Duration::from_millis(1200));
    let asked: serde_json::Value = serde_json::from_str(
        s.client
            .query_one("SELECT nl_ask('slow again')::text", &[])
            .unwrap()
            .get(0),
    )
    .unwrap();
    assert_eq!(asked["rows"], json!([[4]]));
    let samples = watcher.join().unwrap();
    assert!(
        samples
            .iter()
            .any(|(state, _, xmin, ..)| state == "active" && xmin.is_some()),
        "{samples:?}"
    );

    // In a transaction block the caller owns the snapshot: nl_call still answers, as nl_ask.
    s.llm.on(
        "in a block",
        vec![Reply::sql("SELECT count(*) AS n FROM customers")],
    );
    let answer = call(&mut s.client, "BEGIN; CALL nl_call('in a block'); COMMIT;").unwrap();
    assert_eq!(answer["rows"], json!([[4]]));

    // The conversation so far may come with the call, as with nl_ask.
    s.llm.on(
        "and in Germany",
        vec![Reply::sql(
            "SELECT count(*) AS n FROM customers WHERE country = 'DE'",
        )],
    );
    let answer = call(
        &mut s.client,
        "CALL nl_call('and in Germany', turns => \
         '[{\"question\": \"how many customers\", \"sql\": \"SELECT count(*) FROM customers\"}]')",
    )
    .unwrap();
    assert_eq!(answer["rows"], json!([[2]]));
    assert_eq!(answer["context_turns"], 1);
    assert!(s
        .llm
        .requests()
        .last()
        .unwrap()
        .text()
        .contains("how many customers"));

    // A failure is the usual ERROR, and the session is usable afterwards.
    let error = call(&mut s.client, "CALL nl_call('')").unwrap_err();
    assert_eq!(db_error(&error).0, "22023");
    assert_eq!(s.scalar_i64("SELECT 1::bigint"), 1);
}

/// Roles for a client that logs in as an authenticator and asks as the roles it may become
/// (the gateway's pattern): `(authenticator, analyst, stranger)`, where only `analyst` may read
/// the customers and the authenticator may become it but not `stranger`. The model is set for
/// the database, as a superuser sets it.
fn authenticator_roles(s: &mut Session, tag: &str) -> (String, String, String) {
    let id = format!("{tag}_{}", std::process::id());
    let (authenticator, analyst, stranger) = (
        format!("auth_{id}"),
        format!("analyst_{id}"),
        format!("stranger_{id}"),
    );
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {authenticator} LOGIN NOINHERIT; CREATE ROLE {analyst};
             CREATE ROLE {stranger}; GRANT SELECT ON customers TO {analyst}, {stranger};
             GRANT {analyst} TO {authenticator};
             ALTER DATABASE {db} SET sql_query_engine.llm_url = '{url}';
             ALTER DATABASE {db} SET sql_query_engine.vote = off;",
            db = s.database,
            url = s.llm.url()
        ))
        .unwrap();
    (authenticator, analyst, stranger)
}

/// Model requests a cancelled call leaves behind count against the role it ran as, also
/// those `nl_call` starts while its transaction is released (the current user is then the
/// login role's): what one role left behind must not hold up another behind the same login.
#[test]
fn requests_a_cancelled_nl_call_leaves_behind_count_against_its_role_not_the_login_role() {
    let mut s = Session::new();
    let (authenticator, analyst, stranger) = authenticator_roles(&mut s, "helpers");
    s.client
        .batch_execute(&format!("GRANT {stranger} TO {authenticator}"))
        .unwrap();
    s.llm.on(
        "a slow question",
        (0..4)
            .map(|_| {
                Reply::Slow(
                    std::time::Duration::from_secs(20),
                    Box::new(Reply::sql("SELECT 1 AS one")),
                )
            })
            .collect(),
    );
    s.llm
        .on("a quick question", vec![Reply::sql("SELECT 2 AS two")]);
    let mut client = sql_query_engine_e2e::cluster().connect_as(&s.database, &authenticator);
    client
        .batch_execute("SET statement_timeout = '1s'")
        .unwrap();
    // Four calls as the analyst, each cancelled while its model request (good for 30 s) runs:
    // four requests left, the most one role may have.
    for _ in 0..4 {
        let error = call(
            &mut client,
            &format!("CALL nl_call('a slow question', run_as => '{analyst}')"),
        )
        .unwrap_err();
        assert_eq!(db_error(&error).0, "57014", "{error}");
    }
    client
        .batch_execute("SET statement_timeout = 0; SET sql_query_engine.llm_timeout = 3000")
        .unwrap();
    // Another role behind the same login is not held up by them.
    let answer = call(
        &mut client,
        &format!("CALL nl_call('a quick question', run_as => '{stranger}')"),
    )
    .unwrap_or_else(|e| panic!("held up by the analyst's requests: {e}"));
    assert_eq!(answer["rows"], json!([[2]]), "{answer}");
    // Positive control: the analyst itself is.
    let held = call(
        &mut client,
        &format!("CALL nl_call('a quick question', run_as => '{analyst}')"),
    );
    assert!(held.is_err(), "{held:?}");
}

/// `nl_call` runs a question as `run_as` only when that role may call it too: a DBA who gives
/// EXECUTE to some roles alone, and to the login role, lends it to no other role the login
/// role may become.
#[test]
fn nl_call_runs_as_a_role_only_when_that_role_may_call_it() {
    let mut s = Session::new();
    let (authenticator, analyst, _) = authenticator_roles(&mut s, "execute");
    let procedure = "nl_call(text, text, jsonb, jsonb, text, boolean)";
    s.client
        .batch_execute(&format!(
            "REVOKE EXECUTE ON PROCEDURE {procedure} FROM PUBLIC;
             GRANT EXECUTE ON PROCEDURE {procedure} TO {authenticator};"
        ))
        .unwrap();
    s.llm.on(
        "customers, asked as the analyst",
        vec![Reply::sql("SELECT 1 AS one")],
    );
    let mut client = sql_query_engine_e2e::cluster().connect_as(&s.database, &authenticator);
    let ask = format!("CALL nl_call('customers, asked as the analyst', run_as => '{analyst}')");
    let error = call(&mut client, &ask).unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "42501", "{message}");
    assert!(message.contains("may not call it"), "{message}");
    assert!(s.llm.requests().is_empty(), "the model was asked");
    // Positive control: once the analyst may call it, the call runs as the analyst.
    s.client
        .batch_execute(&format!(
            "GRANT EXECUTE ON PROCEDURE {procedure} TO {analyst}"
        ))
        .unwrap();
    let answer = call(&mut client, &ask).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(answer["rows"], json!([[1]]), "{answer}");
}

#[test]
fn nl_call_runs_as_the_role_it_is_given_for_the_call_only() {
    let mut s = Session::new();
    let (authenticator, analyst, stranger) = authenticator_roles(&mut s, "runas");
    let mut client = sql_query_engine_e2e::cluster().connect_as(&s.database, &authenticator);
    // Alone, the login role may read nothing.
    let denied = client
        .query_one("SELECT count(*) FROM customers", &[])
        .unwrap_err();
    assert_eq!(db_error(&denied).0, "42501");

    // The first query fails and the repair comes after a slow model call, for which the
    // transaction is committed: the repair (a new transaction) still runs as the role.
    s.llm.on(
        "customers, as the analyst",
        vec![
            Reply::sql("SELECT count(nickname) AS n FROM customers"),
            Reply::Slow(
                std::time::Duration::from_millis(2000),
                Box::new(Reply::sql("SELECT count(*) AS n FROM customers")),
            ),
        ],
    );
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    let watcher = watch_backend(&s, pid, std::time::Duration::from_millis(4000));
    let answer = call(
        &mut client,
        &format!("CALL nl_call('customers, as the analyst', run_as => '{analyst}')"),
    )
    .unwrap();
    assert_eq!(answer["rows"], json!([[4]]), "{answer}");
    assert_eq!(answer["attempts"].as_array().unwrap().len(), 2, "{answer}");
    let samples = watcher.join().unwrap();
    let waiting = waiting_in_nl_call(&samples);
    assert!(waiting.len() >= 5, "{samples:?}");
    assert!(
        waiting
            .iter()
            .all(|(_, _, xmin, xid, _)| xmin.is_none() && xid.is_none()),
        "no snapshot while the model thinks: {samples:?}"
    );
    // The history and the audit name the role the call ran as; the connection is the login
    // role's again, outside and inside a transaction block.
    let recorded: String = s
        .client
        .query_one(
            "SELECT role_id::regrole::text FROM nl_history \
             WHERE question = 'customers, as the analyst'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(recorded, analyst);
    let who: String = client
        .query_one("SELECT current_user::text", &[])
        .unwrap()
        .get(0);
    assert_eq!(who, authenticator);
    s.llm.on(
        "in a block, as the analyst",
        vec![Reply::sql("SELECT count(*) AS n FROM customers")],
    );
    let messages = client
        .simple_query(&format!(
            "BEGIN; CALL nl_call('in a block, as the analyst', run_as => '{analyst}'); \
             SELECT current_user; COMMIT;"
        ))
        .unwrap();
    let rows: Vec<String> = messages
        .iter()
        .filter_map(|m| match m {
            postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
            _ => None,
        })
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(rows[0].contains("\"rows\": [[4]]"), "{rows:?}");
    assert_eq!(rows[1], authenticator, "the role ended with the call");
    // And called from a procedure's or a DO block's code (a non-atomic context of the
    // caller's): the call runs as the role, the code after it as the login role again, and
    // nothing of the caller's transaction is committed by the call.
    s.llm.on(
        "in a DO block, as the analyst",
        vec![Reply::sql("SELECT count(*) AS n FROM customers")],
    );
    client
        .batch_execute("CREATE TEMP TABLE after_the_call (who text)")
        .unwrap();
    // Alone in its statement, so that the DO block runs non-atomically.
    client
        .batch_execute(&format!(
            "DO $$ DECLARE a jsonb; BEGIN
                 CALL nl_call('in a DO block, as the analyst', NULL, a, NULL, '{analyst}');
                 INSERT INTO after_the_call SELECT current_user;
             END $$"
        ))
        .unwrap();
    let after: String = client
        .query_one("SELECT who FROM after_the_call", &[])
        .unwrap()
        .get(0);
    assert_eq!(after, authenticator, "the role outlived the call");

    // A role the login role may not become is refused as SET ROLE refuses it, before the model
    // is asked anything.
    let asked_before = s.llm.requests().len();
    let refused = call(
        &mut client,
        &format!("CALL nl_call('customers, as a stranger', run_as => '{stranger}')"),
    )
    .unwrap_err();
    let (sqlstate, message, _) = db_error(&refused);
    assert_eq!(sqlstate, "42501", "{message}");
    assert!(message.contains("set role"), "{message}");
    assert_eq!(s.llm.requests().len(), asked_before);
}

#[test]
fn code_a_generated_query_runs_cannot_become_another_role_the_login_role_may_become() {
    let mut s = Session::new();
    let (authenticator, analyst, _) = authenticator_roles(&mut s, "restricted");
    let id = std::process::id();
    let (other, owner) = (format!("other_{id}"), format!("owner_{id}"));
    // A role the login role may also become, with a secret of its own; and a role (no token's)
    // that owns a view the analyst may read, whose function switches to that other role.
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {other}; GRANT {other} TO {authenticator};
             CREATE TABLE other_secrets (v text); INSERT INTO other_secrets VALUES ('only-for-other');
             GRANT SELECT ON other_secrets TO {other};
             CREATE ROLE {owner}; GRANT CREATE ON SCHEMA public TO {owner};
             SET ROLE {owner};
             CREATE FUNCTION public.peek_{id}() RETURNS text LANGUAGE plpgsql AS $$
                 DECLARE r text;
                 BEGIN
                     PERFORM set_config('role', '{other}', true);
                     SELECT string_agg(v, ',') INTO r FROM public.other_secrets;
                     RETURN r;
                 END $$;
             CREATE VIEW public.notes_{id} AS SELECT public.peek_{id}() AS note;
             GRANT SELECT ON public.notes_{id} TO {analyst};
             RESET ROLE;"
        ))
        .unwrap();
    let mut client = sql_query_engine_e2e::cluster().connect_as(&s.database, &authenticator);
    // Positive control: read directly as the analyst, the view's code becomes the other role.
    client
        .batch_execute(&format!("SET ROLE {analyst}"))
        .unwrap();
    let direct: String = client
        .query_one(&format!("SELECT note FROM public.notes_{id}"), &[])
        .unwrap()
        .get(0);
    assert_eq!(direct, "only-for-other");
    client.batch_execute("RESET ROLE").unwrap();

    s.llm.on(
        "the notes, as the analyst",
        vec![Reply::sql(&format!("SELECT note FROM public.notes_{id}")); 5],
    );
    let answered = call(
        &mut client,
        &format!("CALL nl_call('the notes, as the analyst', run_as => '{analyst}')"),
    );
    let text = match answered {
        Ok(answer) => answer.to_string(),
        Err(error) => db_error(&error).1,
    };
    assert!(!text.contains("only-for-other"), "{text}");
    assert!(text.contains("security-restricted operation"), "{text}");
}

/// A failure a role's own request caused at the primary (a 400: a prompt too long for its
/// context, a filter) is that call's error: the question is not sent on to the fallback (a role
/// would choose where its questions go by shaping them), and the primary is not skipped, for
/// that role or any other, also through the gateway's `nl_call` (the model is asked between
/// transactions, as the session user).
#[test]
fn what_one_role_made_an_endpoint_refuse_is_that_calls_error_alone() {
    let mut s = Session::new();
    let fallback = ScriptedLlm::start();
    let db = s.database.clone();
    let (a, b) = (format!("first_{db}"), format!("second_{db}"));
    let (c, d) = (format!("third_{db}"), format!("fourth_{db}"));
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {a}; CREATE ROLE {b}; CREATE ROLE {c}; CREATE ROLE {d};
             GRANT SELECT ON customers TO {a}, {b}, {c}, {d};
             SET sql_query_engine.llm_fallbacks = '{}';",
            fallback.url()
        ))
        .unwrap();
    let count = || Reply::sql("SELECT count(*) AS n FROM customers");
    for question in [
        "a question the primary refuses",
        "another question the primary refuses",
    ] {
        s.llm.on(question, vec![Reply::Status(400, "no".into())]);
        fallback.on(question, vec![count()]);
    }
    for question in [
        "a question of the role",
        "a question of the second role",
        "another question of the role",
        "another question of the second role",
    ] {
        s.llm.on(question, vec![count()]);
    }
    let as_role = |s: &mut Session, role: &str, question: &str| {
        s.client.batch_execute(&format!("SET ROLE {role}")).unwrap();
        let row = s
            .client
            .query_one("SELECT nl_trace($1)::text", &[&question]);
        s.client.batch_execute("RESET ROLE").unwrap();
        row.map(|row| {
            let trace: serde_json::Value = serde_json::from_str(row.get::<_, &str>(0)).unwrap();
            trace["attempts"][0]["endpoint"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
    };
    let error = as_role(&mut s, &a, "a question the primary refuses").unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "58000", "{message}");
    assert!(message.contains("HTTP 400"), "{message}");
    assert_eq!(fallback.requests().len(), 0, "not sent on to the fallback");
    for (role, question) in [
        (&a, "a question of the role"),
        (&b, "a question of the second role"),
    ] {
        let endpoint = as_role(&mut s, role, question).unwrap();
        assert!(endpoint.starts_with(&s.llm.url()), "{endpoint}");
    }
    // Also as the gateway asks, through nl_call's run_as, with two roles that asked nothing.
    let mut called = |role: &str, question: &str| {
        s.client
            .query_one(
                "CALL nl_call($1, NULL, NULL, NULL, $2, false)",
                &[&question, &role],
            )
            .map(|row| {
                let answer: serde_json::Value = row.get(0);
                answer["attempts"][0]["endpoint"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
    };
    let error = called(&c, "another question the primary refuses").unwrap_err();
    assert_eq!(db_error(&error).0, "58000", "{error}");
    assert_eq!(fallback.requests().len(), 0, "not sent on to the fallback");
    for (role, question) in [
        (&c, "another question of the role"),
        (&d, "another question of the second role"),
    ] {
        let endpoint = called(role, question).unwrap();
        assert!(endpoint.starts_with(&s.llm.url()), "{endpoint}");
    }
}

/// Sends `statements` as `user` as one pipeline of the extended protocol: each its Parse, Bind
/// and Execute, one Sync after the last, as libpq's pipeline mode and JDBC's batches send them
/// (no client library here sends them so). What came back, in order: the first column of each
/// row, and `ERROR <sqlstate>: <message>` for an error.
fn pipelined(database: &str, user: &str, statements: &[&str]) -> Vec<String> {
    use std::io::{Read, Write};
    let cluster = sql_query_engine_e2e::cluster();
    let path = format!("{}/.s.PGSQL.{}", cluster.host, cluster.port);
    let mut socket = std::os::unix::net::UnixStream::connect(&path).unwrap();
    let message = |kind: Option<u8>, body: &[u8]| -> Vec<u8> {
        let mut out: Vec<u8> = kind.into_iter().collect();
        out.extend(u32::try_from(body.len() + 4).unwrap().to_be_bytes());
        out.extend(body);
        out
    };
    let mut startup = 196_608u32.to_be_bytes().to_vec();
    for (key, value) in [("user", user), ("database", database)] {
        startup.extend(format!("{key}\0{value}\0").as_bytes());
    }
    startup.push(0);
    socket.write_all(&message(None, &startup)).unwrap();
    let read = |socket: &mut std::os::unix::net::UnixStream| -> (u8, Vec<u8>) {
        let mut head = [0u8; 5];
        socket.read_exact(&mut head).unwrap();
        let length = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let mut body = vec![0u8; length - 4];
        socket.read_exact(&mut body).unwrap();
        (head[0], body)
    };
    while read(&mut socket).0 != b'Z' {}
    let mut batch = Vec::new();
    for statement in statements {
        batch.extend(message(
            Some(b'P'),
            &[b"\0", statement.as_bytes(), b"\0\0\0"].concat(),
        ));
        batch.extend(message(Some(b'B'), b"\0\0\0\0\0\0\0\0"));
        batch.extend(message(Some(b'E'), b"\0\0\0\0\0"));
    }
    batch.extend(message(Some(b'S'), b""));
    socket.write_all(&batch).unwrap();
    let mut said = Vec::new();
    loop {
        match read(&mut socket) {
            (b'Z', _) => break,
            (b'D', body) => {
                let length = i32::from_be_bytes([body[2], body[3], body[4], body[5]]);
                let text = match usize::try_from(length) {
                    Ok(length) => String::from_utf8_lossy(&body[6..6 + length]).to_string(),
                    Err(_) => "NULL".to_string(),
                };
                said.push(text);
            }
            (b'E', body) => {
                let field = |code: u8| -> String {
                    body.split(|&b| b == 0)
                        .find(|f| f.first() == Some(&code))
                        .map(|f| String::from_utf8_lossy(&f[1..]).to_string())
                        .unwrap_or_default()
                };
                said.push(format!("ERROR {}: {}", field(b'C'), field(b'M')));
            }
            _ => {}
        }
    }
    let _ = socket.write_all(&message(Some(b'X'), b""));
    said
}

/// A client that sets the role for its transaction and calls `nl_call` in the same pipeline
/// (no Sync between): PostgreSQL calls that CALL non-atomic, but committing before the model
/// call would undo the role the client set, and the query would run as the login role (which
/// may read what the role may not), so the call runs in the client's transaction.
#[test]
fn nl_call_pipelined_after_the_role_is_set_for_the_transaction_runs_as_that_role() {
    let mut s = Session::new();
    let (authenticator, analyst, _) = authenticator_roles(&mut s, "pipeline");
    s.llm.on(
        "who asks",
        vec![Reply::sql("SELECT current_user::text AS who")],
    );
    let said = pipelined(
        &s.database,
        &authenticator,
        &[
            &format!("SELECT pg_catalog.set_config('role', '{analyst}', true)"),
            "CALL nl_call('who asks')",
        ],
    );
    assert_eq!(said.len(), 2, "{said:?}");
    let answer: serde_json::Value = serde_json::from_str(&said[1]).unwrap_or_else(|_| {
        panic!("{said:?}");
    });
    assert_eq!(answer["rows"], json!([[analyst]]), "{answer}");
    // So does one whose own arguments set the role for the transaction.
    s.llm.on(
        "who asks again",
        vec![Reply::sql("SELECT current_user::text AS who")],
    );
    let mut client = sql_query_engine_e2e::cluster().connect_as(&s.database, &authenticator);
    let answer = call(
        &mut client,
        &format!(
            "CALL nl_call('who asks again' || left(pg_catalog.set_config('role', '{analyst}', true), 0))"
        ),
    )
    .unwrap();
    assert_eq!(answer["rows"], json!([[analyst]]), "{answer}");
}

/// A NOTICE that cannot be sent (the model's SQL holds a character the client's encoding
/// lacks) is an ERROR that ends the call with all of its guards run: before, PostgreSQL's
/// ERROR jumped past them, and the call's state stayed on the connection, so that a later
/// `nl_call` in a `DO` block committed the block's own work halfway (a row of a block that
/// then failed stayed).
#[test]
fn a_notice_that_cannot_be_sent_leaves_nothing_of_the_call_behind() {
    let mut s = Session::new();
    s.llm
        .on("snowmen", vec![Reply::sql("SELECT '☃' AS snowman")]);
    s.llm.on(
        "how many customers",
        vec![Reply::sql("SELECT count(*) AS n FROM customers")],
    );
    s.client
        .batch_execute(
            "CREATE TABLE marks (n int);
             SET client_encoding = 'LATIN1'; SET sql_query_engine.progress = on",
        )
        .unwrap();
    let error = call(&mut s.client, "CALL nl_call('snowmen')").unwrap_err();
    assert_eq!(db_error(&error).0, "22P05", "{error}");
    s.client
        .batch_execute("SET client_encoding = 'UTF8'; SET sql_query_engine.progress = off")
        .unwrap();
    let error = s
        .client
        .batch_execute(
            "DO $$ DECLARE answer jsonb; BEGIN INSERT INTO marks VALUES (1);
                    CALL nl_call('how many customers', NULL, answer);
                    RAISE EXCEPTION 'undone'; END $$",
        )
        .unwrap_err();
    assert!(db_error(&error).1.contains("undone"), "{error:?}");
    assert_eq!(s.scalar_i64("SELECT count(*) FROM marks"), 0);
    // An ERROR that carries the model's words (the refused SQL) keeps its SQLSTATE for such
    // a client too: the character is written as an escape, not left to fail the conversion
    // (22P05 in the ERROR's place).
    s.llm.on(
        "melt the snowmen",
        vec![Reply::sql("DELETE FROM orders WHERE amount > length('☃')")],
    );
    s.client
        .batch_execute("SET client_encoding = 'LATIN1'")
        .unwrap();
    let error = s.query("melt the snowmen").unwrap_err();
    let (code, _, detail) = db_error(&error);
    assert_eq!(code, "25006", "{error}");
    assert!(detail.contains("\\u{2603}"), "{detail}");
}

/// The schema is read whatever the client's encoding, also after a grant to a role whose name
/// that encoding lacks: the grants are read, and fingerprinted, as the server's text (`textsend`
/// converted them to the client's, and every question of such a client failed with 22P05).
#[test]
fn a_grant_to_a_role_a_clients_encoding_cannot_name_leaves_its_questions_alone() {
    let mut s = Session::new();
    let grantee = format!("Оператор_{}", s.database);
    s.client.query_one("SELECT nl_schema()", &[]).unwrap();
    s.client
        .batch_execute(&format!(
            "CREATE ROLE \"{grantee}\"; GRANT SELECT ON customers TO \"{grantee}\";
             SET client_encoding = 'LATIN1'"
        ))
        .unwrap();
    s.llm.on(
        "count them in Latin-1",
        vec![Reply::sql("SELECT count(*) AS n FROM customers")],
    );
    let trace = s.trace("count them in Latin-1").unwrap();
    assert_eq!(trace["status"], "ok", "{trace}");
}
