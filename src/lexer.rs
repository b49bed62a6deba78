//! PostgreSQL's own lexer, to tell whether a verified example made a template changed only in
//! its parameters when it took new values. `literals` finds a template's literals without the
//! lexer and reads strings as it does in the common cases only: a string continued on the next
//! line (`E'x'` then `'\' ...'` on the next, still an escape string), or any string under
//! `standard_conforming_strings = off`, reads otherwise. An instantiation is used only when the
//! lexer reads the same tokens in the example and in it, but for constants that now read as
//! one of the new values.

use std::cell::Cell;
use std::ffi::{CStr, CString};

use pgrx::pg_sys;
use pgrx::PgMemoryContexts;

use crate::literals::LiteralKind;

/// The core grammar's numbers of the tokens the lexer returns with a value: `gram.y` declares
/// them first, in this order, in every supported release (PL/pgSQL's grammar relies on the
/// same numbers). `numbers_hold` checks them before any comparison is trusted.
const IDENT: i32 = 258;
const FCONST: i32 = 260;
const SCONST: i32 = 261;
const OP: i32 = 265;
const ICONST: i32 = 266;
const PARAM: i32 = 267;

/// A token as the lexer returns it: its grammar number and, for names, strings, numbers,
/// operators and parameters, its value (a string's as the lexer decoded it).
#[derive(Debug, PartialEq, Eq)]
struct Token {
    code: i32,
    value: Option<String>,
}

impl Token {
    fn constant(&self) -> Option<LiteralKind> {
        match self.code {
            SCONST => Some(LiteralKind::Text),
            ICONST | FCONST => Some(LiteralKind::Number),
            _ => None,
        }
    }
}

/// Whether `after` is `before` with some constants replaced by `values`: the lexer reads the
/// same tokens in both, under the session's settings, except constants of the same kind whose
/// new value is one of `values` (a number equal as a number). False when either does not
/// lex (an unterminated string) or the token numbers are not the ones expected.
pub fn only_values_differ(before: &str, after: &str, values: &[(LiteralKind, &str)]) -> bool {
    if !numbers_hold() {
        return false;
    }
    let (Some(before), Some(after)) = (tokens(before), tokens(after)) else {
        return false;
    };
    let is_value = |kind: LiteralKind, value: &str| {
        values.iter().any(|&(k, v)| {
            k == kind
                && match kind {
                    LiteralKind::Text => v == value,
                    LiteralKind::Number => match (v.parse::<f64>(), value.parse::<f64>()) {
                        (Ok(a), Ok(b)) => a == b,
                        _ => false,
                    },
                }
        })
    };
    before.len() == after.len()
        && before.iter().zip(&after).all(|(old, new)| {
            old == new
                || matches!((old.constant(), new.constant()), (Some(a), Some(b)) if a == b
                    && new.value.as_deref().is_some_and(|v| is_value(b, v)))
        })
}

thread_local! {
    /// Whether the lexer returned the expected token numbers for a known query, once checked.
    static NUMBERS_HOLD: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Whether the token numbers above are this server's, checked once per backend on a query
/// with one token of each.
fn numbers_hold() -> bool {
    NUMBERS_HOLD.with(|held| {
        *held.get().get_or_insert_with(|| {
            let codes: Option<Vec<i32>> = tokens("a 'b' 1 1.5 $1 <->")
                .map(|found| found.into_iter().map(|t| t.code).collect());
            let held = codes.as_deref() == Some(&[IDENT, SCONST, ICONST, FCONST, PARAM, OP][..]);
            if !held {
                crate::error::warning(
                    "sql_query_engine: the SQL lexer's token numbers are not the expected ones; \
                     verified examples are not used as templates"
                        .to_string(),
                );
            }
            held
        })
    })
}

/// The tokens of `sql` as PostgreSQL's lexer reads them under the session's settings, or None
/// when it raises an error (an unterminated string, a bad escape, junk after a number) or
/// `sql` holds a NUL. A cancel or a resource error raised meanwhile ends the call.
fn tokens(sql: &str) -> Option<Vec<Token>> {
    let sql = CString::new(sql).ok()?;
    // The lexer's NOTICEs (an identifier cut to 63 bytes, printed whole) are about text the
    // caller did not write (another role's example, the model's SQL): not sent to it.
    let _quiet = crate::subxact::QuietClient::new();
    let lexed = crate::subxact::in_subtransaction(false, || {
        // The lexer's copies of the text and of every token's value are this context's,
        // deleted when it is dropped (also when the lexer raises an error).
        let mut memory = PgMemoryContexts::new("sql_query_engine lexer");
        // SAFETY: the context was just made by `new`, and the result holds Rust values only,
        // nothing allocated in it.
        unsafe { memory.switch_to(|_| lex(&sql)) }
    });
    lexed.ok()
}

/// Runs the lexer over `sql` to its end.
fn lex(sql: &CStr) -> Vec<Token> {
    let mut extra = pg_sys::core_yy_extra_type::default();
    // The scanner keeps this pointer: every later use of `extra` goes through it.
    let extra: *mut pg_sys::core_yy_extra_type = &mut extra;
    let mut found = Vec::new();
    // `scanner_init` copies `sql` into the current memory context and keeps a pointer to
    // `extra`, which outlives the scanner (ended by `scanner_finish` below, or, when the lexer
    // raises an error, by the deletion of the memory context that holds it). A value is read
    // from the union as the token's number says the lexer set it; a string value is
    // NUL-terminated, in the same context.
    // SAFETY: as above; `ScanKeywords` and `ScanKeywordTokens` are the core grammar's keyword
    // list and token numbers, as the raw parser passes them.
    unsafe {
        let scanner = pg_sys::scanner_init(
            sql.as_ptr(),
            extra,
            &raw const pg_sys::ScanKeywords,
            (&raw const pg_sys::ScanKeywordTokens).cast(),
        );
        // A backslash in a plain string under standard_conforming_strings = off would warn.
        (*extra).escape_string_warning = false;
        loop {
            let mut value = pg_sys::core_YYSTYPE::default();
            let mut location = 0;
            let code = pg_sys::core_yylex(&mut value, &mut location, scanner);
            if code == 0 {
                break;
            }
            let value = match code {
                IDENT..=OP if !value.str_.is_null() => {
                    Some(CStr::from_ptr(value.str_).to_string_lossy().into_owned())
                }
                ICONST | PARAM => Some(value.ival.to_string()),
                _ => None,
            };
            found.push(Token { code, value });
        }
        pg_sys::scanner_finish(scanner);
    }
    found
}
