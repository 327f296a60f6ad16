//! The SQL functions. Their public signatures (regclass arguments, named defaults) are
//! declared in `sql/api.sql`, which calls these entry points in schema `backfill`.

use crate::catalog::{self, CANCELLED, FAILED, PAUSED, RUNNING};
use crate::eligibility::{self, Estimate, Table};
use crate::errors::raise;
use crate::{settings, worker};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;

const MAX_BATCH_SIZE: i32 = 100_000;

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
        .map(|relid| match eligibility::inspect(relid) {
            Ok(table) => {
                let estimate = eligibility::estimate(&table, 0, prefix_len);
                let pages = (estimate.rows + i64::from(batch_size) - 1) / i64::from(batch_size);
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
fn start(
    tables: Option<Vec<Option<pg_sys::Oid>>>,
    confirm: bool,
    batch_size: i32,
    rows_per_second: Option<i32>,
) -> i64 {
    check_batch_size(batch_size);
    check_rate(rows_per_second);
    require_logical_decoding();
    let relids = table_list(tables);
    let tables: Vec<Table> = relids.iter().map(|relid| eligibility::require(*relid)).collect();

    // Two starts of the same table must not both pass the check below: serialize them.
    Spi::run("SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('pg_backfill.start'))")
        .unwrap_or_else(|e| raise(ERRCODE_INTERNAL_ERROR, "could not lock", e.to_string(), None));
    for table in &tables {
        if let Some(running) = catalog::running_backfill_of(table.relid).unwrap_or(None) {
            raise(
                ERRCODE_OBJECT_IN_USE,
                format!("table {} already has a running backfill", table.qualified_name()),
                format!("Backfill {running} is scanning it."),
                Some(format!("Wait for it to finish, or cancel it: SELECT backfill_cancel({running});")),
            );
        }
    }

    let prefix = settings::message_prefix();
    let estimates: Vec<Estimate> = tables.iter().map(|t| eligibility::estimate(t, 0, prefix.len())).collect();
    if !confirm {
        let rows: i64 = estimates.iter().map(|e| e.rows).sum();
        let bytes: i64 = estimates.iter().map(|e| e.bytes).sum();
        let first = eligibility::relation_name(relids[0]);
        let example = if relids.len() == 1 { format!("'{first}'") } else { "ARRAY[...]".into() };
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            "backfill not started: confirm => true is required",
            format!(
                "The backfill would deliver about {rows} rows ({}) from {} table(s) in about {} pages.",
                pretty_bytes(bytes),
                tables.len(),
                (rows + i64::from(batch_size) - 1) / i64::from(batch_size),
            ),
            Some(format!("Review the estimate, then run: SELECT backfill_start({example}, confirm => true);")),
        );
    }

    let started_by = Spi::get_one::<String>("SELECT current_user::text").ok().flatten().unwrap_or_default();
    let job_id = as_extension_owner(|| {
        let job_id = catalog::insert_job(&started_by, batch_size, rows_per_second, &prefix)?;
        for (position, (table, estimate)) in tables.iter().zip(&estimates).enumerate() {
            catalog::insert_job_table(job_id, position as i32 + 1, table.relid, table.key_names(), estimate.rows)?;
        }
        Ok(job_id)
    })
    .unwrap_or_else(|e: pgrx::spi::Error| {
        raise(ERRCODE_INTERNAL_ERROR, "could not record the backfill", e.to_string(), None)
    });

    launch_worker(job_id);
    job_id
}

/// backfill_cancel(): stops a running or paused backfill at its next page. What it delivered
/// stays delivered; its state becomes cancelled.
#[pg_extern(schema = "backfill", name = "cancel")]
fn cancel(id: i64) -> bool {
    control(id, "cancel", &[RUNNING, PAUSED], CANCELLED)
}

/// backfill_pause(): the worker stops at its next page and exits; nothing is held meanwhile.
#[pg_extern(schema = "backfill", name = "pause")]
fn pause(id: i64) -> bool {
    control(id, "pause", &[RUNNING], PAUSED)
}

/// backfill_resume(): a paused or failed backfill continues from its cursor with a new worker.
#[pg_extern(schema = "backfill", name = "resume")]
fn resume(id: i64) -> bool {
    control(id, "resume", &[PAUSED, FAILED], RUNNING);
    launch_worker(id);
    true
}

/// Moves backfill `id` from one of the states `from` to `to`, as the role that started it (or
/// a member of it, or a superuser) may.
fn control(id: i64, verb: &str, from: &[&str], to: &str) -> bool {
    let job = catalog::job(id).unwrap_or(None).unwrap_or_else(|| {
        raise(
            ERRCODE_UNDEFINED_OBJECT,
            format!("backfill {id} does not exist"),
            format!("No backfill has id {id}."),
            Some("SELECT id, state FROM backfill_status; lists the backfills.".into()),
        )
    });
    let not_in_state = |state: &str| -> ! {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("cannot {verb} backfill {id}"),
            format!("Backfill {id} is {state}; only a {} backfill can be {verb}d.", from.join(" or ")),
            None,
        )
    };
    if !from.contains(&job.state.as_str()) {
        not_in_state(&job.state);
    }
    let allowed = Spi::get_one_with_args::<bool>(
        "SELECT pg_catalog.pg_has_role(current_user, $1::name, 'MEMBER')",
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
    let moved = as_extension_owner(|| catalog::set_state(id, from, to)).unwrap_or_else(|e| {
        raise(ERRCODE_INTERNAL_ERROR, format!("could not {verb} the backfill"), e.to_string(), None)
    });
    if !moved {
        not_in_state("changing state concurrently");
    }
    true
}

/// Launches the worker of backfill `id`, which first waits for this transaction to commit.
fn launch_worker(id: i64) {
    let starter_xid = unsafe { pg_sys::GetTopFullTransactionId() }.value;
    if !worker::launch(id, starter_xid) {
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
            let name = eligibility::relation_name(relid);
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

/// Runs `f` as the owner of pg_backfill's state tables: callers need no privileges on them,
/// only on the tables they backfill, which are checked as the caller beforehand. An error
/// inside restores the caller's identity with the transaction's abort.
fn as_extension_owner<R>(f: impl FnOnce() -> R) -> R {
    let owner = Spi::get_one::<pg_sys::Oid>("SELECT nspowner FROM pg_catalog.pg_namespace WHERE nspname = 'backfill'")
        .ok()
        .flatten()
        .unwrap_or_else(|| {
            raise(
                ERRCODE_INVALID_SCHEMA_NAME,
                "schema backfill is missing",
                "pg_backfill keeps its state there.",
                Some("Reinstall the extension: DROP EXTENSION pg_backfill; CREATE EXTENSION pg_backfill;".into()),
            )
        });
    let (mut user, mut context) = (pg_sys::InvalidOid, 0);
    unsafe {
        pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
        pg_sys::SetUserIdAndSecContext(owner, context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32);
    }
    let result = f();
    unsafe { pg_sys::SetUserIdAndSecContext(user, context) };
    result
}

fn pretty_bytes(bytes: i64) -> String {
    Spi::get_one_with_args::<String>("SELECT pg_catalog.pg_size_pretty($1::bigint)", &[bytes.into()])
        .ok()
        .flatten()
        .unwrap_or_else(|| format!("{bytes} bytes"))
}
