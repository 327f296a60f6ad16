"""The reference consumer (consumer/pg_backfill_apply.py) against real servers: its errors, and
the migration rehearsal of docs/migrating.md: a source under writes, a new database in another
cluster as the destination, the consumer applying a pipeline's backfill of every table, the
consumer and the backfill's worker killed (SIGKILL) mid-run and started again, then
backfill_compare and backfill_repair proving the copy exact.

Nothing here waits on the machine's speed: the backfill goes slowly until the writers and the
scan have reached counts of operations and rows, then fast; each kill waits on such counts too."""

import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import psycopg
import pytest

from conftest import PG_BIN, ROOT, Background, extra_cluster, status, wait_for, worker_pid

CONSUMER = ROOT / "consumer" / "pg_backfill_apply.py"
ITEMS = 20_000  # even ids 2..40000; the writers insert odd ids
NOTES = 200  # rows with a TOASTed body: updates that leave it out arrive without it


def consumer_command(source_dsn, destination_dsn, slot="migrate", publication="migrate"):
    return [sys.executable, str(CONSUMER), "--source", source_dsn, "--slot", slot, "--publication", publication,
            "--destination", destination_dsn, "--progress", "1"]


def run_consumer_once(*args, **kw):
    return subprocess.run(consumer_command(*args, **kw), capture_output=True, text=True, timeout=60)


def dsn(cluster, dbname):
    return f"host=127.0.0.1 port={cluster.port} user=postgres dbname={dbname}"


class Consumer:
    """The consumer as a service manager runs it: started again whenever it exits, until stopped.
    kill() SIGKILLs the running process."""

    def __init__(self, command):
        self.command, self.process, self.starts = command, None, 0
        self.log = tempfile.NamedTemporaryFile(mode="w+", suffix=".log", delete=False)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.supervise)
        self.thread.start()

    def supervise(self):
        while not self.stopping.is_set():
            self.starts += 1
            self.process = subprocess.Popen(self.command, stdout=self.log, stderr=self.log)
            self.process.wait()
            self.stopping.wait(0.3)

    def kill(self):
        self.process.send_signal(signal.SIGKILL)

    def stop(self):
        self.stopping.set()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.thread.join()

    def output(self):
        return Path(self.log.name).read_text()


class Writers(Background):
    """pgbench-like application traffic on the source: updates, inserts, deletes and key changes
    of items, updates of notes that leave the TOASTed body alone. A writer whose connection the
    server drops (a crash restart) connects again."""

    def __init__(self, cluster, dbname, count=2):
        super().__init__(count)
        self.cluster, self.dbname = cluster, dbname
        self.ops, self.reconnects, self.errors = 0, 0, []

    def run(self, writer, writers):
        rng = random.Random(writer)
        fresh = iter(range(2 * writer + 1, 10**9, 2 * writers))
        while not self.stop.is_set():
            try:
                with self.cluster.connect(self.dbname) as conn:
                    while not self.stop.is_set():
                        self.write(conn, rng, fresh)
                        self.ops += 1
            except psycopg.OperationalError:
                self.reconnects += 1
                self.stop.wait(0.2)
            except Exception as e:  # anything else is the test's failure
                self.errors.append(repr(e))
                return

    @staticmethod
    def write(conn, rng, fresh):
        dice, some_item = rng.random(), 2 * rng.randint(1, ITEMS)
        if dice < 0.4:
            conn.execute("UPDATE items SET v = v + 1 WHERE id = %s", [some_item])
        elif dice < 0.55:
            conn.execute("INSERT INTO items (id, payload) VALUES (%s, 'inserted')", [next(fresh)])
        elif dice < 0.65:
            conn.execute("DELETE FROM items WHERE id = %s", [some_item])
        elif dice < 0.75:
            conn.execute("UPDATE items SET id = %s, v = v + 1 WHERE id = %s", [next(fresh), some_item])
        elif dice < 0.9:
            conn.execute("UPDATE notes SET n = n + 1 WHERE id = %s", [rng.randint(1, NOTES)])
        else:
            with conn.transaction():
                conn.execute("INSERT INTO notes (n, body) VALUES (0, 'new note')")
                conn.execute("UPDATE items SET v = v + 1 WHERE id = %s", [some_item])


SCHEMA = """
    CREATE TABLE items (id bigint PRIMARY KEY, v int NOT NULL DEFAULT 0, payload text NOT NULL);
    CREATE TABLE notes (id serial PRIMARY KEY, n int NOT NULL, body text NOT NULL);
"""


def make_source(conn):
    conn.execute(SCHEMA)
    conn.execute(f"INSERT INTO items SELECT 2 * g, 0, md5(g::text) FROM generate_series(1, {ITEMS}) g")
    # Bodies of 6,400 hex digits: stored out of line (TOAST), so an update of n sends no body.
    conn.execute(f"""INSERT INTO notes (n, body)
                     SELECT 0, (SELECT string_agg(md5(g::text || ':' || i), '') FROM generate_series(1, 200) i)
                       FROM generate_series(1, {NOTES}) g""")
    conn.execute("ANALYZE items, notes")


def copy_schema(source_cluster, source_db, destination_cluster, destination_db):
    """docs/migrating.md's step: the tables' definitions, from pg_dump --schema-only."""
    ddl = subprocess.run([f"{PG_BIN}/pg_dump", "--schema-only", "-t", "items", "-t", "notes",
                          "-h", "127.0.0.1", "-p", str(source_cluster.port), "-U", "postgres", source_db],
                         check=True, capture_output=True, text=True).stdout
    subprocess.run([f"{PG_BIN}/psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1",
                    "-p", str(destination_cluster.port), "-U", "postgres", destination_db],
                   input=ddl, check=True, capture_output=True, text=True)


def link_destination(conn, destination_cluster, destination_db):
    """The destination's tables as foreign tables of the source (schema dest), for backfill_compare."""
    conn.execute("CREATE EXTENSION postgres_fdw; CREATE EXTENSION dblink")
    conn.execute(f"CREATE SERVER destination FOREIGN DATA WRAPPER postgres_fdw "
                 f"OPTIONS (host '127.0.0.1', port '{destination_cluster.port}', dbname '{destination_db}')")
    conn.execute("CREATE USER MAPPING FOR CURRENT_USER SERVER destination")
    conn.execute("CREATE SCHEMA dest")
    conn.execute("IMPORT FOREIGN SCHEMA public LIMIT TO (items, notes) FROM SERVER destination INTO dest")


def rows_of(conn, table):
    return sorted(conn.execute(f"SELECT * FROM {table}").fetchall())


def test_help_and_the_errors_a_user_can_make(cluster, db, scratch_database):
    help = subprocess.run([sys.executable, str(CONSUMER), "--help"], capture_output=True, text=True)
    assert help.returncode == 0 and "--slot" in help.stdout and "--destination" in help.stdout
    source = db.info.dbname
    destination = scratch_database("consumer_errors_dest")
    db.execute(SCHEMA + "CREATE PUBLICATION migrate FOR TABLE items, notes")
    db.execute("SELECT pg_create_logical_replication_slot('migrate', 'pgoutput')")
    with cluster.connect(destination) as conn:
        conn.execute(SCHEMA.split(";")[1])  # notes: items is the table the errors name

    def fails(result, *words):
        assert result.returncode == 2, result
        assert "Traceback" not in result.stderr and all(w in result.stderr for w in words), result.stderr

    # (A port nothing listens on: the next one's, and the run's ports are below the ephemeral range.)
    fails(run_consumer_once(f"host=127.0.0.1 port={cluster.port + 99} user=postgres dbname={source}",
                            dsn(cluster, destination)), "cannot connect to the source")
    fails(run_consumer_once(dsn(cluster, source), dsn(cluster, "no_such_database")),
          "cannot connect to the destination", "no_such_database")
    fails(run_consumer_once(dsn(cluster, source), dsn(cluster, destination), slot="no_slot"),
          "replication slot 'no_slot' does not exist", "pg_create_logical_replication_slot")
    fails(run_consumer_once(dsn(cluster, source), dsn(cluster, destination), publication="no_pub"),
          "publication 'no_pub' does not exist")
    fails(run_consumer_once(dsn(cluster, source), dsn(cluster, destination)),
          "table public.items does not exist at the destination")
    with cluster.connect(destination) as conn:
        conn.execute("CREATE TABLE items (id bigint, v int, payload text)")
    fails(run_consumer_once(dsn(cluster, source), dsn(cluster, destination)),
          "table public.items at the destination has no primary key")
    with cluster.connect(destination) as conn:
        conn.execute("ALTER TABLE items ADD PRIMARY KEY (id), DROP COLUMN payload")
    fails(run_consumer_once(dsn(cluster, source), dsn(cluster, destination)),
          "table public.items at the destination has no column payload")
    # A message with pg_backfill's prefix and a tag that does not verify: refused, status 3,
    # nothing after it applied.
    with cluster.connect(destination) as conn:
        conn.execute("ALTER TABLE items ADD COLUMN payload text NOT NULL")
    db.execute("""SELECT pg_logical_emit_message(true, 'backfill', '{"op":"read","backfill_id":1,"schema":"public",'
                  '"table":"items","key":{"id":1},"data":{"id":1,"v":0,"payload":"forged"},"commit_lsn":"0/0",'
                  '"auth":"1:' || repeat('0', 64) || '"}')""")
    db.execute("INSERT INTO items VALUES (2, 0, 'after the forged message')")
    forged = run_consumer_once(dsn(cluster, source), dsn(cluster, destination))
    assert forged.returncode == 3 and "failed its authentication check" in forged.stderr, forged
    with cluster.connect(destination) as conn:
        assert conn.execute("SELECT count(*) FROM items").fetchone()[0] == 0
    db.execute("SELECT pg_create_logical_replication_slot('other', 'test_decoding')")
    fails(run_consumer_once(dsn(cluster, source), dsn(cluster, destination), slot="other"),
          "replication slot 'other' uses test_decoding")


def test_a_per_row_backfill_and_live_writes_end_in_an_equal_copy(cluster, db, scratch_database):
    """One `read` per row (the rehearsal below sends `reads` batches), into a database of the same
    cluster; then the consumer stopped (SIGTERM) and started again, which applies nothing twice
    that matters."""
    source = db.info.dbname
    make_source(db)
    destination = scratch_database("consumer_per_row_dest")
    copy_schema(cluster, source, cluster, destination)
    with cluster.connect(destination) as dest:
        dest.execute("CREATE EXTENSION pg_backfill")
    link_destination(db, cluster, destination)
    db.execute("CREATE PUBLICATION migrate FOR TABLE items, notes")
    db.execute("SELECT pg_create_logical_replication_slot('migrate', 'pgoutput')")
    consumer = Consumer(consumer_command(dsn(cluster, source), dsn(cluster, destination)))
    try:
        with Writers(cluster, source) as writers:
            backfill_id = db.execute(
                "SELECT backfill_start(publication => 'migrate', slot => 'migrate', confirm => true,"
                " batch_size => 500, rows_per_second => 2000)").fetchone()[0]
            wait_for(lambda: status(db, backfill_id, "rows_done") >= 3000 and writers.ops > 500, timeout=120,
                     what="3,000 rows backfilled and 500 writes")
            consumer.process.terminate()  # (its supervisor starts it again)
            db.execute("SELECT backfill_set(%s, rows_per_second => 50000)", [backfill_id])
            wait_for(lambda: status(db, backfill_id, "state") != "running", timeout=120, what="the backfill to end")
        assert writers.errors == [] and status(db, backfill_id, "state") == "done"
        for table in ("items", "notes"):
            assert db.execute(f"SELECT * FROM backfill_compare('{table}', 'dest.{table}')").fetchall() == [], \
                consumer.output()[-3000:]
            assert rows_of(db, table) == rows_of(db, f"dest.{table}")
        assert consumer.starts >= 2 and "public.items read whole" in consumer.output(), consumer.output()
    finally:
        consumer.stop()


# Text that COPY's text format escapes or reads specially, and other values to keep exactly.
AWKWARD_TEXTS = ["tab\there", "new\nline", "carriage\rreturn", "back\\slash", "\\N", "", "end\\",
                 "quotes \" and '", "ünïcødé ✓", "\\x00ff", "plain"]
KINDS = """CREATE TABLE kinds (id bigint PRIMARY KEY, t text, b bool, n numeric(12,3), f float8, ts timestamptz,
                              by bytea, u uuid, r int4range, d date, iv interval);
           CREATE TABLE docs (id int PRIMARY KEY, j jsonb, js json, a int[], t text)"""


def write_kinds(conn, ids):
    conn.execute("""INSERT INTO kinds
                    SELECT g, (%(t)s::text[])[1 + g %% cardinality(%(t)s::text[])], CASE g %% 3 WHEN 0 THEN NULL ELSE g %% 2 = 0 END,
                           g * 1.125, g / 3.0, timestamptz '2024-01-01 00:00+00' + g * interval '1 hour 7 min',
                           decode(lpad(to_hex(g * 7919), 8, '0') || '5c090a', 'hex'), md5(g::text)::uuid,
                           int4range(g::int, g::int + 10), date '2024-02-29' + g::int, g * interval '1 day 3 sec'
                      FROM unnest(%(ids)s::bigint[]) g""", {"t": AWKWARD_TEXTS, "ids": list(ids)})
    conn.execute("""INSERT INTO docs
                    SELECT g, jsonb_build_object('t', (%(t)s::text[])[1 + g %% cardinality(%(t)s::text[])], 'g', g),
                           '{"a":  1, "a": [2, "x\\ty"]}', ARRAY[g, NULL, -g], (%(t)s::text[])[1 + g %% cardinality(%(t)s::text[])]
                      FROM unnest(%(ids)s::int[]) g""", {"t": AWKWARD_TEXTS, "ids": list(ids)})


def change_kinds(conn, round):
    conn.execute("UPDATE kinds SET t = t || E'\\t\\\\' || %s, b = NOT b, f = f * 3 WHERE id %% 4 = 0", [round])
    conn.execute("UPDATE kinds SET id = id + 100000 WHERE id % 11 = 0 AND id < 100000")
    conn.execute("DELETE FROM kinds WHERE id % 10 = 5")
    conn.execute("UPDATE docs SET j = j || jsonb_build_object('round', %s), a = a || %s::int WHERE id %% 3 = 0", [round, round])
    conn.execute("DELETE FROM docs WHERE id % 10 = 5")


def as_text(conn, table):
    return conn.execute(f"SELECT id, row_to_json(x)::text FROM {table} x ORDER BY id").fetchall()


def test_values_of_every_kind_arrive_exactly_through_both_staging_paths(cluster, db, scratch_database):
    """kinds' columns are all of built-in scalar types: the consumer stages its rows as COPY text
    in a typed staging table; docs has json, jsonb and array columns, staged as JSON. Text with
    tabs, newlines, backslashes and a literal \\N, NULLs, booleans, bytea and the rest arrive exactly,
    from ordinary changes, `reads` batches and key changes alike."""
    source = db.info.dbname
    db.execute(KINDS)
    write_kinds(db, range(1, 301))
    destination = scratch_database("consumer_kinds_dest")
    with cluster.connect(destination) as dest:
        dest.execute(KINDS)
    db.execute("CREATE PUBLICATION migrate FOR TABLE kinds, docs")
    db.execute("SELECT pg_create_logical_replication_slot('migrate', 'pgoutput')")
    consumer = Consumer(consumer_command(dsn(cluster, source), dsn(cluster, destination)))
    try:
        write_kinds(db, range(1001, 1041))
        change_kinds(db, 1)
        backfill_id = db.execute("SELECT backfill_start(publication => 'migrate', slot => 'migrate', confirm => true,"
                                 " rows_per_message => 7)").fetchone()[0]
        change_kinds(db, 2)
        wait_for(lambda: status(db, backfill_id, "state") != "running", timeout=120, what="the backfill to end")
        change_kinds(db, 3)
        with cluster.connect(destination) as dest:
            # (A typed staging table for kinds, and none for docs: the two paths this test is about.)
            assert dest.execute("""SELECT array_agg(a.attname::text ORDER BY c.relname, a.attnum)
                                     FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
                                    WHERE c.relname LIKE 'pg_backfill_apply_rows_%' AND a.attnum > 0""").fetchone()[0] == [
                "pg_backfill_apply_seq", "pg_backfill_apply_op", "id", "t", "b", "n", "f", "ts", "by", "u", "r", "d", "iv"]
            for table in ("kinds", "docs"):
                wait_for(lambda: as_text(db, table) == as_text(dest, table), timeout=60,
                         what=f"the destination's {table} to equal the source's")
        assert status(db, backfill_id, "state") == "done" and "error" not in consumer.output(), consumer.output()
    finally:
        consumer.stop()


@pytest.mark.cluster
@pytest.mark.slow
def test_migration_rehearsal_with_kills_ends_in_an_exact_copy(cluster, scratch_database):
    """docs/migrating.md, step by step, with the consumer and the backfill's worker killed."""
    source = extra_cluster(cluster, "migration_source")
    # Preloaded, as docs/migrating.md advises: after the crash restart that a killed worker
    # causes, the server relaunches the running backfill by itself.
    source.start("shared_preload_libraries = 'pg_backfill'")
    consumer = None
    try:
        with source.connect() as admin:
            admin.execute("CREATE DATABASE shop")
        conn = source.connect("shop")
        conn.execute("CREATE EXTENSION pg_backfill")
        make_source(conn)
        destination = scratch_database("migration_destination")
        copy_schema(source, "shop", cluster, destination)
        with cluster.connect(destination) as dest:
            dest.execute("CREATE EXTENSION pg_backfill")  # for backfill_compare's checksums on its side
        link_destination(conn, cluster, destination)
        conn.execute("CREATE PUBLICATION migrate FOR TABLE items, notes")
        conn.execute("SELECT pg_create_logical_replication_slot('migrate', 'pgoutput')")
        consumer = Consumer(consumer_command(dsn(source, "shop"), dsn(cluster, destination)))

        with Writers(source, "shop") as writers:
            wait_for(lambda: writers.ops > 200, timeout=60, what="the writers to start")
            backfill_id = conn.execute(
                "SELECT backfill_start(publication => 'migrate', slot => 'migrate', confirm => true,"
                " batch_size => 500, rows_per_message => 100, rows_per_second => 1500)").fetchone()[0]
            # The worker killed (SIGKILL: the server restarts, dropping every connection) once it
            # has delivered part of the backfill, with writes going on.
            wait_for(lambda: status(conn, backfill_id, "rows_done") >= 3000 and writers.ops > 600, timeout=120,
                     what="3,000 rows backfilled and 600 writes")
            os.kill(wait_for(lambda: worker_pid(conn, backfill_id), what="the backfill's worker"), signal.SIGKILL)
            # (Until the server has dropped this connection too, a new one might be dropped as well.)
            wait_for(lambda: dropped(conn), timeout=60, what="the server's crash restart")
            conn = wait_for(lambda: reconnect(source, "shop"), timeout=60, what="the source to restart")
            # The consumer killed once it is back and has applied more of the backfill. (After the
            # crash the slot sends again what it had confirmed since its last checkpoint: this
            # kill, with no crash after it, is the one that tests the consumer's confirmations.)
            starts, done = consumer.starts, status(conn, backfill_id, "rows_done")
            wait_for(lambda: consumer.starts > starts and status(conn, backfill_id, "rows_done") >= done + 3000,
                     timeout=120, what="the consumer's restart and 3,000 more rows backfilled")
            consumer.kill()
            starts, ops = consumer.starts, writers.ops
            wait_for(lambda: consumer.starts > starts and writers.ops > ops + 300, timeout=120,
                     what="the consumer's restart and 300 more writes")
            conn.execute("SELECT backfill_set(%s, rows_per_second => 50000)", [backfill_id])
            wait_for(lambda: status(conn, backfill_id, "state") != "running", timeout=120, what="the backfill to end")
        assert writers.errors == [] and writers.reconnects > 0, writers.errors
        assert status(conn, backfill_id, "state") == "done"
        assert consumer.starts >= 3, consumer.output()  # started, killed, and dropped by the restart
        print(f"{writers.ops} writes ({writers.reconnects} reconnections), consumer started {consumer.starts} times")

        # The copy, judged once the consumer has applied and confirmed everything (backfill_compare
        # waits on the backfill's slot before it reads the destination; the source is idle now).
        for table in ("items", "notes"):
            assert conn.execute(f"SELECT * FROM backfill_compare('{table}', 'dest.{table}')").fetchall() == [], \
                consumer.output()[-3000:]
            assert conn.execute(f"SELECT backfill_repair('{table}', 'dest.{table}', confirm => true)").fetchone()[0] is None
            assert rows_of(conn, table) == rows_of(conn, f"dest.{table}")
        # The sequence: past every id the source handed out before the table's scan ended.
        with cluster.connect(destination) as dest:
            assert dest.execute("SELECT nextval('notes_id_seq')").fetchone()[0] > NOTES
    finally:
        if consumer:
            consumer.stop()
        source.stop()


def dropped(conn):
    try:
        conn.execute("SELECT 1")
        return False
    except psycopg.OperationalError:
        return True


def reconnect(cluster, dbname):
    try:
        conn = cluster.connect(dbname)
        conn.execute("SELECT 1")
        return conn
    except psycopg.OperationalError:
        return None
