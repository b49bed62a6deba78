//! The types parse analysis may convert a literal into, read from the raw tree before
//! analysis runs. Converting a literal runs its type's input code, and the input code of an
//! array, a composite or a range runs the CHECK constraints of the domains inside it (its
//! elements, fields or bounds), with every built-in function they call: PostgreSQL's hooks
//! never see a built-in, so no gate can stop `set_config`, `pg_sleep` or `query_to_xml` there.
//! Such a type must pass before analysis (`types::literal_refusal`), not after.
//!
//! A literal's type comes from what it meets: a cast or a column definition (a type name), a
//! column or the row of a relation the statement names, or a parameter or result of a function
//! or operator it calls (every candidate of the name, as analysis may choose any), or an array
//! of one of those (`ARRAY[c] || '{1}'`, `COALESCE(ARRAY[c], '{1}')`). Found by name exactly as
//! analysis will find them, without locks and without running anything. Only a string literal
//! is converted by a type's input code (a number or NULL is not): a statement without one
//! needs no look-up.

use std::ffi::c_void;

use pgrx::pg_sys;

/// Types collected per statement, at most: past that, the statement is refused as too complex.
pub const MAX_TYPES: usize = 4096;

/// The comparison operators analysis uses where the statement names none (`CASE x WHEN`,
/// `IN`, `DISTINCT`): their candidates are in reach too.
const IMPLIED_OPERATORS: [&std::ffi::CStr; 6] = [c"=", c"<>", c"<", c">", c"<=", c">="];

/// What the walk collects: the types in reach, and whether the statement has a string literal.
#[derive(Default)]
struct Reach {
    types: Vec<pg_sys::Oid>,
    literal: bool,
}

/// The types in reach of the string literals of `statement` (a raw statement from
/// `raw_parser`), none when it has no string literal, `None` when there are more than
/// `MAX_TYPES`.
///
/// # Safety
/// `statement` is a raw parse tree of the current memory context.
pub unsafe fn types_in_reach(statement: *mut pg_sys::Node) -> Option<Vec<pg_sys::Oid>> {
    let mut reach = Reach::default();
    // SAFETY: the caller's contract; through PostgreSQL's raw walker (the statement as a
    // one-element list, so that the walker sees it too); catalog look-ups by name that take no
    // lock and run nothing.
    unsafe {
        let list = pg_sys::lappend(std::ptr::null_mut(), statement.cast());
        pg_sys::raw_expression_tree_walker(
            list.cast(),
            Some(collector),
            (&mut reach as *mut Reach).cast(),
        );
        if !reach.literal {
            return Some(Vec::new());
        }
        for name in IMPLIED_OPERATORS {
            let names = pg_sys::lappend(
                std::ptr::null_mut(),
                pg_sys::makeString(pg_sys::pstrdup(name.as_ptr())).cast(),
            );
            operators(names, &mut reach.types);
        }
    }
    (reach.types.len() <= MAX_TYPES).then_some(reach.types)
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn collector(node: *mut pg_sys::Node, context: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: PostgreSQL's raw walker passes raw nodes and our `Reach`; each node is read as
    // the struct its tag names.
    unsafe {
        let reach = &mut *context.cast::<Reach>();
        let found = &mut reach.types;
        if found.len() > MAX_TYPES {
            return true;
        }
        match (*node).type_ {
            pg_sys::NodeTag::T_A_Const => {
                let constant = node.cast::<pg_sys::A_Const>();
                if !(*constant).isnull && (*constant).val.node.type_ == pg_sys::NodeTag::T_String {
                    reach.literal = true;
                }
            }
            pg_sys::NodeTag::T_TypeName => type_named(node.cast(), found),
            // XMLTABLE's columns: PostgreSQL's walker does not visit their type names.
            pg_sys::NodeTag::T_RangeTableFuncCol => {
                type_named((*node.cast::<pg_sys::RangeTableFuncCol>()).typeName, found);
            }
            pg_sys::NodeTag::T_RangeVar => {
                let relation = pg_sys::RangeVarGetRelidExtended(
                    node.cast(),
                    pg_sys::NoLock as pg_sys::LOCKMODE,
                    pg_sys::RVROption::RVR_MISSING_OK,
                    None,
                    std::ptr::null_mut(),
                );
                if relation != pg_sys::InvalidOid {
                    columns(relation, found);
                }
            }
            pg_sys::NodeTag::T_FuncCall => {
                functions((*node.cast::<pg_sys::FuncCall>()).funcname, found);
            }
            pg_sys::NodeTag::T_A_Expr => operators((*node.cast::<pg_sys::A_Expr>()).name, found),
            pg_sys::NodeTag::T_SubLink => {
                operators((*node.cast::<pg_sys::SubLink>()).operName, found);
            }
            pg_sys::NodeTag::T_SortBy => operators((*node.cast::<pg_sys::SortBy>()).useOp, found),
            _ => {}
        }
        pg_sys::raw_expression_tree_walker(node, Some(collector), context)
    }
}

/// The type a type name names, without its modifiers (reading them would run the type's
/// modifier code).
///
/// # Safety
/// `name` is a raw tree's TypeName, or null.
unsafe fn type_named(name: *mut pg_sys::TypeName, found: &mut Vec<pg_sys::Oid>) {
    if !name.is_null() {
        // SAFETY: the caller's contract; a catalog look-up that runs nothing.
        add(found, unsafe {
            pg_sys::LookupTypeNameOid(std::ptr::null_mut(), name, true)
        });
    }
}

/// `typ`, and the array of it that analysis may make of a value of it.
fn add(found: &mut Vec<pg_sys::Oid>, typ: pg_sys::Oid) {
    // SAFETY: a catalog look-up.
    let array = unsafe { pg_sys::get_array_type(typ) };
    for typ in [typ, array] {
        if typ != pg_sys::InvalidOid && !found.contains(&typ) {
            found.push(typ);
        }
    }
}

/// The row type of `relation` (`t = '(...)'` converts a literal to it) and its column types
/// (dropped columns aside).
///
/// # Safety
/// In a transaction.
unsafe fn columns(relation: pg_sys::Oid, found: &mut Vec<pg_sys::Oid>) {
    // SAFETY: the relcache entry, closed before returning (NULL for a relation gone since).
    unsafe {
        let rel = pg_sys::RelationIdGetRelation(relation);
        if rel.is_null() {
            return;
        }
        add(found, (*(*rel).rd_rel).reltype);
        for attribute in crate::compat::attributes((*rel).rd_att) {
            if !attribute.attisdropped {
                add(found, attribute.atttypid);
            }
        }
        pg_sys::RelationClose(rel);
    }
}

/// The parameter and result types of every function named `names`.
///
/// # Safety
/// `names` is a raw tree's name list (String nodes), or null.
unsafe fn functions(names: *mut pg_sys::List, found: &mut Vec<pg_sys::Oid>) {
    if names.is_null() {
        return;
    }
    // SAFETY: the caller's contract; the candidate list is palloc'd, each with `nargs` types.
    unsafe {
        let mut candidate = pg_sys::FuncnameGetCandidates(
            names,
            -1,
            std::ptr::null_mut(),
            false,
            false,
            false,
            true,
        );
        while !candidate.is_null() && found.len() <= MAX_TYPES {
            let nargs = usize::try_from((*candidate).nargs).unwrap_or(0);
            for &typ in (*candidate).args.as_slice(nargs) {
                add(found, typ);
            }
            add(found, pg_sys::get_func_rettype((*candidate).oid));
            result_columns((*candidate).oid, found);
            candidate = (*candidate).next;
        }
    }
}

/// The types of a function's OUT and TABLE parameters: the columns of its result.
///
/// # Safety
/// In a transaction.
unsafe fn result_columns(function: pg_sys::Oid, found: &mut Vec<pg_sys::Oid>) {
    // SAFETY: a syscache look-up, released before returning; the descriptor is a palloc'd
    // copy (NULL for a function without OUT parameters).
    unsafe {
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::PROCOID as i32,
            pg_sys::Datum::from(function),
        );
        if tuple.is_null() {
            return;
        }
        let desc = pg_sys::build_function_result_tupdesc_t(tuple);
        pg_sys::ReleaseSysCache(tuple);
        if !desc.is_null() {
            for attribute in crate::compat::attributes(desc) {
                add(found, attribute.atttypid);
            }
        }
    }
}

/// The operand and result types of every operator named `names`.
///
/// # Safety
/// `names` is a raw tree's name list (String nodes), or null.
unsafe fn operators(names: *mut pg_sys::List, found: &mut Vec<pg_sys::Oid>) {
    if names.is_null() {
        return;
    }
    // SAFETY: the caller's contract; the candidate list is palloc'd, each with `nargs` types.
    unsafe {
        let mut candidate = pg_sys::OpernameGetCandidates(names, 0, true);
        while !candidate.is_null() && found.len() <= MAX_TYPES {
            let nargs = usize::try_from((*candidate).nargs).unwrap_or(0);
            for &typ in (*candidate).args.as_slice(nargs) {
                add(found, typ);
            }
            add(found, pg_sys::get_op_rettype((*candidate).oid));
            candidate = (*candidate).next;
        }
    }
}
