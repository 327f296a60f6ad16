# A Debian root of another release (debootstrap), for a PostgreSQL major whose Debian packages
# need a newer C library than the host's, or for testing a package in a system of its own.
# Sourced, not run; as root. PostgreSQL 17 is Debian 13's (trixie): its binaries need glibc
# 2.38 and Debian 12 has 2.36, so they run in a trixie root (see pg_major.sh); the package tests
# install Debian 12's postgresql-15 into a bookworm root, away from the host's PostgreSQL 15.
#
#   debian_root_make DIR SUITE [PACKAGE...]   makes DIR once (later runs reuse it), installs PACKAGEs;
#                                             of DEBIAN_ROOT_ARCH's packages if set (arm64: its
#                                             programs run through qemu-user-static, see below)
#   debian_root_source_from DIR SUITE SOURCE  DIR's apt takes the binary packages of the source
#                                             package SOURCE from SUITE too (such as experimental)
#   debian_root_mount DIR                     /proc, /dev, /dev/shm and the host's /tmp inside it
#   debian_root_umount DIR
#
# The host's /tmp is the root's /tmp: a cluster directory such as /tmp/pg_backfill_test17 is the
# same path on both sides, so the tests (on the host) and the server (in the root) share it. The
# root's postgres user has the host's uid and gid, so that the files each side writes there
# belong to the same postgres.

DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

source "$(dirname "${BASH_SOURCE[0]}")/host_packages.sh"

debian_root_log() { printf '\033[1m[debian_root]\033[0m %s\n' "$*"; }

debian_root_make() {
    local dir=$1 suite=$2
    shift 2
    local arch=()
    if [ -n "${DEBIAN_ROOT_ARCH:-}" ] && [ "$DEBIAN_ROOT_ARCH" != "$(dpkg --print-architecture)" ]; then
        # (Again for a root made before: binfmt_misc's registrations go with a reboot.)
        debian_root_emulate "$DEBIAN_ROOT_ARCH" || return 1
        arch=(--arch "$DEBIAN_ROOT_ARCH")
    fi
    if [ ! -f "$dir/.pg_backfill-bootstrapped" ]; then
        command -v debootstrap >/dev/null || {
            debian_root_log "installing debootstrap (Debian package)"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null ||
                { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
        }
        debian_root_log "making a Debian $suite root in $dir (debootstrap, a few minutes)"
        debian_root_umount "$dir"
        # (Never remove through a mount: the host's /tmp is bound inside.)
        if [ -n "$(findmnt -rn -o TARGET | grep -F "$dir/" || true)" ]; then
            echo "debian_root.sh: $dir still has mounts inside; not removing it" >&2
            return 1
        fi
        rm -rf "$dir"
        mkdir -p "$(dirname "$dir")"
        debootstrap --variant=minbase --keyring=/usr/share/keyrings/debian-archive-keyring.gpg "${arch[@]}" \
            "$suite" "$dir" "$DEBIAN_MIRROR" >"$dir.debootstrap.log" 2>&1 ||
            { tail -20 "$dir.debootstrap.log"; return 1; }
        # No service starts inside the root (postgresql-common would start a cluster), and
        # Debian's postgresql-common makes no "main" cluster: the scripts make their own.
        printf '#!/bin/sh\nexit 101\n' >"$dir/usr/sbin/policy-rc.d"
        chmod 0755 "$dir/usr/sbin/policy-rc.d"
        mkdir -p "$dir/etc/postgresql-common"
        echo 'create_main_cluster = false' >"$dir/etc/postgresql-common/createcluster.conf"
        # The host's postgres user and group, with the host's ids (before postgresql-common,
        # whose adduser then finds them).
        local uid gid
        uid=$(id -u postgres) gid=$(id -g postgres)
        chroot "$dir" getent group postgres >/dev/null || chroot "$dir" groupadd --system -g "$gid" postgres
        chroot "$dir" getent passwd postgres >/dev/null ||
            chroot "$dir" useradd --system -u "$uid" -g "$gid" -d /var/lib/postgresql -s /bin/bash postgres
        touch "$dir/.pg_backfill-bootstrapped"
    fi
    local missing=() package
    # A stable release's point updates and security updates, as a Debian system has them: the
    # packages are built against the newest headers of the release (the host's, the arm64 ones of
    # scripts/lib/arm64.sh), and may need its newest server (package.sh's versioned Depends). Once
    # added, the packages asked for are installed again, which upgrades them.
    if [ -n "${DEBIAN_ROOT_ARCH:-}" ] && debian_root_updates "$dir" "$suite"; then missing=("$@"); fi
    for package in "$@"; do
        chroot "$dir" dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
            missing+=("$package")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        debian_root_log "installing into $dir: ${missing[*]}"
        debian_root_mount "$dir"
        # The Release files of a suite that moves (sid, experimental) expire a week after they
        # are signed: a mirror that keeps a snapshot serves them expired, and apt would refuse
        # them. (A stable release's, such as trixie's, never expire.)
        echo 'Acquire::Check-Valid-Until "false";' >"$dir/etc/apt/apt.conf.d/99pg_backfill-snapshot"
        chroot "$dir" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        chroot "$dir" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
            >"$dir.apt.log" 2>&1 || { tail -20 "$dir.apt.log"; return 1; }
    fi
}

# debian_root_emulate ARCH: the kernel runs ARCH's programs (arm64's) through Debian's
# qemu-user-static, registered with binfmt_misc with its "F" flag: the kernel opens the emulator
# when it is registered, so that it runs programs inside a root too, where the emulator's path does
# not exist. Every program of the root, apt's and PostgreSQL's too, then runs emulated: several
# times slower, with the same system calls (the kernel is the host's).
debian_root_emulate() {
    local arch=$1 qemu
    case $arch in
        arm64) qemu=qemu-aarch64 ;;
        *) echo "debian_root.sh: no emulator known for $arch" >&2; return 1 ;;
    esac
    host_packages_install qemu-user-static binfmt-support || return 1
    mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    update-binfmts --enable "$qemu" 2>/dev/null || true
    grep -qx enabled "/proc/sys/fs/binfmt_misc/$qemu" 2>/dev/null || {
        echo "debian_root.sh: binfmt_misc does not run $arch's programs through $qemu" >&2
        return 1
    }
    grep -q '^flags: .*F' "/proc/sys/fs/binfmt_misc/$qemu" || {
        echo "debian_root.sh: $qemu is registered without the F flag: it would not run inside a root" >&2
        return 1
    }
}

# debian_root_updates DIR SUITE: DIR's apt takes SUITE's updates and security updates too, when
# SUITE is a stable release; true when that was added now.
debian_root_updates() {
    local dir=$1 suite=$2 list=$1/etc/apt/sources.list.d/updates.list
    case $suite in bookworm | trixie) ;; *) return 1 ;; esac
    [ ! -f "$list" ] || return 1
    printf 'deb %s %s-updates main\ndeb %s-security %s-security main\n' "$DEBIAN_MIRROR" "$suite" "$DEBIAN_MIRROR" "$suite" >"$list"
}

debian_root_source_from() {
    local dir=$1 suite=$2 source=$3
    echo "deb $DEBIAN_MIRROR $suite main" >"$dir/etc/apt/sources.list.d/$suite.list"
    # Experimental's packages are never taken unless asked for (priority 1): these are, and with
    # them the libraries of the same source that they depend on (postgresql-client-19 needs
    # libpq5 19), at the priority of the root's own suite, where the higher version wins.
    printf 'Package: src:%s\nPin: release a=%s\nPin-Priority: 500\n' "$source" "$suite" \
        >"$dir/etc/apt/preferences.d/$source"
}

debian_root_mount() {
    local dir=$1
    mountpoint -q "$dir/proc" || mount -t proc proc "$dir/proc"
    mountpoint -q "$dir/dev" || mount --bind /dev "$dir/dev"
    mountpoint -q "$dir/dev/shm" || mount --bind /dev/shm "$dir/dev/shm"
    mountpoint -q "$dir/tmp" || mount --bind /tmp "$dir/tmp"
}

debian_root_umount() {
    local dir=$1 mount
    for mount in tmp dev/shm dev proc; do
        if mountpoint -q "$dir/$mount" 2>/dev/null; then umount "$dir/$mount" || umount -l "$dir/$mount"; fi
    done
}

# debian_root_programs DIR MAJOR BIN: BIN gets one wrapper per program of PostgreSQL MAJOR in
# DIR, each running it inside DIR (see scripts/pg_root.sh for how and why), and a pg_config for
# pgrx on the host. Written into a new directory that replaces BIN when they differ.
debian_root_programs() {
    local dir=$1 major=$2 bin=$3 stage program name inside=/usr/lib/postgresql/$2/bin
    mkdir -p "$(dirname "$bin")"
    stage=$(mktemp -d "$(dirname "$bin")/.bin.XXXXXX")
    cat >"$stage/.run" <<RUN
#!/bin/sh
# Runs a program of $dir inside it, as the calling user, in the calling directory (/ when the
# root has no such directory). Written by scripts/lib/debian_root.sh; scripts/pg_root.sh says why.
root=$dir
mountpoint -q "\$root/tmp" || {
    echo "\$root is not mounted (after a reboot?): run PG_MAJOR=$major bash scripts/setup.sh as root" >&2
    exit 1
}
wd=/
[ -d "\$root\$PWD" ] && wd=\$PWD
if [ "\$(id -u)" = 0 ]; then
    exec /usr/bin/unshare --root="\$root" --wd="\$wd" "\$@"
fi
exec /usr/bin/unshare --user --map-user="\$(id -u)" --map-group="\$(id -g)" --root="\$root" --wd="\$wd" "\$@"
RUN
    for program in "$dir$inside"/*; do
        name=$(basename "$program")
        printf '#!/bin/sh\n# PostgreSQL %s'"'"'s %s, run inside %s (scripts/lib/debian_root.sh)\nexec %s/.run %s/%s "$@"\n' \
            "$major" "$name" "$dir" "$bin" "$inside" "$name" >"$stage/$name"
    done
    # pgrx reads the headers on the host: the include directories with the root's prefix.
    cat >"$stage/pg_config" <<CONFIG
#!/bin/sh
# PostgreSQL $major's pg_config, run inside $dir, its include directories given with the
# root's prefix: pgrx reads the headers on the host (scripts/pg_root.sh).
out=\$($bin/.run $inside/pg_config "\$@") || exit
case "\$#:\$1" in
    1:--includedir | 1:--pkgincludedir | 1:--includedir-server) echo "$dir\$out" ;;
    1:--cppflags) echo "\$out" | sed "s#-I/#-I$dir/#g" ;;
    *) echo "\$out" ;;
esac
CONFIG
    chmod 0755 "$stage" "$stage"/* "$stage/.run"
    if diff -rq "$stage" "$bin" >/dev/null 2>&1; then
        rm -rf "$stage"
    else
        rm -rf "$bin.old"
        if [ -d "$bin" ]; then mv "$bin" "$bin.old"; fi
        mv "$stage" "$bin"
        rm -rf "$bin.old"
    fi
}
