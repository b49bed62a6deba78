#!/usr/bin/env bash
# Runs every test of sql_query_engine:
#   1. unit tests and backend tests (#[pg_test]) through `cargo pgrx test`,
#   2. the extension installed into the server's directories,
#   3. end-to-end tests: a real cluster, a real client, a scripted OpenAI-compatible model
#      (with SQE_BENCH_DIR set, also: every gold query of that benchmark passes the guard),
#   4. the benchmark harness's comparator.
# Needs the set-up of scripts/setup.sh (PostgreSQL 15 dev files, cargo-pgrx 0.18.1, pgrx init).
set -euo pipefail
cd "$(dirname "$0")/.."

export PG_CONFIG="${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}"
unset RUST_BACKTRACE RUST_LIB_BACKTRACE

if [ "$(id -u)" = 0 ]; then
    # initdb refuses root: pgrx runs the test cluster as postgres (short path: it holds the socket).
    pgdata="/tmp/sqe-pgrx-$$"
    rm -rf "$pgdata" && mkdir -p "$pgdata" && chown postgres:postgres "$pgdata"
    trap 'rm -rf "$pgdata"' EXIT
    cargo pgrx test pg15 --runas postgres --pgdata "$pgdata"
    cargo pgrx install --pg-config "$PG_CONFIG"
else
    cargo pgrx test pg15
    cargo pgrx install --pg-config "$PG_CONFIG" --sudo
fi

cargo test -p sql_query_engine_e2e -- --test-threads="${E2E_THREADS:-4}" ${SQE_BENCH_DIR:+--include-ignored}

(cd bench && python3 -m unittest test_score 2>&1 | tail -3)
