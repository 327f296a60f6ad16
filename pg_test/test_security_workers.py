"""pg_backfill's workers, locks and snapshots are no one else's: backfill.max_workers caps the
workers of the whole cluster (a worker still starting included, and those kept for superusers),
no role blocks the starts or a new backfill's worker with a lock of its own, a transaction that
started a backfill cannot be prepared, and a start sees what committed after its snapshot."""

import time

import pytest

from conftest import error_of, wait_for, wait_until_ended, worker_pid
from security_helpers import make_table, next_backfill_id, operator, start, value


# --- the worker cap -------------------------------------------------------------------------------

def test_max_workers_caps_the_workers_that_run_at_once(db):
    for name in ("a", "b", "c", "d"):
        make_table(db, name, 1000)

    samples = []

    def workers():
        # Backfill workers as the cap counts them, admitted (each names itself 'pg_backfill <id>'):
        # not the resumer or a follow's dispatcher, which are pg_backfill's processes too (counting
        # them, "two workers" was once the resumer and one, and a third start passed).
        samples.append(value(db, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_backfill'"
                                 " AND application_name ~ '^pg_backfill [0-9]'"))
        return samples[-1]

    wait_for(lambda: workers() == 0, what="the workers of earlier tests to exit")
    samples.clear()
    db.execute("LOAD 'pg_backfill'")
    db.execute("ALTER SYSTEM SET backfill.max_workers = 2")
    try:
        db.execute("SELECT pg_reload_conf()")
        wait_for(lambda: value(db, "SHOW backfill.max_workers") == "2", what="the reload")
        running = [start(db, name, batch_size=5, rows_per_second=10) for name in ("a", "b")]
        wait_for(lambda: workers() == 2, what="two workers")
        e = error_of(db, "SELECT backfill_start('c', confirm => true)")
        assert e.sqlstate == "53400"
        assert "backfill.max_workers" in f"{e.diag.message_detail} {e.diag.message_hint}"
        assert e.diag.message_hint.startswith("Wait for a running backfill to end"), e.diag.message_hint
        for _ in range(5):
            workers()
            time.sleep(0.2)
        for backfill_id in running:
            db.execute("SELECT backfill_cancel(%s)", [backfill_id])
            assert wait_until_ended(db, backfill_id) == "cancelled"
        wait_for(lambda: workers() == 0, what="the cancelled workers to exit")
        e = error_of(db, "SELECT backfill_start('d', confirm => true, parallel => 3)")
        assert e.sqlstate == "53400"
        assert "can never" in e.diag.message_detail and "Wait" not in e.diag.message_hint, e.diag.message_hint
        assert workers() == 0
        assert max(samples) == 2, samples
    finally:
        db.execute("ALTER SYSTEM RESET backfill.max_workers")
        db.execute("SELECT pg_reload_conf()")


def test_a_request_for_more_workers_than_max_workers_allows_says_it_can_never_fit(db, roles):
    """parallel beyond backfill.max_workers (less the workers kept for superusers, for a role that
    is not one) can never start, however long one waits: the 53400 error says so and names the
    setting, instead of "wait for a backfill to finish"."""
    make_table(db, "a", 100)
    e = error_of(db, "SELECT backfill_start('a', confirm => true, parallel => 5)")
    assert e.sqlstate == "53400", e
    assert "can never" in e.diag.message_detail and "backfill.max_workers (4)" in e.diag.message_detail, e.diag.message_detail
    assert "parallel => 4" in e.diag.message_hint and "Wait" not in e.diag.message_hint, e.diag.message_hint
    operator = roles.create("many", "operator")
    db.execute(f"GRANT SELECT, UPDATE ON a TO {operator}")
    e = error_of(roles.connect(operator), "SELECT backfill_start('a', confirm => true, parallel => 4)")
    assert e.sqlstate == "53400", e
    assert "can never" in e.diag.message_detail and "backfill.superuser_reserved_workers (1)" in e.diag.message_detail, e
    assert "parallel => 3" in e.diag.message_hint and "Wait" not in e.diag.message_hint, e.diag.message_hint


def test_max_workers_counts_a_worker_that_is_still_starting(db, cluster):
    """A worker counts from the moment it is visible, before it is admitted: here one waits for
    the transaction that started its backfill to commit. (Counting only admitted workers let a
    third backfill_start through while the second's worker was starting: seen once in CI.)"""
    for name in ("a", "b", "c"):
        make_table(db, name, 1000)

    def workers():
        return value(db, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_backfill'")

    wait_for(lambda: workers() == 0, what="the workers of earlier tests to exit")
    db.execute("LOAD 'pg_backfill'")
    db.execute("ALTER SYSTEM SET backfill.max_workers = 2")
    starter = cluster.connect(db.info.dbname)
    try:
        db.execute("SELECT pg_reload_conf()")
        wait_for(lambda: value(db, "SHOW backfill.max_workers") == "2", what="the reload")
        wait_for(lambda: value(starter, "SHOW backfill.max_workers") == "2", what="the reload")
        running = start(db, "a", batch_size=5, rows_per_second=10)
        wait_for(lambda: workers() == 1, what="the first worker")
        # The next backfill's worker waits, before its admission, for this transaction to commit.
        starter.execute("BEGIN")
        starting = start(starter, "b", batch_size=5, rows_per_second=10)
        wait_for(lambda: workers() == 2, what="the second worker, held before its admission")
        # (A worker shows in pg_stat_activity a moment before it names itself.)
        starting_name = "SELECT application_name FROM pg_stat_activity WHERE application_name ~ '^pg_backfill starting'"
        wait_for(lambda: db.execute(starting_name).fetchone() is not None, what="the second worker to name itself")
        assert value(db, starting_name) == f"pg_backfill starting {starting}"
        starter.execute("SAVEPOINT third")
        e = error_of(starter, "SELECT backfill_start('c', confirm => true)")
        assert e.sqlstate == "53400", e
        assert "2 backfill worker(s)" in e.diag.message_detail
        starter.execute("ROLLBACK TO SAVEPOINT third")
        starter.execute("COMMIT")
        admitted = f"pg_backfill {starting}"
        wait_for(
            lambda: value(db, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [admitted]) == 1,
            what="the second worker to be admitted",
        )
        for backfill_id in (running, starting):
            db.execute("SELECT backfill_cancel(%s)", [backfill_id])
            assert wait_until_ended(db, backfill_id) == "cancelled"
    finally:
        starter.close()
        db.execute("ALTER SYSTEM RESET backfill.max_workers")
        db.execute("SELECT pg_reload_conf()")


def test_an_operator_cannot_take_the_workers_kept_for_superusers(db, roles):
    """backfill.superuser_reserved_workers (1 by default) of backfill.max_workers are kept for
    superusers, as superuser_reserved_connections keeps connections: an operator's slow
    backfills (or a loop of starts) cannot refuse everyone else, and a superuser can always
    start one, a repair say, while the operator's run."""
    for name in ("a", "b", "c"):
        make_table(db, name, 1000)

    def workers():
        return value(db, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_backfill'")

    wait_for(lambda: workers() == 0, what="the workers of earlier tests to exit")
    operator = roles.create("operator", "operator")
    db.execute(f"GRANT SELECT, UPDATE ON a, b, c TO {operator}")
    conn = roles.connect(operator)
    db.execute("LOAD 'pg_backfill'")
    db.execute("ALTER SYSTEM SET backfill.max_workers = 2")
    try:
        db.execute("SELECT pg_reload_conf()")
        wait_for(lambda: value(db, "SHOW backfill.max_workers") == "2", what="the reload")
        first = start(conn, "a", batch_size=5, rows_per_second=10)
        wait_for(lambda: workers() == 1, what="the operator's worker")
        e = error_of(conn, "SELECT backfill_start('b', confirm => true, rows_per_second => 10)")
        assert e.sqlstate == "53400" and "not a superuser" in e.diag.message_primary, e
        assert "superuser_reserved_workers" in e.diag.message_detail
        kept = start(db, "c", batch_size=5, rows_per_second=10)  # the superuser's, in the kept worker
        wait_for(lambda: workers() == 2, what="the superuser's worker")
        for backfill_id in (first, kept):
            db.execute("SELECT backfill_cancel(%s)", [backfill_id])
            assert wait_until_ended(db, backfill_id) == "cancelled"
    finally:
        db.execute("ALTER SYSTEM RESET backfill.max_workers")
        db.execute("SELECT pg_reload_conf()")


# --- pg_backfill's locks, snapshots and worker counts are no one else's ---------------------------

def test_no_role_blocks_the_starts_with_the_advisory_lock_0_10_0_took(db, roles):
    """0.10.0 serialized starts with pg_advisory_xact_lock(hashtext('pg_backfill.start')): any
    role that took that lock held every backfill_start of the database (and every DDL adding a
    table to a followed publication). pg_backfill's locks are now tags no SQL function takes."""
    make_table(db, "t", 100)
    squatter = roles.connect(roles.create("squatter"))
    squatter.execute("SELECT pg_advisory_lock(hashtext('pg_backfill.start'))")
    # (Without the fix the start waits for the squatter: 55P03 once the lock_timeout passes.)
    db.execute("SET lock_timeout = '20s'")
    backfill_id = start(db, "t")
    assert value(db, "SELECT backfill_wait(%s, interval '2 minutes')", [backfill_id]) is True


def test_no_role_holds_a_new_backfills_worker_by_taking_its_lock_ahead(db, roles):
    """0.10.0's worker took pg_advisory_lock(hashtext('pg_backfill.worker') + worker, id) before
    anything else: a role that took it ahead for the next ids left those backfills starting for
    ever, and backfill_cancel() marked one cancelled while its process stayed. Now neither."""
    make_table(db, "fast", 100)
    make_table(db, "slow", 1000)
    squatter = roles.connect(roles.create("squatter"))
    first = next_backfill_id(db)
    for backfill_id in range(first, first + 3):
        for worker in range(2):
            squatter.execute("SELECT pg_advisory_lock(hashtext('pg_backfill.worker') + %s::int, %s::int)",
                             [worker, backfill_id])
    fast = start(db, "fast")
    assert fast == first
    assert value(db, "SELECT backfill_wait(%s, interval '2 minutes')", [fast]) is True
    slow = start(db, "slow", batch_size=5, rows_per_second=10)
    admitted = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
    wait_for(lambda: value(db, admitted, [f"pg_backfill {slow}"]) == 1, timeout=60, what="the worker to be admitted")
    db.execute("SELECT backfill_cancel(%s)", [slow])
    assert wait_until_ended(db, slow) == "cancelled"
    wait_for(lambda: worker_pid(db, slow) is None, timeout=60, what="the cancelled backfill's worker to exit")


def test_a_transaction_that_started_a_backfill_cannot_be_prepared(db):
    """A prepared transaction keeps its locks, across restarts, until COMMIT PREPARED: one that
    started a backfill would hold the database's start lock, and its workers would wait for it.
    PREPARE TRANSACTION is refused first, whether or not the server allows prepared transactions
    (the test cluster does not: then PostgreSQL's own refusal, 55000, would come after ours)."""
    make_table(db, "t", 100)
    db.execute("BEGIN")
    start(db, "t")
    e = error_of(db, "PREPARE TRANSACTION 'backfill_start'")
    db.execute("ROLLBACK")
    assert e.sqlstate == "0A000", e
    assert e.diag.message_primary == "cannot PREPARE a transaction that started a backfill"
    assert "COMMIT PREPARED" in e.diag.message_detail and e.diag.message_hint
    assert value(db, "SELECT count(*) FROM pg_prepared_xacts") == 0
    assert value(db, "SELECT count(*) FROM backfill.job") == 0
    db.execute("SET lock_timeout = '20s'")
    assert value(db, "SELECT backfill_wait(%s, interval '2 minutes')", [start(db, "t")]) is True


@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "SERIALIZABLE"])
def test_a_start_sees_a_backfill_of_its_table_committed_after_its_snapshot(db, cluster, isolation):
    """One backfill per table and one per slot: a start checks on the latest committed state,
    under the start lock, not on its transaction's snapshot. (0.10.0 read that snapshot: in
    REPEATABLE READ, two backfills of one table started.)"""
    make_table(db, "t", 1000)
    db.execute("SELECT pg_create_logical_replication_slot('busy_slot', 'wal2json')")
    make_table(db, "u", 100)
    other = cluster.connect(db.info.dbname)
    try:
        db.execute(f"BEGIN ISOLATION LEVEL {isolation}")
        assert value(db, "SELECT count(*) FROM backfill_status") == 0  # the snapshot, taken here
        running = start(other, "t", batch_size=5, rows_per_second=10, slot="busy_slot")
        e = error_of(db, "SELECT backfill_start('t', confirm => true)")
        db.execute("ROLLBACK")
        assert e.sqlstate == "55006", e
        assert e.diag.message_primary == "table public.t already has a running backfill", e.diag.message_primary
        db.execute(f"BEGIN ISOLATION LEVEL {isolation}")
        assert value(db, "SELECT count(*) FROM backfill_status WHERE state = 'running'") == 1
        e = error_of(db, "SELECT backfill_start('u', confirm => true, slot => 'busy_slot')")
        db.execute("ROLLBACK")
        assert e.sqlstate == "55006", e
        assert e.diag.message_primary == "slot busy_slot already has a running backfill", e.diag.message_primary
        assert value(db, "SELECT count(*) FROM backfill.job") == 1
        db.execute("SELECT backfill_cancel(%s)", [running])
        assert wait_until_ended(db, running) == "cancelled"
    finally:
        other.close()


def test_the_worker_cap_counts_workers_started_after_the_callers_first_read_of_pg_stat_activity(db, cluster):
    """PostgreSQL keeps a transaction's first copy of pg_stat_activity until it ends: 0.10.0
    counted the backfill workers in it, so a transaction that had looked at pg_stat_activity
    before started backfills past backfill.max_workers."""
    for name in ("a", "b", "c"):
        make_table(db, name, 1000)

    def workers():
        return value(db, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_backfill'")

    wait_for(lambda: workers() == 0, what="the workers of earlier tests to exit")
    db.execute("LOAD 'pg_backfill'")
    db.execute("ALTER SYSTEM SET backfill.max_workers = 2")
    late = cluster.connect(db.info.dbname)
    try:
        db.execute("SELECT pg_reload_conf()")
        wait_for(lambda: value(db, "SHOW backfill.max_workers") == "2", what="the reload")
        wait_for(lambda: value(late, "SHOW backfill.max_workers") == "2", what="the reload")
        late.execute("BEGIN")
        assert value(late, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_backfill'") == 0
        running = [start(db, name, batch_size=5, rows_per_second=10) for name in ("a", "b")]
        admitted = "SELECT count(*) FROM pg_stat_activity WHERE application_name ~ '^pg_backfill [0-9]'"
        wait_for(lambda: value(db, admitted) == 2, timeout=60, what="two admitted workers")
        e = error_of(late, "SELECT backfill_start('c', confirm => true)")
        late.execute("ROLLBACK")
        assert e.sqlstate == "53400", e
        assert "2 backfill worker(s)" in e.diag.message_detail, e.diag.message_detail
        for backfill_id in running:
            db.execute("SELECT backfill_cancel(%s)", [backfill_id])
            assert wait_until_ended(db, backfill_id) == "cancelled"
    finally:
        late.close()
        db.execute("ALTER SYSTEM RESET backfill.max_workers")
        db.execute("SELECT pg_reload_conf()")
