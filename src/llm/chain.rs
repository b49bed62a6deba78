//! The provider chain: `llm_url` first, then the `llm_fallbacks` in order, each with its own
//! model and key, all within one `llm_timeout`. The next endpoint is tried when one gave no
//! answer in time, or failed (unreachable, an HTTP error, no completion, an empty or oversized
//! one) and a request no role shapes fails there too: when only the call's request failed,
//! that is the call's error (a role would choose where its questions go by shaping them to
//! fail); the
//! time left is shared among the endpoints still to try, and only the last one retries 429 and
//! 5xx. A failed endpoint is skipped for `llm_circuit_breaker` (`breaker`: in every backend
//! of the server when the library is preloaded), so a dead provider does not cost every
//! question its timeout; when every endpoint is skipped, they are all tried anyway. A call's
//! answer budget may end a request sooner (`cut_at`), and a role may lower its `llm_timeout`:
//! time they shortened is not shared (each endpoint in turn may take all that is left), and a
//! request they cut says nothing about the endpoint, so the breaker does not hear of it, and
//! the next endpoint is not asked (a role would otherwise choose where its questions go: a
//! timeout only a distant fallback's answer beats).

use std::time::{Duration, Instant};

use super::breaker;
use super::completion::{Batch, Completion, Llm, Message};
use super::endpoint::Endpoint;
use super::openai::{OpenAiClient, Options, Probe};
use crate::error::{Error, Fault, Result};

pub struct Chain {
    clients: Vec<OpenAiClient>,
    timeout: Duration,
    breaker: Duration,
    /// The role the chain asks for, as it was when the chain was made: `nl_call` runs the model
    /// requests between transactions, as its session user, and what a role's request caused
    /// is that role's (`breaker`).
    role: u32,
    /// When the call's answer budget ends every request.
    cut: Option<Instant>,
    /// The role lowered `llm_timeout` for itself (`settings::llm_timeout_lowered`).
    lowered: bool,
}

/// How long `OpenAiClient::probe` may take at most.
const PROBE_TIME: Duration = Duration::from_secs(5);

impl Chain {
    pub fn new(endpoints: Vec<Endpoint>, options: Options, breaker: Duration) -> Chain {
        // SAFETY: reads the backend's current role.
        let role = unsafe { pgrx::pg_sys::GetUserId() }.to_u32();
        Chain {
            clients: endpoints
                .into_iter()
                .map(|e| OpenAiClient::new(e, options, role))
                .collect(),
            timeout: options.timeout,
            breaker,
            role,
            cut: None,
            lowered: crate::settings::llm_timeout_lowered(),
        }
    }

    /// What `client`'s endpoint does with the request no role shapes (`OpenAiClient::probe`),
    /// given a time of its own that only the server's `llm_timeout` sets (a quarter of it, at
    /// most `PROBE_TIME`): when less is left, it is not asked (`Probe::Unknown`), so that the
    /// moment a role's request fails cannot decide what the endpoint is taken for.
    fn probed(client: &OpenAiClient, timeout: Duration, overall: Instant) -> Probe {
        let probe_time = PROBE_TIME.min(timeout / 4);
        let now = Instant::now();
        if overall.saturating_duration_since(now) < probe_time {
            return Probe::Unknown;
        }
        client.probe(now + probe_time)
    }

    /// Asks the endpoints in order until one answers; the answer, who gave it, and what the
    /// others said.
    fn first_answer<T>(
        &mut self,
        mut ask: impl FnMut(&mut OpenAiClient, Instant, bool) -> Result<T>,
    ) -> Result<(T, String, Vec<String>)> {
        let now = Instant::now();
        let natural = now.checked_add(self.timeout).unwrap_or(now);
        let overall = self.cut.map_or(natural, |cut| cut.min(natural));
        // A share the role's own settings shortened: its answer budget, or an `llm_timeout`
        // it lowered.
        let cut_short = overall < natural || self.lowered;
        let role = self.role;
        let skipped = |c: &OpenAiClient| breaker::skipped(&c.identity(), role, self.breaker);
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
            // Time the role's settings shortened is not shared: the endpoint asked may take
            // all of it (a timeout then ends the request, see below).
            let deadline = if last || cut_short {
                overall
            } else {
                now + (overall - now) / left as u32
            };
            let client = &mut self.clients[i];
            let (endpoint, identity) = (client.endpoint(), client.identity());
            super::sent::note(&endpoint, i != 0);
            match ask(client, deadline, last) {
                Ok(answer) => {
                    breaker::answered(&identity, role);
                    return Ok((answer, endpoint, failures));
                }
                // No helper thread was free: nothing was asked, and no other endpoint would be
                // asked either; the breaker hears nothing of it.
                Err(
                    busy @ Error::Llm {
                        fault: Fault::Busy, ..
                    },
                ) => return Err(busy),
                Err(Error::Llm {
                    endpoint,
                    cause,
                    fault,
                }) => {
                    // A failure within time the role's settings shortened says nothing about
                    // the endpoint, and does not send the question on (see the module's doc):
                    // nor is it judged, the probe's time would be the role's to shape.
                    // Any other failure is judged by a request no role shapes: failed too,
                    // the endpoint is down (remembered, for every backend when the library is
                    // preloaded), and the question goes on; too busy for it too (no answer in
                    // time, a 429), the question goes on, unremembered (the roles' own load
                    // may be what fills it); answered, the failure was this request's own (a
                    // prompt too long, a 429 for its tokens, a refusal): the call's error,
                    // unremembered, so that no role chooses where its questions go by shaping
                    // one to fail. No answer in time still goes on, with the time left: an
                    // endpoint slow for this question cannot be told from one slow for all.
                    // The last endpoint is not probed: nothing is left to ask.
                    let timed_out = Instant::now() >= deadline;
                    let probed = if cut_short || last {
                        Probe::Unknown
                    } else {
                        Chain::probed(client, self.timeout, overall)
                    };
                    if probed == Probe::Failed {
                        breaker::failed(&identity, role, true);
                    }
                    let goes_on = matches!(probed, Probe::Failed | Probe::Busy) || timed_out;
                    failures.push(format!("{endpoint}: {cause}"));
                    last_error = Some(Error::Llm {
                        endpoint,
                        cause,
                        fault,
                    });
                    if cut_short || !goes_on {
                        break;
                    }
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
                fault: Fault::Request,
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

    fn cut_at(&mut self, deadline: Option<Instant>) {
        self.cut = deadline;
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
