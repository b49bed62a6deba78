//! The OpenAI-compatible API (`/v1/models`, `/v1/chat/completions`), for chat UIs (Open WebUI,
//! LibreChat) and any OpenAI SDK. The question is the last user message and its context the
//! conversation the request carries (`conversation`); a client's housekeeping (titles, tags,
//! follow-ups) is answered here without the database (`housekeeping`). The answer is Markdown:
//! a one-line summary, the SQL, and the rows as a table. A streamed answer first sends the
//! extension's progress as `reasoning_content` deltas (shown as the model's reasoning by Open
//! WebUI and LibreChat, ignored by clients that do not know it), then the answer.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, Extension, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::app::{App, Role};
use crate::conversation::{ChatMessage, Conversation};
use crate::db::{AbortOnDrop, Answer, Call, DbError};
use crate::errors::ApiError;
use crate::housekeeping::Task;
use crate::shown::{legible, moves_text};
use crate::watch::ClientGone;

#[derive(Deserialize)]
struct ChatRequest {
    model: Option<String>,
    messages: Vec<ChatMessage>,
    #[serde(default)]
    stream: bool,
    chat_id: Option<String>,
    metadata: Option<Value>,
    stream_options: Option<StreamOptions>,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// The header a client that sends only the last message names its server-side session with.
pub const SESSION_HEADER: &str = "x-sqe-session";

fn completion_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!(
        "chatcmpl-{nanos:x}{:x}",
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn created() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub async fn models(State(app): State<App>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{"id": app.model, "object": "model", "created": 0, "owned_by": "sql_query_engine"}],
    }))
}

/// What the request asks and how to answer it.
struct Asked {
    /// A question about the data, or the client's housekeeping.
    what: Wanted,
    stream: bool,
    include_usage: bool,
}

enum Wanted {
    Question(Call),
    Housekeeping(Task),
}

fn read_request(
    app: &App,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Asked, ApiError> {
    let body = body.map_err(|e| match e {
        BytesRejection::FailedToBufferBody(_) => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is larger than {} bytes", app.max_body),
        ),
        other => ApiError::bad_request(other.to_string()),
    })?;
    let request: ChatRequest = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!("the body is not a chat completion request: {e}"))
    })?;
    if let Some(model) = request.model.as_deref().filter(|m| !m.is_empty()) {
        if model != app.model {
            return Err(ApiError {
                code: Some("model_not_found".into()),
                ..ApiError::new(
                    StatusCode::NOT_FOUND,
                    "invalid_request_error",
                    format!(
                        "the model '{model}' does not exist; this gateway serves '{}'",
                        app.model
                    ),
                )
            });
        }
    }
    let (stream, include_usage) = (
        request.stream,
        request.stream_options.is_some_and(|o| o.include_usage),
    );
    if let Some(task) = Task::of(&request.messages) {
        return Ok(Asked {
            what: Wanted::Housekeeping(task),
            stream,
            include_usage,
        });
    }
    let conversation = Conversation::of(&request.messages)
        .ok_or_else(|| ApiError::bad_request("the conversation has no user message to answer"))?;
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    // The client's chat id, when it sends one, only labels the history.
    let chat_id = request
        .chat_id
        .or_else(|| {
            request
                .metadata
                .as_ref()
                .and_then(|m| m.get("chat_id"))
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .or_else(|| header("x-openwebui-chat-id"))
        .filter(|id| !id.is_empty())
        .map(|id| format!("chat-{id}"));
    // A client that sends only the last message keeps its context on the server, in the
    // session it names; a request that carries earlier turns is its own context.
    let server_session = header(SESSION_HEADER);
    let call = match server_session {
        Some(session) if conversation.turns.is_empty() => Call::Ask {
            question: conversation.question,
            session: Some(session),
            turns: None,
        },
        named => Call::Ask {
            turns: Some(conversation.turns_json()),
            question: conversation.question,
            session: named.or(chat_id),
        },
    };
    Ok(Asked {
        what: Wanted::Question(call),
        stream,
        include_usage,
    })
}

/// A cell of a Markdown table.
fn cell(value: &Value) -> String {
    match value {
        Value::Null => "NULL".to_string(),
        Value::String(s) => plain(s),
        other => plain(&other.to_string()),
    }
}

/// `text` as Markdown that shows it as it is, on one line: every character that could start
/// markup (a link, an image, HTML, emphasis, a table cell) escaped, and what GitHub-flavoured
/// Markdown would make a link by itself (`https://…`, `www.…`, `name@host`) broken; line
/// breaks made spaces, other control characters and bidirectional overrides left out (before
/// the rest is decided, so that nothing left out joins what is broken). What the database
/// holds, what its columns are named and what the model wrote are another's text: rendered as
/// written, an image in it would be fetched by the chat client as the answer is shown, with
/// data in its URL, and a link would look like the answer's own.
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text.chars().filter_map(shown as fn(char) -> Option<char>);
    // How many `w`s (either case) were written last: linear, whatever the text.
    let mut ws = 0;
    while let Some(c) = rest.next() {
        let after_www = ws >= 3;
        ws = if c.eq_ignore_ascii_case(&'w') {
            ws + 1
        } else {
            0
        };
        let scheme = c == ':' && {
            let mut ahead = rest.clone();
            ahead.next() == Some('/') && ahead.next() == Some('/')
        };
        match c {
            '\\' | '`' | '*' | '_' | '[' | ']' | '(' | ')' | '{' | '}' | '<' | '>' | '!' | '|'
            | '~' | '&' | '#' => {
                out.push('\\');
                out.push(c);
            }
            // A backslash stops a parser's autolinks; a word joiner (shown as nothing) stops
            // those found in the text after parsing, which reads escapes as their character
            // (remark-gfm's).
            '@' => out.push_str("\u{2060}\\@"),
            ':' if scheme => out.push_str("\u{2060}\\:"),
            '.' if after_www => out.push_str("\u{2060}\\."),
            c => out.push(c),
        }
    }
    out
}

/// A character of outside text as `plain` shows it: a line break as a space, other control
/// characters and bidirectional overrides not at all.
fn shown(c: char) -> Option<char> {
    match c {
        '\n' | '\r' => Some(' '),
        c if c.is_control() || moves_text(c) => None,
        c => Some(c),
    }
}

/// The longest run of backticks in `text`.
fn backticks(text: &str) -> usize {
    text.split(|c| c != '`').map(str::len).max().unwrap_or(0)
}

/// `code` in a fenced block that nothing in it can end: the fence is longer than any run of
/// backticks inside.
fn fenced(code: &str, language: &str) -> String {
    let code = legible(code, false);
    let code = code.as_str();
    let fence = "`".repeat((backticks(code) + 1).max(3));
    format!("{fence}{language}\n{code}\n{fence}")
}

/// `code` as inline code that nothing in it can end, on one line.
fn code_span(code: &str) -> String {
    let code = legible(code, true);
    let ticks = "`".repeat(backticks(&code) + 1);
    let pad = if code.contains('`') { " " } else { "" };
    format!("{ticks}{pad}{code}{pad}{ticks}")
}

/// One line on what was found and how: "3 rows.", "3 rows, from repair 1 of 4.", "No rows: the
/// query ran and found nothing (asked 4 alternatives, 3 agreed)."
fn summary(trace: &Value, rows: usize) -> String {
    let found = match rows {
        0 => "No rows: the query ran and found nothing".to_string(),
        1 => "1 row".to_string(),
        n => format!("{n} rows"),
    };
    let cut = trace["cut_by"]
        .as_str()
        .map(|setting| format!(", cut at sql_query_engine.{setting}"))
        .unwrap_or_default();
    let mut how: Vec<String> = Vec::new();
    let vote = &trace["vote"];
    if let Some(alternatives) = vote["alternatives"].as_u64().filter(|n| *n > 0) {
        how.push(match vote["agreed"].as_u64() {
            Some(agreed) if agreed >= 2 => {
                format!("asked {alternatives} alternatives, {agreed} agreed")
            }
            Some(_) => format!("asked {alternatives} alternatives, no two agreed"),
            None => format!("asked {alternatives} alternatives, none ran with a result"),
        });
    }
    if let Some(by) = trace["answered_by"]
        .as_str()
        .filter(|by| by.starts_with("repair"))
    {
        how.push(format!("from {by}"));
    }
    if rows == 0 && trace["confirmed_empty"] == true {
        how.push("the model confirmed the query".into());
    }
    match (rows, how.is_empty()) {
        (_, true) => format!("{found}{cut}."),
        (0, false) => format!("{found} ({}).", how.join("; ")),
        _ => format!("{found}{cut}, {}.", how.join("; ")),
    }
}

/// The answer as Markdown: a one-line summary, the SQL, the rows (at most `max_rows`).
pub fn markdown(answer: &Answer, max_rows: usize) -> String {
    let trace = &answer.value;
    let (count, rows) = (answer.row_count(), answer.first_rows(max_rows));
    let columns: Vec<String> = trace["columns"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let summary = summary(trace, count);
    let mut out = format!(
        "{summary}\n\n{}\n",
        fenced(trace["sql"].as_str().unwrap_or_default(), "sql")
    );
    if count > 0 && !columns.is_empty() {
        out.push('\n');
        out.push_str(&format!(
            "| {} |\n",
            columns
                .iter()
                .map(|c| plain(c))
                .collect::<Vec<_>>()
                .join(" | ")
        ));
        out.push_str(&format!("|{}\n", "---|".repeat(columns.len())));
        for row in &rows {
            let cells: Vec<String> = row
                .as_array()
                .map(|r| r.iter().map(cell).collect())
                .unwrap_or_default();
            out.push_str(&format!("| {} |\n", cells.join(" | ")));
        }
        if count > rows.len() {
            out.push_str(&format!("\n_{} more rows_\n", count - rows.len()));
        }
    }
    out
}

fn usage(trace: &Value) -> Value {
    let prompt = trace["prompt_tokens"].as_u64().unwrap_or(0);
    let completion = trace["completion_tokens"].as_u64().unwrap_or(0);
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt.saturating_add(completion)})
}

fn chunk(id: &str, model: &str, delta: Value, finish: Option<&str>) -> Event {
    let body = json!({
        "id": id, "object": "chat.completion.chunk", "created": created(), "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    });
    Event::default().data(body.to_string())
}

pub async fn chat(
    State(app): State<App>,
    ConnectInfo(ClientGone(gone)): ConnectInfo<ClientGone>,
    Extension(Role { name: role, client }): Extension<Role>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let asked = match read_request(&app, &headers, body) {
        Ok(asked) => asked,
        Err(e) => return e.into_response(),
    };
    let call = match asked.what {
        Wanted::Question(call) => call.of_client(Some(&client)),
        // The client's housekeeping is answered here: no model call, no query, no history.
        Wanted::Housekeeping(task) => {
            return said(&app, task.answer(), asked.stream, asked.include_usage)
        }
    };
    if !asked.stream {
        let answered = tokio::select! {
            answered = tokio::time::timeout(app.timeout, app.db.call(Some(&role), &call, None)) => answered,
            // Dropping the call cancels its query; nobody reads this answer.
            _ = gone.cancelled() => return ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", "the client went away").into_response(),
        };
        return match answered.map(|result| content(result, app.max_table_rows)) {
            Err(_) => ApiError::timeout().into_response(),
            Ok(Err(e)) => e.into_response(),
            Ok(Ok(answer)) => completion(&app, answer),
        };
    }
    stream(app, role, call, asked.include_usage, gone).await
}

/// `POST /v1/feedback` `{"history_id": N, "correct": true|false, "corrected_sql": "..."}`: a
/// thumbs-up or -down (or a correction) on an answer, as the token's role, for chat clients
/// that can call a URL from their rating buttons. The answer is what `nl_feedback` returned.
pub async fn feedback(
    State(app): State<App>,
    ConnectInfo(ClientGone(gone)): ConnectInfo<ClientGone>,
    Extension(Role { name: role, .. }): Extension<Role>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let bad = |message: String| {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message).into_response()
    };
    let Ok(body) = body else {
        return bad("the request body could not be read".into());
    };
    let Ok(value) = serde_json::from_slice::<Value>(&body) else {
        return bad("the body is not JSON".into());
    };
    let (Some(history_id), Some(correct)) =
        (value["history_id"].as_i64(), value["correct"].as_bool())
    else {
        return bad("the body needs history_id (a number) and correct (true or false)".into());
    };
    let corrected_sql = match &value["corrected_sql"] {
        Value::Null => None,
        Value::String(sql) => Some(sql.clone()),
        _ => return bad("corrected_sql must be a string".into()),
    };
    let call = Call::Feedback {
        history_id,
        correct,
        corrected_sql,
    };
    let given = tokio::select! {
        given = tokio::time::timeout(app.timeout, app.db.call(Some(&role), &call, None)) => given,
        // Dropping the call cancels its query (a correction runs in the sandbox).
        _ = gone.cancelled() => return bad("the client went away".into()),
    };
    match given {
        Err(_) => ApiError::timeout().into_response(),
        Ok(Err(e)) => ApiError::from(e).into_response(),
        Ok(Ok(given)) => crate::shown::json_response(StatusCode::OK, &given.value),
    }
}

/// The explanation a chat user gets when what they wrote is not a question about the data (the
/// extension's 22023 "does not look like a question about the data"): an answer, not an error.
fn not_a_question(error: &DbError) -> Option<String> {
    match error {
        DbError::Sql {
            sqlstate,
            message,
            detail,
            hint,
            ..
        } if sqlstate == "22023" && message.starts_with("this does not look like a question") => {
            let mut text =
                "This does not look like a question about the data, so no query was run."
                    .to_string();
            if let Some(hint) = hint {
                text.push(' ');
                text.push_str(&plain(hint));
            }
            if let Some(said) = detail
                .as_deref()
                .and_then(|d| d.strip_prefix("the model said: "))
            {
                text.push('\n');
                for line in said.lines() {
                    text.push_str(&format!("\n> {}", plain(line)));
                }
            }
            Some(text)
        }
        _ => None,
    }
}

/// A complete answer the gateway writes itself, as one completion or one stream.
fn said(app: &App, content: String, stream: bool, include_usage: bool) -> Response {
    let answer = (content, usage(&Value::Null));
    if !stream {
        return completion(app, answer);
    }
    streamed(app, answer, include_usage)
}

/// A complete answer as one stream.
fn streamed(app: &App, answer: (String, Value), include_usage: bool) -> Response {
    let (events, receiver) = mpsc::channel::<Event>(8);
    tokio::spawn(finish(
        events,
        app.model.clone(),
        completion_id(),
        Ok(answer),
        include_usage,
        true,
    ));
    sse(receiver)
}

/// An answer as one (non-streamed) chat completion.
fn completion(app: &App, (content, usage): (String, Value)) -> Response {
    Json(json!({
        "id": completion_id(), "object": "chat.completion", "created": created(),
        "model": app.model,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": usage,
    }))
    .into_response()
}

/// Progress lines kept for a client that reads slower than the server reports: more are
/// dropped (the answer itself never is).
const MAX_PENDING_PROGRESS: usize = 256;

/// A streamed answer. The HTTP status is decided by what happens first: a call that fails
/// before it reports any progress gets its own error status; once progress flows, the stream
/// is 200 and a later failure ends it with an error object, as OpenAI's streams do. When the
/// client's connection is gone (or the gateway stops), the call is dropped, and so cancelled.
async fn stream(
    app: App,
    role: String,
    call: Call,
    include_usage: bool,
    gone: tokio_util::sync::CancellationToken,
) -> Response {
    let (progress_tx, mut progress) = mpsc::channel::<String>(MAX_PENDING_PROGRESS);
    let db = app.db.clone();
    let timeout = app.timeout;
    let mut task = AbortOnDrop(tokio::spawn(async move {
        tokio::time::timeout(timeout, db.call(Some(&role), &call, Some(progress_tx))).await
    }));
    // A call that ends before its first progress line is answered with its own status (a
    // 429 or 503 keeps its Retry-After): its progress sender goes with it, so the end is
    // looked at first, and a closed channel waits for it.
    let at_once = |finished: Result<Result<_, _>, tokio::task::JoinError>| match finished {
        Ok(Err(_)) => ApiError::timeout().into_response(),
        Err(e) => internal(&e).into_response(),
        Ok(Ok(result)) => match content(result, app.max_table_rows) {
            Err(e) => e.into_response(),
            Ok(answer) => streamed(&app, answer, include_usage),
        },
    };
    let first = tokio::select! {
        biased;
        finished = &mut task.0 => return at_once(finished),
        () = gone.cancelled() => {
            return ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", "the client went away").into_response();
        }
        notice = progress.recv() => match notice {
            Some(notice) => notice,
            None => return at_once((&mut task.0).await),
        },
    };
    let (events, receiver) = mpsc::channel::<Event>(64);
    let (model, id, max_rows) = (app.model.clone(), completion_id(), app.max_table_rows);
    tokio::spawn(async move {
        let reasoning = |text: &str| json!({"reasoning_content": format!("{}\n", plain(text.trim_start_matches("sql_query_engine: ")))});
        let _ = events
            .send(chunk(
                &id,
                &model,
                json!({"role": "assistant", "content": ""}),
                None,
            ))
            .await;
        let _ = events
            .send(chunk(&id, &model, reasoning(&first), None))
            .await;
        let outcome = loop {
            tokio::select! {
                notice = progress.recv() => {
                    if let Some(notice) = notice {
                        if events.send(chunk(&id, &model, reasoning(&notice), None)).await.is_err() {
                            return;
                        }
                    }
                }
                finished = &mut task.0 => break finished,
                // The client went away: the query is cancelled with the task.
                _ = events.closed() => return,
                () = gone.cancelled() => return,
            }
        };
        while let Ok(notice) = progress.try_recv() {
            let _ = events
                .send(chunk(&id, &model, reasoning(&notice), None))
                .await;
        }
        let result = match outcome {
            Ok(Ok(result)) => content(result, max_rows),
            Ok(Err(_)) => Err(ApiError::timeout()),
            Err(e) => Err(internal(&e)),
        };
        finish(events, model, id, result, include_usage, false).await;
    });
    sse(receiver)
}

/// A call's task that ended without an answer (aborted, or a panic): said in the gateway's
/// log, and to the client without the panic's text.
fn internal(error: &tokio::task::JoinError) -> ApiError {
    log_line!("sqe-gateway: a call ended without an answer: {error}");
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        "the call ended without an answer; the gateway's log says why",
    )
}

/// The question a chat user is asked back when the extension withheld a doubtful answer
/// (`42P08`, with `sql_query_engine.abstain = when_in_doubt`): the interpretations it
/// hesitated between, to choose from.
fn not_sure(error: &DbError) -> Option<String> {
    match error {
        DbError::Sql {
            sqlstate, detail, ..
        } if sqlstate == "42P08" => {
            let mut text = "I am not sure what you mean, so I did not guess.".to_string();
            match detail
                .as_deref()
                .and_then(|d| d.strip_prefix("It hesitated between:\n"))
            {
                Some(choices) => {
                    text.push_str(" Which of these did you mean?\n\n");
                    for line in choices.lines() {
                        text.push_str(&format!("- {}\n", code_span(line)));
                    }
                }
                None => text.push_str(" Could you name the table, column or value you mean?"),
            }
            Some(text)
        }
        _ => None,
    }
}

/// What a call's result says to the user: the answer's Markdown and its usage, the
/// explanation of a message that was no question, the question asked back when the answer
/// was too doubtful, or the error.
fn content(result: Result<Answer, DbError>, max_rows: usize) -> Result<(String, Value), ApiError> {
    match result {
        Ok(answer) => Ok((markdown(&answer, max_rows), usage(&answer.value))),
        Err(e) => match not_a_question(&e).or_else(|| not_sure(&e)) {
            Some(text) => Ok((text, usage(&Value::Null))),
            // Chat clients render what they show as Markdown, errors too: a message may quote
            // what the model wrote (a column name that does not exist), which must not become
            // a link or an image the client fetches.
            None => {
                let mut error = ApiError::from(e);
                error.message = plain(&error.message);
                Err(error)
            }
        },
    }
}

/// The end of a stream: the answer (or the error), the final chunk, usage when asked, [DONE].
async fn finish(
    events: mpsc::Sender<Event>,
    model: String,
    id: String,
    result: Result<(String, Value), ApiError>,
    include_usage: bool,
    opening: bool,
) {
    if opening {
        let _ = events
            .send(chunk(
                &id,
                &model,
                json!({"role": "assistant", "content": ""}),
                None,
            ))
            .await;
    }
    match result {
        Ok((content, usage)) => {
            let _ = events
                .send(chunk(&id, &model, json!({ "content": content }), None))
                .await;
            let _ = events
                .send(chunk(&id, &model, json!({}), Some("stop")))
                .await;
            if include_usage {
                let body = json!({"id": id, "object": "chat.completion.chunk", "created": created(),
                                  "model": model, "choices": [], "usage": usage});
                let _ = events.send(Event::default().data(body.to_string())).await;
            }
        }
        Err(error) => {
            let _ = events
                .send(Event::default().data(error.body().to_string()))
                .await;
        }
    }
    let _ = events.send(Event::default().data("[DONE]")).await;
}

fn sse(receiver: mpsc::Receiver<Event>) -> Response {
    let stream = futures::StreamExt::map(
        tokio_stream::wrappers::ReceiverStream::new(receiver),
        Ok::<_, Infallible>,
    );
    Sse::new(stream)
        .keep_alive(axum::response::sse::KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_withheld_answer_is_asked_back_with_its_interpretations() {
        let error = DbError::Sql {
            sqlstate: "42P08".into(),
            message: "not sure enough to answer \"q\": the alternatives did not agree".into(),
            detail: Some("It hesitated between:\n1. SELECT 1 (1 row)\n2. SELECT 2 (1 row)".into()),
            hint: None,
            server_side: false,
        };
        let text = not_sure(&error).expect("asked back");
        assert!(text.starts_with("I am not sure what you mean"), "{text}");
        assert!(
            text.contains("- `1. SELECT 1 (1 row)`\n- `2. SELECT 2 (1 row)`"),
            "{text}"
        );
        let other = DbError::Sql {
            sqlstate: "42703".into(),
            message: "column does not exist".into(),
            detail: None,
            hint: None,
            server_side: false,
        };
        assert!(not_sure(&other).is_none());
    }

    #[test]
    fn the_answer_is_a_summary_the_sql_and_a_capped_table() {
        let trace = json!({
            "sql": "SELECT name, n FROM t",
            "columns": ["name", "n"],
            "rows": [["a|b", 1], ["c", null], ["d", 3]],
            "attempts": [{}, {}],
            "answered_by": "repair 1 of 4",
            "truncated": false,
        });
        let md = markdown(&Answer::from_json(&trace.to_string()), 2);
        assert!(
            md.starts_with("3 rows, from repair 1 of 4.\n\n```sql\nSELECT name, n FROM t\n```\n"),
            "{md}"
        );
        assert!(
            md.contains("| name | n |\n|---|---|\n| a\\|b | 1 |\n| c | NULL |\n"),
            "{md}"
        );
        assert!(md.contains("_1 more rows_"), "{md}");
        // No table rows shown: the header and the count of the rows left out still are.
        let none = markdown(&Answer::from_json(&trace.to_string()), 0);
        assert!(
            none.contains("| name | n |\n|---|---|\n\n_3 more rows_"),
            "{none}"
        );
        let empty = markdown(
            &Answer::from_json(
                &json!({"sql": "SELECT 1 WHERE false", "rows": [], "attempts": [{}]}).to_string(),
            ),
            5,
        );
        assert!(empty.starts_with("No rows"), "{empty}");
    }

    #[test]
    fn what_the_database_and_the_model_wrote_never_becomes_markup() {
        let trace = json!({
            "sql": "SELECT '```' AS x, '![a](https://evil.example/?d=1)' AS \"<img src=x>\"",
            "columns": ["x", "<img src=x>"],
            "rows": [["```", "![a](https://evil.example/?d=1)\n<b>"]],
            "attempts": [{}],
        });
        let md = markdown(&Answer::from_json(&trace.to_string()), 5);
        assert!(
            md.contains("\n````sql\nSELECT '```' AS x"),
            "a fence longer than any backticks inside: {md}"
        );
        assert!(md.contains("| x | \\<img src=x\\> |"), "{md}");
        assert!(
            md.contains(
                "| \\`\\`\\` | \\!\\[a\\]\\(https\u{2060}\\://evil.example/?d=1\\) \\<b\\> |"
            ),
            "{md}"
        );
        assert_eq!(code_span("a `b` c"), "`` a `b` c ``");
        assert_eq!(code_span("SELECT 1"), "`SELECT 1`");
        assert_eq!(plain("a\u{7}b\r\nc"), "ab  c");
        // Nothing GitHub-flavoured Markdown would link by itself, nothing shown reordered.
        assert_eq!(
            plain("see https://evil.example/?d=1, WWW.evil.example or me@evil.example at 12:30"),
            "see https\u{2060}\\://evil.example/?d=1, WWW\u{2060}\\.evil.example or \
             me\u{2060}\\@evil.example at 12:30"
        );
        // Neither through characters left out nor read with its escapes as their characters.
        for text in [
            "https:\u{1}//evil.example",
            "ww\u{200E}w.evil.example",
            "me\u{202E}@evil.example",
            "HTTPS://evil.example",
        ] {
            let merged = plain(text).replace('\\', "").to_lowercase();
            assert!(
                !merged.contains("https://") && !merged.contains("www.") && !merged.contains("e@"),
                "{text:?}: {merged:?}"
            );
        }
        assert_eq!(plain("total\u{202E}01\u{2066}x\u{2069}"), "total01x");
        assert_eq!(plain("wWw.a w.b ww.c"), "wWw\u{2060}\\.a w.b ww.c");
        // Linear in the text: a cell of megabytes of dots is rendered at once, not in minutes.
        let started = std::time::Instant::now();
        assert_eq!(plain(&".".repeat(4 << 20)).len(), 4 << 20);
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
        assert_eq!(code_span("SELECT\u{202E} 1\n"), "`SELECT\\u{202e} 1 `");
        assert!(!fenced("SELECT 1 -- \u{2067}x", "sql").contains('\u{2067}'));
        // A model's SQL cannot drive the terminal that shows it (OSC 52 sets the clipboard, a
        // carriage return writes over what was shown, C1 CSI moves the cursor): each control
        // character is written out, line breaks and tabs kept.
        let hostile = "SELECT 1 -- \u{1b}]52;c;Y3VybA==\u{7}\r\u{9b}2J\u{7f}\n\tFROM t";
        assert_eq!(
            fenced(hostile, "sql"),
            "```sql\nSELECT 1 -- \\u{1b}]52;c;Y3VybA==\\u{7}\\u{d}\\u{9b}2J\\u{7f}\n\tFROM t\n```"
        );
        assert!(!code_span(hostile).chars().any(char::is_control));
        // An error quoting what the model wrote is no markup either.
        let failed = DbError::Sql {
            sqlstate: "42703".into(),
            message: "column \"![](https://evil.example/?d=1)\" does not exist".into(),
            detail: None,
            hint: Some("Perhaps you meant [this](https://evil.example/).".into()),
            server_side: false,
        };
        let error = content(Err(failed), 5).unwrap_err();
        assert!(!error.message.contains("]("), "{}", error.message);
        assert!(error.message.contains("\\!\\[\\]\\("), "{}", error.message);
    }

    #[test]
    fn the_summary_says_how_the_answer_was_found() {
        let said = |trace: Value, rows: usize| summary(&trace, rows);
        assert_eq!(said(json!({"answered_by": "the first query"}), 1), "1 row.");
        assert_eq!(
            said(json!({"answered_by": "repair 2 of 4"}), 3),
            "3 rows, from repair 2 of 4."
        );
        assert_eq!(
            said(
                json!({"answered_by": "alternative 1 of 4",
                       "vote": {"alternatives": 4, "agreed": 3}}),
                3
            ),
            "3 rows, asked 4 alternatives, 3 agreed."
        );
        assert_eq!(
            said(
                json!({"answered_by": "the first query", "confirmed_empty": true}),
                0
            ),
            "No rows: the query ran and found nothing (the model confirmed the query)."
        );
        assert_eq!(
            said(
                json!({"answered_by": "the first query", "cut_by": "max_rows"}),
                5
            ),
            "5 rows, cut at sql_query_engine.max_rows."
        );
    }
}
