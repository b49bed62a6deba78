//! Bounds on the work parse analysis will do, counted on the raw tree before it runs: analysis
//! checks for no interrupt, so a statement that makes it work for minutes (a model's answer,
//! an example another role wrote into the table) would keep the caller's backend deaf to
//! cancel, the statement timeout and `pg_terminate_backend` for as long. Its superlinear parts
//! are bounded here:
//! - each GROUP BY, ORDER BY, DISTINCT ON, PARTITION BY and aggregate ORDER BY item is found in
//!   its query's target list by comparing it with every entry (the ones not found are added),
//!   and a table function's columns are each compared with the others (`matched`);
//! - stars are expanded into every column they stand for before any length is checked, and
//!   DISTINCT compares every entry with the others (`width`);
//! - each column reference is looked up in every FROM item in scope, column by column
//!   (`scope`);
//! - a NATURAL join compares every column of one side with every column of the other
//!   (`natural`).

use pgrx::{pg_sys, PgList};

use super::{Refusal, MAX_CLAUSE_ITEMS};
use crate::error::SqlState;

/// Items matched against a target list (or against a table function's other columns), at
/// most, in a whole statement.
const MAX_MATCHED_ITEMS: usize = 4096;
/// Entries of select lists, at most, in a whole statement, a star counted as `MAX_CLAUSE_ITEMS`
/// for each FROM item it may stand for: sixteen rows' worth.
const MAX_SELECT_WIDTH: usize = 16 * MAX_CLAUSE_ITEMS;
/// Column references times the FROM items in scope of each, at most, in a whole statement
/// (each such pair costs up to a row's worth of name comparisons).
const MAX_SCOPE: usize = 200_000;
/// Pairs of FROM items a NATURAL join compares, at most, in a whole statement.
const MAX_NATURAL_PAIRS: usize = 64;

/// What the raw walk has counted so far.
#[derive(Default)]
pub struct Bounds {
    matched: usize,
    width: usize,
    scope: usize,
    natural: usize,
    /// The FROM items of each SELECT the walk is inside, outermost first.
    levels: Vec<usize>,
}

impl Bounds {
    /// Counts what `node` itself adds (its nested nodes are counted when the walk reaches
    /// them).
    ///
    /// # Safety
    /// `node` is a raw parse node.
    pub unsafe fn count(&mut self, node: *mut pg_sys::Node) {
        // SAFETY: the caller's contract.
        unsafe {
            self.matched = self.matched.saturating_add(matched_items(node));
            match (*node).type_ {
                pg_sys::NodeTag::T_SelectStmt => {
                    let select = node.cast::<pg_sys::SelectStmt>();
                    let from = (*select).fromClause;
                    self.width = self.width.saturating_add(select_width(select, from));
                    self.natural = self.natural.saturating_add(natural_pairs(from));
                }
                pg_sys::NodeTag::T_ColumnRef => {
                    let visible: usize = self.levels.iter().sum();
                    self.scope = self.scope.saturating_add(visible.max(1));
                }
                _ => {}
            }
        }
    }

    /// The walk goes into `select`: its FROM items are in scope below it.
    ///
    /// # Safety
    /// `select` is a raw SelectStmt.
    pub unsafe fn enter(&mut self, select: *mut pg_sys::SelectStmt) {
        // SAFETY: the caller's contract.
        let items = unsafe { from_items((*select).fromClause) };
        self.levels.push(items);
    }

    /// The walk leaves the SELECT it entered last.
    pub fn leave(&mut self) {
        self.levels.pop();
    }

    /// The bound passed, if one is.
    pub fn refusal(&self) -> Option<Refusal> {
        let too = |what: String| Some(Refusal::read(SqlState::STATEMENT_TOO_COMPLEX, what));
        if self.matched > MAX_MATCHED_ITEMS {
            return too(format!(
                "more than {MAX_MATCHED_ITEMS} items of select lists, GROUP BY, ORDER BY, \
                 DISTINCT, PARTITION BY, aggregates' ORDER BY and table functions' COLUMNS \
                 together are not allowed"
            ));
        }
        if self.width > MAX_SELECT_WIDTH {
            return too(format!(
                "select lists of more than {MAX_SELECT_WIDTH} entries together, each * counted \
                 as {MAX_CLAUSE_ITEMS} (as wide as a row may be) for each FROM item it may \
                 stand for, are not allowed"
            ));
        }
        if self.scope > MAX_SCOPE {
            return too(format!(
                "more than {MAX_SCOPE} column references times the FROM items in their scope, \
                 together, are not allowed"
            ));
        }
        if self.natural > MAX_NATURAL_PAIRS {
            return too(format!(
                "NATURAL joins of more than {MAX_NATURAL_PAIRS} pairs of FROM items together \
                 are not allowed"
            ));
        }
        None
    }
}

/// The length of a raw list, or 0.
///
/// # Safety
/// `list` is a list of the raw tree, or null.
unsafe fn length(list: *mut pg_sys::List) -> usize {
    // SAFETY: the caller's contract.
    unsafe { list.as_ref().map_or(0, |l| l.length as usize) }
}

/// The items of `node`'s own lists that analysis matches against a target list, or a table
/// function's column.
///
/// # Safety
/// `node` is a raw parse node.
unsafe fn matched_items(node: *mut pg_sys::Node) -> usize {
    // SAFETY: the caller's contract; the tag says which struct it is.
    unsafe {
        match (*node).type_ {
            pg_sys::NodeTag::T_SelectStmt => {
                let select = node.cast::<pg_sys::SelectStmt>();
                length((*select).targetList)
                    + length((*select).groupClause)
                    + length((*select).sortClause)
                    + length((*select).distinctClause)
            }
            pg_sys::NodeTag::T_WindowDef => {
                let window = node.cast::<pg_sys::WindowDef>();
                length((*window).partitionClause) + length((*window).orderClause)
            }
            pg_sys::NodeTag::T_FuncCall => length((*node.cast::<pg_sys::FuncCall>()).agg_order),
            // A row in a grouping set, `GROUPING SETS ((a, b))`, is a list of its items.
            pg_sys::NodeTag::T_GroupingSet => {
                PgList::<pg_sys::Node>::from_pg((*node.cast::<pg_sys::GroupingSet>()).content)
                    .iter_ptr()
                    .map(|item| match item.as_ref() {
                        Some(n) if n.type_ == pg_sys::NodeTag::T_RowExpr => {
                            length((*item.cast::<pg_sys::RowExpr>()).args)
                        }
                        _ => 1,
                    })
                    .sum()
            }
            // XMLTABLE's columns (each name compared with the others').
            pg_sys::NodeTag::T_RangeTableFuncCol => 1,
            _ => crate::compat::aggregate_order(node).map_or_else(
                || usize::from(crate::compat::json_table_column(node)),
                |order| length(order),
            ),
        }
    }
}

/// The FROM items of a FROM list, a join's counted by its sides.
///
/// # Safety
/// `from` is a raw FROM list, or null.
unsafe fn from_items(from: *mut pg_sys::List) -> usize {
    // SAFETY: the caller's contract.
    unsafe {
        PgList::<pg_sys::Node>::from_pg(from)
            .iter_ptr()
            .map(|item| items_of(item))
            .sum()
    }
}

/// The FROM items `item` stands for: a join's sides, anything else one.
///
/// # Safety
/// `item` is a raw FROM item, or null.
unsafe fn items_of(item: *mut pg_sys::Node) -> usize {
    // SAFETY: the caller's contract; the tag says which struct it is. A join's depth is the
    // parser's (bounded by the stack depth check the raw walk makes first).
    unsafe {
        match item.as_ref().map(|n| n.type_) {
            Some(pg_sys::NodeTag::T_JoinExpr) => {
                let join = item.cast::<pg_sys::JoinExpr>();
                items_of((*join).larg).saturating_add(items_of((*join).rarg))
            }
            _ => 1,
        }
    }
}

/// The pairs of FROM items the NATURAL joins of a FROM list compare.
///
/// # Safety
/// `from` is a raw FROM list, or null.
unsafe fn natural_pairs(from: *mut pg_sys::List) -> usize {
    /// The pairs of `item`'s NATURAL joins.
    ///
    /// # Safety
    /// `item` is a raw FROM item, or null.
    unsafe fn pairs(item: *mut pg_sys::Node) -> usize {
        // SAFETY: the caller's contract; the tag says which struct it is.
        unsafe {
            match item.as_ref().map(|n| n.type_) {
                Some(pg_sys::NodeTag::T_JoinExpr) => {
                    let join = item.cast::<pg_sys::JoinExpr>();
                    let own = if (*join).isNatural {
                        items_of((*join).larg).saturating_mul(items_of((*join).rarg))
                    } else {
                        0
                    };
                    own.saturating_add(pairs((*join).larg))
                        .saturating_add(pairs((*join).rarg))
                }
                _ => 0,
            }
        }
    }
    // SAFETY: the caller's contract.
    unsafe {
        PgList::<pg_sys::Node>::from_pg(from)
            .iter_ptr()
            .map(|item| pairs(item))
            .sum()
    }
}

/// The entries `select`'s list may have once its stars are expanded: `MAX_CLAUSE_ITEMS` for
/// each FROM item a star may stand for (`*` all of them, `t.*` one, or a join's when the FROM
/// list has an aliased join; `(r).*` one row), one for anything else.
///
/// # Safety
/// `select` is a raw SelectStmt and `from` its FROM list.
unsafe fn select_width(select: *mut pg_sys::SelectStmt, from: *mut pg_sys::List) -> usize {
    // SAFETY: the caller's contract; each node is cast to the struct its tag names.
    unsafe {
        let all = from_items(from).max(1);
        let aliased_join = PgList::<pg_sys::Node>::from_pg(from)
            .iter_ptr()
            .any(|item| has_aliased_join(item));
        let star_of = |list: *mut pg_sys::List| -> Option<usize> {
            let list = PgList::<pg_sys::Node>::from_pg(list);
            let last = list.iter_ptr().last()?;
            (last.as_ref()?.type_ == pg_sys::NodeTag::T_A_Star).then_some(list.len())
        };
        PgList::<pg_sys::ResTarget>::from_pg((*select).targetList)
            .iter_ptr()
            .map(|target| {
                let value = target.as_ref().map_or(std::ptr::null_mut(), |t| t.val);
                let stands_for = match value.as_ref().map(|v| v.type_) {
                    Some(pg_sys::NodeTag::T_ColumnRef) => {
                        match star_of((*value.cast::<pg_sys::ColumnRef>()).fields) {
                            Some(1) => Some(all),
                            Some(_) if aliased_join => Some(all),
                            Some(_) => Some(1),
                            None => None,
                        }
                    }
                    Some(pg_sys::NodeTag::T_A_Indirection) => {
                        star_of((*value.cast::<pg_sys::A_Indirection>()).indirection).map(|_| 1)
                    }
                    _ => None,
                };
                stands_for.map_or(1, |items| items.saturating_mul(MAX_CLAUSE_ITEMS))
            })
            .fold(0, usize::saturating_add)
    }
}

/// Whether a FROM item is, or holds, a join with an alias (whose star stands for its sides).
///
/// # Safety
/// `item` is a raw FROM item, or null.
unsafe fn has_aliased_join(item: *mut pg_sys::Node) -> bool {
    // SAFETY: the caller's contract; the tag says which struct it is.
    unsafe {
        match item.as_ref().map(|n| n.type_) {
            Some(pg_sys::NodeTag::T_JoinExpr) => {
                let join = item.cast::<pg_sys::JoinExpr>();
                !(*join).alias.is_null()
                    || has_aliased_join((*join).larg)
                    || has_aliased_join((*join).rarg)
            }
            _ => false,
        }
    }
}
