"""End-to-end scenarios against a real PostgreSQL server: 15, or PG_MAJOR (scripts/lib/pg_major.sh).

The session starts a throwaway cluster (scripts/lib/cluster.sh, server running as the postgres OS
user) with the extension installed by scripts/test.sh; every test gets a database of its own.
A major other than 15 runs in a directory and on ports of its own by default, so that the two
suites may share a machine.
"""

import itertools
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from contextlib import suppress
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parent.parent


def pg_major_value(expression: str) -> str:
    """A value from scripts/lib/pg_major.sh for the PG_MAJOR of this run: `$PG_BIN`, `$(pg_bin_of 15)`."""
    script = f"source '{ROOT}/scripts/lib/pg_major.sh' && echo \"{expression}\""
    return subprocess.run(["bash", "-c", script], check=True, capture_output=True, text=True).stdout.strip()


PG_MAJOR = int(pg_major_value("$PG_MAJOR"))
PG_BIN = pg_major_value("$PG_BIN")
# The root the server runs in ("" for the host; 17's Debian 13 root, see scripts/lib/pg_major.sh):
# the server's paths (pg_config's) are under it on the host. The host's /tmp is the root's, so
# the clusters' directories are the same paths on both sides.
PG_ROOT = pg_major_value("$PG_ROOT")
# Ports below Linux's ephemeral range (32768-60999), where no client's outgoing connection can
# hold them: 15433 for 15, 17433 for 17, 18433 for 18 (the major times 1,000, plus 433).
DEFAULT_SUFFIX, DEFAULT_PORT = ("", 15433) if PG_MAJOR == 15 else (str(PG_MAJOR), PG_MAJOR * 1000 + 433)
CLUSTER_DIR = os.environ.get("BACKFILL_TEST_DIR", f"/tmp/pg_backfill_test{DEFAULT_SUFFIX}")
PORT = int(os.environ.get("BACKFILL_TEST_PORT", str(DEFAULT_PORT)))
# Run in parallel (scripts/test.sh, pytest-xdist), each worker has a cluster of its own, and so
# its own directory and ports: worker k (k >= 1) sits WORKER_PORT_STEP * k below the run's port,
# its extra clusters with it, in the part of the major's thousand nothing else takes (below 433;
# the demo is at 440, the benchmarks at 450 and 460, the package tests at 590 and up).
MAX_WORKERS, WORKER_PORT_STEP = 3, 150
WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
if WORKER >= MAX_WORKERS:
    raise pytest.UsageError(f"the end-to-end tests run on at most {MAX_WORKERS} workers (ports; see conftest.py)")
if WORKER:
    CLUSTER_DIR, PORT = f"{CLUSTER_DIR}_w{WORKER}", PORT - WORKER_PORT_STEP * WORKER
_db_names = itertools.count()


def cluster_cmd(command: str, major: int = PG_MAJOR) -> None:
    """Runs a command of scripts/lib/cluster.sh with the programs of PostgreSQL `major`."""
    env = {**os.environ, "PG_MAJOR": str(major)}
    if major != PG_MAJOR:
        # BACKFILL_PG_BIN (and its BACKFILL_PG_ROOT) name another installation of this run's major only.
        env.pop("BACKFILL_PG_BIN", None)
        env.pop("BACKFILL_PG_ROOT", None)
    subprocess.run(["bash", "-c", f"source '{ROOT}/scripts/lib/cluster.sh' && {command}"], check=True, env=env)


class Cluster:
    """A throwaway cluster of this run's major, or of `major` (test_pg_upgrade.py's 15)."""

    def __init__(self, directory: str, port: int, major: int = PG_MAJOR):
        self.dir, self.port, self.major = directory, port, major

    def connect(self, dbname="postgres", **kw) -> psycopg.Connection:
        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=dbname, autocommit=True, **kw)

    def start(self, extra_conf: str = "", initdb_args: str = "") -> None:
        """`extra_conf`: postgresql.conf lines, in bash's $'...' (so \\n separates lines).

        A backfill started with no pacing option rests after each page while other sessions are
        active (backfill.default_duty_cycle): the tests' own writers would make it ten times
        slower. The test clusters turn that rest off; test_backpressure.py tests it."""
        extra_conf = "backfill.default_duty_cycle = 100" + (f"\\n{extra_conf}" if extra_conf else "")
        quoted = extra_conf.replace("'", "\\'")
        cluster_cmd(f"cluster_start '{self.dir}' {self.port} $'{quoted}' '{initdb_args}'", self.major)

    def stop(self) -> None:
        cluster_cmd(f"cluster_stop '{self.dir}'", self.major)

    def pg_ctl(self, *args: str) -> None:
        cluster_cmd(
            f"as_postgres \"$PG_BIN/pg_ctl\" -D '{self.dir}/data' -l '{self.dir}/server.log' -w {' '.join(args)} >/dev/null",
            self.major,
        )


# The test clusters besides the session's, each with a port of its own: the session's port
# plus 100 plus its place here (clear of the demo's, 15440, and of another major's run, 1,000 or more above).
EXTRA_CLUSTERS = ["replica", "standby1", "preload", "nopreload", "install", "huge", "pmdeath", "standby", "resumer",
                  "upgrade_old", "upgrade_new", "csub_primary", "csub_standby",
                  "citus_coordinator", "citus_worker1", "citus_worker2", "key_standby",
                  "failover_primary", "failover_standby", "monitoring", "migration_source", "wal_ahead"]


def extra_cluster(cluster: "Cluster", name: str, major: int = PG_MAJOR) -> Cluster:
    """Another cluster for one test (of this run's major, or of `major`), in a directory and on
    a port of its own (not yet started)."""
    return Cluster(f"{cluster.dir}_{name}", cluster.port + 100 + EXTRA_CLUSTERS.index(name), major=major)


def pytest_configure(config):
    config.addinivalue_line("markers", "cluster: starts a PostgreSQL cluster of its own (extra_cluster)")
    config.addinivalue_line("markers", "slow: takes more than about 10 seconds")
    config.addinivalue_line("markers", "exclusive: changes the installation that every cluster of the run loads "
                                       "(its library): runs after the parallel part, alone")


# The installcheck (`scripts/test.sh --installed`, BACKFILL_INSTALLED=1) runs against an installed
# release of pg_backfill, a package's: it leaves out the tests that need a build of this tree,
# each with what it needs. (A test id, or a file for all of its tests.)
NEEDS_THE_SOURCE_TREE = {
    "test_ordering.py::test_ordering_test_fails_without_row_locks":
        "the test hook backfill.test_skip_row_locks, which only a test_hooks build has",
    "test_filter.py::test_the_filtered_ordering_test_fails_without_row_locks":
        "the test hook backfill.test_skip_row_locks, which only a test_hooks build has",
    "test_upgrade.py": "earlier versions' install scripts (sql/history), which no package ships",
    "test_security_keys.py::test_no_decoder_receives_a_message_key_at_install_rotation_or_update":
        "0.9.0's install script (sql/history), which no package ships",
    "test_pg_upgrade.py": "a build of pg_backfill for PostgreSQL 15 (scripts/test.sh makes it)",
    "test_operations.py::test_installing_a_new_library_leaves_a_running_preloaded_server_up":
        "to replace the installed library (scripts/lib/install.sh), which a package owns",
}
INSTALLED = os.environ.get("BACKFILL_INSTALLED") == "1"


# scripts/test.sh runs the suite in two phases: BACKFILL_TEST_PHASE=parallel (on several workers)
# all but the exclusive tests, then BACKFILL_TEST_PHASE=exclusive those alone. Unset: all of them.
TEST_PHASE = os.environ.get("BACKFILL_TEST_PHASE", "")


def deselect_by_phase(config, items):
    if TEST_PHASE not in ("parallel", "exclusive"):
        return
    keep = [item for item in items if (item.get_closest_marker("exclusive") is not None) == (TEST_PHASE == "exclusive")]
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep


def pytest_collection_modifyitems(config, items):
    deselect_by_phase(config, items)
    if not INSTALLED:
        return
    for item in items:
        test_id = item.nodeid.split("/")[-1].split("[")[0]
        reason = NEEDS_THE_SOURCE_TREE.get(test_id) or NEEDS_THE_SOURCE_TREE.get(test_id.split("::")[0])
        if reason:
            item.add_marker(pytest.mark.skip(reason=f"installcheck: needs {reason}"))


# wal2json, the decoder most tests read the stream with, does not build against PostgreSQL 19's
# headers as released (its upstream issue is open): scripts/pg_root.sh builds it for the tests from
# its vendored source (../shared/vendor) with 19's renames. Without that source there is none: a
# test that needs it (its slot's plugin cannot be loaded) is then reported as skipped, saying why,
# not as failed; test_decoders.py and the tests that read with test_decoding or pgoutput still run.
WAL2JSON_MISSING_REASON = (f"no wal2json for PostgreSQL {PG_MAJOR} (it does not build as released, and "
                           "scripts/pg_root.sh found no vendored source to build with 19's renames): this test decodes with it")


def wal2json_installed() -> bool:
    pkglibdir = pg_major_value("$(\"$PG_BIN/pg_config\" --pkglibdir)")
    return Path(f"{PG_ROOT}{pkglibdir}/wal2json.so").exists()


WAL2JSON = wal2json_installed()


def needs_missing_wal2json(excinfo) -> bool:
    """Whether a test's error is wal2json's absence: loading it as a slot's decoder failed."""
    if WAL2JSON or excinfo is None:
        return False
    error = excinfo.value
    return isinstance(error, psycopg.errors.UndefinedFile) and "wal2json" in str(error)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.when in ("setup", "call") and needs_missing_wal2json(call.excinfo):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {WAL2JSON_MISSING_REASON}")


@pytest.fixture(scope="session")
def cluster():
    c = Cluster(CLUSTER_DIR, PORT)
    c.start()
    yield c
    c.stop()


@pytest.fixture
def db(cluster, request):
    """A fresh database with the extension; yields an autocommit connection to it."""
    name = f"t{next(_db_names)}_{request.node.name[:40]}".lower().replace("[", "_").replace("]", "").replace("-", "_")
    with cluster.connect() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    conn = cluster.connect(name)
    conn.execute("CREATE EXTENSION pg_backfill")
    yield conn
    conn.close()
    with cluster.connect() as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", [name]
        )
        for slot, in admin.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s", [name]).fetchall():
            # pg_terminate_backend() only signals: a consumer's walsender may still hold the slot.
            admin.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = %s AND active_pid IS NOT NULL", [slot])
            wait_for(lambda: admin.execute("SELECT active_pid IS NULL FROM pg_replication_slots WHERE slot_name = %s", [slot]).fetchone()[0], what="the slot's consumer to go")
            admin.execute("SELECT pg_drop_replication_slot(%s)", [slot])
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture
def scratch_database(cluster):
    """Makes databases of the test's own name and options (`scratch_database("x", "ENCODING ...")`),
    each dropped at teardown with whatever slots it has."""
    made = []

    def make(name: str, options: str = "") -> str:
        with cluster.connect() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{name}" {options}')
        made.append(name)
        return name

    yield make
    with cluster.connect() as admin:
        for name in made:
            for slot, in admin.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s", [name]).fetchall():
                with suppress(psycopg.Error):
                    admin.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = %s AND active_pid IS NOT NULL", [slot])
                    wait_for(lambda: admin.execute("SELECT active_pid IS NULL FROM pg_replication_slots WHERE slot_name = %s", [slot]).fetchone()[0], what="the slot's consumer to go")
                    admin.execute("SELECT pg_drop_replication_slot(%s)", [slot])
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def status(conn, backfill_id: int, *columns: str):
    """Columns (or expressions) of the backfill's row in backfill_status: one value, or a tuple."""
    row = conn.execute(f"SELECT {', '.join(columns)} FROM backfill_status WHERE id = %s", [backfill_id]).fetchone()
    return row if len(columns) > 1 else row[0]


def wait_until_ended(conn, backfill_id: int, timeout: float = 120) -> str:
    """Waits until the backfill is neither running nor paused; returns its final state."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = status(conn, backfill_id, "state")
        if state not in ("running", "paused"):
            return state
        time.sleep(0.05)
    raise AssertionError(f"backfill {backfill_id} still running after {timeout}s")


def wal2json_changes(conn, slot: str):
    """Consumes the slot with wal2json (format 2): one dict per change or message, in stream order."""
    rows = conn.execute(
        "SELECT data FROM pg_logical_slot_get_changes(%s, NULL, NULL, 'format-version', '2', 'include-transaction', 'false')",
        [slot],
    ).fetchall()
    return [json.loads(data) for data, in rows]


def backfill_messages(changes, prefix="backfill"):
    """The pg_backfill messages among decoded changes, parsed."""
    return [json.loads(c["content"]) for c in changes if c.get("action") == "M" and c.get("prefix") == prefix]


def as_reads(messages):
    """Parsed messages with each `reads` batch (rows_per_message > 1) replaced by its rows, each
    as the `read` it stands for: the batch's envelope with the row's key, data (and partition)."""
    expanded = []
    for m in messages:
        if m["op"] != "reads":
            expanded.append(m)
            continue
        envelope = {k: v for k, v in m.items() if k not in ("rows", "commit_lsn", "auth")}
        expanded.extend({**envelope, "op": "read", **row, "commit_lsn": m["commit_lsn"]} for row in m["rows"])
    return expanded


def assert_each_row_read_once(messages, ids, markers=("table_start", "table_end")):
    """The delivery guarantee, checked on a backfill's parsed messages: every id in `ids` read
    exactly once and no other, and each marker once (a cancelled scan has no end marker).
    Batches count as their rows."""
    messages = as_reads(messages)
    reads = Counter(m["data"]["id"] for m in messages if m["op"] == "read")
    ids = set(ids)
    assert not ids - set(reads), f"{len(ids - set(reads))} rows never read, e.g. {sorted(ids - set(reads))[:5]}"
    assert not set(reads) - ids, f"rows read that should not be: {sorted(set(reads) - ids)[:5]}"
    assert [k for k, n in reads.items() if n > 1] == [], "a row was read twice"
    assert Counter(m["op"] for m in messages if m["op"] != "read") == Counter(markers)


def messages_with_xids(lines, prefix="backfill"):
    """(xid, content) of each transactional message with `prefix` in test_decoding output
    (with its default include-xids: each transaction's BEGIN line names its xid), in order.
    Lines may be str or bytes (a file of another encoding's table changes); contents come back
    in the same kind."""
    xid, messages = None, []
    for line in lines:
        as_kind = (lambda text: text.encode()) if isinstance(line, bytes) else (lambda text: text)
        if line.startswith(as_kind("BEGIN ")):
            xid = int(line.split()[1])
        elif line.startswith(as_kind(f"message: transactional: 1 prefix: {prefix},")):
            messages.append((xid, line.rstrip(as_kind("\n")).split(as_kind(" content:"), 1)[1]))
    return messages


def at_earlier_version(db, version):
    """The `db` fixture's database with pg_backfill at an earlier version, as a database not yet
    updated after the library was: its SQL calls the entry points that version declared."""
    db.execute("DROP EXTENSION pg_backfill")
    db.execute(f"CREATE EXTENSION pg_backfill VERSION '{version}'")


def error_of(conn, sql, params=None) -> psycopg.Error:
    """The error a statement raises (the test fails if it raises none)."""
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(sql, params)
    return caught.value


def wait_for(predicate, timeout=30, what="condition"):
    """Polls until `predicate` returns something true, and returns that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def worker_pid(conn, backfill_id: int):
    """A worker process of backfill `backfill_id` of `conn`'s database, or None when it has none:
    any of its workers (`pg_backfill 7`, `pg_backfill 7/1`), admitted or launched and not yet
    admitted (`pg_backfill starting 7`, `pg_backfill starting 7/1`; src/worker/activity.rs names
    them), the first admitted one first. (A process not yet connected has no database yet.)"""
    row = conn.execute(
        """SELECT pid FROM pg_stat_activity
            WHERE backend_type = 'pg_backfill' AND (datname = current_database() OR datname IS NULL)
              AND application_name ~ %s
            ORDER BY application_name ~ '^pg_backfill starting ', application_name LIMIT 1""",
        [rf"^pg_backfill (starting )?{int(backfill_id)}(/[0-9]+)?$"],
    ).fetchone()
    return row[0] if row else None


GRANT_BLOCKS = {"operator": "etl", "consumer": "consumer"}  # grant block: the role it is written for
GRANTS_DOC = "docs/security.md"  # where the grant blocks are printed (the README links to them)


def doc_block(doc, name) -> str:
    """The ```sql block of `doc` (a path from the repository's root) after
    `<!-- {name}: the tests run this block -->`, as the docs print it."""
    text = (ROOT / doc).read_text()
    marker = f"<!-- {name}: the tests run this block -->"
    assert text.count(marker) == 1, f"{doc} must have the line {marker} exactly once"
    block = re.match(r"\s*```sql\n(.*?)\n```", text[text.index(marker) + len(marker) :], re.S)
    assert block, f"{doc}: no ```sql block right after {marker}"
    return block[1]


def readme_grants(kind, role) -> str:
    """The ```sql block of docs/security.md after `<!-- {kind} grants: the tests run this block -->`, for `role`."""
    return re.sub(rf"\b{GRANT_BLOCKS[kind]}\b", role, doc_block(GRANTS_DOC, f"{kind} grants"))


class Background:
    """`count` threads, each running self.run(index, count), while a `with` block runs; at its end
    self.stop is set and they are joined."""

    def __init__(self, count):
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(w, count)) for w in range(count)]

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join()


class Roles:
    """LOGIN roles for one test. Roles are cluster-wide, so each name carries the test database's
    number; at teardown each is stripped of what it owns or was granted here, then dropped."""

    def __init__(self, cluster, db):
        self.cluster, self.db, self.names, self.conns = cluster, db, [], []
        self.suffix = db.info.dbname.split("_")[0]

    def create(self, base, *grants):
        """A role; `grants` names grant blocks of docs/security.md ("operator", "consumer") run for it as postgres."""
        name = f"{base}_{self.suffix}"
        self.db.execute(f"CREATE ROLE {name} LOGIN")
        self.names.append(name)
        for kind in grants:
            self.db.execute(readme_grants(kind, name))
        return name

    def connect(self, role):
        conn = psycopg.connect(
            host="127.0.0.1", port=self.cluster.port, user=role, dbname=self.db.info.dbname, autocommit=True
        )
        self.conns.append(conn)
        return conn

    def drop(self):
        for conn in self.conns:
            with suppress(Exception):
                conn.close()
        with suppress(psycopg.Error):
            self.db.execute("SELECT backfill_cancel(id) FROM backfill.job WHERE state IN ('running', 'paused')")
        with suppress(psycopg.Error):
            self.db.execute("SET lock_timeout = '10s'")
        for name in self.names:
            with suppress(psycopg.Error):
                self.db.execute(f"REASSIGN OWNED BY {name} TO postgres; DROP OWNED BY {name}")
            with suppress(psycopg.Error), self.cluster.connect() as admin:
                admin.execute(f"DROP ROLE IF EXISTS {name}")


@pytest.fixture
def roles(cluster, db):
    r = Roles(cluster, db)
    yield r
    r.drop()


PG_RECVLOGICAL = f"{PG_BIN}/pg_recvlogical"


class Consumer:
    """A real streaming consumer of a test_decoding slot: pg_recvlogical, confirming every second."""

    def __init__(self, cluster, dbname, slot):
        self.cluster, self.slot = cluster, slot
        self.output = tempfile.NamedTemporaryFile(mode="r", suffix=".log", delete=False)
        self.process = subprocess.Popen(
            [PG_RECVLOGICAL, "-h", "127.0.0.1", "-p", str(cluster.port), "-U", "postgres", "-d", dbname,
             "--slot", slot, "--start", "-s", "1", "-F", "1", "-f", self.output.name],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def pause(self):
        self.process.send_signal(signal.SIGSTOP)

    def carry_on(self):
        self.process.send_signal(signal.SIGCONT)

    def stop(self):
        """Ends pg_recvlogical and waits until its walsender has let the slot go: the walsender
        exits after its client, so a slot dropped at once may still be active."""
        self.process.send_signal(signal.SIGCONT)
        self.process.terminate()
        self.process.wait(10)
        with self.cluster.connect() as admin:
            wait_for(lambda: admin.execute(
                "SELECT coalesce(bool_and(active_pid IS NULL), true) FROM pg_replication_slots WHERE slot_name = %s",
                [self.slot]).fetchone()[0], what=f"slot {self.slot}'s walsender to let it go")

    def messages(self):
        """The backfill's messages, parsed. Each must be UTF-8 (json.loads of bytes insists), while
        test_decoding's lines for table changes are in the database's encoding."""
        with open(self.output.name, "rb") as f:
            return [
                json.loads(line.split(b" content:", 1)[1])
                for line in f
                if line.startswith(b"message: transactional: 1 prefix: backfill,")
            ]
