//! A client for one OpenAI-compatible chat-completion API (OpenAI, vLLM, llama.cpp, Ollama,
//! Groq, DeepSeek, OpenRouter...): one request per call, bounded by a deadline, with 429/5xx
//! retried inside it when asked to (`chain` decides). A request for several choices (a vote) is
//! streamed, so that the choices that finished before the deadline are kept when it ends the
//! others.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::completion::{Batch, Completion, Message};
use super::endpoint::Endpoint;
use crate::error::{Error, Fault, Result};
use crate::urls::{redact, redact_url};
use crate::wait::{
    run_interruptible, run_interruptible_as, sleep_interruptible, WaitError, MAX_LIVE_HELPERS,
};

/// How requests are made, read once per call from the settings.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub temperature: f64,
    /// Bound on one completion, over every endpoint and retry.
    pub timeout: Duration,
    pub json_mode: bool,
    pub max_tokens: u32,
    pub max_response_bytes: u64,
}

/// Longest pause a `Retry-After` header may ask for; a longer one ends the retries.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// A client for one endpoint.
pub struct OpenAiClient {
    base_url: String,
    model: Option<String>,
    api_key: Option<String>,
    temperature: f64,
    json_mode: bool,
    max_tokens: u32,
    max_response_bytes: u64,
    /// The role asking (its OID): what its requests taught of the endpoint is kept for it.
    role: u32,
}

thread_local! {
    /// Endpoints that rejected `response_format` in this session, by role: not asked again.
    /// By role: what one role's requests caused (an answer the role's question shaped) changes
    /// nothing for the others on the same connection (the gateway's).
    static NO_JSON_MODE: std::cell::RefCell<Vec<(u32, String)>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Endpoints that rejected or ignored `n` (several choices per request), by role: asked for
    /// one choice per request, all requests at once.
    static NO_CHOICES: std::cell::RefCell<Vec<(u32, String)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Why a request never started (see `WaitError::Busy`): the backend's (`Fault::Busy`).
const BUSY: &str = "no request thread was free in time (earlier requests of this role on \
     this connection, abandoned to a cancel, are still running)";

/// What one HTTP exchange produced, as plain data that can cross back from the helper thread.
enum Reply {
    Status {
        code: u16,
        retry_after: Option<Duration>,
        body: String,
    },
    /// No answer within the request's time.
    TimedOut,
    /// A response longer than `max_response_bytes`: the request's failure, not the endpoint's
    /// (how long an answer is, the request shapes: its question, temperature, choices).
    TooLarge(String),
    Failed(String),
    /// This backend's own resources failed before anything was sent (no file descriptor,
    /// socket buffer, memory or local port was free): nothing is said of the endpoint, and no
    /// other endpoint would fare better (`Fault::Busy`).
    Local(String),
    /// A streamed answer (`text/event-stream`): the choices that finished, and why the stream
    /// stopped before its end, if it did.
    Streamed {
        choices: Vec<Completion>,
        stopped: Option<Stop>,
    },
}

/// What a request no role shapes met at an endpoint (`OpenAiClient::probe`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    Answered,
    /// Unreachable, an HTTP error other than 429, or something that is no completion.
    Failed,
    /// No answer in time, or a 429: the endpoint is too busy for anyone now, perhaps with the
    /// roles' own requests (a queue, a quota they filled).
    Busy,
    /// The backend's own resources failed: nothing is known of the endpoint.
    Unknown,
}

/// Why a stream ended before the server ended it.
#[derive(Debug, PartialEq, Eq)]
enum Stop {
    TimedOut,
    /// The stream grew past its bound (see `Reply::TooLarge`).
    TooLarge(String),
    Failed(String),
    /// An error event that is the request's (a 4xx code, a named refusal such as a content
    /// filter), not the endpoint's.
    Refused(String),
}

/// The most choices a stream may carry (an index beyond it is ignored): a bound on what a
/// server can make the backend keep, far above any vote's size.
const MAX_STREAMED_CHOICES: usize = 64;

/// What several completions asked for together gave: `whole` unless the deadline (or a broken
/// stream) ended some of them, whose finished siblings are then all there is.
struct Choices {
    completions: Vec<Completion>,
    whole: bool,
}

impl OpenAiClient {
    /// A client of `endpoint` for the role of OID `role`.
    pub fn new(endpoint: Endpoint, options: Options, role: u32) -> Self {
        let json_mode = options.json_mode
            && !NO_JSON_MODE.with_borrow(|n| n.contains(&(role, endpoint.base_url.clone())));
        OpenAiClient {
            base_url: endpoint.base_url,
            model: endpoint.model,
            api_key: endpoint.api_key,
            temperature: options.temperature,
            json_mode,
            max_tokens: options.max_tokens,
            max_response_bytes: options.max_response_bytes,
            role,
        }
    }

    /// This client's key in what is learnt of endpoints (`NO_JSON_MODE`, `NO_CHOICES`).
    fn learnt_key(&self) -> (u32, String) {
        (self.role, self.base_url.clone())
    }

    /// The endpoint as it may be shown: without credentials in the URL, never with the key.
    pub fn endpoint(&self) -> String {
        format!(
            "{}/chat/completions",
            redact_url(&self.base_url).trim_end_matches('/')
        )
    }

    /// Who the circuit breaker remembers failures of: the URL with its credentials, the model
    /// and the key (roles may be given their own model or key on one URL: a key that hit its
    /// rate limit says nothing of another's), as a hash (it is kept in shared memory).
    pub fn identity(&self) -> String {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::hash::DefaultHasher::new();
        (&self.base_url, &self.model, &self.api_key).hash(&mut hasher);
        format!("{}#{:016x}", self.endpoint(), hasher.finish())
    }

    /// A failure this request may have caused.
    fn error(&self, cause: impl Into<String>) -> Error {
        self.failure(cause.into(), Fault::Request)
    }

    /// A failure that is the endpoint's own, whatever was asked.
    fn down(&self, cause: impl Into<String>) -> Error {
        self.failure(cause.into(), Fault::Endpoint)
    }

    /// No helper thread was free: nothing was asked.
    fn busy(&self) -> Error {
        self.failure(BUSY.into(), Fault::Busy)
    }

    fn failure(&self, cause: String, fault: Fault) -> Error {
        // An endpoint's words go into errors, warnings and the server log: one line, nothing
        // that steers a terminal.
        let mut cause = without_tokens(&redact(&crate::text::without_nul(cause), &self.base_url));
        if let Some(key) = self.api_key.as_deref() {
            cause = without_key(&cause, key);
        }
        // Cut only now that the key is out: a cut inside it would have left a piece.
        if cause.chars().count() > MAX_CAUSE_CHARS {
            cause = cause.chars().take(MAX_CAUSE_CHARS).collect::<String>() + "…";
        }
        Error::Llm {
            endpoint: self.endpoint(),
            cause: crate::text::escaped_line(&cause),
            fault,
        }
    }

    /// The request for `n` choices; several are streamed (`read_stream`), with the token
    /// counts in the stream.
    fn request_body(&self, messages: &[Message], n: usize) -> Value {
        let mut body = json!({
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "stream": n > 1,
        });
        if n > 1 {
            body["n"] = json!(n);
            body["stream_options"] = json!({ "include_usage": true });
        }
        if let Some(model) = &self.model {
            body["model"] = json!(model);
        }
        if self.json_mode {
            body["response_format"] = json!({ "type": "json_object" });
        }
        body
    }

    fn send_once(&self, body: &str, choices: usize, deadline: Instant) -> Result<Reply> {
        let exchange = self.request(body, choices, deadline);
        match run_interruptible(wait_deadline(deadline), exchange) {
            Ok(reply) => Ok(reply),
            Err(WaitError::TimedOut) => Err(self.timeout_error()),
            Err(WaitError::Busy) => Err(self.busy()),
            Err(WaitError::Lost) => Err(self.error("the request thread ended without an answer")),
        }
    }

    /// `count` copies of one request sent at once, each on its own thread, while the backend
    /// waits for all of them (interruptibly, as for one): for an endpoint that answers one
    /// choice per request, so that candidates cost one request's time, not `count`. At most
    /// `MAX_LIVE_HELPERS` at once, each counted as a helper: a cancel leaves no more behind.
    fn send_together(&self, body: &str, count: usize, deadline: Instant) -> Result<Vec<Reply>> {
        let mut replies = Vec::with_capacity(count);
        let mut left = count;
        while left > 0 {
            let now = left.min(MAX_LIVE_HELPERS);
            match self.send_at_once(body, now, deadline) {
                Ok(batch) => replies.extend(batch),
                // What earlier batches answered is kept; the rest had no answer in time.
                Err(_) if !replies.is_empty() => {
                    replies.extend((0..left).map(|_| Reply::TimedOut));
                    break;
                }
                Err(e) => return Err(e),
            }
            left -= now;
        }
        Ok(replies)
    }

    /// `count` copies of one request, at most `MAX_LIVE_HELPERS`, each on its own thread.
    fn send_at_once(&self, body: &str, count: usize, deadline: Instant) -> Result<Vec<Reply>> {
        let requests: Vec<_> = (0..count)
            .map(|_| self.request(body, 1, deadline))
            .collect();
        let together = move || {
            std::thread::scope(|scope| {
                let running: Vec<_> = requests
                    .into_iter()
                    .map(|request| std::thread::Builder::new().spawn_scoped(scope, request))
                    .collect();
                running
                    .into_iter()
                    .map(|running| match running {
                        Ok(handle) => handle.join().unwrap_or_else(|_| {
                            Reply::Failed("the request thread ended without an answer".into())
                        }),
                        Err(e) => Reply::Failed(format!("starting a request thread failed: {e}")),
                    })
                    .collect::<Vec<Reply>>()
            })
        };
        match run_interruptible_as(wait_deadline(deadline), count, together) {
            Ok(replies) => Ok(replies),
            Err(WaitError::TimedOut) => Err(self.timeout_error()),
            Err(WaitError::Busy) => Err(self.busy()),
            Err(WaitError::Lost) => Err(self.error("the request threads ended without an answer")),
        }
    }

    /// One HTTP exchange for `choices` choices, as work for a helper thread that never touches
    /// PostgreSQL. A stream of several may be as long as that many answers (and is longer than
    /// one answer with them all: every token comes in its own event).
    fn request(
        &self,
        body: &str,
        choices: usize,
        deadline: Instant,
    ) -> impl FnOnce() -> Reply + Send + 'static {
        let url = format!("{}/chat/completions", self.base_url.trim_end_matches('/'));
        let agent = agent_for(&url);
        let key = self.api_key.clone();
        let body = body.to_string();
        let limit = self.max_response_bytes;
        move || {
            // Counted when the helper starts (it may have waited for a free helper first).
            let remaining = deadline.saturating_duration_since(Instant::now());
            let mut request = agent
                .post(&url)
                .config()
                .timeout_global(Some(remaining))
                .http_status_as_error(false)
                .build()
                .header("Content-Type", "application/json");
            if let Some(key) = key {
                request = request.header("Authorization", format!("Bearer {key}"));
            }
            match request.send(body) {
                Ok(mut response) => {
                    let code = response.status().as_u16();
                    let streamed = response
                        .headers()
                        .get("content-type")
                        .and_then(|v| v.to_str().ok())
                        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
                    if (200..300).contains(&code) && streamed {
                        let whole =
                            limit.saturating_mul(choices.clamp(1, MAX_STREAMED_CHOICES) as u64);
                        let reader = response.body_mut().with_config().limit(whole).reader();
                        let (choices, stopped) =
                            read_stream(std::io::BufReader::new(reader), whole, limit);
                        return Reply::Streamed { choices, stopped };
                    }
                    let retry_after = response
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .map(|s| Duration::from_secs(s.min(MAX_RETRY_AFTER.as_secs() + 1)));
                    match response
                        .body_mut()
                        .with_config()
                        .limit(limit)
                        .read_to_string()
                    {
                        Ok(body) => Reply::Status {
                            code,
                            retry_after,
                            body,
                        },
                        Err(ureq::Error::BodyExceedsLimit(_)) => Reply::TooLarge(too_large(limit)),
                        Err(ureq::Error::Timeout(_)) => Reply::TimedOut,
                        Err(e) => Reply::Failed(format!("reading the response failed: {e}")),
                    }
                }
                Err(ureq::Error::Timeout(_)) => Reply::TimedOut,
                Err(ureq::Error::Io(e)) if backend_short_of_resources(&e) => {
                    Reply::Local(format!("this backend could not connect: {e}"))
                }
                Err(e) => Reply::Failed(describe(&e)),
            }
        }
    }

    /// No answer in time: this request's failure, never the endpoint's for everyone. How long a
    /// model takes is the request's to shape (its question, the temperature, the candidates a
    /// role asks for, an `llm_timeout` it lowered): a role must not be able to send every
    /// other role to the fallback endpoints. An endpoint that hangs costs each role its
    /// timeout once per `llm_circuit_breaker`.
    fn timeout_error(&self) -> Error {
        self.failure(
            "no answer in time (sql_query_engine.llm_timeout)".into(),
            Fault::Request,
        )
    }
}

/// How long the backend waits for a helper whose own budget ends at `deadline`: a little
/// longer, so that the helper's precise error (connect refused, timeout) wins the race.
fn wait_deadline(deadline: Instant) -> Instant {
    deadline
        .checked_add(Duration::from_millis(500))
        .unwrap_or(deadline)
}

/// What `OpenAiClient::probe` asks: the same for every role and call.
const PROBE: &str = "Reply with the word OK.";
/// Tokens the probe asks for: the least `sql_query_engine.max_tokens` allows (some endpoints
/// refuse fewer).
const PROBE_TOKENS: u32 = 16;

/// Temperature for a model that repeats a failed query, and for candidates.
const EXPLORING_TEMPERATURE: f64 = 0.7;

impl OpenAiClient {
    /// One chat completion request asking for `n` choices, until `deadline` (429 and 5xx
    /// retried within it when `retry`); the completions it returned, at most `n`, at least one.
    pub fn exchange(
        &mut self,
        messages: &[Message],
        n: usize,
        deadline: Instant,
        retry: bool,
    ) -> Result<Vec<Completion>> {
        self.ask(messages, n, deadline, retry)
            .map(|c| c.completions)
    }

    /// What the endpoint does with a request no role shapes: one short message, a few tokens
    /// (as many as the least a request asks for), no JSON mode, no retry, until `deadline`. Whatever failed a role's request (a 4xx, a 429
    /// or 5xx, an empty or oversized answer, no answer in time) may have been that request's
    /// own doing (a prompt over the context or the tokens per minute, a question slow to
    /// answer): only when this request fails too (unreachable, an HTTP error that says nothing
    /// of load, anything that is not a completion) is it the endpoint's, for every role. A
    /// completion answers, whatever its content. No answer in time, a 429, 502, 503 or 504 or
    /// a `Retry-After` may be the roles' own load, and the backend's own failing (no helper
    /// thread, no file descriptor) says nothing. Nor does a 400 or 422: the endpoint refusing
    /// what this request asks (its temperature, its few tokens) is not the endpoint down, and a
    /// role that made its own requests fail the same way (`SET sql_query_engine.temperature`
    /// to a value a model refuses) would otherwise send every role to the fallbacks.
    pub fn probe(&self, deadline: Instant) -> Probe {
        let probe = OpenAiClient {
            base_url: self.base_url.clone(),
            model: self.model.clone(),
            api_key: self.api_key.clone(),
            temperature: 0.0,
            json_mode: false,
            max_tokens: PROBE_TOKENS,
            max_response_bytes: self.max_response_bytes,
            role: self.role,
        };
        let body = probe.request_body(&[Message::user(PROBE)], 1).to_string();
        let request = probe.request(&body, 1, deadline);
        match run_interruptible(wait_deadline(deadline), request) {
            Ok(Reply::Status { code, body, .. })
                if (200..300).contains(&code) && is_completion(&body) =>
            {
                Probe::Answered
            }
            Ok(Reply::Streamed { choices, .. }) if !choices.is_empty() => Probe::Answered,
            // A queue or a quota the roles' own requests may fill: too many requests, a server
            // or a gateway in front of it overloaded (Ollama's full queue, a proxy's upstream
            // that took too long), or any status that says when to come back.
            Ok(
                Reply::TimedOut
                | Reply::Status {
                    code: 429 | 502 | 503 | 504,
                    ..
                }
                | Reply::Status {
                    retry_after: Some(_),
                    ..
                },
            )
            | Err(WaitError::TimedOut) => Probe::Busy,
            Ok(
                Reply::Local(_)
                | Reply::Status {
                    code: 400 | 422, ..
                },
            )
            | Err(WaitError::Busy | WaitError::Lost) => Probe::Unknown,
            Ok(_) => Probe::Failed,
        }
    }

    /// Notes, when `so`, that this endpoint takes no `n`: one choice per request from now on.
    fn takes_no_choices(&self, so: bool) {
        if so {
            NO_CHOICES.with_borrow_mut(|e| {
                if !e.contains(&self.learnt_key()) {
                    e.push(self.learnt_key())
                }
            });
        }
    }

    /// `exchange`, saying whether a stream of several choices was cut short.
    fn ask(
        &mut self,
        messages: &[Message],
        n: usize,
        deadline: Instant,
        retry: bool,
    ) -> Result<Choices> {
        let mut body = self.request_body(messages, n).to_string();
        let mut backoff = Duration::from_millis(250);
        // One choice was asked for after a 400 to several: a 400 again is the request's own.
        let mut single = n <= 1;
        // Whether a 400 to several choices was followed by one choice: if that is answered, the
        // endpoint takes no `n` (noted only then: the 400 may have been the request's own).
        let mut rejected_n = false;
        loop {
            if Instant::now() >= deadline {
                return Err(self.timeout_error());
            }
            let (code, retry_after, text) = match self.send_once(&body, n, deadline)? {
                Reply::Failed(cause) => return Err(self.down(cause)),
                Reply::Local(cause) => return Err(self.failure(cause, Fault::Busy)),
                Reply::TooLarge(cause) => return Err(self.error(cause)),
                Reply::TimedOut => return Err(self.timeout_error()),
                Reply::Streamed {
                    mut choices,
                    stopped,
                } => {
                    // At most the choices asked for, however many the stream held: each is a
                    // query run as the caller.
                    choices.truncate(n.max(1));
                    return match stopped {
                        _ if !choices.is_empty() => {
                            self.takes_no_choices(rejected_n);
                            Ok(Choices {
                                whole: stopped.is_none(),
                                completions: choices,
                            })
                        }
                        Some(Stop::TimedOut) => Err(self.timeout_error()),
                        Some(Stop::Failed(cause)) => Err(self.down(cause)),
                        Some(Stop::TooLarge(cause) | Stop::Refused(cause)) => {
                            Err(self.error(cause))
                        }
                        // A stream that ended with no content: what this request asked for.
                        None => Err(self.error("the answer has no choices")),
                    };
                }
                Reply::Status {
                    code,
                    retry_after,
                    body,
                } => (code, retry_after, body),
            };
            if (200..300).contains(&code) {
                let parsed = parse_completions(&text, n);
                if parsed.is_ok() {
                    self.takes_no_choices(rejected_n);
                }
                return parsed
                    .map(|completions| Choices {
                        completions,
                        whole: true,
                    })
                    .map_err(|cause| {
                        // A completion without usable content (empty, refused) is what this
                        // request asked for; anything else is not a completion at all.
                        if is_completion(&text) {
                            self.error(cause)
                        } else {
                            self.down(cause)
                        }
                    });
            }
            if code == 400 && self.json_mode && text.contains("response_format") {
                // This endpoint has no JSON mode: ask again without it (extraction copes).
                self.json_mode = false;
                NO_JSON_MODE.with_borrow_mut(|e| e.push(self.learnt_key()));
                body = self.request_body(messages, n).to_string();
                continue;
            }
            if code == 400 && !single {
                // No several choices here: one is asked for, the rest one by one.
                single = true;
                rejected_n = true;
                body = self.request_body(messages, 1).to_string();
                continue;
            }
            let retryable = retry && (code == 429 || (500..600).contains(&code));
            // An endpoint's Retry-After, but never less than the backoff: `Retry-After: 0`
            // would have the same prompt sent again and again until the deadline.
            let pause = retry_after.map_or(backoff, |after| after.max(backoff));
            let resume = Instant::now().checked_add(pause);
            if !retryable || pause > MAX_RETRY_AFTER || resume.is_none_or(|r| r >= deadline) {
                let cause = status_cause(code, &text);
                return Err(if code == 429 || code >= 500 {
                    self.down(cause)
                } else {
                    self.error(cause)
                });
            }
            sleep_interruptible(resume.unwrap_or(deadline));
            backoff = (backoff * 2).min(Duration::from_secs(8));
        }
    }

    /// `n` completions: one request with `n` choices, so that the server reads the prompt once;
    /// the rest, when the endpoint returns fewer (it ignores or rejects `n`), asked for all at
    /// once. An endpoint known to answer one choice per request gets all `n` at once. When the
    /// deadline ends some of them, those that finished are the batch.
    pub fn many(
        &mut self,
        messages: &[Message],
        n: usize,
        deadline: Instant,
        retry: bool,
    ) -> Result<Batch> {
        if n > 1 && NO_CHOICES.with_borrow(|e| e.contains(&self.learnt_key())) {
            return Ok(Batch {
                completions: self.together(messages, n, deadline, retry)?,
                requests: n as u32,
            });
        }
        let choices = self.ask(messages, n, deadline, retry)?;
        let mut batch = Batch {
            completions: choices.completions,
            requests: 1,
        };
        if !choices.whole {
            return Ok(batch);
        }
        // It ignored `n` (llama-cpp-python does): one choice per request from now on.
        self.takes_no_choices(n > 1 && batch.completions.len() == 1);
        let missing = n.saturating_sub(batch.completions.len());
        if missing > 0 {
            // Those missing that could not be had leave the ones in hand.
            if let Ok(more) = self.together(messages, missing, deadline, retry) {
                batch.completions.extend(more);
            }
            batch.requests += missing as u32;
        }
        batch.completions.truncate(n);
        Ok(batch)
    }

    /// `count` single-choice completions asked for at once; a request that did not succeed is
    /// asked again the usual way (`exchange`: retries, fallbacks, its precise error), one that
    /// ran out of time is not: the others that finished are kept (none: the timeout error, or
    /// the error of the last request asked again). Asked at once, an endpoint may refuse one
    /// (a 429 for a burst): that loses neither the vote's others nor the call's repairs.
    fn together(
        &mut self,
        messages: &[Message],
        count: usize,
        deadline: Instant,
        retry: bool,
    ) -> Result<Vec<Completion>> {
        if count <= 1 {
            return self.exchange(messages, 1, deadline, retry);
        }
        let body = self.request_body(messages, 1).to_string();
        let mut completions = Vec::with_capacity(count);
        let (mut timed_out, mut failed) = (false, None);
        for reply in self.send_together(&body, count, deadline)? {
            let parsed = match reply {
                Reply::Status { code, body, .. } if (200..300).contains(&code) => {
                    parse_completions(&body, 1).ok()
                }
                Reply::TimedOut => {
                    timed_out = true;
                    continue;
                }
                _ => None,
            };
            match parsed.map_or_else(|| self.exchange(messages, 1, deadline, retry), Ok) {
                Ok(parsed) => completions.extend(parsed),
                Err(e) => failed = Some(e),
            }
        }
        if completions.is_empty() {
            if let Some(e) = failed {
                return Err(e);
            }
            if timed_out {
                return Err(self.timeout_error());
            }
        }
        Ok(completions)
    }

    /// Runs `work` with at least the exploring temperature.
    pub fn exploring<T>(&mut self, work: impl FnOnce(&mut Self) -> T) -> T {
        let configured = self.temperature;
        self.temperature = configured.max(EXPLORING_TEMPERATURE);
        let result = work(self);
        self.temperature = configured;
        result
    }
}

/// The variables naming the proxy for a destination of `scheme`, in the order curl reads them:
/// the scheme's own first, then `ALL_PROXY`. A proxy set for HTTPS only (to reach a hosted
/// model) must not carry a plain-HTTP request, its prompt and its key, through a proxy that
/// can read them.
fn proxy_variables(https: bool) -> [&'static str; 4] {
    if https {
        ["HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"]
    } else {
        ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"]
    }
}

/// The proxy the server's environment sets for destinations of `scheme` (`proxy_variables`),
/// with the hosts `NO_PROXY` exempts; `None` for none. A SOCKS proxy is not taken (requests go
/// direct, as ureq itself does with one from the environment): this build has no SOCKS
/// support, and ureq panics at every connection through a SOCKS proxy it was given.
fn environment_proxy(https: bool) -> Option<ureq::Proxy> {
    proxy_from(https, |name| std::env::var(name).ok())
}

/// `environment_proxy` with the variables `variable` gives.
fn proxy_from(https: bool, variable: impl Fn(&str) -> Option<String>) -> Option<ureq::Proxy> {
    let found = proxy_variables(https)
        .iter()
        .filter_map(|name| variable(name))
        .find_map(|value| ureq::Proxy::new(&value).ok())
        .filter(|proxy| {
            matches!(
                proxy.protocol(),
                ureq::ProxyProtocol::Http | ureq::ProxyProtocol::Https
            )
        })?;
    let mut proxy = ureq::Proxy::builder(found.protocol())
        .host(found.host())
        .port(found.port())
        .resolve_target(found.resolve_target());
    if let Some(user) = found.username() {
        proxy = proxy.username(user);
    }
    if let Some(password) = found.password() {
        proxy = proxy.password(password);
    }
    let exempt = variable("NO_PROXY")
        .or_else(|| variable("no_proxy"))
        .unwrap_or_default();
    for host in exempt.split(',') {
        proxy = proxy.no_proxy(host.trim());
    }
    proxy.build().ok()
}

/// One agent per kind of destination, shared by all requests of the backend (connection reuse,
/// TLS roots loaded once). Loopback goes direct: a proxy set in the server's environment must not
/// capture a local model server; others through the proxy the environment sets for their
/// scheme (`proxy_variables`).
fn agent_for(url: &str) -> ureq::Agent {
    static DIRECT: OnceLock<ureq::Agent> = OnceLock::new();
    static HTTPS: OnceLock<ureq::Agent> = OnceLock::new();
    static HTTP: OnceLock<ureq::Agent> = OnceLock::new();
    let loopback = is_loopback(url);
    let https = url
        .get(..8)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"));
    let cell = match (loopback, https) {
        (true, _) => &DIRECT,
        (false, true) => &HTTPS,
        (false, false) => &HTTP,
    };
    cell.get_or_init(|| {
        let tls = ureq::tls::TlsConfig::builder()
            // The system trust store: right in production and behind TLS-inspecting proxies.
            .root_certs(ureq::tls::RootCerts::PlatformVerifier)
            .build();
        // No redirects: an endpoint must not send the request (and the prompt) elsewhere.
        let mut config = ureq::Agent::config_builder()
            .tls_config(tls)
            .max_redirects(0)
            .http_status_as_error(false);
        config = config.proxy(if loopback {
            None
        } else {
            environment_proxy(https)
        });
        ureq::Agent::with_parts(
            config.build(),
            ureq::unversioned::transport::DefaultConnector::default(),
            ResolvedHere,
        )
    })
    .clone()
}

/// Resolves a host name on the thread that asks, a helper thread the backend counts and
/// waits for only until the request's deadline (`wait`), and ends the request when the look-up
/// took past it. ureq's own resolver, given a
/// deadline, looks the name up on a thread of its own and stops waiting for it at the
/// deadline: that thread, and its socket, lived on uncounted for as long as the system's
/// resolver took (tens of seconds for a name server that does not answer), one per request.
#[derive(Debug)]
struct ResolvedHere;

impl ureq::unversioned::resolver::Resolver for ResolvedHere {
    fn resolve(
        &self,
        uri: &ureq::http::Uri,
        config: &ureq::config::Config,
        timeout: ureq::unversioned::transport::NextTimeout,
    ) -> std::result::Result<ureq::unversioned::resolver::ResolvedSocketAddrs, ureq::Error> {
        let here = ureq::unversioned::transport::NextTimeout {
            after: ureq::unversioned::transport::time::Duration::NotHappening,
            ..timeout
        };
        let started = std::time::Instant::now();
        let resolved =
            ureq::unversioned::resolver::DefaultResolver::default().resolve(uri, config, here)?;
        // A name that took past the request's time ends the request here: ureq would go on to
        // connect and send (the prompt, the key) after the backend stopped waiting.
        if started.elapsed() >= *timeout.after {
            return Err(ureq::Error::Timeout(timeout.reason));
        }
        Ok(resolved)
    }
}

/// Whether `error`, met while connecting, is this backend short of its own resources rather
/// than anything the endpoint did: a role can run a backend short of file descriptors, and
/// must not thereby have the endpoint taken for down by every backend (`breaker`).
fn backend_short_of_resources(error: &std::io::Error) -> bool {
    const LOCAL: [i32; 6] = [
        libc::EMFILE,
        libc::ENFILE,
        libc::ENOBUFS,
        libc::ENOMEM,
        libc::EADDRNOTAVAIL,
        libc::EAGAIN,
    ];
    error.kind() == std::io::ErrorKind::OutOfMemory
        || error
            .raw_os_error()
            .is_some_and(|code| LOCAL.contains(&code))
}

/// Whether `url`'s host, read as the HTTP client reads it (a `?` or `#` before an `@` ends
/// the authority), is this machine.
fn is_loopback(url: &str) -> bool {
    let Ok(uri) = url.parse::<ureq::http::Uri>() else {
        return false;
    };
    let host = uri
        .host()
        .unwrap_or_default()
        .trim_start_matches('[')
        .trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn describe(error: &ureq::Error) -> String {
    match error {
        ureq::Error::HostNotFound => "host not found".into(),
        ureq::Error::ConnectionFailed => "connection failed".into(),
        ureq::Error::Io(e) => format!("connection failed: {e}"),
        other => other.to_string(),
    }
}

/// `cause` without the credentials of an authorization scheme (`Bearer <token>`, and the
/// `Basic <base64 of user:password>` the HTTP client makes of a URL's user information): an
/// endpoint or a proxy that echoes the request's headers, whether or not a key is set.
fn without_tokens(cause: &str) -> String {
    let mut cause = cause.to_string();
    for scheme in ["bearer", "basic"] {
        // Whatever follows the scheme's word (in any case) and blank space is a token. ASCII
        // lower case keeps every byte's position.
        let lower = cause.to_ascii_lowercase();
        let mut out = String::with_capacity(cause.len());
        let mut from = 0;
        while let Some(at) = lower[from..].find(scheme).map(|at| from + at) {
            let word = at + scheme.len();
            let blank = cause[word..]
                .find(|c: char| !c.is_whitespace())
                .unwrap_or(cause.len() - word);
            let after = word + blank;
            out.push_str(&cause[from..after]);
            from = after;
            if blank > 0 {
                out.push_str("[token]");
                from += cause[after..]
                    .find(|c: char| c.is_whitespace() || c == '"' || c == '\'' || c == ',')
                    .unwrap_or(cause.len() - after);
            }
        }
        out.push_str(&cause[from..]);
        cause = out;
    }
    cause
}

/// `cause` without the key: whole, or cut short where the provider's words were cut (an
/// endpoint or proxy that echoes the request's headers), and without any bearer token.
fn without_key(cause: &str, key: &str) -> String {
    const SHOWN: &str = "[api key]";
    let out = without_tokens(cause).replace(key, SHOWN);
    // A piece of the key of 8 characters or more, from its start (where a cut left it).
    let head: String = key.chars().take(8).collect();
    if head.chars().count() < 8 {
        return out;
    }
    let mut masked = String::with_capacity(out.len());
    let mut rest = out.as_str();
    while let Some(at) = rest.find(&head) {
        let length: usize = rest[at..]
            .chars()
            .zip(key.chars())
            .take_while(|(a, b)| a == b)
            .map(|(a, _)| a.len_utf8())
            .sum();
        masked.push_str(&rest[..at]);
        masked.push_str(SHOWN);
        rest = &rest[at + length..];
    }
    masked.push_str(rest);
    masked
}

/// Characters of a provider's own words kept in an error (it goes into messages, the log and
/// every attempt of the trace).
const MAX_CAUSE_CHARS: usize = 500;

/// The start of an endpoint's own text, as an error quotes it: cut before it is escaped,
/// redacted and cut again (`failure`), each of which copies it, and a body may be as long as
/// `max_response_bytes`.
fn provider_words(text: &str) -> String {
    crate::text::at_most(text, 4 * MAX_CAUSE_CHARS)
}

/// A readable cause for an HTTP error status, with the provider's own message when it has one.
/// Authentication failures never echo the body: providers quote parts of the key there.
fn status_cause(code: u16, body: &str) -> String {
    if code == 401 || code == 403 {
        return format!(
            "HTTP {code}: the endpoint refused the credentials (the key of \
             sql_query_engine.llm_api_key_file)"
        );
    }
    let message = crate::text::small_json(body)
        .and_then(|v| {
            v.pointer("/error/message")
                .or_else(|| v.get("error"))
                .or_else(|| v.get("message"))
                .and_then(Value::as_str)
                .map(|message| provider_words(message.trim()))
        })
        .unwrap_or_else(|| provider_words(body.trim()));
    if message.is_empty() {
        format!("HTTP {code}")
    } else {
        format!("HTTP {code}: {message}")
    }
}

/// Why a response was not read to its end.
fn too_large(limit: u64) -> String {
    format!("the response is larger than sql_query_engine.max_response_bytes ({limit} bytes)")
}

/// The finished choices of a streamed chat completion (server-sent events, `data: {chunk}`
/// lines until `data: [DONE]`), in the order they finished, with the token counts of every
/// usage chunk summed on the first (one per choice from llama.cpp, one in all from OpenAI);
/// and why the stream stopped before its end, if it did. The reader bounds the whole (to
/// `limit` bytes, named in the error), and each choice's text is at most `per_choice` bytes,
/// as a response that is not streamed: one choice does not take the whole of a vote's bound.
fn read_stream(
    mut reader: impl std::io::BufRead,
    limit: u64,
    per_choice: u64,
) -> (Vec<Completion>, Option<Stop>) {
    let per_choice = usize::try_from(per_choice).unwrap_or(usize::MAX);
    // Each choice's text so far, by index; `None` once it finished.
    let mut texts: Vec<Option<String>> = Vec::new();
    let mut finished: Vec<Completion> = Vec::new();
    let (mut prompt_tokens, mut completion_tokens) = (0u64, 0u64);
    let mut line = Vec::new();
    let stopped = 'read: loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => break None,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => break Some(Stop::TimedOut),
            Err(e) => {
                break Some(match ureq::Error::from(e) {
                    ureq::Error::Timeout(_) => Stop::TimedOut,
                    ureq::Error::BodyExceedsLimit(_) => Stop::TooLarge(too_large(limit)),
                    e => Stop::Failed(format!("reading the response failed: {e}")),
                })
            }
        }
        let Some(data) = std::str::from_utf8(&line)
            .ok()
            .and_then(|l| l.strip_prefix("data:"))
            .map(str::trim)
        else {
            continue;
        };
        if data == "[DONE]" {
            break None;
        }
        let Some(chunk) = crate::text::small_json(data) else {
            continue;
        };
        if let Some(error) = chunk.get("error") {
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .map_or_else(|| error.to_string(), str::to_string);
            let cause = format!("the stream ended on an error: {}", provider_words(&message));
            let server_side = error
                .get("code")
                .and_then(Value::as_u64)
                .is_some_and(|code| code >= 500);
            break Some(if server_side {
                Stop::Failed(cause)
            } else {
                Stop::Refused(cause)
            });
        }
        if let Some(usage) = chunk.get("usage") {
            let count = |name: &str| usage.get(name).and_then(Value::as_u64).unwrap_or(0);
            if prompt_tokens == 0 {
                prompt_tokens = count("prompt_tokens");
            }
            completion_tokens = completion_tokens.saturating_add(count("completion_tokens"));
        }
        let choices = chunk.get("choices").and_then(Value::as_array);
        for choice in choices.into_iter().flatten() {
            let Some(index) = choice
                .get("index")
                .and_then(Value::as_u64)
                .and_then(|i| usize::try_from(i).ok())
                .filter(|&i| i < MAX_STREAMED_CHOICES)
            else {
                continue;
            };
            if texts.len() <= index {
                texts.resize(index + 1, Some(String::new()));
            }
            let Some(text) = texts[index].as_mut() else {
                continue;
            };
            if let Some(piece) = choice.pointer("/delta/content").and_then(Value::as_str) {
                if text.len().saturating_add(piece.len()) > per_choice {
                    break 'read Some(Stop::TooLarge(too_large(per_choice as u64)));
                }
                text.push_str(piece);
            }
            if choice.get("finish_reason").is_some_and(|r| !r.is_null()) {
                let content = crate::text::without_nul(texts[index].take().unwrap_or_default());
                if !content.trim().is_empty() {
                    finished.push(Completion {
                        content,
                        ..Default::default()
                    });
                }
            }
        }
    };
    if let Some(first) = finished.first_mut() {
        first.prompt_tokens = prompt_tokens;
        first.completion_tokens = completion_tokens;
    }
    (finished, stopped)
}

/// Whether `body` is a chat completion with choices (whatever their content).
fn is_completion(body: &str) -> bool {
    crate::text::small_json(body).is_some_and(|value| {
        value
            .get("choices")
            .and_then(Value::as_array)
            .is_some_and(|choices| choices.iter().any(|c| c.get("message").is_some()))
    })
}

/// The assistants' texts (at most `n`, at least one) and token counts from a chat-completion
/// body; the counts go with the first.
fn parse_completions(body: &str, n: usize) -> std::result::Result<Vec<Completion>, String> {
    if !crate::text::parsable(&crate::text::json_shape(body.as_bytes())) {
        return Err(format!(
            "the answer holds more than {} JSON values or nests deeper than {} levels",
            crate::text::MAX_JSON_VALUES,
            crate::text::MAX_JSON_DEPTH
        ));
    }
    let value: Value = serde_json::from_str(body)
        .map_err(|_| format!("the answer is not JSON: {}", provider_words(body)))?;
    let choices = value
        .get("choices")
        .and_then(Value::as_array)
        .ok_or("the answer is not a chat completion (no \"choices\")")?;
    if choices.is_empty() {
        return Err("the answer has no choices".into());
    }
    let tokens = |name: &str| {
        value
            .pointer(&format!("/usage/{name}"))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let mut completions = Vec::new();
    let mut first_problem = None;
    for choice in choices.iter().take(n.max(1)) {
        match content_of(choice) {
            Ok(content) => completions.push(Completion {
                content,
                ..Default::default()
            }),
            Err(problem) => {
                first_problem.get_or_insert(problem);
            }
        }
    }
    let Some(first) = completions.first_mut() else {
        return Err(first_problem.unwrap_or_else(|| "the answer has no choices".into()));
    };
    first.prompt_tokens = tokens("prompt_tokens");
    first.completion_tokens = tokens("completion_tokens");
    Ok(completions)
}

fn content_of(choice: &Value) -> std::result::Result<String, String> {
    let message = choice
        .get("message")
        .ok_or("the first choice has no message")?;
    message
        .get("content")
        .and_then(Value::as_str)
        .filter(|c| !c.trim().is_empty())
        .map(|c| crate::text::without_nul(c.to_string()))
        .ok_or_else(|| match message.get("refusal").and_then(Value::as_str) {
            Some(refusal) => format!(
                "the model refused: {}",
                refusal.chars().take(MAX_CAUSE_CHARS).collect::<String>()
            ),
            None => "the message has no content".to_string(),
        })
}

/// The first completion of a body (for the tests).
#[cfg(test)]
fn parse_completion(body: &str) -> std::result::Result<Completion, String> {
    parse_completions(body, 1).map(|mut c| c.swap_remove(0))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_proxy_set_for_one_scheme_carries_no_request_of_the_other() {
        let plain = super::proxy_variables(false);
        let tls = super::proxy_variables(true);
        assert!(!plain.iter().any(|v| v.eq_ignore_ascii_case("https_proxy")));
        assert!(!tls.iter().any(|v| v.eq_ignore_ascii_case("http_proxy")));
        // The scheme's own before the catch-all, as curl reads them.
        assert_eq!(
            (plain[0], tls[0], plain[2]),
            ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
        );
        let only = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        // An HTTPS-only proxy: taken for HTTPS, not for plain HTTP.
        let https_only: &'static [(&str, &str)] =
            &[("HTTPS_PROXY", "http://user:pw@corp-proxy:3128")];
        let proxy = super::proxy_from(true, only(https_only)).expect("a proxy for HTTPS");
        assert_eq!((proxy.host(), proxy.port()), ("corp-proxy", 3128));
        assert_eq!(
            (proxy.username(), proxy.password()),
            (Some("user"), Some("pw"))
        );
        assert!(super::proxy_from(false, only(https_only)).is_none());
        // A SOCKS proxy (no support in this build: ureq would panic at each connection) is not
        // taken, nor is a value that is no proxy URL.
        let socks: &'static [(&str, &str)] = &[("ALL_PROXY", "socks5h://proxy:1080")];
        assert!(super::proxy_from(true, only(socks)).is_none());
        let broken: &'static [(&str, &str)] = &[("HTTP_PROXY", "http://[::1")];
        assert!(super::proxy_from(false, only(broken)).is_none());
    }

    #[test]
    fn an_error_shows_no_authorization_token_whether_or_not_a_key_is_set() {
        let said = without_tokens(
            "HTTP 422: echo {\"Authorization\": \"Basic c3ZjOlMzY3JldA==\", \"x\": \"Bearer abc\"}",
        );
        assert!(!said.contains("c3ZjOlMzY3JldA"), "{said}");
        assert!(!said.contains("abc"), "{said}");
        assert!(said.contains("Basic [token]"), "{said}");
    }

    #[test]
    fn an_error_never_shows_the_key_whole_cut_or_as_a_token() {
        let key = "sk-proj-0123456789abcdefghijklmnopqrstuvwxyz";
        let cut = &key[..30];
        let said = without_key(
            &format!(
                "HTTP 400: {{\"headers\":{{\"authorization\":\"Bearer {key}\"}}, \"echo\": \"{cut}"
            ),
            key,
        );
        assert!(!said.contains("0123456789"), "{said}");
        assert!(said.contains("Bearer [token]"), "{said}");
        assert_eq!(
            without_key(&format!("bad key {cut}"), key),
            "bad key [api key]"
        );
        assert_eq!(without_key("HTTP 500: busy", key), "HTTP 500: busy");
        assert_eq!(
            without_key("authorization: bearer\tabc123, other", key),
            "authorization: bearer\t[token], other"
        );
        assert_eq!(without_key("bearers and Bearer", key), "bearers and Bearer");
    }

    use super::*;

    #[test]
    fn completion_parsed_with_usage() {
        let body = r#"{"choices":[{"message":{"role":"assistant","content":"SELECT 1"}}],"usage":{"prompt_tokens":12,"completion_tokens":3}}"#;
        let c = parse_completion(body).unwrap();
        assert_eq!(
            (c.content.as_str(), c.prompt_tokens, c.completion_tokens),
            ("SELECT 1", 12, 3)
        );
    }

    #[test]
    fn several_choices_are_all_taken_with_the_usage_on_the_first() {
        let body = r#"{"choices":[{"message":{"content":"SELECT 1"}},{"message":{"content":""}},{"message":{"content":"SELECT 2"}}],"usage":{"prompt_tokens":50,"completion_tokens":9}}"#;
        let all = parse_completions(body, 4).unwrap();
        let contents: Vec<&str> = all.iter().map(|c| c.content.as_str()).collect();
        assert_eq!(
            contents,
            ["SELECT 1", "SELECT 2"],
            "empty choices are skipped"
        );
        assert_eq!((all[0].prompt_tokens, all[1].prompt_tokens), (50, 0));
        assert_eq!(parse_completions(body, 1).unwrap().len(), 1);
    }

    /// A reader that gives `text`, then fails as a timeout would (`None`: ends).
    struct Cut(std::io::Cursor<Vec<u8>>, Option<std::io::ErrorKind>);

    impl std::io::Read for Cut {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            match self.0.read(buf)? {
                0 => match self.1 {
                    Some(kind) => Err(std::io::Error::new(kind, "cut")),
                    None => Ok(0),
                },
                n => Ok(n),
            }
        }
    }

    fn stream(
        events: &[&str],
        then: Option<std::io::ErrorKind>,
    ) -> (Vec<Completion>, Option<Stop>) {
        let text: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        let reader = Cut(std::io::Cursor::new(text.into_bytes()), then);
        read_stream(std::io::BufReader::new(reader), 1000, 1000)
    }

    #[test]
    fn one_streamed_choice_is_bounded_like_a_response_not_like_the_whole_vote() {
        let events = [
            r#"{"choices":[{"index":1,"delta":{"content":"SELECT 1"},"finish_reason":"stop"}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"SELECT 'aaaaaaaa"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"aaaaaaaaaaaa"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"'"},"finish_reason":"stop"}]}"#,
        ];
        let text: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        let reader = std::io::Cursor::new(text.into_bytes());
        let (choices, stopped) = read_stream(std::io::BufReader::new(reader), 1000, 20);
        let contents: Vec<&str> = choices.iter().map(|c| c.content.as_str()).collect();
        assert_eq!(
            contents,
            ["SELECT 1"],
            "the choice that finished within its bound"
        );
        assert!(
            matches!(&stopped, Some(Stop::TooLarge(why)) if why.contains("(20 bytes)")),
            "{stopped:?}"
        );
    }

    #[test]
    fn a_stream_cut_by_the_deadline_keeps_the_choices_that_finished() {
        let events = [
            r#"{"choices":[{"index":1,"delta":{"role":"assistant","content":"SELECT "}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"SELECT a"}}]}"#,
            r#"{"choices":[{"index":1,"delta":{"content":"b"},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":1,"delta":{},"finish_reason":"stop"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":3}}"#,
            r#"{"choices":[{"index":0,"delta":{"content":" FROM"}}]}"#,
        ];
        let (choices, stopped) = stream(&events, Some(std::io::ErrorKind::TimedOut));
        let contents: Vec<&str> = choices.iter().map(|c| c.content.as_str()).collect();
        assert_eq!(contents, ["SELECT b"], "only the finished choice");
        assert_eq!(
            (choices[0].prompt_tokens, choices[0].completion_tokens),
            (40, 3)
        );
        assert_eq!(stopped, Some(Stop::TimedOut));
        // A broken connection keeps them too, and says why.
        let (choices, stopped) = stream(&events, Some(std::io::ErrorKind::ConnectionReset));
        assert_eq!(choices.len(), 1);
        assert!(matches!(stopped, Some(Stop::Failed(cause)) if cause.contains("reading")));
    }

    #[test]
    fn a_whole_stream_gives_every_choice_with_the_usage_summed_on_the_first() {
        let events = [
            r#"{"choices":[{"index":0,"delta":{"content":"SELECT 1"}},{"index":1,"delta":{"content":"SELECT 2"}}]}"#,
            r#"{"choices":[{"index":1,"delta":{},"finish_reason":"stop"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":3}}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#,
            r#"{"choices":[{"index":2,"delta":{"content":"  "},"finish_reason":"stop"}]}"#,
            r#"{"choices":[{"index":99,"delta":{"content":"SELECT 9"},"finish_reason":"stop"}]}"#,
            r#"{"choices":[{"index":1,"delta":{"content":"late"},"finish_reason":"stop"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":5}}"#,
            "[DONE]",
            r#"{"choices":[{"index":3,"delta":{"content":"SELECT 3"},"finish_reason":"stop"}]}"#,
        ];
        let (choices, stopped) = stream(&events, None);
        let contents: Vec<&str> = choices.iter().map(|c| c.content.as_str()).collect();
        assert_eq!(
            contents,
            ["SELECT 2", "SELECT 1"],
            "in the order they finished; empty, out-of-bound, repeated and late ones dropped"
        );
        assert_eq!(
            (choices[0].prompt_tokens, choices[0].completion_tokens),
            (40, 8)
        );
        assert_eq!(stopped, None);
    }

    #[test]
    fn an_error_event_ends_the_stream_with_its_message() {
        let events = [r#"{"error":{"message":"the context is full","code":500}}"#];
        let (choices, stopped) = stream(&events, None);
        assert!(choices.is_empty());
        assert!(matches!(stopped, Some(Stop::Failed(cause)) if cause.contains("context is full")));
        // A 4xx, or a named refusal, is the request's: it trips no breaker for other roles.
        for event in [
            r#"{"error":{"message":"flagged","code":400}}"#,
            r#"{"error":{"message":"flagged","code":"content_filter"}}"#,
        ] {
            let (_, stopped) = stream(&[event], None);
            assert!(matches!(stopped, Some(Stop::Refused(cause)) if cause.contains("flagged")));
        }
    }

    #[test]
    fn several_choices_are_streamed_with_their_usage_and_one_is_not() {
        let client = OpenAiClient::new(
            Endpoint {
                base_url: "http://127.0.0.1:1/v1".into(),
                model: None,
                api_key: None,
            },
            Options {
                temperature: 0.0,
                timeout: Duration::from_secs(1),
                json_mode: false,
                max_tokens: 100,
                max_response_bytes: 1000,
            },
            0,
        );
        let many = client.request_body(&[Message::user("q")], 4);
        assert_eq!(
            (many["stream"].as_bool(), many["n"].as_u64()),
            (Some(true), Some(4))
        );
        assert_eq!(
            many.pointer("/stream_options/include_usage"),
            Some(&json!(true))
        );
        let one = client.request_body(&[Message::user("q")], 1);
        assert_eq!((one["stream"].as_bool(), one.get("n")), (Some(false), None));
    }

    #[test]
    fn malformed_completions_are_named() {
        assert!(parse_completion("<html>").unwrap_err().contains("not JSON"));
        assert!(parse_completion("{}")
            .unwrap_err()
            .contains("no \"choices\""));
        assert!(parse_completion(r#"{"choices":[]}"#)
            .unwrap_err()
            .contains("no choices"));
        assert!(
            parse_completion(r#"{"choices":[{"message":{"content":null,"refusal":"no"}}]}"#)
                .unwrap_err()
                .contains("refused")
        );
        // Tiny values cost a hundred times their bytes as a tree: refused before parsing.
        let wide = format!(r#"{{"choices":[{}{{}}]}}"#, r#"{"":0},"#.repeat(20_000));
        assert!(parse_completion(&wide)
            .unwrap_err()
            .contains("more than 10000 JSON values"));
        assert!(!is_completion(&wide));
    }

    #[test]
    fn status_causes_use_provider_message_but_never_auth_bodies() {
        assert_eq!(
            status_cause(500, r#"{"error":{"message":"overloaded"}}"#),
            "HTTP 500: overloaded"
        );
        let auth = status_cause(
            401,
            r#"{"error":{"message":"Incorrect API key provided: sk-abc***xyz"}}"#,
        );
        assert!(!auth.contains("sk-"), "{auth}");
    }

    #[test]
    fn an_endpoints_long_words_are_cut_before_they_are_quoted() {
        // A body as long as max_response_bytes, of characters that escaping makes six times
        // longer: each error quotes only its start.
        let body = "\u{1}".repeat(1 << 20);
        assert!(status_cause(500, &body).len() <= 4 * MAX_CAUSE_CHARS + 32);
        let message = format!(r#"{{"error":{{"message":"{}"}}}}"#, "x".repeat(1 << 20));
        assert!(status_cause(503, &message).len() <= 4 * MAX_CAUSE_CHARS + 32);
        let not_json = parse_completions(&body, 1).unwrap_err();
        assert!(
            not_json.len() <= 6 * 4 * MAX_CAUSE_CHARS + 64,
            "{}",
            not_json.len()
        );
    }

    /// A client of `base_url` with `api_key`, for what it shows of them.
    fn client_of(base_url: &str, api_key: Option<&str>) -> OpenAiClient {
        OpenAiClient::new(
            Endpoint {
                base_url: base_url.into(),
                model: None,
                api_key: api_key.map(Into::into),
            },
            Options {
                temperature: 0.0,
                timeout: Duration::from_secs(1),
                json_mode: false,
                max_tokens: 100,
                max_response_bytes: 1 << 20,
            },
            0,
        )
    }

    #[test]
    fn endpoint_hides_url_credentials_and_errors_hide_the_key() {
        let client = client_of(
            "https://user:secret@api.example.com/v1/",
            Some("sk-live-123"),
        );
        assert_eq!(
            client.endpoint(),
            "https://api.example.com/v1/chat/completions"
        );
        let e = client.error("echo sk-live-123 back").to_string();
        assert!(!e.contains("sk-live-123") && !e.contains("secret"), "{e}");
        let client = client_of("http://127.0.0.1:8080/v1?api-key=SECRET", None);
        assert_eq!(
            client.endpoint(),
            "http://127.0.0.1:8080/v1/chat/completions"
        );
    }

    #[test]
    fn loopback_detection() {
        assert!(is_loopback("http://127.0.0.1:8080/v1"));
        assert!(is_loopback("http://localhost/v1"));
        assert!(is_loopback("http://[::1]:9/v1"));
        assert!(!is_loopback("https://api.openai.com/v1"));
        assert!(!is_loopback("http://127.0.0.1.example.com/v1"));
        assert!(!is_loopback("http://evil.example?@127.0.0.1/v1"));
        assert!(!is_loopback("http://evil.example#@127.0.0.1/v1"));
    }
}
