//! The trace of a run as `nl_trace` returns it and `nl_history` stores it: the API's view of the
//! heal loop's bookkeeping, built here at the edge so that the loop itself knows no JSON.

use serde_json::{json, Value};

use crate::heal::{Attempt, Run};
use crate::progress::Kind;
use crate::schema::PromptSchema;

/// The whole trace of `run`; `schema` and `values` add what the prompt showed, when known.
pub fn run(run: &Run, schema: Option<&PromptSchema>, values: Option<&str>) -> Value {
    let result = run.best_result();
    let mut trace = json!({
        "question": run.question,
        "sql": run.final_sql(),
        "status": run.status.as_str(),
        "row_count": result.map(|r| r.rows.len()),
        "truncated": result.is_some_and(|r| r.truncated),
        "cut_by": result.and_then(|r| r.cut_by),
        "columns": result.map(|r| &r.columns),
        "confirmed_empty": run.confirmed_empty,
        "answered_by": run.best_attempt().map(|a| a.kind.label()),
        "repairs": run.attempts.iter().filter(|a| matches!(a.kind, Kind::Repair { .. })).count(),
        "attempts": attempts(run),
        "llm_calls": run.llm_calls,
        "prompt_tokens": run.prompt_tokens,
        "completion_tokens": run.completion_tokens,
        "llm_failure": run.llm_failure.as_ref().map(|f| json!({
            "endpoint": f.endpoint, "cause": f.cause
        })),
        "out_of_time": run.out_of_time,
        "ms": run.ms,
    });
    trace["values"] = json!(values.map(|v| v.lines().collect::<Vec<_>>()));
    if let Some(vote) = &run.vote {
        let alternatives = run.alternatives().count();
        trace["vote"] = json!({
            "groups": vote.groups, "winner": vote.winner, "asked": vote.asked,
            "alternatives": alternatives,
            "agreed": vote.winner.map(|w| vote.groups[w]),
        });
    }
    if let Some(schema) = schema {
        trace["relations"] = json!(schema.relations);
        trace["schema_pruned"] = json!(schema.pruned);
        trace["schema_cached"] = json!(schema.cached);
    }
    trace
}

/// The rows of a result as arrays of values in the query's column order (jsonb objects do not
/// keep it).
pub fn rows_in_column_order(result: &crate::exec::ResultSet) -> Vec<Value> {
    result
        .rows
        .iter()
        .map(|row| {
            let object = parsed_row(row);
            Value::Array(
                result
                    .columns
                    .iter()
                    .map(|c| object.get(c).cloned().unwrap_or(Value::Null))
                    .collect(),
            )
        })
        .collect()
}

/// A row of a result (its JSON text), or the ERROR that it cannot be passed on, never a row of
/// NULLs (the sandbox already refuses values nested deeper than JSON is parsed here).
pub fn parsed_row(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| {
        crate::error::Error::sql(
            "54000",
            format!("a row of the result cannot be passed on: {e}"),
            Some("A value nested more than 128 levels deep cannot be; select less of it."),
        )
        .raise()
    })
}

/// Every attempt of `run`, in order.
pub fn attempts(run: &Run) -> Value {
    Value::Array(run.attempts.iter().map(attempt).collect())
}

fn attempt(attempt: &Attempt) -> Value {
    let outcome = &attempt.outcome;
    let (error, result) = (outcome.error(), outcome.result());
    json!({
        "sql": attempt.sql,
        "outcome": outcome.label(),
        "sqlstate": error.map(|e| e.sqlstate),
        "message": error.map(|e| &e.message),
        "detail": error.and_then(|e| e.detail.as_ref()),
        "hint": error.and_then(|e| e.hint.as_ref()),
        "position": error.and_then(|e| e.position),
        "row_count": result.map(|r| r.rows.len()),
        "truncated": result.is_some_and(|r| r.truncated),
        "cut_by": result.and_then(|r| r.cut_by),
        "row_security": result.map(|r| &r.row_security).filter(|t| !t.is_empty()),
        "parallel_workers": result.map(|r| r.parallel_workers),
        "kind": attempt.kind.label(),
        "candidate": attempt.kind.is_alternative(),
        "endpoint": attempt.endpoint,
        "endpoint_failures": attempt.endpoint_failures,
        "vote_group": attempt.group,
        "questioned": attempt.questioned,
        "requalified": attempt.requalified,
        "ms": attempt.ms,
        "llm_ms": attempt.llm_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{SqlError, SqlState};
    use crate::exec::{Outcome, ResultSet};
    use crate::heal::Status;

    #[test]
    fn the_trace_has_the_documented_shape() {
        let run = Run {
            question: "q?".into(),
            attempts: vec![
                Attempt {
                    sql: "SELECT bad".into(),
                    outcome: Outcome::Failed(SqlError::new(SqlState::UNDEFINED_COLUMN, "no")),
                    ms: 1.0,
                    llm_ms: 2.0,
                    kind: Kind::First,
                    group: None,
                    endpoint: "http://model".into(),
                    endpoint_failures: vec![],
                    questioned: vec![],
                    requalified: vec![],
                },
                Attempt {
                    sql: "SELECT good".into(),
                    outcome: Outcome::Rows(ResultSet {
                        columns: vec!["a".into()],
                        rows: vec!["{\"a\": 1}".into(); 2],
                        ..Default::default()
                    }),
                    ms: 1.0,
                    llm_ms: 2.0,
                    kind: Kind::Repair { n: 1, of: 4 },
                    group: None,
                    endpoint: "http://model".into(),
                    endpoint_failures: vec![],
                    questioned: vec![],
                    requalified: vec![],
                },
            ],
            best: Some(1),
            status: Status::Ok,
            confirmed_empty: false,
            llm_calls: 2,
            prompt_tokens: 20,
            completion_tokens: 4,
            ms: 7.0,
            llm_failure: None,
            out_of_time: false,
            described_by: None,
            vote: None,
            said_instead: None,
        };
        let t = super::run(&run, None, None);
        assert_eq!(t["sql"], "SELECT good");
        assert_eq!(t["status"], "ok");
        assert_eq!(t["row_count"], 2);
        assert_eq!(t["attempts"][0]["outcome"], "error");
        assert_eq!(t["attempts"][0]["sqlstate"], "42703");
        assert_eq!(t["attempts"][1]["outcome"], "rows");
        assert_eq!(t["attempts"][1]["parallel_workers"], 0);
        assert_eq!(t["llm_calls"], 2);
        assert!(t["llm_failure"].is_null());
    }
}
