"""Operations: pipelines (slot and publication), pausing with the consumer, back-pressure,
pacing, retries, failures, waiting for delivery, and surviving server restarts."""

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import (PG_BIN, PG_MAJOR, PG_ROOT, ROOT, Consumer, extra_cluster, assert_each_row_read_once, backfill_messages, error_of, status, wait_for,
                      wait_until_ended, wal2json_changes, worker_pid)

@pytest.fixture
def events(db):
    db.execute(
        """CREATE TABLE events (id bigint PRIMARY KEY, body text NOT NULL);
           INSERT INTO events SELECT g, repeat('x', 100) FROM generate_series(1, 20000) g;
           ANALYZE events;
           CREATE PUBLICATION pipeline FOR TABLE events;"""
    )
    return db


def test_slot_and_publication_are_checked(cluster, events):
    events.execute("CREATE TABLE other (id int PRIMARY KEY)")
    e = error_of(events, "SELECT backfill_start('events', confirm => true, slot => 'nope')")
    assert e.sqlstate == "42704" and "pg_create_logical_replication_slot" in e.diag.message_hint
    events.execute("SELECT pg_create_physical_replication_slot('phys')")
    e = error_of(events, "SELECT backfill_start('events', confirm => true, slot => 'phys')")
    assert e.sqlstate == "55000" and "not a logical slot" in e.diag.message_primary
    with cluster.connect() as elsewhere:
        elsewhere.execute("SELECT pg_create_logical_replication_slot('elsewhere', 'test_decoding')")
    try:
        e = error_of(events, "SELECT backfill_start('events', confirm => true, slot => 'elsewhere')")
        assert e.sqlstate == "55000" and "another database" in e.diag.message_primary
    finally:
        with cluster.connect() as elsewhere:
            elsewhere.execute("SELECT pg_drop_replication_slot('elsewhere')")
    events.execute("SELECT pg_create_logical_replication_slot('s', 'test_decoding')")
    e = error_of(events, "SELECT backfill_start(ARRAY['events', 'other']::regclass[], confirm => true, slot => 's', publication => 'pipeline')")
    assert e.sqlstate == "55000" and "not in publication" in e.diag.message_primary
    assert "ALTER PUBLICATION pipeline ADD TABLE public.other" in e.diag.message_hint
    e = error_of(events, "SELECT backfill_start('events', confirm => true, publication => 'missing')")
    assert e.sqlstate == "42704"
    e = error_of(events, "SELECT backfill_start('events', confirm => true, max_lag => 1000)")
    assert e.sqlstate == "22023" and "slot" in e.diag.message_primary
    first = events.execute("SELECT backfill_start('events', confirm => true, slot => 's', publication => 'pipeline')").fetchone()[0]
    e = error_of(events, "SELECT backfill_start('other', confirm => true, slot => 's')")
    assert e.sqlstate == "55006" and f"Backfill {first}" in e.diag.message_detail
    events.execute("SELECT backfill_cancel(%s)", [first])


def test_backfill_waits_while_the_slot_has_no_consumer_and_names_its_slot(cluster, events):
    events.execute("SELECT pg_create_logical_replication_slot('pipe', 'test_decoding')")
    backfill_id = events.execute("SELECT backfill_start('events', confirm => true, slot => 'pipe')").fetchone()[0]
    waiting = 'the consumer of slot "pipe": none is connected'
    wait_for(lambda: status(events, backfill_id, "waiting_for") == waiting, what="the wait")
    assert status(events, backfill_id, "waiting_kind") == "consumer_away"
    assert status(events, backfill_id, "state") == "running"  # waiting is not a state: it still runs
    assert worker_pid(events, backfill_id) is not None, "it waits; it did not give up"
    time.sleep(1.5)
    assert status(events, backfill_id, "rows_done") == 0
    consumer = Consumer(cluster, events.info.dbname, "pipe")
    try:
        assert wait_until_ended(events, backfill_id) == "done"
        wait_for(lambda: status(events, backfill_id, "delivered"), what="delivery")
    finally:
        consumer.stop()
    messages = consumer.messages()
    assert len([m for m in messages if m["op"] == "read"]) == 20000
    assert all(m["slot"] == "pipe" for m in messages)


@pytest.mark.skipif(PG_MAJOR < 17, reason="failover slots are new in PostgreSQL 17")
def test_a_failover_slot_serves_as_the_backfills_slot(cluster, events):
    """A slot made to be synchronized to standbys (failover => true, 17+) is an ordinary logical
    slot to the backfill: its consumer receives every row once."""
    events.execute("SELECT pg_create_logical_replication_slot('pipe', 'test_decoding', failover => true)")
    assert events.execute("SELECT failover FROM pg_replication_slots WHERE slot_name = 'pipe'").fetchone()[0] is True
    consumer = Consumer(cluster, events.info.dbname, "pipe")
    try:
        backfill_id = events.execute("SELECT backfill_start('events', confirm => true, slot => 'pipe')").fetchone()[0]
        assert wait_until_ended(events, backfill_id) == "done"
        wait_for(lambda: status(events, backfill_id, "delivered"), what="delivery")
    finally:
        consumer.stop()
    messages = consumer.messages()
    assert_each_row_read_once(messages, range(1, 20001))
    assert all(m["slot"] == "pipe" for m in messages)


@pytest.mark.slow
def test_back_pressure_stops_below_the_lag_limit_and_resumes_when_the_consumer_catches_up(cluster, events):
    # The slot's lag is all WAL past what its consumer confirmed, whoever wrote it (CI twice saw
    # about 400 kB of other WAL land while a page ran): the stop is judged by what the backfill
    # itself wrote before it, the bytes of its messages, which other writers only make fewer.
    events.execute("ALTER TABLE events SET (autovacuum_enabled = off)")
    events.execute("SELECT pg_create_logical_replication_slot('pipe', 'test_decoding')")
    consumer = Consumer(cluster, events.info.dbname, "pipe")
    try:
        wait_for(lambda: events.execute("SELECT active FROM pg_replication_slots WHERE slot_name = 'pipe'").fetchone()[0])
        consumer.pause()  # connected (the slot stays active) but confirms nothing
        limit = 1_000_000
        backfill_id = events.execute(
            "SELECT backfill_start('events', confirm => true, slot => 'pipe', max_lag => %s, batch_size => 100)", [limit]
        ).fetchone()[0]
        wait_for(lambda: status(events, backfill_id, "waiting_kind") == "consumer_lag", what="back-pressure")
        assert status(events, backfill_id, "state") == "running"
        held = status(events, backfill_id, "rows_done")
        # The lag the worker saw when it stopped: past the limit (that is why it stopped).
        lag = int(re.search(r"it lags (\d+) bytes", status(events, backfill_id, "waiting_for")).group(1))
        assert lag > limit
        time.sleep(1.5)
        assert status(events, backfill_id, "rows_done") == held, "it must not go on while the consumer lags"
        assert 0 < held < 20000
        consumer.carry_on()
        assert wait_until_ended(events, backfill_id) == "done"
        wait_for(lambda: status(events, backfill_id, "delivered"), what="delivery")
    finally:
        consumer.stop()
    # What the backfill wrote before it stopped: its first `held` reads. No more than the limit
    # and a few pages of them (a page is 100 reads of about 300 bytes of message each).
    with open(consumer.output.name, "rb") as f:
        sizes = [int(re.search(rb" sz: (\d+) ", line).group(1)) for line in f
                 if line.startswith(b"message: transactional: 1 prefix: backfill,") and b'"op":"read"' in line]
    assert len(sizes) == 20000
    written = sum(sizes[:held])
    page_bytes = 100 * 400
    assert written < limit + 3 * page_bytes, f"it stopped after {written} bytes of messages ({held} rows; it saw a lag of {lag}), far past the limit"


@pytest.mark.slow
def test_rate_limit_is_never_exceeded_over_ten_seconds(events):
    """At 1,500 rows/s the backfill delivers at most 10% more over ten seconds, and its status
    says so. (A slower machine delivers less: only the limit is the pacer's; a lower bound would
    be the machine's speed.)"""
    backfill_id = events.execute(
        "SELECT backfill_start('events', confirm => true, batch_size => 200, rows_per_second => 1500)"
    ).fetchone()[0]
    time.sleep(1)
    t0, rows0 = time.monotonic(), status(events, backfill_id, "rows_done")
    time.sleep(10)
    t1, rows1 = time.monotonic(), status(events, backfill_id, "rows_done")
    rate = (rows1 - rows0) / (t1 - t0)
    assert 0 < rate <= 1650, f"{rate:.0f} rows/s against a limit of 1500"
    assert 0 < status(events, backfill_id, "rows_per_second_last_minute") <= 1650
    assert status(events, backfill_id, "time_left") is not None
    events.execute("SELECT backfill_set(%s, rows_per_second => 0)", [backfill_id])  # 0 lifts the limit
    assert wait_until_ended(events, backfill_id) == "done"


@pytest.mark.parametrize("rate", [4000, 2000])
def test_the_rate_is_the_backfills_total_however_many_workers_share_it(events, rate):
    """parallel => 2 at 4,000 rows/s: 20,000 rows take five seconds, not two and a half (each
    worker pacing itself to the whole rate); and backfill_set's new rate is a total too."""
    started = time.monotonic()
    backfill_id = events.execute(
        "SELECT backfill_start('events', confirm => true, batch_size => 200, rows_per_second => 4000, parallel => 2)"
    ).fetchone()[0]
    assert events.execute("SELECT count(*) FROM backfill_tables WHERE backfill_id = %s", [backfill_id]).fetchone()[0] == 2
    if rate != 4000:
        time.sleep(1)
        events.execute("SELECT backfill_set(%s, rows_per_second => %s)", [backfill_id, rate])
    assert wait_until_ended(events, backfill_id, timeout=60) == "done"
    elapsed = time.monotonic() - started
    expected = 20000 / 4000 if rate == 4000 else 1 + (20000 - 4000) / rate
    # At least the time the total rate allows (each worker pacing itself to the whole rate would
    # take half); how much longer is the machine's speed, not the pacer's.
    assert elapsed >= 0.85 * expected, f"{elapsed:.1f} s for at least {expected:.1f} s"


def test_backfill_set_changes_pacing_of_a_running_backfill(events):
    backfill_id = events.execute(
        "SELECT backfill_start('events', confirm => true, batch_size => 100, rows_per_second => 200)"
    ).fetchone()[0]
    time.sleep(1)
    assert status(events, backfill_id, "rows_done") < 1000
    events.execute("SELECT backfill_set(%s, batch_size => 2000, rows_per_second => 0)", [backfill_id])
    assert wait_until_ended(events, backfill_id, timeout=20) == "done"
    assert status(events, backfill_id, "batch_size", "rows_per_second") == (2000, None)
    e = error_of(events, "SELECT backfill_set(%s, batch_size => 0)", [backfill_id])
    assert e.sqlstate == "22023"


def test_a_row_locked_longer_than_a_page_waits_is_retried(cluster, events):
    events.execute("SELECT pg_create_logical_replication_slot('consumer', 'wal2json')")
    with cluster.connect(events.info.dbname) as writer:
        writer.execute("BEGIN")
        writer.execute("UPDATE events SET body = 'held' WHERE id = 10000")
        backfill_id = events.execute("SELECT backfill_start('events', confirm => true, batch_size => 500)").fetchone()[0]
        time.sleep(2.5)  # far longer than backfill.lock_timeout (200ms): several retries
        assert status(events, backfill_id, "state") == "running"
        assert status(events, backfill_id, "rows_done") < 10000
        writer.execute("COMMIT")  # the writer never failed
    assert wait_until_ended(events, backfill_id) == "done"
    assert_each_row_read_once(backfill_messages(wal2json_changes(events, "consumer")), range(1, 20001))


def test_a_non_transient_failure_is_recorded_with_key_and_sqlstate_and_resume_retries(events):
    events.execute("SELECT pg_create_logical_replication_slot('consumer', 'wal2json')")
    backfill_id = events.execute(
        "SELECT backfill_start('events', confirm => true, batch_size => 100, rows_per_second => 4000)"
    ).fetchone()[0]
    time.sleep(1)
    events.execute("ALTER TABLE events RENAME TO events_renamed")
    assert wait_until_ended(events, backfill_id) == "failed"
    sqlstate, error = status(events, backfill_id, "last_error_sqlstate", "last_error")
    cursor = events.execute("SELECT cursor[1] FROM backfill_tables WHERE backfill_id = %s", [backfill_id]).fetchone()[0]
    assert sqlstate == "42P01"
    assert "events" in error and f"after key {cursor}" in error
    time.sleep(1.5)
    assert worker_pid(events, backfill_id) is None, "a failed backfill is not retried forever"
    e = error_of(events, "SELECT backfill_wait(%s)", [backfill_id])
    assert e.sqlstate == "55000" and "backfill_resume" in e.diag.message_hint
    events.execute("SELECT backfill_resume(%s)", [backfill_id])
    assert events.execute("SELECT backfill_wait(%s, '60 seconds')", [backfill_id]).fetchone()[0] is True
    assert_each_row_read_once(backfill_messages(wal2json_changes(events, "consumer")), range(1, 20001))


def test_backfill_wait_times_out_refuses_its_own_transaction_and_sees_delivery(cluster, events):
    events.execute("SELECT pg_create_logical_replication_slot('pipe', 'test_decoding')")
    consumer = Consumer(cluster, events.info.dbname, "pipe")
    try:
        wait_for(lambda: events.execute("SELECT active FROM pg_replication_slots WHERE slot_name = 'pipe'").fetchone()[0])
        events.execute("BEGIN")
        backfill_id = events.execute("SELECT backfill_start('events', confirm => true, slot => 'pipe')").fetchone()[0]
        e = error_of(events, "SELECT backfill_wait(%s)", [backfill_id])
        assert e.sqlstate == "55000" and "\\gset" in e.diag.message_hint
        events.execute("ROLLBACK")
        backfill_id = events.execute(
            "SELECT backfill_start('events', confirm => true, slot => 'pipe', rows_per_second => 10000)"
        ).fetchone()[0]
        wait_for(lambda: status(events, backfill_id, "rows_done") > 0)
        consumer.pause()  # stops confirming: the stream is not caught up
        t0 = time.monotonic()
        assert events.execute("SELECT backfill_wait(%s, '1 second')", [backfill_id]).fetchone()[0] is False
        assert 0.9 < time.monotonic() - t0 < 5
        wait_for(lambda: status(events, backfill_id, "state") == "done", what="the scan's end")
        watermark, delivered = status(events, backfill_id, "watermark_lsn", "delivered")
        assert watermark is not None and delivered is False
        confirmed = events.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'pipe'").fetchone()[0]
        assert events.execute("SELECT %s::pg_lsn < %s::pg_lsn", [confirmed, watermark]).fetchone()[0]
        consumer.carry_on()
        assert events.execute("SELECT backfill_wait(%s, '30 seconds')", [backfill_id]).fetchone()[0] is True
        assert status(events, backfill_id, "delivered") is True
    finally:
        consumer.stop()


def restart_scenario(cluster, name, preload):
    other = extra_cluster(cluster, name)
    conf = "shared_preload_libraries = 'pg_backfill'" if preload else ""
    other.start(conf)
    conn = other.connect()
    conn.execute(
        """CREATE EXTENSION pg_backfill;
           CREATE TABLE events (id bigint PRIMARY KEY, body text NOT NULL);
           INSERT INTO events SELECT g, repeat('x', 100) FROM generate_series(1, 60000) g;"""
    )
    conn.execute("SELECT pg_create_logical_replication_slot('consumer', 'wal2json')")
    backfill_id = conn.execute(
        "SELECT backfill_start('events', confirm => true, batch_size => 500, rows_per_second => 20000)"
    ).fetchone()[0]
    wait_for(lambda: status(conn, backfill_id, "rows_done") > 10000)
    conn.close()
    return other, backfill_id


@pytest.mark.cluster
def test_preloaded_backfill_resumes_by_itself_after_an_immediate_stop(cluster):
    other, backfill_id = restart_scenario(cluster, "preload", preload=True)
    try:
        other.pg_ctl("-m immediate stop")
        other.pg_ctl("start")
        with other.connect() as conn:
            assert status(conn, backfill_id, "auto_resume") is True
            assert wait_until_ended(conn, backfill_id) == "done"
            assert_each_row_read_once(backfill_messages(wal2json_changes(conn, "consumer")), range(1, 60001))
    finally:
        other.stop()


@pytest.mark.cluster
def test_without_preloading_a_restart_leaves_it_to_backfill_resume(cluster):
    other, backfill_id = restart_scenario(cluster, "nopreload", preload=False)
    try:
        other.pg_ctl("-m fast restart")
        with other.connect() as conn:
            assert status(conn, backfill_id, "state", "auto_resume") == ("running", False)
            time.sleep(1.5)
            assert worker_pid(conn, backfill_id) is None
            conn.execute("SELECT backfill_resume(%s)", [backfill_id])
            assert wait_until_ended(conn, backfill_id) == "done"
            assert_each_row_read_once(backfill_messages(wal2json_changes(conn, "consumer")), range(1, 60001))
    finally:
        other.stop()


def test_a_native_subscriber_of_a_for_all_tables_publication_keeps_applying(cluster, scratch_database):
    """A FOR ALL TABLES publication includes pg_backfill's state tables. The README's setup: the
    subscriber has the extension too, whose replica triggers discard the publisher's state rows;
    its subscription keeps applying, and its own backfills, ids and keys stay its own."""
    pub, sub = scratch_database("pub_all"), scratch_database("sub_all")
    with cluster.connect(pub) as p, cluster.connect(sub) as s:
        for conn in (p, s):
            conn.execute("CREATE EXTENSION pg_backfill; CREATE TABLE items (id int PRIMARY KEY, label text)")
        p.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 5000) g")
        p.execute("CREATE PUBLICATION everything FOR ALL TABLES")
        # A subscription to the same cluster must use a slot made beforehand.
        p.execute("SELECT pg_create_logical_replication_slot('sub_all', 'pgoutput')")
        s.execute(
            f"""CREATE SUBSCRIPTION sub_all
                CONNECTION 'host=127.0.0.1 port={cluster.port} user=postgres dbname={pub}'
                PUBLICATION everything WITH (create_slot = false, slot_name = 'sub_all')"""
        )
        try:
            same = "SELECT count(*), md5(string_agg(id || ':' || label, ',' ORDER BY id)) FROM items"
            wait_for(lambda: s.execute(same).fetchone()[0] == 5000, timeout=60, what="the initial copy")
            backfill_id = p.execute("SELECT backfill_start('items', confirm => true, batch_size => 500)").fetchone()[0]
            p.execute("UPDATE items SET label = 'changed' WHERE id % 100 = 0")
            assert wait_until_ended(p, backfill_id) == "done"
            p.execute("SELECT backfill_rotate_key()")
            p.execute("INSERT INTO items VALUES (5001, 'after the backfill')")
            # Everything after the state rows still applies; the subscriber receives the tables'
            # changes (pgoutput sends a native subscription no logical messages).
            wait_for(lambda: s.execute(same).fetchone() == p.execute(same).fetchone(), timeout=60, what="catch-up")
            # Its apply worker runs (table synchronization workers may still be finishing: 17 and
            # later name each worker's type, 15 gives an apply worker no relation).
            apply_worker = "worker_type = 'apply'" if PG_MAJOR >= 17 else "relid IS NULL"
            assert s.execute(f"SELECT count(*) FROM pg_stat_subscription WHERE subname = 'sub_all' AND pid IS NOT NULL AND {apply_worker}").fetchone()[0] == 1
            assert s.execute("SELECT count(*) FROM backfill.job").fetchone()[0] == 0
            assert s.execute("SELECT count(*) FROM backfill.message_key").fetchone()[0] == 1
            own = s.execute("SELECT backfill_start('items', confirm => true)").fetchone()[0]
            assert own == 1 and wait_until_ended(s, own) == "done"
        finally:
            s.execute("ALTER SUBSCRIPTION sub_all DISABLE")
            s.execute("ALTER SUBSCRIPTION sub_all SET (slot_name = NONE)")
            s.execute("DROP SUBSCRIPTION sub_all")


@pytest.mark.exclusive
@pytest.mark.cluster
def test_installing_a_new_library_leaves_a_running_preloaded_server_up(cluster, tmp_path):
    """The scripts install as package managers do: each file written beside its destination and
    renamed over it. A preloaded server, whose every process maps the installed library, keeps
    the file it mapped and runs on; its backfill completes. (Copied in place, the new bytes
    replaced the code those processes were running: they crashed, and with the library preloaded
    the server could stay down.) The "new library" here is another module's (pgoutput's), so
    that a process that ran its bytes would certainly fail; the real one is put back after."""
    other, backfill_id = restart_scenario(cluster, "install", preload=True)
    library = subprocess.run([f"{PG_BIN}/pg_config", "--pkglibdir"], capture_output=True, text=True, check=True).stdout.strip()
    # (The server's path; on the host under PG_ROOT, where install.sh installs.)
    installed = Path(f"{PG_ROOT}{library}") / "pg_backfill.so"

    def install(source: Path):
        stage = tmp_path / source.name
        target = stage / Path(library).relative_to("/") / installed.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        subprocess.run(["bash", "-c", f"source '{ROOT}/scripts/lib/install.sh' && install_package_files '{stage}'"], check=True)

    saved = tmp_path / "saved" / "pg_backfill.so"
    saved.parent.mkdir()
    shutil.copyfile(installed, saved)
    try:
        install(Path(f"{PG_ROOT}{library}") / "pgoutput.so")
        with other.connect() as conn:
            assert wait_until_ended(conn, backfill_id) == "done"
            assert_each_row_read_once(backfill_messages(wal2json_changes(conn, "consumer")), range(1, 60001))
    finally:
        install(saved)
        other.stop()
    assert "terminated by signal" not in (Path(other.dir) / "server.log").read_text()


# Progress (docs/reference.md#progress): percent_done is rows_done against rows_estimated, and
# time_left the rows still expected at the last minute's rate, at every moment of a run.
PROGRESS = "state, rows_done, rows_estimated, percent_done, time_left, rows_per_second_last_minute"


def sample_progress(conn, backfill_id, while_running=lambda: None):
    """backfill_status's progress columns, sampled until the backfill ends (then once more)."""
    samples = []
    while True:
        samples.append(status(conn, backfill_id, *PROGRESS.split(", ")))
        if samples[-1][0] not in ("running", "paused"):
            return samples
        while_running()
        time.sleep(0.02)


def assert_progress_agrees(samples):
    from decimal import ROUND_DOWN, ROUND_HALF_UP, Decimal

    running = [s for s in samples if s[0] == "running"]
    assert len(running) >= 3, f"the run must be seen running: {samples}"
    for state, done, expected, percent, time_left, rate in running:
        # Equal only once every table has ended and the backfill is finishing (its end marker,
        # its watermark): the percentage still stays below 100 until it is done.
        assert done <= expected, f"rows {done}/{expected} while running"
        exact = (Decimal(100) * done / expected).quantize(Decimal("0.1"), rounding=ROUND_DOWN)
        assert percent == min(exact, Decimal("99.9")), f"{percent}% next to rows {done}/{expected}"
        if time_left is not None:
            left = (Decimal(expected - done) / rate).quantize(Decimal(1), rounding=ROUND_HALF_UP)
            assert time_left.total_seconds() == left, f"{time_left} left for {expected - done} rows at {rate}/s"
    for before, after in zip(samples, samples[1:]):
        assert after[1] >= before[1] and after[3] >= before[3], f"progress went backwards: {before} then {after}"
    state, done, expected, percent, _, _ = samples[-1]
    assert (state, percent, done) == ("done", 100, expected)


def test_progress_agrees_with_itself_on_the_demo_table(db):
    """tutorial.md's demo: 50,000 orders, paced, an application writing. (Before, the
    percentage followed key-range histograms and the rows the estimate: 1.0% next to
    rows 7500/50000.)"""
    db.execute(
        """CREATE TABLE orders (id bigint PRIMARY KEY, customer_id integer NOT NULL, status text NOT NULL,
                                amount numeric(10,2) NOT NULL, items jsonb NOT NULL, created_at timestamptz NOT NULL);
           INSERT INTO orders
           SELECT g, 1 + g % 5000, (ARRAY['new', 'paid', 'shipped'])[1 + g % 3], round((g % 997) * 1.37, 2),
                  jsonb_build_array(jsonb_build_object('sku', 'SKU-' || g % 100, 'qty', 1 + g % 4)),
                  timestamptz '2024-01-01' + g * interval '1 minute'
             FROM generate_series(1, 50000) g;
           ANALYZE orders;"""
    )
    writes = iter(range(1, 10**6))

    def application_writes():
        i = next(writes)
        db.execute("UPDATE orders SET status = 'refunded' WHERE id = %s", [(i * 7919) % 50000 + 1])
        db.execute("INSERT INTO orders VALUES (100000 + %s, 42, 'new', 9.99, '[]', now())", [i])

    backfill_id = db.execute(
        "SELECT backfill_start('orders', confirm => true, rows_per_second => 25000, batch_size => 500)"
    ).fetchone()[0]
    assert_progress_agrees(sample_progress(db, backfill_id, application_writes))


def test_progress_agrees_with_itself_on_skewed_keys_and_a_wrong_estimate(db):
    """Two workers over a skewed key (their ranges end at different times), a first table whose
    estimate is 20 times too low (its rows pass it) and a second one whose estimate is 4 times
    too high (it ends short): the percentage still never goes backwards, nor reaches 100 early."""
    db.execute(
        # (No autovacuum: it would correct both estimates.)
        """CREATE TABLE skewed (id bigint PRIMARY KEY, v text) WITH (autovacuum_enabled = false);
           INSERT INTO skewed SELECT CASE WHEN g <= 18000 THEN g ELSE g * 1000 END, 'v' FROM generate_series(1, 20000) g;
           ANALYZE skewed;
           CREATE TABLE shrunk (id int PRIMARY KEY, v text) WITH (autovacuum_enabled = false);
           INSERT INTO shrunk SELECT g, 'v' FROM generate_series(1, 8000) g;
           ANALYZE shrunk;
           DELETE FROM shrunk WHERE id > 2000;"""
    )
    # The planner scales reltuples by the table's pages: a twentieth of the density.
    db.execute("UPDATE pg_class SET reltuples = reltuples / 20 WHERE oid = 'skewed'::regclass")
    estimates = dict(db.execute("SELECT table_name::text, rows_estimated FROM backfill_estimate(ARRAY['skewed', 'shrunk']::regclass[])").fetchall())
    assert estimates["skewed"] <= 1500 and estimates["shrunk"] >= 6000, estimates
    backfill_id = db.execute(
        "SELECT backfill_start(ARRAY['skewed', 'shrunk']::regclass[], confirm => true, parallel => 2,"
        " rows_per_second => 8000, batch_size => 200)"
    ).fetchone()[0]
    samples = sample_progress(db, backfill_id)
    assert_progress_agrees(samples)
    assert samples[-1][1] == 22000
    assert any(s[0] == "running" and s[2] > samples[0][2] for s in samples), "the rows never passed the estimate"
    assert samples[-1][2] < max(s[2] for s in samples), "no range ended short of its estimate"


def test_backfill_wait_reports_progress_as_it_waits(db):
    """backfill_wait() sends a NOTICE every backfill.wait_report_interval with the numbers of
    backfill_status; client_min_messages hides it. (A migration script in psql saw nothing for
    minutes, then "t".) 10,000 rows at 2,000 rows/s take at least 5 s on any machine: at 1 s,
    at least 3 reports, their percentages never going backwards."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'x' FROM generate_series(1, 10000) g; ANALYZE t")
    notices = []
    db.add_notice_handler(lambda diag: notices.append(diag.message_primary))
    db.execute("SET backfill.wait_report_interval = '1s'")
    backfill_id = db.execute("SELECT backfill_start('t', confirm => true, rows_per_second => 2000)").fetchone()[0]
    assert db.execute("SELECT backfill_wait(%s)", [backfill_id]).fetchone()[0] is True
    reports = [n for n in notices if n.startswith(f"backfill {backfill_id}: ")]
    assert len(reports) >= 3, notices
    percents = [float(re.search(r"([\d.]+)% \((\d+) of about (\d+) rows\)", r).group(1)) for r in reports]
    assert percents == sorted(percents) and percents[-1] > 0, reports

    notices.clear()
    db.execute("SET client_min_messages = warning")
    backfill_id = db.execute("SELECT backfill_start('t', confirm => true, rows_per_second => 4000)").fetchone()[0]
    assert db.execute("SELECT backfill_wait(%s)", [backfill_id]).fetchone()[0] is True
    assert notices == []
    db.execute("RESET client_min_messages; SET backfill.wait_report_interval = 0")
    backfill_id = db.execute("SELECT backfill_start('t', confirm => true, rows_per_second => 4000)").fetchone()[0]
    assert db.execute("SELECT backfill_wait(%s)", [backfill_id]).fetchone()[0] is True
    assert [n for n in notices if n.startswith("backfill ")] == [], notices
