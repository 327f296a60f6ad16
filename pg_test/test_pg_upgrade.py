"""pg_upgrade from PostgreSQL 15 to this run's major, with backfills in the state tables.

Runs in a run of a newer major (PG_MAJOR=18) on a machine with Debian's 15 as well. The 15 cluster
loads pg_backfill from the package scripts/test.sh built for 15 (BACKFILL_PG15_PACKAGE), so that
nothing is written into the system's PostgreSQL 15: Debian's extension_destdir finds the control
and SQL files and `$libdir/pg_backfill` there, and dynamic_library_path the library by its bare
name, as shared_preload_libraries and the workers name it (without it, they loaded the system's
copy as well, a second library: "attempt to redefine parameter").

The test does what docs/operations.md tells a DBA to do ("Across pg_upgrade"): pg_upgrade from 15 carries
no replication slot, so the consumer reads its slot to the end before the upgrade, and the slot
is created again, under the same name, before the paused backfill is resumed. A backfill that was
started for that slot (`slot =>`) cannot go on: the slot made after the upgrade is another one.
"""

import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from conftest import (PG_BIN, PG_MAJOR, PG_ROOT, Consumer, assert_each_row_read_once, doc_block, extra_cluster, messages_with_xids, pg_major_value,
                      status, wait_for, wait_until_ended)

OLD_MAJOR = 15
OLD_BIN = pg_major_value(f"$(pg_bin_of {OLD_MAJOR})")
PACKAGE = os.environ.get("BACKFILL_PG15_PACKAGE", "")

pytestmark = pytest.mark.skipif(
    PG_MAJOR == OLD_MAJOR or not Path(f"{OLD_BIN}/postgres").exists() or not PACKAGE
    or PG_ROOT != pg_major_value(f"$(pg_root_of {OLD_MAJOR})"),
    reason="needs a run of a newer major, PostgreSQL 15 installed and pg_backfill's 15 package (scripts/test.sh), "
           "both majors on one system (pg_upgrade runs both servers' programs; 17's run in a Debian 13 root)",
)

FINISHED_ROWS, PAUSED_ROWS = 500, 20000
REFUSAL = "pg_backfill: not resuming backfills in binary upgrade mode"


def caught_up(conn, slot: str):
    """Waits until the slot's streaming consumer has confirmed all WAL written so far."""
    target = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    wait_for(
        lambda: conn.execute(
            "SELECT confirmed_flush_lsn >= %s FROM pg_replication_slots WHERE slot_name = %s", [target, slot]
        ).fetchone()[0],
        what=f"the consumer of {slot} to catch up",
    )


def as_postgres(*args: str, cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sudo", "-u", "postgres", *args], cwd=cwd, capture_output=True, text=True)


@pytest.mark.cluster
@pytest.mark.slow
def test_a_paused_backfill_resumes_after_pg_upgrade_from_15_and_delivers_each_row_once(cluster):
    preload = "shared_preload_libraries = 'pg_backfill'"
    old = extra_cluster(cluster, "upgrade_old", major=OLD_MAJOR)
    new = extra_cluster(cluster, "upgrade_new")
    consumers = []
    try:
        # 15, with pg_backfill preloaded: one backfill finished, one paused half way, one for the
        # slot paused too; a consumer streams the database's slot.
        libdir = subprocess.run([f"{OLD_BIN}/pg_config", "--pkglibdir"], capture_output=True, text=True, check=True).stdout.strip()
        old.start(f"{preload}\\nextension_destdir = '{PACKAGE}'\\ndynamic_library_path = '{PACKAGE}{libdir}:$libdir'")
        with old.connect() as admin:
            admin.execute("CREATE DATABASE app")
        with old.connect("app") as conn:
            conn.execute(
                f"""CREATE EXTENSION pg_backfill;
                    CREATE TABLE finished (id bigint PRIMARY KEY, body text NOT NULL);
                    INSERT INTO finished SELECT g, 'f' || g FROM generate_series(1, {FINISHED_ROWS}) g;
                    CREATE TABLE pending (id bigint PRIMARY KEY, body text NOT NULL);
                    INSERT INTO pending SELECT g, repeat('p', 50) FROM generate_series(1, {PAUSED_ROWS}) g;
                    CREATE TABLE for_slot (id bigint PRIMARY KEY);
                    INSERT INTO for_slot SELECT generate_series(1, {PAUSED_ROWS});"""
            )
            conn.execute("SELECT pg_create_logical_replication_slot('pipe', 'test_decoding')")
            consumers.append(Consumer(old, "app", "pipe"))
            finished_id = conn.execute("SELECT backfill_start('finished', confirm => true)").fetchone()[0]
            assert wait_until_ended(conn, finished_id) == "done"
            paused_id = conn.execute(
                "SELECT backfill_start('pending', confirm => true, batch_size => 200, rows_per_second => 4000)"
            ).fetchone()[0]
            wait_for(lambda: status(conn, paused_id, "rows_done") >= 2000, what="the second backfill to get going")
            conn.execute("SELECT backfill_pause(%s)", [paused_id])
            wait_for(lambda: status(conn, paused_id, "state") == "paused" and status(conn, paused_id, "worker_pid") is None,
                     what="the pause")
            rows_at_pause = status(conn, paused_id, "rows_done")
            assert 0 < rows_at_pause < PAUSED_ROWS
            slot_bound_id = conn.execute(
                "SELECT backfill_start('for_slot', confirm => true, slot => 'pipe', batch_size => 200, rows_per_second => 4000)"
            ).fetchone()[0]
            wait_for(lambda: status(conn, slot_bound_id, "rows_done") >= 1000, what="the backfill for the slot to get going")
            conn.execute("SELECT backfill_pause(%s)", [slot_bound_id])
            wait_for(lambda: status(conn, slot_bound_id, "state") == "paused" and status(conn, slot_bound_id, "worker_pid") is None,
                     what="the pause")
            # Two message keys, kept in sequences, which pg_upgrade must carry with their values.
            conn.execute("SELECT backfill_rotate_key()")
            keys = conn.execute("SELECT id, key FROM backfill.message_key ORDER BY id").fetchall()
            assert len(keys) == 2
            # Before the upgrade the consumer reads its slot to the end: the slot stays behind.
            caught_up(conn, "pipe")
        consumers[0].stop()
        before = consumers[0].messages()
        # This machine's 15 marks every column with an option 18 does not know (pg_attver):
        # the step docs/operations.md gives for such a 15, in every database.
        for dbname in ("postgres", "app"):
            with old.connect(dbname) as conn:
                conn.execute(doc_block("docs/operations.md", "pg_upgrade attver"))
        old.pg_ctl("-m fast stop")  # pg_upgrade needs a clean shutdown

        # The new major's cluster, stopped, with the old one's settings. (18's initdb turns data
        # checksums on by default; 15's did not, and pg_upgrade requires the same setting.)
        new.start(preload, initdb_args="--no-data-checksums" if PG_MAJOR >= 18 else "")
        new.pg_ctl("-m fast stop")
        upgrade = as_postgres(
            f"{PG_BIN}/pg_upgrade", "--old-bindir", OLD_BIN, "--new-bindir", PG_BIN,
            "--old-datadir", f"{old.dir}/data", "--new-datadir", f"{new.dir}/data",
            "--old-port", str(old.port), "--new-port", str(new.port), "--username", "postgres",
            "--socketdir", new.dir, "--retain", cwd=new.dir,
        )
        assert upgrade.returncode == 0, upgrade.stdout + upgrade.stderr
        # Both servers that pg_upgrade started in binary-upgrade mode loaded the library and
        # its launcher declined to run.
        server_logs = "".join(p.read_text() for p in Path(f"{new.dir}/data").glob("pg_upgrade_output.d/*/log/pg_upgrade_server.log"))
        assert server_logs.count(REFUSAL) >= 2, server_logs[-3000:]

        new.pg_ctl("start")
        with new.connect("app") as conn:
            assert conn.execute("SHOW server_version_num").fetchone()[0].startswith(str(PG_MAJOR))
            # The state tables came across: the finished backfill is done, the paused one holds
            # its cursor. The slot did not come across.
            assert status(conn, finished_id, "state", "rows_done") == ("done", FINISHED_ROWS)
            assert status(conn, paused_id, "state", "rows_done") == ("paused", rows_at_pause)
            assert conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone()[0] == 0
            assert conn.execute("SELECT id, key FROM backfill.message_key ORDER BY id").fetchall() == keys
            with open(consumers[0].output.name, "rb") as output:
                signed_on_15 = [(xid, content.decode()) for xid, content in messages_with_xids(output)]
            assert signed_on_15 and all(
                conn.execute("SELECT backfill_message_valid(%s, %s)", [content, xid]).fetchone()[0] for xid, content in signed_on_15
            )
            # The DBA creates the pipeline's slot again and its consumer connects, then resumes.
            conn.execute("SELECT pg_create_logical_replication_slot('pipe', 'test_decoding')")
            consumers.append(Consumer(new, "app", "pipe"))
            conn.execute("SELECT backfill_resume(%s)", [paused_id])
            assert wait_until_ended(conn, paused_id) == "done"
            assert status(conn, paused_id, "rows_done") == PAUSED_ROWS
            # The backfill for the old slot refuses the new one: what the old slot's consumer
            # had not confirmed would never reach it (docs/operations.md: "the slot dropped and created
            # again").
            conn.execute("SELECT backfill_resume(%s)", [slot_bound_id])
            assert wait_until_ended(conn, slot_bound_id) == "failed"
            sqlstate, error = status(conn, slot_bound_id, "last_error_sqlstate", "last_error")
            assert sqlstate == "55000" and "dropped and created again" in error, error
            caught_up(conn, "pipe")
        consumers[1].stop()
        after = consumers[1].messages()

        of = lambda messages, backfill_id: [m for m in messages if m["backfill_id"] == backfill_id]  # noqa: E731
        assert of(after, finished_id) == [] and [m for m in of(after, slot_bound_id) if m["op"] == "read"] == []
        assert_each_row_read_once(of(before, finished_id), range(1, FINISHED_ROWS + 1))
        assert Counter(m["op"] for m in of(before, paused_id))["read"] == rows_at_pause
        assert_each_row_read_once(of(before, paused_id) + of(after, paused_id), range(1, PAUSED_ROWS + 1))
    finally:
        for consumer in consumers:
            if consumer.process.poll() is None:
                consumer.stop()
        old.stop()
        new.stop()
