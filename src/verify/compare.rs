//! backfill_compare(): the keys whose rows differ between a source table and its copy, found
//! range by range and settled against the stream; backfill_repair(): a keyed backfill of them.
//!
//! How a comparison goes:
//! 1. **Ranges.** Both tables are checksummed over the same key ranges (checksum.rs; the
//!    bounds are sampled from the source). A range whose rows and checksum agree is done.
//! 2. **Narrowing.** The rows of each differing range are listed on both sides as (key, row
//!    hash); every key whose hash differs, or that one side lacks, is a candidate.
//! 3. **Passes.** Writes go on while this runs, and the copy follows the source through the
//!    stream, a little later. So each candidate is judged in `passes` passes, each of which
//!    reads the source's row, notes the WAL position, waits for the consumer's slot to confirm
//!    that position (the copy then holds every change committed before it), reads the copy's
//!    row, and reads the source's row again. A key whose source row changed during the pass is
//!    moving: the pass says nothing of it. A key whose copy matches is settled and dropped. A
//!    difference on a key that stood still while the copy caught up is real; a key still
//!    moving at the last pass is `unsettled`.
//!
//! The copy may be a postgres_fdw foreign table: its server must have pg_backfill, and the
//! comparison runs its queries there through dblink (over the foreign table's server and user
//! mapping), so that only checksums, and the differing rows' keys and hashes, cross. A source or
//! copy spread over other servers (a Citus distributed table, on its coordinator) is summed,
//! and its stream followed, on each of them, through the [`FanOut`] the SQL functions hand in
//! (api/verify.rs: backfill_compare(), and backfill_repair()'s comparison).

use crate::model::request::{CompareRequest, SlotChoice};
use crate::pg::encoding::Text;
use crate::pg::errors::{raise, OrInternal};
use crate::verify::checksum::{self, Level};
use crate::verify::fan_out::{FanOut, StreamMark};
use crate::verify::sides::{against, disconnect, fresh_snapshot, range_sums, rows_of_keys, target_side, Side};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// Ranges a comparison checks first.
const RANGES: i32 = 1024;
/// How long a pass waits for the slot's consumer to catch up before it gives up on the pass.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);
/// Without a slot, the pause before each pass after the first, for the copy to catch up.
const SETTLE_WITHOUT_SLOT: Duration = Duration::from_secs(1);
const MAX_PASSES: i32 = 100;

/// What differs about a key.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Status {
    Missing,
    Extra,
    Different,
    Unsettled,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Missing => "missing",
            Status::Extra => "extra",
            Status::Different => "different",
            Status::Unsettled => "unsettled",
        }
    }
}

pub struct Found {
    pub keys: Vec<(serde_json::Value, Status)>,
    pub slot: Option<String>,
    /// The columns compared, with a column list: the listed ones and the key's, in the table's
    /// order (what a repair delivers).
    pub columns: Option<Vec<String>>,
}

#[allow(clippy::too_many_arguments)]
pub fn differences(request: CompareRequest, fan_out: &'static dyn FanOut) -> Found {
    let CompareRequest { call: function, source, target, level, passes, slot, columns, starts_backfill } = request;
    let level = Level::parse(&level);
    if !(1..=MAX_PASSES).contains(&passes) {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            format!("passes {passes} is out of range"),
            format!("passes is how often a difference is re-checked, 1 to {MAX_PASSES}."),
            Some("passes => 3".into()),
        );
    }
    // SAFETY: reads this transaction's isolation level.
    if unsafe { pg_sys::XactIsoLevel } != pg_sys::XACT_READ_COMMITTED as i32 {
        raise(
            ERRCODE_ACTIVE_SQL_TRANSACTION,
            format!("{function} must run in a READ COMMITTED transaction"),
            "It re-reads rows as the stream changes them: each read needs a snapshot of its own.",
            Some("Run it on its own, or in a transaction at the default isolation level.".into()),
        );
    }
    checksum::require_readable(source, &crate::model::table::relation_name(source));
    let source_name = crate::model::table::relation_name(source);
    let key = checksum::key_columns(source, &source_name);
    let columns = checksum::hashed_columns(source, &source_name, &key, columns);
    let target_side = target_side(source, target, function, columns.as_deref(), fan_out);
    let source_side = Side::here(source, fan_out);
    let slot = followed_slot(function, source, &source_name, slot);
    if let Some(slot) = &slot {
        if let Side::Spread { .. } = source_side {
            // Its copy follows every server's slot of that name (the backfills there check the
            // right to bind them).
            StreamPosition::now(&source_side).require_slot(slot);
        } else {
            // A repair's backfill is bound to the slot: the right to do that is checked before a
            // comparison that may wait minutes for the slot's consumer, not after it.
            if starts_backfill {
                crate::pg::privilege::require_replication(slot);
            }
            crate::throttle::pipeline::require_slot(slot);
        }
    }
    // With the worker's settings: keys print alike on both sides, and the SQL the comparison
    // writes resolves nothing on the caller's search_path.
    let keys = crate::pg::privilege::with_portable_settings(|| {
        crate::pg::encoding::in_utf8(|| {
            compare_sides(&source_side, &target_side, &key, (level, columns.as_deref()), passes, slot.as_deref())
        })
    });
    // (After an error the connection stays open until the session ends or the next comparison.)
    disconnect(&target_side);
    Found { keys, slot, columns }
}

/// The slot `function` follows, as `choice` says, named in a NOTICE: a comparison that waits on
/// a slot's consumer, perhaps for minutes, says which.
fn followed_slot(function: &str, source: pg_sys::Oid, source_name: &str, choice: SlotChoice) -> Option<String> {
    let (slot, why) = match choice {
        SlotChoice::Named(slot) => (Some(slot), "as given".to_string()),
        SlotChoice::NoSlot => (None, "slot => ''".to_string()),
        SlotChoice::Latest => match crate::pg::privilege::as_extension_owner(|| latest_slot_of(source)) {
            Some((slot, backfill_id)) => (
                Some(slot),
                format!(
                    "that of backfill {backfill_id}, the latest running, paused or done backfill of {source_name} with \
                     a slot; slot => '' follows none"
                ),
            ),
            None => (None, format!("no running, paused or done backfill of {source_name} has one")),
        },
    };
    match &slot {
        Some(name) => notice!(
            "{function} follows replication slot \"{name}\" ({why}): each pass waits up to a minute for its consumer \
             to confirm the source's position"
        ),
        None => notice!("{function} follows no replication slot ({why}): each pass re-reads the copy after a second"),
    }
    slot
}

/// The slot of the latest backfill of the table that had one and is running, paused or done,
/// if the slot still exists; with that backfill's id.
fn latest_slot_of(relid: pg_sys::Oid) -> Option<(String, i64)> {
    crate::pg::spi::select_one::<Text>(
        "SELECT j.slot_name::pg_catalog.text OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) j.id::pg_catalog.text
           FROM backfill.job j
           JOIN backfill.job_table t ON t.job_id OPERATOR(pg_catalog.=) j.id
           JOIN pg_catalog.pg_replication_slots s ON s.slot_name OPERATOR(pg_catalog.=) j.slot_name
                                                AND s.database OPERATOR(pg_catalog.=) pg_catalog.current_database()
          WHERE t.relid OPERATOR(pg_catalog.=) $1::pg_catalog.oid::pg_catalog.regclass
            AND j.state OPERATOR(pg_catalog.=) ANY (ARRAY['running', 'paused', 'done']::pg_catalog.text[])
          ORDER BY j.id DESC LIMIT 1",
        &[relid.into()],
    )
    .or_internal("read the table's backfills")
    .and_then(|t| {
        // (A slot's name has no space: lower-case letters, digits and underscores.)
        let (slot, id) = t.0.rsplit_once(' ')?;
        Some((slot.to_string(), id.parse().ok()?))
    })
}

/// The publication of the latest backfill of the table through `slot`, if it had one: the
/// pipeline a repair through that slot re-delivers to, whose column list bounds what it sends.
pub fn last_publication_of(relid: pg_sys::Oid, slot: &str) -> Option<String> {
    crate::pg::spi::select_one::<Text>(
        "SELECT j.publication_name::pg_catalog.text FROM backfill.job j
           JOIN backfill.job_table t ON t.job_id OPERATOR(pg_catalog.=) j.id
          WHERE t.relid OPERATOR(pg_catalog.=) $1::pg_catalog.oid::pg_catalog.regclass
            AND j.slot_name OPERATOR(pg_catalog.=) $2
          ORDER BY j.id DESC LIMIT 1",
        &[relid.into(), Text::from(slot).into()],
    )
    .or_internal("read the table's backfills")
    .map(|t| t.0)
}

/// Whether slot $1's consumer confirmed position $2 (no row: no such slot).
pub const SLOT_CONFIRMED: &str =
    "SELECT coalesce(s.confirmed_flush_lsn OPERATOR(pg_catalog.>=) $2::pg_catalog.pg_lsn, false)
                           FROM pg_catalog.pg_replication_slots s
                          WHERE s.slot_name OPERATOR(pg_catalog.=) $1 AND s.database OPERATOR(pg_catalog.=) pg_catalog.current_database()";

/// Where the source's stream stands now: every change the source committed so far is before it.
/// A spread table's changes are in the streams of the servers that hold it: a position on each.
enum StreamPosition {
    Here(String),
    Spread(Box<dyn StreamMark>),
}

impl StreamPosition {
    fn now(source: &Side) -> StreamPosition {
        if let Side::Spread { relid, fan_out, .. } = source {
            return StreamPosition::Spread(fan_out.stream_position(*relid));
        }
        // The end of the WAL inserted, not the position of the next record: an asynchronous
        // commit is visible before its record is written.
        let here = crate::pg::spi::select_one::<String>(crate::pg::wal::END_OF_INSERTED_WAL, &[])
            .or_internal("read the WAL position")
            .unwrap_or_default();
        // Sent only once flushed: on an idle source nothing else may flush it for seconds.
        if let Some(end) = crate::pg::wal::lsn_from_text(&here) {
            crate::pg::wal::flush_up_to(end);
        }
        StreamPosition::Here(here)
    }

    /// Whether the consumer of `slot` confirmed this position: on every server, for a spread
    /// source. A server without the slot is an error naming it.
    fn confirmed(&self, slot: &str) -> bool {
        match self {
            StreamPosition::Here(position) => {
                let confirmed = fresh_snapshot(|| {
                    crate::pg::spi::select_one::<bool>(
                        SLOT_CONFIRMED,
                        &[Text(slot.to_string()).into(), Text(position.to_string()).into()],
                    )
                })
                .or_internal("read the slot's position");
                confirmed.unwrap_or_else(|| {
                    crate::throttle::pipeline::require_slot(slot);
                    false
                })
            }
            StreamPosition::Spread(mark) => mark.confirmed(slot),
        }
    }

    /// The slot exists where the copy's stream is read (on every server, for a spread source).
    fn require_slot(&self, slot: &str) {
        self.confirmed(slot);
    }
}

/// Waits until the copy holds every change before `position`: the slot's consumer confirmed
/// it. Without a slot, a fixed pause. False if the consumer did not catch up in time.
fn catch_up(slot: Option<&str>, position: &StreamPosition) -> bool {
    let Some(slot) = slot else {
        crate::throttle::pacing::sleep(SETTLE_WITHOUT_SLOT);
        return true;
    };
    let started = Instant::now();
    loop {
        if position.confirmed(slot) {
            return true;
        }
        if started.elapsed() >= CATCH_UP_TIMEOUT {
            return false;
        }
        // (Asking the other servers takes a connection to each: less often.)
        let interval = if let StreamPosition::Spread(_) = position { 100 } else { 20 };
        crate::throttle::pacing::sleep(Duration::from_millis(interval));
    }
}

fn compare_sides(
    source: &Side,
    target: &Side,
    key: &[(String, String)],
    measure: (Level, Option<&[String]>),
    passes: i32,
    slot: Option<&str>,
) -> Vec<(serde_json::Value, Status)> {
    // 1. Ranges.
    let bounds = source.sampled_bounds(key, RANGES);
    let source_sums = range_sums(source, key, &bounds, measure);
    // (Without a slot, the passes give the copy time; the ranges only find candidates.)
    if slot.is_some() {
        catch_up(slot, &StreamPosition::now(source));
    }
    let target_sums = range_sums(target, key, &bounds, measure);
    // 2. Narrowing.
    let mut candidates = BTreeSet::new();
    for (range, (source_sum, target_sum)) in source_sums.iter().zip(&target_sums).enumerate() {
        if source_sum == target_sum {
            continue;
        }
        let mut condition = Vec::new();
        if range > 0 {
            condition.push(against(key, ">=", &bounds[range - 1]));
        }
        if let Some(upper) = bounds.get(range) {
            condition.push(against(key, "<", upper));
        }
        let condition = if condition.is_empty() { "true".to_string() } else { condition.join(" AND ") };
        let (here, there) =
            (source.rows(key, measure, &condition, false), target.rows(key, measure, &condition, false));
        candidates.extend(here.keys().chain(there.keys()).filter(|k| here.get(*k) != there.get(*k)).cloned());
        // The keys are kept in this backend's memory: a copy far from its source (empty, or
        // of another table) is not a list of differences to keep.
        let most = crate::pg::settings::compare_max_keys();
        if candidates.len() > most {
            raise(
                ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                format!("more than {most} keys of {} differ from {}", source.name(), target.name()),
                format!(
                    "A comparison keeps the keys that differ in memory, at most backfill.compare_max_keys \
                     ({most}); range {} of {} was the one that passed it.",
                    range + 1,
                    bounds.len() + 1
                ),
                Some("When most of the copy is missing or stale, backfill the table again (backfill_start); or raise backfill.compare_max_keys for this session.".into()),
            );
        }
    }
    // 3. Passes.
    let mut verdicts = BTreeMap::new();
    for pass in 0..passes {
        if candidates.is_empty() {
            break;
        }
        let before = rows_of_keys(source, key, measure, &candidates, true);
        // Without a slot, the first pass runs at once, and the next ones after a pause.
        let caught_up = if slot.is_some() || pass > 0 { catch_up(slot, &StreamPosition::now(source)) } else { true };
        let copy = rows_of_keys(target, key, measure, &candidates, false);
        let after = rows_of_keys(source, key, measure, &candidates, true);
        let previous = std::mem::take(&mut verdicts);
        for candidate in &candidates {
            let (was, is) = (before.get(candidate), after.get(candidate));
            // (The copy's rows have no version: they match by hash.)
            let hash_of = |row: Option<&crate::verify::sides::Row>| row.map(|r| r.hash.clone());
            let (is_hash, copied) = (hash_of(is), hash_of(copy.get(candidate)));
            // The copy holds the source's row as it is now: nothing to report, moving or not.
            let status = if is_hash == copied {
                continue;
            } else if was != is || !caught_up {
                Status::Unsettled
            } else if copied.is_none() {
                Status::Missing
            } else if is.is_none() {
                Status::Extra
            } else {
                Status::Different
            };
            verdicts.insert(candidate.clone(), status);
        }
        candidates = verdicts.keys().cloned().collect();
        // Without a slot nothing says when the copy has caught up: differences that stood
        // still through two passes, a pause apart, are taken as real.
        if slot.is_none() && verdicts == previous && !verdicts.values().any(|s| *s == Status::Unsettled) {
            break;
        }
    }
    verdicts
        .into_iter()
        .map(|(key, status)| (serde_json::from_str(&key).unwrap_or(serde_json::Value::Null), status))
        .collect()
}
