"""The pipeline a backfill serves changes under it: its slot dropped and created again under the
same name, its slot invalidated, its table dropped from its publication. The backfill fails
with an error that names what changed, instead of delivering rows nobody receives."""

import select
import threading

import psycopg2
import psycopg2.extras
import pytest

from conftest import Consumer, error_of, status, wait_for, wait_until_ended


def make_items(db, rows=20000):
    db.execute(f"""CREATE TABLE items (id bigint PRIMARY KEY, body text NOT NULL);
                   INSERT INTO items SELECT g, repeat('x', 50) FROM generate_series(1, {rows}) g;
                   ANALYZE items;""")


def test_a_slot_created_again_under_its_name_fails_the_backfill(cluster, db):
    """The consumer stops, someone drops the slot and creates one of the same name, the consumer
    comes back: what was written between the two slots never reaches it, so the backfill stops
    at its next page (it ended done and delivered before 0.7.0, with rows missing)."""
    make_items(db)
    db.execute("SELECT pg_create_logical_replication_slot('p', 'test_decoding')")
    consumer = Consumer(cluster, db.info.dbname, "p")
    try:
        backfill_id = db.execute(
            "SELECT backfill_start('items', confirm => true, slot => 'p', batch_size => 100, rows_per_second => 4000)"
        ).fetchone()[0]
        wait_for(lambda: (status(db, backfill_id, "rows_done") or 0) > 1000, what="the first pages")
    finally:
        consumer.stop()
    wait_for(lambda: db.execute("SELECT NOT active FROM pg_replication_slots WHERE slot_name = 'p'").fetchone()[0])
    # In one statement: the slot is back within microseconds (it is listed, with its new
    # identity, from the start of its creation), and the waiting worker looks once a second. On a
    # loaded machine it may still look between the two, and find no slot at all: the backfill
    # fails either way, which is the guarantee. (Holding backfill.job instead would deadlock:
    # the slot's creation waits for the holder's transaction.)
    db.execute("SELECT pg_drop_replication_slot('p'), pg_create_logical_replication_slot('p', 'test_decoding')")
    consumer = Consumer(cluster, db.info.dbname, "p")
    try:
        assert wait_until_ended(db, backfill_id, timeout=60) == "failed"
    finally:
        consumer.stop()
    sqlstate, error = status(db, backfill_id, "last_error_sqlstate", "last_error")
    assert (sqlstate, 'slot "p" was dropped and created again' in error) == ("55000", True) or \
        (sqlstate, 'slot "p"' in error) == ("42704", True), (sqlstate, error)
    assert not status(db, backfill_id, "delivered")
    e = error_of(db, "SELECT backfill_wait(%s)", [backfill_id])
    assert e.sqlstate == "55000" and "failed" in e.diag.message_primary


def test_an_invalidated_slot_fails_the_backfill_and_names_the_slot(cluster, db):
    """A slot whose WAL the server removed (max_slot_wal_keep_size) can never be read again: the
    backfill waiting for its consumer fails, where it used to wait for ever."""
    make_items(db, rows=1000)
    db.execute("SELECT pg_create_logical_replication_slot('p', 'test_decoding')")
    backfill_id = db.execute("SELECT backfill_start('items', confirm => true, slot => 'p')").fetchone()[0]
    wait_for(lambda: status(db, backfill_id, "waiting_kind") == "consumer_away", what="the wait")
    try:
        db.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        db.execute("SELECT pg_reload_conf()")
        db.execute("CREATE TABLE filler (v text)")
        for _ in range(4):  # past the kept WAL, into new segments, then a checkpoint invalidates
            db.execute("INSERT INTO filler SELECT repeat('y', 1000) FROM generate_series(1, 2000)")
            db.execute("SELECT pg_switch_wal()")
        db.execute("CHECKPOINT")
        wait_for(lambda: db.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'p'").fetchone()[0] == "lost",
                 what="the slot's invalidation")
        assert wait_until_ended(db, backfill_id, timeout=30) == "failed"
    finally:
        db.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
        db.execute("SELECT pg_reload_conf()")
    sqlstate, error = status(db, backfill_id, "last_error_sqlstate", "last_error")
    assert sqlstate == "55000" and 'slot "p" was invalidated' in error, error
    e = error_of(db, "SELECT backfill_wait(%s)", [backfill_id])
    assert e.sqlstate == "55000"


@pytest.mark.parametrize("publication, change", [
    ("FOR TABLE items, other", "ALTER PUBLICATION pipeline DROP TABLE items"),
    ("FOR TABLES IN SCHEMA public", "ALTER PUBLICATION pipeline DROP TABLES IN SCHEMA public"),
    ("FOR TABLE items", "DROP PUBLICATION pipeline; CREATE PUBLICATION pipeline FOR TABLE other"),
    ("FOR TABLES IN SCHEMA public", "CREATE SCHEMA moved; ALTER TABLE items SET SCHEMA moved"),
])
def test_a_table_dropped_from_the_publication_mid_run_fails_the_backfill(db, publication, change):
    """The pipeline no longer captures the table: pgoutput would still pass the backfill's
    messages on, reads of a table the consumer does not subscribe to. However the publication
    stops holding it: a page reads the publication again only when the catalog tells the worker
    it may have changed (pg/catalog_changes.rs), and each way is such a change."""
    make_items(db)
    db.execute("CREATE TABLE other (id int PRIMARY KEY)")
    db.execute(f"CREATE PUBLICATION pipeline {publication}")
    backfill_id = db.execute(
        "SELECT backfill_start('items', confirm => true, publication => 'pipeline', batch_size => 100, rows_per_second => 2000)"
    ).fetchone()[0]
    wait_for(lambda: (status(db, backfill_id, "rows_done") or 0) > 0, what="the first page")
    db.execute(change)
    assert wait_until_ended(db, backfill_id, timeout=30) == "failed"
    sqlstate, error = status(db, backfill_id, "last_error_sqlstate", "last_error")
    # (The message names the table as the scan began; moved, the detail says where it is now.)
    assert sqlstate == "55000" and 'table public.items is not in publication "pipeline"' in error, error
    assert status(db, backfill_id, "rows_done") < 20000


class SilentConsumer:
    """A streaming consumer of a test_decoding slot that receives everything and confirms
    nothing: the slot is active, its confirmed position stays where it was."""

    def __init__(self, cluster, dbname, slot):
        self.conn = psycopg2.connect(host="127.0.0.1", port=cluster.port, user="postgres", dbname=dbname,
                                     connection_factory=psycopg2.extras.LogicalReplicationConnection)
        self.cursor = self.conn.cursor()
        self.cursor.start_replication(slot_name=slot, decode=False)
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop_event.is_set():
            if self.cursor.read_message() is None:
                select.select([self.cursor], [], [], 0.05)

    def stop(self):
        self.stop_event.set()
        self.thread.join(10)
        self.conn.close()


def test_a_slot_of_its_name_made_for_another_database_is_not_the_backfills(cluster, db, scratch_database):
    """Slot names are the cluster's: once a backfill's slot is dropped, another database may make
    one of that name, which decodes none of this database's messages. A done backfill whose
    consumer confirmed nothing is not delivered by it: backfill_status shows no lag and
    does not show it delivered, backfill_wait does not return true (before 0.11.0 the view found slots by
    name only, and the other database's new slot, confirmed up to its creation, delivered it)."""
    make_items(db, rows=2000)
    slot = f"p_{db.info.dbname.split('_')[0]}"
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", [slot])
    consumer = SilentConsumer(cluster, db.info.dbname, slot)
    try:
        backfill_id = db.execute("SELECT backfill_start('items', confirm => true, slot => %s, batch_size => 500)",
                                 [slot]).fetchone()[0]
        assert wait_until_ended(db, backfill_id) == "done"
        assert status(db, backfill_id, "delivered") is False
    finally:
        consumer.stop()
    wait_for(lambda: db.execute("SELECT NOT active FROM pg_replication_slots WHERE slot_name = %s", [slot]).fetchone()[0])
    db.execute("SELECT pg_drop_replication_slot(%s)", [slot])
    elsewhere = scratch_database(f"slots_elsewhere_{slot}")
    with cluster.connect(elsewhere) as other:
        other.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", [slot])
    delivered, lag = status(db, backfill_id, "delivered", "slot_lag_bytes")
    assert not delivered and lag is None
    assert db.execute("SELECT backfill_wait(%s, '0.5 s')", [backfill_id]).fetchone()[0] is False
