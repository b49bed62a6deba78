//! The statement policy, decided on PostgreSQL's own parse trees. Fail closed: what cannot be
//! proven safe is refused.
//!
//! 1. The raw tree (`raw_parser`, the server's grammar): exactly one statement, a SELECT, VALUES
//!    or set operation of those, without `INTO`; no data-modifying CTE and no locking clause at
//!    any depth.
//! 2. The analyzed tree (`parse_analyze`, names resolved exactly as the server resolves them:
//!    schema-qualified, quoted, odd casing, operators that call functions): every function
//!    called anywhere (select list, WHERE, ORDER BY, LATERAL, FROM, CTEs, sublinks, default
//!    arguments) must pass the allow-list in `policy.rs`, and so must what runs implicitly: the
//!    support functions of user aggregates, the functions and planner estimators behind user
//!    operators (sort and grouping operators included), the CHECK expressions of domains a value
//!    is cast to, and TABLESAMPLE methods. System catalogs are refused unless
//!    `sql_query_engine.allow_system_catalogs` is on. The tree checked is the one before rewrite,
//!    so the owner's views and row-security policies are not second-guessed.
//!
//! The analyzed tree that passed is handed to the executor, which plans exactly that tree: the
//! text is never parsed a second time.
//!
//! Errors: a write or utility statement → 25006 (ends the run); a forbidden function, clause or
//! relation → 42501; a parse or analysis error → the server's own ERROR.

mod policy;

use std::ffi::{c_void, CStr, CString};

use pgrx::pg_sys;
use pgrx::PgList;

use crate::error::{SqlError, SqlState};
use crate::{settings, subxact};

pub use policy::Allowed;

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
                sqlstate: SqlState::READ_ONLY_SQL_TRANSACTION,
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

    fn read(sqlstate: SqlState, message: String) -> Self {
        Refusal {
            error: SqlError::new(sqlstate, message),
            ends_run: false,
        }
    }

    fn forbidden(message: String) -> Self {
        Refusal::read(SqlState::INSUFFICIENT_PRIVILEGE, message)
    }
}

/// A statement that passed.
pub struct Checked {
    /// The analyzed tree that was checked, in the current memory context: the one to plan.
    pub query: *mut pg_sys::Query,
    /// The query text, as the planner and executor want it.
    pub text: CString,
    /// Tables and views the statement names (for telling row security apart from emptiness).
    pub relations: Vec<pg_sys::Oid>,
}

/// Checks `sql`. Parse and analysis errors are raised as the server's own ERRORs (SQLSTATE and
/// position included), so call this where errors are caught, or let them reach the caller.
pub fn check(sql: &str) -> Result<Checked, Refusal> {
    let Ok(text) = CString::new(sql) else {
        return Err(Refusal::read(
            SqlState::CHARACTER_NOT_IN_REPERTOIRE,
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
            SqlState::SYNTAX_ERROR,
            "the query is empty: it contains no statement".into(),
        ));
    }
    for raw in statements.iter_ptr() {
        check_raw(unsafe { (*raw).stmt })?;
    }
    if statements.len() > 1 {
        return Err(Refusal::read(
            SqlState::SYNTAX_ERROR,
            format!("expected exactly one statement, found {}", statements.len()),
        ));
    }
    let raw = statements
        .get_ptr(0)
        .ok_or_else(|| Refusal::read(SqlState::SYNTAX_ERROR, "no statement".into()))?;
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
        allowed: settings::allowed_functions(),
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
            query,
            text,
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
    subxact::in_subtransaction(false, || {
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
    allowed: Allowed,
    relations: Vec<pg_sys::Oid>,
    refusal: Option<Refusal>,
}

/// Objects with OIDs below this were created by initdb.
fn builtin(oid: pg_sys::Oid) -> bool {
    oid.to_u32() < pg_sys::FirstNormalObjectId
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
                let sample = (*rte).tablesample;
                if !sample.is_null() && check_function(walk, (*sample).tsmhandler) {
                    return true;
                }
            }
            // The walker goes on into the entry's subquery, functions, VALUES lists and
            // TABLESAMPLE arguments.
            false
        }
        // A type's input and output functions are C code only a superuser can install; the
        // expression inside is checked as usual.
        pg_sys::NodeTag::T_CoerceViaIO => {
            pg_sys::expression_tree_walker(node, Some(analyzed_walker), context)
        }
        pg_sys::NodeTag::T_CoerceToDomain => {
            let domain = (*node.cast::<pg_sys::CoerceToDomain>()).resulttype;
            if !builtin(domain) && check_domain(domain, context) {
                return true;
            }
            pg_sys::expression_tree_walker(node, Some(analyzed_walker), context)
        }
        tag => {
            if let Some(operator) = operator_of(node, tag) {
                if check_operator(walk, operator) {
                    return true;
                }
            }
            if pg_sys::check_functions_in_node(node, Some(function_checker), context) {
                return true;
            }
            pg_sys::expression_tree_walker(node, Some(analyzed_walker), context)
        }
    }
}

/// The operator an expression node applies, for the operators whose estimators the planner
/// calls.
unsafe fn operator_of(node: *mut pg_sys::Node, tag: pg_sys::NodeTag) -> Option<pg_sys::Oid> {
    match tag {
        pg_sys::NodeTag::T_OpExpr
        | pg_sys::NodeTag::T_DistinctExpr
        | pg_sys::NodeTag::T_NullIfExpr => Some((*node.cast::<pg_sys::OpExpr>()).opno),
        pg_sys::NodeTag::T_ScalarArrayOpExpr => {
            Some((*node.cast::<pg_sys::ScalarArrayOpExpr>()).opno)
        }
        _ => None,
    }
}

/// A (sub)query that writes or locks rows, or sorts, groups or deduplicates with an operator
/// that may not run; records the refusal and says whether there was one.
unsafe fn check_query(query: *mut pg_sys::Query, walk: &mut Walk) -> bool {
    if (*query).commandType != pg_sys::CmdType::CMD_SELECT || !(*query).utilityStmt.is_null() {
        walk.refusal = Some(Refusal::write("data-modifying"));
        return true;
    }
    if !(*query).rowMarks.is_null() {
        walk.refusal = Some(Refusal::forbidden(
            "a locking clause (FOR UPDATE/SHARE) is not allowed in a generated query".into(),
        ));
        return true;
    }
    // Sort, group and DISTINCT operators are operator OIDs in the tree, not expressions: the
    // walker would not see their functions.
    let mut clauses = vec![
        (*query).sortClause,
        (*query).groupClause,
        (*query).distinctClause,
    ];
    for window in PgList::<pg_sys::WindowClause>::from_pg((*query).windowClause).iter_ptr() {
        clauses.push((*window).partitionClause);
        clauses.push((*window).orderClause);
    }
    for list in clauses {
        for clause in PgList::<pg_sys::SortGroupClause>::from_pg(list).iter_ptr() {
            for operator in [(*clause).sortop, (*clause).eqop] {
                if operator != pg_sys::InvalidOid && check_operator(walk, operator) {
                    return true;
                }
            }
        }
    }
    false
}

/// A user-defined operator: its function and the planner's estimators for it.
unsafe fn check_operator(walk: &mut Walk, operator: pg_sys::Oid) -> bool {
    if builtin(operator) {
        return false;
    }
    [
        pg_sys::get_opcode(operator),
        pg_sys::get_oprrest(operator),
        pg_sys::get_oprjoin(operator),
    ]
    .into_iter()
    .filter(|f| *f != pg_sys::InvalidOid)
    .any(|f| check_function(walk, f))
}

/// The CHECK expressions of a domain (and of the domains it is based on).
unsafe fn check_domain(domain: pg_sys::Oid, context: *mut c_void) -> bool {
    // The reference registers a callback on the memory context that releases it, so it lives
    // in that context, not on the stack.
    let constraints = pg_sys::palloc0(std::mem::size_of::<pg_sys::DomainConstraintRef>())
        .cast::<pg_sys::DomainConstraintRef>();
    pg_sys::InitDomainConstraintRef(domain, constraints, pg_sys::CurrentMemoryContext, false);
    for constraint in
        PgList::<pg_sys::DomainConstraintState>::from_pg((*constraints).constraints).iter_ptr()
    {
        let expression = (*constraint).check_expr;
        // Called from inside PostgreSQL's walk, so an ERROR still unwinds through its boundary.
        if !expression.is_null() && analyzed_walker(expression.cast(), context) {
            return true;
        }
    }
    false
}

/// Applies the function policy to one function the query calls, and walks its default
/// arguments: the planner inserts those into the call, out of the analyzed tree's sight.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn function_checker(function: pg_sys::Oid, context: *mut c_void) -> bool {
    let walk = &mut *context.cast::<Walk>();
    if check_function(walk, function) {
        return true;
    }
    match default_arguments(function) {
        // A List: the walker visits each default expression.
        Some(defaults) => pg_sys::expression_tree_walker(defaults, Some(analyzed_walker), context),
        None => false,
    }
}

/// Whether `function` is refused (the refusal is recorded); for a user aggregate that may run,
/// its support functions are checked too.
unsafe fn check_function(walk: &mut Walk, function: pg_sys::Oid) -> bool {
    let name = c_string(pg_sys::get_func_name(function));
    let namespace = pg_sys::get_func_namespace(function);
    let schema = namespace_name(namespace);
    let extension_oid = pg_sys::getExtensionOfObject(pg_sys::ProcedureRelationId, function);
    let extension = (extension_oid != pg_sys::InvalidOid)
        .then(|| c_string(pg_sys::get_extension_name(extension_oid)));
    let facts = policy::Function {
        schema: &schema,
        name: &name,
        volatility: pg_sys::func_volatile(function) as u8,
        builtin: builtin(function) && namespace.to_u32() == pg_sys::PG_CATALOG_NAMESPACE,
        extension: extension.as_deref(),
    };
    if let Some(reason) = policy::refuse(&facts, &walk.allowed, walk.allow_catalogs) {
        let signature = c_string(pg_sys::format_procedure_qualified(function));
        walk.refusal = Some(Refusal::forbidden(format!(
            "function {signature} is not allowed in a generated query: {reason}"
        )));
        return true;
    }
    if !facts.builtin && pg_sys::get_func_prokind(function) as u8 == b'a' {
        return aggregate_support(function)
            .into_iter()
            .any(|f| check_function(walk, f));
    }
    false
}

/// The transition, final, combine, (de)serialisation and moving-aggregate functions of an
/// aggregate: they run for it, out of the tree's sight.
unsafe fn aggregate_support(aggregate: pg_sys::Oid) -> Vec<pg_sys::Oid> {
    // pg_aggregate's aggtransfn .. aggmfinalfn (attributes 4 to 11 since PostgreSQL 11).
    const SUPPORT_ATTRIBUTES: std::ops::RangeInclusive<i16> = 4..=11;
    let cache = pg_sys::SysCacheIdentifier::AGGFNOID as i32;
    let tuple = pg_sys::SearchSysCache1(cache, pg_sys::Datum::from(aggregate));
    if tuple.is_null() {
        return Vec::new();
    }
    let mut functions = Vec::new();
    for attribute in SUPPORT_ATTRIBUTES {
        let mut is_null = true;
        let datum = pg_sys::SysCacheGetAttr(cache, tuple, attribute, &mut is_null);
        let oid = pg_sys::Oid::from(datum.value() as u32);
        if !is_null && oid != pg_sys::InvalidOid {
            functions.push(oid);
        }
    }
    pg_sys::ReleaseSysCache(tuple);
    functions
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
