//! The SQL-callable functions. Thin: they wire settings, schema, model, executor, sessions and
//! history together and turn errors into PostgreSQL ERRORs, once, here.

use std::time::Duration;

use pgrx::prelude::*;
use pgrx::JsonB;

use crate::error::{Error, Result, SqlError};
use crate::exec::{self, Mode};
use crate::extract::strip_think;
use crate::heal::{self, Run};
use crate::llm::{Llm, OpenAiClient};
use crate::progress::{Event, Progress};
use crate::schema::PromptSchema;
use crate::session::Turn;
use crate::{examples, guard, hints, history, prompt, schema, session, settings};

/// Rows of an answer sent to the model by `nl_answer`, at most.
const ANSWER_ROWS: usize = 20;

/// Answers a question with rows: one jsonb object per row, in the query's order. With a
/// session, earlier questions of that session are context for this one.
#[pg_extern]
fn nl_query(
    question: Option<&str>,
    session: default!(Option<&str>, "NULL"),
) -> SetOfIterator<'static, JsonB> {
    let (run, _) = answer(question, session, run_mode(), "nl_query").unwrap_or_else(|e| e.raise());
    if let Some(error) = run.failure() {
        error.raise();
    }
    let rows: Vec<JsonB> = best_rows(&run)
        .iter()
        .map(|text| serde_json::from_str(text).map(JsonB))
        .collect::<std::result::Result<_, _>>()
        .unwrap_or_else(|e| Error::internal(format!("a result row is not JSON: {e}")).raise());
    SetOfIterator::new(rows)
}

/// Answers a question with SQL only: generated, guarded, and planned (never executed).
#[pg_extern]
fn nl_generate(question: Option<&str>, session: default!(Option<&str>, "NULL")) -> String {
    let (run, _) =
        answer(question, session, Mode::Plan, "nl_generate").unwrap_or_else(|e| e.raise());
    if let Some(error) = run.failure() {
        error.raise();
    }
    run.final_sql().unwrap_or_default().to_string()
}

/// Runs the pipeline like `nl_query` and returns what happened instead of the rows.
#[pg_extern]
fn nl_trace(question: Option<&str>, session: default!(Option<&str>, "NULL")) -> JsonB {
    let (run, schema) =
        answer(question, session, run_mode(), "nl_trace").unwrap_or_else(|e| e.raise());
    let mut trace = run.trace();
    trace["relations"] = serde_json::json!(schema.relations);
    trace["schema_pruned"] = serde_json::json!(schema.pruned);
    JsonB(trace)
}

/// Answers a question in plain language, grounded in the rows of the query that answers it
/// (none are sent to the model when sample values are off: then it describes the query).
#[pg_extern]
fn nl_answer(question: Option<&str>, session: default!(Option<&str>, "NULL")) -> String {
    let (run, _) = answer(question, session, run_mode(), "nl_answer").unwrap_or_else(|e| e.raise());
    if let Some(error) = run.failure() {
        error.raise();
    }
    let sql = run.final_sql().unwrap_or_default();
    let rows = best_rows(&run);
    let shown =
        (settings::sample_values() > 0).then(|| (&rows[..rows.len().min(ANSWER_ROWS)], rows.len()));
    let request = prompt::answer_request(&run.question, sql, shown);
    let mut llm = client(false).unwrap_or_else(|e| e.raise());
    let completion = llm.complete(&request).unwrap_or_else(|e| e.raise());
    strip_think(&completion.content).trim().to_string()
}

/// Forgets a session's earlier questions (in backend memory and in Redis).
#[pg_extern]
fn nl_session_reset(session: &str) {
    session::reset(session);
}

/// Checks SQL with the guard, without running it: raises the refusal as an ERROR (25006 for a
/// write, 42501 for a forbidden function, clause or relation, the parser's own SQLSTATE for a
/// syntax or name error), or returns.
#[pg_extern]
fn nl_check(sql: &str) {
    if let Err(refusal) = guard::check(sql) {
        Error::Refused(Box::new(refusal.error)).raise();
    }
}

/// The schema context exactly as the model would see it for `question` (all of it without
/// one), verified examples included.
#[pg_extern]
fn nl_schema(question: default!(Option<&str>, "NULL")) -> String {
    let question = question.filter(|q| !q.trim().is_empty());
    database_context(question)
        .map(|(context, _)| context)
        .unwrap_or_else(|e| e.raise())
}

fn run_mode() -> Mode {
    Mode::Run {
        max_rows: settings::max_rows(),
    }
}

/// The rows of the answer (jsonb text), empty when it has none.
fn best_rows(run: &Run) -> &[String] {
    run.best_result().map_or(&[], |r| &r.rows)
}

fn client(json_mode: bool) -> Result<OpenAiClient> {
    Ok(OpenAiClient::new(
        settings::llm_url()?,
        settings::llm_model(),
        settings::llm_api_key(),
        settings::temperature(),
        Duration::from_millis(settings::llm_timeout_ms()),
        json_mode && settings::json_mode(),
    ))
}

/// The schema and examples for a question, as the prompt shows them.
fn database_context(question: Option<&str>) -> Result<(String, PromptSchema)> {
    let schema = schema::context()?.for_question(question);
    let examples = match question {
        Some(q) => examples::similar(q, settings::examples())?,
        None => Vec::new(),
    };
    Ok((prompt::database_context(&schema.text, &examples), schema))
}

/// The database the heal loop works on: this backend, as the caller.
struct LiveDatabase {
    mode: Mode,
    timeout_ms: i32,
}

impl heal::Database for LiveDatabase {
    fn run(&mut self, sql: &str) -> exec::Outcome {
        exec::attempt(sql, self.mode, self.timeout_ms)
    }

    fn hint(&mut self, sql: &str, error: &SqlError) -> Option<String> {
        hints::for_error(sql, error)
    }
}

/// The whole pipeline for one question; `function` names the caller in the history.
fn answer(
    question: Option<&str>,
    session: Option<&str>,
    mode: Mode,
    function: &str,
) -> Result<(Run, PromptSchema)> {
    let question = question
        .filter(|q| !q.trim().is_empty())
        .ok_or_else(|| Error::InvalidParameter("the question is empty: ask something".into()))?;
    let session = session.filter(|s| !s.is_empty());
    let mut llm = client(true)?;
    let progress = Progress::new(session);
    let (context, schema) = database_context(Some(question))?;
    progress.emit(Event::SchemaReady {
        relations: schema.relations.len(),
        pruned: schema.pruned,
    });
    let turns = session.map(session::turns).unwrap_or_default();
    let mut database = LiveDatabase {
        mode,
        timeout_ms: settings::statement_timeout_ms(),
    };
    let run = heal::solve(
        question,
        prompt::initial(&context, &turns, question),
        settings::max_repairs(),
        &mut llm,
        &mut database,
        &mut |event| progress.emit(event),
    )?;
    if let (Some(session), Some(sql)) = (
        session,
        run.failure().is_none().then(|| run.final_sql()).flatten(),
    ) {
        session::record(
            session,
            Turn {
                question: question.to_string(),
                sql: sql.to_string(),
            },
        );
    }
    if function != "nl_trace" {
        history::record(function, session, &run);
    }
    Ok((run, schema))
}
