#!/usr/bin/env bash
# Installs what building and testing sql_query_engine needs, skipping what is already there:
# PostgreSQL 15 with its server headers, libclang (bindgen), Redis, sudo, cargo-pgrx 0.18.1, and
# pgrx's pointer to the system PostgreSQL. Run as root, or as a user with sudo.
set -euo pipefail
export PATH="$HOME/.cargo/bin:$PATH"
PG_CONFIG="${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo

packages=(postgresql-15 postgresql-server-dev-15 libclang-dev redis-server sudo)
# Python 3 with venv runs the benchmark harness (and its test); this machine kind ships one.
command -v python3 >/dev/null || packages+=(python3 python3-venv)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! cargo pgrx --version 2>/dev/null | grep -q '0\.18\.1'; then
    echo "setup: installing cargo-pgrx 0.18.1 (about 10 minutes on 2 cores)"
    cargo install cargo-pgrx --version =0.18.1 --locked
fi

if ! grep -qs '^pg15' "$HOME/.pgrx/config.toml"; then
    cargo pgrx init --pg15 "$PG_CONFIG"
fi
echo "setup: done"
