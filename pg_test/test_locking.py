"""How pages lock (backfill.lock_mode): on a table nobody writes, a page holds the table in
SHARE mode and writes nothing to its rows, so the table keeps its all-frozen bits; with writers,
auto falls back to row locks. (Ordering under writes, per mode: test_ordering.py.)"""

import time

import pytest
from conftest import (assert_each_row_read_once, backfill_messages, error_of, status, wait_until_ended,
                      wal2json_changes, worker_pid)

ROWS = 100_000


@pytest.fixture
def frozen(db):
    db.execute("CREATE EXTENSION pg_visibility")
    db.execute(
        f"""CREATE TABLE quiet (id bigint PRIMARY KEY, v int, body text);
            INSERT INTO quiet SELECT g, g, md5(g::text) FROM generate_series(1, {ROWS}) g;"""
    )
    db.execute("VACUUM (FREEZE, ANALYZE) quiet")
    return db


def all_frozen(db):
    return db.execute("SELECT all_frozen FROM pg_visibility_map_summary('quiet')").fetchone()[0]


def pages_by_path(db, backfill_id):
    return db.execute(
        "SELECT sum(pages_table_locked), sum(pages_row_locked) FROM backfill_tables WHERE backfill_id = %s",
        [backfill_id],
    ).fetchone()


@pytest.mark.parametrize("lock_mode", ["auto", "table"])
def test_a_quiet_table_keeps_its_all_frozen_bits(frozen, lock_mode):
    pages = frozen.execute("SELECT relpages FROM pg_class WHERE relname = 'quiet'").fetchone()[0]
    assert all_frozen(frozen) == pages > 500
    frozen.execute(f"SET backfill.lock_mode = '{lock_mode}'")
    backfill_id = frozen.execute("SELECT backfill_start('quiet', confirm => true)").fetchone()[0]
    assert wait_until_ended(frozen, backfill_id) == "done"
    assert status(frozen, backfill_id, "lock_mode") == lock_mode
    table_locked, row_locked = pages_by_path(frozen, backfill_id)
    assert table_locked > 0 and row_locked == 0
    assert all_frozen(frozen) == pages, "a page lost its all-frozen bit: a row was written"


def test_row_locks_clear_the_all_frozen_bits(frozen):
    """The control: the same backfill with row locks writes every row it reads."""
    frozen.execute("SET backfill.lock_mode = 'rows'")
    backfill_id = frozen.execute("SELECT backfill_start('quiet', confirm => true)").fetchone()[0]
    assert wait_until_ended(frozen, backfill_id) == "done"
    table_locked, row_locked = pages_by_path(frozen, backfill_id)
    assert table_locked == 0 and row_locked > 0
    assert all_frozen(frozen) == 0


def test_auto_takes_row_locks_while_a_writer_holds_the_table(cluster, frozen):
    """A writer's open transaction holds ROW EXCLUSIVE: auto's pages lock rows and never wait
    for it (nor make it wait); once it ends, pages take the table again."""
    writer = cluster.connect(frozen.info.dbname)
    writer.execute("BEGIN")
    writer.execute("UPDATE quiet SET v = -1 WHERE id = %s", [ROWS])  # the last row: read last
    backfill_id = frozen.execute(
        "SELECT backfill_start('quiet', confirm => true, batch_size => 1000, rows_per_second => 50000)"
    ).fetchone()[0]
    time.sleep(1)
    assert pages_by_path(frozen, backfill_id)[1] > 0
    started = time.monotonic()
    writer.execute("UPDATE quiet SET v = -2 WHERE id = 1")  # a row already read: no lock on it now
    assert time.monotonic() - started < 0.5
    writer.execute("COMMIT")
    assert wait_until_ended(frozen, backfill_id) == "done"
    table_locked, row_locked = pages_by_path(frozen, backfill_id)
    assert table_locked > 0 and row_locked > 0


@pytest.mark.parametrize("lock_mode", ["auto", "rows", "table"])
def test_every_row_is_read_once_across_terminations_in_each_mode(frozen, lock_mode):
    frozen.execute("SELECT pg_create_logical_replication_slot('consumer', 'wal2json')")
    frozen.execute(f"SET backfill.lock_mode = '{lock_mode}'")
    backfill_id = frozen.execute(
        "SELECT backfill_start('quiet', confirm => true, batch_size => 2000, rows_per_second => 40000)"
    ).fetchone()[0]
    terminated = 0
    while terminated < 2:
        time.sleep(0.6)
        pid = worker_pid(frozen, backfill_id)
        if pid:
            frozen.execute("SELECT pg_terminate_backend(%s)", [pid])
            terminated += 1
    assert wait_until_ended(frozen, backfill_id) == "done"
    assert_each_row_read_once(backfill_messages(wal2json_changes(frozen, "consumer")), range(1, ROWS + 1))


def test_lock_mode_is_checked(db):
    db.execute(
        """CREATE TABLE t (id int PRIMARY KEY);
           CREATE TABLE p (id int PRIMARY KEY) PARTITION BY RANGE (id);
           CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (100);"""
    )
    # (Refused when set, since issue 35; before, at the next backfill_start().)
    e = error_of(db, "SET backfill.lock_mode = 'sometimes'")
    assert e.sqlstate == "22023" and "backfill.lock_mode" in e.diag.message_primary and e.diag.message_hint
    db.execute("SET backfill.lock_mode = 'table'")
    e = error_of(db, "SELECT backfill_start('p', confirm => true)")
    assert e.sqlstate == "0A000" and "partitioned" in e.diag.message_detail
    db.execute("SET backfill.lock_mode = 'auto'")
    backfill_id = db.execute("SELECT backfill_start('p', confirm => true)").fetchone()[0]
    assert wait_until_ended(db, backfill_id) == "done"


def test_pages_read_committed_whatever_the_default_isolation(frozen):
    """Under REPEATABLE READ a page's queries would reuse a snapshot taken before its table lock:
    the worker runs READ COMMITTED whatever the database's default (and a page takes the table
    only in READ COMMITTED)."""
    frozen.execute(f'ALTER DATABASE "{frozen.info.dbname}" SET default_transaction_isolation = \'serializable\'')
    backfill_id = frozen.execute("SELECT backfill_start('quiet', confirm => true)").fetchone()[0]
    assert wait_until_ended(frozen, backfill_id) == "done"
    table_locked, row_locked = pages_by_path(frozen, backfill_id)
    assert table_locked > 0 and row_locked == 0


def test_a_table_mode_page_never_queues_ahead_of_writers(cluster, frozen):
    """A page of lock_mode table that finds a writer at the table retries its lock without
    entering the lock queue: other writers that arrive meanwhile do not wait behind it."""
    with cluster.connect() as admin:
        admin.execute("LOAD 'pg_backfill'")
        admin.execute("ALTER SYSTEM SET backfill.lock_timeout = '3s'")
        admin.execute("SELECT pg_reload_conf()")
    holder = cluster.connect(frozen.info.dbname)
    other = cluster.connect(frozen.info.dbname)
    try:
        holder.execute("BEGIN")
        holder.execute("UPDATE quiet SET v = -1 WHERE id = 1")  # ROW EXCLUSIVE until it ends
        frozen.execute("SET backfill.lock_mode = 'table'")
        backfill_id = frozen.execute("SELECT backfill_start('quiet', confirm => true)").fetchone()[0]
        time.sleep(1)  # the page is trying for the table by now
        started = time.monotonic()
        other.execute("UPDATE quiet SET v = -2 WHERE id = 2")
        assert time.monotonic() - started < 0.5, "a writer waited behind the page's lock request"
        holder.execute("COMMIT")
        assert wait_until_ended(frozen, backfill_id) == "done"
    finally:
        holder.close()
        other.close()
        with cluster.connect() as admin:
            admin.execute("ALTER SYSTEM RESET backfill.lock_timeout")
            admin.execute("SELECT pg_reload_conf()")
