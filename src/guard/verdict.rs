//! What the guard decides: who wrote the SQL it checks, and why a statement may not run.

use crate::error::{SqlError, SqlState};

/// Who wrote the SQL, which decides how strict the check is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The model's or the caller's SQL.
    Generated,
    /// The extension's own reads (schema samples, the value index).
    Own,
}

impl Origin {
    pub(super) fn what(self) -> &'static str {
        match self {
            Origin::Generated => "a generated query",
            Origin::Own => "the extension's own reads",
        }
    }
}

/// Why a statement may not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub error: SqlError,
    /// A write ends the run: it is reported, never repaired. A refused read is fed back to the
    /// model like any other error.
    pub ends_run: bool,
}

impl Refusal {
    pub(super) fn write(command: &str) -> Self {
        Refusal {
            error: SqlError {
                sqlstate: SqlState::READ_ONLY_SQL_TRANSACTION,
                message: format!(
                    "refused to run a {command} statement: only a single read-only query may run"
                ),
                hint: Some(
                    "The model proposed a statement that writes or changes state; it was not executed."
                        .into(),
                ),
                ..Default::default()
            },
            ends_run: true,
        }
    }

    pub(super) fn read(sqlstate: SqlState, message: String) -> Self {
        Refusal {
            error: SqlError::new(sqlstate, message),
            ends_run: false,
        }
    }

    pub fn forbidden(message: String) -> Self {
        Refusal::read(SqlState::INSUFFICIENT_PRIVILEGE, message)
    }
}
