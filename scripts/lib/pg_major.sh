# Which PostgreSQL the scripts build for, install into, test against and run: PG_MAJOR, 15
# (Debian's package) unless set. The one place that says where each major lives:
#   15  Debian 12's packages (postgresql-15), on this host
#   17  Debian 13's packages (postgresql-17), in a Debian 13 root made by scripts/pg_root.sh: they
#       need glibc 2.38, Debian 12 has 2.36. Its programs are reached through wrappers that run
#       them inside the root (scripts/pg_root.sh says how and why).
#   18  built from Debian's source package under /usr/local/pgsql-18 by scripts/build_postgres.sh
#   19  Debian's packages of its release candidate, from Debian's experimental suite, in a Debian
#       sid root (pg_root.sh, as 17): they need glibc 2.43. (Built from source as 18 is, it
#       would need experimental's source package, which the archive does not serve here: its
#       files answer 404, where experimental's binary packages download.)
# (16 is in no Debian release: see docs/installing.md, Supported versions.) scripts/setup.sh installs
# whichever is missing. Sourced, not run; sets
#   PG_MAJOR     15, 17, 18 or 19
#   PG_BIN       that server's bin directory (BACKFILL_PG_BIN, if set: another installation of the
#                same major, such as a copy of /usr/local/pgsql-18 that a second checkout installs
#                into and tests against without touching the first's)
#   PG_CONFIG    its pg_config (for 17, one that gives pgrx the root's headers)
#   PG_ROOT      the directory its server sees as / ("" for the host): files are installed under
#                it, at the paths its pg_config names (BACKFILL_PG_ROOT, if set: the root of the
#                installation BACKFILL_PG_BIN names, such as a package test's Debian root)
#   PG_FEATURES  the cargo arguments that build pg_backfill for it (pgrx's bindings of that major)

PG_MAJOR=${PG_MAJOR:-15}
PG_ROOTS_DIR=/var/lib/pg_backfill

# pg_bin_of MAJOR: where that major's programs are installed.
pg_bin_of() {
    case $1 in
        15) echo /usr/lib/postgresql/15/bin ;;
        17 | 19) echo "$PG_ROOTS_DIR/pg$1/bin" ;;
        *) echo "/usr/local/pgsql-$1/bin" ;;
    esac
}

# pg_root_of MAJOR: the root its server runs in ("" for the host).
pg_root_of() {
    case $1 in
        17) echo "$PG_ROOTS_DIR/trixie" ;;
        19) echo "$PG_ROOTS_DIR/sid" ;;
        *) echo "" ;;
    esac
}

# pg_root_suite_of MAJOR: the Debian release whose packages make that major's root, then, after
# a "+", the suite that PostgreSQL's own packages come from when that release does not carry them.
pg_root_suite_of() {
    case $1 in
        17) echo trixie ;;
        19) echo sid+experimental ;;
    esac
}

case $PG_MAJOR in
    15 | 17 | 18 | 19) ;;
    *) echo "PG_MAJOR=$PG_MAJOR: pg_backfill builds for PostgreSQL 15, 17, 18 and 19" >&2; return 2 ;;
esac
PG_BIN=${BACKFILL_PG_BIN:-$(pg_bin_of "$PG_MAJOR")}
PG_CONFIG=$PG_BIN/pg_config
PG_ROOT=${BACKFILL_PG_ROOT-$(pg_root_of "$PG_MAJOR")}
PG_FEATURES=(--no-default-features --features "pg$PG_MAJOR")
export PG_MAJOR PG_BIN PG_ROOT
