//! Reading through SPI without marking the transaction as one that writes.
//!
//! pgrx's `Spi::get_one` and `update` assign the transaction an id: a read through them makes
//! a `SELECT * FROM backfill_status` write a commit record, and fails on a standby ("cannot
//! assign TransactionIds during recovery"). Reads go through here instead.

use pgrx::datum::{DatumWithOid, FromDatum, IntoDatum};
use pgrx::prelude::*;
use pgrx::spi::SpiResult;

/// The first column of the first row of a query, if it returns a row.
pub fn select_one<T: FromDatum + IntoDatum>(query: &str, args: &[DatumWithOid]) -> SpiResult<Option<T>> {
    Spi::connect(|client| {
        let rows = client.select(query, Some(1), args)?;
        if rows.is_empty() {
            Ok(None)
        } else {
            rows.first().get::<T>(1)
        }
    })
}

/// The planner's estimate of the rows a query returns (`EXPLAIN`), without assigning the
/// transaction an id as pgrx's `Spi::explain` does, so that it works on a standby too. The plan
/// is read as text in the database's encoding (it names the table) and converted to UTF-8.
pub fn planned_rows(query: &str) -> Option<f64> {
    let explain = std::ffi::CString::new(format!("EXPLAIN (FORMAT JSON) {query}")).ok()?;
    // SAFETY: SPI is connected around the statement; the plan's text is copied out of SPI's
    // memory before SPI_finish frees it. EXPLAIN without ANALYZE runs nothing and writes nothing
    // (it is refused in read-only SPI only because it is a utility statement).
    let plan = unsafe {
        pg_sys::SPI_connect();
        let text = if pg_sys::SPI_execute(explain.as_ptr(), false, 1) == pg_sys::SPI_OK_UTILITY as i32
            && pg_sys::SPI_processed == 1
        {
            let table = *pg_sys::SPI_tuptable;
            let value = pg_sys::SPI_getvalue(*table.vals, table.tupdesc, 1);
            (!value.is_null()).then(|| std::ffi::CStr::from_ptr(value).to_bytes().to_vec())
        } else {
            None
        };
        pg_sys::SPI_finish();
        text
    }?;
    let plan: serde_json::Value = serde_json::from_slice(&crate::encoding::to_utf8(&plan)?).ok()?;
    plan[0]["Plan"]["Plan Rows"].as_f64()
}
