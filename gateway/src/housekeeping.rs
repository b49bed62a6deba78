//! The housekeeping requests chat UIs send to the chat model besides the user's questions: a
//! title for the chat, tags, follow-up suggestions, search queries. They are not questions
//! about the data; asking the database would cost a model call, a query and a history row each
//! (about three per user message in Open WebUI), so the gateway answers them itself, in the
//! form each client parses, and they never become history.
//!
//! Recognised by their documented shapes (fixtures recorded from the clients are in
//! tests/fixtures/chat_clients):
//! - Open WebUI's task templates (title, tags, follow-ups, queries, autocomplete, image
//!   prompt): one user message that starts with `### Task:` and says in its `### Output`
//!   section which JSON object it wants; the chat so far is inside `<chat_history>`.
//! - LibreChat's title request: a prompt asking for a concise title of the conversation,
//!   answered with the title as plain text.

use serde_json::{json, Value};

use crate::conversation::{text_of, ChatMessage};

/// Words of a title, at most, and its characters.
const TITLE_WORDS: usize = 8;
const TITLE_CHARS: usize = 60;

/// A housekeeping request and what it asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Task {
    /// Open WebUI: a JSON object with this one key.
    OpenWebUi { key: String, chat: String },
    /// LibreChat: a title, as plain text, or (its `structured` title method) as the JSON
    /// object `{"language": ..., "title": ...}`.
    LibreChatTitle { chat: String, structured: bool },
}

impl Task {
    /// What the request is, when it is housekeeping.
    pub fn of(messages: &[ChatMessage]) -> Option<Task> {
        let [.., last] = messages else {
            return None;
        };
        let text = text_of(&last.content);
        let text = text.trim_start();
        if let Some(task) = open_webui(text) {
            return Some(task);
        }
        librechat_title(messages, text)
    }

    /// The answer, in the form the client parses.
    pub fn answer(&self) -> String {
        match self {
            Task::OpenWebUi { key, chat } => {
                let value = match key.as_str() {
                    "title" => json!(title_of(chat)),
                    "prompt" | "text" | "emoji" => json!(""),
                    _ => json!([]),
                };
                let mut object = serde_json::Map::new();
                object.insert(key.clone(), value);
                Value::Object(object).to_string()
            }
            Task::LibreChatTitle {
                chat,
                structured: false,
            } => title_of(chat),
            // The language is the client's to detect; the title is all it shows.
            Task::LibreChatTitle {
                chat,
                structured: true,
            } => json!({"language": "", "title": title_of(chat)}).to_string(),
        }
    }
}

/// Open WebUI's task templates: `### Task:` first, a `### Output` section naming the JSON
/// object's key, the chat in `<chat_history>` (the autocomplete template has its key under
/// `### **Output Rules**`).
fn open_webui(text: &str) -> Option<Task> {
    if !text.starts_with("### Task:") {
        return None;
    }
    let output = text
        .find("### Output")
        .or_else(|| text.find("Output Rules"))?;
    let key = first_json_key(&text[output..])?;
    let chat = between(text, "<chat_history>", "</chat_history>").unwrap_or_default();
    Some(Task::OpenWebUi {
        key,
        chat: first_user_line(&chat, "USER:"),
    })
}

/// LibreChat's title prompts (@librechat/agents): "Provide a concise, 5-word-or-less title for
/// the conversation ..." (the default `completion` method; older releases began "Please
/// generate"), or "Analyze this conversation and provide: ... A concise title ..." (the
/// `structured` and `functions` methods), the conversation as `User: ...` / `AI: ...` lines.
fn librechat_title(messages: &[ChatMessage], text: &str) -> Option<Task> {
    let lower = text.to_lowercase();
    let completion = lower.contains("title for the conversation");
    let structured = lower.starts_with("analyze this conversation and provide")
        && lower.contains("concise title");
    if !completion && !structured {
        return None;
    }
    let all: String = messages
        .iter()
        .map(|m| text_of(&m.content))
        .collect::<Vec<_>>()
        .join("\n");
    Some(Task::LibreChatTitle {
        chat: first_user_line(&all, "User:"),
        structured,
    })
}

/// The first `"key":` of `text`.
fn first_json_key(text: &str) -> Option<String> {
    let mut rest = text;
    while let Some(open) = rest.find('"') {
        let after = &rest[open + 1..];
        let close = after.find('"')?;
        let key = &after[..close];
        let tail = after[close + 1..].trim_start();
        if tail.starts_with(':')
            && !key.is_empty()
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Some(key.to_string());
        }
        rest = &after[close + 1..];
    }
    None
}

fn between(text: &str, open: &str, close: &str) -> Option<String> {
    let start = text.find(open)? + open.len();
    let end = text[start..].find(close).map_or(text.len(), |e| start + e);
    Some(text[start..end].to_string())
}

/// The text after the first line that starts with `label` (the chat's first question).
fn first_user_line(chat: &str, label: &str) -> String {
    chat.lines()
        .find_map(|line| line.trim_start().strip_prefix(label))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// A chat's title from its first question: the question without its closing punctuation,
/// or its first words and an ellipsis.
fn title_of(question: &str) -> String {
    let words: Vec<&str> = question.split_whitespace().collect();
    let mut title: String = words[..words.len().min(TITLE_WORDS)]
        .join(" ")
        .chars()
        .take(TITLE_CHARS)
        .collect();
    while title.ends_with(['?', '.', '!', ',', ';', ':']) {
        title.pop();
    }
    if words.len() > TITLE_WORDS {
        title.push('…');
    }
    if title.is_empty() {
        "Question about the data".into()
    } else {
        title
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(text: &str) -> ChatMessage {
        ChatMessage {
            role: "user".into(),
            content: Some(json!(text)),
        }
    }

    #[test]
    fn a_title_is_the_first_question_shortened() {
        assert_eq!(
            title_of("How many customers are there?"),
            "How many customers are there"
        );
        assert_eq!(
            title_of("Which of our products were never ordered by anyone at all?"),
            "Which of our products were never ordered by…"
        );
        assert_eq!(title_of(""), "Question about the data");
    }

    #[test]
    fn questions_are_not_housekeeping() {
        assert_eq!(Task::of(&[user("How many customers are there?")]), None);
        assert_eq!(
            Task::of(&[user("What is the title of the newest book?")]),
            None
        );
        assert_eq!(Task::of(&[]), None);
    }

    #[test]
    fn an_open_webui_task_is_answered_with_its_key() {
        let task = Task::of(&[user(
            "### Task:\nSomething new.\n### Output:\nJSON format: { \"answers\": [\"a\"] }\n\
             ### Chat History:\n<chat_history>\nUSER: How many?\nASSISTANT: 3\n</chat_history>",
        )])
        .unwrap();
        assert_eq!(task.answer(), r#"{"answers":[]}"#);
    }
}
