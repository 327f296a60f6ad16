//! What reaches the logical decoding stream: page queries, the columns and rows of a read, rows as JSON,
//! messages and their tags.

pub(crate) mod columns;
pub(crate) mod delivery;
pub(crate) mod json;
pub(crate) mod message;
pub(crate) mod row_filter;
pub(crate) mod scan;
pub(crate) mod sign;
