"""Schema-context measurements: introspection cost on a large generated schema, tokens per
benchmark schema, and retrieval recall under budgets small enough to prune.

Usage (through the bench venv, see bench/run):
    bench/schema-report --bench DIR [--tables 1000 --columns 20] --out FILE.md
Uses the cluster named by PGHOST/PGPORT/PGUSER, with the extension installed.
"""

import argparse
import json
import pathlib
import re
import shutil
import socket
import statistics
import subprocess
import time

import psycopg

SCALE_DB = "sqe_schema_scale"
CREATED = re.compile(r"^CREATE (?:TABLE|VIEW|MATERIALIZED VIEW|FOREIGN TABLE) (\S+) \(", re.M)


def connect(database):
    return psycopg.connect(dbname=database, autocommit=True)


def timed(conn, sql, params=()):
    started = time.perf_counter()
    value = conn.execute(sql, params).fetchone()[0]
    return (time.perf_counter() - started) * 1000, value


def tokens(text):
    return (len(text) + 3) // 4


def scale(tables, columns):
    """A generated schema: `tables` tables of `columns` columns, each referencing the previous."""
    with connect("postgres") as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {SCALE_DB} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {SCALE_DB}")
    with connect(SCALE_DB) as conn:
        conn.execute("CREATE EXTENSION sql_query_engine")
        for t in range(tables):
            cols = ", ".join(
                f"c{c}_{t} {'text' if c % 3 == 0 else 'integer'}" for c in range(columns - 2)
            )
            ref = f", parent_id integer REFERENCES t{t - 1}(id)" if t else ", parent_id integer"
            conn.execute(f"CREATE TABLE t{t} (id integer PRIMARY KEY{ref}, {cols})")
            conn.execute(f"COMMENT ON TABLE t{t} IS 'generated table number {t}'")
            values = ", ".join(
                "(" + ", ".join([str(r), "NULL"] + [f"'v{r % 4}'" if c % 3 == 0 else str(r) for c in range(columns - 2)]) + ")"
                for r in range(5)
            )
            conn.execute(f"INSERT INTO t{t} VALUES {values}")
        conn.execute("ANALYZE")
    rows = []
    question = "What is the sum of c1_500 in t500 for each c0_500?"
    for label, settings in [("samples on", ""), ("sample_values = 0", "SET sql_query_engine.sample_values = 0")]:
        with connect(SCALE_DB) as conn:  # a new backend: a cold cache
            if settings:
                conn.execute(settings)
            cold_all, full = timed(conn, "SELECT nl_schema()")
            warm_all, _ = timed(conn, "SELECT nl_schema()")
        with connect(SCALE_DB) as conn:
            if settings:
                conn.execute(settings)
            cold_q, pruned = timed(conn, "SELECT nl_schema(%s)", (question,))
            warm = [timed(conn, "SELECT nl_schema(%s)", (question,))[0] for _ in range(20)]
            round_trip = statistics.median(timed(conn, "SELECT 1")[0] for _ in range(20))
        rows.append((label, cold_all, warm_all, cold_q, statistics.median(warm), round_trip, tokens(full), tokens(pruned)))
    shared = shared_value_reads(question)
    lines = [
        f"### Introspection: {tables} tables x {columns} columns, foreign keys, comments, analyzed\n",
        "| | cold, whole schema | warm, whole schema | cold, one question (retrieval) | warm, one question (median of 20) | client round trip | tokens, whole | tokens, after retrieval |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, cold_all, warm_all, cold_q, warm_q, rt, full, pruned in rows:
        lines.append(
            f"| {label} | {cold_all:.0f} ms | {warm_all:.1f} ms | {cold_q:.0f} ms | {warm_q:.2f} ms | {rt:.2f} ms | {full} | {pruned} |"
        )
    if shared:
        first, later = shared
        lines += [
            "",
            "Cold, one question, with the value index's reads shared through Redis (a redis-server "
            f"started for it): the first new backend reads the tables and shares its reads, {first:.0f} ms; "
            f"a later new backend takes them, median of 5: {later:.0f} ms.",
        ]
    return "\n".join(lines) + "\n"


def shared_value_reads(question):
    """A new backend's cold question when another backend shared its value reads through Redis:
    (the first backend's time, the median of 5 later new backends), or None without
    redis-server."""
    if not shutil.which("redis-server"):
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        url = f"redis://127.0.0.1:{port}/0"

        def cold():
            with connect(SCALE_DB) as conn:
                conn.execute(f"SET sql_query_engine.redis_url = '{url}'")
                return timed(conn, "SELECT nl_schema(%s)", (question,))[0]

        first = cold()
        return first, statistics.median(cold() for _ in range(5))
    finally:
        redis.kill()


def gold_relations(conn, sql):
    """Tables a query reads, from the plan PostgreSQL makes for it (never executed)."""
    plan = conn.execute(f"EXPLAIN (FORMAT JSON) {sql}").fetchone()[0]
    found = set()

    def walk(node):
        if isinstance(node, dict):
            if "Relation Name" in node:
                found.add(node["Relation Name"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(plan)
    return found


def benchmark(bench, fractions):
    questions = [json.loads(l) for l in (pathlib.Path(bench) / "dev.jsonl").read_text().splitlines() if l.strip()]
    databases = sorted({q["pg_database"] for q in questions} | {p.stem for p in (pathlib.Path(bench) / "dumps").glob("*.sql")})
    subprocess.run(["sh", str(pathlib.Path(bench) / "load.sh"), *databases], check=True, stdout=subprocess.DEVNULL)
    sizes = {}
    for db in databases:
        with connect(db) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS sql_query_engine")
            sizes[db] = tokens(conn.execute("SELECT nl_schema()").fetchone()[0])
    lines = [
        f"### Tokens per schema ({len(databases)} benchmark databases, sample values on)\n",
        f"min {min(sizes.values())}, median {statistics.median(sizes.values()):.0f}, "
        f"mean {statistics.mean(sizes.values()):.0f}, max {max(sizes.values())} "
        f"({max(sizes, key=sizes.get)}); total {sum(sizes.values())}\n",
        "### Retrieval recall on the dev questions\n",
        "Budget as a fraction of each database's whole schema (in tokens): a question counts when every "
        "table its gold SQL reads is in the prompt.\n",
        "| budget | questions | all gold tables kept | tables kept (mean) | tokens kept (mean) |",
        "|---|---|---|---|---|",
    ]
    for fraction in fractions:
        kept_all, table_share, token_share, n = 0, [], [], 0
        for q in questions:
            db = q["pg_database"]
            with connect(db) as conn:
                gold = gold_relations(conn, q["gold_sql"])
                conn.execute(f"SET sql_query_engine.prompt_budget = {max(100, int(sizes[db] * fraction))}")
                text = conn.execute("SELECT nl_schema(%s)", (q["question"],)).fetchone()[0]
                total = len(CREATED.findall(conn.execute("SELECT nl_schema()").fetchone()[0]))
            shown = {m.group(1).split(".")[-1].strip('"') for m in CREATED.finditer(text)}
            n += 1
            kept_all += gold <= shown
            table_share.append(len(shown) / max(total, 1))
            token_share.append(tokens(text) / sizes[db])
        lines.append(
            f"| {int(fraction * 100)} % | {n} | {kept_all} ({100 * kept_all / n:.0f} %) | "
            f"{100 * statistics.mean(table_share):.0f} % | {100 * statistics.mean(token_share):.0f} % |"
        )
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bench", help="benchmark directory (dumps/, load.sh, dev.jsonl)")
    p.add_argument("--tables", type=int, default=1000)
    p.add_argument("--columns", type=int, default=20)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    report = ["## Schema context measurements\n", scale(args.tables, args.columns)]
    if args.bench:
        report.append(benchmark(args.bench, [0.5, 0.25]))
    pathlib.Path(args.out).write_text("\n".join(report))
    print("\n".join(report))


if __name__ == "__main__":
    main()
