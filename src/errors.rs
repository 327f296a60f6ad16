//! User-facing errors: one helper so that every error carries a SQLSTATE, a message naming
//! the object, a detail with the facts and, where there is one, a hint with the fix.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

/// Raises an ERROR; never returns. The error's LOCATION is the caller's (track_caller), not
/// this helper's.
#[track_caller]
pub fn raise(code: PgSqlErrorCode, message: impl Into<String>, detail: impl Into<String>, hint: Option<String>) -> ! {
    let mut report = ErrorReport::new(code, message.into(), "pg_backfill").set_detail(detail.into());
    if let Some(hint) = hint {
        report = report.set_hint(hint);
    }
    report.report(PgLogLevel::ERROR);
    unreachable!("ERROR does not return")
}
