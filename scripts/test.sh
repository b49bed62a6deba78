#!/usr/bin/env bash
# The tests of sql_query_engine, by tier (README, "Development"):
#   scripts/test.sh [all]        every tier, as CI runs them
#   scripts/test.sh unit         pure-Rust unit tests of the extension and the gateway
#   scripts/test.sh pg           backend tests (#[pg_test]), in a cluster pgrx starts
#   scripts/test.sh regress      expected-output tests (test/sql, test/expected) of what users
#                                read as text: refusals, the schema text, settings, the upgrade
#   scripts/test.sh e2e [AREA]   end-to-end tests (a real cluster, real clients, a real Redis, a
#                                scripted model); AREA is one test binary (tests/tests/AREA.rs)
#   scripts/test.sh gateway      the gateway: its unit tests and its end-to-end tests
# regress, e2e and gateway share one cluster started here, with the extension installed (and,
# for the upgrade tests, the previous releases' install scripts). With SQE_BENCH_DIR set, e2e also
# checks that every gold query of that benchmark passes the guard.
# The server is $PG_CONFIG's (default: PostgreSQL 15 from Debian); scripts/pg.sh makes others
# ready. Needs the set-up of scripts/setup.sh. As root, clusters run as postgres; as another user,
# installing into the server's directories goes through sudo.
set -euo pipefail
cd "$(dirname "$0")/.."

export PATH="$HOME/.cargo/bin:$PATH"
export PG_CONFIG="${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}"
unset RUST_BACKTRACE RUST_LIB_BACKTRACE
major="$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')"
features=(--no-default-features --features "pg$major")
tier="${1:-all}"
area="${2:-}"

if [ "$(id -u)" = 0 ]; then
    # initdb refuses root: pgrx runs its test cluster as postgres (short path: it holds the socket).
    SUDO="" SUDO_FLAG="" runas=postgres
else
    SUDO=sudo SUDO_FLAG=--sudo runas="$(id -un)"
fi
work="$(mktemp -d /tmp/sqe-test-XXXXXX)"
cluster_dir="$work/cluster"
cleanup() {
    [ -d "$cluster_dir" ] && bash scripts/pg-cluster.sh stop "$cluster_dir"
    rm -rf "$work"
}
trap cleanup EXIT
[ "$(id -u)" = 0 ] && chown postgres:postgres "$work"

step() { echo "test: $*"; }

# cargo pgrx test runs the crate's plain #[test]s and the #[pg_test]s in one binary.
pgrx_test() {
    local pgdata="$work/pgrx"
    rm -rf "$pgdata" && mkdir -p "$pgdata"
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$pgdata"
    cargo pgrx test "pg$major" --runas "$runas" --pgdata "$pgdata" "$@"
}

unit() {
    step "unit tests (pg$major)"
    # The backend tests need the cluster pgrx starts; the plain ones run without a server.
    cargo test --lib "${features[@]}" -- --skip pg_test::
    cargo test -p sqe-gateway
}

backend() {
    step "backend tests (pg$major)"
    pgrx_test pg_test::
}

install() {
    step "installing the extension into $("$PG_CONFIG" --pkglibdir)"
    # Checked one by one: called as `install && ...`, the function runs without errexit, and a
    # build that failed would leave the tests to run the previous build.
    cargo pgrx install --pg-config "$PG_CONFIG" "${features[@]}" $SUDO_FLAG || return 1
    # The previous releases' install scripts, for the upgrade tests.
    $SUDO cp sql/sql_query_engine--0.1.0.sql "$("$PG_CONFIG" --sharedir)/extension/" || return 1
}

shared_cluster() {
    [ -n "${SQE_TEST_PGPORT:-}" ] && return
    local port
    port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    bash scripts/pg-cluster.sh start "$cluster_dir" "$port"
    export SQE_TEST_PGHOST="$cluster_dir" SQE_TEST_PGPORT="$port" SQE_TEST_PGDIR="$cluster_dir"
    export SQE_TEST_PGUSER=postgres
}

regress() {
    step "expected-output tests (pg$major)"
    shared_cluster
    local pg_regress
    pg_regress="$(dirname "$("$PG_CONFIG" --pgxs)")/../test/regress/pg_regress"
    local out="$work/regress"
    mkdir -p "$out"
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$out"
    local tests
    tests=$(cd test/sql && ls ./*.sql | sed 's|^\./||; s|\.sql$||' | sort)
    local run=("$pg_regress" --host="$SQE_TEST_PGHOST" --port="$SQE_TEST_PGPORT"
               --user=postgres --dbname=sqe_regress --inputdir=test --outputdir="$out"
               --bindir="$("$PG_CONFIG" --bindir)")
    # shellcheck disable=SC2086
    if ! "${run[@]}" $tests; then
        cat "$out/regression.diffs" 2>/dev/null || true
        # The work directory goes when this script ends: keep what the server printed, to
        # review and to take as the new expected output (README, "Tests, by tier").
        rm -rf test/results && cp -r "$out/results" test/results
        echo "test: the output of the failed run is in test/results" >&2
        return 1
    fi
}

e2e() {
    shared_cluster
    cargo build -p sqe-gateway
    if [ -n "$area" ]; then
        step "end-to-end tests: $area"
        cargo test -p sql_query_engine_e2e --test "$area" -- --test-threads="${E2E_THREADS:-4}"
    else
        step "end-to-end tests"
        cargo test -p sql_query_engine_e2e -- --test-threads="${E2E_THREADS:-4}" \
            ${SQE_BENCH_DIR:+--include-ignored}
        (cd bench && python3 -m unittest test_score 2>&1 | tail -3)
    fi
}

gateway() {
    step "gateway tests"
    cargo test -p sqe-gateway
    area=gateway
    e2e
}

case "$tier" in
all)
    pgrx_test
    install
    regress
    e2e
    cargo test -p sqe-gateway
    ;;
unit) unit ;;
pg) backend ;;
regress) install && regress ;;
e2e) install && e2e ;;
gateway) install && gateway ;;
*)
    echo "usage: $0 [all | unit | pg | regress | e2e [AREA] | gateway]" >&2
    exit 2
    ;;
esac
