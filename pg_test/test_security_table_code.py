"""A table's own code (casts to json, domains' checks, a composite key's types) runs as the
table's owner, never as the superuser who backfills or checks it; a read reaches only the table
that was checked, not another that took its name or its schema's; after a restart the resumer
trusts no table but the extension's own."""

import time

import psycopg
import pytest

from conftest import (as_reads, backfill_messages, error_of, extra_cluster, status, wait_for, wait_until_ended,
                      wal2json_changes)
from security_helpers import escalation, is_superuser, start, TRAP, value


# --- a value made before its row type was altered ----------------------------------------------

def test_a_composite_value_made_before_its_type_was_altered_is_refused_not_read_with_the_new_columns(db, roles):
    """backfill.row_hash() is anyone's. A role with no grant makes a row of a type of its own,
    keeps it in an array, and alters the type's column from bigint to text: read with the new
    columns, the bigint's bytes would be taken for a text's length and pointer. On the minors that
    version composite values (15.20, 17.12: CVE-2026-6460), row_hash refuses it with 22P07, as
    PostgreSQL's own functions do, alone or inside another row; a fresh value of the altered type
    hashes as before."""
    if db.execute("SELECT count(*) FROM pg_settings WHERE name = 'composite_type_mismatch'").fetchone()[0] == 0:
        pytest.skip("this server does not version composite values (CVE-2026-6460's fix is not in this minor)")
    nobody = roles.create("nobody")
    conn = roles.connect(nobody)
    conn.execute("CREATE TYPE pg_temp.pair AS (a bigint, b bigint)")
    for label, hashed in [("alone", "stale[1]"), ("inside another row", "ROW(1, stale[1])")]:
        e = error_of(conn, f"""DO $$
            DECLARE stale pg_temp.pair[] := ARRAY[ROW(1234567, 42)::pg_temp.pair];
            BEGIN
                ALTER TYPE pg_temp.pair ALTER ATTRIBUTE a TYPE text;
                PERFORM backfill.row_hash({hashed});
            END $$""")
        assert e.sqlstate == "22P07", (label, e)
        conn.execute("DROP TYPE pg_temp.pair")
        conn.execute("CREATE TYPE pg_temp.pair AS (a bigint, b bigint)")
    conn.execute("ALTER TYPE pg_temp.pair ALTER ATTRIBUTE a TYPE text")
    assert conn.execute("SELECT backfill.row_hash(ROW('1234567', 42)::pg_temp.pair)").fetchone()[0] == \
        conn.execute("SELECT backfill.row_hash(ROW('1234567', 42::bigint))").fetchone()[0]


# --- a table's own code runs as the table's owner -------------------------------------------------

def test_a_tables_own_code_runs_as_its_owner_never_as_superuser(db, roles):
    atk = roles.create("atk", "operator")
    db.execute(f"GRANT CREATE ON SCHEMA public TO {atk}")
    conn = roles.connect(atk)
    conn.execute(
        f"""CREATE TYPE atk_mood AS ENUM ('ok');
            CREATE TABLE atk_log (who name, super boolean);
            GRANT INSERT ON atk_log TO PUBLIC;
            CREATE FUNCTION atk_mood_json(atk_mood) RETURNS json LANGUAGE plpgsql AS $$
            BEGIN
                {escalation(atk)}
                INSERT INTO public.atk_log
                     SELECT current_user, rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user;
                RETURN '"ok"'::json;
            END $$;
            CREATE CAST (atk_mood AS json) WITH FUNCTION atk_mood_json(atk_mood);
            CREATE TABLE atk_t (id int PRIMARY KEY, m atk_mood);
            INSERT INTO atk_t SELECT g, 'ok' FROM generate_series(1, 20) g;
            ANALYZE atk_t;"""
    )

    def ran_as():
        """Who ran the cast since the last call, and whether as a superuser."""
        rows = db.execute("SELECT DISTINCT who::text, super FROM atk_log").fetchall()
        count = value(db, "SELECT count(*) FROM atk_log")
        db.execute("TRUNCATE atk_log")
        return rows, count

    # (a) atk backfills its own table.
    assert wait_until_ended(db, start(conn, "atk_t")) == "done"
    assert not is_superuser(db, atk)
    rows, count = ran_as()
    assert rows == [(atk, False)] and count >= 20, "the worker rendered every row through the cast, as atk"

    # (b) the trojan: a superuser estimates and backfills atk's table.
    db.execute("SELECT * FROM backfill_estimate('atk_t')").fetchall()
    assert wait_until_ended(db, start(db, "atk_t")) == "done"
    assert not is_superuser(db, atk)
    rows, count = ran_as()
    assert rows == [(atk, False)] and count >= 20

    # The trap is armed: the cast, run by a superuser, does make atk superuser.
    db.execute("SELECT to_json('ok'::atk_mood)")
    assert is_superuser(db, atk)


def test_checksums_and_comparisons_run_a_tables_own_code_as_its_owner(db, roles):
    """A superuser checking a table reads it as its owner: the cast to json of its key's type,
    which a comparison's and a checksum's key objects go through, runs as the owner."""
    atk = roles.create("atk", "operator")
    db.execute(f"GRANT CREATE ON SCHEMA public TO {atk}")
    conn = roles.connect(atk)
    labels = ", ".join(f"'k{i:02}'" for i in range(1, 41))
    conn.execute(
        f"""CREATE TYPE atk_key AS ENUM ({labels});
            CREATE TABLE atk_log (who name, super boolean);
            GRANT INSERT ON atk_log TO PUBLIC;
            CREATE FUNCTION atk_key_json(atk_key) RETURNS json LANGUAGE plpgsql AS $$
            BEGIN
                {escalation(atk)}
                INSERT INTO public.atk_log
                     SELECT current_user, rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user;
                RETURN pg_catalog.to_json($1::text);
            END $$;
            CREATE CAST (atk_key AS json) WITH FUNCTION atk_key_json(atk_key);
            CREATE TABLE atk_k (k atk_key PRIMARY KEY, v int);
            INSERT INTO atk_k SELECT l, 1 FROM pg_catalog.unnest(enum_range(NULL::atk_key)) l;
            CREATE TABLE atk_copy AS SELECT * FROM atk_k WHERE k <> 'k05';
            ALTER TABLE atk_copy ADD PRIMARY KEY (k);
            UPDATE atk_copy SET v = 2 WHERE k = 'k07';
            ANALYZE atk_k, atk_copy;"""
    )
    for level in ("hash", "count", "aggregate"):
        assert value(db, f"SELECT sum(rows) FROM backfill_checksum('atk_k', ranges => 4, level => '{level}')") == 40
    assert value(db, """SELECT count(*) FROM backfill_checksum('atk_k', bounds => '[{"k": "k10"}]')""") == 2
    found = db.execute("SELECT key->>'k', status FROM backfill_compare('atk_k', 'atk_copy')").fetchall()
    assert sorted(found) == [("k05", "missing"), ("k07", "different")]
    assert error_of(db, "SELECT backfill_repair('atk_k', 'atk_copy')").sqlstate == "22023"
    assert not is_superuser(db, atk)
    rows = db.execute("SELECT DISTINCT who::text, super FROM atk_log").fetchall()
    assert rows == [(atk, False)] and value(db, "SELECT count(*) FROM atk_log") > 0, rows
    # The trap is armed: the cast, run by a superuser, does make atk superuser.
    db.execute("SELECT to_jsonb('k01'::atk_key)")
    assert is_superuser(db, atk)


def test_a_composite_keys_own_code_runs_as_its_owner_when_a_superuser_splits_it(db, roles):
    """parallel => N splits a composite key at a sample of its key tuples (0.8.0); each range's
    pages cast their bounds back to the key's types, and a domain's CHECK calls the table
    owner's function. A superuser's parallel backfill, and its checksum, run it as the owner:
    the owner stays without superuser, though the trap works when a superuser runs it. (With
    the page's last-key query run as the worker's superuser, this test fails.)"""
    atk = roles.create("splitowner")
    db.execute(f"CREATE SCHEMA {atk} AUTHORIZATION {atk}")
    conn = roles.connect(atk)
    conn.execute(TRAP.format(schema=atk, name="ok", args="v int", returns="boolean", role=atk, body="true"))
    conn.execute(
        f"""CREATE DOMAIN {atk}.qty AS int CHECK ({atk}.ok(VALUE));
            CREATE TABLE {atk}.pairs (tenant text, n {atk}.qty, body text, PRIMARY KEY (tenant, n));
            INSERT INTO {atk}.pairs SELECT 't' || (g % 3), g, 'x' FROM generate_series(1, 6000) g;
            ANALYZE {atk}.pairs;"""
    )
    backfill_id = start(db, f"{atk}.pairs", parallel=2)
    assert wait_until_ended(db, backfill_id) == "done"
    parts = db.execute("SELECT count(*), sum(rows_done) FROM backfill_tables WHERE backfill_id = %s", [backfill_id]).fetchone()
    assert parts == (2, 6000), "the composite key was split in two"
    db.execute(f"SELECT count(*) FROM backfill_checksum('{atk}.pairs', ranges => 4)")
    assert not is_superuser(db, atk)
    db.execute(f"SELECT 1::{atk}.qty")  # the trap works when a superuser runs it
    assert is_superuser(db, atk)


# --- a read reaches only the table that was checked -----------------------------------------------

def test_a_page_reads_the_table_it_checked_not_another_that_took_its_name(db):
    """The online-migration swap mid-run: `t` renamed away and another table renamed to `t` in
    one transaction. Pages locked and checked `t` by OID but read it by name: 3,200 of 5,000
    reads carried the other table's rows, and the backfill ended done. Now no read carries
    them: the backfill fails (55000), naming both relations."""
    db.execute("SELECT pg_create_logical_replication_slot('swap', 'wal2json')")
    db.execute(
        """CREATE TABLE t (id int PRIMARY KEY, v text);
           INSERT INTO t SELECT g, 'orig' FROM generate_series(1, 5000) g;
           CREATE TABLE t_new (id int PRIMARY KEY, v text);
           INSERT INTO t_new SELECT g, 'other' FROM generate_series(1, 5000) g;"""
    )
    backfill_id = db.execute(
        "SELECT backfill_start('t', confirm => true, batch_size => 100, rows_per_second => 1000)"
    ).fetchone()[0]
    wait_for(lambda: status(db, backfill_id, "rows_done") >= 200, what="pages before the swap")
    db.execute("BEGIN")
    db.execute("ALTER TABLE t RENAME TO t_old")
    db.execute("ALTER TABLE t_new RENAME TO t")
    db.execute("COMMIT")
    assert wait_until_ended(db, backfill_id) == "failed"
    assert status(db, backfill_id, "last_error_sqlstate") == "55000"
    error = status(db, backfill_id, "last_error")
    assert "relation public.t is not table public.t_old" in error, error
    reads = [r for r in as_reads(backfill_messages(wal2json_changes(db, "swap"))) if r["op"] == "read"]
    assert reads and {r["data"]["v"] for r in reads} == {"orig"}


def test_a_schema_owner_who_replaces_a_schema_mid_run_runs_no_code_as_the_starter(db, roles):
    """A schema's owner renames it mid-run and makes a new schema of that name, holding a table
    of the same name whose column is an enum of theirs with a cast to json of theirs: a
    superuser's backfill of the superuser's table ran that cast as the superuser (the page read
    the new table by name, as the checked table's owner). Now the page refuses the other
    relation before any of its rows is read: the cast never runs."""
    owner = roles.create("schemaowner")
    db.execute(f"CREATE SCHEMA shop AUTHORIZATION {owner}")
    db.execute("CREATE TABLE shop.t (id int PRIMARY KEY, v text)")
    db.execute("INSERT INTO shop.t SELECT g, 'x' FROM generate_series(1, 5000) g")
    db.execute(f"GRANT CREATE ON DATABASE {db.info.dbname} TO {owner}")
    conn = roles.connect(owner)
    backfill_id = db.execute(
        "SELECT backfill_start('shop.t', confirm => true, batch_size => 100, rows_per_second => 1000)"
    ).fetchone()[0]
    wait_for(lambda: status(db, backfill_id, "rows_done") >= 200, what="pages before the swap")
    conn.execute("BEGIN")
    conn.execute("ALTER SCHEMA shop RENAME TO shop_old")
    conn.execute(
        f"""CREATE SCHEMA shop;
            CREATE TABLE shop.seen (who text);
            GRANT INSERT ON shop.seen TO PUBLIC;
            CREATE TYPE shop.mood AS ENUM ('x');
            CREATE FUNCTION shop.mood_json(shop.mood) RETURNS json LANGUAGE plpgsql AS $$
            BEGIN
              INSERT INTO shop.seen VALUES (current_user);
              BEGIN EXECUTE 'ALTER ROLE {owner} SUPERUSER'; EXCEPTION WHEN others THEN NULL; END;
              RETURN '"x"'::json;
            END $$;
            CREATE CAST (shop.mood AS json) WITH FUNCTION shop.mood_json(shop.mood);
            CREATE TABLE shop.t (id int PRIMARY KEY, v shop.mood);
            INSERT INTO shop.t SELECT g, 'x' FROM generate_series(1, 5000) g;"""
    )
    conn.execute("COMMIT")
    assert wait_until_ended(db, backfill_id) == "failed"
    assert status(db, backfill_id, "last_error_sqlstate") == "55000"
    assert db.execute("SELECT count(*) FROM shop.seen").fetchone()[0] == 0
    assert not db.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", [owner]).fetchone()[0]


# --- the resumer ----------------------------------------------------------------------------------

@pytest.mark.cluster
def test_after_a_restart_the_resumer_trusts_no_table_but_the_extensions_own(cluster, roles, db):
    """With preloading, the resumer visits every database as the bootstrap superuser; a fake
    backfill.job in a database without the extension must run nothing."""
    from conftest import extra_cluster

    other = extra_cluster(cluster, "resumer")
    other.start("shared_preload_libraries = 'pg_backfill'")
    try:
        with other.connect() as admin:
            admin.execute("CREATE ROLE fake_owner LOGIN")
            admin.execute("CREATE DATABASE decoy OWNER fake_owner")
        with psycopg.connect(host="127.0.0.1", port=other.port, user="fake_owner", dbname="decoy", autocommit=True) as conn:
            conn.execute(TRAP.format(schema="public", name="pwn", args="", returns="bigint", role="fake_owner", body="1"))
            conn.execute(
                """CREATE SCHEMA backfill;
                   CREATE VIEW backfill.job AS SELECT public.pwn() AS id, 1 AS parallel,
                          'running'::text AS state, NULL::text AS pause_reason"""
            )
        other.pg_ctl("-m fast restart")
        time.sleep(3)  # the launcher starts a resumer per database once recovery is done
        with other.connect() as admin:
            wait_for(lambda: admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_backfill'").fetchone()[0] == 0,
                what="the resumers to finish")
            time.sleep(1)
            assert not is_superuser(admin, "fake_owner")
    finally:
        other.stop()
