"""Docs as tests: every example in README.md and docs/*.md that shows output is run against this
run's server, and its output compared with the one the docs show (as pg_regress's expected files
do for pg_cron's and pg_search's SQL tests).

The convention, for whoever writes an example (pg_test/README.md says it for readers too):

- A fenced block that shows output (a psql session, query results, an error, a NOTICE, log
  lines, a message) is preceded by a marker line, an HTML comment that GitHub does not render:
    <!-- example: setup=orders,demo_slot vary=worker_pid -->      run and compared
    <!-- example not run: why -->                                 shown only, with the reason
  A block with output and no marker fails test_every_example_with_output_is_marked.
- A psql session is the block itself: each `db=# ` line starts a statement (continued by
  `db-# ` lines, or by indented ones until its `;`), the lines up to the next prompt are its
  output. The test feeds the statements to one psql session in a fresh database with
  pg_backfill (the prompt's name is not used) and rebuilds the block from the doc's prompts and
  psql's output.
- Other blocks name with `run=NAME` a scenario below (SCENARIOS) that produces their text: a
  message from a slot, the server's log lines.
- `setup=` lists what exists before the session starts (SETUPS below: tables, slots, copies),
  in order. A statement may start a backfill, wait for it (`backfill_wait`), and so on.
- What varies between runs is masked on both sides before they are compared: built in, every
  timestamp, LSN and authentication tag (`1:5be0...` in full or cut short with `...`); per
  example, `vary=` columns (a column of a table, or a line of an expanded `\\x` record) and
  `mask=` regular expressions written between backquotes (`mask=`pid \\d+``); `ignore=` a
  regular expression of lines that one major prints and another does not (18's `to_regclass()`
  reports a missing relation at DEBUG1, 15's does not), left out of both sides.
- A line `...` alone in the shown output stands for any lines (none included): partial output.

`BACKFILL_DOCS_UPDATE=1 bash scripts/test.sh pg_test/test_docs.py` rewrites each block whose
output differs with what the run printed (a block with `...` is rewritten whole: put the
elisions back), for the lead to review with `git diff` after a change of the product.
"""

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import PG_BIN, ROOT, wait_for

DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
UPDATE = os.environ.get("BACKFILL_DOCS_UPDATE") == "1"
MARKER = re.compile(r"^<!-- example(?P<not_run> not run)?:(?P<args>.*)-->\s*$")
PROMPT = re.compile(r"^(?P<prompt>\w+[=-]# )(?P<rest>.*)$")
# A block shows output when it has a psql prompt, a result's frame, or a server message.
OUTPUT = re.compile(r"^\s*(\w+=# |-\[ RECORD|(ERROR|NOTICE|LOG|DEBUG|WARNING):  |\(\d+ rows?\)$|-+(\+-+)+$)|\"auth\":\"", re.M)
BOUNDARY = "@@docs-example-boundary@@"


@dataclass
class Example:
    doc: str
    line: int  # of the block's opening fence, 1-based
    block: str  # the block's text, between its fences
    not_run: str = ""  # the reason, for a block shown only
    setup: list = field(default_factory=list)
    vary: list = field(default_factory=list)
    masks: list = field(default_factory=list)
    ignore: list = field(default_factory=list)
    run: str = ""
    lang: str = ""

    @property
    def id(self):
        return f"{self.doc}:{self.line}"


def parse_marker(args: str, example: Example) -> None:
    for name, value in re.findall(r"(\w+)=(`[^`]*`|\S+)", args):
        if name in ("mask", "ignore"):
            getattr(example, "masks" if name == "mask" else "ignore").append(value.strip("`"))
        elif name in ("setup", "vary"):
            getattr(example, name).extend(v for v in value.split(",") if v)
        elif name == "run":
            example.run = value
        else:
            raise AssertionError(f"{example.id}: unknown marker argument {name}=")


def examples():
    """Every fenced block of the docs that shows output or carries a marker."""
    found = []
    for doc in DOCS:
        lines = (ROOT / doc).read_text().split("\n")
        i = 0
        while i < len(lines):
            fence = re.match(r"^\s*```(\S*)\s*$", lines[i])
            if not fence:
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if re.match(r"^\s*```\s*$", lines[j]))
            indent = len(lines[i]) - len(lines[i].lstrip())
            block = "\n".join(line[indent:] for line in lines[i + 1 : end])
            marker = MARKER.match(lines[i - 1].strip()) if i > 0 else None
            if marker or (OUTPUT.search(block) and fence[1] not in ("python", "sh")):
                example = Example(doc, i + 1, block, lang=fence[1])
                if marker and marker["not_run"]:
                    example.not_run = marker["args"].strip() or "?"
                elif marker:
                    parse_marker(marker["args"], example)
                found.append((example, bool(marker)))
            i = end + 1
    return found


EXAMPLES = [e for e, marked in examples() if marked and not e.not_run]


def test_every_example_with_output_is_marked():
    """A block that shows output runs, or says why not: a new example cannot go unchecked."""
    unmarked = [e.id for e, marked in examples() if not marked]
    assert not unmarked, f"blocks with output and no <!-- example: ... --> marker before them: {unmarked}"
    reasonless = [e.id for e, _ in examples() if e.not_run == "?"]
    assert not reasonless, f"<!-- example not run: ... --> without a reason: {reasonless}"


# --- set-ups: what exists before an example's session starts ------------------------------------------

def orders(conn, rows=50000):
    """The demo's table (scripts/demo.sh): 50,000 orders."""
    conn.execute(f"""
        CREATE TABLE orders (id bigint PRIMARY KEY, customer_id integer NOT NULL, status text NOT NULL,
                             amount numeric(10,2) NOT NULL, items jsonb NOT NULL, created_at timestamptz NOT NULL);
        INSERT INTO orders
        SELECT g, 1 + g % 5000, (ARRAY['new', 'paid', 'shipped'])[1 + g % 3], round((g % 997) * 1.37, 2),
               jsonb_build_array(jsonb_build_object('sku', 'SKU-' || g % 100, 'qty', 1 + g % 4)),
               timestamptz '2024-01-01' + g * interval '1 minute'
          FROM generate_series(1, {rows}) g;
        ANALYZE orders;""")


def orders_copy(conn):
    """A copy of orders with one row deleted (5), one amount (40000) and one status (20002) changed."""
    conn.execute("""
        CREATE TABLE orders_copy (LIKE orders INCLUDING ALL);
        INSERT INTO orders_copy SELECT * FROM orders;
        DELETE FROM orders_copy WHERE id = 5;
        UPDATE orders_copy SET amount = amount + 1 WHERE id = 40000;
        UPDATE orders_copy SET status = 'lost' WHERE id = 20002;
        ANALYZE orders_copy;""")


def orders_copy_of_three_columns(conn):
    """A copy of orders' columns id, status and amount, with one row missing (42) and one stale (7)."""
    conn.execute("""
        CREATE TABLE orders_copy (id bigint PRIMARY KEY, status text NOT NULL, amount numeric(10,2) NOT NULL);
        INSERT INTO orders_copy SELECT id, status, amount FROM orders WHERE id <> 42;
        UPDATE orders_copy SET status = 'new' WHERE id = 7;""")


def events(conn):
    """A table keyed (tenant, id) with 90% of its 100,000 rows in one tenant."""
    conn.execute("""
        CREATE TABLE events (tenant text, id integer, payload text, PRIMARY KEY (tenant, id));
        INSERT INTO events SELECT 'big', g, 'x' FROM generate_series(1, 90000) g;
        INSERT INTO events SELECT 'tenant-' || g % 100, g, 'x' FROM generate_series(1, 10000) g;
        ANALYZE events;""")


def slot(name, plugin):
    def make(conn):
        conn.execute("SELECT pg_create_logical_replication_slot(%s, %s)", [name, plugin])
    return make


def shop_publication(conn):
    conn.execute("CREATE PUBLICATION shop FOR TABLE orders")


def a_backfill_waiting_for_its_consumer(conn):
    """tutorial.md's worked example: orders' backfill for the slot of a pgoutput consumer that is not
    streaming yet, paced at 20,000 rows/s; returns once its worker waits for the consumer."""
    orders(conn)
    slot("search_index", "pgoutput")(conn)
    shop_publication(conn)
    conn.execute("SELECT backfill_start('orders', confirm => true, slot => 'search_index', publication => 'shop',"
                 " rows_per_second => 20000)")
    wait_for(lambda: conn.execute("SELECT waiting_kind = 'consumer_away' FROM backfill_status WHERE id = 1").fetchone()[0],
             what="the backfill to wait for its consumer")


SETUPS = {
    "orders": orders,
    "orders_1m": lambda conn: orders(conn, rows=1000000),
    "orders_copy": orders_copy,
    "orders_copy_of_three_columns": orders_copy_of_three_columns,
    "events": events,
    "demo_slot": slot("demo_slot", "test_decoding"),  # the demo's slot (scripts/demo.sh)
    "search_index": slot("search_index", "pgoutput"),  # the worked example's consumer's slot...
    "shop": shop_publication,  # ...and its publication
    "waiting_backfill": a_backfill_waiting_for_its_consumer,
}


def a_streaming_consumer(conn, cluster):
    """A consumer of search_index that streams (for publication shop); stopped after the example."""
    consumer = pgoutput_consumer(cluster, conn.info.dbname)

    def stop():
        consumer.terminate()
        consumer.wait(10)
    return stop


# Set-ups that also need the cluster; each returns what stops what it started.
CLUSTER_SETUPS = {"consumer": a_streaming_consumer}


# --- scenarios: the text of a block that is not a psql session ----------------------------------------

def first_message(conn, op, where=""):
    """The content of the first backfill message of `op` in demo_slot, as JSON text."""
    row = conn.execute(
        "SELECT substring(data from 'content:(.*)') FROM pg_catalog.pg_logical_slot_peek_changes('demo_slot', NULL, NULL)"
        " WHERE data LIKE %s LIMIT 1",
        [f'%"op":"{op}"%{where}%'],
    ).fetchone()
    return row[0]


def a_read_message(conn, cluster):
    """tutorial.md's and consumers.md's read: row 42 of the demo's orders."""
    conn.execute("SELECT backfill_start('orders', confirm => true)")
    conn.execute("SELECT backfill_wait(1)")
    return pretty_message(first_message(conn, "read", '"key":{"id":42}'))


def a_batch_message(conn, cluster):
    """consumers.md's batch: a backfill of 5 rows, 4 a page, in batches of 3."""
    conn.execute("DELETE FROM orders WHERE id > 5")
    conn.execute("SELECT backfill_start('orders', confirm => true, batch_size => 4, rows_per_message => 3)")
    conn.execute("SELECT backfill_wait(1)")
    return pretty_message(first_message(conn, "reads"))


def pretty_message(content: str) -> str:
    """A message as the docs print it: a line for its envelope, one for `"data"` (for a batch, one
    for each of its rows) and one for `"commit_lsn"` and `"auth"`."""
    text = re.sub(r',("rows"|"commit_lsn")', r',\n \1', content)
    if '"op":"reads"' in content:
        return re.sub(r'\},\{"key"', '},\n        {"key"', text)
    return re.sub(r',"data"', ',\n "data"', text, count=1)


def pgoutput_consumer(cluster, dbname):
    """A streaming consumer of search_index for publication shop (pg_recvlogical, confirming every second)."""
    return subprocess.Popen(
        [f"{PG_BIN}/pg_recvlogical", "-h", "127.0.0.1", "-p", str(cluster.port), "-U", "postgres", "-d", dbname,
         "--slot", "search_index", "--start", "-s", "1", "-F", "1", "-o", "proto_version=1",
         "-o", "publication_names=shop", "-o", "messages=true", "-f", "/dev/null"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def log_lines_of_a_backfill_for_a_slot(conn, cluster):
    """operations.md's log lines: the worked example's backfill, whose consumer starts streaming
    once it waits for it, to its end. (Lines of the worker, without the server's prefix.)"""
    log = Path(cluster.dir, "server.log")
    since = log.stat().st_size
    a_backfill_waiting_for_its_consumer(conn)
    consumer = pgoutput_consumer(cluster, conn.info.dbname)
    try:
        conn.execute("SELECT backfill_wait(1)")
    finally:
        consumer.terminate()
        consumer.wait(10)
    wait_for(lambda: re.search(rb'": done\n', log.read_bytes()[since:]), what="the worker's last log line")
    lines = log.read_bytes()[since:].decode(errors="replace").split("\n")
    # (This database's workers' lines only: an earlier example's database may be dropping.)
    ours = f' LOG:  pg_backfill 1 in database "{conn.info.dbname}": '
    return "\n".join(re.sub(r"^.*? LOG:  ", "LOG:  ", line) for line in lines if ours in line)


SCENARIOS = {
    "log_lines": log_lines_of_a_backfill_for_a_slot,
    "a_read_message": a_read_message,
    "a_batch_message": a_batch_message,
}


# --- running and comparing ----------------------------------------------------------------------------

def statements(block: str):
    """A psql session's statements: [(the doc's lines of it, the statement, the doc's output)]."""
    result, current = [], None
    for line in block.split("\n"):
        prompt = PROMPT.match(line)
        if prompt and prompt["prompt"].endswith("=# "):
            current = [[line], [prompt["rest"]], [], False]
            result.append(current)
        elif current and not current[3]:
            current[0].append(line)
            current[1].append(prompt["rest"] if prompt else line)
        elif current:
            current[2].append(line)
        if current and not current[3]:
            last = current[1][-1].rstrip()
            current[3] = last.endswith(";") or last.lstrip().startswith(("\\", "--")) or "\\g" in last
    return [(shown, "\n".join(sql), "\n".join(out)) for shown, sql, out, _ in result]


def run_session(conn, cluster, block: str) -> str:
    parts = statements(block)
    script = "".join(f"{sql}\n\\echo {BOUNDARY}\n" for _, sql, _ in parts)
    psql = subprocess.run(
        [f"{PG_BIN}/psql", "-X", "-h", "127.0.0.1", "-p", str(cluster.port), "-U", "postgres", "-d", conn.info.dbname,
         "-f", "-"],
        input=script, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
    )
    outputs = re.sub(r"^psql:<stdin>:\d+: ", "", psql.stdout, flags=re.M).split(BOUNDARY + "\n")
    rendered = []
    for (shown, _, _), output in zip(parts, outputs):
        rendered.append("\n".join(shown))
        if output.strip():
            rendered.append(output.rstrip("\n") + ("\n" if output.endswith("\n\n") else ""))
    # (psql pads a header's last column with spaces: the docs carry no trailing spaces.)
    return "\n".join(line.rstrip() for line in "\n".join(rendered).split("\n")).rstrip("\n")


BUILT_IN_MASKS = [
    (r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d(:\d\d)?)?", "<time>"),
    (r"\b[0-9A-F]{1,8}/[0-9A-F]{1,8}\b", "<lsn>"),
    (r"\b\d+:[0-9a-f]{64}\b|\b\d+:[0-9a-f]{8}\.\.\.", "<auth>"),
]


def normalized(text: str, example: Example):
    """The lines of a block with what varies masked and table cells stripped of their padding."""
    for pattern, replacement in BUILT_IN_MASKS:
        text = re.sub(pattern, replacement, text)
    for pattern in example.masks:
        text = re.sub(pattern, "<varies>", text)
    text = "\n".join(line for line in text.split("\n") if not any(re.search(p, line) for p in example.ignore))
    lines, columns = [], None
    text_lines = text.split("\n")
    for i, line in enumerate(text_lines):
        stripped = line.strip()
        if re.match(r"^-\[ RECORD \d+ \]", stripped):
            lines.append(re.match(r"^-\[ RECORD \d+ \]", stripped)[0])
            columns = "record"
            continue
        if i + 1 < len(text_lines) and re.match(r"^-+(\+-+)*$", text_lines[i + 1].strip()) and "|" in line:
            columns = [c.strip() for c in line.split("|")]
            lines.append(" | ".join(columns))
            continue
        if re.match(r"^-+(\+-+)*$", stripped):
            lines.append("---")
            continue
        if columns == "record" and re.match(r"^\w+\s*\|", line):
            name, value = (s.strip() for s in line.split("|", 1))
            lines.append(f"{name} | {'<varies>' if name in example.vary else value}")
            continue
        if isinstance(columns, list) and "|" in line and not PROMPT.match(line):
            cells = [c.strip() for c in line.split("|")]
            cells = ["<varies>" if i < len(columns) and columns[i] in example.vary else c for i, c in enumerate(cells)]
            lines.append(" | ".join(cells))
            continue
        if not stripped or PROMPT.match(line) or re.match(r"^\(\d+ rows?\)$", stripped):
            columns = None if not stripped or PROMPT.match(line) else columns
        lines.append(line.rstrip())
    return lines


def matches(expected, actual) -> bool:
    """Line by line, a line `...` in `expected` standing for any lines of `actual`."""
    if not expected:
        return not actual
    if expected[0] == "...":
        return any(matches(expected[1:], actual[k:]) for k in range(len(actual) + 1))
    return bool(actual) and expected[0] == actual[0] and matches(expected[1:], actual[1:])


def rewrite(example: Example, actual: str) -> None:
    path = ROOT / example.doc
    text = path.read_text()
    lines = text.split("\n")
    indent = lines[example.line - 1][: len(lines[example.line - 1]) - len(lines[example.line - 1].lstrip())]
    old = "\n".join(indent + line if line else line for line in example.block.split("\n"))
    new = "\n".join(indent + line if line else line for line in actual.split("\n"))
    assert text.count(old) == 1, f"{example.id}: the block is not unique in its file, rewrite it by hand"
    path.write_text(text.replace(old, new))


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_the_docs_example_shows_what_the_product_prints(cluster, db, example):
    cleanups = []
    try:
        for name in example.setup:
            assert name in SETUPS or name in CLUSTER_SETUPS, \
                f"{example.id}: setup={name} is not one of {sorted([*SETUPS, *CLUSTER_SETUPS])}"
            cleanups.append(CLUSTER_SETUPS[name](db, cluster) if name in CLUSTER_SETUPS else SETUPS[name](db))
        if example.run:
            assert example.run in SCENARIOS, f"{example.id}: run={example.run} is not one of {sorted(SCENARIOS)}"
            actual = SCENARIOS[example.run](db, cluster)
        else:
            actual = run_session(db, cluster, example.block)
    finally:
        for cleanup in reversed(cleanups):
            if cleanup:
                cleanup()
    expected_lines, actual_lines = normalized(example.block, example), normalized(actual, example)
    if matches(expected_lines, actual_lines):
        return
    if UPDATE:
        rewrite(example, actual)
        pytest.skip(f"{example.id}: rewritten with this run's output")
    pytest.fail(f"{example.id} differs from what the product printed:\n--- shown\n{example.block}\n--- printed\n{actual}\n"
                f"(BACKFILL_DOCS_UPDATE=1 rewrites it; masks and markers: pg_test/test_docs.py)", pytrace=False)
