//! The scripted model as a standalone server, for the demo when no real model is at hand.
//! Usage: scripted_llm ANSWERS.json   (an object: question -> SQL). Prints its base URL, then
//! serves until killed.

use std::io::Write;

use sql_query_engine_e2e::{Reply, ScriptedLlm};

fn main() {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        eprintln!("usage: scripted_llm ANSWERS.json");
        std::process::exit(2);
    });
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        eprintln!("reading {path}: {e}");
        std::process::exit(1);
    });
    let answers: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&text)
        .unwrap_or_else(|e| {
            eprintln!("{path} is not a JSON object of question -> SQL: {e}");
            std::process::exit(1);
        });
    let llm = ScriptedLlm::start();
    for (question, sql) in &answers {
        let sql = sql.as_str().unwrap_or_default();
        llm.on(question, vec![Reply::sql(sql); 1000]);
    }
    println!("{}", llm.url());
    let _ = std::io::stdout().flush();
    loop {
        std::thread::park();
    }
}
