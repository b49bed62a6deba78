//! How sure an answer is, from what the pipeline already knows: a vote whose queries did not
//! mostly agree, an answer with nothing in it (no rows, or only nulls), an answer whose query
//! compares a column with a string the column does not store as written (the value index),
//! an answer that only a repair found after the alternatives all failed. With `sql_query_engine.abstain =
//! when_in_doubt` a doubtful answer is not returned: a wrong table of numbers in a BI tool is
//! worse than none.
//!
//! Pure: it reads the run and says why it doubts, so that it can be tested without a server.

use crate::exec::{Outcome, ResultSet};
use crate::heal::{Run, Status};
use crate::progress::Kind;

/// Interpretations named when abstaining, at most.
const MAX_INTERPRETATIONS: usize = 3;

/// The verdict on one answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confidence {
    /// Why the answer is doubtful; empty when it is not.
    pub doubts: Vec<String>,
    /// What else the schema context left out, which does not make an answer doubtful alone.
    pub notes: Vec<String>,
    /// The different answers the run found, each as its SQL and what it returned, the chosen
    /// one first (for the DETAIL of an abstention).
    pub interpretations: Vec<String>,
}

impl Confidence {
    pub fn sure(&self) -> bool {
        self.doubts.is_empty()
    }

    pub fn level(&self) -> &'static str {
        if self.sure() {
            "high"
        } else {
            "low"
        }
    }
}

/// What `run` says about its own answer; `pruned` says whether the schema shown was cut to
/// the relations retrieval chose.
pub fn assess(run: &Run, pruned: bool) -> Confidence {
    let mut doubts = Vec::new();
    let mut notes = Vec::new();
    if let Some(split) = run.split_vote() {
        let tie = if split.tied {
            ", and another result as many"
        } else {
            ""
        };
        let missing = split.asked.saturating_sub(split.alternatives);
        let missing = if missing > 0 {
            format!(" ({missing} did not come back)")
        } else {
            String::new()
        };
        doubts.push(format!(
            "the alternatives did not agree: {} of {}{missing} gave the answer's result{tie}",
            split.agreed, split.asked
        ));
    }
    // No rows, or only nulls (what an aggregate over no rows gives), is also what a filter gives
    // that does not match how the data spells a value, and candidates written by the same model
    // share that mistake: neither the model returning the same query nor a unanimous vote
    // makes such an answer sure.
    if run.status == Status::Empty {
        doubts.push(
            "the answer is an empty result, which a filter that does not match how the data \
             spells a value also gives"
                .to_string(),
        );
    } else if run.best_result().is_some_and(only_nulls) {
        doubts.push(
            "every value of the answer is null, which an aggregate over no rows also gives"
                .to_string(),
        );
    }
    // A string the column does not store as written, identifiers added up, keys of different
    // things compared, integer aggregates divided: what it counts, sums, joins or divides is
    // most often wrong.
    if let Some(answer) = run.best_attempt().filter(|a| !a.questioned.is_empty()) {
        doubts.push(format!(
            "the answer is questioned: {}",
            answer.questioned.join("; ")
        ));
    }
    let alternatives_failed = run.alternatives().next().is_some()
        && run
            .alternatives()
            .all(|a| matches!(a.outcome, Outcome::Failed(_) | Outcome::Refused(_)));
    let by_repair = run
        .best_attempt()
        .is_some_and(|a| matches!(a.kind, Kind::Repair { .. }));
    if alternatives_failed && by_repair {
        doubts.push("every alternative failed and only a repair ran".to_string());
    }
    // Out of time before any vote: nothing checked the answer (withholding votes on every
    // first answer; otherwise only an error or an empty result is left unvoted this way).
    if run.out_of_time && run.vote.is_none() {
        doubts.push("the answer budget ran out before alternatives were asked for".to_string());
    } else if run.out_of_time {
        notes.push("the answer budget ran out before the repair loop ended".into());
    }
    if let Some((attempt, _)) = run.broken() {
        notes.push(format!(
            "PostgreSQL failed under attempt {attempt}, and the loop stopped there"
        ));
    }
    if pruned {
        notes.push("the schema shown was cut to the relations the question seemed to need".into());
    }
    Confidence {
        interpretations: if doubts.is_empty() {
            Vec::new()
        } else {
            interpretations(run)
        },
        doubts,
        notes,
    }
}

/// Whether a result has rows and every value in them is null. A row that is not a JSON object
/// (which the collector never makes) counts as not null.
fn only_nulls(result: &ResultSet) -> bool {
    !result.rows.is_empty()
        && result.rows.iter().all(|row| {
            serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(row)
                .is_ok_and(|columns| columns.values().all(serde_json::Value::is_null))
        })
}

/// One line per distinct result the run found (the answer's first), as SQL and row count.
fn interpretations(run: &Run) -> Vec<String> {
    let mut seen_groups = Vec::new();
    let mut lines = Vec::new();
    let answer = run.best;
    let order = answer.into_iter().chain(0..run.attempts.len());
    for i in order {
        let Some(attempt) = run.attempts.get(i) else {
            continue;
        };
        let rows = match &attempt.outcome {
            Outcome::Rows(r) => r.rows.len(),
            Outcome::Empty(_) => 0,
            _ => continue,
        };
        let group = attempt.group.unwrap_or(usize::MAX - i);
        if seen_groups.contains(&group) || lines.len() == MAX_INTERPRETATIONS {
            continue;
        }
        seen_groups.push(group);
        let sql = crate::text::single_spaced(&attempt.sql);
        let plural = if rows == 1 { "" } else { "s" };
        lines.push(format!("{sql} ({rows} row{plural})"));
    }
    lines
}
