# Which PostgreSQL the scripts build for, install into, test against and run: PG_MAJOR, 15
# (Debian's package) unless set. 18 is built from source under /usr/local/pgsql-18 by
# scripts/build_postgres.sh (run by scripts/setup.sh). Sourced, not run; sets
#   PG_MAJOR     15 or 18
#   PG_BIN       that server's bin directory (BACKFILL_PG_BIN, if set: another installation of the
#                same major, such as a copy of /usr/local/pgsql-18 that a second checkout installs
#                into and tests against without touching the first's)
#   PG_CONFIG    its pg_config
#   PG_FEATURES  the cargo arguments that build pg_backfill for it (pgrx's bindings of that major)

PG_MAJOR=${PG_MAJOR:-15}

# pg_bin_of MAJOR: where that major's programs are installed.
pg_bin_of() {
    case $1 in
        15) echo /usr/lib/postgresql/15/bin ;;
        *) echo "/usr/local/pgsql-$1/bin" ;;
    esac
}

case $PG_MAJOR in
    15 | 18) ;;
    *) echo "PG_MAJOR=$PG_MAJOR: pg_backfill builds for PostgreSQL 15 and 18" >&2; return 2 ;;
esac
PG_BIN=${BACKFILL_PG_BIN:-$(pg_bin_of "$PG_MAJOR")}
PG_CONFIG=$PG_BIN/pg_config
PG_FEATURES=(--no-default-features --features "pg$PG_MAJOR")
export PG_MAJOR PG_BIN
