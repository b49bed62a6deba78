//! What the pipeline and a model exchange: messages, completions, and the trait behind which any
//! model (a chain of HTTP endpoints, or a test's script) answers, so that the heal loop is
//! testable without a network.

use std::time::Instant;

use serde::Serialize;

use crate::error::Result;

/// One message of a chat, as OpenAI-compatible APIs take it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    pub role: &'static str,
    pub content: String,
}

impl Message {
    pub fn system(content: impl Into<String>) -> Self {
        Message {
            role: "system",
            content: content.into(),
        }
    }
    pub fn user(content: impl Into<String>) -> Self {
        Message {
            role: "user",
            content: content.into(),
        }
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Message {
            role: "assistant",
            content: content.into(),
        }
    }
}

/// What one chat completion returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Completion {
    pub content: String,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// The endpoint that answered (without credentials).
    pub endpoint: String,
    /// What the endpoints tried before it said.
    pub failures: Vec<String>,
}

/// Several completions of one request, and how many HTTP requests they took.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    pub completions: Vec<Completion>,
    pub requests: u32,
}

/// A model that answers a conversation. The pipeline depends on this, not on HTTP, so the heal
/// loop is testable without a network.
pub trait Llm {
    fn complete(&mut self, messages: &[Message]) -> Result<Completion>;

    /// Like `complete`, with some sampling freedom (for a model stuck repeating itself).
    fn complete_exploring(&mut self, messages: &[Message]) -> Result<Completion> {
        self.complete(messages)
    }

    /// Ends every request still to come, and the one in flight, at `deadline` at the latest
    /// (the call's answer budget); `None` lifts it. No default: a wrapper that forgot to pass
    /// it on would leave the budget without effect.
    fn cut_at(&mut self, deadline: Option<Instant>);

    /// `n` different completions (sampled), for a vote.
    fn complete_many(&mut self, messages: &[Message], n: usize) -> Result<Batch> {
        let mut batch = Batch::default();
        for _ in 0..n {
            batch.completions.push(self.complete_exploring(messages)?);
            batch.requests += 1;
        }
        Ok(batch)
    }
}
