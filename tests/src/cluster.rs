//! A real PostgreSQL cluster for the end-to-end tests, with the extension installed.
//!
//! When `SQE_TEST_PGHOST` and `SQE_TEST_PGPORT` are set, that cluster is used (scripts/test.sh
//! starts one for all the test binaries; with `SQE_TEST_PGDIR` naming its directory, the tests
//! that need it, a standby's base backup or the server log, may use it). Otherwise one is
//! created with `scripts/pg-cluster.sh` under /tmp and stopped when the test process exits.
//! Each test gets a fresh database cloned from a template that holds the extension and a small
//! shop schema.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use postgres::{Client, NoTls};

/// The fixture every test database starts with.
pub const FIXTURE: &str = include_str!("fixture.sql");

pub struct Cluster {
    pub host: String,
    pub port: u16,
    pub user: String,
}

static CLUSTER: OnceLock<Cluster> = OnceLock::new();
static CLUSTER_DIR: OnceLock<PathBuf> = OnceLock::new();
static DATABASES: AtomicUsize = AtomicUsize::new(0);

/// The shared cluster, started on first use.
pub fn cluster() -> &'static Cluster {
    CLUSTER.get_or_init(|| {
        let cluster = match (
            std::env::var("SQE_TEST_PGHOST"),
            std::env::var("SQE_TEST_PGPORT"),
        ) {
            (Ok(host), Ok(port)) => {
                if let Ok(dir) = std::env::var("SQE_TEST_PGDIR") {
                    let _ = CLUSTER_DIR.set(PathBuf::from(dir));
                }
                Cluster {
                    host,
                    port: port.parse().expect("SQE_TEST_PGPORT is a port number"),
                    user: std::env::var("SQE_TEST_PGUSER").unwrap_or_else(|_| "postgres".into()),
                }
            }
            _ => start_cluster(),
        };
        create_template(&cluster);
        cluster
    })
}

/// The repository's cluster script, shared with the demo and the benchmark.
fn cluster_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/pg-cluster.sh")
}

pub fn run_script(args: &[&str]) {
    if let Err(failure) = try_run_script(args) {
        panic!("{failure}");
    }
}

/// `run_script`, saying why it failed.
pub fn try_run_script(args: &[&str]) -> Result<(), String> {
    let out = Command::new("bash")
        .arg(cluster_script())
        .args(args)
        .output()
        .map_err(|e| format!("running pg-cluster.sh: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "pg-cluster.sh {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// Starts a cluster in `dir` with `options` on a free port, and returns the port: another
/// port when the one found free was taken before the server bound it (tests running at the
/// same time bind ports of their own).
pub fn start_on_a_free_port(dir: &str, options: &[&str]) -> u16 {
    let mut failure = String::new();
    for _ in 0..3 {
        let port = free_port();
        let port_text = port.to_string();
        let mut args = vec!["start", dir, &port_text];
        args.extend(options);
        match try_run_script(&args) {
            Ok(()) => return port,
            Err(why) => failure = why,
        }
    }
    panic!("{failure}");
}

/// A cluster of a test's own (the server options it needs, which the shared one has not),
/// stopped and removed on drop.
pub struct OwnCluster {
    pub dir: PathBuf,
    pub port: u16,
}

impl OwnCluster {
    pub fn start(prefix: &str, options: &[&str]) -> OwnCluster {
        let dir = crate::fresh_dir(prefix);
        let port = start_on_a_free_port(dir.to_str().expect("a UTF-8 path"), options);
        OwnCluster { dir, port }
    }

    /// Starts the server again where it cannot read `/proc` (a container that does not mount
    /// it): in a mount namespace of its own with an empty directory over it (as root).
    pub fn restart_without_proc(&self) {
        let dir = self.dir.to_str().expect("a UTF-8 path");
        run_script(&["stop", dir]);
        let empty = self.dir.join("no-proc");
        std::fs::create_dir_all(&empty).expect("an empty directory");
        let started = Command::new("unshare")
            .args(["-m", "bash", "-c"])
            .arg(r#"mount --bind "$1" /proc && exec bash "$2" start "$3" "$4""#)
            .args(["bash", empty.to_str().expect("a UTF-8 path")])
            .arg(cluster_script())
            .args([dir, &self.port.to_string()])
            .output()
            .expect("running unshare");
        assert!(
            started.status.success(),
            "starting the server without /proc: {}",
            String::from_utf8_lossy(&started.stderr)
        );
    }

    pub fn connect(&self, database: &str) -> Client {
        self.connect_as(database, "postgres")
    }

    pub fn connect_as(&self, database: &str, user: &str) -> Client {
        let config = format!(
            "host={} port={} user={user} dbname={database}",
            self.dir.display(),
            self.port
        );
        Client::connect(&config, NoTls).unwrap_or_else(|e| panic!("connecting to {database}: {e}"))
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        run_script(&["stop", self.dir.to_str().unwrap_or("")]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A port nothing listens on now that this process never handed out before: a server a test
/// just stopped (a gateway it dropped) may hold its port a moment longer, and two servers
/// started at once must not be given the same one (a test talked to another test's gateway,
/// which knew none of its tokens).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    for _ in 0..1000 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        if GIVEN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(port)
        {
            return port;
        }
    }
    panic!("no port this process had not used already")
}

extern "C" fn stop_cluster() {
    if let Some(dir) = CLUSTER_DIR.get() {
        let _ = Command::new("bash")
            .arg(cluster_script())
            .arg("stop")
            .arg(dir)
            .output();
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn start_cluster() -> Cluster {
    let port = free_port();
    // Short: the socket lives here too.
    let dir = crate::fresh_dir("sqe-e2e").display().to_string();
    let _ = CLUSTER_DIR.set(PathBuf::from(&dir));
    // SAFETY: registers a plain function to run at exit; it only runs a script.
    unsafe { libc::atexit(stop_cluster) };
    run_script(&["start", &dir, &port.to_string()]);
    Cluster {
        host: dir,
        port,
        user: "postgres".into(),
    }
}

fn create_template(cluster: &Cluster) {
    let mut admin = cluster.connect("postgres");
    for statement in [
        "DROP DATABASE IF EXISTS sqe_template",
        "CREATE DATABASE sqe_template",
    ] {
        admin
            .batch_execute(statement)
            .expect("creating the template database");
    }
    let mut template = cluster.connect("sqe_template");
    template
        .batch_execute("CREATE EXTENSION sql_query_engine;")
        .expect("CREATE EXTENSION sql_query_engine (is it installed? run `cargo pgrx install`)");
    template
        .batch_execute(FIXTURE)
        .expect("loading the fixture");
    drop(template);
}

impl Cluster {
    /// The cluster's directory, when this process (or the test run, `SQE_TEST_PGDIR`) started
    /// it.
    pub fn own_dir(&self) -> Option<&'static Path> {
        CLUSTER_DIR.get().map(PathBuf::as_path)
    }

    /// The server log, when this process started the cluster.
    pub fn server_log(&self) -> Option<String> {
        CLUSTER_DIR
            .get()
            .and_then(|dir| std::fs::read_to_string(dir.join("server.log")).ok())
    }

    pub fn connect(&self, database: &str) -> Client {
        self.connect_as(database, &self.user)
    }

    /// A connection whose NOTICEs and WARNINGs are collected (as "SEVERITY: message").
    pub fn connect_with_notices(
        &self,
        database: &str,
        notices: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    ) -> Client {
        self.connect_as_with_notices(database, &self.user, notices)
    }

    /// `connect_with_notices` as `user`.
    pub fn connect_as_with_notices(
        &self,
        database: &str,
        user: &str,
        notices: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    ) -> Client {
        let mut config: postgres::Config = format!(
            "host={} port={} user={} dbname={} application_name=sqe_e2e",
            self.host, self.port, user, database
        )
        .parse()
        .expect("a connection string");
        config.notice_callback(move |notice| {
            let line = format!("{}: {}", notice.severity(), notice.message());
            notices.lock().unwrap_or_else(|p| p.into_inner()).push(line);
        });
        config
            .connect(NoTls)
            .unwrap_or_else(|e| panic!("connecting to {database}: {e}"))
    }

    pub fn connect_as(&self, database: &str, user: &str) -> Client {
        let config = format!(
            "host={} port={} user={} dbname={} application_name=sqe_e2e",
            self.host, self.port, user, database
        );
        Client::connect(&config, NoTls).unwrap_or_else(|e| panic!("connecting to {database}: {e}"))
    }

    /// A fresh database with the fixture and the extension in `schema`, a schema a superuser
    /// owns (on every role's search path, after `public`): where a role that is not a
    /// superuser owns the database, and so `public`, the extension is not installed in
    /// `public`.
    pub fn fresh_database_with_extension_in(&self, schema: &str) -> String {
        let n = DATABASES.fetch_add(1, Ordering::SeqCst);
        let name = format!("sqe_own_{}_{n}", std::process::id());
        let mut admin = self.connect("postgres");
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .expect("creating a database");
        let mut database = self.connect(&name);
        database
            .batch_execute(&format!(
                "CREATE SCHEMA {schema}; GRANT USAGE ON SCHEMA {schema} TO PUBLIC;
                 CREATE EXTENSION sql_query_engine SCHEMA {schema};
                 ALTER DATABASE {name} SET search_path = \"$user\", public, {schema};"
            ))
            .expect("installing the extension in its own schema");
        database
            .batch_execute(FIXTURE)
            .expect("loading the fixture");
        name
    }

    /// A fresh database with the extension and the fixture, for one test.
    pub fn fresh_database(&self) -> String {
        let n = DATABASES.fetch_add(1, Ordering::SeqCst);
        let name = format!("sqe_test_{}_{n}", std::process::id());
        let mut admin = self.connect("postgres");
        // Clones of one template may not run at the same instant.
        static CLONING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one_at_a_time = CLONING.lock().unwrap_or_else(|p| p.into_inner());
        admin
            .batch_execute(&format!("CREATE DATABASE {name} TEMPLATE sqe_template"))
            .expect("cloning the template database");
        name
    }
}
