//! The endpoints the extension talks to, as a superuser configured them: `llm_url` and the
//! fallbacks, each with its model and the file its key is read from, and how their URLs are
//! shown without credentials. A key is read from its file when a request is made, and belongs
//! to its endpoint alone.

use crate::error::{Error, Result};
use crate::settings;

/// One endpoint: where requests go, and the key that belongs to it (and to no other URL).
#[derive(Clone)]
pub struct Endpoint {
    pub base_url: String,
    pub model: Option<String>,
    pub api_key: Option<String>,
}

/// One endpoint of the chain as configured: URL, model, and the file its key is in.
#[derive(Debug, Clone, PartialEq, Eq)]
struct EndpointSetting {
    pub url: String,
    pub model: Option<String>,
    pub key_file: Option<String>,
    /// Which setting names the key file, for errors (which never show the path: the settings
    /// are for superusers to read, the errors for whoever asked).
    pub key_setting: String,
}

impl EndpointSetting {
    /// The endpoint with its key read.
    fn endpoint(&self) -> Result<Endpoint> {
        let api_key = match &self.key_file {
            Some(path) => Some(read_key_file(path, &self.key_setting)?),
            None => None,
        };
        Ok(Endpoint {
            base_url: self.url.clone(),
            model: self.model.clone(),
            api_key,
        })
    }
}

/// `URL [model=NAME] [key_file=PATH], ...`. Errors name the entry by its place, never by its
/// text, which may hold credentials.
fn parse_fallbacks(text: &str) -> std::result::Result<Vec<EndpointSetting>, String> {
    let mut endpoints = Vec::new();
    for (n, entry) in text
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .enumerate()
    {
        let place = n + 1;
        let mut parts = entry.split_whitespace();
        let url = parts.next().unwrap_or_default().to_string();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!("entry {place} does not start with an http(s) URL"));
        }
        let mut endpoint = EndpointSetting {
            url,
            model: None,
            key_file: None,
            key_setting: format!("the key_file of sql_query_engine.llm_fallbacks' entry {place}"),
        };
        for part in parts {
            match part.split_once('=') {
                Some(("model", v)) if !v.is_empty() => endpoint.model = Some(v.to_string()),
                Some(("key_file", v)) if !v.is_empty() => endpoint.key_file = Some(v.to_string()),
                _ => {
                    return Err(format!(
                        "in entry {place}, a word after the URL is not model=NAME or key_file=PATH"
                    ))
                }
            }
        }
        endpoints.push(endpoint);
    }
    Ok(endpoints)
}

/// The chain of endpoints as configured, with their keys read: `llm_url` with its model and key
/// file, then the fallbacks.
pub fn configured() -> Result<Vec<Endpoint>> {
    let url = settings::llm_url().ok_or_else(|| Error::Setting {
        message: "sql_query_engine.llm_url is not set".into(),
        hint: "Point it at an OpenAI-compatible API, e.g. \
               SET sql_query_engine.llm_url = 'http://127.0.0.1:8080/v1'."
            .into(),
    })?;
    let mut endpoints = vec![EndpointSetting {
        url,
        model: settings::llm_model(),
        key_file: settings::llm_api_key_file(),
        key_setting: "sql_query_engine.llm_api_key_file".into(),
    }];
    if let Some(text) = settings::llm_fallbacks() {
        endpoints.extend(parse_fallbacks(&text).map_err(|e| Error::Setting {
            message: format!("sql_query_engine.llm_fallbacks cannot be used: {e}"),
            hint: "Write it as URL [model=NAME] [key_file=PATH], comma-separated.".into(),
        })?);
    }
    endpoints.iter().map(EndpointSetting::endpoint).collect()
}

/// Longest key file read.
const MAX_KEY_BYTES: u64 = 4096;

/// A key from `path`: the file's content without surrounding blank space. Errors name the
/// setting that names the file (`setting`), never the file or its content.
fn read_key_file(path: &str, setting: &str) -> Result<String> {
    use std::io::Read;
    let unreadable = |cause: String| Error::Setting {
        message: format!("the API key file of {setting} cannot be used: {cause}"),
        hint: "It must be a file the server's operating-system user can read, holding only the \
               key."
            .into(),
    };
    let file = std::fs::File::open(path).map_err(|e| unreadable(e.to_string()))?;
    let mut key = String::new();
    file.take(MAX_KEY_BYTES + 1)
        .read_to_string(&mut key)
        .map_err(|e| unreadable(e.to_string()))?;
    if key.len() as u64 > MAX_KEY_BYTES {
        return Err(unreadable(format!(
            "it is longer than {MAX_KEY_BYTES} bytes"
        )));
    }
    let key = key.trim();
    if key.is_empty() || key.contains(['\r', '\n']) {
        return Err(unreadable("it must hold one key on one line".into()));
    }
    Ok(key.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fallbacks_parse_strictly() {
        let chain = parse_fallbacks(
            "https://api.groq.com/openai/v1 model=llama key_file=/etc/sqe/groq.key, http://127.0.0.1:9/v1",
        )
        .unwrap();
        assert_eq!(chain.len(), 2);
        assert_eq!(chain[0].model.as_deref(), Some("llama"));
        assert_eq!(chain[0].key_file.as_deref(), Some("/etc/sqe/groq.key"));
        assert_eq!(
            (chain[1].model.as_deref(), chain[1].key_file.as_deref()),
            (None, None)
        );
        assert!(parse_fallbacks("ftp://x").is_err());
        assert!(parse_fallbacks("http://x key=abc").is_err());
        assert_eq!(parse_fallbacks(" ").unwrap(), vec![]);
        // What is wrong is said by place, never by the text, which may hold credentials.
        for text in [
            "http://a/v1, ftp://u:PW1@b/v1",
            "http://a/v1, http://b/v1 sk-PW1",
        ] {
            let error = parse_fallbacks(text).unwrap_err();
            assert!(
                error.contains("entry 2") && !error.contains("PW1"),
                "{error}"
            );
        }
    }
}
