#!/usr/bin/env bash
# Installs PostgreSQL MAJOR from Debian's packages into a root of the Debian release that ships
# them, and makes the directory of programs the other scripts use for it (pg_bin_of MAJOR, see
# lib/pg_major.sh): as root. Today: 17, Debian 13's (trixie), whose binaries need glibc 2.38 where
# this Debian 12 host has 2.36; and 19, whose packages are in Debian's experimental suite only,
# in a sid root (they need glibc 2.43). Idempotent: later runs reuse the root and only remount it.
#
#   bash scripts/pg_root.sh 17
#
# How it runs:
# - The server and every client program run inside the root: each program of the bin directory
#   is a wrapper that enters the root with `unshare --root` (a chroot) in the caller's working
#   directory, as the calling user. Root enters with the right it has; any other user (the
#   postgres OS user, which runs the server, since PostgreSQL refuses root) enters through an
#   unprivileged user namespace that maps only its own uid and gid, so that no one gains a
#   privilege and every file is written with the caller's ids. The root's postgres user has the
#   host's ids (lib/debian_root.sh).
# - The host's /tmp is bind-mounted at the root's /tmp: the tests' cluster directories, sockets
#   and files (/tmp/pg_backfill_test17...) are the same paths on both sides. TCP is shared (a
#   chroot has no network of its own), so clients on the host reach the server on 127.0.0.1.
# - pgrx builds on the host against the root's headers: the wrapper pg_config answers as the
#   root's, except that the include directories (what bindgen and pgrx's C shim read on the host)
#   carry the root's prefix. Every other path stays the root's own (/usr/lib/postgresql/17/lib),
#   so that `cargo pgrx package` lays out the files as Debian does and lib/install.sh installs them
#   under PG_ROOT. The host's toolchain builds the library; built against glibc 2.36, it loads
#   in the root's 2.38 (glibc keeps old symbol versions).
# - `cargo pgrx test`, which starts its own server through pg_config's bindir, is not run for
#   these majors: the unit tests run on 15 and 18 (see .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/debian_root.sh
PG_MAJOR=${1:?usage: pg_root.sh MAJOR}
source scripts/lib/pg_major.sh

root=$(pg_root_of "$PG_MAJOR")
bin=$(pg_bin_of "$PG_MAJOR")
suites=$(pg_root_suite_of "$PG_MAJOR")
[ -n "$root" ] && [ -n "$suites" ] || { echo "pg_root.sh: PostgreSQL $PG_MAJOR runs on the host" >&2; exit 2; }
suite=${suites%+*}

# The server with its headers, and wal2json (the tests' decoder), from Debian's packages. There is
# no wal2json package for 19: it does not build against 19 (its upstream issue is open); see below.
packages=("postgresql-$PG_MAJOR" "postgresql-server-dev-$PG_MAJOR")
[ "$PG_MAJOR" -ge 19 ] || packages+=("postgresql-$PG_MAJOR-wal2json")
if [ "$suites" != "$suite" ]; then
    debian_root_make "$root" "$suite"
    debian_root_source_from "$root" "${suites#*+}" "postgresql-$PG_MAJOR"
fi
debian_root_make "$root" "$suite" "${packages[@]}"
debian_root_mount "$root"

debian_root_programs "$root" "$PG_MAJOR" "$bin"
"$PG_CONFIG" --version >/dev/null
printf '\033[1m[pg_root %s]\033[0m %s in %s, programs in %s\n' "$PG_MAJOR" "$("$PG_CONFIG" --version)" "$root" "$bin"

# wal2json for 19, for the tests only: its source (../shared/vendor) with 19's renames, built on
# the host against the root's headers, as the library is. 19 renamed RepOriginId to ReplOriginId,
# made AssertVariableIsOfType() StaticAssertVariableIsOfType(), put a transaction's commit and
# prepare times in an anonymous union, and made varatt's macros functions of a pointer. Without
# the source, the tests that decode with wal2json skip on 19, saying why (pg_test/conftest.py).
vendor=$(pwd)/../shared/vendor
pkglibdir=$root$("$PG_CONFIG" --pkglibdir)
if [ "$PG_MAJOR" -ge 19 ] && [ ! -f "$pkglibdir/wal2json.so" ] && ls "$vendor"/wal2json-*.tar.gz >/dev/null 2>&1; then
    work=$(mktemp -d)
    tar -C "$work" --strip-components=1 -xzf "$vendor"/wal2json-*.tar.gz
    sed -i -e 's/RepOriginId/ReplOriginId/g' \
        -e 's/\bAssertVariableIsOfType(/StaticAssertVariableIsOfType(/g' \
        -e 's/txn->xact_time\.\(commit\|prepare\)_time/txn->\1_time/g' \
        -e 's/VARATT_IS_EXTERNAL_ONDISK(\(origval\|value\|values\[i\]\))/VARATT_IS_EXTERNAL_ONDISK(DatumGetPointer(\1))/g' \
        "$work/wal2json.c"
    gcc -O2 -Wall -Werror -fPIC -shared -I"$("$PG_CONFIG" --includedir-server)" -o "$work/wal2json.so" "$work/wal2json.c"
    # (Renamed into place: nothing half-written is ever loaded.)
    install -m 755 "$work/wal2json.so" "$pkglibdir/wal2json.so.new" && mv "$pkglibdir/wal2json.so.new" "$pkglibdir/wal2json.so"
    rm -rf "$work"
    printf '\033[1m[pg_root %s]\033[0m wal2json built for the tests\n' "$PG_MAJOR"
fi
