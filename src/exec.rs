//! Running one generated query safely: guarded, in an internal subtransaction that is always
//! rolled back, read-only, under a per-attempt statement timeout and a row cap. Any error is
//! caught whole (SQLSTATE, message, detail, hint, position) and the caller's transaction goes
//! on as if nothing happened.
//!
//! The statement that runs is the one the guard checked: its analyzed tree is rewritten,
//! planned (parallel plans allowed) and executed here, never parsed again from text. Rows go
//! to a receiver that stops the executor after `max_rows + 1` rows (a row count given to the
//! executor would forbid parallel plans) and turns each into jsonb with PostgreSQL's own
//! `to_jsonb`, so numerics keep their scale and dates render as PostgreSQL renders them.

use std::cell::Cell;
use std::ffi::{CStr, CString};

use pgrx::pg_sys;
use pgrx::pg_sys::panic::CaughtError;
use pgrx::PgList;

use crate::error::{SqlError, SqlState};
use crate::{guard, subxact};

/// What an attempt is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Run the query and keep at most this many rows.
    Run { max_rows: usize },
    /// Only plan it (`nl_generate`): the query is analyzed and planned, never executed.
    Plan,
    /// Run it into the hold store of `portal` (a cursor of the caller's transaction, made by
    /// `new_cursor`), at most `max_rows` rows, with the query's own column types.
    Cursor {
        portal: pg_sys::Portal,
        max_rows: usize,
    },
}

/// Rows of one successful query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResultSet {
    /// Column names in the query's order (duplicates made unique: `name`, `name_2`).
    pub columns: Vec<String>,
    /// One jsonb object per row, as PostgreSQL's text form.
    pub rows: Vec<String>,
    /// More rows existed than `max_rows`; the rest were cut.
    pub truncated: bool,
    /// For an empty result: the tables it read on which row-level security filters this role's
    /// rows, so that "empty because of row security" is told apart from "really empty".
    pub row_security: Vec<String>,
    /// Parallel workers the executor launched (0 for a serial plan).
    pub parallel_workers: i32,
    /// Rows written to a cursor (`Mode::Cursor`), where they are not kept here.
    pub stored: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Rows(ResultSet),
    Empty(ResultSet),
    /// Planned without error (`Mode::Plan`).
    Planned,
    Failed(SqlError),
    Refused(guard::Refusal),
}

impl Outcome {
    /// The outcome's name, as the trace and progress events show it.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Rows(_) => "rows",
            Outcome::Empty(_) => "empty",
            Outcome::Planned => "planned",
            Outcome::Failed(_) => "error",
            Outcome::Refused(_) => "refused",
        }
    }

    /// The error, for a failed or refused attempt.
    pub fn error(&self) -> Option<&SqlError> {
        match self {
            Outcome::Failed(e) => Some(e),
            Outcome::Refused(r) => Some(&r.error),
            _ => None,
        }
    }

    /// The result, for an attempt that ran.
    pub fn result(&self) -> Option<&ResultSet> {
        match self {
            Outcome::Rows(r) | Outcome::Empty(r) => Some(r),
            _ => None,
        }
    }
}

/// Runs `sql` once. Errors of the query become `Outcome::Failed`; an interrupt that is not ours
/// (query cancel, the caller's own statement_timeout, resource exhaustion) is re-raised after
/// the subtransaction is rolled back.
pub fn attempt(sql: &str, mode: Mode, timeout_ms: i32) -> Outcome {
    let position = Box::new(Cell::new(0i32));
    let (result, timer) = unsafe {
        let mut callback = pg_sys::ErrorContextCallback {
            previous: pg_sys::error_context_stack,
            callback: Some(record_error_position),
            arg: (&*position as *const Cell<i32>).cast_mut().cast(),
        };
        pg_sys::error_context_stack = &mut callback;
        let timer = StatementTimer::arm(timeout_ms);
        // Always rolled back: the query only read, and nothing it did may outlive it.
        let result = subxact::in_subtransaction(false, || run_guarded(sql, mode));
        timer.disarm();
        pg_sys::error_context_stack = callback.previous;
        (result, timer)
    };
    match result {
        Ok(outcome) => outcome,
        Err(caught) => {
            let position = Some(position.get()).filter(|p| *p > 0);
            failure(*caught, position, &timer, timeout_ms)
        }
    }
}

/// What `scan_text_columns` read: how many rows, and each column's non-NULL values in scan order.
pub struct Scanned {
    pub rows: usize,
    pub columns: Vec<Vec<String>>,
}

/// The values of `columns` (SQL expressions of text type) in the first `limit` rows of
/// `table`, read like a generated query (guarded, read-only, as the caller) in one result row:
/// the server aggregates them into arrays, so a wide scan costs one row, not one per table row.
/// Values longer than `max_chars` are left out when it is given. `None` when the read failed.
pub fn scan_text_columns(
    table: &str,
    columns: &[&str],
    limit: usize,
    max_chars: Option<usize>,
    timeout_ms: i32,
) -> Option<Scanned> {
    let inner: Vec<String> = columns
        .iter()
        .enumerate()
        .map(|(i, column)| format!("{column} AS v{i}"))
        .collect();
    let outer: Vec<String> = (0..columns.len())
        .map(|i| match max_chars {
            Some(max) => format!(
                "pg_catalog.array_agg(v{i}) FILTER (WHERE pg_catalog.length(v{i}) <= {max}) AS v{i}"
            ),
            None => format!("pg_catalog.array_agg(v{i}) AS v{i}"),
        })
        .collect();
    let sql = format!(
        "SELECT pg_catalog.count(*) AS n, {} FROM (SELECT {} FROM {table} LIMIT {limit}) s",
        outer.join(", "),
        inner.join(", ")
    );
    let Outcome::Rows(result) = attempt(&sql, Mode::Run { max_rows: 1 }, timeout_ms) else {
        return None;
    };
    let row: serde_json::Value = serde_json::from_str(result.rows.first()?).ok()?;
    let values = |i: usize| -> Vec<String> {
        row[format!("v{i}")]
            .as_array()
            .map_or(&[][..], Vec::as_slice)
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    };
    Some(Scanned {
        rows: row["n"].as_u64().map_or(0, |n| n as usize),
        columns: (0..columns.len()).map(values).collect(),
    })
}

/// Turns a caught error into the attempt's outcome, or re-raises it when it is not the query's
/// fault.
fn failure(
    caught: CaughtError,
    position: Option<i32>,
    timer: &StatementTimer,
    timeout_ms: i32,
) -> Outcome {
    let report = match &caught {
        CaughtError::PostgresError(r)
        | CaughtError::ErrorReport(r)
        | CaughtError::RustPanic { ereport: r, .. } => r,
    };
    let sqlstate = SqlState::from_code(report.sql_error_code());
    let ours = sqlstate == SqlState::QUERY_CANCELED && timer.fired();
    let not_the_query = matches!(caught, CaughtError::RustPanic { .. })
        || (!ours && ["53", "57", "58", "XX"].contains(&sqlstate.class()));
    if not_the_query {
        caught.rethrow();
    }
    let mut error = SqlError {
        sqlstate,
        message: report.message().to_string(),
        detail: report.detail().map(str::to_string),
        hint: report.hint().map(str::to_string),
        position,
    };
    if ours {
        error.hint = Some(format!(
            "The query ran longer than sql_query_engine.statement_timeout ({timeout_ms} ms)."
        ));
    }
    Outcome::Failed(error)
}

/// Everything that happens inside the subtransaction.
fn run_guarded(sql: &str, mode: Mode) -> Outcome {
    subxact::set_local(c"transaction_read_only", c"on");
    let checked = match guard::check(sql) {
        Ok(checked) => checked,
        Err(refusal) => return Outcome::Refused(refusal),
    };
    unsafe {
        // Like SPI for a non-read-only call: see what the caller's statement did so far.
        pg_sys::CommandCounterIncrement();
        let rewritten = PgList::<pg_sys::Query>::from_pg(pg_sys::pg_rewrite_query(checked.query));
        let Some(query) = rewritten.get_ptr(0).filter(|_| rewritten.len() == 1) else {
            return Outcome::Refused(guard::Refusal {
                error: SqlError::new(
                    SqlState::INSUFFICIENT_PRIVILEGE,
                    "the query was rewritten into several statements (rules): it is not run",
                ),
                ends_run: false,
            });
        };
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
        let planned = pg_sys::pg_plan_query(
            query,
            checked.text.as_ptr(),
            pg_sys::CURSOR_OPT_PARALLEL_OK as i32,
            std::ptr::null_mut(),
        );
        let outcome = match mode {
            Mode::Plan => Outcome::Planned,
            Mode::Run { .. } | Mode::Cursor { .. } => {
                let mut result = execute(planned, &checked.text, mode);
                if result.rows.is_empty() && result.stored == 0 {
                    result.row_security = row_security_tables(&checked.relations);
                    Outcome::Empty(result)
                } else {
                    Outcome::Rows(result)
                }
            }
        };
        pg_sys::PopActiveSnapshot();
        outcome
    }
}

/// Runs a planned SELECT to completion or until `max_rows + 1` rows were seen.
unsafe fn execute(planned: *mut pg_sys::PlannedStmt, text: &CStr, mode: Mode) -> ResultSet {
    let (max_rows, portal) = match mode {
        Mode::Cursor { portal, max_rows } => (max_rows, Some(portal)),
        Mode::Run { max_rows } => (max_rows, None),
        Mode::Plan => (0, None),
    };
    let mut collector = Collector {
        max_rows,
        portal,
        result: ResultSet::default(),
        record: std::ptr::null_mut(),
        to_jsonb: std::mem::zeroed(),
        jsonb_out: pg_sys::InvalidOid,
        per_row: std::ptr::null_mut(),
    };
    let mut receiver = Receiver {
        base: pg_sys::DestReceiver {
            receiveSlot: Some(receive_slot),
            rStartup: Some(startup),
            rShutdown: Some(shutdown),
            rDestroy: Some(shutdown),
            mydest: pg_sys::CommandDest::DestNone,
        },
        collector: &mut collector,
    };
    let query = pg_sys::CreateQueryDesc(
        planned,
        text.as_ptr(),
        pg_sys::GetActiveSnapshot(),
        std::ptr::null_mut(),
        &mut receiver.base,
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        0,
    );
    pg_sys::ExecutorStart(query, 0);
    pg_sys::ExecutorRun(query, pg_sys::ScanDirection::ForwardScanDirection, 0, true);
    collector.result.parallel_workers = launched_workers((*query).planstate);
    pg_sys::ExecutorFinish(query);
    pg_sys::ExecutorEnd(query);
    // The receiver's memory (record descriptor, per-row context) lived in the executor's
    // query context, which ExecutorEnd has freed.
    pg_sys::FreeQueryDesc(query);
    collector.result
}

/// Parallel workers launched by the Gather nodes of a plan.
unsafe fn launched_workers(node: *mut pg_sys::PlanState) -> i32 {
    if node.is_null() {
        return 0;
    }
    let here = match (*node).type_ {
        pg_sys::NodeTag::T_GatherState => (*node.cast::<pg_sys::GatherState>()).nworkers_launched,
        pg_sys::NodeTag::T_GatherMergeState => {
            (*node.cast::<pg_sys::GatherMergeState>()).nworkers_launched
        }
        _ => 0,
    };
    here + launched_workers((*node).lefttree) + launched_workers((*node).righttree)
}

/// A DestReceiver with the Rust side of it behind a pointer (PostgreSQL sees only `base`).
#[repr(C)]
struct Receiver {
    base: pg_sys::DestReceiver,
    collector: *mut Collector,
}

/// Where the rows go: jsonb text, one object per row, keys the column names. Each row goes
/// through PostgreSQL's own `to_jsonb` on a record whose descriptor is a copy of the result's,
/// with duplicate names made unique so no column is lost.
struct Collector {
    max_rows: usize,
    /// The cursor the rows go to, instead of `result.rows`.
    portal: Option<pg_sys::Portal>,
    result: ResultSet,
    record: pg_sys::TupleDesc,
    to_jsonb: pg_sys::FmgrInfo,
    jsonb_out: pg_sys::Oid,
    /// Reset after every row: a large result does not grow memory beyond its text. A child of
    /// the executor's query context (where `startup` runs), freed with it.
    per_row: pg_sys::MemoryContext,
}

unsafe fn collector(receiver: *mut pg_sys::DestReceiver) -> &'static mut Collector {
    &mut *(*receiver.cast::<Receiver>()).collector
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn startup(
    receiver: *mut pg_sys::DestReceiver,
    _operation: std::ffi::c_int,
    source: pg_sys::TupleDesc,
) {
    let c = collector(receiver);
    if let Some(portal) = c.portal {
        // The cursor's row type, in the portal's memory: it outlives this execution.
        let caller = pg_sys::MemoryContextSwitchTo((*portal).portalContext);
        (*portal).tupDesc = pg_sys::CreateTupleDescCopy(source);
        pg_sys::MemoryContextSwitchTo(caller);
    }
    let natts = (*source).natts as usize;
    let names: Vec<String> = (*source)
        .attrs
        .as_slice(natts)
        .iter()
        .map(|attr| {
            CStr::from_ptr(attr.attname.data.as_ptr())
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    c.result.columns = unique_names(&names);
    let record = pg_sys::CreateTupleDescCopy(source);
    for (i, name) in c.result.columns.iter().enumerate() {
        if let Ok(name) = CString::new(name.as_str()) {
            pg_sys::namestrcpy(
                &mut (*record).attrs.as_mut_slice(natts)[i].attname,
                name.as_ptr(),
            );
        }
    }
    c.record = pg_sys::BlessTupleDesc(record);

    let to_jsonb = pg_sys::fmgr_internal_function(c"to_jsonb".as_ptr());
    pg_sys::fmgr_info(to_jsonb, &mut c.to_jsonb);
    // to_jsonb is polymorphic: it learns its argument type from the call expression.
    let mut args = PgList::<pg_sys::Const>::new();
    args.push(pg_sys::makeNullConst(
        pg_sys::RECORDOID,
        -1,
        pg_sys::InvalidOid,
    ));
    c.to_jsonb.fn_expr = pg_sys::makeFuncExpr(
        to_jsonb,
        pg_sys::JSONBOID,
        args.into_pg(),
        pg_sys::InvalidOid,
        pg_sys::InvalidOid,
        pg_sys::CoercionForm::COERCE_EXPLICIT_CALL,
    )
    .cast();
    let mut is_varlena = false;
    pg_sys::getTypeOutputInfo(pg_sys::JSONBOID, &mut c.jsonb_out, &mut is_varlena);
    c.per_row = pg_sys::AllocSetContextCreateInternal(
        pg_sys::CurrentMemoryContext,
        c"sql_query_engine row".as_ptr(),
        pg_sys::ALLOCSET_SMALL_MINSIZE as usize,
        pg_sys::ALLOCSET_SMALL_INITSIZE as usize,
        pg_sys::ALLOCSET_SMALL_MAXSIZE as usize,
    );
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn receive_slot(
    slot: *mut pg_sys::TupleTableSlot,
    receiver: *mut pg_sys::DestReceiver,
) -> bool {
    let c = collector(receiver);
    if c.result.rows.len() + c.result.stored >= c.max_rows {
        // One row more than may be returned: the result is cut, and the executor stops here.
        c.result.truncated = true;
        return false;
    }
    if let Some(portal) = c.portal {
        // As PostgreSQL fills a held cursor: under the portal's resource owner, so that a
        // spilled store outlives this subtransaction.
        let owner = pg_sys::CurrentResourceOwner;
        pg_sys::CurrentResourceOwner = (*portal).resowner;
        pg_sys::tuplestore_puttupleslot((*portal).holdStore, slot);
        pg_sys::CurrentResourceOwner = owner;
        c.result.stored += 1;
        return true;
    }
    let caller = pg_sys::MemoryContextSwitchTo(c.per_row);
    pg_sys::slot_getallattrs(slot);
    let tuple = pg_sys::heap_form_tuple(c.record, (*slot).tts_values, (*slot).tts_isnull);
    let composite = pg_sys::heap_copy_tuple_as_datum(tuple, c.record);
    let jsonb = pg_sys::FunctionCall1Coll(&mut c.to_jsonb, pg_sys::InvalidOid, composite);
    let text = pg_sys::OidOutputFunctionCall(c.jsonb_out, jsonb);
    c.result
        .rows
        .push(CStr::from_ptr(text).to_string_lossy().into_owned());
    pg_sys::MemoryContextSwitchTo(caller);
    pg_sys::MemoryContextReset(c.per_row);
    true
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn shutdown(_receiver: *mut pg_sys::DestReceiver) {}

/// A new cursor `name` of the caller's transaction, with an empty hold store to run a query
/// into (`Mode::Cursor`); `None` when a cursor of that name exists.
pub fn new_cursor(name: &str, sql: &str) -> Option<pg_sys::Portal> {
    let (Ok(name), Ok(sql)) = (CString::new(name), CString::new(sql)) else {
        return None;
    };
    unsafe {
        if !pg_sys::GetPortalByName(name.as_ptr()).is_null() {
            return None;
        }
        let portal = pg_sys::CreatePortal(name.as_ptr(), false, false);
        let text = pg_sys::MemoryContextStrdup((*portal).portalContext, sql.as_ptr());
        pg_sys::PortalDefineQuery(
            portal,
            std::ptr::null(),
            text,
            pg_sys::CommandTag::CMDTAG_SELECT,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        (*portal).cursorOptions = pg_sys::CURSOR_OPT_SCROLL as i32;
        pg_sys::PortalCreateHoldStore(portal);
        Some(portal)
    }
}

/// Makes a filled cursor ready to FETCH from (from its store, like a held cursor), or drops it
/// when the query did not run.
pub fn finish_cursor(portal: pg_sys::Portal, ran: bool) {
    unsafe {
        if ran && !(*portal).tupDesc.is_null() {
            (*portal).strategy = pg_sys::PortalStrategy::PORTAL_ONE_SELECT;
            (*portal).atStart = true;
            (*portal).atEnd = false;
            (*portal).portalPos = 0;
            (*portal).status = pg_sys::PortalStatus::PORTAL_READY;
        } else {
            pg_sys::PortalDrop(portal, false);
        }
    }
}

/// The relations among `relations` on which row-level security applies to the current role.
unsafe fn row_security_tables(relations: &[pg_sys::Oid]) -> Vec<String> {
    let mut tables: Vec<String> = Vec::new();
    for &relid in relations {
        let applies = pg_sys::check_enable_rls(relid, pg_sys::InvalidOid, true)
            == pg_sys::CheckEnableRlsResult::RLS_ENABLED as i32;
        let name = pg_sys::get_rel_name(relid);
        if applies && !name.is_null() {
            let name = CStr::from_ptr(name).to_string_lossy().into_owned();
            if !tables.contains(&name) {
                tables.push(name);
            }
        }
    }
    tables
}

/// `a, b, a` becomes `a, b, a_2`: jsonb objects cannot hold a key twice.
fn unique_names(names: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(names.len());
    for name in names {
        let mut candidate = name.clone();
        let mut n = 2;
        while out.contains(&candidate) || (candidate != *name && names.contains(&candidate)) {
            candidate = format!("{name}_{n}");
            n += 1;
        }
        out.push(candidate);
    }
    out
}

/// Error-context callback: remembers the cursor position of the error being reported, which
/// the caught error report does not carry. SPI's own callback (which runs first) moves the
/// position of its query into the "internal" position, so that one is read too.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn record_error_position(arg: *mut std::ffi::c_void) {
    let position = match pg_sys::geterrposition() {
        p if p > 0 => p,
        _ => pg_sys::getinternalerrposition(),
    };
    if position > 0 && !arg.is_null() {
        (*arg.cast::<Cell<i32>>()).set(position);
    }
}

// utils/timeout.h, which pgrx does not bind.
#[allow(non_snake_case)]
mod timeout {
    use pgrx::pg_sys::TimestampTz;
    /// `STATEMENT_TIMEOUT` in `enum TimeoutId` (the same position in PostgreSQL 13 to 18).
    pub const STATEMENT_TIMEOUT: u32 = 3;
    unsafe extern "C-unwind" {
        pub fn enable_timeout_after(id: u32, delay_ms: std::ffi::c_int);
        pub fn enable_timeout_at(id: u32, fin_time: TimestampTz);
        pub fn disable_timeout(id: u32, keep_indicator: bool);
        pub fn get_timeout_active(id: u32) -> bool;
        pub fn get_timeout_finish_time(id: u32) -> TimestampTz;
    }
}

/// The per-attempt deadline. `SET LOCAL statement_timeout` would not apply to statements run
/// inside this call, so the statement timer is armed directly, and the caller's own deadline is
/// put back afterwards. When the caller's deadline comes first it is left alone: then a
/// timeout is the caller's and is re-raised.
struct StatementTimer {
    ours: Option<pg_sys::TimestampTz>,
    caller: Option<pg_sys::TimestampTz>,
}

impl StatementTimer {
    unsafe fn arm(timeout_ms: i32) -> Self {
        use timeout::*;
        let now = pg_sys::GetCurrentTimestamp();
        let ours = now + i64::from(timeout_ms) * 1000;
        let caller = pg_sys::ffi::pg_guard_ffi_boundary(|| {
            get_timeout_active(STATEMENT_TIMEOUT)
                .then(|| get_timeout_finish_time(STATEMENT_TIMEOUT))
        });
        if caller.is_some_and(|c| c <= ours) {
            return StatementTimer { ours: None, caller };
        }
        pg_sys::ffi::pg_guard_ffi_boundary(|| enable_timeout_after(STATEMENT_TIMEOUT, timeout_ms));
        StatementTimer {
            ours: Some(ours),
            caller,
        }
    }

    unsafe fn disarm(&self) {
        use timeout::*;
        if self.ours.is_none() {
            return;
        }
        pg_sys::ffi::pg_guard_ffi_boundary(|| disable_timeout(STATEMENT_TIMEOUT, false));
        if let Some(caller) = self.caller {
            pg_sys::ffi::pg_guard_ffi_boundary(|| enable_timeout_at(STATEMENT_TIMEOUT, caller));
        }
    }

    /// Whether a statement timeout now is ours (our deadline passed, the caller's did not).
    fn fired(&self) -> bool {
        let now = unsafe { pg_sys::GetCurrentTimestamp() };
        self.ours.is_some_and(|ours| now >= ours - 1000) && self.caller.is_none_or(|c| now < c)
    }
}

#[cfg(test)]
mod tests {
    use super::unique_names;

    #[test]
    fn duplicate_column_names_become_unique() {
        let names: Vec<String> = ["a", "b", "a", "a_2", "a"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(unique_names(&names), ["a", "b", "a_3", "a_2", "a_4"]);
    }
}
