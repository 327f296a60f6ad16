//! The worker's transactions: each unit of work runs in a transaction of its own, and the error
//! it raises becomes a value that can be classified (transient or not), logged and stored; and
//! how a worker names its backfill in the server log.

use pgrx::pg_sys::panic::{CaughtError, ErrorReportWithLevel};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::{self, *};
use std::panic::UnwindSafe;

/// Why a page failed, kept apart from pgrx's error type so that it can be logged and stored.
#[derive(Debug, Clone)]
pub struct PageError {
    pub code: PgSqlErrorCode,
    pub sqlstate: String,
    /// The message, with the detail after it in parentheses (as backfill_status.last_error
    /// shows it).
    pub message: String,
    /// The message alone, and the detail, as backfill_errors keeps them.
    pub primary: String,
    pub detail: Option<String>,
}

impl PageError {
    pub fn from_report(report: &ErrorReportWithLevel) -> Self {
        let code = report.sql_error_code();
        let primary = report.message().to_string();
        let detail = report.detail().map(str::to_string);
        PageError::new(code, primary, detail)
    }

    pub fn new(code: PgSqlErrorCode, primary: String, detail: Option<String>) -> Self {
        let message = match &detail {
            Some(detail) => format!("{primary} ({detail})"),
            None => primary.clone(),
        };
        PageError { code, sqlstate: sqlstate_of(code), message, primary, detail }
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
    // SAFETY: unpack_sql_state writes the five characters to a static buffer and returns it.
    unsafe { std::ffi::CStr::from_ptr(pg_sys::unpack_sql_state(code as i32)) }.to_string_lossy().into_owned()
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
    // SAFETY: the worker is between transactions here: it starts one, with a snapshot.
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        crate::catalog::schema::wait_for_extension_update();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    PgTryBuilder::new(move || {
        let result = body();
        // SAFETY: ends the transaction started above, whose snapshot is still the active one.
        unsafe {
            pg_sys::PopActiveSnapshot();
            pg_sys::CommitTransactionCommand();
        }
        Ok(result)
    })
    .catch_others(|e| {
        // SAFETY: the error left the transaction aborted-in-progress: this cleans it up.
        unsafe { pg_sys::AbortCurrentTransaction() };
        Err(PageError::from_report(&report_of(e)))
    })
    .execute()
}

/// Runs `body` in a subtransaction of the current transaction: kept when it returns, rolled
/// back, with the error returned, when it raises one, as PL/pgSQL's EXCEPTION block does. (A
/// follow's start, in the transaction of the DDL that queued its table: the DDL must not fail.)
pub fn in_subtransaction<R>(body: impl FnOnce() -> R + UnwindSafe) -> Result<R, PageError> {
    // SAFETY: the memory context and resource owner are saved and put back after the
    // subtransaction ends either way, as PL/pgSQL does around BeginInternalSubTransaction.
    let (context, owner) = unsafe { (pg_sys::CurrentMemoryContext, pg_sys::CurrentResourceOwner) };
    // SAFETY: starts a subtransaction of the transaction in progress.
    unsafe {
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(context);
    }
    let restore = move || {
        // SAFETY: the caller's context and owner, saved above, outlive the subtransaction.
        unsafe {
            pg_sys::MemoryContextSwitchTo(context);
            pg_sys::CurrentResourceOwner = owner;
        }
    };
    PgTryBuilder::new(move || {
        let result = body();
        // SAFETY: commits the subtransaction started above, which is the current one.
        unsafe { pg_sys::ReleaseCurrentSubTransaction() };
        restore();
        Ok(result)
    })
    .catch_others(move |e| {
        let error = PageError::from_report(&report_of(e));
        // SAFETY: the error was copied out (above); the subtransaction is the current one and
        // is aborted and released, as PL/pgSQL does after an exception.
        unsafe {
            pg_sys::MemoryContextSwitchTo(context);
            pg_sys::FlushErrorState();
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
        }
        restore();
        Err(error)
    })
    .execute()
}

/// A transaction of the worker's own, not a page's (loading its backfill, opening a table,
/// finishing), retried as a page is when it fails for a transient reason: a deadlock with
/// `ALTER EXTENSION pg_backfill UPDATE`, which locks the state tables, is one.
pub fn in_transaction_retried<R>(mut body: impl FnMut() -> R) -> Result<R, PageError> {
    let mut failures = 0;
    loop {
        match in_transaction(std::panic::AssertUnwindSafe(&mut body)) {
            Err(e) if e.is_transient() && failures < crate::pg::settings::max_retries() => {
                failures += 1;
                crate::throttle::pacing::sleep(std::time::Duration::from_millis(50 << failures.min(5)));
            }
            done => return done,
        }
    }
}

/// How a worker names its backfill in log lines: `pg_backfill 7 in database "shop"` (a server
/// runs backfills of several databases, and ids are per database).
pub fn who(backfill_id: i64) -> String {
    thread_local! {
        static DATABASE: String = {
            // SAFETY: the worker is connected to its database; the name is copied out at once.
            let name = unsafe { pg_sys::get_database_name(pg_sys::MyDatabaseId) };
            if name.is_null() {
                String::new()
            } else {
                // SAFETY: a NUL-terminated name, just returned by get_database_name.
                unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned()
            }
        };
    }
    DATABASE.with(|database| format!("pg_backfill {backfill_id} in database \"{database}\""))
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use super::*;

    fn error(code: PgSqlErrorCode) -> PageError {
        PageError::new(code, String::new(), None)
    }

    #[pg_test]
    fn only_lock_deadlock_serialization_and_timeout_failures_are_retried() {
        for code in [
            ERRCODE_LOCK_NOT_AVAILABLE,
            ERRCODE_T_R_DEADLOCK_DETECTED,
            ERRCODE_T_R_SERIALIZATION_FAILURE,
            ERRCODE_QUERY_CANCELED,
        ] {
            assert!(error(code).is_transient(), "{code:?}");
        }
        for code in [ERRCODE_UNDEFINED_TABLE, ERRCODE_INSUFFICIENT_PRIVILEGE, ERRCODE_PROGRAM_LIMIT_EXCEEDED] {
            assert!(!error(code).is_transient(), "{code:?}");
        }
        assert_eq!(error(ERRCODE_T_R_DEADLOCK_DETECTED).sqlstate, "40P01");
    }
}
