"""pg_backfill on Citus: rows per second of a backfill of a distributed table with one and with two
worker nodes, against the same rows in one plain table, in one run on throwaway clusters of
PostgreSQL 18 with Citus (a coordinator and two worker nodes, all on this machine).

    PG_MAJOR=18 bash scripts/setup.sh          # builds PostgreSQL 18 and Citus
    PG_MAJOR=18 python3 bench/citus.py --rows 1000000 --repeat 3

The time is the coordinator's: from backfill_start() to its backfill's finished_at (every node
done). The plain table is a table on the coordinator that Citus does not manage. Tables are
vacuumed (frozen) before timing; each figure is the median of --repeat runs, interleaved.
"""

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
DIR, PORT = "/tmp/pg_backfill_bench_citus", 18460  # coordinator; workers on the next ports
CONF = ("shared_preload_libraries = 'citus, pg_backfill'\n"
        "citus.enable_change_data_capture = on\n"
        "max_connections = 100")


def sh(command):
    subprocess.run(["bash", "-c", f"export PG_MAJOR=18; source '{ROOT}/scripts/lib/cluster.sh' && {command}"], check=True)


def connect(port):
    return psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres", autocommit=True)


def start_clusters(workers):
    ports = [PORT + i for i in range(workers + 1)]
    for i, port in enumerate(ports):
        quoted = CONF.replace("'", "\\'")
        sh(f"cluster_start '{DIR}{i}' {port} $'{quoted}'")
        with connect(port) as conn:
            conn.execute("CREATE EXTENSION citus")
    with connect(PORT) as conn:
        conn.execute("SELECT citus_set_coordinator_host('127.0.0.1', %s)", [PORT])
        conn.execute("CREATE EXTENSION pg_backfill")
    return ports


def stop_clusters(count):
    for i in range(count):
        sh(f"cluster_stop '{DIR}{i}'")


def load(conn, table, rows, distributed):
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, a int, b bigint, c numeric(12,2))")
    if distributed:
        # colocate_with none: a new group, its shards spread over the worker nodes there are now.
        conn.execute(f"SELECT create_distributed_table('{table}', 'id', shard_count => 4, colocate_with => 'none')")
    conn.execute(f"INSERT INTO {table} SELECT g, g % 1000, g * 7, g * 0.5 FROM generate_series(1, {rows}) g")
    conn.execute(f"VACUUM (FREEZE, ANALYZE) {table}")


def backfill_seconds(conn, table):
    backfill_id = conn.execute(f"SELECT backfill_start('{table}', confirm => true)").fetchone()[0]
    while True:
        state = conn.execute("SELECT state FROM backfill_status WHERE id = %s", [backfill_id]).fetchone()[0]
        if state != "running":
            break
        time.sleep(0.02)
    assert state == "done", state
    started, finished = conn.execute(
        "SELECT extract(epoch FROM started_at), extract(epoch FROM finished_at) FROM backfill_status WHERE id = %s",
        [backfill_id]).fetchone()
    ends = []
    # A distributed backfill ends when its last node's does: the coordinator sees that on its next
    # look (every 0.5 s), so the nodes' own end is taken (one machine, one clock).
    for port, node_id in conn.execute(
            "SELECT DISTINCT node_port, node_backfill_id FROM backfill_shards WHERE backfill_id = %s",
            [backfill_id]).fetchall():
        with connect(port) as node:
            node_finished = node.execute("SELECT extract(epoch FROM finished_at) FROM backfill_status WHERE id = %s",
                                    [node_id]).fetchone()[0]
            ends.append(node_finished)
    return float((max(ends) if ends else finished) - started)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    ports = start_clusters(2)
    try:
        with connect(PORT) as conn:
            # One worker node first: the distributed table's 4 shards all on it.
            conn.execute("SELECT citus_add_node('127.0.0.1', %s)", [ports[1]])
            load(conn, "on_one_node", args.rows, distributed=True)
            conn.execute("SELECT citus_add_node('127.0.0.1', %s)", [ports[2]])
            load(conn, "on_two_nodes", args.rows, distributed=True)
            load(conn, "plain", args.rows, distributed=False)
            placement = conn.execute(
                "SELECT table_name::text, count(DISTINCT nodeport) FROM citus_shards GROUP BY 1 ORDER BY 1").fetchall()
            times = {"plain table": [], "distributed, 1 worker node": [], "distributed, 2 worker nodes": []}
            for _ in range(args.repeat):
                times["plain table"].append(backfill_seconds(conn, "plain"))
                times["distributed, 1 worker node"].append(backfill_seconds(conn, "on_one_node"))
                times["distributed, 2 worker nodes"].append(backfill_seconds(conn, "on_two_nodes"))
    finally:
        stop_clusters(3)
    plain = statistics.median(times["plain table"])
    print(f"{args.rows} narrow rows, median of {args.repeat} (placement: {placement})")
    print(f"{'table':32} {'median s':>9} {'rows/s':>10} {'vs plain':>9}   runs")
    results = {}
    for name, runs in times.items():
        median = statistics.median(runs)
        results[name] = {"seconds": runs, "median": median, "rows_per_second": args.rows / median}
        print(f"{name:32} {median:9.2f} {args.rows / median:10.0f} {plain / median:8.2f}x   "
              + ", ".join(f"{r:.2f}" for r in runs))
    out = ROOT / "bench" / "results" / f"citus-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps({"rows": args.rows, "repeat": args.repeat, "times": results}, indent=2))
    print(f"written to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
