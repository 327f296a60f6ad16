"""backfill_checksum(): key ranges of a table with row counts and checksums. Identical tables
agree whatever the session's settings; every kind of divergence shows in its range, in every
column type; the hash is the documented encoding, byte for byte."""

import struct

import pytest
from conftest import error_of

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
    import json

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


def siphash24(data: bytes, k0=0, k1=0) -> int:
    """SipHash-2-4 (Aumasson and Bernstein), written out here to check the documented encoding."""
    mask = (1 << 64) - 1
    rotl = lambda x, b: ((x << b) | (x >> (64 - b))) & mask  # noqa: E731
    v0, v1, v2, v3 = k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D, k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573

    def rounds(n):
        nonlocal v0, v1, v2, v3
        for _ in range(n):
            v0 = (v0 + v1) & mask; v1 = rotl(v1, 13); v1 ^= v0; v0 = rotl(v0, 32)  # noqa: E702
            v2 = (v2 + v3) & mask; v3 = rotl(v3, 16); v3 ^= v2  # noqa: E702
            v0 = (v0 + v3) & mask; v3 = rotl(v3, 21); v3 ^= v0  # noqa: E702
            v2 = (v2 + v1) & mask; v1 = rotl(v1, 17); v1 ^= v2; v2 = rotl(v2, 32)  # noqa: E702

    tail = len(data) % 8
    for i in range(0, len(data) - tail, 8):
        m = int.from_bytes(data[i:i + 8], "little")
        v3 ^= m
        rounds(2)
        v0 ^= m
    m = (len(data) & 0xFF) << 56 | int.from_bytes(data[len(data) - tail:], "little")
    v3 ^= m
    rounds(2)
    v0 ^= m
    v2 ^= 0xFF
    rounds(4)
    return (v0 ^ v1 ^ v2 ^ v3) & mask


def test_the_row_hash_is_the_documented_encoding(db):
    db.execute("CREATE TABLE enc (id int PRIMARY KEY, t text, gone int, missing bigint, at timestamptz)")
    db.execute("ALTER TABLE enc DROP COLUMN gone")  # dropped columns take no part
    db.execute("INSERT INTO enc VALUES (7, 'é', NULL, '2000-01-01 00:00:01+00')")
    # Each column: NULL as a 0 byte; else a 1 byte, its length (4 bytes, big endian), and its
    # send format: int4 big endian, text in UTF-8, timestamptz as microseconds since 2000-01-01 UTC.
    encoded = b"".join([
        b"\x01" + struct.pack(">I", 4) + struct.pack(">i", 7),
        b"\x01" + struct.pack(">I", 2) + "é".encode(),
        b"\x00",
        b"\x01" + struct.pack(">I", 8) + struct.pack(">q", 1_000_000),
    ])
    expected = struct.unpack(">q", struct.pack(">Q", siphash24(encoded)))[0]
    db.execute("SET TimeZone = 'America/St_Johns'")
    assert db.execute("SELECT backfill.row_hash(e) FROM enc e").fetchone()[0] == expected
    rows = checksums(db, "enc", ranges=1)
    assert rows == [(1, None, None, 1, str(expected))]


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
        ("SELECT * FROM backfill_checksum('k', ranges => 2000000)", "22023"),
        ("SELECT * FROM backfill_checksum('k', bounds => '{\"id\": 1}')", "22023"),
        ("SELECT * FROM backfill_checksum('k', bounds => '[{\"v\": 1}]')", "22023"),
        ("SELECT * FROM backfill_checksum('k', bounds => '[{\"id\": null}]')", "22023"),
        ("SELECT * FROM backfill_checksum('k', bounds => '[{\"id\": \"x\"}]')", "22P02"),
        ("SELECT * FROM backfill_checksum('keyless')", "55000"),
        ("SELECT backfill.row_hash(1)", "42804"),
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
