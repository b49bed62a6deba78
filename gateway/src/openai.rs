//! The OpenAI-compatible API (`/v1/models`, `/v1/chat/completions`), for chat UIs (Open WebUI,
//! LibreChat) and any OpenAI SDK. The last user message is the question; the session is the
//! client's chat id when it sends one (Open WebUI does), else a stable hash of the
//! conversation's first user message, so follow-ups work. The answer is Markdown: a one-line
//! summary, the SQL, and the rows as a table. A streamed answer first sends the extension's
//! progress as `reasoning_content` deltas (shown as the model's reasoning by Open WebUI and
//! LibreChat, ignored by clients that do not know it), then the answer.

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
use crate::db::Call;
use crate::errors::ApiError;
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
struct ChatMessage {
    role: String,
    content: Option<Value>,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// A message's text: a string, or the text parts of a list of parts.
fn text_of(content: &Option<Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// FNV-1a: a hash that is the same in every build and version.
fn stable_hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

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

/// What the request asks: the question, the session, and how to answer.
struct Asked {
    question: String,
    session: String,
    stream: bool,
    include_usage: bool,
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
    let users: Vec<String> = request
        .messages
        .iter()
        .filter(|m| m.role == "user")
        .map(|m| text_of(&m.content))
        .collect();
    let question = users
        .last()
        .filter(|q| !q.trim().is_empty())
        .ok_or_else(|| ApiError::bad_request("the conversation has no user message to answer"))?
        .clone();
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
        .or_else(|| {
            headers
                .get("x-openwebui-chat-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        })
        .filter(|id| !id.is_empty());
    let session = match chat_id {
        Some(id) => format!("chat-{id}"),
        None => format!("conversation-{:016x}", stable_hash(&users[0])),
    };
    Ok(Asked {
        question,
        session,
        stream: request.stream,
        include_usage: request.stream_options.is_some_and(|o| o.include_usage),
    })
}

/// A cell of a Markdown table.
fn cell(value: &Value) -> String {
    let text = match value {
        Value::Null => "NULL".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    text.replace('|', "\\|").replace(['\n', '\r'], " ")
}

/// The answer as Markdown: a one-line summary, the SQL, the rows (at most `max_rows`).
pub fn markdown(trace: &Value, max_rows: usize) -> String {
    let rows = trace["rows"].as_array().cloned().unwrap_or_default();
    let columns: Vec<String> = trace["columns"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let attempts = trace["attempts"].as_array().map_or(0, Vec::len);
    let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
    let summary = if rows.is_empty() {
        format!(
            "No rows: the query ran and found nothing ({}).",
            plural(attempts, "attempt")
        )
    } else {
        format!(
            "{}{} ({}).",
            plural(rows.len(), "row"),
            match trace["cut_by"].as_str() {
                Some(setting) => format!(", cut at sql_query_engine.{setting}"),
                None => String::new(),
            },
            plural(attempts, "attempt")
        )
    };
    let mut out = format!(
        "{summary}\n\n```sql\n{}\n```\n",
        trace["sql"].as_str().unwrap_or_default()
    );
    if !rows.is_empty() && !columns.is_empty() {
        out.push('\n');
        out.push_str(&format!(
            "| {} |\n",
            columns
                .iter()
                .map(|c| c.replace('|', "\\|"))
                .collect::<Vec<_>>()
                .join(" | ")
        ));
        out.push_str(&format!("|{}\n", "---|".repeat(columns.len())));
        for row in rows.iter().take(max_rows) {
            let cells: Vec<String> = row
                .as_array()
                .map(|r| r.iter().map(cell).collect())
                .unwrap_or_default();
            out.push_str(&format!("| {} |\n", cells.join(" | ")));
        }
        if rows.len() > max_rows {
            out.push_str(&format!("\n_{} more rows_\n", rows.len() - max_rows));
        }
    }
    out
}

fn usage(trace: &Value) -> Value {
    let prompt = trace["prompt_tokens"].as_u64().unwrap_or(0);
    let completion = trace["completion_tokens"].as_u64().unwrap_or(0);
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
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
    Extension(Role(role)): Extension<Role>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let asked = match read_request(&app, &headers, body) {
        Ok(asked) => asked,
        Err(e) => return e.into_response(),
    };
    let call = Call::Ask {
        question: asked.question.clone(),
        session: Some(asked.session.clone()),
    };
    if !asked.stream {
        let answered = tokio::select! {
            answered = tokio::time::timeout(app.timeout, app.db.call(Some(&role), &call, None)) => answered,
            // Dropping the call cancels its query; nobody reads this answer.
            _ = gone.cancelled() => return ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", "the client went away").into_response(),
        };
        return match answered {
            Err(_) => ApiError::timeout().into_response(),
            Ok(Err(e)) => ApiError::from(e).into_response(),
            Ok(Ok(trace)) => Json(json!({
                "id": completion_id(), "object": "chat.completion", "created": created(),
                "model": app.model,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": markdown(&trace, app.max_table_rows)}}],
                "usage": usage(&trace),
            }))
            .into_response(),
        };
    }
    stream(app, role, call, asked.include_usage).await
}

/// A streamed answer. The HTTP status is decided by what happens first: a call that fails
/// before it reports any progress gets its own error status; once progress flows, the stream
/// is 200 and a later failure ends it with an error object, as OpenAI's streams do.
async fn stream(app: App, role: String, call: Call, include_usage: bool) -> Response {
    let (progress_tx, mut progress) = mpsc::unbounded_channel::<String>();
    let db = app.db.clone();
    let timeout = app.timeout;
    let mut task = tokio::spawn(async move {
        tokio::time::timeout(timeout, db.call(Some(&role), &call, Some(progress_tx))).await
    });
    let first = tokio::select! {
        notice = progress.recv() => notice,
        finished = &mut task => {
            match finished {
                Ok(Ok(Err(e))) => return ApiError::from(e).into_response(),
                Ok(Err(_)) => return ApiError::timeout().into_response(),
                Err(e) => return ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e.to_string()).into_response(),
                Ok(Ok(Ok(trace))) => {
                    let (events, receiver) = mpsc::channel::<Event>(64);
                    tokio::spawn(finish(events, app.model.clone(), completion_id(), Ok(trace), app.max_table_rows, include_usage, true));
                    return sse(receiver);
                }
            }
        }
    };
    let (events, receiver) = mpsc::channel::<Event>(64);
    let (model, id, max_rows) = (app.model.clone(), completion_id(), app.max_table_rows);
    tokio::spawn(async move {
        let reasoning = |text: &str| json!({"reasoning_content": format!("{}\n", text.trim_start_matches("sql_query_engine: "))});
        let _ = events
            .send(chunk(
                &id,
                &model,
                json!({"role": "assistant", "content": ""}),
                None,
            ))
            .await;
        if let Some(first) = first {
            let _ = events
                .send(chunk(&id, &model, reasoning(&first), None))
                .await;
        }
        let outcome = loop {
            tokio::select! {
                notice = progress.recv() => {
                    if let Some(notice) = notice {
                        if events.send(chunk(&id, &model, reasoning(&notice), None)).await.is_err() {
                            task.abort();
                            return;
                        }
                    }
                }
                finished = &mut task => break finished,
                // The client went away: the query is cancelled with the task.
                _ = events.closed() => {
                    task.abort();
                    return;
                }
            }
        };
        while let Ok(notice) = progress.try_recv() {
            let _ = events
                .send(chunk(&id, &model, reasoning(&notice), None))
                .await;
        }
        let result = match outcome {
            Ok(Ok(Ok(trace))) => Ok(trace),
            Ok(Ok(Err(e))) => Err(ApiError::from(e)),
            Ok(Err(_)) => Err(ApiError::timeout()),
            Err(e) => Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                e.to_string(),
            )),
        };
        finish(events, model, id, result, max_rows, include_usage, false).await;
    });
    sse(receiver)
}

/// The end of a stream: the answer (or the error), the final chunk, usage when asked, [DONE].
async fn finish(
    events: mpsc::Sender<Event>,
    model: String,
    id: String,
    result: Result<Value, ApiError>,
    max_rows: usize,
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
        Ok(trace) => {
            let _ = events
                .send(chunk(
                    &id,
                    &model,
                    json!({"content": markdown(&trace, max_rows)}),
                    None,
                ))
                .await;
            let _ = events
                .send(chunk(&id, &model, json!({}), Some("stop")))
                .await;
            if include_usage {
                let body = json!({"id": id, "object": "chat.completion.chunk", "created": created(),
                                  "model": model, "choices": [], "usage": usage(&trace)});
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
    fn the_answer_is_a_summary_the_sql_and_a_capped_table() {
        let trace = json!({
            "sql": "SELECT name, n FROM t",
            "columns": ["name", "n"],
            "rows": [["a|b", 1], ["c", null], ["d", 3]],
            "attempts": [{}, {}],
            "truncated": false,
        });
        let md = markdown(&trace, 2);
        assert!(
            md.starts_with("3 rows (2 attempts).\n\n```sql\nSELECT name, n FROM t\n```\n"),
            "{md}"
        );
        assert!(
            md.contains("| name | n |\n|---|---|\n| a\\|b | 1 |\n| c | NULL |\n"),
            "{md}"
        );
        assert!(md.contains("_1 more rows_"), "{md}");
        let empty = markdown(
            &json!({"sql": "SELECT 1 WHERE false", "rows": [], "attempts": [{}]}),
            5,
        );
        assert!(empty.starts_with("No rows"), "{empty}");
    }

    #[test]
    fn the_session_hash_is_stable() {
        assert_eq!(
            stable_hash("how many orders?"),
            stable_hash("how many orders?")
        );
        assert_ne!(stable_hash("a"), stable_hash("b"));
        assert_eq!(stable_hash(""), 0xcbf2_9ce4_8422_2325);
    }
}
