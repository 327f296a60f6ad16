"""backfill_compare(), backfill_start(keys => ...) and backfill_repair(): differences between a
table and its copy are found exactly, under writes no false one is reported, and a repair that a
consumer applies leaves nothing to find. The copy is kept by a real consumer: an applier of the
slot's stream (wal2json), which confirms a position only once it has applied what precedes it."""

import decimal
import json
import random
import select
import threading
import time

import psycopg2
import psycopg2.extras
import pytest

from conftest import error_of, readme_grants, wait_for, wait_until_ended

COLUMNS = """id bigint PRIMARY KEY, i int, t text, n numeric, f float8, b boolean, d date,
             ts timestamptz, u uuid, j jsonb, y bytea, v varchar(20)"""
# One way to change each column, by its smallest step where it has one.
CHANGES = {
    "i": "i = i + 1", "t": "t = t || 'x'", "n": "n = n + 0.001", "f": "f = f * (1 + 1e-15)",
    "b": "b = NOT b", "d": "d = d + 1", "ts": "ts = ts + interval '1 microsecond'",
    "u": "u = gen_random_uuid()", "j": "j = j || '{\"k\": 1}'", "y": "y = y || '\\x00'::bytea",
    "v": "v = 'w' || v",
}
FILL = """SELECT g, g, md5(g::text), g / 7.0, g / 3.0, g % 2 = 0, date '2020-01-01' + g % 1000,
                 timestamptz '2020-01-01 00:00:00+00' + g * interval '1 second', md5(g::text)::uuid,
                 jsonb_build_object('g', g, 's', 'é' || g), decode(md5(g::text), 'hex'), 'v' || g
            FROM generate_series(1, ROWS) g"""


def make_pair(db, rows, source="src", target="dst"):
    db.execute(f"CREATE TABLE {source} ({COLUMNS})")
    db.execute(f"INSERT INTO {source} {FILL.replace('ROWS', str(rows))}")
    db.execute(f"ANALYZE {source}")
    db.execute(f"CREATE TABLE {target} (LIKE {source} INCLUDING ALL)")
    db.execute(f"INSERT INTO {target} SELECT * FROM {source}")


def compared(db, source="src", target="dst", **options):
    args = "".join(f", {k} => %({k})s" for k in options)
    rows = db.execute(f"SELECT key->>'id', status FROM backfill_compare('{source}', '{target}'{args})", options)
    return {int(k): status for k, status in rows}


class Applier(threading.Thread):
    """A consumer that streams the slot (wal2json, over the replication protocol) and applies it to
    the copy: inserts, updates and reads as upserts, deletes and absents as deletes, each source
    transaction in one transaction. It confirms a position only once it has applied everything
    before it."""

    def __init__(self, cluster, dbname, slot, table="src", copy="dst"):
        super().__init__(daemon=True)
        self.cluster, self.dbname, self.slot, self.table, self.copy = cluster, dbname, slot, table, copy
        self.stop, self.errors, self.applied = threading.Event(), [], 0

    def run(self):
        try:
            with self.cluster.connect(self.dbname) as conn:
                columns = [c for c, in conn.execute(
                    "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped "
                    "ORDER BY attnum", [self.copy])]
                self.upsert = (f"INSERT INTO {self.copy} SELECT * FROM jsonb_populate_recordset(NULL::{self.copy}, %s::jsonb) "
                               f"ON CONFLICT (id) DO UPDATE SET ({', '.join(columns)}) = "
                               f"({', '.join('EXCLUDED.' + c for c in columns)})")
                self.delete = f"DELETE FROM {self.copy} WHERE id = %s"
                self.stream(conn)
        except Exception as e:  # the test fails on it
            self.errors.append(repr(e))

    def stream(self, conn):
        stream = psycopg2.connect(host="127.0.0.1", port=self.cluster.port, user="postgres", dbname=self.dbname,
                                  connection_factory=psycopg2.extras.LogicalReplicationConnection)
        cursor = stream.cursor()
        cursor.start_replication(slot_name=self.slot, decode=True,
                                 options={"format-version": "2", "include-transaction": "true"})
        transaction = None  # the statements of the source transaction being received
        try:
            while not self.stop.is_set():
                message = cursor.read_message()
                if message is None:
                    if transaction is None:  # everything received is applied: confirm it all
                        cursor.send_feedback(flush_lsn=cursor.wal_end, force=True)
                    select.select([cursor], [], [], 0.02)
                    continue
                # (Numbers as written: a float would round a numeric.)
                change = json.loads(message.payload, parse_float=decimal.Decimal)
                if change["action"] == "B":
                    transaction = []
                elif change["action"] == "C":
                    # One transaction, its upserts in batches: the copy keeps up with the writers.
                    with conn.transaction():
                        for sql, args in self.batched(transaction):
                            conn.execute(sql, args)
                    self.applied += len(transaction)
                    transaction = None
                    cursor.send_feedback(flush_lsn=message.data_start, force=True)
                else:
                    transaction.extend(self.statements(change))
        finally:
            stream.close()

    def batched(self, statements):
        """Runs of upserts of distinct keys as one statement each, in order."""
        run, keys = [], set()
        for kind, value in statements + [("end", None)]:
            if kind != "upsert" or value["id"] in keys:
                if run:
                    yield self.upsert, [json.dumps(run, default=str)]
                run, keys = [], set()
            if kind == "upsert":
                run.append(value)
                keys.add(value["id"])
            elif kind == "delete":
                yield self.delete, [value]

    def statements(self, change):
        """What applying a change runs on the copy."""
        action = change["action"]
        if action in "IUD" and change.get("table") != self.table:
            return []
        values = lambda field: {c["name"]: c["value"] for c in change[field]}
        if action in "IU":
            row = values("columns")
            old = values("identity")["id"] if "identity" in change else row["id"]
            return [("delete", old)] * (old != row["id"]) + [("upsert", row)]
        if action == "D":
            return [("delete", values("identity")["id"])]
        if action == "M" and change["prefix"] == "backfill":
            message = json.loads(change["content"], parse_float=decimal.Decimal)
            if message["op"] == "read":
                return [("upsert", message["data"])]
            if message["op"] == "reads":  # a batch: its rows, in order
                return [("upsert", row["data"]) for row in message["rows"]]
            if message["op"] == "absent":
                return [("delete", message["key"]["id"])]
        return []

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.join(30)
        assert not self.errors, self.errors


def test_identical_tables_agree_at_every_level(db):
    make_pair(db, 5000)
    for level in ("hash", "aggregate", "count"):
        assert compared(db, level=level) == {}


def test_a_thousand_injected_divergences_of_every_kind_are_found_exactly(db):
    make_pair(db, 20_000)
    rng = random.Random(7)
    keys = rng.sample(range(1, 20_001), 1000)
    kinds = ["missing", "extra"] + [f"different:{c}" for c in CHANGES] + ["null"]
    expected = {}
    for n, key in enumerate(keys):
        kind = kinds[n % len(kinds)]
        if kind == "missing":
            db.execute("DELETE FROM dst WHERE id = %s", [key])
        elif kind == "extra":
            db.execute("DELETE FROM src WHERE id = %s", [key])
        elif kind == "null":  # a value becomes NULL
            db.execute("UPDATE dst SET t = NULL WHERE id = %s", [key])
            kind = "different"
        else:
            db.execute(f"UPDATE dst SET {CHANGES[kind.split(':')[1]]} WHERE id = %s", [key])
            kind = "different"
        expected[key] = kind
    assert len(expected) == 1000
    assert compared(db) == expected
    # The count level sees only rows counts: the missing and extra keys of ranges whose counts
    # differ (a missing and an extra key in one range offset each other), and nothing else.
    counted = compared(db, level="count")
    assert counted.items() <= {k: s for k, s in expected.items() if s != "different"}.items()
    assert len(counted) >= 100
    # The aggregate level sees what changes a sum, a NULL count or a range's least or greatest
    # value; the keys it reports are exactly differing ones.
    aggregated = compared(db, level="aggregate")
    assert aggregated.items() <= expected.items()
    assert {"missing", "extra", "different"} <= set(aggregated.values())
    assert len(aggregated) >= 400


@pytest.mark.slow
@pytest.mark.parametrize("rows_per_message", [1, 50])
def test_a_repair_applied_by_the_consumer_leaves_nothing_to_find(cluster, db, rows_per_message):
    """With backfill.rows_per_message above 1, the repair's reads come in batches."""
    db.execute(f"SET backfill.rows_per_message = {rows_per_message}")
    make_pair(db, 3000)
    db.execute("SELECT pg_create_logical_replication_slot('copy', 'wal2json')")
    db.execute("DELETE FROM dst WHERE id IN (10, 20)")
    db.execute("UPDATE dst SET t = 'stale', j = '{}' WHERE id IN (30, 2999)")
    db.execute("INSERT INTO dst SELECT id + 10000, i, t, n, f, b, d, ts, u, j, y, v FROM src WHERE id <= 3")
    expected = {10: "missing", 20: "missing", 30: "different", 2999: "different",
                10001: "extra", 10002: "extra", 10003: "extra"}
    with Applier(cluster, db.info.dbname, "copy"):
        assert compared(db, slot="copy") == expected
        error = error_of(db, "SELECT backfill_repair('src', 'dst', slot => 'copy')")
        assert error.sqlstate == "22023" and "7 keys of src differ: 2 missing, 3 extra, 2 different" in error.diag.message_detail
        backfill_id = db.execute("SELECT backfill_repair('src', 'dst', confirm => true, slot => 'copy')").fetchone()[0]
        assert db.execute("SELECT backfill_wait(%s, '60 s')", [backfill_id]).fetchone()[0]
        assert db.execute("SELECT rows_done, slot_name, rows_per_message FROM backfill_status WHERE id = %s",
                          [backfill_id]).fetchone() == (7, "copy", rows_per_message)
        assert compared(db, slot="copy") == {}
        # With the copy whole, a repair starts nothing.
        assert db.execute("SELECT backfill_repair('src', 'dst', confirm => true)").fetchone()[0] is None
    assert db.execute("SELECT count(*) FROM dst").fetchone()[0] == 3000


def test_keys_are_read_or_delivered_absent_in_key_order_once(db):
    db.execute("CREATE TABLE kv (region text, id int, v text, PRIMARY KEY (region, id))")
    db.execute("INSERT INTO kv VALUES ('eu', 1, 'a'), ('eu', 2, 'b'), ('us', 1, 'c')")
    db.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    keys = [{"region": "us", "id": 1}, {"region": "eu", "id": 9}, {"region": "eu", "id": 1}, {"region": "us", "id": 1}]
    backfill_id = db.execute("SELECT backfill_start('kv', confirm => true, batch_size => 2, keys => %s)",
                             [json.dumps(keys)]).fetchone()[0]
    assert wait_until_ended(db, backfill_id) == "done"
    messages = [json.loads(c["content"]) for (d,) in db.execute(
        "SELECT data FROM pg_logical_slot_get_changes('s', NULL, NULL, 'format-version', '2')")
        for c in [json.loads(d)] if c.get("action") == "M"]
    assert [(m["op"], m.get("key")) for m in messages] == [
        ("table_start", None), ("read", {"region": "eu", "id": 1}), ("absent", {"region": "eu", "id": 9}),
        ("read", {"region": "us", "id": 1}), ("table_end", None)]
    assert messages[0]["upper_bound"] == {"region": "us", "id": 1} and messages[-1]["rows"] == 3


def test_an_absent_key_sorts_before_a_concurrent_insert_of_it(cluster, db):
    """Keys given absent while a writer inserts the keys just ahead of the backfill's cursor: a
    consumer that applies absents as deletes must still end with every inserted row (a keyed page
    holds the table against writers from its snapshot to its commit)."""
    db.execute("CREATE TABLE src (id bigint PRIMARY KEY, v int NOT NULL)")
    db.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    keys = list(range(1, 3001))
    stop = threading.Event()

    def insert():
        with cluster.connect(db.info.dbname) as conn:
            while not stop.is_set():
                cursor = conn.execute("SELECT coalesce(max(cursor[1]::bigint), 0) FROM backfill_tables").fetchone()[0]
                for key in range(cursor + 1, cursor + 4):
                    conn.execute("INSERT INTO src VALUES (%s, 1) ON CONFLICT DO NOTHING", [key])

    writer = threading.Thread(target=insert)
    writer.start()
    backfill_id = db.execute("SELECT backfill_start('src', confirm => true, batch_size => 3, keys => %s)",
                             [json.dumps([{"id": k} for k in keys])]).fetchone()[0]
    state = wait_until_ended(db, backfill_id)
    stop.set()
    writer.join()
    assert state == "done"
    copy, absent = set(), 0
    for (data,) in db.execute("SELECT data FROM pg_logical_slot_get_changes('s', NULL, NULL, 'format-version', '2')"):
        change = json.loads(data)
        if change["action"] == "I":
            copy.add(change["columns"][0]["value"])
        elif change["action"] == "M" and change["prefix"] == "backfill":
            message = json.loads(change["content"])
            if message["op"] == "read":
                copy.add(message["key"]["id"])
            elif message["op"] == "absent":
                copy.discard(message["key"]["id"])
                absent += 1
    source = {k for k, in db.execute("SELECT id FROM src")}
    # The race was run: some keys went absent, some were inserted first. (How many of each
    # depends on how fast the writer runs next to the backfill, which no verdict may.)
    assert absent > 0 and len(source) > 0, (absent, len(source))
    assert copy == source, f"{len(source - copy)} inserted rows deleted by an absent"


def test_no_false_verdict_while_writers_change_the_source(cluster, db):
    """20 comparisons while writers change the source and the applier follows, each comparison
    after at least 500 more changed rows (a condition of the scenario, not of the machine's
    speed): a verdict other than unsettled would be false (the copy only ever follows the stream)."""
    db.execute("CREATE TABLE src (id bigint PRIMARY KEY, v int NOT NULL, t text, ts timestamptz)")
    db.execute("INSERT INTO src SELECT g, 0, md5(g::text), now() FROM generate_series(1, 20000) g")
    db.execute("ANALYZE src")
    db.execute("CREATE TABLE dst (LIKE src INCLUDING ALL)")
    db.execute("SELECT pg_create_logical_replication_slot('copy', 'wal2json')")
    stop, changed = threading.Event(), [0]

    def write(seed):
        """About 600 rows a second: 50 rounds of an update of 10 rows, an insert and a delete."""
        rng, next_round = random.Random(seed), time.monotonic()
        with cluster.connect(db.info.dbname) as conn:
            while not stop.is_set():
                low = rng.randint(1, 19_990)
                changed[0] += conn.execute("UPDATE src SET v = v + 1, ts = clock_timestamp() WHERE id BETWEEN %s AND %s",
                                           [low, low + 9]).rowcount
                fresh = rng.randint(100_000, 10_000_000)
                changed[0] += conn.execute("INSERT INTO src VALUES (%s, 0, 'new', now()) ON CONFLICT DO NOTHING",
                                           [fresh]).rowcount
                changed[0] += conn.execute("DELETE FROM src WHERE id = %s", [rng.randint(1, 20_000)]).rowcount
                next_round += 0.02
                time.sleep(max(0.0, next_round - time.monotonic()))

    def hot():
        """Hot rows: ten keys updated over and over, so that some key is always moving."""
        with cluster.connect(db.info.dbname) as conn:
            while not stop.is_set():
                for key in range(1, 11):
                    changed[0] += conn.execute("UPDATE src SET v = v + 1 WHERE id = %s", [key]).rowcount
                # (About 500 rows a second at most: as fast as the machine allows, the applier in
                # Python fell behind on a loaded machine, and each comparison waited minutes for it.)
                time.sleep(0.02)

    with Applier(cluster, db.info.dbname, "copy") as applier:
        backfill_id = db.execute("SELECT backfill_start('src', confirm => true, slot => 'copy')").fetchone()[0]
        assert db.execute("SELECT backfill_wait(%s, '120 s')", [backfill_id]).fetchone()[0]
        writers = [threading.Thread(target=write, args=(n,)) for n in range(2)] + [threading.Thread(target=hot)]
        for w in writers:
            w.start()
        started, false_verdicts, unsettled = time.monotonic(), [], 0
        try:
            for run in range(20):
                # The writers' pace is the machine's: wait for their changes rather than assert a rate.
                deadline = time.monotonic() + 300
                while changed[0] < 500 * (run + 1):
                    assert time.monotonic() < deadline, f"the writers are stuck at {changed[0]} changed rows"
                    time.sleep(0.05)
                began = time.monotonic()
                verdicts = compared(db, slot="copy")
                print(f"run {run}: {time.monotonic() - began:.1f} s, {len(verdicts)} unsettled")
                time.sleep(0.2)
                false_verdicts += [(run, k, s) for k, s in verdicts.items() if s != "unsettled"]
                unsettled += len(verdicts)
        finally:
            stop.set()
            for w in writers:
                w.join()
        rate = changed[0] / (time.monotonic() - started)
    assert false_verdicts == [], false_verdicts[:10]
    assert changed[0] >= 10_000
    print(f"{rate:.0f} rows/s changed, {unsettled} unsettled verdicts in 20 runs, {applier.applied} changes applied")


def test_a_foreign_table_is_compared_on_its_own_server(cluster, db, scratch_database):
    remote = scratch_database("compare_remote")
    with cluster.connect(remote) as conn:
        conn.execute("CREATE EXTENSION pg_backfill")
        make_pair(conn, 4000, source="dst", target="unused")
        conn.execute("DELETE FROM dst WHERE id = 5")
        conn.execute("UPDATE dst SET n = n + 1 WHERE id = 3999")
    db.execute(f"CREATE TABLE src ({COLUMNS})")
    db.execute(f"INSERT INTO src {FILL.replace('ROWS', '4000')}")
    db.execute("CREATE EXTENSION postgres_fdw")
    db.execute("CREATE EXTENSION dblink")
    db.execute(f"CREATE SERVER copy FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '127.0.0.1', port '{cluster.port}', dbname '{remote}')")
    db.execute("CREATE USER MAPPING FOR CURRENT_USER SERVER copy")
    db.execute("CREATE SCHEMA far")
    db.execute("IMPORT FOREIGN SCHEMA public LIMIT TO (dst) FROM SERVER copy INTO far")
    assert compared(db, target="far.dst") == {5: "missing", 3999: "different"}
    assert compared(db, target="far.dst", level="count") == {5: "missing"}
    assert compared(db, target="far.dst", level="aggregate") == {5: "missing", 3999: "different"}
    # The table behind the foreign table must have the source's columns too, not only its
    # declaration here.
    with cluster.connect(remote) as conn:
        conn.execute("ALTER TABLE dst ADD COLUMN added int")
    error = error_of(db, "SELECT * FROM backfill_compare('src', 'far.dst')")
    assert error.sqlstate == "42804" and "added integer" in error.diag.message_detail, error
    with cluster.connect(remote) as conn:
        conn.execute("ALTER TABLE dst DROP COLUMN added")
    # A server whose pg_backfill hashes rows otherwise (as 0.5.0 did), or that has none, is
    # refused before any checksum is compared.
    with cluster.connect(remote) as conn:
        conn.execute("CREATE FUNCTION backfill.row_hash(record) RETURNS bigint LANGUAGE plpgsql AS 'BEGIN RETURN 42; END'")
    error = error_of(db, "SELECT * FROM backfill_compare('src', 'far.dst')")
    assert error.sqlstate == "0A000" and "hashes rows otherwise" in error.diag.message_primary, error
    with cluster.connect(remote) as conn:
        conn.execute("DROP EXTENSION pg_backfill CASCADE")
    error = error_of(db, "SELECT * FROM backfill_compare('src', 'far.dst')")
    assert error.sqlstate == "0A000" and "has no pg_backfill" in error.diag.message_primary, error
    db.execute("DROP EXTENSION dblink")
    error = error_of(db, "SELECT * FROM backfill_compare('src', 'far.dst')")
    assert error.sqlstate == "0A000" and "CREATE EXTENSION dblink" in error.diag.message_hint


def test_compare_and_keys_refuse_what_they_cannot_do(db, roles):
    make_pair(db, 100)
    db.execute("CREATE TABLE other (id bigint PRIMARY KEY, x int)")
    db.execute("CREATE TABLE keyless (LIKE src)")
    cases = {
        "SELECT * FROM backfill_compare(NULL, 'dst')": "22004",
        "SELECT * FROM backfill_compare('src', NULL)": "22004",
        "SELECT * FROM backfill_compare('src', 'dst', level => NULL)": "22004",
        "SELECT * FROM backfill_compare('src', 'dst', passes => NULL)": "22004",
        "SELECT * FROM backfill_compare('src', 'dst', passes => 0)": "22023",
        "SELECT * FROM backfill_compare('src', 'dst', passes => 2147483647)": "22023",
        "SELECT * FROM backfill_compare('src', 'dst', level => 'md5')": "22023",
        "SELECT * FROM backfill_compare('src', 'src')": "22023",
        "SELECT * FROM backfill_compare('src', 'other')": "42804",
        "SELECT * FROM backfill_compare('src', 'keyless')": "55000",
        "SELECT * FROM backfill_compare('src', 'dst', slot => 'nope')": "42704",
        "SELECT backfill_repair('src', 'dst', confirm => NULL)": "22004",
        "SELECT backfill_repair('src', 'dst', batch_size => 0)": "22023",
        "SELECT backfill_start('src', confirm => true, keys => '{}')": "22023",
        "SELECT backfill_start('src', confirm => true, keys => '[]')": "22023",
        "SELECT backfill_start('src', confirm => true, keys => '[{\"idx\": 1}]')": "22023",
        "SELECT backfill_start('src', confirm => true, keys => '[{\"id\": null}]')": "22023",
        "SELECT backfill_start('src', confirm => true, keys => '[{\"id\": \"x\"}]')": "22P02",
        "SELECT backfill_start(ARRAY['src', 'dst']::regclass[], confirm => true, keys => '[{\"id\": 1}]')": "22023",
    }
    for sql, sqlstate in cases.items():
        assert error_of(db, sql).sqlstate == sqlstate, sql
    with db.transaction():
        db.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        assert error_of(db, "SELECT * FROM backfill_compare('src', 'dst')").sqlstate == "25001"
    # A keyed backfill takes at most backfill.compare_max_keys keys (cast, sorted and stored in
    # the backend's memory when it starts).
    db.execute("SET backfill.compare_max_keys = 2")
    error = error_of(db, "SELECT backfill_start('src', confirm => true, keys => '[{\"id\": 1}, {\"id\": 2}, {\"id\": 3}]')")
    assert error.sqlstate == "54000" and "compare_max_keys" in error.diag.message_detail, error
    two = db.execute("SELECT backfill_start('src', confirm => true, keys => '[{\"id\": 1}, {\"id\": 2}]')").fetchone()[0]
    assert wait_until_ended(db, two) == "done"
    db.execute("RESET backfill.compare_max_keys")
    # A role reads only what it may: PUBLIC may not call it, an operator only on tables it reads.
    nobody = roles.create("nobody")
    assert error_of(roles.connect(nobody), "SELECT * FROM backfill_compare('src', 'dst')").sqlstate == "42501"
    operator = roles.create("operator")
    db.execute(readme_grants("operator", operator))
    db.execute(f"GRANT SELECT ON src TO {operator}")
    conn = roles.connect(operator)
    error = error_of(conn, "SELECT * FROM backfill_compare('src', 'dst')")
    assert error.sqlstate == "42501" and "dst" in error.diag.message_primary
    db.execute(f"GRANT SELECT ON dst TO {operator}")
    assert conn.execute("SELECT count(*) FROM backfill_compare('src', 'dst')").fetchone()[0] == 0
    # A repair starts a backfill: a role that may read the source but not update it (a backfill
    # locks rows FOR SHARE) is refused before anything is compared (here, a comparison would
    # have been refused for the copy, which it may no longer read).
    db.execute(f"REVOKE SELECT ON dst FROM {operator}")
    error = error_of(conn, "SELECT backfill_repair('src', 'dst', confirm => true)")
    assert error.sqlstate == "42501" and "UPDATE" in error.diag.message_detail, error


def test_a_slot_dropped_while_a_comparison_waits_for_it_ends_the_wait(cluster, db):
    """A comparison waits (up to a minute) for the slot's consumer to confirm the source's
    position; the slot dropped meanwhile ends it at once with 42704, naming the slot."""
    make_pair(db, 1000)
    db.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    db.execute("UPDATE src SET i = i + 1 WHERE id = 1")  # WAL past the slot's confirmed position
    outcome = {}

    def compare():
        started = time.monotonic()
        outcome["error"] = error_of(db, "SELECT * FROM backfill_compare('src', 'dst', slot => 's')")
        outcome["seconds"] = time.monotonic() - started

    other = cluster.connect(db.info.dbname)
    try:
        thread = threading.Thread(target=compare)
        thread.start()
        waiting = """SELECT count(*) FROM pg_stat_activity
                      WHERE query LIKE '%%backfill_compare%%' AND state = 'active' AND pid <> pg_backend_pid()"""
        wait_for(lambda: other.execute(waiting).fetchone()[0] == 1, what="the comparison")
        time.sleep(1)  # into its wait for the slot
        other.execute("SELECT pg_drop_replication_slot('s')")
        thread.join(40)
        assert not thread.is_alive()
    finally:
        other.close()
    error = outcome["error"]
    assert error.sqlstate == "42704" and '"s"' in error.diag.message_primary, error
    assert outcome["seconds"] < 20


def test_numeric_keys_keep_every_digit(db):
    """Keys travel as JSON: a numeric key of more digits than a double holds is reported, and
    re-delivered, exactly."""
    db.execute("CREATE TABLE wide_keys (id numeric PRIMARY KEY, v text)")
    db.execute("INSERT INTO wide_keys SELECT 12345678901234567890.123456789 + g, 'v' FROM generate_series(1, 3000) g")
    db.execute("CREATE TABLE wide_keys_copy (LIKE wide_keys INCLUDING ALL)")
    db.execute("INSERT INTO wide_keys_copy SELECT * FROM wide_keys WHERE id <> 12345678901234567890.123456789 + 7")
    rows = db.execute("SELECT key::text, status FROM backfill_compare('wide_keys', 'wide_keys_copy')").fetchall()
    assert rows == [('{"id": 12345678901234567897.123456789}', "missing")]
    backfill_id = db.execute(
        "SELECT backfill_start('wide_keys', confirm => true, keys => '[{\"id\": 12345678901234567897.123456789}]')"
    ).fetchone()[0]
    wait_until_ended(db, backfill_id)
    assert db.execute("SELECT key_json FROM backfill.job_key WHERE job_id = %s", [backfill_id]).fetchone()[0] == \
        ["12345678901234567897.123456789"]


def test_a_copy_far_from_its_source_is_refused_not_listed(db):
    """The differing keys are kept in the backend's memory, up to backfill.compare_max_keys: an
    empty copy of a big table fails with 54000 instead of filling it."""
    make_pair(db, 5000)
    db.execute("TRUNCATE dst")
    db.execute("SET backfill.compare_max_keys = 1000")
    error = error_of(db, "SELECT * FROM backfill_compare('src', 'dst')")
    assert error.sqlstate == "54000" and "more than 1000 keys" in error.diag.message_primary, error
    assert "backfill_start" in error.diag.message_hint
    db.execute("RESET backfill.compare_max_keys")
    assert set(compared(db).values()) == {"missing"} and len(compared(db)) == 5000


def test_keys_mean_the_same_whatever_the_callers_date_style(db):
    """Keys are cast to text under the worker's settings: a caller's DMY DateStyle must not make
    the worker read 2024-02-01 as 2024-01-02 (and deliver another row, or delete it)."""
    db.execute("CREATE TABLE days (d date PRIMARY KEY, v text)")
    db.execute("INSERT INTO days VALUES ('2024-01-02', 'present')")
    db.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    db.execute("SET DateStyle = 'SQL, DMY'")
    backfill_id = db.execute("SELECT backfill_start('days', confirm => true, keys => %s)",
                             [json.dumps([{"d": "2024-02-01"}])]).fetchone()[0]
    assert wait_until_ended(db, backfill_id) == "done"
    messages = [json.loads(c["content"]) for (d,) in db.execute(
        "SELECT data FROM pg_logical_slot_get_changes('s', NULL, NULL, 'format-version', '2')")
        for c in [json.loads(d)] if c.get("action") == "M"]
    assert [(m["op"], m.get("key")) for m in messages if m["op"] in ("read", "absent")] == [("absent", {"d": "2024-02-01"})]


def test_inheritance_children_hide_no_difference_on_either_side(cluster, db, scratch_database):
    """Every query of a side reads the rows its checksums count, local or remote: the table
    without its inheritance children (a child has keys of its own, and is compared on its own)."""
    remote = scratch_database("compare_children")
    with cluster.connect(remote) as conn:
        conn.execute("CREATE EXTENSION pg_backfill")
        make_pair(conn, 1000, source="dst", target="unused")
        conn.execute("CREATE TABLE dst_child () INHERITS (dst)")
        # The child holds the keys the parent lacks or holds stale: read with its children, the
        # copy would look whole.
        conn.execute("INSERT INTO dst_child SELECT * FROM dst WHERE id IN (5, 999)")
        conn.execute("DELETE FROM ONLY dst WHERE id = 5")
        conn.execute("UPDATE ONLY dst SET i = i + 1 WHERE id = 999")
    db.execute(f"CREATE TABLE src ({COLUMNS})")
    db.execute(f"INSERT INTO src {FILL.replace('ROWS', '1000')}")
    db.execute("CREATE TABLE src_child () INHERITS (src)")
    db.execute("INSERT INTO src_child SELECT * FROM src WHERE id BETWEEN 100 AND 110")
    db.execute("CREATE EXTENSION postgres_fdw")
    db.execute("CREATE EXTENSION dblink")
    db.execute(f"CREATE SERVER copy FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '127.0.0.1', port '{cluster.port}', dbname '{remote}')")
    db.execute("CREATE USER MAPPING FOR CURRENT_USER SERVER copy")
    db.execute("CREATE SCHEMA far")
    db.execute("IMPORT FOREIGN SCHEMA public LIMIT TO (dst) FROM SERVER copy INTO far")
    for level in ("hash", "aggregate"):
        assert compared(db, target="far.dst", level=level) == {5: "missing", 999: "different"}, level
    assert compared(db, target="far.dst", level="count") == {5: "missing"}


def test_a_repair_checks_the_slots_right_before_comparing(db, roles):
    """backfill_repair() binds its backfill to the slot of the table's running backfill: a role
    without REPLICATION is refused at once, not after a comparison that waits for that slot."""
    make_pair(db, 500)
    db.execute("DELETE FROM dst WHERE id = 7")
    db.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    first = db.execute("SELECT backfill_start('src', confirm => true, slot => 's')").fetchone()[0]
    db.execute("UPDATE src SET i = i + 1 WHERE id = 1")  # WAL past the slot's confirmed position
    operator = roles.create("operator", "operator")
    db.execute(f"GRANT SELECT, UPDATE ON src TO {operator}")
    db.execute(f"GRANT SELECT ON dst TO {operator}")
    started = time.monotonic()
    error = error_of(roles.connect(operator), "SELECT backfill_repair('src', 'dst', confirm => true)")
    assert error.sqlstate == "42501" and '"s"' in error.diag.message_primary, error
    assert time.monotonic() - started < 10, "the right was checked only after the comparison waited for the slot"
    db.execute("SELECT backfill_cancel(%s)", [first])


def notices_of(conn):
    """The NOTICEs the server sends `conn` from now on, as a list that fills."""
    notices = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary))
    return notices


def test_compare_and_repair_never_wait_on_the_slot_of_a_cancelled_backfill_and_say_what_they_follow(db):
    """With no slot, a comparison follows the slot of the table's latest backfill that is running,
    paused or done, never one that was cancelled or failed (its consumer may be long gone: each
    pass would wait a minute for it, then call real differences unsettled). A NOTICE names the
    slot followed, or says none is; slot => '' asks for none whatever the backfills."""
    make_pair(db, 500)
    db.execute("DELETE FROM dst WHERE id = 7")
    db.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    cancelled = db.execute("SELECT backfill_start('src', confirm => true, slot => 's')").fetchone()[0]
    db.execute("SELECT backfill_cancel(%s)", [cancelled])
    assert wait_until_ended(db, cancelled) == "cancelled"
    db.execute("UPDATE src SET i = i + 1 WHERE id = 1; UPDATE dst SET i = i + 1 WHERE id = 1")  # WAL past the slot
    notices = notices_of(db)
    db.execute("SET statement_timeout = '30s'")  # following the slot, each pass would wait 60 s
    assert compared(db) == {7: "missing"}
    assert any("follows no replication slot" in n for n in notices), notices
    repaired = db.execute("SELECT backfill_repair('src', 'dst', confirm => true)").fetchone()[0]
    assert db.execute("SELECT slot_name FROM backfill_status WHERE id = %s", [repaired]).fetchone()[0] is None
    assert wait_until_ended(db, repaired) == "done"

    # A running backfill's slot is followed, and named; slot => '' follows none.
    running = db.execute("SELECT backfill_start('src', confirm => true, slot => 's')").fetchone()[0]
    notices.clear()
    db.execute("SET statement_timeout = '2s'")
    error = error_of(db, "SELECT * FROM backfill_compare('src', 'dst')")
    assert error.sqlstate == "57014"  # waited on the slot's consumer, which is away
    assert any('replication slot "s"' in n and f"backfill {running}" in n for n in notices), notices
    db.execute("SET statement_timeout = '30s'")
    notices.clear()
    assert compared(db, slot="") == {7: "missing"}
    assert any("follows no replication slot" in n for n in notices), notices
    db.execute("SELECT backfill_cancel(%s)", [running])


# Emits non-transactional messages until the WAL's insert position is at a page's start: past
# the page's header, where the last record ended at the previous page's end. A message's own
# size is measured first (same page before and after), then one is sized to fill the page.
PLACE_WAL_AT_A_PAGE_START = """
CREATE FUNCTION place_wal_at_a_page_start() RETURNS int LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    page int := current_setting('wal_block_size')::int;
    before numeric; after numeric; overhead int; fill int;
BEGIN
    FOR attempt IN 1..200 LOOP
        before := pg_current_wal_insert_lsn() - '0/0';
        PERFORM pg_logical_emit_message(false, 'pad', repeat('x', 300));
        after := pg_current_wal_insert_lsn() - '0/0';
        CONTINUE WHEN floor(before / page) <> floor(after / page);
        overhead := (after - before) - 300;
        fill := page - (after % page)::int - overhead;
        CONTINUE WHEN fill < 300;
        PERFORM pg_logical_emit_message(false, 'pad', repeat('x', fill));
        after := pg_current_wal_insert_lsn() - '0/0';
        IF (after % page)::int IN (24, 40) THEN
            RETURN attempt;
        END IF;
    END LOOP;
    RAISE 'the WAL never landed at a page start';
END $$"""


def test_a_comparison_at_a_wal_page_start_flushes_only_the_wal_written(db, roles):
    """When the last record ends at a WAL page's end, pg_current_wal_insert_lsn() points past the
    next page's header, at WAL no record fills yet: a comparison that flushed up to it failed
    with XX000 "xlog flush request ... is not satisfied". It flushes up to the last record's end,
    and it compares, also for an operator with only the grants docs/security.md gives."""
    make_pair(db, 100)
    db.execute("DELETE FROM dst WHERE id = 7")
    db.execute(PLACE_WAL_AT_A_PAGE_START)
    db.execute("GRANT EXECUTE ON FUNCTION place_wal_at_a_page_start() TO PUBLIC")
    operator = roles.create("operator", "operator")
    db.execute(f"GRANT SELECT ON src, dst TO {operator}")
    for conn in (db, roles.connect(operator)):
        for attempt in range(3):
            conn.execute("SELECT place_wal_at_a_page_start()")
            rows = conn.execute("SELECT key->>'id', status FROM backfill_compare('src', 'dst')").fetchall()
            assert rows == [("7", "missing")]
