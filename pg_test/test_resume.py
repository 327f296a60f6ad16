"""Exactly-once delivery across worker terminations, and cancellation mid-run."""

import random
import time

import psycopg
import pytest

from conftest import (as_reads, assert_each_row_read_once, backfill_messages, status, wait_for, wait_until_ended, wal2json_changes,
                      worker_pid)

ROWS = 60_000


def make_table(db, rows=ROWS):
    db.execute(
        f"""CREATE TABLE events (id bigint PRIMARY KEY, body text NOT NULL);
            INSERT INTO events SELECT g, repeat('x', 50) FROM generate_series(1, {rows}) g;
            ANALYZE events;"""
    )
    db.execute("SELECT pg_create_logical_replication_slot('consumer', 'wal2json')")


def delivered(db):
    return backfill_messages(wal2json_changes(db, "consumer"))


@pytest.mark.slow
@pytest.mark.parametrize("rows_per_message", [1, 200])
def test_terminated_worker_restarts_and_every_row_is_read_exactly_once(db, rows_per_message):
    """Terminations land mostly inside pages (large pages, no pacing): each kills a page halfway
    through its messages (or its batches), which must then count for nothing. Batches run
    faster: their table is larger, so that the four terminations land before the end."""
    rows = 600_000 if rows_per_message == 1 else 2_400_000
    make_table(db, rows)
    backfill_id = db.execute(
        "SELECT backfill_start('events', confirm => true, batch_size => 5000, rows_per_message => %s)", [rows_per_message]
    ).fetchone()[0]
    rng = random.Random(7)
    terminations, last_pid = 0, None
    deadline = time.monotonic() + 60
    while terminations < 4 and time.monotonic() < deadline:
        assert status(db, backfill_id, "state") == "running"
        pid = worker_pid(db, backfill_id)
        if pid and pid != last_pid:
            time.sleep(rng.uniform(0.05, 0.2))  # let it deliver some pages, then stop it mid-page
            db.execute("SELECT pg_terminate_backend(%s)", [pid])
            terminations, last_pid = terminations + 1, pid
        time.sleep(0.01)
    assert terminations == 4
    assert wait_until_ended(db, backfill_id) == "done"
    assert_each_row_read_once(delivered(db), range(1, rows + 1))
    assert status(db, backfill_id, "rows_done") == rows


def test_cancel_stops_the_worker_and_keeps_what_was_delivered(db):
    make_table(db)
    backfill_id = db.execute(
        "SELECT backfill_start('events', confirm => true, batch_size => 100, rows_per_second => 5000)"
    ).fetchone()[0]
    time.sleep(1.0)
    db.execute("SELECT backfill_cancel(%s)", [backfill_id])
    assert wait_until_ended(db, backfill_id) == "cancelled"
    wait_for(lambda: worker_pid(db, backfill_id) is None, timeout=5, what="the worker to stop")
    time.sleep(1.5)  # a cancelled worker is not restarted
    assert worker_pid(db, backfill_id) is None
    done = status(db, backfill_id, "rows_done")
    assert 0 < done < ROWS
    # The delivered rows are a prefix of the key order; a cancelled scan sends no end marker.
    assert_each_row_read_once(delivered(db), range(1, done + 1), markers=["table_start"])
    state = db.execute("SELECT state FROM backfill_tables WHERE backfill_id = %s", [backfill_id]).fetchone()[0]
    assert state == "cancelled"


def test_pause_holds_nothing_and_resume_continues_exactly_once(db):
    make_table(db)
    backfill_id = db.execute(
        "SELECT backfill_start('events', confirm => true, batch_size => 200, rows_per_second => 8000)"
    ).fetchone()[0]
    time.sleep(0.8)
    db.execute("SELECT backfill_pause(%s)", [backfill_id])
    wait_for(lambda: worker_pid(db, backfill_id) is None, timeout=5, what="a paused backfill to keep no worker")
    assert status(db, backfill_id, "state") == "paused"
    paused_at = status(db, backfill_id, "rows_done")
    time.sleep(1.5)
    assert status(db, backfill_id, "rows_done") == paused_at
    assert 0 < paused_at < ROWS
    # Nothing blocks a writer meanwhile: every row can be locked at once.
    db.execute("BEGIN; SELECT count(*) FROM (SELECT id FROM events FOR UPDATE NOWAIT) locked; ROLLBACK")

    e = pytest.raises(psycopg.Error, db.execute, "SELECT backfill_pause(%s)", [backfill_id]).value
    assert e.sqlstate == "55000" and "paused" in e.diag.message_detail
    db.execute("SELECT backfill_resume(%s)", [backfill_id])
    e = pytest.raises(psycopg.Error, db.execute, "SELECT backfill_resume(%s)", [backfill_id]).value
    assert e.sqlstate == "55000" and "running" in e.diag.message_detail
    assert wait_until_ended(db, backfill_id) == "done"
    assert_each_row_read_once(delivered(db), range(1, ROWS + 1))


@pytest.mark.parametrize("rows_per_message", [1, 200])
def test_parallel_workers_split_skewed_keys_evenly_and_read_every_row_exactly_once(db, rows_per_message):
    """Two workers over key ranges split at the key's histogram quantiles: half the rows are
    dense small ids and half are spread over a billion, yet each worker gets about half. Each
    worker is terminated once mid-run; every row is still read exactly once, and the table's
    start and end markers are sent once each."""
    db.execute(
        """CREATE TABLE events (id bigint PRIMARY KEY, body text NOT NULL);
           INSERT INTO events SELECT g, repeat('x', 50) FROM generate_series(1, 100000) g;
           INSERT INTO events SELECT 1000000 + g * 9973, repeat('y', 50) FROM generate_series(1, 100000) g;
           ANALYZE events;"""
    )
    db.execute("SELECT pg_create_logical_replication_slot('consumer', 'wal2json')")
    ids = {row[0] for row in db.execute("SELECT id FROM events")}
    backfill_id = db.execute(
        "SELECT backfill_start('events', confirm => true, batch_size => 2000, parallel => 2, rows_per_second => 60000,"
        " rows_per_message => %s)",
        [rows_per_message],
    ).fetchone()[0]
    terminated = set()
    deadline = time.monotonic() + 60
    while len(terminated) < 2 and time.monotonic() < deadline:
        for name in (f"pg_backfill {backfill_id}", f"pg_backfill {backfill_id}/1"):
            row = db.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", [name]).fetchone()
            if row and name not in terminated and db.execute(
                "SELECT rows_done > 0 FROM backfill_tables WHERE backfill_id = %s AND part = %s",
                [backfill_id, 0 if name.endswith(str(backfill_id)) else 1],
            ).fetchone()[0]:
                db.execute("SELECT pg_terminate_backend(%s)", [row[0]])
                terminated.add(name)
        time.sleep(0.05)
    assert len(terminated) == 2
    assert wait_until_ended(db, backfill_id) == "done"
    parts = dict(db.execute("SELECT part, rows_done FROM backfill_tables WHERE backfill_id = %s", [backfill_id]).fetchall())
    assert set(parts) == {0, 1}
    assert all(60000 <= rows <= 140000 for rows in parts.values()), f"uneven split: {parts}"
    messages = delivered(db)
    assert_each_row_read_once(messages, ids)
    assert [m["rows"] for m in messages if m["op"] == "table_end"] == [200000]


@pytest.mark.parametrize("parallel", [2, 4])
def test_parallel_workers_split_a_skewed_composite_key_evenly_and_read_every_row_exactly_once(db, parallel):
    """A composite key (tenant, id) where one tenant holds 90% of the rows: the ranges split at
    quantiles of a sample of whole key tuples, inside that tenant too, so each worker's share is
    within 2x of an equal one; every row is read exactly once, the markers are sent once."""
    db.execute(
        """CREATE TABLE events (tenant text, id int, body text NOT NULL, PRIMARY KEY (tenant, id));
           INSERT INTO events SELECT 'big', g, repeat('x', 50) FROM generate_series(1, 36000) g;
           INSERT INTO events SELECT 'tenant-' || (g % 400), g, repeat('y', 50) FROM generate_series(1, 4000) g;
           ANALYZE events;"""
    )
    db.execute("SELECT pg_create_logical_replication_slot('consumer', 'wal2json')")
    keys = {(tenant, i) for tenant, i in db.execute("SELECT tenant, id FROM events")}
    backfill_id = db.execute(
        "SELECT backfill_start('events', confirm => true, batch_size => 1000, parallel => %s)", [parallel]
    ).fetchone()[0]
    assert wait_until_ended(db, backfill_id) == "done"
    parts = dict(db.execute("SELECT part, rows_done FROM backfill_tables WHERE backfill_id = %s", [backfill_id]).fetchall())
    assert set(parts) == set(range(parallel))
    equal = 40000 / parallel
    assert all(equal / 2 <= rows <= equal * 2 for rows in parts.values()), f"uneven split: {parts}"
    messages = delivered(db)
    reads = [(m["key"]["tenant"], m["key"]["id"]) for m in messages if m["op"] == "read"]
    assert len(reads) == len(set(reads)) and set(reads) == keys
    assert [m["rows"] for m in messages if m["op"] == "table_end"] == [40000]
    assert len([m for m in messages if m["op"] == "table_start"]) == 1


def test_every_failure_is_kept_in_backfill_errors(db, roles):
    """last_error shows the latest failure, and a resume clears it; backfill_errors keeps each,
    oldest first, with the table, the key it stopped after, its SQLSTATE, message and detail,
    and shows them as backfill_status does: to who may read the table."""
    make_table(db, rows=5000)
    backfill_id = db.execute(
        "SELECT backfill_start('events', confirm => true, batch_size => 100, rows_per_second => 2000)"
    ).fetchone()[0]
    wait_for(lambda: (status(db, backfill_id, "rows_done") or 0) > 0, what="the first page")
    db.execute("ALTER TABLE events SET UNLOGGED")
    assert wait_until_ended(db, backfill_id) == "failed"
    db.execute("SELECT backfill_resume(%s)", [backfill_id])  # still unlogged: fails again
    assert wait_until_ended(db, backfill_id) == "failed"
    db.execute("ALTER TABLE events SET LOGGED")
    db.execute("SELECT backfill_resume(%s)", [backfill_id])
    assert wait_until_ended(db, backfill_id) == "done"
    assert status(db, backfill_id, "last_error") is None  # the latest is gone from the status
    errors = db.execute(
        "SELECT table_name, stopped_after_key, sqlstate, message FROM backfill_errors WHERE backfill_id = %s ORDER BY occurred_at",
        [backfill_id],
    ).fetchall()
    assert len(errors) == 2, errors
    for table_name, stopped_after_key, sqlstate, message in errors:
        assert (table_name, sqlstate) == ("public.events", "55000"), errors
        assert "unlogged" in message and int(stopped_after_key) > 0, errors
    assert int(errors[0][1]) <= int(errors[1][1])
    # A role that did not start it sees nothing of it.
    other = roles.connect(roles.create("other"))
    assert other.execute("SELECT count(*) FROM backfill_errors").fetchone()[0] == 0


@pytest.mark.parametrize("rows_per_message", [1, 200])
def test_parallel_workers_share_many_tables_and_read_each_row_once_across_terminations(db, rows_per_message):
    """A backfill of one large table and twelve small ones with two workers: the large table is
    split between them, each small one is scanned whole by one of them, and both get small ones,
    so the two scan different tables at once. Each worker is terminated once mid-run: every row
    of every table is still read exactly once, and each table has one start marker before its
    reads and one end marker after them."""
    db.execute("""CREATE TABLE big (id bigint PRIMARY KEY, body text NOT NULL);
                  INSERT INTO big SELECT g, repeat('x', 50) FROM generate_series(1, 60000) g;""")
    small = [f"small{i:02}" for i in range(12)]
    for i, name in enumerate(small):
        db.execute(f"""CREATE TABLE {name} (id bigint PRIMARY KEY, body text NOT NULL);
                       INSERT INTO {name} SELECT g, repeat('y', 50) FROM generate_series(1, {2000 + 500 * i}) g;""")
    db.execute("ANALYZE")
    db.execute("SELECT pg_create_logical_replication_slot('consumer', 'wal2json')")
    tables = ["big"] + small
    backfill_id = db.execute(
        "SELECT backfill_start(%s::regclass[], confirm => true, batch_size => 500, parallel => 2, rows_per_second => 20000,"
        " rows_per_message => %s)",
        [tables, rows_per_message],
    ).fetchone()[0]
    workers = dict(db.execute(
        "SELECT relid::regclass::text, array_agg(worker ORDER BY part) FROM backfill.job_table WHERE job_id = %s GROUP BY 1",
        [backfill_id]).fetchall())
    assert workers["big"] == [0, 1], workers
    assert {tuple(workers[name]) for name in small} == {(0,), (1,)}, workers
    terminated, tables_at_once = set(), 0
    deadline = time.monotonic() + 120
    while status(db, backfill_id, "state") == "running" and time.monotonic() < deadline:
        for name in (f"pg_backfill {backfill_id}", f"pg_backfill {backfill_id}/1"):
            row = db.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", [name]).fetchone()
            if row and name not in terminated and status(db, backfill_id, "rows_done") > 5000:
                db.execute("SELECT pg_terminate_backend(%s)", [row[0]])
                terminated.add(name)
        tables_at_once = max(tables_at_once, db.execute(
            "SELECT count(DISTINCT relid) FROM backfill.job_table WHERE job_id = %s AND state = 'running'",
            [backfill_id]).fetchone()[0])
        time.sleep(0.05)
    assert len(terminated) == 2
    assert wait_until_ended(db, backfill_id) == "done"
    assert tables_at_once == 2
    messages = as_reads(delivered(db))
    for table in tables:
        of_table = [m for m in messages if m["table"] == table]
        rows = db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        assert_each_row_read_once(of_table, range(1, rows + 1))
        ops = [m["op"] for m in of_table]
        assert ops[0] == "table_start" and ops[-1] == "table_end", (table, ops[:3], ops[-3:])


def test_a_failed_backfill_whose_slot_is_gone_is_ended_by_cancel_as_the_resume_error_says(db):
    """A backfill for a slot fails once the slot is dropped. backfill_resume() then refuses at
    once (a new worker would fail again), with a hint to cancel it; backfill_cancel() ends a
    failed backfill."""
    make_table(db, rows=5000)
    db.execute("SELECT pg_create_logical_replication_slot('gone', 'wal2json')")
    backfill_id = db.execute(
        "SELECT backfill_start('events', confirm => true, batch_size => 100, rows_per_second => 500, slot => 'gone')"
    ).fetchone()[0]
    db.execute("SELECT pg_drop_replication_slot('gone')")
    assert wait_until_ended(db, backfill_id) == "failed"
    with pytest.raises(psycopg.Error) as caught:
        db.execute("SELECT backfill_resume(%s)", [backfill_id])
    e = caught.value
    assert e.sqlstate == "55000", e
    assert '"gone"' in e.diag.message_primary and e.diag.message_detail, e
    assert f"SELECT backfill_cancel({backfill_id});" in e.diag.message_hint and "resume" not in e.diag.message_hint, e
    assert status(db, backfill_id, "state") == "failed"
    assert db.execute("SELECT backfill_cancel(%s)", [backfill_id]).fetchone()[0] is True
    assert status(db, backfill_id, "state") == "cancelled"


def test_purge_removes_the_ended_backfills_older_than_the_age_given_that_the_caller_controls(db, roles):
    """backfill_purge(older_than) deletes the done and cancelled backfills that ended more than
    older_than ago, with their tables, keys, progress and errors, among those the caller may
    control; running, paused and failed ones stay. It returns how many it deleted."""
    make_table(db, rows=1000)
    done = db.execute("SELECT backfill_start('events', confirm => true)").fetchone()[0]
    assert wait_until_ended(db, done) == "done"
    cancelled = db.execute("SELECT backfill_start('events', confirm => true, rows_per_second => 10)").fetchone()[0]
    db.execute("SELECT backfill_cancel(%s)", [cancelled])
    assert wait_until_ended(db, cancelled) == "cancelled"
    db.execute("CREATE TABLE other (id int PRIMARY KEY); INSERT INTO other SELECT generate_series(1, 100)")
    paused = db.execute("SELECT backfill_start('other', confirm => true, rows_per_second => 10)").fetchone()[0]
    db.execute("SELECT backfill_pause(%s)", [paused])
    operator = roles.create("purger", "operator")
    assert roles.connect(operator).execute("SELECT backfill_purge(interval '0')").fetchone()[0] == 0  # none of its own
    assert db.execute("SELECT backfill_purge(interval '1 hour')").fetchone()[0] == 0  # too recent
    assert db.execute("SELECT backfill_purge(older_than => interval '0')").fetchone()[0] == 2
    assert [r for r, in db.execute("SELECT id FROM backfill_status ORDER BY id")] == [paused]
    assert db.execute("SELECT count(*) FROM backfill.job_table WHERE job_id IN (%s, %s)", [done, cancelled]).fetchone()[0] == 0
    for bad, sqlstate in [("NULL", "22004"), ("interval '-1 day'", "22023")]:
        with pytest.raises(psycopg.Error) as caught:
            db.execute(f"SELECT backfill_purge({bad})")
        assert caught.value.sqlstate == sqlstate and caught.value.diag.message_hint, caught.value
    db.execute("SELECT backfill_cancel(%s)", [paused])
