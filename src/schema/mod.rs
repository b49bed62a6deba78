//! The schema context: what the model is told about the database.
//!
//! Built by one catalog query and cached per backend, keyed by role, the schemas read, and the
//! schema version that the extension's DDL event triggers bump. A relcache invalidation callback
//! marks the cache stale as well: invalidations arrive when DDL commits (the sequence is bumped
//! before), and they cover the backend's own DDL inside an open transaction. An unchanged schema
//! costs one small query per question and no catalog scan. Sample values and renderings are
//! computed lazily per relation and kept with the cache.

mod catalog;
mod render;
mod retrieve;
mod samples;

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};

use pgrx::prelude::*;

use crate::error::{Error, Result};
use crate::{redis_client, settings};

use catalog::Relation;
use retrieve::{Candidate, Terms};
use samples::Samples;

pub use retrieve::words;

/// Foreign-key steps a repair hint follows to say how to reach a column's table.
const JOIN_HOPS: usize = 3;

/// The schema as loaded for one role and set of schemas, with what retrieval needs.
pub struct SchemaContext {
    relations: Vec<Relation>,
    terms: Vec<Terms>,
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
}

#[derive(Clone, PartialEq, Eq)]
struct CacheKey {
    role: pg_sys::Oid,
    search_path: String,
    schemas: Option<Vec<String>>,
    sample_values: usize,
    version: Option<i64>,
}

thread_local! {
    static CACHE: RefCell<Option<(CacheKey, Rc<SchemaContext>)>> = const { RefCell::new(None) };
    static EXTENSION_SCHEMA: RefCell<Option<String>> = const { RefCell::new(None) };
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

/// The schema the extension lives in, quoted (for its own tables).
pub fn extension_schema() -> Result<String> {
    if let Some(schema) = EXTENSION_SCHEMA.with_borrow(|s| s.clone()) {
        return Ok(schema);
    }
    current_key().map(|(_, schema)| schema)
}

/// The schema context for the current role and settings, from the cache when still valid.
pub fn context() -> Result<Rc<SchemaContext>> {
    let (key, _) = current_key()?;
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
    let relations = match shared_get(&key) {
        Some(relations) => relations,
        None => {
            let relations = catalog::load(key.schemas.clone(), key.sample_values > 0)?;
            shared_put(&key, &relations);
            relations
        }
    };
    let context = Rc::new(SchemaContext::new(relations, key.sample_values));
    CACHE.with_borrow_mut(|c| *c = Some((key, Rc::clone(&context))));
    Ok(context)
}

/// How long a schema stays in Redis. Keys carry the schema version, so DDL makes new ones; the
/// expiry only bounds what an uncommitted DDL could have left behind.
const SHARED_TTL_S: u64 = 600;

/// The Redis key of a schema: role and database (by `redis_client::key`), version, settings.
fn shared_key(key: &CacheKey) -> String {
    let name = format!(
        "{}:{}:{}:{}",
        key.version.unwrap_or(0),
        key.search_path,
        key.schemas
            .as_ref()
            .map(|s| s.join(","))
            .unwrap_or_default(),
        key.sample_values > 0
    );
    redis_client::key("schema", &name)
}

/// The schema another connection of this role already read, from Redis.
fn shared_get(key: &CacheKey) -> Option<Vec<Relation>> {
    if !redis_client::configured() {
        return None;
    }
    let redis_key = shared_key(key);
    let stored: Option<Option<String>> =
        redis_client::call(move |c| ::redis::cmd("GET").arg(redis_key).query(c));
    serde_json::from_str(&stored.flatten()?).ok()
}

/// Shares a freshly read schema with the other connections, through Redis.
fn shared_put(key: &CacheKey, relations: &[Relation]) {
    if !redis_client::configured() {
        return;
    }
    let (redis_key, Ok(json)) = (shared_key(key), serde_json::to_string(relations)) else {
        return;
    };
    let _: Option<()> = redis_client::call(move |c| {
        ::redis::cmd("SET")
            .arg(redis_key)
            .arg(json)
            .arg("EX")
            .arg(SHARED_TTL_S)
            .query(c)
    });
}

/// Role, search path, settings and schema version, in one small query.
fn current_key() -> Result<(CacheKey, String)> {
    const KEY_SQL: &str = "\
        SELECT current_schemas(false)::text, \
               pg_sequence_last_value(format('%I.nl_schema_version', n.nspname)::regclass), \
               quote_ident(n.nspname) \
        FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace \
        WHERE e.extname = 'sql_query_engine'";
    let (search_path, version, schema) = Spi::connect(|client| {
        client
            .select(KEY_SQL, Some(1), &[])?
            .first()
            .get_three::<String, i64, String>()
    })
    .map_err(|e| Error::internal(format!("reading the schema version failed: {e}")))?;
    let schema = schema.ok_or_else(|| Error::Setting {
        message: "the extension sql_query_engine is not installed in this database".into(),
        hint: "CREATE EXTENSION sql_query_engine;".into(),
    })?;
    EXTENSION_SCHEMA.with_borrow_mut(|s| *s = Some(schema.clone()));
    let key = CacheKey {
        role: unsafe { pg_sys::GetUserId() },
        search_path: search_path.unwrap_or_default(),
        schemas: settings::schemas(),
        sample_values: settings::sample_values(),
        version,
    };
    Ok((key, schema))
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
            neighbours,
            tokens,
            samples: RefCell::new(HashMap::new()),
            sample_values,
        }
    }

    /// The schema text for `question` (every relation when no question is given or all fit the
    /// prompt budget).
    pub fn for_question(&self, question: Option<&str>) -> PromptSchema {
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
                retrieve::select(&candidates, q, budget)
            }
            None => (0..self.relations.len()).collect(),
        };
        let mut text = String::new();
        for &i in &chosen {
            text.push_str(&render::render_relation(
                &self.relations[i],
                &self.samples_of(i),
            ));
        }
        if text.is_empty() {
            text.push_str(render::NOTHING_VISIBLE);
        }
        PromptSchema {
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
