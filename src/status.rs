//! Helpers of the monitoring views that must work for every role (the views themselves are in
//! `sql/api.sql`).

use crate::privilege;
use pgrx::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set in the postmaster when the library is preloaded; backends inherit it.
pub static PRELOADED: AtomicBool = AtomicBool::new(false);

/// Whether pg_backfill is in shared_preload_libraries, so that running backfills resume after a
/// server restart. (Reading that setting needs pg_read_all_settings; this does not.)
#[pg_extern(schema = "backfill", stable)]
fn auto_resume() -> bool {
    PRELOADED.load(Ordering::Relaxed)
}

/// The workers of backfill $1 of this database, in pg_stat_activity (alias a).
pub const WORKERS_OF_BACKFILL: &str = "a.backend_type OPERATOR(pg_catalog.=) 'pg_backfill'
    AND a.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
    AND pg_catalog.split_part(a.application_name, '/', 1) OPERATOR(pg_catalog.=) ('pg_backfill ' OPERATOR(pg_catalog.||) $1)";

/// Background workers of a backfill of this database running now. pg_stat_activity hides
/// other roles' application names, so they are counted as the extension's owner.
#[pg_extern(schema = "backfill", stable)]
fn workers_running(backfill_id: i64) -> i32 {
    privilege::as_extension_owner(|| {
        crate::sql::select_one::<i32>(
            &format!("SELECT count(*)::int FROM pg_catalog.pg_stat_activity a WHERE {WORKERS_OF_BACKFILL}"),
            &[backfill_id.into()],
        )
    })
    .ok()
    .flatten()
    .unwrap_or(0)
}

/// What the workers of a backfill wait for now: a row lock another process holds (a one-row
/// page waits up to backfill.lock_timeout for it, then retries), or nothing (NULL).
#[pg_extern(schema = "backfill", stable)]
fn waiting_for(backfill_id: i64) -> Option<String> {
    privilege::as_extension_owner(|| {
        crate::sql::select_one::<String>(
            &format!(
                "SELECT 'a row lock held by pid ' OPERATOR(pg_catalog.||) pg_catalog.string_agg(DISTINCT b::text, ', ')
                   FROM pg_catalog.pg_stat_activity a, pg_catalog.unnest(pg_catalog.pg_blocking_pids(a.pid)) b
                  WHERE {WORKERS_OF_BACKFILL}"
            ),
            &[backfill_id.into()],
        )
    })
    .ok()
    .flatten()
}
