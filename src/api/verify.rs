//! Verification's entry points: backfill_checksum() and backfill_compare(), and the comparison of
//! backfill_repair(). A table of this server is summed and compared here (verify/); a Citus
//! distributed table, on the coordinator, is summed on its worker nodes, over the same ranges,
//! and its stream followed on each: these functions hand Citus's side (citus/verify.rs) to
//! verification, after refusing what such a table cannot take (citus/rules.rs).

use crate::citus::rules::{self, AGGREGATE_LEVEL};
use crate::citus::verify::WORKER_NODES;
use crate::model::request::{ChecksumRequest, CompareRequest, SlotChoice};
use crate::pg::args::required;
use crate::pg::encoding::Text;
use crate::verify::checksum::{self, Level};
use crate::verify::compare::Found;
use crate::verify::fan_out::{self, FanOut};
use pgrx::prelude::*;
use pgrx::JsonB;

/// backfill_checksum(): see verify/checksum.rs.
#[pg_extern(schema = "backfill", name = "checksum")]
#[allow(clippy::type_complexity)]
fn checksum(
    table: Option<pg_sys::Oid>,
    ranges: Option<i32>,
    level: Option<Text>,
    bounds: Option<JsonB>,
) -> TableIterator<
    'static,
    (
        name!(range, i32),
        name!(lower, Option<JsonB>),
        name!(upper, Option<JsonB>),
        name!(rows, i64),
        name!(checksum, Option<String>),
    ),
> {
    checksum_columns(table, ranges, level, bounds, None)
}

/// backfill_checksum() of a column list's columns (0.9.0): a function of its own, so that the SQL
/// of an earlier version, which calls backfill.checksum() with four arguments, keeps working with
/// this library until ALTER EXTENSION UPDATE.
#[pg_extern(schema = "backfill", name = "checksum")]
#[allow(clippy::type_complexity)]
fn checksum_columns(
    table: Option<pg_sys::Oid>,
    ranges: Option<i32>,
    level: Option<Text>,
    bounds: Option<JsonB>,
    columns: Option<Vec<Option<Text>>>,
) -> TableIterator<
    'static,
    (
        name!(range, i32),
        name!(lower, Option<JsonB>),
        name!(upper, Option<JsonB>),
        name!(rows, i64),
        name!(checksum, Option<String>),
    ),
> {
    let request = ChecksumRequest {
        table: required(table, "backfill_checksum", "tbl"),
        ranges,
        level: required(level, "backfill_checksum", "level").0,
        bounds: bounds.map(|b| b.0),
        columns: crate::selection::columns::given(columns),
    };
    TableIterator::new(checksum_rows(request))
}

/// The ranges of the table `request` names, summed here or, spread over Citus's worker nodes,
/// on them.
fn checksum_rows(request: ChecksumRequest) -> Vec<checksum::RangeRow> {
    let (relid, level) = (request.table, Level::parse(&request.level));
    rules::refuse("backfill_checksum", relid, &measured(level == Level::Aggregate, request.columns.is_some()));
    let bounds = request.bounds.map(JsonB);
    if WORKER_NODES.spreads(relid) {
        return fan_out::checksum(relid, request.ranges, level, bounds, &WORKER_NODES);
    }
    checksum::checksum(relid, request.ranges, level, bounds, request.columns)
}

/// backfill_compare(): the keys that differ, each with its status (verify/compare.rs), over a
/// column list's columns (0.9.0) or all. (Before 0.9.0 the SQL called backfill.compare() of five
/// arguments: api/old_sql.rs.)
#[pg_extern(schema = "backfill", name = "compare")]
pub fn compare_columns(
    source: Option<pg_sys::Oid>,
    target: Option<pg_sys::Oid>,
    level: Option<Text>,
    passes: Option<i32>,
    slot: Option<Text>,
    columns: Option<Vec<Option<Text>>>,
) -> TableIterator<'static, (name!(key, JsonB), name!(status, String))> {
    let request = compare_request("backfill_compare", source, target, level, passes, slot.map(|s| s.0), columns, false);
    let found = differences(request).keys;
    TableIterator::new(found.into_iter().map(|(key, status)| (JsonB(key), status.as_str().to_string())))
}

/// The request of a comparison by `call` (backfill_compare() or backfill_repair()).
#[allow(clippy::too_many_arguments)]
pub fn compare_request(
    call: &'static str,
    source: Option<pg_sys::Oid>,
    target: Option<pg_sys::Oid>,
    level: Option<Text>,
    passes: Option<i32>,
    slot: Option<String>,
    columns: Option<Vec<Option<Text>>>,
    starts_backfill: bool,
) -> CompareRequest {
    CompareRequest {
        call,
        source: required(source, call, "source"),
        target: required(target, call, "target"),
        level: required(level, call, "level").0,
        passes: required(passes, call, "passes"),
        slot: SlotChoice::of_argument(slot),
        columns: crate::selection::columns::given(columns),
        starts_backfill,
    }
}

/// The comparison of backfill_compare() and backfill_repair() (verify/compare.rs), with Citus's
/// side handed in. A distributed source takes no column list and neither side the aggregate level.
pub fn differences(request: CompareRequest) -> Found {
    let aggregate = request.level == Level::Aggregate.name();
    for (relid, listed) in [(request.source, request.columns.is_some()), (request.target, false)] {
        rules::refuse(request.call, relid, &measured(aggregate, listed));
    }
    crate::verify::compare::differences(request, &WORKER_NODES)
}

/// The options of a checksum's measure, as citus/rules.rs names them: the aggregate level, a
/// column list.
fn measured(aggregate: bool, listed: bool) -> Vec<&'static str> {
    [(AGGREGATE_LEVEL, aggregate), ("columns", listed)]
        .into_iter()
        .filter_map(|(option, given)| given.then_some(option))
        .collect()
}
