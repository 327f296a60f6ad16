//! What a backfill or a verification of a Citus distributed table does not take: one table of
//! rules, one wording. Such a table is read on its worker nodes, by the backfills and checksums
//! the coordinator starts there; an option the nodes are not given is refused before anything
//! starts, here or on a node.

use crate::model::table;
use crate::pg::errors::raise;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;

/// An option of backfill_start(), backfill_estimate(), backfill_checksum(),
/// backfill_compare() or backfill_repair() that the worker nodes are not given (as the callers
/// name it), and why; with what to pass instead, where something else serves.
struct Rule {
    option: &'static str,
    why: &'static str,
    instead: Option<&'static str>,
}

/// The aggregate checksum level, as [`refuse`] names it.
pub const AGGREGATE_LEVEL: &str = "level => 'aggregate'";

const NOT_PASSED_ON: &[Rule] = &[
    Rule::without("filter", "the nodes' backfills take no filter yet"),
    Rule::without("columns", "the nodes' backfills and checksums cover every column"),
    Rule::without("keys", "backfill_repair() finds the shard of each key; backfill_start() does not"),
    Rule::without("max_replica_lag", "each node's backfill.max_replica_lag holds its backfill back"),
    Rule::without("max_retained_wal", "each node's backfill.max_retained_wal holds its backfill back"),
    Rule::without("max_active_sessions", "each node's backfill.max_active_sessions holds its backfill back"),
    Rule::without("rows_per_message", "each node's backfill.rows_per_message shapes its messages"),
    Rule {
        option: AGGREGATE_LEVEL,
        why: "a range's aggregate checksum is an md5 of its per-column aggregates, which do not add up over \
              shards; the count and hash levels' sums do",
        instead: Some("level => 'hash'"),
    },
];

impl Rule {
    /// An option refused with nothing to pass instead: the call goes without it.
    const fn without(option: &'static str, why: &'static str) -> Rule {
        Rule { option, why, instead: None }
    }
}

/// Why `call` of `relid` cannot take the options `given` (named as in the SQL functions), or None
/// when it can: `relid` is no distributed table, or none of them is refused.
pub fn refusal(call: &str, relid: pg_sys::Oid, given: &[&str]) -> Option<(String, String, String)> {
    let refused: Vec<&Rule> = NOT_PASSED_ON.iter().filter(|rule| given.contains(&rule.option)).collect();
    if refused.is_empty() || !crate::pg::citus::is_distributed(relid) {
        return None;
    }
    let name = table::relation_name(relid);
    let options: Vec<&str> = refused.iter().map(|rule| rule.option).collect();
    let reasons: Vec<&str> = refused.iter().map(|rule| rule.why).collect();
    let fixes: Vec<String> = refused
        .iter()
        .map(|rule| match rule.instead {
            Some(instead) => format!("with {instead}"),
            None => format!("without {} => ...", rule.option),
        })
        .collect();
    Some((
        format!("{call}() of distributed table {name} cannot take {}", options.join(", ")),
        format!("A distributed table is read on its worker nodes, which are not given it: {}.", reasons.join("; ")),
        format!("Call {call}() {}.", fixes.join(", ")),
    ))
}

/// [`refusal`], raised (0A000).
pub fn refuse(call: &str, relid: pg_sys::Oid, given: &[&str]) {
    if let Some((message, detail, hint)) = refusal(call, relid, given) {
        raise(ERRCODE_FEATURE_NOT_SUPPORTED, message, detail, Some(hint));
    }
}
