//! What a column's keys say it identifies, from the relation cache: a column named like an
//! identifier, a foreign key and what it references, a primary key. Read to doubt a query's
//! rows (`doubts`), never to refuse one.

use pgrx::pg_sys;
use pgrx::PgList;

use super::facts::OpenRelation;
use crate::compat;
use crate::names::{c_string, printable, quoted};

/// Foreign keys followed from one column to the key it ends at, at most (a chain of tables
/// each keyed by the one before: an order line → an order → ...).
const MAX_HOPS: usize = 8;

/// A column, by its relation and number.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Column {
    pub relation: pg_sys::Oid,
    pub attnum: pg_sys::AttrNumber,
}

/// What a key column identifies: the key its foreign keys end at, or itself when it is the
/// primary key of its relation.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Referent {
    /// The key the column's values are values of.
    pub key: Column,
    /// Reached through a foreign key (the column references `key`), not the column's own key.
    pub referenced: bool,
    /// `relation.column` of `key` when the caller may read it (`shown`), read while the key's
    /// relation is locked.
    pub shown: Option<String>,
}

/// The name of column `attnum` of `relation`, and why it identifies rows: it is named `id` or
/// `..._id`, or it is a column of a foreign key and named `...id`.
///
/// # Safety
/// `relation` is a relation the current transaction has locked (parse analysis did).
pub unsafe fn identifies(
    relation: pg_sys::Oid,
    attnum: pg_sys::AttrNumber,
) -> Option<(String, &'static str)> {
    // SAFETY: the caller's contract.
    unsafe {
        let column = column_name(Column { relation, attnum })?;
        let folded = column.to_lowercase();
        if folded == "id" || folded.ends_with("_id") {
            return Some((column, "its name says it identifies rows"));
        }
        if !folded.ends_with("id") {
            return None;
        }
        let foreign = !references(relation, attnum).is_empty();
        foreign.then_some((column, "a foreign key column"))
    }
}

/// What `column` identifies, when it is a key: the key its foreign keys lead to (followed
/// while that key is itself a foreign key), else the column itself when it alone is its
/// relation's primary key. `None` for a column that is no key, one whose foreign keys lead to
/// different keys, or one whose chain leaves the relations this transaction may lock without
/// waiting.
///
/// # Safety
/// `column.relation` is a relation the current transaction has locked (parse analysis did).
pub unsafe fn referent(column: Column) -> Option<Referent> {
    let mut at = column;
    let mut referenced = false;
    // The lock on the relation `at` is in, once a foreign key led there.
    let mut _held: Option<Glance> = None;
    // SAFETY: the caller's contract for the first relation; every relation reached through a
    // foreign key is locked here (without waiting) while it is read.
    unsafe {
        for _ in 0..MAX_HOPS {
            match references(at.relation, at.attnum).as_slice() {
                [] => {
                    return (referenced || primary_key(at)).then(|| Referent {
                        key: at,
                        referenced,
                        shown: shown(at),
                    })
                }
                [next] => {
                    _held = Some(Glance::take(next.relation)?);
                    at = *next;
                    referenced = true;
                }
                // Keys of several relations: no one referent.
                _ => return None,
            }
        }
    }
    None
}

/// A relation reached through a foreign key, locked while its keys are read and no longer:
/// the query does not read it, so it should not hold back another session's DDL on it.
struct Glance(pg_sys::Oid);

impl Glance {
    /// Locks `relation` if that needs no wait, and when it still exists.
    fn take(relation: pg_sys::Oid) -> Option<Glance> {
        // SAFETY: a lock by OID, released by `drop` (or by the subtransaction's end when an
        // ERROR unwinds first); a syscache probe.
        unsafe {
            if !pg_sys::ConditionalLockRelationOid(relation, ACCESS_SHARE) {
                return None;
            }
            let glance = Glance(relation);
            // Dropped before the lock was granted: the OID names nothing now.
            pg_sys::SearchSysCacheExists(
                pg_sys::SysCacheIdentifier::RELOID as i32,
                pg_sys::Datum::from(relation),
                pg_sys::Datum::from(0),
                pg_sys::Datum::from(0),
                pg_sys::Datum::from(0),
            )
            .then_some(glance)
        }
    }
}

impl Drop for Glance {
    fn drop(&mut self) {
        // SAFETY: taken once by `Glance::take`; locks are counted, so a lock the query holds on
        // the same relation stays.
        unsafe { pg_sys::UnlockRelationOid(self.0, ACCESS_SHARE) }
    }
}

const ACCESS_SHARE: pg_sys::LOCKMODE = pg_sys::AccessShareLock as pg_sys::LOCKMODE;

/// `relation.column` as the caller's query would write it, when the caller may read the column
/// (USAGE on its schema, SELECT on its table or on that column) and both names print on one
/// line (`names::printable`): the model is shown no table the caller may not read, and no name
/// another role chose to break its text.
///
/// # Safety
/// `column.relation` is locked by this transaction.
pub unsafe fn shown(column: Column) -> Option<String> {
    // SAFETY: the caller's contract (so the look-ups find the relation); the name is a palloc'd
    // copy.
    unsafe {
        let role = pg_sys::GetUserId();
        let select = pg_sys::ACL_SELECT as pg_sys::AclMode;
        let usage = compat::namespace_allows(
            pg_sys::get_rel_namespace(column.relation),
            role,
            pg_sys::ACL_USAGE as pg_sys::AclMode,
        );
        let readable = pg_sys::pg_class_aclcheck(column.relation, role, select)
            == pg_sys::AclResult::ACLCHECK_OK
            || pg_sys::pg_attribute_aclcheck(column.relation, column.attnum, role, select)
                == pg_sys::AclResult::ACLCHECK_OK;
        if !usage || !readable {
            return None;
        }
        let relation = c_string(pg_sys::get_rel_name(column.relation));
        let name = column_name(column)?;
        (!relation.is_empty() && printable(&relation))
            .then(|| format!("{}.{}", quoted(&relation), quoted(&name)))
    }
}

/// The name of `column`, when it prints on one line (`names::printable`; `None` for a relation
/// that is gone).
///
/// # Safety
/// `column.relation` exists.
pub unsafe fn column_name(column: Column) -> Option<String> {
    // SAFETY: the caller's contract; the name is a palloc'd copy (or null).
    unsafe {
        let name = pg_sys::get_attname(column.relation, column.attnum, true);
        Some(c_string(name)).filter(|name| !name.is_empty() && printable(name))
    }
}

/// The distinct columns that `attnum` of `relation` references through its foreign keys. A key
/// of several columns that maps a column onto itself (a tenant's id in `(tenant_id, parent_id)
/// REFERENCES t (tenant_id, id)`) says nothing of what it identifies; a partition's key is its
/// partitioned table's, which is referenced too.
///
/// # Safety
/// `relation` is locked by this transaction.
unsafe fn references(relation: pg_sys::Oid, attnum: pg_sys::AttrNumber) -> Vec<Column> {
    let mut found: Vec<Column> = Vec::new();
    // The relation is closed by `OpenRelation` on every path, also when an ERROR unwinds.
    // SAFETY: the caller's contract; the foreign key list is only read, with no catalog
    // access while it is held (the partitions are looked up after).
    unsafe {
        let rel = OpenRelation::open(relation, pg_sys::NoLock);
        for key in
            PgList::<pg_sys::ForeignKeyCacheInfo>::from_pg(pg_sys::RelationGetFKeyList(rel.0))
                .iter_ptr()
        {
            let n = usize::try_from((*key).nkeys).unwrap_or(0);
            for (&from, &to) in (*key).conkey.iter().zip((*key).confkey.iter()).take(n) {
                let target = Column {
                    relation: (*key).confrelid,
                    attnum: to,
                };
                let itself = target.relation == relation && to == attnum;
                if from == attnum && !itself && !found.contains(&target) {
                    found.push(target);
                }
            }
        }
        drop(rel);
        if found.len() > 1 {
            found.retain(|target| !pg_sys::get_rel_relispartition(target.relation));
        }
    }
    found
}

/// `column` alone is the primary key of its relation.
///
/// # Safety
/// `column.relation` is locked by this transaction.
unsafe fn primary_key(column: Column) -> bool {
    // SAFETY: the caller's contract; the bitmap is a palloc'd copy, freed with the memory
    // context; the relation is closed by `OpenRelation` on every path.
    unsafe {
        let rel = OpenRelation::open(column.relation, pg_sys::NoLock);
        let members = pg_sys::RelationGetIndexAttrBitmap(
            rel.0,
            pg_sys::IndexAttrBitmapKind::INDEX_ATTR_BITMAP_PRIMARY_KEY,
        );
        pg_sys::bms_num_members(members) == 1
            && pg_sys::bms_is_member(
                i32::from(column.attnum) - pg_sys::FirstLowInvalidHeapAttributeNumber,
                members,
            )
    }
}
