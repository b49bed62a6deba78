//! The statement policy, decided by PostgreSQL's own parser: exactly one statement, and it only
//! reads. Whatever is not a plain SELECT (or VALUES, or a set operation of those) is refused
//! before anything runs. Fail closed.

use std::ffi::{CStr, CString};

use pgrx::pg_sys;
use pgrx::PgList;

use crate::error::SqlError;

/// Why a statement may not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub error: SqlError,
    /// A write ends the run: it is reported, never repaired. A refused read is fed back to the
    /// model like any other error.
    pub ends_run: bool,
}

impl Refusal {
    fn write(command: &str) -> Self {
        Refusal {
            error: SqlError {
                sqlstate: "25006".into(),
                message: format!(
                    "refused to run a {command} statement: only a single read-only query may run"
                ),
                hint: Some("The model proposed a statement that writes or changes state; it was not executed.".into()),
                ..Default::default()
            },
            ends_run: true,
        }
    }

    fn read(sqlstate: &str, message: String) -> Self {
        Refusal {
            error: SqlError::new(sqlstate, message),
            ends_run: false,
        }
    }
}

/// Checks `sql` with the server's grammar. A syntax error is raised as the parser's own ERROR
/// (with its SQLSTATE and position), so call this where errors are caught.
pub fn check(sql: &str) -> Result<(), Refusal> {
    let Ok(text) = CString::new(sql) else {
        return Err(Refusal::read(
            "22021",
            "the query contains a NUL character".into(),
        ));
    };
    let statements = unsafe {
        PgList::<pg_sys::RawStmt>::from_pg(pg_sys::raw_parser(
            text.as_ptr(),
            pg_sys::RawParseMode::RAW_PARSE_DEFAULT,
        ))
    };
    if statements.is_empty() {
        return Err(Refusal::read(
            "42601",
            "the query is empty: it contains no statement".into(),
        ));
    }
    for raw in statements.iter_ptr() {
        let node = unsafe { (*raw).stmt };
        if !is_plain_select(node) {
            return Err(Refusal::write(&command_name(node)));
        }
    }
    if statements.len() > 1 {
        return Err(Refusal::read(
            "42601",
            format!("expected exactly one statement, found {}", statements.len()),
        ));
    }
    Ok(())
}

/// A SELECT, VALUES or set operation without `INTO`.
fn is_plain_select(node: *mut pg_sys::Node) -> bool {
    unsafe {
        !node.is_null()
            && (*node).type_ == pg_sys::NodeTag::T_SelectStmt
            && (*node.cast::<pg_sys::SelectStmt>()).intoClause.is_null()
    }
}

/// The statement's command tag, as psql would print it (`DELETE`, `CREATE TABLE`, ...).
fn command_name(node: *mut pg_sys::Node) -> String {
    unsafe {
        // The raw tree of SELECT ... INTO is tagged SELECT; it creates a table.
        if !node.is_null() && (*node).type_ == pg_sys::NodeTag::T_SelectStmt {
            return "SELECT INTO".into();
        }
        let tag = pg_sys::CreateCommandTag(node);
        let name = pg_sys::GetCommandTagName(tag);
        if name.is_null() {
            "non-SELECT".into()
        } else {
            CStr::from_ptr(name).to_string_lossy().into_owned()
        }
    }
}
