"""Follows (backfill_follow()): a table added to a followed publication is backfilled into the
slot by itself, from the statement that added it, one backfill per slot at a time, with the
rights of the follow's creator. A real streaming pgoutput consumer (psycopg2, with messages)
reads the slot and applies what it receives, reads as upserts."""

import random
import threading

import psycopg
import pytest

from conftest import error_of, extra_cluster, status, wait_for, wait_until_ended
from test_citus import PgOutputStream, lsn_number

ROWS = 4000  # even ids 2..8000 per table; writers insert odd ids, so no key is ever reused


def make_table(db, name, rows=ROWS, schema="public"):
    db.execute(f"""CREATE TABLE {schema}.{name} (id bigint PRIMARY KEY, v int NOT NULL DEFAULT 0, payload text NOT NULL);
                   INSERT INTO {schema}.{name} SELECT 2 * g, 0, md5(g::text) FROM generate_series(1, {rows}) g;
                   ANALYZE {schema}.{name};""")


def follows(db, *columns):
    """Each follow's columns of backfill_follows, by id."""
    return db.execute(f"SELECT {', '.join(columns)} FROM backfill_follows ORDER BY id").fetchall()


def follow_row(db, column):
    return db.execute(f"SELECT {column} FROM backfill_follows ORDER BY id DESC LIMIT 1").fetchone()[0]


def queue(db):
    """(table, state, reason) of every queued table, in the order added."""
    return db.execute("SELECT table_name, state, reason FROM backfill.follow_table ORDER BY entry").fetchall()


def backfill_of(db, table):
    """The backfill a follow started for `table` (schema-qualified, as the queue names it; waits
    for the start)."""
    return wait_for(
        lambda: db.execute(
            "SELECT backfill_id FROM backfill.follow_table WHERE table_name = %s AND state = 'started'", [table]
        ).fetchone(),
        what=f"the follow to start {table}'s backfill",
    )[0]


class Writers(threading.Thread):
    """Application traffic on some tables: updates, inserts, deletes."""

    def __init__(self, cluster, dbname, tables):
        super().__init__(daemon=True)
        self.cluster, self.dbname, self.tables = cluster, dbname, tables
        self.stop_event, self.errors, self.ops = threading.Event(), [], 0

    def run(self):
        rng, fresh = random.Random(11), iter(range(1, 100 * ROWS, 2))
        try:
            with self.cluster.connect(self.dbname) as conn:
                while not self.stop_event.is_set():
                    self.ops += 1
                    table, dice, target = rng.choice(self.tables), rng.random(), 2 * rng.randint(1, ROWS)
                    if dice < 0.7:
                        conn.execute(f"UPDATE {table} SET v = v + 1 WHERE id = %s", [target])
                    elif dice < 0.85:
                        conn.execute(f"INSERT INTO {table} (id, payload) VALUES (%s, 'inserted')", [next(fresh)])
                    else:
                        conn.execute(f"DELETE FROM {table} WHERE id = %s", [target])
        except Exception as e:  # a writer must never fail because of the backfill
            self.errors.append(repr(e))

    def stop(self):
        self.stop_event.set()
        self.join(30)


def replay(events):
    """Applies the stream in order, reads as upserts: ({table: {id: (v, payload)}}, violations,
    {table: [read ids]})."""
    state, deleted, violations, reads = {}, {}, [], {}
    for event in events:
        if event[0] == "M":
            _, prefix, message = event
            if prefix != "backfill" or message["op"] != "read":
                continue
            table, row = message["table"], message["data"]
            rows, gone = state.setdefault(table, {}), deleted.setdefault(table, set())
            reads.setdefault(table, []).append(row["id"])
            if row["id"] in gone:
                violations.append(f"read brought back deleted row {table} {row['id']}")
            elif row["id"] in rows and rows[row["id"]][0] > row["v"]:
                violations.append(f"read of {table} {row['id']} at v{row['v']} after a change to v{rows[row['id']][0]}")
            rows[row["id"]] = (row["v"], row["payload"])
            continue
        table = event[1]
        rows, gone = state.setdefault(table, {}), deleted.setdefault(table, set())
        if event[0] == "D":
            rows.pop(int(event[2]["id"]), None)
            gone.add(int(event[2]["id"]))
        else:
            _, _, new, _ = event
            rows[int(new["id"])] = (int(new["v"]), new["payload"])
    return state, violations, reads


def source_rows(db, table):
    return {row[0]: (row[1], row[2]) for row in db.execute(f"SELECT id, v, payload FROM {table}")}


def consumer_caught_up(db, stream):
    return stream.received_lsn >= lsn_number(db.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])


@pytest.fixture
def pipeline(cluster, db):
    """Publication shop (of table seed) and its pgoutput slot cdc, streamed by a live consumer."""
    db.execute("CREATE TABLE seed (id int PRIMARY KEY); CREATE PUBLICATION shop FOR TABLE seed")
    db.execute("SELECT pg_create_logical_replication_slot('cdc', 'pgoutput')")
    stream = PgOutputStream(cluster, "cdc", "shop", dbname=db.info.dbname)
    stream.start()
    yield stream
    stream.stop()


def test_tables_added_to_a_followed_publication_reach_the_live_consumer_whole_one_after_the_other(cluster, db, pipeline):
    """Under writes, items is added to the followed publication: its backfill starts from the
    ALTER PUBLICATION's own transaction, and the consumer ends with exactly the table, no key read
    twice. lines, added while items' backfill runs, waits (pending in backfill_follows) and is
    backfilled whole after it."""
    make_table(db, "items")
    make_table(db, "lines", rows=1000)
    follow_id = db.execute("SELECT backfill_follow('shop', 'cdc', batch_size => 100, rows_per_second => 4000)").fetchone()[0]
    assert follows(db, "id", "publication", "slot", "state", "options", "pending_tables") == [
        (follow_id, "shop", "cdc", "following", {"batch_size": 100, "rows_per_second": 4000, "parallel": 1}, None)
    ]
    writers = Writers(cluster, db.info.dbname, ["items", "lines"])
    writers.start()
    try:
        wait_for(lambda: writers.ops > 50, what="the writers")
        db.execute("ALTER PUBLICATION shop ADD TABLE items")
        first = backfill_of(db, "public.items")
        assert status(db, first, "publication_name") == "shop"
        assert status(db, first, "slot_name") == "cdc"
        db.execute("ALTER PUBLICATION shop ADD TABLE lines")
        assert status(db, first, "state") == "running", "items' backfill must still run for lines to wait"
        assert follow_row(db, "pending_tables") == ["lines"]
        assert wait_until_ended(db, first) == "done"
        second = backfill_of(db, "public.lines")
        assert second > first
        assert wait_until_ended(db, second) == "done"
        wait_for(lambda: writers.ops > 2000, what="more writes")
    finally:
        writers.stop()
    wait_for(lambda: status(db, second, "delivered"), what="the consumer to confirm the backfill")
    wait_for(lambda: consumer_caught_up(db, pipeline), what="the consumer to catch up")
    pipeline.stop()
    assert pipeline.errors == [] and writers.errors == []
    state, violations, reads = replay(pipeline.events)
    assert violations == []
    for table, backfill_id in (("items", first), ("lines", second)):
        assert state[table] == source_rows(db, table), f"the consumer's {table} differs from the table"
        assert len(reads[table]) == len(set(reads[table])), f"a key of {table} was read twice"
        assert status(db, backfill_id, "started_by") == "postgres"
    # lines' reads all come after items' last read: one backfill per slot, in the order added.
    order = [m["table"] for kind, *rest in pipeline.events if kind == "M" for m in [rest[1]] if m["op"] == "read"]
    assert order.index("lines") > len(order) - 1 - order[::-1].index("items")
    assert follow_row(db, "last_backfill_id") == second and follow_row(db, "last_error") is None


@pytest.fixture
def replicator(db, roles):
    """An operator (the grants of docs/security.md) with REPLICATION: (role, connection)."""
    role = roles.create("etl", "operator")
    db.execute(f"ALTER ROLE {role} REPLICATION")
    return role, roles.connect(role)


def test_a_table_the_followers_role_may_not_backfill_is_not_started_and_the_ddl_succeeds(cluster, db, pipeline, replicator):
    """The follow acts with its creator's rights, checked at each start as backfill_start()
    checks them: a table it may not read is not started, the error shows in backfill_follows
    and the queue, and the ALTER PUBLICATION that added it commits. A table it may backfill,
    added next, still starts."""
    role, conn = replicator
    make_table(db, "secret", rows=100)
    make_table(db, "open", rows=100)
    db.execute(f"GRANT SELECT, UPDATE ON open TO {role}")
    conn.execute("SELECT backfill_follow('shop', 'cdc')")
    db.execute("ALTER PUBLICATION shop ADD TABLE secret")
    assert db.execute("SELECT count(*) FROM pg_publication_tables WHERE pubname = 'shop' AND tablename = 'secret'").fetchone()[0] == 1
    # (The dispatcher tries the start once the statement has committed.)
    ((table, state, reason),) = wait_for(lambda: [e for e in queue(db) if e[1] != "pending"], what="the start tried")
    assert (table, state) == ("public.secret", "failed") and "secret" in reason, reason
    error = follow_row(conn, "last_error")
    assert "secret" in error and "42501" in error, error
    assert db.execute("SELECT count(*) FROM backfill.job").fetchone()[0] == 0
    # In backfill_errors too, with no backfill: its creator sees the row, and (as for a
    # backfill's error) its text only where it may read the table.
    follow_id = follow_row(db, "id")
    assert db.execute("SELECT backfill_id, table_name, sqlstate, follow_id FROM backfill_errors").fetchall() == [
        (None, "public.secret", "42501", follow_id)]
    assert "secret" in db.execute("SELECT message FROM backfill_errors").fetchone()[0]
    assert conn.execute("SELECT table_name, follow_id FROM backfill_errors").fetchall() == [("public.secret", follow_id)]
    db.execute("ALTER PUBLICATION shop ADD TABLE open")
    backfill_id = backfill_of(db, "public.open")
    assert wait_until_ended(db, backfill_id) == "done"
    assert status(db, backfill_id, "started_by") == role
    assert status(db, backfill_id, "rows_done") == 100


def test_who_may_create_a_follow(db, pipeline, replicator, roles):
    """Creating a follow for a slot requires REPLICATION, as binding a backfill to it does; PUBLIC
    may not call backfill_follow() at all."""
    role, conn = replicator
    db.execute(f"ALTER ROLE {role} NOREPLICATION")
    e = error_of(conn, "SELECT backfill_follow('shop', 'cdc')")
    assert e.sqlstate == "42501" and 'replication slot "cdc"' in e.diag.message_primary, e.diag.message_primary
    nobody = roles.connect(roles.create("nobody"))
    e = error_of(nobody, "SELECT backfill_follow('shop', 'cdc')")
    assert e.sqlstate == "42501" and "backfill_follow" in e.diag.message_primary
    e = error_of(nobody, "SELECT backfill_unfollow('shop', 'cdc')")
    assert e.sqlstate == "42501"
    assert follows(db, "id") == []


@pytest.mark.parametrize("call, argument", [
    ("backfill_follow(NULL, 'cdc')", "publication"),
    ("backfill_follow('shop', NULL)", "slot"),
    ("backfill_follow('shop', 'cdc', batch_size => NULL)", "batch_size"),
    ("backfill_follow('shop', 'cdc', parallel => NULL)", "parallel"),
    ("backfill_unfollow(NULL, 'cdc')", "publication"),
    ("backfill_unfollow('shop', NULL)", "slot"),
])
def test_a_null_argument_is_an_error_naming_it(db, pipeline, call, argument):
    e = error_of(db, f"SELECT {call}")
    assert e.sqlstate == "22004", (e.sqlstate, e.diag.message_primary)
    assert f"argument {argument} of" in e.diag.message_primary and e.diag.message_hint


def test_a_follow_needs_its_publication_and_slot_and_is_made_once(db, pipeline):
    e = error_of(db, "SELECT backfill_follow('nope', 'cdc')")
    assert e.sqlstate == "42704" and '"nope"' in e.diag.message_primary and e.diag.message_hint
    e = error_of(db, "SELECT backfill_follow('shop', 'nope')")
    assert e.sqlstate == "42704" and '"nope"' in e.diag.message_primary
    e = error_of(db, "SELECT backfill_follow('shop', 'cdc', rows_per_message => 0)")
    assert e.sqlstate == "22023" and "rows_per_message" in e.diag.message_primary
    db.execute("SELECT backfill_follow('shop', 'cdc')")
    e = error_of(db, "SELECT backfill_follow('shop', 'cdc')")
    assert e.sqlstate == "42710" and "backfill_unfollow" in e.diag.message_hint


def test_unfollow_ends_the_follow_and_nothing_is_queued_after(db, pipeline):
    make_table(db, "items", rows=100)
    db.execute("SELECT backfill_follow('shop', 'cdc')")
    assert db.execute("SELECT backfill_unfollow('shop', 'cdc')").fetchone()[0] is True
    assert follows(db, "state", "end_reason") == [("ended", "ended by backfill_unfollow()")]
    db.execute("ALTER PUBLICATION shop ADD TABLE items")
    assert queue(db) == [] and db.execute("SELECT count(*) FROM backfill.job").fetchone()[0] == 0
    e = error_of(db, "SELECT backfill_unfollow('shop', 'cdc')")
    assert e.sqlstate == "42704"
    # Ended, it may be made again.
    db.execute("SELECT backfill_follow('shop', 'cdc')")
    assert [state for state, in follows(db, "state")] == ["ended", "following"]


def test_the_slot_dropped_ends_the_follow_with_the_reason(db):
    db.execute("CREATE TABLE seed (id int PRIMARY KEY); CREATE PUBLICATION shop FOR TABLE seed")
    db.execute("SELECT pg_create_logical_replication_slot('cdc', 'pgoutput')")
    make_table(db, "items", rows=100)
    db.execute("SELECT backfill_follow('shop', 'cdc')")
    db.execute("SELECT pg_drop_replication_slot('cdc')")
    assert follows(db, "state") == [("slot missing",)]
    db.execute("ALTER PUBLICATION shop ADD TABLE items")
    assert follows(db, "state", "end_reason") == [("ended", 'replication slot "cdc" was dropped')]
    assert queue(db) == []


def test_a_slot_of_its_name_made_for_another_database_is_not_the_follows(cluster, db, scratch_database):
    """Slot names are the cluster's: the follow's slot dropped, another database makes one of
    that name. The follow's slot is still missing (backfill_follows said following before
    0.11.0), and the follow ends at its next statement as for any dropped slot."""
    slot = f"cdc_{db.info.dbname.split('_')[0]}"
    db.execute("CREATE TABLE seed (id int PRIMARY KEY); CREATE PUBLICATION shop FOR TABLE seed")
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
    make_table(db, "items", rows=100)
    db.execute("SELECT backfill_follow('shop', %s)", [slot])
    db.execute("SELECT pg_drop_replication_slot(%s)", [slot])
    elsewhere = scratch_database(f"follow_elsewhere_{slot}")
    with cluster.connect(elsewhere) as other:
        other.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
    assert follows(db, "state") == [("slot missing",)]
    db.execute("ALTER PUBLICATION shop ADD TABLE items")
    assert follows(db, "state", "end_reason") == [("ended", f'replication slot "{slot}" was dropped')]
    assert queue(db) == []


def test_the_publication_dropped_ends_the_follow_with_the_reason(db, pipeline):
    db.execute("SELECT backfill_follow('shop', 'cdc')")
    db.execute("DROP PUBLICATION shop")
    assert follows(db, "state", "end_reason") == [("ended", 'publication "shop" was dropped or renamed')]


def test_drop_extension_leaves_nothing(db, pipeline):
    make_table(db, "items", rows=100)
    db.execute("SELECT backfill_follow('shop', 'cdc', rows_per_second => 10)")
    db.execute("ALTER PUBLICATION shop ADD TABLE items")
    backfill_id = backfill_of(db, "public.items")
    db.execute("SELECT backfill_cancel(%s)", [backfill_id])
    db.execute("DROP EXTENSION pg_backfill")
    assert db.execute("SELECT count(*) FROM pg_event_trigger WHERE evtname LIKE 'backfill%'").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'backfill'").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM pg_proc WHERE proname LIKE 'backfill%'").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM pg_class WHERE relname LIKE 'backfill%'").fetchone()[0] == 0
    # DDL goes on as before.
    db.execute("CREATE TABLE after (id int PRIMARY KEY); ALTER PUBLICATION shop ADD TABLE after")


# Each way a table joins a publication: (setup, before the follow; the statement that adds
# `added`, 500 rows, to it; the table the backfill reads).
WAYS_OF_ADDING = {
    "add table": ("", "ALTER PUBLICATION shop ADD TABLE added", "public.added"),
    "set table": ("", "ALTER PUBLICATION shop SET TABLE seed, added", "public.added"),
    "add tables in schema": (
        "CREATE SCHEMA sales; ALTER TABLE added SET SCHEMA sales",
        "ALTER PUBLICATION shop ADD TABLES IN SCHEMA sales",
        "sales.added",
    ),
    "set schema into a published schema": (
        "CREATE SCHEMA sales; ALTER PUBLICATION shop ADD TABLES IN SCHEMA sales",
        "ALTER TABLE added SET SCHEMA sales",
        "sales.added",
    ),
    "attach partition": (
        "CREATE TABLE measurements (id bigint PRIMARY KEY, v int NOT NULL DEFAULT 0, payload text NOT NULL)"
        " PARTITION BY RANGE (id);"
        " CREATE TABLE measurements_low PARTITION OF measurements FOR VALUES FROM (-1000000) TO (0);"
        " ALTER PUBLICATION shop ADD TABLE measurements",
        "ALTER TABLE measurements ATTACH PARTITION added FOR VALUES FROM (0) TO (1000000)",
        "public.added",
    ),
}


@pytest.mark.parametrize("way", list(WAYS_OF_ADDING))
def test_each_way_of_adding_a_table_starts_its_backfill(db, pipeline, way):
    setup, statement, table = WAYS_OF_ADDING[way]
    make_table(db, "added", rows=500)
    if setup:
        db.execute(setup)
    db.execute("SELECT backfill_follow('shop', 'cdc')")
    db.execute(statement)
    backfill_id = backfill_of(db, table)
    assert wait_until_ended(db, backfill_id) == "done"
    assert status(db, backfill_id, "rows_done") == 500
    assert status(db, backfill_id, "publication_name") == "shop"
    assert [state for _, state, _ in queue(db)] == ["started"]


def test_a_partition_attached_under_a_root_published_as_itself_is_refused_unless_empty(db, pipeline):
    """With publish_via_partition_root the publication names a partition's rows as its
    partitioned table's: a backfill of the partition alone would name them otherwise, so the
    attach is recorded as failed, with what to do. A new empty partition needs nothing."""
    db.execute("""CREATE TABLE measurements (id bigint PRIMARY KEY, v int NOT NULL DEFAULT 0, payload text NOT NULL)
                      PARTITION BY RANGE (id);
                  CREATE TABLE measurements_low PARTITION OF measurements FOR VALUES FROM (-1000000) TO (0);
                  ALTER PUBLICATION shop ADD TABLE measurements;
                  ALTER PUBLICATION shop SET (publish_via_partition_root = true)""")
    make_table(db, "added", rows=50)
    db.execute("SELECT backfill_follow('shop', 'cdc')")
    db.execute("ALTER TABLE measurements ATTACH PARTITION added FOR VALUES FROM (0) TO (1000000)")
    db.execute("CREATE TABLE measurements_high PARTITION OF measurements FOR VALUES FROM (1000000) TO (2000000)")
    (added, high) = queue(db)
    assert added[:2] == ("public.added", "failed") and "publish_via_partition_root" in added[2], added
    assert high == ("public.measurements_high", "skipped", "empty when added")
    assert "public.added" in follow_row(db, "last_error")
    assert db.execute("SELECT count(*) FROM backfill.job").fetchone()[0] == 0


def test_publish_via_partition_root_turned_on_backfills_nothing(db, pipeline):
    """The publication lists the partitioned table instead of its partitions: the same rows,
    which the consumer has."""
    db.execute("""CREATE TABLE measurements (id bigint PRIMARY KEY, v int NOT NULL DEFAULT 0) PARTITION BY RANGE (id);
                  CREATE TABLE measurements_low PARTITION OF measurements FOR VALUES FROM (0) TO (1000);
                  INSERT INTO measurements SELECT g FROM generate_series(1, 100) g;
                  ALTER PUBLICATION shop ADD TABLE measurements""")
    db.execute("SELECT backfill_follow('shop', 'cdc')")
    db.execute("ALTER PUBLICATION shop SET (publish_via_partition_root = true)")
    assert queue(db) == []


def test_backfill_start_with_a_publication_and_no_tables_backfills_every_table_it_holds(db, pipeline):
    make_table(db, "items", rows=300)
    make_table(db, "lines", rows=200)
    db.execute("ALTER PUBLICATION shop ADD TABLE items, lines")
    backfill_id = db.execute("SELECT backfill_start(publication => 'shop', slot => 'cdc', confirm => true)").fetchone()[0]
    assert sorted(status(db, backfill_id, "tables")) == ["items", "lines", "seed"]
    assert wait_until_ended(db, backfill_id) == "done"
    assert status(db, backfill_id, "rows_done") == 500
    e = error_of(db, "SELECT backfill_start(publication => 'nope', confirm => true)")
    assert e.sqlstate == "42704" and '"nope"' in e.diag.message_primary
    db.execute("CREATE PUBLICATION empty_pub")
    e = error_of(db, "SELECT backfill_start(publication => 'empty_pub', confirm => true)")
    assert e.sqlstate == "55000" and "holds no table" in e.diag.message_primary
    e = error_of(db, "SELECT backfill_start(confirm => true)")
    assert e.sqlstate == "22023" and "publication =>" in e.diag.message_hint


@pytest.mark.cluster
def test_the_queue_survives_a_server_restart(cluster):
    """Two tables added; the server restarts while the first's backfill runs and before the
    second starts: the first resumes (preloaded) and the second starts when it ends."""
    server = extra_cluster(cluster, "preload")
    server.start("shared_preload_libraries = 'pg_backfill'")
    try:
        db = server.connect()
        db.execute("CREATE EXTENSION pg_backfill")
        db.execute("CREATE TABLE seed (id int PRIMARY KEY); CREATE PUBLICATION shop FOR TABLE seed")
        db.execute("SELECT pg_create_logical_replication_slot('cdc', 'pgoutput')")
        make_table(db, "first", rows=1500)
        make_table(db, "second", rows=300)
        stream = PgOutputStream(server, "cdc", "shop")
        stream.start()
        db.execute("SELECT backfill_follow('shop', 'cdc', batch_size => 100, rows_per_second => 1000)")
        db.execute("ALTER PUBLICATION shop ADD TABLE first")
        first = backfill_of(db, "public.first")
        db.execute("ALTER PUBLICATION shop ADD TABLE second")
        wait_for(lambda: (status(db, first, "rows_done") or 0) > 0, what="the first pages")
        assert follow_row(db, "pending_tables") == ["second"]
        db.close()
        stream.stop()
        server.pg_ctl("restart", "-m", "fast")
        db = server.connect()
        assert status(db, first, "state") == "running" and follow_row(db, "pending_tables") == ["second"]
        stream = PgOutputStream(server, "cdc", "shop")
        stream.start()
        assert wait_until_ended(db, first) == "done"
        second = backfill_of(db, "public.second")
        assert wait_until_ended(db, second) == "done"
        assert status(db, second, "rows_done") == 300
        # A table queued while the slot is free, its start lost (here: the backfill holding the
        # slot ended by hand, as if the server crashed before the end's dispatch): the resumer
        # starts it after the restart.
        manual = db.execute("SELECT backfill_start('first', confirm => true, slot => 'cdc', rows_per_second => 10)"
                            ).fetchone()[0]
        db.execute("SELECT backfill_pause(%s)", [manual])
        make_table(db, "third", rows=200)
        db.execute("ALTER PUBLICATION shop ADD TABLE third")
        assert follow_row(db, "pending_tables") == ["third"]
        db.execute("UPDATE backfill.job SET state = 'cancelled' WHERE id = %s", [manual])
        db.close()
        stream.stop()
        server.pg_ctl("restart", "-m", "immediate")
        db = server.connect()
        stream = PgOutputStream(server, "cdc", "shop")
        stream.start()
        third = backfill_of(db, "public.third")
        assert wait_until_ended(db, third) == "done"
        stream.stop()
        db.close()
    finally:
        server.stop()


def test_the_next_table_starts_when_the_slots_backfill_is_cancelled_or_fails(db, pipeline):
    for name in ("a", "b", "c", "d"):
        make_table(db, name, rows=2000 if name in ("a", "c") else 100)
    db.execute("SELECT backfill_follow('shop', 'cdc', batch_size => 50, rows_per_second => 200)")
    db.execute("ALTER PUBLICATION shop ADD TABLE a")
    a = backfill_of(db, "public.a")
    db.execute("ALTER PUBLICATION shop ADD TABLE b")
    assert follow_row(db, "pending_tables") == ["b"]
    db.execute("SELECT backfill_cancel(%s)", [a])
    b = backfill_of(db, "public.b")
    assert wait_until_ended(db, b) == "done"
    db.execute("ALTER PUBLICATION shop ADD TABLE c")
    c = backfill_of(db, "public.c")
    db.execute("ALTER PUBLICATION shop ADD TABLE d")
    wait_for(lambda: (status(db, c, "rows_done") or 0) > 0, what="c's first page")
    db.execute("DROP TABLE c")
    assert wait_until_ended(db, c) == "failed"
    d = backfill_of(db, "public.d")
    assert wait_until_ended(db, d) == "done"
    assert [state for _, state, _ in queue(db)] == ["started"] * 4


def test_a_role_without_grants_runs_ddl_and_the_event_triggers_function_as_before(db, pipeline, roles):
    """Every role's DDL runs the event trigger's function (as the extension's owner): a role
    with no grant of pg_backfill creates and alters its tables as before, and may not call the
    function's entry point itself."""
    db.execute("SELECT backfill_follow('shop', 'cdc')")
    role = roles.create("nogrants")
    db.execute(f"CREATE SCHEMA own AUTHORIZATION {role}")
    conn = roles.connect(role)
    written = db.execute("SELECT xmin::text FROM backfill.follow").fetchone()[0]
    conn.execute("CREATE TABLE own.t (id int PRIMARY KEY); ALTER TABLE own.t ADD COLUMN v int; DROP TABLE own.t")
    # A statement that changes no followed publication writes nothing of pg_backfill's.
    assert db.execute("SELECT xmin::text FROM backfill.follow").fetchone()[0] == written
    assert error_of(conn, "SELECT backfill.follow_ddl('ALTER PUBLICATION')").sqlstate == "42501"
    assert queue(db) == [] and db.execute("SELECT count(*) FROM backfill.job").fetchone()[0] == 0
    assert follows(db, "state") == [("following",)]


def test_follows_after_an_update_from_0_9_0_and_the_new_library_under_the_old_schema(db, pipeline):
    """Before ALTER EXTENSION UPDATE, the new library runs 0.9.0's schema, which has no follows:
    a cancel (which looks for queued tables) works as before. After it, a follow works."""
    db.execute("DROP EXTENSION pg_backfill")
    db.execute("CREATE EXTENSION pg_backfill VERSION '0.9.0'")
    make_table(db, "items", rows=200)
    backfill_id = db.execute("SELECT backfill_start('items', confirm => true, rows_per_second => 10)").fetchone()[0]
    assert db.execute("SELECT backfill_cancel(%s)", [backfill_id]).fetchone()[0] is True
    assert wait_until_ended(db, backfill_id) == "cancelled"
    db.execute("ALTER EXTENSION pg_backfill UPDATE")
    db.execute("SELECT backfill_follow('shop', 'cdc')")
    db.execute("ALTER PUBLICATION shop ADD TABLE items")
    assert wait_until_ended(db, backfill_of(db, "public.items")) == "done"


def test_a_table_removed_from_the_publication_or_dropped_before_its_turn_is_skipped(db, pipeline):
    for name, rows in (("a", 2000), ("b", 100), ("c", 100), ("d", 100)):
        make_table(db, name, rows=rows)
    db.execute("SELECT backfill_follow('shop', 'cdc', batch_size => 50, rows_per_second => 500)")
    db.execute("ALTER PUBLICATION shop ADD TABLE a")
    a = backfill_of(db, "public.a")
    db.execute("ALTER PUBLICATION shop ADD TABLE b, c, d")
    assert follow_row(db, "pending_tables") == ["b", "c", "d"]
    db.execute("ALTER PUBLICATION shop DROP TABLE b")
    db.execute("DROP TABLE c")
    assert follow_row(db, "pending_tables") == ["d"]
    assert wait_until_ended(db, a) == "done"
    d = backfill_of(db, "public.d")
    assert status(db, d, "tables") == ["d"]
    assert [(table, state) for table, state, _ in queue(db)] == [
        ("public.a", "started"), ("public.b", "skipped"), ("public.c", "skipped"), ("public.d", "started")]


def test_two_workers_ending_start_the_next_table_once(db, pipeline):
    """With parallel => 2 a backfill's two workers end, each looking for the next queued table
    once the backfill has ended (starts are serialized): it starts once, after both."""
    make_table(db, "big", rows=3000)
    make_table(db, "small", rows=100)
    db.execute("SELECT backfill_follow('shop', 'cdc', parallel => 2, batch_size => 100, rows_per_second => 3000)")
    db.execute("ALTER PUBLICATION shop ADD TABLE big")
    big = backfill_of(db, "public.big")
    assert status(db, big, "parallel") == 2
    assert db.execute("SELECT count(DISTINCT worker) FROM backfill.job_table WHERE job_id = %s", [big]).fetchone()[0] == 2
    db.execute("ALTER PUBLICATION shop ADD TABLE small")
    assert wait_until_ended(db, big) == "done"
    small = backfill_of(db, "public.small")
    assert wait_until_ended(db, small) == "done"
    wait_for(lambda: db.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_backfill'").fetchone()[0] == 0,
             what="the workers to exit")
    assert db.execute("SELECT count(*) FROM backfill.job").fetchone()[0] == 2
    assert [set(t) for t, in db.execute("SELECT tables::text[] FROM backfill_status ORDER BY id")] == [{"big"}, {"small"}]


def test_a_table_added_by_a_role_that_is_not_a_superuser_is_backfilled_as_the_follows_creator(db, pipeline, roles):
    """The publication's owner, not a superuser, adds its own table: the event trigger runs in
    its transaction, and the backfill is the follow creator's (here a superuser's), reading the
    table as its owner as every backfill does."""
    role = roles.create("shopkeeper")
    db.execute(f"ALTER PUBLICATION shop OWNER TO {role}")
    conn = roles.connect(role)
    db.execute(f"CREATE SCHEMA goods_schema AUTHORIZATION {role}")
    conn.execute("""CREATE TABLE goods_schema.goods (id int PRIMARY KEY, label text);
                    INSERT INTO goods_schema.goods SELECT g, 'g' || g FROM generate_series(1, 300) g""")
    db.execute("SELECT backfill_follow('shop', 'cdc')")
    conn.execute("ALTER PUBLICATION shop ADD TABLE goods_schema.goods")
    backfill_id = backfill_of(db, "goods_schema.goods")
    assert wait_until_ended(db, backfill_id) == "done"
    assert status(db, backfill_id, "started_by") == "postgres" and status(db, backfill_id, "rows_done") == 300


def test_a_follows_backfills_start_with_the_settings_of_the_session_that_created_it(cluster, db, pipeline):
    """Not those of the session whose DDL starts one (its message prefix would send the reads
    where the consumer does not look), nor the worker's."""
    make_table(db, "a", rows=1000)
    make_table(db, "b", rows=100)
    db.execute("SET backfill.rows_per_message = 50")
    db.execute("SELECT backfill_follow('shop', 'cdc', batch_size => 100, rows_per_second => 2000)")
    db.execute("RESET backfill.rows_per_message")
    with cluster.connect(db.info.dbname) as other:
        other.execute("SET backfill.message_prefix = 'elsewhere'")
        other.execute("ALTER PUBLICATION shop ADD TABLE a")
        other.execute("ALTER PUBLICATION shop ADD TABLE b")
    a = backfill_of(db, "public.a")
    assert status(db, a, "message_prefix", "rows_per_message") == ("backfill", 50)
    assert wait_until_ended(db, a) == "done"
    b = backfill_of(db, "public.b")  # started by a's worker
    assert status(db, b, "message_prefix", "rows_per_message") == ("backfill", 50)


def test_a_hostile_search_path_and_names_change_nothing(cluster, db):
    """The event trigger runs in every role's session: operators planted ahead of pg_catalog in
    that session's search_path never run, in the trigger or in the dispatcher it wakes; a publication named with quotes and spaces is followed as any other; a renamed
    publication ends the follow, naming why; an option out of range is refused, naming it."""
    db.execute("""CREATE TABLE trap_log (what text);
                  CREATE SCHEMA trap;""")
    for type_ in ("oid", "text", "name", "bigint", "integer", "regclass"):
        db.execute(f"""CREATE FUNCTION trap.caught_{type_}(a {type_}, b {type_}) RETURNS boolean LANGUAGE plpgsql AS
                         $$ BEGIN INSERT INTO public.trap_log VALUES ('{type_}'); RETURN a::text OPERATOR(pg_catalog.=) b::text; END $$;
                       CREATE OPERATOR trap.= (FUNCTION = trap.caught_{type_}, LEFTARG = {type_}, RIGHTARG = {type_})""")
    db.execute("""CREATE TABLE seed (id int PRIMARY KEY); CREATE PUBLICATION "we""ird pub" FOR TABLE seed""")
    db.execute("SELECT pg_create_logical_replication_slot('cdc', 'pgoutput')")
    stream = PgOutputStream(cluster, "cdc", '"we""ird pub"', dbname=db.info.dbname)
    stream.start()
    try:
        hostile_session_and_names(db)
    finally:
        stream.stop()


def hostile_session_and_names(db):
    db.execute("""SELECT backfill_follow('we"ird pub', 'cdc')""")
    make_table(db, "added", rows=300)
    db.execute("SET search_path = trap, pg_catalog, public")
    # The trap is live: an unqualified = in this session runs it.
    db.execute("SELECT 'x'::text = 'x'::text")
    db.execute("""ALTER PUBLICATION "we""ird pub" ADD TABLE public.added""")
    # (Called by hand, outside an event trigger, it reads no statement's commands: an error.)
    assert error_of(db, "SELECT backfill.follow_ddl('ALTER PUBLICATION')").sqlstate == "39P03"
    db.execute("RESET search_path")
    backfill_id = backfill_of(db, "public.added")
    assert status(db, backfill_id, "publication_name") == 'we"ird pub'
    assert wait_until_ended(db, backfill_id) == "done" and status(db, backfill_id, "rows_done") == 300
    assert db.execute("SELECT array_agg(what) FROM trap_log").fetchone()[0] == ["text"]
    e = error_of(db, "SELECT backfill_follow('we\"ird pub', 'cdc', rows_per_message => 2147483647)")
    assert e.sqlstate == "22023" and "rows_per_message" in e.diag.message_primary, e
    db.execute("""ALTER PUBLICATION "we""ird pub" RENAME TO plain""")
    make_table(db, "later", rows=10)
    db.execute("ALTER PUBLICATION plain ADD TABLE later")
    assert follows(db, "state", "end_reason") == [("ended", 'publication "we"ird pub" was dropped or renamed')]
    assert [table for table, _, _ in queue(db)] == ["public.added"]
