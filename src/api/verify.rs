//! Verification's entry points: backfill_checksum() and backfill_compare(), and the comparison of
//! backfill_repair(). A table of this server is summed and compared here (verify/); a Citus
//! distributed table, on the coordinator, is summed on its worker nodes, over the same ranges,
//! and its stream followed on each: these functions hand Citus's side (citus/verify.rs) to
//! verification, after refusing what such a table cannot take (citus/rules.rs).

use crate::citus::rules::{self, AGGREGATE_LEVEL};
use crate::citus::verify::WORKER_NODES;
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
    let relid = crate::pg::args::required(table, "backfill_checksum", "tbl");
    let level = Level::parse(&crate::pg::args::required(level, "backfill_checksum", "level").0);
    let columns = crate::selection::columns::given(columns);
    rules::refuse("backfill_checksum", relid, &measured(level == Level::Aggregate, columns.is_some()));
    if WORKER_NODES.spreads(relid) {
        return TableIterator::new(fan_out::checksum(relid, ranges, level, bounds, &WORKER_NODES));
    }
    TableIterator::new(checksum::checksum(relid, ranges, level, bounds, columns))
}

/// backfill_compare(): the keys that differ, each with its status (verify/compare.rs).
#[pg_extern(schema = "backfill", name = "compare")]
fn compare(
    source: Option<pg_sys::Oid>,
    target: Option<pg_sys::Oid>,
    level: Option<Text>,
    passes: Option<i32>,
    slot: Option<Text>,
) -> TableIterator<'static, (name!(key, JsonB), name!(status, String))> {
    compare_columns(source, target, level, passes, slot, None)
}

/// backfill_compare() of a column list's columns (0.9.0): a function of its own, so that the SQL
/// of an earlier version, which calls backfill.compare() with five arguments, keeps working with
/// this library until ALTER EXTENSION UPDATE.
#[pg_extern(schema = "backfill", name = "compare")]
fn compare_columns(
    source: Option<pg_sys::Oid>,
    target: Option<pg_sys::Oid>,
    level: Option<Text>,
    passes: Option<i32>,
    slot: Option<Text>,
    columns: Option<Vec<Option<Text>>>,
) -> TableIterator<'static, (name!(key, JsonB), name!(status, String))> {
    let columns = crate::selection::columns::given(columns);
    let found = differences("backfill_compare", source, target, level, passes, slot.map(|s| s.0), columns, false).keys;
    TableIterator::new(found.into_iter().map(|(key, status)| (JsonB(key), status.as_str().to_string())))
}

/// The comparison of backfill_compare() and backfill_repair() (verify/compare.rs), with Citus's
/// side handed in. A distributed source takes no column list and neither side the aggregate level.
#[allow(clippy::too_many_arguments)]
pub fn differences(
    function: &str,
    source: Option<pg_sys::Oid>,
    target: Option<pg_sys::Oid>,
    level: Option<Text>,
    passes: Option<i32>,
    slot: Option<String>,
    columns: Option<Vec<String>>,
    starts_backfill: bool,
) -> Found {
    let aggregate = level.as_ref().is_some_and(|level| level.0 == Level::Aggregate.name());
    for (relid, listed) in [(source, columns.is_some()), (target, false)] {
        if let Some(relid) = relid {
            rules::refuse(function, relid, &measured(aggregate, listed));
        }
    }
    crate::verify::compare::differences(
        function,
        source,
        target,
        level,
        passes,
        slot,
        columns,
        starts_backfill,
        &WORKER_NODES,
    )
}

/// The options of a checksum's measure, as citus/rules.rs names them: the aggregate level, a
/// column list.
fn measured(aggregate: bool, listed: bool) -> Vec<&'static str> {
    [(AGGREGATE_LEVEL, aggregate), ("columns", listed)]
        .into_iter()
        .filter_map(|(option, given)| given.then_some(option))
        .collect()
}
