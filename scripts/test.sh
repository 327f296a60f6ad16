#!/usr/bin/env bash
# Runs every test: the unit tests inside PostgreSQL (cargo pgrx test) and the end-to-end
# scenarios in pg_test/ against a throwaway cluster. Installs what is missing first.
# Pass pytest arguments to narrow the end-to-end run, e.g. scripts/test.sh -k ordering.
#
# PG_MAJOR=18 runs it all against PostgreSQL 18 (15 unless set; see lib/pg_major.sh). Where it runs:
#   BACKFILL_TEST_DIR, BACKFILL_TEST_PORT  the end-to-end cluster (pg_test/conftest.py; other
#                                          clusters take ports above it)
#   BACKFILL_PGRX_TEST_DIR                 the unit tests' cluster
# On 17 and 19, whose servers run in Debian roots (lib/pg_major.sh), the unit tests do not run:
# `cargo pgrx test` starts its own server from pg_config's bindir, which only the root can run.
# They run on 15 and 18, the end-to-end tests on all four.
#
#   bash scripts/test.sh --installed [pytest arguments]
# is the installcheck: the end-to-end tests that need nothing but an installed pg_backfill (a
# package's, a release build's), against the installation of PG_MAJOR (BACKFILL_PG_BIN: another
# one), in a cluster it makes. It builds and installs nothing. It leaves out the tests that need
# a build of this tree (conftest.py's NEEDS_THE_SOURCE_TREE says which and why).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = --installed ]; then
    shift
    source scripts/lib/pg_major.sh
    python3 -c "import psycopg, psycopg2, pytest, xxhash" 2>/dev/null || {
        echo "the tests need psycopg, psycopg2, pytest and xxhash (scripts/setup.sh installs them)" >&2
        exit 1
    }
    echo "== installcheck: end-to-end tests against the installed pg_backfill (PostgreSQL $PG_MAJOR, $PG_BIN) =="
    BACKFILL_INSTALLED=1 exec python3 -m pytest pg_test -p no:cacheprovider -q "$@"
fi

bash scripts/setup.sh
source scripts/lib/pg_major.sh
source scripts/lib/install.sh

# BACKFILL_CHECKS=1 runs the lints and unit tests below even when pytest arguments narrow the
# end-to-end run (.ci/run does, on 15).
checks=$([ $# -eq 0 ] || [ "${BACKFILL_CHECKS:-0}" = 1 ] && echo 1 || echo 0)
if [ "$checks" = 1 ]; then
    echo "== formatting and lints (cargo fmt, cargo clippy; PostgreSQL $PG_MAJOR) =="
    cargo fmt --check
    cargo clippy --all-targets "${PG_FEATURES[@]}" --features test_hooks -- -D warnings
    python3 scripts/check_structure.py
fi
# BACKFILL_UNIT_TESTS=0 leaves them out (.ci/run runs them on 15 only, for time).
if [ "$checks" = 1 ] && [ -z "$PG_ROOT" ] && [ "${BACKFILL_UNIT_TESTS:-1}" != 0 ]; then
    echo "== unit tests (cargo pgrx test pg$PG_MAJOR) =="
    # PostgreSQL refuses to run as root: the test cluster runs as the postgres OS user.
    PGDATA_DIR=${BACKFILL_PGRX_TEST_DIR:-/tmp/pg_backfill_pgrx_test}
    rm -rf "$PGDATA_DIR" && mkdir -p "$PGDATA_DIR" && chown postgres: "$PGDATA_DIR"
    chmod o+rx "$(pwd)" target 2>/dev/null || true
    retire_installed_library "$PG_CONFIG"
    cargo pgrx test "pg$PG_MAJOR" --runas postgres --pgdata "$PGDATA_DIR"
    # The build above has no test_hooks feature, like a release: it must not carry the hook.
    if grep -q test_skip_row_locks "target/debug/pg_backfill-pg$PG_MAJOR$("$PG_CONFIG" --pkglibdir)/pg_backfill.so"; then
        echo "a build without the test_hooks feature contains a test hook" >&2
        exit 1
    fi
fi

echo "== end-to-end tests (pg_test/, PostgreSQL $PG_MAJOR) =="
# The end-to-end tests need the test hooks (a release build never has them).
# (Written beside the installed files and renamed over them: a server running from them, such
# as the demo's, keeps running; see scripts/lib/install.sh.)
install_extension "$PG_CONFIG" "${PG_FEATURES[@]}" --features test_hooks --profile tests
# Earlier versions' install scripts, for the upgrade tests (CREATE EXTENSION ... VERSION, then UPDATE).
cp sql/history/pg_backfill--*.sql "$PG_ROOT$("$PG_CONFIG" --sharedir)/extension/"
if [ "$PG_MAJOR" != 15 ] && [ -z "$PG_ROOT" ]; then
    # test_pg_upgrade.py's PostgreSQL 15 cluster loads pg_backfill from this package directory
    # (Debian's extension_destdir): nothing is written into the system's PostgreSQL 15, whose
    # servers may be running.
    export BACKFILL_PG15_PACKAGE=$PWD/target/pg15-package
    cargo pgrx package --no-default-features --features pg15 --pg-config "$(pg_bin_of 15)/pg_config" \
        --profile tests --out-dir "$BACKFILL_PG15_PACKAGE" >/dev/null
fi
# The end-to-end tests mostly wait on their servers: they run on BACKFILL_TEST_JOBS workers
# (pytest-xdist; 3 unless set, at most 3: conftest.py gives each a cluster and ports of its own),
# then the few that change the installation every cluster loads run alone (their "exclusive" mark).
jobs=${BACKFILL_TEST_JOBS:-3}
run_pytest() {
    local rc=0
    python3 -m pytest pg_test -p no:cacheprovider -q "$@" || rc=$?
    # (5: no test was selected, as when the arguments name none of a phase's tests.)
    [ "$rc" = 0 ] || [ "$rc" = 5 ]
}
if [ "$jobs" -gt 1 ]; then
    BACKFILL_TEST_PHASE=parallel run_pytest -n "$jobs" --dist worksteal "$@"
    BACKFILL_TEST_PHASE=exclusive run_pytest "$@"
else
    python3 -m pytest pg_test -p no:cacheprovider -q "$@"
fi
