//! Which functions a generated query may call: an allow-list, so that what is not known to be
//! harmless is refused. Pure data and logic, tested without a backend; `guard` applies it to
//! every function the server resolved in the query (and to those that run implicitly).
//!
//! Allowed by default: the built-in functions of `pg_catalog` that are not VOLATILE (with a few
//! harmless exceptions), have no side effects, do not run SQL given as text and, unless
//! `allow_system_catalogs` is on, do not read server state. Everything else only when the
//! superuser allows it in `sql_query_engine.allowed_functions`: by extension or schema (its
//! non-VOLATILE functions), or by qualified name (that function, whatever its volatility).
//! Functions that run SQL given as text need the qualified name: allowing their extension or
//! schema is not enough. Side effects are never allowed.

/// What the guard knows about one function the query calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Function<'a> {
    pub schema: &'a str,
    pub name: &'a str,
    /// `provolatile`: `i`, `s` or `v`.
    pub volatility: u8,
    /// Created by initdb in `pg_catalog` (not by an extension or a role).
    pub builtin: bool,
    /// The extension it belongs to, if any.
    pub extension: Option<&'a str>,
    /// Owned by a superuser: an extension's or a schema's functions are allowed as a group only
    /// when they are (the owner of an extension may add its own functions to it, and a role
    /// with CREATE on a schema may add functions to that).
    pub superuser_owned: bool,
    /// Owned by a superuser, by its schema's owner or by a role of `trusted_owners`: only such
    /// a function is allowed by name (`SCHEMA.FUNCTION`), for a role with CREATE on the schema
    /// may add an overload under the same name (`f(text)` beside `f(date)`, which overload
    /// resolution prefers for a quoted literal), whose code would run as every caller.
    pub nameable: bool,
    /// Takes or returns `cstring` or `internal`: a type's input, output or support function,
    /// which converts to or from any type it is told to (`domain_in('1', 'd'::regtype, -1)`).
    pub type_support: bool,
    /// Returns no value (`void`, `trigger`, a handler): called for what it does, such as
    /// `fmgr_sql_validator(oid)`, which analyses another role's function body (and so runs its
    /// domains' CHECKs), or a language's validator.
    pub returns_nothing: bool,
}

/// PostgreSQL's `provolatile` code for VOLATILE (the others are `i` and `s`).
pub const VOLATILE: u8 = b'v';

/// Functions refused by exact name, in any schema and whatever the allow-list says: they change
/// state, or read settings a prompt could exfiltrate.
const SIDE_EFFECT_NAMES: &[&str] = &[
    "nextval",
    "setval",
    "currval",
    "lastval",
    "set_config",
    "current_setting",
    "setseed",
    "pg_notify",
    "pg_terminate_backend",
    "pg_cancel_backend",
    "pg_reload_conf",
    "pg_rotate_logfile",
    "pg_stat_file",
    "pg_switch_wal",
    "pg_promote",
    "pg_checkpoint",
    "pg_export_snapshot",
    "pg_import_system_collations",
    "pg_log_backend_memory_contexts",
    "pg_prewarm",
    "txid_current",
    "txid_current_if_assigned",
    "txid_current_snapshot",
    "loread",
    "lowrite",
    "normal_rand",
    "postgres_fdw_disconnect",
    "postgres_fdw_disconnect_all",
    // isn's switch to accepting bad check digits, IMMUTABLE: up to PostgreSQL 17 a static of
    // the backend that no rollback puts back, so it reached the connection's next caller.
    "isn_weak",
    // WAL written, replication slots synchronised, index summaries changed.
    "pg_sync_replication_slots",
    "brin_summarize_new_values",
    "brin_summarize_range",
    "brin_desummarize_range",
    "gin_clean_pending_list",
];

/// Functions refused by name prefix, in any schema, whatever the allow-list says.
const SIDE_EFFECT_PREFIXES: &[&str] = &[
    "pg_sleep",
    "pg_advisory",
    "pg_try_advisory",
    "pg_read_",
    "pg_ls_",
    "pg_file_",
    "pg_stat_reset",
    "pg_current_",
    "pg_logical_",
    "pg_replication_",
    "pg_copy_",
    "pg_create_",
    "pg_drop_",
    "pg_wal_",
    "pg_backup_",
    // Statistics written into the catalog (PostgreSQL 18), a WAL record (17), a log line.
    "pg_clear_",
    "pg_restore_",
    "pg_log_",
    "lo_",
];

/// Functions that run SQL (or read whole tables) given as text, out of the guard's sight:
/// refused unless the superuser names them in `allowed_functions`. Built-in (`query_to_xml`,
/// `ts_stat`, ...) and from contrib (tablefunc's `crosstab` and `connectby`, xml2's
/// `xpath_table`, dblink).
const RUNS_SQL_TEXT: &[&str] = &[
    "query_to_xml",
    "query_to_xml_and_xmlschema",
    "query_to_xmlschema",
    "cursor_to_xml",
    "cursor_to_xmlschema",
    "table_to_xml",
    "table_to_xml_and_xmlschema",
    "table_to_xmlschema",
    "schema_to_xml",
    "schema_to_xml_and_xmlschema",
    "schema_to_xmlschema",
    "database_to_xml",
    "database_to_xml_and_xmlschema",
    "database_to_xmlschema",
    "ts_stat",
    "ts_rewrite",
    "crosstab",
    "crosstab2",
    "crosstab3",
    "crosstab4",
    "connectby",
    "xpath_table",
];
const RUNS_SQL_TEXT_PREFIXES: &[&str] = &["dblink"];

/// Built-ins that run code of an object they are given by name or OID as the query runs, out of
/// the guard's sight: the input function (and domain CHECKs) of a type named as text
/// (`pg_input_is_valid`, PostgreSQL 16 and later), the type modifier function of a type named
/// as text (`to_regtype('t(3)')`, `to_regtypemod`, PostgreSQL 17 and later) or by OID
/// (`format_type(oid, typmod)` runs its output modifier function; so do the privilege checks
/// of a type or a function named as text, `has_type_privilege('t(3)', ...)`, which read the
/// name as `regtype` or `regprocedure` does), and the hash functions of any partitioned
/// table's key, opened without a privilege check (`satisfies_hash_partition`), and the text
/// search parser's and dictionaries' code of a configuration read from the catalog as it runs
/// (`ts_parse`, `ts_token_type`, and `ts_debug`, a built-in SQL function whose body, run after
/// the check, calls them and `ts_lexize` on dictionaries it looks up): refused unless named in
/// `allowed_functions`.
const RUNS_NAMED_OBJECTS_CODE: &[&str] = &[
    "has_function_privilege",
    "has_type_privilege",
    "pg_input_is_valid",
    "pg_input_error_info",
    "to_regtype",
    "to_regtypemod",
    "format_type",
    "satisfies_hash_partition",
    "to_regprocedure",
    "to_regoperator",
    "ts_parse",
    "ts_token_type",
    "ts_debug",
];

/// VOLATILE built-ins that only produce values.
const VOLATILE_ALLOWED: &[&str] = &[
    "random",
    "random_normal",
    "clock_timestamp",
    "timeofday",
    "gen_random_uuid",
    // PostgreSQL 18's UUIDs (uuidv4 is gen_random_uuid), 16's random samples of an array.
    "uuidv4",
    "uuidv7",
    "array_sample",
    "array_shuffle",
];

/// Built-ins named `pg_*` that read nothing about the server: every other `pg_*` function is
/// a system accessor (statistics, settings, activity, files, catalogs).
const HARMLESS_PG_FUNCTIONS: &[&str] = &[
    "pg_typeof",
    "pg_size_pretty",
    "pg_size_bytes",
    "pg_column_size",
    "pg_collation_for",
];

/// Built-ins without the `pg_` prefix that read server or catalog state.
const SYSTEM_ACCESSORS: &[&str] = &[
    "version",
    "unicode_version",
    "icu_unicode_version",
    "inet_client_addr",
    "inet_client_port",
    "inet_server_addr",
    "inet_server_port",
    "obj_description",
    "col_description",
    "shobj_description",
    "current_schemas",
    "current_query",
    "txid_snapshot_xmin",
    "txid_snapshot_xmax",
    "txid_snapshot_xip",
    "txid_visible_in_snapshot",
    "txid_status",
    "has_any_column_privilege",
    "has_column_privilege",
    "has_database_privilege",
    "has_foreign_data_wrapper_privilege",
    "has_function_privilege",
    "has_language_privilege",
    "has_parameter_privilege",
    "has_schema_privilege",
    "has_sequence_privilege",
    "has_server_privilege",
    "has_table_privilege",
    "has_tablespace_privilege",
    "has_type_privilege",
    "has_largeobject_privilege",
    "row_security_active",
    "system_user",
];

/// What the superuser allowed beyond the built-ins (`sql_query_engine.allowed_functions`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowed {
    pub extensions: Vec<String>,
    pub schemas: Vec<String>,
    /// (schema, function)
    pub functions: Vec<(String, String)>,
}

impl Allowed {
    /// Parses `extension:NAME, schema:NAME, SCHEMA.FUNCTION, ...`. An entry of another shape is
    /// an error, so that a typo cannot silently allow nothing (or something else).
    pub fn parse(text: &str) -> Result<Allowed, String> {
        let mut allowed = Allowed::default();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let name = |s: &str| s.trim().trim_matches('"').to_string();
            if let Some(extension) = entry.strip_prefix("extension:") {
                allowed.extensions.push(name(extension));
            } else if let Some(schema) = entry.strip_prefix("schema:") {
                allowed.schemas.push(name(schema));
            } else if let Some((schema, function)) = entry.split_once('.') {
                allowed.functions.push((name(schema), name(function)));
            } else {
                return Err(format!(
                    "\"{entry}\" is not extension:NAME, schema:NAME or SCHEMA.FUNCTION"
                ));
            }
        }
        Ok(allowed)
    }

    /// Whether `f` is named as `SCHEMA.FUNCTION`, and owned by a role that may have it named
    /// (`Function::nameable`).
    pub fn names(&self, f: &Function) -> bool {
        f.nameable
            && self
                .functions
                .iter()
                .any(|(s, n)| s == f.schema && n == f.name)
    }
}

/// Whether `f` runs code it is given at run time, as text or by an object's name (see
/// `RUNS_SQL_TEXT`, `RUNS_NAMED_OBJECTS_CODE`): what it reads and runs is decided only as it
/// runs, out of any walk's sight.
pub fn runs_given_code(f: &Function) -> bool {
    let lower = f.name.to_ascii_lowercase();
    RUNS_SQL_TEXT.contains(&lower.as_str())
        || RUNS_SQL_TEXT_PREFIXES.iter().any(|p| lower.starts_with(p))
        || RUNS_NAMED_OBJECTS_CODE.contains(&lower.as_str())
}

/// Why `f` may not be called (completing "function ... is not allowed in a generated query:"),
/// or `None` when it may.
pub fn refuse(f: &Function, allowed: &Allowed, allow_catalogs: bool) -> Option<String> {
    let lower = f.name.to_ascii_lowercase();
    if SIDE_EFFECT_NAMES.contains(&lower.as_str())
        || SIDE_EFFECT_PREFIXES.iter().any(|p| lower.starts_with(p))
    {
        return Some("it has side effects or reads settings".into());
    }
    let named = allowed.names(f);
    if RUNS_SQL_TEXT.contains(&lower.as_str())
        || RUNS_SQL_TEXT_PREFIXES.iter().any(|p| lower.starts_with(p))
    {
        return (!named).then(|| {
            format!(
                "it runs SQL given as text, out of the guard's sight; a superuser may allow it \
                 by name with sql_query_engine.allowed_functions = '{}.{}'",
                f.schema, f.name
            )
        });
    }
    if RUNS_NAMED_OBJECTS_CODE.contains(&lower.as_str()) {
        return (!named).then(|| {
            format!(
                "it runs code of an object it is given by name or OID (a type's input or \
                 modifier function, a partitioned table's hash functions), out of the guard's \
                 sight; \
                 a superuser may allow it by name with sql_query_engine.allowed_functions = '{}.{}'",
                f.schema, f.name
            )
        });
    }
    if named {
        return None;
    }
    if f.returns_nothing {
        return Some(
            "it returns no value: it is called for what it does (a validator analyses or loads \
             another function's code), and a query only reads"
                .into(),
        );
    }
    if f.type_support {
        return Some(
            "it is a type's input, output or support function (it takes or returns cstring or \
             internal); values are converted with casts"
                .into(),
        );
    }
    if f.builtin {
        let system = (lower.starts_with("pg_") && !HARMLESS_PG_FUNCTIONS.contains(&lower.as_str()))
            || SYSTEM_ACCESSORS.contains(&lower.as_str());
        if system && !allow_catalogs {
            return Some(
                "it reads server or catalog state (sql_query_engine.allow_system_catalogs is off)"
                    .into(),
            );
        }
        if f.volatility == VOLATILE && !VOLATILE_ALLOWED.contains(&lower.as_str()) {
            return Some("it is VOLATILE, and only IMMUTABLE and STABLE functions may run".into());
        }
        return None;
    }
    let by_group = allowed_as_group(f, allowed);
    if by_group {
        if f.volatility == VOLATILE {
            return Some(format!(
                "it is VOLATILE; a superuser may allow it by name with \
                 sql_query_engine.allowed_functions = '{}.{}'",
                f.schema, f.name
            ));
        }
        return None;
    }
    Some(not_allowed(f))
}

/// Whether `f` is allowed with its extension or schema (`extension:NAME`, `schema:NAME`): only
/// a superuser's function is.
fn allowed_as_group(f: &Function, allowed: &Allowed) -> bool {
    f.superuser_owned
        && (f
            .extension
            .is_some_and(|e| allowed.extensions.iter().any(|a| a == e))
            || allowed.schemas.iter().any(|s| s == f.schema))
}

/// Why `f` may not run implicitly, for a type (its input, output, receive, send, typmod,
/// analyze or subscript function, a range's canonical or difference function) or while the
/// runtime gate is open: built-ins run, and what a superuser allowed (by name, extension or
/// schema), whatever its volatility or argument types; side effects never do.
pub fn refuse_support(f: &Function, allowed: &Allowed) -> Option<String> {
    let lower = f.name.to_ascii_lowercase();
    if SIDE_EFFECT_NAMES.contains(&lower.as_str())
        || SIDE_EFFECT_PREFIXES.iter().any(|p| lower.starts_with(p))
    {
        return Some("it has side effects or reads settings".into());
    }
    let by_group = allowed_as_group(f, allowed);
    if f.builtin || by_group || allowed.names(f) {
        return None;
    }
    Some(not_allowed(f))
}

/// Why `f`, no built-in, is not allowed: how a superuser may allow it.
fn not_allowed(f: &Function) -> String {
    if !f.nameable {
        return format!(
            "only built-in functions run unless a superuser allows more, and a function no \
             superuser owns is allowed only by name (sql_query_engine.allowed_functions = \
             '{}.{}') and only when the owner of its schema or a role of \
             sql_query_engine.trusted_owners owns it: another role that may create functions in \
             the schema could add one of the same name",
            f.schema, f.name
        );
    }
    if !f.superuser_owned {
        return format!(
            "only built-in functions run unless a superuser allows more, and a function no \
             superuser owns is allowed only by name: sql_query_engine.allowed_functions = '{}.{}'",
            f.schema, f.name
        );
    }
    let how = match f.extension {
        Some(extension) => format!("'extension:{extension}' or '{}.{}'", f.schema, f.name),
        None => format!("'schema:{}' or '{}.{}'", f.schema, f.schema, f.name),
    };
    format!(
        "only built-in functions run unless a superuser allows more; allow it with \
         sql_query_engine.allowed_functions = {how}"
    )
}

/// Schemas whose relations are not queryable unless `sql_query_engine.allow_system_catalogs` is
/// on: questions about the schema are answered from the schema context instead.
pub const CATALOG_SCHEMAS: &[&str] = &["pg_catalog", "information_schema", "pg_toast"];

#[cfg(test)]
mod tests {
    use super::*;

    const STABLE: u8 = b's';

    fn builtin(name: &str, volatility: u8) -> Function<'_> {
        Function {
            schema: "pg_catalog",
            name,
            volatility,
            builtin: true,
            extension: None,
            superuser_owned: true,
            nameable: true,
            type_support: false,
            returns_nothing: false,
        }
    }

    fn user<'a>(schema: &'a str, name: &'a str, extension: Option<&'a str>) -> Function<'a> {
        Function {
            schema,
            name,
            volatility: STABLE,
            builtin: false,
            extension,
            superuser_owned: true,
            nameable: true,
            type_support: false,
            returns_nothing: false,
        }
    }

    fn none() -> Allowed {
        Allowed::default()
    }

    #[test]
    fn side_effects_are_refused_whatever_is_allowed() {
        let all = Allowed::parse("pg_catalog.nextval, schema:pg_catalog, public.pg_sleep").unwrap();
        for name in [
            "nextval",
            "pg_sleep_for",
            "pg_advisory_xact_lock",
            "pg_try_advisory_lock_shared",
            "current_setting",
            "pg_read_binary_file",
            "lo_import",
            "pg_current_xact_id",
            "pg_create_logical_replication_slot",
        ] {
            assert!(
                refuse(&builtin(name, STABLE), &all, true).is_some(),
                "{name}"
            );
        }
        assert!(refuse(&user("public", "pg_sleep", None), &all, true).is_some());
    }

    #[test]
    fn functions_that_run_sql_text_need_their_name_allowed() {
        let crosstab = user("public", "crosstab", Some("tablefunc"));
        assert!(refuse(&crosstab, &none(), false)
            .unwrap()
            .contains("runs SQL given as text"));
        let by_extension = Allowed::parse("extension:tablefunc, schema:public").unwrap();
        assert!(refuse(&crosstab, &by_extension, false).is_some());
        let by_name = Allowed::parse("public.crosstab").unwrap();
        assert!(refuse(&crosstab, &by_name, false).is_none());
        for name in ["query_to_xml", "ts_stat", "ts_rewrite", "table_to_xml"] {
            assert!(
                refuse(&builtin(name, STABLE), &none(), true).is_some(),
                "{name}"
            );
        }
        assert!(refuse(
            &user("public", "dblink_exec", Some("dblink")),
            &none(),
            false
        )
        .is_some());
        assert!(refuse(&user("x", "xpath_table", Some("xml2")), &none(), false).is_some());
    }

    #[test]
    fn other_functions_fail_closed_until_allowed() {
        let mine = user("analytics", "fiscal_quarter", None);
        let why = refuse(&mine, &none(), false).unwrap();
        assert!(
            why.contains("'schema:analytics' or 'analytics.fiscal_quarter'"),
            "{why}"
        );
        assert!(refuse(&mine, &Allowed::parse("schema:analytics").unwrap(), false).is_none());
        let trgm = user("public", "similarity", Some("pg_trgm"));
        assert!(refuse(&trgm, &none(), false)
            .unwrap()
            .contains("'extension:pg_trgm'"));
        assert!(refuse(&trgm, &Allowed::parse("extension:pg_trgm").unwrap(), false).is_none());
        // a volatile function needs its own name
        let volatile = Function {
            volatility: VOLATILE,
            ..mine.clone()
        };
        assert!(refuse(
            &volatile,
            &Allowed::parse("schema:analytics").unwrap(),
            false
        )
        .is_some());
        assert!(refuse(
            &volatile,
            &Allowed::parse("analytics.fiscal_quarter").unwrap(),
            false
        )
        .is_none());
    }

    #[test]
    fn a_name_allows_only_functions_of_owners_that_may_have_them_named() {
        // Another role's overload in the schema, which no superuser, schema owner or trusted
        // owner owns: neither called nor run as support code.
        let overload = Function {
            superuser_owned: false,
            nameable: false,
            ..user("analytics", "fiscal_quarter", None)
        };
        let named = Allowed::parse("analytics.fiscal_quarter").unwrap();
        let why = refuse(&overload, &named, false).unwrap();
        assert!(why.contains("only when the owner of its schema"), "{why}");
        assert!(refuse_support(&overload, &named).is_some());
    }

    #[test]
    fn a_group_allows_only_a_superusers_functions() {
        // A function the extension's owner added to it, or a role with CREATE put in the
        // schema, is not what the superuser allowed.
        for (f, group) in [
            (
                user("public", "trgm_rank", Some("pg_trgm")),
                "extension:pg_trgm",
            ),
            (
                user("analytics", "fiscal_quarter", None),
                "schema:analytics",
            ),
        ] {
            let theirs = Function {
                superuser_owned: false,
                nameable: true,
                ..f
            };
            let allowed = Allowed::parse(group).unwrap();
            let why = refuse(&theirs, &allowed, false).unwrap();
            assert!(why.contains("allowed only by name"), "{why}");
            assert!(refuse_support(&theirs, &allowed).is_some());
            let named = Allowed::parse(&format!("{}.{}", theirs.schema, theirs.name)).unwrap();
            assert!(refuse(&theirs, &named, false).is_none());
            assert!(refuse_support(&theirs, &named).is_none());
        }
    }

    #[test]
    fn built_ins_pass_unless_volatile_or_system_accessors() {
        for name in [
            "lower",
            "date_trunc",
            "sum",
            "now",
            "round",
            "to_char",
            "pg_typeof",
        ] {
            assert!(
                refuse(&builtin(name, STABLE), &none(), false).is_none(),
                "{name}"
            );
        }
        assert!(refuse(&builtin("random", VOLATILE), &none(), false).is_none());
        assert!(refuse(&builtin("some_volatile", VOLATILE), &none(), false).is_some());
        for name in [
            "pg_stat_get_backend_activity",
            "pg_config",
            "version",
            "pg_get_viewdef",
        ] {
            assert!(
                refuse(&builtin(name, STABLE), &none(), false).is_some(),
                "{name}"
            );
            assert!(
                refuse(&builtin(name, STABLE), &none(), true).is_none(),
                "{name}"
            );
        }
        // a look-alike outside pg_catalog is not a built-in
        assert!(refuse(&user("public", "lower", None), &none(), false).is_some());
    }

    #[test]
    fn type_support_functions_run_only_implicitly() {
        let domain_in = Function {
            type_support: true,
            ..builtin("domain_in", STABLE)
        };
        assert!(refuse(&domain_in, &none(), true)
            .unwrap()
            .contains("input, output or support function"));
        assert!(refuse_support(&domain_in, &none()).is_none());
        assert!(refuse(&builtin("txid_current_snapshot", STABLE), &none(), true).is_some());
        assert!(refuse(&builtin("pg_input_is_valid", STABLE), &none(), true)
            .unwrap()
            .contains("a type's input or modifier function"));
        for name in [
            "to_regtype",
            "to_regtypemod",
            "format_type",
            "satisfies_hash_partition",
            "has_type_privilege",
            "has_function_privilege",
        ] {
            assert!(
                refuse(&builtin(name, STABLE), &none(), true).is_some(),
                "{name}"
            );
        }
        let vector_in = Function {
            type_support: true,
            ..user("public", "vector_in", Some("vector"))
        };
        assert!(refuse_support(&vector_in, &none())
            .unwrap()
            .contains("'extension:vector'"));
        assert!(refuse_support(&vector_in, &Allowed::parse("extension:vector").unwrap()).is_none());
        assert!(refuse_support(&builtin("pg_sleep", STABLE), &none()).is_some());
    }

    #[test]
    fn a_function_that_returns_no_value_is_refused_unless_named() {
        let validator = Function {
            returns_nothing: true,
            ..builtin("fmgr_sql_validator", STABLE)
        };
        assert!(refuse(&validator, &none(), true)
            .unwrap()
            .contains("returns no value"));
        let allowed = Allowed::parse("pg_catalog.fmgr_sql_validator").unwrap();
        assert!(refuse(&validator, &allowed, true).is_none());
    }

    #[test]
    fn the_setting_parses_strictly() {
        let a = Allowed::parse(" extension:pg_trgm, schema:\"Sales\", public.f ").unwrap();
        assert_eq!(a.extensions, ["pg_trgm"]);
        assert_eq!(a.schemas, ["Sales"]);
        assert_eq!(a.functions, [("public".to_string(), "f".to_string())]);
        assert!(Allowed::parse("crosstab").is_err());
        assert_eq!(Allowed::parse("").unwrap(), Allowed::default());
    }
}
