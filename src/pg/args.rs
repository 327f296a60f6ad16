//! Checks of the SQL functions' arguments and of where they run, shared by the functions that
//! start backfills (`api/start.rs`, `start/options.rs`) and those that control them (`control.rs`).

use crate::pg::errors::raise;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;

const MAX_BATCH_SIZE: i32 = 100_000;

/// An argument that must not be NULL (the error's location is the caller's).
#[track_caller]
pub fn required<T>(value: Option<T>, function: &str, argument: &str) -> T {
    match value {
        Some(value) => value,
        None => raise(
            ERRCODE_NULL_VALUE_NOT_ALLOWED,
            format!("argument {argument} of {function} must not be NULL"),
            format!("{function} was called with {argument} => NULL."),
            Some(format!("Pass a value, or leave {argument} out for its default.")),
        ),
    }
}

/// Backfills write WAL: a standby cannot start or change one. (Its views show the primary's
/// backfills as they replicate, and backfill_wait() waits for them.)
#[track_caller]
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

/// batch_size of backfill_start(), backfill_set() and backfill_repair(): rows per page.
#[track_caller]
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

/// rows_per_second of backfill_start() and backfill_set(): a positive rate, or 0 for no limit
/// (as in both functions: backfill_set() needs a value that lifts the limit, NULL keeping it).
#[track_caller]
pub fn check_rate(rows_per_second: Option<i32>) {
    if let Some(rate) = rows_per_second.filter(|r| *r < 0) {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            format!("rows_per_second {rate} is out of range"),
            "rows_per_second is the most rows the backfill delivers per second: positive, or 0 for no limit.",
            Some("Pass 0 for no limit, or a positive rate such as rows_per_second => 5000.".into()),
        );
    }
}

/// rows_per_message of backfill_start(): 1 (a `read` per row) up to the most a page holds.
#[track_caller]
pub fn check_rows_per_message(rows_per_message: i32) {
    let most = crate::pg::settings::MAX_ROWS_PER_MESSAGE;
    if !(1..=most).contains(&rows_per_message) {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            format!("rows_per_message {rows_per_message} is out of range"),
            format!(
                "rows_per_message is the most rows one message carries and must be between 1 (a read message \
                 per row) and {most}."
            ),
            Some(
                "Pass 1 for one message per row, or a few hundred to batch each page's rows; NULL (the default) \
                  takes backfill.rows_per_message."
                    .into(),
            ),
        );
    }
}

/// Whether `interval` is negative (as PostgreSQL compares intervals: a month is 30 days).
pub fn is_negative(interval: pgrx::datum::Interval) -> bool {
    crate::pg::spi::select_one::<bool>("SELECT $1 OPERATOR(pg_catalog.<) pg_catalog.interval '0'", &[interval.into()])
        .ok()
        .flatten()
        .unwrap_or(false)
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::*;
    use crate::pg::errors::tests::location_of;

    #[pg_test]
    fn the_checks_report_their_callers_location() {
        let file = file!().to_string();
        let line = line!();
        let null = location_of(|| {
            required(None::<i32>, "f", "x");
        });
        let batch = location_of(|| check_batch_size(0));
        let rate = location_of(|| check_rate(Some(-1)));
        let per_message = location_of(|| check_rows_per_message(0));
        assert_eq!(null, Some((file.clone(), line + 2)));
        assert_eq!(batch, Some((file.clone(), line + 4)));
        assert_eq!(rate, Some((file.clone(), line + 5)));
        assert_eq!(per_message, Some((file, line + 6)));
    }
}

/// When a wait given `timeout_ms` milliseconds (a timeout interval's, as the SQL wrappers pass
/// it) ends: None for no timeout, or one too far to be a time (`interval 'infinity'`, 17 and
/// later: its epoch is infinite, which no Duration holds); a negative one ends at once.
pub fn deadline_after(timeout_ms: Option<f64>) -> Option<std::time::Instant> {
    let timeout = std::time::Duration::try_from_secs_f64(timeout_ms?.max(0.0) / 1000.0).ok()?;
    std::time::Instant::now().checked_add(timeout)
}
