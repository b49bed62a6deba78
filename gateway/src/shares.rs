//! Each role's share of the database connections: a role may have at most so many calls
//! running at once (`--role-calls`), so that a flood of requests under one token leaves the
//! rest of the pool to the other roles. The pool alone serves whoever asks first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub struct Shares {
    per_role: usize,
    /// The running calls of each role that has any (or had, until the next new role).
    running: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Shares {
    pub fn new(per_role: usize) -> Shares {
        Shares {
            per_role: per_role.max(1),
            running: Mutex::default(),
        }
    }

    /// Calls one role may have running at once.
    pub fn per_role(&self) -> usize {
        self.per_role
    }

    /// A place among `role`'s running calls, held until dropped, waiting at most `wait` for
    /// one to end; `None` when the role's share stays taken that long.
    pub async fn enter(&self, role: &str, wait: Duration) -> Option<OwnedSemaphorePermit> {
        let semaphore = {
            let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
            if !running.contains_key(role) {
                // Roles nobody holds or waits for are forgotten: the map holds the busy ones. A
                // call holds its semaphore from here until its permit is dropped, so one that
                // has not taken its permit yet keeps its role's entry (and its count) too.
                running.retain(|_, s| Arc::strong_count(s) > 1);
            }
            let semaphore = running
                .entry(role.to_string())
                .or_insert_with(|| Arc::new(Semaphore::new(self.per_role)));
            Arc::clone(semaphore)
        };
        tokio::time::timeout(wait, semaphore.acquire_owned())
            .await
            .ok()?
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_role_waits_for_its_own_share_and_not_for_another_roles() {
        let shares = Shares::new(2);
        let wait = Duration::from_millis(50);
        let a1 = shares.enter("a", wait).await;
        let a2 = shares.enter("a", wait).await;
        assert!(a1.is_some() && a2.is_some());
        assert!(
            shares.enter("a", wait).await.is_none(),
            "a's share is taken"
        );
        assert!(shares.enter("b", wait).await.is_some(), "b has its own");
        drop(a1);
        assert!(
            shares.enter("a", wait).await.is_some(),
            "one of a's calls ended"
        );
    }

    #[tokio::test]
    async fn a_call_about_to_take_its_place_keeps_its_roles_count() {
        let shares = Shares::new(1);
        let wait = Duration::from_millis(50);
        drop(shares.enter("a", wait).await);
        // A call of a that has its role's semaphore and not yet its permit, when a call of
        // another role comes in and forgets idle roles.
        let pending = Arc::clone(&shares.running.lock().unwrap()["a"]);
        assert!(shares.enter("b", wait).await.is_some());
        let _running = pending.acquire_owned().await.unwrap();
        assert!(
            shares.enter("a", wait).await.is_none(),
            "a's one place is taken by the call that was about to run"
        );
    }
}
