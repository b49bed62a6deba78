//! Progress events: each step of a question (schema ready, model asked, attempt run, repair
//! requested, done) as it happens. A NOTICE when `sql_query_engine.progress` is on (psql prints
//! them live), and, when Redis is configured and the call has a session, a JSON event published
//! on the channel `sql_query_engine:<system identifier>:<database oid>:<role oid>:progress:<session>` for
//! dashboards, namespaced like the session keys. Events carry no API key and no row data, and
//! with `sample_values = 0` no value PostgreSQL quoted in an error message (as repair requests
//! withhold them).

use serde_json::{json, Value};

use crate::exec::Outcome;
use crate::{prompt, redis_client, settings};

/// What an attempt was, in the words progress, traces and summaries use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The model's first query for the question.
    First,
    /// The caller's own SQL (`nl_fix`), run before the model is asked anything.
    Given,
    /// A verified example that answers the question as a template (`templates`), run before
    /// the model is asked anything.
    Template,
    /// Alternative `n` of the `of` asked for when in doubt (see `heal::Vote`).
    Alternative { n: usize, of: usize },
    /// Repair `n` of at most `of` (`max_repairs`).
    Repair { n: usize, of: usize },
}

impl Kind {
    /// "the first query", "alternative 2 of 4", "repair 1 of 3".
    pub fn label(self) -> String {
        match self {
            Kind::First => "the first query".into(),
            Kind::Given => "your query".into(),
            Kind::Template => "a verified example".into(),
            Kind::Alternative { n, of } => format!("alternative {n} of {of}"),
            Kind::Repair { n, of } => format!("repair {n} of {of}"),
        }
    }

    pub fn is_alternative(self) -> bool {
        matches!(self, Kind::Alternative { .. })
    }
}

/// What the model is asked for.
pub enum Asking<'a> {
    /// The first query for the question.
    Query,
    /// Alternatives, to vote on.
    Alternatives(usize),
    /// A repair (`Kind::Repair`), and why: what the queries before it gave.
    Repair { kind: Kind, because: &'a str },
}

/// One step of answering a question.
pub enum Event<'a> {
    SchemaReady {
        relations: usize,
        pruned: bool,
    },
    ModelAsked(Asking<'a>),
    Executed {
        /// 1-based position among the run's attempts.
        attempt: usize,
        kind: Kind,
        sql: &'a str,
        outcome: &'a Outcome,
        ms: f64,
    },
    /// The alternatives ran: how many of all the queries so far gave the winning result.
    Voted {
        /// Asked for, and came back (fewer when the answer budget ended some).
        asked: usize,
        alternatives: usize,
        agreed: Option<Agreed>,
    },
    Done {
        status: &'static str,
        row_count: Option<usize>,
        attempts: usize,
        answered_by: Option<Kind>,
        ms: f64,
    },
}

/// The winning group of a vote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreed {
    /// Queries that gave the winning result, the first query included.
    pub queries: usize,
    /// Whether the first query is one of them.
    pub first_among_them: bool,
}

impl Event<'_> {
    fn to_json(&self, share_values: bool) -> Value {
        match self {
            Event::SchemaReady { relations, pruned } => {
                json!({"event": "schema_ready", "relations": relations, "pruned": pruned})
            }
            Event::ModelAsked(Asking::Query) => json!({"event": "model_asked", "for": "query"}),
            Event::ModelAsked(Asking::Alternatives(n)) => {
                json!({"event": "model_asked", "for": "alternatives", "alternatives": n})
            }
            Event::ModelAsked(Asking::Repair { kind, because }) => {
                let (n, of) = match kind {
                    Kind::Repair { n, of } => (*n, *of),
                    _ => (0, 0),
                };
                json!({"event": "model_asked", "for": "repair", "repair": n, "of": of, "because": because})
            }
            Event::Executed {
                attempt,
                kind,
                sql,
                outcome,
                ms,
            } => {
                let error = outcome
                    .error()
                    .map(|e| prompt::shown_error(e, share_values));
                json!({
                    "event": "attempt", "attempt": attempt, "kind": kind.label(), "sql": sql,
                    "ms": ms, "outcome": outcome.label(),
                    "row_count": outcome.result().map(|r| r.rows.len()),
                    "sqlstate": error.as_ref().map(|e| e.sqlstate),
                    "message": error.as_ref().map(|e| &e.message),
                })
            }
            Event::Voted {
                asked,
                alternatives,
                agreed,
            } => json!({
                "event": "vote", "asked": asked, "alternatives": alternatives,
                "agreed": agreed.map(|a| a.queries),
                "first_among_them": agreed.map(|a| a.first_among_them),
            }),
            Event::Done {
                status,
                row_count,
                attempts,
                answered_by,
                ms,
            } => json!({
                "event": "done", "status": status, "row_count": row_count, "attempts": attempts,
                "answered_by": answered_by.map(Kind::label), "ms": ms
            }),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Event::SchemaReady { relations, pruned } => format!(
                "schema ready: {relations} relations{}",
                if *pruned {
                    " (pruned to the question)"
                } else {
                    ""
                }
            ),
            Event::ModelAsked(Asking::Query) => "asking the model for a query".into(),
            Event::ModelAsked(Asking::Alternatives(n)) => {
                format!("asking the model for {n} alternatives to vote on")
            }
            Event::ModelAsked(Asking::Repair { kind, because }) => {
                format!("asking the model for {}: {because}", kind.label())
            }
            Event::Executed {
                kind,
                sql,
                outcome,
                ms,
                ..
            } => {
                let result = match (outcome.result(), outcome.error()) {
                    (Some(r), _) => rows(r.rows.len()),
                    (_, Some(e)) => format!("{} {}: {}", outcome.label(), e.sqlstate, e.message),
                    _ => outcome.label().to_string(),
                };
                format!("{}: {result} ({ms} ms)\n{sql}", kind.label())
            }
            Event::Voted {
                asked,
                alternatives,
                agreed,
            } => vote_summary(*asked, *alternatives, *agreed),
            Event::Done {
                status,
                row_count,
                attempts,
                answered_by,
                ms,
            } => format!(
                "done: {status}{}{} ({attempts} quer{} in {ms} ms)",
                row_count
                    .map(|n| format!(", {}", rows(n)))
                    .unwrap_or_default(),
                answered_by
                    .map(|k| format!(" from {}", k.label()))
                    .unwrap_or_default(),
                if *attempts == 1 { "y" } else { "ies" }
            ),
        }
    }
}

/// "1 row", "3 rows".
fn rows(n: usize) -> String {
    format!("{n} row{}", if n == 1 { "" } else { "s" })
}

/// "asked 4 alternatives, 3 agreed (the first query among them)"; "asked 4 alternatives (2
/// came back), ..." when the answer budget ended some.
pub fn vote_summary(asked: usize, alternatives: usize, agreed: Option<Agreed>) -> String {
    let asked = if alternatives < asked {
        format!("asked {asked} alternatives ({alternatives} came back)")
    } else {
        format!("asked {asked} alternatives")
    };
    match agreed {
        None => format!("{asked}: none ran with a result"),
        Some(Agreed { queries: 1, .. }) => format!("{asked}: no two results agreed"),
        Some(a) => format!(
            "{asked}, {} agreed{}",
            a.queries,
            if a.first_among_them {
                " (the first query among them)"
            } else {
                ""
            }
        ),
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
            // Lines after the first are indented: an error message or a query another role or
            // the model wrote may hold line breaks, and none of its lines may pass for another
            // progress line.
            crate::error::notice(format!(
                "sql_query_engine: {}",
                crate::text::escaped_indented(&event.describe())
            ));
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
