//! Feedback on answers (`nl_feedback`): what a deployment learns from its users. A recorded
//! answer marked right, or a corrected query, becomes a verified example of that question
//! when the caller may write examples, and waits for review otherwise; every piece of
//! feedback is kept in `nl_feedback` with who, when and which answer.
//!
//! Everything runs as the caller: the history row is read under its row security (a role
//! sees only its own answers), a correction runs through the guard and the sandbox like any
//! query of the caller's, and both writes are statements of the caller's transaction.

use pgrx::prelude::*;
use serde_json::json;

use crate::error::{Error, Result};
use crate::exec::{self, Mode};
use crate::{arguments, examples, settings, store, subxact, templates};

/// What feedback became.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    /// A verified example now.
    Promoted,
    /// Vouched for, by a role that may not write examples: for review.
    Pending,
    /// Marked wrong without a correction.
    Noted,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Promoted => "promoted",
            Status::Pending => "pending",
            Status::Noted => "noted",
        }
    }
}

/// The answer `history_id` of the caller's own history, as feedback needs it: its question,
/// SQL and status (row security shows only the caller's own answers).
pub struct Answer(serde_json::Value);

impl Answer {
    /// The SQL that feedback on this answer runs: `corrected`, or, when it is marked correct
    /// without one, the answer's own if it returned rows.
    pub fn vouched<'a>(&'a self, correct: bool, corrected: Option<&'a str>) -> Option<&'a str> {
        match corrected.filter(|sql| !sql.trim().is_empty()) {
            Some(sql) => Some(sql),
            None if correct => self.0["sql"].as_str().filter(|_| self.0["status"] == "ok"),
            None => None,
        }
    }
}

/// Characters of a recorded question or SQL read, one past the longest that is accepted: the
/// caller may write its own history rows any length, and longer ones are refused, not copied
/// (a status, of four short words, is read as its first 16 characters).
fn cut_after(max: usize) -> i32 {
    i32::try_from(max.saturating_add(1)).unwrap_or(i32::MAX)
}

/// Reads the answer `history_id` of the caller's own history.
pub fn answer(history_id: i64) -> Result<Answer> {
    let schema = store::extension_schema()?;
    // The caller's own rows by their role, not by row security alone, which a superuser, the
    // table's owner and a BYPASSRLS role pass: another role's row (one it wrote itself, any
    // SQL) would be run as theirs and promoted in their name.
    let answer = subxact::pinned(|| {
        store::read_one::<pgrx::JsonB>(
            &format!(
                "SELECT (SELECT pg_catalog.jsonb_build_object(\
                 'question', pg_catalog.left(question, $2), 'sql', pg_catalog.left(sql, $3), \
                 'status', pg_catalog.left(status, 16)) FROM {schema}.nl_history \
                 WHERE id = $1 AND role_id = $4)"
            ),
            &[
                history_id.into(),
                cut_after(arguments::MAX_QUESTION_CHARS).into(),
                cut_after(arguments::MAX_SQL_CHARS).into(),
                // SAFETY: reads the backend's current role.
                unsafe { pgrx::pg_sys::GetUserId() }.into(),
            ],
        )
    })
    .map_err(|e| Error::internal(format!("reading the answer failed: {e}")))?
    .ok_or_else(|| {
        Error::sql(
            "42704",
            format!("there is no answer {history_id} in your history"),
            Some("nl_ask returns history_id; nl_history lists your answers."),
        )
    })?
    .0;
    Ok(Answer(answer))
}

/// Records feedback on `answer` (of `history_id`): `correct`, or a `corrected` query (which
/// must pass the guard and return rows). Returns `{feedback_id, status, example_id}`.
pub fn give(
    history_id: i64,
    answer: &Answer,
    correct: bool,
    corrected: Option<&str>,
) -> Result<serde_json::Value> {
    if !store::writable() {
        return Err(Error::sql(
            "25006",
            "nl_feedback records feedback: it cannot run in a read-only transaction",
            None,
        ));
    }
    let schema = store::extension_schema()?;
    let question = answer.0["question"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // The recorded SQL is only the caller's word (it may write its own history rows): it runs
    // as a correction does.
    arguments::question(&question)?;
    let vouched = match answer.vouched(correct, corrected) {
        Some(sql) => {
            arguments::sql(sql)?;
            // A correction is the caller's own SQL; the answer's is the model's, which may read
            // only the caller's schema context, as when it answered (a relation made since
            // under a name it reads, ahead on the search path, would run its owner's code).
            let own = corrected.is_some_and(|c| !c.trim().is_empty());
            returns_rows(sql, !own)?;
            Some(sql.to_string())
        }
        None if correct => {
            return Err(Error::sql(
                "22023",
                format!(
                    "answer {history_id} returned no rows, so there is nothing to mark correct"
                ),
                Some("Pass the query that answers it: nl_feedback(id, true, 'SELECT ...')."),
            ))
        }
        None => None,
    };
    let (status, example_id) = match &vouched {
        None => (Status::Noted, None),
        Some(sql) if may_write_examples(&schema)? => {
            // Promoted, the question is an example like one `nl_example_add` stores: its
            // braces mark parameters, by the same rule, and it shows all it holds.
            arguments::example_question(&question)?;
            arguments::example_sql(sql)?;
            templates::check_marks(&question, sql).map_err(Error::InvalidParameter)?;
            (
                Status::Promoted,
                Some(examples::add_from_history(&question, sql, history_id)?),
            )
        }
        Some(_) => (Status::Pending, None),
    };
    let feedback_id = subxact::pinned(|| {
        Spi::connect_mut(|client| {
            client
                .update(
                    &format!(
                        "INSERT INTO {schema}.nl_feedback \
                         (history_id, question, correct, sql, status, example_id) \
                         VALUES ($1, $2, $3, $4, $5, $6) RETURNING id"
                    ),
                    Some(1),
                    &[
                        history_id.into(),
                        question.as_str().into(),
                        correct.into(),
                        vouched.as_deref().into(),
                        status.as_str().into(),
                        example_id.into(),
                    ],
                )?
                .first()
                .get_one::<i64>()
        })
    })
    .map_err(|e| Error::internal(format!("recording the feedback failed: {e}")))?;
    Ok(json!({
        "feedback_id": feedback_id,
        "status": status.as_str(),
        "example_id": example_id,
    }))
}

/// Whether the caller may add verified examples (INSERT on `nl_examples`).
fn may_write_examples(schema: &str) -> Result<bool> {
    subxact::pinned(|| {
        store::read_one::<bool>(
            "SELECT pg_catalog.has_table_privilege(($1 || '.nl_examples')::pg_catalog.regclass, \
             'INSERT')",
            &[schema.into()],
        )
    })
    .map_err(|e| Error::internal(format!("checking the examples' privileges failed: {e}")))
    .map(|may| may.unwrap_or(false))
}

/// What feedback vouches for must pass the guard and answer with rows, run as any query of the
/// caller's; `scoped`, as a query of the model's (within the caller's schema context).
fn returns_rows(sql: &str, scoped: bool) -> Result<()> {
    let mode = Mode::Run(exec::Limits::from_settings());
    let timeout = settings::statement_timeout_ms();
    let outcome = if scoped {
        let (context, _) = crate::schema::load()?;
        exec::attempt_in_loop(sql, mode, timeout, Some(&context.scope()), false)
    } else {
        exec::attempt(sql, mode, timeout)
    };
    let result = outcome.into_result()?;
    if result.is_some_and(|r| r.rows.is_empty()) {
        return Err(Error::sql(
            "22023",
            "the query returns no rows: an example must answer its question",
            None,
        ));
    }
    Ok(())
}
