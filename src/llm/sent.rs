//! Where a call's model requests went: the endpoints noted as each request is sent, for the
//! call's audit line.

use std::cell::RefCell;

/// Endpoints noted at most: as many as a server configures, whatever a call asks.
const MAX_SENT_TO: usize = 32;

thread_local! {
    /// The endpoints this backend sent a request to, each once, oldest first, as `endpoint`
    /// shows them, and whether each is a fallback (not `llm_url`): a call's audit line names
    /// those its requests went to, answered or not (`since`).
    static SENT_TO: RefCell<Vec<(String, bool)>> = const { RefCell::new(Vec::new()) };
}

/// Notes that a request goes to `endpoint`, a fallback when `fallback`.
pub(super) fn note(endpoint: &str, fallback: bool) {
    SENT_TO.with_borrow_mut(|sent| {
        // One URL may serve as `llm_url` and as a fallback (another model or key on it): a
        // fallback's request marks the entry so.
        if let Some((_, was)) = sent.iter_mut().find(|(e, _)| e == endpoint) {
            *was |= fallback;
        } else if sent.len() < MAX_SENT_TO {
            sent.push((endpoint.to_string(), fallback));
        }
    });
}

/// Where requests noted from now on begin (`since`, `forget_since`).
pub fn mark() -> usize {
    SENT_TO.with_borrow(Vec::len)
}

/// The endpoints requests went to since `mark`, each with whether it is a fallback.
pub fn since(mark: usize) -> Vec<(String, bool)> {
    SENT_TO.with_borrow(|sent| sent.get(mark..).unwrap_or_default().to_vec())
}

/// Forgets the endpoints noted since `mark` (the call that took it ended).
pub fn forget_since(mark: usize) {
    SENT_TO.with_borrow_mut(|sent| sent.truncate(mark));
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_url_that_served_as_a_fallback_too_is_marked_a_fallback() {
        let mark = super::mark();
        super::note("https://router/v1/chat/completions", false);
        super::note("https://router/v1/chat/completions", true);
        super::note("https://other/v1/chat/completions", false);
        assert_eq!(
            super::since(mark),
            [
                ("https://router/v1/chat/completions".to_string(), true),
                ("https://other/v1/chat/completions".to_string(), false)
            ]
        );
    }
}
