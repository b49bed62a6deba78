//! The guard and least privilege end to end: whatever a (prompt-injected) model proposes
//! through nl_query, nothing changes: no row, no sequence, no notification, no lock.

use std::time::{Duration, Instant};

use sql_query_engine_e2e::{cluster, db_error, Reply, Session};

/// Asks one question whose scripted answer is `sql`, without repairs, and returns the error's
/// SQLSTATE (or "ok").
fn propose(s: &mut Session, sql: &str) -> String {
    let question = format!("attack {}", s.llm.requests().len());
    s.llm.on(&question, vec![Reply::sql(sql)]);
    match s.query(&question) {
        Ok(_) => "ok".into(),
        Err(e) => db_error(&e).0,
    }
}

#[test]
fn attacks_through_nl_query_change_nothing() {
    let mut s = Session::new();
    s.client
        .batch_execute(
            "CREATE SEQUENCE audit_seq;
             CREATE TABLE audit (id int);
             CREATE FUNCTION write_audit() RETURNS int LANGUAGE plpgsql VOLATILE AS
                 $$ BEGIN INSERT INTO audit VALUES (1); RETURN 1; END $$;
             CREATE FUNCTION stable_wrapper() RETURNS int LANGUAGE plpgsql STABLE AS
                 $$ BEGIN RETURN write_audit(); END $$;
             SET sql_query_engine.max_repairs = 0;",
        )
        .unwrap();
    let mut listener = cluster().connect(&s.database);
    listener.batch_execute("LISTEN attack_channel").unwrap();

    let attacks = [
        ("DELETE FROM orders", "25006"),
        ("UPDATE customers SET name = 'x'", "25006"),
        (
            "WITH d AS (DELETE FROM orders RETURNING *) SELECT count(*) FROM d",
            "25006",
        ),
        ("SELECT 1; DROP TABLE orders", "25006"),
        ("TRUNCATE orders", "25006"),
        ("SELECT * INTO stolen FROM customers", "25006"),
        ("SET ROLE NONE", "25006"),
        ("NOTIFY attack_channel, 'x'", "25006"),
        ("SELECT nextval('audit_seq')", "42501"),
        ("SELECT setval('audit_seq', 99)", "42501"),
        ("SELECT pg_notify('attack_channel', 'payload')", "42501"),
        ("SELECT pg_advisory_lock(42)", "42501"),
        ("SELECT pg_try_advisory_lock(43) FROM orders", "42501"),
        ("SELECT * FROM orders FOR UPDATE", "42501"),
        (
            "SELECT current_setting('sql_query_engine.llm_api_key')",
            "42501",
        ),
        ("SELECT write_audit()", "42501"),
        ("SELECT stable_wrapper()", "42501"),
        ("SELECT * FROM pg_catalog.pg_authid", "42501"),
    ];
    for (sql, expected) in attacks {
        assert_eq!(propose(&mut s, sql), expected, "{sql}");
    }
    // Allowed by a superuser, a STABLE function is out of the guard's sight: the write inside
    // it is stopped by the read-only transaction.
    s.client
        .batch_execute("SET sql_query_engine.allowed_functions = 'public.stable_wrapper'")
        .unwrap();
    assert_eq!(propose(&mut s, "SELECT stable_wrapper()"), "25006");
    let started = Instant::now();
    assert_eq!(propose(&mut s, "SELECT pg_sleep(30)"), "42501");
    assert!(started.elapsed() < Duration::from_secs(5), "the sleep ran");

    assert_eq!(s.scalar_i64("SELECT count(*) FROM orders"), 6);
    assert_eq!(
        s.scalar_i64("SELECT count(*) FROM customers WHERE name = 'x'"),
        0
    );
    assert_eq!(s.scalar_i64("SELECT count(*) FROM audit"), 0);
    assert_eq!(
        s.scalar_i64("SELECT count(*) FROM pg_class WHERE relname = 'stolen'"),
        0
    );
    let called: bool = s
        .client
        .query_one("SELECT is_called FROM audit_seq", &[])
        .unwrap()
        .get(0);
    assert!(!called, "the sequence advanced");
    assert_eq!(
        s.scalar_i64("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"),
        0
    );
    listener.batch_execute("SELECT 1").unwrap();
    assert_eq!(
        listener.notifications().len(),
        0,
        "a notification was delivered"
    );
}

#[test]
fn a_refused_read_is_fed_back_and_catalog_questions_go_to_the_schema() {
    let mut s = Session::new();
    s.llm.on(
        "which tables are there?",
        vec![
            Reply::sql(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'",
            ),
            Reply::sql("VALUES ('customers'), ('orders')"),
        ],
    );
    let rows = s.query("which tables are there?").unwrap();
    assert_eq!(rows.len(), 2);
    let feedback = s.llm.requests()[1].last_message();
    assert!(feedback.contains("42501"), "{feedback}");
    assert!(feedback.contains("information_schema.tables"), "{feedback}");
    assert!(
        feedback.contains("answered from the schema shown"),
        "{feedback}"
    );
}

#[test]
fn an_rls_filtered_empty_result_is_told_apart_from_a_really_empty_one() {
    let mut s = Session::new();
    let role = format!("tenant_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE TABLE notes (owner text, body text);
             INSERT INTO notes VALUES ('somebody_else', 'hidden');
             ALTER TABLE notes ENABLE ROW LEVEL SECURITY;
             CREATE POLICY own_notes ON notes USING (owner = current_user);
             CREATE ROLE {role};
             GRANT SELECT ON notes, customers TO {role};"
        ))
        .unwrap();
    s.client.batch_execute(&format!("SET ROLE {role}")).unwrap();
    let sql = "SELECT body FROM notes";
    s.llm.on("my notes", vec![Reply::sql(sql), Reply::sql(sql)]);
    let trace = s.trace("my notes").unwrap();
    assert_eq!(trace["status"], "empty");
    assert_eq!(
        trace["attempts"][0]["row_security"],
        serde_json::json!(["notes"])
    );
    let feedback = s.llm.requests()[1].last_message();
    assert!(
        feedback.contains("row-level security filters the rows of notes"),
        "{feedback}"
    );

    // a table without row security that is really empty says nothing of the kind
    let plain = "SELECT name FROM customers WHERE country = 'ZZ'";
    s.llm
        .on("nobody", vec![Reply::sql(plain), Reply::sql(plain)]);
    let trace = s.trace("nobody").unwrap();
    assert!(trace["attempts"][0]["row_security"].is_null());
    assert!(!s.llm.requests()[3]
        .last_message()
        .contains("row-level security"));
}

#[test]
fn column_privileges_decide_what_the_model_sees() {
    let mut s = Session::new();
    let role = format!("narrow_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {role}; GRANT SELECT (customer_id, name) ON customers TO {role};
             SET sql_query_engine.max_repairs = 0; SET ROLE {role};"
        ))
        .unwrap();
    s.llm.on(
        "where do customers live?",
        vec![Reply::sql("SELECT name, country FROM customers")],
    );
    let error = s.query("where do customers live?").unwrap_err();
    let told = s.llm.requests()[0].text();
    assert!(told.contains("CREATE TABLE customers"), "{told}");
    assert!(told.contains("name text"));
    assert!(
        !told.contains("country"),
        "a column the role cannot read reached the model"
    );
    assert!(!told.contains("CREATE TABLE orders"));
    assert_eq!(db_error(&error).0, "42501");
}

#[test]
fn nl_check_is_callable_by_anyone() {
    let mut s = Session::new();
    let role = format!("checker_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT SELECT ON orders TO {role};"
        ))
        .unwrap();
    let mut anyone = cluster().connect_as(&s.database, &role);
    let me: String = anyone
        .query_one("SELECT current_user::text", &[])
        .unwrap()
        .get(0);
    assert_eq!(me, role, "checked as the unprivileged role itself");
    anyone
        .batch_execute("SELECT nl_check('SELECT count(*) FROM orders')")
        .unwrap();
    let error = anyone
        .batch_execute("SELECT nl_check('DELETE FROM orders')")
        .unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "25006");
    assert!(message.contains("DELETE"), "{message}");
    let error = anyone
        .batch_execute("SELECT nl_check('SELECT pg_sleep(1)')")
        .unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "42501");
    assert!(
        message.contains("pg_catalog.pg_sleep(double precision)"),
        "{message}"
    );
    assert_eq!(s.scalar_i64("SELECT count(*) FROM orders"), 6);
}

/// Asserts that the guard refuses `sql` for writing out values looked up in the catalog.
fn refused_as_looked_up(s: &mut Session, sql: &str) {
    let error = s
        .client
        .query_one("SELECT nl_check($1)", &[&sql])
        .unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "42501", "{sql}: {message}");
    assert!(
        message.contains("looked up in the catalog"),
        "{sql}: {message}"
    );
}

/// Values written by catalog look-ups (`regclass`, `aclitem`) inside an array are written out by
/// one call that checks no interrupt between them, each a catalog cache look-up that another
/// call may have made walk some 65,000 entries of OIDs that hash alike: millions of them kept
/// a backend deaf to cancel for minutes. Such an array the query builds, converts or writes
/// out is refused; one stored in a table is read, measured or taken apart, and collected with
/// at most 1,000 of them in a row.
#[test]
fn arrays_of_values_looked_up_in_the_catalog_are_not_written_out_in_bulk() {
    let mut s = Session::new();
    s.client
        .batch_execute(
            "CREATE TABLE public.looked (regs regclass[]);
             INSERT INTO public.looked VALUES ('{pg_class,pg_type}');
             CREATE TABLE public.many (regs regclass[]);
             INSERT INTO public.many SELECT array_agg(g::oid::regclass)
                 FROM generate_series(1, 2000) g;",
        )
        .unwrap();
    for sql in [
        "SELECT array_agg(g::oid::regclass) AS r FROM generate_series(1, 10) g",
        "SELECT array_to_string(regs, ',') AS r FROM looked",
        "SELECT regs::text AS r FROM looked",
        "SELECT regs::text[] AS r FROM looked",
        "SELECT to_jsonb(regs) AS r FROM looked",
        "SELECT ROW(regs)::text AS r FROM looked",
        "SELECT format('%s', regs) AS r FROM looked",
    ] {
        refused_as_looked_up(&mut s, sql);
    }
    // Read, measured, compared, taken apart, relabelled: nothing written out in bulk.
    for sql in [
        "SELECT regs, cardinality(regs) AS n, regs::oid[] AS oids FROM looked",
        "SELECT unnest(regs) AS r FROM looked",
        "SELECT 'pg_class'::regclass = ANY (regs) AS found FROM looked",
    ] {
        let rows: i64 = s
            .client
            .query_one("SELECT count(*) FROM nl_run($1)", &[&sql])
            .unwrap_or_else(|e| panic!("{sql}: {:?}", db_error(&e)))
            .get(0);
        assert!(rows >= 1, "{sql}");
    }
    // Records, whose fields the tree does not say, are not given to what writes them out
    // (a subquery's whole row, a row a column definition list types).
    s.client
        .batch_execute(
            "CREATE TABLE public.rows_of_class (a pg_class[]);
             DO $$ DECLARE r pg_class; BEGIN
                 SELECT * INTO r FROM pg_class WHERE oid = 'pg_class'::regclass;
                 r.relacl := (SELECT array_agg(makeaclitem(10::oid, 10::oid, 'SELECT', false))
                              FROM generate_series(1, 1200) g);
                 INSERT INTO public.rows_of_class VALUES (ARRAY[r]);
             END $$;
             CREATE TYPE public.class_range AS RANGE (subtype = regclass, subtype_opclass = oid_ops);
             CREATE TABLE public.ranged (r public.class_range[]);
             INSERT INTO public.ranged VALUES (ARRAY[public.class_range('pg_type', 'pg_class', '[]')]);",
        )
        .unwrap();
    for sql in [
        "SELECT to_jsonb(s) AS r FROM (SELECT regs FROM many) s",
        "SELECT s::text AS r FROM (SELECT regs FROM many) s",
        "SELECT x::text AS r FROM jsonb_to_record('{\"a\": [1, 2]}') AS x(a regclass[])",
        "SELECT to_jsonb(a) AS r FROM rows_of_class",
    ] {
        refused_as_looked_up(&mut s, sql);
    }
    // Collected rows count them at any depth, records' fields too: more than 1,000 in a row
    // are not collected.
    for sql in [
        "SELECT regs FROM many",
        "SELECT s FROM (SELECT regs FROM many) s",
        "SELECT array_agg(ROW(g::oid::regclass, g::oid::regclass)) AS r \
         FROM generate_series(1, 600) g",
        "SELECT a FROM rows_of_class",
        // (Ranges of them are not taken apart: refused whole. The range type's functions are
        // allowed here, as a superuser may.)
        "SELECT r FROM ranged",
    ] {
        if sql.contains("ranged") {
            s.client
                .batch_execute("SET sql_query_engine.allowed_functions = 'schema:public'")
                .unwrap();
        }
        let error = s
            .client
            .query_one("SELECT count(*) FROM nl_run($1)", &[&sql])
            .unwrap_err();
        let (code, message, _) = db_error(&error);
        assert_eq!(code, "54000", "{sql}: {message}");
        assert!(message.contains("more than 1000"), "{sql}: {message}");
    }
    // A record's descriptor the session shares with parallel workers (once a query of the
    // session ran in parallel) is read as one no one counts.
    let version: i32 = s
        .client
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .unwrap()
        .get(0);
    let parallel = if version >= 160000 {
        "debug_parallel_query"
    } else {
        "force_parallel_mode"
    };
    s.client
        .batch_execute(&format!(
            "SET {parallel} = on; SELECT count(*) FROM pg_class; RESET {parallel};"
        ))
        .unwrap();
    let rows: i64 = s
        .client
        .query_one(
            "SELECT count(*) FROM nl_run('SELECT (1, ''a'') AS r, (2, ''b'') AS q')",
            &[],
        )
        .unwrap_or_else(|e| panic!("{:?}", db_error(&e)))
        .get(0);
    assert_eq!(rows, 1);
}

/// Built-ins that run code of an object they are handed by name or OID as the query runs are
/// refused unless allowed by name: `satisfies_hash_partition` opens any partitioned table
/// (with no privilege check) and runs its key's hash functions, `to_regtype` and
/// `format_type` a named type's modifier functions; so is any value computed as the query runs
/// of a type that names code: `regtype` (its modifier function), `regconfig` (whose parser and
/// dictionaries a text search function runs), and arrays and records of them.
#[test]
fn functions_that_run_code_of_an_object_named_at_run_time_are_refused() {
    let mut s = Session::new();
    let role = format!("namer_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT SELECT ON orders TO {role};
             CREATE TABLE typed (t regtype); GRANT SELECT ON typed TO {role};
             CREATE TABLE private_parts (id int) PARTITION BY HASH (id);
             CREATE TABLE private_parts_0 PARTITION OF private_parts
                 FOR VALUES WITH (MODULUS 2, REMAINDER 0);"
        ))
        .unwrap();
    let mut role_client = cluster().connect_as(&s.database, &role);
    let hashed = "SELECT satisfies_hash_partition('private_parts'::regclass, 2, 0, o.order_id) \
                  AS p FROM orders o";
    for (sql, why) in [
        (hashed, "given by name or OID"),
        (
            "SELECT to_regtype('numeric(' || o.order_id || ')') AS t FROM orders o",
            "given by name or OID",
        ),
        (
            "SELECT format_type(o.order_id::oid, 3) AS t FROM orders o",
            "given by name or OID",
        ),
        (
            "SELECT ('numeric(' || o.order_id || ')')::regtype AS t FROM orders o",
            "computed as the query runs",
        ),
        (
            "SELECT to_tsvector(o.order_id::text::regconfig, 'x') AS t FROM orders o",
            "computed as the query runs",
        ),
        // The same, by any other path: a binary conversion, an array, a column definition list.
        (
            "SELECT to_tsvector(o.order_id::oid::regconfig, 'x') AS t FROM orders o",
            "computed as the query runs",
        ),
        (
            "SELECT to_tsvector(o.order_id::int8, 'x') AS t FROM orders o",
            "computed as the query runs",
        ),
        (
            "SELECT ('{\"numeric(' || o.order_id || ')\"}')::regtype[] AS t FROM orders o",
            "computed as the query runs",
        ),
        (
            "SELECT x.t FROM orders o, json_to_record(json_build_object('t', 'numeric(' || \
             o.order_id || ')')) AS x(t regtype)",
            "computed as the query runs",
        ),
        (
            "SELECT to_regprocedure('abs(numeric(' || o.order_id || '))') AS t FROM orders o",
            "given by name or OID",
        ),
        // A record of a type that holds one, filled from text by a function called by name.
        (
            "SELECT jsonb_populate_record(NULL::typed, jsonb_build_object('t', 'numeric(' || \
             o.order_id || ')')) AS r FROM orders o",
            "computed as the query runs",
        ),
        // A row type holding one given as a constant, or an anonymous row of one, is the
        // pattern such a function fills, whatever it returns.
        (
            "SELECT (jsonb_populate_record(ROW(NULL::regtype), jsonb_build_object('f1', \
             'numeric(' || o.order_id || ')'))) IS NOT NULL AS ok FROM orders o",
            "code out of the guard's sight",
        ),
        (
            "SELECT (jsonb_populate_record(s, jsonb_build_object('t', 'numeric(' || \
             o.order_id || ')'))) IS NOT NULL AS ok FROM orders o, (SELECT NULL::regtype AS t) s",
            "anonymous row",
        ),
        (
            "SELECT jsonb_populate_recordset(NULL::typed, jsonb_build_array(jsonb_build_object(\
             't', 'numeric(' || o.order_id || ')'))) IS NOT NULL AS ok FROM orders o",
            "names code",
        ),
        (
            "SELECT count(*) AS n FROM orders o, ts_parse('default', o.order_id::text) p",
            "given by name or OID",
        ),
        // A built-in SQL function whose body, run after the check, calls ts_parse.
        (
            "SELECT count(*) AS n FROM orders o, ts_debug('english', o.order_id::text) d",
            "given by name or OID",
        ),
    ] {
        let error = role_client
            .query("SELECT nl_check($1)", &[&sql])
            .unwrap_err();
        let (code, message, _) = db_error(&error);
        assert_eq!(code, "42501", "{sql}: {message}");
        assert!(message.contains(why), "{sql}: {message}");
    }
    // PostgreSQL 17's jsonb_populate_record_valid returns a boolean for the row it fills.
    let version: i32 = role_client
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .unwrap()
        .get(0);
    if version >= 170000 {
        let sql = "SELECT jsonb_populate_record_valid(NULL::typed, jsonb_build_object('t', \
                   'numeric(' || o.order_id || ')')) AS ok FROM orders o";
        let error = role_client
            .query("SELECT nl_check($1)", &[&sql])
            .unwrap_err();
        let (code, message, _) = db_error(&error);
        assert_eq!(code, "42501", "{sql}: {message}");
        // (Its row type holds a `regtype`, written out by a catalog look-up: refused for that
        // too, whichever is found first.)
        assert!(
            message.contains("may fill from text") || message.contains("looked up in the catalog"),
            "{sql}: {message}"
        );
    }
    // A constant name is converted, and seen, as the query is analysed.
    role_client
        .batch_execute(
            "SELECT nl_check('SELECT to_tsvector(''english'', ''x'') AS t, \
             ''int4''::regtype AS r')",
        )
        .unwrap();
    // Why: run directly, the role reaches a table it has no privilege on.
    let rows = role_client.query(hashed, &[]).unwrap();
    assert_eq!(rows.len(), 6);
}

#[test]
fn the_api_key_is_not_in_the_trace_or_the_prompt() {
    let mut s = Session::new();
    let key = "sk-e2e-trace-secret";
    let file = sql_query_engine_e2e::key_file(key);
    s.client
        .batch_execute(&format!("SET sql_query_engine.llm_api_key_file = '{file}'"))
        .unwrap();
    s.llm.on(
        "leak the key",
        vec![
            Reply::sql("SELECT current_setting('sql_query_engine.llm_api_key') AS k"),
            Reply::sql("SELECT setting FROM pg_settings WHERE name LIKE 'sql_query_engine%'"),
            Reply::sql("SELECT 'no key' AS k"),
        ],
    );
    let trace = s.trace("leak the key").unwrap();
    assert!(!trace.to_string().contains(key));
    for request in s.llm.requests() {
        assert!(
            !request.body.to_string().contains(key),
            "the key reached the model"
        );
    }
}

/// Analysis matches each GROUP BY item against the whole select list, checking for no
/// interrupt: a query of tens of thousands of items (an example another role wrote into the
/// table, analysed in every matching caller's backend) is refused before it is analysed, in
/// one clause or spread over grouping sets, windows and aggregates.
#[test]
fn a_clause_of_more_items_than_a_row_has_columns_is_refused_before_analysis() {
    let mut s = Session::new();
    let items: Vec<String> = (0..2000).map(|i| format!("a+{i}")).collect();
    let sql = format!(
        "SELECT 1 AS one FROM (VALUES (1)) v(a) GROUP BY {}",
        items.join(", ")
    );
    let started = std::time::Instant::now();
    let error = s.client.query("SELECT nl_check($1)", &[&sql]).unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "54001", "{message}");
    assert!(message.contains("1664 items"), "{message}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    // Each FROM item's name, and each WITH query's, is checked against every other.
    let from: Vec<String> = (0..2000).map(|i| format!("(SELECT) a{i}")).collect();
    let with: Vec<String> = (0..2000).map(|i| format!("w{i} AS (SELECT)")).collect();
    for sql in [
        format!("SELECT 1 AS one FROM {}", from.join(", ")),
        format!("WITH {} SELECT 1 AS one", with.join(", ")),
    ] {
        let error = s.client.query("SELECT nl_check($1)", &[&sql]).unwrap_err();
        let (code, message, _) = db_error(&error);
        assert_eq!(code, "54001", "{message}");
        assert!(message.contains("FROM list, WITH clause"), "{message}");
    }
    // The same matching, spread over lists no clause holds whole: a grouping set, a window's
    // PARTITION BY, an aggregate's ORDER BY, a named window, SQL/JSON's aggregates.
    let list = |n: usize| -> String {
        (0..n)
            .map(|i| format!("a+{i}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let version = s.scalar_i64("SELECT current_setting('server_version_num')::int8");
    let mut spread = vec![
        format!(
            "SELECT count(*) FROM (VALUES (1)) v(a) GROUP BY GROUPING SETS (({}))",
            list(5000)
        ),
        format!(
            "SELECT row_number() OVER (PARTITION BY {}) FROM (VALUES (1)) v(a)",
            list(5000)
        ),
        format!(
            "SELECT string_agg('x', ',' ORDER BY {}) FROM (VALUES (1)) v(a)",
            list(5000)
        ),
        format!(
            "SELECT count(*) OVER w FROM (VALUES (1)) v(a) WINDOW w AS (ORDER BY {})",
            list(5000)
        ),
        // Each within a clause's bound, too many together.
        format!(
            "SELECT {} FROM (VALUES (1)) v(a) GROUP BY {} ORDER BY {}",
            list(1600),
            list(1600),
            list(1600)
        ),
    ];
    // Stars expand before a list's length is checked: 400 of them over 1664 columns make a
    // DISTINCT of 665,600 entries.
    let wide: Vec<String> = (0..1664).map(|i| i.to_string()).collect();
    spread.push(format!(
        "SELECT DISTINCT {}v.* FROM (VALUES ({})) v",
        "v.*, ".repeat(399),
        wide.join(", ")
    ));
    if version >= 160000 {
        spread.push(format!(
            "SELECT JSON_ARRAYAGG(a ORDER BY {}) FROM (VALUES (1)) v(a)",
            list(5000)
        ));
    }
    for sql in spread {
        let started = std::time::Instant::now();
        let error = match s.client.query("SELECT nl_check($1)", &[&sql]) {
            Err(error) => error,
            Ok(_) => panic!("passed: {}", &sql[..80]),
        };
        let (code, message, _) = db_error(&error);
        assert_eq!(code, "54001", "{message}: {}", &sql[..80]);
        assert!(message.contains("together"), "{message}");
        assert!(message.contains("more than"), "{message}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }
    // A query of a usual size still passes, and so does a built-in TABLESAMPLE method.
    for sql in [
        "SELECT a FROM (VALUES (1)) v(a) GROUP BY a",
        "SELECT count(*) OVER (PARTITION BY a ORDER BY a) FROM (VALUES (1)) v(a)",
        "SELECT count(*) FROM orders TABLESAMPLE BERNOULLI (50) REPEATABLE (1)",
        "SELECT count(*) FROM orders TABLESAMPLE SYSTEM (50)",
        "WITH a AS (SELECT * FROM orders), b AS (SELECT * FROM a) \
         SELECT DISTINCT b.*, c.* FROM b JOIN customers c USING (customer_id) ORDER BY 1",
    ] {
        s.client
            .query("SELECT nl_check($1)", &[&sql])
            .unwrap_or_else(|e| panic!("{sql}: {:?}", db_error(&e)));
    }
}

/// Built-in calls whose work grows faster than what they are given, while PostgreSQL checks
/// for no cancel until they end, are made only in a shape that bounds it: a pattern, a set or
/// one side of a containment that is a small constant, a JSON path that reads the document
/// once; XPath only when a superuser names the function. Everyday uses pass.
#[test]
fn calls_that_could_run_deaf_to_cancel_are_refused_unless_their_shape_bounds_them() {
    let mut s = Session::new();
    let version = s.scalar_i64("SELECT current_setting('server_version_num')::int8");
    let long = "x".repeat(300);
    let mut refused = vec![
        "SELECT strpos(name, country) FROM customers".to_string(),
        // A LIKE pattern's `%` is tried at every place of the string.
        "SELECT count(*) FROM customers WHERE name LIKE '%' || country || '%'".to_string(),
        "SELECT name NOT ILIKE country FROM customers".to_string(),
        format!("SELECT count(*) FROM customers WHERE name LIKE '%{long}%'"),
        // A constant measured as written: 1e300 is stored in a few bytes, written in 301.
        "SELECT strpos(name, '' || 1e300) FROM customers".to_string(),
        "SELECT replace(name, concat(1e300), '') FROM customers".to_string(),
        format!("SELECT replace(name, '{long}', '') FROM customers"),
        "SELECT translate(name, repeat('b', 300), '') FROM customers".to_string(),
        "SELECT btrim(name, country) FROM customers".to_string(),
        "SELECT split_part(name, name, 1) FROM customers".to_string(),
        "SELECT count(*) FROM orders WHERE ARRAY[order_id] && ARRAY[customer_id]".to_string(),
        "SELECT jsonb_path_exists('[1, 2]', '$[*] ? (@ == $[0])')".to_string(),
        "SELECT '[1, 2]'::jsonb @? '$[*] ? (@ == $x)'".to_string(),
        "SELECT xpath('/a', '<a/>'::xml)".to_string(),
        "SELECT jsonb_path_exists('[1, 2]', '$ ? (@[*] != @[*])')".to_string(),
        r#"SELECT jsonb_path_exists('{"a": [1], "b": [2]}', '$ ? (@.a.abs() == @.b)')"#.to_string(),
        "SELECT d ?| k FROM (SELECT '{\"a\": 1}'::jsonb AS d, ARRAY['a'] AS k) s".to_string(),
        "SELECT count(*) FROM (SELECT '[1]'::jsonb AS d, '[2]'::jsonb AS e) s \
             WHERE d @> ANY (ARRAY[e])"
            .to_string(),
        format!(
            "SELECT count(*) FROM orders WHERE ARRAY[order_id] && ARRAY[ARRAY[{0}], ARRAY[{0}]]",
            (1..=40)
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        "SELECT * FROM xmltable('/r' PASSING ('<r/>'::xml) COLUMNS a int PATH 'a')".to_string(),
        // Deleting keys named by a computed array from a jsonb: every key against every key.
        "SELECT jsonb_build_object(name, 1) - ARRAY[name, country] FROM customers".to_string(),
        // Results whose size a number sets, not the inputs.
        "SELECT lpad(name, customer_id * 100000000, '*') FROM customers".to_string(),
        "SELECT rpad(name, 1000000000) FROM customers".to_string(),
        "SELECT format('%1000000000s', name) FROM customers".to_string(),
        "SELECT format('%-*s', customer_id, name) FROM customers".to_string(),
        "SELECT format(name, country) FROM customers".to_string(),
        "SELECT cardinality(array_fill(0, ARRAY[customer_id])) FROM customers".to_string(),
        "SELECT bpchar(name::bpchar, customer_id * 100000000, true) FROM customers".to_string(),
        "SELECT \"bit\"(customer_id, customer_id * 100000000) FROM customers".to_string(),
        // A constant is measured as the planner folds it, all its pieces together: two
        // pieces of 200 bytes are 400, and a length cast pads '0' to 300 characters.
        format!(
            "SELECT strpos(name, concat('{0}', '{0}')) FROM customers",
            "y".repeat(200)
        ),
        "SELECT strpos(name, concat('1', B'0'::bit(300))) FROM customers".to_string(),
        // jsonb writes a json number in all its digits: eight characters, 131,072 digits.
        "SELECT strpos(name, concat('', to_jsonb(json '1e131071'))) FROM customers".to_string(),
        "SELECT count(*) FROM customers WHERE name LIKE '%' || 1.5::float8::numeric || '%'"
            .to_string(),
        "SELECT normalize(name, NFD) FROM customers".to_string(),
        "SELECT ts_rank(to_tsvector('simple', name), to_tsquery('simple', 'ada')) \
             FROM customers"
            .to_string(),
        "SELECT npoints(polygon(customer_id * 10000000, circle(point(0, 0), 1))) FROM customers"
            .to_string(),
    ];
    if version >= 170000 {
        refused
            .push("SELECT JSON_EXISTS(jsonb '[1]', '$[*] ? (@ == $x)' PASSING 1 AS x)".to_string());
        refused.push(
            "SELECT * FROM JSON_TABLE(jsonb '[[1]]', '$[*]' COLUMNS (NESTED PATH '$[*] ? (@ == $[0])' \
             COLUMNS (a int PATH '$')))"
                .to_string(),
        );
    }
    for sql in &refused {
        let error = match s.client.query("SELECT nl_check($1)", &[sql]) {
            Err(error) => error,
            Ok(_) => panic!("passed: {sql}"),
        };
        let (code, message, _) = db_error(&error);
        assert_eq!(code, "42501", "{sql}: {message}");
        assert!(
            message.contains("cancel") || message.contains("constant"),
            "{sql}: {message}"
        );
    }
    let mut passed = vec![
        "SELECT count(*) FROM customers WHERE name LIKE '%Ada%' OR name NOT ILIKE 'b%' \
         OR country::char(2) LIKE 'D_' OR name LIKE '50!%%' ESCAPE '!' \
         OR name LIKE '%' || 2023 || '%'"
            .to_string(),
        "SELECT replace(name, 'a', 'b'), split_part(name, ' ', 1), position('x' in name), \
         btrim(name, ' '), trim(name), translate(name, 'ab', 'cd'), \
         string_to_array(name, ' ') FROM customers"
            .to_string(),
        "SELECT count(*) FROM orders WHERE ARRAY[order_id] <@ ARRAY[1, 2, 3]".to_string(),
        "SELECT jsonb_path_query_array('[1, 2]', '$[*] ? (@ > 1)')".to_string(),
        "SELECT strpos(lower(name), lower('abc')), replace(name, chr(10), ''), \
         position(lower('x') in lower(name)), split_part(name, ','::varchar(1), 1) \
         FROM customers"
            .to_string(),
        "SELECT count(*) FROM (SELECT '{\"k\": \"v\"}'::jsonb AS d) s \
         WHERE d @> jsonb_build_object('k', 'v')"
            .to_string(),
        "SELECT '{\"a\": [1]}'::jsonb @> '{\"a\": [1]}'".to_string(),
        "SELECT lpad(customer_id::text, 6, '0'), rpad(name, 10), \
         format('%s (%2$-10s) %1$I: 100%%', name, country), \
         jsonb_build_object(name, 1) - 'Ada', jsonb_build_object(name, 1) - ARRAY['a', 'b'], \
         jsonb_build_object(name, 1) - country, format(NULL, name), name::char(12), \
         customer_id::bit(8), lpad(name, 5::smallint), \
         ts_rank_cd(to_tsvector('simple', name), to_tsquery('simple', 'ada | bruno')), \
         npoints(polygon(12, circle(point(0, 0), 1))) FROM customers"
            .to_string(),
    ];
    if version >= 170000 {
        passed.push(
            "SELECT JSON_VALUE(jsonb '{\"a\": 1}', '$.a'), \
             JSON_EXISTS(jsonb '[1]', '$[*] ? (@ > 0)')"
                .to_string(),
        );
        passed.push(
            "SELECT * FROM JSON_TABLE(jsonb '[{\"a\": 1}]', '$[*]' COLUMNS (a int PATH '$.a'))"
                .to_string(),
        );
    }
    for sql in &passed {
        s.client
            .query("SELECT nl_check($1)", &[sql])
            .unwrap_or_else(|e| panic!("{sql}: {:?}", db_error(&e)));
    }
    // A superuser may allow XPath by name.
    s.client
        .batch_execute("SET sql_query_engine.allowed_functions = 'pg_catalog.xpath'")
        .unwrap();
    s.client
        .query(
            "SELECT nl_check('SELECT xpath(''/a'', ''<a/>''::xml)')",
            &[],
        )
        .unwrap_or_else(|e| panic!("{:?}", db_error(&e)));
    // An extension's function of LANGUAGE internal calls the built-in C function, which works
    // as the built-in does: citext's LIKE, allowed with the extension, is held to LIKE's rule.
    if s.client
        .batch_execute("CREATE EXTENSION IF NOT EXISTS citext")
        .is_ok()
    {
        s.client
            .batch_execute("SET sql_query_engine.allowed_functions = 'extension:citext'")
            .unwrap();
        let check = "SELECT nl_check($1)";
        let error = s
            .client
            .query(
                check,
                &[&"SELECT count(*) FROM customers WHERE name::citext LIKE country::citext"],
            )
            .unwrap_err();
        let (code, message, _) = db_error(&error);
        assert_eq!(code, "42501", "{message}");
        assert!(message.contains("constant"), "{message}");
        s.client
            .query(
                check,
                &[&"SELECT count(*) FROM customers WHERE name::citext LIKE 'a%'"],
            )
            .unwrap_or_else(|e| panic!("{:?}", db_error(&e)));
        // citext's strpos and translate are SQL functions calling the built-ins with their
        // arguments: held to the built-ins' rules by their bodies.
        for sql in [
            "SELECT strpos(name::citext, country::citext) FROM customers",
            "SELECT translate(name::citext, country::citext, '') FROM customers",
        ] {
            let error = s.client.query(check, &[&sql]).unwrap_err();
            let (code, message, _) = db_error(&error);
            assert_eq!(code, "42501", "{sql}: {message}");
            assert!(message.contains("constant"), "{sql}: {message}");
        }
        s.client
            .query(
                check,
                &[&"SELECT strpos(name::citext, 'ab') FROM customers"],
            )
            .unwrap_or_else(|e| panic!("{:?}", db_error(&e)));
    }
    // A function that is not built in is held to what its body calls, whatever its language
    // (SQL, SQL-standard, PL/pgSQL) and through other functions' bodies; one of LANGUAGE
    // internal to the rule of the built-in whose C function it calls (textpos is position's).
    s.client
        .batch_execute(
            "CREATE SCHEMA wrap;
             CREATE FUNCTION wrap.find(a text, b text) RETURNS int LANGUAGE sql IMMUTABLE
                 AS 'SELECT strpos(a, b)';
             CREATE FUNCTION wrap.find_again(a text, b text) RETURNS int LANGUAGE sql IMMUTABLE
                 AS 'SELECT wrap.find(a, b) + 1';
             CREATE FUNCTION wrap.find_standard(a text, b text) RETURNS int LANGUAGE sql
                 IMMUTABLE RETURN strpos(a, b);
             CREATE FUNCTION wrap.find_procedurally(a text, b text) RETURNS int
                 LANGUAGE plpgsql IMMUTABLE AS $$ BEGIN RETURN position(b in a); END $$;
             CREATE FUNCTION wrap.likes(a text, b text) RETURNS boolean LANGUAGE sql IMMUTABLE
                 AS 'SELECT a ~~ b';
             CREATE FUNCTION wrap.find_internally(text, text) RETURNS int LANGUAGE internal
                 IMMUTABLE AS 'textpos';
             CREATE FUNCTION wrap.twice(a int) RETURNS int LANGUAGE sql IMMUTABLE
                 AS 'SELECT a * 2';
             CREATE FUNCTION wrap.is_nfc(t text) RETURNS boolean LANGUAGE sql IMMUTABLE
                 AS 'SELECT t IS NFC NORMALIZED';
             CREATE FUNCTION wrap.union_step(a text[], b text[]) RETURNS text[] LANGUAGE sql
                 IMMUTABLE AS 'SELECT CASE WHEN a @> b THEN a ELSE a || b END';
             CREATE AGGREGATE wrap.array_union(text[])
                 (sfunc = wrap.union_step, stype = text[], initcond = '{}');
             CREATE FUNCTION wrap.finds(a text, b text) RETURNS boolean LANGUAGE sql IMMUTABLE
                 AS 'SELECT strpos(a, b) > 0';
             CREATE OPERATOR wrap.=~= (FUNCTION = wrap.finds, LEFTARG = text, RIGHTARG = text);
             SET sql_query_engine.allowed_functions = 'schema:wrap';",
        )
        .unwrap();
    for sql in [
        "SELECT wrap.find(name, country) FROM customers",
        "SELECT wrap.find_again(name, country) FROM customers",
        "SELECT wrap.find_standard(name, country) FROM customers",
        "SELECT wrap.find_procedurally(name, country) FROM customers",
        "SELECT wrap.likes(name, country) FROM customers",
        "SELECT wrap.find_internally(name, country) FROM customers",
        // Grammar that calls what has no name of its own in the body; an aggregate's state
        // function and an operator's function, whose arguments no call shows.
        "SELECT wrap.is_nfc(name) FROM customers",
        "SELECT wrap.array_union(ARRAY[name]) FROM customers",
        "SELECT name OPERATOR(wrap.=~=) country FROM customers",
    ] {
        let error = s.client.query("SELECT nl_check($1)", &[&sql]).unwrap_err();
        let (code, message, _) = db_error(&error);
        assert_eq!(code, "42501", "{sql}: {message}");
        assert!(message.contains("cancel"), "{sql}: {message}");
    }
    // A role's function named as a word of a superuser's body (`select`), in its temporary
    // schema, is not what that body calls: it changes nothing.
    let mallory = format!("mallory_{}", s.database);
    s.client
        .batch_execute(&format!("CREATE ROLE {mallory} LOGIN"))
        .unwrap();
    let mut namesake = cluster().connect_as(&s.database, &mallory);
    namesake
        .batch_execute(
            "CREATE FUNCTION pg_temp.\"select\"() RETURNS int LANGUAGE sql
                 AS 'SELECT strpos(''a'', ''b'')'",
        )
        .unwrap();
    s.client
        .query(
            "SELECT nl_check($1)",
            &[&"SELECT wrap.twice(customer_id), wrap.find_internally(name, 'ab') FROM customers"],
        )
        .unwrap_or_else(|e| panic!("{:?}", db_error(&e)));
    drop(namesake);
    // A constant's text as the planner writes it: an OID relabelled as a relation's is its
    // name, a circle cast to a polygon its points.
    for sql in [
        "SELECT strpos(name, '' || 16385::oid::regclass) FROM customers",
        "SELECT strpos(name, '' || '<(0,0),9>'::circle::polygon) FROM customers",
    ] {
        let error = s.client.query("SELECT nl_check($1)", &[&sql]).unwrap_err();
        let (code, message, _) = db_error(&error);
        assert_eq!(code, "42501", "{sql}: {message}");
        assert!(message.contains("constant"), "{sql}: {message}");
    }
    // Named, a function is the superuser's choice.
    s.client
        .batch_execute("SET sql_query_engine.allowed_functions = 'schema:wrap, wrap.find'")
        .unwrap();
    s.client
        .query(
            "SELECT nl_check($1)",
            &[&"SELECT wrap.find(name, country) FROM customers"],
        )
        .unwrap_or_else(|e| panic!("{:?}", db_error(&e)));
    // Contrib modules' C functions whose work grows faster than their inputs without a check
    // for cancel: ltree's text query of a path, and, up to PostgreSQL 16, pg_trgm's word
    // similarity.
    if s.client
        .batch_execute(
            "CREATE EXTENSION IF NOT EXISTS ltree;
             CREATE TABLE paths (p ltree, q ltxtquery);
             SET sql_query_engine.allowed_functions = 'extension:ltree';",
        )
        .is_ok()
    {
        let error = s
            .client
            .query(
                "SELECT nl_check($1)",
                &[&"SELECT count(*) FROM paths WHERE p @ q"],
            )
            .unwrap_err();
        let (code, message, _) = db_error(&error);
        assert_eq!(code, "42501", "{message}");
        assert!(message.contains("constant"), "{message}");
        s.client
            .query(
                "SELECT nl_check($1)",
                &[&"SELECT count(*) FROM paths WHERE p @ 'a & b' AND p ~ '*.a.*'"],
            )
            .unwrap_or_else(|e| panic!("{:?}", db_error(&e)));
    }
    if s.client
        .batch_execute(
            "CREATE EXTENSION IF NOT EXISTS pg_trgm;
             SET sql_query_engine.allowed_functions = 'extension:pg_trgm';",
        )
        .is_ok()
    {
        let words = s
            .client
            .query(
                "SELECT nl_check($1)",
                &[&"SELECT word_similarity('ada', name) FROM customers"],
            )
            .map_err(|e| db_error(&e));
        if version < 170000 {
            let (code, message, _) = words.unwrap_err();
            assert_eq!(code, "42501", "{message}");
            assert!(message.contains("cancel"), "{message}");
        } else {
            words.unwrap();
        }
        s.client
            .query(
                "SELECT nl_check($1)",
                &[&"SELECT similarity(name, country) FROM customers"],
            )
            .unwrap_or_else(|e| panic!("{:?}", db_error(&e)));
    }
    // Under a nondeterministic collation (LIKE takes one from PostgreSQL 18), no pattern
    // bounds the work: refused.
    if version >= 180000
        && s.client
            .batch_execute(
                "CREATE COLLATION IF NOT EXISTS public.loose \
                 (provider = icu, locale = 'und-u-ks-level2', deterministic = false)",
            )
            .is_ok()
    {
        let error = s
            .client
            .query(
                "SELECT nl_check($1)",
                &[&"SELECT count(*) FROM customers WHERE name COLLATE public.loose LIKE '%x'"],
            )
            .unwrap_err();
        let (code, message, _) = db_error(&error);
        assert_eq!(code, "42501", "{message}");
        assert!(message.contains("nondeterministic"), "{message}");
    }
}

/// Analysis expands a star over every FROM item it stands for, looks each column reference up
/// in every FROM item in scope, and compares every column of a NATURAL join's sides, checking
/// for no cancel: past bounds on each, the statement is refused before it is analysed.
#[test]
fn stars_references_and_natural_joins_over_many_from_items_are_bounded() {
    let mut s = Session::new();
    let wide: Vec<String> = (0..1664).map(|i| i.to_string()).collect();
    let cte = format!("WITH c AS (VALUES ({})) ", wide.join(", "));
    let aliases = |n: usize, p: &str| -> String {
        (0..n)
            .map(|i| format!("c {p}{i}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let refused = [
        format!("{cte}SELECT DISTINCT * FROM {}", aliases(400, "a")),
        format!(
            "{cte}SELECT ARRAY[{}] FROM {}, (SELECT 1 AS x) s",
            vec!["x"; 1000].join(", "),
            aliases(300, "a")
        ),
        format!(
            "{cte}SELECT 1 FROM ({}) NATURAL JOIN ({})",
            (0..9)
                .map(|i| format!("c a{i}"))
                .collect::<Vec<_>>()
                .join(" CROSS JOIN "),
            (0..9)
                .map(|i| format!("c b{i}"))
                .collect::<Vec<_>>()
                .join(" CROSS JOIN ")
        ),
        // A row expansion copies its expression once per field: one inside another multiplies.
        format!(
            "SELECT ROW((ROW((ROW({})).*)).*)",
            (1..=40)
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        // A row expansion copies its subscripts too, stars in them included.
        "SELECT (ARRAY[NULL::orders])[(ROW((ARRAY[NULL::orders])[1].*) IS NULL)::int].*"
            .to_string(),
        // Joins nested to the right list both sides again as well.
        format!(
            "WITH w AS (SELECT 1 AS a) SELECT 1 FROM {}w w39 CROSS JOIN w w40{}",
            (1..39)
                .map(|i| format!("w w{i} CROSS JOIN ("))
                .collect::<String>(),
            ")".repeat(38)
        ),
        // Each join lists its left side's columns again.
        format!(
            "WITH c AS (SELECT 1 AS a) SELECT 1 FROM {}",
            (0..45)
                .map(|i| format!("c z{i}"))
                .collect::<Vec<_>>()
                .join(" CROSS JOIN ")
        ),
    ];
    for sql in &refused {
        let started = std::time::Instant::now();
        let error = match s.client.query("SELECT nl_check($1)", &[sql]) {
            Err(error) => error,
            Ok(_) => panic!("passed: {}", &sql[sql.len().saturating_sub(80)..]),
        };
        let (code, message, _) = db_error(&error);
        assert_eq!(code, "54001", "{message}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }
    let twenty = format!(
        "WITH c AS (SELECT 1 AS a) SELECT count(*) FROM {}",
        (0..20)
            .map(|i| format!("c z{i}"))
            .collect::<Vec<_>>()
            .join(" CROSS JOIN ")
    );
    for sql in [
        "SELECT (r).* FROM (SELECT ROW(1, 2) AS r) s",
        twenty.as_str(),
        "SELECT * FROM orders o JOIN customers c USING (customer_id) ORDER BY 1",
        "SELECT o.*, c.name FROM orders o NATURAL JOIN customers c",
    ] {
        s.client
            .query("SELECT nl_check($1)", &[&sql])
            .unwrap_or_else(|e| panic!("{sql}: {:?}", db_error(&e)));
    }
}

/// An endpoint whose URL carries credentials (`https://user:password@host/v1`, the HTTP
/// client sends them as `Authorization: Basic <base64>`) and that echoes the request's headers
/// in an error: neither the credential nor the password reaches the trace or the error.
#[test]
fn credentials_an_endpoint_echoes_are_not_in_the_trace() {
    let mut s = Session::new();
    let port = s
        .llm
        .url()
        .trim_start_matches("http://127.0.0.1:")
        .trim_end_matches("/v1")
        .to_string();
    s.client
        .batch_execute(&format!(
            "SET sql_query_engine.llm_url = 'http://svc:S3cretPassw0rd@127.0.0.1:{port}/v1';
             SET sql_query_engine.max_repairs = 0;"
        ))
        .unwrap();
    // base64 of "svc:S3cretPassw0rd", as the request's Authorization header carries it
    let basic = "c3ZjOlMzY3JldFBhc3N3MHJk";
    s.llm.on(
        "echo my headers",
        vec![Reply::Status(
            422,
            format!("{{\"error\": {{\"message\": \"bad request; headers: authorization=Basic {basic}\"}}}}"),
        )],
    );
    let said = match s.trace("echo my headers") {
        Ok(trace) => trace.to_string(),
        Err(error) => format!("{error:?}"),
    };
    assert!(said.contains("422"), "{said}");
    for secret in [basic, "S3cretPassw0rd"] {
        assert!(!said.contains(secret), "{secret} is in: {said}");
    }
}
