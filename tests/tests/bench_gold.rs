//! No false refusals: every gold query of a text-to-SQL benchmark passes the guard on its own
//! database. Needs the benchmark (a directory with `dumps/`, `load.sh` and `dev.jsonl`), named
//! by `SQE_BENCH_DIR`, so it is ignored by default and run with `--include-ignored` when that is
//! set (scripts/test.sh does).

use std::process::Command;

use sql_query_engine_e2e::{cluster, db_error};

#[test]
#[ignore = "needs the benchmark: set SQE_BENCH_DIR and pass --include-ignored"]
fn every_gold_query_passes_the_guard() {
    let bench = std::env::var("SQE_BENCH_DIR")
        .expect("SQE_BENCH_DIR names the benchmark directory (dumps/, load.sh, dev.jsonl)");
    let questions =
        std::fs::read_to_string(format!("{bench}/dev.jsonl")).expect("reading dev.jsonl");
    let questions: Vec<serde_json::Value> = questions
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let mut databases: Vec<String> = questions
        .iter()
        .map(|q| q["pg_database"].as_str().unwrap().to_string())
        .collect();
    databases.sort();
    databases.dedup();

    let c = cluster();
    let status = Command::new("sh")
        .arg(format!("{bench}/load.sh"))
        .args(&databases)
        .env("PGHOST", &c.host)
        .env("PGPORT", c.port.to_string())
        .env("PGUSER", &c.user)
        .status()
        .expect("running load.sh");
    assert!(status.success(), "load.sh failed");

    let mut refused = Vec::new();
    for database in &databases {
        let mut client = c.connect(database);
        client
            .batch_execute("CREATE EXTENSION IF NOT EXISTS sql_query_engine")
            .unwrap();
        for q in questions
            .iter()
            .filter(|q| q["pg_database"] == database.as_str())
        {
            let gold = q["gold_sql"].as_str().unwrap();
            if let Err(e) = client.execute("SELECT nl_check($1)", &[&gold]) {
                let (code, message, _) = db_error(&e);
                refused.push(format!("{}: {code} {message}\n  {gold}", q["id"]));
            }
        }
    }
    eprintln!(
        "checked {} gold queries on {} databases",
        questions.len(),
        databases.len()
    );
    assert!(
        refused.is_empty(),
        "false refusals:\n{}",
        refused.join("\n")
    );
}
