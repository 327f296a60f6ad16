#!/usr/bin/env bash
# Builds and installs PostgreSQL MAJOR from Debian's source package under /usr/local/pgsql-MAJOR,
# with its contrib modules, wal2json (the tests' decoder) and Citus (for the distributed tests,
# when ../shared/vendor has its source), as root. Debian 12 packages only
# PostgreSQL 15; the newer majors come from the source packages of Debian's newer suites.
# Skips everything when /usr/local/pgsql-MAJOR/bin/pg_config already answers for a build with
# ICU (as every packaged PostgreSQL has it: the suite sorts keys by an ICU collation); a build
# without it is replaced.
#
#   bash scripts/build_postgres.sh 18
#
# apt is given a sources file and a lists directory of its own (under the work directory), so
# the system's apt state is left as it was. No Debian revision is pinned: whatever version the
# suite carries today is built.
set -euo pipefail

major=${1:?usage: build_postgres.sh MAJOR}
prefix=/usr/local/pgsql-$major
work=${BACKFILL_BUILD_DIR:-/var/tmp/pg_backfill_build}/pg$major
vendor=$(cd "$(dirname "$0")/.." && pwd)/../shared/vendor

log() { printf '\033[1m[build_postgres %s]\033[0m %s\n' "$major" "$*"; }

case $major in
    17) suite=trixie ;;
    18) suite=sid ;;
    *) echo "build_postgres.sh: no source suite known for PostgreSQL $major" >&2; exit 2 ;;
esac

if ! "$prefix/bin/pg_config" --version >/dev/null 2>&1 || "$prefix/bin/pg_config" --configure | grep -q -- --without-icu; then
    rm -rf "$prefix"
    mkdir -p "$work/apt/lists/partial" "$work/apt/parts" "$work/src"
    echo "deb-src [trusted=yes] http://deb.debian.org/debian $suite main" >"$work/apt/parts/source.list"
    apt_private=(-o Dir::Etc::sourcelist=/dev/null -o "Dir::Etc::sourceparts=$work/apt/parts"
                 -o "Dir::State::Lists=$work/apt/lists")
    log "fetching the source package postgresql-$major from Debian $suite"
    apt-get "${apt_private[@]}" update -qq
    (cd "$work/src" && rm -rf ./* && apt-get "${apt_private[@]}" source --download-only -qq "postgresql-$major")
    tarball=$(ls "$work/src"/postgresql-"$major"_*.orig.tar.*)
    log "building $(basename "$tarball") into $prefix (about 10 minutes on 2 cores)"
    tar -C "$work/src" -xf "$tarball"
    cd "$work/src"/postgresql-"$major".*/
    ./configure --prefix="$prefix" >"$work/configure.log" 2>&1 || { tail -30 "$work/configure.log"; exit 1; }
    make -j"$(nproc)" >"$work/make.log" 2>&1 || { tail -30 "$work/make.log"; exit 1; }
    make -C contrib -j"$(nproc)" >>"$work/make.log" 2>&1 || { tail -30 "$work/make.log"; exit 1; }
    make install >"$work/install.log" 2>&1 && make -C contrib install >>"$work/install.log" 2>&1 ||
        { tail -30 "$work/install.log"; exit 1; }
fi

if [ ! -f "$("$prefix/bin/pg_config" --pkglibdir)/wal2json.so" ]; then
    log "building wal2json from $vendor"
    mkdir -p "$work/wal2json"
    tar -C "$work/wal2json" --strip-components=1 -xzf "$vendor"/wal2json-*.tar.gz
    make -C "$work/wal2json" PG_CONFIG="$prefix/bin/pg_config" USE_PGXS=1 >"$work/wal2json.log" 2>&1 &&
        make -C "$work/wal2json" PG_CONFIG="$prefix/bin/pg_config" USE_PGXS=1 install >>"$work/wal2json.log" 2>&1 ||
        { tail -30 "$work/wal2json.log"; exit 1; }
fi
# Citus, for the distributed tests (pg_test/test_citus.py), when its source is there: the tests
# skip, saying how to install it, where it is not. Citus 14 supports PostgreSQL 16 to 18.
citus_tarball=$(ls "$vendor"/citus-*.tar.gz 2>/dev/null | tail -1 || true)
if [ -n "$citus_tarball" ] && [ "$major" -ge 16 ] && [ ! -f "$("$prefix/bin/pg_config" --pkglibdir)/citus.so" ]; then
    log "building $(basename "$citus_tarball") (a few minutes on 2 cores)"
    rm -rf "$work/citus" && mkdir -p "$work/citus"
    tar -C "$work/citus" --strip-components=1 -xzf "$citus_tarball"
    (cd "$work/citus" && ./configure PG_CONFIG="$prefix/bin/pg_config" --without-libcurl >"$work/citus.log" 2>&1 &&
        make -j"$(nproc)" >>"$work/citus.log" 2>&1 && make install >>"$work/citus.log" 2>&1) ||
        { tail -30 "$work/citus.log"; exit 1; }
fi
log "PostgreSQL $("$prefix/bin/pg_config" --version) at $prefix"
