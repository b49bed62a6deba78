//! The schema context: what the model is told about the database.
//!
//! Built by one catalog query and cached per backend, keyed by role, search path and the schema
//! version that the extension's DDL event triggers bump. A relcache invalidation callback marks
//! the cache stale as well: invalidations are delivered when DDL commits (the sequence is bumped
//! before), and they also cover the backend's own DDL inside an open transaction. An unchanged
//! schema costs one tiny query per question and no catalog scan.

mod catalog;
mod render;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};

use pgrx::prelude::*;

use crate::error::{Error, Result};

/// What the model sees of the database.
pub struct SchemaContext {
    pub text: String,
}

#[derive(Clone, PartialEq, Eq)]
struct CacheKey {
    role: pg_sys::Oid,
    search_path: String,
    version: Option<i64>,
}

thread_local! {
    static CACHE: RefCell<Option<(CacheKey, Rc<SchemaContext>)>> = const { RefCell::new(None) };
}

/// Set by any relcache invalidation; cleared when the cache is rebuilt.
static STALE: AtomicBool = AtomicBool::new(true);

#[pg_guard]
unsafe extern "C-unwind" fn on_relcache_invalidation(_arg: pg_sys::Datum, _relid: pg_sys::Oid) {
    STALE.store(true, Ordering::Relaxed);
}

/// Called from `_PG_init`.
pub fn init() {
    unsafe {
        pg_sys::CacheRegisterRelcacheCallback(
            Some(on_relcache_invalidation),
            pg_sys::Datum::from(0usize),
        );
    }
}

/// The schema context for the current role and search path, from the cache when still valid.
pub fn context() -> Result<Rc<SchemaContext>> {
    let key = current_key()?;
    let stale = STALE.swap(false, Ordering::Relaxed);
    if !stale {
        if let Some(hit) = CACHE.with_borrow(|c| {
            c.as_ref()
                .filter(|(k, _)| *k == key)
                .map(|(_, ctx)| Rc::clone(ctx))
        }) {
            return Ok(hit);
        }
    }
    let relations = catalog::load()?;
    let context = Rc::new(SchemaContext {
        text: render::render(&relations),
    });
    CACHE.with_borrow_mut(|c| *c = Some((key, Rc::clone(&context))));
    Ok(context)
}

/// Role, search path and schema version, in one small query.
fn current_key() -> Result<CacheKey> {
    const KEY_SQL: &str = "\
        SELECT current_schemas(false)::text, \
               (SELECT pg_sequence_last_value(format('%I.nl_schema_version', n.nspname)::regclass) \
                FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace \
                WHERE e.extname = 'sql_query_engine')";
    let (search_path, version) = Spi::connect(|client| {
        client
            .select(KEY_SQL, Some(1), &[])?
            .first()
            .get_two::<String, i64>()
    })
    .map_err(|e| Error::internal(format!("reading the schema version failed: {e}")))?;
    Ok(CacheKey {
        role: unsafe { pg_sys::GetUserId() },
        search_path: search_path.unwrap_or_default(),
        version,
    })
}
