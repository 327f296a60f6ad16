"""Back-pressure from the whole source: a physical standby that replays too far behind and a
replication slot that retains too much WAL pause a backfill's pages (max_replica_lag,
max_retained_wal); active client sessions past max_active_sessions slow it down, and it
recovers by itself when the load goes; a backfill with no pacing of its own rests after each
page while the server is busy (backfill.default_duty_cycle)."""

import os
import signal
import subprocess
import threading
import time
from contextlib import suppress

import psycopg
import pytest
from conftest import (PG_BIN, ROOT, Cluster, Consumer, assert_each_row_read_once, error_of, extra_cluster, status, wait_for,
                      wait_until_ended, worker_pid)

MB = 1024 * 1024
GB = 1024 * MB
SOURCE_LIMITS = ("max_replica_lag", "max_retained_wal", "max_active_sessions")


def as_postgres(*args: str) -> None:
    """Runs a command as the postgres OS user (scripts/lib/cluster.sh's as_postgres); fails the
    test with its output if it fails."""
    result = subprocess.run(
        ["bash", "-c", f"source '{ROOT}/scripts/lib/cluster.sh' && as_postgres \"$@\"", "as_postgres", *args],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, f"{args[0]} failed: {result.stdout}{result.stderr}"


def start_standby(cluster: Cluster, standby: Cluster, name: str) -> None:
    """Makes `standby` a streaming physical standby of the test cluster (pg_basebackup -R) and
    starts it; it connects as application_name `name` and reports its replay position every
    second. The test cluster's initdb defaults allow it: a `host replication all 127.0.0.1/32
    trust` line in pg_hba.conf, and max_wal_senders = 16 (scripts/lib/cluster.sh)."""
    subprocess.run(["bash", "-c", f"rm -rf '{standby.dir}' && mkdir -p '{standby.dir}' && chown postgres: '{standby.dir}'"],
                   check=True)
    as_postgres(f"{PG_BIN}/pg_basebackup", "-h", "127.0.0.1", "-p", str(cluster.port), "-U", "postgres",
                "-D", f"{standby.dir}/data", "-R", "-X", "stream")
    with open(f"{standby.dir}/data/postgresql.auto.conf", "a") as conf:
        # (The last of two primary_conninfo lines wins: this one names the standby.) The default
        # status interval, 10 s, would leave the primary up to 10 s behind the standby's replay.
        conf.write(
            f"port = {standby.port}\nunix_socket_directories = '{standby.dir}'\n"
            f"primary_conninfo = 'host=127.0.0.1 port={cluster.port} user=postgres application_name={name}'\n"
            "wal_receiver_status_interval = 1s\n"
        )
    standby.pg_ctl("start")


def remove_standby(standby: Cluster) -> None:
    with suppress(Exception):
        standby.stop()
    subprocess.run(["rm", "-rf", standby.dir], check=False)


def replication_state(primary, application_name: str):
    """(state, bytes between the primary's current WAL position and the standby's reported replay
    position) of the standby in pg_stat_replication, or None while it is not connected."""
    return primary.execute(
        """SELECT state, pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::bigint
             FROM pg_stat_replication WHERE application_name = %s""",
        [application_name],
    ).fetchone()


def wait_for_reason(conn, backfill_id: int, kind: str, *parts: str, timeout: float = 60) -> str:
    """Waits until the backfill's waiting_kind is `kind` and its waiting_for mentions every one
    of `parts` (its figures); returns waiting_for."""
    seen = []

    def matches():
        waiting_kind, waiting_for = status(conn, backfill_id, "waiting_kind", "waiting_for")
        seen.append(f"{waiting_kind}: {waiting_for}")
        return waiting_kind == kind and all(part in (waiting_for or "") for part in parts)

    try:
        wait_for(matches, timeout=timeout, what=f"waiting_kind {kind}, waiting_for mentioning {parts}")
    except AssertionError as e:
        raise AssertionError(f"{e}; last waiting_for: {seen[-1] if seen else None!r}") from None
    return seen[-1].split(": ", 1)[1]


def settles_to(read, expected, timeout: float = 10, what: str = "value"):
    """Polls `read()` until it equals `expected` (a reloaded setting reaches a session at its next
    statement); fails with the last value read."""
    last = []
    try:
        wait_for(lambda: last.append(read()) or last[-1] == expected, timeout=timeout, what=what)
    except AssertionError:
        raise AssertionError(f"{what}: {last[-1] if last else None!r}, expected {expected!r}") from None


def rows_per_second(conn, backfill_id: int, seconds: float) -> float:
    """The backfill's rate over the next `seconds`, from rows_done."""
    t0, rows0 = time.monotonic(), status(conn, backfill_id, "rows_done")
    time.sleep(seconds)
    t1, rows1 = time.monotonic(), status(conn, backfill_id, "rows_done")
    return (rows1 - rows0) / (t1 - t0)


def wait_for_the_load(conn) -> None:
    """Waits until at least 3 of an ActiveSessions' sessions are seen active."""
    wait_for(lambda: conn.execute("SELECT count(*) FROM pg_stat_activity WHERE query = %s AND state = 'active'",
                                  [ActiveSessions.QUERY]).fetchone()[0] >= 3, what="the load")


def cancel_running(conn) -> None:
    """Cleanup: cancels whatever backfill of the test's database still runs or is paused."""
    with suppress(psycopg.Error):
        conn.execute("SELECT backfill_cancel(id) FROM backfill_status WHERE state IN ('running', 'paused')")


def cancel_and_wait_for_its_workers(conn, backfill_id: int) -> None:
    """Cancels the backfill and waits until its worker has exited: until then it counts against
    backfill.max_workers, and a test's next start could be refused for it (a worker ends at its
    next page or wait, however long a loaded machine takes to get there). One that is done
    already (an unpaced one of a small table can be) is left as it is."""
    with suppress(psycopg.errors.ObjectNotInPrerequisiteState):
        conn.execute("SELECT backfill_cancel(%s)", [backfill_id])
    wait_until_ended(conn, backfill_id)
    wait_for(lambda: worker_pid(conn, backfill_id) is None, what=f"backfill {backfill_id}'s worker to exit")


def drop_slot_if_any(conn, slot: str) -> None:
    with suppress(psycopg.Error):
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s AND NOT active", [slot]
        )


class ActiveSessions:
    """`count` client sessions kept in state 'active', each on its own connection looping
    `SELECT pg_sleep(0.5)` in a thread, until stop()."""

    QUERY = "SELECT pg_sleep(0.5)"

    def __init__(self, cluster: Cluster, dbname: str, count: int):
        self.done = threading.Event()
        self.conns, self.threads = [], []
        try:
            for _ in range(count):
                self.conns.append(cluster.connect(dbname))
            for conn in self.conns:
                thread = threading.Thread(target=self._run, args=(conn,), daemon=True)
                thread.start()
                self.threads.append(thread)
        except BaseException:
            self.stop()
            raise

    def _run(self, conn):
        while not self.done.is_set():
            try:
                conn.execute(self.QUERY)
            except psycopg.Error:
                return

    def stop(self):
        self.done.set()
        for thread in self.threads:
            thread.join(10)
        for conn in self.conns:
            with suppress(Exception):
                conn.close()


@pytest.mark.slow
@pytest.mark.cluster
def test_a_standby_that_stops_replaying_pauses_the_backfill(cluster, db):
    limit = MB  # far above what a page writes: once replaying again, the standby keeps up
    # (Not + 7: 15440 is the demo cluster's port, which the demo leaves running.)
    standby = extra_cluster(cluster, "standby1")
    consumer = None
    try:
        start_standby(cluster, standby, "standby1")
        wait_for(lambda: (replication_state(db, "standby1") or (None,))[0] == "streaming", timeout=60,
                 what="the standby to stream")
        db.execute(
            """CREATE TABLE narrow (id bigint PRIMARY KEY, v int NOT NULL);
               INSERT INTO narrow SELECT g, g % 7 FROM generate_series(1, 50000) g;"""
        )
        db.execute("VACUUM ANALYZE narrow")  # not autovacuum's WAL later, mid-test
        db.execute("SELECT pg_create_logical_replication_slot('pipe', 'test_decoding')")
        consumer = Consumer(cluster, db.info.dbname, "pipe")
        wait_for(lambda: db.execute("SELECT active FROM pg_replication_slots WHERE slot_name = 'pipe'").fetchone()[0],
                 what="the consumer")
        # The standby has replayed everything so far, as the primary sees it.
        current = db.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        wait_for(lambda: db.execute(
            """SELECT coalesce(bool_or(replay_lsn >= %s::pg_lsn), false)
                 FROM pg_stat_replication WHERE application_name = 'standby1'""", [current]
        ).fetchone()[0], timeout=60, what="the standby to catch up")
        with standby.connect() as on_standby:
            on_standby.execute("SELECT pg_wal_replay_pause()")
            assert on_standby.execute("SELECT pg_get_wal_replay_pause_state()").fetchone()[0] != "not paused"

        backfill_id = db.execute(
            "SELECT backfill_start('narrow', confirm => true, slot => 'pipe', batch_size => 200, max_replica_lag => %s)",
            [limit],
        ).fetchone()[0]
        reason = wait_for_reason(db, backfill_id, "replica_lag", 'standby "standby1"', "max_replica_lag")
        assert status(db, backfill_id, "state") == "running"  # waiting is not a state
        time.sleep(0.5)
        held = status(db, backfill_id, "rows_done")
        time.sleep(1.5)
        assert status(db, backfill_id, "rows_done") == held, f"pages went on while {reason}"
        assert 0 < held < 25000, f"{held} rows: it should run until the standby lags, and stop near the limit"
        state, lag = replication_state(db, "standby1")
        assert state == "streaming" and lag > limit, f"the standby replays {lag} bytes behind"
        # It stopped at the first page past the limit (a 200-row page writes about 55 kB), not
        # a second or more later.
        assert lag < limit + 256 * 1024, f"the standby replays {lag} bytes behind, against a limit of {limit}"

        with standby.connect() as on_standby:
            on_standby.execute("SELECT pg_wal_replay_resume()")
        assert wait_until_ended(db, backfill_id, timeout=120) == "done"
        wait_for(lambda: status(db, backfill_id, "delivered"), timeout=60, what="delivery")
        consumer.stop()
        assert_each_row_read_once(consumer.messages(), range(1, 50001))
    finally:
        if consumer is not None:
            with suppress(Exception):
                consumer.stop()
        cancel_running(db)
        remove_standby(standby)


def test_an_unconsumed_slot_pauses_the_backfill_past_max_retained_wal(cluster, db):
    limit = 4 * MB
    consumer = None
    try:
        db.execute(
            """CREATE TABLE events (id bigint PRIMARY KEY, body text NOT NULL);
               INSERT INTO events SELECT g, repeat('x', 100) FROM generate_series(1, 60000) g;"""
        )
        db.execute("VACUUM ANALYZE events")
        # 'stuck' is older than the consumed slot: it is the one that retains the most WAL.
        db.execute("SELECT pg_create_logical_replication_slot('stuck', 'test_decoding')")
        db.execute("SELECT pg_logical_emit_message(false, 'spacer', repeat('x', 1000))")
        db.execute("SELECT pg_create_logical_replication_slot('pipe', 'test_decoding')")
        consumer = Consumer(cluster, db.info.dbname, "pipe")
        wait_for(lambda: db.execute("SELECT active FROM pg_replication_slots WHERE slot_name = 'pipe'").fetchone()[0],
                 what="the consumer")

        backfill_id = db.execute(
            "SELECT backfill_start('events', confirm => true, slot => 'pipe', batch_size => 500, max_retained_wal => %s)",
            [limit],
        ).fetchone()[0]
        reason = wait_for_reason(db, backfill_id, "retained_wal", 'slot "stuck"', "max_retained_wal")
        assert status(db, backfill_id, "state") == "running"
        time.sleep(0.5)
        held = status(db, backfill_id, "rows_done")
        time.sleep(1.5)
        assert status(db, backfill_id, "rows_done") == held, f"pages went on while {reason}"
        assert 0 < held < 60000
        retained = db.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = 'stuck'"
        ).fetchone()[0]
        assert limit < retained < 2 * limit, f"'stuck' retains {retained} bytes: it should stop just past {limit}"

        db.execute("SELECT pg_drop_replication_slot('stuck')")
        # The consumed slot retains WAL too until its restart_lsn moves on: that takes a
        # running-xacts record (a checkpoint logs one) and a commit past it that the consumer
        # confirms, as any busy server has. Keep providing both until the backfill ends.
        deadline = time.monotonic() + 120
        while status(db, backfill_id, "state") == "running":
            assert time.monotonic() < deadline, f"still running: {status(db, backfill_id, 'waiting_for')!r}"
            db.execute("CHECKPOINT")
            db.execute("SELECT pg_logical_emit_message(true, 'nudge', '')")
            time.sleep(0.5)
        assert status(db, backfill_id, "state") == "done"
        wait_for(lambda: status(db, backfill_id, "delivered"), timeout=60, what="delivery")
        consumer.stop()
        assert_each_row_read_once(consumer.messages(), range(1, 60001))
    finally:
        if consumer is not None:
            with suppress(Exception):
                consumer.stop()
        cancel_running(db)
        drop_slot_if_any(db, "stuck")


def test_max_retained_wal_follows_max_slot_wal_keep_size(db):
    db.execute(
        """CREATE TABLE t (id int PRIMARY KEY);
           INSERT INTO t SELECT generate_series(1, 1000);"""
    )

    def start(options=""):  # a slow backfill (5 rows/s) that stays running
        return db.execute(f"SELECT backfill_start('t', confirm => true, rows_per_second => 5{options})").fetchone()[0]

    try:
        db.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '64MB'")
        db.execute("SELECT pg_reload_conf()")
        by_default = start()
        settles_to(lambda: status(db, by_default, "max_retained_wal_bytes"), 32 * MB,
                   what="max_retained_wal_bytes at max_slot_wal_keep_size 64MB")
        db.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '128MB'")
        db.execute("SELECT pg_reload_conf()")
        settles_to(lambda: status(db, by_default, "max_retained_wal_bytes"), 64 * MB,
                   what="max_retained_wal_bytes at max_slot_wal_keep_size 128MB")
        db.execute("SELECT backfill_cancel(%s)", [by_default])
        assert wait_until_ended(db, by_default) == "cancelled"

        # An option only tightens the DBA's setting: 0 cannot turn it off, a larger value is
        # capped by it, a smaller one holds; -1 follows the setting again.
        for option, in_force in [(0, 64 * MB), (GB, 64 * MB), (16 * MB, 16 * MB)]:
            tightened = start(f", max_retained_wal => {option}")
            assert status(db, tightened, "max_retained_wal_bytes") == in_force, option
            db.execute("SELECT backfill_cancel(%s)", [tightened])
            assert wait_until_ended(db, tightened) == "cancelled"
        tightened = start(f", max_retained_wal => {16 * MB}")
        db.execute("SELECT backfill_set(%s, max_retained_wal => -1)", [tightened])
        assert status(db, tightened, "max_retained_wal_bytes") == 64 * MB
        db.execute("SELECT backfill_cancel(%s)", [tightened])

        db.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
        db.execute("SELECT pg_reload_conf()")
        unlimited = start()
        settles_to(lambda: status(db, unlimited, "max_retained_wal_bytes"), None,
                   what="max_retained_wal_bytes with max_slot_wal_keep_size unset")
    finally:
        cancel_running(db)
        db.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
        db.execute("SELECT pg_reload_conf()")


@pytest.mark.slow
def test_server_load_slows_the_backfill_and_it_recovers(cluster, db):
    db.execute(
        """CREATE TABLE busy (id bigint PRIMARY KEY, v int NOT NULL);
           INSERT INTO busy SELECT g, g % 7 FROM generate_series(1, 200000) g;"""
    )
    db.execute("ANALYZE busy")
    load = None
    try:
        backfill_id = db.execute(
            "SELECT backfill_start('busy', confirm => true, batch_size => 500, rows_per_second => 5000, max_active_sessions => 2)"
        ).fetchone()[0]
        assert status(db, backfill_id, "max_active_sessions") == 2
        wait_for(lambda: (status(db, backfill_id, "rows_done") or 0) > 0, what="the first page")
        time.sleep(1)
        unloaded = rows_per_second(db, backfill_id, 3)
        # (What it reaches unloaded is the machine's speed: the figures below are ratios of it.)
        assert unloaded > 0
        assert status(db, backfill_id, "waiting_kind") != "load"

        load = ActiveSessions(cluster, db.info.dbname, 4)
        wait_for_the_load(db)
        time.sleep(1.5)
        loaded = rows_per_second(db, backfill_id, 3)
        assert loaded < unloaded / 4, f"{loaded:.0f} rows/s under load, {unloaded:.0f} without"
        reason = wait_for_reason(db, backfill_id, "load", "server load", "max_active_sessions", timeout=10)
        assert status(db, backfill_id, "state") == "running", reason

        load.stop()
        load = None
        time.sleep(6)
        recovered = rows_per_second(db, backfill_id, 3)
        active = db.execute(
            "SELECT datname, query FROM pg_stat_activity WHERE backend_type = 'client backend' AND state = 'active'"
        ).fetchall()
        assert recovered > unloaded / 2, (
            f"{recovered:.0f} rows/s after the load, {unloaded:.0f} before it; active: {active}; "
            f"waiting_for: {status(db, backfill_id, 'waiting_for')!r}"
        )
        db.execute("SELECT backfill_cancel(%s)", [backfill_id])
        assert wait_until_ended(db, backfill_id) == "cancelled"
    finally:
        if load is not None:
            load.stop()
        cancel_running(db)


@pytest.fixture
def items(db):
    db.execute(
        """CREATE TABLE items (id int PRIMARY KEY, label text);
           INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 2000) g;"""
    )
    return db


@pytest.mark.parametrize("option", SOURCE_LIMITS)
def test_a_negative_source_limit_is_22023_at_start_and_in_backfill_set(items, option):
    e = error_of(items, f"SELECT backfill_start('items', confirm => true, {option} => -2)")
    assert e.sqlstate == "22023" and option in e.diag.message_primary, e
    assert items.execute("SELECT count(*) FROM backfill.job").fetchone()[0] == 0, "a refused start starts nothing"
    backfill_id = items.execute("SELECT backfill_start('items', confirm => true, rows_per_second => 10)").fetchone()[0]
    try:
        e = error_of(items, f"SELECT backfill_set(%s, {option} => -5)", [backfill_id])
        assert e.sqlstate == "22023" and option in e.diag.message_primary, e
    finally:
        cancel_running(items)


def test_source_limits_show_in_backfill_status_and_backfill_set_changes_them(items):
    columns = ("max_replica_lag_bytes", "max_retained_wal_bytes", "max_active_sessions")
    try:
        by_default = items.execute("SELECT backfill_start('items', confirm => true, rows_per_second => 10)").fetchone()[0]
        # The settings' defaults are off (max_slot_wal_keep_size is not set on the test cluster).
        assert status(items, by_default, *columns) == (None, None, None)
        items.execute("SELECT backfill_set(%s, max_active_sessions => 3)", [by_default])
        assert status(items, by_default, "max_active_sessions") == 3
        items.execute("SELECT backfill_set(%s, batch_size => 50)", [by_default])  # NULL keeps the value
        assert status(items, by_default, "max_active_sessions") == 3
        items.execute("SELECT backfill_set(%s, max_replica_lag => %s, max_retained_wal => %s)", [by_default, MB, 8 * MB])
        assert status(items, by_default, *columns) == (MB, 8 * MB, 3)
        items.execute("SELECT backfill_set(%s, max_active_sessions => 0)", [by_default])
        assert status(items, by_default, *columns) == (MB, 8 * MB, None)
        items.execute("SELECT backfill_set(%s, max_replica_lag => 0, max_retained_wal => 0)", [by_default])
        assert status(items, by_default, *columns) == (None, None, None)
        items.execute("SELECT backfill_cancel(%s)", [by_default])
        assert wait_until_ended(items, by_default) == "cancelled"

        given = items.execute(
            """SELECT backfill_start('items', confirm => true, rows_per_second => 10,
                                     max_replica_lag => 1000000, max_retained_wal => 2000000, max_active_sessions => 7)"""
        ).fetchone()[0]
        assert status(items, given, *columns) == (1000000, 2000000, 7)
    finally:
        cancel_running(items)


def test_source_limits_refuse_null_ids_other_roles_and_keep_huge_values(items, roles):
    backfill_id = items.execute("SELECT backfill_start('items', confirm => true, rows_per_second => 10)").fetchone()[0]
    try:
        assert error_of(items, "SELECT backfill_set(NULL, max_active_sessions => 2)").sqlstate == "22004"
        # The largest limit is kept as given (the settings are off here).
        items.execute("SELECT backfill_set(%s, max_replica_lag => 9223372036854775807)", [backfill_id])
        assert status(items, backfill_id, "max_replica_lag_bytes") == 9223372036854775807
        # A role that did not start it (and is no member of its starter) may not change it.
        other = roles.connect(roles.create("other", "operator"))
        e = error_of(other, "SELECT backfill_set(%s, max_active_sessions => 1)", [backfill_id])
        assert e.sqlstate == "42501", e
        assert status(items, backfill_id, "max_active_sessions") is None
        # The view's helper: NULL or unknown names are no limit.
        assert items.execute("SELECT backfill.source_limit(NULL, 5), backfill.source_limit('nonsense', 5)").fetchone() == (None, None)
    finally:
        cancel_running(items)


def recorded_pacing(conn, backfill_id: int):
    """(rows_per_second, max_active_sessions) as the start recorded them in backfill.job (the
    view shows an option of 0 and none alike: no limit)."""
    return conn.execute("SELECT rows_per_second, max_active_sessions FROM backfill.job WHERE id = %s",
                        [backfill_id]).fetchone()


def set_duty_cycle(conn, percent) -> None:
    """backfill.default_duty_cycle for the whole test cluster (a reload setting); None: back to
    the test clusters' 100 (conftest.py), which turns the rest off."""
    if percent is None:
        conn.execute("ALTER SYSTEM RESET backfill.default_duty_cycle")
    else:
        conn.execute(f"ALTER SYSTEM SET backfill.default_duty_cycle = {int(percent)}")
    conn.execute("SELECT pg_reload_conf()")
    # Once a session sees it, the postmaster has it, and so does every worker it starts next.
    settles_to(lambda: conn.execute("SELECT current_setting('backfill.default_duty_cycle')").fetchone()[0],
               str(percent or 100), what="backfill.default_duty_cycle")


def test_a_start_with_no_pacing_option_records_no_pacing_and_given_options_keep_theirs(db):
    """The gentle default is no recorded limit: a start with no pacing option records neither
    rows_per_second nor max_active_sessions (its workers then follow
    backfill.default_duty_cycle); each option given is recorded as given, max_active_sessions
    => 0 (unpaced) apart from none; backfill.default_max_active_sessions, where a DBA sets it, is
    recorded as before."""
    db.execute(
        """CREATE TABLE quiet (id bigint PRIMARY KEY, v int NOT NULL);
           INSERT INTO quiet SELECT g, g % 7 FROM generate_series(1, 2000) g; ANALYZE quiet"""
    )
    assert db.execute("SELECT current_setting('backfill.default_max_active_sessions')").fetchone()[0] == "0"
    assert db.execute("SELECT boot_val FROM pg_settings WHERE name = 'backfill.default_duty_cycle'").fetchone()[0] == "15"
    recorded = {}
    try:
        for options in ["", ", max_active_sessions => 0", ", rows_per_second => 100000", ", max_active_sessions => 3",
                        ", rows_per_second => 100000, max_active_sessions => 0"]:
            backfill_id = db.execute(f"SELECT backfill_start('quiet', confirm => true{options})").fetchone()[0]
            recorded[options] = recorded_pacing(db, backfill_id)
            cancel_and_wait_for_its_workers(db, backfill_id)
        db.execute("SET backfill.default_max_active_sessions = 2")
        backfill_id = db.execute("SELECT backfill_start('quiet', confirm => true)").fetchone()[0]
        recorded["default_max_active_sessions 2"] = recorded_pacing(db, backfill_id)
        assert status(db, backfill_id, "max_active_sessions") == 2
        cancel_and_wait_for_its_workers(db, backfill_id)
    finally:
        db.execute("RESET backfill.default_max_active_sessions")
        cancel_running(db)
    assert recorded == {
        "": (None, None),
        ", max_active_sessions => 0": (None, 0),
        ", rows_per_second => 100000": (100000, None),
        ", max_active_sessions => 3": (None, 3),
        ", rows_per_second => 100000, max_active_sessions => 0": (100000, 0),
        "default_max_active_sessions 2": (None, 2),
    }, recorded


def never_load(conn, backfill_id: int, seconds: float) -> None:
    """Samples waiting_kind every 0.2 s for `seconds`, or until the backfill ends: the load never
    holds it back. (This session is active a few milliseconds in each 0.2 s: far from the half
    of a session on average that makes the server busy.)"""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        state, waiting_kind, waiting_for = status(conn, backfill_id, "state", "waiting_kind", "waiting_for")
        assert waiting_kind != "load", f"backfill {backfill_id}: {waiting_for}"
        if state != "running":
            return
        time.sleep(0.2)


# The most rows of a page while the duty cycle rests (throttle/duty.rs).
RESTING_PAGE_ROWS = 200


def rows_and_pages(db, backfill_id):
    """A backfill's rows delivered and pages committed so far, as one snapshot sees them (each
    page's commit updates both)."""
    return db.execute("SELECT sum(rows_done)::bigint, sum(pages_row_locked + pages_table_locked)::bigint"
                      " FROM backfill.job_table WHERE job_id = %s", [backfill_id]).fetchone()


@pytest.mark.slow
def test_with_no_pacing_option_a_busy_server_makes_the_backfill_rest_and_an_idle_one_does_not(cluster, db):
    """Under load, a backfill with no pacing of its own rests after each page
    (backfill.default_duty_cycle; 1% here, so that it runs under the load for many seconds on
    any machine): waiting_kind load, waiting_for naming the setting, its share and the rate, and it
    keeps delivering, in pages of at most 200 rows. The load gone, it stops resting and finishes;
    on an idle server it never rests, and its pages take whole batches. Backfills with pacing of
    their own (rows_per_second, max_active_sessions => 0) never rest; a DBA's
    backfill.default_max_active_sessions slows one down as max_active_sessions does."""
    db.execute(
        """CREATE TABLE busy (id bigint PRIMARY KEY, v int NOT NULL);
           INSERT INTO busy SELECT g, g % 7 FROM generate_series(1, 200000) g; ANALYZE busy"""
    )
    load = None
    try:
        set_duty_cycle(db, 1)
        backfill_id = db.execute("SELECT backfill_start('busy', confirm => true)").fetchone()[0]
        never_load(db, backfill_id, 120)
        assert wait_until_ended(db, backfill_id) == "done"
        rows, pages = rows_and_pages(db, backfill_id)
        assert rows > RESTING_PAGE_ROWS * pages, f"{rows} rows in {pages} pages on an idle server: whole batches"

        load = ActiveSessions(cluster, db.info.dbname, 4)
        wait_for_the_load(db)
        for options in [", rows_per_second => 1000", ", max_active_sessions => 0"]:
            paced = db.execute(f"SELECT backfill_start('busy', confirm => true{options})").fetchone()[0]
            wait_for(lambda: (status(db, paced, "rows_done") or 0) > 0, what="the first page")
            never_load(db, paced, 2)
            cancel_and_wait_for_its_workers(db, paced)
        db.execute("SET backfill.default_max_active_sessions = 1")
        limited = db.execute("SELECT backfill_start('busy', confirm => true)").fetchone()[0]
        db.execute("RESET backfill.default_max_active_sessions")
        wait_for_reason(db, limited, "load", "more than max_active_sessions 1", timeout=30)
        cancel_and_wait_for_its_workers(db, limited)

        backfill_id = db.execute("SELECT backfill_start('busy', confirm => true)").fetchone()[0]
        reason = wait_for_reason(db, backfill_id, "load", "server load", "active sessions", "pages take 1% of the time",
                                 "backfill.default_duty_cycle", "rows/s", timeout=30)
        assert status(db, backfill_id, "state") == "running", reason
        assert status(db, backfill_id, "max_active_sessions") is None  # no limit: a duty cycle
        moved = status(db, backfill_id, "rows_done")
        wait_for(lambda: status(db, backfill_id, "rows_done") > moved, timeout=60, what="a page more, under the load")
        # Every page so far was under the load, the first included (its count comes first): short ones.
        rows, pages = rows_and_pages(db, backfill_id)
        assert 0 < rows <= RESTING_PAGE_ROWS * pages, f"{rows} rows in {pages} pages under load"

        load.stop()
        load = None
        # The count is averaged over about a second: a second or two later, it no longer rests.
        wait_for(lambda: status(db, backfill_id, "waiting_kind") != "load", timeout=30, what="the rests to end")
        never_load(db, backfill_id, 2)
        assert wait_until_ended(db, backfill_id) == "done"
    finally:
        if load is not None:
            load.stop()
        cancel_running(db)
        set_duty_cycle(db, None)


def looks_resting_inside_a_page(db, start: str, looks: int = 100, starter=None):
    """Of `looks` at running backfills' workers, 20 ms apart, how many find one resting inside a
    page, holding what it has locked or not yet: in an `Extension` wait (its rests) inside a
    transaction (between pages it has none) that holds an xid (from the page's first row lock,
    or its first message, to its commit), or none yet (before the page locks or writes
    anything). A page's other waits are of other kinds. Backfills run back to back (`start`
    starts one, on `starter`'s connection, else `db`'s), so that every look is of a running one
    however fast they end. Returns the looks resting holding an xid, those resting before it
    had one, and the backfills' ids."""
    ids, holding, before = [], 0, 0
    while looks > 0:
        state = status(db, ids[-1], "state") if ids else None
        if state != "running":
            if ids:
                assert state == "done", f"backfill {ids[-1]}: {state}"
                cancel_and_wait_for_its_workers(db, ids[-1])  # (done: its worker's exit)
            ids.append((starter or db).execute(start).fetchone()[0])
        pid = worker_pid(db, ids[-1])
        if pid is None:
            time.sleep(0.02)
            continue  # not up yet, or ended meanwhile
        found = db.execute("SELECT backend_xid IS NOT NULL FROM pg_stat_activity WHERE pid = %s"
                           " AND xact_start IS NOT NULL AND wait_event_type = 'Extension'", [pid]).fetchone()
        if found is not None:
            holding += found[0]
            before += not found[0]
        looks -= 1
        time.sleep(0.02)
    return holding, before, ids


@pytest.mark.slow
@pytest.mark.parametrize("lock_mode", ["rows", "table"])
def test_under_load_the_default_rests_between_a_pages_rows_unless_the_page_holds_the_table(cluster, db, lock_mode):
    """Under load, the gentle default rests within a page too, between its rows, after each
    slice of its work (throttle/duty.rs): the application meets a little of the backfill's work
    at a time. So a worker whose pages lock rows is found resting inside a page (its
    transaction open, in an `Extension` wait). A page that holds the table in SHARE mode makes
    every writer of the table wait until it commits: it never rests."""
    # Wide rows, so that a page's rows take longer than a slice of work on any machine.
    db.execute(
        """CREATE TABLE sliced (id bigint PRIMARY KEY, v text NOT NULL);
           INSERT INTO sliced SELECT g, repeat('x', 2000) FROM generate_series(1, 100000) g; ANALYZE sliced"""
    )
    load = None
    try:
        set_duty_cycle(db, 20)
        load = ActiveSessions(cluster, db.info.dbname, 4)
        wait_for_the_load(db)
        db.execute(f"SET backfill.lock_mode = '{lock_mode}'")
        start = "SELECT backfill_start('sliced', confirm => true)"
        first = db.execute(start).fetchone()[0]
        wait_for_reason(db, first, "load", "pages take 20% of the time", timeout=30)
        cancel_and_wait_for_its_workers(db, first)
        resting, _, ids = looks_resting_inside_a_page(db, start)
        row_locked, table_locked = db.execute(
            "SELECT sum(pages_row_locked)::bigint, sum(pages_table_locked)::bigint FROM backfill.job_table"
            " WHERE job_id = ANY (%s)", [ids]).fetchone()
        if lock_mode == "rows":
            assert row_locked > 0 and table_locked == 0, (row_locked, table_locked)
            assert resting >= 5, f"resting inside a page in {resting} of 100 looks"
        else:
            assert table_locked > 0 and row_locked == 0, (row_locked, table_locked)
            assert resting == 0, f"resting inside a table-locked page in {resting} of 100 looks"
    finally:
        if load is not None:
            load.stop()
        db.execute("RESET backfill.lock_mode")
        cancel_running(db)
        set_duty_cycle(db, None)


@pytest.mark.slow
def test_under_load_the_default_rests_between_a_pages_queries_before_it_locks_anything(cluster, db, roles):
    """Under load, the gentle default rests within a page between its queries too, not only
    between its rows (worker/scan/mod.rs): a page's reads of its backfill and its checks of the
    table and of the starter's rights are most of its work, and without rests among them they
    are the longest the worker holds a CPU at a time. So a worker is found resting inside a
    page's transaction before the page has locked or written anything (no xid yet); without
    those rests, it never is (its first rest would come after its first row lock). The check of
    the starter's rights runs every page: for a role that may UPDATE only the last of 1,500
    columns, it looks at every column's privileges, so that the page's work before its first
    row takes more than a slice of work on any machine. Pages of 10 rows: most of a page's
    work is before its rows."""
    columns = ", ".join(f"c{i} int" for i in range(1, 1501))
    db.execute(f"""CREATE TABLE checked (id bigint PRIMARY KEY, {columns});
                   INSERT INTO checked (id) SELECT g FROM generate_series(1, 3000) g; ANALYZE checked""")
    starter = roles.create("slicer", "operator")
    db.execute(f"GRANT SELECT, UPDATE (c1500) ON checked TO {starter}")
    load = None
    try:
        set_duty_cycle(db, 20)
        load = ActiveSessions(cluster, db.info.dbname, 4)
        wait_for_the_load(db)
        start, conn = "SELECT backfill_start('checked', confirm => true, batch_size => 10)", roles.connect(starter)
        first = conn.execute(start).fetchone()[0]
        wait_for_reason(db, first, "load", "pages take 20% of the time", timeout=30)
        cancel_and_wait_for_its_workers(db, first)
        holding, before, _ = looks_resting_inside_a_page(db, start, starter=conn)
        assert before >= 5, f"resting inside a page before its first lock in {before} of 100 looks ({holding} after)"
    finally:
        if load is not None:
            load.stop()
        cancel_running(db)
        set_duty_cycle(db, None)


# Whether the insert position is in the last 15% of its WAL segment, and whether the next
# segment's file exists in pg_wal. (pg_walfile_name() names the segment holding the byte before
# a position: one byte past the next segment's start names that segment.)
NEXT_WAL_SEGMENT = """
    SELECT in_segment::float8 / segment >= 0.85,
           EXISTS (SELECT FROM pg_catalog.pg_ls_waldir()
                    WHERE name = pg_catalog.pg_walfile_name(inserted + (segment - in_segment + 1)))
      FROM (SELECT pg_catalog.pg_current_wal_insert_lsn() AS inserted,
                   pg_catalog.pg_size_bytes(pg_catalog.current_setting('wal_segment_size')) AS segment) w,
           LATERAL (SELECT (inserted - '0/0'::pg_lsn) % segment AS in_segment) s"""


@pytest.mark.cluster
@pytest.mark.slow
def test_a_resting_backfill_makes_the_next_wal_segment_before_anything_writes_into_it(cluster):
    """Under load, a resting worker creates the next WAL segment once three quarters of the one
    being written are written (pg/wal.rs): the commit that would first write into it would
    otherwise create it (zero-filled and synced) holding the WAL write lock, and every commit
    behind it would wait. On a new cluster, where no checkpoint has recycled a segment for
    later, the next segment exists whenever the backfill is in the last 15% of the present one;
    without the worker's preparing it, it would not exist until something wrote into it."""
    fresh = extra_cluster(cluster, "wal_ahead")
    fresh.start("backfill.default_duty_cycle = 20")
    load = None
    try:
        conn = fresh.connect()
        conn.execute("CREATE EXTENSION pg_backfill")
        # About 120 MB of messages: seven segments' worth or more.
        conn.execute("""CREATE TABLE ahead (id bigint PRIMARY KEY, v text NOT NULL);
                        INSERT INTO ahead SELECT g, repeat('x', 2000) FROM generate_series(1, 60000) g""")
        conn.execute("VACUUM ANALYZE ahead")
        load = ActiveSessions(fresh, "postgres", 4)
        wait_for_the_load(conn)
        backfill_id = conn.execute("SELECT backfill_start('ahead', confirm => true)").fetchone()[0]
        wait_for_reason(conn, backfill_id, "load", "pages take 20% of the time", timeout=30)
        near_the_end, next_there = 0, 0
        while status(conn, backfill_id, "state") == "running":
            late, exists = conn.execute(NEXT_WAL_SEGMENT).fetchone()
            if late:
                near_the_end += 1
                next_there += exists
            time.sleep(0.01)
        assert status(conn, backfill_id, "state") == "done"
        assert near_the_end >= 5, f"only {near_the_end} looks in a segment's last 15%"
        assert next_there >= 0.8 * near_the_end, \
            f"the next segment existed in {next_there} of {near_the_end} looks in a segment's last 15%"
    finally:
        if load is not None:
            load.stop()
        fresh.stop()


@pytest.mark.slow
def test_a_pipelines_default_backfill_counts_the_walsenders_sending_in_each_page(cluster, db):
    """For a pipeline's backfill, the gentle default waits after each page until the slot's
    walsender has sent it, up to a second, and counts in the page's time what the walsender ran
    meanwhile (its decoding is the page's cost too). With the walsender stopped (SIGSTOP) under
    load, each page waits that second (a stopped walsender runs nothing, so it adds no rest):
    at most one page a second, where without the wait pages of 100 rows go by the hundred. Once
    the walsender goes on, the backfill finishes."""
    db.execute(
        """CREATE TABLE decoded (id bigint PRIMARY KEY, v int NOT NULL);
           INSERT INTO decoded SELECT g, g % 7 FROM generate_series(1, 100000) g;"""
    )
    db.execute("VACUUM ANALYZE decoded")
    db.execute("SELECT pg_create_logical_replication_slot('sending', 'test_decoding')")
    consumer = Consumer(cluster, db.info.dbname, "sending")
    load, walsender = None, None
    try:
        walsender = wait_for(lambda: db.execute(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'sending'").fetchone()[0], what="the consumer")
        set_duty_cycle(db, 50)
        load = ActiveSessions(cluster, db.info.dbname, 4)
        wait_for_the_load(db)
        backfill_id = db.execute(
            "SELECT backfill_start('decoded', confirm => true, slot => 'sending', batch_size => 100)").fetchone()[0]
        wait_for_reason(db, backfill_id, "load", "pages take 50% of the time", timeout=30)

        os.kill(walsender, signal.SIGSTOP)
        time.sleep(1.5)  # the page under way, and the one that may have begun meanwhile
        before = status(db, backfill_id, "rows_done")
        time.sleep(6)
        moved = status(db, backfill_id, "rows_done") - before
        # 6 s hold at most 6 whole waits of a second, plus the page under way.
        assert moved <= 7 * 100, f"{moved} rows in 6 s with the walsender stopped"
        assert status(db, backfill_id, "state") == "running"

        os.kill(walsender, signal.SIGCONT)
        walsender = None
        load.stop()
        load = None
        assert wait_until_ended(db, backfill_id) == "done"
    finally:
        if walsender is not None:
            os.kill(walsender, signal.SIGCONT)
        if load is not None:
            load.stop()
        cancel_running(db)
        set_duty_cycle(db, None)
        consumer.stop()
        db.execute("SELECT pg_drop_replication_slot('sending')")
