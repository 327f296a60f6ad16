//! The state table `backfill.job_shard`: for a backfill of a Citus distributed table, started on
//! the coordinator, each shard placement's node and the backfill there that delivers it (one
//! `backfill.job_table` row each). Every read and write of it.

use crate::pg::encoding::Text;
use crate::pg::errors::OrInternal;
use pgrx::prelude::*;

/// One shard placement of a distributed backfill.
#[derive(Debug, Clone)]
pub struct JobShard {
    pub position: i32,
    pub shard_id: i64,
    pub shard_name: String,
    pub node_name: String,
    pub node_port: i32,
    pub node_backfill_id: i64,
}

pub fn insert(backfill_id: i64, shard: &JobShard) {
    Spi::run_with_args(
        "INSERT INTO backfill.job_shard (job_id, position, shard_id, shard_name, node_name, node_port, node_backfill_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        &[
            backfill_id.into(),
            shard.position.into(),
            shard.shard_id.into(),
            shard.shard_name.as_str().into(),
            shard.node_name.as_str().into(),
            shard.node_port.into(),
            shard.node_backfill_id.into(),
        ],
    )
    .or_internal("record the backfill's shards")
}

/// The shard placements of a backfill, in position order; none for a backfill of this node's
/// own tables (or on an older schema, which has no such table).
pub fn shards_of(backfill_id: i64) -> Vec<JobShard> {
    if !crate::catalog::schema::capabilities().job_shard {
        return Vec::new();
    }
    Spi::connect(|client| {
        client
            .select(
                "SELECT position, shard_id, shard_name, node_name, node_port, node_backfill_id
                   FROM backfill.job_shard WHERE job_id OPERATOR(pg_catalog.=) $1 ORDER BY position",
                None,
                &[backfill_id.into()],
            )?
            .map(|row| {
                Ok(JobShard {
                    position: row.get::<i32>(1)?.unwrap_or_default(),
                    shard_id: row.get::<i64>(2)?.unwrap_or_default(),
                    shard_name: row.get::<Text>(3)?.map(|t| t.0).unwrap_or_default(),
                    node_name: row.get::<Text>(4)?.map(|t| t.0).unwrap_or_default(),
                    node_port: row.get::<i32>(5)?.unwrap_or_default(),
                    node_backfill_id: row.get::<i64>(6)?.unwrap_or_default(),
                })
            })
            .collect::<Result<Vec<_>, pgrx::spi::Error>>()
    })
    .or_internal("read the backfill's shards")
}

/// What the shard's node said of it: its backfill's state and error, and the shard's rows.
pub struct ShardProgress<'a> {
    pub position: i32,
    pub node_state: &'a str,
    pub node_error: Option<&'a str>,
    pub range_state: &'a str,
    pub rows_done: i64,
    pub rows_estimated: i64,
}

pub fn record_progress(backfill_id: i64, progress: &ShardProgress) {
    Spi::run_with_args(
        "WITH shard AS (
             UPDATE backfill.job_shard SET node_state = $3, node_error = $4
              WHERE job_id OPERATOR(pg_catalog.=) $1 AND position OPERATOR(pg_catalog.=) $2)
         UPDATE backfill.job_table
            SET rows_done = $6, rows_estimated = $7, state = $5,
                started_at = coalesce(started_at, CASE WHEN $5 OPERATOR(pg_catalog.<>) 'pending'
                                                       THEN pg_catalog.clock_timestamp() END),
                finished_at = CASE WHEN $5 OPERATOR(pg_catalog.=) 'done'
                                   THEN coalesce(finished_at, pg_catalog.clock_timestamp()) END
          WHERE job_id OPERATOR(pg_catalog.=) $1 AND position OPERATOR(pg_catalog.=) $2",
        &[
            backfill_id.into(),
            progress.position.into(),
            progress.node_state.into(),
            progress.node_error.into(),
            progress.range_state.into(),
            progress.rows_done.into(),
            progress.rows_estimated.into(),
        ],
    )
    .or_internal("record the shards' progress")
}

/// A node's state when the coordinator could not ask it about the shard (unreachable).
pub fn record_node_state(backfill_id: i64, position: i32, node_state: &str, node_error: Option<&str>) {
    Spi::run_with_args(
        "UPDATE backfill.job_shard SET node_state = $3, node_error = $4
          WHERE job_id OPERATOR(pg_catalog.=) $1 AND position OPERATOR(pg_catalog.=) $2",
        &[backfill_id.into(), position.into(), node_state.into(), node_error.into()],
    )
    .or_internal("record a node's state")
}

/// The positions of a distributed backfill's shards not yet done.
pub fn unfinished_positions(backfill_id: i64) -> Vec<i32> {
    Spi::connect(|client| {
        client
            .select(
                "SELECT position FROM backfill.job_table
                  WHERE job_id OPERATOR(pg_catalog.=) $1 AND state OPERATOR(pg_catalog.<>) 'done'",
                None,
                &[backfill_id.into()],
            )?
            .map(|row| row.get::<i32>(1).map(Option::unwrap_or_default))
            .collect::<Result<Vec<_>, pgrx::spi::Error>>()
    })
    .or_internal("read the shards not done")
}

/// The OID of the backfill's table, if it no longer exists (dropped).
pub fn dropped_table(backfill_id: i64) -> Option<i64> {
    crate::pg::spi::select_one::<i64>(
        "SELECT t.relid::pg_catalog.oid::bigint FROM backfill.job_table t
          WHERE t.job_id OPERATOR(pg_catalog.=) $1
            AND NOT EXISTS (SELECT FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) t.relid::pg_catalog.oid)
          LIMIT 1",
        &[backfill_id.into()],
    )
    .or_internal("look for the backfill's table")
}
