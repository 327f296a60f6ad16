//! The state tables the worker and the SQL API share: every read and write of them.

pub(crate) mod follow;
pub(crate) mod job;
pub(crate) mod job_shard;
pub(crate) mod job_table;
pub(crate) mod schema;
