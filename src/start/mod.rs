//! Starting a backfill, below the SQL that asks for one (api/start.rs, a follow's dispatch,
//! backfill_repair()): the one fork between a distributed table's backfill, started on its
//! Citus nodes (citus/coordinator.rs), and a backfill of tables read on this server, planned
//! (`plan.rs`: its tables checked, estimated and spread over its workers) and admitted
//! (worker/admit.rs). `estimate.rs` gives a table's rows, bytes and key ranges, `keys.rs` a
//! keyed backfill's keys (backfill_repair()), checked and sorted.

pub(crate) mod estimate;
pub(crate) mod keys;
pub(crate) mod options;
pub(crate) mod plan;

use crate::citus::coordinator;
use crate::citus::rules;
use crate::model::request::StartRequest;
use crate::pg::citus as citus_metadata;

/// Starts the backfill `request` asks for (all or nothing) and returns its id. Without confirm
/// it checks everything, starts nothing and reports what it would deliver. The one place where
/// the start path meets Citus: a distributed table's backfill is started on its nodes, any
/// other's here (a reference table's placement here standing for it).
pub fn start_backfill(request: &StartRequest) -> i64 {
    // On a Citus worker node, the coordinator starts backfills of shards, which Citus hides.
    citus_metadata::with_shards_visible(|| {
        for relid in &request.tables {
            rules::refuse("backfill_start", *relid, &request.options_given());
        }
        match coordinator::distributed_table(&request.tables) {
            Some(relid) => coordinator::start_distributed(request, relid),
            None => plan::start_local(request, &coordinator::local_tables(request.tables.clone())),
        }
    })
}
