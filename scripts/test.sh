#!/usr/bin/env bash
# Runs every test of sql_query_engine:
#   1. unit tests and backend tests (#[pg_test]) through `cargo pgrx test`,
#   2. the extension installed into the server's directories, with the previous release's
#      install script (for the upgrade test),
#   3. end-to-end tests: a real cluster, real clients, a real Redis, a scripted
#      OpenAI-compatible model (with SQE_BENCH_DIR set, also: every gold query of that benchmark
#      passes the guard),
#   4. the benchmark harness's comparator.
# Needs the set-up of scripts/setup.sh. As root, the test clusters run as postgres; as another
# user, installing into the system PostgreSQL goes through sudo.
set -euo pipefail
cd "$(dirname "$0")/.."

export PATH="$HOME/.cargo/bin:$PATH"
export PG_CONFIG="${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}"
unset RUST_BACKTRACE RUST_LIB_BACKTRACE

pgdata="/tmp/sqe-pgrx-$$"
rm -rf "$pgdata" && mkdir -p "$pgdata"
trap 'rm -rf "$pgdata"' EXIT
if [ "$(id -u)" = 0 ]; then
    # initdb refuses root: pgrx runs the test cluster as postgres (short path: it holds the socket).
    chown postgres:postgres "$pgdata"
    SUDO="" SUDO_FLAG=""
    runas=postgres
else
    # With --runas, pgrx installs through sudo; running as oneself keeps the data directory ours.
    SUDO=sudo SUDO_FLAG=--sudo
    runas="$(id -un)"
fi
cargo pgrx test pg15 --runas "$runas" --pgdata "$pgdata"
cargo pgrx install --pg-config "$PG_CONFIG" $SUDO_FLAG
$SUDO cp sql/sql_query_engine--0.1.0.sql "$("$PG_CONFIG" --sharedir)/extension/"

# The gateway's tests drive its binary with the official client SDKs (tests/clients).
cargo build -p sqe-gateway
cargo test -p sqe-gateway
cargo test -p sql_query_engine_e2e -- --test-threads="${E2E_THREADS:-4}" ${SQE_BENCH_DIR:+--include-ignored}

(cd bench && python3 -m unittest test_score 2>&1 | tail -3)
