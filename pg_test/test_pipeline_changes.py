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


def ended_after_a_change_mid_run(db, table, change):
    """A slow backfill of `table` for publication `pipeline`, and `change` made once its first
    page is in: the backfill's id, and how it ended (state, SQLSTATE, error)."""
    backfill_id = db.execute(
        "SELECT backfill_start(%s, confirm => true, publication => 'pipeline', batch_size => 100, rows_per_second => 2000)",
        [table],
    ).fetchone()[0]
    wait_for(lambda: (status(db, backfill_id, "rows_done") or 0) > 0, what="the first page")
    db.execute(change)
    state = wait_until_ended(db, backfill_id, timeout=30)
    return backfill_id, (state, *status(db, backfill_id, "last_error_sqlstate", "last_error"))


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
    backfill_id, (state, sqlstate, error) = ended_after_a_change_mid_run(db, "items", change)
    assert state == "failed"
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


def make_parted(db):
    db.execute("""CREATE TABLE parted (id bigint PRIMARY KEY, body text NOT NULL) PARTITION BY RANGE (id);
                  CREATE TABLE parted_low PARTITION OF parted FOR VALUES FROM (1) TO (100001);
                  INSERT INTO parted SELECT g, repeat('x', 50) FROM generate_series(1, 20000) g;
                  ANALYZE parted_low;""")


# What a page decides when the catalog moves under a backfill for a publication: each case is
# (the publication, the change mid-run, how the backfill ends, its SQLSTATE, its error's words).
# A page reads the publication by OID, as pgoutput does (selection/publication.rs): a table
# renamed, or moved to another schema, is still the table a publication lists (or FOR ALL
# TABLES holds), and it is the page's read by name that fails, saying the name is gone. (Before
# the one rule, a page asked pg_publication_tables by the name the scan began with, and said
# the table was not in the publication, which still held it.)
RENAMED_OR_MOVED = [
    ("FOR TABLE items", "ALTER TABLE items RENAME TO items_renamed",
     "failed", "42P01", 'relation "public.items" does not exist'),
    ("FOR TABLE items", "CREATE SCHEMA moved; ALTER TABLE items SET SCHEMA moved",
     "failed", "42P01", 'relation "public.items" does not exist'),
    ("FOR ALL TABLES", "ALTER TABLE items RENAME TO items_renamed",
     "failed", "42P01", 'relation "public.items" does not exist'),
]


@pytest.mark.parametrize("publication, change, state, sqlstate, words", RENAMED_OR_MOVED)
def test_what_a_page_decides_for_a_table_renamed_or_moved_mid_run(db, publication, change, state, sqlstate, words):
    """A table renamed, or moved to another schema, mid-run: the backfill fails, and says why."""
    make_items(db)
    db.execute(f"CREATE PUBLICATION pipeline {publication}")
    _, found = ended_after_a_change_mid_run(db, "items", change)
    assert found[0] == state and found[1] == sqlstate and words in found[2], found


@pytest.mark.parametrize("publication, accepted", [
    ("FOR TABLE parted", True),
    ("FOR TABLE parted WITH (publish_via_partition_root = true)", False),
    ("FOR TABLE parted_low WITH (publish_via_partition_root = true)", True),
    # (Accepted before the one rule, which FOR ALL TABLES bypassed: pgoutput names the
    # partition's changes as parted's, so no change the consumer receives names parted_low.)
    ("FOR ALL TABLES WITH (publish_via_partition_root = true)", False),
    ("FOR ALL TABLES", True),
])
def test_whether_a_partition_is_in_a_publication_that_publishes_it_as_its_root(db, publication, accepted):
    """pgoutput names a partition's changes as its partitioned table's under
    publish_via_partition_root: the partition's own name is then in no change the consumer
    receives, and a backfill of it alone is refused."""
    make_parted(db)
    db.execute(f"CREATE PUBLICATION pipeline {publication}")
    start = "SELECT backfill_start('parted_low', confirm => true, publication => 'pipeline')"
    if accepted:
        backfill_id = db.execute(start).fetchone()[0]
        assert wait_until_ended(db, backfill_id, timeout=30) == "done"
    else:
        e = error_of(db, start)
        assert e.sqlstate == "55000" and 'table public.parted_low is not in publication "pipeline"' in e.diag.message_primary


def test_a_partition_whose_publication_turns_to_publish_it_as_its_root_fails_the_backfill(db):
    """Set mid-run, publish_via_partition_root names the partition's changes as its root's: a
    page finds the partition no longer published as itself."""
    make_parted(db)
    db.execute("CREATE PUBLICATION pipeline FOR TABLE parted")
    change = "ALTER PUBLICATION pipeline SET (publish_via_partition_root = true)"
    _, (state, sqlstate, error) = ended_after_a_change_mid_run(db, "parted_low", change)
    assert state == "failed"
    assert sqlstate == "55000" and 'table public.parted_low is not in publication "pipeline"' in error, error
