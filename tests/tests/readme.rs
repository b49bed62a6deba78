//! README's settings table says what the extension registers: every setting and only those,
//! with its default and who may set it (a superuser, any role, or any role only lower, which is
//! checked by trying to raise it as a role); the hidden ones, which pg_settings does not list,
//! are tried as a role too.

use sql_query_engine_e2e::{cluster, db_error, Session};

/// One row of README's settings table.
#[derive(Debug)]
struct Documented {
    name: String,
    default: String,
    who: String,
}

fn documented() -> Vec<Documented> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("reading README.md");
    readme
        .lines()
        .filter(|l| l.starts_with("| `sql_query_engine."))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            Documented {
                name: cells[1].trim_matches('`').to_string(),
                default: cells[2].to_string(),
                who: cells[3].to_string(),
            }
        })
        .collect()
}

/// A README default (`` `60000` ms ``, `` `1MB` ``, `(none)`) in pg_settings' terms: the boot
/// value, with its unit when it has one.
fn normalized(default: &str) -> String {
    if default.starts_with('(') {
        return String::new();
    }
    let plain = default.replace('`', "");
    let mut parts = plain.split_whitespace();
    let value = parts.next().unwrap_or_default();
    let unit = parts.next().unwrap_or_default();
    let bytes = |number: &str, factor: u64| {
        format!("{} B", number.parse::<u64>().expect("a number") * factor)
    };
    if let Some(mb) = value.strip_suffix("MB") {
        return bytes(mb, 1 << 20);
    }
    if let Some(kb) = value.strip_suffix("kB") {
        return bytes(kb, 1 << 10);
    }
    if unit.is_empty() {
        value.to_string()
    } else {
        format!("{value} {unit}")
    }
}

#[test]
fn the_settings_table_is_what_the_extension_registers() {
    let mut s = Session::new();
    s.client.batch_execute("LOAD 'sql_query_engine'").unwrap();
    let registered: Vec<(String, String, String, String, String)> = s
        .client
        .query(
            "SELECT name, coalesce(boot_val, ''), coalesce(unit, ''), context, vartype
             FROM pg_settings WHERE name LIKE 'sql_query_engine.%' ORDER BY name",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect();
    let documented = documented();
    assert!(documented.len() >= 30, "{documented:?}");
    let role = format!("readme_{}", s.database);
    s.client
        .batch_execute(&format!("CREATE ROLE {role} LOGIN"))
        .unwrap();
    let mut as_role = cluster().connect_as(&s.database, &role);
    as_role.batch_execute("SELECT nl_schema()").unwrap();
    let mut wrong = Vec::new();
    for (name, boot, unit, context, vartype) in &registered {
        let Some(doc) = documented.iter().find(|d| d.name == *name) else {
            wrong.push(format!("{name} is registered but not in README"));
            continue;
        };
        let default = if unit.is_empty() {
            boot.clone()
        } else {
            format!("{boot} {unit}")
        };
        if normalized(&doc.default) != default {
            wrong.push(format!(
                "{name}: README says {}, the default is {default}",
                doc.default
            ));
        }
        let superuser = context == "superuser";
        if superuser != (doc.who == "superuser") {
            wrong.push(format!(
                "{name}: README says {}, context is {context}",
                doc.who
            ));
        }
        if vartype == "integer" && !superuser {
            let higher = boot.parse::<i64>().unwrap_or(0) + 1;
            let raised = as_role.batch_execute(&format!("SET {name} = {higher}"));
            let only_lower = doc.who.contains("only lower");
            match raised {
                Ok(()) if only_lower => {
                    wrong.push(format!("{name}: README says only lower, a role raised it"))
                }
                Err(e) if !only_lower => wrong.push(format!(
                    "{name}: README says any role, raising it failed: {:?}",
                    db_error(&e)
                )),
                _ => {}
            }
        }
    }
    for doc in &documented {
        let known = registered.iter().any(|(name, ..)| *name == doc.name);
        // Settings hidden from pg_settings (a secret's neighbours) still exist.
        let hidden = s
            .client
            .query_one("SELECT current_setting($1, true) IS NOT NULL", &[&doc.name])
            .map(|r| r.get::<_, bool>(0))
            .unwrap_or(false);
        if !known && !hidden {
            wrong.push(format!("{} is in README but not registered", doc.name));
        }
        // Hidden ones (where requests and keys go) are a superuser's: a role may neither set
        // nor read them.
        if !known && hidden {
            if doc.who != "superuser" {
                wrong.push(format!("{}: hidden, but README says {}", doc.name, doc.who));
            }
            for statement in [
                format!("SET {} = 'http://127.0.0.1:9/v1'", doc.name),
                format!("SHOW {}", doc.name),
            ] {
                match as_role.batch_execute(&statement) {
                    Err(e) if db_error(&e).0 == "42501" => {}
                    other => wrong.push(format!(
                        "{statement} as a role: {:?}",
                        other.map_err(|e| db_error(&e))
                    )),
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "README's settings table:\n{}",
        wrong.join("\n")
    );
}
