//! What a query names, read from the raw parse tree for repairs: the relations with their
//! aliases, the qualified column references with where they are written, and the equalities
//! between two columns. The raw parse runs no code.

use std::ffi::{c_void, CString};

use pgrx::pg_sys;
use pgrx::PgList;

use super::walk::too_deep;
use crate::names::c_string;
use crate::subxact;

/// A relation a query names, with the alias it gives it there.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RelationRef {
    /// As the parser folded it.
    pub name: String,
    /// The schema it is qualified with, when it is (as the parser folded it).
    pub schema: Option<String>,
    pub alias: Option<String>,
    /// The byte offset its (maybe schema-qualified) name starts at, where first named.
    pub at: Option<usize>,
}

impl RelationRef {
    /// The name a query refers to it by: its alias, else its name.
    pub fn qualifier(&self) -> &str {
        self.alias.as_deref().unwrap_or(&self.name)
    }
}

/// A column reference `qualifier.column` and the byte offset its qualifier starts at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnRef {
    /// As the parser folded them.
    pub qualifier: String,
    pub column: String,
    pub at: usize,
    /// The SELECT it is written in (an index into `References::selects`).
    pub select: Option<usize>,
}

/// The names a query uses, as `references` reads them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct References {
    pub relations: Vec<RelationRef>,
    /// Qualified references to a column (`t.c`; not `c`, `s.t.c` or `t.*`).
    pub columns: Vec<ColumnRef>,
    /// `a.x = b.y`: the join conditions (and other equalities) between two columns.
    pub equalities: Vec<[ColumnRef; 2]>,
    /// Each SELECT of the query, outermost first.
    pub selects: Vec<Select>,
    /// The names of its common table expressions, wherever they are.
    pub ctes: Vec<String>,
}

/// One SELECT of a query: what its own FROM clause and its unqualified column references are,
/// so that a relation joined into it is known not to change what another name there means.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Select {
    /// The SELECT it is inside of, when it is (an index into `References::selects`).
    pub parent: Option<usize>,
    /// The relations of its FROM clause, through joins.
    pub relations: Vec<RelationRef>,
    /// Its FROM clause holds something else too (a subquery, a function, a common table
    /// expression, an aliased join), whose columns the schema does not know.
    pub opaque: bool,
    /// Its unqualified column references (not those of the SELECTs inside it): the name
    /// (`None` for `*`) and the byte offset.
    pub bare: Vec<(Option<String>, usize)>,
    /// Its GROUP BY list, when it has one of plain expressions (no grouping sets).
    pub group_by: Option<GroupBy>,
    /// Columns equal in every row it reads, or both NULL where an outer join adds a row
    /// without a partner: `a = b` conjuncts of its WHERE clause and of the ON clauses of its
    /// inner joins, wherever they are (not of outer joins, not under OR or NOT).
    pub equated: Vec<[Named; 2]>,
}

/// A column as written: its qualifier, when it has one, and its name, as the parser folds
/// them.
pub type Named = (Option<String>, String);

/// A GROUP BY list of plain expressions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupBy {
    /// The byte offset its first item starts at.
    pub at: usize,
    /// The items that are a column (`c` or `q.c`).
    pub columns: Vec<Named>,
}

impl References {
    /// The SELECT that holds the unqualified column reference, or whose FROM clause names the
    /// relation, written at byte `at`: its index into `selects`.
    pub fn select_at(&self, at: usize) -> Option<usize> {
        self.selects.iter().position(|s| {
            s.bare.iter().any(|&(_, b)| b == at) || s.relations.iter().any(|r| r.at == Some(at))
        })
    }

    /// The SELECT whose FROM clause gives `column` its qualifier: the nearest one out from the
    /// column's own whose relations are named or aliased so. `None` when a FROM clause on the
    /// way holds what the schema does not know (its names are not all known).
    pub fn qualifier_select(&self, column: &ColumnRef) -> Option<usize> {
        self.binding(column.select?, &column.qualifier)
    }

    /// The SELECT whose FROM clause `qualifier`, written in SELECT `from`, stands for (as
    /// `qualifier_select`).
    pub fn binding(&self, from: usize, qualifier: &str) -> Option<usize> {
        let mut at = from;
        // Each step goes one SELECT out; there are no more steps than SELECTs.
        for _ in 0..self.selects.len() {
            let select = self.selects.get(at)?;
            if select.relations.iter().any(|r| r.qualifier() == qualifier) {
                return Some(at);
            }
            if select.opaque {
                return None;
            }
            at = select.parent?;
        }
        None
    }

    /// The relation `column`'s qualifier stands for where it is written, and its SELECT.
    pub fn relation_of(&self, column: &ColumnRef) -> Option<(usize, &RelationRef)> {
        let at = self.qualifier_select(column)?;
        let relation = self
            .selects
            .get(at)?
            .relations
            .iter()
            .find(|r| r.qualifier() == column.qualifier)?;
        Some((at, relation))
    }
}

/// Names a query may use for its references to be read: the repair hints built from them
/// compare names pairwise and chain them, so a query of more (a model may write thousands)
/// gets none, rather than a backend busy for minutes.
const MAX_RELATIONS: usize = 64;
const MAX_SELECTS: usize = 64;
const MAX_COLUMN_REFS: usize = 1024;
const MAX_EQUALITIES: usize = 256;

impl References {
    /// Whether more was found than hints are built from.
    fn too_many(&self) -> bool {
        self.relations.len() > MAX_RELATIONS
            || self.selects.len() > MAX_SELECTS
            || self.columns.len() > MAX_COLUMN_REFS
            || self.equalities.len() > MAX_EQUALITIES
            || self.selects.iter().any(|s| {
                s.relations.len() > MAX_RELATIONS
                    || s.bare.len() > MAX_COLUMN_REFS
                    || s.equated.len() > MAX_EQUALITIES
            })
    }
}

/// The walk's state: what was found, and where the walk is.
struct Collecting {
    found: References,
    /// The SELECTs the walk is in (indexes into `found.selects`), innermost last.
    within: Vec<usize>,
    /// The names of the common table expressions in reach.
    ctes: Vec<String>,
}

/// The names `sql` uses; empty when it does not parse, or uses more than hints are built from
/// (`MAX_RELATIONS`, ...).
pub fn references(sql: &str) -> References {
    let Ok(text) = CString::new(sql) else {
        return References::default();
    };
    subxact::in_subtransaction(false, || {
        let mut collecting = Collecting {
            found: References::default(),
            within: Vec::new(),
            ctes: Vec::new(),
        };
        // What the lexer says of the names (an identifier cut to 63 bytes, printed whole in a
        // NOTICE) is not the caller's to see: the text is most often the model's.
        let _quiet = subxact::QuietClient::new();
        // SAFETY: the grammar, then our walker over its raw tree; `collecting` outlives the
        // walk.
        unsafe {
            let statements = PgList::<pg_sys::RawStmt>::from_pg(pg_sys::raw_parser(
                text.as_ptr(),
                pg_sys::RawParseMode::RAW_PARSE_DEFAULT,
            ));
            for raw in statements.iter_ptr() {
                // The statement itself first (PostgreSQL's walker visits only a node's children,
                // and the statement is a SELECT too): as a one-element list, through
                // PostgreSQL's walker, never by calling the walker directly, so that an ERROR
                // deep in the walk comes back through pgrx's FFI boundary (see `walk::check`).
                let list = pg_sys::lappend(std::ptr::null_mut(), (*raw).stmt.cast());
                pg_sys::raw_expression_tree_walker(
                    list.cast(),
                    Some(collector),
                    (&mut collecting as *mut Collecting).cast::<c_void>(),
                );
            }
        }
        if collecting.found.too_many() {
            return References::default();
        }
        collecting.found
    })
    .unwrap_or_default()
}

/// The qualifier and column of a raw `ColumnRef` of exactly two names, and its offset.
///
/// # Safety
/// `node` is a raw parse node.
unsafe fn qualified_column(node: *mut pg_sys::Node) -> Option<ColumnRef> {
    // SAFETY: the caller's contract; list cells of a ColumnRef are String or A_Star nodes.
    unsafe {
        if node.is_null() || (*node).type_ != pg_sys::NodeTag::T_ColumnRef {
            return None;
        }
        let column_ref = node.cast::<pg_sys::ColumnRef>();
        let fields = PgList::<pg_sys::Node>::from_pg((*column_ref).fields);
        let mut names = Vec::new();
        for field in fields.iter_ptr() {
            if field.is_null() || (*field).type_ != pg_sys::NodeTag::T_String {
                return None;
            }
            names.push(c_string((*field.cast::<pg_sys::String>()).sval));
        }
        let at = usize::try_from((*column_ref).location).ok()?;
        match <[String; 2]>::try_from(names) {
            Ok([qualifier, column]) => Some(ColumnRef {
                qualifier,
                column,
                at,
                select: None,
            }),
            Err(_) => None,
        }
    }
}

/// The relations of a raw FROM list, through joins, and whether it holds anything else (a
/// subquery, a function, a common table expression in reach, an aliased join).
///
/// # Safety
/// `items` is a raw parse tree's FROM list.
unsafe fn from_relations(items: *mut pg_sys::List, ctes: &[String]) -> (Vec<RelationRef>, bool) {
    /// Adds the relations of one FROM item, at most `depth` joins deep; `false` when it holds
    /// anything else.
    ///
    /// # Safety
    /// `node` is a raw FROM item.
    unsafe fn add(
        node: *mut pg_sys::Node,
        ctes: &[String],
        depth: usize,
        out: &mut Vec<RelationRef>,
    ) -> bool {
        // SAFETY: the caller's contract: RangeVar and JoinExpr nodes of a raw FROM clause.
        unsafe {
            if node.is_null() || depth == 0 {
                return false;
            }
            match (*node).type_ {
                pg_sys::NodeTag::T_RangeVar => {
                    let range_var = node.cast::<pg_sys::RangeVar>();
                    let relation = relation(range_var);
                    let cte = (*range_var).schemaname.is_null() && ctes.contains(&relation.name);
                    // `t AS x(a, b)` renames its columns: the schema's names are not its.
                    let alias = (*range_var).alias;
                    let renamed = !alias.is_null() && !(*alias).colnames.is_null();
                    if !cte && !renamed {
                        out.push(relation);
                    }
                    !cte && !renamed
                }
                pg_sys::NodeTag::T_JoinExpr => {
                    // The names inside an aliased join are hidden behind its alias.
                    let join = node.cast::<pg_sys::JoinExpr>();
                    if !(*join).alias.is_null() {
                        return false;
                    }
                    let left = add((*join).larg, ctes, depth - 1, out);
                    let right = add((*join).rarg, ctes, depth - 1, out);
                    left && right
                }
                _ => false,
            }
        }
    }
    let mut out = Vec::new();
    let mut only_relations = true;
    // SAFETY: the caller's contract; a FROM list holds raw FROM items.
    unsafe {
        for item in PgList::<pg_sys::Node>::from_pg(items).iter_ptr() {
            only_relations &= add(item, ctes, MAX_JOINS, &mut out);
        }
    }
    (out, !only_relations)
}

/// Joins nested deeper than this in one FROM item are not followed.
const MAX_JOINS: usize = 64;

/// A raw `RangeVar` as a `RelationRef`.
///
/// # Safety
/// `range_var` is a raw parse tree's RangeVar.
unsafe fn relation(range_var: *mut pg_sys::RangeVar) -> RelationRef {
    // SAFETY: the caller's contract.
    unsafe {
        let alias = (*range_var).alias;
        let schema = (*range_var).schemaname;
        RelationRef {
            name: c_string((*range_var).relname),
            schema: (!schema.is_null()).then(|| c_string(schema)),
            alias: (!alias.is_null())
                .then(|| c_string((*alias).aliasname))
                .filter(|a| !a.is_empty()),
            at: usize::try_from((*range_var).location).ok(),
        }
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn collector(node: *mut pg_sys::Node, context: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    if too_deep().is_some() {
        return true;
    }
    pgrx::check_for_interrupts!();
    // SAFETY: PostgreSQL's raw walker (or `references`) passes raw parse nodes and our context.
    unsafe {
        let collecting = &mut *context.cast::<Collecting>();
        // Each node adds a bounded share (one FROM list, one WHERE clause): once past the
        // bounds, the walk stops and nothing is read.
        if collecting.found.too_many() {
            return true;
        }
        match (*node).type_ {
            pg_sys::NodeTag::T_SelectStmt => {
                let select = node.cast::<pg_sys::SelectStmt>();
                let reach = collecting.ctes.len();
                let with = (*select).withClause;
                if !with.is_null() {
                    for cte in PgList::<pg_sys::Node>::from_pg((*with).ctes).iter_ptr() {
                        if !cte.is_null() && (*cte).type_ == pg_sys::NodeTag::T_CommonTableExpr {
                            let name = c_string((*cte.cast::<pg_sys::CommonTableExpr>()).ctename);
                            if !collecting.found.ctes.contains(&name) {
                                collecting.found.ctes.push(name.clone());
                            }
                            collecting.ctes.push(name);
                        }
                    }
                }
                let (relations, opaque) = from_relations((*select).fromClause, &collecting.ctes);
                let mut equated = Vec::new();
                conjunct_equalities((*select).whereClause, MAX_JOINS, &mut equated);
                for item in PgList::<pg_sys::Node>::from_pg((*select).fromClause).iter_ptr() {
                    inner_join_equalities(item, MAX_JOINS, &mut equated);
                }
                let parent = collecting.within.last().copied();
                collecting.within.push(collecting.found.selects.len());
                collecting.found.selects.push(Select {
                    parent,
                    relations,
                    opaque,
                    bare: Vec::new(),
                    group_by: group_by((*select).groupClause),
                    equated,
                });
                let stop = pg_sys::raw_expression_tree_walker(node, Some(collector), context);
                let collecting = &mut *context.cast::<Collecting>();
                collecting.within.pop();
                collecting.ctes.truncate(reach);
                return stop;
            }
            pg_sys::NodeTag::T_RangeVar => {
                let relation = relation(node.cast());
                let named = |r: &RelationRef| r.name == relation.name && r.alias == relation.alias;
                if !relation.name.is_empty() && !collecting.found.relations.iter().any(named) {
                    collecting.found.relations.push(relation);
                }
            }
            pg_sys::NodeTag::T_ColumnRef => {
                if let Some(column) = qualified_column(node) {
                    let select = collecting.within.last().copied();
                    collecting
                        .found
                        .columns
                        .push(ColumnRef { select, ..column });
                } else if let (Some(bare), Some(&within)) =
                    (bare_column(node), collecting.within.last())
                {
                    if let Some(select) = collecting.found.selects.get_mut(within) {
                        select.bare.push(bare);
                    }
                }
            }
            pg_sys::NodeTag::T_A_Expr => {
                let expr = node.cast::<pg_sys::A_Expr>();
                if is_equality(expr) {
                    if let (Some(l), Some(r)) = (
                        qualified_column((*expr).lexpr),
                        qualified_column((*expr).rexpr),
                    ) {
                        let select = collecting.within.last().copied();
                        collecting
                            .found
                            .equalities
                            .push([ColumnRef { select, ..l }, ColumnRef { select, ..r }]);
                    }
                }
            }
            _ => {}
        }
        pg_sys::raw_expression_tree_walker(node, Some(collector), context)
    }
}

/// Whether a raw `A_Expr` is `a = b`.
///
/// # Safety
/// `expr` is a raw `A_Expr`.
unsafe fn is_equality(expr: *mut pg_sys::A_Expr) -> bool {
    // SAFETY: the caller's contract; an operator name is a list of String nodes.
    unsafe {
        let operator = PgList::<pg_sys::Node>::from_pg((*expr).name);
        (*expr).kind == pg_sys::A_Expr_Kind::AEXPR_OP
            && operator.len() == 1
            && operator.get_ptr(0).is_some_and(|name| {
                (*name).type_ == pg_sys::NodeTag::T_String
                    && c_string((*name.cast::<pg_sys::String>()).sval) == "="
            })
    }
}

/// A raw expression that is a column, `c` or `q.c`, as written.
///
/// # Safety
/// `node` is a raw parse node (or null).
unsafe fn named(node: *mut pg_sys::Node) -> Option<Named> {
    // SAFETY: the caller's contract; both readers check the node is a ColumnRef.
    unsafe {
        if let Some(column) = qualified_column(node) {
            return Some((Some(column.qualifier), column.column));
        }
        if node.is_null() || (*node).type_ != pg_sys::NodeTag::T_ColumnRef {
            return None;
        }
        match bare_column(node)? {
            (Some(name), _) => Some((None, name)),
            (None, _) => None,
        }
    }
}

/// Adds the `a = b` between two columns that `node` asserts for every row: `node` itself, or
/// any conjunct of it, through ANDs at most `depth` deep.
///
/// # Safety
/// `node` is a raw expression (or null).
unsafe fn conjunct_equalities(node: *mut pg_sys::Node, depth: usize, out: &mut Vec<[Named; 2]>) {
    // SAFETY: the caller's contract; a BoolExpr's args are raw expressions.
    unsafe {
        if node.is_null() || depth == 0 {
            return;
        }
        match (*node).type_ {
            pg_sys::NodeTag::T_BoolExpr => {
                let and = node.cast::<pg_sys::BoolExpr>();
                if (*and).boolop == pg_sys::BoolExprType::AND_EXPR {
                    for arg in PgList::<pg_sys::Node>::from_pg((*and).args).iter_ptr() {
                        conjunct_equalities(arg, depth - 1, out);
                    }
                }
            }
            pg_sys::NodeTag::T_A_Expr if is_equality(node.cast()) => {
                let expr = node.cast::<pg_sys::A_Expr>();
                if let (Some(l), Some(r)) = (named((*expr).lexpr), named((*expr).rexpr)) {
                    out.push([l, r]);
                }
            }
            _ => {}
        }
    }
}

/// Adds the equalities of the ON clauses of a FROM item's inner joins, `depth` joins deep.
/// Not an outer join's: a row without a partner does not meet it. An inner join's holds
/// under an outer join too: both sides are NULL in a row that join adds without a partner.
/// Not inside an aliased join, whose names are not the SELECT's.
///
/// # Safety
/// `node` is a raw FROM item (or null).
unsafe fn inner_join_equalities(node: *mut pg_sys::Node, depth: usize, out: &mut Vec<[Named; 2]>) {
    // SAFETY: the caller's contract; a JoinExpr's arguments are raw FROM items.
    unsafe {
        if node.is_null() || depth == 0 || (*node).type_ != pg_sys::NodeTag::T_JoinExpr {
            return;
        }
        let join = node.cast::<pg_sys::JoinExpr>();
        if !(*join).alias.is_null() {
            return;
        }
        if (*join).jointype == pg_sys::JoinType::JOIN_INNER {
            conjunct_equalities((*join).quals, MAX_JOINS, out);
        }
        inner_join_equalities((*join).larg, depth - 1, out);
        inner_join_equalities((*join).rarg, depth - 1, out);
    }
}

/// A raw GROUP BY list of plain expressions: where it starts and the columns it names.
/// `None` when there is none, or it has grouping sets (`ROLLUP`, `CUBE`, `GROUPING SETS`,
/// `()`).
///
/// # Safety
/// `items` is a raw SELECT's `groupClause`.
unsafe fn group_by(items: *mut pg_sys::List) -> Option<GroupBy> {
    // SAFETY: the caller's contract; the items are raw expressions.
    unsafe {
        let items = PgList::<pg_sys::Node>::from_pg(items);
        let first = items.get_ptr(0)?;
        let mut columns = Vec::new();
        for item in items.iter_ptr() {
            if item.is_null() || (*item).type_ == pg_sys::NodeTag::T_GroupingSet {
                return None;
            }
            columns.extend(named(item));
        }
        Some(GroupBy {
            at: usize::try_from(pg_sys::exprLocation(first)).ok()?,
            columns,
        })
    }
}

/// The name (`None` for `*`) and offset of a raw `ColumnRef` of one field.
///
/// # Safety
/// `node` is a raw `ColumnRef`.
unsafe fn bare_column(node: *mut pg_sys::Node) -> Option<(Option<String>, usize)> {
    // SAFETY: the caller's contract; list cells of a ColumnRef are String or A_Star nodes.
    unsafe {
        let column_ref = node.cast::<pg_sys::ColumnRef>();
        let fields = PgList::<pg_sys::Node>::from_pg((*column_ref).fields);
        let at = usize::try_from((*column_ref).location).ok()?;
        match (fields.len(), fields.get_ptr(0)) {
            (1, Some(field)) if !field.is_null() => match (*field).type_ {
                pg_sys::NodeTag::T_String => {
                    Some((Some(c_string((*field.cast::<pg_sys::String>()).sval)), at))
                }
                pg_sys::NodeTag::T_A_Star => Some((None, at)),
                _ => None,
            },
            _ => None,
        }
    }
}
