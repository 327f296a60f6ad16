"""Ordering under concurrent writes: a consumer that applies changes and reads in stream order,
reads as plain upserts, must end with exactly the source table, and must never see a read carry
an older version of a row than a change it already applied, nor bring a deleted row back.

The same scenario with the row locks switched off (a test-only setting) must fail: that shows
the test can catch the race the locks prevent."""

import random
import time

import pytest

from conftest import Background, as_reads, backfill_messages, wait_for, wait_until_ended, wal2json_changes

ROWS = 30_000  # even ids 2..60000; writers insert odd ids, so no key is ever reused
BATCH = 100
WRITES = 1_000  # the writes a scenario waits for while its backfill runs


class Writers(Background):
    """Application traffic: updates (many just ahead of the backfill's cursor), inserts below and
    above the cursor, deletes, key changes, and two-row transactions in random order."""

    def __init__(self, cluster, dbname, backfill_id, count=2):
        super().__init__(count)
        self.cluster, self.dbname, self.backfill_id = cluster, dbname, backfill_id
        self.errors, self.ops = [], 0

    def run(self, writer, writers):
        rng = random.Random(writer)
        fresh = iter(range(2 * writer + 1, 2 * ROWS + 40_000, 2 * writers))  # odd ids of this writer
        cursor = 0
        try:
            with self.cluster.connect(self.dbname) as conn:
                while not self.stop.is_set():
                    self.ops += 1
                    if self.ops % 20 == 0:
                        row = conn.execute(
                            "SELECT cursor[1]::bigint FROM backfill_tables WHERE backfill_id = %s"
                            " ORDER BY random() LIMIT 1",
                            [self.backfill_id],
                        ).fetchone()
                        cursor = row[0] or 0 if row else 0
                    dice = rng.random()
                    if dice < 0.5:  # just ahead of the cursor: the rows the current page reads
                        target = cursor + 2 * rng.randint(1, 2 * BATCH)
                        conn.execute("UPDATE items SET v = v + 1 WHERE id = %s", [target])
                    elif dice < 0.65:
                        conn.execute("UPDATE items SET v = v + 1 WHERE id = %s", [2 * rng.randint(1, ROWS)])
                    elif dice < 0.75:
                        conn.execute("INSERT INTO items (id, payload) VALUES (%s, 'inserted')", [next(fresh)])
                    elif dice < 0.85:
                        conn.execute("DELETE FROM items WHERE id = %s", [2 * rng.randint(1, ROWS)])
                    elif dice < 0.95:
                        conn.execute(
                            "UPDATE items SET id = %s, v = v + 1 WHERE id = %s", [next(fresh), 2 * rng.randint(1, ROWS)]
                        )
                    else:
                        a, b = 2 * rng.randint(1, ROWS), 2 * rng.randint(1, ROWS)
                        with conn.transaction():
                            conn.execute("UPDATE items SET v = v + 1 WHERE id = %s", [a])
                            conn.execute("UPDATE items SET v = v + 1 WHERE id = %s", [b])
        except Exception as e:  # a writer must never fail because of the backfill
            self.errors.append(repr(e))


def column_values(change, field):
    return {c["name"]: c["value"] for c in change[field]}


def replay(changes, prefix="backfill"):
    """Applies the stream in order; returns (final rows by id, ordering violations)."""
    state, deleted, violations = {}, set(), []
    for change in changes:
        action = change["action"]
        if action in "IUD" and change["table"] != "items":
            continue
        if action == "I":
            row = column_values(change, "columns")
            state[row["id"]] = (row["v"], row["payload"])
        elif action == "U":
            old_id = column_values(change, "identity")["id"] if "identity" in change else None
            row = column_values(change, "columns")
            if old_id is not None and old_id != row["id"]:
                state.pop(old_id, None)
                deleted.add(old_id)
            state[row["id"]] = (row["v"], row["payload"])
        elif action == "D":
            old_id = column_values(change, "identity")["id"]
            state.pop(old_id, None)
            deleted.add(old_id)
        elif action == "M" and change["prefix"] == prefix:
            # A batch (rows_per_message > 1) is applied as its rows, in order.
            for message in as_reads(backfill_messages([change], prefix)):
                if message["op"] != "read" or message["table"] != "items":
                    continue
                row = message["data"]
                if row["id"] in deleted:
                    violations.append(f"read brought back deleted row {row['id']}")
                elif row["id"] in state and state[row["id"]][0] > row["v"]:
                    violations.append(f"read of {row['id']} at v{row['v']} after change to v{state[row['id']][0]}")
                state[row["id"]] = (row["v"], row["payload"])
    return state, violations


def run_scenario(cluster, db, skip_row_locks, parallel=1, lock_mode="auto", rows_per_message=1, row_filter=None,
                 other_tables=0):
    """With `row_filter` (pg_test/test_filter.py): rows start with v = id / 2 % 2, and the filter
    keeps even v, so that every update flips a row into or out of it. With `other_tables`, the
    backfill has that many small tables besides items, each scanned whole by one worker, while
    the workers share items."""
    dbname = db.info.dbname
    db.execute(f"SET backfill.lock_mode = '{lock_mode}'")
    if skip_row_locks:
        db.execute(f'ALTER DATABASE "{dbname}" SET backfill.test_skip_row_locks = on')
    db.execute(
        """CREATE TABLE items (id bigint PRIMARY KEY, v int NOT NULL DEFAULT 0, payload text NOT NULL);
           INSERT INTO items SELECT 2 * g, %s, md5(g::text) FROM generate_series(1, %s) g;
           ANALYZE items;""" % ("g % 2" if row_filter else "0", ROWS)
    )
    others = [f"other{i}" for i in range(other_tables)]
    for name in others:
        db.execute(f"""CREATE TABLE {name} (id bigint PRIMARY KEY, v int NOT NULL DEFAULT 0, payload text NOT NULL);
                       INSERT INTO {name} SELECT g, 0, md5(g::text) FROM generate_series(1, 2000) g;
                       ANALYZE {name};""")
    db.execute("SELECT pg_create_logical_replication_slot('consumer', 'wal2json')")
    # The writers' share of the run must not hang on the machine's speed: the backfill starts slowly
    # (300 rows/s: 100 s for items), and goes at 10,000 rows/s once they have written 1,000 times.
    backfill_id = db.execute(
        "SELECT backfill_start(%s::regclass[], confirm => true, batch_size => %s, rows_per_second => 300, parallel => %s,"
        " rows_per_message => %s, filter => %s)",
        [["items"] + others, BATCH, parallel, rows_per_message, row_filter],
    ).fetchone()[0]
    with Writers(cluster, dbname, backfill_id) as writers:
        wait_for(lambda: writers.ops > WRITES or writers.errors, timeout=300, what=f"{WRITES} writes during the backfill")
        db.execute("SELECT backfill_set(%s, rows_per_second => 10000)", [backfill_id])
        assert wait_until_ended(db, backfill_id) == "done"
        time.sleep(0.2)
    changes = wal2json_changes(db, "consumer")
    state, violations = replay(changes)
    source = {row[0]: (row[1], row[2]) for row in db.execute("SELECT id, v, payload FROM items")}
    # With a filter, a row that fails it and never changed is never sent: the consumer must hold
    # every row that passes it now (read, or changed since) and every row it was sent, as they are.
    kept = {k for k, (v, _) in source.items() if not row_filter or v % 2 == 0}
    mismatched = {k for k in kept | state.keys() if source.get(k) != state.get(k)}
    if row_filter:
        reads = [m for m in as_reads(backfill_messages(changes)) if m["op"] == "read"]
        outside = [m["data"] for m in reads if m["data"]["v"] % 2 != 0]
        assert outside == [], f"reads of rows the filter leaves out: {outside[:5]}"
        assert len(reads) > 1000, "the filter left too few rows to prove anything"
    paths = db.execute(
        "SELECT sum(pages_table_locked), sum(pages_row_locked) FROM backfill_tables WHERE backfill_id = %s", [backfill_id]
    ).fetchone()
    return writers, violations, mismatched, paths


@pytest.mark.parametrize(
    "parallel, lock_mode, rows_per_message",
    [(1, "auto", 1), (2, "auto", 1), (1, "rows", 1), (1, "table", 1), (1, "auto", 30), (2, "auto", 30)],
)
def test_reads_stay_ordered_with_concurrent_writes(cluster, db, parallel, lock_mode, rows_per_message):
    """rows_per_message 30: pages of 100 rows (fewer when a writer holds one) in batches of up
    to 30: the batches are applied as their rows, in order."""
    writers, violations, mismatched, (table_locked, row_locked) = run_scenario(
        cluster, db, skip_row_locks=False, parallel=parallel, lock_mode=lock_mode, rows_per_message=rows_per_message
    )
    assert writers.errors == []
    assert writers.ops > WRITES, "the writers barely ran: the scenario proves nothing"
    assert violations == []
    assert mismatched == set()
    # Each mode took the path it names (auto: whichever the writers left it).
    assert {"rows": table_locked == 0 and row_locked > 0, "table": row_locked == 0 and table_locked > 0}.get(
        lock_mode, table_locked + row_locked > 0
    ), (table_locked, row_locked)


def test_reads_stay_ordered_while_the_workers_also_scan_other_tables(cluster, db):
    """Two workers share items while each also scans small tables of its own (many tables at
    once): the same guarantees for items, and every other table read whole."""
    writers, violations, mismatched, _ = run_scenario(cluster, db, skip_row_locks=False, parallel=2, other_tables=6)
    assert writers.errors == []
    assert writers.ops > WRITES, "the writers barely ran: the scenario proves nothing"
    assert violations == []
    assert mismatched == set()
    workers = db.execute("SELECT array_agg(DISTINCT worker ORDER BY worker) FROM backfill.job_table"
                         " WHERE relid::regclass::text LIKE 'other%'").fetchone()[0]
    assert workers == [0, 1]
    others = db.execute("SELECT table_name::text, state, rows_done FROM backfill_tables WHERE table_name::text LIKE 'other%'").fetchall()
    assert sorted(others) == [(f"other{i}", "done", 2000) for i in range(6)]


@pytest.mark.parametrize("rows_per_message", [1, 30])
def test_ordering_test_fails_without_row_locks(cluster, db, rows_per_message):
    """The control: without row locks, stale reads land after newer changes (batched too)."""
    writers, violations, mismatched, _ = run_scenario(cluster, db, skip_row_locks=True, rows_per_message=rows_per_message)
    assert writers.errors == []
    assert violations, "without locks the consumer should have seen stale reads"
    assert mismatched, "without locks the consumer should have ended with stale rows"
