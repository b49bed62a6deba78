//! What every request handler shares: the database, the tokens, the limits, and the role the
//! request's token chose.

use std::sync::Arc;
use std::time::Duration;

use crate::db::Db;
use crate::tokens::Tokens;

/// The role a request runs as (set by `authenticate`).
#[derive(Clone, Debug)]
pub struct Role(pub String);

#[derive(Clone)]
pub struct App {
    pub db: Arc<Db>,
    pub tokens: Tokens,
    pub model: String,
    pub timeout: Duration,
    pub max_body: usize,
    pub max_table_rows: usize,
}
