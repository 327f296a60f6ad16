"""A real pgoutput client, npm's pg-logical-replication (pg_test/node, installed by
scripts/setup.sh from its package-lock.json), receives a backfill's messages, batched and not,
next to the changes of concurrent writers, checks every tag, and ends with an exact copy."""

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import wait_for, wait_until_ended
from test_ordering import ROWS, Writers

NODE_DIR = Path(__file__).parent / "node"


@pytest.mark.parametrize("rows_per_message", [1, 100])
def test_pg_logical_replication_builds_an_exact_copy_from_batches_and_changes(cluster, db, rows_per_message):
    assert shutil.which("node") and (NODE_DIR / "node_modules" / "pg-logical-replication").is_dir(), \
        "node and pg_test/node/node_modules are missing: run scripts/setup.sh"
    dbname = db.info.dbname
    db.execute(
        """CREATE TABLE items (id bigint PRIMARY KEY, v int NOT NULL DEFAULT 0, payload text NOT NULL);
           INSERT INTO items SELECT 2 * g, 0, md5(g::text) FROM generate_series(1, %s) g;
           ANALYZE items;
           CREATE PUBLICATION node_pub FOR TABLE items;""" % ROWS
    )
    db.execute("SELECT pg_create_logical_replication_slot('node_slot', 'pgoutput')")
    keys = {str(i): bytes(k).hex() for i, k in db.execute("SELECT id, key FROM backfill.message_key").fetchall()}
    consumer = subprocess.Popen(
        ["node", str(NODE_DIR / "consumer.js"), str(cluster.port), dbname, "node_slot", "node_pub", "items", json.dumps(keys)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        backfill_id = db.execute(
            "SELECT backfill_start('items', confirm => true, slot => 'node_slot', publication => 'node_pub',"
            " batch_size => 500, rows_per_second => 300, rows_per_message => %s)",
            [rows_per_message],
        ).fetchone()[0]
        with Writers(cluster, dbname, backfill_id) as writers:
            # (Slowly until the writers have written 500 times, whatever the machine's speed.)
            wait_for(lambda: writers.ops > 500 or writers.errors, timeout=300, what="500 writes during the backfill")
            db.execute("SELECT backfill_set(%s, rows_per_second => 15000)", [backfill_id])
            assert wait_until_ended(db, backfill_id) == "done"
            time.sleep(0.2)
        assert writers.errors == [] and writers.ops > 500
        # Delivered: the consumer confirmed past the backfill's last page.
        assert db.execute("SELECT backfill_wait(%s, '60 s')", [backfill_id]).fetchone()[0] is True
        db.execute("SELECT pg_logical_emit_message(true, 'test_end', '')")
        out, err = consumer.communicate(timeout=120)
    finally:
        if consumer.poll() is None:
            consumer.kill()
    assert consumer.returncode == 0, err
    counts, *rows = [json.loads(line) for line in out.splitlines()]
    copy = {row["id"]: (row["v"], row["payload"]) for row in rows}
    source = {str(i): (str(v), p) for i, v, p in db.execute("SELECT id, v, payload FROM items")}
    assert copy == source, counts
    assert counts["invalid"] == 0 and counts["changes"] > 0
    if rows_per_message == 1:
        assert counts["batches"] == 0 and counts["reads"] >= ROWS * 0.9
    else:
        assert counts["reads"] == 0 and counts["rowsInBatches"] >= ROWS * 0.9
        assert counts["batches"] <= counts["rowsInBatches"] / 50, counts
