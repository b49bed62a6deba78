//! Bearer tokens: a file of `TOKEN ROLE` lines (blank lines and `#` comments aside), read at
//! start and again on SIGHUP. A request's token selects the role it runs as; there is no default
//! role, so an unknown or missing token gets 401.

use std::sync::{Arc, RwLock};

use sha2::{Digest, Sha256};

/// Who a request is (set by `authenticate`): the role its token runs as, and the token's
/// fingerprint, which keeps the client's conversations apart from those of other tokens of
/// the same role (`Call::of_client`).
#[derive(Clone, Debug)]
pub struct Role {
    pub name: String,
    pub client: String,
}

/// Shortest token accepted: a guessable one would make the role it maps to public.
const MIN_TOKEN_CHARS: usize = 16;
/// Longest token accepted, in the file and in a request: a presented token is hashed before
/// anything else, whoever sends it.
const MAX_TOKEN_BYTES: usize = 1024;

#[derive(Clone, Default)]
pub struct Tokens(Arc<RwLock<Vec<(String, String)>>>);

/// Parses a tokens file.
pub fn parse(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut entries: Vec<(String, String)> = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(token), Some(role), None) = (fields.next(), fields.next(), fields.next()) else {
            return Err(format!("line {}: expected TOKEN ROLE", number + 1));
        };
        if token.len() > MAX_TOKEN_BYTES {
            return Err(format!(
                "line {}: a token must have at most {MAX_TOKEN_BYTES} bytes",
                number + 1
            ));
        }
        if token.chars().count() < MIN_TOKEN_CHARS {
            return Err(format!(
                "line {}: a token must have at least {MIN_TOKEN_CHARS} characters",
                number + 1
            ));
        }
        if entries.iter().any(|(t, _)| t == token) {
            return Err(format!("line {}: the token is listed twice", number + 1));
        }
        entries.push((token.to_string(), role.to_string()));
    }
    Ok(entries)
}

/// Compares the SHA-256 digest of `a` with `presented`, a presented token's, without stopping
/// at the first difference: the time taken tells neither where they differ nor how long the
/// token is.
fn same(a: &str, presented: &[u8]) -> bool {
    Sha256::digest(a.as_bytes())
        .iter()
        .zip(presented)
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

impl Tokens {
    /// The entries of the tokens file at `path`.
    pub fn read(path: &str) -> Result<Vec<(String, String)>, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        parse(&text).map_err(|e| format!("{path}: {e}"))
    }

    /// Puts `entries` in force; returns how many there are.
    pub fn set(&self, entries: Vec<(String, String)>) -> usize {
        let n = entries.len();
        if let Ok(mut current) = self.0.write() {
            *current = entries;
        }
        n
    }

    /// Those of `entries` in force now with the same role.
    pub fn kept(&self, entries: &[(String, String)]) -> Vec<(String, String)> {
        let Ok(current) = self.0.read() else {
            return Vec::new();
        };
        entries
            .iter()
            .filter(|entry| current.contains(entry))
            .cloned()
            .collect()
    }

    /// The role of `token`, comparing it with every entry, and the token's fingerprint.
    pub fn role(&self, token: &str) -> Option<Role> {
        if token.len() > MAX_TOKEN_BYTES {
            return None;
        }
        let presented = Sha256::digest(token.as_bytes());
        let entries = self.0.read().ok()?;
        let mut found = None;
        for (t, role) in entries.iter() {
            if same(t, &presented) {
                found = Some(role.clone());
            }
        }
        found.map(|name| Role {
            name,
            client: fingerprint(token),
        })
    }
}

/// A name for a token that does not reveal it: the first 64 bits of its SHA-256, the same for
/// the same token in every release. It prefixes the client's session names, which its role can
/// read back (`nl_sessions`, `nl_history`).
fn fingerprint(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_files_parse_strictly() {
        let entries =
            parse("# analysts\nabcdefghijklmnop01 analyst\n\n  qrstuvwxyz0123456 reader  \n")
                .unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[1], ("qrstuvwxyz0123456".into(), "reader".into()));
        assert!(parse("short analyst").is_err());
        assert!(parse("abcdefghijklmnop01").is_err());
        assert!(parse("abcdefghijklmnop01 a b").is_err());
        assert!(parse("abcdefghijklmnop01 a\nabcdefghijklmnop01 b").is_err());
        assert!(parse(&format!("{} a", "x".repeat(1025))).is_err());
    }

    #[test]
    fn only_a_listed_token_has_a_role() {
        let tokens = Tokens::default();
        *tokens.0.write().unwrap() = parse("abcdefghijklmnop01 analyst").unwrap();
        let role = tokens.role("abcdefghijklmnop01").unwrap();
        assert_eq!(role.name, "analyst");
        assert!(!role.client.contains("abcdefghijklmnop01"));
        assert!(tokens.role("abcdefghijklmnop02").is_none());
        assert!(tokens.role("").is_none());
        // A presented token longer than any listed one is not even hashed.
        assert!(tokens.role(&"abcdefghijklmnop01".repeat(100)).is_none());
    }

    #[test]
    fn two_tokens_of_one_role_are_two_clients() {
        let tokens = Tokens::default();
        *tokens.0.write().unwrap() = parse(
            "abcdefghijklmnop01 analyst
abcdefghijklmnop02 analyst",
        )
        .unwrap();
        let (a, b) = (
            tokens.role("abcdefghijklmnop01").unwrap(),
            tokens.role("abcdefghijklmnop02").unwrap(),
        );
        assert_eq!(a.name, b.name);
        assert_ne!(a.client, b.client);
        assert_eq!(tokens.role("abcdefghijklmnop01").unwrap().client, a.client);
    }
}
