//! The SQL functions. Their public signatures (regclass arguments, named defaults) are
//! declared in `sql/api.sql`, which calls these entry points in schema `backfill`.

use crate::api::request::{start_request, StartArgs};
use crate::pg::args::{check_rows_per_message, required};
use crate::pg::encoding::Text;
use crate::pg::privilege::as_extension_owner;
use crate::start::start_backfill;
use pgrx::prelude::*;
use pgrx::JsonB;

/// backfill_start() before 0.8.0: the SQL of an earlier version calls this entry point until
/// ALTER EXTENSION UPDATE (as the next two); it leaves the later options at their defaults.
#[pg_extern(schema = "backfill", name = "start")]
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
#[pg_extern(schema = "backfill", name = "start")]
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
#[pg_extern(schema = "backfill", name = "start")]
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

/// backfill_start() since 0.10.0: every option, in one call. The next option is one more
/// argument here (this function then becomes an adapter like the ones above).
#[pg_extern(schema = "backfill", name = "start")]
#[allow(clippy::too_many_arguments)]
fn start_every_option(
    tables: Option<Vec<Option<pg_sys::Oid>>>,
    confirm: Option<bool>,
    batch_size: Option<i32>,
    rows_per_second: Option<i32>,
    slot: Option<Text>,
    publication: Option<Text>,
    max_lag: Option<i64>,
    parallel: Option<i32>,
    max_replica_lag: Option<i64>,
    max_retained_wal: Option<i64>,
    max_active_sessions: Option<i32>,
    keys: Option<JsonB>,
    rows_per_message: Option<i32>,
    filter: Option<Text>,
    columns: Option<Vec<Option<Text>>>,
) -> i64 {
    start_backfill(&start_request(StartArgs {
        tables,
        confirm,
        batch_size,
        rows_per_second,
        slot,
        publication,
        max_lag,
        parallel,
        max_replica_lag,
        max_retained_wal,
        max_active_sessions,
        keys,
        rows_per_message,
        filter,
        columns,
    }))
}

/// backfill.set_rows_per_message(): makes the backfill `id`, started in this transaction, send
/// its rows `rows_per_message` at a time (NULL: backfill.rows_per_message, as it started).
/// Returns the id, so that backfill_start()'s SQL wrapper of 0.9.0 chains it.
///
/// Only at the start: a backfill keeps one format from its first row to its last, so that a
/// consumer never sees its reads change shape mid-table (backfill_set() does not change it).
#[pg_extern(schema = "backfill", name = "set_rows_per_message")]
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
