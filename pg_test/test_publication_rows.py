"""A backfill for a pipeline's publication sends exactly what pgoutput sends that publication's
consumer: only the rows its row filter publishes (`FOR TABLE t WHERE (...)`), AND-ed with the
backfill's own filter, and only the columns it publishes (its column list, or every column but
the generated ones it does not publish: none on 15, as `publish_generated_columns` says on 18).
A row that enters or leaves the publication's filter reaches a real pgoutput consumer as
pgoutput sends it (an INSERT or a DELETE), and the consumer ends with exactly the rows the
publication publishes."""

import json
import shutil
import subprocess
import threading
import random
import time
from pathlib import Path

import pytest

from conftest import (PG_MAJOR, Consumer, as_reads, assert_each_row_read_once, backfill_messages, error_of, status,
                      wait_for, wait_until_ended, wal2json_changes)

NODE_DIR = Path(__file__).parent / "node"
EU = "(region = 'eu'::text)"  # the publication's filter as PostgreSQL prints it


@pytest.fixture
def customers(db):
    """400 customers, every fourth in the EU, and a publication of the EU ones only."""
    db.execute(
        """CREATE TABLE customers (id bigint PRIMARY KEY, region text NOT NULL, name text NOT NULL);
           ALTER TABLE customers REPLICA IDENTITY FULL;
           INSERT INTO customers SELECT g, CASE WHEN g % 4 = 0 THEN 'eu' ELSE 'us' END, 'c' || g
             FROM generate_series(1, 400) g;
           ANALYZE customers;
           CREATE PUBLICATION eu FOR TABLE customers WHERE (region = 'eu');"""
    )
    db.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    return db


def messages_of(db, slot="s"):
    return as_reads(backfill_messages(wal2json_changes(db, slot)))


def read_ids(messages):
    return sorted(m["data"]["id"] for m in messages if m["op"] == "read")


EU_IDS = list(range(4, 401, 4))


def test_a_publications_row_filter_is_the_backfills_and_the_start_marker_shows_it(customers):
    e = error_of(customers, "SELECT backfill_start('customers', publication => 'eu')")
    assert "about 100 rows" in e.diag.message_detail, "the estimate counts the published rows"
    backfill_id = customers.execute(
        "SELECT backfill_start('customers', confirm => true, publication => 'eu', batch_size => 30)"
    ).fetchone()[0]
    assert wait_until_ended(customers, backfill_id) == "done"
    messages = messages_of(customers)
    assert_each_row_read_once(messages, EU_IDS)
    assert [m["filter"] for m in messages if m["op"] == "table_start"] == [EU]
    assert customers.execute("SELECT publication_filter FROM backfill.job_table WHERE job_id = %s",
                             [backfill_id]).fetchone()[0] == EU
    # With a filter of its own: both.
    backfill_id = customers.execute(
        "SELECT backfill_start('customers', confirm => true, publication => 'eu', filter => 'id <= 200 -- a comment')"
    ).fetchone()[0]
    assert wait_until_ended(customers, backfill_id) == "done"
    messages = messages_of(customers)
    assert_each_row_read_once(messages, range(4, 201, 4))
    assert [m["filter"] for m in messages if m["op"] == "table_start"] == [f"({EU}) AND (\nid <= 200 -- a comment\n)"]
    assert status(customers, backfill_id, "row_filter") == "id <= 200 -- a comment"


def test_a_filter_cannot_undo_the_publications_by_closing_its_parenthesis(customers):
    """AND-ed with the publication's filter, `true) OR (true` would be one expression again,
    `(region = 'eu') AND (true) OR (true)`: it is checked alone first, and refused."""
    e = error_of(customers, "SELECT backfill_start('customers', confirm => true, publication => 'eu', filter => 'true) OR (true')")
    assert e.sqlstate == "42601" and "filter of a backfill of table public.customers" in e.diag.message_primary
    assert customers.execute("SELECT count(*) FROM backfill.job").fetchone()[0] == 0


def test_given_keys_the_rows_the_publication_withholds_are_absent(customers):
    """A keyed backfill (backfill_repair's) for the publication: a key whose row the filter
    leaves out is absent for its consumer as for pgoutput, which deletes it from a copy that
    holds it."""
    keys = [{"id": 4}, {"id": 5}, {"id": 1000}, {"id": 8}]
    backfill_id = customers.execute(
        "SELECT backfill_start('customers', confirm => true, publication => 'eu', batch_size => 2, keys => %s)",
        [json.dumps(keys)],
    ).fetchone()[0]
    assert wait_until_ended(customers, backfill_id) == "done"
    assert [(m["op"], m.get("key")) for m in messages_of(customers)] == [
        ("table_start", None), ("read", {"id": 4}), ("absent", {"id": 5}), ("read", {"id": 8}),
        ("absent", {"id": 1000}), ("table_end", None)]


def test_a_resumed_backfill_keeps_the_publications_row_filter(customers):
    customers.execute("INSERT INTO customers SELECT g, CASE WHEN g % 4 = 0 THEN 'eu' ELSE 'us' END, 'c' || g"
                      " FROM generate_series(401, 4000) g")
    backfill_id = customers.execute(
        "SELECT backfill_start('customers', confirm => true, publication => 'eu', batch_size => 100, rows_per_second => 1000)"
    ).fetchone()[0]
    wait_for(lambda: (status(customers, backfill_id, "rows_done") or 0) > 0, what="the first page")
    customers.execute("SELECT backfill_pause(%s)", [backfill_id])
    wait_for(lambda: status(customers, backfill_id, "state") == "paused" and status(customers, backfill_id, "worker_pid") is None,
             what="the pause")
    customers.execute("SELECT backfill_set(%s, rows_per_second => 0)", [backfill_id])
    customers.execute("SELECT backfill_resume(%s)", [backfill_id])
    assert wait_until_ended(customers, backfill_id) == "done"
    assert_each_row_read_once(messages_of(customers), range(4, 4001, 4))


@pytest.mark.parametrize("change", ["SET TABLE customers WHERE (region = 'us')", "SET TABLE customers"])
def test_a_publications_row_filter_changed_mid_run_stops_the_backfill(customers, change):
    customers.execute("INSERT INTO customers SELECT g, 'eu', 'c' || g FROM generate_series(401, 20000) g")
    backfill_id = customers.execute(
        "SELECT backfill_start('customers', confirm => true, publication => 'eu', batch_size => 100, rows_per_second => 2000)"
    ).fetchone()[0]
    wait_for(lambda: (status(customers, backfill_id, "rows_done") or 0) > 0, what="the first page")
    customers.execute(f"ALTER PUBLICATION eu {change}")
    assert wait_until_ended(customers, backfill_id, timeout=30) == "failed"
    sqlstate, error = status(customers, backfill_id, "last_error_sqlstate", "last_error")
    assert sqlstate == "55000" and 'publication "eu" changed its row filter for table public.customers' in error, error
    assert status(customers, backfill_id, "rows_done") < 19000
    # Every read before the change is a row the publication published then.
    messages = messages_of(customers)
    assert {m["data"]["region"] for m in messages if m["op"] == "read"} == {"eu"}


@pytest.fixture
def parted(db):
    db.execute(
        """CREATE TABLE pr (id int PRIMARY KEY, region text NOT NULL) PARTITION BY RANGE (id);
           CREATE TABLE pr1 PARTITION OF pr FOR VALUES FROM (0) TO (100);
           CREATE TABLE pr2 PARTITION OF pr FOR VALUES FROM (100) TO (200);
           INSERT INTO pr SELECT g, CASE WHEN g % 4 = 0 THEN 'eu' ELSE 'us' END FROM generate_series(1, 199) g;"""
    )
    db.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    return db


def test_a_partitioned_table_published_through_its_root_with_a_row_filter_is_refused(parted):
    """A filtered page of a partitioned table cannot find its rows by row id: refused, naming
    the table and the publication (and its partitions alone are not what the publication
    publishes: their changes come as the root's)."""
    parted.execute("CREATE PUBLICATION pub FOR TABLE pr WHERE (region = 'eu') WITH (publish_via_partition_root = true)")
    e = error_of(parted, "SELECT backfill_start('pr', confirm => true, publication => 'pub')")
    assert e.sqlstate == "0A000" and e.diag.message_primary == 'table public.pr cannot be backfilled for publication "pub"'
    assert "published as those of their partitioned table, where (region = 'eu'::text)" in e.diag.message_detail, e.diag.message_detail
    assert "publish_via_partition_root = false" in e.diag.message_hint
    e = error_of(parted, "SELECT backfill_start('pr1', confirm => true, publication => 'pub')")
    assert e.sqlstate == "55000" and 'table public.pr1 is not in publication "pub"' in e.diag.message_primary
    assert parted.execute("SELECT count(*) FROM backfill.job").fetchone()[0] == 0


def test_a_partitioned_table_whose_partitions_have_row_filters_is_refused_and_each_partition_follows_its_own(parted):
    parted.execute("CREATE PUBLICATION pub FOR TABLE pr1 WHERE (region = 'eu'), pr2")
    e = error_of(parted, "SELECT backfill_start('pr', confirm => true, publication => 'pub')")
    assert e.sqlstate == "0A000" and e.diag.message_primary == 'table public.pr cannot be backfilled for publication "pub"'
    assert "partition public.pr1 where (region = 'eu'::text)" in e.diag.message_detail, e.diag.message_detail
    assert "backfill_start(ARRAY[...]::regclass[], publication => 'pub')" in e.diag.message_hint
    assert parted.execute("SELECT count(*) FROM backfill.job").fetchone()[0] == 0
    backfill_id = parted.execute(
        "SELECT backfill_start(ARRAY['pr1', 'pr2']::regclass[], confirm => true, publication => 'pub')").fetchone()[0]
    assert wait_until_ended(parted, backfill_id) == "done"
    assert read_ids(messages_of(parted)) == [i for i in range(1, 100) if i % 4 == 0] + list(range(100, 200))


@pytest.mark.parametrize("publication", [
    "FOR ALL TABLES",
    "FOR TABLES IN SCHEMA public, TABLE customers WHERE (region = 'eu')",
])
def test_a_publication_of_every_table_or_of_the_tables_schema_publishes_every_row(customers, publication):
    """pgoutput applies no row filter for FOR ALL TABLES, nor for a table whose schema the
    publication lists (even where it lists the table with a filter too)."""
    customers.execute(f"CREATE PUBLICATION everything {publication}")
    backfill_id = customers.execute(
        "SELECT backfill_start('customers', confirm => true, publication => 'everything')").fetchone()[0]
    assert wait_until_ended(customers, backfill_id) == "done"
    assert read_ids(messages_of(customers)) == list(range(1, 401))


def test_rows_crossing_the_publications_filter_reach_a_pgoutput_consumer_as_it_sends_them(cluster, db):
    """Writers move customers in and out of the EU, change and delete them and add new ones while
    the backfill runs; a real pgoutput client of the publication applies reads, INSERTs and
    DELETEs in stream order and ends with exactly the EU customers. (Before 0.10.0 every row was
    read: the other regions' rows stayed in the copy.)"""
    assert shutil.which("node") and (NODE_DIR / "node_modules" / "pg-logical-replication").is_dir(), \
        "node and pg_test/node/node_modules are missing: run scripts/setup.sh"
    dbname, rows = db.info.dbname, 6000
    db.execute(
        f"""CREATE TABLE customers (id bigint PRIMARY KEY, region text NOT NULL, v int NOT NULL DEFAULT 0);
            ALTER TABLE customers REPLICA IDENTITY FULL;
            INSERT INTO customers SELECT g, CASE WHEN g % 4 = 0 THEN 'eu' ELSE 'us' END, 0 FROM generate_series(1, {rows}) g;
            ANALYZE customers;
            CREATE PUBLICATION eu FOR TABLE customers WHERE (region = 'eu');"""
    )
    db.execute("SELECT pg_create_logical_replication_slot('node_slot', 'pgoutput')")
    keys = {str(i): bytes(k).hex() for i, k in db.execute("SELECT id, key FROM backfill.message_key").fetchall()}
    consumer = subprocess.Popen(
        ["node", str(NODE_DIR / "consumer.js"), str(cluster.port), dbname, "node_slot", "eu", "customers", json.dumps(keys)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    stop, errors, ops = threading.Event(), [], [0]

    def write(seed):
        rng = random.Random(seed)
        fresh = iter(range(rows + 1 + seed, 10**9, 2))
        try:
            with cluster.connect(dbname) as conn:
                while not stop.is_set():
                    ops[0] += 1
                    dice, target = rng.random(), rng.randint(1, rows)
                    if dice < 0.5:  # into or out of the filter
                        conn.execute("UPDATE customers SET region = CASE region WHEN 'eu' THEN 'us' ELSE 'eu' END,"
                                     " v = v + 1 WHERE id = %s", [target])
                    elif dice < 0.75:
                        conn.execute("UPDATE customers SET v = v + 1 WHERE id = %s", [target])
                    elif dice < 0.9:
                        conn.execute("INSERT INTO customers VALUES (%s, %s, 0)", [next(fresh), rng.choice(["eu", "us"])])
                    else:
                        conn.execute("DELETE FROM customers WHERE id = %s", [target])
        except Exception as e:  # a writer must never fail because of the backfill
            errors.append(repr(e))

    writers = [threading.Thread(target=write, args=(seed,)) for seed in (0, 1)]
    try:
        backfill_id = db.execute(
            "SELECT backfill_start('customers', confirm => true, slot => 'node_slot', publication => 'eu',"
            " batch_size => 100, rows_per_second => 3000)"
        ).fetchone()[0]
        for writer in writers:
            writer.start()
        assert wait_until_ended(db, backfill_id) == "done"
        stop.set()
        for writer in writers:
            writer.join()
        assert errors == [] and ops[0] > 200
        assert db.execute("SELECT backfill_wait(%s, '60 s')", [backfill_id]).fetchone()[0] is True
        db.execute("SELECT pg_logical_emit_message(true, 'test_end', '')")
        out, err = consumer.communicate(timeout=120)
    finally:
        stop.set()
        if consumer.poll() is None:
            consumer.kill()
    assert consumer.returncode == 0, err
    counts, *copied = [json.loads(line) for line in out.splitlines()]
    copy = {row["id"]: (row["region"], row["v"]) for row in copied}
    source = {str(i): (r, str(v)) for i, r, v in db.execute("SELECT id, region, v FROM customers WHERE region = 'eu'")}
    assert copy == source, counts
    # (The writers flip regions often enough that about half the rows may be in the EU when the
    # scan reads them: the copy, not the count of reads, shows the filter.)
    assert counts["invalid"] == 0 and counts["changes"] > 0 and 0 < counts["reads"] < rows, counts


def test_a_repair_through_the_pipelines_slot_sends_no_row_its_publication_withholds(cluster, customers):
    """The copy holds the other regions' customers too (as every backfill left it before 0.10.0):
    the repair through the pipeline's slot re-delivers a differing EU customer and delivers a
    differing other one as absent, which deletes it from the copy, as pgoutput would have."""
    customers.execute("CREATE TABLE copy (LIKE customers INCLUDING ALL); INSERT INTO copy SELECT * FROM customers")
    customers.execute("SELECT pg_create_logical_replication_slot('pipe', 'test_decoding')")
    consumer = Consumer(cluster, customers.info.dbname, "pipe")
    # The comparison waits for the consumer to confirm the position it reads at: on an idle
    # server pg_recvlogical learns of a later position only from a keepalive, every 30 s.
    stop = threading.Event()

    def tick():
        with cluster.connect(customers.info.dbname) as conn:
            while not stop.wait(0.1):
                conn.execute("SELECT pg_logical_emit_message(false, 'tick', '')")

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        first = customers.execute(
            "SELECT backfill_start('customers', confirm => true, slot => 'pipe', publication => 'eu')").fetchone()[0]
        assert wait_until_ended(customers, first) == "done"
        customers.execute("UPDATE copy SET name = 'stale' WHERE id IN (5, 8)")
        repair = customers.execute("SELECT backfill_repair('customers', 'copy', confirm => true, passes => 1)").fetchone()[0]
        assert customers.execute("SELECT backfill_wait(%s, '60 s')", [repair]).fetchone()[0] is True
        wait_for(lambda: any(m["backfill_id"] == repair and m["op"] == "table_end" for m in consumer.messages()),
                 what="the repair's messages")
    finally:
        stop.set()
        ticker.join()
        consumer.stop()
    # (A page sends its keys' reads, then its absent keys.)
    assert [(m["op"], m.get("key")) for m in as_reads(consumer.messages()) if m["backfill_id"] == repair] == [
        ("table_start", None), ("read", {"id": 8}), ("absent", {"id": 5}), ("table_end", None)]


# The columns: as pgoutput sends them.

def pgoutput_columns(db, publication, table):
    """The columns pgoutput sends of `table` to `publication`'s consumer: those its Relation
    message names (protocol 1), after an UPDATE of one of its rows."""
    db.execute("SELECT pg_create_logical_replication_slot('oracle', 'pgoutput')")
    try:
        db.execute(f"UPDATE {table} SET id = id WHERE id = 1")
        for (data,) in db.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes('oracle', NULL, NULL,"
            " 'proto_version', '1', 'publication_names', %s)", [publication]
        ):
            data = bytes(data)
            if data[:1] != b"R":
                continue
            at = 5  # R, relation id
            names = []
            for _ in range(2):  # its schema and name
                end = data.index(b"\0", at)
                names.append(data[at:end].decode())
                at = end + 1
            if names[1] != table:
                continue
            count = int.from_bytes(data[at + 1:at + 3], "big")  # after the replica identity
            at, columns = at + 3, []
            for _ in range(count):  # flags, name, type, typmod
                end = data.index(b"\0", at + 1)
                columns.append(data[at + 1:end].decode())
                at = end + 9
            return columns
        raise AssertionError(f"pgoutput sent no relation message for {table}")
    finally:
        db.execute("SELECT pg_drop_replication_slot('oracle')")


def backfill_columns(db, publication, table):
    """The columns a backfill of `table` for `publication` sends: its start marker's, its reads'."""
    db.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    backfill_id = db.execute(
        "SELECT backfill_start(%s, confirm => true, publication => %s)", [table, publication]).fetchone()[0]
    assert wait_until_ended(db, backfill_id) == "done"
    messages = messages_of(db)
    db.execute("SELECT pg_drop_replication_slot('s')")
    reads = {tuple(m["data"]) for m in messages if m["op"] == "read"}
    assert len(reads) == 1, reads
    start = [m for m in messages if m["op"] == "table_start"][0]
    return list(reads.pop()), start.get("columns")


@pytest.mark.skipif(PG_MAJOR < 18, reason="publish_generated_columns and virtual generated columns are 18's")
@pytest.mark.parametrize("publication, published", [
    ("FOR TABLE g", ["id", "a"]),
    ("FOR TABLE g WITH (publish_generated_columns = none)", ["id", "a"]),
    ("FOR TABLE g WITH (publish_generated_columns = stored)", ["id", "a", "s"]),
    ("FOR ALL TABLES WITH (publish_generated_columns = stored)", ["id", "a", "s"]),
    ("FOR TABLE g (id, s)", ["id", "s"]),
])
def test_a_publication_sends_the_generated_columns_pgoutput_sends(db, publication, published):
    """On 18 a publication sends a stored generated column when it says
    publish_generated_columns = stored, or lists it; a virtual one never."""
    db.execute("""CREATE TABLE g (id int PRIMARY KEY, a int, s int GENERATED ALWAYS AS (a * 2) STORED,
                                  v int GENERATED ALWAYS AS (a * 3) VIRTUAL);
                  INSERT INTO g (id, a) SELECT x, x FROM generate_series(1, 10) x;""")
    db.execute(f"CREATE PUBLICATION pub {publication}")
    assert pgoutput_columns(db, "pub", "g") == published
    assert backfill_columns(db, "pub", "g") == (published, published)


@pytest.mark.skipif(PG_MAJOR >= 18, reason="15's and 17's pgoutput never send a generated column; 18's is tested above")
def test_a_publication_before_18_sends_no_generated_column(db):
    """15's and 17's pg_publication_tables list a stored generated column, which their pgoutput never sends."""
    db.execute("""CREATE TABLE g (id int PRIMARY KEY, a int, s int GENERATED ALWAYS AS (a * 2) STORED);
                  INSERT INTO g (id, a) SELECT x, x FROM generate_series(1, 10) x;
                  CREATE PUBLICATION pub FOR TABLE g;""")
    assert pgoutput_columns(db, "pub", "g") == ["id", "a"]
    assert backfill_columns(db, "pub", "g") == (["id", "a"], ["id", "a"])
