#!/bin/sh
# Loads every database of this benchmark from dumps/ into a running PostgreSQL, one per dump.
# Usage: PGHOST=... PGPORT=... PGUSER=... sh load.sh [database ...]   (default: all)
set -eu
cd "$(dirname "$0")"
if [ $# -eq 0 ]; then set -- $(ls dumps | sed 's/\.sql$//'); fi
for db in "$@"; do
  psql -X -q -d postgres -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" \
       -c "CREATE DATABASE \"$db\" TEMPLATE template0 ENCODING 'UTF8'"
  psql -X -q -v ON_ERROR_STOP=1 -d "$db" -f "dumps/$db.sql" >/dev/null
done
