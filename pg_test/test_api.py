"""The SQL API: estimates, the confirm step, the views, and every error a user can cause."""

import re
import time
from pathlib import Path

import psycopg
import pytest
from conftest import PG_MAJOR, ROOT, error_of, status, wait_for, wait_until_ended, worker_pid


@pytest.fixture
def orders(db):
    db.execute(
        """CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL, amount numeric(12,2),
                                created_at timestamptz NOT NULL DEFAULT now());
           INSERT INTO orders SELECT g, 'customer ' || g, g * 1.25 FROM generate_series(1, 5000) g;
           ANALYZE orders;"""
    )
    return db


def test_estimate_reports_rows_bytes_pages_and_key(orders):
    row = orders.execute(
        "SELECT table_name::text, eligible, reason, key_columns::text[], rows_estimated, bytes_estimated, pages "
        "FROM backfill_estimate('orders', batch_size => 1000)"
    ).fetchone()
    table, eligible, reason, key, rows, estimated_bytes, pages = row
    assert (table, eligible, reason, key, rows, pages) == ("orders", True, None, ["id"], 5000, 5)
    # The estimate is of the message payload a backfill then really delivers.
    backfill_id = orders.execute("SELECT backfill_start('orders', confirm => true)").fetchone()[0]
    assert wait_until_ended(orders, backfill_id) == "done"
    delivered = orders.execute("SELECT bytes_done FROM backfill_tables WHERE backfill_id = %s", [backfill_id]).fetchone()[0]
    assert 0.8 * delivered < estimated_bytes < 1.2 * delivered


def test_estimate_explains_each_ineligible_table(orders):
    orders.execute(
        """CREATE TABLE no_key (a int); CREATE VIEW v AS SELECT 1 AS x;
           CREATE UNLOGGED TABLE scratch (id int PRIMARY KEY);"""
    )
    rows = dict(
        orders.execute(
            "SELECT table_name::text, reason FROM backfill_estimate(ARRAY['no_key', 'v', 'scratch', 'orders']::regclass[])"
        ).fetchall()
    )
    assert "no primary key and no replica identity index" in rows["no_key"]
    assert "view" in rows["v"]
    assert "unlogged" in rows["scratch"]
    assert rows["orders"] is None


@pytest.mark.skipif(PG_MAJOR < 18, reason="temporal primary keys (WITHOUT OVERLAPS) are new in PostgreSQL 18")
def test_a_key_index_that_is_not_a_btree_is_refused(orders):
    """A temporal primary key is a GiST index, which keeps no order: every page would sort the
    whole table (0.9.0 took it, and crawled at 19 rows a second). The estimate, a start, a
    keyed start and verification refuse it (0A000), naming the table and the index, and such an
    index as a table's replica identity too."""
    orders.execute(
        """CREATE TABLE booking (room int4range, during tstzrange, note text, PRIMARY KEY (room, during WITHOUT OVERLAPS));
           INSERT INTO booking SELECT int4range(g, g + 1), tstzrange(now(), NULL), 'n' FROM generate_series(1, 100) g;
           CREATE TABLE booking_copy (LIKE booking INCLUDING ALL);"""
    )
    (eligible, reason), = orders.execute("SELECT eligible, reason FROM backfill_estimate('booking')").fetchall()
    assert not eligible and "key index booking_pkey is a gist index, not a btree index" in reason, reason
    for sql in ("SELECT backfill_start('booking', confirm => true)",
                """SELECT backfill_start('booking', confirm => true, keys => '[{"room": "[1,2)", "during": "[2020-01-01,)"}]')""",
                "SELECT * FROM backfill_checksum('booking')",
                "SELECT * FROM backfill_compare('booking', 'booking_copy')",
                "SELECT backfill_repair('booking', 'booking_copy', confirm => true)"):
        e = error_of(orders, sql)
        assert e.sqlstate == "0A000", (sql, e.sqlstate, e.diag.message_primary)
        assert "booking" in e.diag.message_primary, sql
        assert "booking_pkey is a gist index" in e.diag.message_detail and "btree" in e.diag.message_hint, sql
    assert orders.execute("SELECT count(*) FROM backfill_status").fetchone()[0] == 0
    # The same index as the replica identity of a table without a primary key (18 takes it).
    orders.execute(
        """CREATE TABLE stay (room int4range NOT NULL, during tstzrange NOT NULL, UNIQUE (room, during WITHOUT OVERLAPS));
           ALTER TABLE stay REPLICA IDENTITY USING INDEX stay_room_during_key;"""
    )
    (eligible, reason), = orders.execute("SELECT eligible, reason FROM backfill_estimate('stay')").fetchall()
    assert not eligible and "key index stay_room_during_key is a gist index" in reason, reason
    e = error_of(orders, "SELECT * FROM backfill_checksum('stay')")
    assert e.sqlstate == "0A000" and "stay_room_during_key" in e.diag.message_detail


def test_start_without_confirm_states_the_estimate_and_how_to_confirm(orders):
    e = error_of(orders, "SELECT backfill_start('orders')")
    assert e.sqlstate == "22023"
    assert "confirm => true" in e.diag.message_primary
    assert "5000 rows" in e.diag.message_detail
    assert "backfill_start('orders', confirm => true)" in e.diag.message_hint
    assert orders.execute("SELECT count(*) FROM backfill_status").fetchone()[0] == 0


def test_start_returns_id_and_the_views_show_the_backfill(orders):
    backfill_id = orders.execute("SELECT backfill_start('orders', confirm => true)").fetchone()[0]
    assert wait_until_ended(orders, backfill_id) == "done"
    status = orders.execute(
        "SELECT state, tables::text[], rows_done, rows_estimated, percent_done, started_by, finished_at IS NOT NULL "
        "FROM backfill_status WHERE id = %s",
        [backfill_id],
    ).fetchone()
    assert status == ("done", ["orders"], 5000, 5000, 100, "postgres", True)
    table = orders.execute(
        "SELECT table_name::text, state, key_columns::text[], cursor, upper_bound, rows_done FROM backfill_tables "
        "WHERE backfill_id = %s",
        [backfill_id],
    ).fetchone()
    assert table == ("orders", "done", ["id"], ["5000"], ["5000"], 5000)


def test_start_is_all_or_nothing(orders):
    orders.execute("CREATE TABLE no_key (a int)")
    e = error_of(orders, "SELECT backfill_start(ARRAY['orders', 'no_key']::regclass[], confirm => true)")
    assert e.sqlstate == "55000"
    assert "no_key" in e.diag.message_primary
    assert "no primary key" in e.diag.message_detail
    assert "REPLICA IDENTITY USING INDEX" in e.diag.message_hint
    assert orders.execute("SELECT count(*) FROM backfill.job").fetchone()[0] == 0


@pytest.mark.parametrize(
    "setup, call, sqlstate, words",
    [
        ("", "SELECT backfill_start('nope', confirm => true)", "42P01", "does not exist"),
        ("CREATE VIEW v AS SELECT 1", "SELECT backfill_start('v', confirm => true)", "42809", "view"),
        ("CREATE MATERIALIZED VIEW mv AS SELECT 1 AS x", "SELECT backfill_start('mv', confirm => true)", "42809", "materialized view"),
        ("CREATE TABLE nk (a int)", "SELECT backfill_start('nk', confirm => true)", "55000", "no primary key"),
        ("CREATE UNLOGGED TABLE u (id int PRIMARY KEY)", "SELECT backfill_start('u', confirm => true)", "55000", "unlogged"),
        ("CREATE TEMP TABLE tt (id int PRIMARY KEY)", "SELECT backfill_start('tt', confirm => true)", "55000", "temporary"),
        ("", "SELECT backfill_start('pg_class', confirm => true)", "42809", "system"),
        ("", "SELECT backfill_start('orders', confirm => true, batch_size => 0)", "22023", "batch_size"),
        ("", "SELECT backfill_start('orders', confirm => true, batch_size => 1000000)", "22023", "batch_size"),
        ("", "SELECT backfill_start('orders', confirm => true, rows_per_second => -1)", "22023", "rows_per_second"),
        ("", "SELECT backfill_start('orders', confirm => true, parallel => 0)", "22023", "parallel"),
        ("", "SELECT backfill_start('orders', confirm => true, parallel => 17)", "22023", "parallel"),
        ("", "SELECT backfill_start(ARRAY[]::regclass[], confirm => true)", "22023", "no table"),
        ("", "SELECT backfill_start(ARRAY['orders', 'orders']::regclass[], confirm => true)", "22023", "twice"),
        ("", "SELECT backfill_start(ARRAY['orders', NULL]::regclass[], confirm => true)", "22004", "NULL"),
        ("", "SELECT backfill_cancel(424242)", "42704", "does not exist"),
        ("", "SELECT backfill_resume(424242)", "42704", "does not exist"),
        ("", "SELECT backfill_pause(424242)", "42704", "does not exist"),
        ("", "SELECT backfill_set(424242, batch_size => 10)", "42704", "does not exist"),
        ("", "SELECT backfill_wait(424242)", "42704", "does not exist"),
    ],
)
def test_bad_input_gets_a_clear_error(orders, setup, call, sqlstate, words):
    if setup:
        orders.execute(setup)
    e = error_of(orders, call)
    assert e.sqlstate == sqlstate, e.diag.message_primary
    text = " ".join(filter(None, [e.diag.message_primary, e.diag.message_detail]))
    assert words in text
    assert "panic" not in text.lower() and "internal" not in text.lower()


def test_operator_without_select_cannot_start(orders, roles):
    reader_less = roles.connect(roles.create("reader_less", "operator"))
    e = error_of(reader_less, "SELECT backfill_start('orders', confirm => true)")
    assert e.sqlstate == "42501"
    assert "GRANT SELECT ON public.orders" in e.diag.message_hint


def test_operator_with_select_and_update_starts_and_only_it_may_cancel(orders, roles):
    starter, other = roles.create("starter", "operator"), roles.create("other", "operator")
    orders.execute(f"GRANT SELECT, UPDATE ON orders TO {starter}")
    as_starter, as_other = roles.connect(starter), roles.connect(other)
    backfill_id = as_starter.execute(
        "SELECT backfill_start('orders', confirm => true, rows_per_second => 100)"
    ).fetchone()[0]
    e = error_of(as_other, "SELECT backfill_cancel(%s)", [backfill_id])
    assert e.sqlstate == "42501" and starter in e.diag.message_detail
    as_starter.execute("SELECT backfill_cancel(%s)", [backfill_id])
    assert wait_until_ended(orders, backfill_id) == "cancelled"


def test_second_backfill_of_a_running_table_is_refused(orders):
    first = orders.execute("SELECT backfill_start('orders', confirm => true, rows_per_second => 100)").fetchone()[0]
    e = error_of(orders, "SELECT backfill_start('orders', confirm => true)")
    assert e.sqlstate == "55006"
    assert f"Backfill {first}" in e.diag.message_detail
    assert f"backfill_cancel({first})" in e.diag.message_hint
    orders.execute("SELECT backfill_cancel(%s)", [first])


def test_cancelling_a_finished_backfill_is_an_error(orders):
    backfill_id = orders.execute("SELECT backfill_start('orders', confirm => true)").fetchone()[0]
    assert wait_until_ended(orders, backfill_id) == "done"
    e = error_of(orders, "SELECT backfill_cancel(%s)", [backfill_id])
    assert e.sqlstate == "55000"
    assert "done" in e.diag.message_detail


def cluster_connection(conn):
    """Another connection to the database of `conn`, as its user."""
    return psycopg.connect(host="127.0.0.1", port=conn.info.port, user=conn.info.user, dbname=conn.info.dbname, autocommit=True)


def test_a_worker_waits_for_the_transaction_that_starts_it(orders):
    """A worker is registered at once, but the backfill's row commits with the caller's
    transaction: a worker that looked before the commit would find nothing and exit, leaving a
    running backfill with no worker. It waits: committed, it runs; rolled back, it exits."""
    orders.execute("BEGIN")
    backfill_id = orders.execute("SELECT backfill_start('orders', confirm => true)").fetchone()[0]
    time.sleep(1.5)  # the worker is up long before the commit
    orders.execute("COMMIT")
    assert wait_until_ended(orders, backfill_id) == "done"
    assert status(orders, backfill_id, "rows_done") == orders.execute("SELECT count(*) FROM orders").fetchone()[0]

    # Rolled back, the backfill's row never existed: its worker, seen waiting in
    # pg_stat_activity (the view has no row for it to show), exits.
    orders.execute("BEGIN")
    rolled_back = orders.execute("SELECT backfill_start('orders', confirm => true)").fetchone()[0]
    workers = """SELECT count(*) FROM pg_stat_activity
                  WHERE backend_type = 'pg_backfill' AND application_name ~ ('^pg_backfill (starting )?' || %s || '( |$)')"""
    with cluster_connection(orders) as watcher:
        wait_for(lambda: watcher.execute(workers, [rolled_back]).fetchone()[0] == 1, timeout=5, what="the worker to wait")
        orders.execute("ROLLBACK")
        wait_for(lambda: watcher.execute(workers, [rolled_back]).fetchone()[0] == 0, timeout=5, what="the worker to exit")
    assert orders.execute("SELECT count(*) FROM backfill_status WHERE id = %s", [rolled_back]).fetchone()[0] == 0


@pytest.mark.cluster
def test_wal_level_must_be_logical(cluster):
    from conftest import extra_cluster

    replica = extra_cluster(cluster, "replica")
    replica.start("wal_level = replica")
    try:
        with replica.connect() as conn:
            conn.execute("CREATE EXTENSION pg_backfill; CREATE TABLE t (id int PRIMARY KEY)")
            e = error_of(conn, "SELECT backfill_start('t', confirm => true)")
            assert e.sqlstate == "55000"
            assert "replica" in e.diag.message_detail
            assert "wal_level = logical" in e.diag.message_hint
            # The estimate, a dry run, says so too, as a reason: it raises no error a script would stop on.
            eligible, reason = conn.execute("SELECT eligible, reason FROM backfill_estimate('t')").fetchone()
            assert eligible is False and "wal_level" in reason and "replica" in reason, reason
    finally:
        replica.stop()


def test_reading_the_views_writes_nothing(orders):
    backfill_id = orders.execute("SELECT backfill_start('orders', confirm => true)").fetchone()[0]
    assert wait_until_ended(orders, backfill_id) == "done"
    with orders.transaction():
        orders.execute("SELECT * FROM backfill_status").fetchall()
        orders.execute("SELECT * FROM backfill_tables").fetchall()
        orders.execute("SELECT backfill_wait(%s)", [backfill_id])
        # No transaction id: no commit record, and it works on a standby as well.
        assert orders.execute("SELECT pg_current_xact_id_if_assigned()").fetchone()[0] is None


def line_of(path, text):
    """The line of src/<path> that holds `text` (once)."""
    lines = [i for i, line in enumerate((ROOT / "src" / path).read_text().splitlines(), 1) if text in line]
    assert len(lines) == 1, (path, text, lines)
    return lines[0]


def test_an_error_reports_where_it_was_raised(orders):
    """A DBA's LOCATION line points at the code that raised the error, also when a helper
    raised it on its caller's behalf (an argument that must not be NULL, an internal error)."""
    cases = [
        ("SELECT backfill_start('orders')", "22023", "worker/admit.rs", None),
        ("SELECT backfill_start('orders', confirm => NULL)", "22004", "api/request.rs",
         'confirm: required(args.confirm, CALL, "confirm"),'),
        ("SELECT backfill_cancel(NULL)", "22004", "api/control.rs", 'required(id, "backfill_cancel", "id")'),
    ]
    # (PostgreSQL reports a file's name without its folders.)
    for sql, sqlstate, path, call in cases:
        e = error_of(orders, sql)
        assert e.sqlstate == sqlstate and e.diag.source_file == path.split("/")[-1], (sql, e.sqlstate, e.diag.source_file)
        if call:
            assert int(e.diag.source_line) == line_of(path, call), (sql, e.diag.source_line)
    # (or_internal's errors, which no user can cause, are checked by a unit test in pg/errors.rs.)


@pytest.mark.parametrize("option", ["rows_per_message => 0", "max_replica_lag => -5", "keys => '[]'",
                                    "keys => '[{\"id\": 1}]', filter => 'id > 0'",
                                    "keys => '[{\"id\": 1}]', parallel => 2"])
def test_a_request_is_checked_whole_before_anything_is_written(orders, option):
    """backfill_start() checks every option before it records the backfill: a refused one takes
    no backfill id and registers no worker. (Before 0.10.0, rows_per_message, the limits on the
    source and keys were checked by links chained after the backfill was recorded: each refusal
    took an id.)"""
    first = orders.execute("SELECT backfill_start('orders', confirm => true)").fetchone()[0]
    assert wait_until_ended(orders, first) == "done"
    e = error_of(orders, f"SELECT backfill_start('orders', confirm => true, {option})")
    assert e.sqlstate == "22023", e
    assert e.diag.message_detail and e.diag.message_hint, e
    second = orders.execute("SELECT backfill_start('orders', confirm => true)").fetchone()[0]
    assert second == first + 1, "a refused request took a backfill id"
    assert wait_until_ended(orders, second) == "done"


@pytest.mark.parametrize("call", [
    "backfill_start('orders', rows_per_second => 2000, batch_size => 250, filter => 'amount > 10 AND customer <> ''x''', "
    "columns => ARRAY['id', 'amount'], rows_per_message => 50, max_active_sessions => 8, parallel => 2)",
    "backfill_start(ARRAY['orders', 'more']::regclass[], batch_size => 500)",
])
def test_the_confirm_hint_is_the_callers_command_with_confirm(orders, call):
    """The hint of a start without confirm => true is the caller's command with confirm => true,
    every argument as given: pasted, it starts the backfill that was asked for. (Before, it was
    backfill_start('orders', confirm => true) whatever was given, an unpaced, unfiltered,
    all-columns backfill; for several tables, ARRAY[...], which cannot be pasted.)"""
    orders.execute("CREATE TABLE more (id int PRIMARY KEY); INSERT INTO more SELECT generate_series(1, 10)")
    e = error_of(orders, f"SELECT {call}")
    assert e.sqlstate == "22023", e
    hint = e.diag.message_hint
    assert hint.startswith("Review the estimate, then run: SELECT backfill_start("), hint
    command = hint.removeprefix("Review the estimate, then run: ")
    backfill_id = orders.execute(command).fetchone()[0]
    asked = orders.execute(
        "SELECT rows_per_second, batch_size, row_filter, rows_per_message, max_active_sessions, parallel, tables::text[] "
        "FROM backfill_status WHERE id = %s", [backfill_id]).fetchone()
    wait_until_ended(orders, backfill_id)
    orders.execute("BEGIN")
    # The same call with confirm => true, undone: what the caller asked for.
    expected_id = orders.execute(f"SELECT {call[:-1]}, confirm => true)").fetchone()[0]
    given = orders.execute(
        "SELECT rows_per_second, batch_size, row_filter, rows_per_message, max_active_sessions, parallel, tables::text[] "
        "FROM backfill_status WHERE id = %s", [expected_id]).fetchone()
    orders.execute("ROLLBACK")
    assert asked == given, (command, asked, given)


@pytest.mark.parametrize("setting, bad, good", [
    ("backfill.lock_mode", "bogus", "table"),
    ("backfill.message_prefix", "", "etl"),
    ("backfill.message_prefix", "x" * 65, "x" * 64),
    ("backfill.message_prefix", "caf\u00e9", "cafe"),
])
def test_an_invalid_setting_is_refused_when_set(orders, setting, bad, good):
    """A setting with a set of valid values refuses any other when it is set (SET, ALTER SYSTEM,
    postgresql.conf), not at the next backfill_start()."""
    orders.execute("LOAD 'pg_backfill'")
    e = error_of(orders, f"SET {setting} = '{bad}'")
    assert e.sqlstate == "22023", e
    assert setting in e.diag.message_primary, e
    assert e.diag.message_hint, e
    orders.execute(f"SET {setting} = '{good}'")
    assert orders.execute(f"SHOW {setting}").fetchone()[0] == good
    e = error_of(orders, f"ALTER SYSTEM SET {setting} = '{bad}'")
    assert e.sqlstate == "22023", e


def test_rows_per_second_0_means_no_limit_at_start_as_in_backfill_set(orders):
    """rows_per_second => 0 removes the rate limit in backfill_set(); it means the same in
    backfill_start() (before, it was refused there as out of range)."""
    started = orders.execute("SELECT backfill_start('orders', confirm => true, rows_per_second => 0)").fetchone()[0]
    assert status(orders, started, "rows_per_second") is None
    assert wait_until_ended(orders, started) == "done"
    paced = orders.execute("SELECT backfill_start('orders', confirm => true, rows_per_second => 10)").fetchone()[0]
    orders.execute("SELECT backfill_set(%s, rows_per_second => 0)", [paced])
    assert status(orders, paced, "rows_per_second") is None
    assert wait_until_ended(orders, paced) == "done"


def test_a_paced_start_shows_rows_and_a_rate_from_its_first_page_and_time_left_follows_the_rate(cluster, orders):
    """At rows_per_second => 2000, the first page is a tenth of a second of the rate (not a whole
    batch, half a second), and the first rows the view shows come with a rate and a time left:
    the worker samples its progress before its first page. time_left is the rows left at the
    recent rate: the start does not drag it down."""
    orders.execute("INSERT INTO orders SELECT g, 'c', 1 FROM generate_series(5001, 40000) g; ANALYZE orders")
    orders.execute("ALTER SYSTEM SET backfill.log_interval = 1")
    orders.execute("SELECT pg_reload_conf()")
    backfill_id = orders.execute("SELECT backfill_start('orders', confirm => true, rows_per_second => 2000)").fetchone()[0]
    started = time.monotonic()
    query = ("SELECT rows_done, rows_per_second_last_minute, extract(epoch FROM time_left), rows_estimated "
             "FROM backfill_status WHERE id = %s AND rows_done > 0")
    first = wait_for(lambda: orders.execute(query, [backfill_id]).fetchone(), what="the first rows")
    print(f"first rows after {time.monotonic() - started:.2f} s: {first}")
    assert first[1] is not None and first[2] is not None, first
    first_page = orders.execute("SELECT min(rows_done) FROM backfill.job_progress WHERE job_id = %s AND rows_done > 0",
                                [backfill_id]).fetchone()[0]
    assert first_page <= 200, first_page
    # The rate the test sees over two seconds, 11 s in, against the time left the view shows then
    # (at the rate of the last 10 seconds: the start no longer counts).
    time.sleep(max(0.0, started + 11 - time.monotonic()))
    rows_before, at_before = status(orders, backfill_id, "rows_done"), time.monotonic()
    time.sleep(2)
    rows, _, time_left, expected = orders.execute(query, [backfill_id]).fetchone()
    rate = (rows - rows_before) / (time.monotonic() - at_before)
    print(f"rate {rate:.0f} rows/s, {expected - rows} rows left, time_left {time_left} s")
    assert abs(float(time_left) - (expected - rows) / rate) < 0.15 * (expected - rows) / rate, (time_left, rate)
    orders.execute("SELECT backfill_cancel(%s)", [backfill_id])
    orders.execute("ALTER SYSTEM RESET backfill.log_interval")
    orders.execute("SELECT pg_reload_conf()")
    # The log counts rows, as the view does: the percentage of rows done, not of the key range.
    lines = [line for line in (Path(cluster.dir) / "server.log").read_text().splitlines()
             if f"pg_backfill {backfill_id} " in line and "of about" in line]
    assert lines, "no progress line"
    for line in lines:
        percent, done, about = re.search(r"([0-9.]+)% \(([0-9]+) of about ([0-9]+) rows\)", line).groups()
        assert float(percent) == int(1000 * int(done) / int(about)) / 10, line


DONE = ("SELECT backfill_start('orders', confirm => true)", "SELECT backfill_wait(1)")


@pytest.mark.parametrize("setup, call", [
    ((), "SELECT backfill_start(ARRAY['orders', NULL]::regclass[], confirm => true)"),
    ((), "SELECT backfill_start('orders', confirm => true, columns => ARRAY['id', NULL])"),
    (("SELECT pg_create_logical_replication_slot('s', 'pgoutput')",),
     "SELECT backfill_start('orders', confirm => true, publication => 'nope', slot => 's')"),
    (("SELECT pg_create_physical_replication_slot('phys')",), "SELECT backfill_start('orders', confirm => true, slot => 'phys')"),
    ((), "SELECT backfill_start('orders', confirm => true, keys => '[{\"nope\": 1}]')"),
    (("CREATE TABLE copy (customer text PRIMARY KEY, id bigint)",), "SELECT * FROM backfill_compare('orders', 'copy', slot => '')"),
    ((), "SELECT backfill.row_hash(1)"),
    (DONE, "SELECT backfill_cancel(1)"),
    (DONE, "SELECT backfill_pause(1)"),
    (DONE, "SELECT backfill_resume(1)"),
    (("SELECT backfill_start('orders', confirm => true, rows_per_second => 10)",), "SELECT backfill_set(1, max_lag => 1000000)"),
])
def test_every_error_a_user_causes_has_a_hint(orders, setup, call):
    """docs/reference.md promises a hint with every error a user can cause; these had none (issue 35)."""
    for statement in setup:
        orders.execute(statement)
    e = error_of(orders, call)
    assert e.diag.message_detail and e.diag.message_hint, (e.sqlstate, e.diag.message_primary)
    orders.execute("SELECT backfill_cancel(id) FROM backfill_status WHERE state IN ('running', 'paused')")
    orders.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name IN ('phys', 's')")
