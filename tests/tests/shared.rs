//! What the backends of a server share, and what they must not: the circuit breaker's view of
//! a dead endpoint (in shared memory, when the library is preloaded), and the value index's
//! reads (through Redis, only reads that are the same for every role).

use postgres::{Client, NoTls};
use sql_query_engine_e2e::cluster::{OwnCluster, FIXTURE};
use sql_query_engine_e2e::redis::RedisServer;
use sql_query_engine_e2e::{cluster, db_error, Reply, ScriptedLlm, Session};

/// A cluster of its own with the library preloaded (the shared test cluster is not), and one
/// database with the extension and the fixture.
struct Preloaded(OwnCluster);

impl Preloaded {
    fn start() -> Preloaded {
        let preloaded = Preloaded(OwnCluster::start(
            "sqe-preloaded",
            &["-c", "shared_preload_libraries=sql_query_engine"],
        ));
        preloaded
            .connect("postgres")
            .batch_execute("CREATE DATABASE shop")
            .unwrap();
        let mut shop = preloaded.connect("shop");
        shop.batch_execute("CREATE EXTENSION sql_query_engine")
            .unwrap();
        shop.batch_execute(FIXTURE).unwrap();
        preloaded
    }

    fn connect(&self, database: &str) -> Client {
        self.0.connect(database)
    }
}

/// A model endpoint that always fails (500, which says nothing of load) and counts what it was
/// asked.
fn failing_endpoint() -> ScriptedLlm {
    let llm = ScriptedLlm::start();
    llm.respond_with(|_| {
        Some(Reply::Status(
            500,
            r#"{"error":{"message":"internal error"}}"#.into(),
        ))
    });
    llm
}

/// The request no role shapes that the chain asks an endpoint that failed a question.
const PROBE: &str = "Reply with the word OK.";

/// The questions `llm` was asked, the chain's probes left out.
fn questions(llm: &ScriptedLlm) -> usize {
    llm.requests()
        .iter()
        .filter(|r| r.last_message() != PROBE)
        .count()
}

/// Asks `question` on a new connection (a new backend) from `connect`; returns the trace.
fn ask_fresh(connect: impl Fn() -> Client, settings: &str, question: &str) -> serde_json::Value {
    let mut client = connect();
    client.batch_execute(settings).unwrap();
    let text: String = client
        .query_one("SELECT nl_trace($1)::text", &[&question])
        .unwrap()
        .get(0);
    serde_json::from_str(&text).unwrap()
}

#[test]
fn a_dead_endpoint_is_skipped_by_every_backend_of_a_preloaded_server_but_a_timeout_is_not_shared() {
    let server = Preloaded::start();
    let (dead, slow, healthy) = (
        failing_endpoint(),
        ScriptedLlm::start(),
        ScriptedLlm::start(),
    );
    healthy.respond_with(|_| Some(Reply::sql("SELECT count(*) AS n FROM customers")));
    // Slow for questions; the chain's probe (a request no role shapes) it answers at once.
    slow.respond_with(|request| {
        (request.last_message() != PROBE).then(|| {
            Reply::Slow(
                std::time::Duration::from_millis(3000),
                Box::new(Reply::sql("SELECT count(*) AS n FROM customers")),
            )
        })
    });
    let chain = |first: &ScriptedLlm| {
        format!(
            "SET sql_query_engine.llm_url = '{}'; SET sql_query_engine.llm_fallbacks = '{}';
             SET sql_query_engine.vote = off;",
            first.url(),
            healthy.url()
        )
    };
    let connect = || server.connect("shop");

    // One backend finds the endpoint dead and falls back; a new backend skips it at once.
    let first = ask_fresh(connect, &chain(&dead), "count the customers");
    assert_eq!(first["status"], "ok");
    assert_eq!(
        first["attempts"][0]["endpoint_failures"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let asked = dead.requests().len();
    let second = ask_fresh(connect, &chain(&dead), "count the customers again");
    assert_eq!(second["status"], "ok");
    assert_eq!(dead.requests().len(), asked, "the new backend skipped it");
    assert_eq!(
        second["attempts"][0]["endpoint_failures"],
        serde_json::json!([])
    );

    // No answer in time from an endpoint that answers a request no role shapes says nothing
    // about it, even under the server's own llm_timeout: how long a model takes is the
    // request's to shape (its question, the temperature, the candidates asked for). The
    // question goes on to the fallback with the time left, and the next backend asks the slow
    // endpoint again.
    let mut admin = connect();
    admin
        .batch_execute("ALTER SYSTEM SET sql_query_engine.llm_timeout = 2000")
        .unwrap();
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let before = questions(&slow);
    for question in ["count them in time", "count them in time again"] {
        let traced = ask_fresh(connect, &chain(&slow), question);
        assert_eq!(traced["status"], "ok", "{traced}");
    }
    assert_eq!(
        questions(&slow),
        before + 2,
        "the slow endpoint was skipped after a timeout"
    );
    // Nor one that answers nothing in time, not even that request: its queue may be full of
    // the roles' own requests. The question goes on each time; the endpoint is asked again.
    let hung = ScriptedLlm::start();
    hung.respond_with(|_| {
        Some(Reply::Slow(
            std::time::Duration::from_millis(3000),
            Box::new(Reply::sql("SELECT count(*) AS n FROM customers")),
        ))
    });
    let traced = ask_fresh(connect, &chain(&hung), "count them while it hangs");
    assert_eq!(traced["status"], "ok", "{traced}");
    let asked = questions(&hung);
    let traced = ask_fresh(connect, &chain(&hung), "count them while it still hangs");
    assert_eq!(traced["status"], "ok", "{traced}");
    assert_eq!(
        questions(&hung),
        asked + 1,
        "the new backend asked it again"
    );
    admin
        .batch_execute("ALTER SYSTEM RESET sql_query_engine.llm_timeout")
        .unwrap();
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));

    // A timeout under a role's own shorter llm_timeout says nothing about the endpoint, nor
    // sends the question on to the fallback (the role would choose where its questions go):
    // the call fails, and the next backend, with the server's timeout, asks the endpoint
    // again and gets its answer.
    let impatient = format!("{} SET sql_query_engine.llm_timeout = 2000;", chain(&slow));
    let asked = questions(&slow);
    let answered_by_fallback = healthy.requests().len();
    let mut client = connect();
    client.batch_execute(&impatient).unwrap();
    let error = client
        .query_one("SELECT nl_trace('count them quickly')::text", &[])
        .unwrap_err();
    assert_eq!(db_error(&error).0, "58000", "{error}");
    assert_eq!(questions(&slow), asked + 1);
    assert_eq!(healthy.requests().len(), answered_by_fallback);
    let patient = ask_fresh(connect, &chain(&slow), "count them patiently");
    assert_eq!(patient["status"], "ok");
    assert_eq!(
        questions(&slow),
        asked + 2,
        "the slow endpoint was asked again"
    );
    assert_eq!(
        patient["attempts"][0]["endpoint"],
        format!("{}/chat/completions", slow.url())
    );

    // The control: on a server without the library preloaded, each backend finds out alone.
    let s = Session::new();
    let dead_elsewhere = failing_endpoint();
    let on_shared_cluster = || cluster().connect(&s.database);
    ask_fresh(
        on_shared_cluster,
        &chain(&dead_elsewhere),
        "count the customers",
    );
    let asked = questions(&dead_elsewhere);
    ask_fresh(
        on_shared_cluster,
        &chain(&dead_elsewhere),
        "count them again",
    );
    assert_eq!(questions(&dead_elsewhere), asked + 1);
}

#[test]
fn a_429_to_what_one_role_asked_is_not_shared_unless_a_request_no_role_shapes_fails_too() {
    // A provider answers 429 to a single request over its tokens per minute: a role shapes
    // that (max_tokens, candidates, the question's length). It must not send every other
    // role to the fallback endpoints with it, nor its own question.
    let server = Preloaded::start();
    let (picky, healthy) = (ScriptedLlm::start(), ScriptedLlm::start());
    picky.respond_with(|request| {
        if request.body.to_string().contains("enormous") {
            Some(Reply::Status(
                429,
                r#"{"error":{"message":"Request too large for tokens per min"}}"#.into(),
            ))
        } else {
            Some(Reply::sql("SELECT count(*) AS n FROM customers"))
        }
    });
    healthy.respond_with(|_| Some(Reply::sql("SELECT count(*) AS n FROM customers")));
    let chain = format!(
        "SET sql_query_engine.llm_url = '{}'; SET sql_query_engine.llm_fallbacks = '{}';
         SET sql_query_engine.vote = off;",
        picky.url(),
        healthy.url()
    );
    let connect = || server.connect("shop");
    let mut client = connect();
    client.batch_execute(&chain).unwrap();
    let error = client
        .query_one(
            "SELECT nl_trace('an enormous question: count the customers')::text",
            &[],
        )
        .unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "58000", "{message}");
    assert!(message.contains("429"), "{message}");
    assert_eq!(healthy.requests().len(), 0, "nor sent on to the fallback");
    // The endpoint was asked a request no role shapes, which it answered.
    let probes = picky.requests();
    assert!(
        probes
            .iter()
            .any(|r| r.body["max_tokens"] == 16 && !r.body.to_string().contains("enormous")),
        "{:?}",
        probes
            .iter()
            .map(|r| r.body.to_string())
            .collect::<Vec<_>>()
    );
    // A new backend (another role's, as far as the breaker goes) asks the primary again.
    let next = ask_fresh(connect, &chain, "count the customers");
    assert_eq!(next["status"], "ok", "{next}");
    assert_eq!(
        next["attempts"][0]["endpoint"],
        format!("{}/chat/completions", picky.url()),
        "{next}"
    );
}

/// An endpoint that refuses a temperature (reasoning models take only 1) answers a role that
/// set that temperature with a 400; the chain's probe, sent at its own temperature, got the
/// same 400 and the endpoint was taken for down, for every backend: one role sent every
/// other to the fallbacks by setting a temperature. A 400 to the probe says nothing of the
/// endpoint now: the call's error, and the next backend asks the endpoint again.
#[test]
fn a_request_the_endpoint_refuses_to_the_probe_too_is_not_the_endpoint_down() {
    let server = Preloaded::start();
    let (picky, healthy) = (ScriptedLlm::start(), ScriptedLlm::start());
    picky.respond_with(|request| {
        if request.body["temperature"].as_f64() == Some(1.0) {
            Some(Reply::sql("SELECT count(*) AS n FROM customers"))
        } else {
            Some(Reply::Status(
                400,
                r#"{"error":{"message":"temperature: only 1 is supported"}}"#.into(),
            ))
        }
    });
    healthy.respond_with(|_| Some(Reply::sql("SELECT count(*) AS n FROM customers")));
    let chain = |temperature: u8| {
        format!(
            "SET sql_query_engine.llm_url = '{}'; SET sql_query_engine.llm_fallbacks = '{}';
             SET sql_query_engine.vote = off; SET sql_query_engine.max_repairs = 0;
             SET sql_query_engine.temperature = {temperature};",
            picky.url(),
            healthy.url()
        )
    };
    let connect = || server.connect("shop");
    let mut client = connect();
    client.batch_execute(&chain(0)).unwrap();
    let error = client
        .query_one("SELECT nl_trace('count the customers')::text", &[])
        .unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "58000", "{message}");
    assert!(message.contains("400"), "{message}");
    assert_eq!(healthy.requests().len(), 0, "nor sent on to the fallback");
    assert!(
        picky.requests().iter().any(|r| r.last_message() == PROBE),
        "the endpoint was probed"
    );
    let next = ask_fresh(connect, &chain(1), "count the customers");
    assert_eq!(next["status"], "ok", "{next}");
    assert_eq!(
        next["attempts"][0]["endpoint"],
        format!("{}/chat/completions", picky.url()),
        "{next}"
    );
}

#[test]
fn an_answer_longer_than_max_response_bytes_is_the_requests_failure_not_the_endpoints() {
    // How long an answer is, the request shapes (its question, temperature, candidates): a
    // role must not be able to send every other role to the fallback endpoints with it.
    let server = Preloaded::start();
    let (long, healthy) = (ScriptedLlm::start(), ScriptedLlm::start());
    long.respond_with(|request| {
        (request.last_message() != PROBE).then(|| Reply::Content("x".repeat(8192)))
    });
    healthy.respond_with(|_| Some(Reply::sql("SELECT count(*) AS n FROM customers")));
    let settings = format!(
        "SET sql_query_engine.llm_url = '{}'; SET sql_query_engine.llm_fallbacks = '{}';
         SET sql_query_engine.vote = off; SET sql_query_engine.max_response_bytes = 1024;",
        long.url(),
        healthy.url()
    );
    // Nor its own questions, to the fallback: the call's error, the endpoint asked again next.
    let connect = || server.connect("shop");
    for question in ["count the customers", "count the customers again"] {
        let before = questions(&long);
        let mut client = connect();
        client.batch_execute(&settings).unwrap();
        let error = client
            .query_one("SELECT nl_trace($1)::text", &[&question])
            .unwrap_err();
        let (code, message, _) = db_error(&error);
        assert_eq!(code, "58000", "{message}");
        assert!(message.contains("max_response_bytes"), "{message}");
        assert_eq!(
            questions(&long),
            before + 1,
            "the endpoint of the long answer was skipped"
        );
    }
    assert_eq!(healthy.requests().len(), 0, "nothing was sent on");
}

#[test]
fn bounds_set_for_all_roles_hold_whatever_a_role_connects_with() {
    // ALTER ROLE ALL's values are applied after a connection's own options and a role's
    // stored values: a role must not keep a higher value that arrived first.
    let server = Preloaded::start();
    let llm = ScriptedLlm::start();
    llm.respond_with(|_| Some(Reply::sql("SELECT name FROM customers ORDER BY name")));
    let mut admin = server.connect("shop");
    admin
        .batch_execute(&format!(
            "CREATE ROLE analyst LOGIN; GRANT SELECT ON customers TO analyst;
             ALTER ROLE analyst SET sql_query_engine.max_rows = 3;
             ALTER ROLE ALL SET sql_query_engine.max_rows = 2;
             ALTER ROLE ALL SET sql_query_engine.sample_values = 0;
             ALTER ROLE ALL SET sql_query_engine.llm_url = '{}';",
            llm.url()
        ))
        .unwrap();
    admin
        .batch_execute("ALTER SYSTEM SET sql_query_engine.max_rows = 50")
        .unwrap();
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let mut config = postgres::Config::new();
    config
        .host_path(&server.0.dir)
        .port(server.0.port)
        .user("analyst")
        .dbname("shop")
        .options("-c sql_query_engine.sample_values=3");
    let mut analyst = config.connect(NoTls).unwrap();
    let rows = |client: &mut Client| -> i64 {
        client
            .query_one(
                "SELECT count(*) FROM nl_run('SELECT name FROM customers')",
                &[],
            )
            .unwrap()
            .get(0)
    };
    assert_eq!(rows(&mut analyst), 2, "ALTER ROLE ALL's max_rows");
    let schema: String = analyst.query_one("SELECT nl_schema()", &[]).unwrap().get(0);
    assert!(schema.contains("customers"), "{schema}");
    for name in ["Ada", "Bruno", "GB"] {
        assert!(!schema.contains(name), "a sample value was shown: {schema}");
    }
    // A reload reads the file again, not ALTER ROLE ALL's values: the ceiling stays.
    analyst.batch_execute("SELECT pg_reload_conf()").ok();
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let raised = analyst.batch_execute("SET sql_query_engine.max_rows = 40");
    assert_eq!(
        raised.unwrap_err().code(),
        Some(&postgres::error::SqlState::INSUFFICIENT_PRIVILEGE)
    );
    assert_eq!(rows(&mut analyst), 2);
    analyst
        .batch_execute("SET sql_query_engine.max_rows = 1")
        .unwrap();
    assert_eq!(rows(&mut analyst), 1, "a role lowers a bound for itself");
    // A superuser may still raise it for its own session.
    admin
        .batch_execute("SET sql_query_engine.max_rows = 4")
        .unwrap();
    let all: i64 = admin
        .query_one(
            "SELECT count(*) FROM nl_run('SELECT name FROM customers')",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(all, 4);
}

/// How many columns of a relation have a shared read in Redis (a key each).
fn shared_reads(redis: &RedisServer, client: &mut Client, table: &str) -> usize {
    shared_reads_of(redis, client, table, false)
}

/// `shared_reads`, of the table's present storage or (`any_storage`) of any.
fn shared_reads_of(
    redis: &RedisServer,
    client: &mut Client,
    table: &str,
    any_storage: bool,
) -> usize {
    let (system, database, relation, filenode): (String, u32, u32, u32) = {
        let row = client
            .query_one(
                "SELECT (SELECT system_identifier::text FROM pg_control_system()), \
                 (SELECT oid FROM pg_database WHERE datname = current_database()), \
                 oid, relfilenode FROM pg_class WHERE oid = $1::text::regclass",
                &[&table],
            )
            .unwrap();
        (row.get(0), row.get(1), row.get(2), row.get(3))
    };
    let storage = if any_storage {
        "*".to_string()
    } else {
        filenode.to_string()
    };
    let mut r = redis.client().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!(
            "sql_query_engine:{system}:{database}:shared:values:{relation}:{storage}:*"
        ))
        .query(&mut r)
        .unwrap();
    keys.len()
}

/// Each column's shared read is a key of its own, which only a write of that read renews: in
/// one key per relation, a write of one column renewed the expiry of every column's read kept
/// beside it (a dropped column's large read too), unpaid by the role's share of Redis.
#[test]
fn a_shared_read_lives_only_as_long_as_its_own_write() {
    let redis = RedisServer::start();
    let mut s = Session::new();
    let reader = format!("pairs_reader_{}", std::process::id());
    let db = s.database.clone();
    s.client
        .batch_execute(&format!(
            "CREATE TABLE pairs (id int, left_name text, right_name text);
             INSERT INTO pairs VALUES (1, 'Ostrava', 'Plzen'), (2, 'Brno', 'Olomouc');
             CREATE ROLE {reader} LOGIN; GRANT SELECT ON pairs TO {reader};
             ALTER DATABASE {db} SET sql_query_engine.llm_url = '{}';
             ALTER DATABASE {db} SET sql_query_engine.redis_url = '{}';",
            s.llm.url(),
            redis.url()
        ))
        .unwrap();
    let build = || -> String {
        cluster()
            .connect_as(&db, &reader)
            .query_one("SELECT nl_schema('pairs of Ostrava and Plzen')", &[])
            .unwrap()
            .get(0)
    };
    assert!(build().contains("'Ostrava' found in pairs.left_name"));
    assert_eq!(
        shared_reads(&redis, &mut s.client, "pairs"),
        2,
        "a key per column"
    );
    let mut r = redis.client().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("sql_query_engine:*:shared:values:*")
        .query(&mut r)
        .unwrap();
    let key_of = |attnum: &str| {
        keys.iter()
            .find(|k| k.ends_with(&format!(":{attnum}")))
            .cloned()
            .unwrap()
    };
    let (left, right) = (key_of("2"), key_of("3"));
    // The right column's read near its end; the left one's gone, read and shared again by the
    // next build, which renews only its own.
    let _: () = redis::cmd("EXPIRE")
        .arg(&right)
        .arg(30)
        .query(&mut r)
        .unwrap();
    let _: () = redis::cmd("DEL").arg(&left).query(&mut r).unwrap();
    assert!(build().contains("'Plzen' found in pairs.right_name"));
    let ttl = |key: &str, r: &mut redis::Connection| -> i64 {
        redis::cmd("TTL").arg(key).query(r).unwrap()
    };
    assert!(
        ttl(&left, &mut r) > 500,
        "the left column's read is shared again"
    );
    assert!(
        ttl(&right, &mut r) <= 30,
        "the right column's read was renewed by the left one's write"
    );
}

#[test]
fn value_reads_are_shared_through_redis_only_where_they_are_the_same_for_every_role() {
    let redis = RedisServer::start();
    let mut s = Session::new();
    let id = std::process::id();
    let (first, second) = (format!("reader_a_{id}"), format!("reader_b_{id}"));
    let db = s.database.clone();
    s.client
        .batch_execute(&format!(
            "CREATE TABLE shipments (id int, city text);
             INSERT INTO shipments VALUES (1, 'Zaragoza'), (2, 'Tromsø');
             CREATE TABLE notes (id int, topic text);
             INSERT INTO notes VALUES (1, 'Quarterly pruning');
             ALTER TABLE notes ENABLE ROW LEVEL SECURITY;
             CREATE POLICY everyone ON notes USING (true);
             CREATE TABLE drafts (id int, title text);
             CREATE ROLE {first} LOGIN; CREATE ROLE {second} LOGIN;
             GRANT SELECT ON shipments, notes, drafts TO {first}, {second};
             ALTER DATABASE {db} SET sql_query_engine.llm_url = '{}';
             ALTER DATABASE {db} SET sql_query_engine.redis_url = '{}';",
            s.llm.url(),
            redis.url()
        ))
        .unwrap();
    let schema_for = |role: &str, question: &str| -> String {
        cluster()
            .connect_as(&db, role)
            .query_one("SELECT nl_schema($1)", &[&question])
            .unwrap()
            .get(0)
    };
    // What a transaction that wrote reads (its own rows, which nobody else sees yet) is not
    // shared: nothing of that build reaches Redis.
    s.client
        .batch_execute(&format!(
            "SET sql_query_engine.redis_url = '{}'",
            redis.url()
        ))
        .unwrap();
    s.client.batch_execute("BEGIN").unwrap();
    s.client
        .batch_execute("INSERT INTO drafts VALUES (1, 'Uncommitted Ideas')")
        .unwrap();
    let own: String = s
        .client
        .query_one("SELECT nl_schema('drafts about Uncommitted Ideas')", &[])
        .unwrap()
        .get(0);
    assert!(
        own.contains("'Uncommitted Ideas' found in drafts.title"),
        "{own}"
    );
    s.client.batch_execute("ROLLBACK").unwrap();
    assert_eq!(shared_reads(&redis, &mut s.client, "drafts"), 0);
    assert_eq!(shared_reads(&redis, &mut s.client, "shipments"), 0);

    // The first role's backend reads the table and shares what it read.
    let seen = schema_for(&first, "shipments to Zaragoza");
    assert!(
        seen.contains("'Zaragoza' found in shipments.city"),
        "{seen}"
    );
    assert_eq!(shared_reads(&redis, &mut s.client, "shipments"), 1);
    // The table changes in place; another role's new backend takes the shared read instead of
    // reading the table again, so it still knows the old value and not the new one.
    s.client
        .batch_execute("UPDATE shipments SET city = 'Zamora' WHERE id = 1")
        .unwrap();
    let shared = schema_for(&second, "shipments to Zaragoza");
    assert!(
        shared.contains("'Zaragoza' found in shipments.city"),
        "{shared}"
    );
    let later = schema_for(&second, "shipments to Zamora");
    assert!(!later.contains("'Zamora' found"), "{later}");
    // A role granted the table after the read does not take it (it would learn a value
    // changed before it was given the table): a read is shared under who could read the
    // table when it was made.
    let third = format!("third_{db}");
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {third} LOGIN; GRANT SELECT ON shipments TO {third};"
        ))
        .unwrap();
    let granted = schema_for(&third, "shipments to Zaragoza or Zamora");
    assert!(
        !granted.contains("'Zaragoza' found") && granted.contains("'Zamora' found"),
        "{granted}"
    );

    // A REPEATABLE READ transaction reads with the snapshot it began with: rows deleted
    // since are in its read, which is not shared (it would give them a new lease in Redis).
    s.client
        .batch_execute(&format!(
            "CREATE TABLE parcels (id int, city text);
             INSERT INTO parcels VALUES (1, 'Oviedo'), (2, 'Lugo');
             GRANT SELECT ON parcels TO {first}, {second};"
        ))
        .unwrap();
    let mut old_snapshot = cluster().connect_as(&db, &first);
    old_snapshot
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM parcels")
        .unwrap();
    s.client
        .batch_execute("DELETE FROM parcels WHERE city = 'Oviedo'")
        .unwrap();
    let read: String = old_snapshot
        .query_one("SELECT nl_schema('parcels to Oviedo')", &[])
        .unwrap()
        .get(0);
    assert!(read.contains("'Oviedo' found in parcels.city"), "{read}");
    old_snapshot.batch_execute("COMMIT").unwrap();
    assert_eq!(shared_reads(&redis, &mut s.client, "parcels"), 0);
    let fresh = schema_for(&second, "parcels to Oviedo");
    assert!(!fresh.contains("'Oviedo' found"), "{fresh}");

    // A partitioned table's read is not shared: a partition attached while it ran, and
    // detached again, would leave its rows under the partition set of before. Each backend
    // reads it, so a TRUNCATE shows at once.
    s.client
        .batch_execute(&format!(
            "CREATE TABLE deliveries (id int, city text) PARTITION BY LIST (id);
             CREATE TABLE deliveries_1 PARTITION OF deliveries FOR VALUES IN (1, 2);
             INSERT INTO deliveries VALUES (1, 'Valladolid'), (2, 'Bergen');
             GRANT SELECT ON deliveries TO {first}, {second};"
        ))
        .unwrap();
    let seen = schema_for(&first, "deliveries to Valladolid");
    assert!(
        seen.contains("'Valladolid' found in deliveries.city"),
        "{seen}"
    );
    assert_eq!(
        shared_reads_of(&redis, &mut s.client, "deliveries", true),
        0
    );
    s.client
        .batch_execute("TRUNCATE deliveries; INSERT INTO deliveries VALUES (1, 'Salamanca')")
        .unwrap();
    let after = schema_for(&second, "deliveries to Salamanca, not Valladolid");
    assert!(
        after.contains("'Salamanca' found in deliveries.city") && !after.contains("'Valladolid'"),
        "{after}"
    );

    // A table with row-level security is never read on the extension's own behalf (its
    // policies are their owner's code), so nothing of it is shared either; a new backend in a
    // transaction that wrote nothing shares what it read.
    let _: String = cluster()
        .connect(&db)
        .query_one("SELECT nl_schema('notes on Quarterly pruning')", &[])
        .unwrap()
        .get(0);
    assert_eq!(shared_reads(&redis, &mut s.client, "drafts"), 1);
    assert_eq!(shared_reads(&redis, &mut s.client, "notes"), 0);
}
