"""Messages are UTF-8 JSON in every server encoding: values and names are converted from the
database's encoding as convert_to(..., 'UTF8') converts them; a value with no UTF-8 form fails
the backfill naming its key; non-ASCII names work in every encoding."""

import json

import pytest
from conftest import Consumer, error_of, messages_with_xids, status, wait_for, wait_until_ended

# (encoding, schema, table, key column, value column, a key prefix, a value): names and text
# that the encoding can hold.
ENCODINGS = [
    ("LATIN1", "sché", "tablé", "clé", "déjà vu", "ké", "café crème"),
    ("WIN1251", "схема", "таблица", "ключ", "значение", "к", "привет"),
    ("EUC_JP", "スキーマ", "表", "鍵", "値", "キー", "日本語のテキスト"),
    ("SQL_ASCII", "sché", "tablé", "clé", "déjà vu", "ké", "café ☕"),  # UTF-8 bytes stored as they are
]


def signed_messages(consumer):
    """(xid, content) of each backfill message pg_recvlogical wrote (test_decoding names each
    transaction's xid in its BEGIN line)."""
    with open(consumer.output.name, "rb") as f:
        return messages_with_xids(f)


def encoded_database(scratch_database, cluster, encoding):
    name = scratch_database(f"enc_{encoding.lower()}", f"ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    conn = cluster.connect(name)
    conn.execute("SET client_encoding = 'UTF8'")
    conn.execute("CREATE EXTENSION pg_backfill")
    return conn


@pytest.mark.parametrize("encoding, schema, table, key, column, prefix, value", ENCODINGS, ids=[e[0] for e in ENCODINGS])
def test_messages_are_utf8_in_every_server_encoding(cluster, scratch_database, encoding, schema, table, key, column, prefix, value):
    conn = encoded_database(scratch_database, cluster, encoding)
    qualified = f'"{schema}"."{table}"'
    conn.execute(
        f"""CREATE SCHEMA "{schema}";
            CREATE TABLE {qualified} ("{key}" text PRIMARY KEY, "{column}" text, doc jsonb, tags text[], n int)"""
    )
    conn.execute(
        f"""INSERT INTO {qualified}
                 SELECT %s || g, %s || ' ' || g, jsonb_build_object(%s::text, %s || g), ARRAY[%s, 'x'], g
                   FROM generate_series(1, 3000) g""",
        [prefix, value, column, value, value],
    )
    conn.execute(f"ANALYZE {qualified}")
    publication = f"pub_{value.split()[0]}"
    conn.execute(f'CREATE PUBLICATION "{publication}" FOR TABLE {qualified}')
    # The estimate names the key column as the database has it.
    eligible, keys = conn.execute(f"SELECT eligible, key_columns FROM backfill_estimate('{qualified}')").fetchone()
    assert eligible and keys == [key]
    conn.execute("SELECT pg_create_logical_replication_slot('enc', 'test_decoding')")
    consumer = Consumer(cluster, conn.info.dbname, "enc")
    try:
        # Small pages and two ranges: cursors and range bounds with non-ASCII keys are stored
        # and read back between pages.
        backfill_id = conn.execute(
            f"""SELECT backfill_start('{qualified}', slot => 'enc', publication => %s, batch_size => 200,
                                     parallel => 2, confirm => true)""",
            [publication],
        ).fetchone()[0]
        assert wait_until_ended(conn, backfill_id) == "done", status(conn, backfill_id, "last_error")
        # The rows as convert_to(row_to_json(t)::text, 'UTF8') gives them.
        expected = {
            json.loads(bytes(row))[key]: json.loads(bytes(row))
            for row, in conn.execute(f"SELECT convert_to(row_to_json(t)::text, 'UTF8') FROM {qualified} t").fetchall()
        }
        reads = lambda: [m for m in consumer.messages() if m["op"] == "read"]  # noqa: E731
        wait_for(lambda: len(reads()) == 3000, what="every row at the consumer")
        assert {m["key"][key]: m["data"] for m in reads()} == expected
        assert all(m["schema"] == schema and m["table"] == table for m in consumer.messages())
        starts = [m for m in consumer.messages() if m["op"] == "table_start"]
        assert starts and starts[0]["key_columns"] == [key]
        # A message checks out as the consumer received it (its tag covers its UTF-8 bytes).
        xid, content = signed_messages(consumer)[1]
        assert conn.execute("SELECT backfill_message_valid(%s, %s)", [content.decode(), xid]).fetchone()[0]
        assert not conn.execute("SELECT backfill_message_valid(%s, %s)", [content.decode().replace(value, "x"), xid]).fetchone()[0]
    finally:
        consumer.stop()


def test_a_value_with_no_utf8_form_fails_the_backfill_naming_its_key(cluster, scratch_database):
    conn = encoded_database(scratch_database, cluster, "SQL_ASCII")
    conn.execute(
        r"""CREATE TABLE t (id int PRIMARY KEY, note text);
            INSERT INTO t SELECT g, 'fine ' || g FROM generate_series(1, 100) g;
            UPDATE t SET note = E'caf\xe9' WHERE id = 42;"""  # a LATIN1 byte: not UTF-8
    )
    backfill_id = conn.execute("SELECT backfill_start('t', confirm => true)").fetchone()[0]
    assert wait_until_ended(conn, backfill_id) == "failed"
    error = status(conn, backfill_id, "last_error")
    assert "column note of row (42) of table public.t has no UTF-8 form" in error, error
    assert status(conn, backfill_id, "rows_done") < 100


def test_errors_about_non_ascii_names_are_legible_in_any_encoding(cluster, scratch_database):
    """pgrx passes an error's bytes through unconverted: in a database that is not UTF-8, a name
    that is not ASCII is written as SQL's Unicode escape, so that the client reads it right."""
    conn = encoded_database(scratch_database, cluster, "LATIN1")
    conn.execute('CREATE UNLOGGED TABLE "tablé" (id int PRIMARY KEY)')
    e = error_of(conn, """SELECT backfill_start('"tablé"', confirm => true)""")
    assert e.sqlstate == "55000"
    assert r'U&"tabl\00e9"' in e.diag.message_primary + (e.diag.message_hint or ""), e.diag.message_primary


def test_keys_go_back_to_the_server_byte_for_byte(cluster, scratch_database):
    """EUC_JP's 0xADF0 (NEC's ≒) becomes U+2252 in UTF-8, which converts back to 0xA2E2, JIS's
    ≒. A cursor or upper bound taken through UTF-8 would be another key: the greatest key, as
    the scan's upper bound, would end the scan before its own row."""
    conn = encoded_database(scratch_database, cluster, "EUC_JP")
    conn.execute(
        """CREATE TABLE t (k text COLLATE "C" PRIMARY KEY, n int);
           INSERT INTO t SELECT 'k' || lpad(g::text, 4, '0'), g FROM generate_series(1, 500) g;
           INSERT INTO t VALUES ('z' || convert_from('\\xadf0'::bytea, 'EUC_JP'), 501);"""
    )
    conn.execute("SELECT pg_create_logical_replication_slot('bytes', 'test_decoding')")
    consumer = Consumer(cluster, conn.info.dbname, "bytes")
    try:
        backfill_id = conn.execute("SELECT backfill_start('t', slot => 'bytes', batch_size => 100, confirm => true)").fetchone()[0]
        assert wait_until_ended(conn, backfill_id) == "done"
        assert status(conn, backfill_id, "rows_done") == 501
        wait_for(lambda: any(m["op"] == "table_end" for m in consumer.messages()), what="the end marker")
        assert {m["key"]["k"] for m in consumer.messages() if m["op"] == "read"} >= {"z\u2252"}
    finally:
        consumer.stop()
