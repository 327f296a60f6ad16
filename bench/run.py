"""pg_backfill benchmark: the physical limit, the client-side script a DBA would write, and
pg_backfill, side by side on the same generated tables, in one run on a throwaway cluster.

    python3 bench/run.py                       # after scripts/setup.sh; sizes 250k,1M,4M; narrow and wide
    python3 bench/run.py --sizes 250000,1000000 --shapes narrow --repeat 3
    PG_MAJOR=18 python3 bench/run.py           # on PostgreSQL 18 (scripts/lib/pg_major.sh), after PG_MAJOR=18 scripts/setup.sh

Prints a table and writes the figures to bench/results/<timestamp>.json for later comparison.
Figures on a shared machine are noisy: each is the median of --repeat runs, and ratios are
taken within the same run.
"""

import argparse
import contextlib
import datetime
import itertools
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent


def pg_major_value(expression: str) -> str:
    """A value from scripts/lib/pg_major.sh for this run's PG_MAJOR (15 unless set)."""
    script = f"source '{ROOT}/scripts/lib/pg_major.sh' && echo \"{expression}\""
    return subprocess.run(["bash", "-c", script], check=True, capture_output=True, text=True).stdout.strip()


PG_MAJOR, PG_BIN = int(pg_major_value("$PG_MAJOR")), pg_major_value("$PG_BIN")
DIR, PORT = ("/tmp/pg_backfill_bench", 15450) if PG_MAJOR == 15 else (f"/tmp/pg_backfill_bench{PG_MAJOR}", PG_MAJOR * 1000 + 450)
# Another place and port for a run next to someone else's (BACKFILL_BENCH_DIR, BACKFILL_BENCH_PORT).
DIR, PORT = os.environ.get("BACKFILL_BENCH_DIR", DIR), int(os.environ.get("BACKFILL_BENCH_PORT", PORT))

SHAPES = {
    "narrow": (
        "CREATE TABLE {t} (id bigint PRIMARY KEY, a int, b bigint, c numeric(12,2))",
        "INSERT INTO {t} SELECT g, g % 1000, g * 7, g * 0.5 FROM generate_series({lo}, {hi}) g",
    ),
    "wide": (
        "CREATE TABLE {t} (id bigint PRIMARY KEY, title text, body text, attrs jsonb, created timestamptz)",
        "INSERT INTO {t} SELECT g, 'title ' || g, repeat(md5(g::text), 20),"
        " jsonb_build_object('g', g, 'tags', jsonb_build_array('a', 'b', g % 10)), now()"
        " FROM generate_series({lo}, {hi}) g",
    ),
    # Eight columns of mixed types, the verification cost's shape of issue 36.
    "mixed8": (
        "CREATE TABLE {t} (id bigint PRIMARY KEY, n numeric(12,2), t text, ts timestamptz, f float8, j jsonb, b bool, u uuid)",
        "INSERT INTO {t} SELECT g, g * 0.25, 'text ' || g, timestamptz '2024-01-01' + g * interval '1 second', g / 7.0,"
        " jsonb_build_object('g', g, 'even', g % 2 = 0), g % 3 = 0, md5(g::text)::uuid FROM generate_series({lo}, {hi}) g",
    ),
    # narrow's columns under a composite key (16 regions): parallel => 2 splits it at sampled
    # key tuples (0.8.0), a one-column key at its histogram.
    "composite": (
        "CREATE TABLE {t} (region int, id bigint, a int, b bigint, c numeric(12,2), PRIMARY KEY (region, id))",
        "INSERT INTO {t} SELECT g % 16, g, g % 1000, g * 7, g * 0.5 FROM generate_series({lo}, {hi}) g",
    ),
}


# The clusters' settings (bash's $'...'): wal_keep_size, as pg_waldump reads the WAL of each
# measurement after its checkpoints; pg_backfill preloaded, as the README configures it (a
# worker then inherits the loaded library from the postmaster instead of loading it itself).
CLUSTER_SETTINGS = ("$'fsync = on\\nsynchronous_commit = on\\nautovacuum = off\\nfull_page_writes = on\\nwal_keep_size = 16GB"
                    "\\nshared_preload_libraries = \\'pg_backfill\\''")
# --versus: the other installation's cluster.
VERSUS_DIR, VERSUS_PORT = f"{DIR}_versus", PORT + 1


def versus_cluster(bin_dir):
    """A cluster of the other installation (--versus), configured as this run's, with pg_backfill."""
    sh(f"BACKFILL_PG_BIN='{bin_dir}' cluster_start {VERSUS_DIR} {VERSUS_PORT} {CLUSTER_SETTINGS}")
    conn = connect(VERSUS_PORT)
    conn.execute("CREATE EXTENSION pg_backfill")
    return conn


def sh(command):
    subprocess.run(["bash", "-c", f"source '{ROOT}/scripts/lib/cluster.sh' && {command}"], check=True)


def connect(port=None, dbname="postgres"):
    """A connection to this run's cluster (another's, given its port), in autocommit."""
    return psycopg.connect(host="127.0.0.1", port=port or PORT, user="postgres", dbname=dbname, autocommit=True)


def wal_lsn(conn):
    return conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]


def wal_bytes(conn, start):
    return float(conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", [start]).fetchone()[0])


def payload_bytes(conn, table):
    return float(conn.execute(f"SELECT sum(octet_length(row_to_json(t)::text)) FROM {table} t").fetchone()[0])


def run_limit(conn, table, rows):
    start, t0 = wal_lsn(conn), time.perf_counter()
    conn.execute(
        f"SELECT count(pg_logical_emit_message(true, 'backfill', row_to_json(t)::text)) FROM (SELECT * FROM {table} FOR SHARE) t"
    )
    return time.perf_counter() - t0, wal_bytes(conn, start), None


def run_client_script(conn, table, rows):
    """The script a DBA would write: keyset pages of 1,000 rows FOR SHARE, one emit per row from
    the client, cursor advanced per page (a page per transaction)."""
    start, t0 = wal_lsn(conn), time.perf_counter()
    cursor = 0
    while True:
        with conn.transaction():
            page = conn.execute(
                f"SELECT id, row_to_json(t)::text FROM {table} t WHERE id > %s ORDER BY id LIMIT 1000 FOR SHARE", [cursor]
            ).fetchall()
            if not page:
                break
            with conn.cursor() as cur:
                cur.executemany("SELECT pg_logical_emit_message(true, 'backfill', %s)", [(j,) for _, j in page])
            cursor = page[-1][0]
    return time.perf_counter() - t0, wal_bytes(conn, start), None


def run_pg_backfill(conn, table, rows, parallel=1):
    start = wal_lsn(conn)
    backfill_id = conn.execute(f"SELECT backfill_start('{table}', confirm => true, parallel => {parallel})").fetchone()[0]
    peak_kb, pid = 0, None
    while True:
        state, pid_now = conn.execute("SELECT state, worker_pid FROM backfill_status WHERE id = %s", [backfill_id]).fetchone()
        pid = pid_now or pid
        if pid:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                rss_anon = int(next(l for l in status.splitlines() if l.startswith("RssAnon:")).split()[1])
                peak_kb = max(peak_kb, rss_anon)
            except (OSError, StopIteration):
                pass
        if state != "running":
            break
        time.sleep(0.02)
    assert state == "done", state
    seconds = conn.execute(
        "SELECT extract(epoch FROM finished_at - started_at) FROM backfill_status WHERE id = %s", [backfill_id]
    ).fetchone()[0]
    return float(seconds), wal_bytes(conn, start), peak_kb


METHODS = {
    "limit": run_limit,
    "client script": run_client_script,
    "pg_backfill": run_pg_backfill,
    "pg_backfill x2": lambda conn, table, rows: run_pg_backfill(conn, table, rows, parallel=2),
}

PGBENCH = f"{PG_BIN}/pgbench"
PG_RECVLOGICAL = f"{PG_BIN}/pg_recvlogical"
PG_WALDUMP = f"{PG_BIN}/pg_waldump"


def waldump_stats(start, end):
    """WAL between two positions by record type (pg_waldump --stats=record, as postgres):
    total bytes, full-page-image bytes, and the logical messages' bytes."""
    out = subprocess.run(["sudo", "-u", "postgres", PG_WALDUMP, "-p", f"{DIR}/data/pg_wal", "-s", str(start), "-e", str(end),
                          "--stats=record"], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"pg_waldump {start}..{end}: {out.stderr.strip()}")
    out = out.stdout
    figures = {"total": 0, "fpi": 0, "messages": 0}
    for line in out.splitlines():
        fields = line.split()
        if not fields or not fields[1:2] or not fields[1].isdigit():
            continue
        # Type, N, (%), record size, (%), FPI size, (%), combined size, (%)
        numbers = [int(f) for f in fields[1:] if f.isdigit()]
        if fields[0] == "Total":
            figures["total"], figures["fpi"] = numbers[-1], numbers[2]
        elif fields[0].startswith("LogicalMessage"):
            figures["messages"] += numbers[-1]
    return figures


def all_frozen(conn, table):
    return conn.execute("SELECT all_frozen FROM pg_visibility_map_summary(%s)", [table]).fetchone()[0]


def backfill_with(lock_mode):
    def run(conn, table, rows):
        conn.execute(f"SET backfill.lock_mode = '{lock_mode}'")
        try:
            return run_pg_backfill(conn, table, rows)
        finally:
            conn.execute("RESET backfill.lock_mode")
    return run


def run_messages_only(conn, table, rows):
    """The floor: every row's message and nothing else (no lock, no page, no cursor)."""
    start, t0 = wal_lsn(conn), time.perf_counter()
    conn.execute(f"SELECT count(pg_logical_emit_message(true, 'backfill', row_to_json(t)::text)) FROM {table} t")
    return time.perf_counter() - t0, wal_bytes(conn, start), None


# On a quiet table frozen by VACUUM (FREEZE): what each way of reading costs the source.
def backfill_batched(conn, table, rows):
    """pg_backfill in batches of 100 rows a message (issue 25): fewer, larger messages."""
    conn.execute("SET backfill.rows_per_message = 100")
    try:
        return run_pg_backfill(conn, table, rows)
    finally:
        conn.execute("RESET backfill.rows_per_message")


SOURCE_COST_METHODS = {
    "messages only": run_messages_only,
    "limit (FOR SHARE)": run_limit,
    "pg_backfill rows": backfill_with("rows"),
    "pg_backfill auto": backfill_with("auto"),
    "pg_backfill batched": backfill_batched,
}


def source_cost(conn, shapes, sizes, repeat):
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_visibility")
    results = []
    print(f"\n{'shape':7} {'rows':>9} {'method':19} {'s':>7} {'best s':>7} {'x floor':>8} {'best x':>7} {'WAL B/row':>10} "
          f"{'msg B/row':>10} {'WAL/msg':>8} {'FPI B/row':>10} {'unfrozen':>9} {'of pages':>9}")
    for shape in shapes:
        for size in sizes:
            table = f"cost_{shape}_{size}"
            create, fill = SHAPES[shape]
            conn.execute(create.format(t=table))
            for lo in range(1, size + 1, 500_000):
                conn.execute(fill.format(t=table, lo=lo, hi=min(size, lo + 499_999)))
            runs = {method: [] for method in SOURCE_COST_METHODS}
            for _ in range(repeat):
                for method, run in SOURCE_COST_METHODS.items():
                    conn.execute(f"VACUUM (FREEZE, ANALYZE) {table}")
                    conn.execute("CHECKPOINT")
                    frozen_before = all_frozen(conn, table)
                    start = wal_lsn(conn)
                    seconds, _, _ = run(conn, table, size)
                    end = wal_lsn(conn)
                    conn.execute("SELECT pg_switch_wal()")  # writes and flushes the WAL up to end for pg_waldump
                    wal = waldump_stats(start, end)
                    runs[method].append((seconds, wal, frozen_before - all_frozen(conn, table), frozen_before))
            floor = statistics.median(s[0] for s in runs["messages only"])
            best_floor = min(s[0] for s in runs["messages only"])
            for method, samples in runs.items():
                median = lambda key: statistics.median(key(s) for s in samples)  # noqa: E731
                r = {"shape": shape, "rows": size, "method": method, "seconds": median(lambda s: s[0]),
                     "best_seconds": min(s[0] for s in samples), "all_seconds": [s[0] for s in samples],
                     "wal_bytes_per_row": median(lambda s: s[1]["total"]) / size,
                     "message_wal_bytes_per_row": median(lambda s: s[1]["messages"]) / size,
                     "fpi_bytes_per_row": median(lambda s: s[1]["fpi"]) / size,
                     "pages_unfrozen": median(lambda s: s[2]), "pages": median(lambda s: s[3])}
                r["ratio_to_floor"] = r["seconds"] / floor
                r["best_ratio_to_floor"] = r["best_seconds"] / best_floor
                r["wal_to_messages"] = r["wal_bytes_per_row"] / max(r["message_wal_bytes_per_row"], 1e-9)
                results.append(r)
                print(f"{shape:7} {size:>9} {method:19} {r['seconds']:>7.2f} {r['best_seconds']:>7.2f} "
                      f"{r['ratio_to_floor']:>8.2f} {r['best_ratio_to_floor']:>7.2f} "
                      f"{r['wal_bytes_per_row']:>10.0f} {r['message_wal_bytes_per_row']:>10.0f} {r['wal_to_messages']:>8.2f} "
                      f"{r['fpi_bytes_per_row']:>10.0f} {r['pages_unfrozen']:>9.0f} {r['pages']:>9.0f}")
                sys.stdout.flush()
            conn.execute(f"DROP TABLE {table}")
    return results


def logged_pgbench(clients, seconds, logs):
    """pgbench's TPC-B-like load on `clients` clients for `seconds`, started, logging each
    transaction under DIR/`logs` (emptied first): the process and the logs' folder."""
    log_dir = Path(DIR) / logs
    log_dir.mkdir(exist_ok=True)
    for old in log_dir.glob("*"):
        old.unlink()
    bench = subprocess.Popen([PGBENCH, "-c", str(clients), "-j", "2", "-T", str(seconds), "-l", "--log-prefix",
                              str(log_dir / "log"), "-h", "127.0.0.1", "-p", str(PORT), "-U", "postgres", "postgres"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return bench, log_dir


def p99_ms(latencies_us):
    """The 99th percentile of pgbench's logged latencies (microseconds), in milliseconds."""
    ordered = sorted(latencies_us)
    return ordered[int(len(ordered) * 0.99)] / 1000.0


def rows_delivered(conn, ids):
    """The rows the backfills `ids` delivered, together."""
    return conn.execute("SELECT coalesce(sum(rows_done), 0)::bigint FROM backfill_status WHERE id = ANY (%s)",
                        [ids]).fetchone()[0]


def pgbench_under(conn, seconds, start, clients=4, logs="pgbench"):
    """pgbench's TPC-B-like load on `clients` clients for `seconds`, with back-to-back backfills
    (`start` starts one; None: alone): its TPS and p99 latency (from its per-transaction log,
    under DIR/`logs`), the rows the backfills delivered a second, their ids, and, alone, the
    mean count of active client sessions."""
    bench, log_dir = logged_pgbench(clients, seconds, logs)
    ids, active = (backfills_while(conn, bench, start), None) if start else ([], active_sessions_while(conn, bench))
    backfilled = rows_delivered(conn, ids)
    out = bench.stdout.read()
    tps = next((float(l.split()[2]) for l in out.splitlines() if l.startswith("tps")), None)
    if tps is None:
        raise RuntimeError(f"pgbench failed ({start or 'alone'}):\n{out}")
    p99 = p99_ms(int(line.split()[2]) for f in log_dir.glob("log*") for line in f.read_text().splitlines())
    return {"tps": tps, "p99_latency_ms": p99, "rows_backfilled_per_second": backfilled / seconds,
            "active_sessions": active, "ids": ids}


def pgbench_latencies(conn, seconds, lock_mode):
    """Writers' TPS and p99 latency (pgbench, 4 clients) while back-to-back backfills of the
    table they update run in `lock_mode`."""
    conn.execute(f"SET backfill.lock_mode = '{lock_mode}'")
    run = pgbench_under(conn, seconds, "SELECT backfill_start('pgbench_accounts', confirm => true, rows_per_second => 100000)",
                        logs=f"pgbench_{lock_mode}")
    conn.execute("RESET backfill.lock_mode")
    table_pages, pages = conn.execute(
        """SELECT coalesce(sum(pages_table_locked), 0)::bigint, coalesce(sum(pages_table_locked + pages_row_locked), 0)::bigint
             FROM backfill_tables WHERE backfill_id = ANY (%s)""", [run["ids"]]).fetchone()
    return {"lock_mode": lock_mode, "tps": run["tps"], "p99_latency_ms": run["p99_latency_ms"],
            "rows_backfilled_per_second": run["rows_backfilled_per_second"],
            "share_of_pages_table_locked": table_pages / max(pages, 1)}


def backfills_while(conn, bench, start):
    """Runs backfills back to back (`start` starts one) while pgbench runs; cancels the last one
    when it ends. Returns their ids."""
    return backfills_back_to_back(conn, start, lambda: float("inf") if bench.poll() is None else 0.0, 0.1)


def backfills_back_to_back(conn, start, seconds_left, look_every):
    """Runs backfills back to back (`start` starts one; None: none, the looks alone) while
    `seconds_left()` is positive, looking at backfill_status every `look_every` seconds (the next
    starts at the first look that finds the last one ended), and cancels the last one at the
    end. Returns their ids."""
    ids, state = [], None
    while seconds_left() > 0:
        if start and state != "running":
            ids.append(conn.execute(start).fetchone()[0])
        looked = conn.execute("SELECT state FROM backfill_status WHERE id = %s", [ids[-1] if ids else 0]).fetchone()
        state = looked[0] if looked else None
        time.sleep(max(0.0, min(look_every, seconds_left())))
    if ids:
        try:
            conn.execute("SELECT backfill_cancel(%s)", [ids[-1]])
        except psycopg.errors.ObjectNotInPrerequisiteState:
            pass  # it finished in the meantime
    return ids


def pgbench_impact(conn, seconds, rate):
    """The application's TPS and latency (pgbench's TPC-B-like load on 4 clients) with no
    backfill, with backfills at default settings, and paced ones, all of pgbench_accounts
    itself, the table the load updates: back to back for the whole run."""
    subprocess.run([PGBENCH, "-i", "-q", "-s", "10", "-h", "127.0.0.1", "-p", str(PORT), "-U", "postgres", "postgres"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    conn.execute("VACUUM ANALYZE pgbench_accounts")
    results = []
    for label, start in [("no backfill", None),
                         ("default backfill", "SELECT backfill_start('pgbench_accounts', confirm => true)"),
                         (f"paced backfill ({rate} rows/s)",
                          f"SELECT backfill_start('pgbench_accounts', confirm => true, rows_per_second => {rate})")]:
        run = pgbench_under(conn, seconds, start)
        results.append({"scenario": label, "tps": run["tps"], "p99_latency_ms": run["p99_latency_ms"],
                        "rows_backfilled_per_second": run["rows_backfilled_per_second"]})
    print(f"\n{'application load (pgbench, 4 clients)':40} {'TPS':>8} {'p99 ms':>11} {'backfill rows/s':>16}")
    for r in results:
        print(f"{r['scenario']:40} {r['tps']:>8.0f} {r['p99_latency_ms']:>11.2f} {r['rows_backfilled_per_second']:>16.0f}")
    return results


def active_sessions_while(conn, bench):
    """The mean count of active client sessions, sampled every 50 ms while pgbench runs."""
    samples = []
    while bench.poll() is None:
        samples.append(conn.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                                    "AND state = 'active' AND pid <> pg_backend_pid()").fetchone()[0])
        time.sleep(0.05)
    return statistics.mean(samples) if samples else 0.0


@contextlib.contextmanager
def pgbench_pipeline(conn):
    """pgbench's tables (scale 10) streamed in the README's configuration while the block runs: a
    pipeline (a pgoutput slot, load_slot, and a publication of pgbench's tables, load_pub, with
    a real consumer: pg_recvlogical, status every second) streams pgbench's changes throughout,
    pgbench alone included. Every backfill then names its slot and publication, so that it waits
    on the consumer's feedback, and the walsender decodes its messages beside pgbench's changes."""
    subprocess.run([PGBENCH, "-i", "-q", "-s", "10", "-h", "127.0.0.1", "-p", str(PORT), "-U", "postgres", "postgres"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    conn.execute("VACUUM ANALYZE pgbench_accounts")
    conn.execute("CREATE TABLE IF NOT EXISTS e2e_flush (n int)")
    conn.execute("CREATE PUBLICATION load_pub FOR TABLE pgbench_accounts, pgbench_branches, pgbench_tellers, pgbench_history")
    conn.execute("SELECT pg_create_logical_replication_slot('load_slot', 'pgoutput')")
    receiver = Receiver("load_slot", "load_pub")
    while not conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = 'load_slot'").fetchone()[0]:
        time.sleep(0.01)
    try:
        yield
    finally:
        receiver.stop()
        conn.execute("SELECT pg_drop_replication_slot('load_slot')")
        conn.execute("DROP PUBLICATION load_pub")


# A backfill of pgbench_accounts by the pipeline of pgbench_pipeline(), with these options.
PIPELINE_START = "SELECT backfill_start('pgbench_accounts', confirm => true, slot => 'load_slot', publication => 'load_pub'{})"
# "default": no pacing option, as the README's first backfill (backfill.default_duty_cycle);
# "unpaced": max_active_sessions => 0, the default turned off.
IDLE_STARTS = {"default backfill": PIPELINE_START.format(""),
               "unpaced backfill": PIPELINE_START.format(", max_active_sessions => 0")}


def load_signal(conn, seconds, repeat, thresholds, clients=(4,)):
    """The application's TPS and p99 latency (pgbench on `clients` clients, on pgbench_accounts)
    alone, under back-to-back backfills of that table started with no option (the gentle
    default) and unpaced, and under backfills held back by max_active_sessions at each
    threshold: the scenarios take turns in each round, in the reverse order every other round;
    medians over the rounds, and each figure as a share of the same round's alone. Each round
    first times a whole backfill of the table on the idle server, the default and unpaced in
    turn (idle_speeds). All of it in the README's configuration (pgbench_pipeline)."""
    with pgbench_pipeline(conn):
        return load_signal_rounds(conn, seconds, repeat, thresholds, clients)


def as_shares_of_alone(figures, n):
    """Each figure of client count `n` (figures by (clients, label)) with its TPS and p99 as a
    share of the same round's pgbench alone."""
    alone = figures[(n, "no backfill")]
    for (clients, _), f in figures.items():
        if clients == n:
            f["share_of_tps_alone"] = f["tps"] / alone["tps"]
            f["p99_growth"] = f["p99_latency_ms"] / alone["p99_latency_ms"] - 1
            for part in ("first_second", "after_first_second"):
                if f"p99_{part}_ms" in f:
                    f[f"p99_growth_{part}"] = f[f"p99_{part}_ms"] / alone[f"p99_{part}_ms"] - 1


def print_round(round_number, figures):
    print(f"round {round_number + 1}: " + ", ".join(
        f"{n}c {label}: {f['tps']:.0f} TPS ({f['share_of_tps_alone']:.2f}), p99 {f['p99_growth']:+.0%}"
        + (f" ({f['p99_growth_after_first_second']:+.0%} after the first second)" if "p99_growth_after_first_second" in f else "")
        + f", {f['rows_backfilled_per_second']:.0f} rows/s"
        for (n, label), f in figures.items() if label != "no backfill"), flush=True)


def load_medians(rounds, clients, labels, idle, repeat):
    """The medians over `rounds` (each figures by (clients, label)) at each client count of
    each of `labels`, and the idle server's speeds (idle_speeds), printed and returned."""
    results = []
    for n in clients:
        print(f"\n{f'pgbench ({n} clients) with':28} {'TPS':>8} {'x alone':>8} {'p99 ms':>8} {'p99 growth':>11} "
              f"{'backfill rows/s':>16}   (medians of {repeat})")
        starts = []
        for label in labels:
            keys = ["tps", "share_of_tps_alone", "p99_latency_ms", "p99_growth", "rows_backfilled_per_second"]
            split = label != "no backfill" and "p99_growth_first_second" in rounds[0][(n, label)]
            keys += ["p99_growth_first_second", "p99_growth_after_first_second"] if split else []
            med = {k: statistics.median(r[(n, label)][k] for r in rounds) for k in keys}
            results.append({"scenario": label, "clients": n, **med, "rounds": [r[(n, label)] for r in rounds]})
            print(f"{label:28} {med['tps']:>8.0f} {med['share_of_tps_alone']:>8.2f} {med['p99_latency_ms']:>8.2f} "
                  f"{med['p99_growth']:>+11.0%} {med['rows_backfilled_per_second']:>16.0f}")
            if split:
                starts.append(f"{label}: p99 growth in each window's first second (its start) "
                              f"{med['p99_growth_first_second']:+.0%}, after it {med['p99_growth_after_first_second']:+.0%} "
                              "(against pgbench alone's same seconds)")
        for line in starts:
            print(line)
        sessions = [r[(n, "no backfill")].get("active_sessions") for r in rounds]
        if None not in sessions:
            print(f"active client sessions, pgbench alone (mean of 50 ms samples): {statistics.median(sessions):.2f}")
    print(f"\n{'idle server, one backfill':28} {'rows/s':>8} {'x unpaced':>10}   (medians of {repeat})")
    # Each round's speed a share of the same round's unpaced, then the median of those shares,
    # as each figure under load is a share of the same run's alone: the two backfills of a round
    # take turns, so the machine's drift from round to round falls out of the ratio.
    for label, speeds in idle.items():
        shares = [speed / unpaced for speed, unpaced in zip(speeds, idle["unpaced backfill"])]
        speed, share = statistics.median(speeds), statistics.median(shares)
        results.append({"scenario": f"idle server, {label}", "rows_backfilled_per_second": speed,
                        "share_of_unpaced_speed": share, "rounds": speeds, "shares_of_unpaced_by_round": shares})
        print(f"{label:28} {speed:>8.0f} {share:>10.2f}")
    return results


def load_signal_rounds(conn, seconds, repeat, thresholds, clients):
    """load_signal's rounds, its pipeline streaming."""
    scenarios = [("no backfill", None), ("default backfill", IDLE_STARTS["default backfill"]),
                 ("unpaced backfill", IDLE_STARTS["unpaced backfill"])]
    scenarios += [(f"max_active_sessions {n}", PIPELINE_START.format(f", max_active_sessions => {n}")) for n in thresholds]
    rounds, idle = [], {label: [] for label in IDLE_STARTS}
    for round_number in range(repeat):
        idle_speeds(conn, IDLE_STARTS, round_number, idle)
        figures = {}
        for n in clients:
            # Each first in every other round, as on the idle server: the machine's other load
            # drifts over a round, and would otherwise fall on whichever always runs second.
            for label, start in (scenarios if round_number % 2 == 0 else scenarios[::-1]):
                conn.execute("CHECKPOINT")
                run = pgbench_under(conn, seconds, start, clients=n)
                figures[(n, label)] = {k: run[k] for k in ("tps", "p99_latency_ms", "rows_backfilled_per_second", "active_sessions")}
            as_shares_of_alone(figures, n)
        rounds.append(figures)
        print_round(round_number, figures)
    return load_medians(rounds, clients, [label for label, _ in scenarios], idle, repeat)


def duty_cycle_label(percent):
    """A scenario of load_signal: the default backfill at backfill.default_duty_cycle `percent`."""
    return f"default, duty cycle {percent}%"


# How often pgbench_in_turns looks at backfill_status, in every window alike: an operator's
# `\watch 1`. It looked every 50 ms, and only in a backfill's windows: each look plans the view
# (about 0.75 ms here), so pgbench alone was spared a cost the backfill's windows were charged.
MONITOR_SECONDS = 1.0
# A window's first second, where a backfill's window has its start (pgbench_in_turns).
START_SECONDS = 1.0


def pgbench_in_turns(conn, turns, clients, window_seconds, gap_seconds, logs="pgbench_turns"):
    """One pgbench run (TPC-B-like, `clients` clients, on pgbench_accounts) in windows of
    `window_seconds` that take turns as `turns` lists them: (label, start, setup), where `start`
    starts a backfill (None: pgbench alone) and `setup` runs first (a setting; None: none). In a
    backfill's window, backfills run back to back (the next starts at the first look that finds
    the last one ended, every MONITOR_SECONDS) and the last is cancelled at its end. A gap of
    `gap_seconds` before each window is not counted: what the last backfill wrote is sent
    meanwhile, so that it is not counted against pgbench alone (a backfill's start is counted).

    Windows next to each other share the machine's spells of other load, which 20-second runs in
    turn did not (pgbench alone ranged from 1,750 to 2,470 TPS from one run to the next on this
    machine). Per label: pgbench's TPS and p99 latency in its windows (from pgbench's
    per-transaction log, by each transaction's end), and the rows its backfills delivered a
    second of its windows; and the p99 of the transactions that ended in the first
    START_SECONDS of a window (a backfill's start: the function's planning, its worker's start-up)
    apart from the rest's (the backfill running), pgbench alone's alike."""
    # pgbench runs past the last window (each window's own statements take a little time): a
    # window it did not wholly cover is refused below, not counted short.
    total = len(turns) * (gap_seconds + window_seconds) + 10
    bench_began = time.time()
    bench, log_dir = logged_pgbench(clients, total, logs)
    windows = {label: [] for label, _, _ in turns}
    rows = {label: 0 for label, _, _ in turns}
    for label, start, setup in turns:
        if setup:
            conn.execute(setup)
            conn.execute("SELECT pg_reload_conf()")
        time.sleep(gap_seconds)
        began = time.time()
        ends = began + window_seconds
        # The same look at backfill_status in every window, pgbench alone's included.
        ids = backfills_back_to_back(conn, start, lambda: ends - time.time(), MONITOR_SECONDS)
        if ids:
            rows[label] += rows_delivered(conn, ids)
        windows[label].append((began, time.time()))
    if time.time() > bench_began + total:
        raise RuntimeError(f"the windows took longer than pgbench's {total} s: raise its margin")
    out = bench.communicate()[0]
    if bench.returncode != 0:
        raise RuntimeError(f"pgbench failed:\n{out}")
    latencies = {label: [] for label in windows}
    starting, running = {label: [] for label in windows}, {label: [] for label in windows}
    for log in log_dir.glob("log*"):
        for line in log.read_text().splitlines():
            fields = line.split()
            ended = int(fields[4]) + int(fields[5]) / 1e6
            began = next(((label, b) for label, spans in windows.items() for b, e in spans if b <= ended < e), None)
            if began is not None:
                label, window_began = began
                latencies[label].append(int(fields[2]))
                (starting if ended < window_began + START_SECONDS else running)[label].append(int(fields[2]))
    figures = {}
    for label, spans in windows.items():
        seconds = sum(e - b for b, e in spans)
        figures[label] = {"tps": len(latencies[label]) / seconds, "p99_latency_ms": p99_ms(latencies[label]),
                          "rows_backfilled_per_second": rows[label] / seconds,
                          "p99_first_second_ms": p99_ms(starting[label]),
                          "p99_after_first_second_ms": p99_ms(running[label])}
    return figures


# How often idle_speeds looks at backfill_status, in its looks of 5 ms: every 100 ms.
IDLE_STATUS_EVERY = 20


def idle_speeds(conn, starts, round_number, speeds, resting=None, pairs=3):
    """A whole backfill of pgbench_accounts on the idle server for each of `starts` (label: its
    start), `pairs` times taking turns, each first in every other round: appends the median of
    its rows/s, each from its start until its consumer was sent the last page, to
    speeds[label]. A backfill takes 4 to 5 s here, short enough that a spell of the machine's
    other load moves one by a fifth: turns and a median, as under pgbench. VACUUM first: the
    first scan after pgbench's updates would otherwise prune pages and set hint bits for the
    second. `resting` (label: [looks, looks that saw it resting]), if given, counts how often
    backfill_status said waiting_kind 'load' (on an idle server: never, for the default)."""
    runs = {label: [] for label in starts}
    for _ in range(pairs):
        for label in sorted(starts, reverse=round_number % 2 == 1):
            conn.execute("VACUUM pgbench_accounts")
            conn.execute("CHECKPOINT")
            started = time.perf_counter()
            backfill = conn.execute(starts[label]).fetchone()[0]
            for look in itertools.count():
                # Its end, from its row (0.07 to 0.1 ms a look); what holds it back, from the
                # status view every IDLE_STATUS_EVERY looks (1.4 to 1.7 ms a look on the idle
                # server, more beside a backfill at full speed on 2 cores: looked at every 5 ms,
                # the benchmark's own session was active a fifth of the time or more, and the
                # server not idle).
                state = conn.execute("SELECT state FROM backfill.job WHERE id = %s", [backfill]).fetchone()[0]
                if resting is not None and look % IDLE_STATUS_EVERY == 0:
                    waiting = conn.execute("SELECT waiting_kind FROM backfill_status WHERE id = %s",
                                           [backfill]).fetchone()[0]
                    looks = resting.setdefault(label, [0, 0])
                    looks[0] += 1
                    looks[1] += waiting == "load"
                if state != "running":
                    break
                time.sleep(0.005)
            elapsed = sent_past(conn, "load_slot", flushed_lsn(conn), started)
            rows = conn.execute("SELECT rows_done FROM backfill_status WHERE id = %s", [backfill]).fetchone()[0]
            runs[label].append(rows / elapsed)
    for label, speeds_of_label in runs.items():
        speeds[label].append(statistics.median(speeds_of_label))


def gentle_default_round(conn, round_number, defaults, clients, window_seconds, gap_seconds, pairs):
    """One round of gentle_default under load: at each client count, one pgbench run whose
    windows take turns (pgbench_in_turns). Its figures by (clients, label), each with its
    share of the same run's alone."""
    figures = {}
    for n in clients:
        turns = []
        for label, percent, options in defaults:
            setup = (f"ALTER SYSTEM SET backfill.default_duty_cycle = {percent}" if percent is not None
                     else "ALTER SYSTEM RESET backfill.default_duty_cycle")
            pair = [("no backfill", None, None), (label, PIPELINE_START.format(options), setup)]
            turns += (pair if round_number % 2 == 0 else pair[::-1]) * pairs
        conn.execute("CHECKPOINT")
        for label, f in pgbench_in_turns(conn, turns, n, window_seconds, gap_seconds).items():
            figures[(n, label)] = f
        as_shares_of_alone(figures, n)
    print_round(round_number, figures)
    return figures


def gentle_default(conn, repeat, duty_cycles=(), window_seconds=10, gap_seconds=1, pairs=2, rows_per_message=None,
                   batch_size=None):
    """What the default backfill (no pacing option) costs pgbench at 4 and 16 clients and how
    fast it goes there, and its speed on the idle server against unpaced, with each of the
    default's targets, met or not; with `duty_cycles`, for each of them; with `rows_per_message`,
    also the default with that option, in turns of its own in the same pgbench runs (a consumer's
    choice of wire format, not a default: what a cheaper message would give); with `batch_size`,
    likewise each of them with that option too (pages of at most that many rows: what shorter
    pages would give).

    In the README's configuration: a pipeline (a pgoutput slot, a publication of pgbench's
    tables, a real consumer: pg_recvlogical, status every second) streams pgbench's changes
    throughout, pgbench alone included, and every backfill names its slot and publication.
    Each round: the idle server's backfills (idle_speeds), then, at each client count, one
    pgbench run whose windows take turns, `pairs` times: pgbench alone, then with the default
    backfill (pgbench_in_turns), the other way round every other round. Each figure is a share
    of the same round's alone; medians over the rounds."""
    # (label, its backfill.default_duty_cycle: None, the server's)
    defaults = [(duty_cycle_label(n), n, "") for n in duty_cycles] or [("default backfill", None, "")]
    if rows_per_message:
        defaults.append((f"default, rows_per_message {rows_per_message}", None,
                         f", rows_per_message => {int(rows_per_message)}"))
    if batch_size:
        defaults += [(f"{label}, batch_size {batch_size}", percent, f"{options}, batch_size => {int(batch_size)}")
                     for label, percent, options in list(defaults)]
    clients = (4, 16)
    rounds, idle, resting = [], {label: [] for label in IDLE_STARTS}, {}
    with pgbench_pipeline(conn):
        try:
            for round_number in range(repeat):
                # The server's own duty cycle on the idle server: its backfills never rest anyway.
                conn.execute("ALTER SYSTEM RESET backfill.default_duty_cycle")
                conn.execute("SELECT pg_reload_conf()")
                idle_speeds(conn, IDLE_STARTS, round_number, idle, resting)
                rounds.append(gentle_default_round(conn, round_number, defaults, clients, window_seconds,
                                                   gap_seconds, pairs))
        finally:
            conn.execute("ALTER SYSTEM RESET backfill.default_duty_cycle")
            conn.execute("SELECT pg_reload_conf()")
    results = load_medians(rounds, clients, ["no backfill"] + [label for label, _, _ in defaults], idle, repeat)
    for label, (looks, rested) in resting.items():
        print(f"idle server, {label}: resting (waiting_kind 'load') in {rested} of {looks} looks of backfill_status")
        results.append({"scenario": f"idle server, {label}, looks at backfill_status", "looks": looks,
                        "looks_resting": rested})
    figure = {(r["scenario"], r.get("clients")): r for r in results}
    idle_share = figure[("idle server, default backfill", None)]["share_of_unpaced_speed"]
    for label, _, _ in defaults:
        targets = []
        for n in clients:
            default = figure[(label, n)]
            targets.append((f"{n} clients: TPS kept >= 0.90", default["share_of_tps_alone"], default["share_of_tps_alone"] >= 0.90))
            targets.append((f"{n} clients: rows/s >= 10,000", default["rows_backfilled_per_second"],
                            default["rows_backfilled_per_second"] >= 10000))
        growth = figure[(label, 4)]["p99_growth"]
        targets.append(("4 clients: p99 latency growth <= 25%", growth, growth <= 0.25))
        targets.append(("idle server: default >= 0.95 x unpaced", idle_share, idle_share >= 0.95))
        print(f"\n{'the ' + label.replace('default backfill', 'default'):40} {'figure':>10}   (medians of {repeat})")
        for name, value, met in targets:
            print(f"{name:40} {value:>10.2f}   {'met' if met else 'NOT MET'}")
        results.append({"scenario": label, "targets": [{"target": name, "figure": value, "met": met} for name, value, met in targets]})
    return results


class Receiver:
    """pg_recvlogical streaming a pgoutput slot (messages on) to /dev/null: a consumer in C that
    keeps up with its walsender, so that the walsender's decoding is what is measured."""

    def __init__(self, slot, publication):
        self.slot = slot
        self.process = subprocess.Popen(
            [PG_RECVLOGICAL, "-h", "127.0.0.1", "-p", str(PORT), "-U", "postgres", "-d", "postgres",
             "--slot", slot, "--start", "-f", "/dev/null", "-s", "1", "-F", "0", "-o", "proto_version=1",
             "-o", f"publication_names={publication}", "-o", "messages=true"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def stop(self):
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


APPLIER = ROOT / "consumer" / "pg_backfill_apply.py"
APPLY_DB = "e2e_apply"


class Applier:
    """The reference consumer (consumer/pg_backfill_apply.py) applying the slot's stream to a
    database of the same cluster, as tablesync applies into one: the destination's tables (`ddl`,
    the publication's) made first, then the consumer started as docs/consumers.md says, neither
    timed. Its stderr (progress every `progress` seconds, errors) is `output` once stopped."""

    def __init__(self, conn, slot, publication, ddl, progress=3600):
        conn.execute(f"DROP DATABASE IF EXISTS {APPLY_DB}")
        conn.execute(f"CREATE DATABASE {APPLY_DB}")
        with connect(dbname=APPLY_DB) as target:
            for statement in ddl:
                target.execute(statement)
        command = [sys.executable, str(APPLIER), "--source", f"host=127.0.0.1 port={PORT} user=postgres dbname=postgres",
                   "--slot", slot, "--publication", publication,
                   "--destination", f"host=127.0.0.1 port={PORT} user=postgres dbname={APPLY_DB}", "--progress", str(progress)]
        if PROFILE_DIR:
            # One profile per run (cProfile), for `python3 -m pstats`: where the consumer's time goes.
            PROFILE_DIR.mkdir(parents=True, exist_ok=True)
            command[1:1] = ["-m", "cProfile", "-o", str(PROFILE_DIR / f"{slot}-{time.time():.0f}.prof")]
        self.conn, self.process = conn, subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.output = ""

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        try:
            _, self.output = self.process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, self.output = self.process.communicate()
        if "error" in self.output:
            print(self.output, file=sys.stderr)
        self.conn.execute(f"DROP DATABASE {APPLY_DB} WITH (FORCE)")


PROFILE_DIR = None  # --profile-consumer


def confirmed_past(conn, slot, lsn, started, timeout=900):
    """Seconds from `started` until the slot's consumer has confirmed `lsn`: the reference consumer
    confirms a position only once the destination has committed everything before it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute("SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                           [lsn, slot]).fetchone()
        if row and row[0]:
            return time.perf_counter() - started
        time.sleep(0.005)
    raise RuntimeError(f"slot {slot} never confirmed {lsn}")


def sent_past(conn, slot, lsn, started, timeout=900):
    """Seconds from `started` until the slot's walsender has sent everything up to `lsn` (its
    sent_lsn, polled every 5 ms: a logical walsender sends a transaction as it decodes its
    commit, and the consumer on localhost has it within the millisecond)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute("SELECT r.sent_lsn >= %s::pg_lsn FROM pg_stat_replication r JOIN pg_replication_slots s "
                           "ON s.active_pid = r.pid WHERE s.slot_name = %s", [lsn, slot]).fetchone()
        if row and row[0]:
            return time.perf_counter() - started
        time.sleep(0.005)
    raise RuntimeError(f"slot {slot} never sent past {lsn}")


def flushed_lsn(conn):
    """The WAL position after a commit that waits for its flush: every earlier record (the
    pages commit without waiting) is then flushed, so a walsender can read and send it."""
    conn.execute("INSERT INTO e2e_flush VALUES (1)")
    return conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]


def spilled(conn, slot):
    """The slot's spill_bytes since its last reset (the walsender reports its figures as it goes,
    and at the latest when it stops)."""
    return int(conn.execute("SELECT coalesce(spill_bytes, 0) FROM pg_stat_replication_slots WHERE slot_name = %s",
                            [slot]).fetchone()[0] or 0)


def e2e_backfill(rows_per_message, batch_size=1000, pipeline=False, applied=False):
    """pg_backfill until every row is delivered: from backfill_start to the walsender having sent
    the last page's transaction. A pipeline's backfill names the consumer's slot and publication,
    as docs/tutorial.md's worked example does: it waits on the consumer's feedback, and each page checks
    the publication still holds the table. `applied`: until the reference consumer has committed
    every row at the destination (and confirmed it), and the destination holds them all."""
    def run(conn, table, slot):
        started = time.perf_counter()
        bound = ", slot => %s, publication => 'e2e_pub'" if pipeline else ""
        backfill_id = conn.execute(f"SELECT backfill_start(%s::regclass, confirm => true, rows_per_message => %s,"
                                   f" batch_size => %s{bound})",
                                   [table, rows_per_message, batch_size] + ([slot] if pipeline else [])).fetchone()[0]
        while conn.execute("SELECT state FROM backfill_status WHERE id = %s", [backfill_id]).fetchone()[0] == "running":
            time.sleep(0.005)
        source_seconds = time.perf_counter() - started
        if not applied:
            return sent_past(conn, slot, flushed_lsn(conn), started), source_seconds
        seconds = confirmed_past(conn, slot, flushed_lsn(conn), started)
        with connect(dbname=APPLY_DB) as target:
            held, expected = target.execute(f"SELECT count(*) FROM {table}").fetchone()[0], int(table.rsplit("_", 1)[1])
        if held != expected:
            raise RuntimeError(f"the destination holds {held} rows of {table}, not {expected}")
        return seconds, source_seconds
    return run


def e2e_changes(conn, table, slot):
    """The same rows as ordinary changes: INSERT ... SELECT into a published copy, one transaction."""
    conn.execute(f"TRUNCATE {table}_changes")
    started = time.perf_counter()
    conn.execute(f"INSERT INTO {table}_changes SELECT * FROM {table}")
    source_seconds = time.perf_counter() - started
    return sent_past(conn, slot, flushed_lsn(conn), started), source_seconds


def e2e_tablesync(conn, table, slot):
    """Native logical replication's initial copy, into another database of the cluster: the slot
    made first, then CREATE SUBSCRIPTION ... (create_slot = false); until the table is ready."""
    conn.execute("DROP DATABASE IF EXISTS e2e_target")
    conn.execute("CREATE DATABASE e2e_target")
    with connect(dbname="e2e_target") as target:
        target.execute(TABLE_DDL[table])
        conn.execute("SELECT pg_create_logical_replication_slot('e2e_sub', 'pgoutput')")
        started = time.perf_counter()
        target.execute(f"CREATE SUBSCRIPTION e2e_sub CONNECTION 'host=127.0.0.1 port={PORT} user=postgres dbname=postgres' "
                       f"PUBLICATION e2e_copy_pub WITH (create_slot = false, slot_name = 'e2e_sub')")
        while target.execute("SELECT bool_and(srsubstate = 'r') FROM pg_subscription_rel").fetchone()[0] is not True:
            time.sleep(0.005)
        seconds = time.perf_counter() - started
        target.execute("ALTER SUBSCRIPTION e2e_sub DISABLE")
        target.execute("ALTER SUBSCRIPTION e2e_sub SET (slot_name = NONE)")
        target.execute("DROP SUBSCRIPTION e2e_sub")
    # (The apply worker lets go of the slot as it exits, a moment after the DROP.)
    while conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = 'e2e_sub'").fetchone()[0]:
        time.sleep(0.01)
    conn.execute("SELECT pg_drop_replication_slot('e2e_sub')")
    conn.execute("DROP DATABASE e2e_target")
    return seconds, None


TABLE_DDL = {}


def end_to_end(servers, shapes, sizes, repeat, batched, only_methods=None):
    """Until a consumer holds every row: pg_backfill per row and batched, until delivered through
    a pgoutput slot (messages on) that pg_recvlogical streams; the same rows as ordinary changes
    through the same slot; native tablesync until ready. The methods take turns in each round;
    medians (and best) of the rounds. Also the slot's spill_bytes per method.

    `servers`: {name: (port, connection)}, one cluster, or two (--versus: two builds of
    pg_backfill, each in its own installation): each method runs on each in turn, every round."""
    global PORT
    methods = {"per-row, delivered": e2e_backfill(1), "pipeline per-row": e2e_backfill(1, pipeline=True),
               "pipeline per-row, applied": e2e_backfill(1, pipeline=True, applied=True)}
    for n in batched:
        methods[f"batched {n}, delivered"] = e2e_backfill(n)
        methods[f"pipeline batched {n}"] = e2e_backfill(n, pipeline=True)
        methods[f"pipeline batched {n}, applied"] = e2e_backfill(n, pipeline=True, applied=True)
    methods["ordinary changes"] = e2e_changes
    methods["tablesync, ready"] = e2e_tablesync
    if only_methods:
        methods = {m: run for m, run in methods.items() if m in only_methods}
    turns = [(server, method) for method in methods for server in servers]
    for _, conn in servers.values():
        conn.execute("CREATE TABLE e2e_flush (n int)")
    results = []
    print(f"\n{'shape':7} {'rows':>9} {'method':32} {'median s':>9} {'best s':>7} {'rows/s':>9} {'x tablesync':>12} "
          f"{'source s':>9} {'spill MB':>9}")
    for shape in shapes:
        for size in sizes:
            table = f"e2e_{shape}_{size}"
            create, fill = SHAPES[shape]
            TABLE_DDL[table] = create.format(t=table)
            for _, conn in servers.values():
                conn.execute(create.format(t=table))
                conn.execute(create.format(t=f"{table}_changes"))
                for lo in range(1, size + 1, 500_000):
                    conn.execute(fill.format(t=table, lo=lo, hi=min(size, lo + 499_999)))
                conn.execute(f"VACUUM (FREEZE, ANALYZE) {table}")
                # The stream's publication holds the backfilled table too: a pipeline's backfill names it.
                conn.execute(f"CREATE PUBLICATION e2e_pub FOR TABLE {table}_changes, {table}")
                conn.execute(f"CREATE PUBLICATION e2e_copy_pub FOR TABLE {table}")
            runs = {turn: [] for turn in turns}
            for _ in range(repeat):
                for server, method in turns:
                    run = methods[method]
                    PORT, conn = servers[server]
                    conn.execute("CHECKPOINT")
                    slot = "e2e_stream"
                    receiver = None
                    if method != "tablesync, ready":
                        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
                        # (The publication's two tables: the one backfilled, and the ordinary changes' copy.)
                        ddl = [TABLE_DDL[table], TABLE_DDL[table].replace(table, f"{table}_changes", 1)]
                        receiver = (Applier(conn, slot, "e2e_pub", ddl)
                                    if method.endswith(", applied") else Receiver(slot, "e2e_pub"))
                        while not conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                                               [slot]).fetchone()[0]:
                            time.sleep(0.01)
                    try:
                        seconds, source_seconds = run(conn, table, slot)
                    finally:
                        if receiver:
                            receiver.stop()
                    spill = None
                    if receiver:
                        time.sleep(0.5)  # the walsender's last figures
                        spill = spilled(conn, slot)
                        conn.execute("SELECT pg_drop_replication_slot(%s)", [slot])
                    runs[(server, method)].append((seconds, source_seconds, spill))
            for (server, method), samples in runs.items():
                tablesync_runs = runs.get((server, "tablesync, ready"))
                tablesync = statistics.median(s[0] for s in tablesync_runs) if tablesync_runs else float("nan")
                median = statistics.median(s[0] for s in samples)
                source = [s[1] for s in samples if s[1] is not None]
                spills = [s[2] for s in samples if s[2] is not None]
                label = method if len(servers) == 1 else f"{server}: {method}"
                r = {"shape": shape, "rows": size, "method": method, "server": server, "seconds": median, "best": min(s[0] for s in samples),
                     "rows_per_second": size / median, "ratio_tablesync_to_this": tablesync / median,
                     "source_seconds": statistics.median(source) if source else None,
                     "spill_bytes": max(spills) if spills else None, "samples": samples}
                results.append(r)
                src = f"{r['source_seconds']:>9.2f}" if source else f"{'-':>9}"
                spill = f"{r['spill_bytes'] / 1e6:>9.1f}" if spills else f"{'-':>9}"
                print(f"{shape:7} {size:>9} {label:32} {median:>9.2f} {r['best']:>7.2f} {size / median:>9.0f} "
                      f"{tablesync / median:>12.2f} {src} {spill}")
                sys.stdout.flush()
            PORT = next(iter(servers.values()))[0]
            for _, conn in servers.values():
                conn.execute("DROP PUBLICATION e2e_pub, e2e_copy_pub")
                conn.execute(f"DROP TABLE {table}, {table}_changes")
    return results


def many_tables(conn, repeat, tables=200, rows_each=5000):
    """A schema of many small tables against one large table of as many rows, backfilled as a
    pipeline's (slot and publication named, batches of 1,000 rows) with one and two workers,
    until the consumer (pg_recvlogical, status every second) was sent every row. The
    configurations take turns in each round; medians of the rounds."""
    total = tables * rows_each
    create, fill = SHAPES["narrow"]
    names = [f"many_{i:03}" for i in range(tables)]
    for name in names:
        conn.execute(create.format(t=name))
        conn.execute(fill.format(t=name, lo=1, hi=rows_each))
    conn.execute(create.format(t="many_one"))
    for lo in range(1, total + 1, 500_000):
        conn.execute(fill.format(t="many_one", lo=lo, hi=min(total, lo + 499_999)))
    conn.execute("VACUUM (FREEZE, ANALYZE)")
    conn.execute("CREATE TABLE e2e_flush (n int)")
    conn.execute("CREATE PUBLICATION many_pub FOR TABLE " + ", ".join(names + ["many_one"]))
    configurations = {f"{label}, parallel {parallel}": (regclasses, parallel)
                      for label, regclasses in [("1 table", ["many_one"]), (f"{tables} tables", names)]
                      for parallel in (1, 2)}
    seconds = {c: [] for c in configurations}
    for _ in range(repeat):
        for configuration, (regclasses, parallel) in configurations.items():
            conn.execute("CHECKPOINT")
            conn.execute("SELECT pg_create_logical_replication_slot('many_slot', 'pgoutput')")
            receiver = Receiver("many_slot", "many_pub")
            try:
                while not conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = 'many_slot'").fetchone()[0]:
                    time.sleep(0.01)
                started = time.perf_counter()
                backfill_id = conn.execute(
                    "SELECT backfill_start(%s::regclass[], confirm => true, slot => 'many_slot', publication => 'many_pub',"
                    " rows_per_message => 1000, parallel => %s)", [regclasses, parallel]).fetchone()[0]
                conn.execute("SELECT backfill_wait(%s)", [backfill_id])
                seconds[configuration].append(sent_past(conn, "many_slot", flushed_lsn(conn), started))
            finally:
                receiver.stop()
            conn.execute("SELECT pg_drop_replication_slot('many_slot')")
    one_table = statistics.median(seconds["1 table, parallel 1"])
    results = []
    print(f"\n{'many tables (' + str(total) + ' rows)':28} {'median s':>9} {'rows/s':>9} {'x 1 table':>10}   (medians of {repeat})")
    for configuration, samples in seconds.items():
        median = statistics.median(samples)
        results.append({"configuration": configuration, "rows": total, "seconds": median, "rows_per_second": total / median,
                        "ratio_to_one_table_parallel_1": one_table / median, "samples": samples})
        print(f"{configuration:28} {median:>9.2f} {total / median:>9.0f} {one_table / median:>10.2f}")
    return results


def ddl_cost(conn, repeat, tables=30_000, statements=50):
    """What a live follow costs DDL: an ALTER TABLE of a table it knows, and a CREATE TABLE (a
    table it does not), with a FOR ALL TABLES publication of `tables` tables followed, against
    the same statements with no follow. Milliseconds per statement, client-side, medians of
    `statements` statements in each of `repeat` rounds (the configurations take turns)."""
    for first in range(0, tables, 1000):
        conn.execute("DO $$ BEGIN FOR i IN %s..%s LOOP EXECUTE format('CREATE TABLE ddl_%%s (id int PRIMARY KEY)', i); END LOOP; END $$"
                     % (first, min(tables, first + 1000) - 1))
    conn.execute("CREATE PUBLICATION ddl_everything FOR ALL TABLES")
    conn.execute("SELECT pg_create_logical_replication_slot('ddl_slot', 'pgoutput')")
    samples = {(statement, follow): [] for statement in ("ALTER TABLE", "CREATE TABLE") for follow in (False, True)}
    created = 0
    for _ in range(repeat):
        for follow in (False, True):
            if follow:
                conn.execute("SELECT backfill_follow('ddl_everything', 'ddl_slot')")
            for i in range(statements):
                for statement in ("ALTER TABLE", "CREATE TABLE"):
                    sql = (f"ALTER TABLE ddl_{i} ALTER COLUMN id SET STATISTICS {100 + created % 50}" if statement == "ALTER TABLE"
                           else f"CREATE TABLE ddl_new_{created} (id int PRIMARY KEY)")
                    started = time.perf_counter()
                    conn.execute(sql)
                    samples[(statement, follow)].append((time.perf_counter() - started) * 1000)
                    created += 1
            if follow:
                conn.execute("SELECT backfill_unfollow('ddl_everything', 'ddl_slot')")
    results = []
    print(f"\n{'DDL with ' + str(tables) + ' tables':32} {'no follow ms':>13} {'FOR ALL TABLES follow ms':>25}   (medians of {repeat * statements})")
    for statement in ("ALTER TABLE", "CREATE TABLE"):
        without, with_follow = (statistics.median(samples[(statement, follow)]) for follow in (False, True))
        results.append({"statement": statement, "tables": tables, "ms_without_follow": without, "ms_with_follow": with_follow})
        print(f"{statement:32} {without:>13.2f} {with_follow:>25.2f}")
    conn.execute("SELECT pg_drop_replication_slot('ddl_slot')")
    return results


def spill_probe(conn, rows, configurations):
    """The walsender's spill (pg_stat_replication_slots.spill_bytes) for backfills of wide rows at
    (batch_size, rows_per_message, parallel), each through its own pgoutput slot and
    pg_recvlogical. Pages lock rows (lock_mode rows), so that each has batch_size rows: under
    auto a quiet table's pages are sized to backfill.table_lock_max_ms instead."""
    table = "spill_wide"
    create, fill = SHAPES["wide"]
    conn.execute(create.format(t=table))
    for lo in range(1, rows + 1, 500_000):
        conn.execute(fill.format(t=table, lo=lo, hi=min(rows, lo + 499_999)))
    conn.execute(f"VACUUM (FREEZE, ANALYZE) {table}")
    conn.execute("CREATE PUBLICATION spill_pub FOR TABLE e2e_flush")
    row_bytes = float(conn.execute(f"SELECT avg(octet_length(row_to_json(t)::text)) FROM {table} t").fetchone()[0])
    results = []
    print(f"\nwide rows ({row_bytes:.0f} B of JSON each), {rows} rows; logical_decoding_work_mem "
          f"{conn.execute('SHOW logical_decoding_work_mem').fetchone()[0]}")
    print(f"{'batch_size':>10} {'rows/msg':>9} {'parallel':>9} {'page MB':>8} {'seconds':>8} {'spill MB':>9} {'spill txns':>11}")
    for batch_size, n, parallel in configurations:
        slot = "spill_probe"
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
        receiver = Receiver(slot, "spill_pub")
        while not conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", [slot]).fetchone()[0]:
            time.sleep(0.01)
        started = time.perf_counter()
        conn.execute("SET backfill.lock_mode = 'rows'")
        backfill_id = conn.execute("SELECT backfill_start(%s::regclass, confirm => true, rows_per_message => %s, batch_size => %s,"
                                   " parallel => %s)", [table, n, batch_size, parallel]).fetchone()[0]
        while conn.execute("SELECT state FROM backfill_status WHERE id = %s", [backfill_id]).fetchone()[0] == "running":
            time.sleep(0.01)
        seconds = sent_past(conn, slot, flushed_lsn(conn), started)
        receiver.stop()
        time.sleep(0.5)
        spill_bytes, spill_txns = conn.execute("SELECT coalesce(spill_bytes, 0), coalesce(spill_txns, 0) FROM "
                                               "pg_stat_replication_slots WHERE slot_name = %s", [slot]).fetchone()
        conn.execute("SELECT pg_drop_replication_slot(%s)", [slot])
        r = {"batch_size": batch_size, "rows_per_message": n, "parallel": parallel, "rows": rows, "row_json_bytes": row_bytes,
             "seconds": seconds, "spill_bytes": int(spill_bytes), "spill_txns": int(spill_txns)}
        results.append(r)
        print(f"{batch_size:>10} {n:>9} {parallel:>9} {batch_size * row_bytes / 1e6:>8.1f} {seconds:>8.2f} "
              f"{int(spill_bytes) / 1e6:>9.1f} {int(spill_txns):>11}")
        sys.stdout.flush()
    conn.execute("DROP PUBLICATION spill_pub")
    conn.execute(f"DROP TABLE {table}")
    return results


# The columns of each shape as data-diff's PostgreSQL dialect normalises them before its md5
# (data_diff/databases/postgresql.py: numbers as decimal(38, scale) text, timestamps rounded to
# their precision and written by to_char, json as text, everything else cast to varchar).
def data_diff_timestamp(value, precision=6):
    top, bottom = "294276-12-31 23:59:59.0000", "4713-01-01 00:00:00.00 BC"
    clamped = f"greatest('{bottom}'::timestamp(6), least('{top}'::timestamp(6), {value}::timestamp(6)))"
    half = format(0.5 * 10 ** -precision, f".{precision + 1}f")
    rounded = f"to_char(least('{top}'::timestamp, {clamped}) + interval '{half}', 'YYYY-mm-dd HH24:MI:SS.US')"
    rounded = f"left({rounded}, length({rounded}) - (6 - {precision}))"
    return f"CASE WHEN {value} IS NULL THEN NULL ELSE RPAD(LEFT({rounded}, {20 + precision}), 26, '0') END"


DATA_DIFF_COLUMNS = {
    "narrow": ["id::varchar", "a::varchar", "b::varchar", "c::decimal(38, 2)::varchar"],
    "wide": ["id::varchar", "title::varchar", "body::varchar", "attrs::text", data_diff_timestamp("created")],
    "mixed8": ["id::varchar", "n::decimal(38, 2)::varchar", "t::varchar", data_diff_timestamp("ts"), "f::varchar",
               "j::text", "b::varchar", "u::varchar"],
}


def data_diff_checksum(shape):
    """data-diff's checksum of a segment: the sum of the first 48 bits of the md5 of each row's
    normalised columns, NULLs as '<null>', joined by '|' (BaseDialect.render_checksum)."""
    joined = " || '|' || ".join(f"coalesce({c}, '<null>')" for c in DATA_DIFF_COLUMNS[shape])
    return f"sum(('x' || substring(md5({joined}), 21))::bit(48)::bigint - 140737488355327)"


# The most the checksum's count level may take, in times a count(*) of the table (best of the
# rounds), on every major.
COUNT_LEVEL_TARGET = 2.5


def checksum_costs(conn, shapes, sizes, repeat):
    """backfill_checksum at its levels against SELECT count(*) and data-diff's checksum (the md5
    of each row's normalised text, summed per range) over the same 1,024 ranges: medians of
    `repeat` turns, on cached tables. Every query's result is read to the end (a subquery whose
    outputs nobody reads would not be computed)."""
    results = []
    print(f"\n{'shape':7} {'rows':>9} {'method':34} {'s':>8} {'best s':>8} {'x count(*)':>11} {'best x':>8}")
    for shape in shapes:
        for size in sizes:
            table = f"checksum_{shape}_{size}"
            create, fill = SHAPES[shape]
            conn.execute(create.format(t=table))
            for lo in range(1, size + 1, 500_000):
                conn.execute(fill.format(t=table, lo=lo, hi=min(size, lo + 499_999)))
            conn.execute(f"VACUUM (FREEZE, ANALYZE) {table}")
            bounds = conn.execute(
                f"SELECT jsonb_agg(upper) FROM backfill_checksum('{table}', ranges => 1024, level => 'count') WHERE upper IS NOT NULL"
            ).fetchone()[0]
            bounds_text = json.dumps(bounds)
            ids = "{" + ",".join(str(b["id"]) for b in bounds) + "}"
            levels = {f"checksum {level}, 1024 ranges": (
                "SELECT * FROM backfill_checksum(%s, level => %s, bounds => %s::jsonb)", [table, level, bounds_text])
                for level in ("count", "aggregate", "hash")}
            last_column = {"narrow": "c", "wide": "created", "mixed8": "u"}[shape]
            methods = {
                "count(*)": (f"SELECT count(*) FROM {table}", None),
                # What reading every column of every row costs, hashing nothing: a floor.
                "read every column": (f"SELECT count(*) FROM {table} WHERE {last_column} IS NOT NULL", None),
                **levels,
                "data-diff md5, 1024 ranges": (
                    f"SELECT width_bucket(t.id, %s::bigint[]), count(*), {data_diff_checksum(shape)} FROM {table} t GROUP BY 1", [ids]),
            }
            # backfill_compare of the table and an identical copy, local, and through postgres_fdw
            # (a loopback server: the copy's checksums run in another backend, over dblink).
            conn.execute(f"CREATE TABLE {table}_copy AS SELECT * FROM {table}")
            conn.execute(f"ALTER TABLE {table}_copy ADD PRIMARY KEY (id)")
            conn.execute(f"VACUUM (FREEZE, ANALYZE) {table}_copy")
            conn.execute("CREATE SCHEMA IF NOT EXISTS far")
            conn.execute(f"IMPORT FOREIGN SCHEMA public LIMIT TO ({table}_copy) FROM SERVER loopback INTO far")
            methods["compare, local copy"] = (f"SELECT * FROM backfill_compare('{table}', '{table}_copy')", None)
            methods["compare, postgres_fdw copy"] = (f"SELECT * FROM backfill_compare('{table}', 'far.{table}_copy')", None)
            for sql, params in methods.values():
                conn.execute(sql, params).fetchall()  # warm the cache
            times = {m: [] for m in methods}
            for _ in range(repeat):
                for method, (sql, params) in methods.items():
                    started = time.perf_counter()
                    conn.execute(sql, params).fetchall()
                    times[method].append(time.perf_counter() - started)
            base, best_base = statistics.median(times["count(*)"]), min(times["count(*)"])
            for method, samples in times.items():
                seconds, best = statistics.median(samples), min(samples)
                results.append({"shape": shape, "rows": size, "method": method, "seconds": seconds, "best_seconds": best,
                                "ratio_to_count": seconds / base, "best_ratio_to_count": best / best_base,
                                "all_seconds": samples})
                print(f"{shape:7} {size:>9} {method:34} {seconds:>8.3f} {best:>8.3f} {seconds / base:>11.2f} {best / best_base:>8.2f}")
            # The count level's target, on every major: at most COUNT_LEVEL_TARGET times count(*),
            # whichever plan count(*) gets (15 counts 1M frozen rows of mixed8 with a parallel
            # index-only scan, in a quarter of the time a scan of the table takes).
            count_level = min(times["checksum count, 1024 ranges"]) / best_base
            met = "met" if count_level <= COUNT_LEVEL_TARGET else "NOT MET"
            results.append({"shape": shape, "rows": size, "method": "count level target", "best_ratio_to_count": count_level,
                            "target": COUNT_LEVEL_TARGET, "met": count_level <= COUNT_LEVEL_TARGET})
            print(f"{shape:7} {size:>9} {'count level target':34} {'':>8} {'':>8} {COUNT_LEVEL_TARGET:>11.2f} {count_level:>8.2f} {met}")
            faster = statistics.median(times["data-diff md5, 1024 ranges"]) / statistics.median(times["checksum hash, 1024 ranges"])
            results.append({"shape": shape, "rows": size, "method": "hash level, times faster than data-diff", "ratio": faster})
            print(f"{shape:7} {size:>9} {'hash level, x faster than data-diff':34} {'':>8} {faster:>11.2f}")
            conn.execute(f"DROP TABLE {table}, {table}_copy")
            conn.execute(f"DROP FOREIGN TABLE far.{table}_copy")
    return results


REHEARSAL_TABLE = "rehearsal_items"


class LiveWrites(threading.Thread):
    """The application's writes on the source while a rehearsal runs: about `per_second`
    transactions a second, each an update of a random key, a delete of one, an insert (or, where
    the key is there, an update) of one, and an insert of a new key above the table's, so that
    reads and changes of the same keys race, deleted keys come back and the table grows."""

    def __init__(self, rows, per_second=200):
        super().__init__(daemon=True)
        self.rows, self.pause, self.transactions, self.failure = rows, 1.0 / per_second, 0, None
        self.stopping = threading.Event()

    def run(self):
        rng, t = random.Random(44), REHEARSAL_TABLE
        try:
            with connect() as conn:
                while not self.stopping.wait(self.pause):
                    updated, deleted, upserted = (rng.randint(1, self.rows) for _ in range(3))
                    with conn.transaction():
                        conn.execute(f"UPDATE {t} SET a = a + 1, c = c + 0.01 WHERE id = %s", [updated])
                        conn.execute(f"DELETE FROM {t} WHERE id = %s", [deleted])
                        conn.execute(f"INSERT INTO {t} VALUES (%s, 0, 0, 0) ON CONFLICT (id) DO UPDATE SET b = {t}.b + 1",
                                     [upserted])
                        conn.execute(f"INSERT INTO {t} VALUES (nextval('{t}_new_ids'), 1, 1, 1)")
                    self.transactions += 1
        except BaseException as e:  # the main thread raises it
            self.failure = e

    def stop(self):
        self.stopping.set()
        self.join()
        if self.failure:
            raise self.failure


def rehearsal(conn, rows):
    """Issue 44's demonstration, as docs/migrating.md walks it: a source table of `rows` narrow
    rows under live writes, the reference consumer applying its publication's slot into a new
    database, the README's pipeline backfill (`rows_per_message => 1000`, bound to the slot)
    of the publication, then, the writes stopped and the consumer caught up, backfill_compare
    against the destination. Prints the verdict and the timings; raises if the copy differs."""
    t, slot = REHEARSAL_TABLE, "rehearsal"
    create, fill = SHAPES["narrow"]
    started = time.perf_counter()
    conn.execute(create.format(t=t))
    for lo in range(1, rows + 1, 500_000):
        conn.execute(fill.format(t=t, lo=lo, hi=min(rows, lo + 499_999)))
    conn.execute(f"CREATE SEQUENCE {t}_new_ids START {rows + 1}")
    conn.execute(f"VACUUM (FREEZE, ANALYZE) {t}")
    conn.execute("CREATE TABLE e2e_flush (n int)")  # (flushed_lsn's; not published)
    print(f"source: {rows} rows of {t} loaded in {time.perf_counter() - started:.1f} s")
    # docs/migrating.md, 1: the publication and the slot, the slot before the backfill.
    conn.execute(f"CREATE PUBLICATION {slot} FOR TABLE {t}")
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
    # 2 and 3: the destination's table (schema only) and pg_backfill there, then the consumer.
    consumer = Applier(conn, slot, slot, [create.format(t=t), "CREATE EXTENSION pg_backfill"], progress=10)
    loopback_server(conn, "destination", APPLY_DB)
    conn.execute("CREATE SCHEMA dest")
    conn.execute(f"IMPORT FOREIGN SCHEMA public LIMIT TO ({t}) FROM SERVER destination INTO dest")
    writes = LiveWrites(rows)
    try:
        writes.start()
        # 4: every table of the publication, bound to the consumer's slot, in batches of 1,000.
        started = time.perf_counter()
        backfill_id = conn.execute("SELECT backfill_start(publication => %s, slot => %s, confirm => true, "
                                   "rows_per_message => 1000)", [slot, slot]).fetchone()[0]
        conn.execute("SELECT backfill_wait(%s)", [backfill_id])
        backfill_seconds = time.perf_counter() - started
        state, rows_done = conn.execute("SELECT state, rows_done FROM backfill_status WHERE id = %s",
                                        [backfill_id]).fetchone()
        writes.stop()
        # The cut-over's step 2: the writes stopped, until the consumer confirmed the source's position.
        stopped = time.perf_counter()
        caught_up = confirmed_past(conn, slot, flushed_lsn(conn), stopped)
        # 5: the comparison.
        started = time.perf_counter()
        differences = conn.execute(f"SELECT * FROM backfill_compare('{t}', 'dest.{t}')").fetchall()
        compare_seconds = time.perf_counter() - started
        source_rows = conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
        with connect(dbname=APPLY_DB) as destination:
            destination_rows = destination.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
    finally:
        if writes.is_alive():
            writes.stopping.set()
        consumer.stop()
    print("consumer's output:\n  " + "\n  ".join(consumer.output.strip().splitlines()))
    print(f"backfill {backfill_id}: {state}, {rows_done} rows read in {backfill_seconds:.1f} s "
          f"(backfill_start to backfill_wait's return), {rows_done / backfill_seconds:.0f} rows/s")
    print(f"live writes: {writes.transactions} transactions (4 writes each) during the backfill")
    print(f"consumer caught up {caught_up:.2f} s after the writes stopped")
    print(f"rows: source {source_rows}, destination {destination_rows}")
    print(f"backfill_compare('{t}', 'dest.{t}'): {len(differences)} rows in {compare_seconds:.1f} s: "
          + ("EQUAL" if not differences else "DIFFERENT"))
    result = {"method": "rehearsal", "rows": rows, "backfill_seconds": backfill_seconds, "rows_done": rows_done,
              "write_transactions": writes.transactions, "catch_up_seconds": caught_up,
              "compare_seconds": compare_seconds, "source_rows": source_rows, "destination_rows": destination_rows,
              "differences": [list(map(str, d)) for d in differences[:20]], "equal": not differences}
    if differences or source_rows != destination_rows:
        for d in differences[:20]:
            print(f"  {d}")
        raise RuntimeError(f"the copy differs: {len(differences)} keys reported by backfill_compare")
    return [result]


def loopback_server(conn, name="loopback", dbname="postgres"):
    """A postgres_fdw server that is a database of this cluster (this one unless `dbname`), for
    copies behind foreign tables."""
    conn.execute("CREATE EXTENSION IF NOT EXISTS postgres_fdw")
    conn.execute("CREATE EXTENSION IF NOT EXISTS dblink")
    conn.execute(f"CREATE SERVER {name} FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '127.0.0.1', port '{PORT}', dbname '{dbname}')")
    conn.execute(f"CREATE USER MAPPING FOR CURRENT_USER SERVER {name}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="250000,1000000,4000000")
    parser.add_argument("--shapes", default="narrow,wide")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--methods", default=",".join(METHODS),
                        help="the speed benchmark's methods (the limit always runs: the ratios are to it); the client "
                             "script pages on a column named id, so leave it out for the composite shape")
    parser.add_argument("--pgbench-seconds", type=int, default=20, help="0 skips the load test")
    parser.add_argument("--pgbench-rate", type=int, default=50000, help="rows/s of the paced backfill")
    parser.add_argument("--checksum", action="store_true",
                        help="only backfill_checksum's levels against count(*) and an md5-of-text checksum; at least 7 rounds")
    parser.add_argument("--load-signal", default="",
                        help="only the application's TPS under backfills held back by these max_active_sessions (e.g. 2,3)")
    parser.add_argument("--gentle-default", action="store_true",
                        help="only what the default backfill (no pacing option) costs pgbench at 4 and 16 clients, its "
                             "speed there, and its speed on the idle server against unpaced, with its targets")
    parser.add_argument("--window-seconds", type=int, default=10,
                        help="with --gentle-default: the length of each window of the pgbench runs, whose windows take "
                             "turns, with and without a backfill (twice each a round and client count, a second apart)")
    parser.add_argument("--rows-per-message", type=int, default=None, metavar="N",
                        help="with --gentle-default: also the default backfill with rows_per_message => N, taking "
                             "turns with pgbench alone in the same runs, with its targets")
    parser.add_argument("--batch-size", type=int, default=None, metavar="N",
                        help="with --gentle-default: also each default backfill (each duty cycle's) with batch_size => N "
                             "(pages of at most N rows), taking turns with pgbench alone in the same runs, with its targets")
    parser.add_argument("--duty-cycles", default="", metavar="PERCENT,...",
                        help="with --gentle-default: the default backfill under pgbench at each of these "
                             "backfill.default_duty_cycle values, taking turns in each round, each with its targets")
    parser.add_argument("--end-to-end", action="store_true",
                        help="only until a consumer holds every row: per-row and batched backfills until delivered, unbound and "
                             "as a pipeline's (slot and publication named), "
                             "ordinary changes, native tablesync until ready")
    parser.add_argument("--many-tables", action="store_true",
                        help="only 200 tables of 5,000 rows against one table of 1M rows, as a pipeline's backfill, "
                             "with one and two workers")
    parser.add_argument("--ddl-cost", action="store_true",
                        help="only what a live FOR ALL TABLES follow of 30,000 tables costs an ALTER TABLE and a CREATE TABLE")
    parser.add_argument("--batched", default="1000", help="rows_per_message of the batched backfills of --end-to-end")
    parser.add_argument("--e2e-methods", default="",
                        help="only these methods of --end-to-end, as printed, separated by ';' (some names hold a comma), "
                             "e.g. 'pipeline batched 1000;tablesync, ready'")
    parser.add_argument("--profile-consumer", default="", metavar="DIR",
                        help="with --end-to-end: run the reference consumer of the ', applied' methods under cProfile, "
                             "one profile per run in DIR (python3 -m pstats DIR/FILE)")
    parser.add_argument("--versus", default="",
                        help="with --end-to-end: the bin directory of another installation of the same major, with another "
                             "build of pg_backfill installed (scripts/lib/install.sh with BACKFILL_PG_BIN): each method "
                             "runs on a cluster of each, in turn in every round (two builds, side by side in one run)")
    parser.add_argument("--spill", default="",
                        help="only the walsender's spill for backfills of this many wide rows, at several batch sizes")
    parser.add_argument("--rehearsal", action="store_true",
                        help="only issue 44's demonstration: a table of --rows narrow rows under live writes, the reference "
                             "consumer applying the README's pipeline backfill into a new database, backfill_compare then")
    parser.add_argument("--rows", type=int, default=1_000_000, help="the rows of --rehearsal's table")
    parser.add_argument("--source-cost", action="store_true",
                        help="only the source's cost on quiet frozen tables (lock modes, batches), and writers' p99 latency "
                             "per lock mode; at least 7 rounds")
    args = parser.parse_args()
    global PROFILE_DIR
    PROFILE_DIR = Path(args.profile_consumer).resolve() if args.profile_consumer else None
    if (args.source_cost or args.checksum) and args.repeat < 7:
        # Steady figures: best and median of at least 7 interleaved rounds (issue 25).
        args.repeat = 7

    # Installed by rename, as scripts/lib/install.sh does it, built for PG_MAJOR.
    subprocess.run(["bash", "-c", 'source scripts/lib/pg_major.sh && source scripts/lib/install.sh && install_extension "$PG_CONFIG" "${PG_FEATURES[@]}"'],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    sh(f"cluster_start {DIR} {PORT} {CLUSTER_SETTINGS}")
    results = []
    try:
        conn = connect()
        conn.execute("CREATE EXTENSION pg_backfill")
        server = conn.execute("SELECT version()").fetchone()[0]
        # What was measured: the commit (with a mark if the tree had changes) and the server.
        commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        code = {"commit": commit, "server": server}
        if args.end_to_end or args.spill:
            load = []
            if args.end_to_end:
                servers = {"this tree": (PORT, conn)}
                if args.versus:
                    servers["versus"] = (VERSUS_PORT, versus_cluster(args.versus))
                    code["versus"] = servers["versus"][1].execute(
                        "SELECT extversion || ' at ' || %s FROM pg_extension WHERE extname = 'pg_backfill'",
                        [args.versus]).fetchone()[0]
                results = end_to_end(servers, args.shapes.split(","), list(map(int, args.sizes.split(","))), args.repeat,
                                     [int(n) for n in args.batched.split(",")],
                                     [m.strip() for m in args.e2e_methods.split(";") if m.strip()])
            else:
                conn.execute("CREATE TABLE e2e_flush (n int)")
                results = spill_probe(conn, int(args.spill), [(1000, 1, 1), (1000, 1000, 1), (1000, 1000, 2), (10000, 1, 1),
                                                              (10000, 1000, 1), (10000, 10000, 1), (10000, 1000, 2),
                                                              (50000, 1000, 1), (100000, 1, 1), (100000, 1000, 1)])
        elif args.checksum:
            loopback_server(conn)
            results, load = checksum_costs(conn, args.shapes.split(","), list(map(int, args.sizes.split(","))), args.repeat), []
        elif args.gentle_default:
            load = gentle_default(conn, args.repeat, [int(n) for n in args.duty_cycles.split(",") if n],
                                  rows_per_message=args.rows_per_message, batch_size=args.batch_size,
                                  window_seconds=args.window_seconds)
        elif args.load_signal:
            load = load_signal(conn, args.pgbench_seconds, args.repeat, [int(n) for n in args.load_signal.split(",")])
        elif args.many_tables:
            results, load = many_tables(conn, args.repeat), []
        elif args.ddl_cost:
            results, load = ddl_cost(conn, args.repeat), []
        elif args.rehearsal:
            results, load = rehearsal(conn, args.rows), []
        elif args.source_cost:
            cost = source_cost(conn, args.shapes.split(","), list(map(int, args.sizes.split(","))), args.repeat)
            load = []
            if args.pgbench_seconds:
                subprocess.run([PGBENCH, "-i", "-q", "-s", "10", "-h", "127.0.0.1", "-p", str(PORT), "-U", "postgres", "postgres"],
                               check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                conn.execute("VACUUM ANALYZE pgbench_accounts")
                for _ in range(args.repeat):
                    for mode in ("rows", "auto"):
                        load.append(pgbench_latencies(conn, args.pgbench_seconds, mode))
                print(f"\n{'writers under backfills':24} {'TPS':>8} {'p99 ms':>8} {'backfill rows/s':>16} {'table-locked pages':>19}")
                for r in load:
                    print(f"{'lock_mode ' + r['lock_mode']:24} {r['tps']:>8.0f} {r['p99_latency_ms']:>8.2f} "
                          f"{r['rows_backfilled_per_second']:>16.0f} {r['share_of_pages_table_locked']:>19.0%}")
            results = cost
        only = (args.source_cost or args.load_signal or args.gentle_default or args.checksum or args.end_to_end or args.spill or args.many_tables
                or args.ddl_cost or args.rehearsal)
        for shape in ([] if only else args.shapes.split(",")):
            for size in map(int, args.sizes.split(",")):
                table = f"bench_{shape}_{size}"
                create, fill = SHAPES[shape]
                conn.execute(create.format(t=table))
                step = 500_000
                for lo in range(1, size + 1, step):
                    conn.execute(fill.format(t=table, lo=lo, hi=min(size, lo + step - 1)))
                conn.execute(f"VACUUM ANALYZE {table}")
                payload = payload_bytes(conn, table)
                # The methods take turns, so that a slow spell of the shared machine falls on
                # all of them alike rather than on whichever ran then.
                methods = {m: METHODS[m] for m in METHODS if m == "limit" or m in args.methods.split(",")}
                runs = {method: [] for method in methods}
                for _ in range(args.repeat):
                    for method, run in methods.items():
                        # No WAL-triggered checkpoint may overlap a measurement: it competes for
                        # the disk and the CPU (seen overlapping whole runs before this).
                        conn.execute("CHECKPOINT")
                        runs[method].append(run(conn, table, size))
                figures = {}
                for method, samples in runs.items():
                    seconds = statistics.median(s[0] for s in samples)
                    figures[method] = {
                        "seconds": seconds,
                        "rows_per_second": size / seconds,
                        "wal_bytes_per_row": statistics.median(s[1] for s in samples) / size,
                        "peak_memory_kb": max((s[2] for s in samples if s[2] is not None), default=None),
                    }
                limit = figures["limit"]["rows_per_second"]
                for method, f in figures.items():
                    f["ratio_to_limit"] = f["rows_per_second"] / limit
                    results.append({"shape": shape, "rows": size, "method": method,
                                    "payload_bytes_per_row": payload / size, **f})
                conn.execute(f"DROP TABLE {table}")
                print_rows(results[-len(methods):], header=len(results) == len(methods))
        if not only:
            load = pgbench_impact(conn, args.pgbench_seconds, args.pgbench_rate) if args.pgbench_seconds else []
    finally:
        sh(f"cluster_stop {DIR}")
        if args.versus:
            sh(f"BACKFILL_PG_BIN='{args.versus}' cluster_stop {VERSUS_DIR}")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    machine = {"cpus": os.cpu_count(), "platform": platform.platform(), "repeat": args.repeat}
    (out / f"{stamp}.json").write_text(
        json.dumps({"code": code, "machine": machine, "results": results, "load": load}, indent=2)
    )
    print(f"\nwritten to bench/results/{stamp}.json")


def print_rows(results, header):
    if header:
        print(f"\n{'shape':7} {'rows':>9} {'method':14} {'rows/s':>10} {'x limit':>8} {'s':>7} "
              f"{'WAL B/row':>10} {'payload B/row':>14} {'peak KB':>8}")
    for r in results:
        peak = r["peak_memory_kb"] if r["peak_memory_kb"] is not None else "-"
        print(f"{r['shape']:7} {r['rows']:>9} {r['method']:14} {r['rows_per_second']:>10.0f} {r['ratio_to_limit']:>8.2f} "
              f"{r['seconds']:>7.2f} {r['wal_bytes_per_row']:>10.0f} {r['payload_bytes_per_row']:>14.0f} {peak:>8}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
