//! `ALTER EXTENSION sql_query_engine UPDATE` from the previous release gives the same objects as
//! a fresh install of this one, and keeps the data of the extension's tables.

use std::sync::{Arc, Mutex};

use sql_query_engine_e2e::{cluster, db_error, Reply, ScriptedLlm};

/// Every object of the extension with what defines it, sorted: functions with their full
/// definition and privileges (the defaults written out: no grant yet and grants revoked down to
/// the owner's are the same); tables with their columns (types, NOT NULL, defaults), row
/// security, privileges, indexes, constraints, policies (with their roles) and triggers (with
/// when they fire: `ENABLE ALWAYS`); event triggers with their tags and when they fire.
const MEMBERS: &str = "
SELECT pg_describe_object(d.classid, d.objid, d.objsubid) || ': ' || coalesce(
         CASE WHEN d.classid = 'pg_proc'::regclass THEN
             pg_get_functiondef(d.objid) || ' acl ' || coalesce(
                 (SELECT coalesce(proacl, acldefault('f', proowner))::text
                  FROM pg_proc WHERE oid = d.objid), '') END,
         CASE WHEN d.classid = 'pg_class'::regclass THEN (
             SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
                               || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
                               || coalesce(' default ' || pg_get_expr(ad.adbin, ad.adrelid), '')
                               || CASE WHEN a.attidentity <> '' THEN ' identity ' || a.attidentity::text ELSE '' END,
                               ', ' ORDER BY a.attnum)
             FROM pg_attribute a
             LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
             WHERE a.attrelid = d.objid AND a.attnum > 0 AND NOT a.attisdropped)
             || ' | row security ' || c.relrowsecurity || ' forced ' || c.relforcerowsecurity
             || ' | acl ' || coalesce(c.relacl, acldefault(CASE c.relkind WHEN 'S' THEN 's'
                                                           ELSE 'r' END::\"char\", c.relowner))::text
             || ' | indexes ' || coalesce((SELECT string_agg(pg_get_indexdef(i.indexrelid), '; '
                                                             ORDER BY 1)
                                          FROM pg_index i WHERE i.indrelid = d.objid), '')
             || ' | constraints ' || coalesce((SELECT string_agg(co.conname || ' '
                                                                 || pg_get_constraintdef(co.oid), '; '
                                                                 ORDER BY co.conname)
                                              FROM pg_constraint co WHERE co.conrelid = d.objid), '')
             || ' | policies ' || coalesce((SELECT string_agg(p.polname || ' ' || p.polcmd::text || ' '
                                                              || p.polpermissive::text || ' ' || p.polroles::text || ' '
                                                              || coalesce(pg_get_expr(p.polqual, p.polrelid), '')
                                                              || ' check ' || coalesce(pg_get_expr(p.polwithcheck, p.polrelid), ''),
                                                              '; ' ORDER BY p.polname)
                                           FROM pg_policy p WHERE p.polrelid = d.objid), '')
             || ' | triggers ' || coalesce((SELECT string_agg(pg_get_triggerdef(t.oid)
                                                              || ' enabled ' || t.tgenabled::text, '; '
                                                              ORDER BY t.tgname)
                                           FROM pg_trigger t WHERE t.tgrelid = d.objid
                                             AND NOT t.tgisinternal), '')
             END,
         CASE WHEN d.classid = 'pg_event_trigger'::regclass THEN (
             SELECT evtevent || ' ' || coalesce(array_to_string(evttags, ','), '') || ' '
                    || evtfoid::regproc::text || ' enabled ' || evtenabled::text
             FROM pg_event_trigger WHERE oid = d.objid) END,
         '')
FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
LEFT JOIN pg_class c ON d.classid = 'pg_class'::regclass AND c.oid = d.objid
WHERE e.extname = 'sql_query_engine' AND d.deptype = 'e'
ORDER BY 1";

fn members(database: &str) -> Vec<String> {
    let mut client = cluster().connect(database);
    client
        .query(MEMBERS, &[])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

fn new_database(name: &str) -> String {
    let name = format!("{name}_{}", std::process::id());
    let mut admin = cluster().connect("postgres");
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
        .unwrap();
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .unwrap();
    name
}

#[test]
fn updating_from_0_1_0_through_every_release_equals_a_fresh_install_and_keeps_the_data() {
    let fresh = new_database("sqe_fresh");
    cluster()
        .connect(&fresh)
        .batch_execute("CREATE EXTENSION sql_query_engine")
        .unwrap();

    let updated = new_database("sqe_updated");
    let mut client = cluster().connect(&updated);
    client
        .batch_execute(
            "CREATE EXTENSION sql_query_engine VERSION '0.1.0';
             CREATE TABLE t (a int); INSERT INTO t VALUES (1), (2);
             SELECT nl_example_add('how many t', 'SELECT count(*) FROM t');",
        )
        .expect("installing 0.1.0 (scripts/test.sh puts its script into the server's directory)");
    client
        .batch_execute("ALTER EXTENSION sql_query_engine UPDATE TO '0.4.0'")
        .unwrap();
    // 0.4.0 read a role's name as an identifier: "FOLD_..." wrote its history row under the
    // OID of fold_...; the update gives it back to the role of its exact name.
    let plain = format!("fold_{updated}");
    let upper = plain.to_uppercase();
    client
        .batch_execute(&format!(
            "CREATE ROLE {plain}; CREATE ROLE \"{upper}\"; SET ROLE \"{upper}\";
             INSERT INTO nl_history (function, question, status, attempts, ms, llm_calls,
                                     prompt_tokens, completion_tokens)
             VALUES ('nl_ask', 'written by the upper-case role', 'ok', '[]', 1, 1, 1, 1);
             RESET ROLE;"
        ))
        .unwrap();
    let owner = |client: &mut postgres::Client| -> String {
        client
            .query_one(
                "SELECT r.rolname::text FROM nl_history h JOIN pg_roles r ON r.oid = h.role_id \
                 WHERE h.question = 'written by the upper-case role'",
                &[],
            )
            .unwrap()
            .get(0)
    };
    assert_eq!(owner(&mut client), plain, "0.4.0 as it was");
    client
        .batch_execute("ALTER EXTENSION sql_query_engine UPDATE TO '0.5.0'")
        .unwrap();
    assert_eq!(owner(&mut client), upper);
    // 0.5.0 let a role's history row name another role; 0.6.0 does not.
    let forged = format!(
        "SET ROLE \"{upper}\";
         INSERT INTO nl_history (role, function, question, status, attempts, ms, llm_calls,
                                 prompt_tokens, completion_tokens)
         VALUES ('{plain}', 'nl_ask', 'named as another role', 'ok', '[]', 1, 1, 1, 1);"
    );
    client.batch_execute(&forged).unwrap();
    client.batch_execute("RESET ROLE").unwrap();
    client
        .batch_execute("ALTER EXTENSION sql_query_engine UPDATE TO '0.6.0'")
        .unwrap();
    assert!(client.batch_execute(&forged).is_err(), "0.6.0 refuses it");
    client
        .batch_execute(
            "RESET ROLE; DELETE FROM nl_history WHERE question = 'named as another role'",
        )
        .unwrap();
    client
        .batch_execute("ALTER EXTENSION sql_query_engine UPDATE TO '0.7.0'")
        .unwrap();
    // 0.7.0 let a role that may write examples name another as their author; 0.8.0 does not.
    let forged = format!(
        "GRANT INSERT ON nl_examples TO \"{upper}\";
         SET ROLE \"{upper}\";
         INSERT INTO nl_examples (question, sql, added_by, added_at)
         VALUES ('forged', 'SELECT 1', '{plain}', '2001-01-01');
         RESET ROLE;"
    );
    let author = |client: &mut postgres::Client| -> String {
        client
            .query_one(
                "SELECT added_by::text FROM nl_examples WHERE question = 'forged'",
                &[],
            )
            .unwrap()
            .get(0)
    };
    client.batch_execute(&forged).unwrap();
    assert_eq!(author(&mut client), plain, "0.7.0 as it was");
    client
        .batch_execute("DELETE FROM nl_examples WHERE question = 'forged'")
        .unwrap();
    client
        .batch_execute("ALTER EXTENSION sql_query_engine UPDATE TO '0.8.0'")
        .unwrap();
    client.batch_execute(&forged).unwrap();
    assert_eq!(author(&mut client), upper, "0.8.0 names who inserted it");
    // 0.8.0 let a role file feedback on another role's answer; 0.9.0 does not. The history
    // row is the upper-case role's, which the plain role cannot see: it names it by its id.
    let id: i64 = client
        .query_one(
            "SELECT id FROM nl_history WHERE question = 'written by the upper-case role'",
            &[],
        )
        .unwrap()
        .get(0);
    let foreign = format!(
        "SET ROLE {plain};
         INSERT INTO nl_feedback (history_id, question, correct, sql, status)
         VALUES ({id}, 'a correction of another role''s answer', false, 'SELECT 2', 'pending');
         RESET ROLE;"
    );
    let filed = |client: &mut postgres::Client| -> i64 {
        client
            .query_one(
                "SELECT count(*) FROM nl_feedback \
                 WHERE question = 'a correction of another role''s answer'",
                &[],
            )
            .unwrap()
            .get(0)
    };
    client.batch_execute(&foreign).unwrap();
    assert_eq!(filed(&mut client), 1, "0.8.0 as it was");
    client
        .batch_execute(
            "DELETE FROM nl_feedback WHERE question = 'a correction of another role''s answer';
             ALTER EXTENSION sql_query_engine UPDATE TO '0.9.0'",
        )
        .unwrap();
    let refused = client.batch_execute(&foreign).unwrap_err();
    assert_eq!(
        refused.code(),
        Some(&postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
        "0.9.0 refuses it: {refused}"
    );
    client.batch_execute("RESET ROLE").unwrap();
    assert_eq!(filed(&mut client), 0);
    // 0.9.0 kept a restored row's OID, whichever role holds it here; 0.10.0 gives the row to
    // the role of its name. The owner writes rows as given, as a restore does.
    let restore = format!(
        "INSERT INTO nl_history (role, role_id, function, question, status, attempts, ms,
                                 llm_calls, prompt_tokens, completion_tokens)
         VALUES ('{plain}', '\"{upper}\"'::regrole, 'nl_ask', 'restored', 'ok', '[]', 1, 1, 1, 1)"
    );
    let restored_to = |client: &mut postgres::Client| -> String {
        client
            .query_one(
                "SELECT coalesce(r.rolname::text, '-') FROM nl_history h \
                 LEFT JOIN pg_roles r ON r.oid = h.role_id WHERE h.question = 'restored'",
                &[],
            )
            .unwrap()
            .get(0)
    };
    client.batch_execute(&restore).unwrap();
    assert_eq!(restored_to(&mut client), upper, "0.9.0 as it was");
    client
        .batch_execute(
            "DELETE FROM nl_history WHERE question = 'restored';
             ALTER EXTENSION sql_query_engine UPDATE TO '0.10.0'",
        )
        .unwrap();
    client.batch_execute(&restore).unwrap();
    assert_eq!(restored_to(&mut client), plain, "0.10.0 goes by the name");
    client
        .batch_execute("DELETE FROM nl_history WHERE question = 'restored'")
        .unwrap();
    client
        .batch_execute(&format!(
            "DELETE FROM nl_examples WHERE question = 'forged';
             REVOKE INSERT ON nl_examples FROM \"{upper}\";
             DELETE FROM nl_history WHERE question = 'written by the upper-case role';
             DROP ROLE {plain}; DROP ROLE \"{upper}\";"
        ))
        .unwrap();
    // 0.10.0 counted every COMMENT in one sum; 0.11.0 counts those on relations, per schema,
    // and keeps the rows counted before (under no schema).
    client
        .batch_execute(
            "COMMENT ON TABLE t IS 'before';
             ALTER EXTENSION sql_query_engine UPDATE TO '0.11.0';
             SELECT lo_create(4242);",
        )
        .unwrap();
    client
        .batch_execute("COMMENT ON TABLE t IS 'after'")
        .unwrap();
    client
        .batch_execute("COMMENT ON LARGE OBJECT 4242 IS 'not shown'")
        .unwrap();
    let counted = |client: &mut postgres::Client, schema: &str| -> i64 {
        client
            .query_one(
                "SELECT coalesce(sum(changes), 0)::int8 FROM nl_schema_changes \
                 WHERE schema_name = $1",
                &[&schema],
            )
            .unwrap()
            .get(0)
    };
    assert!(counted(&mut client, "") >= 1);
    assert_eq!(counted(&mut client, "public"), 1);
    // 0.12.0 writes every change to the examples to the server log; 0.13.0 writes it the same
    // whatever the session's standard_conforming_strings; 0.14.0 counts comments only while a
    // superuser owns the extension's schema.
    client
        .batch_execute(
            "ALTER EXTENSION sql_query_engine UPDATE TO '0.12.0';
             ALTER EXTENSION sql_query_engine UPDATE TO '0.13.0';
             ALTER EXTENSION sql_query_engine UPDATE TO '0.14.0';",
        )
        .unwrap();
    // 0.15.0 refuses a rename of the extension's schema.
    client
        .batch_execute("ALTER SCHEMA public RENAME TO moved")
        .unwrap();
    client
        .batch_execute(
            "ALTER SCHEMA moved RENAME TO public;
             ALTER EXTENSION sql_query_engine UPDATE TO '0.15.0';",
        )
        .unwrap();
    let refused = client
        .batch_execute("ALTER SCHEMA public RENAME TO moved")
        .unwrap_err();
    assert_eq!(
        refused.code().map(|c| c.code()),
        Some("55000"),
        "{refused:?}"
    );
    // 0.16.0 reads the schema's name back whatever the session's quote_all_identifiers: with
    // it on, every ALTER SCHEMA was refused.
    client
        .batch_execute(
            "ALTER EXTENSION sql_query_engine UPDATE TO '0.16.0';
             SET quote_all_identifiers = on;
             CREATE SCHEMA elsewhere; ALTER SCHEMA elsewhere RENAME TO elsewhere2;
             DROP SCHEMA elsewhere2; RESET quote_all_identifiers;",
        )
        .unwrap();
    let version: String = client
        .query_one(
            "SELECT extversion FROM pg_extension WHERE extname = 'sql_query_engine'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(version, "0.16.0");
    client
        .batch_execute("COMMENT ON TABLE t IS 'after 0.15.0'")
        .unwrap();
    assert_eq!(counted(&mut client, "public"), 2, "a superuser owns public");
    // 0.17.0 keeps a row per turn, which roles may only add: a session's turns come along, in
    // their order.
    client
        .batch_execute(
            r#"INSERT INTO nl_sessions (session, turns) VALUES ('kept',
                   '[{"question": "the first", "sql": "SELECT 1"}, {"question": "the second"}]');
               ALTER TABLE nl_sessions DISABLE TRIGGER nl_row_role;
               INSERT INTO nl_sessions (session, turns, updated_at) VALUES ('ahead',
                   '[{"question": "dated ahead"}]', now() + interval '1 day');
               ALTER TABLE nl_sessions ENABLE ALWAYS TRIGGER nl_row_role;
               ALTER EXTENSION sql_query_engine UPDATE TO '0.17.0';"#,
        )
        .unwrap();
    let turns: String = client
        .query_one(
            "SELECT string_agg(question || ': ' || sql, '; ' ORDER BY id) FROM nl_sessions \
             WHERE session = 'kept' AND role = current_user",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(turns, "the first: SELECT 1; the second: ");
    let ahead: i64 = client
        .query_one(
            "SELECT count(*) FROM nl_sessions WHERE session = 'ahead'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(ahead, 0, "a turn dated ahead would live past its TTL");
    // 0.18.0: the owner's updates keep a row's role (an_owners_update_leaves_rows_with_...).
    client
        .batch_execute("ALTER EXTENSION sql_query_engine UPDATE TO '0.18.0'")
        .unwrap();
    // 0.19.0: the examples' audit lines write out the characters drawn as nothing.
    client
        .batch_execute("ALTER EXTENSION sql_query_engine UPDATE TO '0.19.0'")
        .unwrap();
    // 0.20.0: a role row security does not apply to writes rows only as itself, as of now.
    client
        .batch_execute("ALTER EXTENSION sql_query_engine UPDATE TO '0.20.0'")
        .unwrap();
    // 0.21.0: privileges default privileges gave the extension's objects are revoked.
    client
        .batch_execute("ALTER EXTENSION sql_query_engine UPDATE TO '0.21.0'")
        .unwrap();
    // 0.22.0: comments reach the schema caches as invalidations; their table is gone.
    client
        .batch_execute(
            "ALTER EXTENSION sql_query_engine UPDATE TO '0.22.0';
             COMMENT ON TABLE t IS 'after 0.22.0';",
        )
        .unwrap();
    // 0.23.0: rows are dated as they are written; what roles made with privileges taken away
    // since is undone (default_privileges_give_no_role_rights_on_the_extensions_objects).
    client
        .batch_execute("ALTER EXTENSION sql_query_engine UPDATE TO '0.23.0'")
        .unwrap();
    let (updated_members, fresh_members) = (members(&updated), members(&fresh));
    let only = |a: &[String], b: &[String]| -> Vec<String> {
        a.iter().filter(|m| !b.contains(m)).cloned().collect()
    };
    assert!(
        updated_members == fresh_members,
        "after the update only:\n{}\n\nin a fresh install only:\n{}",
        only(&updated_members, &fresh_members).join("\n"),
        only(&fresh_members, &updated_members).join("\n")
    );

    // the example survived, and the updated extension answers
    let examples: i64 = client
        .query_one("SELECT count(*) FROM nl_examples", &[])
        .unwrap()
        .get(0);
    assert_eq!(examples, 1);
    let llm = ScriptedLlm::start();
    llm.on(
        "how many rows in t",
        vec![Reply::sql("SELECT count(*) AS n FROM t")],
    );
    client
        .batch_execute(&format!("SET sql_query_engine.llm_url = '{}'", llm.url()))
        .unwrap();
    let n: String = client
        .query_one("SELECT nl_query('how many rows in t')::text", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, r#"{"n": 2}"#);
    let schema: String = client.query_one("SELECT nl_schema()", &[]).unwrap().get(0);
    assert!(schema.contains("CREATE TABLE t"), "{schema}");
    drop(client);
    let mut admin = cluster().connect("postgres");
    for database in [fresh, updated] {
        admin
            .batch_execute(&format!("DROP DATABASE {database}"))
            .unwrap();
    }
}

/// Default privileges of the installing superuser (here, every privilege on every table,
/// sequence and function it creates, to an application role and to PUBLIC) reach none of the
/// extension's objects, on install and on update: the application role, a login role, cannot
/// rewrite the examples every role's model is shown, attach a trigger of its own to the
/// history, set a sequence back, empty a table past row security or call a trigger function.
/// The owner's later grant to a role that may write examples survives an update.
#[test]
fn default_privileges_give_no_role_rights_on_the_extensions_objects() {
    let app = format!("defacl_app_{}", std::process::id());
    let curator = format!("defacl_writer_{}", std::process::id());
    let mut admin = cluster().connect("postgres");
    admin
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {app}; CREATE ROLE {app} LOGIN;
             DROP ROLE IF EXISTS {curator}; CREATE ROLE {curator} LOGIN;"
        ))
        .unwrap();
    let installed = new_database("sqe_defacl_install");
    let updated = new_database("sqe_defacl_update");
    let plain = new_database("sqe_defacl_plain");
    for (database, version) in [(&installed, None), (&updated, Some("0.1.0"))] {
        let mut client = cluster().connect(database);
        client
            .batch_execute(&format!(
                "CREATE SCHEMA app AUTHORIZATION {app};
                 CREATE FUNCTION app.app_trigger() RETURNS trigger LANGUAGE plpgsql
                     AS $$ BEGIN RAISE EXCEPTION 'the app role''s trigger ran'; END $$;
                 ALTER FUNCTION app.app_trigger() OWNER TO {app};
                 ALTER DEFAULT PRIVILEGES GRANT ALL ON TABLES TO {app} WITH GRANT OPTION;
                 ALTER DEFAULT PRIVILEGES GRANT ALL ON TABLES TO PUBLIC;
                 ALTER DEFAULT PRIVILEGES GRANT ALL ON SEQUENCES TO {app}, PUBLIC;
                 ALTER DEFAULT PRIVILEGES GRANT ALL ON FUNCTIONS TO {app};
                 CREATE EXTENSION sql_query_engine{};",
                version.map_or(String::new(), |v| format!(" VERSION '{v}'"))
            ))
            .unwrap();
        if version.is_some() {
            let warnings = Arc::new(Mutex::new(Vec::new()));
            let mut owner = cluster().connect_with_notices(database, Arc::clone(&warnings));
            // What the application role builds with what default privileges gave it: a
            // trigger of its own on the history (it runs as whoever writes a row, a
            // superuser's call too), a foreign key to the examples, and every role made an
            // example writer through its grant option.
            owner
                .batch_execute(&format!(
                    "GRANT INSERT, DELETE ON nl_examples TO {curator};
                     SET ROLE {app}; GRANT UPDATE ON nl_examples TO {curator};
                     CREATE TRIGGER planted AFTER INSERT ON nl_history
                         FOR EACH ROW EXECUTE FUNCTION app.app_trigger();
                     CREATE TABLE app.pins (example bigint REFERENCES nl_examples (id));
                     GRANT INSERT ON nl_examples TO PUBLIC;
                     GRANT INSERT (question, sql), UPDATE (sql) ON nl_examples TO PUBLIC;
                     RESET ROLE;
                     ALTER EXTENSION sql_query_engine UPDATE;"
                ))
                .unwrap();
            let warnings = warnings.lock().unwrap().join("\n");
            assert!(
                warnings.contains("may write the verified examples")
                    && warnings.contains(&app)
                    && warnings.contains(&curator),
                "{warnings}"
            );
            assert!(
                warnings.contains("trigger planted on")
                    && warnings.contains("foreign key pins_example_fkey")
                    && warnings.contains("grant option for INSERT"),
                "{warnings}"
            );
            // A role's write of its history runs no trigger of the application role's, and
            // no role but those granted it writes examples.
            let mut curator_client = cluster().connect_as(database, &curator);
            curator_client
                .batch_execute(
                    "INSERT INTO nl_history (function, question, status, attempts, ms, \
                     llm_calls, prompt_tokens, completion_tokens) \
                     VALUES ('nl_ask', 'q', 'ok', '[]', 1, 1, 1, 1)",
                )
                .unwrap();
            let (pins, public_insert, column_grants): (i64, bool, i64) = {
                let row = owner
                    .query_one(
                        "SELECT (SELECT count(*) FROM pg_constraint
                                 WHERE conrelid = 'app.pins'::regclass AND contype = 'f'),
                                EXISTS (SELECT FROM aclexplode((SELECT relacl FROM pg_class
                                            WHERE oid = 'nl_examples'::regclass)) a
                                        WHERE a.grantee = 0 AND a.privilege_type = 'INSERT'),
                                (SELECT count(*) FROM pg_attribute
                                 WHERE attrelid = 'nl_examples'::regclass
                                   AND cardinality(attacl) > 0)",
                        &[],
                    )
                    .unwrap();
                (row.get(0), row.get(1), row.get(2))
            };
            assert_eq!(pins, 0, "the foreign key to the examples stayed");
            assert!(!public_insert, "PUBLIC may still write examples");
            let acls: Vec<String> = owner
                .query(
                    "SELECT attname || ' ' || attacl::text FROM pg_attribute
                     WHERE attrelid = 'nl_examples'::regclass AND cardinality(attacl) > 0",
                    &[],
                )
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            assert_eq!(
                column_grants, 0,
                "grants on the examples' columns stayed: {acls:?} {warnings}"
            );
        }
    }
    cluster()
        .connect(&plain)
        .batch_execute("CREATE EXTENSION sql_query_engine")
        .unwrap();
    // A fresh install's tables, sequences and trigger functions have the privileges of one
    // made without default privileges (the functions roles call keep theirs: EXECUTE, which
    // every role has anyway, or not, as the database's owner chose).
    let guarded = |database: &str| -> Vec<String> {
        members(database)
            .into_iter()
            .filter(|m| {
                m.starts_with("table ")
                    || m.starts_with("sequence ")
                    || m.contains("RETURNS trigger")
                    || m.contains("RETURNS event_trigger")
                    || m.starts_with("function nl_relations_commented")
            })
            .collect()
    };
    let (with_defaults, without) = (guarded(&installed), guarded(&plain));
    assert_eq!(with_defaults.len(), 16);
    assert_eq!(with_defaults, without);
    for database in [&installed, &updated] {
        let mut client = cluster().connect_as(database, &app);
        // The update keeps a role's DELETE on the examples (a role that may write them has
        // it), and says so.
        let delete = (database == &installed).then(|| "DELETE FROM nl_examples".to_string());
        for refused in [
            "UPDATE nl_examples SET sql = 'SELECT 1'".to_string(),
            "SELECT nl_relations_commented(ARRAY['nl_examples'::regclass::oid])".to_string(),
            "TRUNCATE nl_history".to_string(),
            "CREATE TRIGGER mine BEFORE INSERT ON nl_history \
             FOR EACH ROW EXECUTE FUNCTION app.app_trigger()"
                .to_string(),
            "SELECT setval('nl_history_id_seq', 1)".to_string(),
            "BEGIN; LOCK TABLE nl_history IN ACCESS EXCLUSIVE MODE; ROLLBACK".to_string(),
        ]
        .into_iter()
        .chain(delete)
        {
            let Err(error) = client.batch_execute(&refused) else {
                panic!("{database}: {refused} was let through");
            };
            assert_eq!(
                db_error(&error).0,
                "42501",
                "{database}: {refused}: {error}"
            );
            let _ = client.batch_execute("ROLLBACK");
        }
        // What every role may do still works.
        client
            .batch_execute("SELECT count(*) FROM nl_examples; SELECT count(*) FROM nl_history")
            .unwrap();
    }
    // The owner's grant to a role that may write examples, made after the install, stays.
    let kept: bool = cluster()
        .connect(&updated)
        .query_one(
            &format!("SELECT has_table_privilege('{curator}', 'nl_examples', 'INSERT')"),
            &[],
        )
        .unwrap()
        .get(0);
    assert!(kept, "the curator's grant was revoked by the update");
    // What the application role passed on of what default privileges gave it goes with it.
    let passed: bool = cluster()
        .connect(&updated)
        .query_one(
            &format!("SELECT has_table_privilege('{curator}', 'nl_examples', 'UPDATE')"),
            &[],
        )
        .unwrap()
        .get(0);
    assert!(!passed, "the UPDATE the application role passed on stayed");
    for database in [installed, updated, plain] {
        admin
            .batch_execute(&format!("DROP DATABASE {database}"))
            .unwrap();
    }
    admin
        .batch_execute(&format!("DROP ROLE {app}; DROP ROLE {curator}"))
        .unwrap();
}

/// What `pg_dump` and `pg_restore` carry of the extension: its tables' rows with their ids and
/// provenance, and where each identity stands, so that the restored database's next row takes
/// a new id instead of failing on a restored one (its history silently lost, its examples and
/// feedback refused).
#[test]
fn a_restored_dump_keeps_the_rows_and_draws_new_ids() {
    let (original, restored) = (new_database("dumped"), new_database("restored"));
    let role = format!("curator_{}", std::process::id());
    let mut client = cluster().connect(&original);
    client
        .batch_execute(&format!(
            "CREATE EXTENSION sql_query_engine;
             CREATE TABLE t (x int);
             DROP ROLE IF EXISTS {role}; CREATE ROLE {role};
             GRANT SELECT ON t TO {role}; GRANT INSERT ON nl_examples TO {role};
             SET ROLE {role};
             INSERT INTO nl_history (function, question, status, attempts, ms, llm_calls,
                                     prompt_tokens, completion_tokens)
                 VALUES ('nl_ask', 'before the dump', 'ok', '[]', 1, 1, 1, 1);
             SELECT nl_example_add('how many x', 'SELECT count(*) FROM t');
             RESET ROLE;"
        ))
        .unwrap();
    drop(client);
    let bindir = bindir();
    let c = cluster();
    let dump = sql_query_engine_e2e::scratch("dump.custom");
    let port = c.port.to_string();
    let connection = ["-h", &c.host, "-p", &port, "-U", &c.user];
    let dumped = std::process::Command::new(format!("{bindir}/pg_dump"))
        .args(connection)
        .args(["-Fc", "-f"])
        .arg(&dump)
        .arg(&original)
        .status()
        .unwrap();
    assert!(dumped.success());
    let restored_ok = std::process::Command::new(format!("{bindir}/pg_restore"))
        .args(connection)
        .args(["--exit-on-error", "-d", &restored])
        .arg(&dump)
        .status()
        .unwrap();
    let _ = std::fs::remove_file(&dump);
    assert!(restored_ok.success());

    let mut client = cluster().connect(&restored);
    let kept: (i64, String) = {
        let row = client
            .query_one("SELECT id, added_by::text FROM nl_examples", &[])
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(kept, (1, role.clone()), "the example and its author");
    let ids: (i64, i64) = client
        .query_one(
            "SELECT (SELECT max(id) FROM nl_history WHERE question = 'before the dump'),
                    nl_example_add('how many rows of x', 'SELECT count(x) FROM t')",
            &[],
        )
        .map(|row| (row.get(0), row.get(1)))
        .unwrap();
    assert_eq!(ids, (1, 2), "the next example takes a new id");
    client.batch_execute(&format!("SET ROLE {role}")).unwrap();
    let next: i64 = client
        .query_one(
            "INSERT INTO nl_history (function, question, status, attempts, ms, llm_calls,
                                     prompt_tokens, completion_tokens)
                 VALUES ('nl_ask', 'after the restore', 'ok', '[]', 1, 1, 1, 1) RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(next, 2, "the next history row takes a new id");
    drop(client);
    let mut admin = cluster().connect("postgres");
    for drop in [
        format!("DROP DATABASE {original}"),
        format!("DROP DATABASE {restored}"),
        format!("DROP ROLE {role}"),
    ] {
        admin.batch_execute(&drop).unwrap();
    }
}

/// The directory of the server's programs (pg_dump, pg_ctl, ...).
fn bindir() -> String {
    let out = std::process::Command::new(
        std::env::var("PG_CONFIG")
            .unwrap_or_else(|_| "/usr/lib/postgresql/15/bin/pg_config".into()),
    )
    .arg("--bindir")
    .output()
    .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A second cluster of the same server, whose next OID is chosen (`pg_resetwal -o`), so that
/// the roles created in it first take OIDs the test cluster gave to others; stopped and
/// removed on drop.
struct OtherCluster {
    dir: std::path::PathBuf,
    port: u16,
}

impl OtherCluster {
    fn start(next_oid: u32) -> OtherCluster {
        use sql_query_engine_e2e::cluster::{free_port, run_script};
        let dir = sql_query_engine_e2e::fresh_dir("sqe-other");
        let port = free_port();
        let other = OtherCluster { dir, port };
        let data = other.dir.join("data");
        run_script(&["start", other.dir.to_str().unwrap(), &port.to_string()]);
        // SAFETY: reads the effective user id.
        let root = unsafe { libc::geteuid() } == 0;
        let as_server_user = |program: &str| {
            let program = format!("{}/{program}", bindir());
            let mut command = std::process::Command::new(if root { "runuser" } else { &program });
            if root {
                command.args(["-u", "postgres", "--", &program]);
            }
            command
        };
        let stopped = as_server_user("pg_ctl")
            .args(["stop", "-m", "fast", "-w", "-D"])
            .arg(&data)
            .status()
            .unwrap();
        assert!(stopped.success());
        let reset = as_server_user("pg_resetwal")
            .args(["-o", &next_oid.to_string(), "-D"])
            .arg(&data)
            .output()
            .unwrap();
        assert!(reset.status.success(), "{reset:?}");
        run_script(&["start", other.dir.to_str().unwrap(), &port.to_string()]);
        other
    }

    fn connect(&self, database: &str) -> postgres::Client {
        let config = format!(
            "host={} port={} user=postgres dbname={database}",
            self.dir.display(),
            self.port
        );
        postgres::Client::connect(&config, postgres::NoTls).unwrap()
    }
}

impl Drop for OtherCluster {
    fn drop(&mut self) {
        sql_query_engine_e2e::cluster::run_script(&["stop", self.dir.to_str().unwrap_or("")]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The questions of `nl_history` and of `nl_feedback` that `role` reads.
fn seen_by(client: &mut postgres::Client, role: &str) -> (Vec<String>, Vec<String>) {
    client.batch_execute(&format!("SET ROLE {role}")).unwrap();
    let mut read = |sql: &str| -> Vec<String> {
        client
            .query(sql, &[])
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
    };
    let seen = (
        read("SELECT question FROM nl_history ORDER BY id"),
        read("SELECT question FROM nl_feedback ORDER BY id"),
    );
    client.batch_execute("RESET ROLE").unwrap();
    seen
}

/// Restored into another cluster, where roles have other OIDs, a row of `nl_history` or
/// `nl_feedback` goes to the role of its name: the role that now holds the OID its writer had
/// reads none of it, and its writer reads all of it. So it does in the cluster that wrote it.
#[test]
fn a_restored_row_goes_to_the_role_of_its_name() {
    let original = new_database("moved");
    let (alice, bob) = (
        format!("alice_{}", std::process::id()),
        format!("bob_{}", std::process::id()),
    );
    let mut client = cluster().connect(&original);
    let write = |role: &str, question: &str| {
        format!(
            "SET ROLE {role};
             INSERT INTO nl_history (function, question, status, attempts, ms, llm_calls,
                                     prompt_tokens, completion_tokens)
                 VALUES ('nl_ask', '{question}', 'ok', '[]', 1, 1, 1, 1);
             RESET ROLE;"
        )
    };
    client
        .batch_execute(&format!(
            "CREATE EXTENSION sql_query_engine;
             DROP ROLE IF EXISTS {alice}; CREATE ROLE {alice};
             DROP ROLE IF EXISTS {bob}; CREATE ROLE {bob};
             {}{}
             SET ROLE {alice};
             INSERT INTO nl_feedback (history_id, question, correct, status)
                 SELECT id, question, false, 'noted' FROM nl_history;
             RESET ROLE;",
            write(&alice, "asked by alice"),
            write(&bob, "asked by bob")
        ))
        .unwrap();
    let alice_oid: u32 = client
        .query_one(&format!("SELECT '{alice}'::regrole::oid"), &[])
        .unwrap()
        .get(0);
    drop(client);
    let c = cluster();
    let dump = sql_query_engine_e2e::scratch("moved.custom");
    let port = c.port.to_string();
    let dumped = std::process::Command::new(format!("{}/pg_dump", bindir()))
        .args(["-h", &c.host, "-p", &port, "-U", &c.user, "-Fc", "-f"])
        .arg(&dump)
        .arg(&original)
        .status()
        .unwrap();
    assert!(dumped.success());

    // The other cluster's roles, created as `pg_dumpall --roles-only` would, in another order:
    // bob takes the OID alice had.
    let other = OtherCluster::start(alice_oid);
    let mut admin = other.connect("postgres");
    admin
        .batch_execute(&format!("CREATE ROLE {bob}; CREATE ROLE {alice}"))
        .unwrap();
    admin.batch_execute("CREATE DATABASE restored").unwrap();
    let bob_oid: u32 = admin
        .query_one(&format!("SELECT '{bob}'::regrole::oid"), &[])
        .unwrap()
        .get(0);
    assert_eq!(bob_oid, alice_oid, "bob holds alice's old OID");
    let other_port = other.port.to_string();
    let restored = std::process::Command::new(format!("{}/pg_restore", bindir()))
        .args([
            "-h",
            other.dir.to_str().unwrap(),
            "-p",
            &other_port,
            "-U",
            "postgres",
        ])
        .args(["--exit-on-error", "-d", "restored"])
        .arg(&dump)
        .output()
        .unwrap();
    assert!(restored.status.success(), "{restored:?}");
    let mut client = other.connect("restored");
    assert_eq!(
        seen_by(&mut client, &bob),
        (vec!["asked by bob".to_string()], vec![]),
        "bob, under alice's old OID, reads his own question only"
    );
    assert_eq!(
        seen_by(&mut client, &alice),
        (
            vec!["asked by alice".to_string()],
            vec!["asked by alice".to_string()]
        ),
        "alice reads her question and her feedback"
    );
    drop(client);
    drop(admin);
    drop(other);

    // Restored into the cluster that wrote them, rows go by name too, as GRANTs do: alice,
    // dropped and created again, gets the old alice's rows; bob's, renamed since, go to no one.
    let bobby = format!("bobby_{}", std::process::id());
    let again = new_database("again");
    let mut admin = cluster().connect("postgres");
    admin
        .batch_execute(&format!(
            "ALTER ROLE {bob} RENAME TO {bobby}; DROP ROLE {alice}; CREATE ROLE {alice};"
        ))
        .unwrap();
    let restored = std::process::Command::new(format!("{}/pg_restore", bindir()))
        .args(["-h", &c.host, "-p", &port, "-U", &c.user])
        .args(["--exit-on-error", "-d", &again])
        .arg(&dump)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&dump);
    assert!(restored.status.success(), "{restored:?}");
    let mut client = cluster().connect(&again);
    assert_eq!(seen_by(&mut client, &bobby), (vec![], vec![]));
    assert_eq!(
        seen_by(&mut client, &alice),
        (
            vec!["asked by alice".to_string()],
            vec!["asked by alice".to_string()]
        )
    );
    // The owner's statement for rows that came in before 0.10.0 gives them by name too.
    client
        .batch_execute(&format!(
            "ALTER TABLE nl_history DISABLE TRIGGER nl_row_role;
             UPDATE nl_history SET role_id = '{bobby}'::regrole WHERE question = 'asked by bob';
             ALTER TABLE nl_history ENABLE ALWAYS TRIGGER nl_row_role;"
        ))
        .unwrap();
    assert_eq!(seen_by(&mut client, &bobby).0, ["asked by bob"]);
    client
        .batch_execute(
            "UPDATE nl_history SET role_id = coalesce(to_regrole(quote_ident(role))::oid, 0) \
             WHERE role_id <> 0",
        )
        .unwrap();
    assert_eq!(seen_by(&mut client, &bobby), (vec![], vec![]));
    drop(client);
    for drop in [
        format!("DROP DATABASE {original}"),
        format!("DROP DATABASE {again}"),
        format!("DROP ROLE {alice}"),
        format!("DROP ROLE {bobby}"),
    ] {
        admin.batch_execute(&drop).unwrap();
    }
}

/// The table's owner updating rows (a redaction, say) leaves each with the role that wrote it:
/// a role renamed since keeps its rows, and a new role under its old name reads none of them.
#[test]
fn an_owners_update_leaves_rows_with_the_role_that_wrote_them() {
    let pid = std::process::id();
    let (carol, renamed) = (format!("carol_{pid}"), format!("carol_old_{pid}"));
    let database = new_database("kept");
    let mut client = cluster().connect(&database);
    client
        .batch_execute(&format!(
            "CREATE EXTENSION sql_query_engine;
             CREATE ROLE {carol}; SET ROLE {carol};
             INSERT INTO nl_history (function, question, status, attempts, ms, llm_calls,
                                     prompt_tokens, completion_tokens)
                 VALUES ('nl_ask', 'asked by carol', 'ok', '[]', 1, 1, 1, 1);
             INSERT INTO nl_feedback (history_id, question, correct, status)
                 SELECT id, question, false, 'noted' FROM nl_history;
             RESET ROLE;
             ALTER ROLE {carol} RENAME TO {renamed}; CREATE ROLE {carol};
             UPDATE nl_history SET question = question || ' (redacted)';
             UPDATE nl_feedback SET question = question || ' (redacted)';"
        ))
        .unwrap();
    assert_eq!(
        seen_by(&mut client, &carol),
        (vec![], vec![]),
        "the new role of the old name reads the renamed role's rows"
    );
    let kept = vec!["asked by carol (redacted)".to_string()];
    assert_eq!(seen_by(&mut client, &renamed), (kept.clone(), kept));
}

/// An operator another role put in the extension's schema is never run by the install or
/// update script, which run as a superuser with that schema first on their search path: both
/// are refused (42501) while a role that is not a superuser may create there or owns functions
/// or operators there. The planted operators match the scripts' comparisons of an OID with a
/// regclass or a regrole more closely than pg_catalog's, and would make their owner a
/// superuser.
#[test]
fn install_and_update_refuse_a_schema_where_other_roles_can_plant_operators() {
    let planter = format!("planter_{}", std::process::id());
    let plant = |client: &mut postgres::Client| {
        client
            .batch_execute(&format!(
                "GRANT CREATE ON SCHEMA public TO {planter}; SET ROLE {planter}; {}
                 RESET ROLE;",
                planted(&planter)
            ))
            .unwrap();
    };
    let superuser = |client: &mut postgres::Client| is_superuser(client, &planter);
    let mut admin = cluster().connect("postgres");
    admin
        .batch_execute(&format!("CREATE ROLE {planter}"))
        .unwrap();

    let fresh = new_database("planted_install");
    let mut client = cluster().connect(&fresh);
    plant(&mut client);
    let refused = client
        .batch_execute("CREATE EXTENSION sql_query_engine")
        .unwrap_err();
    let (code, message, detail) = db_error(&refused);
    assert_eq!(code, "42501", "{message}");
    assert!(message.contains("not a superuser"), "{message}");
    assert!(detail.contains(&planter), "{detail}");
    assert!(
        !superuser(&mut client),
        "the install ran the planted operator"
    );
    // Without CREATE, the operators already there still refuse it.
    client
        .batch_execute(&format!("REVOKE CREATE ON SCHEMA public FROM {planter}"))
        .unwrap();
    let refused = client
        .batch_execute("CREATE EXTENSION sql_query_engine")
        .unwrap_err();
    let (code, _, detail) = db_error(&refused);
    assert_eq!(code, "42501");
    assert!(detail.contains("operator =(oid,regclass)"), "{detail}");
    assert!(!superuser(&mut client));

    // A role with a superuser's rights through membership (on PostgreSQL 16 and later
    // without being able to become it) may create in the superuser's schema, and is named.
    let dba = format!("dba_{}", std::process::id());
    let version: i32 = client
        .query_one("SELECT current_setting('server_version_num')::int4", &[])
        .unwrap()
        .get(0);
    let options = if version >= 160000 {
        " WITH INHERIT TRUE, SET FALSE"
    } else {
        ""
    };
    client
        .batch_execute(&format!(
            "DROP OPERATOR public.=(oid, regclass); DROP OPERATOR public.=(oid, regrole);
             DROP FUNCTION public.planted(oid, regclass); DROP FUNCTION public.planted(oid, regrole);
             CREATE ROLE {dba} SUPERUSER; CREATE SCHEMA held AUTHORIZATION {dba};
             GRANT {dba} TO {planter}{options};"
        ))
        .unwrap();
    let refused = client
        .batch_execute("CREATE EXTENSION sql_query_engine SCHEMA held")
        .unwrap_err();
    let (code, _, detail) = db_error(&refused);
    assert_eq!(code, "42501");
    assert!(detail.contains(&planter), "{detail}");

    let installed = new_database("planted_update");
    let mut client = cluster().connect(&installed);
    client
        .batch_execute("CREATE EXTENSION sql_query_engine VERSION '0.16.0'")
        .unwrap();
    plant(&mut client);
    let refused = client
        .batch_execute("ALTER EXTENSION sql_query_engine UPDATE")
        .unwrap_err();
    let (code, message, _) = db_error(&refused);
    assert_eq!(code, "42501", "{message}");
    assert!(
        !superuser(&mut client),
        "the update ran the planted operator"
    );
    let version: String = client
        .query_one(
            "SELECT extversion FROM pg_extension WHERE extname = 'sql_query_engine'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(version, "0.16.0");
}

/// Operators `=(oid, regclass)` and `=(oid, regrole)` in `public` that match the update's and
/// the old install's comparisons more closely than pg_catalog's, and make `planter` a
/// superuser when run as one (and, what no rollback undoes, draw a number of
/// `public.planted_ticks`, where there is one).
fn planted(planter: &str) -> String {
    let mut planted = String::new();
    for right in ["regclass", "regrole"] {
        planted.push_str(&format!(
            "CREATE FUNCTION public.planted(oid, {right}) RETURNS boolean LANGUAGE plpgsql AS $$
             BEGIN
                 IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles
                                WHERE rolname = '{planter}' AND rolsuper) THEN
                     EXECUTE 'ALTER ROLE {planter} SUPERUSER';
                 END IF;
                 IF pg_catalog.to_regclass('public.planted_ticks') IS NOT NULL THEN
                     PERFORM pg_catalog.nextval('public.planted_ticks');
                 END IF;
                 RETURN $1 OPERATOR(pg_catalog.=) $2::oid;
             END $$;
             CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = {right},
                                       FUNCTION = public.planted);"
        ));
    }
    planted
}

fn is_superuser(client: &mut postgres::Client, role: &str) -> bool {
    client
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = $1::text::name",
            &[&role],
        )
        .unwrap()
        .get(0)
}

/// An operator that another role created while it could still create in the schema, and
/// commits only once the update waits on a lock it holds, is never found by the update: after
/// the check an update script resolves names in pg_catalog alone. (The next script's check
/// then finds it and refuses the update, rolling back what ran; the operator's sequence shows
/// whether it ran, which no rollback undoes.)
#[test]
fn an_operator_committed_after_the_updates_check_is_never_found() {
    let planter = format!("late_planter_{}", std::process::id());
    cluster()
        .connect("postgres")
        .batch_execute(&format!("CREATE ROLE {planter} LOGIN"))
        .unwrap();
    let database = new_database("planted_late");
    let mut client = cluster().connect(&database);
    client
        .batch_execute(&format!(
            "CREATE EXTENSION sql_query_engine VERSION '0.16.0';
             GRANT CREATE ON SCHEMA public TO {planter};"
        ))
        .unwrap();
    let mut attacker = cluster().connect_as(&database, &planter);
    attacker
        .batch_execute(&format!(
            "CREATE SEQUENCE public.planted_ticks;
             BEGIN; {} SELECT FROM public.nl_sessions LIMIT 1;",
            planted(&planter)
        ))
        .unwrap();
    client
        .batch_execute(&format!(
            "SET lock_timeout = '10s'; REVOKE CREATE ON SCHEMA public FROM {planter};"
        ))
        .unwrap();
    let updating = {
        let database = database.clone();
        std::thread::spawn(move || {
            cluster()
                .connect(&database)
                .batch_execute("ALTER EXTENSION sql_query_engine UPDATE")
        })
    };
    let waiting = std::time::Instant::now();
    while client
        .query_one(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
             WHERE NOT l.granted AND c.relname = 'nl_sessions'",
            &[],
        )
        .unwrap()
        .get::<_, i64>(0)
        == 0
    {
        assert!(
            waiting.elapsed() < std::time::Duration::from_secs(20),
            "the update never waited on the lock"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    attacker.batch_execute("COMMIT").unwrap();
    let updated = updating.join().unwrap();
    if let Err(error) = &updated {
        assert_eq!(db_error(error).0, "42501", "{error}");
    }
    let ticked: bool = client
        .query_one("SELECT is_called FROM public.planted_ticks", &[])
        .unwrap()
        .get(0);
    assert!(
        !ticked,
        "the update ran the operator committed after its check"
    );
    assert!(!is_superuser(&mut client, &planter));
}
