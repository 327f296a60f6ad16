#!/usr/bin/env bash
# Builds pg_backfill's packages for each PostgreSQL major installed here (15, 17, 18, 19; or the
# majors given), into target/packages/:
#
#   target/packages/postgresql-<major>-pg-backfill_<version>-<revision>_<arch>.deb
#   target/packages/pg-backfill-<version>-pg<major>-<arch>.oci.tar        (--format image; 18, 19)
#
#   bash scripts/package.sh                       the .debs of this machine's architecture (amd64)
#   bash scripts/package.sh 17                    one major's
#   bash scripts/package.sh --arch arm64 [MAJOR]  arm64's, cross-compiled on this amd64 machine
#   bash scripts/package.sh --arch all            both architectures'
#   bash scripts/package.sh --format image [--arch ARCH] [MAJOR]
#                                                 the extension images (OCI image layouts) of 18 and
#                                                 19, as CloudNativePG mounts them (see below)
#   bash scripts/package.sh --format all --arch all   everything
#
# Each is a release build (no test hooks) made by `cargo pgrx package` against that major's headers,
# laid out as Debian's PostgreSQL packages lay out extensions (/usr/lib/postgresql/<major>/lib,
# /usr/share/postgresql/<major>/extension), and made as Debian's own postgresql-<major>-<extension>
# packages are (what debhelper does for them, done here by hand): the library stripped as dh_strip
# strips one, a Depends on Debian's postgresql-<major> (on its minor release that added a server
# function the library calls, if it calls one) and on the shared libraries dpkg-shlibdeps finds, the
# copyright file, a Debian changelog and the upstream one (CHANGELOG.md). lintian then checks each
# package: any error or warning fails the build. 15's and 17's pg_config are Debian's and already
# name those directories; 18's, built from source under /usr/local/pgsql-18, names its own, which
# the package maps to Debian's (its package is built against the same major's headers but not
# installed by the package tests: Debian 12 has no postgresql-18 package; see docs/installing.md).
#
# arm64 (scripts/lib/arm64.sh): the SQL files are the same on every architecture (pgrx writes them
# from the Rust source), so they come from the host's build of the same major, as above; the library
# is cross-compiled (`cargo build --target aarch64-unknown-linux-gnu`, Debian's cross gcc) against
# Debian's own arm64 headers of that major, and checked against Debian's arm64 server and C library.
# The rest, the package itself, is the same code for both. scripts/test_arm64.sh installs them in
# arm64 Debian roots under emulation.
#
# The extension image of 18 and 19 (PostgreSQL 18 is the first to find an extension's files
# through extension_control_path and dynamic_library_path): the same library and SQL files as the
# package's, at the image's root as CloudNativePG's image volumes expect them, lib/pg_backfill.so
# and share/extension/pg_backfill*, in an OCI image layout made by Debian's umoci (no daemon, no
# registry), archived with tar (an "oci-archive": `skopeo copy oci-archive:FILE docker://...`
# pushes it). packaging/test_image.py serves a backfill from it.
#
# dpkg installs each file beside its destination and renames it over the old one, so installing
# a newer package under a running server is safe (scripts/lib/install.sh says why that matters).
# PACKAGE_REVISION (1) is the Debian revision; PACKAGE_MAINTAINER the Maintainer field (and the
# changelog's signer). The changelog's date is SOURCE_DATE_EPOCH's, the last commit's unless set,
# so that the same commit makes the same changelog.
set -euo pipefail
cd "$(dirname "$0")/.."

REVISION=${PACKAGE_REVISION:-1}
MAINTAINER=${PACKAGE_MAINTAINER:-pg_backfill maintainers <maintainers@users.noreply.a-seed-b6ec6946.example>}
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
HOST_ARCH=$(dpkg --print-architecture)
OUT=target/packages
# The source package Debian would build these from (a source package's name has no "_"), as
# wal2json's source makes postgresql-<major>-wal2json.
SOURCE=pg-backfill
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
source scripts/lib/arm64.sh
for tool in lintian dpkg-shlibdeps strip; do
    command -v "$tool" >/dev/null || { echo "package.sh: no $tool (scripts/setup.sh installs it)" >&2; exit 1; }
done

log() { printf '\033[1m[package]\033[0m %s\n' "$*"; }

# logged LOG COMMAND...: COMMAND's output appended to LOG, whose end is shown if it fails.
logged() {
    local log=$1
    shift
    "$@" >>"$log" 2>&1 || { local status=$?; tail -30 "$log" >&2; echo "package.sh: failed ($status): $*" >&2; return "$status"; }
}

# package MAJOR ARCH FORMAT: builds postgresql-MAJOR-pg-backfill for ARCH into $OUT, as a .deb
# (FORMAT deb), an extension image (image) or both (all).
package() {
    local major=$1 arch=$2 format=$3 pg_config pg_root name work tree doc
    pg_config=$(PG_MAJOR=$major bash -c 'source scripts/lib/pg_major.sh && echo "$(pg_bin_of "$PG_MAJOR")/pg_config"')
    pg_root=$(PG_MAJOR=$major bash -c 'source scripts/lib/pg_major.sh && pg_root_of "$PG_MAJOR"')
    name=postgresql-$major-pg-backfill
    work=$OUT/build/$arch/$major
    tree=$work/$name
    log "building $name $VERSION-$REVISION for $arch (cargo pgrx package, release)"
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
    local library=$tree/usr/lib/postgresql/$major/lib/pg_backfill.so
    # Another architecture's: the host's library is replaced by one cross-compiled for it, and
    # what is checked against the host's server and C library is checked against that
    # architecture's (Debian's packages of them, scripts/lib/arm64.sh); binutils are its.
    local postgres binutils= shlibdeps=()
    postgres=$pg_root$("$pg_config" --bindir)/postgres
    if [ "$arch" != "$HOST_ARCH" ]; then
        local sysroot
        sysroot=$PWD/$OUT/$arch/sysroot/$major
        cross_library "$major" "$arch" "$sysroot" "$work" "$library"
        postgres=$sysroot/postgresql-$major/usr/lib/postgresql/$major/bin/postgres
        binutils=aarch64-linux-gnu-
        # dpkg-shlibdeps finds the arm64 C library in the packages unpacked there (-S: their
        # files and their DEBIAN/symbols), under arm64's multiarch directories.
        shlibdeps=(-S"$sysroot/libc6" -S"$sysroot/libgcc-s1")
    fi
    # Stripped as dh_strip strips a shared library: its symbol table and debugging information
    # go, its dynamic symbols (what PostgreSQL looks up) stay. The unstripped library is still
    # $work/pgrx's (the host's) or $work/cross's, for a debugger.
    "${binutils}strip" --remove-section=.comment --remove-section=.note --strip-unneeded "$library"
    if [ "$format" = image ] || [ "$format" = all ]; then
        if [ "$major" -ge 18 ]; then image "$major" "$arch" "$work" "$tree"; fi
        [ "$format" = all ] || return 0
    fi
    doc=$tree/usr/share/doc/$name
    mkdir -p "$doc"
    copyright >"$doc/copyright"
    # The Debian changelog (of the packaging) and the upstream one, compressed as
    # dh_installchangelogs and dh_compress do (gzip -9n: no name, no timestamp).
    debian_changelog "$major" | gzip -9n >"$doc/changelog.Debian.gz"
    gzip -9n <CHANGELOG.md >"$doc/changelog.gz"
    # lintian's overrides, where dh_lintian installs them: each says why.
    mkdir -p "$tree/usr/share/lintian/overrides"
    lintian_overrides "$name" >"$tree/usr/share/lintian/overrides/$name"
    # Debian's modes: directories 0755, files 0644 (a shared library too).
    find "$tree" -type d -exec chmod 0755 {} +
    find "$tree/usr" -type f -exec chmod 0644 {} +
    # The shared libraries the library needs, as dh_shlibdeps finds them (${shlibs:Depends}): each
    # package and the oldest version with every symbol it uses, from the host's dpkg database
    # (the library is linked on the host, so this holds in 17's and 19's newer Debian too).
    # dpkg-shlibdeps reads debian/control, which it needs to exist only.
    local shlibs
    mkdir -p "$work/debian"
    printf 'Source: %s\n\nPackage: %s\nArchitecture: any\n' "$SOURCE" "$name" >"$work/debian/control"
    shlibs=$(cd "$work" && DEB_HOST_ARCH=$arch dpkg-shlibdeps -O "${shlibdeps[@]}" "$name/usr/lib/postgresql/$major/lib/pg_backfill.so")
    shlibs=${shlibs#shlibs:Depends=}
    [ -n "$shlibs" ] || { echo "package.sh: dpkg-shlibdeps found no dependency" >&2; return 1; }
    local server
    server=$(server_dependency "$major" "$library" "$postgres" "${binutils}nm") || return 1
    cat >"$tree/DEBIAN/control" <<CONTROL
Package: $name
Source: $SOURCE
Version: $VERSION-$REVISION
Architecture: $arch
Maintainer: $MAINTAINER
Installed-Size: $(du -sk "$tree/usr" | cut -f1)
Depends: $server, $shlibs
Section: database
Priority: optional
Description: backfill existing rows into a PostgreSQL $major logical decoding stream
 pg_backfill sends the rows a table already holds into the logical decoding
 stream of PostgreSQL $major, in key order and exactly once, while the
 application keeps writing: consumers of a replication slot (Debezium, pgoutput
 subscribers, wal2json readers) receive them as reads between the ordinary
 changes.
 .
 Add pg_backfill to shared_preload_libraries, restart, then
 CREATE EXTENSION pg_backfill.
CONTROL
    (cd "$tree" && find usr -type f -print0 | sort -z | xargs -0 md5sum) >"$tree/DEBIAN/md5sums"
    local deb=$OUT/${name}_$VERSION-${REVISION}_$arch.deb
    dpkg-deb --root-owner-group --build "$tree" "$deb" >/dev/null
    # lintian, as Debian checks its packages: an error or a warning fails the build, and the
    # package goes to $work, out of $OUT (info tags are in $work/lintian.log, not checked).
    if ! lintian_check "$deb" >"$work/lintian.log" 2>&1; then
        cat "$work/lintian.log" >&2
        mv -f "$deb" "$work/"
        echo "package.sh: lintian found errors or warnings in $work/${deb##*/} (lintian -i explains each)" >&2
        return 1
    fi
    log "$deb"
}

# cross_library MAJOR ARCH SYSROOT WORK LIBRARY: LIBRARY replaced by the library cross-compiled for
# ARCH (arm64) against Debian's ARCH headers of MAJOR, unpacked into SYSROOT. The same release
# build as `cargo pgrx package`'s (cargo's release profile, the pgMAJOR feature, no test hooks),
# in a target directory of its own (target/ARCH-MAJOR).
cross_library() {
    local major=$1 arch=$2 sysroot=$3 work=$4 library=$5 env
    [ "$arch" = arm64 ] || { echo "package.sh: no cross build known for $arch (arm64 only)" >&2; return 1; }
    logged "$work/build.log" arm64_toolchain
    logged "$work/build.log" arm64_sysroot "$major" "$sysroot"
    log "cross-compiling the library for $arch against Debian's $arch headers of $("$sysroot/pg_config" --version)"
    mapfile -t env < <(arm64_cargo_env "$major" "$sysroot")
    # (A target directory for each major: each has its own headers, which pgrx's bindgen watches.)
    # Linked as cargo links by default, the linker dropping unreferenced sections: `cargo pgrx
    # package` adds --no-gc-sections, for its schema generator, which reads the library's symbols
    # and is not run here. The functions PostgreSQL looks up are exported, so they stay; code no
    # export reaches goes, and with it calls into the server: 17's arm64 library does not call
    # heap_datum_check where its amd64 one does, and server_dependency below reads which it calls.
    logged "$work/build.log" env "${env[@]}" CARGO_TARGET_DIR="$PWD/target/$arch-$major" \
        cargo build --lib --release --target "$ARM64_TARGET" --no-default-features --features "pg$major"
    mkdir -p "$work/cross"
    cp "target/$arch-$major/$ARM64_TARGET/release/libpg_backfill.so" "$work/cross/pg_backfill.so"
    # An aarch64 shared library, or the wrong one was taken.
    readelf -h "$work/cross/pg_backfill.so" | grep -q 'Machine: *AArch64' ||
        { echo "package.sh: $work/cross/pg_backfill.so is not an AArch64 library" >&2; return 1; }
    cp "$work/cross/pg_backfill.so" "$library"
}

# image MAJOR ARCH WORK TREE: the extension image of MAJOR for ARCH, of TREE's library and SQL files,
# into $OUT/pg-backfill-$VERSION-pgMAJOR-ARCH.oci.tar (an OCI image layout, tarred), as
# CloudNativePG's image volumes expect it: lib/ and share/extension/ at its root. Tagged
# $VERSION-pgMAJOR in its index.json, as the operator's manifests name it.
image() {
    local major=$1 arch=$2 work=$3 tree=$4 layout bundle tag archive created
    command -v umoci >/dev/null || { echo "package.sh: no umoci (scripts/setup.sh installs it)" >&2; return 1; }
    layout=$work/image bundle=$work/bundle tag=$VERSION-pg$major
    archive=$OUT/pg-backfill-$VERSION-pg$major-$arch.oci.tar
    created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
    rm -rf "$layout" "$bundle"
    local log=$work/image.log
    : >"$log"
    logged "$log" umoci init --layout "$layout"
    logged "$log" umoci new --image "$layout:$tag"
    logged "$log" umoci unpack --image "$layout:$tag" "$bundle"
    mkdir -p "$bundle/rootfs/lib" "$bundle/rootfs/share/extension"
    cp "$tree/usr/lib/postgresql/$major/lib/pg_backfill.so" "$bundle/rootfs/lib/"
    cp "$tree/usr/share/postgresql/$major/extension/"pg_backfill* "$bundle/rootfs/share/extension/"
    # The licence, beside what the operator mounts.
    mkdir -p "$bundle/rootfs/licenses/pg_backfill"
    copyright >"$bundle/rootfs/licenses/pg_backfill/copyright"
    find "$bundle/rootfs" -type d -exec chmod 0755 {} + && find "$bundle/rootfs" -type f -exec chmod 0644 {} +
    find "$bundle/rootfs" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
    logged "$log" umoci repack --image "$layout:$tag" --history.created "$created" --history.created_by "scripts/package.sh" "$bundle"
    logged "$log" umoci config --image "$layout:$tag" --os linux --architecture "$arch" --created "$created" \
        --history.created "$created" --history.created_by "scripts/package.sh" \
        --config.label "org.opencontainers.image.title=pg_backfill" \
        --config.label "org.opencontainers.image.version=$VERSION" \
        --config.label "org.opencontainers.image.licenses=PostgreSQL" \
        --config.label "org.opencontainers.image.description=pg_backfill $VERSION for PostgreSQL $major ($arch)"
    logged "$log" umoci gc --layout "$layout"
    rm -rf "$bundle"
    tar -C "$layout" --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner -cf "$archive.new" .
    mv -f "$archive.new" "$archive"
    log "$archive"
}

# Server functions that PostgreSQL added in a minor release, each with the first release of each
# major that has it. PostgreSQL loads a library with every symbol bound at once (RTLD_NOW): one
# that calls such a function fails to load ("undefined symbol") on an earlier release of its
# major, so its package depends on that release. These four came with composite datum versioning
# (CVE-2026-6460), which pgrx's C shim calls into (heap_datum_check, through heap_getattr) when
# built against headers that have it: absent from 15.18's postgres, in 15.20's; pgrx-bindgen
# names 15.20, 17.12, 18.7 and 19rc2 as the releases that began it.
MINOR_RELEASE_SYMBOLS=(
    "heap_datum_check 15.20 17.12 18.7 19~rc2"
    "DatumGetHeapTupleHeader 15.20 17.12 18.7 19~rc2"
    "DatumGetHeapTupleHeaderExt 15.20 17.12 18.7 19~rc2"
    "DatumGetHeapTupleHeaderCopy 15.20 17.12 18.7 19~rc2"
)

# server_dependency MAJOR LIBRARY POSTGRES NM: the Depends on MAJOR's server for LIBRARY, built
# against the server POSTGRES: postgresql-MAJOR, versioned (>= the release) when LIBRARY calls a
# function of MINOR_RELEASE_SYMBOLS. LIBRARY's undefined symbols with no symbol version are the
# server's (libc's and libgcc's have one): each must be in POSTGRES. NM is their architecture's nm.
server_dependency() {
    local major=$1 library=$2 postgres=$3 nm=$4 needed missing entry symbol candidate release minimum=
    needed=$("$nm" -D --undefined-only "$library" | awk '$1 == "U" && $2 !~ /@/ { print $2 }' | sort -u)
    missing=$(comm -23 <(echo "$needed") <("$nm" -D --defined-only "$postgres" | awk '{ print $3 }' | sort -u))
    [ -z "$missing" ] || { echo "package.sh: $postgres defines none of: $missing" >&2; return 1; }
    for entry in "${MINOR_RELEASE_SYMBOLS[@]}"; do
        symbol=${entry%% *}
        grep -qx "$symbol" <<<"$needed" || continue
        release=
        for candidate in ${entry#* }; do
            case $candidate in "$major".* | "$major"~*) release=$candidate ;; esac
        done
        [ -n "$release" ] || { echo "package.sh: which release of $major added $symbol?" >&2; return 1; }
        if [ -z "$minimum" ] || dpkg --compare-versions "$release" gt "$minimum"; then minimum=$release; fi
    done
    echo "postgresql-$major${minimum:+ (>= $minimum)}"
}

# lintian_check DEB: lintian's tags for DEB (info ones too; `lintian -i DEB` explains each),
# failing on an error or a warning. (Its complaint at running as root, as package.sh does, is
# left out: it only unpacks and reads this package.) The info tags it gives today:
# hardening-no-bindnow (.cargo/config.toml links with -z lazy, as pgrx's template does;
# PostgreSQL binds every symbol when it loads the library anyway, RTLD_NOW),
# hardening-no-fortify-functions (_FORTIFY_SOURCE is a C compiler's; Rust's standard library
# calls libc's read or realpath as they are) and spelling-error-in-binary ("thIk", "wTH": bytes
# of machine code in .text that happen to read as misspelt words).
lintian_check() {
    lintian --display-info --tag-display-limit 0 --fail-on error,warning "$1" 2>&1 |
        grep -v '^running with root privileges is not recommended!$'
    return "${PIPESTATUS[0]}"
}

# lintian_overrides PACKAGE: the tags lintian should not raise for PACKAGE, each with its reason.
lintian_overrides() {
    cat <<OVERRIDES
# The first Debian revision of a package Debian's archive does not carry: there is no
# intent-to-package bug for its changelog to close (lintian: "can be ignored if the package is
# not intended for Debian").
$1: initial-upload-closes-no-bugs [usr/share/doc/$1/changelog.Debian.gz:1]
OVERRIDES
}

# debian_changelog MAJOR: the Debian changelog of MAJOR's package (one entry, this version's).
debian_changelog() {
    cat <<CHANGELOG
$SOURCE ($VERSION-$REVISION) unstable; urgency=medium

  * pg_backfill $VERSION for PostgreSQL $1, packaged by scripts/package.sh.
    What changed upstream: changelog.gz.

 -- $MAINTAINER  $(date -u -R -d "@$SOURCE_DATE_EPOCH")
CHANGELOG
}

# The machine-readable copyright file (Debian's copyright format 1.0). Cargo.toml's licence:
# the PostgreSQL Licence. The years run from pg_backfill's first commit (2026) to this one's.
copyright() {
    local first=2026 last years
    last=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y)
    if [ "$last" = "$first" ]; then years=$first; else years=$first-$last; fi
    cat <<COPYRIGHT
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: pg_backfill

Files: *
Copyright: $years the pg_backfill authors
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

arches=("$HOST_ARCH") format=deb majors=()
while [ $# -gt 0 ]; do
    case $1 in
        --arch) arches=(); case ${2:-} in
                all) arches=("$HOST_ARCH" arm64) ;;
                amd64 | arm64) arches=("$2") ;;
                *) echo "package.sh: --arch amd64, arm64 or all" >&2; exit 2 ;;
            esac; shift 2 ;;
        --format) case ${2:-} in
                deb | image | all) format=$2 ;;
                *) echo "package.sh: --format deb, image or all" >&2; exit 2 ;;
            esac; shift 2 ;;
        15 | 17 | 18 | 19) majors+=("$1"); shift ;;
        *) echo "package.sh: unknown argument $1 (see its header)" >&2; exit 2 ;;
    esac
done
for arch in "${arches[@]}"; do
    [ "$arch" = "$HOST_ARCH" ] || [ "$HOST_ARCH" = amd64 ] ||
        { echo "package.sh: $arch is cross-compiled on amd64 only" >&2; exit 2; }
done
if [ ${#majors[@]} -eq 0 ]; then
    for major in 15 17 18 19; do
        pg_config=$(PG_MAJOR=$major bash -c 'source scripts/lib/pg_major.sh && echo "$(pg_bin_of "$PG_MAJOR")/pg_config"')
        if "$pg_config" --version >/dev/null 2>&1; then majors+=("$major"); fi
    done
fi
[ ${#majors[@]} -gt 0 ] || { echo "package.sh: no PostgreSQL installed (scripts/setup.sh)" >&2; exit 1; }
mkdir -p "$OUT"
for arch in "${arches[@]}"; do
    for major in "${majors[@]}"; do
        if [ "$format" = image ] && [ "$major" -lt 18 ]; then
            log "no extension image for $major: extension_control_path came with PostgreSQL 18"
            continue
        fi
        started=$SECONDS
        package "$major" "$arch" "$format"
        log "$major for $arch ($format): $((SECONDS - started)) s"
    done
done
