//! The SQL functions that control a running backfill: pause, resume, change, wait, cancel.
//! Their public signatures are declared in `sql/api.sql`. Each acts on the backfill here, then
//! passes the verb on to the worker nodes' backfills of a Citus distributed one (none for a
//! backfill of this server's tables: citus/control.rs).

use crate::catalog::job;
use crate::citus::control::{NodeBackfills, Verb};
use crate::model::request::{SetRequest, SourceOptions};
use crate::model::state::JobState::{self, *};
use crate::pg::args::{deadline_after, require_primary, required};
use crate::pg::errors::raise;
use crate::pg::privilege::{self, as_extension_owner};
use crate::start::options::check_changes;
use crate::worker::launcher;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;

/// backfill_cancel(): stops a running or paused backfill at its next page, or ends a failed one
/// for good (one that cannot be resumed: its slot dropped, its table changed). What it delivered
/// stays delivered; its state becomes cancelled. A distributed backfill that failed (on one of
/// its nodes, which paused the others: citus/follower.rs) has its nodes' backfills still running
/// or paused cancelled too.
#[pg_extern(schema = "backfill", name = "cancel")]
fn cancel(id: Option<i64>) -> bool {
    require_primary("cancel a backfill");
    let id = required(id, "backfill_cancel", "id");
    control(id, "cancel", &[Running, Paused, Failed], Some(Cancelled), None);
    NodeBackfills::of(id).forward(&Verb::Cancel);
    // Its slot is free: a table a follow of the slot queued starts once the cancel commits.
    crate::follow::dispatch::dispatch_when_committed();
    true
}

/// backfill_pause(): the worker stops at its next page and exits; nothing is held meanwhile.
#[pg_extern(schema = "backfill", name = "pause")]
fn pause(id: Option<i64>) -> bool {
    require_primary("pause a backfill");
    let id = required(id, "backfill_pause", "id");
    control(id, "pause", &[Running], Some(Paused), Some(job::PAUSED_BY_USER));
    NodeBackfills::of(id).forward(&Verb::Pause);
    true
}

/// backfill_resume(): a paused or failed backfill continues from its cursor with a new worker;
/// so does a running one whose worker was lost to a server restart without preloading.
#[pg_extern(schema = "backfill", name = "resume")]
fn resume(id: Option<i64>) -> bool {
    require_primary("resume a backfill");
    let id = required(id, "backfill_resume", "id");
    let lost = as_extension_owner(|| job::worker_lost_to_restart(id));
    let from: &[JobState] = if lost { &[Paused, Failed, Running] } else { &[Paused, Failed] };
    let job = control(id, "resume", from, Some(Running), None);
    let nodes = NodeBackfills::of(id);
    if nodes.is_empty() {
        // (A distributed backfill's slots are its nodes': each node's backfill checks its own. A
        // refusal's error undoes the move to running above.)
        require_slot_to_resume(id, job.slot_name.as_deref());
        if let (Paused | Failed, Some(slot), Some(recorded)) = (job.state, &job.slot_name, &job.slot_identity) {
            crate::throttle::pipeline::require_watched_slot(id, slot, recorded);
        }
    }
    launcher::require_worker_slots(job.parallel);
    for worker in 0..job.parallel {
        launcher::launch_in_this_transaction(id, worker);
    }
    nodes.forward(&Verb::Resume);
    true
}

/// A backfill for a slot that is gone can never deliver again: resuming it would only fail
/// again. Refused, with the way to end it.
fn require_slot_to_resume(id: i64, slot: Option<&str>) {
    let Some(slot) = slot else { return };
    if as_extension_owner(|| crate::throttle::pipeline::slot_exists(slot)) {
        return;
    }
    raise(
        ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("cannot resume backfill {id}: its replication slot \"{slot}\" does not exist"),
        format!(
            "Backfill {id} delivers into slot \"{slot}\", which was dropped: its consumer can receive nothing more \
             from it."
        ),
        Some(format!(
            "SELECT backfill_cancel({id}); ends it. To deliver the rest, start a new backfill for the consumer's \
             new slot."
        )),
    );
}

/// backfill_purge(): deletes the backfills that ended (done or cancelled) more than `older_than`
/// ago, among those the caller may control (see [`require_controller`]: every one, for a
/// superuser), with their rows in every table of pg_backfill; returns how many. A failed backfill
/// stays until it is resumed or cancelled. On a Citus coordinator, a distributed backfill's rows
/// here go; its nodes' backfills are each node's own, purged there.
#[pg_extern(schema = "backfill", name = "purge")]
fn purge(older_than: Option<pgrx::datum::Interval>) -> i64 {
    require_primary("purge backfills");
    let older_than = required(older_than, "backfill_purge", "older_than");
    if crate::pg::args::is_negative(older_than) {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            "older_than of backfill_purge must not be negative",
            "backfill_purge deletes the backfills that ended more than older_than ago.",
            Some("Pass an age such as interval '30 days', or interval '0' for every ended backfill.".into()),
        );
    }
    let ended = as_extension_owner(|| job::ended_before(older_than));
    let superuser = privilege::is_superuser();
    let purged: Vec<i64> = ended
        .into_iter()
        .filter(|(_, started_by)| superuser || privilege::caller_may_act_as(started_by))
        .map(|(id, _)| id)
        .collect();
    as_extension_owner(|| job::delete_jobs(&purged))
}

/// backfill_set() since 0.10.0: changes the pacing and the limits on the source of a backfill
/// while it runs; the worker applies them at its next page. NULL keeps a value; 0 removes a
/// limit; a limit on the source of -1 follows the setting again.
#[pg_extern(schema = "backfill", name = "set")]
fn set_every_option(
    id: Option<i64>,
    batch_size: Option<i32>,
    rows_per_second: Option<i32>,
    max_lag: Option<i64>,
    max_replica_lag: Option<i64>,
    max_retained_wal: Option<i64>,
    max_active_sessions: Option<i32>,
) -> bool {
    let source = SourceOptions::of_arguments(max_replica_lag, max_retained_wal, max_active_sessions);
    change(id, SetRequest { batch_size, rows_per_second, max_lag, source })
}

/// backfill_set()'s request: checked whole, then written in one transaction's updates.
pub fn change(id: Option<i64>, changes: SetRequest) -> bool {
    require_primary("change a backfill");
    let id = required(id, "backfill_set", "id");
    check_changes(&changes);
    let job = control(id, "change", &[Running, Paused], None, None);
    if changes.max_lag.is_some_and(|lag| lag > 0) && job.slot_name.is_none() {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            "max_lag needs a slot",
            format!("Backfill {id} was started without a slot, so no consumer lag limits it."),
            Some("Pace it with rows_per_second or max_active_sessions instead; max_lag applies to a backfill started with slot => ...".into()),
        );
    }
    as_extension_owner(|| {
        job::set_pacing(id, changes.batch_size, changes.rows_per_second, changes.max_lag);
        if !changes.source.is_empty() {
            job::set_source_limits(id, &changes.source);
        }
    });
    launcher::wake_workers_at_commit(id);
    NodeBackfills::of(id).forward(&Verb::Set {
        batch_size: changes.batch_size,
        rows_per_second: changes.rows_per_second,
        max_lag: changes.max_lag,
    });
    true
}

/// backfill_wait(): blocks until the backfill is done and, with a slot, delivered (true), or
/// until the timeout passes (false). A backfill that fails or is cancelled is an error, so that
/// a migration script stops there.
#[pg_extern(schema = "backfill", name = "wait")]
fn wait(id: Option<i64>, timeout_ms: Option<f64>) -> bool {
    let id = required(id, "backfill_wait", "id");
    let deadline = deadline_after(timeout_ms);
    require_controller(id, "wait for");
    if as_extension_owner(|| job::recorded_in_this_transaction(id)) {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("backfill {id} cannot start before this transaction commits"),
            "Its worker waits for the transaction that started or resumed it; waiting for the \
             worker in that same transaction would never end.",
            Some("Commit first, then wait: in psql, SELECT backfill_start(...) \\gset then SELECT backfill_wait(:backfill_start);".into()),
        );
    }
    let report_every = crate::pg::settings::wait_report_interval();
    let mut next_report = report_every.map(|every| std::time::Instant::now() + every);
    loop {
        let (state, delivered, error) = as_extension_owner(|| job::outcome(id));
        match state {
            Done if delivered => return true,
            Failed | Cancelled => raise(
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("backfill {id} {state}"),
                error
                    .map(|e| format!("Backfill {id} {state}: {e}"))
                    .unwrap_or_else(|| format!("Backfill {id} was {state}.")),
                Some(if state == Failed {
                    format!("Fix the cause, then SELECT backfill_resume({id}); continues from its cursor.")
                } else {
                    "Start a new backfill to deliver the rest.".into()
                }),
            ),
            _ => {}
        }
        if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            return false;
        }
        if let (Some(at), Some(every)) = (next_report, report_every) {
            if std::time::Instant::now() >= at {
                report_progress(id);
                next_report = Some(at + every);
            }
        }
        crate::throttle::pacing::sleep(std::time::Duration::from_millis(100));
    }
}

/// backfill_wait()'s NOTICE: the backfill's progress as backfill_status shows it to the caller.
fn report_progress(id: i64) {
    if let Some(line) = job::progress_line(id) {
        notice!("{line}");
    }
}

/// Checks that backfill `id` exists, is in one of the states `from`, and that the caller may
/// control it (see [`require_controller`]); then moves it to `to`, if any. Returns the
/// backfill as it was.
fn control(id: i64, verb: &str, from: &[JobState], to: Option<JobState>, pause_reason: Option<&str>) -> job::Job {
    let job = require_controller(id, verb);
    let not_in_state = |state: &str| -> ! {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("cannot {verb} backfill {id}"),
            format!(
                "Backfill {id} is {state}; only a {} backfill can be {}.",
                from.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" or "),
                past_participle(verb)
            ),
            Some(match JobState::parse(state) {
                _ if state == "changing state concurrently" => {
                    "Try again: another session changed it at the same moment.".into()
                }
                Done | Cancelled => "It has ended: start a new backfill to deliver more; \
                                     SELECT backfill_purge(interval '30 days'); removes ended backfills."
                    .into(),
                Running => {
                    format!("SELECT state, waiting_for FROM backfill_status WHERE id = {id}; shows what it does now.")
                }
                Paused => format!("SELECT backfill_resume({id}); continues it."),
                Failed => format!(
                    "SELECT last_error FROM backfill_status WHERE id = {id}; says why it failed: fix that and \
                     SELECT backfill_resume({id});, or SELECT backfill_cancel({id}); ends it."
                ),
            }),
        )
    };
    if !from.contains(&job.state) {
        not_in_state(job.state.as_str());
    }
    let Some(to) = to else { return job };
    if !as_extension_owner(|| job::move_job(id, from, to, pause_reason, None)) {
        not_in_state("changing state concurrently");
    }
    launcher::wake_workers_at_commit(id);
    job
}

/// Backfill `id`, which the caller may `verb`: the role that started it, a member of that role,
/// or a superuser (the only one left once that role is dropped).
fn require_controller(id: i64, verb: &str) -> job::Job {
    let job = as_extension_owner(|| job::job(id)).unwrap_or_else(|| {
        raise(
            ERRCODE_UNDEFINED_OBJECT,
            format!("backfill {id} does not exist"),
            format!("No backfill has id {id}."),
            Some("SELECT id, state FROM backfill_status; lists the backfills.".into()),
        )
    });
    let allowed = privilege::is_superuser() || privilege::caller_may_act_as(&job.started_by);
    if !allowed {
        raise(
            ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("permission denied to {verb} backfill {id}"),
            format!("Backfill {id} was started by role {}.", job.started_by),
            Some(format!("Do it as {} (or a member of that role) or as a superuser.", job.started_by)),
        );
    }
    job
}

fn past_participle(verb: &str) -> String {
    match verb {
        "cancel" => "cancelled".into(),
        "change" => "changed".into(),
        _ => format!("{verb}d"),
    }
}
