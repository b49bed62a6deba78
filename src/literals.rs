//! The literals of a query, read without a parser: for verified examples turned templates
//! (which literal the question names) and for the value check of an answer (which string a
//! column is compared with). PostgreSQL's lexer is not reachable without parse analysis, and
//! the two readers only need where strings and numbers are, outside comments and quoted
//! identifiers. Pure: tested without a backend.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiteralKind {
    Text,
    Number,
}

/// A literal of a query: where it is, what kind, and what it says (a string unquoted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Literal {
    pub start: usize,
    pub end: usize,
    pub kind: LiteralKind,
    pub value: String,
}

/// The string and number literals of `sql`, outside comments and quoted identifiers. A
/// string with an escape prefix (`E'...'`) or a dollar-quoted string is not a parameter.
pub fn literals(sql: &str) -> Vec<Literal> {
    scan(sql).0
}

/// The text of every quoted part of `sql` as written: strings of any kind (prefixed,
/// dollar-quoted) and quoted identifiers, in order. Blank space inside them is part of what
/// the query means.
pub fn quoted(sql: &str) -> Vec<&str> {
    scan(sql)
        .1
        .into_iter()
        .filter_map(|(start, end)| sql.get(start..end))
        .collect()
}

/// `literals` and `quoted`, from one pass.
fn scan(sql: &str) -> (Vec<Literal>, Vec<(usize, usize)>) {
    let bytes = sql.as_bytes();
    let mut found = Vec::new();
    let mut spans = Vec::new();
    let mut i = 0;
    let word_char = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80;
    while i < bytes.len() {
        match bytes[i] {
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                // To the end of the line, which a carriage return ends too.
                while i < bytes.len() && bytes[i] != b'\n' && bytes[i] != b'\r' {
                    i += 1;
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                // Block comments nest, as PostgreSQL's lexer reads them.
                let mut depth = 1;
                i += 2;
                while i < bytes.len() && depth > 0 {
                    match (bytes[i], bytes.get(i + 1)) {
                        (b'/', Some(b'*')) => {
                            depth += 1;
                            i += 2;
                        }
                        (b'*', Some(b'/')) => {
                            depth -= 1;
                            i += 2;
                        }
                        _ => i += 1,
                    }
                }
            }
            b'"' => {
                let start = i;
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += 1;
                }
                i += 1;
                spans.push((start, i.min(bytes.len())));
            }
            b'$' => {
                // A dollar quote ($tag$ ... $tag$, the tag not starting with a digit) is
                // skipped whole; $1 is a parameter sign. (A `$` inside a word is the word's.)
                let tag_end = sql[i + 1..].find('$').map(|p| i + 1 + p);
                match tag_end {
                    Some(end)
                        if sql[i + 1..end].bytes().all(word_char)
                            && !bytes.get(i + 1).is_some_and(u8::is_ascii_digit) =>
                    {
                        let tag = &sql[i..=end];
                        let start = i;
                        i = sql[end + 1..]
                            .find(tag)
                            .map_or(bytes.len(), |p| end + 1 + p + tag.len());
                        spans.push((start, i));
                    }
                    _ => i += 1,
                }
            }
            b'\'' => {
                // A prefix makes it another kind of string: E'...', B'...', X'...', N'...',
                // U&'...'.
                let unicode = i >= 2 && bytes[i - 1] == b'&' && matches!(bytes[i - 2], b'u' | b'U');
                let prefixed = i > 0 && word_char(bytes[i - 1]) || unicode;
                // In an escape string a backslash escapes the next character, a quote too.
                let escapes = i > 0
                    && matches!(bytes[i - 1], b'e' | b'E')
                    && (i == 1 || !word_char(bytes[i - 2]));
                let start = i;
                let mut value = String::new();
                i += 1;
                let mut closed = false;
                while i < bytes.len() {
                    if escapes && bytes[i] == b'\\' {
                        i += 1;
                        let next = sql
                            .get(i..)
                            .and_then(|r| r.chars().next())
                            .map_or(1, char::len_utf8);
                        i += next;
                        continue;
                    }
                    if bytes[i] == b'\'' {
                        if bytes.get(i + 1) == Some(&b'\'') {
                            value.push('\'');
                            i += 2;
                            continue;
                        }
                        closed = true;
                        i += 1;
                        break;
                    }
                    let next = sql[i..].chars().next().map_or(1, char::len_utf8);
                    value.push_str(&sql[i..i + next]);
                    i += next;
                }
                spans.push((start, i.min(bytes.len())));
                if closed && !prefixed {
                    found.push(Literal {
                        start,
                        end: i,
                        kind: LiteralKind::Text,
                        value,
                    });
                }
            }
            b if b.is_ascii_digit() && (i == 0 || !word_char(bytes[i - 1])) => {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'.') {
                    i += 1;
                }
                if i == bytes.len() || !word_char(bytes[i]) {
                    found.push(Literal {
                        start,
                        end: i,
                        kind: LiteralKind::Number,
                        value: sql[start..i].to_string(),
                    });
                }
            }
            b if word_char(b) => {
                // An identifier or keyword: `$` may follow its first character.
                while i < bytes.len() && (word_char(bytes[i]) || bytes[i] == b'$') {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    (found, spans)
}

/// A string a query compares a column with: `column = 'x'`, `column <> 'x'`, `column [NOT]
/// [I]LIKE 'x'` without wildcards, `column [NOT] IN ('x', …)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compared {
    /// The column's name as written, unquoted (folded to lower case unless it was quoted).
    pub column: String,
    pub value: String,
    /// Whether case does not matter: `ILIKE`, or a query that folds case (`lower`, `upper`)
    /// anywhere.
    pub ignores_case: bool,
}

/// Literals of one query `compared` looks at, at most.
const MAX_LITERALS: usize = 256;

/// The strings `sql` compares a named column with. A comparison whose left side is not a
/// column name (`lower(name) = 'x'`), ranges (`<`, `>=`), patterns and regular expressions
/// are left out: what they match cannot be told from the stored values alone.
pub fn compared(sql: &str) -> Vec<Compared> {
    let found = literals(sql);
    let lower = sql.to_lowercase();
    let folds_case = ["lower(", "upper(", "lower (", "upper ("]
        .iter()
        .any(|f| lower.contains(f));
    let mut out = Vec::new();
    // Each literal looks back over those before it (a list): bounded, since a caller's own
    // SQL (`nl_fix`) may hold any number.
    for (k, literal) in found.iter().enumerate().take(MAX_LITERALS) {
        if literal.kind != LiteralKind::Text {
            continue;
        }
        let Some(comparison) = comparison_before(sql, literal.start, &found[..k]) else {
            continue;
        };
        if comparison.pattern && literal.value.contains(['%', '_']) {
            continue;
        }
        let Some(column) = trailing_column(comparison.operand) else {
            continue;
        };
        out.push(Compared {
            column,
            value: literal.value.clone(),
            ignores_case: comparison.ignores_case || folds_case,
        });
    }
    out
}

/// The comparison a string literal at `start` is the right side of.
struct Comparison<'a> {
    /// The text before the operator; its end is the left side.
    operand: &'a str,
    ignores_case: bool,
    /// `LIKE`/`ILIKE`: `%` and `_` are wildcards.
    pattern: bool,
}

fn comparison_before<'a>(
    sql: &'a str,
    start: usize,
    earlier: &[Literal],
) -> Option<Comparison<'a>> {
    let before = sql[..start].trim_end();
    let plain = |operand: &'a str| Comparison {
        operand,
        ignores_case: false,
        pattern: false,
    };
    if let Some(rest) = before
        .strip_suffix("<>")
        .or_else(|| before.strip_suffix("!="))
    {
        return Some(plain(rest));
    }
    if let Some(rest) = before.strip_suffix('=') {
        return (!rest.ends_with(['<', '>', '!', ':'])).then(|| plain(rest));
    }
    for (word, ignores_case) in [("ilike", true), ("like", false)] {
        if let Some(rest) = strip_word(before, word) {
            return Some(Comparison {
                operand: strip_word(rest, "not").unwrap_or(rest),
                ignores_case,
                pattern: true,
            });
        }
    }
    // A member of a list: `IN (` and only strings and commas up to this one.
    if !before.ends_with([',', '(']) {
        return None;
    }
    let open = before.rfind('(')?;
    let mut from = open + 1;
    for literal in earlier.iter().filter(|l| l.start > open) {
        if !sql[from..literal.start]
            .chars()
            .all(|c| c == ',' || c.is_whitespace())
        {
            return None;
        }
        from = literal.end;
    }
    if !sql[from..start]
        .chars()
        .all(|c| c == ',' || c.is_whitespace())
    {
        return None;
    }
    let rest = strip_word(sql[..open].trim_end(), "in")?;
    Some(plain(strip_word(rest, "not").unwrap_or(rest)))
}

/// `text` without its last word when that word is `word` (any case), blank space trimmed.
fn strip_word<'a>(text: &'a str, word: &str) -> Option<&'a str> {
    let cut = text.len().checked_sub(word.len())?;
    let (rest, last) = (text.get(..cut)?, text.get(cut..)?);
    let bounded = !rest.ends_with(|c: char| c.is_alphanumeric() || c == '_');
    (last.eq_ignore_ascii_case(word) && bounded).then(|| rest.trim_end())
}

/// The column name `operand` ends with (`t.status`, `"Order Status"`), unquoted, cut as
/// PostgreSQL cuts a name (`NAME_BYTES`): each literal compared with it keeps a copy, and a
/// model's name may be a megabyte long.
fn trailing_column(operand: &str) -> Option<String> {
    let operand = operand.trim_end();
    if let Some(inner) = operand.strip_suffix('"') {
        let name = kept_name(&inner[inner.rfind('"')? + 1..]);
        return (!name.is_empty()).then(|| name.to_string());
    }
    let word = |c: char| c.is_alphanumeric() || c == '_' || c == '$';
    let start = operand
        .char_indices()
        .rev()
        .take_while(|&(_, c)| word(c))
        .last()
        .map(|(i, _)| i)?;
    let name = kept_name(&operand[start..]);
    (!name.starts_with(|c: char| c.is_ascii_digit())).then(|| name.to_lowercase())
}

/// Bytes of a name PostgreSQL keeps (`NAMEDATALEN - 1`): a longer one names what its first
/// ones do.
const NAME_BYTES: usize = 63;

/// `name` cut to the whole characters of its first `NAME_BYTES` bytes.
fn kept_name(name: &str) -> &str {
    let mut end = name.len().min(NAME_BYTES);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_name_is_kept_as_postgresql_keeps_it() {
        // Every literal keeps a copy of the column's name: 63 bytes, not a megabyte each.
        let long = "a".repeat(1_000_000);
        let list = (0..255)
            .map(|i| format!("'v{i}'"))
            .collect::<Vec<_>>()
            .join(", ");
        let found = compared(&format!("SELECT 1 FROM t WHERE \"{long}\" IN ({list})"));
        assert!(!found.is_empty());
        assert!(
            found.iter().all(|c| c.column.len() == 63),
            "{}",
            found[0].column.len()
        );
        let found = compared(&format!("SELECT 1 FROM t WHERE {long} = 'x'"));
        assert_eq!(found[0].column, "a".repeat(63));
        // Cut at a whole character.
        assert_eq!(kept_name(&"é".repeat(40)).len(), 62);
    }

    #[test]
    fn literals_are_found_outside_identifiers_comments_and_dollar_quotes() {
        let found = literals(
            "SELECT \"a'b\", x2, 'it''s' -- 'no'\nFROM t WHERE n > 10 AND m = 2.5 AND e = E'x' \
             AND d = $q$'no'$q$ LIMIT 5",
        );
        let values: Vec<(&str, LiteralKind)> =
            found.iter().map(|l| (l.value.as_str(), l.kind)).collect();
        assert_eq!(
            values,
            vec![
                ("it's", LiteralKind::Text),
                ("10", LiteralKind::Number),
                ("2.5", LiteralKind::Number),
                ("5", LiteralKind::Number),
            ]
        );
    }

    #[test]
    fn strings_are_read_where_postgresqls_lexer_reads_them() {
        // Comments nest; `$` continues a word (`x$a$` is no dollar quote); an escape string's
        // backslash escapes a quote; a U& string is prefixed.
        let found = literals(
            r"SELECT 'a' /* x /* y */ 'no' */, x$a$, 'b', E'it\'s ''no', U&'\0041', 'c' FROM t
              WHERE id = $1 AND $q$'no'$q$ = 'd'",
        );
        let values: Vec<&str> = found
            .iter()
            .filter(|l| l.kind == LiteralKind::Text)
            .map(|l| l.value.as_str())
            .collect();
        assert_eq!(values, ["a", "b", "c", "d"]);
    }

    #[test]
    fn every_quoted_part_is_kept_as_written() {
        assert_eq!(
            quoted("SELECT E'a  b', \"X  y\", $q$ z $q$, 'c' -- 'no'\nFROM t"),
            ["'a  b'", "\"X  y\"", "$q$ z $q$", "'c'"]
        );
    }

    fn read(sql: &str) -> Vec<(String, String, bool)> {
        compared(sql)
            .into_iter()
            .map(|c| (c.column, c.value, c.ignores_case))
            .collect()
    }

    #[test]
    fn the_strings_a_column_is_compared_with_are_found() {
        assert_eq!(
            read(
                "SELECT count(*) FROM orders o WHERE o.Status = 'shipped' AND \"Ship Mode\" <> \
                 'Air' AND city NOT IN ('Wien', 'Graz') AND name LIKE 'Bob' AND tag != 'x'"
            ),
            vec![
                ("status".into(), "shipped".into(), false),
                ("Ship Mode".into(), "Air".into(), false),
                ("city".into(), "Wien".into(), false),
                ("city".into(), "Graz".into(), false),
                ("name".into(), "Bob".into(), false),
                ("tag".into(), "x".into(), false),
            ]
        );
    }

    #[test]
    fn what_stored_values_cannot_judge_is_left_out() {
        // Patterns, ranges, expressions, casts, function arguments, labels, an ILIKE (case
        // aside), and case folding anywhere in the query.
        assert_eq!(
            read(
                "SELECT 'total' AS label, to_char(d, 'YYYY') FROM t WHERE name LIKE '%Bob%' AND \
                 d >= '2024-01-01' AND d <= '2025-01-01' AND coalesce(a, 'x') = 'y' AND \
                 f(b, 'z') AND c IN (SELECT 'w') AND e ILIKE 'Vienna'"
            ),
            vec![("e".into(), "Vienna".into(), true)]
        );
        assert_eq!(
            read("SELECT * FROM t WHERE lower(a) = 'x' OR b = 'Y'"),
            vec![("b".into(), "Y".into(), true)]
        );
    }

    #[test]
    fn a_long_list_is_read_only_so_far() {
        let list: Vec<String> = (0..10_000).map(|i| format!("'v{i}'")).collect();
        let sql = format!("SELECT * FROM t WHERE c IN ({})", list.join(", "));
        let found = compared(&sql);
        assert_eq!(found.len(), MAX_LITERALS);
        assert_eq!(
            found[MAX_LITERALS - 1].value,
            format!("v{}", MAX_LITERALS - 1)
        );
    }
}
