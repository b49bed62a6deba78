//! The schema context: what the model is told about the database.
//!
//! Built by one catalog query and cached per backend, keyed by role, the schemas read and the
//! settings that shape it. The cache is dropped only when something it shows may have changed:
//! - a relcache invalidation for a relation it holds (ALTER, DROP, GRANT, and ANALYZE when the
//!   statistics moved), or a reset of the whole relcache;
//! - a relation it does not hold that is now in one of its schemas and readable by the role
//!   (CREATE TABLE, a GRANT): such invalidations are noted and checked at the next question, so
//!   that temporary tables and unrelated relations never cost a rebuild;
//! - a change of role memberships, schemas or enum labels (syscache invalidations);
//! - a COMMENT, which invalidates nothing: the extension's event trigger counts it in
//!   `nl_schema_changes`, whose sum is part of the key.
//!
//! Invalidations arrive when DDL commits, also for the backend's own DDL in an open
//! transaction, and on a hot standby when the commit is replayed (the comment count too, being a
//! table). An unchanged schema costs one small query per question and no catalog scan. Sample
//! values and renderings are computed lazily per relation and kept with the cache.

mod catalog;
mod render;
mod retrieve;
mod samples;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use pgrx::prelude::*;

use crate::error::{Error, Result};
use crate::{settings, subxact};

use catalog::Relation;
use retrieve::{Candidate, NameIndex, Terms};
use samples::Samples;

pub use retrieve::words;
pub use samples::quote as quote_literal;

/// One text column, as the value index reads it.
pub struct TextColumn {
    /// Index of its relation in the schema context.
    pub relation: usize,
    /// The column's name, quoted.
    pub column_sql: String,
    /// Where the extension may read its relation on its own (`Relation::own_read_from`).
    pub read_from: Option<String>,
    /// `relation.column` as the prompt writes it.
    pub display: String,
    /// Values known from the planner's statistics (most common values, histogram bounds).
    pub statistics: Vec<String>,
}

/// The text columns of a schema context, grouped by relation.
pub struct TextColumns(Vec<TextColumn>);

impl TextColumns {
    pub fn get(&self, id: usize) -> &TextColumn {
        &self.0[id]
    }

    /// The relations that have text columns, in schema order.
    pub fn relations(&self) -> Vec<usize> {
        let mut relations: Vec<usize> = self.0.iter().map(|c| c.relation).collect();
        relations.dedup();
        relations
    }

    /// The ids of `relation`'s text columns.
    pub fn of_relation(&self, relation: usize) -> Vec<usize> {
        (0..self.0.len())
            .filter(|&i| self.0[i].relation == relation)
            .collect()
    }
}

/// Foreign-key steps a repair hint follows to say how to reach a column's table.
const JOIN_HOPS: usize = 3;

/// Invalidations of unknown relations noted at most before the cache is simply dropped.
const MAX_PENDING: usize = 1000;

/// The schema as loaded for one role and set of schemas, with what retrieval needs.
pub struct SchemaContext {
    relations: Vec<Relation>,
    terms: Vec<Terms>,
    /// Each relation's name, and its multi-word column names.
    names: NameIndex,
    neighbours: Vec<Vec<usize>>,
    /// Estimated tokens of each relation's rendering (sample values included).
    tokens: Vec<usize>,
    /// Samples of each relation's columns, once read.
    samples: RefCell<HashMap<usize, Rc<Vec<Option<Samples>>>>>,
    sample_values: usize,
}

/// What goes into the prompt about the database for one question.
pub struct PromptSchema {
    pub text: String,
    /// The relations shown, as written in SQL.
    pub relations: Vec<String>,
    /// Whether retrieval left relations out.
    pub pruned: bool,
    /// Whether the schema came from this backend's cache (no catalog read).
    pub cached: bool,
}

#[derive(Clone, PartialEq, Eq)]
struct CacheKey {
    role: pg_sys::Oid,
    /// The schemas read, in order (the search path's, or `sql_query_engine.schemas`).
    schemas: Vec<String>,
    /// The caller's search path: it decides which names need qualifying.
    search_path: Vec<pg_sys::Oid>,
    sample_values: usize,
    /// COMMENTs committed so far (`nl_schema_changes`).
    comments: i64,
}

/// What invalidation callbacks have said since the cache was built.
#[derive(Default)]
struct Invalidations {
    /// Something the cache shows may have changed.
    stale: bool,
    /// Relations the cache does not hold that were invalidated: new, or newly readable?
    unknown: Vec<pg_sys::Oid>,
}

thread_local! {
    static CACHE: RefCell<Option<(CacheKey, Rc<SchemaContext>)>> = const { RefCell::new(None) };
    /// OIDs of the relations the cache holds, for the invalidation callback.
    static CACHED: RefCell<HashSet<pg_sys::Oid>> = RefCell::new(HashSet::new());
    /// Syscache hash values of the schemas the cache reads: only their invalidations matter.
    static SCHEMA_HASHES: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    static INVALIDATED: RefCell<Invalidations> = RefCell::new(Invalidations::default());
    /// The extension's OID and its schema, quoted.
    static EXTENSION: RefCell<Option<(pg_sys::Oid, String)>> = const { RefCell::new(None) };
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
            if i.unknown.len() < MAX_PENDING {
                i.unknown.push(relid);
            } else {
                i.stale = true;
            }
        }
    });
}

/// Role memberships and enum labels: any change. Schemas: only those the cache reads (a
/// session's first temporary table creates its temporary schema, which must not count).
#[pg_guard]
unsafe extern "C-unwind" fn on_syscache_invalidation(
    _arg: pg_sys::Datum,
    cache: std::ffi::c_int,
    hash: u32,
) {
    let namespaces = pg_sys::SysCacheIdentifier::NAMESPACEOID as std::ffi::c_int;
    let ours = cache != namespaces
        || hash == 0
        || SCHEMA_HASHES.with(|h| h.try_borrow().map_or(true, |h| h.contains(&hash)));
    if ours {
        mark_stale();
    }
}

/// The syscache hash values of `schemas`, as invalidations carry them.
fn schema_hashes(schemas: &[String]) -> Vec<u32> {
    schemas
        .iter()
        .filter_map(|name| std::ffi::CString::new(name.as_str()).ok())
        .map(|name| unsafe { pg_sys::get_namespace_oid(name.as_ptr(), true) })
        .filter(|oid| *oid != pg_sys::InvalidOid)
        .map(|oid| unsafe {
            pg_sys::GetSysCacheHashValue(
                pg_sys::SysCacheIdentifier::NAMESPACEOID as std::ffi::c_int,
                pg_sys::Datum::from(oid),
                pg_sys::Datum::from(0usize),
                pg_sys::Datum::from(0usize),
                pg_sys::Datum::from(0usize),
            )
        })
        .collect()
}

/// Called from `_PG_init`.
pub fn init() {
    unsafe {
        pg_sys::CacheRegisterRelcacheCallback(
            Some(on_relcache_invalidation),
            pg_sys::Datum::from(0usize),
        );
        for cache in [
            pg_sys::SysCacheIdentifier::AUTHMEMROLEMEM,
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

/// The schema the extension lives in, quoted (for its own tables).
pub fn extension_schema() -> Result<String> {
    let extension = unsafe { pg_sys::get_extension_oid(c"sql_query_engine".as_ptr(), true) };
    if extension == pg_sys::InvalidOid {
        return Err(Error::Setting {
            message: "the extension sql_query_engine is not installed in this database".into(),
            hint: "CREATE EXTENSION sql_query_engine;".into(),
        });
    }
    if let Some(schema) = EXTENSION.with_borrow(|e| {
        e.as_ref()
            .filter(|(oid, _)| *oid == extension)
            .map(|(_, schema)| schema.clone())
    }) {
        return Ok(schema);
    }
    let schema = subxact::pinned(|| {
        read_one::<String>(
            "SELECT quote_ident(n.nspname) FROM pg_extension e \
             JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.oid = $1",
            &[extension.into()],
        )
    })
    .map_err(|e| Error::internal(format!("reading the extension's schema failed: {e}")))?
    .ok_or_else(|| Error::internal("the extension has no schema"))?;
    EXTENSION.with_borrow_mut(|e| *e = Some((extension, schema.clone())));
    Ok(schema)
}

/// The schema context for the current role and settings, from the cache when still valid.
pub fn context() -> Result<Rc<SchemaContext>> {
    load().map(|(context, _)| context)
}

/// `context`, and whether it came from the cache.
pub fn load() -> Result<(Rc<SchemaContext>, bool)> {
    let key = current_key()?;
    let stale = take_invalidations(&key.schemas);
    if !stale {
        if let Some(hit) = CACHE.with_borrow(|c| {
            c.as_ref()
                .filter(|(k, _)| *k == key)
                .map(|(_, ctx)| Rc::clone(ctx))
        }) {
            return Ok((hit, true));
        }
    }
    let relations = catalog::load(&key.schemas, key.sample_values > 0)?;
    let oids: HashSet<pg_sys::Oid> = relations.iter().map(|r| pg_sys::Oid::from(r.oid)).collect();
    let context = Rc::new(SchemaContext::new(relations, key.sample_values));
    CACHED.with_borrow_mut(|c| *c = oids);
    SCHEMA_HASHES.with_borrow_mut(|h| *h = schema_hashes(&key.schemas));
    CACHE.with_borrow_mut(|c| *c = Some((key, Rc::clone(&context))));
    Ok((context, false))
}

/// Whether the invalidations since the last question make the cache stale; forgets them.
fn take_invalidations(schemas: &[String]) -> bool {
    let Invalidations { stale, unknown } = INVALIDATED.with_borrow_mut(std::mem::take);
    stale
        || unknown
            .into_iter()
            .any(|relid| newly_readable(relid, schemas))
}

/// A relation (not a partition, not temporary) in one of `schemas` that the role can read: it
/// was created or granted after the cache was built.
fn newly_readable(relid: pg_sys::Oid, schemas: &[String]) -> bool {
    unsafe {
        let namespace = pg_sys::get_rel_namespace(relid);
        if namespace == pg_sys::InvalidOid || pg_sys::isAnyTempNamespace(namespace) {
            return false;
        }
        let name = pg_sys::get_namespace_name(namespace);
        if name.is_null() {
            return false;
        }
        let schema = std::ffi::CStr::from_ptr(name).to_string_lossy();
        if !schemas.iter().any(|s| *s == schema) || pg_sys::get_rel_relispartition(relid) {
            return false;
        }
        let kind = pg_sys::get_rel_relkind(relid) as u8;
        if !b"rvmfp".contains(&kind) {
            return false;
        }
        let role = pg_sys::GetUserId();
        pg_sys::pg_class_aclcheck(relid, role, pg_sys::ACL_SELECT as pg_sys::AclMode)
            == pg_sys::AclResult::ACLCHECK_OK
            || pg_sys::pg_attribute_aclcheck_all(
                relid,
                role,
                pg_sys::ACL_SELECT as pg_sys::AclMode,
                pg_sys::AclMaskHow::ACLMASK_ANY,
            ) == pg_sys::AclResult::ACLCHECK_OK
    }
}

/// The first column of the first row of a read. Read-only SPI: it assigns no transaction id
/// (pgrx's `Spi::get_one` does, which fails on a hot standby and costs an XID per question).
fn read_one<T: pgrx::FromDatum + pgrx::IntoDatum>(
    sql: &str,
    args: &[pgrx::datum::DatumWithOid],
) -> std::result::Result<Option<T>, pgrx::spi::Error> {
    Spi::connect(|client| client.select(sql, Some(1), args)?.first().get_one::<T>())
}

/// Role, schemas, search path, settings and the comment count.
fn current_key() -> Result<CacheKey> {
    let schema = extension_schema()?;
    let comments = subxact::pinned(|| {
        read_one::<i64>(
            &format!("SELECT coalesce(sum(changes), 0)::int8 FROM {schema}.nl_schema_changes"),
            &[],
        )
    })
    .map_err(|e| Error::internal(format!("reading the schema version failed: {e}")))?
    .unwrap_or(0);
    let search_path = search_path();
    let schemas = settings::schemas().unwrap_or_else(|| {
        search_path
            .iter()
            .filter_map(|&oid| namespace_name(oid))
            .collect()
    });
    Ok(CacheKey {
        role: unsafe { pg_sys::GetUserId() },
        schemas,
        search_path,
        sample_values: settings::sample_values(),
        comments,
    })
}

/// The caller's search path, without the implicit schemas (pg_catalog, pg_temp).
fn search_path() -> Vec<pg_sys::Oid> {
    unsafe {
        let list = pg_sys::fetch_search_path(false);
        let oids = pgrx::PgList::<std::ffi::c_void>::from_pg(list)
            .iter_oid()
            .collect();
        pg_sys::list_free(list);
        oids
    }
}

fn namespace_name(oid: pg_sys::Oid) -> Option<String> {
    unsafe {
        let name = pg_sys::get_namespace_name(oid);
        (!name.is_null()).then(|| {
            std::ffi::CStr::from_ptr(name)
                .to_string_lossy()
                .into_owned()
        })
    }
}

impl SchemaContext {
    fn new(relations: Vec<Relation>, sample_values: usize) -> Self {
        let index: HashMap<u32, usize> = relations
            .iter()
            .enumerate()
            .map(|(i, r)| (r.oid, i))
            .collect();
        let mut neighbours = vec![Vec::new(); relations.len()];
        for (i, r) in relations.iter().enumerate() {
            for fk in &r.foreign_keys {
                if let Some(&j) = index.get(&fk.ref_oid) {
                    if i != j {
                        neighbours[i].push(j);
                        neighbours[j].push(i);
                    }
                }
            }
        }
        let terms = relations
            .iter()
            .map(|r| relation_terms(r, sample_values))
            .collect();
        let unquote = |s: &str| s.trim_matches('"').to_string();
        let mut names = NameIndex::default();
        for (i, r) in relations.iter().enumerate() {
            names.add(retrieve::name_tokens(&unquote(&r.name)), i);
            for column in &r.columns {
                let tokens = retrieve::name_tokens(&unquote(&column.name));
                if tokens.len() > 1 {
                    names.add(tokens, i);
                }
            }
        }
        let tokens = relations
            .iter()
            .map(|r| {
                let known = statistics_samples(r, sample_values);
                let unknown_text_columns = r
                    .columns
                    .iter()
                    .filter(|c| c.textual && c.common_values.is_empty())
                    .count();
                // A read sample adds about eight tokens to a text column.
                retrieve::estimate_tokens(&render::render_relation(r, &known))
                    + if sample_values > 0 {
                        8 * unknown_text_columns
                    } else {
                        0
                    }
            })
            .collect();
        SchemaContext {
            relations,
            terms,
            names,
            neighbours,
            tokens,
            samples: RefCell::new(HashMap::new()),
            sample_values,
        }
    }

    /// The text columns, for the value index.
    pub fn text_columns(&self) -> TextColumns {
        let mut columns = Vec::new();
        for (i, relation) in self.relations.iter().enumerate() {
            let read_from = relation.own_read_from();
            for column in relation.columns.iter().filter(|c| c.textual) {
                columns.push(TextColumn {
                    relation: i,
                    column_sql: column.name.clone(),
                    read_from: read_from.clone(),
                    display: format!("{}.{}", relation.sql_name(), column.name),
                    statistics: column
                        .common_values
                        .iter()
                        .chain(&column.histogram)
                        .cloned()
                        .collect(),
                });
            }
        }
        TextColumns(columns)
    }

    /// The schema text for `question` (every relation when no question is given or all fit the
    /// prompt budget). The relations in `evidence` (where the question's values are stored)
    /// are always shown.
    pub fn for_question(&self, question: Option<&str>, evidence: &[usize]) -> PromptSchema {
        let budget = settings::prompt_budget();
        let chosen: Vec<usize> = match question {
            Some(q) => {
                let candidates: Vec<Candidate> = (0..self.relations.len())
                    .map(|i| Candidate {
                        terms: &self.terms[i],
                        tokens: self.tokens[i],
                        neighbours: &self.neighbours[i],
                    })
                    .collect();
                let mut must = self.names.named_in(q);
                must.extend(
                    evidence
                        .iter()
                        .filter(|i| !must.contains(i))
                        .collect::<Vec<_>>(),
                );
                retrieve::select(&candidates, q, budget, &must)
            }
            None => (0..self.relations.len()).collect(),
        };
        let mut text = String::new();
        let mschema = settings::schema_format() == settings::SchemaFormat::MSchema;
        for &i in &chosen {
            let samples = self.samples_of(i);
            text.push_str(&if mschema {
                render::render_mschema(&self.relations[i], &samples)
            } else {
                render::render_relation(&self.relations[i], &samples)
            });
        }
        if mschema {
            let shown: Vec<&Relation> = chosen.iter().map(|&i| &self.relations[i]).collect();
            text.push_str(&render::mschema_keys(&shown));
        }
        if text.is_empty() {
            text.push_str(render::NOTHING_VISIBLE);
        }
        PromptSchema {
            cached: false,
            pruned: chosen.len() < self.relations.len(),
            relations: chosen
                .iter()
                .map(|&i| self.relations[i].sql_name())
                .collect(),
            text,
        }
    }

    /// What a repair needs to know about the relations a failed query named: their columns;
    /// for a column that does not exist there, the relations that have it and how they join
    /// to the named ones (directly, or through up to `JOIN_HOPS` foreign keys); and, when
    /// `list_all` (a table did not exist) or none of the names is known, which tables there are.
    pub fn describe(
        &self,
        names: &[String],
        missing_column: Option<&str>,
        list_all: bool,
    ) -> Option<String> {
        let unquote = |s: &str| s.trim_matches('"').to_string();
        let named: Vec<usize> = (0..self.relations.len())
            .filter(|&i| names.contains(&unquote(&self.relations[i].name)))
            .collect();
        let mut lines: Vec<String> = named
            .iter()
            .map(|&i| {
                let r = &self.relations[i];
                let columns: Vec<&str> = r.columns.iter().map(|c| c.name.as_str()).collect();
                format!(
                    "The columns of {} are: {}.",
                    r.sql_name(),
                    columns.join(", ")
                )
            })
            .collect();
        if let Some(column) = missing_column {
            let owners = (0..self.relations.len()).filter(|&i| {
                self.relations[i]
                    .columns
                    .iter()
                    .any(|c| unquote(&c.name) == column)
            });
            for owner in owners {
                let direct: Vec<String> = named
                    .iter()
                    .filter(|&&n| n != owner)
                    .flat_map(|&n| self.join(n, owner))
                    .collect();
                let via = if !direct.is_empty() {
                    format!(", joined by {}", direct.join(" or "))
                } else if named.contains(&owner) {
                    String::new()
                } else {
                    let chain = self.join_chain(&named, owner);
                    if chain.is_empty() {
                        String::new()
                    } else {
                        format!(", joined by {}", chain.join(", then "))
                    }
                };
                lines.push(format!(
                    "{column} is a column of {}{via}.",
                    self.relations[owner].sql_name()
                ));
            }
        }
        if list_all || lines.is_empty() {
            let all: Vec<String> = self
                .relations
                .iter()
                .take(60)
                .map(|r| r.sql_name())
                .collect();
            if !all.is_empty() {
                lines.push(format!("The tables and views are: {}.", all.join(", ")));
            }
        }
        (!lines.is_empty()).then(|| lines.join("\n"))
    }

    /// The join conditions between relations `a` and `b` through their foreign keys (either
    /// way), as SQL.
    fn join(&self, a: usize, b: usize) -> Vec<String> {
        let (a, b) = (&self.relations[a], &self.relations[b]);
        join_conditions(a, b)
            .into_iter()
            .chain(join_conditions(b, a))
            .collect()
    }

    /// The shortest chain of foreign-key joins from any of `from` to `to`, at most `JOIN_HOPS`
    /// long: one join condition per step, in order. Empty when there is none.
    fn join_chain(&self, from: &[usize], to: usize) -> Vec<String> {
        // For each relation reached: the one it was reached from.
        let mut came_from: HashMap<usize, usize> = HashMap::new();
        let mut frontier: Vec<usize> = from.to_vec();
        for _ in 0..JOIN_HOPS {
            let mut next = Vec::new();
            for &i in &frontier {
                for &j in &self.neighbours[i] {
                    if from.contains(&j) || came_from.contains_key(&j) {
                        continue;
                    }
                    came_from.insert(j, i);
                    next.push(j);
                }
            }
            if came_from.contains_key(&to) {
                let mut chain = Vec::new();
                let mut at = to;
                while let Some(&previous) = came_from.get(&at) {
                    chain.extend(self.join(previous, at).into_iter().next());
                    at = previous;
                }
                chain.reverse();
                return chain;
            }
            frontier = next;
        }
        Vec::new()
    }

    fn samples_of(&self, i: usize) -> Rc<Vec<Option<Samples>>> {
        if self.sample_values == 0 {
            return Rc::new(Vec::new());
        }
        if let Some(s) = self.samples.borrow().get(&i) {
            return Rc::clone(s);
        }
        let s = Rc::new(samples::for_relation(
            &self.relations[i],
            self.sample_values,
        ));
        self.samples.borrow_mut().insert(i, Rc::clone(&s));
        s
    }
}

/// The join conditions of `from`'s foreign keys to `to`, as SQL.
fn join_conditions(from: &Relation, to: &Relation) -> Vec<String> {
    from.foreign_keys
        .iter()
        .filter(|fk| fk.ref_oid == to.oid)
        .map(|fk| {
            let pairs: Vec<String> = fk
                .columns
                .iter()
                .zip(&fk.ref_columns)
                .map(|(c, r)| format!("{}.{c} = {}.{r}", from.sql_name(), to.sql_name()))
                .collect();
            pairs.join(" AND ")
        })
        .collect()
}

/// Samples known from the planner's statistics alone (no read of the relation).
fn statistics_samples(relation: &Relation, per_column: usize) -> Vec<Option<Samples>> {
    if per_column == 0 {
        return Vec::new();
    }
    relation
        .columns
        .iter()
        .map(|c| samples::from_statistics(c, per_column))
        .collect()
}

fn relation_terms(relation: &Relation, sample_values: usize) -> Terms {
    let unquote = |s: &str| s.trim_matches('"').to_string();
    let mut terms = Terms::default();
    terms.name.extend(words(&unquote(&relation.name)));
    for column in &relation.columns {
        terms.columns.extend(words(&unquote(&column.name)));
        if let Some(comment) = &column.comment {
            terms.comments.extend(words(comment));
        }
        terms
            .values
            .extend(column.labels.iter().flat_map(|l| words(l)));
        if sample_values > 0 {
            terms
                .values
                .extend(column.common_values.iter().flat_map(|v| words(v)));
        }
    }
    if let Some(comment) = &relation.comment {
        terms.comments.extend(words(comment));
    }
    terms
}
