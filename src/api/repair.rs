//! backfill_repair(): a comparison (verify/compare.rs), then one backfill of the differing keys.

use crate::pg::encoding::Text;
use crate::pg::errors::raise;
use crate::verify::compare::{differences, Status};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;

/// backfill_repair(): compares, then starts one backfill of the differing keys of the source
/// (through the comparison's slot); its id, or NULL when nothing differs.
#[pg_extern(schema = "backfill", name = "repair")]
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

/// backfill_repair() of a column list's columns (0.9.0): compared over them, and the keys'
/// backfill delivers them. A function of its own, so that the SQL of an earlier version, which
/// calls backfill.repair() with seven arguments, keeps working with this library until ALTER
/// EXTENSION UPDATE.
#[pg_extern(schema = "backfill", name = "repair")]
#[allow(clippy::too_many_arguments)]
fn repair_columns(
    source: Option<pg_sys::Oid>,
    target: Option<pg_sys::Oid>,
    confirm: Option<bool>,
    level: Option<Text>,
    passes: Option<i32>,
    slot: Option<Text>,
    batch_size: Option<i32>,
    columns: Option<Vec<Option<Text>>>,
) -> Option<i64> {
    let columns = crate::stream::columns::given(columns);
    let confirm = crate::pg::args::required(confirm, "backfill_repair", "confirm");
    let batch_size = crate::pg::args::required(batch_size, "backfill_repair", "batch_size");
    crate::pg::args::check_batch_size(batch_size);
    if confirm {
        // What backfill_start() would refuse (no UPDATE, row-level security...), before the
        // comparison rather than after it.
        crate::model::table::require(crate::pg::args::required(source, "backfill_repair", "source"));
    }
    let found = differences("backfill_repair", source, target, level, passes, slot.map(|s| s.0), columns, confirm);
    let name = crate::model::table::relation_name(source.unwrap_or_default());
    if found.keys.is_empty() {
        notice!("{name} and its copy agree: nothing to repair");
        return None;
    }
    let count = |status: Status| found.keys.iter().filter(|(_, s)| *s == status).count();
    if !confirm {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            "repair not started: confirm => true is required",
            format!(
                "{} keys of {name} differ: {} missing, {} extra, {} different, {} unsettled.",
                found.keys.len(),
                count(Status::Missing),
                count(Status::Extra),
                count(Status::Different),
                count(Status::Unsettled),
            ),
            Some("SELECT * FROM backfill_compare(...) lists them; backfill_repair(..., confirm => true) re-delivers them.".into()),
        );
    }
    let keys: Vec<serde_json::Value> = found.keys.into_iter().map(|(key, _)| key).collect();
    let source = source.unwrap_or_default();
    if crate::pg::citus::is_distributed(source) {
        // On the worker nodes, each in its stream: one keyed backfill of the shards that hold keys.
        let by_shard = crate::citus::coordinator::keys_by_shard(source, keys);
        let options = crate::citus::coordinator::NodeOptions {
            batch_size,
            rows_per_second: None,
            slot: found.slot.as_deref(),
            publication: None,
            max_lag: None,
            parallel: 1,
            keys: Some(&by_shard),
        };
        return Some(crate::citus::coordinator::start_distributed(source, true, &options));
    }
    // Through the slot of a pipeline whose publication has a column list, the repair sends no
    // column it withholds, as the backfill before it did (its default list, and a ceiling).
    let publication = found.slot.as_deref().and_then(|slot| {
        crate::pg::privilege::as_extension_owner(|| crate::verify::compare::last_publication_of(source, slot))
    });
    let id = crate::api::start::start_of_columns(
        Some(vec![Some(source)]),
        Some(true),
        Some(batch_size),
        None,
        found.slot.map(Text),
        publication.map(Text),
        None,
        Some(1),
        None,
        // The columns compared: the list's and the key's, which every read carries.
        found.columns.map(|c| c.into_iter().map(|c| Some(Text(c))).collect()),
    );
    crate::api::keyed::record_keys(id, None, serde_json::Value::Array(keys));
    Some(id)
}
