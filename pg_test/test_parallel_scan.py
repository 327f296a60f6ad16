"""The count and hash levels in parallel: PostgreSQL's parallel workers and the calling backend
share one parallel scan of the table. Their counts and sums are those of the serial queries,
range by range, for every
column type and key width; the cases the serial scan keeps (row-level security, temporary
tables, parallel_workers = 0) keep it; an inheritance parent is read without its children;
a cancel, in a transaction or a savepoint, leaves the session usable."""

import json
import re

import psycopg
import pytest
from conftest import PG_MAJOR, error_of
from test_checksum import COLUMNS, FILL

ROWS = 40_000


def make_table(db, table, key_type="integer", rows=ROWS):
    """COLUMNS of test_checksum with `rows` rows, a dropped column, negative keys, and one value
    large enough to be compressed and one stored out of line."""
    columns = ", ".join(f"{name} {type_name}" for name, type_name in COLUMNS.items())
    db.execute(f"CREATE TABLE {table} (id {key_type} PRIMARY KEY, gone int, {columns}, maybe int)")
    db.execute(f"ALTER TABLE {table} DROP COLUMN gone")
    fill = FILL.format(table=table, order="1").replace("generate_series(1, 5000)", f"generate_series(1, {rows})")
    db.execute(fill.replace("SELECT g,", "SELECT g - 100, g,", 1))
    db.execute(f"UPDATE {table} SET t = repeat('long ', 10000) WHERE id = 7")
    db.execute(f"UPDATE {table} SET t = (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 400) g) WHERE id = 8")
    db.execute(f"ANALYZE {table}")


def with_debug(db, sql, params=None):
    """The rows of `sql` and the parallel scan's DEBUG line, if it ran one."""
    lines = []
    handler = lambda diag: lines.append(diag.message_primary)  # noqa: E731
    db.add_notice_handler(handler)
    db.execute("SET client_min_messages = debug1")
    try:
        rows = db.execute(sql, params).fetchall()
    finally:
        db.execute("RESET client_min_messages")
        db.remove_notice_handler(handler)
    return rows, [line for line in lines if "parallel workers" in line]


def checksum_sql(table, level="hash"):
    return f"SELECT * FROM backfill_checksum('{table}', level => '{level}', bounds => %s::jsonb)"


def bounds_for(db, table, ranges=64):
    rows = db.execute(f"SELECT upper FROM backfill_checksum('{table}', ranges => {ranges}, level => 'count')").fetchall()
    return json.dumps([upper for (upper,) in rows if upper is not None])


@pytest.fixture
def parallel(db):
    """Parallel scans of small tables too."""
    db.execute("SET min_parallel_table_scan_size = 0")
    db.execute("SET max_parallel_workers_per_gather = 2")
    return db


@pytest.mark.parametrize("level", ["count", "hash"])
@pytest.mark.parametrize("key_type", ["smallint", "integer", "bigint"])
def test_parallel_workers_sum_what_the_serial_scan_sums(parallel, key_type, level):
    db = parallel
    if level == "count":
        # Narrow rows: the count level reads a table of wide ones by its key's index instead.
        db.execute(f"CREATE TABLE t (id {key_type} PRIMARY KEY, a int)")
        db.execute("INSERT INTO t SELECT g - 100, g FROM generate_series(1, 30000) g")
        db.execute("ANALYZE t")
    else:
        make_table(db, "t", key_type, rows=30_000)
    bounds = bounds_for(db, "t")
    in_parallel, debug = with_debug(db, checksum_sql("t", level), [bounds])
    assert len(debug) == 1, debug
    done = {"count": "counted", "hash": "hashed"}[level]
    pattern = rf"{done} by (\d+) of \d+ parallel workers \((\d+) rows\) and this backend \((\d+) rows\)"
    assert debug[0].startswith(f"pg_backfill: public.t {done} by "), debug  # the table, as its name reads
    launched, by_workers, by_leader = map(int, re.search(pattern, debug[0]).groups())
    # Every row was read once (the workers may start after this backend has read them all).
    assert launched >= 1 and by_workers + by_leader == 30_000, debug
    # The workers alone, as a Gather without its leader.
    db.execute("SET parallel_leader_participation = off")
    by_workers_alone, debug = with_debug(db, checksum_sql("t", level), [bounds])
    assert re.search(pattern, debug[0]).groups()[1:] == ("30000", "0"), debug
    assert by_workers_alone == in_parallel
    db.execute("RESET parallel_leader_participation")
    db.execute("SET max_parallel_workers_per_gather = 0")
    serial, debug = with_debug(db, checksum_sql("t", level), [bounds])
    assert debug == []
    assert in_parallel == serial
    assert sum(rows for _, _, _, rows, _ in serial) == 30_000


def test_the_count_level_reads_the_key_index_of_a_table_of_wide_rows(parallel):
    """More than 8 times the size of its key's index, a table is counted by an index scan per
    range (cheaper than reading its rows); the counts are the same. (Not all-visible: every row
    was just updated. All-visible, it is counted from a parallel scan of that index, below.)"""
    db = parallel
    make_table(db, "t", rows=20_000)
    db.execute("UPDATE t SET t = repeat('w', 500)")
    db.execute("ANALYZE t")
    bounds = bounds_for(db, "t")
    by_index, debug = with_debug(db, checksum_sql("t", "count"), [bounds])
    assert debug == [] and sum(rows for _, _, _, rows, _ in by_index) == 20_000
    hashed, debug = with_debug(db, checksum_sql("t", "hash"), [bounds])
    assert len(debug) == 1 and [r[3] for r in hashed] == [r[3] for r in by_index]


def test_an_all_visible_table_is_counted_from_a_parallel_scan_of_its_key_index(parallel):
    """After a VACUUM (its blocks all-visible), a table is counted from a parallel scan of its
    key's index, as count(*) then reads it (15's plan: reading the table took 4 times as long).
    The counts are the serial ones, with rows deleted, inserted and updated since the VACUUM,
    whose blocks are no longer all-visible: their entries count only for the rows the snapshot
    sees."""
    db = parallel
    db.execute("CREATE TABLE t (id bigint PRIMARY KEY, a int, b text)")
    db.execute("INSERT INTO t SELECT g, g, md5(g::text) FROM generate_series(1, 30000) g")
    db.execute("VACUUM ANALYZE t")
    bounds = bounds_for(db, "t")
    db.execute("DELETE FROM t WHERE id % 97 = 0")
    db.execute("INSERT INTO t SELECT g, g, 'new' FROM generate_series(30001, 30500) g")
    db.execute("UPDATE t SET a = -a WHERE id % 89 = 0")
    expected = db.execute("SELECT count(*) FROM t").fetchone()[0]
    in_parallel, debug = with_debug(db, checksum_sql("t", "count"), [bounds])
    assert len(debug) == 1 and "public.t counted from its key's index by " in debug[0], debug
    assert sum(rows for _, _, _, rows, _ in in_parallel) == expected
    db.execute("SET max_parallel_workers_per_gather = 0")
    serial, debug = with_debug(db, checksum_sql("t", "count"), [bounds])
    assert debug == [] and in_parallel == serial


def scanned_in_parallel(db, table):
    return with_debug(db, f"SELECT sum(rows) FROM backfill_checksum('{table}', ranges => 8, level => 'hash')")


def test_row_level_security_keeps_the_serial_scan(parallel, roles):
    """A policy applies to a query: the parallel scan, which reads the heap, would count rows
    the role may not see (and leak their hashes)."""
    db = parallel
    make_table(db, "t")
    db.execute("ALTER TABLE t ENABLE ROW LEVEL SECURITY")
    db.execute("CREATE POLICY low ON t FOR SELECT USING (id <= 1000)")
    role = roles.create("reader", "operator")
    db.execute(f"GRANT SELECT ON t TO {role}")
    conn = roles.connect(role)
    conn.execute("SET min_parallel_table_scan_size = 0")
    [(rows,)], debug = scanned_in_parallel(conn, "t")
    assert rows == 1000 + 100  # ids -99 to 1000
    assert debug == []


def test_an_inheritance_parent_is_read_without_its_children(parallel):
    """As a backfill reads it (ONLY): a child has keys of its own and is a table of its own.
    (Read with its children, a parent's copy was missing the children's rows.)"""
    db = parallel
    make_table(db, "parent")
    db.execute("CREATE TABLE child () INHERITS (parent)")
    db.execute("INSERT INTO child SELECT * FROM parent WHERE id <= 500")
    db.execute("UPDATE child SET id = id + 1000000")
    db.execute("CREATE TABLE copy (LIKE parent INCLUDING ALL)")
    db.execute("INSERT INTO copy SELECT * FROM ONLY parent")
    bounds = bounds_for(db, "parent")
    in_parallel, debug = with_debug(db, checksum_sql("parent"), [bounds])
    assert sum(rows for _, _, _, rows, _ in in_parallel) == ROWS and len(debug) == 1
    assert db.execute(checksum_sql("copy"), [bounds]).fetchall() == in_parallel
    for level in ("count", "aggregate", "hash"):
        [(rows,)] = db.execute("SELECT sum(rows) FROM backfill_checksum('parent', ranges => 8, level => %s)", [level]).fetchall()
        assert rows == ROWS, level
        assert db.execute("SELECT * FROM backfill_compare('parent', 'copy', level => %s)", [level]).fetchall() == []


def test_a_temporary_table_and_parallel_workers_0_keep_the_serial_scan(parallel):
    db = parallel
    make_table(db, "pg_temp.scratch", rows=20_000)
    [(rows,)], debug = scanned_in_parallel(db, "scratch")
    assert (rows, debug) == (20_000, [])
    make_table(db, "t", rows=20_000)
    db.execute("ALTER TABLE t SET (parallel_workers = 0)")
    [(rows,)], debug = scanned_in_parallel(db, "t")
    assert (rows, debug) == (20_000, [])
    db.execute("ALTER TABLE t RESET (parallel_workers)")
    [(rows,)], debug = scanned_in_parallel(db, "t")
    assert rows == 20_000 and len(debug) == 1


@pytest.mark.skipif(PG_MAJOR < 18, reason="virtual generated columns are new in PostgreSQL 18")
def test_a_virtual_generated_column_is_hashed_as_queries_read_it_on_every_path(parallel):
    """A virtual generated column is computed when a query reads it, and NULL in the stored
    tuples a parallel participant reads: its table is hashed by the serial query at the hash
    level, so that the same bounds give the same checksums whatever the path (0.9.0's parallel
    scan hashed NULL), and a copy whose column is computed otherwise differs."""
    db = parallel
    table = """CREATE TABLE {name} (id integer PRIMARY KEY, a int NOT NULL, v int GENERATED ALWAYS AS ({v}) VIRTUAL,
                                    s int GENERATED ALWAYS AS (a + 1) STORED, note text)"""
    db.execute(table.format(name="t", v="a * 2"))
    db.execute(table.format(name="copy", v="CASE WHEN a % 1000 = 0 THEN a * 3 ELSE a * 2 END"))
    for name in ("t", "copy"):
        db.execute(f"INSERT INTO {name} (id, a, note) SELECT g, g, 'n' || g FROM generate_series(1, 3000) g")
        db.execute(f"ANALYZE {name}")
    bounds = bounds_for(db, "t", ranges=8)
    by_default, debug = with_debug(db, checksum_sql("t"), [bounds])
    assert debug == [], "hashed by the serial query"
    # Counting reads no virtual column: still in parallel.
    assert len(with_debug(db, checksum_sql("t", "count"), [bounds])[1]) == 1
    # The sum of every range's checksum is that of the rows' hashes as a query reads the rows.
    total = db.execute("SELECT sum(backfill.row_hash(t)) FROM t").fetchone()[0]
    assert sum(int(row[4]) for row in by_default) == total
    # (A column list is hashed by the query in any case.)
    columns = db.execute(
        "SELECT * FROM backfill_checksum('t', level => 'hash', bounds => %s::jsonb, columns => ARRAY['v', 'a', 's', 'note'])",
        [bounds],
    ).fetchall()
    db.execute("SET max_parallel_workers_per_gather = 0")
    serial = db.execute(checksum_sql("t"), [bounds]).fetchall()
    assert by_default == serial == columns
    db.execute("RESET max_parallel_workers_per_gather")
    by_copy = db.execute(checksum_sql("copy"), [bounds]).fetchall()
    assert [row[4] != copy[4] for row, copy in zip(by_default, by_copy)].count(True) >= 1
    compared = db.execute("SELECT key->>'id', status FROM backfill_compare('t', 'copy')").fetchall()
    assert sorted(compared) == [("1000", "different"), ("2000", "different"), ("3000", "different")]


def test_a_cancelled_parallel_scan_leaves_the_session_usable(parallel):
    """statement_timeout stops the leader and its workers; in a savepoint, the transaction
    goes on after ROLLBACK TO (parallel mode ends with the subtransaction)."""
    db = parallel
    make_table(db, "t", rows=200_000)
    bounds = bounds_for(db, "t")
    db.execute("SET statement_timeout = '20ms'")
    e = error_of(db, checksum_sql("t"), [bounds])
    assert e.sqlstate == "57014"
    db.execute("RESET statement_timeout")
    expected = db.execute(checksum_sql("t"), [bounds]).fetchall()
    with db.transaction():
        db.execute("SAVEPOINT before")
        db.execute("SET LOCAL statement_timeout = '20ms'")
        with pytest.raises(psycopg.errors.QueryCanceled):
            db.execute(checksum_sql("t"), [bounds])
        db.execute("ROLLBACK TO SAVEPOINT before")
        db.execute("SET LOCAL statement_timeout = 0")
        again, debug = with_debug(db, checksum_sql("t"), [bounds])
        assert again == expected and len(debug) == 1
    assert db.execute(checksum_sql("t"), [bounds]).fetchall() == expected
