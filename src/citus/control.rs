//! The control of a backfill of a Citus distributed table, on the coordinator: backfill_cancel(),
//! backfill_pause(), backfill_resume() and backfill_set() act on the coordinator's backfill
//! (api/control.rs), then pass the verb on to its nodes' backfills, here. For a backfill of this
//! server's own tables there are none, and nothing is passed on.

use crate::catalog::job_shard;
use crate::citus::coordinator::{forward, share_of_rate};
use crate::citus::nodes::{self, Node};
use crate::pg::privilege::as_extension_owner;

/// A control function's verb, as its nodes' backfills are given it.
pub enum Verb {
    Cancel,
    Pause,
    Resume,
    /// backfill_set(): NULL keeps a value, 0 removes a limit.
    Set {
        batch_size: Option<i32>,
        rows_per_second: Option<i32>,
        max_lag: Option<i64>,
    },
}

/// The nodes' backfills of a backfill: none for a backfill of this server's own tables.
pub struct NodeBackfills(Vec<(Node, i64)>);

impl NodeBackfills {
    pub fn of(backfill_id: i64) -> NodeBackfills {
        let mut started: Vec<(Node, i64)> = as_extension_owner(|| job_shard::shards_of(backfill_id))
            .into_iter()
            .map(|s| (Node { name: s.node_name, port: s.node_port }, s.node_backfill_id))
            .collect();
        started.sort();
        started.dedup();
        NodeBackfills(started)
    }

    /// Whether the backfill is one of this server's own tables (not a distributed table's).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Passes `verb` on to each node's backfill that is in a state the verb acts on there, as the
    /// current role (the node decides whether the role may). A node's refusal or absence is an
    /// error naming it.
    pub fn forward(&self, verb: &Verb) {
        let (function, arguments, from): (&str, String, &[&str]) = match *verb {
            Verb::Cancel => ("backfill_cancel", String::new(), &["running", "paused"]),
            Verb::Pause => ("backfill_pause", String::new(), &["running"]),
            Verb::Resume => ("backfill_resume", String::new(), &["paused", "failed"]),
            Verb::Set { batch_size, rows_per_second, max_lag } => {
                ("backfill_set", self.set_arguments(batch_size, rows_per_second, max_lag), &["running", "paused"])
            }
        };
        let commands: Vec<(Node, String)> = self
            .0
            .iter()
            .map(|(node, id)| (node.clone(), nodes::control_statement(function, &arguments, *id, from)))
            .collect();
        forward(&commands);
    }

    /// backfill_set()'s arguments on a node: each node's backfill takes its share of the rate.
    fn set_arguments(&self, batch_size: Option<i32>, rows_per_second: Option<i32>, max_lag: Option<i64>) -> String {
        let nodes_count = self.0.iter().map(|(node, _)| node).collect::<std::collections::BTreeSet<_>>().len();
        let optional = |value: Option<String>| value.unwrap_or_else(|| "NULL".into());
        format!(
            ", {}, {}, {}",
            optional(batch_size.map(|b| b.to_string())),
            optional(rows_per_second.map(|r| if r == 0 { 0 } else { share_of_rate(r, nodes_count) }.to_string())),
            optional(max_lag.map(|l| l.to_string())),
        )
    }
}
