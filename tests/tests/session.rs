//! Conversations, progress, Redis and history end to end, with a real redis-server.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use sql_query_engine_e2e::redis::{silent_server, RedisServer};
use sql_query_engine_e2e::{db_error, Reply, Session};

fn ask_in(s: &mut Session, session: &str, question: &str, sql: &str) -> Vec<Value> {
    s.llm.on(question, vec![Reply::sql(sql)]);
    let rows = s
        .client
        .query("SELECT nl_query($1, $2)::text", &[&question, &session])
        .unwrap();
    rows.iter()
        .map(|r| serde_json::from_str(r.get::<_, &str>(0)).unwrap())
        .collect()
}

/// The Redis key of `role` for `what` (`kind:name`) in the current database: namespaced by
/// cluster (system identifier), database and role (OIDs).
fn role_key(client: &mut postgres::Client, role: &str, what: &str) -> String {
    let row = client
        .query_one(
            "SELECT (SELECT system_identifier::text FROM pg_control_system()),
                    (SELECT oid FROM pg_database WHERE datname = current_database()),
                    (SELECT oid FROM pg_roles WHERE rolname = $1)",
            &[&role],
        )
        .unwrap();
    let (system, database, role): (String, u32, u32) = (row.get(0), row.get(1), row.get(2));
    format!("sql_query_engine:{system}:{database}:{role}:{what}")
}

/// Redis keeps sessions where the extension's table cannot be written: here, read-only
/// transactions (as on a hot standby).
fn use_redis(client: &mut postgres::Client, url: &str) {
    client
        .batch_execute(&format!(
            "SET sql_query_engine.redis_url = '{url}'; SET default_transaction_read_only = on;"
        ))
        .unwrap();
}

#[test]
fn a_follow_up_sees_the_earlier_question_and_its_final_sql_and_nothing_else_does() {
    let mut s = Session::new();
    s.llm.on(
        "orders per customer",
        vec![
            Reply::sql("SELECT nme, count(*) FROM customers GROUP BY 1"),
            Reply::sql("SELECT c.name, count(*) AS n FROM customers c JOIN orders o USING (customer_id) GROUP BY 1"),
        ],
    );
    s.client
        .query("SELECT nl_query('orders per customer', 'conv-1')", &[])
        .unwrap();
    ask_in(&mut s, "conv-1", "now only for Ada", "SELECT 1 AS one");
    let follow_up = s.llm.last_text();
    assert!(follow_up.contains("orders per customer"), "{follow_up}");
    assert!(
        follow_up.contains("JOIN orders o USING (customer_id)"),
        "the final SQL"
    );
    assert!(!follow_up.contains("SELECT nme"), "not the first draft");

    ask_in(&mut s, "conv-2", "another conversation", "SELECT 1 AS one");
    assert!(!s.llm.last_text().contains("orders per customer"));
    s.llm.on("stateless", vec![Reply::sql("SELECT 1 AS one")]);
    s.query("stateless").unwrap();
    assert!(!s.llm.last_text().contains("orders per customer"));

    let role = format!("other_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {role}; GRANT SELECT ON customers TO {role}; SET ROLE {role}"
        ))
        .unwrap();
    ask_in(
        &mut s,
        "conv-1",
        "same session name, other role",
        "SELECT 1 AS one",
    );
    assert!(!s.llm.last_text().contains("orders per customer"));
    s.client.batch_execute("RESET ROLE").unwrap();

    s.client
        .batch_execute("SELECT nl_session_reset('conv-1')")
        .unwrap();
    ask_in(&mut s, "conv-1", "after the reset", "SELECT 1 AS one");
    assert!(!s.llm.last_text().contains("orders per customer"));
}

#[test]
fn a_session_keeps_a_bounded_number_of_turns() {
    let mut s = Session::new();
    s.client
        .batch_execute("SET sql_query_engine.session_turns = 2")
        .unwrap();
    for i in 0..4 {
        ask_in(
            &mut s,
            "bounded",
            &format!("question number {i}"),
            &format!("SELECT {i} AS n"),
        );
    }
    let last = s.llm.last_text();
    assert!(last.contains("question number 1") && last.contains("question number 2"));
    assert!(!last.contains("question number 0"));
}

/// A role may add rows of its own to `nl_sessions`, and every backend that serves the session
/// reads its newest turns whole: a turn is bounded where it is written (a question's 40,000
/// bytes, its SQL's 100,000, whatever they compress to), and the conversation goes on.
#[test]
fn a_session_turn_too_large_cannot_be_written() {
    let mut s = Session::new();
    let role = format!("talker_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {role}; GRANT SELECT ON customers TO {role}; SET ROLE {role}"
        ))
        .unwrap();
    ask_in(
        &mut s,
        "huge",
        "the first question of a huge session",
        "SELECT 1 AS one",
    );
    s.client
        .batch_execute("SET default_toast_compression = pglz")
        .unwrap();
    for huge in [
        "INSERT INTO nl_sessions (session, question) VALUES ('huge', repeat('a', 40001))",
        "INSERT INTO nl_sessions (session, question, sql) VALUES ('huge', 'q', repeat('s', 100001))",
    ] {
        let error = s.client.batch_execute(huge).unwrap_err();
        assert_eq!(db_error(&error).0, "23514", "{huge}: {error}");
    }
    ask_in(&mut s, "huge", "the next question", "SELECT 2 AS two");
    assert!(s
        .llm
        .last_text()
        .contains("the first question of a huge session"));
}

/// A request retried after a failure may have been recorded already (a gateway or server lost
/// mid-call): in every store, a question asked again replaces its earlier turn instead of
/// pushing the older turns out of the last `session_turns`.
#[test]
fn a_question_asked_again_is_kept_once_and_pushes_no_earlier_turn_out() {
    let redis = RedisServer::start();
    for store in ["table", "redis", "memory"] {
        let mut s = Session::new();
        s.client
            .batch_execute("SET sql_query_engine.session_turns = 3")
            .unwrap();
        match store {
            "redis" => use_redis(&mut s.client, &redis.url()),
            "memory" => s
                .client
                .batch_execute("SET default_transaction_read_only = on")
                .unwrap(),
            _ => {}
        }
        let used: String = s
            .client
            .query_one("SELECT nl_session_store()", &[])
            .unwrap()
            .get(0);
        assert_eq!(used, store);
        // Earlier turns are in every request: the model answers what the last message asks.
        let sql = Arc::new(Mutex::new(String::new()));
        let answer = Arc::clone(&sql);
        s.llm
            .respond_with(move |_| Some(Reply::sql(&answer.lock().unwrap())));
        let mut ask = |question: &str, answer: &str| {
            *sql.lock().unwrap() = answer.to_string();
            s.client
                .query("SELECT nl_query($1, 'retried')", &[&question])
                .unwrap();
            s.llm.last_text()
        };
        ask("first question", "SELECT 1 AS n");
        for _ in 0..3 {
            ask("second question", "SELECT 2 AS n");
        }
        let told = ask("third question", "SELECT 3 AS n");
        assert!(told.contains("first question"), "{store}: {told}");
        assert_eq!(
            told.matches("second question").count(),
            1,
            "{store}: {told}"
        );
        // An earlier question asked again moves to the end, with the SQL that answered it now.
        ask("first question", "SELECT 4 AS n");
        let told = ask("fourth question", "SELECT 5 AS n");
        let at = |text: &str| told.find(text).unwrap_or(usize::MAX);
        assert!(
            at("third question") < at("first question") && at("SELECT 4 AS n") < usize::MAX,
            "{store}: {told}"
        );
        assert!(!told.contains("SELECT 1 AS n"), "{store}: {told}");
    }
}

#[test]
fn redis_shares_a_conversation_across_connections_but_not_roles() {
    let redis = RedisServer::start();
    let mut s = Session::new();
    use_redis(&mut s.client, &redis.url());
    ask_in(
        &mut s,
        "pooled",
        "total order amount",
        "SELECT sum(amount) AS total FROM orders",
    );

    let mut other = s.second_connection();
    use_redis(&mut other, &redis.url());
    s.llm
        .on("and per customer?", vec![Reply::sql("SELECT 1 AS one")]);
    other
        .query("SELECT nl_query('and per customer?', 'pooled')", &[])
        .unwrap();
    let told = s.llm.last_text();
    assert!(
        told.contains("total order amount")
            && told.contains("SELECT sum(amount) AS total FROM orders")
    );

    let role = format!("pool_{}", s.database);
    other
        .batch_execute(&format!(
            "BEGIN READ WRITE; CREATE ROLE {role}; GRANT SELECT ON orders TO {role}; COMMIT;
             SET ROLE {role}"
        ))
        .unwrap();
    s.llm
        .on("a stranger asks", vec![Reply::sql("SELECT 1 AS one")]);
    other
        .query("SELECT nl_query('a stranger asks', 'pooled')", &[])
        .unwrap();
    assert!(!s.llm.last_text().contains("total order amount"));

    let mut r = redis.client().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("sql_query_engine:*:session:pooled")
        .query(&mut r)
        .unwrap();
    // one key per role: namespaced by cluster (system identifier), database and role (OIDs)
    let own = role_key(&mut s.client, "postgres", "session:pooled");
    let theirs = role_key(&mut s.client, &role, "session:pooled");
    assert!(
        keys.contains(&own) && keys.contains(&theirs) && keys.len() == 2,
        "{keys:?}"
    );
    let ttl: i64 = redis::cmd("TTL").arg(&own).query(&mut r).unwrap();
    assert!(ttl > 0 && ttl <= 3600, "{ttl}");
}

/// What a role writes to Redis counts against its share of it (64 MB in 10 minutes): past
/// that, its turns are not stored there (its connection's memory keeps them, and it is told
/// so), so that no role fills the Redis every role shares.
#[test]
fn a_role_writes_to_redis_within_its_share() {
    let redis = RedisServer::start();
    let notices = Arc::new(Mutex::new(Vec::new()));
    let mut s = Session::with_notices(Arc::clone(&notices));
    use_redis(&mut s.client, &redis.url());
    ask_in(&mut s, "budgeted", "the first turn", "SELECT 1 AS one");
    let mut r = redis.client().unwrap();
    let budget = role_key(&mut s.client, "postgres", "budget:turns");
    let session = role_key(&mut s.client, "postgres", "session:budgeted");
    let spent: u64 = redis::cmd("GET").arg(&budget).query(&mut r).unwrap();
    let ttl: i64 = redis::cmd("TTL").arg(&budget).query(&mut r).unwrap();
    assert!(
        spent > 0 && ttl > 0 && ttl <= 600,
        "{spent} bytes, for {ttl} s"
    );
    let stored =
        |r: &mut redis::Connection| -> i64 { redis::cmd("LLEN").arg(&session).query(r).unwrap() };
    assert_eq!(stored(&mut r), 1);
    // The share spent: the next turn is not stored in Redis, and the caller is told so.
    let _: () = redis::cmd("SET")
        .arg(&budget)
        .arg(64u64 << 20)
        .arg("EX")
        .arg(600)
        .query(&mut r)
        .unwrap();
    ask_in(&mut s, "budgeted", "the second turn", "SELECT 2 AS two");
    assert_eq!(stored(&mut r), 1);
    let said = notices.lock().unwrap().join("\n");
    assert!(said.contains("share of Redis"), "{said}");
}

/// A turn written to Redis pays for every turn of its session it keeps there (renewing the
/// session's expiry keeps all of them), once for each 10 minutes they live (`session_ttl`):
/// a role's share bounds what it holds in Redis at once, not only what it writes in 10
/// minutes (an hour-long `session_ttl` held six times the share).
#[test]
fn a_turn_pays_for_what_it_keeps_in_redis_for_as_long_as_it_keeps_it() {
    let redis = RedisServer::start();
    let mut s = Session::new();
    use_redis(&mut s.client, &redis.url());
    s.client
        .batch_execute("SET sql_query_engine.session_ttl = 3600")
        .unwrap();
    let mut r = redis.client().unwrap();
    let budget = role_key(&mut s.client, "postgres", "budget:turns");
    let session = role_key(&mut s.client, "postgres", "session:kept");
    let spent =
        |r: &mut redis::Connection| -> u64 { redis::cmd("GET").arg(&budget).query(r).unwrap() };
    // What the session holds in Redis after a turn: its key and its turns, in bytes.
    let held = |r: &mut redis::Connection| -> u64 {
        let turns: Vec<String> = redis::cmd("LRANGE")
            .arg(&session)
            .arg(0)
            .arg(-1)
            .query(r)
            .unwrap();
        (session.len() + turns.iter().map(String::len).sum::<usize>()) as u64
    };
    ask_in(&mut s, "kept", "the first turn", "SELECT 1 AS one");
    let first = spent(&mut r);
    assert_eq!(first, 6 * held(&mut r), "an hour is six windows");
    ask_in(&mut s, "kept", "the second turn", "SELECT 2 AS two");
    let second = spent(&mut r);
    assert_eq!(
        second - first,
        6 * held(&mut r),
        "both turns are kept an hour more"
    );
    // Turns that live 10 minutes pay once.
    s.client
        .batch_execute("SET sql_query_engine.session_ttl = 600")
        .unwrap();
    ask_in(&mut s, "kept", "the third turn", "SELECT 3 AS three");
    assert_eq!(spent(&mut r) - second, held(&mut r));
}

#[test]
fn an_unreachable_redis_degrades_to_memory_with_one_warning() {
    let notices = Arc::new(Mutex::new(Vec::new()));
    let mut s = Session::with_notices(Arc::clone(&notices));
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    use_redis(
        &mut s.client,
        &format!("redis://:secret-pass@127.0.0.1:{closed}/0"),
    );
    // Messages the server log is sent too would reach this client as well.
    s.client
        .batch_execute("SET client_min_messages = debug1")
        .unwrap();
    let started = Instant::now();
    ask_in(&mut s, "offline", "first question", "SELECT 1 AS one");
    ask_in(&mut s, "offline", "second question", "SELECT 2 AS two");
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(
        s.llm.last_text().contains("first question"),
        "memory kept the turn"
    );
    let warnings: Vec<String> = notices
        .lock()
        .unwrap()
        .iter()
        .filter(|n| n.starts_with("WARNING"))
        .cloned()
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("Redis") && !warnings[0].contains("secret-pass"),
        "{warnings:?}"
    );
    // Where Redis is (a setting hidden from other roles) is for the server log alone.
    let told = notices.lock().unwrap().clone();
    assert!(
        !told.iter().any(|n| n.contains(&format!(":{closed}"))),
        "{told:?}"
    );
    // A reset Redis could not take says so: the turns it has are still there.
    s.client
        .batch_execute("SELECT nl_session_reset('offline')")
        .unwrap();
    let told = notices.lock().unwrap().clone();
    assert!(
        told.iter()
            .any(|n| n.starts_with("WARNING") && n.contains("not forgotten in Redis")),
        "{told:?}"
    );
}

#[test]
fn a_hung_redis_costs_at_most_its_timeout_and_cancel_still_works() {
    let port = silent_server();
    let mut s = Session::new();
    use_redis(&mut s.client, &format!("redis://127.0.0.1:{port}/0"));
    s.client
        .batch_execute("SET sql_query_engine.redis_timeout = 300")
        .unwrap();
    let started = Instant::now();
    ask_in(&mut s, "hung", "a question", "SELECT 1 AS one");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );

    // a long Redis timeout, and a cancel in the middle of the wait
    let mut t = Session::new();
    use_redis(&mut t.client, &format!("redis://127.0.0.1:{port}/0"));
    t.client
        .batch_execute("SET sql_query_engine.redis_timeout = 30000")
        .unwrap();
    t.llm
        .on("cancel during redis", vec![Reply::sql("SELECT 1 AS one")]);
    let canceller = t.signal_after("pg_cancel_backend", Duration::from_millis(500));
    let started = Instant::now();
    let error = t
        .client
        .query("SELECT nl_query('cancel during redis', 'hung')", &[])
        .unwrap_err();
    canceller.join().unwrap();
    assert_eq!(db_error(&error).0, "57014");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn a_restarted_redis_is_used_again_and_memory_bridges_the_gap() {
    let mut redis = RedisServer::start();
    let mut s = Session::new();
    use_redis(&mut s.client, &redis.url());
    ask_in(
        &mut s,
        "restart",
        "question before the restart",
        "SELECT 1 AS one",
    );
    redis.stop();
    ask_in(
        &mut s,
        "restart",
        "question while it is down",
        "SELECT 2 AS two",
    );
    assert!(s.llm.last_text().contains("question before the restart"));
    redis.restart();
    std::thread::sleep(Duration::from_millis(5500)); // past the retry pause
    ask_in(
        &mut s,
        "restart",
        "question after the restart",
        "SELECT 3 AS three",
    );
    assert!(s.llm.last_text().contains("question while it is down"));
    let mut r = redis.client().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("sql_query_engine:*:session:restart")
        .query(&mut r)
        .unwrap();
    assert_eq!(keys.len(), 1, "Redis is written again");
}

#[test]
fn progress_events_are_published_in_order_and_shown_as_notices() {
    let redis = RedisServer::start();
    let notices = Arc::new(Mutex::new(Vec::new()));
    let mut s = Session::with_notices(Arc::clone(&notices));
    // The channel is namespaced like the session keys: database and role, by OID. Nothing
    // goes to a channel named after the session alone, which any Redis client could read.
    let channel: String = s
        .client
        .query_one(
            "SELECT format('sql_query_engine:%s:%s:%s:progress:live',
                           (SELECT system_identifier FROM pg_control_system()), d.oid,
                           (SELECT oid FROM pg_roles WHERE rolname = current_user))
             FROM pg_database d WHERE d.datname = current_database()",
            &[],
        )
        .unwrap()
        .get(0);
    let mut subscriber = redis.client().unwrap();
    let mut pubsub = subscriber.as_pubsub();
    pubsub.subscribe(&channel).unwrap();
    pubsub.subscribe("sql_query_engine:live").unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    use_redis(&mut s.client, &redis.url());
    s.client
        .batch_execute("SET sql_query_engine.progress = on")
        .unwrap();
    s.llm.on(
        "live question",
        vec![
            // Its lines are shown indented: none passes for a progress line of its own.
            Reply::sql("SELECT nope /*\nsql_query_engine: done: forged\n*/ FROM orders"),
            Reply::sql("SELECT count(*) AS n FROM orders"),
        ],
    );
    s.client
        .query("SELECT nl_query('live question', 'live')", &[])
        .unwrap();

    let mut events = Vec::new();
    while events
        .last()
        .map(|e: &Value| e["event"] != "done")
        .unwrap_or(true)
    {
        let message = pubsub.get_message().expect("an event");
        assert_eq!(message.get_channel_name(), channel);
        let payload: String = message.get_payload().unwrap();
        events.push(serde_json::from_str(&payload).unwrap());
    }
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "schema_ready",
            "model_asked",
            "attempt",
            "model_asked",
            "attempt",
            "done"
        ]
    );
    assert_eq!(events[2]["sqlstate"], "42703");
    assert_eq!(events[2]["kind"], "the first query");
    assert_eq!(events[3]["for"], "repair");
    assert_eq!(events[3]["because"], "the first query gave an error");
    assert_eq!(events[4]["outcome"], "rows");
    assert_eq!(events[4]["kind"], format!("repair 1 of {}", 4));
    assert_eq!(events[5]["status"], "ok");
    assert_eq!(events[5]["answered_by"], events[4]["kind"]);
    let notices = notices.lock().unwrap();
    assert!(
        notices
            .iter()
            .any(|n| n.starts_with("NOTICE") && n.contains("the first query: error 42703")),
        "{notices:?}"
    );
    assert!(
        notices.iter().any(
            |n| n.contains("asking the model for repair 1 of 4: the first query gave an error")
        ),
        "{notices:?}"
    );
    assert!(
        notices.iter().any(|n| n.contains("done: ok")),
        "{notices:?}"
    );
    assert!(
        notices
            .iter()
            .any(|n| n.contains("\n  sql_query_engine: done: forged"))
            && !notices
                .iter()
                .any(|n| n.contains("\nsql_query_engine: done: forged")),
        "{notices:?}"
    );
}

#[test]
fn history_records_calls_and_never_gets_in_the_way() {
    let mut s = Session::new();
    s.llm.on(
        "count orders",
        vec![Reply::sql("SELECT count(*) AS n FROM orders")],
    );
    s.client
        .query("SELECT nl_query('count orders', 'h')", &[])
        .unwrap();
    let row = s
        .client
        .query_one("SELECT function, session, sql, status, row_count, jsonb_array_length(attempts), llm_calls FROM nl_history", &[])
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "nl_query");
    assert_eq!(row.get::<_, Option<String>>(1).as_deref(), Some("h"));
    assert_eq!(row.get::<_, String>(2), "SELECT count(*) AS n FROM orders");
    assert_eq!(row.get::<_, String>(3), "ok");
    assert_eq!(row.get::<_, Option<i32>>(4), Some(1));
    assert_eq!(row.get::<_, i32>(5), 1);
    assert_eq!(row.get::<_, i32>(6), 1);

    // read-only transactions and default_transaction_read_only: the answer comes back
    s.llm.on(
        "read only",
        vec![Reply::sql("SELECT 1 AS one"), Reply::sql("SELECT 1 AS one")],
    );
    let mut tx = s.client.transaction().unwrap();
    tx.batch_execute("SET TRANSACTION READ ONLY").unwrap();
    assert_eq!(
        tx.query("SELECT nl_query('read only')", &[]).unwrap().len(),
        1
    );
    tx.commit().unwrap();
    s.client
        .batch_execute("SET default_transaction_read_only = on")
        .unwrap();
    assert_eq!(
        s.client
            .query("SELECT nl_query('read only')", &[])
            .unwrap()
            .len(),
        1
    );
    s.client
        .batch_execute("SET default_transaction_read_only = off")
        .unwrap();
    assert_eq!(s.scalar_i64("SELECT count(*) FROM nl_history"), 1);

    // other roles see only their own rows; the owner sees all
    let role = format!("hist_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {role}; GRANT SELECT ON orders TO {role}; SET ROLE {role}"
        ))
        .unwrap();
    assert_eq!(s.scalar_i64("SELECT count(*) FROM nl_history"), 0);
    s.llm
        .on("mine", vec![Reply::sql("SELECT count(*) FROM orders")]);
    s.client.query("SELECT nl_query('mine')", &[]).unwrap();
    assert_eq!(s.scalar_i64("SELECT count(*) FROM nl_history"), 1);
    s.client.batch_execute("RESET ROLE").unwrap();
    assert_eq!(s.scalar_i64("SELECT count(*) FROM nl_history"), 2);

    s.client
        .batch_execute("SET sql_query_engine.history = off")
        .unwrap();
    s.llm.on("unrecorded", vec![Reply::sql("SELECT 1 AS one")]);
    s.client
        .query("SELECT nl_query('unrecorded')", &[])
        .unwrap();
    assert_eq!(s.scalar_i64("SELECT count(*) FROM nl_history"), 2);
}

#[test]
fn nl_answer_is_grounded_in_the_rows_unless_sample_data_is_off() {
    let mut s = Session::new();
    s.llm.on(
        "Who ordered the most?",
        vec![
            Reply::sql("SELECT c.name, sum(o.amount) AS total FROM customers c JOIN orders o USING (customer_id) GROUP BY 1 ORDER BY 2 DESC LIMIT 1"),
            Reply::Content("Ada ordered the most, 129.50 in total.".into()),
        ],
    );
    let answer: String = s
        .client
        .query_one("SELECT nl_answer('Who ordered the most?')", &[])
        .unwrap()
        .get(0);
    assert_eq!(answer, "Ada ordered the most, 129.50 in total.");
    let request = s.llm.requests().last().unwrap().clone();
    assert!(
        request
            .text()
            .contains(r#"{"name": "Ada", "total": 129.50}"#),
        "{}",
        request.text()
    );
    assert!(
        request.body.get("response_format").is_none(),
        "a plain-text answer is asked for"
    );
    // The description is a model request of the call, which its history counts (the rows
    // went to the model too).
    assert_eq!(
        s.scalar_i64("SELECT llm_calls::bigint FROM nl_history ORDER BY id DESC LIMIT 1"),
        2
    );
    // And its audit line names the endpoint that received them.
    if let Some(mut log) = sql_query_engine_e2e::cluster().server_log() {
        let described = format!(", described by {}", s.llm.url());
        let waiting = std::time::Instant::now();
        while !log.contains(&described) && waiting.elapsed() < std::time::Duration::from_secs(30) {
            std::thread::sleep(std::time::Duration::from_millis(200));
            log = sql_query_engine_e2e::cluster()
                .server_log()
                .unwrap_or_default();
        }
        assert!(log.contains(&described), "no audit line with {described}");
    }

    s.client
        .batch_execute("SET sql_query_engine.sample_values = 0")
        .unwrap();
    s.llm.on(
        "Who ordered the least?",
        vec![
            Reply::sql("SELECT c.name FROM customers c JOIN orders o USING (customer_id) GROUP BY 1 ORDER BY sum(o.amount) LIMIT 1"),
            Reply::Content("The customer with the smallest total order amount.".into()),
        ],
    );
    s.client
        .query_one("SELECT nl_answer('Who ordered the least?')", &[])
        .unwrap();
    let request = s.llm.last_text();
    assert!(
        !request.contains("Dmitri") && request.contains("may not be shown"),
        "{request}"
    );
}

#[test]
fn a_role_is_told_apart_by_oid_in_history_sessions_and_redis() {
    let redis = RedisServer::start();
    let mut s = Session::new();
    let db = s.database.clone();
    let role = format!("ephemeral_{db}");
    let renamed = format!("renamed_{db}");
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT SELECT ON orders TO {role};
             ALTER DATABASE {db} SET sql_query_engine.llm_url = '{}';
             ALTER DATABASE {db} SET sql_query_engine.vote = off;
             ALTER DATABASE {db} SET sql_query_engine.redis_url = '{}';",
            s.llm.url(),
            redis.url()
        ))
        .unwrap();
    s.llm
        .respond_with(|_| Some(Reply::sql("SELECT count(*) AS n FROM orders")));
    let asked = |login: &str, sql: &str, question: &str| -> String {
        let mut c = sql_query_engine_e2e::cluster().connect_as(&db, login);
        c.batch_execute(&format!("{sql} SELECT nl_query('{question}', 'conv');"))
            .unwrap();
        let history: i64 = c
            .query_one("SELECT count(*) FROM nl_history", &[])
            .unwrap()
            .get(0);
        format!("history {history}")
    };
    // Turns in the table (a writable transaction) and in Redis (a read-only one).
    assert_eq!(
        asked(&role, "", "how many orders in the table"),
        "history 1"
    );
    asked(&role, "BEGIN READ ONLY;", "how many orders in redis");

    // Renamed: the same role, with its history and conversations.
    s.client
        .batch_execute(&format!("ALTER ROLE {role} RENAME TO {renamed}"))
        .unwrap();
    assert_eq!(asked(&renamed, "", "and in the table now"), "history 2");
    assert!(s.llm.last_text().contains("how many orders in the table"));
    asked(&renamed, "BEGIN READ ONLY;", "and in redis now");
    assert!(s.llm.last_text().contains("how many orders in redis"));

    // Dropped and created again under the first name: another role, which inherits nothing.
    s.client
        .batch_execute(&format!(
            "REVOKE SELECT ON orders FROM {renamed}; DROP ROLE {renamed};
             CREATE ROLE {role} LOGIN; GRANT SELECT ON orders TO {role};"
        ))
        .unwrap();
    assert_eq!(asked(&role, "", "a new role asks"), "history 1");
    assert!(
        !s.llm.last_text().contains("how many orders"),
        "{}",
        s.llm.last_text()
    );
    asked(&role, "BEGIN READ ONLY;", "a new role asks redis");
    assert!(!s.llm.last_text().contains("how many orders in redis"));
}

#[test]
fn progress_events_withhold_stored_values_when_sample_values_is_off() {
    let redis = RedisServer::start();
    let mut s = Session::new();
    use_redis(&mut s.client, &redis.url());
    s.client
        .batch_execute(
            "BEGIN READ WRITE; CREATE TABLE codes (code text);
             INSERT INTO codes VALUES ('TOPSECRET-42'); COMMIT;
             SET sql_query_engine.sample_values = 0;",
        )
        .unwrap();
    let channel: String = s
        .client
        .query_one(
            "SELECT format('sql_query_engine:%s:%s:%s:progress:private',
                           (SELECT system_identifier FROM pg_control_system()), d.oid,
                           (SELECT oid FROM pg_roles WHERE rolname = current_user))
             FROM pg_database d WHERE d.datname = current_database()",
            &[],
        )
        .unwrap()
        .get(0);
    let mut subscriber = redis.client().unwrap();
    let mut pubsub = subscriber.as_pubsub();
    pubsub.psubscribe("sql_query_engine:*").unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    s.llm.on(
        "the code as a number",
        vec![
            Reply::sql("SELECT code::int AS n FROM codes"),
            Reply::sql("SELECT count(*) AS n FROM codes"),
        ],
    );
    s.client
        .query("SELECT nl_query('the code as a number', 'private')", &[])
        .unwrap();
    let mut events = Vec::new();
    while events
        .last()
        .map(|e: &Value| e["event"] != "done")
        .unwrap_or(true)
    {
        let message = pubsub.get_message().expect("an event");
        assert_eq!(message.get_channel_name(), channel);
        let payload: String = message.get_payload().unwrap();
        assert!(
            !payload.contains("TOPSECRET"),
            "a stored value was published: {payload}"
        );
        events.push(serde_json::from_str(&payload).unwrap());
    }
    let failed = events
        .iter()
        .find(|e| e["event"] == "attempt" && e["outcome"] == "error")
        .expect("the failed attempt");
    // Which error it was is not told either (it may be the data's choice).
    assert_eq!(failed["sqlstate"], "22000");
    assert!(
        failed["message"]
            .as_str()
            .unwrap()
            .starts_with("the query failed while it ran"),
        "{failed}"
    );
}

#[test]
fn turns_sent_with_the_call_are_the_context_and_leave_the_session_store_alone() {
    let mut s = Session::new();
    s.llm
        .on("only the German ones", vec![Reply::sql("SELECT 1 AS n")]);
    // An earlier turn whose SQL would write, and a lock the test would see taken: the turns
    // are context for the model, never run.
    let turns = serde_json::json!([
        {"question": "How many customers?", "sql": "SELECT count(*) FROM customers"},
        {"question": "Which ones failed?", "sql": null},
        {"question": "Delete them", "sql": "DELETE FROM orders; SELECT pg_advisory_lock(4242)"},
    ])
    .to_string();
    let trace: Value = serde_json::from_str(
        s.client
            .query_one(
                "SELECT nl_ask('only the German ones', 'chat-7', $1::text::jsonb)::text",
                &[&turns],
            )
            .unwrap()
            .get::<_, &str>(0),
    )
    .unwrap();
    assert_eq!(trace["status"], "ok");
    assert_eq!(trace["session_store"], "request");
    assert_eq!(trace["context_turns"], 3);
    let asked = s.llm.requests().last().unwrap().clone();
    let text = asked.text();
    assert!(text.contains("How many customers?") && text.contains("Which ones failed?"));
    assert!(
        text.contains(r#"{"sql":"SELECT count(*) FROM customers"}"#),
        "{text}"
    );
    assert_eq!(s.scalar_i64("SELECT count(*) FROM orders"), 6);
    assert_eq!(
        s.scalar_i64("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"),
        0
    );
    // Nothing was stored for the session: the next call without turns starts fresh, and the
    // history has the label.
    assert_eq!(s.scalar_i64("SELECT count(*) FROM nl_sessions"), 0);
    assert_eq!(
        s.scalar_i64("SELECT count(*) FROM nl_history WHERE session = 'chat-7'"),
        1
    );

    // turns that are not what the argument takes are refused clearly
    for (turns, says) in [
        (r#"{"question": "x"}"#, "not an array"),
        (r#"[{"sql": "SELECT 1"}]"#, "turns[0] has no question"),
        (
            r#"[{"question": "x", "sql": 5}]"#,
            "turns[0].sql is not a string",
        ),
        (r#"["x"]"#, "turns[0] is not an object"),
    ] {
        let error = s
            .client
            .query_one("SELECT nl_ask('q', NULL, $1::text::jsonb)", &[&turns])
            .unwrap_err();
        let (code, message, _) = db_error(&error);
        assert_eq!(code, "22023", "{turns}");
        assert!(message.contains(says), "{turns}: {message}");
    }
    let long = serde_json::json!([{"question": "x".repeat(20_001)}]).to_string();
    let error = s
        .client
        .query_one("SELECT nl_ask('q', NULL, $1::text::jsonb)", &[&long])
        .unwrap_err();
    assert!(db_error(&error).1.contains("longer than 20000"));
}

#[test]
fn concurrent_turns_of_one_server_side_session_are_all_kept() {
    let mut s = Session::new();
    s.client
        .batch_execute(&format!(
            "ALTER DATABASE {db} SET sql_query_engine.llm_url = '{url}';
             ALTER DATABASE {db} SET sql_query_engine.vote = off;
             ALTER DATABASE {db} SET sql_query_engine.session_turns = 10;",
            db = s.database,
            url = s.llm.url()
        ))
        .unwrap();
    for i in 0..6 {
        s.llm
            .on(&format!("question {i}"), vec![Reply::sql("SELECT 1 AS n")]);
    }
    std::thread::scope(|scope| {
        for i in 0..6 {
            let database = s.database.clone();
            scope.spawn(move || {
                let mut client = sql_query_engine_e2e::cluster().connect(&database);
                client
                    .query("SELECT nl_ask($1, 'shared')", &[&format!("question {i}")])
                    .unwrap();
            });
        }
    });
    assert_eq!(
        s.scalar_i64(
            "SELECT count(*) FROM nl_sessions WHERE session = 'shared' AND question IS NOT NULL"
        ),
        6,
        "a concurrent turn was lost"
    );
}

#[test]
fn with_redis_every_connection_keeps_sessions_there_and_says_where() {
    let redis = RedisServer::start();
    let mut s = Session::new();
    let store = |c: &mut postgres::Client| -> String {
        c.query_one("SELECT nl_session_store()", &[])
            .unwrap()
            .get(0)
    };
    // Without Redis: the table where the transaction can write, else backend memory.
    assert_eq!(store(&mut s.client), "table");
    let mut read_only = s.second_connection();
    read_only
        .batch_execute("SET default_transaction_read_only = on")
        .unwrap();
    assert_eq!(store(&mut read_only), "memory");

    // With Redis: Redis for a writable and a read-only connection alike (a primary and its
    // standbys), so a conversation may move between them.
    s.client
        .batch_execute(&format!(
            "SET sql_query_engine.redis_url = '{}'",
            redis.url()
        ))
        .unwrap();
    read_only
        .batch_execute(&format!(
            "SET sql_query_engine.redis_url = '{}'",
            redis.url()
        ))
        .unwrap();
    assert_eq!(store(&mut s.client), "redis");
    assert_eq!(store(&mut read_only), "redis");
    s.llm.on(
        "orders on the writable one",
        vec![Reply::sql("SELECT count(*) AS n FROM orders")],
    );
    let trace = s.trace_in("orders on the writable one", "moving");
    assert_eq!(trace["session_store"], "redis");
    s.llm.on(
        "and on the read-only one",
        vec![Reply::sql(
            "SELECT count(*) AS n FROM orders WHERE amount > 100",
        )],
    );
    let text: String = read_only
        .query_one(
            "SELECT nl_trace('and on the read-only one', 'moving')::text",
            &[],
        )
        .unwrap()
        .get(0);
    let trace: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(trace["session_store"], "redis");
    assert_eq!(trace["context_turns"], 1);
    assert!(s.llm.last_text().contains("orders on the writable one"));
    // Nothing went to the table.
    let rows: i64 = s
        .client
        .query_one("SELECT count(*) FROM nl_sessions", &[])
        .unwrap()
        .get(0);
    assert_eq!(rows, 0);

    // Redis gone: backend memory, and the trace and nl_session_store say so.
    drop(redis);
    assert_eq!(store(&mut s.client), "memory");
}

#[test]
fn a_role_whose_name_reads_as_another_roles_keeps_to_its_own_history_and_sessions() {
    let mut s = Session::new();
    // "FOLD_x" read as an identifier is fold_x; "fold_x.y" cannot be read as one at all.
    let plain = format!("fold_{}", s.database);
    let upper = plain.to_uppercase();
    let dotted = format!("{plain}.y");
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {plain}; CREATE ROLE \"{upper}\"; CREATE ROLE \"{dotted}\";
             GRANT SELECT ON customers TO {plain}, \"{upper}\", \"{dotted}\";
             SET ROLE {plain}"
        ))
        .unwrap();
    ask_in(
        &mut s,
        "mine",
        "a private question",
        "SELECT count(*) AS n FROM customers",
    );
    let count =
        |s: &mut Session, sql: &str| -> i64 { s.client.query_one(sql, &[]).unwrap().get(0) };
    assert_eq!(count(&mut s, "SELECT count(*) FROM nl_history"), 1);
    assert_eq!(count(&mut s, "SELECT count(*) FROM nl_sessions"), 1);

    s.client
        .batch_execute(&format!("RESET ROLE; SET ROLE \"{upper}\""))
        .unwrap();
    assert_eq!(count(&mut s, "SELECT count(*) FROM nl_history"), 0);
    assert_eq!(count(&mut s, "SELECT count(*) FROM nl_sessions"), 0);
    // No role changes rows of the table, its own or another's: it only adds its own.
    for change in [
        "UPDATE nl_sessions SET question = 'changed'",
        "DELETE FROM nl_sessions",
    ] {
        let error = s.client.execute(change, &[]).unwrap_err();
        assert_eq!(db_error(&error).0, "42501", "{change}: {error}");
    }
    // Its own question is its own: recorded under its OID, and not shown the other's turn.
    ask_in(&mut s, "mine", "my own question", "SELECT 1 AS one");
    assert!(!s.llm.last_text().contains("a private question"));
    assert_eq!(
        count(
            &mut s,
            "SELECT count(*) FROM nl_history h JOIN pg_roles r ON r.oid = h.role_id \
             WHERE r.rolname = current_user AND h.question = 'my own question'"
        ),
        1
    );

    // A name with a dot works like any other.
    s.client
        .batch_execute(&format!("RESET ROLE; SET ROLE \"{dotted}\""))
        .unwrap();
    ask_in(&mut s, "dotted", "a dotted question", "SELECT 2 AS two");
    assert_eq!(count(&mut s, "SELECT count(*) FROM nl_history"), 1);
    assert_eq!(count(&mut s, "SELECT count(*) FROM nl_sessions"), 1);
    s.client.batch_execute("RESET ROLE").unwrap();
}

#[test]
fn no_role_can_lock_the_sessions_table_against_another_roles_conversation() {
    let mut s = Session::new();
    let (locker, db) = (format!("locker_{}", s.database), s.database.clone());
    s.client
        .batch_execute(&format!("CREATE ROLE {locker} LOGIN"))
        .unwrap();
    s.llm.on(
        "How many customers are there?",
        vec![
            Reply::sql("SELECT count(*) AS n FROM customers"),
            Reply::sql("SELECT count(*) AS n FROM customers"),
        ],
    );
    s.trace_in("How many customers are there?", "talk");
    // Roles may only add rows: no lock that holds up reads or writes is theirs to take.
    let mut other = sql_query_engine_e2e::cluster().connect_as(&db, &locker);
    for mode in ["ACCESS EXCLUSIVE", "EXCLUSIVE", "SHARE"] {
        let error = other
            .batch_execute(&format!(
                "BEGIN; LOCK TABLE nl_sessions IN {mode} MODE; COMMIT;"
            ))
            .unwrap_err();
        assert_eq!(db_error(&error).0, "42501", "{mode}: {error}");
        other.batch_execute("ROLLBACK").unwrap();
    }
    // The one it may take (as an INSERT does) holds up neither: the turn is read from the
    // table and the next is written there.
    other
        .batch_execute("BEGIN; LOCK TABLE nl_sessions IN ROW EXCLUSIVE MODE;")
        .unwrap();
    s.client
        .batch_execute("SET statement_timeout = '20s'")
        .unwrap();
    let row = s
        .client
        .query_one(
            "SELECT nl_trace('How many customers are there?', 'talk')::text",
            &[],
        )
        .unwrap_or_else(|e| panic!("the call waited for the lock: {e}"));
    let trace: Value = serde_json::from_str(row.get::<_, &str>(0)).unwrap();
    assert_eq!(trace["row_count"], 1, "{trace}");
    assert_eq!(trace["session_store"], "table", "{trace}");
    assert_eq!(trace["context_turns"], 1, "{trace}");
    other.batch_execute("ROLLBACK").unwrap();
    assert_eq!(
        s.scalar_i64("SELECT count(*) FROM nl_sessions WHERE session = 'talk'"),
        2
    );
}

#[test]
fn a_session_reset_on_one_connection_is_not_undone_by_anothers_memory() {
    let redis = RedisServer::start();
    let mut s = Session::new();
    use_redis(&mut s.client, &redis.url());
    // Another backend keeps, beside Redis, a copy of the turns in its memory (for an outage).
    let mut other = s.second_connection();
    use_redis(&mut other, &redis.url());
    s.llm
        .on("the first question", vec![Reply::sql("SELECT 1 AS one")]);
    s.llm
        .on("the second question", vec![Reply::sql("SELECT 2 AS two")]);
    other
        .query("SELECT nl_query('the first question', 'kept')", &[])
        .unwrap();
    s.client
        .batch_execute("SELECT nl_session_reset('kept')")
        .unwrap();
    other
        .query("SELECT nl_query('the second question', 'kept')", &[])
        .unwrap();
    let asked = s.llm.last_text();
    assert!(
        !asked.contains("the first question"),
        "a reset turn came back: {asked}"
    );
    // The same with the table, no Redis: a turn asked in a transaction that could not write
    // it is kept in that backend's memory alone, and a reset written on another connection
    // ends it too.
    let (mut reader, mut resetter) = (s.second_connection(), s.second_connection());
    s.llm.on(
        "a question read only",
        vec![Reply::sql("SELECT 3 AS three")],
    );
    s.llm
        .on("a question after it", vec![Reply::sql("SELECT 4 AS four")]);
    reader
        .batch_execute(
            "BEGIN READ ONLY; SELECT nl_query('a question read only', 'tabled'); COMMIT;",
        )
        .unwrap();
    resetter
        .batch_execute("SELECT nl_session_reset('tabled')")
        .unwrap();
    reader
        .query("SELECT nl_query('a question after it', 'tabled')", &[])
        .unwrap();
    let asked = s.llm.last_text();
    assert!(
        !asked.contains("a question read only"),
        "a reset turn came back from memory: {asked}"
    );
    // A turn kept in memory after the reset (its transaction could not write it) still counts.
    s.llm
        .on("kept after the reset", vec![Reply::sql("SELECT 5 AS five")]);
    s.llm
        .on("and after that", vec![Reply::sql("SELECT 6 AS six")]);
    reader
        .batch_execute(
            "SELECT nl_session_reset('later');
             BEGIN READ ONLY; SELECT nl_query('kept after the reset', 'later'); COMMIT;",
        )
        .unwrap();
    reader
        .query("SELECT nl_query('and after that', 'later')", &[])
        .unwrap();
    let asked = s.llm.last_text();
    assert!(
        asked.contains("kept after the reset"),
        "a turn kept after the reset was lost: {asked}"
    );
}

/// A reset in a transaction that cannot write leaves the turns in `nl_sessions`, which the next
/// call that can write reads again: it says so.
#[test]
fn a_reset_the_table_cannot_take_says_so() {
    let notices = Arc::new(Mutex::new(Vec::new()));
    let mut s = Session::with_notices(Arc::clone(&notices));
    ask_in(&mut s, "kept", "a question to remember", "SELECT 1 AS one");
    s.client
        .batch_execute("BEGIN READ ONLY; SELECT nl_session_reset('kept'); COMMIT;")
        .unwrap();
    let told = notices.lock().unwrap().clone();
    assert!(
        told.iter()
            .any(|n| n.starts_with("WARNING") && n.contains("nl_sessions table")),
        "{told:?}"
    );
    // In a transaction that can write, it is forgotten, silently.
    notices.lock().unwrap().clear();
    s.client
        .batch_execute("SELECT nl_session_reset('kept')")
        .unwrap();
    assert!(notices.lock().unwrap().is_empty());
    ask_in(
        &mut s,
        "kept",
        "a question after the reset",
        "SELECT 2 AS two",
    );
    let asked = s.llm.last_text();
    assert!(
        !asked.contains("a question to remember"),
        "a reset turn came back: {asked}"
    );
}

/// A session kept in the table lives while its turns come within `session_ttl` of each other,
/// however long it lasts in all, and is gone after a longer pause.
#[test]
fn a_table_session_expires_after_a_pause_of_its_ttl_not_after_its_ttl_in_all() {
    let mut s = Session::new();
    s.client
        .batch_execute("SET sql_query_engine.session_ttl = 2")
        .unwrap();
    ask_in(
        &mut s,
        "paced",
        "the first paced question",
        "SELECT 1 AS one",
    );
    std::thread::sleep(std::time::Duration::from_millis(1200));
    ask_in(
        &mut s,
        "paced",
        "the second paced question",
        "SELECT 2 AS two",
    );
    std::thread::sleep(std::time::Duration::from_millis(1200));
    ask_in(
        &mut s,
        "paced",
        "the third paced question",
        "SELECT 3 AS three",
    );
    let asked = s.llm.last_text();
    assert!(
        asked.contains("the first paced question") && asked.contains("the second paced question"),
        "{asked}"
    );
    std::thread::sleep(std::time::Duration::from_millis(2500));
    ask_in(
        &mut s,
        "paced",
        "the question after a pause",
        "SELECT 4 AS four",
    );
    let asked = s.llm.last_text();
    assert!(
        !asked.contains("paced question"),
        "an expired turn came back: {asked}"
    );
}
