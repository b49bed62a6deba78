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
//!   (`natural`);
//! - each join lists every column of both its sides again (`joins`);
//! - `(expr).*` copies `expr` once for each field (`copies`), and one inside another
//!   multiplies the copies: refused.

use pgrx::{pg_sys, PgList};

use super::verdict::Refusal;
use crate::error::SqlState;

/// Items of one clause of a query, at most (PostgreSQL's own bound on a row's columns), and
/// the columns a star counts for each FROM item it may stand for.
pub const MAX_CLAUSE_ITEMS: usize = 1664;

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
/// Columns the joins may list, both sides of each, together, at most (a row's worth per FROM
/// item): about 34 relations joined in a chain.
const MAX_JOIN_COLUMNS: usize = 1_000_000;
/// Nodes `(expr).*` may copy, together, at most (a row's worth of copies of each `expr`).
const MAX_COPIED_NODES: usize = 200_000;

/// What the raw walk has counted so far.
#[derive(Default)]
pub struct Bounds {
    matched: usize,
    width: usize,
    scope: usize,
    natural: usize,
    joins: usize,
    copies: usize,
    /// A row expansion inside another's expression.
    nested_expansion: bool,
    /// Of each SELECT the walk is inside, outermost first: its FROM items, and whether one of
    /// them is an aliased join (whose `alias.*` stands for all its sides).
    levels: Vec<(usize, bool)>,
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
                    // Stars are counted where the walk meets them, below.
                    self.width = self.width.saturating_add(length((*select).targetList));
                    self.natural = self
                        .natural
                        .saturating_add(natural_pairs((*select).fromClause));
                }
                // A join lists the columns of both its sides, whichever way the joins nest.
                pg_sys::NodeTag::T_JoinExpr => {
                    let both = items_of(node);
                    self.joins = self
                        .joins
                        .saturating_add(both.saturating_mul(MAX_CLAUSE_ITEMS));
                }
                pg_sys::NodeTag::T_ColumnRef => {
                    let visible: usize = self.levels.iter().map(|(items, _)| items).sum();
                    self.scope = self.scope.saturating_add(visible.max(1));
                    let fields =
                        PgList::<pg_sys::Node>::from_pg((*node.cast::<pg_sys::ColumnRef>()).fields);
                    if ends_in_star(&fields) {
                        // `*` stands for every FROM item of its SELECT, `t.*` for one, or for
                        // a join's sides when an aliased join in scope (at any level) may be
                        // `t`: then, as an upper bound, for every FROM item in scope.
                        let own = self.levels.last().map_or(1, |(items, _)| *items);
                        let aliased_join = self.levels.iter().any(|(_, aliased)| *aliased);
                        let items = if fields.len() == 1 {
                            own.max(1)
                        } else if aliased_join {
                            visible.max(1)
                        } else {
                            1
                        };
                        self.width = self
                            .width
                            .saturating_add(items.saturating_mul(MAX_CLAUSE_ITEMS));
                    }
                }
                pg_sys::NodeTag::T_A_Indirection => {
                    let indirection = node.cast::<pg_sys::A_Indirection>();
                    if ends_in_star(&PgList::from_pg((*indirection).indirection)) {
                        // What analysis copies for each field: the expression with its
                        // subscripts, where another star would multiply the copies.
                        let (nodes, stars) = size_of(node);
                        self.nested_expansion |= stars > 1;
                        self.copies = self
                            .copies
                            .saturating_add(nodes.saturating_mul(MAX_CLAUSE_ITEMS));
                        self.width = self.width.saturating_add(MAX_CLAUSE_ITEMS);
                    }
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
        let (items, aliased_join) = unsafe {
            let from = (*select).fromClause;
            let aliased_join = PgList::<pg_sys::Node>::from_pg(from)
                .iter_ptr()
                .any(|item| has_aliased_join(item));
            (from_items(from), aliased_join)
        };
        self.levels.push((items, aliased_join));
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
        if self.nested_expansion {
            return too(
                "a row expansion, (...).*, inside the expression of another is not allowed: \
                 each copies its expression once for each field"
                    .into(),
            );
        }
        if self.copies > MAX_COPIED_NODES {
            return too(format!(
                "row expansions, (...).*, that copy more than {MAX_COPIED_NODES} nodes of their \
                 expressions together (each once for each of up to {MAX_CLAUSE_ITEMS} fields) \
                 are not allowed"
            ));
        }
        if self.joins > MAX_JOIN_COLUMNS {
            return too(format!(
                "joins whose sides may have more than {MAX_JOIN_COLUMNS} columns together \
                 ({MAX_CLAUSE_ITEMS} for each FROM item of each join) are not allowed"
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

/// Walks the joins of a FROM item without recursion (a chain of joins is as deep as it is
/// long, and the parser builds one of any length cheaply): calls `each` on every JoinExpr
/// until it returns false, and returns the FROM items it reached (a join's sides, anything
/// else one).
///
/// # Safety
/// `item` is a raw FROM item, or null.
unsafe fn walk_joins(
    item: *mut pg_sys::Node,
    mut each: impl FnMut(*mut pg_sys::JoinExpr) -> bool,
) -> usize {
    let (mut items, mut pending) = (0usize, vec![item]);
    // SAFETY: the caller's contract; the tag says which struct it is.
    unsafe {
        while let Some(node) = pending.pop() {
            match node.as_ref().map(|n| n.type_) {
                Some(pg_sys::NodeTag::T_JoinExpr) => {
                    let join = node.cast::<pg_sys::JoinExpr>();
                    if !each(join) {
                        break;
                    }
                    pending.push((*join).larg);
                    pending.push((*join).rarg);
                }
                _ => items = items.saturating_add(1),
            }
        }
    }
    items
}

/// The FROM items `item` stands for: a join's sides, anything else one.
///
/// # Safety
/// `item` is a raw FROM item, or null.
unsafe fn items_of(item: *mut pg_sys::Node) -> usize {
    // SAFETY: the caller's contract.
    unsafe { walk_joins(item, |_| true) }
}

/// The pairs of FROM items the NATURAL joins of a FROM list compare, counted until they pass
/// `MAX_NATURAL_PAIRS`.
///
/// # Safety
/// `from` is a raw FROM list, or null.
unsafe fn natural_pairs(from: *mut pg_sys::List) -> usize {
    let mut pairs = 0usize;
    // SAFETY: the caller's contract; each join's sides are raw FROM items.
    unsafe {
        for item in PgList::<pg_sys::Node>::from_pg(from).iter_ptr() {
            walk_joins(item, |join| {
                if (*join).isNatural {
                    pairs = pairs.saturating_add(
                        items_of((*join).larg).saturating_mul(items_of((*join).rarg)),
                    );
                }
                pairs <= MAX_NATURAL_PAIRS
            });
            if pairs > MAX_NATURAL_PAIRS {
                break;
            }
        }
    }
    pairs
}

/// Whether a raw list of names or indirections ends in `*`.
///
/// # Safety
/// `list` is a list of the raw tree.
unsafe fn ends_in_star(list: &PgList<pg_sys::Node>) -> bool {
    // SAFETY: the caller's contract; the last element's tag is read.
    unsafe {
        list.iter_ptr()
            .last()
            .and_then(|n| n.as_ref())
            .is_some_and(|n| n.type_ == pg_sys::NodeTag::T_A_Star)
    }
}

/// The nodes of a raw expression, and the stars among them.
///
/// # Safety
/// `node` is a raw parse node, or null.
unsafe fn size_of(node: *mut pg_sys::Node) -> (usize, usize) {
    #[pgrx::pg_guard]
    unsafe extern "C-unwind" fn counter(
        node: *mut pg_sys::Node,
        context: *mut std::ffi::c_void,
    ) -> bool {
        // SAFETY: the raw walker passes raw nodes and our counts.
        unsafe {
            let Some(n) = node.as_ref() else {
                return false;
            };
            let counts = &mut *context.cast::<(usize, usize)>();
            counts.0 += 1;
            let star = match n.type_ {
                pg_sys::NodeTag::T_ColumnRef => {
                    ends_in_star(&PgList::from_pg((*node.cast::<pg_sys::ColumnRef>()).fields))
                }
                pg_sys::NodeTag::T_A_Indirection => ends_in_star(&PgList::from_pg(
                    (*node.cast::<pg_sys::A_Indirection>()).indirection,
                )),
                _ => false,
            };
            counts.1 += usize::from(star);
            // Bounded by the statement, which the caller's walk checks for depth first.
            pg_sys::raw_expression_tree_walker(node, Some(counter), context)
        }
    }
    let mut counts = (0usize, 0usize);
    // SAFETY: the caller's contract; `counts` outlives the walk.
    unsafe {
        counter(node, (&mut counts as *mut (usize, usize)).cast());
    }
    counts
}

/// Whether a FROM item is, or holds, a join with an alias (whose star stands for its sides).
///
/// # Safety
/// `item` is a raw FROM item, or null.
unsafe fn has_aliased_join(item: *mut pg_sys::Node) -> bool {
    let mut aliased = false;
    // SAFETY: the caller's contract.
    unsafe {
        walk_joins(item, |join| {
            aliased = !(*join).alias.is_null();
            !aliased
        });
    }
    aliased
}
