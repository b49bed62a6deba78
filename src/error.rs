//! One error type for the whole extension. Every variant carries a real SQLSTATE, and the
//! conversion to a PostgreSQL ERROR happens once, at the API edge (`Error::raise`).

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::PgSqlErrorCode;

/// A five-character SQLSTATE, e.g. `42703`. PostgreSQL's own codes, as one small type: they
/// are compared, matched by class and written into traces, never parsed from free text.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SqlState([u8; 5]);

impl SqlState {
    pub const DATA_EXCEPTION: SqlState = SqlState(*b"22000");
    pub const INVALID_PARAMETER_VALUE: SqlState = SqlState(*b"22023");
    pub const CHARACTER_NOT_IN_REPERTOIRE: SqlState = SqlState(*b"22021");
    pub const READ_ONLY_SQL_TRANSACTION: SqlState = SqlState(*b"25006");
    pub const SYNTAX_ERROR: SqlState = SqlState(*b"42601");
    pub const INSUFFICIENT_PRIVILEGE: SqlState = SqlState(*b"42501");
    pub const UNDEFINED_COLUMN: SqlState = SqlState(*b"42703");
    pub const INVALID_COLUMN_REFERENCE: SqlState = SqlState(*b"42P10");
    pub const UNDEFINED_TABLE: SqlState = SqlState(*b"42P01");
    pub const GROUPING_ERROR: SqlState = SqlState(*b"42803");
    pub const WINDOWING_ERROR: SqlState = SqlState(*b"42P20");
    pub const UNDEFINED_FUNCTION: SqlState = SqlState(*b"42883");
    pub const AMBIGUOUS_FUNCTION: SqlState = SqlState(*b"42725");
    pub const DATATYPE_MISMATCH: SqlState = SqlState(*b"42804");
    pub const CANNOT_COERCE: SqlState = SqlState(*b"42846");
    pub const DUPLICATE_CURSOR: SqlState = SqlState(*b"42P03");
    pub const NAME_TOO_LONG: SqlState = SqlState(*b"42622");
    pub const QUERY_CANCELED: SqlState = SqlState(*b"57014");
    pub const OUT_OF_MEMORY: SqlState = SqlState(*b"53200");
    pub const STATEMENT_TOO_COMPLEX: SqlState = SqlState(*b"54001");
    pub const PROGRAM_LIMIT_EXCEEDED: SqlState = SqlState(*b"54000");
    pub const OBJECT_NOT_IN_PREREQUISITE_STATE: SqlState = SqlState(*b"55000");
    pub const OBJECT_IN_USE: SqlState = SqlState(*b"55006");
    pub const SYSTEM_ERROR: SqlState = SqlState(*b"58000");
    pub const INTERNAL_ERROR: SqlState = SqlState(*b"XX000");
    /// ambiguous_parameter: the question (the call's parameter) is too doubtful to answer
    /// (`sql_query_engine.abstain`). Generated queries have no parameters, so PostgreSQL never
    /// raises it for them.
    pub const NOT_SURE: SqlState = SqlState(*b"42P08");

    /// From its five characters; anything else is an internal error's code.
    pub fn parse(text: &str) -> SqlState {
        match <[u8; 5]>::try_from(text.as_bytes()) {
            Ok(bytes) if bytes.iter().all(u8::is_ascii_alphanumeric) => SqlState(bytes),
            _ => SqlState::INTERNAL_ERROR,
        }
    }

    /// The code PostgreSQL packs into an integer (MAKE_SQLSTATE).
    pub fn from_code(code: PgSqlErrorCode) -> SqlState {
        SqlState::from_packed(code as i32)
    }

    /// The code of PostgreSQL's integer `packed` (MAKE_SQLSTATE), also one pgrx does not know.
    pub fn from_packed(mut packed: i32) -> SqlState {
        let mut bytes = [0u8; 5];
        for byte in &mut bytes {
            *byte = ((((packed & 0x3F) as u8) + b'0') & 0x7F).to_ascii_uppercase();
            packed >>= 6;
        }
        SqlState(bytes)
    }

    pub fn code(self) -> PgSqlErrorCode {
        let packed = self.0.iter().enumerate().fold(0i32, |acc, (i, b)| {
            acc + ((((*b as i32) - ('0' as i32)) & 0x3F) << (6 * i))
        });
        PgSqlErrorCode::from(packed)
    }

    pub fn as_str(&self) -> &str {
        // Only ever built from ASCII.
        std::str::from_utf8(&self.0).unwrap_or("XX000")
    }

    /// The two-character class, e.g. `42` (syntax error or access rule violation).
    pub fn class(&self) -> &str {
        &self.as_str()[..2]
    }
}

impl std::fmt::Display for SqlState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for SqlState {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl std::fmt::Debug for SqlState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SqlState({})", self.as_str())
    }
}

impl serde::Serialize for SqlState {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// An SQL error as PostgreSQL reported it, kept whole so that it can be fed back to the model,
/// written to the trace, and re-raised unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SqlError {
    pub sqlstate: SqlState,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
    /// 1-based character offset into the statement, when PostgreSQL reported one.
    pub position: Option<i32>,
    /// Raised once the query was analysed (planning, execution, collection): its text may
    /// hold stored values, whatever its SQLSTATE (`col::regclass` names one in a 42P01).
    pub ran: bool,
    /// A plan refused as absurd: its message names the planner's estimates, which the
    /// statistics of every row decide (and an index's real extremes).
    pub names_estimates: bool,
    /// PostgreSQL itself failed under the query (its memory, a full disk, an I/O error, an
    /// internal error of its C code): nothing a repair can mend, so the loop stops there with
    /// the answer it has.
    pub ends_run: bool,
}

impl SqlError {
    pub fn new(sqlstate: SqlState, message: impl Into<String>) -> Self {
        SqlError {
            sqlstate,
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

    /// The LLM endpoint could not be reached, answered with an error, or answered garbage;
    /// `fault` says whose failure it was (what `llm::breaker` is told).
    #[error("LLM request to {endpoint} failed: {cause}")]
    Llm {
        endpoint: String,
        cause: String,
        fault: Fault,
    },

    /// The guard refused a statement (a write proposed by the model, or what `nl_check` was
    /// given); it was never executed.
    #[error("{}", .0.message)]
    Refused(Box<SqlError>),

    /// A query the caller gave (`nl_run`) failed: raised as PostgreSQL reported it.
    #[error("{}", .0.message)]
    Query(Box<SqlError>),

    /// Every attempt failed; carries the last error and the last SQL.
    #[error("could not answer the question: all {attempts} attempts failed; last error: {}", last.message)]
    AllAttemptsFailed {
        attempts: usize,
        last: Box<SqlError>,
        last_sql: String,
    },

    /// The model twice answered without a query: what was asked is not a question the
    /// database answers (a greeting, a task for another tool).
    #[error(
        "this does not look like a question about the data: the model answered without a query"
    )]
    NotAQuestion { said: String },

    /// A doubtful answer withheld (`abstain = when_in_doubt`): raised as `42P08`, a SQLSTATE
    /// only this error is raised with (a query's own `42P08`, which another role's code may
    /// raise, is raised as `XX000` and named in DETAIL), so that a client may take it for the
    /// signal it is.
    #[error("{}", .0.message)]
    NotSure(Box<SqlError>),

    /// A bug on our side; never expected, but never a crash either.
    #[error("internal error in sql_query_engine: {0}")]
    Internal(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// Whose failure a failed model request was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The endpoint's own, whatever was asked (unreachable, no answer within the server's
    /// `llm_timeout`, 429 or 5xx, not a completion): the only kind shared with other backends.
    Endpoint,
    /// One the request may have caused (a 4xx, an empty or refused answer): it keeps only the
    /// asking role away from the endpoint.
    Request,
    /// The backend's: no helper thread was free, so nothing was asked; no endpoint or role is
    /// blamed, and no other endpoint would fare better.
    Busy,
}

impl Error {
    pub fn internal(what: impl std::fmt::Display) -> Self {
        Error::Internal(what.to_string())
    }

    /// An error with its own SQLSTATE, message and hint (a refusal of the caller's request).
    pub fn sql(sqlstate: &str, message: impl Into<String>, hint: Option<&str>) -> Self {
        Error::Query(Box::new(SqlError {
            sqlstate: SqlState::parse(sqlstate),
            message: message.into(),
            hint: hint.map(str::to_string),
            ..Default::default()
        }))
    }

    /// The SQLSTATE this error is raised with.
    pub fn sqlstate(&self) -> SqlState {
        match self {
            Error::InvalidParameter(_) | Error::NotAQuestion { .. } => {
                SqlState::INVALID_PARAMETER_VALUE
            }
            Error::Setting { .. } => SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
            // An external service failed: PostgreSQL's "system error" class, not a client error.
            Error::Llm { .. } => SqlState::SYSTEM_ERROR,
            Error::Refused(e) | Error::Query(e) => e.sqlstate,
            Error::NotSure(_) => SqlState::NOT_SURE,
            Error::AllAttemptsFailed { last, .. } => last.sqlstate,
            Error::Internal(_) => SqlState::INTERNAL_ERROR,
        }
    }

    pub fn detail(&self) -> Option<String> {
        match self {
            Error::Refused(e) | Error::Query(e) | Error::NotSure(e) => e.detail.clone(),
            Error::AllAttemptsFailed { last_sql, .. } => Some(format!("last SQL: {last_sql}")),
            Error::NotAQuestion { said } => Some(format!("the model said: {said}")),
            _ => None,
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            Error::Setting { hint, .. } => Some(hint.clone()),
            Error::Refused(e) | Error::Query(e) | Error::NotSure(e) => e.hint.clone(),
            Error::AllAttemptsFailed { last, .. } => last.hint.clone(),
            Error::NotAQuestion { .. } => {
                Some("Ask about the data in the tables and views nl_schema() shows.".into())
            }
            Error::Llm { .. } => Some(
                "Check sql_query_engine.llm_url and that the endpoint is up; \
                 sql_query_engine.llm_timeout bounds the wait."
                    .into(),
            ),
            _ => None,
        }
    }

    /// The SQLSTATE this error is raised with. The abstention's is said by the abstention
    /// alone, and those that clients (the gateway among them) read as the extension's or the
    /// server's own signals are not said by code a query ran (another role's view may RAISE
    /// any): the model endpoint failing (58000), the extension not set up (55000), no
    /// connection left (53300), the connection refused (28xxx). Those are raised as XX000,
    /// the query's own in DETAIL.
    fn raised_sqlstate(&self) -> SqlState {
        let ran = match self {
            Error::Query(e) => e.ran,
            Error::AllAttemptsFailed { last, .. } => last.ran,
            _ => false,
        };
        match self.sqlstate() {
            SqlState::NOT_SURE if !matches!(self, Error::NotSure(_)) => SqlState::INTERNAL_ERROR,
            sqlstate if ran && said_by_clients_as_signals(&sqlstate) => SqlState::INTERNAL_ERROR,
            sqlstate => sqlstate,
        }
    }

    /// Raise this error as a PostgreSQL ERROR. Never returns. Its text may hold a model's or an
    /// endpoint's words (the last SQL, what the model said): psql prints an ERROR to the
    /// terminal as it is, and the server log keeps it, so nothing in it may steer a terminal
    /// or pass for a line psql writes.
    pub fn raise(self) -> ! {
        // Lines after the first indented: a model's text may hold a line break followed by
        // what psql would show as a HINT or an ERROR of its own.
        use crate::text::escaped_indented;
        let code = self.raised_sqlstate().code();
        let said = |text: &str| for_the_client(escaped_indented(text));
        let mut report = ErrorReport::new(code, said(&self.to_string()), "sql_query_engine");
        // pgrx raises only the SQLSTATEs it knows (XX000 for the others, such as a function's
        // own ERRCODE): the query's own is then named in DETAIL.
        let unsaid = Some(self.sqlstate())
            .filter(|s| SqlState::from_code(code) != *s)
            .map(|s| format!("SQLSTATE of the query's error: {s}"));
        let detail = match (self.detail(), unsaid) {
            (Some(detail), Some(unsaid)) => Some(format!("{detail}\n{unsaid}")),
            (detail, unsaid) => detail.or(unsaid),
        };
        if let Some(detail) = detail {
            report = report.set_detail(said(&detail));
        }
        if let Some(hint) = self.hint() {
            report = report.set_hint(said(&hint));
        }
        report.report(pgrx::PgLogLevel::ERROR);
        unreachable!("an ERROR report returns control to PostgreSQL")
    }
}

/// Whether clients read `sqlstate` as a signal of the extension's or the server's own (see
/// `Error::raise`).
fn said_by_clients_as_signals(sqlstate: &SqlState) -> bool {
    sqlstate.class() == "28" || ["58000", "55000", "53300"].contains(&sqlstate.as_str())
}

/// Sends a message below ERROR (a NOTICE to the caller, a WARNING, a line of the server log)
/// so that an ERROR raised while it is sent (a cancel taken at its check for interrupts, a
/// character the client's encoding lacks) comes back as a Rust error that unwinds through the
/// extension's frames, their guards included: pgrx sends it with PostgreSQL's `errfinish`,
/// whose ERROR would otherwise jump past them (a call's role and settings left behind for the
/// next call on the connection).
pub fn tell(level: pgrx::PgLogLevel, code: PgSqlErrorCode, message: String) {
    send(
        ErrorReport::new(code, for_the_client(message), "sql_query_engine"),
        level,
    );
}

/// `text` as the client can take it: to a client whose encoding is not the server's UTF-8,
/// every character past ASCII is written as `\u{..}`: one it lacks (in a model's SQL, a
/// message another role's code raised) would make the message itself an ERROR (22P05), which
/// ends the call, or takes the place of the ERROR that carried it, its SQLSTATE lost.
fn for_the_client(text: String) -> String {
    // SAFETY: reads the connection's client encoding, a plain value.
    let client = unsafe { pgrx::pg_sys::pg_get_client_encoding() };
    let converted = client != pgrx::pg_sys::pg_enc::PG_UTF8 as i32
        && client != pgrx::pg_sys::pg_enc::PG_SQL_ASCII as i32;
    if converted && !text.is_ascii() {
        text.chars()
            .map(|c| match c {
                c if c.is_ascii() => c.to_string(),
                c => format!("\\u{{{:x}}}", u32::from(c)),
            })
            .collect()
    } else {
        text
    }
}

/// `tell` a whole report (with its DETAIL, say): one for the server log alone.
pub fn send(report: ErrorReport, level: pgrx::PgLogLevel) {
    // SAFETY: the boundary turns PostgreSQL's longjmp out of the report into a Rust panic,
    // caught by pgrx at the call's edge; only the report's own frames are inside it.
    unsafe { pgrx::pg_sys::ffi::pg_guard_ffi_boundary(|| report.report(level)) }
}

/// `tell` a NOTICE.
pub fn notice(message: String) {
    tell(
        pgrx::PgLogLevel::NOTICE,
        PgSqlErrorCode::ERRCODE_SUCCESSFUL_COMPLETION,
        message,
    );
}

/// `tell` a WARNING.
pub fn warning(message: String) {
    tell(
        pgrx::PgLogLevel::WARNING,
        PgSqlErrorCode::ERRCODE_WARNING,
        message,
    );
}

/// `tell` a line of the server log (and the client's, with `client_min_messages = log`).
pub fn log(message: String) {
    tell(
        pgrx::PgLogLevel::LOG,
        PgSqlErrorCode::ERRCODE_SUCCESSFUL_COMPLETION,
        message,
    );
}

/// `tell` a DEBUG1 line.
pub fn debug(message: String) {
    tell(
        pgrx::PgLogLevel::DEBUG1,
        PgSqlErrorCode::ERRCODE_SUCCESSFUL_COMPLETION,
        message,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_round_trip() {
        for s in [
            "42703", "25006", "57014", "22023", "XX000", "42P01", "58000",
        ] {
            assert_eq!(SqlState::from_code(SqlState::parse(s).code()).as_str(), s);
        }
        assert_eq!(
            SqlState::UNDEFINED_COLUMN.code(),
            PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN
        );
        assert_eq!(SqlState::UNDEFINED_TABLE.class(), "42");
        assert_eq!(SqlState::parse("bad"), SqlState::INTERNAL_ERROR);
    }

    #[test]
    fn codes_clients_read_as_signals_are_never_raised_for_a_querys_own_error() {
        let ran = |code: &str| SqlError {
            ran: true,
            ..SqlError::new(SqlState::parse(code), "raised by a view")
        };
        let all_failed = |error: SqlError| Error::AllAttemptsFailed {
            attempts: 1,
            last: Box::new(error),
            last_sql: "SELECT 1".into(),
        };
        for code in ["58000", "55000", "53300", "28000", "28P01", "42P08"] {
            assert_eq!(
                all_failed(ran(code)).raised_sqlstate(),
                SqlState::INTERNAL_ERROR,
                "{code}"
            );
            assert_eq!(
                Error::Query(Box::new(ran(code))).raised_sqlstate(),
                SqlState::INTERNAL_ERROR,
                "{code}"
            );
        }
        // A query's other errors keep their SQLSTATE; the extension's own signals theirs.
        assert_eq!(
            all_failed(ran("42703")).raised_sqlstate(),
            SqlState::parse("42703")
        );
        let endpoint = Error::Llm {
            endpoint: "http://model".into(),
            cause: "HTTP 503".into(),
            fault: Fault::Endpoint,
        };
        assert_eq!(endpoint.raised_sqlstate(), SqlState::SYSTEM_ERROR);
        assert_eq!(
            Error::sql("55000", "the row type changed", None).raised_sqlstate(),
            SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE
        );
        assert_eq!(
            Error::NotSure(Box::new(SqlError::new(SqlState::NOT_SURE, "not sure")))
                .raised_sqlstate(),
            SqlState::NOT_SURE
        );
    }

    #[test]
    fn all_failed_names_attempts_and_keeps_last_sql_in_detail() {
        let e = Error::AllAttemptsFailed {
            attempts: 5,
            last: Box::new(SqlError::new(
                SqlState::UNDEFINED_TABLE,
                "relation \"x\" does not exist",
            )),
            last_sql: "SELECT * FROM x".into(),
        };
        assert_eq!(e.sqlstate(), SqlState::UNDEFINED_TABLE);
        assert!(e.to_string().contains("all 5 attempts failed"));
        assert_eq!(e.detail().as_deref(), Some("last SQL: SELECT * FROM x"));
    }
}
