//! The types parse analysis may convert a literal into, read from the raw tree before
//! analysis runs. Converting a literal runs its type's input code, and the input code of an
//! array, a composite or a range runs the CHECK constraints of the domains inside it (its
//! elements, fields or bounds), with every built-in function they call: PostgreSQL's hooks
//! never see a built-in, so no gate can stop `set_config`, `pg_sleep` or `query_to_xml` there.
//! Such a type must pass before analysis (`types::literal_refusal`), not after.
//!
//! A literal's type comes from what it meets: a cast or a column definition (a type name), a
//! column of a relation the statement names, or a parameter of a function or operator it calls
//! (every candidate of the name, as analysis may choose any). Found by name exactly as
//! analysis will find them, without locks and without running anything.

use std::ffi::c_void;

use pgrx::pg_sys;

/// Types collected per statement, at most: past that, the statement is refused as too complex.
pub const MAX_TYPES: usize = 4096;

/// The comparison operators analysis uses where the statement names none (`CASE x WHEN`,
/// `IN`, `DISTINCT`): their candidates are in reach too.
const IMPLIED_OPERATORS: [&std::ffi::CStr; 6] = [c"=", c"<>", c"<", c">", c"<=", c">="];

/// The types in reach of the literals of `statement` (a raw statement from `raw_parser`),
/// `None` when there are more than `MAX_TYPES`.
///
/// # Safety
/// `statement` is a raw parse tree of the current memory context.
pub unsafe fn types_in_reach(statement: *mut pg_sys::Node) -> Option<Vec<pg_sys::Oid>> {
    let mut found: Vec<pg_sys::Oid> = Vec::new();
    // SAFETY: the caller's contract; through PostgreSQL's raw walker (the statement as a
    // one-element list, so that the walker sees it too); catalog look-ups by name that take no
    // lock and run nothing.
    unsafe {
        for name in IMPLIED_OPERATORS {
            let names = pg_sys::lappend(
                std::ptr::null_mut(),
                pg_sys::makeString(pg_sys::pstrdup(name.as_ptr())).cast(),
            );
            operators(names, &mut found);
        }
        let list = pg_sys::lappend(std::ptr::null_mut(), statement.cast());
        pg_sys::raw_expression_tree_walker(
            list.cast(),
            Some(collector),
            (&mut found as *mut Vec<pg_sys::Oid>).cast(),
        );
    }
    (found.len() <= MAX_TYPES).then_some(found)
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn collector(node: *mut pg_sys::Node, context: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: PostgreSQL's raw walker passes raw nodes and our list; each node is read as the
    // struct its tag names.
    unsafe {
        let found = &mut *context.cast::<Vec<pg_sys::Oid>>();
        if found.len() > MAX_TYPES {
            return true;
        }
        match (*node).type_ {
            pg_sys::NodeTag::T_TypeName => {
                // Without its modifiers: reading them would run the type's modifier code.
                let typ = pg_sys::LookupTypeNameOid(std::ptr::null_mut(), node.cast(), true);
                add(found, typ);
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

fn add(found: &mut Vec<pg_sys::Oid>, typ: pg_sys::Oid) {
    if typ != pg_sys::InvalidOid && !found.contains(&typ) {
        found.push(typ);
    }
}

/// The column types of `relation` (dropped columns aside).
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
            candidate = (*candidate).next;
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
