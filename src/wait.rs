//! Running blocking I/O (the model's HTTP, Redis) without making the backend deaf.
//!
//! A blocking socket call on the backend thread ignores query cancel and statement_timeout until
//! its own timeout. So the call runs on a helper thread that never touches PostgreSQL, and the
//! backend waits on its latch in short slices, checking for interrupts between them: Ctrl-C,
//! `pg_cancel_backend` and the caller's statement_timeout land within one slice, and
//! `pg_terminate_backend` or postmaster death end the process cleanly. An abandoned helper
//! finishes on its own I/O timeout and its result is dropped.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use pgrx::pg_sys;

/// How often the waiting backend looks for interrupts.
const SLICE: Duration = Duration::from_millis(10);

/// Why a wait ended without a result.
#[derive(Debug, PartialEq, Eq)]
pub enum WaitError {
    /// The deadline passed first.
    TimedOut,
    /// The helper thread died without answering (it panicked).
    Lost,
}

/// Runs `work` on a helper thread and waits for its result until `deadline`, staying
/// interruptible. Query cancel raises the usual 57014 ERROR from here.
pub fn run_interruptible<T, F>(deadline: Instant, work: F) -> Result<T, WaitError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (sender, receiver) = mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new()
        .name("sql_query_engine-io".into())
        .spawn(move || {
            // The receiver may be gone (cancel, timeout): then the result is simply dropped.
            let _ = sender.send(work());
        });
    if spawned.is_err() {
        return Err(WaitError::Lost);
    }
    loop {
        match receiver.try_recv() {
            Ok(value) => return Ok(value),
            Err(mpsc::TryRecvError::Disconnected) => return Err(WaitError::Lost),
            Err(mpsc::TryRecvError::Empty) => {}
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(WaitError::TimedOut);
        }
        wait_on_latch(SLICE.min(deadline - now));
    }
}

/// Sleeps until `until` (for retry back-off), interruptibly.
pub fn sleep_interruptible(until: Instant) {
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        wait_on_latch(SLICE.min(left));
    }
}

/// Sleeps on the backend's latch for at most `slice`, then handles interrupts (a query cancel
/// raises its ERROR here; a terminate or postmaster death ends the process).
fn wait_on_latch(slice: Duration) {
    unsafe {
        pg_sys::WaitLatch(
            pg_sys::MyLatch,
            (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
            slice.as_millis().max(1) as std::ffi::c_long,
            pg_sys::PG_WAIT_EXTENSION,
        );
        pg_sys::ResetLatch(pg_sys::MyLatch);
    }
    pgrx::check_for_interrupts!();
}
