"""The message keys reach no decoded stream (test_decoding, wal2json, pgoutput for a FOR ALL
TABLES publication), in any form, at install, rotation or update, nor pg_dump's output; the
security check flags privileges on their sequences; a key retired while it is read is read
again; the keys verify on a physical standby and after its promotion."""

import base64
import json
import subprocess
import threading

import psycopg
import pytest

from conftest import PG_BIN, error_of, extra_cluster, messages_with_xids, status, wait_for, wait_until_ended, worker_pid
from security_helpers import all_keys, decoded, make_table, signed, sql_valid, start, tag_is_valid, value


# --- the message keys reach no decoded stream -----------------------------------------------------

def key_forms(key: bytes) -> list:
    """Every form in which a key's bytes could show in a decoded change, as bytes: raw, hex
    (either case, as bytea's output and JSON carry it), base64, bytea's escape format, and its
    four 8-byte parts as the bigints of the sequences that hold them."""
    escaped = "".join("\\\\" if b == 0x5C else chr(b) if 0x20 <= b < 0x7F else f"\\{b:03o}" for b in key)
    parts = [str(int.from_bytes(key[i : i + 8], "big", signed=True)) for i in range(0, len(key), 8)]
    return [key, key.hex().encode(), key.hex().upper().encode(), base64.b64encode(key), escaped.encode(),
            *(part.encode() for part in parts)]


DECODERS = {"td": "test_decoding", "w2j": "wal2json", "po": "pgoutput"}


def make_decoding_slots(conn, suffix):
    """A test_decoding, a wal2json and a pgoutput slot (for a FOR ALL TABLES publication): their names by decoder."""
    conn.execute("CREATE PUBLICATION every_table FOR ALL TABLES")
    slots = {}
    for short, plugin in DECODERS.items():
        slots[short] = f"{short}_{suffix}"
        conn.execute("SELECT pg_create_logical_replication_slot(%s, %s)", [slots[short], plugin])
    return slots


def decoded_changes(conn, slots) -> dict:
    """Every change each slot decodes (consumed), as bytes, by decoder."""
    options = {
        "td": "'include-xids', '1'",
        "w2j": "'format-version', '2'",
        "po": "'proto_version', '1', 'publication_names', 'every_table', 'messages', 'true'",
    }
    return {short: [bytes(data) for data, in conn.execute(
                f"SELECT data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, {options[short]})", [slot]).fetchall()]
            for short, slot in slots.items()}


def assert_no_key_in(changes: dict, keys: dict):
    """No decoded change holds a key's bytes in any form, nor is a change of a table
    backfill.message_key (the keys' table before 0.10.0); each decoder did decode pg_backfill's
    state tables (the key's row among them), or this would prove nothing."""
    for short, datas in changes.items():
        for key_id, key in keys.items():
            for form in key_forms(bytes(key)):
                leaks = [d for d in datas if form in d]
                assert leaks == [], f"{DECODERS[short]} decoded key {key_id} as {form!r}: {leaks[0][:300]!r}"
    of_key_table = {
        "td": lambda d: d.startswith(b"table backfill.message_key:"),
        "w2j": lambda d: b'"schema":"backfill","table":"message_key"' in d,
        "po": lambda d: d.startswith(b"R") and b"backfill\x00message_key\x00" in d,
    }
    of_store = {
        "td": lambda d: d.startswith(b"table backfill.message_key_store: INSERT"),
        "w2j": lambda d: b'"schema":"backfill","table":"message_key_store"' in d,
        "po": lambda d: d.startswith(b"R") and b"backfill\x00message_key_store\x00" in d,
    }
    for short, datas in changes.items():
        assert not any(of_key_table[short](d) for d in datas), f"{DECODERS[short]} decoded table backfill.message_key"
        assert any(of_store[short](d) for d in datas), f"{DECODERS[short]} decoded no key's row: the test proves nothing"


def test_no_decoder_receives_a_message_key_at_install_rotation_or_update(db, roles, cluster):
    """Issue 31, finding 15: test_decoding and wal2json slots decode every table, pg_backfill's own
    too, and so does pgoutput for a FOR ALL TABLES publication: they carried each key in plain text
    (after backfill_rotate_key(), wal2json: {"action":"I","schema":"backfill","table":"message_key",...}).
    The keys are now in sequences, which no decoder decodes: at CREATE EXTENSION, at two rotations
    (one retiring the old keys), and at ALTER EXTENSION UPDATE from 0.9.0, no decoded change holds
    a key; signed messages still verify; the consumer grant reads the keys, nothing less does; and
    pg_dump writes none."""
    db.execute("DROP EXTENSION pg_backfill")
    slots = make_decoding_slots(db, roles.suffix)
    db.execute("CREATE EXTENSION pg_backfill")
    seen = all_keys(db)
    make_table(db, "t", 30)
    db.execute("SELECT backfill_rotate_key()")
    seen |= all_keys(db)
    assert wait_until_ended(db, start(db, "t", batch_size=10)) == "done"
    db.execute("SELECT backfill_rotate_key(retire_old_keys => true)")
    seen |= all_keys(db)
    assert len(seen) == 3
    changes = decoded_changes(db, slots)
    assert_no_key_in(changes, seen)
    # A retired key's sequences are gone with it.
    assert value(db, r"SELECT count(*) FROM pg_class WHERE relkind = 'S' AND relname ~ '^message_key_\d+_\d+$'") == 4
    # The backfill's messages, signed with the second key, verify.
    signed = messages_with_xids(d.decode() for d in changes["td"])
    assert len(signed) == 32 and all(json.loads(c)["auth"].startswith("2:") for _, c in signed)
    assert all(tag_is_valid(seen, content, xid) for xid, content in signed)
    assert not any(sql_valid(db, content, xid) for xid, content in signed), "the second key was retired"

    # 0.9.0 kept its keys in a table (its CREATE EXTENSION is decoded before these slots exist):
    # the update moves them out under the same ids and the consumer's grant carries over.
    db.execute("DROP EXTENSION pg_backfill")
    db.execute("DROP PUBLICATION every_table")
    for slot in slots.values():
        db.execute("SELECT pg_drop_replication_slot(%s)", [slot])
    db.execute("CREATE EXTENSION pg_backfill VERSION '0.9.0'")
    consumer, nokey = roles.create("consumer", "consumer"), roles.create("nokey")
    db.execute("SELECT backfill_rotate_key()")
    old = all_keys(db)
    assert wait_until_ended(db, start(db, "t", batch_size=10)) == "done"
    slots = make_decoding_slots(db, roles.suffix)
    db.execute("ALTER EXTENSION pg_backfill UPDATE")
    assert all_keys(db) == old
    db.execute("SELECT backfill_rotate_key()")
    seen = all_keys(db)
    assert len(seen) == 3 and seen.items() >= old.items()
    assert wait_until_ended(db, start(db, "t", batch_size=10)) == "done"
    changes = decoded_changes(db, slots)
    assert_no_key_in(changes, seen)
    signed = messages_with_xids(d.decode() for d in changes["td"])
    assert len(signed) == 32 and all(json.loads(c)["auth"].startswith("3:") for _, c in signed)
    as_consumer = roles.connect(consumer)
    assert all(sql_valid(as_consumer, content, xid) and tag_is_valid(seen, content, xid) for xid, content in signed)
    assert all_keys(as_consumer) == seen
    assert as_consumer.execute("SELECT key_id, key FROM backfill_key()").fetchone() == (3, seen[3])
    as_nokey = roles.connect(nokey)
    xid, content = signed[0]
    for sql, params in [
        ("SELECT * FROM backfill_key()", None),
        ("SELECT backfill_message_valid(%s::text, %s::bigint)", [content, xid]),
        ("SELECT * FROM backfill.message_key", None),
        ("SELECT backfill.message_key_bytes(3)", None),
        ("SELECT last_value FROM backfill.message_key_3_1", None),
    ]:
        assert error_of(as_nokey, sql, params).sqlstate == "42501", sql
    assert as_nokey.execute("SELECT count(last_value) FROM pg_sequences WHERE schemaname = 'backfill'").fetchone()[0] == 0

    # pg_dump writes no key: neither its sequences nor the view's rows.
    dump = subprocess.run(["sudo", "-u", "postgres", f"{PG_BIN}/pg_dump", "-h", "127.0.0.1", "-p", str(cluster.port),
                           "-d", db.info.dbname], check=True, capture_output=True).stdout
    assert b"message_key_" not in dump
    assert [form for key in seen.values() for form in key_forms(key) if form in dump] == []


def test_security_check_flags_privileges_on_the_key_sequences(db, roles):
    check = "SELECT ok, fix FROM backfill_security_check() WHERE item ILIKE '%sequences%'"
    assert db.execute(check).fetchall() == [(True, None)]
    reader = roles.create("reader")
    db.execute(f"GRANT SELECT ON ALL SEQUENCES IN SCHEMA backfill TO {reader}")
    assert roles.connect(reader).execute("SELECT last_value IS NOT NULL FROM backfill.message_key_1_1").fetchone()[0]
    [(ok, fix)] = db.execute(check).fetchall()
    assert ok is False and f"FROM {reader};" in fix and "retire_old_keys => true" in fix
    db.execute(fix)
    assert db.execute(check).fetchall() == [(True, None)]
    assert error_of(roles.connect(reader), "SELECT last_value FROM backfill.message_key_2_1").sqlstate == "42501"


def test_a_key_retired_while_it_is_read_is_read_again(cluster, db, roles):
    """A rotation that retires keys drops their sequences. A reader whose snapshot still holds the
    old key waits for that rotation, then is told to read again (40001), never an internal error;
    the worker, which reads the key at every page, retries its page, signs with the new key and
    finishes."""
    make_table(db, "t", 40)
    slot = f"td_{roles.suffix}"
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", [slot])
    consumer = roles.connect(roles.create("consumer", "consumer"))
    old_parts = [oid for oid, in db.execute("SELECT unnest(key_sequences) FROM backfill.message_key_store")]
    waiting_on_old_key = (
        "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted AND relation = ANY(%s::oid[])"
    )

    def read_old_key(result):
        try:
            consumer.execute("SELECT key FROM backfill.message_key WHERE id = 1").fetchall()
        except psycopg.Error as e:
            result.append(e)

    for reader in ("consumer", "worker"):
        with cluster.connect(db.info.dbname) as rotation:
            rotation.execute("BEGIN")
            rotation.execute("SELECT backfill_rotate_key(retire_old_keys => true)")
            if reader == "consumer":
                result = []
                thread = threading.Thread(target=read_old_key, args=(result,))
                thread.start()
                pid = consumer.info.backend_pid
            else:
                backfill_id = start(db, "t", batch_size=5)
                pid = wait_for(lambda: worker_pid(db, backfill_id), what="the worker")
            wait_for(lambda: value(db, waiting_on_old_key, [pid, old_parts]) == 1, what=f"the {reader} to wait for the rotation")
            rotation.execute("COMMIT")
        if reader == "consumer":
            thread.join(10)
            [error] = result
            assert error.sqlstate == "40001" and "message key 1 was retired" in error.diag.message_primary, error
        else:
            assert wait_until_ended(db, backfill_id) == "done", status(db, backfill_id, "last_error")
        old_parts = [oid for oid, in db.execute("SELECT unnest(key_sequences) FROM backfill.message_key_store")]
    # The worker signed every message with the key made while it waited.
    messages = decoded(db, slot)
    keys = all_keys(db)
    assert len(messages) == 42 and list(keys) == [3]
    assert all(json.loads(c)["auth"].startswith("3:") and sql_valid(consumer, c, xid) for xid, c in messages)


@pytest.mark.cluster
def test_the_keys_verify_on_a_standby_and_after_its_promotion(cluster, db, roles):
    """The keys live in sequences, WAL-logged: a physical standby has them, verifies what the
    primary signed, and still does once promoted by a failover."""
    make_table(db, "t", 20)
    slot = f"td_{roles.suffix}"
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", [slot])
    assert wait_until_ended(db, start(db, "t", batch_size=10)) == "done"
    db.execute("SELECT backfill_rotate_key()")
    assert wait_until_ended(db, start(db, "t", batch_size=10)) == "done"
    signed = decoded(db, slot)
    keys = all_keys(db)
    assert sorted({json.loads(c)["auth"].split(":")[0] for _, c in signed}) == ["1", "2"]
    standby = extra_cluster(cluster, "key_standby")
    subprocess.run(["bash", "-c", f"rm -rf '{standby.dir}' && mkdir -p '{standby.dir}' && chown postgres: '{standby.dir}'"], check=True)
    subprocess.run(
        ["sudo", "-u", "postgres", f"{PG_BIN}/pg_basebackup", "-h", "127.0.0.1", "-p", str(cluster.port),
         "-U", "postgres", "-D", f"{standby.dir}/data", "-R", "-X", "stream", "-c", "fast"],
        check=True, capture_output=True,
    )
    with open(f"{standby.dir}/data/postgresql.auto.conf", "a") as conf:
        conf.write(f"port = {standby.port}\nunix_socket_directories = '{standby.dir}'\n")
    standby.pg_ctl("start")
    try:
        # A key made after the base backup reaches the standby through WAL.
        db.execute("SELECT backfill_rotate_key()")
        keys = all_keys(db)
        target = value(db, "SELECT pg_current_wal_lsn()")
        with standby.connect(db.info.dbname) as conn:
            wait_for(lambda: conn.execute("SELECT pg_last_wal_replay_lsn() >= %s", [target]).fetchone()[0],
                     what="the standby to replay")
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]
            assert all_keys(conn) == keys and len(keys) == 3
            assert all(sql_valid(conn, content, xid) for xid, content in signed)
        standby.pg_ctl("promote", "-w")
        with standby.connect(db.info.dbname) as conn:
            assert not conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]
            assert all_keys(conn) == keys
            assert all(sql_valid(conn, content, xid) for xid, content in signed)
            assert conn.execute("SELECT key_id, key FROM backfill_key()").fetchone() == (3, keys[3])
            # The promoted server makes keys of its own after those it replayed (an id further on:
            # a sequence's nextval is WAL-logged ahead).
            new_key = value(conn, "SELECT backfill_rotate_key()")
            assert new_key > 3 and conn.execute("SELECT key_id FROM backfill_key()").fetchone()[0] == new_key
    finally:
        standby.stop()
