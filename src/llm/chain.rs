//! The provider chain: `llm_url` first, then the `llm_fallbacks` in order, each with its own
//! model and key, all within one `llm_timeout`. The next endpoint is tried when one is
//! unreachable, times out, answers an HTTP error (429 and 5xx included) or no completion; the
//! time left is shared among the endpoints still to try, and only the last one retries 429 and
//! 5xx. A failed endpoint is skipped for `llm_circuit_breaker` (in this backend), so a dead
//! provider does not cost every question its timeout; when every endpoint is skipped, they are
//! all tried anyway.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::completion::{Batch, Completion, Llm, Message};
use super::endpoint::Endpoint;
use super::openai::{OpenAiClient, Options};
use crate::error::{Error, Result};

thread_local! {
    /// Endpoints (by URL) not to ask until the given time.
    static SKIPPED: RefCell<HashMap<String, Instant>> = RefCell::new(HashMap::new());
}

pub struct Chain {
    clients: Vec<OpenAiClient>,
    timeout: Duration,
    breaker: Duration,
}

impl Chain {
    pub fn new(endpoints: Vec<Endpoint>, options: Options, breaker: Duration) -> Chain {
        Chain {
            clients: endpoints
                .into_iter()
                .map(|e| OpenAiClient::new(e, options))
                .collect(),
            timeout: options.timeout,
            breaker,
        }
    }

    /// Asks the endpoints in order until one answers; the answer, who gave it, and what the
    /// others said.
    fn first_answer<T>(
        &mut self,
        mut ask: impl FnMut(&mut OpenAiClient, Instant, bool) -> Result<T>,
    ) -> Result<(T, String, Vec<String>)> {
        let now = Instant::now();
        let overall = now.checked_add(self.timeout).unwrap_or(now);
        let skipped = |c: &OpenAiClient| {
            SKIPPED.with_borrow(|s| s.get(&c.endpoint()).is_some_and(|until| *until > now))
        };
        let mut order: Vec<usize> = (0..self.clients.len())
            .filter(|&i| !skipped(&self.clients[i]))
            .collect();
        if order.is_empty() {
            order = (0..self.clients.len()).collect();
        }
        let mut failures: Vec<String> = Vec::new();
        let mut last_error = None;
        for (position, &i) in order.iter().enumerate() {
            let left = order.len() - position;
            let now = Instant::now();
            if now >= overall {
                break;
            }
            let last = left == 1;
            let deadline = if last {
                overall
            } else {
                now + (overall - now) / left as u32
            };
            let client = &mut self.clients[i];
            let endpoint = client.endpoint();
            match ask(client, deadline, last) {
                Ok(answer) => {
                    SKIPPED.with_borrow_mut(|s| s.remove(&endpoint));
                    return Ok((answer, endpoint, failures));
                }
                Err(Error::Llm { endpoint, cause }) => {
                    let until = Instant::now().checked_add(self.breaker);
                    SKIPPED.with_borrow_mut(|s| {
                        if let Some(until) = until {
                            s.insert(endpoint.clone(), until);
                        }
                    });
                    failures.push(format!("{endpoint}: {cause}"));
                    last_error = Some(Error::Llm { endpoint, cause });
                }
                Err(other) => return Err(other),
            }
        }
        Err(match (failures.len(), last_error) {
            (1, Some(error)) => error,
            _ => Error::Llm {
                endpoint: order
                    .iter()
                    .map(|&i| self.clients[i].endpoint())
                    .collect::<Vec<_>>()
                    .join(", "),
                cause: if failures.is_empty() {
                    "no answer within sql_query_engine.llm_timeout".into()
                } else {
                    format!("every endpoint failed: {}", failures.join("; "))
                },
            },
        })
    }

    fn one(&mut self, messages: &[Message], exploring: bool) -> Result<Completion> {
        let (mut completions, endpoint, failures) =
            self.first_answer(|client, deadline, retry| {
                if exploring {
                    client.exploring(|c| c.exchange(messages, 1, deadline, retry))
                } else {
                    client.exchange(messages, 1, deadline, retry)
                }
            })?;
        let mut completion = completions.swap_remove(0);
        completion.endpoint = endpoint;
        completion.failures = failures;
        Ok(completion)
    }
}

impl Llm for Chain {
    fn complete(&mut self, messages: &[Message]) -> Result<Completion> {
        self.one(messages, false)
    }

    fn complete_exploring(&mut self, messages: &[Message]) -> Result<Completion> {
        self.one(messages, true)
    }

    fn complete_many(&mut self, messages: &[Message], n: usize) -> Result<Batch> {
        let (mut batch, endpoint, failures) = self.first_answer(|client, deadline, retry| {
            client.exploring(|c| c.many(messages, n, deadline, retry))
        })?;
        for (i, completion) in batch.completions.iter_mut().enumerate() {
            completion.endpoint = endpoint.clone();
            if i == 0 {
                completion.failures = failures.clone();
            }
        }
        Ok(batch)
    }
}
