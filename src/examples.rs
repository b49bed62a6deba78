//! Verified examples: question -> SQL pairs that a human approved (`nl_example_add`, in
//! `sql/examples.sql`). The few most similar to a question go into the prompt, the cheapest way
//! to teach a model a database's conventions.

use pgrx::prelude::*;

use crate::error::{Error, Result};
use crate::guard::Scope;
use crate::schema::quote_literal;
use crate::store::extension_schema;
use crate::subxact;
use crate::text::words;

/// Stores a verified example after the guard accepted its SQL and it ran, as the caller (who
/// needs INSERT on `nl_examples`); returns its id. The SQL is checked and run in the sandbox on
/// the caller's search path (it is the caller's SQL); the insert runs on the pinned one. It
/// must run for its author: an example may name only what its author may read (it is shown
/// to other roles' models and may run as their answer).
pub fn add(question: &str, sql: &str) -> Result<i64> {
    // One row, within the caller's max_result_bytes (a first row past it is an error that
    // names the setting).
    let probe = crate::exec::Mode::Run(crate::exec::Limits {
        max_rows: 1,
        ..crate::exec::Limits::from_settings()
    });
    crate::exec::attempt(sql, probe, crate::settings::statement_timeout_ms()).into_result()?;
    insert(question, sql, None)
}

/// `add`, for an example that comes from the recorded answer `history_id` (`nl_feedback`).
pub fn add_from_history(question: &str, sql: &str, history_id: i64) -> Result<i64> {
    insert(question, sql, Some(history_id))
}

/// Stores an example whose SQL its caller ran through the sandbox already (`add`, or
/// `nl_feedback`'s run of it): the guard checked it there.
fn insert(question: &str, sql: &str, history_id: Option<i64>) -> Result<i64> {
    let insert = format!(
        "INSERT INTO {}.nl_examples (question, sql, history_id) VALUES ($1, $2, $3) RETURNING id",
        extension_schema()?
    );
    subxact::pinned(|| {
        Spi::connect_mut(|client| {
            client
                .update(
                    &insert,
                    Some(1),
                    &[question.into(), sql.into(), history_id.into()],
                )?
                .first()
                .get_one::<i64>()
        })
    })
    .map_err(|e| Error::internal(format!("storing the example failed: {e}")))?
    .ok_or_else(|| Error::internal("the example got no id"))
}

/// Examples looked up beyond the number shown, so that skipped ones leave no gap.
pub const SPARE: usize = 2;

/// The first `n` of `found` whose SQL still passes the guard against the database as it is
/// now (after DDL an example may name a dropped table or column, and would teach the model a
/// query that fails) and names only relations of `scope`, the caller's schema context (an
/// example is another role's SQL: it may not steer the model, or run as a template, toward
/// relations the caller was not shown), nor holds a character that is not shown (written
/// straight into the table: it would carry what no reviewer saw), and the ids of those
/// skipped, for the trace.
pub fn still_valid(found: Vec<Example>, n: usize, scope: &Scope) -> (Vec<Example>, Vec<i64>) {
    let (mut kept, mut skipped) = (Vec::new(), Vec::new());
    crate::subxact::with_settings(&[(c"lock_timeout", CHECK_LOCK_TIMEOUT)], || {
        for example in found {
            if kept.len() == n {
                break;
            }
            if crate::text::hidden_char(&example.sql)
                .or_else(|| crate::text::hidden_char(&example.question))
                .is_some()
            {
                skipped.push(example.id);
                continue;
            }
            match crate::exec::check(&example.sql, Some(scope)) {
                Ok(()) => kept.push(example),
                Err(_) => skipped.push(example.id),
            }
        }
    });
    (kept, skipped)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    pub id: i64,
    pub question: String,
    pub sql: String,
}

/// What a question is about beyond its words, for ranking examples: the relations it names or
/// where its values are stored (bare names, lower case), and those values.
#[derive(Debug, Default)]
pub struct Focus {
    pub relations: Vec<String>,
    pub values: Vec<String>,
}

/// How much an example gains in ranking when its SQL reads all the relations the question is
/// about, and when it uses a value the question names (word similarity counts from 0 to 1).
const RELATION_WEIGHT: f64 = 0.25;
const VALUE_WEIGHT: f64 = 0.1;

/// Largest example read, question and SQL (another role may have stored any size): what
/// `nl_example_add` takes, 10,000 and 100,000 characters.
const MAX_QUESTION_BYTES: usize = 40_000;
const MAX_SQL_BYTES: usize = 400_000;
/// How long checking an example waits for a lock on a relation it names: another role may
/// hold one on a relation an example names for as long as it likes, and every matching
/// question of every role would wait for it (at most `examples` + `SPARE` times).
const CHECK_LOCK_TIMEOUT: &std::ffi::CStr = c"100ms";
/// Examples fetched at most per look-up, before they are ranked.
const CANDIDATES: i64 = 100;
/// Bytes of candidates (questions and SQL) read at most per look-up, all reads together: the
/// examples are ranked, and the first checked against the schema, in the caller's backend.
const CANDIDATE_BYTES: usize = 4 << 20;
/// Stored bytes of each array of the statistics of `nl_examples.terms` read at most (as the
/// schema context reads a column's).
const MAX_STATISTICS_BYTES: i32 = 64 << 10;
/// Elements of those arrays at most (ANALYZE keeps ten times the statistics target: 1,000 by
/// default).
const MAX_STATISTICS_ELEMENTS: i32 = 10_000;
/// Words of the question used to find candidates: its rarest ones.
const LOOKUP_WORDS: usize = 6;
/// A word in more than this share of the examples does not find candidates (it is still
/// counted when they are ranked): it would find nearly all of them.
const COMMON_SHARE: f64 = 0.02;

/// Up to `n` examples most similar to `question` (word overlap, and, among those, the ones over
/// the relations and values of `focus`), best first. None when the caller may not read the
/// examples, or they could not be read at once (a lock: see `store::read_best_effort`). Found
/// through the GIN index on `nl_examples.terms`, by the
/// question's rarest words (the planner's statistics of `terms` say which are common): first
/// the examples that share two of them, then, when those are too few, those that share one; at
/// most `CANDIDATES` are read, whatever the table's size.
pub fn similar(question: &str, n: usize, focus: &Focus) -> Result<Vec<Example>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let asked = distinct_words(question);
    if asked.is_empty() {
        return Ok(Vec::new());
    }
    let schema = extension_schema()?;
    let table = format!("{schema}.nl_examples");
    // Best effort, with the bookkeeping's lock timeout: a role that may delete examples may
    // lock the table, and no call waits for it (it goes on without examples).
    let examples: Vec<Example> =
        crate::store::read_best_effort("the verified examples", |client| {
            let client = &*client;
            let readable = client
                .select(
                    "SELECT has_table_privilege($1, 'SELECT')",
                    Some(1),
                    &[table.as_str().into()],
                )?
                .first()
                .get_one::<bool>()?
                .unwrap_or(false);
            if !readable {
                return Ok(Vec::new());
            }
            // How common each of the question's words is, where ANALYZE has counted (rare
            // words are not listed), from statistics of at most `MAX_STATISTICS_BYTES` stored
            // and `MAX_STATISTICS_ELEMENTS` elements (a compressed array may hold hundreds of
            // times its stored size: counted before any is written out, in that order): the
            // database's owner may store any (`pg_restore_attribute_stats`, PostgreSQL 18),
            // and they are read at every question.
            let statistics = client.select(
                "SELECT e.word, e.share FROM pg_stats s \
                 CROSS JOIN LATERAL (SELECT \
                     CASE WHEN pg_column_size(s.most_common_elems) > $2 THEN NULL \
                          WHEN cardinality(s.most_common_elems) <= $4 \
                          THEN s.most_common_elems::text::text[] END AS words, \
                     CASE WHEN pg_column_size(s.most_common_elem_freqs) > $2 THEN NULL \
                          WHEN cardinality(s.most_common_elem_freqs) <= $4 + 3 \
                          THEN s.most_common_elem_freqs END AS shares) raw \
                 CROSS JOIN LATERAL unnest(raw.words, raw.shares) AS e(word, share) \
                 WHERE s.schemaname = $1 AND s.tablename = 'nl_examples' \
                   AND s.attname = 'terms' AND e.word = ANY ($3)",
                Some(asked.len() as i64),
                &[
                    schema.trim_matches('"').into(),
                    MAX_STATISTICS_BYTES.into(),
                    asked.clone().into(),
                    MAX_STATISTICS_ELEMENTS.into(),
                ],
            )?;
            let mut shares = std::collections::HashMap::new();
            for row in statistics {
                if let (Some(word), Some(share)) = (row.get::<String>(1)?, row.get::<f32>(2)?) {
                    shares.insert(word, f64::from(share));
                }
            }
            let share = |word: &String| shares.get(word).copied().unwrap_or(0.0);
            let mut rare: Vec<&String> =
                asked.iter().filter(|w| share(w) <= COMMON_SHARE).collect();
            rare.sort_by(|a, b| share(a).total_cmp(&share(b)));
            rare.truncate(LOOKUP_WORDS);
            if rare.is_empty() {
                return Ok(Vec::new());
            }
            let mut found: Vec<Example> = Vec::new();
            let mut budget = CANDIDATE_BYTES;
            let mut read = |condition: &str, found: &mut Vec<Example>| {
                // The candidates' sizes are summed before any is read whole (octet_length
                // reads a stored value's header only): those past the budget are left out.
                let rows = client.select(
                    &format!(
                        "SELECT id, question, sql, size FROM (\
                           SELECT id, question, sql, size, \
                                  sum(size) OVER (ORDER BY id ROWS UNBOUNDED PRECEDING) AS total \
                           FROM (SELECT id, question, sql, \
                                        octet_length(question) + octet_length(sql) AS size \
                                 FROM {table} WHERE ({condition}) \
                                 AND octet_length(question) <= {MAX_QUESTION_BYTES} \
                                 AND octet_length(sql) <= {MAX_SQL_BYTES} \
                                 LIMIT {CANDIDATES}) AS candidates) AS sized \
                         WHERE total <= {budget}"
                    ),
                    None,
                    &[],
                )?;
                for row in rows {
                    let size = usize::try_from(row.get::<i32>(4)?.unwrap_or_default()).unwrap_or(0);
                    budget = budget.saturating_sub(size);
                    let id = row.get::<i64>(1)?.unwrap_or_default();
                    if found.iter().all(|e| e.id != id) {
                        found.push(Example {
                            id,
                            question: row.get::<String>(2)?.unwrap_or_default(),
                            sql: row.get::<String>(3)?.unwrap_or_default(),
                        });
                    }
                }
                Ok::<_, pgrx::spi::Error>(())
            };
            let pairs: Vec<String> = (0..rare.len())
                .flat_map(|i| (i + 1..rare.len()).map(move |j| (i, j)))
                .map(|(i, j)| {
                    format!(
                        "terms @> ARRAY[{}, {}]",
                        quote_literal(rare[i]),
                        quote_literal(rare[j])
                    )
                })
                .collect();
            if !pairs.is_empty() {
                read(&pairs.join(" OR "), &mut found)?;
            }
            if found.len() < n {
                let any: Vec<String> = rare.iter().map(|w| quote_literal(w)).collect();
                read(&format!("terms && ARRAY[{}]", any.join(", ")), &mut found)?;
            }
            Ok::<_, pgrx::spi::Error>(found)
        })
        .unwrap_or_default();
    Ok(most_similar(question, examples, n, focus))
}

/// What an example's SQL shares with what the question is about: the share of `focus`'s
/// relations it names, and whether it uses one of `focus`'s values.
fn focus_bonus(sql: &str, focus: &Focus) -> f64 {
    let identifiers: std::collections::HashSet<String> = sql
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    let relations = if focus.relations.is_empty() {
        0.0
    } else {
        focus
            .relations
            .iter()
            .filter(|r| identifiers.contains(r.as_str()))
            .count() as f64
            / focus.relations.len() as f64
    };
    let lower = sql.to_lowercase();
    let value = focus
        .values
        .iter()
        .any(|v| lower.contains(&crate::schema::quote_literal(v).to_lowercase()));
    RELATION_WEIGHT * relations + if value { VALUE_WEIGHT } else { 0.0 }
}

/// The words a verified example is found by (`nl_examples.terms`, a generated column): the
/// question's words as retrieval sees them.
#[pg_extern(immutable, parallel_safe, strict)]
fn nl_example_words(question: &str) -> Vec<String> {
    distinct_words(question)
}

/// Bytes of a question whose words are read: a question is at most 10,000 characters.
const MAX_WORDS_BYTES: usize = 100_000;

/// The distinct words of the first `MAX_WORDS_BYTES` of `text`, in order (linear: a text of
/// any length costs no more than its first part).
fn distinct_words(text: &str) -> Vec<String> {
    let mut end = text.len().min(MAX_WORDS_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    crate::text::first_distinct(words(&text[..end]), usize::MAX)
}

/// Ranks by Jaccard similarity of the questions' words, plus what the example's SQL shares with
/// `focus`; only examples sharing a word count.
fn most_similar(question: &str, examples: Vec<Example>, n: usize, focus: &Focus) -> Vec<Example> {
    let asked: std::collections::HashSet<String> = words(question).into_iter().collect();
    let mut scored: Vec<(f64, Example)> = examples
        .into_iter()
        .map(|e| {
            let theirs: std::collections::HashSet<String> =
                words(&e.question).into_iter().collect();
            let union = asked.union(&theirs).count().max(1) as f64;
            let similar = asked.intersection(&theirs).count() as f64 / union;
            (similar, e)
        })
        .filter(|(score, _)| *score > 0.0)
        .map(|(similar, e)| (similar + focus_bonus(&e.sql, focus), e))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    scored.into_iter().take(n).map(|(_, e)| e).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(q: &str) -> Example {
        Example {
            id: 0,
            question: q.into(),
            sql: format!("-- {q}"),
        }
    }

    #[test]
    fn the_most_similar_examples_come_first() {
        let examples = vec![
            ex("How many orders were shipped?"),
            ex("Top customers by revenue in 2023"),
            ex("Average product price"),
        ];
        let chosen = most_similar(
            "top 5 customers by revenue in 2024",
            examples,
            2,
            &Focus::default(),
        );
        assert_eq!(chosen[0].question, "Top customers by revenue in 2023");
        assert_eq!(chosen.len(), 1, "examples sharing no word are left out");
    }

    #[test]
    fn among_similar_examples_those_over_the_questions_tables_and_values_come_first() {
        let sql = |q: &str, sql: &str| Example {
            id: 0,
            question: q.into(),
            sql: sql.into(),
        };
        let examples = vec![
            sql(
                "How many orders per month?",
                "SELECT count(*) FROM invoices GROUP BY 1",
            ),
            sql(
                "How many orders per day?",
                "SELECT count(*) FROM orders GROUP BY 1",
            ),
            sql(
                "How many orders per week?",
                "SELECT count(*) FROM orders WHERE status = 'shipped' GROUP BY 1",
            ),
        ];
        let focus = Focus {
            relations: vec!["orders".into()],
            values: vec!["Shipped".into()],
        };
        let chosen = most_similar("How many shipped orders per year?", examples, 3, &focus);
        let questions: Vec<&str> = chosen.iter().map(|e| e.question.as_str()).collect();
        assert_eq!(
            questions,
            [
                "How many orders per week?",
                "How many orders per day?",
                "How many orders per month?"
            ]
        );
    }
}
