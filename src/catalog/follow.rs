//! The state tables of follows (`backfill_follow()`): `backfill.follow`, one row per follow of a
//! publication into a slot, with the options of the backfills it starts and the tables it knows
//! the publication to hold; and `backfill.follow_table`, its queue, one row per table added to
//! the publication, in the order added. Every read and write of them; the follows' work (`follow/`)
//! decides what to write.

use crate::model::request::{SourceOptions, StartOptions};
use crate::pg::encoding::Text;
use crate::pg::errors::OrInternal;
use pgrx::prelude::*;
use pgrx::spi::SpiResult;

/// A live follow (not ended).
pub struct Follow {
    pub id: i64,
    pub publication: String,
    pub slot: String,
    /// The role that created it, whose rights every backfill it starts has.
    pub role: pg_sys::Oid,
    /// The options of every backfill it starts.
    pub options: StartOptions,
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
                    options: StartOptions {
                        batch_size: row.get(5)?.unwrap_or(1000),
                        rows_per_second: row.get(6)?,
                        parallel: row.get(7)?.unwrap_or(1),
                        max_lag: row.get(8)?,
                        source: SourceOptions::of_arguments(row.get(9)?, row.get(10)?, row.get(11)?),
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

/// Live follow `follow_id`, as this statement's snapshot has it; None if it has ended.
pub fn live_follow_by_id(follow_id: i64) -> Option<Follow> {
    follows("id OPERATOR(pg_catalog.=) $1", &[follow_id.into()]).pop()
}

/// Live follow `follow_id`, locked until this transaction ends (FOR UPDATE), as the newest
/// committed version has it: what a follow knows is read and written under this lock, so that
/// two statements that change its publication at once each see the other's update, or wait for
/// it. None if it has ended.
pub fn lock_live_follow(follow_id: i64) -> Option<Follow> {
    let locked = Spi::connect_mut(|client| {
        client
            .update(
                "SELECT id FROM backfill.follow WHERE id OPERATOR(pg_catalog.=) $1 AND ended_at IS NULL FOR UPDATE",
                None,
                &[follow_id.into()],
            )
            .map(|rows| !rows.is_empty())
    })
    .or_internal("lock the follow");
    // (Read again by a statement of its own: in READ COMMITTED its snapshot, taken after the
    // lock was granted, has what the statement that held the lock committed.)
    locked.then(|| live_follow_by_id(follow_id)).flatten()
}

/// The live follows the statement now ending (in an event trigger) may have added tables to,
/// each with the relations the statement created. A follow is among them when the statement
/// changed a publication (its own or any publication's table or schema list), when its
/// publication is gone, or when a permanent table or partitioned table the statement created or
/// altered (or a partition under it) is one the follow does not know: only such a statement can
/// have added a relation, or a leaf, to what its publication holds. Every live follow when the
/// statement is on a publication (`on_a_publication`). Any other statement (an
/// ALTER TABLE of a table the follow knows, a temporary table's) reads nothing more than this.
pub fn follows_the_statement_may_change(on_a_publication: bool, created: &[pg_sys::Oid]) -> Vec<i64> {
    let read: SpiResult<Vec<i64>> = Spi::connect(|client| {
        client
            .select(
                "WITH command AS (
                     SELECT c.classid, c.objid FROM pg_catalog.pg_event_trigger_ddl_commands() c
                 ), touched AS (
                     -- (Looked up relation by relation, in a subquery the planner keeps: joined,
                     -- pg_class would be scanned for the rows it guesses the commands are.)
                     SELECT t.relid
                       FROM command x
                      CROSS JOIN LATERAL (SELECT x.objid
                                          UNION SELECT p.relid FROM pg_catalog.pg_partition_tree(x.objid) p) t (relid)
                      WHERE x.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                        AND (SELECT r.relkind OPERATOR(pg_catalog.=) ANY ('{r,p}'::\"char\"[])
                                    AND r.relpersistence OPERATOR(pg_catalog.<>) 't'
                               FROM pg_catalog.pg_class r WHERE r.oid OPERATOR(pg_catalog.=) t.relid)
                 )
                 SELECT f.id
                   FROM backfill.follow f
                   LEFT JOIN pg_catalog.pg_publication p ON p.pubname OPERATOR(pg_catalog.=) f.publication_name
                  WHERE f.ended_at IS NULL
                    AND ($2 OR p.oid IS NULL
                         OR EXISTS (SELECT FROM command x
                                     WHERE x.classid OPERATOR(pg_catalog.=) ANY (ARRAY['pg_catalog.pg_publication_rel'::pg_catalog.regclass,
                                                                                      'pg_catalog.pg_publication_namespace'::pg_catalog.regclass])
                                        OR (x.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_publication'::pg_catalog.regclass
                                            AND x.objid OPERATOR(pg_catalog.=) p.oid))
                         OR EXISTS (SELECT FROM touched t
                                     WHERE t.relid OPERATOR(pg_catalog.=) ANY ($1)
                                        OR NOT (t.relid OPERATOR(pg_catalog.=) ANY (f.known_tables)
                                                OR t.relid OPERATOR(pg_catalog.=) ANY (f.known_leaves))))
                  ORDER BY f.id",
                None,
                &[created.to_vec().into(), on_a_publication.into()],
            )?
            .map(|row| Ok(row.get::<i64>(1)?.unwrap_or_default()))
            .collect()
    });
    read.or_internal("read what the statement changed")
}

/// The tables the statement now ending (in an event trigger) created: new, whatever a follow
/// may know of a dropped relation whose oid one of them took.
pub fn relations_created_by_the_statement() -> Vec<pg_sys::Oid> {
    let read: SpiResult<Vec<pg_sys::Oid>> = Spi::connect(|client| {
        client
            .select(
                "SELECT c.objid FROM pg_catalog.pg_event_trigger_ddl_commands() c
                  WHERE c.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                    AND c.command_tag OPERATOR(pg_catalog.=) ANY ('{CREATE TABLE,CREATE TABLE AS,SELECT INTO}'::pg_catalog.text[])",
                None,
                &[],
            )?
            .map(|row| Ok(row.get::<pg_sys::Oid>(1)?.unwrap_or(pg_sys::InvalidOid)))
            .collect()
    });
    read.or_internal("read what the statement created")
}

/// Whether any follow is live.
pub fn any_live_follow() -> bool {
    crate::pg::spi::select_one::<bool>("SELECT EXISTS (SELECT FROM backfill.follow WHERE ended_at IS NULL)", &[])
        .or_internal("read the follows")
        .unwrap_or(false)
}

/// Where the follow's queue stands for backfill_follow_wait(), on a fresh snapshot: how many of
/// its tables queued up to entry `up_to` (all, when None) still wait; whether one of those was
/// queued by this transaction (its start waits for the commit); the follow's last started
/// backfill; and whether the follow has ended.
pub struct QueueProgress {
    pub last_entry: Option<i64>,
    pub waiting: i64,
    pub queued_here: bool,
    pub last_backfill_id: Option<i64>,
    pub ended: bool,
}

pub fn queue_progress(follow_id: i64, up_to: Option<i64>) -> QueueProgress {
    let read = crate::pg::spi::with_fresh_snapshot(|| {
        Spi::connect(|client| {
            let row = client
                .select(
                    "SELECT (SELECT pg_catalog.max(t.entry) FROM backfill.follow_table t WHERE t.follow_id OPERATOR(pg_catalog.=) f.id),
                            (SELECT pg_catalog.count(*) FROM backfill.follow_table t
                              WHERE t.follow_id OPERATOR(pg_catalog.=) f.id AND t.state OPERATOR(pg_catalog.=) 'pending'
                                AND ($2::pg_catalog.int8 IS NULL OR t.entry OPERATOR(pg_catalog.<=) $2)),
                            (SELECT pg_catalog.array_agg(t.xmin::pg_catalog.text::pg_catalog.int8) FROM backfill.follow_table t
                              WHERE t.follow_id OPERATOR(pg_catalog.=) f.id AND t.state OPERATOR(pg_catalog.=) 'pending'),
                            f.last_backfill_id, f.ended_at IS NOT NULL
                       FROM backfill.follow f WHERE f.id OPERATOR(pg_catalog.=) $1",
                    None,
                    &[follow_id.into(), up_to.into()],
                )?
                .first();
            let queued_by: Vec<i64> = row.get(3)?.unwrap_or_default();
            Ok::<_, pgrx::spi::Error>(QueueProgress {
                last_entry: row.get(1)?,
                waiting: row.get(2)?.unwrap_or(0),
                // SAFETY: asks whether an xid is this transaction's (or a subtransaction's); no side effect.
                queued_here: queued_by.iter().any(|xmin| unsafe {
                    pg_sys::TransactionIdIsCurrentTransactionId(pg_sys::TransactionId::from(*xmin as u32))
                }),
                last_backfill_id: row.get(4)?,
                ended: row.get(5)?.unwrap_or(true),
            })
        })
    });
    read.or_internal("read the follow's queue")
}

/// Records a new follow; returns its id.
pub fn insert_follow(
    publication: &str,
    slot: &str,
    role: pg_sys::Oid,
    options: &StartOptions,
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

/// Pending entries of tables dropped since they were queued are skipped: what a DROP TABLE
/// changes in the queues (a statement that drops a table adds none).
pub fn skip_dropped_pending() {
    Spi::run(
        "UPDATE backfill.follow_table t
            SET state = 'skipped', reason = 'removed from the publication or dropped before its turn',
                settled_at = pg_catalog.clock_timestamp()
          WHERE t.state OPERATOR(pg_catalog.=) 'pending'
            AND NOT EXISTS (SELECT FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) t.relid)",
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
