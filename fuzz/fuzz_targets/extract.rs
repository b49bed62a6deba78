//! Fuzzing SQL extraction: model output is untrusted text, and extraction must never panic
//! (a panic in a backend is an ERROR at best) whatever it is given.
//! Run: RUSTC_BOOTSTRAP=1 cargo fuzz run extract -- -max_total_time=600
#![no_main]

use libfuzzer_sys::fuzz_target;

// The module is pure Rust (no PostgreSQL symbols), so it is compiled here from its source.
#[allow(dead_code)]
#[path = "../../src/extract.rs"]
mod extract;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(sql) = extract::extract_sql(text) {
        assert!(!sql.is_empty(), "an empty statement was extracted");
        assert_eq!(sql, sql.trim(), "extracted SQL keeps surrounding blank space");
        assert!(!sql.ends_with(';'), "extracted SQL ends with a semicolon");
    }
});
