//! The runtime gate: while it is open, no function starts that its rule does not allow.
//!
//! The guard decides on the parse tree, but some code runs where no tree shows it: parse
//! analysis converts a literal to an array of a domain and so runs the domain's CHECK, a cast to
//! json is looked up while results are collected, a superuser's query reaches a function another
//! role owns through a view. PostgreSQL's fmgr hooks (the ones sepgsql uses) see every call of a
//! function that is not built in, at the moment it starts, whoever asked for it. So the
//! extension opens the gate around what must run no code nobody asked for (analysis of SQL it
//! did not write, its own reads, result collection, all of a superuser's query) and a call that
//! the rule refuses raises 42501 before its body runs.
//!
//! The hooks are asked about a function when its call is set up (`fmgr_info`); outside an open
//! gate they say no, so nothing changes for the backend's other work (SQL functions are still
//! inlined, calls cost nothing more).

use std::cell::RefCell;
use std::rc::Rc;

use pgrx::pg_sys;

use super::facts::{builtin, FunctionFacts};
use super::policy::{self, Allowed};
use super::trust::Trusted;
use crate::error::{SqlError, SqlState};

/// What may start while a gate is open.
#[derive(Clone, Debug)]
pub enum Rule {
    /// Built-in functions only: the extension's own reads.
    BuiltinOnly,
    /// Built-ins and what a superuser allowed (`sql_query_engine.allowed_functions`): analysis
    /// of a generated query, and the collection of its results.
    Allowed(Rc<Allowed>),
    /// Functions owned by superusers or trusted roles: the whole of a superuser's query.
    TrustedOwners(Trusted),
}

/// An open gate, with what it is open for (the refusal says so).
struct Open {
    rule: Rule,
    during: &'static str,
    /// Relations a `TrustedOwners` gate let an executor start on: not judged again while it is
    /// open (a trusted function may run `EXECUTE` in a loop). The verdict holds as long: it
    /// passed only relations that trusted roles own, all the way down, and only they (or a
    /// superuser) can change what it was judged by.
    passed: Vec<pg_sys::Oid>,
    /// Tells this gate from one opened later at the same depth.
    id: u64,
}

/// Relations a gate remembers as passed, at most (past them, each start is judged again).
const MAX_PASSED: usize = 4096;

thread_local! {
    static OPEN: RefCell<Vec<Open>> = const { RefCell::new(Vec::new()) };
    static OPENED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Closes its gate when dropped, also when an ERROR unwinds past it.
#[must_use = "the gate closes when this is dropped"]
pub struct Gate {
    depth: usize,
}

impl Drop for Gate {
    fn drop(&mut self) {
        OPEN.with(|open| {
            if let Ok(mut open) = open.try_borrow_mut() {
                open.truncate(self.depth);
            }
        });
    }
}

/// Opens a gate with `rule` until the returned guard is dropped; `during` completes "may not
/// run while ...". Gates nest: a function must pass every open one.
pub fn open(rule: Rule, during: &'static str) -> Gate {
    OPEN.with_borrow_mut(|open| {
        let depth = open.len();
        let id = OPENED.get().wrapping_add(1);
        OPENED.set(id);
        open.push(Open {
            rule,
            during,
            passed: Vec::new(),
            id,
        });
        Gate { depth }
    })
}

fn is_open() -> bool {
    OPEN.with(|open| open.try_borrow().map_or(true, |open| !open.is_empty()))
}

/// Why `function` may not start now, when a gate refuses it.
fn refusal(function: pg_sys::Oid) -> Option<SqlError> {
    if builtin(function) || !is_open() {
        return None;
    }
    let facts = FunctionFacts::of(function);
    OPEN.with(|open| {
        let open = open.try_borrow().ok()?;
        open.iter().find_map(|gate| {
            let why = match (&gate.rule, &facts) {
                (_, None) => Some("it is not in the catalog".to_string()),
                // A superuser's event trigger, fired by the DDL of a saved view (nl_view): its
                // function, when a superuser owns it too (no other role can change it).
                (_, Some(f)) if f.event_trigger && superuser(f.owner) => None,
                (Rule::BuiltinOnly, Some(_)) => Some(
                    "only built-in functions run here, whatever sql_query_engine.allowed_functions says"
                        .to_string(),
                ),
                (Rule::Allowed(allowed), Some(f)) => policy::refuse_support(&f.policy(), allowed),
                (Rule::TrustedOwners(trusted), Some(f)) => trusted.refuse_owner(f.owner, "function"),
            }?;
            let signature = FunctionFacts::signature(function);
            Some(SqlError::new(
                SqlState::INSUFFICIENT_PRIVILEGE,
                format!(
                    "function {signature} may not run while {}: {why}",
                    gate.during
                ),
            ))
        })
    })
}

/// Why `relation` may not be read now, when a superuser's gate is open: every relation an
/// executor starts on while the query runs is judged as those of its tree were, also what the
/// query reaches only as it runs (SQL a trusted function builds from names and runs with
/// EXECUTE or through SPI, as some extensions' C functions do).
fn relation_refusal(relation: pg_sys::Oid) -> Option<SqlError> {
    if builtin(relation) || !is_open() {
        return None;
    }
    let trusting: Vec<(u64, Trusted, &'static str)> = OPEN.with(|open| {
        open.try_borrow()
            .map(|open| {
                open.iter()
                    .filter(|gate| !gate.passed.contains(&relation))
                    .filter_map(|gate| match &gate.rule {
                        // A saved view's DDL runs no query of the model's: what an event trigger
                        // reads as it fires is not the view's.
                        Rule::TrustedOwners(trusted) if trusted.superusers() => {
                            Some((gate.id, trusted.clone(), gate.during))
                        }
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default()
    });
    trusting.into_iter().find_map(|(id, trusted, during)| {
        // Judged outside the borrow: the walk opens relations, which may run other hooks.
        let Some(why) = trusted.refuse_relation(relation) else {
            OPEN.with(|open| {
                let Ok(mut open) = open.try_borrow_mut() else {
                    return;
                };
                if let Some(gate) = open.iter_mut().find(|gate| gate.id == id) {
                    if gate.passed.len() < MAX_PASSED {
                        gate.passed.push(relation);
                    }
                }
            });
            return None;
        };
        Some(SqlError::new(
            SqlState::INSUFFICIENT_PRIVILEGE,
            format!(
                "relation {} may not be read while {during}: {why}",
                crate::names::relation_name(relation)
            ),
        ))
    })
}

/// `relation_refusal` of each relation of an executor's range table; raises the first.
///
/// # Safety
/// `range_table` is a List of RangeTblEntry, or null.
unsafe fn check_relations(range_table: *mut pg_sys::List) {
    // Relations, and views (PostgreSQL 16 and later keep a view's OID on the subquery that
    // replaced it).
    // SAFETY: the caller's contract.
    let entries = unsafe { pgrx::PgList::<pg_sys::RangeTblEntry>::from_pg(range_table) };
    let relations: Vec<pg_sys::Oid> = entries
        .iter_ptr()
        // SAFETY: each entry of the executor's range table.
        .map(|rte| unsafe { (*rte).relid })
        .filter(|relid| *relid != pg_sys::InvalidOid)
        .collect();
    for relation in relations {
        if let Some(error) = relation_refusal(relation) {
            crate::error::Error::Refused(Box::new(error)).raise();
        }
    }
}

/// Whether a superuser's gate is open, which judges the relations an executor starts on
/// (`relation_refusal`): cheap, asked for every statement the backend plans.
pub fn judges_relations() -> bool {
    OPEN.with(|open| {
        open.try_borrow().is_ok_and(|open| {
            open.iter().any(
                |gate| matches!(&gate.rule, Rule::TrustedOwners(trusted) if trusted.superusers()),
            )
        })
    })
}

/// `relation_refusal` of every relation of `query` (analysed and rewritten: a view's own
/// relation and those it reads, at any depth: subqueries, CTEs, sublinks), before it is
/// planned; raises the first. Planning runs code of the relations it plans before any
/// executor starts: the selectivity estimate of a view's condition folds its stable functions
/// of constants (`'{1}'::text::d[]` runs domain `d`'s CHECK), so SQL a trusted function builds
/// and runs would run another role's code as the superuser before `check_perms` refuses it.
/// Called by the planner hook (`exec`), which is not guarded itself.
///
/// # Safety
/// `query` is a Query about to be planned, in a transaction.
#[pgrx::pg_guard]
pub unsafe extern "C-unwind" fn check_relations_before_planning(query: *mut pg_sys::Query) {
    let mut relations: Vec<pg_sys::Oid> = Vec::new();
    // SAFETY: the caller's contract; `relations` outlives the walk, which only reads.
    unsafe {
        relation_walker(
            query.cast(),
            (&mut relations as *mut Vec<pg_sys::Oid>).cast(),
        );
    }
    relations.sort_unstable_by_key(|relation| relation.to_u32());
    relations.dedup();
    for relation in relations {
        if let Some(error) = relation_refusal(relation) {
            crate::error::Error::Refused(Box::new(error)).raise();
        }
    }
}

/// Collects the OIDs of the relations (and views) a query tree's range tables name, at any
/// depth, into the `Vec<Oid>` `context` points to.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn relation_walker(
    node: *mut pg_sys::Node,
    context: *mut std::ffi::c_void,
) -> bool {
    if node.is_null() {
        return false;
    }
    pgrx::check_for_interrupts!();
    // SAFETY: PostgreSQL's walkers pass analysed nodes and our Vec; each node is cast to the
    // struct its tag names. The walkers check the stack's depth themselves.
    unsafe {
        match (*node).type_ {
            pg_sys::NodeTag::T_Query => pg_sys::query_tree_walker(
                node.cast(),
                Some(relation_walker),
                context,
                pg_sys::QTW_EXAMINE_RTES_BEFORE as i32,
            ),
            pg_sys::NodeTag::T_RangeTblEntry => {
                let relid = (*node.cast::<pg_sys::RangeTblEntry>()).relid;
                if relid != pg_sys::InvalidOid {
                    (*context.cast::<Vec<pg_sys::Oid>>()).push(relid);
                }
                false
            }
            _ => pg_sys::expression_tree_walker(node, Some(relation_walker), context),
        }
    }
}

static mut NEXT_CHECK_PERMS: pg_sys::ExecutorCheckPerms_hook_type = None;

/// Called as each executor starts, after PostgreSQL's own privilege checks.
#[cfg(feature = "pg15")]
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn check_perms(range_table: *mut pg_sys::List, ereport: bool) -> bool {
    // SAFETY: PostgreSQL passes the executor's range table.
    unsafe { check_relations(range_table) };
    // SAFETY: the previous hook was stored once, in `init`; it gets what this one got.
    unsafe { NEXT_CHECK_PERMS.is_none_or(|next| next(range_table, ereport)) }
}

/// Called as each executor starts, after PostgreSQL's own privilege checks.
#[cfg(not(feature = "pg15"))]
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn check_perms(
    range_table: *mut pg_sys::List,
    permissions: *mut pg_sys::List,
    ereport: bool,
) -> bool {
    // SAFETY: PostgreSQL passes the executor's range table.
    unsafe { check_relations(range_table) };
    // SAFETY: the previous hook was stored once, in `init`; it gets what this one got.
    unsafe { NEXT_CHECK_PERMS.is_none_or(|next| next(range_table, permissions, ereport)) }
}

/// Whether `role` is a superuser.
fn superuser(role: pg_sys::Oid) -> bool {
    // SAFETY: a role catalog look-up.
    unsafe { pg_sys::superuser_arg(role) }
}

static mut NEXT_NEEDS_HOOK: pg_sys::needs_fmgr_hook_type = None;
static mut NEXT_HOOK: pg_sys::fmgr_hook_type = None;

/// Asked when a call of `function` is set up: only calls set up behind an open gate are watched
/// (and whatever another extension's hook watches).
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn needs_hook(function: pg_sys::Oid) -> bool {
    if !builtin(function) && is_open() {
        return true;
    }
    // SAFETY: the previous hook was stored once, in `init`, before any call could arrive; it
    // gets exactly what PostgreSQL gave this one.
    unsafe { NEXT_NEEDS_HOOK.is_some_and(|next| next(function)) }
}

/// Called when a watched function starts, ends or fails: a refused start raises 42501.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn hook(
    event: pg_sys::FmgrHookEventType::Type,
    flinfo: *mut pg_sys::FmgrInfo,
    private: *mut pg_sys::Datum,
) {
    if event == pg_sys::FmgrHookEventType::FHET_START && !flinfo.is_null() {
        // SAFETY: PostgreSQL passes the FmgrInfo of the call that is starting.
        let function = unsafe { (*flinfo).fn_oid };
        if let Some(error) = refusal(function) {
            crate::error::Error::Refused(Box::new(error)).raise();
        }
    }
    // SAFETY: the previous hook was stored once, in `init`; it gets exactly what PostgreSQL
    // gave this one.
    unsafe {
        if let Some(next) = NEXT_HOOK {
            next(event, flinfo, private);
        }
    }
}

/// Installs the hooks (fmgr's, and the executor's privilege check), chained to any that were
/// there (called from `_PG_init`).
pub fn init() {
    // SAFETY: `_PG_init` runs once per backend, on the backend's thread, before any query.
    unsafe {
        NEXT_NEEDS_HOOK = pg_sys::needs_fmgr_hook;
        NEXT_HOOK = pg_sys::fmgr_hook;
        NEXT_CHECK_PERMS = pg_sys::ExecutorCheckPerms_hook;
        pg_sys::needs_fmgr_hook = Some(needs_hook);
        pg_sys::fmgr_hook = Some(hook);
        pg_sys::ExecutorCheckPerms_hook = Some(check_perms);
    }
}
