#!/usr/bin/env bash
# The PostgreSQL servers the extension is built and tested against.
#   pg.sh config NN   prints the pg_config of PostgreSQL NN when it is ready (exit 1 if not)
#   pg.sh ready NN    makes PostgreSQL NN ready for building and testing (the machine's package
#                     where Debian has one) and prints its pg_config as the last line
set -euo pipefail
cd "$(dirname "$0")/.."

config() {
    local major="$1"
    local debian="/usr/lib/postgresql/$major/bin/pg_config"
    if [ -x "$debian" ]; then
        echo "$debian"
        return 0
    fi
    return 1
}

case "${1:-}" in
config)
    config "${2:?a major version}"
    ;;
ready)
    major="${2:?a major version}"
    if path="$(config "$major")"; then
        echo "$path"
        exit 0
    fi
    echo "pg.sh: PostgreSQL $major is not available here" >&2
    exit 1
    ;;
*)
    echo "usage: $0 config NN | ready NN" >&2
    exit 2
    ;;
esac
