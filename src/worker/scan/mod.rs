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

use crate::catalog::job::{self, Job};
use crate::catalog::job_table::{self, JobTable};
use crate::model::state::{JobState, RangeState};
use crate::model::table::{self, Table};
use crate::pg::errors::raise;
use crate::pg::privilege;
use crate::selection::publication::Confirmed;
use crate::stream::json::RowJson;
use crate::stream::message::ReadMessage;
use crate::stream::scan::{RowLocks, ScanQueries};
use crate::stream::sign::Signer;
use crate::worker::activity;
use crate::worker::shared_progress::{self, Phase};
use crate::worker::xact::{in_transaction, in_transaction_retried, who, PageError};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;
use std::ffi::CString;
use throttle::Throttle;

mod keyed_page;
mod markers;
mod progress;
mod range_page;
mod throttle;

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

/// The scan of one table (or one key range of it) by the worker: what it is for, what it reads,
/// what holds it back, and its progress log.
pub struct TableScan<'a> {
    context: ScanContext<'a>,
    shape: ReadShape,
    throttle: Throttle,
    /// When a page last found the table published as it was at the start: until the catalog's
    /// generation moves, the publication need not be read.
    published: Confirmed,
}

/// What a scan is for, fixed when it opens.
struct ScanContext<'a> {
    backfill_id: i64,
    /// The scan's range of the backfill (backfill.job_table.position).
    position: i32,
    prefix: &'a CString,
    slot: Option<String>,
    /// The role that started the backfill: the end marker shows the sequences it may read.
    started_by: String,
    /// Whether the scan delivers given keys (keyed_page.rs) rather than the whole table.
    keyed: bool,
    /// Most rows per message (backfill.job.rows_per_message).
    rows_per_message: i32,
    /// The filter its pages run (selection/row_filter.rs): the publication's row filter for the
    /// table AND the backfill's own (backfill.job.row_filter, user SQL), run as the starter.
    row_filter: Option<String>,
    /// The publication's row filter for the table when the backfill started
    /// (backfill.job_table.publication_filter), which every page finds unchanged.
    published_filter: Option<String>,
    /// Whether the state tables count each page's lock path (tests).
    counts_lock_paths: bool,
}

/// What a scan reads and how it renders it, as the table is now (reloaded when its columns
/// change under the scan).
struct ReadShape {
    table: Table,
    /// The table's owner when the page began: its queries run as this role.
    owner: pg_sys::Oid,
    /// The page queries, prepared once per scan (pg/spi.rs keeps their plans).
    queries: ScanQueries,
    key_columns: Vec<usize>,
    row: RowJson,
    messages: ReadMessage,
}

impl ReadShape {
    fn new(table: Table, backfill_id: i64, slot: Option<&str>, rows_per_message: i32) -> Self {
        ReadShape {
            owner: table.owner,
            queries: ScanQueries::new(&table),
            key_columns: table.key.iter().map(|k| k.position).collect(),
            row: RowJson::new(&table.columns, table.column_list.as_ref().map(|_| table.column_attnums.clone())),
            messages: ReadMessage::new(backfill_id, slot, &table, rows_per_message.max(1) as usize),
            table,
        }
    }
}

impl<'a> TableScan<'a> {
    pub fn open(backfill_id: i64, job: &Job, job_table: &JobTable, prefix: &'a CString) -> Result<Self, PageError> {
        let (relid, position) = (job_table.relid, job_table.position);
        // As its reads deliver it: the columns of its column list, if it has one.
        let inspected = in_transaction_retried(|| {
            table::inspect(relid).map(|t| {
                let (list, attnums) = job_table::column_list(backfill_id, position).unzip();
                crate::selection::columns::project(t, list, attnums.as_deref())
            })
        })?;
        let table = inspected.map_err(|why| {
            PageError::new(why.code, format!("table {relid:?} can no longer be backfilled: {}", why.reason), None)
        })?;
        let partitioned = table.partitioned;
        let (shape, counts_lock_paths, keyed, published_filter) = in_transaction(|| {
            // A progress sample before the worker's first page: the rate (backfill_status) shows
            // with the first rows, from the moment the scan began, not a second later. (Later
            // tables are sampled with their pages, once a second.)
            if progress::before_first_sample() {
                crate::catalog::job::record_progress(backfill_id);
            }
            (
                ReadShape::new(table, backfill_id, job.slot_name.as_deref(), job.rows_per_message),
                crate::catalog::schema::capabilities().lock_path_counts,
                job_table::is_keyed(backfill_id, job_table.position),
                job_table::publication_filter(backfill_id, job_table.position),
            )
        })?;
        Ok(TableScan {
            context: ScanContext {
                backfill_id,
                position: job_table.position,
                prefix,
                slot: job.slot_name.clone(),
                started_by: job.started_by.clone(),
                keyed,
                rows_per_message: job.rows_per_message,
                row_filter: crate::selection::row_filter::combined(
                    published_filter.as_deref(),
                    job.row_filter.as_deref(),
                ),
                published_filter,
                counts_lock_paths,
            },
            throttle: Throttle::new(job, partitioned),
            published: Confirmed::default(),
            shape,
        })
    }

    pub fn backfill_id(&self) -> i64 {
        self.context.backfill_id
    }

    pub fn position(&self) -> i32 {
        self.context.position
    }

    /// The scan's throttle (its pacing and page size), for the worker's loop.
    pub fn throttle(&mut self) -> &mut Throttle {
        &mut self.throttle
    }

    /// The backfill as it is now, with its pacing applied (backfill_set() takes effect here);
    /// its state when it no longer runs (paused by backfill_pause(), cancelled).
    pub fn refresh(&mut self) -> Result<Job, JobState> {
        let backfill_id = self.context.backfill_id;
        let Some(job) = job::job(backfill_id) else {
            raise(
                ERRCODE_UNDEFINED_OBJECT,
                format!("backfill {backfill_id} no longer exists"),
                "Its row in backfill.job was deleted while its worker ran.",
                Some("Start it again with backfill_start(), if it is still needed.".into()),
            )
        };
        if job.state != JobState::Running {
            return Err(job.state);
        }
        // How many workers share the rate matters only to a paced backfill with several.
        let sharing = if job.rows_per_second.is_some() && job.parallel > 1 {
            job_table::workers_scanning(backfill_id)
        } else {
            1
        };
        self.throttle.follow(&job, sharing);
        Ok(job)
    }

    /// One page, inside its own transaction.
    pub fn page(&mut self) -> Page {
        // First, before any lock is taken (see publication_generation()).
        let catalog_generation = crate::pg::catalog_changes::publication_generation();
        let job = match self.refresh() {
            Ok(job) => job,
            Err(state) => return Page::Stopped(state),
        };
        // The gentle default's rests within a page come between its fixed queries too, not
        // only between its rows: a page's own reads and checks are most of its work, and the
        // application's latency feels how long the backfill holds a CPU at a time (duty.rs).
        // (Until the page's lock, below, no writer can wait on a page that rests.)
        self.throttle.rest_within_page();
        // Waiting is not a state: the backfill still runs, as a backend waiting on a lock is
        // still active. What it waits for shows in pg_stat_activity (no write, no commit).
        if self.throttle.holds_back(&job, self.context.backfill_id) {
            return Page::Waiting;
        }
        self.throttle.rest_within_page();
        let (backfill_id, position) = (self.context.backfill_id, self.context.position);
        let Some(progress) = job_table::job_table(backfill_id, position) else {
            raise(
                ERRCODE_UNDEFINED_OBJECT,
                format!("backfill {backfill_id} lost its table {position}"),
                format!("Its row of position {position} in backfill.job_table was deleted while its worker ran."),
                Some(format!("Cancel it (SELECT backfill_cancel({backfill_id})) and start it again.")),
            )
        };
        self.report_doing(&job, &progress);
        let same_columns = self.recheck(&job, catalog_generation);
        // (Before the signer: it gives the page its transaction id.)
        self.throttle.rest_within_page();
        let signer = Signer::for_this_transaction(job::signing_key());
        if progress.state == RangeState::Pending {
            return self.start_scan(&progress, &signer);
        }
        let Some(upper_bound) = progress.upper_bound.clone() else {
            return self.end_scan(progress.rows_done, &signer);
        };
        if !same_columns {
            self.reload_columns();
        }
        if self.context.keyed {
            return self.key_page(&progress, &signer);
        }
        self.range_page(&progress, &upper_bound, &signer)
    }

    /// Every page that does not wait says what it does (and so that it no longer waits), or
    /// what slows it down.
    fn report_doing(&mut self, job: &Job, progress: &JobTable) {
        let (doing, phase) = match self.throttle.slowed_by_load(job, self.context.backfill_id) {
            Some(reason) => (activity::waiting(&reason), Phase::waiting_for(reason.kind())),
            None => (
                activity::scanning(self.context.backfill_id, &self.shape.table, progress.cursor.as_deref()),
                Phase::Scanning,
            ),
        };
        activity::report(&doing);
        shared_progress::set_phase(phase);
    }

    /// The table as the page finds it: its owner now, the starter's rights on it, and the
    /// pipeline's publication still holding it, with the columns and rows the scan sends.
    /// Whether its columns are still the scan's.
    fn recheck(&mut self, job: &Job, catalog_generation: u64) -> bool {
        let row = &self.shape.row;
        // SAFETY: the descriptor is the open relation's.
        let found = self.shape.table.recheck(|descriptor| unsafe { row.describes(descriptor) });
        self.shape.owner = found.owner;
        let table = &self.shape.table;
        privilege::require_starter_rights(
            &job.started_by,
            table.relid,
            &table.qualified_name(),
            job.slot_name.as_deref(),
        );
        // A table dropped from the pipeline's publication mid-run: its consumer no longer wants
        // it, though pgoutput would still pass its messages on. Read again only when the catalog
        // may have changed since a page last found it unchanged.
        if let Some(publication) = &job.publication_name {
            let recorded_filter = self.context.published_filter.as_deref();
            self.published.recheck(publication, table, catalog_generation, |published| {
                crate::selection::columns::require_still_published(publication, table, published.columns.as_deref());
                crate::selection::row_filter::require_same_published_filter(
                    publication,
                    table,
                    recorded_filter,
                    published.row_filter.as_deref(),
                );
            });
        }
        found.same_columns
    }

    /// Frees the plans of this scan's queries (kept by pg/spi.rs for the worker's lifetime).
    pub fn forget_plans(&self) {
        let queries = &self.shape.queries;
        for after_cursor in [false, true] {
            crate::pg::spi::forget(&queries.page_end(after_cursor));
            for locks in [RowLocks::NoWait, RowLocks::Wait, RowLocks::None] {
                crate::pg::spi::forget(&queries.page_rows(after_cursor, locks));
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
        let table = crate::selection::columns::project(
            table::require(self.shape.table.relid),
            self.shape.table.column_list.clone(),
            Some(&self.shape.table.column_attnums),
        );
        // The same columns, types (a varchar may grow) and collations, in the same order.
        let key = |t: &Table| {
            t.key
                .iter()
                .map(|k| (k.name.clone(), t.columns[k.position].type_oid, k.collation.clone()))
                .collect::<Vec<_>>()
        };
        let scanned = &self.shape.table;
        if key(&table) != key(scanned) {
            raise(
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("the key of table {} changed during its backfill", scanned.qualified_name()),
                format!("The scan is ordered by ({}).", scanned.key_names().join(", ")),
                Some("Start a new backfill of the table.".into()),
            );
        }
        log!(
            "{}: the columns of {} changed; rows are read as they are now",
            who(self.context.backfill_id),
            table.qualified_name()
        );
        // The new queries name the columns as they are now: pg/spi.rs prepares them anew.
        self.forget_plans();
        self.shape = ReadShape::new(
            table,
            self.context.backfill_id,
            self.context.slot.as_deref(),
            self.context.rows_per_message,
        );
    }
}
