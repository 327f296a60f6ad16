//! The SQL functions. Their public signatures (regclass arguments, named defaults) are
//! declared in `sql/api.sql`, which calls these entry points in schema `backfill`.

use crate::api::request::{start_request, StartArgs};
use crate::pg::encoding::Text;
use crate::start::start_backfill;
use pgrx::prelude::*;
use pgrx::JsonB;

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
