"""Robustness: sizes and events that must end in a defined state without taking the server down."""

import psycopg
import pytest
from conftest import Cluster, status, wait_until_ended


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


def test_a_row_of_over_a_gigabyte_leaves_the_server_restartable_and_its_slot_decodable(cluster):
    """The case that once left a server unable to start: a row whose JSON passes 1 GB (six
    200 MB columns) under the default bound, then an immediate stop."""
    other = Cluster(f"{cluster.dir}_huge", cluster.port + 3)
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
