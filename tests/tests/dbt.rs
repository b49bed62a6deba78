//! The dbt package (dbt/) with real dbt-core and dbt-postgres, on the small project in
//! dbt/integration_tests, as an ordinary role that owns the project's schema: the model is asked
//! at compile time only for questions the committed cache does not have, `dbt run` and
//! `dbt test` ask it nothing, a refresh asks again, and a cached query the guard refuses fails
//! the package's test.

use std::path::{Path, PathBuf};
use std::process::Command;

use sql_query_engine_e2e::clients::{clients_python, repo};
use sql_query_engine_e2e::{cluster, Reply, Session};

const PER_COUNTRY: &str =
    "SELECT country, count(*) AS customers FROM customers GROUP BY country ORDER BY country";
const TOTAL_2024: &str = "SELECT sum(amount) AS total FROM orders
     WHERE ordered_on >= DATE '2024-01-01' AND ordered_on < DATE '2025-01-01'";

/// The project, copied to a directory of its own, and how to run dbt in it.
struct Project {
    dir: PathBuf,
    dbt: PathBuf,
    env: Vec<(&'static str, String)>,
}

impl Project {
    fn new(database: &str, user: &str) -> Project {
        let dir = sql_query_engine_e2e::scratch(&format!("dbt-{database}"));
        let _ = std::fs::remove_dir_all(&dir);
        copy_tree(&repo().join("dbt/integration_tests"), &dir);
        let package = repo().join("dbt").canonicalize().expect("the package");
        std::fs::write(
            dir.join("packages.yml"),
            format!("packages:\n  - local: {}\n", package.display()),
        )
        .expect("writing packages.yml");
        let dbt = clients_python().with_file_name("dbt");
        let env = vec![
            ("SQE_DBT_HOST", "127.0.0.1".to_string()),
            ("SQE_DBT_PORT", cluster().port.to_string()),
            ("SQE_DBT_USER", user.to_string()),
            ("SQE_DBT_DATABASE", database.to_string()),
            ("DBT_PROFILES_DIR", dir.display().to_string()),
            ("DBT_SEND_ANONYMOUS_USAGE_STATS", "false".to_string()),
            ("DBT_VERSION_CHECK", "false".to_string()),
        ];
        Project { dir, dbt, env }
    }

    /// `dbt args...`: whether it succeeded, and what it printed.
    fn dbt(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(&self.dbt)
            .args(args)
            .current_dir(&self.dir)
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .expect("running dbt");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    fn ok(&self, args: &[&str]) -> String {
        let (ok, text) = self.dbt(args);
        assert!(ok, "dbt {args:?} failed:\n{text}");
        text
    }

    /// Writes the cache file as the package's README says: nl_cache through a temporary file.
    fn write_cache(&self, extra: &[&str]) {
        let mut args = vec!["--quiet", "run-operation", "sql_query_engine.nl_cache"];
        args.extend_from_slice(extra);
        let printed = self.ok(&args);
        std::fs::write(self.cache_file(), printed).expect("writing the cache");
    }

    fn cache_file(&self) -> PathBuf {
        self.dir.join("macros/sql_query_engine_cache.sql")
    }

    fn compiled(&self, model: &str) -> String {
        std::fs::read_to_string(
            self.dir
                .join(format!("target/compiled/sqe_shop/models/{model}.sql")),
        )
        .unwrap_or_else(|e| panic!("the compiled {model}: {e}"))
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("creating the project's copy");
    for entry in std::fs::read_dir(from).expect("reading the project") {
        let entry = entry.expect("an entry");
        let name = entry.file_name();
        if ["target", "dbt_packages", "logs"].contains(&name.to_string_lossy().as_ref()) {
            continue;
        }
        let path = entry.path();
        if path.is_dir() {
            copy_tree(&path, &to.join(&name));
        } else {
            std::fs::copy(&path, to.join(&name)).expect("copying a file");
        }
    }
}

/// A session, and the login role dbt runs as (its own schema `analytics`, reading the
/// fixture; `setting`, when given, stored for it), and the database's name.
fn dbt_role(setting: &str) -> (Session, String, String) {
    let mut s = Session::new();
    let user = format!("dbt_{}", s.database);
    let db = s.database.clone();
    let stored = match setting {
        "" => String::new(),
        setting => format!("ALTER ROLE {user} {setting};"),
    };
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {user} LOGIN;
             GRANT SELECT ON customers, orders TO {user};
             CREATE SCHEMA analytics AUTHORIZATION {user};
             {stored}
             ALTER DATABASE {db} SET sql_query_engine.llm_url = '{}';
             ALTER DATABASE {db} SET sql_query_engine.vote = off;",
            s.llm.url()
        ))
        .unwrap();
    (s, user, db)
}

#[test]
fn questions_compile_from_the_committed_cache_and_the_package_test_guards_them() {
    let (s, user, db) = dbt_role("");
    s.llm.respond_with(|request| {
        let asked = request.last_message();
        if asked.contains("How many customers are there per country?") {
            Some(Reply::sql(PER_COUNTRY))
        } else if asked.contains("What was the total order amount in 2024?") {
            Some(Reply::sql(TOTAL_2024))
        } else {
            None
        }
    });
    let project = Project::new(&db, &user);
    project.ok(&["deps"]);

    // No cache yet: compiling asks the model, and says the cache should be written.
    let said = project.ok(&["compile"]);
    assert!(said.contains("is not in the cache"), "{said}");
    assert!(!s.llm.requests().is_empty());

    // The cache, written once and committed, holds each question with its SQL.
    project.write_cache(&[]);
    let cache = std::fs::read_to_string(project.cache_file()).unwrap();
    assert!(cache.contains("How many customers are there per country?"));
    assert!(cache.contains("sum(amount) AS total"), "{cache}");

    // From now on nothing asks the model: compile, run and test.
    let asked = s.llm.requests().len();
    let said = project.ok(&["compile"]);
    assert!(!said.contains("is not in the cache"), "{said}");
    assert!(project
        .compiled("revenue_2024")
        .contains("sum(amount) AS total"));
    let said = project.ok(&["run"]);
    assert!(said.contains("PASS=2"), "{said}");
    let said = project.ok(&["test"]);
    assert!(said.contains("PASS=4"), "{said}");
    assert_eq!(
        s.llm.requests().len(),
        asked,
        "the model was not asked again"
    );

    // The models are real relations, made by the dbt role.
    let mut reader = cluster().connect_as(&db, &user);
    let row = reader
        .query_one(
            "SELECT (SELECT count(*) FROM analytics.customers_per_country),
                    (SELECT total::text FROM analytics.revenue_2024),
                    (SELECT relkind::text FROM pg_class
                     WHERE oid = 'analytics.revenue_2024'::regclass)",
            &[],
        )
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 3);
    assert_eq!(row.get::<_, String>(1), "233.85");
    assert_eq!(row.get::<_, String>(2), "r", "materialized as a table");

    // A refresh asks again, for every question.
    project.write_cache(&["--vars", "{nl_refresh: true}"]);
    assert_eq!(s.llm.requests().len(), asked + 2);

    // A cached query the guard refuses (a hand edit, or DDL since) fails the package's test,
    // and nothing it names ran.
    let edited = std::fs::read_to_string(project.cache_file())
        .unwrap()
        .replace(TOTAL_2024.trim(), "DELETE FROM orders");
    assert!(edited.contains("DELETE FROM orders"));
    std::fs::write(project.cache_file(), edited).unwrap();
    let (ok, said) = project.dbt(&["test", "--select", "revenue_2024"]);
    assert!(!ok, "the refused query failed the test:\n{said}");
    assert!(said.contains("read-only"), "{said}");
    let orders: i64 = reader
        .query_one("SELECT count(*) FROM orders", &[])
        .unwrap()
        .get(0);
    assert_eq!(orders, 6);
}

/// The model's SQL never becomes code of the project: SQL holding a Jinja tag (here in a string
/// literal, which the guard lets through, that would end the cache file's raw block and call
/// `run_query` at every compile) is not cached; and a backslash in it does not end the package
/// test's literal early for a role whose strings are not standard-conforming.
#[test]
fn the_models_sql_never_becomes_code_of_the_project() {
    let (mut s, user, db) = dbt_role("SET standard_conforming_strings = off");
    s.llm.respond_with(|request| {
        let asked = request.last_message();
        if asked.contains("How many customers are there per country?") {
            Some(Reply::sql(
                "SELECT country, count(*) AS customers, \
                 '{%endraw%}{{ run_query(\"CREATE TABLE analytics.pwned AS SELECT 1\") }}{%raw%}' \
                 AS note FROM customers GROUP BY country",
            ))
        } else if asked.contains("What was the total order amount in 2024?") {
            Some(Reply::sql(&format!(
                "{TOTAL_2024} -- the shop\\'s own total"
            )))
        } else {
            None
        }
    });
    let project = Project::new(&db, &user);
    project.ok(&["deps"]);
    project.ok(&["compile"]);
    let (ok, said) = project.dbt(&["--quiet", "run-operation", "sql_query_engine.nl_cache"]);
    // Had it been written, the next compile would run it.
    if ok {
        std::fs::write(project.cache_file(), &said).unwrap();
        project.dbt(&["compile"]);
    }
    let pwned: Option<String> = s
        .client
        .query_one("SELECT to_regclass('analytics.pwned')::text", &[])
        .unwrap()
        .get(0);
    assert_eq!(pwned, None, "the model's SQL ran as the project's code");
    assert!(!ok, "the SQL holding a tag was cached:\n{said}");
    assert!(said.contains("cannot be cached"), "{said}");
    // The package's test checks the SQL whole, backslash and all.
    let said = project.ok(&["test", "--select", "revenue_2024"]);
    assert!(said.contains("PASS=1"), "{said}");
}
