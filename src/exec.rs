//! Running one generated query safely: guarded, in an internal subtransaction that is always
//! rolled back, read-only, under a per-attempt statement timeout and a row cap. Any error is
//! caught whole (SQLSTATE, message, detail, hint, position) and the caller's transaction goes
//! on as if nothing happened. Rows leave as jsonb built by PostgreSQL itself (`to_jsonb`), so
//! numerics keep their scale and dates render as PostgreSQL renders them.

use std::cell::Cell;
use std::ffi::{CStr, CString};
use std::panic::AssertUnwindSafe;

use pgrx::pg_sys::panic::CaughtError;
use pgrx::pg_sys::{self, PgTryBuilder};
use pgrx::PgList;

use crate::error::{code_to_sqlstate, SqlError};
use crate::guard;

/// What an attempt is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Run the query and keep at most this many rows.
    Run { max_rows: usize },
    /// Only plan it (`nl_generate`): the query is analyzed and planned, never executed.
    Plan,
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
        let result = in_subtransaction(false, || run_guarded(sql, mode));
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

/// Runs `work` in an internal subtransaction, committed when `commit` and the work succeeded,
/// rolled back otherwise; any error is caught and returned, and the caller's transaction, memory
/// context and resource owner are as they were.
pub fn in_subtransaction<R>(commit: bool, work: impl FnOnce() -> R) -> Result<R, Box<CaughtError>> {
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
    let sqlstate = code_to_sqlstate(report.sql_error_code());
    let ours = sqlstate == "57014" && timer.fired();
    let not_the_query = matches!(caught, CaughtError::RustPanic { .. })
        || (!ours
            && ["53", "57", "58", "XX"]
                .iter()
                .any(|class| sqlstate.starts_with(class)));
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
    unsafe {
        pg_sys::set_config_option(
            c"transaction_read_only".as_ptr(),
            c"on".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_LOCAL,
            true,
            0,
            false,
        );
    }
    let checked = match guard::check(sql) {
        Ok(checked) => checked,
        Err(refusal) => return Outcome::Refused(refusal),
    };
    // guard::check refused NUL characters already.
    let Ok(text) = CString::new(sql) else {
        return Outcome::Refused(guard::Refusal {
            error: SqlError::new("22021", "the query contains a NUL character"),
            ends_run: false,
        });
    };
    unsafe {
        pg_sys::SPI_connect();
        let plan = pg_sys::SPI_prepare(text.as_ptr(), 0, std::ptr::null_mut());
        if plan.is_null() {
            let code = pg_sys::SPI_result;
            pg_sys::SPI_finish();
            return Outcome::Failed(SqlError::new(
                "XX000",
                format!("SPI_prepare failed with code {code}"),
            ));
        }
        let outcome = match mode {
            Mode::Plan => {
                let cached = pg_sys::SPI_plan_get_cached_plan(plan);
                if !cached.is_null() {
                    pg_sys::ReleaseCachedPlan(cached, std::ptr::null_mut());
                }
                Outcome::Planned
            }
            Mode::Run { max_rows } => {
                let limit = max_rows.saturating_add(1).min(i64::MAX as usize) as std::ffi::c_long;
                pg_sys::SPI_execute_plan(
                    plan,
                    std::ptr::null_mut(),
                    std::ptr::null(),
                    false,
                    limit,
                );
                let mut result = collect_rows(max_rows);
                if result.rows.is_empty() {
                    result.row_security = row_security_tables(&checked.relations);
                    Outcome::Empty(result)
                } else {
                    Outcome::Rows(result)
                }
            }
        };
        pg_sys::SPI_finish();
        outcome
    }
}

/// Converts the rows SPI just produced into jsonb text, one object per row, keys the column
/// names. Each row goes through PostgreSQL's own `to_jsonb` on a record whose descriptor is a
/// copy of the result's, with duplicate names made unique so no column is lost.
unsafe fn collect_rows(max_rows: usize) -> ResultSet {
    let table = pg_sys::SPI_tuptable;
    if table.is_null() {
        return ResultSet::default();
    }
    let source = (*table).tupdesc;
    let natts = (*source).natts as usize;
    let names: Vec<String> = (0..natts)
        .map(|i| {
            let attr = (*source).attrs.as_slice(natts)[i];
            CStr::from_ptr(attr.attname.data.as_ptr())
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let columns = unique_names(&names);

    let record = pg_sys::CreateTupleDescCopy(source);
    for (i, name) in columns.iter().enumerate() {
        if let Ok(name) = CString::new(name.as_str()) {
            pg_sys::namestrcpy(
                &mut (*record).attrs.as_mut_slice(natts)[i].attname,
                name.as_ptr(),
            );
        }
    }
    let record = pg_sys::BlessTupleDesc(record);

    let to_jsonb = pg_sys::fmgr_internal_function(c"to_jsonb".as_ptr());
    let mut flinfo: pg_sys::FmgrInfo = std::mem::zeroed();
    pg_sys::fmgr_info(to_jsonb, &mut flinfo);
    // to_jsonb is polymorphic: it learns its argument type from the call expression.
    let mut args = PgList::<pg_sys::Const>::new();
    args.push(pg_sys::makeNullConst(
        pg_sys::RECORDOID,
        -1,
        pg_sys::InvalidOid,
    ));
    flinfo.fn_expr = pg_sys::makeFuncExpr(
        to_jsonb,
        pg_sys::JSONBOID,
        args.into_pg(),
        pg_sys::InvalidOid,
        pg_sys::InvalidOid,
        pg_sys::CoercionForm::COERCE_EXPLICIT_CALL,
    )
    .cast();
    let mut jsonb_out = pg_sys::InvalidOid;
    let mut is_varlena = false;
    pg_sys::getTypeOutputInfo(pg_sys::JSONBOID, &mut jsonb_out, &mut is_varlena);

    let processed = pg_sys::SPI_processed as usize;
    let kept = processed.min(max_rows);
    let mut rows = Vec::with_capacity(kept);
    for i in 0..kept {
        let tuple = *(*table).vals.add(i);
        let composite = pg_sys::heap_copy_tuple_as_datum(tuple, record);
        let jsonb = pg_sys::FunctionCall1Coll(&mut flinfo, pg_sys::InvalidOid, composite);
        let text = pg_sys::OidOutputFunctionCall(jsonb_out, jsonb);
        rows.push(CStr::from_ptr(text).to_string_lossy().into_owned());
        pg_sys::pfree(text.cast());
    }
    ResultSet {
        columns,
        rows,
        truncated: processed > max_rows,
        row_security: Vec::new(),
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
