//! Errors as OpenAI-style objects with proper HTTP codes: never HTTP 200 with an error inside.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::db::DbError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    /// OpenAI's `type`: invalid_request_error, authentication_error, ...
    pub kind: &'static str,
    pub message: String,
    /// The SQLSTATE, or OpenAI's code (`model_not_found`, ...).
    pub code: Option<String>,
    /// Seconds after which a client may try again (`Retry-After`), for a 503 or a 429.
    pub retry_after: Option<u64>,
}

/// What a busy or unreachable database's 503, or a role's full share's 429, tells clients to
/// wait before trying again.
const RETRY_AFTER_S: u64 = 2;

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
            code: None,
            retry_after: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub fn unauthorized() -> Self {
        ApiError {
            code: Some("invalid_api_key".into()),
            ..ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "a valid bearer token is needed (Authorization: Bearer TOKEN)",
            )
        }
    }

    pub fn timeout() -> Self {
        ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout_error",
            "the request took longer than the gateway's --request-timeout; it was cancelled",
        )
    }

    /// The error object itself, also for a stream.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": null, "code": self.code}})
    }
}

impl From<DbError> for ApiError {
    fn from(error: DbError) -> Self {
        match error.for_clients() {
            DbError::Busy => ApiError {
                retry_after: Some(RETRY_AFTER_S),
                ..ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "server_error",
                    "every database connection is busy; try again",
                )
            },
            DbError::RoleBusy(calls) => ApiError {
                retry_after: Some(RETRY_AFTER_S),
                code: Some("rate_limit_exceeded".into()),
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limit_error",
                    format!(
                        "this token's role already has {calls} calls running, its share of the \
                         gateway (--role-calls); try again when one has ended"
                    ),
                )
            },
            DbError::Unavailable(cause) => ApiError {
                retry_after: Some(RETRY_AFTER_S),
                ..ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "server_error",
                    format!("the database is unavailable: {cause}"),
                )
            },
            DbError::Sql {
                sqlstate,
                message,
                hint,
                ..
            } => {
                let (status, kind) = match sqlstate.as_str() {
                    "22023" | "22021" | "42601" => {
                        (StatusCode::BAD_REQUEST, "invalid_request_error")
                    }
                    "42501" | "25006" => (StatusCode::FORBIDDEN, "permission_error"),
                    "42704" => (StatusCode::NOT_FOUND, "invalid_request_error"),
                    "58000" => (StatusCode::BAD_GATEWAY, "upstream_error"),
                    "57014" => (StatusCode::GATEWAY_TIMEOUT, "timeout_error"),
                    "55000" | "53300" => (StatusCode::SERVICE_UNAVAILABLE, "server_error"),
                    s if s.starts_with("28") => (StatusCode::SERVICE_UNAVAILABLE, "server_error"),
                    // Every attempt failed: the question could not be answered.
                    _ => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request_error"),
                };
                // PostgreSQL's hint says what to do about it: chat UIs show only the message.
                let message = match hint {
                    Some(hint) => format!("{message} ({hint})"),
                    None => message,
                };
                ApiError {
                    code: Some(sqlstate),
                    ..ApiError::new(status, kind, message)
                }
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = crate::shown::json_response(self.status, &self.body());
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, seconds.into());
        }
        response
    }
}
