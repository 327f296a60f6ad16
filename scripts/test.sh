#!/usr/bin/env bash
# Runs every test: the unit tests inside PostgreSQL (cargo pgrx test) and the end-to-end
# scenarios in pg_test/ against a throwaway cluster. Installs what is missing first.
# Pass pytest arguments to narrow the end-to-end run, e.g. scripts/test.sh -k ordering.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/install.sh

PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config

if [ $# -eq 0 ]; then
    echo "== formatting and lints (cargo fmt, cargo clippy) =="
    cargo fmt --check
    cargo clippy --all-targets --features test_hooks -- -D warnings
    python3 scripts/check_structure.py
    echo "== unit tests (cargo pgrx test) =="
    # PostgreSQL refuses to run as root: the test cluster runs as the postgres OS user.
    PGDATA_DIR=/tmp/pg_backfill_pgrx_test
    rm -rf "$PGDATA_DIR" && mkdir -p "$PGDATA_DIR" && chown postgres: "$PGDATA_DIR"
    chmod o+rx "$(pwd)" target 2>/dev/null || true
    retire_installed_library "$PG_CONFIG"
    cargo pgrx test pg15 --runas postgres --pgdata "$PGDATA_DIR"
    # The build above has no test_hooks feature, like a release: it must not carry the hook.
    if grep -q test_skip_row_locks target/debug/pg_backfill-pg15/usr/lib/postgresql/15/lib/pg_backfill.so; then
        echo "a build without the test_hooks feature contains a test hook" >&2
        exit 1
    fi
fi

echo "== end-to-end tests (pg_test/) =="
# The end-to-end tests need the test hooks (a release build never has them).
# (Written beside the installed files and renamed over them: a server running from them, such
# as the demo's, keeps running; see scripts/install.sh.)
install_extension "$PG_CONFIG" --features test_hooks
# Earlier versions' install scripts, for the upgrade tests (CREATE EXTENSION ... VERSION, then UPDATE).
cp sql/history/pg_backfill--*.sql "$("$PG_CONFIG" --sharedir)/extension/"
python3 -m pytest pg_test -p no:cacheprovider -q "$@"
