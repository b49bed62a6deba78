"""The benchmark harness behind bench/run: execution accuracy of sql_query_engine, measured
through a real client connection, per configuration, with latency and token counts.

Results are stored per question (OUT/questions/CONFIG/ID.json), so an interrupted run resumes
where it stopped (reusing only what the same commit and model measured); OUT/results.json and OUT/results.md are rewritten at the end.
"""

import argparse
import json
import math
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import re

import psycopg

from score import DECIMALS, gold_precision, official_result, same_result

REPO = pathlib.Path(__file__).resolve().parent.parent

#: Configurations: a name, what it means, and the settings that make it.
CONFIGS = {
    "C": ("generation only", {"max_repairs": "0", "vote": "off"}),
    "A": ("full pipeline (defaults)", {}),
    # ablations: the full pipeline without one mechanism, or with another choice
    "A-novalues": ("without the value index", {"value_index": "off"}),
    "C-novalues": ("generation only, without the value index", {"max_repairs": "0", "vote": "off", "value_index": "off"}),
    "A-novote": ("without candidates and vote", {"vote": "off"}),
    "A-mschema": ("M-Schema layout", {"schema_format": "mschema"}),
    "C-mschema": ("generation only, M-Schema layout", {"max_repairs": "0", "vote": "off", "schema_format": "mschema"}),
    "A-vote2": ("two candidates", {"candidates": "2"}),
    "A-always": ("vote after every first query", {"vote": "always"}),
    "A-abstain": ("withhold doubtful answers", {"abstain": "when_in_doubt"}),
    "A-nobudget": ("no answer budget", {"answer_budget": "2147483647"}),
    # Verified examples, leave-one-out: each question's examples are the other questions of its
    # database with their gold SQL, never the question itself (see `examples_for`).
    "C-loo3": ("generation only, 3 examples (leave-one-out)", {"max_repairs": "0", "vote": "off", "examples": "3"}),
    "C-looall": ("generation only, all examples (leave-one-out)", {"max_repairs": "0", "vote": "off", "examples": "20"}),
    "A-loo3": ("full pipeline, 3 examples (leave-one-out)", {"examples": "3"}),
    "A-looall": ("full pipeline, all examples (leave-one-out)", {"examples": "20"}),
}


def leave_one_out(config):
    return "-loo" in config


def parse_args():
    p = argparse.ArgumentParser(prog="bench/run", description=__doc__)
    p.add_argument("--bench", required=True, help="directory with dumps/, load.sh and questions")
    p.add_argument("--questions", help="questions JSONL (default: BENCH/dev.jsonl)")
    p.add_argument("--llm-url", required=True,
                   help="OpenAI-compatible base URL, or one per configuration: C=URL,A=URL")
    p.add_argument("--model", required=True, help="model name sent to the endpoint")
    p.add_argument("--configs", default="C,A", help="comma-separated: " + ", ".join(CONFIGS))
    p.add_argument("--limit", type=int, help="only the first N questions")
    p.add_argument("--ids", help="only these question ids (comma-separated)")
    p.add_argument("--suite", help="only questions of this suite")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--llm-timeout", default="600000", help="sql_query_engine.llm_timeout (ms)")
    p.add_argument("--no-load", action="store_true", help="the databases are loaded already")
    p.add_argument("--interleave", action="store_true",
                   help="ask each question in every configuration before the next question, so that "
                        "a machine that slows down during the run slows every configuration alike; "
                        "needs a model server per configuration (--llm-url C=URL,A=URL)")
    return p.parse_args()


def llm_urls(args, configs):
    """The endpoint of each configuration. One server shared by interleaved configurations would
    time each with the prompts of the one before cached (its schema prefix, its question)."""
    if not re.match(r"^[\w-]+=", args.llm_url):
        urls = {c: args.llm_url for c in configs}
    else:
        urls = dict(part.split("=", 1) for part in args.llm_url.split(",") if part.strip())
        missing = [c for c in configs if c not in urls]
        if missing:
            sys.exit(f"bench/run: no --llm-url for {', '.join(missing)}")
    if args.interleave and len({urls[c] for c in configs}) < len(configs):
        sys.exit("bench/run: --interleave needs a model server per configuration "
                 "(--llm-url C=URL1,A=URL2): on one server, each would be timed with the others' "
                 "prompts cached")
    return {c: urls[c] for c in configs}


def all_questions(args):
    path = pathlib.Path(args.questions or pathlib.Path(args.bench) / "dev.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def select_questions(args):
    questions = all_questions(args)
    if args.ids:
        wanted = set(args.ids.split(","))
        questions = [q for q in questions if q["id"] in wanted]
    if args.suite:
        questions = [q for q in questions if q["suite"] == args.suite]
    if args.limit:
        questions = questions[: args.limit]
    # Questions on one database in a row: the model server reuses the schema prefix.
    order = {q["id"]: i for i, q in enumerate(questions)}
    return sorted(questions, key=lambda q: (q["pg_database"], order[q["id"]]))


class Cluster:
    """The cluster named by PGHOST/PGPORT/PGUSER, or a throwaway one started here."""

    def __init__(self, out):
        self.own = None
        if os.environ.get("PGHOST") or os.environ.get("PGPORT"):
            return
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        directory = tempfile.mkdtemp(prefix="sqe-bench-", dir="/tmp")
        subprocess.run(["bash", str(REPO / "scripts/pg-cluster.sh"), "start", directory, str(port)], check=True)
        self.own = directory
        os.environ.update(PGHOST=directory, PGPORT=str(port), PGUSER="postgres")

    def stop(self):
        if self.own:
            subprocess.run(["bash", str(REPO / "scripts/pg-cluster.sh"), "stop", self.own], check=False)
            subprocess.run(["rm", "-rf", self.own], check=False)


def connect(database):
    return psycopg.connect(dbname=database, autocommit=True)


def load_databases(bench, databases):
    subprocess.run(["sh", str(pathlib.Path(bench) / "load.sh"), *databases], check=True, stdout=subprocess.DEVNULL)
    for database in databases:
        with connect(database) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS sql_query_engine")


def run_rows(conn, sql, timeout_ms=60000):
    """Rows of `sql`, read-only, in a transaction that is rolled back."""
    with conn.transaction(force_rollback=True):
        conn.execute("SET TRANSACTION READ ONLY")
        conn.execute(f"SET LOCAL statement_timeout = {int(timeout_ms)}")
        return [list(row) for row in conn.execute(sql).fetchall()]


def asked_text(question):
    """The question as it is asked: BIRD's evidence follows it as a hint."""
    text = question["question"]
    if question.get("evidence"):
        text += "\nHint: " + question["evidence"]
    return text


def examples_for(conn, question, config, everything):
    """Makes the database's verified examples what `config` measures with: none, or (leave-one-
    out) every other question of the same database with its gold SQL. Returns how many."""
    conn.execute("DELETE FROM nl_examples")
    if not leave_one_out(config):
        return 0
    added = 0
    for other in everything:
        if other["pg_database"] != question["pg_database"] or other["id"] == question["id"]:
            continue
        try:
            conn.execute("SELECT nl_example_add(%s, %s)", [asked_text(other), other["gold_sql"]])
            added += 1
        except psycopg.Error:
            continue  # a gold query the guard refuses is no example
    return added


def ask(conn, question, config, args, everything, llm_url):
    """One question through nl_trace, then its rows; a record of what happened."""
    settings = {"llm_url": llm_url, "llm_model": args.model, "llm_timeout": args.llm_timeout}
    settings.update(CONFIGS[config][1])
    conn.execute("RESET ALL")
    examples = examples_for(conn, question, config, everything)
    for name, value in settings.items():
        conn.execute("SELECT set_config(%s, %s, false)", [f"sql_query_engine.{name}", value])
    text = asked_text(question)
    record = {"id": question["id"], "config": config, "suite": question["suite"],
              "difficulty": question.get("difficulty") or "unrated", "db": question["pg_database"],
              "examples": examples}
    started = time.monotonic()
    try:
        trace = conn.execute("SELECT nl_trace(%s)", [text]).fetchone()[0]
    except psycopg.Error as e:
        record.update(correct=False, status="failed", error=f"{e.sqlstate}: {e}".strip(),
                      ms=round((time.monotonic() - started) * 1000, 1), attempts=0,
                      llm_calls=0, prompt_tokens=0, completion_tokens=0, sql=None)
        return record
    record.update(
        ms=round((time.monotonic() - started) * 1000, 1), status=trace["status"], sql=trace["sql"],
        attempts=len(trace["attempts"]), llm_calls=trace["llm_calls"],
        prompt_tokens=trace["prompt_tokens"], completion_tokens=trace["completion_tokens"],
        # The model's time for the first query: the rest of `ms` is the extension's and the
        # database's (a vote's candidates share one request, so later attempts do not add up).
        first_llm_ms=trace["attempts"][0]["llm_ms"] if trace["attempts"] else None,
        outcomes=[a["outcome"] for a in trace["attempts"]],
        candidates=[bool(a.get("candidate")) for a in trace["attempts"]], vote=trace.get("vote"),
        errors=[f"{a['sqlstate']}: {a['message']}" for a in trace["attempts"] if a.get("sqlstate")],
        answered_by=trace.get("answered_by"), out_of_time=trace.get("out_of_time", False),
        confidence=(trace.get("confidence") or {}).get("level"),
        doubts=(trace.get("confidence") or {}).get("doubts"),
        questioned=[[m for m in a.get("questioned") or []] for a in trace["attempts"]],
        requalified=[list(a.get("requalified") or []) for a in trace["attempts"]],
    )
    record["correct"] = record["correct_at_precision"] = record["correct_official"] = False
    if trace["status"] in ("ok", "empty") and trace["sql"]:
        try:
            predicted = run_rows(conn, trace["sql"])
        except psycopg.Error as e:
            record["error"] = f"re-running the answer failed: {e}"
            return record
        record["correct"] = matches_gold(conn, question, predicted)
        precision = gold_precision(question["gold_sql"])
        record["correct_at_precision"] = record["correct"] or (
            precision is not None and matches_gold(conn, question, predicted, precision)
        )
        suite = question.get("suite", "")
        record["correct_official"] = matches_gold(
            conn, question, predicted,
            compare=lambda p, g, ordered, decimals: official_result(p, g, suite, ordered, decimals),
        )
    return record


def matches_gold(conn, question, predicted, decimals=DECIMALS, compare=same_result):
    # A gold ORDER BY with ties fixes the order only up to the ties: such questions compare as
    # multisets.
    ordered = bool(question.get("gold_ordered")) and not question.get("nondeterministic_order")
    if question.get("time_dependent") or question.get("gold_result_truncated"):
        gold = run_rows(conn, question["gold_sql"])
    else:
        gold = question["gold_result"]
    if compare(predicted, gold, ordered, decimals):
        return True
    # Benchmarks that list equivalent gold queries (defog) accept any of them.
    for variant in question.get("gold_sql_variants") or []:
        try:
            if compare(predicted, run_rows(conn, variant), ordered, decimals):
                return True
        except psycopg.Error:
            continue
    return False


def wilson(correct, n, z=1.96):
    """The 95 % Wilson score interval of a proportion, as fractions."""
    if not n:
        return None
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def percentile(values, p):
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return round(values[lo] + (values[hi] - values[lo]) * (k - lo), 1)


def summarize(records, questions):
    nondeterministic = {q["id"] for q in questions if q.get("nondeterministic_rows")}
    scored = [r for r in records if r["id"] not in nondeterministic]

    def ex(rs, key="correct"):
        return round(sum(r.get(key, False) for r in rs) / len(rs), 4) if rs else None

    def grouped(key):
        groups = {}
        for r in scored:
            groups.setdefault(r[key], []).append(r)
        return {
            k: {"ex": ex(v), "n": len(v), "ci95": wilson(sum(r["correct"] for r in v), len(v)),
                "ex_official": ex(v, "correct_official")}
            for k, v in sorted(groups.items())
        }

    sure = [r for r in scored if r.get("confidence") == "high"]
    # The selective-accuracy curve: answering only what has at most d doubts (0 = the answers
    # abstain = when_in_doubt gives), for every d seen; the last point answers everything.
    most = max((len(r.get("doubts") or []) for r in scored), default=0)
    curve = []
    for d in range(most + 1):
        answered = [r for r in scored if len(r.get("doubts") or []) <= d]
        curve.append({"max_doubts": d, "answered_share": round(len(answered) / len(scored), 4),
                      "ex_answered": ex(answered), "n": len(answered)})
    # The same by the vote's agreement (abstain = when_in_doubt puts every first query to a
    # vote): answering what at least k alternatives agreed on, and nothing else doubted; the
    # default is a majority.
    def agreement(r):
        vote = r.get("vote") or {}
        return min(vote.get("agreed") or 0, vote.get("alternatives") or 0)
    def other_doubts(r):
        return [d for d in (r.get("doubts") or []) if "did not agree" not in d]
    most_alternatives = max(((r.get("vote") or {}).get("alternatives") or 0 for r in scored), default=0)
    agreement_curve = []
    for k in range(1, most_alternatives + 1):
        answered = [r for r in scored if not other_doubts(r) and (not r.get("vote") or agreement(r) >= k)]
        agreement_curve.append({"min_agreed": k, "answered_share": round(len(answered) / len(scored), 4),
                                "ex_answered": ex(answered), "n": len(answered),
                                "ci95": wilson(sum(r["correct"] for r in answered), len(answered))})
    ms = [r["ms"] for r in records]
    total_minutes = sum(ms) / 60000
    n = len(records) or 1
    return {
        "ex": ex(scored), "n": len(scored), "correct": sum(r["correct"] for r in scored),
        "ci95": wilson(sum(r["correct"] for r in scored), len(scored)),
        "ex_at_gold_precision": ex(scored, "correct_at_precision"),
        "ex_official": ex(scored, "correct_official"),
        # What abstain = when_in_doubt would answer: the share answered, and EX on those.
        "answered_share": round(len(sure) / len(scored), 4) if scored else None,
        "ex_answered": ex(sure), "ci95_answered": wilson(sum(r["correct"] for r in sure), len(sure)),
        "selective_curve": curve, "agreement_curve": agreement_curve,
        "ci95_official": wilson(sum(r.get("correct_official", False) for r in scored), len(scored)),
        "excluded": {"nondeterministic_rows": sorted(nondeterministic & {r["id"] for r in records})},
        "by_suite": grouped("suite"), "by_difficulty": grouped("difficulty"),
        "nondeterministic_rows": {"n": len(records) - len(scored),
                                  "correct": sum(r["correct"] for r in records if r["id"] in nondeterministic)},
        "p50_ms": percentile(ms, 50), "p90_ms": percentile(ms, 90),
        "questions_per_minute": round(len(records) / total_minutes, 2) if total_minutes else None,
        "llm_calls_per_question": round(sum(r["llm_calls"] for r in records) / n, 2),
        "prompt_tokens_per_question": round(sum(r["prompt_tokens"] for r in records) / n, 1),
        "completion_tokens_per_question": round(sum(r["completion_tokens"] for r in records) / n, 1),
        "attempts_per_question": round(sum(r["attempts"] for r in records) / n, 2),
        "failed_calls": sum(r["status"] == "failed" for r in records),
    }


def markdown(results, args):
    configs = list(results["configs"])
    meta = results["meta"]
    lines = [f"# Benchmark results\n",
             f"- questions: {args.questions or 'dev.jsonl'}; model `{args.model}` at {args.llm_url}"
             + ("; configurations interleaved question by question" if args.interleave else ""),
             f"- commit {meta['commit']}; settings per configuration: {json.dumps(meta['settings'])}",
             f"- excluded from scoring: {json.dumps(meta['excluded'])}", ""]
    header = "| | " + " | ".join(f"{c}: {CONFIGS[c][0]}" for c in configs) + " |"
    lines += [header, "|---" * (len(configs) + 1) + "|"]

    def row(label, f):
        lines.append(f"| {label} | " + " | ".join(f(results["configs"][c]) for c in configs) + " |")

    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f} %"
    ci = lambda s: "" if not s.get("ci95") else f" [{100 * s['ci95'][0]:.1f}-{100 * s['ci95'][1]:.1f}]"
    row("EX (execution accuracy), 95 % interval", lambda s: f"{pct(s['ex'])} ({s['correct']}/{s['n']}){ci(s)}")
    row("EX at the gold's precision", lambda s: pct(s.get("ex_at_gold_precision")))
    ci_official = lambda s: "" if not s.get("ci95_official") else f" [{100 * s['ci95_official'][0]:.1f}-{100 * s['ci95_official'][1]:.1f}]"
    row("EX under each suite's official rule (spider: columns in any order; defog: extra columns accepted; bird: rows as a set)",
        lambda s: pct(s.get("ex_official")) + ci_official(s))
    row("abstain = when_in_doubt: answered share / EX on the answered",
        lambda s: "n/a" if s.get("answered_share") is None else f"{pct(s['answered_share'])} / {pct(s.get('ex_answered'))}" + (f" [{100 * s['ci95_answered'][0]:.1f}-{100 * s['ci95_answered'][1]:.1f}]" if s.get("ci95_answered") else ""))
    row("selective accuracy (answered share -> EX on the answered, by doubts allowed)",
        lambda s: "; ".join(f"{pct(p['answered_share'])} -> {pct(p['ex_answered'])}"
                            for p in s.get("selective_curve", [])) or "n/a")
    row("selective accuracy by the vote's agreement (at least k alternatives: answered share -> EX on the answered)",
        lambda s: "; ".join(f"k={p['min_agreed']}: {pct(p['answered_share'])} -> {pct(p['ex_answered'])}"
                            for p in s.get("agreement_curve", [])) or "n/a")
    suites = sorted({k for c in configs for k in results["configs"][c]["by_suite"]})
    for suite in suites:
        row(f"EX {suite} (strict / official)", lambda s, k=suite: pct(s["by_suite"].get(k, {}).get("ex")) + " / " + pct(s["by_suite"].get(k, {}).get("ex_official")) + f" (n={s['by_suite'].get(k, {}).get('n', 0)})")
    levels = sorted({k for c in configs for k in results["configs"][c]["by_difficulty"]})
    for level in levels:
        row(f"EX {level}", lambda s, k=level: pct(s["by_difficulty"].get(k, {}).get("ex")) + f" (n={s['by_difficulty'].get(k, {}).get('n', 0)})")
    row("latency p50 / p90", lambda s: f"{s['p50_ms'] / 1000:.1f} s / {s['p90_ms'] / 1000:.1f} s" if s["p50_ms"] is not None else "n/a")
    row("questions per minute", lambda s: str(s["questions_per_minute"]))
    row("LLM calls per question", lambda s: str(s["llm_calls_per_question"]))
    row("prompt / completion tokens per question", lambda s: f"{s['prompt_tokens_per_question']:.0f} / {s['completion_tokens_per_question']:.0f}")
    if "healed" in results:
        lines += ["", f"Healed (wrong in C, right in A): {len(results['healed'])}: {', '.join(results['healed']) or '-'}",
                  f"Regressed (right in C, wrong in A): {len(results['regressed'])}: {', '.join(results['regressed']) or '-'}"]
    return "\n".join(lines) + "\n"


def progress(config, done, total, records):
    correct = sum(r["correct"] for r in records)
    width = 30
    filled = int(width * done / total) if total else width
    sys.stderr.write(f"\r[{config}] [{'#' * filled}{'.' * (width - filled)}] {done}/{total}  EX {correct}/{len(records) or 1} = {100 * correct / (len(records) or 1):.1f} %   ")
    sys.stderr.flush()


def commit():
    """The commit measured, with a mark when the work tree differs from it."""
    def git(*a):
        return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def main():
    args = parse_args()
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        sys.exit(f"bench/run: unknown configuration {', '.join(unknown)}; known: {', '.join(CONFIGS)}")
    questions = select_questions(args)
    everything = all_questions(args)
    if not questions:
        sys.exit("bench/run: no questions selected")
    out = pathlib.Path(args.out)
    cluster = Cluster(out)
    try:
        databases = sorted({q["pg_database"] for q in questions})
        if not args.no_load:
            load_databases(args.bench, databases)
        urls = llm_urls(args, configs)
        measured_with = {"commit": commit(), "model": args.model, "llm_url": args.llm_url}
        # Each configuration has backends of its own, new at its start: a backend's schema
        # context and value index are built by its first question, and a configuration that
        # found them built would be timed without that cost.
        connections = {c: {} for c in configs}
        all_records = {c: [] for c in configs}

        def measure(config, question):
            directory = out / "questions" / config
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / f"{question['id']}.json"
            record = json.loads(path.read_text()) if path.exists() else None
            # An interrupted run resumes only with what the same commit and model measured.
            if not record or record.get("measured_with") != measured_with:
                db = question["pg_database"]
                if db not in connections[config]:
                    connections[config][db] = connect(db)
                record = ask(connections[config][db], question, config, args, everything, urls[config])
                record["measured_with"] = measured_with
                path.write_text(json.dumps(record, indent=1, default=str))
            all_records[config].append(record)

        if args.interleave:
            for i, question in enumerate(questions):
                # Every other question the other way round: neither configuration always runs
                # right after the other.
                for config in configs if i % 2 == 0 else configs[::-1]:
                    measure(config, question)
                progress(",".join(configs), i + 1, len(questions), all_records[configs[0]])
            sys.stderr.write("\n")
        else:
            for config in configs:
                for i, question in enumerate(questions):
                    measure(config, question)
                    progress(config, i + 1, len(questions), all_records[config])
                sys.stderr.write("\n")
                for conn in connections[config].values():
                    conn.close()
                connections[config] = {}
        results = {"configs": {c: summarize(r, questions) for c, r in all_records.items()}}
        results["meta"] = {
            "commit": measured_with["commit"],  # the commit at the start: what every record measured
            "model": args.model,
            "llm_url": args.llm_url,
            "interleaved": args.interleave,
            "questions": len(questions),
            "settings": {c: {"llm_timeout": args.llm_timeout, **CONFIGS[c][1]} for c in configs},
            "excluded": {
                "nondeterministic_rows (results not determined by the gold query)": sorted(
                    q["id"] for q in questions if q.get("nondeterministic_rows")
                )
            },
        }
        if "C" in all_records and "A" in all_records:
            c_ok = {r["id"] for r in all_records["C"] if r["correct"]}
            a_ok = {r["id"] for r in all_records["A"] if r["correct"]}
            results["healed"] = sorted(a_ok - c_ok)
            results["regressed"] = sorted(c_ok - a_ok)
        results["questions"] = [r for rs in all_records.values() for r in rs]
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
        (out / "results.md").write_text(markdown(results, args))
        print((out / "results.md").read_text())
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
