//! Text the gateway shows its clients, from the database, another role or the model: written so
//! that no character of it steers the terminal or the page that shows it (a model's comment
//! that sets a terminal's clipboard with OSC 52, a carriage return that writes over what was
//! shown, a bidirectional override that shows text in another order than it is read).

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

/// Whether `c` makes text show elsewhere or in another order than it is read: Unicode's
/// bidirectional formatting characters (a value that shows as another, code that reads as
/// other code) and the line and paragraph separators, at which a log viewer or a page may
/// start a line of its own.
pub fn moves_text(c: char) -> bool {
    matches!(c, '\u{61C}' | '\u{200E}' | '\u{200F}' | '\u{2028}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Code (a model's SQL, comments and literals included) as a terminal shows it and a reader can
/// read it back: control characters other than a line break or a tab (`one_line`: each shown as
/// a space), and bidirectional overrides, are written as `\u{1b}`, so none moves the cursor,
/// rewrites what was shown or sets a terminal's clipboard.
pub fn legible(code: &str, one_line: bool) -> String {
    let mut out = String::with_capacity(code.len());
    for c in code.chars() {
        match c {
            '\n' | '\t' if one_line => out.push(' '),
            '\n' | '\t' => out.push(c),
            c if c.is_control() || moves_text(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// Outside text (a server's message, which a query's code may have written) as one line of the
/// gateway's own log: control characters written out, line breaks as spaces, at most 1,000
/// characters, so it cannot write a line of its own (`sqe-gateway: tokens reloaded`).
pub fn in_log(text: &str) -> String {
    let line = legible(text, true);
    match line.char_indices().nth(1000) {
        Some((at, _)) => format!("{}...", &line[..at]),
        None => line,
    }
}

/// `value` as JSON text whose strings hold no character `legible` writes out: DEL, the C1
/// controls and the bidirectional overrides are written as `\u` escapes (serde_json escapes
/// only those below U+0020), which JSON reads as the same characters. They can only be inside
/// strings, so the text is the same JSON.
pub fn json_text(value: &Value) -> String {
    json_escaped(&value.to_string())
}

/// `json_text` of JSON text (an answer's rows as the database wrote them).
pub fn json_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() || moves_text(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// A JSON response of `value`, as `json_text` writes it.
pub fn json_response(status: StatusCode, value: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        json_text(value),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_text_in_the_log_is_one_bounded_line() {
        let forged = "x\nsqe-gateway: tokens reloaded (3 tokens)\r\u{1b}[2K";
        let line = in_log(forged);
        assert!(!line.chars().any(char::is_control), "{line:?}");
        assert!(line.contains("tokens reloaded"));
        let line = in_log("x\u{2028}sqe-gateway: tokens reloaded\u{2029}");
        assert!(!line.contains(['\u{2028}', '\u{2029}']), "{line:?}");
        assert_eq!(in_log(&"é".repeat(5000)).chars().count(), 1003);
    }

    #[test]
    fn json_text_is_the_same_json_with_nothing_that_steers_a_terminal() {
        let value =
            serde_json::json!({"note": "a\u{1b}]52;c;x\u{7}b\u{7f}\u{9b}2J\u{202e}z", "n": 9.5});
        let text = json_text(&value);
        assert!(
            !text.chars().any(|c| c.is_control() || moves_text(c)),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), value);
    }
}
