//! Running blocking I/O (the model's HTTP, Redis) without making the backend deaf or slow.
//!
//! A blocking socket call on the backend thread ignores query cancel and statement_timeout until
//! its own timeout. So the call runs on a helper thread that never touches PostgreSQL, and the
//! backend sleeps in `WaitLatchOrSocket` on two things at once: its latch, which every interrupt
//! sets (Ctrl-C, `pg_cancel_backend`, the caller's statement_timeout, `pg_terminate_backend`),
//! and an eventfd that the helper signals the moment its result is there. So the backend wakes
//! for exactly those events, with no polling delay; interrupts are handled as they arrive, and
//! postmaster death ends the process. An abandoned helper finishes on its own I/O timeout and
//! its result is dropped.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use pgrx::pg_sys;

/// Longest single sleep: a bound, not a polling period (every event wakes the backend sooner).
const MAX_SLEEP: Duration = Duration::from_secs(1);

/// Helper threads of one role in this backend that may run at once, abandoned ones included:
/// a role that cancels call after call (catching the cancel in a loop) would otherwise leave a
/// request, a thread and its buffers behind each time, each living until its own I/O timeout.
/// A new wait beyond the bound first waits (interruptibly, within its deadline) for one to
/// end. Work that runs several requests at once counts each (`run_interruptible_as`). Counted
/// per role: behind a transaction pooler the backend serves the next client, of any role, as
/// soon as a cancelled call has ended, and what one role left behind must not hold up another.
pub const MAX_LIVE_HELPERS: usize = 4;

/// Helper threads of this backend that may run at once, whatever their roles.
const MAX_LIVE_HELPERS_IN_ALL: usize = 16;

/// Helper threads of this process (one backend) that have not ended yet, by the role (the
/// current user) that started them.
static LIVE_HELPERS: Mutex<Vec<(u32, usize)>> = Mutex::new(Vec::new());

/// Whether `helpers` more may start for `role`.
fn room_for(role: u32, helpers: usize) -> bool {
    let live = LIVE_HELPERS.lock().unwrap_or_else(|p| p.into_inner());
    let all: usize = live.iter().map(|(_, n)| n).sum();
    let own = live.iter().find(|(r, _)| *r == role).map_or(0, |(_, n)| *n);
    own + helpers <= MAX_LIVE_HELPERS && all + helpers <= MAX_LIVE_HELPERS_IN_ALL
}

/// Counts helper threads of a role as live until it is dropped, also when the work panics.
struct Live {
    role: u32,
    helpers: usize,
}

impl Live {
    fn count(role: u32, helpers: usize) -> Live {
        let mut live = LIVE_HELPERS.lock().unwrap_or_else(|p| p.into_inner());
        match live.iter_mut().find(|(r, _)| *r == role) {
            Some((_, n)) => *n += helpers,
            None => live.push((role, helpers)),
        }
        Live { role, helpers }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let mut live = LIVE_HELPERS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, n)) = live.iter_mut().find(|(r, _)| *r == self.role) {
            *n = n.saturating_sub(self.helpers);
        }
        live.retain(|(_, n)| *n > 0);
    }
}

/// How often a wait for a free helper looks again (an ending helper signals no one).
const HELPER_POLL: Duration = Duration::from_millis(50);

/// Why a wait ended without a result.
#[derive(Debug, PartialEq, Eq)]
pub enum WaitError {
    /// The deadline passed first.
    TimedOut,
    /// The deadline passed while every helper was busy: the work never started.
    Busy,
    /// The helper thread could not start, or died without answering (it panicked).
    Lost,
}

/// A non-blocking eventfd: the helper's "done" signal, readable once written to.
struct Signal(OwnedFd);

impl Signal {
    fn new() -> Option<Signal> {
        // SAFETY: eventfd has no memory arguments; it returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        // SAFETY: a descriptor eventfd just opened, owned by nothing else.
        (fd >= 0).then(|| Signal(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn raise(&self) {
        let one: u64 = 1;
        // Cannot block (the counter would have to reach u64::MAX - 1); a failure only means
        // the backend wakes at its next timeout instead.
        // SAFETY: writes the eight bytes of `one` to the descriptor this Signal owns.
        let _ = unsafe {
            libc::write(
                self.0.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }
}

/// Runs `work` on a helper thread and waits for its result until `deadline`, staying
/// interruptible. Query cancel raises the usual 57014 ERROR from here.
pub fn run_interruptible<T, F>(deadline: Instant, work: F) -> Result<T, WaitError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    run_interruptible_as(deadline, 1, work)
}

/// `run_interruptible` for work that runs `helpers` requests at once, each on a thread of its
/// own (at most `MAX_LIVE_HELPERS`): it takes that many of the backend's places until it ends.
pub fn run_interruptible_as<T, F>(
    deadline: Instant,
    helpers: usize,
    work: F,
) -> Result<T, WaitError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let helpers = helpers.clamp(1, MAX_LIVE_HELPERS);
    // The call's role, also while a procedure's transaction is released (the current user is
    // then the session's, for every role a pooler or the gateway serves).
    let role = crate::subxact::acting_role().to_u32();
    while !room_for(role, helpers) {
        let now = Instant::now();
        if now >= deadline {
            return Err(WaitError::Busy);
        }
        wait_for(None, (deadline - now).min(HELPER_POLL));
    }
    let signal = Arc::new(Signal::new().ok_or(WaitError::Lost)?);
    // Hold no snapshot of our own while waiting (the catalog's is taken again when needed);
    // the calling statement's snapshot is PostgreSQL's to keep.
    // SAFETY: drops the backend's catalog snapshot, which PostgreSQL takes again on demand.
    unsafe { pg_sys::InvalidateCatalogSnapshot() };
    let (sender, receiver) = mpsc::sync_channel(1);
    let done = Arc::clone(&signal);
    let live = Live::count(role, helpers);
    let spawned = without_signals(|| {
        std::thread::Builder::new()
            .name("sql_query_engine-io".into())
            .spawn(move || {
                let _live = live;
                // The receiver may be gone (cancel, timeout): then the result is simply dropped.
                let _ = sender.send(work());
                done.raise();
            })
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
        wait_for(Some(signal.0.as_raw_fd()), (deadline - now).min(MAX_SLEEP));
    }
}

/// Runs `spawn` with every signal blocked on this thread, so that a thread it starts inherits
/// a mask that blocks them all: PostgreSQL's handlers (cancel, terminate, the latch) must run on
/// the backend's own thread, never on a helper. The backend's mask is put back afterwards.
fn without_signals<T>(spawn: impl FnOnce() -> T) -> T {
    // SAFETY: sigset_t is plain data that sigfillset initialises; pthread_sigmask only changes
    // this thread's mask, and the old one is restored before returning.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        let blocked = libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old) == 0;
        let result = spawn();
        if blocked {
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        }
        result
    }
}

/// Sleeps until `until` (for retry back-off), interruptibly.
pub fn sleep_interruptible(until: Instant) {
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        if left.is_zero() {
            break;
        }
        wait_for(None, left.min(MAX_SLEEP));
    }
}

/// Sleeps on the backend's latch (and `socket`, when given) for at most `timeout`, then handles
/// interrupts (a query cancel raises its ERROR here; a terminate or postmaster death ends the
/// process).
fn wait_for(socket: Option<std::ffi::c_int>, timeout: Duration) {
    let mut events = pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH;
    if socket.is_some() {
        events |= pg_sys::WL_SOCKET_READABLE;
    }
    // Round up, so that a wait never ends just before its deadline and spins.
    let millis = timeout.as_micros().div_ceil(1000).max(1) as std::ffi::c_long;
    // SAFETY: sleeps on the backend's own latch (and a descriptor this wait owns), then resets
    // the latch and handles interrupts, as PostgreSQL's own waits do.
    unsafe {
        pg_sys::WaitLatchOrSocket(
            pg_sys::MyLatch,
            events as i32,
            socket.unwrap_or(pg_sys::PGINVALID_SOCKET),
            millis,
            pg_sys::PG_WAIT_EXTENSION,
        );
        pg_sys::ResetLatch(pg_sys::MyLatch);
    }
    pgrx::check_for_interrupts!();
}
