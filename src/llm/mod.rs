//! Talking to the model: an OpenAI-compatible chat-completion client, and the interruptible
//! wait that keeps a backend responsive to Ctrl-C while a request is in flight.

mod openai;

pub use openai::{Endpoint, OpenAiClient, Options};

use crate::error::Result;
use crate::prompt::Message;

/// What one chat completion returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Completion {
    pub content: String,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// A model that answers a conversation. The pipeline depends on this, not on HTTP, so the heal
/// loop is testable without a network.
pub trait Llm {
    fn complete(&mut self, messages: &[Message]) -> Result<Completion>;

    /// Like `complete`, with some sampling freedom (for a model stuck repeating itself).
    fn complete_exploring(&mut self, messages: &[Message]) -> Result<Completion> {
        self.complete(messages)
    }
}
