"""ALTER EXTENSION pg_backfill UPDATE from every earlier version: the result is the fresh install,
object for object, and a backfill running across the update finishes exactly once."""

from collections import Counter

import pytest

from conftest import at_earlier_version, error_of, status, wait_until_ended

# Every object of the extension, as text: functions with their definitions and privileges,
# tables and views with their columns, defaults, definitions and privileges, constraints,
# comments. A fresh install and an updated one must give the same rows.
EXTENSION_SHAPE = """
WITH member AS (
    SELECT d.classid, d.objid FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
     WHERE e.extname = 'pg_backfill' AND d.deptype = 'e')
SELECT 'function', p.oid::regprocedure::text, pg_get_functiondef(p.oid), coalesce(p.proacl::text, '')
  FROM pg_proc p JOIN member m ON m.classid = 'pg_proc'::regclass AND m.objid = p.oid
UNION ALL
SELECT 'relation', c.oid::regclass::text,
       c.relkind::text || ' ' || coalesce(pg_get_viewdef(c.oid), '') || ' ' || coalesce(array_to_string(c.reloptions, ','), '') || ' ' ||
       (SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull || ' ' ||
                          a.attidentity::text || ' ' || coalesce(pg_get_expr(ad.adbin, ad.adrelid), ''), ', ' ORDER BY a.attnum)
          FROM pg_attribute a LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
         WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
       coalesce(c.relacl::text, '')
  FROM pg_class c JOIN member m ON m.classid = 'pg_class'::regclass AND m.objid = c.oid
UNION ALL
SELECT 'constraint', con.conrelid::regclass::text || ' ' || con.conname, pg_get_constraintdef(con.oid), ''
  FROM pg_constraint con JOIN member m ON m.classid = 'pg_class'::regclass AND m.objid = con.conrelid
UNION ALL
SELECT 'comment', pg_describe_object(ds.classoid, ds.objoid, ds.objsubid), ds.description, ''
  FROM pg_description ds JOIN member m ON m.classid = ds.classoid AND m.objid = ds.objoid
UNION ALL
SELECT 'configuration tables', coalesce(extconfig::regclass[]::text, ''), coalesce(array_to_string(extcondition, ','), ''), ''
  FROM pg_extension WHERE extname = 'pg_backfill'
UNION ALL
SELECT 'trigger', t.tgrelid::regclass::text || ' ' || t.tgname, pg_get_triggerdef(t.oid), t.tgenabled::text
  FROM pg_trigger t JOIN member m ON m.classid = 'pg_class'::regclass AND m.objid = t.tgrelid
 WHERE NOT t.tgisinternal
UNION ALL
SELECT 'event trigger', e.evtname, e.evtevent || ' ' || coalesce(array_to_string(e.evttags, ','), '') || ' ' || e.evtfoid::regprocedure::text,
       e.evtenabled::text
  FROM pg_event_trigger e JOIN member m ON m.classid = 'pg_event_trigger'::regclass AND m.objid = e.oid
UNION ALL
SELECT 'schema', n.nspname, '', coalesce(n.nspacl::text, '')
  FROM pg_namespace n JOIN member m ON m.classid = 'pg_namespace'::regclass AND m.objid = n.oid
ORDER BY 1, 2, 3
"""

EARLIER_VERSIONS = ["0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "0.9.0", "0.10.0"]


def shape(conn):
    return conn.execute(EXTENSION_SHAPE).fetchall()


@pytest.mark.parametrize("version", EARLIER_VERSIONS)
def test_update_gives_the_fresh_install_object_for_object(db, version):
    fresh = shape(db)
    db.execute("DROP EXTENSION pg_backfill")
    db.execute(f"CREATE EXTENSION pg_backfill VERSION '{version}'")
    assert shape(db) != fresh, "the earlier version must differ, or this test proves nothing"
    db.execute("ALTER EXTENSION pg_backfill UPDATE")
    current = db.execute("SELECT default_version FROM pg_available_extensions WHERE name = 'pg_backfill'").fetchone()[0]
    assert db.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_backfill'").fetchone()[0] == current
    updated = shape(db)
    only_updated = [row for row in updated if row not in fresh]
    only_fresh = [row for row in fresh if row not in updated]
    assert (only_updated, only_fresh) == ([], []), "\n".join(f"updated: {r}" for r in only_updated) + "\n" + "\n".join(f"fresh: {r}" for r in only_fresh)


# The entry points only earlier versions' SQL calls (src/api/old_sql.rs), as 0.10.0 declares them.
OLD_ENTRY_POINTS = {
    "backfill.start(oid[],boolean,integer,integer,text,text,bigint,integer)",
    "backfill.start(oid[],boolean,integer,integer,text,text,bigint,integer,text)",
    "backfill.start(oid[],boolean,integer,integer,text,text,bigint,integer,text,text[])",
    "backfill.estimate(oid[],integer)",
    "backfill.estimate(oid[],integer,text)",
    "backfill.set(bigint,integer,integer,bigint)",
    "backfill.set_source_limits(bigint,bigint,bigint,integer)",
    "backfill.set_keys(bigint,jsonb)",
    "backfill.set_rows_per_message(bigint,integer)",
    "backfill.refuse_node_options(oid[],jsonb,bigint,bigint,integer,integer)",
    "backfill.follow_ddl()",
    "backfill.compare(oid,oid,text,integer,text)",
    "backfill.repair(oid,oid,boolean,text,integer,text,integer)",
}


def declared_in_schema_backfill(db):
    return {f for f, in db.execute("SELECT replace(oid::regprocedure::text, ' ', '') FROM pg_proc"
                                   " WHERE pronamespace = 'backfill'::regnamespace").fetchall()}


def test_the_old_entry_points_are_served_to_a_database_not_yet_updated_and_declared_by_no_fresh_install(db, roles):
    """A fresh install declares none of the entry points only earlier versions' SQL calls; a
    database still at 0.10.0 calls them (the library serves them: NULL, a role with no grant), and
    its update drops them."""
    assert declared_in_schema_backfill(db) & OLD_ENTRY_POINTS == set()
    at_earlier_version(db, "0.10.0")
    assert declared_in_schema_backfill(db) & OLD_ENTRY_POINTS == OLD_ENTRY_POINTS
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    db.execute("INSERT INTO t SELECT generate_series(1, 100)")
    # NULL: no backfill, or 22004 naming the argument.
    assert db.execute("SELECT backfill.refuse_node_options(NULL, NULL, NULL, NULL, NULL, NULL)").fetchone()[0] is None
    for sql in ("SELECT backfill.set_keys(NULL, '[{\"id\": 1}]')", "SELECT backfill.set_rows_per_message(NULL, 5)"):
        e = error_of(db, sql)
        assert e.sqlstate == "22004" and e.diag.message_hint, (sql, e)
    # backfill.refuse_node_options() is PUBLIC's in 0.10.0: it starts nothing, and refuses what a
    # Citus node does not take.
    nobody = roles.create("nogrants")
    conn = roles.connect(nobody)
    assert conn.execute("SELECT backfill.refuse_node_options(ARRAY['t'::regclass::oid], NULL, NULL, NULL, NULL, NULL)"
                        ).fetchone()[0] == [db.execute("SELECT 't'::regclass::oid").fetchone()[0]]
    assert db.execute("SELECT count(*) FROM backfill_status").fetchone()[0] == 0
    # 0.10.0's backfill_start(), through its own entry point, still starts and completes a backfill.
    backfill_id = db.execute("SELECT backfill_start('t', confirm => true, batch_size => 30)").fetchone()[0]
    assert wait_until_ended(db, backfill_id) == "done" and status(db, backfill_id, "rows_done") == 100
    db.execute("ALTER EXTENSION pg_backfill UPDATE")
    assert declared_in_schema_backfill(db) & OLD_ENTRY_POINTS == set()


@pytest.mark.parametrize("version", EARLIER_VERSIONS)
def test_a_backfill_running_across_the_update_delivers_every_row_once(db, version):
    db.execute("DROP EXTENSION pg_backfill")
    db.execute(f"CREATE EXTENSION pg_backfill VERSION '{version}'")
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    db.execute("INSERT INTO t SELECT i, 'v' || i FROM generate_series(1, 3000) i")
    db.execute("SELECT pg_create_logical_replication_slot('upgrade_slot', 'test_decoding')")
    backfill_id = db.execute(
        "SELECT backfill_start('t', confirm => true, rows_per_second => 3000, batch_size => 100)"
    ).fetchone()[0]
    db.execute("SELECT pg_sleep(0.4)")
    assert status(db, backfill_id, "state") == "running", "the update must happen mid-run"
    db.execute("ALTER EXTENSION pg_backfill UPDATE")
    assert wait_until_ended(db, backfill_id) == "done", status(db, backfill_id, "last_error_sqlstate", "last_error")

    reads, signed = Counter(), 0
    xid = None
    for (line,) in db.execute(
        "SELECT data FROM pg_logical_slot_get_changes('upgrade_slot', NULL, NULL, 'include-xids', '1')"
    ):
        if line.startswith("BEGIN "):
            xid = int(line.split()[1])
        elif "prefix: backfill" in line:
            content = line.split("content:", 1)[1]
            if '"op":"read"' in content:
                reads[content.split('"key":{"id":', 1)[1].split("}", 1)[0]] += 1
            if ',"auth":"' in content:
                signed += 1
                assert db.execute("SELECT backfill_message_valid(%s, %s)", [content, xid]).fetchone()[0]
    assert len(reads) == 3000 and set(reads.values()) == {1}
    # Pages after the update are signed: the update reached the running worker.
    assert signed > 0


# The operator grants of 0.3.0's README, on the functions as 0.3.0 declared them.
OPERATOR_GRANTS_0_3_0 = """
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA backfill TO {role};
GRANT EXECUTE ON FUNCTION
    backfill_estimate(regclass[], integer), backfill_estimate(regclass, integer), backfill_estimate(text, integer),
    backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer),
    backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer),
    backfill_start(text, boolean, integer, integer, name, name, bigint, integer),
    backfill_pause(bigint), backfill_resume(bigint), backfill_cancel(bigint),
    backfill_set(bigint, integer, integer, bigint), backfill_wait(bigint, interval)
  TO {role};
"""


def test_an_operator_granted_before_0_4_0_keeps_starting_and_changing_backfills(db, roles):
    """0.4.0 gives backfill_start() and backfill_set() new arguments, so new functions: the update
    carries the old ones' grants over, and grants the new entry point to who had the old one."""
    db.execute("DROP EXTENSION pg_backfill")
    db.execute("CREATE EXTENSION pg_backfill VERSION '0.3.0'")
    operator = roles.create("operator")
    db.execute(OPERATOR_GRANTS_0_3_0.format(role=operator))
    # A role that may only change the operator's backfills (a member that inherits none of its
    # rights), and PUBLIC granted backfill_set() (any role may call it; it checks the caller).
    pacer = roles.create("pacer")
    db.execute(f"ALTER ROLE {pacer} NOINHERIT")
    db.execute(f"GRANT {operator} TO {pacer}")
    db.execute(f"GRANT EXECUTE ON FUNCTION backfill_set(bigint, integer, integer, bigint), "
               f"backfill.set(bigint, integer, integer, bigint) TO {pacer}")
    db.execute("GRANT EXECUTE ON FUNCTION backfill_set(bigint, integer, integer, bigint) TO PUBLIC")
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    db.execute("INSERT INTO t SELECT generate_series(1, 100)")
    db.execute(f"GRANT SELECT, UPDATE ON t TO {operator}")
    db.execute("ALTER EXTENSION pg_backfill UPDATE")
    conn = roles.connect(operator)
    backfill_id = conn.execute(
        "SELECT backfill_start('t', confirm => true, rows_per_second => 10, max_active_sessions => 7)"
    ).fetchone()[0]
    # (backfill_set() returns true whatever it changed: backfill_status shows what is in effect.)
    conn.execute("SELECT backfill_set(%s, max_replica_lag => 4096)", [backfill_id])
    assert conn.execute("SELECT sum(rows) FROM backfill_checksum('t', ranges => 4)").fetchone()[0] == 100
    assert conn.execute(
        "SELECT max_active_sessions, max_replica_lag_bytes, rows_per_second FROM backfill_status WHERE id = %s",
        [backfill_id],
    ).fetchone() == (7, 4096, 10)
    roles.connect(pacer).execute("SELECT backfill_set(%s, rows_per_second => 30)", [backfill_id])
    assert conn.execute(
        "SELECT rows_per_second FROM backfill_status WHERE id = %s", [backfill_id]
    ).fetchone()[0] == 30
    assert db.execute(
        "SELECT has_function_privilege('public', 'backfill_set(bigint, integer, integer, bigint, bigint, bigint, integer)', 'EXECUTE')"
    ).fetchone()[0]
    conn.execute("SELECT backfill_cancel(%s)", [backfill_id])
    # A role that had no grant gains none.
    bystander = roles.create("bystander")
    assert error_of(roles.connect(bystander), "SELECT backfill_start('t', confirm => true)").sqlstate == "42501"


# The operator grants of 0.4.0's README, on the functions as 0.4.0 declared them.
OPERATOR_GRANTS_0_4_0 = """
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA backfill TO {role};
GRANT EXECUTE ON FUNCTION
    backfill_estimate(regclass[], integer), backfill_estimate(regclass, integer), backfill_estimate(text, integer),
    backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer),
    backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer),
    backfill_start(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer),
    backfill_pause(bigint), backfill_resume(bigint), backfill_cancel(bigint),
    backfill_set(bigint, integer, integer, bigint, bigint, bigint, integer), backfill_wait(bigint, interval),
    backfill_checksum(regclass, integer, text, jsonb)
  TO {role};
"""


def test_an_operator_granted_before_0_5_0_starts_keyed_backfills_compares_and_repairs(db, roles):
    """0.5.0 gives backfill_start() a keys argument, so new functions: the update carries the old
    ones' grants over, and grants backfill_compare() and backfill_repair() (and their entry points)
    to who could checksum and start backfills; PUBLIC's grant carries over too."""
    db.execute("DROP EXTENSION pg_backfill")
    db.execute("CREATE EXTENSION pg_backfill VERSION '0.4.0'")
    operator = roles.create("operator")
    db.execute(OPERATOR_GRANTS_0_4_0.format(role=operator))
    db.execute("GRANT EXECUTE ON FUNCTION backfill_start(text, boolean, integer, integer, name, name, bigint, integer, "
               "bigint, bigint, integer) TO PUBLIC")
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    db.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 100) g")
    db.execute("CREATE TABLE t_copy (LIKE t INCLUDING ALL)")
    db.execute("INSERT INTO t_copy SELECT * FROM t WHERE id <> 7")
    db.execute(f"GRANT SELECT, UPDATE ON t, t_copy TO {operator}")
    db.execute("ALTER EXTENSION pg_backfill UPDATE")
    conn = roles.connect(operator)
    assert conn.execute("SELECT key->>'id', status FROM backfill_compare('t', 't_copy')").fetchall() == [("7", "missing")]
    backfill_id = conn.execute("SELECT backfill_repair('t', 't_copy', confirm => true)").fetchone()[0]
    assert wait_until_ended(db, backfill_id) == "done"
    keyed = conn.execute("SELECT backfill_start('t', confirm => true, keys => '[{\"id\": 1}]')").fetchone()[0]
    assert wait_until_ended(db, keyed) == "done"
    assert db.execute("SELECT rows_done FROM backfill_status WHERE id IN (%s, %s) ORDER BY id", [backfill_id, keyed]).fetchall() == [(1,), (1,)]
    assert db.execute(
        "SELECT has_function_privilege('public', 'backfill_start(text, boolean, integer, integer, name, name, bigint, integer, "
        "bigint, bigint, integer, jsonb, integer, text, text[])', 'EXECUTE')"
    ).fetchone()[0]
    bystander = roles.create("bystander")
    assert error_of(roles.connect(bystander), "SELECT * FROM backfill_compare('t', 't_copy')").sqlstate == "42501"


# The operator grants of 0.7.0's docs/security.md, on the functions as 0.7.0 declared them.
OPERATOR_GRANTS_0_7_0 = """
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA backfill TO {role};
GRANT EXECUTE ON FUNCTION
    backfill_estimate(regclass[], integer), backfill_estimate(regclass, integer), backfill_estimate(text, integer),
    backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer),
    backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer),
    backfill_start(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer),
    backfill_pause(bigint), backfill_resume(bigint), backfill_cancel(bigint),
    backfill_set(bigint, integer, integer, bigint, bigint, bigint, integer), backfill_wait(bigint, interval),
    backfill_checksum(regclass, integer, text, jsonb), backfill_compare(regclass, regclass, text, integer, name),
    backfill_repair(regclass, regclass, boolean, text, integer, name, integer)
  TO {role};
"""


def test_an_operator_granted_before_0_8_0_starts_and_estimates_filtered_backfills(db, roles):
    """0.8.0 gives backfill_start() and backfill_estimate() a filter argument, so new functions
    and new entry points: the update carries the old ones' grants over; PUBLIC's too."""
    db.execute("DROP EXTENSION pg_backfill")
    db.execute("CREATE EXTENSION pg_backfill VERSION '0.7.0'")
    operator = roles.create("operator")
    db.execute(OPERATOR_GRANTS_0_7_0.format(role=operator))
    db.execute("GRANT EXECUTE ON FUNCTION backfill_estimate(text, integer) TO PUBLIC")
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    db.execute("INSERT INTO t SELECT generate_series(1, 100)")
    db.execute("ANALYZE t")
    db.execute(f"GRANT SELECT, UPDATE ON t TO {operator}")
    db.execute("ALTER EXTENSION pg_backfill UPDATE")
    conn = roles.connect(operator)
    assert conn.execute("SELECT rows_estimated FROM backfill_estimate('t', filter => 'id <= 10')").fetchone()[0] <= 20
    backfill_id = conn.execute("SELECT backfill_start('t', confirm => true, filter => 'id <= 10')").fetchone()[0]
    assert wait_until_ended(db, backfill_id) == "done"
    assert status(db, backfill_id, "rows_done") == 10
    assert db.execute("SELECT has_function_privilege('public', 'backfill_estimate(text, integer, text, text[])', 'EXECUTE')").fetchone()[0]
    bystander = roles.create("bystander")
    assert error_of(roles.connect(bystander), "SELECT backfill_start('t', confirm => true)").sqlstate == "42501"


def test_every_table_view_column_and_function_has_a_comment(db):
    missing = db.execute(
        """WITH member AS (
               SELECT d.classid, d.objid FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
                WHERE e.extname = 'pg_backfill' AND d.deptype = 'e')
           SELECT p.oid::regprocedure::text FROM pg_proc p JOIN member m ON m.classid = 'pg_proc'::regclass AND m.objid = p.oid
            WHERE obj_description(p.oid, 'pg_proc') IS NULL
           UNION ALL
           SELECT c.oid::regclass::text FROM pg_class c JOIN member m ON m.classid = 'pg_class'::regclass AND m.objid = c.oid
            WHERE c.relkind IN ('r', 'v') AND obj_description(c.oid, 'pg_class') IS NULL
           UNION ALL
           SELECT c.oid::regclass::text || '.' || a.attname FROM pg_class c
             JOIN member m ON m.classid = 'pg_class'::regclass AND m.objid = c.oid
             JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
            WHERE c.relkind IN ('r', 'v') AND col_description(c.oid, a.attnum) IS NULL
           ORDER BY 1"""
    ).fetchall()
    assert missing == []


# Traps a role that may create objects in the extension's schema (public, as before PostgreSQL
# 15) lays for whoever runs ALTER EXTENSION UPDATE (a superuser) or later reads the views: an
# exact-type operator or aggregate wins over pg_catalog's, which would need a cast.
TRAPS = """
CREATE FUNCTION public.promote() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ALTER ROLE %I SUPERUSER', '{role}');
EXCEPTION WHEN insufficient_privilege THEN NULL;
END $$;
CREATE FUNCTION public.trap_eq(oid, regprocedure) RETURNS boolean LANGUAGE plpgsql AS
$$ BEGIN PERFORM public.promote(); RETURN $1 = $2::oid; END $$;
CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = regprocedure, FUNCTION = public.trap_eq);
CREATE FUNCTION public.trap_mul(integer, double precision) RETURNS double precision LANGUAGE plpgsql AS
$$ BEGIN PERFORM public.promote(); RETURN $1::float8 * $2; END $$;
CREATE OPERATOR public.* (LEFTARG = integer, RIGHTARG = double precision, FUNCTION = public.trap_mul);
CREATE FUNCTION public.trap_agg(oid[], oid) RETURNS oid[] LANGUAGE plpgsql AS
$$ BEGIN PERFORM public.promote(); RETURN $1 || $2; END $$;
CREATE AGGREGATE public.array_agg(oid) (SFUNC = public.trap_agg, STYPE = oid[]);
"""


def test_the_update_and_the_views_resolve_nothing_another_role_planted(db, roles):
    db.execute("DROP EXTENSION pg_backfill")
    db.execute("CREATE EXTENSION pg_backfill VERSION '0.3.0'")
    mallory = roles.create("mallory")
    db.execute(f"GRANT CREATE ON SCHEMA public TO {mallory}")
    trapper = roles.connect(mallory)
    trapper.execute(TRAPS.format(role=mallory))
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    db.execute("INSERT INTO t SELECT generate_series(1, 100)")
    try:
        db.execute("ALTER EXTENSION pg_backfill UPDATE")
        backfill_id = db.execute("SELECT backfill_start('t', confirm => true, rows_per_second => 10)").fetchone()[0]
        db.execute("SELECT * FROM backfill_status WHERE id = %s", [backfill_id]).fetchall()
        db.execute("SELECT * FROM backfill_tables").fetchall()
        db.execute("SELECT backfill_cancel(%s)", [backfill_id])
        assert not db.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", [mallory]).fetchone()[0], (
            "a planted operator ran as a superuser"
        )
    finally:
        db.execute(f"ALTER ROLE {mallory} NOSUPERUSER")
        db.execute("DROP AGGREGATE IF EXISTS public.array_agg(oid)")
        db.execute("DROP OPERATOR IF EXISTS public.= (oid, regprocedure)")
        db.execute("DROP OPERATOR IF EXISTS public.* (integer, double precision)")


# The operator grants of 0.8.0's docs/security.md, on the functions as 0.8.0 declared them.
OPERATOR_GRANTS_0_8_0 = """
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA backfill TO {role};
GRANT EXECUTE ON FUNCTION
    backfill_estimate(regclass[], integer, text), backfill_estimate(regclass, integer, text), backfill_estimate(text, integer, text),
    backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text),
    backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text),
    backfill_start(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text),
    backfill_pause(bigint), backfill_resume(bigint), backfill_cancel(bigint),
    backfill_set(bigint, integer, integer, bigint, bigint, bigint, integer), backfill_wait(bigint, interval),
    backfill_checksum(regclass, integer, text, jsonb), backfill_compare(regclass, regclass, text, integer, name),
    backfill_repair(regclass, regclass, boolean, text, integer, name, integer)
  TO {role};
"""


def test_an_operator_granted_before_0_9_0_uses_column_lists(db, roles):
    """0.9.0 gives backfill_start(), backfill_estimate(), backfill_checksum(), backfill_compare()
    and backfill_repair() a columns argument, so new functions and entry points: the update
    carries the old ones' grants over; PUBLIC's too."""
    db.execute("DROP EXTENSION pg_backfill")
    db.execute("CREATE EXTENSION pg_backfill VERSION '0.8.0'")
    operator = roles.create("operator")
    db.execute(OPERATOR_GRANTS_0_8_0.format(role=operator))
    db.execute("GRANT EXECUTE ON FUNCTION backfill_checksum(regclass, integer, text, jsonb) TO PUBLIC")
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text, secret text)")
    db.execute("INSERT INTO t SELECT g, 'v', 's' FROM generate_series(1, 100) g")
    db.execute("CREATE TABLE t_copy (id int PRIMARY KEY, v text)")
    db.execute("INSERT INTO t_copy SELECT id, v FROM t WHERE id <> 7")
    db.execute(f"GRANT SELECT, UPDATE ON t, t_copy TO {operator}")
    db.execute("ALTER EXTENSION pg_backfill UPDATE")
    conn = roles.connect(operator)
    assert conn.execute("SELECT bytes_estimated > 0 FROM backfill_estimate('t', columns => '{id,v}')").fetchone()[0]
    backfill_id = conn.execute("SELECT backfill_start('t', confirm => true, columns => '{id,v}')").fetchone()[0]
    assert wait_until_ended(db, backfill_id) == "done"
    assert db.execute("SELECT column_list FROM backfill.job_table WHERE job_id = %s", [backfill_id]).fetchone()[0] == ["id", "v"]
    assert conn.execute("SELECT count(*) FROM backfill_checksum('t', columns => '{id,v}')").fetchone()[0] >= 1
    assert conn.execute(
        "SELECT key->>'id', status FROM backfill_compare('t', 't_copy', columns => '{id,v}')"
    ).fetchall() == [("7", "missing")]
    repair = conn.execute("SELECT backfill_repair('t', 't_copy', confirm => true, columns => '{id,v}')").fetchone()[0]
    assert wait_until_ended(db, repair) == "done"
    assert db.execute(
        "SELECT has_function_privilege('public', 'backfill_checksum(regclass, integer, text, jsonb, text[])', 'EXECUTE')"
    ).fetchone()[0]
    bystander = roles.create("bystander")
    assert error_of(roles.connect(bystander), "SELECT backfill_start('t', confirm => true)").sqlstate == "42501"
