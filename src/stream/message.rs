//! The messages consumers receive, and the one place they are written to WAL.
//!
//! Every message is a transactional logical decoding message whose content is UTF-8 JSON:
//! - `read`: one per row: `{"op":"read","backfill_id":1,"schema":"public","table":"orders",
//!   "key":{"id":7},"data":{...whole row...},"commit_lsn":"0/0"}` (plus `"slot"` when the
//!   backfill is for a slot, `"shard"` for a Citus shard, whose messages name its distributed
//!   table, and `"partition"` for a partitioned table). `commit_lsn` is always `0/0`: the LSN is only known at commit, and
//!   every decoder reports the real one with the transaction.
//! - `reads`: a backfill started with `rows_per_message => N` (N > 1) sends its rows N at a
//!   time instead: `{"op":"reads",...,"rows":[{"key":{"id":7},"data":{...}},...],"commit_lsn":"0/0"}`,
//!   each element what a `read` would carry. A new op rather than `read` with a list: a
//!   consumer written for `read` then skips (or fails on) an op it does not know, instead of
//!   reading a missing `key` and `data`. The decoder's cost is per message, not per byte: a
//!   page's rows in a few messages cost it a few changes instead of one per row.
//! - `absent`: a key given to a keyed backfill (backfill_repair()) has no row:
//!   `{"op":"absent",...,"key":{"id":7},"commit_lsn":"0/0"}`.
//! - `table_start` when a table's scan starts and `table_end` (with the row count and the
//!   sequences its columns own) when it ends.
//!
//! Every message ends with an `auth` field: see `sign.rs`.

use crate::model::table::Table;
use crate::pg::compat;
use crate::pg::encoding::Text;
use crate::pg::errors::OrInternal;
use crate::stream::json;
use crate::stream::sign::{self, Signer};
use pgrx::prelude::*;
use serde::Serialize;
use serde_json::Value;
use std::ffi::CString;

/// Writes one transactional message: it is decoded at its transaction's commit, in commit order.
/// `content` is sealed already.
pub fn emit(prefix: &CString, content: &[u8]) {
    // SAFETY: both pointers are valid for the call; an ERROR raised inside becomes a Rust panic
    // at the guarded boundary instead of a longjmp across Rust frames.
    unsafe {
        pg_sys::ffi::pg_guard_ffi_boundary(|| {
            compat::log_transactional_message(prefix.as_ptr(), content.as_ptr().cast(), content.len())
        });
    }
}

/// Builds the `read` (or `reads`) messages of one table into one reused buffer: the envelope
/// is rendered once, and a row costs a copy of its key values and of its data.
pub struct ReadMessage {
    /// `{"op":"read",...,"table":"t",` (`"op":"reads"` when batched).
    head: Vec<u8>,
    /// `"name":` of each key column, JSON-quoted once.
    key_labels: Vec<Vec<u8>>,
    buf: Vec<u8>,
    /// Most rows per message: 1 for `read`, more for `reads`.
    rows_per_message: usize,
    /// A batch's next element, `{"key":...,"data":...}`, rendered before it is known to fit.
    staged: Vec<u8>,
    /// Rows in the open batch (in `buf`); 0 when none is open.
    batched_rows: usize,
}

const KEY_FIELD: &[u8] = b"\"key\":";
const DATA_FIELD: &[u8] = b",\"data\":";
const PARTITION_FIELD: &[u8] = b",\"partition\":";
const TAIL: &[u8] = b",\"commit_lsn\":\"0/0\"}";
const ROWS_FIELD: &[u8] = b"\"rows\":[";
/// What closes a batch's rows: `]` before the tail.
const ROWS_END: &[u8] = b"]";

/// The fields every message starts with, in this order. Every slot of the database decodes
/// every message: `slot` lets a consumer skip backfills meant for other pipelines.
#[derive(Serialize)]
struct Envelope<'a> {
    op: &'a str,
    backfill_id: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    slot: Option<&'a str>,
    schema: &'a str,
    table: &'a str,
    /// A Citus shard's id: `schema` and `table` then name its distributed table, as Citus's
    /// change data capture names the shard's changes.
    #[serde(skip_serializing_if = "Option::is_none")]
    shard: Option<i64>,
}

impl<'a> Envelope<'a> {
    fn new(op: &'a str, backfill_id: i64, slot: Option<&'a str>, table: &'a Table) -> Self {
        match &table.shard_of {
            Some(of) => {
                Envelope { op, backfill_id, slot, schema: &of.schema, table: &of.name, shard: Some(of.shard_id) }
            }
            None => Envelope { op, backfill_id, slot, schema: &table.schema, table: &table.name, shard: None },
        }
    }
}

/// `table_start`: the scan of a table begins.
#[derive(Serialize)]
struct TableStart<'a> {
    #[serde(flatten)]
    envelope: Envelope<'a>,
    key_columns: Vec<String>,
    /// The greatest key when the scan began (null for an empty table): reads up to it follow.
    upper_bound: Value,
    rows_estimated: i64,
    /// The backfill's row filter, when it has one: `filter => ...`, its publication's row
    /// filter for the table, or both AND-ed (selection/row_filter.rs). Only rows it was true for
    /// are read, so the consumer knows the backfill was partial.
    #[serde(skip_serializing_if = "Option::is_none")]
    filter: Option<&'a str>,
    /// The backfill's column list for the table (`columns => ...`, or its publication's),
    /// when it has one: the columns each read's `data` holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    columns: Option<&'a [String]>,
}

/// `table_end`: every row of the table up to its upper bound has been read.
#[derive(Serialize)]
struct TableEnd<'a> {
    #[serde(flatten)]
    envelope: Envelope<'a>,
    rows: i64,
    sequences: &'a [OwnedSequence],
}

/// A sequence owned by a column of the table (serial, identity, OWNED BY): a store that takes
/// over from the source starts its own ids past `last_value`, so that they never collide with
/// ids the source assigns later.
#[derive(Serialize)]
pub struct OwnedSequence {
    pub column: String,
    /// Schema-qualified and quoted as SQL writes it.
    pub sequence: String,
    /// The last value nextval() returned in any session; null if none was since the sequence
    /// was created or restarted, or if the role that started the backfill may not read it.
    pub last_value: Option<i64>,
    /// The value the next nextval() returns (null past the sequence's range, or unreadable).
    pub next_value: Option<i64>,
    pub increment: i64,
}

fn to_json(marker: &impl Serialize) -> String {
    serde_json::to_string(marker).expect("a marker serializes")
}

impl ReadMessage {
    /// The messages of a table's rows, `rows_per_message` at most in each (1: `read`).
    pub fn new(backfill_id: i64, slot: Option<&str>, table: &Table, rows_per_message: usize) -> Self {
        let op = if rows_per_message > 1 { "reads" } else { "read" };
        let mut head = to_json(&Envelope::new(op, backfill_id, slot, table));
        head.pop(); // the closing brace: key and data (or the rows) and the tail follow
        head.push(',');
        ReadMessage {
            head: head.into_bytes(),
            key_labels: key_labels(table),
            buf: Vec::with_capacity(8192),
            rows_per_message: rows_per_message.max(1),
            staged: Vec::new(),
            batched_rows: 0,
        }
    }

    /// Bytes of a `read` message beyond its key values and data.
    pub fn envelope_len(&self) -> usize {
        let key_punctuation: usize = self.key_labels.iter().map(|l| l.len() + 1).sum::<usize>() + 1;
        self.head.len() + KEY_FIELD.len() + key_punctuation + DATA_FIELD.len() + TAIL.len() + sign::SEAL_LEN
    }

    /// Whether rows go in `reads` messages of several rows.
    pub fn batched(&self) -> bool {
        self.rows_per_message > 1
    }

    /// The `read` message of one row, sealed: its key values and its data (JSON, in the
    /// database's encoding) and, for a partitioned table, its partition's name.
    pub fn build<'v>(
        &mut self,
        key_values: impl IntoIterator<Item = &'v [u8]>,
        data: &[u8],
        partition: Option<&[u8]>,
        signer: &Signer,
    ) -> &[u8] {
        self.buf.clear();
        self.buf.extend_from_slice(&self.head);
        push_row(&mut self.buf, &self.key_labels, key_values, data, partition);
        self.buf.extend_from_slice(TAIL);
        signer.seal(&mut self.buf);
        &self.buf
    }

    /// Renders a row as the next element of a `reads` batch (see [`Self::push_staged`]).
    /// Returns the size a message holding this row alone would have, sealed.
    pub fn stage<'v>(
        &mut self,
        key_values: impl IntoIterator<Item = &'v [u8]>,
        data: &[u8],
        partition: Option<&[u8]>,
    ) -> usize {
        self.staged.clear();
        self.staged.push(b'{');
        push_row(&mut self.staged, &self.key_labels, key_values, data, partition);
        self.staged.push(b'}');
        self.head.len() + ROWS_FIELD.len() + self.staged.len() + Self::closing_len()
    }

    /// Bytes that close a batch: the end of its rows, the tail and the longest seal.
    fn closing_len() -> usize {
        ROWS_END.len() + TAIL.len() + sign::MAX_SEAL_LEN
    }

    /// Whether the staged row may join the open batch: it has room for another row, and its
    /// message would stay within `max_size` bytes, sealed.
    pub fn staged_fits(&self, max_size: usize) -> bool {
        if self.batched_rows == 0 {
            return true;
        }
        let len = self.buf.len() + 1 + self.staged.len() + Self::closing_len();
        self.batched_rows < self.rows_per_message && len <= max_size
    }

    /// Appends the staged row to the open batch, opening one if none is.
    pub fn push_staged(&mut self) {
        if self.batched_rows == 0 {
            self.buf.clear();
            self.buf.extend_from_slice(&self.head);
            self.buf.extend_from_slice(ROWS_FIELD);
        } else {
            self.buf.push(b',');
        }
        self.buf.extend_from_slice(&self.staged);
        self.batched_rows += 1;
    }

    /// Drops the open batch, if any. A page that failed part-way (a row lock it could not take,
    /// an error) rolled back, but its rows may still sit in the batch: were they sent with the
    /// page that retries it, they would be reads of an older snapshot, decoded after changes
    /// that committed in between.
    pub fn discard_batch(&mut self) {
        self.batched_rows = 0;
    }

    /// Whether the open batch holds rows_per_message rows.
    pub fn batch_full(&self) -> bool {
        self.batched_rows >= self.rows_per_message
    }

    /// Closes the open batch and returns its `reads` message, sealed; None if none is open.
    pub fn take_batch(&mut self, signer: &Signer) -> Option<&[u8]> {
        if self.batched_rows == 0 {
            return None;
        }
        self.batched_rows = 0;
        self.buf.extend_from_slice(ROWS_END);
        self.buf.extend_from_slice(TAIL);
        signer.seal(&mut self.buf);
        Some(&self.buf)
    }
}

/// Appends a row's fields, `"key":{...},"data":{...}` (and `,"partition":"..."`), as a `read`
/// message and each element of a `reads` message carry them.
fn push_row<'v>(
    buf: &mut Vec<u8>,
    key_labels: &[Vec<u8>],
    key_values: impl IntoIterator<Item = &'v [u8]>,
    data: &[u8],
    partition: Option<&[u8]>,
) {
    buf.extend_from_slice(KEY_FIELD);
    push_key(buf, key_labels, key_values);
    buf.extend_from_slice(DATA_FIELD);
    buf.extend_from_slice(data);
    if let Some(partition) = partition {
        buf.extend_from_slice(PARTITION_FIELD);
        json::push_quoted(buf, partition);
    }
}

fn key_labels(table: &Table) -> Vec<Vec<u8>> {
    table.key.iter().map(|k| json::label(&k.name)).collect()
}

/// Appends `{"a":1,"b":"x"}` from the key's labels and its JSON values.
fn push_key<'v>(buf: &mut Vec<u8>, labels: &[Vec<u8>], values: impl IntoIterator<Item = &'v [u8]>) {
    buf.push(b'{');
    for (i, (label, value)) in labels.iter().zip(values).enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        buf.extend_from_slice(label);
        buf.extend_from_slice(value);
    }
    buf.push(b'}');
}

/// `table_start`: the scan of a table begins; reads up to `upper_bound` (JSON key values,
/// None for an empty table) follow.
pub fn table_start(
    backfill_id: i64,
    slot: Option<&str>,
    table: &Table,
    upper_bound: Option<&[String]>,
    rows_estimated: i64,
    filter: Option<&str>,
) -> String {
    let upper_bound: Value = upper_bound
        .map(|values| {
            let mut key = Vec::new();
            push_key(&mut key, &key_labels(table), values.iter().map(|v| v.as_bytes()));
            serde_json::from_slice(&key).unwrap_or_default()
        })
        .unwrap_or_default();
    to_json(&TableStart {
        envelope: Envelope::new("table_start", backfill_id, slot, table),
        key_columns: table.key_names(),
        upper_bound,
        rows_estimated,
        filter,
        columns: table.column_list.as_deref(),
    })
}

/// `absent`: a key given to a keyed backfill (backfill_repair()) has no row. A consumer deletes
/// the key's row, if it has one; the message sorts against the key's changes as a read does.
#[derive(Serialize)]
struct Absent<'a> {
    #[serde(flatten)]
    envelope: Envelope<'a>,
    key: Value,
    commit_lsn: &'a str,
}

/// `absent` of the key with these JSON values.
pub fn absent(backfill_id: i64, slot: Option<&str>, table: &Table, key_values: &[String]) -> String {
    let mut key = Vec::new();
    push_key(&mut key, &key_labels(table), key_values.iter().map(|v| v.as_bytes()));
    to_json(&Absent {
        envelope: Envelope::new("absent", backfill_id, slot, table),
        key: serde_json::from_slice(&key).unwrap_or_default(),
        commit_lsn: "0/0",
    })
}

/// Writes a marker, sealed, within backfill.max_message_size as every message is: what a
/// marker carries from the caller (a filter's text, a key given to a repair) must not make a
/// WAL record that PostgreSQL cannot read back.
pub fn emit_marker(prefix: &CString, signer: &Signer, marker: String) {
    let mut content = marker.into_bytes();
    signer.seal(&mut content);
    let max_message_size = crate::pg::settings::max_message_bytes();
    if content.len() > max_message_size {
        // Every message begins with its op (Envelope's first field): `{"op":"table_start",...`.
        let op: String = content
            .strip_prefix(b"{\"op\":\"")
            .unwrap_or_default()
            .iter()
            .take_while(|&&b| b != b'"')
            .map(|&b| char::from(b))
            .collect();
        crate::pg::errors::raise(
            pgrx::PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!("the {op} message of a backfill would pass backfill.max_message_size"),
            format!("It would take {} bytes; backfill.max_message_size is {max_message_size} bytes.", content.len()),
            Some("Raise backfill.max_message_size, or start the backfill with a shorter filter or fewer keys.".into()),
        );
    }
    emit(prefix, &content);
}

impl OwnedSequence {
    /// The sequences the columns of table `relid` own, in column order, as the role that
    /// started the backfill may see them: reading one needs SELECT or USAGE on it, as
    /// pg_sequence_last_value() does.
    pub fn of(relid: pg_sys::Oid, started_by: &str) -> Vec<OwnedSequence> {
        let sql = "SELECT a.attname::text, pg_catalog.format('%I.%I', n.nspname, s.relname),
                          coalesce(pg_catalog.has_sequence_privilege(r.oid, s.oid, 'SELECT, USAGE')
                                   AND pg_catalog.has_sequence_privilege(s.oid, 'SELECT, USAGE'), false),
                          q.seqincrement, s.oid
                     FROM pg_catalog.pg_depend d
                     JOIN pg_catalog.pg_class s ON s.oid OPERATOR(pg_catalog.=) d.objid AND s.relkind OPERATOR(pg_catalog.=) 'S'
                     JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) s.relnamespace
                     JOIN pg_catalog.pg_sequence q ON q.seqrelid OPERATOR(pg_catalog.=) s.oid
                     JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) d.refobjid
                                                   AND a.attnum OPERATOR(pg_catalog.=) d.refobjsubid
                     LEFT JOIN pg_catalog.pg_roles r ON r.rolname OPERATOR(pg_catalog.=) $2
                    WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                      AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                      AND d.refobjid OPERATOR(pg_catalog.=) $1 AND d.deptype IN ('a', 'i')
                    ORDER BY a.attnum, 2";
        // (Kept prepared: a backfill of many tables asks at the end of each.)
        let owned = crate::pg::spi::run_prepared(sql, false, &[relid.into(), Text::from(started_by).into()], |rows| {
            rows.map(|row| {
                Ok((
                    row.get::<Text>(1)?.map(|t| t.0).unwrap_or_default(),
                    row.get::<bool>(3)?.unwrap_or(false),
                    row.get::<i64>(4)?.unwrap_or(1),
                    row.get::<pg_sys::Oid>(5)?,
                ))
            })
            .collect::<Result<Vec<_>, pgrx::spi::Error>>()
        })
        .or_internal("read the sequences the table owns");
        let mut sequences = Vec::new();
        for (column, readable, increment, oid) in owned {
            // A sequence dropped or renamed since this query's snapshot (its DROP waited for
            // nothing this page held) is looked up again once locked: a dropped one is no
            // longer the table's.
            let Some(name) = oid.and_then(locked_sequence) else { continue };
            // The sequence's own row says whether its last value was handed out (is_called):
            // after a RESTART, or before the first nextval(), the next value is last_value.
            let (last_value, next_value) = if readable {
                let state = Spi::connect(|client| {
                    let state = client.select(&format!("SELECT last_value, is_called FROM {name}"), Some(1), &[])?;
                    let state = state.first();
                    Ok::<_, pgrx::spi::Error>((state.get::<i64>(1)?, state.get::<bool>(2)?.unwrap_or(false)))
                })
                .or_internal("read a sequence the table owns");
                match state {
                    (Some(last), true) => (Some(last), last.checked_add(increment)),
                    (last, _) => (None, last),
                }
            } else {
                (None, None)
            };
            sequences.push(OwnedSequence { column, sequence: name, last_value, next_value, increment });
        }
        sequences
    }
}

/// The name (schema-qualified and quoted) of sequence `oid`, locked until the end of the
/// transaction, or None if it was dropped. (The system caches see the state after the lock:
/// taking it processes the catalog's invalidations.)
fn locked_sequence(oid: pg_sys::Oid) -> Option<String> {
    // SAFETY: a lock on a relation that may no longer exist (then nothing conflicts with it),
    // and lookups of its catalog entries, which return null for a dropped one.
    unsafe {
        pg_sys::LockRelationOid(oid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let name = pg_sys::get_rel_name(oid);
        let schema = pg_sys::get_namespace_name(pg_sys::get_rel_namespace(oid));
        if name.is_null() || schema.is_null() {
            return None;
        }
        let text = |c: *mut std::ffi::c_char| std::ffi::CStr::from_ptr(c).to_string_lossy().into_owned();
        Some(crate::pg::encoding::quote_qualified(&text(schema), &text(name)))
    }
}

/// `table_end`: every row of the table up to its upper bound has been read; with the sequences
/// its columns own.
pub fn table_end(
    backfill_id: i64,
    slot: Option<&str>,
    table: &Table,
    rows: i64,
    sequences: &[OwnedSequence],
) -> String {
    to_json(&TableEnd { envelope: Envelope::new("table_end", backfill_id, slot, table), rows, sequences })
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use super::*;
    use crate::model::table::{inspect, Table};
    use serde_json::json;

    fn table(ddl: &str) -> Table {
        Spi::run(ddl).unwrap();
        let relid = Spi::get_one::<pg_sys::Oid>("SELECT 'msg_t'::regclass::oid").unwrap().unwrap();
        inspect(relid).unwrap()
    }

    #[pg_test]
    fn read_message_is_the_documented_json() {
        let table = table("CREATE TABLE msg_t (\"Region\" text, id int, v text, PRIMARY KEY (\"Region\", id))");
        let mut message = ReadMessage::new(7, None, &table, 1);
        let data = br#"{"Region":"eu","id":3,"v":"x"}"#;
        let built = message
            .build(
                [&b"\"eu\""[..], b"3"],
                data,
                None,
                &Signer::for_this_transaction(crate::catalog::job::signing_key()),
            )
            .to_vec();
        let mut parsed: serde_json::Value = serde_json::from_slice(&built).unwrap();
        assert!(parsed.as_object_mut().unwrap().remove("auth").is_some());
        assert_eq!(
            parsed,
            json!({"op": "read", "backfill_id": 7, "schema": "public", "table": "msg_t",
                   "key": {"Region": "eu", "id": 3}, "data": {"Region": "eu", "id": 3, "v": "x"},
                   "commit_lsn": "0/0"})
        );
        // The estimate's envelope is exactly what a message adds to its key values and data.
        assert_eq!(built.len(), message.envelope_len() + "\"eu\"".len() + 1 + data.len());
    }

    #[pg_test]
    fn markers_carry_the_bounds_and_the_count() {
        let table = table("CREATE TABLE msg_t (id int PRIMARY KEY)");
        let start: serde_json::Value =
            serde_json::from_str(&table_start(2, Some("s1"), &table, Some(&["42".to_string()]), 40, None)).unwrap();
        assert_eq!(start["op"], "table_start");
        assert_eq!(start["slot"], "s1");
        assert_eq!(start["upper_bound"], json!({"id": 42}));
        assert_eq!(start["key_columns"], json!(["id"]));
        let sequences = [OwnedSequence {
            column: "id".into(),
            sequence: "public.msg_t_id_seq".into(),
            last_value: Some(41),
            next_value: Some(42),
            increment: 1,
        }];
        let end: serde_json::Value = serde_json::from_str(&table_end(2, None, &table, 40, &sequences)).unwrap();
        assert_eq!(
            end,
            json!({"op": "table_end", "backfill_id": 2, "schema": "public", "table": "msg_t", "rows": 40,
                   "sequences": [{"column": "id", "sequence": "public.msg_t_id_seq", "last_value": 41, "next_value": 42,
                                  "increment": 1}]})
        );
    }

    #[pg_test]
    fn reads_message_carries_each_row_as_a_read_would() {
        let table = table("CREATE TABLE msg_t (id int PRIMARY KEY, v text)");
        let signer = Signer::for_this_transaction(crate::catalog::job::signing_key());
        let mut message = ReadMessage::new(7, Some("s1"), &table, 3);
        assert!(message.batched());
        let rows: [(&[u8], &[u8]); 2] = [(b"1", br#"{"id":1,"v":"a"}"#), (b"2", br#"{"id":2,"v":"b"}"#)];
        for (key, data) in rows {
            let alone = message.stage([key], data, None);
            assert!(message.staged_fits(1 << 20));
            message.push_staged();
            assert!(alone > data.len());
        }
        assert!(!message.batch_full());
        let built = message.take_batch(&signer).unwrap().to_vec();
        let mut parsed: serde_json::Value = serde_json::from_slice(&built).unwrap();
        assert!(parsed.as_object_mut().unwrap().remove("auth").is_some());
        assert_eq!(
            parsed,
            json!({"op": "reads", "backfill_id": 7, "slot": "s1", "schema": "public", "table": "msg_t",
                   "rows": [{"key": {"id": 1}, "data": {"id": 1, "v": "a"}},
                            {"key": {"id": 2}, "data": {"id": 2, "v": "b"}}],
                   "commit_lsn": "0/0"})
        );
        assert!(message.take_batch(&signer).is_none(), "a taken batch is closed");
        // A batch of a page that rolled back is never sent with the next.
        message.stage([&b"9"[..]], br#"{"id":9,"v":"stale"}"#, None);
        message.push_staged();
        message.discard_batch();
        assert!(message.take_batch(&signer).is_none(), "a discarded batch is gone");
        // A batch of the size bound takes no row more: the next one waits for the next message.
        message.stage([&b"3"[..]], br#"{"id":3,"v":"c"}"#, None);
        message.push_staged();
        message.stage([&b"4"[..]], br#"{"id":4,"v":"d"}"#, None);
        let len = message.take_batch(&signer).unwrap().len();
        message.stage([&b"3"[..]], br#"{"id":3,"v":"c"}"#, None);
        message.push_staged();
        message.stage([&b"4"[..]], br#"{"id":4,"v":"d"}"#, None);
        assert!(!message.staged_fits(len + 10));
    }
}
