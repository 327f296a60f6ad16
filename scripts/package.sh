#!/usr/bin/env bash
# Builds a Debian package of pg_backfill for each PostgreSQL major installed here (15, 17, 18, 19; or
# the majors given), into target/packages/:
#
#   target/packages/postgresql-<major>-pg-backfill_<version>-<revision>_amd64.deb
#
#   bash scripts/package.sh          every major installed (lib/pg_major.sh says where each lives)
#   bash scripts/package.sh 17       one
#
# Each is a release build (no test hooks) made by `cargo pgrx package` against that major's
# headers, laid out as Debian's PostgreSQL packages lay out extensions (/usr/lib/postgresql/<major>/lib,
# /usr/share/postgresql/<major>/extension), with a DEBIAN/control that depends on Debian's
# postgresql-<major> and the copyright file Debian packages carry. 15's and 17's pg_config are
# Debian's and already name those directories; 18's, built from source under
# /usr/local/pgsql-18, names its own, which the package maps to Debian's (its package is built
# against the same major's headers but not installed by the package tests: Debian 12 has no
# postgresql-18 package; see the README).
#
# dpkg installs each file beside its destination and renames it over the old one, so installing
# a newer package under a running server is safe (scripts/lib/install.sh says why that matters).
# PACKAGE_REVISION (1) is the Debian revision; PACKAGE_MAINTAINER the Maintainer field.
set -euo pipefail
cd "$(dirname "$0")/.."

REVISION=${PACKAGE_REVISION:-1}
MAINTAINER=${PACKAGE_MAINTAINER:-pg_backfill maintainers <maintainers@users.noreply.a-seed-b6ec6946.example>}
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
ARCH=$(dpkg --print-architecture)
OUT=target/packages

log() { printf '\033[1m[package]\033[0m %s\n' "$*"; }

# package MAJOR: builds postgresql-MAJOR-pg-backfill into $OUT.
package() {
    local major=$1 pg_config name work tree doc
    pg_config=$(PG_MAJOR=$major bash -c 'source scripts/lib/pg_major.sh && echo "$(pg_bin_of "$PG_MAJOR")/pg_config"')
    name=postgresql-$major-pg-backfill
    work=$OUT/build/$major
    tree=$work/$name
    log "building $name $VERSION-$REVISION (cargo pgrx package, release)"
    rm -rf "$work" && mkdir -p "$work/pgrx" "$tree/DEBIAN"
    cargo pgrx package --pg-config "$pg_config" --no-default-features --features "pg$major" \
        --out-dir "$work/pgrx" >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; return 1; }
    # The library and the SQL files, at Debian's paths for this major.
    local pkglibdir sharedir
    pkglibdir=$("$pg_config" --pkglibdir) sharedir=$("$pg_config" --sharedir)
    mkdir -p "$tree/usr/lib/postgresql/$major/lib" "$tree/usr/share/postgresql/$major/extension"
    cp "$work/pgrx$pkglibdir"/pg_backfill.so "$tree/usr/lib/postgresql/$major/lib/"
    cp "$work/pgrx$sharedir"/extension/pg_backfill* "$tree/usr/share/postgresql/$major/extension/"
    # Everything cargo pgrx laid out went somewhere.
    local built placed
    built=$(find "$work/pgrx" -type f | wc -l) placed=$(find "$tree/usr" -type f | wc -l)
    [ "$built" = "$placed" ] || { echo "package.sh: cargo pgrx package made $built files, $placed placed" >&2; return 1; }
    doc=$tree/usr/share/doc/$name
    mkdir -p "$doc"
    copyright >"$doc/copyright"
    # Debian's modes: directories 0755, files 0644 (a shared library too).
    find "$tree" -type d -exec chmod 0755 {} +
    find "$tree/usr" -type f -exec chmod 0644 {} +
    cat >"$tree/DEBIAN/control" <<CONTROL
Package: $name
Version: $VERSION-$REVISION
Architecture: $ARCH
Maintainer: $MAINTAINER
Installed-Size: $(du -sk "$tree/usr" | cut -f1)
Depends: postgresql-$major
Section: database
Priority: optional
Description: backfill existing rows into a PostgreSQL $major logical decoding stream
 pg_backfill sends the rows a table already holds into the logical decoding stream of
 PostgreSQL $major, in key order and exactly once, while the application keeps writing:
 consumers of a replication slot (Debezium, pgoutput subscribers, wal2json readers) receive
 them as reads between the ordinary changes.
 .
 Add pg_backfill to shared_preload_libraries, restart, then CREATE EXTENSION pg_backfill.
CONTROL
    (cd "$tree" && find usr -type f -print0 | sort -z | xargs -0 md5sum) >"$tree/DEBIAN/md5sums"
    dpkg-deb --root-owner-group --build "$tree" "$OUT/${name}_$VERSION-${REVISION}_$ARCH.deb" >/dev/null
    log "$OUT/${name}_$VERSION-${REVISION}_$ARCH.deb"
}

# The machine-readable copyright file (Debian's copyright format 1.0). Cargo.toml's licence:
# the PostgreSQL Licence.
copyright() {
    cat <<'COPYRIGHT'
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: pg_backfill

Files: *
Copyright: the pg_backfill authors
License: PostgreSQL

License: PostgreSQL
 Permission to use, copy, modify, and distribute this software and its
 documentation for any purpose, without fee, and without a written agreement
 is hereby granted, provided that the above copyright notice and this
 paragraph and the following two paragraphs appear in all copies.
 .
 IN NO EVENT SHALL THE AUTHORS BE LIABLE TO ANY PARTY FOR DIRECT, INDIRECT,
 SPECIAL, INCIDENTAL, OR CONSEQUENTIAL DAMAGES, INCLUDING LOST PROFITS,
 ARISING OUT OF THE USE OF THIS SOFTWARE AND ITS DOCUMENTATION, EVEN IF THE
 AUTHORS HAVE BEEN ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.
 .
 THE AUTHORS SPECIFICALLY DISCLAIM ANY WARRANTIES, INCLUDING, BUT NOT LIMITED
 TO, THE IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR
 PURPOSE. THE SOFTWARE PROVIDED HEREUNDER IS ON AN "AS IS" BASIS, AND THE
 AUTHORS HAVE NO OBLIGATIONS TO PROVIDE MAINTENANCE, SUPPORT, UPDATES,
 ENHANCEMENTS, OR MODIFICATIONS.
COPYRIGHT
}

majors=("$@")
if [ ${#majors[@]} -eq 0 ]; then
    for major in 15 17 18 19; do
        pg_config=$(PG_MAJOR=$major bash -c 'source scripts/lib/pg_major.sh && echo "$(pg_bin_of "$PG_MAJOR")/pg_config"')
        if "$pg_config" --version >/dev/null 2>&1; then majors+=("$major"); fi
    done
fi
[ ${#majors[@]} -gt 0 ] || { echo "package.sh: no PostgreSQL installed (scripts/setup.sh)" >&2; exit 1; }
mkdir -p "$OUT"
for major in "${majors[@]}"; do
    package "$major"
done
