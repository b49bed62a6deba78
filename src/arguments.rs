//! What callers pass, bounded before the extension copies or parses it. PostgreSQL hands a
//! function arguments of up to 1 GB, and a Rust copy of that much, or a JSON tree that costs
//! many times its text, may fail to allocate: a failed Rust allocation aborts the backend, and
//! PostgreSQL then restarts the server. Each argument is measured where PostgreSQL keeps it,
//! against what the function can use, and refused (22023) past it.

use pgrx::callconv::{Arg, ArgAbi};
use pgrx::prelude::*;

use crate::error::Error;
use crate::text;

/// Longest question, in characters: it goes into every request to the model, the session's
/// turns and the value look-up.
pub const MAX_QUESTION_CHARS: usize = 10_000;

/// Longest SQL given to be fixed, run, checked, vouched for or stored as an example.
pub const MAX_SQL_CHARS: usize = 100_000;

/// Longest name (a view, a cursor, a role to run as), in characters: PostgreSQL's names are at
/// most 63 bytes, qualified and quoted a few times that.
pub const MAX_NAME_CHARS: usize = 1_000;

/// `value` when it is at most `max` characters long, else why not (`what` names it).
pub fn no_longer_than(value: &str, what: &str, max: usize) -> crate::error::Result<()> {
    // Bytes first: a text of more than 4 bytes per allowed character is too long unread.
    if value.len() > max.saturating_mul(4) || value.chars().count() > max {
        return Err(Error::InvalidParameter(format!(
            "{what} is longer than {max} characters"
        )));
    }
    Ok(())
}

/// A question of at most `MAX_QUESTION_CHARS`.
pub fn question(value: &str) -> crate::error::Result<()> {
    no_longer_than(value, "the question", MAX_QUESTION_CHARS).map_err(|_| {
        Error::InvalidParameter(format!(
            "the question is longer than {MAX_QUESTION_CHARS} characters: ask it shorter"
        ))
    })
}

/// SQL of at most `MAX_SQL_CHARS`.
pub fn sql(value: &str) -> crate::error::Result<()> {
    no_longer_than(value, "the SQL", MAX_SQL_CHARS)
}

/// `question` for a question that becomes an example: nor any character that is not shown
/// (see `example_sql`).
pub fn example_question(value: &str) -> crate::error::Result<()> {
    question(value)?;
    shown_whole(value, "the question", "")
}

/// `sql` for SQL that becomes an example (shown whole to every role's model): nor any
/// character drawn as nothing or that reorders text, which a reviewer would not see.
pub fn example_sql(value: &str) -> crate::error::Result<()> {
    sql(value)?;
    shown_whole(
        value,
        "the SQL",
        " (in a literal, write it as an escape: U&'\\XXXX')",
    )
}

/// Refuses `value` (`what` names it, `hint` follows) when it holds a character that is not
/// shown (`text::hidden_char`): an example's text, shown whole to other roles' models.
fn shown_whole(value: &str, what: &str, hint: &str) -> crate::error::Result<()> {
    match crate::text::hidden_char(value) {
        Some(c) => Err(Error::InvalidParameter(format!(
            "{what} holds U+{:04X}, a character that is not shown; an example may hold none, \
             it is shown to other roles' models as written{hint}",
            u32::from(c)
        ))),
        None => Ok(()),
    }
}

/// A `jsonb` argument as PostgreSQL passed it, read only by `parse`: pgrx's own `JsonB` turns
/// the whole value into a tree before the function can look at its size.
pub struct JsonArgument(pg_sys::Datum);

impl JsonArgument {
    /// The argument as JSON, without its top-level keys `without` (dropped by PostgreSQL,
    /// never read here), when its text is at most `max_bytes` and holds at most `max_values`
    /// values; else why not (`what` names it).
    pub fn parse(
        &self,
        what: &str,
        without: &[&str],
        max_bytes: usize,
        max_values: usize,
    ) -> crate::error::Result<serde_json::Value> {
        let mut datum = self.0;
        let too = |why: String| Error::InvalidParameter(format!("{what}: {why}"));
        // Its stored size first, before anything reads it whole (a jsonb takes at most about
        // four times the bytes of its text: an array of small numbers), and again once the
        // keys left out are gone, before it is printed, at twice the bound: printed, a string
        // of control characters takes six times its stored bytes, in a loop deaf to cancel
        // (strings, what these arguments hold, take about their text's bytes).
        let stored = |datum: pg_sys::Datum| {
            // SAFETY: a varlena datum of this call; its size is read from its header, without
            // detoasting it.
            unsafe { pg_sys::toast_raw_datum_size(datum) }
        };
        if stored(datum) > max_bytes.saturating_mul(8) {
            return Err(too(format!("longer than {max_bytes} bytes of JSON")));
        }
        let kind = {
            // SAFETY: the argument's jsonb datum, of this call.
            unsafe { pgrx::direct_function_call::<String>(pg_sys::jsonb_typeof, &[Some(datum)]) }
        };
        if !without.is_empty() && kind.as_deref() != Some("object") {
            return Err(Error::InvalidParameter(format!(
                "{what}: not a JSON object"
            )));
        }
        for key in without {
            // SAFETY: `datum` is a jsonb datum of this call (the argument, or what jsonb_delete
            // made of it), and the key a text datum; both live in the call's memory context.
            datum = unsafe {
                pgrx::direct_function_call::<pg_sys::Datum>(
                    pg_sys::jsonb_delete,
                    &[Some(datum), key.into_datum()],
                )
            }
            .ok_or_else(|| Error::internal("jsonb_delete returned NULL"))?;
        }
        if stored(datum) > max_bytes.saturating_mul(2) {
            return Err(too(format!("longer than {max_bytes} bytes of JSON")));
        }
        // SAFETY: as above.
        unsafe { walk_before_printing(datum, max_bytes, max_values) }.map_err(too)?;
        // SAFETY: as above; jsonb_out gives a palloc'd C string of the call's memory context.
        let json = unsafe {
            pgrx::direct_function_call::<&core::ffi::CStr>(pg_sys::jsonb_out, &[Some(datum)])
        }
        .ok_or_else(|| Error::internal("jsonb_out returned NULL"))?;
        let bytes = json.to_bytes();
        if bytes.len() > max_bytes {
            return Err(too(format!("longer than {max_bytes} bytes of JSON")));
        }
        let shape = text::json_shape(bytes);
        if shape.values > max_values || shape.depth > text::MAX_JSON_DEPTH {
            return Err(too(format!(
                "more than {max_values} JSON values or deeper than {} levels",
                text::MAX_JSON_DEPTH
            )));
        }
        let json = std::str::from_utf8(bytes).map_err(|e| too(e.to_string()))?;
        serde_json::from_str(json).map_err(|e| too(e.to_string()))
    }
}

/// Walks the jsonb `datum` before it is printed whole: at most `max_values` values, and at most
/// `max_bytes` of text for its numbers. A number of a few stored bytes prints to as many as
/// 147,000 digits (`1e131071`), and `jsonb_out` prints every one, and keeps each, in a loop
/// deaf to cancel: 8,000 of them, 128 kB stored, grew the backend by gigabytes. Each number is
/// printed alone here, its text measured and freed, with a check for interrupts at each value.
///
/// # Safety
/// `datum` is a jsonb datum of the current call.
unsafe fn walk_before_printing(
    datum: pg_sys::Datum,
    max_bytes: usize,
    max_values: usize,
) -> Result<(), String> {
    use pg_sys::JsonbIteratorToken::*;
    // SAFETY: the caller's jsonb datum, detoasted into the call's memory context (a copy when
    // it was toasted); the iterator reads it and allocates there too.
    let mut iterator = unsafe {
        let jsonb = pg_sys::pg_detoast_datum(datum.cast_mut_ptr()).cast::<pg_sys::Jsonb>();
        pg_sys::JsonbIteratorInit(&raw mut (*jsonb).root)
    };
    // SAFETY: a plain C struct, which the iterator fills before it is read.
    let mut value: pg_sys::JsonbValue = unsafe { std::mem::zeroed() };
    let (mut values, mut number_bytes) = (0usize, 0usize);
    loop {
        // SAFETY: the iterator over the container above, and a value it writes into.
        let token = unsafe { pg_sys::JsonbIteratorNext(&mut iterator, &mut value, false) };
        pgrx::check_for_interrupts!();
        match token {
            WJB_DONE => return Ok(()),
            WJB_VALUE | WJB_ELEM | WJB_BEGIN_ARRAY | WJB_BEGIN_OBJECT => values += 1,
            _ => continue,
        }
        if values > max_values {
            return Err(format!("more than {max_values} JSON values"));
        }
        if !matches!(token, WJB_VALUE | WJB_ELEM) || value.type_ != pg_sys::jbvType::jbvNumeric {
            continue;
        }
        // SAFETY: the number the iterator just read (a numeric of the container), printed
        // into a palloc'd string that is freed once measured.
        number_bytes += unsafe {
            let number = pg_sys::Datum::from(value.val.numeric);
            let text =
                pgrx::direct_function_call::<pg_sys::Datum>(pg_sys::numeric_out, &[Some(number)])
                    .ok_or_else(|| "a number that does not print".to_string())?;
            let text = text.cast_mut_ptr::<std::ffi::c_char>();
            let length = std::ffi::CStr::from_ptr(text).to_bytes().len();
            pg_sys::pfree(text.cast());
            length
        };
        if number_bytes > max_bytes {
            return Err(format!("longer than {max_bytes} bytes of JSON"));
        }
    }
}

impl FromDatum for JsonArgument {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<JsonArgument> {
        (!is_null).then_some(JsonArgument(datum))
    }
}

// SAFETY: the datum is kept as PostgreSQL passed it (a jsonb of the function's declared
// argument type) and read only during the call.
unsafe impl<'fcx> ArgAbi<'fcx> for JsonArgument {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> JsonArgument {
        // SAFETY: the caller (pgrx's wrapper) passes this argument's own datum and type.
        unsafe { arg.unbox_arg_using_from_datum() }
            .unwrap_or_else(|| Error::internal("a strict jsonb argument was NULL").raise())
    }
}

impl_sql_translatable!(JsonArgument, arg_only = "jsonb");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_measured_in_characters_and_refused_past_the_bound() {
        assert!(no_longer_than("ééé", "x", 3).is_ok());
        assert!(no_longer_than("éééé", "x", 3).is_err());
        assert!(no_longer_than(&"a".repeat(13), "x", 3).is_err());
        let long = "q".repeat(MAX_QUESTION_CHARS + 1);
        let refused = question(&long).unwrap_err().to_string();
        assert!(refused.contains("ask it shorter"), "{refused}");
        assert!(sql(&"s".repeat(MAX_SQL_CHARS)).is_ok());
    }
}
