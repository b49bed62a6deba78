//! The schema cache stays warm while other sessions churn (temporary tables, ANALYZE, DDL on
//! relations it does not hold), and is dropped by the very next question after DDL on a
//! relation it shows, a new readable table, or a COMMENT.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};

use sql_query_engine_e2e::{cluster, Reply, Session};

/// Held for writing by the churn test, for reading by every other: a backend that falls behind
/// the server's invalidation queue has all its caches reset, this one too, and the churn's
/// invalidations (of its own database, but one queue serves them all) did that on a fast machine
/// to another test's backend between two questions that must both be served from the cache.
static CHURN: RwLock<()> = RwLock::new(());

/// No churn while the guard lives.
fn quiet() -> RwLockReadGuard<'static, ()> {
    CHURN.read().unwrap_or_else(PoisonError::into_inner)
}

fn traced(s: &mut Session, question: &str) -> serde_json::Value {
    s.llm.on(question, vec![Reply::sql("SELECT 1 AS one")]);
    s.trace(question).unwrap()
}

#[test]
fn other_sessions_churn_without_emptying_the_cache() {
    let _alone = CHURN.write().unwrap_or_else(PoisonError::into_inner);
    let mut s = Session::new();
    s.client
        .batch_execute(
            "CREATE SCHEMA elsewhere; CREATE TABLE elsewhere.log (a int);
             CREATE TABLE hidden (a int); REVOKE ALL ON hidden FROM PUBLIC;
             ANALYZE;",
        )
        .unwrap();
    let role = format!("churn_reader_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {role}; GRANT SELECT ON customers, orders TO {role}; SET ROLE {role}"
        ))
        .unwrap();
    assert_eq!(traced(&mut s, "warm up")["schema_cached"], false);
    assert_eq!(traced(&mut s, "warm again")["schema_cached"], true);

    let stop = Arc::new(AtomicBool::new(false));
    let churner = {
        let (database, stop) = (s.database.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut other = cluster().connect(&database);
            let mut rounds = 0;
            while !stop.load(Ordering::Relaxed) || rounds < 20 {
                other
                    .batch_execute(
                        "CREATE TEMP TABLE scratch (a int); INSERT INTO scratch VALUES (1);
                         DROP TABLE scratch; ANALYZE customers; ANALYZE orders;
                         ALTER TABLE elsewhere.log ADD COLUMN b int;
                         ALTER TABLE elsewhere.log DROP COLUMN b;
                         ALTER TABLE hidden ADD COLUMN b int; ALTER TABLE hidden DROP COLUMN b;",
                    )
                    .unwrap();
                rounds += 1;
            }
            rounds
        })
    };
    // A backend that falls behind the server's invalidation queue (on a loaded machine, with
    // the other tests' DDL) has all its caches reset, this one too: at most twice in 30.
    let rebuilt: Vec<usize> = (0..30)
        .filter(|i| traced(&mut s, &format!("during churn {i}"))["schema_cached"] != true)
        .collect();
    assert!(
        rebuilt.len() <= 2,
        "questions {rebuilt:?} rebuilt the cache"
    );
    stop.store(true, Ordering::Relaxed);
    assert!(churner.join().unwrap() >= 20);
    assert_eq!(traced(&mut s, "after churn")["schema_cached"], true);
}

#[test]
fn ddl_on_what_the_cache_shows_is_seen_by_the_very_next_question() {
    let _quiet = quiet();
    let mut s = Session::new();
    assert_eq!(traced(&mut s, "before")["schema_cached"], false);
    let mut other = cluster().connect(&s.database);
    for (ddl, shows) in [
        (
            "ALTER TABLE customers ADD COLUMN vip boolean",
            "vip boolean",
        ),
        ("COMMENT ON COLUMN orders.amount IS 'in euros'", "in euros"),
        (
            "CREATE TABLE invoices (id int PRIMARY KEY)",
            "CREATE TABLE invoices",
        ),
        (
            "CREATE VIEW big_orders AS SELECT * FROM orders WHERE amount > 50",
            "big_orders",
        ),
    ] {
        other.batch_execute(ddl).unwrap();
        let question = format!("after {ddl}");
        let trace = traced(&mut s, &question);
        assert_eq!(trace["schema_cached"], false, "{ddl}");
        let told = s.llm.requests().last().unwrap().text();
        assert!(told.contains(shows), "{ddl}: {told}");
        assert_eq!(
            traced(&mut s, &format!("again {ddl}"))["schema_cached"],
            true
        );
    }
    // a grant makes a table visible to a role that could not read it
    let role = format!("grantee_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {role}; GRANT SELECT ON customers TO {role}; SET ROLE {role}"
        ))
        .unwrap();
    traced(&mut s, "as the grantee");
    other
        .batch_execute(&format!("GRANT SELECT ON orders TO {role}"))
        .unwrap();
    traced(&mut s, "after the grant");
    let told = s.llm.requests().last().unwrap().text();
    assert!(told.contains("CREATE TABLE orders"), "{told}");
}

/// COMMENTs are counted by an event trigger: two serializable transactions that comment on
/// objects at the same time both commit (the trigger reads nothing in them), and the next
/// question sees both comments.
#[test]
fn comments_in_concurrent_serializable_transactions_both_commit_and_are_seen() {
    let _quiet = quiet();
    let mut s = Session::new();
    assert_eq!(traced(&mut s, "before")["schema_cached"], false);
    let (mut a, mut b) = (
        cluster().connect(&s.database),
        cluster().connect(&s.database),
    );
    a.batch_execute(
        "BEGIN ISOLATION LEVEL SERIALIZABLE;
         COMMENT ON TABLE customers IS 'people who buy';
         COMMENT ON COLUMN customers.name IS 'as on the invoice';",
    )
    .unwrap();
    b.batch_execute(
        "BEGIN ISOLATION LEVEL SERIALIZABLE; COMMENT ON TABLE orders IS 'what they buy';",
    )
    .unwrap();
    a.batch_execute("COMMIT").unwrap();
    b.batch_execute("COMMIT")
        .unwrap_or_else(|e| panic!("the second serializable COMMENT failed: {e}"));
    let trace = traced(&mut s, "after both");
    assert_eq!(trace["schema_cached"], false);
    let told = s.llm.requests().last().unwrap().text();
    for comment in ["people who buy", "as on the invoice", "what they buy"] {
        assert!(told.contains(comment), "{comment}: {told}");
    }
}

/// Only comments a schema context can show count as a change of it, and only for the
/// backends that read their schema: a role commenting in a loop on a large object, or on a
/// table of a schema of its own, costs no other role's backend a rebuild of its schema.
#[test]
fn comments_nobody_else_is_shown_cost_no_other_backend_a_rebuild() {
    let _quiet = quiet();
    let s = Session::new();
    let db = &s.database;
    let (analyst, commenter) = (format!("analyst_{db}"), format!("commenter_{db}"));
    let mut admin = cluster().connect(db);
    admin
        .batch_execute(&format!(
            "CREATE ROLE {analyst} LOGIN; CREATE ROLE {commenter} LOGIN;
             GRANT CREATE ON DATABASE {db} TO {commenter};
             GRANT SELECT ON customers TO {analyst};
             ALTER DATABASE {db} SET sql_query_engine.llm_url = '{}';
             ALTER DATABASE {db} SET sql_query_engine.vote = off;",
            s.llm.url()
        ))
        .unwrap();
    let mut analyst = cluster().connect_as(db, &analyst);
    let mut cached = |question: &str| -> bool {
        s.llm.on(
            question,
            vec![Reply::sql("SELECT count(*) AS n FROM customers")],
        );
        let trace: String = analyst
            .query_one("SELECT nl_trace($1)::text", &[&question])
            .unwrap()
            .get(0);
        let trace: serde_json::Value = serde_json::from_str(&trace).unwrap();
        trace["schema_cached"].as_bool().expect("schema_cached")
    };
    assert!(!cached("how many customers, first"));
    assert!(cached("how many customers, second"));
    let mut commenter = cluster().connect_as(db, &commenter);
    let object: u32 = commenter
        .query_one("SELECT lo_create(0)::oid", &[])
        .unwrap()
        .get(0);
    commenter
        .batch_execute(&format!(
            "CREATE SCHEMA mine; CREATE TABLE mine.t (x int);
             COMMENT ON LARGE OBJECT {object} IS 'one';
             COMMENT ON TABLE mine.t IS 'two';
             COMMENT ON COLUMN mine.t.x IS 'three';"
        ))
        .unwrap();
    assert!(cached("how many customers, third"));
    admin
        .batch_execute("COMMENT ON TABLE customers IS 'who buys'")
        .unwrap();
    assert!(!cached("how many customers, fourth"));
}

/// A schema context read inside a REPEATABLE READ transaction reads the catalog as of that
/// transaction's first snapshot, older than what the backend was already told (row security
/// enabled since): it serves that call only, and the next transaction reads afresh.
#[test]
fn a_context_read_with_an_old_snapshot_is_not_kept_past_its_transaction() {
    let _quiet = quiet();
    let mut s = Session::new();
    let role = format!("snapshot_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN;
             CREATE TABLE towns (id int, town text);
             INSERT INTO towns SELECT i, CASE WHEN i % 2 = 0 THEN 'Zamora' ELSE 'Lugo' END
                 FROM generate_series(1, 200) i;
             ANALYZE towns;
             GRANT SELECT ON towns TO {role};"
        ))
        .unwrap();
    let mut client = cluster().connect_as(&s.database, &role);
    client
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
        .unwrap();
    s.client
        .batch_execute(
            "ALTER TABLE towns ENABLE ROW LEVEL SECURITY;
             CREATE POLICY nobody ON towns USING (false);",
        )
        .unwrap();
    let during: String = client.query_one("SELECT nl_schema()", &[]).unwrap().get(0);
    client.batch_execute("COMMIT").unwrap();
    let after: String = client.query_one("SELECT nl_schema()", &[]).unwrap().get(0);
    assert!(after.contains("towns"), "{after}");
    assert!(
        !after.contains("Zamora"),
        "values of a table under row security, read before it was:\n{after}\n(during:\n{during})"
    );
}

/// DDL on a partition reaches the cache of its partitioned table: what a read of it on the
/// extension's own takes (a lock per partition and index, at most 256) is counted again, so
/// a partition given hundreds of indexes after the table was cached is not read for samples.
#[test]
fn ddl_on_a_partition_is_seen_through_its_partitioned_table() {
    let _quiet = quiet();
    let mut s = Session::new();
    s.client
        .batch_execute(
            "CREATE TABLE places (name text, region int) PARTITION BY LIST (region);
             CREATE TABLE places_1 PARTITION OF places FOR VALUES IN (1);
             INSERT INTO places VALUES ('Zanzibar', 1), ('Quokka Bay', 1);",
        )
        .unwrap();
    let schema = |s: &mut Session| -> String {
        s.client
            .query_one("SELECT nl_schema()", &[])
            .unwrap()
            .get(0)
    };
    assert!(schema(&mut s).contains("Zanzibar"));
    let indexes: String = (0..300)
        .map(|i| format!("CREATE INDEX ON places_1 ((name || '{i}'));"))
        .collect();
    cluster()
        .connect(&s.database)
        .batch_execute(&indexes)
        .unwrap();
    let after = schema(&mut s);
    assert!(after.contains("places"), "{after}");
    assert!(
        !after.contains("Zanzibar"),
        "read with 300 indexes: {after}"
    );
}

/// A foreign key to a relation of a schema the context does not read is shown only while the
/// caller may read that relation: a REVOKE on it, or on its schema, is seen by the next
/// question, as one on a relation the context shows (the names a key shows are the caller's
/// to see only while it may read them).
#[test]
fn a_revoke_on_what_a_foreign_key_names_elsewhere_is_seen_by_the_next_question() {
    let _quiet = quiet();
    let mut s = Session::new();
    let role = format!("fk_reader_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE SCHEMA hr; CREATE TABLE hr.salaries (emp_id int PRIMARY KEY);
             CREATE TABLE payslips (id int, emp int REFERENCES hr.salaries (emp_id));
             CREATE ROLE {role}; GRANT USAGE ON SCHEMA hr TO {role};
             GRANT SELECT ON payslips, hr.salaries TO {role};
             SET ROLE {role}; SET sql_query_engine.schemas = 'public'"
        ))
        .unwrap();
    let told = |s: &mut Session, question: &str| {
        traced(s, question);
        s.llm.requests().last().unwrap().text()
    };
    assert!(told(&mut s, "shown").contains("hr.salaries"));
    let mut other = cluster().connect(&s.database);
    for (i, (revoke, undo)) in [
        (
            format!("REVOKE SELECT ON hr.salaries FROM {role}"),
            format!("GRANT SELECT ON hr.salaries TO {role}"),
        ),
        (
            format!("REVOKE USAGE ON SCHEMA hr FROM {role}"),
            format!("GRANT USAGE ON SCHEMA hr TO {role}"),
        ),
    ]
    .iter()
    .enumerate()
    {
        other.batch_execute(revoke).unwrap();
        let after = told(&mut s, &format!("after revoke {i}"));
        assert!(!after.contains("salaries"), "{revoke}: {after}");
        // A key that becomes readable is shown once the context is read again for another
        // reason (here a comment).
        other
            .batch_execute(&format!("{undo}; COMMENT ON TABLE payslips IS 'round {i}'"))
            .unwrap();
        assert!(told(&mut s, &format!("after grant {i}")).contains("hr.salaries"));
    }
}

/// A rebuild reads the catalog as it is now, not as its statement's snapshot saw it: in a long
/// statement, a table made readable meanwhile, with row security enabled meanwhile, shows none
/// of the values its statistics hold (PostgreSQL shows none of a table with row security).
#[test]
fn a_rebuild_in_a_long_statement_reads_the_catalog_as_it_is_now() {
    let _quiet = quiet();
    let mut s = Session::new();
    let reader = format!("late_reader_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE TABLE plans (owner text, body text);
             INSERT INTO plans SELECT 'x', 'Secret Plan' FROM generate_series(1, 50);
             INSERT INTO plans SELECT 'y', 'Open Plan' FROM generate_series(1, 50);
             ANALYZE plans;
             CREATE ROLE {reader} LOGIN; GRANT SELECT ON customers TO {reader};"
        ))
        .unwrap();
    let mut r = cluster().connect_as(&s.database, &reader);
    let first: String = r.query_one("SELECT nl_schema()", &[]).unwrap().get(0);
    assert!(!first.contains("plans"), "{first}");
    let long = std::thread::spawn(move || {
        r.query_one("SELECT pg_sleep(3)::text || nl_schema()", &[])
            .map(|row| row.get::<_, String>(0))
    });
    let started = std::time::Instant::now();
    loop {
        let asleep: i64 = s
            .client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND wait_event = 'PgSleep'",
                &[&reader],
            )
            .unwrap()
            .get(0);
        if asleep > 0 {
            break;
        }
        assert!(
            started.elapsed().as_secs() < 30,
            "the statement never slept"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    s.client
        .batch_execute(&format!(
            "ALTER TABLE plans ENABLE ROW LEVEL SECURITY;
             CREATE POLICY open ON plans USING (owner = 'y');
             GRANT SELECT ON plans TO {reader};"
        ))
        .unwrap();
    let told = long.join().unwrap().unwrap();
    assert!(told.contains("CREATE TABLE plans"), "{told}");
    assert!(!told.contains("Secret Plan"), "{told}");
}

/// A comment on a temporary table is in no one else's schema: it does not drop any backend's
/// cache (any role may make temporary tables, and comment on them in a loop); one on a relation
/// the cache shows does, at the next question, also when made in a SERIALIZABLE transaction,
/// and none leaves anything behind that later questions read (until 0.22.0 every comment was a
/// row of a table that every call summed).
#[test]
fn a_comment_on_a_temporary_table_keeps_the_cache_and_one_on_a_shown_table_drops_it() {
    let _quiet = quiet();
    let mut s = Session::new();
    let mut other = cluster().connect(&s.database);
    other
        .batch_execute("CREATE TEMP TABLE scratch (x int)")
        .unwrap();
    traced(&mut s, "warm up");
    assert_eq!(traced(&mut s, "warm again")["schema_cached"], true);
    other
        .batch_execute("COMMENT ON TABLE scratch IS 'mine'")
        .unwrap();
    assert_eq!(
        traced(&mut s, "after the temporary comment")["schema_cached"],
        true
    );
    other
        .batch_execute(
            "BEGIN ISOLATION LEVEL SERIALIZABLE;
             COMMENT ON TABLE orders IS 'every order, serializably';
             COMMIT;",
        )
        .unwrap();
    let after = traced(&mut s, "after the comment");
    assert_eq!(after["schema_cached"], false);
    let schema: String = s
        .client
        .query_one("SELECT nl_schema()", &[])
        .unwrap()
        .get(0);
    assert!(schema.contains("every order, serializably"), "{schema}");
    let table: Option<String> = s
        .client
        .query_one("SELECT to_regclass('nl_schema_changes')::text", &[])
        .unwrap()
        .get(0);
    assert_eq!(table, None);
}
