"""No one's objects on another role's path: an operator's search_path, a database owner's ALTER
DATABASE ... SET search_path, a domain the caller makes in pg_temp, and a database owner's types,
operators, functions and aggregates planted under pg_catalog's names never run in a superuser's
calls or in the worker."""

import json

import psycopg

from conftest import readme_grants, status, wait_for, wait_until_ended, worker_pid
from security_helpers import escalation, is_superuser, make_table, start, TRAP, value


# --- the caller's search_path ---------------------------------------------------------------------

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


# --- the worker's own connection, and pg_temp -----------------------------------------------------

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


# --- a database owner's types, operators and functions on a superuser's path ----------------------

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
