//! Names of catalog objects as PostgreSQL spells them, looked up by OID: for messages, audit
//! lines and keys that must not depend on anyone's search path.

use std::ffi::{c_char, CStr};

use pgrx::pg_sys;

/// A string PostgreSQL made; empty for NULL.
///
/// # Safety
/// `text` must be NULL or point to a NUL-terminated string that lives while this runs.
pub unsafe fn c_string(text: *const c_char) -> String {
    if text.is_null() {
        String::new()
    } else {
        // SAFETY: the caller's contract.
        unsafe { CStr::from_ptr(text).to_string_lossy().into_owned() }
    }
}

/// The schema's name; `None` when it is gone.
pub fn namespace_name(namespace: pg_sys::Oid) -> Option<String> {
    // SAFETY: a catalog look-up; NULL for a schema that does not exist.
    let name = unsafe { pg_sys::get_namespace_name(namespace) };
    // SAFETY: NULL or a string palloc'd in the current context.
    (!name.is_null()).then(|| unsafe { c_string(name) })
}

/// The role's name; `None` when it is gone.
pub fn role_name(role: pg_sys::Oid) -> Option<String> {
    // SAFETY: a catalog look-up that returns NULL for a role that does not exist.
    let name = unsafe { pg_sys::GetUserNameFromId(role, true) };
    // SAFETY: NULL or a string palloc'd in the current context.
    (!name.is_null()).then(|| unsafe { c_string(name) })
}

/// The function's name; `None` when it is gone.
pub fn function_name(function: pg_sys::Oid) -> Option<String> {
    // SAFETY: a catalog look-up; NULL for a function that does not exist.
    let name = unsafe { pg_sys::get_func_name(function) };
    // SAFETY: NULL or a string palloc'd in the current context.
    (!name.is_null()).then(|| unsafe { c_string(name) })
}

/// `schema.relation`, as messages name a relation (empty parts for one that is gone).
pub fn relation_name(relation: pg_sys::Oid) -> String {
    // SAFETY: catalog look-ups; NULL for a relation that does not exist.
    let (namespace, name) = unsafe {
        (
            pg_sys::get_rel_namespace(relation),
            c_string(pg_sys::get_rel_name(relation)),
        )
    };
    // Another role chose the names: one that would break the message's line is not shown.
    let shown = |part: String| match printable(&part) {
        true => part,
        false => "(a name that does not print)".to_string(),
    };
    format!(
        "{}.{}",
        shown(namespace_name(namespace).unwrap_or_default()),
        shown(name)
    )
}

/// Whether a name can be shown as part of one line: a quoted identifier may hold a newline,
/// and one in a name another role chose would end the text around it where that role wants
/// (a fake end of a table, a fake instruction after it).
/// Invisible characters count too: line and paragraph separators, and the format characters
/// that reorder or hide text (`text::printable_char`).
pub fn printable(name: &str) -> bool {
    name.chars().all(crate::text::printable_char)
}

/// `name` as SQL writes it: quoted when it needs quotes (`"Order Items"`), as is otherwise.
pub fn quoted(name: &str) -> String {
    let Ok(text) = std::ffi::CString::new(name) else {
        return String::new();
    };
    // SAFETY: `text` lives while this runs; the result is `text` itself or a palloc'd copy.
    unsafe { c_string(pg_sys::quote_identifier(text.as_ptr())) }
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn names_that_would_break_or_hide_a_line_do_not_print() {
        assert!(printable("order_items") && printable("Straße") && printable("注文"));
        for hostile in [
            "a\nb",
            "a\rb",
            "a\u{2028}b",
            "a\u{202E}b",
            "a\u{200B}b",
            "a\u{FEFF}b",
        ] {
            assert!(!printable(hostile), "{hostile:?}");
        }
    }
}
