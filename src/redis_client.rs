//! The optional Redis connection (`sql_query_engine.redis_url`): conversations, progress events
//! and the value index's reads, shared by every connection to every node of a deployment.
//!
//! Redis is never required. Every call is bounded by `sql_query_engine.redis_timeout` and waits
//! interruptibly (query cancel still works); when Redis is unreachable, slow or restarting, the
//! call returns `None`, the caller falls back to backend memory, a WARNING is given once per
//! backend, and Redis is tried again a few seconds later.

use std::cell::RefCell;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::settings;
use crate::wait::run_interruptible;

/// How long an unavailable Redis is left alone before it is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(5);

type Shared = Arc<Mutex<Option<::redis::Connection>>>;

#[derive(Default)]
struct State {
    /// The URL the connection belongs to.
    url: Option<String>,
    connection: Shared,
    down_until: Option<Instant>,
    warned: bool,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

/// Whether Redis is configured at all.
pub fn configured() -> bool {
    settings::redis_url().is_some()
}

/// Runs `command` on Redis. `None` when Redis is not configured or not available in time.
pub fn call<T, F>(command: F) -> Option<T>
where
    T: Send + 'static,
    F: FnOnce(&mut ::redis::Connection) -> ::redis::RedisResult<T> + Send + 'static,
{
    let url = settings::redis_url()?;
    let timeout = Duration::from_millis(settings::redis_timeout_ms());
    let shared = STATE.with_borrow_mut(|state| {
        if state.url.as_deref() != Some(url.as_str()) {
            *state = State {
                url: Some(url.clone()),
                ..State::default()
            };
        }
        match state.down_until {
            Some(until) if Instant::now() < until => None,
            _ => Some(Arc::clone(&state.connection)),
        }
    })?;
    let target = url.clone();
    let work = move || -> Result<T, String> {
        // A call abandoned by an earlier cancel may still hold the connection: then give up.
        let mut slot = shared
            .try_lock()
            .map_err(|_| "busy with an earlier call".to_string())?;
        if slot.is_none() {
            let client = ::redis::Client::open(target.as_str()).map_err(|e| e.to_string())?;
            let connection = client
                .get_connection_with_timeout(timeout)
                .map_err(|e| e.to_string())?;
            connection
                .set_read_timeout(Some(timeout))
                .map_err(|e| e.to_string())?;
            connection
                .set_write_timeout(Some(timeout))
                .map_err(|e| e.to_string())?;
            *slot = Some(connection);
        }
        let connection = slot.as_mut().ok_or("no connection")?;
        command(connection).map_err(|e| {
            *slot = None;
            e.to_string()
        })
    };
    let outcome =
        match run_interruptible(Instant::now() + timeout + Duration::from_millis(200), work) {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(cause)) => Err(cause),
            Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
        };
    match outcome {
        Ok(value) => {
            STATE.with_borrow_mut(|state| state.down_until = None);
            Some(value)
        }
        Err(cause) => {
            let first = STATE.with_borrow_mut(|state| {
                state.down_until = Some(Instant::now() + RETRY_AFTER);
                // The connection may be half-used by the abandoned call: start afresh.
                state.connection = Shared::default();
                !std::mem::replace(&mut state.warned, true)
            });
            if first {
                pgrx::warning!(
                    "sql_query_engine: Redis at {} is unavailable ({}); conversation context, \
                     progress events and the schema cache use backend memory",
                    crate::llm::redact_url(&url),
                    crate::llm::redact(&cause, &url)
                );
            }
            None
        }
    }
}

/// A Redis key (or channel) namespaced by cluster, database and role: one role never reads
/// another's data, and a role that is dropped and created again under the same name, or
/// renamed, is still told apart (OIDs). The cluster is its system identifier, which a primary
/// shares with its standbys and no other cluster has: OIDs repeat between clusters (two made
/// from one dump), and two that share a Redis would otherwise share their keys.
pub fn key(kind: &str, name: &str) -> String {
    // SAFETY: reads of backend state.
    let role = unsafe { pgrx::pg_sys::GetUserId() };
    format!("{}:{}:{kind}:{name}", database_prefix(), role.to_u32())
}

/// A Redis key for what every role of a database shares (the value index's reads of relations
/// whose read is the same for every role that may read them): namespaced by the cluster and
/// the database alone, and never equal to a role's key (`key`), whose fourth part is a number.
pub fn database_key(kind: &str, name: &str) -> String {
    format!("{}:shared:{kind}:{name}", database_prefix())
}

/// `sql_query_engine:<system identifier>:<database OID>`.
fn database_prefix() -> String {
    // SAFETY: reads of backend state (the identifier is read from pg_control at start).
    let (system, database) = unsafe {
        (
            pgrx::pg_sys::GetSystemIdentifier(),
            pgrx::pg_sys::MyDatabaseId,
        )
    };
    format!("sql_query_engine:{system}:{}", database.to_u32())
}
