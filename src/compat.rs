//! What differs between the PostgreSQL versions the extension supports, in one place.

use pgrx::pg_sys;

/// Expression node kinds of an analyzed SELECT that only some versions have.
pub fn expression_kind(_tag: pg_sys::NodeTag) -> bool {
    false
}

/// Structural node kinds of an analyzed SELECT that only some versions have.
pub fn structural_kind(_tag: pg_sys::NodeTag) -> bool {
    false
}

/// Numbers read from the server's headers at build time (build.rs): enum positions and catalog
/// attribute numbers that pgrx does not bind.
pub mod numbers {
    include!(concat!(env!("OUT_DIR"), "/server_numbers.rs"));
}

/// utils/timeout.h, which pgrx does not bind.
#[allow(non_snake_case)]
pub mod timeout {
    use pgrx::pg_sys::TimestampTz;

    /// The statement timer, as `enum TimeoutId` numbers it in the server built for (a backend
    /// test checks that it is the timer `statement_timeout` arms).
    pub use crate::compat::numbers::STATEMENT_TIMEOUT;

    unsafe extern "C-unwind" {
        pub fn enable_timeout_after(id: u32, delay_ms: std::ffi::c_int);
        pub fn enable_timeout_at(id: u32, fin_time: TimestampTz);
        pub fn disable_timeout(id: u32, keep_indicator: bool);
        pub fn get_timeout_active(id: u32) -> bool;
        pub fn get_timeout_finish_time(id: u32) -> TimestampTz;
    }
}
