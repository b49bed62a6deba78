#!/usr/bin/env bash
# The demo: builds and installs the extension, starts a local model (Qwen2.5-Coder-1.5B on
# llama.cpp, downloaded and built once, see scripts/local-llm.sh) and a throwaway PostgreSQL
# cluster with a small shop database, and asks questions from psql: each step, the SQL and the
# rows are printed, then one line: questions answered, attempts, time. It exits non-zero when a
# question was not answered.
#   LLM_URL=... LLM_MODEL=... make demo    use another OpenAI-compatible endpoint instead
#   DEMO_MODEL=scripted make demo          use the test suite's scripted model (no download)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
export PG_CONFIG="${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}"
unset RUST_BACKTRACE RUST_LIB_BACKTRACE

bash scripts/setup.sh
SUDO_FLAG=""
[ "$(id -u)" = 0 ] || SUDO_FLAG=--sudo
echo "demo: building and installing the extension"
cargo pgrx install --pg-config "$PG_CONFIG" $SUDO_FLAG >/dev/null

dir="$(mktemp -d /tmp/sqe-demo-XXXXXX)"
port="${DEMO_PORT:-55432}"
# The recommended configuration: the library preloaded, so that its settings are defined in
# every backend from the start.
bash scripts/pg-cluster.sh start "$dir" "$port" -c shared_preload_libraries=sql_query_engine
scripted_pid=""
cleanup() {
    [ -n "$scripted_pid" ] && kill "$scripted_pid" 2>/dev/null
    bash scripts/pg-cluster.sh stop "$dir"
    rm -rf "$dir"
}
trap cleanup EXIT

local_model=false
if [ -z "${LLM_URL:-}" ] && [ "${DEMO_MODEL:-local}" = scripted ]; then
    cargo build -q -p sql_query_engine_e2e --bin scripted_llm
    exec 3< <(target/debug/scripted_llm demo/answers.json)
    scripted_pid=$!
    read -r LLM_URL <&3
    LLM_MODEL=scripted
elif [ -z "${LLM_URL:-}" ]; then
    LLM_URL="$(bash scripts/local-llm.sh start "${LLM_PORT:-8080}")"
    LLM_MODEL=qwen2.5-coder-1.5b-instruct
    local_model=true
    echo "The local model keeps running; stop it with: bash scripts/local-llm.sh stop ${LLM_PORT:-8080}"
fi

export PGHOST="$dir" PGPORT="$port" PGUSER=postgres
psql -X -q -d postgres -c "CREATE DATABASE shop"
psql -X -q -d shop -v ON_ERROR_STOP=1 -f demo/shop.sql
psql -X -q -d shop -c "CREATE EXTENSION sql_query_engine"
echo "A verified example for the model (demo/examples.sql):"
psql -X -q -d shop -v ON_ERROR_STOP=1 -f demo/examples.sql
psql -X -q -d shop -c "ALTER DATABASE shop SET sql_query_engine.llm_url = '$LLM_URL'"
psql -X -q -d shop -c "ALTER DATABASE shop SET sql_query_engine.llm_model = '${LLM_MODEL:-}'"
if [ -n "${LLM_API_KEY_FILE:-}" ]; then
    psql -X -q -d shop -c "ALTER DATABASE shop SET sql_query_engine.llm_api_key_file = '$LLM_API_KEY_FILE'"
fi
# Each step (the model's SQL, each attempt's outcome) is printed as a NOTICE as it happens.
psql -X -q -d shop -c "ALTER DATABASE shop SET sql_query_engine.progress = on"

echo "Model endpoint: $LLM_URL"
asked=0 answered=0 started=$(date +%s)
while read -r question; do
    asked=$((asked + 1))
    echo
    echo "=== $question"
    if psql -X -q -d shop -v ON_ERROR_STOP=1 -v q="$question" <<'SQL'
\pset footer off
SELECT * FROM nl_query(:'q');
SQL
    then
        answered=$((answered + 1))
    elif $local_model && ! bash scripts/local-llm.sh status "${LLM_PORT:-8080}"; then
        echo "demo: the local model server is gone; see its log in ${SQE_CACHE:-$HOME/.cache/sql_query_engine}" >&2
        echo "demo: rebuild it with: bash scripts/local-llm.sh rebuild" >&2
        exit 1
    fi
done < <(python3 -c 'import json; [print(q) for q in json.load(open("demo/answers.json"))]')

attempts=$(psql -X -qAt -d shop -c "SELECT coalesce(sum(jsonb_array_length(attempts)), 0) FROM nl_history")
echo
echo "demo: $answered of $asked questions answered, $attempts attempts, $(( $(date +%s) - started )) s"
[ "$answered" = "$asked" ]
