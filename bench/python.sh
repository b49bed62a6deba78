# Sourced by the bench wrappers: a Python with psycopg, in a venv kept in the cache.
venv="${SQE_CACHE:-$HOME/.cache/sql_query_engine}/bench-venv"
if ! "$venv/bin/python" -c 'import psycopg' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet 'psycopg[binary]>=3.1,<4'
fi
python="$venv/bin/python"
