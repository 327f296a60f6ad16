//! Proving a copy complete: checksums, row hashes, comparisons.

pub(crate) mod aggregate;
pub(crate) mod checksum;
pub(crate) mod compare;
pub(crate) mod cost;
pub(crate) mod fan_out;
pub(crate) mod key_json;
pub(crate) mod numeric_jsonb;
pub(crate) mod parallel_heap_scan;
pub(crate) mod row_encoding;
pub(crate) mod row_hash;
pub(crate) mod sides;
