#!/usr/bin/env bash
# Runs every test: the unit tests inside PostgreSQL (cargo pgrx test) and the end-to-end
# scenarios in pg_test/ against a throwaway cluster. Installs what is missing first.
# Pass pytest arguments to narrow the end-to-end run, e.g. scripts/test.sh -k ordering.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config

if [ $# -eq 0 ]; then
    echo "== unit tests (cargo pgrx test) =="
    # PostgreSQL refuses to run as root: the test cluster runs as the postgres OS user.
    PGDATA_DIR=/tmp/pg_backfill_pgrx_test
    rm -rf "$PGDATA_DIR" && mkdir -p "$PGDATA_DIR" && chown postgres: "$PGDATA_DIR"
    chmod o+rx "$(pwd)" target 2>/dev/null || true
    cargo pgrx test pg15 --runas postgres --pgdata "$PGDATA_DIR"
fi

echo "== end-to-end tests (pg_test/) =="
cargo pgrx install --release --pg-config "$PG_CONFIG" >/dev/null
# Earlier versions' install scripts, for the upgrade tests (CREATE EXTENSION ... VERSION, then UPDATE).
cp sql/history/pg_backfill--*.sql "$("$PG_CONFIG" --sharedir)/extension/"
python3 -m pytest pg_test -p no:cacheprovider -q "$@"
