//! Checks of the SQL functions' arguments and of where they run, shared by the functions that
//! start backfills (`api.rs`) and those that control them (`control.rs`).

use crate::errors::raise;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;

const MAX_BATCH_SIZE: i32 = 100_000;

/// An argument that must not be NULL.
pub fn required<T>(value: Option<T>, function: &str, argument: &str) -> T {
    value.unwrap_or_else(|| {
        raise(
            ERRCODE_NULL_VALUE_NOT_ALLOWED,
            format!("argument {argument} of {function} must not be NULL"),
            format!("{function} was called with {argument} => NULL."),
            Some(format!("Pass a value, or leave {argument} out for its default.")),
        )
    })
}

/// Messages are UTF-8 JSON: a database in another encoding would need every value and name
/// converted, which pg_backfill does not do yet. It refuses such a database instead of
/// delivering bytes no consumer could read as UTF-8.
pub fn require_utf8_database() {
    // SAFETY: reads the database's encoding, fixed at connection.
    let encoding = unsafe { pg_sys::GetDatabaseEncoding() };
    if encoding != pg_sys::pg_enc::PG_UTF8 as i32 {
        // SAFETY: the name of a valid encoding id, a static string.
        let name = unsafe { std::ffi::CStr::from_ptr(pg_sys::GetDatabaseEncodingName()) }.to_string_lossy();
        raise(
            ERRCODE_FEATURE_NOT_SUPPORTED,
            "pg_backfill needs a UTF-8 database",
            format!("This database's encoding is {name}; backfill messages are UTF-8 JSON and pg_backfill does not convert values yet."),
            Some("Backfill a UTF-8 database (its consumers can convert what they receive).".into()),
        )
    }
}

/// Backfills write WAL: a standby cannot start or change one. (Its views show the primary's
/// backfills as they replicate, and backfill_wait() waits for them.)
pub fn require_primary(what: &str) {
    // SAFETY: reads the shared recovery state.
    let in_recovery = unsafe { pg_sys::RecoveryInProgress() };
    if in_recovery {
        raise(
            ERRCODE_READ_ONLY_SQL_TRANSACTION,
            format!("cannot {what} on a standby"),
            "This server is in recovery: it writes no WAL, so it can run no backfill.",
            Some("Run it on the primary; its backfills show in backfill_status here as they replicate.".into()),
        )
    }
}

pub fn check_batch_size(batch_size: i32) {
    if !(1..=MAX_BATCH_SIZE).contains(&batch_size) {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            format!("batch_size {batch_size} is out of range"),
            format!("batch_size is the number of rows per page and must be between 1 and {MAX_BATCH_SIZE}."),
            Some("The default, 1000, suits most tables; use less for very wide rows.".into()),
        );
    }
}

pub fn check_rate(rows_per_second: Option<i32>) {
    if let Some(rate) = rows_per_second.filter(|r| *r <= 0) {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            format!("rows_per_second {rate} is out of range"),
            "rows_per_second is the most rows the backfill delivers per second and must be positive.",
            Some("Pass NULL (the default) for no limit.".into()),
        );
    }
}
