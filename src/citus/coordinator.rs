//! backfill_start() of a Citus distributed table, on the coordinator (see docs/citus.md); its
//! control is passed on to the nodes by `control.rs`.
//!
//! A shard's changes are written, and decoded, on the worker node that holds it: its reads must
//! be written there too, in the same WAL, to sort against them. So the coordinator starts one
//! backfill on each node, of the shards it holds, as the calling role (`citus/nodes.rs`), and
//! keeps one backfill of its own with one row per shard placement, which a worker on the
//! coordinator keeps up to date (`follower.rs`). Cursors, exactly-once resume, pacing
//! and back-pressure stay each node's.

use crate::catalog::job::NewJob;
use crate::catalog::job_shard::{self, JobShard};
use crate::catalog::job_table::{self, NewRange, NewTable};
use crate::citus::nodes::{self, literal, Node, Placement, Reply};
use crate::model::request::{SourceOptions, StartRequest};
use crate::model::table;
use crate::pg::citus::{self as citus_metadata, Distribution};
use crate::pg::errors::{raise, OrInternal};
use crate::pg::privilege::as_extension_owner;
use crate::worker::admit::{admit, Admission};
use pgrx::prelude::*;
use pgrx::JsonB;
use pgrx::PgSqlErrorCode::*;
use std::collections::BTreeMap;

/// The one distributed table listed, if one is (a distributed table is backfilled alone).
pub fn distributed_table(relids: &[pg_sys::Oid]) -> Option<pg_sys::Oid> {
    if !citus_metadata::installed() {
        return None;
    }
    let relid =
        *relids.iter().find(|relid| citus_metadata::distribution(**relid) == Some(Distribution::Distributed))?;
    if relids.len() > 1 {
        let name = table::relation_name(relid);
        raise(
            ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("distributed table {name} must be backfilled alone"),
            "A backfill of a distributed table is one backfill on each worker node, of its shards there; \
             it takes no other table.",
            Some(format!("Start one backfill for {name}, and another for the other tables.")),
        );
    }
    Some(relid)
}

/// Starts the backfill of distributed table `relid` on its nodes, and records it here: its id.
/// With keys (backfill_repair()), of the shards that hold some, each node given its shards' keys.
pub fn start_distributed(request: &StartRequest, relid: pg_sys::Oid) -> i64 {
    let name = table::relation_name(relid);
    require_coordinator(&name);
    // The caller's rights on the table, as for any table (and the nodes check theirs again).
    let table = table::require(relid);
    let keys = request.keys.clone().map(|keys| keys_by_shard(relid, as_list(keys)));
    let keys = keys.as_ref();
    let placements = active_placements(relid, &name, keys);
    let by_node = nodes::group_by_node(&placements);
    let rows_per_second = request.options.rows_per_second.map(|rate| share_of_rate(rate, by_node.len()));
    // Every node checks what it would deliver first (its slot, publication and the caller's rights
    // there): a node that refuses then refuses before any starts.
    for (node, reply) in start_on_nodes(&by_node, false, request, keys, rows_per_second) {
        if !is_unconfirmed(&reply) {
            reply.raise_on(&node, &format!("backfill_start({name})"));
        }
    }
    let started_by = crate::pg::privilege::current_role_name();
    let prefix = crate::pg::settings::message_prefix();
    // The coordinator's own record: each node's backfill follows the node's slot of this name
    // and paces, batches and limits itself; the coordinator has no slot, no worker of its own
    // past the follower, and reads nothing.
    let mut job = NewJob::of_request(request, &started_by, &prefix);
    job.parallel = 1;
    job.slot_name = None;
    job.max_lag_bytes = None;
    job.rows_per_message = 1;
    job.row_filter = None;
    job.source = SourceOptions::default();
    let unconfirmed = Box::new(|| unconfirmed(request, &name, placements.len(), by_node.len()));
    let admission = Admission { job, tables: vec![(relid, name.clone())], confirm: request.confirm, unconfirmed };
    admit(admission, |backfill_id| {
        let replies = start_on_nodes(&by_node, true, request, keys, rows_per_second);
        record_node_backfills(backfill_id, &table, &by_node, &replies, keys);
    })
}

fn as_list(keys: serde_json::Value) -> Vec<serde_json::Value> {
    match keys {
        serde_json::Value::Array(keys) => keys,
        key => vec![key],
    }
}

fn require_coordinator(name: &str) {
    if !citus_metadata::is_coordinator() {
        raise(
            ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("distributed table {name} can be backfilled only from the coordinator"),
            "The coordinator starts a backfill on each worker node and keeps the whole as one backfill.",
            Some("Run backfill_start() on the Citus coordinator.".into()),
        );
    }
}

/// The table's shard placements on active primaries (with keys: those of the shards that hold
/// some).
fn active_placements(
    relid: pg_sys::Oid,
    name: &str,
    keys: Option<&BTreeMap<i64, Vec<serde_json::Value>>>,
) -> Vec<Placement> {
    let mut placements = nodes::placements(relid);
    if let Some(keys) = keys {
        placements.retain(|placement| keys.contains_key(&placement.shard_id));
    }
    if placements.is_empty() {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("distributed table {name} has no active shard placement"),
            "Citus's metadata lists no shard of it on an active primary node.",
            Some("SELECT * FROM citus_shards; shows where its shards are.".into()),
        );
    }
    placements
}

/// Without confirm => true: what the backfill would deliver, and the command to start it.
fn unconfirmed(request: &StartRequest, name: &str, placements: usize, nodes: usize) -> (String, String) {
    (
        format!(
            "The backfill of distributed table {name} would deliver its {placements} shard placements from {nodes} \
             worker nodes, each in its node's stream."
        ),
        format!("Review backfill_estimate() on the nodes, then run: {}", request.confirmed_call()),
    )
}

/// Records each shard placement of backfill `backfill_id` and its node's backfill. A node that
/// did not start stops the others (as the caller) before its error.
fn record_node_backfills(
    backfill_id: i64,
    table: &table::Table,
    by_node: &BTreeMap<Node, Vec<Placement>>,
    replies: &[(Node, Reply)],
    keys: Option<&BTreeMap<i64, Vec<serde_json::Value>>>,
) {
    if let Some((node, reply)) = replies.iter().find(|(_, reply)| reply.id.is_none()) {
        let cancels: Vec<(Node, String)> = replies
            .iter()
            .filter_map(|(node, reply)| reply.id.map(|id| (node.clone(), id)))
            .map(|(node, id)| (node, nodes::control_statement("backfill_cancel", "", id, &["running", "paused"])))
            .collect();
        forward(&cancels);
        reply.raise_on(node, &format!("backfill_start({})", table.qualified_name()));
    }
    let key_names = table.key_names();
    let record = NewTable { relid: table.relid, key_columns: &key_names, column_list: None, publication_filter: None };
    as_extension_owner(|| {
        let mut position = 0;
        for ((node, shards), (_, reply)) in by_node.iter().zip(replies) {
            for placement in shards {
                position += 1;
                let keys = keys.and_then(|keys| keys.get(&placement.shard_id)).map_or(0, Vec::len);
                let range =
                    NewRange { part: 0, worker: 0, lower_bound: None, upper_bound: None, rows_estimated: keys as i64 };
                job_table::insert_job_table(backfill_id, position, &record, range);
                job_shard::insert(
                    backfill_id,
                    &JobShard {
                        position,
                        shard_id: placement.shard_id,
                        shard_name: placement.shard_name.clone(),
                        node_name: node.name.clone(),
                        node_port: node.port,
                        node_backfill_id: reply.id.unwrap_or_default(),
                    },
                );
            }
        }
    });
}

/// The keys of distributed table `relid` by the shard that holds each (Citus hashes the
/// distribution column's value, cast from the key's JSON to its type).
pub fn keys_by_shard(relid: pg_sys::Oid, keys: Vec<serde_json::Value>) -> BTreeMap<i64, Vec<serde_json::Value>> {
    let name = table::relation_name(relid);
    let key = crate::verify::checksum::key_columns(relid, &name);
    let column = citus_metadata::distribution_column(relid);
    let Some((column, type_name)) = key.iter().find(|(k, _)| Some(k) == column.as_ref()) else {
        raise(
            ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("the key of distributed table {name} does not hold its distribution column"),
            "Keys are sent to the shards that hold them, found by the distribution column's value.",
            Some(format!(
                "Backfill {name} whole (backfill_start without keys), or give it a primary key that includes its \
                 distribution column."
            )),
        );
    };
    let value = crate::verify::key_json::key_from_json("e.v", column, type_name);
    let sql = format!(
        "SELECT pg_catalog.get_shard_id_for_distribution_column($1::pg_catalog.regclass, {value}), e.v
           FROM pg_catalog.jsonb_array_elements($2) AS e(v)"
    );
    let shards: Vec<(i64, serde_json::Value)> = Spi::connect(|client| {
        client
            .select(&sql, None, &[relid.into(), JsonB(serde_json::Value::Array(keys)).into()])?
            .map(|row| {
                Ok((row.get::<i64>(1)?.unwrap_or_default(), row.get::<JsonB>(2)?.map(|j| j.0).unwrap_or_default()))
            })
            .collect::<Result<Vec<_>, pgrx::spi::Error>>()
    })
    .or_internal("find the shards of the keys");
    let mut by_shard: BTreeMap<i64, Vec<serde_json::Value>> = BTreeMap::new();
    for (shard, key) in shards {
        by_shard.entry(shard).or_default().push(key);
    }
    by_shard
}

/// A backfill's rows_per_second is its total: each of `nodes` nodes takes an equal share.
pub fn share_of_rate(rate: i32, nodes: usize) -> i32 {
    // (In 64 bits: a rate near i32::MAX plus the rounding would overflow 32.)
    let nodes = i64::try_from(nodes.max(1)).unwrap_or(i64::MAX);
    i32::try_from((i64::from(rate) + nodes - 1) / nodes).unwrap_or(i32::MAX)
}

/// backfill.start_on_node() on every node, of its shards, as the current role.
fn start_on_nodes(
    by_node: &BTreeMap<Node, Vec<Placement>>,
    confirm: bool,
    request: &StartRequest,
    keys: Option<&BTreeMap<i64, Vec<serde_json::Value>>>,
    rows_per_second: Option<i32>,
) -> Vec<(Node, Reply)> {
    let optional = |value: Option<String>| value.unwrap_or_else(|| "NULL".into());
    let commands: Vec<(Node, String)> = by_node
        .iter()
        .map(|(node, shards)| {
            let tables: Vec<String> = shards.iter().map(|p| literal(&p.shard_name)).collect();
            // Each shard's keys, in the order of the tables.
            let keys = keys.map(|keys| {
                let each: Vec<serde_json::Value> = shards
                    .iter()
                    .map(|p| serde_json::Value::Array(keys.get(&p.shard_id).cloned().unwrap_or_default()))
                    .collect();
                format!("{}::pg_catalog.jsonb", literal(&serde_json::Value::Array(each).to_string()))
            });
            let statement = format!(
                "SELECT backfill.start_on_node(ARRAY[{}]::pg_catalog.regclass[], {confirm}, {}, {}, {}, {}, {}, {}, {})::pg_catalog.text",
                tables.join(", "),
                request.options.batch_size,
                optional(rows_per_second.map(|r| r.to_string())),
                optional(request.slot.as_deref().map(literal)),
                optional(request.publication.as_deref().map(literal)),
                optional(request.options.max_lag.map(|l| l.to_string())),
                request.options.parallel,
                optional(keys),
            );
            (node.clone(), statement)
        })
        .collect();
    let answers = nodes::run(&commands);
    commands.into_iter().zip(answers).map(|((node, _), answer)| (node, Reply::of(answer))).collect()
}

/// A node's answer to a start without confirm => true: everything checked, nothing started.
fn is_unconfirmed(reply: &Reply) -> bool {
    reply.sqlstate.as_deref() == Some("22023")
        && reply.message.as_deref().is_some_and(|m| m.starts_with("backfill not started: confirm => true"))
}

/// Runs each node's statement, as the current role: the node decides whether the role may. A
/// node's refusal or absence is an error naming it. (A start that failed on a node cancels the
/// others so; control.rs passes the control functions on so.)
pub fn forward(commands: &[(Node, String)]) {
    for ((node, statement), answer) in commands.iter().zip(nodes::run(commands)) {
        if let Err(message) = answer {
            raise(
                ERRCODE_CONNECTION_FAILURE,
                format!("worker node {node}: {message}"),
                format!("On worker node {node}, this failed: {statement}"),
                Some("Run it on that node once it is reachable.".into()),
            );
        }
    }
}

/// The tables a backfill on this node reads for `relids`: a Citus reference table is read from
/// the coordinator's placement of it, in the coordinator's stream, where Citus's change data
/// capture emits its changes (and from no other node); its messages name the reference table.
pub fn local_tables(relids: Vec<pg_sys::Oid>) -> Vec<pg_sys::Oid> {
    if !citus_metadata::installed() {
        return relids;
    }
    relids
        .into_iter()
        .map(|relid| {
            if citus_metadata::distribution(relid) != Some(Distribution::Reference) {
                return relid;
            }
            let name = table::relation_name(relid);
            if !citus_metadata::is_coordinator() {
                raise(
                    ERRCODE_FEATURE_NOT_SUPPORTED,
                    format!("reference table {name} can be backfilled only from the coordinator"),
                    "Citus's change data capture emits a reference table's changes in the coordinator's stream \
                     only: its reads must be written there too.",
                    Some("Run backfill_start() on the Citus coordinator.".into()),
                );
            }
            citus_metadata::coordinator_placement(relid).unwrap_or_else(|| {
                raise(
                    ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                    format!("reference table {name} has no placement on the coordinator"),
                    "Citus's change data capture emits a reference table's changes from the coordinator's \
                     placement, and this coordinator holds none.",
                    Some(
                        "Add the coordinator to the metadata: SELECT citus_set_coordinator_host('<host>', <port>);"
                            .into(),
                    ),
                )
            })
        })
        .collect()
}
