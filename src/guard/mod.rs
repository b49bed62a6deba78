//! The statement policy, decided on PostgreSQL's own parse trees. Fail closed: what cannot be
//! proven safe is refused.
//!
//! 1. The raw tree (`raw_parser`, the server's grammar): exactly one statement, a SELECT, VALUES
//!    or set operation of those, without `INTO`; no data-modifying CTE and no locking clause at
//!    any depth. Parsing runs no code.
//! 2. Parse analysis (names resolved exactly as the server resolves them), behind the runtime
//!    gate (`gate`): analysis converts literals to their types, and a literal of an array of a
//!    domain, a composite or a range runs that type's input code; no function may start there
//!    that the policy does not allow. The gate sees no built-in function, so the domain CHECKs
//!    such input code runs are checked before analysis, for every type a literal could meet
//!    (`ahead`). Call `check` inside the sandbox (`exec`): analysis can raise any error.
//! 3. The analyzed tree: every function called anywhere (select list, WHERE, ORDER BY, LATERAL,
//!    FROM, CTEs, sublinks, default arguments) must pass the allow-list in `policy.rs`, and so
//!    must what runs implicitly: the support functions of user aggregates, the functions and
//!    planner estimators behind user operators (sort and grouping operators included), and
//!    every type a value has or is converted to (`types.rs`: input, output, cast and support
//!    functions, domain CHECKs, the fields of composites, column definition lists, XMLTABLE and
//!    JSON_TABLE columns). A node kind the walk does not know is refused. System catalogs are
//!    refused unless `sql_query_engine.allow_system_catalogs` is on.
//! 4. A superuser's call (`trust.rs`) reads only relations that superusers or trusted roles own.
//!    A query the caller did not write (the model's, a verified example's) names only relations
//!    of the caller's schema context (`scope.rs`).
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

mod ahead;
mod bodies;
mod bounds;
mod cost;
mod doubts;
mod facts;
pub mod gate;
mod keys;
mod outer;
mod policy;
mod refs;
mod scope;
mod trust;
mod types;
mod verdict;
mod walk;

use std::ffi::{c_void, CStr, CString};

use pgrx::pg_sys;
use pgrx::PgList;

use crate::error::SqlState;
use crate::settings;
use bounds::MAX_CLAUSE_ITEMS;
use walk::too_deep;

pub use doubts::doubts;
pub use facts::{base_type, builtin, row_fields, type_holds};
pub use outer::outer_column_subquery;
pub use policy::Allowed;
pub use refs::{references, ColumnRef, GroupBy, Named, References, RelationRef, Select};
pub use scope::Scope;
pub use trust::{saving_call, superuser_call, trusted_by_the_current_user, Trusted};
pub use types::{holds_looked_up, is_looked_up, names_code};
pub use verdict::{Origin, Refusal};
pub use walk::check_tree;

/// What a superuser allowed beyond the built-ins (`sql_query_engine.allowed_functions`),
/// parsed once per value. An unparsable setting allows nothing more (and says so once per
/// backend).
pub fn allowed_functions() -> Allowed {
    thread_local! {
        static PARSED: std::cell::RefCell<Option<(String, Allowed)>> =
            const { std::cell::RefCell::new(None) };
    }
    let text = settings::allowed_functions();
    PARSED.with_borrow_mut(|parsed| {
        if let Some((cached, allowed)) = parsed.as_ref() {
            if *cached == text {
                return allowed.clone();
            }
        }
        let allowed = Allowed::parse(&text).unwrap_or_else(|e| {
            crate::error::warning(format!(
                "sql_query_engine.allowed_functions is ignored: {e}; only built-in functions run"
            ));
            Allowed::default()
        });
        *parsed = Some((text, allowed.clone()));
        allowed
    })
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

/// Checks `sql`, written by `origin`; `trusted` is set for a superuser's call, `scope` for a
/// query the caller did not write (the relations it may name). Parse and analysis errors are
/// raised as the server's own ERRORs (SQLSTATE and position included), so call this inside the
/// sandbox, where errors are caught.
pub fn check(
    sql: &str,
    origin: Origin,
    trusted: Option<&Trusted>,
    scope: Option<&Scope>,
) -> Result<Checked, Refusal> {
    let (text, statements) = parsed(sql)?;
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
    if let Some(scope) = scope {
        // SAFETY: a RawStmt from raw_parser.
        if let Some(refusal) = unsafe { scope.refusal_before_analysis((*raw).stmt) } {
            return Err(refusal);
        }
    }
    let allowed = match origin {
        Origin::Generated => allowed_functions(),
        Origin::Own => Allowed::default(),
    };
    let rule = match origin {
        Origin::Generated => gate::Rule::Allowed(std::rc::Rc::new(allowed.clone())),
        Origin::Own => gate::Rule::BuiltinOnly,
    };
    if origin == Origin::Generated {
        // SAFETY: a RawStmt from raw_parser.
        literals_refusal(unsafe { (*raw).stmt }, allowed.clone(), trusted, scope)?;
    }
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
    let relations = unsafe { check_tree(query, origin, allowed, trusted, None) }?;
    if let Some(refusal) = scope.and_then(|scope| scope.refusal(&relations)) {
        return Err(refusal);
    }
    Ok(Checked {
        query,
        text,
        relations,
    })
}

/// `sql` as text for PostgreSQL and its raw statements (the server's grammar; nothing runs).
fn parsed(sql: &str) -> Result<(CString, PgList<pg_sys::RawStmt>), Refusal> {
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
    Ok((text, statements))
}

/// Why converting the string literals of `statement` (from `raw_parser`) while it is analysed
/// could run a domain's CHECK that the policy refuses (see `ahead`), or, for a statement the
/// caller did not write (`scope`), why analysing it would lock a relation outside the scope
/// through a row type it reaches (`Scope::row_type_refusal`).
fn literals_refusal(
    statement: *mut pg_sys::Node,
    allowed: Allowed,
    trusted: Option<&Trusted>,
    scope: Option<&Scope>,
) -> Result<(), Refusal> {
    // SAFETY: the caller gives a raw statement.
    let reach = unsafe { ahead::types_in_reach(statement, scope) };
    let reach = reach.map_err(|unknown| match unknown {
        ahead::Unknown::TooManyTypes => Refusal::read(
            SqlState::STATEMENT_TOO_COMPLEX,
            "the query names too many types to be checked".into(),
        ),
        ahead::Unknown::KeptChanging => Refusal::read(
            SqlState::OBJECT_IN_USE,
            "the tables the query names kept changing while it was checked; ask again".into(),
        ),
    })?;
    // Names read again after a wait are checked again, now that what they find is locked: one
    // that finds a relation outside the scope (renamed into a name the scope admitted) is
    // refused before analysis converts a literal to its columns' types.
    if let Some(scope) = scope.filter(|_| reach.walked_again) {
        // SAFETY: the caller gives a raw statement.
        if let Some(refusal) = unsafe { scope.refusal_before_analysis(statement) } {
            return Err(refusal);
        }
    }
    if let Some(refusal) = scope.and_then(|scope| scope.row_type_refusal(&reach.named)) {
        return Err(refusal);
    }
    if !reach.literal {
        return Ok(());
    }
    // A role's generated query: the types a literal may be converted to are judged by their
    // owners too, before analysis runs their input (`trust::objects_of_relations`).
    let objects = trusted
        .is_none()
        .then(|| trust::objects_of_relations(reach.relations));
    walk::literals_refusal(&reach.types, allowed, trusted.or(objects.as_ref()))
}

/// `literals_refusal` for SQL about to be analysed again (the text a view is created from):
/// between its check and now, a domain's owner may have given a domain a CHECK.
pub fn check_literals(sql: &str, trusted: Option<&Trusted>) -> Result<(), Refusal> {
    let (_text, statements) = parsed(sql)?;
    let refused = statements.iter_ptr().try_for_each(|raw| {
        // SAFETY: raw_parser returns RawStmt nodes.
        literals_refusal(unsafe { (*raw).stmt }, allowed_functions(), trusted, None)
    });
    refused
}

/// The checked query `query` as PostgreSQL writes it out on the pinned search path, every name
/// it would not find there qualified (relations, functions, operators, types), and constants
/// written in full (`subxact::pinned_exact`): text that binds
/// the same objects wherever and whenever it is parsed again, whatever closer ones another role
/// made since (`nl_view` saves it). Written out behind the gate: a constant's type output
/// function runs.
///
/// # Safety
/// `query` must be the analyzed tree `check` passed, in the current transaction.
pub unsafe fn qualified_text(query: *mut pg_sys::Query) -> String {
    let _gate = gate::open(
        gate::Rule::Allowed(std::rc::Rc::new(allowed_functions())),
        "the answer is written out",
    );
    crate::subxact::pinned_exact(|| {
        // SAFETY: the caller's contract; ruleutils may change the tree it writes out, so it
        // gets a copy, in the current memory context.
        unsafe {
            let copy = pg_sys::copyObjectImpl(query.cast_const().cast()).cast::<pg_sys::Query>();
            crate::names::c_string(pg_sys::pg_get_querydef(copy, false))
        }
    })
}

/// Checks the query view `view` stores, just created from a checked query's qualified text
/// (`ResultSet::qualified_sql`), as `check` checks a generated query: CREATE VIEW analyses the
/// text again, and an object that came between (a relation dropped and made again under its
/// name, made while the model was asked) would be in the view, run by whoever reads it.
pub fn check_view(
    view: pg_sys::Oid,
    trusted: Option<&Trusted>,
    scope: Option<&Scope>,
) -> Result<(), Refusal> {
    // SAFETY: the view is opened with the lock a reader takes, its stored query copied into
    // the current memory context before it is closed, and the copy only read.
    let query = unsafe {
        let opened = facts::OpenRelation::open(view, pg_sys::AccessShareLock);
        if (*(*opened.0).rd_rel).relkind as u8 != pg_sys::RELKIND_VIEW {
            return Err(Refusal::forbidden(
                "the saved question's relation is not a view".into(),
            ));
        }
        pg_sys::copyObjectImpl(pg_sys::get_view_query(opened.0).cast_const().cast())
            .cast::<pg_sys::Query>()
    };
    // SAFETY: the copy made above, in this transaction.
    let relations = unsafe {
        check_tree(
            query,
            Origin::Generated,
            allowed_functions(),
            trusted,
            Some(view),
        )
    }?;
    match scope.and_then(|scope| scope.refusal(&relations)) {
        Some(refusal) => Err(refusal),
        None => Ok(()),
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
        let mut raw = RawCheck {
            found: None,
            bounds: bounds::Bounds::default(),
        };
        // Through PostgreSQL's walker (see `check`), the statement itself first.
        raw_walker(statement, (&mut raw as *mut RawCheck).cast());
        raw.found.map_or(Ok(()), Err)
    }
}

/// What the raw walk found: a refusal, and what it counted of the work analysis will do.
struct RawCheck {
    found: Option<Refusal>,
    bounds: bounds::Bounds,
}

/// Whether a clause of `select` is longer than `MAX_CLAUSE_ITEMS`.
///
/// # Safety
/// `select` is a raw SelectStmt.
unsafe fn too_long(select: *mut pg_sys::SelectStmt) -> bool {
    // SAFETY: the caller's contract; the lists are PostgreSQL's.
    unsafe {
        let with = (*select).withClause;
        [
            (*select).targetList,
            (*select).groupClause,
            (*select).sortClause,
            (*select).distinctClause,
            (*select).windowClause,
            // Analysis checks each FROM item's name against every one before it, and each WITH
            // query's against every other, checking for no interrupt either.
            (*select).fromClause,
            if with.is_null() {
                std::ptr::null_mut()
            } else {
                (*with).ctes
            },
        ]
        .into_iter()
        .any(|list| !list.is_null() && (*list).length as usize > MAX_CLAUSE_ITEMS)
    }
}

/// A clause too long, a locking clause or a data-modifying CTE at this raw node.
unsafe fn raw_node_refusal(node: *mut pg_sys::Node) -> Option<Refusal> {
    // SAFETY: a raw parse node; its tag says which struct it is.
    unsafe {
        match (*node).type_ {
            // Analysis matches each GROUP BY, ORDER BY and DISTINCT item against the whole
            // target list, and each FROM item's and WITH query's name against the others,
            // checking for no interrupt: lists of tens of thousands of items (another role's
            // example, read from the table) keep a backend deaf to cancel for minutes. No
            // query needs more than a row holds (1664 columns).
            pg_sys::NodeTag::T_SelectStmt if too_long(node.cast()) => Some(Refusal::read(
                SqlState::STATEMENT_TOO_COMPLEX,
                format!(
                    "a select list, FROM list, WITH clause, GROUP BY, ORDER BY, DISTINCT or \
                     WINDOW clause of more than {MAX_CLAUSE_ITEMS} items is not allowed"
                ),
            )),
            pg_sys::NodeTag::T_SelectStmt
                if !(*node.cast::<pg_sys::SelectStmt>()).lockingClause.is_null() =>
            {
                Some(Refusal::forbidden(
                    "a locking clause (FOR UPDATE/SHARE) is not allowed in a generated query: it takes row locks"
                        .into(),
                ))
            }
            pg_sys::NodeTag::T_CommonTableExpr => {
                let cte = node.cast::<pg_sys::CommonTableExpr>();
                let query = (*cte).ctequery;
                if !query.is_null() && (*query).type_ != pg_sys::NodeTag::T_SelectStmt {
                    return Some(Refusal::write(&format!(
                        "{} (in a WITH clause)",
                        command_name(query)
                    )));
                }
                // Analysed before any check could see them (PostgreSQL's walker skips them),
                // and their marks are literals converted there: refused, as the analysed walk
                // would refuse them anyway.
                (!(*cte).search_clause.is_null() || !(*cte).cycle_clause.is_null()).then(|| {
                    Refusal::forbidden(
                        "SEARCH and CYCLE clauses of a recursive WITH query are not allowed in \
                         a generated query"
                            .into(),
                    )
                })
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
    // SAFETY: PostgreSQL's raw walker passes raw parse nodes and our context, a `RawCheck`.
    unsafe {
        let raw = &mut *context.cast::<RawCheck>();
        // The depth first: what `count` reads of a node is bounded by the node, not the stack.
        if let Some(refusal) = too_deep().or_else(|| {
            raw.bounds.count(node);
            raw_node_refusal(node).or_else(|| raw.bounds.refusal())
        }) {
            raw.found = Some(refusal);
            return true;
        }
        // A SELECT's FROM items are in scope for what is below it.
        let select = (*node).type_ == pg_sys::NodeTag::T_SelectStmt;
        if select {
            raw.bounds.enter(node.cast());
        }
        let stopped = pg_sys::raw_expression_tree_walker(node, Some(raw_walker), context);
        if select {
            raw.bounds.leave();
        }
        stopped
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
