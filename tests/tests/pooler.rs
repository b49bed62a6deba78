//! Sessions through a real pgbouncer in transaction mode: a follow-up served by another backend
//! finds its context (the extension's table), and `DISCARD ALL` forgets what backend memory
//! holds (where the table cannot be written).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};
use sql_query_engine_e2e::cluster::free_port;
use sql_query_engine_e2e::{cluster, Reply, ScriptedLlm, Session};

/// pgbouncer in transaction mode in front of the test cluster, two server connections per pool.
struct Pgbouncer {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Drop for Pgbouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Pgbouncer {
    fn start() -> Pgbouncer {
        Pgbouncer::with_pool(2, &[])
    }

    /// pgbouncer with `size` server connections per database and user, for the test cluster's
    /// user and `users` (pgbouncer knows only the users of its file, also with trust).
    fn with_pool(size: usize, users: &[&str]) -> Pgbouncer {
        let c = cluster();
        let port = free_port();
        let dir = sql_query_engine_e2e::fresh_dir("sqe-pgbouncer");
        let known: String = std::iter::once(c.user.as_str())
            .chain(users.iter().copied())
            .map(|user| format!("\"{user}\" \"\"\n"))
            .collect();
        std::fs::write(dir.join("users.txt"), known).unwrap();
        std::fs::write(
            dir.join("pgbouncer.ini"),
            format!(
                "[databases]\n* = host={} port={}\n\n[pgbouncer]\nlisten_addr = 127.0.0.1\n\
                 listen_port = {port}\nunix_socket_dir =\nauth_type = trust\nauth_file = {}\n\
                 pool_mode = transaction\ndefault_pool_size = {size}\nmax_client_conn = 50\n\
                 ignore_startup_parameters = extra_float_digits,options\nlogfile = {}\n",
                c.host,
                c.port,
                dir.join("users.txt").display(),
                dir.join("pgbouncer.log").display()
            ),
        )
        .unwrap();
        // SAFETY: reads the effective user id.
        let root = unsafe { libc::geteuid() } == 0;
        let mut command = Command::new("pgbouncer");
        if root {
            // pgbouncer refuses to run as root: it runs as postgres, and is itself the child
            // (not under runuser, whose kill would leave it running).
            Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .unwrap();
            let id = |flag: &str| -> u32 {
                let out = Command::new("id")
                    .args([flag, "postgres"])
                    .output()
                    .unwrap();
                String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
            };
            command.uid(id("-u")).gid(id("-g"));
        }
        let child = command
            .arg(dir.join("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting pgbouncer (scripts/setup.sh installs it)");
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "pgbouncer did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Pgbouncer { child, dir, port }
    }

    fn connect(&self, database: &str) -> Client {
        self.connect_as(database, &cluster().user)
    }

    fn connect_as(&self, database: &str, user: &str) -> Client {
        let config = format!(
            "host=127.0.0.1 port={} user={user} dbname={database}",
            self.port
        );
        Client::connect(&config, NoTls).unwrap()
    }
}

/// Asks `question` in one transaction of `client`; returns the backend that served it and the
/// trace.
fn ask(client: &mut Client, question: &str, session: &str) -> (i32, serde_json::Value) {
    let mut tx = client.transaction().unwrap();
    let pid: i32 = tx.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    let trace: String = tx
        .query_one("SELECT nl_trace($1, $2)::text", &[&question, &session])
        .unwrap()
        .get(0);
    tx.commit().unwrap();
    (pid, serde_json::from_str(&trace).unwrap())
}

#[test]
fn a_follow_up_through_pgbouncer_finds_its_context_on_another_backend() {
    let s = Session::new();
    let llm = ScriptedLlm::start();
    let db = s.database.clone();
    cluster()
        .connect(&db)
        .batch_execute(&format!(
            "ALTER DATABASE {db} SET sql_query_engine.llm_url = '{}';
             ALTER DATABASE {db} SET sql_query_engine.vote = off;",
            llm.url()
        ))
        .unwrap();
    llm.on(
        "orders of Ada",
        vec![Reply::sql(
            "SELECT order_id FROM orders WHERE customer_id = 1",
        )],
    );
    llm.on(
        "only the big ones",
        vec![Reply::sql(
            "SELECT order_id FROM orders WHERE customer_id = 1 AND amount > 100",
        )],
    );
    let bouncer = Pgbouncer::start();
    let mut first = bouncer.connect(&db);
    let mut second = bouncer.connect(&db);
    let _ = &mut first;
    let (first_pid, trace) = ask(&mut first, "orders of Ada", "pooled-1");
    assert_eq!(trace["session_store"], "table");
    // Hold the backend that served the first turn in an open transaction, so that the
    // follow-up can only get the other one.
    let mut holder = bouncer.connect(&db);
    let started = Instant::now();
    let mut tx = loop {
        let mut tx = holder.transaction().unwrap();
        let held: i32 = tx.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
        if held == first_pid {
            break tx;
        }
        tx.commit().unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never got the first backend again"
        );
    };
    let (follow_pid, trace) = ask(&mut second, "only the big ones", "pooled-1");
    tx.execute("SELECT 1", &[]).unwrap();
    drop(tx);
    assert_ne!(
        follow_pid, first_pid,
        "the follow-up ran on another backend"
    );
    assert_eq!(trace["session_store"], "table");
    assert_eq!(trace["row_count"], 1);
    let follow_up = llm
        .requests()
        .into_iter()
        .find(|r| r.last_message().contains("only the big ones"))
        .unwrap();
    assert!(
        follow_up.text().contains("orders of Ada")
            && follow_up.text().contains("WHERE customer_id = 1"),
        "the earlier turn was in the prompt"
    );
}

#[test]
fn discard_all_forgets_the_sessions_held_in_backend_memory() {
    let mut s = Session::new();
    s.llm.on("first turn", vec![Reply::sql("SELECT 1 AS a")]);
    s.llm
        .on("second turn", vec![Reply::sql("SELECT 2 AS b"); 3]);
    // A read-only transaction cannot write the table: backend memory holds the session.
    s.client
        .batch_execute("SET default_transaction_read_only = on")
        .unwrap();
    let trace = s.trace_in("first turn", "memory-1");
    assert_eq!(trace["session_store"], "memory");
    s.trace_in("second turn", "memory-1");
    let remembered = s.llm.requests().last().unwrap().text();
    assert!(remembered.contains("first turn"), "{remembered}");
    // A DISCARD ALL that fails (it may not run in a transaction block) forgets nothing.
    let refused = s.client.batch_execute("BEGIN; DISCARD ALL");
    assert!(refused.is_err());
    s.client.batch_execute("ROLLBACK").unwrap();
    s.trace_in("second turn", "memory-1");
    let remembered = s.llm.requests().last().unwrap().text();
    assert!(remembered.contains("first turn"), "{remembered}");
    s.client.batch_execute("DISCARD ALL").unwrap();
    s.client
        .batch_execute(&format!(
            "SET sql_query_engine.llm_url = '{}'; SET sql_query_engine.vote = off;
             SET default_transaction_read_only = on;",
            s.llm.url()
        ))
        .unwrap();
    s.trace_in("second turn", "memory-1");
    let forgotten = s.llm.requests().last().unwrap().text();
    assert!(!forgotten.contains("first turn"), "{forgotten}");
}

/// A client of pgbouncer in transaction mode shares one server connection with the others:
/// `nl_call(..., run_as => role)` runs as the role and leaves the connection as it found it,
/// where a session-level `SET ROLE` (the control) is inherited by the next client.
#[test]
fn a_role_given_to_nl_call_is_not_left_to_the_next_client_of_a_pooler() {
    let s = Session::new();
    let id = std::process::id();
    let (authenticator, analyst) = (format!("pool_auth_{id}"), format!("pool_analyst_{id}"));
    let db = s.database.clone();
    cluster()
        .connect(&db)
        .batch_execute(&format!(
            "CREATE ROLE {authenticator} LOGIN NOINHERIT; CREATE ROLE {analyst};
             GRANT SELECT ON customers TO {analyst}; GRANT {analyst} TO {authenticator};
             ALTER DATABASE {db} SET sql_query_engine.llm_url = '{}';
             ALTER DATABASE {db} SET sql_query_engine.vote = off;",
            s.llm.url()
        ))
        .unwrap();
    s.llm.on(
        "pooled customers",
        vec![Reply::sql("SELECT count(*) AS n FROM customers")],
    );
    // One server connection: every client below gets the same backend.
    let bouncer = Pgbouncer::with_pool(1, &[&authenticator]);
    let mut first = bouncer.connect_as(&db, &authenticator);
    let mut next = bouncer.connect_as(&db, &authenticator);
    let backend =
        |c: &mut Client| -> i32 { c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0) };
    let whoami = |c: &mut Client| -> String {
        c.query_one("SELECT current_user::text", &[])
            .unwrap()
            .get(0)
    };

    let answer = first
        .query_one(
            "CALL nl_call('pooled customers', NULL, NULL, NULL, $1::text)",
            &[&analyst],
        )
        .unwrap();
    let answer: serde_json::Value = answer.get(0);
    assert_eq!(answer["rows"], serde_json::json!([[4]]), "{answer}");
    assert_eq!(backend(&mut first), backend(&mut next));
    assert_eq!(whoami(&mut next), authenticator);
    assert!(next.query("SELECT count(*) FROM customers", &[]).is_err());

    // The control: a session-level SET ROLE stays on the server connection for the next client.
    first.batch_execute(&format!("SET ROLE {analyst}")).unwrap();
    assert_eq!(whoami(&mut next), analyst);
    next.batch_execute("RESET ROLE").unwrap();
}
