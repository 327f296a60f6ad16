"""Who may call what: after CREATE EXTENSION, PUBLIC may execute only the functions that grant
nothing (the views' helpers and a few that only refuse or narrow), a role without the grants of
docs/security.md may call none of the others, and backfill_security_check() reports what PUBLIC
may still do (pg_logical_emit_message, any signature that starts backfills) with the fix."""

from conftest import PG_MAJOR, error_of, status, wait_for, wait_until_ended
from security_helpers import make_table, value


# --- grants ---------------------------------------------------------------------------------------

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


# --- backfill_security_check(): what PUBLIC may still do, and the fix -----------------------------

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


def test_the_security_check_reports_public_execute_on_every_signature_that_starts_backfills(db):
    """0.10.0's check looked at one of backfill.start()'s four signatures: after its fixes it
    reported ok while PUBLIC still started backfills through the 8-, 9- and 10-argument ones.
    Every signature of backfill.start(), repair() and follow(), as pg_proc lists them, is checked.
    (The update to 0.11.0 drops the older signatures: one of backfill.start() is left.)"""
    check = "SELECT ok, fix FROM backfill_security_check() WHERE item = 'backfills cannot be started by PUBLIC'"
    signatures = [s for s, in db.execute(
        """SELECT p.oid::regprocedure::text FROM pg_proc p
            WHERE p.pronamespace = 'backfill'::regnamespace AND p.proname IN ('start', 'repair', 'follow')
            ORDER BY p.proname, p.pronargs""").fetchall()]
    assert sum(s.startswith("backfill.start(") for s in signatures) == 1, signatures
    assert db.execute(check).fetchone()[0] is True
    for signature in signatures:
        db.execute(f"GRANT EXECUTE ON FUNCTION {signature} TO PUBLIC")
        [(ok, fix)] = db.execute(check).fetchall()
        assert ok is False, signature
        assert fix == f"REVOKE EXECUTE ON FUNCTION {signature} FROM PUBLIC;", fix
        db.execute(fix)
        assert db.execute(check).fetchone()[0] is True, signature
    db.execute(f"GRANT EXECUTE ON FUNCTION {', '.join(signatures)} TO PUBLIC")
    [(ok, fix)] = db.execute(check).fetchall()
    assert ok is False and all(s in fix for s in signatures), fix
    db.execute(fix)
    assert db.execute(check).fetchone()[0] is True
