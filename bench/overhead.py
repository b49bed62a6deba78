"""The extension's own cost per question, measured against a scripted model that answers at once.

bench/overhead [--tables 10] [--questions 200] [--concurrency 8] [--out FILE]

It uses the cluster in PGHOST/PGPORT/PGUSER (with the extension installed: `make install` for the
release build these numbers are about) or starts a throwaway one, creates a database of
`--tables` related tables, starts the scripted model (tests/src/bin/scripted_llm), and prints, as
p50 and p90 over the questions:

- the model's own latency, measured from here with the same request size;
- a warm question (same connection): client wall time, and the extension's own time
  (nl_trace's total, schema included, minus the time it waited for the model);
- a cold question: the first question on a new connection (library load and catalog read
  included), with the connection's own set-up timed apart;
- 2 and N concurrent questions, each on its own connection, against one at a time;
- a warm nl_schema, alone and while another session creates and drops temporary tables and runs
  ANALYZE in a loop;
- the value index on a 1M-row text column: its build (the first question after the schema is
  read) and its look-up per question (nl_schema with value_index on, minus off).
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import psycopg

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from harness import Cluster  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent
DATABASE = "sqe_overhead"


def parse_args():
    p = argparse.ArgumentParser(prog="bench/overhead", description=__doc__)
    p.add_argument("--tables", type=int, default=10)
    p.add_argument("--questions", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--out", help="also write the numbers as JSON here")
    return p.parse_args()


def percentiles(values):
    values = sorted(values)
    p = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return {"p50": round(statistics.median(values), 3), "p90": round(p(0.9), 3), "n": len(values)}


def in_threads(work, n):
    """Runs work(0) .. work(n - 1) in n threads at once; the seconds until all are done."""
    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def create_database(tables):
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        admin.execute(f"CREATE DATABASE {DATABASE}")
    with psycopg.connect(dbname=DATABASE, autocommit=True) as c:
        c.execute("CREATE EXTENSION sql_query_engine")
        for i in range(1, tables + 1):
            ref = f", parent_id int REFERENCES t{i - 1}(id)" if i > 1 else ""
            c.execute(
                f"CREATE TABLE t{i} (id int PRIMARY KEY, name text, amount numeric, "
                f"created date{ref})"
            )
            c.execute(f"COMMENT ON TABLE t{i} IS 'table number {i}'")
            parent = "g" if i > 1 else "NULL::int"
            c.execute(
                f"INSERT INTO t{i} SELECT g, 'name ' || g, g * 1.5, date '2024-01-01' + g % 365"
                f"{', ' + parent if i > 1 else ''} FROM generate_series(1, 1000) g"
            )
        c.execute("ANALYZE")


def start_model(questions):
    answers = {f"question number {n} about the tables": "SELECT count(*) AS n FROM t1" for n in questions}
    path = pathlib.Path(tempfile.mkdtemp(prefix="sqe-overhead-")) / "answers.json"
    path.write_text(json.dumps(answers))
    subprocess.run(
        ["cargo", "build", "-q", "--release", "-p", "sql_query_engine_e2e", "--bin", "scripted_llm"],
        cwd=REPO,
        check=True,
    )
    server = subprocess.Popen(
        [str(REPO / "target/release/scripted_llm"), str(path)], stdout=subprocess.PIPE, text=True
    )
    return server, server.stdout.readline().strip()


def model_latency(url, n):
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": "x" * 3000 + " question number 0 about the tables"}],
            "temperature": 0,
        }
    ).encode()
    times = []
    for _ in range(n):
        started = time.perf_counter()
        request = urllib.request.Request(url + "/chat/completions", body, {"Content-Type": "application/json"})
        urllib.request.urlopen(request).read()
        times.append((time.perf_counter() - started) * 1000)
    return percentiles(times)


def connect(url):
    c = psycopg.connect(dbname=DATABASE, autocommit=True)
    c.execute(f"SET sql_query_engine.llm_url = '{url}'")
    return c


def ask(c, question):
    """Client wall time and the extension's own time (total minus model waits), in ms."""
    started = time.perf_counter()
    (trace,) = c.execute("SELECT nl_trace(%s)", (question,)).fetchone()
    wall = (time.perf_counter() - started) * 1000
    own = trace["ms"] - sum(a["llm_ms"] for a in trace["attempts"])
    assert trace["status"] == "ok", trace
    return wall, own


def warm(url, questions):
    c = connect(url)
    for q in questions[:20]:
        ask(c, q)
    walls, owns = zip(*(ask(c, q) for q in questions))
    query_walls = []
    for q in questions:
        started = time.perf_counter()
        c.execute("SELECT * FROM nl_query(%s)", (q,)).fetchall()
        query_walls.append((time.perf_counter() - started) * 1000)
    c.close()
    return {"trace_wall": percentiles(walls), "own": percentiles(owns), "nl_query_wall": percentiles(query_walls)}


def cold(url, questions):
    """The first question on a new connection: connecting (the server forks a backend) is
    timed apart from the question, which loads the library and reads the catalog."""
    connects, walls, owns = [], [], []
    for q in questions:
        started = time.perf_counter()
        c = connect(url)
        connects.append((time.perf_counter() - started) * 1000)
        wall, own = ask(c, q)
        walls.append(wall)
        owns.append(own)
        c.close()
    return {"connect": percentiles(connects), "wall": percentiles(walls), "own": percentiles(owns)}


def concurrent(url, questions, n):
    connections = [connect(url) for _ in range(n)]
    for c in connections:
        ask(c, questions[0])
    results = [[] for _ in range(n)]

    def worker(i):
        for q in questions[i::n]:
            results[i].append(ask(connections[i], q)[0])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in connections:
        c.close()
    return percentiles([w for r in results for w in r])


def schema_under_churn(n):
    def timed(c):
        times = []
        for i in range(n):
            started = time.perf_counter()
            c.execute("SELECT nl_schema(%s)", (f"question number {i} about the tables",)).fetchone()
            times.append((time.perf_counter() - started) * 1000)
        return percentiles(times)

    c = psycopg.connect(dbname=DATABASE, autocommit=True)
    c.execute("SELECT nl_schema()")
    quiet = timed(c)
    stop = threading.Event()

    def churn():
        with psycopg.connect(dbname=DATABASE, autocommit=True) as other:
            while not stop.is_set():
                other.execute("CREATE TEMP TABLE scratch (a int)")
                other.execute("DROP TABLE scratch")
                other.execute("ANALYZE t1")

    churner = threading.Thread(target=churn)
    churner.start()
    busy = timed(c)
    stop.set()
    churner.join()
    c.close()
    return {"quiet": quiet, "churn": busy}


def value_index(n, rows=1_000_000):
    with psycopg.connect(dbname=DATABASE, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS people")
        c.execute("CREATE TABLE people (id int PRIMARY KEY, name text, city text)")
        c.execute(
            f"INSERT INTO people SELECT g, 'person ' || g, (ARRAY['Rome', 'Oslo', 'Lima', 'Kyiv'])[1 + g % 4] "
            f"FROM generate_series(1, {rows}) g"
        )
        c.execute("ANALYZE people")
    c = psycopg.connect(dbname=DATABASE, autocommit=True)
    question = "How many people named 'person 42' live in Oslo?"
    started = time.perf_counter()
    (text,) = c.execute("SELECT nl_schema(%s)", (question,)).fetchone()
    build = (time.perf_counter() - started) * 1000
    assert "found in people.name" in text and "found in people.city" in text, text

    def timed(setting):
        c.execute(f"SET sql_query_engine.value_index = {setting}")
        c.execute("SELECT nl_schema(%s)", (question,))
        times = []
        for _ in range(n):
            started = time.perf_counter()
            c.execute("SELECT nl_schema(%s)", (question,)).fetchone()
            times.append((time.perf_counter() - started) * 1000)
        return percentiles(times)

    on, off = timed("on"), timed("off")
    c.close()
    return {"rows": rows, "first_question_ms": round(build, 1), "on": on, "off": off,
            "lookup_p50_ms": round(on["p50"] - off["p50"], 3)}


def main():
    args = parse_args()
    cluster = Cluster(None)
    server = None
    try:
        create_database(args.tables)
        questions = [f"question number {n} about the tables" for n in range(args.questions)]
        server, url = start_model(range(args.questions))
        results = {
            "tables": args.tables,
            "model": model_latency(url, args.questions),
            "warm": warm(url, questions),
            "cold": cold(url, questions[: max(20, args.questions // 4)]),
            "single": concurrent(url, questions, 1),
            "concurrent_2": concurrent(url, questions, 2),
            f"concurrent_{args.concurrency}": concurrent(url, questions, args.concurrency),
            "nl_schema": schema_under_churn(args.questions),
            "value_index": value_index(args.questions),
        }
        with psycopg.connect(dbname=DATABASE) as c:
            results["server"] = c.execute("SELECT version()").fetchone()[0]
        rows = [
            ("scripted model alone (HTTP round trip)", results["model"]),
            ("warm question, nl_query wall", results["warm"]["nl_query_wall"]),
            ("warm question, extension's own time", results["warm"]["own"]),
            ("new connection (connect + SET)", results["cold"]["connect"]),
            ("cold question (first on the connection), wall", results["cold"]["wall"]),
            ("cold question, extension's own time", results["cold"]["own"]),
            ("1 question at a time, wall", results["single"]),
            ("2 concurrent questions, wall", results["concurrent_2"]),
            (f"{args.concurrency} concurrent questions, wall", results[f"concurrent_{args.concurrency}"]),
            ("warm nl_schema, quiet", results["nl_schema"]["quiet"]),
            ("warm nl_schema, under temp-table/ANALYZE churn", results["nl_schema"]["churn"]),
            ("nl_schema with the value index on a 1M-row column", results["value_index"]["on"]),
            ("nl_schema without the value index", results["value_index"]["off"]),
        ]
        print(f"| {args.tables} tables | p50 ms | p90 ms | n |\n|---|---|---|---|")
        for name, p in rows:
            print(f"| {name} | {p['p50']} | {p['p90']} | {p['n']} |")
        v = results["value_index"]
        print(f"\nvalue index, {v['rows']} rows: first question (index build) {v['first_question_ms']} ms, "
              f"look-up per question p50 {v['lookup_p50_ms']} ms")
        if args.out:
            pathlib.Path(args.out).write_text(json.dumps(results, indent=2))
    finally:
        if server:
            server.kill()
        cluster.stop()


if __name__ == "__main__":
    main()
