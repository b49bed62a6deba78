//! The audit: calls recorded in `nl_history` (see `sql/history.sql`), and in the server log
//! (`audit`, one line per call by default), which keeps what a rollback or a read-only
//! transaction takes away. The history is best effort and never in the way:
//! skipped (with a DEBUG message) in a read-only transaction or on a standby, written in a
//! subtransaction whose failure is swallowed, and with a short lock timeout so that it never
//! blocks the answer.

use std::cell::{Cell, RefCell};
use std::panic::AssertUnwindSafe;

use pgrx::pg_sys::panic::{CaughtError, ErrorReport};
use pgrx::pg_sys::PgTryBuilder;
use pgrx::prelude::*;
use pgrx::{PgLogLevel, PgSqlErrorCode};

use crate::error::{Error, Result, SqlState};
use crate::heal::{Run, Status};
use crate::settings::AuditLog;
use crate::{names, settings, store, subxact, text, trace};

/// One `nl_history` row.
struct Row<'a> {
    function: &'a str,
    session: Option<&'a str>,
    question: &'a str,
    sql: Option<&'a str>,
    status: &'a str,
    /// The attempts, as the trace writes them (`trace::attempts`).
    attempts: String,
    row_count: Option<i32>,
    ms: f64,
    llm_calls: i32,
    prompt_tokens: i32,
    completion_tokens: i32,
}

impl Row<'_> {
    /// Inserts the row as the caller (its role OID, under row security); returns its id.
    fn insert(
        &self,
        schema: &str,
        client: &mut pgrx::spi::SpiClient<'_>,
    ) -> std::result::Result<Option<i64>, pgrx::spi::Error> {
        let sql = format!(
            "INSERT INTO {schema}.nl_history (function, session, question, sql, status, \
             attempts, row_count, ms, llm_calls, prompt_tokens, completion_tokens, role_id) \
             VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9, $10, $11, $12) RETURNING id"
        );
        client
            .update(
                sql.as_str(),
                Some(1),
                &[
                    self.function.into(),
                    self.session.into(),
                    self.question.into(),
                    self.sql.into(),
                    self.status.into(),
                    self.attempts.as_str().into(),
                    self.row_count.into(),
                    self.ms.into(),
                    self.llm_calls.into(),
                    self.prompt_tokens.into(),
                    self.completion_tokens.into(),
                    // SAFETY: reads the backend's current role.
                    unsafe { pg_sys::GetUserId() }.into(),
                ],
            )?
            .first()
            .get_one::<i64>()
    }
}

fn clamp(n: u64) -> i32 {
    n.min(i32::MAX as u64) as i32
}

/// Records one call of `function` (`nl_query`, ...); returns its `nl_history` id when it was
/// written.
pub fn record(function: &str, session: Option<&str>, run: &Run) -> Option<i64> {
    if !settings::history() {
        return None;
    }
    if !store::writable() {
        crate::error::debug(
            "sql_query_engine: history not recorded: the transaction is read-only".to_string(),
        );
        return None;
    }
    let schema = store::extension_schema().ok()?;
    let row = Row {
        function,
        session,
        question: &run.question,
        sql: run.final_sql(),
        status: run.status.as_str(),
        attempts: trace::attempts(run).to_string(),
        row_count: run.best_result().map(|r| clamp(r.rows.len() as u64)),
        ms: run.ms,
        llm_calls: run.llm_calls as i32,
        prompt_tokens: clamp(run.prompt_tokens),
        completion_tokens: clamp(run.completion_tokens),
    };
    store::write_best_effort("history", |client| row.insert(&schema, client)).flatten()
}

/// The functions whose answers `record_answer` records.
const ANSWERING: [&str; 4] = ["nl_ask", "nl_call", "nl_query", "nl_trace"];

/// Records an answer another server gave (`nl_history_add`): the object `nl_ask` returned
/// there. Unlike `record`, a failure is the caller's error: recording is what was asked for.
pub fn record_answer(
    function: &str,
    session: Option<&str>,
    answer: &serde_json::Value,
) -> Result<Option<i64>> {
    if !ANSWERING.contains(&function) {
        return Err(Error::InvalidParameter(format!(
            "function must name the function that answered: one of {}",
            ANSWERING.join(", ")
        )));
    }
    let bad = |what: &str| Error::InvalidParameter(format!("answer: {what}"));
    let text = |key: &str| answer.get(key).and_then(serde_json::Value::as_str);
    let count = |key: &str| answer.get(key).and_then(serde_json::Value::as_u64);
    let question = text("question")
        .filter(|q| !q.trim().is_empty())
        .ok_or_else(|| bad("has no question (pass the object nl_ask returned)"))?;
    let status = text("status")
        .filter(|s| ["ok", "empty", "error", "refused"].contains(s))
        .ok_or_else(|| bad("has no status of ok, empty, error or refused"))?;
    let attempts = answer
        .get("attempts")
        .filter(|a| a.is_array())
        .ok_or_else(|| bad("has no attempts array"))?;
    if !settings::history() {
        return Ok(None);
    }
    if !store::writable() {
        return Err(Error::sql(
            "25006",
            "nl_history_add records an answer: it cannot run in a read-only transaction",
            Some("Call it on the primary."),
        ));
    }
    let schema = store::extension_schema()?;
    let row = Row {
        function,
        session,
        question,
        sql: text("sql"),
        status,
        attempts: attempts.to_string(),
        row_count: count("row_count").map(clamp),
        ms: answer
            .get("ms")
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(0.0),
        llm_calls: count("llm_calls").map_or(0, clamp),
        prompt_tokens: count("prompt_tokens").map_or(0, clamp),
        completion_tokens: count("completion_tokens").map_or(0, clamp),
    };
    subxact::pinned(|| Spi::connect_mut(|client| row.insert(&schema, client)))
        .map_err(|e| Error::internal(format!("recording the answer failed: {e}")))
}

/// How a call ended, as the audit line says it.
pub enum Audited<'a> {
    /// A question answered (its status, rows and final SQL), and its `nl_history` row's id
    /// when one was written.
    Answered(&'a Run, Option<i64>),
    /// A call without a run (`nl_check`, `nl_run`, `nl_schema`, ...) that succeeded.
    Done,
    Failed(&'a Error),
    /// An ERROR PostgreSQL raised inside the call (a cancel, a timeout) that ended it.
    Raised(&'a CaughtError),
    /// The backend exited before the call ended.
    Ended,
    /// The call begins (only with `audit_log = all`): a backend that dies without exiting (a
    /// PANIC, a signal) leaves this line of what it was asked.
    Started,
}

/// The role of a call, read when the call starts: once an ERROR is caught, the audit line is
/// written without reading the catalogs again.
#[derive(Clone)]
pub struct Caller {
    id: pg_sys::Oid,
    name: String,
    /// The session user, when it is another role (`SET ROLE`, a SECURITY DEFINER function,
    /// the gateway's login role): who asked, as the connection says.
    session: Option<(pg_sys::Oid, String)>,
}

impl Caller {
    pub fn now() -> Caller {
        // SAFETY: reads the backend's current role and session user.
        let (id, session) = unsafe { (pg_sys::GetUserId(), pg_sys::GetSessionUserId()) };
        Caller {
            id,
            name: names::role_name(id).unwrap_or_default(),
            session: (session != id)
                .then(|| (session, names::role_name(session).unwrap_or_default())),
        }
    }

    /// How the audit line names the caller: the role, and the session user when it differs.
    fn described(&self) -> String {
        // Names another role chose, written out as every other field of the line is.
        let mut said = format!(
            "role {} (oid {})",
            text::quoted_field(&self.name),
            self.id.to_u32()
        );
        if let Some((id, name)) = &self.session {
            said.push_str(&format!(
                " for session user {} (oid {})",
                text::quoted_field(name),
                id.to_u32()
            ));
        }
        said
    }
}

/// A call being audited: what its audit line says if the backend exits before the call ends
/// (a FATAL error, `pg_terminate_backend`, a client gone with `client_connection_check_interval`
/// set), where nothing catches and the history row goes with the transaction.
#[derive(Clone)]
struct InFlight {
    caller: Caller,
    function: String,
    session: Option<String>,
    input: String,
    /// The queries of the call that ran so far (`ran`): they went to the database as the
    /// caller, and their errors or rows to the model, however the call ends. The first ones,
    /// and the last ones (closest to the answer), when there are more than `MAX_RAN`.
    first: Vec<String>,
    last: std::collections::VecDeque<String>,
    /// Queries that ran between `first` and `last` and are not written.
    more: usize,
    /// Where the model requests the call made from here on are noted (`llm::sent::mark`).
    sent_mark: usize,
}

/// Characters of a call's question or SQL written into its audit line, at most (what the
/// extension takes is shorter: longer input is refused, and its refusal audited).
const MAX_INPUT_CHARS: usize = 100_000;

/// Characters of a call's session name written into its audit line, at most (longer names are
/// refused).
const MAX_SESSION_CHARS: usize = 300;

/// Queries of one call written into its audit line, at most (half of them the first, half
/// the last), each cut to `MAX_RAN_CHARS` (its head and its tail).
const MAX_RAN: usize = 16;
const MAX_RAN_CHARS: usize = 2000;

/// Notes that `sql` is about to run for the call being audited.
pub fn ran(sql: &str) {
    IN_FLIGHT.with(|calls| {
        if let Ok(mut calls) = calls.try_borrow_mut() {
            if let Some(call) = calls.last_mut() {
                let sql = text::head_and_tail(sql, MAX_RAN_CHARS);
                if call.first.len() < MAX_RAN / 2 {
                    call.first.push(sql);
                } else {
                    call.last.push_back(sql);
                    if call.last.len() > MAX_RAN / 2 {
                        call.last.pop_front();
                        call.more += 1;
                    }
                }
            }
        }
    });
}

/// The queries the innermost call being audited ran so far, as its audit line lists them.
fn ran_so_far() -> String {
    IN_FLIGHT.with(|calls| {
        let Ok(calls) = calls.try_borrow() else {
            return String::new();
        };
        let Some(call) = calls.last() else {
            return String::new();
        };
        let mut lines: String = call
            .first
            .iter()
            .enumerate()
            .map(|(i, sql)| format!("\nran {}: {}", i + 1, text::escaped_line(sql)))
            .collect();
        if call.more > 0 {
            lines.push_str(&format!("\nand {} more", call.more));
        }
        let skipped = call.first.len() + call.more;
        for (i, sql) in call.last.iter().enumerate() {
            lines.push_str(&format!(
                "\nran {}: {}",
                skipped + i + 1,
                text::escaped_line(sql)
            ));
        }
        lines
    })
}

thread_local! {
    /// The calls being audited, innermost last.
    static IN_FLIGHT: RefCell<Vec<InFlight>> = const { RefCell::new(Vec::new()) };
    /// Whether `audit_at_exit` is registered in this backend.
    static AT_EXIT: Cell<bool> = const { Cell::new(false) };
}

/// Takes the call off `IN_FLIGHT` when dropped.
struct Entered;

impl InFlight {
    fn enter(caller: &Caller, function: &str, session: Option<&str>, input: &str) -> Entered {
        if !AT_EXIT.replace(true) {
            // SAFETY: registers a callback for this backend's exit (registered here, in the
            // backend, not in _PG_init: a postmaster's callbacks are reset in its children).
            unsafe { pg_sys::before_shmem_exit(Some(audit_at_exit), pg_sys::Datum::from(0)) };
        }
        IN_FLIGHT.with_borrow_mut(|calls| {
            calls.push(InFlight {
                caller: caller.clone(),
                function: function.to_string(),
                session: session.map(|s| text::at_most(s, MAX_SESSION_CHARS)),
                input: text::at_most(input, MAX_INPUT_CHARS),
                first: Vec::new(),
                last: std::collections::VecDeque::new(),
                more: 0,
                sent_mark: crate::llm::sent::mark(),
            })
        });
        Entered
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        if let Some(call) = IN_FLIGHT.with_borrow_mut(|calls| calls.pop()) {
            crate::llm::sent::forget_since(call.sent_mark);
        }
    }
}

/// The endpoints the innermost call being audited sent model requests to so far, as its audit
/// line names them.
fn sent_so_far() -> Vec<(String, bool)> {
    let mark = IN_FLIGHT.with(|calls| {
        calls
            .try_borrow()
            .ok()
            .and_then(|calls| calls.last().map(|call| call.sent_mark))
    });
    mark.map(crate::llm::sent::since).unwrap_or_default()
}

/// Audits the calls the backend exits in the middle of.
#[pg_guard]
unsafe extern "C-unwind" fn audit_at_exit(_code: std::ffi::c_int, _arg: pg_sys::Datum) {
    // Innermost first, each while it is still the innermost (its audit line lists what it ran).
    while let Some(call) = IN_FLIGHT.with_borrow(|calls| calls.last().cloned()) {
        audit(
            &call.caller,
            &call.function,
            call.session.as_deref(),
            &call.input,
            Audited::Ended,
        );
        IN_FLIGHT.with_borrow_mut(|calls| calls.pop());
    }
}

/// `work`, whose own outcome the caller audits; an ERROR raised inside it (a cancel, a
/// statement timeout, an error PostgreSQL does not let the call catch) unwinds past that audit,
/// so it is audited here on its way out, then raised on.
pub fn audit_raised<T>(
    function: &str,
    session: Option<&str>,
    input: &str,
    work: impl FnOnce(&Caller) -> T,
) -> T {
    crate::store::require_utf8().unwrap_or_else(|e| e.raise());
    let caller = Caller::now();
    audit(&caller, function, session, input, Audited::Started);
    let _in_flight = InFlight::enter(&caller, function, session, input);
    PgTryBuilder::new(AssertUnwindSafe(|| work(&caller)))
        .catch_others(|caught| {
            audit(&caller, function, session, input, Audited::Raised(&caught));
            caught.rethrow()
        })
        .execute()
}

/// Checks a call makes before its audit starts (where it was called from, its arguments, the
/// objects they name): nothing is written when they pass, and the call's own lines follow; a
/// refusal, or an ERROR raised in them, is written as the call's outcome, so that a call
/// refused early leaves its line too, whoever catches the error. `input` is formed only then;
/// the caller's roles are read before (no catalog is read once an ERROR was caught).
pub fn checked_first<T, S: AsRef<str>>(
    function: &str,
    session: Option<&str>,
    input: impl Fn() -> S,
    check: impl FnOnce() -> crate::error::Result<T>,
) -> crate::error::Result<T> {
    let caller = Caller::now();
    // Formed from the caller's arguments only, whatever was raised.
    let input = AssertUnwindSafe(input);
    let refused = |outcome: Audited<'_>| {
        audit_line(
            &caller,
            function,
            session,
            (*input)().as_ref(),
            outcome,
            false,
        )
    };
    PgTryBuilder::new(AssertUnwindSafe(|| {
        check().inspect_err(|error| refused(Audited::Failed(error)))
    }))
    .catch_others(|caught| {
        refused(Audited::Raised(&caught));
        caught.rethrow()
    })
    .execute()
}

/// Writes one call to the server log (`sql_query_engine.audit_log`, by default every call), as
/// `LOG` that is never sent to the client: neither the caller's rollback (which takes the
/// `nl_history` row with it) nor a read-only transaction or a standby (where no row is
/// written) removes it. `input` is the question, or the caller's SQL. With `audit_log =
/// errors`, a call that answered is written too when no history row keeps it (none was
/// written, or the row is rolled back: `pending_until_the_end`), and when it answered with an
/// error.
/// It reads no catalog: it is also written after an ERROR was caught.
pub fn audit(
    caller: &Caller,
    function: &str,
    session: Option<&str>,
    input: &str,
    outcome: Audited,
) {
    let started = matches!(outcome, Audited::Started);
    audit_line(caller, function, session, input, outcome, !started);
}

/// `audit`; `ran` says whether the call may have run queries or sent requests to name (not
/// as it starts, nor when refused before: what an enclosing call ran so far is not this one's).
fn audit_line(
    caller: &Caller,
    function: &str,
    session: Option<&str>,
    input: &str,
    outcome: Audited,
    ran: bool,
) {
    let sent = if ran { sent_so_far() } else { Vec::new() };
    let when = match (settings::audit_log(), &outcome) {
        (AuditLog::Off, _) => return,
        (AuditLog::All, _) => When::Now,
        (AuditLog::Errors, Audited::Failed(_) | Audited::Raised(_) | Audited::Ended) => When::Now,
        (AuditLog::Errors, Audited::Answered(run, recorded)) => match (recorded, run.status) {
            (_, Status::Error | Status::Refused) | (None, _) => When::Now,
            // The row does not say where the call's data went: rows described by a model
            // (`nl_answer`), requests that went to a fallback endpoint.
            _ if run.described_by.is_some() || sent.iter().any(|(_, fallback)| *fallback) => {
                When::Now
            }
            (Some(_), _) => When::RolledBack,
        },
        (AuditLog::Errors, Audited::Done | Audited::Started) => return,
    };
    let ran = if ran { ran_so_far() } else { String::new() };
    let sent = sent
        .into_iter()
        .map(|(endpoint, _)| endpoint)
        .collect::<Vec<_>>()
        .join(", ");
    let (mut result, sql) = match outcome {
        Audited::Answered(run, _) => (
            format!(
                "{}{}, {} attempt{}{}",
                run.status.as_str(),
                run.best_result()
                    .map(|r| format!(", {} rows", r.rows.len()))
                    .unwrap_or_default(),
                run.attempts.len(),
                if run.attempts.len() == 1 { "" } else { "s" },
                run.described_by
                    .as_deref()
                    .map(|endpoint| format!(", described by {endpoint}"))
                    .unwrap_or_default()
            ),
            run.final_sql(),
        ),
        Audited::Done => ("ok".to_string(), None),
        Audited::Failed(error) => (format!("ERROR {}: {error}", error.sqlstate()), None),
        Audited::Raised(caught) => (raised(caught), None),
        Audited::Ended => ("the session ended during the call".to_string(), None),
        Audited::Started => ("started".to_string(), None),
    };
    if !sent.is_empty() {
        result.push_str(&format!("; model requests to {sent}"));
    }
    let session = session
        .map(|s| {
            format!(
                " session {}",
                text::quoted_field(&text::at_most(s, MAX_SESSION_CHARS))
            )
        })
        .unwrap_or_default();
    // Each field on one line of its own, escaped: a question or a model's SQL holding a line
    // break could otherwise write a `sql:` or `ran` line of its own into the record.
    let input = text::escaped_line(&text::at_most(input, MAX_INPUT_CHARS));
    let detail = match sql {
        Some(sql) => format!(
            "input: {input}\nsql: {}{ran}",
            text::escaped_line(&text::head_and_tail(sql, MAX_INPUT_CHARS))
        ),
        None => format!("input: {input}{ran}"),
    };
    let line = Line {
        message: format!(
            "sql_query_engine: {function} by {}{session}: {}",
            caller.described(),
            text::escaped_line(&result)
        ),
        detail,
    };
    match when {
        When::Now => line.write(""),
        When::RolledBack => pending_until_the_end(line),
    }
}

/// When an audit line is written.
enum When {
    Now,
    /// Only if the call's history row is rolled back (`pending_until_the_end`).
    RolledBack,
}

/// One audit line.
struct Line {
    message: String,
    detail: String,
}

impl Line {
    /// Written with interrupts held off: writing a message checks for them, and a cancel
    /// taken there would end the call after its outcome was logged (a second line, an ERROR)
    /// or before the call began (a "started" line with no outcome). They are taken at the next
    /// check after.
    fn write(&self, said: &str) {
        subxact::holding_interrupts(|| self.write_now(said));
    }

    fn write_now(&self, said: &str) {
        crate::error::send(
            ErrorReport::new(
                PgSqlErrorCode::ERRCODE_SUCCESSFUL_COMPLETION,
                format!("{}{said}", self.message),
                "sql_query_engine",
            )
            .set_detail(self.detail.clone()),
            PgLogLevel::LOG_SERVER_ONLY,
        );
    }
}

/// Audit lines kept until their transaction ends, at most: past that, a line is written at
/// once (each may hold a call's question and queries, some hundred kB).
const MAX_PENDING: usize = 16;

thread_local! {
    /// The lines of calls whose history rows the transaction holds (`audit_log = errors`), with
    /// the subtransaction each row was written in: written if that subtransaction, or one
    /// around it, is rolled back; forgotten when the transaction commits.
    static PENDING: RefCell<Vec<(pg_sys::SubTransactionId, Line)>> =
        const { RefCell::new(Vec::new()) };
    /// Whether the transaction callbacks that end `PENDING` are registered in this backend.
    static END_CALLBACKS: Cell<bool> = const { Cell::new(false) };
}

/// Keeps `line` until its transaction ends: a call whose history row is rolled back (by the
/// caller: ROLLBACK, ROLLBACK TO SAVEPOINT, an exception block) leaves no trace otherwise.
fn pending_until_the_end(line: Line) {
    if !END_CALLBACKS.get() {
        // Noted as registered once both are (an allocation that fails raises): one registered
        // twice finds nothing left to write the second time.
        // SAFETY: registers callbacks of this backend; they only write log lines.
        unsafe {
            pg_sys::RegisterXactCallback(Some(transaction_ended), std::ptr::null_mut());
            pg_sys::RegisterSubXactCallback(Some(subtransaction_ended), std::ptr::null_mut());
        }
        END_CALLBACKS.set(true);
    }
    let full = PENDING.with_borrow(|pending| pending.len() >= MAX_PENDING);
    if full {
        line.write("");
        return;
    }
    // SAFETY: reads the current subtransaction's id, the caller's (the history row's own
    // subtransaction was released into it).
    let id = unsafe { pg_sys::GetCurrentSubTransactionId() };
    PENDING.with_borrow_mut(|pending| pending.push((id, line)));
}

/// What a pending line says when its history row was rolled back.
const ROLLED_BACK: &str = " (its history row was rolled back)";

/// Writes the pending lines of the subtransactions from `from` on (all of them when `None`),
/// with `said`.
fn rolled_back(from: Option<pg_sys::SubTransactionId>, said: &str) {
    let lines: Vec<Line> = PENDING.with_borrow_mut(|pending| {
        let (gone, kept) = std::mem::take(pending)
            .into_iter()
            .partition(|(id, _)| from.is_none_or(|from| *id >= from));
        *pending = kept;
        gone.into_iter().map(|(_, line)| line).collect()
    });
    for line in lines {
        line.write(said);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn transaction_ended(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    match event {
        pg_sys::XactEvent::XACT_EVENT_ABORT | pg_sys::XactEvent::XACT_EVENT_PARALLEL_ABORT => {
            rolled_back(None, ROLLED_BACK)
        }
        // ROLLBACK PREPARED, later and maybe in another session, would take the row with it.
        pg_sys::XactEvent::XACT_EVENT_PREPARE => rolled_back(
            None,
            " (its history row is in a prepared transaction: COMMIT PREPARED or ROLLBACK \
             PREPARED decides it)",
        ),
        pg_sys::XactEvent::XACT_EVENT_COMMIT | pg_sys::XactEvent::XACT_EVENT_PARALLEL_COMMIT => {
            PENDING.with_borrow_mut(Vec::clear)
        }
        _ => {}
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn subtransaction_ended(
    event: pg_sys::SubXactEvent::Type,
    my_subid: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        rolled_back(Some(my_subid), ROLLED_BACK);
    }
}

/// `work`'s result audited as a call of `function` without a run (an ERROR raised inside it
/// too), then returned.
pub fn audited<T>(
    function: &str,
    input: &str,
    work: impl FnOnce() -> crate::error::Result<T>,
) -> crate::error::Result<T> {
    audited_in(function, None, input, work)
}

/// `audited` for a call of `session`.
pub fn audited_in<T>(
    function: &str,
    session: Option<&str>,
    input: &str,
    work: impl FnOnce() -> crate::error::Result<T>,
) -> crate::error::Result<T> {
    audit_raised(function, session, input, |caller| {
        let result = work();
        match &result {
            Ok(_) => audit(caller, function, session, input, Audited::Done),
            Err(error) => audit(caller, function, session, input, Audited::Failed(error)),
        }
        result
    })
}

/// `ERROR <SQLSTATE>: <message>` of an ERROR PostgreSQL raised (a Rust panic's own text).
fn raised(caught: &CaughtError) -> String {
    match caught {
        CaughtError::PostgresError(report)
        | CaughtError::ErrorReport(report)
        | CaughtError::RustPanic {
            ereport: report, ..
        } => format!(
            "ERROR {}: {}",
            SqlState::from_code(report.sql_error_code()),
            report.message()
        ),
    }
}
