//! A superuser's call: code another role wrote must not run with a superuser's rights because a
//! model picked that role's relation. Views and row-security policies run their owner's
//! functions as the caller, and owner code can `RESET ROLE` when the session user is a
//! superuser, so a call counts as a superuser's when the current or the session user is one.
//! Its generated queries may read only relations owned by superusers (or by the roles
//! `sql_query_engine.trusted_owners` names), directly, through views, partitions or
//! inheritance children; the runtime gate refuses every function of another owner.

use std::ffi::CStr;

use pgrx::{pg_sys, PgList};

use super::facts::{
    aggregate_support, builtin, default_arguments, expression_kind, linked_operators,
    operator_name, operator_owner, parts, result_column_types, stored_checks, trusted_owners,
    type_name, CacheList, FunctionFacts, OpenRelation, TypeFacts, MAX_LINKED_OPERATORS,
};
use crate::names::{relation_name, role_name};

/// The owners a superuser's call trusts: superusers, and these roles (`trusted_owners`, and for
/// a call of a role that is no superuser but reaches as far, the calling roles themselves: its
/// own objects are its own code).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trusted {
    roles: Vec<pg_sys::Oid>,
    /// A saved question's view of a role that is not a superuser (`saving_call`): what it keeps
    /// (functions, types, operators, and the relations it reads, with the views, policies and
    /// children they go through) is judged by its owners, who could change it later for every
    /// reader of the view.
    saving: bool,
    /// A generated query of a role that is no superuser (`objects_of`): only the types and
    /// operators it uses are judged by their owners; its relations and functions are not.
    objects_only: bool,
}

/// Views followed at most into the views they read.
const MAX_VIEW_DEPTH: usize = 32;
/// The most types, their parts counted, that the views and policies one relation goes through
/// may use for a superuser's call (each is one catalog look-up).
const MAX_REACHED_TYPES: usize = 4096;

/// Predefined roles whose members may act as the server's operating-system user: running
/// programs, reading and writing its files.
const SERVER_ROLES: [u32; 3] = [
    pg_sys::ROLE_PG_EXECUTE_SERVER_PROGRAM,
    pg_sys::ROLE_PG_READ_SERVER_FILES,
    pg_sys::ROLE_PG_WRITE_SERVER_FILES,
];

/// Functions that act as the server's operating-system user, which only superusers may run
/// unless EXECUTE is granted: the built-ins `lo_import`, `lo_export`, `pg_read_file` and
/// `pg_read_binary_file` and adminpack's `pg_file_write`, `pg_file_rename` and
/// `pg_file_unlink` where it is installed (in `pg_catalog`, up to PostgreSQL 16), which read or
/// write the server's files, and dblink's `dblink_connect_u`, in whichever schema dblink is,
/// which connects to the server as that user without a password. Listing or describing files
/// (`pg_ls_dir`, `pg_stat_file`) reaches no further than that.
fn server_user_functions() -> Vec<pg_sys::Oid> {
    use pg_sys::Oid;
    let mut functions = vec![
        Oid::from(pg_sys::F_LO_IMPORT_TEXT),
        pg_sys::F_LO_IMPORT_TEXT_OID,
        Oid::from(pg_sys::F_LO_EXPORT),
        Oid::from(pg_sys::F_PG_READ_FILE_TEXT),
        Oid::from(pg_sys::F_PG_READ_FILE_TEXT_INT8_INT8),
        Oid::from(pg_sys::F_PG_READ_FILE_TEXT_INT8_INT8_BOOL),
        Oid::from(pg_sys::F_PG_READ_BINARY_FILE_TEXT),
        Oid::from(pg_sys::F_PG_READ_BINARY_FILE_TEXT_INT8_INT8),
        Oid::from(pg_sys::F_PG_READ_BINARY_FILE_TEXT_INT8_INT8_BOOL),
    ];
    // The (text, boolean) forms came with PostgreSQL 16 (15's pg_read_file_old checks for a
    // superuser itself).
    #[cfg(not(feature = "pg15"))]
    functions.extend([
        Oid::from(pg_sys::F_PG_READ_FILE_TEXT_BOOL),
        Oid::from(pg_sys::F_PG_READ_BINARY_FILE_TEXT_BOOL),
    ]);
    let (text, boolean) = (pg_sys::TEXTOID, pg_sys::BOOLOID);
    let adminpack: [(&CStr, &[Oid]); 4] = [
        (c"pg_file_write", &[text, text, boolean]),
        (c"pg_file_rename", &[text, text]),
        (c"pg_file_rename", &[text, text, text]),
        (c"pg_file_unlink", &[text]),
    ];
    functions.extend(
        adminpack
            .into_iter()
            .filter_map(|(name, args)| catalog_function(name, args)),
    );
    functions.extend(extension_functions(c"dblink", c"dblink_connect_u"));
    functions
}

/// The functions called `name` that belong to the extension `extension`, in any schema.
fn extension_functions(extension: &CStr, name: &CStr) -> Vec<pg_sys::Oid> {
    // SAFETY: an extension look-up by a NUL-terminated name (InvalidOid when it is not
    // installed).
    let extension = unsafe { pg_sys::get_extension_oid(extension.as_ptr(), true) };
    if extension == pg_sys::InvalidOid {
        return Vec::new();
    }
    // SAFETY: the first key of PROCNAMEARGSNSP is the name, as a NUL-terminated string (as
    // the catalog's own look-ups by name pass it).
    let list = unsafe {
        CacheList::search(
            pg_sys::SysCacheIdentifier::PROCNAMEARGSNSP,
            pg_sys::Datum::from(name.as_ptr()),
        )
    };
    list.tuples()
        .into_iter()
        // SAFETY: pg_proc tuples of the held list.
        .map(|tuple| unsafe {
            (*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_proc>(tuple)).oid
        })
        // SAFETY: a dependency look-up of a function that exists.
        .filter(|&function| unsafe {
            pg_sys::getExtensionOfObject(pg_sys::ProcedureRelationId, function) == extension
        })
        .collect()
}

/// The function `pg_catalog.name(args)`, when there is one.
fn catalog_function(name: &CStr, args: &[pg_sys::Oid]) -> Option<pg_sys::Oid> {
    let nargs = std::ffi::c_int::try_from(args.len()).ok()?;
    // SAFETY: a qualified name list of two String nodes in the current memory context, and a
    // look-up that returns InvalidOid when no such function exists.
    let oid = unsafe {
        let mut names = pg_sys::lappend(
            std::ptr::null_mut(),
            pg_sys::makeString(pg_sys::pstrdup(c"pg_catalog".as_ptr())).cast(),
        );
        names = pg_sys::lappend(
            names,
            pg_sys::makeString(pg_sys::pstrdup(name.as_ptr())).cast(),
        );
        pg_sys::LookupFuncName(names, nargs, args.as_ptr(), true)
    };
    (oid != pg_sys::InvalidOid).then_some(oid)
}

/// Settings whose value the server runs as a program, loads as code, or names a file it
/// writes or trusts for logins: a role granted SET or ALTER SYSTEM on one of them acts as the
/// server's operating-system user. Names a version does not know have no grants.
const SERVER_CODE_SETTINGS: [&CStr; 18] = [
    c"archive_command",
    c"archive_library",
    c"oauth_validator_libraries",
    c"restore_command",
    c"archive_cleanup_command",
    c"recovery_end_command",
    c"ssl_passphrase_command",
    c"shared_preload_libraries",
    c"session_preload_libraries",
    c"dynamic_library_path",
    c"jit_provider",
    c"extension_control_path",
    c"log_directory",
    c"log_filename",
    c"hba_file",
    c"ident_file",
    c"plperl.on_init",
    c"plperl.on_plperlu_init",
];

/// Whether `role` was granted SET or ALTER SYSTEM on one of `SERVER_CODE_SETTINGS`.
fn may_set_server_code(role: pg_sys::Oid) -> bool {
    let mode = (pg_sys::ACL_SET | pg_sys::ACL_ALTER_SYSTEM) as pg_sys::AclMode;
    SERVER_CODE_SETTINGS.iter().any(|setting| {
        // SAFETY: a privilege check by a NUL-terminated setting name; a setting without
        // grants has none.
        let result = unsafe { pg_sys::pg_parameter_aclcheck(setting.as_ptr(), role, mode) };
        result == pg_sys::AclResult::ACLCHECK_OK
    })
}

/// Whether one of `roles` reaches as far as a superuser: it is one, it has the privileges of a
/// role that acts as the server's operating-system user, may run a function that acts as that
/// user (reads or writes the server's files, connects without a password) or set what the
/// server runs as a program or loads as code, it may replicate (replication slots, which hold
/// the server's WAL, outlive the sandbox's rollback), or, on PostgreSQL 15, it may create roles
/// (CREATEROLE may grant itself those there; since 16 only roles it administers).
fn reaches_the_server(roles: &[pg_sys::Oid]) -> bool {
    // SAFETY: role catalog look-ups.
    let by_role = |role: pg_sys::Oid| unsafe {
        pg_sys::superuser_arg(role)
            || pg_sys::has_rolreplication(role)
            || (cfg!(feature = "pg15") && pg_sys::has_createrole_privilege(role))
            || SERVER_ROLES
                .iter()
                .any(|&server| pg_sys::has_privs_of_role(role, pg_sys::Oid::from(server)))
    };
    if roles
        .iter()
        .any(|&role| by_role(role) || may_set_server_code(role))
    {
        return true;
    }
    // Looked up once for all of them.
    let functions = server_user_functions();
    roles.iter().any(|&role| {
        functions
            .iter()
            .any(|&function| crate::compat::function_allows(function, role))
    })
}

/// `Some` when this call is a superuser's: the current user or the session user is one, or
/// reaches as far (`reaches_the_server`): code of another role that such a call ran could
/// escalate to the server itself.
pub fn superuser_call() -> Option<Trusted> {
    // SAFETY: reads the backend's current and session user.
    let (current, session) = unsafe { (pg_sys::GetUserId(), pg_sys::GetSessionUserId()) };
    let callers: &[pg_sys::Oid] = if current == session {
        &[current]
    } else {
        &[current, session]
    };
    if !reaches_the_server(callers) {
        return None;
    }
    let mut roles = trusted_owners();
    // SAFETY: role catalog look-ups.
    if unsafe { !pg_sys::superuser_arg(current) && !pg_sys::superuser_arg(session) } {
        roles.extend([current, session]);
    }
    Some(Trusted {
        roles,
        saving: false,
        objects_only: false,
    })
}

/// What a saved question's view may keep: a superuser's call's trust, or for another role's,
/// the objects of the caller (the current user, who owns the view), of superusers and of
/// `trusted_owners` only. The view runs them at
/// every read, whoever reads it: another role's function, type or operator could be changed
/// by its owner later (a function replaced, a domain's CHECK added, a negator linked).
pub fn saving_call() -> Trusted {
    if let Some(trusted) = superuser_call() {
        return trusted;
    }
    // The view's owner-to-be alone, not the session user: inside a SECURITY DEFINER function
    // the two differ, and the session user's objects would stay in another role's view.
    of_the_current_user(true)
}

/// The objects of the current user (the role a query runs as, not the session user), of
/// superusers and of `trusted_owners`.
fn of_the_current_user(saving: bool) -> Trusted {
    // SAFETY: reads the backend's current user.
    let current = unsafe { pg_sys::GetUserId() };
    let mut roles = trusted_owners();
    roles.push(current);
    Trusted {
        roles,
        saving,
        objects_only: false,
    }
}

/// The owners whose types and operators a generated query of a role that is no superuser may
/// use: the current user's own, superusers', `trusted_owners`', and those of the relations the
/// query names and of those their views read (the planner runs their index expressions and
/// partial-index predicates as the caller on every read, through any view and whoever reads:
/// their owners reach the caller anyway; their policies do not always apply). Another role's
/// domain, composite type or operator could be changed by its owner between the check and the
/// run, and PostgreSQL takes no lock on them as a query uses them: a CHECK added to a domain runs as each value is converted to it
/// (`jsonb_populate_record`, row after row), a negator linked to an operator is called in its
/// place. Not the session user's (inside a SECURITY DEFINER function it is another role,
/// whose objects would run with the function owner's rights).
///
/// # Safety
/// `query` must be an analyzed Query of the current transaction.
pub unsafe fn objects_of(query: *mut pg_sys::Query) -> Trusted {
    let mut found = Reached::default();
    // SAFETY: the caller's contract. A walk cut short leaves owners out: stricter, not looser.
    unsafe { collect_relations(query, &mut found) };
    objects_of_relations(found.relations)
}

/// `objects_of` for the relations a statement names, before it is analysed (`ahead`).
pub fn objects_of_relations(relations: Vec<pg_sys::Oid>) -> Trusted {
    // SAFETY: reads the backend's current user.
    let current = unsafe { pg_sys::GetUserId() };
    let mut roles = trusted_owners();
    roles.push(current);
    // The relations named, and those the views among them read, at every depth: each once,
    // MAX_REACHED_RELATIONS at most (a view left unread leaves owners out: stricter).
    let mut pending = relations;
    let mut seen = std::collections::HashSet::new();
    while let Some(relation) = pending.pop() {
        pgrx::check_for_interrupts!();
        if seen.len() >= MAX_REACHED_RELATIONS || !seen.insert(relation) {
            continue;
        }
        let Some((owner, kind)) = relation_owner(relation) else {
            continue;
        };
        if !roles.contains(&owner) {
            roles.push(owner);
        }
        if kind == pg_sys::RELKIND_VIEW {
            // SAFETY: the view exists (just looked up); it is opened with the lock a reader
            // takes, and its stored query only read while it is open.
            unsafe {
                let opened = OpenRelation::open(relation, pg_sys::AccessShareLock);
                let view = pg_sys::get_view_query(opened.0);
                if !view.is_null() {
                    let mut found = Reached::default();
                    collect_relations(view, &mut found);
                    pending.extend(found.relations);
                }
            }
        }
    }
    Trusted {
        roles,
        saving: false,
        objects_only: true,
    }
}

/// Relations `objects_of_relations` follows through views, at most.
const MAX_REACHED_RELATIONS: usize = 4096;

/// The owner and kind of `relation`; `None` for one that is gone.
fn relation_owner(relation: pg_sys::Oid) -> Option<(pg_sys::Oid, u8)> {
    // SAFETY: a syscache look-up, released before returning.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::RELOID as i32,
            pg_sys::Datum::from(relation),
        );
        if tuple.is_null() {
            return None;
        }
        let form = pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_class>(tuple);
        let found = ((*form).relowner, (*form).relkind as u8);
        pg_sys::ReleaseSysCache(tuple);
        Some(found)
    }
}

/// Why a query may not name `collation` with COLLATE: one that another role made may carry
/// ICU rules (PostgreSQL 16 and later), which ICU compiles when the query first compares with
/// it, checking for no cancel. Built-in collations, the caller's own, superusers' and those of
/// `trusted_owners` may be named.
pub fn collation_refusal(collation: pg_sys::Oid) -> Option<String> {
    if collation == pg_sys::InvalidOid || builtin(collation) {
        return None;
    }
    // SAFETY: a syscache look-up, released before returning.
    let owner = unsafe {
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::COLLOID as i32,
            pg_sys::Datum::from(collation),
        );
        if tuple.is_null() {
            return Some("it is not in the catalog".into());
        }
        let owner =
            (*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_collation>(tuple)).collowner;
        pg_sys::ReleaseSysCache(tuple);
        owner
    };
    if of_the_current_user(false).trusts(owner) {
        return None;
    }
    let role = role_name(owner).unwrap_or_default();
    Some(format!(
        "its owner, role \"{role}\", is another role, and a collation may carry rules that are \
         compiled as the query runs, without a check for cancel (a superuser may trust the role \
         with sql_query_engine.trusted_owners = '{role}')"
    ))
}

/// A collation's name, for a message.
pub fn collation_name(collation: pg_sys::Oid) -> String {
    // SAFETY: a catalog look-up; the name is copied before it is freed with its context.
    unsafe {
        let name = pg_sys::get_collation_name(collation);
        if name.is_null() {
            return collation.to_u32().to_string();
        }
        std::ffi::CStr::from_ptr(name)
            .to_string_lossy()
            .into_owned()
    }
}

/// The current user's own, superusers' and `trusted_owners`' objects: those the caller relies
/// on as it would on its own (`Trusted::trusts`).
pub fn trusted_by_the_current_user() -> Trusted {
    of_the_current_user(false)
}

impl Trusted {
    /// Whether this is a superuser's call (or one of a role that reaches as far), not a saved
    /// question's view of another role.
    pub fn superusers(&self) -> bool {
        !self.saving && !self.objects_only
    }

    /// Whether the relations the query reads and the functions it calls are judged by their
    /// owners too (a superuser's call, a saved view), not only its types and operators.
    pub fn judges_code(&self) -> bool {
        !self.objects_only
    }

    /// Whether objects of `owner` are among these.
    pub fn trusts(&self, owner: pg_sys::Oid) -> bool {
        // SAFETY: a role catalog look-up.
        self.roles.contains(&owner) || unsafe { pg_sys::superuser_arg(owner) }
    }

    /// Why an object of `owner` may not be used by this call (`what` names the object).
    pub fn refuse_owner(&self, owner: pg_sys::Oid, what: &str) -> Option<String> {
        if self.trusts(owner) {
            return None;
        }
        let role = role_name(owner).unwrap_or_default();
        if self.objects_only {
            return Some(format!(
                "its owner, role \"{role}\", is another role, which could change it while the \
                 query runs (a domain given a CHECK, an operator a negator): a generated query \
                 uses only the {what}s of its caller, of superusers, of the owners of the \
                 relations it reads and of sql_query_engine.trusted_owners (a superuser may \
                 trust the role with sql_query_engine.trusted_owners = '{role}')"
            ));
        }
        if self.saving {
            return Some(format!(
                "its owner, role \"{role}\", could change it later for every reader of a saved \
                 question's view, which keeps no {what} of another role (a superuser may trust \
                 the role with sql_query_engine.trusted_owners = '{role}')"
            ));
        }
        Some(format!(
            "its owner, role \"{role}\", is not a superuser, and a superuser's call (or one of a \
             role that may act as the server) runs no {what} of another role (a superuser may \
             trust the role with sql_query_engine.trusted_owners = '{role}')"
        ))
    }

    /// Why a superuser's query, or a saved question's view, may not read `relation`: it, a view
    /// or policy it goes through, or one of its partitions or children belongs to a role this
    /// call does not trust.
    pub fn refuse_relation(&self, relation: pg_sys::Oid) -> Option<String> {
        self.relation_refusal(relation, 0, &mut Vec::new())
    }

    fn relation_refusal(
        &self,
        relation: pg_sys::Oid,
        depth: usize,
        seen: &mut Vec<pg_sys::Oid>,
    ) -> Option<String> {
        // A view's stored query names the view itself (as OLD and NEW before PostgreSQL 16).
        if builtin(relation) || seen.contains(&relation) {
            return None;
        }
        seen.push(relation);
        if depth > MAX_VIEW_DEPTH {
            return Some("its views nest too deeply to be checked".into());
        }
        // SAFETY: the relation is opened with a lock (the parser or the rewriter would take the
        // same) and read; its view query is only read, while the relation is open.
        unsafe {
            let opened = OpenRelation::open(relation, pg_sys::AccessShareLock);
            let owner = (*(*opened.0).rd_rel).relowner;
            let kind = (*(*opened.0).rd_rel).relkind as u8;
            let view = (kind == pg_sys::RELKIND_VIEW)
                .then(|| pg_sys::get_view_query(opened.0))
                .filter(|query| !query.is_null())
                .map(|query| {
                    let mut found = Reached::default();
                    let whole = collect_relations(query, &mut found);
                    (found, whole)
                });
            // What its row-security policies read, and what its virtual generated columns
            // (PostgreSQL 18), which the planner puts in their place.
            let mut policed = Reached::default();
            // Whether they apply is decided as the user the relation is read as: the owner of a
            // view it is read through, which a walk from the query does not follow; read
            // whenever the relation has row security on.
            let applies = (*(*opened.0).rd_rel).relrowsecurity;
            let policies = (*opened.0).rd_rsdesc;
            let mut policies_whole = true;
            if applies && !policies.is_null() {
                for policy in
                    PgList::<pg_sys::RowSecurityPolicy>::from_pg((*policies).policies).iter_ptr()
                {
                    for qual in [(*policy).qual, (*policy).with_check_qual] {
                        if !qual.is_null() {
                            policies_whole &= collect_from_expression(qual.cast(), &mut policed);
                        }
                    }
                }
            }
            for expression in crate::compat::virtual_column_expressions(opened.0) {
                policies_whole &= collect_from_expression(expression, &mut policed);
            }
            drop(opened);
            if let Some(why) = self.refuse_owner(owner, "relation") {
                return Some(format!(
                    "relation {} is refused: {why}",
                    relation_name(relation)
                ));
            }
            // A foreign table reads where its server says, by what its wrapper's code does:
            // their owners choose where the query's values go, whoever owns the table.
            if kind == pg_sys::RELKIND_FOREIGN_TABLE {
                let server =
                    pg_sys::GetForeignServer((*pg_sys::GetForeignTable(relation)).serverid);
                let wrapper = pg_sys::GetForeignDataWrapper((*server).fdwid);
                for (what, owner) in [
                    ("foreign server", (*server).owner),
                    ("foreign-data wrapper", (*wrapper).owner),
                ] {
                    if let Some(why) = self.refuse_owner(owner, what) {
                        return Some(format!(
                            "relation {} is refused: its {what}: {why}",
                            relation_name(relation)
                        ));
                    }
                }
            }
            if let Some((found, whole)) = view {
                if !whole {
                    return Some("its views nest too deeply to be checked".into());
                }
                if let Some(why) = self.reached_refusal(&found) {
                    return Some(format!(
                        "relation {} is refused: {why}",
                        relation_name(relation)
                    ));
                }
                return found
                    .relations
                    .into_iter()
                    .find_map(|inner| self.relation_refusal(inner, depth + 1, seen));
            }
            if !policies_whole {
                return Some("its policies nest too deeply to be checked".into());
            }
            if let Some(why) = self.reached_refusal(&policed) {
                return Some(format!(
                    "relation {} is refused: {why}",
                    relation_name(relation)
                ));
            }
            if let Some(why) = policed
                .relations
                .into_iter()
                .find_map(|inner| self.relation_refusal(inner, depth + 1, seen))
            {
                return Some(why);
            }
            if kind == pg_sys::RELKIND_PARTITIONED_TABLE
                || kind == pg_sys::RELKIND_RELATION
                || kind == pg_sys::RELKIND_FOREIGN_TABLE
            {
                return inheritors(relation)
                    .into_iter()
                    .find_map(|child| self.relation_refusal(child, depth + 1, seen));
            }
            None
        }
    }

    /// Why a superuser's query, or a saved question's view, may not go through a view, a
    /// policy or a virtual column that uses what `reached` holds: a function (an aggregate and
    /// a window function included), an operator, one linked to it as its commutator or
    /// negator, or the function behind one, of a role this call does not trust. Its owner
    /// could later replace the function (which runs as each reader of a saved view, where no
    /// gate watches), link the operator (ALTER OPERATOR ... SET NEGATOR) to an operator of a
    /// built-in function with effects, which the planner would put in its place (`NOT (a op
    /// b)` becomes `a negator b`), or give the aggregate such a function (CREATE OR REPLACE
    /// AGGREGATE): built-in code, out of the gate's sight.
    fn reached_refusal(&self, reached: &Reached) -> Option<String> {
        if let Some(why) = runs_given_code_refusal(reached) {
            return Some(why);
        }
        let function = reached.functions.iter().find_map(|&function| {
            let owner = FunctionFacts::of(function).map_or(pg_sys::InvalidOid, |f| f.owner);
            self.refuse_owner(owner, "function").map(|why| {
                format!(
                    "function {} is not allowed: {why}",
                    FunctionFacts::signature(function)
                )
            })
        });
        function
            .or_else(|| self.operators_refusal(&reached.operators))
            .or_else(|| self.types_refusal(&reached.types))
    }

    /// `reached_refusal` of types: one, or a part of one (a domain's base type, a composite's
    /// fields, an array's element, a range's subtype), of a role this call does not trust. Its
    /// owner could add a CHECK to a domain at any time, which runs wherever a value is
    /// converted to it (an argument of a trusted function, a column read from JSON), with
    /// built-in functions no gate sees.
    fn types_refusal(&self, types: &[pg_sys::Oid]) -> Option<String> {
        let mut seen: std::collections::HashSet<pg_sys::Oid> = std::collections::HashSet::new();
        let mut waiting = types.to_vec();
        while let Some(typ) = waiting.pop() {
            if builtin(typ) || seen.contains(&typ) {
                continue;
            }
            if seen.len() >= MAX_REACHED_TYPES {
                return Some(format!(
                    "its views and policies use more than {MAX_REACHED_TYPES} types"
                ));
            }
            pgrx::check_for_interrupts!();
            seen.insert(typ);
            let Some(facts) = TypeFacts::of(typ) else {
                return Some(format!("type {} is not in the catalog", type_name(typ)));
            };
            if let Some(why) = self.refuse_owner(facts.owner, "type") {
                return Some(format!("type {} is not allowed: {why}", type_name(typ)));
            }
            waiting.extend(parts(&facts).into_iter().map(|(part, _)| part));
            // A trusted domain's CHECK runs wherever a value is converted to it: what it
            // converts to and compares with, as the views' own expressions.
            if facts.kind == pg_sys::TYPTYPE_DOMAIN {
                let mut checked = Reached::default();
                // SAFETY: catalog reads in the caller's transaction.
                let checks = unsafe { stored_checks(typ) };
                let whole = checks.into_iter().all(|check| {
                    // SAFETY: a node tree PostgreSQL wrote, only read.
                    unsafe { collect_from_expression(check, &mut checked) }
                });
                if !whole {
                    return Some(format!(
                        "the CHECKs of domain {} nest too deeply to be checked",
                        type_name(typ)
                    ));
                }
                // Judged as the views' own expressions are, its types below.
                let types = std::mem::take(&mut checked.types);
                if let Some(why) = self.reached_refusal(&checked) {
                    return Some(format!("domain {}'s CHECK: {why}", type_name(typ)));
                }
                waiting.extend(types);
            }
        }
        None
    }

    /// `reached_refusal` of operators.
    fn operators_refusal(&self, operators: &[pg_sys::Oid]) -> Option<String> {
        operators.iter().find_map(|&operator| {
            let Some(linked) = linked_operators(operator) else {
                return Some(format!(
                    "operator {} is linked to more than {MAX_LINKED_OPERATORS} others",
                    operator_name(operator)
                ));
            };
            linked
                .into_iter()
                .filter(|linked| !builtin(*linked))
                .find_map(|linked| {
                    // Its function too: its owner may replace it (CREATE OR REPLACE FUNCTION).
                    // SAFETY: a syscache look-up (InvalidOid for an operator that is gone).
                    let code = unsafe { pg_sys::get_opcode(linked) };
                    let code_owner = (!builtin(code))
                        .then(|| FunctionFacts::of(code).map_or(pg_sys::InvalidOid, |f| f.owner));
                    code_owner
                        .and_then(|owner| self.refuse_owner(owner, "function"))
                        .or_else(|| self.refuse_owner(operator_owner(linked), "operator"))
                        .map(|why| {
                            format!("operator {} is not allowed: {why}", operator_name(linked))
                        })
                })
        })
    }
}

/// Why what `reached` holds may not run in a superuser's call: a function that runs SQL or
/// an object's code given as text, whose relations and types are found only as it runs, out
/// of the owner checks.
fn runs_given_code_refusal(reached: &Reached) -> Option<String> {
    reached.runs_given_code.first().map(|&function| {
        format!(
            "function {} runs SQL or object code given as text, whose relations and types are \
             found only as it runs, out of the owner checks of a superuser's call",
            FunctionFacts::signature(function)
        )
    })
}

/// What a view's query, a policy or a virtual generated column reads and compares with: the
/// relations, the operators and the aggregates and window functions it names.
#[derive(Default)]
struct Reached {
    relations: Vec<pg_sys::Oid>,
    operators: Vec<pg_sys::Oid>,
    functions: Vec<pg_sys::Oid>,
    /// The types of its values and of the columns its functions are read as.
    types: Vec<pg_sys::Oid>,
    /// The functions whose hidden code (`call`) was looked at, each once.
    called: Vec<pg_sys::Oid>,
    /// The functions it calls that run code given as text or by name (`policy::runs_given_code`).
    runs_given_code: Vec<pg_sys::Oid>,
}

impl Reached {
    fn type_(&mut self, typ: pg_sys::Oid) {
        if !builtin(typ) && !self.types.contains(&typ) {
            self.types.push(typ);
        }
    }

    fn function(&mut self, function: pg_sys::Oid) {
        if !builtin(function) && !self.functions.contains(&function) {
            self.functions.push(function);
        }
    }

    /// What a call of `function` runs that its node does not show (and whether it runs code it
    /// is given as text, `runs_given_code`): for an aggregate, its
    /// state types (an initial state is converted with its type's input function, a domain's
    /// CHECK included, when it starts) and its sort operator; and its default arguments, which
    /// the planner puts in, converted to their parameters' types. The defaults are returned, to
    /// be walked like the rest.
    fn call(&mut self, function: pg_sys::Oid) -> Option<*mut pg_sys::Node> {
        if self.called.contains(&function) {
            return None;
        }
        self.called.push(function);
        self.note_given_code(function);
        if builtin(function) {
            return None;
        }
        // The types its result columns are converted to inside the call (RETURNS TABLE).
        for typ in result_column_types(function) {
            self.type_(typ);
        }
        let (support, sort_operator, states) = aggregate_support(function);
        // Its transition and final functions run as it does, and their owners may replace
        // them.
        for support in support {
            self.note_given_code(support);
            self.function(support);
        }
        for state in states {
            self.type_(state);
        }
        if let Some(operator) = sort_operator {
            self.operator(operator);
        }
        default_arguments(function)
    }

    /// Notes `function` when it runs SQL or an object's code given as text.
    fn note_given_code(&mut self, function: pg_sys::Oid) {
        if FunctionFacts::of(function).is_some_and(|f| super::policy::runs_given_code(&f.policy()))
        {
            self.runs_given_code.push(function);
        }
    }

    /// The operators of a query's ORDER BY, GROUP BY, DISTINCT and windows.
    ///
    /// # Safety
    /// `query` is an analysed Query.
    unsafe fn query_clauses(&mut self, query: *mut pg_sys::Query) {
        // SAFETY: the caller's contract; its lists hold what their names say.
        unsafe {
            self.clauses((*query).sortClause);
            self.clauses((*query).groupClause);
            self.clauses((*query).distinctClause);
            for window in PgList::<pg_sys::WindowClause>::from_pg((*query).windowClause).iter_ptr()
            {
                self.clauses((*window).partitionClause);
                self.clauses((*window).orderClause);
            }
        }
    }

    fn operator(&mut self, operator: pg_sys::Oid) {
        if operator != pg_sys::InvalidOid && !self.operators.contains(&operator) {
            self.operators.push(operator);
        }
    }

    /// The operators of a list of sort or group clauses (`SortGroupClause`s).
    ///
    /// # Safety
    /// `clauses` is a List of SortGroupClause, or null.
    unsafe fn clauses(&mut self, clauses: *mut pg_sys::List) {
        // SAFETY: the caller's contract.
        for clause in unsafe { PgList::<pg_sys::SortGroupClause>::from_pg(clauses) }.iter_ptr() {
            // SAFETY: a SortGroupClause of the list.
            let (eq, sort) = unsafe { ((*clause).eqop, (*clause).sortop) };
            self.operator(eq);
            self.operator(sort);
        }
    }
}

/// The relations a (view's) query reads, at any depth: its subqueries in FROM, its WITH
/// queries, and the subqueries of its expressions (`IN (SELECT ...)`, `EXISTS`, a scalar
/// subquery, a function's argument), and the operators it compares with. `false` when the
/// query nests too deeply to be read whole.
unsafe fn collect_relations(query: *mut pg_sys::Query, found: &mut Reached) -> bool {
    // Through PostgreSQL's walker, which visits every range table entry before its subquery.
    // SAFETY: a Query from the relcache, only read; `found` outlives the walk.
    unsafe {
        found.query_clauses(query);
        !pg_sys::query_tree_walker(
            query,
            Some(relations_walker),
            (found as *mut Reached).cast(),
            pg_sys::QTW_EXAMINE_RTES_BEFORE as i32,
        )
    }
}

/// `collect_relations` for an expression (a policy's qual, a virtual column's).
///
/// # Safety
/// `expression` is an analysed expression, only read.
unsafe fn collect_from_expression(expression: *mut pg_sys::Node, found: &mut Reached) -> bool {
    // SAFETY: through PostgreSQL's walker, never by calling the walker directly: a one-element
    // list, so that the walker sees the expression itself.
    unsafe {
        let list = pg_sys::lappend(std::ptr::null_mut(), expression.cast());
        !pg_sys::expression_tree_walker(
            list.cast(),
            Some(relations_walker),
            (found as *mut Reached).cast(),
        )
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn relations_walker(
    node: *mut pg_sys::Node,
    context: *mut std::ffi::c_void,
) -> bool {
    if node.is_null() {
        return false;
    }
    // A view nested past the stack's depth: stop, and the view is refused as too deep below.
    // SAFETY: reads the backend's stack depth.
    if unsafe { pg_sys::stack_is_too_deep() } {
        return true;
    }
    // SAFETY: PostgreSQL's walkers pass analyzed nodes and our `Reached`; each node is cast to
    // the struct its tag names; no reference to it is held across the walks below.
    unsafe {
        let found = || &mut *context.cast::<Reached>();
        if expression_kind((*node).type_) {
            found().type_(pg_sys::exprType(node));
        }
        match (*node).type_ {
            pg_sys::NodeTag::T_RangeTblEntry => {
                let rte = node.cast::<pg_sys::RangeTblEntry>();
                let found = found();
                if (*rte).rtekind == pg_sys::RTEKind::RTE_RELATION
                    && !found.relations.contains(&(*rte).relid)
                {
                    found.relations.push((*rte).relid);
                }
                // The columns a function's result, or XMLTABLE's or JSON_TABLE's, is read as
                // (`jsonb_to_record(...) AS (a some_domain)` converts to them).
                for function in
                    PgList::<pg_sys::RangeTblFunction>::from_pg((*rte).functions).iter_ptr()
                {
                    for typ in
                        PgList::<std::ffi::c_void>::from_pg((*function).funccoltypes).iter_oid()
                    {
                        found.type_(typ);
                    }
                }
                if !(*rte).tablefunc.is_null() {
                    for typ in
                        PgList::<std::ffi::c_void>::from_pg((*(*rte).tablefunc).coltypes).iter_oid()
                    {
                        found.type_(typ);
                    }
                }
                return false;
            }
            pg_sys::NodeTag::T_Query => {
                let query = node.cast::<pg_sys::Query>();
                found().query_clauses(query);
                return pg_sys::query_tree_walker(
                    query,
                    Some(relations_walker),
                    context,
                    pg_sys::QTW_EXAMINE_RTES_BEFORE as i32,
                );
            }
            pg_sys::NodeTag::T_OpExpr
            | pg_sys::NodeTag::T_DistinctExpr
            | pg_sys::NodeTag::T_NullIfExpr => {
                found().operator((*node.cast::<pg_sys::OpExpr>()).opno);
            }
            pg_sys::NodeTag::T_ScalarArrayOpExpr => {
                found().operator((*node.cast::<pg_sys::ScalarArrayOpExpr>()).opno);
            }
            // An aggregate's ORDER BY and DISTINCT, and a set operation's.
            pg_sys::NodeTag::T_SortGroupClause => {
                let clause = node.cast::<pg_sys::SortGroupClause>();
                found().operator((*clause).eqop);
                found().operator((*clause).sortop);
            }
            // A recursive query's CYCLE clause compares with this operator as the rewriter
            // writes the clause out.
            pg_sys::NodeTag::T_CTECycleClause => {
                found().operator((*node.cast::<pg_sys::CTECycleClause>()).cycle_mark_neop);
            }
            pg_sys::NodeTag::T_SetOperationStmt => {
                found().clauses((*node.cast::<pg_sys::SetOperationStmt>()).groupClauses);
            }
            // An aggregate's or window function's own OID is never called: its transition and
            // final functions are, which its owner may change (CREATE OR REPLACE AGGREGATE).
            pg_sys::NodeTag::T_Aggref => {
                let aggregate = (*node.cast::<pg_sys::Aggref>()).aggfnoid;
                found().function(aggregate);
                if walk_call(aggregate, context) {
                    return true;
                }
            }
            pg_sys::NodeTag::T_WindowFunc => {
                let function = (*node.cast::<pg_sys::WindowFunc>()).winfnoid;
                found().function(function);
                if walk_call(function, context) {
                    return true;
                }
            }
            // A function another role owns runs as whoever reads the view or the table of the
            // policy, and its owner may replace it at any time.
            pg_sys::NodeTag::T_FuncExpr => {
                let function = (*node.cast::<pg_sys::FuncExpr>()).funcid;
                found().function(function);
                if walk_call(function, context) {
                    return true;
                }
            }
            pg_sys::NodeTag::T_RowCompareExpr => {
                let opnos: Vec<pg_sys::Oid> = PgList::<std::ffi::c_void>::from_pg(
                    (*node.cast::<pg_sys::RowCompareExpr>()).opnos,
                )
                .iter_oid()
                .collect();
                for operator in opnos {
                    found().operator(operator);
                }
            }
            _ => {}
        }
        pg_sys::expression_tree_walker(node, Some(relations_walker), context)
    }
}

/// `Reached::call` of `function`, its default arguments walked too.
///
/// # Safety
/// `context` is the walk's `Reached`.
unsafe fn walk_call(function: pg_sys::Oid, context: *mut std::ffi::c_void) -> bool {
    // SAFETY: the walk's own context; the defaults are a node tree PostgreSQL wrote, walked
    // after the borrow ends.
    unsafe {
        match (*context.cast::<Reached>()).call(function) {
            Some(defaults) => {
                pg_sys::expression_tree_walker(defaults, Some(relations_walker), context)
            }
            None => false,
        }
    }
}

// catalog/pg_inherits.h, which pgrx does not bind.
// SAFETY: the declaration matches the header's, the same in PostgreSQL 13 to 18; it may raise
// PostgreSQL errors, hence C-unwind.
unsafe extern "C-unwind" {
    fn find_all_inheritors(
        parent: pg_sys::Oid,
        lockmode: pg_sys::LOCKMODE,
        numparents: *mut *mut pg_sys::List,
    ) -> *mut pg_sys::List;
}

/// `relation` and every partition or inheritance child below it, locked for reading (as the
/// planner will lock them).
pub fn inheritors(relation: pg_sys::Oid) -> Vec<pg_sys::Oid> {
    // SAFETY: declared with PostgreSQL's own signature; an ERROR comes back through pgrx.
    let list = unsafe {
        pg_sys::ffi::pg_guard_ffi_boundary(|| {
            find_all_inheritors(
                relation,
                pg_sys::AccessShareLock as pg_sys::LOCKMODE,
                std::ptr::null_mut(),
            )
        })
    };
    // SAFETY: an OID list PostgreSQL just made.
    unsafe {
        PgList::<std::ffi::c_void>::from_pg(list)
            .iter_oid()
            .collect()
    }
}
