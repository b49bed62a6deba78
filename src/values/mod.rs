//! The value index: the literals a question names, matched to the text columns that store them,
//! so that the model writes `power_name = 'Death Touch'` against the table that has it.
//!
//! Built once per schema context (so per role, and again whenever the schema cache is rebuilt:
//! DDL, or ANALYZE that moved the statistics), as the caller, from what the caller may read: the
//! planner's most common values and histogram bounds of each text column, and a bounded read of
//! each relation whose read runs no code (`Relation::own_read_from`: no views, no foreign
//! tables, no tables where row-level security applies to the caller; `SCAN_ROWS` rows,
//! read-only, in the sandbox), within a time budget and a size bound. Relations that may not be
//! read are indexed from their statistics alone (PostgreSQL shows none for tables whose row
//! security applies). Nothing is built or sent with `sample_values = 0`. Look-ups are exact
//! (case and blank space aside) for every phrase of the question, and fuzzy (trigram
//! similarity, as pg_trgm computes it) for quoted and capitalised ones. With Redis configured,
//! reads that are the same for every role are shared by the backends of a deployment
//! (`shared`), so that a new backend does not read every relation again.

mod phrases;
mod shared;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

use crate::exec;
use crate::literals;
use crate::schema::{SchemaContext, TextColumns};

use crate::text::normalize;
use phrases::{phrases, similarity, trigrams};

/// Rows read at most from one relation to index its values.
const SCAN_ROWS: usize = 20_000;
/// Distinct values kept at most per column, and in all.
const MAX_PER_COLUMN: usize = 5_000;
const MAX_VALUES: usize = 200_000;
/// What the index holds at most beside the count of values, so that values another role
/// stores (each of up to 80 trigrams, few of them shared when the text is random) cannot grow
/// a backend past tens of megabytes: distinct trigrams, trigram postings, bytes of text.
const MAX_TRIGRAMS: usize = 500_000;
const MAX_POSTINGS: usize = 4_000_000;
const MAX_TEXT_BYTES: usize = 8 << 20;
/// Bytes of values one build reads at most (indexed or not: values without a letter or digit
/// index nothing, and would let the reads go on until the time budget ran out), and keeps at
/// most to share with other backends.
const MAX_READ_BYTES: usize = 64 << 20;
const MAX_SHARED_BYTES: usize = MAX_TEXT_BYTES;
/// Longest value indexed, in characters: longer texts are descriptions, not values.
const MAX_VALUE_CHARS: usize = 80;
/// Time the whole build may take; relations not read by then are indexed from statistics only.
const BUILD_BUDGET: Duration = Duration::from_millis(2000);
/// Similarity a fuzzy match needs.
const FUZZY_THRESHOLD: f32 = 0.55;
/// Matches shown at most, and columns per phrase.
const MAX_MATCHES: usize = 10;
const MAX_COLUMNS_PER_PHRASE: usize = 3;
/// Compared strings of one query checked at most.
const MAX_COMPARED: usize = 20;

/// One stored value.
struct Stored {
    text: String,
    column: usize,
}

/// A phrase of the question found in a column.
#[derive(Debug, Clone, PartialEq)]
pub struct Match {
    /// The value as stored.
    pub value: String,
    /// `relation.column`, as written in SQL.
    pub column: String,
    /// Index of the relation in the schema context.
    pub relation: usize,
    /// Exact (case and blank space aside) or fuzzy.
    pub exact: bool,
}

/// Values of the indexed columns, by normalized text and by trigram.
pub struct ValueIndex {
    columns: TextColumns,
    values: Vec<Stored>,
    exact: HashMap<String, Vec<usize>>,
    by_trigram: HashMap<u64, Vec<u32>>,
    /// Postings in `by_trigram` and bytes in `values`, for the bounds.
    postings: usize,
    text_bytes: usize,
    /// Columns whose every value (as the caller sees them) is indexed: read in full here, and
    /// all kept. Only of these can the index say that a value is not stored.
    complete: HashSet<usize>,
    /// When its oldest values were read (a shared read taken from Redis may be minutes old):
    /// it is kept `VALUES_KEPT_FOR` from then.
    read_at: Instant,
}

/// A string an answer compares a column with that the column does not store as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Misread {
    /// The string as the query writes it.
    pub written: String,
    /// The closest value the column stores.
    pub stored: String,
    /// `relation.column`, as written in SQL.
    pub column: String,
}

impl Misread {
    /// One line for the model and for a doubt: `'shipped' is stored as 'Shipped' in orders.status`.
    pub fn describe(&self) -> String {
        let (written, stored) = (
            crate::schema::quote_literal(&self.written),
            crate::schema::quote_literal(&self.stored),
        );
        if normalize(&self.written) == normalize(&self.stored) {
            format!("{written} is stored as {stored} in {}", self.column)
        } else {
            format!(
                "{written} is not a value of {}; the closest stored value is {stored}",
                self.column
            )
        }
    }
}

/// An index, the schema context it was built for, and when.
type Built = (Weak<SchemaContext>, Instant, Rc<ValueIndex>);

thread_local! {
    /// The index of the schema context it was built for, and when (kept
    /// `samples::KEPT_FOR`).
    static INDEX: RefCell<Option<Built>> = const { RefCell::new(None) };
}

/// The value index of `context`, built on first use.
pub fn index(context: &Rc<SchemaContext>) -> Rc<ValueIndex> {
    if let Some(index) = INDEX.with_borrow(|i| {
        i.as_ref()
            .filter(|(built_for, at, _)| {
                at.elapsed() < crate::schema::VALUES_KEPT_FOR
                    && built_for.upgrade().is_some_and(|c| Rc::ptr_eq(&c, context))
            })
            .map(|(_, _, index)| Rc::clone(index))
    }) {
        return index;
    }
    let index = Rc::new(ValueIndex::build(context.text_columns()));
    INDEX
        .with_borrow_mut(|i| *i = Some((Rc::downgrade(context), index.read_at, Rc::clone(&index))));
    index
}

impl ValueIndex {
    fn build(columns: TextColumns) -> ValueIndex {
        let mut index = ValueIndex {
            values: Vec::new(),
            exact: HashMap::default(),
            by_trigram: HashMap::default(),
            postings: 0,
            text_bytes: 0,
            complete: HashSet::default(),
            read_at: Instant::now(),
            columns,
        };
        let deadline = Instant::now() + BUILD_BUDGET;
        let (mut shared, oldest) =
            shared::fetch(&index.columns, deadline, MAX_PER_COLUMN + 1, MAX_VALUES);
        index.read_at = Instant::now()
            .checked_sub(oldest)
            .unwrap_or_else(Instant::now);
        let share = shared::may_share();
        let mut read: Vec<(usize, Vec<String>)> = Vec::new();
        let (mut read_bytes, mut shared_bytes) = (0usize, 0usize);
        for relation in index.columns.relations() {
            pgrx::check_for_interrupts!();
            let ids = index.columns.of_relation(relation);
            let mut per_column: Vec<Vec<String>> = ids
                .iter()
                .map(|&id| index.columns.get(id).statistics.clone())
                .collect();
            // What another backend read already; the rest is read here.
            let mut unread = Vec::new();
            for (position, id) in ids.iter().enumerate() {
                match shared.remove(id) {
                    Some(values) => per_column[position].extend(values),
                    None => unread.push(position),
                }
            }
            let now = Instant::now();
            let from = &index.columns.get(ids[0]).read_from;
            // Columns whose relation was read to its end here (shared reads do not say so).
            let mut read_in_full = Vec::new();
            if let (true, false, Some(from)) = (now < deadline, unread.is_empty(), from) {
                let remaining = (deadline - now).as_millis().clamp(1, 1000) as i32;
                let columns: Vec<&str> = unread
                    .iter()
                    .map(|&position| index.columns.get(ids[position]).column_sql.as_str())
                    .collect();
                // What is shared is known by the relation's OID and the columns' numbers:
                // the read must find them under the names it reads by (a rename since the
                // schema was read would store one column's values as another's).
                let first = index.columns.get(ids[0]);
                let same_as = crate::schema::own_read(
                    pgrx::pg_sys::Oid::from(first.relation_oid),
                    from,
                    Some(
                        unread
                            .iter()
                            .map(|&position| index.columns.get(ids[position]).attnum)
                            .collect(),
                    ),
                );
                let scanned = exec::scan_text_columns(
                    from,
                    &columns,
                    SCAN_ROWS,
                    exec::ValueLength::AtMost(MAX_VALUE_CHARS),
                    // What `add_column` takes of a column (one more says there were more).
                    MAX_PER_COLUMN + 1,
                    remaining,
                    &same_as,
                );
                if let Some(scanned) = scanned {
                    if scanned.rows < SCAN_ROWS {
                        read_in_full = unread.iter().map(|&position| ids[position]).collect();
                    }
                    for (&position, more) in unread.iter().zip(scanned.columns) {
                        read_bytes += more.iter().map(String::len).sum::<usize>();
                        if share
                            && shared_bytes < MAX_SHARED_BYTES
                            && index.columns.get(ids[position]).shared_as.is_some()
                        {
                            // What an index keeps of it (one more, so that a reader knows
                            // it was cut), not every row read.
                            let kept = crate::text::first_distinct(&more, MAX_PER_COLUMN + 1);
                            shared_bytes += kept.iter().map(String::len).sum::<usize>();
                            read.push((ids[position], kept));
                        }
                        per_column[position].extend(more);
                    }
                }
            }
            for (&id, values) in ids.iter().zip(per_column) {
                if index.add_column(id, values) && read_in_full.contains(&id) {
                    index.complete.insert(id);
                }
            }
            if index.full() || read_bytes >= MAX_READ_BYTES {
                break;
            }
        }
        shared::store(&index.columns, &read);
        index
    }

    /// Indexes `values` of `column`; says whether every one of them was taken (none left out
    /// for a bound; those too long to be a value do not count).
    fn add_column(&mut self, column: usize, values: Vec<String>) -> bool {
        // Distinct as written: a column that stores both 'Shipped' and 'shipped' keeps both,
        // so that `misread` does not question either.
        let mut seen = HashSet::new();
        for (i, value) in values.into_iter().enumerate() {
            if seen.len() >= MAX_PER_COLUMN || self.full() {
                return false;
            }
            if i % 1024 == 1023 {
                pgrx::check_for_interrupts!();
            }
            if value.chars().count() <= MAX_VALUE_CHARS && !seen.contains(&value) {
                self.add_value(column, value.clone());
                seen.insert(value);
            }
        }
        true
    }

    /// Whether the index holds as much as it may.
    fn full(&self) -> bool {
        self.values.len() >= MAX_VALUES
            || self.by_trigram.len() >= MAX_TRIGRAMS
            || self.postings >= MAX_POSTINGS
            || self.text_bytes >= MAX_TEXT_BYTES
    }

    /// Indexes one value of `column` (a blank one is no value).
    fn add_value(&mut self, column: usize, value: String) {
        let key = normalize(&value);
        if key.is_empty() {
            return;
        }
        let id = self.values.len();
        for trigram in trigrams(&value) {
            self.by_trigram.entry(trigram).or_default().push(id as u32);
            self.postings += 1;
        }
        self.text_bytes += value.len() + key.len();
        self.exact.entry(key).or_default().push(id);
        self.values.push(Stored {
            text: value,
            column,
        });
    }

    /// The columns that store `text` exactly (case and blank space aside), each with the value
    /// as stored.
    pub fn stored(&self, text: &str) -> Vec<(String, String)> {
        self.exact
            .get(&normalize(text))
            .map(|ids| {
                ids.iter()
                    .map(|&id| {
                        let value = &self.values[id];
                        (
                            self.columns.get(value.column).display.clone(),
                            value.text.clone(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The stored values `question` names, best first.
    pub fn lookup(&self, question: &str) -> Vec<Match> {
        let mut matches: Vec<Match> = Vec::new();
        let mut matched_phrases: Vec<String> = Vec::new();
        let candidates = phrases(question);
        for phrase in candidates.iter().take(300) {
            // A fuzzy look-up can read many postings: the caller's cancel and timeout count.
            interruptible();
            if matches.len() >= MAX_MATCHES {
                break;
            }
            let key = normalize(&phrase.text);
            // A part of a phrase already found is not looked up again ("Touch" of "Death Touch").
            if matched_phrases
                .iter()
                .any(|m| m.contains(&key) && m.len() > key.len())
            {
                continue;
            }
            let mut found: Vec<(usize, bool)> = self
                .exact
                .get(&key)
                .map(|ids| ids.iter().map(|&id| (id, true)).collect())
                .unwrap_or_default();
            // A long phrase has many trigrams, each a long list to read: only exact there.
            if found.is_empty()
                && phrase.marked
                && key.chars().count() >= 3
                && key.len() <= MAX_FUZZY_BYTES
            {
                found = self
                    .fuzzy(&phrase.text)
                    .into_iter()
                    .map(|id| (id, false))
                    .collect();
            }
            if found.is_empty() {
                continue;
            }
            matched_phrases.push(key);
            for (id, exact) in found.into_iter().take(MAX_COLUMNS_PER_PHRASE) {
                let stored = &self.values[id];
                let column = self.columns.get(stored.column);
                let m = Match {
                    value: stored.text.clone(),
                    column: column.display.clone(),
                    relation: column.relation,
                    exact,
                };
                if !matches.contains(&m) {
                    matches.push(m);
                }
            }
        }
        matches.truncate(MAX_MATCHES);
        matches
    }

    /// The strings `sql` compares a column with that the column does not store as written,
    /// when the index knows all of the column's values: another case or spacing of a stored
    /// value (unless the query ignores case), or no stored value but a similar one. A string
    /// nothing like any value says nothing: the question may ask for what is not there.
    pub fn misread(&self, sql: &str) -> Vec<Misread> {
        let mut found: Vec<Misread> = Vec::new();
        for compared in literals::compared(sql).into_iter().take(MAX_COMPARED) {
            let value = &compared.value;
            let length = value.chars().count();
            if !(2..=MAX_VALUE_CHARS).contains(&length)
                || !value.chars().any(char::is_alphabetic)
                || found.iter().any(|m| m.written == *value)
            {
                continue;
            }
            let named = |column: usize| {
                column_name(&self.columns.get(column).column_sql)
                    .eq_ignore_ascii_case(&compared.column)
            };
            // The query's column is one of those of that name; the string may be stored in
            // one whose values are not all known.
            if !self
                .columns
                .ids()
                .filter(|&column| named(column))
                .all(|column| self.complete.contains(&column))
            {
                continue;
            }
            let in_column = |id: &usize| named(self.values[*id].column);
            let same: Vec<usize> = self
                .exact
                .get(&normalize(value))
                .map(|ids| ids.iter().copied().filter(in_column).collect())
                .unwrap_or_default();
            let stored_as_written = same.iter().any(|&id| {
                let stored = &self.values[id].text;
                stored == value
                    || (compared.ignores_case && stored.to_lowercase() == value.to_lowercase())
            });
            if stored_as_written {
                continue;
            }
            let closest = if same.is_empty() && length >= 3 {
                self.fuzzy(value).into_iter().find(in_column)
            } else {
                same.first().copied()
            };
            let Some(id) = closest else {
                continue;
            };
            let stored = &self.values[id];
            found.push(Misread {
                written: value.clone(),
                stored: stored.text.clone(),
                column: self.columns.get(stored.column).display.clone(),
            });
        }
        found
    }

    /// Values most similar to `text`, above the threshold, best first (at most two).
    fn fuzzy(&self, text: &str) -> Vec<usize> {
        let wanted = trigrams(text);
        let mut shared: HashMap<u32, usize> = HashMap::default();
        for trigram in &wanted {
            interruptible();
            if let Some(ids) = self.by_trigram.get(trigram) {
                // Very common trigrams say little and cost much.
                if ids.len() > 20_000 {
                    continue;
                }
                for &id in ids {
                    *shared.entry(id).or_default() += 1;
                }
            }
        }
        let mut best: Vec<(f32, usize)> = shared
            .into_iter()
            .filter(|(_, n)| *n * 2 >= wanted.len())
            .map(|(id, _)| {
                let id = id as usize;
                (similarity(&wanted, &trigrams(&self.values[id].text)), id)
            })
            .filter(|(score, _)| *score >= FUZZY_THRESHOLD)
            .collect();
        best.sort_by(|a, b| b.0.total_cmp(&a.0));
        best.into_iter().take(2).map(|(_, id)| id).collect()
    }
}

/// The caller's cancel and timeout, checked in look-ups over the index (unit tests run them
/// outside a backend, where there is nothing to check).
fn interruptible() {
    #[cfg(not(test))]
    pgrx::check_for_interrupts!();
}

/// Longest phrase (in bytes) looked up by similarity rather than only exactly.
const MAX_FUZZY_BYTES: usize = 200;

/// A column's name as `literals::compared` reads it from a query: unquoted.
fn column_name(quoted: &str) -> String {
    match quoted.strip_prefix('"').and_then(|q| q.strip_suffix('"')) {
        Some(inner) => inner.replace("\"\"", "\""),
        None => quoted.to_string(),
    }
}

/// The prompt's lines for `matches`: `-- 'Death Touch' found in superpower.power_name`.
pub fn describe(matches: &[Match]) -> Option<String> {
    if matches.is_empty() {
        return None;
    }
    // A value two phrases of the question found (`Robbin CV` exactly, and `name Robbin CV`
    // by similarity) is one line, exact when either found it so.
    let mut found: Vec<(&str, &str, bool)> = Vec::new();
    for m in matches {
        match found
            .iter_mut()
            .find(|(value, column, _)| *value == m.value && *column == m.column)
        {
            Some((_, _, exact)) => *exact |= m.exact,
            None => found.push((&m.value, &m.column, m.exact)),
        }
    }
    let lines: Vec<String> = found
        .into_iter()
        .map(|(value, column, exact)| {
            format!(
                "-- {} found in {column}{}",
                crate::schema::quote_literal(value),
                if exact { "" } else { " (similar)" }
            )
        })
        .collect();
    Some(lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::TextColumn;

    #[test]
    fn a_value_found_twice_in_one_column_is_shown_once() {
        let found = |value: &str, column: &str, exact: bool| Match {
            value: value.into(),
            column: column.into(),
            relation: 0,
            exact,
        };
        let shown = describe(&[
            found("Robbin CV", "documents.document_name", false),
            found("Robbin CV", "documents.document_name", true),
            found("Robbin CV", "documents.other_details", false),
        ]);
        assert_eq!(
            shown.as_deref(),
            Some(
                "-- 'Robbin CV' found in documents.document_name\n\
                 -- 'Robbin CV' found in documents.other_details (similar)"
            )
        );
    }

    /// `orders.status`, `orders."Ship Mode"` and `returns.status`; those in `complete` read
    /// in full.
    fn orders(complete: &[usize]) -> ValueIndex {
        let column = |relation: usize, name: &str| TextColumn {
            relation,
            column_sql: name.to_string(),
            read_from: None,
            shared_as: None,
            relation_oid: 0,
            attnum: 0,
            display: format!("{}.{name}", ["orders", "returns"][relation]),
            statistics: vec![],
        };
        let mut index = ValueIndex {
            columns: TextColumns::new(vec![
                column(0, "status"),
                column(0, "\"Ship Mode\""),
                column(1, "status"),
            ]),
            values: Vec::new(),
            exact: HashMap::default(),
            by_trigram: HashMap::default(),
            postings: 0,
            text_bytes: 0,
            complete: HashSet::default(),
            read_at: Instant::now(),
        };
        for (column, value) in [
            (0, "Shipped"),
            (0, "Pending"),
            (0, "Cancelled"),
            (1, "Air"),
            (1, "Truck"),
            (1, "truck"),
            (2, "Refunded"),
        ] {
            index.add_value(column, value.to_string());
        }
        index.complete.extend(complete);
        index
    }

    #[test]
    fn values_of_random_text_fill_the_index_only_up_to_its_bounds() {
        let mut index = orders(&[]);
        // Random letters share few trigrams: each value adds about 80 new ones.
        let mut seed = 7u64;
        let mut letter = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            char::from_u32(0x4E00 + ((seed >> 33) % 20_000) as u32).unwrap()
        };
        let mut added = 0;
        while !index.full() {
            let value: String = (0..MAX_VALUE_CHARS).map(|_| letter()).collect();
            index.add_value(0, value);
            added += 1;
            assert!(added < MAX_VALUES, "no bound stopped the index");
        }
        assert!(index.values.len() < MAX_VALUES / 10, "{added} values");
        assert!(index.by_trigram.len() < MAX_TRIGRAMS + MAX_VALUE_CHARS + 2);
        assert!(index.postings < MAX_POSTINGS + MAX_VALUE_CHARS + 2);
        assert!(index.text_bytes < MAX_TEXT_BYTES + 1024);
    }

    fn said(index: &ValueIndex, filter: &str) -> Vec<String> {
        let sql = format!("SELECT count(*) FROM orders WHERE {filter}");
        index.misread(&sql).iter().map(Misread::describe).collect()
    }

    #[test]
    fn a_string_a_column_stores_otherwise_is_named_with_how_it_is_stored() {
        let index = orders(&[0, 1, 2]);
        assert_eq!(
            said(&index, "status = 'shipped'"),
            ["'shipped' is stored as 'Shipped' in orders.status"]
        );
        assert_eq!(
            said(&index, "status IN ('Shiped', 'Pending')"),
            ["'Shiped' is not a value of orders.status; the closest stored value is 'Shipped'"]
        );
        assert_eq!(
            said(&index, "o.\"Ship Mode\" <> 'air'"),
            ["'air' is stored as 'Air' in orders.\"Ship Mode\""]
        );
    }

    #[test]
    fn what_the_index_cannot_vouch_for_is_not_questioned() {
        let index = orders(&[0, 1, 2]);
        for filter in [
            "status = 'Shipped'",
            "status ILIKE 'shipped'",
            // Stored both ways.
            "\"Ship Mode\" = 'truck'",
            "lower(status) = 'shipped'",
            // Nothing like any stored value: the question may ask for what is not there.
            "status = 'Delivered'",
            // Another column, whose values the index does not hold.
            "city = 'shipped'",
            "status = '42'",
        ] {
            assert!(said(&index, filter).is_empty(), "{filter}");
        }
        // A column not read in full may store the string in rows that were not read: the
        // query's `status` may be that one.
        assert!(said(&orders(&[0, 1]), "status = 'shipped'").is_empty());
        assert_eq!(said(&orders(&[0, 1]), "\"Ship Mode\" = 'air'").len(), 1);
    }
}
