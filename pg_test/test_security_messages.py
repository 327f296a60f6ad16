"""Authenticated messages: every message's tag verifies, in SQL and with docs/consumers.md's
Python check, and forged, tampered, replayed and re-keyed messages do not; key rotation and
retiring old keys; the xid a peek reports; the consumer's grants, and nothing less."""

import json

from conftest import error_of, wait_until_ended
from security_helpers import AUTH, decoded, make_table, message_keys, signed, sql_valid, start, tag_is_valid, value


# --- authenticated messages -----------------------------------------------------------------------

def test_every_message_carries_a_valid_tag_and_forgeries_do_not_verify(db, roles, signed):
    slot, messages = signed
    assert len(messages) == 52  # table_start, 50 reads, table_end
    assert len({xid for xid, _ in messages}) > 2, "pages are transactions of their own"
    key_id, key = db.execute("SELECT key_id, key FROM backfill_key()").fetchone()
    keys = message_keys(db)
    assert bytes(keys[key_id]) == bytes(key)
    for xid, content in messages:
        assert list(json.loads(content))[-1] == "auth" and AUTH.search(content), content
        assert json.loads(content)["auth"].startswith(f"{key_id}:")
        assert sql_valid(db, content, xid) is True and tag_is_valid(keys, content, xid), content

    plain = roles.connect(roles.create("plain"))
    forged = (
        '{"op":"read","backfill_id":1,"schema":"public","table":"t","key":{"id":1},'
        f'"data":{{"id":1,"label":"forged"}},"commit_lsn":"0/0","auth":"{key_id}:{"0" * 64}"}}'
    )
    plain.execute("SELECT pg_logical_emit_message(true, 'backfill', %s::text)", [forged])
    [(forged_xid, decoded_forgery)] = decoded(db, slot)
    assert decoded_forgery == forged
    genuine_xid, genuine = next((xid, c) for xid, c in messages if '"op":"read"' in c)
    tampered = genuine.replace('"label":"row ', '"label":"rov ', 1)
    other_key = genuine.replace(f'"auth":"{key_id}:', f'"auth":"{key_id + 1}:', 1)
    assert tampered != genuine and other_key != genuine
    for what, content, xid in [
        ("forged", forged, forged_xid),
        ("tampered", tampered, genuine_xid),
        ("replayed in another transaction", genuine, forged_xid),
        ("key id edited", other_key, genuine_xid),
    ]:
        assert sql_valid(db, content, xid) is False, what
        assert not tag_is_valid(keys, content, xid), what


def test_after_a_key_rotation_old_messages_still_verify_and_new_ones_use_the_new_key(db, signed):
    slot, old = signed
    old_key = value(db, "SELECT key_id FROM backfill_key()")
    new_key = value(db, "SELECT backfill_rotate_key()")
    assert new_key != old_key and value(db, "SELECT key_id FROM backfill_key()") == new_key
    assert old and all(sql_valid(db, content, xid) for xid, content in old)
    assert wait_until_ended(db, start(db, "t", batch_size=10)) == "done"
    new = decoded(db, slot)
    keys = message_keys(db)
    assert len(new) == 52
    for xid, content in new:
        assert json.loads(content)["auth"].startswith(f"{new_key}:"), content
        assert sql_valid(db, content, xid) is True and tag_is_valid(keys, content, xid), content
    xid, content = old[1]
    moved = content.replace(f'"auth":"{old_key}:', f'"auth":"{new_key}:', 1)
    assert moved != content and sql_valid(db, moved, xid) is False


def test_retiring_old_keys_makes_what_they_signed_fail(db, signed):
    _, old = signed
    assert old and all(sql_valid(db, content, xid) for xid, content in old)
    new_key = value(db, "SELECT backfill_rotate_key(retire_old_keys => true)")
    assert [key_id for key_id, in db.execute("SELECT id FROM backfill.message_key")] == [new_key]
    assert not any(sql_valid(db, content, xid) for xid, content in old)


PEEKED_VALIDITY = """SELECT count(*), count(*) FILTER (WHERE backfill_message_valid(substring(data from 'content:(.*)'), xid)),
                          count(*) FILTER (WHERE backfill_message_valid(substring(data from 'content:(.*)'),
                                                                        (xid::text::bigint + 1)::text::xid))
                     FROM pg_logical_slot_peek_changes(%s, NULL, NULL)
                    WHERE data LIKE 'message: transactional: 1 prefix: backfill,%%'"""


def test_a_message_verifies_with_the_xid_a_peek_reports_as_it_is(db, roles, signed):
    """The xid column of pg_logical_slot_peek_changes() is of type xid, which has no cast to
    bigint: backfill_message_valid(content, xid) takes it as it is, for a consumer granted as
    docs/security.md says (the grant of the bigint form: the xid form calls it), and a message
    checked against another transaction's xid fails. A role without the grant gets 42501."""
    slot, messages = signed
    make_table(db, "more", 30)
    assert wait_until_ended(db, start(db, "more", batch_size=10)) == "done"
    assert value(db, "SELECT pg_typeof(xid)::text FROM pg_logical_slot_peek_changes(%s, NULL, NULL) LIMIT 1",
                 [slot]) == "xid"
    assert db.execute(PEEKED_VALIDITY, [slot]).fetchone() == (32, 32, 0)
    consumer = roles.connect(roles.create("xid_consumer", "consumer"))
    xid, content = messages[1]
    assert value(consumer, "SELECT backfill_message_valid(%s::text, %s::text::xid)", [content, xid]) is True
    assert value(consumer, "SELECT backfill_message_valid(%s::text, %s::bigint)", [content, xid]) is True
    assert error_of(roles.connect(roles.create("xid_nokey")),
                    "SELECT backfill_message_valid(%s::text, %s::text::xid)", [content, xid]).sqlstate == "42501"


def test_consumer_grants_allow_reading_the_key_and_verifying_and_nothing_less_does(db, roles, signed):
    _, messages = signed
    xid, content = messages[1]
    consumer = roles.connect(roles.create("consumer", "consumer"))
    assert consumer.execute("SELECT key_id, key FROM backfill_key()").fetchone() == db.execute(
        "SELECT key_id, key FROM backfill_key()"
    ).fetchone()
    assert sql_valid(consumer, content, xid) is True
    assert error_of(consumer, "SELECT backfill_rotate_key()").sqlstate == "42501"
    other = roles.connect(roles.create("nokey"))
    for sql, params in [
        ("SELECT * FROM backfill_key()", None),
        ("SELECT backfill_message_valid(%s::text, %s::bigint)", [content, xid]),
        ("SELECT * FROM backfill.message_key", None),
    ]:
        assert error_of(other, sql, params).sqlstate == "42501", sql
