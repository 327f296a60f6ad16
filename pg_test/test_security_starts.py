"""What a start takes from its caller, and who shapes a backfill: SELECT and UPDATE on the table,
no row-level security filtering it, REPLICATION for a slot, each checked at the start and again
on every page; only the role that started a backfill, in its transaction, gives it keys, a
message size or another shape."""

import pytest

from conftest import Consumer, at_earlier_version, error_of, status, wait_for, wait_until_ended
from security_helpers import make_table, next_backfill_id, operator, start, value


# --- what starting a backfill needs from the caller -----------------------------------------------

def test_start_needs_update_as_well_as_select(db, roles):
    make_table(db, "t", 50)
    role = roles.create("op", "operator")
    db.execute(f"GRANT SELECT ON t TO {role}")
    conn = roles.connect(role)
    e = error_of(conn, "SELECT backfill_start('t', confirm => true)")
    assert e.sqlstate == "42501" and "GRANT UPDATE" in (e.diag.message_hint or "")
    db.execute(f"GRANT UPDATE ON t TO {role}")
    assert wait_until_ended(db, start(conn, "t")) == "done"


def test_a_backfill_stops_when_its_starter_loses_the_right_to_lock(db, operator):
    role, conn = operator
    backfill_id = start(conn, "t", rows_per_second=20, batch_size=10)
    wait_for(lambda: (status(db, backfill_id, "rows_done") or 0) > 0, what="first page")
    db.execute(f"REVOKE UPDATE ON t FROM {role}")
    assert wait_until_ended(db, backfill_id, timeout=30) == "failed"
    sqlstate, error = status(db, backfill_id, "last_error_sqlstate", "last_error")
    assert sqlstate == "42501" and role in error and "UPDATE" in error


def test_start_is_refused_when_row_level_security_filters_the_caller(db, operator):
    role, conn = operator
    db.execute("ALTER TABLE t ENABLE ROW LEVEL SECURITY; CREATE POLICY few ON t USING (id <= 5)")
    assert value(conn, "SELECT count(*) FROM t") == 5  # the policy does filter the caller
    assert error_of(conn, "SELECT backfill_start('t', confirm => true)").sqlstate == "42501"
    assert value(db, "SELECT count(*) FROM backfill.job") == 0


# --- binding a slot -------------------------------------------------------------------------------

def test_binding_a_slot_needs_replication(db, roles, operator):
    role, conn = operator
    slot = f"s_{roles.suffix}"
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", [slot])
    e = error_of(conn, "SELECT backfill_start('t', confirm => true, slot => %s)", [slot])
    assert e.sqlstate == "42501"
    db.execute(f"ALTER ROLE {role} REPLICATION")
    backfill_id = start(conn, "t", slot=slot)
    conn.execute("SELECT backfill_cancel(%s)", [backfill_id])
    assert wait_until_ended(db, backfill_id) == "cancelled"


# --- rights lost mid-run --------------------------------------------------------------------------

def test_rights_lost_mid_run_stop_a_backfill_without_a_filter(cluster, db, roles):
    """Row-level security enabled for the starter mid-run: the backfill went on delivering rows
    the starter could no longer see. REPLICATION revoked from the starter of a slot-bound
    backfill: it went on to done, while a new start was refused. Each now stops the backfill
    at its next page with 42501, as the start would refuse it."""
    operator = roles.create("op_rights", "operator")
    db.execute(f"ALTER ROLE {operator} REPLICATION")
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    db.execute("INSERT INTO t SELECT g, 'x' FROM generate_series(1, 5000) g")
    db.execute(f"GRANT SELECT, UPDATE ON t TO {operator}")
    db.execute("SELECT pg_create_logical_replication_slot('rights', 'test_decoding')")
    conn = roles.connect(operator)
    consumer = Consumer(cluster, db.info.dbname, "rights")
    try:
        for take_away, expect in (
            ("ALTER TABLE t ENABLE ROW LEVEL SECURITY", "row-level security now filters the rows of table public.t"),
            (f"ALTER ROLE {operator} NOREPLICATION", 'may no longer bind a backfill to replication slot "rights"'),
        ):
            backfill_id = conn.execute(
                "SELECT backfill_start('t', confirm => true, batch_size => 100, rows_per_second => 1000, slot => 'rights')"
            ).fetchone()[0]
            wait_for(lambda: status(db, backfill_id, "rows_done") >= 100, what="a page before the rights go")
            db.execute(take_away)
            assert wait_until_ended(db, backfill_id) == "failed", take_away
            assert status(db, backfill_id, "last_error_sqlstate") == "42501", take_away
            assert expect in status(db, backfill_id, "last_error"), status(db, backfill_id, "last_error")
            assert status(db, backfill_id, "rows_done") < 5000
            db.execute("ALTER TABLE t DISABLE ROW LEVEL SECURITY")
            db.execute(f"ALTER ROLE {operator} REPLICATION")
    finally:
        consumer.stop()


# --- who shapes a backfill as it starts -----------------------------------------------------------

def test_set_keys_of_refuses_a_backfill_another_role_started_in_the_transaction(db, roles):
    """backfill.set_keys_of() is executable by PUBLIC (a Citus worker node's start calls it): it
    narrows only a backfill the calling role started, in this transaction. 0.10.0 took any
    backfill this transaction recorded: a role whose DDL a follow started a backfill in, as the
    follow's creator, narrowed it to one row and forced lock_mode table onto it."""
    make_table(db, "t", 200)
    starter = roles.create("starter", "operator")
    db.execute(f"GRANT SELECT, UPDATE ON t TO {starter}")
    # The intruder may backfill the table too (in the attack, its own): only who started the
    # backfill stands between it and the keys.
    intruder = roles.create("intruder", "operator")
    db.execute(f"GRANT SELECT, UPDATE ON t TO {intruder}")
    narrow = "SELECT backfill.set_keys_of(%s, 't'::regclass, '[{\"id\": 1}]')"
    db.execute("BEGIN")
    db.execute(f"SET LOCAL ROLE {starter}")
    backfill_id = start(db, "t")
    db.execute(f"SET LOCAL ROLE {intruder}")
    e = error_of(db, narrow, [backfill_id])
    db.execute("ROLLBACK")
    assert e.sqlstate == "42501", e
    assert e.diag.message_primary == f"permission denied to shape backfill {backfill_id}"
    assert starter in e.diag.message_detail and intruder in e.diag.message_detail and e.diag.message_hint
    # The role that started it still narrows it, in the same transaction.
    db.execute("BEGIN")
    db.execute(f"SET LOCAL ROLE {starter}")
    backfill_id = start(db, "t")
    assert value(db, narrow, [backfill_id]) == backfill_id
    db.execute("COMMIT")
    assert value(db, "SELECT backfill_wait(%s, interval '2 minutes')", [backfill_id]) is True
    assert status(db, backfill_id, "rows_done") == 1


def test_a_role_whose_ddl_a_follow_starts_a_backfill_in_cannot_narrow_it(cluster, db, roles):
    """The attack set_keys_of() let through: a publication's owner with no grant of pg_backfill
    adds a table to a followed publication, and the follow starts its backfill, as its creator,
    in the owner's transaction; the owner then narrowed it to one row of its 300. Now refused,
    and the consumer gets every row."""
    from test_citus import PgOutputStream
    db.execute("CREATE TABLE seed (id int PRIMARY KEY); CREATE PUBLICATION shop FOR TABLE seed")
    db.execute("SELECT pg_create_logical_replication_slot('cdc', 'pgoutput')")
    stream = PgOutputStream(cluster, "cdc", "shop", dbname=db.info.dbname)
    stream.start()
    try:
        owner = roles.create("shopkeeper")
        db.execute(f"ALTER PUBLICATION shop OWNER TO {owner}")
        db.execute(f"CREATE SCHEMA goods_schema AUTHORIZATION {owner}")
        conn = roles.connect(owner)
        conn.execute("""CREATE TABLE goods_schema.goods (id int PRIMARY KEY, label text);
                        INSERT INTO goods_schema.goods SELECT g, 'g' || g FROM generate_series(1, 300) g""")
        db.execute("SELECT backfill_follow('shop', 'cdc')")
        expected = next_backfill_id(db)
        conn.execute("BEGIN")
        conn.execute("ALTER PUBLICATION shop ADD TABLE goods_schema.goods")
        e = error_of(conn, "SELECT backfill.set_keys_of(%s, 'goods_schema.goods'::regclass, '[{\"id\": 1}]')",
                     [expected])
        conn.execute("ROLLBACK")
        # (42501 while the follow starts the backfill in the DDL's transaction; 55000 if not there.)
        assert e.sqlstate in ("42501", "55000"), e
        conn.execute("ALTER PUBLICATION shop ADD TABLE goods_schema.goods")
        backfill_id = wait_for(lambda: value(db, "SELECT max(id) FROM backfill.job"), what="the follow's backfill")
        assert wait_until_ended(db, backfill_id) == "done"
        assert status(db, backfill_id, "rows_done") == 300
        assert value(db, "SELECT count(*) FROM backfill.job_key") == 0
    finally:
        stream.stop()


@pytest.mark.parametrize("change", ["SELECT backfill_set(%s, rows_per_second => 20)",
                                    "SELECT backfill_pause(%s), backfill_resume(%s)"])
@pytest.mark.parametrize("old_entry_point", ["SELECT backfill.set_keys(%s, '[{\"id\": 1}]')",
                                             "SELECT backfill.set_rows_per_message(%s, 100)"])
def test_the_old_entry_points_refuse_a_running_backfill_changed_in_the_transaction(db, change, old_entry_point):
    """backfill.set_keys() and set_rows_per_message() (0.9.0's SQL calls them after
    backfill.start(), until ALTER EXTENSION UPDATE) shape a backfill this transaction inserted.
    0.10.0 asked whether this transaction wrote the backfill's row, which backfill_set(), pause
    and resume do too: a running backfill then took keys, and after its worker restarted it was
    done with 500 of 5,000 rows, or changed its batches mid-table. (0.10.0's SQL declares them.)"""
    at_earlier_version(db, "0.10.0")
    make_table(db, "t", 5000)
    running = start(db, "t", batch_size=5, rows_per_second=10)
    db.execute("BEGIN")
    db.execute(change, [running] * change.count("%s"))
    e = error_of(db, old_entry_point, [running])
    db.execute("ROLLBACK")
    assert e.sqlstate == "55000", e
    assert e.diag.message_primary in (f"keys cannot be given to backfill {running}",
                                      f"rows_per_message cannot be changed for backfill {running}")
    assert e.diag.message_detail and e.diag.message_hint
    assert value(db, "SELECT count(*) FROM backfill.job_key") == 0
    assert value(db, "SELECT rows_per_message FROM backfill.job WHERE id = %s", [running]) == 1
    db.execute("SELECT backfill_cancel(%s)", [running])
    assert wait_until_ended(db, running) == "cancelled"
    # 0.9.0's SQL, as it calls them: in the statement that starts the backfill.
    make_table(db, "u", 100)
    started = value(db, """SELECT backfill.set_keys(backfill.set_rows_per_message(
                               backfill_start('u', confirm => true), 10), '[{"id": 3}, {"id": 4}]')""")
    assert value(db, "SELECT backfill_wait(%s, interval '2 minutes')", [started]) is True
    assert status(db, started, "rows_done") == 2
