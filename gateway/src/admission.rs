//! What a request must do before it is handled. Its token may have only so many requests
//! served at once, each counted until its response has been sent whole (an event stream, MCP's
//! or a chat's, for as long as it is open): the connections the gateway serves at once are
//! shared by every token, and one token's long streams would otherwise take them all. Its body
//! must arrive whole within the body timeout: a client that sends all of a large body but its
//! last byte would otherwise hold the body in the gateway's memory for as long as it liked.
//! And a request that opens an MCP session must find a place among the sessions there are,
//! overall and its token's own: each session holds a worker and its buffers until it has been
//! idle for the session keep-alive.

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

use crate::app::Role;
use crate::errors::ApiError;
use crate::watch::Proven;

/// The header that names an MCP session (MCP's streamable HTTP transport).
const MCP_SESSION: &str = "mcp-session-id";

pub struct Admission {
    pub body_timeout: Duration,
    pub max_body: usize,
    /// The MCP endpoint's sessions.
    pub sessions: Arc<LocalSessionManager>,
    pub max_sessions: usize,
    pub max_client_sessions: usize,
    /// Requests one client (token fingerprint) may have served at once.
    pub max_client_requests: usize,
    /// Connections one client may hold: those its requests proved (`watch::Proven`).
    pub max_client_connections: usize,
    /// The connections each client proved that are still open.
    connections: Mutex<HashMap<String, usize>>,
    /// The sessions each client (token fingerprint) opened, as they were when last counted,
    /// and the places taken by requests that may open one and have not been answered yet.
    counted: Mutex<Counted>,
    /// The requests each client has being served.
    serving: Mutex<HashMap<String, usize>>,
    /// The JSON-RPC ids of each session's requests that may still be being answered (hashed,
    /// as the MCP server reads them), each until when it may be: the end of its answer, or, for
    /// one whose client went before the answer, the longest a call may run.
    ids: Mutex<HashMap<String, HashMap<u64, Instant>>>,
    id_hasher: std::collections::hash_map::RandomState,
    /// How long a call may run (the request timeout, and a margin).
    id_hold: Duration,
    /// How long an idle MCP session lives (the session manager's keep-alive).
    session_life: Duration,
}

/// What the clients share, overall and each its own: MCP sessions (`--max-mcp-sessions`,
/// `--max-mcp-sessions-per-token`), requests being served and connections held (per token).
pub struct Shares {
    pub sessions: usize,
    pub client_sessions: usize,
    pub client_requests: usize,
    pub client_connections: usize,
}

/// Requests of one MCP session that may be being answered at once.
const MAX_SESSION_IN_FLIGHT: usize = 256;

#[derive(Default)]
struct Counted {
    opened: HashMap<String, Vec<String>>,
    pending: HashMap<String, usize>,
    /// The client that opened each session, and when. Kept a while after the session is no
    /// longer live: a session opened while another request read the live list is not in it.
    owners: HashMap<String, (String, Instant)>,
    /// When `owners` was last rid of the sessions it no longer keeps: at most once per
    /// `OWNERS_PRUNED_EVERY`, since a client that opens and closes sessions as fast as it can
    /// leaves an entry per session for `OWNER_KEPT`, and a scan of them all at every session
    /// opened would make each opening slower for every client, under the lock they share.
    owners_pruned: Option<Instant>,
    /// Places whose request went (its client closed the connection) before the answer came
    /// back, each until when it counts: the MCP server may have opened a session whose id the
    /// gateway never saw, which lives until it has been idle `session_life`. Counted as the
    /// client's sessions until then, so that a client cannot open sessions past its share by
    /// leaving before each answer.
    unsettled: HashMap<String, Vec<Instant>>,
}

/// How long a session's owner is remembered once it is not live.
const OWNER_KEPT: Duration = Duration::from_secs(60);
/// How often the owners no longer kept are looked for (`Counted::owners_pruned`).
const OWNERS_PRUNED_EVERY: Duration = Duration::from_secs(1);

/// How old a list of the live sessions may be when it is used (read as a request comes in,
/// used once its body is read).
const LIVE_LIST_AGE: Duration = Duration::from_secs(5);

/// A place among the sessions, taken before the request that may open one is handled: without
/// it, requests sent at once would all find the same free places. Given back when dropped
/// (answered, failed or cancelled); a session the answer opened is counted by then.
struct Place<'a> {
    admission: &'a Admission,
    client: String,
    /// Whether its request's answer came back (whatever it said).
    settled: bool,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if let Ok(mut counted) = self.admission.counted.lock() {
            if let Some(n) = counted.pending.get_mut(&self.client) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    counted.pending.remove(&self.client);
                }
            }
            if !self.settled {
                let until = Instant::now() + self.admission.session_life;
                counted
                    .unsettled
                    .entry(self.client.clone())
                    .or_default()
                    .push(until);
            }
        }
    }
}

/// One request of a client being served, counted until dropped: with its response's body,
/// once sent whole, or when the connection goes.
struct Serving {
    admission: Arc<Admission>,
    client: String,
}

impl Drop for Serving {
    fn drop(&mut self) {
        release(&self.admission.serving, &self.client);
    }
}

/// What a response body holds until it is dropped, told when it was sent whole.
trait Held {
    fn sent_whole(&mut self) {}
}

impl Held for Serving {}

/// A connection its client proved, counted until it closes (the connection keeps it).
struct Connection {
    admission: Arc<Admission>,
    client: String,
}

impl Drop for Connection {
    fn drop(&mut self) {
        release(&self.admission.connections, &self.client);
    }
}

/// Takes one of `client`'s places counted in `counts`, if it holds fewer than `share` (at
/// least one); `release` gives it back.
fn take(counts: &Mutex<HashMap<String, usize>>, client: &str, share: usize) -> bool {
    let mut counts = counts.lock().unwrap_or_else(PoisonError::into_inner);
    let n = counts.entry(client.to_string()).or_default();
    if *n >= share.max(1) {
        return false;
    }
    *n += 1;
    true
}

/// Gives back one of `client`'s places counted in `counts`. The counts stay right even after a
/// panic elsewhere held the lock.
fn release(counts: &Mutex<HashMap<String, usize>>, client: &str) {
    let mut counts = counts.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(n) = counts.get_mut(client) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            counts.remove(client);
        }
    }
}

/// A response body that holds `held` (its request's count, its ids) until it ends.
struct HeldBody<H: Held> {
    body: Body,
    held: H,
}

impl<H: Held + Send + Unpin + 'static> HttpBody for HeldBody<H> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let frame = Pin::new(&mut this.body).poll_frame(cx);
        // hyper stops polling a body that says it has ended after its last frame.
        if matches!(frame, Poll::Ready(None)) || this.body.is_end_stream() {
            this.held.sent_whole();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The id of a request into a session, reserved until its answer has been sent whole; an
/// answer whose client went keeps it until it expires (the MCP server may still be running
/// the call, and a repeated id would take over its answer's route, leaving its channel behind
/// for the session's life).
struct Reserved {
    admission: Arc<Admission>,
    session: String,
    id: u64,
    /// The reservation's expiry, which tells it from a later one of the same id.
    until: Instant,
    answered: bool,
}

impl Held for Reserved {
    fn sent_whole(&mut self) {
        self.answered = true;
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if !self.answered {
            return;
        }
        let mut all = self
            .admission
            .ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(reserved) = all.get_mut(&self.session) {
            // Only its own: once it expired, another request may have reserved the id.
            if reserved.get(&self.id) == Some(&self.until) {
                reserved.remove(&self.id);
            }
            if reserved.is_empty() {
                all.remove(&self.session);
            }
        }
    }
}

impl Admission {
    pub fn new(
        body_timeout: Duration,
        max_body: usize,
        sessions: Arc<LocalSessionManager>,
        shares: Shares,
        call_timeout: Duration,
    ) -> Admission {
        let day = Duration::from_secs(24 * 3600);
        let session_life = sessions.session_config.keep_alive.unwrap_or(day).min(day);
        Admission {
            body_timeout,
            max_body,
            sessions,
            max_sessions: shares.sessions,
            max_client_sessions: shares.client_sessions,
            max_client_requests: shares.client_requests,
            max_client_connections: shares.client_connections,
            connections: Mutex::new(HashMap::new()),
            counted: Mutex::new(Counted::default()),
            serving: Mutex::new(HashMap::new()),
            ids: Mutex::new(HashMap::new()),
            id_hasher: std::collections::hash_map::RandomState::new(),
            id_hold: call_timeout + Duration::from_secs(5),
            session_life,
        }
    }

    /// One more connection of `client`, if it holds fewer than its share.
    fn connect(admission: &Arc<Admission>, client: &str) -> Option<Connection> {
        take(
            &admission.connections,
            client,
            admission.max_client_connections,
        )
        .then(|| Connection {
            admission: Arc::clone(admission),
            client: client.to_string(),
        })
    }

    /// One more request of `client` served, if it has fewer than its share.
    fn serve(admission: &Arc<Admission>, client: &str) -> Option<Serving> {
        take(&admission.serving, client, admission.max_client_requests).then(|| Serving {
            admission: Arc::clone(admission),
            client: client.to_string(),
        })
    }

    /// A place for one more session of `client`, given the sessions that still live, if there
    /// is one: sessions and places taken count, overall and the client's own.
    fn place(&self, live: &HashSet<String>, client: &str) -> Option<Place<'_>> {
        let mut counted = self.counted.lock().ok()?;
        counted.opened.retain(|_, ids| {
            ids.retain(|id| live.contains(id));
            !ids.is_empty()
        });
        let now = Instant::now();
        if counted
            .owners_pruned
            .is_none_or(|at| now.duration_since(at) >= OWNERS_PRUNED_EVERY)
        {
            counted
                .owners
                .retain(|id, (_, at)| live.contains(id) || at.elapsed() < OWNER_KEPT);
            counted.owners_pruned = Some(now);
        }
        counted.unsettled.retain(|_, places| {
            places.retain(|until| *until > now);
            !places.is_empty()
        });
        let own = counted.opened.get(client).map_or(0, Vec::len)
            + counted.pending.get(client).copied().unwrap_or(0)
            + counted.unsettled.get(client).map_or(0, Vec::len);
        let all = live.len() + counted.pending.values().sum::<usize>();
        if all >= self.max_sessions || own >= self.max_client_sessions {
            return None;
        }
        *counted.pending.entry(client.to_string()).or_default() += 1;
        Some(Place {
            admission: self,
            client: client.to_string(),
            settled: false,
        })
    }

    /// Whether `client` opened the session `id`.
    fn owns(&self, client: &str, id: &str) -> bool {
        self.counted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .owners
            .get(id)
            .is_some_and(|(owner, _)| owner == client)
    }

    /// Reserves the request id of `body`, a POST into the live session `session`: `Err` with
    /// what to tell the client when it is still reserved in the session (its request may still
    /// be being answered) or the session has `MAX_SESSION_IN_FLIGHT` reserved. Ids are read as
    /// the MCP server reads them (`7`, `7.0` and `7e0` are one id). Reservations that expired
    /// are dropped, and with them sessions no longer `live`.
    fn reserve_ids(
        self: &Arc<Self>,
        live: &HashSet<String>,
        session: &str,
        body: &[u8],
    ) -> Result<Option<Reserved>, String> {
        use rmcp::model::{NumberOrString, RequestId};
        let Ok(message) = serde_json::from_slice::<serde_json::Value>(body) else {
            return Ok(None);
        };
        let Some(id) = message.get("method").and(message.get("id")) else {
            return Ok(None);
        };
        let Ok(id) = serde_json::from_value::<RequestId>(id.clone()) else {
            return Ok(None);
        };
        let (text, key) = match &id {
            NumberOrString::Number(n) => (n.to_string(), format!("n{n}")),
            NumberOrString::String(s) => (format!("{s:?}"), format!("s{s}")),
        };
        let hash = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = self.id_hasher.build_hasher();
            h.write(key.as_bytes());
            h.finish()
        };
        let now = Instant::now();
        let mut all = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
        if all.keys().any(|id| !live.contains(id)) {
            // A session that ended takes no more requests, so no id of its can be used again:
            // its reservations go with it (kept, they would grow with how fast a client opens
            // and closes sessions, leaving before each answer). Those made since `live` was
            // read (before this request's body) may be of a session opened since: kept.
            let recent = now
                + self
                    .id_hold
                    .saturating_sub(self.body_timeout + LIVE_LIST_AGE);
            all.retain(|id, reserved| {
                live.contains(id) || {
                    reserved.retain(|_, until| *until > now && *until > recent);
                    !reserved.is_empty()
                }
            });
        }
        let reserved = all.entry(session.to_string()).or_default();
        reserved.retain(|_, until| *until > now);
        if reserved.contains_key(&hash) {
            return Err(format!(
                "a request with id {text} may still be being answered in this MCP session: an id \
                 is used once at a time"
            ));
        }
        if reserved.len() >= MAX_SESSION_IN_FLIGHT {
            return Err(format!(
                "this MCP session has {MAX_SESSION_IN_FLIGHT} requests being answered"
            ));
        }
        let until = now + self.id_hold;
        reserved.insert(hash, until);
        Ok(Some(Reserved {
            admission: Arc::clone(self),
            session: session.to_string(),
            id: hash,
            until,
            answered: false,
        }))
    }

    fn opened(&self, client: &str, id: &str) {
        if let Ok(mut counted) = self.counted.lock() {
            counted
                .opened
                .entry(client.to_string())
                .or_default()
                .push(id.to_string());
            counted
                .owners
                .insert(id.to_string(), (client.to_string(), Instant::now()));
        }
    }
}

/// Serves a request of a token that has fewer than `max_client_requests` being served, and
/// counts it until its response has been sent; refuses it (429) otherwise. Closing an MCP
/// session (DELETE /mcp) is never held back: it is what frees a token's places.
pub async fn requests(
    State(admission): State<Arc<Admission>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(client) = request.extensions().get::<Role>().map(|r| r.client.clone()) else {
        // Every request has a token's role by now (`authenticate`); one without is refused.
        return ApiError::unauthorized().into_response();
    };
    let closing_mcp_session = request.method() == Method::DELETE && request.uri().path() == "/mcp";
    // The first request with a known token proves its connection, which then counts among its
    // token's until it closes: proven connections are never closed to make room, and one token
    // holding them all (each idle, asking something now and then) would keep every other out.
    // A request of another token moves the connection to that token's count: a token revoked,
    // or another one's requests, do not keep it on the first one's.
    if let Some(proven) = request.extensions().get::<Proven>().cloned() {
        let taken = {
            let mut held = proven.held.lock().unwrap_or_else(PoisonError::into_inner);
            match held.as_ref() {
                Some((holder, _)) if *holder == client => true,
                _ => match Admission::connect(&admission, &client) {
                    Some(connection) => {
                        *held = Some((client.clone(), Box::new(connection)));
                        true
                    }
                    None => false,
                },
            }
        };
        if taken {
            proven.proof.cancel();
        } else if closing_mcp_session {
            // Closing a session is served (it frees the token's places), on a connection that
            // then closes.
            return closing(next.run(request).await);
        } else {
            return closing(
                rate_limited(format!(
                    "this token holds {} connections (--max-connections-per-token): send \
                     requests on those, or close one",
                    admission.max_client_connections
                ))
                .into_response(),
            );
        }
    }
    if closing_mcp_session {
        return next.run(request).await;
    }
    let Some(serving) = Admission::serve(&admission, &client) else {
        return rate_limited(format!(
            "this token has {} requests being served (--max-requests-per-token), event streams \
             included: wait for one to end",
            admission.max_client_requests
        ))
        .into_response();
    };
    next.run(request).await.map(|body| {
        Body::new(HeldBody {
            body,
            held: serving,
        })
    })
}

/// `response`, after which its connection closes.
pub fn closing(mut response: Response) -> Response {
    response.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    response
}

/// What a client refused for its token's share of requests is told to wait: a place comes
/// free when a request ends, an event stream's only when it closes.
const REQUESTS_RETRY_AFTER_S: u64 = 5;

/// Reads the request's body whole, within the body timeout and `max_body`, before the
/// handler runs.
pub async fn read_body(
    State(admission): State<Arc<Admission>>,
    request: Request,
    next: Next,
) -> Response {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!(
                "the request body is larger than {} bytes, or was cut off",
                admission.max_body
            ),
        )
        .into_response()
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > admission.max_body as u64) {
        return too_large();
    }
    let (parts, body) = request.into_parts();
    let read = tokio::time::timeout(
        admission.body_timeout,
        axum::body::to_bytes(body, admission.max_body),
    )
    .await;
    match read {
        Err(_) => ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!(
                "the request body did not arrive within the gateway's --body-timeout ({} s)",
                admission.body_timeout.as_secs()
            ),
        )
        .into_response(),
        Ok(Err(_)) => too_large(),
        Ok(Ok(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
    }
}

/// Refuses a request that may open an MCP session (a POST to `/mcp` that names no live session:
/// none, or one the session manager cannot read or does not have) when the sessions are at
/// their limit, overall or for the request's token.
pub async fn mcp_sessions(
    State(admission): State<Arc<Admission>>,
    request: Request,
    next: Next,
) -> Response {
    let client = request.extensions().get::<Role>().map(|r| r.client.clone());
    let (Some(client), true) = (client, request.uri().path().starts_with("/mcp")) else {
        return next.run(request).await;
    };
    // A session is its token's: another token that learnt its id (from a log, say) may not
    // read its events again, send into it or close it.
    let session = request
        .headers()
        .get(MCP_SESSION)
        .map(|v| v.to_str().unwrap_or_default().to_string());
    if let Some(id) = &session {
        if !admission.owns(&client, id) {
            return ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "this token has no MCP session of that id",
            )
            .into_response();
        }
    }
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let live: HashSet<String> = admission
        .sessions
        .sessions
        .read()
        .await
        .keys()
        .map(|id| id.to_string())
        .collect();
    let named = request
        .headers()
        .get(MCP_SESSION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|id| live.contains(id));
    if let (true, Some(id)) = (named, &session) {
        let (parts, body) = request.into_parts();
        // Buffered whole by `read_body`.
        let Ok(bytes) = axum::body::to_bytes(body, admission.max_body).await else {
            return ApiError::bad_request("the request body could not be read").into_response();
        };
        let reserved = match admission.reserve_ids(&live, id, &bytes) {
            Ok(reserved) => reserved,
            Err(why) => {
                return ApiError::new(StatusCode::CONFLICT, "invalid_request_error", why)
                    .into_response()
            }
        };
        let response = next
            .run(Request::from_parts(parts, Body::from(bytes)))
            .await;
        // Only an event stream carries an answer the MCP server may still be writing; any other
        // response (an answer in JSON, a refusal) is all there will be.
        let streamed = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        return match reserved {
            Some(held) if streamed => response.map(|body| Body::new(HeldBody { body, held })),
            Some(mut held) => {
                held.sent_whole();
                response
            }
            None => response,
        };
    }
    let Some(place) = admission.place(&live, &client) else {
        return ApiError {
            retry_after: Some(SESSIONS_RETRY_AFTER_S),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "rate_limit_error",
                format!(
                    "too many MCP sessions are open (at most {} in all, {} per token): close \
                     one (DELETE /mcp) or wait until an idle one expires",
                    admission.max_sessions, admission.max_client_sessions
                ),
            )
        }
        .into_response();
    };
    let mut place = place;
    let response = next.run(request).await;
    if let Some(id) = response
        .headers()
        .get(MCP_SESSION)
        .and_then(|v| v.to_str().ok())
    {
        admission.opened(&client, id);
    }
    place.settled = true;
    drop(place);
    response
}

/// What a client refused a session is told to wait before trying again.
const SESSIONS_RETRY_AFTER_S: u64 = 30;

/// A token's request refused for its share: 429 with Retry-After.
fn rate_limited(message: String) -> ApiError {
    ApiError {
        retry_after: Some(REQUESTS_RETRY_AFTER_S),
        code: Some("rate_limit_exceeded".into()),
        ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_counted_overall_and_per_client_among_those_that_live() {
        let admission = Admission::new(
            Duration::from_secs(1),
            1024,
            Arc::new(LocalSessionManager::default()),
            Shares {
                sessions: 3,
                client_sessions: 2,
                client_requests: 8,
                client_connections: 8,
            },
            Duration::from_secs(300),
        );
        let live = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<HashSet<_>>();
        admission.opened("a", "1");
        admission.opened("a", "2");
        assert!(
            admission.place(&live(&["1", "2"]), "a").is_none(),
            "a has its 2"
        );
        assert!(admission.place(&live(&["1", "2"]), "b").is_some());
        admission.opened("b", "3");
        assert!(
            admission.place(&live(&["1", "2", "3"]), "c").is_none(),
            "3 in all"
        );
        // Session 1 expired: a may open another.
        assert!(admission.place(&live(&["2", "3"]), "a").is_some());
        assert!(admission.owns("a", "2") && admission.owns("b", "3"));
        assert!(!admission.owns("b", "2"), "a's session is not b's");
    }

    #[test]
    fn a_request_id_is_reserved_until_its_answer_was_sent_whole() {
        let admission = Arc::new(Admission::new(
            Duration::from_secs(1),
            1024,
            Arc::new(LocalSessionManager::default()),
            Shares {
                sessions: 3,
                client_sessions: 2,
                client_requests: 8,
                client_connections: 8,
            },
            Duration::from_secs(300),
        ));
        let live = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<HashSet<_>>();
        let s1 = live(&["s1", "s2"]);
        let call = |id: &str| format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
        let reserve =
            |session: &str, id: &str| admission.reserve_ids(&s1, session, call(id).as_bytes());
        let first = reserve("s1", "7").unwrap().expect("a request");
        // As the MCP server reads ids: 7.0 and 7e0 are 7; "7" is another id.
        for same in ["7", "7.0", "7e0", "70e-1"] {
            let again = reserve("s1", same);
            assert!(again.is_err_and(|why| why.contains("id 7")), "{same}");
        }
        assert!(reserve("s1", "\"7\"").unwrap().is_some());
        assert!(reserve("s2", "7").unwrap().is_some(), "another session");
        // A client gone before its answer: the call may still run, the id stays reserved.
        drop(first);
        assert!(reserve("s1", "7").is_err());
        // An answer sent whole frees its id.
        let mut second = reserve("s1", "8").unwrap().expect("a request");
        second.sent_whole();
        drop(second);
        assert!(reserve("s1", "8").unwrap().is_some());
        // Notifications and the client's answers to the server reserve nothing.
        let note =
            br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}"#;
        assert!(admission.reserve_ids(&s1, "s1", note).unwrap().is_none());
        let answer = br#"{"jsonrpc":"2.0","id":9,"result":{}}"#;
        assert!(admission.reserve_ids(&s1, "s1", answer).unwrap().is_none());
    }

    #[test]
    fn reservations_expire_and_ended_sessions_are_forgotten() {
        let mut admission = Admission::new(
            Duration::from_secs(1),
            1024,
            Arc::new(LocalSessionManager::default()),
            Shares {
                sessions: 3,
                client_sessions: 2,
                client_requests: 8,
                client_connections: 8,
            },
            Duration::ZERO,
        );
        // Long enough that no pause of a loaded machine between two steps expires one.
        admission.id_hold = Duration::from_millis(1000);
        let admission = Arc::new(admission);
        let live = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<HashSet<_>>();
        let ping = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
        let _gone = admission.reserve_ids(&live(&["s1"]), "s1", ping).unwrap();
        assert!(admission.reserve_ids(&live(&["s1"]), "s1", ping).is_err());
        std::thread::sleep(Duration::from_millis(1200));
        assert!(
            admission.reserve_ids(&live(&["s1"]), "s1", ping).is_ok(),
            "expired"
        );
        std::thread::sleep(Duration::from_millis(1200));
        let _other = admission.reserve_ids(&live(&["s2"]), "s2", ping).unwrap();
        assert!(
            !admission.ids.lock().unwrap().contains_key("s1"),
            "s1 ended"
        );
        // An answer sent after its reservation expired frees nobody else's.
        let s3 = live(&["s3"]);
        let mut late = admission.reserve_ids(&s3, "s3", ping).unwrap().unwrap();
        std::thread::sleep(Duration::from_millis(1200));
        let _newer = admission.reserve_ids(&s3, "s3", ping).unwrap().unwrap();
        late.sent_whole();
        drop(late);
        assert!(
            admission.reserve_ids(&s3, "s3", ping).is_err(),
            "the newer one holds"
        );
    }

    #[test]
    fn a_client_is_served_up_to_its_share_until_a_request_is_given_back() {
        let admission = Arc::new(Admission::new(
            Duration::from_secs(1),
            1024,
            Arc::new(LocalSessionManager::default()),
            Shares {
                sessions: 3,
                client_sessions: 2,
                client_requests: 2,
                client_connections: 8,
            },
            Duration::from_secs(300),
        ));
        let first = Admission::serve(&admission, "a");
        let second = Admission::serve(&admission, "a");
        assert!(first.is_some() && second.is_some());
        assert!(
            Admission::serve(&admission, "a").is_none(),
            "a's 2 are served"
        );
        assert!(Admission::serve(&admission, "b").is_some(), "b has its own");
        drop(first);
        assert!(Admission::serve(&admission, "a").is_some(), "given back");
    }

    #[test]
    fn places_taken_by_requests_not_yet_answered_count_until_given_back() {
        let admission = Admission::new(
            Duration::from_secs(1),
            1024,
            Arc::new(LocalSessionManager::default()),
            Shares {
                sessions: 3,
                client_sessions: 2,
                client_requests: 8,
                client_connections: 8,
            },
            Duration::from_secs(300),
        );
        let none = HashSet::new();
        let first = admission.place(&none, "a");
        let second = admission.place(&none, "a");
        assert!(first.is_some() && second.is_some());
        assert!(admission.place(&none, "a").is_none(), "a's 2 are taken");
        let third = admission.place(&none, "b");
        assert!(third.is_some());
        assert!(admission.place(&none, "c").is_none(), "3 in all");
        let mut second = second.unwrap();
        second.settled = true;
        drop(second);
        assert!(admission.place(&none, "a").is_some(), "given back");
    }

    #[test]
    fn a_place_whose_client_left_before_the_answer_counts_until_a_session_would_expire() {
        // The MCP server may have opened a session whose id the gateway never saw: it lives
        // until idle for the session manager's keep-alive, unowned.
        let mut admission = Admission::new(
            Duration::from_secs(1),
            1024,
            Arc::new(LocalSessionManager::default()),
            Shares {
                sessions: 8,
                client_sessions: 2,
                client_requests: 8,
                client_connections: 8,
            },
            Duration::from_secs(300),
        );
        assert_eq!(admission.session_life, Duration::from_secs(300));
        admission.session_life = Duration::from_millis(1000);
        let none = HashSet::new();
        for _ in 0..2 {
            drop(admission.place(&none, "a").unwrap());
        }
        assert!(
            admission.place(&none, "a").is_none(),
            "a left before 2 answers"
        );
        assert!(admission.place(&none, "b").is_some(), "b has its own");
        std::thread::sleep(Duration::from_millis(1200));
        assert!(
            admission.place(&none, "a").is_some(),
            "they would have expired"
        );
    }

    #[test]
    fn an_ended_sessions_reservations_go_with_it() {
        let admission = Arc::new(Admission::new(
            Duration::from_secs(1),
            1024,
            Arc::new(LocalSessionManager::default()),
            Shares {
                sessions: 3,
                client_sessions: 2,
                client_requests: 8,
                client_connections: 8,
            },
            Duration::from_secs(300),
        ));
        let live = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<HashSet<_>>();
        let call = |id: usize| format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
        // Clients gone before their answers: each reservation is kept for the call's time.
        for id in 0..200 {
            drop(admission.reserve_ids(&live(&["s1"]), "s1", call(id).as_bytes()));
        }
        assert_eq!(admission.ids.lock().unwrap()["s1"].len(), 200);
        // Made a while ago (a list of the live sessions read before they were made may not
        // name their session yet, so newer ones are kept).
        for until in admission
            .ids
            .lock()
            .unwrap()
            .get_mut("s1")
            .unwrap()
            .values_mut()
        {
            *until -= Duration::from_secs(30);
        }
        let _next = admission
            .reserve_ids(&live(&["s2"]), "s2", call(1).as_bytes())
            .unwrap();
        assert!(
            !admission.ids.lock().unwrap().contains_key("s1"),
            "s1 ended: none of its ids can be sent again"
        );
    }
}
