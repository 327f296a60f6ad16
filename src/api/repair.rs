//! backfill_repair(): a comparison (verify/compare.rs), then one backfill of the differing keys.

use crate::api::verify::compare_request;
use crate::api::verify::differences;
use crate::model::request::{CompareRequest, SourceOptions, StartOptions, StartRequest};
use crate::pg::encoding::Text;
use crate::pg::errors::raise;
use crate::verify::compare::Status;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;

/// backfill_repair() of a column list's columns (0.9.0): compared over them, and the keys'
/// backfill delivers them. (Before 0.9.0 the SQL called backfill.repair() of seven arguments:
/// api/old_sql.rs.)
#[pg_extern(schema = "backfill", name = "repair")]
#[allow(clippy::too_many_arguments)]
pub fn repair_columns(
    source: Option<pg_sys::Oid>,
    target: Option<pg_sys::Oid>,
    confirm: Option<bool>,
    level: Option<Text>,
    passes: Option<i32>,
    slot: Option<Text>,
    batch_size: Option<i32>,
    columns: Option<Vec<Option<Text>>>,
) -> Option<i64> {
    let batch_size = crate::pg::args::required(batch_size, "backfill_repair", "batch_size");
    crate::pg::args::check_batch_size(batch_size);
    let confirm = crate::pg::args::required(confirm, "backfill_repair", "confirm");
    let comparison =
        compare_request("backfill_repair", source, target, level, passes, slot.map(|s| s.0), columns, confirm);
    repair_differences(comparison, batch_size)
}

/// backfill_repair(): the comparison `comparison`, then, with confirm => true, one backfill of
/// `batch_size` of its differing keys.
fn repair_differences(comparison: CompareRequest, batch_size: i32) -> Option<i64> {
    let (source, confirm) = (comparison.source, comparison.starts_backfill);
    if confirm {
        // What backfill_start() would refuse (no UPDATE, row-level security...), before the
        // comparison rather than after it.
        crate::model::table::require(source);
    }
    let found = differences(comparison);
    let name = crate::model::table::relation_name(source);
    if found.keys.is_empty() {
        notice!("{name} and its copy agree: nothing to repair");
        return None;
    }
    if !confirm {
        unconfirmed(&name, &found.keys);
    }
    // Through the slot of a pipeline whose publication has a column list, the repair sends no
    // column it withholds, as the backfill before it did (its default list, and a ceiling). (A
    // distributed table's nodes deliver every column.)
    let distributed = crate::pg::citus::is_distributed(source);
    let publication = found.slot.as_deref().filter(|_| !distributed).and_then(|slot| {
        crate::pg::privilege::as_extension_owner(|| crate::verify::compare::last_publication_of(source, slot))
    });
    let keys: Vec<serde_json::Value> = found.keys.into_iter().map(|(key, _)| key).collect();
    let backfill = StartRequest {
        tables: vec![source],
        confirm: true,
        slot: found.slot,
        publication,
        options: StartOptions {
            batch_size,
            rows_per_second: None,
            parallel: 1,
            max_lag: None,
            source: SourceOptions::default(),
            rows_per_message: None,
        },
        keys: Some(serde_json::Value::Array(keys)),
        filter: None,
        // The columns compared: the list's and the key's, which every read carries.
        columns: found.columns,
    };
    // A distributed table's keys are backfilled on its worker nodes, each in its stream: one
    // keyed backfill of the shards that hold some.
    Some(if distributed {
        crate::citus::coordinator::start_distributed(&backfill, source)
    } else {
        crate::start::start_backfill(&backfill)
    })
}

/// Without confirm => true: what differs, as an error.
fn unconfirmed(name: &str, keys: &[(serde_json::Value, Status)]) -> ! {
    let count = |status: Status| keys.iter().filter(|(_, s)| *s == status).count();
    raise(
        ERRCODE_INVALID_PARAMETER_VALUE,
        "repair not started: confirm => true is required",
        format!(
            "{} keys of {name} differ: {} missing, {} extra, {} different, {} unsettled.",
            keys.len(),
            count(Status::Missing),
            count(Status::Extra),
            count(Status::Different),
            count(Status::Unsettled),
        ),
        Some(
            "SELECT * FROM backfill_compare(...) lists them; backfill_repair(..., confirm => true) re-delivers them."
                .into(),
        ),
    );
}
