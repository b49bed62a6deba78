//! The walk over an analyzed tree: every function, operator, type and relation a query reaches,
//! against the policy of who wrote it (`Origin`). Fail closed: a node kind the walk does not
//! know is refused.

use std::collections::HashMap;
use std::ffi::c_void;
use std::rc::Rc;

use pgrx::pg_sys;
use pgrx::PgList;

use super::bodies;
use super::cost;
use super::facts::{
    aggregate_support, builtin, default_arguments, expression_kind, family_code, operator_code,
    operator_name, operator_owner, result_column_types, row_fields, type_name, CacheList,
    FunctionFacts, OpenRelation, MAX_FAMILY_SUPPORT, MAX_LINKED_OPERATORS,
};
use super::policy::{self, Allowed};
use super::trust::{self, Trusted};
use super::types::{self, TypePolicy};
use super::verdict::{Origin, Refusal};
use crate::error::SqlState;
use crate::names::{c_string, namespace_name, relation_name};
use crate::settings;

/// Whether the built-in type `typ` is polymorphic, or an array of or a row (a system
/// catalog's or view's) with a polymorphic field.
fn polymorphic_in(typ: pg_sys::Oid) -> bool {
    polymorphic_in_at(typ, 0)
}

fn polymorphic_in_at(typ: pg_sys::Oid, depth: usize) -> bool {
    if POLYMORPHIC.contains(&typ) {
        return true;
    }
    // SAFETY: a catalog look-up of a built-in type.
    let element = unsafe { pg_sys::get_element_type(typ) };
    if element != pg_sys::InvalidOid {
        return POLYMORPHIC.contains(&element)
            || (element != typ && builtin(element) && polymorphic_row(element, depth));
    }
    polymorphic_row(typ, depth)
}

/// Whether `typ` is a row type with a field of a polymorphic type, or of a built-in type that
/// holds one.
fn polymorphic_row(typ: pg_sys::Oid, depth: usize) -> bool {
    // A field of a built-in row or array type is followed (pg_statistic_ext_data holds
    // pg_statistic[]); built-in types nest only a few levels.
    row_fields(typ).is_some_and(|fields| {
        fields.into_iter().any(|field| {
            POLYMORPHIC.contains(&field)
                || (depth < 4 && builtin(field) && polymorphic_in_at(field, depth + 1))
        })
    })
}

/// The polymorphic pseudo-types, whose values' actual types are known only as a query runs.
const POLYMORPHIC: [pg_sys::Oid; 11] = [
    pg_sys::ANYARRAYOID,
    pg_sys::ANYELEMENTOID,
    pg_sys::ANYNONARRAYOID,
    pg_sys::ANYENUMOID,
    pg_sys::ANYRANGEOID,
    pg_sys::ANYMULTIRANGEOID,
    pg_sys::ANYCOMPATIBLEOID,
    pg_sys::ANYCOMPATIBLEARRAYOID,
    pg_sys::ANYCOMPATIBLENONARRAYOID,
    pg_sys::ANYCOMPATIBLERANGEOID,
    pg_sys::ANYCOMPATIBLEMULTIRANGEOID,
];

/// Functions that fill a row of the type of a row they are given from text: the built-ins' names
/// and hstore's C function (`populate_record`, `#=`).
const ROW_FILLERS: &[&str] = &[
    "json_populate_record",
    "json_populate_recordset",
    "jsonb_populate_record",
    "jsonb_populate_recordset",
    "jsonb_populate_record_valid",
    "hstore:hstore_populate_record",
];

/// Stack kept free below PostgreSQL's `max_stack_depth` when the guard's walks recurse: the
/// walks stop with a refusal before PostgreSQL's own check raises an ERROR inside them, which
/// every nested frame of the walk would then have to pass on.
const STACK_MARGIN: usize = 256 * 1024;

/// The refusal of a statement nested too deeply to walk, when the stack is nearly used up.
pub fn too_deep() -> Option<Refusal> {
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

/// State of the walk over the analyzed tree.
struct Walk {
    origin: Origin,
    allow_catalogs: bool,
    allowed: Rc<Allowed>,
    /// Set for a superuser's call: the owners it may read from.
    trusted: Option<Trusted>,
    /// The view whose stored query this is, which names the view itself (as OLD and NEW
    /// before PostgreSQL 16): not a relation it reads.
    view: Option<pg_sys::Oid>,
    relations: Vec<pg_sys::Oid>,
    /// Types already decided in this statement, and why they were refused.
    types: HashMap<pg_sys::Oid, Option<String>>,
    /// Operator families whose support functions passed in this statement.
    families: Vec<pg_sys::Oid>,
    /// What the bodies of functions not built in call that a cost rule is about, as read in
    /// this statement (`bodies`).
    bodies: HashMap<pg_sys::Oid, Option<String>>,
    refusal: Option<Refusal>,
}

/// Walks an analyzed tree with the policy of `origin`: the relations it names, or why it may
/// not run. `view`: the view whose stored query it is, if it is one.
///
/// # Safety
/// `query` must be an analyzed Query of the current transaction.
pub unsafe fn check_tree(
    query: *mut pg_sys::Query,
    origin: Origin,
    allowed: Allowed,
    trusted: Option<&Trusted>,
    view: Option<pg_sys::Oid>,
) -> Result<Vec<pg_sys::Oid>, Refusal> {
    // A generated query of a role that is no superuser: its types and operators are judged by
    // their owners (`trust::objects_of`).
    let objects = (origin == Origin::Generated && trusted.is_none())
        // SAFETY: the caller's contract.
        .then(|| unsafe { trust::objects_of(query) });
    let mut walk = Walk::new(origin, allowed, trusted.or(objects.as_ref()), view);
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

/// Why a literal of one of `types` may not be converted while a generated query is analysed
/// (see `ahead`): the CHECK of a domain its input code would run is refused, walked like the
/// query.
pub fn literals_refusal(
    types: &[pg_sys::Oid],
    allowed: Allowed,
    trusted: Option<&Trusted>,
) -> Result<(), Refusal> {
    let origin = Origin::Generated;
    let mut walk = Walk::new(origin, allowed, trusted, None);
    let policy = walk.type_policy();
    for &typ in types {
        pgrx::check_for_interrupts!();
        let why = types::literal_refusal(&policy, typ, &mut |expression| {
            // SAFETY: a CHECK expression read from the catalog, a plain node tree.
            unsafe { walk.expression_refusal(expression) }
        });
        if let Some(why) = why {
            return Err(Refusal::forbidden(format!(
                "type {} is not allowed in {}: {why}",
                type_name(typ),
                origin.what()
            )));
        }
    }
    Ok(())
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
        if expression_kind(tag) {
            let typ = pg_sys::exprType(node);
            // What a function called by name returns as such a value is its own to answer for
            // (`to_regtype` is refused by name, its policy says why; `pg_typeof` names no
            // code), but not a record or an array that holds one, which a function may fill
            // from text (`jsonb_populate_record` of a row type with a `regtype` column runs
            // the named type's modifier function), nor a conversion that calls a function
            // (`int8` to `regconfig` goes through `oid`); a constant is converted, and seen,
            // as the query is analysed.
            let produced = match tag {
                // A constant of a type that holds such a value (a row type with a `regtype`
                // field) is a function's pattern to fill from text as the query runs
                // (`jsonb_populate_record_valid(NULL::t, ...)`, whose result holds none), and so
                // is an anonymous row of such fields (`ROW(NULL::regtype)`).
                pg_sys::NodeTag::T_Const => {
                    if !types::is_code_naming(typ) && walk.refuse_code_naming_holder(typ) {
                        return true;
                    }
                    true
                }
                pg_sys::NodeTag::T_RowExpr => {
                    let fields =
                        PgList::<pg_sys::Node>::from_pg((*node.cast::<pg_sys::RowExpr>()).args);
                    if fields
                        .iter_ptr()
                        .any(|field| walk.refuse_code_naming_holder(pg_sys::exprType(field)))
                    {
                        return true;
                    }
                    false
                }
                pg_sys::NodeTag::T_FuncExpr => {
                    (*node.cast::<pg_sys::FuncExpr>()).funcformat
                        == pg_sys::CoercionForm::COERCE_EXPLICIT_CALL
                        && types::is_code_naming(typ)
                }
                _ => false,
            };
            if !produced && walk.refuse_code_naming(typ) {
                return true;
            }
            if walk.check_type(typ) {
                return true;
            }
            if walk.refuse_anonymous_pattern(node, tag) {
                return true;
            }
            if walk.refuse_looked_up(node, tag, typ) {
                return true;
            }
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
            // Columns a table function converts from text (a column definition list, JSON_TABLE,
            // XMLTABLE) are values computed as the query runs.
            pg_sys::NodeTag::T_RangeTblFunction => {
                let function = node.cast::<pg_sys::RangeTblFunction>();
                walk.refuse_code_naming_in((*function).funccoltypes)
                    || walk.check_types((*function).funccoltypes)
                    || walk.check_collations((*function).funccolcollations)
                    || pg_sys::expression_tree_walker(node, Some(analyzed_walker), context)
            }
            pg_sys::NodeTag::T_TableFunc => {
                let coltypes = (*node.cast::<pg_sys::TableFunc>()).coltypes;
                walk.refuse_code_naming_in(coltypes)
                    || walk.check_types(coltypes)
                    || walk.check_collations((*node.cast::<pg_sys::TableFunc>()).colcollations)
                    || pg_sys::expression_tree_walker(node, Some(analyzed_walker), context)
                    || walk.check_table_cost(node.cast())
            }
            // An aggregate's DISTINCT or ORDER BY: its operators run, out of the tree's sight.
            pg_sys::NodeTag::T_SortGroupClause => {
                let clause = node.cast::<pg_sys::SortGroupClause>();
                [(*clause).sortop, (*clause).eqop]
                    .into_iter()
                    .any(|op| op != pg_sys::InvalidOid && walk.check_operator(op))
            }
            // A collation named by COLLATE (a column's is its table owner's choice).
            pg_sys::NodeTag::T_CollateExpr => {
                let collation = (*node.cast::<pg_sys::CollateExpr>()).collOid;
                walk.check_collation(collation)
                    || pg_sys::expression_tree_walker(node, Some(analyzed_walker), context)
            }
            // The conversion's input and output functions are the types' (checked above).
            pg_sys::NodeTag::T_CoerceViaIO | pg_sys::NodeTag::T_CoerceToDomain => {
                pg_sys::expression_tree_walker(node, Some(analyzed_walker), context)
            }
            tag if expression_kind(tag) || structural_kind(tag) => {
                if walk.check_operators(node, tag) || walk.check_cost(node, tag) {
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

/// The type of `expression` when its values may hold values written by catalog look-ups inside
/// another value (`types::holds_looked_up`): also a record or an array of records, whose
/// fields the tree does not say (a subquery's whole row), unless it is a row whose fields are
/// written out in the query and hold none.
///
/// # Safety
/// `expression` is an analysed expression.
unsafe fn may_hold_looked_up(expression: *mut pg_sys::Node) -> Option<pg_sys::Oid> {
    // SAFETY: the caller's contract; a row's fields are analysed expressions too.
    unsafe {
        let typ = pg_sys::exprType(expression);
        if types::holds_looked_up(typ) {
            return Some(typ);
        }
        if typ != pg_sys::RECORDOID && typ != pg_sys::RECORDARRAYOID {
            return None;
        }
        if (*expression).type_ == pg_sys::NodeTag::T_RowExpr {
            return PgList::<pg_sys::Node>::from_pg((*expression.cast::<pg_sys::RowExpr>()).args)
                .iter_ptr()
                .find_map(|field| may_hold_looked_up(field));
        }
        Some(typ)
    }
}

impl Walk {
    fn new(
        origin: Origin,
        allowed: Allowed,
        trusted: Option<&Trusted>,
        view: Option<pg_sys::Oid>,
    ) -> Walk {
        Walk {
            origin,
            allow_catalogs: origin == Origin::Generated && settings::allow_system_catalogs(),
            allowed: Rc::new(allowed),
            trusted: trusted.cloned(),
            view,
            relations: Vec::new(),
            types: HashMap::new(),
            families: Vec::new(),
            bodies: HashMap::new(),
            refusal: None,
        }
    }

    /// The policy the types of this walk are checked with.
    fn type_policy(&self) -> TypePolicy {
        TypePolicy {
            origin: self.origin,
            allowed: Rc::clone(&self.allowed),
            allow_catalogs: self.allow_catalogs,
            trusted: self.trusted.clone(),
        }
    }

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

    /// Whether `typ` is refused here (`types.rs`); records the refusal.
    fn check_type(&mut self, typ: pg_sys::Oid) -> bool {
        if typ == pg_sys::InvalidOid {
            return false;
        }
        if builtin(typ) {
            // A value of anyarray (the statistics' arrays), or a catalog's row holding one, has
            // its element type only as the query runs: what a function taking it runs for that
            // type (a cast to json that another role made, say) is not in the tree to be
            // checked. Other types cannot hold one (a column of a pseudo-type is refused).
            let polymorphic = self
                .types
                .entry(typ)
                .or_insert_with(|| polymorphic_in(typ).then(String::new))
                .is_some();
            if polymorphic {
                self.refuse(format!(
                    "values of type {} are not allowed in {}: what runs for them depends on a \
                     type known only as the query runs (anyarray)",
                    type_name(typ),
                    self.origin.what()
                ));
                return true;
            }
            return false;
        }
        let policy = self.type_policy();
        let mut memo = std::mem::take(&mut self.types);
        let why = types::refusal(&policy, typ, &mut memo, &mut |expression| {
            // SAFETY: a CHECK expression PostgreSQL gave, a plain node tree.
            unsafe { self.expression_refusal(expression) }
        });
        self.types.extend(memo);
        match why {
            Some(why) => {
                self.refuse(format!(
                    "type {} is not allowed in {}: {why}",
                    type_name(typ),
                    self.origin.what()
                ));
                true
            }
            None => false,
        }
    }

    /// Checks each type of an OID list (column definition lists, XMLTABLE columns).
    /// A value that names code, computed as the query runs (`names_code`): refused. A constant
    /// is converted, and seen, as the query is analysed.
    fn refuse_code_naming(&mut self, typ: pg_sys::Oid) -> bool {
        if typ == pg_sys::InvalidOid || !types::names_code(typ) {
            return false;
        }
        self.refuse(format!(
            "a value of type {} computed as the query runs names code out of the guard's sight \
             (a type's modifier function, a text search configuration's parser and \
             dictionaries); name it as a constant",
            type_name(typ)
        ));
        true
    }

    /// A value of `typ` (or a row field of it) that is or holds a value naming code, which a
    /// function given it may fill from text as the query runs: refused, constant or not.
    fn refuse_code_naming_holder(&mut self, typ: pg_sys::Oid) -> bool {
        if typ == pg_sys::InvalidOid || !types::names_code(typ) {
            return false;
        }
        self.refuse(format!(
            "a value of type {} holds a value that names code out of the guard's sight (a \
             type's modifier function, a text search configuration's parser and dictionaries), \
             which a function given it may fill from text as the query runs",
            type_name(typ)
        ));
        true
    }

    /// Values written by catalog look-ups (`regclass`, `aclitem`: `types::is_looked_up`) inside
    /// an array, a row or a range that the query builds (`array_agg`, `ARRAY[...]`, a cast, a
    /// function's result), or that it gives a call that writes it out or may (a cast to text,
    /// `array_to_string`, `format`, `to_jsonb`, XML): one call writes them all out, with no check
    /// for cancel between them, each a catalog cache look-up that another call may have made
    /// walk some 65,000 entries of OIDs that hash alike; millions of them kept the backend deaf
    /// to cancel for minutes. A column that holds them as stored is read (the rows collected
    /// count them: `exec::MAX_LOOKED_UP_PER_ROW`), measured or compared (`cardinality`,
    /// `unnest`, `= ANY`, `@>`), not written out in the query.
    unsafe fn refuse_looked_up(
        &mut self,
        node: *mut pg_sys::Node,
        tag: pg_sys::NodeTag,
        typ: pg_sys::Oid,
    ) -> bool {
        /// Built-ins that measure, compare or take apart such a value without writing its
        /// elements out.
        const ONLY_READ: [&str; 22] = [
            "array_length",
            "cardinality",
            "array_ndims",
            "array_dims",
            "array_lower",
            "array_upper",
            "unnest",
            "array_position",
            "array_positions",
            "arraycontains",
            "arraycontained",
            "arrayoverlap",
            "array_eq",
            "array_ne",
            "array_lt",
            "array_gt",
            "array_le",
            "array_ge",
            "btarraycmp",
            "count",
            "aclexplode",
            "aclcontains",
        ];
        if self.origin != Origin::Generated {
            return false;
        }
        // SAFETY: the node is of the struct its tag names; its parts are analysed expressions.
        unsafe {
            let built = match tag {
                pg_sys::NodeTag::T_Var | pg_sys::NodeTag::T_Const => None,
                pg_sys::NodeTag::T_RowExpr => {
                    PgList::<pg_sys::Node>::from_pg((*node.cast::<pg_sys::RowExpr>()).args)
                        .iter_ptr()
                        .map(|field| pg_sys::exprType(field))
                        .find(|field| types::holds_looked_up(*field))
                }
                _ => Some(typ).filter(|typ| types::holds_looked_up(*typ)),
            };
            if let Some(held) = built {
                self.refuse(format!(
                    "a value of type {} built as the query runs is not allowed in {}: its \
                     elements are each looked up in the catalog as it is written out, by one call \
                     that checks no cancel; select them as rows (unnest, a join) or as OIDs",
                    type_name(held),
                    self.origin.what()
                ));
                return true;
            }
            let (function, arguments) = match tag {
                pg_sys::NodeTag::T_FuncExpr => {
                    let call = node.cast::<pg_sys::FuncExpr>();
                    (Some((*call).funcid), (*call).args)
                }
                pg_sys::NodeTag::T_OpExpr
                | pg_sys::NodeTag::T_DistinctExpr
                | pg_sys::NodeTag::T_NullIfExpr => {
                    let call = node.cast::<pg_sys::OpExpr>();
                    (Some(pg_sys::get_opcode((*call).opno)), (*call).args)
                }
                pg_sys::NodeTag::T_Aggref => {
                    let call = node.cast::<pg_sys::Aggref>();
                    (Some((*call).aggfnoid), (*call).args)
                }
                pg_sys::NodeTag::T_WindowFunc => {
                    let call = node.cast::<pg_sys::WindowFunc>();
                    (Some((*call).winfnoid), (*call).args)
                }
                pg_sys::NodeTag::T_XmlExpr => (None, (*node.cast::<pg_sys::XmlExpr>()).args),
                // A conversion through text (`regs::text`), or of each element (`regs::text[]`).
                pg_sys::NodeTag::T_CoerceViaIO | pg_sys::NodeTag::T_ArrayCoerceExpr => {
                    let argument = match tag {
                        pg_sys::NodeTag::T_CoerceViaIO => (*node.cast::<pg_sys::CoerceViaIO>()).arg,
                        _ => {
                            let coerce = node.cast::<pg_sys::ArrayCoerceExpr>();
                            // Each element relabelled (`regs::oid[]`) is not written out.
                            let element = (*coerce).elemexpr.cast::<pg_sys::Node>();
                            if matches!(
                                element.as_ref().map(|e| e.type_),
                                Some(
                                    pg_sys::NodeTag::T_RelabelType
                                        | pg_sys::NodeTag::T_CaseTestExpr
                                )
                            ) {
                                return false;
                            }
                            (*coerce).arg
                        }
                    };
                    let Some(held) = may_hold_looked_up(argument.cast()) else {
                        return false;
                    };
                    self.refuse(format!(
                        "a value of type {} may not be converted in {}: its elements are each \
                         looked up in the catalog as it is written out, by one call that checks \
                         no cancel; select them as rows (unnest, a join) or as OIDs",
                        type_name(held),
                        self.origin.what()
                    ));
                    return true;
                }
                _ => return false,
            };
            if function
                .and_then(cost::builtin_name)
                .is_some_and(|name| ONLY_READ.contains(&name.as_str()))
            {
                return false;
            }
            let given = PgList::<pg_sys::Node>::from_pg(arguments)
                .iter_ptr()
                .find_map(|argument| match (*argument).type_ {
                    // An aggregate's arguments are target entries.
                    pg_sys::NodeTag::T_TargetEntry => {
                        may_hold_looked_up((*argument.cast::<pg_sys::TargetEntry>()).expr.cast())
                    }
                    _ => may_hold_looked_up(argument),
                });
            let Some(held) = given else {
                return false;
            };
            self.refuse(format!(
                "a value of type {} may not be given to {} in {}: its elements are each looked \
                 up in the catalog as it is written out, by one call that checks no cancel; \
                 select them as rows (unnest, a join) or as OIDs",
                type_name(held),
                match function {
                    Some(function) => format!("function {}", FunctionFacts::signature(function)),
                    None => "an XML function".to_string(),
                },
                self.origin.what()
            ));
            true
        }
    }

    /// A function that fills a row from text (`jsonb_populate_record` and its kin, hstore's
    /// `populate_record` and `#=`) given an anonymous row as its pattern (a whole row of a
    /// subquery, a VALUES list, a CTE or a join, `record` to the walk): the row's fields, which
    /// the function converts text to as the query runs, may name code (`(SELECT
    /// NULL::regtype AS t) s`), and no type in the tree says which they are.
    unsafe fn refuse_anonymous_pattern(
        &mut self,
        node: *mut pg_sys::Node,
        tag: pg_sys::NodeTag,
    ) -> bool {
        // SAFETY: the node is of the struct its tag names.
        let (function, arguments) = unsafe {
            match tag {
                pg_sys::NodeTag::T_FuncExpr => {
                    let call = node.cast::<pg_sys::FuncExpr>();
                    ((*call).funcid, (*call).args)
                }
                pg_sys::NodeTag::T_OpExpr => {
                    let call = node.cast::<pg_sys::OpExpr>();
                    (pg_sys::get_opcode((*call).opno), (*call).args)
                }
                _ => return false,
            }
        };
        let Some(name) = cost::rule_name(function) else {
            return false;
        };
        if !ROW_FILLERS.contains(&name.as_str()) {
            return false;
        }
        // SAFETY: the call's analysed argument list.
        let anonymous = unsafe { PgList::<pg_sys::Node>::from_pg(arguments) }
            .iter_ptr()
            // SAFETY: analysed expressions.
            .any(|argument| unsafe { pg_sys::exprType(argument) } == pg_sys::RECORDOID);
        if anonymous {
            self.refuse(format!(
                "{name} is not allowed in {} with an anonymous row (a subquery's, a VALUES \
                 list's, a join's): it converts text to the row's fields as the query runs, \
                 which may name code out of the guard's sight; give a row type by name",
                self.origin.what()
            ));
        }
        anonymous
    }

    /// `refuse_code_naming` of each type of an OID list of the analyzed tree.
    unsafe fn refuse_code_naming_in(&mut self, types: *mut pg_sys::List) -> bool {
        // SAFETY: an OID list of the analyzed tree.
        let types: Vec<pg_sys::Oid> = unsafe { PgList::<c_void>::from_pg(types) }
            .iter_oid()
            .collect();
        types.into_iter().any(|typ| self.refuse_code_naming(typ))
    }

    unsafe fn check_types(&mut self, types: *mut pg_sys::List) -> bool {
        let types: Vec<pg_sys::Oid> = {
            // SAFETY: an OID list of the analyzed tree.
            unsafe { PgList::<c_void>::from_pg(types) }
                .iter_oid()
                .collect()
        };
        types.into_iter().any(|typ| self.check_type(typ))
    }

    /// A range table entry: relations (catalogs, trust, the extension's own reads), the column
    /// types of VALUES lists and CTEs, TABLESAMPLE methods.
    unsafe fn check_rte(&mut self, rte: *mut pg_sys::RangeTblEntry) -> bool {
        // SAFETY: an RTE of the analyzed tree.
        unsafe {
            match (*rte).rtekind {
                pg_sys::RTEKind::RTE_RELATION => {
                    let relid = (*rte).relid;
                    if Some(relid) == self.view {
                        return false;
                    }
                    let schema =
                        namespace_name(pg_sys::get_rel_namespace(relid)).unwrap_or_default();
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
                        (Origin::Generated, Some(trusted)) if trusted.judges_code() => {
                            trusted.refuse_relation(relid)
                        }
                        (Origin::Generated, _) => None,
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
                    // The built-in methods (BERNOULLI, SYSTEM) only choose rows; another
                    // method's handler is checked as any function (returning tsm_handler, it
                    // is allowed only by name).
                    let sample = (*rte).tablesample;
                    !sample.is_null() && {
                        let handler = (*sample).tsmhandler;
                        !FunctionFacts::of(handler).is_some_and(|f| f.builtin)
                            && self.check_function(handler)
                    }
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
            // UNION, INTERSECT and EXCEPT compare their columns with these (PostgreSQL's own
            // walker skips them).
            let mut operations = vec![(*query).setOperations];
            while let Some(node) = operations.pop() {
                if node.is_null() || (*node).type_ != pg_sys::NodeTag::T_SetOperationStmt {
                    continue;
                }
                let operation = node.cast::<pg_sys::SetOperationStmt>();
                clauses.push((*operation).groupClauses);
                operations.push((*operation).larg);
                operations.push((*operation).rarg);
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
            .any(|operator| self.check_operator(operator))
    }

    /// A built-in call whose work can grow faster than what it is given, without a check for
    /// cancel, made other than `cost` allows (a superuser may allow the function by name).
    unsafe fn check_cost(&mut self, node: *mut pg_sys::Node, tag: pg_sys::NodeTag) -> bool {
        if self.origin != Origin::Generated {
            return false;
        }
        // SAFETY: the node is of the struct its tag names; its function is looked up.
        unsafe {
            let (function, arguments, collation) = match tag {
                pg_sys::NodeTag::T_FuncExpr => {
                    let call = node.cast::<pg_sys::FuncExpr>();
                    ((*call).funcid, (*call).args, (*call).inputcollid)
                }
                pg_sys::NodeTag::T_OpExpr
                | pg_sys::NodeTag::T_DistinctExpr
                | pg_sys::NodeTag::T_NullIfExpr => {
                    let call = node.cast::<pg_sys::OpExpr>();
                    (
                        pg_sys::get_opcode((*call).opno),
                        (*call).args,
                        (*call).inputcollid,
                    )
                }
                // `x op ANY (array)`: the operator's function on the scalar and each element,
                // the array one side (a small constant only when the whole array is).
                pg_sys::NodeTag::T_ScalarArrayOpExpr => {
                    let call = node.cast::<pg_sys::ScalarArrayOpExpr>();
                    (
                        pg_sys::get_opcode((*call).opno),
                        (*call).args,
                        (*call).inputcollid,
                    )
                }
                _ => {
                    let Some(path) = crate::compat::json_path(node) else {
                        return false;
                    };
                    let Some(why) = cost::path_refusal(path) else {
                        return false;
                    };
                    self.refuse(format!(
                        "a SQL/JSON query function is not allowed in {} this way: {why}",
                        self.origin.what()
                    ));
                    return true;
                }
            };
            // Most calls are of no rule's: told by name before the function's facts are read
            // (check_function reads them for every call already). A function that is not
            // built in may call one in its body: an extension's is held to the rule of its own
            // name when one has it (citext's `strpos`), any other refused.
            let ruled = cost::rule_name(function).filter(|name| cost::has_rule(name));
            let in_body = match ruled {
                Some(_) => None,
                None => match self.ruled_in_body(function) {
                    Some(called) => Some(called),
                    None => return false,
                },
            };
            let Some(facts) = FunctionFacts::of(function) else {
                return false;
            };
            if self.allowed.names(&facts.policy()) {
                return false;
            }
            let own_rule = facts.extension().is_some()
                && cost::has_rule_for(facts.name(), PgList::<c_void>::from_pg(arguments).len());
            let why = match (ruled, in_body) {
                (Some(name), _) => cost::call_refusal(&name, arguments, collation),
                (None, Some(called)) => match own_rule {
                    true => cost::call_refusal(facts.name(), arguments, collation),
                    false => Some(format!(
                        "its body calls {called}, whose work can grow faster than what it is \
                         given without a check for cancel (a superuser may allow the function \
                         by name in sql_query_engine.allowed_functions)"
                    )),
                },
                (None, None) => None,
            };
            let Some(why) = why else {
                return false;
            };
            self.refuse(format!(
                "function {} is not allowed in {} this way: {why}",
                FunctionFacts::signature(function),
                self.origin.what()
            ));
            true
        }
    }

    /// A collation the query names (COLLATE, a column definition list's) that
    /// `trust::collation_refusal` refuses.
    fn check_collation(&mut self, collation: pg_sys::Oid) -> bool {
        let Some(why) = trust::collation_refusal(collation) else {
            return false;
        };
        self.refuse(format!(
            "collation {} is not allowed in {}: {why}",
            trust::collation_name(collation),
            self.origin.what()
        ));
        true
    }

    /// What a rule of `cost` is about that the body of `function` calls (`bodies`), decided
    /// once per function in a statement. Only a superuser's function's body is read: no other
    /// role's function is allowed but by name, which `check_cost` leaves to its allower, and
    /// `check_function` refuses the rest (a body is text another role chose, of any number of
    /// words to look up).
    fn ruled_in_body(&mut self, function: pg_sys::Oid) -> Option<String> {
        if builtin(function) {
            return None;
        }
        if let Some(decided) = self.bodies.get(&function) {
            return decided.clone();
        }
        let decided = FunctionFacts::of(function)
            .is_some_and(|facts| facts.superuser_owned())
            .then(|| bodies::ruled_call_in_body(function))
            .flatten();
        self.bodies.insert(function, decided.clone());
        decided
    }

    /// Why `function`, run where no call shows its arguments (an aggregate's support function,
    /// an operator's function used to sort or group), may not run: what its body calls is
    /// something a rule of `cost` is about, or, with `itself`, a rule is about it (an
    /// operator's own C function is judged with its arguments where it is applied, by
    /// `check_cost`); None for a built-in or when the setting names it.
    fn unseen_cost_refusal(&mut self, function: pg_sys::Oid, itself: bool) -> Option<String> {
        if self.origin != Origin::Generated {
            return None;
        }
        let ruled = cost::rule_name(function).filter(|name| itself && cost::has_rule(name));
        let called = match ruled {
            Some(name) => name,
            None if builtin(function) => return None,
            None => self.ruled_in_body(function)?,
        };
        let facts = FunctionFacts::of(function)?;
        (!self.allowed.names(&facts.policy())).then(|| {
            format!(
                "function {} calls {called}, whose work can grow faster than what it is given \
                 without a check for cancel, where no call shows its arguments (a superuser \
                 may allow it by name in sql_query_engine.allowed_functions)",
                FunctionFacts::signature(function)
            )
        })
    }

    /// `check_collation` for each of a list of collations (OIDs).
    unsafe fn check_collations(&mut self, collations: *mut pg_sys::List) -> bool {
        let collations: Vec<pg_sys::Oid> = {
            // SAFETY: an OID list of the analysed tree, or null.
            unsafe { PgList::<c_void>::from_pg(collations).iter_oid().collect() }
        };
        collations
            .into_iter()
            .any(|collation| self.check_collation(collation))
    }

    /// XMLTABLE, or a JSON_TABLE whose paths `cost` refuses.
    unsafe fn check_table_cost(&mut self, table: *mut pg_sys::TableFunc) -> bool {
        if self.origin != Origin::Generated {
            return false;
        }
        // SAFETY: an analysed TableFunc; its paths are analysed constants.
        let why = unsafe {
            match crate::compat::table_function(table) {
                crate::compat::TableFunction::XmlTable => Some(
                    "XMLTABLE is not allowed in a generated query: an XPath expression can take \
                     a time that grows with a power of the document's size, and libxml2 does \
                     not check for cancel until it ends"
                        .to_string(),
                ),
                crate::compat::TableFunction::JsonTable(paths) => paths
                    .into_iter()
                    .find_map(|path| cost::path_refusal(path))
                    .map(|why| {
                        format!("JSON_TABLE is not allowed in a generated query this way: {why}")
                    }),
            }
        };
        match why {
            Some(why) => {
                self.refuse(why);
                true
            }
            None => false,
        }
    }

    /// A user-defined operator: its function and the planner's estimators for it, and the same
    /// of every operator linked to it as its commutator or negator, however far: the planner
    /// turns `NOT (a op b)` into `a negator b`, and its estimators call the commutator's and
    /// the negator's functions on column statistics while planning.
    fn check_operator(&mut self, operator: pg_sys::Oid) -> bool {
        let mut seen: Vec<pg_sys::Oid> = Vec::new();
        let mut next = vec![operator];
        while let Some(operator) = next.pop() {
            if operator == pg_sys::InvalidOid || seen.contains(&operator) {
                continue;
            }
            seen.push(operator);
            if seen.len() > MAX_LINKED_OPERATORS {
                self.refuse(format!(
                    "operator {} is linked to more than {MAX_LINKED_OPERATORS} others",
                    operator_name(operator)
                ));
                return true;
            }
            let functions = operator_code(operator);
            // SAFETY: catalog look-ups of an operator the parser resolved, or one linked to it
            // (InvalidOid for one that is gone).
            next.extend(unsafe {
                [
                    pg_sys::get_commutator(operator),
                    pg_sys::get_negator(operator),
                ]
            });
            // Sorts, hashed set operations, merge and hash joins call the support functions
            // of the operator's families in its place: a built-in operator too, put in a
            // family a superuser made with another role's functions.
            if self.check_families(operator) {
                return true;
            }
            if builtin(operator) {
                continue;
            }
            // Its function runs where no call shows its arguments when it sorts or groups.
            if let Some(why) = self.unseen_cost_refusal(functions[0], false) {
                self.refuse(format!(
                    "operator {} is not allowed in {}: {why}",
                    operator_name(operator),
                    self.origin.what()
                ));
                return true;
            }
            // A superuser's call uses no operator of a role it does not trust: its owner may
            // link it to another (ALTER OPERATOR ... SET NEGATOR) once a saved view uses it.
            if let Some(why) = self
                .trusted
                .as_ref()
                .and_then(|t| t.refuse_owner(operator_owner(operator), "operator"))
            {
                self.refuse(format!(
                    "operator {} is not allowed: {why}",
                    operator_name(operator)
                ));
                return true;
            }
            let [function, estimators @ ..] = functions;
            if function != pg_sys::InvalidOid && self.check_function(function) {
                return true;
            }
            // The planner's estimators run as support code does (they take `internal`): a
            // built-in one (`eqsel`) may, as for the built-in operators.
            for estimator in estimators
                .into_iter()
                .filter(|f| *f != pg_sys::InvalidOid && !builtin(*f))
            {
                if let Some(why) = self.support_refusal(estimator) {
                    self.refuse(format!(
                        "operator {}'s estimator {} is not allowed in {}: {why}",
                        operator_name(operator),
                        FunctionFacts::signature(estimator),
                        self.origin.what()
                    ));
                    return true;
                }
            }
        }
        false
    }

    /// Why `function`, not built in, may not run implicitly for what the query uses (an
    /// operator family's support, an operator's estimator).
    fn support_refusal(&self, function: pg_sys::Oid) -> Option<String> {
        match FunctionFacts::of(function) {
            None => Some("it is not in the catalog".to_string()),
            Some(facts) => match self.origin {
                Origin::Own => {
                    Some("the extension's own reads call only built-in functions".into())
                }
                Origin::Generated => policy::refuse_support(&facts.policy(), &self.allowed)
                    .or_else(|| {
                        self.trusted
                            .as_ref()
                            .filter(|t| t.judges_code())
                            .and_then(|t| t.refuse_owner(facts.owner, "function"))
                    }),
            },
        }
    }

    /// The support functions of the operator families `operator` is in (comparison, sort
    /// support, hashing): those not built in must pass as code that runs implicitly does.
    fn check_families(&mut self, operator: pg_sys::Oid) -> bool {
        for family in operator_families(operator) {
            if self.families.contains(&family) {
                continue;
            }
            let Some(functions) = family_code(family) else {
                self.refuse(format!(
                    "an operator family of operator {} has more than {MAX_FAMILY_SUPPORT} \
                     support functions or member operators",
                    operator_name(operator)
                ));
                return true;
            };
            for function in functions.into_iter().filter(|f| !builtin(*f)) {
                if let Some(why) = self
                    .support_refusal(function)
                    .or_else(|| self.unseen_cost_refusal(function, true))
                {
                    self.refuse(format!(
                        "operator {}'s support function {} is not allowed in {}: {why}",
                        operator_name(operator),
                        FunctionFacts::signature(function),
                        self.origin.what()
                    ));
                    return true;
                }
            }
            self.families.push(family);
        }
        false
    }

    /// Whether `function` is refused (the refusal is recorded); for a user aggregate that may
    /// run, its support functions and sort operator are checked too.
    fn check_function(&mut self, function: pg_sys::Oid) -> bool {
        let Some(facts) = FunctionFacts::of(function) else {
            self.refuse(format!("function {function} is not in the catalog"));
            return true;
        };
        let why = match self.origin {
            Origin::Own => (!facts.builtin)
                .then(|| "the extension's own reads call only built-in functions".to_string()),
            // A superuser's call runs no other role's function: the runtime gate stops one
            // that starts, and this one that might start later (in a saved view, say).
            Origin::Generated => {
                policy::refuse(&facts.policy(), &self.allowed, self.allow_catalogs)
                    .or_else(|| {
                        self.trusted
                            .as_ref()
                            .filter(|t| t.judges_code())
                            .and_then(|t| t.refuse_owner(facts.owner, "function"))
                    })
                    .or_else(|| {
                        // Allowed by name or not: what it reads and runs would escape the
                        // owner checks of a superuser's call.
                        (self.trusted.as_ref().is_some_and(Trusted::superusers)
                            && policy::runs_given_code(&facts.policy()))
                        .then(|| {
                            "a superuser's call runs no SQL or object code given as text: the \
                             relations and types it names are found only as it runs, out of the \
                             owner checks such a call makes"
                                .to_string()
                        })
                    })
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
        // The types its result columns are converted to inside the call (RETURNS TABLE), which
        // no node shows, are checked as a value's type is (a polymorphic one is resolved from
        // the arguments', which the walk checks where they are).
        if !facts.builtin
            && result_column_types(function)
                .into_iter()
                .filter(|t| !POLYMORPHIC.contains(t))
                .any(|typ| self.check_type(typ))
        {
            return true;
        }
        if facts.aggregate && !facts.builtin {
            let (functions, sort_operator, states) = aggregate_support(function);
            // The state types too: an initial state is converted with its type's input
            // function (and a domain's CHECK) when the aggregate starts. A polymorphic state
            // type is resolved from the arguments' types, which the walk checks where they are.
            if let Some(why) = functions
                .iter()
                .find_map(|&f| self.unseen_cost_refusal(f, true))
            {
                self.refuse(format!(
                    "aggregate {} is not allowed in {}: {why}",
                    FunctionFacts::signature(function),
                    self.origin.what()
                ));
                return true;
            }
            return functions.into_iter().any(|f| self.check_function(f))
                || sort_operator.is_some_and(|op| self.check_operator(op))
                || states
                    .into_iter()
                    .filter(|t| !POLYMORPHIC.contains(t))
                    .any(|t| self.check_type(t));
        }
        false
    }
}

/// Why the extension may not read `relation` on its own: reading it could run code (a view, a
/// row-security policy that applies), connect elsewhere (a foreign table, also as a partition
/// or child), or read its inheritance children (plain tables are read with ONLY).
fn own_read_refusal(relation: pg_sys::Oid, inheritance: bool) -> Option<String> {
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
        // A virtual generated column (PostgreSQL 18) is its owner's expression, computed as it
        // is read: with an operator linked later (a negator), code the expression was never
        // checked for.
        let computed = match kind {
            pg_sys::RELKIND_PARTITIONED_TABLE => trust::inheritors(relation)
                .into_iter()
                .any(has_virtual_columns),
            _ => has_virtual_columns(relation),
        };
        if computed {
            return Some(
                "it has virtual generated columns, which run their owner's expression as they \
                 are read"
                    .into(),
            );
        }
        // Planning a read computes what an index's expression or predicate, a partition key
        // or an extended statistic's expression computes without a column
        // (`c || repeat('x', 60000000)`, `1e131071::numeric::text`): the first two once, kept
        // with the relation for as long as the connection lives, the last at every plan.
        // Another role's tables in the caller's context would fill its caches, question after
        // question, until `max_query_memory` ends its connection. (What opening the relation
        // loads as stored is bounded before the read is asked:
        // `schema::Relation::catalog_bytes`.)
        let planned = match kind {
            pg_sys::RELKIND_PARTITIONED_TABLE => trust::inheritors(relation),
            _ => vec![relation],
        };
        if planned.into_iter().any(|r| computes_without_columns(r)) {
            return Some(
                "an index, partition key or statistic of it computes a value without a \
                 column, which planning a read would compute"
                    .into(),
            );
        }
        let row_security = pg_sys::check_enable_rls(relation, pg_sys::InvalidOid, true);
        (row_security != pg_sys::CheckEnableRlsResult::RLS_NONE as i32)
            .then(|| "row-level security applies to it: its policies run their owner's code".into())
    }
}

/// Stored expression text of an index or a partition key read at most (a longer one is taken
/// to compute too much).
const MAX_STORED_EXPRESSION_BYTES: usize = 1 << 20;

/// Whether an index of `relation`, its partition key or an extended statistic on it has an
/// expression or predicate with a computation that takes no column (`constant_value`), as the
/// catalog stores it (read, never planned nor kept).
///
/// # Safety
/// In a transaction.
unsafe fn computes_without_columns(relation: pg_sys::Oid) -> bool {
    use crate::compat::numbers::{
        ANUM_PG_PARTITIONED_TABLE_PARTEXPRS, ANUM_PG_PARTITIONED_TABLE_PARTRELID,
        ANUM_PG_STATISTIC_EXT_STXEXPRS, ANUM_PG_STATISTIC_EXT_STXRELID, PARTITIONED_RELATION_ID,
        PARTITIONED_RELID_INDEX_ID, STATISTIC_EXT_RELATION_ID, STATISTIC_EXT_RELID_INDEX_ID,
    };
    let every = &|_: pg_sys::HeapTuple, _: pg_sys::TupleDesc| true;
    // SAFETY: the caller's contract; pg_index's and pg_partitioned_table's columns, by number.
    let stored = unsafe {
        let indexes = super::facts::stored_trees(
            pg_sys::IndexRelationId.to_u32(),
            pg_sys::IndexIndrelidIndexId,
            pg_sys::Anum_pg_index_indrelid as i16,
            relation,
            &[
                pg_sys::Anum_pg_index_indexprs as i16,
                pg_sys::Anum_pg_index_indpred as i16,
            ],
            every,
            MAX_STORED_EXPRESSION_BYTES,
        );
        let key = super::facts::stored_trees(
            PARTITIONED_RELATION_ID,
            PARTITIONED_RELID_INDEX_ID,
            ANUM_PG_PARTITIONED_TABLE_PARTRELID,
            relation,
            &[ANUM_PG_PARTITIONED_TABLE_PARTEXPRS],
            every,
            MAX_STORED_EXPRESSION_BYTES,
        );
        let statistics = super::facts::stored_trees(
            STATISTIC_EXT_RELATION_ID,
            STATISTIC_EXT_RELID_INDEX_ID,
            ANUM_PG_STATISTIC_EXT_STXRELID,
            relation,
            &[ANUM_PG_STATISTIC_EXT_STXEXPRS],
            every,
            MAX_STORED_EXPRESSION_BYTES,
        );
        indexes
            .zip(key)
            .zip(statistics)
            .map(|((mut all, key), statistics)| {
                all.extend(key);
                all.extend(statistics);
                all
            })
    };
    let Some(stored) = stored else {
        return true;
    };
    stored.into_iter().any(|expression| {
        let mut folding = Folding { found: false };
        // SAFETY: an expression tree the catalog stored, only read.
        unsafe { constant_value(expression, &mut folding) };
        folding.found
    })
}

/// What `constant_value` found: a computation that takes no column.
struct Folding {
    found: bool,
}

/// Whether `node` takes no column (a constant, a call without arguments, or anything built
/// of such values alone); one that computes something is noted in `folding`: planning computes
/// it, whatever its size. Not noted: a list, an array or a row of such values, a relabelling
/// or a collation of one, and a cast to a type of fixed length or to numeric (`amount > 0` on
/// a numeric column is stored as a cast of 0), which make nothing larger than what they take.
///
/// # Safety
/// `node` is an analysed expression tree, or null.
unsafe fn constant_value(node: *mut pg_sys::Node, folding: &mut Folding) -> bool {
    if node.is_null() || folding.found {
        return false;
    }
    pgrx::check_for_interrupts!();
    // SAFETY: the caller's contract.
    let tag = unsafe { (*node).type_ };
    match tag {
        pg_sys::NodeTag::T_Const => return true,
        // Only a column's value (or one given at run time) is not a constant. What stands for
        // the input of a CASE or of an array's element conversion is taken as one: such an
        // input that is a constant is computed (a CASE over a column's value is then noted too,
        // a refusal that costs only the table's samples).
        pg_sys::NodeTag::T_Var | pg_sys::NodeTag::T_Param => return false,
        pg_sys::NodeTag::T_CaseTestExpr | pg_sys::NodeTag::T_CoerceToDomainValue => return true,
        _ => {}
    }
    let mut children = Children {
        folding,
        all_constant: true,
    };
    // SAFETY: PostgreSQL's walker over the node's direct children, with our context.
    unsafe {
        pg_sys::expression_tree_walker(
            node,
            Some(child_walker),
            (&mut children as *mut Children).cast::<c_void>(),
        );
    }
    let constant = children.all_constant;
    // SAFETY: the caller's contract.
    if constant && !unsafe { grows_nothing(node) } {
        children.folding.found = true;
    }
    constant
}

/// Whether `node` makes nothing larger than what it takes: a list, an array or a row of
/// values, a relabelling or a collation of one, a cast to numeric or to a type of fixed
/// length, and an array's cast that relabels each element (`status IN ('a', 'b')` on a
/// varchar column is stored as a cast of a varchar array to text[]).
///
/// # Safety
/// `node` is an analysed expression node.
unsafe fn grows_nothing(node: *mut pg_sys::Node) -> bool {
    // SAFETY: the node's own fields, by its tag (the caller's contract).
    unsafe {
        match (*node).type_ {
            pg_sys::NodeTag::T_List
            | pg_sys::NodeTag::T_ArrayExpr
            | pg_sys::NodeTag::T_RowExpr
            | pg_sys::NodeTag::T_RelabelType
            | pg_sys::NodeTag::T_CollateExpr
            | pg_sys::NodeTag::T_CaseTestExpr => true,
            pg_sys::NodeTag::T_FuncExpr => {
                let call = node.cast::<pg_sys::FuncExpr>();
                let result = (*call).funcresulttype;
                super::facts::is_cast(call)
                    && (pg_sys::get_typlen(result) > 0 || result == pg_sys::NUMERICOID)
            }
            // Only a relabelling of each element: a cast of each to a type of fixed length
            // may still make each larger than its text (text to name: 64 bytes).
            pg_sys::NodeTag::T_ArrayCoerceExpr => {
                let element = (*node.cast::<pg_sys::ArrayCoerceExpr>())
                    .elemexpr
                    .cast::<pg_sys::Node>();
                !element.is_null()
                    && matches!(
                        (*element).type_,
                        pg_sys::NodeTag::T_RelabelType
                            | pg_sys::NodeTag::T_CollateExpr
                            | pg_sys::NodeTag::T_CaseTestExpr
                    )
            }
            _ => false,
        }
    }
}

/// `constant_value`'s walk of one node's children.
struct Children<'a> {
    folding: &'a mut Folding,
    all_constant: bool,
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn child_walker(node: *mut pg_sys::Node, context: *mut c_void) -> bool {
    // SAFETY: called by expression_tree_walker with `constant_value`'s context.
    let children = unsafe { &mut *context.cast::<Children>() };
    if node.is_null() {
        return false;
    }
    // SAFETY: a child of an analysed expression.
    if !unsafe { constant_value(node, children.folding) } {
        children.all_constant = false;
    }
    children.folding.found
}

/// Whether `relation`, which this transaction has locked, has a virtual generated column.
fn has_virtual_columns(relation: pg_sys::Oid) -> bool {
    // SAFETY: the relation is locked (by the parser, or by `inheritors`); its descriptor is
    // read while it is open.
    unsafe {
        let opened = OpenRelation::open(relation, pg_sys::NoLock);
        crate::compat::attributes((*opened.0).rd_att)
            .iter()
            .any(|a| !a.attisdropped && a.attgenerated as u8 == b'v')
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

/// The btree and hash operator families `operator` belongs to: what sorts, grouping, set
/// operations, merge and hash joins use in its place. (Other access methods' families, gin's
/// and gist's, serve only index scans, of indexes a table's owner made.)
fn operator_families(operator: pg_sys::Oid) -> Vec<pg_sys::Oid> {
    // SAFETY: the first key of AMOPOPID is the operator's OID.
    let list = unsafe {
        CacheList::search(
            pg_sys::SysCacheIdentifier::AMOPOPID,
            pg_sys::Datum::from(operator),
        )
    };
    let mut families: Vec<pg_sys::Oid> = Vec::new();
    for tuple in list.tuples() {
        // SAFETY: a pg_amop tuple of the held list.
        let entry = unsafe { &*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_amop>(tuple) };
        let method = entry.amopmethod;
        let sorts_or_hashes = method == pg_sys::BTREE_AM_OID || method == pg_sys::HASH_AM_OID;
        if sorts_or_hashes && !families.contains(&entry.amopfamily) {
            families.push(entry.amopfamily);
        }
    }
    families
}
