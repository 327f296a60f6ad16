//! The SQL functions and the views' helpers.

pub(crate) mod control;
pub(crate) mod estimate;
pub(crate) mod follow;
pub(crate) mod keyed;
pub(crate) mod old_sql;
pub(crate) mod repair;
pub(crate) mod request;
pub(crate) mod start;
pub(crate) mod verify;
pub(crate) mod views;
