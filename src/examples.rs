//! Verified examples: question -> SQL pairs that a human approved (`nl_example_add`, in
//! `sql/examples.sql`). The few most similar to a question go into the prompt, the cheapest way
//! to teach a model a database's conventions.

use pgrx::prelude::*;

use crate::error::{Error, Result};
use crate::schema::{extension_schema, words};
use crate::subxact;

/// Stores a verified example after the guard accepted its SQL, as the caller (who needs INSERT
/// on `nl_examples`); returns its id. The SQL is checked in the sandbox on the caller's search
/// path (it is the caller's SQL); the insert runs on the pinned one.
pub fn add(question: &str, sql: &str) -> Result<i64> {
    crate::exec::check(sql)?;
    let insert = format!(
        "INSERT INTO {}.nl_examples (question, sql) VALUES ($1, $2) RETURNING id",
        extension_schema()?
    );
    subxact::pinned(|| {
        Spi::connect_mut(|client| {
            client
                .update(&insert, Some(1), &[question.into(), sql.into()])?
                .first()
                .get_one::<i64>()
        })
    })
    .map_err(|e| Error::internal(format!("storing the example failed: {e}")))?
    .ok_or_else(|| Error::internal("the example got no id"))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    pub question: String,
    pub sql: String,
}

/// Up to `n` examples most similar to `question` (word overlap), best first. None when the
/// caller may not read the examples.
pub fn similar(question: &str, n: usize) -> Result<Vec<Example>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let table = format!("{}.nl_examples", extension_schema()?);
    let examples: Vec<Example> = crate::subxact::pinned(|| {
        Spi::connect(|client| {
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
            let rows = client.select(
                &format!("SELECT question, sql FROM {table} ORDER BY id"),
                None,
                &[],
            )?;
            let mut examples = Vec::new();
            for row in rows {
                let question = row.get::<String>(1)?.unwrap_or_default();
                let sql = row.get::<String>(2)?.unwrap_or_default();
                examples.push(Example { question, sql });
            }
            Ok::<_, pgrx::spi::Error>(examples)
        })
    })
    .map_err(|e| Error::internal(format!("reading the verified examples failed: {e}")))?;
    Ok(most_similar(question, examples, n))
}

/// Ranks by Jaccard similarity of the questions' words; only examples sharing a word count.
fn most_similar(question: &str, examples: Vec<Example>, n: usize) -> Vec<Example> {
    let asked: std::collections::HashSet<String> = words(question).into_iter().collect();
    let mut scored: Vec<(f64, Example)> = examples
        .into_iter()
        .map(|e| {
            let theirs: std::collections::HashSet<String> =
                words(&e.question).into_iter().collect();
            let union = asked.union(&theirs).count().max(1) as f64;
            (asked.intersection(&theirs).count() as f64 / union, e)
        })
        .filter(|(score, _)| *score > 0.0)
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    scored.into_iter().take(n).map(|(_, e)| e).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(q: &str) -> Example {
        Example {
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
        let chosen = most_similar("top 5 customers by revenue in 2024", examples, 2);
        assert_eq!(chosen[0].question, "Top customers by revenue in 2023");
        assert_eq!(chosen.len(), 1, "examples sharing no word are left out");
    }
}
