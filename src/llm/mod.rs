//! Talking to the model: OpenAI-compatible chat-completion clients (`openai`), chained for
//! fallback (`chain`), for the endpoints configured (`endpoint`), behind a small trait
//! (`completion`).

pub mod breaker;
mod chain;
mod completion;
mod endpoint;
mod openai;

use std::cell::RefCell;
use std::time::Duration;

pub use chain::Chain;
pub use completion::{Batch, Completion, Llm, Message};
pub use openai::Options;

use crate::error::Result;
use crate::settings;

/// The model as configured: the chain of endpoints, with their keys read; JSON output is asked
/// for when `json_mode` (and the setting) say so.
pub fn configured(json_mode: bool) -> Result<Chain> {
    Ok(Chain::new(
        endpoint::configured()?,
        Options {
            temperature: settings::temperature(),
            timeout: Duration::from_millis(settings::llm_timeout_ms()),
            json_mode: json_mode && settings::json_mode(),
            max_tokens: settings::max_tokens(),
            max_response_bytes: settings::max_response_bytes(),
        },
        settings::llm_circuit_breaker(),
    ))
}

/// Endpoints noted at most: as many as a server configures, whatever a call asks.
const MAX_SENT_TO: usize = 32;

thread_local! {
    /// The endpoints this backend sent a request to, each once, oldest first, as `endpoint`
    /// shows them: a call's audit line names those its requests went to, answered or not
    /// (`sent_since`).
    static SENT_TO: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Notes that a request goes to `endpoint`.
fn note_sent(endpoint: &str) {
    SENT_TO.with_borrow_mut(|sent| {
        if sent.len() < MAX_SENT_TO && !sent.iter().any(|e| e == endpoint) {
            sent.push(endpoint.to_string());
        }
    });
}

/// Where requests noted from now on begin (`sent_since`, `forget_since`).
pub fn sent_mark() -> usize {
    SENT_TO.with_borrow(Vec::len)
}

/// The endpoints requests went to since `mark`.
pub fn sent_since(mark: usize) -> Vec<String> {
    SENT_TO.with_borrow(|sent| sent.get(mark..).unwrap_or_default().to_vec())
}

/// Forgets the endpoints noted since `mark` (the call that took it ended).
pub fn forget_since(mark: usize) {
    SENT_TO.with_borrow_mut(|sent| sent.truncate(mark));
}
