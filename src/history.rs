//! Recording calls in `nl_history` (see `sql/history.sql`). Best effort and never in the way:
//! skipped (with a DEBUG message) in a read-only transaction or on a standby, written in a
//! subtransaction whose failure is swallowed, and with a short lock timeout so that it never
//! blocks the answer.

use pgrx::prelude::*;

use crate::exec;
use crate::heal::Run;
use crate::{schema, settings};

/// Longest wait for a lock on the history table.
const LOCK_TIMEOUT: &std::ffi::CStr = c"100ms";

/// Records one call of `function` (`nl_query`, ...).
pub fn record(function: &str, session: Option<&str>, run: &Run) {
    if !settings::history() {
        return;
    }
    if unsafe { pg_sys::XactReadOnly || pg_sys::RecoveryInProgress() } {
        debug1!("sql_query_engine: history not recorded: the transaction is read-only");
        return;
    }
    let Ok(schema) = schema::extension_schema() else {
        return;
    };
    let clamp = |n: u64| n.min(i32::MAX as u64) as i32;
    let sql = format!(
        "INSERT INTO {schema}.nl_history (function, session, question, sql, status, attempts, \
         row_count, ms, llm_calls, prompt_tokens, completion_tokens) \
         VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9, $10, $11)"
    );
    let attempts = run.trace()["attempts"].to_string();
    let row_count = run.best_result().map(|r| clamp(r.rows.len() as u64));
    let result = exec::in_subtransaction(true, || unsafe {
        // Like a function's SET clause: the lock timeout lasts until the end of this write.
        let level = pg_sys::NewGUCNestLevel();
        pg_sys::set_config_option(
            c"lock_timeout".as_ptr(),
            LOCK_TIMEOUT.as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_SAVE,
            true,
            0,
            false,
        );
        let inserted = Spi::connect_mut(|client| {
            client
                .update(
                    sql.as_str(),
                    None,
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
                    ],
                )
                .map(|_| ())
        });
        pg_sys::AtEOXact_GUC(true, level);
        inserted
    });
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => debug1!("sql_query_engine: history not recorded: {e}"),
        Err(caught) => debug1!("sql_query_engine: history not recorded: {caught:?}"),
    }
}
