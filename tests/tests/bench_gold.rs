//! No false refusals: every gold query of a text-to-SQL benchmark passes the guard on its own
//! database. Needs the benchmark (a directory with `dumps/`, `load.sh` and `dev.jsonl`), named
//! by `SQE_BENCH_DIR`; without it the test says so and checks nothing.

use std::process::Command;

use sql_query_engine_e2e::{cluster, db_error};

#[test]
fn every_gold_query_passes_the_guard() {
    let Ok(bench) = std::env::var("SQE_BENCH_DIR") else {
        eprintln!("SQE_BENCH_DIR is not set: the benchmark's gold queries were not checked");
        return;
    };
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
