//! What every request handler shares: the database, the tokens, the limits, and the role the
//! request's token chose.

use std::sync::Arc;
use std::time::Duration;

use crate::db::Db;
pub use crate::tokens::Role;
use crate::tokens::Tokens;

#[derive(Clone)]
pub struct App {
    pub db: Arc<Db>,
    pub tokens: Tokens,
    pub model: String,
    pub timeout: Duration,
    pub max_body: usize,
    pub max_table_rows: usize,
}
