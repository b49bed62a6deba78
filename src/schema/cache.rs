//! The schema cache: one schema context per backend, keyed by role, the schemas read, the search
//! path, the sample-value setting and the comment count, and dropped only when something it
//! shows may have changed:
//! - a relcache invalidation for a relation it holds (ALTER, DROP, GRANT, and ANALYZE when the
//!   statistics moved), or a reset of the whole relcache;
//! - a relation it does not hold that is now in one of its schemas and readable by the role
//!   (CREATE TABLE, a GRANT): such invalidations are noted and checked at the next question, so
//!   that temporary tables and unrelated relations never cost a rebuild;
//! - a change of the role's attributes (BYPASSRLS, SUPERUSER), schemas or enum labels
//!   (syscache invalidations); a change of memberships, of another role or of the database
//!   (`ALTER ROLE mid NOINHERIT` on PostgreSQL 15, a new database owner) is checked at the next
//!   question, and drops the cache only if the roles whose privileges the role has are no
//!   longer the same (any role may change its own password, and grants in one database must
//!   not cost every backend of the cluster a rebuild);
//! - a COMMENT on a relation or column of a schema it reads, which invalidates nothing itself:
//!   the extension's event trigger invalidates the relation (`nl_relations_commented`).
//!
//! Invalidations arrive when DDL commits, also for the backend's own DDL in an open
//! transaction, and on a hot standby when the commit is replayed. An unchanged schema costs no
//! catalog scan.

use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;

use pgrx::prelude::*;

use crate::error::{Error, Result};
use crate::{names, settings, store, subxact};

use super::catalog;
use super::context::SchemaContext;

/// Unknown relations noted at most (each once: one role's ALTERs of its own table, committed
/// one by one, are one relation) before the cache is simply dropped: as many as another
/// session's temporary tables may take it to make (they are told apart only at the next
/// question, since an invalidation's callback may not read the catalog), about 1 MB at most.
const MAX_PENDING: usize = 100_000;

#[derive(Clone, PartialEq, Eq)]
struct CacheKey {
    role: pg_sys::Oid,
    /// The schemas read, in order (the search path's and the other usable ones, or
    /// `sql_query_engine.schemas`).
    schemas: Vec<String>,
    /// The caller's search path: it decides which names need qualifying.
    search_path: Vec<pg_sys::Oid>,
    sample_values: usize,
}

/// What invalidation callbacks have said since the cache was built.
#[derive(Default)]
struct Invalidations {
    /// Something the cache shows may have changed.
    stale: bool,
    /// Relations the cache does not hold that were invalidated: new, or newly readable?
    unknown: HashSet<pg_sys::Oid>,
}

thread_local! {
    static CACHE: RefCell<Option<(CacheKey, Rc<SchemaContext>)>> = const { RefCell::new(None) };
    /// OIDs of the relations the cache holds, and of those its foreign keys name (whose
    /// privileges decide whether they are shown), for the invalidation callback.
    static CACHED: RefCell<HashSet<pg_sys::Oid>> = RefCell::new(HashSet::new());
    /// Syscache hash values of the schemas the cache reads, and of those its foreign keys name:
    /// only their invalidations matter.
    static SCHEMA_HASHES: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    static INVALIDATED: RefCell<Invalidations> = RefCell::new(Invalidations::default());
    /// Syscache hash value of the cached role (its attributes decide what it may read).
    static ROLE_HASH: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
    /// Another role, or the database, changed since the last question (`privileges_changed`).
    static ROLES_CHANGED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The roles whose privileges the cached role had when the cache was built.
    static PRIVILEGES: RefCell<Vec<i64>> = const { RefCell::new(Vec::new()) };
}

/// Marks the cache stale (from a callback: never panics, never raises).
fn mark_stale() {
    INVALIDATED.with(|i| {
        if let Ok(mut i) = i.try_borrow_mut() {
            i.stale = true;
        }
    });
}

#[pg_guard]
unsafe extern "C-unwind" fn on_relcache_invalidation(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    let cached = CACHED.with(|c| c.try_borrow().map_or(true, |c| c.contains(&relid)));
    if relid == pg_sys::InvalidOid || cached {
        mark_stale();
        return;
    }
    INVALIDATED.with(|i| {
        if let Ok(mut i) = i.try_borrow_mut() {
            if i.unknown.len() < MAX_PENDING || i.unknown.contains(&relid) {
                i.unknown.insert(relid);
            } else {
                i.stale = true;
            }
        }
    });
}

/// Enum labels: any change. Schemas: only those the cache reads (a session's first temporary
/// table creates its temporary schema, which must not count). The cached role's attributes:
/// any change; memberships, other roles and the database: a check at the next question.
#[pg_guard]
unsafe extern "C-unwind" fn on_syscache_invalidation(
    _arg: pg_sys::Datum,
    cache: std::ffi::c_int,
    hash: u32,
) {
    let namespaces = pg_sys::SysCacheIdentifier::NAMESPACEOID as std::ffi::c_int;
    let roles = pg_sys::SysCacheIdentifier::AUTHOID as std::ffi::c_int;
    let databases = pg_sys::SysCacheIdentifier::DATABASEOID as std::ffi::c_int;
    let memberships = pg_sys::SysCacheIdentifier::AUTHMEMROLEMEM as std::ffi::c_int;
    // Roles and memberships are shared by every database: the cached role's own entry
    // matters; a membership, another role, or the database (its owner) may change what the
    // role inherits: checked at the next question (another database's roles and grants must
    // not cost this one's backends a rebuild).
    if cache == databases
        || cache == memberships
        || (cache == roles && hash != 0 && ROLE_HASH.get() != Some(hash))
    {
        ROLES_CHANGED.set(true);
        return;
    }
    let ours = hash == 0
        || if cache == namespaces {
            SCHEMA_HASHES.with(|h| h.try_borrow().map_or(true, |h| h.contains(&hash)))
        } else {
            true
        };
    if ours {
        mark_stale();
    }
}

/// The syscache hash values of `schemas`, as invalidations carry them.
fn schema_hashes(schemas: &[String]) -> Vec<u32> {
    schemas
        .iter()
        .filter_map(|name| std::ffi::CString::new(name.as_str()).ok())
        .map(|name| {
            pgrx::check_for_interrupts!();
            // SAFETY: a catalog look-up of a NUL-terminated name.
            unsafe { pg_sys::get_namespace_oid(name.as_ptr(), true) }
        })
        .filter(|oid| *oid != pg_sys::InvalidOid)
        .map(|oid| syscache_hash(pg_sys::SysCacheIdentifier::NAMESPACEOID, oid))
        .collect()
}

/// The hash value invalidations of `cache` carry for the entry of `oid`.
fn syscache_hash(cache: pg_sys::SysCacheIdentifier::Type, oid: pg_sys::Oid) -> u32 {
    // SAFETY: hashes a one-key syscache key; no catalog access.
    unsafe {
        pg_sys::GetSysCacheHashValue(
            cache as std::ffi::c_int,
            pg_sys::Datum::from(oid),
            pg_sys::Datum::from(0usize),
            pg_sys::Datum::from(0usize),
            pg_sys::Datum::from(0usize),
        )
    }
}

/// Called from `_PG_init`.
pub fn init() {
    // SAFETY: registers callbacks, once per backend, that never raise (they only mark the cache).
    unsafe {
        pg_sys::CacheRegisterRelcacheCallback(
            Some(on_relcache_invalidation),
            pg_sys::Datum::from(0usize),
        );
        for cache in [
            pg_sys::SysCacheIdentifier::AUTHMEMROLEMEM,
            pg_sys::SysCacheIdentifier::AUTHOID,
            pg_sys::SysCacheIdentifier::DATABASEOID,
            pg_sys::SysCacheIdentifier::NAMESPACEOID,
            pg_sys::SysCacheIdentifier::ENUMOID,
        ] {
            pg_sys::CacheRegisterSyscacheCallback(
                cache as i32,
                Some(on_syscache_invalidation),
                pg_sys::Datum::from(0usize),
            );
        }
    }
}

/// The schema context for the current role and settings, from the cache when still valid.
pub fn context() -> Result<Rc<SchemaContext>> {
    load().map(|(context, _)| context)
}

/// `context`, and whether it came from the cache.
pub fn load() -> Result<(Rc<SchemaContext>, bool)> {
    // Everything the cache is judged and built by is read as the catalog is now.
    let _now = LatestSnapshot::push();
    let key = current_key()?;
    // What the invalidations said is taken now: from here on, a failure (a cancel, a timeout,
    // a catalog look-up's error) forgets the cache, so that no later question is served what
    // they said may have changed.
    let forget = ForgetUnlessKept { kept: false };
    let stale = take_invalidations(&key.schemas)
        || privileges_changed()?
        || of_another_snapshot()
        || (key.sample_values > 0 && statistics_expired());
    if !stale {
        if let Some(hit) = CACHE.with_borrow(|c| {
            c.as_ref()
                .filter(|(k, _)| *k == key)
                .map(|(_, ctx)| Rc::clone(ctx))
        }) {
            forget.keep();
            return Ok((hit, true));
        }
    }
    // Forgotten before the rebuild too: a relation noted meanwhile is checked against what the
    // new cache holds (`take_invalidations`).
    CACHE.with_borrow_mut(|c| *c = None);
    CACHED.with_borrow_mut(HashSet::clear);
    ROLES_CHANGED.set(false);
    // What invalidations are judged against is the new cache's from the start: one that
    // arrives while it is built must not be judged against the old one's.
    SCHEMA_HASHES.with_borrow_mut(|h| *h = schema_hashes(&key.schemas));
    ROLE_HASH.set(Some(syscache_hash(
        pg_sys::SysCacheIdentifier::AUTHOID,
        key.role,
    )));
    let privileges = privileges()?;
    let relations = catalog::load(&key.schemas, key.sample_values > 0)?;
    // What the context shows, and the relations its foreign keys name (shown only while the
    // caller may see them: a REVOKE on one, or on its schema, must rebuild it too).
    let mut oids: HashSet<pg_sys::Oid> =
        relations.iter().map(|r| pg_sys::Oid::from(r.oid)).collect();
    let named: Vec<pg_sys::Oid> = relations
        .iter()
        .flat_map(|r| &r.foreign_keys)
        .map(|fk| pg_sys::Oid::from(fk.ref_oid))
        .filter(|oid| !oids.contains(oid))
        .collect();
    SCHEMA_HASHES.with_borrow_mut(|h| {
        for &oid in &named {
            pgrx::check_for_interrupts!();
            // SAFETY: a catalog look-up of a relation's schema (InvalidOid when it is gone).
            let schema = unsafe { pg_sys::get_rel_namespace(oid) };
            let hash = syscache_hash(pg_sys::SysCacheIdentifier::NAMESPACEOID, schema);
            if schema != pg_sys::InvalidOid && !h.contains(&hash) {
                h.push(hash);
            }
        }
    });
    // Their partitions and inheritance children too (not those of the relations their keys
    // name, which are not read): what a read of a cached relation takes (their locks) and its
    // storage's fingerprint change with them (a partition made a partitioned table, an index
    // created). A partition attached or created later changes its parent, which is here.
    let parts = descendants(&oids)?;
    oids.extend(named);
    oids.extend(parts);
    let context = Rc::new(SchemaContext::new(relations, key.sample_values));
    // Read with a REPEATABLE READ or SERIALIZABLE transaction's snapshot, the context may be
    // older than invalidations this backend already took (a policy enabled since): it serves
    // that transaction only.
    // SAFETY: reads the backend's isolation level and transaction start, plain values.
    READ_ONLY_FOR.set(unsafe {
        (pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32)
            .then(|| pg_sys::GetCurrentTransactionStartTimestamp())
    });
    CACHED.with_borrow_mut(|c| *c = oids);
    PRIVILEGES.with_borrow_mut(|p| *p = privileges);
    STATISTICS_UNTIL.set(std::time::Instant::now().checked_add(super::samples::KEPT_FOR));
    CACHE.with_borrow_mut(|c| *c = Some((key, Rc::clone(&context))));
    forget.keep();
    Ok((context, false))
}

thread_local! {
    /// The transaction (by when it started) whose snapshot the cached context was read with,
    /// when it was read with a transaction's snapshot rather than a statement's.
    static READ_ONLY_FOR: std::cell::Cell<Option<pg_sys::TimestampTz>> =
        const { std::cell::Cell::new(None) };
}

thread_local! {
    /// Until when the cached context's values from the planner's statistics may be shown.
    static STATISTICS_UNTIL: std::cell::Cell<Option<std::time::Instant>> =
        const { std::cell::Cell::new(None) };
}

/// Whether the cached context's values from the planner's statistics (most common values,
/// histograms) are older than `samples::KEPT_FOR`, as values read from a table may be at most:
/// a new ANALYZE, or statistics cleared or restored, changes only `pg_statistic`, which sends
/// no invalidation the cache hears, and a value deleted since must not reach the model for as
/// long as a pooled backend lives.
fn statistics_expired() -> bool {
    STATISTICS_UNTIL
        .get()
        .is_none_or(|until| std::time::Instant::now() >= until)
}

/// For the backend tests: makes the cached context's statistics as old as they may be.
#[cfg(any(test, feature = "pg_test"))]
pub fn age_for_tests() {
    STATISTICS_UNTIL.set(Some(std::time::Instant::now()));
}

/// Whether the cached context was read with an earlier transaction's snapshot.
fn of_another_snapshot() -> bool {
    // SAFETY: reads when the current transaction started.
    let started = unsafe { pg_sys::GetCurrentTransactionStartTimestamp() };
    READ_ONLY_FOR.get().is_some_and(|read| read != started)
}

/// The catalog as it is now, the active snapshot until dropped, for the reads that judge the
/// cache and rebuild it (the schemas and their owners, the roles, the relations, the
/// partitions, the comment count): the statement's snapshot (a read-only SPI query's under
/// READ COMMITTED) may be minutes old in a long statement (`SELECT pg_sleep(60),
/// nl_schema()`, a repair loop), while the privilege functions and the invalidation that
/// asked for the rebuild see the catalog as it is now: row security enabled since, say, with the statistics of the rows it hides read
/// as they were, and kept for as long as the cache is. Under REPEATABLE READ or SERIALIZABLE
/// nothing is pushed: the transaction's snapshot is what its reads see (serializable ones are
/// judged by it), and what is read with it serves that transaction only (`READ_ONLY_FOR`).
struct LatestSnapshot {
    pushed: Option<pg_sys::Snapshot>,
}

impl LatestSnapshot {
    fn push() -> LatestSnapshot {
        // Other sessions' invalidations are taken in as any lock acquisition does.
        // SAFETY: reads the isolation level; pushes a copy of the latest snapshot
        // (PushActiveSnapshot copies it), in a transaction.
        unsafe {
            if pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32 {
                return LatestSnapshot { pushed: None };
            }
            pg_sys::AcceptInvalidationMessages();
            pg_sys::PushActiveSnapshot(pg_sys::GetLatestSnapshot());
            LatestSnapshot {
                pushed: Some(pg_sys::GetActiveSnapshot()),
            }
        }
    }
}

impl Drop for LatestSnapshot {
    fn drop(&mut self) {
        // SAFETY: pops the snapshot `push` pushed when it is the active one; after an ERROR
        // (another pushed above it, left there), the transaction's abort pops them all.
        unsafe {
            if self.pushed.is_some_and(|pushed| {
                pg_sys::ActiveSnapshotSet() && pg_sys::GetActiveSnapshot() == pushed
            }) {
                pg_sys::PopActiveSnapshot();
            }
        }
    }
}

/// Forgets the cache when dropped, also when an ERROR unwinds past it, unless kept.
struct ForgetUnlessKept {
    kept: bool,
}

impl ForgetUnlessKept {
    fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for ForgetUnlessKept {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        CACHE.with(|c| {
            if let Ok(mut c) = c.try_borrow_mut() {
                *c = None;
            }
        });
        CACHED.with(|c| {
            if let Ok(mut c) = c.try_borrow_mut() {
                c.clear();
            }
        });
    }
}

/// Whether another role or the database changed since the last question and the role now has
/// the privileges of other roles than when the cache was built.
fn privileges_changed() -> Result<bool> {
    if !ROLES_CHANGED.replace(false) {
        return Ok(false);
    }
    let now = privileges()?;
    Ok(PRIVILEGES.with_borrow(|before| *before != now))
}

/// The roles whose privileges the current role has (itself, the roles it inherits from,
/// `pg_database_owner` for the database's owner), by OID. None for a superuser, which has
/// every role's (and would count every role created anywhere in the cluster as a change).
fn privileges() -> Result<Vec<i64>> {
    // SAFETY: reads the current role's attribute.
    if unsafe { pg_sys::superuser() } {
        return Ok(Vec::new());
    }
    subxact::pinned(|| {
        store::read_one::<Vec<i64>>(
            "SELECT coalesce(pg_catalog.array_agg(r.oid::pg_catalog.int8 ORDER BY r.oid), '{}') \
             FROM pg_catalog.pg_roles r WHERE pg_catalog.pg_has_role(r.oid, 'USAGE')",
            &[],
        )
    })
    .map_err(|e| Error::internal(format!("reading the role's privileges failed: {e}")))
    .map(Option::unwrap_or_default)
}

/// How long the invalidations since the last question are looked at, at most (each costs a few
/// catalog look-ups, and one in a schema the context reads a check of the role's privileges on
/// its columns): past it the cache is rebuilt (which its own bounds limit) rather than each
/// looked at. Another role can send up to `MAX_PENDING` to every backend of the database.
const MAX_INVALIDATION_CHECK: std::time::Duration = std::time::Duration::from_millis(250);

/// Whether the invalidations since the last question make the cache stale; forgets them.
fn take_invalidations(schemas: &[String]) -> bool {
    let Invalidations { stale, unknown } = INVALIDATED.with_borrow_mut(std::mem::take);
    if stale {
        return true;
    }
    let until = std::time::Instant::now().checked_add(MAX_INVALIDATION_CHECK);
    // A relation noted as unknown may be one the cache holds after all: noted while the cache
    // was being built (it holds none meanwhile), and revoked or dropped since.
    unknown.into_iter().any(|relid| {
        pgrx::check_for_interrupts!();
        until.is_none_or(|until| std::time::Instant::now() >= until)
            || (!temporary(relid)
                && (CACHED.with_borrow(|c| c.contains(&relid)) || newly_readable(relid, schemas)))
    })
}

/// Whether `relid` is a temporary relation, any session's: none is in the cache, nor a
/// partition of one it holds (another session's temporary relations send their invalidations
/// to every backend of the database).
fn temporary(relid: pg_sys::Oid) -> bool {
    // SAFETY: catalog look-ups of a relation an invalidation named (InvalidOid when it is gone).
    unsafe {
        let namespace = pg_sys::get_rel_namespace(relid);
        namespace != pg_sys::InvalidOid && pg_sys::isAnyTempNamespace(namespace)
    }
}

/// The partitions and inheritance children of `relations`, at every level, as far as the
/// schema context's own walk goes (`MAX_INHERITANCE_STEPS`; past it a relation with children is
/// neither read on the extension's own nor its statistics read).
fn descendants(relations: &HashSet<pg_sys::Oid>) -> Result<Vec<pg_sys::Oid>> {
    let parents: Vec<i64> = relations.iter().map(|r| i64::from(r.to_u32())).collect();
    let found = subxact::pinned(|| {
        store::read_one::<Vec<i64>>(
            "WITH RECURSIVE tree(relid) AS (
                 SELECT i.inhrelid FROM pg_catalog.pg_inherits i
                 WHERE i.inhparent OPERATOR(pg_catalog.=) ANY ($1::pg_catalog.oid[])
                 UNION ALL
                 SELECT i.inhrelid FROM tree t JOIN pg_catalog.pg_inherits i
                     ON i.inhparent OPERATOR(pg_catalog.=) t.relid)
             SELECT coalesce(pg_catalog.array_agg(relid::pg_catalog.int8), '{}')
             FROM (SELECT relid FROM tree LIMIT $2) s",
            &[parents.into(), super::catalog::MAX_INHERITANCE_STEPS.into()],
        )
    })
    .map_err(|e| Error::internal(format!("reading partitions failed: {e}")))?
    .unwrap_or_default();
    Ok(found
        .into_iter()
        .filter_map(|oid| u32::try_from(oid).ok())
        .map(pg_sys::Oid::from)
        .collect())
}

/// A relation (not a partition, not temporary) in one of `schemas` that the role can read: it
/// was created or granted after the cache was built.
fn newly_readable(relid: pg_sys::Oid, schemas: &[String]) -> bool {
    // SAFETY: catalog look-ups of a relation an invalidation named (each says "no" for one
    // that is gone).
    unsafe {
        let namespace = pg_sys::get_rel_namespace(relid);
        if namespace == pg_sys::InvalidOid || pg_sys::isAnyTempNamespace(namespace) {
            return false;
        }
        let Some(schema) = names::namespace_name(namespace) else {
            return false;
        };
        if !schemas.contains(&schema) || pg_sys::get_rel_relispartition(relid) {
            return false;
        }
        let kind = pg_sys::get_rel_relkind(relid) as u8;
        if !b"rvmfp".contains(&kind) {
            return false;
        }
    }
    // Not `pg_attribute_aclcheck_all`, which looks up every column of a table the role may not
    // read whole in the catalog cache (kept as long as the connection).
    subxact::pinned(|| {
        store::read_one::<bool>(super::catalog::MAY_READ_SOME_COLUMN_SQL, &[relid.into()])
    })
    .ok()
    .flatten()
    .unwrap_or(true)
}

/// Role, schemas, search path and settings.
fn current_key() -> Result<CacheKey> {
    // The extension is installed here, in a schema a superuser owns.
    store::extension_schema()?;
    let search_path = search_path();
    let schemas = match settings::schemas() {
        Some(schemas) => schemas,
        None => usable_schemas(&search_path)?,
    };
    Ok(CacheKey {
        // SAFETY: reads the backend's current role.
        role: unsafe { pg_sys::GetUserId() },
        schemas,
        search_path,
        sample_values: settings::sample_values(),
    })
}

/// Relations commented on (`COMMENT ON TABLE`, `ON COLUMN`, ...) at most per call: one command
/// comments on one object.
const MAX_COMMENTED: usize = 1024;

/// Invalidates the relcache entries of `relations` that still exist, for the COMMENT event
/// trigger (`sql/schema_version.sql`): a COMMENT invalidates nothing itself, and the schema
/// caches, which show comments, learn of changes through invalidations. Sent as the
/// transaction commits, to every backend of the database and, as the commit is replayed, to a
/// hot standby's; nothing is written (a table of counts grew with every comment any role made,
/// and every call read it).
#[pg_extern(volatile, parallel_unsafe, strict)]
fn nl_relations_commented(relations: Vec<pg_sys::Oid>) {
    for relation in relations.into_iter().take(MAX_COMMENTED) {
        pgrx::check_for_interrupts!();
        // SAFETY: a syscache existence check, then the invalidation of a relation that exists
        // (it raises for one that does not).
        unsafe {
            if pg_sys::SearchSysCacheExists(
                pg_sys::SysCacheIdentifier::RELOID as i32,
                pg_sys::Datum::from(relation),
                pg_sys::Datum::from(0),
                pg_sys::Datum::from(0),
                pg_sys::Datum::from(0),
            ) {
                pg_sys::CacheInvalidateRelcacheByRelid(relation);
            }
        }
    }
}

/// The schemas a question reads by default: those of the search path `$1` in its order, then
/// every other one, by name, except system schemas and other extensions' own; of either, only
/// those the role may use and whose owner it trusts already (itself or a role it belongs to,
/// the database's owner, `pg_database_owner` as `public`'s owner, a superuser). A schema some
/// other role made is left out even on the path, where `"$user"` finds a schema named after the caller that
/// anyone with CREATE on the database may make: nobody can put relations in front of the model
/// that the caller never chose to look at (`sql_query_engine.schemas` names such a schema).
const USABLE_SCHEMAS_SQL: &str = "
SELECT coalesce(pg_catalog.array_agg(n.nspname::text ORDER BY p.ord, n.nspname), '{}')
FROM pg_catalog.pg_namespace n
LEFT JOIN pg_catalog.unnest($1::pg_catalog.oid[]) WITH ORDINALITY AS p(oid, ord) ON p.oid = n.oid
WHERE pg_catalog.has_schema_privilege(n.oid, 'USAGE')
  AND (pg_catalog.pg_has_role(n.nspowner, 'USAGE')
       OR n.nspowner = (SELECT d.datdba FROM pg_catalog.pg_database d
                        WHERE d.datname = pg_catalog.current_database())
       OR n.nspowner = 'pg_database_owner'::pg_catalog.regrole
       OR EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.oid = n.nspowner AND r.rolsuper))
  AND (p.ord IS NOT NULL
       OR (n.nspname <> ALL ('{pg_catalog,information_schema}') AND n.nspname !~ '^pg_'
           AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend e
                           WHERE e.classid = 'pg_catalog.pg_namespace'::pg_catalog.regclass
                             AND e.objid = n.oid AND e.deptype = 'e')))";

/// The schemas a question reads by default (`USABLE_SCHEMAS_SQL`), by name.
fn usable_schemas(search_path: &[pg_sys::Oid]) -> Result<Vec<String>> {
    subxact::pinned(|| {
        store::read_one::<Vec<String>>(USABLE_SCHEMAS_SQL, &[search_path.to_vec().into()])
    })
    .map_err(|e| Error::internal(format!("reading the usable schemas failed: {e}")))
    .map(Option::unwrap_or_default)
}

/// The caller's search path, without the implicit schemas (pg_catalog, pg_temp).
fn search_path() -> Vec<pg_sys::Oid> {
    // SAFETY: a copy of the search path, read and freed here.
    unsafe {
        let list = pg_sys::fetch_search_path(false);
        let oids = pgrx::PgList::<std::ffi::c_void>::from_pg(list)
            .iter_oid()
            .collect();
        pg_sys::list_free(list);
        oids
    }
}
