//! backfill_checksum()'s entry point: a table of this server is summed here (verify/checksum.rs);
//! a Citus distributed table, on the coordinator, is summed shard by shard on its worker nodes,
//! over the same ranges, and the sums added up range by range (verify/distributed.rs).

use crate::pg::citus as citus_metadata;
use crate::pg::encoding::Text;
use crate::verify::checksum::{self, Level};
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
    if columns.is_some() {
        crate::citus::rules::refuse("backfill_checksum", relid, &["columns"]);
    }
    if citus_metadata::is_distributed(relid) {
        return TableIterator::new(crate::verify::distributed::checksum(relid, ranges, level, bounds));
    }
    TableIterator::new(checksum::checksum(relid, ranges, level, bounds, columns))
}
