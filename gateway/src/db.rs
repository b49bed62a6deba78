//! The database side: bounded pools of connections logged in as the *authenticator* role (no
//! privileges of its own, NOINHERIT, member of the roles it may become), to the primary and to
//! the read servers (streaming standbys) when there are any, and one call of the extension per
//! request, as the request's role, PostgREST's pattern.
//!
//! A question goes to a read server (round-robin over those that pass their health checks), the
//! primary when there is none; what writes goes to the primary. A question is asked with
//! `CALL nl_call(..., run_as => role)` outside a transaction, so the connection holds no
//! snapshot while the model thinks (on a standby, a held snapshot would also be cancelled by
//! replay conflicts), and the role lasts only as long as the call, also through a pooler in
//! transaction mode. The other calls run in one transaction each with `SET LOCAL ROLE`. A read
//! server that fails during a call is taken out of the rotation and the call is asked again
//! elsewhere; the history of an answer a standby gave is written to the primary
//! (`nl_history_add`). The extension's progress NOTICEs are read from the connection as they
//! arrive. A request that is dropped (client gone, timeout) cancels its query.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool::managed::{self, Metrics, Object, RecycleResult, Timeouts};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use tokio::sync::mpsc::Sender;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::error::Severity;
use tokio_postgres::types::{Json, ToSql, Type};
use tokio_postgres::{AsyncMessage, CancelToken, Client, Config, NoTls};

use crate::shares::Shares;

impl Call {
    /// The call with its session named apart from those of other clients (`client`: the
    /// token's fingerprint): sessions, and the history's session labels, belong to a role, and
    /// two tokens of one role are two clients who share nothing.
    pub fn of_client(mut self, client: Option<&str>) -> Call {
        if let (Call::Ask { session, .. }, Some(client)) = (&mut self, client) {
            if let Some(name) = session.as_mut() {
                *name = format!("{client}/{name}");
            }
        }
        self
    }
}

/// Characters of a question, and of the SQL `nl_fix` is given, that a call may carry: the
/// extension's own bounds (22023 beyond them), checked before the call takes a connection or
/// its role's place.
const MAX_QUESTION_CHARS: usize = 10_000;
const MAX_SQL_CHARS: usize = 100_000;
/// Bytes of a session name (the client's prefix included), the extension's bound.
const MAX_SESSION_BYTES: usize = 256;
/// The most relations `sqe://tables` lists (the extension's schema read takes as many).
const MAX_TABLES: i64 = 10_000;
/// Bytes of JSON of the tables listed at most (`sqe://tables`), in order.
const MAX_TABLES_BYTES: i64 = 4 << 20;

/// The roles, among those the login role is or may become, that reach as far as a superuser
/// (a superuser, CREATEROLE, REPLICATION, the server's files and programs, a connection
/// without a password check), the login role
/// first: no such role may be the gateway's login role, on any server.
const REACHING_ROLES: &str = "FROM pg_catalog.pg_roles r \
     WHERE (r.rolsuper OR r.rolcreaterole OR r.rolreplication \
            OR r.rolname IN ('pg_execute_server_program', 'pg_read_server_files', \
                             'pg_write_server_files') \
            OR EXISTS (SELECT FROM pg_catalog.pg_proc p \
                        LEFT JOIN pg_catalog.pg_depend d \
                          ON d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass \
                         AND d.objid = p.oid AND d.deptype = 'e' \
                        LEFT JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid \
                        WHERE CASE WHEN e.extname IS NULL \
                                   THEN p.oid < 16384 \
                                    AND p.proname IN ('lo_import', 'lo_export', \
                                                      'pg_read_file', 'pg_read_binary_file') \
                                   ELSE (e.extname = 'adminpack' \
                                         AND p.proname IN ('pg_file_write', 'pg_file_rename', \
                                                           'pg_file_unlink')) \
                                     OR (e.extname = 'dblink' \
                                         AND p.proname = 'dblink_connect_u') END \
                          AND pg_catalog.has_function_privilege(r.oid, p.oid, 'EXECUTE')) \
            OR EXISTS (SELECT FROM pg_catalog.unnest(ARRAY['archive_command', \
                         'archive_library', 'oauth_validator_libraries', 'restore_command', 'archive_cleanup_command', \
                         'recovery_end_command', 'ssl_passphrase_command', \
                         'shared_preload_libraries', 'session_preload_libraries', \
                         'dynamic_library_path', 'jit_provider', 'extension_control_path', \
                         'log_directory', 'log_filename', 'hba_file', 'ident_file', \
                         'plperl.on_init', 'plperl.on_plperlu_init']) AS s(setting) \
                        WHERE pg_catalog.has_parameter_privilege(r.oid, s.setting, \
                                                                 'SET, ALTER SYSTEM'))) \
       AND pg_catalog.pg_has_role(session_user, r.oid, 'MEMBER') \
     ORDER BY r.rolname <> session_user LIMIT 1";

/// One call of the extension.
#[derive(Debug, Clone)]
pub enum Call {
    /// `nl_ask`: the answer's rows and its trace. With `turns` (the conversation's earlier
    /// turns, from the request) the session only labels the history.
    Ask {
        question: String,
        session: Option<String>,
        turns: Option<Value>,
    },
    /// `nl_generate`: the SQL only.
    Generate { question: String },
    /// `nl_check`: the guard alone.
    Check { sql: String },
    /// `nl_run`: the caller's own SQL in the sandbox.
    Run { sql: String },
    /// `nl_schema`: what the model is told.
    Schema { question: Option<String> },
    /// `nl_fix`: the caller's SQL, repaired.
    Fix {
        sql: String,
        question: Option<String>,
    },
    /// The relations the role can read.
    Tables,
    /// `nl_history_add`, on the primary: an answer a read server gave, for the history.
    History {
        answer: Value,
        session: Option<String>,
    },
    /// `nl_feedback`: an answer (its history id) marked right, or corrected.
    Feedback {
        history_id: i64,
        correct: bool,
        corrected_sql: Option<String>,
    },
}

/// Why a call failed.
#[derive(Debug)]
pub enum DbError {
    /// PostgreSQL said no: SQLSTATE, message, detail and hint.
    Sql {
        sqlstate: String,
        message: String,
        detail: Option<String>,
        hint: Option<String>,
        /// Said by the server or a pooler in front of it, not by the statement: the server
        /// ended the session (FATAL or PANIC), or the error has no source location, which
        /// every error a PostgreSQL backend raises has (pgbouncer's "server conn crashed?" is
        /// an ERROR without one). Any other ERROR, of whatever SQLSTATE, may be the query's
        /// own (another role's function can raise 57P01 or 08006).
        server_side: bool,
    },
    /// No connection became free in time.
    Busy,
    /// The request's role already had its share of calls running (`--role-calls`, the
    /// number) the whole time.
    RoleBusy(usize),
    /// The database could not be reached.
    Unavailable(String),
}

impl Call {
    /// Why the call is refused before it is made: a question, SQL or session name longer than
    /// the extension takes (it would hold a connection and its role's place, and reach the server's log
    /// whole, only to be refused there).
    fn too_long(&self) -> Option<DbError> {
        let session = match self {
            Call::Ask { session, .. } | Call::History { session, .. } => session.as_ref(),
            _ => None,
        };
        let (question, sql) = match self {
            Call::Ask { question, .. } | Call::Generate { question } => (Some(question), None),
            Call::Schema { question } => (question.as_ref(), None),
            Call::Fix { sql, question } => (question.as_ref(), Some(sql)),
            Call::Check { sql } | Call::Run { sql } => (None, Some(sql)),
            Call::Feedback { corrected_sql, .. } => (None, corrected_sql.as_ref()),
            Call::Tables | Call::History { .. } => (None, None),
        };
        let over = |text: Option<&String>, at_most: usize| {
            text.is_some_and(|t| t.chars().nth(at_most).is_some())
        };
        let what = if over(question, MAX_QUESTION_CHARS) {
            format!("the question is longer than {MAX_QUESTION_CHARS} characters")
        } else if over(sql, MAX_SQL_CHARS) {
            format!("the SQL is longer than {MAX_SQL_CHARS} characters")
        } else if session.is_some_and(|s| s.len() > MAX_SESSION_BYTES) {
            format!("a session name is at most {MAX_SESSION_BYTES} bytes, with the client's prefix")
        } else {
            return None;
        };
        Some(DbError::Sql {
            sqlstate: "22023".to_string(),
            message: what,
            detail: None,
            hint: None,
            server_side: false,
        })
    }
}

impl DbError {
    /// The error as any client may be told it: what the server or a pooler said when it
    /// refused or ended the gateway's connection (a login failure, `database "shop" does not
    /// exist`, `too many connections for role "authenticator"`) names the gateway's own role,
    /// host or database, so it goes to the gateway's log and the client is told only that the
    /// database refused or ended the connection. A query's own errors are passed on.
    pub fn for_clients(self) -> DbError {
        match self {
            DbError::Sql {
                sqlstate,
                message,
                server_side: true,
                ..
            } => {
                log_line!(
                    "sqe-gateway: the database refused or ended the gateway's connection: {}",
                    crate::shown::in_log(&message)
                );
                DbError::Sql {
                    sqlstate,
                    message: "the database refused or ended the gateway's connection; the \
                              gateway's log says why"
                        .into(),
                    detail: None,
                    hint: None,
                    server_side: true,
                }
            }
            DbError::Sql {
                sqlstate,
                message,
                server_side,
                ..
            } if sqlstate.starts_with("28") => {
                // A query's own code may raise a 28xxx error with any text (a view's RAISE).
                log_line!(
                    "sqe-gateway: the database refused the gateway: {}",
                    crate::shown::in_log(&message)
                );
                DbError::Sql {
                    sqlstate,
                    message: "the database refused the gateway's connection; its log says why"
                        .into(),
                    detail: None,
                    hint: None,
                    server_side,
                }
            }
            other => other,
        }
    }

    /// Whether the server (or a pooler in front of it) failed rather than the call: then
    /// another server may answer it.
    fn server_failed(&self) -> bool {
        match self {
            DbError::Unavailable(_) => true,
            DbError::Sql {
                sqlstate,
                server_side,
                ..
            } => {
                // connection exceptions, shutdown, "cannot connect now", too many connections
                *server_side
                    && (sqlstate.starts_with("08")
                        || ["57P01", "57P02", "57P03", "53300"].contains(&sqlstate.as_str()))
            }
            DbError::Busy | DbError::RoleBusy(_) => false,
        }
    }

    /// Whether a standby cancelled the call to replay the primary's changes (a conflict with
    /// recovery): another server may answer it, and this one is not unwell.
    fn replay_conflict(&self) -> bool {
        matches!(self, DbError::Sql { sqlstate, .. } if sqlstate == "40001")
    }
}

impl From<tokio_postgres::Error> for DbError {
    fn from(e: tokio_postgres::Error) -> Self {
        match e.as_db_error() {
            Some(db) => DbError::Sql {
                sqlstate: db.code().code().to_string(),
                message: db.message().to_string(),
                detail: db.detail().map(str::to_string),
                hint: db.hint().map(str::to_string),
                server_side: db.file().is_none()
                    || matches!(
                        db.parsed_severity(),
                        Some(Severity::Fatal | Severity::Panic)
                    ),
            },
            None => DbError::Unavailable(e.to_string()),
        }
    }
}

/// A pooled connection, with the channel its NOTICEs go to while a request holds it.
pub struct Conn {
    client: Client,
    /// Its place among the server's open connections (`Node::open`), given back as it closes.
    _open: OwnedSemaphorePermit,
    notices: Arc<Mutex<Option<Sender<String>>>>,
    /// A call on it was abandoned while its query ran, or its backend ends after its
    /// transaction: it is never handed out again (its NOTICEs, or the cancel sent for it,
    /// would reach the next request, maybe another role's).
    abandoned: Arc<AtomicBool>,
}

pub struct Manager {
    config: Config,
    /// The server's places for open connections (`Node::open`).
    open: Arc<Semaphore>,
    /// The role whose pool this is, and every role's pools of the server: a connection opened
    /// when no place is free takes that of another role's idle connection.
    role: Option<String>,
    pools: std::sync::Weak<Pools>,
}

/// A server's pools, by role (`Node::pools`).
type Pools = Mutex<std::collections::HashMap<Option<String>, managed::Pool<Manager>>>;

/// Longest a new connection waits for a place among the server's open connections: the call
/// holds a running place, so one is idle somewhere or about to close.
const PLACE_WAIT: Duration = Duration::from_secs(2);

/// Closes one idle connection of a role other than `role`, to give its place to `role`'s;
/// whether there was one.
fn close_idle_of_another(pools: &Pools, role: Option<&str>) -> bool {
    let Ok(pools) = pools.lock() else {
        return false;
    };
    for (owner, pool) in pools.iter() {
        if owner.as_deref() == role {
            continue;
        }
        let mut taken = false;
        // The connection closes as what `retain` removed is dropped, and gives its place back.
        let closed = pool.retain(|_, _| std::mem::replace(&mut taken, true));
        if !closed.removed.is_empty() {
            return true;
        }
    }
    false
}

impl managed::Manager for Manager {
    type Type = Conn;
    type Error = DbError;

    async fn create(&self) -> Result<Conn, DbError> {
        // A free place, or that of another role's idle connection, closed for it (taken and
        // given back in one loop: another call may take the place a close freed).
        let started = std::time::Instant::now();
        let open = loop {
            if let Ok(place) = Arc::clone(&self.open).try_acquire_owned() {
                break place;
            }
            let closed = self
                .pools
                .upgrade()
                .is_some_and(|pools| close_idle_of_another(&pools, self.role.as_deref()));
            if !closed {
                if started.elapsed() >= PLACE_WAIT {
                    return Err(DbError::Busy);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let (client, mut connection) = self.config.connect(NoTls).await?;
        let notices: Arc<Mutex<Option<Sender<String>>>> = Arc::new(Mutex::new(None));
        let forward = Arc::clone(&notices);
        let abandoned = Arc::new(AtomicBool::new(false));
        let ends = Arc::clone(&abandoned);
        tokio::spawn(async move {
            while let Some(message) =
                futures::future::poll_fn(|cx| connection.poll_message(cx)).await
            {
                match message {
                    Ok(AsyncMessage::Notice(notice)) => {
                        if ends_the_connection(notice.message()) {
                            ends.store(true, Ordering::SeqCst);
                        }
                        let sender = forward.lock().ok().and_then(|s| s.clone());
                        if let Some(sender) = sender {
                            // A client that reads slower than the server talks loses
                            // progress lines, never the gateway's memory.
                            if let Some(line) = progress_line(notice.message()) {
                                let _ = sender.try_send(line);
                            }
                        }
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        });
        Ok(Conn {
            client,
            _open: open,
            notices,
            abandoned,
        })
    }

    async fn recycle(&self, conn: &mut Conn, _: &Metrics) -> RecycleResult<DbError> {
        if conn.client.is_closed() {
            return Err(managed::RecycleError::message("the connection is closed"));
        }
        if conn.abandoned.load(Ordering::SeqCst) {
            return Err(managed::RecycleError::message(
                "a call on the connection was abandoned",
            ));
        }
        Ok(())
    }
}

/// Whether a NOTICE says that the backend ends after its transaction (the extension's
/// queries left `max_query_memory` in its caches): the connection is not handed out again,
/// where the next call, maybe another token's, would fail as the server going away.
fn ends_the_connection(message: &str) -> bool {
    message.starts_with("sql_query_engine: queries left ")
        && message.contains("the connection ends after this transaction")
}

/// Characters of a progress line passed on, at most.
const MAX_PROGRESS_CHARS: usize = 2000;

/// A NOTICE the extension sent (`sql_query_engine: ...`, its progress), cut to
/// `MAX_PROGRESS_CHARS`: only those are passed on. Code a query runs (a view's function, which
/// may turn `client_min_messages` back on for itself) may raise any number of any size.
fn progress_line(message: &str) -> Option<String> {
    message
        .starts_with("sql_query_engine: ")
        .then(|| message.chars().take(MAX_PROGRESS_CHARS).collect())
}

/// Cancels the running query when dropped before `disarm` (the request was abandoned), stops
/// its NOTICEs and marks its connection so the pool closes it instead of reusing it.
struct CancelOnDrop {
    token: Option<CancelToken>,
    notices: Arc<Mutex<Option<Sender<String>>>>,
    abandoned: Arc<AtomicBool>,
}

impl CancelOnDrop {
    fn new(conn: &Conn) -> CancelOnDrop {
        CancelOnDrop {
            token: Some(conn.client.cancel_token()),
            notices: Arc::clone(&conn.notices),
            abandoned: Arc::clone(&conn.abandoned),
        }
    }

    fn disarm(mut self) {
        self.token = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(token) = self.token.take() {
            self.abandoned.store(true, Ordering::SeqCst);
            if let Ok(mut sender) = self.notices.lock() {
                *sender = None;
            }
            log_line!("sqe-gateway: request abandoned, cancelling its query");
            tokio::spawn(async move {
                if let Err(e) = token.cancel_query(NoTls).await {
                    log_line!("sqe-gateway: cancelling an abandoned query failed: {e}");
                }
            });
        }
    }
}

/// A connection checked out for one call, with the places the call holds: one of its
/// server's running calls and, for a role's call, one of the role's share. Dropped after a call
/// that was abandoned while its query ran (the connection is `abandoned`), the connection
/// leaves the pool, and a task keeps the places until the backend has ended that query (the
/// cancel taken, asked again every `RECANCEL_EVERY`, or its own bounds reached) and closes it: a client that leaves does not free
/// a place its backend still fills, so `--pool-size` and `--role-calls` bound busy backends,
/// not handles.
pub struct Lease {
    conn: std::mem::ManuallyDrop<Object<Manager>>,
    running: Option<OwnedSemaphorePermit>,
    share: Option<OwnedSemaphorePermit>,
}

/// Longest a task keeps an abandoned call's places while its backend finishes the query.
const REAP_LIMIT: Duration = Duration::from_secs(300);
/// How often the task asks again for an abandoned query's cancel while the backend runs it: a
/// cancel may be lost (a pooler's race) or taken by code of the query, which runs on.
const RECANCEL_EVERY: Duration = Duration::from_secs(5);

impl std::ops::Deref for Lease {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        &self.conn
    }
}

impl std::ops::DerefMut for Lease {
    fn deref_mut(&mut self) -> &mut Conn {
        &mut self.conn
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // SAFETY: taken once, here, and `self.conn` is not used again.
        let conn = unsafe { std::mem::ManuallyDrop::take(&mut self.conn) };
        if !conn.abandoned.load(Ordering::SeqCst) {
            return;
        }
        let conn = Object::take(conn);
        let places = (self.running.take(), self.share.take());
        tokio::spawn(async move {
            {
                let cancel = conn.client.cancel_token();
                let started = tokio::time::Instant::now();
                // Queued behind the abandoned query: answered once the backend is idle again.
                let mut idle = std::pin::pin!(conn.client.simple_query(""));
                while tokio::time::timeout(RECANCEL_EVERY, &mut idle)
                    .await
                    .is_err()
                {
                    if started.elapsed() >= REAP_LIMIT {
                        log_line!(
                            "sqe-gateway: an abandoned query still ran after {} s; its places \
                             are given back and its connection closed",
                            REAP_LIMIT.as_secs()
                        );
                        break;
                    }
                    if let Err(e) = cancel.cancel_query(NoTls).await {
                        log_line!("sqe-gateway: cancelling an abandoned query failed: {e}");
                    }
                }
            }
            drop(conn);
            drop(places);
        });
    }
}

/// One server of the deployment: its pools, and what its health checks found.
struct Node {
    /// `host:port`, for messages (never the password).
    name: String,
    config: Config,
    /// The connections, a pool for each role (the login role's own calls: `None`): a
    /// connection serves one role only, so what a call's code leaves in its backend that a
    /// rollback does not undo (the random seed `setseed` set, dblink's named connections,
    /// sequences' `currval`, placeholders' values) is never another role's.
    pools: Arc<Pools>,
    /// Places for open connections, as many as `--pool-size`, over every role's pool: a role
    /// that needs one when all are taken closes another role's idle connection.
    open: Arc<Semaphore>,
    pool_size: usize,
    /// Whether it answered its last health check (a read server that fails is skipped).
    healthy: AtomicBool,
    /// Whether it keeps sessions where every server finds them (`nl_session_store()` is
    /// `redis`): only then does it serve server-side sessions.
    shared_sessions: AtomicBool,
    /// The health checks' own connection, kept between checks.
    probe: tokio::sync::Mutex<Option<Client>>,
    /// Places for the calls running on this server, as many as its pool has connections: a
    /// call holds one until its backend has ended its query (see `Lease`).
    running: Arc<Semaphore>,
}

impl Node {
    /// A server and its pool; every wait for a connection is bounded by `get`.
    fn new(url: &str, pool_size: usize) -> anyhow::Result<Node> {
        let mut config: Config = url.parse()?;
        // As libpq does: a password from the environment (readable by the gateway's user
        // only), not in the URL, which every local user sees in the process list.
        if config.get_password().is_none() {
            if let Ok(password) = std::env::var("PGPASSWORD") {
                config.password(password);
            }
        }
        Ok(Node {
            name: server_name(&config),
            config,
            pools: Arc::new(Mutex::new(std::collections::HashMap::new())),
            open: Arc::new(Semaphore::new(pool_size.max(1))),
            pool_size: pool_size.max(1),
            healthy: AtomicBool::new(true),
            shared_sessions: AtomicBool::new(false),
            probe: tokio::sync::Mutex::new(None),
            running: Arc::new(Semaphore::new(pool_size.max(1))),
        })
    }

    /// Notes what the last health check or call found; a change is said on stderr.
    fn set_healthy(&self, healthy: bool, why: &str) {
        if self.healthy.swap(healthy, Ordering::Relaxed) != healthy {
            match healthy {
                true => log_line!("sqe-gateway: read server {} is back", self.name),
                false => log_line!(
                    "sqe-gateway: read server {} left the rotation: {why}",
                    self.name
                ),
            }
        }
    }

    /// The pool of `role`'s connections.
    fn pool_of(&self, role: Option<&str>) -> Result<managed::Pool<Manager>, DbError> {
        let mut pools = self.pools.lock().map_err(|_| DbError::Busy)?;
        if let Some(pool) = pools.get(&role.map(str::to_string)) {
            return Ok(pool.clone());
        }
        let pool = managed::Pool::builder(Manager {
            config: self.config.clone(),
            open: Arc::clone(&self.open),
            role: role.map(str::to_string),
            pools: Arc::downgrade(&self.pools),
        })
        .max_size(self.pool_size)
        .runtime(deadpool::Runtime::Tokio1)
        .build()
        .map_err(|e| DbError::Unavailable(e.to_string()))?;
        pools.insert(role.map(str::to_string), pool.clone());
        Ok(pool)
    }

    /// A connection for `role`'s call, waiting at most `wait` for one to be free: an idle one
    /// of `role`'s, or a new one, in a free place or in that of another role's idle connection,
    /// which is closed for it.
    async fn get(&self, wait: Duration, role: Option<&str>) -> Result<Lease, DbError> {
        let asked = std::time::Instant::now();
        let place = tokio::time::timeout(wait, Arc::clone(&self.running).acquire_owned())
            .await
            .map_err(|_| DbError::Busy)?
            .map_err(|_| DbError::Busy)?;
        let pool = self.pool_of(role)?;
        let timeouts = Timeouts {
            wait: Some(wait.saturating_sub(asked.elapsed())),
            create: Some(PLACE_WAIT + CONNECT_TIMEOUT),
            recycle: Some(CONNECT_TIMEOUT),
        };
        let conn = pool.timeout_get(&timeouts).await.map_err(|e| match e {
            managed::PoolError::Timeout(managed::TimeoutType::Wait) => DbError::Busy,
            managed::PoolError::Backend(e) => e,
            managed::PoolError::Timeout(_) => {
                DbError::Unavailable("timed out connecting to the server".into())
            }
            other => DbError::Unavailable(format!("{other:?}")),
        })?;
        Ok(Lease {
            conn: std::mem::ManuallyDrop::new(conn),
            running: Some(place),
            share: None,
        })
    }
}

/// A spawned task, aborted when dropped (aborting a finished task does nothing): a call whose
/// waiter goes (the HTTP handler when its client disconnects before the first progress line,
/// the stream's task when its client stops reading; its query is cancelled, see
/// `CancelOnDrop`), a connection of its own whose check ended.
pub struct AbortOnDrop<T>(pub tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Longest wait for a new connection, and for a health check.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a server where a call failed may take to answer a connection of its own before it
/// is taken for failing (`Db::confirmed_down`): the failed call holds its role's share of calls
/// meanwhile.
const CALL_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// `host:port` of the first host of `config`.
fn server_name(config: &Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}")
}

pub struct Db {
    primary: Node,
    /// Read servers (streaming standbys); questions go to them when any is healthy.
    readers: Vec<Node>,
    /// The read server the next question starts with.
    next: AtomicUsize,
    /// Longest wait for a free connection before a request is answered "busy".
    wait: Duration,
    /// How many calls each role may have running at once.
    shares: Shares,
    /// The database's name (the model id users select).
    pub database: String,
    /// The extension's schema, quoted: its functions are called by qualified name.
    schema: String,
}

/// For each role name of `$1` that exists: why it may run its own code in the gateway's
/// session (NULL when it may not). `reach` is every role it may become (itself included).
const RISKY_ROLES_SQL: &str = "
WITH wanted AS (
    SELECT DISTINCT r.oid, r.rolname, r.rolsuper
    FROM pg_catalog.unnest($1::text[]) AS t(name)
    JOIN pg_catalog.pg_roles r ON r.rolname = t.name),
reach AS (
    SELECT w.oid AS token_role, m.oid AS role, m.rolname, m.rolsuper
    FROM wanted w JOIN pg_catalog.pg_roles m ON pg_catalog.pg_has_role(w.oid, m.oid, 'MEMBER')),
temp AS (
    SELECT oid FROM pg_catalog.pg_namespace WHERE nspname ~ '^pg_(toast_)?temp_')
SELECT w.rolname::text, coalesce(
    (SELECT 'it is or may become the superuser ' || pg_catalog.quote_ident(x.rolname)
     FROM reach x WHERE x.token_role = w.oid AND x.rolsuper LIMIT 1),
    (SELECT 'it may create schemas in this database (as ' || pg_catalog.quote_ident(x.rolname) || ')'
     FROM reach x WHERE x.token_role = w.oid
       AND pg_catalog.has_database_privilege(x.role, pg_catalog.current_database(), 'CREATE') LIMIT 1),
    (SELECT 'it may create objects in schema ' || pg_catalog.quote_ident(n.nspname)
            || ' (as ' || pg_catalog.quote_ident(x.rolname) || ')'
     FROM reach x, pg_catalog.pg_namespace n
     WHERE x.token_role = w.oid AND n.oid NOT IN (SELECT oid FROM temp)
       AND pg_catalog.has_schema_privilege(x.role, n.oid, 'CREATE') LIMIT 1),
    (SELECT 'it owns schema ' || pg_catalog.quote_ident(n.nspname)
     FROM reach x JOIN pg_catalog.pg_namespace n ON n.nspowner = x.role
     WHERE x.token_role = w.oid AND n.oid NOT IN (SELECT oid FROM temp) LIMIT 1),
    (SELECT 'it owns relation ' || pg_catalog.quote_ident(n.nspname) || '.'
            || pg_catalog.quote_ident(c.relname)
     FROM reach x JOIN pg_catalog.pg_class c ON c.relowner = x.role
     JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE x.token_role = w.oid AND c.relnamespace NOT IN (SELECT oid FROM temp) LIMIT 1),
    (SELECT 'it owns function ' || pg_catalog.quote_ident(n.nspname) || '.'
            || pg_catalog.quote_ident(p.proname) || '('
            || pg_catalog.pg_get_function_identity_arguments(p.oid) || ')'
     FROM reach x JOIN pg_catalog.pg_proc p ON p.proowner = x.role
     JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
     WHERE x.token_role = w.oid AND p.pronamespace NOT IN (SELECT oid FROM temp) LIMIT 1),
    (SELECT 'it owns type ' || t.oid::pg_catalog.regtype::text
     FROM reach x JOIN pg_catalog.pg_type t ON t.typowner = x.role
     WHERE x.token_role = w.oid AND t.typnamespace NOT IN (SELECT oid FROM temp) LIMIT 1))
FROM wanted w
UNION ALL
SELECT t.name, 'no role of that name exists'
FROM pg_catalog.unnest($1::text[]) AS t(name)
WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = t.name)
UNION ALL
-- SET ROLE needs the SET option of the grant since PostgreSQL 16 (MEMBER before).
SELECT w.rolname::text, 'the login role may not become it'
FROM wanted w
WHERE NOT pg_catalog.pg_has_role(session_user, w.oid,
    CASE WHEN pg_catalog.current_setting('server_version_num')::int >= 160000
         THEN 'SET' ELSE 'MEMBER' END)
ORDER BY 1";

/// `name` as an SQL identifier.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The extension's schema (quoted) and whether a superuser owns it (`pg_database_owner` as the
/// database's owner): the gateway calls the extension's functions by that name, as the login
/// role, and the schema's owner could rename it and put functions of its own in their place.
async fn extension_schema(
    client: &tokio_postgres::Client,
) -> Result<Option<(String, bool)>, tokio_postgres::Error> {
    let rows = pinned_query(
        client,
        "SELECT pg_catalog.quote_ident(n.nspname), o.rolsuper \
         FROM pg_catalog.pg_extension e \
         JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace \
         JOIN pg_catalog.pg_database d ON d.datname = pg_catalog.current_database() \
         JOIN pg_catalog.pg_roles o ON o.oid = CASE \
             WHEN n.nspowner = 'pg_database_owner'::pg_catalog.regrole THEN d.datdba \
             ELSE n.nspowner END \
         WHERE e.extname = 'sql_query_engine'",
        &[],
    )
    .await?;
    Ok(rows
        .first()
        .and_then(|row| Some((row.try_get(0).ok()?, row.try_get(1).ok()?))))
}

/// Runs the gateway's own catalog query `sql` in a transaction whose search path is
/// pg_catalog's alone. It runs as the login role, on that role's search path, where another
/// role may have put an operator (in `public`, or a schema named after the login role) that a
/// comparison here would take over pg_catalog's for a closer match of its argument types
/// (CVE-2018-1058), and so run that role's code in the gateway's session.
async fn pinned_query(
    client: &Client,
    sql: &str,
    params: &[(&(dyn tokio_postgres::types::ToSql + Sync), Type)],
) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    // BEGIN and SET LOCAL in one message: a failure of the SET leaves the transaction
    // aborted, and the ROLLBACK below ends it before the connection goes back to its pool.
    // Local, also the time a check may take (one whose waiter stopped waiting ends in the
    // server too): a session's setting would stay on a pooler's server connection.
    let begun = client
        .batch_execute(
            "BEGIN; SET LOCAL search_path = pg_catalog, pg_temp; \
             SET LOCAL statement_timeout = '10s'",
        )
        .await;
    let rows = match begun {
        Ok(()) => client.query_typed(sql, params).await,
        Err(error) => Err(error),
    };
    let end = client
        .batch_execute(if rows.is_ok() { "COMMIT" } else { "ROLLBACK" })
        .await;
    let rows = rows?;
    end?;
    Ok(rows)
}

/// The role among those the login role is or may become that reaches as far as a superuser
/// (`REACHING_ROLES`), if any.
async fn reaching_role(client: &Client) -> Result<Option<String>, tokio_postgres::Error> {
    let rows = pinned_query(
        client,
        &format!("SELECT r.rolname::text {REACHING_ROLES}"),
        &[],
    )
    .await?;
    // A role whose name cannot be read (bytes that are no UTF-8) reaches as far all the same.
    Ok(rows.first().map(|row| {
        row.try_get(0)
            .unwrap_or_else(|_| "a role whose name cannot be read".to_string())
    }))
}

impl Db {
    /// Connects to the primary (`url`) and prepares pools for the read servers (`read_urls`).
    pub async fn connect(
        url: &str,
        read_urls: &[String],
        pool_size: usize,
        wait: Duration,
        role_calls: usize,
    ) -> anyhow::Result<Db> {
        let primary = Node::new(url, pool_size)?;
        // Fail at start-up, not at the first request, when the database is unreachable or
        // the extension is missing.
        let conn = primary
            .get(CONNECT_TIMEOUT, None)
            .await
            .map_err(|e| anyhow::anyhow!("connecting to the database: {e:?}"))?;
        if let Some(superuser) = reaching_role(&conn.client).await? {
            let superuser = crate::shown::in_log(&superuser);
            anyhow::bail!(
                "the login role of --database-url is a superuser or may act as one, or may become \
                 such a role ({superuser}: superuser, CREATEROLE, REPLICATION, a member of \
                 pg_execute_server_program, pg_read_server_files or pg_write_server_files, or \
                 granted EXECUTE on a function that reads or writes the server's files or on \
                 dblink_connect_u, or SET or ALTER SYSTEM on a setting the server runs as a \
                 program or loads as code): the \
                 code of views, policies and functions that other roles own would run with that \
                 reach (it can RESET ROLE or SET ROLE); log in as a role with no \
                 privileges of its own that may become the tokens' roles (see README, \"the \
                 gateway\")"
            );
        }
        let schema = extension_schema(&conn.client).await?;
        drop(conn);
        let schema = match schema {
            None => {
                anyhow::bail!("the extension sql_query_engine is not installed in this database")
            }
            Some((schema, false)) => {
                let schema = crate::shown::in_log(&schema);
                anyhow::bail!(
                    "the extension sql_query_engine is installed in schema {schema}, whose owner \
                     is not a superuser: it could put a procedure of its own in place of the \
                     extension's nl_call, which the gateway calls by that name (a superuser: \
                     ALTER SCHEMA {schema} OWNER TO a superuser)"
                )
            }
            Some((schema, true)) => schema,
        };
        let readers = read_urls
            .iter()
            .map(|url| Node::new(url, pool_size))
            .collect::<anyhow::Result<Vec<Node>>>()?;
        let db = Db {
            database: primary
                .config
                .get_dbname()
                .unwrap_or("postgres")
                .to_string(),
            primary,
            readers,
            next: AtomicUsize::new(0),
            wait,
            shares: Shares::new(role_calls),
            schema,
        };
        for reader in &db.readers {
            db.check(reader).await;
        }
        Ok(db)
    }

    /// Checks the read servers every `interval`, for as long as the gateway runs.
    pub fn watch_readers(self: &Arc<Self>, interval: Duration) {
        if self.readers.is_empty() {
            return;
        }
        let db = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                for reader in &db.readers {
                    db.check(reader).await;
                }
            }
        });
    }

    /// Whether `node`, where a call just failed, is going away: already out of the rotation, or
    /// a connection of its own (`SELECT 1`) is refused, reset, told the server is shutting
    /// down or starting (57P01, 57P02, 57P03) or not reached (08xxx, a pooler's word), or not
    /// answered within `CALL_CHECK_TIMEOUT` (a pooler in front keeps it waiting for a server
    /// it cannot reach). Too many connections or
    /// a refused login may be the load the roles' own calls put on it: not taken for the
    /// server failing, so the failed call is its own error. Not the health check's kept
    /// connection: a check in progress would hold every failed call, and its role's share of
    /// calls, behind it. Noted when it is going away.
    async fn confirmed_down(&self, node: &Node) -> bool {
        if !node.healthy.load(Ordering::Relaxed) {
            return true;
        }
        let going_away = |e: &tokio_postgres::Error| match e.as_db_error() {
            // Shutting down or starting, or (a pooler's word) the server is not reached.
            Some(db) => {
                db.code().code().starts_with("08")
                    || ["57P01", "57P02", "57P03"].contains(&db.code().code())
            }
            // Refused, reset, or closed: the socket says so.
            None => {
                e.is_closed()
                    || std::error::Error::source(e)
                        .is_some_and(|source| source.downcast_ref::<std::io::Error>().is_some())
            }
        };
        let started = tokio::time::Instant::now();
        let down = match tokio::time::timeout(CALL_CHECK_TIMEOUT, node.config.connect(NoTls)).await
        {
            Ok(Ok((client, connection))) => {
                let task = tokio::spawn(connection);
                let left = CALL_CHECK_TIMEOUT.saturating_sub(started.elapsed());
                let answered = tokio::time::timeout(left, client.simple_query("SELECT 1")).await;
                // Ended now, whatever the server does with it.
                task.abort();
                match answered {
                    Ok(Ok(_)) => false,
                    Ok(Err(e)) => going_away(&e),
                    Err(_) => true,
                }
            }
            Ok(Err(e)) => going_away(&e),
            Err(_) => true,
        };
        if down {
            node.set_healthy(
                false,
                "a call failed there, and so did a connection of its own",
            );
        }
        down
    }

    /// One health check of a read server, on a connection of its own: it answers, its login
    /// role reaches no further than a role should (`REACHING_ROLES`), and where it keeps
    /// sessions. A change is said on stderr.
    async fn check(&self, node: &Node) {
        let mut kept = node.probe.lock().await;
        let probe = async {
            let client = match kept.take().filter(|c| !c.is_closed()) {
                Some(client) => kept.insert(client),
                None => {
                    let (client, connection) = node.config.connect(NoTls).await?;
                    tokio::spawn(connection);
                    kept.insert(client)
                }
            };
            // The schema first: the extension's functions are called by its name.
            let unchanged = extension_schema(client).await? == Some((self.schema.clone(), true));
            if !unchanged {
                return Ok((false, false, String::new()));
            }
            let rows = pinned_query(
                client,
                &format!(
                    "SELECT EXISTS (SELECT {REACHING_ROLES}), {}.nl_session_store()",
                    self.schema
                ),
                &[],
            )
            .await?;
            let row = rows.first();
            Ok::<(bool, bool, String), tokio_postgres::Error>((
                true,
                row.and_then(|r| r.try_get(0).ok()).unwrap_or(true),
                row.and_then(|r| r.try_get(1).ok()).unwrap_or_default(),
            ))
        };
        let (healthy, shared, why) = match tokio::time::timeout(CONNECT_TIMEOUT, probe).await {
            Ok(Ok((false, _, _))) => (
                false,
                false,
                "the extension's schema is no longer the one the gateway started with, owned by \
                 a superuser"
                    .to_string(),
            ),
            Ok(Ok((true, false, store))) => (true, store == "redis", String::new()),
            Ok(Ok((true, true, _))) => (
                false,
                false,
                "its login role is or may become a role that reaches as far as a superuser \
                 (refused, as for --database-url)"
                    .to_string(),
            ),
            Ok(Err(e)) => (false, false, e.to_string()),
            Err(_) => (false, false, "no answer in time".to_string()),
        };
        if !healthy {
            // A connection that failed or hung is not asked again.
            *kept = None;
        }
        node.shared_sessions.store(shared, Ordering::Relaxed);
        node.set_healthy(healthy, &why);
    }

    /// The servers that may answer `call`, in the order to try them: a write, a call that
    /// holds its transaction while the model thinks (`nl_generate`, `nl_fix`: on a standby it
    /// would hold back replay, and it records history), or a question whose session lives on
    /// the server when no read server shares sessions, only the primary; a question the
    /// healthy read servers, round-robin, then the primary.
    fn route(&self, call: &Call) -> Vec<&Node> {
        let server_session = matches!(
            call,
            Call::Ask {
                session: Some(_),
                turns: None,
                ..
            }
        );
        if matches!(
            call,
            Call::Feedback { .. } | Call::Generate { .. } | Call::Fix { .. }
        ) || self.readers.is_empty()
        {
            return vec![&self.primary];
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut nodes: Vec<&Node> = (0..self.readers.len())
            .map(|i| &self.readers[(start + i) % self.readers.len()])
            .filter(|n| n.healthy.load(Ordering::Relaxed))
            .filter(|n| !server_session || n.shared_sessions.load(Ordering::Relaxed))
            .collect();
        nodes.push(&self.primary);
        nodes
    }

    /// Why each of `roles` should not be a token's role: it is (or may become) a superuser, it
    /// may create objects outside pg_temp, or it owns relations, functions, types or schemas
    /// (directly or through a role it may become). Such a role can write code (a view or
    /// policy calling `set_config('role', ...)` and `query_to_xml`, a function with SET ROLE)
    /// that runs in the gateway's session, where SET ROLE is checked against the login role:
    /// it would reach every role the login role may become. Roles that do not exist, or that
    /// the login role may not become, are named too (their requests would fail).
    /// `Err` names the role that the login role is or may become and that reaches as far as a
    /// superuser, when there is one: then no token may be in force.
    pub async fn risky_roles(
        &self,
        roles: &[String],
    ) -> Result<Result<Vec<(String, String)>, String>, DbError> {
        // On a connection of its own, not one of the pool's: token holders may keep every
        // pooled place busy (calls, or calls whose clients left), and a reload must still vet
        // the file (else tokens added wait, and those of a role that became risky stay).
        // Ended with the check, or when the reload stops waiting for it.
        let (client, connection) =
            tokio::time::timeout(CONNECT_TIMEOUT, self.primary.config.connect(NoTls))
                .await
                .map_err(|_| DbError::Busy)??;
        // Dropped in order: the client (the connection then ends), then its task.
        let vetting = (client, AbortOnDrop(tokio::spawn(connection)));
        let client = &vetting.0;
        let checked = async {
            // The login role is checked again too: it may have been granted a role that
            // reaches as far as a superuser since the gateway started.
            if let Some(reaching) = reaching_role(client).await? {
                return Ok(Err(reaching));
            }
            let rows = pinned_query(client, RISKY_ROLES_SQL, &[(&roles, Type::TEXT_ARRAY)]).await?;
            // A row that cannot be read (a name in bytes that are no UTF-8) is a refusal, never
            // a role let through.
            let mut risky = Vec::new();
            for row in &rows {
                let role: String = row.try_get(0).map_err(unreadable)?;
                match row.try_get::<_, Option<String>>(1) {
                    Ok(Some(why)) => risky.push((role, why)),
                    Ok(None) => {}
                    Err(_) => risky.push((
                        role,
                        "what it may do names an object whose name cannot be read".to_string(),
                    )),
                }
            }
            Ok::<_, DbError>(Ok(risky))
        }
        .await;
        checked
    }

    /// Runs `call` as `role` (the login role when `None`) on the first server of its route
    /// that has a free connection, and on the next when that server fails; NOTICEs go to
    /// `progress` as they arrive. A role waits for a place among its own share of calls
    /// first. Dropping the future cancels the query.
    pub async fn call(
        &self,
        role: Option<&str>,
        call: &Call,
        progress: Option<Sender<String>>,
    ) -> Result<Answer, DbError> {
        if let Some(refusal) = call.too_long() {
            return Err(refusal);
        }
        let mut share = match role {
            Some(role) => Some(
                self.shares
                    .enter(role, self.wait)
                    .await
                    .ok_or(DbError::RoleBusy(self.shares.per_role()))?,
            ),
            None => None,
        };
        let nodes = self.route(call);
        let mut failed = None;
        // Whether the call was already asked again after it failed on a server it reached: it
        // is asked again once at most, so that a call that ends its own backend (one the
        // check cannot tell from a server going away, behind a pooler), or raises a conflict
        // with recovery itself, costs two servers, not every one.
        let mut asked_again = false;
        for (i, node) in nodes.iter().enumerate() {
            let last = i + 1 == nodes.len();
            // A busy read server is passed over at once; only the last one is waited for.
            let wait = if last { self.wait } else { Duration::ZERO };
            // Whether the call reached the server (a connection was had for it).
            let mut reached = false;
            let result = match node.get(wait, role).await {
                Ok(mut conn) => {
                    reached = true;
                    // Held by the connection while the call runs there (see `Lease`), and
                    // taken on to the next server when it ended.
                    conn.share = share.take();
                    let result = self.call_on(&mut conn, role, call, progress.clone()).await;
                    share = conn.share.take();
                    result
                }
                Err(e) => Err(e),
            };
            match result {
                // A backend that ended under the call (a DBA's pg_terminate_backend, the
                // extension's memory watch, a crash the query caused) is no server failing:
                // asked again, the call would end its backend on every other server, the
                // primary's last. The server is checked on a connection of its own, and only
                // when that fails too is the call asked of another.
                Err(e)
                    if !last
                        && e.server_failed()
                        && reached
                        && (asked_again || !self.confirmed_down(node).await) =>
                {
                    return Err(e);
                }
                Err(e) if !last && e.server_failed() => {
                    asked_again |= reached;
                    node.set_healthy(false, &format!("a call failed ({e:?})"));
                    log_line!(
                        "sqe-gateway: read server {} failed ({e:?}); asking another",
                        node.name
                    );
                    if let Some(progress) = &progress {
                        let _ = progress.try_send(
                            "sql_query_engine: the server answering failed; asking another"
                                .to_string(),
                        );
                    }
                    failed = Some(e);
                }
                // Also asked again once at most: a view's own code may raise the same
                // SQLSTATE, and would have the call (its model requests and queries) made on
                // every server.
                Err(e) if !last && e.replay_conflict() => {
                    if asked_again {
                        return Err(e);
                    }
                    asked_again = true;
                    failed = Some(e);
                }
                Err(DbError::Busy) if !last => {}
                Ok(mut answer)
                    if matches!(call, Call::Ask { .. }) && !std::ptr::eq(*node, &self.primary) =>
                {
                    self.record_on_primary(role, call, &mut answer).await;
                    return Ok(answer);
                }
                other => return other,
            }
        }
        Err(failed.unwrap_or(DbError::Busy))
    }

    /// Runs `call` on one connection; NOTICEs go to `progress` while it runs.
    async fn call_on(
        &self,
        conn: &mut Lease,
        role: Option<&str>,
        call: &Call,
        progress: Option<Sender<String>>,
    ) -> Result<Answer, DbError> {
        let streaming = progress.is_some();
        if let Ok(mut sender) = conn.notices.lock() {
            *sender = progress;
        }
        // Armed before the first statement on the connection: a request dropped in the middle
        // of the schema's check (a transaction of its own) must not leave the connection in it.
        let guard = CancelOnDrop::new(conn);
        // The extension's functions are called by its schema's name: only while that is still
        // the schema the gateway started with, owned by a superuser (a superuser may have given
        // it away since, and its new owner renamed it and put a procedure of its own there).
        let result = match extension_schema(&conn.client).await {
            Ok(found) if found == Some((self.schema.clone(), true)) => {
                run(&mut conn.client, &self.schema, role, call, streaming).await
            }
            Ok(_) => Err(DbError::Unavailable(
                "the extension's schema is no longer the one the gateway started with, owned \
                 by a superuser"
                    .into(),
            )),
            Err(_) => Err(DbError::Unavailable(
                "the extension's schema could not be checked".into(),
            )),
        };
        guard.disarm();
        if let Ok(mut sender) = conn.notices.lock() {
            *sender = None;
        }
        // Out of memory: the extension's queries may have left their memory in the backend's
        // caches (it then runs no more on it), so the pool closes the connection, and a new
        // backend starts afresh.
        if matches!(&result, Err(DbError::Sql { sqlstate, .. }) if sqlstate == "53200") {
            conn.abandoned.store(true, Ordering::SeqCst);
        }
        result
    }

    /// Writes the history of an answer a read server gave (a standby writes none) to the
    /// primary, as the same role, and puts its id into the answer (for feedback). Best effort:
    /// the answer stands without it, and the standby's server log has the audit line.
    async fn record_on_primary(&self, role: Option<&str>, call: &Call, answer: &mut Answer) {
        if !answer.value["history_id"].is_null() {
            return;
        }
        // Without its rows (the history keeps none).
        let recorded = answer.value.clone();
        let session = match call {
            Call::Ask { session, .. } => session.clone(),
            _ => None,
        };
        let call = Call::History {
            answer: recorded,
            session,
        };
        let written = match self.primary.get(self.wait, role).await {
            Ok(mut conn) => self.call_on(&mut conn, role, &call, None).await,
            Err(e) => Err(e),
        };
        match written {
            Ok(id) => answer.value["history_id"] = id.value,
            Err(e) => log_line!("sqe-gateway: the history of an answer was not written: {e:?}"),
        }
    }
}

/// What a client is told of a value the extension returned that the gateway cannot read: JSON
/// nested deeper than serde_json reads (128 levels), say. Never an empty answer instead.
fn unreadable(e: impl std::fmt::Display) -> DbError {
    DbError::Sql {
        sqlstate: "54001".to_string(),
        message: format!("the answer could not be passed on: {e}"),
        detail: None,
        hint: Some(
            "A value in it may be missing, of another type, or nested too deeply; ask for it \
             another way."
                .to_string(),
        ),
        server_side: false,
    }
}

/// What a call answered: its JSON, and the rows of an answer or of `nl_run` apart, each row as
/// the text the database wrote. Parsed into values, a result of small numbers weighs some fifty
/// times its text (a 16 MB answer most of a gigabyte of the gateway's memory); kept as text it
/// weighs what it is, is passed on as the database wrote it, and what a chat shows of it (its
/// first rows) is parsed alone.
#[derive(Debug, Default)]
pub struct Answer {
    pub value: Value,
    pub rows: Option<Vec<Box<RawValue>>>,
}

/// An answer's JSON object read field by field, each as its text.
type Fields = Option<std::collections::BTreeMap<String, Box<RawValue>>>;

impl Answer {
    pub fn of(value: Value) -> Answer {
        Answer { value, rows: None }
    }

    /// `nl_call`'s answer, its rows kept as text.
    fn from_fields(fields: Fields) -> Result<Answer, serde_json::Error> {
        let Some(mut fields) = fields else {
            return Ok(Answer::default());
        };
        let rows = match fields.remove("rows") {
            Some(rows) => serde_json::from_str::<Option<Vec<Box<RawValue>>>>(rows.get())?,
            None => None,
        };
        let value = fields
            .into_iter()
            .map(|(name, raw)| Ok((name, serde_json::from_str(raw.get())?)))
            .collect::<Result<Map<String, Value>, serde_json::Error>>()?;
        Ok(Answer {
            value: Value::Object(value),
            rows,
        })
    }

    /// The answer as JSON text: its fields, and its rows (when there are) as `rows`.
    pub fn json(&self) -> String {
        #[derive(serde::Serialize)]
        struct WithRows<'a> {
            #[serde(flatten)]
            fields: &'a Map<String, Value>,
            rows: &'a [Box<RawValue>],
        }
        match (&self.value, &self.rows) {
            (Value::Object(fields), Some(rows)) => {
                serde_json::to_string(&WithRows { fields, rows }).unwrap_or_default()
            }
            (value, _) => value.to_string(),
        }
    }

    /// `nl_call`'s answer as JSON text (the tests' answers).
    #[cfg(test)]
    pub fn from_json(text: &str) -> Answer {
        serde_json::from_str(text)
            .and_then(Answer::from_fields)
            .expect("an answer's JSON")
    }

    /// How many rows it has.
    pub fn row_count(&self) -> usize {
        self.rows.as_ref().map_or(0, Vec::len)
    }

    /// Its first `n` rows, parsed.
    pub fn first_rows(&self, n: usize) -> Vec<Value> {
        self.rows
            .iter()
            .flatten()
            .take(n)
            .map(|row| serde_json::from_str(row.get()).unwrap_or(Value::Null))
            .collect()
    }
}

/// The first column of the one row `sql` returns, in a transaction, its parameters sent with
/// their types: an unnamed statement, which no pooler's server connection keeps after the
/// transaction (a named one, whose request was dropped before it was closed, would stay there
/// and clash with the next client's of that name).
async fn one<T: tokio_postgres::types::FromSqlOwned>(
    tx: &tokio_postgres::Transaction<'_>,
    sql: &str,
    parameters: &[(&(dyn ToSql + Sync), Type)],
) -> Result<T, DbError> {
    tx.query_typed_one(sql, parameters)
        .await?
        .try_get(0)
        .map_err(unreadable)
}

async fn run(
    client: &mut Client,
    schema: &str,
    role: Option<&str>,
    call: &Call,
    progress: bool,
) -> Result<Answer, DbError> {
    if let Call::Ask {
        question,
        session,
        turns,
    } = call
    {
        // Outside a transaction: nl_call commits before each model call, and its role and
        // progress setting end with it.
        let turns = turns.as_ref().map(Value::to_string);
        let row = client
            .query_typed(
                &format!(
                    "CALL {schema}.nl_call($1::pg_catalog.text, $2::pg_catalog.text, \
                     NULL::pg_catalog.jsonb, $3::pg_catalog.jsonb, $4::pg_catalog.text, \
                     $5::pg_catalog.bool)"
                ),
                &[
                    (question, Type::TEXT),
                    (session, Type::TEXT),
                    (&turns, Type::TEXT),
                    (&role, Type::TEXT),
                    (&progress, Type::BOOL),
                ],
            )
            .await?;
        return match row.first() {
            Some(row) => {
                let fields = row
                    .try_get::<_, Option<Json<Fields>>>(0)
                    .map_err(unreadable)?
                    .and_then(|Json(fields)| fields);
                Answer::from_fields(fields).map_err(unreadable)
            }
            None => Ok(Answer::default()),
        };
    }
    let tx = client.transaction().await?;
    if let Some(role) = role {
        tx.batch_execute(&format!("SET LOCAL ROLE {}", quote_ident(role)))
            .await?;
    }
    if progress {
        tx.batch_execute("SET LOCAL sql_query_engine.progress = on")
            .await?;
    }
    let json = |text: String| serde_json::from_str::<Value>(&text).map_err(unreadable);
    let text = Type::TEXT;
    let answer = match call {
        Call::Ask { .. } => Answer::default(),
        Call::History { answer, session } => {
            let answer = answer.to_string();
            let id: Option<i64> = one(
                &tx,
                &format!(
                    "SELECT {schema}.nl_history_add($1::pg_catalog.text::pg_catalog.jsonb, \
                     'nl_call'::pg_catalog.text, $2::pg_catalog.text)"
                ),
                &[(&answer, text.clone()), (session, text)],
            )
            .await?;
            Answer::of(Value::from(id))
        }
        Call::Generate { question } => Answer::of(Value::String(
            one(
                &tx,
                &format!("SELECT {schema}.nl_generate($1::pg_catalog.text)"),
                &[(question, text)],
            )
            .await?,
        )),
        Call::Check { sql } => {
            tx.execute_typed(
                &format!("SELECT {schema}.nl_check($1::pg_catalog.text)"),
                &[(sql, text)],
            )
            .await?;
            Answer::of(Value::Bool(true))
        }
        Call::Run { sql } => {
            let rows: String = one(
                &tx,
                &format!(
                    "SELECT coalesce(pg_catalog.jsonb_agg(r), '[]')::pg_catalog.text \
                     FROM {schema}.nl_run($1::pg_catalog.text) r"
                ),
                &[(sql, text)],
            )
            .await?;
            Answer {
                value: Value::Null,
                rows: Some(serde_json::from_str(&rows).map_err(unreadable)?),
            }
        }
        Call::Schema { question } => Answer::of(Value::String(
            one(
                &tx,
                &format!("SELECT {schema}.nl_schema($1::pg_catalog.text)"),
                &[(question, text)],
            )
            .await?,
        )),
        Call::Fix { sql, question } => Answer::of(Value::String(
            one(
                &tx,
                &format!("SELECT {schema}.nl_fix($1::pg_catalog.text, $2::pg_catalog.text)"),
                &[(sql, text.clone()), (question, text)],
            )
            .await?,
        )),
        Call::Feedback {
            history_id,
            correct,
            corrected_sql,
        } => Answer::of(json(
            one(
                &tx,
                &format!(
                    "SELECT {schema}.nl_feedback($1::pg_catalog.int8, $2::pg_catalog.bool, \
                     $3::pg_catalog.text)::pg_catalog.text"
                ),
                &[
                    (history_id, Type::INT8),
                    (correct, Type::BOOL),
                    (corrected_sql, text),
                ],
            )
            .await?,
        )?),
        // Relations another role made (any number, with comments of any size): at most
        // MAX_TABLES of them, each comment read as its first 1,000 characters only, as the
        // extension's own schema read bounds them, and those in the first MAX_TABLES_BYTES of
        // JSON (a control character is written as six bytes). Which the role may read is
        // decided from the grants as stored (the schemas it may use first), as the extension's
        // schema read decides it: `has_any_column_privilege` looks every column of a table the
        // role may not read whole up in the catalog cache, which keeps each entry for as long
        // as the pooled connection lives (another role's thousands of tables of 1,600 columns
        // would fill every backend of the pool).
        Call::Tables => Answer::of(json({
            tx.batch_execute("SET LOCAL search_path = pg_catalog, pg_temp")
                .await?;
            one(
                &tx,
                "SELECT coalesce(json_agg(e.element ORDER BY e.ord) FILTER (WHERE e.bytes <= $2),
                                 '[]')::pg_catalog.text
                 FROM (SELECT e.*, sum(octet_length(e.element::text))
                                  OVER (ORDER BY e.ord ROWS UNBOUNDED PRECEDING) AS bytes
                 FROM (SELECT row_number() OVER (ORDER BY t.nspname, t.relname) AS ord,
                   json_build_object(
                     'schema', t.nspname, 'name', t.relname,
                     'kind', CASE t.relkind WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view'
                                  WHEN 'f' THEN 'foreign table' ELSE 'table' END,
                     'comment', (SELECT substr(d.description, 1, 1000)
                                 FROM pg_description d
                                 WHERE d.objoid = t.oid AND d.objsubid = 0
                                   AND d.classoid = 'pg_catalog.pg_class'::regclass)) AS element
                 FROM (SELECT c.oid, c.relname, c.relkind, n.nspname
                       FROM (SELECT n.oid, n.nspname FROM pg_namespace n
                             WHERE n.nspname <> ALL (ARRAY['pg_catalog', 'information_schema'])
                               AND n.nspname !~ '^pg_toast'
                               AND has_schema_privilege(n.oid, 'USAGE')
                             OFFSET 0) n
                       JOIN pg_class c ON c.relnamespace = n.oid
                       CROSS JOIN (SELECT ARRAY(SELECT ro.oid FROM pg_roles ro
                                                WHERE pg_has_role(ro.oid, 'USAGE')) AS ids,
                                          pg_has_role('pg_read_all_data', 'USAGE') AS all_data
                                   OFFSET 0) roles
                       WHERE c.relkind IN ('r', 'v', 'm', 'f', 'p') AND NOT c.relispartition
                         AND (roles.all_data
                              OR EXISTS (SELECT FROM aclexplode(coalesce(c.relacl,
                                                                acldefault('r', c.relowner))) x
                                         WHERE x.privilege_type = 'SELECT'
                                           AND (x.grantee = 0 OR x.grantee = ANY (roles.ids)))
                              OR EXISTS (SELECT FROM pg_attribute a
                                         CROSS JOIN LATERAL aclexplode(a.attacl) x
                                         WHERE a.attrelid = c.oid AND a.attnum > 0
                                           AND NOT a.attisdropped AND a.attacl IS NOT NULL
                                           AND x.privilege_type = 'SELECT'
                                           AND (x.grantee = 0 OR x.grantee = ANY (roles.ids))))
                       ORDER BY n.nspname, c.relname
                       LIMIT $1) t) e) e",
                &[(&MAX_TABLES, Type::INT8), (&MAX_TABLES_BYTES, Type::INT8)],
            )
            .await?
        })?),
    };
    tx.commit().await?;
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answers_rows_are_passed_on_as_the_database_wrote_them() {
        let answer = Answer::from_json(
            r#"{"status": "ok", "rows": [[9.50, "a"], [1e400, null]], "row_count": 2}"#,
        );
        assert_eq!(answer.row_count(), 2);
        assert_eq!(answer.rows.as_ref().unwrap()[0].get(), r#"[9.50, "a"]"#);
        assert_eq!(answer.value["status"], "ok");
        assert!(answer.value.get("rows").is_none());
        assert_eq!(answer.first_rows(1).len(), 1);
        let text = answer.json();
        assert!(
            text.contains(r#""rows":[[9.50, "a"],[1e400, null]]"#),
            "{text}"
        );
        let again: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(again["row_count"], 2);
        // An answer without rows is its JSON alone.
        assert_eq!(Answer::of(Value::Bool(true)).json(), "true");
        assert_eq!(Answer::from_json("null").json(), "null");
    }

    /// The extension refuses a role that reaches the server's code by the same list (its
    /// superuser's-call rules): a role the gateway let in that the extension treats as a
    /// superuser would have every call refused, unexplained.
    #[test]
    fn the_reaching_roles_name_every_setting_the_extension_counts() {
        let trust = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../src/guard/trust.rs"
        ))
        .unwrap();
        let list = trust
            .split("const SERVER_CODE_SETTINGS")
            .nth(1)
            .and_then(|rest| rest.split("];").next())
            .unwrap();
        let settings: Vec<&str> = list.split('"').skip(1).step_by(2).collect();
        assert!(settings.len() >= 18, "{settings:?}");
        for setting in settings {
            assert!(
                REACHING_ROLES.contains(&format!("'{setting}'")),
                "{setting}"
            );
        }
    }

    #[test]
    fn a_backend_that_says_it_ends_after_its_transaction_is_not_handed_out_again() {
        // As src/exec.rs (`end_connection`) says it.
        assert!(ends_the_connection(
            "sql_query_engine: queries left 1030 MB in this connection's caches, as much as \
             sql_query_engine.max_query_memory (1024 MB): the connection ends after this \
             transaction (PostgreSQL then says it terminates it); reconnect"
        ));
        assert!(!ends_the_connection("sql_query_engine: asking the model"));
        assert!(!ends_the_connection(
            "the connection ends after this transaction, says a view"
        ));
    }

    #[test]
    fn only_the_extensions_progress_lines_are_passed_on_and_cut() {
        assert_eq!(
            progress_line("sql_query_engine: asking the model").as_deref(),
            Some("sql_query_engine: asking the model")
        );
        assert_eq!(progress_line("loud notice from a view"), None);
        let long = format!("sql_query_engine: {}", "é".repeat(10_000));
        assert_eq!(
            progress_line(&long).unwrap().chars().count(),
            MAX_PROGRESS_CHARS
        );
    }

    #[test]
    fn questions_and_sql_longer_than_the_extension_takes_are_refused_first() {
        let ask = |n: usize| Call::Ask {
            question: "x".repeat(n),
            session: None,
            turns: None,
        };
        assert!(ask(10_000).too_long().is_none());
        assert!(matches!(
            ask(10_001).too_long(),
            Some(DbError::Sql { sqlstate, .. }) if sqlstate == "22023"
        ));
        let fix = |n: usize| Call::Fix {
            sql: "é".repeat(n),
            question: None,
        };
        assert!(fix(100_000).too_long().is_none());
        assert!(fix(100_001).too_long().is_some());
        // The caller's own SQL, run, checked or given as a correction, too.
        let long = "s".repeat(100_001);
        for call in [
            Call::Run { sql: long.clone() },
            Call::Check { sql: long.clone() },
            Call::Feedback {
                history_id: 1,
                correct: false,
                corrected_sql: Some(long.clone()),
            },
        ] {
            assert!(call.too_long().is_some());
        }
        assert!(Call::Run {
            sql: "s".repeat(100_000)
        }
        .too_long()
        .is_none());
        // A session name, as the extension would see it: with the client's prefix.
        let named = |name: &str| {
            Call::Ask {
                question: "q".to_string(),
                session: Some(name.to_string()),
                turns: None,
            }
            .of_client(Some("0123456789abcdef"))
        };
        assert!(named(&"s".repeat(239)).too_long().is_none());
        assert!(named(&"s".repeat(240)).too_long().is_some());
        let history = Call::History {
            answer: Value::Null,
            session: Some("é".repeat(129)),
        };
        assert!(history.too_long().is_some());
    }
}
