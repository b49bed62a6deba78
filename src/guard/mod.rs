//! The statement policy, decided on PostgreSQL's own parse trees. Fail closed: what cannot be
//! proven safe is refused.
//!
//! 1. The raw tree (`raw_parser`, the server's grammar): exactly one statement, a SELECT, VALUES
//!    or set operation of those, without `INTO`; no data-modifying CTE and no locking clause at
//!    any depth. Parsing runs no code.
//! 2. Parse analysis (names resolved exactly as the server resolves them), behind the runtime
//!    gate (`gate`): analysis converts literals to their types, and a literal of an array of a
//!    domain, a composite or a range runs that type's input code; no function may start there
//!    that the policy does not allow. Call `check` inside the sandbox (`exec`): analysis can
//!    raise any error.
//! 3. The analyzed tree: every function called anywhere (select list, WHERE, ORDER BY, LATERAL,
//!    FROM, CTEs, sublinks, default arguments) must pass the allow-list in `policy.rs`, and so
//!    must what runs implicitly: the support functions of user aggregates, the functions and
//!    planner estimators behind user operators (sort and grouping operators included), and
//!    every type a value has or is converted to (`types.rs`: input, output, cast and support
//!    functions, domain CHECKs, the fields of composites, column definition lists, XMLTABLE and
//!    JSON_TABLE columns). A node kind the walk does not know is refused. System catalogs are
//!    refused unless `sql_query_engine.allow_system_catalogs` is on.
//! 4. A superuser's call (`trust.rs`) reads only relations that superusers or trusted roles own.
//! 5. The extension's own reads (`Origin::Own`) run no code but PostgreSQL's built-ins: only
//!    plain and partitioned tables and materialized views without row security applying, no
//!    views, no foreign tables, built-in functions and types only.
//!
//! The tree checked is the one before rewrite: for a role's generated query, the owner's views
//! and row-security policies are the owner's responsibility. The analyzed tree that passed is
//! handed to the executor, which plans exactly that tree: the text is never parsed again.
//!
//! Errors: a write or utility statement → 25006 (ends the run); a forbidden function, type,
//! clause or relation → 42501; a parse or analysis error → the server's own ERROR.

pub mod gate;
mod policy;
mod trust;
mod types;

use std::collections::HashMap;
use std::ffi::{c_void, CStr, CString};

use pgrx::pg_sys;
use pgrx::PgList;

use crate::error::{SqlError, SqlState};
use crate::{settings, subxact};

pub use policy::Allowed;
pub use trust::{superuser_call, Trusted};

/// Who wrote the SQL, which decides how strict the check is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The model's or the caller's SQL.
    Generated,
    /// The extension's own reads (schema samples, the value index).
    Own,
}

impl Origin {
    fn what(self) -> &'static str {
        match self {
            Origin::Generated => "a generated query",
            Origin::Own => "the extension's own reads",
        }
    }
}

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

    pub fn forbidden(message: String) -> Self {
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

/// Checks `sql`, written by `origin`; `trusted` is set for a superuser's call. Parse and
/// analysis errors are raised as the server's own ERRORs (SQLSTATE and position included), so
/// call this inside the sandbox, where errors are caught.
pub fn check(sql: &str, origin: Origin, trusted: Option<&Trusted>) -> Result<Checked, Refusal> {
    let Ok(text) = CString::new(sql) else {
        return Err(Refusal::read(
            SqlState::CHARACTER_NOT_IN_REPERTOIRE,
            "the query contains a NUL character".into(),
        ));
    };
    // SAFETY: the grammar on a NUL-terminated string; the list lives in the current context.
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
        // SAFETY: raw_parser returns RawStmt nodes.
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
    let allowed = match origin {
        Origin::Generated => settings::allowed_functions(),
        Origin::Own => Allowed::default(),
    };
    let rule = match origin {
        Origin::Generated => gate::Rule::Allowed(std::rc::Rc::new(allowed.clone())),
        Origin::Own => gate::Rule::BuiltinOnly,
    };
    let query = {
        let _gate = gate::open(rule, "the query is analysed");
        // SAFETY: a RawStmt from raw_parser and its source text; errors come back through
        // pgrx as the server's ERROR.
        unsafe {
            pg_sys::parse_analyze_fixedparams(
                raw,
                text.as_ptr(),
                std::ptr::null(),
                0,
                std::ptr::null_mut(),
            )
        }
    };
    // SAFETY: the tree parse analysis just made.
    let relations = unsafe { check_tree(query, origin, allowed, trusted) }?;
    Ok(Checked {
        query,
        text,
        relations,
    })
}

/// Walks an analyzed tree with the policy of `origin`: the relations it names, or why it may
/// not run.
///
/// # Safety
/// `query` must be an analyzed Query of the current transaction.
pub(crate) unsafe fn check_tree(
    query: *mut pg_sys::Query,
    origin: Origin,
    allowed: Allowed,
    trusted: Option<&Trusted>,
) -> Result<Vec<pg_sys::Oid>, Refusal> {
    let mut walk = Walk {
        origin,
        allow_catalogs: origin == Origin::Generated && settings::allow_system_catalogs(),
        allowed,
        trusted: trusted.cloned(),
        relations: Vec::new(),
        types: HashMap::new(),
        refusal: None,
    };
    // Through PostgreSQL's walker, never by calling a walker directly: an ERROR raised deep in
    // the walk (stack depth, say) must come back through pgrx's FFI boundary as a catchable
    // error, not jump past the caller's PgTry.
    // SAFETY: the caller's contract; `walk` outlives the walk.
    unsafe {
        if !walk.check_query(query) {
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
        None => Ok(walk.relations),
    }
}

/// A relation a query names, with the alias it gives it there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationRef {
    /// As the parser folded it.
    pub name: String,
    pub alias: Option<String>,
}

/// The relations `sql` refers to, for repair hints; empty when it does not parse. The raw
/// parse runs no code.
pub fn relation_refs(sql: &str) -> Vec<RelationRef> {
    let Ok(text) = CString::new(sql) else {
        return Vec::new();
    };
    subxact::in_subtransaction(false, || {
        let mut refs: Vec<RelationRef> = Vec::new();
        // SAFETY: the grammar and PostgreSQL's raw walker; `refs` outlives the walk.
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
    if too_deep().is_some() {
        return true;
    }
    // SAFETY: PostgreSQL's raw walker passes raw parse nodes and our context.
    unsafe {
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
}

/// Statement kind, `INTO`, data-modifying CTEs and locking clauses, from the raw tree.
fn check_raw(statement: *mut pg_sys::Node) -> Result<(), Refusal> {
    // SAFETY: a raw statement from raw_parser; PostgreSQL's raw walker.
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
    // SAFETY: a raw parse node; its tag says which struct it is.
    unsafe {
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
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn raw_walker(node: *mut pg_sys::Node, context: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: PostgreSQL's raw walker passes raw parse nodes and our context.
    unsafe {
        if let Some(refusal) = too_deep().or_else(|| raw_node_refusal(node)) {
            *context.cast::<Option<Refusal>>() = Some(refusal);
            return true;
        }
        pg_sys::raw_expression_tree_walker(node, Some(raw_walker), context)
    }
}

/// State of the walk over the analyzed tree.
pub(crate) struct Walk {
    origin: Origin,
    allow_catalogs: bool,
    allowed: Allowed,
    /// Set for a superuser's call: the owners it may read from.
    trusted: Option<Trusted>,
    relations: Vec<pg_sys::Oid>,
    /// Types already decided in this statement, and why they were refused.
    types: HashMap<pg_sys::Oid, Option<String>>,
    refusal: Option<Refusal>,
}

/// Objects with OIDs below this were created by initdb.
pub(crate) fn builtin(oid: pg_sys::Oid) -> bool {
    oid.to_u32() < pg_sys::FirstNormalObjectId
}

/// Stack kept free below PostgreSQL's `max_stack_depth` when the guard's walks recurse: the
/// walks stop with a refusal before PostgreSQL's own check raises an ERROR inside them, which
/// every nested frame of the walk would then have to pass on.
const STACK_MARGIN: usize = 256 * 1024;

/// The refusal of a statement nested too deeply to walk, when the stack is nearly used up.
fn too_deep() -> Option<Refusal> {
    thread_local! {
        /// The backend's stack base, as PostgreSQL measures depth from it.
        static BASE: usize = {
            // SAFETY: reading the base back by setting and restoring it, on the backend's thread.
            unsafe {
                let base = pg_sys::set_stack_base();
                pg_sys::restore_stack_base(base);
                base as usize
            }
        };
    }
    let here = 0u8;
    let used = BASE.with(|base| base.abs_diff(&here as *const u8 as usize));
    // SAFETY: reading a setting.
    let limit = (unsafe { pg_sys::max_stack_depth }.max(100) as usize) * 1024;
    (used + STACK_MARGIN > limit).then(|| {
        Refusal::read(
            SqlState::STATEMENT_TOO_COMPLEX,
            "the query is nested too deeply to be checked".into(),
        )
    })
}

/// What the function policy needs to know about one function, from pg_proc.
pub(crate) struct FunctionFacts {
    schema: String,
    name: String,
    volatility: u8,
    builtin: bool,
    extension: Option<String>,
    type_support: bool,
    pub owner: pg_sys::Oid,
    aggregate: bool,
}

impl FunctionFacts {
    /// The facts of `function`, `None` when it is not in the catalog.
    pub(crate) unsafe fn of(function: pg_sys::Oid) -> Option<FunctionFacts> {
        // SAFETY: syscache look-ups, each released before returning.
        unsafe {
            let tuple = pg_sys::SearchSysCache1(
                pg_sys::SysCacheIdentifier::PROCOID as i32,
                pg_sys::Datum::from(function),
            );
            if tuple.is_null() {
                return None;
            }
            let form = pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_proc>(tuple);
            let internal = |t: pg_sys::Oid| t == pg_sys::CSTRINGOID || t == pg_sys::INTERNALOID;
            let arguments = &(*form).proargtypes;
            let type_support = internal((*form).prorettype)
                || arguments
                    .values
                    .as_slice(arguments.dim1.max(0) as usize)
                    .iter()
                    .any(|t| internal(*t));
            let namespace = (*form).pronamespace;
            let facts = FunctionFacts {
                schema: namespace_name(namespace),
                name: c_string((*form).proname.data.as_ptr()),
                volatility: (*form).provolatile as u8,
                builtin: builtin(function) && namespace.to_u32() == pg_sys::PG_CATALOG_NAMESPACE,
                extension: None,
                type_support,
                owner: (*form).proowner,
                aggregate: (*form).prokind as u8 == b'a',
            };
            pg_sys::ReleaseSysCache(tuple);
            let extension_oid = pg_sys::getExtensionOfObject(pg_sys::ProcedureRelationId, function);
            Some(FunctionFacts {
                extension: (extension_oid != pg_sys::InvalidOid)
                    .then(|| c_string(pg_sys::get_extension_name(extension_oid))),
                ..facts
            })
        }
    }

    pub(crate) fn policy(&self) -> policy::Function<'_> {
        policy::Function {
            schema: &self.schema,
            name: &self.name,
            volatility: self.volatility,
            builtin: self.builtin,
            extension: self.extension.as_deref(),
            type_support: self.type_support,
        }
    }

    /// `schema.name(argument types)`, as a refusal names it.
    pub(crate) fn signature(function: pg_sys::Oid) -> String {
        // SAFETY: formats a function that exists (its facts were just read).
        unsafe { c_string(pg_sys::format_procedure_qualified(function)) }
    }
}

/// Node kinds of an analyzed SELECT that carry a value (`exprType` knows them).
fn expression_kind(tag: pg_sys::NodeTag) -> bool {
    use pg_sys::NodeTag::*;
    matches!(
        tag,
        T_Var
            | T_Const
            | T_Param
            | T_Aggref
            | T_GroupingFunc
            | T_WindowFunc
            | T_SubscriptingRef
            | T_FuncExpr
            | T_NamedArgExpr
            | T_OpExpr
            | T_DistinctExpr
            | T_NullIfExpr
            | T_ScalarArrayOpExpr
            | T_BoolExpr
            | T_SubLink
            | T_FieldSelect
            | T_FieldStore
            | T_RelabelType
            | T_CoerceViaIO
            | T_ArrayCoerceExpr
            | T_ConvertRowtypeExpr
            | T_CollateExpr
            | T_CaseExpr
            | T_CaseTestExpr
            | T_ArrayExpr
            | T_RowExpr
            | T_RowCompareExpr
            | T_CoalesceExpr
            | T_MinMaxExpr
            | T_SQLValueFunction
            | T_XmlExpr
            | T_NullTest
            | T_BooleanTest
            | T_CoerceToDomain
            | T_CoerceToDomainValue
    ) || crate::compat::expression_kind(tag)
}

/// Node kinds of an analyzed SELECT that hold expressions without being one.
fn structural_kind(tag: pg_sys::NodeTag) -> bool {
    use pg_sys::NodeTag::*;
    matches!(
        tag,
        T_List
            | T_TargetEntry
            | T_FromExpr
            | T_JoinExpr
            | T_RangeTblRef
            | T_SetOperationStmt
            | T_CommonTableExpr
            | T_CaseWhen
            | T_TableSampleClause
    ) || crate::compat::structural_kind(tag)
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn analyzed_walker(node: *mut pg_sys::Node, context: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: PostgreSQL's walkers pass analyzed nodes and our `Walk`; each node is cast to the
    // struct its tag names.
    unsafe {
        let walk = &mut *context.cast::<Walk>();
        if let Some(refusal) = too_deep() {
            walk.refusal = Some(refusal);
            return true;
        }
        let tag = (*node).type_;
        if expression_kind(tag) && walk.check_type(pg_sys::exprType(node)) {
            return true;
        }
        match tag {
            pg_sys::NodeTag::T_Query => {
                let query = node.cast::<pg_sys::Query>();
                if walk.check_query(query) {
                    return true;
                }
                pg_sys::query_tree_walker(
                    query,
                    Some(analyzed_walker),
                    context,
                    pg_sys::QTW_EXAMINE_RTES_BEFORE as i32,
                )
            }
            // The walker goes on into the entry's subquery, functions, VALUES lists, table
            // function and TABLESAMPLE arguments.
            pg_sys::NodeTag::T_RangeTblEntry => walk.check_rte(node.cast()),
            pg_sys::NodeTag::T_RangeTblFunction => {
                let function = node.cast::<pg_sys::RangeTblFunction>();
                walk.check_types((*function).funccoltypes)
                    || pg_sys::expression_tree_walker(node, Some(analyzed_walker), context)
            }
            pg_sys::NodeTag::T_TableFunc => {
                walk.check_types((*node.cast::<pg_sys::TableFunc>()).coltypes)
                    || pg_sys::expression_tree_walker(node, Some(analyzed_walker), context)
            }
            // An aggregate's DISTINCT or ORDER BY: its operators run, out of the tree's sight.
            pg_sys::NodeTag::T_SortGroupClause => {
                let clause = node.cast::<pg_sys::SortGroupClause>();
                [(*clause).sortop, (*clause).eqop]
                    .into_iter()
                    .any(|op| op != pg_sys::InvalidOid && walk.check_operator(op))
            }
            // The conversion's input and output functions are the types' (checked above).
            pg_sys::NodeTag::T_CoerceViaIO | pg_sys::NodeTag::T_CoerceToDomain => {
                pg_sys::expression_tree_walker(node, Some(analyzed_walker), context)
            }
            tag if expression_kind(tag) || structural_kind(tag) => {
                if walk.check_operators(node, tag) {
                    return true;
                }
                if pg_sys::check_functions_in_node(node, Some(function_checker), context) {
                    return true;
                }
                pg_sys::expression_tree_walker(node, Some(analyzed_walker), context)
            }
            tag => {
                walk.refuse(format!(
                    "a query with a node of kind {tag:?} is not allowed in {}: the guard does not \
                     know what it runs",
                    walk.origin.what()
                ));
                true
            }
        }
    }
}

impl Walk {
    fn refuse(&mut self, message: String) {
        if self.refusal.is_none() {
            self.refusal = Some(Refusal::forbidden(message));
        }
    }

    /// Why `expression` (a domain's CHECK, say) is refused, walked like the query.
    unsafe fn expression_refusal(&mut self, expression: *mut pg_sys::Node) -> Option<String> {
        let earlier = self.refusal.take();
        // SAFETY: through PostgreSQL's walker, as everywhere in the walk: a one-element list,
        // so that the walker sees the expression itself.
        unsafe {
            let list = pg_sys::lappend(std::ptr::null_mut(), expression.cast());
            pg_sys::expression_tree_walker(
                list.cast(),
                Some(analyzed_walker),
                (self as *mut Walk).cast(),
            );
        }
        let found = std::mem::replace(&mut self.refusal, earlier);
        found.map(|refusal| refusal.error.message)
    }

    /// Checks each type of an OID list (column definition lists, XMLTABLE columns).
    unsafe fn check_types(&mut self, types: *mut pg_sys::List) -> bool {
        // SAFETY: an OID list of the analyzed tree.
        let types: Vec<pg_sys::Oid> =
            unsafe { PgList::<c_void>::from_pg(types).iter_oid().collect() };
        types.into_iter().any(|typ| unsafe { self.check_type(typ) })
    }

    /// A range table entry: relations (catalogs, trust, the extension's own reads), the column
    /// types of VALUES lists and CTEs, TABLESAMPLE methods.
    unsafe fn check_rte(&mut self, rte: *mut pg_sys::RangeTblEntry) -> bool {
        // SAFETY: an RTE of the analyzed tree.
        unsafe {
            match (*rte).rtekind {
                pg_sys::RTEKind::RTE_RELATION => {
                    let relid = (*rte).relid;
                    let schema = namespace_name(pg_sys::get_rel_namespace(relid));
                    if !self.allow_catalogs && policy::CATALOG_SCHEMAS.contains(&schema.as_str()) {
                        self.refuse(format!(
                            "relation {schema}.{} is not allowed in {}: system catalogs are not \
                             queryable (sql_query_engine.allow_system_catalogs is off); questions \
                             about the database's structure are answered from the schema shown",
                            c_string(pg_sys::get_rel_name(relid)),
                            self.origin.what(),
                        ));
                        return true;
                    }
                    let refused = match (self.origin, &self.trusted) {
                        (Origin::Own, _) => own_read_refusal(relid, (*rte).inh),
                        (Origin::Generated, Some(trusted)) => trusted.refuse_relation(relid),
                        (Origin::Generated, None) => None,
                    };
                    if let Some(why) = refused {
                        self.refuse(format!(
                            "relation {} is not allowed in {}: {why}",
                            relation_name(relid),
                            self.origin.what()
                        ));
                        return true;
                    }
                    self.relations.push(relid);
                    let sample = (*rte).tablesample;
                    !sample.is_null() && self.check_function((*sample).tsmhandler)
                }
                pg_sys::RTEKind::RTE_VALUES | pg_sys::RTEKind::RTE_CTE => {
                    self.check_types((*rte).coltypes)
                }
                _ => false,
            }
        }
    }

    /// A (sub)query that writes or locks rows, or sorts, groups or deduplicates with an
    /// operator that may not run; records the refusal and says whether there was one.
    unsafe fn check_query(&mut self, query: *mut pg_sys::Query) -> bool {
        // SAFETY: a Query of the analyzed tree.
        unsafe {
            if (*query).commandType != pg_sys::CmdType::CMD_SELECT
                || !(*query).utilityStmt.is_null()
            {
                self.refusal = Some(Refusal::write("data-modifying"));
                return true;
            }
            if !(*query).rowMarks.is_null() {
                self.refuse(
                    "a locking clause (FOR UPDATE/SHARE) is not allowed in a generated query"
                        .into(),
                );
                return true;
            }
            // Sort, group and DISTINCT operators are operator OIDs in the tree, not
            // expressions: the walker would not see their functions.
            let mut clauses = vec![
                (*query).sortClause,
                (*query).groupClause,
                (*query).distinctClause,
            ];
            for window in PgList::<pg_sys::WindowClause>::from_pg((*query).windowClause).iter_ptr()
            {
                clauses.push((*window).partitionClause);
                clauses.push((*window).orderClause);
            }
            for list in clauses {
                for clause in PgList::<pg_sys::SortGroupClause>::from_pg(list).iter_ptr() {
                    for operator in [(*clause).sortop, (*clause).eqop] {
                        if operator != pg_sys::InvalidOid && self.check_operator(operator) {
                            return true;
                        }
                    }
                }
            }
            false
        }
    }

    /// The operators an expression node applies, whose estimators the planner calls.
    unsafe fn check_operators(&mut self, node: *mut pg_sys::Node, tag: pg_sys::NodeTag) -> bool {
        // SAFETY: the node is of the struct its tag names.
        let operators: Vec<pg_sys::Oid> = unsafe {
            match tag {
                pg_sys::NodeTag::T_OpExpr
                | pg_sys::NodeTag::T_DistinctExpr
                | pg_sys::NodeTag::T_NullIfExpr => vec![(*node.cast::<pg_sys::OpExpr>()).opno],
                pg_sys::NodeTag::T_ScalarArrayOpExpr => {
                    vec![(*node.cast::<pg_sys::ScalarArrayOpExpr>()).opno]
                }
                pg_sys::NodeTag::T_RowCompareExpr => {
                    PgList::<c_void>::from_pg((*node.cast::<pg_sys::RowCompareExpr>()).opnos)
                        .iter_oid()
                        .collect()
                }
                _ => Vec::new(),
            }
        };
        operators
            .into_iter()
            .any(|operator| unsafe { self.check_operator(operator) })
    }

    /// A user-defined operator: its function and the planner's estimators for it.
    unsafe fn check_operator(&mut self, operator: pg_sys::Oid) -> bool {
        if builtin(operator) {
            return false;
        }
        // SAFETY: catalog look-ups of an operator the parser resolved.
        let functions = unsafe {
            [
                pg_sys::get_opcode(operator),
                pg_sys::get_oprrest(operator),
                pg_sys::get_oprjoin(operator),
            ]
        };
        functions
            .into_iter()
            .filter(|f| *f != pg_sys::InvalidOid)
            .any(|f| unsafe { self.check_function(f) })
    }

    /// Whether `function` is refused (the refusal is recorded); for a user aggregate that may
    /// run, its support functions and sort operator are checked too.
    unsafe fn check_function(&mut self, function: pg_sys::Oid) -> bool {
        // SAFETY: catalog look-ups of a function the parser resolved.
        let Some(facts) = (unsafe { FunctionFacts::of(function) }) else {
            self.refuse(format!("function {function} is not in the catalog"));
            return true;
        };
        let why = match self.origin {
            Origin::Own => (!facts.builtin)
                .then(|| "the extension's own reads call only built-in functions".to_string()),
            Origin::Generated => {
                policy::refuse(&facts.policy(), &self.allowed, self.allow_catalogs)
            }
        };
        if let Some(reason) = why {
            let signature = FunctionFacts::signature(function);
            self.refuse(format!(
                "function {signature} is not allowed in {}: {reason}",
                self.origin.what()
            ));
            return true;
        }
        if facts.aggregate && !facts.builtin {
            // SAFETY: catalog look-ups of an aggregate that exists.
            let (functions, sort_operator) = unsafe { aggregate_support(function) };
            return functions
                .into_iter()
                .any(|f| unsafe { self.check_function(f) })
                || sort_operator.is_some_and(|op| unsafe { self.check_operator(op) });
        }
        false
    }
}

/// Why the extension may not read `relation` on its own: reading it could run code (a view, a
/// row-security policy that applies), connect elsewhere (a foreign table, also as a partition
/// or child), or read its inheritance children (plain tables are read with ONLY).
unsafe fn own_read_refusal(relation: pg_sys::Oid, inheritance: bool) -> Option<String> {
    // SAFETY: catalog look-ups of a relation the parser locked.
    unsafe {
        let kind = pg_sys::get_rel_relkind(relation) as u8;
        let readable = match kind {
            pg_sys::RELKIND_RELATION => !inheritance,
            pg_sys::RELKIND_MATVIEW => true,
            pg_sys::RELKIND_PARTITIONED_TABLE => trust::inheritors(relation).into_iter().all(|p| {
                matches!(
                    pg_sys::get_rel_relkind(p) as u8,
                    pg_sys::RELKIND_RELATION | pg_sys::RELKIND_PARTITIONED_TABLE
                )
            }),
            _ => false,
        };
        if !readable {
            return Some(
                "only plain and partitioned tables and materialized views are read on the \
                 extension's own (views run their owner's code, foreign tables connect elsewhere)"
                    .into(),
            );
        }
        let row_security = pg_sys::check_enable_rls(relation, pg_sys::InvalidOid, true);
        (row_security != pg_sys::CheckEnableRlsResult::RLS_NONE as i32)
            .then(|| "row-level security applies to it: its policies run their owner's code".into())
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn function_checker(function: pg_sys::Oid, context: *mut c_void) -> bool {
    // SAFETY: called by check_functions_in_node with our `Walk`.
    unsafe {
        let walk = &mut *context.cast::<Walk>();
        if walk.check_function(function) {
            return true;
        }
        match default_arguments(function) {
            // A List: the walker visits each default expression (the planner inserts them into
            // the call, out of the analyzed tree's sight).
            Some(defaults) => {
                pg_sys::expression_tree_walker(defaults, Some(analyzed_walker), context)
            }
            None => false,
        }
    }
}

/// The transition, final, combine, (de)serialisation and moving-aggregate functions of an
/// aggregate, which run for it out of the tree's sight, and its sort operator.
unsafe fn aggregate_support(aggregate: pg_sys::Oid) -> (Vec<pg_sys::Oid>, Option<pg_sys::Oid>) {
    // pg_aggregate's aggtransfn .. aggmfinalfn are attributes 4 to 11, aggsortop 16 (the same
    // in PostgreSQL 11 to 18).
    const SUPPORT_ATTRIBUTES: std::ops::RangeInclusive<i16> = 4..=11;
    const SORT_OPERATOR: i16 = 16;
    let cache = pg_sys::SysCacheIdentifier::AGGFNOID as i32;
    // SAFETY: a syscache look-up, released before returning.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(cache, pg_sys::Datum::from(aggregate));
        if tuple.is_null() {
            return (Vec::new(), None);
        }
        let oid_at = |attribute: i16| {
            let mut is_null = true;
            let datum = pg_sys::SysCacheGetAttr(cache, tuple, attribute, &mut is_null);
            let oid = pg_sys::Oid::from(datum.value() as u32);
            (!is_null && oid != pg_sys::InvalidOid).then_some(oid)
        };
        let functions = SUPPORT_ATTRIBUTES.filter_map(oid_at).collect();
        let sort_operator = oid_at(SORT_OPERATOR);
        pg_sys::ReleaseSysCache(tuple);
        (functions, sort_operator)
    }
}

/// The function's default-argument expressions, when it has any.
unsafe fn default_arguments(function: pg_sys::Oid) -> Option<*mut pg_sys::Node> {
    // SAFETY: a syscache look-up, released before returning; the defaults are a node tree
    // PostgreSQL wrote.
    unsafe {
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
}

pub(crate) unsafe fn c_string(text: *const std::ffi::c_char) -> String {
    if text.is_null() {
        String::new()
    } else {
        // SAFETY: a NUL-terminated string PostgreSQL made.
        unsafe { CStr::from_ptr(text).to_string_lossy().into_owned() }
    }
}

unsafe fn namespace_name(namespace: pg_sys::Oid) -> String {
    // SAFETY: a catalog look-up; NULL for a schema that is gone.
    unsafe { c_string(pg_sys::get_namespace_name(namespace)) }
}

/// `schema.relation`, as a refusal names it.
pub(crate) fn relation_name(relation: pg_sys::Oid) -> String {
    // SAFETY: catalog look-ups; empty names for a relation that is gone.
    unsafe {
        format!(
            "{}.{}",
            namespace_name(pg_sys::get_rel_namespace(relation)),
            c_string(pg_sys::get_rel_name(relation))
        )
    }
}

/// The statement's command tag, as psql would print it (`DELETE`, `CREATE TABLE`, ...).
fn command_name(node: *mut pg_sys::Node) -> String {
    // SAFETY: a raw statement node; the tag name is a static string.
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
