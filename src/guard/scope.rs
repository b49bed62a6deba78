//! What a query the caller did not write may name. A model's answer, and another role's
//! verified example, may read only the relations of the caller's schema context: what the
//! caller was shown, whose schemas it searches or trusts (`schema::cache`). Not a relation of
//! a schema another role made and opened to PUBLIC that the caller never chose to look at (its
//! views' code would run as the caller), not the extension's own tables (other clients'
//! conversations when a role is shared). The caller's own SQL (`nl_fix`, `nl_run`,
//! `nl_check`) is the caller's choice and has no scope.

use std::ffi::c_void;

use pgrx::pg_sys;
use pgrx::PgList;

use super::facts::builtin;
use super::verdict::Refusal;
use crate::error::SqlState;
use crate::names::relation_name;

/// The relations of a schema context, by OID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    relations: Vec<u32>,
}

impl Scope {
    pub fn new(mut relations: Vec<u32>) -> Scope {
        relations.sort_unstable();
        relations.dedup();
        Scope { relations }
    }

    fn holds(&self, relation: pg_sys::Oid) -> bool {
        self.relations.binary_search(&relation.to_u32()).is_ok()
    }

    /// Whether a query may name `relation`: one of the context's, a partition of one (the
    /// context shows partitioned tables whole), or a system catalog (those stay with
    /// `sql_query_engine.allow_system_catalogs`, which the guard applied already).
    pub(super) fn admits(&self, relation: pg_sys::Oid) -> bool {
        if builtin(relation) || self.holds(relation) {
            return true;
        }
        partition_of(relation, |ancestor| self.holds(ancestor)) == Some(true)
    }

    /// Why the statement that names `relations` may not run, if it may not.
    pub(super) fn refusal(&self, relations: &[pg_sys::Oid]) -> Option<Refusal> {
        let outside = relations.iter().find(|r| !self.admits(**r))?;
        Some(Refusal::forbidden(format!(
            "relation {} is not one of the tables and views shown for this question: a \
             generated query reads only those (sql_query_engine.schemas, the search path)",
            relation_name(*outside)
        )))
    }
}

impl Scope {
    /// Why `statement` (a raw statement, from `raw_parser`) may not run: a relation it names
    /// outside the scope, found by name as analysis will find it (a name a WITH query of the
    /// statement shadows where it is used is that query's), before anything is locked.
    /// Analysis locks every relation a statement names, whatever it may read: the text of
    /// another role's verified example, checked for every question its words match, would
    /// otherwise have the caller's backend lock (or wait for) a relation of that role's
    /// choosing, which tells that role, through `pg_locks`, who asked what and when.
    ///
    /// # Safety
    /// `statement` is a raw parse tree of the current memory context.
    pub(super) unsafe fn refusal_before_analysis(
        &self,
        statement: *mut pg_sys::Node,
    ) -> Option<Refusal> {
        let mut named = Named {
            scope: self,
            ctes: Vec::new(),
            found: None,
        };
        // SAFETY: the caller's contract; the statement as a one-element list, so that the
        // walker sees it too. Look-ups by name lock nothing and run nothing.
        unsafe {
            let list = pg_sys::lappend(std::ptr::null_mut(), statement.cast());
            relation_named(list.cast(), (&mut named as *mut Named).cast());
        }
        named.found
    }
}

/// What `relation_named` walks with: the scope, the names of the WITH queries in reach, and
/// the refusal, once found.
struct Named<'a> {
    scope: &'a Scope,
    ctes: Vec<String>,
    found: Option<Refusal>,
}

impl Scope {
    /// Why a statement that reaches `types` (the types `ahead::types_in_reach` found it to
    /// name, or those of the functions and operators it names) may not be analysed: one of them
    /// is, or holds (through domains, arrays, ranges and the fields of composite types), the
    /// row type of a relation outside the scope, whose columns analysis reads through the type
    /// cache, which locks the relation (a field of `ROW(1)::s.t`, of a function's result or OUT
    /// parameter, of an operator's). A composite type that is no relation's (`CREATE TYPE ...
    /// AS`) holds no rows: it is judged by its fields. Past `MAX_TYPE_STEPS` it is refused.
    pub(super) fn row_type_refusal(&self, types: &[pg_sys::Oid]) -> Option<Refusal> {
        let mut work: Vec<pg_sys::Oid> = types.to_vec();
        let mut seen = std::collections::HashSet::new();
        while let Some(typ) = work.pop() {
            if typ == pg_sys::InvalidOid || !seen.insert(typ) {
                continue;
            }
            if seen.len() > MAX_TYPE_STEPS {
                return Some(Refusal::read(
                    SqlState::STATEMENT_TOO_COMPLEX,
                    "the query reaches too many types to be checked".into(),
                ));
            }
            pgrx::check_for_interrupts!();
            // The type's existence first: a type dropped meanwhile holds nothing (analysis will
            // say it does not exist).
            // SAFETY: catalog look-ups by OID, each answering InvalidOid for what is not one.
            unsafe {
                if !pg_sys::SearchSysCacheExists(
                    pg_sys::SysCacheIdentifier::TYPEOID as _,
                    typ.into(),
                    pg_sys::Datum::null(),
                    pg_sys::Datum::null(),
                    pg_sys::Datum::null(),
                ) {
                    continue;
                }
                let base = pg_sys::getBaseType(typ);
                let relation = pg_sys::get_typ_typrelid(base);
                if relation != pg_sys::InvalidOid {
                    if pg_sys::get_rel_relkind(relation) == pg_sys::RELKIND_COMPOSITE_TYPE as i8 {
                        work.extend(fields(relation));
                    } else if !self.admits(relation) {
                        return self.refusal(&[relation]);
                    }
                    continue;
                }
                work.push(pg_sys::get_element_type(base));
                work.push(pg_sys::get_multirange_range(base));
                work.push(pg_sys::get_range_subtype(base));
            }
        }
        None
    }
}

/// Types followed at most from those a statement reaches to the row types they hold.
const MAX_TYPE_STEPS: usize = 1024;

/// The types of the fields of the composite type `relation` (none for one that is gone).
fn fields(relation: pg_sys::Oid) -> Vec<pg_sys::Oid> {
    // SAFETY: the relcache entry, closed before returning (NULL for a relation gone since).
    unsafe {
        let rel = pg_sys::RelationIdGetRelation(relation);
        if rel.is_null() {
            return Vec::new();
        }
        let types = crate::compat::attributes((*rel).rd_att)
            .iter()
            .filter(|attribute| !attribute.attisdropped)
            .map(|attribute| attribute.atttypid)
            .collect();
        pg_sys::RelationClose(rel);
        types
    }
}

/// Walks a raw tree for the relations it names (`Scope::refusal_before_analysis`); true once
/// one is outside the scope.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn relation_named(node: *mut pg_sys::Node, context: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    pgrx::check_for_interrupts!();
    // SAFETY: PostgreSQL's raw walker passes raw nodes and our `Named`; each node is read as
    // the struct its tag names.
    unsafe {
        let named = &mut *context.cast::<Named>();
        match (*node).type_ {
            pg_sys::NodeTag::T_RangeVar => {
                let range_var = node.cast::<pg_sys::RangeVar>();
                let name = crate::names::c_string((*range_var).relname);
                if (*range_var).schemaname.is_null() && named.ctes.contains(&name) {
                    return false;
                }
                let relation = pg_sys::RangeVarGetRelidExtended(
                    range_var,
                    pg_sys::NoLock as pg_sys::LOCKMODE,
                    pg_sys::RVROption::RVR_MISSING_OK,
                    None,
                    std::ptr::null_mut(),
                );
                if relation != pg_sys::InvalidOid && !named.scope.admits(relation) {
                    named.found = named.scope.refusal(&[relation]);
                    return named.found.is_some();
                }
                false
            }
            pg_sys::NodeTag::T_SelectStmt
                if !(*node.cast::<pg_sys::SelectStmt>()).withClause.is_null() =>
            {
                let select = node.cast::<pg_sys::SelectStmt>();
                let with = (*select).withClause;
                let queries = PgList::<pg_sys::CommonTableExpr>::from_pg((*with).ctes);
                let names: Vec<String> = queries
                    .iter_ptr()
                    .map(|cte| crate::names::c_string((*cte).ctename))
                    .collect();
                let outer = named.ctes.len();
                // A WITH query sees those before it, and with RECURSIVE all of them (itself
                // too); the rest of the statement sees all of them.
                for (i, cte) in queries.iter_ptr().enumerate() {
                    named.ctes.truncate(outer);
                    let seen = if (*with).recursive {
                        &names[..]
                    } else {
                        &names[..i]
                    };
                    named.ctes.extend_from_slice(seen);
                    if relation_named((*cte).ctequery, context) {
                        return true;
                    }
                }
                named.ctes.truncate(outer);
                named.ctes.extend(names);
                let s = &*select;
                let stopped = [
                    s.distinctClause,
                    s.targetList,
                    s.fromClause,
                    s.groupClause,
                    s.windowClause,
                    s.valuesLists,
                    s.sortClause,
                    s.lockingClause,
                ]
                .into_iter()
                .any(|list| relation_named(list.cast(), context))
                    || [
                        s.intoClause.cast(),
                        s.whereClause,
                        s.havingClause,
                        s.limitOffset,
                        s.limitCount,
                        s.larg.cast(),
                        s.rarg.cast(),
                    ]
                    .into_iter()
                    .any(|child| relation_named(child, context));
                named.ctes.truncate(outer);
                stopped
            }
            _ => pg_sys::raw_expression_tree_walker(node, Some(relation_named), context),
        }
    }
}

/// Levels of partitioning climbed at most from a partition to its ancestors: PostgreSQL sets
/// no bound, and each level is a catalog look-up that another role's chain of partitions (as
/// deep as it likes) would otherwise cost every query that names one.
const MAX_PARTITION_LEVELS: usize = 64;

/// Whether `relation`, a partition, is one at some level of a relation `wanted` says yes to;
/// `None` when that cannot be told: its chain is deeper than `MAX_PARTITION_LEVELS`, or changed
/// while it was climbed (a partition detached meanwhile).
fn partition_of(relation: pg_sys::Oid, wanted: impl Fn(pg_sys::Oid) -> bool) -> Option<bool> {
    let mut current = relation;
    for _ in 0..MAX_PARTITION_LEVELS {
        pgrx::check_for_interrupts!();
        // SAFETY: a syscache look-up (false for a relation that is gone).
        if !unsafe { pg_sys::get_rel_relispartition(current) } {
            return Some(false);
        }
        // Raises when the partition was detached since: then not known.
        let parent = crate::subxact::in_subtransaction(false, || {
            // SAFETY: declared with PostgreSQL's own signature; an ERROR comes back through
            // pgrx, and the subtransaction rolls it back.
            unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| get_partition_parent(current, true)) }
        })
        .ok()?;
        if wanted(parent) {
            return Some(true);
        }
        current = parent;
    }
    None
}

// catalog/partition.h, which pgrx does not bind.
// SAFETY: the declaration matches the header's, the same in PostgreSQL 14 to 18; it may raise
// PostgreSQL errors, hence C-unwind.
unsafe extern "C-unwind" {
    fn get_partition_parent(relid: pg_sys::Oid, even_if_detached: bool) -> pg_sys::Oid;
}
