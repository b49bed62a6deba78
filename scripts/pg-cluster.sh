#!/usr/bin/env bash
# A throwaway PostgreSQL cluster on loopback, for the demo, the end-to-end tests and the
# benchmark. As root it runs as the `postgres` user (initdb refuses root).
#   pg-cluster.sh start DIR PORT [SERVER OPTION...]
#                                  initdb (once) and start; the socket is in DIR too; options
#                                  (e.g. -c shared_preload_libraries=sql_query_engine) go to
#                                  the server
#   pg-cluster.sh stop DIR         stop immediately
set -euo pipefail
PG_CONFIG="${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}"
bin="$("$PG_CONFIG" --bindir)"

as_server_user() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "${1:-}" in
start)
    dir="$2" port="$3"
    shift 3
    extra="$*"
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$dir"
    if [ ! -f "$dir/data/PG_VERSION" ]; then
        as_server_user "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 \
            --locale=C.UTF-8 -N >"$dir/initdb.log"
    fi
    # A backtrace variable in the server's environment would fill error details with traces.
    as_server_user env -u RUST_BACKTRACE -u RUST_LIB_BACKTRACE "$bin/pg_ctl" start -D "$dir/data" \
        -w -t 60 -l "$dir/server.log" \
        -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200 -c wal_keep_size=512MB $extra" \
        >/dev/null
    ;;
stop)
    dir="$2"
    if [ -f "$dir/data/postmaster.pid" ]; then
        as_server_user "$bin/pg_ctl" stop -D "$dir/data" -m immediate -w >/dev/null || true
    fi
    ;;
*)
    echo "usage: $0 start DIR PORT | stop DIR" >&2
    exit 2
    ;;
esac
