//! What a request must do before it is handled. Its body must arrive whole within the body
//! timeout: a client that sends all of a large body but its last byte would otherwise hold
//! the body in the gateway's memory for as long as it liked. And a request that opens an MCP
//! session must find a place among the sessions there are, overall and its token's own: each
//! session holds a worker and its buffers until it has been idle for the session keep-alive.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

use crate::app::Role;
use crate::errors::ApiError;

/// The header that names an MCP session (MCP's streamable HTTP transport).
const MCP_SESSION: &str = "mcp-session-id";

pub struct Admission {
    pub body_timeout: Duration,
    pub max_body: usize,
    /// The MCP endpoint's sessions.
    pub sessions: Arc<LocalSessionManager>,
    pub max_sessions: usize,
    pub max_client_sessions: usize,
    /// The sessions each client (token fingerprint) opened, as they were when last counted.
    opened: Mutex<HashMap<String, Vec<String>>>,
}

impl Admission {
    pub fn new(
        body_timeout: Duration,
        max_body: usize,
        sessions: Arc<LocalSessionManager>,
        max_sessions: usize,
        max_client_sessions: usize,
    ) -> Admission {
        Admission {
            body_timeout,
            max_body,
            sessions,
            max_sessions,
            max_client_sessions,
            opened: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `client` may open one more session, given the sessions that still live.
    fn has_place(&self, live: &HashSet<String>, client: &str) -> bool {
        let Ok(mut opened) = self.opened.lock() else {
            return false;
        };
        opened.retain(|_, ids| {
            ids.retain(|id| live.contains(id));
            !ids.is_empty()
        });
        let own = opened.get(client).map_or(0, Vec::len);
        live.len() < self.max_sessions && own < self.max_client_sessions
    }

    fn opened(&self, client: &str, id: &str) {
        if let Ok(mut opened) = self.opened.lock() {
            opened
                .entry(client.to_string())
                .or_default()
                .push(id.to_string());
        }
    }
}

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

/// Refuses a request that would open an MCP session (a POST to `/mcp` that names none) when
/// the sessions are at their limit, overall or for the request's token.
pub async fn mcp_sessions(
    State(admission): State<Arc<Admission>>,
    request: Request,
    next: Next,
) -> Response {
    let client = request.extensions().get::<Role>().map(|r| r.client.clone());
    let opens = request.uri().path().starts_with("/mcp")
        && request.method() == Method::POST
        && !request.headers().contains_key(MCP_SESSION);
    let (Some(client), true) = (client, opens) else {
        return next.run(request).await;
    };
    let live: HashSet<String> = admission
        .sessions
        .sessions
        .read()
        .await
        .keys()
        .map(|id| id.to_string())
        .collect();
    if !admission.has_place(&live, &client) {
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
    }
    let response = next.run(request).await;
    if let Some(id) = response
        .headers()
        .get(MCP_SESSION)
        .and_then(|v| v.to_str().ok())
    {
        admission.opened(&client, id);
    }
    response
}

/// What a client refused a session is told to wait before trying again.
const SESSIONS_RETRY_AFTER_S: u64 = 30;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_counted_overall_and_per_client_among_those_that_live() {
        let admission = Admission::new(
            Duration::from_secs(1),
            1024,
            Arc::new(LocalSessionManager::default()),
            3,
            2,
        );
        let live = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<HashSet<_>>();
        admission.opened("a", "1");
        admission.opened("a", "2");
        assert!(!admission.has_place(&live(&["1", "2"]), "a"), "a has its 2");
        assert!(admission.has_place(&live(&["1", "2"]), "b"));
        admission.opened("b", "3");
        assert!(
            !admission.has_place(&live(&["1", "2", "3"]), "c"),
            "3 in all"
        );
        // Session 1 expired: a may open another.
        assert!(admission.has_place(&live(&["2", "3"]), "a"));
    }
}
