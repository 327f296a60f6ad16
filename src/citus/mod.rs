//! Citus's coordinator side: a backfill of a distributed table is one backfill on each worker
//! node, of the shards it holds, in that node's own stream; the coordinator keeps the whole as
//! one backfill. What the nodes are asked, and how (`nodes.rs`); starting the backfill on them
//! (`coordinator.rs`), with the options a distributed table refuses (`rules.rs`); passing
//! control on to them (`control.rs`); the coordinator's worker, which follows them
//! (`follower.rs`); a distributed table's estimate (`estimate.rs`); its checksums and stream
//! positions from its nodes', as verification asks them (`verify.rs`).

pub(crate) mod control;
pub(crate) mod coordinator;
pub(crate) mod estimate;
pub(crate) mod follower;
pub(crate) mod nodes;
pub(crate) mod rules;
pub(crate) mod verify;
