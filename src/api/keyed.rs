//! The entry points that give a backfill, as it starts, its keys (start/keys.rs): the SQL of
//! 0.9.0 chains backfill.set_keys() after its start, a Citus worker node's start set_keys_of().

use crate::pg::args::required;
use crate::start::keys::record_keys;
use pgrx::prelude::*;
use pgrx::JsonB;

/// backfill.set_keys(): makes the backfill `id`, started in this transaction, deliver exactly
/// the keys `keys` (a JSON array of key objects) of its one table. NULL keys: the whole table,
/// as started. Returns the id, so that backfill_start()'s SQL wrapper chains it.
#[pg_extern(schema = "backfill", name = "set_keys")]
fn set_keys(id: Option<i64>, keys: Option<JsonB>) -> Option<i64> {
    let Some(keys) = keys else { return id };
    let id = required(id, "backfill_start", "id");
    record_keys(id, None, keys.0);
    Some(id)
}

/// backfill.set_keys_of(): as [`set_keys`], for table `tbl` of a backfill of several tables (a
/// Citus worker node's backfill of its shards, for backfill_repair() on the coordinator).
#[pg_extern(schema = "backfill", name = "set_keys_of")]
fn set_keys_of(id: Option<i64>, tbl: Option<pg_sys::Oid>, keys: Option<JsonB>) -> Option<i64> {
    let Some(keys) = keys else { return id };
    let id = required(id, "backfill.set_keys_of", "id");
    let table = required(tbl, "backfill.set_keys_of", "tbl");
    record_keys(id, Some(table), keys.0);
    Some(id)
}
