//! Verified examples as templates: an example answers its own question again, and the same
//! question with other values, without asking the model.
//!
//! A literal of an example's SQL whose text its question names (a string or a number, case
//! aside) is a parameter: the example "orders of customers in Germany" with `country =
//! 'Germany'` is the template "orders of customers in …" with `country = …`. A new question
//! matches a template when it is the example's question word for word outside the parameters;
//! a string parameter takes the new value only when the value index finds it stored, exactly
//! (case and blank space aside), in a column that also stores the example's value, and takes
//! it as stored; a number takes any number. The SQL is the example's with the values replaced,
//! checked and run like any other query; when it fails or comes back empty, the model is asked
//! as usual. Only questions without earlier turns are matched: a follow-up means more than its
//! words.
//!
//! An example's question may mark its parameters itself, in braces: "orders of customers in
//! {Germany} since 2020" makes `'Germany'` a parameter and keeps `2020` fixed. With marks, only
//! marked values are parameters, and `nl_example_add` refuses a mark that names no literal of
//! the SQL (`unmarked`). The braces are not shown to the model.

use crate::examples::Example;
use crate::literals::{literals, LiteralKind};
use crate::schema::quote_literal;

/// Words a parameter of a template may take in a new question, at most.
const MAX_PARAMETER_WORDS: usize = 6;
/// Parameters of one template, at most (more make matching costly and mistakes likely).
const MAX_PARAMETERS: usize = 4;
/// Words of an example's question, at most, for it to be a template (matching recurses once
/// per word).
const MAX_TEMPLATE_WORDS: usize = 100;
/// Literals of an example's SQL, at most, for it to be a template: each is looked for in the
/// question, and an example's SQL (another role's, up to 400 kB) may hold tens of thousands.
const MAX_TEMPLATE_LITERALS: usize = 64;

/// A verified example instantiated for a question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instantiated {
    pub example_id: i64,
    pub sql: String,
}

/// A word of a question: its place in the text and its lower-case form. Words are runs of
/// letters and digits, with `.` inside a number (`2.5`).
#[derive(Debug, Clone)]
struct Word {
    start: usize,
    end: usize,
    text: String,
}

fn question_words(text: &str) -> Vec<Word> {
    let mut found = Vec::new();
    let mut start = None;
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    for (k, &(i, c)) in chars.iter().enumerate() {
        let inside_number = c == '.'
            && start.is_some()
            && k > 0
            && chars[k - 1].1.is_ascii_digit()
            && chars.get(k + 1).is_some_and(|(_, n)| n.is_ascii_digit());
        if c.is_alphanumeric() || inside_number {
            start.get_or_insert(i);
        } else if let Some(s) = start.take() {
            found.push(Word {
                start: s,
                end: i,
                text: text[s..i].to_lowercase(),
            });
        }
    }
    if let Some(s) = start {
        found.push(Word {
            start: s,
            end: text.len(),
            text: text[s..].to_lowercase(),
        });
    }
    found
}

/// The byte ranges of `question` inside braces (`{Germany}`), the text of each mark.
fn marks(question: &str) -> Vec<(usize, usize)> {
    let mut found = Vec::new();
    let mut open = None;
    for (i, c) in question.char_indices() {
        match c {
            '{' => open = Some(i + 1),
            '}' => {
                if let Some(start) = open.take() {
                    found.push((start, i));
                }
            }
            _ => {}
        }
    }
    found
}

/// `question` as the model is shown it: without the braces that mark parameters.
pub fn unmarked(question: &str) -> String {
    if marks(question).is_empty() {
        return question.to_string();
    }
    question.replace(['{', '}'], "")
}

/// Why `question` cannot be stored with `sql` as an example, when it marks parameters that
/// are not literals of the SQL, or more than a template may have.
pub fn check_marks(question: &str, sql: &str) -> Result<(), String> {
    let spans = marks(question);
    if spans.is_empty() {
        return Ok(());
    }
    let example = Example {
        id: 0,
        question: question.to_string(),
        sql: sql.to_string(),
    };
    let Some(template) = Template::of(&example) else {
        return Err(format!(
            "a question that marks parameters may have at most {MAX_TEMPLATE_WORDS} words and \
             {MAX_PARAMETERS} parameters, and its SQL at most {MAX_TEMPLATE_LITERALS} literals"
        ));
    };
    match spans.iter().find(|&&(start, end)| {
        let named = question_words(&question[start..end]);
        !template.parameters.iter().any(|p| {
            let words = question_words(&p.value);
            words.len() == named.len() && words.iter().zip(&named).all(|(a, b)| a.text == b.text)
        })
    }) {
        Some(&(start, end)) => Err(format!(
            "the question marks {{{}}} as a parameter, but the SQL has no literal with that \
             value written where the mark is the only place the question names it",
            &question[start..end]
        )),
        None => Ok(()),
    }
}

/// A piece of a template's question: a word, or parameter `n`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Word(String),
    Parameter(usize),
}

/// A parameter of a template: a literal of its SQL, and every place it is written there.
#[derive(Debug)]
struct Parameter {
    kind: LiteralKind,
    value: String,
    places: Vec<(usize, usize)>,
}

/// An example as a template: its question in pieces, its SQL, and its parameters.
#[derive(Debug)]
struct Template<'a> {
    pieces: Vec<Piece>,
    sql: &'a str,
    parameters: Vec<Parameter>,
}

impl<'a> Template<'a> {
    fn of(example: &'a Example) -> Option<Template<'a>> {
        let words = question_words(&example.question);
        if words.len() > MAX_TEMPLATE_WORDS {
            return None;
        }
        let mut pieces: Vec<Piece> = words.iter().map(|w| Piece::Word(w.text.clone())).collect();
        // With marks, only a literal that fills one mark exactly is a parameter: each word's
        // mark, spliced along with the pieces.
        let spans = marks(&example.question);
        if spans.len() > MAX_TEMPLATE_WORDS {
            return None;
        }
        let mut marked: Vec<Option<usize>> = words
            .iter()
            .map(|w| spans.iter().position(|&(s, e)| w.start >= s && w.end <= e))
            .collect();
        let mut parameters: Vec<Parameter> = Vec::new();
        let literals = literals(&example.sql);
        if literals.len() > MAX_TEMPLATE_LITERALS {
            return None;
        }
        for literal in literals {
            if let Some(p) = parameters
                .iter_mut()
                .find(|p| p.kind == literal.kind && p.value == literal.value)
            {
                p.places.push((literal.start, literal.end));
                continue;
            }
            let named: Vec<String> = question_words(&literal.value)
                .into_iter()
                .map(|w| w.text)
                .collect();
            if named.is_empty() || named.len() > MAX_PARAMETER_WORDS {
                continue;
            }
            // Where the question names it: exactly once, or it is not a parameter.
            let places: Vec<usize> = (0..pieces.len().saturating_sub(named.len() - 1))
                .filter(|&at| {
                    named
                        .iter()
                        .enumerate()
                        .all(|(k, w)| matches!(&pieces[at + k], Piece::Word(p) if p == w))
                })
                .filter(|&at| spans.is_empty() || fills_mark(&marked, at, named.len()))
                .collect();
            let [at] = places[..] else { continue };
            if parameters.len() == MAX_PARAMETERS {
                return None;
            }
            pieces.splice(at..at + named.len(), [Piece::Parameter(parameters.len())]);
            marked.splice(at..at + named.len(), [None]);
            parameters.push(Parameter {
                kind: literal.kind,
                value: literal.value,
                places: vec![(literal.start, literal.end)],
            });
        }
        Some(Template {
            pieces,
            sql: &example.sql,
            parameters,
        })
    }

    /// The text `question` gives each parameter, when the question is this template's.
    fn match_question(&self, question: &str) -> Option<Vec<String>> {
        let words = question_words(question);
        let mut taken = vec![None; self.parameters.len()];
        fits(&self.pieces, &words, question, &mut taken)
            .then(|| taken.into_iter().map(Option::unwrap_or_default).collect())
    }

    /// The SQL with each parameter replaced by its new literal.
    fn with_values(&self, values: &[String]) -> String {
        let mut places: Vec<(usize, usize, String)> = Vec::new();
        for (parameter, value) in self.parameters.iter().zip(values) {
            let literal = match parameter.kind {
                LiteralKind::Text => quote_literal(value),
                LiteralKind::Number => value.clone(),
            };
            places.extend(
                parameter
                    .places
                    .iter()
                    .map(|&(s, e)| (s, e, literal.clone())),
            );
        }
        places.sort_by_key(|p| std::cmp::Reverse(p.0));
        let mut sql = self.sql.to_string();
        for (start, end, literal) in places {
            sql.replace_range(start..end, &literal);
        }
        sql
    }
}

/// Whether the `n` words from `at` are all of one mark, and all of it.
fn fills_mark(marked: &[Option<usize>], at: usize, n: usize) -> bool {
    let Some(mark) = marked.get(at).copied().flatten() else {
        return false;
    };
    marked[at..at + n].iter().all(|m| *m == Some(mark))
        && marked.iter().filter(|m| **m == Some(mark)).count() == n
}

/// Whether `words` (of `text`) fit `pieces`, filling `taken` with what each parameter took
/// (the question's own text, from its first word to its last).
fn fits(pieces: &[Piece], words: &[Word], text: &str, taken: &mut [Option<String>]) -> bool {
    match pieces.split_first() {
        None => words.is_empty(),
        Some((Piece::Word(w), rest)) => {
            words.first().is_some_and(|first| first.text == *w)
                && fits(rest, &words[1..], text, taken)
        }
        Some((Piece::Parameter(p), rest)) => {
            for n in 1..=MAX_PARAMETER_WORDS.min(words.len()) {
                let value = text[words[0].start..words[n - 1].end].to_string();
                taken[*p] = Some(value);
                if fits(rest, &words[n..], text, taken) {
                    return true;
                }
            }
            taken[*p] = None;
            false
        }
    }
}

/// Whether an instantiated SQL differs from its example's only in constants that now read as
/// one of the new values (`lexer::only_values_differ`, PostgreSQL's own lexer).
pub type SameShape<'a> = &'a dyn Fn(&str, &str, &[(LiteralKind, &str)]) -> bool;

/// The first of `examples` that answers `question` as a template, instantiated. `stored`
/// finds where a text is stored: the columns that store it exactly, each with the value as
/// stored (the value index); a string parameter takes a new value only from a column that
/// also stores the example's value. An instantiation that `same_shape` does not confirm is
/// not used (the literal reader saw a literal where the lexer reads something else).
pub fn instantiate(
    question: &str,
    examples: &[Example],
    stored: &dyn Fn(&str) -> Vec<(String, String)>,
    same_shape: SameShape,
) -> Option<Instantiated> {
    examples.iter().find_map(|example| {
        let template = Template::of(example)?;
        let taken = template.match_question(question)?;
        let mut values = Vec::with_capacity(taken.len());
        for (parameter, new) in template.parameters.iter().zip(taken) {
            let original = &parameter.value;
            match parameter.kind {
                LiteralKind::Number => {
                    if !new.parse::<f64>().is_ok_and(f64::is_finite) {
                        return None;
                    }
                    values.push(new);
                }
                LiteralKind::Text if new.eq_ignore_ascii_case(original) => {
                    values.push(original.clone())
                }
                LiteralKind::Text => {
                    let columns: Vec<String> = stored(original)
                        .into_iter()
                        .map(|(column, _)| column)
                        .collect();
                    let (_, value) = stored(&new)
                        .into_iter()
                        .find(|(column, _)| columns.contains(column))?;
                    values.push(value);
                }
            }
        }
        let sql = template.with_values(&values);
        let new: Vec<(LiteralKind, &str)> = template
            .parameters
            .iter()
            .zip(&values)
            .map(|(parameter, value)| (parameter.kind, value.as_str()))
            .collect();
        same_shape(&example.sql, &sql, &new).then_some(Instantiated {
            example_id: example.id,
            sql,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lexer's confirmation, which needs a backend (`lexer`): every instantiation here.
    fn agree(_: &str, _: &str, _: &[(LiteralKind, &str)]) -> bool {
        true
    }

    fn example(id: i64, question: &str, sql: &str) -> Example {
        Example {
            id,
            question: question.into(),
            sql: sql.into(),
        }
    }

    /// A value index of two columns.
    fn stored(text: &str) -> Vec<(String, String)> {
        let countries = ["Germany", "France", "Costa Rica"];
        let statuses = ["shipped", "cancelled"];
        let mut found = Vec::new();
        for c in countries {
            if c.eq_ignore_ascii_case(text.trim()) {
                found.push(("customers.country".to_string(), c.to_string()));
            }
        }
        for s in statuses {
            if s.eq_ignore_ascii_case(text.trim()) {
                found.push(("orders.status".to_string(), s.to_string()));
            }
        }
        found
    }

    #[test]
    fn a_template_takes_other_values_that_the_same_column_stores() {
        let examples = vec![example(
            7,
            "How many orders of customers in Germany were shipped? Top 5 only.",
            "SELECT count(*) FROM orders o JOIN customers c USING (customer_id) \
             WHERE c.country = 'Germany' AND o.status = 'shipped' LIMIT 5",
        )];
        let got = instantiate(
            "how many orders of customers in Costa Rica were cancelled? top 10 only",
            &examples,
            &stored,
            &agree,
        )
        .expect("a match");
        assert_eq!(got.example_id, 7);
        assert_eq!(
            got.sql,
            "SELECT count(*) FROM orders o JOIN customers c USING (customer_id) \
             WHERE c.country = 'Costa Rica' AND o.status = 'cancelled' LIMIT 10"
        );
        // What the lexer is asked to confirm: the example, the new SQL and the new values.
        let asked = std::cell::RefCell::new(Vec::new());
        let record = |before: &str, after: &str, values: &[(LiteralKind, &str)]| {
            asked.borrow_mut().push((
                before == examples[0].sql,
                after.to_string(),
                values
                    .iter()
                    .map(|&(k, v)| (k, v.to_string()))
                    .collect::<Vec<_>>(),
            ));
            false
        };
        assert_eq!(
            instantiate(
                "how many orders of customers in Costa Rica were cancelled? top 10 only",
                &examples,
                &stored,
                &record
            ),
            None,
            "an instantiation the lexer does not confirm is not used"
        );
        let text = |v: &str| (LiteralKind::Text, v.to_string());
        assert_eq!(
            asked.into_inner(),
            [(
                true,
                got.sql.clone(),
                vec![
                    text("Costa Rica"),
                    text("cancelled"),
                    (LiteralKind::Number, "10".to_string())
                ]
            )]
        );
        // The same question is the example itself.
        let same = instantiate(
            "How many orders of customers in Germany were shipped? Top 5 only.",
            &examples,
            &stored,
            &agree,
        )
        .unwrap();
        assert_eq!(same.sql, examples[0].sql);
    }

    #[test]
    fn marked_parameters_are_the_only_ones() {
        let marked = vec![example(
            4,
            "orders of customers in {Germany} since 2020",
            "SELECT * FROM orders o JOIN customers c USING (customer_id) \
             WHERE c.country = 'Germany' AND o.year >= 2020",
        )];
        let got = instantiate(
            "orders of customers in France since 2020",
            &marked,
            &stored,
            &agree,
        );
        assert!(got.unwrap().sql.contains("'France' AND o.year >= 2020"));
        // 2020 is not marked: another year is another question.
        assert_eq!(
            instantiate(
                "orders of customers in France since 2021",
                &marked,
                &stored,
                &agree
            ),
            None
        );
        // Without marks, both literals the question names are parameters.
        let unmarked_example = vec![example(5, &unmarked(&marked[0].question), &marked[0].sql)];
        assert_eq!(
            unmarked_example[0].question,
            "orders of customers in Germany since 2020"
        );
        assert!(instantiate(
            "orders of customers in France since 2021",
            &unmarked_example,
            &stored,
            &agree
        )
        .is_some());
        // A question may name a marked value elsewhere too: the mark decides which place.
        let twice = vec![example(
            6,
            "Germany orders for {Germany}",
            "SELECT * FROM orders WHERE country = 'Germany'",
        )];
        let got = instantiate("Germany orders for France", &twice, &stored, &agree);
        assert!(got.unwrap().sql.ends_with("'France'"));
    }

    #[test]
    fn a_mark_must_name_a_literal_of_the_sql() {
        let sql = "SELECT * FROM orders WHERE country = 'Germany' LIMIT 5";
        assert_eq!(check_marks("top {5} orders from {Germany}", sql), Ok(()));
        assert_eq!(check_marks("top 5 orders from Germany", sql), Ok(()));
        let error = check_marks("top 5 orders from {France}", sql).unwrap_err();
        assert!(error.contains("{France}"), "{error}");
        // part of a literal is not a parameter
        assert!(check_marks("orders from {Ger}many", sql).is_err());
        assert!(
            check_marks("{a} {b} {c} {d} {e}", "SELECT 'a', 'b', 'c', 'd', 'e'")
                .unwrap_err()
                .contains("at most")
        );
    }

    #[test]
    fn a_template_refuses_what_it_cannot_vouch_for() {
        let examples = vec![example(
            1,
            "orders of customers in Germany",
            "SELECT * FROM orders o JOIN customers c USING (customer_id) WHERE c.country = 'Germany'",
        )];
        // a value no column stores, a value of another column, other words, a number for text
        for question in [
            "orders of customers in Atlantis",
            "orders of customers in shipped",
            "all orders of customers in France",
            "orders of customers from France",
        ] {
            assert_eq!(
                instantiate(question, &examples, &stored, &agree),
                None,
                "{question}"
            );
        }
        let numbers = vec![example(
            2,
            "the 5 largest orders",
            "SELECT * FROM orders LIMIT 5",
        )];
        assert!(instantiate("the 12 largest orders", &numbers, &stored, &agree).is_some());
        assert_eq!(
            instantiate("the few largest orders", &numbers, &stored, &agree),
            None
        );
        // SQL of more literals than a template looks at is no template.
        let many = vec![example(
            4,
            "the 5 largest orders, many",
            &format!(
                "SELECT * FROM orders WHERE id NOT IN ({}) LIMIT 5",
                (0..MAX_TEMPLATE_LITERALS)
                    .map(|i| i.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )];
        assert_eq!(
            instantiate("the 12 largest orders, many", &many, &stored, &agree),
            None
        );
        // A value the question names twice is no parameter: only the same question matches.
        let twice = vec![example(
            3,
            "Germany orders for Germany",
            "SELECT * FROM orders WHERE country = 'Germany'",
        )];
        assert_eq!(
            instantiate("France orders for France", &twice, &stored, &agree),
            None
        );
    }
}
