//! Talking to Citus's worker nodes from the coordinator, through Citus's own connections
//! (`master_run_on_worker`): they connect as the current role, with whatever authentication the
//! cluster has set up for Citus (`citus.node_conninfo`, `.pgpass`, certificates). pg_backfill
//! takes no connection string and no password from anyone: a caller can do on a node only what
//! its role may do there.

use crate::pg::encoding::Text;
use crate::pg::errors::{raise, OrInternal};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Node {
    pub name: String,
    pub port: i32,
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.name, self.port)
    }
}

/// One placement of a shard of a distributed table: the shard's table on the node that holds it.
#[derive(Debug, Clone)]
pub struct Placement {
    pub node: Node,
    pub shard_id: i64,
    /// Schema-qualified and quoted, as the node's regclass input reads it.
    pub shard_name: String,
}

/// The active placements of the distributed table's shards, by node and shard id.
pub fn placements(relid: pg_sys::Oid) -> Vec<Placement> {
    Spi::connect(|client| {
        client
            .select(
                "SELECT n.nodename::pg_catalog.text, n.nodeport,
                        s.shardid,
                        pg_catalog.shard_name(s.logicalrelid, s.shardid, false)
                   FROM pg_catalog.pg_dist_shard s
                   JOIN pg_catalog.pg_dist_placement p ON p.shardid OPERATOR(pg_catalog.=) s.shardid
                   JOIN pg_catalog.pg_dist_node n ON n.groupid OPERATOR(pg_catalog.=) p.groupid
                  WHERE s.logicalrelid OPERATOR(pg_catalog.=) $1
                    AND n.noderole OPERATOR(pg_catalog.=) 'primary' AND n.isactive
                  ORDER BY n.nodename, n.nodeport, s.shardid",
                None,
                &[relid.into()],
            )?
            .map(|row| {
                Ok(Placement {
                    node: Node {
                        name: row.get::<Text>(1)?.map(|t| t.0).unwrap_or_default(),
                        port: row.get::<i32>(2)?.unwrap_or_default(),
                    },
                    shard_id: row.get::<i64>(3)?.unwrap_or_default(),
                    shard_name: row.get::<Text>(4)?.map(|t| t.0).unwrap_or_default(),
                })
            })
            .collect::<Result<Vec<_>, pgrx::spi::Error>>()
    })
    .or_internal("read the table's shard placements")
}

/// Runs one statement on each node, in parallel, each in a transaction of its own on its node, as
/// the current role. Each answer is the statement's single value as text, or the node's error
/// message (Citus passes on no SQLSTATE: statements that must return one catch their errors and
/// return them, see `Reply`).
pub fn run(commands: &[(Node, String)]) -> Vec<Result<String, String>> {
    if commands.is_empty() {
        return Vec::new();
    }
    let names: Vec<String> = commands.iter().map(|(node, _)| node.name.clone()).collect();
    let ports: Vec<i32> = commands.iter().map(|(node, _)| node.port).collect();
    let statements: Vec<String> = commands.iter().map(|(_, statement)| statement.clone()).collect();
    let answers = Spi::connect(|client| {
        client
            .select(
                "SELECT success, result
                   FROM pg_catalog.master_run_on_worker($1::pg_catalog.text[], $2::integer[], $3::pg_catalog.text[], true)
                   WITH ORDINALITY AS r(node_name, node_port, success, result, ordinal)
                  ORDER BY ordinal",
                None,
                &[names.into(), ports.into(), statements.into()],
            )?
            .map(|row| {
                let success = row.get::<bool>(1)?.unwrap_or(false);
                let result = row.get::<Text>(2)?.map(|t| t.0).unwrap_or_default();
                Ok(if success { Ok(result) } else { Err(result) })
            })
            .collect::<Result<Vec<_>, pgrx::spi::Error>>()
    })
    .or_internal("run statements on the worker nodes");
    if answers.len() != commands.len() {
        raise(
            PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE,
            "the worker nodes did not all answer",
            format!("{} statements were sent, {} answers came back.", commands.len(), answers.len()),
            Some("Check the nodes with SELECT * FROM citus_check_cluster_node_health();".into()),
        );
    }
    answers
}

/// What `backfill.start_on_node()` returns: the node's backfill id, or the error it raised.
#[derive(Debug, Deserialize)]
pub struct Reply {
    pub id: Option<i64>,
    pub sqlstate: Option<String>,
    pub message: Option<String>,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

impl Reply {
    /// The reply of a node, or a connection failure described as an error of that node.
    pub fn of(answer: Result<String, String>) -> Reply {
        match answer {
            Ok(json) => serde_json::from_str(&json).unwrap_or_else(|_| Reply::failure("XX000", &json)),
            // 08006: Citus could not reach the node, or the statement failed before it ran.
            Err(message) => Reply::failure("08006", message.trim_start_matches("ERROR:").trim()),
        }
    }

    fn failure(sqlstate: &str, message: &str) -> Reply {
        Reply { id: None, sqlstate: Some(sqlstate.into()), message: Some(message.into()), detail: None, hint: None }
    }

    /// Raises the node's error as the node raised it, naming the node.
    pub fn raise_on(&self, node: &Node, what: &str) -> ! {
        let code =
            self.sqlstate.as_deref().and_then(sqlstate_code).unwrap_or(PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE);
        // PL/pgSQL reports an absent detail or hint as an empty string.
        let present = |text: &Option<String>| text.clone().filter(|t| !t.is_empty());
        let detail = match present(&self.detail) {
            Some(detail) => format!("{what} on worker node {node} failed. {detail}"),
            None => format!("{what} on worker node {node} failed."),
        };
        // The node judged the calling role by its own grants and attributes, which Citus does
        // not copy from the coordinator for an extension's functions.
        let hint = present(&self.hint).or_else(|| {
            (code == PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE).then(|| {
                "Each worker node checks the role's rights itself: make the grants of docs/security.md on every \
                 node (SELECT run_command_on_workers(...)), see docs/citus.md."
                    .to_string()
            })
        });
        raise(code, format!("worker node {node}: {}", self.message.as_deref().unwrap_or("no answer")), detail, hint)
    }
}

/// The error code of a five-character SQLSTATE that PostgreSQL knows (pgrx answers XX000 for
/// any other).
fn sqlstate_code(sqlstate: &str) -> Option<PgSqlErrorCode> {
    let bytes = sqlstate.as_bytes();
    if bytes.len() != 5 || !bytes.iter().all(|b| b.is_ascii_digit() || b.is_ascii_uppercase()) {
        return None;
    }
    // As PostgreSQL's MAKE_SQLSTATE packs it: six bits per character.
    let packed =
        bytes.iter().enumerate().fold(0i32, |acc, (i, b)| acc + ((((*b as i32) - ('0' as i32)) & 0x3F) << (6 * i)));
    let code = PgSqlErrorCode::from(packed);
    (code != PgSqlErrorCode::ERRCODE_INTERNAL_ERROR || sqlstate == "XX000").then_some(code)
}

/// A SQL literal of a text value, for statements sent to a node.
pub fn literal(value: &str) -> String {
    pgrx::spi::quote_literal(value)
}

/// Whether shard `shard_id` still has an active placement on `node`, by the coordinator's metadata.
pub fn placed_on(shard_id: i64, node: &Node) -> bool {
    crate::pg::spi::select_one::<bool>(
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_placement p
                          JOIN pg_catalog.pg_dist_node n ON n.groupid OPERATOR(pg_catalog.=) p.groupid
                         WHERE p.shardid OPERATOR(pg_catalog.=) $1
                           AND n.nodename OPERATOR(pg_catalog.=) $2 AND n.nodeport OPERATOR(pg_catalog.=) $3)",
        &[shard_id.into(), node.name.as_str().into(), node.port.into()],
    )
    .or_internal("read Citus's placement metadata")
    .unwrap_or(false)
}

/// The statement that calls `function(id{arguments})` (backfill_cancel, backfill_pause,
/// backfill_resume, backfill_set) of backfill `node_id` on its node, if it is in one of the
/// states `from` there (one already past them, done on its node say, is left as it is); it
/// answers how many it called. Its operators and types are pg_catalog's, whatever the node
/// session's search_path (the node database's owner may set it).
pub fn control_statement(function: &str, arguments: &str, node_id: i64, from: &[&str]) -> String {
    // (The same on every node: Citus creates the extension on the nodes as on the coordinator.)
    let schema = crate::pg::spi::extension_schema();
    let states: Vec<String> = from.iter().map(|state| literal(state)).collect();
    format!(
        "SELECT pg_catalog.count({schema}.{function}(id{arguments}))::pg_catalog.text FROM {schema}.backfill_status \
          WHERE id OPERATOR(pg_catalog.=) {node_id} AND state OPERATOR(pg_catalog.=) ANY (ARRAY[{}]::pg_catalog.text[])",
        states.join(", ")
    )
}

/// The placements by node.
pub fn group_by_node(placements: &[Placement]) -> BTreeMap<Node, Vec<Placement>> {
    let mut by_node: BTreeMap<Node, Vec<Placement>> = BTreeMap::new();
    for placement in placements {
        by_node.entry(placement.node.clone()).or_default().push(placement.clone());
    }
    by_node
}
