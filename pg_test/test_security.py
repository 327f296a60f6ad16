"""Security: who may call what (the grant blocks of docs/security.md, run as written), the checks on the
caller, no escalation to superuser through the caller's search_path or a table's own code, what
each role sees in the views, the worker cap, hints that quote names, the message prefix, and
authenticated messages."""

import base64
import hashlib
import hmac
import json
import re
import subprocess
import threading
import time
from contextlib import suppress

import psycopg
import pytest
from conftest import (PG_BIN, PG_MAJOR, ROOT, Consumer, as_reads, backfill_messages, error_of, extra_cluster, messages_with_xids, readme_grants,
                      status, wait_for, wait_until_ended, wal2json_changes, worker_pid)


# --- helpers ---------------------------------------------------------------------------------


def value(conn, sql, params=None):
    return conn.execute(sql, params).fetchone()[0]


def make_table(conn, name, rows):
    conn.execute(
        f"""CREATE TABLE {name} (id int PRIMARY KEY, label text);
            INSERT INTO {name} SELECT g, 'row ' || g FROM generate_series(1, {rows}) g;
            ANALYZE {name};"""
    )


def start(conn, table, **options) -> int:
    """backfill_start(table, confirm => true, option => value...): the backfill id."""
    named = "".join(f", {name} => %s" for name in options)
    return value(conn, f"SELECT backfill_start(%s::regclass, confirm => true{named})", [table, *options.values()])


def is_superuser(conn, role) -> bool:
    return value(conn, "SELECT rolsuper FROM pg_roles WHERE rolname = %s", [role])


def hint_statement(error) -> str:
    """The SQL statement a hint shows: from its SELECT to its last semicolon."""
    hint = error.diag.message_hint or ""
    assert "SELECT" in hint and ";" in hint, hint
    return hint[hint.index("SELECT") : hint.rindex(";") + 1]


@pytest.fixture
def operator(db, roles):
    """An operator (the grants of docs/security.md) that may SELECT and UPDATE table t (200 rows): (role, connection)."""
    make_table(db, "t", 200)
    role = roles.create("op", "operator")
    db.execute(f"GRANT SELECT, UPDATE ON t TO {role}")
    return role, roles.connect(role)


# --- 1. grants -------------------------------------------------------------------------------

def test_public_may_execute_no_function_but_those_the_views_call(db):
    functions = dict(
        db.execute(
            """SELECT p.oid::regprocedure::text, has_function_privilege('public', p.oid, 'EXECUTE')
                 FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
                WHERE d.classid = 'pg_proc'::regclass AND d.deptype = 'e'
                  AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_backfill')
                  AND p.oid NOT IN (SELECT v.refobjid FROM pg_depend v JOIN pg_rewrite r ON r.oid = v.objid
                                     WHERE v.classid = 'pg_rewrite'::regclass AND v.refclassid = 'pg_proc'::regclass
                                       AND r.ev_class IN ('backfill_status'::regclass, 'backfill_tables'::regclass,
                                                      'backfill_progress'::regclass))"""
        ).fetchall()
    )
    for name in ("backfill_start(", "backfill.start(", "backfill_estimate(", "backfill_cancel(", "backfill_key("):
        assert any(f.startswith(name) for f in functions), name
    # Executable by all by design, granting nothing (test below): Citus's node-side start runs
    # backfill_start() as its caller, backfill_start()'s option check only refuses, and keys only
    # narrow a backfill the caller started in the same transaction; a row's hash is of a row the
    # caller has; a message key is read only for a caller that may SELECT backfill.message_key.
    # (The follows' event trigger runs as the extension's owner: no role needs a grant for it.)
    granting_nothing = {
        "backfill.message_key_bytes(integer)",
        "backfill.start_on_node(regclass[],boolean,integer,integer,name,name,bigint,integer,jsonb)",
        "backfill.refuse_node_options(oid[],jsonb,bigint,bigint,integer,integer)",
        "backfill.set_keys_of(bigint,oid,jsonb)",
        "backfill.row_hash(anyelement)",
        # (Calls backfill_message_valid(text,bigint), which needs the consumer's grant.)
        "backfill_message_valid(text,xid)",
    }
    assert [f for f, public in functions.items() if public and f not in granting_nothing] == []


def test_the_functions_public_may_execute_grant_nothing(db, roles):
    make_table(db, "t", 10)
    role = roles.create("nogrants")
    db.execute(f"GRANT SELECT, UPDATE ON t TO {role}")
    conn = roles.connect(role)
    reply = conn.execute(
        "SELECT backfill.start_on_node(ARRAY['t']::regclass[], true, 100, NULL, NULL, NULL, NULL, 1)"
    ).fetchone()[0]
    assert reply["sqlstate"] == "42501" and "backfill_start" in reply["message"], reply
    tables = conn.execute("SELECT backfill.refuse_node_options(ARRAY['t'::regclass::oid], NULL, NULL, NULL, NULL, NULL)"
                          ).fetchone()[0]
    assert tables == [db.execute("SELECT 't'::regclass::oid").fetchone()[0]]
    assert db.execute("SELECT count(*) FROM backfill_status").fetchone()[0] == 0
    # Keys narrow only a backfill started in the caller's own transaction.
    backfill_id = db.execute("SELECT backfill_start('t', confirm => true, rows_per_second => 1)").fetchone()[0]
    e = error_of(conn, "SELECT backfill.set_keys_of(%s, 't'::regclass, '[{\"id\": 1}]')", [backfill_id])
    assert e.sqlstate == "55000" and f"backfill {backfill_id}" in e.diag.message_primary, e
    assert db.execute("SELECT count(*) FROM backfill.job_key").fetchone()[0] == 0
    db.execute("SELECT backfill_cancel(%s)", [backfill_id])
    # (Its worker exits at its next page: the start below needs a worker slot.)
    wait_for(lambda: db.execute("SELECT backfill.workers_running(%s)", [backfill_id]).fetchone()[0] == 0,
             what="the cancelled backfill's worker to exit")
    # NULL keys change nothing; a NULL id or table is 22004.
    assert conn.execute("SELECT backfill.set_keys_of(NULL, NULL, NULL)").fetchone()[0] is None
    for sql in ("SELECT backfill.set_keys_of(NULL, 't'::regclass, '[]')", "SELECT backfill.set_keys_of(1, NULL, '[]')"):
        assert error_of(conn, sql).sqlstate == "22004", sql
    # Keys for the node's tables must be one list per table: anything else starts nothing.
    before = db.execute("SELECT count(*) FROM backfill.job").fetchone()[0]
    for shard_keys in ('{}', '[]', '[[{"id": 1}], [{"id": 2}]]', '"x"', '[null]', '[[{"id": "no"}]]'):
        reply = db.execute(
            "SELECT backfill.start_on_node(ARRAY['t']::regclass[], true, 100, NULL, NULL, NULL, NULL, 1, %s::jsonb)",
            [shard_keys]).fetchone()[0]
        assert reply.get("sqlstate") in ("22023", "22P02"), (shard_keys, reply)
    assert db.execute("SELECT count(*) FROM backfill.job").fetchone()[0] == before
    reply = db.execute(
        "SELECT backfill.start_on_node(ARRAY['t']::regclass[], true, 100, NULL, NULL, NULL, NULL, 1, '[[{\"id\": 3}]]')"
    ).fetchone()[0]
    assert wait_until_ended(db, reply["id"]) == "done"
    assert status(db, reply["id"], "rows_done") == 1


def test_a_role_without_grants_may_not_call_the_functions(db, roles):
    make_table(db, "t", 10)
    role = roles.create("nogrants")
    db.execute(f"GRANT SELECT, UPDATE ON t TO {role}")  # the table is not what is missing
    conn = roles.connect(role)
    for call in ("backfill_start('t', confirm => true)", "backfill_estimate('t')"):
        e = error_of(conn, f"SELECT * FROM {call}")
        assert e.sqlstate == "42501" and "permission denied for function" in e.diag.message_primary, call


# --- 2. what starting a backfill needs from the caller -------------------------------------

def test_start_needs_update_as_well_as_select(db, roles):
    make_table(db, "t", 50)
    role = roles.create("op", "operator")
    db.execute(f"GRANT SELECT ON t TO {role}")
    conn = roles.connect(role)
    e = error_of(conn, "SELECT backfill_start('t', confirm => true)")
    assert e.sqlstate == "42501" and "GRANT UPDATE" in (e.diag.message_hint or "")
    db.execute(f"GRANT UPDATE ON t TO {role}")
    assert wait_until_ended(db, start(conn, "t")) == "done"


def test_a_backfill_stops_when_its_starter_loses_the_right_to_lock(db, operator):
    role, conn = operator
    backfill_id = start(conn, "t", rows_per_second=20, batch_size=10)
    wait_for(lambda: (status(db, backfill_id, "rows_done") or 0) > 0, what="first page")
    db.execute(f"REVOKE UPDATE ON t FROM {role}")
    assert wait_until_ended(db, backfill_id, timeout=30) == "failed"
    sqlstate, error = status(db, backfill_id, "last_error_sqlstate", "last_error")
    assert sqlstate == "42501" and role in error and "UPDATE" in error


def test_start_is_refused_when_row_level_security_filters_the_caller(db, operator):
    role, conn = operator
    db.execute("ALTER TABLE t ENABLE ROW LEVEL SECURITY; CREATE POLICY few ON t USING (id <= 5)")
    assert value(conn, "SELECT count(*) FROM t") == 5  # the policy does filter the caller
    assert error_of(conn, "SELECT backfill_start('t', confirm => true)").sqlstate == "42501"
    assert value(db, "SELECT count(*) FROM backfill.job") == 0


# --- 3. binding a slot ---------------------------------------------------------------------------

def test_binding_a_slot_needs_replication(db, roles, operator):
    role, conn = operator
    slot = f"s_{roles.suffix}"
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", [slot])
    e = error_of(conn, "SELECT backfill_start('t', confirm => true, slot => %s)", [slot])
    assert e.sqlstate == "42501"
    db.execute(f"ALTER ROLE {role} REPLICATION")
    backfill_id = start(conn, "t", slot=slot)
    conn.execute("SELECT backfill_cancel(%s)", [backfill_id])
    assert wait_until_ended(db, backfill_id) == "cancelled"


# --- 4. no escalation through the caller's search_path -------------------------------------

# Functions the extension might call unqualified, shadowed in schema evil: (name, arguments,
# result, arguments of a sample call). texteq and int8eq back the = operators on text and bigint.
TRAPS = [
    ("clock_timestamp", "", "timestamptz", ""),
    ("now", "", "timestamptz", ""),
    ("current_setting", "text", "text", "'wal_level'"),
    ("hashtext", "text", "integer", "'x'"),
    ("pg_has_role", "name, name, text", "boolean", "'postgres', 'postgres', 'MEMBER'"),
    ("has_table_privilege", "oid, text", "boolean", "'t'::regclass, 'SELECT'"),
    ("octet_length", "text", "integer", "'x'"),
    ("to_json", "text", "json", "'x'::text"),
    ("row_to_json", "record", "json", "row(1)"),
    ("texteq", "text, text", "boolean", "'a', 'a'"),
    ("int8eq", "bigint, bigint", "boolean", "1, 1"),
]


def escalation(role) -> str:
    """plpgsql that makes `role` superuser when a superuser runs it (and does nothing otherwise)."""
    return f"BEGIN EXECUTE 'ALTER ROLE {role} SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;"


def test_the_callers_search_path_cannot_make_it_superuser(db, roles):
    make_table(db, "t", 1000)
    atk = roles.create("atk", "operator")
    db.execute(f"GRANT SELECT, UPDATE ON t TO {atk}; CREATE SCHEMA evil AUTHORIZATION {atk}")
    conn = roles.connect(atk)
    for name, args, result, _ in TRAPS:
        params = ", ".join(f"${i + 1}" for i in range(len(args.split(",")) if args else 0))
        conn.execute(
            f"""CREATE FUNCTION evil.{name}({args}) RETURNS {result} LANGUAGE plpgsql
                AS $$ BEGIN {escalation(atk)} RETURN pg_catalog.{name}({params}); END $$"""
        )
    for t, function in (("text", "texteq"), ("bigint", "int8eq")):
        conn.execute(f"CREATE OPERATOR evil.= (LEFTARG = {t}, RIGHTARG = {t}, FUNCTION = evil.{function})")

    conn.execute("SET search_path = evil, pg_catalog, public")
    # Unqualified names now resolve to the traps.
    for name, args, _, _ in TRAPS:
        found, trap = conn.execute(
            "SELECT to_regprocedure(%s)::oid, %s::regprocedure::oid", [f"{name}({args})", f"evil.{name}({args})"]
        ).fetchone()
        assert found == trap, name
    for t in ("text", "bigint"):
        found, trap = conn.execute(
            "SELECT to_regoperator(%s)::oid, %s::regoperator::oid", [f"=({t},{t})", f"evil.=({t},{t})"]
        ).fetchone()
        assert found == trap, f"= on {t}"

    conn.execute("SELECT * FROM backfill_estimate('t')").fetchall()
    backfill_id = value(conn, "SELECT backfill_start('t', confirm => true, batch_size => 10, rows_per_second => 50)")
    conn.execute("SELECT backfill_set(%s, rows_per_second => 40)", [backfill_id])
    assert status(db, backfill_id, "rows_per_second") == 40
    conn.execute("SELECT backfill_pause(%s)", [backfill_id])
    wait_for(lambda: worker_pid(db, backfill_id) is None, what="the paused worker to exit")
    assert status(db, backfill_id, "state") == "paused"
    conn.execute("SELECT backfill_resume(%s)", [backfill_id])
    assert status(db, backfill_id, "state") == "running"
    assert value(conn, "SELECT backfill_wait(%s, timeout => '5 s')", [backfill_id]) is False
    conn.execute("SELECT backfill_cancel(%s)", [backfill_id])
    assert wait_until_ended(db, backfill_id) == "cancelled"
    conn.execute("SELECT * FROM backfill_status").fetchall()
    conn.execute("SELECT * FROM backfill_tables").fetchall()
    assert wait_until_ended(db, backfill_id) == "cancelled"
    assert not is_superuser(db, atk)

    # Each trap is armed: run by a superuser, it does make atk superuser.
    for name, _, _, sample in TRAPS:
        db.execute(f"SELECT evil.{name}({sample})")
        assert is_superuser(db, atk), f"evil.{name} is not a working trap"
        db.execute(f"ALTER ROLE {atk} NOSUPERUSER")


# --- 5. a table's own code runs as the table's owner -------------------------------------------

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

# --- 6. what each role sees ----------------------------------------------------------------------

@pytest.fixture
def a_backfill(db, roles):
    """Role A, an operator, runs a slow backfill of t (2000 rows): (role, connection, id)."""
    make_table(db, "t", 2000)
    role = roles.create("a", "operator")
    db.execute(f"GRANT SELECT, UPDATE ON t TO {role}")
    conn = roles.connect(role)
    backfill_id = start(conn, "t", batch_size=10, rows_per_second=50)
    wait_for(
        lambda: value(conn, "SELECT cursor IS NOT NULL FROM backfill_tables WHERE backfill_id = %s", [backfill_id]),
        what="A's first page",
    )
    yield role, conn, backfill_id
    with suppress(psycopg.Error):
        db.execute("SELECT backfill_cancel(%s)", [backfill_id])


def test_a_role_sees_only_its_own_backfills_unless_it_is_in_pg_monitor(db, roles, a_backfill):
    _, a, backfill_id = a_backfill
    b = roles.connect(roles.create("b", "operator"))
    monitor = roles.create("mon", "operator")
    db.execute(f"GRANT pg_monitor TO {monitor}")
    m = roles.connect(monitor)

    assert value(db, "SELECT count(*) FROM backfill_status") == 1
    assert value(b, "SELECT count(*) FROM backfill_status") == 0
    assert value(b, "SELECT count(*) FROM backfill_tables") == 0
    for table in ("backfill.job", "backfill.job_table"):
        assert error_of(b, f"SELECT * FROM {table}").sqlstate == "42501", table
    assert value(m, "SELECT count(*) FROM backfill_status WHERE id = %s", [backfill_id]) == 1
    assert value(m, "SELECT count(*) FROM backfill_tables WHERE backfill_id = %s", [backfill_id]) == 1
    assert [row[0] for row in a.execute("SELECT * FROM backfill_status").fetchall()] == [backfill_id]
    cursor, upper_bound = a.execute(
        "SELECT cursor, upper_bound FROM backfill_tables WHERE backfill_id = %s", [backfill_id]
    ).fetchone()
    assert cursor and upper_bound == ["2000"]


def test_pg_monitor_sees_counts_but_no_key_values_filters_or_errors_of_tables_it_may_not_read(db, roles, a_backfill):
    """A pg_monitor member without SELECT on the table saw its key values (cursor, upper bound),
    the filter and every error's text, which can hold personal data: it now sees the counts,
    rates and SQLSTATEs (as PostgreSQL's progress views show), and the values only once it may
    SELECT the table."""
    _, a, backfill_id = a_backfill
    monitor = roles.create("mon2")
    db.execute(f"GRANT pg_monitor TO {monitor}")
    m = roles.connect(monitor)
    db.execute(
        "INSERT INTO backfill.job_error (job_id, relid, table_name, stopped_after_key, sqlstate, message, detail) "
        "VALUES (%s, 't'::regclass, 'public.t', '[\"42\"]', '54000', 'the row with key (id)=(42) is too large', 'secret')",
        [backfill_id],
    )
    tables = "SELECT cursor, upper_bound, rows_done IS NOT NULL, rows_estimated IS NOT NULL FROM backfill_tables WHERE backfill_id = %s"
    errors = "SELECT stopped_after_key, message, detail, sqlstate FROM backfill_errors WHERE backfill_id = %s"
    db.execute("UPDATE backfill.job SET last_error = 'key (id)=(42)', last_error_sqlstate = '54000' WHERE id = %s", [backfill_id])
    status_sql = "SELECT rows_done IS NOT NULL, percent_done IS NOT NULL, last_error_sqlstate, last_error FROM backfill_status WHERE id = %s"
    assert m.execute(tables, [backfill_id]).fetchone() == (None, None, True, True)
    assert m.execute(errors, [backfill_id]).fetchone() == (None, None, None, "54000")
    assert m.execute(status_sql, [backfill_id]).fetchone() == (True, True, "54000", None)
    db.execute(f"GRANT SELECT ON t TO {monitor}")
    cursor, upper_bound, _, _ = m.execute(tables, [backfill_id]).fetchone()
    assert cursor and upper_bound == ["2000"]
    assert m.execute(errors, [backfill_id]).fetchone()[1:3] == ("the row with key (id)=(42) is too large", "secret")
    assert m.execute(status_sql, [backfill_id]).fetchone()[3] == "key (id)=(42)"


@pytest.mark.skipif(PG_MAJOR < 16, reason="grants WITH INHERIT FALSE, SET FALSE are new in PostgreSQL 16")
def test_a_member_that_may_neither_use_nor_become_a_role_does_not_act_as_it(db, roles, a_backfill):
    """16 separated membership from its powers: a role granted another WITH INHERIT FALSE, SET
    FALSE is its member (pg_has_role's MEMBER) yet has none of its privileges and may not SET
    ROLE to it. Such a member of A, and of pg_monitor, sees and controls A's backfill no more
    than a stranger does; granted SET (so it may become A), it controls it, as any member on 15."""
    role, _, backfill_id = a_backfill
    bare = roles.create("bare", "operator")
    db.execute(f"GRANT {role} TO {bare} WITH INHERIT FALSE, SET FALSE")
    db.execute(f"GRANT pg_monitor TO {bare} WITH INHERIT FALSE, SET FALSE")
    b = roles.connect(bare)
    assert value(b, "SELECT pg_has_role(%s, 'MEMBER')", [role]) is True
    assert value(b, "SELECT count(*) FROM backfill_status") == 0
    assert value(b, "SELECT count(*) FROM backfill_tables") == 0
    assert value(b, "SELECT backfill.workers_running(%s)", [backfill_id]) == 0
    assert error_of(b, "SELECT backfill_pause(%s)", [backfill_id]).sqlstate == "42501"
    db.execute(f"GRANT {role} TO {bare} WITH SET TRUE")
    assert value(b, "SELECT count(*) FROM backfill_status WHERE id = %s", [backfill_id]) == 1
    b.execute("SELECT backfill_pause(%s)", [backfill_id])
    assert status(db, backfill_id, "state") == "paused"


def test_a_role_that_may_no_longer_read_the_table_sees_none_of_its_progress(db, a_backfill):
    role, a, backfill_id = a_backfill
    of_table = "SELECT cursor, upper_bound, rows_done FROM backfill_tables WHERE backfill_id = %s"
    of_backfill = "SELECT rows_done, last_error FROM backfill_status WHERE id = %s"
    assert None not in a.execute(of_table, [backfill_id]).fetchone()
    assert a.execute(of_backfill, [backfill_id]).fetchone()[0] is not None
    db.execute(f"REVOKE SELECT ON t FROM {role}")
    assert a.execute(of_table, [backfill_id]).fetchone() == (None, None, None)
    assert a.execute(of_backfill, [backfill_id]).fetchone() == (None, None)


# --- 7. the worker cap -----------------------------------------------------------------------------

def test_max_workers_caps_the_workers_that_run_at_once(db):
    for name in ("a", "b", "c", "d"):
        make_table(db, name, 1000)

    samples = []

    def workers():
        samples.append(value(db, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_backfill'"))
        return samples[-1]

    wait_for(lambda: workers() == 0, what="the workers of earlier tests to exit")
    samples.clear()
    db.execute("LOAD 'pg_backfill'")
    db.execute("ALTER SYSTEM SET backfill.max_workers = 2")
    try:
        db.execute("SELECT pg_reload_conf()")
        wait_for(lambda: value(db, "SHOW backfill.max_workers") == "2", what="the reload")
        running = [start(db, name, batch_size=5, rows_per_second=10) for name in ("a", "b")]
        wait_for(lambda: workers() == 2, what="two workers")
        e = error_of(db, "SELECT backfill_start('c', confirm => true)")
        assert e.sqlstate == "53400"
        assert "backfill.max_workers" in f"{e.diag.message_detail} {e.diag.message_hint}"
        assert e.diag.message_hint.startswith("Wait for a running backfill to end"), e.diag.message_hint
        for _ in range(5):
            workers()
            time.sleep(0.2)
        for backfill_id in running:
            db.execute("SELECT backfill_cancel(%s)", [backfill_id])
            assert wait_until_ended(db, backfill_id) == "cancelled"
        wait_for(lambda: workers() == 0, what="the cancelled workers to exit")
        e = error_of(db, "SELECT backfill_start('d', confirm => true, parallel => 3)")
        assert e.sqlstate == "53400"
        assert "can never" in e.diag.message_detail and "Wait" not in e.diag.message_hint, e.diag.message_hint
        assert workers() == 0
        assert max(samples) == 2, samples
    finally:
        db.execute("ALTER SYSTEM RESET backfill.max_workers")
        db.execute("SELECT pg_reload_conf()")


def test_a_request_for_more_workers_than_max_workers_allows_says_it_can_never_fit(db, roles):
    """parallel beyond backfill.max_workers (less the workers kept for superusers, for a role that
    is not one) can never start, however long one waits: the 53400 error says so and names the
    setting, instead of "wait for a backfill to finish"."""
    make_table(db, "a", 100)
    e = error_of(db, "SELECT backfill_start('a', confirm => true, parallel => 5)")
    assert e.sqlstate == "53400", e
    assert "can never" in e.diag.message_detail and "backfill.max_workers (4)" in e.diag.message_detail, e.diag.message_detail
    assert "parallel => 4" in e.diag.message_hint and "Wait" not in e.diag.message_hint, e.diag.message_hint
    operator = roles.create("many", "operator")
    db.execute(f"GRANT SELECT, UPDATE ON a TO {operator}")
    e = error_of(roles.connect(operator), "SELECT backfill_start('a', confirm => true, parallel => 4)")
    assert e.sqlstate == "53400", e
    assert "can never" in e.diag.message_detail and "backfill.superuser_reserved_workers (1)" in e.diag.message_detail, e
    assert "parallel => 3" in e.diag.message_hint and "Wait" not in e.diag.message_hint, e.diag.message_hint


def test_max_workers_counts_a_worker_that_is_still_starting(db, cluster):
    """A worker counts from the moment it is visible, before it is admitted: here one waits for
    its per-worker lock, which another session holds. (Counting only admitted workers let a
    third backfill_start through while the second's worker was starting: seen once in CI.)"""
    for name in ("a", "b", "c"):
        make_table(db, name, 1000)

    def workers():
        return value(db, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_backfill'")

    wait_for(lambda: workers() == 0, what="the workers of earlier tests to exit")
    db.execute("LOAD 'pg_backfill'")
    db.execute("ALTER SYSTEM SET backfill.max_workers = 2")
    blocker = cluster.connect(db.info.dbname)
    try:
        db.execute("SELECT pg_reload_conf()")
        wait_for(lambda: value(db, "SHOW backfill.max_workers") == "2", what="the reload")
        running = start(db, "a", batch_size=5, rows_per_second=10)
        wait_for(lambda: workers() == 1, what="the first worker")
        # The next backfill's first worker takes this lock before it is admitted.
        blocker.execute("SELECT pg_advisory_lock(hashtext('pg_backfill.worker'), %s)", [running + 1])
        starting = start(db, "b", batch_size=5, rows_per_second=10)
        assert starting == running + 1
        wait_for(lambda: workers() == 2, what="the second worker, held before its admission")
        # (A worker shows in pg_stat_activity a moment before it names itself.)
        starting_name = "SELECT application_name FROM pg_stat_activity WHERE application_name ~ '^pg_backfill starting'"
        wait_for(lambda: db.execute(starting_name).fetchone() is not None, what="the second worker to name itself")
        assert value(db, starting_name) == f"pg_backfill starting {starting}"
        e = error_of(db, "SELECT backfill_start('c', confirm => true)")
        assert e.sqlstate == "53400", e
        assert "2 backfill worker(s)" in e.diag.message_detail
        blocker.execute("SELECT pg_advisory_unlock_all()")
        admitted = f"pg_backfill {starting}"
        wait_for(
            lambda: value(db, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [admitted]) == 1,
            what="the second worker to be admitted",
        )
        for backfill_id in (running, starting):
            db.execute("SELECT backfill_cancel(%s)", [backfill_id])
            assert wait_until_ended(db, backfill_id) == "cancelled"
    finally:
        blocker.close()
        db.execute("ALTER SYSTEM RESET backfill.max_workers")
        db.execute("SELECT pg_reload_conf()")


def test_an_operator_cannot_take_the_workers_kept_for_superusers(db, roles):
    """backfill.superuser_reserved_workers (1 by default) of backfill.max_workers are kept for
    superusers, as superuser_reserved_connections keeps connections: an operator's slow
    backfills (or a loop of starts) cannot refuse everyone else, and a superuser can always
    start one, a repair say, while the operator's run."""
    for name in ("a", "b", "c"):
        make_table(db, name, 1000)

    def workers():
        return value(db, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_backfill'")

    wait_for(lambda: workers() == 0, what="the workers of earlier tests to exit")
    operator = roles.create("operator", "operator")
    db.execute(f"GRANT SELECT, UPDATE ON a, b, c TO {operator}")
    conn = roles.connect(operator)
    db.execute("LOAD 'pg_backfill'")
    db.execute("ALTER SYSTEM SET backfill.max_workers = 2")
    try:
        db.execute("SELECT pg_reload_conf()")
        wait_for(lambda: value(db, "SHOW backfill.max_workers") == "2", what="the reload")
        first = start(conn, "a", batch_size=5, rows_per_second=10)
        wait_for(lambda: workers() == 1, what="the operator's worker")
        e = error_of(conn, "SELECT backfill_start('b', confirm => true, rows_per_second => 10)")
        assert e.sqlstate == "53400" and "not a superuser" in e.diag.message_primary, e
        assert "superuser_reserved_workers" in e.diag.message_detail
        kept = start(db, "c", batch_size=5, rows_per_second=10)  # the superuser's, in the kept worker
        wait_for(lambda: workers() == 2, what="the superuser's worker")
        for backfill_id in (first, kept):
            db.execute("SELECT backfill_cancel(%s)", [backfill_id])
            assert wait_until_ended(db, backfill_id) == "cancelled"
    finally:
        db.execute("ALTER SYSTEM RESET backfill.max_workers")
        db.execute("SELECT pg_reload_conf()")


# --- 8. hints quote names ----------------------------------------------------------------------

WEIRD = "x'); DROP TABLE victim; --"


@pytest.fixture
def weird(db):
    """A table named to break a hint that splices its name in unquoted, and a victim table."""
    db.execute(
        f"""CREATE TABLE victim (id int);
            CREATE TABLE "{WEIRD}" (id int PRIMARY KEY);
            INSERT INTO "{WEIRD}" SELECT generate_series(1, 10);"""
    )
    return f'"{WEIRD}"'


def test_the_confirm_hint_runs_as_shown_whatever_the_table_is_called(db, weird):
    e = error_of(db, "SELECT backfill_start(%s::regclass)", [weird])
    assert e.sqlstate == "22023"
    statement = hint_statement(e)
    assert "backfill_start(" in statement and "confirm => true" in statement
    backfill_id = value(db, statement)
    assert isinstance(backfill_id, int)
    assert value(db, "SELECT tables = ARRAY[%s::regclass] FROM backfill_status WHERE id = %s", [weird, backfill_id])
    assert value(db, "SELECT to_regclass('victim') IS NOT NULL")
    assert wait_until_ended(db, backfill_id) == "done"


def test_the_missing_slot_hint_passes_the_slot_name_as_one_literal(db, roles, weird):
    # A valid name: the hint's statement creates exactly that slot.
    slot = f"no_such_{roles.suffix}"
    e = error_of(db, "SELECT backfill_start(%s::regclass, confirm => true, slot => %s)", [weird, slot])
    assert e.sqlstate == "42704"
    statement = hint_statement(e)
    assert "pg_create_logical_replication_slot(" in statement
    db.execute(statement)
    assert value(db, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", [slot]) == 1
    # A name with a quote (PostgreSQL refuses it as a slot name): the statement is still one
    # call, whose refusal names the slot exactly as given — not a syntax error, not an injection.
    e = error_of(db, "SELECT backfill_start(%s::regclass, confirm => true, slot => %s)", [weird, "no'such"])
    assert e.sqlstate == "42704"
    statement = hint_statement(e)
    assert "pg_create_logical_replication_slot(" in statement
    refused = error_of(db, statement)
    assert refused.sqlstate == "42602" and "\"no'such\"" in refused.diag.message_primary
    assert value(db, "SELECT to_regclass('victim') IS NOT NULL")


# --- 9. the message prefix -----------------------------------------------------------------------

def test_message_prefix_must_be_1_to_64_printable_bytes(db):
    make_table(db, "t", 10)
    db.execute("LOAD 'pg_backfill'")  # the setting is checked, not taken as a placeholder
    for prefix in ("", "a\nb", "p" * 65):
        db.execute("RESET backfill.message_prefix")
        with pytest.raises(psycopg.Error) as refused:  # by SET, or else by backfill_start
            db.execute("SELECT set_config('backfill.message_prefix', %s, false)", [prefix])
            start(db, "t")
        assert refused.value.sqlstate == "22023", repr(prefix)
    assert value(db, "SELECT count(*) FROM backfill.job") == 0
    prefix = "pfx-" + "x" * 60
    db.execute("SELECT set_config('backfill.message_prefix', %s, false)", [prefix])
    backfill_id = start(db, "t")
    assert wait_until_ended(db, backfill_id) == "done"
    assert status(db, backfill_id, "message_prefix") == prefix


# The settings a start records for the life of its backfill, and what each does to it if another
# role chose it: the reads under a prefix the consumer does not read, pages that lock the whole
# table, batches a consumer may not parse, pages unpaced on a shared primary.
RECORDED_SETTINGS = [("backfill.message_prefix", "elsewhere"), ("backfill.lock_mode", "table"),
                     ("backfill.rows_per_message", "50"), ("backfill.default_max_active_sessions", "0")]


def test_a_database_owner_cannot_choose_the_settings_a_superusers_start_records(cluster, roles, scratch_database):
    """The owner of a database (no superuser, no grant) could set them for its database (ALTER
    DATABASE ... SET, or for a role of its own), and a superuser's plain backfill_start there
    took them. They are superuser settings now: the owner's ALTER DATABASE, ALTER ROLE and SET
    are refused (42501), and the superuser's start records the server's values."""
    owner = roles.create("dbowner")
    name = scratch_database(f"owned_settings_{roles.suffix}", f"OWNER {owner}")
    with cluster.connect(name) as su:
        su.execute("CREATE EXTENSION pg_backfill")
        make_table(su, "t", 20)
    with psycopg.connect(host="127.0.0.1", port=cluster.port, user=owner, dbname=name, autocommit=True) as conn:
        conn.execute("SELECT * FROM backfill_status")  # loads the library: its settings are defined, not placeholders
        assert value(conn, "SELECT count(*) FROM pg_settings WHERE name = 'backfill.message_prefix'") == 1
        for setting, chosen in RECORDED_SETTINGS:
            for statement in (f"ALTER DATABASE {name} SET {setting} = '{chosen}'",
                              f"ALTER ROLE {owner} IN DATABASE {name} SET {setting} = '{chosen}'",
                              f"SET {setting} = '{chosen}'"):
                refused = error_of(conn, statement)
                assert refused.sqlstate == "42501" and setting in refused.diag.message_primary, statement
    with cluster.connect(name) as su:
        assert value(su, "SELECT count(*) FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase "
                         "WHERE d.datname = %s", [name]) == 0
        backfill_id = start(su, "t")
        assert wait_until_ended(su, backfill_id) == "done"
        recorded = status(su, backfill_id, "message_prefix", "lock_mode", "rows_per_message", "max_active_sessions")
        assert recorded == ("backfill", "auto", 1, None)  # (the test cluster's default_max_active_sessions is 0)


def test_a_role_granted_set_on_a_recorded_setting_sets_it_for_its_backfills(db, operator):
    """The DBA trusts an operator with a setting the PostgreSQL way: GRANT SET ON PARAMETER."""
    role, conn = operator
    conn.execute("SELECT * FROM backfill_status")  # loads the library: its settings are defined, not placeholders
    refused = error_of(conn, "SET backfill.message_prefix = 'etl_reads'")
    assert refused.sqlstate == "42501"
    db.execute(f"GRANT SET ON PARAMETER backfill.message_prefix, backfill.lock_mode TO {role}")
    try:
        conn.execute("SET backfill.message_prefix = 'etl_reads'")
        conn.execute("SET backfill.lock_mode = 'rows'")
        backfill_id = start(conn, "t")
        assert wait_until_ended(db, backfill_id) == "done"
        assert status(db, backfill_id, "message_prefix", "lock_mode") == ("etl_reads", "rows")
    finally:
        db.execute(f"REVOKE SET ON PARAMETER backfill.message_prefix, backfill.lock_mode FROM {role}")


# --- 10. authenticated messages ------------------------------------------------------------------

AUTH = re.compile(r',"auth":"(\d+):([0-9a-f]{64})"\}$')


def decoded(conn, slot):
    """(xid, content) of each backfill message the test_decoding slot decodes, in order."""
    rows = conn.execute("SELECT data FROM pg_logical_slot_get_changes(%s, NULL, NULL, 'include-xids', '1')", [slot])
    return messages_with_xids(data for (data,) in rows.fetchall())


def message_keys(db) -> dict:
    return dict(db.execute("SELECT id, key FROM backfill.message_key").fetchall())


def readme_verifier():
    """The Python check (`genuine`) of docs/consumers.md, run as printed there."""
    text = (ROOT / "docs/consumers.md").read_text()
    heading = "\n## Authenticated messages\n"
    assert text.count(heading) == 1, f"docs/consumers.md must have the heading {heading.strip()} exactly once"
    section = text[text.index(heading) :]
    code = re.search(r"```python\n(.*?)\n```", section, re.S)[1]
    namespace = {}
    exec(code, namespace)
    return namespace["genuine"]


def tag_is_valid(keys, content, xid) -> bool:
    """The check, done here independently: HMAC-SHA256(key, "<xid>:" + content without its auth
    field); the code of docs/consumers.md must give the same answer."""
    auth = AUTH.search(content)
    if not auth or int(auth[1]) not in keys:
        independent = False
    else:
        raw = content.encode()
        body = raw[: raw.rindex(b',"auth":"')] + b"}"
        expected = hmac.new(bytes(keys[int(auth[1])]), f"{xid}:".encode() + body, hashlib.sha256).hexdigest()
        independent = hmac.compare_digest(expected, auth[2])
    readme = readme_verifier()(content.encode(), xid, {k: bytes(v) for k, v in keys.items()})
    assert readme == independent, "the verification of docs/consumers.md disagrees"
    return independent


def sql_valid(conn, content, xid) -> bool:
    return value(conn, "SELECT backfill_message_valid(%s::text, %s::bigint)", [content, xid])


@pytest.fixture
def signed(db, roles):
    """A backfill of t (50 rows, pages of 10) decoded through a test_decoding slot: (slot, messages)."""
    make_table(db, "t", 50)
    slot = f"td_{roles.suffix}"
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", [slot])
    assert wait_until_ended(db, start(db, "t", batch_size=10)) == "done"
    return slot, decoded(db, slot)


def test_every_message_carries_a_valid_tag_and_forgeries_do_not_verify(db, roles, signed):
    slot, messages = signed
    assert len(messages) == 52  # table_start, 50 reads, table_end
    assert len({xid for xid, _ in messages}) > 2, "pages are transactions of their own"
    key_id, key = db.execute("SELECT key_id, key FROM backfill_key()").fetchone()
    keys = message_keys(db)
    assert bytes(keys[key_id]) == bytes(key)
    for xid, content in messages:
        assert list(json.loads(content))[-1] == "auth" and AUTH.search(content), content
        assert json.loads(content)["auth"].startswith(f"{key_id}:")
        assert sql_valid(db, content, xid) is True and tag_is_valid(keys, content, xid), content

    plain = roles.connect(roles.create("plain"))
    forged = (
        '{"op":"read","backfill_id":1,"schema":"public","table":"t","key":{"id":1},'
        f'"data":{{"id":1,"label":"forged"}},"commit_lsn":"0/0","auth":"{key_id}:{"0" * 64}"}}'
    )
    plain.execute("SELECT pg_logical_emit_message(true, 'backfill', %s::text)", [forged])
    [(forged_xid, decoded_forgery)] = decoded(db, slot)
    assert decoded_forgery == forged
    genuine_xid, genuine = next((xid, c) for xid, c in messages if '"op":"read"' in c)
    tampered = genuine.replace('"label":"row ', '"label":"rov ', 1)
    other_key = genuine.replace(f'"auth":"{key_id}:', f'"auth":"{key_id + 1}:', 1)
    assert tampered != genuine and other_key != genuine
    for what, content, xid in [
        ("forged", forged, forged_xid),
        ("tampered", tampered, genuine_xid),
        ("replayed in another transaction", genuine, forged_xid),
        ("key id edited", other_key, genuine_xid),
    ]:
        assert sql_valid(db, content, xid) is False, what
        assert not tag_is_valid(keys, content, xid), what


def test_after_a_key_rotation_old_messages_still_verify_and_new_ones_use_the_new_key(db, signed):
    slot, old = signed
    old_key = value(db, "SELECT key_id FROM backfill_key()")
    new_key = value(db, "SELECT backfill_rotate_key()")
    assert new_key != old_key and value(db, "SELECT key_id FROM backfill_key()") == new_key
    assert old and all(sql_valid(db, content, xid) for xid, content in old)
    assert wait_until_ended(db, start(db, "t", batch_size=10)) == "done"
    new = decoded(db, slot)
    keys = message_keys(db)
    assert len(new) == 52
    for xid, content in new:
        assert json.loads(content)["auth"].startswith(f"{new_key}:"), content
        assert sql_valid(db, content, xid) is True and tag_is_valid(keys, content, xid), content
    xid, content = old[1]
    moved = content.replace(f'"auth":"{old_key}:', f'"auth":"{new_key}:', 1)
    assert moved != content and sql_valid(db, moved, xid) is False


def test_retiring_old_keys_makes_what_they_signed_fail(db, signed):
    _, old = signed
    assert old and all(sql_valid(db, content, xid) for xid, content in old)
    new_key = value(db, "SELECT backfill_rotate_key(retire_old_keys => true)")
    assert [key_id for key_id, in db.execute("SELECT id FROM backfill.message_key")] == [new_key]
    assert not any(sql_valid(db, content, xid) for xid, content in old)


PEEKED_VALIDITY = """SELECT count(*), count(*) FILTER (WHERE backfill_message_valid(substring(data from 'content:(.*)'), xid)),
                          count(*) FILTER (WHERE backfill_message_valid(substring(data from 'content:(.*)'),
                                                                        (xid::text::bigint + 1)::text::xid))
                     FROM pg_logical_slot_peek_changes(%s, NULL, NULL)
                    WHERE data LIKE 'message: transactional: 1 prefix: backfill,%%'"""


def test_a_message_verifies_with_the_xid_a_peek_reports_as_it_is(db, roles, signed):
    """The xid column of pg_logical_slot_peek_changes() is of type xid, which has no cast to
    bigint: backfill_message_valid(content, xid) takes it as it is, for a consumer granted as
    docs/security.md says (the grant of the bigint form: the xid form calls it), and a message
    checked against another transaction's xid fails. A role without the grant gets 42501."""
    slot, messages = signed
    make_table(db, "more", 30)
    assert wait_until_ended(db, start(db, "more", batch_size=10)) == "done"
    assert value(db, "SELECT pg_typeof(xid)::text FROM pg_logical_slot_peek_changes(%s, NULL, NULL) LIMIT 1",
                 [slot]) == "xid"
    assert db.execute(PEEKED_VALIDITY, [slot]).fetchone() == (32, 32, 0)
    consumer = roles.connect(roles.create("xid_consumer", "consumer"))
    xid, content = messages[1]
    assert value(consumer, "SELECT backfill_message_valid(%s::text, %s::text::xid)", [content, xid]) is True
    assert value(consumer, "SELECT backfill_message_valid(%s::text, %s::bigint)", [content, xid]) is True
    assert error_of(roles.connect(roles.create("xid_nokey")),
                    "SELECT backfill_message_valid(%s::text, %s::text::xid)", [content, xid]).sqlstate == "42501"


def test_consumer_grants_allow_reading_the_key_and_verifying_and_nothing_less_does(db, roles, signed):
    _, messages = signed
    xid, content = messages[1]
    consumer = roles.connect(roles.create("consumer", "consumer"))
    assert consumer.execute("SELECT key_id, key FROM backfill_key()").fetchone() == db.execute(
        "SELECT key_id, key FROM backfill_key()"
    ).fetchone()
    assert sql_valid(consumer, content, xid) is True
    assert error_of(consumer, "SELECT backfill_rotate_key()").sqlstate == "42501"
    other = roles.connect(roles.create("nokey"))
    for sql, params in [
        ("SELECT * FROM backfill_key()", None),
        ("SELECT backfill_message_valid(%s::text, %s::bigint)", [content, xid]),
        ("SELECT * FROM backfill.message_key", None),
    ]:
        assert error_of(other, sql, params).sqlstate == "42501", sql


def test_security_check_flags_emit_message_for_public_until_revoked(db):
    check = "SELECT ok, fix FROM backfill_security_check() WHERE item ILIKE '%pg_logical_emit_message%'"
    # (17 added an argument, flush, with a default.)
    signature = "boolean,text,text" if PG_MAJOR < 17 else "boolean,text,text,boolean"
    public_may_emit = f"SELECT has_function_privilege('public', 'pg_logical_emit_message({signature})', 'EXECUTE')"
    assert value(db, public_may_emit) is True  # PostgreSQL's default
    [(ok, fix)] = db.execute(check).fetchall()
    assert ok is False and "REVOKE EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message" in fix
    statement = fix[fix.index("REVOKE") :]
    db.execute(statement[: statement.rindex(";") + 1] if ";" in statement else statement)
    assert value(db, public_may_emit) is False
    [(ok, _)] = db.execute(check).fetchall()
    assert ok is True



def test_security_check_fix_for_public_starts_revokes_the_start_alone_and_the_views_keep_working(db, roles):
    """Issue 35, point 12: its fix once revoked every function of schema backfill from PUBLIC,
    the views' helpers with them, so that a role's SELECT of backfill_status failed after it."""
    check = "SELECT ok, fix FROM backfill_security_check() WHERE item = 'backfills cannot be started by PUBLIC'"
    assert db.execute(check).fetchone()[0] is True
    db.execute("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA backfill TO PUBLIC")
    [(ok, fix)] = db.execute(check).fetchall()
    assert ok is False and fix.startswith("REVOKE EXECUTE ON FUNCTION backfill.start(")
    db.execute(fix)
    assert db.execute(check).fetchone()[0] is True
    viewer = roles.connect(roles.create("viewer"))
    assert viewer.execute("SELECT count(*) FROM backfill_status").fetchone()[0] == 0
    assert viewer.execute("SELECT count(*) FROM backfill_tables").fetchone()[0] == 0

# --- 10b. the message keys reach no decoded stream (issue 31, finding 15) ----------------------

def key_forms(key: bytes) -> list:
    """Every form in which a key's bytes could show in a decoded change, as bytes: raw, hex
    (either case, as bytea's output and JSON carry it), base64, bytea's escape format, and its
    four 8-byte parts as the bigints of the sequences that hold them."""
    escaped = "".join("\\\\" if b == 0x5C else chr(b) if 0x20 <= b < 0x7F else f"\\{b:03o}" for b in key)
    parts = [str(int.from_bytes(key[i : i + 8], "big", signed=True)) for i in range(0, len(key), 8)]
    return [key, key.hex().encode(), key.hex().upper().encode(), base64.b64encode(key), escaped.encode(),
            *(part.encode() for part in parts)]


DECODERS = {"td": "test_decoding", "w2j": "wal2json", "po": "pgoutput"}


def make_decoding_slots(conn, suffix):
    """A test_decoding, a wal2json and a pgoutput slot (for a FOR ALL TABLES publication): their names by decoder."""
    conn.execute("CREATE PUBLICATION every_table FOR ALL TABLES")
    slots = {}
    for short, plugin in DECODERS.items():
        slots[short] = f"{short}_{suffix}"
        conn.execute("SELECT pg_create_logical_replication_slot(%s, %s)", [slots[short], plugin])
    return slots


def decoded_changes(conn, slots) -> dict:
    """Every change each slot decodes (consumed), as bytes, by decoder."""
    options = {
        "td": "'include-xids', '1'",
        "w2j": "'format-version', '2'",
        "po": "'proto_version', '1', 'publication_names', 'every_table', 'messages', 'true'",
    }
    return {short: [bytes(data) for data, in conn.execute(
                f"SELECT data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, {options[short]})", [slot]).fetchall()]
            for short, slot in slots.items()}


def assert_no_key_in(changes: dict, keys: dict):
    """No decoded change holds a key's bytes in any form, nor is a change of a table
    backfill.message_key (the keys' table before 0.10.0); each decoder did decode pg_backfill's
    state tables (the key's row among them), or this would prove nothing."""
    for short, datas in changes.items():
        for key_id, key in keys.items():
            for form in key_forms(bytes(key)):
                leaks = [d for d in datas if form in d]
                assert leaks == [], f"{DECODERS[short]} decoded key {key_id} as {form!r}: {leaks[0][:300]!r}"
    of_key_table = {
        "td": lambda d: d.startswith(b"table backfill.message_key:"),
        "w2j": lambda d: b'"schema":"backfill","table":"message_key"' in d,
        "po": lambda d: d.startswith(b"R") and b"backfill\x00message_key\x00" in d,
    }
    of_store = {
        "td": lambda d: d.startswith(b"table backfill.message_key_store: INSERT"),
        "w2j": lambda d: b'"schema":"backfill","table":"message_key_store"' in d,
        "po": lambda d: d.startswith(b"R") and b"backfill\x00message_key_store\x00" in d,
    }
    for short, datas in changes.items():
        assert not any(of_key_table[short](d) for d in datas), f"{DECODERS[short]} decoded table backfill.message_key"
        assert any(of_store[short](d) for d in datas), f"{DECODERS[short]} decoded no key's row: the test proves nothing"


def all_keys(conn) -> dict:
    return {key_id: bytes(key) for key_id, key in conn.execute("SELECT id, key FROM backfill.message_key").fetchall()}


def test_no_decoder_receives_a_message_key_at_install_rotation_or_update(db, roles, cluster):
    """Issue 31, finding 15: test_decoding and wal2json slots decode every table, pg_backfill's own
    too, and so does pgoutput for a FOR ALL TABLES publication: they carried each key in plain text
    (after backfill_rotate_key(), wal2json: {"action":"I","schema":"backfill","table":"message_key",...}).
    The keys are now in sequences, which no decoder decodes: at CREATE EXTENSION, at two rotations
    (one retiring the old keys), and at ALTER EXTENSION UPDATE from 0.9.0, no decoded change holds
    a key; signed messages still verify; the consumer grant reads the keys, nothing less does; and
    pg_dump writes none."""
    db.execute("DROP EXTENSION pg_backfill")
    slots = make_decoding_slots(db, roles.suffix)
    db.execute("CREATE EXTENSION pg_backfill")
    seen = all_keys(db)
    make_table(db, "t", 30)
    db.execute("SELECT backfill_rotate_key()")
    seen |= all_keys(db)
    assert wait_until_ended(db, start(db, "t", batch_size=10)) == "done"
    db.execute("SELECT backfill_rotate_key(retire_old_keys => true)")
    seen |= all_keys(db)
    assert len(seen) == 3
    changes = decoded_changes(db, slots)
    assert_no_key_in(changes, seen)
    # A retired key's sequences are gone with it.
    assert value(db, r"SELECT count(*) FROM pg_class WHERE relkind = 'S' AND relname ~ '^message_key_\d+_\d+$'") == 4
    # The backfill's messages, signed with the second key, verify.
    signed = messages_with_xids(d.decode() for d in changes["td"])
    assert len(signed) == 32 and all(json.loads(c)["auth"].startswith("2:") for _, c in signed)
    assert all(tag_is_valid(seen, content, xid) for xid, content in signed)
    assert not any(sql_valid(db, content, xid) for xid, content in signed), "the second key was retired"

    # 0.9.0 kept its keys in a table (its CREATE EXTENSION is decoded before these slots exist):
    # the update moves them out under the same ids and the consumer's grant carries over.
    db.execute("DROP EXTENSION pg_backfill")
    db.execute("DROP PUBLICATION every_table")
    for slot in slots.values():
        db.execute("SELECT pg_drop_replication_slot(%s)", [slot])
    db.execute("CREATE EXTENSION pg_backfill VERSION '0.9.0'")
    consumer, nokey = roles.create("consumer", "consumer"), roles.create("nokey")
    db.execute("SELECT backfill_rotate_key()")
    old = all_keys(db)
    assert wait_until_ended(db, start(db, "t", batch_size=10)) == "done"
    slots = make_decoding_slots(db, roles.suffix)
    db.execute("ALTER EXTENSION pg_backfill UPDATE")
    assert all_keys(db) == old
    db.execute("SELECT backfill_rotate_key()")
    seen = all_keys(db)
    assert len(seen) == 3 and seen.items() >= old.items()
    assert wait_until_ended(db, start(db, "t", batch_size=10)) == "done"
    changes = decoded_changes(db, slots)
    assert_no_key_in(changes, seen)
    signed = messages_with_xids(d.decode() for d in changes["td"])
    assert len(signed) == 32 and all(json.loads(c)["auth"].startswith("3:") for _, c in signed)
    as_consumer = roles.connect(consumer)
    assert all(sql_valid(as_consumer, content, xid) and tag_is_valid(seen, content, xid) for xid, content in signed)
    assert all_keys(as_consumer) == seen
    assert as_consumer.execute("SELECT key_id, key FROM backfill_key()").fetchone() == (3, seen[3])
    as_nokey = roles.connect(nokey)
    xid, content = signed[0]
    for sql, params in [
        ("SELECT * FROM backfill_key()", None),
        ("SELECT backfill_message_valid(%s::text, %s::bigint)", [content, xid]),
        ("SELECT * FROM backfill.message_key", None),
        ("SELECT backfill.message_key_bytes(3)", None),
        ("SELECT last_value FROM backfill.message_key_3_1", None),
    ]:
        assert error_of(as_nokey, sql, params).sqlstate == "42501", sql
    assert as_nokey.execute("SELECT count(last_value) FROM pg_sequences WHERE schemaname = 'backfill'").fetchone()[0] == 0

    # pg_dump writes no key: neither its sequences nor the view's rows.
    dump = subprocess.run(["sudo", "-u", "postgres", f"{PG_BIN}/pg_dump", "-h", "127.0.0.1", "-p", str(cluster.port),
                           "-d", db.info.dbname], check=True, capture_output=True).stdout
    assert b"message_key_" not in dump
    assert [form for key in seen.values() for form in key_forms(key) if form in dump] == []


def test_security_check_flags_privileges_on_the_key_sequences(db, roles):
    check = "SELECT ok, fix FROM backfill_security_check() WHERE item ILIKE '%sequences%'"
    assert db.execute(check).fetchall() == [(True, None)]
    reader = roles.create("reader")
    db.execute(f"GRANT SELECT ON ALL SEQUENCES IN SCHEMA backfill TO {reader}")
    assert roles.connect(reader).execute("SELECT last_value IS NOT NULL FROM backfill.message_key_1_1").fetchone()[0]
    [(ok, fix)] = db.execute(check).fetchall()
    assert ok is False and f"FROM {reader};" in fix and "retire_old_keys => true" in fix
    db.execute(fix)
    assert db.execute(check).fetchall() == [(True, None)]
    assert error_of(roles.connect(reader), "SELECT last_value FROM backfill.message_key_2_1").sqlstate == "42501"


def test_a_key_retired_while_it_is_read_is_read_again(cluster, db, roles):
    """A rotation that retires keys drops their sequences. A reader whose snapshot still holds the
    old key waits for that rotation, then is told to read again (40001), never an internal error;
    the worker, which reads the key at every page, retries its page, signs with the new key and
    finishes."""
    make_table(db, "t", 40)
    slot = f"td_{roles.suffix}"
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", [slot])
    consumer = roles.connect(roles.create("consumer", "consumer"))
    old_parts = [oid for oid, in db.execute("SELECT unnest(key_sequences) FROM backfill.message_key_store")]
    waiting_on_old_key = (
        "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted AND relation = ANY(%s::oid[])"
    )

    def read_old_key(result):
        try:
            consumer.execute("SELECT key FROM backfill.message_key WHERE id = 1").fetchall()
        except psycopg.Error as e:
            result.append(e)

    for reader in ("consumer", "worker"):
        with cluster.connect(db.info.dbname) as rotation:
            rotation.execute("BEGIN")
            rotation.execute("SELECT backfill_rotate_key(retire_old_keys => true)")
            if reader == "consumer":
                result = []
                thread = threading.Thread(target=read_old_key, args=(result,))
                thread.start()
                pid = consumer.info.backend_pid
            else:
                backfill_id = start(db, "t", batch_size=5)
                pid = wait_for(lambda: worker_pid(db, backfill_id), what="the worker")
            wait_for(lambda: value(db, waiting_on_old_key, [pid, old_parts]) == 1, what=f"the {reader} to wait for the rotation")
            rotation.execute("COMMIT")
        if reader == "consumer":
            thread.join(10)
            [error] = result
            assert error.sqlstate == "40001" and "message key 1 was retired" in error.diag.message_primary, error
        else:
            assert wait_until_ended(db, backfill_id) == "done", status(db, backfill_id, "last_error")
        old_parts = [oid for oid, in db.execute("SELECT unnest(key_sequences) FROM backfill.message_key_store")]
    # The worker signed every message with the key made while it waited.
    messages = decoded(db, slot)
    keys = all_keys(db)
    assert len(messages) == 42 and list(keys) == [3]
    assert all(json.loads(c)["auth"].startswith("3:") and sql_valid(consumer, c, xid) for xid, c in messages)


@pytest.mark.cluster
def test_the_keys_verify_on_a_standby_and_after_its_promotion(cluster, db, roles):
    """The keys live in sequences, WAL-logged: a physical standby has them, verifies what the
    primary signed, and still does once promoted by a failover."""
    make_table(db, "t", 20)
    slot = f"td_{roles.suffix}"
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", [slot])
    assert wait_until_ended(db, start(db, "t", batch_size=10)) == "done"
    db.execute("SELECT backfill_rotate_key()")
    assert wait_until_ended(db, start(db, "t", batch_size=10)) == "done"
    signed = decoded(db, slot)
    keys = all_keys(db)
    assert sorted({json.loads(c)["auth"].split(":")[0] for _, c in signed}) == ["1", "2"]
    standby = extra_cluster(cluster, "key_standby")
    subprocess.run(["bash", "-c", f"rm -rf '{standby.dir}' && mkdir -p '{standby.dir}' && chown postgres: '{standby.dir}'"], check=True)
    subprocess.run(
        ["sudo", "-u", "postgres", f"{PG_BIN}/pg_basebackup", "-h", "127.0.0.1", "-p", str(cluster.port),
         "-U", "postgres", "-D", f"{standby.dir}/data", "-R", "-X", "stream", "-c", "fast"],
        check=True, capture_output=True,
    )
    with open(f"{standby.dir}/data/postgresql.auto.conf", "a") as conf:
        conf.write(f"port = {standby.port}\nunix_socket_directories = '{standby.dir}'\n")
    standby.pg_ctl("start")
    try:
        # A key made after the base backup reaches the standby through WAL.
        db.execute("SELECT backfill_rotate_key()")
        keys = all_keys(db)
        target = value(db, "SELECT pg_current_wal_lsn()")
        with standby.connect(db.info.dbname) as conn:
            wait_for(lambda: conn.execute("SELECT pg_last_wal_replay_lsn() >= %s", [target]).fetchone()[0],
                     what="the standby to replay")
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]
            assert all_keys(conn) == keys and len(keys) == 3
            assert all(sql_valid(conn, content, xid) for xid, content in signed)
        standby.pg_ctl("promote", "-w")
        with standby.connect(db.info.dbname) as conn:
            assert not conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]
            assert all_keys(conn) == keys
            assert all(sql_valid(conn, content, xid) for xid, content in signed)
            assert conn.execute("SELECT key_id, key FROM backfill_key()").fetchone() == (3, keys[3])
            # The promoted server makes keys of its own after those it replayed (an id further on:
            # a sequence's nextval is WAL-logged ahead).
            new_key = value(conn, "SELECT backfill_rotate_key()")
            assert new_key > 3 and conn.execute("SELECT key_id FROM backfill_key()").fetchone()[0] == new_key
    finally:
        standby.stop()


# --- found by a hostile review: the worker's own connection, the resumer, pg_temp types ---------

TRAP = """CREATE FUNCTION {schema}.{name}({args}) RETURNS {returns} LANGUAGE plpgsql AS $$
BEGIN
    BEGIN EXECUTE 'ALTER ROLE {role} SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
    RETURN {body};
END $$"""


def test_a_database_owners_search_path_does_not_reach_the_worker(cluster, roles, scratch_database):
    """The worker connects as the bootstrap superuser with its database's settings: an owner's
    ALTER DATABASE ... SET search_path must not make the worker use the owner's operators."""
    atk = roles.create("dbowner")
    name = scratch_database("owned_by_attacker", f"OWNER {atk}")
    with cluster.connect(name) as su:
        su.execute("CREATE EXTENSION pg_backfill")
        su.execute(readme_grants("operator", atk))
    with psycopg.connect(host="127.0.0.1", port=cluster.port, user=atk, dbname=name, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA evil")
        conn.execute(TRAP.format(schema="evil", name="plus", args="a int, b int", returns="int", role=atk,
                                 body="a OPERATOR(pg_catalog.+) b"))
        conn.execute("CREATE OPERATOR evil.+ (LEFTARG = int, RIGHTARG = int, FUNCTION = evil.plus)")
        conn.execute(f"ALTER DATABASE {name} SET search_path = evil, pg_catalog, public")
        conn.execute("CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t SELECT generate_series(1, 100)")
    with psycopg.connect(host="127.0.0.1", port=cluster.port, user=atk, dbname=name, autocommit=True) as conn:
        assert conn.execute("SELECT 1 + 1").fetchone()[0] == 2  # the trap is in the path
        backfill_id = start(conn, "t")
        assert wait_until_ended(conn, backfill_id) == "done"
    with cluster.connect() as admin:
        assert not is_superuser(admin, atk)


def test_a_key_type_the_caller_shadows_in_pg_temp_is_not_used(db, roles):
    """Key types are schema-qualified: a domain the caller makes in pg_temp under the key type's
    name never stands in for it while the table's owner (here a superuser) runs the query."""
    atk = roles.create("shadow", "operator")
    db.execute(
        """CREATE DOMAIN qty AS int;
           CREATE TABLE moods (m qty PRIMARY KEY, n int);
           INSERT INTO moods SELECT g, 1 FROM generate_series(1, 1000) g;
           ANALYZE moods;"""
    )
    db.execute(f"GRANT SELECT, UPDATE ON moods TO {atk}; CREATE SCHEMA {atk} AUTHORIZATION {atk}")
    conn = roles.connect(atk)
    conn.execute(TRAP.format(schema=atk, name="shadow_check", args="v text", returns="boolean", role=atk,
                             body="true"))
    conn.execute(f"CREATE DOMAIN pg_temp.qty AS int CHECK ({atk}.shadow_check(VALUE::text))")
    # pg_temp last: public.qty stays visible to the caller, so an unqualified name would be
    # "qty", which under the owner's path (pg_catalog, pg_temp) is the caller's domain.
    conn.execute("SET search_path = public, pg_temp")
    backfill_id = start(conn, "moods", parallel=2)
    assert wait_until_ended(db, backfill_id) == "done"
    assert not is_superuser(db, atk)
    conn.execute("SELECT '1'::pg_temp.qty")  # the trap works when it is run: as the caller
    assert not is_superuser(db, atk)


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


def test_waiting_kind_answers_only_about_backfills_the_caller_sees(db, roles):
    """backfill.waiting_kind(), which the views call as the extension's owner: NULL for NULL, for
    an id that does not exist, for a backfill the caller may not see, and once it ended."""
    make_table(db, "t", 100)
    db.execute("SELECT pg_create_logical_replication_slot('away', 'test_decoding')")
    backfill_id = start(db, "t", slot="away")
    wait_for(lambda: value(db, "SELECT backfill.waiting_kind(%s)", [backfill_id]) == "consumer_away", what="the wait")
    assert value(db, "SELECT backfill.waiting_kind(NULL)") is None
    assert value(db, "SELECT backfill.waiting_kind(9223372036854775807)") is None
    stranger = roles.connect(roles.create("stranger"))
    assert value(stranger, "SELECT backfill.waiting_kind(%s)", [backfill_id]) is None
    assert value(stranger, "SELECT count(*) FROM backfill_status") == 0
    db.execute("SELECT backfill_cancel(%s)", [backfill_id])
    assert wait_until_ended(db, backfill_id) == "cancelled"
    assert value(db, "SELECT waiting_kind FROM backfill_status WHERE id = %s", [backfill_id]) is None


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


def test_rights_lost_mid_run_stop_a_backfill_without_a_filter(cluster, db, roles):
    """Row-level security enabled for the starter mid-run: the backfill went on delivering rows
    the starter could no longer see. REPLICATION revoked from the starter of a slot-bound
    backfill: it went on to done, while a new start was refused. Each now stops the backfill
    at its next page with 42501, as the start would refuse it."""
    operator = roles.create("op_rights", "operator")
    db.execute(f"ALTER ROLE {operator} REPLICATION")
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    db.execute("INSERT INTO t SELECT g, 'x' FROM generate_series(1, 5000) g")
    db.execute(f"GRANT SELECT, UPDATE ON t TO {operator}")
    db.execute("SELECT pg_create_logical_replication_slot('rights', 'test_decoding')")
    conn = roles.connect(operator)
    consumer = Consumer(cluster, db.info.dbname, "rights")
    try:
        for take_away, expect in (
            ("ALTER TABLE t ENABLE ROW LEVEL SECURITY", "row-level security now filters the rows of table public.t"),
            (f"ALTER ROLE {operator} NOREPLICATION", 'may no longer bind a backfill to replication slot "rights"'),
        ):
            backfill_id = conn.execute(
                "SELECT backfill_start('t', confirm => true, batch_size => 100, rows_per_second => 1000, slot => 'rights')"
            ).fetchone()[0]
            wait_for(lambda: status(db, backfill_id, "rows_done") >= 100, what="a page before the rights go")
            db.execute(take_away)
            assert wait_until_ended(db, backfill_id) == "failed", take_away
            assert status(db, backfill_id, "last_error_sqlstate") == "42501", take_away
            assert expect in status(db, backfill_id, "last_error"), status(db, backfill_id, "last_error")
            assert status(db, backfill_id, "rows_done") < 5000
            db.execute("ALTER TABLE t DISABLE ROW LEVEL SECURITY")
            db.execute(f"ALTER ROLE {operator} REPLICATION")
    finally:
        consumer.stop()


# --- a database owner's types, operators and functions on a superuser's path --------------------

# The types a database owner shadows with domains whose check is its code, and over which it plants
# operators, functions and aggregates of the same names and signatures as pg_catalog's, in public.
# With the database's search_path = public, pg_catalog, a name pg_backfill left unqualified in SQL
# it runs in the caller's session would resolve to the planted one (ordered as the server lists
# them, so that a run plants the same objects).
SHADOWED_SCALARS = ["text", "name", "oid", "int2", "int4", "int8", "bool", "jsonb", "json", "numeric", "float4",
                    "float8", "timestamptz", "interval", "pg_lsn", "tid", "xid", "char", "bytea", "date", "regclass",
                    "regtype", "regnamespace", "regproc", "regprocedure"]
SHADOWED_ARRAYS = ["text", "name", "oid", "int2", "int4", "int8", "jsonb", "tid"]  # of these elements
POLYMORPHIC_ELEMENT = {"anyelement", "anynonarray", "anycompatible", "anycompatiblenonarray"}
POLYMORPHIC_ARRAY = {"anyarray", "anycompatiblearray"}

PLANTED_RECORDER = """
CREATE SEQUENCE public.planted_calls;
GRANT USAGE ON SEQUENCE public.planted_calls TO PUBLIC;
CREATE FUNCTION public.planted(what pg_catalog.text) RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog AS $$
BEGIN
    PERFORM pg_catalog.nextval('public.planted_calls');
    RAISE WARNING 'planted code ran as %: %', current_user, what;
    RETURN true;
END $$;
"""


def instances(signature):
    """The concrete signatures a pg_catalog signature (type names, the result last) stands for
    among the shadowed types: itself if concrete, else one per element type that fits."""
    arrays = {f"_{e}" for e in SHADOWED_ARRAYS}
    found = set()
    for element in SHADOWED_SCALARS:
        concrete = tuple(element if t in POLYMORPHIC_ELEMENT else f"_{element}" if t in POLYMORPHIC_ARRAY else t
                         for t in signature)
        if all(t in SHADOWED_SCALARS or t in arrays for t in concrete):
            found.add(concrete)
    return sorted(found)


def planted_shadows(conn) -> str:
    """SQL that plants, in public, an operator, function or aggregate of every pg_catalog one over
    the shadowed types (binary and prefix operators; functions of up to four arguments, not
    variadic; plain aggregates, count(*) among them), and a domain over each shadowed type. Each
    calls public.planted() with what it is, then does what pg_catalog's does."""
    typ = lambda t: f'pg_catalog."{t}"'  # noqa: E731
    statements, made, n = [], set(), 0
    operators = conn.execute(
        """SELECT o.oprname, coalesce(l.typname, ''), r.typname, res.typname, p.proname
             FROM pg_operator o JOIN pg_proc p ON p.oid = o.oprcode
             LEFT JOIN pg_type l ON l.oid = o.oprleft JOIN pg_type r ON r.oid = o.oprright
             JOIN pg_type res ON res.oid = o.oprresult
            WHERE o.oprnamespace = 'pg_catalog'::regnamespace ORDER BY o.oid""").fetchall()
    for name, left, right, result, code in operators:
        for concrete in instances((left, right, result) if left else (right, result)):
            if (name, concrete[:-1]) in made:
                continue
            made.add((name, concrete[:-1]))
            n += 1
            *args, returns = concrete
            params = ", ".join(f"a{i} {typ(t)}" for i, t in enumerate(args))
            call = ", ".join(f"a{i}" for i in range(len(args)))
            statements.append(
                f"""CREATE FUNCTION public.planted_op_{n}({params}) RETURNS {typ(returns)} LANGUAGE plpgsql
                    SET search_path = pg_catalog AS $f$ BEGIN PERFORM public.planted('operator {name}({", ".join(args)})');
                    RETURN pg_catalog."{code}"({call}); END $f$;
                    CREATE OPERATOR public.{name} ({'LEFTARG = ' + typ(args[0]) + ', ' if left else ''}RIGHTARG = {typ(args[-1])},
                                                   FUNCTION = public.planted_op_{n});""")
    functions = conn.execute(
        """SELECT p.proname, p.prokind, p.proretset,
                  ARRAY(SELECT t.typname FROM unnest(p.proargtypes) WITH ORDINALITY a(oid, i)
                          JOIN pg_type t ON t.oid = a.oid ORDER BY a.i)::text[], r.typname
             FROM pg_proc p JOIN pg_type r ON r.oid = p.prorettype
             LEFT JOIN pg_aggregate g ON g.aggfnoid = p.oid
            WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.provariadic = 0 AND p.proargmodes IS NULL
              AND p.pronargs <= 4 AND (p.prokind = 'f' OR (p.prokind = 'a' AND g.aggkind = 'n'))
            ORDER BY p.oid""").fetchall()
    for name, kind, returns_set, arg_types, result in functions:
        for concrete in instances((*arg_types, result)):
            if (name, concrete[:-1]) in made or (kind == "a" and returns_set):
                continue
            made.add((name, concrete[:-1]))
            n += 1
            *args, returns = concrete
            what = f"{'aggregate' if kind == 'a' else 'function'} {name}({', '.join(args)})"
            if kind == "a":
                params = ", ".join([f"s {typ(returns)}", *(f"a{i} {typ(t)}" for i, t in enumerate(args))])
                statements.append(
                    f"""CREATE FUNCTION public.planted_sfunc_{n}({params}) RETURNS {typ(returns)} LANGUAGE plpgsql
                        SET search_path = pg_catalog AS $f$ BEGIN PERFORM public.planted('{what}'); RETURN s; END $f$;
                        CREATE AGGREGATE public."{name}"({', '.join(typ(t) for t in args) or '*'})
                            (SFUNC = public.planted_sfunc_{n}, STYPE = {typ(returns)});""")
                continue
            params = ", ".join(f"a{i} {typ(t)}" for i, t in enumerate(args))
            call = f'pg_catalog."{name}"({", ".join(f"a{i}" for i in range(len(args)))})'
            body = f"RETURN QUERY SELECT {call};" if returns_set else f"RETURN {call};"
            statements.append(
                f"""CREATE FUNCTION public."{name}"({params}) RETURNS {'SETOF ' if returns_set else ''}{typ(returns)}
                    LANGUAGE plpgsql SET search_path = pg_catalog
                    AS $f$ BEGIN PERFORM public.planted('{what}'); {body} END $f$;""")
    for t in SHADOWED_SCALARS:
        statements.append(f"""CREATE DOMAIN public."{t}" AS {typ(t)} CHECK (public.planted('domain {t}'));""")
    return "\n".join(statements)


def test_a_database_owners_types_operators_and_functions_never_run_in_a_superusers_calls(cluster, roles,
                                                                                        scratch_database):
    """The owner of a database plants, in public, a domain over each common type and an operator,
    function and aggregate of pg_catalog's names and signatures over them, each recording that it
    ran, and sets the database's search_path = public, pg_catalog. A superuser then calls every
    function of pg_backfill there: none of the planted code runs (0.9.0: backfill_estimate() ran
    the domain text's check 18 times, through `nspname::text`)."""
    owner = roles.create("dbowner")
    name = scratch_database("owned_by_planter", f"OWNER {owner}")
    with cluster.connect(name) as su:
        su.execute("CREATE EXTENSION pg_backfill")
        su.execute("""CREATE TABLE t (id int PRIMARY KEY, label text NOT NULL, n bigint, doc jsonb);
                      INSERT INTO t SELECT g, 'row ' || g, g, jsonb_build_object('g', g) FROM generate_series(1, 300) g;
                      CREATE TABLE t_copy AS SELECT * FROM t WHERE id <> 7;
                      ALTER TABLE t_copy ADD PRIMARY KEY (id);
                      ANALYZE t, t_copy;
                      CREATE PUBLICATION hostile_pub FOR TABLE t;""")
        su.execute("SELECT pg_create_logical_replication_slot('hostile_slot', 'test_decoding')")
        plant = planted_shadows(su)
    with psycopg.connect(host="127.0.0.1", port=cluster.port, user=owner, dbname=name, autocommit=True) as conn:
        conn.execute(PLANTED_RECORDER)
        conn.execute(plant)
        conn.execute(f"ALTER DATABASE {name} SET search_path = public, pg_catalog")
    # A session of the superuser's own path, to look, and the superuser's session of the
    # database's path, to call.
    clean = psycopg.connect(host="127.0.0.1", port=cluster.port, user="postgres", dbname=name, autocommit=True,
                            options="-c search_path=pg_catalog,public")
    hostile = cluster.connect(name)
    warnings = []
    hostile.add_notice_handler(lambda notice: warnings.append(notice.message_primary))
    planted_calls = lambda: clean.execute(  # noqa: E731
        "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM public.planted_calls").fetchone()[0]

    def call(sql, params=None):
        """Runs sql in the hostile session: no planted code may run (checked even if it fails)."""
        try:
            return hostile.execute(sql, params).fetchall()
        finally:
            assert planted_calls() == 0, f"{sql}: planted code ran: {warnings[:5]}"

    def state(backfill_id):
        return clean.execute("SELECT state FROM backfill_status WHERE id = %s", [backfill_id]).fetchone()[0]

    try:
        call("SELECT * FROM backfill_estimate('t')")
        call("SELECT * FROM backfill_estimate('t'::pg_catalog.regclass, 500, 'id > 10', '{id,label}')")
        call("SELECT * FROM backfill_estimate(ARRAY['t', 't_copy']::pg_catalog.regclass[])")

        [(paced,)] = call("SELECT backfill_start('t', confirm => true, batch_size => 10, rows_per_second => 20)")
        for view in ("backfill_status", "backfill_tables", "backfill_errors", "backfill_shards"):
            call(f"SELECT * FROM {view}")
        call("SELECT backfill.workers_running(%s), backfill.waiting_for(%s), backfill.waiting_kind(%s)",
             [paced] * 3)
        call("SELECT backfill_pause(%s)", [paced])
        call("SELECT backfill_set(%s, batch_size => 20, rows_per_second => 30, max_replica_lag => 1000000, "
             "max_retained_wal => 1000000000, max_active_sessions => 100)", [paced])
        call("SELECT backfill_resume(%s)", [paced])
        assert call("SELECT backfill_wait(%s, '0.1 s')", [paced]) == [(False,)]
        call("SELECT backfill_cancel(%s)", [paced])
        assert wait_until_ended(clean, paced) == "cancelled"

        [(filtered,)] = call(
            "SELECT backfill_start('t'::pg_catalog.regclass, confirm => true, filter => 'id > 100', parallel => 2)")
        assert call("SELECT backfill_wait(%s)", [filtered]) == [(True,)]
        [(keyed,)] = call(
            """SELECT backfill_start('t'::pg_catalog.regclass, confirm => true, keys => '[{"id": 1}, {"id": 5000}]')""")
        assert call("SELECT backfill_wait(%s)", [keyed]) == [(True,)]

        # (Compared before any backfill through the slot, which the comparisons would then wait for.)
        hashed = call("SELECT * FROM backfill_checksum('t', 4)")
        bounds = json.dumps([upper for _, _, upper, _, _ in hashed if upper is not None])
        call("SELECT * FROM backfill_checksum('t_copy', 4, 'count', %s)", [bounds])
        call("SELECT * FROM backfill_checksum('t', 2, 'aggregate', NULL, '{id,label}')")
        assert call("SELECT * FROM backfill_compare('t', 't_copy', passes => 1)") == [({"id": 7}, "missing")]
        call("SELECT * FROM backfill_compare('t', 't_copy', 'count', 1, NULL, '{id,n}')")
        [(repair,)] = call("SELECT backfill_repair('t', 't_copy', confirm => true, passes => 1)")
        assert call("SELECT backfill_wait(%s)", [repair]) == [(True,)]
        [(piped,)] = call(
            "SELECT backfill_start(ARRAY['t']::pg_catalog.regclass[], confirm => true, slot => 'hostile_slot', "
            "publication => 'hostile_pub', max_lag => 100000000, rows_per_message => 10, columns => '{id,label}', "
            "max_replica_lag => 1000000, max_retained_wal => 1000000000, max_active_sessions => 100)")
        call("SELECT backfill_cancel(%s)", [piped])

        call("SELECT * FROM backfill_security_check()")
        call("SELECT * FROM backfill_key()")
        call("SELECT backfill_rotate_key()")
        [(xid, content)] = clean.execute(
            """SELECT x.xid::text::bigint, x.data FROM pg_logical_slot_peek_changes('hostile_slot', NULL, NULL) x
                WHERE x.data LIKE 'message: transactional: 1 prefix: backfill,%%' LIMIT 1""").fetchall()
        content = content.split(" content:", 1)[1]
        assert call("SELECT backfill_message_valid(%s, %s)", [content, xid]) == [(True,)]
        assert call("SELECT backfill_message_valid(%s, %s::pg_catalog.text::pg_catalog.xid)", [content, xid]) == [(True,)]
        call("SELECT backfill.row_hash(t) FROM t")
        call("SELECT backfill.start_on_node(ARRAY['t']::pg_catalog.regclass[], false, 1000, NULL, NULL, NULL, NULL, 1)")
        call("SELECT backfill.refuse_node_options(ARRAY['t'::pg_catalog.regclass::pg_catalog.oid], NULL, NULL, NULL, "
             "NULL, NULL)")
        call("SELECT backfill.visible('postgres'), backfill.may_act_as('postgres', 'pg_monitor'), "
             "backfill.source_limit('max_replica_lag', NULL), backfill.max_slot_lag_bytes(), backfill.auto_resume()")
        assert wait_until_ended(clean, piped) == "cancelled"
        assert [state(i) for i in (filtered, keyed, repair)] == ["done"] * 3

        # The traps are armed: the superuser's own unqualified SQL runs them.
        hostile.execute("SELECT 'x'::text")
        assert planted_calls() == 1 and "domain text" in warnings[-1]
        hostile.execute("SELECT count(*) FROM pg_class WHERE relname = 'pg_class'")
        assert planted_calls() > 1 and any("operator =" in w for w in warnings)
    finally:
        hostile.close()
        clean.close()
