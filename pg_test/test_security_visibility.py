"""What each role sees: its own backfills (or its roles'), pg_monitor all of them but no key
values, filters or errors of tables it may not read, a member that may neither use nor become a
role none of its, and backfill.waiting_kind() nothing about backfills the caller does not see."""

from contextlib import suppress

import psycopg
import pytest

from conftest import PG_MAJOR, error_of, status, wait_for, wait_until_ended
from security_helpers import make_table, start, value


# --- what each role sees --------------------------------------------------------------------------

@pytest.fixture
def a_backfill(db, roles):
    """Role A, an operator, runs a slow backfill of t (2000 rows): (role, connection, id)."""
    make_table(db, "t", 2000)
    role = roles.create("a", "operator")
    db.execute(f"GRANT SELECT, UPDATE ON t TO {role}")
    conn = roles.connect(role)
    backfill_id = start(conn, "t", batch_size=10, rows_per_second=50)
    wait_for(
        lambda: value(conn, "SELECT cursor IS NOT NULL FROM backfill_tables WHERE backfill_id = %s", [backfill_id]),
        what="A's first page",
    )
    yield role, conn, backfill_id
    with suppress(psycopg.Error):
        db.execute("SELECT backfill_cancel(%s)", [backfill_id])


def test_a_role_sees_only_its_own_backfills_unless_it_is_in_pg_monitor(db, roles, a_backfill):
    _, a, backfill_id = a_backfill
    b = roles.connect(roles.create("b", "operator"))
    monitor = roles.create("mon", "operator")
    db.execute(f"GRANT pg_monitor TO {monitor}")
    m = roles.connect(monitor)

    assert value(db, "SELECT count(*) FROM backfill_status") == 1
    assert value(b, "SELECT count(*) FROM backfill_status") == 0
    assert value(b, "SELECT count(*) FROM backfill_tables") == 0
    for table in ("backfill.job", "backfill.job_table"):
        assert error_of(b, f"SELECT * FROM {table}").sqlstate == "42501", table
    assert value(m, "SELECT count(*) FROM backfill_status WHERE id = %s", [backfill_id]) == 1
    assert value(m, "SELECT count(*) FROM backfill_tables WHERE backfill_id = %s", [backfill_id]) == 1
    assert [row[0] for row in a.execute("SELECT * FROM backfill_status").fetchall()] == [backfill_id]
    cursor, upper_bound = a.execute(
        "SELECT cursor, upper_bound FROM backfill_tables WHERE backfill_id = %s", [backfill_id]
    ).fetchone()
    assert cursor and upper_bound == ["2000"]


def test_pg_monitor_sees_counts_but_no_key_values_filters_or_errors_of_tables_it_may_not_read(db, roles, a_backfill):
    """A pg_monitor member without SELECT on the table saw its key values (cursor, upper bound),
    the filter and every error's text, which can hold personal data: it now sees the counts,
    rates and SQLSTATEs (as PostgreSQL's progress views show), and the values only once it may
    SELECT the table."""
    _, a, backfill_id = a_backfill
    monitor = roles.create("mon2")
    db.execute(f"GRANT pg_monitor TO {monitor}")
    m = roles.connect(monitor)
    db.execute(
        "INSERT INTO backfill.job_error (job_id, relid, table_name, stopped_after_key, sqlstate, message, detail) "
        "VALUES (%s, 't'::regclass, 'public.t', '[\"42\"]', '54000', 'the row with key (id)=(42) is too large', 'secret')",
        [backfill_id],
    )
    tables = "SELECT cursor, upper_bound, rows_done IS NOT NULL, rows_estimated IS NOT NULL FROM backfill_tables WHERE backfill_id = %s"
    errors = "SELECT stopped_after_key, message, detail, sqlstate FROM backfill_errors WHERE backfill_id = %s"
    db.execute("UPDATE backfill.job SET last_error = 'key (id)=(42)', last_error_sqlstate = '54000' WHERE id = %s", [backfill_id])
    status_sql = "SELECT rows_done IS NOT NULL, percent_done IS NOT NULL, last_error_sqlstate, last_error FROM backfill_status WHERE id = %s"
    assert m.execute(tables, [backfill_id]).fetchone() == (None, None, True, True)
    assert m.execute(errors, [backfill_id]).fetchone() == (None, None, None, "54000")
    assert m.execute(status_sql, [backfill_id]).fetchone() == (True, True, "54000", None)
    db.execute(f"GRANT SELECT ON t TO {monitor}")
    cursor, upper_bound, _, _ = m.execute(tables, [backfill_id]).fetchone()
    assert cursor and upper_bound == ["2000"]
    assert m.execute(errors, [backfill_id]).fetchone()[1:3] == ("the row with key (id)=(42) is too large", "secret")
    assert m.execute(status_sql, [backfill_id]).fetchone()[3] == "key (id)=(42)"


@pytest.mark.skipif(PG_MAJOR < 16, reason="grants WITH INHERIT FALSE, SET FALSE are new in PostgreSQL 16")
def test_a_member_that_may_neither_use_nor_become_a_role_does_not_act_as_it(db, roles, a_backfill):
    """16 separated membership from its powers: a role granted another WITH INHERIT FALSE, SET
    FALSE is its member (pg_has_role's MEMBER) yet has none of its privileges and may not SET
    ROLE to it. Such a member of A, and of pg_monitor, sees and controls A's backfill no more
    than a stranger does; granted SET (so it may become A), it controls it, as any member on 15."""
    role, _, backfill_id = a_backfill
    bare = roles.create("bare", "operator")
    db.execute(f"GRANT {role} TO {bare} WITH INHERIT FALSE, SET FALSE")
    db.execute(f"GRANT pg_monitor TO {bare} WITH INHERIT FALSE, SET FALSE")
    b = roles.connect(bare)
    assert value(b, "SELECT pg_has_role(%s, 'MEMBER')", [role]) is True
    assert value(b, "SELECT count(*) FROM backfill_status") == 0
    assert value(b, "SELECT count(*) FROM backfill_tables") == 0
    assert value(b, "SELECT backfill.workers_running(%s)", [backfill_id]) == 0
    assert error_of(b, "SELECT backfill_pause(%s)", [backfill_id]).sqlstate == "42501"
    db.execute(f"GRANT {role} TO {bare} WITH SET TRUE")
    assert value(b, "SELECT count(*) FROM backfill_status WHERE id = %s", [backfill_id]) == 1
    b.execute("SELECT backfill_pause(%s)", [backfill_id])
    assert status(db, backfill_id, "state") == "paused"


def test_a_role_that_may_no_longer_read_the_table_sees_none_of_its_progress(db, a_backfill):
    role, a, backfill_id = a_backfill
    of_table = "SELECT cursor, upper_bound, rows_done FROM backfill_tables WHERE backfill_id = %s"
    of_backfill = "SELECT rows_done, last_error FROM backfill_status WHERE id = %s"
    assert None not in a.execute(of_table, [backfill_id]).fetchone()
    assert a.execute(of_backfill, [backfill_id]).fetchone()[0] is not None
    db.execute(f"REVOKE SELECT ON t FROM {role}")
    assert a.execute(of_table, [backfill_id]).fetchone() == (None, None, None)
    assert a.execute(of_backfill, [backfill_id]).fetchone() == (None, None)


def test_waiting_kind_answers_only_about_backfills_the_caller_sees(db, roles):
    """backfill.waiting_kind(), which the views call as the extension's owner: NULL for NULL, for
    an id that does not exist, for a backfill the caller may not see, and once it ended."""
    make_table(db, "t", 100)
    db.execute("SELECT pg_create_logical_replication_slot('away', 'test_decoding')")
    backfill_id = start(db, "t", slot="away")
    wait_for(lambda: value(db, "SELECT backfill.waiting_kind(%s)", [backfill_id]) == "consumer_away", what="the wait")
    assert value(db, "SELECT backfill.waiting_kind(NULL)") is None
    assert value(db, "SELECT backfill.waiting_kind(9223372036854775807)") is None
    stranger = roles.connect(roles.create("stranger"))
    assert value(stranger, "SELECT backfill.waiting_kind(%s)", [backfill_id]) is None
    assert value(stranger, "SELECT count(*) FROM backfill_status") == 0
    db.execute("SELECT backfill_cancel(%s)", [backfill_id])
    assert wait_until_ended(db, backfill_id) == "cancelled"
    assert value(db, "SELECT waiting_kind FROM backfill_status WHERE id = %s", [backfill_id]) is None
