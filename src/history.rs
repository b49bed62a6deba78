//! The audit: calls recorded in `nl_history` (see `sql/history.sql`), and in the server log
//! (`audit`, one line per call by default), which keeps what a rollback or a read-only
//! transaction takes away. The history is best effort and never in the way:
//! skipped (with a DEBUG message) in a read-only transaction or on a standby, written in a
//! subtransaction whose failure is swallowed, and with a short lock timeout so that it never
//! blocks the answer.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::{PgLogLevel, PgSqlErrorCode};

use crate::error::Error;
use crate::heal::Run;
use crate::settings::AuditLog;
use crate::{names, settings, store, trace};

/// Records one call of `function` (`nl_query`, ...); returns its `nl_history` id when it was
/// written.
pub fn record(function: &str, session: Option<&str>, run: &Run) -> Option<i64> {
    if !settings::history() {
        return None;
    }
    if !store::writable() {
        debug1!("sql_query_engine: history not recorded: the transaction is read-only");
        return None;
    }
    let schema = store::extension_schema().ok()?;
    let clamp = |n: u64| n.min(i32::MAX as u64) as i32;
    let sql = format!(
        "INSERT INTO {schema}.nl_history (function, session, question, sql, status, attempts, \
         row_count, ms, llm_calls, prompt_tokens, completion_tokens, role_id) \
         VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9, $10, $11, $12) RETURNING id"
    );
    let attempts = trace::attempts(run).to_string();
    let row_count = run.best_result().map(|r| clamp(r.rows.len() as u64));
    store::write_best_effort("history", |client| {
        client
            .update(
                sql.as_str(),
                Some(1),
                &[
                    function.into(),
                    session.into(),
                    run.question.as_str().into(),
                    run.final_sql().into(),
                    run.status.as_str().into(),
                    attempts.as_str().into(),
                    row_count.into(),
                    run.ms.into(),
                    (run.llm_calls as i32).into(),
                    clamp(run.prompt_tokens).into(),
                    clamp(run.completion_tokens).into(),
                    // SAFETY: reads the backend's current role.
                    unsafe { pg_sys::GetUserId() }.into(),
                ],
            )?
            .first()
            .get_one::<i64>()
    })
    .flatten()
}

/// How a call ended, as the audit line says it.
pub enum Audited<'a> {
    /// A question answered (its status, rows and final SQL).
    Answered(&'a Run),
    /// A call without a run (`nl_check`, `nl_run`, `nl_schema`, ...) that succeeded.
    Done,
    Failed(&'a Error),
}

/// Writes one call to the server log (`sql_query_engine.audit_log`, by default every call), as
/// `LOG` that is never sent to the client: neither the caller's rollback (which takes the
/// `nl_history` row with it) nor a read-only transaction or a standby (where no row is
/// written) removes it. `input` is the question, or the caller's SQL.
pub fn audit(function: &str, session: Option<&str>, input: &str, outcome: Audited) {
    let wanted = match settings::audit_log() {
        AuditLog::Off => false,
        AuditLog::Errors => matches!(outcome, Audited::Failed(_)),
        AuditLog::All => true,
    };
    if !wanted {
        return;
    }
    // SAFETY: reads the backend's current role.
    let role_id = unsafe { pg_sys::GetUserId() };
    let role = names::role_name(role_id).unwrap_or_default();
    let (result, sql) = match outcome {
        Audited::Answered(run) => (
            format!(
                "{}{}, {} attempt{}",
                run.status.as_str(),
                run.best_result()
                    .map(|r| format!(", {} rows", r.rows.len()))
                    .unwrap_or_default(),
                run.attempts.len(),
                if run.attempts.len() == 1 { "" } else { "s" }
            ),
            run.final_sql(),
        ),
        Audited::Done => ("ok".to_string(), None),
        Audited::Failed(error) => (format!("ERROR {}: {error}", error.sqlstate()), None),
    };
    let session = session
        .map(|s| format!(" session {s:?}"))
        .unwrap_or_default();
    let detail = match sql {
        Some(sql) => format!("input: {input}\nsql: {sql}"),
        None => format!("input: {input}"),
    };
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_SUCCESSFUL_COMPLETION,
        format!(
            "sql_query_engine: {function} by role {role:?} (oid {}){session}: {result}",
            role_id.to_u32()
        ),
        "sql_query_engine",
    )
    .set_detail(detail)
    .report(PgLogLevel::LOG_SERVER_ONLY);
}

/// `result` audited as a call of `function` without a run, then returned.
pub fn audited<T>(
    function: &str,
    input: &str,
    result: crate::error::Result<T>,
) -> crate::error::Result<T> {
    match &result {
        Ok(_) => audit(function, None, input, Audited::Done),
        Err(error) => audit(function, None, input, Audited::Failed(error)),
    }
    result
}
