//! backfill_estimate() of a Citus distributed table: its worker nodes' estimates of their shards,
//! added up.

use crate::citus::nodes::{self, literal, Node};
use crate::pg::citus as citus_metadata;
use pgrx::prelude::*;

/// A distributed table's estimate: its key columns, rows, message bytes and pages.
pub struct DistributedEstimate {
    pub key: Vec<String>,
    pub rows: i64,
    pub bytes: i64,
    pub pages: i64,
}

/// What backfill_estimate() says of a distributed table: its nodes' estimates of their shards,
/// added up, or why a node cannot backfill them. None when `relid` is not a distributed table.
pub fn estimate(relid: pg_sys::Oid, batch_size: i32) -> Option<Result<DistributedEstimate, String>> {
    if !citus_metadata::is_distributed(relid) {
        return None;
    }
    let by_node = nodes::group_by_node(&nodes::placements(relid));
    let schema = crate::pg::spi::extension_schema();
    let commands: Vec<(Node, String)> = by_node
        .iter()
        .map(|(node, shards)| {
            let tables: Vec<String> = shards.iter().map(|p| literal(&p.shard_name)).collect();
            let statement = format!(
                "SELECT pg_catalog.json_build_object('eligible', pg_catalog.bool_and(eligible),
                        'reason', pg_catalog.min(reason), 'key', pg_catalog.min(key_columns::pg_catalog.text[]),
                        'rows', pg_catalog.sum(rows_estimated), 'bytes', pg_catalog.sum(bytes_estimated),
                        'pages', pg_catalog.sum(pages))::pg_catalog.text
                   FROM {schema}.backfill_estimate(ARRAY[{}]::pg_catalog.regclass[], {batch_size})",
                tables.join(", ")
            );
            (node.clone(), statement)
        })
        .collect();
    #[derive(serde::Deserialize)]
    struct NodeEstimate {
        eligible: Option<bool>,
        reason: Option<String>,
        key: Option<Vec<String>>,
        rows: Option<i64>,
        bytes: Option<i64>,
        pages: Option<i64>,
    }
    let (mut key, mut rows, mut bytes, mut pages) = (Vec::new(), 0, 0, 0);
    for ((node, _), answer) in commands.iter().zip(nodes::run(&commands)) {
        let estimate: NodeEstimate = match answer.map(|json| serde_json::from_str(&json)) {
            Ok(Ok(estimate)) => estimate,
            Ok(Err(e)) => return Some(Err(format!("worker node {node} answered what is not an estimate ({e})"))),
            Err(message) => return Some(Err(format!("worker node {node}: {message}"))),
        };
        if estimate.eligible != Some(true) {
            let reason = estimate.reason.unwrap_or_else(|| "no shard there can be backfilled".into());
            return Some(Err(format!("on worker node {node}: {reason}")));
        }
        key = estimate.key.unwrap_or_default();
        rows += estimate.rows.unwrap_or_default();
        bytes += estimate.bytes.unwrap_or_default();
        pages += estimate.pages.unwrap_or_default();
    }
    Some(Ok(DistributedEstimate { key, rows, bytes, pages }))
}
