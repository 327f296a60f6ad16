//! One page is one transaction: a table's scan moves from its cursor to the page's last key,
//! locking and reading the rows between, emitting one message per row, and advancing the cursor
//! in the same transaction.
//!
//! Why the order is right: a page locks its rows (FOR SHARE) when it reads them and holds the
//! locks until it commits, and its messages are transactional, so they are decoded at the
//! page's commit. A change to a row that committed before the page read it is already in the
//! row the page reads (read committed re-reads a row updated while it waited); a change after
//! must wait for the page's commit, so it is decoded after the read. A consumer that applies
//! reads as upserts therefore never sees an old version overwrite a newer one, nor a deleted
//! row come back.
//!
//! Why a restart neither loses nor repeats a row: the cursor is updated in the same transaction
//! as the page's messages, so both are committed, or neither.
//!
//! Why the backfill never makes a writer fail: a page of several rows locks them NOWAIT. If one
//! is taken, the page rolls back (releasing every lock) and shrinks, so a page that holds row
//! locks never waits for another. Only a one-row page, which holds nothing else, waits, and only
//! for `backfill.lock_timeout`. A page therefore never closes a deadlock cycle with a writer.

use crate::catalog::job;
use crate::catalog::job_table::{self, JobTable, Range};
use crate::model::state::{JobState, RangeState};
use crate::model::table::{self, Table};
use crate::pg::encoding::{show_key, KeyText};
use crate::pg::errors::raise;
use crate::pg::errors::OrInternal;
use crate::pg::privilege;
use crate::pg::settings;
use crate::stream::delivery;
use crate::stream::json::RowJson;
use crate::stream::message::{self, ReadMessage};
use crate::stream::scan::ScanQueries;
use crate::stream::sign::Signer;
use crate::throttle::backpressure::{self, LoadGovernor, SourceLimit};
use crate::throttle::lock::{LockPolicy, Locking};
use crate::throttle::pacing::{self, Pacer};
use crate::throttle::pipeline;
use crate::worker::activity;
use crate::worker::xact::{in_transaction, in_transaction_retried, sqlstate_of, who, PageError};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;
use std::ffi::CString;
use std::time::Instant;

/// What a page did.
pub enum Page {
    /// Nothing: the slot's consumer is away or behind; try again in a second.
    Waiting,
    /// Delivered rows; the table has more.
    More,
    /// The table's scan ended (its end marker is sent).
    TableDone,
    /// The backfill is no longer running (paused by backfill_pause(), cancelled): the worker exits.
    Stopped(JobState),
}

/// The scan of one table by the worker.
pub struct TableScan<'a> {
    pub(crate) backfill_id: i64,
    /// Prepared once per scan: the page bound query (by whether a cursor exists) and the page
    /// rows query (by that and the locking).
    pub(crate) slot: Option<String>,
    /// The kind of what the backfill waits for now (its slot's consumer, a standby, a slot's
    /// WAL), if anything: logged when it changes. (What it waits for shows in pg_stat_activity,
    /// worker/activity.rs.)
    waiting: Option<&'static str>,
    pub(crate) position: i32,
    pub(crate) batch_size: i32,
    pub(crate) pacer: Pacer,
    /// What the server's load allows this worker (backfill.max_active_sessions), and whether
    /// it holds it back now (logged when that changes).
    pub(crate) load: LoadGovernor,
    slowed_by_load: bool,
    /// Whether the scan delivers given keys (keyed_page.rs) rather than the whole table.
    pub(crate) keyed: bool,
    /// The role that started the backfill: the end marker shows the sequences it may read.
    started_by: String,
    /// How pages lock (lock.rs), and whether the state tables count each path.
    pub(crate) locks: LockPolicy,
    pub(crate) counts_lock_paths: bool,
    /// None until the first page: it samples at once.
    pub(crate) last_sample: Option<Instant>,
    pub(crate) last_log: Instant,
    pub(crate) prefix: &'a CString,
    pub(crate) table: Table,
    /// The table's owner when the page began: its queries run as this role.
    pub(crate) owner: pg_sys::Oid,
    pub(crate) queries: ScanQueries,
    pub(crate) key_columns: Vec<usize>,
    pub(crate) row: RowJson,
    pub(crate) messages: ReadMessage,
}

impl<'a> TableScan<'a> {
    pub fn open(
        backfill_id: i64,
        job: &job::Job,
        job_table: &JobTable,
        prefix: &'a CString,
    ) -> Result<Self, PageError> {
        let relid = job_table.relid;
        let inspected = in_transaction_retried(|| table::inspect(relid))?;
        let table = inspected.map_err(|why| PageError {
            code: why.code,
            sqlstate: sqlstate_of(why.code),
            message: format!("table {relid:?} can no longer be backfilled: {}", why.reason),
        })?;
        let (row, counts_lock_paths, keyed) = in_transaction(|| {
            (
                RowJson::new(&table.columns),
                job_table::counts_lock_paths(),
                job_table::is_keyed(backfill_id, job_table.position),
            )
        })?;
        Ok(TableScan {
            backfill_id,
            position: job_table.position,
            batch_size: job.batch_size,
            pacer: Pacer::new(pacing::share(job.rows_per_second, i64::from(job.parallel))),
            load: LoadGovernor::new(),
            slowed_by_load: false,
            keyed,
            started_by: job.started_by.clone(),
            locks: LockPolicy::new(job.lock_mode, table.partitioned, job.batch_size),
            counts_lock_paths,
            last_sample: None,
            last_log: Instant::now(),
            prefix,
            queries: ScanQueries::new(&table),
            key_columns: table.key.iter().map(|k| k.position).collect(),
            row,
            messages: ReadMessage::new(backfill_id, job.slot_name.as_deref(), &table),
            slot: job.slot_name.clone(),
            waiting: None,
            owner: table.owner,
            table,
        })
    }

    /// The backfill as it is now, with its pacing applied (backfill_set() takes effect here);
    /// its state when it no longer runs (paused by backfill_pause(), cancelled).
    pub fn refresh(&mut self) -> Result<job::Job, JobState> {
        let job =
            job::job(self.backfill_id).unwrap_or_else(|| error!("backfill {} no longer exists", self.backfill_id));
        if job.state != JobState::Running {
            return Err(job.state);
        }
        self.batch_size = job.batch_size;
        // How many workers share the rate matters only to a paced backfill with several.
        let sharing = if job.rows_per_second.is_some() && job.parallel > 1 {
            job_table::workers_scanning(self.backfill_id)
        } else {
            1
        };
        let share = pacing::share(job.rows_per_second, sharing);
        let limit = SourceLimit::ActiveSessions.in_force(job.source.max_active_sessions);
        let rate = match self.load.allowed_rate(limit, share, f64::from(job.batch_size)) {
            Some(allowed) => Some(share.map_or(allowed, |share| share.min(allowed))),
            None => share,
        };
        self.pacer.set_rate(rate);
        Ok(job)
    }

    /// One page, inside its own transaction.
    pub fn page(&mut self, rows_per_page: i32) -> Page {
        let job = match self.refresh() {
            Ok(job) => job,
            Err(state) => return Page::Stopped(state),
        };
        // Waiting is not a state: the backfill still runs, as a backend waiting on a lock is
        // still active. What it waits for shows in pg_stat_activity (no write, no commit).
        if let Some(reason) =
            pipeline::blocker(&job).or_else(|| backpressure::blocker(&job.source, job.slot_name.as_deref()))
        {
            // Logged when the kind of what it waits for changes, not each time its figures do.
            if self.waiting != Some(reason.kind()) {
                log!("{}: waits for {reason}", who(self.backfill_id));
            }
            report_activity(&activity::waiting(&reason));
            self.waiting = Some(reason.kind());
            return Page::Waiting;
        }
        if self.waiting.take().is_some() {
            log!("{}: continues, what it waited for is back and caught up", who(self.backfill_id));
        }
        let progress = job_table::job_table(self.backfill_id, self.position)
            .unwrap_or_else(|| error!("backfill {} lost its table {}", self.backfill_id, self.position));
        // Every page that does not wait says what it does (and so that it no longer waits),
        // or what slows it down.
        let limit = SourceLimit::ActiveSessions.in_force(job.source.max_active_sessions);
        let slowed = self.load.holding_back(limit);
        if slowed.is_some() != self.slowed_by_load {
            match &slowed {
                Some(reason) => log!("{}: slows down for {reason}", who(self.backfill_id)),
                None => log!("{}: back to its full rate, the server's load is down", who(self.backfill_id)),
            }
            self.slowed_by_load = slowed.is_some();
        }
        report_activity(&match slowed {
            Some(reason) => activity::waiting(&reason),
            None => format!(
                "backfill {}: {} after key ({})",
                self.backfill_id,
                self.table.qualified_name(),
                progress.cursor.as_deref().map(show_key).unwrap_or_default()
            ),
        });
        let row = &self.row;
        // SAFETY: the descriptor is the open relation's.
        let found = self.table.recheck(|descriptor| unsafe { row.describes(descriptor) });
        self.owner = found.owner;
        privilege::require_starter_rights(&job.started_by, self.table.relid, &self.table.qualified_name());
        // A table dropped from the pipeline's publication mid-run: its consumer no longer wants
        // it, though pgoutput would still pass its messages on.
        if let Some(publication) = &job.publication_name {
            pipeline::require_published(publication, &self.table);
        }
        let signer = Signer::for_this_transaction();
        if progress.state == RangeState::Pending {
            return self.start_scan(&progress, &signer);
        }
        let Some(upper_bound) = progress.upper_bound.clone() else {
            return self.end_scan(progress.rows_done, &signer);
        };
        if !found.same_columns {
            self.reload_columns();
        }
        if self.keyed {
            return self.key_page(&progress, rows_per_page, &signer);
        }
        let cursor = progress.cursor.clone();
        // The page's lock comes before its queries take their snapshots (see lock.rs).
        let (locking, rows_per_page) = self.locks.lock_page(self.table.relid, rows_per_page);
        let locked_at = Instant::now();
        let Some(page_end) = self.page_end(cursor.as_deref(), &upper_bound, rows_per_page) else {
            return self.end_scan(progress.rows_done, &signer);
        };
        let (rows, bytes) = self.deliver(cursor.as_deref(), &page_end, locking, &signer);
        self.load.delivered(rows);
        let table_locked = locking == Locking::Table;
        let counted = self.counts_lock_paths.then_some(table_locked);
        if page_end == upper_bound {
            // The table's ranges are locked before this range's row is updated, as in every
            // other end and start: always in the same order, so workers never deadlock.
            let ranges = self.lock_table_ranges();
            job_table::advance_cursor(self.backfill_id, self.position, page_end, rows, bytes, counted);
            return self.end_scan_locked(progress.rows_done + rows, &ranges, &signer);
        }
        job_table::advance_cursor(self.backfill_id, self.position, page_end.clone(), rows, bytes, counted);
        self.report_progress(&page_end, &progress, &upper_bound, progress.rows_done + rows);
        if table_locked {
            self.locks.table_page_took(rows as i32, locked_at.elapsed(), self.batch_size);
        }
        Page::More
    }

    /// Fixes the upper bound (the greatest key now) and sends the start marker.
    fn start_scan(&mut self, progress: &JobTable, signer: &Signer) -> Page {
        let ranges = self.lock_table_ranges();
        let first_range = ranges.iter().all(|r| r.position == self.position || r.state == RangeState::Pending);
        // The greatest key now: the upper bound of a table scanned whole or of its last range,
        // and what the start marker announces.
        let greatest = (first_range || progress.upper_bound.is_none()).then(|| self.greatest_key()).flatten();
        if first_range {
            let json = greatest.as_ref().map(|(_, json)| json.as_slice());
            let rows_estimated = ranges.len() as i64 * progress.rows_estimated;
            let marker =
                message::table_start(self.backfill_id, self.slot.as_deref(), &self.table, json, rows_estimated);
            message::emit_marker(self.prefix, signer, marker);
        }
        let upper_bound = progress.upper_bound.clone().or(greatest.map(|(key, _)| key));
        job_table::move_range(self.backfill_id, self.position, RangeState::Running, upper_bound.clone());
        let bound = upper_bound
            .as_deref()
            .map(|k| format!("key ({})", show_key(k)))
            .unwrap_or_else(|| "nothing: it is empty".into());
        log!("{}: scanning {} up to {bound}", who(self.backfill_id), self.table.qualified_name());
        if upper_bound.is_none() {
            return self.end_scan_locked(0, &ranges, signer);
        }
        Page::More
    }

    /// Every range of this table in the backfill (one, unless parallel), locked in order.
    fn lock_table_ranges(&self) -> Vec<Range> {
        job_table::lock_table_ranges(self.backfill_id, self.position)
    }

    /// Ends the scan of a range whose rows `ranges` are locked: marks it done and, if it is
    /// the table's last range to end, sends the table's end marker with the table's row count.
    fn end_scan_locked(&mut self, rows: i64, ranges: &[Range], signer: &Signer) -> Page {
        let others = ranges.iter().filter(|r| r.position != self.position);
        if others.clone().all(|r| r.state == RangeState::Done) {
            let total = rows + others.map(|r| r.rows_done).sum::<i64>();
            let sequences = message::OwnedSequence::of(self.table.relid, &self.started_by);
            let marker = message::table_end(self.backfill_id, self.slot.as_deref(), &self.table, total, &sequences);
            message::emit_marker(self.prefix, signer, marker);
            log!("{}: {} done, {total} rows", who(self.backfill_id), self.table.qualified_name());
        }
        job_table::move_range(self.backfill_id, self.position, RangeState::Done, None);
        Page::TableDone
    }

    /// Ends the scan of this range when no key is left in it.
    pub(crate) fn end_scan(&mut self, rows: i64, signer: &Signer) -> Page {
        let ranges = self.lock_table_ranges();
        self.end_scan_locked(rows, &ranges, signer)
    }

    /// Frees the plans of this scan's queries (kept by pg/spi.rs for the worker's lifetime).
    pub fn forget_plans(&self) {
        for after_cursor in [false, true] {
            crate::pg::spi::forget(&self.queries.page_end(after_cursor));
            for locking in [Locking::NoWait, Locking::Wait, Locking::Table, Locking::None] {
                crate::pg::spi::forget(&self.queries.page_rows(after_cursor, locking));
            }
        }
    }

    /// The table's columns changed since the scan began (ALTER TABLE): rows are rendered, and
    /// pages queried, as the table is now. Its key cannot change under a scan ordered by it.
    fn reload_columns(&mut self) {
        // The page's snapshot was taken before the ALTER TABLE committed (describes() waited
        // for it): the catalog is read with a snapshot taken now.
        // SAFETY: replaces the page's active snapshot (pushed by in_transaction) with a new one.
        unsafe {
            pg_sys::PopActiveSnapshot();
            pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
        }
        let table = table::require(self.table.relid);
        // The same columns, types (a varchar may grow) and collations, in the same order.
        let key = |t: &Table| {
            t.key
                .iter()
                .map(|k| (k.name.clone(), t.columns[k.position].type_oid, k.collation.clone()))
                .collect::<Vec<_>>()
        };
        if key(&table) != key(&self.table) {
            raise(
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("the key of table {} changed during its backfill", self.table.qualified_name()),
                format!("The scan is ordered by ({}).", self.table.key_names().join(", ")),
                Some("Start a new backfill of the table.".into()),
            );
        }
        log!(
            "{}: the columns of {} changed; rows are read as they are now",
            who(self.backfill_id),
            table.qualified_name()
        );
        // The new queries name the columns as they are now: pg/spi.rs prepares them anew.
        self.forget_plans();
        self.queries = ScanQueries::new(&table);
        self.key_columns = table.key.iter().map(|k| k.position).collect();
        self.row = RowJson::new(&table.columns);
        self.messages = ReadMessage::new(self.backfill_id, self.slot.as_deref(), &table);
        self.table = table;
    }

    /// A page query's parameters: the cursor (unless at the start), then `then`.
    fn key_args(cursor: Option<&[KeyText]>, then: &[KeyText]) -> Vec<KeyText> {
        cursor.unwrap_or_default().iter().chain(then).cloned().collect()
    }

    /// The last key of the next page, or None when no key is left up to the upper bound.
    fn page_end(&mut self, cursor: Option<&[KeyText]>, upper_bound: &[KeyText], rows: i32) -> Option<Vec<KeyText>> {
        let mut args: Vec<pgrx::datum::DatumWithOid> =
            Self::key_args(cursor, upper_bound).into_iter().map(|v| v.into()).collect();
        args.push(i64::from(rows).into());
        let sql = self.queries.page_end(cursor.is_some());
        let key_len = self.queries.key_len();
        privilege::run_as(self.owner, || {
            crate::pg::spi::run_prepared(&sql, false, &args, |result| {
                if result.is_empty() {
                    return Ok(None);
                }
                // No row, or max() of no rows (NULL): no key is left. Key columns are never NULL.
                let row = result.first();
                (0..key_len).map(|i| row.get::<KeyText>(i + 1)).collect::<Result<Option<Vec<_>>, _>>()
            })
        })
        .or_internal("read the page's last key")
    }

    /// Locks and reads every row from the cursor (exclusive) to the page's end (inclusive),
    /// emitting one message per row. Returns rows and payload bytes delivered.
    fn deliver(
        &mut self,
        cursor: Option<&[KeyText]>,
        page_end: &[KeyText],
        locking: Locking,
        signer: &Signer,
    ) -> (i64, i64) {
        let args: Vec<pgrx::datum::DatumWithOid> =
            Self::key_args(cursor, page_end).into_iter().map(Into::into).collect();
        self.deliver_rows(&self.queries.page_rows(cursor.is_some(), locking), &args, signer)
    }

    /// Runs a page's rows query (`sql`, with `args`), emitting one message per row it returns.
    /// Returns rows and payload bytes delivered.
    pub(crate) fn deliver_rows(
        &mut self,
        sql: &str,
        args: &[pgrx::datum::DatumWithOid],
        signer: &Signer,
    ) -> (i64, i64) {
        let plan = crate::pg::spi::kept_plan(sql, args);
        let table_name = self.table.qualified_name();
        let mut sink = delivery::Sink {
            key_columns: &self.key_columns,
            partitioned: self.table.partitioned,
            row: &mut self.row,
            messages: &mut self.messages,
            prefix: self.prefix,
            signer,
            max_message_size: settings::MAX_MESSAGE_SIZE.get() as usize,
            table: &table_name,
            rows: 0,
            bytes: 0,
        };
        // The rows' casts to json and the key's input functions are user code: as the owner.
        privilege::run_as(self.owner, || delivery::run(plan, args, &mut sink));
        (sink.rows, sink.bytes)
    }
}

pub fn report_activity(what: &str) {
    // pg_stat_activity shows it to clients in the database's encoding.
    if let Ok(what) = CString::new(crate::pg::encoding::to_server(what).into_owned()) {
        // SAFETY: copies the string into this backend's status entry.
        unsafe { pg_sys::pgstat_report_activity(pg_sys::BackendState::STATE_RUNNING, what.as_ptr()) };
    }
}
