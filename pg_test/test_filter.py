"""Filtered backfills (`filter => '...'`): only the rows a boolean expression is true for, the
expression run as the role that started the backfill, checked before anything starts, and the
ordering guarantee kept while writers flip rows into and out of it."""

import re

import pytest

from conftest import PG_MAJOR, as_reads, backfill_messages, error_of, status, wait_until_ended, wal2json_changes
from test_ordering import WRITES, run_scenario


@pytest.fixture
def orders(db):
    db.execute(
        """CREATE TABLE orders (id bigint PRIMARY KEY, tenant text NOT NULL, amount int NOT NULL);
           INSERT INTO orders SELECT g, CASE WHEN g % 10 = 0 THEN 'acme' ELSE 'other' END, g % 100
             FROM generate_series(1, 5000) g;
           ANALYZE orders;"""
    )
    return db


def reads_and_markers(db, slot):
    messages = backfill_messages(wal2json_changes(db, slot))
    return [m for m in as_reads(messages) if m["op"] == "read"], [m for m in messages if m["op"] == "table_start"]


def test_a_filter_delivers_exactly_its_rows_and_the_start_marker_names_it(orders):
    orders.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    estimate = orders.execute("SELECT rows_estimated FROM backfill_estimate('orders', filter => 'tenant = ''acme''')").fetchone()[0]
    whole = orders.execute("SELECT rows_estimated FROM backfill_estimate('orders')").fetchone()[0]
    assert 250 <= estimate <= 1000 and whole >= 4000, "the estimate is the planner's for the filtered scan"
    backfill_id = orders.execute(
        "SELECT backfill_start('orders', confirm => true, batch_size => 300, filter => 'tenant = ''acme''')"
    ).fetchone()[0]
    assert wait_until_ended(orders, backfill_id) == "done"
    reads, starts = reads_and_markers(orders, "s")
    assert sorted(r["data"]["id"] for r in reads) == list(range(10, 5001, 10))
    assert [s["filter"] for s in starts] == ["tenant = 'acme'"]
    assert status(orders, backfill_id, "rows_done", "row_filter", "percent_done") == (500, "tenant = 'acme'", 100)


def test_without_a_filter_the_start_marker_has_none(orders):
    orders.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    backfill_id = orders.execute("SELECT backfill_start('orders', confirm => true, filter => NULL)").fetchone()[0]
    assert wait_until_ended(orders, backfill_id) == "done"
    reads, starts = reads_and_markers(orders, "s")
    assert len(reads) == 5000 and "filter" not in starts[0]
    assert status(orders, backfill_id, "row_filter") is None


def test_a_huge_filter_works(orders):
    """A filter of about 60 kB: 10,000 ids."""
    ids = list(range(1, 20001, 2))
    huge = f"id IN ({', '.join(map(str, ids))})"
    orders.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    backfill_id = orders.execute("SELECT backfill_start('orders', confirm => true, filter => %s)", [huge]).fetchone()[0]
    assert wait_until_ended(orders, backfill_id) == "done"
    reads, starts = reads_and_markers(orders, "s")
    assert sorted(r["data"]["id"] for r in reads) == list(range(1, 5001, 2))
    assert starts[0]["filter"] == huge


# Each filter that is not one valid boolean expression, and the SQLSTATE it is refused with.
INVALID = [
    ("", "42601"),  # empty
    ("tenant =", "42601"),  # a syntax error
    ("nope = 1", "42703"),  # no such column
    ("amount + 1", "42804"),  # not boolean
    ("'acme'", "22P02"),  # a literal that is not a boolean
    ("sum(amount) > 0", "42803"),  # an aggregate
    ("true) OR (true", "42601"),  # closes our parenthesis: the page's condition would be ORed away
    ("true) GROUP BY (id", "42601"),
    ("true) UNION SELECT 1 FROM orders WHERE (true", "42601"),
    ("true); DROP TABLE orders; SELECT (1", "42601"),
    ("true) AND (true", "42601"),
    ("true /* )", "42601"),  # an unterminated comment
    ("id IN (SELECT 1)", "0A000"),  # a subquery
    ("EXISTS (SELECT FROM pg_catalog.pg_authid)", "0A000"),
    ("random() < 0.5", "0A000"),  # volatile
    ("generate_series(1, 2) > 0", "0A000"),  # a set-returning function
    ("my_function(id)", "42883"),  # not found on search_path pg_catalog, pg_temp
]


@pytest.mark.parametrize("function", ["backfill_start('orders', confirm => true, filter => %s)",
                                      "backfill_estimate('orders', filter => %s)"])
@pytest.mark.parametrize("bad, sqlstate", INVALID)
def test_an_invalid_filter_is_refused_before_anything_starts(orders, function, bad, sqlstate):
    e = error_of(orders, f"SELECT * FROM {function}", [bad])
    assert e.sqlstate == sqlstate, (e.sqlstate, e.diag.message_primary)
    assert "filter of a backfill of table public.orders is not valid" in e.diag.message_primary
    assert e.diag.message_detail and e.diag.message_hint
    assert orders.execute("SELECT count(*) FROM backfill.job").fetchone()[0] == 0
    assert orders.execute("SELECT count(*) FROM orders").fetchone()[0] == 5000


def test_keys_and_a_filter_are_refused_together(orders):
    e = error_of(orders, "SELECT backfill_start('orders', confirm => true, keys => '[{\"id\": 1}]', filter => 'true')")
    assert e.sqlstate == "22023" and "public.orders" in e.diag.message_primary and "absent" in e.diag.message_detail
    assert orders.execute("SELECT count(*) FROM backfill.job").fetchone()[0] == 0


def test_a_partitioned_table_takes_no_filter(db):
    db.execute("CREATE TABLE p (id int PRIMARY KEY) PARTITION BY RANGE (id)")
    db.execute("CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (100)")
    e = error_of(db, "SELECT backfill_start('p', confirm => true, filter => 'id > 5')")
    assert e.sqlstate == "0A000" and "public.p" in e.diag.message_primary and e.diag.message_hint


def test_a_selective_filter_samples_a_bounded_share_of_the_table(db):
    """The samples a start reads, the composite key's for parallel workers' ranges and the one
    that sizes messages, are sized by the table's rows, not the filter's: a filter that passes
    a few dozen rows of 200,000 made both read every row (on 2M rows, 949 MB and 16 s in the
    starting backend). Counted by their DEBUG lines, whatever the machine's speed."""
    db.execute(
        """CREATE TABLE wide (a int, b int, v int NOT NULL, PRIMARY KEY (a, b));
           INSERT INTO wide SELECT g / 10, g % 10, g % 7 FROM generate_series(1, 200000) g;
           ANALYZE wide;"""
    )
    lines = []
    db.add_notice_handler(lambda diag: lines.append(diag.message_primary))
    db.execute("SET client_min_messages = debug1")
    backfill_id = db.execute(
        "SELECT backfill_start('wide', confirm => true, parallel => 2, filter => 'v = 3 AND a < 50')"
    ).fetchone()[0]
    db.execute("RESET client_min_messages")
    db.execute("SELECT backfill_cancel(%s)", [backfill_id])

    def counted(pattern):
        found = [int(m.group(1)) for line in lines if (m := re.search(pattern, line))]
        assert len(found) == 1, lines
        return found[0]

    # About 10,000 keys and 2,000 rows: block samples, so a few blocks more or less.
    assert 1_000 < counted(r"public\.wide: split at quantiles of (\d+) sampled keys") < 40_000
    assert counted(r"public\.wide: the average message size sampled from (\d+) rows") < 20_000
    assert db.execute("SELECT count(*) FROM backfill_tables WHERE backfill_id = %s", [backfill_id]).fetchone()[0] == 2


def test_the_filter_runs_as_the_starter_never_as_the_owner(orders, roles):
    """orders belongs to a superuser; the operator may update it. A filter function that says who
    runs it lets every row through only when that is the operator (it runs at every page)."""
    operator = roles.create("operator", "operator")
    orders.execute(f"GRANT SELECT, UPDATE ON orders TO {operator}")
    orders.execute(
        f"""CREATE FUNCTION public.run_by_operator(bigint) RETURNS boolean STABLE LANGUAGE plpgsql AS $$
            BEGIN RETURN current_user = '{operator}' AND current_setting('search_path') = 'pg_catalog, pg_temp'; END $$"""
    )
    conn = roles.connect(operator)
    backfill_id = conn.execute(
        "SELECT backfill_start('orders', confirm => true, filter => 'public.run_by_operator(id)')"
    ).fetchone()[0]
    assert wait_until_ended(orders, backfill_id) == "done"
    assert status(orders, backfill_id, "rows_done") == 5000


def test_a_filter_cannot_make_its_starter_a_superuser(orders, roles):
    """A volatile function (one that could write: here ALTER ROLE) is refused at start; it never
    runs, as anyone."""
    operator = roles.create("operator", "operator")
    orders.execute(f"GRANT SELECT, UPDATE ON orders TO {operator}")
    conn = roles.connect(operator)
    conn.execute(
        f"""CREATE FUNCTION pg_temp.promote(bigint) RETURNS boolean LANGUAGE plpgsql AS $$
            BEGIN EXECUTE 'ALTER ROLE {operator} SUPERUSER'; RETURN true;
            EXCEPTION WHEN insufficient_privilege THEN RETURN true; END $$"""
    )
    e = error_of(conn, "SELECT backfill_start('orders', confirm => true, filter => 'pg_temp.promote(id)')")
    assert e.sqlstate == "0A000" and "volatile" in e.diag.message_primary
    assert not orders.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", [operator]).fetchone()[0]


def test_a_filter_reads_nothing_its_starter_may_not_read(orders, roles):
    """Through a function it may execute, the filter reaches a table the operator may not read
    (a subquery in the filter itself is refused: INVALID): the backfill fails on its first page
    with 42501 and delivers nothing."""
    operator = roles.create("operator", "operator")
    orders.execute(f"GRANT SELECT, UPDATE ON orders TO {operator}")
    orders.execute("CREATE TABLE secret (tenant text); INSERT INTO secret VALUES ('acme')")
    orders.execute("""CREATE FUNCTION public.in_secret(text) RETURNS boolean STABLE LANGUAGE plpgsql
                      AS $$ BEGIN RETURN $1 IN (SELECT tenant FROM public.secret); END $$""")
    orders.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    conn = roles.connect(operator)
    backfill_id = conn.execute(
        "SELECT backfill_start('orders', confirm => true, filter => 'public.in_secret(tenant)')"
    ).fetchone()[0]
    assert wait_until_ended(orders, backfill_id) == "failed"
    assert status(orders, backfill_id, "last_error_sqlstate", "rows_done") == ("42501", 0)
    assert "secret" in status(orders, backfill_id, "last_error")
    reads, _ = reads_and_markers(orders, "s")
    assert reads == []


@pytest.mark.parametrize("rows_per_message", [1, 30])
def test_reads_stay_ordered_while_writers_flip_rows_into_and_out_of_the_filter(cluster, db, rows_per_message):
    """test_ordering's scenario with filter => 'v % 2 = 0': every update flips its row. A row that
    enters or leaves the filter reaches the consumer by its change, after any read of it."""
    writers, violations, mismatched, _ = run_scenario(
        cluster, db, skip_row_locks=False, rows_per_message=rows_per_message, row_filter="v % 2 = 0"
    )
    assert writers.errors == []
    assert writers.ops > WRITES, "the writers barely ran: the scenario proves nothing"
    assert violations == []
    assert mismatched == set()


def test_the_filtered_ordering_test_fails_without_row_locks(cluster, db):
    """The control, with the filter: without row locks, stale reads land after newer changes."""
    writers, violations, mismatched, _ = run_scenario(cluster, db, skip_row_locks=True, row_filter="v % 2 = 0")
    assert writers.errors == []
    assert violations and mismatched


def test_the_filter_means_to_its_worker_what_it_meant_to_its_check(orders, db):
    """The settings that change how SQL text reads are pinned, at the check and in the worker:
    a string that ends in a backslash with standard_conforming_strings off in the caller's
    session would otherwise close the filter's parenthesis in the worker (every row delivered
    once per matching row); a date in the caller's DMY order would select other rows. (19 has
    standard_conforming_strings always on: there, only the date's order can differ.)"""
    if PG_MAJOR < 19:
        orders.execute("SET standard_conforming_strings = off")
        e = error_of(orders, r"""SELECT backfill_start('orders', confirm => true, filter => $f$'\' IS NOT NULL) OR (true --' IS NOT NULL AND amount = 3$f$)""")
        assert e.sqlstate == "42601" and "not one expression" in e.diag.message_primary
        assert orders.execute("SELECT count(*) FROM backfill.job").fetchone()[0] == 0
        # The other way round: the database's default is off, the filter is read with it on.
        orders.execute("RESET standard_conforming_strings")
        orders.execute(f"ALTER DATABASE {db.info.dbname} SET standard_conforming_strings = off")
    orders.execute(r"UPDATE orders SET tenant = 'a\b' WHERE id <= 7")
    orders.execute("SET DateStyle = 'SQL, DMY'")
    orders.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    backfill_id = orders.execute(
        r"""SELECT backfill_start('orders', confirm => true, filter => $f$tenant = 'a\b' AND '01/02/2024'::date = '2024-01-02'$f$)"""
    ).fetchone()[0]
    assert wait_until_ended(orders, backfill_id) == "done"
    reads, _ = reads_and_markers(orders, "s")
    assert sorted(r["data"]["id"] for r in reads) == list(range(1, 8))


def test_a_filter_is_checked_again_on_every_page(orders, roles):
    """The table's owner changes the filtered column's type mid-run to one whose implicit cast
    is its own volatile function, which would then run as the starter (a superuser) on every
    page: the next page checks the filter again and stops the backfill; the cast never runs."""
    owner = roles.create("tabowner")
    orders.execute(f"ALTER TABLE orders OWNER TO {owner}")
    orders.execute(f"GRANT CREATE ON SCHEMA public TO {owner}")
    conn = roles.connect(owner)
    conn.execute(
        f"""CREATE TYPE num AS (x int);
            CREATE TABLE seen (who text);
            CREATE FUNCTION to_int(num) RETURNS int LANGUAGE plpgsql VOLATILE AS $$
            BEGIN
              INSERT INTO public.seen VALUES (current_user);
              BEGIN EXECUTE 'ALTER ROLE {owner} SUPERUSER'; EXCEPTION WHEN others THEN NULL; END;
              RETURN ($1).x;
            END $$;
            CREATE CAST (num AS int) WITH FUNCTION to_int(num) AS IMPLICIT;
            GRANT INSERT ON seen TO PUBLIC;"""
    )
    backfill_id = orders.execute(
        "SELECT backfill_start('orders', confirm => true, batch_size => 100, rows_per_second => 1000, filter => 'amount > 0')"
    ).fetchone()[0]
    orders.execute("SELECT pg_sleep(0.5)")
    conn.execute("ALTER TABLE orders ALTER COLUMN amount TYPE num USING ROW(amount)::num")
    assert wait_until_ended(orders, backfill_id) == "failed"
    assert status(orders, backfill_id, "last_error_sqlstate") == "0A000"
    assert "volatile" in status(orders, backfill_id, "last_error")
    assert orders.execute("SELECT count(*) FROM seen").fetchone()[0] == 0
    assert not orders.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", [owner]).fetchone()[0]


def test_a_filter_in_a_database_that_is_not_utf8_is_ascii(cluster, scratch_database):
    """In LATIN1, a filter's other characters are written as Unicode escapes; one that is not
    ASCII is refused, rather than read as other bytes that match nothing."""
    name = scratch_database("filter_latin1", "ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    with cluster.connect(name) as conn:
        conn.execute("SET client_encoding = 'UTF8'")
        conn.execute("CREATE EXTENSION pg_backfill")
        conn.execute("CREATE TABLE l (id int PRIMARY KEY, s text)")
        conn.execute("INSERT INTO l SELECT g, CASE WHEN g % 2 = 0 THEN 'é' ELSE 'x' END FROM generate_series(1, 100) g")
        e = error_of(conn, "SELECT backfill_start('l', confirm => true, filter => $$s = 'é'$$)")
        assert e.sqlstate == "0A000" and "not ASCII" in e.diag.message_primary and "U&" in e.diag.message_hint
        backfill_id = conn.execute(r"SELECT backfill_start('l', confirm => true, filter => $$s = U&'\00e9'$$)").fetchone()[0]
        assert wait_until_ended(conn, backfill_id) == "done"
        assert status(conn, backfill_id, "rows_done") == 50


def test_a_filter_that_names_a_temporary_object_is_refused_at_start(orders):
    """The caller's pg_temp is not the worker's: a function, or a domain, made there would pass
    a check in the caller's session and fail the worker's first page."""
    orders.execute("CREATE FUNCTION pg_temp.keep(int) RETURNS bool STABLE LANGUAGE sql AS 'SELECT $1 = 3'")
    orders.execute("CREATE DOMAIN pg_temp.small AS int CHECK (VALUE < 50)")
    for filter in ("pg_temp.keep(amount)", "amount::pg_temp.small < 10"):
        e = error_of(orders, "SELECT backfill_start('orders', confirm => true, filter => %s)", [filter])
        assert e.sqlstate == "0A000" and "temporary object" in e.diag.message_primary, (filter, e.diag.message_primary)
    assert orders.execute("SELECT count(*) FROM backfill.job").fetchone()[0] == 0
    # A filter of the same shape with pg_catalog's objects passes.
    assert orders.execute("SELECT rows_estimated > 0 FROM backfill_estimate('orders', filter => 'amount::int8 < 10')").fetchone()[0]


def test_a_filter_longer_than_its_bound_is_refused_before_anything_starts(orders, roles):
    """A filter's text travels in the table_start marker: one of 190 MB of control characters
    made a 1.2 GB WAL record that 15 could not read back (every slot failed, and recovery).
    Refused at start and at estimate, for an operator as for a superuser, before any job row."""
    huge = "id > 0 /* " + "\x01" * (1024 * 1024) + " */"
    operator = roles.create("op_long", "operator")
    orders.execute(f"GRANT SELECT, UPDATE ON orders TO {operator}")
    for conn in (orders, roles.connect(operator)):
        for call in ("SELECT backfill_start('orders', confirm => true, filter => %s)",
                     "SELECT * FROM backfill_estimate('orders', filter => %s)"):
            e = error_of(conn, call, [huge])
            assert e.sqlstate == "54000" and "public.orders" in e.diag.message_primary and "too long" in e.diag.message_primary, e
            assert e.diag.message_detail and e.diag.message_hint
    assert orders.execute("SELECT count(*) FROM backfill.job").fetchone()[0] == 0
    # Just within the bound, the filter is taken, and its marker stays within max_message_size.
    within = "id > 0 /* " + "x" * (1024 * 1024 - 20) + " */"
    backfill_id = orders.execute("SELECT backfill_start('orders', confirm => true, filter => %s)", [within]).fetchone()[0]
    assert wait_until_ended(orders, backfill_id) == "done"


def test_a_marker_that_would_pass_max_message_size_fails_the_backfill_and_writes_nothing(orders, cluster):
    """Every message, markers too, stays within backfill.max_message_size: a filter whose
    table_start marker would pass it fails the backfill (54000) rather than write it."""
    orders.execute("SELECT pg_create_logical_replication_slot('s', 'wal2json')")
    orders.execute("ALTER SYSTEM SET backfill.max_message_size = 4096")
    orders.execute("SELECT pg_reload_conf()")
    try:
        long_filter = "id > 0 /* " + "y" * 8000 + " */"
        backfill_id = orders.execute("SELECT backfill_start('orders', confirm => true, filter => %s)", [long_filter]).fetchone()[0]
        assert wait_until_ended(orders, backfill_id) == "failed"
        assert status(orders, backfill_id, "last_error_sqlstate") == "54000"
        assert "table_start" in status(orders, backfill_id, "last_error")
        assert reads_and_markers(orders, "s") == ([], [])
    finally:
        orders.execute("ALTER SYSTEM RESET backfill.max_message_size")
        orders.execute("SELECT pg_reload_conf()")


OWNERS_CAST = """CREATE TYPE num AS (x int);
    CREATE TABLE seen (who text);
    GRANT INSERT ON seen TO PUBLIC;
    CREATE FUNCTION shout() RETURNS void LANGUAGE plpgsql VOLATILE AS $$
    BEGIN
      INSERT INTO public.seen VALUES (current_user);
      BEGIN EXECUTE 'ALTER ROLE {owner} SUPERUSER'; EXCEPTION WHEN others THEN NULL; END;
    END $$;
    -- Labelled IMMUTABLE: its volatility label says nothing of what it does.
    CREATE FUNCTION to_int(num) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$
    BEGIN PERFORM public.shout(); RETURN ($1).x; END $$;
    CREATE CAST (num AS int) WITH FUNCTION to_int(num) AS IMPLICIT;"""


def test_a_filter_runs_no_code_of_a_role_its_starter_does_not_trust_whatever_its_label(orders, roles):
    """The table's owner casts its own type to int through an IMMUTABLE-labelled function that
    runs a volatile one: a superuser's filter `amount > 0` would run it as the superuser, at
    start (the column already of that type) and on every page (changed mid-run)."""
    owner = roles.create("tabowner2", "operator")
    orders.execute(f"ALTER TABLE orders OWNER TO {owner}")
    orders.execute(f"GRANT CREATE ON SCHEMA public TO {owner}")
    conn = roles.connect(owner)
    conn.execute(OWNERS_CAST.format(owner=owner))
    # Mid-run: the column becomes the owner's type after the backfill started.
    backfill_id = orders.execute(
        "SELECT backfill_start('orders', confirm => true, batch_size => 100, rows_per_second => 1000, filter => 'amount > 0')"
    ).fetchone()[0]
    orders.execute("SELECT pg_sleep(0.5)")
    conn.execute("ALTER TABLE orders ALTER COLUMN amount TYPE num USING ROW(amount)::num")
    assert wait_until_ended(orders, backfill_id) == "failed"
    assert status(orders, backfill_id, "last_error_sqlstate") == "42501"
    assert "public.to_int(public.num)" in status(orders, backfill_id, "last_error")
    # At start: the column is of that type already, and the filter names no function at all.
    for call in ("SELECT backfill_start('orders', confirm => true, filter => 'amount > 0')",
                 "SELECT * FROM backfill_estimate('orders', filter => 'amount > 0')"):
        e = error_of(orders, call)
        assert e.sqlstate == "42501" and f'owned by role "{owner}"' in e.diag.message_primary, e.diag.message_primary
        assert "public.orders" in e.diag.message_primary and e.diag.message_detail and e.diag.message_hint
    assert orders.execute("SELECT count(*) FROM seen").fetchone()[0] == 0
    assert not orders.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", [owner]).fetchone()[0]
    # The owner's own filter may run the owner's code: a role trusts itself.
    assert conn.execute("SELECT rows_estimated > 0 FROM backfill_estimate('orders', filter => 'amount > 0')").fetchone()[0]


def test_a_filter_runs_no_domain_check_of_an_untrusted_role(orders, roles):
    """A domain's CHECK is its owner's code: a cast to another role's domain is refused, and so
    is a superuser's domain whose check calls another role's function."""
    owner = roles.create("domowner")
    orders.execute(f"GRANT CREATE ON SCHEMA public TO {owner}")
    conn = roles.connect(owner)
    conn.execute("CREATE FUNCTION small(int) RETURNS bool LANGUAGE sql IMMUTABLE AS 'SELECT $1 < 1000'")
    conn.execute("CREATE DOMAIN theirs AS int CHECK (VALUE OPERATOR(pg_catalog.<) 1000)")
    orders.execute("CREATE DOMAIN mine AS int CHECK (public.small(VALUE))")
    for filter, code in (("amount::public.theirs < 10", "domain public.theirs"),
                         ("amount::public.mine < 10", "function public.small(integer)")):
        e = error_of(orders, "SELECT * FROM backfill_estimate('orders', filter => %s)", [filter])
        assert e.sqlstate == "42501" and code in e.diag.message_primary, (filter, e.diag.message_primary)
    # A superuser's own domain over pg_catalog's code passes.
    orders.execute("CREATE DOMAIN checked AS int CHECK (VALUE OPERATOR(pg_catalog.<) 1000)")
    assert orders.execute("SELECT rows_estimated > 0 FROM backfill_estimate('orders', filter => 'amount::public.checked < 10')").fetchone()[0]


def test_a_filter_names_no_temporary_collation_and_reads_text_search_with_a_fixed_configuration(orders):
    """A temporary collation passed the start check and failed the worker (3F000); the caller's
    default_text_search_config made the estimate select other rows than the worker delivered."""
    orders.execute("CREATE COLLATION pg_temp.mine (provider = libc, locale = 'C')")
    e = error_of(orders, """SELECT backfill_start('orders', confirm => true, filter => 'tenant COLLATE pg_temp.mine < ''b''')""")
    assert e.sqlstate == "0A000" and "temporary object" in e.diag.message_primary, e.diag.message_primary
    orders.execute("ALTER TABLE orders ADD COLUMN body text")
    orders.execute("UPDATE orders SET body = CASE WHEN id % 5 = 0 THEN 'running' ELSE 'walked' END")
    orders.execute("ANALYZE orders")
    orders.execute("SET default_text_search_config = 'pg_catalog.english'")
    backfill_id = orders.execute(
        "SELECT backfill_start('orders', confirm => true, filter => $$to_tsvector(body) @@ to_tsquery('run')$$)"
    ).fetchone()[0]
    assert wait_until_ended(orders, backfill_id) == "done"
    # pg_catalog.simple does not stem: 'running' is not 'run', whatever the caller's setting.
    assert status(orders, backfill_id, "rows_done") == 0
    backfill_id = orders.execute(
        "SELECT backfill_start('orders', confirm => true, filter => $$to_tsvector('english', body) @@ to_tsquery('english', 'run')$$)"
    ).fetchone()[0]
    assert wait_until_ended(orders, backfill_id) == "done"
    assert status(orders, backfill_id, "rows_done") == 1000


# Filters refused for different reasons: what the error's message says, and the words of its hint.
KINDS = [
    ("id", "42804", "of type bigint, not boolean", "condition"),
    ("amount + 1", "42804", "of type integer, not boolean", "condition"),
    ("\"Amount\" > 0", "42703", "column", "quote"),
    ("my_function(id)", "42883", "function", "schema"),
    ("tenant =", "42601", "syntax", "quote"),
    ("id IN (SELECT 1)", "0A000", "subquery", "keys =>"),
    ("random() < 0.5", "0A000", "volatile", "stable"),
    ("true) OR (true", "42601", "one expression", "parenthes"),
]


@pytest.mark.parametrize("bad, sqlstate, says, hint", KINDS)
def test_each_kind_of_invalid_filter_has_its_own_message_and_hint(orders, bad, sqlstate, says, hint):
    """A filter error names what is wrong with the filter, never the query pg_backfill wraps it in
    (filter => 'id' said "argument of AND must be type boolean"), and its hint fits that kind of
    error: the advice to quote names only where a name was not found, or the text did not parse."""
    e = error_of(orders, "SELECT backfill_start('orders', confirm => true, filter => %s)", [bad])
    assert e.sqlstate == sqlstate, (e.sqlstate, e.diag.message_primary)
    assert says in e.diag.message_primary and "AND" not in e.diag.message_primary, e.diag.message_primary
    assert hint in e.diag.message_hint, e.diag.message_hint
    quoting = "quote" in e.diag.message_hint.lower()
    assert quoting == (sqlstate in ("42703", "42601") and "parenthes" not in hint), e.diag.message_hint
