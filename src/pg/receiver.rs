//! A query's rows handed to Rust as the executor produces them, through a DestReceiver of ours
//! rather than into an SPI tuple table: no row is materialized a second time, and no SQL
//! function or SPI call runs per row. The page queries of a backfill (stream/delivery.rs) and
//! the checksum's scan (verify/row_hash.rs) run this way. The unsafe part, the receiver's
//! layout and callbacks, the query's parameters and SPI's connection, is written once, here;
//! what happens to each row is the caller's [`RowSink`].

use crate::pg::errors::spi_failed;
use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;
use std::ffi::{c_int, CString};

/// What receives a query's rows, one by one.
pub trait RowSink {
    /// Called once, before the first row, with the rows' descriptor.
    ///
    /// # Safety
    /// `row_type` is the descriptor the executor passes to a receiver's startup: valid until
    /// the query's execution ends. Called in the execution's memory context.
    unsafe fn start(&mut self, row_type: pg_sys::TupleDesc);

    /// Called for each row, with its values and NULL flags, one per column of the descriptor
    /// given to [`start`](Self::start), every column deformed.
    ///
    /// # Safety
    /// `values` and `nulls` are a row of that descriptor, valid until this call returns.
    unsafe fn row(&mut self, values: &[pg_sys::Datum], nulls: &[bool]);
}

/// The query whose rows go to a [`RowSink`]; its parameters are of the types of the arguments.
pub enum Query<'a> {
    /// A plan kept for the process's lifetime (`spi::kept_plan`, for arguments of these types).
    Kept(pg_sys::SPIPlanPtr),
    /// SQL planned for this one run.
    Once(&'a str),
}

/// A DestReceiver (first, so that PostgreSQL can use a pointer to this as one) and the sink its
/// callbacks hand the rows to.
#[repr(C)]
struct Receiver<'s> {
    base: pg_sys::DestReceiver,
    sink: &'s mut dyn RowSink,
}

/// Runs `query` with `args` (NULL where an argument has no datum), every row it returns to
/// `sink`. `read_only`: the query takes a snapshot of the statement's start and may neither
/// write nor lock rows; otherwise (a page query, which locks its rows) it takes a fresh
/// snapshot. `what` names the query for an error SPI reports (an ERROR of the query itself,
/// such as a lock not available, is raised as it is).
pub fn run(query: Query, args: &[DatumWithOid], read_only: bool, sink: &mut dyn RowSink, what: &str) {
    let mut types: Vec<pg_sys::Oid> = args.iter().map(DatumWithOid::oid).collect();
    let text = match query {
        Query::Once(sql) => Some(CString::new(sql).expect("generated SQL has no NUL byte")),
        Query::Kept(_) => None,
    };
    // SAFETY: SPI is connected around the planning and the one execution, and finished after
    // it (an ERROR in between aborts the transaction, which closes the connection). A plan made
    // here lives in SPI's memory until SPI_finish; a kept one has parameters of the arguments'
    // types. The arguments' datums live as long as `args`, past the execution. The receiver,
    // and the sink it points to, outlive the execution, which calls back into them only.
    let code = unsafe {
        pg_sys::SPI_connect();
        let plan = match (&query, &text) {
            (Query::Kept(plan), _) => *plan,
            (Query::Once(_), Some(text)) => {
                pg_sys::SPI_prepare(text.as_ptr(), types.len() as c_int, types.as_mut_ptr())
            }
            (Query::Once(_), None) => unreachable!("a query planned once has its text"),
        };
        if plan.is_null() {
            spi_failed(&format!("plan {what}"), std::ptr::addr_of!(pg_sys::SPI_result).read());
        }
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
            sink,
        };
        let options = pg_sys::SPIExecuteOptions { params, read_only, dest: &mut receiver.base, ..Default::default() };
        let code = pg_sys::SPI_execute_plan_extended(plan, &options);
        pg_sys::SPI_finish();
        code
    };
    // (SPI reports SPI_OK_UTILITY, not SPI_OK_SELECT, for a query whose rows went to a
    // DestNone receiver; negative codes are the failures.)
    if code < 0 {
        spi_failed(&format!("run {what}"), code);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn startup(
    receiver: *mut pg_sys::DestReceiver,
    _operation: c_int,
    row_type: pg_sys::TupleDesc,
) {
    // SAFETY: `receiver` is the base of a Receiver (run() passes no other), alive for the
    // execution; `row_type` is the executor's descriptor of the rows to come.
    let receiver = &mut *receiver.cast::<Receiver<'_>>();
    receiver.sink.start(row_type);
}

#[pg_guard]
unsafe extern "C-unwind" fn receive(slot: *mut pg_sys::TupleTableSlot, receiver: *mut pg_sys::DestReceiver) -> bool {
    // SAFETY: as in startup(); `slot` holds a row of the descriptor startup() was given, whose
    // columns are all deformed here, so that its values and NULL flags are valid for every
    // column until the next row.
    let receiver = &mut *receiver.cast::<Receiver<'_>>();
    let natts = (*(*slot).tts_tupleDescriptor).natts;
    if ((*slot).tts_nvalid as c_int) < natts {
        pg_sys::slot_getsomeattrs_int(slot, natts);
    }
    let values = std::slice::from_raw_parts((*slot).tts_values, natts as usize);
    let nulls = std::slice::from_raw_parts((*slot).tts_isnull, natts as usize);
    receiver.sink.row(values, nulls);
    true
}

#[pg_guard]
unsafe extern "C-unwind" fn shutdown(_receiver: *mut pg_sys::DestReceiver) {}
