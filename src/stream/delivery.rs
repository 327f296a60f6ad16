//! The hot path: a page's rows become messages as the executor produces them.
//!
//! The locking page query runs as a prepared plan whose rows go to a DestReceiver of ours, not
//! into an SPI tuple table: each row's columns are rendered as JSON into a reused buffer, copied
//! once into the message and written to WAL. No row is materialized a second time, no SQL
//! function or SPI call runs per row, and nothing per row is allocated in Rust.
//!
//! With `rows_per_message` above 1, rows are gathered into `reads` messages instead, each
//! written when it holds that many rows, when the next row would take it past
//! backfill.max_message_size, or when the page's query ends: always inside the page's
//! transaction, so a batch is committed, and decoded, with its page or not at all.

use crate::pg::receiver::{self, Query, RowSink};
use crate::stream::json::{Rendered, RowJson};
use crate::stream::message::{self, ReadMessage};
use crate::stream::sign::Signer;
use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;
use std::ffi::CString;

/// What the receiver needs to turn a row into a message, and what it counts.
pub struct Sink<'a> {
    /// The key columns' positions among the row's columns.
    pub key_columns: &'a [usize],
    pub partitioned: bool,
    pub row: &'a mut RowJson,
    pub messages: &'a mut ReadMessage,
    pub prefix: &'a CString,
    pub signer: &'a Signer,
    /// backfill.max_message_size: a larger message fails the backfill, and batches stay within it.
    pub max_message_size: usize,
    /// The table's name, for that error.
    pub table: &'a str,
    /// Run before each row: the gentle default's rests within a page (throttle/duty.rs).
    pub before_row: Option<&'a mut dyn FnMut()>,
    pub rows: i64,
    pub bytes: i64,
}

/// Runs a page query's kept plan (spi::kept_plan, for these arguments); every row it returns
/// goes to `sink`.
pub fn run(plan: pg_sys::SPIPlanPtr, args: &[DatumWithOid], sink: &mut Sink) {
    // Every batch is of this query's rows: one left open by a page that rolled back is stale.
    sink.messages.discard_batch();
    // Not read-only: the query takes row locks and needs a fresh snapshot.
    receiver::run(Query::Kept(plan), args, false, sink, "a page query");
    // The page's last rows, batched (a failed query raised an ERROR above and never gets here).
    emit_batch(sink);
}

impl RowSink for Sink<'_> {
    unsafe fn start(&mut self, row_type: pg_sys::TupleDesc) {
        if !self.row.matches(row_type) {
            crate::pg::errors::raise(
                pgrx::PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                "the page query's columns are not those of the table's rows: the table changed under the scan",
                "An ALTER TABLE changed the table's columns between the page's check of them and its query.",
                Some("Resume the backfill (backfill_resume): its next page reads the columns as they are now.".into()),
            );
        }
    }

    /// One row of the page query (whose columns start() checked: the values are of the types
    /// rendered): a `read` message, or a row of the open batch.
    unsafe fn row(&mut self, values: &[pg_sys::Datum], nulls: &[bool]) {
        if let Some(before_row) = self.before_row.as_mut() {
            before_row();
        }
        // The partition's name follows the table's columns.
        let (columns, partition) =
            if self.partitioned { (values.len() - 1, values.last()) } else { (values.len(), None) };
        let row = &mut *self.row;
        match row.render(&values[..columns], &nulls[..columns], self.max_message_size) {
            Rendered::Row => {}
            Rendered::TooLarge => too_large(
                self.table,
                self.max_message_size,
                &row.values_of(values, nulls, self.key_columns),
                row.json().len(),
            ),
            Rendered::NotUtf8 { column } => {
                not_utf8(self.table, row.column_name(column), &row.values_of(values, nulls, self.key_columns))
            }
        }
        let key_values = self.key_columns.iter().map(|&i| row.value(i));
        // A partition's name, like a value, reaches the message in UTF-8.
        let partition = partition.map(|p| {
            crate::pg::encoding::to_utf8(crate::pg::encoding::text_of(*p)).unwrap_or_else(|| {
                not_utf8(self.table, "(its partition's name)", &row.values_of(values, nulls, self.key_columns))
            })
        });
        if self.messages.batched() {
            let alone = self.messages.stage(key_values, row.json(), partition.as_deref());
            // A row too large for a message of its own fails the backfill, as in a `read`.
            if alone > self.max_message_size {
                too_large(self.table, self.max_message_size, &row.values_of(values, nulls, self.key_columns), alone);
            }
            if !self.messages.staged_fits(self.max_message_size) {
                emit_batch(self);
            }
            self.messages.push_staged();
            if self.messages.batch_full() {
                emit_batch(self);
            }
            self.rows += 1;
            return;
        }
        let content = self.messages.build(key_values, row.json(), partition.as_deref(), self.signer);
        if content.len() > self.max_message_size {
            too_large(
                self.table,
                self.max_message_size,
                &row.values_of(values, nulls, self.key_columns),
                content.len(),
            );
        }
        message::emit(self.prefix, content);
        self.rows += 1;
        self.bytes += content.len() as i64;
    }
}

/// Writes the open batch of rows, if there is one.
fn emit_batch(sink: &mut Sink) {
    if let Some(content) = sink.messages.take_batch(sink.signer) {
        message::emit(sink.prefix, content);
        sink.bytes += content.len() as i64;
    }
}

/// A row whose message would pass backfill.max_message_size fails the backfill: PostgreSQL 15
/// writes a logical message of any size, but cannot read back a WAL record of 1 GB or more, so
/// every slot, and after a crash the server's own recovery, would fail on it.
fn too_large(table: &str, max_message_size: usize, key: &str, at_least: usize) -> ! {
    crate::pg::errors::raise(
        pgrx::PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
        format!("row ({key}) of table {table} is too large for a message"),
        format!(
            "Its message would take at least {at_least} bytes; backfill.max_message_size is {max_message_size} bytes."
        ),
        Some(format!(
            "Raise backfill.max_message_size (at most {}), or shrink the row, then SELECT backfill_resume(...).",
            crate::pg::settings::MAX_MESSAGE_SIZE_CEILING
        )),
    )
}

/// A value with no UTF-8 form (bytes that are not UTF-8 in a SQL_ASCII database, or a character
/// UTF-8 lacks) fails the backfill, as `convert_to(value, 'UTF8')` would fail: messages are UTF-8.
fn not_utf8(table: &str, column: &str, key: &str) -> ! {
    crate::pg::errors::raise(
        pgrx::PgSqlErrorCode::ERRCODE_CHARACTER_NOT_IN_REPERTOIRE,
        format!("column {column} of row ({key}) of table {table} has no UTF-8 form"),
        format!(
            "Backfill messages are UTF-8; the value is not valid in this database's encoding ({}) converted to UTF-8.",
            crate::pg::encoding::database_encoding_name()
        ),
        Some(
            "Correct the value (in a SQL_ASCII database, store text as UTF-8), then SELECT backfill_resume(...)."
                .into(),
        ),
    )
}
