#!/usr/bin/env bash
# Installs what building, testing and the demo need on Debian 12, skipping what is already there:
# a C toolchain, PostgreSQL 15 (contrib included) with its server headers, libclang (bindgen), Redis,
# pgbouncer, Python 3 with venv and pip, sudo, a Rust toolchain new enough for the code,
# cargo-pgrx 0.18.1, and pgrx's pointer to the system PostgreSQL. Run as root, or as a user with
# sudo. Each step says what it does and how long it took.
#   setup.sh          everything (tests and the demo start their own servers: the services of
#                     packages this run installs are stopped and disabled; running ones are not
#                     touched)
#   setup.sh build    only what building the extension needs (`make install` on a server)
set -euo pipefail
export PATH="$HOME/.cargo/bin:$PATH"
PG_CONFIG="${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}"
RUST_MIN=1.88
SUDO=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "setup: run as root, or install sudo first" >&2; exit 1; }
    SUDO=sudo
fi

step_started=0
step() { step_started=$(date +%s); echo "setup: $*"; }
done_step() { echo "setup:   ... $(( $(date +%s) - step_started )) s"; }

packages=(build-essential pkg-config ca-certificates curl libclang-dev)
if [ "${1:-}" = build ]; then
    # The server's own headers, when it is Debian's PostgreSQL 15 (a source build has them).
    case "$PG_CONFIG" in /usr/lib/postgresql/15/*) packages+=(postgresql-server-dev-15) ;; esac
else
    packages+=(postgresql-15 postgresql-server-dev-15 redis-server pgbouncer sudo python3
               python3-venv python3-pip
               # a JDBC client, as BI tools connect (tests/clients/ViewColumns.java)
               openjdk-17-jdk-headless libpostgresql-jdbc-java)
fi
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    step "installing Debian packages: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
    # The services these packages started are not needed: tests and the demo start their own.
    # Only those this run installed: a server that was there before is left as it was.
    for p in "${missing[@]}"; do
        case "$p" in
        postgresql-15)
            # The cluster the package made, not the service (it starts every cluster).
            if [ -f /etc/postgresql/15/main/start.conf ]; then
                $SUDO pg_ctlcluster 15 main stop >/dev/null 2>&1 || true
                echo manual | $SUDO tee /etc/postgresql/15/main/start.conf >/dev/null
            fi
            ;;
        redis-server | pgbouncer)
            $SUDO systemctl disable --now "$p" >/dev/null 2>&1 || true
            $SUDO service "$p" stop >/dev/null 2>&1 || true
            ;;
        esac
    done
    done_step
fi

# Rust: Debian's is too old for this code (and for cargo-pgrx); rustup when missing or older.
version_of() { "$1" --version 2>/dev/null | awk '{print $2}'; }
new_enough() { [ "$(printf '%s\n%s\n' "$RUST_MIN" "$1" | sort -V | head -1)" = "$RUST_MIN" ]; }
rustc_version="$(version_of rustc || true)"
if [ -z "$rustc_version" ] || ! new_enough "$rustc_version"; then
    step "Rust ${rustc_version:-(none)} is older than $RUST_MIN: installing it with rustup"
    rustup_dir="$(mktemp -d)"
    trap 'rm -rf "$rustup_dir"' EXIT
    if ! curl --proto '=https' --tlsv1.2 -fsS --max-time 30 https://sh.rustup.rs -o "$rustup_dir/rustup-init.sh"; then
        echo "setup: this code needs Rust >= $RUST_MIN (rustc and cargo) and rustup could not be" >&2
        echo "setup: downloaded from https://sh.rustup.rs. Install Rust $RUST_MIN or newer and put" >&2
        echo "setup: cargo on PATH (or in ~/.cargo/bin), then run this again." >&2
        exit 1
    fi
    sh "$rustup_dir/rustup-init.sh" -y --profile minimal --default-toolchain stable -c rustfmt,clippy
    export PATH="$HOME/.cargo/bin:$PATH"
    done_step
fi

if ! cargo pgrx --version 2>/dev/null | grep -q '0\.18\.1'; then
    step "installing cargo-pgrx 0.18.1 (5 to 11 minutes on 2 cores)"
    cargo install cargo-pgrx --version =0.18.1 --locked
    done_step
fi

if ! grep -qs '^pg15' "$HOME/.pgrx/config.toml"; then
    cargo pgrx init --pg15 "$PG_CONFIG"
fi
echo "setup: done"
