//! The circuit breaker: an endpoint that failed is skipped for `llm_circuit_breaker`, so that a
//! dead provider does not cost every question its timeout.
//!
//! With the library preloaded (`shared_preload_libraries`), failures that are the endpoint's own
//! (`Error::Llm::down`: unreachable, 429 or 5xx, not a completion), confirmed by a request no
//! role shapes (`OpenAiClient::probe`), are kept in shared memory, so
//! that every backend of the server, a new one too, skips a dead endpoint. What a role could
//! cause with its own request (another 4xx, no answer in time: how long a model takes is the
//! request's to shape) stays in its own backend, for that role. An endpoint is known by its
//! URL, model and key (`OpenAiClient::identity`). Only the time of a failure is
//! shared: each backend skips for its own `llm_circuit_breaker`, so a role's longer setting keeps
//! no one else away.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgLwLock};

/// Endpoints the shared memory remembers at most (the oldest failure makes way).
const SLOTS: usize = 32;
/// Failures a backend remembers of its own at most, over its roles and endpoints.
const MAX_LOCAL: usize = 1024;

/// Recent failures: (the endpoint's hash, when it failed in ms of the monotonic clock); a
/// zero time is an empty slot.
#[derive(Copy, Clone, Default)]
struct Failures {
    slots: [(u64, u64); SLOTS],
}

// SAFETY: plain integers, no pointers: the same value means the same in every process.
unsafe impl PGRXSharedMemory for Failures {}

// SAFETY: the name is this extension's own, used for nothing else.
static SHARED: PgLwLock<Failures> = unsafe { PgLwLock::new(c"sql_query_engine circuit breaker") };

/// Whether `SHARED` was set up (the library was preloaded, in the postmaster).
static PRELOADED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// This backend's own failures, by role and endpoint: what a role caused (a 4xx to its
    /// request, a timeout under its own setting) keeps only that role away, also where one
    /// backend serves many roles (the gateway's).
    static LOCAL: RefCell<HashMap<(u32, String), u64>> = RefCell::new(HashMap::new());
}

/// The key of `endpoint`'s failures for `role`.
fn local_key(endpoint: &str, role: u32) -> (u32, String) {
    (role, endpoint.to_string())
}

/// Called from `_PG_init`: shared memory only while the postmaster preloads the library.
// pgrx's macro names PostgreSQL versions this crate has no feature for.
#[allow(unexpected_cfgs)]
pub fn init() {
    // SAFETY: reads a flag PostgreSQL sets while it loads shared_preload_libraries.
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        pg_shmem_init!(SHARED);
        PRELOADED.store(true, Ordering::Relaxed);
    }
}

/// Milliseconds of the system's monotonic clock (the same clock in every process), never 0.
fn now_ms() -> u64 {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the time into the struct it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut time) };
    (time.tv_sec as u64)
        .saturating_mul(1000)
        .saturating_add(time.tv_nsec as u64 / 1_000_000)
        .max(1)
}

fn key(endpoint: &str) -> u64 {
    // The same key in every backend (one library): SipHash with fixed keys.
    let mut hasher = std::hash::DefaultHasher::new();
    endpoint.hash(&mut hasher);
    hasher.finish().max(1)
}

/// When `endpoint` last failed, as far as this backend knows (its own failures and the shared
/// ones).
fn failed_at(endpoint: &str, role: u32) -> Option<u64> {
    let local = LOCAL.with_borrow(|l| l.get(&local_key(endpoint, role)).copied());
    let shared = PRELOADED.load(Ordering::Relaxed).then(|| {
        let wanted = key(endpoint);
        SHARED
            .share()
            .slots
            .iter()
            .find(|(k, at)| *k == wanted && *at != 0)
            .map(|(_, at)| *at)
    });
    local.max(shared.flatten())
}

/// Whether `endpoint` failed less than `breaker` ago (for everyone, or for `role`).
pub fn skipped(endpoint: &str, role: u32, breaker: Duration) -> bool {
    failed_at(endpoint, role)
        .is_some_and(|at| now_ms() < at.saturating_add(breaker.as_millis() as u64))
}

/// Notes that `endpoint` failed for `role`; `down` (the endpoint's own failure) tells every
/// backend and role.
pub fn failed(endpoint: &str, role: u32, down: bool) {
    let now = now_ms();
    LOCAL.with_borrow_mut(|l| {
        // Bounded: the roles a backend serves come and go.
        if l.len() >= MAX_LOCAL {
            l.clear();
        }
        l.insert(local_key(endpoint, role), now)
    });
    if down && PRELOADED.load(Ordering::Relaxed) {
        let wanted = key(endpoint);
        let mut failures = SHARED.exclusive();
        let slot = failures
            .slots
            .iter()
            .position(|(k, _)| *k == wanted)
            .or_else(|| failures.slots.iter().position(|(_, at)| *at == 0))
            .or_else(|| (0..SLOTS).min_by_key(|&i| failures.slots[i].1))
            .unwrap_or(0);
        failures.slots[slot] = (wanted, now);
    }
}

/// Notes that `endpoint` answered `role`: it is up again, for every backend.
pub fn answered(endpoint: &str, role: u32) {
    LOCAL.with_borrow_mut(|l| l.remove(&local_key(endpoint, role)));
    if PRELOADED.load(Ordering::Relaxed) {
        let wanted = key(endpoint);
        let known = SHARED
            .share()
            .slots
            .iter()
            .any(|(k, at)| *k == wanted && *at != 0);
        if known {
            let mut failures = SHARED.exclusive();
            for slot in failures.slots.iter_mut().filter(|(k, _)| *k == wanted) {
                *slot = (0, 0);
            }
        }
    }
}
