//! What the model is told about the database for one question: the schema context as loaded
//! for a role (relations, their retrieval terms, foreign-key neighbours, token estimates, sample
//! values read lazily), the prompt text chosen for a question, and what a repair needs to know
//! about the relations a failed query named.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use crate::settings;
use crate::text::{name_tokens, words};

use super::catalog::Relation;
use super::render;
use super::retrieve::{self, Candidate, NameIndex, Terms};
use super::samples::{self, Samples};

/// One text column, as the value index reads it.
pub struct TextColumn {
    /// Index of its relation in the schema context.
    pub relation: usize,
    /// The column's name, quoted.
    pub column_sql: String,
    /// Where the extension may read its relation on its own (`Relation::own_read_from`).
    pub read_from: Option<String>,
    /// What the read of this column is known as to every role (`relation oid:filenode` and
    /// the column's number), when it may be shared (`Relation::shareable`).
    pub shared_as: Option<(String, i16)>,
    /// Its relation's OID and its number (what a read shared under `shared_as` must read).
    pub relation_oid: u32,
    pub attnum: i16,
    /// `relation.column` as the prompt writes it.
    pub display: String,
    /// Values known from the planner's statistics (most common values, histogram bounds).
    pub statistics: Vec<String>,
}

/// The text columns of a schema context, grouped by relation.
pub struct TextColumns(Vec<TextColumn>);

impl TextColumns {
    /// Columns made by hand (the value index's tests).
    #[cfg(test)]
    pub fn new(columns: Vec<TextColumn>) -> TextColumns {
        TextColumns(columns)
    }

    pub fn get(&self, id: usize) -> &TextColumn {
        &self.0[id]
    }

    /// Every column's id.
    pub fn ids(&self) -> std::ops::Range<usize> {
        0..self.0.len()
    }

    /// The relations that have text columns, in schema order.
    pub fn relations(&self) -> Vec<usize> {
        let mut relations: Vec<usize> = self.0.iter().map(|c| c.relation).collect();
        relations.dedup();
        relations
    }

    /// The ids of `relation`'s text columns (they are kept in relation order: a range).
    pub fn of_relation(&self, relation: usize) -> Vec<usize> {
        let start = self.0.partition_point(|c| c.relation < relation);
        let end = self.0.partition_point(|c| c.relation <= relation);
        (start..end).collect()
    }
}

/// Foreign-key steps a repair hint follows to say how to reach a column's table.
const JOIN_HOPS: usize = 3;
/// Relations a repair hint says a missing column is in, and how to join them.
const MAX_OWNERS: usize = 16;

/// The schema as loaded for one role and set of schemas, with what retrieval needs.
pub struct SchemaContext {
    relations: Vec<Relation>,
    terms: Vec<Terms>,
    /// Each relation's name, and its multi-word column names.
    names: NameIndex,
    neighbours: Vec<Vec<usize>>,
    /// Estimated tokens of each relation's rendering (sample values included).
    tokens: Vec<usize>,
    /// Samples of each relation's columns, once read, and when (kept `samples::KEPT_FOR`).
    samples: RefCell<HashMap<usize, Read>>,
    /// When the read of a relation's samples last failed: it is not tried again for a while
    /// (a lock another session holds would cost every call its read's timeout).
    failed: RefCell<HashMap<usize, std::time::Instant>>,
    sample_values: usize,
}

/// A relation's samples (one per column) and when they were read.
type Read = (std::time::Instant, Rc<Vec<Option<Samples>>>);

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

impl SchemaContext {
    pub(super) fn new(relations: Vec<Relation>, sample_values: usize) -> Self {
        let index: HashMap<u32, usize> = relations
            .iter()
            .enumerate()
            .map(|(i, r)| (r.oid, i))
            .collect();
        let mut neighbours = vec![Vec::new(); relations.len()];
        for (i, r) in relations.iter().enumerate() {
            pgrx::check_for_interrupts!();
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
            .map(|r| {
                pgrx::check_for_interrupts!();
                relation_terms(r, sample_values)
            })
            .collect();
        let mut names = NameIndex::default();
        for (i, r) in relations.iter().enumerate() {
            pgrx::check_for_interrupts!();
            names.add(name_tokens(unquoted(&r.name)), i);
            for column in &r.columns {
                let tokens = name_tokens(unquoted(&column.name));
                if tokens.len() > 1 {
                    names.add(tokens, i);
                }
            }
        }
        let tokens = relations
            .iter()
            .map(|r| {
                pgrx::check_for_interrupts!();
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
            failed: RefCell::new(HashMap::new()),
            sample_values,
        }
    }

    /// The bare names (unquoted, lower case) of the relations `question` is about: those it
    /// names and those where its values are stored (`evidence`), for ranking examples.
    pub fn about(&self, question: &str, evidence: &[usize]) -> Vec<String> {
        let mut about: Vec<String> = self
            .names
            .named_in(question)
            .into_iter()
            .chain(evidence.iter().copied())
            .filter_map(|i| self.relations.get(i))
            .map(|r| r.name.trim_matches('"').to_lowercase())
            .collect();
        about.sort();
        about.dedup();
        about
    }

    /// The text columns, for the value index.
    pub fn text_columns(&self) -> TextColumns {
        let mut columns = Vec::new();
        let trusted = crate::guard::trusted_by_the_current_user();
        for (i, relation) in self.relations.iter().enumerate() {
            let read_from = relation.own_read_from(&trusted);
            for column in relation.columns.iter().filter(|c| c.textual) {
                columns.push(TextColumn {
                    relation: i,
                    column_sql: column.name.clone(),
                    read_from: read_from.clone(),
                    shared_as: relation
                        .grants
                        .as_ref()
                        .filter(|_| relation.shareable && read_from.is_some())
                        .map(|grants| {
                            (
                                format!("{}:{}:{grants}", relation.oid, relation.filenode),
                                column.attnum,
                            )
                        }),
                    relation_oid: relation.oid,
                    attnum: column.attnum,
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
                let named: std::collections::HashSet<usize> = must.iter().copied().collect();
                must.extend(evidence.iter().filter(|i| !named.contains(i)));
                retrieve::select(&candidates, q, budget, &must)
            }
            None => (0..self.relations.len()).collect(),
        };
        let mut text = String::new();
        let mschema = settings::schema_format() == settings::SchemaFormat::MSchema;
        let deadline = std::time::Instant::now() + samples::READ_BUDGET;
        let trusted = crate::guard::trusted_by_the_current_user();
        for &i in &chosen {
            pgrx::check_for_interrupts!();
            let samples = self.samples_of(i, deadline, &trusted);
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
        // Retrieval may show more than the budget (what the question names, the best hit),
        // but never a schema of any size: one relation of thousands of long comments, say.
        // (With room for samples longer than estimated: four characters a token.)
        let limit = (retrieve::MUST_BUDGETS + 1) * budget * 4;
        let cut = question.is_some() && text.len() > limit;
        if cut {
            text = crate::text::within_bytes(
                text,
                limit,
                "-- (the rest of the schema is left out: it is larger than \
                 sql_query_engine.prompt_budget allows)",
            );
        }
        PromptSchema {
            cached: false,
            pruned: cut || chosen.len() < self.relations.len(),
            relations: chosen
                .iter()
                .map(|&i| self.relations[i].sql_name())
                .collect(),
            text,
        }
    }

    /// The relations a query the caller did not write may name: this context's
    /// (`guard::Scope`).
    pub fn scope(&self) -> crate::guard::Scope {
        crate::guard::Scope::new(self.relations.iter().map(|r| r.oid).collect())
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
        let names: HashSet<&str> = names.iter().map(String::as_str).collect();
        let named: Vec<usize> = (0..self.relations.len())
            .filter(|&i| names.contains(unquoted(&self.relations[i].name)))
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
            let mut owners: Vec<usize> = (0..self.relations.len())
                .filter(|&i| {
                    self.relations[i]
                        .columns
                        .iter()
                        .any(|c| unquoted(&c.name) == column)
                })
                .collect();
            // Each is a search through the foreign keys (or the key-like columns): a column
            // that thousands of relations have is said of the first few, those a foreign key
            // joins to a named relation first (the ones the query can use).
            if owners.len() > MAX_OWNERS {
                lines.push(format!(
                    "{} relations have a column {column}; the first {MAX_OWNERS}:",
                    owners.len()
                ));
                let mut near = vec![false; self.relations.len()];
                for &n in &named {
                    pgrx::check_for_interrupts!();
                    near[n] = true;
                    for &m in &self.neighbours[n] {
                        if let Some(near) = near.get_mut(m) {
                            *near = true;
                        }
                    }
                }
                owners.sort_by_key(|&owner| !near[owner]);
            }
            if owners.is_empty() {
                lines.extend(self.similar_columns(&named, column));
            }
            for owner in owners.into_iter().take(MAX_OWNERS) {
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
                    let guessed = if chain.is_empty() {
                        self.same_key_chain(&named, owner)
                    } else {
                        Vec::new()
                    };
                    if !chain.is_empty() {
                        format!(", joined by {}", chain.join(", then "))
                    } else if !guessed.is_empty() {
                        format!(
                            ", probably joined by {} (named alike; no foreign key)",
                            guessed.join(", then ")
                        )
                    } else {
                        String::new()
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
        // What the failed query names may be every relation there is: no more than the
        // schema itself may take.
        (!lines.is_empty()).then(|| {
            crate::text::within_bytes(
                lines.join("\n"),
                settings::prompt_budget() * 4,
                "(more is left out: it is larger than sql_query_engine.prompt_budget allows)",
            )
            .trim_end()
            .to_string()
        })
    }

    /// When no relation has `column`: the columns whose names say the same kind of value
    /// (`similar_name`), those of the relations the query named (`named`) first, at most
    /// `SIMILAR_COLUMNS`. Small models invent a name from the question's words
    /// (`templates.template_description` for a document's description) and repeat it however
    /// often they are told it does not exist; naming what does exist is what they follow.
    fn similar_columns(&self, named: &[usize], column: &str) -> Option<String> {
        let others = (0..self.relations.len()).filter(|i| !named.contains(i));
        let mut similar = Vec::new();
        for i in named.iter().copied().chain(others) {
            pgrx::check_for_interrupts!();
            let relation = &self.relations[i];
            for c in &relation.columns {
                if similar.len() < SIMILAR_COLUMNS && similar_name(column, unquoted(&c.name)) {
                    similar.push(format!("{}.{}", relation.sql_name(), c.name));
                }
            }
        }
        (!similar.is_empty()).then(|| {
            format!(
                "No table has a column {column}; columns with a similar name: {}.",
                similar.join(", ")
            )
        })
    }

    /// The one relation named `name` (as the parser folds it); `None` when no relation, or more
    /// than one (in different schemas), is named so.
    fn named(&self, name: &str) -> Option<&Relation> {
        only(self.relations.iter().filter(|r| unquoted(&r.name) == name))
    }

    /// Whether the one relation named `name` (as the parser folds it) has a column `column`;
    /// `None` when no relation, or more than one (in different schemas), is named so.
    pub fn has_column(&self, name: &str, column: &str) -> Option<bool> {
        self.named(name).map(|r| shows(r, column))
    }

    /// The relation a query names `schema.name` (as the parser folds them), or `name` alone
    /// when the search path finds it: `None` when this context has no such relation, or
    /// cannot tell which.
    fn resolved(&self, schema: Option<&str>, name: &str) -> Option<&Relation> {
        match schema {
            Some(schema) => only(
                self.relations
                    .iter()
                    .filter(|r| unquoted(&r.schema) == schema && unquoted(&r.name) == name),
            ),
            None => self.named(name).filter(|r| r.visible),
        }
    }

    /// The type of column `column` of the relation `schema.name` (see `resolved`): `None`
    /// when the relation is not known, `Some(None)` when it has no such column (that the
    /// caller may read).
    pub fn column_type(
        &self,
        schema: Option<&str>,
        name: &str,
        column: &str,
    ) -> Option<Option<u32>> {
        let relation = self.resolved(schema, name)?;
        Some(
            relation
                .columns
                .iter()
                .find(|c| unquoted(&c.name) == column)
                .map(|c| c.type_oid),
        )
    }

    /// The keys that give each row of the relation `schema.name` (see `resolved`) a value of
    /// its own, with columns the caller may read, as the parser folds them: its primary key,
    /// and each unique key of NOT NULL columns; none that is DEFERRABLE, and no unique key of
    /// a table with inheritance children (its rows are read too, and the key does not cover
    /// them). PostgreSQL derives a column's value from the primary key alone.
    pub fn keys(&self, schema: Option<&str>, name: &str) -> Option<Keys> {
        let relation = self.resolved(schema, name)?;
        let firm = |key: &Vec<String>| {
            !key.is_empty()
                && !relation.deferrable.contains(key)
                && key.iter().all(|c| shows(relation, unquoted(c)))
        };
        let not_null = |column: &String| {
            relation
                .columns
                .iter()
                .any(|c| &c.name == column && c.not_null)
        };
        let folded = |key: &Vec<String>| key.iter().map(|c| unquoted(c).to_string()).collect();
        Some(Keys {
            primary: Some(&relation.primary_key).filter(|k| firm(k)).map(folded),
            unique: relation
                .unique
                .iter()
                .filter(|k| !relation.inherited && firm(k) && k.iter().all(not_null))
                .map(folded)
                .collect(),
        })
    }

    /// The relations one foreign key away from the one relation named `name` (as the parser
    /// folds it), those that have a column `column` when one is given, each with the columns
    /// the key joins; only columns this context shows (the caller may read them) are used.
    pub fn hops(&self, name: &str, column: Option<&str>) -> Vec<Hop> {
        let Some(from) = self.named(name) else {
            return Vec::new();
        };
        let hop = |to: &Relation, pairs: Vec<(&String, &String)>| -> Option<Hop> {
            let on: Vec<(String, String)> = pairs
                .into_iter()
                .map(|(f, t)| (unquoted(f).to_string(), unquoted(t).to_string()))
                .collect();
            let readable = on.iter().all(|(f, t)| shows(from, f) && shows(to, t));
            let wanted = column.is_none_or(|c| shows(to, c));
            (to.oid != from.oid && wanted && readable && !on.is_empty()).then(|| Hop {
                sql: to.sql_name(),
                name: unquoted(&to.name).to_string(),
                on,
            })
        };
        let outgoing = from.foreign_keys.iter().filter_map(|fk| {
            let to = self.relations.iter().find(|r| r.oid == fk.ref_oid)?;
            hop(to, fk.columns.iter().zip(&fk.ref_columns).collect())
        });
        let incoming = self.relations.iter().flat_map(|to| {
            pgrx::check_for_interrupts!();
            to.foreign_keys
                .iter()
                .filter(|fk| fk.ref_oid == from.oid)
                .filter_map(move |fk| hop(to, fk.ref_columns.iter().zip(&fk.columns).collect()))
        });
        outgoing.chain(incoming).collect()
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
        let starts: HashSet<usize> = from.iter().copied().collect();
        let mut frontier: Vec<usize> = from.to_vec();
        for _ in 0..JOIN_HOPS {
            let mut next = Vec::new();
            for &i in &frontier {
                pgrx::check_for_interrupts!();
                for &j in &self.neighbours[i] {
                    if starts.contains(&j) || came_from.contains_key(&j) {
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

    /// Where no foreign key leads from any of `from` to `to` (many databases declare none):
    /// the shortest chain, at most `JOIN_HOPS` long, of joins on key-like columns (`key_like`)
    /// of the same name and type, one condition per step (`author.oid = organization.oid`). A
    /// guess for the model to weigh, never used to rewrite a query.
    fn same_key_chain(&self, from: &[usize], to: usize) -> Vec<String> {
        // The relations that have each key-like column, by name and type.
        let mut having: HashMap<(&str, u32), Vec<usize>> = HashMap::new();
        for (i, relation) in self.relations.iter().enumerate() {
            pgrx::check_for_interrupts!();
            for c in &relation.columns {
                if key_like(unquoted(&c.name)) && c.type_oid != pgrx::pg_sys::BOOLOID.to_u32() {
                    having.entry((&c.name, c.type_oid)).or_default().push(i);
                }
            }
        }
        // For each relation reached: the one it was reached from, and the column joined on.
        let mut came_from: HashMap<usize, (usize, &str)> = HashMap::new();
        // A column shared by many relations leads to all of them the first time it is
        // followed, and to none after: followed once, the walk stays linear in the columns.
        let mut followed: HashSet<(&str, u32)> = HashSet::new();
        let starts: HashSet<usize> = from.iter().copied().collect();
        let mut frontier: Vec<usize> = from.to_vec();
        for _ in 0..JOIN_HOPS {
            let mut next = Vec::new();
            for &i in &frontier {
                for c in &self.relations[i].columns {
                    pgrx::check_for_interrupts!();
                    if !followed.insert((c.name.as_str(), c.type_oid)) {
                        continue;
                    }
                    for &j in having
                        .get(&(c.name.as_str(), c.type_oid))
                        .into_iter()
                        .flatten()
                    {
                        if j == i || starts.contains(&j) || came_from.contains_key(&j) {
                            continue;
                        }
                        came_from.insert(j, (i, &c.name));
                        next.push(j);
                    }
                }
            }
            if came_from.contains_key(&to) {
                let mut chain = Vec::new();
                let mut at = to;
                while let Some(&(previous, column)) = came_from.get(&at) {
                    let (a, b) = (&self.relations[previous], &self.relations[at]);
                    chain.push(format!(
                        "{}.{column} = {}.{column}",
                        a.sql_name(),
                        b.sql_name()
                    ));
                    at = previous;
                }
                chain.reverse();
                return chain;
            }
            frontier = next;
        }
        Vec::new()
    }

    /// Reads of relations begin only before `deadline`; what could not be read then is
    /// statistics only, and not kept, so that a later call reads it (a read that failed, not
    /// before `samples::RETRY_AFTER`).
    fn samples_of(
        &self,
        i: usize,
        deadline: std::time::Instant,
        trusted: &crate::guard::Trusted,
    ) -> Rc<Vec<Option<Samples>>> {
        if self.sample_values == 0 {
            return Rc::new(Vec::new());
        }
        if let Some((_, s)) = self
            .samples
            .borrow()
            .get(&i)
            .filter(|(at, _)| at.elapsed() < samples::KEPT_FOR)
        {
            return Rc::clone(s);
        }
        let recently_failed = self
            .failed
            .borrow()
            .get(&i)
            .is_some_and(|at| at.elapsed() < samples::RETRY_AFTER);
        let deadline = if recently_failed {
            std::time::Instant::now()
        } else {
            deadline
        };
        let (s, read) =
            samples::for_relation(&self.relations[i], self.sample_values, deadline, trusted);
        let s = Rc::new(s);
        match read {
            samples::Read::Done => {
                self.samples
                    .borrow_mut()
                    .insert(i, (std::time::Instant::now(), Rc::clone(&s)));
            }
            samples::Read::Failed => {
                self.failed
                    .borrow_mut()
                    .insert(i, std::time::Instant::now());
            }
            samples::Read::NotYet => {}
        }
        s
    }
}

/// A relation's keys as `SchemaContext::keys` gives them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keys {
    pub primary: Option<Vec<String>>,
    /// Unique keys of NOT NULL columns.
    pub unique: Vec<Vec<String>>,
}

/// A relation one foreign key away from another (`SchemaContext::hops`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    /// As SQL writes it (schema-qualified when the search path would not find it).
    pub sql: String,
    /// Its name, as the parser folds it.
    pub name: String,
    /// The columns the key joins: (the other relation's, this one's).
    pub on: Vec<(String, String)>,
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
    let mut terms = Terms::default();
    terms.name.extend(words(unquoted(&relation.name)));
    for column in &relation.columns {
        terms.columns.extend(words(unquoted(&column.name)));
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

/// Whether a column's name says it identifies a row of some table (`oid`, `patient_id`,
/// `state_code`), so that two tables that have it are likely joined on it; never a bare `id`,
/// which every table may have for its own rows.
fn key_like(name: &str) -> bool {
    let name = name.to_lowercase();
    let last = name.rsplit('_').next().unwrap_or_default();
    name != "id" && (name.ends_with("id") || ["code", "key", "no", "num", "number"].contains(&last))
}

/// Similar columns named in a repair hint, at most.
const SIMILAR_COLUMNS: usize = 4;

/// Whether `column` names the same kind of value as `missing`, a name no relation has: the
/// same last word (`document_description` for `template_description`: the last word of a
/// column name says what it holds), unless that word is as common as `id` or shorter, when
/// two words must be shared; or one name holds the other whole (`budget_amount` for
/// `budget`), when that is at least four characters long.
fn similar_name(missing: &str, column: &str) -> bool {
    if missing == column {
        return false;
    }
    let words = |name: &str| -> Vec<String> {
        name.split('_')
            .filter(|w| !w.is_empty())
            .map(str::to_lowercase)
            .collect()
    };
    let (m, c) = (words(missing), words(column));
    let (Some(m_last), Some(c_last)) = (m.last(), c.last()) else {
        return false;
    };
    let shared = m.iter().filter(|w| c.contains(w)).count();
    let generic = m_last.len() < 3 || ["id", "key", "code", "num", "no"].contains(&m_last.as_str());
    let same_kind = m_last == c_last && (!generic || shared >= 2);
    let (missing, column) = (missing.to_lowercase(), column.to_lowercase());
    let holds = missing.len().min(column.len()) >= 4
        && (column.contains(&missing) || missing.contains(&column));
    same_kind || holds
}

/// Whether `relation` has a column `column` (as the parser folds it) in this context: the
/// columns the caller may read.
fn shows(relation: &Relation, column: &str) -> bool {
    relation.columns.iter().any(|c| unquoted(&c.name) == column)
}

/// The one relation `found` holds; `None` when it holds none, or several.
fn only<'a>(mut found: impl Iterator<Item = &'a Relation>) -> Option<&'a Relation> {
    let relation = found.next()?;
    found.next().is_none().then_some(relation)
}

/// A name as the parser folds it, from the quoted form the schema context keeps.
fn unquoted(name: &str) -> &str {
    name.trim_matches('"')
}

#[cfg(test)]
mod tests {
    use super::{key_like, similar_name};

    #[test]
    fn key_like_names_identify_rows_of_some_table() {
        for name in [
            "oid",
            "patient_id",
            "sbCustId",
            "state_code",
            "flight_number",
        ] {
            assert!(key_like(name), "{name}");
        }
        for name in ["id", "name", "year", "state", "code_description"] {
            assert!(!key_like(name), "{name}");
        }
    }

    #[test]
    fn similar_names_hold_the_same_kind_of_value() {
        assert!(similar_name("template_description", "document_description"));
        assert!(similar_name("budget", "budget_amount"));
        assert!(similar_name("custname", "sbcustname"));
        assert!(similar_name("customer_id", "order_customer_id"));
        // A common last word alone says nothing; a short name held whole neither.
        assert!(!similar_name("customer_id", "order_id"));
        assert!(!similar_name("ins_code", "state_code"));
        assert!(!similar_name("id", "aid"));
        assert!(!similar_name("building", "room"));
        assert!(!similar_name("name", "name"));
    }
}
