"""pg_createsubscriber (17+) with a backfill running on the primary: the README's procedure
("Across pg_upgrade and pg_createsubscriber").

A physical standby holds a copy of the primary's state tables, so the converted server starts
with the primary's running backfill listed as its own. Preloaded there, the launcher would run
that copy on the subscriber's tables (pg_createsubscriber starts the server itself to promote
it): the standby is converted without preloading, the copy is cancelled on the subscriber, and
preloading is restored. The primary's backfill carries on, each row once.
"""

import subprocess

import pytest

from conftest import (PG_BIN, PG_MAJOR, assert_each_row_read_once, backfill_messages, extra_cluster, status, wait_for,
                      wait_until_ended, wal2json_changes)

pytestmark = pytest.mark.skipif(PG_MAJOR < 17, reason="pg_createsubscriber is new in PostgreSQL 17")

ROWS = 6000


def as_postgres(*args: str, cwd: str) -> None:
    result = subprocess.run(["sudo", "-u", "postgres", *args], cwd=cwd, capture_output=True, text=True)
    assert result.returncode == 0, f"{args[0]} failed: {result.stdout}{result.stderr}"


@pytest.mark.cluster
@pytest.mark.slow
def test_a_standby_made_a_subscriber_does_not_run_the_primarys_backfill_again(cluster):
    primary = extra_cluster(cluster, "csub_primary")
    standby = extra_cluster(cluster, "csub_standby")
    try:
        primary.start("shared_preload_libraries = 'pg_backfill'")
        with primary.connect() as admin:
            admin.execute("CREATE DATABASE app")
        with primary.connect("app") as conn:
            conn.execute(
                f"""CREATE EXTENSION pg_backfill;
                    CREATE TABLE items (id bigint PRIMARY KEY, v text NOT NULL);
                    INSERT INTO items SELECT g, 'x' FROM generate_series(1, {ROWS}) g;"""
            )
            conn.execute("SELECT pg_create_logical_replication_slot('consumer', 'wal2json')")
            backfill_id = conn.execute(
                "SELECT backfill_start('items', confirm => true, batch_size => 20, rows_per_second => 20)"
            ).fetchone()[0]
            wait_for(lambda: status(conn, backfill_id, "rows_done") > 0, what="the backfill to start")

            # A streaming standby of it, caught up, then stopped (pg_createsubscriber's input).
            subprocess.run(["bash", "-c", f"rm -rf '{standby.dir}' && mkdir -p '{standby.dir}' && chown postgres: '{standby.dir}'"],
                           check=True)
            as_postgres(f"{PG_BIN}/pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
                        "-D", f"{standby.dir}/data", "-R", "-X", "stream", cwd=standby.dir)
            with open(f"{standby.dir}/data/postgresql.auto.conf", "a") as conf:
                # The README's step: the standby is converted without preloading pg_backfill.
                conf.write(f"port = {standby.port}\nunix_socket_directories = '{standby.dir}'\n"
                           "shared_preload_libraries = ''\n")
            standby.pg_ctl("start")
            with standby.connect("app") as on_standby:
                wait_for(lambda: status(on_standby, backfill_id, "rows_done") > 0, what="the standby to replay the backfill")
            standby.pg_ctl("-m fast stop")

            as_postgres(f"{PG_BIN}/pg_createsubscriber", "--pgdata", f"{standby.dir}/data", "--database", "app",
                        "--publisher-server", f"host=127.0.0.1 port={primary.port} user=postgres dbname=app",
                        "--subscriber-port", str(standby.port), "--subscriber-username", "postgres",
                        "--socketdir", standby.dir, cwd=standby.dir)
            standby.pg_ctl("start")
            with standby.connect("app") as subscriber:
                assert subscriber.execute("SELECT pg_is_in_recovery()").fetchone()[0] is False
                # The copy is listed as running, with no worker: cancelled here, for good.
                assert status(subscriber, backfill_id, "state", "workers_running") == ("running", 0)
                subscriber.execute("SELECT backfill_cancel(%s)", [backfill_id])
                assert status(subscriber, backfill_id, "state") == "cancelled"
            # Preloading restored, the subscriber starts no worker for it.
            with open(f"{standby.dir}/data/postgresql.auto.conf", "a") as conf:
                conf.write("shared_preload_libraries = 'pg_backfill'\n")
            standby.pg_ctl("-m fast restart")
            with standby.connect("app") as subscriber:
                assert subscriber.execute("SHOW shared_preload_libraries").fetchone()[0] == "pg_backfill"
                assert status(subscriber, backfill_id, "state", "workers_running") == ("cancelled", 0)
                # The subscription applies the primary's changes.
                conn.execute("INSERT INTO items VALUES (%s, 'after')", [ROWS + 1])
                wait_for(lambda: subscriber.execute("SELECT count(*) FROM items WHERE v = 'after'").fetchone()[0] == 1,
                         what="the subscription to apply")

            # The primary's backfill is its own, unaffected: each row once through its slot.
            # (Paced slowly so that it runs through the conversion; now it may hurry.)
            assert status(conn, backfill_id, "state") == "running"
            conn.execute("SELECT backfill_set(%s, rows_per_second => 0)", [backfill_id])
            assert wait_until_ended(conn, backfill_id) == "done"
            assert_each_row_read_once(backfill_messages(wal2json_changes(conn, "consumer")), range(1, ROWS + 1))
    finally:
        standby.stop()
        primary.stop()
