//! Talking to the model: OpenAI-compatible chat-completion clients (`openai`), chained for
//! fallback (`chain`), for the endpoints configured (`endpoint`), behind a small trait
//! (`completion`).

pub mod breaker;
mod chain;
mod completion;
mod endpoint;
mod openai;
pub mod sent;

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
