//! The entry points that only the SQL of earlier versions calls, kept so that such SQL, still in
//! place until ALTER EXTENSION UPDATE, works with this library: each a thin adapter into
//! today's request, named (in its comment) by the version whose SQL calls it. Today's SQL
//! (sql/api.sql) neither calls nor declares them (`sql = false`), and the update to 0.11.0 drops
//! their declarations. (Their Rust names stay as they were: each is the C symbol its version's SQL
//! names.)
//!
//! - 0.7.0 and before: backfill.start() of 8 arguments, backfill.estimate() of 2;
//! - 0.8.0: backfill.start() with a filter, backfill.estimate() with a filter, and (as before it)
//!   backfill.compare() and backfill.repair() without a column list;
//! - 0.9.0: backfill.start() with a column list, and the links its backfill_start() chains after
//!   it (set_rows_per_message(), set_source_limits(), set_keys()), backfill.set() of pacing only,
//!   refuse_node_options();
//! - 0.10.0: the event trigger's backfill.follow_ddl() without the command's tag.

use crate::api::control::change;
use crate::api::estimate::{estimate_request, estimate_rows};
use crate::api::repair::repair_columns;
use crate::api::request::{start_request, StartArgs};
use crate::api::verify::compare_columns;
use crate::model::request::{SetRequest, SourceOptions};
use crate::pg::args::{check_rows_per_message, required};
use crate::pg::encoding::Text;
use crate::pg::privilege::as_extension_owner;
use crate::start::keys::record_keys;
use crate::start::start_backfill;
use pgrx::prelude::*;
use pgrx::JsonB;

/// backfill_start() before 0.8.0: the SQL of an earlier version calls this entry point until
/// ALTER EXTENSION UPDATE (as the next two); it leaves the later options at their defaults.
#[pg_extern(sql = false)]
#[allow(clippy::too_many_arguments)]
fn start(
    tables: Option<Vec<Option<pg_sys::Oid>>>,
    confirm: Option<bool>,
    batch_size: Option<i32>,
    rows_per_second: Option<i32>,
    slot: Option<Text>,
    publication: Option<Text>,
    max_lag: Option<i64>,
    parallel: Option<i32>,
) -> i64 {
    let args = StartArgs {
        tables,
        confirm,
        batch_size,
        rows_per_second,
        slot,
        publication,
        max_lag,
        parallel,
        ..Default::default()
    };
    start_backfill(&start_request(args))
}

/// backfill_start() of 0.8.0 (a row filter).
#[pg_extern(sql = false)]
#[allow(clippy::too_many_arguments)]
fn start_filtered(
    tables: Option<Vec<Option<pg_sys::Oid>>>,
    confirm: Option<bool>,
    batch_size: Option<i32>,
    rows_per_second: Option<i32>,
    slot: Option<Text>,
    publication: Option<Text>,
    max_lag: Option<i64>,
    parallel: Option<i32>,
    filter: Option<Text>,
) -> i64 {
    let args = StartArgs {
        tables,
        confirm,
        batch_size,
        rows_per_second,
        slot,
        publication,
        max_lag,
        parallel,
        filter,
        ..Default::default()
    };
    start_backfill(&start_request(args))
}

/// backfill_start() of 0.9.0 (a row filter and a column list; its SQL chains the other options
/// through backfill.set_rows_per_message(), set_source_limits() and set_keys()).
#[pg_extern(sql = false)]
#[allow(clippy::too_many_arguments)]
fn start_of_columns(
    tables: Option<Vec<Option<pg_sys::Oid>>>,
    confirm: Option<bool>,
    batch_size: Option<i32>,
    rows_per_second: Option<i32>,
    slot: Option<Text>,
    publication: Option<Text>,
    max_lag: Option<i64>,
    parallel: Option<i32>,
    filter: Option<Text>,
    columns: Option<Vec<Option<Text>>>,
) -> i64 {
    let args = StartArgs {
        tables,
        confirm,
        batch_size,
        rows_per_second,
        slot,
        publication,
        max_lag,
        parallel,
        filter,
        columns,
        ..Default::default()
    };
    start_backfill(&start_request(args))
}

/// backfill_estimate() before 0.8.0 (no filter): the SQL of an earlier version calls this entry
/// point until ALTER EXTENSION UPDATE (as the next one).
// The row type must be spelled out here for pgrx to name the result columns.
#[allow(clippy::type_complexity)]
#[pg_extern(sql = false)]
fn estimate(
    tables: Option<Vec<Option<pg_sys::Oid>>>,
    batch_size: Option<i32>,
) -> TableIterator<
    'static,
    (
        name!(table_name, pg_sys::Oid),
        name!(eligible, bool),
        name!(reason, Option<Text>),
        name!(key_columns, Option<Vec<Text>>),
        name!(rows_estimated, Option<i64>),
        name!(bytes_estimated, Option<i64>),
        name!(pages, Option<i64>),
    ),
> {
    TableIterator::new(estimate_rows(&estimate_request(tables, batch_size, None, None)))
}

/// backfill_estimate() of 0.8.0 (a row filter).
#[allow(clippy::type_complexity)]
#[pg_extern(sql = false)]
fn estimate_filtered(
    tables: Option<Vec<Option<pg_sys::Oid>>>,
    batch_size: Option<i32>,
    filter: Option<Text>,
) -> TableIterator<
    'static,
    (
        name!(table_name, pg_sys::Oid),
        name!(eligible, bool),
        name!(reason, Option<Text>),
        name!(key_columns, Option<Vec<Text>>),
        name!(rows_estimated, Option<i64>),
        name!(bytes_estimated, Option<i64>),
        name!(pages, Option<i64>),
    ),
> {
    TableIterator::new(estimate_rows(&estimate_request(tables, batch_size, filter, None)))
}

/// backfill.set_rows_per_message(): makes the backfill `id`, started in this transaction, send
/// its rows `rows_per_message` at a time (NULL: backfill.rows_per_message, as it started).
/// Returns the id, so that backfill_start()'s SQL wrapper of 0.9.0 chains it.
///
/// Only at the start: a backfill keeps one format from its first row to its last, so that a
/// consumer never sees its reads change shape mid-table (backfill_set() does not change it).
#[pg_extern(sql = false)]
fn set_rows_per_message(id: Option<i64>, rows_per_message: Option<i32>) -> Option<i64> {
    let Some(rows_per_message) = rows_per_message else { return id };
    check_rows_per_message(rows_per_message);
    let id = required(id, "backfill_start", "id");
    crate::start::keys::require_starting_here(
        id,
        format!("rows_per_message cannot be changed for backfill {id}"),
        "A backfill's messages keep the format it started with; rows_per_message is given when it starts.",
        "Cancel it and start it again with SELECT backfill_start(..., rows_per_message => ...);",
    );
    as_extension_owner(|| crate::catalog::job::set_rows_per_message(id, rows_per_message));
    Some(id)
}

/// backfill.set_keys(): makes the backfill `id`, started in this transaction, deliver exactly
/// the keys `keys` (a JSON array of key objects) of its one table. NULL keys: the whole table,
/// as started. Returns the id, so that backfill_start()'s SQL wrapper chains it.
#[pg_extern(sql = false)]
fn set_keys(id: Option<i64>, keys: Option<JsonB>) -> Option<i64> {
    let Some(keys) = keys else { return id };
    let id = required(id, "backfill_start", "id");
    record_keys(id, None, keys.0);
    Some(id)
}

/// backfill_set() before 0.10.0: pacing only (its SQL chains the limits on the source through
/// backfill.set_source_limits()).
#[pg_extern(sql = false)]
fn set(id: Option<i64>, batch_size: Option<i32>, rows_per_second: Option<i32>, max_lag: Option<i64>) -> bool {
    change(id, SetRequest { batch_size, rows_per_second, max_lag, source: SourceOptions::default() })
}

/// The limits on the source of backfill_start() and backfill_set() in the SQL of 0.9.0 and
/// before (max_replica_lag, max_retained_wal, max_active_sessions), chained with
/// backfill.start() and backfill.set(): returns the backfill's id. (A backfill started in this
/// transaction is changed as by backfill_set(), as it was.)
#[pg_extern(sql = false)]
fn set_source_limits(
    id: Option<i64>,
    max_replica_lag: Option<i64>,
    max_retained_wal: Option<i64>,
    max_active_sessions: Option<i32>,
) -> Option<i64> {
    let source = SourceOptions::of_arguments(max_replica_lag, max_retained_wal, max_active_sessions);
    if source.is_empty() {
        return id; // nothing to change: backfill.start() or backfill.set() checks the rest
    }
    change(id, SetRequest { batch_size: None, rows_per_second: None, max_lag: None, source });
    id
}

/// The options of backfill_start() that a backfill of a distributed table does not pass on to
/// its nodes: refused before anything starts (backfill_start() calls this on its tables before
/// backfill.start()). Returns the tables.
#[pg_extern(sql = false)]
fn refuse_node_options(
    tables: Option<Vec<Option<pg_sys::Oid>>>,
    keys: Option<JsonB>,
    max_replica_lag: Option<i64>,
    max_retained_wal: Option<i64>,
    max_active_sessions: Option<i32>,
    rows_per_message: Option<i32>,
) -> Option<Vec<Option<pg_sys::Oid>>> {
    let given: Vec<&str> = [
        ("keys", keys.is_some()),
        ("max_replica_lag", max_replica_lag.is_some()),
        ("max_retained_wal", max_retained_wal.is_some()),
        ("max_active_sessions", max_active_sessions.is_some()),
        ("rows_per_message", rows_per_message.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, is_given)| is_given.then_some(name))
    .collect();
    for relid in tables.iter().flatten().flatten() {
        crate::citus::rules::refuse("backfill_start", *relid, &given);
    }
    tables
}

/// The event trigger's work in 0.10.0's SQL, which calls it (without the command's tag) until
/// ALTER EXTENSION UPDATE: as for a statement on a publication.
#[pg_extern(sql = false)]
fn follow_ddl() {
    if as_extension_owner(crate::catalog::follow::any_live_follow) {
        crate::follow::queue::statement(true);
    }
}

/// backfill_compare() before 0.9.0 (no column list).
#[pg_extern(sql = false)]
fn compare(
    source: Option<pg_sys::Oid>,
    target: Option<pg_sys::Oid>,
    level: Option<Text>,
    passes: Option<i32>,
    slot: Option<Text>,
) -> TableIterator<'static, (name!(key, JsonB), name!(status, String))> {
    compare_columns(source, target, level, passes, slot, None)
}

/// backfill_repair() before 0.9.0 (no column list).
#[pg_extern(sql = false)]
#[allow(clippy::too_many_arguments)]
fn repair(
    source: Option<pg_sys::Oid>,
    target: Option<pg_sys::Oid>,
    confirm: Option<bool>,
    level: Option<Text>,
    passes: Option<i32>,
    slot: Option<Text>,
    batch_size: Option<i32>,
) -> Option<i64> {
    repair_columns(source, target, confirm, level, passes, slot, batch_size, None)
}
