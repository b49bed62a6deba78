//! Transaction-scoped state, used by the executor, the guard and the extension's own SQL:
//! internal subtransactions that catch errors without aborting the caller, settings that last
//! until the end of a scope (like a function's `SET` clause), and the transaction a procedure
//! may end so that nothing is held while the model thinks.

use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::panic::AssertUnwindSafe;

use pgrx::pg_sys::panic::CaughtError;
use pgrx::pg_sys::{self, PgTryBuilder};

use crate::error::SqlState;

/// Runs `work` in an internal subtransaction, committed when `commit` and the work succeeded,
/// rolled back otherwise; its error is returned, and the caller's transaction, memory context
/// and resource owner are as they were. A cancel, a resource or a system error (`ends_the_call`)
/// is raised again once rolled back: it is the call's, whatever the work was.
pub fn in_subtransaction<R>(commit: bool, work: impl FnOnce() -> R) -> Result<R, Box<CaughtError>> {
    match catching_everything(commit, work) {
        Err(caught) if ends_the_call(&caught) => caught.rethrow(),
        done => done,
    }
}

/// `in_subtransaction` that returns every error, a cancel's too: for the sandbox's attempt,
/// which tells its own timeout and memory watch from the rest.
pub fn catching_everything<R>(
    commit: bool,
    work: impl FnOnce() -> R,
) -> Result<R, Box<CaughtError>> {
    // PgTry catches every error and panic of `work`; the caller's memory context and resource
    // owner are put back after the release or rollback.
    // SAFETY: the subtransaction begun here is ended here on every path (see above).
    unsafe {
        let caller_context = pg_sys::CurrentMemoryContext;
        let caller_owner = pg_sys::CurrentResourceOwner;
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(caller_context);
        let result = PgTryBuilder::new(AssertUnwindSafe(|| Ok(work())))
            .catch_others(|caught| Err(Box::new(caught)))
            .execute();
        pg_sys::MemoryContextSwitchTo(caller_context);
        if commit && result.is_ok() {
            pg_sys::ReleaseCurrentSubTransaction();
        } else {
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
        }
        pg_sys::MemoryContextSwitchTo(caller_context);
        pg_sys::CurrentResourceOwner = caller_owner;
        result
    }
}

/// A security-restricted operation (as PostgreSQL runs `REFRESH MATERIALIZED VIEW` and the
/// index expressions of `ANALYZE`) until dropped: code a query runs (a view's or a policy's
/// functions) may not change the role (`SET ROLE`, `set_config('role', ...)`, `RESET ROLE`,
/// a function's `SET role` clause) nor leave session state behind (`PREPARE`, `LISTEN`,
/// holdable cursors, temporary tables). Without it, such code could become any role the
/// session user may become: another of a gateway's roles, or a superuser session user's own.
pub struct Restricted {
    user: pg_sys::Oid,
    context: std::ffi::c_int,
}

impl Restricted {
    pub fn enter() -> Restricted {
        let (mut user, mut context) = (pg_sys::InvalidOid, 0);
        // Reads the current user and security context into locals; `drop` puts both back.
        // SAFETY: sets the same user with the restriction added (an abort restores it too).
        unsafe {
            pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
            pg_sys::SetUserIdAndSecContext(
                user,
                context | pg_sys::SECURITY_RESTRICTED_OPERATION as std::ffi::c_int,
            );
        }
        Restricted { user, context }
    }
}

impl Drop for Restricted {
    fn drop(&mut self) {
        // SAFETY: the user and context `enter` read.
        unsafe { pg_sys::SetUserIdAndSecContext(self.user, self.context) };
    }
}

/// Whether a caught error must end the whole call though the work was optional (the doubts,
/// the bookkeeping): a cancel or a timeout of the call (class 57), a resource (53) or system
/// (58) error, or a panic (a bug). Anything else costs only that work.
fn ends_the_call(caught: &CaughtError) -> bool {
    match caught {
        CaughtError::RustPanic { .. } => true,
        CaughtError::PostgresError(r) | CaughtError::ErrorReport(r) => {
            let sqlstate = SqlState::from_code(r.sql_error_code());
            ["53", "57", "58"].contains(&sqlstate.class())
        }
    }
}

/// The search path of the extension's own SQL: built-in names only, temporary objects last,
/// so that no function, operator or type a role created can stand in for a built-in one.
pub const PINNED_SEARCH_PATH: &CStr = c"pg_catalog, pg_temp";

/// Runs `work` with `settings` in force, restored afterwards, like a function's `SET` clause
/// (also when `work` raises an ERROR: the guard restores them as it unwinds).
pub fn with_settings<R>(settings: &[(&CStr, &CStr)], work: impl FnOnce() -> R) -> R {
    with_settings_in(pg_sys::GucContext::PGC_USERSET, settings, work)
}

/// Runs `work`, the extension's own, with no message below ERROR sent to the client or the
/// server log: for a step that PostgreSQL would warn about while the extension expects it.
pub fn without_messages<R>(work: impl FnOnce() -> R) -> R {
    // log_min_messages is a superuser's setting: set here by the extension itself, for `work`.
    with_settings_in(
        pg_sys::GucContext::PGC_SUSET,
        &[
            (c"client_min_messages", c"error"),
            (c"log_min_messages", c"error"),
        ],
        work,
    )
}

/// While alive, no message goes to the client (`whereToSendOutput` is none), whatever the
/// level and `client_min_messages`: code a query runs can set the latter for itself (a
/// function's `SET`), and an INFO is sent whatever it says. The server log is untouched. An
/// ERROR raised meanwhile is caught at pgrx's boundary and raised afresh, after the guard has
/// gone, so it still reaches the client; a FATAL (the backend terminated) ends the connection
/// without its message.
pub struct QuietClient(pg_sys::CommandDest::Type);

impl QuietClient {
    pub fn new() -> Self {
        // SAFETY: the backend's own global, read and set on its only thread that runs
        // PostgreSQL code; `drop` puts the value back.
        let was = unsafe {
            let was = pg_sys::whereToSendOutput;
            pg_sys::whereToSendOutput = pg_sys::CommandDest::DestNone;
            was
        };
        QuietClient(was)
    }
}

impl Drop for QuietClient {
    fn drop(&mut self) {
        // SAFETY: as in `new`.
        unsafe { pg_sys::whereToSendOutput = self.0 };
    }
}

/// Runs `work` with cancel and termination held off (as PostgreSQL's HOLD_INTERRUPTS): for what
/// a destructor does while an error unwinds, where an ERROR raised at a message's check for
/// interrupts would abort the backend. They are taken at the next check after.
pub fn holding_interrupts<R>(work: impl FnOnce() -> R) -> R {
    /// The count as it was: put back, not decremented (an ERROR inside resets it to 0).
    struct Held(u32);
    impl Drop for Held {
        fn drop(&mut self) {
            // SAFETY: the backend's own counter, put back as it was found.
            unsafe { pg_sys::InterruptHoldoffCount = self.0 }
        }
    }
    // SAFETY: as HOLD_INTERRUPTS; `Held` puts the count back on every path.
    let _held = Held(unsafe { pg_sys::InterruptHoldoffCount });
    // SAFETY: as above.
    unsafe { pg_sys::InterruptHoldoffCount = _held.0.saturating_add(1) };
    work()
}

/// A line of the server log alone (never sent to the client, so never converted to its
/// encoding), with interrupts held off: what a destructor may write while an error unwinds,
/// where any ERROR would abort the backend.
pub fn log_while_unwinding(message: String) {
    holding_interrupts(|| {
        crate::error::tell(
            pgrx::PgLogLevel::LOG_SERVER_ONLY,
            pgrx::PgSqlErrorCode::ERRCODE_SUCCESSFUL_COMPLETION,
            message,
        )
    });
}

fn with_settings_in<R>(
    context: pg_sys::GucContext::Type,
    settings: &[(&CStr, &CStr)],
    work: impl FnOnce() -> R,
) -> R {
    /// The GUC nesting level of the settings; dropping it ends that level.
    struct Level(std::ffi::c_int);
    impl Drop for Level {
        fn drop(&mut self) {
            // SAFETY: ends the level `NewGUCNestLevel` opened below, keeping its values only
            // when the work returned (an error's abort would restore them anyway).
            unsafe { pg_sys::AtEOXact_GUC(!std::thread::panicking(), self.0) }
        }
    }
    // SAFETY: a new nesting level, and settings made at it, which `Level` ends.
    let _level = unsafe {
        let level = Level(pg_sys::NewGUCNestLevel());
        for (name, value) in settings {
            pg_sys::set_config_option(
                name.as_ptr(),
                value.as_ptr(),
                context,
                pg_sys::GucSource::PGC_S_SESSION,
                pg_sys::GucAction::GUC_ACTION_SAVE,
                true,
                0,
                false,
            );
        }
        level
    };
    work()
}

/// Runs the extension's own SQL in `work` with the pinned search path.
pub fn pinned<R>(work: impl FnOnce() -> R) -> R {
    with_settings(&[(c"search_path", PINNED_SEARCH_PATH)], work)
}

/// Runs `work` with the pinned search path, and with values written out and read back exactly,
/// as pg_dump sets them (floats in full, ISO dates, PostgreSQL's interval style): for a query
/// the extension writes out of a checked tree and parses again (`guard::qualified_text`, the
/// view `nl_view` makes from it).
pub fn pinned_exact<R>(work: impl FnOnce() -> R) -> R {
    with_settings(
        &[
            (c"search_path", PINNED_SEARCH_PATH),
            (c"extra_float_digits", c"3"),
            (c"DateStyle", c"ISO, YMD"),
            (c"IntervalStyle", c"postgres"),
        ],
        work,
    )
}

/// Sets `name` to `value` until the end of the current (sub)transaction, checked as `SET LOCAL`
/// checks it (for `role`: the session user must be allowed to become the role).
pub fn set_local(name: &CStr, value: &CStr) {
    // SAFETY: reads whether the current user is a superuser.
    let context = if unsafe { pg_sys::superuser() } {
        pg_sys::GucContext::PGC_SUSET
    } else {
        pg_sys::GucContext::PGC_USERSET
    };
    set_local_in(context, name, value);
}

/// Sets `name` to `value` until the end of the current (sub)transaction, as the extension's own
/// bound (`temp_file_limit` of an attempt): at a superuser's level, whoever the caller is, so
/// that a setting only superusers may change (`temp_file_limit`) is set for any caller, and
/// nothing the attempt runs may change it back. A setting any role may change (`jit`,
/// `max_parallel_workers`) code the attempt runs can change back (a function's `SET jit =
/// on`): that is no bound, only a default (parallel plans are refused by the planner hook
/// anyway; a function that turns JIT on under the memory limit can end its own backend, as it
/// could by `pg_terminate_backend(pg_backend_pid())`).
pub fn bound_local(name: &CStr, value: &CStr) {
    set_local_in(pg_sys::GucContext::PGC_SUSET, name, value);
}

fn set_local_in(context: pg_sys::GucContext::Type, name: &CStr, value: &CStr) {
    // SAFETY: NUL-terminated name and value; GUC_ACTION_LOCAL lasts until the (sub)transaction
    // ends.
    unsafe {
        pg_sys::set_config_option(
            name.as_ptr(),
            value.as_ptr(),
            context,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_LOCAL,
            true,
            0,
            false,
        );
    }
}

/// Runs `work`, the body of a procedure, so that `release` may end its transaction: in a
/// non-atomic SPI connection when `fcinfo` is a `CALL` outside a transaction block and not
/// from the caller's own procedure or DO block, as is otherwise (then `release` does nothing). `settings` are in force for the whole call and no
/// longer: in each transaction of a non-atomic call (`resume` sets them again in the next
/// one: a procedure that commits cannot have a `SET` clause), else until `work` returns, like
/// a function's `SET` clause. Nothing of them outlives the call, not even on a connection a
/// transaction-mode pooler hands to another client next.
pub fn in_procedure<R>(
    fcinfo: pg_sys::FunctionCallInfo,
    settings: &[(CString, CString)],
    work: impl FnOnce() -> R,
) -> R {
    // Nothing of an earlier call is this one's, even if that call ended without its guards
    // (an ERROR that jumped past them).
    RELEASABLE.set(false);
    CALL_ROLE.set(None);
    PER_TRANSACTION.with_borrow_mut(Vec::clear);
    // Whether an SPI connection of the caller's code (a procedure's, a DO block's) is around
    // this CALL is read before this one makes its own.
    // SAFETY: PostgreSQL passes a valid fcinfo; its context, when set, is a Node.
    let (nonatomic, nested, callers_own) = unsafe {
        let context = (*fcinfo).context;
        (
            !context.is_null()
                && (*context).type_ == pg_sys::NodeTag::T_CallContext
                && !(*context.cast::<pg_sys::CallContext>()).atomic,
            pg_sys::SPI_inside_nonatomic_context(),
            // The transaction already holds the caller's own: an earlier statement of the same
            // pipeline (extended protocol, no Sync between) ran in it, or the CALL's arguments
            // set a setting for it or wrote. PostgreSQL calls the CALL non-atomic, but a
            // commit would undo what was set for the transaction (the role, a setting a policy
            // reads) and commit what was written.
            pg_sys::MyXactFlags != 0
                || pg_sys::GetTopTransactionIdIfAny() != pg_sys::InvalidTransactionId
                || crate::compat::settings_held_for_the_transaction(),
        )
    };
    // A CALL from the caller's code, or after the caller's statements in its transaction, runs
    // like a function: its commits would be the caller's transaction's (and would undo the
    // role it set for it), and its settings, set per transaction, would outlive it there.
    if !nonatomic || nested || callers_own {
        let scoped: Vec<(&CStr, &CStr)> = settings
            .iter()
            .map(|(name, value)| (name.as_c_str(), value.as_c_str()))
            .collect();
        return with_settings(&scoped, work);
    }
    /// The procedure's non-atomic SPI connection and its per-transaction settings; dropping
    /// it finishes both.
    struct Connected;
    impl Drop for Connected {
        fn drop(&mut self) {
            RELEASABLE.set(false);
            CALL_ROLE.set(None);
            PER_TRANSACTION.with_borrow_mut(Vec::clear);
            // SAFETY: finishes the connection made below, the innermost one: everything made
            // inside `work` finished its own before returning or unwinding past here.
            unsafe { pg_sys::SPI_finish() };
        }
    }
    // SAFETY: a CALL outside a transaction block may connect non-atomically.
    unsafe { pg_sys::SPI_connect_ext(pg_sys::SPI_OPT_NONATOMIC as i32) };
    let _connected = Connected;
    RELEASABLE.set(true);
    PER_TRANSACTION.with_borrow_mut(|s| *s = settings.to_vec());
    set_per_transaction();
    // SAFETY: reads the backend's current user, the role the call now runs as.
    CALL_ROLE.set(Some(unsafe { pg_sys::GetUserId() }));
    work()
}

/// The role the running call acts as, also between `release` and `resume`, when the
/// transaction that set it has ended and the current user is the session's again.
pub fn acting_role() -> pg_sys::Oid {
    CALL_ROLE.get().unwrap_or_else(|| {
        // SAFETY: reads the backend's current user.
        unsafe { pg_sys::GetUserId() }
    })
}

thread_local! {
    /// The settings of the running non-atomic procedure, for each of its transactions.
    static PER_TRANSACTION: RefCell<Vec<(CString, CString)>> = const { RefCell::new(Vec::new()) };
    /// Whether the running call is a procedure `in_procedure` connected non-atomically, the
    /// one whose transaction `release` may end.
    static RELEASABLE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The role a non-atomic procedure runs as (see `acting_role`).
    static CALL_ROLE: std::cell::Cell<Option<pg_sys::Oid>> = const { std::cell::Cell::new(None) };
}

/// Sets the running procedure's settings until the end of the current transaction. A setting
/// that may not be made (a role the session user may not become) raises its ERROR.
fn set_per_transaction() {
    let settings = PER_TRANSACTION.with_borrow(Clone::clone);
    for (name, value) in &settings {
        set_local(name, value);
    }
}

/// Commits the transaction of a procedure run by `in_procedure` and starts the next one
/// without a snapshot, so that until `resume` this backend holds back no vacuum horizon and
/// holds no lock. A `CALL` outside a transaction block has no work of the caller's in its
/// transaction, only the extension's bookkeeping. Does nothing (and says so) anywhere else: in
/// a function, in a transaction block, in a subtransaction, inside the extension's own SPI.
pub fn release() -> bool {
    // SAFETY: commits only inside a non-atomic SPI connection outside any subtransaction, the
    // one state in which PostgreSQL allows a procedure to end its transaction.
    unsafe {
        if !RELEASABLE.get()
            || !pg_sys::SPI_inside_nonatomic_context()
            || pg_sys::IsSubTransaction()
        {
            return false;
        }
        pg_sys::SPI_commit();
    }
    true
}

/// Takes the snapshot that the procedure's next statements need, after `release`, and sets the
/// procedure's settings again in the new transaction.
pub fn resume() {
    // SAFETY: takes the snapshot PostgreSQL would take for the procedure's next statement.
    unsafe { pg_sys::EnsurePortalSnapshotExists() }
    set_per_transaction();
    // The call goes on only as the role it started as: whatever else set the role for the
    // transaction that ended did not set it again.
    // SAFETY: reads the backend's current user.
    let now = unsafe { pg_sys::GetUserId() };
    if CALL_ROLE.get().is_some_and(|role| role != now) {
        crate::error::Error::sql(
            "25000",
            "the role the call started as did not outlive the commit of its transaction",
            Some("Set the role with nl_call's run_as, or for the session."),
        )
        .raise();
    }
}
