//! The real clients the tests drive: a Python venv with the official SDKs, psycopg and dbt
//! (tests/clients/requirements.txt), and the JDBC driver Debian packages.

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A Python with the clients (created in the cache the first time, by tests/clients/python.sh).
pub fn clients_python() -> PathBuf {
    let out = Command::new("bash")
        .arg(repo().join("tests/clients/python.sh"))
        .output()
        .expect("running tests/clients/python.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// The PostgreSQL JDBC driver (Debian's libpostgresql-jdbc-java).
pub const JDBC_DRIVER: &str = "/usr/share/java/postgresql.jar";
