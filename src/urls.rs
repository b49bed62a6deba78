//! What of a URL may be shown: an endpoint's (the model's, Redis's) URL goes into messages and
//! traces without the credentials it may carry.

/// A URL as it may be shown: without the credentials it may carry.
pub fn redact_url(url: &str) -> String {
    let (shown, _) = secrets_of(url);
    shown
}

/// A URL's parts that may be shown (scheme, host, port, path) and those that may not (the
/// user information before the host, the query and fragment: a key may ride in either). The
/// user information ends at the last `@` before the first `/`, so that a password with an
/// unescaped `?` or `#` in it is hidden whole.
fn secrets_of(url: &str) -> (String, Vec<&str>) {
    let mut secrets = Vec::new();
    let (prefix, rest) = match url.find("://").map(|at| at + 3) {
        Some(scheme_end) => {
            let authority_end = url[scheme_end..]
                .find('/')
                .map_or(url.len(), |at| scheme_end + at);
            match url[scheme_end..authority_end].rfind('@') {
                Some(at) => {
                    if at > 0 {
                        secrets.push(&url[scheme_end..scheme_end + at]);
                    }
                    (&url[..scheme_end], &url[scheme_end + at + 1..])
                }
                None => (&url[..scheme_end], &url[scheme_end..]),
            }
        }
        None => ("", url),
    };
    let (before_query, query) = match rest.find(['?', '#']) {
        Some(at) => (&rest[..at], Some(&rest[at + 1..])),
        None => (rest, None),
    };
    secrets.extend(query.filter(|q| !q.is_empty()));
    (format!("{prefix}{before_query}"), secrets)
}

/// `text` with the secrets of `url` (the whole URL, its credentials, query and fragment)
/// replaced.
pub fn redact(text: &str, url: &str) -> String {
    let (shown, secrets) = secrets_of(url);
    let mut text = text.replace(url, &shown);
    for secret in secrets {
        text = text.replace(secret, "[credentials]");
    }
    text
}

/// Whether `url` carries credentials (user information, a query or a fragment).
pub fn has_credentials(url: &str) -> bool {
    !secrets_of(url).1.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

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
            ("http://h/v1/@not-userinfo", "http://h/v1/@not-userinfo"),
            ("redis://:pa#ss@h:6379/0", "redis://h:6379/0"),
            ("redis://u:p?w@h", "redis://h"),
            ("http://h/v1", "http://h/v1"),
        ];
        for (url, shown) in cases {
            assert_eq!(redact_url(url), shown, "{url}");
            let text = redact(&format!("error sending request for url ({url})"), url);
            assert_eq!(text, format!("error sending request for url ({shown})"));
        }
        let text = redact("failed: key=SECRET refused", "http://h/v1?key=SECRET");
        assert!(!text.contains("SECRET"), "{text}");
    }

    #[test]
    fn credentials_are_told_apart() {
        assert!(has_credentials("redis://:pw@h/0"));
        assert!(has_credentials("http://h/v1?key=k"));
        assert!(!has_credentials("http://127.0.0.1:8080/v1"));
        assert!(!has_credentials("redis+unix:///run/redis.sock"));
    }
}
