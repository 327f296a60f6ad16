//! The state table `backfill.job`, one row per backfill (and its message key): every read and
//! write of them. Its ranges are in `job_table.rs`. The worker and the SQL API share these;
//! nothing else writes them.

use crate::catalog::schema::{self, Capabilities};
use crate::model::state::JobState;
use crate::model::state::LockMode;
use crate::pg::encoding::Text;
use crate::pg::errors::OrInternal;
use crate::pg::spi::run_prepared;
use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;
use pgrx::spi::SpiResult;

/// The pause reason of backfill_pause().
pub const PAUSED_BY_USER: &str = "paused by backfill_pause()";

pub use crate::model::request::SourceOptions;
use crate::model::request::StartRequest;

/// A backfill as the worker and the API need it.
pub struct Job {
    pub state: JobState,
    pub batch_size: i32,
    pub rows_per_second: Option<i32>,
    pub parallel: i32,
    pub message_prefix: String,
    pub started_by: String,
    pub slot_name: Option<String>,
    /// The slot's identity when the backfill started (pipeline::slot_identity): None on an older schema.
    pub slot_identity: Option<String>,
    pub publication_name: Option<String>,
    pub max_lag_bytes: Option<i64>,
    pub lock_mode: LockMode,
    pub source: SourceOptions,
    /// Most rows per message: 1 (and on an older schema) a `read` per row, more `reads` batches.
    pub rows_per_message: i32,
    /// The row filter (`filter => ...`), user SQL run as the starter: only rows it is true for.
    pub row_filter: Option<String>,
}

pub fn job(id: i64) -> Option<Job> {
    // Columns an older schema lacks (before ALTER EXTENSION UPDATE) read as NULL: its backfills
    // lock as auto does, follow the settings and know their slot by its name only.
    let has = schema::capabilities();
    let column = Capabilities::column_or_null;
    let sql = format!(
        "SELECT CASE WHEN {waiting} THEN 'running' ELSE state END,
                batch_size, message_prefix, started_by::pg_catalog.text, rows_per_second, slot_name::pg_catalog.text,
                max_lag_bytes, parallel, {lock_mode}, {max_replica_lag}, {max_retained_wal}, {max_active_sessions},
                {slot_identity}, publication_name::pg_catalog.text, {rows_per_message}, {row_filter}
           FROM backfill.job WHERE id OPERATOR(pg_catalog.=) $1",
        waiting = schema::PAUSED_WHILE_WAITING,
        lock_mode = column(has.job_lock_mode, "lock_mode", "pg_catalog.text"),
        max_replica_lag = column(has.source_limits, "max_replica_lag_bytes", "pg_catalog.int8"),
        max_retained_wal = column(has.source_limits, "max_retained_wal_bytes", "pg_catalog.int8"),
        max_active_sessions = column(has.source_limits, "max_active_sessions::pg_catalog.int8", "pg_catalog.int8"),
        slot_identity = column(has.slot_identity, "slot_identity", "pg_catalog.text"),
        rows_per_message = column(has.rows_per_message, "rows_per_message", "pg_catalog.int4"),
        row_filter = column(has.row_filter, "row_filter", "pg_catalog.text"),
    );
    run_prepared(&sql, false, &[id.into()], |rows| {
        if rows.is_empty() {
            return Ok(None);
        }
        let row = rows.first();
        Ok(Some(Job {
            state: JobState::parse(&row.get::<String>(1)?.unwrap_or_default()),
            batch_size: row.get(2)?.unwrap_or_default(), // NOT NULL
            message_prefix: row.get(3)?.unwrap_or_default(),
            started_by: row.get::<Text>(4)?.map(|t| t.0).unwrap_or_default(),
            rows_per_second: row.get(5)?,
            slot_name: row.get(6)?,
            max_lag_bytes: row.get(7)?,
            parallel: row.get(8)?.unwrap_or(1),
            lock_mode: row.get::<String>(9)?.as_deref().and_then(LockMode::parse).unwrap_or(LockMode::Auto),
            source: SourceOptions {
                max_replica_lag: row.get(10)?,
                max_retained_wal: row.get(11)?,
                max_active_sessions: row.get(12)?,
            },
            slot_identity: row.get(13)?,
            publication_name: row.get::<Text>(14)?.map(|t| t.0),
            rows_per_message: row.get(15)?.unwrap_or(1),
            row_filter: row.get::<Text>(16)?.map(|t| t.0),
        }))
    })
    .or_internal("read the backfill")
}

/// The transaction id that recorded (or last resumed) the backfill, as xmin shows it.
pub fn recorded_by(id: i64) -> Option<i64> {
    crate::pg::spi::select_one(
        "SELECT xmin::pg_catalog.text::bigint FROM backfill.job WHERE id OPERATOR(pg_catalog.=) $1",
        &[id.into()],
    )
    .or_internal("read the backfill")
}

/// Whether backfill `id` was recorded (or last resumed) by this transaction, whose commit its
/// workers wait for.
pub fn recorded_in_this_transaction(id: i64) -> bool {
    let xmin = recorded_by(id);
    // SAFETY: asks whether an xid is this transaction's (or a subtransaction's); no side effect.
    xmin.is_some_and(|xmin| unsafe {
        pg_sys::TransactionIdIsCurrentTransactionId(pg_sys::TransactionId::from(xmin as u32))
    })
}

/// Where a backfill stands for backfill_wait(): its state, whether its consumer confirmed the
/// watermark (done, and without a slot or with the slot past it), and its error.
pub fn outcome(id: i64) -> (JobState, bool, Option<String>) {
    // A fresh snapshot each time, so that a loop sees the worker's commits.
    let outcome: SpiResult<(JobState, bool, Option<String>)> = crate::pg::spi::with_fresh_snapshot(|| {
        Spi::connect(|client| {
            let row = client
                .select(
                    "SELECT j.state,
                        j.state OPERATOR(pg_catalog.=) 'done'
                        AND (j.slot_name IS NULL OR s.confirmed_flush_lsn OPERATOR(pg_catalog.>=) j.watermark_lsn),
                        j.last_error
                   FROM backfill.job j
                   LEFT JOIN pg_catalog.pg_replication_slots s ON s.slot_name OPERATOR(pg_catalog.=) j.slot_name
                                                 AND s.database OPERATOR(pg_catalog.=) pg_catalog.current_database()
                  WHERE j.id OPERATOR(pg_catalog.=) $1",
                    None,
                    &[id.into()],
                )?
                .first();
            Ok((
                JobState::parse(&row.get::<String>(1)?.unwrap_or_default()),
                row.get::<bool>(2)?.unwrap_or(false),
                row.get::<Text>(3)?.map(|t| t.0),
            ))
        })
    });
    outcome.or_internal("read the backfill's state")
}

/// Runs an UPDATE ... RETURNING; whether it changed a row.
fn updated_any(sql: &str, args: &[pgrx::datum::DatumWithOid]) -> SpiResult<bool> {
    Spi::connect_mut(|client| Ok(!client.update(sql, None, args)?.is_empty()))
}

pub fn job_state(id: i64) -> Option<JobState> {
    let state = crate::pg::spi::select_one::<String>(
        "SELECT state FROM backfill.job WHERE id OPERATOR(pg_catalog.=) $1",
        &[id.into()],
    );
    state.or_internal("read the backfill's state").as_deref().map(JobState::parse)
}

/// Backfills of this database that workers should be running, with their number of workers:
/// to relaunch after a restart.
pub fn jobs_to_resume() -> Vec<(i64, i32)> {
    let sql = format!(
        "SELECT id, parallel FROM backfill.job
          WHERE state OPERATOR(pg_catalog.=) 'running' OR {waiting} ORDER BY id",
        waiting = schema::PAUSED_WHILE_WAITING
    );
    let jobs: SpiResult<Vec<(i64, i32)>> = Spi::connect(|client| {
        client
            .select(&sql, None, &[])?
            .map(|row| Ok((row.get::<i64>(1)?.unwrap_or_default(), row.get::<i32>(2)?.unwrap_or(1))))
            .collect()
    });
    jobs.or_internal("list the backfills to resume")
}

/// The backfills that ended (done or cancelled) more than `older_than` ago, with the role that
/// started each: what backfill_purge() may delete. (A failed one is not ended: it may be resumed,
/// or cancelled first.)
pub fn ended_before(older_than: pgrx::datum::Interval) -> Vec<(i64, String)> {
    let ended: SpiResult<Vec<(i64, String)>> = Spi::connect(|client| {
        client
            .select(
                "SELECT id, started_by::pg_catalog.text FROM backfill.job
                  WHERE state OPERATOR(pg_catalog.=) ANY (ARRAY['done', 'cancelled']::pg_catalog.text[])
                    AND finished_at OPERATOR(pg_catalog.<) (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) $1)
                  ORDER BY id",
                None,
                &[older_than.into()],
            )?
            .map(|row| Ok((row.get::<i64>(1)?.unwrap_or_default(), row.get::<String>(2)?.unwrap_or_default())))
            .collect()
    });
    ended.or_internal("list the ended backfills")
}

/// Deletes backfills `ids`, with their tables, keys, shards, progress and errors (ON DELETE
/// CASCADE); returns how many.
pub fn delete_jobs(ids: &[i64]) -> i64 {
    let deleted: SpiResult<i64> = Spi::connect_mut(|client| {
        let gone = client.update(
            "DELETE FROM backfill.job WHERE id OPERATOR(pg_catalog.=) ANY ($1)",
            None,
            &[ids.to_vec().into()],
        )?;
        Ok(gone.len() as i64)
    });
    deleted.or_internal("delete the ended backfills")
}

pub fn set_worker_pid(backfill_id: i64, pid: Option<i32>) {
    Spi::run_with_args(
        "UPDATE backfill.job SET worker_pid = $2 WHERE id OPERATOR(pg_catalog.=) $1",
        &[backfill_id.into(), pid.into()],
    )
    .or_internal("record the worker's pid")
}

/// What backfill_start() records about a new backfill: its whole row, in one INSERT.
pub struct NewJob<'a> {
    pub started_by: &'a str,
    pub batch_size: i32,
    pub rows_per_second: Option<i32>,
    pub parallel: i32,
    pub message_prefix: &'a str,
    pub slot_name: Option<&'a str>,
    pub publication_name: Option<&'a str>,
    pub max_lag_bytes: Option<i64>,
    pub lock_mode: LockMode,
    pub rows_per_message: i32,
    /// The identity of the slot (throttle/pipeline.rs), which its pages check.
    pub slot_identity: Option<String>,
    pub row_filter: Option<&'a str>,
    pub source: SourceOptions,
}

impl<'a> NewJob<'a> {
    /// The backfill `request` asks for, started by `started_by` with messages prefixed
    /// `message_prefix`: its options as given (rows per message: backfill.rows_per_message if
    /// it gives none; its limits on the source as recorded, see
    /// [`StartRequest::recorded_source_limits`]), locked as the lock_mode setting says. The one
    /// place a backfill's row is shaped; a start that records otherwise (a keyed one, a Citus
    /// coordinator's) changes what differs.
    pub fn of_request(request: &'a StartRequest, started_by: &'a str, message_prefix: &'a str) -> NewJob<'a> {
        NewJob {
            started_by,
            batch_size: request.options.batch_size,
            rows_per_second: request.options.rows_per_second,
            parallel: request.options.parallel,
            message_prefix,
            slot_name: request.slot.as_deref(),
            publication_name: request.publication.as_deref(),
            max_lag_bytes: request.options.max_lag,
            lock_mode: LockMode::Auto,
            rows_per_message: request.options.rows_per_message.unwrap_or_else(crate::pg::settings::rows_per_message),
            slot_identity: None,
            row_filter: request.filter.as_deref(),
            source: request.recorded_source_limits(),
        }
    }
}

/// Records a new backfill; returns its id. A column of a later version is named only when its
/// value is not the column's default, so that the SQL of an earlier version, still in place
/// until ALTER EXTENSION UPDATE, records its backfills with this library: rows_per_message and
/// slot_identity (0.7.0) are then left out where the table lacks them (such a backfill sends a
/// `read` per row, and its slot is checked by name).
pub fn insert_job(job: &NewJob) -> i64 {
    let has = schema::capabilities();
    let limit = |value: Option<i64>| value.filter(|v| *v != -1);
    let optional: Vec<(&str, DatumWithOid)> = [
        (job.lock_mode != LockMode::Auto).then(|| ("lock_mode", job.lock_mode.as_str().into())),
        (job.rows_per_message != 1 && has.rows_per_message).then(|| ("rows_per_message", job.rows_per_message.into())),
        job.slot_identity.clone().filter(|_| has.slot_identity).map(|id| ("slot_identity", id.into())),
        job.row_filter.map(|filter| ("row_filter", Text::from(filter).into())),
        limit(job.source.max_replica_lag).map(|v| ("max_replica_lag_bytes", v.into())),
        limit(job.source.max_retained_wal).map(|v| ("max_retained_wal_bytes", v.into())),
        limit(job.source.max_active_sessions).map(|v| ("max_active_sessions", (v as i32).into())),
    ]
    .into_iter()
    .flatten()
    .collect();
    let mut columns = vec![
        "started_by",
        "batch_size",
        "rows_per_second",
        "message_prefix",
        "slot_name",
        "publication_name",
        "max_lag_bytes",
        "parallel",
    ];
    let mut args: Vec<DatumWithOid> = vec![
        Text::from(job.started_by).into(),
        job.batch_size.into(),
        job.rows_per_second.into(),
        job.message_prefix.into(),
        job.slot_name.into(),
        job.publication_name.map(Text::from).into(),
        job.max_lag_bytes.into(),
        job.parallel.into(),
    ];
    for (column, value) in optional {
        columns.push(column);
        args.push(value);
    }
    let values: Vec<String> = (1..=columns.len()).map(|i| format!("${i}")).collect();
    let sql = format!("INSERT INTO backfill.job ({}) VALUES ({}) RETURNING id", columns.join(", "), values.join(", "));
    let id =
        Spi::get_one_with_args::<i64>(&sql, &args).map(|id| id.unwrap_or_default()).or_internal("record the backfill");
    remember_inserted(id);
    id
}

std::thread_local! {
    /// The backfills this backend inserted, and the transaction that inserted them (its top
    /// full transaction id): what [`inserted_in_this_transaction`] asks.
    static INSERTED: std::cell::RefCell<(u64, Vec<i64>)> = const { std::cell::RefCell::new((0, Vec::new())) };
}

fn this_transaction() -> u64 {
    // SAFETY: reads this transaction's id, if it has one; no side effect.
    unsafe { pg_sys::GetTopFullTransactionIdIfAny() }.value
}

fn remember_inserted(id: i64) {
    let transaction = this_transaction();
    INSERTED.with(|inserted| {
        let mut inserted = inserted.borrow_mut();
        if inserted.0 != transaction {
            *inserted = (transaction, Vec::new());
        }
        inserted.1.push(id);
    });
}

/// Whether backfill `id` was inserted by this transaction (and still is: not rolled back to a
/// savepoint), so that no worker has run it yet. Not merely changed by it: backfill_set(),
/// pause and resume make a running backfill's row this transaction's too (its xmin), and the
/// entry points that may only shape a backfill at its start must not reach one that runs.
pub fn inserted_in_this_transaction(id: i64) -> bool {
    let transaction = this_transaction();
    let remembered = INSERTED.with(|inserted| {
        let inserted = inserted.borrow();
        transaction != 0 && inserted.0 == transaction && inserted.1.contains(&id)
    });
    remembered && recorded_in_this_transaction(id)
}

/// A backfill's rows per message (the 0.9.0 SQL's backfill.set_rows_per_message(), in the
/// transaction that started it). (Skipped on an older schema without the column, until ALTER
/// EXTENSION UPDATE: its backfills send a `read` per row.)
pub fn set_rows_per_message(backfill_id: i64, rows_per_message: i32) {
    // (Asked first: an UPDATE naming a column the table lacks fails to parse.)
    if !schema::capabilities().rows_per_message {
        return;
    }
    Spi::run_with_args(
        "UPDATE backfill.job SET rows_per_message = $2 WHERE id OPERATOR(pg_catalog.=) $1",
        &[backfill_id.into(), rows_per_message.into()],
    )
    .or_internal("record the rows per message")
}

/// A backfill's lock mode, when not the column's default (auto). (Its own statement: an older
/// schema, still in place until ALTER EXTENSION UPDATE, has no such column.)
pub fn set_lock_mode(backfill_id: i64, mode: LockMode) {
    Spi::run_with_args(
        "UPDATE backfill.job SET lock_mode = $2 WHERE id OPERATOR(pg_catalog.=) $1",
        &[backfill_id.into(), mode.as_str().into()],
    )
    .or_internal("record the lock mode")
}

/// After a failover, the promoted server's synchronized copy of a backfill's slot becomes the
/// slot it knows (pipeline::blocker): from then on a slot created again under that name on this
/// server is refused as on the first, and a pause and resume here find the slot it watched.
/// (Only when the identity changes: once after a failover. Only on a schema that records it.)
pub fn adopt_slot_identity(backfill_id: i64, identity: &str) {
    if !schema::capabilities().slot_identity {
        return;
    }
    Spi::run_with_args(
        "UPDATE backfill.job SET slot_identity = $2
          WHERE id OPERATOR(pg_catalog.=) $1 AND slot_identity OPERATOR(pg_catalog.<>) $2",
        &[backfill_id.into(), identity.into()],
    )
    .or_internal("record the slot's identity")
}
/// The running backfill that already covers one of these tables, if any, as last committed: the
/// caller holds the start lock (pg/locks.rs), and a start that committed before it took it counts
/// even where the caller's snapshot is older (REPEATABLE READ, SERIALIZABLE).
pub fn running_backfill_of(relid: pg_sys::Oid) -> Option<i64> {
    crate::pg::spi::select_id_on_latest_snapshot(
        "SELECT j.id FROM backfill.job j JOIN backfill.job_table t ON t.job_id OPERATOR(pg_catalog.=) j.id
          WHERE j.state OPERATOR(pg_catalog.=) ANY (ARRAY['running', 'paused'])
            AND t.relid OPERATOR(pg_catalog.=) $1::pg_catalog.oid::pg_catalog.regclass
          LIMIT 1",
        &[relid.into()],
    )
}

/// The running (or paused) backfill bound to `slot` that covers table `relid`, if any: a follow
/// does not start that table twice.
pub fn running_backfill_of_table_in_slot(relid: pg_sys::Oid, slot: &str) -> Option<i64> {
    crate::pg::spi::select_one::<i64>(
        "SELECT j.id FROM backfill.job j JOIN backfill.job_table t ON t.job_id OPERATOR(pg_catalog.=) j.id
          WHERE j.state OPERATOR(pg_catalog.=) ANY (ARRAY['running', 'paused'])
            AND j.slot_name OPERATOR(pg_catalog.=) $2
            AND t.relid OPERATOR(pg_catalog.=) $1::pg_catalog.oid::pg_catalog.regclass
          LIMIT 1",
        &[relid.into(), slot.into()],
    )
    .or_internal("read the running backfills")
}

/// The one way a backfill changes state: from one of `from` to `to`; false when it was in
/// none of them (it moved meanwhile, and a final state is never overwritten). Running again
/// counts as a launch and clears the last outcome. A final state records when, and frees the
/// worker's pid; done records the watermark (the WAL position after every page, which the
/// slot's consumer must confirm for delivery), failed its error.
pub fn move_job(
    backfill_id: i64,
    from: &[JobState],
    to: JobState,
    pause_reason: Option<&str>,
    error: Option<(&str, &str)>,
) -> bool {
    let from: Vec<&str> = from.iter().map(|s| s.as_str()).collect();
    let (sqlstate, message) = error.unzip();
    let sql = format!(
        "UPDATE backfill.job
            SET state = $3, pause_reason = $4,
                launched_at = CASE WHEN $3 OPERATOR(pg_catalog.=) 'running'
                                   THEN pg_catalog.clock_timestamp() ELSE launched_at END,
                finished_at = CASE WHEN $3 OPERATOR(pg_catalog.=) ANY (ARRAY['done', 'cancelled', 'failed'])
                                   THEN pg_catalog.clock_timestamp() END,
                worker_pid = CASE WHEN $3 OPERATOR(pg_catalog.=) ANY (ARRAY['done', 'cancelled', 'failed'])
                                  THEN NULL ELSE worker_pid END,
                watermark_lsn = CASE WHEN $3 OPERATOR(pg_catalog.=) 'done' THEN pg_catalog.pg_current_wal_insert_lsn()
                                     WHEN $3 OPERATOR(pg_catalog.=) ANY (ARRAY['cancelled', 'failed']) THEN NULL
                                     ELSE watermark_lsn END,
                last_error_sqlstate = CASE WHEN $3 OPERATOR(pg_catalog.=) ANY (ARRAY['running', 'done']) THEN NULL
                                           WHEN $3 OPERATOR(pg_catalog.=) 'failed' THEN $5
                                           ELSE last_error_sqlstate END,
                last_error = CASE WHEN $3 OPERATOR(pg_catalog.=) ANY (ARRAY['running', 'done']) THEN NULL
                                  WHEN $3 OPERATOR(pg_catalog.=) 'failed' THEN $6 ELSE last_error END
          WHERE id OPERATOR(pg_catalog.=) $1
            AND (state OPERATOR(pg_catalog.=) ANY ($2) OR ('running' OPERATOR(pg_catalog.=) ANY ($2) AND {waiting}))
         RETURNING id",
        waiting = schema::PAUSED_WHILE_WAITING
    );
    updated_any(
        &sql,
        &[backfill_id.into(), from.into(), to.as_str().into(), pause_reason.into(), sqlstate.into(), message.into()],
    )
    .or_internal("record the backfill's state")
}

/// An error that failed a backfill, as backfill.job_error keeps it.
pub struct JobError<'a> {
    pub backfill_id: i64,
    pub relid: Option<pg_sys::Oid>,
    pub table: Option<&'a str>,
    pub stopped_after_key: Option<&'a str>,
    pub sqlstate: &'a str,
    pub message: &'a str,
    pub detail: Option<&'a str>,
}

/// Keeps an error that failed a backfill in backfill.job_error: last_error shows the latest
/// only, and a resume clears it. (Skipped on an older schema without the table, until ALTER
/// EXTENSION UPDATE.)
pub fn record_error(error: &JobError) {
    if !schema::capabilities().job_error {
        return;
    }
    Spi::run_with_args(
        "INSERT INTO backfill.job_error (job_id, relid, table_name, stopped_after_key, sqlstate, message, detail)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        &[
            error.backfill_id.into(),
            error.relid.into(),
            error.table.map(Text::from).into(),
            error.stopped_after_key.map(Text::from).into(),
            error.sqlstate.into(),
            Text::from(error.message).into(),
            error.detail.map(Text::from).into(),
        ],
    )
    .or_internal("record the backfill's error")
}

/// A running backfill whose worker was launched before the server last started: without
/// shared_preload_libraries nothing relaunched it.
pub fn worker_lost_to_restart(backfill_id: i64) -> bool {
    // (No such backfill: false, and the caller reports 42704.)
    crate::pg::spi::select_one::<bool>(
        "SELECT state OPERATOR(pg_catalog.=) 'running'
                AND launched_at OPERATOR(pg_catalog.<) pg_catalog.pg_postmaster_start_time()
           FROM backfill.job WHERE id OPERATOR(pg_catalog.=) $1",
        &[backfill_id.into()],
    )
    .or_internal("read the backfill")
    .unwrap_or(false)
}

/// backfill_set(): new pacing for a running backfill; NULL keeps a value, 0 removes a limit.
pub fn set_pacing(backfill_id: i64, batch_size: Option<i32>, rows_per_second: Option<i32>, max_lag_bytes: Option<i64>) {
    Spi::run_with_args(
        "UPDATE backfill.job
            SET batch_size = coalesce($2, batch_size),
                rows_per_second = CASE WHEN $3 IS NULL THEN rows_per_second
                                       WHEN $3 OPERATOR(pg_catalog.<>) 0 THEN $3 END,
                max_lag_bytes = CASE WHEN $4 IS NULL THEN max_lag_bytes
                                     WHEN $4 OPERATOR(pg_catalog.<>) 0 THEN $4 END
          WHERE id OPERATOR(pg_catalog.=) $1",
        &[backfill_id.into(), batch_size.into(), rows_per_second.into(), max_lag_bytes.into()],
    )
    .or_internal("change the pacing")
}

/// backfill_start(..., max_replica_lag => ...) and backfill_set(): the backfill's limits on the
/// source; NULL keeps a value, -1 follows the setting again (NULL in the table).
pub fn set_source_limits(backfill_id: i64, options: &SourceOptions) {
    Spi::run_with_args(
        "UPDATE backfill.job
            SET max_replica_lag_bytes = CASE WHEN $2 OPERATOR(pg_catalog.=) -1 THEN NULL
                                             ELSE coalesce($2, max_replica_lag_bytes) END,
                max_retained_wal_bytes = CASE WHEN $3 OPERATOR(pg_catalog.=) -1 THEN NULL
                                              ELSE coalesce($3, max_retained_wal_bytes) END,
                max_active_sessions = CASE WHEN $4 OPERATOR(pg_catalog.=) -1 THEN NULL
                                           ELSE coalesce($4::integer, max_active_sessions) END
          WHERE id OPERATOR(pg_catalog.=) $1",
        &[
            backfill_id.into(),
            options.max_replica_lag.into(),
            options.max_retained_wal.into(),
            options.max_active_sessions.into(),
        ],
    )
    .or_internal("change the limits on the source")
}

/// A progress sample, for the rate over the last minute; samples older than two minutes go.
pub fn record_progress(backfill_id: i64) {
    Spi::run_with_args(
        "WITH sample AS (
             INSERT INTO backfill.job_progress (job_id, at, rows_done)
             SELECT $1, pg_catalog.clock_timestamp(), coalesce(pg_catalog.sum(rows_done), 0)
               FROM backfill.job_table WHERE job_id OPERATOR(pg_catalog.=) $1
             -- Parallel workers sample the same total: two in the same microsecond are one.
             ON CONFLICT DO NOTHING)
         DELETE FROM backfill.job_progress
          WHERE job_id OPERATOR(pg_catalog.=) $1
            AND at OPERATOR(pg_catalog.<) (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) interval '2 minutes')",
        &[backfill_id.into()],
    )
    .or_internal("record progress")
}

/// The running backfill that already serves this slot, if any, as last committed (see
/// [`running_backfill_of`]).
pub fn running_backfill_of_slot(slot: &str) -> Option<i64> {
    crate::pg::spi::select_id_on_latest_snapshot(
        "SELECT id FROM backfill.job
          WHERE slot_name OPERATOR(pg_catalog.=) $1 AND state OPERATOR(pg_catalog.=) ANY (ARRAY['running', 'paused'])
          LIMIT 1",
        &[slot.into()],
    )
}

/// The key messages are signed with now, the newest: (id, key). Which key is the newest is read
/// every page (prepared), so that a rotation takes effect at the next one; its bytes only when
/// it is another key than the last page's (a key's bytes never change: a rotation makes a new
/// key), since reading them took a tenth of a worker's time. Through the view
/// backfill.message_key (a table of the same columns in older schemas), as a consumer reads it.
pub fn current_message_key() -> Option<(i32, Vec<u8>)> {
    // The key's id and the view's oid: ids start over when the extension is dropped and created
    // again, under a new view.
    let newest_id = run_prepared("SELECT id FROM backfill.message_key ORDER BY id DESC LIMIT 1", false, &[], |rows| {
        if rows.is_empty() {
            return Ok(None);
        }
        rows.first().get::<i32>(1)
    })
    .or_internal("read which message key is the newest")?;
    let newest = (newest_id, crate::catalog::schema::message_key_relation()?);
    if let Some(key) =
        NEWEST_KEY.with(|cached| cached.borrow().as_ref().filter(|(of, _)| *of == newest).map(|(_, key)| key.clone()))
    {
        return Some(key);
    }
    let key = newest_message_key();
    if let Some(key) = &key {
        NEWEST_KEY.with(|cached| *cached.borrow_mut() = Some(((key.0, newest.1), key.clone())));
    }
    key
}

/// A message key as this process last read it: (its id, the view's oid) and (id, bytes).
type ReadKey = ((i32, pg_sys::Oid), (i32, Vec<u8>));

thread_local! {
    /// The newest message key this process read.
    static NEWEST_KEY: std::cell::RefCell<Option<ReadKey>> = const { std::cell::RefCell::new(None) };
}

/// The newest message key, (id, bytes), read whole.
fn newest_message_key() -> Option<(i32, Vec<u8>)> {
    run_prepared("SELECT id, key FROM backfill.message_key ORDER BY id DESC LIMIT 1", false, &[], |rows| {
        if rows.is_empty() {
            return Ok(None);
        }
        let row = rows.first();
        Ok(row.get::<i32>(1)?.zip(row.get::<Vec<u8>>(2)?))
    })
    .or_internal("read the message key")
}

/// The key this transaction's messages are signed with (stream/sign.rs): the newest; None while
/// the database's extension is still at 0.1.0, which had no key (its messages go unsigned, as
/// 0.1.0 wrote them, until ALTER EXTENSION UPDATE). Raises if the key table is empty.
pub fn signing_key() -> Option<(i32, Vec<u8>)> {
    if !crate::catalog::schema::capabilities().message_key {
        return None;
    }
    let key = current_message_key();
    if key.is_none() {
        crate::pg::errors::raise(
            pgrx::PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "pg_backfill has no message key",
            "Table backfill.message_key is empty, so messages cannot be signed.",
            Some("Make one: SELECT backfill_rotate_key();".into()),
        );
    }
    key
}

/// Message key `key_id`'s bytes, from the sequences that hold them (sql/catalog.sql), eight in
/// each as a bigint's big-endian bytes; None if there is no such key. Only their owner, the
/// extension's owner, may read the sequences.
pub fn stored_message_key(key_id: i32) -> Option<Vec<u8>> {
    let parts = crate::pg::spi::select_one_prepared::<Vec<Option<pg_sys::Oid>>>(
        "SELECT key_sequences FROM backfill.message_key_store WHERE id OPERATOR(pg_catalog.=) $1",
        &[key_id.into()],
    )
    .or_internal("read the message key")?;
    // A rotation that retires this key drops its sequences: the key's row, in this statement's
    // snapshot, may name sequences that a transaction committing meanwhile dropped. Each is
    // locked, then looked for again: a retired key raises an error that a retry gets past (the
    // worker retries the page, and reads the newest key again).
    for part in &parts {
        // SAFETY: opens (and closes) a relation by oid if it still exists once locked; the lock
        // stays until the transaction ends, so that the sequence cannot go while it is read.
        let exists = part.is_some_and(|part| unsafe {
            let relation = pg_sys::try_relation_open(part, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
            if !relation.is_null() {
                pg_sys::relation_close(relation, pg_sys::NoLock as pg_sys::LOCKMODE);
            }
            !relation.is_null()
        });
        if !exists {
            crate::pg::errors::raise(
                pgrx::PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
                format!("message key {key_id} was retired while it was being read"),
                "backfill_rotate_key(retire_old_keys => true) dropped it in a transaction that committed meanwhile.",
                Some("Read the keys again: the newest is another now.".into()),
            );
        }
    }
    let key = crate::pg::spi::select_one_prepared::<Vec<u8>>(
        "SELECT pg_catalog.string_agg(pg_catalog.int8send(pg_catalog.pg_sequence_last_value(p.part::pg_catalog.regclass)),
                                      ''::pg_catalog.bytea ORDER BY p.n)
           FROM pg_catalog.unnest($1::pg_catalog.oid[]) WITH ORDINALITY AS p(part, n)",
        &[parts.iter().flatten().copied().collect::<Vec<pg_sys::Oid>>().into()],
    )
    .or_internal("read the message key");
    match key {
        Some(key) if key.len() == 8 * parts.len() => Some(key),
        // A sequence that was never set (setval): not a key any message could verify with.
        _ => crate::pg::errors::raise(
            pgrx::PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
            format!("message key {key_id} is damaged"),
            format!("A sequence that holds message key {key_id}'s bytes holds no value."),
            Some("Make a new key and retire the old ones: SELECT backfill_rotate_key(retire_old_keys => true);".into()),
        ),
    }
}

/// backfill.message_key_bytes(key_id): message key `key_id`'s bytes, view backfill.message_key's
/// column `key`. The bytes are in sequences only the extension's owner may read, so that no
/// grant on them has to follow each rotation: a caller that may SELECT backfill.message_key (the
/// consumer's grant) gets them read as the owner; any other gets 42501, as reading the key has
/// always needed. Through the view, the check is the view's own; called directly, this one.
#[pg_extern(schema = "backfill", stable)]
fn message_key_bytes(key_id: Option<i32>) -> Option<Vec<u8>> {
    let key_id = key_id?;
    require_select_on_the_keys();
    crate::pg::privilege::as_extension_owner(|| stored_message_key(key_id))
}

/// Raises 42501 unless the current user may SELECT backfill.message_key.
fn require_select_on_the_keys() {
    let view = crate::catalog::schema::message_key_relation();
    // SAFETY: a privilege check of an existing relation for the current user, from the catalog cache.
    let allowed = view.is_some_and(|view| unsafe {
        pg_sys::pg_class_aclcheck(view, pg_sys::GetUserId(), pg_sys::AclMode::from(pg_sys::ACL_SELECT))
            == pg_sys::AclResult::ACLCHECK_OK
    });
    if !allowed {
        let role = crate::pg::privilege::current_role_name();
        crate::pg::errors::raise(
            pgrx::PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            "permission denied for view backfill.message_key",
            format!("Reading a message key needs SELECT on backfill.message_key, which role \"{role}\" does not hold."),
            Some(format!(
                "A consumer that verifies messages is granted it: GRANT SELECT ON backfill.message_key TO {};",
                crate::pg::encoding::quote_ident(&role)
            )),
        );
    }
}

/// Backfill `id`'s progress in one line, as backfill_status shows it to the caller (for
/// backfill_wait()'s NOTICE), read on a snapshot of its own.
pub fn progress_line(id: i64) -> Option<String> {
    // (format() renders NULL as nothing: each part is left out when its value is NULL.)
    let sql = "SELECT pg_catalog.concat_ws(', ',
                   pg_catalog.format('backfill %s: %s', s.id, s.state),
                   CASE WHEN s.percent_done IS NOT NULL
                        THEN pg_catalog.format('%s%% (%s of about %s rows)', s.percent_done, s.rows_done, s.rows_estimated) END,
                   CASE WHEN s.rows_per_second_last_minute IS NOT NULL
                        THEN pg_catalog.format('%s rows/s', s.rows_per_second_last_minute) END,
                   CASE WHEN s.time_left IS NOT NULL THEN pg_catalog.format('about %s left', s.time_left) END,
                   CASE WHEN s.waiting_for IS NOT NULL THEN pg_catalog.format('waiting for %s', s.waiting_for) END)
                 FROM {schema}.backfill_status s WHERE s.id OPERATOR(pg_catalog.=) $1";
    let sql = sql.replace("{schema}", &crate::pg::spi::extension_schema());
    // On a snapshot of its own: the statement's is from before the wait began.
    crate::pg::spi::with_fresh_snapshot(|| crate::pg::spi::select_one::<String>(&sql, &[id.into()])).ok().flatten()
}
