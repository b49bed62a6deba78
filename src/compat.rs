//! What differs between the PostgreSQL versions the extension supports (15, 17 and 18), in one
//! place: node kinds the guard walks, the tuple descriptor's layout, `ExecutorRun`'s arguments,
//! PostgreSQL 18's GROUP BY range-table entry, and the numbers build.rs reads from each server's
//! headers.

use pgrx::pg_sys;

/// Expression node kinds of an analyzed SELECT that only some versions have: the SQL/JSON
/// constructors and predicates (PostgreSQL 16 and later) and query functions (17 and later).
pub fn expression_kind(tag: pg_sys::NodeTag) -> bool {
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    if matches!(
        tag,
        pg_sys::NodeTag::T_JsonConstructorExpr
            | pg_sys::NodeTag::T_JsonIsPredicate
            | pg_sys::NodeTag::T_JsonValueExpr
            | pg_sys::NodeTag::T_JsonExpr
            | pg_sys::NodeTag::T_JsonBehavior
    ) {
        return true;
    }
    let _ = tag;
    false
}

/// Structural node kinds of an analyzed SELECT that only some versions have (the format and
/// return type of SQL/JSON expressions).
pub fn structural_kind(tag: pg_sys::NodeTag) -> bool {
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    if matches!(
        tag,
        pg_sys::NodeTag::T_JsonFormat | pg_sys::NodeTag::T_JsonReturning
    ) {
        return true;
    }
    let _ = tag;
    false
}

/// The ORDER BY list of a raw SQL/JSON aggregate (`JSON_ARRAYAGG(x ORDER BY ...)`, PostgreSQL
/// 16 and later), or None for any other node.
///
/// # Safety
/// `node` is a raw parse node.
pub unsafe fn aggregate_order(node: *mut pg_sys::Node) -> Option<*mut pg_sys::List> {
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    // SAFETY: the caller's contract; the tag says which struct it is.
    unsafe {
        if (*node).type_ == pg_sys::NodeTag::T_JsonAggConstructor {
            return Some((*node.cast::<pg_sys::JsonAggConstructor>()).agg_order);
        }
    }
    let _ = node;
    None
}

/// Whether `node` is a raw column of JSON_TABLE (PostgreSQL 17 and later).
///
/// # Safety
/// `node` is a raw parse node.
pub unsafe fn json_table_column(node: *mut pg_sys::Node) -> bool {
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    // SAFETY: the caller's contract.
    unsafe {
        if (*node).type_ == pg_sys::NodeTag::T_JsonTableColumn {
            return true;
        }
    }
    let _ = node;
    false
}

/// The JSON path of a SQL/JSON query function (`JSON_EXISTS`, `JSON_QUERY`, `JSON_VALUE`,
/// PostgreSQL 17 and later), or None for any other node.
///
/// # Safety
/// `node` is an analysed node.
pub unsafe fn json_path(node: *mut pg_sys::Node) -> Option<*mut pg_sys::Node> {
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    // SAFETY: the caller's contract; the tag says which struct it is.
    unsafe {
        if (*node).type_ == pg_sys::NodeTag::T_JsonExpr {
            return Some((*node.cast::<pg_sys::JsonExpr>()).path_spec);
        }
    }
    let _ = node;
    None
}

/// What a table function reads its rows with: XMLTABLE's XPath expressions, or JSON_TABLE's
/// JSON paths (PostgreSQL 17 and later: its row path and those of its NESTED clauses, which
/// no expression walker visits).
pub enum TableFunction {
    XmlTable,
    #[cfg_attr(feature = "pg15", allow(dead_code))]
    JsonTable(Vec<*mut pg_sys::Node>),
}

/// What kind of table function `table` is, with JSON_TABLE's paths.
///
/// # Safety
/// `table` is an analysed TableFunc.
pub unsafe fn table_function(table: *mut pg_sys::TableFunc) -> TableFunction {
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    // SAFETY: the caller's contract; each plan node is cast to the struct its tag names.
    unsafe {
        if (*table).functype == pg_sys::TableFuncType::TFT_JSON_TABLE {
            let mut paths = Vec::new();
            let mut plans = vec![(*table).plan];
            while let Some(plan) = plans.pop() {
                let Some(node) = plan.as_ref() else { continue };
                match node.type_ {
                    pg_sys::NodeTag::T_JsonTablePathScan => {
                        let scan = plan.cast::<pg_sys::JsonTablePathScan>();
                        if let Some(path) = (*scan).path.as_ref() {
                            paths.push(path.value.cast());
                        }
                        plans.push((*scan).child.cast());
                    }
                    pg_sys::NodeTag::T_JsonTableSiblingJoin => {
                        let join = plan.cast::<pg_sys::JsonTableSiblingJoin>();
                        plans.push((*join).lplan.cast());
                        plans.push((*join).rplan.cast());
                    }
                    // A plan node of a kind not known here: a path nobody checked.
                    _ => paths.push(std::ptr::null_mut()),
                }
            }
            return TableFunction::JsonTable(paths);
        }
    }
    let _ = table;
    TableFunction::XmlTable
}

/// The attributes of a tuple descriptor. PostgreSQL 18 keeps them after an array of compact
/// attributes, where earlier versions had them as the struct's last field.
///
/// # Safety
/// `desc` must be a valid tuple descriptor that outlives the slice.
pub unsafe fn attributes<'a>(desc: pg_sys::TupleDesc) -> &'a [pg_sys::FormData_pg_attribute] {
    // SAFETY: the caller's contract; `natts` attributes follow where each version puts them.
    unsafe {
        let natts = (*desc).natts.max(0) as usize;
        #[cfg(not(feature = "pg18"))]
        let first = (*desc).attrs.as_ptr();
        #[cfg(feature = "pg18")]
        let first = (*desc)
            .compact_attrs
            .as_ptr()
            .add(natts)
            .cast::<pg_sys::FormData_pg_attribute>();
        std::slice::from_raw_parts(first, natts)
    }
}

/// The expressions of `relation`'s virtual generated columns (PostgreSQL 18), which the planner
/// puts in each column's place as a query reads it; none before 18.
///
/// # Safety
/// `relation` must be open.
pub unsafe fn virtual_column_expressions(relation: pg_sys::Relation) -> Vec<*mut pg_sys::Node> {
    #[cfg(feature = "pg18")]
    // SAFETY: the caller's contract; each expression is built from the relation's catalog
    // entry, in the current memory context.
    return unsafe {
        attributes((*relation).rd_att)
            .iter()
            .filter(|a| !a.attisdropped && a.attgenerated as u8 == b'v')
            .map(|a| pg_sys::build_generation_expression(relation, i32::from(a.attnum)))
            .filter(|expression| !expression.is_null())
            .collect()
    };
    #[cfg(not(feature = "pg18"))]
    {
        let _ = relation;
        Vec::new()
    }
}

/// `attributes`, to change (a copy the extension made).
///
/// # Safety
/// As `attributes`, and nothing else may refer to the descriptor's attributes meanwhile.
pub unsafe fn attributes_mut<'a>(
    desc: pg_sys::TupleDesc,
) -> &'a mut [pg_sys::FormData_pg_attribute] {
    // SAFETY: the caller's contract.
    unsafe {
        let attributes = attributes(desc);
        std::slice::from_raw_parts_mut(attributes.as_ptr().cast_mut(), attributes.len())
    }
}

/// Runs a started query to its end (PostgreSQL 18 dropped `ExecutorRun`'s `execute_once`).
///
/// # Safety
/// `query` must be a query descriptor `ExecutorStart` started.
pub unsafe fn executor_run(query: *mut pg_sys::QueryDesc) {
    // SAFETY: the caller's contract.
    unsafe {
        #[cfg(not(feature = "pg18"))]
        pg_sys::ExecutorRun(query, pg_sys::ScanDirection::ForwardScanDirection, 0, true);
        #[cfg(feature = "pg18")]
        pg_sys::ExecutorRun(query, pg_sys::ScanDirection::ForwardScanDirection, 0);
    }
}

/// Checks the caller's privileges on the relations `planned` reads, as the executor's start
/// does, raising PostgreSQL's own ERROR (42501) when one is missing: before anything drawn
/// from the plan (its estimates, which the statistics of every row decide) is told. PostgreSQL
/// 16 moved the privileges out of the range table (`permInfos`).
///
/// # Safety
/// `planned` must be a plan `pg_plan_query` returned in this transaction.
pub unsafe fn check_permissions(planned: *mut pg_sys::PlannedStmt) {
    // SAFETY: the caller's contract; the check reads the plan's lists and the catalogs.
    unsafe {
        #[cfg(feature = "pg15")]
        pg_sys::ExecCheckRTPerms((*planned).rtable, true);
        #[cfg(not(feature = "pg15"))]
        pg_sys::ExecCheckPermissions((*planned).rtable, (*planned).permInfos, true);
    }
}

/// Whether `role` has `mode` on the schema `namespace` (PostgreSQL 16 folded
/// `pg_namespace_aclcheck` into `object_aclcheck`).
pub fn namespace_allows(namespace: pg_sys::Oid, role: pg_sys::Oid, mode: pg_sys::AclMode) -> bool {
    // SAFETY: a privilege check by OID; an ERROR for a schema that is gone.
    let result = unsafe {
        #[cfg(feature = "pg15")]
        {
            pg_sys::pg_namespace_aclcheck(namespace, role, mode)
        }
        #[cfg(not(feature = "pg15"))]
        {
            pg_sys::object_aclcheck(pg_sys::NamespaceRelationId, namespace, role, mode)
        }
    };
    result == pg_sys::AclResult::ACLCHECK_OK
}

/// Whether `role` may execute `function`; false for a function that does not exist
/// (PostgreSQL 16 folded `pg_proc_aclcheck` into `object_aclcheck`).
pub fn function_allows(function: pg_sys::Oid, role: pg_sys::Oid) -> bool {
    let mode = pg_sys::ACL_EXECUTE as pg_sys::AclMode;
    // SAFETY: a catalog look-up by OID, then a privilege check of a function that exists.
    let result = unsafe {
        if !pg_sys::SearchSysCacheExists(
            pg_sys::SysCacheIdentifier::PROCOID as _,
            function.into(),
            pg_sys::Datum::null(),
            pg_sys::Datum::null(),
            pg_sys::Datum::null(),
        ) {
            return false;
        }
        #[cfg(feature = "pg15")]
        {
            pg_sys::pg_proc_aclcheck(function, role, mode)
        }
        #[cfg(not(feature = "pg15"))]
        {
            pg_sys::object_aclcheck(pg_sys::ProcedureRelationId, function, role, mode)
        }
    };
    result == pg_sys::AclResult::ACLCHECK_OK
}

/// Whether `rte` is PostgreSQL 18's GROUP BY range-table entry, whose columns are the grouped
/// expressions that the SELECT list and HAVING read (earlier versions have none).
///
/// # Safety
/// `rte` is a range-table entry of an analyzed tree.
pub unsafe fn is_group(rte: *const pg_sys::RangeTblEntry) -> bool {
    #[cfg(feature = "pg18")]
    // SAFETY: the caller's contract.
    return unsafe { (*rte).rtekind == pg_sys::RTEKind::RTE_GROUP };
    #[cfg(not(feature = "pg18"))]
    {
        let _ = rte;
        false
    }
}

/// The grouped expression that column `index` (from 0) of a GROUP BY range-table entry stands
/// for (`is_group`); `None` for another entry.
///
/// # Safety
/// `rte` is a range-table entry of an analyzed tree.
pub unsafe fn grouped(
    rte: *const pg_sys::RangeTblEntry,
    index: usize,
) -> Option<*mut pg_sys::Node> {
    // SAFETY: the caller's contract.
    unsafe {
        if !is_group(rte) {
            return None;
        }
        #[cfg(feature = "pg18")]
        return pgrx::PgList::<pg_sys::Node>::from_pg((*rte).groupexprs).get_ptr(index);
        #[cfg(not(feature = "pg18"))]
        {
            let _ = index;
            None
        }
    }
}

/// Gives back a tuple descriptor `lookup_rowtype_tupdesc` pinned (PostgreSQL's `ReleaseTupleDesc`,
/// a macro pgrx does not bind): a record type's descriptor shared with parallel workers is not
/// reference-counted (-1), and releasing it raises an ERROR.
///
/// # Safety
/// `desc` is a descriptor the caller's own look-up pinned, in a transaction.
pub unsafe fn release_tuple_desc(desc: pg_sys::TupleDesc) {
    // SAFETY: the caller's contract.
    unsafe {
        if (*desc).tdrefcount >= 0 {
            pg_sys::DecrTupleDescRefCount(desc);
        }
    }
}

/// Numbers read from the server's headers at build time (build.rs): enum positions and catalog
/// attribute numbers that pgrx does not bind.
pub mod numbers {
    include!(concat!(env!("OUT_DIR"), "/server_numbers.rs"));
}

/// utils/timeout.h, which pgrx does not bind.
#[allow(non_snake_case)]
pub mod timeout {
    use pgrx::pg_sys::TimestampTz;

    /// The statement timer, as `enum TimeoutId` numbers it in the server built for (a backend
    /// test checks that it is the timer `statement_timeout` arms).
    pub use crate::compat::numbers::{STATEMENT_TIMEOUT, USER_TIMEOUT};

    // SAFETY: these declarations match utils/timeout.h of every supported server (TimeoutId
    // is a C enum, passed as an int; TimestampTz is int64), and the functions may raise
    // PostgreSQL errors, hence C-unwind.
    unsafe extern "C-unwind" {
        pub fn enable_timeout_after(id: u32, delay_ms: std::ffi::c_int);
        pub fn enable_timeout_at(id: u32, fin_time: TimestampTz);
        pub fn disable_timeout(id: u32, keep_indicator: bool);
        pub fn get_timeout_active(id: u32) -> bool;
        pub fn get_timeout_indicator(id: u32, reset_indicator: bool) -> bool;
        pub fn get_timeout_finish_time(id: u32) -> TimestampTz;
        pub fn enable_timeout_every(id: u32, fin_time: TimestampTz, delay_ms: std::ffi::c_int);
        /// A timer of one's own; `handler` runs in the SIGALRM handler.
        pub fn RegisterTimeout(id: u32, handler: extern "C" fn()) -> u32;
    }
}

/// Whether a setting holds a value for the current transaction only (`SET LOCAL`,
/// `set_config(..., true)`), or for a nesting level (a function's `SET` clause): GUC keeps the
/// value to go back to on a stack of its own, which only then is not empty. The settings are
/// listed differently before PostgreSQL 16.
pub fn settings_held_for_the_transaction() -> bool {
    // SAFETY: GUC's own array of its settings, read (not changed) in the backend's thread.
    unsafe {
        #[cfg(feature = "pg15")]
        let (settings, count) = (pg_sys::get_guc_variables(), pg_sys::GetNumConfigOptions());
        #[cfg(not(feature = "pg15"))]
        let (settings, count) = {
            let mut count: std::ffi::c_int = 0;
            (pg_sys::get_guc_variables(&mut count), count)
        };
        if settings.is_null() {
            return false;
        }
        (0..usize::try_from(count).unwrap_or(0)).any(|i| {
            let setting = *settings.add(i);
            !setting.is_null() && !(*setting).stack.is_null()
        })
    }
}
