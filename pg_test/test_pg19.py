"""What PostgreSQL 19 changes that touches a backfill: logical decoding at wal_level = replica
once a logical slot exists, REPACK (CONCURRENTLY) of a table under backfill, DROP DATABASE with
a backfill running, and the defaults that changed (lz4 TOAST compression, JIT off). Each test
decodes with test_decoding: wal2json has no build for 19."""

import json
import threading

import psycopg
import pytest

from conftest import PG_MAJOR, error_of, extra_cluster, status, wait_for, wait_until_ended, worker_pid

pytestmark = pytest.mark.skipif(PG_MAJOR < 19, reason="PostgreSQL 19's behaviour")

READ_PREFIX = "message: transactional: 1 prefix: backfill,"


def decoded_messages(conn, slot):
    """The backfill's messages in `slot` (test_decoding), parsed, in stream order."""
    rows = conn.execute("SELECT data FROM pg_logical_slot_get_changes(%s, NULL, NULL)", [slot]).fetchall()
    return [json.loads(data.split(" content:", 1)[1]) for data, in rows if data.startswith(READ_PREFIX)]


def read_ids(messages):
    return [m["key"]["id"] for m in messages if m["op"] == "read"]


@pytest.mark.cluster
def test_at_wal_level_replica_a_backfill_starts_once_a_logical_slot_exists(cluster):
    replica = extra_cluster(cluster, "replica")
    replica.start("wal_level = replica")
    try:
        with replica.connect() as conn:
            conn.execute(
                """CREATE EXTENSION pg_backfill;
                   CREATE TABLE t (id int PRIMARY KEY, label text);
                   INSERT INTO t SELECT g, 'row ' || g FROM generate_series(1, 300) g"""
            )
            assert conn.execute("SHOW effective_wal_level").fetchone()[0] == "replica"
            # No logical slot: nothing decodes what a backfill writes, so it is refused, saying
            # what turns decoding on.
            e = error_of(conn, "SELECT backfill_start('t', confirm => true)")
            assert e.sqlstate == "55000"
            assert 'effective_wal_level is "replica"' in e.diag.message_detail
            assert "logical replication slot" in e.diag.message_hint and "wal_level = logical" in e.diag.message_hint
            eligible, reason = conn.execute("SELECT eligible, reason FROM backfill_estimate('t')").fetchone()
            assert eligible is False and "effective_wal_level" in reason, reason

            # The consumer's slot turns logical decoding on: the backfill starts and is decoded.
            conn.execute("SELECT pg_create_logical_replication_slot('consumer', 'test_decoding')")
            wait_for(lambda: conn.execute("SHOW effective_wal_level").fetchone()[0] == "logical",
                     what="logical decoding to be on")
            assert conn.execute("SELECT eligible FROM backfill_estimate('t')").fetchone()[0] is True
            backfill_id = conn.execute("SELECT backfill_start('t', confirm => true, batch_size => 64)").fetchone()[0]
            assert wait_until_ended(conn, backfill_id) == "done"
            messages = decoded_messages(conn, "consumer")
            assert [m["op"] for m in messages] == ["table_start"] + ["read"] * 300 + ["table_end"]
            assert sorted(read_ids(messages)) == list(range(1, 301))
            conn.execute("SELECT pg_drop_replication_slot('consumer')")
    finally:
        replica.stop()


@pytest.mark.slow
def test_repack_concurrently_under_a_backfill_keeps_the_copy_exact(cluster, db):
    rows = 20_000
    db.execute(
        f"""CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL DEFAULT 0, pad text);
            INSERT INTO t SELECT g, 0, repeat('x', 200) FROM generate_series(1, {rows}) g;
            -- Dead rows for REPACK to leave behind: every row moves at least once.
            UPDATE t SET v = 1 WHERE id % 2 = 0;"""
    )
    db.execute("SELECT pg_create_logical_replication_slot('consumer', 'test_decoding')")
    backfill_id = db.execute(
        "SELECT backfill_start('t', confirm => true, batch_size => 500, rows_per_second => 4000)"
    ).fetchone()[0]
    wait_for(lambda: (status(db, backfill_id, "rows_done") or 0) > 0, what="the backfill to begin")
    with cluster.connect(db.info.dbname) as other:
        before = other.execute("SELECT relfilenode FROM pg_class WHERE oid = 't'::regclass").fetchone()[0]
        other.execute("REPACK (CONCURRENTLY) t")
        after = other.execute("SELECT relfilenode FROM pg_class WHERE oid = 't'::regclass").fetchone()[0]
    assert before != after, "REPACK rewrote the table"
    assert status(db, backfill_id, "state") in ("running", "done")
    assert wait_until_ended(db, backfill_id, timeout=300) == "done"
    ids = read_ids(decoded_messages(db, "consumer"))
    assert len(ids) == rows and sorted(ids) == list(range(1, rows + 1)), "each row read exactly once"


def test_drop_database_waits_for_no_backfill_and_cancelled_one_lets_it_go(cluster, scratch_database):
    name = scratch_database("pg19_drop_database")
    with cluster.connect(name) as conn:
        conn.execute(
            """CREATE EXTENSION pg_backfill;
               CREATE TABLE t (id int PRIMARY KEY);
               INSERT INTO t SELECT generate_series(1, 100000)"""
        )
        conn.execute("SELECT pg_create_logical_replication_slot('consumer_pg19_drop', 'test_decoding')")
        backfill_id = conn.execute(
            "SELECT backfill_start('t', confirm => true, batch_size => 100, rows_per_second => 200)"
        ).fetchone()[0]
        wait_for(lambda: worker_pid(conn, backfill_id), what="the backfill's worker")
        conn.execute("SELECT pg_drop_replication_slot('consumer_pg19_drop')")
    # The worker is connected to the database: DROP DATABASE refuses, as for any session
    # (pg_backfill's workers do not ask to be terminated by it: a backfill is never ended by a
    # command that does not name it).
    with cluster.connect() as admin:
        e = error_of(admin, f'DROP DATABASE "{name}"')
        assert e.sqlstate == "55006", e
        # WITH (FORCE) ends every session, the backfill's worker too, and drops it.
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        assert admin.execute("SELECT count(*) FROM pg_database WHERE datname = %s", [name]).fetchone()[0] == 0
        # No worker of the dropped database is started again.
        wait_for(lambda: admin.execute(
            "SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'pg_backfill' AND application_name ~ %s",
            [rf"^pg_backfill (starting )?{backfill_id}(/[0-9]+)?$"]).fetchone()[0], what="no worker of the dropped database")


def test_changed_defaults_lz4_toast_and_jit_off_are_backfilled_as_before(db):
    assert db.execute("SHOW default_toast_compression").fetchone()[0] == "lz4"
    assert db.execute("SHOW jit").fetchone()[0] == "off"
    db.execute(
        """CREATE TABLE docs (id int PRIMARY KEY, body text);
           INSERT INTO docs SELECT g, repeat(md5(g::text), 400) FROM generate_series(1, 50) g"""
    )
    assert db.execute("SELECT DISTINCT pg_column_compression(body) FROM docs").fetchall() == [("lz4",)]
    db.execute("SELECT pg_create_logical_replication_slot('consumer', 'test_decoding')")
    backfill_id = db.execute("SELECT backfill_start('docs', confirm => true, batch_size => 7)").fetchone()[0]
    assert wait_until_ended(db, backfill_id) == "done"
    reads = [m for m in decoded_messages(db, "consumer") if m["op"] == "read"]
    expected = dict(db.execute("SELECT id, body FROM docs").fetchall())
    assert {m["data"]["id"]: m["data"]["body"] for m in reads} == expected


# FOR ALL TABLES EXCEPT (TABLE ...), 19's: the tables it leaves out are not the pipeline's, by
# every rule that asks what a publication publishes (pgoutput's: a partitioned table left out
# takes its partitions with it).
EXCEPT_SCHEMA = """CREATE TABLE a (id int PRIMARY KEY, v int NOT NULL DEFAULT 0);
                   CREATE TABLE b (id int PRIMARY KEY, v int NOT NULL DEFAULT 0);
                   CREATE TABLE pt (id int PRIMARY KEY, v int NOT NULL DEFAULT 0) PARTITION BY RANGE (id);
                   CREATE TABLE pt1 PARTITION OF pt FOR VALUES FROM (0) TO (1000);
                   CREATE TABLE pt2 PARTITION OF pt FOR VALUES FROM (1000) TO (100000);
                   INSERT INTO a SELECT g FROM generate_series(1, 3000) g;
                   INSERT INTO b SELECT g FROM generate_series(1, 200) g;
                   INSERT INTO pt SELECT g FROM generate_series(1, 2000) g;"""


def test_a_table_for_all_tables_except_leaves_out_is_not_backfilled_into_its_pipeline(db):
    db.execute(EXCEPT_SCHEMA)
    db.execute("CREATE PUBLICATION p FOR ALL TABLES EXCEPT (TABLE b, TABLE pt)")
    db.execute("CREATE PUBLICATION p_via_root FOR ALL TABLES EXCEPT (TABLE b) WITH (publish_via_partition_root)")
    for table in ("b", "pt", "pt1"):
        e = error_of(db, f"SELECT backfill_start('{table}', publication => 'p', confirm => true)")
        assert e.sqlstate == "55000" and 'is not in publication "p"' in e.diag.message_primary, e.diag.message_primary
        assert f"public.{table}" in e.diag.message_primary
    assert db.execute("SELECT count(*) FROM backfill.job").fetchone()[0] == 0
    # With no table list, a start takes exactly what the publication publishes.
    backfill_id = db.execute("SELECT backfill_start(publication => 'p', confirm => true)").fetchone()[0]
    assert status(db, backfill_id, "tables") == ["a"]
    assert wait_until_ended(db, backfill_id) == "done" and status(db, backfill_id, "rows_done") == 3000
    backfill_id = db.execute("SELECT backfill_start(publication => 'p_via_root', confirm => true)").fetchone()[0]
    assert sorted(status(db, backfill_id, "tables")) == ["a", "pt"]
    assert wait_until_ended(db, backfill_id) == "done" and status(db, backfill_id, "rows_done") == 5000


def test_a_table_put_in_the_except_list_mid_run_fails_its_backfill_and_no_page_follows(db):
    """The per-page check: the pipeline stops capturing the table when the publication's EXCEPT
    list takes it in, and the backfill stops there, as when a table is dropped from a list."""
    db.execute(EXCEPT_SCHEMA)
    db.execute("CREATE PUBLICATION p FOR ALL TABLES EXCEPT (TABLE b)")
    db.execute("SELECT pg_create_logical_replication_slot('consumer', 'test_decoding')")
    backfill_id = db.execute(
        "SELECT backfill_start('a', publication => 'p', confirm => true, batch_size => 50, rows_per_second => 500)"
    ).fetchone()[0]
    wait_for(lambda: (status(db, backfill_id, "rows_done") or 0) > 0, what="the first page")
    db.execute("ALTER PUBLICATION p SET ALL TABLES EXCEPT (TABLE a)")
    assert wait_until_ended(db, backfill_id, timeout=60) == "failed"
    sqlstate, error = status(db, backfill_id, "last_error_sqlstate", "last_error")
    assert sqlstate == "55000" and 'table public.a is not in publication "p"' in error, error
    rows_done = status(db, backfill_id, "rows_done")
    assert rows_done < 3000
    # What the consumer received is what the backfill recorded: no page after the refusal.
    assert len(read_ids(decoded_messages(db, "consumer"))) == rows_done
    db.execute("SELECT pg_drop_replication_slot('consumer')")


def test_a_follow_backfills_a_table_taken_out_of_the_except_list_and_not_one_put_in(cluster, db):
    """For a follow a table taken out of the EXCEPT list is an addition, its rows backfilled into
    the slot; one put in is a removal: its running backfill fails, and it is never sent."""
    from test_citus import PgOutputStream

    db.execute(EXCEPT_SCHEMA)
    db.execute("CREATE PUBLICATION p FOR ALL TABLES EXCEPT (TABLE a, TABLE b)")
    db.execute("SELECT pg_create_logical_replication_slot('cdc', 'pgoutput')")
    stream = PgOutputStream(cluster, "cdc", "p", dbname=db.info.dbname)
    stream.start()
    try:
        db.execute("SELECT backfill_follow('p', 'cdc', batch_size => 50, rows_per_second => 1000)")
        db.execute("ALTER PUBLICATION p SET ALL TABLES EXCEPT (TABLE a)")
        backfill_b = wait_for(lambda: db.execute(
            "SELECT backfill_id FROM backfill.follow_table WHERE table_name = 'public.b' AND state = 'started'").fetchone(),
            what="the follow to start b's backfill")[0]
        assert wait_until_ended(db, backfill_b) == "done" and status(db, backfill_b, "rows_done") == 200
        db.execute("ALTER PUBLICATION p SET ALL TABLES")
        backfill_a = wait_for(lambda: db.execute(
            "SELECT backfill_id FROM backfill.follow_table WHERE table_name = 'public.a' AND state = 'started'").fetchone(),
            what="the follow to start a's backfill")[0]
        wait_for(lambda: (status(db, backfill_a, "rows_done") or 0) > 0, what="a's first page")
        db.execute("ALTER PUBLICATION p SET ALL TABLES EXCEPT (TABLE a)")
        assert wait_until_ended(db, backfill_a, timeout=60) == "failed"
        assert 'table public.a is not in publication "p"' in status(db, backfill_a, "last_error")
        reads = [m for kind, prefix, m in (e for e in stream.events if e[0] == "M")
                 if prefix == "backfill" and m["op"] == "read"]
        assert sorted(m["data"]["id"] for m in reads if m["table"] == "b") == list(range(1, 201))
        assert len([m for m in reads if m["table"] == "a"]) <= status(db, backfill_a, "rows_done")
        assert not stream.errors
    finally:
        stream.stop()
