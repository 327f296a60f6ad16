//! The one protocol by which a backfill's processes show themselves in pg_stat_activity, and
//! by which the views and the launcher find them: their application_name, and what a waiting
//! worker reports as its activity. Everything that writes or reads either is here.

use crate::model::table::Table;
use crate::pg::encoding::{show_key, KeyText, Text};
use crate::throttle::wait::WaitReason;
use pgrx::pg_sys;
use std::ffi::CString;

/// The application_name of the worker that relaunches a database's backfills after a restart.
pub const RESUMER_NAME: &str = "pg_backfill resume";

/// The application_name of the worker that starts the backfills the follows of a database have
/// queued, launched when a transaction that queued one commits.
pub const DISPATCHER_NAME: &str = "pg_backfill dispatch";

/// The application_name a backfill's worker shows from the moment its process is visible
/// until it is admitted (then it shows [`worker_name`]).
pub fn starting_name(backfill_id: i64, worker: i32) -> String {
    worker_name(backfill_id, worker).replacen("pg_backfill ", "pg_backfill starting ", 1)
}

/// application_name patterns (regular expressions) of every backfill worker, in every database:
/// admitted (`pg_backfill 7`), and with those launched and not yet admitted
/// (`pg_backfill starting 7`). The resumer is neither.
pub const ANY_WORKER_NAME: &str = "^pg_backfill (starting )?[0-9]";
pub const ADMITTED_WORKER_NAME: &str = "^pg_backfill [0-9]";

/// The workers of backfill $1 of this database, in pg_stat_activity (alias a).
pub const WORKERS_OF_BACKFILL: &str = "a.backend_type OPERATOR(pg_catalog.=) 'pg_backfill'
    AND a.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
    AND pg_catalog.split_part(a.application_name, '/', 1) OPERATOR(pg_catalog.=) ('pg_backfill ' OPERATOR(pg_catalog.||) $1)";

/// `pg_backfill 7` for a backfill's first worker, `pg_backfill 7/1` for its second: the
/// application_name it shows in pg_stat_activity.
pub fn worker_name(backfill_id: i64, worker: i32) -> String {
    if worker == 0 {
        format!("pg_backfill {backfill_id}")
    } else {
        format!("pg_backfill {backfill_id}/{worker}")
    }
}

/// What a worker held back by `reason` reports as its activity: `waiting for [kind] prose`.
pub fn waiting(reason: &WaitReason) -> String {
    format!("{WAITING_FOR}[{}] {reason}", reason.kind())
}

const WAITING_FOR: &str = "waiting for ";

/// The kind a waiting worker's activity (`a.query`) reports, NULL for one that does not wait.
pub const WAITING_KIND_OF_ACTIVITY: &str = "pg_catalog.substring(a.query, '^waiting for \\[([a-z_]+)\\] ')";

/// The prose a waiting worker's activity reports, NULL for one that does not wait.
pub const WAITING_FOR_OF_ACTIVITY: &str = "pg_catalog.substring(a.query, '^waiting for \\[[a-z_]+\\] (.*)$')";

/// What a worker scanning reports as its activity: `backfill 7: public.orders after key (42)`.
pub fn scanning(backfill_id: i64, table: &Table, cursor: Option<&[KeyText]>) -> String {
    format!(
        "backfill {backfill_id}: {} after key ({})",
        table.qualified_name(),
        cursor.map(show_key).unwrap_or_default()
    )
}

/// Reports `what` as this process's activity in pg_stat_activity.
pub fn report(what: &str) {
    // pg_stat_activity shows it to clients in the database's encoding.
    if let Ok(what) = CString::new(crate::pg::encoding::to_server(what).into_owned()) {
        // SAFETY: copies the string into this backend's status entry.
        unsafe { pg_sys::pgstat_report_activity(pg_sys::BackendState::STATE_RUNNING, what.as_ptr()) };
    }
}

/// Drops this backend's copy of pg_stat_activity, so that the next read of it sees the processes
/// as they are now. PostgreSQL copies the table at a transaction's first read and keeps the copy
/// until the transaction ends: in a transaction that had read pg_stat_activity before, a count
/// of the backfill workers would be of the workers of then. (A later read of the caller's in the
/// same transaction then sees a newer copy too, as after pg_stat_clear_snapshot().)
pub fn read_activity_afresh() {
    // SAFETY: frees this backend's local copy of the status table; the next read makes a new one.
    unsafe { pg_sys::pgstat_clear_backend_activity_snapshot() };
}

/// Whether the caller (named $2) sees backfill $1 (as the views decide, see backfill.visible):
/// the helpers below run as the extension's owner, and answer only about such a backfill.
const VISIBLE_TO_CALLER: &str = "(backfill.may_act_as($2, 'pg_monitor')
    OR EXISTS (SELECT FROM backfill.job j WHERE j.id OPERATOR(pg_catalog.=) $1 AND backfill.may_act_as($2, j.started_by)))";

/// Background workers of a backfill of this database running now, counted for `caller` (who
/// sees only the backfills it may, see [`VISIBLE_TO_CALLER`]). pg_stat_activity hides other
/// roles' application names, so they are counted as the extension's owner.
pub fn workers_running(backfill_id: i64, caller: String) -> i32 {
    crate::pg::privilege::as_extension_owner(|| {
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

/// A backfill's row-lock waits (`row_lock`, over the blocking pids `b`) or else what its workers
/// report (`reported`, over their pg_stat_activity rows `a`), several joined by '; '; for
/// `caller`, who sees only the backfills it may ([`VISIBLE_TO_CALLER`]).
pub fn waits_of_backfill(backfill_id: i64, row_lock: &str, reported: &str, caller: String) -> Option<Text> {
    crate::pg::privilege::as_extension_owner(|| {
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
