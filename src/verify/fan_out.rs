//! What verification asks of a table whose rows are spread over other servers (a Citus
//! distributed table, on its coordinator): each server answers for its part, and the answers are
//! put together. Verification defines the questions ([`FanOut`]); the Citus side answers them
//! (citus/verify.rs), and the SQL functions hand it in (api/verify.rs), so that verification
//! names no distribution. A spread table's checksum, put together here from its parts.

use crate::verify::checksum::{self, Level, RangeRow};
use pgrx::prelude::*;
use pgrx::JsonB;

/// The questions verification asks of a spread table. Its callers have refused what such a
/// table cannot answer (citus/rules.rs): a column list, the aggregate level. (RefUnwindSafe: a
/// comparison runs inside PostgreSQL's error handling, which a panic crosses.)
pub trait FanOut: std::panic::RefUnwindSafe {
    /// Whether `relid`'s rows are spread over other servers, so that these questions answer for it.
    fn spreads(&self, relid: pg_sys::Oid) -> bool;

    /// Bounds of about `ranges` ranges of equal rows, from a sample of the keys of all its parts.
    fn sampled_bounds(&self, relid: pg_sys::Oid, key: &[(String, String)], ranges: i32) -> Vec<serde_json::Value>;

    /// (rows, checksum) of each range between `bounds` (one more range than bounds), as one table
    /// of its rows would give them: the parts' sums, added up range by range.
    fn range_sums(&self, relid: pg_sys::Oid, bounds: &[serde_json::Value], level: Level) -> Vec<(i64, Option<String>)>;

    /// Where its streams stand now: every change committed so far, on every server, is before it.
    fn stream_position(&self, relid: pg_sys::Oid) -> Box<dyn StreamMark>;
}

/// A spread table's stream position: one on each server that holds a part.
pub trait StreamMark {
    /// Whether the consumer of `slot` confirmed this position on every server; a server without
    /// the slot is an error naming it.
    fn confirmed(&self, slot: &str) -> bool;
}

/// The checksum of a spread table: the same rows and sums, range by range, as the checksum of
/// one table holding its rows.
pub fn checksum(
    relid: pg_sys::Oid,
    ranges: Option<i32>,
    level: Level,
    bounds: Option<JsonB>,
    fan_out: &dyn FanOut,
) -> Vec<RangeRow> {
    let name = crate::model::table::relation_name(relid);
    checksum::require_readable(relid, &name);
    let key = checksum::key_columns(relid, &name);
    let bounds = match bounds {
        // Given bounds are cast to the key's types as the table's owner (privilege::read_as_owner).
        Some(_) => crate::pg::privilege::read_as_owner(relid, || {
            checksum::checksum_bounds(relid, &key, ranges, bounds, |_| Vec::new())
        }),
        None => {
            checksum::checksum_bounds(relid, &key, ranges, None, |ranges| fan_out.sampled_bounds(relid, &key, ranges))
        }
    };
    // (Each server's backfill_checksum() reads its part as its owner.)
    let sums = fan_out.range_sums(relid, &bounds, level);
    sums.into_iter()
        .enumerate()
        .map(|(i, (rows, checksum))| {
            let lower = i.checked_sub(1).map(|b| JsonB(bounds[b].clone()));
            let upper = bounds.get(i).map(|b| JsonB(b.clone()));
            (i as i32 + 1, lower, upper, rows, checksum)
        })
        .collect()
}
