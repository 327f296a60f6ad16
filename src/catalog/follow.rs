//! The state tables of follows (`backfill_follow()`): `backfill.follow`, one row per follow of a
//! publication into a slot, with the options of the backfills it starts and the tables it knows
//! the publication to hold; and `backfill.follow_table`, its queue, one row per table added to
//! the publication, in the order added. Every read and write of them; the API (`api/follow.rs`)
//! decides what to write.

use crate::model::request::SourceOptions;
use crate::pg::encoding::Text;
use crate::pg::errors::OrInternal;
use pgrx::prelude::*;
use pgrx::spi::SpiResult;

/// The options a follow gives every backfill it starts: backfill_start()'s pacing and batching.
#[derive(Clone, Copy)]
pub struct FollowOptions {
    pub batch_size: i32,
    pub rows_per_second: Option<i32>,
    pub parallel: i32,
    pub max_lag: Option<i64>,
    pub source: SourceOptions,
    /// None: backfill.rows_per_message when each backfill starts.
    pub rows_per_message: Option<i32>,
}

/// A live follow (not ended).
pub struct Follow {
    pub id: i64,
    pub publication: String,
    pub slot: String,
    /// The role that created it, whose rights every backfill it starts has.
    pub role: pg_sys::Oid,
    pub options: FollowOptions,
    /// The settings a start reads from its session, as the session that created the follow had
    /// them: (name, value).
    pub settings: Vec<(String, String)>,
    /// The relations the publication listed when the follow last looked
    /// (pg_publication_tables), and their leaves (a plain table is its own leaf).
    pub known_tables: Vec<pg_sys::Oid>,
    pub known_leaves: Vec<pg_sys::Oid>,
}

/// Where a queued table stands. `pending` waits for the slot; `started` is in the backfill the
/// entry names; `skipped` needed no backfill (removed from the publication or dropped before its
/// turn, already being backfilled into the slot, empty when added); `failed` could not be
/// started, for the reason recorded.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum EntryState {
    Pending,
    Started,
    Skipped,
    Failed,
}

impl EntryState {
    pub fn as_str(self) -> &'static str {
        match self {
            EntryState::Pending => "pending",
            EntryState::Started => "started",
            EntryState::Skipped => "skipped",
            EntryState::Failed => "failed",
        }
    }
}

/// Why an entry was skipped, or failed: its reason, and for a failure the error's SQLSTATE and
/// detail, as backfill_errors shows them.
#[derive(Default)]
pub struct Why<'a> {
    pub reason: &'a str,
    pub sqlstate: Option<&'a str>,
    pub detail: Option<&'a str>,
}

impl<'a> Why<'a> {
    pub fn skipped(reason: &'a str) -> Why<'a> {
        Why { reason, ..Default::default() }
    }
}

/// A queued table, pending.
pub struct Entry {
    pub entry: i64,
    pub relid: pg_sys::Oid,
    pub table_name: String,
}

const FOLLOW_COLUMNS: &str = "id, publication_name::pg_catalog.text, slot_name::pg_catalog.text, created_by,
       batch_size, rows_per_second, parallel, max_lag_bytes, max_replica_lag_bytes, max_retained_wal_bytes,
       max_active_sessions, rows_per_message, known_tables, known_leaves, settings";

fn follows(condition: &str, args: &[pgrx::datum::DatumWithOid]) -> Vec<Follow> {
    let sql =
        format!("SELECT {FOLLOW_COLUMNS} FROM backfill.follow WHERE ended_at IS NULL AND {condition} ORDER BY id");
    let read: SpiResult<Vec<Follow>> = Spi::connect(|client| {
        client
            .select(&sql, None, args)?
            .map(|row| {
                Ok(Follow {
                    id: row.get(1)?.unwrap_or_default(),
                    publication: row.get::<Text>(2)?.map(|t| t.0).unwrap_or_default(),
                    slot: row.get::<Text>(3)?.map(|t| t.0).unwrap_or_default(),
                    role: row.get(4)?.unwrap_or(pg_sys::InvalidOid),
                    options: FollowOptions {
                        batch_size: row.get(5)?.unwrap_or(1000),
                        rows_per_second: row.get(6)?,
                        parallel: row.get(7)?.unwrap_or(1),
                        max_lag: row.get(8)?,
                        source: SourceOptions {
                            max_replica_lag: row.get(9)?,
                            max_retained_wal: row.get(10)?,
                            max_active_sessions: row.get::<i32>(11)?.map(i64::from),
                        },
                        rows_per_message: row.get(12)?,
                    },
                    known_tables: row.get(13)?.unwrap_or_default(),
                    known_leaves: row.get(14)?.unwrap_or_default(),
                    settings: settings_of(row.get::<pgrx::JsonB>(15)?),
                })
            })
            .collect()
    });
    read.or_internal("read the follows")
}

/// A follow's recorded settings, as (name, value) pairs.
fn settings_of(recorded: Option<pgrx::JsonB>) -> Vec<(String, String)> {
    let Some(pgrx::JsonB(serde_json::Value::Object(settings))) = recorded else { return Vec::new() };
    settings.into_iter().filter_map(|(name, value)| Some((name, value.as_str()?.to_string()))).collect()
}

/// Every live follow of this database.
pub fn live_follows() -> Vec<Follow> {
    follows("true", &[])
}

/// The live follow of `publication` into `slot`, if there is one.
pub fn live_follow(publication: &str, slot: &str) -> Option<i64> {
    crate::pg::spi::select_one::<i64>(
        "SELECT id FROM backfill.follow
          WHERE ended_at IS NULL AND publication_name OPERATOR(pg_catalog.=) $1 AND slot_name OPERATOR(pg_catalog.=) $2",
        &[Text::from(publication).into(), Text::from(slot).into()],
    )
    .or_internal("read the follows")
}

/// The name of the role that created follow `follow_id`, if it still exists.
pub fn creator(follow_id: i64) -> Option<String> {
    crate::pg::spi::select_one::<Text>(
        "SELECT r.rolname::pg_catalog.text FROM backfill.follow f
           JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) f.created_by
          WHERE f.id OPERATOR(pg_catalog.=) $1",
        &[follow_id.into()],
    )
    .or_internal("read the follow")
    .map(|t| t.0)
}

/// Whether any follow is live: the cheap test every DDL statement the event trigger sees makes.
pub fn any_live_follow() -> bool {
    crate::pg::spi::select_one::<bool>("SELECT EXISTS (SELECT FROM backfill.follow WHERE ended_at IS NULL)", &[])
        .or_internal("read the follows")
        .unwrap_or(false)
}

/// Records a new follow; returns its id.
pub fn insert_follow(
    publication: &str,
    slot: &str,
    role: pg_sys::Oid,
    options: &FollowOptions,
    settings: &pgrx::JsonB,
    known: (&[pg_sys::Oid], &[pg_sys::Oid]),
) -> i64 {
    Spi::get_one_with_args::<i64>(
        "INSERT INTO backfill.follow (publication_name, slot_name, created_by, batch_size, rows_per_second, parallel,
                                      max_lag_bytes, max_replica_lag_bytes, max_retained_wal_bytes, max_active_sessions,
                                      rows_per_message, known_tables, known_leaves, settings)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) RETURNING id",
        &[
            Text::from(publication).into(),
            Text::from(slot).into(),
            role.into(),
            options.batch_size.into(),
            options.rows_per_second.into(),
            options.parallel.into(),
            options.max_lag.into(),
            options.source.max_replica_lag.into(),
            options.source.max_retained_wal.into(),
            options.source.max_active_sessions.map(|v| v as i32).into(),
            options.rows_per_message.into(),
            known.0.to_vec().into(),
            known.1.to_vec().into(),
            pgrx::JsonB(settings.0.clone()).into(),
        ],
    )
    .map(|id| id.unwrap_or_default())
    .or_internal("record the follow")
}

/// The relations and leaves the follow now knows the publication to hold.
pub fn set_known(follow_id: i64, tables: &[pg_sys::Oid], leaves: &[pg_sys::Oid]) {
    Spi::run_with_args(
        "UPDATE backfill.follow SET known_tables = $2, known_leaves = $3 WHERE id OPERATOR(pg_catalog.=) $1",
        &[follow_id.into(), tables.to_vec().into(), leaves.to_vec().into()],
    )
    .or_internal("record the follow's tables")
}

/// Queues `relid` (named `table_name` now) for the follow, in `state` (pending, or already
/// skipped or failed, with why).
pub fn enqueue(follow_id: i64, relid: pg_sys::Oid, table_name: &str, state: EntryState, why: Option<&Why>) {
    Spi::run_with_args(
        "INSERT INTO backfill.follow_table (follow_id, relid, table_name, state, reason, sqlstate, detail, settled_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7,
                 CASE WHEN $4 OPERATOR(pg_catalog.<>) 'pending' THEN pg_catalog.clock_timestamp() END)",
        &[
            follow_id.into(),
            relid.into(),
            Text::from(table_name).into(),
            state.as_str().into(),
            why.map(|why| Text::from(why.reason)).into(),
            why.and_then(|why| why.sqlstate).into(),
            why.and_then(|why| why.detail).map(Text::from).into(),
        ],
    )
    .or_internal("queue a table")
}

/// Whether `relid` waits in the follow's queue already.
pub fn is_pending(follow_id: i64, relid: pg_sys::Oid) -> bool {
    crate::pg::spi::select_one::<bool>(
        "SELECT EXISTS (SELECT FROM backfill.follow_table WHERE follow_id OPERATOR(pg_catalog.=) $1
                           AND relid OPERATOR(pg_catalog.=) $2 AND state OPERATOR(pg_catalog.=) 'pending')",
        &[follow_id.into(), relid.into()],
    )
    .or_internal("read the follow's queue")
    .unwrap_or(false)
}

/// The follow's pending tables, oldest first.
pub fn pending(follow_id: i64) -> Vec<Entry> {
    let read: SpiResult<Vec<Entry>> = Spi::connect(|client| {
        client
            .select(
                "SELECT entry, relid, table_name FROM backfill.follow_table
                  WHERE follow_id OPERATOR(pg_catalog.=) $1 AND state OPERATOR(pg_catalog.=) 'pending' ORDER BY entry",
                None,
                &[follow_id.into()],
            )?
            .map(|row| {
                Ok(Entry {
                    entry: row.get(1)?.unwrap_or_default(),
                    relid: row.get(2)?.unwrap_or(pg_sys::InvalidOid),
                    table_name: row.get::<Text>(3)?.map(|t| t.0).unwrap_or_default(),
                })
            })
            .collect()
    });
    read.or_internal("read the follow's queue")
}

/// Moves pending entries on: to `state`, with the backfill that started them or why not.
pub fn settle(entries: &[i64], state: EntryState, backfill_id: Option<i64>, why: Option<&Why>) {
    Spi::run_with_args(
        "UPDATE backfill.follow_table
            SET state = $2, backfill_id = $3, reason = $4, sqlstate = $5, detail = $6,
                settled_at = pg_catalog.clock_timestamp()
          WHERE entry OPERATOR(pg_catalog.=) ANY ($1) AND state OPERATOR(pg_catalog.=) 'pending'",
        &[
            entries.to_vec().into(),
            state.as_str().into(),
            backfill_id.into(),
            why.map(|why| Text::from(why.reason)).into(),
            why.and_then(|why| why.sqlstate).into(),
            why.and_then(|why| why.detail).map(Text::from).into(),
        ],
    )
    .or_internal("record the follow's queue")
}

/// A pending entry of `relid` is skipped: the table left the publication, or was dropped.
pub fn skip_pending(follow_id: i64, relid: pg_sys::Oid, reason: &str) {
    Spi::run_with_args(
        "UPDATE backfill.follow_table SET state = 'skipped', reason = $3, settled_at = pg_catalog.clock_timestamp()
          WHERE follow_id OPERATOR(pg_catalog.=) $1 AND relid OPERATOR(pg_catalog.=) $2
            AND state OPERATOR(pg_catalog.=) 'pending'",
        &[follow_id.into(), relid.into(), Text::from(reason).into()],
    )
    .or_internal("record the follow's queue")
}

/// The follow started backfill `backfill_id`.
pub fn record_start(follow_id: i64, backfill_id: i64) {
    Spi::run_with_args(
        "UPDATE backfill.follow SET last_started_at = pg_catalog.clock_timestamp(), last_backfill_id = $2
          WHERE id OPERATOR(pg_catalog.=) $1",
        &[follow_id.into(), backfill_id.into()],
    )
    .or_internal("record the follow's backfill")
}

/// The follow could not start a backfill: its last error.
pub fn record_error(follow_id: i64, error: &str) {
    Spi::run_with_args(
        "UPDATE backfill.follow SET last_error = $2, last_error_at = pg_catalog.clock_timestamp()
          WHERE id OPERATOR(pg_catalog.=) $1",
        &[follow_id.into(), Text::from(error).into()],
    )
    .or_internal("record the follow's error")
}

/// Ends the follow, for `reason`; its pending tables are skipped. False if it had ended.
pub fn end_follow(follow_id: i64, reason: &str) -> bool {
    let ended = Spi::connect_mut(|client| {
        let ended = !client
            .update(
                "UPDATE backfill.follow SET ended_at = pg_catalog.clock_timestamp(), end_reason = $2
                  WHERE id OPERATOR(pg_catalog.=) $1 AND ended_at IS NULL RETURNING id",
                None,
                &[follow_id.into(), Text::from(reason).into()],
            )?
            .is_empty();
        client.update(
            "UPDATE backfill.follow_table SET state = 'skipped', reason = 'the follow ended: ' OPERATOR(pg_catalog.||) $2,
                    settled_at = pg_catalog.clock_timestamp()
              WHERE follow_id OPERATOR(pg_catalog.=) $1 AND state OPERATOR(pg_catalog.=) 'pending'",
            None,
            &[follow_id.into(), Text::from(reason).into()],
        )?;
        Ok::<_, pgrx::spi::Error>(ended)
    });
    ended.or_internal("end the follow")
}
