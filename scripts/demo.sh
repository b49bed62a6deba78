#!/usr/bin/env bash
# The demo: builds and installs the extension, starts a throwaway PostgreSQL cluster, loads a
# small shop database, starts a model server, and asks questions from psql.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
export PG_CONFIG="${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}"
unset RUST_BACKTRACE RUST_LIB_BACKTRACE

bash scripts/setup.sh
SUDO_FLAG=""
[ "$(id -u)" = 0 ] || SUDO_FLAG=--sudo
cargo pgrx install --pg-config "$PG_CONFIG" $SUDO_FLAG >/dev/null
cargo build -q -p sql_query_engine_e2e --bin scripted_llm

dir=/tmp/sqe-demo
port="${DEMO_PORT:-55432}"
bash scripts/pg-cluster.sh stop "$dir" 2>/dev/null || true
rm -rf "$dir"
bash scripts/pg-cluster.sh start "$dir" "$port"
llm_pid=""
cleanup() {
    [ -n "$llm_pid" ] && kill "$llm_pid" 2>/dev/null
    bash scripts/pg-cluster.sh stop "$dir"
}
trap cleanup EXIT

# The model: until a local model is wired in, the test suite's scripted model answers the
# demo's questions (demo/answers.json). Any OpenAI-compatible endpoint can replace it:
# set LLM_URL (and LLM_MODEL) to use it.
if [ -z "${LLM_URL:-}" ]; then
    exec 3< <(target/debug/scripted_llm demo/answers.json)
    llm_pid=$!
    read -r LLM_URL <&3
fi

export PGHOST="$dir" PGPORT="$port" PGUSER=postgres
psql -X -q -d postgres -c "CREATE DATABASE shop"
psql -X -q -d shop -v ON_ERROR_STOP=1 -f demo/shop.sql
psql -X -q -d shop -c "CREATE EXTENSION sql_query_engine"
psql -X -q -d shop -c "ALTER DATABASE shop SET sql_query_engine.llm_url = '$LLM_URL'"
if [ -n "${LLM_MODEL:-}" ]; then
    psql -X -q -d shop -c "ALTER DATABASE shop SET sql_query_engine.llm_model = '$LLM_MODEL'"
fi

echo "Model endpoint: $LLM_URL"
while read -r question; do
    echo
    echo "=== $question"
    psql -X -q -d shop -v q="$question" <<'SQL'
\pset footer off
SELECT nl_trace(:'q') ->> 'sql' AS "SQL";
SELECT * FROM nl_query(:'q');
SQL
done < <(python3 -c 'import json,sys; [print(q) for q in json.load(open("demo/answers.json"))]')
