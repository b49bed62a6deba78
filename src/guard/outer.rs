//! A query that runs but cannot mean what it says: an `IN`, `ANY` or `ALL` subquery whose
//! select list is a column of the outer query. When none of the subquery's own relations has
//! the name, PostgreSQL resolves it outside (SQL's scoping), so `c.country IN (SELECT country
//! FROM orders)` compares each customer's country with itself: true for every customer as soon
//! as orders has a row, and `NOT IN` false for all of them. Small models write this when they
//! pick the wrong table for the subquery; nothing in the result shows it.
//!
//! Read from the analyzed tree the guard passed: nothing runs.

use std::ffi::c_void;

use pgrx::pg_sys;
use pgrx::PgList;

use super::walk::too_deep;
use crate::names::{c_string, printable};

/// The walk's state: the queries it is inside (outermost first), and what it found.
struct Scopes {
    queries: Vec<*mut pg_sys::Query>,
    found: Option<String>,
}

/// Why `query` compares with a column of an outer query where it means one of a subquery's
/// relations, in words for the model: the first such subquery, at any depth.
///
/// # Safety
/// `query` must be an analyzed Query of the current transaction.
pub unsafe fn outer_column_subquery(query: *mut pg_sys::Query) -> Option<String> {
    let mut scopes = Scopes {
        queries: vec![query],
        found: None,
    };
    // Through PostgreSQL's walker, not by calling `walker` (see `walk::check_tree`).
    // SAFETY: the caller's contract; `scopes` outlives the walk.
    unsafe {
        pg_sys::query_tree_walker(query, Some(walker), (&mut scopes as *mut Scopes).cast(), 0);
    }
    scopes.found
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn walker(node: *mut pg_sys::Node, context: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    if too_deep().is_some() {
        return true;
    }
    // SAFETY: PostgreSQL's walkers pass analyzed nodes and our `Scopes`; each node is cast to
    // the struct its tag names.
    unsafe {
        // `context` is reached again by the walks below: no reference to it is held across
        // them.
        let scopes = context.cast::<Scopes>();
        match (*node).type_ {
            pg_sys::NodeTag::T_Query => {
                let query = node.cast::<pg_sys::Query>();
                (*scopes).queries.push(query);
                let stop = pg_sys::query_tree_walker(query, Some(walker), context, 0);
                (*scopes).queries.pop();
                stop
            }
            pg_sys::NodeTag::T_SubLink => {
                if let Some(why) = outer_select_list(node.cast(), &(*scopes).queries) {
                    (*scopes).found = Some(why);
                    return true;
                }
                pg_sys::expression_tree_walker(node, Some(walker), context)
            }
            // An aggregate's DISTINCT or ORDER BY: operators, no expression (the guard's walk
            // reads them itself).
            pg_sys::NodeTag::T_SortGroupClause => false,
            _ => pg_sys::expression_tree_walker(node, Some(walker), context),
        }
    }
}

/// The account of `sublink` when it is an `IN`/`ANY`/`ALL` subquery with a FROM clause whose
/// select list is a bare column of an enclosing query (`outer`: outermost first, the one the
/// sublink is in last).
///
/// # Safety
/// `sublink` is a SubLink of the analyzed tree whose enclosing queries are `outer`.
unsafe fn outer_select_list(
    sublink: *mut pg_sys::SubLink,
    outer: &[*mut pg_sys::Query],
) -> Option<String> {
    // SAFETY: the caller's contract; every node is read as the struct its tag names.
    unsafe {
        if !matches!(
            (*sublink).subLinkType,
            pg_sys::SubLinkType::ANY_SUBLINK | pg_sys::SubLinkType::ALL_SUBLINK
        ) {
            return None;
        }
        let inner = (*sublink).subselect;
        if inner.is_null() || (*inner).type_ != pg_sys::NodeTag::T_Query {
            return None;
        }
        let inner = inner.cast::<pg_sys::Query>();
        if !(*inner).setOperations.is_null() {
            return None;
        }
        // The first select-list entry that is a bare column of an enclosing query.
        let (entry, var) = PgList::<pg_sys::TargetEntry>::from_pg((*inner).targetList)
            .iter_ptr()
            .filter(|&entry| !(*entry).resjunk)
            .map(|entry| (entry, (*entry).expr.cast::<pg_sys::Node>()))
            .filter(|&(_, expr)| !expr.is_null() && (*expr).type_ == pg_sys::NodeTag::T_Var)
            .map(|(entry, expr)| (entry, expr.cast::<pg_sys::Var>()))
            .find(|&(_, var)| (*var).varlevelsup > 0)?;
        let own: Vec<String> = PgList::<pg_sys::RangeTblEntry>::from_pg((*inner).rtable)
            .iter_ptr()
            .filter(|&rte| {
                (*rte).inFromCl
                    && matches!(
                        (*rte).rtekind,
                        pg_sys::RTEKind::RTE_RELATION
                            | pg_sys::RTEKind::RTE_SUBQUERY
                            | pg_sys::RTEKind::RTE_CTE
                    )
            })
            .filter_map(|rte| alias_of(rte))
            .collect();
        if own.is_empty() {
            return None;
        }
        let column = if (*entry).resname.is_null() {
            "?column?".to_string()
        } else {
            c_string((*entry).resname)
        };
        let up = usize::try_from((*var).varlevelsup).ok()?;
        let owner = outer
            .len()
            .checked_sub(up)
            .and_then(|level| outer.get(level))
            .and_then(|&query| {
                let index = usize::try_from((*var).varno).ok()?.checked_sub(1)?;
                PgList::<pg_sys::RangeTblEntry>::from_pg((*query).rtable).get_ptr(index)
            })
            .and_then(|rte| alias_of(rte));
        let outside = match owner {
            Some(owner) => format!("{owner}.{column}"),
            None => column,
        };
        Some(format!(
            "the subquery compared with IN, ANY or ALL selects {outside}, a column of the outer \
             query, not of {}: each row is compared with its own value, so the subquery filters \
             nothing",
            own.join(", ")
        ))
    }
}

/// The name a range table entry goes by in its query (its alias, else the relation's name).
///
/// # Safety
/// `rte` is a RangeTblEntry of the analyzed tree.
unsafe fn alias_of(rte: *mut pg_sys::RangeTblEntry) -> Option<String> {
    // SAFETY: the caller's contract; `eref` is set by parse analysis on every entry.
    unsafe {
        let eref = (*rte).eref;
        (!eref.is_null() && !(*eref).aliasname.is_null())
            .then(|| c_string((*eref).aliasname))
            .filter(|name| !name.is_empty() && printable(name))
    }
}
