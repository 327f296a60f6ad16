//! A Citus distributed table's checksums, on the coordinator: each worker node sums its shards over
//! the same ranges, and the sums are added up range by range (see docs/citus.md).

use crate::citus::nodes::{self, literal, Node};
use crate::pg::errors::raise;
use crate::verify::checksum::{self, Level, RangeRow};
use pgrx::prelude::*;
use pgrx::JsonB;
use pgrx::PgSqlErrorCode::*;

/// Sampled keys per range of a distributed table's bounds, and at least this many in all (as
/// a table's own, checksum.rs).
const SAMPLE_PER_RANGE: f64 = 30.0;
const MIN_SAMPLE: f64 = 10_000.0;

/// The checksum of a distributed table: the same rows and sums, range by range, as the checksum
/// of one table holding its rows.
pub fn checksum(relid: pg_sys::Oid, ranges: Option<i32>, level: Level, bounds: Option<JsonB>) -> Vec<RangeRow> {
    let name = crate::model::table::relation_name(relid);
    refuse_aggregate_level(&name, level);
    checksum::require_readable(relid, &name);
    let key = checksum::key_columns(relid, &name);
    let bounds = match bounds {
        // Given bounds are cast to the key's types as the table's owner (privilege::read_as_owner).
        Some(_) => crate::pg::privilege::read_as_owner(relid, || {
            checksum::checksum_bounds(relid, &key, ranges, bounds, |_| Vec::new())
        }),
        None => checksum::checksum_bounds(relid, &key, ranges, None, |ranges| sampled_bounds(relid, &key, ranges)),
    };
    // (Each node's backfill_checksum() reads its shards as their owner.)
    let sums = range_sums(relid, &bounds, level);
    sums.into_iter()
        .enumerate()
        .map(|(i, (rows, checksum))| {
            let lower = i.checked_sub(1).map(|b| JsonB(bounds[b].clone()));
            let upper = bounds.get(i).map(|b| JsonB(b.clone()));
            (i as i32 + 1, lower, upper, rows, checksum)
        })
        .collect()
}

/// The count and hash levels add up over shards; the aggregate level (an md5 of each range's
/// per-column aggregates) does not.
pub fn refuse_aggregate_level(name: &str, level: Level) {
    if level == Level::Aggregate {
        raise(
            ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("the aggregate level cannot checksum distributed table {name}"),
            "Its checksum of a range is an md5 of the range's per-column aggregates, which do not add up over \
             shards; the count and hash levels do.",
            Some("level => 'hash'".into()),
        );
    }
}

/// (rows, checksum) of each range of the distributed table between `bounds` (one more range than
/// bounds), as a table of its rows would give them: each node sums its shards range by range, and
/// the nodes' sums are added up.
pub fn range_sums(relid: pg_sys::Oid, bounds: &[serde_json::Value], level: Level) -> Vec<(i64, Option<String>)> {
    let name = crate::model::table::relation_name(relid);
    refuse_aggregate_level(&name, level);
    let bounds_literal = literal(&serde_json::Value::Array(bounds.to_vec()).to_string());
    let schema = nodes::extension_schema();
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
            Ok(Err(e)) => node_failed(node, &name, &format!("its answer was not a checksum ({e})")),
            Err(message) => node_failed(node, &name, message.trim_start_matches("ERROR:").trim()),
        };
        for (range, range_rows, sum) in parts {
            let Some(i) = usize::try_from(range - 1).ok().filter(|i| *i < rows.len()) else {
                node_failed(node, &name, &format!("it answered for range {range}"))
            };
            rows[i] += range_rows;
            sums[i] += sum.and_then(|s| s.parse::<i128>().ok()).unwrap_or(0);
        }
    }
    rows.into_iter().zip(sums).map(|(rows, sum)| (rows, (level == Level::Hash).then(|| sum.to_string()))).collect()
}

/// Bounds from a sample of the distributed table's keys: Citus draws it from every shard (a
/// materialized query, run on the nodes), and the bounds are placed here.
pub fn sampled_bounds(relid: pg_sys::Oid, key: &[(String, String)], ranges: i32) -> Vec<serde_json::Value> {
    if ranges == 1 {
        return Vec::new();
    }
    // (The nodes' estimate as the caller, whose grants their functions need; the sample of the
    // keys as the table's owner, as any read of the table: privilege::read_as_owner.)
    let rows =
        crate::citus::estimate::estimate(relid, 1000).and_then(Result::ok).map(|e| e.rows).unwrap_or(0).max(1) as f64;
    let fraction = ((SAMPLE_PER_RANGE * f64::from(ranges)).max(MIN_SAMPLE) / rows).min(1.0);
    let columns: Vec<String> = key.iter().map(|(n, _)| crate::pg::encoding::quote_ident(n)).collect();
    let with = format!(
        "WITH sample AS MATERIALIZED (SELECT {} FROM {} WHERE pg_catalog.random() OPERATOR(pg_catalog.<) {fraction})",
        columns.join(", "),
        crate::pg::spi::qualified_name(relid)
    );
    crate::pg::privilege::read_as_owner(relid, || checksum::bounds_of_sample(key, ranges, &with, "sample AS s"))
}

fn node_failed(node: &Node, table: &str, why: &str) -> ! {
    raise(
        ERRCODE_CONNECTION_FAILURE,
        format!("worker node {node} could not checksum its shards of distributed table {table}"),
        format!("On worker node {node}: {why}."),
        Some(
            "The role needs SELECT on the table and EXECUTE on backfill_checksum on every node (docs/citus.md).".into(),
        ),
    )
}
