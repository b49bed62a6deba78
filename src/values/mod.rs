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

use rustc_hash::{FxHashMap, FxHashSet};
use std::cell::RefCell;
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

use crate::exec;
use crate::schema::{SchemaContext, TextColumns};

use crate::text::normalize;
use phrases::{phrases, similarity, trigrams};

/// Rows read at most from one relation to index its values.
const SCAN_ROWS: usize = 20_000;
/// Distinct values kept at most per column, and in all.
const MAX_PER_COLUMN: usize = 5_000;
const MAX_VALUES: usize = 200_000;
/// Longest value indexed, in characters: longer texts are descriptions, not values.
const MAX_VALUE_CHARS: usize = 80;
/// Time the whole build may take; relations not read by then are indexed from statistics only.
const BUILD_BUDGET: Duration = Duration::from_millis(2000);
/// Similarity a fuzzy match needs.
const FUZZY_THRESHOLD: f32 = 0.55;
/// Matches shown at most, and columns per phrase.
const MAX_MATCHES: usize = 10;
const MAX_COLUMNS_PER_PHRASE: usize = 3;

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
    exact: FxHashMap<String, Vec<usize>>,
    by_trigram: FxHashMap<u64, Vec<u32>>,
}

thread_local! {
    /// The index of the schema context it was built for.
    static INDEX: RefCell<Option<(Weak<SchemaContext>, Rc<ValueIndex>)>> = const { RefCell::new(None) };
}

/// The value index of `context`, built on first use.
pub fn index(context: &Rc<SchemaContext>) -> Rc<ValueIndex> {
    if let Some(index) = INDEX.with_borrow(|i| {
        i.as_ref()
            .filter(|(built_for, _)| built_for.upgrade().is_some_and(|c| Rc::ptr_eq(&c, context)))
            .map(|(_, index)| Rc::clone(index))
    }) {
        return index;
    }
    let index = Rc::new(ValueIndex::build(context.text_columns()));
    INDEX.with_borrow_mut(|i| *i = Some((Rc::downgrade(context), Rc::clone(&index))));
    index
}

impl ValueIndex {
    fn build(columns: TextColumns) -> ValueIndex {
        let mut index = ValueIndex {
            values: Vec::new(),
            exact: FxHashMap::default(),
            by_trigram: FxHashMap::default(),
            columns,
        };
        let deadline = Instant::now() + BUILD_BUDGET;
        let mut shared = shared::fetch(&index.columns);
        let share = shared::may_share();
        let mut read: Vec<(usize, Vec<String>)> = Vec::new();
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
            if let (true, false, Some(from)) = (now < deadline, unread.is_empty(), from) {
                let remaining = (deadline - now).as_millis().clamp(1, 1000) as i32;
                let columns: Vec<&str> = unread
                    .iter()
                    .map(|&position| index.columns.get(ids[position]).column_sql.as_str())
                    .collect();
                let scanned = exec::scan_text_columns(
                    from,
                    &columns,
                    SCAN_ROWS,
                    exec::ValueLength::AtMost(MAX_VALUE_CHARS),
                    remaining,
                );
                if let Some(scanned) = scanned {
                    for (&position, more) in unread.iter().zip(scanned.columns) {
                        if share && index.columns.get(ids[position]).shared_as.is_some() {
                            read.push((ids[position], more.clone()));
                        }
                        per_column[position].extend(more);
                    }
                }
            }
            for (&id, values) in ids.iter().zip(per_column) {
                index.add_column(id, values);
            }
            if index.values.len() >= MAX_VALUES {
                break;
            }
        }
        shared::store(&index.columns, &read);
        index
    }

    fn add_column(&mut self, column: usize, values: Vec<String>) {
        let mut kept = 0;
        let mut seen = FxHashSet::default();
        for (i, value) in values.into_iter().enumerate() {
            if kept >= MAX_PER_COLUMN || self.values.len() >= MAX_VALUES {
                break;
            }
            if i % 1024 == 1023 {
                pgrx::check_for_interrupts!();
            }
            let key = normalize(&value);
            if key.is_empty()
                || value.chars().count() > MAX_VALUE_CHARS
                || !seen.insert(key.clone())
            {
                continue;
            }
            let id = self.values.len();
            for trigram in trigrams(&value) {
                self.by_trigram.entry(trigram).or_default().push(id as u32);
            }
            self.exact.entry(key).or_default().push(id);
            self.values.push(Stored {
                text: value,
                column,
            });
            kept += 1;
        }
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
            if found.is_empty() && phrase.marked && key.chars().count() >= 3 {
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

    /// Values most similar to `text`, above the threshold, best first (at most two).
    fn fuzzy(&self, text: &str) -> Vec<usize> {
        let wanted = trigrams(text);
        let mut shared: FxHashMap<u32, usize> = FxHashMap::default();
        for trigram in &wanted {
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

/// The prompt's lines for `matches`: `-- 'Death Touch' found in superpower.power_name`.
pub fn describe(matches: &[Match]) -> Option<String> {
    if matches.is_empty() {
        return None;
    }
    let lines: Vec<String> = matches
        .iter()
        .map(|m| {
            format!(
                "-- {} found in {}{}",
                crate::schema::quote_literal(&m.value),
                m.column,
                if m.exact { "" } else { " (similar)" }
            )
        })
        .collect();
    Some(lines.join("\n"))
}
