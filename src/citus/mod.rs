//! Citus: a backfill of a distributed table is one backfill on each worker node, of the shards it
//! holds, in that node's own stream; the coordinator keeps the whole as one backfill. What the
//! nodes are asked, and how (`nodes.rs`); a distributed table's estimate (`estimate.rs`).

pub(crate) mod coordinator;
pub(crate) mod estimate;
pub(crate) mod nodes;
pub(crate) mod rules;
