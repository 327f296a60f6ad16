//! Which rows and columns a backfill reads, and how a table is read: the filter (`filter.rs`),
//! the publication's row filter (`row_filter.rs`), the column list (`columns.rs`), the
//! pipeline's publication: which tables it holds and what it publishes of each
//! (`publication.rs`), and which relation a scan, a checksum or a comparison reads (`scanned.rs`: `ONLY`, or a partitioned table with its partitions).

pub(crate) mod columns;
pub(crate) mod filter;
pub(crate) mod publication;
pub(crate) mod row_filter;
pub(crate) mod scanned;
