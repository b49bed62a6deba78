//! The policy tables: which functions a generated query may call. Pure data and logic, so it is
//! tested without a backend; `guard` applies it to the server's own parse trees.

/// Functions refused by exact name, in any schema: they change state, sleep, signal, or read
/// server state a prompt could exfiltrate (`current_setting` would read the API key into rows
/// that are fed back to the model).
const DENIED_NAMES: &[&str] = &[
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
    "pg_get_backend_memory_contexts",
    "pg_stat_get_activity",
    "pg_prewarm",
    "txid_current",
    "txid_current_if_assigned",
    "loread",
    "lowrite",
    // These run SQL given as a string, out of the guard's sight.
    "query_to_xml",
    "query_to_xml_and_xmlschema",
    "query_to_xmlschema",
    "cursor_to_xml",
    "cursor_to_xmlschema",
    "ts_stat",
];

/// Functions refused by name prefix, in any schema.
const DENIED_PREFIXES: &[&str] = &[
    "pg_sleep",
    "pg_advisory",
    "pg_try_advisory",
    "pg_read_",
    "pg_ls_",
    "pg_file_",
    "pg_stat_reset",
    "pg_show_",
    "pg_current_",
    "pg_logical_",
    "pg_replication_",
    "pg_copy_",
    "pg_create_",
    "pg_drop_",
    "pg_wal_",
    "pg_backup_",
    "lo_",
    "dblink",
    "table_to_xml",
    "schema_to_xml",
    "database_to_xml",
];

/// VOLATILE functions of `pg_catalog` that are harmless: they only produce values.
const VOLATILE_ALLOWED: &[&str] = &[
    "random",
    "random_normal",
    "clock_timestamp",
    "timeofday",
    "gen_random_uuid",
];

/// PostgreSQL's `provolatile` codes.
pub const IMMUTABLE: u8 = b'i';
pub const STABLE: u8 = b's';

/// Why a function may not be called, or `None` when it may.
pub fn refuse_function(schema: &str, name: &str, volatility: u8) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    if DENIED_NAMES.contains(&lower.as_str())
        || DENIED_PREFIXES.iter().any(|p| lower.starts_with(p))
    {
        return Some("it has side effects or reads server state");
    }
    if volatility != IMMUTABLE
        && volatility != STABLE
        && !(schema == "pg_catalog" && VOLATILE_ALLOWED.contains(&name))
    {
        return Some("it is VOLATILE, and only IMMUTABLE and STABLE functions may run");
    }
    None
}

/// Schemas whose relations are not queryable unless `sql_query_engine.allow_system_catalogs` is
/// on: questions about the schema are answered from the schema context instead.
pub const CATALOG_SCHEMAS: &[&str] = &["pg_catalog", "information_schema", "pg_toast"];

#[cfg(test)]
mod tests {
    use super::*;

    const VOLATILE: u8 = b'v';

    #[test]
    fn side_effects_are_refused_in_any_schema_and_any_volatility() {
        for (schema, name) in [
            ("pg_catalog", "nextval"),
            ("pg_catalog", "pg_sleep_for"),
            ("pg_catalog", "pg_advisory_xact_lock"),
            ("pg_catalog", "pg_try_advisory_lock_shared"),
            ("pg_catalog", "current_setting"),
            ("pg_catalog", "pg_read_binary_file"),
            ("pg_catalog", "lo_import"),
            ("public", "dblink_exec"),
            ("pg_catalog", "query_to_xml"),
            ("pg_catalog", "pg_current_xact_id"),
            ("pg_catalog", "pg_create_logical_replication_slot"),
        ] {
            assert!(
                refuse_function(schema, name, STABLE).is_some(),
                "{schema}.{name}"
            );
        }
    }

    #[test]
    fn volatile_functions_need_the_allow_list() {
        assert!(refuse_function("public", "my_volatile", VOLATILE).is_some());
        assert!(refuse_function("pg_catalog", "random", VOLATILE).is_none());
        assert!(refuse_function("pg_catalog", "gen_random_uuid", VOLATILE).is_none());
        // the allow-list is for the catalog's own functions, not look-alikes elsewhere
        assert!(refuse_function("public", "random", VOLATILE).is_some());
    }

    #[test]
    fn ordinary_functions_pass() {
        for name in [
            "lower",
            "date_trunc",
            "sum",
            "now",
            "coalesce",
            "round",
            "to_char",
            "pg_get_viewdef",
        ] {
            assert!(
                refuse_function("pg_catalog", name, STABLE).is_none(),
                "{name}"
            );
            assert!(
                refuse_function("pg_catalog", name, IMMUTABLE).is_none(),
                "{name}"
            );
        }
    }
}
