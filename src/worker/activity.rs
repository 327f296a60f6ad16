//! The one protocol by which a backfill's processes show themselves in pg_stat_activity, and
//! by which the views and the launcher find them: their application_name, and what a waiting
//! worker reports as its activity. Everything that writes or reads either is here.

use crate::model::table::Table;
use crate::pg::encoding::{show_key, KeyText};
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
