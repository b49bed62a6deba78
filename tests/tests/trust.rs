//! The threat model, end to end, as the untrusted parties would try it: an unprivileged role
//! (its own login connection, or SET ROLE), a database owner who is not a superuser, and a
//! hostile model endpoint.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sql_query_engine_e2e::{
    backend_lingers, cluster, db_error, key_file, Reply, ScriptedLlm, Session,
};

/// Creates a login role that may read the fixture's customers.
fn reader(s: &mut Session, prefix: &str) -> String {
    let role = format!("{prefix}_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT SELECT ON customers, orders TO {role};"
        ))
        .unwrap();
    role
}

/// Points the test database at the session's model with `key`, at database level (what a
/// fresh connection of any role starts with).
fn configure_database(s: &mut Session, key: &str) -> String {
    let file = key_file(key);
    let db = s.database.clone();
    s.client
        .batch_execute(&format!(
            "ALTER DATABASE {db} SET sql_query_engine.llm_url = '{}';
             ALTER DATABASE {db} SET sql_query_engine.llm_api_key_file = '{file}';
             ALTER DATABASE {db} SET sql_query_engine.vote = off;",
            s.llm.url()
        ))
        .unwrap();
    file
}

#[test]
fn no_role_can_send_the_key_or_the_prompt_elsewhere() {
    let mut s = Session::new();
    let key = "sk-exfiltrate-0123456789";
    configure_database(&mut s, key);
    let role = reader(&mut s, "thief");
    let attacker = ScriptedLlm::start();
    attacker.on("how many customers", vec![Reply::sql("SELECT 1")]);
    s.llm.on(
        "how many customers",
        vec![Reply::sql("SELECT count(*) AS n FROM customers"); 2],
    );

    // A fresh connection: the library is not loaded yet, so the setting is a placeholder that
    // any role may set; when the library loads, the role's value is thrown away.
    let notices = Arc::new(Mutex::new(Vec::new()));
    let mut thief = cluster().connect_as_with_notices(&s.database, &role, Arc::clone(&notices));
    thief
        .batch_execute(&format!(
            "SET sql_query_engine.llm_url = '{}'",
            attacker.url()
        ))
        .unwrap();
    let n: String = thief
        .query_one("SELECT nl_query('how many customers')::text", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, r#"{"n": 4}"#);
    assert!(
        notices
            .lock()
            .unwrap()
            .iter()
            .any(|n| n.contains("permission denied to set parameter")),
        "{notices:?}"
    );

    // Once it is loaded, every way of pointing it elsewhere is refused.
    for attempt in [
        format!("SET sql_query_engine.llm_url = '{}'", attacker.url()),
        format!(
            "SELECT set_config('sql_query_engine.llm_url', '{}', false)",
            attacker.url()
        ),
        format!(
            "ALTER ROLE {role} SET sql_query_engine.llm_url = '{}'",
            attacker.url()
        ),
        "SET sql_query_engine.llm_api_key_file = '/etc/hostname'".into(),
        "SET sql_query_engine.llm_model = 'expensive-model'".into(),
        "SET sql_query_engine.redis_url = 'redis://127.0.0.1:1/0'".into(),
        "SET sql_query_engine.allowed_functions = 'extension:tablefunc'".into(),
        "SET sql_query_engine.max_response_bytes = '1GB'".into(),
        "SET sql_query_engine.history = off".into(),
        "SET sql_query_engine.audit_log = off".into(),
    ] {
        let error = thief.batch_execute(&attempt).unwrap_err();
        assert_eq!(db_error(&error).0, "42501", "{attempt}");
    }
    thief
        .query_one("SELECT nl_query('how many customers')::text", &[])
        .unwrap();
    assert!(attacker.requests().is_empty(), "the attacker was called");
    for request in s.llm.requests() {
        assert_eq!(
            request.headers.get("authorization").map(String::as_str),
            Some(&*format!("Bearer {key}")),
            "the key goes to the endpoint it was configured for"
        );
    }
}

#[test]
fn the_key_cannot_be_read_by_any_path() {
    let mut s = Session::new();
    let key = "sk-unreadable-9876543210";
    let file = configure_database(&mut s, key);
    let role = reader(&mut s, "reader");
    s.llm.on(
        "count orders",
        vec![
            Reply::sql(&format!("SELECT pg_read_file('{file}') AS k")),
            Reply::sql("SELECT count(*) AS n FROM orders"),
            Reply::sql("SELECT count(*) AS n FROM orders"),
        ],
    );

    // Storing a key as a setting is refused, without echoing it. (Checked where the library
    // is loaded: with shared_preload_libraries, always.) PostgreSQL itself logs the text of a
    // statement that fails, so a key typed into one is in the server log: another reason for
    // the file.
    s.client.batch_execute("LOAD 'sql_query_engine'").unwrap();
    let db = s.database.clone();
    let typed = "sk-typed-into-a-statement";
    for statement in [
        format!("ALTER DATABASE {db} SET sql_query_engine.llm_api_key = '{typed}'"),
        format!("ALTER ROLE {role} SET sql_query_engine.llm_api_key = '{typed}'"),
        format!("ALTER SYSTEM SET sql_query_engine.llm_api_key = '{typed}'"),
        format!("SET sql_query_engine.llm_api_key = '{typed}'"),
    ] {
        let error = s.client.batch_execute(&statement).unwrap_err();
        let (code, message, _) = db_error(&error);
        assert_eq!(code, "42501", "{statement}");
        assert!(
            !message.contains(typed) && message.contains("llm_api_key_file"),
            "{message}"
        );
    }

    // Nor is a URL with credentials stored where every role reads it (pg_db_role_setting).
    let secret = "pw-in-a-url-0001";
    for statement in [
        format!("ALTER DATABASE {db} SET sql_query_engine.redis_url = 'redis://:{secret}@127.0.0.1:1/0'"),
        format!("ALTER ROLE {role} SET sql_query_engine.llm_url = 'http://127.0.0.1:1/v1?key={secret}'"),
        format!("ALTER DATABASE {db} SET sql_query_engine.llm_fallbacks = 'http://a/v1, http://u:{secret}@b/v1'"),
        // As the clients read them: the URL parser drops a tab, a socket's password is a query.
        format!("ALTER DATABASE {db} SET sql_query_engine.redis_url = E'redis://default\\t:{secret}@127.0.0.1:1/0'"),
        format!("ALTER DATABASE {db} SET sql_query_engine.redis_url = 'unix:/run/redis.sock?pass={secret}'"),
    ] {
        let error = s.client.batch_execute(&statement).unwrap_err();
        let (code, message, _) = db_error(&error);
        assert_eq!(code, "42501", "{statement}");
        assert!(!message.contains(secret) && message.contains("pg_db_role_setting"), "{message}");
    }
    s.client
        .batch_execute(&format!(
            "SET sql_query_engine.redis_url = 'redis://:{secret}@127.0.0.1:1/0'; RESET sql_query_engine.redis_url;"
        ))
        .unwrap();

    let mut other = cluster().connect_as(&s.database, &role);
    let first_look: Vec<String> = [
        "sql_query_engine.llm_api_key",
        "sql_query_engine.llm_api_key_file",
    ]
    .iter()
    .map(|name| {
        other
            .query_one("SELECT coalesce(current_setting($1, true), '')", &[name])
            .map(|r| r.get::<_, String>(0))
            .unwrap_or_default()
    })
    .collect();
    let rows = other
        .query("SELECT nl_query('count orders')::text", &[])
        .unwrap();
    assert_eq!(rows.len(), 1);
    let mut seen: Vec<String> = first_look;
    for sql in [
        "SELECT coalesce(string_agg(setting, ','), '') FROM pg_settings WHERE name LIKE 'sql_query_engine.%'",
        "SELECT coalesce(string_agg(array_to_string(setconfig, ','), ';'), '') FROM pg_db_role_setting",
        "SELECT coalesce(string_agg(attempts::text || coalesce(sql, ''), ';'), '') FROM nl_history",
        "SELECT nl_trace('count orders')::text",
    ] {
        seen.push(other.query_one(sql, &[]).unwrap().get(0));
    }
    for sql in [
        "SHOW sql_query_engine.llm_api_key",
        &format!("SELECT pg_read_file('{file}')"),
        "SELECT * FROM pg_file_settings",
    ] {
        let error = other.batch_execute(sql).unwrap_err();
        assert_eq!(db_error(&error).0, "42501", "{sql}");
    }
    for text in &seen {
        assert!(
            !text.contains(key) && !text.contains(typed),
            "a key was readable: {text}"
        );
    }
    for request in s.llm.requests() {
        assert!(
            !request.body.to_string().contains(key),
            "the key reached the prompt"
        );
    }
    if let Some(log) = cluster().server_log() {
        assert!(!log.contains(key), "the key is in the server log");
    }
}

/// Each `(setup, attack)`: functions that run SQL given as text, through nl_check and through
/// nl_query, as a role that is not a superuser. None may leave a lock behind.
#[test]
fn functions_that_run_sql_text_are_refused_and_leave_no_lock() {
    let mut s = Session::new();
    s.client
        .batch_execute("CREATE EXTENSION tablefunc; SET sql_query_engine.max_repairs = 0;")
        .unwrap();
    let xml2 = s.client.batch_execute("CREATE EXTENSION xml2").is_ok();
    let role = reader(&mut s, "crosser");
    s.client.batch_execute(&format!("SET ROLE {role}")).unwrap();
    let mut attacks = vec![
        "SELECT * FROM crosstab('SELECT pg_advisory_lock(42)::text, 1::text, 1::text') AS t(a text, b text)",
        "SELECT * FROM connectby('(SELECT pg_advisory_lock(43)) s(a)', 'a', 'a', '1', 0) AS t(k text, p text, l int)",
        "SELECT * FROM crosstab2('SELECT pg_advisory_lock(44)::text, 1::text, 1::text')",
    ];
    if xml2 {
        attacks.push(
            "SELECT * FROM xpath_table('a', 'b', '(SELECT pg_advisory_lock(45)) s(a, b)', '/x', 'true') AS t(a text, b text)",
        );
    }
    for (i, attack) in attacks.iter().enumerate() {
        let error = s
            .client
            .execute("SELECT nl_check($1)", &[attack])
            .unwrap_err();
        let (code, message, _) = db_error(&error);
        assert_eq!(code, "42501", "{attack}");
        assert!(
            message.contains("runs SQL given as text")
                && message.contains("sql_query_engine.allowed_functions"),
            "the refusal names the function and the setting: {message}"
        );
        let question = format!("attack number {i}");
        s.llm.on(&question, vec![Reply::sql(attack)]);
        let error = s.query(&question).unwrap_err();
        assert_eq!(db_error(&error).0, "42501", "{attack}");
    }
    assert_eq!(
        s.scalar_i64("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"),
        0,
        "an advisory lock survived"
    );
}

#[test]
fn a_database_owners_trojans_never_run_in_the_extensions_own_sql() {
    let mut s = Session::with_extension_in("nl");
    let owner = format!("owner_{}", s.database);
    let db = s.database.clone();
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {owner} LOGIN; ALTER DATABASE {db} OWNER TO {owner};"
        ))
        .unwrap();
    // The owner plants functions that match the extension's calls better than the built-ins
    // do, and puts them first on everybody's search path.
    let mut planted = cluster().connect_as(&db, &owner);
    planted
        .batch_execute(&format!(
            "CREATE TABLE public.trojan_log (who text, what text);
             GRANT INSERT, SELECT ON public.trojan_log TO PUBLIC;
             CREATE FUNCTION public.nextval(text) RETURNS bigint LANGUAGE plpgsql AS
                 $$ BEGIN INSERT INTO public.trojan_log VALUES (current_user, 'nextval'); RETURN 1; END $$;
             CREATE FUNCTION public.quote_ident(name) RETURNS text LANGUAGE plpgsql AS
                 $$ BEGIN INSERT INTO public.trojan_log VALUES (current_user, 'quote_ident'); RETURN $1; END $$;
             CREATE FUNCTION public.format_type(oid, integer) RETURNS text LANGUAGE plpgsql AS
                 $$ BEGIN INSERT INTO public.trojan_log VALUES (current_user, 'format_type'); RETURN 'int'; END $$;
             CREATE FUNCTION public.pg_current_xact_id() RETURNS xid8 LANGUAGE plpgsql AS
                 $$ BEGIN INSERT INTO public.trojan_log VALUES (current_user, 'xact'); RETURN '1'; END $$;
             CREATE FUNCTION public.lower(varchar) RETURNS text LANGUAGE plpgsql AS
                 $$ BEGIN INSERT INTO public.trojan_log VALUES (current_user, 'lower'); RETURN $1; END $$;
             ALTER DATABASE {db} SET search_path = public, nl, pg_catalog;"
        ))
        .unwrap();
    // A superuser, in a new connection with the owner's search path, does DDL and asks.
    let mut admin = cluster().connect(&db);
    admin
        .batch_execute(&format!(
            "SET sql_query_engine.llm_url = '{}';
             CREATE TABLE public.new_table (id int);
             COMMENT ON TABLE public.new_table IS 'fresh';
             COMMENT ON COLUMN customers.name IS 'full name';
             DROP TABLE public.new_table;",
            s.llm.url()
        ))
        .unwrap();
    s.llm.on(
        "names in lower case",
        vec![Reply::sql("SELECT name FROM customers ORDER BY name")],
    );
    let schema: String = admin.query_one("SELECT nl_schema()", &[]).unwrap().get(0);
    assert!(schema.contains("full name"), "{schema}");
    admin
        .query("SELECT nl_query('names in lower case')", &[])
        .unwrap();
    admin
        .batch_execute("SELECT nl_example_add('any customers?', 'SELECT count(*) FROM customers')")
        .unwrap();
    let ran: i64 = admin
        .query_one("SELECT count(*) FROM public.trojan_log", &[])
        .unwrap()
        .get(0);
    assert_eq!(ran, 0, "a trojan ran inside the extension's own SQL");
}

/// The extension finds its tables by its schema's name, and counts comments with the
/// installing superuser's rights: the schema's owner could rename it and put tables of its own,
/// with triggers, in their place. So it is never installed in a schema another role owns
/// (`public` of a database a role that is not a superuser owns), its schema is never renamed,
/// and if a superuser gives its schema away later (and renames it with event triggers off),
/// nothing writes there with the superuser's rights and its functions refuse to work.
#[test]
fn only_a_schema_a_superuser_owns_holds_the_extension() {
    let s = Session::with_extension_in("nl");
    let db = s.database.clone();
    let owner = format!("owner_{db}");
    let mut admin = cluster().connect(&db);
    admin
        .batch_execute(&format!(
            "CREATE ROLE {owner} LOGIN; ALTER DATABASE {db} OWNER TO {owner};
             CREATE TABLE public.witness (who name);
             GRANT INSERT, SELECT ON public.witness TO PUBLIC;"
        ))
        .unwrap();
    // public is now the owner's (pg_database_owner): the extension is not installed there.
    let elsewhere = format!("{db}_public");
    cluster()
        .connect("postgres")
        .batch_execute(&format!("CREATE DATABASE {elsewhere} OWNER {owner}"))
        .unwrap();
    let refused = cluster()
        .connect(&elsewhere)
        .batch_execute("CREATE EXTENSION sql_query_engine")
        .unwrap_err();
    let (code, message, _) = db_error(&refused);
    assert_eq!(code, "42501", "{message}");
    assert!(message.contains("not a superuser"), "{message}");
    // In a schema a superuser owns it works for the database's owner too.
    let mut planted = cluster().connect_as(&db, &owner);
    let schema: String = planted.query_one("SELECT nl_schema()", &[]).unwrap().get(0);
    assert!(schema.contains("CREATE TABLE witness"), "{schema}");
    // A superuser gives the schema away. Its new owner may not rename it, nor may a superuser:
    // the extension's SQL names it.
    admin
        .batch_execute(&format!("ALTER SCHEMA nl OWNER TO {owner}"))
        .unwrap();
    for who in [&mut planted, &mut admin] {
        let refused = who
            .batch_execute("ALTER SCHEMA nl RENAME TO nl_moved")
            .unwrap_err();
        let (code, message, _) = db_error(&refused);
        assert_eq!(code, "55000", "{message}");
        assert!(message.contains("cannot be renamed"), "{message}");
    }
    // A superuser renames it all the same, with event triggers off; the new owner swaps in
    // tables of its own.
    admin
        .batch_execute(
            "ALTER EVENT TRIGGER nl_schema_kept DISABLE; ALTER SCHEMA nl RENAME TO nl_moved;
             ALTER EVENT TRIGGER nl_schema_kept ENABLE ALWAYS;",
        )
        .unwrap();
    planted
        .batch_execute(
            "CREATE SCHEMA nl;
             CREATE FUNCTION nl.nl_relations_commented(oid[]) RETURNS void LANGUAGE plpgsql AS
                 $$ BEGIN INSERT INTO public.witness VALUES (current_user); END $$;
             CREATE TABLE nl.nl_history (LIKE nl_moved.nl_history);
             CREATE FUNCTION nl.witness() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN INSERT INTO public.witness VALUES (current_user); RETURN NEW; END $$;
             CREATE TRIGGER witness BEFORE INSERT ON nl.nl_history
                 FOR EACH ROW EXECUTE FUNCTION nl.witness();
             CREATE TABLE public.t (id int); COMMENT ON TABLE public.t IS 'noted';",
        )
        .unwrap();
    let moved = planted
        .query_one("SELECT nl_moved.nl_schema()", &[])
        .unwrap_err();
    let (code, message, _) = db_error(&moved);
    assert_eq!(code, "55000", "{message}");
    assert!(message.contains("not a superuser"), "{message}");
    // A superuser's question, and comments in its own session, write nothing there either.
    admin
        .batch_execute("COMMENT ON TABLE public.t IS 'noted again'")
        .unwrap();
    let asked = admin.query_one("SELECT nl_moved.nl_schema()", &[]);
    assert!(asked.is_err());
    let ran: Vec<String> = admin
        .query("SELECT who::text FROM public.witness", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ran, Vec::<String>::new(), "the owner's trigger ran");
    let superuser: bool = admin
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = $1",
            &[&owner],
        )
        .unwrap()
        .get(0);
    assert!(!superuser);
}

/// Answers that no parser likes: unclosed braces, fences and think tags, megabytes of them.
fn hostile_answer(bytes: usize) -> String {
    let unit = "{\"a\": {\"sql\" ```sql {{ <think> [[\"\\ ";
    unit.repeat(bytes / unit.len())
}

#[test]
fn a_huge_model_answer_is_bounded_and_cancel_lands() {
    let mut s = Session::new();
    // By default the response is cut at 1 MiB and the call ends at once.
    s.llm
        .on("huge one", vec![Reply::Content(hostile_answer(6 << 20))]);
    let started = Instant::now();
    let error = s.query("huge one").unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "58000");
    assert!(message.contains("max_response_bytes"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(15));

    // Let it through: parsing is linear, and the caller's statement_timeout still lands.
    s.client
        .batch_execute(
            "SET sql_query_engine.max_response_bytes = '64MB';
             SET sql_query_engine.max_repairs = 20; SET statement_timeout = '3s';",
        )
        .unwrap();
    s.llm.on(
        "huge again",
        (0..21)
            .map(|_| Reply::Content(hostile_answer(6 << 20)))
            .collect(),
    );
    let started = Instant::now();
    let error = s.query("huge again").unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        ["57014", "42601"].contains(&db_error(&error).0.as_str()),
        "{error}"
    );
    s.client.batch_execute("RESET statement_timeout").unwrap();

    // And pg_terminate_backend ends the backend, alone, within a second.
    let mut other = cluster().connect(&s.database);
    let started_at: String = other
        .query_one("SELECT pg_postmaster_start_time()::text", &[])
        .unwrap()
        .get(0);
    let pid: i32 = s
        .client
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    s.llm.on(
        "huge forever",
        (0..21)
            .map(|_| Reply::Content(hostile_answer(6 << 20)))
            .collect(),
    );
    let killer = s.signal_after("pg_terminate_backend", Duration::from_millis(1000));
    let error = s.query("huge forever").unwrap_err();
    let ended = Instant::now();
    let signalled = killer.join().unwrap();
    assert!(ended.duration_since(signalled) < Duration::from_secs(10));
    if let Some(db) = error.as_db_error() {
        assert_eq!(db.code().code(), "57P01");
    }
    assert!(
        !backend_lingers(&mut other, pid),
        "the terminated backend is gone"
    );
    let now: String = other
        .query_one("SELECT pg_postmaster_start_time()::text", &[])
        .unwrap()
        .get(0);
    assert_eq!(now, started_at, "the postmaster did not restart");
}

#[test]
fn a_failed_repair_call_keeps_the_earlier_answer() {
    let notices = Arc::new(Mutex::new(Vec::new()));
    let mut s = Session::with_notices(Arc::clone(&notices));
    s.client
        .batch_execute("SET sql_query_engine.llm_timeout = 1000")
        .unwrap();
    let mut replies = vec![Reply::sql(
        "SELECT name FROM customers WHERE country = 'XX'",
    )];
    replies.extend((0..20).map(|_| Reply::Status(503, "overloaded".into())));
    s.llm.on("customers from nowhere", replies);
    let rows = s.query("customers from nowhere").unwrap();
    assert!(rows.is_empty(), "the empty first answer stands");
    assert!(
        notices
            .lock()
            .unwrap()
            .iter()
            .any(|n| n.starts_with("WARNING") && n.contains("HTTP 503")),
        "{notices:?}"
    );

    // with nothing to show, the model's failure is the error
    let mut replies = vec![Reply::sql("SELECT nope FROM customers")];
    replies.extend((0..20).map(|_| Reply::Status(503, "overloaded".into())));
    s.llm.on("broken and down", replies);
    let error = s.query("broken and down").unwrap_err();
    assert_eq!(db_error(&error).0, "58000");
}

#[test]
fn with_sample_values_off_no_stored_value_reaches_the_model() {
    let mut s = Session::new();
    s.client
        .batch_execute("SET sql_query_engine.sample_values = 0")
        .unwrap();
    s.llm.on(
        "ids of the first customer",
        vec![
            Reply::sql("SELECT customer_id FROM customers WHERE customer_id = (SELECT name::int FROM customers ORDER BY 1 LIMIT 1)"),
            Reply::sql("SELECT ('{\"a\": ' || name || '}')::json FROM customers"),
            Reply::sql("SELECT min(customer_id) AS id FROM customers"),
        ],
    );
    let trace = s.trace("ids of the first customer").unwrap();
    assert_eq!(trace["status"], "ok");
    // the caller sees what PostgreSQL said; the model does not
    assert!(trace["attempts"][0]["message"]
        .as_str()
        .unwrap()
        .contains("\"Ada\""));
    for request in s.llm.requests() {
        let text = request.text();
        for value in ["Ada", "Bruno", "Chiara", "Dmitri", "do not show"] {
            assert!(!text.contains(value), "{value} reached the model:\n{text}");
        }
    }
    let repair = s.llm.requests()[1].last_message();
    assert!(
        repair.contains("the query failed while it ran") && !repair.contains("22P02"),
        "{repair}"
    );
    // A model that writes queries whose error is the data's choice (a stored name before or
    // after 'B' decides between a division by zero and a logarithm of zero) learns nothing
    // from which error comes back: both are told alike.
    s.llm.on(
        "probe the first name",
        vec![
            Reply::sql(
                "SELECT CASE WHEN (SELECT min(name) FROM customers) < 'B' \
                 THEN 1 / (customer_id - customer_id) ELSE ln(customer_id - customer_id)::int END \
                 AS n FROM customers",
            ),
            Reply::sql(
                "SELECT CASE WHEN (SELECT min(name) FROM customers) < 'B' \
                 THEN ln(customer_id - customer_id)::int ELSE 1 / (customer_id - customer_id) END \
                 AS n FROM customers",
            ),
            Reply::sql("SELECT min(customer_id) AS id FROM customers"),
        ],
    );
    let before = s.llm.requests().len();
    let trace = s.trace("probe the first name").unwrap();
    // the caller sees the two errors apart
    assert_eq!(trace["attempts"][0]["sqlstate"], "22012", "{trace}");
    assert_eq!(trace["attempts"][1]["sqlstate"], "2201E", "{trace}");
    let told: Vec<String> = s.llm.requests()[before + 1..before + 3]
        .iter()
        .map(|r| {
            r.last_message()
                .lines()
                .filter(|l| l.starts_with("ERROR") || l.starts_with("The error is near"))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect();
    assert_eq!(told[0], told[1], "the model could tell the errors apart");
    // Nor how many rows an answer had, which a query can make a stored value (here the length
    // of the first name, 3): the doubted sum of identifiers is repaired, and the repair shows
    // the earlier attempt's result.
    s.llm.on(
        "count by the first name",
        vec![
            Reply::sql(
                "SELECT customer_id, sum(customer_id) AS s FROM customers \
                 WHERE customer_id <= (SELECT length(min(name)) FROM customers) \
                 GROUP BY customer_id",
            ),
            Reply::sql("SELECT nme FROM customers"),
            Reply::sql("SELECT count(*) AS n FROM customers"),
        ],
    );
    let before = s.llm.requests().len();
    let trace = s.trace("count by the first name").unwrap();
    assert_eq!(trace["attempts"][0]["row_count"], 3, "{trace}");
    // The third request sums up the attempts before it.
    let repair = s.llm.requests()[before + 2].last_message();
    assert!(repair.contains("Attempt 1:"), "{repair}");
    assert!(
        !repair.contains("3 rows"),
        "the model was told the count: {repair}"
    );
    assert!(
        !told[0].contains("22012") && !told[0].contains("division"),
        "{told:?}"
    );
}

#[test]
fn every_call_is_in_the_server_log_whatever_the_callers_transaction() {
    let mut s = Session::new();
    configure_database(&mut s, "sk-audit-0001");
    let role = reader(&mut s, "audited");
    s.llm.on(
        "delete the evidence",
        vec![Reply::sql("DELETE FROM orders")],
    );
    s.llm.on(
        "count them quietly",
        vec![Reply::sql("SELECT count(*) AS n FROM orders")],
    );
    s.llm.on(
        "count them and roll back",
        vec![Reply::sql("SELECT count(*) AS n FROM orders")],
    );
    let mut caller = cluster().connect_as(&s.database, &role);
    caller.batch_execute("BEGIN").unwrap();
    let error = caller
        .query("SELECT nl_query('delete the evidence')", &[])
        .unwrap_err();
    assert_eq!(db_error(&error).0, "25006");
    caller.batch_execute("ROLLBACK").unwrap();
    // Successful calls too: in a read-only transaction (no history row can be written) and in
    // one that is rolled back (the history row goes with it).
    caller
        .batch_execute(
            "BEGIN READ ONLY; SELECT nl_query('count them quietly'); COMMIT;
             BEGIN; SELECT nl_query('count them and roll back'); ROLLBACK;",
        )
        .unwrap();
    let history: i64 = caller
        .query_one("SELECT count(*) FROM nl_history", &[])
        .unwrap()
        .get(0);
    assert_eq!(history, 0, "no history row survives");
    // the role cannot hide it: the log setting is the superuser's
    let refused = caller
        .batch_execute("SET sql_query_engine.audit_log = off")
        .unwrap_err();
    assert_eq!(db_error(&refused).0, "42501");
    // A call that an ERROR ends (here the caller's statement timeout during the model's answer,
    // caught by the caller) is in the log too, with the query that ran before (its error went
    // to the model).
    s.llm.on(
        "wait and be cancelled",
        vec![
            Reply::sql("SELECT count(*) AS n FROM orders WHERE nme = 1"),
            Reply::Slow(
                std::time::Duration::from_secs(20),
                Box::new(Reply::sql("SELECT 1 AS one")),
            ),
        ],
    );
    caller
        .batch_execute(
            "SET statement_timeout = 2000;
             DO $$ BEGIN PERFORM * FROM nl_query('wait and be cancelled');
                   EXCEPTION WHEN query_canceled THEN NULL; END $$;
             RESET statement_timeout;",
        )
        .unwrap();
    // A call whose backend is ended (pg_terminate_backend, by another session of the same
    // role: a FATAL error, which no catch sees) is in the log too.
    s.llm.on(
        "wait and be ended",
        vec![Reply::Slow(
            std::time::Duration::from_secs(20),
            Box::new(Reply::sql("SELECT 1 AS one")),
        )],
    );
    let mut ended = cluster().connect_as(&s.database, &role);
    let pid: i32 = ended
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    let asking =
        std::thread::spawn(move || ended.query("SELECT nl_query('wait and be ended')", &[]));
    let waiting = std::time::Instant::now();
    while s
        .llm
        .requests()
        .iter()
        .all(|r| !r.text().contains("wait and be ended"))
    {
        assert!(
            waiting.elapsed() < std::time::Duration::from_secs(20),
            "the model was not asked"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    caller
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .unwrap();
    assert!(asking.join().unwrap().is_err());
    // A session reset (it deletes the caller's turns) is in the log too; under SET ROLE the
    // line names the session user as well.
    caller
        .batch_execute("SELECT nl_session_reset('forget me')")
        .unwrap();
    s.client
        .batch_execute(&format!(
            "SET ROLE {role}; SELECT nl_session_reset('forget as another'); RESET ROLE;"
        ))
        .unwrap();
    // A question may hold line breaks: it cannot write a line of its own into the record.
    let forging = "forge a line\nran 2: SELECT 'nothing to see'";
    s.llm.on(
        "forge a line",
        vec![Reply::sql("SELECT count(*) AS n FROM orders")],
    );
    caller
        .query("SELECT * FROM nl_query($1)", &[&forging])
        .unwrap();
    let Some(mut log) = cluster().server_log() else {
        return; // a cluster this process did not start: its log is not ours to read
    };
    while !log.contains("input: wait and be ended")
        && waiting.elapsed() < std::time::Duration::from_secs(30)
    {
        std::thread::sleep(std::time::Duration::from_millis(200));
        log = cluster().server_log().unwrap_or_default();
    }
    let oid: u32 = s
        .client
        .query_one("SELECT oid FROM pg_roles WHERE rolname = $1", &[&role])
        .unwrap()
        .get(0);
    let by = format!("sql_query_engine: nl_query by role \"{role}\" (oid {oid})");
    for (outcome, question) in [
        ("ERROR 25006", "delete the evidence"),
        ("ok, 1 rows, 1 attempt", "count them quietly"),
        ("ok, 1 rows, 1 attempt", "count them and roll back"),
        (
            "ERROR 57014: canceling statement due to statement timeout",
            "wait and be cancelled",
        ),
        ("the session ended during the call", "wait and be ended"),
        // Each call is in the log as it starts too: a backend that dies without exiting (a
        // PANIC, a signal) leaves at least this line.
        ("started", "wait and be ended"),
        ("started", "count them quietly"),
    ] {
        let line = format!("{by}: {outcome}");
        let asked = format!("input: {question}");
        assert!(
            log.lines()
                .collect::<Vec<_>>()
                .windows(2)
                .any(|w| w[0].contains(&line) && w[1].contains(&asked)),
            "not in the server log: {line} / {asked}"
        );
    }
    assert!(
        log.contains("ran 1: SELECT count(*) AS n FROM orders WHERE nme = 1"),
        "the query that ran is not in the server log"
    );
    assert!(
        log.contains("input: forge a line\\nran 2: SELECT 'nothing to see'"),
        "the question with a line break is not in the server log, escaped"
    );
    assert!(
        !log.lines()
            .any(|l| l.trim_start().starts_with("ran 2: SELECT 'nothing")),
        "a question wrote a line of its own into the audit record"
    );
    let line = format!("sql_query_engine: nl_session_reset by role \"{role}\" (oid {oid}): ok");
    assert!(
        log.lines()
            .collect::<Vec<_>>()
            .windows(2)
            .any(|w| w[0].contains(&line) && w[1].contains("input: forget me")),
        "not in the server log: {line}"
    );
    let session_user: String = s
        .client
        .query_one("SELECT session_user::text", &[])
        .unwrap()
        .get(0);
    let line = format!(
        "sql_query_engine: nl_session_reset by role \"{role}\" (oid {oid}) for session user \"{session_user}\""
    );
    assert!(
        log.lines()
            .collect::<Vec<_>>()
            .windows(2)
            .any(|w| w[0].contains(&line) && w[1].contains("input: forget as another")),
        "not in the server log: {line}"
    );
}

/// What nl_feedback and nl_fix run is in the audit line, also when the caller wrote the
/// history row it vouches for and rolls everything back, and when nl_fix is given a question.
#[test]
fn the_audit_names_the_sql_that_feedback_and_fix_run() {
    let mut s = Session::new();
    configure_database(&mut s, "sk-audit-0002");
    let role = reader(&mut s, "vouching");
    let mut caller = cluster().connect_as(&s.database, &role);
    caller
        .batch_execute(
            "BEGIN;
             INSERT INTO nl_history (function, question, sql, status, attempts, ms, llm_calls,
                                     prompt_tokens, completion_tokens)
             VALUES ('nl_ask', 'a forged answer', 'SELECT count(*) AS hidden_probe FROM orders',
                     'ok', '[]', 1, 0, 0, 0);
             SELECT nl_feedback(currval(pg_get_serial_sequence('nl_history', 'id')), true);
             ROLLBACK;",
        )
        .unwrap();
    s.llm.on(
        "count the orders for the fix",
        vec![Reply::sql("SELECT count(*) AS n FROM orders")],
    );
    caller
        .query_one(
            "SELECT nl_fix('SELECT count(*) AS fixed_probe FROM orderz', \
             'count the orders for the fix')",
            &[],
        )
        .unwrap_or_else(|e| panic!("{:?}", db_error(&e)));
    let Some(mut log) = cluster().server_log() else {
        return; // a cluster this process did not start: its log is not ours to read
    };
    let waiting = std::time::Instant::now();
    while !(log.contains("hidden_probe") && log.contains("fixed_probe"))
        && waiting.elapsed() < std::time::Duration::from_secs(30)
    {
        std::thread::sleep(std::time::Duration::from_millis(200));
        log = cluster().server_log().unwrap_or_default();
    }
    assert!(
        log.contains("runs: SELECT count(*) AS hidden_probe FROM orders"),
        "the SQL feedback ran is not in the log"
    );
    assert!(
        log.contains("given: SELECT count(*) AS fixed_probe FROM orderz"),
        "the SQL nl_fix was given is not in the log"
    );
}

/// A plan's estimates come from the statistics of every row of the relations it reads: a role
/// without SELECT on one is refused as the executor would refuse it, before a plan refused as
/// absurd names them (`nl_fix` of the role's own SQL, a binary search over a condition's
/// constant, read a column it may not read).
#[test]
fn a_plan_of_a_table_the_caller_may_not_read_tells_nothing_of_its_estimates() {
    let mut s = Session::new();
    configure_database(&mut s, "sk-plan-0001");
    s.client
        .batch_execute(
            "CREATE TABLE pay (id int, salary int);
             INSERT INTO pay SELECT g, g * 10 FROM generate_series(1, 20000) g;
             ANALYZE pay;",
        )
        .unwrap();
    let role = reader(&mut s, "estimates");
    let mut caller = cluster().connect_as(&s.database, &role);
    caller
        .batch_execute("SET sql_query_engine.max_repairs = 0")
        .unwrap();
    let error = caller
        .query_one(
            "SELECT nl_fix('SELECT 1 FROM pay a CROSS JOIN generate_series(1, 100000) g \
             WHERE a.salary < 50000')",
            &[],
        )
        .unwrap_err();
    let (code, message, detail) = db_error(&error);
    assert_eq!(code, "42501", "{message}");
    assert!(message.contains("permission denied"), "{message}");
    for said in [&message, &detail] {
        assert!(
            !said.contains("about"),
            "the plan's estimates were told: {said}"
        );
    }
    // Positive control: with SELECT on the table, the same plan is refused as absurd, its
    // estimates named.
    s.client
        .batch_execute(&format!("GRANT SELECT ON pay TO {role}"))
        .unwrap();
    let error = caller
        .query_one(
            "SELECT nl_fix('SELECT 1 FROM pay a CROSS JOIN generate_series(1, 100000) g \
             WHERE a.salary < 50000')",
            &[],
        )
        .unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "54000", "{message}");
    assert!(message.contains("about"), "{message}");
}

/// A call refused before it starts (a view name it may not create, a view that was never
/// saved, a row type that is not one, a cursor name too long, missing arguments, a call made
/// by code one of the extension's queries runs) is in the server log too, also when the
/// caller's code catches the ERROR (PostgreSQL then logs nothing of it) and with
/// `audit_log = errors`.
#[test]
fn a_call_refused_before_it_starts_is_in_the_server_log_whoever_catches_it() {
    let mut s = Session::new();
    configure_database(&mut s, "sk-audit-0004");
    let role = reader(&mut s, "early");
    let db = s.database.clone();
    s.client
        .batch_execute(&format!(
            "ALTER DATABASE {db} SET sql_query_engine.audit_log = errors;
             CREATE SCHEMA early_own AUTHORIZATION {role};"
        ))
        .unwrap();
    let mut caller = cluster().connect_as(&db, &role);
    // The caller's own view, whose code asks the model in the middle of the extension's query
    // and swallows the refusal.
    caller
        .batch_execute(
            "CREATE FUNCTION early_own.ask_inside() RETURNS text LANGUAGE plpgsql AS $$
             BEGIN
                 PERFORM pg_catalog.length(public.nl_generate('early asked from inside'));
                 RETURN 'answered';
             EXCEPTION WHEN OTHERS THEN RETURN 'swallowed';
             END $$;
             CREATE VIEW early_own.inside AS SELECT early_own.ask_inside() AS said;",
        )
        .unwrap();
    s.llm.on(
        "what the inside view says",
        vec![Reply::sql("SELECT said FROM early_own.inside")],
    );
    let said: serde_json::Value = caller
        .query_one("SELECT * FROM nl_query('what the inside view says')", &[])
        .unwrap()
        .get(0);
    assert_eq!(said["said"], "swallowed", "{said}");
    // Each refusal caught by the caller's own code.
    for call in [
        "PERFORM nl_view('early_missing_schema.v', 'early view question')",
        "PERFORM nl_view_refresh('early_never_saved')",
        "PERFORM * FROM nl_query_as('early shaped question', NULL::integer)",
        "PERFORM nl_cursor('early cursor question', pg_catalog.repeat('c', 70))",
        "PERFORM nl_feedback(NULL, true)",
    ] {
        caller
            .batch_execute(&format!(
                "DO $$ BEGIN {call}; RAISE EXCEPTION 'not refused'; \
                 EXCEPTION WHEN OTHERS THEN \
                     IF SQLERRM = 'not refused' THEN RAISE; END IF; \
                 END $$"
            ))
            .unwrap_or_else(|e| panic!("{call}: {e:?}"));
    }
    assert!(
        s.llm
            .requests()
            .iter()
            .all(|r| !r.text().contains("early") || r.text().contains("inside view")),
        "a refused call asked the model"
    );
    let Some(mut log) = cluster().server_log() else {
        return; // a cluster this process did not start: its log is not ours to read
    };
    let oid: u32 = s
        .client
        .query_one("SELECT oid FROM pg_roles WHERE rolname = $1", &[&role])
        .unwrap()
        .get(0);
    let by = |function: &str| {
        format!("sql_query_engine: {function} by role \"{role}\" (oid {oid}): ERROR ")
    };
    let expected = [
        (
            by("nl_generate") + "42501: nl_generate may not be called by code that a query",
            "input: early asked from inside",
        ),
        (
            by("nl_view"),
            "input: early view question\\nview: early_missing_schema.v",
        ),
        (by("nl_view_refresh"), "input: view: early_never_saved"),
        (by("nl_query_as"), "input: early shaped question"),
        (by("nl_cursor") + "42622", "input: early cursor question"),
        (
            by("nl_feedback") + "22004",
            "input: answer NULL, correct: true",
        ),
    ];
    let seen = |log: &str, (line, input): &(String, &str)| {
        log.lines()
            .collect::<Vec<_>>()
            .windows(2)
            .any(|w| w[0].contains(line.as_str()) && w[1].contains(input))
    };
    let waiting = Instant::now();
    while !expected.iter().all(|e| seen(&log, e)) && waiting.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(200));
        log = cluster().server_log().unwrap_or_default();
    }
    for e in &expected {
        assert!(seen(&log, e), "not in the server log: {} / {}", e.0, e.1);
    }
    // Refused before the audit starts: none of them has a line of what an enclosing call ran.
    assert!(
        !log.lines()
            .collect::<Vec<_>>()
            .windows(2)
            .any(|w| w[0].contains("input: early asked from inside")
                && w[1].trim_start().starts_with("ran ")),
        "the refused inner call was given the enclosing call's queries"
    );
}

/// With `audit_log = errors`, a call that answered is in the server log when no history row
/// keeps it: the caller rolled the row back (ROLLBACK, ROLLBACK TO SAVEPOINT), none was
/// written (a read-only transaction, nl_trace); or when its row does not say where its data
/// went (`nl_answer`'s rows described by a model); a committed row keeps it alone. Every line
/// of a call names the endpoints its model requests went to.
#[test]
fn with_audit_log_errors_a_call_whose_history_is_rolled_back_or_not_written_is_in_the_log() {
    let mut s = Session::new();
    configure_database(&mut s, "sk-audit-0003");
    let db = s.database.clone();
    s.client
        .batch_execute(&format!(
            "ALTER DATABASE {db} SET sql_query_engine.audit_log = errors"
        ))
        .unwrap();
    let role = reader(&mut s, "untraced");
    for n in 1..=5 {
        s.llm.on(
            &format!("untraced question {n}"),
            vec![Reply::sql(&format!("SELECT {n} AS n"))],
        );
    }
    s.llm.on(
        "untraced question 6",
        vec![Reply::sql("SELECT 6 AS n"), Reply::Content("Six.".into())],
    );
    let mut caller = cluster().connect_as(&s.database, &role);
    // Each a query string of its own: a string of several statements is one transaction.
    for statements in [
        "SELECT nl_answer('untraced question 6')",
        "SELECT * FROM nl_query('untraced question 1')",
        "BEGIN; SELECT * FROM nl_query('untraced question 2'); ROLLBACK",
        "BEGIN; SAVEPOINT s; SELECT * FROM nl_query('untraced question 3'); \
         ROLLBACK TO SAVEPOINT s; COMMIT",
        "BEGIN READ ONLY; SELECT * FROM nl_query('untraced question 4'); COMMIT",
        "SELECT nl_trace('untraced question 5')",
    ] {
        caller.batch_execute(statements).unwrap();
    }
    let Some(mut log) = cluster().server_log() else {
        return; // a cluster this process did not start: its log is not ours to read
    };
    let line = |log: &str, n: i32| {
        log.lines()
            .find(|l| {
                l.contains(&role) && l.contains(": ok, 1 rows") && {
                    let next = log[log.find(*l).unwrap_or(0)..]
                        .lines()
                        .nth(1)
                        .unwrap_or("");
                    next.contains(&format!("input: untraced question {n}"))
                }
            })
            .map(str::to_string)
    };
    let waiting = std::time::Instant::now();
    while (line(&log, 5).is_none() || line(&log, 6).is_none())
        && waiting.elapsed() < std::time::Duration::from_secs(30)
    {
        std::thread::sleep(std::time::Duration::from_millis(200));
        log = cluster().server_log().unwrap_or_default();
    }
    assert_eq!(line(&log, 1), None, "a call its history keeps was logged");
    for n in 2..=6 {
        let said = line(&log, n).unwrap_or_else(|| panic!("question {n} left no trace"));
        assert!(
            said.contains(&format!("model requests to {}", s.llm.url())),
            "{said}"
        );
        assert_eq!(
            said.contains("(its history row was rolled back)"),
            n == 2 || n == 3,
            "{said}"
        );
    }
}

/// With `audit_log = errors`, an answer whose requests went to a fallback endpoint is in the
/// log though its history row commits (the row does not say where the question went): also
/// when the primary, found failing, is skipped, so that only the fallback is asked.
#[test]
fn with_audit_log_errors_an_answer_a_fallback_gave_is_in_the_log() {
    let mut s = Session::new();
    let (dead, fallback) = (ScriptedLlm::start(), ScriptedLlm::start());
    dead.respond_with(|_| {
        Some(Reply::Status(
            500,
            r#"{"error":{"message":"internal error"}}"#.into(),
        ))
    });
    let db = s.database.clone();
    s.client
        .batch_execute(&format!(
            "ALTER DATABASE {db} SET sql_query_engine.llm_url = '{}';
             ALTER DATABASE {db} SET sql_query_engine.llm_fallbacks = '{}';
             ALTER DATABASE {db} SET sql_query_engine.vote = off;
             ALTER DATABASE {db} SET sql_query_engine.audit_log = errors;",
            dead.url(),
            fallback.url()
        ))
        .unwrap();
    let role = reader(&mut s, "fallen");
    for n in 1..=2 {
        fallback.on(
            &format!("fallen question {n}"),
            vec![Reply::sql(&format!("SELECT {n} AS n"))],
        );
    }
    let mut caller = cluster().connect_as(&s.database, &role);
    // The first finds the primary failing (its probe too: remembered); the second skips it.
    for n in 1..=2 {
        caller
            .batch_execute(&format!("SELECT * FROM nl_query('fallen question {n}')"))
            .unwrap();
    }
    let asked_dead = dead
        .requests()
        .iter()
        .filter(|r| r.text().contains("fallen question 2"))
        .count();
    assert_eq!(asked_dead, 0, "the failing primary was asked again");
    let Some(mut log) = cluster().server_log() else {
        return; // a cluster this process did not start: its log is not ours to read
    };
    let line = |log: &str, n: i32| {
        let lines: Vec<&str> = log.lines().collect();
        lines
            .windows(2)
            .find(|w| {
                w[0].contains(&role)
                    && w[0].contains(": ok, 1 rows")
                    && w[1].contains(&format!("input: fallen question {n}"))
            })
            .map(|w| w[0].to_string())
    };
    let waiting = std::time::Instant::now();
    while (line(&log, 1).is_none() || line(&log, 2).is_none())
        && waiting.elapsed() < std::time::Duration::from_secs(30)
    {
        std::thread::sleep(std::time::Duration::from_millis(200));
        log = cluster().server_log().unwrap_or_default();
    }
    for n in 1..=2 {
        let said = line(&log, n).unwrap_or_else(|| panic!("question {n} left no trace"));
        assert!(said.contains(&fallback.url()), "{said}");
    }
}

/// A schema whose name needs quotes holds the extension as any other: other schemas are
/// altered and renamed as usual, the extension's own is not renamed, and the extension works.
#[test]
fn a_schema_whose_name_needs_quotes_holds_the_extension() {
    let mut s = Session::with_extension_in("\"Nl Schema\"");
    s.client
        .batch_execute(
            "CREATE SCHEMA other; ALTER SCHEMA other RENAME TO other2;
             ALTER SCHEMA other2 OWNER TO CURRENT_USER;",
        )
        .unwrap();
    for quoting in ["off", "on"] {
        // quote_all_identifiers (which any role may set) changes how names are written, not
        // which schema is the extension's.
        s.client
            .batch_execute(&format!(
                "SET quote_all_identifiers = {quoting};
                 ALTER SCHEMA other2 RENAME TO other3; ALTER SCHEMA other3 RENAME TO other2;"
            ))
            .unwrap();
        let refused = s
            .client
            .batch_execute("ALTER SCHEMA \"Nl Schema\" RENAME TO plain")
            .unwrap_err();
        let (code, message, _) = db_error(&refused);
        assert_eq!(code, "55000", "{quoting}: {message}");
    }
    s.client
        .batch_execute("RESET quote_all_identifiers")
        .unwrap();
    // In a schema whose name needs no quotes, quote_all_identifiers writes it otherwise: other
    // schemas are still renamed, the extension's still not.
    let mut plain = Session::new();
    let schema: String = plain
        .client
        .query_one(
            "SELECT n.nspname::text FROM pg_extension e JOIN pg_namespace n
               ON n.oid = e.extnamespace WHERE e.extname = 'sql_query_engine'",
            &[],
        )
        .unwrap()
        .get(0);
    plain
        .client
        .batch_execute(
            "SET quote_all_identifiers = on;
             CREATE SCHEMA quoted_all; ALTER SCHEMA quoted_all RENAME TO quoted_all2;",
        )
        .unwrap();
    let refused = plain
        .client
        .batch_execute(&format!("ALTER SCHEMA {schema} RENAME TO moved"))
        .unwrap_err();
    assert_eq!(db_error(&refused).0, "55000", "{schema}");
    let schema: String = s
        .client
        .query_one("SELECT \"Nl Schema\".nl_schema()", &[])
        .unwrap()
        .get(0);
    assert!(schema.contains("CREATE TABLE customers"), "{schema}");
}

/// A database whose encoding is not UTF8 is refused at every call (0A000): what the model or an
/// endpoint sends is UTF-8, and passed on as the server's text it would hold byte sequences
/// the server's encoding does not allow (stored in the history, a dump could not restore it).
#[test]
fn a_database_that_is_not_utf8_is_refused() {
    let name = format!("sqe_latin1_{}", std::process::id());
    let mut admin = cluster().connect("postgres");
    for statement in [
        format!("DROP DATABASE IF EXISTS {name}"),
        format!(
            "CREATE DATABASE {name} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' \
             TEMPLATE template0"
        ),
    ] {
        admin.batch_execute(&statement).unwrap();
    }
    let mut latin1 = cluster().connect(&name);
    latin1
        .batch_execute("CREATE EXTENSION sql_query_engine")
        .unwrap();
    for call in [
        "SELECT nl_check('SELECT 1')",
        "SELECT * FROM nl_query('how many orders')",
    ] {
        let error = latin1.batch_execute(call).unwrap_err();
        let (code, message, _) = db_error(&error);
        assert_eq!(code, "0A000", "{call}: {message}");
        assert!(message.contains("UTF8"), "{message}");
    }
    drop(latin1);
    admin
        .batch_execute(&format!("DROP DATABASE {name}"))
        .unwrap();
}
