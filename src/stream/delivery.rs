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

use crate::stream::json::{Rendered, RowJson};
use crate::stream::message::{self, ReadMessage};
use crate::stream::sign::Signer;
use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;
use std::ffi::{c_int, CString};

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
    pub rows: i64,
    pub bytes: i64,
}

/// A DestReceiver (first, so that PostgreSQL can use a pointer to this as one) and our sink.
#[repr(C)]
struct Receiver {
    base: pg_sys::DestReceiver,
    sink: *mut Sink<'static>,
}

/// Runs a page query's kept plan (sql::kept_plan, for these arguments); every row it returns
/// goes to `sink`.
pub fn run(plan: pg_sys::SPIPlanPtr, args: &[DatumWithOid], sink: &mut Sink) {
    // Every batch is of this query's rows: one left open by a page that rolled back is stale.
    sink.messages.discard_batch();
    // SAFETY: `plan` is a kept plan with parameters of the arguments' types; the arguments'
    // datums live as long as `args`; the receiver and the sink it points to outlive the
    // execution, which calls back into them only.
    unsafe {
        pg_sys::SPI_connect();
        let params = pg_sys::makeParamList(args.len() as c_int);
        let slots = (*params).params.as_mut_slice(args.len());
        for (param, arg) in slots.iter_mut().zip(args) {
            param.value = arg.datum().map_or(pg_sys::Datum::from(0), |d| d.sans_lifetime());
            param.isnull = arg.datum().is_none();
            param.pflags = pg_sys::PARAM_FLAG_CONST as u16;
            param.ptype = arg.oid();
        }
        let mut receiver = Receiver {
            base: pg_sys::DestReceiver {
                receiveSlot: Some(receive),
                rStartup: Some(startup),
                rShutdown: Some(shutdown),
                rDestroy: Some(shutdown),
                mydest: pg_sys::CommandDest::DestNone,
            },
            sink: (sink as *mut Sink).cast(),
        };
        let options = pg_sys::SPIExecuteOptions {
            params,
            // Not read-only: the query takes row locks and needs a fresh snapshot.
            read_only: false,
            dest: &mut receiver.base,
            ..Default::default()
        };
        let rc = pg_sys::SPI_execute_plan_extended(plan, &options);
        pg_sys::SPI_finish();
        // The page's last rows, batched (a failed query raised an ERROR above and never gets here).
        emit_batch(sink);
        // (SPI reports SPI_OK_UTILITY, not SPI_OK_SELECT, for a query whose rows went to a
        // DestNone receiver; negative codes are the failures.)
        if rc < 0 {
            crate::pg::errors::spi_failed("run the page query", rc);
        }
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn receive(slot: *mut pg_sys::TupleTableSlot, receiver: *mut pg_sys::DestReceiver) -> bool {
    let sink = &mut *(*receiver.cast::<Receiver>()).sink;
    let natts = (*(*slot).tts_tupleDescriptor).natts;
    if ((*slot).tts_nvalid as c_int) < natts {
        pg_sys::slot_getsomeattrs_int(slot, natts);
    }
    let values = std::slice::from_raw_parts((*slot).tts_values, natts as usize);
    let nulls = std::slice::from_raw_parts((*slot).tts_isnull, natts as usize);
    // The partition's name follows the table's columns.
    let (columns, partition) =
        if sink.partitioned { (natts as usize - 1, values.last()) } else { (natts as usize, None) };
    let row = &mut *sink.row;
    match row.render(&values[..columns], &nulls[..columns], sink.max_message_size) {
        Rendered::Row => {}
        Rendered::TooLarge => too_large(
            sink.table,
            sink.max_message_size,
            &row.values_of(values, nulls, sink.key_columns),
            row.json().len(),
        ),
        Rendered::NotUtf8 { column } => {
            not_utf8(sink.table, row.column_name(column), &row.values_of(values, nulls, sink.key_columns))
        }
    }
    let key_values = sink.key_columns.iter().map(|&i| row.value(i));
    // A partition's name, like a value, reaches the message in UTF-8.
    let partition = partition.map(|p| {
        crate::pg::encoding::to_utf8(crate::pg::encoding::text_of(*p)).unwrap_or_else(|| {
            not_utf8(sink.table, "(its partition's name)", &row.values_of(values, nulls, sink.key_columns))
        })
    });
    if sink.messages.batched() {
        let alone = sink.messages.stage(key_values, row.json(), partition.as_deref());
        // A row too large for a message of its own fails the backfill, as in a `read`.
        if alone > sink.max_message_size {
            too_large(sink.table, sink.max_message_size, &row.values_of(values, nulls, sink.key_columns), alone);
        }
        if !sink.messages.staged_fits(sink.max_message_size) {
            emit_batch(sink);
        }
        sink.messages.push_staged();
        if sink.messages.batch_full() {
            emit_batch(sink);
        }
        sink.rows += 1;
        return true;
    }
    let content = sink.messages.build(key_values, row.json(), partition.as_deref(), sink.signer);
    if content.len() > sink.max_message_size {
        too_large(sink.table, sink.max_message_size, &row.values_of(values, nulls, sink.key_columns), content.len());
    }
    message::emit(sink.prefix, content);
    sink.rows += 1;
    sink.bytes += content.len() as i64;
    true
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

#[pg_guard]
unsafe extern "C-unwind" fn startup(receiver: *mut pg_sys::DestReceiver, _operation: c_int, result: pg_sys::TupleDesc) {
    let sink = &*(*receiver.cast::<Receiver>()).sink;
    if !sink.row.matches(result) {
        crate::pg::errors::raise(
            pgrx::PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "the page query's columns are not those of the table's rows: the table changed under the scan",
            "An ALTER TABLE changed the table's columns between the page's check of them and its query.",
            Some("Resume the backfill (backfill_resume): its next page reads the columns as they are now.".into()),
        );
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn shutdown(_receiver: *mut pg_sys::DestReceiver) {}
