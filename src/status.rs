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

/// Background workers of a backfill of this database running now. pg_stat_activity hides
/// other roles' application names, so they are counted as the extension's owner.
#[pg_extern(schema = "backfill", stable)]
fn workers_running(backfill_id: i64) -> i32 {
    privilege::as_extension_owner(|| {
        Spi::get_one_with_args::<i32>(
            "SELECT count(*)::int FROM pg_catalog.pg_stat_activity
              WHERE backend_type OPERATOR(pg_catalog.=) 'pg_backfill'
                AND datid OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
                                                   WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
                AND pg_catalog.split_part(application_name, '/', 1) OPERATOR(pg_catalog.=) ('pg_backfill ' OPERATOR(pg_catalog.||) $1)",
            &[backfill_id.into()],
        )
    })
    .ok()
    .flatten()
    .unwrap_or(0)
}
