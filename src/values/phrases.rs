//! The literals a question names, and trigram similarity (as pg_trgm computes it), for the value
//! index. Pure logic: tested without a backend.

use std::collections::HashSet;

use crate::text::{never_a_value, normalize};

/// Longest phrase, in words, tried against stored values.
const MAX_WORDS: usize = 4;

/// A phrase of the question that may be a stored value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Phrase {
    /// As written in the question.
    pub text: String,
    /// Quoted, or capitalised: worth a fuzzy look-up too.
    pub marked: bool,
}

/// The candidate literals of `question`: quoted strings, then every run of 1 to `MAX_WORDS`
/// words that is not made of stopwords only (capitalised runs are marked), longest first.
pub fn phrases(question: &str) -> Vec<Phrase> {
    let mut out: Vec<Phrase> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    let mut push = |text: &str, marked: bool, out: &mut Vec<Phrase>| {
        let key = normalize(text);
        if key.chars().count() >= 2 && seen.insert(key) {
            out.push(Phrase {
                text: text.trim().to_string(),
                marked,
            });
        }
    };
    // Quoted strings ('x', "x", `x`, and typographic quotes).
    for (open, close) in [('\'', '\''), ('"', '"'), ('`', '`'), ('‘', '’'), ('“', '”')] {
        let mut rest = question;
        while let Some(start) = rest.find(open) {
            let after = &rest[start + open.len_utf8()..];
            let Some(end) = after.find(close) else { break };
            let inside = &after[..end];
            if !inside.trim().is_empty() && inside.len() <= 200 {
                push(inside, true, &mut out);
            }
            rest = &after[end + close.len_utf8()..];
        }
    }
    let words: Vec<&str> = question
        .split(|c: char| c.is_whitespace() || ",;:!?()[]{}\"'`“”‘’".contains(c))
        .map(|w| w.trim_end_matches('.'))
        .filter(|w| !w.is_empty())
        .collect();
    let stop = |w: &str| never_a_value(w);
    let capitalised = |w: &str| w.chars().next().is_some_and(|c| c.is_uppercase());
    let mut runs: Vec<(usize, String, bool)> = Vec::new();
    for start in 0..words.len() {
        for len in 1..=MAX_WORDS.min(words.len() - start) {
            let run = &words[start..start + len];
            // A capitalised word at the very start is just the sentence.
            let marked = run.iter().all(|w| capitalised(w)) && (start > 0 || len > 1);
            // A name may begin or end with a stopword ("The Shopping List"): capitalised runs
            // of several words are kept whole.
            let name = marked && len > 1;
            if !name && (run.iter().all(|w| stop(w)) || stop(run[0]) || stop(run[len - 1])) {
                continue;
            }
            if len == 1 && run[0].chars().count() < 3 {
                continue;
            }
            runs.push((len, run.join(" "), marked));
        }
    }
    runs.sort_by_key(|r| std::cmp::Reverse(r.0));
    for (_, text, marked) in runs {
        push(&text, marked, &mut out);
    }
    out
}

/// pg_trgm's trigrams of a text: lower case, each word padded with two blanks in front and one
/// behind. Each trigram is its three characters packed into a number; the list is sorted and
/// without repeats, so that comparing two is a merge.
pub fn trigrams(text: &str) -> Vec<u64> {
    let mut out = Vec::new();
    for word in text
        .to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let (mut a, mut b) = (' ', ' ');
        for c in word.chars().chain(std::iter::once(' ')) {
            out.push((u64::from(a) << 42) | (u64::from(b) << 21) | u64::from(c));
            (a, b) = (b, c);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// pg_trgm's `similarity`: shared trigrams over all trigrams of both.
pub fn similarity(a: &[u64], b: &[u64]) -> f32 {
    let (mut i, mut j, mut shared) = (0, 0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                shared += 1;
                i += 1;
                j += 1;
            }
        }
    }
    let all = a.len() + b.len() - shared;
    if all == 0 {
        0.0
    } else {
        shared as f32 / all as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(question: &str) -> Vec<String> {
        phrases(question).into_iter().map(|p| p.text).collect()
    }

    #[test]
    fn quoted_strings_and_word_runs_are_candidates() {
        let found = texts("How many heroes have the power 'Death Touch'?");
        assert_eq!(found[0], "Death Touch");
        assert!(found.contains(&"heroes".to_string()));
        assert!(found.contains(&"power".to_string()));
        assert!(!found.contains(&"How".to_string()) && !found.contains(&"the".to_string()));
        // longer runs come before their parts
        let found = texts("orders shipped to New South Wales last year");
        let at = |s: &str| found.iter().position(|f| f == s).unwrap();
        assert!(at("New South Wales") < at("Wales"));
        let marked: Vec<bool> = phrases("Which books did Italo Calvino write?")
            .into_iter()
            .filter(|p| p.text == "Italo Calvino")
            .map(|p| p.marked)
            .collect();
        assert_eq!(marked, [true]);
        // a capitalised name is kept whole, stopwords and all
        let found = texts("notes about the Shopping List of The Who");
        assert!(found.contains(&"Shopping List".to_string()), "{found:?}");
        assert!(found.contains(&"The Who".to_string()), "{found:?}");
        assert!(!found.contains(&"List".to_string()), "{found:?}");
    }

    #[test]
    fn similarity_is_pg_trgms() {
        let a = trigrams("word");
        assert_eq!(a.len(), 5, "'  w', ' wo', 'wor', 'ord', 'rd '");
        assert!((similarity(&a, &trigrams("word")) - 1.0).abs() < 1e-6);
        // pg_trgm: similarity('word', 'two words') = 0.36363637
        assert!((similarity(&a, &trigrams("two words")) - 0.363_636_37).abs() < 1e-6);
        assert!(similarity(&trigrams("Death Touch"), &trigrams("death touch")) > 0.99);
        assert!(similarity(&trigrams("Deth Touch"), &trigrams("Death Touch")) > 0.5);
    }
}
