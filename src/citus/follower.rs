//! The coordinator's worker of a backfill of a Citus distributed table: it reads nothing itself.
//! About every second it asks each worker node how its backfill of the shards there stands,
//! records each shard's rows and state in `backfill.job_table` (so that backfill_status,
//! backfill_tables and backfill_shards show the whole), and ends the coordinator's backfill the
//! way its nodes' end: done once every node's is done (and, with a slot, delivered), failed or
//! cancelled as soon as one node's is. Then nothing goes on that the coordinator does not show
//! running: a node's backfill that fails pauses the others (backfill_resume on the coordinator
//! resumes them all, backfill_cancel cancels them all); one cancelled on its node cancels the
//! others. A node it cannot reach (restarting, say) is shown as unreachable and asked again: its
//! own backfill resumes there by itself.
//!
//! A background worker entry of its own (`backfill_follower_main`): the launcher
//! (worker/launcher.rs) registers it, by name, for a backfill that has shard rows; it starts
//! as every backfill worker does (worker/process.rs) and then follows instead of scanning.

use crate::catalog::job;
use crate::catalog::job_shard::{self, JobShard, ShardProgress};
use crate::citus::nodes::{self, literal, Node};
use crate::model::state::JobState;
use crate::throttle::pacing;
use crate::worker::launcher::Entry;
use crate::worker::process::Work;
use crate::worker::xact::{in_transaction, who};
use pgrx::prelude::*;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

const LOOK_EVERY: Duration = Duration::from_millis(500);

/// What a node says of its backfill.
#[derive(Deserialize)]
struct NodeBackfill {
    state: String,
    delivered: Option<bool>,
    sqlstate: Option<String>,
    error: Option<String>,
    /// [position, rows_done, rows_estimated, state] of each shard, by the coordinator's position.
    shards: Vec<(i32, i64, i64, String)>,
}

/// The coordinator's worker of a distributed backfill: started (and admitted) as any backfill
/// worker, it follows the nodes' backfills.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn backfill_follower_main(arg: pg_sys::Datum) {
    if let Some(Work::Backfill { backfill_id, .. }) = crate::worker::process::start(arg, Entry::Follow) {
        watch(backfill_id);
    }
}

/// Watches the nodes until the backfill ends or stops here (paused or cancelled: the control
/// functions pass that on to the nodes themselves).
fn watch(backfill_id: i64) {
    loop {
        match in_transaction(|| look(backfill_id)) {
            Ok(true) => pacing::sleep(LOOK_EVERY),
            Ok(false) => return,
            Err(e) => {
                // Its own catalog unreadable: say so and look again, as a page would retry.
                log!("{}: could not look at its nodes: {}", who(backfill_id), e.message);
                pacing::sleep(LOOK_EVERY);
            }
        }
    }
}

/// One look at every node. False once the backfill no longer runs.
fn look(backfill_id: i64) -> bool {
    let Some(job) = job::job(backfill_id) else {
        log!("{}: no longer exists, its worker exits", who(backfill_id));
        return false;
    };
    if job.state != JobState::Running {
        log!("{}: {}, its worker exits", who(backfill_id), job.state);
        return false;
    }
    let shards = job_shard::shards_of(backfill_id);
    let mut by_node: BTreeMap<(Node, i64), Vec<&JobShard>> = BTreeMap::new();
    for shard in &shards {
        let node = Node { name: shard.node_name.clone(), port: shard.node_port };
        by_node.entry((node, shard.node_backfill_id)).or_default().push(shard);
    }
    // The distributed table dropped: its shards are gone too (and no longer placed anywhere,
    // which the check below would report as a move).
    if let Some(relid) = job_shard::dropped_table(backfill_id) {
        let why = format!(
            "distributed table {relid} was dropped during its backfill: its shards are gone from every node, \
             their rows up to each node's cursor were delivered"
        );
        end(backfill_id, JobState::Failed, Some(("42P01", &why)));
        control_on_nodes(backfill_id, by_node.keys(), "backfill_cancel", &["running", "paused"]);
        return false;
    }
    // A shard that moved (or was split) before its node delivered it: its rows' changes now go
    // to another node's stream, where this node's reads would not sort against them.
    let unfinished = job_shard::unfinished_positions(backfill_id);
    if let Some(((node, _), shard)) = by_node
        .iter()
        .flat_map(|(at, shards)| shards.iter().map(move |shard| (at, shard)))
        .find(|(at, shard)| unfinished.contains(&shard.position) && !nodes::placed_on(shard.shard_id, &at.0))
    {
        let why = format!(
            "shard {} ({}) moved away from worker node {node} before its backfill there was done: its rows' \
             changes are now written on another node. Start the backfill of the table again once the shard \
             events are over.",
            shard.shard_id, shard.shard_name
        );
        end(backfill_id, JobState::Failed, Some(("55000", &why)));
        // Resuming cannot help, starting again will: the other nodes' backfills stop too, so that
        // a new backfill of the table can start on every node.
        control_on_nodes(backfill_id, by_node.keys(), "backfill_cancel", &["running", "paused"]);
        return false;
    }
    let schema = crate::pg::spi::extension_schema();
    let commands: Vec<(Node, String)> =
        by_node.iter().map(|((node, id), shards)| (node.clone(), question(&schema, *id, shards))).collect();
    let answers = nodes::run(&commands);

    let mut all_done = true;
    for (((node, node_id), shards), answer) in by_node.iter().zip(answers) {
        let reply: Result<NodeBackfill, String> = match answer {
            Ok(json) if json.is_empty() => Err(format!("backfill {node_id} no longer exists there")),
            Ok(json) => serde_json::from_str(&json).map_err(|e| format!("unreadable answer ({e})")),
            Err(message) => {
                // Unreachable for now (a restart, a network blip): its backfill resumes there. (Or
                // the question failed there: shown, and asked again.)
                let state = if message.starts_with("ERROR:") { "unanswered" } else { "unreachable" };
                for shard in shards {
                    job_shard::record_node_state(backfill_id, shard.position, state, Some(&message));
                }
                all_done = false;
                continue;
            }
        };
        let reply = match reply {
            Ok(reply) => reply,
            Err(why) => {
                end(backfill_id, JobState::Failed, Some(("58000", &format!("worker node {node}: {why}"))));
                return false;
            }
        };
        for (position, rows_done, rows_estimated, range_state) in &reply.shards {
            job_shard::record_progress(
                backfill_id,
                &ShardProgress {
                    position: *position,
                    node_state: &reply.state,
                    node_error: reply.error.as_deref(),
                    range_state,
                    rows_done: *rows_done,
                    rows_estimated: *rows_estimated,
                },
            );
        }
        match reply.state.as_str() {
            "failed" => {
                let why = format!(
                    "backfill {node_id} on worker node {node} failed: {}",
                    reply.error.as_deref().unwrap_or("no error recorded")
                );
                // The others pause (holding nothing), rather than go on under a coordinator's
                // backfill that shows failed: backfill_resume on the coordinator resumes them
                // with the failed one, backfill_cancel cancels them.
                if end(backfill_id, JobState::Failed, Some((reply.sqlstate.as_deref().unwrap_or("XX000"), &why))) {
                    control_on_nodes(backfill_id, by_node.keys(), "backfill_pause", &["running"]);
                }
                return false;
            }
            "cancelled" => {
                log!("{}: backfill {node_id} on worker node {node} was cancelled there", who(backfill_id));
                // The whole cannot be done any more: the others stop too (as after a shard move).
                if end(backfill_id, JobState::Cancelled, None) {
                    control_on_nodes(backfill_id, by_node.keys(), "backfill_cancel", &["running", "paused"]);
                }
                return false;
            }
            "done" if reply.delivered.unwrap_or(true) => {}
            _ => all_done = false,
        }
    }
    // A sample of the whole's rows, for the rate of the last minute on the coordinator.
    job::record_progress(backfill_id);
    if all_done {
        if job::move_job(backfill_id, &[JobState::Running], JobState::Done, None, None) {
            log!("{}: done on every node", who(backfill_id));
        }
        return false;
    }
    true
}

/// The question to a node about its backfill `node_id`, answered as JSON (see [`NodeBackfill`]).
fn question(schema: &str, node_id: i64, shards: &[&JobShard]) -> String {
    // to_regclass: a shard's table may be gone (moved and dropped); its row then counts nothing.
    let values: Vec<String> = shards
        .iter()
        .map(|s| format!("({}, pg_catalog.to_regclass({}))", s.position, literal(&s.shard_name)))
        .collect();
    format!(
        "SELECT pg_catalog.json_build_object(
                    'state', s.state, 'delivered', s.delivered,
                    'sqlstate', s.last_error_sqlstate, 'error', s.last_error,
                    'shards', (SELECT pg_catalog.json_agg(pg_catalog.json_build_array(
                                              g.position, g.rows_done, g.rows_estimated, g.state))
                                 FROM (SELECT v.position,
                                              coalesce(pg_catalog.sum(t.rows_done), 0)::pg_catalog.int8 AS rows_done,
                                              coalesce(pg_catalog.sum(t.rows_estimated), 0)::pg_catalog.int8 AS rows_estimated,
                                              CASE WHEN pg_catalog.bool_and(t.state OPERATOR(pg_catalog.=) 'done') THEN 'done'
                                                   WHEN pg_catalog.bool_or(t.state OPERATOR(pg_catalog.<>) 'pending') THEN 'running'
                                                   ELSE 'pending' END AS state
                                         FROM (VALUES {}) v(position, shard)
                                         LEFT JOIN {schema}.backfill_tables t
                                           ON t.backfill_id OPERATOR(pg_catalog.=) s.id
                                          AND t.table_name OPERATOR(pg_catalog.=) v.shard
                                        GROUP BY v.position) g))::pg_catalog.text
           FROM {schema}.backfill_status s WHERE s.id OPERATOR(pg_catalog.=) {node_id}",
        values.join(", ")
    )
}

/// Ends the coordinator's backfill as one of its nodes' ended, with why; false when it no longer
/// ran (paused or cancelled meanwhile: the control function passed that on to the nodes).
fn end(backfill_id: i64, state: JobState, error: Option<(&str, &str)>) -> bool {
    let ended = job::move_job(backfill_id, &[JobState::Running], state, None, error);
    if ended {
        log!("{}: {state} {}", who(backfill_id), error.map(|(_, why)| why).unwrap_or_default());
    }
    ended
}

/// Calls `function` (backfill_cancel, backfill_pause) of the nodes' backfills that are in one of
/// the states `from` there; a node that cannot be reached is logged (its backfill is stopped by
/// hand there, by backfill_cancel on the coordinator, or runs to its end).
fn control_on_nodes<'a>(
    backfill_id: i64,
    node_backfills: impl Iterator<Item = &'a (Node, i64)>,
    function: &str,
    from: &[&str],
) {
    let commands: Vec<(Node, String)> = node_backfills
        .map(|(node, node_id)| (node.clone(), nodes::control_statement(function, "", *node_id, from)))
        .collect();
    for ((node, _), answer) in commands.iter().zip(nodes::run(&commands)) {
        if let Err(message) = answer {
            log!("{}: could not call {function} of its backfill on worker node {node}: {message}", who(backfill_id));
        }
    }
}
