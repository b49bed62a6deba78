#!/usr/bin/env bash
# The PostgreSQL servers the extension is built and tested against: 15 (Debian 12's package),
# 17 and 18 (built once from the upstream sources in Debian's trixie and sid source packages:
# their binary packages do not install on Debian 12).
#   pg.sh config NN   prints the pg_config of PostgreSQL NN when it is ready (exit 1 if not)
#   pg.sh ready NN    makes PostgreSQL NN ready for building and testing, tells pgrx about it,
#                     and prints its pg_config as the last line
# Source builds go to $SQE_PG_CACHE/NN (default /var/cache/sql_query_engine/pg as root, else
# ~/.cache/sql_query_engine/pg), with the contrib modules the tests use; a build is reused until
# the cache is removed.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
# As root, the servers must be runnable by postgres (the tests' clusters run as it), and root's
# home is not readable by it.
if [ "$(id -u)" = 0 ]; then
    cache="${SQE_PG_CACHE:-/var/cache/sql_query_engine/pg}"
else
    cache="${SQE_PG_CACHE:-${SQE_CACHE:-$HOME/.cache/sql_query_engine}/pg}"
fi
SUDO=""
[ "$(id -u)" != 0 ] && SUDO=sudo

# Where Debian keeps each version's sources.
suite_of() {
    case "$1" in
    17) echo trixie ;;
    18) echo sid ;;
    *) return 1 ;;
    esac
}

config() {
    local major="$1"
    local debian="/usr/lib/postgresql/$major/bin/pg_config"
    if [ -x "$debian" ]; then
        echo "$debian"
    elif [ -f "$cache/$major/.complete" ]; then
        echo "$cache/$major/bin/pg_config"
    else
        return 1
    fi
}

# Fetches the upstream tarball of postgresql-NN from Debian's source package into $2. apt
# verifies it (the signed Release file lists the Sources index, which lists its checksum). A
# mirror that lacks the files of the version its index lists gets the newest older release of
# the same major from the same pool, over HTTPS, taken only when it matches the SHA-256 that
# its .dsc (also over HTTPS) gives: a tarball nothing vouches for is never built.
fetch_sources() {
    local major="$1" into="$2" suite
    suite="$(suite_of "$major")" || {
        echo "pg.sh: no source package of PostgreSQL $major is known here (15, 17 and 18 are)" >&2
        exit 1
    }
    local apt="$into/apt"
    mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial"
    echo "deb-src http://deb.debian.org/debian $suite main" >"$apt/sources.list"
    local options=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
                   -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache")
    apt-get "${options[@]}" update -qq 2>/dev/null
    if ! (cd "$into" && apt-get "${options[@]}" source --download-only -qq "postgresql-$major" \
            >/dev/null 2>&1); then
        local listed pool minor
        listed="$(apt-cache "${options[@]}" showsrc "postgresql-$major" | awk '/^Version:/ {print $2; exit}')"
        pool="https://deb.debian.org/debian/$(apt-cache "${options[@]}" showsrc "postgresql-$major" \
            | awk '/^Directory:/ {print $2; exit}')"
        minor="$(echo "$listed" | sed -E 's/^[0-9]+\.([0-9]+).*/\1/')"
        echo "pg.sh: the mirror lacks postgresql-$major $listed; looking for an older release in $pool" >&2
        local found=""
        while [ "$minor" -ge 0 ] && [ -z "$found" ]; do
            local tarball="postgresql-${major}_${major}.${minor}.orig.tar.bz2" want="" dsc
            for dsc in "${major}.${minor}-0+deb13u1" "${major}.${minor}-1" "${major}.${minor}-2" "${major}.${minor}-3"; do
                if curl --proto '=https' -fsS --max-time 60 -o "$into/source.dsc" \
                        "$pool/postgresql-${major}_${dsc/+/%2b}.dsc" 2>/dev/null; then
                    want="$(awk -v f="$tarball" '/^Checksums-Sha256:/ {s=1; next} s && $3 == f {print $1; exit}' "$into/source.dsc")"
                    [ -n "$want" ] && break
                fi
            done
            if [ -n "$want" ] && curl --proto '=https' -fsS --max-time 600 -o "$into/$tarball" \
                    "$pool/$tarball" 2>/dev/null; then
                echo "$want  $into/$tarball" | sha256sum -c --quiet - \
                    || { echo "pg.sh: $tarball does not match its .dsc" >&2; exit 1; }
                echo "pg.sh: using $tarball (SHA-256 as postgresql-${major}_$dsc.dsc gives)" >&2
                found="$tarball"
            fi
            minor=$((minor - 1))
        done
        [ -n "$found" ] || { echo "pg.sh: no postgresql-$major sources with a checksum on this mirror" >&2; exit 1; }
    fi
    local tarball
    tarball="$(ls "$into"/postgresql-"$major"_*.orig.tar.* | head -1)"
    tar -xf "$tarball" -C "$into"
}

build() {
    local major="$1" prefix="$cache/$1"
    local started work
    started=$(date +%s)
    work="$(mktemp -d "/tmp/sqe-pg$major-XXXXXX")"
    trap 'rm -rf "$work"' RETURN
    echo "pg.sh: building PostgreSQL $major from Debian's $(suite_of "$major") sources into $prefix" >&2
    # What the build and the tests need: bison and flex (the tarball has no generated parser),
    # libxml2 for the xml type (XMLTABLE), libxslt for xml2, zlib, OpenSSL, LZ4.
    local packages=(build-essential pkg-config bison flex libxml2-dev libxslt1-dev zlib1g-dev
                    libssl-dev liblz4-dev dpkg-dev)
    local missing=()
    for p in "${packages[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
            "${missing[@]}" >/dev/null
    fi
    fetch_sources "$major" "$work"
    local source
    source="$(find "$work" -maxdepth 1 -type d -name "postgresql-$major*" | head -1)"
    rm -rf "$prefix"
    (
        cd "$source"
        # Called from make (`make pg`), the outer make's level and flags would reach
        # PostgreSQL's own make, which then skips generating its headers (it does that only at
        # level 0) and fails on utils/errcodes.h.
        unset MAKELEVEL MAKEFLAGS MFLAGS
        # Portable code only: no -march=native, whatever the machine.
        ./configure --prefix="$prefix" --with-libxml --with-libxslt --with-openssl --with-lz4 \
            --without-icu --without-readline CFLAGS="-O2" >"$work/configure.log" 2>&1 \
            || { tail -30 "$work/configure.log" >&2; exit 1; }
        make -j"$(nproc)" -s >"$work/make.log" 2>&1 || { tail -30 "$work/make.log" >&2; exit 1; }
        make -s install >>"$work/make.log" 2>&1
        for module in postgres_fdw tablefunc xml2 dblink pg_trgm; do
            make -C "contrib/$module" -s install >>"$work/make.log" 2>&1
        done
    )
    touch "$prefix/.complete"
    echo "pg.sh: PostgreSQL $major built in $(( $(date +%s) - started )) s" >&2
}

# Tells pgrx about every server that is ready (cargo pgrx init rewrites its list each time).
pgrx_init() {
    local arguments=() major path
    for major in 13 14 15 16 17 18; do
        if path="$(config "$major")"; then
            arguments+=("--pg$major" "$path")
        fi
    done
    if ! grep -qs "^pg$1 = \"$(config "$1")\"" "$HOME/.pgrx/config.toml"; then
        cargo pgrx init "${arguments[@]}" >&2
    fi
}

case "${1:-}" in
config)
    config "${2:?a major version}"
    ;;
ready)
    major="${2:?a major version}"
    if ! config "$major" >/dev/null; then
        build "$major"
    fi
    pgrx_init "$major"
    config "$major"
    ;;
*)
    echo "usage: $0 config NN | ready NN" >&2
    exit 2
    ;;
esac
