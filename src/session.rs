//! Conversations: the earlier turns of a session (question and the SQL that finally answered
//! it), so that "now only 2024" means something. Kept in backend memory, and in Redis when it
//! is configured, so that a pool of connections shares the conversation; Redis keys are
//! namespaced by database and role, and expire after `sql_query_engine.session_ttl`.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::{redis_client, settings};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Turn {
    pub question: String,
    pub sql: String,
}

thread_local! {
    /// Backend memory: (role, session) -> turns, oldest first.
    static MEMORY: RefCell<HashMap<(u32, String), VecDeque<Turn>>> = RefCell::new(HashMap::new());
}

fn memory_key(session: &str) -> (u32, String) {
    (
        unsafe { pgrx::pg_sys::GetUserId() }.to_u32(),
        session.to_string(),
    )
}

/// The last `session_turns` turns of `session`, oldest first.
pub fn turns(session: &str) -> Vec<Turn> {
    let keep = settings::session_turns();
    if keep == 0 {
        return Vec::new();
    }
    if redis_client::configured() {
        let key = redis_client::key("session", session);
        let stored: Option<Vec<String>> = redis_client::call(move |c| {
            ::redis::cmd("LRANGE")
                .arg(&key)
                .arg(-(keep as i64))
                .arg(-1)
                .query(c)
        });
        // An empty list after a Redis restart: this backend's memory still knows its turns.
        if let Some(stored) = stored.filter(|s| !s.is_empty()) {
            return stored
                .iter()
                .filter_map(|t| serde_json::from_str(t).ok())
                .collect();
        }
    }
    MEMORY.with_borrow(|m| {
        m.get(&memory_key(session))
            .map(|turns| {
                turns
                    .iter()
                    .skip(turns.len().saturating_sub(keep))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    })
}

/// Adds a turn to `session`, in memory and, when configured, in Redis.
pub fn record(session: &str, turn: Turn) {
    let keep = settings::session_turns().max(1);
    if redis_client::configured() {
        let key = redis_client::key("session", session);
        let ttl = settings::session_ttl_s();
        let json = serde_json::to_string(&turn).unwrap_or_default();
        let _: Option<()> = redis_client::call(move |c| {
            ::redis::pipe()
                .cmd("RPUSH")
                .arg(&key)
                .arg(json)
                .ignore()
                .cmd("LTRIM")
                .arg(&key)
                .arg(-(keep as i64))
                .arg(-1)
                .ignore()
                .cmd("EXPIRE")
                .arg(&key)
                .arg(ttl)
                .ignore()
                .query(c)
        });
    }
    MEMORY.with_borrow_mut(|m| {
        let turns = m.entry(memory_key(session)).or_default();
        turns.push_back(turn);
        while turns.len() > keep {
            turns.pop_front();
        }
    });
}

/// Forgets `session`, in memory and in Redis.
pub fn reset(session: &str) {
    if redis_client::configured() {
        let key = redis_client::key("session", session);
        let _: Option<()> = redis_client::call(move |c| ::redis::cmd("DEL").arg(&key).query(c));
    }
    MEMORY.with_borrow_mut(|m| m.remove(&memory_key(session)));
}
