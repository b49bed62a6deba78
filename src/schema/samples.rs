//! Sample values for text columns, cheaply and safely. Where ANALYZE ran, the planner's most
//! common values come with the catalog query. Otherwise a bounded read of the relation (at most
//! `SCAN_ROWS` rows, as the caller, read-only, under a short timeout, in the sandbox) supplies
//! them, only where that read runs no code (`Relation::own_read_from`). Values are truncated
//! and, in the prompt, quoted as data.

use std::fmt::Write;
use std::time::{Duration, Instant};

use super::catalog::{Column, Relation};
use crate::exec;
use crate::text::printable_char;

/// Rows read at most from a relation without statistics.
const SCAN_ROWS: usize = 1000;
/// Time allowed for that read.
const SCAN_TIMEOUT_MS: u128 = 2000;
/// Time the reads for one schema text may take together: relations that another session
/// holds locked cost each read its timeout, and a schema may have many.
pub const READ_BUDGET: Duration = Duration::from_millis(3000);
/// How long a relation whose read failed is left unread.
pub const RETRY_AFTER: Duration = Duration::from_secs(30);

/// How long values read from a table are kept in a backend (samples, the value index): rows
/// deleted or changed since (which change no statistics a cache watches) are not shown, nor
/// sent to the model, after it.
pub const KEPT_FOR: Duration = Duration::from_secs(600);

/// What became of the read of a relation's samples.
pub enum Read {
    /// Read, or not needed: the samples are final.
    Done,
    /// Not begun: the deadline had passed.
    NotYet,
    /// Begun and failed (a lock another session holds, the deadline).
    Failed,
}
/// Longest sample value shown, in characters.
const MAX_VALUE_CHARS: usize = 40;
/// A column with at most this many distinct values lists them all ("one of").
pub const LOW_CARDINALITY: usize = 10;

/// What the prompt says about a column's values.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Samples {
    pub values: Vec<String>,
    /// The values are all the column holds.
    pub complete: bool,
}

/// Samples of a text column from the planner's statistics, when ANALYZE collected any: its
/// most common values, or, for a column without any (every value rare), values spread evenly
/// over its histogram.
pub fn from_statistics(column: &Column, per_column: usize) -> Option<Samples> {
    if per_column == 0 || !column.textual {
        return None;
    }
    if column.common_values.is_empty() {
        let bounds = &column.histogram;
        return (!bounds.is_empty()).then(|| {
            let n = per_column.min(bounds.len());
            let spread = (0..n).map(|i| &bounds[i * (bounds.len() - 1) / (n - 1).max(1)]);
            Samples {
                values: tidy(spread),
                complete: false,
            }
        });
    }
    let complete = column.all_values && column.common_values.len() <= LOW_CARDINALITY;
    let limit = if complete {
        LOW_CARDINALITY
    } else {
        per_column
    };
    Some(Samples {
        values: tidy(column.common_values.iter().take(limit)),
        complete,
    })
}

/// Samples of `relation`'s text columns (index-aligned with its columns; `None` where there
/// are none), reading the relation only for text columns without statistics, and only before
/// `deadline` (the read ends by it too), where `Relation::own_read_from` lets it (with what the
/// caller trusts); and what became of the read.
pub fn for_relation(
    relation: &Relation,
    per_column: usize,
    deadline: Instant,
    trusted: &crate::guard::Trusted,
) -> (Vec<Option<Samples>>, Read) {
    let mut samples: Vec<Option<Samples>> = relation
        .columns
        .iter()
        .map(|c| from_statistics(c, per_column))
        .collect();
    let unknown: Vec<usize> = relation
        .columns
        .iter()
        .enumerate()
        .filter(|(i, c)| c.textual && samples[*i].is_none())
        .map(|(i, _)| i)
        .collect();
    let Some(from) = relation.own_read_from(trusted) else {
        return (samples, Read::Done);
    };
    if per_column == 0 || unknown.is_empty() {
        return (samples, Read::Done);
    }
    let remaining = deadline
        .saturating_duration_since(Instant::now())
        .as_millis()
        .min(SCAN_TIMEOUT_MS);
    if remaining == 0 {
        return (samples, Read::NotYet);
    }
    let columns: Vec<&str> = unknown
        .iter()
        .map(|i| relation.columns[*i].name.as_str())
        .collect();
    let Some(scanned) = exec::scan_text_columns(
        &from,
        &columns,
        SCAN_ROWS,
        exec::ValueLength::Cut(MAX_VALUE_CHARS + 1),
        // Every distinct value: blank ones, which take no sample's place, among them.
        SCAN_ROWS,
        remaining as i32,
        &super::catalog::own_read(pgrx::pg_sys::Oid::from(relation.oid), &from, None),
    ) else {
        // Not kept: a read fails for a lock another session holds, or for the deadline, and
        // may succeed later.
        return (samples, Read::Failed);
    };
    let scanned_all = scanned.rows < SCAN_ROWS;
    for (i, values) in unknown.into_iter().zip(scanned.columns) {
        let mut distinct: Vec<String> = Vec::new();
        for value in values {
            if !value.trim().is_empty() && !distinct.contains(&value) {
                distinct.push(value);
                if distinct.len() > LOW_CARDINALITY {
                    break;
                }
            }
        }
        let complete = scanned_all && distinct.len() <= LOW_CARDINALITY;
        let limit = if complete {
            LOW_CARDINALITY
        } else {
            per_column
        };
        if !distinct.is_empty() {
            samples[i] = Some(Samples {
                values: tidy(distinct.iter().take(limit)),
                complete,
            });
        }
    }
    (samples, Read::Done)
}

/// Values as they may be shown: one line, truncated.
fn tidy<'a>(values: impl Iterator<Item = &'a String>) -> Vec<String> {
    values
        .map(|v| {
            // Blank space only: `quote` shows every other character exactly, escaped, so
            // that the model copies the value as it is stored.
            let one_line = crate::text::single_spaced(v);
            if one_line.chars().count() > MAX_VALUE_CHARS {
                let cut: String = one_line.chars().take(MAX_VALUE_CHARS).collect();
                format!("{cut}…")
            } else {
                one_line
            }
        })
        .collect()
}

/// A value as an SQL string literal, on one line: quoted data, never mistaken for instructions
/// or syntax. A value with a backslash, or with a character that cannot be shown on one line
/// (a line break, a bidirectional override: see `text::printable_char`), is written as an escape
/// string (`E'a\\b'`, `E'a\nb'`, `E'\u202E'`), the same value exactly: it reads the same
/// whatever `standard_conforming_strings` the caller set (off, `'a\'` would not end where it
/// seems to), and a value another role stored cannot start a line of the prompt of its own.
pub fn quote(value: &str) -> String {
    if value.chars().all(|c| c != '\\' && printable_char(c)) {
        return format!("'{}'", value.replace('\'', "''"));
    }
    let mut quoted = String::from("E'");
    for c in value.chars() {
        match c {
            '\\' => quoted.push_str("\\\\"),
            '\'' => quoted.push_str("''"),
            '\n' => quoted.push_str("\\n"),
            '\r' => quoted.push_str("\\r"),
            '\t' => quoted.push_str("\\t"),
            c if !printable_char(c) && u32::from(c) <= 0xFFFF => {
                let _ = write!(quoted, "\\u{:04X}", u32::from(c));
            }
            c if !printable_char(c) => {
                let _ = write!(quoted, "\\U{:08X}", u32::from(c));
            }
            c => quoted.push(c),
        }
    }
    quoted.push('\'');
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_one_line_truncated_and_quoted() {
        let long = "x".repeat(60);
        let v = tidy([&"a\nb".to_string(), &long].into_iter());
        assert_eq!(v[0], "a b");
        assert_eq!(v[1].chars().count(), MAX_VALUE_CHARS + 1);
        assert_eq!(quote("it's"), "'it''s'");
        assert_eq!(quote("a\\"), "E'a\\\\'");
        assert_eq!(quote("a\\' OR true --"), "E'a\\\\'' OR true --'");
        // One line, the same value: a line break or an override is an escape.
        assert_eq!(quote("a\nb"), "E'a\\nb'");
        assert_eq!(quote("x\u{202E}y\t"), "E'x\\u202Ey\\t'");
        assert_eq!(quote("it's\r"), "E'it''s\\r'");
    }
}
