//! A scaled-out deployment, for real, on one machine (scripts/topology.sh): a primary, two
//! streaming standbys, Redis, pgbouncer in transaction mode and two gateways, under a bounded
//! load of chat conversations (32 of 5 turns, each turn sent to a random gateway) against the
//! scripted model; one standby and one gateway are killed mid-run. Half of the conversations
//! keep their context on the server (`X-Sqe-Session`: Redis, whichever server answers), half
//! send it with every request.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};
use serde_json::{json, Value};
use sql_query_engine_e2e::gateway::{gateway_binary, repo};
use sql_query_engine_e2e::{Reply, ScriptedLlm};

const CONVERSATIONS: usize = 32;
const TURNS: usize = 5;

/// The deployment scripts/topology.sh started; stopped and removed when dropped.
struct Topology {
    dir: PathBuf,
    env: HashMap<String, String>,
}

impl Topology {
    fn start(llm_url: &str) -> Topology {
        let dir = sql_query_engine_e2e::fresh_dir("sqe-topology");
        let out = Command::new("bash")
            .arg(repo().join("scripts/topology.sh"))
            .arg("start")
            .arg(&dir)
            .args(["--llm-url", llm_url, "--pool-size", "8", "--gateway-bin"])
            .arg(gateway_binary())
            .output()
            .expect("running scripts/topology.sh");
        let topology = Topology {
            env: std::fs::read_to_string(dir.join("topology.env"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|pair| pair.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            dir,
        };
        assert!(
            out.status.success(),
            "scripts/topology.sh start failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        topology
    }

    fn get(&self, name: &str) -> &str {
        self.env
            .get(name)
            .unwrap_or_else(|| panic!("{name} is not in topology.env"))
    }

    fn gateway_url(&self, n: usize) -> String {
        format!("http://127.0.0.1:{}", self.get(&format!("GATEWAY{n}_PORT")))
    }

    fn primary(&self) -> Client {
        Client::connect(
            &format!(
                "host={} port={} user=postgres dbname=shop",
                self.get("PRIMARY_DIR"),
                self.get("PRIMARY_PORT")
            ),
            NoTls,
        )
        .expect("connecting to the primary")
    }

    fn server_log(&self, server: &str) -> String {
        std::fs::read_to_string(self.dir.join(server).join("server.log")).unwrap_or_default()
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(repo().join("scripts/topology.sh"))
            .arg("stop")
            .arg(&self.dir)
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn question(conversation: usize, turn: usize) -> String {
    format!("conversation {conversation} turn {turn}: how many orders are there?")
}

/// One chat completion, as a client that retries on another gateway when one does not answer
/// or answers 502/503/504. The answer's content, or why it never came.
fn ask(
    gateways: &[String],
    mut pick: usize,
    token: &str,
    messages: &[Value],
    session: Option<&str>,
) -> Result<String, String> {
    let body = json!({"model": "shop", "messages": messages}).to_string();
    let mut last = String::new();
    for _ in 0..20 {
        let url = format!("{}/v1/chat/completions", gateways[pick % gateways.len()]);
        let mut request = ureq::post(&url)
            .set("Authorization", &format!("Bearer {token}"))
            .set("Content-Type", "application/json")
            .timeout(Duration::from_secs(60));
        if let Some(session) = session {
            request = request.set("X-Sqe-Session", session);
        }
        match request.send_string(&body) {
            Ok(response) => {
                let value: Value =
                    serde_json::from_str(&response.into_string().unwrap_or_default())
                        .map_err(|e| format!("not a completion: {e}"))?;
                return Ok(value["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string());
            }
            Err(ureq::Error::Status(status, response)) if [502, 503, 504].contains(&status) => {
                last = format!("{status}: {}", response.into_string().unwrap_or_default());
            }
            Err(ureq::Error::Status(status, response)) => {
                return Err(format!(
                    "{status}: {}",
                    response.into_string().unwrap_or_default()
                ))
            }
            Err(e) => last = e.to_string(),
        }
        // Another gateway, after a moment.
        pick += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(format!("no gateway answered: {last}"))
}

#[test]
fn conversations_hop_between_gateways_and_servers_and_survive_losing_one_of_each() {
    let llm = ScriptedLlm::start();
    // Every question is answered after a moment of thought, so that requests are in flight on
    // every server when the failures come.
    llm.respond_with(|_| {
        Some(Reply::Slow(
            Duration::from_millis(150),
            Box::new(Reply::sql("SELECT count(*) AS n FROM orders")),
        ))
    });
    let topology = Topology::start(&llm.url());
    let gateways: Vec<String> = (1..=2).map(|n| topology.gateway_url(n)).collect();
    let token = topology.get("TOKEN").to_string();
    let done = Arc::new(AtomicUsize::new(0));
    let failures: Arc<Mutex<Vec<String>>> = Arc::default();

    // Kill one standby and one gateway once a third of the turns are answered.
    let killer = {
        let done = Arc::clone(&done);
        let standby = topology.get("STANDBY1_DIR").to_string();
        let gateway_pid = topology.get("GATEWAY1_PID").to_string();
        std::thread::spawn(move || {
            let started = Instant::now();
            while done.load(Ordering::SeqCst) < CONVERSATIONS * TURNS / 3 {
                assert!(started.elapsed() < Duration::from_secs(120), "no progress");
                std::thread::sleep(Duration::from_millis(10));
            }
            let stopped = Command::new("bash")
                .arg(repo().join("scripts/pg-cluster.sh"))
                .args(["stop", &standby])
                .status()
                .unwrap();
            assert!(stopped.success());
            let killed = Command::new("kill")
                .args(["-9", &gateway_pid])
                .status()
                .unwrap();
            assert!(killed.success());
            done.load(Ordering::SeqCst)
        })
    };

    let started = Instant::now();
    let clients: Vec<_> = (0..CONVERSATIONS)
        .map(|c| {
            let (gateways, token) = (gateways.clone(), token.clone());
            let (done, failures) = (Arc::clone(&done), Arc::clone(&failures));
            std::thread::spawn(move || {
                let server_side = c % 2 == 0;
                let session = format!("topology-{c}");
                let mut messages: Vec<Value> = Vec::new();
                // A random gateway per turn (a fixed sequence per conversation).
                let mut seed = (c as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                for turn in 1..=TURNS {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let asked = json!({"role": "user", "content": question(c, turn)});
                    let sent = if server_side {
                        vec![asked.clone()]
                    } else {
                        let mut all = messages.clone();
                        all.push(asked.clone());
                        all
                    };
                    let answer = ask(
                        &gateways,
                        seed as usize,
                        &token,
                        &sent,
                        server_side.then_some(session.as_str()),
                    );
                    match answer {
                        Ok(content) if content.starts_with("1 row") => {
                            messages.push(asked);
                            messages.push(json!({"role": "assistant", "content": content}));
                        }
                        Ok(content) => failures
                            .lock()
                            .unwrap()
                            .push(format!("{}: answered {content:?}", question(c, turn))),
                        Err(e) => failures
                            .lock()
                            .unwrap()
                            .push(format!("{}: {e}", question(c, turn))),
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for client in clients {
        client.join().unwrap();
    }
    let elapsed = started.elapsed();
    let killed_after = killer.join().unwrap();
    let failures = failures.lock().unwrap().clone();
    assert!(failures.is_empty(), "requests failed: {failures:#?}");
    assert!(
        killed_after < CONVERSATIONS * TURNS,
        "the failures came before the run ended"
    );
    eprintln!(
        "{} turns in {elapsed:?}; standby 1 and gateway 1 killed after {killed_after}",
        CONVERSATIONS * TURNS
    );

    // Every follow-up was asked with all the earlier turns of its conversation, wherever the
    // earlier ones were answered.
    let requests = llm.requests();
    for c in 0..CONVERSATIONS {
        for turn in 2..=TURNS {
            let asked: Vec<String> = requests
                .iter()
                .filter(|r| r.last_message().contains(&question(c, turn)))
                .map(|r| r.text())
                .collect();
            assert!(!asked.is_empty(), "{} was never asked", question(c, turn));
            for text in &asked {
                for earlier in 1..turn {
                    assert!(
                        text.contains(&question(c, earlier)),
                        "{} was asked without {}",
                        question(c, turn),
                        question(c, earlier)
                    );
                }
            }
        }
    }

    // The standbys answered the questions (standby 2 on after standby 1 was gone), the primary
    // kept the history of every turn, and every turn is in a server's audit log.
    let logs: Vec<String> = ["primary", "standby1", "standby2"]
        .iter()
        .map(|s| topology.server_log(s))
        .collect();
    let answered_on = |log: &str| log.matches("sql_query_engine: nl_call by role").count();
    assert!(answered_on(&logs[1]) > 0, "standby 1 answered nothing");
    assert!(answered_on(&logs[2]) > 0, "standby 2 answered nothing");
    let mut primary = topology.primary();
    for c in 0..CONVERSATIONS {
        for turn in 1..=TURNS {
            let q = question(c, turn);
            assert!(
                logs.iter().any(|log| log.contains(&format!("input: {q}"))),
                "{q} is in no audit log"
            );
            let recorded: i64 = primary
                .query_one(
                    "SELECT count(*) FROM nl_history WHERE question = $1 \
                     AND role_id = 'analyst'::regrole AND function = 'nl_call'",
                    &[&q],
                )
                .unwrap()
                .get(0);
            assert!(recorded >= 1, "{q} has no history on the primary");
        }
    }
    // The surviving gateway took the dead standby out of its rotation.
    let gateway_log = |n: usize| {
        std::fs::read_to_string(topology.dir.join(format!("gateway{n}.log"))).unwrap_or_default()
    };
    let waited = Instant::now();
    while !gateway_log(2).contains("left the rotation") {
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "gateway 2 never noticed: {}",
            gateway_log(2)
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // The server-side sessions are in Redis, the one session store of the deployment.
    let redis = redis::Client::open(format!(
        "redis://127.0.0.1:{}/0",
        topology.get("REDIS_PORT")
    ))
    .unwrap()
    .get_connection_with_timeout(Duration::from_secs(5))
    .unwrap();
    let mut redis = redis;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("sql_query_engine:*:session:*/topology-*")
        .query(&mut redis)
        .unwrap();
    assert_eq!(keys.len(), CONVERSATIONS / 2, "{keys:?}");
    // Named for the token that asked (`<fingerprint>/NAME`), the same at every gateway: that is
    // how a conversation hops between them.
    let clients: std::collections::BTreeSet<&str> = keys
        .iter()
        .filter_map(|k| k.rsplit_once('/')?.0.rsplit_once(':').map(|(_, c)| c))
        .collect();
    assert_eq!(clients.len(), 1, "{keys:?}");
    // Each holds every turn of its conversation once: a turn retried after a failure (and maybe
    // recorded by the server that failed, or by a call the killed gateway left running, which
    // may finish after the retry) was not kept twice.
    for key in &keys {
        let c: usize = key
            .rsplit('-')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{key}"));
        let turns: Vec<String> = redis::cmd("LRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .query(&mut redis)
            .unwrap();
        let mut questions: Vec<String> = turns
            .iter()
            .map(|t| serde_json::from_str::<Value>(t).unwrap()["question"].to_string())
            .collect();
        questions.sort();
        let expected: Vec<String> = (1..=TURNS)
            .map(|turn| Value::from(question(c, turn)).to_string())
            .collect();
        assert_eq!(questions, expected, "{key}");
    }
}
