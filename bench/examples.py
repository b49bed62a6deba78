"""What the verified examples cost a question, with few or many of them.

bench/examples [--counts 10,1000,100000] [--questions 200] [--out FILE]

For each count it fills nl_examples with that many generated examples (questions over a small
vocabulary, so that many share words with the questions asked), then times `nl_schema(question)`
(which looks the most similar examples up, and renders the schema and the examples as the prompt
shows them) over `--questions` different questions on one warm connection, and prints p50 and p90
in milliseconds. The schema is cached, so the difference between counts is the look-up.
"""

import argparse
import json
import pathlib
import random
import statistics
import sys
import time

import psycopg

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from harness import Cluster, connect  # noqa: E402

DATABASE = "sqe_examples_bench"
VERBS = ["how many", "list", "total", "average", "top 5", "count of", "which", "show"]
FILTERS = ["in 2023", "in 2024", "per month", "per country", "by revenue", "last week",
           "above 100", "with a refund", "not shipped", "from Germany"]
SYLLABLES = ["ka", "lo", "mi", "ne", "tu", "ri", "sa", "po", "de", "gu", "va", "zo"]


def nouns(rng, n=3000):
    """A deployment's vocabulary of table, column and value words (pronounceable, distinct)."""
    words = set()
    while len(words) < n:
        words.add("".join(rng.choice(SYLLABLES) for _ in range(4)))
    return sorted(words)


NOUNS = nouns(__import__("random").Random(7))


def question(rng):
    """A question in the shape analysts ask them: a request, two of the deployment's words, a
    filter (a few words are very common, most are rare)."""
    return f"{rng.choice(VERBS)} {rng.choice(NOUNS)} {rng.choice(FILTERS)} for each {rng.choice(NOUNS)}"


def percentiles(values):
    values = sorted(values)
    return {"p50": round(statistics.median(values), 3),
            "p90": round(values[min(len(values) - 1, int(0.9 * len(values)))], 3), "n": len(values)}


def main():
    p = argparse.ArgumentParser(prog="bench/examples", description=__doc__)
    p.add_argument("--counts", default="10,1000,100000")
    p.add_argument("--questions", type=int, default=200)
    p.add_argument("--out")
    args = p.parse_args()
    cluster = Cluster(None)
    results = {}
    try:
        with psycopg.connect(dbname="postgres", autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
            admin.execute(f"CREATE DATABASE {DATABASE}")
        with connect(DATABASE) as c:
            c.execute("CREATE EXTENSION sql_query_engine")
            c.execute("CREATE TABLE customer (id int PRIMARY KEY, name text, country text)")
            c.execute("SET sql_query_engine.sample_values = 0")
            rng = random.Random(42)
            have = 0
            for count in [int(n) for n in args.counts.split(",")]:
                rows = [(question(rng), "SELECT count(*) FROM customer") for _ in range(count - have)]
                with c.cursor() as cur, cur.copy("COPY nl_examples (question, sql) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
                have = count
                c.execute("ANALYZE nl_examples")
                asked = [question(random.Random(1000 + i)) for i in range(args.questions)]
                c.execute("SELECT nl_schema(%s)", (asked[0],))  # warm: schema cached
                times = []
                for q in asked:
                    started = time.perf_counter()
                    c.execute("SELECT nl_schema(%s)", (q,)).fetchone()
                    times.append((time.perf_counter() - started) * 1000)
                results[count] = percentiles(times)
                print(f"{count:>7} examples: nl_schema(question) p50 {results[count]['p50']} ms, "
                      f"p90 {results[count]['p90']} ms (n = {results[count]['n']})", flush=True)
    finally:
        cluster.stop()
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
