//! Helpers of the monitoring views that must work for every role (the views themselves are in
//! `sql/api.sql`).

use crate::pg::compat;
use crate::pg::encoding::Text;
use crate::pg::errors::raise;
use crate::pg::privilege;
use crate::worker::activity::{self, WAITING_FOR_OF_ACTIVITY, WAITING_KIND_OF_ACTIVITY};
use crate::worker::shared_progress;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set in the postmaster when the library is preloaded; backends inherit it.
pub static PRELOADED: AtomicBool = AtomicBool::new(false);

/// Whether pg_backfill is in shared_preload_libraries, so that running backfills resume after a
/// server restart. (Reading that setting needs pg_read_all_settings; this does not.)
#[pg_extern(schema = "backfill", stable)]
fn auto_resume() -> bool {
    PRELOADED.load(Ordering::Relaxed)
}

/// The current user's name, read before the switch to the extension's owner.
fn caller() -> String {
    // SAFETY: the name of the current user, who exists (noerr false would raise otherwise);
    // the string is palloc'd and copied at once.
    unsafe { std::ffi::CStr::from_ptr(pg_sys::GetUserNameFromId(pg_sys::GetUserId(), false)) }
        .to_string_lossy()
        .into_owned()
}

/// Background workers of a backfill of this database running now, as the caller sees them.
#[pg_extern(schema = "backfill", stable)]
fn workers_running(backfill_id: i64) -> i32 {
    activity::workers_running(backfill_id, caller())
}

/// What the workers of a running backfill wait for now: a row lock another process holds (a
/// one-row page waits up to backfill.lock_timeout for it, then retries), the slot's consumer
/// (away, or lagging past max_lag), the source (a standby, a slot's WAL, its load: the workers
/// say so in pg_stat_activity), or nothing (NULL).
#[pg_extern(schema = "backfill", stable)]
fn waiting_for(backfill_id: i64) -> Option<Text> {
    let row_lock =
        "'a row lock held by pid ' OPERATOR(pg_catalog.||) pg_catalog.string_agg(DISTINCT b::pg_catalog.text, ', ')";
    activity::waits_of_backfill(backfill_id, row_lock, WAITING_FOR_OF_ACTIVITY, caller())
}

/// The kind of what the workers of a running backfill wait for now, for monitoring and tests:
/// row_lock, consumer_away, consumer_lag, replica_lag, retained_wal or load; NULL for none.
#[pg_extern(schema = "backfill", stable)]
fn waiting_kind(backfill_id: i64) -> Option<Text> {
    activity::waits_of_backfill(backfill_id, "'row_lock'", WAITING_KIND_OF_ACTIVITY, caller())
}

/// backfill_progress: every running backfill worker of the cluster, from shared memory
/// (worker/shared_progress.rs), as the caller may see them. As backfill_status decides: a
/// superuser or a member of pg_monitor sees every worker; any other role the workers of the
/// backfills started by a role it may act as, in the databases it may CONNECT to. (Checked
/// here, not in the view: the function is executable by all.)
#[pg_extern(schema = "backfill", volatile)]
#[allow(clippy::type_complexity)]
fn progress() -> TableIterator<
    'static,
    (
        name!(pid, i32),
        name!(datid, pg_sys::Oid),
        name!(backfill_id, i64),
        name!(worker, i32),
        name!(relid, Option<pg_sys::Oid>),
        name!(position, Option<i32>),
        name!(phase, &'static str),
        name!(rows_total, i64),
        name!(rows_done, i64),
        name!(bytes_done, i64),
        name!(pages_done, i64),
        name!(started_by, Option<String>),
        name!(started_at, Option<TimestampWithTimeZone>),
        name!(phase_since, Option<TimestampWithTimeZone>),
    ),
> {
    let Some(workers) = shared_progress::snapshot() else {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "backfill_progress needs pg_backfill in shared_preload_libraries",
            "It reads each running worker's progress from shared memory, which only a preloaded library sets up. \
             backfill_status and backfill_tables show this database's backfills without it.",
            Some("Add pg_backfill to shared_preload_libraries and restart the server.".into()),
        )
    };
    // SAFETY: the current user's id, and whether it is a superuser.
    let (caller, superuser) = unsafe { (pg_sys::GetUserId(), pg_sys::superuser()) };
    let sees_all = superuser || compat::may_act_as(caller, pg_sys::Oid::from(pg_sys::ROLE_PG_MONITOR));
    let visible: Vec<_> = workers
        .into_iter()
        .filter(|w| sees_all || (compat::may_act_as(caller, w.role) && privilege::may_connect(w.database)))
        .map(|w| {
            let ran = w.relid != pg_sys::InvalidOid;
            (
                w.pid,
                w.database,
                w.backfill_id,
                w.worker,
                ran.then_some(w.relid),
                ran.then_some(w.position),
                w.phase.name(),
                w.rows_total,
                w.rows_done,
                w.bytes_done,
                w.pages_done,
                role_name(w.role),
                TimestampWithTimeZone::try_from(w.started_at).ok(),
                TimestampWithTimeZone::try_from(w.phase_since).ok(),
            )
        })
        .collect();
    TableIterator::new(visible)
}

/// A role's name; None for one dropped since.
fn role_name(role: pg_sys::Oid) -> Option<String> {
    // SAFETY: a catalog lookup; with noerr true it returns null for a missing role, and the
    // palloc'd name is copied at once.
    let name = unsafe { pg_sys::GetUserNameFromId(role, true) };
    // SAFETY: a NUL-terminated string when not null.
    (!name.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned())
}
