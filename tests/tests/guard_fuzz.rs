//! Generated inputs for the guard, driven through `nl_check` in a real backend: statements of the
//! adversarial corpus, mutated (cut, repeated, spliced, salted with dangerous tokens). For each,
//! the backend must answer (pass, or refuse with an ERROR) and survive. Whatever passes is
//! cross-checked by two independent oracles:
//! - its plan (EXPLAIN VERBOSE) must not write, lock, or call anything the guard keeps out
//!   (string literals aside: 'nextval(' as data is not a finding);
//! - it is then run, through `nl_run` (the same sandbox as generated queries), and must leave no
//!   trace: no advisory lock, no notification, no sequence step, no row. This one looks inside
//!   literals too: SQL that a function runs from a string shows up here.
//!
//! The run must also prove it tested something: a share of the statements passes, and every
//! statement the corpus expects to pass does.
//!
//! `SQE_FUZZ_ITERATIONS` (default 3000) and `SQE_FUZZ_SEED` make longer or other runs.

#[allow(dead_code)]
#[path = "../../pg_test/guard_corpus.rs"]
mod guard_corpus;

use sql_query_engine_e2e::{cluster, Session};

/// xorshift64*: small, seeded, reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const TOKENS: &[&str] = &[
    "SELECT ",
    " FROM t",
    "(",
    ")",
    ";",
    ",",
    "'",
    "$$",
    "$x$",
    "--",
    "\n",
    "/*",
    "*/",
    "\"",
    "E'\\''",
    " nextval('s')",
    " pg_sleep(0)",
    " DELETE FROM t",
    " WITH x AS (",
    " UNION SELECT ",
    " FOR UPDATE",
    " pg_catalog.",
    " LATERAL ",
    "::regclass",
    " INTO x",
    " OPERATOR(pg_catalog.=) ",
    "\u{200b}",
    "\u{ff50}",
    " current_setting('x')",
    " pg_advisory_lock(1)",
    " RETURNING *",
    " AS (",
    " INSERT INTO t VALUES (1)",
    " pg_class",
    " information_schema.tables",
    " U&\"\\0070g_sleep\"",
    " volatile_fn()",
    " f_default()",
    " === ",
    " dblink_exec('x')",
    " setval('s', 1)",
    "::locking[]",
    "::comp",
    "::mood",
    " domain_in('1', 'sqe_corpus.locking'::regtype, -1)",
    " AS r(a locking)",
];

/// Expressions for composed statements: harmless ones, which must pass, and dangerous ones,
/// which must not get through, wherever they are put.
const EXPRESSIONS: &[&str] = &[
    "1",
    "lower('X')",
    "count(*) OVER ()",
    "now()",
    "random() < 2",
    "(SELECT max(a) FROM t)",
    "md5('x')",
    "'nextval(''s'')'",
    "nextval('s')",
    "pg_advisory_lock(7)",
    "pg_try_advisory_xact_lock(8)",
    "(SELECT count(*) FROM crosstab('SELECT pg_advisory_lock(9)::text, 1::text, 1::text') AS x(a text, b text))",
    "volatile_fn()",
    "harmless(1)",
    "setval('s', 5)",
    "pg_notify('ch', 'x')",
    "query_to_xml('SELECT pg_advisory_lock(10)', true, false, '')",
    "1::checked",
    "'{12}'::locking[]",
    "('(16)'::comp).a",
    "(SELECT m FROM moods LIMIT 1)",
    "to_jsonb('happy'::mood)",
    "(SELECT a FROM jsonb_to_record('{\"a\": 1}') AS r(a locking))",
    "'red'::color",
    "5::positive",
];

/// A statement built from a passing statement of the corpus and an expression, in one of the
/// shapes generated queries take: most are valid, so the oracles see many statements run.
fn compose(rng: &mut Rng, passing: &[&str]) -> String {
    let base = passing[rng.below(passing.len())]
        .trim()
        .trim_end_matches(';');
    let expr = EXPRESSIONS[rng.below(EXPRESSIONS.len())];
    match rng.below(5) {
        0 => format!("SELECT {expr} FROM ({base}) AS q"),
        1 => format!("WITH c AS ({base}) SELECT {expr} AS e FROM c"),
        2 => format!("SELECT * FROM ({base}) AS q WHERE ({expr}) IS NOT NULL"),
        3 => format!("SELECT {expr} AS e UNION ALL SELECT {expr}"),
        _ => format!("SELECT (SELECT {expr}) AS e, * FROM ({base}) AS q ORDER BY 1 LIMIT 3"),
    }
}

fn mutate(rng: &mut Rng, statements: &[&str]) -> String {
    let mut chars: Vec<char> = statements[rng.below(statements.len())].chars().collect();
    for _ in 0..1 + rng.below(3) {
        let len = chars.len();
        let at = rng.below(len + 1);
        match rng.below(4) {
            0 if len > 0 => {
                let end = (at + 1 + rng.below(8)).min(len);
                chars.drain(at.min(len)..end.max(at.min(len)));
            }
            1 if len > 0 => {
                let start = rng.below(len);
                let end = (start + 1 + rng.below(12)).min(len);
                let slice: Vec<char> = chars[start..end].to_vec();
                chars.splice(at..at, slice);
            }
            2 => {
                let other: Vec<char> = statements[rng.below(statements.len())].chars().collect();
                let cut = rng.below(other.len() + 1);
                chars.truncate(at);
                chars.extend_from_slice(&other[cut..]);
            }
            _ => {
                let token: Vec<char> = TOKENS[rng.below(TOKENS.len())].chars().collect();
                chars.splice(at..at, token);
            }
        }
    }
    chars.into_iter().filter(|c| *c != '\0').collect()
}

/// Plan text without its string literals, so that a literal like 'nextval(' is not a finding.
fn without_literals(plan: &str) -> String {
    let mut out = String::with_capacity(plan.len());
    let mut in_literal = false;
    for c in plan.chars() {
        if c == '\'' {
            in_literal = !in_literal;
        } else if !in_literal {
            out.push(c);
        }
    }
    out.to_lowercase()
}

/// What must never appear in the plan of a statement the guard let through.
const FORBIDDEN_IN_PLAN: &[&str] = &[
    "nextval(",
    "setval(",
    "pg_sleep",
    "pg_advisory",
    "pg_try_advisory",
    "current_setting(",
    "set_config(",
    "pg_notify(",
    "volatile_fn(",
    "vol_eq(",
    "dblink_exec(",
    "lock_it(",
    "mood_json(",
    "insert on",
    "update on",
    "delete on",
    "merge on",
    "lockrows",
    "pg_catalog.pg_",
    "information_schema.",
];

/// What a statement that ran left behind in the session, if anything.
fn side_effects(s: &mut Session) -> Option<String> {
    let row = s
        .client
        .query_one(
            "SELECT (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
                       AND pid = pg_backend_pid()),
                    (SELECT is_called FROM sqe_corpus.s),
                    (SELECT count(*) FROM sqe_corpus.t) + (SELECT count(*) FROM sqe_corpus.u)",
            &[],
        )
        .ok()?;
    let (locks, called, rows): (i64, bool, i64) = (row.get(0), row.get(1), row.get(2));
    (locks > 0 || called || rows > 0)
        .then(|| format!("{locks} advisory locks, sequence called: {called}, {rows} rows"))
}

#[test]
fn mutated_statements_are_refused_or_provably_harmless() {
    let iterations: usize = std::env::var("SQE_FUZZ_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let seed: u64 = std::env::var("SQE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5EED_1234);
    let mut s = Session::new();
    s.client.batch_execute(guard_corpus::CORPUS_SETUP).unwrap();
    s.client
        .batch_execute(
            "SET search_path = sqe_corpus, public; SET sql_query_engine.statement_timeout = 200;",
        )
        .unwrap();
    // The behaviour oracle sees a lock when there is one.
    s.client
        .batch_execute("SELECT pg_advisory_lock(99)")
        .unwrap();
    assert!(
        side_effects(&mut s).is_some(),
        "the oracle is blind to locks"
    );
    s.client
        .batch_execute("SELECT pg_advisory_unlock_all()")
        .unwrap();
    let mut listener = cluster().connect(&s.database);
    listener.batch_execute("LISTEN ch; LISTEN x").unwrap();
    let statements: Vec<&str> = guard_corpus::CASES.iter().map(|(sql, _)| *sql).collect();
    for (sql, expected) in guard_corpus::CASES {
        if *expected == guard_corpus::OK {
            s.client
                .execute("SELECT nl_check($1)", &[sql])
                .unwrap_or_else(|e| panic!("{sql:?} must pass the guard: {e}"));
        }
    }
    let passing: Vec<&str> = guard_corpus::CASES
        .iter()
        .filter(|(sql, expected)| *expected == guard_corpus::OK && !sql.contains("--"))
        .map(|(sql, _)| *sql)
        .collect();
    let mut rng = Rng(seed);
    let (mut passed, mut refused, mut findings) = (0usize, 0usize, Vec::new());
    for i in 0..iterations {
        let sql = if i % 2 == 0 {
            compose(&mut rng, &passing)
        } else {
            mutate(&mut rng, &statements)
        };
        match s.client.execute("SELECT nl_check($1)", &[&sql]) {
            Err(e) => {
                assert!(
                    e.as_db_error().is_some(),
                    "the backend did not answer for {sql:?}: {e}"
                );
                refused += 1;
            }
            Ok(_) => {
                passed += 1;
                let plan = match s
                    .client
                    .query(&format!("EXPLAIN (VERBOSE, COSTS OFF) {sql}"), &[])
                {
                    Ok(rows) => rows
                        .iter()
                        .map(|r| r.get::<_, String>(0))
                        .collect::<Vec<_>>()
                        .join("\n"),
                    Err(_) => continue,
                };
                let plan = without_literals(&plan);
                if let Some(bad) = FORBIDDEN_IN_PLAN.iter().find(|p| plan.contains(*p)) {
                    findings.push(format!("{sql:?} passed but its plan has {bad}:\n{plan}"));
                }
                // Run it in the sandbox; an error of its own is fine, a trace is not.
                let _ = s.client.query("SELECT nl_run($1)", &[&sql]);
                if let Some(trace) = side_effects(&mut s) {
                    findings.push(format!("{sql:?} passed and left {trace}"));
                }
            }
        }
    }
    listener.batch_execute("SELECT 1").unwrap();
    let notified = listener.notifications().len();
    eprintln!("guard fuzz: {iterations} statements (seed {seed}): {passed} passed, {refused} refused, {} findings", findings.len());
    assert!(findings.is_empty(), "{}", findings.join("\n\n"));
    assert_eq!(notified, 0, "a statement that passed sent a notification");
    assert!(
        passed * 20 >= iterations,
        "only {passed} of {iterations} statements passed: the oracles checked too little"
    );
}
