//! The generate → run → repair loop, and its bookkeeping.
//!
//! Rows are accepted at once (the model is never asked to re-judge a working query). An error
//! or an empty result goes back to the model with everything PostgreSQL said; every repaired
//! query is run again. An empty result that the model confirms by returning the same query ends
//! the loop: empty can be the right answer. The best attempt is kept (rows beat empty beat
//! error), so a repair can never make a good answer worse: neither a model that fails during a
//! repair nor a write it proposes after a good attempt takes that attempt away. A write ends the
//! run at once; it is the answer (a refusal) only when nothing better came before it.

use std::time::Instant;

use crate::error::{Error, Result, SqlError, SqlState};
use crate::exec::{Outcome, ResultSet};
use crate::extract::extract_sql;
use crate::llm::Llm;
use crate::progress::Event;
use crate::prompt;

#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub sql: String,
    pub outcome: Outcome,
    /// Time to run (or plan) the query.
    pub ms: f64,
    /// Time the model took to write it.
    pub llm_ms: f64,
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
}

/// How good an outcome is: a repair replaces the best attempt only when it ranks higher.
fn rank(outcome: &Outcome) -> u8 {
    match outcome {
        Outcome::Rows(_) | Outcome::Planned => 2,
        Outcome::Empty(_) => 1,
        Outcome::Failed(_) | Outcome::Refused(_) => 0,
    }
}

/// SQL compared for "the same query": blank space and trailing semicolons do not count.
fn same_query(a: &str, b: &str) -> bool {
    let norm = |s: &str| {
        s.trim()
            .trim_end_matches(';')
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    norm(a) == norm(b)
}

/// What became of an attempt, in one line, as the model may see it.
fn result_line(outcome: &Outcome, share_values: bool) -> String {
    match (outcome.result(), outcome.error()) {
        (Some(r), _) => format!("{} rows", r.rows.len()),
        (_, Some(e)) => {
            let e = prompt::shown_error(e, share_values);
            format!("ERROR {}: {}", e.sqlstate, e.message)
        }
        _ => outcome.label().to_string(),
    }
}

fn millis(since: Instant) -> f64 {
    (since.elapsed().as_secs_f64() * 1000.0 * 100.0).round() / 100.0
}

/// The database side of the loop: runs (or plans) one query, and says what the schema knows
/// about the tables a failed query names. A trait so that the loop is tested without a backend.
pub trait Database {
    fn run(&mut self, sql: &str) -> Outcome;
    /// Schema facts that help repair `error` (the columns of the tables `sql` names, the
    /// tables there are), when the error is about names.
    fn hint(&mut self, sql: &str, error: &SqlError) -> Option<String>;
}

/// Answers `question` with at most `1 + limits.max_repairs` queries, starting from the request
/// `initial` (`prompt::initial`). `db` runs them, `llm` writes them, `progress` hears of every
/// step. Only a failure of the first model call is an `Err`.
pub fn solve(
    question: &str,
    initial: Vec<prompt::Message>,
    limits: Limits,
    llm: &mut dyn Llm,
    db: &mut dyn Database,
    progress: &mut dyn FnMut(Event),
) -> Result<Run> {
    let started = Instant::now();
    let mut state = Run {
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
    };
    let max_repairs = limits.max_repairs;
    let mut request = initial.clone();
    // Short accounts of the attempts before the last one, for the repair requests.
    let mut earlier: Vec<String> = Vec::new();
    let mut explore = false;
    for round in 0..=max_repairs {
        progress(Event::ModelAsked {
            attempt: round + 1,
            repair: round > 0,
        });
        let asked = Instant::now();
        let asked_for = if explore {
            llm.complete_exploring(&request)
        } else {
            llm.complete(&request)
        };
        let completion = match asked_for {
            Ok(completion) => completion,
            // A repair that cannot be asked for leaves the run with what it has.
            Err(Error::Llm { endpoint, cause }) if round > 0 => {
                state.llm_failure = Some(LlmFailure { endpoint, cause });
                break;
            }
            Err(e) => return Err(e),
        };
        let llm_ms = millis(asked);
        state.llm_calls += 1;
        state.prompt_tokens += completion.prompt_tokens;
        state.completion_tokens += completion.completion_tokens;

        let sql = extract_sql(&completion.content);
        if let (Some(sql), Some(last)) = (&sql, state.attempts.last()) {
            if matches!(last.outcome, Outcome::Empty(_)) && same_query(&last.sql, sql) {
                state.confirmed_empty = true;
                break;
            }
        }
        let (sql, outcome, ms, feedback) = match sql {
            None => {
                let outcome = Outcome::Failed(SqlError::new(
                    SqlState::SYNTAX_ERROR,
                    "the model's answer contained no SQL statement",
                ));
                let feedback = prompt::repair_no_sql(question, &completion.content);
                (String::new(), outcome, 0.0, Some(feedback))
            }
            Some(sql) => {
                let ran = Instant::now();
                let outcome = db.run(&sql);
                let ms = millis(ran);
                progress(Event::Executed {
                    attempt: round + 1,
                    sql: &sql,
                    outcome: &outcome,
                    ms,
                });
                // A model that returns a query that already failed is told so, and asked
                // with some sampling freedom: small models at temperature 0 otherwise repeat
                // it until the repairs run out.
                let repeated = state
                    .attempts
                    .iter()
                    .any(|a| a.outcome.error().is_some() && same_query(&a.sql, &sql));
                explore = repeated;
                let feedback = match &outcome {
                    Outcome::Rows(_) | Outcome::Planned => None,
                    Outcome::Empty(result) => {
                        Some(prompt::repair_empty(question, &sql, &result.row_security))
                    }
                    Outcome::Refused(refusal) if refusal.ends_run => None,
                    _ => outcome.error().map(|error| {
                        let hint = db.hint(&sql, error);
                        let shown = prompt::shown_error(error, limits.share_values);
                        prompt::repair_error(question, &sql, &shown, repeated, hint.as_deref())
                    }),
                };
                (sql, outcome, ms, feedback)
            }
        };
        let ends_run = matches!(&outcome, Outcome::Refused(r) if r.ends_run);
        if rank(&outcome) > 0
            && state
                .best
                .is_none_or(|b| rank(&outcome) > rank(&state.attempts[b].outcome))
        {
            state.best = Some(state.attempts.len());
        }
        let summary =
            prompt::attempt_summary(round + 1, &sql, &result_line(&outcome, limits.share_values));
        let reason = if matches!(outcome, Outcome::Empty(_)) {
            "0 rows"
        } else {
            "an error"
        };
        state.attempts.push(Attempt {
            sql,
            outcome,
            ms,
            llm_ms,
        });

        match feedback {
            None => {
                // A write after a good attempt ends the loop with that attempt as the answer.
                if ends_run && state.best.is_none() {
                    state.status = Status::Refused;
                }
                break;
            }
            Some(feedback) if round < max_repairs => {
                progress(Event::RepairRequested {
                    attempt: round + 1,
                    reason,
                });
                request = prompt::repair_request(&initial, &earlier, &feedback);
                earlier.push(summary);
            }
            Some(_) => {}
        }
    }
    if state.status != Status::Refused {
        state.status = match state.best.map(|b| &state.attempts[b].outcome) {
            Some(Outcome::Rows(_) | Outcome::Planned) => Status::Ok,
            Some(Outcome::Empty(_)) => Status::Empty,
            _ => Status::Error,
        };
    }
    state.ms = millis(started);
    progress(Event::Done {
        status: state.status.as_str(),
        row_count: state.best_result().map(|r| r.rows.len()),
        attempts: state.attempts.len(),
        ms: state.ms,
    });
    Ok(state)
}

impl Run {
    /// The attempt whose result is the answer.
    pub fn best_attempt(&self) -> Option<&Attempt> {
        self.best.map(|b| &self.attempts[b])
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
                if let Some(f) = &self.llm_failure {
                    return Some(Error::Llm {
                        endpoint: f.endpoint.clone(),
                        cause: format!(
                            "{} (asked for a repair after {} failed attempts)",
                            f.cause,
                            self.attempts.len()
                        ),
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
    use crate::llm::Completion;
    use crate::prompt::Message;
    use std::collections::VecDeque;

    /// A model that answers from a script and remembers what it was asked.
    struct Scripted {
        answers: VecDeque<String>,
        requests: Vec<Vec<Message>>,
        exploring: Vec<bool>,
    }

    impl Scripted {
        fn new(answers: &[&str]) -> Self {
            Scripted {
                answers: answers.iter().map(|s| s.to_string()).collect(),
                requests: vec![],
                exploring: vec![],
            }
        }
    }

    impl Llm for Scripted {
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
                });
            }
            Ok(Completion {
                content,
                prompt_tokens: 10,
                completion_tokens: 2,
            })
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
        fn run(&mut self, sql: &str) -> Outcome {
            self.executed.push(sql.to_string());
            (self.answer)(sql)
        }
        fn hint(&mut self, _sql: &str, error: &SqlError) -> Option<String> {
            (error.sqlstate == SqlState::UNDEFINED_COLUMN)
                .then(|| "The columns of t are: good.".to_string())
        }
    }

    /// Runs `solve` where the database answers each SQL text as `db` says.
    fn solve_with(
        answers: &[&str],
        max_repairs: usize,
        db: impl Fn(&str) -> Outcome,
    ) -> (Run, Scripted) {
        let mut llm = Scripted::new(answers);
        let mut database = FakeDb {
            answer: db,
            executed: Vec::new(),
        };
        let messages = prompt::initial("schema", &[], "q?");
        let mut steps = 0;
        let limits = Limits {
            max_repairs,
            share_values: true,
        };
        let run = solve("q?", messages, limits, &mut llm, &mut database, &mut |_| {
            steps += 1
        })
        .unwrap();
        assert!(
            steps >= 3,
            "progress heard of the model, the attempt and the end"
        );
        assert_eq!(
            database.executed.len(),
            run.attempts.len(),
            "every attempt is executed exactly once"
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
        };
        let run = solve("q?", messages, limits, &mut llm, &mut database, &mut |_| {}).unwrap();
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
}
