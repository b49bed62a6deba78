//! Hooks for `cargo pgrx test`, and the tests that need a backend. Each test that creates
//! objects does so in its own schema: the tests run concurrently in one database.

pub fn setup(_options: Vec<&str>) {}

#[must_use]
pub fn postgresql_conf_options() -> Vec<&'static str> {
    vec![]
}

#[pgrx::pg_schema]
mod tests {
    use std::time::Instant;

    use pgrx::prelude::*;

    use crate::exec::{attempt, Mode, Outcome};

    const RUN: Mode = Mode::Run { max_rows: 1000 };

    fn failed(outcome: Outcome) -> crate::error::SqlError {
        match outcome {
            Outcome::Failed(e) => e,
            other => panic!("expected a failure, got {other:?}"),
        }
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
        Spi::run(
            "CREATE SCHEMA sqe_t_ro; CREATE TABLE sqe_t_ro.t (a int);
             CREATE FUNCTION sqe_t_ro.sneaky() RETURNS int LANGUAGE plpgsql AS
             $$ BEGIN INSERT INTO sqe_t_ro.t VALUES (1); RETURN 1; END $$;",
        )
        .unwrap();
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
        assert!(started.elapsed().as_secs() < 5);
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
            Mode::Run { max_rows: 3 },
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
        assert!(started.elapsed().as_secs() < 2);
        assert_eq!(
            failed(attempt("SELECT nope", Mode::Plan, 10_000)).sqlstate,
            "42703"
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
        assert!(crate::settings::llm_url().is_err());
    }
}
