//! The generate → run → repair loop, and its bookkeeping.
//!
//! Rows are accepted at once (the model is never asked to re-judge a working query), unless the
//! query compares a column with a string the column does not store as written (the value
//! index knows all its values and stores it otherwise: `'shipped'` for `'Shipped'`): a count
//! over that is most often zero. Those rows, an error or an empty result go back to the model
//! with everything PostgreSQL and the value index said; every repaired query is run again. An
//! empty result (or questioned rows) that the model confirms by returning the same query ends
//! the loop: empty can be the right answer. The best attempt is kept (rows beat questioned
//! rows beat empty beat error), so a repair can never make a good answer worse: neither a
//! model that fails during a repair nor a write it proposes after a good attempt takes that
//! attempt away. A write ends the run at once; it is the answer (a refusal) only when nothing
//! better came before it.

use std::time::Instant;

use crate::error::{Error, Fault, Result, SqlError, SqlState};
use crate::exec::{Outcome, ResultSet};
use crate::extract::{extract_sql, strip_think};
use crate::hints::Requalified;
use crate::llm::{Completion, Llm, Message};
use crate::progress::{Agreed, Asking, Event, Kind};
use crate::prompt;

#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub sql: String,
    pub outcome: Outcome,
    /// Time to run (or plan) the query.
    pub ms: f64,
    /// Time the model took to write it.
    pub llm_ms: f64,
    /// The first query, an alternative of a vote, or a repair.
    pub kind: Kind,
    /// The result group it was counted in, when there was a vote.
    pub group: Option<usize>,
    /// The endpoint that wrote it, and what the endpoints tried before said.
    pub endpoint: String,
    pub endpoint_failures: Vec<String>,
    /// Why its rows are doubted though it ran, one line each: the strings it compares columns
    /// with that those columns do not store as written (`Database::misread`), the identifiers
    /// it adds up, the keys of different things it compares, the integer aggregates it divides
    /// (`ResultSet::doubts`).
    pub questioned: Vec<String>,
    /// The columns the model qualified by a relation that lacks them, each moved to the
    /// relation of the query that has them (`ae.drug_id → t.drug_id`, or a join condition
    /// swapped): `sql` is the query as it ran after that (`hints::requalify`).
    pub requalified: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The best attempt returned rows (or, when planning, planned).
    Ok,
    /// The best attempt ran and returned no rows.
    Empty,
    /// No attempt succeeded.
    Error,
    /// The model proposed a write; the run ended without executing it.
    Refused,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Empty => "empty",
            Status::Error => "error",
            Status::Refused => "refused",
        }
    }
}

/// Everything that happened while answering one question.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub question: String,
    pub attempts: Vec<Attempt>,
    /// Index of the best attempt, when one succeeded.
    pub best: Option<usize>,
    pub status: Status,
    /// The model confirmed that an empty result is the answer.
    pub confirmed_empty: bool,
    pub llm_calls: u32,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub ms: f64,
    /// The model failed when asked for a repair: the run ended with what it had.
    pub llm_failure: Option<LlmFailure>,
    /// The execution vote among candidates, when there was one: the size of each result
    /// group (in order of first appearance) and the winner.
    pub vote: Option<VoteResult>,
    /// What the model said instead, when it twice in a row answered without a query: the
    /// question is not one the database answers (a greeting, a task for another tool).
    pub said_instead: Option<String>,
    /// The answer budget ended the run before the loop did.
    pub out_of_time: bool,
    /// The endpoint that put the answer's rows in words (`nl_answer`), which received them.
    pub described_by: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoteResult {
    pub groups: Vec<usize>,
    pub winner: Option<usize>,
    /// The alternatives asked for; fewer come back when the answer budget ends some of them.
    pub asked: usize,
    /// How many of the alternatives asked for must give the answer's result for it to be sure
    /// (`Limits::agreement` of them, at least one): one that did not come back does not.
    pub needed: usize,
}

/// A vote that leaves its answer in doubt (see `Run::split_vote`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// Queries that gave the answer's result, at most as many as there were alternatives.
    pub agreed: usize,
    /// The alternatives asked for, and those that came back.
    pub asked: usize,
    pub alternatives: usize,
    /// Another result had at least as many queries as the answer's.
    pub tied: bool,
}

/// When to ask for several candidates and answer with the result most of them agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vote {
    Off,
    /// When the first query fails or comes back empty.
    WhenInDoubt,
    /// After every first query (a vote may then replace a first answer with rows).
    Always,
}

/// A failed model call, as `Error::Llm` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlmFailure {
    pub endpoint: String,
    pub cause: String,
}

/// How the loop may go.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Repairs after the first attempt.
    pub max_repairs: usize,
    /// Whether stored values may reach the model (`sample_values > 0`): without, the values
    /// PostgreSQL quotes in error messages are withheld from repair requests.
    pub share_values: bool,
    pub vote: Vote,
    /// Candidates asked for in a vote.
    pub candidates: usize,
    /// A doubtful answer will be withheld (`abstain = when_in_doubt`): a vote that leaves the
    /// answer in doubt (`Run::split_vote`) ends the run, since no repair can make its
    /// alternatives agree after the fact.
    pub abstain: bool,
    /// The share of a vote's alternatives, in percent, that must give the answer's result for
    /// the answer to be sure (`abstain_agreement`).
    pub agreement: u8,
    /// When the call stops improving its answer (`answer_budget`): no vote or repair is asked
    /// for after it, and a request in flight ends at it. The first query is always waited for.
    pub deadline: Option<Instant>,
}

/// How good an outcome is: a repair replaces the best attempt only when it ranks higher.
/// Questioned rows (got by comparing a column with a string it does not store, or adding up
/// identifiers) rank below other rows: such a query most often counts or sums nothing.
fn rank(outcome: &Outcome, questioned: &[String]) -> u8 {
    match outcome {
        Outcome::Rows(_) | Outcome::Planned | Outcome::Checked if questioned.is_empty() => 3,
        Outcome::Rows(_) | Outcome::Planned | Outcome::Checked => 2,
        Outcome::Empty(_) => 1,
        Outcome::Failed(_) | Outcome::Refused(_) => 0,
    }
}

/// How good an attempt is (`rank`).
fn rank_of(attempt: &Attempt) -> u8 {
    rank(&attempt.outcome, &attempt.questioned)
}

/// SQL compared for "the same query" (the model repeats itself, or stands by an answer):
/// blank space and trailing semicolons do not count, except inside quotes (`'New York'` is not
/// `'New  York'`, nor `"Order Items"` `"Order  Items"`). Never enough to take one query's
/// outcome for the other's (`run_reported`): blank space also ends a `--` comment.
fn same_query(a: &str, b: &str) -> bool {
    let norm = |s: &str| crate::text::single_spaced(s.trim().trim_end_matches(';'));
    norm(a) == norm(b) && crate::literals::quoted(a) == crate::literals::quoted(b)
}

/// What became of an attempt, in one line, as the model may see it: with stored values kept
/// from it, not how many rows (a query can make its count a stored value, `WHERE id <=
/// ascii(<a stored name>)`).
fn result_line(outcome: &Outcome, share_values: bool) -> String {
    match (outcome.result(), outcome.error()) {
        (Some(r), _) if share_values => format!("{} rows", r.rows.len()),
        (Some(r), _) if r.rows.is_empty() => "no rows".to_string(),
        (Some(_), _) => "rows".to_string(),
        (_, Some(e)) => {
            let e = prompt::shown_error(e, share_values);
            format!(
                "ERROR {}: {}",
                e.sqlstate,
                crate::text::one_line(&e.message)
            )
        }
        _ => outcome.label().to_string(),
    }
}

/// Milliseconds since `since`, to two decimals (as traces report times).
pub fn millis(since: Instant) -> f64 {
    (since.elapsed().as_secs_f64() * 1000.0 * 100.0).round() / 100.0
}

/// The database side of the loop: runs (or plans) one query, and says what the schema knows
/// about the tables a failed query names. A trait so that the loop is tested without a backend.
pub trait Database {
    /// Runs `sql`, which `kind` says who wrote (the caller's own SQL, or the model's or an
    /// example's, which may read only what the caller was shown).
    fn run(&mut self, sql: &str, kind: Kind) -> Outcome;
    /// Schema facts that help repair `error` (the columns of the tables `sql` names, the
    /// tables there are), when the error is about names.
    fn hint(&mut self, sql: &str, error: &SqlError) -> Option<String>;
    /// Where the values the question names are stored (the value index), for the repair of an
    /// empty result or a name error.
    fn values(&mut self) -> Option<String> {
        None
    }
    /// The strings `sql` compares columns with that those columns do not store as written,
    /// one line each (`values::Misread`): empty when the value index is off or cannot tell.
    fn misread(&mut self, _sql: &str) -> Vec<String> {
        Vec::new()
    }
    /// `sql` with a column that `error` says its qualifier's relation lacks qualified by the
    /// one relation of the query that has it, or with the primary key that a column said to
    /// be ungrouped depends on grouped (`hints::requalify`).
    fn requalify(&mut self, _sql: &str, _error: &SqlError) -> Option<Requalified> {
        None
    }
}

/// Columns moved to another relation of one query, at most (each move is a query run).
const REQUALIFY_ROUNDS: usize = 3;

/// A result as the vote compares it: the values in column order, rows as a multiset.
fn signature(outcome: &Outcome) -> Option<String> {
    let result = outcome.result()?;
    let mut rows: Vec<String> = result
        .rows
        .iter()
        .map(|row| {
            let value: serde_json::Value = serde_json::from_str(row).unwrap_or_default();
            let cells: Vec<String> = result
                .columns
                .iter()
                .map(|c| value.get(c).map(|v| v.to_string()).unwrap_or_default())
                .collect();
            cells.join("\u{1f}")
        })
        .collect();
    rows.sort();
    Some(format!(
        "{}\u{1e}{}",
        result.columns.len(),
        rows.join("\u{1e}")
    ))
}

/// One answer of the model, run: its SQL, outcome, timings, and the feedback a repair needs.
struct Step {
    sql: String,
    outcome: Outcome,
    ms: f64,
    questioned: Vec<String>,
    feedback: Option<String>,
    requalified: Vec<String>,
}

/// The loop's state and collaborators.
struct Solver<'a> {
    question: &'a str,
    initial: Vec<Message>,
    /// SQL to start from instead of asking the model.
    first: Option<Start<'a>>,
    limits: Limits,
    llm: &'a mut dyn Llm,
    db: &'a mut dyn Database,
    progress: &'a mut dyn FnMut(Event),
    run: Run,
}

impl Solver<'_> {
    /// Whether the answer budget is spent (the run then says so).
    fn out_of_time(&mut self) -> bool {
        let spent = self.limits.deadline.is_some_and(|d| Instant::now() >= d);
        self.run.out_of_time |= spent;
        spent
    }

    /// Takes the SQL out of `content`, runs it and says how to repair it.
    fn step(&mut self, content: &str, attempt: usize, kind: Kind) -> Step {
        let sql = match kind {
            // What an example stores runs as it was checked; what the caller gave, out of a
            // fence it may have been pasted in.
            Kind::Template => Some(crate::extract::as_written(content)),
            Kind::Given => Some(crate::extract::clean(content)),
            _ => extract_sql(content),
        }
        .filter(|s| !s.is_empty());
        let Some(sql) = sql else {
            return Step {
                sql: String::new(),
                outcome: Outcome::Failed(SqlError::new(
                    SqlState::SYNTAX_ERROR,
                    "the model's answer contained no SQL statement",
                )),
                ms: 0.0,
                questioned: Vec::new(),
                feedback: Some(prompt::repair_no_sql(self.question, content)),
                requalified: Vec::new(),
            };
        };
        let ran = Instant::now();
        let outcome = self.run_reported(&sql, attempt, kind);
        let (sql, outcome, requalified) = self.requalify(sql, outcome, attempt, kind);
        let ms = millis(ran);
        let questioned = match &outcome {
            Outcome::Rows(result) => {
                let mut questioned = self.db.misread(&sql);
                questioned.extend(result.doubts.iter().cloned());
                questioned
            }
            Outcome::Empty(_) => self.db.misread(&sql),
            _ => Vec::new(),
        };
        let feedback = self.feedback(&sql, &outcome, &questioned);
        Step {
            sql,
            outcome,
            ms,
            questioned,
            feedback,
            requalified,
        }
    }

    /// The outcome of `sql`, which progress hears of; the same query asked for again (a
    /// candidate, or a confirmation) is not run twice. Only the very same text is the same
    /// here: blank space ends a `--` comment and is part of a string literal, so SQL that is
    /// `same_query` may still do something else, and an attempt's outcome must be its own.
    fn run_reported(&mut self, sql: &str, attempt: usize, kind: Kind) -> Outcome {
        let ran = Instant::now();
        let earlier = self
            .run
            .attempts
            .iter()
            // The caller's own SQL ran without the scope a model's query has: not the same.
            .find(|a| a.sql == sql && (a.kind == Kind::Given) == (kind == Kind::Given))
            .map(|a| a.outcome.clone());
        let outcome = earlier.unwrap_or_else(|| self.db.run(sql, kind));
        (self.progress)(Event::Executed {
            attempt,
            kind,
            sql,
            outcome: &outcome,
            ms: millis(ran),
        });
        outcome
    }

    /// A query that failed because it qualified a column by a relation that lacks it, run
    /// with the column qualified by the relation that has it, or because it read an ungrouped
    /// column that each group has one value of, run with the key that says so grouped
    /// (`Database::requalify`), once per such column. The rewritten query is kept when it runs,
    /// when every name in it resolves and what fails is the query's own logic
    /// (`past_the_names`), or when it fails on another missing column than the model's query
    /// did (`named_another`: the model wrote two wrong names, and one is mended): the repair
    /// then starts from that error, which the model can fix, instead of the name error it kept
    /// repeating. Otherwise the model's own query and error stand, and go back to it.
    fn requalify(
        &mut self,
        sql: String,
        outcome: Outcome,
        attempt: usize,
        kind: Kind,
    ) -> (String, Outcome, Vec<String>) {
        let mut changes = Vec::new();
        let mut rewritten: Option<(String, Outcome)> = None;
        for _ in 0..REQUALIFY_ROUNDS {
            // Each round runs a query: none once the answer budget is spent.
            if self.out_of_time() {
                break;
            }
            let (query, result) = rewritten.as_ref().map_or((&sql, &outcome), |(q, r)| (q, r));
            // A name error raised once the query ran is not the model's (code of another
            // role raised it, with any text): only analysis errors name the model's names.
            let Some(error) = result.error().filter(|e| {
                !e.ran
                    && [SqlState::UNDEFINED_COLUMN, SqlState::GROUPING_ERROR].contains(&e.sqlstate)
            }) else {
                break;
            };
            let Some(fix) = self.db.requalify(query, error) else {
                break;
            };
            let ran = self.run_reported(&fix.sql, attempt, kind);
            changes.push(fix.change);
            rewritten = Some((fix.sql, ran));
        }
        match rewritten {
            Some((query, result))
                if past_the_names(&result) || named_another(&outcome, &result) =>
            {
                (query, result, changes)
            }
            _ => (sql, outcome, Vec::new()),
        }
    }

    /// What the model is told about `outcome` of `sql`; `None` when there is nothing to repair.
    fn feedback(&mut self, sql: &str, outcome: &Outcome, questioned: &[String]) -> Option<String> {
        // A model that returns a query that already failed is told so: small models at
        // temperature 0 otherwise repeat it until the repairs run out.
        let repeated = self
            .run
            .attempts
            .iter()
            .any(|a| a.outcome.error().is_some() && same_query(&a.sql, sql));
        match outcome {
            Outcome::Rows(_) if !questioned.is_empty() => {
                Some(prompt::repair_questioned(self.question, sql, questioned))
            }
            Outcome::Rows(_) | Outcome::Planned => None,
            Outcome::Empty(result) => {
                let values = self.db.values();
                Some(prompt::repair_empty(
                    self.question,
                    sql,
                    &result.row_security,
                    values.as_deref(),
                    questioned,
                ))
            }
            _ if outcome.ends_run() => None,
            _ => outcome.error().map(|error| {
                // Hints read names out of the error's text: only of an error of analysis, whose
                // names are the model's; what code raised once the query ran is any text, and
                // goes to the model as `shown_error` redacts it, or not at all.
                let mut hint = if error.ran {
                    None
                } else {
                    self.db.hint(sql, error)
                };
                let shown = prompt::shown_error(error, self.limits.share_values);
                // (As shown: which error a query raised as it ran may be the data's choice.)
                if shown.sqlstate.class() == "42" {
                    if let Some(values) = self.db.values() {
                        hint = Some(match hint {
                            Some(h) => format!(
                                "{h}\nThe values the question names are stored here:\n{values}"
                            ),
                            None => {
                                format!("The values the question names are stored here:\n{values}")
                            }
                        });
                    }
                }
                prompt::repair_error(self.question, sql, &shown, repeated, hint.as_deref())
            }),
        }
    }

    fn record(&mut self, step: &Step, llm_ms: f64, kind: Kind, by: &Completion) {
        let ranked = rank(&step.outcome, &step.questioned);
        if ranked > 0
            && self
                .run
                .best
                .is_none_or(|b| ranked > rank_of(&self.run.attempts[b]))
        {
            self.run.best = Some(self.run.attempts.len());
        }
        self.run.attempts.push(Attempt {
            sql: step.sql.clone(),
            outcome: step.outcome.clone(),
            ms: step.ms,
            llm_ms,
            kind,
            group: None,
            endpoint: by.endpoint.clone(),
            endpoint_failures: by.failures.clone(),
            questioned: step.questioned.clone(),
            requalified: step.requalified.clone(),
        });
    }

    fn count(&mut self, requests: u32, completions: &[Completion]) {
        self.run.llm_calls = self.run.llm_calls.saturating_add(requests);
        for c in completions {
            // Counts the endpoint reports: saturating, whatever it says.
            self.run.prompt_tokens = self.run.prompt_tokens.saturating_add(c.prompt_tokens);
            self.run.completion_tokens = self
                .run
                .completion_tokens
                .saturating_add(c.completion_tokens);
        }
    }

    /// Asks for candidates with `request`, runs them, and groups every attempt with a result so
    /// far (the first one included) by that result. The largest group wins (ties: the better
    /// outcome, then the earliest); it becomes the answer when it is better than the best so
    /// far, or, with `Vote::Always`, whenever it has rows and ranks as well. Returns whether the run
    /// has rows that nothing questions.
    fn vote(&mut self, request: &[Message]) -> Result<bool> {
        (self.progress)(Event::ModelAsked(Asking::Alternatives(
            self.limits.candidates,
        )));
        let sent = Instant::now();
        let batch = match self.llm.complete_many(request, self.limits.candidates) {
            Ok(batch) => batch,
            Err(Error::Llm { .. }) if self.out_of_time() => return Ok(false),
            Err(Error::Llm {
                endpoint, cause, ..
            }) => {
                self.run.llm_failure = Some(LlmFailure { endpoint, cause });
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        let llm_ms = millis(sent);
        self.count(batch.requests, &batch.completions);
        let of = batch.completions.len();
        if of < self.limits.candidates {
            // The budget may have ended the others: the run says so.
            self.out_of_time();
        }
        for (i, completion) in batch.completions.iter().enumerate() {
            let attempt = self.run.attempts.len() + 1;
            let kind = Kind::Alternative { n: i + 1, of };
            let step = self.step(&completion.content, attempt, kind);
            self.record(&step, llm_ms, kind, completion);
            // PostgreSQL failed under it: the others are not run (a full disk or exhausted
            // memory fails them too); the vote counts those that ran.
            if matches!(&step.outcome, Outcome::Failed(e) if e.ends_run) {
                break;
            }
        }
        let mut signatures: Vec<String> = Vec::new();
        let mut sizes: Vec<usize> = Vec::new();
        for attempt in &mut self.run.attempts {
            let Some(sig) = signature(&attempt.outcome) else {
                continue;
            };
            let group = match signatures.iter().position(|s| *s == sig) {
                Some(g) => g,
                None => {
                    signatures.push(sig);
                    sizes.push(0);
                    sizes.len() - 1
                }
            };
            sizes[group] += 1;
            attempt.group = Some(group);
        }
        let first_of = |g: usize, attempts: &[Attempt]| {
            attempts
                .iter()
                .position(|a| a.group == Some(g))
                .unwrap_or(usize::MAX)
        };
        let winner = (0..sizes.len()).max_by(|&a, &b| {
            let (ia, ib) = (
                first_of(a, &self.run.attempts),
                first_of(b, &self.run.attempts),
            );
            sizes[a]
                .cmp(&sizes[b])
                .then(rank_of(&self.run.attempts[ia]).cmp(&rank_of(&self.run.attempts[ib])))
                .then(ib.cmp(&ia))
        });
        if let Some(w) = winner {
            let first = first_of(w, &self.run.attempts);
            let better = self.run.best.is_none_or(|b| {
                rank_of(&self.run.attempts[first]) > rank_of(&self.run.attempts[b])
            });
            let replaces = self.limits.vote == Vote::Always
                && self.run.best.is_none_or(|b| {
                    rank_of(&self.run.attempts[first]) >= rank_of(&self.run.attempts[b])
                })
                && matches!(self.run.attempts[first].outcome, Outcome::Rows(_));
            if better || replaces {
                self.run.best = Some(first);
            }
        }
        let asked = self.limits.candidates;
        (self.progress)(Event::Voted {
            asked,
            alternatives: of,
            agreed: winner.map(|w| Agreed {
                queries: sizes[w],
                first_among_them: self.run.attempts[0].group == Some(w),
            }),
        });
        self.run.vote = Some(VoteResult {
            groups: sizes,
            winner,
            asked,
            needed: (asked * usize::from(self.limits.agreement))
                .div_ceil(100)
                .max(1),
        });
        Ok(self.run.best_attempt().is_some_and(|a| {
            matches!(a.outcome, Outcome::Rows(_) | Outcome::Planned) && a.questioned.is_empty()
        }))
    }

    fn solve(mut self) -> Result<Run> {
        let started = Instant::now();
        let max_repairs = self.limits.max_repairs;
        let mut request = self.initial.clone();
        // Short accounts of the attempts before the last one, for the repair requests.
        let mut earlier: Vec<String> = Vec::new();
        let mut explore = false;
        // Why the next repair is asked for: what the round before it gave, in words.
        let mut because = String::new();
        for round in 0..=max_repairs {
            if round > 0 && self.out_of_time() {
                break;
            }
            let given = self.first.filter(|_| round == 0);
            let kind = match (round, given) {
                (0, Some(Start::Given(_))) => Kind::Given,
                (0, Some(Start::Template(_))) => Kind::Template,
                (0, None) => Kind::First,
                (n, _) => Kind::Repair { n, of: max_repairs },
            };
            match kind {
                Kind::Given | Kind::Template => {}
                Kind::Repair { .. } => (self.progress)(Event::ModelAsked(Asking::Repair {
                    kind,
                    because: &because,
                })),
                _ => (self.progress)(Event::ModelAsked(Asking::Query)),
            }
            let asked = Instant::now();
            let asked_for = match given {
                Some(start) => Ok(Completion {
                    content: start.sql().to_string(),
                    endpoint: "(given)".into(),
                    ..Default::default()
                }),
                None if explore => self.llm.complete_exploring(&request),
                None => self.llm.complete(&request),
            };
            if round == 0 {
                // Whatever is asked for from now on ends with the budget.
                self.llm.cut_at(self.limits.deadline);
            }
            let completion = match asked_for {
                Ok(completion) => completion,
                // A repair cut by the budget, or that cannot be asked for, leaves the run with
                // what it has.
                Err(Error::Llm { .. }) if round > 0 && self.out_of_time() => break,
                Err(Error::Llm {
                    endpoint, cause, ..
                }) if round > 0 => {
                    self.run.llm_failure = Some(LlmFailure { endpoint, cause });
                    break;
                }
                Err(e) => return Err(e),
            };
            let llm_ms = millis(asked);
            if given.is_none() {
                self.count(1, std::slice::from_ref(&completion));
            }

            if let (Some(sql), Some(last)) =
                (extract_sql(&completion.content), self.run.attempts.last())
            {
                if matches!(last.outcome, Outcome::Empty(_)) && same_query(&last.sql, &sql) {
                    self.run.confirmed_empty = true;
                    break;
                }
                // The model stands by a query whose rows were questioned: asking again would
                // get the same answer.
                if !last.questioned.is_empty() && same_query(&last.sql, &sql) {
                    break;
                }
            }
            let attempt = self.run.attempts.len() + 1;
            let step = self.step(&completion.content, attempt, kind);
            explore = step.outcome.error().is_some()
                && self
                    .run
                    .attempts
                    .iter()
                    .any(|a| a.outcome.error().is_some() && same_query(&a.sql, &step.sql));
            let ends_run = step.outcome.ends_run();
            let summary = prompt::attempt_summary(
                attempt,
                &step.sql,
                &result_line(&step.outcome, self.limits.share_values),
            );
            let no_query = step.sql.is_empty();
            // Twice no query at all: the model says this is not a question for the database.
            let said_no_query_before = self
                .run
                .attempts
                .last()
                .is_some_and(|a| a.sql.is_empty() && !a.kind.is_alternative());
            because = format!(
                "{} {}",
                kind.label(),
                match &step.outcome {
                    _ if no_query => "had no query in it",
                    Outcome::Empty(_) => "returned no rows",
                    Outcome::Rows(_) => "returned rows that are doubted",
                    _ => "gave an error",
                }
            );
            self.record(&step, llm_ms, kind, &completion);
            if no_query && said_no_query_before {
                let said = strip_think(&completion.content);
                self.run.said_instead = Some(said.trim().chars().take(SAID_CHARS).collect());
                break;
            }

            // When in doubt (or always, after the model's own first query: not over a
            // template's or the caller's answer with rows), after the first query: alternatives
            // and a vote. Not over an answer with no query in it: that is repaired, not
            // outvoted.
            let in_doubt = !matches!(step.outcome, Outcome::Rows(_) | Outcome::Planned)
                || !step.questioned.is_empty();
            let votes = self.limits.candidates >= 2
                && round == 0
                && !ends_run
                && !no_query
                && match self.limits.vote {
                    Vote::Off => false,
                    Vote::WhenInDoubt => in_doubt,
                    Vote::Always => in_doubt || kind == Kind::First,
                }
                && !self.out_of_time();
            if votes {
                let candidates_request = match &step.feedback {
                    Some(feedback) => prompt::repair_request(&self.initial, &[], feedback),
                    None => self.initial.clone(),
                };
                if self.vote(&candidates_request)?
                    || self.run.llm_failure.is_some()
                    || self.run.broken().is_some()
                {
                    break;
                }
                // Alternatives that agree with an empty first result confirm it.
                let agreed = self
                    .run
                    .vote
                    .as_ref()
                    .and_then(|v| v.winner)
                    .is_some_and(|w| {
                        self.run.attempts[0].group == Some(w)
                            && self.run.vote.as_ref().is_some_and(|v| v.groups[w] >= 2)
                    });
                if agreed && matches!(self.run.attempts[0].outcome, Outcome::Empty(_)) {
                    self.run.confirmed_empty = true;
                    break;
                }
                if self.limits.abstain && self.run.split_vote().is_some() {
                    break;
                }
                because.push_str(", and no alternative returned rows");
                for (i, a) in self.run.attempts.iter().enumerate().skip(1) {
                    earlier.push(prompt::attempt_summary(
                        i + 1,
                        &a.sql,
                        &result_line(&a.outcome, self.limits.share_values),
                    ));
                }
            }

            match step.feedback {
                None => {
                    // A write after a good attempt ends the loop with that attempt as the
                    // answer.
                    if ends_run
                        && matches!(step.outcome, Outcome::Refused(_))
                        && self.run.best.is_none()
                    {
                        self.run.status = Status::Refused;
                    }
                    break;
                }
                Some(feedback) if round < max_repairs => {
                    request = prompt::repair_request(&self.initial, &earlier, &feedback);
                    // The first attempt's account goes before the alternatives' (when there
                    // were).
                    if round == 0 {
                        earlier.insert(0, summary);
                    } else {
                        earlier.push(summary);
                    }
                }
                Some(_) => {}
            }
        }
        let mut run = self.run;
        if run.status != Status::Refused {
            run.status = match run.best.map(|b| &run.attempts[b].outcome) {
                Some(Outcome::Rows(_) | Outcome::Planned) => Status::Ok,
                Some(Outcome::Empty(_)) => Status::Empty,
                _ => Status::Error,
            };
        }
        run.ms = millis(started);
        (self.progress)(Event::Done {
            status: run.status.as_str(),
            row_count: run.best_result().map(|r| r.rows.len()),
            attempts: run.attempts.len(),
            answered_by: run.best_attempt().map(|a| a.kind),
            ms: run.ms,
        });
        Ok(run)
    }
}

/// Whether `outcome` is past name resolution: the query ran, or it failed on what parse
/// analysis checks once every name resolved (grouping, types, functions, windows), or on its
/// data while it ran (a scalar subquery with several rows, a division by zero, a value that
/// does not convert): the query's own logic, not a name a rewrite could have got wrong. Not a
/// timeout or a resource limit: a rewrite that ran too long is no better start than the
/// model's query.
fn past_the_names(outcome: &Outcome) -> bool {
    outcome.error().is_none_or(|e| {
        [
            SqlState::GROUPING_ERROR,
            SqlState::WINDOWING_ERROR,
            SqlState::UNDEFINED_FUNCTION,
            SqlState::AMBIGUOUS_FUNCTION,
            SqlState::DATATYPE_MISMATCH,
            SqlState::CANNOT_COERCE,
        ]
        .contains(&e.sqlstate)
            || ["21", "22"].contains(&e.sqlstate.class())
    })
}

/// Whether a rewrite of a query that named a missing column fails on another missing column:
/// the one the rewrite was for now resolves, and the next one is the model's to mend (or the
/// next rewrite's). A rewrite only ever names a column where a relation has it, so the new
/// missing column was in the model's query too.
fn named_another(before: &Outcome, after: &Outcome) -> bool {
    match (before.error(), after.error()) {
        (Some(b), Some(a)) => {
            b.sqlstate == SqlState::UNDEFINED_COLUMN
                && a.sqlstate == SqlState::UNDEFINED_COLUMN
                && a.message != b.message
        }
        _ => false,
    }
}

/// Characters of the model's reply kept when it answered without a query.
const SAID_CHARS: usize = 300;

/// SQL a run starts from before the model is asked anything.
#[derive(Debug, Clone, Copy)]
pub enum Start<'a> {
    /// The caller's own (`nl_fix`).
    Given(&'a str),
    /// A verified example instantiated for the question (`templates`).
    Template(&'a str),
}

impl Start<'_> {
    fn sql(&self) -> &str {
        match self {
            Start::Given(sql) | Start::Template(sql) => sql,
        }
    }
}

/// Answers `question` with at most `1 + limits.max_repairs` queries (and, in a vote, up to
/// `limits.candidates` more), starting from the request `initial` (`prompt::initial`). `db`
/// runs them, `llm` writes them, `progress` hears of every step. Only a failure of the first
/// model call is an `Err`. Starts from `first` (SQL run before the model is asked anything)
/// when given.
pub fn solve(
    question: &str,
    initial: Vec<Message>,
    first: Option<Start>,
    limits: Limits,
    llm: &mut dyn Llm,
    db: &mut dyn Database,
    progress: &mut dyn FnMut(Event),
) -> Result<Run> {
    Solver {
        question,
        initial,
        first,
        limits,
        llm,
        db,
        progress,
        run: Run {
            question: question.to_string(),
            attempts: Vec::new(),
            best: None,
            status: Status::Error,
            confirmed_empty: false,
            llm_calls: 0,
            prompt_tokens: 0,
            completion_tokens: 0,
            ms: 0.0,
            llm_failure: None,
            vote: None,
            said_instead: None,
            out_of_time: false,
            described_by: None,
        },
    }
    .solve()
}

impl Run {
    /// The attempt whose result is the answer.
    pub fn best_attempt(&self) -> Option<&Attempt> {
        self.best.map(|b| &self.attempts[b])
    }

    /// The attempt under which PostgreSQL failed (`SqlError::ends_run`), and its number: the
    /// loop stopped there.
    pub fn broken(&self) -> Option<(usize, &SqlError)> {
        self.attempts
            .iter()
            .enumerate()
            .find_map(|(i, a)| match &a.outcome {
                Outcome::Failed(e) if e.ends_run => Some((i + 1, e)),
                _ => None,
            })
    }

    /// The error a caller gets when there is no answer: the write that was refused, or the last
    /// failure with how many attempts failed.
    pub fn failure(&self) -> Option<Error> {
        match self.status {
            Status::Ok | Status::Empty => None,
            Status::Refused => self.attempts.last().and_then(|a| match &a.outcome {
                Outcome::Refused(r) => Some(Error::Refused(Box::new(SqlError {
                    detail: Some(format!("proposed SQL: {}", a.sql)),
                    ..r.error.clone()
                }))),
                _ => None,
            }),
            Status::Error => {
                if let Some(said) = &self.said_instead {
                    return Some(Error::NotAQuestion { said: said.clone() });
                }
                if let Some(f) = &self.llm_failure {
                    return Some(Error::Llm {
                        endpoint: f.endpoint.clone(),
                        cause: format!(
                            "{} (asked for a repair after {} failed attempts)",
                            f.cause,
                            self.attempts.len()
                        ),
                        fault: Fault::Request,
                    });
                }
                let last = self.attempts.iter().rev().find_map(|a| match &a.outcome {
                    Outcome::Failed(e) => Some((a, e.clone())),
                    Outcome::Refused(r) => Some((a, r.error.clone())),
                    _ => None,
                });
                let (attempt, error) = last?;
                Some(Error::AllAttemptsFailed {
                    attempts: self.attempts.len(),
                    last: Box::new(error),
                    last_sql: attempt.sql.clone(),
                })
            }
        }
    }

    /// The SQL that answers the question, or the last one tried.
    pub fn final_sql(&self) -> Option<&str> {
        self.best_attempt()
            .or_else(|| self.attempts.iter().rev().find(|a| !a.sql.is_empty()))
            .map(|a| a.sql.as_str())
    }

    /// When a vote leaves the answer in doubt: fewer queries than the vote needed gave its
    /// result (the winning one's, when a repair found the answer after the vote), or another
    /// result had as many. The first query may add to its group but not to the count.
    pub fn split_vote(&self) -> Option<Split> {
        let vote = self.vote.as_ref()?;
        let alternatives = self.alternatives().count();
        let group = self.best_attempt().and_then(|a| a.group).or(vote.winner);
        let size = group.map_or(0, |g| vote.groups.get(g).copied().unwrap_or(0));
        let tied = group.is_some_and(|g| {
            vote.groups
                .iter()
                .enumerate()
                .any(|(other, &n)| other != g && n >= size)
        });
        let agreed = size.min(alternatives);
        (vote.asked > 1 && (agreed < vote.needed || tied)).then_some(Split {
            agreed,
            asked: vote.asked,
            alternatives,
            tied,
        })
    }

    /// The alternatives a vote asked for, in order.
    pub fn alternatives(&self) -> impl Iterator<Item = &Attempt> {
        self.attempts.iter().filter(|a| a.kind.is_alternative())
    }

    /// The result of the answer, when it ran.
    pub fn best_result(&self) -> Option<&ResultSet> {
        self.best_attempt().and_then(|a| a.outcome.result())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::ResultSet;
    use crate::guard::Refusal;
    use crate::llm::{Batch, Completion, Message};
    use std::collections::VecDeque;

    /// A model that answers from a script and remembers what it was asked.
    struct Scripted {
        answers: VecDeque<String>,
        requests: Vec<Vec<Message>>,
        exploring: Vec<bool>,
        /// The deadline the loop set, and how many requests had been made when it did.
        cut: Option<(Option<Instant>, usize)>,
    }

    impl Scripted {
        fn new(answers: &[&str]) -> Self {
            Scripted {
                answers: answers.iter().map(|s| s.to_string()).collect(),
                requests: vec![],
                exploring: vec![],
                cut: None,
            }
        }
    }

    impl Llm for Scripted {
        fn cut_at(&mut self, deadline: Option<Instant>) {
            self.cut = Some((deadline, self.requests.len()));
        }

        fn complete_exploring(&mut self, messages: &[Message]) -> Result<Completion> {
            let completion = self.complete(messages);
            if let Some(last) = self.exploring.last_mut() {
                *last = true;
            }
            completion
        }

        fn complete(&mut self, messages: &[Message]) -> Result<Completion> {
            self.exploring.push(false);
            self.requests.push(messages.to_vec());
            let content = self
                .answers
                .pop_front()
                .expect("the model was asked more often than scripted");
            if content == "FAIL" {
                return Err(Error::Llm {
                    endpoint: "http://model".into(),
                    cause: "HTTP 503".into(),
                    fault: Fault::Endpoint,
                });
            }
            // A request that ends at the deadline the loop set, unanswered.
            if content == "CUT" {
                if let Some((Some(deadline), _)) = self.cut {
                    std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
                }
                return Err(Error::Llm {
                    endpoint: "http://model".into(),
                    cause: "no answer in time".into(),
                    fault: Fault::Request,
                });
            }
            Ok(Completion {
                content,
                prompt_tokens: 10,
                completion_tokens: 2,
                ..Default::default()
            })
        }

        /// As a streamed vote: a "CUT" ends the batch at the deadline, keeping what came
        /// before it (nothing: the timeout error).
        fn complete_many(&mut self, messages: &[Message], n: usize) -> Result<Batch> {
            let mut batch = Batch {
                requests: 1,
                ..Default::default()
            };
            for _ in 0..n {
                match self.complete_exploring(messages) {
                    Ok(completion) => batch.completions.push(completion),
                    Err(Error::Llm {
                        fault: Fault::Request,
                        ..
                    }) if !batch.completions.is_empty() => break,
                    Err(e) => return Err(e),
                }
            }
            Ok(batch)
        }
    }

    fn rows(n: usize) -> Outcome {
        Outcome::Rows(ResultSet {
            columns: vec!["a".into()],
            rows: vec!["{\"a\": 1}".into(); n],
            ..Default::default()
        })
    }
    fn empty() -> Outcome {
        Outcome::Empty(ResultSet {
            columns: vec!["a".into()],
            ..Default::default()
        })
    }
    #[test]
    fn without_sample_values_the_model_is_not_told_how_many_rows() {
        assert_eq!(result_line(&rows(115), true), "115 rows");
        assert_eq!(result_line(&rows(115), false), "rows");
        assert_eq!(result_line(&rows(3), false), "rows");
        assert_eq!(result_line(&empty(), false), "no rows");
    }

    fn failed(code: &str) -> Outcome {
        Outcome::Failed(SqlError::new(
            SqlState::parse(code),
            format!("error {code}"),
        ))
    }

    /// Runs `solve` where the database answers each SQL text as `db` says.
    /// A database that answers each SQL text as a closure says and counts what it ran.
    struct FakeDb<F: Fn(&str) -> Outcome> {
        answer: F,
        executed: Vec<String>,
    }

    impl<F: Fn(&str) -> Outcome> Database for FakeDb<F> {
        fn run(&mut self, sql: &str, _kind: Kind) -> Outcome {
            self.executed.push(sql.to_string());
            (self.answer)(sql)
        }
        fn hint(&mut self, _sql: &str, error: &SqlError) -> Option<String> {
            (error.sqlstate == SqlState::UNDEFINED_COLUMN)
                .then(|| "The columns of t are: good.".to_string())
        }
        /// `a` has no column `x`; `b` has.
        fn requalify(&mut self, sql: &str, error: &SqlError) -> Option<Requalified> {
            (error.sqlstate == SqlState::UNDEFINED_COLUMN && sql.contains("a.x")).then(|| {
                Requalified {
                    sql: sql.replace("a.x", "b.x"),
                    change: "a.x → b.x".into(),
                }
            })
        }
        /// The data stores `'Shipped'`, never `'shipped'`.
        fn misread(&mut self, sql: &str) -> Vec<String> {
            if sql.contains("= 'shipped'") {
                vec![MISREAD.to_string()]
            } else {
                Vec::new()
            }
        }
    }

    const MISREAD: &str = "'shipped' is stored as 'Shipped' in o.s";
    const COUNT_MISREAD: &str = "SELECT count(*) FROM o WHERE s = 'shipped'";

    /// Runs `solve` where the database answers each SQL text as `db` says.
    fn solve_with(
        answers: &[&str],
        max_repairs: usize,
        db: impl Fn(&str) -> Outcome,
    ) -> (Run, Scripted) {
        let limits = Limits {
            max_repairs,
            share_values: true,
            vote: Vote::Off,
            candidates: 4,
            abstain: false,
            agreement: 50,
            deadline: None,
        };
        solve_limited(answers, limits, db)
    }

    fn solve_limited(
        answers: &[&str],
        limits: Limits,
        db: impl Fn(&str) -> Outcome,
    ) -> (Run, Scripted) {
        let mut llm = Scripted::new(answers);
        let mut database = FakeDb {
            answer: db,
            executed: Vec::new(),
        };
        let messages = prompt::initial("schema", &[], "q?");
        let mut steps = 0;
        let run = solve(
            "q?",
            messages,
            None,
            limits,
            &mut llm,
            &mut database,
            &mut |_| steps += 1,
        )
        .unwrap();
        assert!(
            steps >= 3,
            "progress heard of the model, the attempt and the end"
        );
        // Only the very same text is not run again (blank space can change what SQL does).
        let executed: std::collections::HashSet<&String> = database.executed.iter().collect();
        assert_eq!(
            database.executed.len(),
            executed.len(),
            "no query is executed twice"
        );
        assert!(
            run.attempts
                .iter()
                .filter(|a| !a.sql.is_empty())
                .all(|a| executed.contains(&a.sql)),
            "every attempt's query was executed"
        );
        (run, llm)
    }

    #[test]
    fn rows_are_accepted_with_one_call() {
        let (run, llm) = solve_with(&["SELECT 1"], 4, |_| rows(1));
        assert_eq!(
            (run.status, run.llm_calls, run.best),
            (Status::Ok, 1, Some(0))
        );
        assert_eq!(llm.requests.len(), 1);
        assert_eq!((run.prompt_tokens, run.completion_tokens), (10, 2));
    }

    #[test]
    fn a_column_of_the_wrong_relation_is_moved_to_the_right_one_without_asking_the_model() {
        let (run, llm) = solve_with(&["SELECT a.x FROM a, b"], 2, |sql| {
            if sql.contains("a.x") {
                failed("42703")
            } else {
                rows(1)
            }
        });
        assert_eq!(
            (run.status, run.best, llm.requests.len()),
            (Status::Ok, Some(0), 1)
        );
        assert_eq!(run.attempts[0].sql, "SELECT b.x FROM a, b");
        assert_eq!(run.attempts[0].requalified, vec!["a.x → b.x"]);
        // Not once the answer budget is spent: the rewrite would run another query.
        let spent = Limits {
            deadline: Some(Instant::now()),
            ..voting(Vote::Off)
        };
        let (run, _) = solve_limited(&["SELECT a.x FROM a, b"], spent, |sql| {
            if sql.contains("a.x") {
                failed("42703")
            } else {
                rows(1)
            }
        });
        assert!(run.attempts[0].requalified.is_empty() && run.out_of_time);

        // When the rewrite fails too, the model's own query and error go back to it.
        let (run, llm) = solve_with(&["SELECT a.x FROM a, b", "SELECT 1"], 2, |sql| {
            if sql.contains(".x") {
                failed("42703")
            } else {
                rows(1)
            }
        });
        assert_eq!(
            (run.status, run.best, llm.requests.len()),
            (Status::Ok, Some(1), 2)
        );
        assert_eq!(run.attempts[0].sql, "SELECT a.x FROM a, b");
        assert!(run.attempts[0].requalified.is_empty());
        let asked = &llm.requests[1].last().unwrap().content;
        assert!(asked.contains("SELECT a.x FROM a, b"), "{asked}");

        // When every name of the rewrite resolves and its own logic fails (here: grouping), the
        // repair starts from the rewrite and its error, not from the name error.
        let (run, llm) = solve_with(&["SELECT a.x, y FROM a, b", "SELECT 1"], 2, |sql| {
            if sql.contains("a.x") {
                failed("42703")
            } else if sql.contains("b.x") {
                failed("42803")
            } else {
                rows(1)
            }
        });
        assert_eq!(
            (run.status, run.best, llm.requests.len()),
            (Status::Ok, Some(1), 2)
        );
        assert_eq!(run.attempts[0].sql, "SELECT b.x, y FROM a, b");
        assert_eq!(run.attempts[0].requalified, vec!["a.x → b.x"]);
        let asked = &llm.requests[1].last().unwrap().content;
        assert!(asked.contains("SELECT b.x, y FROM a, b"), "{asked}");
        assert!(asked.contains("42803"), "{asked}");
        assert!(!asked.contains("SELECT a.x"), "{asked}");

        // So does a rewrite that fails on the data while it runs (a scalar subquery the move
        // made return several rows), and one that fails on another missing column of the
        // model's (`y`): the model is asked about what is left, not the name already mended.
        for (later, code) in [("21000", "21000"), ("y", "42703")] {
            let missing = |column: &str| {
                Outcome::Failed(SqlError::new(
                    SqlState::UNDEFINED_COLUMN,
                    format!("column {column} does not exist"),
                ))
            };
            let (run, llm) = solve_with(&["SELECT a.x, y FROM a, b", "SELECT 1"], 2, |sql| {
                if sql.contains("a.x") {
                    missing("a.x")
                } else if sql.contains("b.x") && later == "y" {
                    missing("y")
                } else if sql.contains("b.x") {
                    failed(code)
                } else {
                    rows(1)
                }
            });
            assert_eq!(
                (run.status, run.best, llm.requests.len()),
                (Status::Ok, Some(1), 2)
            );
            assert_eq!(run.attempts[0].sql, "SELECT b.x, y FROM a, b");
            assert_eq!(run.attempts[0].requalified, vec!["a.x → b.x"]);
            let asked = &llm.requests[1].last().unwrap().content;
            let told = if later == "y" {
                "column y does not exist"
            } else {
                "21000"
            };
            assert!(asked.contains(told), "{asked}");
            assert!(!asked.contains("a.x"), "{asked}");
        }

        // A rewrite that runs out of time is no better start: the model's own query stands.
        let (run, llm) = solve_with(&["SELECT a.x FROM a, b", "SELECT 1"], 2, |sql| {
            if sql.contains("a.x") {
                failed("42703")
            } else if sql.contains("b.x") {
                failed("57014")
            } else {
                rows(1)
            }
        });
        assert_eq!((run.best, llm.requests.len()), (Some(1), 2));
        assert_eq!(run.attempts[0].sql, "SELECT a.x FROM a, b");
    }

    #[test]
    fn rows_over_a_value_the_column_does_not_store_are_repaired_and_the_repair_wins() {
        let (run, llm) = solve_with(
            &[COUNT_MISREAD, "SELECT count(*) FROM o WHERE s = 'Shipped'"],
            2,
            |_| rows(1),
        );
        assert_eq!((run.status, run.best), (Status::Ok, Some(1)));
        assert_eq!(run.attempts[0].questioned, vec![MISREAD]);
        let asked = &llm.requests[1].last().unwrap().content;
        assert!(
            asked.contains(MISREAD) && asked.contains(COUNT_MISREAD),
            "{asked}"
        );
        assert!(crate::confidence::assess(&run, false).sure());
    }

    #[test]
    fn questioned_rows_stay_the_answer_when_the_model_stands_by_them_or_a_repair_is_worse() {
        // The same query again: the loop ends, and the answer stays in doubt.
        let (run, llm) = solve_with(&[COUNT_MISREAD, COUNT_MISREAD], 3, |_| rows(1));
        assert_eq!(
            (run.status, run.best, run.attempts.len()),
            (Status::Ok, Some(0), 1)
        );
        assert_eq!(llm.requests.len(), 2);
        let verdict = crate::confidence::assess(&run, false);
        assert!(
            verdict
                .doubts
                .iter()
                .any(|d| d.contains("answer is questioned") && d.contains(MISREAD)),
            "{verdict:?}"
        );
        // A repair that comes back empty does not replace them; rows without a misread
        // value would have.
        let (run, _) = solve_with(
            &[
                COUNT_MISREAD,
                "SELECT count(*) FROM o WHERE s = 'Shipped' AND false",
            ],
            1,
            |sql| {
                if sql.contains("false") {
                    empty()
                } else {
                    rows(1)
                }
            },
        );
        assert_eq!((run.status, run.best), (Status::Ok, Some(0)));
    }

    #[test]
    fn error_is_repaired_and_the_repair_is_run() {
        let (run, llm) = solve_with(&["SELECT bad", "SELECT good"], 4, |sql| {
            if sql.contains("bad") {
                failed("42703")
            } else {
                rows(2)
            }
        });
        assert_eq!(run.status, Status::Ok);
        assert_eq!(run.best, Some(1));
        let repair = &llm.requests[1];
        let last = &repair.last().unwrap().content;
        assert!(last.contains("SELECT bad") && last.contains("42703") && last.contains("q?"));
    }

    #[test]
    fn confirmed_empty_stops_without_rerunning() {
        let (run, llm) = solve_with(&["SELECT none", "SELECT  none;"], 4, |_| empty());
        assert_eq!(
            (run.status, run.confirmed_empty, run.attempts.len()),
            (Status::Empty, true, 1)
        );
        assert_eq!(llm.requests.len(), 2);
        assert!(llm.requests[1]
            .last()
            .unwrap()
            .content
            .contains("returned 0 rows"));
    }

    #[test]
    fn empty_then_better_query_returns_rows() {
        let (run, _) = solve_with(&["SELECT none", "SELECT some"], 4, |sql| {
            if sql.contains("none") {
                empty()
            } else {
                rows(3)
            }
        });
        assert_eq!((run.status, run.best), (Status::Ok, Some(1)));
    }

    #[test]
    fn repairs_never_make_the_answer_worse() {
        // empty first, then only errors: the empty result stands
        let (run, _) = solve_with(&["SELECT e", "SELECT x1", "SELECT x2"], 2, |sql| {
            if sql == "SELECT e" {
                empty()
            } else {
                failed("42P01")
            }
        });
        assert_eq!(
            (run.status, run.best, run.attempts.len()),
            (Status::Empty, Some(0), 3)
        );
    }

    #[test]
    fn exhausted_repairs_report_the_last_error() {
        let (run, llm) = solve_with(&["SELECT a", "SELECT b", "SELECT c"], 2, |_| {
            failed("42703")
        });
        assert_eq!(
            (run.status, run.attempts.len(), llm.requests.len()),
            (Status::Error, 3, 3)
        );
        match run.failure() {
            Some(Error::AllAttemptsFailed {
                attempts: 3,
                last_sql,
                ..
            }) => assert_eq!(last_sql, "SELECT c"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn a_repeated_failing_query_is_called_out() {
        let (run, llm) = solve_with(&["SELECT bad", "SELECT  bad", "SELECT good"], 4, |sql| {
            if sql.contains("bad") {
                failed("42703")
            } else {
                rows(1)
            }
        });
        assert_eq!(run.status, Status::Ok);
        let feedback = |i: usize| llm.requests[i].last().unwrap().content.clone();
        assert!(!feedback(1).contains("same as an earlier one"));
        assert!(feedback(2).contains("This query is the same as an earlier one"));
        assert_eq!(
            llm.exploring,
            vec![false, false, true],
            "sampling freedom after the repeat"
        );
    }

    #[test]
    fn max_repairs_zero_means_one_attempt() {
        let (run, llm) = solve_with(&["SELECT a"], 0, |_| failed("42703"));
        assert_eq!((run.attempts.len(), llm.requests.len()), (1, 1));
    }

    #[test]
    fn a_write_ends_the_run_without_repair() {
        let refused = Outcome::Refused(Refusal {
            error: SqlError::new(
                SqlState::READ_ONLY_SQL_TRANSACTION,
                "refused to run a DELETE statement",
            ),
            ends_run: true,
        });
        let (run, llm) = solve_with(&["DELETE FROM t"], 4, move |_| refused.clone());
        assert_eq!((run.status, llm.requests.len()), (Status::Refused, 1));
        assert_eq!(
            run.failure().unwrap().sqlstate(),
            SqlState::READ_ONLY_SQL_TRANSACTION
        );
    }

    #[test]
    fn a_refused_read_is_fed_back() {
        let (run, llm) = solve_with(&["SELECT pg_sleep(1)", "SELECT 1"], 4, |sql| {
            if sql.contains("sleep") {
                Outcome::Refused(Refusal {
                    error: SqlError::new(
                        SqlState::INSUFFICIENT_PRIVILEGE,
                        "pg_sleep is not allowed",
                    ),
                    ends_run: false,
                })
            } else {
                rows(1)
            }
        });
        assert_eq!((run.status, llm.requests.len()), (Status::Ok, 2));
        assert!(llm.requests[1]
            .last()
            .unwrap()
            .content
            .contains("pg_sleep is not allowed"));
    }

    #[test]
    fn an_answer_without_sql_counts_as_an_attempt() {
        let mut llm = Scripted::new(&["<think>hmm</think>", "SELECT 1"]);
        let mut database = FakeDb {
            answer: |_: &str| rows(1),
            executed: Vec::new(),
        };
        let messages = prompt::initial("s", &[], "q?");
        let limits = Limits {
            max_repairs: 4,
            share_values: true,
            vote: Vote::Off,
            candidates: 4,
            abstain: false,
            agreement: 50,
            deadline: None,
        };
        let run = solve(
            "q?",
            messages,
            None,
            limits,
            &mut llm,
            &mut database,
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(
            (run.status, run.attempts.len(), database.executed.len()),
            (Status::Ok, 2, 1)
        );
        assert!(llm.requests[1]
            .last()
            .unwrap()
            .content
            .contains("contained no SQL"));
    }

    #[test]
    fn repairs_carry_the_earlier_attempts_and_schema_hints_in_one_turn() {
        let (_, llm) = solve_with(&["SELECT bad1", "SELECT bad2", "SELECT good"], 4, |sql| {
            if sql.contains("bad") {
                failed("42703")
            } else {
                rows(1)
            }
        });
        let third = &llm.requests[2];
        assert_eq!(
            third.len(),
            llm.requests[0].len(),
            "one turn, not a conversation"
        );
        let text = &third.last().unwrap().content;
        assert!(
            text.contains("Attempt 1:\nSELECT bad1\nResult: ERROR 42703"),
            "{text}"
        );
        assert!(text.contains("SELECT bad2") && text.contains("The columns of t are: good."));
    }

    #[test]
    fn a_model_failure_during_a_repair_keeps_the_best_attempt() {
        let (run, _) = solve_with(&["SELECT e", "SELECT x", "FAIL"], 4, |sql| {
            if sql == "SELECT e" {
                empty()
            } else {
                failed("42703")
            }
        });
        assert_eq!((run.status, run.best), (Status::Empty, Some(0)));
        assert!(run.failure().is_none());
        assert_eq!(run.llm_failure.as_ref().unwrap().cause, "HTTP 503");
    }

    #[test]
    fn a_model_failure_with_nothing_to_show_is_the_error() {
        let (run, _) = solve_with(&["SELECT x", "FAIL"], 4, |_| failed("42703"));
        assert_eq!(run.status, Status::Error);
        assert_eq!(run.failure().unwrap().sqlstate(), SqlState::SYSTEM_ERROR);
    }

    #[test]
    fn a_write_after_a_good_attempt_leaves_that_attempt_as_the_answer() {
        let (run, llm) = solve_with(&["SELECT e", "DELETE FROM t"], 4, |sql| {
            if sql.starts_with("DELETE") {
                Outcome::Refused(Refusal {
                    error: SqlError::new(SqlState::READ_ONLY_SQL_TRANSACTION, "refused"),
                    ends_run: true,
                })
            } else {
                empty()
            }
        });
        assert_eq!((run.status, run.best), (Status::Empty, Some(0)));
        assert_eq!(run.attempts[1].outcome.label(), "refused");
        assert_eq!(llm.requests.len(), 2);
    }

    fn voting(vote: Vote) -> Limits {
        Limits {
            max_repairs: 2,
            share_values: true,
            vote,
            candidates: 4,
            abstain: false,
            agreement: 50,
            deadline: None,
        }
    }

    /// As `abstain = when_in_doubt` asks the loop to vote: always, and to stop at a split.
    fn withholding() -> Limits {
        Limits {
            abstain: true,
            ..voting(Vote::Always)
        }
    }

    fn rows_of(values: &[&str]) -> Outcome {
        Outcome::Rows(ResultSet {
            columns: vec!["a".into()],
            rows: values
                .iter()
                .map(|v| format!("{{\"a\": \"{v}\"}}"))
                .collect(),
            ..Default::default()
        })
    }

    #[test]
    fn in_doubt_the_largest_result_group_wins() {
        let answers = [
            "SELECT nothing",
            "SELECT x1",
            "SELECT   x1",
            "SELECT other",
            "SELECT x2",
        ];
        let (run, llm) = solve_limited(&answers, voting(Vote::WhenInDoubt), |sql| match sql {
            "SELECT nothing" => empty(),
            "SELECT other" => rows_of(&["b"]),
            // a different query with the same result counts for the same group
            _ => rows_of(&["a"]),
        });
        assert_eq!(run.status, Status::Ok);
        assert_eq!(run.best_result().unwrap().rows, vec!["{\"a\": \"a\"}"]);
        let vote = run.vote.unwrap();
        assert_eq!(vote.groups, vec![1, 3, 1], "empty, a, b");
        assert_eq!(vote.winner, Some(1));
        assert_eq!(
            llm.requests.len(),
            5,
            "the first request and four candidates"
        );
        assert!(run.attempts[1..].iter().all(|a| a.kind.is_alternative()));
        assert!(
            llm.exploring[1..].iter().all(|e| *e),
            "candidates are sampled"
        );
    }

    #[test]
    fn when_in_doubt_a_vote_never_replaces_a_first_answer_with_rows() {
        let (run, llm) = solve_limited(&["SELECT a"], voting(Vote::WhenInDoubt), |_| {
            rows_of(&["a"])
        });
        assert_eq!((run.status, llm.requests.len()), (Status::Ok, 1));
        assert!(run.vote.is_none());
    }

    /// PostgreSQL failing under a query (an internal error of its C code, memory, a full disk).
    fn broke(code: &str) -> Outcome {
        Outcome::Failed(SqlError {
            ends_run: true,
            ..SqlError::new(SqlState::parse(code), format!("error {code}"))
        })
    }

    #[test]
    fn postgres_failing_under_a_repair_stops_the_loop_with_the_answer_it_has() {
        let answers = ["SELECT none", "SELECT boom", "SELECT fine"];
        let (run, llm) = solve_with(&answers, 3, |sql| match sql {
            "SELECT none" => empty(),
            "SELECT boom" => broke("XX000"),
            _ => rows(1),
        });
        assert_eq!(
            (run.status, run.best, llm.requests.len()),
            (Status::Empty, Some(0), 2)
        );
        assert!(run.failure().is_none());
        assert_eq!(
            run.broken().map(|(n, e)| (n, e.sqlstate)),
            Some((2, SqlState::INTERNAL_ERROR))
        );
    }

    #[test]
    fn postgres_failing_under_the_first_query_is_the_calls_error_without_repairs() {
        let (run, llm) = solve_with(&["SELECT boom", "SELECT fine"], 3, |sql| match sql {
            "SELECT boom" => broke("53100"),
            _ => rows(1),
        });
        assert_eq!((run.status, llm.requests.len()), (Status::Error, 1));
        assert_eq!(
            run.failure().map(|e| e.sqlstate()),
            Some(SqlState::parse("53100"))
        );
    }

    #[test]
    fn postgres_failing_under_an_alternative_stops_the_vote_and_keeps_the_first_answer() {
        let answers = [
            "SELECT first",
            "SELECT boom",
            "SELECT c",
            "SELECT d",
            "SELECT e",
        ];
        let (run, _) = solve_limited(&answers, voting(Vote::Always), |sql| match sql {
            "SELECT first" => rows_of(&["1"]),
            "SELECT boom" => broke("XX000"),
            _ => rows_of(&["3"]),
        });
        assert_eq!(
            (run.status, run.final_sql()),
            (Status::Ok, Some("SELECT first"))
        );
        assert_eq!(
            run.attempts.len(),
            2,
            "the alternatives after it were not run"
        );
        assert_eq!(run.broken().map(|(n, _)| n), Some(2));
    }

    #[test]
    fn voting_always_may_replace_a_first_answer_the_candidates_disagree_with() {
        let answers = [
            "SELECT first",
            "SELECT c",
            "SELECT c",
            "SELECT c",
            "SELECT d",
        ];
        let (run, _) = solve_limited(&answers, voting(Vote::Always), |sql| match sql {
            "SELECT first" => rows_of(&["1"]),
            "SELECT d" => rows_of(&["2"]),
            _ => rows_of(&["3"]),
        });
        assert_eq!(run.final_sql(), Some("SELECT c"));
        assert_eq!(run.vote.unwrap().groups, vec![1, 3, 1]);
    }

    #[test]
    fn when_withholding_doubt_a_first_answer_with_rows_is_checked_by_a_vote() {
        let answers = ["SELECT a", "SELECT a2", "SELECT a3", "SELECT b", "SELECT c"];
        let limits = withholding();
        let (run, llm) = solve_limited(&answers, limits, |sql| match sql {
            "SELECT b" => rows_of(&["b"]),
            "SELECT c" => rows_of(&["c"]),
            _ => rows_of(&["a"]),
        });
        assert_eq!(llm.requests.len(), 5, "the first query and four candidates");
        assert_eq!(run.vote.as_ref().unwrap().groups, vec![3, 1, 1]);
        assert_eq!(run.final_sql(), Some("SELECT a"));
        assert_eq!(run.split_vote(), None, "3 of 4 agree with the first");

        // Three candidates that agree against the first answer replace it.
        let answers = ["SELECT a", "SELECT b", "SELECT b2", "SELECT b3", "SELECT c"];
        let (run, _) = solve_limited(&answers, limits, |sql| match sql {
            "SELECT a" => rows_of(&["a"]),
            "SELECT c" => rows_of(&["c"]),
            _ => rows_of(&["b"]),
        });
        assert_eq!(
            (run.final_sql(), run.split_vote()),
            (Some("SELECT b"), None)
        );
        // Without withholding, a vote when in doubt keeps a first answer with rows; were it
        // kept against such a majority, that would be a doubt.
        let mut kept = run.clone();
        kept.best = Some(0);
        assert_eq!(
            kept.split_vote(),
            Some(Split {
                agreed: 1,
                asked: 4,
                alternatives: 4,
                tied: true
            })
        );
    }

    #[test]
    fn an_answer_is_sure_when_enough_alternatives_give_its_result_and_none_other_as_many() {
        let db = |sql: &str| rows_of(&[sql.trim_start_matches("SELECT ").split_at(1).0]);
        let split = |answers: &[&str], agreement: u8| {
            let limits = Limits {
                agreement,
                ..withholding()
            };
            solve_limited(answers, limits, db).0.split_vote()
        };
        // The first answer and one of four alternatives: half of them.
        let corroborated = ["SELECT a", "SELECT a2", "SELECT b", "SELECT c", "SELECT d"];
        assert_eq!(split(&corroborated, 50), None);
        assert_eq!(
            split(&corroborated, 51),
            Some(Split {
                agreed: 2,
                asked: 4,
                alternatives: 4,
                tied: false
            }),
            "more than half needs 3"
        );
        // As many alternatives gave another result: a doubt whatever the share.
        let tied = ["SELECT a", "SELECT a2", "SELECT b", "SELECT b2", "SELECT c"];
        assert_eq!(split(&tied, 50).map(|s| s.tied), Some(true));
        assert_eq!(split(&tied, 1).map(|s| s.tied), Some(true));
    }

    /// A first query and the 4 alternatives of its vote, for a database that fails them all.
    const FAILING_VOTE: [&str; 5] = [
        "SELECT bad",
        "SELECT b1",
        "SELECT b2",
        "SELECT b3",
        "SELECT b4",
    ];

    #[test]
    fn when_withholding_doubt_a_split_vote_ends_the_run_without_repairs() {
        let answers = [FAILING_VOTE.as_slice(), &["SELECT good"]].concat();
        let limits = withholding();
        let db = |sql: &str| match sql {
            "SELECT good" => rows(1),
            _ => failed("42703"),
        };
        let (run, llm) = solve_limited(&answers, limits, db);
        assert_eq!(llm.requests.len(), 5, "no repair after a split vote");
        assert_eq!(
            (
                run.split_vote().map(|s| (s.agreed, s.alternatives)),
                run.status
            ),
            (Some((0, 4)), Status::Error)
        );
        // Without withholding, the same run goes on to a repair.
        let (run, llm) = solve_limited(&answers, voting(Vote::WhenInDoubt), db);
        assert_eq!((llm.requests.len(), run.status), (6, Status::Ok));
        assert_eq!(run.final_sql(), Some("SELECT good"));
    }

    #[test]
    fn a_spent_answer_budget_asks_for_nothing_after_the_first_query() {
        let answers = [FAILING_VOTE.as_slice(), &["SELECT r1", "SELECT r2"]].concat();
        let deadline = Instant::now();
        let limits = Limits {
            deadline: Some(deadline),
            ..voting(Vote::WhenInDoubt)
        };
        let db = |_: &str| failed("42703");
        let (run, llm) = solve_limited(&answers, limits, db);
        assert_eq!(llm.requests.len(), 1, "no vote and no repair");
        assert_eq!(llm.cut, Some((Some(deadline), 1)), "cut after the first");
        assert!(run.out_of_time && run.llm_failure.is_none());
        assert_eq!(run.status, Status::Error);
        // Without a budget the same run votes (4) and repairs (2).
        let (run, llm) = solve_limited(&answers, voting(Vote::WhenInDoubt), db);
        assert_eq!(llm.requests.len(), 7);
        assert!(!run.out_of_time);
    }

    #[test]
    fn an_answer_the_budget_left_unvoted_is_doubtful_when_withholding() {
        let limits = Limits {
            deadline: Some(Instant::now()),
            ..withholding()
        };
        let (run, llm) = solve_limited(&["SELECT a"], limits, |_| rows(1));
        assert_eq!((run.status, llm.requests.len()), (Status::Ok, 1));
        assert!(run.out_of_time && run.vote.is_none());
        assert!(!crate::confidence::assess(&run, false).sure());
        // With time for the vote, four agreeing alternatives make it sure.
        let answers = ["SELECT a", "SELECT b", "SELECT c", "SELECT d", "SELECT e"];
        let (run, _) = solve_limited(&answers, withholding(), |_| rows(1));
        assert!(crate::confidence::assess(&run, false).sure());
    }

    #[test]
    fn a_vote_the_budget_cut_counts_what_came_back_against_all_it_asked_for() {
        let cut_soon = || Limits {
            deadline: Some(Instant::now() + std::time::Duration::from_millis(1000)),
            ..withholding()
        };
        // 2 of 4 came back, both with the first query's result: half of those asked for.
        let answers = ["SELECT a", "SELECT b", "SELECT c", "CUT"];
        let (run, llm) = solve_limited(&answers, cut_soon(), |_| rows(1));
        assert_eq!((run.status, llm.requests.len()), (Status::Ok, 4));
        let vote = run.vote.as_ref().expect("a vote of what came back");
        assert_eq!((vote.asked, run.alternatives().count()), (4, 2));
        assert!(run.out_of_time);
        let verdict = crate::confidence::assess(&run, false);
        assert!(verdict.sure(), "{:?}", verdict.doubts);
        // 1 of 4 agreeing is not half of them, though it is all that came back.
        let answers = ["SELECT a", "SELECT b", "CUT"];
        let (run, _) = solve_limited(&answers, cut_soon(), |_| rows(1));
        assert_eq!(run.alternatives().count(), 1);
        let verdict = crate::confidence::assess(&run, false);
        assert_eq!(
            verdict.doubts,
            [
                "the alternatives did not agree: 1 of 4 (3 did not come back) gave the answer's \
              result"
            ]
        );
        // None came back: no vote at all.
        let (run, _) = solve_limited(&["SELECT a", "CUT"], cut_soon(), |_| rows(1));
        assert!(run.vote.is_none() && run.out_of_time);
        assert!(!crate::confidence::assess(&run, false).sure());
    }

    #[test]
    fn a_repair_that_changes_only_blank_space_in_a_string_is_run() {
        let db = |sql: &str| {
            if sql.contains("'New York'") {
                rows(1)
            } else {
                empty()
            }
        };
        let (run, _) = solve_with(
            &[
                "SELECT * FROM t WHERE city = 'New  York'",
                "SELECT * FROM t WHERE city = 'New York'",
            ],
            2,
            db,
        );
        assert_eq!(run.status, Status::Ok);
        assert!(!run.confirmed_empty);
        // Blank space elsewhere is the same query: the empty result is confirmed.
        let (run, _) = solve_with(
            &[
                "SELECT * FROM t WHERE city = 'Nowhere'",
                "SELECT *\n  FROM t WHERE city = 'Nowhere';",
            ],
            2,
            db,
        );
        assert!(run.confirmed_empty);
    }

    #[test]
    fn a_candidate_is_run_unless_it_is_the_very_same_text() {
        // Blank space ends a comment and is part of a literal: alike is not the same.
        let answers = [
            "SELECT a",
            "SELECT a",
            "SELECT  a",
            "SELECT a -- x\nFROM t",
            "SELECT a -- x FROM t",
        ];
        let mut llm = Scripted::new(&answers);
        let mut database = FakeDb {
            answer: |_: &str| rows(1),
            executed: Vec::new(),
        };
        solve(
            "q?",
            prompt::initial("schema", &[], "q?"),
            None,
            withholding(),
            &mut llm,
            &mut database,
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(
            database.executed,
            [
                "SELECT a",
                "SELECT  a",
                "SELECT a -- x\nFROM t",
                "SELECT a -- x FROM t"
            ]
        );
    }

    #[test]
    fn an_answer_with_nothing_in_it_is_doubtful_however_many_agree() {
        let answers = ["SELECT a", "SELECT b", "SELECT c", "SELECT d", "SELECT e"];
        let all_null = || {
            Outcome::Rows(ResultSet {
                columns: vec!["a".into(), "b".into()],
                rows: vec!["{\"a\": null, \"b\": null}".into()],
                ..Default::default()
            })
        };
        let one_null = || {
            Outcome::Rows(ResultSet {
                columns: vec!["a".into(), "b".into()],
                rows: vec!["{\"a\": null, \"b\": 0}".into()],
                ..Default::default()
            })
        };
        for (what, outcome, sure) in [
            ("no rows", empty as fn() -> Outcome, false),
            ("only nulls", all_null, false),
            ("a null beside a value", one_null, true),
        ] {
            let (run, _) = solve_limited(&answers, withholding(), |_| outcome());
            assert_eq!(run.split_vote(), None, "{what}: all five agreed");
            let verdict = crate::confidence::assess(&run, false);
            assert_eq!(verdict.sure(), sure, "{what}: {:?}", verdict.doubts);
        }
    }

    #[test]
    fn a_repair_cut_by_the_answer_budget_keeps_the_best_attempt() {
        let limits = Limits {
            deadline: Some(Instant::now() + std::time::Duration::from_millis(1000)),
            ..voting(Vote::Off)
        };
        let db = |sql: &str| match sql {
            "SELECT empty" => empty(),
            _ => failed("42703"),
        };
        let (run, llm) = solve_limited(&["SELECT empty", "CUT", "SELECT never"], limits, db);
        assert_eq!(llm.requests.len(), 2);
        assert_eq!(run.status, Status::Empty, "the first answer stays");
        assert!(run.out_of_time);
        assert!(
            run.llm_failure.is_none(),
            "the budget is not a model failure"
        );
        assert!(run.failure().is_none());
    }

    #[test]
    fn a_verified_examples_answer_with_rows_is_not_put_to_a_vote() {
        let mut llm = Scripted::new(&["SELECT x", "SELECT y", "SELECT z", "SELECT w"]);
        let mut database = FakeDb {
            answer: |_: &str| rows_of(&["a"]),
            executed: Vec::new(),
        };
        let limits = withholding();
        let run = solve(
            "q?",
            prompt::initial("schema", &[], "q?"),
            Some(Start::Template("SELECT t")),
            limits,
            &mut llm,
            &mut database,
            &mut |_| {},
        )
        .unwrap();
        assert_eq!((run.status, llm.requests.len()), (Status::Ok, 0));
        assert!(run.vote.is_none());
    }

    #[test]
    fn a_vote_without_rows_goes_on_repairing() {
        let answers = [
            "SELECT bad",
            "SELECT b1",
            "SELECT b2",
            "SELECT b3",
            "SELECT b4",
            "SELECT good",
        ];
        let (run, llm) = solve_limited(&answers, voting(Vote::WhenInDoubt), |sql| {
            if sql == "SELECT good" {
                rows(1)
            } else {
                failed("42703")
            }
        });
        assert_eq!(run.status, Status::Ok);
        assert_eq!(run.final_sql(), Some("SELECT good"));
        let repair = llm.requests[5].last().unwrap().content.clone();
        assert!(repair.contains("Attempt 2:\nSELECT b1"), "{repair}");
    }

    #[test]
    fn the_callers_sql_is_run_first_and_repaired_like_a_generated_one() {
        let mut llm = Scripted::new(&["SELECT good"]);
        let mut database = FakeDb {
            answer: |sql: &str| {
                if sql == "SELECT good" {
                    rows(1)
                } else {
                    failed("42703")
                }
            },
            executed: Vec::new(),
        };
        let messages = prompt::initial("s", &[], "q?");
        let limits = voting(Vote::Off);
        let run = solve(
            "q?",
            messages,
            Some(Start::Given("SELECT bad")),
            limits,
            &mut llm,
            &mut database,
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(run.final_sql(), Some("SELECT good"));
        assert_eq!(database.executed, ["SELECT bad", "SELECT good"]);
        assert_eq!(
            (llm.requests.len(), run.llm_calls),
            (1, 1),
            "the model is asked only to repair"
        );
        assert!(llm.requests[0]
            .last()
            .unwrap()
            .content
            .contains("SELECT bad"));
    }

    /// Runs `solve` and returns the progress as psql shows it.
    fn progress_of(
        answers: &[&str],
        limits: Limits,
        db: impl Fn(&str) -> Outcome,
    ) -> (Run, Vec<String>) {
        let mut llm = Scripted::new(answers);
        let mut database = FakeDb {
            answer: db,
            executed: Vec::new(),
        };
        let mut told = Vec::new();
        let run = solve(
            "q?",
            prompt::initial("s", &[], "q?"),
            None,
            limits,
            &mut llm,
            &mut database,
            &mut |event| told.push(event.describe()),
        )
        .unwrap();
        (run, told)
    }

    fn position(told: &[String], needle: &str) -> usize {
        told.iter()
            .position(|t| t.contains(needle))
            .unwrap_or_else(|| panic!("{needle:?} not in {told:#?}"))
    }

    #[test]
    fn progress_tells_the_first_error_then_the_alternatives_then_the_repairs() {
        let answers = [
            "SELECT bad",
            "SELECT b1",
            "SELECT b2",
            "SELECT b3",
            "SELECT b4",
            "SELECT good",
        ];
        let (run, told) = progress_of(&answers, voting(Vote::WhenInDoubt), |sql| {
            if sql == "SELECT good" {
                rows(2)
            } else {
                failed("42703")
            }
        });
        let at = |needle: &str| position(&told, needle);
        assert!(at("the first query: error 42703") < at("asking the model for 4 alternatives"));
        assert!(
            at("alternative 4 of 4: error") < at("asked 4 alternatives: none ran with a result")
        );
        assert!(
            at("asked 4 alternatives")
                < at(
                    "asking the model for repair 1 of 2: the first query gave an error, and no \
                      alternative returned rows"
                )
        );
        assert!(at("repair 1 of 2: 2 rows") < at("done: ok, 2 rows from repair 1 of 2 (6 queries"));
        assert!(!told.iter().any(|t| t.contains("attempt")), "{told:#?}");
        assert_eq!(
            run.best_attempt().map(|a| a.kind),
            Some(Kind::Repair { n: 1, of: 2 })
        );
    }

    #[test]
    fn a_vote_says_how_many_agreed() {
        let answers = [
            "SELECT first",
            "SELECT c",
            "SELECT c2",
            "SELECT c3",
            "SELECT d",
        ];
        let (run, told) = progress_of(&answers, voting(Vote::WhenInDoubt), |sql| match sql {
            "SELECT first" => empty(),
            "SELECT d" => rows_of(&["2"]),
            _ => rows_of(&["3"]),
        });
        position(&told, "asked 4 alternatives, 3 agreed");
        position(&told, "done: ok, 1 row from alternative 1 of 4 (5 queries");
        assert_eq!(run.final_sql(), Some("SELECT c"));
    }

    #[test]
    fn twice_no_query_ends_the_run_with_what_the_model_said() {
        let answers = [
            "Hello! Ask me about your data.",
            "<think>a greeting</think>I answer questions about the data in this database.",
        ];
        let (run, told) = progress_of(&answers, voting(Vote::WhenInDoubt), |_| rows(1));
        assert_eq!(
            (run.status, run.llm_calls, run.attempts.len()),
            (Status::Error, 2, 2)
        );
        assert_eq!(
            run.said_instead.as_deref(),
            Some("I answer questions about the data in this database.")
        );
        assert!(
            matches!(run.failure(), Some(Error::NotAQuestion { .. })),
            "{:?}",
            run.failure()
        );
        position(
            &told,
            "asking the model for repair 1 of 2: the first query had no query in it",
        );
        assert!(
            !told.iter().any(|t| t.contains("alternatives")),
            "{told:#?}"
        );
    }
}
