//! A scripted OpenAI-compatible server that plays the LLM in the tests.
//!
//! It answers per question (the question text is looked up in the request's messages), from a
//! queue of replies given by the test, records every request so that tests can assert what the
//! model was told, and can fail on purpose: HTTP errors, garbage, no choices, slowness, hang-ups.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

/// One scripted answer.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A chat completion whose content is `{"sql": "..."}`.
    Sql(String),
    /// A chat completion with this exact content.
    Content(String),
    /// A chat completion with one choice per content (an answer to a request with `n`).
    Choices(Vec<String>),
    /// An HTTP status with this body.
    Status(u16, String),
    /// HTTP 200 with a body that is not a chat completion.
    Raw(String),
    /// Wait, then answer.
    Slow(Duration, Box<Reply>),
    /// A streamed answer (server-sent events, as to a request with `stream`): one choice per
    /// content finishes at once, `stalled` more begin and never finish, and the stream is held
    /// open for `hold` before it ends without them.
    Stream {
        finished: Vec<String>,
        stalled: usize,
        hold: Duration,
    },
    /// Close the connection without answering.
    HangUp,
}

impl Reply {
    pub fn sql(sql: &str) -> Reply {
        Reply::Sql(sql.to_string())
    }
}

/// One request as the server received it.
#[derive(Clone, Debug)]
pub struct Request {
    pub path: String,
    pub headers: HashMap<String, String>,
    pub body: Value,
}

impl Request {
    /// Every message's content, joined: what the model read.
    pub fn text(&self) -> String {
        self.body["messages"]
            .as_array()
            .map(|m| {
                m.iter()
                    .filter_map(|m| m["content"].as_str())
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default()
    }

    /// The last message: the newest instruction (the repair feedback, after a failure).
    /// Whether this request asks for a repair (it carries feedback on an earlier attempt).
    pub fn is_repair(&self) -> bool {
        let last = self.last_message();
        last.contains("\n\nThis query ") || last.contains("This answer contained no SQL")
    }

    pub fn last_message(&self) -> String {
        self.body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default()
            .to_string()
    }
}

/// Answers computed from the request, for requests no script matches.
type Responder = Box<dyn Fn(&Request) -> Option<Reply> + Send>;

#[derive(Default)]
struct State {
    scripts: Vec<(String, Vec<Reply>)>,
    responder: Option<Responder>,
    requests: Vec<Request>,
    /// Requests received and not yet answered, and the most there ever were at once.
    in_flight: usize,
    most_in_flight: usize,
}

pub struct ScriptedLlm {
    port: u16,
    state: Arc<Mutex<State>>,
}

impl ScriptedLlm {
    pub fn start() -> ScriptedLlm {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the scripted LLM");
        let port = listener.local_addr().expect("its address").port();
        let state = Arc::new(Mutex::new(State::default()));
        let shared = Arc::clone(&state);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let state = Arc::clone(&shared);
                std::thread::spawn(move || serve(stream, &state));
            }
        });
        ScriptedLlm { port, state }
    }

    /// The base URL to put in `sql_query_engine.llm_url`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// Requests whose messages contain `question` get `replies`, in order. More requests than
    /// replies get HTTP 500 "unscripted", which makes a test fail loudly.
    pub fn on(&self, question: &str, replies: Vec<Reply>) -> &Self {
        self.lock().scripts.push((question.to_string(), replies));
        self
    }

    /// Answers requests that no `on` script matches (the demo's and the benchmark's model).
    pub fn respond_with(&self, responder: impl Fn(&Request) -> Option<Reply> + Send + 'static) {
        self.lock().responder = Some(Box::new(responder));
    }

    pub fn requests(&self) -> Vec<Request> {
        self.lock().requests.clone()
    }

    /// The text of the last request (what the model was told last).
    pub fn last_text(&self) -> String {
        self.lock()
            .requests
            .last()
            .map(Request::text)
            .expect("no request reached the model")
    }

    /// The most requests that were being answered at the same time (a `Reply::Slow` keeps
    /// one open): 1 for requests sent one after another.
    pub fn most_in_flight(&self) -> usize {
        self.lock().most_in_flight
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn serve(stream: TcpStream, state: &Mutex<State>) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut reader = BufReader::new(match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    });
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
        return;
    }
    let path = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or("")
        .to_string();
    let mut headers = HashMap::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
        }
    }
    let length: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let request = Request {
        path,
        headers,
        body,
    };
    // The question being asked is in the last message (earlier turns of a conversation come
    // before it); the longest matching question wins, so that one question may contain another.
    let text = request.last_message();
    let reply = {
        let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
        state.requests.push(request);
        state.in_flight += 1;
        state.most_in_flight = state.most_in_flight.max(state.in_flight);
        let mut matching: Vec<&mut (String, Vec<Reply>)> = state
            .scripts
            .iter_mut()
            .filter(|(q, _)| text.contains(q.as_str()))
            .collect();
        matching.sort_by_key(|(q, _)| std::cmp::Reverse(q.len()));
        let scripted = match matching.into_iter().next() {
            Some((_, replies)) if !replies.is_empty() => Some(replies.remove(0)),
            _ => None,
        };
        let request = state.requests.last().expect("just recorded");
        scripted
            .or_else(|| {
                state
                    .responder
                    .as_ref()
                    .and_then(|respond| respond(request))
            })
            .unwrap_or_else(|| {
                // The chain's probe of an endpoint (one short message no role shapes), as a
                // working model answers it.
                if text == "Reply with the word OK." {
                    Reply::Content("OK".into())
                } else {
                    Reply::Status(500, r#"{"error":{"message":"unscripted request"}}"#.into())
                }
            })
    };
    respond(stream, reply);
    let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
    state.in_flight -= 1;
}

fn completion(content: &str) -> String {
    completions(&[content.to_string()])
}

fn completions(contents: &[String]) -> String {
    let choices: Vec<Value> = contents
        .iter()
        .enumerate()
        .map(|(i, content)| {
            json!({"index": i, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"})
        })
        .collect();
    json!({
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "choices": choices,
        "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
    })
    .to_string()
}

/// One server-sent event per chunk, as llama.cpp's server streams several choices: content
/// deltas, a finishing chunk per choice, a usage chunk per finished choice.
fn stream_events(mut stream: TcpStream, finished: &[String], stalled: usize, hold: Duration) {
    let chunk = |choices: Value| {
        let chunk =
            json!({"id": "chatcmpl-test", "object": "chat.completion.chunk", "choices": choices});
        format!("data: {chunk}\n\n")
    };
    let mut events =
        "HTTP/1.1 200 Scripted\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
            .to_string();
    for (i, content) in finished.iter().enumerate() {
        events += &chunk(json!([{"index": i, "delta": {"role": "assistant", "content": content}}]));
        events += &chunk(json!([{"index": i, "delta": {}, "finish_reason": "stop"}]));
        events += &format!(
            "data: {}\n\n",
            json!({"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 10}})
        );
    }
    for i in finished.len()..finished.len() + stalled {
        events += &chunk(json!([{"index": i, "delta": {"content": "{\"sql\": \"SELECT"}}]));
    }
    let _ = stream.write_all(events.as_bytes());
    let _ = stream.flush();
    std::thread::sleep(hold);
    let _ = stream.write_all(b"data: [DONE]\n\n");
}

fn respond(mut stream: TcpStream, reply: Reply) {
    let (status, body) = match reply {
        Reply::Sql(sql) => (200, completion(&json!({ "sql": sql }).to_string())),
        Reply::Content(content) => (200, completion(&content)),
        Reply::Choices(contents) => (200, completions(&contents)),
        Reply::Status(code, body) => (code, body),
        Reply::Raw(body) => (200, body),
        Reply::Slow(delay, then) => {
            std::thread::sleep(delay);
            return respond(stream, *then);
        }
        Reply::HangUp => return,
        Reply::Stream {
            finished,
            stalled,
            hold,
        } => return stream_events(stream, &finished, stalled, hold),
    };
    let head = format!(
        "HTTP/1.1 {status} Scripted\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body.as_bytes());
    let _ = stream.flush();
}
