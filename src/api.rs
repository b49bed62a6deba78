//! The SQL-callable functions. Thin: they wire settings, schema, model, executor, sessions and
//! history together and turn errors into PostgreSQL ERRORs, once, here. Every call that ends in
//! an ERROR is written to the server log first (`history::audit`).

use std::time::Duration;

use pgrx::prelude::*;
use pgrx::JsonB;

use crate::error::{Error, Result, SqlError};
use crate::exec::{self, Mode, Outcome, ResultSet};
use crate::extract::strip_think;
use crate::heal::{self, Limits, Run, Vote};
use crate::llm::{Endpoint, Llm, OpenAiClient, Options};
use crate::progress::{Event, Progress};
use crate::schema::PromptSchema;
use crate::session::Turn;
use crate::settings::VoteSetting;
use crate::{examples, guard, hints, history, prompt, schema, session, settings, trace, values};

/// Rows of an answer sent to the model by `nl_answer`, at most.
const ANSWER_ROWS: usize = 20;

/// Answers a question with rows: one jsonb object per row, in the query's order. With a
/// session, earlier questions of that session are context for this one.
#[pg_extern(volatile, parallel_unsafe)]
fn nl_query(
    question: Option<&str>,
    session: default!(Option<&str>, "NULL"),
) -> SetOfIterator<'static, JsonB> {
    let (run, _) =
        answered("nl_query", question, session, run_mode()).unwrap_or_else(|e| e.raise());
    rows_of(run.best_result())
}

/// Answers a question with SQL only: generated, guarded, and planned (never executed).
#[pg_extern(volatile, parallel_unsafe)]
fn nl_generate(question: Option<&str>, session: default!(Option<&str>, "NULL")) -> String {
    let (run, _) =
        answered("nl_generate", question, session, Mode::Plan).unwrap_or_else(|e| e.raise());
    run.final_sql().unwrap_or_default().to_string()
}

/// Runs the pipeline like `nl_query` and returns what happened instead of the rows.
#[pg_extern(volatile, parallel_unsafe)]
fn nl_trace(question: Option<&str>, session: default!(Option<&str>, "NULL")) -> JsonB {
    let (run, shown) = answer(question, session, run_mode(), "nl_trace")
        .inspect_err(|e| history::audit("nl_trace", session, question.unwrap_or(""), Some(e)))
        .unwrap_or_else(|e| e.raise());
    JsonB(trace::run(
        &run,
        Some(&shown.schema),
        shown.values.as_deref(),
    ))
}

/// Answers a question in plain language, grounded in the rows of the query that answers it
/// (none are sent to the model when sample values are off: then it describes the query).
#[pg_extern(volatile, parallel_unsafe)]
fn nl_answer(question: Option<&str>, session: default!(Option<&str>, "NULL")) -> String {
    let (run, _) =
        answered("nl_answer", question, session, run_mode()).unwrap_or_else(|e| e.raise());
    let sql = run.final_sql().unwrap_or_default();
    let rows = run.best_result().map_or(&[][..], |r| &r.rows);
    let shown =
        (settings::sample_values() > 0).then(|| (&rows[..rows.len().min(ANSWER_ROWS)], rows.len()));
    let request = prompt::answer_request(&run.question, sql, shown);
    let completion = client(false)
        .and_then(|mut llm| llm.complete(&request))
        .unwrap_or_else(|e| e.raise());
    strip_think(&completion.content).trim().to_string()
}

/// Runs the caller's own SQL the way generated queries run: through the guard, read-only, in a
/// subtransaction that is always rolled back, under `sql_query_engine.statement_timeout` and
/// `max_rows`. Raises the refusal or the query's own error.
#[pg_extern(volatile, parallel_unsafe)]
fn nl_run(sql: &str) -> SetOfIterator<'static, JsonB> {
    match exec::attempt(sql, run_mode(), settings::statement_timeout_ms()) {
        Outcome::Rows(result) | Outcome::Empty(result) => rows_of(Some(&result)),
        Outcome::Refused(refusal) => Error::Refused(Box::new(refusal.error)).raise(),
        Outcome::Failed(error) => Error::Query(Box::new(error)).raise(),
        Outcome::Planned => rows_of(None),
    }
}

/// Stores a verified question -> SQL example (after `nl_check`); returns its id. Only roles that
/// may write `nl_examples` can.
#[pg_extern(volatile, parallel_unsafe)]
fn nl_example_add(question: &str, sql: &str) -> i64 {
    examples::add(question, sql).unwrap_or_else(|e| e.raise())
}

/// Forgets a session's earlier questions (in backend memory and in Redis).
#[pg_extern(volatile, parallel_unsafe)]
fn nl_session_reset(session: &str) {
    session::reset(session);
}

/// Checks SQL with the guard, without running it: raises the refusal as an ERROR (25006 for a
/// write, 42501 for a forbidden function, clause or relation, the parser's own SQLSTATE for a
/// syntax or name error), or returns.
#[pg_extern(stable, parallel_restricted)]
fn nl_check(sql: &str) {
    if let Err(refusal) = guard::check(sql) {
        Error::Refused(Box::new(refusal.error)).raise();
    }
}

/// The schema context exactly as the model would see it for `question` (all of it without
/// one), verified examples included.
#[pg_extern(volatile, parallel_unsafe)]
fn nl_schema(question: default!(Option<&str>, "NULL")) -> String {
    let question = question.filter(|q| !q.trim().is_empty());
    database_context(question)
        .map(|context| context.text)
        .unwrap_or_else(|e| e.raise())
}

fn run_mode() -> Mode {
    Mode::Run {
        max_rows: settings::max_rows(),
    }
}

/// A result as the rows a set-returning function returns; a cut result says so.
fn rows_of(result: Option<&ResultSet>) -> SetOfIterator<'static, JsonB> {
    let Some(result) = result else {
        return SetOfIterator::new(Vec::new());
    };
    if result.truncated {
        pgrx::notice!(
            "sql_query_engine: the result was cut at {} rows (sql_query_engine.max_rows)",
            result.rows.len()
        );
    }
    let rows: Vec<JsonB> = result
        .rows
        .iter()
        .map(|text| serde_json::from_str(text).map(JsonB))
        .collect::<std::result::Result<_, _>>()
        .unwrap_or_else(|e| Error::internal(format!("a result row is not JSON: {e}")).raise());
    SetOfIterator::new(rows)
}

fn client(json_mode: bool) -> Result<OpenAiClient> {
    Ok(OpenAiClient::new(
        Endpoint {
            base_url: settings::llm_url()?,
            model: settings::llm_model(),
            api_key: settings::llm_api_key()?,
        },
        Options {
            temperature: settings::temperature(),
            timeout: Duration::from_millis(settings::llm_timeout_ms()),
            json_mode: json_mode && settings::json_mode(),
            max_tokens: settings::max_tokens(),
            max_response_bytes: settings::max_response_bytes(),
        },
    ))
}

/// What the prompt says about the database for a question: its text, the schema shown, and
/// where the question's values are stored (for repairs).
struct DatabaseContext {
    text: String,
    schema: PromptSchema,
    values: Option<String>,
}

/// The schema, the question's values and the examples, as the prompt shows them.
fn database_context(question: Option<&str>) -> Result<DatabaseContext> {
    let (context, cached) = schema::load()?;
    let matches = match question {
        Some(q) if settings::value_index() => values::index(&context).lookup(q),
        _ => Vec::new(),
    };
    let evidence: Vec<usize> = matches.iter().map(|m| m.relation).collect();
    let schema = PromptSchema {
        cached,
        ..context.for_question(question, &evidence)
    };
    let values = values::describe(&matches);
    let examples = match question {
        Some(q) => examples::similar(q, settings::examples())?,
        None => Vec::new(),
    };
    Ok(DatabaseContext {
        text: prompt::database_context(&schema.text, values.as_deref(), &examples),
        schema,
        values,
    })
}

/// The database the heal loop works on: this backend, as the caller.
struct LiveDatabase {
    mode: Mode,
    timeout_ms: i32,
    values: Option<String>,
}

impl heal::Database for LiveDatabase {
    fn run(&mut self, sql: &str) -> exec::Outcome {
        exec::attempt(sql, self.mode, self.timeout_ms)
    }

    fn hint(&mut self, sql: &str, error: &SqlError) -> Option<String> {
        hints::for_error(sql, error)
    }

    fn values(&mut self) -> Option<String> {
        self.values.clone()
    }
}

/// `answer` for the functions that return the answer itself: a run without one is an error,
/// and every outcome is audited.
fn answered(
    function: &str,
    question: Option<&str>,
    session: Option<&str>,
    mode: Mode,
) -> Result<(Run, DatabaseContext)> {
    let result =
        answer(question, session, mode, function).and_then(|(run, schema)| match run.failure() {
            Some(error) => Err(error),
            None => Ok((run, schema)),
        });
    history::audit(
        function,
        session,
        question.unwrap_or(""),
        result.as_ref().err(),
    );
    result
}

/// The whole pipeline for one question; `function` names the caller in the history.
fn answer(
    question: Option<&str>,
    session: Option<&str>,
    mode: Mode,
    function: &str,
) -> Result<(Run, DatabaseContext)> {
    let question = question
        .filter(|q| !q.trim().is_empty())
        .ok_or_else(|| Error::InvalidParameter("the question is empty: ask something".into()))?;
    let session = session.filter(|s| !s.is_empty());
    let mut llm = client(true)?;
    let progress = Progress::new(session);
    let shown = database_context(Some(question))?;
    progress.emit(Event::SchemaReady {
        relations: shown.schema.relations.len(),
        pruned: shown.schema.pruned,
    });
    let turns = session.map(session::turns).unwrap_or_default();
    let mut database = LiveDatabase {
        mode,
        timeout_ms: settings::statement_timeout_ms(),
        values: shown.values.clone(),
    };
    let limits = Limits {
        max_repairs: settings::max_repairs(),
        share_values: settings::sample_values() > 0,
        vote: match settings::vote() {
            VoteSetting::Off => Vote::Off,
            VoteSetting::WhenInDoubt => Vote::WhenInDoubt,
            VoteSetting::Always => Vote::Always,
        },
        candidates: settings::candidates(),
    };
    let run = heal::solve(
        question,
        prompt::initial(&shown.text, &turns, question),
        limits,
        &mut llm,
        &mut database,
        &mut |event| progress.emit(event),
    )?;
    if let (Some(failure), None) = (&run.llm_failure, run.failure()) {
        pgrx::warning!(
            "sql_query_engine: the model failed when asked for a repair ({}: {}); the best \
             attempt so far is the answer",
            failure.endpoint,
            failure.cause
        );
    }
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
    Ok((run, shown))
}
