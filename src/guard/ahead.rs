//! The types parse analysis may convert a literal into, read from the raw tree before
//! analysis runs. Converting a literal runs its type's input code, and the input code of an
//! array, a composite or a range runs the CHECK constraints of the domains inside it (its
//! elements, fields or bounds), with every built-in function they call: PostgreSQL's hooks
//! never see a built-in, so no gate can stop `set_config`, `pg_sleep` or `query_to_xml` there.
//! Such a type must pass before analysis (`types::literal_refusal`), not after.
//!
//! A literal's type comes from what it meets: a cast or a column definition (a type name), a
//! column or the row of a relation the statement names, or a parameter or result of a function
//! or operator it calls (every candidate of the name, as analysis may choose any; and the type
//! of that name, as a call of a type's name with one literal is a cast), or an array
//! of one of those (`ARRAY[c] || '{1}'`, `COALESCE(ARRAY[c], '{1}')`). Found by name exactly as
//! analysis will find them, without running anything. Only a string literal is converted by a
//! type's input code (a number or NULL is not): a statement without one needs no look-up.
//!
//! The relations the statement names are locked as analysis will lock them, and a walk that
//! had to wait for one is made again: another role could otherwise hold a table locked for as
//! long as it liked while it committed a change (a column's new type, a type, table or
//! function of the same name earlier on the search path) after the walk read the names it
//! shadows, and before analysis looked them up again. A change committed without such a wait
//! races the walk's own time (milliseconds).

use std::collections::HashSet;
use std::ffi::c_void;

use pgrx::pg_sys;
use pgrx::PgList;

use super::facts::builtin;
use super::scope::Scope;

/// Types collected per statement, at most: past that, the statement is refused as too complex.
pub const MAX_TYPES: usize = 4096;

/// Walks of a statement that each waited for a lock: past that (its relations held by other
/// transactions again and again), it is refused (55006).
const MAX_WALKS: usize = 4;

/// The comparison operators analysis uses where the statement names none (`CASE x WHEN`,
/// `IN`, `DISTINCT`): their candidates are in reach too.
const IMPLIED_OPERATORS: [&std::ffi::CStr; 6] = [c"=", c"<>", c"<", c">", c"<=", c">="];

/// What the walk collects: the types in reach, whether the statement has a string literal,
/// whether there were more types than `MAX_TYPES`, and the function and operator names looked
/// up already.
#[derive(Default)]
struct Reach {
    types: Types,
    literal: bool,
    overflow: bool,
    looked_up: HashSet<String>,
    /// Whether a relation's lock had to be waited for.
    waited: bool,
    /// The types of the columns of the relations named (in reach of a literal too).
    columns: Types,
    /// The relations named (their owners' types a literal may be converted to).
    relations: HashSet<pg_sys::Oid>,
    /// What a statement the caller did not write may name: a name of a relation outside it
    /// that is left (`Scope::refusal_before_analysis` refused the others) is a WITH query's,
    /// and is not locked.
    scope: Option<Scope>,
}

/// Types in the order found, each once.
#[derive(Default)]
struct Types {
    list: Vec<pg_sys::Oid>,
    seen: HashSet<pg_sys::Oid>,
}

/// Why the types in reach of a statement's literals could not be known.
#[derive(Debug, PartialEq, Eq)]
pub enum Unknown {
    /// More than `MAX_TYPES`.
    TooManyTypes,
    /// Each of `MAX_WALKS` walks had to wait for a relation's lock.
    KeptChanging,
}

/// What a statement reaches before it is analysed: the types (named, of the functions,
/// operators and relations it names), and whether it has a string literal (which analysis
/// converts into one of them).
pub struct InReach {
    /// Every type in reach, the columns' of the relations named included.
    pub types: Vec<pg_sys::Oid>,
    /// The types named, and those of the functions and operators named: what the statement
    /// itself brings in, beyond the relations it reads.
    pub named: Vec<pg_sys::Oid>,
    /// The relations the statement names, locked.
    pub relations: Vec<pg_sys::Oid>,
    pub literal: bool,
    /// Whether a walk had to wait for a lock and was made again: a name may find another
    /// relation now than when the statement's scope was checked (one renamed into its place
    /// while the walk waited), which the walk passes over as a WITH query's.
    pub walked_again: bool,
}

/// The types in reach of `statement` (a raw statement from `raw_parser`), and whether it has a
/// string literal.
///
/// # Safety
/// `statement` is a raw parse tree of the current memory context.
pub unsafe fn types_in_reach(
    statement: *mut pg_sys::Node,
    scope: Option<&Scope>,
) -> Result<InReach, Unknown> {
    let mut reach;
    let mut named_len;
    let mut walks = 0;
    // Through PostgreSQL's raw walker (the statement as a one-element list, so that the walker
    // sees it too); the locks on the relations named are held until the sandbox's
    // subtransaction ends.
    // SAFETY: the caller's contract; catalog look-ups by name that run nothing, and locks that
    // analysis takes too.
    unsafe {
        let list = pg_sys::lappend(std::ptr::null_mut(), statement.cast());
        loop {
            // A walk that had to wait for a relation's lock read some names before the wait,
            // and changes may have been committed meanwhile, for as long as the other
            // transaction chose: it is made again, now that every relation it named is
            // locked. (A change committed while a walk that waited for nothing runs, or
            // between the walk and analysis, races a window of the walk's own time.)
            pg_sys::AcceptInvalidationMessages();
            reach = Reach {
                scope: scope.cloned(),
                ..Reach::default()
            };
            pg_sys::raw_expression_tree_walker(
                list.cast(),
                Some(collector),
                (&mut reach as *mut Reach).cast(),
            );
            // What the statement itself names, before the operators a literal implies (which
            // analysis resolves only for the literal's own types).
            named_len = reach.types.list.len();
            if reach.literal {
                for name in IMPLIED_OPERATORS {
                    let names = pg_sys::lappend(
                        std::ptr::null_mut(),
                        pg_sys::makeString(pg_sys::pstrdup(name.as_ptr())).cast(),
                    );
                    operators(names, &mut reach);
                }
            }
            walks += 1;
            if !reach.waited {
                break;
            }
            if walks >= MAX_WALKS {
                return Err(Unknown::KeptChanging);
            }
        }
    }
    // What is in reach is looked at for a literal, and for a statement the caller did not
    // write (`Scope::row_type_refusal`): only then must it be whole.
    let looked_at = reach.literal || scope.is_some();
    let named = reach.types.list[..named_len.min(reach.types.list.len())].to_vec();
    for typ in reach.columns.list {
        add(&mut reach.types, typ);
    }
    if looked_at && (reach.overflow || reach.types.list.len() > MAX_TYPES) {
        return Err(Unknown::TooManyTypes);
    }
    Ok(InReach {
        types: reach.types.list,
        named,
        relations: reach.relations.into_iter().collect(),
        literal: reach.literal,
        walked_again: walks > 1,
    })
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn collector(node: *mut pg_sys::Node, context: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    pgrx::check_for_interrupts!();
    // SAFETY: PostgreSQL's raw walker passes raw nodes and our `Reach`; each node is read as
    // the struct its tag names.
    unsafe {
        let reach = &mut *context.cast::<Reach>();
        if (*node).type_ == pg_sys::NodeTag::T_A_Const {
            let constant = node.cast::<pg_sys::A_Const>();
            if !(*constant).isnull && (*constant).val.node.type_ == pg_sys::NodeTag::T_String {
                reach.literal = true;
            }
        }
        // Past the bound nothing more is collected, but the walk goes on to find a literal:
        // a statement with one is then refused as too complex.
        if reach.types.list.len() > MAX_TYPES {
            reach.overflow = true;
        } else {
            collect(node, reach);
        }
        pg_sys::raw_expression_tree_walker(node, Some(collector), context)
    }
}

/// What `node` brings into reach.
///
/// # Safety
/// `node` is a raw parse node.
unsafe fn collect(node: *mut pg_sys::Node, reach: &mut Reach) {
    // SAFETY: the caller's contract; each node is read as the struct its tag names.
    unsafe {
        match (*node).type_ {
            pg_sys::NodeTag::T_TypeName => type_named(node.cast(), &mut reach.types),
            // XMLTABLE's columns: PostgreSQL's walker does not visit their type names.
            pg_sys::NodeTag::T_RangeTableFuncCol => {
                type_named(
                    (*node.cast::<pg_sys::RangeTableFuncCol>()).typeName,
                    &mut reach.types,
                );
            }
            // Locked as analysis will lock it, before its columns are read: a type changed
            // while the query waited for the lock (an ALTER held uncommitted, then committed)
            // is the type read here, not only the one analysis converts a literal to.
            pg_sys::NodeTag::T_RangeVar => {
                let look_up = |mode: u32, options: u32| {
                    pg_sys::RangeVarGetRelidExtended(
                        node.cast(),
                        mode as pg_sys::LOCKMODE,
                        options,
                        None,
                        std::ptr::null_mut(),
                    )
                };
                // The relation the name finds now, unlocked.
                let named = || look_up(pg_sys::NoLock, pg_sys::RVROption::RVR_MISSING_OK);
                if let Some(scope) = &reach.scope {
                    let named = named();
                    if named != pg_sys::InvalidOid && !scope.admits(named) {
                        return;
                    }
                }
                let lock = |options: u32| look_up(pg_sys::AccessShareLock, options);
                // Without waiting first: none (a name of no relation, or one another
                // transaction holds) is then asked for again, waiting. A wait counts also
                // when the relation is gone once it ends (dropped or renamed meanwhile).
                let mut relation =
                    lock(pg_sys::RVROption::RVR_MISSING_OK | pg_sys::RVROption::RVR_SKIP_LOCKED);
                if relation == pg_sys::InvalidOid {
                    let named = named();
                    relation = lock(pg_sys::RVROption::RVR_MISSING_OK);
                    reach.waited |= named != pg_sys::InvalidOid || relation != pg_sys::InvalidOid;
                }
                if relation != pg_sys::InvalidOid {
                    columns(relation, &mut reach.columns);
                    reach.relations.insert(relation);
                }
            }
            pg_sys::NodeTag::T_FuncCall => {
                functions((*node.cast::<pg_sys::FuncCall>()).funcname, reach);
            }
            // `o.f` and `(o).f` call a function `f` of the row when no column is so named.
            pg_sys::NodeTag::T_ColumnRef => {
                let fields =
                    PgList::<pg_sys::Node>::from_pg((*node.cast::<pg_sys::ColumnRef>()).fields);
                if fields.len() >= 2 {
                    if let Some(last) = fields.get_ptr(fields.len() - 1) {
                        attribute_function(last, reach);
                    }
                }
            }
            pg_sys::NodeTag::T_A_Indirection => {
                let members = PgList::<pg_sys::Node>::from_pg(
                    (*node.cast::<pg_sys::A_Indirection>()).indirection,
                );
                for member in members.iter_ptr() {
                    attribute_function(member, reach);
                }
            }
            pg_sys::NodeTag::T_A_Expr => operators((*node.cast::<pg_sys::A_Expr>()).name, reach),
            pg_sys::NodeTag::T_SubLink => {
                operators((*node.cast::<pg_sys::SubLink>()).operName, reach);
            }
            pg_sys::NodeTag::T_SortBy => operators((*node.cast::<pg_sys::SortBy>()).useOp, reach),
            _ => {}
        }
    }
}

/// The functions a name in attribute notation (`o.f`) may call, when it is a name.
///
/// # Safety
/// `member` is a raw parse node, or null.
unsafe fn attribute_function(member: *mut pg_sys::Node, reach: &mut Reach) {
    // SAFETY: the caller's contract; a String node is copied into a one-name list.
    unsafe {
        if !member.is_null() && (*member).type_ == pg_sys::NodeTag::T_String {
            functions(pg_sys::lappend(std::ptr::null_mut(), member.cast()), reach);
        }
    }
}

/// `names` as one key, to look each name up once.
///
/// # Safety
/// `names` is a list of String nodes.
unsafe fn key(names: *mut pg_sys::List) -> String {
    // SAFETY: the caller's contract.
    unsafe {
        PgList::<pg_sys::Node>::from_pg(names)
            .iter_ptr()
            .map(|name| match (*name).type_ {
                pg_sys::NodeTag::T_String => {
                    crate::names::c_string((*name.cast::<pg_sys::String>()).sval)
                }
                _ => String::from("*"),
            })
            .collect::<Vec<_>>()
            .join("\u{0}")
    }
}

/// The type a type name names, without its modifiers (reading them would run the type's
/// modifier code).
///
/// # Safety
/// `name` is a raw tree's TypeName, or null.
unsafe fn type_named(name: *mut pg_sys::TypeName, found: &mut Types) {
    if !name.is_null() {
        // SAFETY: the caller's contract; a catalog look-up that runs nothing.
        add(found, unsafe {
            pg_sys::LookupTypeNameOid(std::ptr::null_mut(), name, true)
        });
    }
}

/// `typ`, and the array of it that analysis may make of a value of it. A built-in type is
/// made of built-in types only: it holds no domain, so it is left out.
fn add(found: &mut Types, typ: pg_sys::Oid) {
    if typ == pg_sys::InvalidOid || builtin(typ) || !found.seen.insert(typ) {
        return;
    }
    found.list.push(typ);
    // SAFETY: a catalog look-up.
    let array = unsafe { pg_sys::get_array_type(typ) };
    if array != pg_sys::InvalidOid && found.seen.insert(array) {
        found.list.push(array);
    }
}

/// The column types of `relation` (dropped columns aside). Its row type is not needed: a
/// literal compared with a whole row (`=`) is an anonymous record, which has no input, and one
/// that meets a row where a common type is chosen (`COALESCE(t, '(1,x)')`, `t IN ('…', '…')`,
/// a UNION's other arm) becomes that row type, whose input runs the input code of its columns'
/// types, judged here as parts of their arrays (`add`), which `types` follows into a domain's
/// CHECK.
///
/// # Safety
/// In a transaction.
unsafe fn columns(relation: pg_sys::Oid, found: &mut Types) {
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

/// The parameter and result types of every function named `names` (each name looked up once),
/// and the type so named: analysis takes `name('literal')` for a cast to type `name` when no
/// function matches (PostgreSQL's `FuncNameAsType`), which converts the literal as it goes.
///
/// # Safety
/// `names` is a raw tree's name list (String nodes), or null.
unsafe fn functions(names: *mut pg_sys::List, reach: &mut Reach) {
    // SAFETY: the caller's contract; the candidate list is palloc'd, each with `nargs` types.
    unsafe {
        if names.is_null() || !reach.looked_up.insert(format!("f{}", key(names))) {
            return;
        }
        type_named(pg_sys::makeTypeNameFromNameList(names), &mut reach.types);
        let mut candidate = pg_sys::FuncnameGetCandidates(
            names,
            -1,
            std::ptr::null_mut(),
            false,
            false,
            false,
            true,
        );
        while !candidate.is_null() && reach.types.list.len() <= MAX_TYPES {
            let nargs = usize::try_from((*candidate).nargs).unwrap_or(0);
            for &typ in (*candidate).args.as_slice(nargs) {
                add(&mut reach.types, typ);
            }
            results((*candidate).oid, &mut reach.types);
            candidate = (*candidate).next;
        }
    }
}

/// A function's result type and the types of its OUT and TABLE parameters (the columns of
/// its result), read from its catalog row (none for a function dropped meanwhile).
///
/// # Safety
/// In a transaction.
unsafe fn results(function: pg_sys::Oid, found: &mut Types) {
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
        add(
            found,
            (*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_proc>(tuple)).prorettype,
        );
        let desc = pg_sys::build_function_result_tupdesc_t(tuple);
        pg_sys::ReleaseSysCache(tuple);
        if !desc.is_null() {
            for attribute in crate::compat::attributes(desc) {
                add(found, attribute.atttypid);
            }
        }
    }
}

/// The operand and result types of every operator named `names` (each name looked up once).
///
/// # Safety
/// `names` is a raw tree's name list (String nodes), or null.
unsafe fn operators(names: *mut pg_sys::List, reach: &mut Reach) {
    // SAFETY: the caller's contract; the candidate list is palloc'd, each with `nargs` types.
    unsafe {
        if names.is_null() || !reach.looked_up.insert(format!("o{}", key(names))) {
            return;
        }
        let mut candidate = pg_sys::OpernameGetCandidates(names, 0, true);
        while !candidate.is_null() && reach.types.list.len() <= MAX_TYPES {
            let nargs = usize::try_from((*candidate).nargs).unwrap_or(0);
            for &typ in (*candidate).args.as_slice(nargs) {
                add(&mut reach.types, typ);
            }
            add(&mut reach.types, pg_sys::get_op_rettype((*candidate).oid));
            candidate = (*candidate).next;
        }
    }
}
