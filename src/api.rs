//! The SQL-callable functions. Thin: they wire settings, schema, model and executor together
//! and turn errors into PostgreSQL ERRORs, once, here.

use std::time::Duration;

use pgrx::prelude::*;
use pgrx::JsonB;

use crate::error::{Error, Result};
use crate::exec::{self, Mode, Outcome};
use crate::heal::{self, Run};
use crate::llm::OpenAiClient;
use crate::schema::PromptSchema;
use crate::{examples, guard, prompt, schema, settings};

/// Answers a question with rows: one jsonb object per row, in the query's order.
#[pg_extern]
fn nl_query(question: Option<&str>) -> SetOfIterator<'static, JsonB> {
    let (run, _) = answer(question, run_mode()).unwrap_or_else(|e| e.raise());
    if let Some(error) = run.failure() {
        error.raise();
    }
    let rows = match run.best_attempt().map(|a| &a.outcome) {
        Some(Outcome::Rows(result)) => result.rows.as_slice(),
        _ => &[],
    };
    let rows: Vec<JsonB> = rows
        .iter()
        .map(|text| serde_json::from_str(text).map(JsonB))
        .collect::<std::result::Result<_, _>>()
        .unwrap_or_else(|e| Error::internal(format!("a result row is not JSON: {e}")).raise());
    SetOfIterator::new(rows)
}

/// Answers a question with SQL only: generated, guarded, and planned (never executed).
#[pg_extern]
fn nl_generate(question: Option<&str>) -> String {
    let (run, _) = answer(question, Mode::Plan).unwrap_or_else(|e| e.raise());
    if let Some(error) = run.failure() {
        error.raise();
    }
    run.final_sql().unwrap_or_default().to_string()
}

/// Runs the pipeline like `nl_query` and returns what happened instead of the rows.
#[pg_extern]
fn nl_trace(question: Option<&str>) -> JsonB {
    let (run, schema) = answer(question, run_mode()).unwrap_or_else(|e| e.raise());
    let mut trace = run.trace();
    trace["relations"] = serde_json::json!(schema.relations);
    trace["schema_pruned"] = serde_json::json!(schema.pruned);
    JsonB(trace)
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

/// The schema and examples for a question, as the prompt shows them.
fn database_context(question: Option<&str>) -> Result<(String, PromptSchema)> {
    let schema = schema::context()?.for_question(question);
    let examples = match question {
        Some(q) => examples::similar(q, settings::examples())?,
        None => Vec::new(),
    };
    Ok((prompt::database_context(&schema.text, &examples), schema))
}

/// The whole pipeline for one question.
fn answer(question: Option<&str>, mode: Mode) -> Result<(Run, PromptSchema)> {
    let question = question
        .filter(|q| !q.trim().is_empty())
        .ok_or_else(|| Error::InvalidParameter("the question is empty: ask something".into()))?;
    let mut llm = OpenAiClient::new(
        settings::llm_url()?,
        settings::llm_model(),
        settings::llm_api_key(),
        settings::temperature(),
        Duration::from_millis(settings::llm_timeout_ms()),
        settings::json_mode(),
    );
    let (context, schema) = database_context(Some(question))?;
    let timeout_ms = settings::statement_timeout_ms();
    let run = heal::solve(
        question,
        &context,
        settings::max_repairs(),
        &mut llm,
        &mut |sql| exec::attempt(sql, mode, timeout_ms),
    )?;
    Ok((run, schema))
}
