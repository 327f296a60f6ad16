//! The SQL functions. Their public signatures (regclass arguments, named defaults) are
//! declared in `sql/api.sql`, which calls these entry points in schema `backfill`.

use crate::catalog::{self, CANCELLED, FAILED, PAUSED, RUNNING};
use crate::errors::raise;
use crate::plan::{self, Estimate};
use crate::privilege::{self, as_extension_owner};
use crate::table::{self, Table};
use crate::{launcher, pipeline, settings};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;

const MAX_BATCH_SIZE: i32 = 100_000;
const MAX_PARALLEL: i32 = 16;

type EstimateRow = (pg_sys::Oid, bool, Option<String>, Option<Vec<String>>, Option<i64>, Option<i64>, Option<i64>);

/// backfill_estimate(): what a backfill of each table would deliver, or why it cannot run.
// The row type must be spelled out here for pgrx to name the result columns.
#[allow(clippy::type_complexity)]
#[pg_extern(schema = "backfill", name = "estimate")]
fn estimate(
    tables: Option<Vec<Option<pg_sys::Oid>>>,
    batch_size: i32,
) -> TableIterator<
    'static,
    (
        name!(table_name, pg_sys::Oid),
        name!(eligible, bool),
        name!(reason, Option<String>),
        name!(key_columns, Option<Vec<String>>),
        name!(rows_estimated, Option<i64>),
        name!(bytes_estimated, Option<i64>),
        name!(pages, Option<i64>),
    ),
> {
    check_batch_size(batch_size);
    let prefix_len = settings::message_prefix().len();
    let rows: Vec<EstimateRow> = table_list(tables)
        .into_iter()
        .map(|relid| match table::inspect(relid) {
            Ok(table) => {
                let estimate = plan::estimate(&table, prefix_len);
                let pages = plan::pages(estimate.rows, batch_size);
                (relid, true, None, Some(table.key_names()), Some(estimate.rows), Some(estimate.bytes), Some(pages))
            }
            Err(why) => (relid, false, Some(why.reason), None, None, None, None),
        })
        .collect();
    TableIterator::new(rows)
}

/// backfill_start(): validates every table (all or nothing), records the backfill and
/// launches its worker. Without confirm it only reports what it would deliver.
#[pg_extern(schema = "backfill", name = "start")]
#[allow(clippy::too_many_arguments)]
fn start(
    tables: Option<Vec<Option<pg_sys::Oid>>>,
    confirm: bool,
    batch_size: i32,
    rows_per_second: Option<i32>,
    slot: Option<String>,
    publication: Option<String>,
    max_lag: Option<i64>,
    parallel: i32,
) -> i64 {
    check_batch_size(batch_size);
    if !(1..=MAX_PARALLEL).contains(&parallel) {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            format!("parallel {parallel} is out of range"),
            format!("parallel is the number of workers and must be between 1 and {MAX_PARALLEL}."),
            Some("Each worker is a background worker: mind max_worker_processes.".into()),
        );
    }
    check_rate(rows_per_second);
    require_logical_decoding();
    let prefix = settings::message_prefix();
    let relids = table_list(tables);
    let tables: Vec<Table> = relids.iter().map(|relid| table::require(*relid)).collect();
    if let Some(slot) = &slot {
        privilege::require_replication(slot);
        pipeline::require_slot(slot);
    } else if max_lag.is_some() {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            "max_lag needs a slot",
            "max_lag limits how far the slot's consumer may lag; no slot was given.",
            Some("Name the consumer's slot: slot => 'my_slot'.".into()),
        );
    }
    if let Some(lag) = max_lag.filter(|lag| *lag <= 0) {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            format!("max_lag {lag} is out of range"),
            "max_lag is in bytes and must be positive.",
            Some("Pass NULL (the default) for backfill.max_slot_lag.".into()),
        );
    }
    if let Some(publication) = &publication {
        for table in &tables {
            pipeline::require_published(publication, table);
        }
    }

    // Two starts of the same table must not both pass the check below: serialize them.
    Spi::run("SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('pg_backfill.start'))")
        .unwrap_or_else(|e| raise(ERRCODE_INTERNAL_ERROR, "could not lock", e.to_string(), None));
    if let Some(running) = slot.as_deref().and_then(|slot| {
        as_extension_owner(|| catalog::running_backfill_of_slot(slot))
            .unwrap_or_else(|e| raise(ERRCODE_INTERNAL_ERROR, "could not read backfills", e.to_string(), None))
    }) {
        raise(
            ERRCODE_OBJECT_IN_USE,
            format!("slot {} already has a running backfill", slot.as_deref().unwrap_or_default()),
            format!("Backfill {running} is delivering through it; a slot takes one backfill at a time."),
            Some(format!("Wait for it to finish, or cancel it: SELECT backfill_cancel({running});")),
        );
    }
    for table in &tables {
        if let Some(running) = as_extension_owner(|| catalog::running_backfill_of(table.relid))
            .unwrap_or_else(|e| raise(ERRCODE_INTERNAL_ERROR, "could not read backfills", e.to_string(), None))
        {
            raise(
                ERRCODE_OBJECT_IN_USE,
                format!("table {} already has a running backfill", table.qualified_name()),
                format!("Backfill {running} is scanning it."),
                Some(format!("Wait for it to finish, or cancel it: SELECT backfill_cancel({running});")),
            );
        }
    }

    let estimates: Vec<Estimate> = tables.iter().map(|t| plan::estimate(t, prefix.len())).collect();
    if !confirm {
        let rows: i64 = estimates.iter().map(|e| e.rows).sum();
        let bytes: i64 = estimates.iter().map(|e| e.bytes).sum();
        let first = table::relation_name(relids[0]);
        let example = if relids.len() == 1 { spi::quote_literal(&first) } else { "ARRAY[...]".into() };
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            "backfill not started: confirm => true is required",
            format!(
                "The backfill would deliver about {rows} rows ({}) from {} table(s) in about {} pages.",
                pretty_bytes(bytes),
                tables.len(),
                plan::pages(rows, batch_size),
            ),
            Some(format!("Review the estimate, then run: SELECT backfill_start({example}, confirm => true);")),
        );
    }

    launcher::require_worker_slots(parallel);
    let started_by = Spi::get_one::<String>("SELECT current_user::text").ok().flatten().unwrap_or_default();
    let job_id = as_extension_owner(|| {
        let job_id = catalog::insert_job(&catalog::NewJob {
            started_by: &started_by,
            batch_size,
            rows_per_second,
            message_prefix: &prefix,
            slot_name: slot.as_deref(),
            publication_name: publication.as_deref(),
            max_lag_bytes: max_lag,
            parallel,
        })?;
        let mut position = 0;
        for (table, estimate) in tables.iter().zip(&estimates) {
            for range in plan::key_ranges(table, estimate.rows, parallel) {
                position += 1;
                catalog::insert_job_table(job_id, position, table.relid, table.key_names(), range)?;
            }
        }
        Ok(job_id)
    })
    .unwrap_or_else(|e: pgrx::spi::Error| {
        raise(ERRCODE_INTERNAL_ERROR, "could not record the backfill", e.to_string(), None)
    });

    for worker in 0..parallel {
        launch_worker(job_id, worker);
    }
    job_id
}

/// backfill_cancel(): stops a running or paused backfill at its next page. What it delivered
/// stays delivered; its state becomes cancelled.
#[pg_extern(schema = "backfill", name = "cancel")]
fn cancel(id: i64) -> bool {
    control(id, "cancel", &[RUNNING, PAUSED], CANCELLED, None);
    true
}

/// backfill_pause(): the worker stops at its next page and exits; nothing is held meanwhile.
#[pg_extern(schema = "backfill", name = "pause")]
fn pause(id: i64) -> bool {
    // A backfill waiting for its slot's consumer can still be paused for good.
    let waiting = as_extension_owner(|| catalog::job(id)).ok().flatten().is_some_and(|job| job.is_waiting());
    let from: &[&str] = if waiting { &[RUNNING, PAUSED] } else { &[RUNNING] };
    control(id, "pause", from, PAUSED, Some(catalog::PAUSED_BY_USER));
    true
}

/// backfill_resume(): a paused or failed backfill continues from its cursor with a new worker;
/// so does a running one whose worker was lost to a server restart without preloading.
#[pg_extern(schema = "backfill", name = "resume")]
fn resume(id: i64) -> bool {
    let lost = as_extension_owner(|| catalog::worker_lost_to_restart(id)).unwrap_or(false);
    let from: &[&str] = if lost { &[PAUSED, FAILED, RUNNING] } else { &[PAUSED, FAILED] };
    let job = control(id, "resume", from, RUNNING, None);
    // A backfill waiting for its slot's consumer still has its workers.
    if !job.is_waiting() {
        launcher::require_worker_slots(job.parallel);
        for worker in 0..job.parallel {
            launch_worker(id, worker);
        }
    }
    true
}

/// backfill_set(): changes the pacing of a backfill while it runs; the worker applies it at its
/// next page. NULL keeps a value; 0 removes a limit.
#[pg_extern(schema = "backfill", name = "set")]
fn set(id: i64, batch_size: Option<i32>, rows_per_second: Option<i32>, max_lag: Option<i64>) -> bool {
    if let Some(batch_size) = batch_size {
        check_batch_size(batch_size);
    }
    for (name, value) in [("rows_per_second", rows_per_second.map(i64::from)), ("max_lag", max_lag)] {
        if let Some(value) = value.filter(|v| *v < 0) {
            raise(
                ERRCODE_INVALID_PARAMETER_VALUE,
                format!("{name} {value} is out of range"),
                format!("{name} must be positive, or 0 to remove the limit."),
                None,
            );
        }
    }
    let job = control(id, "change", &[RUNNING, PAUSED], "", None);
    if max_lag.is_some_and(|lag| lag > 0) && job.slot_name.is_none() {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            "max_lag needs a slot",
            format!("Backfill {id} was started without a slot, so no consumer lag limits it."),
            None,
        );
    }
    as_extension_owner(|| catalog::set_pacing(id, batch_size, rows_per_second, max_lag))
        .unwrap_or_else(|e| raise(ERRCODE_INTERNAL_ERROR, "could not change the backfill", e.to_string(), None));
    true
}

/// backfill_wait(): blocks until the backfill is done and, with a slot, delivered (true), or
/// until the timeout passes (false). A backfill that fails or is cancelled is an error, so that
/// a migration script stops there.
#[pg_extern(schema = "backfill", name = "wait")]
fn wait(id: i64, timeout_ms: Option<f64>) -> bool {
    let deadline =
        timeout_ms.map(|ms| std::time::Instant::now() + std::time::Duration::from_secs_f64(ms.max(0.0) / 1000.0));
    require_controller(id, "wait for");
    let xmin = as_extension_owner(|| catalog::recorded_by(id)).ok().flatten().unwrap_or_default();
    let started_here = unsafe { pg_sys::TransactionIdIsCurrentTransactionId(pg_sys::TransactionId::from(xmin as u32)) };
    if started_here {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("backfill {id} cannot start before this transaction commits"),
            "Its worker waits for the transaction that started or resumed it; waiting for the \
             worker in that same transaction would never end.",
            Some("Commit first, then wait: in psql, SELECT backfill_start(...) \\gset then SELECT backfill_wait(:backfill_start);".into()),
        );
    }
    loop {
        let (state, delivered, error) = as_extension_owner(|| catalog::outcome(id)).unwrap_or_else(|e| {
            raise(ERRCODE_INTERNAL_ERROR, "could not read the backfill's state", e.to_string(), None)
        });
        match state.as_str() {
            "done" if delivered => return true,
            "failed" | "cancelled" => raise(
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("backfill {id} {state}"),
                error
                    .map(|e| format!("Backfill {id} {state}: {e}"))
                    .unwrap_or_else(|| format!("Backfill {id} was {state}.")),
                Some(if state == "failed" {
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
        unsafe {
            pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                100,
                pg_sys::PG_WAIT_EXTENSION,
            );
            pg_sys::ResetLatch(pg_sys::MyLatch);
        }
        pg_sys::check_for_interrupts!();
    }
}

/// Checks that backfill `id` exists, is in one of the states `from`, and that the caller may
/// control it (see [`require_controller`]); then moves it to `to` (unless `to` is empty).
/// Returns the backfill as it was.
fn control(id: i64, verb: &str, from: &[&str], to: &str, pause_reason: Option<&str>) -> catalog::Job {
    let job = require_controller(id, verb);
    let not_in_state = |state: &str| -> ! {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("cannot {verb} backfill {id}"),
            format!(
                "Backfill {id} is {state}; only a {} backfill can be {}.",
                from.join(" or "),
                past_participle(verb)
            ),
            None,
        )
    };
    if !from.contains(&job.state.as_str()) {
        not_in_state(&job.state);
    }
    if to.is_empty() {
        return job;
    }
    let moved = as_extension_owner(|| catalog::set_state(id, from, to, pause_reason)).unwrap_or_else(|e| {
        raise(ERRCODE_INTERNAL_ERROR, format!("could not {verb} the backfill"), e.to_string(), None)
    });
    if !moved {
        not_in_state("changing state concurrently");
    }
    job
}

/// Backfill `id`, which the caller may `verb`: the role that started it, a member of that role,
/// or a superuser (the only one left once that role is dropped).
fn require_controller(id: i64, verb: &str) -> catalog::Job {
    let job = as_extension_owner(|| catalog::job(id)).unwrap_or(None).unwrap_or_else(|| {
        raise(
            ERRCODE_UNDEFINED_OBJECT,
            format!("backfill {id} does not exist"),
            format!("No backfill has id {id}."),
            Some("SELECT id, state FROM backfill_status; lists the backfills.".into()),
        )
    });
    let allowed = privilege::is_superuser()
        || Spi::get_one_with_args::<bool>(
            "SELECT pg_catalog.pg_has_role(r.oid, 'MEMBER') FROM pg_catalog.pg_roles r
              WHERE r.rolname OPERATOR(pg_catalog.=) $1::name",
            &[job.started_by.clone().into()],
        )
        .ok()
        .flatten()
        .unwrap_or(false);
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

/// Launches a worker of backfill `id`, which first waits for this transaction to commit.
fn launch_worker(id: i64, worker: i32) {
    let starter_xid = unsafe { pg_sys::GetTopFullTransactionId() }.value;
    if !launcher::launch(id, worker, starter_xid) {
        raise(
            ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            "could not start the backfill's background worker",
            "Every background worker slot is in use (max_worker_processes).",
            Some("Wait for a backfill to finish, or raise max_worker_processes and restart the server.".into()),
        );
    }
}

fn check_batch_size(batch_size: i32) {
    if !(1..=MAX_BATCH_SIZE).contains(&batch_size) {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            format!("batch_size {batch_size} is out of range"),
            format!("batch_size is the number of rows per page and must be between 1 and {MAX_BATCH_SIZE}."),
            Some("The default, 1000, suits most tables; use less for very wide rows.".into()),
        );
    }
}

fn check_rate(rows_per_second: Option<i32>) {
    if let Some(rate) = rows_per_second.filter(|r| *r <= 0) {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            format!("rows_per_second {rate} is out of range"),
            "rows_per_second is the most rows the backfill delivers per second and must be positive.",
            Some("Pass NULL (the default) for no limit.".into()),
        );
    }
}

/// The tables named, each once; NULLs and an empty list are errors.
fn table_list(tables: Option<Vec<Option<pg_sys::Oid>>>) -> Vec<pg_sys::Oid> {
    let tables = tables.unwrap_or_default();
    if tables.is_empty() {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            "no table to backfill",
            "The list of tables is NULL or empty.",
            Some(
                "Name at least one table, for example SELECT backfill_start('public.orders', confirm => true);".into(),
            ),
        );
    }
    let mut relids = Vec::with_capacity(tables.len());
    for relid in tables {
        let Some(relid) = relid else {
            raise(
                ERRCODE_NULL_VALUE_NOT_ALLOWED,
                "the list of tables contains NULL",
                "Every element must name a table.",
                None,
            );
        };
        if relids.contains(&relid) {
            let name = table::relation_name(relid);
            raise(
                ERRCODE_INVALID_PARAMETER_VALUE,
                format!("table {name} is listed twice"),
                "A backfill scans each table once.",
                Some(format!("Remove the second {name} from the list.")),
            );
        }
        relids.push(relid);
    }
    relids
}

/// Read messages are only ever decoded when the server writes logical WAL.
fn require_logical_decoding() {
    let wal_level =
        Spi::get_one::<String>("SELECT pg_catalog.current_setting('wal_level')").ok().flatten().unwrap_or_default();
    if wal_level != "logical" {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "logical decoding is not enabled on this server",
            format!("wal_level is \"{wal_level}\": the backfill's messages would never reach a decoder."),
            Some("Set wal_level = logical in postgresql.conf and restart the server.".into()),
        );
    }
}

fn pretty_bytes(bytes: i64) -> String {
    Spi::get_one_with_args::<String>("SELECT pg_catalog.pg_size_pretty($1::bigint)", &[bytes.into()])
        .ok()
        .flatten()
        .unwrap_or_else(|| format!("{bytes} bytes"))
}
