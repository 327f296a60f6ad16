#!/usr/bin/env bash
# The demo: builds and installs pg_backfill, starts a throwaway PostgreSQL cluster with logical
# decoding, backfills a 50,000-row orders table through a replication slot while an application
# keeps writing, and shows what the decoder receives. On PostgreSQL 15, or on PG_MAJOR
# (`PG_MAJOR=18 bash scripts/demo.sh`, see lib/pg_major.sh), in a directory and on a port of its own.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/lib/cluster.sh
source scripts/lib/install.sh

if [ "$PG_MAJOR" = 15 ]; then
    DEMO_DIR=${DEMO_DIR:-/tmp/pg_backfill_demo} DEMO_PORT=${DEMO_PORT:-15440}
else
    DEMO_DIR=${DEMO_DIR:-/tmp/pg_backfill_demo$PG_MAJOR} DEMO_PORT=${DEMO_PORT:-$((PG_MAJOR * 1000 + 440))}
fi
PSQL=("$PG_BIN/psql" -X -v ON_ERROR_STOP=1 -h "$DEMO_DIR" -p "$DEMO_PORT" -U postgres -d postgres)
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
show() { printf '\033[2m%s\033[0m\n' "$1"; "${PSQL[@]}" -c "$1"; }

step "Building and installing the extension"
install_extension "$PG_CONFIG" "${PG_FEATURES[@]}"

step "Starting a throwaway PostgreSQL $PG_MAJOR cluster in $DEMO_DIR (port $DEMO_PORT, wal_level = logical)"
cluster_start "$DEMO_DIR" "$DEMO_PORT"

step "A sample table: 50,000 orders"
"${PSQL[@]}" -q <<'SQL'
CREATE EXTENSION pg_backfill;
CREATE TABLE orders (
    id          bigint PRIMARY KEY,
    customer_id integer NOT NULL,
    status      text NOT NULL,
    amount      numeric(10,2) NOT NULL,
    items       jsonb NOT NULL,
    created_at  timestamptz NOT NULL
);
INSERT INTO orders
SELECT g, 1 + g % 5000, (ARRAY['new', 'paid', 'shipped'])[1 + g % 3], round((g % 997) * 1.37, 2),
       jsonb_build_array(jsonb_build_object('sku', 'SKU-' || g % 100, 'qty', 1 + g % 4)),
       timestamptz '2024-01-01' + g * interval '1 minute'
  FROM generate_series(1, 50000) g;
ANALYZE orders;
SQL

step "The consumer's replication slot (test_decoding)"
show "SELECT slot_name, lsn FROM pg_create_logical_replication_slot('demo_slot', 'test_decoding');"

step "What a backfill of orders would deliver"
show "SELECT * FROM backfill_estimate('orders');"

step "Starting it without confirm => true only reports"
"${PSQL[@]}" -c "SELECT backfill_start('orders');" 2>&1 | sed 's/^/  /' || true

step "The application keeps writing while the backfill runs"
(
    for i in $(seq 1 60); do
        "${PSQL[@]}" -q -c "UPDATE orders SET status = 'refunded' WHERE id = $((RANDOM % 50000 + 1));
                            INSERT INTO orders VALUES (100000 + $i, 42, 'new', 9.99, '[]', now());" 2>/dev/null || true
        sleep 0.1
    done
) &
writer=$!

step "Starting the backfill (paced at 10,000 rows/s so that progress can be watched)"
show "SELECT backfill_start('orders', confirm => true, rows_per_second => 10000) AS backfill_id;"
while :; do
    "${PSQL[@]}" -At -F ' | ' -c "SELECT 'state ' || state, 'rows ' || rows_done || '/' || rows_estimated,
                                         percent_done || '%', 'left ' || coalesce(time_left::text, '-'),
                                         'worker pid ' || coalesce(worker_pid::text, '-')
                                    FROM backfill_status WHERE id = 1;" | sed 's/^/  progress: /'
    [ "$("${PSQL[@]}" -At -c "SELECT state FROM backfill_status WHERE id = 1")" = running ] || break
    sleep 1
done
wait "$writer"
show "SELECT id, state, tables, rows_done, percent_done, started_at, finished_at FROM backfill_status;"
show "SELECT backfill_id, table_name, state, key_columns, cursor, upper_bound, rows_done, bytes_done FROM backfill_tables;"

step "What the decoder received: the start marker and the first reads"
show "SELECT left(data, 220) AS data FROM pg_logical_slot_peek_changes('demo_slot', NULL, NULL)
       WHERE data LIKE 'message:%' LIMIT 3;"

step "Reads next to an ordinary change the application made during the run"
show "WITH stream AS (SELECT row_number() OVER () AS n, data FROM pg_logical_slot_peek_changes('demo_slot', NULL, NULL)
                      WHERE data NOT LIKE 'table backfill.%'),
           first_change AS (SELECT min(n) AS n FROM stream
                             WHERE data LIKE 'table public.orders: UPDATE%'
                               AND n > (SELECT min(n) FROM stream WHERE data LIKE '%\"op\":\"read\"%'))
      SELECT left(data, 160) AS data FROM stream, first_change
       WHERE stream.n BETWEEN first_change.n - 3 AND first_change.n + 3 ORDER BY stream.n;"

step "The end marker"
show "SELECT data FROM pg_logical_slot_peek_changes('demo_slot', NULL, NULL) WHERE data LIKE '%\"op\":\"table_end\"%';"

step "Done. The cluster is still running:"
cat <<EOF_HINT
  $PG_BIN/psql -h $DEMO_DIR -p $DEMO_PORT -U postgres postgres
  e.g. SELECT * FROM backfill_status;  SELECT * FROM pg_logical_slot_get_changes('demo_slot', NULL, NULL);
  Stop it with: sudo -u postgres $PG_BIN/pg_ctl -D $DEMO_DIR/data stop
EOF_HINT
