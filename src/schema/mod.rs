//! The schema context: what the model is told about the database. `catalog` reads it (a few
//! catalog queries, pg_catalog-qualified), `cache` keeps it per backend until something it shows
//! changes, `context` chooses and renders what a question needs (`retrieve`, `render`, sample
//! values from `samples`).

mod cache;
mod catalog;
mod context;
mod render;
mod retrieve;
mod samples;

#[cfg(any(test, feature = "pg_test"))]
pub use cache::age_for_tests;
pub use cache::{context, init, load};
pub use catalog::own_read;
#[cfg(test)]
pub use context::TextColumn;
pub use context::{Hop, Keys, PromptSchema, SchemaContext, TextColumns};
pub use samples::quote as quote_literal;
pub use samples::KEPT_FOR as VALUES_KEPT_FOR;
