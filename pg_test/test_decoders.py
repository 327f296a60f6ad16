"""What decoders receive: test_decoding and pgoutput (messages 'true') get the same messages as
wal2json; and a 1M-row table arrives through a slot exactly once."""

import json

import pytest

from conftest import wait_until_ended


def test_test_decoding_and_pgoutput_receive_the_messages(db):
    db.execute(
        """CREATE TABLE t (id int PRIMARY KEY, label text);
           INSERT INTO t SELECT g, 'row ' || g FROM generate_series(1, 500) g;
           CREATE PUBLICATION pub FOR TABLE t;"""
    )
    db.execute("SELECT pg_create_logical_replication_slot('td', 'test_decoding')")
    db.execute("SELECT pg_create_logical_replication_slot('po', 'pgoutput')")
    backfill_id = db.execute("SELECT backfill_start('t', confirm => true, batch_size => 64)").fetchone()[0]
    assert wait_until_ended(db, backfill_id) == "done"

    lines = [
        data
        for data, in db.execute("SELECT data FROM pg_logical_slot_get_changes('td', NULL, NULL)").fetchall()
        if data.startswith("message: transactional: 1 prefix: backfill,")
    ]
    contents = [json.loads(line.split(" content:", 1)[1]) for line in lines]
    assert [c["op"] for c in contents] == ["table_start"] + ["read"] * 500 + ["table_end"]
    assert contents[1]["data"] == {"id": 1, "label": "row 1"}

    # pgoutput protocol: 'M', flags (1 = transactional), LSN, prefix\0, length, content.
    binary = db.execute(
        "SELECT data FROM pg_logical_slot_get_binary_changes('po', NULL, NULL, 'proto_version', '1',"
        " 'publication_names', 'pub', 'messages', 'true')"
    ).fetchall()
    messages = [bytes(data) for data, in binary if bytes(data)[:1] == b"M"]
    assert len(messages) == 502
    assert all(m[1] == 1 for m in messages), "messages are transactional"
    first_read = messages[1]
    prefix_end = first_read.index(b"\0", 10)
    assert first_read[10:prefix_end] == b"backfill"
    content = json.loads(first_read[prefix_end + 5 :])
    assert content["op"] == "read" and content["key"] == {"id": 1}


@pytest.mark.slow
def test_a_million_rows_arrive_through_a_slot_exactly_once(db):
    db.execute(
        """CREATE TABLE big (id bigint PRIMARY KEY, a int, b text);
           INSERT INTO big SELECT g, g % 1000, 'value ' || g FROM generate_series(1, 1000000) g;
           ANALYZE big;"""
    )
    db.execute("SELECT pg_create_logical_replication_slot('consumer', 'test_decoding')")
    backfill_id = db.execute("SELECT backfill_start('big', confirm => true)").fetchone()[0]
    assert wait_until_ended(db, backfill_id, timeout=600) == "done"
    reads, distinct, low, high, markers = db.execute(
        r"""SELECT count(*) FILTER (WHERE op = 'read'), count(DISTINCT id) FILTER (WHERE op = 'read'),
                   min(id), max(id), count(*) FILTER (WHERE op <> 'read')
              FROM (SELECT m->>'op' AS op, (m->'key'->>'id')::bigint AS id
                      FROM (SELECT split_part(data, ' content:', 2)::json AS m
                              FROM pg_logical_slot_get_changes('consumer', NULL, NULL)
                             WHERE data LIKE 'message: transactional: 1 prefix: backfill,%') s) r"""
    ).fetchone()
    assert (reads, distinct, low, high, markers) == (1_000_000, 1_000_000, 1, 1_000_000, 2)
