//! The worker's transactions: each unit of work runs in a transaction of its own, and the error
//! it raises becomes a value that can be classified (transient or not), logged and stored.

use pgrx::pg_sys::panic::{CaughtError, ErrorReportWithLevel};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::{self, *};
use std::panic::UnwindSafe;

/// Why a page failed, kept apart from pgrx's error type so that it can be logged and stored.
#[derive(Debug, Clone)]
pub struct PageError {
    pub code: PgSqlErrorCode,
    pub sqlstate: String,
    pub message: String,
}

impl PageError {
    pub fn from_report(report: &ErrorReportWithLevel) -> Self {
        let code = report.sql_error_code();
        let mut message = report.message().to_string();
        if let Some(detail) = report.detail() {
            message.push_str(&format!(" ({detail})"));
        }
        PageError { code, sqlstate: sqlstate_of(code), message }
    }

    /// Failures that a later attempt of the same page can get past.
    pub fn is_transient(&self) -> bool {
        matches!(
            self.code,
            ERRCODE_LOCK_NOT_AVAILABLE
                | ERRCODE_T_R_DEADLOCK_DETECTED
                | ERRCODE_T_R_SERIALIZATION_FAILURE
                | ERRCODE_QUERY_CANCELED
        )
    }
}

pub fn sqlstate_of(code: PgSqlErrorCode) -> String {
    let mut n = code as i32;
    (0..5)
        .map(|_| {
            let c = ((n & 0x3F) as u8 + b'0') as char;
            n >>= 6;
            c
        })
        .collect()
}

fn report_of(e: CaughtError) -> ErrorReportWithLevel {
    match e {
        CaughtError::PostgresError(r) | CaughtError::ErrorReport(r) => r,
        CaughtError::RustPanic { ereport, .. } => ereport,
    }
}

/// Runs `body` in a transaction of its own: commits when it returns, rolls back and returns the
/// error when it raises one. An error therefore never ends the worker by itself.
pub fn in_transaction<R>(body: impl FnOnce() -> R + UnwindSafe) -> Result<R, PageError> {
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    PgTryBuilder::new(move || {
        let result = body();
        unsafe {
            pg_sys::PopActiveSnapshot();
            pg_sys::CommitTransactionCommand();
        }
        Ok(result)
    })
    .catch_others(|e| {
        unsafe { pg_sys::AbortCurrentTransaction() };
        Err(PageError::from_report(&report_of(e)))
    })
    .execute()
}
