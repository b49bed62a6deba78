//! Session-level advisory locks: the one thing that code run inside the sandbox can take and
//! the rollback of its subtransaction leaves behind. A view's, a policy's or an index
//! predicate's function that calls `pg_advisory_lock` runs as the caller, where the guard sees
//! no such call in the query's text; left held, its lock would outlive the call on the caller's
//! connection (on a pooler's or the gateway's, for whoever is handed it next) and block every
//! session that asks for it. So the sandbox counts the session-level holds of each advisory
//! lock the session has before a query, and gives back, after, every hold taken since.
//!
//! The lock manager's table (`pg_locks`) shows which locks a backend holds, not at which level
//! nor how many times: a lock the caller holds for its transaction and the query's code takes
//! again for the session looks the same before and after. The holds are counted instead (see
//! `session_holds`).

use pgrx::pg_sys;

use crate::subxact;

/// One advisory lock this backend holds, in one mode.
#[derive(Clone, Copy)]
struct Held {
    tag: pg_sys::LOCKTAG,
    mode: pg_sys::LOCKMODE,
}

impl Held {
    /// What tells one held lock from another (the tag's fields and the mode).
    fn key(&self) -> (u32, u32, u32, u16, u8, u8, pg_sys::LOCKMODE) {
        let t = &self.tag;
        (
            t.locktag_field1,
            t.locktag_field2,
            t.locktag_field3,
            t.locktag_field4,
            t.locktag_type,
            t.locktag_lockmethodid,
            self.mode,
        )
    }
}

/// The session-level holds of the advisory locks the session has when it starts; dropping it
/// gives back those taken since (the sandbox drops it once the query's subtransaction is
/// rolled back, which has released every transaction-level hold taken inside).
#[must_use = "the locks taken meanwhile are released when this is dropped"]
pub struct Watch {
    before: Vec<(Held, u64)>,
}

/// Session-level holds of advisory locks, and advisory locks, that a call may start with:
/// each hold is counted by giving it back and taking it again, and each lock anchored, before
/// and after every query, without a pause for an interrupt (stopping halfway would change the
/// session's locks). Bounded in all, not per lock: a thousand locks of ten thousand holds each
/// would keep the backend from a cancel for minutes at every query.
const MAX_HOLDS: u64 = 10_000;
const MAX_LOCKS: usize = 1_000;

impl Watch {
    /// Counts the holds the session has; raises 54000 when it holds more than `MAX_LOCKS`
    /// advisory locks, or them more than `MAX_HOLDS` times in all at session level (the count
    /// is stopped there and the holds given back are taken again).
    pub fn start() -> Watch {
        let locks = held();
        let too_many = |what: String| {
            crate::error::Error::sql(
                "54000",
                what,
                Some("Give them back (pg_advisory_unlock_all()) before asking."),
            )
            .raise()
        };
        if locks.len() > MAX_LOCKS {
            too_many(format!(
                "the session holds more than {MAX_LOCKS} advisory locks"
            ));
        }
        let before = counted(locks, MAX_HOLDS + 1);
        if before.iter().map(|(_, holds)| holds).sum::<u64>() > MAX_HOLDS {
            too_many(format!(
                "the session holds advisory locks more than {MAX_HOLDS} times at session level"
            ));
        }
        Watch { before }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        // Also while an error unwinds (one raised after the query's rollback, a cancel taken
        // at a WARNING): the locks must not outlive the call. An ERROR raised here then would
        // abort the backend, so it is caught, and logged.
        if std::thread::panicking() {
            pgrx::PgTryBuilder::new(std::panic::AssertUnwindSafe(|| self.give_back()))
                .catch_others(|caught| {
                    subxact::log_while_unwinding(format!(
                        "sql_query_engine: session-level advisory locks a query's code took \
                         could not be given back: {caught:?}"
                    ))
                })
                .execute();
        } else {
            self.give_back();
        }
    }
}

impl Watch {
    /// Gives back the session holds the query's code took, and logs what it did.
    fn give_back(&self) {
        let before = |lock: &Held| {
            self.before
                .iter()
                .find(|(b, _)| b.key() == lock.key())
                .map_or(0, |(_, holds)| *holds)
        };
        // Every lock is anchored for the transaction (so no other backend takes it meanwhile),
        // its session holds counted up to one past what the session had before, all of them
        // given back at once, and as many as the session had before taken again: the work is
        // bounded by the locks and the holds of before (`MAX_HOLDS`), not by what the query's
        // code took, which may be any number of holds of one lock in its run time.
        let kept: Vec<(Held, u64, u64)> = subxact::without_messages(|| {
            let locks = held();
            // The anchors are held under the current resource owner and given back below, and
            // `LockReleaseSession` gives back the session-level holds of advisory locks only
            // (the user lock method's).
            // SAFETY: tags and modes the lock manager reported for this backend, as above.
            unsafe {
                for lock in &locks {
                    pg_sys::LockAcquire(&lock.tag, lock.mode, false, true);
                }
                let counted: Vec<(Held, u64, u64)> = locks
                    .iter()
                    .map(|lock| {
                        let had = before(lock);
                        let holds = session_holds(lock, had.saturating_add(1));
                        (*lock, holds, holds.min(had))
                    })
                    .collect();
                pg_sys::LockReleaseSession(pg_sys::USER_LOCKMETHOD as pg_sys::LOCKMETHODID);
                for (lock, _, kept) in &counted {
                    for _ in 0..*kept {
                        pg_sys::LockAcquire(&lock.tag, lock.mode, true, true);
                    }
                }
                for lock in &locks {
                    pg_sys::LockRelease(&lock.tag, lock.mode, false);
                }
                counted
            }
        });
        let released = kept.iter().filter(|(_, holds, kept)| holds > kept).count();
        let lost: u64 = self
            .before
            .iter()
            .map(|(lock, holds)| {
                let now = kept
                    .iter()
                    .find(|(n, _, _)| n.key() == lock.key())
                    .map_or(0, |(_, _, k)| *k);
                holds.saturating_sub(now)
            })
            .sum();
        if released > 0 {
            crate::error::log(format!(
                "sql_query_engine: gave back the session-level holds of {released} advisory \
                 lock(s) that code run by a query took (a function of a view, a policy or an \
                 index of what it read)"
            ));
        }
        if lost > 0 {
            crate::error::log(format!(
                "sql_query_engine: code that a query ran released {lost} session-level hold(s) of \
                 advisory locks the session held before"
            ));
        }
    }
}

/// Each lock with its session-level holds, counted with messages off (see `session_holds`),
/// up to `cap` in all (the locks after are counted as none).
fn counted(locks: Vec<Held>, cap: u64) -> Vec<(Held, u64)> {
    if locks.is_empty() {
        return Vec::new();
    }
    let mut left = cap;
    subxact::without_messages(|| {
        locks
            .into_iter()
            .map(|lock| {
                let holds = session_holds(&lock, left);
                left -= holds;
                (lock, holds)
            })
            .collect()
    })
}

/// How many session-level holds this backend has of `lock` (which it holds at some level).
/// PostgreSQL tells only whether a lock is held; so a hold for the current transaction is taken
/// as an anchor (granted at once: the lock is already held), the session-level holds are given
/// back one by one and counted until there is none (the lock stays held by the anchor, so no
/// other backend can take it meanwhile), taken again as many times, and the anchor is given
/// back: the lock ends as it was. The last release finds no session-level hold and warns
/// "you don't own a lock": `counted` turns messages off meanwhile. Stops at `cap` holds.
fn session_holds(lock: &Held, cap: u64) -> u64 {
    let mut holds = 0u64;
    // The anchor is held under the current resource owner (inside the caller's transaction)
    // and given back below; every session-level hold given back is taken again.
    // SAFETY: a tag and mode the lock manager reported for this backend.
    unsafe {
        pg_sys::LockAcquire(&lock.tag, lock.mode, false, true);
        while holds < cap && pg_sys::LockRelease(&lock.tag, lock.mode, true) {
            holds += 1;
        }
        for _ in 0..holds {
            pg_sys::LockAcquire(&lock.tag, lock.mode, true, true);
        }
        pg_sys::LockRelease(&lock.tag, lock.mode, false);
    }
    holds
}

/// The advisory locks this backend holds, each in each mode it holds it.
fn held() -> Vec<Held> {
    let mut held = Vec::new();
    // SAFETY: GetLockStatusData returns a palloc'd snapshot of the lock table (`nelements`
    // entries), read here and freed; only this backend's advisory locks are kept.
    unsafe {
        let data = pg_sys::GetLockStatusData();
        if data.is_null() {
            return held;
        }
        let count = usize::try_from((*data).nelements).unwrap_or(0);
        let locks = (*data).locks;
        if !locks.is_null() {
            for lock in std::slice::from_raw_parts(locks, count) {
                if lock.pid != pg_sys::MyProcPid
                    || lock.locktag.locktag_type != pg_sys::LockTagType::LOCKTAG_ADVISORY as u8
                {
                    continue;
                }
                for mode in 1..=pg_sys::MaxLockMode as pg_sys::LOCKMODE {
                    if lock.holdMask & (1 << mode) != 0 {
                        held.push(Held {
                            tag: lock.locktag,
                            mode,
                        });
                    }
                }
            }
            pg_sys::pfree(locks.cast());
        }
        pg_sys::pfree(data.cast());
    }
    held
}
