//! A real redis-server for the tests (from the system's packages), and a Redis that never
//! answers, for the slow-Redis cases.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        let mut server = RedisServer {
            port: crate::cluster::free_port(),
            child: None,
        };
        server.restart();
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Starts (again) on the same port, in memory only, and waits until it answers.
    pub fn restart(&mut self) {
        self.stop();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .spawn()
            .expect("starting redis-server (is it installed? scripts/setup.sh installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.client().is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("redis-server did not answer on port {}", self.port);
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn client(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(1))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A TCP server that accepts connections and never says a word: a hung Redis.
pub fn silent_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    port
}

/// A TCP server that answers every command with the start of a reply of `announced` bytes and
/// then sends bytes for as long as the connection takes them: a hostile Redis, or whoever
/// answers at its address.
pub fn flooding_server(announced: u64) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                let mut buf = [0u8; 4096];
                if stream.read(&mut buf).unwrap_or(0) == 0 {
                    return;
                }
                let chunk = vec![b'x'; 1 << 20];
                if stream
                    .write_all(format!("${announced}\r\n").as_bytes())
                    .is_err()
                {
                    return;
                }
                let mut sent = 0u64;
                while sent < announced && stream.write_all(&chunk).is_ok() {
                    sent += chunk.len() as u64;
                }
            });
        }
    });
    port
}
