//! Choosing the relations a question needs when the whole schema does not fit the prompt
//! budget: lexical relevance (names, comments, sample values; light stemming and synonyms),
//! then the foreign-key neighbours of the best hits so that joins stay possible, then the rest
//! by relevance, as long as they fit. Pure logic: tested without a backend.

use std::collections::{HashMap, HashSet};

use crate::text::{name_tokens, stem, words};

/// What a relation can be found by, prepared once per schema load.
#[derive(Debug, Clone, Default)]
pub struct Terms {
    pub name: HashSet<String>,
    pub columns: HashSet<String>,
    pub comments: HashSet<String>,
    pub values: HashSet<String>,
}

/// Words that ask for the same data under different names (one direction is enough: both
/// words are added to the question's terms).
const SYNONYMS: &[(&str, &[&str])] = &[
    ("revenue", &["amount", "price", "total", "sale", "payment"]),
    ("sale", &["order", "amount", "revenue"]),
    ("customer", &["client", "buyer", "user"]),
    ("client", &["customer"]),
    ("employee", &["staff", "worker"]),
    ("staff", &["employee"]),
    ("product", &["item", "article"]),
    ("item", &["product"]),
    ("purchase", &["order"]),
    ("spend", &["amount", "price", "payment", "order"]),
    ("cost", &["price", "amount"]),
    ("country", &["nation"]),
    ("nation", &["country"]),
    ("city", &["town", "location"]),
    ("year", &["date"]),
    ("month", &["date"]),
    ("day", &["date"]),
    ("when", &["date", "time"]),
    ("age", &["birth", "born"]),
    ("old", &["age", "birth"]),
    ("salary", &["pay", "wage"]),
    ("teacher", &["instructor", "professor"]),
    ("student", &["pupil"]),
    ("movie", &["film"]),
    ("film", &["movie"]),
];

/// The question's terms, with synonyms added. Numbers and one- or two-letter words are left
/// out: they match sample values by accident ("A requires B" is not about grades A and B).
pub fn question_terms(question: &str) -> HashSet<String> {
    let mut terms: HashSet<String> = words(question)
        .into_iter()
        .filter(|w| w.chars().count() >= 3 && !w.chars().all(|c| c.is_ascii_digit()))
        .collect();
    let found: Vec<String> = terms.iter().cloned().collect();
    for term in found {
        if let Some((_, more)) = SYNONYMS.iter().find(|(w, _)| *w == term) {
            terms.extend(more.iter().map(|m| m.to_string()));
        }
    }
    terms
}

/// How relevant a relation is to the question's terms.
pub fn score(terms: &Terms, question: &HashSet<String>) -> f64 {
    // The size of the intersection, looked up from the smaller side: a relation's terms are
    // few, a long question's many.
    let hits = |set: &HashSet<String>| {
        let (small, large) = if set.len() <= question.len() {
            (set, question)
        } else {
            (question, set)
        };
        small.iter().filter(|t| large.contains(*t)).count() as f64
    };
    3.0 * hits(&terms.name)
        + 1.5 * hits(&terms.columns)
        + hits(&terms.comments)
        + 2.0 * hits(&terms.values)
}

/// The relations' names, and their multi-word column names, keyed by their words (the last one
/// stemmed): finding the ones a question names costs the question's length times the longest
/// name's, not the schema's size, however many names are alike.
#[derive(Debug, Default)]
pub struct NameIndex {
    /// The relations each name finds, by its words joined with a space (the last one stemmed).
    names: HashMap<String, Vec<usize>>,
    /// How many words the names have, ascending.
    lengths: Vec<usize>,
}

/// A name's key: its words with a space between them (`name_tokens` has none in a word), the
/// last one stemmed.
fn name_key(words: &[String], last_stem: &str) -> String {
    let mut key = String::new();
    for word in words {
        key.push_str(word);
        key.push(' ');
    }
    key.push_str(last_stem);
    key
}

impl NameIndex {
    /// Adds a name (its `name_tokens`) that finds `relation`.
    pub fn add(&mut self, name: Vec<String>, relation: usize) {
        let Some((last, before)) = name.split_last() else {
            return;
        };
        let found = self.names.entry(name_key(before, &stem(last))).or_default();
        // A relation's names are added together: one alike to the last adds nothing.
        if found.last() != Some(&relation) {
            found.push(relation);
        }
        if let Err(at) = self.lengths.binary_search(&name.len()) {
            self.lengths.insert(at, name.len());
        }
    }

    /// The relations `question` names, ascending: a name's words in a row, the last one possibly
    /// inflected (`widget_0731`, "order items" for `order_item`, "customers" for `customer`).
    /// Each name is taken once, however often the question says it.
    pub fn named_in(&self, question: &str) -> Vec<usize> {
        let tokens = name_tokens(question);
        let stems: Vec<String> = tokens.iter().map(|t| stem(t)).collect();
        let mut taken: HashSet<String> = HashSet::default();
        let mut found = Vec::new();
        for at in 0..tokens.len() {
            for &length in &self.lengths {
                let end = at + length;
                let (Some(before), Some(last)) = (tokens.get(at..end - 1), stems.get(end - 1))
                else {
                    break;
                };
                let key = name_key(before, last);
                if let Some(relations) = self.names.get(&key) {
                    if taken.insert(key) {
                        found.extend_from_slice(relations);
                    }
                }
            }
        }
        found.sort_unstable();
        found.dedup();
        found
    }
}

/// One relation as retrieval sees it.
pub struct Candidate<'a> {
    pub terms: &'a Terms,
    /// Estimated prompt tokens of its rendering.
    pub tokens: usize,
    /// Indices of relations it references or is referenced by.
    pub neighbours: &'a [usize],
}

/// How many times `budget` the relations of `must` may take together: the question chose them
/// (a caller may name every relation it sees, in a question or in the SQL it asks to fix), and
/// `prompt_budget` bounds what one role's call costs the endpoint everybody shares.
pub const MUST_BUDGETS: usize = 2;

/// Indices of the relations to show, in schema order: every relation when all fit `budget`;
/// otherwise, first those in `must` (the question names them, or its values are stored there),
/// the most relevant first, beyond the budget up to `MUST_BUDGETS` times it, then the best hits
/// with their foreign-key neighbours, then the rest by relevance, as long as they fit. The
/// most relevant of `must`, or without it the best hit, is always shown.
pub fn select(
    candidates: &[Candidate],
    question: &str,
    budget: usize,
    must: &[usize],
) -> Vec<usize> {
    let total: usize = candidates.iter().map(|c| c.tokens).sum();
    if total <= budget {
        return (0..candidates.len()).collect();
    }
    let terms = question_terms(question);
    let scores: Vec<f64> = candidates.iter().map(|c| score(c.terms, &terms)).collect();
    let mut by_score: Vec<usize> = (0..candidates.len()).collect();
    by_score.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]).then(a.cmp(b)));

    // The best hits first, then their neighbours, then everything else by relevance.
    let top = scores.iter().copied().fold(0.0, f64::max);
    let hits: Vec<usize> = by_score
        .iter()
        .copied()
        .take_while(|i| scores[*i] > 0.0 && scores[*i] >= top / 3.0)
        .collect();
    let mut order: Vec<usize> = hits.clone();
    for &i in must.iter().chain(&hits) {
        order.extend(candidates[i].neighbours.iter().copied());
    }
    order.extend(by_score.iter().copied());

    let mut chosen = vec![false; candidates.len()];
    let mut used = 0;
    let mut forced: Vec<usize> = must
        .iter()
        .copied()
        .filter(|&i| i < candidates.len())
        .collect();
    forced.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]));
    for i in forced {
        if !chosen[i] && (used == 0 || used + candidates[i].tokens <= MUST_BUDGETS * budget) {
            chosen[i] = true;
            used += candidates[i].tokens;
        }
    }
    for (rank, i) in order.into_iter().enumerate() {
        if chosen[i] {
            continue;
        }
        if used + candidates[i].tokens <= budget || (rank == 0 && must.is_empty()) {
            chosen[i] = true;
            used += candidates[i].tokens;
        }
    }
    (0..candidates.len()).filter(|i| chosen[*i]).collect()
}

/// Estimated tokens of a text: about four characters each for schema-like text.
pub fn estimate_tokens(text: &str) -> usize {
    text.len().div_ceil(4)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terms(name: &str, columns: &[&str], values: &[&str]) -> Terms {
        Terms {
            name: words(name).into_iter().collect(),
            columns: columns.iter().flat_map(|c| words(c)).collect(),
            comments: HashSet::default(),
            values: values.iter().flat_map(|v| words(v)).collect(),
        }
    }

    #[test]
    fn question_terms_have_synonyms_and_no_noise() {
        assert!(question_terms("Which customers spent the most revenue?").contains("amount"));
        let noise = question_terms("courses where A requires B, depth 2");
        assert!(noise.contains(&stem("courses")) && !noise.contains("b") && !noise.contains("2"));
    }

    #[test]
    fn everything_is_shown_when_it_fits() {
        let t = terms("a", &[], &[]);
        let c = |tokens| Candidate {
            terms: &t,
            tokens,
            neighbours: &[],
        };
        assert_eq!(select(&[c(10), c(10)], "anything", 20, &[]), vec![0, 1]);
    }

    #[test]
    fn the_best_hits_and_their_neighbours_are_chosen() {
        let customers = terms("customers", &["name", "country"], &["Germany"]);
        let orders = terms("orders", &["customer_id", "amount"], &[]);
        let parts = terms("parts", &["weight"], &[]);
        let suppliers = terms("suppliers", &["city"], &[]);
        let candidates = vec![
            Candidate {
                terms: &parts,
                tokens: 50,
                neighbours: &[3],
            },
            Candidate {
                terms: &customers,
                tokens: 50,
                neighbours: &[2],
            },
            Candidate {
                terms: &orders,
                tokens: 50,
                neighbours: &[1],
            },
            Candidate {
                terms: &suppliers,
                tokens: 50,
                neighbours: &[0],
            },
        ];
        // customers match by name and value; orders come along as their neighbour
        assert_eq!(
            select(&candidates, "How many customers live in Germany?", 100, &[]),
            vec![1, 2]
        );
        // synonyms: "revenue" finds the amount column
        assert_eq!(select(&candidates, "total revenue", 50, &[]), vec![2]);
        // the best hit is shown even when it alone exceeds the budget
        assert_eq!(select(&candidates, "weight of parts", 10, &[]), vec![0]);
        // what must be shown is shown, whatever the budget, with room left for the best hit
        assert_eq!(select(&candidates, "weight of parts", 60, &[3]), vec![3]);
        assert_eq!(
            select(&candidates, "weight of parts", 120, &[3]),
            vec![0, 3]
        );
        // What must be shown takes twice the budget at most, the most relevant first.
        assert_eq!(
            select(&candidates, "weight of parts", 50, &[1, 2, 3, 0]),
            vec![0, 1]
        );
        assert_eq!(
            select(&candidates, "weight of parts", 10, &[1, 2, 0]),
            vec![0]
        );
    }

    #[test]
    fn a_name_in_the_question_is_found_exactly_or_nearly() {
        let mut index = NameIndex::default();
        let names = [
            "widget_0731",
            "widget_0730",
            "order_item",
            "customer",
            "Customers",
            "widget",
        ];
        for (relation, name) in names.iter().enumerate() {
            index.add(name_tokens(name), relation);
        }
        // "widget" is a word of the question too (widget_0731); widget_0730 is not named
        assert_eq!(
            index.named_in("How many rows does widget_0731 have? And OrderItems, customers?"),
            vec![0, 2, 3, 4, 5]
        );
        assert_eq!(index.named_in("order"), Vec::<usize>::new());
        assert_eq!(
            index.named_in("the widget 0730 of an order item"),
            vec![1, 2, 5]
        );
    }

    #[test]
    fn names_alike_and_a_question_that_repeats_them_find_each_relation_once() {
        let mut index = NameIndex::default();
        for relation in 0..50 {
            for name in ["a_a", "A_a", "a__a", "aA", "a"] {
                index.add(name_tokens(name), relation);
            }
        }
        let question = "a a ".repeat(2000);
        assert_eq!(index.named_in(&question), (0..50).collect::<Vec<_>>());
        assert_eq!(index.names.values().map(Vec::len).sum::<usize>(), 100);
    }
}
