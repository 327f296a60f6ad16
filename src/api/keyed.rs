//! The entry points that give a backfill, as it starts, its keys (start/keys.rs): the SQL of
//! 0.9.0 chains backfill.set_keys() after its start, a Citus worker node's start set_keys_of().

use crate::pg::args::required;
use crate::start::keys::record_keys;
use pgrx::prelude::*;
use pgrx::JsonB;

/// backfill.set_keys_of(): as backfill.set_keys() (api/old_sql.rs), for table `tbl` of a backfill of several tables (a
/// Citus worker node's backfill of its shards, for backfill_repair() on the coordinator).
#[pg_extern(schema = "backfill", name = "set_keys_of")]
fn set_keys_of(id: Option<i64>, tbl: Option<pg_sys::Oid>, keys: Option<JsonB>) -> Option<i64> {
    let Some(keys) = keys else { return id };
    let id = required(id, "backfill.set_keys_of", "id");
    let table = required(tbl, "backfill.set_keys_of", "tbl");
    record_keys(id, Some(table), keys.0);
    Some(id)
}
