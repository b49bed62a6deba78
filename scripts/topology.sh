#!/usr/bin/env bash
# A scaled-out deployment on one machine, for real: a primary, streaming standbys, Redis,
# pgbouncer in transaction mode and gateways (README, "Scaling out"). Every server listens on
# loopback; the extension must be installed in the server's directories (`make install`).
#   topology.sh start DIR --llm-url URL [--standbys N] [--gateways N] [--no-redis]
#                         [--no-pgbouncer] [--gateway-bin PATH] [--pool-size N]
#       starts it all in DIR (the database `shop` from demo/shop.sql, the roles `authenticator`
#       and `analyst`, a token for analyst) and writes DIR/topology.env: the ports, the URLs,
#       the token and the process ids
#   topology.sh stop DIR
#       stops everything it started in DIR
# Defaults: 2 standbys, 2 gateways, Redis and pgbouncer on. Without pgbouncer the gateways
# connect to the servers directly.
set -euo pipefail
cd "$(dirname "$0")/.."
export PG_CONFIG="${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}"
bin="$("$PG_CONFIG" --bindir)"
TOKEN="topology-analyst-token-0123456789"

as_server_user() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_for_port() {
    local port="$1" what="$2" i
    for i in $(seq 1 300); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "topology: $what did not start on port $port" >&2
    return 1
}

start() {
    local dir="$1"
    shift
    local standbys=2 gateways=2 redis=true pgbouncer=true llm_url="" pool_size=16
    local gateway_bin=""
    while [ $# -gt 0 ]; do
        case "$1" in
        --standbys) standbys="$2"; shift 2 ;;
        --gateways) gateways="$2"; shift 2 ;;
        --no-redis) redis=false; shift ;;
        --no-pgbouncer) pgbouncer=false; shift ;;
        --llm-url) llm_url="$2"; shift 2 ;;
        --gateway-bin) gateway_bin="$2"; shift 2 ;;
        --pool-size) pool_size="$2"; shift 2 ;;
        *) echo "topology: unknown option $1" >&2; exit 2 ;;
        esac
    done
    [ -n "$llm_url" ] || { echo "topology: --llm-url is needed" >&2; exit 2; }
    if [ -z "$gateway_bin" ]; then
        gateway_bin=target/release/sqe-gateway
        [ -x "$gateway_bin" ] || gateway_bin=target/debug/sqe-gateway
    fi
    [ -x "$gateway_bin" ] || { echo "topology: build the gateway first (cargo build -p sqe-gateway)" >&2; exit 1; }
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$dir"
    local env="$dir/topology.env"
    : >"$env"

    local primary_port
    primary_port="$(free_port)"
    bash scripts/pg-cluster.sh start "$dir/primary" "$primary_port" \
        -c shared_preload_libraries=sql_query_engine -c wal_level=replica -c hot_standby=on
    echo "PRIMARY_DIR=$dir/primary PRIMARY_PORT=$primary_port" >>"$env"
    local psql=("$bin/psql" -X -q -v ON_ERROR_STOP=1 -h "$dir/primary" -p "$primary_port" -U postgres)
    "${psql[@]}" -d postgres -c "CREATE DATABASE shop"
    "${psql[@]}" -d shop -f demo/shop.sql
    "${psql[@]}" -d shop <<SQL
CREATE EXTENSION sql_query_engine;
CREATE ROLE authenticator LOGIN NOINHERIT;
CREATE ROLE analyst;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO analyst;
GRANT analyst TO authenticator;
ALTER DATABASE shop SET sql_query_engine.llm_url = '$llm_url';
SQL

    local redis_port=""
    if $redis; then
        redis_port="$(free_port)"
        redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
            --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" >/dev/null
        wait_for_port "$redis_port" Redis
        "${psql[@]}" -d shop -c \
            "ALTER DATABASE shop SET sql_query_engine.redis_url = 'redis://127.0.0.1:$redis_port/0'"
        echo "REDIS_PORT=$redis_port REDIS_PID=$(cat "$dir/redis.pid")" >>"$env"
    fi

    # Standbys from base backups of the primary (the settings above are in its catalog, so they
    # replicate), streaming from it.
    local i standby_ports=()
    for i in $(seq 1 "$standbys"); do
        local sdir="$dir/standby$i" port
        mkdir -p "$sdir"
        [ "$(id -u)" = 0 ] && chown postgres:postgres "$sdir"
        as_server_user "$bin/pg_basebackup" -h "$dir/primary" -p "$primary_port" -U postgres \
            -D "$sdir/data" -R -X stream -c fast
        port="$(free_port)"
        bash scripts/pg-cluster.sh start "$sdir" "$port" \
            -c shared_preload_libraries=sql_query_engine -c hot_standby=on
        standby_ports+=("$port")
        echo "STANDBY${i}_DIR=$sdir STANDBY${i}_PORT=$port" >>"$env"
    done

    # How the gateways reach the servers: through pgbouncer (transaction mode, one database
    # name per server), or directly. A query waiting for a server that is gone fails after
    # query_wait_timeout (the gateway then asks another server), not after pgbouncer's
    # default two minutes.
    local primary_url read_urls=()
    if $pgbouncer; then
        local bport
        bport="$(free_port)"
        mkdir -p "$dir/pgbouncer"
        {
            echo "[databases]"
            echo "shop = host=127.0.0.1 port=$primary_port dbname=shop"
            for i in $(seq 1 "$standbys"); do
                echo "shop_standby$i = host=127.0.0.1 port=${standby_ports[$((i - 1))]} dbname=shop"
            done
            cat <<INI

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bport
unix_socket_dir =
auth_type = trust
auth_file = $dir/pgbouncer/users.txt
pool_mode = transaction
default_pool_size = $((pool_size * gateways + 4))
max_client_conn = 1000
ignore_startup_parameters = extra_float_digits,options
server_connect_timeout = 2
server_login_retry = 1
query_wait_timeout = 5
logfile = $dir/pgbouncer/pgbouncer.log
pidfile = $dir/pgbouncer/pgbouncer.pid
INI
        } >"$dir/pgbouncer/pgbouncer.ini"
        printf '"authenticator" ""\n"postgres" ""\n' >"$dir/pgbouncer/users.txt"
        # pgbouncer refuses to run as root.
        [ "$(id -u)" = 0 ] && chown -R postgres:postgres "$dir/pgbouncer"
        as_server_user pgbouncer -d "$dir/pgbouncer/pgbouncer.ini"
        wait_for_port "$bport" pgbouncer
        echo "PGBOUNCER_PORT=$bport PGBOUNCER_PID=$(cat "$dir/pgbouncer/pgbouncer.pid")" >>"$env"
        primary_url="postgresql://authenticator@127.0.0.1:$bport/shop"
        for i in $(seq 1 "$standbys"); do
            read_urls+=(--read-database-url "postgresql://authenticator@127.0.0.1:$bport/shop_standby$i")
        done
    else
        primary_url="postgresql://authenticator@127.0.0.1:$primary_port/shop"
        for port in "${standby_ports[@]}"; do
            read_urls+=(--read-database-url "postgresql://authenticator@127.0.0.1:$port/shop")
        done
    fi

    echo "$TOKEN analyst" >"$dir/tokens"
    chmod 600 "$dir/tokens"
    for i in $(seq 1 "$gateways"); do
        local gport
        gport="$(free_port)"
        env -u RUST_BACKTRACE "$gateway_bin" serve --listen "127.0.0.1:$gport" \
            --database-url "$primary_url" "${read_urls[@]}" --tokens "$dir/tokens" \
            --pool-size "$pool_size" --health-interval 1 >"$dir/gateway$i.log" 2>&1 &
        echo "$!" >"$dir/gateway$i.pid"
        wait_for_port "$gport" "gateway $i"
        echo "GATEWAY${i}_PORT=$gport GATEWAY${i}_PID=$!" >>"$env"
    done
    echo "TOKEN=$TOKEN STANDBYS=$standbys GATEWAYS=$gateways" >>"$env"
    echo "topology: ready in $dir (see $env)" >&2
}

stop() {
    local dir="$1" pidfile
    for pidfile in "$dir"/gateway*.pid "$dir/pgbouncer/pgbouncer.pid" "$dir/redis.pid"; do
        [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
    done
    local cluster
    for cluster in "$dir"/standby* "$dir/primary"; do
        [ -d "$cluster" ] && bash scripts/pg-cluster.sh stop "$cluster"
    done
    return 0
}

case "${1:-}" in
start) shift; dir="${1:?a directory}"; shift; start "$dir" "$@" ;;
stop) stop "${2:?a directory}" ;;
*)
    echo "usage: $0 start DIR --llm-url URL [options] | stop DIR" >&2
    exit 2
    ;;
esac
