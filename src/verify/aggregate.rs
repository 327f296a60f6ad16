//! The aggregate level of backfill_checksum() (checksum.rs): per column, what a range's rows
//! sum to, or their extremes.

use crate::pg::encoding::{quote_ident, Text};
use crate::pg::errors::OrInternal;
use pgrx::prelude::*;

/// The aggregate level's checksum of a range: the md5 of a jsonb array (its text, under the
/// portable settings) of, per column in column order, its NULLs and then by type: integers,
/// numeric and bool (its trues) an exact sum; float4 and float8 the exact sum of the values as
/// numeric (rounded to 6 and 15 significant digits), so that the order of summation does not
/// matter; date, time, timetz, timestamp and timestamptz the least and greatest value.
/// With a column list, of its columns only.
pub fn expression(relid: pg_sys::Oid, listed: Option<&[String]>) -> String {
    let columns = Spi::connect(|client| {
        let rows = client.select(
            "SELECT a.attname::pg_catalog.text, a.atttypid FROM pg_catalog.pg_attribute a
              WHERE a.attrelid OPERATOR(pg_catalog.=) $1
                AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped
              ORDER BY a.attnum",
            None,
            &[relid.into()],
        )?;
        rows.map(|row| Ok((row.get::<Text>(1)?.map(|t| t.0).unwrap_or_default(), row.get::<pg_sys::Oid>(2)?)))
            .collect::<Result<Vec<_>, pgrx::spi::Error>>()
    })
    .or_internal("read the table's columns");
    let mut parts = Vec::new();
    for (column, type_oid) in columns {
        if listed.is_some_and(|listed| !listed.contains(&column)) {
            continue;
        }
        let column = format!("backfill_row.{}", quote_ident(&column));
        parts.push(format!("pg_catalog.count(*) OPERATOR(pg_catalog.-) pg_catalog.count({column})"));
        // SAFETY: a type's OID, from the catalog (a domain gives its base type).
        let base = type_oid.map(|oid| unsafe { pg_sys::getBaseType(oid) });
        match base {
            Some(pg_sys::INT2OID | pg_sys::INT4OID | pg_sys::INT8OID | pg_sys::NUMERICOID) => {
                parts.push(format!("pg_catalog.sum({column})"))
            }
            Some(pg_sys::FLOAT4OID | pg_sys::FLOAT8OID) => {
                parts.push(format!("pg_catalog.sum({column}::pg_catalog.numeric)"))
            }
            Some(pg_sys::BOOLOID) => parts.push(format!("pg_catalog.count(*) FILTER (WHERE {column})")),
            Some(
                pg_sys::DATEOID | pg_sys::TIMEOID | pg_sys::TIMETZOID | pg_sys::TIMESTAMPOID | pg_sys::TIMESTAMPTZOID,
            ) => {
                parts.push(format!("pg_catalog.min({column})"));
                parts.push(format!("pg_catalog.max({column})"));
            }
            _ => {}
        }
    }
    // (A function takes at most 100 arguments: the array is built in pieces.)
    let pieces: Vec<String> =
        parts.chunks(90).map(|chunk| format!("pg_catalog.jsonb_build_array({})", chunk.join(", "))).collect();
    format!("pg_catalog.md5(({})::pg_catalog.text)", pieces.join(" OPERATOR(pg_catalog.||) "))
}
