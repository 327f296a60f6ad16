"""Hints that quote names run as shown whatever a table or slot is called; the message prefix is
validated; the settings a start records for its backfill's life are chosen only by roles allowed
to set them, not by a database owner's ALTER DATABASE ... SET."""

import psycopg
import pytest

from conftest import error_of, status, wait_until_ended
from security_helpers import hint_statement, make_table, operator, start, value


# --- hints quote names ----------------------------------------------------------------------------

WEIRD = "x'); DROP TABLE victim; --"


@pytest.fixture
def weird(db):
    """A table named to break a hint that splices its name in unquoted, and a victim table."""
    db.execute(
        f"""CREATE TABLE victim (id int);
            CREATE TABLE "{WEIRD}" (id int PRIMARY KEY);
            INSERT INTO "{WEIRD}" SELECT generate_series(1, 10);"""
    )
    return f'"{WEIRD}"'


def test_the_confirm_hint_runs_as_shown_whatever_the_table_is_called(db, weird):
    e = error_of(db, "SELECT backfill_start(%s::regclass)", [weird])
    assert e.sqlstate == "22023"
    statement = hint_statement(e)
    assert "backfill_start(" in statement and "confirm => true" in statement
    backfill_id = value(db, statement)
    assert isinstance(backfill_id, int)
    assert value(db, "SELECT tables = ARRAY[%s::regclass] FROM backfill_status WHERE id = %s", [weird, backfill_id])
    assert value(db, "SELECT to_regclass('victim') IS NOT NULL")
    assert wait_until_ended(db, backfill_id) == "done"


def test_the_missing_slot_hint_passes_the_slot_name_as_one_literal(db, roles, weird):
    # A valid name: the hint's statement creates exactly that slot.
    slot = f"no_such_{roles.suffix}"
    e = error_of(db, "SELECT backfill_start(%s::regclass, confirm => true, slot => %s)", [weird, slot])
    assert e.sqlstate == "42704"
    statement = hint_statement(e)
    assert "pg_create_logical_replication_slot(" in statement
    db.execute(statement)
    assert value(db, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", [slot]) == 1
    # A name with a quote (PostgreSQL refuses it as a slot name): the statement is still one
    # call, whose refusal names the slot exactly as given — not a syntax error, not an injection.
    e = error_of(db, "SELECT backfill_start(%s::regclass, confirm => true, slot => %s)", [weird, "no'such"])
    assert e.sqlstate == "42704"
    statement = hint_statement(e)
    assert "pg_create_logical_replication_slot(" in statement
    refused = error_of(db, statement)
    assert refused.sqlstate == "42602" and "\"no'such\"" in refused.diag.message_primary
    assert value(db, "SELECT to_regclass('victim') IS NOT NULL")


# --- the message prefix, and the settings a start records -----------------------------------------

def test_message_prefix_must_be_1_to_64_printable_bytes(db):
    make_table(db, "t", 10)
    db.execute("LOAD 'pg_backfill'")  # the setting is checked, not taken as a placeholder
    for prefix in ("", "a\nb", "p" * 65):
        db.execute("RESET backfill.message_prefix")
        with pytest.raises(psycopg.Error) as refused:  # by SET, or else by backfill_start
            db.execute("SELECT set_config('backfill.message_prefix', %s, false)", [prefix])
            start(db, "t")
        assert refused.value.sqlstate == "22023", repr(prefix)
    assert value(db, "SELECT count(*) FROM backfill.job") == 0
    prefix = "pfx-" + "x" * 60
    db.execute("SELECT set_config('backfill.message_prefix', %s, false)", [prefix])
    backfill_id = start(db, "t")
    assert wait_until_ended(db, backfill_id) == "done"
    assert status(db, backfill_id, "message_prefix") == prefix


# The settings a start records for the life of its backfill, and what each does to it if another
# role chose it: the reads under a prefix the consumer does not read, pages that lock the whole
# table, batches a consumer may not parse, pages unpaced on a shared primary.
RECORDED_SETTINGS = [("backfill.message_prefix", "elsewhere"), ("backfill.lock_mode", "table"),
                     ("backfill.rows_per_message", "50"), ("backfill.default_max_active_sessions", "0")]


def test_a_database_owner_cannot_choose_the_settings_a_superusers_start_records(cluster, roles, scratch_database):
    """The owner of a database (no superuser, no grant) could set them for its database (ALTER
    DATABASE ... SET, or for a role of its own), and a superuser's plain backfill_start there
    took them. They are superuser settings now: the owner's ALTER DATABASE, ALTER ROLE and SET
    are refused (42501), and the superuser's start records the server's values."""
    owner = roles.create("dbowner")
    name = scratch_database(f"owned_settings_{roles.suffix}", f"OWNER {owner}")
    with cluster.connect(name) as su:
        su.execute("CREATE EXTENSION pg_backfill")
        make_table(su, "t", 20)
    with psycopg.connect(host="127.0.0.1", port=cluster.port, user=owner, dbname=name, autocommit=True) as conn:
        conn.execute("SELECT * FROM backfill_status")  # loads the library: its settings are defined, not placeholders
        assert value(conn, "SELECT count(*) FROM pg_settings WHERE name = 'backfill.message_prefix'") == 1
        for setting, chosen in RECORDED_SETTINGS:
            for statement in (f"ALTER DATABASE {name} SET {setting} = '{chosen}'",
                              f"ALTER ROLE {owner} IN DATABASE {name} SET {setting} = '{chosen}'",
                              f"SET {setting} = '{chosen}'"):
                refused = error_of(conn, statement)
                assert refused.sqlstate == "42501" and setting in refused.diag.message_primary, statement
    with cluster.connect(name) as su:
        assert value(su, "SELECT count(*) FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase "
                         "WHERE d.datname = %s", [name]) == 0
        backfill_id = start(su, "t")
        assert wait_until_ended(su, backfill_id) == "done"
        recorded = status(su, backfill_id, "message_prefix", "lock_mode", "rows_per_message", "max_active_sessions")
        assert recorded == ("backfill", "auto", 1, None)  # (the test cluster's default_max_active_sessions is 0)


def test_a_role_granted_set_on_a_recorded_setting_sets_it_for_its_backfills(db, operator):
    """The DBA trusts an operator with a setting the PostgreSQL way: GRANT SET ON PARAMETER."""
    role, conn = operator
    conn.execute("SELECT * FROM backfill_status")  # loads the library: its settings are defined, not placeholders
    refused = error_of(conn, "SET backfill.message_prefix = 'etl_reads'")
    assert refused.sqlstate == "42501"
    db.execute(f"GRANT SET ON PARAMETER backfill.message_prefix, backfill.lock_mode TO {role}")
    try:
        conn.execute("SET backfill.message_prefix = 'etl_reads'")
        conn.execute("SET backfill.lock_mode = 'rows'")
        backfill_id = start(conn, "t")
        assert wait_until_ended(db, backfill_id) == "done"
        assert status(db, backfill_id, "message_prefix", "lock_mode") == ("etl_reads", "rows")
    finally:
        db.execute(f"REVOKE SET ON PARAMETER backfill.message_prefix, backfill.lock_mode FROM {role}")
