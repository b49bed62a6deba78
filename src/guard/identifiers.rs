//! Aggregates that add up identifiers: `SUM(s.song_id)` where the question asked for the sum of
//! `s.sales`. A sum or an average of an identifier (a column named `id` or `..._id`, or a
//! foreign key column named `...id`) means nothing, yet the query runs and returns numbers, so
//! no result shows the mistake. Small models write it when they pick the wrong column of the
//! right table. A key that holds a value (`year`, a `rating` referencing a table of ratings) is
//! not one: only the name tells identifiers apart.
//!
//! Read from the analyzed tree the guard passed: nothing runs.

use std::ffi::c_void;

use pgrx::pg_sys;
use pgrx::PgList;

use super::facts::{builtin, OpenRelation};
use super::walk::too_deep;
use crate::names::c_string;

/// Doubts kept per query, at most (each is a line of a repair request).
const MAX_FOUND: usize = 3;

/// The walk's state: the queries it is inside (outermost first), and what it found.
struct Walk {
    queries: Vec<*mut pg_sys::Query>,
    found: Vec<String>,
}

/// Each `SUM` or `AVG` of `query` (at any depth) over a column that identifies rows, in words
/// for the model: `SUM(t.song_id) adds up identifiers (...)`, named as the query names it.
///
/// # Safety
/// `query` must be an analyzed Query of the current transaction, whose relations parse
/// analysis locked.
pub unsafe fn identifiers_added(query: *mut pg_sys::Query) -> Vec<String> {
    let mut walk = Walk {
        queries: vec![query],
        found: Vec::new(),
    };
    // Through PostgreSQL's walker, not by calling `walker` (see `walk::check_tree`).
    // SAFETY: the caller's contract; `walk` outlives the walk.
    unsafe {
        pg_sys::query_tree_walker(query, Some(walker), (&mut walk as *mut Walk).cast(), 0);
    }
    walk.found
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn walker(node: *mut pg_sys::Node, context: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    if too_deep().is_some() {
        return true;
    }
    // SAFETY: PostgreSQL's walkers pass analyzed nodes and our `Walk`; each node is cast to the
    // struct its tag names.
    unsafe {
        let added = match (*node).type_ {
            pg_sys::NodeTag::T_Query => {
                let query = node.cast::<pg_sys::Query>();
                (*context.cast::<Walk>()).queries.push(query);
                let stop = pg_sys::query_tree_walker(query, Some(walker), context, 0);
                (*context.cast::<Walk>()).queries.pop();
                return stop;
            }
            pg_sys::NodeTag::T_Aggref => {
                let aggref = node.cast::<pg_sys::Aggref>();
                let args: Vec<*mut pg_sys::Node> =
                    PgList::<pg_sys::TargetEntry>::from_pg((*aggref).args)
                        .iter_ptr()
                        .filter(|&entry| !(*entry).resjunk)
                        .map(|entry| (*entry).expr.cast::<pg_sys::Node>())
                        .collect();
                added_up(
                    (*aggref).aggfnoid,
                    &args,
                    &(*context.cast::<Walk>()).queries,
                )
            }
            pg_sys::NodeTag::T_WindowFunc => {
                let window = node.cast::<pg_sys::WindowFunc>();
                let args: Vec<*mut pg_sys::Node> = PgList::<pg_sys::Node>::from_pg((*window).args)
                    .iter_ptr()
                    .collect();
                added_up(
                    (*window).winfnoid,
                    &args,
                    &(*context.cast::<Walk>()).queries,
                )
            }
            // An aggregate's DISTINCT or ORDER BY: operators, no expression.
            pg_sys::NodeTag::T_SortGroupClause => return false,
            _ => None,
        };
        if let Some(line) = added {
            // Not held across the walk below, which reaches this context again.
            let walk = &mut *context.cast::<Walk>();
            if !walk.found.contains(&line) {
                walk.found.push(line);
            }
            if walk.found.len() >= MAX_FOUND {
                return true;
            }
        }
        pg_sys::expression_tree_walker(node, Some(walker), context)
    }
}

/// The account of a call of `function` on `args` when it is the built-in `sum` or `avg` of one
/// column that identifies rows of a table; `queries`: the queries the call is inside,
/// outermost first.
///
/// # Safety
/// `args` are nodes of the analyzed tree whose enclosing queries are `queries`.
unsafe fn added_up(
    function: pg_sys::Oid,
    args: &[*mut pg_sys::Node],
    queries: &[*mut pg_sys::Query],
) -> Option<String> {
    let [arg] = args else {
        return None;
    };
    // SAFETY: the caller's contract; every node is read as the struct its tag names, and the
    // function's name is a palloc'd copy (or null).
    unsafe {
        if !builtin(function) {
            return None;
        }
        let name = pg_sys::get_func_name(function);
        if name.is_null() {
            return None;
        }
        let name = c_string(name);
        if name != "sum" && name != "avg" {
            return None;
        }
        let mut expr = *arg;
        // A column of a domain over a number is read through a relabelling.
        while !expr.is_null() && (*expr).type_ == pg_sys::NodeTag::T_RelabelType {
            expr = (*expr.cast::<pg_sys::RelabelType>()).arg.cast();
        }
        if expr.is_null() || (*expr).type_ != pg_sys::NodeTag::T_Var {
            return None;
        }
        let var = expr.cast::<pg_sys::Var>();
        let attnum = (*var).varattno;
        if attnum <= 0 {
            return None;
        }
        let level = queries
            .len()
            .checked_sub(1)?
            .checked_sub(usize::try_from((*var).varlevelsup).ok()?)?;
        let index = usize::try_from((*var).varno).ok()?.checked_sub(1)?;
        let rte =
            PgList::<pg_sys::RangeTblEntry>::from_pg((*queries.get(level)?.cast_const()).rtable)
                .get_ptr(index)?;
        if (*rte).rtekind != pg_sys::RTEKind::RTE_RELATION {
            return None;
        }
        let relation = (*rte).relid;
        let (column, why) = identifies(relation, attnum)?;
        // As the query names it: its alias, else the relation's name.
        let eref = (*rte).eref;
        let qualifier = if eref.is_null() || (*eref).aliasname.is_null() {
            c_string(pg_sys::get_rel_name(relation))
        } else {
            c_string((*eref).aliasname)
        };
        let verb = if name == "sum" { "adds up" } else { "averages" };
        Some(format!(
            "{}({qualifier}.{column}) {verb} identifiers ({why}): a sum or an average of \
             identifiers means nothing; count the rows, or use the column that holds the \
             quantity asked for",
            name.to_uppercase(),
        ))
    }
}

/// The name of column `attnum` of `relation`, and why it identifies rows: it is named `id` or
/// `..._id`, or it is a column of a foreign key and named `...id`.
///
/// # Safety
/// `relation` is a relation the current transaction has locked (parse analysis did).
unsafe fn identifies(
    relation: pg_sys::Oid,
    attnum: pg_sys::AttrNumber,
) -> Option<(String, &'static str)> {
    // SAFETY: the caller's contract; the relation is closed by `OpenRelation` on every path,
    // also when an ERROR unwinds, and its foreign key list is only read, with no catalog
    // access while it is held.
    unsafe {
        let column = pg_sys::get_attname(relation, attnum, true);
        if column.is_null() {
            return None;
        }
        let column = c_string(column);
        let folded = column.to_lowercase();
        if folded == "id" || folded.ends_with("_id") {
            return Some((column, "its name says it identifies rows"));
        }
        if !folded.ends_with("id") {
            return None;
        }
        let rel = OpenRelation::open(relation, pg_sys::NoLock);
        let foreign =
            PgList::<pg_sys::ForeignKeyCacheInfo>::from_pg(pg_sys::RelationGetFKeyList(rel.0))
                .iter_ptr()
                .any(|key| {
                    let n = usize::try_from((*key).nkeys).unwrap_or(0);
                    (*key).conkey.iter().take(n).any(|&k| k == attnum)
                });
        foreign.then_some((column, "a foreign key column"))
    }
}
