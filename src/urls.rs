//! What of a URL may be shown: an endpoint's (the model's, Redis's) URL goes into messages and
//! traces without the credentials it may carry.

/// A URL as it may be shown: without the credentials it may carry.
pub fn redact_url(url: &str) -> String {
    let (shown, _) = secrets_of(url);
    shown
}

/// A URL's parts that may be shown (scheme, host and port, as the URL parser reads them; a
/// path only as `/…`) and those that may not (the user information, the path, the query and
/// the fragment: a key may ride in any, a proxy's token in the path). A URL the parser cannot read (a password with an unescaped `/`, `?` or `#` in it),
/// or that has an `@` the parser did not read as the end of user information, shows its scheme
/// alone, and all of it is a secret.
fn secrets_of(url: &str) -> (String, Vec<String>) {
    // An `@` the parser did not read as the end of user information (`u:2024/pw@h` reads as
    // host `u`, port 2024) may end a password: such a URL is read as unparseable.
    let unread_at = |parsed: &url::Url| {
        let at_left = [Some(parsed.path()), parsed.query(), parsed.fragment()]
            .into_iter()
            .flatten()
            .any(|part| part.contains('@'));
        let no_user = parsed.username().is_empty() && parsed.password().is_none();
        at_left
            || (no_user
                && url
                    .split_once("://")
                    .is_some_and(|(_, rest)| rest.contains('@')))
    };
    let parsed = match url::Url::parse(url) {
        Ok(parsed) if !unread_at(&parsed) => parsed,
        _ => {
            let shown = match url.split_once("://") {
                Some((scheme, _))
                    if scheme
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) =>
                {
                    format!("{scheme}://…")
                }
                _ => "…".to_string(),
            };
            return (shown, vec![url.to_string()]);
        }
    };
    let mut secrets = Vec::new();
    let user = parsed.username();
    match parsed.password() {
        Some(password) => secrets.push(format!("{user}:{password}")),
        None if !user.is_empty() => secrets.push(user.to_string()),
        None => {}
    }
    secrets.extend(
        [parsed.query(), parsed.fragment()]
            .into_iter()
            .flatten()
            .filter(|s| !s.is_empty())
            .map(str::to_string),
    );
    // Each part alone too, as written and decoded: an endpoint may echo one (the password, a
    // query parameter's value) without the rest. Parts shorter than MIN_PART are no secret
    // worth mangling every message for.
    // A path is shown unless a segment of it is as long as a secret worth hiding (`/v1`, a
    // Redis database's `/0` are shown).
    let path = parsed.path();
    let secret_path = path.split('/').any(|s| s.chars().count() >= MIN_PART);
    if secret_path {
        secrets.push(path.trim_end_matches('/').to_string());
    }
    let mut parts: Vec<String> = [Some(user), parsed.password(), parsed.fragment()]
        .into_iter()
        .flatten()
        .chain(path.split('/').filter(|_| secret_path))
        .map(str::to_string)
        .collect();
    for part in parts.clone() {
        if let Ok(decoded) = urlencoding_decode(&part) {
            parts.push(decoded);
        }
    }
    for (name, value) in parsed.query_pairs() {
        parts.extend([name.into_owned(), value.into_owned()]);
    }
    if let Some(query) = parsed.query() {
        parts.extend(query.split(['&', '=']).map(str::to_string));
    }
    // The Basic credential an HTTP client makes of the user information (base64 of
    // `user:password`, as written and decoded), which an endpoint may echo in a header; also
    // without its padding, which an echo may drop or write percent-encoded (`%3D`).
    if !user.is_empty() || parsed.password().is_some() {
        let password = parsed.password().unwrap_or_default();
        let written = format!("{user}:{password}");
        let decoded = format!(
            "{}:{}",
            urlencoding_decode(user).unwrap_or_else(|_| user.to_string()),
            urlencoding_decode(password).unwrap_or_else(|_| password.to_string())
        );
        for encoded in [base64(written.as_bytes()), base64(decoded.as_bytes())] {
            let unpadded = encoded.trim_end_matches('=').to_string();
            secrets.extend(
                [encoded, unpadded]
                    .into_iter()
                    .filter(|s| s.len() >= MIN_PART),
            );
        }
    }
    secrets.extend(parts.into_iter().filter(|p| p.chars().count() >= MIN_PART));
    // Longest first: a part inside another is replaced after it.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets.dedup();
    let host = parsed.host_str().unwrap_or_default();
    let port = parsed.port().map(|p| format!(":{p}")).unwrap_or_default();
    let shown = format!(
        "{}://{host}{port}{}",
        parsed.scheme(),
        if secret_path { "/…" } else { path }
    );
    (shown, secrets)
}

/// `bytes` in standard base64, padded (as HTTP's Basic scheme writes credentials).
fn base64(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let group = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &b)| acc | (u32::from(b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(DIGITS[((group >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Characters a part of a URL's credentials has at least to be replaced on its own.
const MIN_PART: usize = 4;

/// `%XX` escapes decoded, when they make UTF-8.
fn urlencoding_decode(part: &str) -> Result<String, std::string::FromUtf8Error> {
    let bytes = part.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied(),
            bytes.get(i + 2).copied(),
        ) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out)
}

/// `text` with the secrets of `url` (the whole URL, its credentials, query and fragment, each
/// part alone) replaced; a text that ends in the beginning of one (cut there) loses it.
pub fn redact(text: &str, url: &str) -> String {
    let (shown, secrets) = secrets_of(url);
    let mut text = text.replace(url, &shown);
    for secret in &secrets {
        text = text.replace(secret.as_str(), "[credentials]");
    }
    for secret in &secrets {
        let cut = secret
            .char_indices()
            .map(|(i, _)| i)
            .skip(MIN_PART)
            .filter(|&i| text.ends_with(&secret[..i]))
            .max();
        if let Some(cut) = cut {
            text.truncate(text.len() - cut);
            text.push_str("[credentials]");
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_basic_credential_of_a_urls_user_information_is_a_secret_too() {
        assert_eq!(base64(b"svc:S3cretPassw0rd"), "c3ZjOlMzY3JldFBhc3N3MHJk");
        assert_eq!(base64(b"a"), "YQ==");
        assert_eq!(base64(b"ab"), "YWI=");
        let url = "https://svc:S3cretPassw0rd@llm.internal/v1";
        let text = redact(
            "HTTP 502: {\"authorization\": \"c3ZjOlMzY3JldFBhc3N3MHJk\"}",
            url,
        );
        assert!(!text.contains("c3ZjOlMzY3JldFBhc3N3MHJk"), "{text}");
        // Percent-encoded, its padding written `%3D`.
        let url = "https://a:b@llm.internal/v1";
        let text = redact(&format!("authorization=Basic%20{}", "YTpi"), url);
        assert!(!text.contains("YTpi"), "{text}");
        let url = "https://svc:S3cret@llm.internal/v1";
        let echoed = format!("{}%3D%3D", base64(b"svc:S3cret").trim_end_matches('='));
        assert!(!redact(&echoed, url).contains("c3ZjOlMzY3JldA"));
        // Decoded: `p%40ss` is sent as `p@ss`.
        let url = "https://svc:p%40ssword@llm.internal/v1";
        let echoed = base64(b"svc:p@ssword");
        assert!(!redact(&echoed, url).contains(&echoed));
    }

    #[test]
    fn shown_urls_keep_no_credentials_query_or_fragment() {
        let cases = [
            (
                "https://user:pw@api.example.com/v1",
                "https://api.example.com/v1",
            ),
            (
                "http://127.0.0.1:8080/v1?api-key=SECRET",
                "http://127.0.0.1:8080/v1",
            ),
            ("http://u:p@h/v1?key=SECRET#frag", "http://h/v1"),
            ("http://h/v1/@not-userinfo", "http://…"),
            ("redis://default:2024/pw@h:6379/0", "redis://…"),
            ("redis://u:1234#ab@h", "redis://…"),
            ("redis://me@corp.com:2024/pw@h:6379/0", "redis://…"),
            ("redis://:pa#ss@h:6379/0", "redis://…"),
            ("redis://u:p?w@h", "redis://…"),
            ("redis://:ab/cd@h:6379/0", "redis://…"),
            ("http://h?key=SE@CRET", "http://…"),
            ("redis+unix:///run/redis.sock", "redis+unix:///…"),
            ("http://h/v1", "http://h/v1"),
            ("redis://h:6379/0", "redis://h:6379/0"),
            // A proxy's token in the path.
            ("https://gw.internal/t/9f3c0d1e/v1", "https://gw.internal/…"),
            ("https://gw.internal/openai/v1/", "https://gw.internal/…"),
        ];
        for (url, shown) in cases {
            assert_eq!(redact_url(url), shown, "{url}");
            let text = redact(&format!("error sending request for url ({url})"), url);
            assert_eq!(text, format!("error sending request for url ({shown})"));
        }
        let text = redact("failed: key=SECRET refused", "http://h/v1?key=SECRET");
        assert!(!text.contains("SECRET"), "{text}");
        // The path's token, in the URL an error names or alone.
        let url = "https://gw.internal/t/9f3c0d1e/v1";
        for echoed in [
            "POST https://gw.internal/t/9f3c0d1e/v1/chat/completions: 502",
            "unknown gateway token 9f3c0d1e",
        ] {
            let text = redact(echoed, url);
            assert!(!text.contains("9f3c"), "{text}");
        }
        // Each part alone, as written or decoded, and the beginning of one a cut left.
        let url = "https://bob:pa%24%24word1@h/v1?api-version=2024&api-key=KEY12345";
        for echoed in [
            "the password pa$$word1 is wrong",
            "the password pa%24%24word1 is wrong",
            "unknown key KEY12345 for bob",
            "unknown key KEY1",
        ] {
            let text = redact(echoed, url);
            for secret in ["pa$$word1", "pa%24%24word1", "KEY1"] {
                assert!(!text.contains(secret), "{echoed} -> {text}");
            }
        }
    }
}
