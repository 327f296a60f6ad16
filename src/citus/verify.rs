//! Verification of a Citus distributed table, on the coordinator: verification's questions of a
//! spread table (verify/fan_out.rs) asked of the worker nodes. Each node sums its shards over
//! the same ranges, and the sums are added up range by range; the table's stream position is one
//! on each node, and a slot is confirmed on every node (see docs/citus.md).

use crate::citus::nodes::{self, literal, Node};
use crate::pg::errors::raise;
use crate::verify::checksum::{self, Level};
use crate::verify::fan_out::{FanOut, StreamMark};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;

/// Sampled keys per range of a distributed table's bounds, and at least this many in all (as
/// a table's own, checksum.rs).
const SAMPLE_PER_RANGE: f64 = 30.0;
const MIN_SAMPLE: f64 = 10_000.0;

/// The worker nodes of Citus's distributed tables, as verification asks them: what the SQL
/// functions (api/verify.rs) hand to verification.
pub struct WorkerNodes;

pub static WORKER_NODES: WorkerNodes = WorkerNodes;

impl FanOut for WorkerNodes {
    fn spreads(&self, relid: pg_sys::Oid) -> bool {
        crate::pg::citus::is_distributed(relid)
    }

    /// Bounds from a sample of the distributed table's keys: Citus draws it from every shard (a
    /// materialized query, run on the nodes), and the bounds are placed here.
    fn sampled_bounds(&self, relid: pg_sys::Oid, key: &[(String, String)], ranges: i32) -> Vec<serde_json::Value> {
        if ranges == 1 {
            return Vec::new();
        }
        // (The nodes' estimate as the caller, whose grants their functions need; the sample of
        // the keys as the table's owner, as any read of the table: privilege::read_as_owner.)
        let rows =
            crate::citus::estimate::estimate(relid, 1000).and_then(Result::ok).map(|e| e.rows).unwrap_or(0).max(1)
                as f64;
        let fraction = ((SAMPLE_PER_RANGE * f64::from(ranges)).max(MIN_SAMPLE) / rows).min(1.0);
        let columns: Vec<String> = key.iter().map(|(n, _)| crate::pg::encoding::quote_ident(n)).collect();
        let with = format!(
            "WITH sample AS MATERIALIZED (SELECT {} FROM {} WHERE pg_catalog.random() OPERATOR(pg_catalog.<) {fraction})",
            columns.join(", "),
            crate::pg::spi::qualified_name(relid)
        );
        crate::pg::privilege::read_as_owner(relid, || checksum::bounds_of_sample(key, ranges, &with, "sample AS s"))
    }

    /// Each node sums its shards range by range, and the nodes' sums are added up. (Each node's
    /// backfill_checksum() reads its shards as their owner, with a snapshot of its own.)
    fn range_sums(&self, relid: pg_sys::Oid, bounds: &[serde_json::Value], level: Level) -> Vec<(i64, Option<String>)> {
        let name = crate::model::table::relation_name(relid);
        let bounds_literal = literal(&serde_json::Value::Array(bounds.to_vec()).to_string());
        let schema = crate::pg::spi::extension_schema();
        let by_node = nodes::group_by_node(&nodes::placements(relid));
        // Each node sums its shards range by range: (range, rows, sum of hashes as text).
        let commands: Vec<(Node, String)> = by_node
            .iter()
            .map(|(node, shards)| {
                let per_shard: Vec<String> = shards
                    .iter()
                    .map(|placement| {
                        format!(
                            "SELECT * FROM {schema}.backfill_checksum({}::pg_catalog.regclass, 1, {}, {bounds_literal}::pg_catalog.jsonb)",
                            literal(&placement.shard_name),
                            literal(level.name())
                        )
                    })
                    .collect();
                let statement = format!(
                    "SELECT coalesce(pg_catalog.json_agg(pg_catalog.json_build_array(r.range, r.rows, r.sum))::pg_catalog.text, '[]')
                       FROM (SELECT c.range, pg_catalog.sum(c.rows)::pg_catalog.int8 AS rows,
                                    pg_catalog.sum(c.checksum::pg_catalog.numeric)::pg_catalog.text AS sum
                               FROM ({}) c GROUP BY c.range) r",
                    per_shard.join(" UNION ALL ")
                );
                (node.clone(), statement)
            })
            .collect();
        let mut rows = vec![0i64; bounds.len() + 1];
        let mut sums = vec![0i128; bounds.len() + 1];
        for ((node, _), answer) in commands.iter().zip(nodes::run(&commands)) {
            let parts: Vec<(i32, i64, Option<String>)> = match answer.map(|json| serde_json::from_str(&json)) {
                Ok(Ok(parts)) => parts,
                Ok(Err(e)) => checksum_failed(node, &name, &format!("its answer was not a checksum ({e})")),
                Err(message) => checksum_failed(node, &name, message.trim_start_matches("ERROR:").trim()),
            };
            for (range, range_rows, sum) in parts {
                let Some(i) = usize::try_from(range - 1).ok().filter(|i| *i < rows.len()) else {
                    checksum_failed(node, &name, &format!("it answered for range {range}"))
                };
                rows[i] += range_rows;
                sums[i] += sum.and_then(|s| s.parse::<i128>().ok()).unwrap_or(0);
            }
        }
        rows.into_iter().zip(sums).map(|(rows, sum)| (rows, (level == Level::Hash).then(|| sum.to_string()))).collect()
    }

    /// A distributed table's changes are in its worker nodes' streams: the end of the WAL
    /// inserted on each (an asynchronous commit is visible before its record is written).
    fn stream_position(&self, relid: pg_sys::Oid) -> Box<dyn StreamMark> {
        let commands: Vec<(Node, String)> = nodes::group_by_node(&nodes::placements(relid))
            .into_keys()
            .map(|node| (node, crate::pg::wal::END_OF_INSERTED_WAL.to_string()))
            .collect();
        let answers = nodes::run(&commands);
        Box::new(NodePositions(
            commands
                .into_iter()
                .zip(answers)
                .map(|((node, _), answer)| {
                    let position = answer.unwrap_or_else(|message| node_unreachable(&node, &message));
                    (node, position)
                })
                .collect(),
        ))
    }
}

/// A distributed table's stream position: the WAL position of each of its worker nodes.
struct NodePositions(Vec<(Node, String)>);

impl StreamMark for NodePositions {
    fn confirmed(&self, slot: &str) -> bool {
        let commands: Vec<(Node, String)> = self
            .0
            .iter()
            .map(|(node, position)| {
                let sql = crate::verify::compare::SLOT_CONFIRMED
                    .replace("$1", &literal(slot))
                    .replace("$2", &literal(position));
                (node.clone(), format!("SELECT coalesce(({sql})::pg_catalog.text, 'no slot')"))
            })
            .collect();
        let answers = nodes::run(&commands);
        let mut confirmed = true;
        for ((node, _), answer) in commands.iter().zip(answers) {
            match answer.as_deref() {
                Ok("true") => {}
                Ok("false") => confirmed = false,
                Ok(_) => raise(
                    ERRCODE_UNDEFINED_OBJECT,
                    format!("replication slot \"{slot}\" does not exist on worker node {node}"),
                    "A distributed table's copy follows each worker node's stream, through a slot of that \
                     name on every node.",
                    Some(format!(
                        "Create it on that node (the consumer of a Citus cluster reads one slot per node): \
                         SELECT pg_create_logical_replication_slot({}, 'pgoutput');",
                        spi::quote_literal(slot)
                    )),
                ),
                Err(message) => node_unreachable(node, message),
            }
        }
        confirmed
    }
}

fn checksum_failed(node: &Node, table: &str, why: &str) -> ! {
    raise(
        ERRCODE_CONNECTION_FAILURE,
        format!("worker node {node} could not checksum its shards of distributed table {table}"),
        format!("On worker node {node}: {why}."),
        Some(
            "The role needs SELECT on the table and EXECUTE on backfill_checksum on every node (docs/citus.md).".into(),
        ),
    )
}

fn node_unreachable(node: &Node, message: &str) -> ! {
    raise(
        ERRCODE_CONNECTION_FAILURE,
        format!("worker node {node} did not answer the comparison"),
        format!("On worker node {node}: {}.", message.trim_start_matches("ERROR:").trim()),
        Some("Compare again once every node is up: SELECT * FROM citus_check_cluster_node_health();".into()),
    )
}
