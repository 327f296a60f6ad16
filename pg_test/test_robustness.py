"""Robustness: sizes and events that must end in a defined state without taking the server down."""

import os
import signal
import subprocess
import time
from pathlib import Path

import psycopg
import pytest
from conftest import PG_BIN, Consumer, error_of, extra_cluster, status, wait_for, wait_until_ended, worker_pid


def set_system(conn, setting, value):
    conn.execute("LOAD 'pg_backfill'")  # so that ALTER SYSTEM checks the setting's bounds
    conn.execute(f"ALTER SYSTEM SET {setting} = '{value}'")
    conn.execute("SELECT pg_reload_conf()")


@pytest.fixture
def small_messages(db):
    """backfill.max_message_size at 64kB for the test."""
    set_system(db, "backfill.max_message_size", "64kB")
    yield db
    db.execute("ALTER SYSTEM RESET backfill.max_message_size")
    db.execute("SELECT pg_reload_conf()")


def test_a_row_whose_message_passes_the_bound_fails_the_backfill_with_54000(small_messages):
    db = small_messages
    db.execute(
        """CREATE TABLE docs (id int PRIMARY KEY, body text);
           INSERT INTO docs SELECT g, 'small' FROM generate_series(1, 10) g;
           UPDATE docs SET body = repeat('x', 100000) WHERE id = 7;"""
    )
    db.execute("SELECT pg_create_logical_replication_slot('bound', 'test_decoding')")
    backfill_id = db.execute("SELECT backfill_start('docs', confirm => true, batch_size => 3)").fetchone()[0]
    assert wait_until_ended(db, backfill_id) == "failed"
    sqlstate, error = status(db, backfill_id, "last_error_sqlstate", "last_error")
    assert sqlstate == "54000"
    assert "row (7) of table public.docs is too large" in error and "65536" in error
    decoded = [line for (line,) in db.execute("SELECT data FROM pg_logical_slot_get_changes('bound', NULL, NULL)")]
    reads = [line for line in decoded if '"op":"read"' in line]
    # The pages before the row's page were delivered; nothing of the row's page was.
    assert [r.split('"key":{"id":', 1)[1].split("}")[0] for r in reads] == ["1", "2", "3", "4", "5", "6"]
    assert max(len(line) for line in decoded) < 65536


def test_the_bound_cannot_be_raised_past_its_ceiling(db):
    db.execute("LOAD 'pg_backfill'")
    with pytest.raises(psycopg.Error) as caught:
        db.execute("ALTER SYSTEM SET backfill.max_message_size = '512MB'")
    assert caught.value.sqlstate == "22023" and "268435456" in str(caught.value.diag.message_detail or caught.value)
    db.execute("ALTER SYSTEM SET backfill.max_message_size = '256MB'")
    db.execute("ALTER SYSTEM RESET backfill.max_message_size")


@pytest.mark.slow
@pytest.mark.cluster
def test_a_row_of_over_a_gigabyte_leaves_the_server_restartable_and_its_slot_decodable(cluster):
    """The case that once left a server unable to start: a row whose JSON passes 1 GB (six
    200 MB columns) under the default bound, then an immediate stop."""
    other = extra_cluster(cluster, "huge")
    other.start()
    try:
        with other.connect() as conn:
            conn.execute(
                """CREATE EXTENSION pg_backfill;
                   CREATE TABLE huge (id int PRIMARY KEY, a text, b text, c text, d text, e text, f text);
                   INSERT INTO huge VALUES (1, 'small', '', '', '', '', '')"""
            )
            # One column at a time, as a row grows in real life: a tuple formed with all six
            # values untoasted would pass 1 GB itself.
            conn.execute("INSERT INTO huge VALUES (2, '', '', '', '', '', '')")
            for column in "abcdef":
                conn.execute(f"UPDATE huge SET {column} = repeat('x', 200 * 1024 * 1024) WHERE id = 2")
            conn.execute("SELECT pg_create_logical_replication_slot('consumer', 'test_decoding')")
            backfill_id = conn.execute("SELECT backfill_start('huge', confirm => true)").fetchone()[0]
            assert wait_until_ended(conn, backfill_id, timeout=300) == "failed"
            assert status(conn, backfill_id, "last_error_sqlstate") == "54000"
        other.pg_ctl("-m immediate stop")
        other.pg_ctl("start")
        with other.connect() as conn:
            decoded = conn.execute("SELECT data FROM pg_logical_slot_get_changes('consumer', NULL, NULL)").fetchall()
            assert not any('"op":"read"' in line for (line,) in decoded)
            assert any("table_start" in line for (line,) in decoded)
    finally:
        other.stop()




def test_the_estimate_measures_a_value_whose_json_passes_a_gigabyte(db):
    """550 MB of double quotes compress to a few MB, but their JSON (each escaped) is 1.1 GB:
    rendering it to measure it would fail. The estimate takes its length instead."""
    db.execute("CREATE TABLE quotes (id int PRIMARY KEY, body text)")
    db.execute("INSERT INTO quotes VALUES (1, repeat('\"', 550 * 1000 * 1000))")
    stored = db.execute("SELECT pg_column_size(body) FROM quotes").fetchone()[0]
    assert stored < 64 * 1024 * 1024  # compressed: the old guard (64 MB stored) let it be rendered
    eligible, bytes_estimated = db.execute("SELECT eligible, bytes_estimated FROM backfill_estimate('quotes')").fetchone()
    assert eligible and bytes_estimated >= 550 * 1000 * 1000


@pytest.mark.cluster
def test_a_worker_exits_when_the_postmaster_dies(cluster):
    """Every sleep waits with WL_EXIT_ON_PM_DEATH: a worker pacing at 2 rows a second exits at
    once when the postmaster is killed, instead of living on as an orphan."""
    other = extra_cluster(cluster, "pmdeath")
    other.start()
    try:
        with other.connect() as conn:
            conn.execute("CREATE EXTENSION pg_backfill; CREATE TABLE t (id int PRIMARY KEY)")
            conn.execute("INSERT INTO t SELECT generate_series(1, 1000)")
            backfill_id = conn.execute("SELECT backfill_start('t', confirm => true, rows_per_second => 2)").fetchone()[0]
            wait_for(lambda: worker_pid(conn, backfill_id) is not None, what="the worker")
            worker = worker_pid(conn, backfill_id)
        postmaster = int(Path(f"{other.dir}/data/postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGKILL)
        wait_for(lambda: not Path(f"/proc/{worker}").exists(), timeout=5, what="the worker to exit")
    finally:
        other.stop()  # nothing to stop if the postmaster is gone; its other children exit by themselves

@pytest.fixture
def items(db):
    db.execute(
        """CREATE TABLE items (id int PRIMARY KEY, code text NOT NULL UNIQUE, label text);
           INSERT INTO items SELECT g, 'c' || g, 'item ' || g FROM generate_series(1, 2000) g;"""
    )
    return db


@pytest.mark.parametrize(
    "call, argument",
    [
        ("SELECT backfill_start('items', confirm => NULL)", "confirm"),
        ("SELECT backfill_start('items', confirm => true, batch_size => NULL)", "batch_size"),
        ("SELECT backfill_start('items', confirm => true, parallel => NULL)", "parallel"),
        ("SELECT * FROM backfill_estimate('items', batch_size => NULL)", "batch_size"),
        ("SELECT backfill_cancel(NULL)", "id"),
        ("SELECT backfill_pause(NULL)", "id"),
        ("SELECT backfill_resume(NULL)", "id"),
        ("SELECT backfill_set(NULL, batch_size => 10)", "id"),
        ("SELECT backfill_wait(NULL)", "id"),
        ("SELECT backfill_message_valid(NULL, 1)", "content"),
        ("SELECT backfill_message_valid('{}', NULL::bigint)", "xid"),
        ("SELECT backfill_message_valid('{}', NULL::xid)", "xid"),
        ("SELECT backfill_message_valid(NULL, '1'::xid)", "content"),
        ("SELECT backfill_rotate_key(retire_old_keys => NULL)", "retire_old_keys"),
    ],
)
def test_a_null_argument_is_22004_naming_it(items, call, argument):
    e = error_of(items, call)
    assert e.sqlstate == "22004", (call, e)
    assert f"argument {argument} of backfill_" in e.diag.message_primary


def test_a_partition_listed_with_its_partitioned_table_is_refused(db):
    db.execute(
        """CREATE TABLE parent (id int PRIMARY KEY) PARTITION BY RANGE (id);
           CREATE TABLE part_low PARTITION OF parent FOR VALUES FROM (0) TO (100);
           INSERT INTO parent SELECT generate_series(0, 99)"""
    )
    e = error_of(db, "SELECT backfill_start(ARRAY['parent', 'part_low']::regclass[], confirm => true)")
    assert e.sqlstate == "22023"
    assert "part_low is listed with its partitioned table parent" in e.diag.message_primary
    assert db.execute("SELECT count(*) FROM backfill.job").fetchone()[0] == 0


def slow_backfill(db, table="items"):
    backfill_id = db.execute(
        f"SELECT backfill_start('{table}', confirm => true, batch_size => 50, rows_per_second => 500)"
    ).fetchone()[0]
    wait_for(lambda: (status(db, backfill_id, "rows_done") or 0) >= 100, what="a few pages")
    return backfill_id


@pytest.mark.parametrize(
    "change, sqlstate, words",
    [
        ("DROP TABLE items", "42P01", "table public.items was dropped during its backfill"),
        ("ALTER TABLE items SET UNLOGGED", "55000", "table public.items became unlogged during its backfill"),
        (
            "ALTER TABLE items DROP CONSTRAINT items_pkey; ALTER TABLE items ADD PRIMARY KEY (code)",
            "55000",
            "the key of table public.items changed during its backfill",
        ),
        ("ALTER TABLE items DROP CONSTRAINT items_pkey", "55000", "the key of table public.items changed"),
    ],
)
def test_a_table_changed_under_its_backfill_fails_it_naming_the_table(items, change, sqlstate, words):
    backfill_id = slow_backfill(items)
    items.execute(change)
    assert wait_until_ended(items, backfill_id, timeout=30) == "failed"
    got_sqlstate, error = status(items, backfill_id, "last_error_sqlstate", "last_error")
    assert (got_sqlstate, words in error) == (sqlstate, True), error
    assert "stopped after key" in error


def test_dump_and_restore_into_another_database_starts_with_no_backfills(cluster, items, scratch_database):
    backfill_id = slow_backfill(items)
    source = items.info.dbname
    target = f"{source}_restored"[:63]
    dump = f"/tmp/{source}.dump"
    run = lambda *args: subprocess.run(  # noqa: E731
        ["sudo", "-u", "postgres", *args, "-h", "127.0.0.1", "-p", str(cluster.port)], check=True, capture_output=True
    )
    run(f"{PG_BIN}/pg_dump", "-Fc", "-f", dump, "-d", source)
    items.execute("SELECT backfill_cancel(%s)", [backfill_id])
    scratch_database(target)
    run(f"{PG_BIN}/pg_restore", "-d", target, dump)
    with cluster.connect(target) as restored:
        assert restored.execute("SELECT count(*) FROM items").fetchone()[0] == 2000
        assert restored.execute("SELECT count(*) FROM backfill_status").fetchone()[0] == 0
        new_id = restored.execute("SELECT backfill_start('items', confirm => true)").fetchone()[0]
        assert wait_until_ended(restored, new_id) == "done"
        assert status(restored, new_id, "rows_done") == 2000


@pytest.mark.slow
@pytest.mark.cluster
def test_on_a_standby_functions_refuse_with_25006_and_the_views_work(cluster, items):
    backfill_id = items.execute("SELECT backfill_start('items', confirm => true)").fetchone()[0]
    assert wait_until_ended(items, backfill_id) == "done"
    standby = extra_cluster(cluster, "standby")
    subprocess.run(["bash", "-c", f"rm -rf '{standby.dir}' && mkdir -p '{standby.dir}' && chown postgres: '{standby.dir}'"], check=True)
    subprocess.run(
        ["sudo", "-u", "postgres", f"{PG_BIN}/pg_basebackup", "-h", "127.0.0.1", "-p", str(cluster.port),
         "-U", "postgres", "-D", f"{standby.dir}/data", "-R", "-X", "stream"],
        check=True, capture_output=True,
    )
    with open(f"{standby.dir}/data/postgresql.auto.conf", "a") as conf:
        conf.write(f"port = {standby.port}\nunix_socket_directories = '{standby.dir}'\n")
    standby.pg_ctl("start")
    try:
        with standby.connect(items.info.dbname) as conn:
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]
            for call in [
                "SELECT backfill_start('items', confirm => true)",
                f"SELECT backfill_cancel({backfill_id})",
                f"SELECT backfill_pause({backfill_id})",
                f"SELECT backfill_resume({backfill_id})",
                f"SELECT backfill_set({backfill_id}, batch_size => 10)",
            ]:
                e = error_of(conn, call)
                assert e.sqlstate == "25006" and "primary" in e.diag.message_hint, (call, e)
            assert conn.execute("SELECT state, rows_done FROM backfill_status").fetchall() == [("done", 2000)]
            assert conn.execute("SELECT count(*) FROM backfill_tables").fetchone()[0] == 1
            assert conn.execute(f"SELECT backfill_wait({backfill_id})").fetchone()[0] is True
    finally:
        standby.stop()


def cluster_admin(db):
    return psycopg.connect(host="127.0.0.1", port=db.info.port, user="postgres", dbname="postgres", autocommit=True)


def server_log(cluster) -> str:
    return open(f"{cluster.dir}/server.log", errors="replace").read()


@pytest.mark.parametrize("control, state", [("backfill_cancel", "cancelled"), ("backfill_pause", "paused")])
def test_a_slow_backfill_stops_at_once_when_cancelled_or_paused(items, control, state):
    backfill_id = items.execute("SELECT backfill_start('items', confirm => true, rows_per_second => 2)").fetchone()[0]
    wait_for(lambda: status(items, backfill_id, "rows_done") > 0, what="first page")
    items.execute(f"SELECT {control}(%s)", [backfill_id])
    started = time.monotonic()
    wait_for(lambda: status(items, backfill_id, "workers_running") == 0, timeout=5, what="the worker to exit")
    assert time.monotonic() - started < 1.5
    assert status(items, backfill_id, "state") == state


def test_a_new_rate_takes_effect_at_once(items):
    backfill_id = items.execute("SELECT backfill_start('items', confirm => true, rows_per_second => 2)").fetchone()[0]
    wait_for(lambda: status(items, backfill_id, "rows_done") > 0, what="first page")
    items.execute("SELECT backfill_set(%s, rows_per_second => 0)", [backfill_id])
    assert wait_until_ended(items, backfill_id, timeout=5) == "done"


def test_log_lines_name_the_database(cluster, items):
    backfill_id = items.execute("SELECT backfill_start('items', confirm => true)").fetchone()[0]
    assert wait_until_ended(items, backfill_id) == "done"
    wait_for(lambda: f'pg_backfill {backfill_id} in database "{items.info.dbname}": done' in server_log(cluster))


def test_a_database_dropped_with_force_leaves_no_worker_restarting(cluster, scratch_database):
    name = scratch_database("dropped_mid_run")
    with cluster.connect(name) as conn:
        conn.execute(
            """CREATE EXTENSION pg_backfill; CREATE TABLE t (id int PRIMARY KEY);
               INSERT INTO t SELECT generate_series(1, 1000)"""
        )
        oid = conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0]
        backfill_id = conn.execute("SELECT backfill_start('t', confirm => true, rows_per_second => 10)").fetchone()[0]
        wait_for(lambda: status(conn, backfill_id, "workers_running") == 1, what="the worker")
    with cluster.connect() as admin:
        admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
    stopped = f"pg_backfill {backfill_id}: database {oid} no longer exists, its worker stops"
    wait_for(lambda: stopped in server_log(cluster), timeout=10, what="the worker to stop")
    time.sleep(3)
    assert server_log(cluster).count(stopped) == 1
    # Its background worker slot is free again: no process of it is left, restarting or not.
    with cluster.connect() as admin:
        assert admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [f"pg_backfill {backfill_id}"]
        ).fetchone()[0] == 0


def test_drop_extension_is_refused_while_a_backfill_runs(items):
    backfill_id = slow_backfill(items)
    e = error_of(items, "DROP EXTENSION pg_backfill")
    assert e.sqlstate == "55006" and e.diag.message_detail == f"Backfill {backfill_id} is running or paused.", e
    assert "backfill_cancel" in e.diag.message_hint
    items.execute("SELECT backfill_cancel(%s)", [backfill_id])
    items.execute("DROP EXTENSION pg_backfill")
    assert items.execute("SELECT count(*) FROM pg_extension WHERE extname = 'pg_backfill'").fetchone()[0] == 0


def test_a_stall_on_a_row_lock_shows_who_holds_it(cluster, items):
    backfill_id = items.execute("SELECT backfill_start('items', confirm => true, rows_per_second => 1000, batch_size => 50)").fetchone()[0]
    wait_for(lambda: (status(items, backfill_id, "rows_done") or 0) > 0, what="first page")
    with cluster.connect(items.info.dbname) as writer:
        writer.execute("BEGIN")
        writer.execute("UPDATE items SET label = 'held' WHERE id > 200")
        holder = writer.execute("SELECT pg_backend_pid()").fetchone()[0]
        wait_for(lambda: status(items, backfill_id, "waiting_for") == f"a row lock held by pid {holder}",
                 timeout=20, what="the stall to show")
        assert status(items, backfill_id, "waiting_kind") == "row_lock"
        writer.execute("ROLLBACK")
    assert wait_until_ended(items, backfill_id) == "done"


def test_the_starting_role_dropped_mid_run_fails_the_backfill_and_a_superuser_still_controls_it(items, roles):
    role = roles.create("gone", "operator")
    items.execute(f"GRANT SELECT, UPDATE ON items TO {role}")
    as_role = roles.connect(role)
    backfill_id = as_role.execute("SELECT backfill_start('items', confirm => true, rows_per_second => 200)").fetchone()[0]
    wait_for(lambda: (status(items, backfill_id, "rows_done") or 0) > 0, what="first page")
    as_role.close()
    items.execute(f"REVOKE ALL ON items FROM {role}; REVOKE ALL ON SCHEMA public FROM {role}")
    items.execute(f"DROP OWNED BY {role}")
    with cluster_admin(items) as admin:
        admin.execute(f"DROP ROLE {role}")
    assert wait_until_ended(items, backfill_id, timeout=30) == "failed"
    assert status(items, backfill_id, "last_error_sqlstate") == "42501"
    items.execute("SELECT backfill_resume(%s)", [backfill_id])
    assert status(items, backfill_id, "state") == "running"
    items.execute("SELECT backfill_cancel(%s)", [backfill_id])
    assert wait_until_ended(items, backfill_id) == "cancelled"


def test_truncate_mid_run_ends_the_scan_with_the_rows_read_before(items):
    items.execute("SELECT pg_create_logical_replication_slot('truncated', 'test_decoding')")
    backfill_id = slow_backfill(items)
    items.execute("TRUNCATE items")
    assert wait_until_ended(items, backfill_id) == "done"
    lines = [line for (line,) in items.execute("SELECT data FROM pg_logical_slot_get_changes('truncated', NULL, NULL)")]
    truncate_at = next(i for i, line in enumerate(lines) if line.startswith("table public.items: TRUNCATE"))
    # No read follows the TRUNCATE in the stream: a consumer ends with an empty table.
    assert not any('"op":"read"' in line for line in lines[truncate_at:])
    assert any('"op":"table_end"' in line for line in lines[truncate_at:])


def test_the_slot_dropped_mid_run_fails_the_backfill_with_42704(cluster, items):
    items.execute("SELECT pg_create_logical_replication_slot('doomed', 'test_decoding')")
    # The slot must have an active consumer for the backfill to run: pg_recvlogical.
    consumer = Consumer(cluster, items.info.dbname, "doomed")
    try:
        backfill_id = items.execute(
            "SELECT backfill_start('items', confirm => true, slot => 'doomed', batch_size => 50, rows_per_second => 500)"
        ).fetchone()[0]
        wait_for(lambda: (status(items, backfill_id, "rows_done") or 0) > 0, what="first page")
    finally:
        consumer.stop()
    wait_for(lambda: items.execute("SELECT NOT active FROM pg_replication_slots WHERE slot_name = 'doomed'").fetchone()[0])
    items.execute("SELECT pg_drop_replication_slot('doomed')")
    assert wait_until_ended(items, backfill_id, timeout=30) == "failed"
    sqlstate, error = status(items, backfill_id, "last_error_sqlstate", "last_error")
    assert sqlstate == "42704" and 'slot "doomed" no longer exists' in error


@pytest.mark.parametrize("lock_mode", ["rows", "auto"])
def test_what_nowait_and_skip_locked_writers_see_while_a_page_holds_its_rows(cluster, db, lock_mode):
    # Rendering each row takes 0.3 s (a slow cast to json), so the first page holds its locks
    # for about 3 s: long enough to look at them from an application. With rows, the page
    # locks its rows; with auto on this quiet table, it holds the table in SHARE mode.
    db.execute(
        """CREATE TYPE mood AS ENUM ('calm');
           CREATE FUNCTION mood_json(mood) RETURNS json LANGUAGE plpgsql AS
             $$ BEGIN PERFORM pg_sleep(0.3); RETURN '"calm"'::json; END $$;
           CREATE CAST (mood AS json) WITH FUNCTION mood_json(mood);
           CREATE TABLE slow (id int PRIMARY KEY, m mood);
           INSERT INTO slow SELECT g, 'calm' FROM generate_series(1, 10) g;"""
    )
    db.execute(f"SET backfill.lock_mode = '{lock_mode}'")
    backfill_id = db.execute("SELECT backfill_start('slow', confirm => true)").fetchone()[0]
    with cluster.connect(db.info.dbname) as app:
        wait_for(lambda: app.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
            "WHERE a.backend_type = 'pg_backfill' AND l.locktype = 'transactionid'").fetchone()[0] > 0,
            what="the page to start")
        time.sleep(0.5)
        if lock_mode == "rows":
            e = error_of(app, "SELECT id FROM slow WHERE id = 1 FOR UPDATE NOWAIT")
            assert e.sqlstate == "55P03"
            assert app.execute("SELECT id FROM slow WHERE id = 1 FOR UPDATE SKIP LOCKED").fetchall() == []
        else:
            # FOR UPDATE takes ROW SHARE on the table, which SHARE lets through.
            assert app.execute("SELECT id FROM slow WHERE id = 1 FOR UPDATE NOWAIT").fetchall() == [(1,)]
            assert app.execute("SELECT id FROM slow WHERE id = 1 FOR UPDATE SKIP LOCKED").fetchall() == [(1,)]
        # A writer that waits is never failed: it goes on once the page commits.
        started = time.monotonic()
        app.execute("UPDATE slow SET m = 'calm' WHERE id = 1")
        if lock_mode == "auto":
            assert time.monotonic() - started > 1, "the writer should have waited for the table-locked page"
    assert wait_until_ended(db, backfill_id) == "done"
    paths = db.execute("SELECT pages_table_locked, pages_row_locked FROM backfill_tables WHERE backfill_id = %s",
                       [backfill_id]).fetchone()
    assert (paths[0] > 0) == (lock_mode == "auto") and (paths[1] > 0) == (lock_mode == "rows"), paths


def test_a_parallel_backfill_waiting_for_its_consumer_finishes_once_it_attaches(cluster, items):
    items.execute("ANALYZE items")
    items.execute("SELECT pg_create_logical_replication_slot('later', 'test_decoding')")
    backfill_id = items.execute(
        "SELECT backfill_start('items', confirm => true, slot => 'later', parallel => 4)"
    ).fetchone()[0]
    wait_for(lambda: status(items, backfill_id, "workers_running") == 4 and status(items, backfill_id, "waiting_kind") == "consumer_away",
             what="4 waiting workers")
    consumer = Consumer(cluster, items.info.dbname, "later")
    try:
        assert wait_until_ended(items, backfill_id, timeout=60) == "done"
        assert status(items, backfill_id, "rows_done") == 2000
        assert items.execute(
            "SELECT count(*) FROM backfill_tables WHERE backfill_id = %s AND state = 'done'", [backfill_id]
        ).fetchone()[0] == 4
    finally:
        consumer.stop()
