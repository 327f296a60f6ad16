//! The one way a backfill is recorded and its workers launched, for a backfill of local tables
//! (`start/plan.rs`) and of a Citus distributed table (`citus/coordinator.rs`) alike: starts are
//! serialized, a table or slot already being backfilled refuses a second, confirm => true is
//! required, worker slots are checked, and the backfill is written (its row in one INSERT, then
//! its tables) and launched at commit. Every check of the request came before.

use crate::catalog::job::{self, NewJob};
use crate::pg::errors::raise;
use crate::pg::privilege::as_extension_owner;
use crate::worker::launcher;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;

/// A checked request, ready to be recorded.
pub struct Admission<'a> {
    pub job: NewJob<'a>,
    /// The tables it reads, by name: none may have a running backfill.
    pub tables: Vec<(pg_sys::Oid, String)>,
    pub confirm: bool,
    /// Without confirm => true: the error's detail (what it would deliver) and hint.
    pub unconfirmed: Box<dyn FnOnce() -> (String, String) + 'a>,
}

/// Records the backfill `admission` describes and launches its workers; `record_tables` writes
/// its tables (and anything started elsewhere) once its id exists. Returns the id.
pub fn admit(admission: Admission, record_tables: impl FnOnce(i64)) -> i64 {
    // Two starts of the same table must not both pass the checks below: serialize them.
    crate::pg::locks::lock_backfill_starts();
    refuse_busy(admission.job.slot_name, &admission.tables);
    if !admission.confirm {
        let (detail, hint) = (admission.unconfirmed)();
        raise(ERRCODE_INVALID_PARAMETER_VALUE, "backfill not started: confirm => true is required", detail, Some(hint));
    }
    launcher::require_worker_slots(admission.job.parallel);
    let backfill_id = as_extension_owner(|| job::insert_job(&admission.job));
    record_tables(backfill_id);
    for worker in 0..admission.job.parallel {
        launcher::launch_in_this_transaction(backfill_id, worker);
    }
    backfill_id
}

/// A slot takes one backfill at a time, and so does a table.
fn refuse_busy(slot: Option<&str>, tables: &[(pg_sys::Oid, String)]) {
    if let Some((slot, running)) =
        slot.and_then(|slot| Some((slot, as_extension_owner(|| job::running_backfill_of_slot(slot))?)))
    {
        raise(
            ERRCODE_OBJECT_IN_USE,
            format!("slot {slot} already has a running backfill"),
            format!("Backfill {running} is delivering through it; a slot takes one backfill at a time."),
            Some(format!("Wait for it to finish, or cancel it: SELECT backfill_cancel({running});")),
        );
    }
    for (relid, name) in tables {
        if let Some(running) = as_extension_owner(|| job::running_backfill_of(*relid)) {
            raise(
                ERRCODE_OBJECT_IN_USE,
                format!("table {name} already has a running backfill"),
                format!("Backfill {running} is scanning it."),
                Some(format!("Wait for it to finish, or cancel it: SELECT backfill_cancel({running});")),
            );
        }
    }
}
