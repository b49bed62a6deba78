//! What makes a query's rows doubtful though it ran: things a query can do that are most
//! likely mistakes, yet return numbers or rows, so no result shows them. Small models write
//! them when they pick the wrong column of the right table, or forget that integers divide
//! without a fraction.
//!
//! - An aggregate that adds up identifiers: `SUM(s.song_id)` where the question asked for the
//!   sum of `s.sales`. A sum or an average of an identifier (a column named `id` or `..._id`,
//!   or a foreign key column named `...id`) means nothing. A key that holds a value (`year`, a
//!   `rating` referencing a table of ratings) is not one: only the name tells identifiers apart.
//! - An equality of two keys that identify different things: `d.dept_id = s.faculty_id`, where
//!   `faculty_id` references faculty, not departments. Only keys the schema declares count
//!   (a foreign key, followed to the key it ends at; a primary key), and only between columns
//!   of different names, as a join where a foreign key is missing is written, or two tables'
//!   own keys both named `id`.
//! - A division of integers by something other than a constant, where a side holds an
//!   aggregate or a window function, also guarded or scaled (`COUNT(...) / COUNT(...)`,
//!   `x * 100 / NULLIF(COUNT(*), 0)`): the fraction is dropped, so a ratio, a share or an
//!   average comes out truncated. A constant divisor is how buckets and units are written.
//!
//! Read from the analyzed tree the guard passed: nothing runs.

use std::ffi::c_void;

use pgrx::pg_sys;
use pgrx::PgList;

use super::facts::builtin;
use super::keys::{self, Column};
use super::walk::too_deep;
use crate::compat;
use crate::names::{c_string, function_name, printable, quoted};

/// Doubts kept per query, at most (each is a line of a repair request).
const MAX_FOUND: usize = 3;

/// The walk's state: the queries it is inside (outermost first), and what it found.
struct Walk {
    queries: Vec<*mut pg_sys::Query>,
    found: Vec<String>,
    /// A division of integers was found (one is told, not each).
    divided: bool,
}

/// Why the rows of `query` are doubtful (see the module), one line each for the model, named
/// as the query names things: `SUM(t.song_id) adds up identifiers (...)`.
///
/// # Safety
/// `query` must be an analyzed Query of the current transaction, whose relations parse
/// analysis locked.
pub unsafe fn doubts(query: *mut pg_sys::Query) -> Vec<String> {
    let mut walk = Walk {
        queries: vec![query],
        found: Vec::new(),
        divided: false,
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
            pg_sys::NodeTag::T_Aggref | pg_sys::NodeTag::T_WindowFunc => {
                let queries = &(*context.cast::<Walk>()).queries;
                aggregate_call(node)
                    .and_then(|(function, _, args)| added_up(function, &args, queries))
            }
            pg_sys::NodeTag::T_OpExpr => {
                let op = node.cast::<pg_sys::OpExpr>();
                let args: Vec<*mut pg_sys::Node> = PgList::<pg_sys::Node>::from_pg((*op).args)
                    .iter_ptr()
                    .collect();
                // Built-in operators only: another's could mean anything.
                let name = builtin((*op).opno).then(|| c_string(pg_sys::get_opname((*op).opno)));
                let divided = (*context.cast::<Walk>()).divided;
                let queries = &(*context.cast::<Walk>()).queries;
                let (found, division) = match name.as_deref() {
                    Some("=") => (keys_unlike(&args, queries), false),
                    // One such line is enough: more would crowd out the other doubts.
                    Some("/") if !divided => (integers_divided(op, &args, queries), true),
                    _ => (None, false),
                };
                if division && found.is_some() {
                    (*context.cast::<Walk>()).divided = true;
                }
                found
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
        let name = function_name(function)?;
        if name != "sum" && name != "avg" {
            return None;
        }
        let (column, written) = column_of(*arg, queries)?;
        let (_, why) = keys::identifies(column.relation, column.attnum)?;
        let verb = if name == "sum" { "adds up" } else { "averages" };
        Some(format!(
            "{}({written}) {verb} identifiers ({why}): a sum or an average of \
             identifiers means nothing; count the rows, or use the column that holds the \
             quantity asked for",
            name.to_uppercase(),
        ))
    }
}

/// The account of `left = right` (`args` of a built-in `=`) when both are columns of keys that
/// identify different things; `queries`: the queries the comparison is inside, outermost first.
///
/// # Safety
/// `args` are nodes of the analyzed tree whose enclosing queries are `queries`.
unsafe fn keys_unlike(
    args: &[*mut pg_sys::Node],
    queries: &[*mut pg_sys::Query],
) -> Option<String> {
    let [left, right] = args else {
        return None;
    };
    // SAFETY: the caller's contract.
    unsafe {
        let (left, left_written) = column_of(*left, queries)?;
        let (right, right_written) = column_of(*right, queries)?;
        let left_name = keys::column_name(left)?;
        let right_name = keys::column_name(right)?;
        let left_key = keys::referent(left)?;
        let right_key = keys::referent(right)?;
        if left_key.key == right_key.key {
            return None;
        }
        // Like-named columns are how a join is written where a foreign key is missing, except
        // two tables' own keys both named `id`, which name nothing in common.
        let own_ids =
            !left_key.referenced && !right_key.referenced && left_name.eq_ignore_ascii_case("id");
        if left_name.eq_ignore_ascii_case(&right_name) && !own_ids {
            return None;
        }
        let what = |column: Column, referent: &keys::Referent| -> Option<String> {
            let column = keys::shown(column)?;
            Some(match (referent.referenced, &referent.shown) {
                (true, Some(key)) => format!("{column} references {key}"),
                (true, None) => {
                    format!("{column} references a key of a table the caller may not read")
                }
                (false, _) => format!("{column} is the key of its table"),
            })
        };
        let (left_what, right_what) = (what(left, &left_key)?, what(right, &right_key)?);
        Some(format!(
            "{left_written} = {right_written} compares keys of different things ({left_what}; \
             {right_what}): their values never identify the same rows; join a foreign key to \
             the key it references",
        ))
    }
}

/// The account of `left / right` (`args` of `op`, a built-in `/`) when it divides integers, the
/// divisor is no constant, and a side holds an aggregate or a window function (`COUNT(...) /
/// COUNT(*)`, `x * 100 / NULLIF(COUNT(*), 0)`): the fraction is dropped, so a ratio, a share
/// or an average comes out truncated, most often 0. A constant divisor (`COUNT(*) / 10`,
/// `SUM(cents) / 100`) is how buckets and units are written.
///
/// # Safety
/// `op` and `args` are nodes of the analyzed tree whose enclosing queries are `queries`.
unsafe fn integers_divided(
    op: *mut pg_sys::OpExpr,
    args: &[*mut pg_sys::Node],
    queries: &[*mut pg_sys::Query],
) -> Option<String> {
    let [left, right] = args else {
        return None;
    };
    // SAFETY: the caller's contract.
    unsafe {
        if !integer((*op).opresulttype) || constant(*right, 0) {
            return None;
        }
        let left_read = std::cell::Cell::new(MAX_READ);
        let search = Search {
            queries,
            depth: 0,
            left: &left_read,
        };
        let (left_call, right_call) = (aggregate_in(*left, &search), aggregate_in(*right, &search));
        if left_call.is_none() && right_call.is_none() {
            return None;
        }
        let side = |call: Option<(String, bool)>, node: *mut pg_sys::Node| match call {
            Some((call, true)) => call,
            Some((call, false)) => format!("an expression of {call}"),
            None => named_column(node, queries).unwrap_or_else(|| "an integer".into()),
        };
        Some(format!(
            "{} / {} divides integers (as may other divisions of the query), which drops the \
             fraction (7 / 2 is 3): for a ratio, a share or an average, divide numbers \
             (CAST(... AS numeric), or multiply by 100.0 first)",
            side(left_call, *left),
            side(right_call, *right),
        ))
    }
}

/// Levels of an integer expression searched for an aggregate, at most.
const MAX_DEPTH: usize = 8;

/// Nodes one search for an aggregate reads, at most: a column of a WITH query read many times
/// by another, and so on, would otherwise be read once per way to it.
const MAX_READ: usize = 256;

/// Where `aggregate_in` is: the queries the expression is inside (outermost first), how deep
/// it has gone and how many nodes it may still read.
struct Search<'a> {
    queries: &'a [*mut pg_sys::Query],
    depth: usize,
    left: &'a std::cell::Cell<usize>,
}

impl Search<'_> {
    fn deeper<'b>(&'b self, queries: &'b [*mut pg_sys::Query]) -> Search<'b> {
        Search {
            queries,
            depth: self.depth + 1,
            left: self.left,
        }
    }
}

/// The first aggregate or window function call `expr` holds (`COUNT(*)`), and whether `expr` is
/// that call (through casts, or as a column computed so): searched through casts, `NULLIF`,
/// `COALESCE`, `GREATEST`, `LEAST`, `CASE` results, scalar subqueries, columns of subqueries
/// and WITH queries, and the built-in integer `+`, `-` and `*`, the ways a count is scaled,
/// guarded or computed apart before it is divided.
///
/// # Safety
/// `expr` is a node of the analyzed tree whose enclosing queries are `search.queries`.
unsafe fn aggregate_in(expr: *mut pg_sys::Node, search: &Search) -> Option<(String, bool)> {
    // SAFETY: the caller's contract; every node is read as the struct its tag names.
    unsafe {
        pgrx::check_for_interrupts!();
        let expr = uncast(expr);
        if search.depth >= MAX_DEPTH || search.left.get() == 0 || expr.is_null() {
            return None;
        }
        search.left.set(search.left.get() - 1);
        let within = |args: *mut pg_sys::List| {
            PgList::<pg_sys::Node>::from_pg(args)
                .iter_ptr()
                .find_map(|arg| aggregate_in(arg, &search.deeper(search.queries)))
                .map(|(call, _)| (call, false))
        };
        match (*expr).type_ {
            pg_sys::NodeTag::T_Aggref | pg_sys::NodeTag::T_WindowFunc => {
                let (function, star, args) = aggregate_call(expr)?;
                let arguments = match (star, args.is_empty()) {
                    (true, _) => "*",
                    (false, true) => "",
                    (false, false) => "...",
                };
                Some((called(function, arguments), true))
            }
            // `(SELECT COUNT(*) FROM ...)`: a scalar subquery's one column.
            pg_sys::NodeTag::T_SubLink => {
                let sublink = expr.cast::<pg_sys::SubLink>();
                let query = (*sublink).subselect.cast::<pg_sys::Query>();
                if (*sublink).subLinkType != pg_sys::SubLinkType::EXPR_SUBLINK
                    || query.is_null()
                    || (*query).type_ != pg_sys::NodeTag::T_Query
                {
                    return None;
                }
                let column = PgList::<pg_sys::TargetEntry>::from_pg((*query).targetList)
                    .iter_ptr()
                    .find(|&entry| !(*entry).resjunk)?;
                let mut inner = search.queries.to_vec();
                inner.push(query);
                let (call, _) = aggregate_in((*column).expr.cast(), &search.deeper(&inner))?;
                Some((format!("a subquery's {call}"), true))
            }
            // `t.total` of `(SELECT COUNT(*) AS total ...) t` or of a WITH query.
            pg_sys::NodeTag::T_Var => {
                let var = expr.cast::<pg_sys::Var>();
                let (rte, _) = entry_of(var, search.queries)?;
                let (inner, stack) = behind(var, search.queries)?;
                let (call, is_call) = aggregate_in(inner, &search.deeper(&stack))?;
                if transparent(rte) {
                    return Some((call, is_call));
                }
                let written = written_name(rte, (*var).varattno)?;
                let how = if is_call { "" } else { "an expression of " };
                Some((format!("{written} (computed as {how}{call})"), true))
            }
            pg_sys::NodeTag::T_CaseExpr => {
                let case = expr.cast::<pg_sys::CaseExpr>();
                PgList::<pg_sys::CaseWhen>::from_pg((*case).args)
                    .iter_ptr()
                    .map(|when| (*when).result.cast::<pg_sys::Node>())
                    .chain(std::iter::once((*case).defresult.cast()))
                    .find_map(|result| aggregate_in(result, &search.deeper(search.queries)))
                    .map(|(call, _)| (call, false))
            }
            pg_sys::NodeTag::T_MinMaxExpr => within((*expr.cast::<pg_sys::MinMaxExpr>()).args),
            pg_sys::NodeTag::T_NullIfExpr => within((*expr.cast::<pg_sys::NullIfExpr>()).args),
            pg_sys::NodeTag::T_CoalesceExpr => within((*expr.cast::<pg_sys::CoalesceExpr>()).args),
            pg_sys::NodeTag::T_OpExpr => {
                let op = expr.cast::<pg_sys::OpExpr>();
                let arithmetic = builtin((*op).opno)
                    && integer((*op).opresulttype)
                    && ["+", "-", "*"].contains(&c_string(pg_sys::get_opname((*op).opno)).as_str());
                arithmetic.then(|| within((*op).args)).flatten()
            }
            _ => None,
        }
    }
}

/// The function of an aggregate or window function call, whether it is called with `*`, and
/// its arguments (an aggregate's ORDER BY keys left out); `None` for another node.
///
/// # Safety
/// `node` is a node of an analyzed tree.
unsafe fn aggregate_call(
    node: *mut pg_sys::Node,
) -> Option<(pg_sys::Oid, bool, Vec<*mut pg_sys::Node>)> {
    // SAFETY: the caller's contract; the node is read as the struct its tag names.
    unsafe {
        match (*node).type_ {
            pg_sys::NodeTag::T_Aggref => {
                let aggref = node.cast::<pg_sys::Aggref>();
                let args = PgList::<pg_sys::TargetEntry>::from_pg((*aggref).args)
                    .iter_ptr()
                    .filter(|&entry| !(*entry).resjunk)
                    .map(|entry| (*entry).expr.cast::<pg_sys::Node>())
                    .collect();
                Some(((*aggref).aggfnoid, (*aggref).aggstar, args))
            }
            pg_sys::NodeTag::T_WindowFunc => {
                let window = node.cast::<pg_sys::WindowFunc>();
                let args = PgList::<pg_sys::Node>::from_pg((*window).args)
                    .iter_ptr()
                    .collect();
                Some(((*window).winfnoid, (*window).winstar, args))
            }
            _ => None,
        }
    }
}

/// `expr` without the casts and relabellings around it (null for null).
///
/// # Safety
/// `expr` is a node of an analyzed tree, or null.
unsafe fn uncast(mut expr: *mut pg_sys::Node) -> *mut pg_sys::Node {
    // SAFETY: the caller's contract; every node is read as the struct its tag names.
    unsafe {
        loop {
            if expr.is_null() {
                return expr;
            }
            let next = match (*expr).type_ {
                pg_sys::NodeTag::T_RelabelType => (*expr.cast::<pg_sys::RelabelType>())
                    .arg
                    .cast::<pg_sys::Node>(),
                pg_sys::NodeTag::T_FuncExpr => {
                    let call = expr.cast::<pg_sys::FuncExpr>();
                    let args = PgList::<pg_sys::Node>::from_pg((*call).args);
                    let cast = matches!(
                        (*call).funcformat,
                        pg_sys::CoercionForm::COERCE_EXPLICIT_CAST
                            | pg_sys::CoercionForm::COERCE_IMPLICIT_CAST
                    );
                    match args.get_ptr(0) {
                        Some(arg) if cast && args.len() == 1 => arg,
                        _ => return expr,
                    }
                }
                _ => return expr,
            };
            if next.is_null() {
                return expr;
            }
            expr = next;
        }
    }
}

/// `int2`, `int4` or `int8`: a type whose division drops the fraction.
fn integer(type_oid: pg_sys::Oid) -> bool {
    [pg_sys::INT2OID, pg_sys::INT4OID, pg_sys::INT8OID].contains(&type_oid)
}

/// `NAME(arguments)` for a built-in function, `a function call` for another's (whose name
/// another role chose).
fn called(function: pg_sys::Oid, arguments: &str) -> String {
    match builtin(function).then(|| function_name(function)).flatten() {
        Some(name) => format!("{}({arguments})", name.to_uppercase()),
        None => "a function call".into(),
    }
}

/// `expr` is a constant, or built of constants by built-in operators and casts (`-2`, `2 * 5`,
/// `'10'::text::int`), as a divisor that makes buckets or units is written.
///
/// # Safety
/// `expr` is a node of an analyzed tree, or null.
unsafe fn constant(expr: *mut pg_sys::Node, depth: usize) -> bool {
    // SAFETY: the caller's contract; every node is read as the struct its tag names.
    unsafe {
        let expr = uncast(expr);
        if expr.is_null() || depth >= MAX_DEPTH {
            return false;
        }
        let all = |args: *mut pg_sys::List| {
            let args = PgList::<pg_sys::Node>::from_pg(args);
            !args.is_empty() && args.iter_ptr().all(|arg| constant(arg, depth + 1))
        };
        match (*expr).type_ {
            pg_sys::NodeTag::T_Const => true,
            pg_sys::NodeTag::T_CoerceToDomain => constant(
                (*expr.cast::<pg_sys::CoerceToDomain>()).arg.cast(),
                depth + 1,
            ),
            pg_sys::NodeTag::T_CoerceViaIO => {
                constant((*expr.cast::<pg_sys::CoerceViaIO>()).arg.cast(), depth + 1)
            }
            pg_sys::NodeTag::T_OpExpr => {
                let op = expr.cast::<pg_sys::OpExpr>();
                builtin((*op).opno) && all((*op).args)
            }
            pg_sys::NodeTag::T_FuncExpr => {
                let call = expr.cast::<pg_sys::FuncExpr>();
                builtin((*call).funcid) && all((*call).args)
            }
            _ => false,
        }
    }
}

/// `alias.column` for a column of a table that `expr` reads, as the query names it.
///
/// # Safety
/// `expr` is a node of the analyzed tree whose enclosing queries are `queries`.
unsafe fn named_column(expr: *mut pg_sys::Node, queries: &[*mut pg_sys::Query]) -> Option<String> {
    // SAFETY: the caller's contract.
    unsafe { column_of(uncast(expr), queries).map(|(_, written)| written) }
}

/// The column of a table that `expr` reads (through relabelling, as a column of a domain is
/// read; through subqueries, WITH queries, joins and groups whose column is that column), and
/// `alias.column` as the query writes it where `expr` is.
///
/// # Safety
/// `expr` is a node of the analyzed tree whose enclosing queries are `queries`.
unsafe fn column_of(
    expr: *mut pg_sys::Node,
    queries: &[*mut pg_sys::Query],
) -> Option<(Column, String)> {
    // SAFETY: the caller's contract.
    unsafe { resolved(expr, queries, None, 0) }
}

/// `column_of`, `depth` subqueries or joins in, with the name written where the search began
/// (`None` until a range-table entry the query names is reached).
///
/// # Safety
/// As `column_of`.
unsafe fn resolved(
    mut expr: *mut pg_sys::Node,
    queries: &[*mut pg_sys::Query],
    written: Option<String>,
    depth: usize,
) -> Option<(Column, String)> {
    // SAFETY: the caller's contract; every node is read as the struct its tag names.
    unsafe {
        while !expr.is_null() && (*expr).type_ == pg_sys::NodeTag::T_RelabelType {
            expr = (*expr.cast::<pg_sys::RelabelType>()).arg.cast();
        }
        if depth >= MAX_DEPTH || expr.is_null() || (*expr).type_ != pg_sys::NodeTag::T_Var {
            return None;
        }
        let var = expr.cast::<pg_sys::Var>();
        let (rte, _) = entry_of(var, queries)?;
        let written = match written {
            Some(written) => Some(written),
            None if transparent(rte) => None,
            None => Some(written_name(rte, (*var).varattno)?),
        };
        if (*rte).rtekind == pg_sys::RTEKind::RTE_RELATION {
            let column = Column {
                relation: (*rte).relid,
                attnum: (*var).varattno,
            };
            return Some((column, written?));
        }
        let (inner, stack) = behind(var, queries)?;
        resolved(inner, &stack, written, depth + 1)
    }
}

/// The range-table entry a column reference `var` reads, and the level of the query that holds
/// it in `queries` (outermost first); `None` for a whole-row or system column.
///
/// # Safety
/// `var` is a node of the analyzed tree whose enclosing queries are `queries`.
unsafe fn entry_of(
    var: *mut pg_sys::Var,
    queries: &[*mut pg_sys::Query],
) -> Option<(*mut pg_sys::RangeTblEntry, usize)> {
    // SAFETY: the caller's contract.
    unsafe {
        if (*var).varattno <= 0 {
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
        Some((rte, level))
    }
}

/// What a column of a subquery, a WITH query, a join or (PostgreSQL 18) a GROUP BY stands for:
/// the expression behind `var`, and the queries that expression is inside (outermost first).
///
/// # Safety
/// `var` is a node of the analyzed tree whose enclosing queries are `queries`.
unsafe fn behind(
    var: *mut pg_sys::Var,
    queries: &[*mut pg_sys::Query],
) -> Option<(*mut pg_sys::Node, Vec<*mut pg_sys::Query>)> {
    // SAFETY: the caller's contract; every node is read as the struct its tag names.
    unsafe {
        let (rte, level) = entry_of(var, queries)?;
        let column = usize::try_from((*var).varattno).ok()?.checked_sub(1)?;
        let around = queries.get(..=level)?;
        let within = |query: *mut pg_sys::Query, owners: &[*mut pg_sys::Query]| {
            let expr = output(query, (*var).varattno)?;
            let mut stack = owners.to_vec();
            stack.push(query);
            Some((expr, stack))
        };
        match (*rte).rtekind {
            pg_sys::RTEKind::RTE_SUBQUERY => within((*rte).subquery, around),
            pg_sys::RTEKind::RTE_CTE => {
                let owner = level.checked_sub(usize::try_from((*rte).ctelevelsup).ok()?)?;
                let owners = queries.get(..=owner)?;
                let name = c_string((*rte).ctename);
                let cte = PgList::<pg_sys::CommonTableExpr>::from_pg((*owners[owner]).cteList)
                    .iter_ptr()
                    .find(|&cte| c_string((*cte).ctename) == name)?;
                within((*cte).ctequery.cast(), owners)
            }
            pg_sys::RTEKind::RTE_JOIN => {
                let expr = PgList::<pg_sys::Node>::from_pg((*rte).joinaliasvars).get_ptr(column)?;
                Some((expr, around.to_vec()))
            }
            _ => compat::grouped(rte, column).map(|expr| (expr, around.to_vec())),
        }
    }
}

/// The expression of output column `resno` of `query` (a SELECT's; a set operation's first
/// branch, through the column of its own range table).
///
/// # Safety
/// `query` is null or a node of an analyzed tree.
unsafe fn output(
    query: *mut pg_sys::Query,
    resno: pg_sys::AttrNumber,
) -> Option<*mut pg_sys::Node> {
    // SAFETY: the caller's contract.
    unsafe {
        if query.is_null() || (*query).type_ != pg_sys::NodeTag::T_Query {
            return None;
        }
        PgList::<pg_sys::TargetEntry>::from_pg((*query).targetList)
            .iter_ptr()
            .find(|&entry| (*entry).resno == resno && !(*entry).resjunk)
            .map(|entry| (*entry).expr.cast())
    }
}

/// A range-table entry whose columns the query writes as another's: an unnamed join's (`USING`
/// columns) and PostgreSQL 18's GROUP BY entry.
///
/// # Safety
/// `rte` is a range-table entry of an analyzed tree.
unsafe fn transparent(rte: *mut pg_sys::RangeTblEntry) -> bool {
    // SAFETY: the caller's contract.
    unsafe {
        match (*rte).rtekind {
            pg_sys::RTEKind::RTE_JOIN => (*rte).alias.is_null(),
            _ => compat::is_group(rte),
        }
    }
}

/// `alias.column` of column `attnum` of `rte` as the query names it, quoted as SQL writes it.
///
/// # Safety
/// `rte` is a range-table entry of an analyzed tree.
unsafe fn written_name(
    rte: *mut pg_sys::RangeTblEntry,
    attnum: pg_sys::AttrNumber,
) -> Option<String> {
    // SAFETY: the caller's contract; the alias's names are String nodes.
    unsafe {
        let eref = (*rte).eref;
        if eref.is_null() {
            return None;
        }
        let index = usize::try_from(attnum).ok()?.checked_sub(1)?;
        let name = PgList::<pg_sys::Node>::from_pg((*eref).colnames).get_ptr(index)?;
        if (*name).type_ != pg_sys::NodeTag::T_String {
            return None;
        }
        let (alias, column) = (
            c_string((*eref).aliasname),
            c_string((*name.cast::<pg_sys::String>()).sval),
        );
        (!alias.is_empty() && !column.is_empty() && printable(&alias) && printable(&column))
            .then(|| format!("{}.{}", quoted(&alias), quoted(&column)))
    }
}
