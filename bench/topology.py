"""Throughput and latency of a scaled-out deployment against the same load on one server.

bench/topology [--conversations 32] [--turns 5] [--model-ms 200] [--out FILE]

Each configuration is started for real with scripts/topology.sh (release builds of the
gateway and the scripted model; the extension as installed, `make install`), loaded with
`--conversations` concurrent chat conversations of `--turns` turns, half keeping their context on
the server (X-Sqe-Session), half sending it with every request, each turn sent to a random
gateway; the scripted model takes `--model-ms` per answer (a model that thinks). Prints, per
configuration, turns per second and the p50 and p90 of a turn, as a Markdown table.
"""

import argparse
import json
import os
import pathlib
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from overhead import REPO, in_threads, percentiles  # noqa: E402

# Both have 64 connections for questions: one gateway with 64 to the primary, and two with 16
# to each of two standbys.
CONFIGURATIONS = {
    "one server: 1 gateway (pool 64), the primary, no Redis": [
        "--standbys", "0", "--gateways", "1", "--no-redis", "--no-pgbouncer", "--pool-size", "64"],
    "scaled out: 2 gateways (pool 16 per server), pgbouncer, 2 standbys, Redis": [
        "--pool-size", "16"],
}


def parse_args():
    p = argparse.ArgumentParser(prog="bench/topology", description=__doc__)
    p.add_argument("--conversations", type=int, default=32)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--model-ms", type=int, default=200)
    p.add_argument("--out")
    return p.parse_args()


def start_model(delay_ms):
    answers = pathlib.Path(tempfile.mkdtemp()) / "answers.json"
    answers.write_text(json.dumps({"how many orders": "SELECT count(*) AS n FROM orders"}))
    subprocess.run(["cargo", "build", "-q", "--release", "-p", "sql_query_engine_e2e",
                    "--bin", "scripted_llm"], cwd=REPO, check=True)
    server = subprocess.Popen([str(REPO / "target/release/scripted_llm"), str(answers),
                               str(delay_ms)], stdout=subprocess.PIPE, text=True)
    return server, server.stdout.readline().strip()


def chat(base, token, messages, session):
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    if session:
        headers["X-Sqe-Session"] = session
    body = json.dumps({"model": "shop", "messages": messages}).encode()
    request = urllib.request.Request(f"{base}/v1/chat/completions", body, headers)
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())["choices"][0]["message"]["content"]


def load(gateways, token, conversations, turns):
    times, failures = [], []
    lock = threading.Lock()

    def conversation(c):
        rng = random.Random(c)
        messages = []
        server_side = c % 2 == 0
        for turn in range(1, turns + 1):
            asked = {"role": "user", "content": f"conversation {c} turn {turn}: how many orders?"}
            sent = [asked] if server_side else messages + [asked]
            started = time.perf_counter()
            try:
                content = chat(rng.choice(gateways), token, sent,
                               f"bench-{c}" if server_side else None)
            except (urllib.error.URLError, OSError) as e:
                with lock:
                    failures.append(str(e))
                continue
            with lock:
                times.append((time.perf_counter() - started) * 1000)
            messages += [asked, {"role": "assistant", "content": content}]

    seconds = in_threads(conversation, conversations)
    return {**percentiles(times), "turns_per_second": round(len(times) / seconds, 1),
            "failed": len(failures)}


def main():
    args = parse_args()
    subprocess.run(["cargo", "build", "-q", "--release", "-p", "sqe-gateway"], cwd=REPO, check=True)
    model, llm_url = start_model(args.model_ms)
    results = {}
    try:
        for name, options in CONFIGURATIONS.items():
            directory = tempfile.mkdtemp(prefix="sqe-bench-topology-")
            script = str(REPO / "scripts/topology.sh")
            try:
                subprocess.run(["bash", script, "start", directory, "--llm-url", llm_url,
                                "--gateway-bin", str(REPO / "target/release/sqe-gateway"),
                                *options], check=True, stdout=subprocess.DEVNULL)
                env = dict(pair.split("=", 1) for pair in
                           pathlib.Path(directory, "topology.env").read_text().split())
                gateways = [f"http://127.0.0.1:{env[f'GATEWAY{n}_PORT']}"
                            for n in range(1, int(env["GATEWAYS"]) + 1)]
                load(gateways, env["TOKEN"], 4, 2)  # warm-up: libraries loaded, caches filled
                results[name] = load(gateways, env["TOKEN"], args.conversations, args.turns)
            finally:
                subprocess.run(["bash", script, "stop", directory], check=False)
                subprocess.run(["rm", "-rf", directory], check=False)
    finally:
        model.kill()
    print(f"{args.conversations} conversations x {args.turns} turns, the model taking "
          f"{args.model_ms} ms per answer\n")
    print("| configuration | turns/s | p50 ms | p90 ms | n | failed |\n|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['turns_per_second']} | {r['p50']} | {r['p90']} | {r['n']} | "
              f"{r['failed']} |")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
