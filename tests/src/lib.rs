//! Harness for the end-to-end tests: a real cluster with the extension installed, a real client
//! connection, and a scripted OpenAI-compatible server in the role of the model.

pub mod clients;
pub mod cluster;
pub mod gateway;
pub mod llm;
pub mod redis;

use postgres::Client;
use serde_json::Value;

pub use cluster::cluster;
pub use llm::{Reply, ScriptedLlm};

/// A connection to a fresh test database, pointed at its own scripted model.
pub struct Session {
    pub client: Client,
    pub llm: ScriptedLlm,
    pub database: String,
}

impl Session {
    pub fn new() -> Session {
        let cluster = cluster();
        let database = cluster.fresh_database();
        let client = cluster.connect(&database);
        Session::on(database, client)
    }

    /// A session on a database whose extension is in `schema`, a schema a superuser owns (see
    /// `fresh_database_with_extension_in`): for tests that give the database to another role.
    pub fn with_extension_in(schema: &str) -> Session {
        let cluster = cluster();
        let database = cluster.fresh_database_with_extension_in(schema);
        let client = cluster.connect(&database);
        Session::on(database, client)
    }

    /// A session whose NOTICEs and WARNINGs are collected into `notices`.
    pub fn with_notices(notices: std::sync::Arc<std::sync::Mutex<Vec<String>>>) -> Session {
        let cluster = cluster();
        let database = cluster.fresh_database();
        let client = cluster.connect_with_notices(&database, notices);
        Session::on(database, client)
    }

    /// Another connection to this session's database (another backend), with the same model.
    pub fn second_connection(&self) -> Client {
        let mut client = cluster().connect(&self.database);
        client
            .batch_execute(&format!(
                "SET sql_query_engine.llm_url = '{}'",
                self.llm.url()
            ))
            .expect("setting llm_url");
        client
    }

    /// The scripted model answers from per-question scripts: the tests of the repair loop script
    /// every attempt, so candidates (a vote) are off unless a test turns them on.
    fn on(database: String, mut client: Client) -> Session {
        let llm = ScriptedLlm::start();
        client
            .batch_execute(&format!(
                "SET sql_query_engine.llm_url = '{}'; SET sql_query_engine.vote = off;",
                llm.url()
            ))
            .expect("setting llm_url");
        Session {
            client,
            llm,
            database,
        }
    }

    /// `nl_query` rows as JSON values.
    pub fn query(&mut self, question: &str) -> Result<Vec<Value>, postgres::Error> {
        let rows = self
            .client
            .query("SELECT nl_query($1)::text", &[&question])?;
        Ok(rows
            .iter()
            .map(|r| serde_json::from_str(r.get::<_, &str>(0)).expect("nl_query returns JSON"))
            .collect())
    }

    pub fn trace(&mut self, question: &str) -> Result<Value, postgres::Error> {
        let row = self
            .client
            .query_one("SELECT nl_trace($1)::text", &[&question])?;
        Ok(serde_json::from_str(row.get::<_, &str>(0)).expect("nl_trace returns JSON"))
    }

    /// `nl_trace` of `question` in `session`.
    pub fn trace_in(&mut self, question: &str, session: &str) -> Value {
        let row = self
            .client
            .query_one("SELECT nl_trace($1, $2)::text", &[&question, &session])
            .expect("nl_trace");
        serde_json::from_str(row.get::<_, &str>(0)).expect("nl_trace returns JSON")
    }

    pub fn generate(&mut self, question: &str) -> Result<String, postgres::Error> {
        Ok(self
            .client
            .query_one("SELECT nl_generate($1)", &[&question])?
            .get(0))
    }

    /// After `delay`, calls `function` (pg_cancel_backend, pg_terminate_backend) on this
    /// session's backend from another connection; the thread returns when it did.
    pub fn signal_after(
        &mut self,
        function: &'static str,
        delay: std::time::Duration,
    ) -> std::thread::JoinHandle<std::time::Instant> {
        let pid: i32 = self
            .client
            .query_one("SELECT pg_backend_pid()", &[])
            .expect("pid")
            .get(0);
        let database = self.database.clone();
        std::thread::spawn(move || {
            let mut other = cluster().connect(&database);
            std::thread::sleep(delay);
            let sent: bool = other
                .query_one(&format!("SELECT {function}($1)"), &[&pid])
                .expect("signalling the backend")
                .get(0);
            assert!(sent, "{function} found no backend {pid}");
            std::time::Instant::now()
        })
    }

    pub fn scalar_i64(&mut self, sql: &str) -> i64 {
        self.client.query_one(sql, &[]).expect(sql).get(0)
    }
}

impl Default for Session {
    fn default() -> Self {
        Session::new()
    }
}

/// A file holding `key`, readable by the server only: how an API key is configured
/// (`sql_query_engine.llm_api_key_file`). Returns its path.
pub fn key_file(key: &str) -> String {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    static FILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = FILES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let path = scratch(&format!("key-{n}")).display().to_string();
    // Created here, private from the start: never a file or link someone made in advance.
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut file| file.write_all(format!("{key}\n").as_bytes()))
        .expect("writing the key file");
    if let Some((uid, gid)) = server_user() {
        std::os::unix::fs::chown(&path, Some(uid), Some(gid)).expect("chown");
    }
    path
}

/// A path for a file or directory a test writes, in the test cluster's own directory (private
/// to the server's user, and removed with the cluster at exit): never a name in /tmp that
/// someone could have taken first. Named after the process too: the test binaries of one run
/// share the cluster.
pub fn scratch(name: &str) -> std::path::PathBuf {
    static FILES: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    // A cluster started elsewhere (SQE_TEST_PGHOST without SQE_TEST_PGDIR) has no directory of
    // the tests': one of their own, the server's user's when the tests run as root.
    let dir = match cluster().own_dir() {
        Some(dir) => dir.to_path_buf(),
        None => FILES
            .get_or_init(|| {
                let dir = fresh_dir("sqe-files");
                if let Some((uid, gid)) = server_user() {
                    std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown");
                }
                dir
            })
            .clone(),
    };
    dir.join(format!("{}-{name}", std::process::id()))
}

/// The user and group the test cluster runs as when the tests run as root (`postgres`).
fn server_user() -> Option<(u32, u32)> {
    // SAFETY: reads the effective user id, and the password entry of a constant name.
    unsafe {
        if libc::geteuid() != 0 {
            return None;
        }
        let user = std::ffi::CString::new("postgres").ok()?;
        let entry = libc::getpwnam(user.as_ptr());
        (!entry.is_null()).then(|| ((*entry).pw_uid, (*entry).pw_gid))
    }
}

/// A new directory under /tmp named `prefix` and six random characters (`mkdtemp`: made here,
/// so never a directory or link someone made in advance), for the servers a test starts.
pub fn fresh_dir(prefix: &str) -> std::path::PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let template = std::ffi::CString::new(format!("/tmp/{prefix}-XXXXXX")).expect("a path");
    let mut bytes = template.into_bytes_with_nul();
    // SAFETY: `bytes` is a NUL-terminated template that mkdtemp fills in place.
    let made = unsafe { libc::mkdtemp(bytes.as_mut_ptr().cast()) };
    assert!(
        !made.is_null(),
        "mkdtemp: {}",
        std::io::Error::last_os_error()
    );
    bytes.pop();
    std::ffi::OsString::from_vec(bytes).into()
}

/// The peak resident memory of a backend, in kB (VmHWM from /proc); `None` once it has ended.
pub fn peak_kb(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Whether backend `pid` is still listed in pg_stat_activity, as seen from `watcher`, after
/// giving it up to five seconds to leave: a client sees a FATAL before the backend's exit hooks
/// have removed it from the list.
pub fn backend_lingers(watcher: &mut Client, pid: i32) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let alive: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .expect("reading pg_stat_activity")
            .get(0);
        if alive == 0 {
            return false;
        }
        if std::time::Instant::now() > deadline {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Advisory lock keys held by a connection of its own, so that code that asks for one of them
/// waits: a signal that code ran which every role sees in pg_locks, and which neither a rollback
/// nor the extension's release of the session locks a query's code took can erase.
pub struct Witness {
    holder: Client,
    keys: Vec<i64>,
}

impl Witness {
    /// Holds `keys` (session-level, exclusive) in `database`.
    pub fn hold(database: &str, keys: &[i64]) -> Witness {
        let mut holder = cluster().connect(database);
        for key in keys {
            holder
                .execute("SELECT pg_advisory_lock($1)", &[key])
                .expect("holding a key");
        }
        Witness {
            holder,
            keys: keys.to_vec(),
        }
    }

    /// Runs `work`, and returns what it returned with the keys that a backend waited for
    /// meanwhile (in order). Each such key is let go at once, so that the code waiting for it
    /// goes on, and is held again afterwards when it is free.
    pub fn waited<R: Send>(&mut self, work: impl FnOnce() -> R + Send) -> (R, Vec<i64>) {
        let mut waited: Vec<i64> = Vec::new();
        let result = std::thread::scope(|scope| {
            let running = scope.spawn(work);
            while !running.is_finished() {
                let rows = self
                    .holder
                    .query(
                        "SELECT DISTINCT (classid::int8 << 32) | objid::int8 FROM pg_locks
                         WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1
                           AND database = (SELECT oid FROM pg_database
                                           WHERE datname = current_database())",
                        &[],
                    )
                    .expect("reading pg_locks");
                for key in rows.iter().map(|row| row.get::<_, i64>(0)) {
                    if self.keys.contains(&key) && !waited.contains(&key) {
                        self.holder
                            .execute("SELECT pg_advisory_unlock($1)", &[&key])
                            .expect("letting a key go");
                        waited.push(key);
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            running
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        });
        for key in &waited {
            self.holder
                .execute("SELECT pg_try_advisory_lock($1)", &[key])
                .expect("holding a key again");
        }
        waited.sort_unstable();
        (result, waited)
    }
}

/// The SQLSTATE, message and detail of a database error.
pub fn db_error(error: &postgres::Error) -> (String, String, String) {
    let db = error
        .as_db_error()
        .unwrap_or_else(|| panic!("not a database error: {error}"));
    (
        db.code().code().to_string(),
        db.message().to_string(),
        db.detail().unwrap_or_default().to_string(),
    )
}
