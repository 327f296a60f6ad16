"""backfill_checksum(): key ranges of a table with row counts and checksums. Identical tables
agree whatever the session's settings; every kind of divergence shows in its range, in every
column type; the hash is the documented encoding, byte for byte."""

import decimal
import json
import struct

import pytest
import xxhash
from conftest import PG_MAJOR, error_of

COLUMNS = {
    "i": "integer",
    "b": "bigint",
    "n": "numeric(14,4)",
    "f": "double precision",
    "t": "text",
    "ts": "timestamp with time zone",
    "d": "date",
    "j": "jsonb",
    "u": "uuid",
    "flag": "boolean",
    "raw": "bytea",
}

FILL = """INSERT INTO {table}
SELECT g, g * 7, g * 1.25, g / 3.0, 'naïve ' || g || ' 日本', timestamptz '2024-01-01 00:00:00+00' + g * interval '1 minute',
       date '2020-01-01' + g, jsonb_build_object('g', g, 'tags', jsonb_build_array('a', g % 3), 'note', 'ü 日本'), md5(g::text)::uuid,
       g % 2 = 0, decode(md5(g::text), 'hex'),
       CASE WHEN g % 10 = 0 THEN NULL ELSE g END
  FROM generate_series(1, 5000) g ORDER BY {order}"""


def make(db, table, order="1"):
    columns = ", ".join(f"{name} {type_name}" for name, type_name in COLUMNS.items())
    db.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, {columns}, maybe int)")
    db.execute(FILL.format(table=table, order=order).replace("SELECT g,", "SELECT g, g,", 1))
    db.execute(f"ANALYZE {table}")


def checksums(db, table, level="hash", ranges=16, bounds=None):
    if bounds is None:
        return db.execute("SELECT * FROM backfill_checksum(%s, ranges => %s, level => %s)", [table, ranges, level]).fetchall()
    return db.execute(
        "SELECT * FROM backfill_checksum(%s, level => %s, bounds => %s::jsonb)", [table, level, bounds]
    ).fetchall()


def bounds_of(rows):
    """The bounds of a checksum's ranges, to check another table over the same ranges."""
    return json.dumps([upper for _, _, upper, _, _ in rows if upper is not None])


@pytest.fixture
def twins(db):
    make(db, "source")
    make(db, "target", order="1 DESC")  # same rows, stored in another order
    return db


@pytest.mark.parametrize("level", ["count", "aggregate", "hash"])
def test_identical_tables_agree_range_by_range(twins, level):
    source = checksums(twins, "source", level)
    assert len(source) >= 12, "the sample should place about 16 ranges"
    assert sum(rows for _, _, _, rows, _ in source) == 5000
    assert max(rows for _, _, _, rows, _ in source) < 5000 / 4, "ranges of about equal rows"
    target = checksums(twins, "target", level, bounds=bounds_of(source))
    assert target == source
    # Every level places a key in the same range (the count level through the key's index, the
    # others in their scans, an integer key by a search of its own): a key equal to a bound
    # starts the range.
    counted = checksums(twins, "source", "count", bounds=bounds_of(source))
    assert [r[:4] for r in counted] == [r[:4] for r in source]
    if level == "count":
        assert all(c is None for *_, c in source)
    else:
        assert all(c is not None and c != "0" for *_, c in source)


@pytest.mark.parametrize("level", ["aggregate", "hash"])
def test_settings_and_client_encoding_change_no_checksum(twins, level):
    reference = checksums(twins, "source", level)
    for setting, value in [("TimeZone", "Asia/Kolkata"), ("DateStyle", "SQL, DMY"), ("extra_float_digits", "-15"),
                           ("client_encoding", "LATIN1"), ("bytea_output", "escape"), ("IntervalStyle", "sql_standard")]:
        twins.execute(f"SET {setting} = '{value}'")
        assert checksums(twins, "source", level, bounds=bounds_of(reference)) == reference, setting
        twins.execute(f"RESET {setting}")
    # ('日本' has no LATIN1 form: the hashes took text, and jsonb's, in UTF-8, not the client's encoding.)


@pytest.mark.parametrize(
    "change",
    ["DELETE FROM target WHERE id = {id}", "INSERT INTO target (id, i) VALUES (100000 + {id}, 1)"]
    + [f"UPDATE target SET {column} = NULL WHERE id = {{id}}" for column in COLUMNS]
    + [
        "UPDATE target SET n = n + 0.0001 WHERE id = {id}",
        "UPDATE target SET f = f * (1 + 1e-15) WHERE id = {id}",
        "UPDATE target SET t = t || ' ' WHERE id = {id}",
        "UPDATE target SET ts = ts + interval '1 microsecond' WHERE id = {id}",
        "UPDATE target SET j = j || '{{\"x\": 1}}' WHERE id = {id}",
        "UPDATE target SET raw = raw || '\\x00' WHERE id = {id}",
        "UPDATE target SET flag = NOT flag WHERE id = {id}",
        "UPDATE target SET maybe = 0 WHERE id = {id}",
    ],
)
def test_each_divergence_shows_in_its_range_only(twins, change):
    source = checksums(twins, "source")
    bounds = bounds_of(source)
    twins.execute(change.format(id=2750 if "INSERT" not in change else 1))
    target = checksums(twins, "target", bounds=bounds)
    differing = [s[0] for s, t in zip(source, target) if s != t]
    assert len(differing) == 1, f"{change}: ranges {differing} differ"
    if change.startswith("UPDATE"):
        counts = checksums(twins, "target", level="count", bounds=bounds)
        assert counts == checksums(twins, "source", level="count", bounds=bounds), "an update keeps the counts"


@pytest.mark.parametrize(
    "change",
    ["DELETE FROM target WHERE id = {id}", "INSERT INTO target (id, i) VALUES (100000 + {id}, 1)"]
    + [f"UPDATE target SET {column} = NULL WHERE id = {{id}}" for column in COLUMNS]
    + [
        "UPDATE target SET i = i + 1 WHERE id = {id}",
        "UPDATE target SET b = b - 1 WHERE id = {id}",
        "UPDATE target SET n = n + 0.0001 WHERE id = {id}",
        "UPDATE target SET f = f + 0.001 WHERE id = {id}",
        "UPDATE target SET flag = NOT flag WHERE id = {id}",
        "UPDATE target SET ts = ts + interval '1 year' WHERE id = {id}",
        "UPDATE target SET d = d - 10000 WHERE id = {id}",
    ],
)
def test_the_aggregate_level_sees_sums_nulls_and_extremes(twins, change):
    """Integers, numeric, bool and float sums, NULLs in any column, a date or time beyond its
    range's least or greatest: each shows in its range only (floats summed in another order, the
    target being stored backwards, change nothing)."""
    source = checksums(twins, "source", "aggregate")
    bounds = bounds_of(source)
    twins.execute(change.format(id=2750 if "INSERT" not in change else 1))
    target = checksums(twins, "target", "aggregate", bounds=bounds)
    differing = [s[0] for s, t in zip(source, target) if s != t]
    assert len(differing) == 1, f"{change}: ranges {differing} differ"


def test_composite_keys_and_explicit_bounds(db):
    db.execute("CREATE TABLE a (region text, seq int, v text, PRIMARY KEY (region, seq))")
    db.execute("INSERT INTO a SELECT r, s, r || s FROM unnest(ARRAY['eu', 'us', 'ap']) r, generate_series(1, 400) s")
    db.execute("CREATE TABLE b (LIKE a INCLUDING ALL)")
    db.execute("INSERT INTO b SELECT * FROM a ORDER BY random()")
    bounds = '[{"region": "eu", "seq": 1}, {"region": "eu", "seq": 200}, {"region": "us", "seq": 1}]'
    rows_a = checksums(db, "a", bounds=bounds)
    assert [(r, lower, upper, n) for r, lower, upper, n, _ in rows_a] == [
        (1, None, {"region": "eu", "seq": 1}, 400),
        (2, {"region": "eu", "seq": 1}, {"region": "eu", "seq": 200}, 199),
        (3, {"region": "eu", "seq": 200}, {"region": "us", "seq": 1}, 201),
        (4, {"region": "us", "seq": 1}, None, 400),
    ]
    assert checksums(db, "b", bounds=bounds) == rows_a
    db.execute("UPDATE b SET v = 'changed' WHERE region = 'eu' AND seq = 150")
    assert [r[0] for r, s in zip(rows_a, checksums(db, "b", bounds=bounds)) if r != s] == [2]


def jsonb_tokens(db, value):
    """A jsonb document's encoding, as row_hash.rs documents it, from the parsed JSON: objects'
    keys in jsonb's order (shorter first, then bytewise); numbers in numeric's send format, as
    the server's numeric_send() writes them."""
    def counted(tag, data):
        return tag + struct.pack(">I", len(data)) + data

    def walk(v, top=False):
        if isinstance(v, dict):
            keys = sorted(v, key=lambda k: (len(k.encode()), k.encode()))
            return b"{" + b"".join(counted(b"k", k.encode()) + walk(v[k]) for k in keys) + b"}"
        if isinstance(v, list):
            return b"[" + b"".join(walk(e) for e in v) + b"]"
        if top:  # a scalar document
            return b"s" + walk(v) + b"]"
        if v is None:
            return b"n"
        if isinstance(v, bool):
            return b"t" if v else b"f"
        if isinstance(v, str):
            return counted(b'"', v.encode())
        sent = bytes(db.execute("SELECT numeric_send(%s::numeric)", [str(v)]).fetchone()[0])
        return counted(b"#", sent)

    return walk(json.loads(value, parse_float=decimal.Decimal), top=True)


def test_the_row_hash_is_the_documented_encoding(db):
    db.execute("CREATE TABLE enc (id int PRIMARY KEY, t text, gone int, missing bigint, at timestamptz, j jsonb)")
    db.execute("ALTER TABLE enc DROP COLUMN gone")  # dropped columns take no part
    # A document of more than 32 children: every 32nd entry of a container holds an offset.
    document = ('{"b": 1.5, "aa": [true, null, "é", {"x": -0.000001}], "": "", "s": 7, "many": '
                + json.dumps(list(range(40)) + ["end"]) + ', "wide": ' + json.dumps({f"k{i}": i * 10 for i in range(40)}) + "}")
    db.execute("INSERT INTO enc VALUES (7, 'é', NULL, '2000-01-01 00:00:01+00', %s), (8, NULL, NULL, NULL, '12.50')",
               [document])
    # Each column: NULL as a 0 byte; else a 1 byte, its length (4 bytes, big endian), and its
    # send format: int4 big endian, text in UTF-8, timestamptz as microseconds since 2000-01-01
    # UTC; jsonb as the tokens of a walk of it.
    def field(data):
        return b"\x01" + struct.pack(">I", len(data)) + data

    rows = {
        7: b"".join([field(struct.pack(">i", 7)), field("é".encode()), b"\x00",
                     field(struct.pack(">q", 1_000_000)), field(jsonb_tokens(db, document))]),
        8: b"".join([field(struct.pack(">i", 8)), b"\x00", b"\x00", b"\x00", field(jsonb_tokens(db, "12.50"))]),
    }
    expected = {k: struct.unpack(">q", struct.pack(">Q", xxhash.xxh3_64_intdigest(v)))[0] for k, v in rows.items()}
    db.execute("SET TimeZone = 'America/St_Johns'")
    assert dict(db.execute("SELECT id, backfill.row_hash(e) FROM enc e").fetchall()) == expected
    rows = checksums(db, "enc", ranges=1)
    assert rows == [(1, None, None, 2, str(sum(expected.values())))]


def test_numeric_is_hashed_as_its_send_format(db):
    """numeric's send format is read from the value, not asked of numeric_send(): short and long
    headers, special values, huge and compressed values give exactly what numeric_send() gives."""
    db.execute("CREATE TABLE num (id int PRIMARY KEY, n numeric)")
    values = ["0", "0.000", "7", "-1.5", "12345678901234567890.123456789", "1e-20", "-99999.9999", "1e300",
              "1." + "0" * 70 + "1", "NaN", "Infinity", "-Infinity", "9" * 5000]
    db.execute("INSERT INTO num SELECT o, v::numeric FROM unnest(%s::text[]) WITH ORDINALITY AS u(v, o)", [values])
    rows = db.execute("SELECT id, numeric_send(n), backfill.row_hash(t) FROM num t").fetchall()
    assert len(rows) == len(values)
    for id_, sent, hashed in rows:
        encoded = b"\x01" + struct.pack(">I", 4) + struct.pack(">i", id_) + b"\x01" + struct.pack(">I", len(sent)) + bytes(sent)
        assert hashed == struct.unpack(">q", struct.pack(">Q", xxhash.xxh3_64_intdigest(encoded)))[0], values[id_ - 1][:40]


def test_a_row_type_altered_in_the_session_is_hashed_as_it_is_now(db):
    """A session's row hasher is made for a row type's columns: ALTER TABLE changes them under
    the same type OID (a hasher that read an int as text crashed the server)."""
    db.execute("CREATE TABLE altered (id int PRIMARY KEY, v text, gone text, w bigint)")
    db.execute("INSERT INTO altered VALUES (1, '12345', 'x', 7)")
    db.execute("SELECT backfill.row_hash(a) FROM altered a")
    db.execute("ALTER TABLE altered ALTER COLUMN v TYPE int USING v::int")
    db.execute("SELECT backfill.row_hash(a) FROM altered a")
    db.execute("ALTER TABLE altered DROP COLUMN gone")
    db.execute("CREATE TABLE fresh (id int PRIMARY KEY, v int, w bigint)")
    db.execute("INSERT INTO fresh VALUES (1, 12345, 7)")
    assert db.execute("SELECT backfill.row_hash(a) FROM altered a").fetchone() == \
        db.execute("SELECT backfill.row_hash(f) FROM fresh f").fetchone()
    # An anonymous row is hashed as a table's row of the same values. (After a parallel query,
    # the session's anonymous row types are in shared memory, and their descriptors, not
    # reference-counted, must not be released as if they were: XX000.)
    db.execute("SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; SET min_parallel_table_scan_size = 0")
    # (16 renamed force_parallel_mode to debug_parallel_query.)
    force_parallel = "force_parallel_mode" if PG_MAJOR == 15 else "debug_parallel_query"
    db.execute(f"SET {force_parallel} = on")
    db.execute("SELECT count(*) FROM fresh")
    db.execute(f"RESET {force_parallel}")
    for anonymous in ["SELECT backfill.row_hash(ROW(1, 12345, 7::bigint))",
                      "SELECT h FROM backfill.row_hash(ROW(1, 12345, 7::bigint)) AS h"]:
        assert db.execute(anonymous).fetchone() == db.execute("SELECT backfill.row_hash(f) FROM fresh f").fetchone()


@pytest.mark.parametrize("order", ["key", "random"])
def test_sampled_ranges_are_balanced_whatever_the_keys_and_their_order(db, order):
    """Skewed, gappy keys, stored in key order or shuffled: the ranges placed from a sample hold
    about equal rows (a block sample of keys in key order would place its bounds in clumps).
    Never analyzed, the table is sampled row by row instead, as well."""
    keys = "CASE WHEN g <= 60000 THEN g::bigint * g ELSE 10000000000 + g END"
    db.execute("CREATE TABLE skewed (id bigint PRIMARY KEY, v text)")
    db.execute("CREATE TABLE fresh (LIKE skewed INCLUDING ALL)")
    for table in ("skewed", "fresh"):
        db.execute(f"INSERT INTO {table} SELECT {keys}, 'v' FROM generate_series(1, 120000) g ORDER BY {'1' if order == 'key' else 'random()'}")
    db.execute("VACUUM ANALYZE skewed")
    for table in ("skewed", "fresh"):
        rows = [r for (r,) in db.execute(f"SELECT rows FROM backfill_checksum('{table}', ranges => 256, level => 'count')")]
        mean = sum(rows) / len(rows)
        assert sum(rows) == 120000 and len(rows) > 240, table
        assert 0.4 * mean < min(rows) and max(rows) < 1.8 * mean, (table, min(rows), max(rows), mean)


def test_mistakes_are_refused_with_their_sqlstate(db, roles):
    db.execute("CREATE TABLE k (id int PRIMARY KEY, v text)")
    db.execute("INSERT INTO k SELECT g, 'v' FROM generate_series(1, 100) g")
    db.execute("CREATE TABLE keyless (v text)")
    cases = [
        ("SELECT * FROM backfill_checksum(NULL)", "22004"),
        ("SELECT * FROM backfill_checksum('k', level => 'md5')", "22023"),
        ("SELECT * FROM backfill_checksum('k', level => 'Hash')", "22023"),
        ("SELECT * FROM backfill_checksum('k', level => NULL)", "22004"),
        ("SELECT * FROM backfill_checksum('k', ranges => NULL)", "22004"),
        ("SELECT * FROM backfill_checksum('k', ranges => 0)", "22023"),
        # More ranges than backfill.checksum_max_ranges: a limit, as too many bounds is.
        ("SELECT * FROM backfill_checksum('k', ranges => 2000000)", "54000"),
        ("SELECT * FROM backfill_checksum('k', bounds => '{\"id\": 1}')", "22023"),
        ("SELECT * FROM backfill_checksum('k', bounds => '[{\"v\": 1}]')", "22023"),
        ("SELECT * FROM backfill_checksum('k', bounds => '[{\"id\": null}]')", "22023"),
        ("SELECT * FROM backfill_checksum('k', bounds => '[{\"id\": \"x\"}]')", "22P02"),
        ("SELECT * FROM backfill_checksum('keyless')", "55000"),
        ("SELECT backfill.row_hash(1)", "42804"),
        # At most 999,999 bounds (a million ranges), like ranges => ...
        (
            "SELECT * FROM backfill_checksum('k', bounds => (SELECT jsonb_agg(jsonb_build_object('id', g))"
            " FROM generate_series(1, 1000000) g))",
            "54000",
        ),
    ]
    for sql, sqlstate in cases:
        e = error_of(db, sql)
        assert e.sqlstate == sqlstate, f"{sql}: {e.sqlstate} {e}"
    assert db.execute("SELECT backfill.row_hash(NULL::k)").fetchone()[0] is None  # (strict)
    # PUBLIC may not call it; an operator may, and without SELECT on the table learns nothing
    # from it; granted SELECT, it may check it.
    nobody = roles.create("nobody")
    assert error_of(roles.connect(nobody), "SELECT * FROM backfill_checksum('k')").sqlstate == "42501"
    nobody = roles.create("checker", "operator")
    conn = roles.connect(nobody)
    e = error_of(conn, "SELECT * FROM backfill_checksum('k')")
    assert e.sqlstate == "42501" and "table" in e.diag.message_primary, e
    db.execute(f"GRANT SELECT ON k TO {nobody}")
    assert conn.execute("SELECT sum(rows) FROM backfill_checksum('k', ranges => 4)").fetchone()[0] == 100
    # Row-level security applies: it checks the rows the caller sees.
    db.execute("ALTER TABLE k ENABLE ROW LEVEL SECURITY")
    db.execute(f"CREATE POLICY only_some ON k FOR SELECT TO {nobody} USING (id <= 10)")
    assert conn.execute("SELECT sum(rows) FROM backfill_checksum('k', ranges => 4)").fetchone()[0] == 10


def test_key_columns_named_like_the_columns_of_its_own_queries(db):
    """A sample of the keys numbers and counts its rows beside the key's columns: a key column
    named m, i or bound (as those) is still the key's. (It was "column reference m is
    ambiguous", an internal error.)"""
    for table in ("odd", "odd_copy"):
        db.execute(f"""CREATE TABLE {table} (m int, i int, bound text, s int, b int, k1 int,
                                             PRIMARY KEY (m, i, bound, k1));
                       INSERT INTO {table} SELECT g % 7, g, 'x' || g, g, g, g FROM generate_series(1, 2000) g;
                       ANALYZE {table}""")
    ranges = db.execute("SELECT lower, rows FROM backfill_checksum('odd', ranges => 8)").fetchall()
    assert len(ranges) > 1 and sum(r[1] for r in ranges) == 2000
    assert set(ranges[1][0]) == {"m", "i", "bound", "k1"}
    db.execute("UPDATE odd_copy SET s = 0 WHERE i = 5")
    found = db.execute("SELECT key, status FROM backfill_compare('odd', 'odd_copy')").fetchall()
    assert found == [({"m": 5, "i": 5, "bound": "x5", "k1": 5}, "different")]
