//! Taking the SQL out of whatever a model wrote.
//!
//! Models answer in many shapes: JSON (as asked), JSON inside prose, fenced code blocks, a
//! statement in the middle of an explanation, or bare SQL; reasoning models add `<think>` blocks.
//! The strategies below are tried from the most to the least explicit. Newlines and comments in
//! the SQL are kept: they matter for error positions and for the model's next repair.
//!
//! Every strategy is linear in the length of the answer (or bounded: at most
//! `MAX_JSON_CANDIDATES` embedded objects are tried), so that no answer, however hostile, keeps
//! the backend busy: the response itself is capped by `sql_query_engine.max_response_bytes`.

/// Embedded JSON objects tried at most.
const MAX_JSON_CANDIDATES: usize = 64;

/// Longest language tag after a fence (` ```postgresql `), in bytes.
const MAX_TAG: usize = 32;

/// Longest start of a common table expression (`name (columns) AS NOT MATERIALIZED (`) looked
/// at after a WITH in prose, in bytes: each WITH is looked at, so an unbounded look would make
/// an answer of many WITHs cost the square of its length.
const MAX_CTE_HEAD: usize = 4096;

/// The SQL in `output`, or `None` when there is nothing that could be a statement.
pub fn extract_sql(output: &str) -> Option<String> {
    let text = strip_think(output);
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    // JSON is parsed into a tree only when the answer holds few values
    // (`text::MAX_JSON_VALUES`): one of a million tiny values would cost a hundred times its
    // size.
    let small = crate::text::parsable(&crate::text::json_shape(text.as_bytes()));
    if let Some(value) = small
        .then(|| serde_json::from_str::<serde_json::Value>(text).ok())
        .flatten()
    {
        // The whole answer is JSON: the statement is its `sql` member or there is none.
        return sql_member(&value)
            .map(|sql| clean(&sql))
            .filter(|s| !s.is_empty());
    }
    // Prose with no statement in it is no SQL: the repair then says so, and twice in a row
    // it ends the run (the question is not one for the database).
    let found = embedded_json(text)
        .or_else(|| fenced_block(text))
        .or_else(|| starts_with_command(text).then(|| text.to_string()))
        .or_else(|| statement_in_prose(text))?;
    let sql = clean(&found);
    (!sql.is_empty()).then_some(sql)
}

/// Removes `<think>…</think>` blocks. A closing tag without an opening one (some chat templates
/// put the opening tag in the prompt) drops everything before it; an opening tag that is never
/// closed (the model ran out of tokens while thinking) keeps what came before it, or, when
/// nothing did, the thoughts themselves, where the other strategies may still find a statement.
pub fn strip_think(text: &str) -> String {
    const OPEN: &str = "<think>";
    const CLOSE: &str = "</think>";
    // ASCII lower-casing keeps byte offsets, so positions in `lower` are positions in `text`.
    let lower = text.to_ascii_lowercase();
    let mut at = 0;
    if let Some(close) = lower.find(CLOSE) {
        if !lower[..close].contains(OPEN) {
            at = close + CLOSE.len();
        }
    }
    let mut out = String::with_capacity(text.len() - at);
    loop {
        match lower[at..].find(OPEN) {
            None => {
                out.push_str(&text[at..]);
                break;
            }
            Some(offset) => {
                let open = at + offset;
                out.push_str(&text[at..open]);
                let inside = open + OPEN.len();
                match lower[inside..].find(CLOSE) {
                    Some(close) => at = inside + close + CLOSE.len(),
                    None => {
                        if out.trim().is_empty() {
                            out = text[inside..].to_string();
                        }
                        break;
                    }
                }
            }
        }
    }
    out
}

/// The `sql` (or `query`) member of a JSON object.
fn sql_member(value: &serde_json::Value) -> Option<String> {
    let object = value.as_object()?;
    ["sql", "query", "SQL", "Query"]
        .iter()
        .find_map(|key| object.get(*key)?.as_str().map(str::to_string))
        .filter(|s| !s.trim().is_empty())
}

/// A JSON object with a `sql` (or `query`) member somewhere in prose. Objects are tried where
/// a `{` opens one (a quote follows it), each parsed by a streaming parser that stops at its
/// end, so braces inside the SQL (`'{a,b}'::text[]`, JSON literals) do not cut it short.
fn embedded_json(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let candidates = bytes
        .iter()
        .enumerate()
        .filter(|(i, b)| {
            **b == b'{'
                && bytes[i + 1..]
                    .iter()
                    .find(|c| !c.is_ascii_whitespace())
                    .is_some_and(|c| *c == b'"')
        })
        .map(|(i, _)| i)
        .take(MAX_JSON_CANDIDATES);
    for open in candidates {
        // Counted from where the object starts (a quote before it would hide its values from
        // a count of the whole answer) to where it ends (each candidate's count is not the
        // rest of the answer's).
        if !crate::text::parsable(&crate::text::first_value_shape(&bytes[open..])) {
            continue;
        }
        let mut values =
            serde_json::Deserializer::from_str(&text[open..]).into_iter::<serde_json::Value>();
        if let Some(Ok(value)) = values.next() {
            if let Some(sql) = sql_member(&value) {
                return Some(sql);
            }
        }
    }
    None
}

/// The first fenced code block that holds a query: blocks tagged `sql` (or `postgresql`, `psql`,
/// `pgsql`) first, then untagged blocks that start like a query, then any untagged block.
fn fenced_block(text: &str) -> Option<String> {
    let blocks = fenced_blocks(text);
    let sql_tag = |tag: &str| matches!(tag, "sql" | "postgresql" | "postgres" | "psql" | "pgsql");
    blocks
        .iter()
        .find(|(tag, _)| sql_tag(tag))
        .or_else(|| {
            blocks
                .iter()
                .find(|(tag, body)| tag.is_empty() && starts_like_query(body))
        })
        .or_else(|| blocks.iter().find(|(tag, _)| tag.is_empty()))
        .map(|(_, body)| body.clone())
}

/// (language tag in lower case, body) of every fenced block; an unclosed last fence runs to the
/// end of the text (models that hit their token limit).
fn fenced_blocks(text: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("```") {
        let after = &rest[open + 3..];
        // A tag is a short word: its line's end is looked for no further than `MAX_TAG` bytes,
        // so that many fences on one long line cost no more than the line.
        let window = &after.as_bytes()[..after.len().min(MAX_TAG + 1)];
        let tag_end = match window.iter().position(|b| *b == b'\n') {
            Some(nl) => Some((nl, nl + 1)),
            None => (after.len() <= MAX_TAG).then_some((after.len(), after.len())),
        };
        // A fence followed by code on the same line (```SELECT 1```) has no tag.
        let (tag, body_start) = match tag_end {
            Some((end, body_start))
                if after[..end]
                    .trim()
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-') =>
            {
                (after[..end].trim().to_ascii_lowercase(), body_start)
            }
            _ => (String::new(), 0),
        };
        let body = &after[body_start..];
        match body.find("```") {
            Some(close) => {
                blocks.push((tag, body[..close].to_string()));
                rest = &body[close + 3..];
            }
            None => {
                blocks.push((tag, body.to_string()));
                break;
            }
        }
    }
    blocks
}

fn starts_like_query(text: &str) -> bool {
    let head = skip_comments(text);
    head.starts_with('(')
        || ["select", "with", "values", "table"]
            .iter()
            .any(|kw| starts_with_word(head, kw))
}

/// SQL command keywords: a text that begins with one is SQL as a whole, so a write is seen (and
/// refused) as the write it is, not mined for a SELECT inside it.
const COMMANDS: &[&str] = &[
    "select",
    "with",
    "values",
    "table",
    "insert",
    "update",
    "delete",
    "merge",
    "create",
    "drop",
    "alter",
    "truncate",
    "grant",
    "revoke",
    "copy",
    "do",
    "call",
    "set",
    "reset",
    "begin",
    "start",
    "commit",
    "rollback",
    "abort",
    "end",
    "savepoint",
    "release",
    "lock",
    "listen",
    "notify",
    "unlisten",
    "vacuum",
    "analyze",
    "analyse",
    "explain",
    "prepare",
    "execute",
    "deallocate",
    "discard",
    "refresh",
    "reindex",
    "cluster",
    "comment",
    "security",
    "import",
    "checkpoint",
    "load",
    "fetch",
    "move",
    "close",
    "declare",
    "show",
    "reassign",
];

fn starts_with_command(text: &str) -> bool {
    let head = skip_comments(text);
    head.starts_with('(') || COMMANDS.iter().any(|kw| starts_with_word(head, kw))
}

fn starts_with_word(text: &str, word: &str) -> bool {
    text.len() >= word.len()
        && text.is_char_boundary(word.len())
        && text[..word.len()].eq_ignore_ascii_case(word)
        && !text[word.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_')
}

/// `text` after leading blank space and SQL comments.
fn skip_comments(mut text: &str) -> &str {
    loop {
        text = text.trim_start();
        if let Some(rest) = text.strip_prefix("--") {
            text = rest.find('\n').map_or("", |nl| &rest[nl + 1..]);
        } else if let Some(rest) = text.strip_prefix("/*") {
            text = rest.find("*/").map_or("", |end| &rest[end + 2..]);
        } else {
            return text;
        }
    }
}

/// A SELECT/WITH statement inside prose: from the keyword (at a word boundary, outside quotes)
/// to the first `;` outside quotes and comments, or to a blank line, or to the end.
fn statement_in_prose(text: &str) -> Option<String> {
    let lower = text.to_ascii_lowercase();
    let start = [
        ("select", None),
        ("with", Some(opens_cte as fn(&str) -> bool)),
    ]
    .iter()
    .filter_map(|(kw, follows)| keyword_position(&lower, kw, *follows))
    .min()?;
    let body = &text[start..];
    let end = statement_end(body);
    Some(body[..end].to_string())
}

/// Whether `rest` (lower case, after WITH) goes on like a common table expression:
/// `[RECURSIVE] name [(columns)] AS [[NOT] MATERIALIZED] (`. Rules out WITH as an English word
/// ("I can help with questions about your data").
fn opens_cte(rest: &str) -> bool {
    let mut end = rest.len().min(MAX_CTE_HEAD);
    while !rest.is_char_boundary(end) {
        end -= 1;
    }
    let mut rest = rest[..end].trim_start();
    if let Some(r) = rest.strip_prefix("recursive") {
        rest = r.trim_start();
    }
    let name_len = if let Some(quoted) = rest.strip_prefix('"') {
        match quoted.find('"') {
            Some(end) => end + 2,
            None => return false,
        }
    } else {
        rest.bytes()
            .take_while(|b| is_word_byte(*b) && *b != b'(')
            .count()
    };
    if name_len == 0 {
        return false;
    }
    rest = rest[name_len..].trim_start();
    if let Some(columns) = rest.strip_prefix('(') {
        match columns.find(')') {
            Some(end) => rest = columns[end + 1..].trim_start(),
            None => return false,
        }
    }
    let Some(after_as) = rest.strip_prefix("as") else {
        return false;
    };
    let mut rest = after_as.trim_start();
    for word in ["not", "materialized"] {
        if let Some(r) = rest.strip_prefix(word) {
            rest = r.trim_start();
        }
    }
    rest.starts_with('(')
}

/// Where `keyword` first starts a statement in `lower`: at a word boundary, followed by more
/// text, and by what `follows` requires (when given).
fn keyword_position(
    lower: &str,
    keyword: &str,
    follows: Option<fn(&str) -> bool>,
) -> Option<usize> {
    let bytes = lower.as_bytes();
    let mut from = 0;
    while let Some(offset) = lower[from..].find(keyword) {
        let at = from + offset;
        let before_ok = at == 0 || !is_word_byte(bytes[at - 1]);
        let after = at + keyword.len();
        let after_ok =
            after >= bytes.len() || bytes[after].is_ascii_whitespace() || bytes[after] == b'(';
        // Only a statement if something follows on the same logical line (rules out "select" as
        // an English verb at the end of a sentence well enough, with the other strategies first).
        if before_ok
            && after_ok
            && after < bytes.len()
            && follows.is_none_or(|f| f(&lower[after..]))
        {
            return Some(at);
        }
        from = at + keyword.len();
    }
    None
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80
}

/// Byte offset where the statement at the start of `sql` ends: the first `;` outside quotes and
/// comments, a blank line, or the end.
fn statement_end(sql: &str) -> usize {
    let bytes = sql.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\'' | b'"' => {
                let quote = bytes[i];
                i += 1;
                while i < bytes.len() && bytes[i] != quote {
                    i += 1;
                }
            }
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i = sql[i..].find("*/").map_or(bytes.len(), |e| i + e + 2);
                continue;
            }
            b';' => return i,
            b'\n' => {
                let rest = &sql[i + 1..];
                let line_end = rest.find('\n').unwrap_or(rest.len());
                if rest[..line_end].trim().is_empty() {
                    return i;
                }
            }
            _ => {}
        }
        i += 1;
    }
    bytes.len()
}

/// Final tidying: a fence left inside a JSON value, surrounding blank space, trailing `;`, and
/// a NUL (JSON's `\u0000`, which no PostgreSQL text holds: the SQL goes into the trace and
/// the history) replaced. Also what SQL a caller gives becomes (`nl_fix`'s, perhaps pasted in
/// a fence).
pub fn clean(sql: &str) -> String {
    let s = sql.trim();
    if s.starts_with("```") {
        if let Some((_, body)) = fenced_blocks(s).into_iter().next() {
            return clean(&body);
        }
    }
    crate::text::without_nul(as_written(s))
}

/// SQL a caller gave or a verified example stores, as it was checked: surrounding blank space
/// and trailing `;` removed, nothing taken out of it (a `{"sql": ...}` in a comment of a stored
/// example is not what runs).
pub fn as_written(sql: &str) -> String {
    let mut s = sql.trim();
    loop {
        let trimmed = s.trim_end().trim_end_matches(';').trim_end();
        if trimmed.len() == s.len() {
            break;
        }
        s = trimmed;
    }
    s.to_string()
}

#[cfg(test)]
mod tests {
    use super::extract_sql;

    fn ex(s: &str) -> String {
        extract_sql(s).unwrap_or_else(|| panic!("nothing extracted from {s:?}"))
    }

    #[test]
    fn raw_sql_is_kept_with_newlines_and_comments() {
        let sql = "SELECT a, -- the key\n  b\nFROM t /* note */ WHERE a > 1";
        assert_eq!(ex(sql), sql);
        assert_eq!(ex("SELECT 1;\n"), "SELECT 1");
    }

    #[test]
    fn whole_json_sql_or_query_key() {
        assert_eq!(ex(r#"{"sql": "SELECT 1"}"#), "SELECT 1");
        assert_eq!(
            ex(r#"{"query": "SELECT name\nFROM t;"}"#),
            "SELECT name\nFROM t"
        );
        assert_eq!(
            ex(r#"{"reasoning": "count them", "sql": "SELECT count(*) FROM t"}"#),
            "SELECT count(*) FROM t"
        );
    }

    #[test]
    fn json_embedded_in_prose_with_braces_in_sql() {
        let out = r#"Sure! Here it is: {"sql": "SELECT '{a,b}'::text[] AS x, '{\"k\": 1}'::jsonb FROM t WHERE s = '}'"} Hope that helps {not json}."#;
        assert_eq!(
            ex(out),
            r#"SELECT '{a,b}'::text[] AS x, '{"k": 1}'::jsonb FROM t WHERE s = '}'"#
        );
    }

    #[test]
    fn embedded_json_skips_objects_without_sql() {
        let out = r#"Schema {"table": "t"} and answer {"sql": "SELECT 2"}"#;
        assert_eq!(ex(out), "SELECT 2");
    }

    #[test]
    fn fenced_blocks_tagged_bare_and_several() {
        assert_eq!(
            ex("Here:\n```sql\nSELECT 1\nFROM t;\n```\nDone."),
            "SELECT 1\nFROM t"
        );
        assert_eq!(ex("Here:\n```\nSELECT 2\n```"), "SELECT 2");
        assert_eq!(ex("```SELECT 3```"), "SELECT 3");
        let several = "First the table:\n```\nCREATE TABLE t(a int)\n```\nThen:\n```sql\nSELECT a FROM t\n```\nOr:\n```sql\nSELECT 1\n```";
        assert_eq!(ex(several), "SELECT a FROM t");
        let untagged = "```text\nsome output\n```\n```\nSELECT 4\n```";
        assert_eq!(ex(untagged), "SELECT 4");
    }

    #[test]
    fn unclosed_fence_runs_to_end() {
        assert_eq!(ex("```sql\nSELECT 5 FROM t"), "SELECT 5 FROM t");
    }

    #[test]
    fn think_blocks_removed() {
        assert_eq!(
            ex("<think>Maybe SELECT wrong FROM x? No.</think>\n```sql\nSELECT right FROM y\n```"),
            "SELECT right FROM y"
        );
        assert_eq!(ex("<THINK>hmm</THINK>{\"sql\": \"SELECT 1\"}"), "SELECT 1");
        // closing tag only: the opening one was in the chat template
        assert_eq!(
            ex("the user wants SELECT x\n</think>\nSELECT y FROM z"),
            "SELECT y FROM z"
        );
        // unclosed: the model ran out of tokens while thinking; its thoughts are all there is
        assert_eq!(
            ex("<think>I should write:\n```sql\nSELECT z FROM w\n```\nbut first"),
            "SELECT z FROM w"
        );
        // unclosed after an answer: the answer stands
        assert_eq!(ex("SELECT 7 <think> more"), "SELECT 7");
    }

    #[test]
    fn statement_in_prose_without_semicolon() {
        assert_eq!(
            ex("To answer this, run SELECT name FROM customers WHERE city = 'Rome; Italy'\n\nThis lists them."),
            "SELECT name FROM customers WHERE city = 'Rome; Italy'"
        );
        assert_eq!(
            ex("The query is:\nWITH t AS (SELECT 1 AS a)\nSELECT a FROM t; that's it"),
            "WITH t AS (SELECT 1 AS a)\nSELECT a FROM t"
        );
        assert_eq!(
            ex("Answer: select a -- not; a terminator\nfrom t;"),
            "select a -- not; a terminator\nfrom t"
        );
    }

    #[test]
    fn a_leading_comment_or_a_write_keeps_the_whole_text() {
        let commented = "-- customers in Rome\nSELECT name FROM customers";
        assert_eq!(ex(commented), commented);
        // a write must reach the guard as the write it is, not as the SELECT inside it
        let write = "DELETE FROM t WHERE id IN (SELECT id FROM u)";
        assert_eq!(ex(write), write);
        assert_eq!(ex("SELECT 1; DROP TABLE t;"), "SELECT 1; DROP TABLE t");
    }

    #[test]
    fn prose_words_are_not_statements() {
        // "selected" and "with" inside words are not keywords
        assert_eq!(ex("I selected rows withheld. SELECT 1"), "SELECT 1");
    }

    #[test]
    fn fenced_sql_inside_json_value() {
        assert_eq!(ex(r#"{"sql": "```sql\nSELECT 9\n```"}"#), "SELECT 9");
    }

    #[test]
    fn empty_output_yields_nothing() {
        assert_eq!(extract_sql(""), None);
        assert_eq!(extract_sql("  \n "), None);
        assert_eq!(extract_sql("<think>only thoughts</think>"), None);
        assert_eq!(extract_sql(r#"{"sql": ""}"#), None);
        assert_eq!(extract_sql(r#"{"answer": "I cannot"}"#), None);
        assert_eq!(extract_sql("Hello! Ask me anything about your data."), None);
        assert_eq!(extract_sql("I cannot answer that from these tables."), None);
        assert_eq!(
            extract_sql("I can only help with questions about your data."),
            None
        );
    }

    #[test]
    fn json_of_very_many_values_is_not_parsed_into_a_tree() {
        let padding = r#"{"":0},"#.repeat(crate::text::MAX_JSON_VALUES);
        // A quote before the object does not hide its values from the count.
        let answer = format!(r#"a" {{"x":[{padding}{{}}],"sql":"SELECT 1"}}"#);
        assert_ne!(extract_sql(&answer).as_deref(), Some("SELECT 1"));
        let small = r#"a" {"x":[{"":0}],"sql":"SELECT 1"}"#;
        assert_eq!(extract_sql(small).as_deref(), Some("SELECT 1"));
    }
}
