//! The SQL-callable functions. Thin: they wire settings, schema, model, executor, sessions and
//! history together and turn errors into PostgreSQL ERRORs, once, here. Every call is written to
//! the server log before it returns or raises (`history::audit`).

use std::rc::Rc;

use pgrx::prelude::*;
use pgrx::JsonB;

use crate::arguments::{self, JsonArgument};
use crate::error::{Error, Result, SqlError, SqlState};
use crate::exec::{self, Mode, ResultSet};
use crate::extract::strip_think;
use crate::guard::Scope;
use crate::heal::{self, Limits, Run, Start, Vote};
use crate::llm::{self, Batch, Chain, Completion, Llm, Message};
use crate::progress::{Event, Kind, Progress};
use crate::saved::{self, Field};
use crate::schema::PromptSchema;
use crate::session::Turn;
use crate::settings::{AbstainSetting, VoteSetting};
use crate::{
    confidence, examples, feedback, hints, history, prompt, schema, session, settings, subxact,
    templates, text, trace, values,
};

/// Rows of an answer sent to the model by `nl_answer`, at most.
const ANSWER_ROWS: usize = 20;

/// Answers a question with rows: one jsonb object per row, in the query's order. With a
/// session, earlier questions of that session are context for this one.
#[pg_extern(volatile, parallel_unsafe)]
fn nl_query(
    question: Option<&str>,
    session: default!(Option<&str>, "NULL"),
) -> SetOfIterator<'static, JsonB> {
    let ask = Ask::new("nl_query", question, session);
    ask.admitted(|| Ok(()));
    let (run, _) = answered(ask).unwrap_or_else(|e| e.raise());
    rows_of(run.best_result())
}

/// Answers a question with SQL only: generated, guarded, and planned (never executed).
#[pg_extern(volatile, parallel_unsafe)]
fn nl_generate(question: Option<&str>, session: default!(Option<&str>, "NULL")) -> String {
    let ask = Ask {
        mode: Mode::Plan,
        ..Ask::new("nl_generate", question, session)
    };
    ask.admitted(|| Ok(()));
    let (run, _) = answered(ask).unwrap_or_else(|e| e.raise());
    run.final_sql().unwrap_or_default().to_string()
}

/// Runs the pipeline like `nl_query` and returns what happened instead of the rows.
#[pg_extern(volatile, parallel_unsafe)]
fn nl_trace(question: Option<&str>, session: default!(Option<&str>, "NULL")) -> JsonB {
    let ask = Ask::new("nl_trace", question, session);
    ask.admitted(|| Ok(()));
    let (run, shown) = audited_run(ask, Ok).unwrap_or_else(|e| e.raise());
    JsonB(traced(&run, &shown))
}

/// Answers a question in plain language, grounded in the rows of the query that answers it
/// (none are sent to the model when sample values are off: then it describes the query).
#[pg_extern(volatile, parallel_unsafe)]
fn nl_answer(question: Option<&str>, session: default!(Option<&str>, "NULL")) -> String {
    let ask = Ask::new("nl_answer", question, session);
    ask.admitted(|| Ok(()));
    let (_, mut shown) = match answered(ask) {
        Ok(answered) => answered,
        // Withheld as doubtful: ask back instead of guessing.
        Err(e @ Error::NotSure(_)) => return clarifying_question(&e),
        Err(e) => e.raise(),
    };
    match shown.described.take() {
        Some(Ok(text)) => text,
        Some(Err(e)) => e.raise(),
        None => Error::internal("nl_answer: the answer was not described").raise(),
    }
}

/// The answer of `run` in plain language, grounded in up to `ANSWER_ROWS` of its rows (none
/// when sample values are off): asked of the model before the call is recorded, so that its
/// history and audit line count the request and name the endpoint that received the rows.
fn described(run: &mut Run) -> Result<String> {
    let sql = run.final_sql().unwrap_or_default();
    let rows = run.best_result().map_or(&[][..], |r| &r.rows);
    let shown =
        (settings::sample_values() > 0).then(|| (&rows[..rows.len().min(ANSWER_ROWS)], rows.len()));
    let request = prompt::answer_request(&run.question, sql, shown, settings::prompt_budget() * 4);
    let completion = llm::configured(false)?.complete(&request)?;
    run.llm_calls = run.llm_calls.saturating_add(1);
    run.prompt_tokens = run.prompt_tokens.saturating_add(completion.prompt_tokens);
    run.completion_tokens = run
        .completion_tokens
        .saturating_add(completion.completion_tokens);
    // Every endpoint the rows were sent to: one that failed first received them too.
    run.described_by = Some(if completion.failures.is_empty() {
        completion.endpoint
    } else {
        format!(
            "{} (after {})",
            completion.endpoint,
            completion.failures.join("; ")
        )
    });
    Ok(strip_think(&completion.content).trim().to_string())
}

/// What `nl_answer` says when it withholds a doubtful answer: the question it would need
/// answered, naming the interpretations.
fn clarifying_question(error: &Error) -> String {
    let mut text = "I am not sure what you mean, so I did not guess.".to_string();
    if let Some(detail) = error.detail() {
        text.push_str(" Which of these did you mean?\n");
        text.push_str(detail.trim_start_matches("It hesitated between:\n"));
    } else {
        text.push_str(" Could you name the table, column or value you mean?");
    }
    text
}

/// Answers a question with its rows and how they were found: the `nl_trace` object with `rows`
/// added, each an array of values in the query's column order (for API clients). `turns`, the
/// conversation's earlier questions with the SQL that answered them (`[{"question": ...,
/// "sql": ...}]`, as chat clients send the whole conversation), replaces the session's stored
/// turns: the session is then only a label in the history.
#[pg_extern(volatile, parallel_unsafe)]
fn nl_ask(
    question: Option<&str>,
    session: default!(Option<&str>, "NULL"),
    turns: default!(Option<JsonArgument>, "NULL"),
) -> JsonB {
    let ask = Ask {
        turns: turns.as_ref(),
        ..Ask::new("nl_ask", question, session)
    };
    ask.admitted(|| Ok(()));
    let (run, shown) = answered(ask).unwrap_or_else(|e| e.raise());
    JsonB(traced_with_rows(&run, &shown))
}

/// `nl_ask` as a procedure, for slow models: `CALL nl_call('question', answer => NULL)`.
/// Called outside a transaction block, it commits its transaction before each model call, so
/// that no snapshot (`backend_xmin`), lock or transaction id is held while the model thinks;
/// inside one, the caller owns the snapshot and it behaves like `nl_ask`. `run_as` is the role
/// the call runs as (checked as `SET ROLE` checks it) and `progress` its progress setting, both
/// for the call only: a client that shares connections (the gateway, through a pooler in
/// transaction mode) leaves nothing behind on the connection.
#[pg_extern(
    volatile,
    parallel_unsafe,
    sql = "CREATE PROCEDURE nl_call(question text, session text DEFAULT NULL, \
           INOUT answer jsonb DEFAULT NULL, turns jsonb DEFAULT NULL, \
           run_as text DEFAULT NULL, progress boolean DEFAULT NULL) \
           LANGUAGE c AS 'MODULE_PATHNAME', 'nl_call_wrapper';"
)]
fn nl_call(
    question: Option<&str>,
    session: Option<&str>,
    _answer: Option<JsonArgument>,
    turns: Option<JsonArgument>,
    run_as: Option<&str>,
    progress: Option<bool>,
    fcinfo: pg_sys::FunctionCallInfo,
) -> pgrx::datum::Internal {
    let settings =
        Ask::new("nl_call", question, session).admitted(|| call_settings(run_as, progress));
    // SAFETY: PostgreSQL passes a valid fcinfo, whose flinfo names the procedure called.
    let procedure = unsafe { (*(*fcinfo).flinfo).fn_oid };
    let answer = subxact::in_procedure(fcinfo, &settings, || {
        let ask = Ask {
            release: true,
            turns: turns.as_ref(),
            ..Ask::new("nl_call", question, session)
        };
        // PostgreSQL checked EXECUTE for the role that called; the call runs as `run_as`,
        // which must have it too (a login role that may call it, such as the gateway's, would
        // otherwise lend it to every role it may become).
        ask.admitted(|| {
            // SAFETY: reads the backend's current user, the role the call now runs as.
            let user = unsafe { pg_sys::GetUserId() };
            match run_as {
                Some(role) if !crate::compat::function_allows(procedure, user) => {
                    Err(Error::Refused(Box::new(SqlError::new(
                        SqlState::INSUFFICIENT_PRIVILEGE,
                        format!(
                            "permission denied for procedure nl_call: run_as role {} may not \
                             call it",
                            crate::text::quoted_field(role)
                        ),
                    ))))
                }
                _ => Ok(()),
            }
        });
        let (run, shown) = answered(ask).unwrap_or_else(|e| e.raise());
        traced_with_rows(&run, &shown)
    });
    // A procedure returns its INOUT parameters as one record; pgrx has no type for "the
    // procedure's own record", so it is formed here and handed back as a raw Datum.
    // SAFETY: PostgreSQL passes a valid fcinfo of this procedure, whose result type is the
    // record of its one INOUT parameter; the tuple is formed in the current memory context.
    unsafe {
        let mut desc: pg_sys::TupleDesc = std::ptr::null_mut();
        let class = pg_sys::get_call_result_type(fcinfo, std::ptr::null_mut(), &mut desc);
        if class != pg_sys::TypeFuncClass::TYPEFUNC_COMPOSITE || desc.is_null() {
            Error::internal("nl_call must be created as a procedure with one INOUT parameter")
                .raise()
        }
        let desc = pg_sys::BlessTupleDesc(desc);
        let mut values = [JsonB(answer)
            .into_datum()
            .unwrap_or_else(pg_sys::Datum::null)];
        let mut nulls = [false];
        let tuple = pg_sys::heap_form_tuple(desc, values.as_mut_ptr(), nulls.as_mut_ptr());
        pgrx::datum::Internal::from(Some(pg_sys::HeapTupleHeaderGetDatum((*tuple).t_data)))
    }
}

/// The settings `nl_call` makes for the call: the role it runs as and its progress.
fn call_settings(
    run_as: Option<&str>,
    progress: Option<bool>,
) -> Result<Vec<(std::ffi::CString, std::ffi::CString)>> {
    let text = |value: &str, what: &str| {
        std::ffi::CString::new(value)
            .map_err(|_| Error::InvalidParameter(format!("{what} contains a NUL character")))
    };
    let mut settings = Vec::new();
    if let Some(role) = run_as {
        if role.is_empty() {
            return Err(Error::InvalidParameter(
                "run_as is empty: name a role".into(),
            ));
        }
        arguments::no_longer_than(role, "run_as", arguments::MAX_NAME_CHARS)?;
        settings.push((c"role".to_owned(), text(role, "run_as")?));
    }
    if let Some(on) = progress {
        settings.push((
            c"sql_query_engine.progress".to_owned(),
            (if on { c"on" } else { c"off" }).to_owned(),
        ));
    }
    Ok(settings)
}

/// Saves the answer to a question as a view (`view_name`, or `schema.view_name`), for BI tools:
/// a normal view with the answer's own column names and types, whose definition is the SQL that
/// passed the guard and ran. Created as the caller, in the caller's transaction; its comment
/// names the question (`nl_view_refresh` asks it again). Returns the SQL.
#[pg_extern(volatile, parallel_unsafe, strict)]
fn nl_view(view_name: &str, question: &str, replace: default!(bool, false)) -> String {
    let target = Ask {
        view: Some(view_name),
        ..Ask::new("nl_view", Some(question), None)
    }
    .admitted(|| {
        arguments::no_longer_than(view_name, "the view's name", arguments::MAX_NAME_CHARS)?;
        saved::target(view_name, replace)
    });
    let ask = Ask {
        view: Some(&target.qualified),
        ..Ask::new("nl_view", Some(question), None)
    };
    let (run, _) = answered_and(ask, |run, shown| {
        let (sql, columns) = saved_answer(run)?;
        saved::create(&target, &sql, &columns, question, Some(&shown.scope))
    })
    .unwrap_or_else(|e| e.raise());
    saved_answer(&run).unwrap_or_else(|e| e.raise()).0
}

/// What a view saves of `run`'s answer: its checked tree written out with every name qualified
/// (`ResultSet::qualified_sql`), and its columns.
fn saved_answer(run: &Run) -> Result<(String, Vec<String>)> {
    let result = run.best_result();
    let sql = result
        .and_then(|r| r.qualified_sql.clone())
        .ok_or_else(|| Error::internal("the answer has no checked query to save"))?;
    let columns = result.map(|r| r.columns.clone()).unwrap_or_default();
    Ok((sql, columns))
}

/// Asks a saved question's view again and redefines it with the new answer (its columns may
/// not change: CREATE OR REPLACE VIEW keeps them). Returns what changed.
#[pg_extern(volatile, parallel_unsafe, strict)]
fn nl_view_refresh(view_name: &str) -> String {
    // Before the saved question is read, the audit names the view alone.
    let view = format!(
        "view: {}",
        text::at_most(view_name, arguments::MAX_SQL_CHARS)
    );
    let before = admitted(
        "nl_view_refresh",
        None,
        || &view,
        || {
            arguments::no_longer_than(view_name, "the view's name", arguments::MAX_NAME_CHARS)?;
            saved::saved(view_name)
        },
    );
    let ask = Ask {
        view: Some(view_name),
        ..Ask::new("nl_view_refresh", Some(&before.question), None)
    };
    answered_and(ask, |run, shown| {
        let (sql, columns) = saved_answer(run)?;
        saved::redefine(&before, view_name, &sql, &columns, Some(&shown.scope))
    })
    .unwrap_or_else(|e| e.raise());
    let after = saved::saved(view_name).unwrap_or_else(|e| e.raise());
    if after.definition == before.definition {
        format!(
            "unchanged: {view_name} answers \"{}\" as before",
            before.question
        )
    } else {
        format!(
            "changed: {view_name} was\n{}\nand is now\n{}",
            before.definition.trim(),
            after.definition.trim()
        )
    }
}

/// The rows of an answer fitted to the row type `shape`, keyed by its field names (for
/// `nl_query_as`, which converts them): the model is asked for exactly those columns, and an
/// answer with other ones is repaired like an error.
#[pg_extern(volatile, parallel_unsafe, strict)]
fn nl_query_shaped(question: &str, shape: pg_sys::Oid) -> SetOfIterator<'static, JsonB> {
    let fields = Ask::new("nl_query_as", Some(question), None).admitted(|| saved::shape(shape));
    // A question too long to be asked is passed on as it is, to be refused (and audited).
    let shaped;
    let asked = match arguments::question(question) {
        Ok(()) => {
            shaped = saved::shaped_question(question, &fields);
            shaped.as_str()
        }
        Err(_) => question,
    };
    let ask = Ask {
        shape: Some(&fields),
        ..Ask::new("nl_query_as", Some(asked), None)
    };
    let (run, _) = answered(ask).unwrap_or_else(|e| e.raise());
    // The type's owner may have changed it while the model thought (a CHECK added to a domain
    // of it would run in the conversion, as the caller): checked again, as the catalog is now,
    // before it is used.
    if saved::shape_now(shape).unwrap_or_else(|e| e.raise()) != fields {
        Error::sql(
            "55000",
            "the row type changed while the question was answered",
            Some("Ask again."),
        )
        .raise();
    }
    let rows = run
        .best_result()
        .map(|r| saved::rekeyed(r, &fields))
        .unwrap_or_default();
    SetOfIterator::new(rows.into_iter().map(JsonB))
}

/// Repairs the caller's own SQL: runs it through the guard and the sandbox and, when it fails or
/// comes back empty, repairs it with the same loop as a generated query (toward `question`,
/// when given). Returns the SQL that finally answers; raises when none does.
#[pg_extern(volatile, parallel_unsafe)]
fn nl_fix(sql: Option<&str>, question: default!(Option<&str>, "NULL")) -> String {
    let ask = Ask {
        first: sql,
        ..Ask::new("nl_fix", question, None)
    };
    let sql = ask.admitted(|| {
        sql.filter(|s| !s.trim().is_empty())
            .ok_or_else(|| Error::InvalidParameter("the SQL to fix is empty".into()))
    });
    let ask = Ask {
        first: Some(sql),
        ..ask
    };
    let (run, _) = answered(ask).unwrap_or_else(|e| e.raise());
    run.final_sql().unwrap_or_default().to_string()
}

/// Answers a question into a cursor of the caller's transaction, with the query's own columns
/// and types (what BI tools and drivers expect); FETCH from it until the transaction ends.
/// The rows are computed in the sandbox (at most `max_rows`), not at FETCH time.
#[pg_extern(
    volatile,
    parallel_unsafe,
    sql = "CREATE FUNCTION nl_cursor(question text, cursor_name text DEFAULT 'nl_answer') \
           RETURNS refcursor VOLATILE PARALLEL UNSAFE \
           LANGUAGE c AS 'MODULE_PATHNAME', 'nl_cursor_wrapper';"
)]
fn nl_cursor(question: Option<&str>, cursor_name: default!(Option<&str>, "'nl_answer'")) -> String {
    let name = cursor_name.filter(|n| !n.is_empty()).unwrap_or("nl_answer");
    let cursor = Ask::new("nl_cursor", question, None).admitted(|| {
        arguments::no_longer_than(name, "the cursor's name", arguments::MAX_NAME_CHARS)?;
        // PostgreSQL keeps a portal's name in NAMEDATALEN bytes, cut at a byte: a longer name
        // would name a cursor no FETCH finds.
        if name.len() >= pg_sys::NAMEDATALEN as usize {
            return Err(Error::Query(Box::new(SqlError::new(
                SqlState::NAME_TOO_LONG,
                format!(
                    "the cursor's name is {} bytes long: at most {} are kept",
                    name.len(),
                    pg_sys::NAMEDATALEN - 1
                ),
            ))));
        }
        exec::new_cursor(name).ok_or_else(|| {
            Error::Query(Box::new(SqlError::new(
                SqlState::DUPLICATE_CURSOR,
                format!("cursor \"{name}\" already exists"),
            )))
        })
    });
    // Every attempt keeps its rows in the cursor's memory; the one that answers is the cursor
    // (the query is not run a second time, and the cursor has exactly the rows of the answer).
    let ask = Ask {
        mode: Mode::Cursor {
            portal: cursor.portal,
            limits: exec::Limits::from_settings(),
        },
        ..Ask::new("nl_cursor", question, None)
    };
    // Every store an attempt began is ended with `cursor`, on every path, but the answer's.
    let (run, _) = answered(ask).unwrap_or_else(|e| e.raise());
    let answer = run.best_result();
    cursor.finish(
        run.final_sql().unwrap_or_default(),
        answer.and_then(|r| r.held),
    );
    if let Some((setting, rows)) = answer.and_then(|r| r.cut_by.map(|by| (by, r.rows.len()))) {
        crate::error::notice(format!(
            "sql_query_engine: the result was cut at {rows} rows (sql_query_engine.{setting})"
        ));
    }
    name.to_string()
}

/// The trace of a run, with what the prompt showed.
fn traced(run: &Run, shown: &DatabaseContext) -> serde_json::Value {
    let mut trace = trace::run(run, Some(&shown.schema), shown.values.as_deref());
    let (turns, sent) = shown.turns;
    trace["session_store"] = match sent {
        true => serde_json::json!("request"),
        false => serde_json::json!(shown.session.map(session::Store::as_str)),
    };
    trace["context_turns"] = serde_json::json!(turns);
    trace["history_id"] = serde_json::json!(shown.history_id);
    let verdict = confidence::assess(run, shown.schema.pruned);
    trace["confidence"] = serde_json::json!({
        "level": verdict.level(), "doubts": verdict.doubts, "notes": verdict.notes,
    });
    trace["examples_skipped"] = serde_json::json!(shown.examples_skipped);
    trace["template_example"] = serde_json::json!(shown.template_used);
    trace
}

/// The trace of a run with its rows, each an array of values in the query's column order.
fn traced_with_rows(run: &Run, shown: &DatabaseContext) -> serde_json::Value {
    let mut trace = traced(run, shown);
    trace["rows"] = serde_json::Value::Array(
        run.best_result()
            .map(trace::rows_in_column_order)
            .unwrap_or_default(),
    );
    trace
}

/// Runs the caller's own SQL the way generated queries run: through the guard, read-only, in a
/// subtransaction that is always rolled back, under `sql_query_engine.statement_timeout` and
/// `max_rows`. Raises the refusal or the query's own error.
#[pg_extern(volatile, parallel_unsafe)]
fn nl_run(sql: &str) -> SetOfIterator<'static, JsonB> {
    admitted("nl_run", None, || sql, || Ok(()));
    let result = history::audited("nl_run", sql, || {
        arguments::sql(sql)?;
        exec::attempt(sql, run_mode(), settings::statement_timeout_ms()).into_result()
    })
    .unwrap_or_else(|e| e.raise());
    rows_of(result.as_ref())
}

/// Stores a verified question -> SQL example (after `nl_check`); returns its id. Only roles that
/// may write `nl_examples` can. Values in braces in the question are its parameters
/// (`templates`).
#[pg_extern(volatile, parallel_unsafe)]
fn nl_example_add(question: &str, sql: &str) -> i64 {
    admitted("nl_example_add", None, || sql, || Ok(()));
    history::audited("nl_example_add", sql, || {
        arguments::example_sql(sql)?;
        arguments::example_question(question)?;
        templates::check_marks(question, sql)
            .map_err(Error::InvalidParameter)
            .and_then(|()| examples::add(question, sql))
    })
    .unwrap_or_else(|e| e.raise())
}

/// Feedback on a recorded answer (`history_id`, as `nl_ask` returns it): `correct`, or a
/// corrected query that passes the guard and returns rows. From a role that may write
/// `nl_examples` it becomes a verified example of the question at once; anyone else's waits
/// for review in `nl_feedback`. Returns `{feedback_id, status, example_id}`.
#[pg_extern(volatile, parallel_unsafe)]
fn nl_feedback(
    history_id: Option<i64>,
    correct: Option<bool>,
    corrected_sql: default!(Option<&str>, "NULL"),
) -> JsonB {
    let asked = format!(
        "answer {}, correct: {}",
        history_id.map_or("NULL".into(), |id| id.to_string()),
        correct.map_or("NULL".into(), |c| c.to_string())
    );
    let (history_id, correct) = admitted(
        "nl_feedback",
        None,
        || &asked,
        || {
            history_id.zip(correct).ok_or_else(|| {
                Error::sql(
                    "22004",
                    "nl_feedback needs the answer's history_id and whether it was correct",
                    None,
                )
            })
        },
    );
    // The read of the answer is audited when it fails (an ERROR raised in it too); the
    // feedback itself below.
    let read = format!("answer {history_id}, correct: {correct}");
    let answer = history::audit_raised("nl_feedback", None, &read, |caller| {
        feedback::answer(history_id).inspect_err(|error| {
            history::audit(
                caller,
                "nl_feedback",
                None,
                &read,
                history::Audited::Failed(error),
            )
        })
    })
    .unwrap_or_else(|e| e.raise());
    // The audit names the SQL the feedback runs, the answer's own included: a role may write
    // its own history rows, and roll them back after.
    let input = format!(
        "{read}, runs: {}",
        answer
            .vouched(correct, corrected_sql)
            .map_or("(nothing)".into(), |sql| text::at_most(
                sql,
                arguments::MAX_SQL_CHARS
            ))
    );
    let given = history::audited("nl_feedback", &input, || {
        feedback::give(history_id, &answer, correct, corrected_sql)
    });
    JsonB(given.unwrap_or_else(|e| e.raise()))
}

/// Forgets a session's earlier questions (in every store this server reaches).
#[pg_extern(volatile, parallel_unsafe)]
fn nl_session_reset(session: &str) {
    admitted(
        "nl_session_reset",
        None,
        || session,
        || session::check_name(session),
    );
    history::audited("nl_session_reset", session, || {
        session::reset(session);
        Ok(())
    })
    .unwrap_or_else(|e| e.raise());
}

/// Where a session's turns are kept on this server now: `redis` (shared by every connection to
/// every node of the deployment), `table` (this primary's `nl_sessions`) or `memory` (this
/// backend only). A gateway sends server-side sessions only to servers that keep them shared.
#[pg_extern(volatile, parallel_unsafe)]
fn nl_session_store() -> &'static str {
    admitted("nl_session_store", None, || "", || Ok(()));
    session::reachable_store().as_str()
}

/// Records in this server's `nl_history`, as the caller, an answer another server of the
/// deployment gave (a hot standby, which cannot write): the object `nl_ask` or `nl_call`
/// returned there. Returns the history id (for `nl_feedback`), or NULL when
/// `sql_query_engine.history` is off. It writes only the row the caller could insert itself.
#[pg_extern(volatile, parallel_unsafe)]
fn nl_history_add(
    answer: Option<JsonArgument>,
    function: default!(Option<&str>, "'nl_ask'"),
    session: default!(Option<&str>, "NULL"),
) -> Option<i64> {
    let function = admitted(
        "nl_history_add",
        session,
        || "",
        || {
            function.ok_or_else(|| {
                Error::sql(
                    "22004",
                    "nl_history_add needs the function that answered",
                    None,
                )
            })
        },
    );
    // The rows are not recorded: they are dropped unread.
    let answer = answer
        .map(|a| a.parse("answer", &["rows"], MAX_ANSWER_BYTES, MAX_ANSWER_VALUES))
        .transpose()
        .map(Option::unwrap_or_default);
    let question = answer
        .as_ref()
        .ok()
        .and_then(|a| a["question"].as_str())
        .unwrap_or_default()
        .to_string();
    // A refused answer is audited too, with its session (a name of any length is cut there).
    history::audited_in("nl_history_add", session, &question, move || {
        session.map_or(Ok(()), session::check_name)?;
        history::record_answer(function, session, &answer?)
    })
    .unwrap_or_else(|e| e.raise())
}

/// Bytes of JSON text, and values, of an answer given to `nl_history_add` without its rows, at
/// most: a trace's attempts, each with its SQL and error.
const MAX_ANSWER_BYTES: usize = 16 << 20;
const MAX_ANSWER_VALUES: usize = 100_000;

/// Checks SQL with the guard, without running it: raises the refusal as an ERROR (25006 for a
/// write, 42501 for a forbidden function, type, clause or relation, the parser's own SQLSTATE
/// for a syntax or name error), or returns. Parse analysis can run code (a literal's
/// conversion to a domain runs its CHECK), so the check runs in the sandbox, always rolled
/// back, behind the runtime gate: nothing it did outlives it.
#[pg_extern(stable, parallel_unsafe)]
fn nl_check(sql: &str) {
    admitted("nl_check", None, || sql, || Ok(()));
    history::audited("nl_check", sql, || {
        arguments::sql(sql)?;
        exec::check(sql, None)
    })
    .unwrap_or_else(|e| e.raise());
}

/// The schema context exactly as the model would see it for `question` (all of it without
/// one), verified examples included.
#[pg_extern(volatile, parallel_unsafe)]
fn nl_schema(question: default!(Option<&str>, "NULL")) -> String {
    let question = question.filter(|q| !q.trim().is_empty());
    admitted(
        "nl_schema",
        None,
        || question.unwrap_or(""),
        || question.map_or(Ok(()), arguments::question),
    );
    history::audited("nl_schema", question.unwrap_or(""), || {
        database_context(question).map(|context| context.text)
    })
    .unwrap_or_else(|e| e.raise())
}

fn run_mode() -> Mode {
    Mode::Run(exec::Limits::from_settings())
}

/// A result as the rows a set-returning function returns; a cut result says so.
fn rows_of(result: Option<&ResultSet>) -> SetOfIterator<'static, JsonB> {
    let Some(result) = result else {
        return SetOfIterator::new(Vec::new());
    };
    if let Some(setting) = result.cut_by {
        crate::error::notice(format!(
            "sql_query_engine: the result was cut at {} rows (sql_query_engine.{setting})",
            result.rows.len()
        ));
    }
    let rows: Vec<JsonB> = result
        .rows
        .iter()
        .map(|text| JsonB(trace::parsed_row(text)))
        .collect();
    SetOfIterator::new(rows)
}

/// What the prompt says about the database for a question: its text, the schema shown, and
/// where the question's values are stored (for repairs).
struct DatabaseContext {
    text: String,
    /// The relations the model's queries (and examples) may name: the schema context's.
    scope: Scope,
    schema: PromptSchema,
    values: Option<String>,
    /// The value index, when it is on and there is a question (to check answers' values).
    index: Option<Rc<values::ValueIndex>>,
    /// Where the session's turns are kept, when the call has a session.
    session: Option<session::Store>,
    /// How many earlier turns the model saw, and whether the caller sent them.
    turns: (usize, bool),
    /// The call's `nl_history` row, when one was written (for `nl_feedback`).
    history_id: Option<i64>,
    /// Similar examples left out because their SQL no longer passes the guard.
    examples_skipped: Vec<i64>,
    /// A shown example that answers the question as a template, instantiated.
    template: Option<templates::Instantiated>,
    /// The example whose template the run started from, when one did.
    template_used: Option<i64>,
    /// Why the answer is withheld, when `abstain = when_in_doubt` and the run is in doubt:
    /// judged once, for the session's turn and for the functions that raise it.
    withheld: Option<Error>,
    /// The answer in plain language (`nl_answer`), or why the model could not give it.
    described: Option<Result<String>>,
}

/// The schema, the question's values and the examples, as the prompt shows them.
fn database_context(question: Option<&str>) -> Result<DatabaseContext> {
    let (context, cached) = schema::load()?;
    let scope = context.scope();
    let index = (question.is_some() && settings::value_index()).then(|| values::index(&context));
    let matches = match (question, &index) {
        (Some(q), Some(index)) => index.lookup(q),
        _ => Vec::new(),
    };
    let evidence: Vec<usize> = matches.iter().map(|m| m.relation).collect();
    let schema = PromptSchema {
        cached,
        ..context.for_question(question, &evidence)
    };
    let values = values::describe(&matches);
    let wanted = settings::examples();
    let (examples, examples_skipped) = match question {
        Some(q) => {
            let focus = examples::Focus {
                relations: context.about(q, &evidence),
                values: matches.iter().map(|m| m.value.clone()).collect(),
            };
            examples::still_valid(
                examples::similar(q, wanted + examples::SPARE, &focus)?,
                wanted,
                &scope,
            )
        }
        None => (Vec::new(), Vec::new()),
    };
    let stored = |text: &str| index.as_ref().map(|i| i.stored(text)).unwrap_or_default();
    let template = question.and_then(|q| {
        templates::instantiate(q, &examples, &stored, &crate::lexer::only_values_differ)
    });
    Ok(DatabaseContext {
        text: prompt::database_context(&schema.text, values.as_deref(), &examples),
        schema,
        values,
        index,
        session: None,
        turns: (0, false),
        history_id: None,
        examples_skipped,
        template,
        template_used: None,
        withheld: None,
        described: None,
        scope,
    })
}

/// The model as the heal loop asks it: with `release`, nothing is held while it thinks (see
/// `subxact::release`), and a snapshot is taken again when it has answered.
struct Asked {
    chain: Chain,
    release: bool,
}

impl Asked {
    fn call<R>(&mut self, call: impl FnOnce(&mut Chain) -> R) -> R {
        let released = self.release && subxact::release();
        let result = call(&mut self.chain);
        if released {
            subxact::resume();
        }
        result
    }
}

impl Llm for Asked {
    fn complete(&mut self, messages: &[Message]) -> Result<Completion> {
        self.call(|chain| chain.complete(messages))
    }

    fn complete_exploring(&mut self, messages: &[Message]) -> Result<Completion> {
        self.call(|chain| chain.complete_exploring(messages))
    }

    fn complete_many(&mut self, messages: &[Message], n: usize) -> Result<Batch> {
        self.call(|chain| chain.complete_many(messages, n))
    }

    fn cut_at(&mut self, deadline: Option<std::time::Instant>) {
        self.chain.cut_at(deadline);
    }
}

/// The database the heal loop works on: this backend, as the caller.
struct LiveDatabase<'a> {
    /// The relations a query the caller did not write may name.
    scope: &'a Scope,
    mode: Mode,
    timeout_ms: i32,
    values: Option<String>,
    index: Option<Rc<values::ValueIndex>>,
    /// The columns an answer must have, when the caller named a row type.
    shape: Option<&'a [Field]>,
    /// The answer is saved as a view (`nl_view`, `nl_view_refresh`).
    saves_view: bool,
}

impl heal::Database for LiveDatabase<'_> {
    fn run(&mut self, sql: &str, kind: Kind) -> exec::Outcome {
        // The caller's own SQL (`nl_fix`) names what the caller chose; everything else stays
        // within what the caller was shown.
        let scope = (kind != Kind::Given).then_some(self.scope);
        history::ran(sql);
        let outcome =
            exec::attempt_in_loop(sql, self.mode, self.timeout_ms, scope, self.saves_view);
        match self.shape {
            Some(fields) => saved::fit(outcome, fields),
            None => outcome,
        }
    }

    fn hint(&mut self, sql: &str, error: &SqlError) -> Option<String> {
        hints::for_error(sql, error)
    }

    fn requalify(&mut self, sql: &str, error: &SqlError) -> Option<hints::Requalified> {
        hints::requalify(sql, error)
    }

    fn values(&mut self) -> Option<String> {
        self.values.clone()
    }

    fn misread(&mut self, sql: &str) -> Vec<String> {
        self.index.as_ref().map_or_else(Vec::new, |index| {
            index
                .misread(sql)
                .iter()
                .map(values::Misread::describe)
                .collect()
        })
    }
}

/// What one call asks for.
struct Ask<'a> {
    /// The SQL function, as the history and the audit name it.
    function: &'static str,
    question: Option<&'a str>,
    session: Option<&'a str>,
    mode: Mode,
    /// The caller's SQL to start from (`nl_fix`).
    first: Option<&'a str>,
    /// End the transaction before each model call, where that is allowed (`nl_call`).
    release: bool,
    /// The conversation's earlier turns as the caller sent them (`session::from_request`),
    /// instead of the session's stored ones.
    turns: Option<&'a JsonArgument>,
    /// The row type the answer must fit (`nl_query_as`).
    shape: Option<&'a [Field]>,
    /// The view the answer is saved as (`nl_view`, `nl_view_refresh`), for the audit line.
    view: Option<&'a str>,
}

impl<'a> Ask<'a> {
    fn new(function: &'static str, question: Option<&'a str>, session: Option<&'a str>) -> Self {
        Ask {
            function,
            question,
            session,
            mode: run_mode(),
            first: None,
            release: false,
            turns: None,
            shape: None,
            view: None,
        }
    }

    /// What the audit line gives as the call's input: the question, the caller's own SQL when
    /// it gave some (`nl_fix`), and the view. Each is cut before it is copied: over-long input
    /// is refused (and that refusal audited).
    fn audited_input(&self) -> String {
        let cut = |text: &str| text::at_most(text, arguments::MAX_SQL_CHARS);
        let mut input = match (self.question, self.first) {
            (Some(question), Some(sql)) => format!("{}\ngiven: {}", cut(question), cut(sql)),
            (question, sql) => cut(question.or(sql).unwrap_or("")),
        };
        if let Some(view) = self.view {
            input.push_str(&format!("\nview: {}", cut(view)));
        }
        input
    }

    /// `admitted` for this call.
    fn admitted<T>(&self, check: impl FnOnce() -> Result<T>) -> T {
        admitted(self.function, self.session, || self.audited_input(), check)
    }
}

/// The checks a call makes before it starts: not from code a query of the extension runs, nor
/// in parallel mode (`exec::outside_a_query`), then `check` (its arguments, the objects they
/// name). A refusal is audited as the call's outcome and raised.
fn admitted<T, S: AsRef<str>>(
    function: &str,
    session: Option<&str>,
    input: impl Fn() -> S,
    check: impl FnOnce() -> Result<T>,
) -> T {
    history::checked_first(function, session, input, || {
        exec::outside_a_query(function)?;
        check()
    })
    .unwrap_or_else(|e| e.raise())
}

/// `answer` for the functions that return the answer itself: a run without one is an error,
/// and every outcome is audited.
fn answered(ask: Ask) -> Result<(Run, DatabaseContext)> {
    answered_and(ask, |_, _| Ok(()))
}

/// `answered`, then `then` with the answer, inside the audit: its failure (a view that could
/// not be saved) is the call's, in the audit line too.
fn answered_and(
    ask: Ask,
    then: impl FnOnce(&Run, &DatabaseContext) -> Result<()>,
) -> Result<(Run, DatabaseContext)> {
    audited_run(ask, |(run, mut shown)| {
        if let Some(error) = run.failure().or_else(|| shown.withheld.take()) {
            return Err(error);
        }
        // The model could not put the answer in words (`nl_answer`): the call's error.
        if let Some(Err(error)) = shown.described.take_if(|d| d.is_err()) {
            return Err(error);
        }
        then(&run, &shown)?;
        Ok((run, shown))
    })
}

/// Whether a doubtful answer to `ask` is withheld: the caller's own SQL (nl_fix) is answered
/// as asked.
fn may_abstain(ask: &Ask) -> bool {
    settings::abstain() == AbstainSetting::WhenInDoubt && ask.first.is_none()
}

/// The error that withholds a doubtful answer (`abstain = when_in_doubt`): why, and the
/// interpretations the run hesitated between.
fn not_sure(run: &Run, shown: &DatabaseContext) -> Option<Error> {
    let verdict = confidence::assess(run, shown.schema.pruned);
    if verdict.sure() {
        return None;
    }
    let detail = match verdict.interpretations.as_slice() {
        [] => None,
        found => Some(format!(
            "It hesitated between:\n{}",
            found
                .iter()
                .enumerate()
                .map(|(i, line)| format!("{}. {line}", i + 1))
                .collect::<Vec<_>>()
                .join("\n")
        )),
    };
    Some(Error::NotSure(Box::new(SqlError {
        sqlstate: SqlState::NOT_SURE,
        message: format!(
            "not sure enough to answer \"{}\": {}",
            run.question,
            verdict.doubts.join("; ")
        ),
        detail,
        hint: Some(
            "Ask more precisely (name the table, column or value you mean), or SET \
             sql_query_engine.abstain = off for the best guess."
                .into(),
        ),
        ..Default::default()
    })))
}

/// `answer`, then `accept` on what it gave, audited either way.
fn audited_run(
    ask: Ask,
    accept: impl FnOnce((Run, DatabaseContext)) -> Result<(Run, DatabaseContext)>,
) -> Result<(Run, DatabaseContext)> {
    let input = ask.audited_input();
    let input = input.as_str();
    history::audit_raised(ask.function, ask.session, input, |caller| {
        let result = answer(&ask).and_then(accept);
        let outcome = match &result {
            Ok((run, shown)) => history::Audited::Answered(run, shown.history_id),
            Err(error) => history::Audited::Failed(error),
        };
        history::audit(caller, ask.function, ask.session, input, outcome);
        result
    })
}

/// The question `nl_fix` asks when the caller gave none.
const FIX_QUESTION: &str =
    "Fix this SQL query so that it runs and returns what it was written to return.";

/// The whole pipeline for one question.
fn answer(ask: &Ask) -> Result<(Run, DatabaseContext)> {
    let question = match (ask.question.filter(|q| !q.trim().is_empty()), ask.first) {
        (Some(q), _) => q,
        (None, Some(_)) => FIX_QUESTION,
        (None, None) => {
            return Err(Error::InvalidParameter(
                "the question is empty: ask something".into(),
            ))
        }
    };
    arguments::question(question)?;
    if let Some(sql) = ask.first {
        arguments::sql(sql)?;
    }
    let started = std::time::Instant::now();
    let session = ask.session.filter(|s| !s.is_empty());
    if let Some(name) = session {
        session::check_name(name)?;
    }
    let mut llm = Asked {
        chain: llm::configured(true)?,
        release: ask.release,
    };
    let progress = Progress::new(session);
    // The schema is chosen for the question, and for the tables a given SQL names.
    let retrieval = match ask.first {
        Some(sql) => format!("{question}\n{sql}"),
        None => question.to_string(),
    };
    let mut shown = database_context(Some(&retrieval))?;
    progress.emit(Event::SchemaReady {
        relations: shown.schema.relations.len(),
        pruned: shown.schema.pruned,
    });
    let (turns, store) = match (ask.turns, session) {
        (Some(sent), _) => {
            let sent = sent.parse(
                "turns",
                &[],
                session::MAX_REQUEST_BYTES,
                session::MAX_REQUEST_VALUES,
            )?;
            (session::from_request(&sent)?, None)
        }
        (None, Some(s)) => {
            let (turns, store) = session::turns(s);
            (turns, Some(store))
        }
        (None, None) => (Vec::new(), None),
    };
    // Each token of the schema is about four characters: the turns get as many again.
    let turns = session::within(turns, settings::prompt_budget().saturating_mul(4));
    shown.session = store;
    shown.turns = (turns.len(), ask.turns.is_some());
    // The caller's own SQL first; else a verified example that answers a question asked on its
    // own (a follow-up means more than its words).
    let start = match (ask.first, &shown.template) {
        (Some(sql), _) => Some(Start::Given(sql)),
        (None, Some(template)) if turns.is_empty() => {
            shown.template_used = Some(template.example_id);
            Some(Start::Template(template.sql.as_str()))
        }
        _ => None,
    };
    let mut database = LiveDatabase {
        scope: &shown.scope,
        mode: ask.mode,
        timeout_ms: settings::statement_timeout_ms(),
        values: shown.values.clone(),
        index: shown.index.clone(),
        shape: ask.shape,
        saves_view: matches!(ask.function, "nl_view" | "nl_view_refresh"),
    };
    // A doubtful answer that will be withheld must first be known to be doubtful: every
    // first query is then put to a vote (the candidates' agreement is the signal).
    let abstain = may_abstain(ask);
    let limits = Limits {
        max_repairs: settings::max_repairs(),
        share_values: settings::sample_values() > 0,
        vote: match settings::vote() {
            VoteSetting::Off => Vote::Off,
            VoteSetting::WhenInDoubt if abstain => Vote::Always,
            VoteSetting::WhenInDoubt => Vote::WhenInDoubt,
            VoteSetting::Always => Vote::Always,
        },
        candidates: settings::candidates(),
        abstain,
        agreement: settings::abstain_agreement(),
        deadline: started.checked_add(settings::answer_budget()),
    };
    let mut run = heal::solve(
        question,
        prompt::initial(&shown.text, &turns, question),
        start,
        limits,
        &mut llm,
        &mut database,
        &mut |event| progress.emit(event),
    )?;
    // The whole call, reading the schema and the session included (the loop timed itself).
    run.ms = heal::millis(started);
    if let (Some(failure), None) = (&run.llm_failure, run.failure()) {
        crate::error::warning(format!(
            "sql_query_engine: the model failed when asked for a repair ({}: {}); the best \
             attempt so far is the answer",
            failure.endpoint, failure.cause
        ));
    }
    // Its SQLSTATE only: the message may be another role's text (a view's code), which must
    // not pass for the extension's own line; the trace and the history keep it.
    if let (Some((attempt, error)), None) = (run.broken(), run.failure()) {
        crate::error::warning(format!(
            "sql_query_engine: PostgreSQL failed under attempt {attempt} ({}); the loop \
             stopped there and the best attempt so far is the answer",
            error.sqlstate.as_str(),
        ));
    }
    if run.out_of_time {
        crate::error::notice(format!(
            "sql_query_engine: the answer budget (sql_query_engine.answer_budget) ran out after \
             {} attempts; the best attempt so far is the answer",
            run.attempts.len()
        ));
    }
    // Turns the caller sent are its own to keep: the session store is left alone. A doubtful
    // answer that is withheld (`abstain = when_in_doubt`) is not the conversation's answer:
    // the next question must not build on it.
    shown.withheld = may_abstain(ask).then(|| not_sure(&run, &shown)).flatten();
    if let (Some(session), Some(sql), None, None) = (
        session,
        run.failure().is_none().then(|| run.final_sql()).flatten(),
        ask.turns,
        &shown.withheld,
    ) {
        session::record(
            session,
            Turn {
                question: question.to_string(),
                sql: sql.to_string(),
            },
        );
    }
    if ask.function == "nl_answer" && run.failure().is_none() && shown.withheld.is_none() {
        shown.described = Some(described(&mut run));
    }
    if ask.function != "nl_trace" {
        shown.history_id = history::record(ask.function, session, &run);
    }
    Ok((run, shown))
}
