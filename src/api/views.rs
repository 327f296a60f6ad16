//! Helpers of the monitoring views that must work for every role (the views themselves are in
//! `sql/api.sql`).

use crate::pg::encoding::Text;
use crate::pg::privilege;
use crate::worker::activity::{WAITING_FOR_OF_ACTIVITY, WAITING_KIND_OF_ACTIVITY, WORKERS_OF_BACKFILL};
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

/// Whether the caller (named $2) sees backfill $1 (as the views decide, see backfill.visible):
/// the helpers below run as the extension's owner, and answer only about such a backfill.
const VISIBLE_TO_CALLER: &str = "(backfill.may_act_as($2, 'pg_monitor')
    OR EXISTS (SELECT FROM backfill.job j WHERE j.id OPERATOR(pg_catalog.=) $1 AND backfill.may_act_as($2, j.started_by)))";

/// The current user's name, read before the switch to the extension's owner.
fn caller() -> String {
    // SAFETY: the name of the current user, who exists (noerr false would raise otherwise);
    // the string is palloc'd and copied at once.
    unsafe { std::ffi::CStr::from_ptr(pg_sys::GetUserNameFromId(pg_sys::GetUserId(), false)) }
        .to_string_lossy()
        .into_owned()
}

/// Background workers of a backfill of this database running now. pg_stat_activity hides
/// other roles' application names, so they are counted as the extension's owner.
#[pg_extern(schema = "backfill", stable)]
fn workers_running(backfill_id: i64) -> i32 {
    let caller = caller();
    privilege::as_extension_owner(|| {
        crate::pg::spi::select_one::<i32>(
            &format!(
                "SELECT pg_catalog.count(*)::int FROM pg_catalog.pg_stat_activity a
                  WHERE {WORKERS_OF_BACKFILL} AND {VISIBLE_TO_CALLER}"
            ),
            &[backfill_id.into(), caller.into()],
        )
    })
    .ok()
    .flatten()
    .unwrap_or(0)
}

/// What the workers of a running backfill wait for now: a row lock another process holds (a
/// one-row page waits up to backfill.lock_timeout for it, then retries), the slot's consumer
/// (away, or lagging past max_lag), the source (a standby, a slot's WAL, its load: the workers
/// say so in pg_stat_activity), or nothing (NULL).
#[pg_extern(schema = "backfill", stable)]
fn waiting_for(backfill_id: i64) -> Option<Text> {
    let row_lock =
        "'a row lock held by pid ' OPERATOR(pg_catalog.||) pg_catalog.string_agg(DISTINCT b::pg_catalog.text, ', ')";
    waiting(backfill_id, row_lock, WAITING_FOR_OF_ACTIVITY)
}

/// The kind of what the workers of a running backfill wait for now, for monitoring and tests:
/// row_lock, consumer_away, consumer_lag, replica_lag, retained_wal or load; NULL for none.
#[pg_extern(schema = "backfill", stable)]
fn waiting_kind(backfill_id: i64) -> Option<Text> {
    waiting(backfill_id, "'row_lock'", WAITING_KIND_OF_ACTIVITY)
}

/// A backfill's row-lock waits (`row_lock`, over the blocking pids `b`) or else what its workers
/// report (`reported`, over their pg_stat_activity rows `a`), several joined by '; '.
fn waiting(backfill_id: i64, row_lock: &str, reported: &str) -> Option<Text> {
    let caller = caller();
    privilege::as_extension_owner(|| {
        crate::pg::spi::select_one::<Text>(
            &format!(
                "SELECT coalesce(
                    (SELECT {row_lock}
                       FROM pg_catalog.pg_stat_activity a, pg_catalog.unnest(pg_catalog.pg_blocking_pids(a.pid)) b
                      WHERE {WORKERS_OF_BACKFILL} AND {VISIBLE_TO_CALLER}
                     HAVING pg_catalog.count(*) OPERATOR(pg_catalog.>) 0),
                    (SELECT pg_catalog.string_agg(DISTINCT {reported}, '; ')
                       FROM pg_catalog.pg_stat_activity a
                      WHERE {WORKERS_OF_BACKFILL} AND {VISIBLE_TO_CALLER}))"
            ),
            &[backfill_id.into(), caller.into()],
        )
    })
    .ok()
    .flatten()
}
