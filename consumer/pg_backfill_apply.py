#!/usr/bin/env python3
"""pg_backfill_apply: the reference consumer of pg_backfill. It streams a pgoutput slot of a
source database and applies it to a destination PostgreSQL database:

- ordinary changes (insert, update, delete, truncate) of the publication's tables, and
- pg_backfill's messages (prefix `backfill`): each `read` and each row of a `reads` batch as an
  upsert by key, each `absent` as a delete of its key, in stream order (docs/consumers.md).

Every pg_backfill message's HMAC tag is checked (docs/consumers.md, "Authenticated messages");
a message that fails is refused and the program stops without applying it.

It confirms a position to the slot (flush_lsn) only after the destination has committed
everything up to it. Killed at any moment, it starts again from the slot's confirmed position:
what it applied but had not confirmed arrives again, and applying it again changes nothing (every
change is applied as the row's whole new state, or its absence, by key). So nothing is lost and
nothing is doubled.

It applies in batches: the rows of many source transactions are copied (COPY) into a temporary
staging table of the destination, then each table gets one DELETE and one INSERT of the last
state of each key in the batch. Only the last operation on a key within a batch matters, and the
keys deleted and the keys upserted are then disjoint, so the two statements need no order
between them: stream order per key is kept. The destination's work runs in a thread of its own,
so that the stream is read meanwhile. Two things spare the destination work where they can:

- A table whose columns are all of built-in scalar types gets its rows as COPY text, in a
  staging table of its own column types: the consumer turns each row's JSON (a `read`, each row
  of a `reads`) or pgoutput text into COPY's text, and the destination parses no JSON. Other
  tables (json, jsonb, arrays, composites, domains, extensions' types) are staged as JSON and
  made rows at the destination (json_populate_record).
- The INSERT is tried plain first, under a savepoint, and made an INSERT ... ON CONFLICT (an
  upsert) only when a key of the batch is already there: a backfill's rows mostly arrive
  before anything else of theirs, and a plain insert is cheaper.

The destination must have the tables, with the source's columns and a primary key (pg_dump
--schema-only of the source, for example). The source's slot must use pgoutput.
"""

import argparse
import hmac
import io
import json
import operator
import queue
import select
import signal
import sys
import threading
import time

import psycopg2
import psycopg2.errors
import psycopg2.extras
from psycopg2 import sql

PREFIX_BYTES = b"backfill"
DATA = operator.itemgetter("data")  # a `reads` row's data
JSON_TYPES = {114, 3802}  # json, jsonb: a pgoutput value of theirs is JSON text already
EXIT_USER_ERROR, EXIT_FORGED = 2, 3


class UserError(Exception):
    """An error of the user's setup (a DSN, a slot, a table): printed as it is, no traceback."""


# --- pgoutput (protocol version 1: PostgreSQL's docs, "Logical Replication Message Formats") ---
# No maintained Python parser of pgoutput exists (pypgoutput's last release is of 2022); the
# part of the protocol a consumer needs is small and stable, so it is here.

class Reader:
    __slots__ = ("data", "at")

    def __init__(self, data: bytes):
        self.data, self.at = data, 1  # past the message's type byte

    def int(self, size: int, signed=False) -> int:
        value = int.from_bytes(self.data[self.at:self.at + size], "big", signed=signed)
        self.at += size
        return value

    def string(self) -> str:
        end = self.data.index(b"\0", self.at)
        value = self.data[self.at:end].decode()
        self.at = end + 1
        return value

    def tuple(self):
        """TupleData: one entry per column, the value's text, None for NULL, or UNCHANGED for an
        unchanged TOASTed value (an update that did not touch it does not send it)."""
        values = []
        for _ in range(self.int(2)):
            kind = self.data[self.at]
            self.at += 1
            if kind == 0x74:  # 't'
                size = self.int(4)
                values.append(self.data[self.at:self.at + size].decode())
                self.at += size
            elif kind == 0x6E:  # 'n'
                values.append(None)
            elif kind == 0x75:  # 'u'
                values.append(UNCHANGED)
            else:
                raise ValueError(f"pgoutput tuple value of kind {chr(kind)!r}: only text (proto_version 1) is handled")
        return values


UNCHANGED = object()


class Relation:
    """A source table as pgoutput describes it, and the destination table it is applied to."""

    def __init__(self, schema, name, columns, types, target=None):
        self.schema, self.name, self.columns, self.types = schema, name, columns, types
        self.target = target  # a Target, or None for a table this consumer leaves alone
        if target:
            # Where each of the target's columns is in this relation's tuples (None: not sent).
            place = {c: i for i, c in enumerate(columns)}
            self.places = [place.get(c) for c in target.columns]

    def target_values(self, values):
        """A tuple's values in the target's column order, None where the source sends none (as
        json_populate_record leaves a column missing from the JSON NULL)."""
        return [None if i is None or values[i] is UNCHANGED else values[i] for i in self.places]

    def as_json(self, values) -> str:
        """The row as a JSON object, the input of json_populate_record at the destination: text
        values as JSON strings (each type's input function reads them), json/jsonb as they are."""
        parts = []
        for column, type_oid, value in zip(self.columns, self.types, values):
            if value is UNCHANGED:
                continue
            text = "null" if value is None else value if type_oid in JSON_TYPES else json.dumps(value)
            parts.append(f"{json.dumps(column)}:{text}")
        return "{" + ",".join(parts) + "}"


# --- the destination ---

JSON_STAGE = sql.Identifier("pg_backfill_apply_stage")


class Target:
    """A destination table and the statements that apply a batch's staged operations to it.

    `typed`: every column is of a type whose row_to_json rendering is a JSON string, number,
    boolean or null, never an object or array (a built-in scalar type: not json, jsonb, an array,
    a composite, a domain or an extension's type, which may cast itself to JSON): the consumer
    then stages its rows as COPY text in a staging table of the table's own column types
    (`stage`), and the destination parses no JSON. Other tables' operations are staged as JSON
    (pg_backfill_apply_stage) and json_populate_record makes their rows."""

    def __init__(self, number, schema, name, columns, key, typed):
        self.number, self.schema, self.name, self.columns, self.key = number, schema, name, columns, key
        self.typed = typed
        self.table = table = sql.Identifier(schema, name)
        cols = sql.SQL(", ").join(map(sql.Identifier, columns))
        key_match = sql.SQL(" AND ").join(
            sql.SQL("d.{c} = last.{c}").format(c=sql.Identifier(c)) for c in key)
        non_key = [c for c in columns if c not in key]
        on_conflict = (sql.SQL("DO UPDATE SET ") + sql.SQL(", ").join(
            sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c)) for c in non_key)) if non_key else sql.SQL("DO NOTHING")
        # `last`: the last staged operation per key, in stream order; its deletes and inserts.
        apply_last = sql.SQL("""
            deleted AS (
                DELETE FROM {table} AS d USING last WHERE last.pg_backfill_apply_op = 'd' AND {key_match}
            )
            INSERT INTO {table} ({cols}) SELECT {cols} FROM last WHERE pg_backfill_apply_op = 'u'""").format(
            table=table, cols=cols, key_match=key_match)
        upsert = sql.SQL(" ON CONFLICT ({keys}) {on_conflict}").format(
            keys=sql.SQL(", ").join(map(sql.Identifier, key)), on_conflict=on_conflict)
        if typed:
            # (A row's values in column order from its JSON object, in one call.)
            self.values_in_order = operator.itemgetter(*columns) if len(columns) > 1 else lambda row: (row[columns[0]],)
            self.stage = sql.Identifier(f"pg_backfill_apply_rows_{number}")
            # (A temporary table's columns of the table's types, without its constraints: a
            # staged delete carries the key alone.)
            self.create_stage = sql.SQL("""
                CREATE TEMPORARY TABLE {stage} ON COMMIT DELETE ROWS AS
                SELECT NULL::bigint AS pg_backfill_apply_seq, NULL::"char" AS pg_backfill_apply_op, {cols}
                  FROM {table} WITH NO DATA""").format(stage=self.stage, cols=cols, table=table)
            key_cols = sql.SQL(", ").join(map(sql.Identifier, key))
            last = sql.SQL("""
                WITH last AS MATERIALIZED (
                    SELECT DISTINCT ON ({key_cols}) * FROM {stage} ORDER BY {key_cols}, pg_backfill_apply_seq DESC
                ), """).format(key_cols=key_cols, stage=self.stage)
        else:
            self.stage = JSON_STAGE
            key_cols = sql.SQL(", ").join(sql.Identifier("r", c) for c in key)
            # The staged operations of this table, a `reads` batch as its rows; the last one per
            # key (stream order: seq, then the row's place in its batch).
            last = sql.SQL("""
                WITH ops AS (
                    SELECT seq, 0::bigint AS sub,
                           CASE op WHEN 'r' THEN 'u' WHEN 'a' THEN 'd' ELSE op END,
                           CASE op WHEN 'r' THEN doc -> 'data' WHEN 'a' THEN doc -> 'key' ELSE doc END
                      FROM pg_backfill_apply_stage WHERE target = {n} AND op <> 'b'
                    UNION ALL
                    SELECT s.seq, e.sub, 'u', e.row -> 'data'
                      FROM pg_backfill_apply_stage s, json_array_elements(s.doc -> 'rows') WITH ORDINALITY AS e(row, sub)
                     WHERE s.target = {n} AND s.op = 'b'
                ), last AS MATERIALIZED (
                    SELECT DISTINCT ON ({key_cols}) ops.op AS pg_backfill_apply_op, r.*
                      FROM ops, json_populate_record(NULL::{table}, ops.doc) AS r
                     ORDER BY {key_cols}, ops.seq DESC, ops.sub DESC
                ), """).format(n=sql.Literal(number), table=table, key_cols=key_cols)
        # The batch's inserts, and the same as upserts: ApplyThread.apply_batch tries the first,
        # cheaper, and falls back on the second where a key is already there.
        self.apply_insert, self.apply = last + apply_last, last + apply_last + upsert

    def values_of(self, row: dict):
        """A row's JSON object's values in the table's column order, None for a column it lacks
        (as json_populate_record leaves it NULL)."""
        try:
            return self.values_in_order(row)
        except KeyError:
            return [row.get(c) for c in self.columns]

    def __str__(self):
        return f"{self.schema}.{self.name}"


def copy_field(value) -> str:
    """A value in COPY's text format: a row_to_json value parsed with its numbers kept as text
    (parse_int=str, parse_float=str), or a pgoutput value's text."""
    if value is None:
        return "\\N"
    if value is True or value is False:
        return "t" if value else "f"
    if type(value) is not str:
        raise ValueError(f"a JSON {type(value).__name__} for a column of a type staged as text")
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        value = value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return value


def copy_fields(values, plain=False) -> str:
    """A row's values as one line of COPY text (without its newline). `plain`: the caller knows
    no value holds a backslash, tab, newline or carriage return (a JSON text without a
    backslash), so that values that are all strings are joined as they are."""
    if plain:
        try:
            return "\t".join(values)
        except TypeError:  # a NULL or a boolean among them
            pass
    return "\t".join(map(copy_field, values))


def connect(dsn, what, **kw):
    try:
        return psycopg2.connect(dsn, **kw)
    except psycopg2.OperationalError as e:
        raise UserError(f"cannot connect to the {what} ({dsn!r}): {str(e).strip()}") from None


class Destination:
    """The destination: a connection that applies (in the apply thread), and one that reads the
    catalog (in the stream's thread)."""

    def __init__(self, dsn):
        self.conn = connect(dsn, "destination")
        self.conn.set_client_encoding("UTF8")
        self.catalog = connect(dsn, "destination")
        self.catalog.autocommit = True
        self.targets = {}  # (schema, name) -> Target
        with self.conn.cursor() as cur:
            # As a subscription's apply worker does: no triggers, no foreign key checks, since
            # the source checked them and the tables are filled in no particular table order.
            try:
                cur.execute("SET session_replication_role = replica")
            except psycopg2.errors.InsufficientPrivilege:
                self.conn.rollback()
                print("pg_backfill_apply: note: not allowed to SET session_replication_role = replica at the destination "
                      "(superuser only): its triggers and foreign keys are checked as rows arrive", file=sys.stderr)
            cur.execute("""CREATE TEMPORARY TABLE pg_backfill_apply_stage
                           (target int NOT NULL, seq bigint NOT NULL, op "char" NOT NULL, doc json NOT NULL)
                           ON COMMIT DELETE ROWS""")
        self.conn.commit()

    def target(self, schema, name) -> Target:
        """The destination table of that name, with its columns and primary key."""
        found = self.targets.get((schema, name))
        if found:
            return found
        with self.catalog.cursor() as cur:
            cur.execute("""
                SELECT array(SELECT attname FROM pg_attribute WHERE attrelid = c.oid AND attnum > 0
                              AND NOT attisdropped AND attgenerated = '' ORDER BY attnum),
                       array(SELECT a.attname FROM pg_index i, unnest(i.indkey) WITH ORDINALITY AS k(attnum, n), pg_attribute a
                              WHERE i.indrelid = c.oid AND i.indisprimary AND a.attrelid = c.oid AND a.attnum = k.attnum
                              ORDER BY k.n),
                       -- (Target's `typed`: built-in scalar types only.)
                       coalesce((SELECT bool_and(t.typnamespace = 'pg_catalog'::regnamespace AND t.typtype IN ('b', 'r', 'm')
                                                 AND t.typcategory <> 'A' AND t.oid NOT IN ('json'::regtype, 'jsonb'::regtype))
                                   FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
                                  WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''),
                                false)
                  FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
                 WHERE s.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')""", [schema, name])
            row = cur.fetchone()
        if row is None:
            raise UserError(f"table {schema}.{name} does not exist at the destination: create it there with the "
                            f"source's columns and primary key (e.g. pg_dump --schema-only of the source)")
        columns, key, typed = row
        if not key:
            raise UserError(f"table {schema}.{name} at the destination has no primary key: rows are applied by key")
        found = self.targets[(schema, name)] = Target(len(self.targets), schema, name, columns, key, typed)
        return found


def envelope(content: bytes, known={}) -> dict:
    """A pg_backfill message's envelope (op, backfill_id, slot, schema, table), parsed without
    its rows: the destination parses those (json_populate_record). The envelope comes first
    (src/stream/message.rs) and is the same for every read of a table's backfill: each one is
    parsed once (`known`). A message of another form is parsed whole."""
    for rows_start in (b',"rows":[', b',"key":'):
        at = content.find(rows_start)
        if at > 0:
            head = content[:at]
            found = known.get(head)
            if found is None:
                try:
                    found = json.loads(head + b"}")
                except ValueError:
                    break
                if len(known) < 10_000:
                    known[head] = found
            return found
    return json.loads(content)


# --- applying: a thread of its own, so that the stream is read while the destination works ---

class ApplyThread(threading.Thread):
    """Runs the work the stream's thread queues, in order, in the destination's transaction:
    ("apply", [(staging table, COPY data)], targets, rows), ("sql", statement, parameters),
    ("commit", lsn). After
    a commit, `committed_lsn` is the source position the destination now holds everything
    before: the only position ever confirmed to the slot."""

    def __init__(self, destination):
        super().__init__(daemon=True)
        self.conn = destination.conn
        self.work = queue.Queue(maxsize=4)  # bounds memory: the stream waits on a slow destination
        self.committed_lsn = 0
        self.rows_applied = self.commits = 0
        self.failure = None
        self.typed_stages = set()  # the typed targets whose staging table this session has made
        # Per target: its batches' plain inserts that failed in a row, and the batches still to
        # apply as upserts without trying one (apply_batch).
        self.failed_inserts, self.upserts_ahead = {}, {}

    def run(self):
        try:
            while True:
                item = self.work.get()
                with self.conn.cursor() as cur:
                    if item[0] == "apply":
                        _, staged, targets, rows = item
                        for target in targets:
                            if target.typed and target.number not in self.typed_stages:
                                cur.execute(target.create_stage)
                                self.typed_stages.add(target.number)
                        for stage, data in staged:
                            cur.copy_expert(sql.SQL("COPY {} FROM STDIN").format(stage), io.BytesIO(data))
                        for target in targets:
                            self.apply_batch(cur, target)
                        for stage, _ in staged:
                            cur.execute(sql.SQL("DELETE FROM {}").format(stage))
                        self.rows_applied += rows
                    elif item[0] == "sql":
                        cur.execute(item[1], item[2])
                    else:
                        self.conn.commit()
                        self.commits += 1
                        self.committed_lsn = item[1]
                self.work.task_done()
        except BaseException as e:  # the stream's thread raises it
            self.failure = e

    def apply_batch(self, cur, target):
        """A target's staged operations. First as plain inserts, under a savepoint: when the
        destination holds none of the batch's keys (a backfilled table's rows arriving ahead of
        any change of theirs) that is the whole work, and cheaper than INSERT ... ON CONFLICT.
        A key already there fails it (unique_violation) before it commits anything: rolled
        back to the savepoint, the batch is applied as upserts, the same statement with ON
        CONFLICT, so that either way each key ends in its last state of the stream. After a
        failure, the table's next batches go straight to upserts (1, 2, 4, ... up to 64 of
        them while the tries keep failing): a table under live changes pays for few failed tries."""
        ahead = self.upserts_ahead.get(target.number, 0)
        if ahead:
            self.upserts_ahead[target.number] = ahead - 1
        else:
            cur.execute("SAVEPOINT pg_backfill_apply_insert")
            try:
                cur.execute(target.apply_insert)
                cur.execute("RELEASE SAVEPOINT pg_backfill_apply_insert")
                self.failed_inserts[target.number] = 0
                return
            except psycopg2.errors.UniqueViolation:
                cur.execute("ROLLBACK TO SAVEPOINT pg_backfill_apply_insert")
                failed = self.failed_inserts[target.number] = self.failed_inserts.get(target.number, 0) + 1
                self.upserts_ahead[target.number] = min(2 ** (failed - 1), 64)
        cur.execute(target.apply)

    def idle(self):
        return self.work.unfinished_tasks == 0


# --- the stream ---

class Applier:
    def __init__(self, args):
        self.args = args
        self.source = connect(args.source, "source")
        self.source.autocommit = True
        self.check_source()
        self.keys = {}
        self.load_keys()
        self.destination = Destination(args.destination)
        # Every table of the publication must exist at the destination before anything is applied.
        for schema, name in self.published():
            target = self.destination.target(schema, name)
            # (json_populate_record would drop a column the destination lacks without a word.)
            missing = [c for c in self.source_columns(schema, name) if c not in target.columns]
            if missing:
                raise UserError(f"table {target} at the destination has no column {', '.join(missing)}, "
                                f"which the source's has: add it there")
        self.applier = ApplyThread(self.destination)
        self.applier.start()
        self.relations = {}  # pgoutput relation id -> Relation
        # The segment being collected: COPY lines for pg_backfill_apply_stage (bytes), and for
        # each typed target's staging table (str).
        self.json_staged, self.typed_staged = [], {}
        self.staged_rows = 0
        self.touched = set()  # Targets with staged operations
        self.uncommitted_rows = 0  # rows queued since the last commit
        self.queued_since_commit = False
        self.batch_started = None
        self.seq = 0
        self.xid = None
        self.in_transaction = False
        self.pending_lsn = 0  # end of the last source transaction received whole
        self.handed_lsn = 0  # the position of the last commit queued
        self.confirmed_lsn = 0
        self.transactions = 0
        self.started = time.monotonic()
        self.progress_at = self.started + args.progress

    def check_source(self):
        with self.source.cursor() as cur:
            cur.execute("SELECT plugin, database, database = current_database() FROM pg_replication_slots "
                        "WHERE slot_name = %s", [self.args.slot])
            row = cur.fetchone()
            if row is None:
                raise UserError(f"replication slot {self.args.slot!r} does not exist on the source: make it with "
                                f"SELECT pg_create_logical_replication_slot('{self.args.slot}', 'pgoutput')")
            plugin, database, here = row
            if plugin != "pgoutput":
                raise UserError(f"replication slot {self.args.slot!r} uses {plugin}: this consumer reads pgoutput slots")
            if not here:
                raise UserError(f"replication slot {self.args.slot!r} belongs to database {database!r}, "
                                f"not to the source's: connect to {database!r}")
            cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", [self.args.publication])
            if cur.fetchone() is None:
                raise UserError(f"publication {self.args.publication!r} does not exist on the source")
            cur.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_backfill'")
            if cur.fetchone() is None:
                raise UserError("the source database has no pg_backfill (CREATE EXTENSION pg_backfill)")

    def published(self):
        with self.source.cursor() as cur:
            cur.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
                        [self.args.publication])
            return cur.fetchall()

    def source_columns(self, schema, name):
        with self.source.cursor() as cur:
            cur.execute("""SELECT attname FROM pg_attribute
                            WHERE attrelid = format('%%I.%%I', %s::text, %s::text)::regclass
                              AND attnum > 0 AND NOT attisdropped AND attgenerated = ''""", [schema, name])
            return [c for c, in cur.fetchall()]

    def load_keys(self):
        with self.source.cursor() as cur:
            try:
                cur.execute("SELECT id, key FROM backfill.message_key")
            except psycopg2.errors.InsufficientPrivilege:
                raise UserError("the source role may not read backfill.message_key, which checking the messages needs: "
                                "see the consumer grants in docs/security.md") from None
            self.keys = {str(i).encode(): bytes(k) for i, k in cur.fetchall()}  # by key id as the tag writes it

    def genuine(self, content: bytes) -> bool:
        """docs/consumers.md's check: HMAC-SHA256 keyed with the key the tag names, over "<xid>:"
        and the message without its auth field."""
        at = content.rfind(b',"auth":"')
        if at < 0 or not content.endswith(b'"}'):
            return False
        key_id, _, tag = content[at + 9:-2].partition(b":")
        key = self.keys.get(key_id)
        if key is None:
            self.load_keys()  # a key made by a rotation since the last load
            key = self.keys.get(key_id)
        if key is None or len(tag) != 64:
            return False
        signed = b"%d:%s}" % (self.xid, content[:at])
        return hmac.compare_digest(hmac.digest(key, signed, "sha256").hex().encode(), tag)

    # -- staging and handing over --

    def stage_change(self, relation, op, values):
        """A pgoutput change of a row: op 'u', upsert its values; 'd', delete its key."""
        if relation.target.typed:
            self.stage_typed(relation.target, op, [relation.target_values(values)])
        else:
            self.stage(relation.target, op, relation.as_json(values))

    def stage_typed(self, target: Target, op: str, rows, plain=False):
        """Operations of a typed target in stream order, one per row of `rows` (each the values in
        the target's column order): op 'u' upserts it, 'd' deletes its key. `plain`: as
        copy_fields' (no value holds a character COPY escapes)."""
        lines, seq = self.typed_staged.setdefault(target, []), self.seq
        for values in rows:
            seq += 1
            lines.append(f"{seq}\t{op}\t{copy_fields(values, plain)}\n")
        self.staged_more(target, seq - self.seq)
        self.seq = seq

    def stage(self, target: Target, op: str, doc, rows=1):
        """One operation of a target staged as JSON, in stream order. op 'u': upsert the row doc;
        'd': delete the key doc; 'r': a `read` message (its data upserted); 'a': an `absent`
        message (its key deleted); 'b': a `reads` message (its rows' data upserted in order).
        doc: str or bytes."""
        if isinstance(doc, str):
            doc = doc.encode()
        # COPY text format: backslash, newline, carriage return and tab escaped.
        if b"\\" in doc:
            doc = doc.replace(b"\\", b"\\\\")
        if b"\n" in doc or b"\r" in doc or b"\t" in doc:
            doc = doc.replace(b"\n", b"\\n").replace(b"\r", b"\\r").replace(b"\t", b"\\t")
        self.seq += 1
        self.json_staged.append(b"%d\t%d\t%s\t%s\n" % (target.number, self.seq, op.encode(), doc))
        self.staged_more(target, rows)

    def staged_more(self, target, rows):
        self.staged_rows += rows
        self.uncommitted_rows += rows
        self.touched.add(target)
        if self.staged_rows >= self.args.batch_rows:
            self.hand_over_staged()  # bounds memory within a large source transaction

    def hand(self, item):
        """Queues work for the apply thread (waiting while its queue is full)."""
        while True:
            self.check_applier()
            try:
                self.applier.work.put(item, timeout=1)
                return
            except queue.Full:
                continue

    def check_applier(self):
        if self.applier.failure is not None:
            raise self.applier.failure

    def hand_over_staged(self):
        """The segment collected so far, to be applied in the open destination transaction."""
        if not self.touched:
            return
        staged = [(target.stage, "".join(lines).encode()) for target, lines in self.typed_staged.items()]
        if self.json_staged:
            staged.append((JSON_STAGE, b"".join(self.json_staged)))
        self.hand(("apply", staged, sorted(self.touched, key=lambda t: t.number), self.staged_rows))
        self.json_staged, self.typed_staged, self.staged_rows, self.touched = [], {}, 0, set()
        self.queued_since_commit = True

    def hand_sql(self, statement, parameters=None):
        """A statement in its place in the stream: what was staged before it is applied first."""
        self.hand_over_staged()
        self.hand(("sql", statement, parameters))
        self.queued_since_commit = True

    def commit(self):
        """Queues the destination's commit of everything received up to the last whole source
        transaction; the slot is confirmed once the apply thread has committed it (confirm())."""
        self.hand_over_staged()
        if self.queued_since_commit or self.pending_lsn > self.handed_lsn:
            self.hand(("commit", self.pending_lsn))
            self.handed_lsn = self.pending_lsn
            self.queued_since_commit = False
        self.uncommitted_rows, self.batch_started = 0, None

    def confirm(self, cursor):
        """Confirms to the slot what the destination has committed, and only that."""
        self.check_applier()
        committed = self.applier.committed_lsn
        if committed > self.confirmed_lsn:
            self.confirmed_lsn = committed
            cursor.send_feedback(flush_lsn=committed, force=True)

    # -- messages --

    def handle(self, payload: bytes):
        if payload[0] == 0x4D:  # 'M', a logical decoding message: most of a backfill, so first
            # flags (1), lsn (8), prefix (NUL-terminated), length (4), content
            end = payload.index(b"\0", 10)
            if payload[1] & 1 and payload[10:end] == PREFIX_BYTES:
                self.backfill_message(payload[end + 5:])
            return
        kind = payload[0:1]
        r = Reader(payload)
        if kind == b"B":
            r.int(8), r.int(8)
            self.xid = r.int(4)
            self.in_transaction = True
        elif kind == b"C":
            r.int(1), r.int(8)
            self.pending_lsn = r.int(8)  # the transaction's end: where the stream resumes after it
            self.in_transaction = False
            self.transactions += 1
        elif kind == b"R":
            relid, schema, name = r.int(4), r.string(), r.string()
            r.int(1)
            columns, types = [], []
            for _ in range(r.int(2)):
                r.int(1)
                columns.append(r.string())
                types.append(r.int(4))
                r.int(4)
            # (Not pg_backfill's own state tables, which a FOR ALL TABLES publication sends.)
            target = self.destination.target(schema, name) if schema != "backfill" else None
            self.relations[relid] = Relation(schema, name, columns, types, target)
        elif kind == b"I":
            relation = self.relations[r.int(4)]
            r.int(1)  # 'N'
            if relation.target:
                self.stage_change(relation, "u", r.tuple())
        elif kind == b"U":
            relation = self.relations[r.int(4)]
            old = None
            if payload[r.at] in b"KO":
                r.int(1)
                old = r.tuple()
            r.int(1)  # 'N'
            new = r.tuple()
            if not relation.target:
                return
            if old is not None and self.key_of(relation, old) != self.key_of(relation, new):
                self.stage_change(relation, "d", old)
            if UNCHANGED in new:
                self.patch(relation, new)
            else:
                self.stage_change(relation, "u", new)
        elif kind == b"D":
            relation = self.relations[r.int(4)]
            r.int(1)  # 'K' or 'O'
            if relation.target:
                self.stage_change(relation, "d", r.tuple())
        elif kind == b"T":
            count, options = r.int(4), r.int(1)
            targets = [self.relations[r.int(4)].target for _ in range(count)]
            targets = [t for t in targets if t]
            if targets:
                self.hand_sql(sql.SQL("TRUNCATE {}{}{}").format(
                    sql.SQL(", ").join(t.table for t in targets),
                    sql.SQL(" RESTART IDENTITY" if options & 2 else ""), sql.SQL(" CASCADE" if options & 1 else "")))

    def key_of(self, relation, values):
        index = {c: i for i, c in enumerate(relation.columns)}
        return tuple(values[index[c]] for c in relation.target.key)

    def patch(self, relation, new):
        """An update that left TOASTed values out (unchanged): the columns it has, by key."""
        target = relation.target
        present = [c for c, v in zip(relation.columns, new) if v is not UNCHANGED and c in target.columns]
        self.hand_sql(sql.SQL("UPDATE {t} AS d SET {sets} FROM json_populate_record(NULL::{t}, %s) AS r WHERE {match}").format(
            t=target.table,
            sets=sql.SQL(", ").join(sql.SQL("{c} = r.{c}").format(c=sql.Identifier(c)) for c in present),
            match=sql.SQL(" AND ").join(sql.SQL("d.{c} = r.{c}").format(c=sql.Identifier(c)) for c in target.key)),
            [relation.as_json(new)])
        self.uncommitted_rows += 1

    def backfill_message(self, content: bytes):
        if not self.genuine(content):
            raise Forged(f"a pg_backfill message in transaction {self.xid} failed its authentication check "
                         f"(forged, altered, or signed with a key the source no longer has): refused, nothing after "
                         f"it applied. Its start: {content[:200]!r}")
        message = envelope(content)
        if message.get("slot", self.args.slot) != self.args.slot:
            return  # a backfill bound to another slot: its consumer applies it
        op = message["op"]
        if op in ("read", "reads", "absent"):
            target = self.destination.target(message["schema"], message["table"])
            if target.typed:
                # The row (its data), the rows or the key as COPY text: numbers kept as their
                # text, which the column's input function reads; a message without a backslash
                # holds no value that COPY text escapes (JSON escapes tabs and newlines).
                whole = json.loads(content, parse_int=str, parse_float=str)
                rows = map(DATA, whole["rows"]) if op == "reads" else [whole["data" if op == "read" else "key"]]
                self.stage_typed(target, "d" if op == "absent" else "u", map(target.values_of, rows),
                                 plain=b"\\" not in content)
            elif op == "reads":
                # The message as it is: the destination takes the rows from it (and the row or
                # the key of the others). (The rows' count, for the batch's size only: a "key"
                # object nested in a json value may count too.)
                self.stage(target, "b", content, rows=content.count(b'{"key":'))
            else:
                self.stage(target, "r" if op == "read" else "a", content)
        elif op == "table_start":
            self.destination.target(message["schema"], message["table"])
            self.say(f"backfill {message['backfill_id']}: {message['schema']}.{message['table']} started "
                     f"(about {message.get('rows_estimated')} rows)")
        elif op == "table_end":
            for s in message.get("sequences") or []:
                if s.get("next_value") is not None:
                    self.sequence(s["sequence"], s["next_value"])
            self.say(f"backfill {message['backfill_id']}: {message['schema']}.{message['table']} read whole "
                     f"({message['rows']} rows)")

    def sequence(self, name, next_value):
        """A sequence a table's columns own, at the end of the table's scan: the destination's
        same-named sequence is moved forward to the source's next value (never back), so that
        ids the destination issues after a cutover do not collide with the source's."""
        self.hand_sql("""SELECT setval(r, %(next)s, false)
                           FROM to_regclass(%(name)s) AS r JOIN pg_sequence q ON q.seqrelid = r
                          WHERE q.seqincrement > 0
                            AND coalesce(pg_sequence_last_value(r) + q.seqincrement, q.seqstart) < %(next)s""",
                      {"next": next_value, "name": name})

    def say(self, line):
        print(f"pg_backfill_apply: {line}", file=sys.stderr, flush=True)

    def progress(self, force=False):
        now = time.monotonic()
        if not force and now < self.progress_at:
            return
        self.progress_at = now + self.args.progress
        lsn, rows = self.confirmed_lsn, self.applier.rows_applied
        self.say(f"{rows} rows applied from {self.transactions} transactions in {self.applier.commits} commits, "
                 f"confirmed {lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}, {rows / max(now - self.started, 1e-9):.0f} rows/s")

    # -- the loop --

    def run(self):
        conn = connect(self.args.source, "source (replication)",
                       connection_factory=psycopg2.extras.LogicalReplicationConnection)
        cur = conn.cursor()
        try:
            cur.start_replication(slot_name=self.args.slot, decode=False, status_interval=1,
                                  options={"proto_version": "1", "publication_names": self.args.publication,
                                           "messages": "true"})
        except psycopg2.errors.ObjectInUse:
            raise UserError(f"replication slot {self.args.slot!r} is in use by another consumer") from None
        self.say(f"streaming slot {self.args.slot} (publication {self.args.publication}) into the destination")
        while True:
            try:
                msg = cur.read_message()
            except psycopg2.Error as e:
                raise StreamLost(f"the source's replication stream broke off ({str(e).strip()}): started again, "
                                 f"this consumer resumes from the slot's confirmed position") from None
            if msg is not None:
                self.handle(msg.payload)
                if self.batch_started is None:
                    self.batch_started = time.monotonic()
                # Between two source transactions, commit when the batch is full or old enough.
                if not self.in_transaction and (
                        self.uncommitted_rows >= self.args.batch_rows
                        or time.monotonic() - self.batch_started >= self.args.batch_seconds):
                    self.commit()
                self.confirm(cur)
                continue
            # Nothing more to read right now: apply and confirm what is complete, so that a
            # backfill bound to the slot, which waits on the slot's confirmation, goes on.
            if not self.in_transaction:
                self.commit()
            self.confirm(cur)
            if (not self.in_transaction and self.applier.idle() and self.confirmed_lsn == self.handed_lsn
                    and cur.wal_end > self.confirmed_lsn):
                # Idle and everything received committed: the server's position may be confirmed
                # too (transactions the publication does not concern are not sent, only this position).
                self.confirmed_lsn = self.handed_lsn = cur.wal_end
                cur.send_feedback(flush_lsn=self.confirmed_lsn)
            self.progress()
            # (Briefly while the apply thread has work: its commit is to be confirmed soon.)
            select.select([cur], [], [], 1.0 if self.applier.idle() else 0.01)


class Forged(Exception):
    pass


class StreamLost(Exception):
    pass


def main():
    parser = argparse.ArgumentParser(
        prog="pg_backfill_apply", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: pg_backfill_apply.py --source 'host=old dbname=shop' --slot migrate --publication migrate "
               "--destination 'host=new dbname=shop'   (docs/migrating.md walks a whole migration)")
    parser.add_argument("--source", required=True, metavar="DSN",
                        help="the source database (libpq connection string or URI); its role needs REPLICATION and "
                             "the consumer grants of docs/security.md")
    parser.add_argument("--slot", required=True, help="the source's logical replication slot (pgoutput)")
    parser.add_argument("--publication", required=True, help="the publication whose tables are applied")
    parser.add_argument("--destination", required=True, metavar="DSN", help="the destination database")
    parser.add_argument("--batch-rows", type=int, default=20000,
                        help="rows applied per destination transaction, at most (default 20000; a larger source "
                             "transaction is applied whole, staged in steps of this many)")
    parser.add_argument("--batch-seconds", type=float, default=1.0,
                        help="the longest a batch collects before it is committed and confirmed (default 1)")
    parser.add_argument("--progress", type=float, default=10.0, metavar="SECONDS",
                        help="seconds between progress lines on stderr (default 10)")
    args = parser.parse_args()
    # SIGTERM (a service manager's stop) and SIGINT stop it alike: whatever the destination has
    # not committed is rolled back and comes again from the slot. (SIGINT explicitly: a shell
    # starts background jobs with it ignored.)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    applier = None
    try:
        applier = Applier(args)
        applier.run()
    except UserError as e:
        print(f"pg_backfill_apply: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Forged as e:
        print(f"pg_backfill_apply: error: {e}", file=sys.stderr)
        return EXIT_FORGED
    except KeyboardInterrupt:
        if applier:
            applier.progress(force=True)
        return 130
    except StreamLost as e:
        print(f"pg_backfill_apply: error: {e}", file=sys.stderr)
        return 1
    except psycopg2.Error as e:
        # A server's error (a constraint, a lost connection): nothing after the last confirmed
        # position is lost, the slot sends it again on the next start.
        print(f"pg_backfill_apply: error: {str(e).strip()}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
