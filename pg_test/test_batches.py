"""Batched messages (backfill_start(..., rows_per_message => N)): each page's rows in `reads`
messages of up to N rows, each within backfill.max_message_size, each signed; 1 keeps the `read`
format byte for byte. The ordering and termination tests run with batches too
(test_ordering.py, test_resume.py), and the repair test (test_compare.py)."""

import json
import re

import pytest

from conftest import as_reads, at_earlier_version, error_of, messages_with_xids, status, wait_until_ended
from test_robustness import small_messages  # noqa: F401 (a fixture)
from security_helpers import message_keys, sql_valid, tag_is_valid


def make_table(db, rows, body="'row ' || g"):
    # Row-locked pages have batch_size rows on a quiet table (table-locked ones start small).
    db.execute("SET backfill.lock_mode = 'rows'")
    db.execute(
        f"""CREATE TABLE t (id int PRIMARY KEY, label text);
            INSERT INTO t SELECT g, {body} FROM generate_series(1, {rows}) g;
            ANALYZE t;"""
    )


def backfill(db, **options) -> int:
    named = "".join(f", {name} => %s" for name in options)
    return db.execute(f"SELECT backfill_start('t', confirm => true{named})", list(options.values())).fetchone()[0]


def decoded(db, slot):
    """(xid, content) of each backfill message the test_decoding slot decodes, in order."""
    rows = db.execute("SELECT data FROM pg_logical_slot_get_changes(%s, NULL, NULL, 'include-xids', '1')", [slot])
    return messages_with_xids(data for (data,) in rows.fetchall())


@pytest.fixture
def slot(db):
    db.execute("SELECT pg_create_logical_replication_slot('batches', 'test_decoding')")
    return "batches"


def without_id_and_tag(content):
    """A message's content without what differs between two backfills of the same rows."""
    return re.sub(r',"auth":"[^"]*"\}$', "}", re.sub(r'"backfill_id":\d+', '"backfill_id":0', content))


def test_batches_carry_each_row_as_its_read_would_n_at_most_each_and_every_one_verifies(db, slot):
    make_table(db, 250)
    assert wait_until_ended(db, backfill(db, batch_size=100)) == "done"
    per_row = [json.loads(c) for _, c in decoded(db, slot)]
    backfill_id = backfill(db, batch_size=100, rows_per_message=40)
    assert wait_until_ended(db, backfill_id) == "done"
    messages = decoded(db, slot)
    parsed = [json.loads(c) for _, c in messages]
    assert [m["op"] for m in parsed] == ["table_start"] + ["reads"] * 8 + ["table_end"]
    # Pages of 100 rows, split 40, 40, 20.
    assert [len(m["rows"]) for m in parsed[1:-1]] == [40, 40, 20, 40, 40, 20, 40, 10]
    assert list(parsed[1]) == ["op", "backfill_id", "schema", "table", "rows", "commit_lsn", "auth"]
    assert all(list(row) == ["key", "data"] for m in parsed[1:-1] for row in m["rows"])
    # Each row as the per-row backfill read it, in the same order.
    expanded = [(m["key"], m["data"]) for m in as_reads(parsed) if m["op"] == "read"]
    assert expanded == [(m["key"], m["data"]) for m in per_row if m["op"] == "read"]
    assert [k["id"] for k, _ in expanded] == list(range(1, 251))
    # Every batch of a page is in the page's transaction; every message verifies, in SQL and
    # with the Python check of docs/consumers.md.
    assert len({xid for xid, c in messages if '"op":"reads"' in c}) == 3
    keys = message_keys(db)
    for xid, content in messages:
        assert sql_valid(db, content, xid) is True and tag_is_valid(keys, content, xid), content
    tampered_xid, tampered = next((xid, c) for xid, c in messages if '"op":"reads"' in c)
    tampered = tampered.replace('"label":"row 2"', '"label":"row 9"', 1)
    assert sql_valid(db, tampered, tampered_xid) is False and not tag_is_valid(keys, tampered, tampered_xid)
    assert status(db, backfill_id, "rows_done", "rows_per_message") == (250, 40)


def test_rows_per_message_1_is_the_read_format_byte_for_byte(db, slot):
    make_table(db, 30)
    assert wait_until_ended(db, backfill(db, batch_size=7)) == "done"
    default = [without_id_and_tag(c) for _, c in decoded(db, slot)]
    backfill_id = backfill(db, batch_size=7, rows_per_message=1)
    assert wait_until_ended(db, backfill_id) == "done"
    assert [without_id_and_tag(c) for _, c in decoded(db, slot)] == default
    assert sum('"op":"read"' in c for c in default) == 30
    assert status(db, backfill_id, "rows_per_message") == 1


def test_the_setting_is_the_default_and_null_takes_it(db, slot):
    make_table(db, 10)
    db.execute("SET backfill.rows_per_message = 4")
    ids = []
    for options in ({}, {"rows_per_message": None}, {"rows_per_message": 3}):
        ids.append(backfill(db, **options))
        assert wait_until_ended(db, ids[-1]) == "done"  # one running backfill per table
    assert [status(db, i, "rows_per_message") for i in ids] == [4, 4, 3]
    parsed = [json.loads(c) for _, c in decoded(db, slot)]
    assert [len(m["rows"]) for m in parsed if m["op"] == "reads"] == [4, 4, 2] * 2 + [3, 3, 3, 1]
    error = error_of(db, "SET backfill.rows_per_message = 0")
    assert error.sqlstate == "22023" and "backfill.rows_per_message" in error.diag.message_primary


@pytest.mark.parametrize("rows_per_message", [0, -1, 100_001, 2_147_483_647])
def test_rows_per_message_out_of_range_is_22023_naming_the_value(db, rows_per_message):
    make_table(db, 10)
    error = error_of(db, "SELECT backfill_start('t', confirm => true, rows_per_message => %s)", [rows_per_message])
    assert error.sqlstate == "22023"
    assert error.diag.message_primary == f"rows_per_message {rows_per_message} is out of range"
    assert "between 1" in error.diag.message_detail and "100000" in error.diag.message_detail
    assert "backfill.rows_per_message" in error.diag.message_hint
    assert db.execute("SELECT count(*) FROM backfill_status").fetchone()[0] == 0, "nothing started"


def test_rows_per_message_is_given_at_the_start_only(db):
    """0.10.0's SQL still declares 0.9.0's backfill.set_rows_per_message(): it refuses a backfill
    already running. (Today's SQL has no way to change it.)"""
    at_earlier_version(db, "0.10.0")
    make_table(db, 10)
    backfill_id = backfill(db, rows_per_second=1)
    error = error_of(db, "SELECT backfill.set_rows_per_message(%s, 5)", [backfill_id])
    assert error.sqlstate == "55000" and error.diag.message_primary == f"rows_per_message cannot be changed for backfill {backfill_id}"
    assert "backfill_start" in error.diag.message_hint
    db.execute("SELECT backfill_cancel(%s)", [backfill_id])


def test_batches_stay_within_max_message_size_and_a_row_too_large_alone_fails(small_messages, slot):
    db = small_messages  # backfill.max_message_size = 64kB
    # 30 rows of about 10 kB: six fit a message, a seventh would pass the bound.
    make_table(db, 30, body="repeat('x', 10000)")
    db.execute("UPDATE t SET label = repeat('y', 60000) WHERE id = 20")  # fits alone, with no other
    assert wait_until_ended(db, backfill(db, batch_size=30, rows_per_message=100)) == "done"
    messages = decoded(db, slot)
    parsed = [json.loads(c) for _, c in messages]
    assert max(len(c.encode()) for _, c in messages) <= 65536
    assert [len(m["rows"]) for m in parsed if m["op"] == "reads"] == [6, 6, 6, 1, 1, 6, 4]
    assert [m["key"]["id"] for m in as_reads(parsed) if m["op"] == "read"] == list(range(1, 31))

    # A row whose message alone would pass the bound fails the backfill with 54000, as a read
    # does, after every page before its own.
    db.execute("UPDATE t SET label = repeat('z', 70000) WHERE id = 20")
    backfill_id = backfill(db, batch_size=6, rows_per_message=100)
    assert wait_until_ended(db, backfill_id) == "failed"
    sqlstate, error = status(db, backfill_id, "last_error_sqlstate", "last_error")
    assert sqlstate == "54000" and "row (20) of table public.t is too large" in error and "65536" in error
    reads = as_reads([json.loads(c) for _, c in decoded(db, slot)])
    assert [m["key"]["id"] for m in reads if m["op"] == "read"] == list(range(1, 19))


def test_keyed_backfills_batch_their_reads_and_send_absent_keys_apart(db, slot):
    make_table(db, 100)
    backfill_id = db.execute(
        "SELECT backfill_start('t', confirm => true, rows_per_message => 2, keys => %s)",
        [json.dumps([{"id": i} for i in (5, 3, 200, 7, 9)])],
    ).fetchone()[0]
    assert wait_until_ended(db, backfill_id) == "done"
    parsed = [json.loads(c) for _, c in decoded(db, slot)]
    assert [(m["op"], [r["key"]["id"] for r in m.get("rows", [])] or m.get("key")) for m in parsed[1:-1]] == [
        ("reads", [3, 5]),
        ("reads", [7, 9]),
        ("absent", {"id": 200}),
    ]
    assert status(db, backfill_id, "rows_per_message") == 2


@pytest.mark.parametrize("rows_per_message", [1, 100])
def test_pages_of_wide_rows_stay_within_half_the_decoders_memory(db, slot, rows_per_message):
    """A page is one transaction for the decoder, which spills one larger than
    logical_decoding_work_mem to disk: after the first page, pages are sized so that their
    messages take at most half of it (measured on the page before)."""
    dbname = db.info.dbname
    db.execute(f'ALTER DATABASE "{dbname}" SET logical_decoding_work_mem = \'64kB\'')  # the worker's and the decoder's
    db.execute("SET logical_decoding_work_mem = '64kB'")  # this session decodes the slot
    db.execute("SELECT pg_drop_replication_slot('batches')")
    make_table(db, 3000, body="repeat('w', 1000)")
    db.execute("SELECT pg_create_logical_replication_slot('batches', 'test_decoding')")
    backfill_id = backfill(db, rows_per_message=rows_per_message)  # batch_size 1000, the default
    assert wait_until_ended(db, backfill_id) == "done"
    pages = {}
    for xid, content in decoded(db, slot):
        if '"op":"read' in content:
            pages[xid] = pages.get(xid, 0) + len(content.encode())
    sizes = list(pages.values())
    assert sizes[0] > 1_000_000, "the first page has batch_size rows: nothing measured yet"
    assert max(sizes[1:]) <= 32 * 1024, sizes
    assert len(sizes) > 1 + 2000 / 40  # the other 2000 rows, about 31 a page
    spilled = db.execute("SELECT spill_txns FROM pg_stat_replication_slots WHERE slot_name = 'batches'").fetchone()[0]
    assert spilled == 1, "only the first page spills"
