//! The scripted model as a standalone server, for the demo and the benchmark harness's tests.
//! Usage: scripted_llm ANSWERS.json [DELAY_MS], where ANSWERS maps a question to the SQL to
//! answer with, or to {"first": SQL, "repair": SQL} to answer first attempts and repairs
//! differently, and DELAY_MS is how long each answer takes (a model that thinks; default 0).
//! Prints its base URL, then serves until killed.

use std::io::Write;

use serde_json::Value;
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
    let answers: serde_json::Map<String, Value> = serde_json::from_str(&text).unwrap_or_else(|e| {
        eprintln!("{path} is not a JSON object of question -> answer: {e}");
        std::process::exit(1);
    });
    let delay = match std::env::args().nth(2).map(|ms| ms.parse::<u64>()) {
        None => std::time::Duration::ZERO,
        Some(Ok(ms)) => std::time::Duration::from_millis(ms),
        Some(Err(e)) => {
            eprintln!("DELAY_MS is not a number of milliseconds: {e}");
            std::process::exit(2);
        }
    };
    let llm = ScriptedLlm::start();
    llm.respond_with(move |request| {
        let text = request.last_message();
        // The longest question found in the request wins (one question may contain another).
        let (_, answer) = answers
            .iter()
            .filter(|(question, _)| text.contains(question.as_str()))
            .max_by_key(|(question, _)| question.len())?;
        let sql = match answer {
            Value::Object(o) if request.is_repair() => o.get("repair"),
            Value::Object(o) => o.get("first"),
            other => Some(other),
        }?;
        let reply = Reply::sql(sql.as_str()?);
        Some(if delay.is_zero() {
            reply
        } else {
            Reply::Slow(delay, Box::new(reply))
        })
    });
    println!("{}", llm.url());
    let _ = std::io::stdout().flush();
    loop {
        std::thread::park();
    }
}
