//! The benchmark harness (bench/run) is itself tested: on its fixture benchmark, a model that
//! answers with the gold SQL scores 100 %, one that answers wrong scores 0 %, and one that is
//! wrong first and right after repair scores 0 % without repairs (C) and 100 % with them (A),
//! every question counted as healed.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use sql_query_engine_e2e::{cluster, Reply, ScriptedLlm};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn questions() -> Vec<Value> {
    std::fs::read_to_string(repo().join("tests/bench_fixture/dev.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Runs bench/run against a model that answers each question with `first` (first attempts)
/// and `repair` (repairs), both given the question's gold SQL.
fn run_bench(
    name: &str,
    first: fn(&str) -> String,
    repair: fn(&str) -> String,
    load: bool,
) -> Value {
    let llm = ScriptedLlm::start();
    let answers: Vec<(String, String)> = questions()
        .iter()
        .map(|q| {
            (
                q["question"].as_str().unwrap().to_string(),
                q["gold_sql"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    llm.respond_with(move |request| {
        let text = request.last_message();
        let (_, gold) = answers.iter().find(|(q, _)| text.contains(q.as_str()))?;
        Some(Reply::Sql(if request.is_repair() {
            repair(gold)
        } else {
            first(gold)
        }))
    });
    let out = sql_query_engine_e2e::scratch(&format!("bench-test-{name}"));
    let _ = std::fs::remove_dir_all(&out);
    let c = cluster();
    let mut command = Command::new("bash");
    command
        .arg(repo().join("bench/run"))
        .arg("--bench")
        .arg(repo().join("tests/bench_fixture"))
        .args([
            "--llm-url",
            &llm.url(),
            "--model",
            "scripted",
            "--configs",
            "C,A",
            "--out",
        ])
        .arg(&out)
        .env("PGHOST", &c.host)
        .env("PGPORT", c.port.to_string())
        .env("PGUSER", &c.user);
    if !load {
        command.arg("--no-load");
    }
    let output = command.output().expect("running bench/run");
    assert!(
        output.status.success(),
        "bench/run failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let results: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert!(out.join("results.md").exists());
    let _ = std::fs::remove_dir_all(&out);
    results
}

#[test]
fn the_harness_scores_gold_wrong_and_healed_answers() {
    let n = questions().len();

    let gold = run_bench("gold", |g| g.to_string(), |g| g.to_string(), true);
    for config in ["C", "A"] {
        assert_eq!(
            gold["configs"][config]["ex"], 1.0,
            "{config}: {}",
            gold["configs"][config]
        );
        assert_eq!(gold["configs"][config]["n"], n);
    }
    assert_eq!(gold["configs"]["A"]["by_suite"]["fixture"]["ex"], 1.0);
    // early accept: one call per question without repairs; with them, only the empty answer
    // (lib_6) takes more: four candidates, which agree with it and so confirm it
    assert_eq!(gold["configs"]["C"]["llm_calls_per_question"], 1.0);
    assert_eq!(gold["configs"]["A"]["llm_calls_per_question"], 1.67);

    let wrong = run_bench(
        "wrong",
        |_| "SELECT 42 AS wrong".into(),
        |_| "SELECT 42 AS wrong".into(),
        false,
    );
    for config in ["C", "A"] {
        assert_eq!(wrong["configs"][config]["ex"], 0.0, "{config}");
    }

    let healed = run_bench(
        "healed",
        |_| "SELECT * FROM no_such_table".into(),
        |g| g.to_string(),
        false,
    );
    assert_eq!(healed["configs"]["C"]["ex"], 0.0);
    assert_eq!(healed["configs"]["A"]["ex"], 1.0);
    assert_eq!(healed["healed"].as_array().unwrap().len(), n);
    assert_eq!(healed["regressed"].as_array().unwrap().len(), 0);
    let q = healed["questions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["config"] == "A")
        .unwrap();
    assert!(q["attempts"].as_u64().unwrap() >= 2, "{q}");
}
