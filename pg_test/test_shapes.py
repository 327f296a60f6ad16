"""Tables of every shape: composite keys, collations, negative keys, many key types, an empty
table, TOASTed values and a partitioned table. Each is backfilled in small pages; the reads must
arrive in the key index's order, each row once, with the row as row_to_json renders it."""

import json

import pytest
from conftest import backfill_messages, status, wait_for, wait_until_ended, wal2json_changes

SHAPES = {
    "composite_key": (
        "CREATE TABLE shape (tenant int, seq int, note text, PRIMARY KEY (tenant, seq));"
        "INSERT INTO shape SELECT t, s, t || '/' || s FROM generate_series(1, 30) t, generate_series(1, 70) s;",
        ["tenant", "seq"],
    ),
    "text_key_non_c_collation": (
        'CREATE TABLE shape (name text COLLATE "en-x-icu" PRIMARY KEY, n int);'
        "INSERT INTO shape SELECT w || g, g FROM generate_series(1, 300) g,"
        " unnest(ARRAY['a', 'B', 'b', 'Á', 'ä', 'Z', 'z', '10', '9', 'é', 'E', ' x']) w;",
        ["name"],
    ),
    "text_key_replica_identity_index_collation": (
        "CREATE TABLE shape (code text NOT NULL, n int);"
        'CREATE UNIQUE INDEX shape_code ON shape (code COLLATE "C");'
        "ALTER TABLE shape REPLICA IDENTITY USING INDEX shape_code;"
        "INSERT INTO shape SELECT w || g, g FROM generate_series(1, 200) g, unnest(ARRAY['a', 'B', 'b', 'Z', '_']) w;",
        ["code"],
    ),
    "negative_keys": (
        "CREATE TABLE shape (id int PRIMARY KEY, v int);"
        "INSERT INTO shape SELECT g, g * 2 FROM generate_series(-1500, 1500) g;",
        ["id"],
    ),
    "numeric_uuid_timestamptz_enum_keys": (
        "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');"
        "CREATE TABLE shape (m mood, at timestamptz, amount numeric, u uuid, PRIMARY KEY (m, at, amount, u));"
        "INSERT INTO shape SELECT (ARRAY['happy', 'sad', 'ok'])[1 + g % 3]::mood,"
        " timestamptz '2024-01-01 00:00:00.123456+02' + (g % 7) * interval '1 hour 0.5 second',"
        " (g % 5) - 2.5, md5(g::text)::uuid FROM generate_series(1, 2000) g;",
        ["m", "at", "amount", "u"],
    ),
    "empty_table": ("CREATE TABLE shape (id int PRIMARY KEY);", ["id"]),
    "toasted_values": (
        "CREATE TABLE shape (id int PRIMARY KEY, big text, doc jsonb);"
        "INSERT INTO shape SELECT g, (SELECT string_agg(md5(g::text || i), '') FROM generate_series(1, 4000) i),"
        " jsonb_build_object('g', g, 'tags', (SELECT jsonb_agg(md5(i::text)) FROM generate_series(1, 2000) i))"
        " FROM generate_series(1, 40) g;",
        ["id"],
    ),
    "partitioned_table": (
        "CREATE TABLE shape (id int, region text, PRIMARY KEY (id)) PARTITION BY RANGE (id);"
        "CREATE TABLE shape_low PARTITION OF shape FOR VALUES FROM (MINVALUE) TO (1000);"
        "CREATE TABLE shape_mid PARTITION OF shape FOR VALUES FROM (1000) TO (2000);"
        "CREATE TABLE shape_high PARTITION OF shape FOR VALUES FROM (2000) TO (MAXVALUE);"
        "INSERT INTO shape SELECT g, 'r' || (g % 4) FROM generate_series(-200, 3000) g;",
        ["id"],
    ),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_backfill_reads_every_row_once_in_key_index_order(db, shape):
    ddl, key = SHAPES[shape]
    db.execute(ddl)
    db.execute("ANALYZE shape")
    db.execute("SELECT pg_create_logical_replication_slot('consumer', 'wal2json')")
    backfill_id = db.execute("SELECT backfill_start('shape', confirm => true, batch_size => 7)").fetchone()[0]
    assert wait_until_ended(db, backfill_id) == "done"

    messages = backfill_messages(wal2json_changes(db, "consumer"))
    reads = [m for m in messages if m["op"] == "read"]
    key_json = ", ".join(f"'{k}', {k}" for k in key)
    index_order = [
        json.loads(k)
        for k, in db.execute(f"SELECT json_build_object({key_json})::text FROM shape ORDER BY {', '.join(key)}").fetchall()
    ]
    # The replica identity index sorts with its own collation, not the column's.
    if shape == "text_key_replica_identity_index_collation":
        index_order = [
            json.loads(k)
            for k, in db.execute(f'SELECT json_build_object({key_json})::text FROM shape ORDER BY code COLLATE "C"').fetchall()
        ]
    assert [m["key"] for m in reads] == index_order
    rows = sorted(
        json.dumps(json.loads(r), sort_keys=True) for r, in db.execute("SELECT row_to_json(s)::text FROM shape s").fetchall()
    )
    assert sorted(json.dumps(m["data"], sort_keys=True) for m in reads) == rows
    assert [m["op"] for m in messages if m["op"] != "read"] == ["table_start", "table_end"]
    assert messages[-1]["rows"] == len(rows)
    assert all(m["schema"] == "public" and m["table"] == "shape" and m["backfill_id"] == backfill_id for m in messages)
    if shape == "partitioned_table":
        assert {m["partition"] for m in reads} == {"public.shape_low", "public.shape_mid", "public.shape_high"}


def test_row_data_is_row_to_json_byte_for_byte(db):
    """The worker renders common types itself and asks PostgreSQL for the rest: for every kind
    of column, every value (edge cases and NULLs) must come out exactly as row_to_json's text."""
    db.execute(
        """
        CREATE TYPE mood AS ENUM ('sad', 'ok');
        CREATE TYPE pair AS (x int, y text);
        CREATE DOMAIN positive AS int CHECK (VALUE > 0);
        CREATE DOMAIN label AS text;
        CREATE TABLE shape (
            id int PRIMARY KEY, gone int, s smallint, i int, b bigint, f bool, t text, v varchar(12), c char(6),
            n numeric, r real, d double precision, j json, jb jsonb, u uuid, nm name, dt date, ts timestamp,
            tz timestamptz, iv interval, ia int[], ta text[], p pair, m mood, dp positive, dl label, by bytea,
            ip inet, "we""ird name ü" int, g bigint GENERATED ALWAYS AS (i::bigint * 2) STORED);
        ALTER TABLE shape DROP COLUMN gone;
        INSERT INTO shape (id, s, i, b, f, t, v, c, n, r, d, j, jb, u, nm, dt, ts, tz, iv, ia, ta, p, m, dp, dl, by, ip,
                           "we""ird name ü") VALUES
          (1, -32768, -2147483648, -9223372036854775808, true, E'quote " backslash \\\\ slash / tab \\t nl \\n cr \\r',
           'varchar', 'ab', 0.10, 1.5, 1e-5, '{ "spaced" : [1, 2] }', '{"b": 1, "a": [true, null]}',
           'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 'a"name', '2024-02-29', '2024-01-01 12:00:00.5',
           '2024-01-01 12:00:00+02', '1 day 2 hours', '{1,NULL,3}', '{"a b","c\\"d"}', ROW(1, 'x"y'), 'ok', 7, 'lbl',
           '\\x00ff', '10.0.0.1/8', 1),
          (2, 32767, 2147483647, 9223372036854775807, false, E'controls \\x01\\x02\\x08\\x0b\\x0c\\x1f é 😀',
           '', '', 'NaN', 'Infinity', '-Infinity', 'null', '"just a string"', NULL, '', '-infinity', 'infinity',
           'infinity', '-1 mon', '{}', '{}', ROW(NULL, NULL), 'sad', 1, '', '\\x', '::1', -1),
          (3, 0, 0, 0, NULL, '', NULL, NULL, '-Infinity', '-0', 'NaN', NULL, 'null', NULL, NULL, NULL, NULL, NULL, NULL,
           NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
          (4, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 12345678901234567890.123456789, 3.4e38, 1.7976931348623157e308,
           '[]', '{}', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
        """
    )
    db.execute("SELECT pg_create_logical_replication_slot('consumer', 'test_decoding')")
    backfill_id = db.execute("SELECT backfill_start('shape', confirm => true)").fetchone()[0]
    assert wait_until_ended(db, backfill_id) == "done"
    contents = [
        data.split(" content:", 1)[1]
        for data, in db.execute("SELECT data FROM pg_logical_slot_get_changes('consumer', NULL, NULL)").fetchall()
        if data.startswith("message:")
    ]
    # The data object sits between the key and the tail; the keys are integers.
    read_data = [c[c.index(',"data":') + len(',"data":') : c.rindex(',"commit_lsn":')] for c in contents if '"op":"read"' in c]
    expected = [r for r, in db.execute("SELECT row_to_json(t.*)::text FROM shape t ORDER BY id").fetchall()]
    assert len(expected) == 4
    for got, want in zip(read_data, expected):
        assert got == want
    assert len(read_data) == len(expected)


def test_rows_read_after_an_alter_table_have_the_columns_of_then(db):
    """An ALTER TABLE during a backfill adds, drops and retypes columns: every row read after it
    carries the table's columns as they are then, each row once, and the backfill goes on. The
    ALTER rewrites the table, long enough for the worker to start a page (and take its snapshot)
    while it runs, and wait for it."""
    rows = 300_000
    db.execute("CREATE TABLE shape (id int PRIMARY KEY, v int, note text)")
    db.execute(f"INSERT INTO shape SELECT g, g, 'n' || g FROM generate_series(1, {rows}) g")
    db.execute("SELECT pg_create_logical_replication_slot('consumer', 'wal2json')")
    backfill_id = db.execute(
        "SELECT backfill_start('shape', confirm => true, batch_size => 100, rows_per_second => 2000)"
    ).fetchone()[0]
    rows_done = lambda: status(db, backfill_id, "rows_done")
    wait_for(lambda: rows_done() >= 500, what="the first pages")
    db.execute("ALTER TABLE shape ADD COLUMN extra text DEFAULT 'new', DROP COLUMN note, ALTER COLUMN v TYPE text USING 'v' || v")
    db.execute("SELECT backfill_set(%s, rows_per_second => 0, batch_size => 5000)", [backfill_id])
    assert wait_until_ended(db, backfill_id) == "done"

    reads = [m["data"] for m in backfill_messages(wal2json_changes(db, "consumer")) if m["op"] == "read"]
    assert [r["id"] for r in reads] == list(range(1, rows + 1))
    old = [r for r in reads if list(r) == ["id", "v", "note"]]
    new = [r for r in reads if list(r) == ["id", "v", "extra"]]
    assert len(old) >= 500 and len(new) >= 500 and len(old) + len(new) == rows
    assert reads == old + new  # no row in the old shape once the new one began
    assert all(r["v"] == r["id"] and r["note"] == f"n{r['id']}" for r in old)
    assert all(r["v"] == f"v{r['id']}" and r["extra"] == "new" for r in new)


def test_a_backfill_whose_key_changes_fails_with_a_clear_error(db):
    db.execute("CREATE TABLE shape (id int PRIMARY KEY, v int)")
    db.execute("INSERT INTO shape SELECT g, g FROM generate_series(1, 3000) g")
    backfill_id = db.execute(
        "SELECT backfill_start('shape', confirm => true, batch_size => 100, rows_per_second => 2000)"
    ).fetchone()[0]
    wait_for(lambda: status(db, backfill_id, "rows_done > 0"))
    db.execute("ALTER TABLE shape RENAME COLUMN id TO ident")
    assert wait_until_ended(db, backfill_id) == "failed"
    sqlstate, error = status(db, backfill_id, "last_error_sqlstate", "last_error")
    assert sqlstate == "55000" and "the key of table public.shape changed during its backfill" in error


def test_table_end_carries_the_sequences_its_columns_own(db, roles):
    """A store that takes over issues ids of its own: the end marker says where the source's
    sequences stand, so that it can start past them. Only sequences the table's columns own
    (serial, identity), and their values only for a starter that may read them."""
    db.execute(
        """CREATE TABLE owned (id bigserial PRIMARY KEY, n int GENERATED ALWAYS AS IDENTITY (INCREMENT BY 5), v text);
           CREATE SEQUENCE unrelated;
           SELECT nextval('unrelated');
           INSERT INTO owned (v) SELECT 'x' FROM generate_series(1, 120);
           CREATE TABLE unused (id serial PRIMARY KEY);
           ALTER SEQUENCE unused_id_seq RESTART WITH 1000"""
    )
    db.execute("SELECT pg_create_logical_replication_slot('consumer', 'wal2json')")
    for table in ("owned", "unused"):
        backfill_id = db.execute("SELECT backfill_start(%s, confirm => true)", [table]).fetchone()[0]
        assert wait_until_ended(db, backfill_id) == "done"
    ends = {m["table"]: m for m in backfill_messages(wal2json_changes(db, "consumer")) if m["op"] == "table_end"}
    assert ends["owned"]["sequences"] == [
        {"column": "id", "sequence": "public.owned_id_seq", "last_value": 120, "next_value": 121, "increment": 1},
        {"column": "n", "sequence": "public.owned_n_seq", "last_value": 596, "next_value": 601, "increment": 5},
    ]
    # Restarted and not used since: no last value, and the next is the restart's.
    assert ends["unused"]["sequences"] == [
        {"column": "id", "sequence": "public.unused_id_seq", "last_value": None, "next_value": 1000, "increment": 1}
    ]

    # An operator with the table's rights but none on its sequences: the marker names them, and
    # shows no value it could not read itself.
    operator = roles.create("operator", "operator")
    db.execute(f"GRANT SELECT, UPDATE ON owned TO {operator}")
    backfill_id = roles.connect(operator).execute("SELECT backfill_start('owned', confirm => true)").fetchone()[0]
    assert wait_until_ended(db, backfill_id) == "done"
    ends = [m for m in backfill_messages(wal2json_changes(db, "consumer")) if m["op"] == "table_end"]
    assert [(s["column"], s["last_value"], s["next_value"]) for s in ends[0]["sequences"]] == [("id", None, None), ("n", None, None)]
    db.execute(f"GRANT USAGE ON SEQUENCE owned_id_seq TO {operator}")
    backfill_id = roles.connect(operator).execute("SELECT backfill_start('owned', confirm => true)").fetchone()[0]
    assert wait_until_ended(db, backfill_id) == "done"
    ends = [m for m in backfill_messages(wal2json_changes(db, "consumer")) if m["op"] == "table_end"]
    assert [(s["column"], s["last_value"], s["next_value"]) for s in ends[0]["sequences"]] == [("id", 120, 121), ("n", None, None)]


def test_a_sequence_renamed_while_the_end_marker_reads_it(db, cluster):
    """The end marker reads each sequence the table owns; one renamed (or dropped) between its
    lookup and its read is looked up again once locked, not read under a name it no longer has
    (an internal error failed the backfill)."""
    db.execute("CREATE TABLE seqd (id serial PRIMARY KEY, v text)")
    db.execute("INSERT INTO seqd (v) SELECT 'x' FROM generate_series(1, 100)")
    db.execute("SELECT pg_create_logical_replication_slot('consumer', 'wal2json')")
    renamer = cluster.connect(db.info.dbname)
    try:
        renamer.execute("BEGIN")
        renamer.execute("ALTER SEQUENCE seqd_id_seq RENAME TO renamed_seq")
        backfill_id = db.execute("SELECT backfill_start('seqd', confirm => true)").fetchone()[0]
        # The worker waits for the rename's lock at the sequence.
        waiting = """SELECT count(*) FROM pg_stat_activity
                      WHERE backend_type = 'pg_backfill' AND wait_event_type = 'Lock'"""
        wait_for(lambda: db.execute(waiting).fetchone()[0] == 1, what="the worker to wait for the sequence")
        renamer.execute("COMMIT")
    finally:
        renamer.close()
    assert wait_until_ended(db, backfill_id) == "done", status(db, backfill_id, "last_error")
    [end] = [m for m in backfill_messages(wal2json_changes(db, "consumer")) if m["op"] == "table_end"]
    assert end["sequences"] == [
        {"column": "id", "sequence": "public.renamed_seq", "last_value": 100, "next_value": 101, "increment": 1}
    ]
