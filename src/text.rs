//! Text analysis shared by retrieval, the value index and the verified examples: how a question
//! and a name are split into words, stemmed and compared. Pure logic: tested without a backend.

/// Words that carry no meaning of their own in a question about data: articles, prepositions,
/// question words, requests ("show", "list"). Neither relation names nor stored values.
const FUNCTION_WORDS: &[&str] = &[
    "a", "an", "the", "of", "in", "on", "at", "to", "for", "by", "with", "and", "or", "is", "are",
    "was", "were", "be", "what", "which", "who", "whom", "whose", "how", "many", "much", "list",
    "show", "give", "find", "all", "each", "every", "that", "this", "those", "these", "their",
    "there", "from", "than", "more", "most", "less", "least", "do", "does", "did", "has", "have",
    "it", "its", "as", "per", "me", "please", "any", "top", "name", "names", "number",
];

/// Words that do not tell relations apart: every key has an `id`.
const NOT_RELATION_WORDS: &[&str] = &["id"];

/// Words that say what is asked, not which value: aggregates, negation, the benchmarks' "hint
/// refers to", and a few more function words. Never a stored value on their own.
const NOT_VALUE_WORDS: &[&str] = &[
    "been", "had", "not", "no", "yes", "between", "where", "when", "also", "both", "only", "hint",
    "refers", "refer", "mean", "means", "count", "total", "average", "sum", "order",
];

/// Whether `word` (lower case, stemmed) is left out when matching a question to relations.
fn ignored_for_relations(word: &str) -> bool {
    FUNCTION_WORDS.contains(&word) || NOT_RELATION_WORDS.contains(&word)
}

/// Whether `word` (any case) is never a stored value on its own.
pub fn never_a_value(word: &str) -> bool {
    let lower = word.to_lowercase();
    FUNCTION_WORDS.contains(&lower.as_str()) || NOT_VALUE_WORDS.contains(&lower.as_str())
}

/// Light stemming: enough to match plurals and common inflections.
pub fn stem(word: &str) -> String {
    let w = word.to_lowercase();
    let n = w.chars().count();
    if n <= 3 {
        return w;
    }
    for (suffix, replacement) in [
        ("ies", "y"),
        ("sses", "ss"),
        ("ses", "s"),
        ("xes", "x"),
        ("ing", ""),
        ("ed", ""),
    ] {
        if let Some(base) = w.strip_suffix(suffix) {
            if base.chars().count() >= 3 {
                return format!("{base}{replacement}");
            }
        }
    }
    if let Some(base) = w.strip_suffix('s') {
        if !base.ends_with('s') && !base.ends_with('u') {
            return base.to_string();
        }
    }
    w
}

/// `text` with every run of letters and digits separated by a blank, identifiers split at `_`
/// and camelCase.
fn spaced_words(text: &str) -> String {
    let mut spaced = String::with_capacity(text.len() + 8);
    let mut previous_lower = false;
    for c in text.chars() {
        if c.is_uppercase() && previous_lower {
            spaced.push(' ');
        }
        previous_lower = c.is_lowercase() || c.is_ascii_digit();
        spaced.push(if c.is_alphanumeric() { c } else { ' ' });
    }
    spaced
}

/// Words of a text (identifiers split at `_` and camelCase), stemmed, without stopwords.
pub fn words(text: &str) -> Vec<String> {
    spaced_words(text)
        .split_whitespace()
        .map(stem)
        .filter(|w| !ignored_for_relations(w))
        .collect()
}

/// Lower-case runs of letters and digits, identifiers split at `_` and camelCase: how a name is
/// compared with the question's words.
pub fn name_tokens(text: &str) -> Vec<String> {
    spaced_words(text)
        .split_whitespace()
        .map(str::to_lowercase)
        .collect()
}

/// The first `at_most` distinct items, in order, in one pass (a look-up per item, not a scan of
/// those kept: a text or a read of any length costs linear time).
pub fn first_distinct<S: AsRef<str>>(
    items: impl IntoIterator<Item = S>,
    at_most: usize,
) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let mut kept = Vec::new();
    for item in items {
        if kept.len() >= at_most {
            break;
        }
        let item = item.as_ref();
        if seen.insert(item.to_string()) {
            kept.push(item.to_string());
        }
    }
    kept
}

/// Whether a character can be shown as part of one line of text another role may have
/// written: no control character, none of the format characters that reorder, hide or smuggle
/// text (bidirectional marks and overrides, zero-width spaces and joiners, the soft hyphen,
/// interlinear annotations, tag characters: Unicode's Cf), none that is drawn as nothing
/// (Unicode's Default_Ignorable_Code_Point: variation selectors, which can carry a byte each,
/// Hangul fillers, the combining grapheme joiner), nor the line and paragraph separators.
pub fn printable_char(c: char) -> bool {
    !(c.is_control()
        || matches!(c,
            '\u{00AD}' | '\u{034F}' | '\u{0600}'..='\u{0605}' | '\u{061C}' | '\u{06DD}'
            | '\u{070F}' | '\u{0890}'..='\u{0891}' | '\u{08E2}' | '\u{115F}'..='\u{1160}'
            | '\u{17B4}'..='\u{17B5}' | '\u{180B}'..='\u{180F}' | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}' | '\u{2060}'..='\u{206F}' | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}' | '\u{FEFF}' | '\u{FFA0}' | '\u{FFF0}'..='\u{FFFB}'
            | '\u{110BD}' | '\u{110CD}' | '\u{13430}'..='\u{1343F}'
            | '\u{1BCA0}'..='\u{1BCA3}' | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0000}'..='\u{E0FFF}'))
}

/// The first character of `text` that `printable_char` refuses other than a line break or a
/// tab: text that is shown to other roles' models whole (an example's question and SQL), where
/// it would carry what its readers cannot see.
pub fn hidden_char(text: &str) -> Option<char> {
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        // A carriage return only as part of a line break: alone, a terminal writes over what
        // it showed.
        let shown = match c {
            '\n' | '\t' => true,
            '\r' => chars.peek() == Some(&'\n'),
            c => printable_char(c),
        };
        if !shown {
            return Some(c);
        }
    }
    None
}

/// `text` with every run of blank space (line breaks too) as one space, none at either end.
pub fn single_spaced(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `text` on one line: blank space of any kind (line breaks too) as one space, and characters
/// that are not `printable_char` left out. For text another role wrote (a comment, an error a
/// function raised, an example's question) shown inside a prompt's own lines.
pub fn one_line(text: &str) -> String {
    text.split_whitespace()
        .map(|word| {
            word.chars()
                .filter(|c| printable_char(*c))
                .collect::<String>()
        })
        .filter(|word| !word.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// `text` on one line with nothing left out: a backslash doubled, and every character that is
/// not `printable_char` (a line break, a terminal's escape) written as `\u{..}` (or `\n`,
/// `\r`, `\t`). For a log line's field whose text others wrote: it cannot start a line of its
/// own, nor hide or recolour one, and can be read back exactly.
pub fn escaped_line(text: &str) -> String {
    let mut line = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => line.push_str("\\\\"),
            '\n' => line.push_str("\\n"),
            '\r' => line.push_str("\\r"),
            '\t' => line.push_str("\\t"),
            c if printable_char(c) => line.push(c),
            c => line.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
        }
    }
    line
}

/// `text` as a quoted field of a log line: `escaped_line` in double quotes, a double quote
/// inside written `\"`, so that no name or session another role chose ends the field early
/// and writes the rest of the line (`x": ERROR 42501: ...`).
pub fn quoted_field(text: &str) -> String {
    format!("\"{}\"", escaped_line(text).replace('"', "\\\""))
}

/// `text` as a message may show it on several lines: line breaks and tabs kept, every other
/// character that is not `printable_char` (a terminal's escape, a bidirectional override)
/// written as `\u{..}`. For a NOTICE or WARNING that carries text a model or an endpoint wrote
/// (a query, an endpoint's words): psql writes notices to the terminal as they are.
pub fn escaped_lines(text: &str) -> String {
    let mut shown = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' | '\t' => shown.push(c),
            c if printable_char(c) => shown.push(c),
            c => shown.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
        }
    }
    shown
}

/// `escaped_lines` with every line after the first indented: none of them, where another role
/// or a model wrote it, can pass for a line of its own (psql's `HINT:`, another progress line).
pub fn escaped_indented(text: &str) -> String {
    escaped_lines(text).replace('\n', "\n  ")
}

/// Values a JSON text may hold to be parsed into a tree (`small_json`): what the tree
/// allocates scales with its values, not its bytes (`[{"":0},{"":0},...]` costs a hundred
/// times its size), and a model's answer or an endpoint's body is any text it likes.
pub const MAX_JSON_VALUES: usize = 10_000;

/// How deeply a JSON text nests, and how many values it holds at most (the first, one per
/// opening bracket and one per comma), read from its syntax outside strings without parsing.
pub struct JsonShape {
    pub depth: usize,
    pub values: usize,
    /// Objects (`{`), each a map of its own once parsed, and arrays (`[`), each a vector.
    pub objects: usize,
    pub arrays: usize,
}

pub fn json_shape(text: &[u8]) -> JsonShape {
    shape_of(text, false)
}

/// Levels of nesting a JSON text may have to be parsed into a tree (`small_json`): serde_json's
/// own limit (128) holds only while no crate of the build turns it off, and a parse past it
/// recurses on the backend's stack.
pub const MAX_JSON_DEPTH: usize = 64;

/// Whether a JSON text may be parsed into a tree: at most `MAX_JSON_VALUES` values and
/// `MAX_JSON_DEPTH` levels (read from its syntax, `json_shape`).
pub fn parsable(shape: &JsonShape) -> bool {
    shape.values <= MAX_JSON_VALUES && shape.depth <= MAX_JSON_DEPTH
}

/// `json_shape` of the first value of `text` only (an object found inside a longer text): the
/// count stops where it ends.
pub fn first_value_shape(text: &[u8]) -> JsonShape {
    shape_of(text, true)
}

fn shape_of(text: &[u8], first_only: bool) -> JsonShape {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    let (mut values, mut objects, mut arrays) = (1usize, 0usize, 0usize);
    for &byte in text {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
                values += 1;
                objects += usize::from(byte == b'{');
                arrays += usize::from(byte == b'[');
            }
            b']' | b'}' => {
                depth = depth.saturating_sub(1);
                if first_only && depth == 0 {
                    break;
                }
            }
            b',' => values += 1,
            _ => {}
        }
    }
    JsonShape {
        depth: deepest,
        values,
        objects,
        arrays,
    }
}

/// `text` parsed as JSON, when it is JSON that may be parsed into a tree (`parsable`).
pub fn small_json(text: &str) -> Option<serde_json::Value> {
    if !parsable(&json_shape(text.as_bytes())) {
        return None;
    }
    serde_json::from_str(text).ok()
}

/// `text` with every NUL replaced (by U+FFFD): text from outside (a model's answer, an
/// endpoint's error) that PostgreSQL can store, as text or jsonb, and raise.
pub fn without_nul(text: String) -> String {
    if text.contains('\0') {
        text.replace('\0', "\u{FFFD}")
    } else {
        text
    }
}

/// `text`, or its first `chars` characters and " ..." when it is longer.
pub fn at_most(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((end, _)) => format!("{} ...", &text[..end]),
        None => text.to_string(),
    }
}

/// `text`, or, when it has more than `chars` characters, its first and last `chars / 2` with
/// how many were left out between them: what ran may be padded at its start (a comment, blank
/// space) to push what matters past a cut of its head.
pub fn head_and_tail(text: &str, chars: usize) -> String {
    let count = text.chars().count();
    if count <= chars {
        return text.to_string();
    }
    let half = chars / 2;
    let head: String = text.chars().take(half).collect();
    let tail: String = text.chars().skip(count - half).collect();
    format!("{head} ... ({} characters) ... {tail}", count - 2 * half)
}

/// `text` whole when it has at most `bytes` bytes, else cut at its last line break within them
/// (or, for one long line, at a character boundary), with `note` on a line of its own.
pub fn within_bytes(mut text: String, bytes: usize, note: &str) -> String {
    if text.len() <= bytes {
        return text;
    }
    let mut end = bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    if let Some(line) = text[..end].rfind('\n') {
        end = line + 1;
    }
    text.truncate(end);
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(note);
    text.push('\n');
    text
}

/// Normalized form for exact matching: lower case, blank space collapsed, surrounding
/// punctuation dropped.
pub fn normalize(text: &str) -> String {
    single_spaced(text)
        .trim_matches(|c: char| !c.is_alphanumeric())
        .to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_is_cut_at_a_line_break_within_its_bytes() {
        assert_eq!(within_bytes("a\nbb\n".into(), 10, "(cut)"), "a\nbb\n");
        assert_eq!(
            within_bytes("a\nbb\ncc\n".into(), 6, "(cut)"),
            "a\nbb\n(cut)\n"
        );
        assert_eq!(within_bytes("ééé".into(), 3, "(cut)"), "é\n(cut)\n");
    }

    #[test]
    fn messages_keep_their_lines_but_no_terminal_escape() {
        let shown = escaped_lines("SELECT 1 -- \u{1b}]52;c;eA==\u{7}\n\u{202e}done\tok");
        assert_eq!(
            shown,
            "SELECT 1 -- \\u{1b}]52;c;eA==\\u{7}\n\\u{202e}done\tok"
        );
    }

    /// The examples' audit trigger (sql/examples.sql) writes out the same characters.
    #[test]
    fn the_examples_audit_trigger_writes_out_what_printable_char_refuses() {
        let sql = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/sql/examples.sql"))
            .unwrap();
        let class = sql
            .split("regexp_matches(fields[i],")
            .nth(1)
            .and_then(|rest| rest.split("'([").nth(1))
            .and_then(|rest| rest.split("])'").next())
            .unwrap();
        // \uXXXX and \UXXXXXXXX, alone or as the ends of a range.
        let mut ranges: Vec<(u32, u32)> = Vec::new();
        let mut rest = class;
        while !rest.is_empty() {
            let code = |text: &str| -> (u32, usize) {
                let width = if text.starts_with("\\U") { 8 } else { 4 };
                (
                    u32::from_str_radix(&text[2..2 + width], 16).unwrap(),
                    2 + width,
                )
            };
            let (start, used) = code(rest);
            rest = &rest[used..];
            let end = match rest.strip_prefix('-') {
                Some(after) => {
                    let (end, used) = code(after);
                    rest = &after[used..];
                    end
                }
                None => start,
            };
            ranges.push((start, end));
        }
        for c in (1..=0x10FFFF).filter_map(char::from_u32) {
            let written_out = ranges.iter().any(|&(a, b)| (a..=b).contains(&u32::from(c)));
            assert_eq!(written_out, !printable_char(c), "U+{:04X}", u32::from(c));
        }
    }

    #[test]
    fn a_quoted_field_cannot_be_ended_by_what_it_quotes() {
        assert_eq!(
            quoted_field("x\": ERROR 42501: denied"),
            "\"x\\\": ERROR 42501: denied\""
        );
        assert_eq!(quoted_field("alice"), "\"alice\"");
    }

    #[test]
    fn escaped_line_keeps_one_line_and_every_character() {
        assert_eq!(
            escaped_line("a\nran 2: x\r\t\\n \u{1b}[2K \u{202e}é"),
            "a\\nran 2: x\\r\\t\\\\n \\u{1b}[2K \\u{202e}é"
        );
        assert_eq!(escaped_line("SELECT 'ok'"), "SELECT 'ok'");
    }

    #[test]
    fn characters_drawn_as_nothing_are_left_out_of_a_line() {
        // A byte per variation selector, after a comment that reads as two words.
        let smuggled = "Status code\u{FE01}\u{E0100}\u{E01EF}\u{034F}\u{3164}\u{FFA0}\u{180F}";
        assert_eq!(one_line(smuggled), "Status code");
        assert_eq!(
            escaped_line("a\u{FE0F}b"),
            "a\\u{fe0f}b",
            "shown, written out"
        );
        assert!(printable_char('é') && printable_char('漢') && printable_char('\u{1F600}'));
    }

    #[test]
    fn json_shape_counts_nesting_and_values_outside_strings() {
        let depth = |text: &[u8]| json_shape(text).depth;
        assert_eq!(depth(b"1"), 0);
        assert_eq!(depth(br#"{"a": [1, {"b": "[[[{"}]]}"#), 3);
        assert_eq!(depth(br#"["\"[", []]"#), 2);
        assert_eq!(json_shape(br#"{"a": [1, 2, ",,,"], "b": {}}"#).values, 7);
        let wide = format!("[{}0]", "{\"\":0},".repeat(MAX_JSON_VALUES));
        assert!(small_json(&wide).is_none());
        assert!(small_json("[1, 2]").is_some());
        let deep = format!(
            "{}{}",
            "[".repeat(MAX_JSON_DEPTH + 1),
            "]".repeat(MAX_JSON_DEPTH + 1)
        );
        assert!(small_json(&deep).is_none());
        // The first value's count ends where it does.
        let first = first_value_shape(br#"{"sql": "SELECT 1"} and then [1, 2, 3]"#);
        assert_eq!((first.values, first.depth), (2, 1));
    }

    #[test]
    fn at_most_cuts_at_a_character() {
        assert_eq!(at_most("abc", 3), "abc");
        assert_eq!(at_most("ééé", 2), "éé ...");
    }

    #[test]
    fn stemming_and_splitting() {
        assert_eq!(stem("countries"), "country");
        assert_eq!(stem("orders"), "order");
        assert_eq!(stem("status"), "status");
        assert_eq!(stem("classes"), "class");
        assert_eq!(
            words("orderItems customer_id"),
            vec!["order", "item", "customer"]
        );
        assert_eq!(name_tokens("OrderItems_2"), vec!["order", "items", "2"]);
    }

    #[test]
    fn normalizing_ignores_case_space_and_punctuation() {
        assert_eq!(normalize("  Death   Touch. "), "death touch");
        assert_eq!(normalize("'O'Brien'"), "o'brien");
    }

    #[test]
    fn the_word_lists_serve_their_purpose() {
        assert!(never_a_value("The") && never_a_value("count") && !never_a_value("Touch"));
        assert!(ignored_for_relations("id") && !never_a_value("id"));
    }

    #[test]
    fn a_long_text_keeps_its_head_and_its_tail() {
        assert_eq!(head_and_tail("short", 10), "short");
        let padded = format!("/*{}*/ DELETE", " ".repeat(5000));
        let shown = head_and_tail(&padded, 20);
        assert!(shown.starts_with("/*        "), "{shown}");
        assert!(shown.ends_with("*/ DELETE"), "{shown}");
        assert!(shown.contains("(4991 characters)"), "{shown}");
    }
}
