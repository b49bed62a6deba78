"""The gateway's own cost per request and its behaviour under concurrency, against a scripted
model that answers at once.

bench/gateway [--questions 200] [--clients 32] [--out FILE]

Uses the cluster in PGHOST/PGPORT/PGUSER (extension installed) or a throwaway one; creates the
overhead database (bench/overhead.py), an authenticator role and a token, builds and starts the
scripted model and sqe-gateway (release builds), and prints, as p50 and p90:

- the same question as `SELECT nl_ask(...)` on a direct connection, and as a chat completion
  through the gateway: the difference is the gateway's own cost (HTTP, JSON, role switch,
  Markdown);
- a streamed completion (time to the last byte);
- `--clients` clients at once, each asking its questions in a loop: per-request latency and
  requests per second.
"""

import argparse
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import psycopg

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from harness import Cluster  # noqa: E402
from overhead import DATABASE, REPO, create_database, in_threads, percentiles, start_model  # noqa: E402

TOKEN = "bench-token-0123456789abcdef"


def parse_args():
    p = argparse.ArgumentParser(prog="bench/gateway", description=__doc__)
    p.add_argument("--questions", type=int, default=200)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--out")
    return p.parse_args()


def start_gateway(llm_url):
    with psycopg.connect(dbname=DATABASE, autocommit=True) as c:
        c.execute("DROP ROLE IF EXISTS bench_authenticator")
        c.execute("DROP ROLE IF EXISTS bench_reader")
        c.execute("CREATE ROLE bench_reader")
        c.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO bench_reader")
        c.execute("CREATE ROLE bench_authenticator LOGIN NOINHERIT")
        c.execute("GRANT bench_reader TO bench_authenticator")
        c.execute(f"ALTER DATABASE {DATABASE} SET sql_query_engine.llm_url = '{llm_url}'")
    subprocess.run(["cargo", "build", "-q", "--release", "-p", "sqe-gateway"], cwd=REPO, check=True)
    # A file only this user may read (mkdtemp makes the directory 0700).
    tokens = pathlib.Path(tempfile.mkdtemp(prefix="sqe-bench-")) / "tokens"
    tokens.write_text(f"{TOKEN} bench_reader\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = (
        f"host={os.environ['PGHOST']} port={os.environ['PGPORT']} "
        f"user=bench_authenticator dbname={DATABASE}"
    )
    gateway = subprocess.Popen(
        [str(REPO / "target/release/sqe-gateway"), "serve", "--listen", f"127.0.0.1:{port}",
         "--database-url", url, "--tokens", str(tokens), "--pool-size", str(max(8, 32))],
        stderr=subprocess.DEVNULL,
    )
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            time.sleep(0.05)
    return gateway, f"http://127.0.0.1:{port}"


def chat(base, question, stream=False):
    body = json.dumps({"model": DATABASE, "stream": stream,
                       "messages": [{"role": "user", "content": question}]}).encode()
    request = urllib.request.Request(
        f"{base}/v1/chat/completions", body,
        {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request) as response:
        response.read()
    return (time.perf_counter() - started) * 1000


def direct(questions):
    c = psycopg.connect(dbname=DATABASE, autocommit=True)
    c.execute("SET ROLE bench_reader")
    times = []
    for q in questions:
        started = time.perf_counter()
        c.execute("SELECT nl_ask(%s)", (q,)).fetchone()
        times.append((time.perf_counter() - started) * 1000)
    c.close()
    return percentiles(times)


def concurrent(base, questions, clients):
    results = [[] for _ in range(clients)]

    def worker(i):
        for q in questions[i::clients] or questions[:1]:
            results[i].append(chat(base, q))

    seconds = in_threads(worker, clients)
    times = [t for r in results for t in r]
    return {**percentiles(times), "requests_per_second": round(len(times) / seconds, 1)}


def main():
    args = parse_args()
    cluster = Cluster(None)
    server = gateway = None
    try:
        create_database(10)
        questions = [f"question number {n} about the tables" for n in range(args.questions)]
        server, llm_url = start_model(range(args.questions))
        gateway, base = start_gateway(llm_url)
        for q in questions[:20]:
            chat(base, q)
        results = {
            "direct nl_ask": direct(questions),
            "gateway chat completion": percentiles([chat(base, q) for q in questions]),
            "gateway streamed completion": percentiles([chat(base, q, True) for q in questions]),
            f"{args.clients} clients at once": concurrent(base, questions * 2, args.clients),
        }
        print("| | p50 ms | p90 ms | n |\n|---|---|---|---|")
        for name, p in results.items():
            extra = f" ({p['requests_per_second']} requests/s)" if "requests_per_second" in p else ""
            print(f"| {name}{extra} | {p['p50']} | {p['p90']} | {p['n']} |")
        if args.out:
            pathlib.Path(args.out).write_text(json.dumps(results, indent=2))
    finally:
        for process in (gateway, server):
            if process:
                process.kill()
        cluster.stop()


if __name__ == "__main__":
    main()
