"""backfill_progress: one row per running backfill worker of the whole cluster, from shared
memory, readable from any database (docs/reference.md#backfill_progress), and the query files
for postgres_exporter and sql_exporter in docs/monitoring/, whose every query runs here.

The view needs pg_backfill in shared_preload_libraries: these tests run on a preloaded cluster
of their own (`monitoring`), with databases `a` and `b`, both with the extension. Backfills are
paced (rows_per_second) so that they run while the tests look; no verdict depends on speed:
every check waits for what it needs, or compares figures read around each other."""

import os
import signal
from contextlib import suppress
from pathlib import Path

import psycopg
import pytest
import yaml

from conftest import ROOT, error_of, extra_cluster, readme_grants, status, wait_for, wait_until_ended, worker_pid

pytestmark = pytest.mark.cluster

COLUMNS = ["pid", "datid", "datname", "backfill_id", "worker", "relid", "position", "phase", "rows_total",
           "rows_done", "bytes_done", "pages_done", "started_by", "started_at", "phase_since"]
PHASES = {"starting", "scanning", "waiting for consumer", "waiting for source", "waiting for load", "finishing"}


@pytest.fixture(scope="module")
def preloaded(cluster):
    other = extra_cluster(cluster, "monitoring")
    other.start("shared_preload_libraries = 'pg_backfill'")
    with other.connect() as admin:
        for name in ("a", "b"):
            admin.execute(f"CREATE DATABASE {name}")
            with other.connect(name) as conn:
                conn.execute("CREATE EXTENSION pg_backfill")
    yield other
    other.stop()


@pytest.fixture
def a(preloaded):
    """Database a, where the backfills run: a table `t` of 3,000 rows, analyzed (its estimate is
    exact). Every backfill still running at the end is cancelled."""
    conn = preloaded.connect("a")
    conn.execute("DROP TABLE IF EXISTS t; CREATE TABLE t (id int PRIMARY KEY, body text)")
    conn.execute("INSERT INTO t SELECT g, repeat('x', 50) FROM generate_series(1, 3000) g; ANALYZE t")
    yield conn
    conn.close()
    # (A connection of its own: the test's may have gone with a server restart.)
    with preloaded.connect("a") as again:
        for backfill_id, in again.execute("SELECT id FROM backfill_status WHERE state IN ('running', 'paused')").fetchall():
            with suppress(psycopg.errors.ObjectNotInPrerequisiteState):  # it ended meanwhile
                again.execute("SELECT backfill_cancel(%s)", [backfill_id])
        wait_for(lambda: not progress(again), what="every worker to exit")


@pytest.fixture
def b(preloaded):
    conn = preloaded.connect("b")
    yield conn
    conn.close()


@pytest.fixture
def logins(preloaded):
    """LOGIN roles of the test, dropped at its end with what they own or were granted."""
    made = []

    def create(name, *options):
        with preloaded.connect() as admin:
            admin.execute(f"DROP ROLE IF EXISTS {name}")
            admin.execute(f"CREATE ROLE {name} LOGIN {' '.join(options)}")
        made.append(name)
        return name

    yield create
    with preloaded.connect() as admin:
        admin.execute("GRANT CONNECT ON DATABASE a TO PUBLIC")
    for name in made:
        for database in ("a", "b"):
            with suppress(psycopg.Error), preloaded.connect(database) as conn:
                conn.execute(f"REASSIGN OWNED BY {name} TO postgres; DROP OWNED BY {name}")
        with suppress(psycopg.Error), preloaded.connect() as admin:
            admin.execute(f"DROP ROLE IF EXISTS {name}")


def connect_as(cluster, role, database):
    return psycopg.connect(host="127.0.0.1", port=cluster.port, user=role, dbname=database, autocommit=True)


def progress(conn, backfill_id=None):
    """The rows of backfill_progress `conn`'s role sees (of one backfill, if given), as dicts."""
    cursor = conn.execute("SELECT * FROM backfill_progress ORDER BY backfill_id, worker")
    names = [c.name for c in cursor.description]
    rows = [dict(zip(names, row)) for row in cursor.fetchall()]
    return [r for r in rows if backfill_id is None or r["backfill_id"] == backfill_id]


def start(conn, table="t", **options):
    given = "".join(f", {name} => {value}" for name, value in options.items())
    return conn.execute(f"SELECT backfill_start('{table}', confirm => true{given})").fetchone()[0]


def paced(conn, table="t", **options):
    """A backfill at 100 rows a second, pages of 10 rows: of t, it runs for about half a minute."""
    return start(conn, table, rows_per_second=100, batch_size=10, **options)


def scanning(conn, backfill_id, rows=1):
    """Waits until the backfill's first worker shows scanning with at least `rows` rows done; its row."""
    return wait_for(
        lambda: next((r for r in progress(conn, backfill_id) if r["phase"] == "scanning" and r["rows_done"] >= rows),
                     None),
        what=f"backfill {backfill_id} scanning past {rows} rows",
    )


def test_a_backfill_in_one_database_shows_in_another_with_its_numbers(a, b):
    backfill_id = paced(a)
    table, database = a.execute("SELECT 't'::regclass::oid, oid FROM pg_database WHERE datname = 'a'").fetchone()
    first = scanning(b, backfill_id, rows=50)
    assert list(first) == COLUMNS
    assert first["datid"] == database and first["datname"] == "a" and first["relid"] == table
    assert first["pid"] == worker_pid(a, backfill_id) and first["worker"] == 0
    assert first["started_by"] == "postgres" and first["phase"] in PHASES
    assert first["position"] == a.execute("SELECT position FROM backfill_tables WHERE backfill_id = %s",
                                          [backfill_id]).fetchone()[0]
    assert first["rows_total"] == 3000  # the planner's estimate of the analyzed table
    assert first["bytes_done"] > 0 and first["pages_done"] >= 1
    assert first["started_at"] <= first["phase_since"]
    # The worker writes its figures as each page commits its cursor: read between two reads of
    # the cursor's count, the view's is at least the first, and at most one page past the second.
    before = status(a, backfill_id, "rows_done")
    seen = progress(b, backfill_id)[0]["rows_done"]
    after = status(a, backfill_id, "rows_done")
    assert before <= seen <= after + 10
    # rows_done grows, and so do bytes and pages.
    later = wait_for(lambda: next((r for r in progress(b, backfill_id) if r["rows_done"] > seen + 20), None),
                     what="rows_done to grow")
    assert later["bytes_done"] > first["bytes_done"] and later["pages_done"] > first["pages_done"]
    assert later["pid"] == first["pid"] and later["started_at"] == first["started_at"]


def test_its_row_goes_when_the_backfill_is_done_or_cancelled(a, b):
    done = start(a, batch_size=500)
    assert wait_until_ended(a, done) == "done"
    wait_for(lambda: not progress(b, done), what="the done backfill's row to go")
    cancelled = paced(a)
    scanning(b, cancelled)
    a.execute("SELECT backfill_cancel(%s)", [cancelled])
    wait_for(lambda: not progress(b, cancelled), what="the cancelled backfill's row to go")
    assert status(a, cancelled, "state") == "cancelled"


def test_a_terminated_workers_row_goes_and_its_restarted_worker_shows(a, b):
    backfill_id = paced(a)
    old = scanning(b, backfill_id)["pid"]
    # (The view counts a page as it writes its cursor, before it commits: wait for a commit.)
    wait_for(lambda: status(a, backfill_id, "rows_done") >= 1, what="a page committed")
    b.execute("SELECT pg_terminate_backend(%s)", [old])
    wait_for(lambda: old not in [r["pid"] for r in progress(b)], what="the terminated worker's row to go")
    delivered = status(a, backfill_id, "rows_done")  # by the terminated worker, committed
    # The postmaster starts it again a second later: a row of its own, which carries on from the
    # cursor (the range's rows count those delivered before it).
    new = wait_for(lambda: next((r for r in progress(b, backfill_id) if r["phase"] == "scanning"), None),
                   what="the restarted worker")
    assert new["pid"] != old and [r["pid"] for r in progress(b, backfill_id)] == [new["pid"]]
    assert new["rows_done"] >= delivered >= 1


def test_a_worker_killed_with_sigkill_leaves_no_row_after_the_server_restarts(preloaded, a):
    backfill_id = paced(a)
    old = scanning(a, backfill_id)["pid"]
    os.kill(old, signal.SIGKILL)  # the postmaster restarts every process and resets shared memory

    def crashed():
        try:
            a.execute("SELECT 1")
        except psycopg.OperationalError:
            return True  # terminated by the postmaster's reset
        return False

    wait_for(crashed, what="the postmaster to reset the server")

    def reconnected():
        with suppress(psycopg.Error):
            return preloaded.connect("b")
        return None

    b = wait_for(reconnected, timeout=60, what="the server to restart")
    try:
        # The preloaded library resumes the backfill: a new worker, and no row of the killed one.
        new = wait_for(lambda: next((r for r in progress(b, backfill_id) if r["phase"] == "scanning"), None),
                       timeout=60, what="the resumed worker")
        assert new["pid"] != old
        assert old not in [r["pid"] for r in progress(b)]
    finally:
        b.close()


def test_two_parallel_workers_give_two_rows(a, b):
    backfill_id = paced(a, parallel=2)
    rows = wait_for(lambda: [r for r in progress(b, backfill_id) if r["phase"] == "scanning"] if
                    len([r for r in progress(b, backfill_id) if r["phase"] == "scanning"]) == 2 else None,
                    what="both workers scanning")
    assert [r["worker"] for r in rows] == [0, 1]
    assert len({r["pid"] for r in rows}) == 2 and len({r["position"] for r in rows}) == 2
    ranges = dict(a.execute("SELECT position, rows_estimated FROM backfill_tables WHERE backfill_id = %s",
                            [backfill_id]).fetchall())
    for row in rows:
        assert row["rows_total"] >= ranges[row["position"]]


def test_a_backfill_held_back_by_its_consumer_shows_waiting_for_consumer(a, b):
    a.execute("SELECT pg_create_logical_replication_slot('away', 'test_decoding')")
    try:
        backfill_id = start(a, slot="'away'")
        row = wait_for(lambda: next((r for r in progress(b, backfill_id) if r["phase"] == "waiting for consumer"),
                                    None), what="the worker to wait for the consumer")
        assert row["rows_done"] == 0 and row["relid"] is not None
        assert status(a, backfill_id, "waiting_kind") == "consumer_away"
    finally:
        a.execute("SELECT backfill_cancel(id) FROM backfill_status WHERE state = 'running'")
        wait_for(lambda: not progress(a), what="the worker to exit")
        a.execute("SELECT pg_drop_replication_slot('away')")


def test_each_role_sees_the_workers_backfill_status_shows_it(preloaded, a, b, logins):
    """pg_monitor and superusers see every worker; any other role the workers of backfills started
    by a role it may act as, in databases it may CONNECT to; another database's owner nothing more."""
    operator = logins("mon_operator")
    a.execute(readme_grants("operator", operator))
    a.execute("DROP TABLE IF EXISTS u; CREATE TABLE u AS SELECT * FROM t; ALTER TABLE u ADD PRIMARY KEY (id)")
    a.execute(f"GRANT SELECT, UPDATE ON u TO {operator}")
    least = logins("mon_least")
    monitor = logins("mon_monitor")
    b.execute(f"GRANT pg_monitor TO {monitor}")
    owner = logins("mon_owner", "CREATEDB")
    with preloaded.connect() as admin:
        admin.execute(f"ALTER DATABASE b OWNER TO {owner}")
    try:
        theirs = paced(a)
        with connect_as(preloaded, operator, "a") as op_a:
            ours = paced(op_a, "u")
        member = logins("mon_member")
        b.execute(f"GRANT {operator} TO {member}")
        scanning(b, theirs)
        scanning(b, ours)
        # The superuser, and a pg_monitor member from either database, see both.
        assert {r["backfill_id"] for r in progress(b)} == {theirs, ours}
        for database in ("a", "b"):
            with connect_as(preloaded, monitor, database) as conn:
                assert {r["backfill_id"] for r in progress(conn)} == {theirs, ours}
        # The operator, and a member of it, see the operator's own backfill, from a and from b.
        for role in (operator, member):
            for database in ("a", "b"):
                with connect_as(preloaded, role, database) as conn:
                    rows = progress(conn)
                    assert [r["backfill_id"] for r in rows] == [ours], (role, database)
                    assert rows[0]["rows_done"] >= 1 and rows[0]["datname"] == "a"
        # A least-rights role, and the owner of database b, see none.
        for role in (least, owner):
            with connect_as(preloaded, role, "b") as conn:
                assert progress(conn) == []
                assert conn.execute("SELECT count(*) FROM backfill.progress()").fetchone()[0] == 0
        # Without CONNECT on a, the operator no longer sees its backfill there, from b.
        with preloaded.connect() as admin:
            admin.execute("REVOKE CONNECT ON DATABASE a FROM PUBLIC")
        with connect_as(preloaded, operator, "b") as conn:
            assert progress(conn) == []
            assert conn.execute("SELECT count(*) FROM backfill.progress()").fetchone()[0] == 0
    finally:
        # Before the roles go: dropping the operator's grants would fail its backfill.
        a.execute("SELECT backfill_cancel(id) FROM backfill_status WHERE state = 'running'")
        wait_for(lambda: not progress(a), what="every worker to exit")
        with preloaded.connect() as admin:
            admin.execute("ALTER DATABASE b OWNER TO postgres")


def test_without_preloading_the_view_errors_and_says_what_it_needs(db):
    """The session's cluster does not preload pg_backfill: no shared memory, no progress to show.
    An error, not an empty view: backfills run there without preloading, and an empty view
    would tell a monitoring system that none does."""
    e = error_of(db, "SELECT * FROM backfill_progress")
    assert e.sqlstate == "55000"
    assert "shared_preload_libraries" in e.diag.message_primary
    assert "backfill_status" in e.diag.message_detail
    assert "shared_preload_libraries" in e.diag.message_hint


# --- docs/monitoring/: the query files, every query run against a running backfill ----------

MONITORING = ROOT / "docs" / "monitoring"


def test_the_postgres_exporter_queries_run_and_give_the_views_figures(a, b):
    queries = yaml.safe_load((MONITORING / "postgres_exporter.yaml").read_text())
    assert queries, "no query in postgres_exporter.yaml"
    backfill_id = paced(a)
    scanning(b, backfill_id, rows=20)
    for name, spec in queries.items():
        assert set(spec) <= {"query", "metrics", "master", "cache_seconds"}, name
        cursor = b.execute(spec["query"])
        columns = [c.name for c in cursor.description]
        rows = [dict(zip(columns, row)) for row in cursor.fetchall()]
        named = [next(iter(metric)) for metric in spec["metrics"]]
        assert sorted(named) == sorted(columns), (name, named, columns)
        for metric in spec["metrics"]:
            (column, usage), = ((k, v["usage"]) for k, v in metric.items())
            assert usage in {"LABEL", "GAUGE", "COUNTER"}, (name, column)
            assert metric[column].get("description"), (name, column)
            if usage != "LABEL":
                assert all(isinstance(r[column], (int, float)) for r in rows), (name, column)
        check_rows(name, rows, backfill_id, b)


def test_the_sql_exporter_collector_runs_and_gives_the_views_figures(a, b):
    collector = yaml.safe_load((MONITORING / "pg_backfill.collector.yml").read_text())
    assert collector["collector_name"] and collector["metrics"]
    queries = {q["query_name"]: q["query"] for q in collector.get("queries", [])}
    backfill_id = paced(a)
    scanning(b, backfill_id, rows=20)
    for metric in collector["metrics"]:
        assert metric["type"] in {"gauge", "counter"} and metric["help"], metric["metric_name"]
        sql = metric.get("query") or queries[metric["query_ref"]]
        cursor = b.execute(sql)
        columns = [c.name for c in cursor.description]
        rows = [dict(zip(columns, row)) for row in cursor.fetchall()]
        needed = set(metric.get("key_labels", [])) | set(metric.get("values", []))
        if "value_label" not in metric:
            assert len(metric["values"]) == 1, metric["metric_name"]
        assert needed <= set(columns), (metric["metric_name"], needed - set(columns))
        for value in metric["values"]:
            assert all(isinstance(r[value], (int, float)) for r in rows), (metric["metric_name"], value)
        check_rows(metric["metric_name"], rows, backfill_id, b)


def check_rows(name, rows, backfill_id, conn):
    """The query's rows for a running backfill agree with backfill_progress's: its worker is there,
    with its database, phase and figures (read after the query's, so at least as large)."""
    views = progress(conn, backfill_id)
    assert views, "the backfill's worker is gone"
    worker = views[0]
    ours = [r for r in rows if str(r.get("backfill_id")) == str(backfill_id)]
    if "backfill_id" not in (rows[0] if rows else {}):
        # A summary over every worker (count by phase, say): it counts ours.
        assert rows and sum(r.get("workers", 0) for r in rows) >= 1, (name, rows)
        return
    assert len(ours) == 1, (name, rows)
    row = ours[0]
    assert row.get("datname", "a") == "a", (name, row)
    assert str(row.get("pid", worker["pid"])) == str(worker["pid"]), (name, row)
    for figure in ("rows_done", "bytes_done", "pages_done"):
        if figure in row:
            assert 1 <= row[figure] <= worker[figure], (name, figure, row, worker)
    if "rows_total" in row:
        assert row["rows_total"] == 3000, (name, row)
    if "phase" in row:
        assert row["phase"] in PHASES, (name, row)
