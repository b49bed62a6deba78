//! sql_query_engine: ask PostgreSQL a question in plain language. An LLM writes the SQL,
//! PostgreSQL's own parser guards it, it runs read-only in a subtransaction, and failures or
//! empty results are repaired in a bounded loop.

#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]

mod api;
mod arguments;
mod compat;
mod confidence;
mod error;
mod examples;
mod exec;
mod extract;
mod feedback;
mod guard;
mod heal;
mod hints;
mod history;
mod lexer;
mod literals;
mod llm;
mod names;
mod progress;
mod prompt;
mod redis_client;
mod saved;
mod schema;
mod session;
mod session_locks;
mod settings;
mod store;
mod subxact;
mod templates;
mod text;
mod trace;
mod urls;
mod values;
mod wait;

::pgrx::pg_module_magic!(name, version);

pgrx::extension_sql_file!(
    "../sql/schema_trusted.sql",
    name = "schema_trusted",
    bootstrap
);
pgrx::extension_sql_file!("../sql/schema_version.sql", name = "schema_version");
pgrx::extension_sql_file!("../sql/schema_name.sql", name = "schema_name");
pgrx::extension_sql_file!(
    "../sql/examples.sql",
    name = "examples",
    requires = [examples::nl_example_words]
);
pgrx::extension_sql_file!("../sql/history.sql", name = "history");
// Its trigger is nl_history's (nl_row_role).
pgrx::extension_sql_file!(
    "../sql/sessions.sql",
    name = "sessions",
    requires = ["history"]
);
// Its policy names nl_examples (who may record feedback as promoted) and nl_history (whose
// answers feedback is on).
pgrx::extension_sql_file!(
    "../sql/feedback.sql",
    name = "feedback",
    requires = ["examples", "history"]
);
// Triggers on the tables the three files above make.
pgrx::extension_sql_file!(
    "../sql/ids.sql",
    name = "ids",
    requires = ["examples", "history", "feedback"]
);
// Last: the privileges of every table, sequence and trigger function the files above make.
pgrx::extension_sql_file!("../sql/privileges.sql", name = "privileges", finalize);
pgrx::extension_sql_file!(
    "../sql/query_as.sql",
    name = "query_as",
    requires = [api::nl_query_shaped]
);

#[pgrx::pg_guard]
pub extern "C-unwind" fn _PG_init() {
    settings::init();
    llm::breaker::init();
    guard::gate::init();
    exec::init();
    schema::init();
    session::init();
}

/// Backend tests (`#[pg_test]`) and the harness hooks `cargo pgrx test` needs.
#[cfg(any(test, feature = "pg_test"))]
#[path = "../pg_test/mod.rs"]
pub mod pg_test;
