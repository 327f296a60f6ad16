"""Citus: a backfill of a distributed table, started on the coordinator, is one backfill on each
worker node, of the shards there, in that node's stream. Three clusters of this run's major: a
coordinator and two worker nodes, with Citus's change data capture on (pgoutput on a worker names
shard changes by the distributed table). A consumer reads every worker node's slot with a real
streaming client (psycopg2, pgoutput with messages) and applies each node's stream in its order.

Skipped where Citus is not installed (PostgreSQL 15, or a clone without ../shared/vendor):
scripts/build_postgres.sh builds it for 16 and later from ../shared/vendor/citus-*.tar.gz."""

import json
import random
import select
import struct
import subprocess
import threading
import time
from pathlib import Path

import psycopg
import psycopg2
import psycopg2.extras
import pytest

from conftest import PG_BIN, PG_MAJOR, PG_ROOT, error_of, extra_cluster, readme_grants, wait_for, wait_until_ended

pytestmark = pytest.mark.cluster

NODES = ["citus_coordinator", "citus_worker1", "citus_worker2"]
ROWS = 20_000  # even ids 2..40000; writers insert odd ids, so no key is ever reused


def citus_installed() -> bool:
    pkglibdir = subprocess.run([f"{PG_BIN}/pg_config", "--pkglibdir"], capture_output=True, text=True).stdout.strip()
    return 16 <= PG_MAJOR <= 18 and (Path(f"{PG_ROOT}{pkglibdir}") / "citus.so").exists()


@pytest.fixture(scope="module")
def citus(cluster):
    """The coordinator and two worker nodes, pg_backfill created on the coordinator (Citus
    creates it on the workers)."""
    if not citus_installed():
        if PG_MAJOR >= 19:
            pytest.skip(f"Citus has no release for PostgreSQL {PG_MAJOR} (Citus 14 supports 16 to 18)")
        pytest.skip(f"Citus is not installed for PostgreSQL {PG_MAJOR}: it needs 16 or later, and "
                    "scripts/build_postgres.sh builds it (for 18) from ../shared/vendor/citus-*.tar.gz; 17's Debian 13 "
                    "root (scripts/pg_root.sh) has none")
    nodes = [extra_cluster(cluster, name) for name in NODES]
    conf = ("shared_preload_libraries = 'citus, pg_backfill'\n"
            "citus.enable_change_data_capture = on\n"
            "max_connections = 100")
    for node in nodes:
        node.start(conf)
    try:
        for node in nodes:
            with node.connect() as conn:
                conn.execute("CREATE EXTENSION citus")
        with nodes[0].connect() as conn:
            conn.execute("SELECT citus_set_coordinator_host('127.0.0.1', %s)", [nodes[0].port])
            for worker in nodes[1:]:
                conn.execute("SELECT citus_add_node('127.0.0.1', %s)", [worker.port])
            conn.execute("CREATE EXTENSION pg_backfill")
        yield nodes
    finally:
        for node in nodes:
            node.stop()


@pytest.fixture
def orders(citus):
    """A distributed table of ROWS rows in 4 shards, a publication of it, and a connection to the
    coordinator; dropped afterwards with every slot on the workers."""
    coordinator = citus[0].connect()
    coordinator.execute(
        f"""CREATE TABLE orders (id bigint PRIMARY KEY, v int NOT NULL DEFAULT 0, payload text NOT NULL);
            SELECT create_distributed_table('orders', 'id', shard_count => 4);
            INSERT INTO orders SELECT 2 * g, 0, md5(g::text) FROM generate_series(1, {ROWS}) g;
            CREATE PUBLICATION orders_pub FOR TABLE orders;"""
    )
    yield coordinator
    coordinator.close()
    coordinator = citus[0].connect()  # (a test may have restarted the coordinator)
    for id_, in coordinator.execute("SELECT id FROM backfill_status WHERE state IN ('running', 'paused')").fetchall():
        coordinator.execute("SELECT backfill_cancel(%s)", [id_])
    coordinator.execute("DROP PUBLICATION IF EXISTS orders_pub; DROP TABLE IF EXISTS orders")
    for worker in citus[1:]:
        with worker.connect() as conn:
            wait_for(lambda: conn.execute("SELECT count(*) FROM pg_replication_slots WHERE active").fetchone()[0] == 0,
                     what="the consumers to let go of their slots")
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots")
    coordinator.close()


def shards_by_node(citus):
    """{worker port: {shard id, ...}} of table orders."""
    with citus[0].connect() as conn:
        rows = conn.execute("SELECT nodeport, shardid FROM citus_shards WHERE table_name = 'orders'::regclass").fetchall()
    placed = {}
    for port, shard in rows:
        placed.setdefault(port, set()).add(shard)
    return placed


class PgOutputStream(threading.Thread):
    """A real streaming consumer of one worker node's pgoutput slot (through Citus's change data
    capture), with messages: it records the node's stream in order, as events
    ("I"/"U"/"D", table, row or key) and ("M", prefix, content), and confirms what it received."""

    def __init__(self, node, slot, publication="orders_pub", dbname="postgres"):
        super().__init__(daemon=True)
        self.node, self.slot, self.publication, self.dbname = node, slot, publication, dbname
        self.events, self.relations, self.errors = [], {}, []
        self.stop_event = threading.Event()
        self.received_lsn = 0

    def run(self):
        try:
            conn = psycopg2.connect(host="127.0.0.1", port=self.node.port, user="postgres", dbname=self.dbname,
                                    connection_factory=psycopg2.extras.LogicalReplicationConnection)
            cursor = conn.cursor()
            cursor.start_replication(slot_name=self.slot, decode=False, options={
                "proto_version": "1", "publication_names": self.publication, "messages": "true"})
            while not self.stop_event.is_set():
                message = cursor.read_message()
                if message is None:
                    # Idle: everything before the server's last position is received (as
                    # pg_recvlogical confirms on a keepalive).
                    self.received_lsn = max(self.received_lsn, cursor.wal_end)
                    cursor.send_feedback(flush_lsn=self.received_lsn, force=True)
                    select.select([cursor], [], [], 0.05)
                    continue
                self.decode(bytes(message.payload))
                self.received_lsn = max(self.received_lsn, message.data_start)
                if message.payload[:1] == b"C":
                    cursor.send_feedback(flush_lsn=message.data_start, force=True)
            conn.close()
        except Exception as e:  # reported by the test
            self.errors.append(repr(e))

    def stop(self):
        self.stop_event.set()
        self.join(10)

    def decode(self, payload):
        kind = payload[:1]
        if kind == b"R":
            relid, = struct.unpack_from(">I", payload, 1)
            namespace, offset = cstring(payload, 5)
            name, offset = cstring(payload, offset)
            offset += 1  # replica identity
            count, = struct.unpack_from(">h", payload, offset)
            offset += 2
            columns = []
            for _ in range(count):
                offset += 1  # flags
                column, offset = cstring(payload, offset)
                columns.append(column)
                offset += 8  # type oid, type modifier
            self.relations[relid] = (namespace, name, columns)
        elif kind in (b"I", b"U", b"D"):
            relid, = struct.unpack_from(">I", payload, 1)
            namespace, name, columns = self.relations[relid]
            offset, old = 5, None
            if payload[offset:offset + 1] in (b"K", b"O"):
                old, offset = tuple_data(payload, offset + 1, columns)
            if kind == b"D":
                self.events.append(("D", name, old))
                return
            offset += 1  # "N"
            new, _ = tuple_data(payload, offset, columns)
            self.events.append((kind.decode(), name, new, old))
        elif kind == b"M":
            offset = 1 + 1 + 8  # flags, lsn
            prefix, offset = cstring(payload, offset)
            length, = struct.unpack_from(">I", payload, offset)
            content = payload[offset + 4:offset + 4 + length]
            self.events.append(("M", prefix, json.loads(content)))


def cstring(payload, offset):
    end = payload.index(b"\0", offset)
    return payload[offset:end].decode(), end + 1


def tuple_data(payload, offset, columns):
    count, = struct.unpack_from(">h", payload, offset)
    offset += 2
    row = {}
    for i in range(count):
        kind = payload[offset:offset + 1]
        offset += 1
        if kind == b"t":
            length, = struct.unpack_from(">I", payload, offset)
            row[columns[i]] = payload[offset + 4:offset + 4 + length].decode()
            offset += 4 + length
        else:  # null or unchanged TOAST: none here
            row[columns[i]] = None
    return row, offset


def replay(events):
    """Applies one node's stream in order, reads as upserts. Returns (rows by id, violations,
    read messages)."""
    state, deleted, violations, reads = {}, set(), [], []
    for event in events:
        if event[0] == "M":
            _, prefix, message = event
            if prefix != "backfill" or message["op"] != "read":
                continue
            reads.append(message)
            row = message["data"]
            key = row["id"]
            if key in deleted:
                violations.append(f"read brought back deleted row {key}")
            elif key in state and state[key][0] > row["v"]:
                violations.append(f"read of {key} at v{row['v']} after a change to v{state[key][0]}")
            state[key] = (row["v"], row["payload"])
        elif event[1] != "orders":
            violations.append(f"a change named {event[1]}, not the distributed table")
        elif event[0] == "D":
            key = int(event[2]["id"])
            state.pop(key, None)
            deleted.add(key)
        else:
            _, _, new, old = event
            if old is not None and int(old["id"]) != int(new["id"]):
                state.pop(int(old["id"]), None)
            state[int(new["id"])] = (int(new["v"]), new["payload"])
    return state, violations, reads


class Writers(threading.Thread):
    """Application traffic through the coordinator: updates (many of one shard's next rows),
    inserts, deletes, and keys moved across shards (a delete and an insert in one transaction,
    since Citus does not update a distribution column)."""

    def __init__(self, coordinator_node):
        super().__init__(daemon=True)
        self.node, self.stop_event, self.errors, self.ops = coordinator_node, threading.Event(), [], 0

    def run(self):
        rng, fresh = random.Random(7), iter(range(1, 10 * ROWS, 2))
        try:
            with self.node.connect() as conn:
                while not self.stop_event.is_set():
                    self.ops += 1
                    dice, target = rng.random(), 2 * rng.randint(1, ROWS)
                    if dice < 0.6:
                        conn.execute("UPDATE orders SET v = v + 1 WHERE id = %s", [target])
                    elif dice < 0.75:
                        conn.execute("INSERT INTO orders (id, payload) VALUES (%s, 'inserted')", [next(fresh)])
                    elif dice < 0.85:
                        conn.execute("DELETE FROM orders WHERE id = %s", [target])
                    else:
                        with conn.transaction():
                            row = conn.execute("DELETE FROM orders WHERE id = %s RETURNING v, payload",
                                               [target]).fetchone()
                            if row:
                                conn.execute("INSERT INTO orders VALUES (%s, %s, %s)", [next(fresh), row[0] + 1, row[1]])
        except Exception as e:  # a writer must never fail because of the backfill
            self.errors.append(repr(e))

    def stop(self):
        self.stop_event.set()
        self.join(30)


def create_slots(citus, slot="cdc", workers=None):
    for worker in workers or citus[1:]:
        with worker.connect() as conn:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])


def caught_up(stream, worker):
    with worker.connect() as conn:
        return stream.received_lsn >= lsn_number(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])


def lsn_number(text):
    high, low = text.split("/")
    return (int(high, 16) << 32) + int(low, 16)


def test_distributed_backfill_is_an_exact_ordered_copy_in_each_nodes_stream_under_writes(citus, orders):
    create_slots(citus)
    streams = [PgOutputStream(worker, "cdc") for worker in citus[1:]]
    for stream in streams:
        stream.start()
    writers = Writers(citus[0])
    writers.start()
    try:
        backfill_id = orders.execute(
            "SELECT backfill_start('orders', confirm => true, slot => 'cdc', batch_size => 100, rows_per_second => 4000)"
        ).fetchone()[0]
        # The coordinator shows the rate of the whole while it runs.
        wait_for(lambda: orders.execute("SELECT rows_per_second_last_minute > 0 FROM backfill_status WHERE id = %s",
                                        [backfill_id]).fetchone()[0], what="the rate of the whole")
        assert wait_until_ended(orders, backfill_id) == "done"
    finally:
        writers.stop()
    for stream, worker in zip(streams, citus[1:]):
        wait_for(lambda: caught_up(stream, worker), what="each consumer to reach its node's last WAL")
        stream.stop()
    assert writers.errors == [] and all(s.errors == [] for s in streams), (writers.errors, [s.errors for s in streams])
    assert writers.ops > 300, "the writers barely ran: the scenario proves nothing"

    placed, copy = shards_by_node(citus), {}
    for stream, worker in zip(streams, citus[1:]):
        state, violations, reads = replay(stream.events)
        assert violations == []
        # Each node's reads are of its own shards, named as Citus names their changes.
        assert {(m["schema"], m["table"]) for m in reads} == {("public", "orders")}
        assert {m["shard"] for m in reads} == placed[worker.port]
        assert len({m["data"]["id"] for m in reads}) == len(reads), "a row was read twice"
        assert not copy.keys() & state.keys(), "a key in two nodes' streams"
        copy.update(state)
    source = {row[0]: (row[1], row[2]) for row in orders.execute("SELECT id, v, payload FROM orders")}
    assert copy == source

    # The coordinator shows the whole: one backfill, a row per shard, every row counted.
    shards = orders.execute(
        "SELECT shard_id, node_port, state, rows_done FROM backfill_shards WHERE backfill_id = %s", [backfill_id]
    ).fetchall()
    assert {(s[0], s[1]) for s in shards} == {(shard, port) for port, ids in placed.items() for shard in ids}
    assert all(s[2] == "done" for s in shards)
    reads = sum(len(replay(s.events)[2]) for s in streams)
    assert sum(s[3] for s in shards) == reads
    assert orders.execute("SELECT rows_done FROM backfill_status WHERE id = %s", [backfill_id]).fetchone()[0] == reads


def test_a_node_without_the_slot_is_refused_at_start_naming_it_and_nothing_starts(citus, orders):
    create_slots(citus, workers=citus[1:2])
    before = orders.execute("SELECT count(*) FROM backfill_status").fetchone()[0]
    on_nodes = [w.connect().execute("SELECT count(*) FROM backfill_status").fetchone()[0] for w in citus[1:]]
    e = error_of(orders, "SELECT backfill_start('orders', confirm => true, slot => 'cdc')")
    assert e.sqlstate == "42704", e
    assert str(citus[2].port) in e.diag.message_primary and "cdc" in e.diag.message_primary
    assert "pg_create_logical_replication_slot" in e.diag.message_hint
    # Every node checked first: none started anything, not even one cancelled at once.
    assert [w.connect().execute("SELECT count(*) FROM backfill_status").fetchone()[0] for w in citus[1:]] == on_nodes
    assert orders.execute("SELECT count(*) FROM backfill_status").fetchone()[0] == before


def test_cancel_pause_and_resume_on_the_coordinator_reach_every_node(citus, orders):
    backfill_id = orders.execute(
        "SELECT backfill_start('orders', confirm => true, batch_size => 100, rows_per_second => 200)"
    ).fetchone()[0]
    node_ids = orders.execute(
        "SELECT DISTINCT node_port, node_backfill_id FROM backfill_shards WHERE backfill_id = %s", [backfill_id]
    ).fetchall()
    assert {port for port, _ in node_ids} == {w.port for w in citus[1:]}

    def node_states():
        states = set()
        for port, node_id in node_ids:
            with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres") as conn:
                states.add(conn.execute("SELECT state FROM backfill_status WHERE id = %s", [node_id]).fetchone()[0])
        return states

    assert node_states() == {"running"}
    orders.execute("SELECT backfill_pause(%s)", [backfill_id])
    assert node_states() == {"paused"}
    orders.execute("SELECT backfill_set(%s, rows_per_second => 2147483647)", [backfill_id])  # shared, no overflow
    orders.execute("SELECT backfill_set(%s, rows_per_second => 1000)", [backfill_id])
    orders.execute("SELECT backfill_resume(%s)", [backfill_id])
    assert node_states() == {"running"}
    wait_for(lambda: orders.execute("SELECT rows_done > 0 FROM backfill_status WHERE id = %s",
                                    [backfill_id]).fetchone()[0], what="progress seen on the coordinator")
    orders.execute("SELECT backfill_cancel(%s)", [backfill_id])
    assert node_states() == {"cancelled"}
    assert orders.execute("SELECT state FROM backfill_status WHERE id = %s", [backfill_id]).fetchone()[0] == "cancelled"


def test_a_distributed_table_is_backfilled_from_the_coordinator_only_and_alone(citus, orders):
    orders.execute("CREATE TABLE plain_t (id int PRIMARY KEY)")
    try:
        e = error_of(orders, "SELECT backfill_start(ARRAY['orders', 'plain_t']::regclass[], confirm => true)")
        assert e.sqlstate == "0A000" and "alone" in e.diag.message_primary
        with citus[1].connect() as worker:
            e = error_of(worker, "SELECT backfill_start('orders', confirm => true)")
            assert e.sqlstate == "0A000" and "coordinator" in e.diag.message_primary
        orders.execute("CREATE TABLE ref_t (id int PRIMARY KEY); SELECT create_reference_table('ref_t')")
        with citus[1].connect() as worker:
            e = error_of(worker, "SELECT backfill_start('ref_t', confirm => true)")
            assert e.sqlstate == "0A000" and "reference table" in e.diag.message_primary
    finally:
        orders.execute("DROP TABLE IF EXISTS plain_t, ref_t")


def test_a_role_acts_on_the_nodes_as_itself(citus, orders):
    """The coordinator starts nothing on a node that the calling role could not start there itself,
    and takes no connection string or password: the node checks the role's grants and attributes,
    and the coordinator passes the node's SQLSTATE on, naming the node."""
    create_slots(citus)
    orders.execute("DROP ROLE IF EXISTS citus_app; CREATE ROLE citus_app LOGIN; GRANT SELECT, UPDATE ON orders TO citus_app;")
    grants = readme_grants("operator", "citus_app")
    orders.execute(grants)  # on the coordinator only, first
    try:
        with psycopg.connect(host="127.0.0.1", port=citus[0].port, user="citus_app", dbname="postgres",
                             autocommit=True) as app:
            e = error_of(app, "SELECT backfill_start('orders'::regclass, confirm => true)")
            assert e.sqlstate == "42501", e
            assert "worker node 127.0.0.1:" in e.diag.message_primary and "backfill_start" in e.diag.message_primary
            assert "every node" in e.diag.message_hint
            # docs/citus.md: the same grants on every worker node.
            orders.execute("SELECT run_command_on_workers(%s)", [grants])
            e = error_of(app, "SELECT backfill_start('orders'::regclass, confirm => true, slot => 'cdc')")
            assert e.sqlstate == "42501" and "replication slot" in e.diag.message_primary, e
            for worker in citus[1:]:
                with worker.connect() as conn:
                    assert conn.execute("SELECT count(*) FROM backfill_status WHERE started_by = 'citus_app'"
                                        ).fetchone()[0] == 0
            backfill_id = app.execute("SELECT backfill_start('orders'::regclass, confirm => true)").fetchone()[0]
            for worker in citus[1:]:
                with worker.connect() as conn:
                    assert conn.execute("SELECT started_by FROM backfill_status WHERE state <> 'cancelled' "
                                        "ORDER BY id DESC LIMIT 1").fetchone()[0] == "citus_app"
            assert wait_until_ended(app, backfill_id) == "done"
            # The role sees its own backfill's shards, and no other role's.
            seen = app.execute("SELECT DISTINCT backfill_id FROM backfill_shards").fetchall()
            assert seen == [(backfill_id,)], seen
    finally:
        for id_, in orders.execute("SELECT id FROM backfill_status WHERE state = 'running'").fetchall():
            orders.execute("SELECT backfill_cancel(%s)", [id_])
        orders.execute("SELECT run_command_on_workers('DROP OWNED BY citus_app')")
        orders.execute("DROP OWNED BY citus_app; DROP ROLE citus_app")


def node_stream(worker, slot="trail", publication="orders_pub"):
    """Everything a slot created before the backfill holds, decoded as pgoutput (what a consumer
    reconnecting after the node's restart would receive), in the node's order."""
    stream = PgOutputStream(worker, slot)
    with worker.connect() as conn:
        rows = conn.execute(
            "SELECT data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, 'proto_version', '1', "
            "'publication_names', %s, 'messages', 'true')", [slot, publication]
        ).fetchall()
    for data, in rows:
        stream.decode(bytes(data))
    return stream.events


def reads_of(events):
    return [e[2] for e in events if e[0] == "M" and e[1] == "backfill" and e[2]["op"] == "read"]


def assert_every_row_read_once(citus, orders, streams):
    ids = [m["data"]["id"] for events in streams for m in reads_of(events)]
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} rows read twice"
    assert set(ids) == {row[0] for row in orders.execute("SELECT id FROM orders")}


def node_backfill(orders, backfill_id, port):
    return orders.execute("SELECT DISTINCT node_backfill_id FROM backfill_shards WHERE backfill_id = %s AND node_port = %s",
                          [backfill_id, port]).fetchone()[0]


def test_killed_node_workers_and_a_node_restart_deliver_every_row_once(citus, orders):
    """A node's backfill worker killed mid-page restarts from its cursor; a worker node restarted
    mid-run resumes its backfill (pg_backfill is preloaded there) while the coordinator shows it
    unreachable, then done."""
    create_slots(citus, slot="trail")
    backfill_id = orders.execute(
        "SELECT backfill_start('orders', confirm => true, batch_size => 100, rows_per_second => 3000)"
    ).fetchone()[0]
    first, second = citus[1], citus[2]
    first_id = node_backfill(orders, backfill_id, first.port)
    with first.connect() as conn:
        for _ in range(2):
            wait_for(lambda: conn.execute("SELECT rows_done > 0 FROM backfill_status WHERE id = %s",
                                          [first_id]).fetchone()[0], what="the node's backfill to deliver")
            pid = wait_for(lambda: conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", [f"pg_backfill {first_id}"]
            ).fetchone(), what="the node's worker")[0]
            conn.execute("SELECT pg_catalog.pg_terminate_backend(%s::integer)", [pid])
            time.sleep(0.5)
    wait_for(lambda: orders.execute("SELECT bool_and(rows_done > 0) FROM backfill_shards WHERE backfill_id = %s "
                                    "AND node_port = %s", [backfill_id, second.port]).fetchone()[0],
             what="progress on the second node")
    second.pg_ctl("restart", "-m", "fast")
    assert wait_until_ended(orders, backfill_id) == "done"
    assert_every_row_read_once(citus, orders, [node_stream(worker) for worker in citus[1:]])


@pytest.mark.parametrize("event", ["move", "split", "drain"])
def test_a_shard_moved_or_split_mid_run_fails_the_backfill_saying_how_to_start_again(citus, orders, event):
    """A shard move, a split, and the drain that must come before citus_remove_node (and what
    citus_rebalance_start does: moves)."""
    backfill_id = orders.execute(
        "SELECT backfill_start('orders', confirm => true, batch_size => 100, rows_per_second => 400)"
    ).fetchone()[0]
    source, target = citus[1], citus[2]
    wait_for(lambda: orders.execute("SELECT rows_done > 0 FROM backfill_status WHERE id = %s",
                                    [backfill_id]).fetchone()[0], what="progress")
    shard = orders.execute(
        "SELECT shard_id FROM backfill_shards WHERE backfill_id = %s AND node_port = %s ORDER BY position DESC LIMIT 1",
        [backfill_id, source.port],
    ).fetchone()[0]
    if event == "move":
        orders.execute(
            "SELECT citus_move_shard_placement(%s, '127.0.0.1', %s, '127.0.0.1', %s, shard_transfer_mode => 'block_writes')",
            [shard, source.port, target.port],
        )
    elif event == "drain":  # every shard of the node moves away, as before removing it
        orders.execute("SELECT citus_drain_node('127.0.0.1', %s, shard_transfer_mode => 'block_writes')", [source.port])
        orders.execute("SELECT citus_set_node_property('127.0.0.1', %s, 'shouldhaveshards', true)", [source.port])
    else:  # in two, one half on each node
        orders.execute(
            """SELECT citus_split_shard_by_split_points(
                          s.shardid, ARRAY[((s.shardminvalue::bigint + s.shardmaxvalue::bigint) / 2)::text],
                          ARRAY[(SELECT nodeid FROM pg_dist_node WHERE nodeport = %s),
                                (SELECT nodeid FROM pg_dist_node WHERE nodeport = %s)],
                          shard_transfer_mode => 'block_writes')
                 FROM pg_dist_shard s WHERE s.shardid = %s""",
            [source.port, target.port, shard],
        )
    assert wait_until_ended(orders, backfill_id) == "failed"
    error = orders.execute("SELECT last_error FROM backfill_status WHERE id = %s", [backfill_id]).fetchone()[0]
    moved = shard if event != "drain" else int(error.split()[1])  # a drain moves them all: the first one found
    assert f"shard {moved} (public.orders_{moved}) moved away from worker node 127.0.0.1:{source.port}" in error, error
    e = error_of(orders, "SELECT backfill_wait(%s)" % backfill_id)
    assert e.sqlstate == "55000"
    # Started again once the shard event is over, it delivers every row from the shards' homes
    # now, each once.
    orders.execute("SELECT pg_create_logical_replication_slot('trail', 'pgoutput')")
    for worker in citus[1:]:
        with worker.connect() as conn:
            conn.execute("SELECT pg_create_logical_replication_slot('trail', 'pgoutput')")
    again = orders.execute("SELECT backfill_start('orders', confirm => true)").fetchone()[0]
    assert wait_until_ended(orders, again) == "done"
    assert_every_row_read_once(citus, orders, [node_stream(worker) for worker in citus[1:]])
    assert reads_of(node_stream(citus[0])) == []
    orders.execute("SELECT pg_drop_replication_slot('trail')")


def test_a_node_down_at_start_is_a_clear_error(citus, orders):
    down = citus[2]
    down.pg_ctl("stop", "-m", "fast")
    try:
        e = error_of(orders, "SELECT backfill_start('orders', confirm => true)")
        assert e.sqlstate == "08006", e
        assert f"worker node 127.0.0.1:{down.port}" in e.diag.message_primary
    finally:
        down.pg_ctl("start")
    with citus[1].connect() as conn:
        assert conn.execute("SELECT count(*) FROM backfill_status WHERE state = 'running'").fetchone()[0] == 0


def test_a_reference_table_is_backfilled_once_in_the_coordinators_stream(citus, orders):
    """Citus's change data capture emits a reference table's changes from the coordinator only:
    its reads are written there, from the coordinator's placement, and on no worker node."""
    orders.execute(
        """CREATE TABLE ref_t (id int PRIMARY KEY, v int NOT NULL);
           SELECT create_reference_table('ref_t');
           INSERT INTO ref_t SELECT g, 0 FROM generate_series(1, 1000) g;
           CREATE PUBLICATION ref_pub FOR TABLE ref_t;"""
    )
    try:
        create_slots(citus, slot="trail", workers=citus)
        backfill_id = orders.execute("SELECT backfill_start('ref_t', confirm => true, batch_size => 100)").fetchone()[0]
        orders.execute("UPDATE ref_t SET v = 1 WHERE id % 10 = 0")
        assert wait_until_ended(orders, backfill_id) == "done"
        events = node_stream(citus[0], publication="ref_pub")
        reads = reads_of(events)
        assert sorted(m["data"]["id"] for m in reads) == list(range(1, 1001))
        placement = orders.execute("SELECT shardid FROM pg_dist_shard WHERE logicalrelid = 'ref_t'::regclass").fetchone()[0]
        assert {(m["table"], m["shard"]) for m in reads} == {("ref_t", placement)}
        # Applied in the coordinator's stream order (reads as upserts), it is the table.
        copy = {}
        for event in events:
            if event[0] == "M" and event[1] == "backfill" and event[2]["op"] == "read":
                copy[event[2]["data"]["id"]] = event[2]["data"]["v"]
            elif event[0] == "U" and event[1] == "ref_t":
                copy[int(event[2]["id"])] = int(event[2]["v"])
        assert copy == dict(orders.execute("SELECT id, v FROM ref_t").fetchall())
        for worker in citus[1:]:
            assert reads_of(node_stream(worker)) == []
    finally:
        orders.execute("DROP PUBLICATION IF EXISTS ref_pub; DROP TABLE IF EXISTS ref_t")
        with citus[0].connect() as conn:
            conn.execute("SELECT pg_drop_replication_slot('trail')")


def test_estimate_of_a_distributed_table_adds_up_its_nodes(citus, orders):
    orders.execute("ANALYZE orders")
    row = orders.execute(
        "SELECT eligible, key_columns, rows_estimated, pages FROM backfill_estimate('orders', batch_size => 100)"
    ).fetchone()
    assert row[0] is True and row[1] == ["id"]
    assert abs(row[2] - ROWS) <= ROWS // 10, row
    assert row[3] >= ROWS // 100


@pytest.mark.parametrize("option", ["keys => '[{\"id\": 2}]'", "max_replica_lag => 1000000",
                                    "max_retained_wal => 1000000", "max_active_sessions => 10",
                                    "rows_per_message => 100"])
def test_options_the_nodes_are_not_given_are_refused_before_anything_starts(citus, orders, option):
    e = error_of(orders, f"SELECT backfill_start('orders', confirm => true, {option})")
    assert e.sqlstate == "0A000" and "distributed table orders" in e.diag.message_primary, e
    for worker in citus[1:]:
        with worker.connect() as conn:
            assert conn.execute("SELECT count(*) FROM backfill_status WHERE state = 'running'").fetchone()[0] == 0


def test_a_table_named_like_a_shard_is_not_one(citus, orders):
    """A role that may create tables names one as a shard of orders, on the coordinator (which
    holds no placement of it): its backfill's messages name it as itself, never as orders."""
    shard = orders.execute("SELECT min(shardid) FROM pg_dist_shard WHERE logicalrelid = 'orders'::regclass").fetchone()[0]
    orders.execute(f"CREATE TABLE public.orders_{shard} (id bigint PRIMARY KEY, v int, payload text)")
    try:
        # (Citus itself takes it for the shard by its name, and refuses writes without this.)
        orders.execute("SET citus.enable_manual_changes_to_shards = on")
        orders.execute(f"INSERT INTO orders_{shard} VALUES (2, 99, 'forged')")
        orders.execute("SELECT pg_create_logical_replication_slot('trail', 'pgoutput')")
        backfill_id = orders.execute(f"SELECT backfill_start('orders_{shard}', confirm => true)").fetchone()[0]
        assert wait_until_ended(orders, backfill_id) == "done"
        reads = reads_of(node_stream(citus[0]))
        assert [(m["table"], "shard" in m) for m in reads] == [(f"orders_{shard}", False)]
    finally:
        orders.execute("SET citus.enable_manual_changes_to_shards = on")
        orders.execute(f"DROP TABLE IF EXISTS public.orders_{shard}")
        orders.execute("RESET citus.enable_manual_changes_to_shards")
        orders.execute("SELECT pg_drop_replication_slot('trail') FROM pg_replication_slots WHERE slot_name = 'trail'")


def test_checksum_of_a_distributed_table_is_that_of_its_rows_in_one_table_and_finds_a_node_s_divergence(citus, orders):
    """backfill_checksum() on the coordinator sums each shard on its node over the same ranges and
    adds them up: the same rows and sums as the same rows in one plain table. A row changed on one
    node behind Citus's back shows in its range, and only there."""
    orders.execute("CREATE TABLE plain_copy AS SELECT * FROM orders; ALTER TABLE plain_copy ADD PRIMARY KEY (id)")
    try:
        for level in ("hash", "count"):
            distributed = orders.execute(
                "SELECT range, lower, upper, rows, checksum FROM backfill_checksum('orders', 8, %s)", [level]
            ).fetchall()
            assert len(distributed) == 8 and sum(r[3] for r in distributed) == ROWS
            bounds = json.dumps([r[2] for r in distributed if r[2] is not None])
            plain = orders.execute(
                "SELECT range, lower, upper, rows, checksum FROM backfill_checksum('plain_copy', level => %s, bounds => %s)",
                [level, bounds],
            ).fetchall()
            assert distributed == plain, level
        # A divergence on one node: its range's checksum differs, the others agree.
        shard, port = orders.execute(
            "SELECT shardid, nodeport FROM citus_shards WHERE table_name = 'orders'::regclass ORDER BY shardid LIMIT 1"
        ).fetchone()
        with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres", autocommit=True) as node:
            node.execute("SET citus.enable_manual_changes_to_shards = on")
            changed = node.execute(f"UPDATE orders_{shard} SET v = v + 1 WHERE id = (SELECT min(id) FROM orders_{shard}) "
                                   "RETURNING id").fetchone()[0]
        distributed = orders.execute("SELECT range, lower, upper, rows, checksum FROM backfill_checksum('orders', 8)").fetchall()
        bounds = json.dumps([r[2] for r in distributed if r[2] is not None])
        plain = orders.execute("SELECT range, lower, upper, rows, checksum FROM backfill_checksum('plain_copy', bounds => %s)",
                               [bounds]).fetchall()
        differing = [d for d, p in zip(distributed, plain) if d != p]
        assert len(differing) == 1
        lower, upper = differing[0][1], differing[0][2]
        assert (lower is None or lower["id"] <= changed) and (upper is None or changed < upper["id"])

        e = error_of(orders, "SELECT * FROM backfill_checksum('orders', 8, 'aggregate')")
        assert e.sqlstate == "0A000" and "distributed table orders" in e.diag.message_primary
    finally:
        orders.execute("DROP TABLE IF EXISTS plain_copy")


def test_a_coordinator_restart_leaves_the_nodes_running_and_its_worker_follows_them_again(citus, orders):
    """The coordinator's worker only follows the nodes: after a restart (pg_backfill preloaded)
    it is launched again and ends the backfill when the nodes' are done."""
    backfill_id = orders.execute(
        "SELECT backfill_start('orders', confirm => true, batch_size => 100, rows_per_second => 2000)"
    ).fetchone()[0]
    wait_for(lambda: orders.execute("SELECT rows_done > 0 FROM backfill_status WHERE id = %s",
                                    [backfill_id]).fetchone()[0], what="progress")
    citus[0].pg_ctl("restart", "-m", "fast")
    with citus[0].connect() as conn:
        assert wait_until_ended(conn, backfill_id) == "done"
        assert conn.execute("SELECT rows_done FROM backfill_status WHERE id = %s", [backfill_id]).fetchone()[0] == ROWS


def test_a_distributed_table_dropped_mid_run_fails_the_backfill_naming_it(citus, orders):
    backfill_id = orders.execute(
        "SELECT backfill_start('orders', confirm => true, batch_size => 100, rows_per_second => 400)"
    ).fetchone()[0]
    wait_for(lambda: orders.execute("SELECT rows_done > 0 FROM backfill_status WHERE id = %s",
                                    [backfill_id]).fetchone()[0], what="progress")
    orders.execute("DROP PUBLICATION orders_pub; DROP TABLE orders")
    assert wait_until_ended(orders, backfill_id) == "failed"
    sqlstate, error = orders.execute("SELECT last_error_sqlstate, last_error FROM backfill_status WHERE id = %s",
                                     [backfill_id]).fetchone()
    assert sqlstate == "42P01" and "was dropped during its backfill" in error, (sqlstate, error)
    for worker in citus[1:]:
        with worker.connect() as conn:
            assert conn.execute("SELECT count(*) FROM backfill_status WHERE state IN ('running', 'paused')"
                                ).fetchone()[0] == 0


def test_the_new_functions_take_null(citus, orders):
    reply = orders.execute(
        "SELECT backfill.start_on_node(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)").fetchone()[0]
    assert reply["sqlstate"] in ("22004", "22023"), reply
    e = error_of(orders, "SELECT * FROM backfill_checksum(NULL::regclass)")
    assert e.sqlstate == "22004", e
    assert orders.execute("SELECT count(*) FROM backfill_shards WHERE backfill_id IS NULL").fetchone()[0] == 0


def on_node(port):
    return psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres", autocommit=True)


def compared(conn, source, target, **options):
    arguments = "".join(f", {name} => %({name})s" for name in options)
    return {key["id"]: status for key, status in conn.execute(
        f"SELECT key, status FROM backfill_compare('{source}', '{target}'{arguments})", options).fetchall()}


def test_compare_of_a_distributed_table_finds_its_nodes_differences_as_for_one_table(citus, orders):
    """backfill_compare() on the coordinator: ranges summed on the nodes, the differing ones
    narrowed to keys through Citus. Rows changed on both nodes behind Citus's back, and one
    written through it, get the verdicts the same rows in one plain table get, either way round."""
    orders.execute("CREATE TABLE copy AS SELECT * FROM orders; ALTER TABLE copy ADD PRIMARY KEY (id)")
    try:
        shards = orders.execute("SELECT shardid, nodeport FROM citus_shards WHERE table_name = 'orders'::regclass "
                                "ORDER BY shardid").fetchall()
        (first, first_port), (other, other_port) = shards[0], next(s for s in shards if s[1] != shards[0][1])
        with on_node(first_port) as node:
            node.execute("SET citus.enable_manual_changes_to_shards = on")
            changed = node.execute(f"UPDATE orders_{first} SET v = v + 1 WHERE id = (SELECT min(id) FROM orders_{first}) "
                                   "RETURNING id").fetchone()[0]
        with on_node(other_port) as node:
            node.execute("SET citus.enable_manual_changes_to_shards = on")
            deleted = node.execute(f"DELETE FROM orders_{other} WHERE id = (SELECT max(id) FROM orders_{other}) "
                                   "RETURNING id").fetchone()[0]
        orders.execute("INSERT INTO orders VALUES (1, 0, 'new')")
        expected = {changed: "different", deleted: "extra", 1: "missing"}
        assert compared(orders, "orders", "copy") == expected

        orders.execute("CREATE TABLE plain AS SELECT * FROM orders; ALTER TABLE plain ADD PRIMARY KEY (id)")
        assert compared(orders, "plain", "copy") == expected
        assert compared(orders, "copy", "orders") == {changed: "different", deleted: "missing", 1: "extra"}
        # The count level sees rows, not their contents.
        assert compared(orders, "orders", "copy", level="count") == {deleted: "extra", 1: "missing"}
        e = error_of(orders, "SELECT * FROM backfill_compare('orders', 'copy', level => 'aggregate')")
        assert e.sqlstate == "0A000" and "distributed table" in e.diag.message_primary, e
    finally:
        orders.execute("DROP TABLE IF EXISTS copy, plain")


def test_compare_with_a_slot_waits_for_every_nodes_consumer_and_refuses_a_node_without_it(citus, orders):
    orders.execute("CREATE TABLE copy AS SELECT * FROM orders; ALTER TABLE copy ADD PRIMARY KEY (id)")
    try:
        create_slots(citus, workers=citus[1:2])
        e = error_of(orders, "SELECT * FROM backfill_compare('orders', 'copy', slot => 'cdc')")
        assert e.sqlstate == "42704", e
        assert f"worker node 127.0.0.1:{citus[2].port}" in e.diag.message_primary and "cdc" in e.diag.message_primary
        assert "pg_create_logical_replication_slot('cdc'" in e.diag.message_hint
        create_slots(citus, workers=citus[2:])
        streams = [PgOutputStream(worker, "cdc") for worker in citus[1:]]
        for stream in streams:
            stream.start()
        try:
            orders.execute("DELETE FROM copy WHERE id = 2")
            # Each pass waits until every node's consumer has confirmed that node's position: with
            # consumers that confirm, a real difference is settled, not "unsettled".
            assert compared(orders, "orders", "copy", slot="cdc", passes=2) == {2: "missing"}
            confirmed = [on_node(w.port).execute("SELECT confirmed_flush_lsn IS NOT NULL FROM pg_replication_slots "
                                                 "WHERE slot_name = 'cdc'").fetchone()[0] for w in citus[1:]]
            assert confirmed == [True, True]
        finally:
            for stream in streams:
                stream.stop()
        assert all(s.errors == [] for s in streams), [s.errors for s in streams]
    finally:
        orders.execute("DROP TABLE IF EXISTS copy")


def test_repair_of_a_distributed_table_redelivers_each_differing_key_in_its_nodes_stream_once(citus, orders):
    """backfill_repair() on the coordinator starts a keyed backfill on each node that holds a
    differing key, of those shards only: each key is read (or said absent) once, in the stream of
    the node that holds its shard, and the copy they repair agrees with the table."""
    create_slots(citus)
    streams = [PgOutputStream(worker, "cdc") for worker in citus[1:]]
    for stream in streams:
        stream.start()
    orders.execute("CREATE TABLE copy AS SELECT * FROM orders; ALTER TABLE copy ADD PRIMARY KEY (id)")
    try:
        # Differences in one shard of each node: the other shards are not backfilled.
        chosen = [min(shards) for shards in shards_by_node(citus).values()]
        in_chosen = orders.execute(
            "SELECT id FROM orders WHERE get_shard_id_for_distribution_column('orders', id) = ANY(%s) "
            "ORDER BY id LIMIT 10", [chosen]).fetchall()
        missing, changed = [r[0] for r in in_chosen[:8]], in_chosen[8][0]
        extra = next(i for i in range(1, 1000, 2) if orders.execute(
            "SELECT get_shard_id_for_distribution_column('orders', %s::bigint) = ANY(%s)", [i, chosen]).fetchone()[0])
        orders.execute("DELETE FROM copy WHERE id = ANY(%s)", [missing])
        orders.execute("UPDATE copy SET v = 99 WHERE id = %s", [changed])
        orders.execute("INSERT INTO copy VALUES (%s, 0, 'extra')", [extra])
        differing = {**{i: "missing" for i in missing}, changed: "different", extra: "extra"}
        shard_of = {i: orders.execute("SELECT get_shard_id_for_distribution_column('orders', %s::bigint)",
                                      [i]).fetchone()[0] for i in differing}
        assert set(shard_of.values()) == set(chosen)
        backfill_id = orders.execute(
            "SELECT backfill_repair('orders', 'copy', confirm => true, slot => 'cdc')").fetchone()[0]
        assert wait_until_ended(orders, backfill_id) == "done"
        shards = orders.execute("SELECT shard_id, node_port, rows_estimated FROM backfill_shards WHERE backfill_id = %s",
                                [backfill_id]).fetchall()
        assert {s[0] for s in shards} == set(shard_of.values())
        assert sum(s[2] for s in shards) == len(differing)
        for stream, worker in zip(streams, citus[1:]):
            wait_for(lambda: caught_up(stream, worker), what="each consumer to reach its node's last WAL")
    finally:
        for stream in streams:
            stream.stop()
    try:
        assert all(s.errors == [] for s in streams), [s.errors for s in streams]
        placed, delivered = shards_by_node(citus), []
        for stream, worker in zip(streams, citus[1:]):
            messages = [e[2] for e in stream.events if e[0] == "M" and e[1] == "backfill"
                        and e[2]["op"] in ("read", "absent")]
            for m in messages:
                assert (m["schema"], m["table"]) == ("public", "orders")
                key = (m.get("data") or m.get("key"))["id"]
                assert shard_of[key] in placed[worker.port], f"key {key} delivered by another node"
                delivered.append((key, m["op"]))
                if m["op"] == "read":
                    orders.execute("INSERT INTO copy VALUES (%(id)s, %(v)s, %(payload)s) ON CONFLICT (id) DO UPDATE "
                                   "SET v = excluded.v, payload = excluded.payload", m["data"])
                else:
                    orders.execute("DELETE FROM copy WHERE id = %s", [key])
        assert sorted(delivered) == sorted((i, "absent" if s == "extra" else "read") for i, s in differing.items())
        assert compared(orders, "orders", "copy") == {}
    finally:
        orders.execute("DROP TABLE IF EXISTS copy")


def connect_as(node, role):
    return psycopg.connect(host="127.0.0.1", port=node.port, user=role, dbname="postgres", autocommit=True)


def on_every_node(orders, sql):
    orders.execute(sql)
    orders.execute("SELECT run_command_on_workers(%s)", [sql])


def backfills_everywhere(citus):
    counts = []
    for node in citus:
        with node.connect() as conn:
            counts.append(conn.execute("SELECT count(*) FROM backfill.job").fetchone()[0])
    return counts


def test_hostile_roles_against_a_distributed_table(citus, orders):
    """The security tests' rights, on the coordinator of a Citus cluster: a role without grants,
    and an operator (docs/security.md's grants, on every node) without rights on the table, start,
    check and repair nothing, anywhere; SELECT alone checks and compares but starts nothing; and an
    operator sees and stops none of a superuser's distributed backfill."""
    orders.execute("CREATE TABLE copy AS SELECT * FROM orders; ALTER TABLE copy ADD PRIMARY KEY (id)")
    orders.execute("DROP ROLE IF EXISTS citus_nobody; CREATE ROLE citus_nobody LOGIN")
    orders.execute("DROP ROLE IF EXISTS citus_op; CREATE ROLE citus_op LOGIN")
    on_every_node(orders, readme_grants("operator", "citus_op"))
    orders.execute("GRANT SELECT ON copy TO citus_op")
    statements = [
        "SELECT backfill_start('orders', confirm => true)",
        "SELECT * FROM backfill_checksum('orders')",
        "SELECT * FROM backfill_compare('orders', 'copy')",
        "SELECT backfill_repair('orders', 'copy', confirm => true)",
    ]
    try:
        before = backfills_everywhere(citus)
        with connect_as(citus[0], "citus_nobody") as nobody, connect_as(citus[0], "citus_op") as op:
            for sql in statements:
                e = error_of(nobody, sql)
                assert e.sqlstate == "42501", (sql, e)
                e = error_of(op, sql)
                assert e.sqlstate == "42501" and "orders" in str(e), (sql, e)
            assert backfills_everywhere(citus) == before, "a refused call started something on a node"

            # SELECT (Citus grants it on the shards too): it checks and compares, starts nothing.
            orders.execute("GRANT SELECT ON orders TO citus_op")
            assert op.execute("SELECT sum(rows) FROM backfill_checksum('orders', 4)").fetchone()[0] == ROWS
            assert compared(op, "orders", "copy") == {}
            e = error_of(op, "SELECT backfill_start('orders', confirm => true)")
            assert e.sqlstate == "42501" and "orders" in e.diag.message_primary, e
            assert backfills_everywhere(citus) == before

            # A superuser's distributed backfill: invisible to the operator, and not its to stop.
            backfill_id = orders.execute(
                "SELECT backfill_start('orders', confirm => true, rows_per_second => 2000)").fetchone()[0]
            assert op.execute("SELECT count(*) FROM backfill_status WHERE id = %s", [backfill_id]).fetchone()[0] == 0
            assert op.execute("SELECT count(*) FROM backfill_shards WHERE backfill_id = %s",
                              [backfill_id]).fetchone()[0] == 0
            e = error_of(op, "SELECT backfill_cancel(%s)", [backfill_id])
            assert e.sqlstate in ("42501", "42704"), e
            for worker in citus[1:]:
                with worker.connect() as conn:
                    state = conn.execute("SELECT state FROM backfill_status WHERE id = %s",
                                         [node_backfill(orders, backfill_id, worker.port)]).fetchone()[0]
                    assert state in ("running", "done"), state
            orders.execute("SELECT backfill_cancel(%s)", [backfill_id])
    finally:
        orders.execute("DROP TABLE IF EXISTS copy")
        for role in ("citus_op", "citus_nobody"):
            on_every_node(orders, f"DROP OWNED BY {role}")
            orders.execute(f"DROP ROLE {role}")


def test_a_distributed_tables_own_code_runs_as_its_owner_never_as_superuser(citus, orders):
    """A table owner's cast to json of its key's type, on the coordinator and on the nodes: a
    superuser's checksum, comparison and backfill of the distributed table run it as the owner,
    so it cannot make the owner superuser on any node."""
    orders.execute("DROP ROLE IF EXISTS citus_atk; CREATE ROLE citus_atk LOGIN")
    on_every_node(orders, "GRANT CREATE ON SCHEMA public TO citus_atk")
    labels = ", ".join(f"'k{i:02}'" for i in range(1, 41))
    escalate = "BEGIN EXECUTE 'ALTER ROLE citus_atk SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;"
    try:
        with connect_as(citus[0], "citus_atk") as atk:
            atk.execute(f"""CREATE TYPE atk_key AS ENUM ({labels});
                CREATE FUNCTION atk_key_json(atk_key) RETURNS json LANGUAGE plpgsql AS $$
                BEGIN {escalate} RETURN pg_catalog.to_json($1::text); END $$;
                CREATE TABLE atk_d (k atk_key PRIMARY KEY, v int);
                SELECT create_distributed_table('atk_d', 'k', shard_count => 4);
                INSERT INTO atk_d SELECT l, 1 FROM pg_catalog.unnest(enum_range(NULL::atk_key)) l;
                CREATE TABLE atk_copy AS SELECT * FROM atk_d WHERE k <> 'k05';
                ALTER TABLE atk_copy ADD PRIMARY KEY (k);""")
        # (Citus does not pass casts on: the trap is set on every node.)
        on_every_node(orders, "CREATE CAST (atk_key AS json) WITH FUNCTION atk_key_json(atk_key)")

        def superuser_anywhere():
            return [node.connect().execute("SELECT rolsuper FROM pg_roles WHERE rolname = 'citus_atk'").fetchone()[0]
                    for node in citus]

        assert orders.execute("SELECT sum(rows) FROM backfill_checksum('atk_d', 4)").fetchone()[0] == 40
        found = orders.execute("SELECT key->>'k', status FROM backfill_compare('atk_d', 'atk_copy')").fetchall()
        assert found == [("k05", "missing")]
        assert superuser_anywhere() == [False, False, False]
        backfill_id = orders.execute("SELECT backfill_start('atk_d', confirm => true)").fetchone()[0]
        assert wait_until_ended(orders, backfill_id) == "done"
        assert superuser_anywhere() == [False, False, False]
        # The trap is armed: the cast, run by a superuser, does make the owner superuser.
        orders.execute("SELECT to_jsonb('k01'::atk_key)")
        assert superuser_anywhere()[0] is True
    finally:
        orders.execute("ALTER ROLE citus_atk NOSUPERUSER")
        orders.execute("DROP TABLE IF EXISTS atk_d, atk_copy")
        on_every_node(orders, "DROP CAST IF EXISTS (atk_key AS json)")
        orders.execute("DROP FUNCTION IF EXISTS atk_key_json(atk_key); DROP TYPE IF EXISTS atk_key")
        on_every_node(orders, "DROP OWNED BY citus_atk")
        orders.execute("DROP ROLE citus_atk")


def test_citus_local_and_plain_tables_on_the_coordinator_are_backfilled_as_on_one_server(citus, orders):
    """A Citus local table (in Citus's metadata, its rows on the coordinator) and a plain table
    of the coordinator are read there, in the coordinator's stream, under their own names."""
    orders.execute(
        """CREATE TABLE loc_t (id int PRIMARY KEY, v int NOT NULL);
           INSERT INTO loc_t SELECT g, 0 FROM generate_series(1, 500) g;
           SELECT citus_add_local_table_to_metadata('loc_t');
           CREATE TABLE plain_t (id int PRIMARY KEY, v int NOT NULL);
           INSERT INTO plain_t SELECT g, 0 FROM generate_series(1, 300) g;
           CREATE PUBLICATION local_pub FOR TABLE loc_t, plain_t;"""
    )
    try:
        assert orders.execute("SELECT citus_table_type FROM citus_tables WHERE table_name = 'loc_t'::regclass"
                              ).fetchone()[0] == "local"
        create_slots(citus, slot="trail", workers=citus)
        backfill_id = orders.execute(
            "SELECT backfill_start(ARRAY['loc_t', 'plain_t']::regclass[], confirm => true, batch_size => 100)"
        ).fetchone()[0]
        assert wait_until_ended(orders, backfill_id) == "done"
        reads = reads_of(node_stream(citus[0], publication="local_pub"))
        by_table = {}
        for m in reads:
            by_table.setdefault(m["table"], []).append(m["data"]["id"])
            assert "shard" not in m
        assert {t: sorted(ids) for t, ids in by_table.items()} == {
            "loc_t": list(range(1, 501)), "plain_t": list(range(1, 301))}
        for worker in citus[1:]:
            assert reads_of(node_stream(worker)) == []
        assert orders.execute("SELECT count(*) FROM backfill_shards WHERE backfill_id = %s",
                              [backfill_id]).fetchone()[0] == 0
    finally:
        orders.execute("DROP PUBLICATION IF EXISTS local_pub; DROP TABLE IF EXISTS loc_t, plain_t")
        with citus[0].connect() as conn:
            conn.execute("SELECT pg_drop_replication_slot('trail')")


def node_state(worker, backfill_id):
    with worker.connect() as conn:
        return conn.execute("SELECT state FROM backfill_status WHERE id = %s", [backfill_id]).fetchone()[0]


def test_a_nodes_backfill_failed_or_cancelled_there_stops_the_others_and_the_whole_stays_controllable(citus, orders):
    """A node's backfill that fails (its slot dropped) fails the coordinator's and pauses the other
    nodes': backfill_cancel on the coordinator then cancels them (0.9.0: they went on, and it
    failed with 55000). A node's backfill cancelled there cancels the coordinator's and the
    others' (0.9.0: they went on)."""
    create_slots(citus)
    failing, other = citus[1], citus[2]
    backfill_id = orders.execute(
        "SELECT backfill_start('orders', confirm => true, slot => 'cdc', batch_size => 100, rows_per_second => 400)"
    ).fetchone()[0]
    ids = {worker.port: node_backfill(orders, backfill_id, worker.port) for worker in citus[1:]}
    with failing.connect() as conn:
        conn.execute("SELECT pg_drop_replication_slot('cdc')")
    assert wait_until_ended(orders, backfill_id) == "failed"
    sqlstate, error = orders.execute("SELECT last_error_sqlstate, last_error FROM backfill_status WHERE id = %s",
                                     [backfill_id]).fetchone()
    assert sqlstate == "42704" and f"on worker node 127.0.0.1:{failing.port} failed" in error, (sqlstate, error)
    wait_for(lambda: node_state(other, ids[other.port]) == "paused", what="the other node's backfill to pause")
    assert orders.execute("SELECT backfill_cancel(%s)", [backfill_id]).fetchone()[0] is True
    assert orders.execute("SELECT state FROM backfill_status WHERE id = %s", [backfill_id]).fetchone()[0] == "cancelled"
    assert (node_state(failing, ids[failing.port]), node_state(other, ids[other.port])) == ("failed", "cancelled")

    again = orders.execute(
        "SELECT backfill_start('orders', confirm => true, batch_size => 100, rows_per_second => 400)").fetchone()[0]
    ids = {worker.port: node_backfill(orders, again, worker.port) for worker in citus[1:]}
    with other.connect() as conn:
        conn.execute("SELECT backfill_cancel(%s)", [ids[other.port]])
    assert wait_until_ended(orders, again) == "cancelled"
    wait_for(lambda: node_state(failing, ids[failing.port]) == "cancelled",
             what="the coordinator to cancel the other node's backfill")


# A node database owner's = and <> for text, in public, each counting its calls.
NODE_PLANT = """
CREATE SEQUENCE public.planted_calls;
GRANT USAGE ON SEQUENCE public.planted_calls TO PUBLIC;
""" + "".join(f"""
CREATE FUNCTION public.planted_{function}(a pg_catalog.text, b pg_catalog.text) RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog AS $$
BEGIN
    PERFORM pg_catalog.nextval('public.planted_calls');
    RAISE LOG 'planted operator ran as % for %', current_user, current_setting('application_name');
    RETURN pg_catalog.{function}(a, b);
END $$;
CREATE OPERATOR public.{op} (LEFTARG = pg_catalog.text, RIGHTARG = pg_catalog.text, FUNCTION = public.planted_{function});
""" for function, op in (("texteq", "="), ("textne", "<>")))


def test_statements_sent_to_the_nodes_resolve_nothing_on_a_node_databases_search_path(citus, orders):
    """A role that may create in public on the worker nodes plants there an = and a <> of its own
    for text, each counting its calls, and the node database's search_path puts public first
    (as its owner may). A superuser's estimate, checksum, start, pause, set, resume and cancel on
    the coordinator, and the coordinator's worker asking the nodes and cancelling on them, run
    neither (0.9.0: backfill_pause sent `state IN ('running')`, whose = was the planted one)."""
    orders.execute("DROP ROLE IF EXISTS citus_planter; CREATE ROLE citus_planter LOGIN")
    on_every_node(orders, "GRANT CREATE ON SCHEMA public TO citus_planter")
    planted = []
    try:
        for worker in citus[1:]:
            with connect_as(worker, "citus_planter") as conn:
                conn.execute("SET citus.enable_ddl_propagation = off")  # (objects of this node only)
                conn.execute(NODE_PLANT)
            with worker.connect() as conn:
                conn.execute("SET citus.enable_ddl_propagation = off; "
                             "ALTER DATABASE postgres SET search_path = public, pg_catalog")
            planted.append(worker)

        def planted_calls():
            calls = []
            for worker in citus[1:]:
                with psycopg.connect(host="127.0.0.1", port=worker.port, user="postgres", dbname="postgres",
                                     options="-c search_path=pg_catalog") as conn:
                    calls.append(conn.execute("SELECT CASE WHEN is_called THEN last_value ELSE 0 END "
                                              "FROM public.planted_calls").fetchone()[0])
            return calls

        orders.execute("SELECT * FROM backfill_estimate('orders')").fetchall()
        orders.execute("SELECT * FROM backfill_checksum('orders', 4)").fetchall()
        backfill_id = orders.execute(
            "SELECT backfill_start('orders', confirm => true, batch_size => 100, rows_per_second => 200)").fetchone()[0]
        for call in ("backfill_pause(%s)", "backfill_set(%s, rows_per_second => 300)", "backfill_resume(%s)",
                     "backfill_cancel(%s)"):
            orders.execute(f"SELECT {call}", [backfill_id])
            assert planted_calls() == [0, 0], call
        # The coordinator's worker: its questions, and its cancel on the other node once one
        # node's backfill is cancelled there.
        again = orders.execute(
            "SELECT backfill_start('orders', confirm => true, batch_size => 100, rows_per_second => 200)").fetchone()[0]
        cancelled_there, other = citus[1], citus[2]
        with cancelled_there.connect() as conn:
            conn.execute("SELECT backfill_cancel(%s)", [node_backfill(orders, again, cancelled_there.port)])
        assert wait_until_ended(orders, again) == "cancelled"
        wait_for(lambda: node_state(other, node_backfill(orders, again, other.port)) == "cancelled",
                 what="the coordinator to cancel the other node's backfill")
        assert planted_calls() == [0, 0]
        # The trap is armed on every node: a superuser's unqualified = runs it.
        for worker in citus[1:]:
            with worker.connect() as conn:
                conn.execute("SELECT 'a'::text = 'b'::text")
        assert planted_calls() == [1, 1]
    finally:
        for worker in planted:
            with worker.connect() as conn:
                conn.execute("SET citus.enable_ddl_propagation = off; ALTER DATABASE postgres RESET search_path")
        for worker in citus[1:]:
            with worker.connect() as conn:
                conn.execute("SET citus.enable_ddl_propagation = off; DROP OWNED BY citus_planter")
        orders.execute("DROP OWNED BY citus_planter; DROP ROLE citus_planter")
