//! A chat request's conversation, as the extension takes it. Chat completions are stateless:
//! the client sends the whole conversation every time, so the question is the last user
//! message and the context is what came before it in the request itself, each earlier user
//! question with the SQL of the assistant answer that followed it. Branches, edits and
//! regenerations are followed exactly (the client sends the branch it shows), two chats never
//! merge, and nothing is kept between requests that could be lost or raced.
//!
//! Earlier assistant messages are the client's words: their SQL is context for the model
//! (`nl_ask`'s `turns`), never run, checked or trusted as an answer.

use serde::Deserialize;
use serde_json::{json, Value};

/// Earlier turns passed on, at most (the extension keeps its `session_turns` of them).
const MAX_TURNS: usize = 50;
/// Characters of an earlier question or SQL passed on, at most (the extension's own limit).
const MAX_TURN_CHARS: usize = 20_000;

#[derive(Deserialize, Clone, Debug)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<Value>,
}

/// A message's text: a string, or the text parts of a list of parts.
pub fn text_of(content: &Option<Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// An earlier question and the SQL of the answer that followed it (none when that answer had
/// no SQL, an error say).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    pub question: String,
    pub sql: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversation {
    /// The last user message.
    pub question: String,
    /// The turns before it, oldest first.
    pub turns: Vec<Turn>,
}

impl Conversation {
    /// The conversation of `messages`, or `None` when it has no user message with text.
    /// System, developer and tool messages are not the user's words and are left out.
    pub fn of(messages: &[ChatMessage]) -> Option<Conversation> {
        let mut turns: Vec<Turn> = Vec::new();
        for message in messages {
            let text = text_of(&message.content);
            match message.role.as_str() {
                "user" => turns.push(Turn {
                    question: text.trim().to_string(),
                    sql: None,
                }),
                "assistant" => {
                    // Only the first answer after a question counts (a client may send a
                    // partial answer and its continuation as two messages).
                    if let Some(last) = turns.last_mut().filter(|t| t.sql.is_none()) {
                        last.sql = sql_of(&text);
                    }
                }
                _ => {}
            }
        }
        let last = turns.pop().filter(|t| !t.question.is_empty())?;
        turns.retain(|t| !t.question.is_empty() && t.question.chars().count() <= MAX_TURN_CHARS);
        for turn in &mut turns {
            if turn
                .sql
                .as_ref()
                .is_some_and(|s| s.chars().count() > MAX_TURN_CHARS)
            {
                turn.sql = None;
            }
        }
        let skip = turns.len().saturating_sub(MAX_TURNS);
        Some(Conversation {
            question: last.question,
            turns: turns.split_off(skip),
        })
    }

    /// The earlier turns as `nl_ask` takes them.
    pub fn turns_json(&self) -> Value {
        Value::Array(
            self.turns
                .iter()
                .map(|t| json!({"question": t.question, "sql": t.sql}))
                .collect(),
        )
    }
}

/// The SQL of an answer: its first fenced `sql` block (the gateway's own answers have one),
/// else its first fenced block.
pub fn sql_of(answer: &str) -> Option<String> {
    let mut first_plain: Option<String> = None;
    let mut rest = answer;
    while let Some(open) = rest.find("```") {
        let after = &rest[open + 3..];
        let (tag, body) = after.split_once('\n')?;
        let Some(close) = body.find("```") else {
            break;
        };
        let code = body[..close].trim();
        if !code.is_empty() {
            if tag.trim().eq_ignore_ascii_case("sql") {
                return Some(code.to_string());
            }
            first_plain.get_or_insert_with(|| code.to_string());
        }
        rest = &body[close + 3..];
    }
    first_plain
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
    fn assistant(text: &str) -> ChatMessage {
        ChatMessage {
            role: "assistant".into(),
            content: Some(json!(text)),
        }
    }

    #[test]
    fn earlier_questions_come_with_the_sql_that_answered_them() {
        let messages = [
            ChatMessage {
                role: "system".into(),
                content: Some(json!("You are helpful")),
            },
            user("How many customers?"),
            assistant(
                "1 row.\n\n```sql\nSELECT count(*) FROM customers\n```\n\n| n |\n|---|\n| 10 |",
            ),
            user("Which failed?"),
            assistant("could not answer the question"),
            user("And in Germany?"),
        ];
        let c = Conversation::of(&messages).unwrap();
        assert_eq!(c.question, "And in Germany?");
        assert_eq!(
            c.turns,
            vec![
                Turn {
                    question: "How many customers?".into(),
                    sql: Some("SELECT count(*) FROM customers".into())
                },
                Turn {
                    question: "Which failed?".into(),
                    sql: None
                },
            ]
        );
        assert_eq!(
            c.turns_json()[0],
            json!({"question": "How many customers?", "sql": "SELECT count(*) FROM customers"})
        );
    }

    #[test]
    fn a_conversation_needs_a_last_user_message_with_text() {
        assert_eq!(Conversation::of(&[]), None);
        assert_eq!(Conversation::of(&[user("  ")]), None);
        let parts = ChatMessage {
            role: "user".into(),
            content: Some(json!([{"type": "text", "text": "How many?"}, {"type": "image_url"}])),
        };
        assert_eq!(Conversation::of(&[parts]).unwrap().question, "How many?");
    }

    #[test]
    fn the_sql_of_an_answer_is_its_sql_block() {
        assert_eq!(
            sql_of("```text\nnot it\n```\n```SQL\nSELECT 1\n```"),
            Some("SELECT 1".into())
        );
        assert_eq!(sql_of("```\nSELECT 2\n```"), Some("SELECT 2".into()));
        assert_eq!(sql_of("no code here"), None);
        assert_eq!(sql_of("```sql\nSELECT unclosed"), None);
    }
}
