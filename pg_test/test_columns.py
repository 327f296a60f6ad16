"""Column lists (`columns => ARRAY[...]`): each read carries exactly those columns, the key
always among them, as row_to_json renders that projection; a publication's column list is the
default and a wider list is refused; verification can be limited to the same columns."""

import json
import threading
import time

import psycopg
import pytest

from conftest import as_reads, backfill_messages, error_of, wait_until_ended, wal2json_changes


@pytest.fixture
def people(db):
    db.execute(
        """CREATE TABLE people (id bigint PRIMARY KEY, name text NOT NULL, ssn text, "Born On" date,
                                gone int, notes jsonb, photo bytea);
           ALTER TABLE people DROP COLUMN gone;
           INSERT INTO people SELECT g, 'p' || g, 'ssn-' || g, date '2000-01-01' + g, jsonb_build_object('n', g),
                                     decode(repeat('ff', 100), 'hex')
             FROM generate_series(1, 3000) g;
           ANALYZE people;"""
    )
    return db


def read_contents(db, slot):
    """The raw text of each read message, through test_decoding: what a consumer gets, byte for byte."""
    return [
        data.split(" content:", 1)[1]
        for data, in db.execute("SELECT data FROM pg_logical_slot_get_changes(%s, NULL, NULL)", [slot]).fetchall()
        if data.startswith("message:")
    ]


def data_of(content):
    return content[content.index(',"data":') + len(',"data":') : content.rindex(',"commit_lsn":')]


def test_the_reads_carry_the_listed_columns_as_row_to_json_renders_them(people):
    people.execute("SELECT pg_create_logical_replication_slot('s', 'test_decoding')")
    backfill_id = people.execute(
        """SELECT backfill_start('people', confirm => true, batch_size => 700,
                                 columns => ARRAY['Born On', 'id', 'name'])"""
    ).fetchone()[0]
    assert wait_until_ended(people, backfill_id) == "done"
    contents = read_contents(people, "s")
    reads = [data_of(c) for c in contents if '"op":"read"' in c]
    # In the table's order, whatever the order named: as a publication's column list.
    expected = [r for r, in people.execute('SELECT row_to_json(p)::text FROM (SELECT id, name, "Born On" FROM people ORDER BY id) p')]
    assert len(reads) == 3000 and reads == expected
    start = json.loads(next(c for c in contents if '"op":"table_start"' in c))
    assert start["columns"] == ["id", "name", "Born On"]
    assert people.execute(
        "SELECT column_list FROM backfill.job_table WHERE job_id = %s", [backfill_id]
    ).fetchone()[0] == ["id", "name", "Born On"]


def test_without_a_list_every_column_goes_and_the_start_marker_names_none(people):
    people.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    backfill_id = people.execute("SELECT backfill_start('people', confirm => true, columns => NULL)").fetchone()[0]
    assert wait_until_ended(people, backfill_id) == "done"
    messages = backfill_messages(wal2json_changes(people, "s"))
    reads = [m for m in as_reads(messages) if m["op"] == "read"]
    assert len(reads) == 3000 and list(reads[0]["data"]) == ["id", "name", "ssn", "Born On", "notes", "photo"]
    assert "columns" not in next(m for m in messages if m["op"] == "table_start")


def test_the_estimate_counts_the_listed_columns_only(people):
    whole, narrow = (
        people.execute("SELECT bytes_estimated FROM backfill_estimate('people', columns => %s)", [columns]).fetchone()[0]
        for columns in (None, ["id"])
    )
    # Each row's photo alone is 204 bytes of JSON; the envelope of a message stays.
    assert whole - narrow > 3000 * 250, (narrow, whole)


def test_keyed_backfills_and_filters_take_a_column_list_too(people):
    people.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    keyed = people.execute(
        """SELECT backfill_start('people', confirm => true, columns => ARRAY['id', 'ssn'],
                                 keys => '[{"id": 5}, {"id": 6}, {"id": 99999}]')"""
    ).fetchone()[0]
    assert wait_until_ended(people, keyed) == "done"
    filtered = people.execute(
        "SELECT backfill_start('people', confirm => true, columns => ARRAY['id'], filter => 'id <= 3')"
    ).fetchone()[0]
    assert wait_until_ended(people, filtered) == "done"
    messages = as_reads(backfill_messages(wal2json_changes(people, "s")))
    assert [(m["op"], m.get("data")) for m in messages if m["backfill_id"] == keyed and m["op"] in ("read", "absent")] == [
        ("read", {"id": 5, "ssn": "ssn-5"}),
        ("read", {"id": 6, "ssn": "ssn-6"}),
        ("absent", None),
    ]
    assert [m["data"] for m in messages if m["backfill_id"] == filtered and m["op"] == "read"] == [
        {"id": 1}, {"id": 2}, {"id": 3}
    ]


# Each column list that is not valid for the table, and its SQLSTATE and message.
INVALID = [
    ("{}", "22023", "the column list is empty"),
    ("{id,NULL}", "22004", "the column list contains NULL"),
    ("{id,name,id}", "42701", "column id is listed twice"),
    ("{name}", "22023", 'leaves out key column id of table public.people'),
    ("{id,nope}", "42703", "column nope of table public.people does not exist"),
    ("{id,gone}", "42703", "column gone of table public.people does not exist"),  # a dropped column
    ("{id,ctid}", "42703", "column ctid of table public.people does not exist"),  # a system column
    ("{id,Name}", "42703", 'column "Name" of table public.people does not exist'),  # names are exact
    ('{id,"name\\"); DROP TABLE people; --"}', "42703", "does not exist"),
    ("{id," + "x" * 10000 + "}", "42703", "does not exist"),
]


@pytest.mark.parametrize("function", ["backfill_start('people', confirm => true, columns => %s::text[])",
                                      "backfill_estimate('people', columns => %s::text[])"])
@pytest.mark.parametrize("bad, sqlstate, message", INVALID)
def test_an_invalid_column_list_is_refused_before_anything_starts(people, function, bad, sqlstate, message):
    e = error_of(people, f"SELECT * FROM {function}", [bad])
    assert e.sqlstate == sqlstate and message in e.diag.message_primary, (e.sqlstate, e.diag.message_primary)
    assert e.diag.message_detail and (e.diag.message_hint or sqlstate == "22004")
    assert people.execute("SELECT count(*) FROM backfill.job").fetchone()[0] == 0
    assert people.execute("SELECT count(*) FROM people").fetchone()[0] == 3000


def test_a_huge_list_of_real_columns_works(db):
    """1,000 columns, listed in reverse: the reads carry them in the table's order."""
    db.execute(f"CREATE TABLE wide (id int PRIMARY KEY, {', '.join(f'c{i} int' for i in range(1000))})")
    db.execute("INSERT INTO wide (id, c0, c999) SELECT g, g, -g FROM generate_series(1, 50) g")
    db.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    listed = [f"c{i}" for i in reversed(range(1000))] + ["id"]
    backfill_id = db.execute("SELECT backfill_start('wide', confirm => true, columns => %s)", [listed]).fetchone()[0]
    assert wait_until_ended(db, backfill_id) == "done"
    reads = [m for m in as_reads(backfill_messages(wal2json_changes(db, "s"))) if m["op"] == "read"]
    assert len(reads) == 50 and list(reads[0]["data"]) == ["id"] + [f"c{i}" for i in range(1000)]
    assert reads[0]["data"]["c999"] == -1


def test_a_publications_column_list_is_the_default_and_a_wider_list_is_refused(people):
    people.execute("CREATE PUBLICATION pub FOR TABLE people (id, name)")
    people.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    e = error_of(people, "SELECT backfill_start('people', confirm => true, publication => 'pub', columns => ARRAY['id', 'ssn'])")
    assert e.sqlstate == "42501" and 'publication "pub" withholds column ssn of table public.people' in e.diag.message_primary
    assert "(id, name)" in e.diag.message_detail and e.diag.message_hint
    backfill_id = people.execute("SELECT backfill_start('people', confirm => true, publication => 'pub')").fetchone()[0]
    assert wait_until_ended(people, backfill_id) == "done"
    narrower = people.execute(
        "SELECT backfill_start('people', confirm => true, publication => 'pub', columns => ARRAY['id'])"
    ).fetchone()[0]
    assert wait_until_ended(people, narrower) == "done"
    messages = as_reads(backfill_messages(wal2json_changes(people, "s")))
    defaulted = [m["data"] for m in messages if m["backfill_id"] == backfill_id and m["op"] == "read"]
    assert len(defaulted) == 3000 and defaulted[0] == {"id": 1, "name": "p1"}
    assert {tuple(m["data"]) for m in messages if m["backfill_id"] == narrower and m["op"] == "read"} == {("id",)}


def test_a_publication_that_withholds_the_key_cannot_be_backfilled(people):
    people.execute("CREATE PUBLICATION pub FOR TABLE people (name) WITH (publish = 'insert')")
    e = error_of(people, "SELECT backfill_start('people', confirm => true, publication => 'pub')")
    assert e.sqlstate == "22023" and 'publication "pub" leaves out key column id' in e.diag.message_primary
    assert people.execute("SELECT count(*) FROM backfill.job").fetchone()[0] == 0


def test_a_publication_that_stops_publishing_a_column_mid_run_stops_the_backfill(people):
    """ALTER PUBLICATION narrows the list while the backfill runs: its next page refuses to
    send the withheld column (the reads so far carried what was published then)."""
    people.execute("CREATE PUBLICATION pub FOR TABLE people (id, name, ssn)")
    backfill_id = people.execute(
        "SELECT backfill_start('people', confirm => true, publication => 'pub', batch_size => 100, rows_per_second => 500)"
    ).fetchone()[0]
    people.execute("ALTER PUBLICATION pub SET TABLE people (id, name)")
    assert wait_until_ended(people, backfill_id) == "failed"
    error = people.execute("SELECT last_error FROM backfill_status WHERE id = %s", [backfill_id]).fetchone()[0]
    assert 'publication "pub" no longer publishes column ssn of table public.people' in error


def test_a_listed_column_dropped_mid_run_fails_the_backfill_and_others_do_not_matter(people):
    people.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    backfill_id = people.execute(
        """SELECT backfill_start('people', confirm => true, batch_size => 100, rows_per_second => 1000,
                                 columns => ARRAY['id', 'name', 'notes'])"""
    ).fetchone()[0]
    # Columns outside the list come and go: the reads do not change.
    people.execute("ALTER TABLE people DROP COLUMN photo, ADD COLUMN extra int DEFAULT 7")
    people.execute("SELECT pg_sleep(0.3)")
    people.execute("ALTER TABLE people DROP COLUMN notes")
    assert wait_until_ended(people, backfill_id) == "failed"
    error = people.execute("SELECT last_error FROM backfill_status WHERE id = %s", [backfill_id]).fetchone()[0]
    assert "column notes of table public.people is no longer the column the backfill started with" in error
    reads = [m for m in as_reads(backfill_messages(wal2json_changes(people, "s"))) if m["op"] == "read"]
    assert reads and {tuple(m["data"]) for m in reads} == {("id", "name", "notes")}


# Verification of a copy made with a column list.

WEIRD = '"we""ird, col)"'


@pytest.fixture
def pair(db):
    """people, and a copy of three of its columns (one with a hostile name)."""
    db.execute(
        f"""CREATE TABLE people (id bigint PRIMARY KEY, name text NOT NULL, ssn text, {WEIRD} text, born date);
            INSERT INTO people SELECT g, 'p' || g, 'ssn-' || g, 'w' || g, date '2000-01-01' + g
              FROM generate_series(1, 4000) g;
            ANALYZE people;
            CREATE TABLE copy (id bigint PRIMARY KEY, name text NOT NULL, {WEIRD} text);
            INSERT INTO copy SELECT id, name, {WEIRD} FROM people;"""
    )
    return db


LISTED = ["id", "name", 'we"ird, col)']


def checksums(db, table, level, columns, bounds=None):
    return db.execute(
        "SELECT lower, rows, checksum FROM backfill_checksum(%s, ranges => 8, level => %s, bounds => %s, columns => %s) ORDER BY range",
        [table, level, bounds, columns],
    ).fetchall()


def compared(db, columns, target="copy", **options):
    args = "".join(f", {k} => %({k})s" for k in options)
    rows = db.execute(f"SELECT key->>'id', status FROM backfill_compare('people', '{target}', columns => %(columns)s{args})",
                      {"columns": columns, **options})
    return {int(k): status for k, status in rows}


@pytest.mark.parametrize("level", ["hash", "aggregate"])
def test_checksums_over_a_column_list_prove_the_copy_and_ignore_other_columns(pair, level):
    bounds = json.dumps([b for b, in pair.execute("SELECT upper FROM backfill_checksum('people', ranges => 8) WHERE upper IS NOT NULL")])
    source = checksums(pair, "people", level, LISTED, bounds)
    assert source == checksums(pair, "copy", level, LISTED, bounds) and len(source) == 8
    # In any order: the columns are taken in the table's order.
    assert source == checksums(pair, "people", level, list(reversed(LISTED)), bounds)
    assert source != checksums(pair, "people", level, None, bounds), "every column is not the list"
    pair.execute("UPDATE people SET ssn = 'changed', born = NULL WHERE id = 10")
    assert checksums(pair, "people", level, LISTED, bounds) == source, "a column outside the list changed"
    # (The aggregate level sums no text: it counts NULLs.)
    pair.execute(f"UPDATE copy SET {WEIRD} = NULL WHERE id = 3000")
    assert checksums(pair, "copy", level, LISTED, bounds) != source


def test_a_comparison_over_a_column_list_finds_exactly_the_listed_columns_differences(pair):
    assert compared(pair, LISTED) == {}
    pair.execute("UPDATE people SET ssn = 'changed' WHERE id BETWEEN 1 AND 100")
    pair.execute(f"UPDATE copy SET {WEIRD} = 'stale' WHERE id = 7")
    pair.execute("DELETE FROM copy WHERE id = 9")
    pair.execute("UPDATE copy SET name = 'stale' WHERE id = 3999")
    assert compared(pair, LISTED) == {7: "different", 9: "missing", 3999: "different"}
    assert compared(pair, LISTED, level="count") == {9: "missing"}
    # Without the list, the copy does not have the source's columns.
    e = error_of(pair, "SELECT * FROM backfill_compare('people', 'copy')")
    assert e.sqlstate == "42804" and "columns =>" in e.diag.message_hint
    # A listed column that the copy does not have.
    e = error_of(pair, "SELECT * FROM backfill_compare('people', 'copy', columns => ARRAY['id', 'ssn'])")
    assert e.sqlstate == "42804" and "copy does not have the columns of people" in e.diag.message_primary


def test_a_list_that_leaves_out_the_key_still_compares_the_key(pair):
    """The key is hashed with a column list that leaves it out, as a backfill with that list
    delivers it: a copy whose listed values of two keys of one range were swapped differs. (The
    sums of the listed values alone cancel out: 0.9.0 found the copy equal.)"""
    bounds = json.dumps([b for b, in pair.execute("SELECT upper FROM backfill_checksum('people', ranges => 8) WHERE upper IS NOT NULL")])
    source = checksums(pair, "people", "hash", ["name"], bounds)
    assert source == checksums(pair, "copy", "hash", ["name"], bounds)
    assert source == checksums(pair, "people", "hash", ["id", "name"], bounds), "the key is hashed as if listed"
    pair.execute("UPDATE copy SET name = CASE id WHEN 10 THEN 'p11' ELSE 'p10' END WHERE id IN (10, 11)")
    copy = checksums(pair, "copy", "hash", ["name"], bounds)
    differing = [(s, c) for s, c in zip(source, copy) if s != c]
    assert len(differing) == 1, differing
    (lower, rows, _), (_, copy_rows, _) = differing[0]
    assert rows == copy_rows and (lower is None or lower["id"] <= 10)
    assert compared(pair, ["name"]) == {10: "different", 11: "different"}
    # A repair over the list re-delivers the two rows with their key, as backfill_start() does.
    pair.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    backfill_id = pair.execute(
        "SELECT backfill_repair('people', 'copy', confirm => true, columns => ARRAY['name'])"
    ).fetchone()[0]
    assert backfill_id is not None and wait_until_ended(pair, backfill_id) == "done"
    reads = [m for m in as_reads(backfill_messages(wal2json_changes(pair, "s"))) if m["op"] == "read"]
    assert [m["data"] for m in reads] == [{"id": 10, "name": "p10"}, {"id": 11, "name": "p11"}]


def test_a_repair_over_a_column_list_redelivers_those_columns_only(pair):
    pair.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    pair.execute("DELETE FROM copy WHERE id IN (5, 6)")
    backfill_id = pair.execute(
        "SELECT backfill_repair('people', 'copy', confirm => true, columns => %s)", [LISTED]
    ).fetchone()[0]
    assert wait_until_ended(pair, backfill_id) == "done"
    reads = [m for m in as_reads(backfill_messages(wal2json_changes(pair, "s"))) if m["op"] == "read"]
    assert [m["data"] for m in reads] == [
        {"id": 5, "name": "p5", 'we"ird, col)': "w5"},
        {"id": 6, "name": "p6", 'we"ird, col)': "w6"},
    ]


def test_a_foreign_copy_is_compared_over_a_column_list_on_its_own_server(cluster, pair, scratch_database):
    remote = scratch_database("columns_remote")
    with cluster.connect(remote) as conn:
        conn.execute("CREATE EXTENSION pg_backfill")
        conn.execute(f"CREATE TABLE copy (id bigint PRIMARY KEY, name text NOT NULL, {WEIRD} text)")
        conn.execute(f"INSERT INTO copy SELECT g, 'p' || g, 'w' || g FROM generate_series(1, 4000) g")
        # (The aggregate level sums no text: it counts NULLs.)
        conn.execute(f"UPDATE copy SET name = 'stale', {WEIRD} = NULL WHERE id = 77")
    pair.execute("CREATE EXTENSION postgres_fdw")
    pair.execute("CREATE EXTENSION dblink")
    pair.execute(f"CREATE SERVER far FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '127.0.0.1', port '{cluster.port}', dbname '{remote}')")
    pair.execute("CREATE USER MAPPING FOR CURRENT_USER SERVER far")
    pair.execute("CREATE SCHEMA far")
    pair.execute("IMPORT FOREIGN SCHEMA public LIMIT TO (copy) FROM SERVER far INTO far")
    assert compared(pair, LISTED, target="far.copy") == {77: "different"}
    assert compared(pair, LISTED, target="far.copy", level="aggregate") == {77: "different"}


@pytest.mark.parametrize("function", [
    "SELECT * FROM backfill_checksum('people', columns => %s::text[])",
    "SELECT * FROM backfill_compare('people', 'copy', columns => %s::text[])",
    "SELECT backfill_repair('people', 'copy', columns => %s::text[])",
])
@pytest.mark.parametrize("bad, sqlstate", [("{}", "22023"), ("{id,NULL}", "22004"), ("{id,id}", "42701"),
                                           ("{id,nope}", "42703"), ('{id,"x\\"); DROP TABLE copy; --"}', "42703")])
def test_verification_refuses_an_invalid_column_list(pair, function, bad, sqlstate):
    e = error_of(pair, function, [bad])
    assert e.sqlstate == sqlstate, (e.sqlstate, e.diag.message_primary)
    assert e.diag.message_detail
    assert pair.execute("SELECT count(*) FROM copy").fetchone()[0] == 4000


def test_verification_over_a_column_list_needs_the_right_to_read_the_table(pair, roles):
    """An operator (docs/security.md's grants) with SELECT on the listed columns only is refused
    as one without any; with SELECT on the table it checksums and compares."""
    operator = roles.create("operator", "operator")
    pair.execute(f"GRANT SELECT (id, name) ON people TO {operator}")
    conn = roles.connect(operator)
    for sql in ("SELECT * FROM backfill_checksum('people', columns => ARRAY['id', 'name'])",
                "SELECT * FROM backfill_compare('people', 'copy', columns => ARRAY['id', 'name'])"):
        e = error_of(conn, sql)
        assert e.sqlstate == "42501" and "people" in e.diag.message_primary, e.diag.message_primary
    pair.execute(f"GRANT SELECT ON people, copy TO {operator}")
    assert conn.execute("SELECT count(*) FROM backfill_compare('people', 'copy', columns => ARRAY['id', 'name'])").fetchone()[0] == 0


@pytest.mark.parametrize("change", [
    # Two listed and unlisted columns swap names: "name" would then be the ssn column.
    "ALTER TABLE people RENAME COLUMN name TO tmp; ALTER TABLE people RENAME COLUMN ssn TO name; "
    "ALTER TABLE people RENAME COLUMN tmp TO ssn",
    # The listed column dropped and another added under its name.
    "ALTER TABLE people DROP COLUMN name; ALTER TABLE people ADD COLUMN name text DEFAULT 'new'",
])
def test_a_listed_column_replaced_mid_run_stops_the_backfill(people, change):
    """A column is its attribute, not its name: no other column's values ever go out under a
    listed name."""
    people.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    backfill_id = people.execute(
        """SELECT backfill_start('people', confirm => true, batch_size => 100, rows_per_second => 1000,
                                 columns => ARRAY['id', 'name'])"""
    ).fetchone()[0]
    people.execute("SELECT pg_sleep(0.3)")
    people.execute(change)
    assert wait_until_ended(people, backfill_id) == "failed"
    error = people.execute("SELECT last_error_sqlstate, last_error FROM backfill_status WHERE id = %s", [backfill_id]).fetchone()
    assert error[0] == "42703" and "column name of table public.people is no longer the column" in error[1], error
    reads = [m for m in as_reads(backfill_messages(wal2json_changes(people, "s"))) if m["op"] == "read"]
    assert reads and all(m["data"]["name"] == f"p{m['data']['id']}" for m in reads)
    # Resumed, it stops again: the list's columns are the ones it started with.
    people.execute("SELECT backfill_resume(%s)", [backfill_id])
    assert wait_until_ended(people, backfill_id) == "failed"
    assert not [m for m in as_reads(backfill_messages(wal2json_changes(people, "s"))) if m["op"] == "read"]


def test_table_end_names_only_the_listed_columns_sequences(db):
    db.execute("CREATE TABLE s (id bigserial PRIMARY KEY, n bigserial, v text)")
    db.execute("INSERT INTO s (v) SELECT 'x' FROM generate_series(1, 10)")
    db.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    for columns, expected in ((["id", "v"], ["id"]), (None, ["id", "n"])):
        backfill_id = db.execute("SELECT backfill_start('s', confirm => true, columns => %s)", [columns]).fetchone()[0]
        assert wait_until_ended(db, backfill_id) == "done"
        end = next(m for m in backfill_messages(wal2json_changes(db, "s")) if m["op"] == "table_end")
        assert [s["column"] for s in end["sequences"]] == expected


def test_verification_of_a_table_with_a_column_named_backfill_row(db):
    db.execute("CREATE TABLE a (id int PRIMARY KEY, backfill_row text)")
    db.execute("INSERT INTO a SELECT g, 'r' || g FROM generate_series(1, 100) g")
    db.execute("CREATE TABLE b (LIKE a INCLUDING ALL)")
    db.execute("INSERT INTO b SELECT * FROM a WHERE id <> 5")
    db.execute("UPDATE b SET backfill_row = 'stale' WHERE id = 6")
    rows = db.execute("SELECT key->>'id', status FROM backfill_compare('a', 'b') ORDER BY 1").fetchall()
    assert rows == [("5", "missing"), ("6", "different")]


def test_a_publication_with_no_tables_exists(people):
    people.execute("CREATE PUBLICATION empty")
    e = error_of(people, "SELECT backfill_start('people', confirm => true, publication => 'empty')")
    assert e.sqlstate == "55000" and 'is not in publication "empty"' in e.diag.message_primary


@pytest.fixture
def parted(db):
    db.execute(
        """CREATE TABLE pr (id int PRIMARY KEY, a text, b text) PARTITION BY RANGE (id);
           CREATE TABLE pr1 PARTITION OF pr FOR VALUES FROM (0) TO (100);
           CREATE TABLE pr2 PARTITION OF pr FOR VALUES FROM (100) TO (200);
           INSERT INTO pr SELECT g, 'a' || g, 'secret' || g FROM generate_series(1, 199) g;"""
    )
    db.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    return db


@pytest.mark.parametrize("publication, sqlstate, message", [
    ("FOR TABLE pr1 (id, a)", "55000", 'partition public.pr2 of table public.pr is not in publication "pub"'),
    ("FOR TABLE pr1 (id, a), pr2", "0A000", "the partitions of table public.pr are published with different columns"),
    ("FOR TABLE pr1 (id, a), pr2 (id, b)", "0A000", "the partitions of table public.pr are published with different columns"),
])
def test_a_partitioned_tables_partitions_as_its_publication_holds_them(parted, publication, sqlstate, message):
    """Rows are published partition by partition: a backfill of the partitioned table sends no
    partition the publication does not hold, and no column it withholds from one of them."""
    parted.execute(f"CREATE PUBLICATION pub {publication}")
    e = error_of(parted, "SELECT backfill_start('pr', confirm => true, publication => 'pub')")
    assert e.sqlstate == sqlstate and message in e.diag.message_primary, (e.sqlstate, e.diag.message_primary)
    assert e.diag.message_detail and e.diag.message_hint
    assert parted.execute("SELECT count(*) FROM backfill.job").fetchone()[0] == 0


@pytest.mark.parametrize("publication", [
    "FOR TABLE pr1 (id, a), pr2 (a, id)",
    "FOR TABLE pr (id, a) WITH (publish_via_partition_root = true)",
])
def test_partitions_published_with_one_column_list_send_it(parted, publication):
    parted.execute(f"CREATE PUBLICATION pub {publication}")
    backfill_id = parted.execute("SELECT backfill_start('pr', confirm => true, publication => 'pub')").fetchone()[0]
    assert wait_until_ended(parted, backfill_id) == "done"
    reads = [m for m in as_reads(backfill_messages(wal2json_changes(parted, "s"))) if m["op"] == "read"]
    assert len(reads) == 199 and {tuple(m["data"]) for m in reads} == {("id", "a")}


def test_a_repair_through_a_pipelines_slot_sends_no_column_its_publication_withholds(pair):
    """The repair's slot is the one the table's last backfill delivered into, whose publication has
    a column list: the repair's backfill is bound by it, as that backfill was. (Named: a cancelled
    backfill's slot is never taken by default, since issue 35.) A list with a column it withholds
    is refused; the copy's own columns are repaired."""
    pair.execute("CREATE PUBLICATION pub FOR TABLE people (id, name)")
    pair.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    first = pair.execute("SELECT backfill_start('people', confirm => true, slot => 's', publication => 'pub')").fetchone()[0]
    wal2json_changes(pair, "s")
    pair.execute("SELECT backfill_cancel(%s)", [first])
    pair.execute("DELETE FROM copy WHERE id = 5")
    # A consumer that keeps confirming what it reads, for the comparisons to wait on.
    stop = threading.Event()

    def consume():
        with psycopg.connect(host="127.0.0.1", port=pair.info.port, user=pair.info.user,
                             dbname=pair.info.dbname, autocommit=True) as conn:
            while not stop.is_set():
                conn.execute("SELECT count(*) FROM pg_logical_slot_get_changes('s', NULL, NULL)")
                time.sleep(0.02)

    consumer = threading.Thread(target=consume)
    consumer.start()
    try:
        e = error_of(pair, "SELECT backfill_repair('people', 'copy', confirm => true, passes => 1, slot => 's', columns => %s)",
                     [LISTED])
        assert e.sqlstate == "42501" and "withholds column" in e.diag.message_primary, e.diag.message_primary
        repair = pair.execute(
            "SELECT backfill_repair('people', 'copy', confirm => true, passes => 1, slot => 's', columns => '{id,name}')"
        ).fetchone()[0]
    finally:
        stop.set()
        consumer.join()
    # (It waits for the slot's consumer, which this test does not run: what it will send is
    # what it recorded.)
    assert pair.execute(
        "SELECT j.publication_name, t.column_list FROM backfill.job j JOIN backfill.job_table t ON t.job_id = j.id WHERE j.id = %s",
        [repair],
    ).fetchone() == ("pub", ["id", "name"])
    pair.execute("SELECT backfill_cancel(%s)", [repair])


def test_comparisons_in_latin1_with_a_key_whose_name_is_not_ascii(cluster, scratch_database):
    """In LATIN1, a key whose name is not ASCII was read as other characters, and the differing
    rows were not found (false agreement): such a key is refused; a column that is not ASCII
    outside the key is compared."""
    name = scratch_database("compare_latin1", "ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    with cluster.connect(name) as conn:
        conn.execute("SET client_encoding = 'UTF8'")
        conn.execute("CREATE EXTENSION pg_backfill")
        conn.execute('CREATE TABLE b1 ("ïd" int PRIMARY KEY, v text)')
        conn.execute("INSERT INTO b1 SELECT g, 'v' || g FROM generate_series(1, 50) g")
        conn.execute("CREATE TABLE b2 (LIKE b1 INCLUDING ALL)")
        conn.execute("INSERT INTO b2 SELECT * FROM b1")
        conn.execute("""UPDATE b2 SET v = 'DIFF' WHERE "ïd" = 9""")
        conn.execute("""DELETE FROM b2 WHERE "ïd" = 10""")
        for sql in ("SELECT * FROM backfill_compare('b1', 'b2', passes => 1)",
                    "SELECT * FROM backfill_checksum('b1')"):
            e = error_of(conn, sql)
            assert e.sqlstate == "0A000" and "not ASCII" in e.diag.message_primary, e.diag.message_primary
        conn.execute('CREATE TABLE c1 (id int PRIMARY KEY, "vé" text)')
        conn.execute("INSERT INTO c1 SELECT g, 'v' || g FROM generate_series(1, 50) g")
        conn.execute("CREATE TABLE c2 (LIKE c1 INCLUDING ALL)")
        conn.execute("INSERT INTO c2 SELECT * FROM c1")
        conn.execute("""UPDATE c2 SET "vé" = 'DIFF' WHERE id = 9""")
        for columns in (None, ["id", "vé"]):
            rows = conn.execute(
                "SELECT key->>'id', status FROM backfill_compare('c1', 'c2', passes => 1, columns => %s) ORDER BY 1",
                [columns],
            ).fetchall()
            assert rows == [("9", "different")], (columns, rows)


def test_a_column_list_needs_the_same_rights_as_a_whole_row(people, roles):
    """An operator with SELECT and UPDATE on the listed columns only may not start a backfill of
    them: a backfill locks and reads whole rows, as the table's rights allow (42501); nothing starts."""
    operator = roles.create("operator", "operator")
    people.execute(f"GRANT SELECT (id, name), UPDATE (name) ON people TO {operator}")
    conn = roles.connect(operator)
    e = error_of(conn, "SELECT backfill_start('people', confirm => true, columns => '{id,name}')")
    assert e.sqlstate == "42501" and "people" in e.diag.message_primary, e.diag.message_primary
    assert people.execute("SELECT count(*) FROM backfill.job").fetchone()[0] == 0
