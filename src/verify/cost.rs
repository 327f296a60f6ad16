//! What a table's size says of the cheapest way for a checksum to read it: its blocks and rows
//! per block, for a sample of its rows (checksum.rs's range bounds), and whether its rows are
//! much wider than its keys, when counting by the key's index beats a scan of the table.

use crate::pg::errors::OrInternal;
use pgrx::prelude::*;

/// A plain table's blocks now and its rows per block at its last VACUUM or ANALYZE.
pub fn block_shape(relid: pg_sys::Oid) -> Option<(i64, f64)> {
    let shape = Spi::connect(|client| {
        let rows = client.select(
            "SELECT pg_catalog.pg_relation_size(c.oid) OPERATOR(pg_catalog./) pg_catalog.current_setting('block_size')::pg_catalog.int8,
                    (c.reltuples OPERATOR(pg_catalog./) c.relpages)::pg_catalog.float8
               FROM pg_catalog.pg_class c
              WHERE c.oid OPERATOR(pg_catalog.=) $1 AND c.relkind OPERATOR(pg_catalog.=) 'r'
                AND c.relpages OPERATOR(pg_catalog.>) 0 AND c.reltuples OPERATOR(pg_catalog.>) 0",
            Some(1),
            &[relid.into()],
        )?;
        if rows.is_empty() {
            return Ok(None);
        }
        let row = rows.first();
        Ok::<_, pgrx::spi::Error>(row.get::<i64>(1)?.zip(row.get::<f64>(2)?))
    })
    .or_internal("read the table's size");
    shape.filter(|(blocks, _)| *blocks > 0)
}

/// Whether table `relid` is more than 8 times the size of its key's index: then 1,024 scans
/// of the index cost less than one parallel scan of the table (the count level, measured: on
/// rows of 750 bytes, 1.3 to 1.8 times a count(*) against 2.3; on rows of about 60 bytes, 2.2
/// to 3.2 against 1.5 to 1.8).
pub fn rows_much_wider_than_keys(relid: pg_sys::Oid) -> bool {
    crate::pg::spi::select_one::<bool>(
        "SELECT pg_catalog.pg_relation_size($1) OPERATOR(pg_catalog.>)
                (8 OPERATOR(pg_catalog.*) pg_catalog.pg_relation_size(x.indexrelid))
           FROM pg_catalog.pg_index x
          WHERE x.indrelid OPERATOR(pg_catalog.=) $1 AND (x.indisprimary OR x.indisreplident)
          ORDER BY x.indisprimary DESC LIMIT 1",
        &[relid.into()],
    )
    .or_internal("compare the table's size with its key's")
    .unwrap_or(false)
}
