//! Generated inputs for the guard, driven through `nl_check` in a real backend: statements of the
//! adversarial corpus, mutated (cut, repeated, spliced, salted with dangerous tokens). For each,
//! the backend must answer (pass, or refuse with an ERROR) and survive; and whatever passes is
//! cross-checked by an independent oracle: its plan (EXPLAIN VERBOSE, never executed) must not
//! write, lock, or call anything the guard is meant to keep out.
//!
//! `SQE_FUZZ_ITERATIONS` (default 3000) and `SQE_FUZZ_SEED` make longer or other runs.

#[allow(dead_code)]
#[path = "../../pg_test/guard_corpus.rs"]
mod guard_corpus;

use sql_query_engine_e2e::Session;

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
];

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
    "insert on",
    "update on",
    "delete on",
    "merge on",
    "lockrows",
    "pg_catalog.pg_",
    "information_schema.",
];

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
        .batch_execute("SET search_path = sqe_corpus, public")
        .unwrap();
    let statements: Vec<&str> = guard_corpus::CASES.iter().map(|(sql, _)| *sql).collect();
    let mut rng = Rng(seed);
    let (mut passed, mut refused, mut findings) = (0usize, 0usize, Vec::new());
    for _ in 0..iterations {
        let sql = mutate(&mut rng, &statements);
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
            }
        }
    }
    eprintln!("guard fuzz: {iterations} statements (seed {seed}): {passed} passed, {refused} refused, {} findings", findings.len());
    assert!(findings.is_empty(), "{}", findings.join("\n\n"));
    assert_eq!(s.scalar_i64("SELECT count(*) FROM sqe_corpus.t"), 0);
}
