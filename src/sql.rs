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
