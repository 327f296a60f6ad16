//! How a table is read, by a backfill's scan, a checksum and a comparison alike: a partitioned
//! table through its root, with its partitions; any other table `ONLY`, without its
//! inheritance children (a child has keys of its own, and is backfilled and checked as a table
//! of its own). One rule, so that a checksum counts the rows a backfill delivers.

use crate::model::table::Table;
use crate::pg::errors::OrInternal;
use pgrx::prelude::*;

/// The relation named `name` (schema-qualified and quoted, here or on another server) as a FROM
/// item reads it, `partitioned` or not: the rule.
pub fn relation(name: &str, partitioned: bool) -> String {
    if partitioned {
        name.to_string()
    } else {
        format!("ONLY {name}")
    }
}

/// `table` as a FROM item reads it.
pub fn of(table: &Table) -> String {
    relation(&table.qualified_name(), table.partitioned)
}

/// Table `relid` of this server as a FROM item reads it.
pub fn by_oid(relid: pg_sys::Oid) -> String {
    let partitioned = crate::pg::spi::select_one::<bool>(
        "SELECT c.relkind OPERATOR(pg_catalog.=) 'p' FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) $1",
        &[relid.into()],
    )
    .or_internal("read the table's kind");
    relation(&crate::pg::spi::qualified_name(relid), partitioned == Some(true))
}
