"""What a follow lets other roles do: a role with no grant of pg_backfill, only CREATE on a schema
a followed publication lists (or any role's DDL), changes what the follow backfills only by
adding tables to the publication. Its DDL starts no process, takes none of pg_backfill's locks,
needs no grant or library of pg_backfill's, skips no table that holds rows, and two statements at
once lose neither's update. docs/security.md says the same."""

import threading

import psycopg
import pytest

from conftest import error_of, status, wait_for, wait_until_ended
from test_follow import backfill_of, make_table, pipeline, queue  # noqa: F401 (a fixture)


def processes_of_pg_backfill(db):
    return db.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_backfill' AND datname = current_database()"
    ).fetchone()[0]


@pytest.fixture
def schema_creator(db, roles):
    """Schema open, listed by publication shop, and a role with no grant but CREATE on it."""
    db.execute("CREATE SCHEMA open; ALTER PUBLICATION shop ADD TABLES IN SCHEMA open")
    role = roles.create("creator")
    db.execute(f"GRANT USAGE, CREATE ON SCHEMA open TO {role}")
    return role, roles.connect(role)


def test_ddl_rolled_back_or_left_open_starts_no_process(db, pipeline, schema_creator):
    """A table added in a subtransaction that rolls back, again and again, in a transaction left
    open: no process is registered for any of them (none waits on the open transaction, none
    fills the cluster's worker slots), a backfill started meanwhile starts, and the table kept
    is backfilled once the transaction commits."""
    role, conn = schema_creator
    db.execute(f"CREATE SCHEMA mine AUTHORIZATION {role}")
    db.execute("SELECT backfill_follow('shop', 'cdc')")
    conn.execute("BEGIN")
    for i in range(40):
        conn.execute("SAVEPOINT s")
        conn.execute(f"""CREATE TABLE mine.t{i} (id int PRIMARY KEY);
                         INSERT INTO mine.t{i} SELECT g FROM generate_series(1, 10) g;
                         ALTER TABLE mine.t{i} SET SCHEMA open""")
        conn.execute("ROLLBACK TO SAVEPOINT s")
    conn.execute("""CREATE TABLE mine.kept (id int PRIMARY KEY);
                    INSERT INTO mine.kept SELECT g FROM generate_series(1, 10) g;
                    ALTER TABLE mine.kept SET SCHEMA open""")
    # While the transaction is open nothing of pg_backfill's runs for it: a registered worker
    # would show within this wait (each waits, as `pg_backfill starting`, on the open transaction).
    with pytest.raises(AssertionError, match="timed out"):
        wait_for(lambda: processes_of_pg_backfill(db), timeout=3, what="a process of pg_backfill")
    make_table(db, "other", rows=100)
    # (Before, the open transaction held the lock every start takes: this start waited for it.)
    db.execute("SET lock_timeout = '20s'")
    other = db.execute("SELECT backfill_start('other', confirm => true)").fetchone()[0]
    assert wait_until_ended(db, other) == "done"
    conn.execute("COMMIT")
    kept = backfill_of(db, "open.kept")
    assert wait_until_ended(db, kept) == "done" and status(db, kept, "rows_done") == 10
    assert status(db, kept, "started_by") == "postgres"
    assert [table for table, _, _ in queue(db)] == ["open.kept"]


@pytest.mark.parametrize("way", ["partitioned table moved into the schema", "added under a lock it holds",
                                 "rows committed after a repeatable read snapshot"])
def test_a_table_that_holds_rows_is_never_skipped_as_empty(cluster, db, pipeline, way):
    """Emptiness is judged by the leaves' storage under this transaction's own ACCESS EXCLUSIVE
    locks, never by a read: a partitioned table's rows are in its partitions, a lock does not
    make a table empty, and a REPEATABLE READ statement's snapshot misses rows that exist."""
    db.execute("ALTER PUBLICATION shop SET (publish_via_partition_root = true)")
    db.execute("""CREATE TABLE parted (id bigint PRIMARY KEY, payload text) PARTITION BY RANGE (id);
                  CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (1000000);
                  INSERT INTO parted SELECT g, md5(g::text) FROM generate_series(1, 2000) g;
                  CREATE TABLE plain (id bigint PRIMARY KEY, payload text)""")
    db.execute("SELECT backfill_follow('shop', 'cdc')")
    if way == "partitioned table moved into the schema":
        db.execute("CREATE SCHEMA sales; ALTER PUBLICATION shop ADD TABLES IN SCHEMA sales")
        db.execute("ALTER TABLE parted SET SCHEMA sales")
        table = "sales.parted"
    elif way == "added under a lock it holds":
        with cluster.connect(db.info.dbname) as conn:
            with conn.transaction():
                conn.execute("LOCK TABLE parted IN ACCESS EXCLUSIVE MODE")
                conn.execute("ALTER PUBLICATION shop ADD TABLE parted")
        table = "public.parted"
    else:
        with cluster.connect(db.info.dbname) as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            conn.execute("SELECT count(*) FROM plain")
            db.execute("INSERT INTO plain SELECT g, md5(g::text) FROM generate_series(1, 2000) g")
            conn.execute("LOCK TABLE plain IN ACCESS EXCLUSIVE MODE")
            conn.execute("ALTER PUBLICATION shop ADD TABLE plain")
            conn.execute("COMMIT")
        table = "public.plain"
    backfill_id = backfill_of(db, table)
    assert wait_until_ended(db, backfill_id) == "done"
    assert status(db, backfill_id, "rows_done") == 2000


def test_a_new_partition_or_table_created_empty_is_skipped(db, pipeline, schema_creator):
    """What the statement created, and holds locked, with no page: nothing to backfill."""
    _, conn = schema_creator
    db.execute("SELECT backfill_follow('shop', 'cdc')")
    conn.execute("CREATE TABLE open.fresh (id int PRIMARY KEY)")
    assert queue(db) == [("open.fresh", "skipped", "empty when added")]


def test_two_statements_at_once_each_see_the_others_change(cluster, db, pipeline):
    """One statement takes a table out of the followed publication while another, at the same
    time, adds one: the follow knows both changes (the second waits for the first's lock and
    reads what it committed), so the table taken out and later added back is backfilled."""
    make_table(db, "x", rows=300)
    db.execute("CREATE SCHEMA sales; ALTER PUBLICATION shop ADD TABLE x, TABLES IN SCHEMA sales")
    db.execute("SELECT backfill_follow('shop', 'cdc')")
    first = cluster.connect(db.info.dbname)
    first.execute("BEGIN")
    first.execute("ALTER PUBLICATION shop DROP TABLE x")
    second_pid, errors = [], []

    def add_a_table():
        try:
            with cluster.connect(db.info.dbname) as second:
                second_pid.append(second.info.backend_pid)
                second.execute("CREATE TABLE sales.b AS SELECT g::int AS id FROM generate_series(1, 10) g")
        except psycopg.Error as e:
            errors.append(e)

    adding = threading.Thread(target=add_a_table)
    adding.start()
    wait_for(lambda: second_pid and db.execute(
        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", second_pid).fetchone()[0],
        what="the second statement to wait for the first's lock")
    first.execute("COMMIT")
    first.close()
    adding.join(30)
    assert errors == [] and not adding.is_alive()
    db.execute("ALTER PUBLICATION shop ADD TABLE x")
    x = backfill_of(db, "public.x")
    assert wait_until_ended(db, x) == "done" and status(db, x, "rows_done") == 300


def test_ddl_needs_no_grant_of_pg_backfill(db, pipeline, roles):
    """With EXECUTE on every function of schema backfill revoked from PUBLIC (as
    backfill_security_check() once advised), a role with no grant creates, alters and drops its
    tables, with a follow live or none."""
    db.execute("REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA backfill FROM PUBLIC")
    role = roles.create("nogrants")
    db.execute(f"CREATE SCHEMA own AUTHORIZATION {role}")
    conn = roles.connect(role)
    conn.execute("CREATE TABLE own.t (id int PRIMARY KEY); ALTER TABLE own.t ADD COLUMN v int; DROP TABLE own.t")
    db.execute("SELECT backfill_follow('shop', 'cdc')")
    conn.execute("CREATE TABLE own.t (id int PRIMARY KEY); ALTER TABLE own.t ADD COLUMN v int; DROP TABLE own.t")
    conn.execute("CREATE TEMP TABLE scratch AS SELECT 1 AS one")


@pytest.mark.exclusive
@pytest.mark.skipif(bool(__import__("conftest").PG_ROOT), reason="the server's library is inside its Debian root")
def test_ddl_without_the_library_while_no_follow_is_live(db):
    """The package removed (its library gone) leaves DDL working in a database that has the
    extension and no live follow: the event trigger calls into the library only for a follow."""
    library = db.execute("SELECT setting FROM pg_config WHERE name = 'PKGLIBDIR'").fetchone()[0] + "/pg_backfill.so"
    import os

    os.rename(library, library + ".away")
    try:
        db.execute("CREATE TABLE t (id int PRIMARY KEY); ALTER TABLE t ADD COLUMN v int; DROP TABLE t")
        db.execute("CREATE TEMP TABLE scratch AS SELECT 1 AS one")
    finally:
        os.rename(library + ".away", library)


def test_an_alter_table_of_a_table_the_follow_knows_reads_no_publication(cluster, db, pipeline):
    """With a FOR ALL TABLES follow, an ALTER TABLE of a table the follow knows reads only the
    statement's own commands: no scan of pg_class (which listing every table of a FOR ALL TABLES
    publication is), however many tables the database has. bench/README gives its time."""
    for i in range(20):
        db.execute(f"CREATE TABLE filler_{i} (id int PRIMARY KEY)")
    db.execute("CREATE PUBLICATION everything FOR ALL TABLES")
    db.execute("SELECT pg_create_logical_replication_slot('everything_slot', 'pgoutput')")
    def scans_of_pg_class_by(conn, statement):
        with conn.transaction():
            conn.execute(statement)
            return conn.execute("SELECT seq_scan, seq_tup_read FROM pg_stat_xact_sys_tables"
                                " WHERE relid = 'pg_catalog.pg_class'::regclass").fetchone()

    try:
        db.execute("SELECT backfill_follow('everything', 'everything_slot')")
        with cluster.connect(db.info.dbname) as conn:
            # (The session's first statement through the event trigger fills its caches.)
            scans_of_pg_class_by(conn, "ALTER TABLE filler_3 ADD COLUMN v int")
            assert scans_of_pg_class_by(conn, "ALTER TABLE filler_4 ADD COLUMN v int") == (0, 0)
    finally:
        db.execute("SELECT backfill_unfollow('everything', 'everything_slot')")
        db.execute("SELECT pg_drop_replication_slot('everything_slot')")


def test_backfill_follow_wait_returns_the_backfill_once_started(db, pipeline, roles):
    """The backfill of a table added starts once the statement commits: backfill_follow_wait()
    waits for that and names it; in the statement's own transaction it would wait for ever (55000);
    a table queued behind a running backfill times out (57014); NULL, a follow that does not
    exist and a role that is not its creator are refused as backfill_unfollow() refuses them."""
    make_table(db, "a", rows=2000)
    make_table(db, "b", rows=10)
    db.execute("SELECT backfill_follow('shop', 'cdc', batch_size => 50, rows_per_second => 100)")
    db.execute("ALTER PUBLICATION shop ADD TABLE a")
    a = db.execute("SELECT backfill_follow_wait('shop', 'cdc')").fetchone()[0]
    assert a == backfill_of(db, "public.a") and status(db, a, "tables") == ["a"]
    with db.transaction():
        db.execute("ALTER PUBLICATION shop ADD TABLE b")
        e = error_of(db, "SELECT backfill_follow_wait('shop', 'cdc')")
        assert e.sqlstate == "55000" and "commits" in e.diag.message_primary, e
        raise psycopg.Rollback()
    db.execute("ALTER PUBLICATION shop ADD TABLE b")
    e = error_of(db, "SELECT backfill_follow_wait('shop', 'cdc', interval '200 milliseconds')")
    assert e.sqlstate == "57014" and e.diag.message_hint and "1 of them" in e.diag.message_detail, e
    assert error_of(db, "SELECT backfill_follow_wait(NULL, 'cdc')").sqlstate == "22004"
    assert error_of(db, "SELECT backfill_follow_wait('shop', 'nope')").sqlstate == "42704"
    role = roles.create("other", "operator")
    e = error_of(roles.connect(role), "SELECT backfill_follow_wait('shop', 'cdc')")
    assert e.sqlstate == "42501", e
    db.execute("SELECT backfill_cancel(%s)", [a])
    b = db.execute("SELECT backfill_follow_wait('shop', 'cdc')").fetchone()[0]
    assert status(db, b, "tables") == ["b"] and wait_until_ended(db, b) == "done"


@pytest.mark.skipif(__import__("conftest").PG_MAJOR < 17, reason="interval 'infinity' is new in PostgreSQL 17")
def test_an_infinite_or_negative_timeout_is_a_timeout_not_an_internal_error(db, pipeline):
    """backfill_wait() and backfill_follow_wait() take interval 'infinity' as no timeout (its epoch
    is infinite: no internal error), and a negative one as a timeout already past."""
    make_table(db, "a", rows=10)
    db.execute("SELECT backfill_follow('shop', 'cdc')")
    assert db.execute("SELECT backfill_follow_wait('shop', 'cdc', 'infinity')").fetchone() == (None,)
    db.execute("ALTER PUBLICATION shop ADD TABLE a")
    a = db.execute("SELECT backfill_follow_wait('shop', 'cdc', 'infinity')").fetchone()[0]
    assert db.execute("SELECT backfill_wait(%s, 'infinity')", [a]).fetchone() == (True,)
    make_table(db, "b", rows=2000)
    db.execute("SELECT backfill_start('b', confirm => true, rows_per_second => 100)")
    assert db.execute("SELECT backfill_wait(id, '-1 hour') FROM backfill_status WHERE tables = '{b}'").fetchone() == (False,)
