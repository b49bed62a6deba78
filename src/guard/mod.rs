//! The statement policy, decided on PostgreSQL's own parse trees. Fail closed: what cannot be
//! proven safe is refused.
//!
//! 1. The raw tree (`raw_parser`, the server's grammar): exactly one statement, a SELECT, VALUES
//!    or set operation of those, without `INTO`; no data-modifying CTE and no locking clause at
//!    any depth.
//! 2. The analyzed tree (`parse_analyze`, names resolved exactly as the server resolves them:
//!    schema-qualified, quoted, odd casing, operators that call functions): every function
//!    called anywhere (select list, WHERE, ORDER BY, LATERAL, FROM, CTEs, sublinks, default
//!    arguments) must pass the policy in `policy.rs`; system catalogs are refused unless
//!    `sql_query_engine.allow_system_catalogs` is on. The tree checked is the one before rewrite,
//!    so the owner's views and row-security policies are not second-guessed.
//!
//! Errors: a write or utility statement → 25006 (ends the run); a forbidden function, clause or
//! relation → 42501; a parse or analysis error → the server's own ERROR.

mod policy;

use std::ffi::{c_void, CStr, CString};

use pgrx::pg_sys;
use pgrx::PgList;

use crate::error::SqlError;
use crate::settings;

/// Why a statement may not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub error: SqlError,
    /// A write ends the run: it is reported, never repaired. A refused read is fed back to the
    /// model like any other error.
    pub ends_run: bool,
}

impl Refusal {
    fn write(command: &str) -> Self {
        Refusal {
            error: SqlError {
                sqlstate: "25006".into(),
                message: format!(
                    "refused to run a {command} statement: only a single read-only query may run"
                ),
                hint: Some(
                    "The model proposed a statement that writes or changes state; it was not executed."
                        .into(),
                ),
                ..Default::default()
            },
            ends_run: true,
        }
    }

    fn read(sqlstate: &str, message: String) -> Self {
        Refusal {
            error: SqlError::new(sqlstate, message),
            ends_run: false,
        }
    }

    fn forbidden(message: String) -> Self {
        Refusal::read("42501", message)
    }
}

/// A statement that passed, and what it reads.
#[derive(Debug, Default)]
pub struct Checked {
    /// Tables and views the statement names (for telling row security apart from emptiness).
    pub relations: Vec<pg_sys::Oid>,
}

/// Checks `sql`. Parse and analysis errors are raised as the server's own ERRORs (SQLSTATE and
/// position included), so call this where errors are caught, or let them reach the caller.
pub fn check(sql: &str) -> Result<Checked, Refusal> {
    let Ok(text) = CString::new(sql) else {
        return Err(Refusal::read(
            "22021",
            "the query contains a NUL character".into(),
        ));
    };
    let statements = unsafe {
        PgList::<pg_sys::RawStmt>::from_pg(pg_sys::raw_parser(
            text.as_ptr(),
            pg_sys::RawParseMode::RAW_PARSE_DEFAULT,
        ))
    };
    if statements.is_empty() {
        return Err(Refusal::read(
            "42601",
            "the query is empty: it contains no statement".into(),
        ));
    }
    for raw in statements.iter_ptr() {
        check_raw(unsafe { (*raw).stmt })?;
    }
    if statements.len() > 1 {
        return Err(Refusal::read(
            "42601",
            format!("expected exactly one statement, found {}", statements.len()),
        ));
    }
    let raw = statements
        .get_ptr(0)
        .ok_or_else(|| Refusal::read("42601", "no statement".into()))?;
    let query = unsafe {
        pg_sys::parse_analyze_fixedparams(
            raw,
            text.as_ptr(),
            std::ptr::null(),
            0,
            std::ptr::null_mut(),
        )
    };
    let mut walk = Walk {
        allow_catalogs: settings::allow_system_catalogs(),
        relations: Vec::new(),
        refusal: None,
    };
    // Through PostgreSQL's walker, never by calling a walker directly: an ERROR raised deep in
    // the walk (stack depth, say) must come back through pgrx's FFI boundary as a catchable
    // error, not jump past the caller's PgTry.
    unsafe {
        if !check_query(query, &mut walk) {
            pg_sys::query_tree_walker(
                query,
                Some(analyzed_walker),
                (&mut walk as *mut Walk).cast(),
                pg_sys::QTW_EXAMINE_RTES_BEFORE as i32,
            );
        }
    }
    match walk.refusal {
        Some(refusal) => Err(refusal),
        None => Ok(Checked {
            relations: walk.relations,
        }),
    }
}

/// A relation a query names, with the alias it gives it there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationRef {
    /// As the parser folded it.
    pub name: String,
    pub alias: Option<String>,
}

/// The relations `sql` refers to, for repair hints; empty when it does not parse.
pub fn relation_refs(sql: &str) -> Vec<RelationRef> {
    let Ok(text) = CString::new(sql) else {
        return Vec::new();
    };
    crate::exec::in_subtransaction(false, || {
        let mut refs: Vec<RelationRef> = Vec::new();
        unsafe {
            let statements = PgList::<pg_sys::RawStmt>::from_pg(pg_sys::raw_parser(
                text.as_ptr(),
                pg_sys::RawParseMode::RAW_PARSE_DEFAULT,
            ));
            for raw in statements.iter_ptr() {
                pg_sys::raw_expression_tree_walker(
                    (*raw).stmt,
                    Some(range_var_collector),
                    (&mut refs as *mut Vec<RelationRef>).cast(),
                );
            }
        }
        refs
    })
    .unwrap_or_default()
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn range_var_collector(
    node: *mut pg_sys::Node,
    context: *mut c_void,
) -> bool {
    if node.is_null() {
        return false;
    }
    if (*node).type_ == pg_sys::NodeTag::T_RangeVar {
        let range_var = node.cast::<pg_sys::RangeVar>();
        let alias = (*range_var).alias;
        let found = RelationRef {
            name: c_string((*range_var).relname),
            alias: (!alias.is_null())
                .then(|| c_string((*alias).aliasname))
                .filter(|a| !a.is_empty()),
        };
        let refs = &mut *context.cast::<Vec<RelationRef>>();
        if !found.name.is_empty() && !refs.contains(&found) {
            refs.push(found);
        }
    }
    pg_sys::raw_expression_tree_walker(node, Some(range_var_collector), context)
}

/// Statement kind, `INTO`, data-modifying CTEs and locking clauses, from the raw tree.
fn check_raw(statement: *mut pg_sys::Node) -> Result<(), Refusal> {
    unsafe {
        if statement.is_null() || (*statement).type_ != pg_sys::NodeTag::T_SelectStmt {
            return Err(Refusal::write(&command_name(statement)));
        }
        if !(*statement.cast::<pg_sys::SelectStmt>())
            .intoClause
            .is_null()
        {
            return Err(Refusal::write("SELECT INTO"));
        }
        let mut found = raw_node_refusal(statement);
        if found.is_none() {
            // Through PostgreSQL's walker (see `check`).
            pg_sys::raw_expression_tree_walker(
                statement,
                Some(raw_walker),
                (&mut found as *mut Option<Refusal>).cast(),
            );
        }
        found.map_or(Ok(()), Err)
    }
}

/// A locking clause or a data-modifying CTE at this raw node.
unsafe fn raw_node_refusal(node: *mut pg_sys::Node) -> Option<Refusal> {
    match (*node).type_ {
        pg_sys::NodeTag::T_SelectStmt
            if !(*node.cast::<pg_sys::SelectStmt>()).lockingClause.is_null() =>
        {
            Some(Refusal::forbidden(
                "a locking clause (FOR UPDATE/SHARE) is not allowed in a generated query: it takes row locks"
                    .into(),
            ))
        }
        pg_sys::NodeTag::T_CommonTableExpr => {
            let query = (*node.cast::<pg_sys::CommonTableExpr>()).ctequery;
            (!query.is_null() && (*query).type_ != pg_sys::NodeTag::T_SelectStmt)
                .then(|| Refusal::write(&format!("{} (in a WITH clause)", command_name(query))))
        }
        _ => None,
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn raw_walker(node: *mut pg_sys::Node, context: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    if let Some(refusal) = raw_node_refusal(node) {
        *context.cast::<Option<Refusal>>() = Some(refusal);
        return true;
    }
    pg_sys::raw_expression_tree_walker(node, Some(raw_walker), context)
}

/// State of the walk over the analyzed tree.
struct Walk {
    allow_catalogs: bool,
    relations: Vec<pg_sys::Oid>,
    refusal: Option<Refusal>,
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn analyzed_walker(node: *mut pg_sys::Node, context: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    let walk = &mut *context.cast::<Walk>();
    match (*node).type_ {
        pg_sys::NodeTag::T_Query => {
            let query = node.cast::<pg_sys::Query>();
            if check_query(query, walk) {
                return true;
            }
            pg_sys::query_tree_walker(
                query,
                Some(analyzed_walker),
                context,
                pg_sys::QTW_EXAMINE_RTES_BEFORE as i32,
            )
        }
        pg_sys::NodeTag::T_RangeTblEntry => {
            let rte = node.cast::<pg_sys::RangeTblEntry>();
            if (*rte).rtekind == pg_sys::RTEKind::RTE_RELATION {
                let relid = (*rte).relid;
                let schema = namespace_name(pg_sys::get_rel_namespace(relid));
                if !walk.allow_catalogs && policy::CATALOG_SCHEMAS.contains(&schema.as_str()) {
                    walk.refusal = Some(Refusal::forbidden(format!(
                        "relation {schema}.{} is not allowed in a generated query: system catalogs \
                         are not queryable (sql_query_engine.allow_system_catalogs is off); \
                         questions about the database's structure are answered from the schema shown",
                        c_string(pg_sys::get_rel_name(relid)),
                    )));
                    return true;
                }
                walk.relations.push(relid);
            }
            // The walker goes on into the entry's subquery, functions and VALUES lists.
            false
        }
        _ => {
            if pg_sys::check_functions_in_node(node, Some(function_checker), context) {
                return true;
            }
            pg_sys::expression_tree_walker(node, Some(analyzed_walker), context)
        }
    }
}

/// A (sub)query that writes or locks rows; records the refusal and says whether there was one.
unsafe fn check_query(query: *mut pg_sys::Query, walk: &mut Walk) -> bool {
    if (*query).commandType != pg_sys::CmdType::CMD_SELECT || !(*query).utilityStmt.is_null() {
        walk.refusal = Some(Refusal::write("data-modifying"));
    } else if !(*query).rowMarks.is_null() {
        walk.refusal = Some(Refusal::forbidden(
            "a locking clause (FOR UPDATE/SHARE) is not allowed in a generated query".into(),
        ));
    }
    walk.refusal.is_some()
}

/// Applies the function policy to one function the query calls, and walks its default
/// arguments: the planner inserts those into the call, out of the analyzed tree's sight.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn function_checker(function: pg_sys::Oid, context: *mut c_void) -> bool {
    let walk = &mut *context.cast::<Walk>();
    let name = c_string(pg_sys::get_func_name(function));
    let schema = namespace_name(pg_sys::get_func_namespace(function));
    let volatility = pg_sys::func_volatile(function) as u8;
    if let Some(reason) = policy::refuse_function(&schema, &name, volatility) {
        let signature = c_string(pg_sys::format_procedure_qualified(function));
        walk.refusal = Some(Refusal::forbidden(format!(
            "function {signature} is not allowed in a generated query: {reason}"
        )));
        return true;
    }
    match default_arguments(function) {
        // A List: the walker visits each default expression.
        Some(defaults) => pg_sys::expression_tree_walker(defaults, Some(analyzed_walker), context),
        None => false,
    }
}

/// The function's default-argument expressions, when it has any.
unsafe fn default_arguments(function: pg_sys::Oid) -> Option<*mut pg_sys::Node> {
    let tuple = pg_sys::SearchSysCache1(
        pg_sys::SysCacheIdentifier::PROCOID as i32,
        pg_sys::Datum::from(function),
    );
    if tuple.is_null() {
        return None;
    }
    let mut is_null = true;
    let datum = pg_sys::SysCacheGetAttr(
        pg_sys::SysCacheIdentifier::PROCOID as i32,
        tuple,
        pg_sys::Anum_pg_proc_proargdefaults as pg_sys::AttrNumber,
        &mut is_null,
    );
    let defaults = if is_null {
        None
    } else {
        let text = pg_sys::text_to_cstring(datum.cast_mut_ptr());
        Some(pg_sys::stringToNode(text).cast::<pg_sys::Node>())
    };
    pg_sys::ReleaseSysCache(tuple);
    defaults
}

unsafe fn c_string(text: *const std::ffi::c_char) -> String {
    if text.is_null() {
        String::new()
    } else {
        CStr::from_ptr(text).to_string_lossy().into_owned()
    }
}

unsafe fn namespace_name(namespace: pg_sys::Oid) -> String {
    c_string(pg_sys::get_namespace_name(namespace))
}

/// The statement's command tag, as psql would print it (`DELETE`, `CREATE TABLE`, ...).
fn command_name(node: *mut pg_sys::Node) -> String {
    unsafe {
        if node.is_null() {
            return "non-SELECT".into();
        }
        let name = pg_sys::GetCommandTagName(pg_sys::CreateCommandTag(node));
        if name.is_null() {
            "non-SELECT".into()
        } else {
            CStr::from_ptr(name).to_string_lossy().into_owned()
        }
    }
}
