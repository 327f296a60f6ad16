"""What the security tests (test_security_*.py) share: small SQL helpers, the `operator` and
`signed` fixtures, the plpgsql that makes a role superuser when a superuser runs it, and the
checks of a message's authentication tag (test_batches.py checks its batches' tags with them).
A test file imports the fixtures it uses by name, as it imports the helpers."""

import hashlib
import hmac
import re

import pytest

from conftest import ROOT, messages_with_xids, wait_until_ended


def value(conn, sql, params=None):
    return conn.execute(sql, params).fetchone()[0]


def make_table(conn, name, rows):
    conn.execute(
        f"""CREATE TABLE {name} (id int PRIMARY KEY, label text);
            INSERT INTO {name} SELECT g, 'row ' || g FROM generate_series(1, {rows}) g;
            ANALYZE {name};"""
    )


def start(conn, table, **options) -> int:
    """backfill_start(table, confirm => true, option => value...): the backfill id."""
    named = "".join(f", {name} => %s" for name in options)
    return value(conn, f"SELECT backfill_start(%s::regclass, confirm => true{named})", [table, *options.values()])


def is_superuser(conn, role) -> bool:
    return value(conn, "SELECT rolsuper FROM pg_roles WHERE rolname = %s", [role])


def hint_statement(error) -> str:
    """The SQL statement a hint shows: from its SELECT to its last semicolon."""
    hint = error.diag.message_hint or ""
    assert "SELECT" in hint and ";" in hint, hint
    return hint[hint.index("SELECT") : hint.rindex(";") + 1]


def next_backfill_id(conn) -> int:
    """The id the next backfill of `conn`'s database will get."""
    return value(conn, """SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence('backfill.job', 'id')::regclass)
                                     + 1, 1)""")


def escalation(role) -> str:
    """plpgsql that makes `role` superuser when a superuser runs it (and does nothing otherwise)."""
    return f"BEGIN EXECUTE 'ALTER ROLE {role} SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;"


# A function that makes `role` superuser when a superuser runs it (and does nothing otherwise)
# before it returns `body`.
TRAP = """CREATE FUNCTION {schema}.{name}({args}) RETURNS {returns} LANGUAGE plpgsql AS $$
BEGIN
    BEGIN EXECUTE 'ALTER ROLE {role} SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
    RETURN {body};
END $$"""


@pytest.fixture
def operator(db, roles):
    """An operator (the grants of docs/security.md) that may SELECT and UPDATE table t (200 rows): (role, connection)."""
    make_table(db, "t", 200)
    role = roles.create("op", "operator")
    db.execute(f"GRANT SELECT, UPDATE ON t TO {role}")
    return role, roles.connect(role)


AUTH = re.compile(r',"auth":"(\d+):([0-9a-f]{64})"\}$')


def decoded(conn, slot):
    """(xid, content) of each backfill message the test_decoding slot decodes, in order."""
    rows = conn.execute("SELECT data FROM pg_logical_slot_get_changes(%s, NULL, NULL, 'include-xids', '1')", [slot])
    return messages_with_xids(data for (data,) in rows.fetchall())


def message_keys(db) -> dict:
    return dict(db.execute("SELECT id, key FROM backfill.message_key").fetchall())


def readme_verifier():
    """The Python check (`genuine`) of docs/consumers.md, run as printed there."""
    text = (ROOT / "docs/consumers.md").read_text()
    heading = "\n## Authenticated messages\n"
    assert text.count(heading) == 1, f"docs/consumers.md must have the heading {heading.strip()} exactly once"
    section = text[text.index(heading) :]
    code = re.search(r"```python\n(.*?)\n```", section, re.S)[1]
    namespace = {}
    exec(code, namespace)
    return namespace["genuine"]


def tag_is_valid(keys, content, xid) -> bool:
    """The check, done here independently: HMAC-SHA256(key, "<xid>:" + content without its auth
    field); the code of docs/consumers.md must give the same answer."""
    auth = AUTH.search(content)
    if not auth or int(auth[1]) not in keys:
        independent = False
    else:
        raw = content.encode()
        body = raw[: raw.rindex(b',"auth":"')] + b"}"
        expected = hmac.new(bytes(keys[int(auth[1])]), f"{xid}:".encode() + body, hashlib.sha256).hexdigest()
        independent = hmac.compare_digest(expected, auth[2])
    readme = readme_verifier()(content.encode(), xid, {k: bytes(v) for k, v in keys.items()})
    assert readme == independent, "the verification of docs/consumers.md disagrees"
    return independent


def sql_valid(conn, content, xid) -> bool:
    return value(conn, "SELECT backfill_message_valid(%s::text, %s::bigint)", [content, xid])


@pytest.fixture
def signed(db, roles):
    """A backfill of t (50 rows, pages of 10) decoded through a test_decoding slot: (slot, messages)."""
    make_table(db, "t", 50)
    slot = f"td_{roles.suffix}"
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", [slot])
    assert wait_until_ended(db, start(db, "t", batch_size=10)) == "done"
    return slot, decoded(db, slot)


def all_keys(conn) -> dict:
    return {key_id: bytes(key) for key_id, key in conn.execute("SELECT id, key FROM backfill.message_key").fetchall()}
