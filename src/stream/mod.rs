//! What reaches the logical decoding stream: page queries, rows as JSON, messages and their tags,
//! and the hot path from executor to message. (Which rows and columns: selection/.)

pub(crate) mod delivery;
pub(crate) mod json;
pub(crate) mod message;
pub(crate) mod scan;
pub(crate) mod sign;
