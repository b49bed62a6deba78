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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationRef {
    /// As the parser folded it.
    pub name: String,
    pub alias: Option<String>,
    /// The byte offset its (maybe schema-qualified) name starts at, where first named.
    pub at: Option<usize>,
}

/// A column reference `qualifier.column` and the byte offset its qualifier starts at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnRef {
    /// As the parser folded them.
    pub qualifier: String,
    pub column: String,
    pub at: usize,
}

/// The names a query uses, as `references` reads them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct References {
    pub relations: Vec<RelationRef>,
    /// Qualified references to a column (`t.c`; not `c`, `s.t.c` or `t.*`).
    pub columns: Vec<ColumnRef>,
    /// `a.x = b.y`: the join conditions (and other equalities) between two columns.
    pub equalities: Vec<[ColumnRef; 2]>,
}

/// The names `sql` uses; empty when it does not parse.
pub fn references(sql: &str) -> References {
    let Ok(text) = CString::new(sql) else {
        return References::default();
    };
    subxact::in_subtransaction(false, || {
        let mut found = References::default();
        // SAFETY: the grammar and PostgreSQL's raw walker; `found` outlives the walk.
        unsafe {
            let statements = PgList::<pg_sys::RawStmt>::from_pg(pg_sys::raw_parser(
                text.as_ptr(),
                pg_sys::RawParseMode::RAW_PARSE_DEFAULT,
            ));
            for raw in statements.iter_ptr() {
                pg_sys::raw_expression_tree_walker(
                    (*raw).stmt,
                    Some(collector),
                    (&mut found as *mut References).cast(),
                );
            }
        }
        found
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
            }),
            Err(_) => None,
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
    // SAFETY: PostgreSQL's raw walker passes raw parse nodes and our context.
    unsafe {
        let found = &mut *context.cast::<References>();
        match (*node).type_ {
            pg_sys::NodeTag::T_RangeVar => {
                let range_var = node.cast::<pg_sys::RangeVar>();
                let alias = (*range_var).alias;
                let relation = RelationRef {
                    name: c_string((*range_var).relname),
                    alias: (!alias.is_null())
                        .then(|| c_string((*alias).aliasname))
                        .filter(|a| !a.is_empty()),
                    at: usize::try_from((*range_var).location).ok(),
                };
                let named = |r: &RelationRef| r.name == relation.name && r.alias == relation.alias;
                if !relation.name.is_empty() && !found.relations.iter().any(named) {
                    found.relations.push(relation);
                }
            }
            pg_sys::NodeTag::T_ColumnRef => {
                if let Some(column) = qualified_column(node) {
                    found.columns.push(column);
                }
            }
            pg_sys::NodeTag::T_A_Expr => {
                let expr = node.cast::<pg_sys::A_Expr>();
                let operator = PgList::<pg_sys::Node>::from_pg((*expr).name);
                let is_equal = (*expr).kind == pg_sys::A_Expr_Kind::AEXPR_OP
                    && operator.len() == 1
                    && operator.get_ptr(0).is_some_and(|name| {
                        (*name).type_ == pg_sys::NodeTag::T_String
                            && c_string((*name.cast::<pg_sys::String>()).sval) == "="
                    });
                if is_equal {
                    if let (Some(l), Some(r)) = (
                        qualified_column((*expr).lexpr),
                        qualified_column((*expr).rexpr),
                    ) {
                        found.equalities.push([l, r]);
                    }
                }
            }
            _ => {}
        }
        pg_sys::raw_expression_tree_walker(node, Some(collector), context)
    }
}
