//! User-facing errors: one helper so that every error carries a SQLSTATE, a message naming
//! the object, a detail with the facts and, where there is one, a hint with the fix.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;
use std::borrow::Cow;
use std::fmt::Write;

/// Raises an ERROR; never returns. The error's LOCATION is the caller's (track_caller), not
/// this helper's. A helper that raises on its caller's behalf carries #[track_caller] too, and
/// calls this outside any closure (a closure's location would be reported).
#[track_caller]
pub fn raise(code: PgSqlErrorCode, message: impl Into<String>, detail: impl Into<String>, hint: Option<String>) -> ! {
    let text = |text: String| for_server(&text).into_owned();
    let mut report = ErrorReport::new(code, text(message.into()), "pg_backfill").set_detail(text(detail.into()));
    if let Some(hint) = hint {
        report = report.set_hint(text(hint));
    }
    report.report(PgLogLevel::ERROR);
    unreachable!("ERROR does not return")
}

/// A message for the server's log or an error: as it is in a UTF-8 database; elsewhere with
/// every non-ASCII character written `\uXXXX`, since pgrx would pass its UTF-8 bytes to a
/// server that reads them in its own encoding.
pub fn for_server(message: &str) -> Cow<'_, str> {
    // SAFETY: reads the session's database encoding.
    if message.is_ascii() || unsafe { pg_sys::GetDatabaseEncoding() } == pg_sys::pg_enc::PG_UTF8 as i32 {
        return Cow::Borrowed(message);
    }
    let mut escaped = String::with_capacity(message.len() + 16);
    for c in message.chars() {
        if c.is_ascii() {
            escaped.push(c);
        } else {
            for unit in c.encode_utf16(&mut [0; 2]) {
                let _ = write!(escaped, "\\u{unit:04x}");
            }
        }
    }
    Cow::Owned(escaped)
}

/// The hint of an error no user can cause.
pub const BUG_HINT: &str = "This is a bug in pg_backfill: report it with the server log's lines around this error.";

/// A call into SPI that failed with `code` (negative, SPI_ERROR_*) without raising an ERROR
/// itself: no user can cause it. XX000, at the caller's location.
#[track_caller]
pub fn spi_failed(doing: &str, code: i32) -> ! {
    // SAFETY: returns a static string for any code.
    let name = unsafe { std::ffi::CStr::from_ptr(pg_sys::SPI_result_code_string(code)) };
    raise(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("pg_backfill could not {doing}"),
        format!("SPI returned {} ({code}).", name.to_string_lossy()),
        Some(BUG_HINT.into()),
    )
}

/// Errors no user can cause: a failed statement on pg_backfill's own tables, a plan that could
/// not be prepared. They raise XX000 saying what pg_backfill was doing, with the underlying
/// error as the detail, at the caller's location.
pub trait OrInternal<T> {
    fn or_internal(self, doing: &str) -> T;
}

impl<T, E: std::fmt::Display> OrInternal<T> for Result<T, E> {
    // (A match, not unwrap_or_else: a closure would be the caller that track_caller reports.)
    #[track_caller]
    fn or_internal(self, doing: &str) -> T {
        match self {
            Ok(value) => value,
            Err(e) => raise(
                pgrx::PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                format!("pg_backfill could not {doing}"),
                e.to_string(),
                Some(BUG_HINT.into()),
            ),
        }
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
pub(crate) mod tests {
    use super::*;
    use pgrx::pg_sys::panic::CaughtError;

    /// Where an error caught in `f` says it was raised: (file, line). (The helpers that raise on
    /// their caller's behalf test theirs with it.)
    pub(crate) fn location_of(f: impl FnOnce() + std::panic::UnwindSafe) -> Option<(String, u32)> {
        PgTryBuilder::new(|| {
            f();
            None
        })
        .catch_others(|caught| match caught {
            CaughtError::ErrorReport(report)
            | CaughtError::PostgresError(report)
            | CaughtError::RustPanic { ereport: report, .. } => Some((report.file().to_string(), report.line_number())),
        })
        .execute()
    }

    #[pg_test]
    fn a_helper_reports_its_callers_location() {
        let (file, line) = (file!().to_string(), line!());
        let internal = location_of(|| Err::<(), _>("it broke").or_internal("test the location"));
        assert_eq!(internal, Some((file, line + 1)));
    }
}
