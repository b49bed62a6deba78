//! Progress events: each step of a question (schema ready, model asked, attempt run, repair
//! requested, done) as it happens. A NOTICE when `sql_query_engine.progress` is on (psql prints
//! them live), and, when Redis is configured and the call has a session, a JSON event published
//! on the channel `sql_query_engine:<database oid>:<role oid>:progress:<session>` for
//! dashboards, namespaced like the session keys. Events carry no API key and no row data, and
//! with `sample_values = 0` no value PostgreSQL quoted in an error message (as repair requests
//! withhold them).

use serde_json::{json, Value};

use crate::exec::Outcome;
use crate::{prompt, redis_client, settings};

/// One step of answering a question.
pub enum Event<'a> {
    SchemaReady {
        relations: usize,
        pruned: bool,
    },
    ModelAsked {
        attempt: usize,
        repair: bool,
    },
    Executed {
        attempt: usize,
        sql: &'a str,
        outcome: &'a Outcome,
        ms: f64,
    },
    RepairRequested {
        attempt: usize,
        reason: &'static str,
    },
    Done {
        status: &'static str,
        row_count: Option<usize>,
        attempts: usize,
        ms: f64,
    },
}

impl Event<'_> {
    fn to_json(&self, share_values: bool) -> Value {
        match self {
            Event::SchemaReady { relations, pruned } => {
                json!({"event": "schema_ready", "relations": relations, "pruned": pruned})
            }
            Event::ModelAsked { attempt, repair } => {
                json!({"event": "model_asked", "attempt": attempt, "repair": repair})
            }
            Event::Executed {
                attempt,
                sql,
                outcome,
                ms,
            } => {
                let error = outcome
                    .error()
                    .map(|e| prompt::shown_error(e, share_values));
                json!({
                    "event": "attempt", "attempt": attempt, "sql": sql, "ms": ms,
                    "outcome": outcome.label(),
                    "row_count": outcome.result().map(|r| r.rows.len()),
                    "sqlstate": error.as_ref().map(|e| e.sqlstate),
                    "message": error.as_ref().map(|e| &e.message),
                })
            }
            Event::RepairRequested { attempt, reason } => {
                json!({"event": "repair_requested", "after_attempt": attempt, "reason": reason})
            }
            Event::Done {
                status,
                row_count,
                attempts,
                ms,
            } => json!({
                "event": "done", "status": status, "row_count": row_count, "attempts": attempts, "ms": ms
            }),
        }
    }

    fn describe(&self) -> String {
        match self {
            Event::SchemaReady { relations, pruned } => format!(
                "schema ready: {relations} relations{}",
                if *pruned {
                    " (pruned to the question)"
                } else {
                    ""
                }
            ),
            Event::ModelAsked { attempt, repair } => {
                format!(
                    "asking the model for {} {attempt}",
                    if *repair { "repair" } else { "attempt" }
                )
            }
            Event::Executed {
                attempt,
                sql,
                outcome,
                ms,
            } => {
                let result = match (outcome.result(), outcome.error()) {
                    (Some(r), _) => format!("{} rows", r.rows.len()),
                    (_, Some(e)) => format!("{} {}: {}", outcome.label(), e.sqlstate, e.message),
                    _ => outcome.label().to_string(),
                };
                format!("attempt {attempt}: {result} ({ms} ms)\n{sql}")
            }
            Event::RepairRequested { attempt, reason } => {
                format!("attempt {attempt} gave {reason}: asking for a repair")
            }
            Event::Done {
                status,
                row_count,
                attempts,
                ms,
            } => format!(
                "done: {status}{} after {attempts} attempt{} in {ms} ms",
                row_count.map(|n| format!(", {n} rows")).unwrap_or_default(),
                if *attempts == 1 { "" } else { "s" }
            ),
        }
    }
}

/// Where the events of one call go.
pub struct Progress {
    notices: bool,
    channel: Option<String>,
}

impl Progress {
    pub fn new(session: Option<&str>) -> Self {
        Progress {
            notices: settings::progress(),
            channel: session
                .filter(|_| redis_client::configured())
                .map(|s| redis_client::key("progress", s)),
        }
    }

    pub fn emit(&self, event: Event) {
        if self.notices {
            pgrx::notice!("sql_query_engine: {}", event.describe());
        }
        if let Some(channel) = &self.channel {
            let channel = channel.clone();
            let payload = event.to_json(settings::sample_values() > 0).to_string();
            let _: Option<i64> = redis_client::call(move |c| {
                ::redis::cmd("PUBLISH").arg(channel).arg(payload).query(c)
            });
        }
    }
}
