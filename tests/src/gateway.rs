//! sqe-gateway as the tests run it: the binary on a free port, logged in as an authenticator
//! role, and a small HTTP client that reads answers the way chat clients do (a completion, or
//! a stream of chunks with the progress as `reasoning_content`).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

pub use crate::clients::repo;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cluster::free_port;

/// The gateway binary (scripts/test.sh builds it first).
pub fn gateway_binary() -> PathBuf {
    let path = repo().join("target/debug/sqe-gateway");
    assert!(
        path.exists(),
        "build the gateway first: cargo build -p sqe-gateway"
    );
    path
}

/// A running gateway; killed when dropped.
pub struct Gateway {
    pub child: Child,
    pub port: u16,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a chat completion said.
#[derive(Debug, Default)]
pub struct Answer {
    pub status: u16,
    /// The assistant message's content (all content deltas of a stream).
    pub content: String,
    /// The progress of a stream, line by line.
    pub reasoning: Vec<String>,
    /// The error object, when there was one (as the body, or as an event of a stream).
    pub error: Option<Value>,
}

impl Gateway {
    pub fn start(database_url: &str, tokens: &Path) -> Gateway {
        Gateway::start_with(database_url, tokens, &["--pool-size", "8"])
    }

    /// The gateway with options of its own (`--pool-size`, `--pool-wait`, ...).
    pub fn start_with(database_url: &str, tokens: &Path, options: &[&str]) -> Gateway {
        Gateway::start_logged(database_url, tokens, options, None)
    }

    /// `start_with`, its standard error written to `log` when given.
    pub fn start_logged(
        database_url: &str,
        tokens: &Path,
        options: &[&str],
        log: Option<&Path>,
    ) -> Gateway {
        let stderr = match log {
            Some(path) => Stdio::from(std::fs::File::create(path).expect("the gateway's log")),
            None => Stdio::inherit(),
        };
        Gateway::start_with_stderr(database_url, tokens, options, stderr)
    }

    /// `start_with`, its standard error going to `stderr`.
    pub fn start_with_stderr(
        database_url: &str,
        tokens: &Path,
        options: &[&str],
        stderr: Stdio,
    ) -> Gateway {
        let port = free_port();
        let child = Command::new(gateway_binary())
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--database-url",
            ])
            .arg(database_url)
            .arg("--tokens")
            .arg(tokens)
            .args(["--request-timeout", "60"])
            .args(options)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("starting sqe-gateway");
        let mut child = child;
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the gateway did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // What answered is this gateway, not one that held the port before it.
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the gateway exited ({status}) as it started");
        }
        Gateway { child, port }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Sends a chat completion request `body` without reading the answer: the connection, to
    /// read it later or to drop it (a client that goes away).
    pub fn send_chat(&self, token: &str, body: &str) -> std::net::TcpStream {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            stream,
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        stream
    }

    /// The status line the gateway answers `GET /v1/models` with `token`.
    pub fn models_status(&self, token: &str) -> String {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            stream,
            "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
             Connection: close\r\n\r\n"
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response.lines().next().unwrap_or_default().to_string()
    }

    /// POSTs a chat completion request as a client would, with `headers` added.
    pub fn chat(&self, token: &str, body: &Value, headers: &[(&str, &str)]) -> Answer {
        let mut request = ureq::post(&format!("{}/v1/chat/completions", self.url()))
            .set("Authorization", &format!("Bearer {token}"))
            .set("Content-Type", "application/json")
            .timeout(Duration::from_secs(120));
        for (name, value) in headers {
            request = request.set(name, value);
        }
        let response = match request.send_string(&body.to_string()) {
            Ok(response) => response,
            Err(ureq::Error::Status(status, response)) => {
                let text = response.into_string().unwrap_or_default();
                return Answer {
                    status,
                    error: serde_json::from_str(&text).ok(),
                    ..Default::default()
                };
            }
            Err(e) => panic!("the gateway did not answer: {e}"),
        };
        let status = response.status();
        let streamed = response.content_type() == "text/event-stream";
        let text = response.into_string().expect("reading the answer");
        if !streamed {
            let value: Value = serde_json::from_str(&text).expect("a JSON completion");
            return Answer {
                status,
                content: value["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                ..Default::default()
            };
        }
        let mut answer = Answer {
            status,
            ..Default::default()
        };
        for data in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
            if data == "[DONE]" {
                break;
            }
            let event: Value = serde_json::from_str(data).expect("a JSON event");
            if event.get("error").is_some() {
                answer.error = Some(event);
                continue;
            }
            let delta = &event["choices"][0]["delta"];
            if let Some(content) = delta["content"].as_str() {
                answer.content.push_str(content);
            }
            if let Some(reasoning) = delta["reasoning_content"].as_str() {
                answer
                    .reasoning
                    .extend(reasoning.lines().map(str::to_string));
            }
        }
        answer
    }
}
