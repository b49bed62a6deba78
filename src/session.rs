//! Conversations: the earlier turns of a session (question and the SQL that finally answered
//! it), so that "now only 2024" means something.
//!
//! A session must be found by whichever backend serves the next turn (a pool, pgbouncer in
//! transaction mode, another node of a deployment), so the store is, in this order:
//! - Redis when configured: one store for every node of the deployment, primary and standbys
//!   alike (namespaced by database and role OID, expiring after `session_ttl`), so that a
//!   conversation may hop between them;
//! - else the extension's table `nl_sessions` when the transaction can write (a row per turn,
//!   keyed by role OID and session, row-level security like `nl_history`, append-only for
//!   roles: a reset is a row too; turns expire after `session_ttl`), written in the caller's
//!   transaction;
//! - else backend memory, as the last resort (a read-only transaction or a hot standby without
//!   Redis); `DISCARD ALL` forgets it. It also bridges a Redis outage.
//!
//! The trace says which store served a turn.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};

use pgrx::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::{redis_client, settings, store};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Turn {
    pub question: String,
    pub sql: String,
}

impl Turn {
    /// What it weighs in backend memory.
    fn bytes(&self) -> usize {
        self.question.len() + self.sql.len()
    }
}

/// Where a session's turns are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    Table,
    Redis,
    Memory,
}

impl Store {
    pub fn as_str(self) -> &'static str {
        match self {
            Store::Table => "table",
            Store::Redis => "redis",
            Store::Memory => "memory",
        }
    }
}

/// Sessions kept in backend memory, at most.
const MAX_MEMORY_SESSIONS: usize = 256;
/// Bytes of questions and SQL kept in backend memory, at most (memory PostgreSQL does not
/// account for, kept until the backend ends or `DISCARD ALL`).
const MAX_MEMORY_BYTES: usize = 16 << 20;
/// A role holds at most this fraction of them (of the sessions and of the bytes): a role that
/// fills backend memory (a pooled or gateway backend serving many, fallen back to memory)
/// forgets its own conversations, and one role alone cannot leave the others no room.
const ROLE_SHARE: usize = 8;

/// A session's turns in backend memory, oldest first, each with when it was kept when it is kept
/// only here (no shared store took it: a reset written since ends it), and when the last was
/// added (they expire after `session_ttl`, as the other stores' do).
struct Remembered {
    turns: VecDeque<(Turn, Option<std::time::SystemTime>)>,
    updated: Option<std::time::Instant>,
    /// When it expires for other roles' calls: by the `session_ttl` of the role that wrote it,
    /// which another role's own (lower) setting does not shorten.
    expires: Option<std::time::Instant>,
}

thread_local! {
    /// Backend memory: (role, session) -> turns.
    static MEMORY: RefCell<HashMap<(u32, String), Remembered>> = RefCell::new(HashMap::new());
}

/// The store this transaction uses: Redis when configured, else the table where it can be
/// written, else backend memory.
pub fn store() -> Store {
    if redis_client::configured() {
        Store::Redis
    } else if store::writable() && store::extension_schema().is_ok() {
        Store::Table
    } else {
        Store::Memory
    }
}

/// The store a session would use now, Redis only when it answers (for `nl_session_store`,
/// which the gateway routes server-side sessions by).
pub fn reachable_store() -> Store {
    match store() {
        Store::Redis => {
            let pong: Option<String> = redis_client::call(|c| ::redis::cmd("PING").query(c));
            if pong.is_some() {
                Store::Redis
            } else {
                Store::Memory
            }
        }
        other => other,
    }
}

/// The current role, as sessions are keyed: by OID.
fn role_id() -> pg_sys::Oid {
    // SAFETY: reads the backend's current role.
    unsafe { pg_sys::GetUserId() }
}

fn memory_key(session: &str) -> (u32, String) {
    (role_id().to_u32(), session.to_string())
}

/// The last `session_turns` turns of `session`, oldest first, and the store that served them
/// (backend memory when Redis did not answer).
pub fn turns(session: &str) -> (Vec<Turn>, Store) {
    let keep = settings::session_turns();
    let store = store();
    if keep == 0 {
        return (Vec::new(), store);
    }
    let (found, served) = match store {
        Store::Table => match table_turns(session, keep) {
            // No live turn, and a reset (on any connection): of memory, only the turns kept
            // here since, which the table could not take.
            Some((turns, Some(reset))) if turns.is_empty() => {
                (Some(memory_turns(session, true, Some(reset))), Store::Table)
            }
            Some((turns, _)) if !turns.is_empty() => (Some(turns), Store::Table),
            // None: memory's turns are the session's (they were kept there when the table
            // could not be written).
            _ => (None, Store::Table),
        },
        Store::Redis => match redis_turns(session, keep) {
            // No list: a reset, an expiry or a Redis restart. Of this backend's memory only
            // the turns Redis never took (recorded while it was away) are the session's: the
            // copies of turns it had were reset, or expired, with the list.
            Some((_, false)) => (Some(memory_turns(session, true, None)), Store::Redis),
            Some((turns, true)) => (Some(turns), Store::Redis),
            None => (None, Store::Memory),
        },
        Store::Memory => (None, Store::Memory),
    };
    let turns = found.unwrap_or_else(|| memory_turns(session, false, None));
    let skip = turns.len().saturating_sub(keep);
    (turns.into_iter().skip(skip).collect(), served)
}

/// The session's live turns in this backend's memory; with `only_here`, only those no shared
/// store took, and of those only the ones kept after `since` when given.
fn memory_turns(session: &str, only_here: bool, since: Option<std::time::SystemTime>) -> Vec<Turn> {
    let ttl = std::time::Duration::from_secs(settings::session_ttl_s());
    MEMORY.with_borrow(|m| {
        m.get(&memory_key(session))
            .filter(|r| r.updated.is_some_and(|at| at.elapsed() < ttl))
            .map(|r| {
                r.turns
                    .iter()
                    .filter(|(_, here)| match (here, since) {
                        (Some(at), Some(since)) => *at > since,
                        (Some(_), None) => true,
                        (None, _) => !only_here,
                    })
                    .map(|(turn, _)| turn.clone())
                    .collect()
            })
            .unwrap_or_default()
    })
}

/// Rows of a session read back at most, newest first, to find its live turns (a client that
/// asks the same question over and over may push older turns out of them).
const TABLE_ROWS: i64 = 1000;

/// The session's last `keep` live turns in the table, oldest first: of its newest rows, those
/// since its last reset with no pause over `session_ttl` between them and now, the newest of
/// each question (a retried request counts once). The turns' text is read for those `keep`
/// rows only. With them, when the latest reset among those rows was written. `None` when the
/// table could not be read.
fn table_turns(session: &str, keep: usize) -> Option<(Vec<Turn>, Option<std::time::SystemTime>)> {
    let schema = store::extension_schema().ok()?;
    let sql = format!(
        "WITH recent AS ( \
             SELECT id, at, question IS NULL AS reset, pg_catalog.sha256(pg_catalog.convert_to(question, 'UTF8')) AS asked, \
                    pg_catalog.lag(at) OVER (ORDER BY id DESC) AS newer_at \
             FROM (SELECT id, at, question FROM {schema}.nl_sessions \
                   WHERE role_id = $3 AND session = $1 ORDER BY id DESC LIMIT {TABLE_ROWS}) r \
         ), live AS ( \
             SELECT id, asked FROM recent \
             WHERE NOT reset AND id > COALESCE((SELECT max(id) FROM recent \
                 WHERE reset OR COALESCE(newer_at, pg_catalog.now()) - at \
                                > pg_catalog.make_interval(secs => $2)), 0) \
         ), kept AS ( \
             SELECT id FROM (SELECT DISTINCT ON (asked) id FROM live ORDER BY asked, id DESC) d \
             ORDER BY id DESC LIMIT $4 \
         ) \
         SELECT s.id, s.question, s.sql, f.reset FROM \
             (SELECT (SELECT pg_catalog.date_part('epoch', at) FROM recent \
                      WHERE reset ORDER BY id DESC LIMIT 1) AS reset) f \
         LEFT JOIN {schema}.nl_sessions s \
             ON s.role_id = $3 AND s.session = $1 AND s.id IN (SELECT id FROM kept) \
         ORDER BY s.id"
    );
    let ttl = settings::session_ttl_s() as f64;
    store::read_best_effort("the conversation", |client| {
        let rows = client.select(
            &sql,
            None,
            &[
                session.into(),
                ttl.into(),
                role_id().into(),
                (keep as i64).into(),
            ],
        )?;
        let (mut turns, mut reset) = (Vec::new(), None);
        for row in rows {
            reset = reset.or(row.get::<f64>(4)?);
            if row.get::<i64>(1)?.is_none() {
                continue;
            }
            turns.push(Turn {
                question: row.get::<String>(2)?.unwrap_or_default(),
                sql: row.get::<String>(3)?.unwrap_or_default(),
            });
        }
        // A reset's time, as the server's clock wrote it (nl_row_role): this machine's. One
        // that is no time (a restored row dated before 1970, or infinity) ends every turn kept
        // here until now.
        let reset = reset.map(|seconds| {
            std::time::Duration::try_from_secs_f64(seconds)
                .ok()
                .and_then(|since| std::time::SystemTime::UNIX_EPOCH.checked_add(since))
                .unwrap_or_else(std::time::SystemTime::now)
        });
        Ok((turns, reset))
    })
}

/// The session's last `keep` turns in Redis, and whether Redis has a list for it.
fn redis_turns(session: &str, keep: usize) -> Option<(Vec<Turn>, bool)> {
    let key = redis_client::key("session", session);
    let stored: Option<Vec<String>> = redis_client::call(move |c| {
        ::redis::cmd("LRANGE")
            .arg(&key)
            .arg(-(keep as i64))
            .arg(-1)
            .query(c)
    });
    stored.map(|stored| {
        let turns = stored
            .iter()
            .filter_map(|t| serde_json::from_str(t).ok())
            .collect();
        (turns, !stored.is_empty())
    })
}

/// Earlier turns a call may carry, at most (`turns jsonb`).
const MAX_REQUEST_TURNS: usize = 1000;
/// Characters of a carried turn's question or SQL, at most.
const MAX_TURN_CHARS: usize = 20_000;
/// Bytes of JSON text of the carried turns, and values in it, at most (read before it is
/// parsed: a thousand turns with room for a few more fields each).
pub const MAX_REQUEST_BYTES: usize = 16 << 20;
pub const MAX_REQUEST_VALUES: usize = 10 * MAX_REQUEST_TURNS;

/// The earlier turns a caller sends with the call (`turns jsonb`, how the gateway passes a chat
/// conversation): an array of `{"question": text, "sql": text or null}`, oldest first, of which
/// the last `session_turns` are kept. They are context for the model and nothing else: their
/// SQL is the client's word, never run, checked or stored. A turn without SQL (an answer that
/// failed) is its question alone.
pub fn from_request(turns: &serde_json::Value) -> Result<Vec<Turn>> {
    let bad = |what: String| Error::InvalidParameter(format!("turns: {what}"));
    let items = turns
        .as_array()
        .ok_or_else(|| bad("not an array of {\"question\": ..., \"sql\": ...} objects".into()))?;
    if items.len() > MAX_REQUEST_TURNS {
        return Err(bad(format!(
            "{} turns; at most {MAX_REQUEST_TURNS} are accepted",
            items.len()
        )));
    }
    let text = |i: usize, item: &serde_json::Value, key: &str| -> Result<Option<String>> {
        match item.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) if s.chars().count() > MAX_TURN_CHARS => Err(bad(
                format!("turns[{i}].{key} is longer than {MAX_TURN_CHARS} characters"),
            )),
            Some(serde_json::Value::String(s)) => Ok(Some(s.trim().to_string())),
            Some(_) => Err(bad(format!("turns[{i}].{key} is not a string"))),
        }
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        if !item.is_object() {
            return Err(bad(format!("turns[{i}] is not an object")));
        }
        let question = text(i, item, "question")?
            .filter(|q| !q.is_empty())
            .ok_or_else(|| bad(format!("turns[{i}] has no question")))?;
        let sql = text(i, item, "sql")?.unwrap_or_default();
        out.push(Turn { question, sql });
    }
    let skip = out.len().saturating_sub(settings::session_turns());
    Ok(out.split_off(skip))
}

/// Adds a turn to `session` in this transaction's store (and in backend memory, which bridges
/// a Redis outage); returns the store that kept it. An earlier turn with the same question is
/// dropped: a request retried after a failure (a gateway or server lost mid-call, which may
/// have recorded the turn already) is kept once, instead of pushing older turns out of the
/// last `session_turns`.
pub fn record(session: &str, turn: Turn) -> Store {
    let keep = settings::session_turns().max(1);
    let store = store();
    let stored = match store {
        Store::Table => record_in_table(session, &turn),
        Store::Redis => record_in_redis(session, &turn, keep),
        Store::Memory => false,
    };
    // Memory bridges a Redis outage too: it remembers what Redis took.
    let kept = (store != Store::Table || !stored) && remember(session, turn, !stored, keep);
    if !kept && !stored {
        crate::error::notice(format!(
            "sql_query_engine: this turn of session {} is not remembered: no store took it, and \
             this connection's memory has no room for it",
            crate::text::escaped_line(&crate::text::at_most(session, MAX_NAME_BYTES))
        ));
    }
    if stored {
        store
    } else {
        Store::Memory
    }
}

/// Adds `turn` (`here`: kept only here) to `session` in backend memory, the newest `keep`
/// turns; whether it was kept (`make_room`).
fn remember(session: &str, turn: Turn, here: bool, keep: usize) -> bool {
    MEMORY.with_borrow_mut(|m| {
        let key = memory_key(session);
        let ttl = std::time::Duration::from_secs(settings::session_ttl_s());
        forget_expired(m);
        let mut turns = match m.get(&key) {
            Some(r) if r.updated.is_some_and(|at| at.elapsed() < ttl) => r.turns.clone(),
            _ => VecDeque::new(),
        };
        turns.retain(|(t, _)| t.question != turn.question);
        turns.push_back((turn, here.then(std::time::SystemTime::now)));
        while turns.len() > keep {
            turns.pop_front();
        }
        if !make_room(m, &key, &mut turns) {
            return false;
        }
        let now = std::time::Instant::now();
        m.insert(
            key,
            Remembered {
                turns,
                updated: Some(now),
                expires: now.checked_add(ttl),
            },
        );
        true
    })
}

/// Whether the table has live turns of `session` of the caller's (read in any transaction).
fn in_table(session: &str) -> bool {
    table_turns(session, 1).is_some_and(|(turns, _)| !turns.is_empty())
}

/// Forgets the sessions that expired, each by the `session_ttl` of the role that wrote it.
fn forget_expired(memory: &mut HashMap<(u32, String), Remembered>) {
    let now = std::time::Instant::now();
    memory.retain(|_, r| r.expires.is_some_and(|at| now < at));
}

/// Makes room in backend memory for `current` to hold `turns`, within the bounds of all
/// (`MAX_MEMORY_SESSIONS` sessions, `MAX_MEMORY_BYTES`) and of the calling role's share of them
/// (`ROLE_SHARE`), from the calling role's own: its other sessions go first, least recently
/// used first, then the oldest of `turns`. Never another role's, and nothing is forgotten
/// before it is known to be enough: when the other roles leave no room, `false`, and memory
/// (`current` and the caller's other sessions) stays as it was.
fn make_room(
    memory: &mut HashMap<(u32, String), Remembered>,
    current: &(u32, String),
    turns: &mut VecDeque<(Turn, Option<std::time::SystemTime>)>,
) -> bool {
    let weight = |turns: &VecDeque<(Turn, Option<std::time::SystemTime>)>| -> usize {
        turns.iter().map(|(t, _)| t.bytes()).sum()
    };
    // The caller's other sessions, least recently used first, and what the other roles hold.
    let mut own: Vec<(&(u32, String), &Remembered)> = memory
        .iter()
        .filter(|(key, _)| key.0 == current.0 && *key != current)
        .collect();
    own.sort_by_key(|(_, r)| r.updated);
    let own: Vec<((u32, String), usize)> = own
        .into_iter()
        .map(|(key, r)| (key.clone(), weight(&r.turns)))
        .collect();
    let (others_sessions, others_bytes) = memory
        .iter()
        .filter(|(key, _)| key.0 != current.0)
        .fold((0usize, 0usize), |(n, b), (_, r)| {
            (n + 1, b + weight(&r.turns))
        });
    // The plan: forget the first `forget` of `own` and the first `cut` of `turns`.
    let (mut forget, mut cut) = (0, 0);
    let mut own_bytes: usize = own.iter().map(|(_, bytes)| bytes).sum();
    let mut held = weight(turns);
    loop {
        // `current` counts as one session, new or not.
        let own_sessions = own.len() - forget + 1;
        let fits = own_sessions <= MAX_MEMORY_SESSIONS / ROLE_SHARE
            && others_sessions + own_sessions <= MAX_MEMORY_SESSIONS
            && own_bytes + held <= MAX_MEMORY_BYTES / ROLE_SHARE
            && others_bytes + own_bytes + held <= MAX_MEMORY_BYTES;
        if fits {
            break;
        }
        if let Some((_, bytes)) = own.get(forget) {
            own_bytes -= bytes;
            forget += 1;
        } else if turns.len() - cut > 1 {
            held -= turns[cut].0.bytes();
            cut += 1;
        } else {
            return false;
        }
    }
    for (key, _) in &own[..forget] {
        memory.remove(key);
    }
    turns.drain(..cut);
    true
}

/// Appends the turn to the session (a row of its own: concurrent turns lose none, and an
/// earlier turn of the same question is left out when the turns are read), in a
/// subtransaction that never makes the answer fail.
fn record_in_table(session: &str, turn: &Turn) -> bool {
    let Ok(schema) = store::extension_schema() else {
        return false;
    };
    let insert = format!(
        "INSERT INTO {schema}.nl_sessions (session, question, sql, role_id) VALUES ($1, $2, $3, $4)"
    );
    store::write_best_effort("the session", |client| {
        client.update(
            &insert,
            None,
            &[
                session.into(),
                turn.question.as_str().into(),
                turn.sql.as_str().into(),
                role_id().into(),
            ],
        )?;
        Ok(())
    })
    .is_some()
}

/// Drops the session's earlier turns with the new turn's question, appends it, keeps the last
/// ARGV[3] and renews the expiry (ARGV[4] seconds): one script, so that concurrent turns of a
/// session are applied one after the other and none is lost. First it pays, from the role's
/// share of Redis for turns (KEYS[2]: ARGV[5] bytes in windows of ARGV[6] seconds), for what
/// the write keeps there: every turn the session keeps (a turn renews the expiry of all), once
/// for each window they live. So what a role holds in Redis at once is bounded by its share,
/// however long `session_ttl` is, and a small turn does not keep large ones alive for free.
/// Returns -1 when the share is spent (nothing written; a spent share is seen before the
/// session's turns are read).
const RECORD_SCRIPT: &str = r"
if tonumber(redis.call('GET', KEYS[2]) or '0') >= tonumber(ARGV[5]) then
    return -1
end
local kept, dropped = {}, {}
for _, item in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
    local ok, turn = pcall(cjson.decode, item)
    if ok and type(turn) == 'table' and turn.question == ARGV[2] then
        table.insert(dropped, item)
    else
        table.insert(kept, item)
    end
end
table.insert(kept, ARGV[1])
local bytes = #KEYS[1]
for i = math.max(1, #kept - tonumber(ARGV[3]) + 1), #kept do
    bytes = bytes + #kept[i]
end
local windows = math.max(1, math.ceil(tonumber(ARGV[4]) / tonumber(ARGV[6])))
local spent = redis.call('INCRBY', KEYS[2], bytes * windows)
if redis.call('TTL', KEYS[2]) < 0 then
    redis.call('EXPIRE', KEYS[2], ARGV[6])
end
if spent > tonumber(ARGV[5]) then
    return -1
end
for _, item in ipairs(dropped) do
    redis.call('LREM', KEYS[1], 0, item)
end
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], -tonumber(ARGV[3]), -1)
redis.call('EXPIRE', KEYS[1], ARGV[4])
return redis.call('LLEN', KEYS[1])
";

fn record_in_redis(session: &str, turn: &Turn, keep: usize) -> bool {
    let key = redis_client::key("session", session);
    let budget = redis_client::budget_key(redis_client::Share::Turns);
    let ttl = settings::session_ttl_s();
    let Ok(json) = serde_json::to_string(turn) else {
        return false;
    };
    // As nl_sessions takes them (its CHECKs).
    if turn.question.len() > MAX_QUESTION_BYTES || turn.sql.len() > MAX_SQL_BYTES {
        return false;
    }
    let question = turn.question.clone();
    let done: Option<i64> = redis_client::call(move |c| {
        ::redis::cmd("EVAL")
            .arg(RECORD_SCRIPT)
            .arg(2)
            .arg(&key)
            .arg(&budget)
            .arg(json)
            .arg(question)
            .arg(keep.max(1))
            .arg(ttl)
            .arg(redis_client::BUDGET_BYTES)
            .arg(redis_client::BUDGET_WINDOW_S)
            .query(c)
    });
    match done {
        Some(-1) => {
            crate::error::notice(format!(
                "sql_query_engine: this turn of session {} is kept in this connection's memory \
                 only: your role's share of Redis for turns ({}) is spent",
                crate::text::escaped_line(&crate::text::at_most(session, MAX_NAME_BYTES)),
                redis_client::SHARE
            ));
            false
        }
        done => done.is_some(),
    }
}

/// The newest of `turns` (oldest first) whose questions and SQL take at most `max_chars`
/// together: what a conversation adds to each of a call's model requests is bounded like its
/// schema (`prompt_budget`), however many turns the caller sends or keeps. A newest turn
/// longer than that alone is cut.
pub fn within(turns: Vec<Turn>, max_chars: usize) -> Vec<Turn> {
    let mut kept = Vec::new();
    let mut left = max_chars;
    for mut turn in turns.into_iter().rev() {
        let size = turn.question.chars().count() + turn.sql.chars().count();
        if size <= left {
            left -= size;
            kept.push(turn);
            continue;
        }
        if kept.is_empty() && left > 0 {
            turn.question = turn.question.chars().take(left / 2).collect();
            let rest = left - turn.question.chars().count();
            turn.sql = turn.sql.chars().take(rest).collect();
            kept.push(turn);
        }
        break;
    }
    kept.reverse();
    kept
}

/// Longest session name, in bytes: a name is part of a Redis key, a table row and a memory key.
const MAX_NAME_BYTES: usize = 256;

/// A turn's question and SQL stored in Redis, in bytes at most, as nl_sessions' CHECKs take
/// them: every backend that serves the session reads them back.
const MAX_QUESTION_BYTES: usize = 40_000;
const MAX_SQL_BYTES: usize = 100_000;

/// Refuses a session name longer than `MAX_NAME_BYTES` (22023).
pub fn check_name(session: &str) -> crate::error::Result<()> {
    if session.len() > MAX_NAME_BYTES {
        return Err(crate::error::Error::InvalidParameter(format!(
            "a session name is at most {MAX_NAME_BYTES} bytes"
        )));
    }
    Ok(())
}

/// Forgets `session`, in every store this backend can reach; a store that could not be reached
/// is named in a WARNING (its turns are still there: reset again once it answers).
pub fn reset(session: &str) {
    let mut kept = Vec::new();
    if !store::writable() && !redis_client::configured() && in_table(session) {
        // The next call that can write reads them from the table again.
        kept.push("the nl_sessions table (this transaction cannot write)");
    }
    if store::writable() {
        if let Ok(schema) = store::extension_schema() {
            // A row without a question: the turns before it are no longer the session's.
            let sql = format!(
                "INSERT INTO {schema}.nl_sessions (session, question, role_id) \
                 VALUES ($1, NULL, $2)"
            );
            let done = store::write_best_effort("the session reset", |client| {
                client
                    .update(&sql, None, &[session.into(), role_id().into()])
                    .map(|_| ())
            });
            if done.is_none() {
                kept.push("the nl_sessions table");
            }
        }
    }
    if redis_client::configured() {
        // Other backends keep copies of the turns Redis had, which they use only while Redis
        // is away, never once it has no list (see `turns`).
        let key = redis_client::key("session", session);
        let done: Option<()> = redis_client::call(move |c| ::redis::cmd("DEL").arg(&key).query(c));
        if done.is_none() {
            kept.push("Redis");
        }
    }
    MEMORY.with_borrow_mut(|m| m.remove(&memory_key(session)));
    if !kept.is_empty() {
        crate::error::warning(format!(
            "sql_query_engine: session {} was not forgotten in {}, which did not answer: \
             call nl_session_reset again once it does",
            crate::text::quoted_field(session),
            kept.join(" and ")
        ));
    }
}

static mut PREVIOUS_UTILITY_HOOK: pg_sys::ProcessUtility_hook_type = None;

// PostgreSQL's own utility processing, declared here rather than taken from pgrx's bindings:
// pgrx wraps each binding so that an ERROR it raises becomes a copy that keeps only some of the
// error's fields (see `on_utility`).
// SAFETY: the signature of tcop/utility.h, the same in every supported server.
unsafe extern "C-unwind" {
    #[link_name = "standard_ProcessUtility"]
    fn standard_process_utility(
        statement: *mut pg_sys::PlannedStmt,
        query: *const std::ffi::c_char,
        read_only_tree: bool,
        context: pg_sys::ProcessUtilityContext::Type,
        params: pg_sys::ParamListInfo,
        environment: *mut pg_sys::QueryEnvironment,
        dest: *mut pg_sys::DestReceiver,
        completion: *mut pg_sys::QueryCompletion,
    );
}

/// Every utility statement of the backend (DDL, `CALL`, `DO`, `COPY`, ...) passes here; only
/// `DISCARD ALL` concerns the extension, and `RESET ALL` in a query it runs (refused). Not `#[pg_guard]`, and calling the next hook without
/// pgrx's wrapper: an ERROR of the statement must reach the client as PostgreSQL raised it, and
/// pgrx's guard would re-raise a copy without its position, CONTEXT, table and column names, and
/// with XX000 for a SQLSTATE pgrx does not know (a procedure's own `ERRCODE`). The ERROR
/// long-jumps past this frame, which holds nothing to drop by then.
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn on_utility(
    statement: *mut pg_sys::PlannedStmt,
    query: *const std::ffi::c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    environment: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    completion: *mut pg_sys::QueryCompletion,
) {
    // The previous hook was stored once, in `init`; the statement is still its caller's after.
    // SAFETY: the statement PostgreSQL passed; the previous hook or PostgreSQL's own, with
    // exactly what PostgreSQL gave this one.
    unsafe {
        crate::exec::refuse_backend_changes(statement);
        match PREVIOUS_UTILITY_HOOK {
            Some(previous) => previous(
                statement,
                query,
                read_only_tree,
                context,
                params,
                environment,
                dest,
                completion,
            ),
            None => standard_process_utility(
                statement,
                query,
                read_only_tree,
                context,
                params,
                environment,
                dest,
                completion,
            ),
        }
        // Reached only when the statement succeeded: a DISCARD ALL that fails (in a
        // transaction block) forgets nothing.
        forget_on_discard_all(statement);
    }
}

/// `DISCARD ALL` (what poolers send between clients) forgets the sessions in backend memory.
#[pg_guard]
unsafe extern "C-unwind" fn forget_on_discard_all(statement: *mut pg_sys::PlannedStmt) {
    // SAFETY: PostgreSQL passes a planned utility statement; a node is read as the struct its
    // tag names.
    let discard_all = unsafe {
        let node = (*statement).utilityStmt;
        !node.is_null()
            && (*node).type_ == pg_sys::NodeTag::T_DiscardStmt
            && (*node.cast::<pg_sys::DiscardStmt>()).target == pg_sys::DiscardMode::DISCARD_ALL
    };
    if discard_all {
        MEMORY.with(|m| {
            if let Ok(mut m) = m.try_borrow_mut() {
                m.clear();
            }
        });
    }
}

/// Called from `_PG_init`.
pub fn init() {
    // SAFETY: `_PG_init` runs once per backend, before any statement: the hook is chained.
    unsafe {
        PREVIOUS_UTILITY_HOOK = pg_sys::ProcessUtility_hook;
        pg_sys::ProcessUtility_hook = Some(on_utility);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(question: &str, sql: &str) -> Turn {
        Turn {
            question: question.to_string(),
            sql: sql.to_string(),
        }
    }

    #[test]
    fn a_session_expires_by_the_ttl_of_the_role_that_wrote_it() {
        let at = std::time::Instant::now();
        let remembered = |expires: Option<std::time::Instant>| Remembered {
            turns: VecDeque::new(),
            updated: Some(at),
            expires,
        };
        // What another role's lower session_ttl says does not count.
        let mut memory = HashMap::from([
            (
                (2, "live".to_string()),
                remembered(at.checked_add(std::time::Duration::from_secs(3600))),
            ),
            ((2, "gone".to_string()), remembered(Some(at))),
        ]);
        forget_expired(&mut memory);
        assert_eq!(
            memory.keys().cloned().collect::<Vec<_>>(),
            [(2, "live".to_string())]
        );
    }

    #[test]
    fn the_newest_turns_that_fit_are_kept_and_a_huge_last_one_is_cut() {
        let turns = vec![
            turn("aaaa", "1111"),
            turn("bbbb", "2222"),
            turn("cccc", "3333"),
        ];
        let kept = within(turns.clone(), 16);
        assert_eq!(kept, turns[1..].to_vec(), "the oldest goes first");
        assert_eq!(within(turns.clone(), 100), turns);
        let huge = vec![turn("q".repeat(50).as_str(), &"s".repeat(50))];
        let cut = within(huge, 20);
        assert_eq!(cut[0].question.len() + cut[0].sql.len(), 20);
        assert!(within(turns, 0).is_empty());
    }

    #[test]
    fn backend_memory_makes_room_from_the_callers_own_sessions_then_its_own_old_turns() {
        let now = std::time::Instant::now();
        // A quarter of a role's share.
        let big = |q: &str| turn(q, &"s".repeat(MAX_MEMORY_BYTES / ROLE_SHARE / 4));
        let session = |turns: Vec<Turn>, ago: u64| Remembered {
            turns: turns.into_iter().map(|t| (t, None)).collect(),
            updated: now.checked_sub(std::time::Duration::from_secs(ago)),
            expires: now.checked_add(std::time::Duration::from_secs(3600)),
        };
        let queue = |turns: Vec<Turn>| -> VecDeque<(Turn, Option<std::time::SystemTime>)> {
            turns.into_iter().map(|t| (t, None)).collect()
        };
        let key = |role: u32, name: &str| (role, name.to_string());
        let names = |memory: &HashMap<(u32, String), Remembered>| {
            let mut names: Vec<(u32, String)> = memory.keys().cloned().collect();
            names.sort();
            names
        };
        // The caller's least recently used sessions go first, never another role's, even an
        // older one.
        let mut memory = HashMap::from([
            (key(11, "theirs"), session(vec![big("x")], 100)),
            (key(10, "old"), session(vec![big("a"), big("b")], 60)),
            (key(10, "recent"), session(vec![big("c")], 10)),
        ]);
        let mut turns = queue(vec![big("d"), big("e")]);
        assert!(make_room(&mut memory, &key(10, "now"), &mut turns));
        assert_eq!(names(&memory), [key(10, "recent"), key(11, "theirs")]);
        assert_eq!(turns.len(), 2);
        // One session alone over the role's share keeps its newest turns.
        let mut memory = HashMap::new();
        let mut turns = queue(vec![big("a"), big("b"), big("c"), big("d"), big("e")]);
        assert!(make_room(&mut memory, &key(10, "now"), &mut turns));
        let questions: Vec<&str> = turns.iter().map(|(t, _)| t.question.as_str()).collect();
        assert_eq!(questions, ["c", "d", "e"]);
        // A role holds at most its share of the sessions: a new one forgets its oldest.
        let mut memory: HashMap<(u32, String), Remembered> = (0..MAX_MEMORY_SESSIONS / ROLE_SHARE)
            .map(|i| {
                (
                    key(10, &format!("s{i:03}")),
                    session(vec![], 100 - i as u64),
                )
            })
            .collect();
        let mut turns = queue(vec![turn("q", "")]);
        assert!(make_room(&mut memory, &key(10, "now"), &mut turns));
        assert_eq!(memory.len(), MAX_MEMORY_SESSIONS / ROLE_SHARE - 1);
        assert!(!memory.contains_key(&key(10, "s000")));
        // When the other roles leave no room, the turn is not kept, and nothing of the
        // caller's is forgotten for it: neither the session nor its other sessions.
        let mut memory: HashMap<(u32, String), Remembered> = (0..ROLE_SHARE as u32)
            .map(|role| (key(20 + role, "full"), session(vec![big("x"); 4], 50)))
            .collect();
        memory.insert(key(10, "other"), session(vec![turn("o", "")], 40));
        memory.insert(key(10, "now"), session(vec![turn("a", "")], 0));
        let before = names(&memory);
        let mut turns = queue(vec![turn("a", ""), big("b")]);
        assert!(!make_room(&mut memory, &key(10, "now"), &mut turns));
        assert_eq!(names(&memory), before);
        assert_eq!(memory[&key(10, "now")].turns.len(), 1);
        // Nor can one role alone leave another none: its share is an eighth.
        let mut memory = HashMap::new();
        for i in 0..MAX_MEMORY_SESSIONS {
            let mut turns = queue(vec![big(&format!("q{i}"))]);
            if make_room(&mut memory, &key(30, &format!("s{i}")), &mut turns) {
                memory.insert(
                    key(30, &format!("s{i}")),
                    session(turns.into_iter().map(|(t, _)| t).collect(), 0),
                );
            }
        }
        let mut turns = queue(vec![big("mine")]);
        assert!(make_room(&mut memory, &key(10, "now"), &mut turns));
        assert_eq!(turns.len(), 1);
    }
}
