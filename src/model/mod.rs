//! The table model: a table as a backfill sees it, and the states and modes of backfills.

pub(crate) mod request;
pub(crate) mod state;
pub(crate) mod table;
