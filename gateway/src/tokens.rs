//! Bearer tokens: a file of `TOKEN ROLE` lines (blank lines and `#` comments aside), read at
//! start and again on SIGHUP. A request's token selects the role it runs as; there is no default
//! role, so an unknown or missing token gets 401.

use std::collections::{HashMap, HashSet};
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
pub struct Tokens(Arc<RwLock<InForce>>);

/// The tokens in force: the file's entries, and each token's role by the SHA-256 digest of the
/// token, computed once when they are put in force, so that a request's token costs one digest
/// and one look-up however many tokens there are (and a request with a wrong one no more).
#[derive(Default)]
struct InForce {
    entries: Vec<(String, String)>,
    by_digest: HashMap<[u8; 32], String>,
}

/// One line of a tokens file: its entry, none for a blank line or a comment, or what is wrong
/// with it.
fn entry(line: &str) -> Result<Option<(String, String)>, String> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let mut fields = line.split_whitespace();
    let (Some(token), Some(role), None) = (fields.next(), fields.next(), fields.next()) else {
        return Err("expected TOKEN ROLE".into());
    };
    if token.len() > MAX_TOKEN_BYTES {
        return Err(format!("a token must have at most {MAX_TOKEN_BYTES} bytes"));
    }
    if token.chars().count() < MIN_TOKEN_CHARS {
        return Err(format!(
            "a token must have at least {MIN_TOKEN_CHARS} characters"
        ));
    }
    Ok(Some((token.to_string(), role.to_string())))
}

/// Parses a tokens file.
pub fn parse(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut entries: Vec<(String, String)> = Vec::new();
    let mut seen = HashSet::new();
    for (number, line) in text.lines().enumerate() {
        let Some((token, role)) = entry(line).map_err(|e| format!("line {}: {e}", number + 1))?
        else {
            continue;
        };
        if !seen.insert(token.clone()) {
            return Err(format!("line {}: the token is listed twice", number + 1));
        }
        entries.push((token, role));
    }
    Ok(entries)
}

/// The entries of the lines of a tokens file that parse, less the tokens listed more than once:
/// what a file with a wrong line still says (a token it no longer lists is revoked, though the
/// file is not taken).
fn well_formed(text: &str) -> Vec<(String, String)> {
    let entries: Vec<(String, String)> = text
        .lines()
        .filter_map(|line| entry(line).ok().flatten())
        .collect();
    let mut listed: HashMap<&str, usize> = HashMap::new();
    for (token, _) in &entries {
        *listed.entry(token.as_str()).or_default() += 1;
    }
    entries
        .iter()
        .filter(|(token, _)| listed.get(token.as_str()) == Some(&1))
        .cloned()
        .collect()
}

/// Why a tokens file was not taken; when it could be read, its well-formed entries too.
#[derive(Debug)]
pub struct NotTaken {
    pub why: String,
    pub well_formed: Option<Vec<(String, String)>>,
}

impl std::fmt::Display for NotTaken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

/// The SHA-256 digest of `token`: tokens are looked up by it (the time a look-up takes tells
/// something of the digest, nothing of the token).
fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Tokens {
    /// The entries of the tokens file at `path`.
    pub fn read(path: &str) -> Result<Vec<(String, String)>, NotTaken> {
        let text = std::fs::read_to_string(path).map_err(|e| NotTaken {
            why: format!("{path}: {e}"),
            well_formed: None,
        })?;
        warn_if_others_may_read(path);
        parse(&text).map_err(|e| NotTaken {
            why: format!("{path}: {e}"),
            well_formed: Some(well_formed(&text)),
        })
    }

    /// Puts `entries` in force; returns how many there are.
    pub fn set(&self, entries: Vec<(String, String)>) -> usize {
        let n = entries.len();
        let by_digest = entries
            .iter()
            .map(|(token, role)| (digest(token), role.clone()))
            .collect();
        if let Ok(mut current) = self.0.write() {
            *current = InForce { entries, by_digest };
        }
        n
    }

    /// How many tokens are in force.
    pub fn count(&self) -> usize {
        self.0.read().map_or(0, |current| current.entries.len())
    }

    /// Those of `entries` in force now with the same role.
    pub fn kept(&self, entries: &[(String, String)]) -> Vec<(String, String)> {
        let Ok(current) = self.0.read() else {
            return Vec::new();
        };
        entries
            .iter()
            .filter(|(token, role)| current.by_digest.get(&digest(token)) == Some(role))
            .cloned()
            .collect()
    }

    /// The role of `token`, looked up by its digest, and the token's fingerprint.
    pub fn role(&self, token: &str) -> Option<Role> {
        if token.len() > MAX_TOKEN_BYTES {
            return None;
        }
        let presented = digest(token);
        let name = self.0.read().ok()?.by_digest.get(&presented)?.clone();
        Some(Role {
            name,
            client: fingerprint(token),
        })
    }
}

/// Says so on the log when roles other than the file's owner may read the tokens file: each
/// token in it is a role's password.
fn warn_if_others_may_read(path: &str) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(metadata) = std::fs::metadata(path) {
        if metadata.permissions().mode() & 0o077 != 0 {
            log_line!(
                "sqe-gateway: warning: {path} may be read by others than its owner (mode {:o}): \
                 make it readable by the gateway only (chmod 600)",
                metadata.permissions().mode() & 0o777
            );
        }
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
    fn a_file_with_a_wrong_line_still_says_which_tokens_it_lists() {
        let text = "abcdefghijklmnop01 analyst\nshort reader\n\
                    abcdefghijklmnop02 a\nabcdefghijklmnop02 b\nabcdefghijklmnop03 c d\n";
        assert!(parse(text).is_err());
        assert_eq!(
            well_formed(text),
            vec![("abcdefghijklmnop01".to_string(), "analyst".to_string())]
        );
    }

    #[test]
    fn only_a_listed_token_has_a_role() {
        let tokens = Tokens::default();
        tokens.set(parse("abcdefghijklmnop01 analyst").unwrap());
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
        tokens.set(
            parse(
                "abcdefghijklmnop01 analyst
abcdefghijklmnop02 analyst",
            )
            .unwrap(),
        );
        let (a, b) = (
            tokens.role("abcdefghijklmnop01").unwrap(),
            tokens.role("abcdefghijklmnop02").unwrap(),
        );
        assert_eq!(a.name, b.name);
        assert_ne!(a.client, b.client);
        assert_eq!(tokens.role("abcdefghijklmnop01").unwrap().client, a.client);
    }
}
