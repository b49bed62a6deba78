#!/usr/bin/env bash
# Prints the path of a Python that has the official client SDKs (tests/clients/requirements.txt),
# in a venv kept in the cache; creates it the first time.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${SQE_CACHE:-$HOME/.cache/sql_query_engine}/clients-venv"
stamp="$venv/.requirements"
# Tests run in parallel: one creates the venv while the others wait for it (a second pip
# working in the same venv breaks the first's).
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if ! cmp -s "$here/requirements.txt" "$stamp" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --upgrade pip >&2
    "$venv/bin/pip" install --quiet -r "$here/requirements.txt" >&2
    cp "$here/requirements.txt" "$stamp"
fi
echo "$venv/bin/python"
