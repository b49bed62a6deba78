//! What a query the caller did not write may name. A model's answer, and another role's
//! verified example, may read only the relations of the caller's schema context: what the
//! caller was shown, whose schemas it searches or trusts (`schema::cache`). Not a relation of
//! a schema another role made and opened to PUBLIC that the caller never chose to look at (its
//! views' code would run as the caller), not the extension's own tables (other clients'
//! conversations when a role is shared). The caller's own SQL (`nl_fix`, `nl_run`,
//! `nl_check`) is the caller's choice and has no scope.

use pgrx::pg_sys;

use super::facts::builtin;
use super::verdict::Refusal;
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
    fn admits(&self, relation: pg_sys::Oid) -> bool {
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
