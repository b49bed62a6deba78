//! Hooks for `cargo pgrx test`, and the tests that need a backend. Each test that creates
//! objects does so in its own schema: the tests run concurrently in one database.

mod guard_corpus;

pub fn setup(_options: Vec<&str>) {}

/// Every test statement runs with the statement timer armed, so that the timer's position in
/// PostgreSQL's `enum TimeoutId` can be checked (`the_statement_timer_is_the_one_declared`).
#[must_use]
pub fn postgresql_conf_options() -> Vec<&'static str> {
    vec!["statement_timeout = '1h'"]
}

#[pgrx::pg_schema]
mod tests {
    use std::time::Instant;

    use pgrx::prelude::*;

    use crate::exec::{attempt, Limits, Mode, Outcome};
    use pgrx::pg_sys::PgTryBuilder;

    const RUN: Mode = Mode::Run(Limits {
        max_rows: 1000,
        max_bytes: 1 << 30,
    });

    fn failed(outcome: Outcome) -> crate::error::SqlError {
        match outcome {
            Outcome::Failed(e) => e,
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    /// While an attempt holds the backend's data size limit lowered (the memory watch's hard
    /// limit), a Rust allocation past it is made all the same, and asks for the attempt's
    /// cancel: Rust would abort the backend (and PostgreSQL restart the server) where
    /// PostgreSQL's own allocation raises an ERROR. The limit holds for what comes after.
    #[pg_test]
    fn a_rust_allocation_past_the_hard_memory_limit_cancels_instead_of_aborting() {
        let (allocated, asked, refused) = crate::exec::allocate_while_watched(16 << 20, 512 << 20);
        assert!(
            allocated,
            "the limit was not lowered, or the allocation failed"
        );
        assert!(asked, "the watch did not ask for a cancel");
        // The limit is lowered again at once: what comes next (code that never checks for
        // interrupts) cannot grow the backend past it.
        assert!(
            refused,
            "PostgreSQL's allocation past the limit went through"
        );
    }

    #[pg_test]
    fn errors_are_caught_whole_and_the_transaction_goes_on() {
        let e = failed(attempt("SELECT relnam FROM pg_class", RUN, 10_000));
        assert_eq!(e.sqlstate, "42703");
        assert_eq!(e.message, "column \"relnam\" does not exist");
        assert_eq!(e.position, Some(8));
        assert!(e.hint.unwrap_or_default().contains("relname"));
        // the caller's transaction is intact
        assert_eq!(Spi::get_one::<i32>("SELECT 41 + 1").unwrap(), Some(42));
    }

    #[pg_test]
    fn syntax_errors_keep_the_parsers_sqlstate_and_position() {
        let e = failed(attempt("SELECT FROM WHERE", RUN, 10_000));
        assert_eq!(e.sqlstate, "42601");
        assert_eq!(e.position, Some(13));
    }

    #[pg_test]
    fn queries_run_read_only_and_the_caller_stays_read_write() {
        // A STABLE function a superuser allowed passes the guard; the VOLATILE one it calls is
        // out of the guard's sight, so only the read-only transaction stops its write.
        Spi::run(
            "CREATE SCHEMA sqe_t_ro; CREATE TABLE sqe_t_ro.t (a int);
             CREATE FUNCTION sqe_t_ro.writer() RETURNS int LANGUAGE plpgsql VOLATILE AS
             $$ BEGIN INSERT INTO sqe_t_ro.t VALUES (1); RETURN 1; END $$;
             CREATE FUNCTION sqe_t_ro.sneaky() RETURNS int LANGUAGE plpgsql STABLE AS
             $$ BEGIN RETURN sqe_t_ro.writer(); END $$;",
        )
        .unwrap();
        Spi::run("SET LOCAL sql_query_engine.allowed_functions = 'sqe_t_ro.sneaky'").unwrap();
        let e = failed(attempt("SELECT sqe_t_ro.sneaky()", RUN, 10_000));
        assert_eq!(e.sqlstate, "25006");
        assert_eq!(
            Spi::get_one::<i64>("SELECT count(*) FROM sqe_t_ro.t").unwrap(),
            Some(0)
        );
        Spi::run("INSERT INTO sqe_t_ro.t VALUES (2)").unwrap();
        assert_eq!(
            Spi::get_one::<String>("SHOW transaction_read_only")
                .unwrap()
                .as_deref(),
            Some("off")
        );
    }

    #[pg_test]
    fn a_slow_query_hits_the_per_attempt_timeout() {
        let started = Instant::now();
        let e = failed(attempt(
            "SELECT count(*) FROM generate_series(1, 1000000000)",
            RUN,
            200,
        ));
        assert_eq!(e.sqlstate, "57014");
        assert!(e
            .hint
            .unwrap_or_default()
            .contains("sql_query_engine.statement_timeout"));
        assert!(started.elapsed().as_secs() < 20);
        // the timer is gone: the next statement is not cancelled
        assert_eq!(
            Spi::get_one::<i64>("SELECT count(*) FROM generate_series(1, 3000000)").unwrap(),
            Some(3_000_000)
        );
    }

    #[pg_test]
    fn rows_are_capped_and_built_by_postgres() {
        match attempt(
            "SELECT g FROM generate_series(1, 10) g",
            Mode::Run(Limits {
                max_rows: 3,
                max_bytes: 1 << 30,
            }),
            10_000,
        ) {
            Outcome::Rows(r) => {
                assert_eq!(r.rows, vec![r#"{"g": 1}"#, r#"{"g": 2}"#, r#"{"g": 3}"#]);
                assert!(r.truncated);
                assert_eq!(r.columns, vec!["g"]);
            }
            other => panic!("{other:?}"),
        }
        let sql = "SELECT 9.50::numeric AS price, date '2024-01-02' AS d, NULL::int AS n, \
                   '{\"a\": [1]}'::jsonb AS j, ARRAY[1, 2] AS arr, 'x' AS price";
        match attempt(sql, RUN, 10_000) {
            Outcome::Rows(r) => {
                assert_eq!(
                    r.rows,
                    vec![
                        r#"{"d": "2024-01-02", "j": {"a": [1]}, "n": null, "arr": [1, 2], "price": 9.50, "price_2": "x"}"#
                    ]
                );
                assert!(!r.truncated);
            }
            other => panic!("{other:?}"),
        }
    }

    #[pg_test]
    fn an_empty_result_keeps_its_columns() {
        match attempt("SELECT 1 AS a, 2 AS b WHERE false", RUN, 10_000) {
            Outcome::Empty(r) => assert_eq!(r.columns, vec!["a", "b"]),
            other => panic!("{other:?}"),
        }
    }

    #[pg_test]
    fn writes_and_several_statements_are_refused_before_running() {
        Spi::run("CREATE SCHEMA sqe_t_guard; CREATE TABLE sqe_t_guard.t AS SELECT 1 AS a").unwrap();
        for (sql, command) in [
            ("DELETE FROM sqe_t_guard.t", "DELETE"),
            ("DROP TABLE sqe_t_guard.t", "DROP TABLE"),
            (
                "SELECT * INTO sqe_t_guard.u FROM sqe_t_guard.t",
                "SELECT INTO",
            ),
            ("SELECT 1; TRUNCATE sqe_t_guard.t", "TRUNCATE TABLE"),
        ] {
            match attempt(sql, RUN, 10_000) {
                Outcome::Refused(r) => {
                    assert!(r.ends_run, "{sql}");
                    assert_eq!(r.error.sqlstate, "25006");
                    assert!(r.error.message.contains(command), "{}", r.error.message);
                }
                other => panic!("{sql}: {other:?}"),
            }
        }
        assert_eq!(
            Spi::get_one::<i64>("SELECT count(*) FROM sqe_t_guard.t").unwrap(),
            Some(1)
        );
        match attempt("SELECT 1; SELECT 2", RUN, 10_000) {
            Outcome::Refused(r) => {
                assert_eq!((r.ends_run, r.error.sqlstate.as_str()), (false, "42601"))
            }
            other => panic!("{other:?}"),
        }
    }

    #[pg_test]
    fn planning_never_executes() {
        let started = Instant::now();
        assert_eq!(
            attempt(
                "SELECT count(*) FROM generate_series(1, 100000000000)",
                Mode::Plan,
                10_000
            ),
            Outcome::Planned
        );
        assert!(started.elapsed().as_secs() < 30);
        assert_eq!(
            failed(attempt("SELECT nope", Mode::Plan, 10_000)).sqlstate,
            "42703"
        );
    }

    /// What the guard made of `sql`: `ok`, or the SQLSTATE it was refused or failed with. The
    /// query is only ever planned, so even a guard hole could not run it.
    fn verdict(sql: &str) -> String {
        match attempt(sql, Mode::Plan, 10_000) {
            Outcome::Planned => super::guard_corpus::OK.to_string(),
            Outcome::Refused(r) => {
                assert_eq!(r.ends_run, r.error.sqlstate == "25006", "{sql}: {r:?}");
                r.error.sqlstate.to_string()
            }
            Outcome::Failed(e) => e.sqlstate.to_string(),
            other => format!("{other:?}"),
        }
    }

    #[pg_test]
    fn the_adversarial_corpus_is_refused_with_the_right_sqlstates() {
        use super::guard_corpus::{CASES, CORPUS_SETUP};
        Spi::run(CORPUS_SETUP).unwrap();
        Spi::run("SET LOCAL search_path = sqe_corpus, public").unwrap();
        assert!(CASES.len() >= 150, "only {} cases", CASES.len());
        #[cfg(any(feature = "pg17", feature = "pg18"))]
        let cases: Vec<&(&str, &str)> = CASES
            .iter()
            .chain(super::guard_corpus::SQL_JSON_CASES)
            .collect();
        #[cfg(not(any(feature = "pg17", feature = "pg18")))]
        let cases: Vec<&(&str, &str)> = CASES.iter().collect();
        let wrong: Vec<String> = cases
            .iter()
            .filter_map(|(sql, expected)| {
                let got = verdict(sql);
                (got != *expected).then(|| format!("{sql:?}: expected {expected}, got {got}"))
            })
            .collect();
        assert!(
            wrong.is_empty(),
            "{} of {} wrong:\n{}",
            wrong.len(),
            cases.len(),
            wrong.join("\n")
        );
        // nothing ran: no row written, the sequence never advanced, no advisory lock held
        assert_eq!(
            Spi::get_one::<i64>("SELECT count(*) FROM sqe_corpus.t").unwrap(),
            Some(0)
        );
        assert_eq!(
            Spi::get_one::<bool>("SELECT is_called FROM sqe_corpus.s").unwrap(),
            Some(false)
        );
        assert_eq!(
            Spi::get_one::<i64>("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
                .unwrap(),
            Some(0)
        );
    }

    #[pg_test]
    fn very_long_and_deeply_nested_input() {
        let long_literal = format!("SELECT '{}'", "x".repeat(1 << 20));
        assert_eq!(verdict(&long_literal), "ok");
        let long_list = format!("SELECT 1 WHERE 1 IN ({})", vec!["1"; 20_000].join(","));
        assert_eq!(verdict(&long_list), "ok");
        // too deep for the grammar: the parser's own syntax error
        let deep = format!("SELECT {}1{}", "(".repeat(100_000), ")".repeat(100_000));
        assert_eq!(verdict(&deep), "42601");
        // parses, but too deep to analyze: the server's stack guard
        let long_chain = format!("SELECT {}1", "1+".repeat(200_000));
        assert_eq!(verdict(&long_chain), "54001");
        let deep_write = format!("{}DELETE FROM x", "/* */ ".repeat(100_000));
        assert_eq!(verdict(&deep_write), "25006");
    }

    #[pg_test]
    fn catalogs_can_be_allowed_by_setting() {
        assert_eq!(verdict("SELECT count(*) FROM pg_class"), "42501");
        Spi::run("SET LOCAL sql_query_engine.allow_system_catalogs = on").unwrap();
        assert_eq!(verdict("SELECT count(*) FROM pg_class"), "ok");
        // side-effect functions stay refused
        assert_eq!(verdict("SELECT current_setting('work_mem')"), "42501");
    }

    #[pg_test]
    fn nl_check_raises_the_refusal_or_returns() {
        Spi::run("SELECT nl_check('SELECT 1')").unwrap();
        for (sql, code) in [
            ("DELETE FROM nowhere", "25006"),
            ("SELECT pg_sleep(1)", "42501"),
            ("SELEC 1", "42601"),
        ] {
            let caught = PgTryBuilder::new(|| {
                Spi::run(&format!(
                    "SELECT nl_check({})",
                    pgrx::spi::quote_literal(sql)
                ))
                .unwrap();
                String::from("ok")
            })
            .catch_others(|e| match e {
                pgrx::pg_sys::panic::CaughtError::PostgresError(r)
                | pgrx::pg_sys::panic::CaughtError::ErrorReport(r) => {
                    crate::error::SqlState::from_code(r.sql_error_code()).to_string()
                }
                other => format!("{other:?}"),
            })
            .execute();
            assert_eq!(caught, code, "{sql}");
        }
    }

    #[pg_test]
    fn what_a_superuser_allows_runs_and_what_runs_implicitly_is_checked_too() {
        Spi::run(
            "CREATE SCHEMA sqe_t_allow;
             CREATE FUNCTION sqe_t_allow.twice(int) RETURNS int LANGUAGE sql IMMUTABLE
                 AS 'SELECT $1 * 2';
             CREATE FUNCTION sqe_t_allow.step(int, int) RETURNS int LANGUAGE plpgsql VOLATILE
                 AS 'BEGIN RETURN $1 + $2; END';
             CREATE AGGREGATE sqe_t_allow.total(int) (sfunc = sqe_t_allow.step, stype = int);
             CREATE AGGREGATE sqe_t_allow.plain_total(int) (sfunc = int4pl, stype = int);",
        )
        .unwrap();
        let verdict = |sql: &str| match attempt(sql, Mode::Plan, 10_000) {
            Outcome::Planned => "ok".to_string(),
            Outcome::Refused(r) => r.error.message,
            other => format!("{other:?}"),
        };
        assert!(verdict("SELECT sqe_t_allow.twice(1)").contains("schema:sqe_t_allow"));
        Spi::run("SET LOCAL sql_query_engine.allowed_functions = 'schema:sqe_t_allow'").unwrap();
        assert_eq!(verdict("SELECT sqe_t_allow.twice(1)"), "ok");
        assert_eq!(
            verdict("SELECT sqe_t_allow.plain_total(g) FROM generate_series(1, 3) g"),
            "ok"
        );
        // the aggregate is allowed, but its transition function is VOLATILE
        let why = verdict("SELECT sqe_t_allow.total(g) FROM generate_series(1, 3) g");
        assert!(
            why.contains("sqe_t_allow.step(integer,integer)") && why.contains("VOLATILE"),
            "{why}"
        );
        Spi::run("SET LOCAL sql_query_engine.allowed_functions = 'sqe_t_allow.twice'").unwrap();
        assert_eq!(verdict("SELECT sqe_t_allow.twice(1)"), "ok");
        assert!(verdict("SELECT sqe_t_allow.plain_total(1)").contains("not allowed"));
    }

    #[pg_test]
    fn the_statement_timer_is_the_one_declared() {
        use crate::compat::timeout::*;
        // The server armed statement_timeout (1h, see postgresql_conf_options) for this
        // statement: the timer the extension takes for it is armed, and ends about then.
        // SAFETY: reads of the backend's timers.
        let (active, finish, lock_active) = unsafe {
            (
                get_timeout_active(STATEMENT_TIMEOUT),
                get_timeout_finish_time(STATEMENT_TIMEOUT),
                get_timeout_active(STATEMENT_TIMEOUT - 1),
            )
        };
        assert!(active, "timer {STATEMENT_TIMEOUT} is not armed");
        assert!(!lock_active, "the lock timeout is armed: the enum moved");
        // SAFETY: reads the clock.
        let now = unsafe { pg_sys::GetCurrentTimestamp() };
        let left_s = (finish - now) / 1_000_000;
        assert!((3000..=3600).contains(&left_s), "{left_s} s left");
    }

    #[pg_test]
    fn a_node_kind_the_guard_does_not_know_is_refused() {
        use crate::guard::{self, Allowed, Origin};
        // A planner-only node where an expression belongs: the walk must refuse it, not pass it.
        // SAFETY: a query analysed here, whose first target entry gets a node palloc'd here.
        let query = unsafe {
            let text = c"SELECT 1 AS one";
            let raw = pgrx::PgList::<pg_sys::RawStmt>::from_pg(pg_sys::raw_parser(
                text.as_ptr(),
                pg_sys::RawParseMode::RAW_PARSE_DEFAULT,
            ));
            let query = pg_sys::parse_analyze_fixedparams(
                raw.get_ptr(0).unwrap(),
                text.as_ptr(),
                std::ptr::null(),
                0,
                std::ptr::null_mut(),
            );
            let entry = pgrx::PgList::<pg_sys::TargetEntry>::from_pg((*query).targetList)
                .get_ptr(0)
                .unwrap();
            let node = pg_sys::palloc0(std::mem::size_of::<pg_sys::NextValueExpr>())
                .cast::<pg_sys::NextValueExpr>();
            (*node).xpr.type_ = pg_sys::NodeTag::T_NextValueExpr;
            (*node).typeId = pg_sys::INT8OID;
            (*entry).expr = node.cast();
            query
        };
        let checked = {
            // SAFETY: the analysed query of this transaction.
            unsafe { guard::check_tree(query, Origin::Generated, Allowed::default(), None, None) }
        };
        let refusal = checked.unwrap_err();
        assert_eq!(refusal.error.sqlstate, "42501");
        assert!(
            refusal.error.message.contains("T_NextValueExpr"),
            "{}",
            refusal.error.message
        );
    }

    #[pg_test]
    fn settings_have_their_documented_defaults() {
        let show =
            |name: &str| Spi::get_one::<String>(&format!("SHOW sql_query_engine.{name}")).unwrap();
        assert_eq!(show("max_repairs").as_deref(), Some("4"));
        assert_eq!(show("llm_timeout").as_deref(), Some("1min"));
        assert_eq!(show("statement_timeout").as_deref(), Some("10s"));
        assert_eq!(show("max_rows").as_deref(), Some("1000"));
        assert_eq!(show("temperature").as_deref(), Some("0"));
        assert_eq!(show("max_result_bytes").as_deref(), Some("16MB"));
        assert_eq!(show("audit_log").as_deref(), Some("all"));
        assert_eq!(show("trusted_owners").as_deref(), Some(""));
        assert!(crate::settings::llm_url().is_none());
    }

    #[pg_test]
    fn a_query_that_names_more_than_hints_are_built_from_gets_none() {
        use crate::guard::references;
        let from = |n: usize| {
            (0..n)
                .map(|i| format!("t t{i}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let refs = references(&format!("SELECT t0.a FROM {}", from(64)));
        assert_eq!(refs.selects[0].relations.len(), 64);
        let refs = references(&format!("SELECT t0.a FROM {}", from(65)));
        assert!(refs.selects.is_empty() && refs.relations.is_empty() && refs.columns.is_empty());
        let chain = |n: usize| {
            (0..n)
                .map(|i| format!("t0.a = t1.a{i}"))
                .collect::<Vec<_>>()
                .join(" AND ")
        };
        let refs = references(&format!("SELECT 1 FROM t t0, t t1 WHERE {}", chain(256)));
        assert_eq!(refs.selects[0].equated.len(), 256);
        let refs = references(&format!("SELECT 1 FROM t t0, t t1 WHERE {}", chain(257)));
        assert!(refs.selects.is_empty());
    }

    #[pg_test]
    fn each_select_has_its_own_from_clause_and_unqualified_columns() {
        use crate::guard::references;
        // The SELECT of the unqualified column written at `column`'s first offset, as
        // "relation:alias,..." and whether its FROM clause holds anything else.
        let select_of = |sql: &str, column: &str| {
            let at = sql.find(&format!(" {column} ")).map(|p| p + 1)?;
            let refs = references(sql);
            let select = &refs.selects[refs.select_at(at)?];
            let relations: Vec<String> = select
                .relations
                .iter()
                .map(|r| format!("{}:{}", r.name, r.alias.as_deref().unwrap_or("")))
                .collect();
            Some((relations.join(","), select.opaque))
        };
        let sql = "SELECT name FROM customers c JOIN orders ON true WHERE power_id = 1";
        assert_eq!(
            select_of(sql, "power_id"),
            Some(("customers:c,orders:".into(), false))
        );
        // The innermost SELECT's FROM, not the outer one's; each side of a UNION.
        let sql = "SELECT name FROM customers WHERE id IN (SELECT customer_id FROM orders o \
                   WHERE quantity > 1)";
        assert_eq!(select_of(sql, "quantity"), Some(("orders:o".into(), false)));
        let sql = "SELECT a FROM t UNION SELECT b FROM u WHERE quantity > 1";
        assert_eq!(select_of(sql, "quantity"), Some(("u:".into(), false)));
        // What the schema cannot tell the columns of: a subquery, a function, a common table
        // expression, an aliased join (whose relations are hidden behind its alias).
        for (sql, relations) in [
            (
                "SELECT x FROM (SELECT 1 AS a) s, t WHERE quantity > 1",
                "t:",
            ),
            (
                "SELECT x FROM generate_series(1, 3) g WHERE quantity > 1",
                "",
            ),
            (
                "WITH t AS (SELECT 1 AS a) SELECT x FROM t, u WHERE quantity > 1",
                "u:",
            ),
            (
                "WITH w AS (SELECT 1) SELECT x FROM u WHERE u.a IN \
                 (SELECT a FROM t, w WHERE quantity > 1)",
                "t:",
            ),
            (
                "SELECT x FROM (t JOIN u ON true) AS j, v WHERE quantity > 1",
                "v:",
            ),
        ] {
            assert_eq!(
                select_of(sql, "quantity"),
                Some((relations.into(), true)),
                "{sql}"
            );
        }
        // A schema-qualified relation named like a common table expression is the relation.
        let sql = "WITH t AS (SELECT 1) SELECT x FROM public.t WHERE quantity > 1";
        assert_eq!(select_of(sql, "quantity"), Some(("t:".into(), false)));
        // The unqualified columns of a SELECT, not those of the SELECTs inside it; found by a
        // relation of its FROM clause too.
        let sql = "SELECT a, * FROM t WHERE quantity > (SELECT max(b) FROM u) ORDER BY c";
        let refs = references(sql);
        let outer = refs.select_at(25).unwrap();
        let bare: Vec<(Option<&str>, usize)> = refs.selects[outer]
            .bare
            .iter()
            .map(|(n, at)| (n.as_deref(), *at))
            .collect();
        assert_eq!(
            bare,
            [
                (Some("a"), 7),
                (None, 10),
                (Some("quantity"), 25),
                (Some("c"), 68)
            ]
        );
        assert_eq!(refs.select_at(sql.find("t WHERE").unwrap()), Some(outer));
        let inner = refs.select_at(sql.find("u)").unwrap()).unwrap();
        assert_eq!(refs.selects[inner].bare, [(Some("b".into()), 48)]);
        assert_eq!(refs.selects[inner].parent, Some(outer));
        // A qualifier names the relation of the nearest SELECT out that has one so named.
        let sql = "SELECT t.a FROM t WHERE t.b IN (SELECT t.c FROM t AS t, u WHERE u.d = t.e) \
                   AND EXISTS (SELECT u.f, t.g FROM u)";
        let refs = references(sql);
        let select_of = |column: &str| {
            let c = refs.columns.iter().find(|c| c.column == column).unwrap();
            refs.qualifier_select(c)
        };
        assert_eq!(
            ["a", "b", "c", "d", "e", "f", "g"].map(select_of),
            [
                Some(0),
                Some(0),
                Some(1),
                Some(1),
                Some(1),
                Some(2),
                Some(0)
            ]
        );
        let f = refs.columns.iter().find(|c| c.column == "f").unwrap();
        assert_eq!(
            refs.relation_of(f).map(|(at, r)| (at, r.name.as_str())),
            Some((2, "u"))
        );
        assert_eq!(refs.binding(2, "t"), Some(0), "t from the EXISTS subquery");
        assert_eq!(
            refs.binding(1, "t"),
            Some(1),
            "its own t hides the outer one"
        );
        assert_eq!(refs.binding(2, "v"), None, "named nowhere");
        let refs = references("SELECT x FROM t WHERE 1 IN (SELECT t.a FROM (SELECT 1) t)");
        assert_eq!(
            refs.qualifier_select(&refs.columns[0]),
            None,
            "a subquery's alias"
        );
        // Qualified there, or nothing there: no SELECT.
        assert_eq!(references("SELECT t.quantity FROM t").select_at(7), None);
        assert_eq!(references("SELECT (").select_at(7), None, "does not parse");
    }

    #[pg_test]
    fn a_select_knows_its_group_by_list_and_the_columns_equal_in_every_row() {
        use crate::guard::references;
        let named = |q: Option<&str>, c: &str| (q.map(str::to_string), c.to_string());
        let sql = "SELECT c.name FROM orders o JOIN customers c ON c.id = o.customer_id AND o.x > 1 \
                   LEFT JOIN notes n ON n.order_id = o.id WHERE o.y = z AND (o.a = c.b OR o.d = c.e) \
                   GROUP BY o.customer_id, kind, 2 HAVING count(*) > 1";
        let refs = references(sql);
        let select = &refs.selects[0];
        let group_by = select.group_by.as_ref().unwrap();
        assert_eq!(group_by.at, sql.find("o.customer_id, kind").unwrap());
        assert_eq!(
            group_by.columns,
            [named(Some("o"), "customer_id"), named(None, "kind")]
        );
        // Conjuncts of WHERE and of the inner join's ON; not the outer join's, not under OR.
        assert_eq!(
            select.equated,
            [
                [named(Some("o"), "y"), named(None, "z")],
                [named(Some("c"), "id"), named(Some("o"), "customer_id")],
            ]
        );
        // Grouping sets, or no GROUP BY: no list.
        for sql in [
            "SELECT a FROM t GROUP BY ROLLUP (a)",
            "SELECT a FROM t GROUP BY a, ()",
            "SELECT count(*) FROM t",
        ] {
            assert_eq!(references(sql).selects[0].group_by, None, "{sql}");
        }
        // A subquery's own list; an inner join's condition under an outer join.
        let sql = "SELECT 1 FROM t WHERE t.a IN (SELECT u.b FROM u GROUP BY u.b) \
                   AND 1 IN (SELECT 1 FROM v LEFT JOIN (w JOIN x ON w.i = x.i) ON v.j = w.j)";
        let refs = references(sql);
        assert_eq!(refs.selects[0].group_by, None);
        assert_eq!(
            refs.selects[1].group_by.as_ref().map(|g| g.columns.clone()),
            Some(vec![named(Some("u"), "b")])
        );
        assert_eq!(
            refs.selects[2].equated,
            [[named(Some("w"), "i"), named(Some("x"), "i")]]
        );
        // An aliased join's names are not the SELECT's; a relation whose columns an alias
        // renames is not described by the schema; a schema-qualified one keeps its schema.
        let refs = references(
            "SELECT 1 FROM (q JOIN s ON q.k = s.b) AS j, arch.t AS x(a, b), u.v WHERE x.a = 1",
        );
        assert!(refs.selects[0].equated.is_empty());
        assert!(refs.selects[0].opaque);
        let schemas: Vec<_> = refs.selects[0]
            .relations
            .iter()
            .map(|r| (r.schema.as_deref(), r.name.as_str()))
            .collect();
        assert_eq!(schemas, [(Some("u"), "v")]);
    }

    /// A template's instantiation is used only when PostgreSQL's lexer reads the example and
    /// it alike but for constants that now read as the new values: a string continued on the
    /// next line (one constant to the lexer, two to the literal reader) is caught, whether
    /// the structure changes or only the value the lexer reads.
    #[pg_test]
    fn only_an_instantiation_that_changes_only_its_values_is_confirmed() {
        use crate::lexer::only_values_differ as same;
        use crate::literals::LiteralKind::{Number, Text};
        let sql = "SELECT count(*) FROM t WHERE c = 'DE' AND n > 10";
        assert!(same(
            sql,
            "SELECT count(*) FROM t WHERE c = 'IT' AND n > 10",
            &[(Text, "IT")]
        ));
        assert!(same(
            sql,
            "SELECT count(*) FROM t WHERE c = 'DE' AND n > 2.5",
            &[(Number, "2.5")]
        ));
        assert!(same(
            sql,
            "SELECT count(*) FROM t WHERE c = E'a\\'b' AND n > 10",
            &[(Text, "a'b")]
        ));
        // A constant that reads as none of the new values, or as one of the other kind.
        assert!(!same(
            sql,
            "SELECT count(*) FROM t WHERE c = 'IT' AND n > 10",
            &[(Text, "FR")]
        ));
        assert!(!same(
            sql,
            "SELECT count(*) FROM t WHERE c = 'DE' AND n > '10'",
            &[(Text, "10")]
        ));
        // A new value that makes a comment or another token.
        assert!(!same(
            sql,
            "SELECT count(*) FROM t WHERE c = 'DE' AND n >-5",
            &[(Number, "-5")]
        ));
        assert!(!same("SELECT 1 - 10", "SELECT 1 --5", &[(Number, "-5")]));
        // Continued strings: the second part was a literal of its own to the literal reader.
        let continued = "SELECT count(*) FROM t WHERE c = E'D'\n'E'";
        assert!(!same(
            continued,
            "SELECT count(*) FROM t WHERE c = E'D'\n'IT'",
            &[(Text, "IT")]
        ));
        let escaped = "SELECT 1 FROM t WHERE c = E'x'\n'\\' OR c <> '";
        assert!(!same(
            escaped,
            "SELECT 1 FROM t WHERE c = E'x'\n'IT' OR c <> '",
            &[(Text, "IT")]
        ));
        // What does not lex is never confirmed.
        assert!(!same("SELECT 'open", "SELECT 'open", &[]));
        assert!(!same("SELECT 1", "SELECT 1\0", &[]));
    }

    /// Values from the planner's statistics are kept no longer than values read from a table:
    /// a new ANALYZE changes only pg_statistic, which invalidates nothing the cache hears.
    #[pg_test]
    fn a_schema_with_sample_values_is_read_again_once_its_statistics_are_old() {
        Spi::run(
            "CREATE TABLE patients (name text); INSERT INTO patients VALUES ('Jane Roe'); \
             ANALYZE patients; SET sql_query_engine.sample_values = 3",
        )
        .unwrap();
        assert!(!crate::schema::load().unwrap().1, "read");
        assert!(crate::schema::load().unwrap().1, "cached");
        crate::schema::age_for_tests();
        assert!(!crate::schema::load().unwrap().1, "read again");
        // Without sample values, nothing of the data is in it: it is kept.
        Spi::run("SET sql_query_engine.sample_values = 0").unwrap();
        assert!(!crate::schema::load().unwrap().1, "read (another key)");
        crate::schema::age_for_tests();
        assert!(crate::schema::load().unwrap().1, "kept");
    }
}
