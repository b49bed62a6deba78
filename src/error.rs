//! One error type for the whole extension. Every variant carries a real SQLSTATE, and the
//! conversion to a PostgreSQL ERROR happens once, at the API edge (`Error::raise`).

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::PgSqlErrorCode;

/// An SQL error as PostgreSQL reported it, kept whole so that it can be fed back to the model,
/// written to the trace, and re-raised unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SqlError {
    /// Five-character SQLSTATE, e.g. `42703`.
    pub sqlstate: String,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
    /// 1-based character offset into the statement, when PostgreSQL reported one.
    pub position: Option<i32>,
}

impl SqlError {
    pub fn new(sqlstate: &str, message: impl Into<String>) -> Self {
        SqlError {
            sqlstate: sqlstate.to_string(),
            message: message.into(),
            ..Default::default()
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The caller passed something unusable (an empty question, say).
    #[error("{0}")]
    InvalidParameter(String),

    /// A setting the call needs is missing or unusable.
    #[error("{message}")]
    Setting { message: String, hint: String },

    /// The LLM endpoint could not be reached, answered with an error, or answered garbage.
    #[error("LLM request to {endpoint} failed: {cause}")]
    Llm { endpoint: String, cause: String },

    /// The guard refused a statement (a write proposed by the model, or what `nl_check` was
    /// given); it was never executed.
    #[error("{}", .0.message)]
    Refused(Box<SqlError>),

    /// Every attempt failed; carries the last error and the last SQL.
    #[error("could not answer the question: all {attempts} attempts failed; last error: {}", last.message)]
    AllAttemptsFailed {
        attempts: usize,
        last: Box<SqlError>,
        last_sql: String,
    },

    /// A bug on our side; never expected, but never a crash either.
    #[error("internal error in sql_query_engine: {0}")]
    Internal(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn internal(what: impl std::fmt::Display) -> Self {
        Error::Internal(what.to_string())
    }

    /// The SQLSTATE this error is raised with.
    pub fn sqlstate(&self) -> String {
        match self {
            Error::InvalidParameter(_) => "22023".into(),
            Error::Setting { .. } => "55000".into(),
            // An external service failed: PostgreSQL's "system error" class, not a client error.
            Error::Llm { .. } => "58000".into(),
            Error::Refused(e) => e.sqlstate.clone(),
            Error::AllAttemptsFailed { last, .. } => last.sqlstate.clone(),
            Error::Internal(_) => "XX000".into(),
        }
    }

    fn detail(&self) -> Option<String> {
        match self {
            Error::Refused(e) => e.detail.clone(),
            Error::AllAttemptsFailed { last_sql, .. } => Some(format!("last SQL: {last_sql}")),
            _ => None,
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            Error::Setting { hint, .. } => Some(hint.clone()),
            Error::Refused(e) => e.hint.clone(),
            Error::AllAttemptsFailed { last, .. } => last.hint.clone(),
            Error::Llm { .. } => Some(
                "Check sql_query_engine.llm_url and that the endpoint is up; \
                 sql_query_engine.llm_timeout bounds the wait."
                    .into(),
            ),
            _ => None,
        }
    }

    /// Raise this error as a PostgreSQL ERROR. Never returns.
    pub fn raise(self) -> ! {
        let code = sqlstate_to_code(&self.sqlstate());
        let mut report = ErrorReport::new(code, self.to_string(), "sql_query_engine");
        if let Some(detail) = self.detail() {
            report = report.set_detail(detail);
        }
        if let Some(hint) = self.hint() {
            report = report.set_hint(hint);
        }
        report.report(pgrx::PgLogLevel::ERROR);
        unreachable!("an ERROR report returns control to PostgreSQL")
    }
}

/// Pack a five-character SQLSTATE the way PostgreSQL's MAKE_SQLSTATE does.
pub fn sqlstate_to_code(sqlstate: &str) -> PgSqlErrorCode {
    let bytes = sqlstate.as_bytes();
    if bytes.len() != 5 {
        return PgSqlErrorCode::ERRCODE_INTERNAL_ERROR;
    }
    let packed = bytes.iter().enumerate().fold(0i32, |acc, (i, b)| {
        acc + ((((*b as i32) - ('0' as i32)) & 0x3F) << (6 * i))
    });
    PgSqlErrorCode::from(packed)
}

/// Unpack PostgreSQL's integer SQLSTATE into its five characters.
pub fn code_to_sqlstate(code: PgSqlErrorCode) -> String {
    let mut packed = code as i32;
    let mut out = String::with_capacity(5);
    for _ in 0..5 {
        out.push(char::from((((packed & 0x3F) as u8) + b'0') & 0x7F));
        packed >>= 6;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_round_trip() {
        for s in [
            "42703", "25006", "57014", "22023", "XX000", "42P01", "58000",
        ] {
            assert_eq!(code_to_sqlstate(sqlstate_to_code(s)), s);
        }
        assert_eq!(
            sqlstate_to_code("42703"),
            PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN
        );
    }

    #[test]
    fn all_failed_names_attempts_and_keeps_last_sql_in_detail() {
        let e = Error::AllAttemptsFailed {
            attempts: 5,
            last: Box::new(SqlError::new("42P01", "relation \"x\" does not exist")),
            last_sql: "SELECT * FROM x".into(),
        };
        assert_eq!(e.sqlstate(), "42P01");
        assert!(e.to_string().contains("all 5 attempts failed"));
        assert_eq!(e.detail().as_deref(), Some("last SQL: SELECT * FROM x"));
    }
}
