//! On a hot standby, a real streaming replica of the test cluster: questions are answered
//! read-only, and DDL on the primary reaches an open standby connection's schema context as soon
//! as it is replayed (relcache invalidations and the COMMENT count replay with the WAL).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};
use sql_query_engine_e2e::cluster::{free_port, run_script};
use sql_query_engine_e2e::redis::RedisServer;
use sql_query_engine_e2e::{cluster, Reply, ScriptedLlm};

/// A standby started from a base backup of the test cluster; stopped and removed on drop.
struct Standby {
    dir: PathBuf,
    port: u16,
}

impl Standby {
    fn start() -> Standby {
        let primary = cluster();
        let dir = sql_query_engine_e2e::fresh_dir("sqe-standby");
        // SAFETY: reads the effective user id.
        let root = unsafe { libc::geteuid() } == 0;
        if root {
            Command::new("chown")
                .arg("postgres:postgres")
                .arg(&dir)
                .status()
                .unwrap();
        }
        let bindir = Command::new(
            std::env::var("PG_CONFIG")
                .unwrap_or_else(|_| "/usr/lib/postgresql/15/bin/pg_config".into()),
        )
        .arg("--bindir")
        .output()
        .unwrap();
        let basebackup = format!(
            "{}/pg_basebackup",
            String::from_utf8_lossy(&bindir.stdout).trim()
        );
        let mut command = if root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", &basebackup]);
            c
        } else {
            Command::new(&basebackup)
        };
        let status = command
            .args([
                "-h",
                &primary.host,
                "-p",
                &primary.port.to_string(),
                "-U",
                &primary.user,
            ])
            .arg("-D")
            .arg(dir.join("data"))
            .args(["-R", "-X", "stream", "-c", "fast"])
            .status()
            .unwrap();
        assert!(status.success(), "pg_basebackup failed");
        let port = free_port();
        run_script(&["start", dir.to_str().unwrap(), &port.to_string()]);
        Standby { dir, port }
    }

    fn connect(&self, database: &str) -> Client {
        let config = format!(
            "host={} port={} user={} dbname={database}",
            self.dir.display(),
            self.port,
            cluster().user
        );
        Client::connect(&config, NoTls).unwrap()
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        run_script(&["stop", self.dir.to_str().unwrap_or("")]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits until the standby has replayed everything the primary has written so far.
fn wait_for_replay(primary: &mut Client, standby: &mut Client) {
    let lsn: String = primary
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .unwrap()
        .get(0);
    let started = Instant::now();
    loop {
        let caught_up: bool = standby
            .query_one(
                "SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn",
                &[&lsn],
            )
            .unwrap()
            .get(0);
        if caught_up {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the standby did not catch up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_hot_standby_answers_and_sees_ddl_as_soon_as_it_is_replayed() {
    if cluster().own_dir().is_none() {
        eprintln!("skipped: needs a cluster this test started (SQE_TEST_PGHOST is set)");
        return;
    }
    let database = cluster().fresh_database();
    let mut primary = cluster().connect(&database);
    let standby = Standby::start();
    let mut replica = standby.connect(&database);
    let llm = ScriptedLlm::start();
    llm.on(
        "how many customers",
        vec![Reply::sql("SELECT count(*) AS n FROM customers")],
    );
    replica
        .batch_execute(&format!("SET sql_query_engine.llm_url = '{}'", llm.url()))
        .unwrap();
    let in_recovery: bool = replica
        .query_one("SELECT pg_is_in_recovery()", &[])
        .unwrap()
        .get(0);
    assert!(in_recovery);
    let n: String = replica
        .query_one("SELECT nl_query('how many customers')::text", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, r#"{"n": 4}"#);
    let before: String = replica.query_one("SELECT nl_schema()", &[]).unwrap().get(0);
    assert!(!before.contains("loyalty"));

    primary
        .batch_execute(
            "ALTER TABLE customers ADD COLUMN loyalty integer;
             COMMENT ON TABLE orders IS 'every order ever taken';",
        )
        .unwrap();
    wait_for_replay(&mut primary, &mut replica);
    let after: String = replica.query_one("SELECT nl_schema()", &[]).unwrap().get(0);
    assert!(after.contains("loyalty integer"), "{after}");
    assert!(after.contains("every order ever taken"), "{after}");

    primary
        .batch_execute("COMMENT ON COLUMN customers.loyalty IS 'points collected'")
        .unwrap();
    wait_for_replay(&mut primary, &mut replica);
    let again: String = replica.query_one("SELECT nl_schema()", &[]).unwrap().get(0);
    assert!(again.contains("points collected"), "{again}");
}

/// A session's turns on a standby: the table cannot be written there, so Redis keeps them
/// when configured (shared by the standby's connections), else backend memory.
fn trace_in(client: &mut Client, question: &str, session: &str) -> serde_json::Value {
    let text: String = client
        .query_one("SELECT nl_trace($1, $2)::text", &[&question, &session])
        .unwrap()
        .get(0);
    serde_json::from_str(&text).unwrap()
}

#[test]
fn sessions_on_a_hot_standby_live_in_redis_or_backend_memory() {
    if cluster().own_dir().is_none() {
        eprintln!("skipped: needs a cluster this test started (SQE_TEST_PGHOST is set)");
        return;
    }
    let database = cluster().fresh_database();
    let standby = Standby::start();
    let llm = ScriptedLlm::start();
    llm.on(
        "customers first",
        vec![Reply::sql("SELECT name FROM customers"); 2],
    );
    llm.on(
        "then their countries",
        vec![Reply::sql("SELECT country FROM customers"); 4],
    );
    let settings = format!(
        "SET sql_query_engine.llm_url = '{}'; SET sql_query_engine.vote = off;",
        llm.url()
    );
    let mut replica = standby.connect(&database);
    replica.batch_execute(&settings).unwrap();
    assert_eq!(
        trace_in(&mut replica, "customers first", "s1")["session_store"],
        "memory"
    );
    trace_in(&mut replica, "then their countries", "s1");
    assert!(llm
        .requests()
        .last()
        .unwrap()
        .text()
        .contains("customers first"));

    let redis = RedisServer::start();
    let with_redis = format!(
        "{settings} SET sql_query_engine.redis_url = '{}';",
        redis.url()
    );
    replica.batch_execute(&with_redis).unwrap();
    assert_eq!(
        trace_in(&mut replica, "customers first", "s2")["session_store"],
        "redis"
    );
    // another connection to the standby finds the session in Redis
    let mut other = standby.connect(&database);
    other.batch_execute(&with_redis).unwrap();
    trace_in(&mut other, "then their countries", "s2");
    let follow_up = llm.requests().last().unwrap().text();
    assert!(follow_up.contains("customers first"), "{follow_up}");
    // The standby reads its tables for the value index as of its replay, which may be far
    // behind the primary's (its data, and what a role may read there): it never shares its
    // own reads, nor takes the primary's.
    let schema: String = other
        .query_one("SELECT nl_schema('customers called Bruno')", &[])
        .unwrap()
        .get(0);
    assert!(
        schema.contains("'Bruno' found in customers.name"),
        "{schema}"
    );
    let mut r = redis.client().unwrap();
    let shared: Vec<String> = redis::cmd("KEYS")
        .arg("sql_query_engine:*:shared:values:*")
        .query(&mut r)
        .unwrap();
    assert!(shared.is_empty(), "{shared:?}");
    // A read the primary shared, its values changed in Redis, is not taken: a new connection
    // to the primary takes it (the key is the one both servers would use), the standby's not.
    let (relation, attnum): (u32, i16) = {
        let row = other
            .query_one(
                "SELECT c.oid, a.attnum FROM pg_class c \
                 JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'name' \
                 WHERE c.oid = 'customers'::regclass",
                &[],
            )
            .unwrap();
        (row.get(0), row.get(1))
    };
    let on_primary = || {
        let mut client = cluster().connect(&database);
        client.batch_execute(&with_redis).unwrap();
        client
    };
    let _: String = on_primary()
        .query_one("SELECT nl_schema('customers called Bruno')", &[])
        .unwrap()
        .get(0);
    let shared: Vec<String> = redis::cmd("KEYS")
        .arg(format!(
            "sql_query_engine:*:shared:values:{relation}:*:{attnum}"
        ))
        .query(&mut r)
        .unwrap();
    assert_eq!(shared.len(), 1, "{shared:?}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let _: () = redis::cmd("SET")
        .arg(&shared[0])
        .arg(serde_json::json!([now, ["Zanzibar Imports"]]).to_string())
        .arg("EX")
        .arg(600)
        .query(&mut r)
        .unwrap();
    let asked = "SELECT nl_schema('customers called Zanzibar Imports')";
    let schema: String = on_primary().query_one(asked, &[]).unwrap().get(0);
    assert!(schema.contains("'Zanzibar Imports' found"), "{schema}");
    let mut fresh = standby.connect(&database);
    fresh.batch_execute(&with_redis).unwrap();
    let schema: String = fresh.query_one(asked, &[]).unwrap().get(0);
    assert!(!schema.contains("Zanzibar"), "{schema}");
}

/// One deployment, one session store: with Redis, a conversation begun on the primary goes on
/// on the standby; the standby writes no history, and the primary records the answer the
/// standby gave (`nl_history_add`, as the gateway does), as the role that asked.
#[test]
fn a_conversation_moves_from_the_primary_to_a_standby_and_its_history_to_the_primary() {
    if cluster().own_dir().is_none() {
        eprintln!("skipped: needs a cluster this test started (SQE_TEST_PGHOST is set)");
        return;
    }
    let database = cluster().fresh_database();
    let redis = RedisServer::start();
    let llm = ScriptedLlm::start();
    let role = format!("hopper_{}", std::process::id());
    let mut primary = cluster().connect(&database);
    primary
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT SELECT ON customers TO {role};
             ALTER DATABASE {database} SET sql_query_engine.llm_url = '{}';
             ALTER DATABASE {database} SET sql_query_engine.vote = off;
             ALTER DATABASE {database} SET sql_query_engine.redis_url = '{}';",
            llm.url(),
            redis.url()
        ))
        .unwrap();
    let standby = Standby::start();
    wait_for_replay(&mut primary, &mut standby.connect(&database));
    let as_role = |port: u16, host: &str| {
        Client::connect(
            &format!("host={host} port={port} user={role} dbname={database}"),
            NoTls,
        )
        .unwrap()
    };
    let mut on_primary = as_role(cluster().port, &cluster().host);
    let mut on_standby = as_role(standby.port, &standby.dir.display().to_string());
    llm.on(
        "customers on the primary",
        vec![Reply::sql("SELECT count(*) AS n FROM customers")],
    );
    llm.on(
        "and from Germany, on the standby",
        vec![Reply::sql(
            "SELECT count(*) AS n FROM customers WHERE country = 'DE'",
        )],
    );
    let first = trace_in(&mut on_primary, "customers on the primary", "hop");
    assert_eq!(first["session_store"], "redis");
    let store: String = on_standby
        .query_one("SELECT nl_session_store()", &[])
        .unwrap()
        .get(0);
    assert_eq!(store, "redis");
    let text: String = on_standby
        .query_one(
            "SELECT nl_ask('and from Germany, on the standby', 'hop')::text",
            &[],
        )
        .unwrap()
        .get(0);
    let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["session_store"], "redis");
    assert_eq!(answer["context_turns"], 1);
    assert_eq!(answer["rows"], serde_json::json!([[2]]));
    assert!(
        answer["history_id"].is_null(),
        "a standby writes no history"
    );
    assert!(llm
        .requests()
        .last()
        .unwrap()
        .text()
        .contains("customers on the primary"));

    // The standby cannot record it; the primary can, as the role, and feedback then works.
    let refused = on_standby
        .query_one("SELECT nl_history_add($1::text::jsonb)", &[&text])
        .unwrap_err();
    assert_eq!(
        refused.as_db_error().map(|e| e.code().code()),
        Some("25006")
    );
    let id: i64 = on_primary
        .query_one(
            "SELECT nl_history_add($1::text::jsonb, 'nl_ask', 'hop')",
            &[&text],
        )
        .unwrap()
        .get(0);
    let row = primary
        .query_one(
            "SELECT role_id::regrole::text, question, sql, status, row_count, session \
             FROM nl_history WHERE id = $1",
            &[&id],
        )
        .unwrap();
    assert_eq!(row.get::<_, String>(0), role);
    assert_eq!(row.get::<_, String>(1), "and from Germany, on the standby");
    assert!(row.get::<_, String>(2).contains("country = 'DE'"));
    assert_eq!(row.get::<_, String>(3), "ok");
    assert_eq!(row.get::<_, i32>(4), 1);
    assert_eq!(row.get::<_, String>(5), "hop");
    let feedback: String = on_primary
        .query_one("SELECT nl_feedback($1, true)::text", &[&id])
        .unwrap()
        .get(0);
    assert!(feedback.contains("\"status\": \"pending\""), "{feedback}");
    // What is not an answer is refused, naming what is missing.
    let junk = on_primary
        .query_one("SELECT nl_history_add('{\"sql\": \"SELECT 1\"}')", &[])
        .unwrap_err();
    assert_eq!(junk.as_db_error().map(|e| e.code().code()), Some("22023"));
    let elsewhere = on_primary
        .query_one(
            "SELECT nl_history_add($1::text::jsonb, 'nl_view')",
            &[&text],
        )
        .unwrap_err();
    assert_eq!(
        elsewhere.as_db_error().map(|e| e.code().code()),
        Some("22023")
    );
}
