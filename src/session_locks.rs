//! Session-level advisory locks: the one thing that code run inside the sandbox can take and
//! the rollback of its subtransaction leaves behind. A view's, a policy's or an index
//! predicate's function that calls `pg_advisory_lock` runs as the caller, where the guard sees
//! no such call in the query's text; left held, its lock would outlive the call on the caller's
//! connection (on a pooler's or the gateway's, for whoever is handed it next) and block every
//! session that asks for it. So the sandbox notes the advisory locks the session holds before a
//! query, and gives back, after, every one taken since, as many times as it was taken.

use pgrx::pg_sys;

/// One advisory lock this backend holds, in one mode.
#[derive(Clone, Copy)]
struct Held {
    tag: pg_sys::LOCKTAG,
    mode: pg_sys::LOCKMODE,
}

impl Held {
    fn same(&self, other: &Held) -> bool {
        let (a, b) = (&self.tag, &other.tag);
        self.mode == other.mode
            && (
                a.locktag_field1,
                a.locktag_field2,
                a.locktag_field3,
                a.locktag_field4,
            ) == (
                b.locktag_field1,
                b.locktag_field2,
                b.locktag_field3,
                b.locktag_field4,
            )
            && (a.locktag_type, a.locktag_lockmethodid) == (b.locktag_type, b.locktag_lockmethodid)
    }
}

/// The advisory locks the session holds when it starts; dropping it releases those taken
/// since (the sandbox drops it once the query's subtransaction is rolled back, which has
/// released every transaction-level lock taken inside: what remains new is session-level).
#[must_use = "the locks taken meanwhile are released when this is dropped"]
pub struct Watch {
    before: Vec<Held>,
}

impl Watch {
    pub fn start() -> Watch {
        Watch { before: held() }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        // An ERROR raised here while a panic unwinds would abort the backend; the sandbox
        // catches every error of the query, so it drops the watch in the normal course.
        if std::thread::panicking() {
            return;
        }
        let now = held();
        let taken: Vec<&Held> = now
            .iter()
            .filter(|lock| !self.before.iter().any(|b| b.same(lock)))
            .collect();
        let mut released = 0u64;
        for lock in &taken {
            // Each release gives back one acquisition; the loop ends when none is left, after
            // as many turns as the code took the lock in its bounded run time. It does not stop
            // for an interrupt: stopping halfway would leave the lock held.
            // SAFETY: a tag and mode read from the lock manager for this backend; a
            // session-level release of a lock this backend holds at session level.
            unsafe {
                while crate::compat::lock_held_by_me(&lock.tag, lock.mode)
                    && pg_sys::LockRelease(&lock.tag, lock.mode, true)
                {
                    released += 1;
                }
            }
        }
        let lost = self
            .before
            .iter()
            .filter(|lock| !now.iter().any(|n| n.same(lock)))
            .count();
        if released > 0 {
            pgrx::log!(
                "sql_query_engine: gave back {} session-level advisory lock(s) ({released} \
                 acquisition(s)) that code run by a query took (a function of a view, a policy or \
                 an index of what it read)",
                taken.len()
            );
        }
        if lost > 0 {
            pgrx::log!(
                "sql_query_engine: code that a query ran released {lost} advisory lock(s) the \
                 session held before"
            );
        }
    }
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
