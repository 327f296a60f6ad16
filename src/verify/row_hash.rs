//! The row hash of backfill_checksum(): the SQL function backfill.row_hash(), and the scan that
//! sums it per key range. What a row's hash is computed over is in row_encoding.rs.

use crate::pg::errors::raise;
use crate::pg::receiver::{self, Query, RowSink};
use crate::verify::row_encoding::RowHasher;
use pgrx::prelude::*;
use pgrx::AnyElement;
use pgrx::PgSqlErrorCode::*;

/// What backfill.row_hash() keeps from call to call of one query (in its FmgrInfo): the row
/// type it hashes, a copy of its descriptor, and its hasher.
struct CallState {
    row_type: (pg_sys::Oid, i32),
    tupdesc: pg_sys::TupleDesc,
    hasher: RowHasher,
    values: Vec<pg_sys::Datum>,
    nulls: Vec<bool>,
}

/// backfill.row_hash(t): the row's 64-bit hash, as backfill_checksum() sums it; a row of a
/// table, as `t` names it in `FROM tbl t`. (Text is taken in UTF-8 here too.)
// STABLE, not IMMUTABLE: an enum's label, which the hash reads, can be renamed.
#[pg_extern(schema = "backfill", stable, parallel_safe)]
fn row_hash(row: AnyElement, fcinfo: pg_sys::FunctionCallInfo) -> i64 {
    // SAFETY: `row` is a composite datum (anything else is refused before it is read as one);
    // it is detoasted and deformed with a copy of its own type's descriptor, made once a query
    // (a row type cannot change while a query reads it; a value made before its type was
    // altered, kept in a variable or an array, is refused by heap_deform_tuple() on the minors
    // that can tell: see row_type_of()) in the function's memory, which drops the state with it.
    unsafe {
        let flinfo = (*fcinfo).flinfo;
        let mut state = (*flinfo).fn_extra.cast::<CallState>();
        // (A call's argument type is the same at every call of the query.)
        if state.is_null() && !pg_sys::type_is_rowtype(row.oid()) {
            raise(
                ERRCODE_DATATYPE_MISMATCH,
                "backfill.row_hash() takes a table's row",
                "It hashes the columns of a row, as FROM tbl t SELECT backfill.row_hash(t) gives it.",
                Some("Pass a table's row: SELECT backfill.row_hash(t) FROM public.orders t;".into()),
            );
        }
        let header = pg_sys::pg_detoast_datum(row.datum().cast_mut_ptr()) as pg_sys::HeapTupleHeader;
        let row_type = crate::verify::row_encoding::row_type_of(header);
        if state.is_null() || (*state).row_type != row_type {
            state = call_state(row_type, (*flinfo).fn_mcxt);
            (*flinfo).fn_extra = state.cast();
        }
        let state = &mut *state;
        let mut tuple = pg_sys::HeapTupleData {
            t_len: pgrx::varsize_any(header.cast()) as u32,
            t_data: header,
            ..Default::default()
        };
        pg_sys::heap_deform_tuple(&mut tuple, state.tupdesc, state.values.as_mut_ptr(), state.nulls.as_mut_ptr());
        // Called from SQL (a comparison's row listing, here or through dblink, whose session
        // has the caller's database's encoding as its client's): text in UTF-8 all the same.
        // (The state is left as it was if hashing fails: the query ends with the error.)
        crate::pg::encoding::in_utf8(std::panic::AssertUnwindSafe(|| {
            state.hasher.hash(&state.values, &state.nulls) as i64
        }))
    }
}

/// The state of row_hash() for rows of `row_type`, in `memory`.
///
/// # Safety
/// `memory` is a memory context that outlives the query's calls.
unsafe fn call_state(row_type: (pg_sys::Oid, i32), memory: pg_sys::MemoryContext) -> *mut CallState {
    let cached = pg_sys::lookup_rowtype_tupdesc(row_type.0, row_type.1);
    let caller_memory = pg_sys::MemoryContextSwitchTo(memory);
    let tupdesc = pg_sys::CreateTupleDescCopy(cached);
    pg_sys::MemoryContextSwitchTo(caller_memory);
    // (ReleaseTupleDesc: an anonymous record's descriptor, shared after a parallel query, is
    // not reference-counted.)
    if (*cached).tdrefcount >= 0 {
        pg_sys::DecrTupleDescRefCount(cached);
    }
    let natts = (*tupdesc).natts as usize;
    let state = CallState {
        row_type,
        tupdesc,
        hasher: RowHasher::new(tupdesc, 0),
        values: vec![pg_sys::Datum::from(0); natts],
        nulls: vec![false; natts],
    };
    pgrx::PgMemoryContexts::For(memory).leak_and_drop_on_delete(state)
}

/// Each range's row count and the sum of its rows' hashes.
pub struct RangeSums {
    pub rows: Vec<i64>,
    pub sums: Vec<i128>,
    /// The bounds of an integer key, when the query's first column is the key, not the range.
    integer_bounds: Option<Vec<i64>>,
    hasher: Option<RowHasher>,
    /// What hashing a row allocates, freed after each row.
    row_memory: pg_sys::MemoryContext,
}

/// Runs `sql` (its first column the range, 0 to `ranges - 1`, or with `integer_bounds` the
/// key, as int8; the table's columns after it), with one jsonb parameter, and sums what it
/// returns per range: the rows are hashed here as
/// they come, with no row materialized twice. Not in parallel: this process would still hash
/// every row, and workers would only pass it whole rows through a queue (measured: no faster).
pub fn scan(sql: &str, parameter: pgrx::JsonB, ranges: usize, integer_bounds: Option<Vec<i64>>) -> RangeSums {
    let mut sums = RangeSums {
        rows: vec![0; ranges],
        sums: vec![0; ranges],
        integer_bounds,
        hasher: None,
        row_memory: std::ptr::null_mut(),
    };
    receiver::run(Query::Once(sql), &[parameter.into()], true, &mut sums, "the checksum's scan");
    // (The row memory, a child of the execution's, went with it.)
    sums
}

impl RowSink for RangeSums {
    unsafe fn start(&mut self, row_type: pg_sys::TupleDesc) {
        self.hasher = Some(RowHasher::new(row_type, 1));
        self.row_memory = pg_sys::AllocSetContextCreateInternal(
            pg_sys::CurrentMemoryContext,
            c"backfill row hash".as_ptr(),
            0,
            pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
            pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
        );
    }

    unsafe fn row(&mut self, values: &[pg_sys::Datum], nulls: &[bool]) {
        // As width_bucket(): the number of bounds at or below the key (which is never NULL).
        let range = match &self.integer_bounds {
            Some(bounds) => bounds.partition_point(|bound| *bound <= values[0].value() as i64),
            None => (values[0].value() as i32).clamp(0, self.rows.len() as i32 - 1) as usize,
        };
        self.rows[range] += 1;
        if let Some(hasher) = &mut self.hasher {
            // Detoasted values and send formats are the row's: gone before the next one.
            let caller_memory = pg_sys::MemoryContextSwitchTo(self.row_memory);
            self.sums[range] += i128::from(hasher.hash(&values[1..], &nulls[1..]) as i64);
            pg_sys::MemoryContextSwitchTo(caller_memory);
            pg_sys::MemoryContextReset(self.row_memory);
        }
    }
}
