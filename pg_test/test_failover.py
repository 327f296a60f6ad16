"""Failover, exactly once (17+): docs/operations.md's "Failover" setup, run.

A primary with pg_backfill preloaded streams to a standby through a physical slot that its
`synchronized_standby_slots` names; the standby synchronizes the failover slot `pipe`
(`sync_replication_slots`). A backfill for `pipe` runs under writers while a streaming consumer
applies the slot's changes and reads. The primary is stopped with `-m immediate` mid-run and the
standby promoted: the backfill carries on there by itself, the consumer carries on from the
promoted standby's synchronized `pipe`, skips the transactions it applied already (by commit
LSN), and ends with an exact copy of the table, every row read once, no stale read.

The standby's copy of the slot has a directory of its own: without the rule that accepts a
synchronized copy (throttle/pipeline.rs, `blocker`), the backfill fails at once on the promoted
server with 55000 `replication slot "pipe" was dropped and created again` (run and seen on 17
and 18).
"""

import json
import random
import subprocess
import tempfile
import threading
from collections import Counter

import pytest

from conftest import (PG_BIN, PG_MAJOR, as_reads, backfill_messages, error_of, extra_cluster, status, wait_for,
                      wait_until_ended, worker_pid)
from test_ordering import ROWS, Writers, replay

pytestmark = pytest.mark.skipif(
    PG_MAJOR < 17, reason="failover slots (failover => true, sync_replication_slots) are new in PostgreSQL 17"
)

PHYSICAL_SLOT = "standby_slot"
TIMEOUT = 120  # seconds for any one condition: generous, the test waits for states, never for time


class StreamingConsumer:
    """pg_recvlogical on the wal2json slot, format 2 with transactions and their commit LSNs,
    confirming every second: one JSON object per line of its file."""

    def __init__(self, server, dbname, slot):
        self.output = tempfile.NamedTemporaryFile(mode="r", suffix=".jsonl", delete=False)
        self.process = subprocess.Popen(
            [f"{PG_BIN}/pg_recvlogical", "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres", "-d", dbname,
             "--slot", slot, "--start", "--no-loop", "-s", "1", "-F", "1", "-f", self.output.name,
             "-o", "format-version=2", "-o", "include-transaction=true", "-o", "include-lsn=true"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def stop(self):
        self.process.terminate()
        self.process.wait(10)

    def transactions(self):
        """The complete transactions received, in order: (commit LSN, changes). A transaction cut
        off by the crash (no commit record) was never applied: it is left out."""
        done, changes = [], []
        with open(self.output.name) as f:
            for line in f:
                if not line.endswith("\n"):
                    break  # the crash cut the last line
                change = json.loads(line)
                if change["action"] == "B":
                    changes = []
                elif change["action"] == "C":
                    done.append((lsn_value(change["lsn"]), changes))
                else:
                    changes.append(change)
        return done


def lsn_value(lsn: str) -> int:
    high, low = lsn.split("/")
    return (int(high, 16) << 32) + int(low, 16)


def applied_once(before, after):
    """What a consumer applies across the failover: everything it received from the old primary,
    then what the promoted standby's slot sends that it has not applied yet. The synchronized slot
    resumes from the position the standby last synchronized, which may be behind what the
    consumer confirmed: a transaction whose commit LSN it has applied already is skipped."""
    applied = [changes for _, changes in before]
    last = before[-1][0] if before else 0
    applied += [changes for lsn, changes in after if lsn > last]
    return [change for changes in applied for change in changes], sum(1 for lsn, _ in after if lsn <= last)


def as_postgres(*args: str, cwd: str) -> None:
    result = subprocess.run(["sudo", "-u", "postgres", *args], cwd=cwd, capture_output=True, text=True)
    assert result.returncode == 0, f"{args[0]} failed: {result.stdout}{result.stderr}"


def make_standby(primary, standby):
    """A streaming standby of `primary` by pg_basebackup, through the physical slot, synchronizing
    failover slots: the settings docs/operations.md's "Failover" lists for the standby."""
    subprocess.run(["bash", "-c", f"rm -rf '{standby.dir}' && mkdir -p '{standby.dir}' && chown postgres: '{standby.dir}'"],
                   check=True)
    as_postgres(f"{PG_BIN}/pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
                "-D", f"{standby.dir}/data", "-X", "stream", "-S", PHYSICAL_SLOT, "-c", "fast", cwd=standby.dir)
    subprocess.run(["touch", f"{standby.dir}/data/standby.signal"], check=True)
    with open(f"{standby.dir}/data/postgresql.auto.conf", "a") as conf:
        conf.write(f"port = {standby.port}\nunix_socket_directories = '{standby.dir}'\n"
                   f"primary_conninfo = 'host=127.0.0.1 port={primary.port} user=postgres dbname=app'\n"
                   f"primary_slot_name = '{PHYSICAL_SLOT}'\n"
                   "sync_replication_slots = on\nhot_standby_feedback = on\n"
                   # Copied from the primary (ALTER SYSTEM): once promoted, this server has no
                   # standby, and its logical walsenders would wait for that slot forever.
                   "synchronized_standby_slots = ''\n")
    subprocess.run(["chown", "-R", "postgres:", standby.dir], check=True)
    standby.pg_ctl("start")


class WritersAfterPromotion:
    """Updates on the promoted server while its backfill carries on, most just ahead of a
    cursor (the rows its next page reads), and deletes: the reads that follow must not be stale.
    (test_ordering's Writers insert fresh ids that its writers on the old primary took already.)"""

    def __init__(self, server, backfill_id):
        self.server, self.backfill_id = server, backfill_id
        self.stop, self.errors, self.updates = threading.Event(), [], 0
        self.thread = threading.Thread(target=self.run)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def run(self):
        rng = random.Random(7)
        try:
            with self.server.connect("app") as conn:
                while not self.stop.is_set():
                    cursor = conn.execute(
                        "SELECT coalesce(max(cursor[1]::bigint), 0) FROM backfill_tables WHERE backfill_id = %s",
                        [self.backfill_id],
                    ).fetchone()[0]
                    if rng.random() < 0.9:
                        conn.execute("UPDATE items SET v = v + 1 WHERE id = %s", [cursor + 2 * rng.randint(1, 200)])
                        self.updates += 1
                    else:
                        conn.execute("DELETE FROM items WHERE id = %s", [2 * rng.randint(1, ROWS)])
        except Exception as e:  # a writer must never fail because of the backfill
            self.errors.append(repr(e))


def backfill_processes(conn):
    return conn.execute(
        "SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE backend_type LIKE 'pg_backfill%'"
    ).fetchone()[0]


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.parametrize("rows_per_message", [1, 30])
def test_a_backfill_carries_on_after_a_failover_exactly_once(cluster, rows_per_message):
    primary = extra_cluster(cluster, "failover_primary")
    standby = extra_cluster(cluster, "failover_standby")
    consumers = []
    try:
        primary.start("shared_preload_libraries = 'pg_backfill'")
        with primary.connect() as admin:
            admin.execute("SELECT pg_create_physical_replication_slot(%s, true)", [PHYSICAL_SLOT])
            admin.execute(f"ALTER SYSTEM SET synchronized_standby_slots = '{PHYSICAL_SLOT}'")
            admin.execute("SELECT pg_reload_conf()")
            admin.execute("CREATE DATABASE app")
        with primary.connect("app") as conn:
            conn.execute(
                f"""CREATE EXTENSION pg_backfill;
                    CREATE TABLE items (id bigint PRIMARY KEY, v int NOT NULL DEFAULT 0, payload text NOT NULL);
                    INSERT INTO items SELECT 2 * g, 0, md5(g::text) FROM generate_series(1, {ROWS}) g;
                    ANALYZE items;"""
            )
            conn.execute("SELECT pg_create_logical_replication_slot('pipe', 'wal2json', failover => true)")
            make_standby(primary, standby)
            consumers.append(StreamingConsumer(primary, "app", "pipe"))
            with standby.connect("app") as on_standby:
                # The slotsync worker's copy, persistent once the standby holds what it needs.
                wait_for(lambda: on_standby.execute(
                    "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'pipe' AND synced AND failover AND NOT temporary"
                ).fetchone()[0], timeout=TIMEOUT, what="the standby to synchronize the slot")

                # Paced, so that it is still running when the primary stops; the rate stays after
                # the failover (the backfill carries on as it was started).
                backfill_id = conn.execute(
                    "SELECT backfill_start('items', confirm => true, slot => 'pipe', batch_size => 100,"
                    " rows_per_second => 2000, rows_per_message => %s)", [rows_per_message]
                ).fetchone()[0]
                with Writers(primary, "app", backfill_id):
                    wait_for(lambda: status(conn, backfill_id, "rows_done") >= ROWS // 3, timeout=TIMEOUT,
                             what="a third of the rows")
                    # The standby shows the backfill read-only, and runs none of it.
                    wait_for(lambda: status(on_standby, backfill_id, "rows_done") > 0, timeout=TIMEOUT,
                             what="the standby to replay the backfill")
                    assert status(on_standby, backfill_id, "state") == "running"
                    assert backfill_processes(on_standby) == 0
                    assert status(conn, backfill_id, "state") == "running", "the backfill ended before the failover"
                    primary.pg_ctl("-m immediate stop")
                # (The writers fail with the primary: their errors are the crash's.)
            consumers[0].stop()

        with standby.connect("app") as promoted:
            promoted.execute("SELECT pg_promote()")
            assert promoted.execute("SELECT pg_is_in_recovery()").fetchone()[0] is False
            consumers.append(StreamingConsumer(standby, "app", "pipe"))
            # By itself, with no call: the launcher resumes it once recovery has finished.
            with WritersAfterPromotion(standby, backfill_id) as writers:
                assert wait_until_ended(promoted, backfill_id, timeout=TIMEOUT) == "done", \
                    status(promoted, backfill_id, "last_error")
            assert writers.errors == [] and writers.updates > 0
            wait_for(lambda: status(promoted, backfill_id, "delivered"), timeout=TIMEOUT,
                     what="the consumer to confirm the whole backfill")
            consumers[1].stop()
            changes, skipped = applied_once(consumers[0].transactions(), consumers[1].transactions())
            state, violations = replay(changes)
            source = {row[0]: (row[1], row[2]) for row in promoted.execute("SELECT id, v, payload FROM items")}

        assert violations == []
        mismatched = {k for k in source.keys() | state.keys() if source.get(k) != state.get(k)}
        assert not mismatched, f"{len(mismatched)} rows differ from the promoted table, e.g. {sorted(mismatched)[:5]}"
        messages = as_reads(backfill_messages(changes))
        reads = Counter(m["data"]["id"] for m in messages if m["op"] == "read")
        assert [k for k, n in reads.items() if n > 1] == [], "a row was read twice"
        assert Counter(m["op"] for m in messages if m["op"] != "read") == Counter(["table_start", "table_end"])
        print(f"reads {sum(reads.values())}, transactions skipped after the failover {skipped}")
    finally:
        for consumer in consumers:
            consumer.process.kill()
        standby.stop()
        primary.stop()


def synchronized(primary_conn, on_standby):
    """Whether the standby holds a persistent synchronized copy of the primary's slot `pipe` at
    the primary's position. (A copy persists once the primary's slot has moved past where the
    standby could start one: a running-transactions record, then a read of the slot.)"""
    primary_conn.execute("SELECT pg_log_standby_snapshot()")
    primary_conn.execute("SELECT count(*) FROM pg_logical_slot_get_changes('pipe', NULL, NULL)")
    confirmed = primary_conn.execute(
        "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'pipe'").fetchone()[0]
    return on_standby.execute(
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'pipe' AND synced AND failover AND NOT temporary"
        " AND confirmed_flush_lsn = %s", [confirmed]).fetchone()[0]


@pytest.mark.cluster
def test_a_paused_backfill_does_not_take_a_promoted_copy_of_its_slot_created_again(cluster):
    """The backfill is paused; its failover slot is dropped and created again, with failover, on
    the primary, and the standby synchronizes the new one; the standby is promoted. Its copy looks
    exactly like a copy of the original (PostgreSQL keeps nothing of a slot's creation that a copy
    carries), and the backfill's workers watched neither: backfill_resume refuses it, 55000, and
    the backfill stays paused, to be cancelled. (Before 0.11.0 it carried on into the new slot,
    whose consumer never received what the backfill wrote before the slot was created.) The same
    holds for a slot created again on a promoted server and synchronized to its own standby: the
    copy is all the next promoted server sees."""
    primary = extra_cluster(cluster, "failover_primary")
    standby = extra_cluster(cluster, "failover_standby")
    try:
        primary.start("shared_preload_libraries = 'pg_backfill'")
        with primary.connect() as admin:
            admin.execute("SELECT pg_create_physical_replication_slot(%s, true)", [PHYSICAL_SLOT])
            admin.execute(f"ALTER SYSTEM SET synchronized_standby_slots = '{PHYSICAL_SLOT}'")
            admin.execute("SELECT pg_reload_conf()")
            admin.execute("CREATE DATABASE app")
        with primary.connect("app") as conn:
            conn.execute("""CREATE EXTENSION pg_backfill;
                            CREATE TABLE items (id bigint PRIMARY KEY, payload text NOT NULL);
                            INSERT INTO items SELECT g, md5(g::text) FROM generate_series(1, 2000) g;
                            ANALYZE items;""")
            conn.execute("SELECT pg_create_logical_replication_slot('pipe', 'test_decoding', failover => true)")
            make_standby(primary, standby)
            # No consumer: the backfill waits for one, watching its slot, then is paused.
            backfill_id = conn.execute(
                "SELECT backfill_start('items', confirm => true, slot => 'pipe')").fetchone()[0]
            wait_for(lambda: status(conn, backfill_id, "waiting_kind") == "consumer_away", timeout=TIMEOUT,
                     what="the backfill to wait for the slot's consumer")
            conn.execute("SELECT backfill_pause(%s)", [backfill_id])
            wait_for(lambda: worker_pid(conn, backfill_id) is None, timeout=TIMEOUT,
                     what="the paused backfill's worker to exit")
            conn.execute("SELECT pg_drop_replication_slot('pipe')")
            conn.execute("SELECT pg_create_logical_replication_slot('pipe', 'test_decoding', failover => true)")
            with standby.connect("app") as on_standby:
                wait_for(lambda: synchronized(conn, on_standby), timeout=TIMEOUT,
                         what="the standby to synchronize the slot created again")
        primary.pg_ctl("-m immediate stop")
        with standby.connect("app") as promoted:
            promoted.execute("SELECT pg_promote()")
            assert promoted.execute("SELECT synced AND failover FROM pg_replication_slots WHERE slot_name = 'pipe'"
                                    ).fetchone()[0] is True
            refused = error_of(promoted, "SELECT backfill_resume(%s)", [backfill_id])
            assert refused.sqlstate == "55000", refused
            assert 'replication slot "pipe" may not be the slot it was started for' in refused.diag.message_primary
            assert refused.diag.message_detail and f"backfill_cancel({backfill_id})" in refused.diag.message_hint
            assert status(promoted, backfill_id, "state") == "paused" and worker_pid(promoted, backfill_id) is None
            promoted.execute("SELECT backfill_cancel(%s)", [backfill_id])
    finally:
        standby.stop()
        primary.stop()
