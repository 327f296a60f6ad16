# What building pg_backfill for arm64 on an amd64 machine needs (scripts/package.sh --arch arm64).
# Sourced, not run; as root.
#
#   arm64_toolchain                 Debian's cross compiler and arm64 C library
#                                   (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross) and Rust's
#                                   aarch64 standard library
#   arm64_sysroot MAJOR DIR         Debian's arm64 packages of MAJOR into DIR, each unpacked under
#                                   DIR/<package> (dpkg-deb -R: its files and its DEBIAN/), and
#                                   DIR/pg_config, a pg_config for pgrx naming their headers
#   arm64_cargo_env MAJOR DIR       the environment (NAME=VALUE lines) that cross-builds the
#                                   library with `cargo build --target aarch64-unknown-linux-gnu`
#                                   against DIR
#
# The headers are Debian's own arm64 builds, postgresql-server-dev-MAJOR:arm64, from the suite
# that carries MAJOR: 15 bookworm's, 17 trixie's, 18 sid's (the suite whose source package
# scripts/build_postgres.sh builds the host's 18 from), 19 experimental's; each the same release as
# the host's of that major. Not the host's headers: pg_config.h is written by configure for its
# machine. Its sizes and alignments are the same on aarch64 and x86_64 (both LP64), but aarch64's
# has USE_ARMV8_CRC32C_WITH_RUNTIME_CHECK where x86_64's has USE_SSE42_CRC32C_WITH_RUNTIME_CHECK,
# HAVE__GET_CPUID and HAVE_X86_64_POPCNTQ (15.20's, compared), and pgrx's C shim compiles the
# headers' inline functions. Also taken: the server package (package.sh checks the library's
# server symbols against the arm64 postgres), libicu-dev (the server's headers include ICU's), and
# libc6 and libgcc-s1 for dpkg-shlibdeps (bookworm's: the cross compiler links against bookworm's
# C library, libc6-dev-arm64-cross). apt gets a sources directory, lists and status of its own,
# under DIR/../apt: the system's apt state is left as it was.

ARM64_TARGET=aarch64-unknown-linux-gnu
ARM64_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

source "$(dirname "${BASH_SOURCE[0]}")/host_packages.sh"

arm64_log() { printf '\033[1m[arm64]\033[0m %s\n' "$*"; }

arm64_toolchain() {
    host_packages_install gcc-aarch64-linux-gnu libc6-dev-arm64-cross binutils-aarch64-linux-gnu || return 1
    local toolchain
    toolchain=$(sed -n 's/^channel = "\(.*\)"$/\1/p' rust-toolchain.toml)
    if ! rustup target list --installed --toolchain "$toolchain" | grep -qx "$ARM64_TARGET"; then
        arm64_log "adding Rust's $ARM64_TARGET standard library (rustup)"
        rustup target add "$ARM64_TARGET" --toolchain "$toolchain" >/dev/null
    fi
}

# arm64_suites_of MAJOR: the Debian suites whose arm64 packages of MAJOR are taken.
arm64_suites_of() {
    case $1 in
        15) echo bookworm ;;
        17) echo trixie ;;
        18) echo sid ;;
        19) echo sid experimental ;;
        *) echo "arm64.sh: no Debian suite known for PostgreSQL $1" >&2; return 1 ;;
    esac
}

# arm64_download SUITES DIR PACKAGE...: the arm64 .debs of PACKAGEs (apt's candidates in SUITES),
# unpacked under DIR.
arm64_download() {
    local suites=$1 dir=$2 suite apt state
    shift 2
    state=$(dirname "$dir")/apt/${suites// /+}
    mkdir -p "$state/parts" "$state/lists/partial" "$dir/debs"
    : >"$state/status"
    # (A stable release with its point and security updates, as the arm64 roots of the package
    # tests have them: scripts/lib/debian_root.sh.)
    for suite in $suites; do
        echo "deb [arch=arm64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $ARM64_MIRROR $suite main"
        case $suite in
            bookworm | trixie)
                echo "deb [arch=arm64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $ARM64_MIRROR $suite-updates main"
                echo "deb [arch=arm64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $ARM64_MIRROR-security $suite-security main" ;;
        esac
    done >"$state/parts/arm64.list"
    apt=(-o Dir::Etc::sourcelist=/dev/null -o "Dir::Etc::sourceparts=$state/parts" -o "Dir::State::Lists=$state/lists"
         -o "Dir::State::status=$state/status" -o "Dir::Cache=$state/cache" -o APT::Architecture=arm64
         -o APT::Architectures=arm64 -o Acquire::Check-Valid-Until=false)
    mkdir -p "$state/cache/archives/partial"
    # (Lists older than a day are fetched again: sid and experimental move.)
    if ! cmp -s "$state/parts/arm64.list" "$state/lists/.sources" ||
        [ -z "$(find "$state/lists" -maxdepth 1 -name '*Packages*' -mmin -1440 2>/dev/null)" ]; then
        apt-get "${apt[@]}" update -qq
        cp "$state/parts/arm64.list" "$state/lists/.sources"
    fi
    local package deb
    for package in "$@"; do
        rm -f "$dir/debs/${package}"_*.deb
        # (As root, apt downloads unsandboxed into a directory its _apt user cannot write: it says so.)
        (cd "$dir/debs" && apt-get "${apt[@]}" download -qq "$package:arm64" 2>&1 | grep -v 'unsandboxed as root' >&2 || true)
        deb=$(ls "$dir/debs/${package}"_*_arm64.deb) || { echo "arm64.sh: apt did not download $package:arm64" >&2; return 1; }
        # Unpacked again only when it is another version: new files under the same names would
        # make cargo run pgrx's bindgen again (it watches the headers).
        if [ "$(cat "$dir/$package.unpacked" 2>/dev/null)" != "${deb##*/}" ]; then
            rm -rf "${dir:?}/$package"
            dpkg-deb -R "$deb" "$dir/$package"
            echo "${deb##*/}" >"$dir/$package.unpacked"
        fi
    done
}

arm64_sysroot() {
    local major=$1 dir=$2 suites server
    suites=$(arm64_suites_of "$major") || return 1
    arm64_log "Debian's arm64 packages of PostgreSQL $major ($suites) into $dir"
    # (libicu-dev: the server's headers include ICU's, as PostgreSQL is built with ICU.)
    arm64_download "$suites" "$dir" "postgresql-server-dev-$major" "postgresql-$major" libicu-dev || return 1
    arm64_download bookworm "$dir" libc6 libgcc-s1 || return 1
    server=$dir/postgresql-server-dev-$major/usr/include/postgresql/$major/server
    [ -f "$server/pg_config.h" ] || { echo "arm64.sh: no $server/pg_config.h" >&2; return 1; }
    local version
    version=$(sed -n 's/^#define PG_VERSION "\(.*\)"$/\1/p' "$server/pg_config.h")
    # pgrx asks pg_config for the version, the headers and the C flags only; the arm64 pg_config of
    # the package would need emulation, and answers with paths of the arm64 machine anyway.
    cat >"$dir/pg_config" <<CONFIG
#!/bin/sh
# PostgreSQL $major's arm64 headers, from Debian's postgresql-server-dev-$major:arm64 (scripts/lib/arm64.sh).
case "\$1" in
    --version) echo "PostgreSQL $version" ;;
    --includedir-server) echo "$server" ;;
    --includedir | --pkgincludedir) echo "$dir/postgresql-server-dev-$major/usr/include/postgresql" ;;
    --pkglibdir) echo /usr/lib/postgresql/$major/lib ;;
    --sharedir) echo /usr/share/postgresql/$major ;;
    --bindir) echo /usr/lib/postgresql/$major/bin ;;
    --libdir) echo "$dir/postgresql-$major/usr/lib/postgresql/$major/lib" ;;  # (a link search path only: nothing is linked from it)
    --cppflags) echo "-D_GNU_SOURCE -I$dir/libicu-dev/usr/include" ;;
    --configure | --cflags | --ldflags | --libs) echo "" ;;
    *) echo "pg_config (arm64 headers): \$1 is not known here" >&2; exit 1 ;;
esac
CONFIG
    chmod 0755 "$dir/pg_config"
}

arm64_cargo_env() {
    local major=$1 dir=$2 sysroot=/usr/aarch64-linux-gnu
    # pgrx-pg-sys's build script: PGRX_PG_CONFIG_PATH is its pg_config (the arm64 headers);
    # bindgen runs clang for aarch64 (it passes cargo's TARGET on as clang's --target), given the
    # arm64 C library's headers and none of the host's (PGRX_BINDGEN_NO_DETECT_INCLUDES); the C
    # shim and the link are Debian's cross gcc's.
    echo "PGRX_PG_CONFIG_PATH=$dir/pg_config"
    echo "PGRX_BINDGEN_NO_DETECT_INCLUDES=1"
    echo "BINDGEN_EXTRA_CLANG_ARGS_${ARM64_TARGET//-/_}=--sysroot=$sysroot -isystem $sysroot/include"
    echo "CC_${ARM64_TARGET//-/_}=aarch64-linux-gnu-gcc"
    echo "AR_${ARM64_TARGET//-/_}=aarch64-linux-gnu-ar"
    echo "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc"
}
