//! The background worker: one per backfill. It scans the backfill's tables in order, one page
//! per transaction, and emits one transactional "read" message per row.
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

use crate::auth::Signer;
use crate::catalog::{self, JobTable, DONE, FAILED, RUNNING};
use crate::delivery;
use crate::eligibility::{self, Table};
use crate::errors::raise;
use crate::json::RowJson;
use crate::message::{self, ReadMessage};
use crate::scan::{Locking, ScanQueries};
use crate::{pipeline, privilege, settings};
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags};
use pgrx::pg_sys::panic::{CaughtError, ErrorReportWithLevel};
use pgrx::prelude::*;
use pgrx::spi::OwnedPreparedStatement;
use pgrx::PgSqlErrorCode::{self, *};
use std::collections::HashMap;
use std::ffi::CString;
use std::panic::{AssertUnwindSafe, UnwindSafe};
use std::time::{Duration, Instant};

/// Registers the worker of a backfill. It connects to this database and, before doing
/// anything, waits for the transaction that recorded the backfill (which may not have
/// committed yet; registration is not transactional) and gives up if that one rolled back.
pub fn launch(job_id: i64, worker: i32, starter_xid: u64) -> bool {
    register(unsafe { pg_sys::MyDatabaseId }, job_id, worker, starter_xid)
}

/// Registers a `backfill_worker_main` process in `database`: a backfill's worker, or with job
/// id 0 the one that resumes a database's backfills after a restart.
fn register(database: pg_sys::Oid, job_id: i64, worker: i32, starter_xid: u64) -> bool {
    BackgroundWorkerBuilder::new(&worker_name(job_id, worker))
        .set_type("pg_backfill")
        .set_library("pg_backfill")
        .set_function("backfill_worker_main")
        .set_argument(job_id.into_datum())
        .set_extra(&format!("{} {starter_xid} {worker}", database.to_u32()))
        .enable_spi_access()
        // A worker that is terminated or crashes exits with code 1 and is started again after
        // this pause; one that finishes, fails or is cancelled exits with 0 and is not.
        .set_restart_time(Some(Duration::from_secs(1)))
        .load_dynamic()
        .is_ok()
}

/// Backfill workers admitted now, in every database, other than this process: each sets its
/// application_name (`pg_backfill 7`) when it is admitted; the resumer never is.
fn admitted_workers() -> i32 {
    Spi::get_one::<i32>(
        "SELECT count(*)::int FROM pg_catalog.pg_stat_activity
          WHERE backend_type OPERATOR(pg_catalog.=) 'pg_backfill'
            AND application_name OPERATOR(pg_catalog.~~) 'pg_backfill %'
            AND application_name OPERATOR(pg_catalog.<>) 'pg_backfill resume'
            AND pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()",
    )
    .unwrap_or_else(|e| error!("could not count the backfill workers: {e}"))
    .unwrap_or(0)
}

fn too_many_workers(running: i32, needed: i32) -> ! {
    let cap = settings::MAX_WORKERS.get();
    raise(
        ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
        "too many backfill workers",
        format!(
            "{running} backfill worker(s) run now and this backfill needs {needed} more; backfill.max_workers is {cap}."
        ),
        Some(
            "Wait for a backfill to finish, use fewer parallel workers, or raise backfill.max_workers \
             (it keeps background workers free for parallel query and logical replication)."
                .into(),
        ),
    )
}

/// backfill_start() and backfill_resume(): refuses a backfill whose workers would take more
/// than backfill.max_workers background workers in all. (Two calls at the same moment may both
/// pass; each worker checks again when it starts, see [`admit_within_cap`].)
pub fn require_worker_slots(needed: i32) {
    let running = privilege::as_extension_owner(admitted_workers);
    if running + needed > settings::MAX_WORKERS.get() {
        too_many_workers(running, needed);
    }
}

/// A starting worker is admitted only while fewer than backfill.max_workers are: checked under
/// a cluster-wide lock, held until the worker's application_name (which counts it) commits.
fn admit_within_cap() {
    // A lock tag no PostgreSQL object uses: the shared catalog pg_database, object 0.
    const CAP_LOCK: u16 = 0x6266;
    // SAFETY: takes a heavyweight lock, released at the end of this transaction.
    unsafe {
        pg_sys::LockSharedObject(
            pg_sys::DatabaseRelationId,
            pg_sys::InvalidOid,
            CAP_LOCK,
            pg_sys::ExclusiveLock as pg_sys::LOCKMODE,
        );
    }
    let running = admitted_workers();
    if running >= settings::MAX_WORKERS.get() {
        too_many_workers(running, 1);
    }
}

/// `pg_backfill 7` for a backfill's first worker, `pg_backfill 7/1` for its second: the
/// application_name it shows in pg_stat_activity.
fn worker_name(job_id: i64, worker: i32) -> String {
    if job_id == 0 {
        "pg_backfill resume".into()
    } else if worker == 0 {
        format!("pg_backfill {job_id}")
    } else {
        format!("pg_backfill {job_id}/{worker}")
    }
}

unsafe extern "C-unwind" {
    /// PostgreSQL's own SIGTERM handler for backends (pgrx only wraps it as a Rust fn).
    #[link_name = "die"]
    fn postgres_die(signal: std::ffi::c_int);
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn backfill_worker_main(arg: pg_sys::Datum) {
    let job_id = unsafe { i64::from_datum(arg, false) }.unwrap_or_default();
    // SIGTERM (pg_terminate_backend, shutdown) ends the worker at once, as for any backend:
    // the open page rolls back, the process exits with code 1, and the postmaster restarts it.
    unsafe {
        pg_sys::pqsignal(pg_sys::SIGTERM as i32, Some(postgres_die));
    }
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP);

    let mut extra = BackgroundWorker::get_extra().split(' ');
    let database = extra.next().and_then(|d| d.parse::<u32>().ok()).unwrap_or_default();
    let starter_xid = extra.next().and_then(|x| x.parse::<u64>().ok()).unwrap_or_default();
    let worker = extra.next().and_then(|w| w.parse::<i32>().ok()).unwrap_or_default();
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(pg_sys::Oid::from(database)), None);

    if job_id == 0 {
        return resume_database();
    }
    if !wait_for_starter(starter_xid) {
        return;
    }
    let started = in_transaction(|| {
        // One process per worker of a backfill: one launched by backfill_resume() while the
        // paused one is still finishing its page waits here until that one has exited.
        Spi::run_with_args(
            "SELECT pg_catalog.pg_advisory_lock(pg_catalog.hashtext('pg_backfill.worker') + $2, $1::int)",
            &[job_id.into(), worker.into()],
        )
        .unwrap_or_else(|e| error!("{e}"));
        admit_within_cap();
        configure_session(&worker_name(job_id, worker));
        if worker == 0 {
            catalog::set_worker_pid(job_id, Some(unsafe { pg_sys::MyProcPid })).unwrap_or_else(|e| error!("{e}"));
        }
    });
    match started {
        Ok(()) => run(job_id, worker),
        Err(e) => record_failure(job_id, None, &e),
    }
}

/// After a server restart (the launcher starts one such worker per database): relaunches the
/// workers of the database's running backfills, then exits.
fn resume_database() {
    let jobs = in_transaction(|| {
        let installed = Spi::get_one::<bool>("SELECT pg_catalog.to_regclass('backfill.job') IS NOT NULL")
            .ok()
            .flatten()
            .unwrap_or(false);
        if installed {
            catalog::jobs_to_resume().unwrap_or_else(|e| error!("{e}"))
        } else {
            Vec::new()
        }
    });
    for (job_id, parallel) in jobs.unwrap_or_default() {
        if (0..parallel).all(|worker| launch(job_id, worker, 0)) {
            log!("pg_backfill {job_id}: resumed after the server restart");
        } else {
            warning!("pg_backfill {job_id}: could not resume it: no free background worker slot");
        }
    }
}

/// The launcher (with the library in shared_preload_libraries): after every server start, one
/// worker per database looks for backfills to resume. Databases are listed from the `postgres`
/// database, the only one a server can be assumed to have.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn backfill_launcher_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    BackgroundWorker::connect_worker_to_spi(Some("postgres"), None);
    let databases = in_transaction(|| {
        Spi::connect(|client| {
            client
                .select("SELECT oid FROM pg_catalog.pg_database WHERE datallowconn AND NOT datistemplate", None, &[])?
                .map(|row| row.get::<pg_sys::Oid>(1).map(|oid| oid.unwrap_or(pg_sys::InvalidOid)))
                .collect::<Result<Vec<_>, _>>()
        })
        .unwrap_or_else(|e| error!("{e}"))
    });
    for database in databases.unwrap_or_default() {
        if !register(database, 0, 0, 0) {
            warning!("pg_backfill launcher: no free background worker slot to resume backfills");
        }
    }
}

/// Registers the launcher; called from _PG_init while shared_preload_libraries loads.
pub fn register_launcher() {
    if unsafe { pg_sys::IsBinaryUpgrade } {
        log!("pg_backfill: not resuming backfills in binary upgrade mode");
        return;
    }
    BackgroundWorkerBuilder::new("pg_backfill launcher")
        .set_type("pg_backfill launcher")
        .set_library("pg_backfill")
        .set_function("backfill_launcher_main")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(None)
        .load();
}

/// Session settings of the worker: visible in pg_stat_activity, no fsync wait per page, and
/// output forms that do not depend on anyone's configuration.
fn configure_session(name: &str) {
    let settings = [
        ("application_name", name.to_string()),
        // Safe: a page's cursor and its messages are in the same commit record, so after a crash
        // both are there or neither is; only the latest pages can be lost, and they are redone.
        ("synchronous_commit", "off".into()),
        // A page query's generic plan is costed for a fraction of the whole table: on a large
        // table it crosses jit_above_cost, and every page then paid for compiling expressions
        // (and the worker for loading LLVM: 10 MB more memory, seen on a 4M-row table).
        ("jit", "off".into()),
        // The same path privilege::run_as sets, so that plans prepared outside it stay valid inside.
        ("search_path", "pg_catalog, pg_temp".into()),
        ("DateStyle", "ISO".into()),
        ("TimeZone", "UTC".into()),
        ("IntervalStyle", "postgres".into()),
        ("extra_float_digits", "1".into()),
        // The worker runs as a superuser so that row-level security never hides a row from the
        // stream (logical decoding does not filter by it either); make that explicit.
        ("row_security", "off".into()),
        ("statement_timeout", "0".into()),
        // The page queries are prepared once; their plans do not depend on the key values, so
        // planning them again for every page would be wasted work.
        ("plan_cache_mode", "force_generic_plan".into()),
        ("idle_in_transaction_session_timeout", "0".into()),
    ];
    for (name, value) in settings {
        Spi::run_with_args("SELECT pg_catalog.set_config($1, $2, false)", &[name.into(), value.into()])
            .unwrap_or_else(|e| error!("could not set {name}: {e}"));
    }
}

/// Waits until the transaction that launched the worker (backfill_start or backfill_resume)
/// ends. Returns false when it rolled back, so there is nothing to do.
fn wait_for_starter(starter_xid: u64) -> bool {
    if starter_xid == 0 {
        return true; // relaunched after a restart: nobody to wait for
    }
    loop {
        let status = in_transaction(|| {
            Spi::get_one_with_args::<String>(
                "SELECT pg_catalog.pg_xact_status($1::text::xid8)",
                &[starter_xid.to_string().into()],
            )
            .ok()
            .flatten()
        });
        match status.ok().flatten().as_deref() {
            Some("in progress") => {
                BackgroundWorker::wait_latch(Some(Duration::from_millis(50)));
            }
            Some("committed") => return true,
            _ => return false,
        }
    }
}

/// How often a running backfill samples its progress.
const PROGRESS_SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// What a page did.
enum Page {
    /// Nothing: the slot's consumer is away or behind; try again in a second.
    Waiting,
    /// Delivered rows; the table has more.
    More,
    /// The table's scan ended (its end marker is sent).
    TableDone,
    /// The backfill is no longer running (paused by backfill_pause(), cancelled): the worker exits.
    Stopped(String),
}

/// Why a page failed, kept apart from pgrx's error type so that it can be logged and stored.
#[derive(Debug, Clone)]
struct PageError {
    code: PgSqlErrorCode,
    sqlstate: String,
    message: String,
}

impl PageError {
    fn from_report(report: &ErrorReportWithLevel) -> Self {
        let code = report.sql_error_code();
        let mut message = report.message().to_string();
        if let Some(detail) = report.detail() {
            message.push_str(&format!(" ({detail})"));
        }
        PageError { code, sqlstate: sqlstate_of(code), message }
    }

    /// Failures that a later attempt of the same page can get past.
    fn is_transient(&self) -> bool {
        matches!(
            self.code,
            ERRCODE_LOCK_NOT_AVAILABLE
                | ERRCODE_T_R_DEADLOCK_DETECTED
                | ERRCODE_T_R_SERIALIZATION_FAILURE
                | ERRCODE_QUERY_CANCELED
        )
    }
}

fn sqlstate_of(code: PgSqlErrorCode) -> String {
    let mut n = code as i32;
    (0..5)
        .map(|_| {
            let c = ((n & 0x3F) as u8 + b'0') as char;
            n >>= 6;
            c
        })
        .collect()
}

fn report_of(e: CaughtError) -> ErrorReportWithLevel {
    match e {
        CaughtError::PostgresError(r) | CaughtError::ErrorReport(r) => r,
        CaughtError::RustPanic { ereport, .. } => ereport,
    }
}

/// Runs `body` in a transaction of its own: commits when it returns, rolls back and returns the
/// error when it raises one. An error therefore never ends the worker by itself.
fn in_transaction<R>(body: impl FnOnce() -> R + UnwindSafe) -> Result<R, PageError> {
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    PgTryBuilder::new(move || {
        let result = body();
        unsafe {
            pg_sys::PopActiveSnapshot();
            pg_sys::CommitTransactionCommand();
        }
        Ok(result)
    })
    .catch_others(|e| {
        unsafe { pg_sys::AbortCurrentTransaction() };
        Err(PageError::from_report(&report_of(e)))
    })
    .execute()
}

/// Scans every range of the backfill's tables that is this worker's and not done yet; the last
/// worker to finish marks the backfill done.
fn run(job_id: i64, worker: i32) {
    let loaded = in_transaction(|| catalog::job(job_id).ok().flatten().zip(catalog::job_tables(job_id).ok()));
    let Ok(Some((job, tables))) = loaded else {
        return;
    };
    if job.state != RUNNING {
        return;
    }
    let prefix = CString::new(job.message_prefix.clone()).unwrap_or_else(|_| c"backfill".into());
    for table in tables.iter().filter(|t| t.state != DONE && t.worker == worker) {
        let mut scan = match TableScan::open(job_id, &job, table, &prefix) {
            Ok(scan) => scan,
            Err(e) => return record_failure(job_id, Some(table), &e),
        };
        if !scan.run() {
            return;
        }
    }
    let finished = in_transaction(|| {
        // Pages commit without waiting for the WAL flush; this last commit waits for it, so
        // that once the backfill shows done, every message is flushed and decodable.
        Spi::run("SELECT pg_catalog.set_config('synchronous_commit', 'on', true)").unwrap_or_else(|e| error!("{e}"));
        if catalog::all_ranges_done(job_id)? {
            catalog::finish_job(job_id, DONE, None)
        } else {
            Ok(false)
        }
    });
    if matches!(finished, Ok(Ok(true))) {
        log!("pg_backfill {job_id}: done");
    }
}

/// The scan of one table by the worker.
struct TableScan<'a> {
    job_id: i64,
    /// Prepared once per scan: the page bound query (by whether a cursor exists) and the page
    /// rows query (by that and the locking).
    page_end_plans: HashMap<bool, OwnedPreparedStatement>,
    page_rows_plans: HashMap<(bool, Locking), pg_sys::SPIPlanPtr>,
    slot: Option<String>,
    position: i32,
    batch_size: i32,
    pacer: Pacer,
    /// None until the first page: it samples at once.
    last_sample: Option<Instant>,
    last_log: Instant,
    prefix: &'a CString,
    table: Table,
    /// The table's owner when the page began: its queries run as this role.
    owner: pg_sys::Oid,
    queries: ScanQueries,
    key_columns: Vec<usize>,
    row: RowJson,
    messages: ReadMessage,
}

impl<'a> TableScan<'a> {
    fn open(job_id: i64, job: &catalog::Job, job_table: &JobTable, prefix: &'a CString) -> Result<Self, PageError> {
        let relid = job_table.relid;
        let inspected = in_transaction(|| eligibility::inspect(relid))?;
        let table = inspected.map_err(|why| PageError {
            code: why.code,
            sqlstate: sqlstate_of(why.code),
            message: format!("table {relid:?} can no longer be backfilled: {}", why.reason),
        })?;
        let row = in_transaction(|| RowJson::new(&table.columns))?;
        Ok(TableScan {
            job_id,
            page_end_plans: HashMap::new(),
            page_rows_plans: HashMap::new(),
            position: job_table.position,
            batch_size: job.batch_size,
            pacer: Pacer::new(job.rows_per_second),
            last_sample: None,
            last_log: Instant::now(),
            prefix,
            queries: ScanQueries::new(&table),
            key_columns: table.key.iter().map(|k| k.position).collect(),
            row,
            messages: ReadMessage::new(job_id, job.slot_name.as_deref(), &table),
            slot: job.slot_name.clone(),
            owner: table.owner,
            table,
        })
    }

    /// Pages until the table is done (true) or the backfill stops (false).
    fn run(&mut self) -> bool {
        let mut rows_per_page = self.batch_size;
        let mut failures = 0;
        loop {
            reload_config_if_asked();
            rows_per_page = rows_per_page.min(self.batch_size);
            self.pacer.wait_for(rows_per_page);
            let rows = rows_per_page;
            let result = in_transaction(AssertUnwindSafe(|| self.page(rows)));
            match result {
                Ok(Page::Waiting) => {
                    BackgroundWorker::wait_latch(Some(Duration::from_secs(1)));
                }
                Ok(Page::More) => {
                    self.pacer.spend(rows_per_page);
                    failures = 0;
                    // Grow back after a lock conflict made the pages small.
                    rows_per_page = (rows_per_page * 2).min(self.batch_size);
                }
                Ok(Page::TableDone) => return true,
                Ok(Page::Stopped(state)) => {
                    log!("pg_backfill {}: {state}, its worker exits", self.job_id);
                    return false;
                }
                Err(e) if e.code == ERRCODE_LOCK_NOT_AVAILABLE && rows_per_page > 1 => {
                    // A writer holds one of the page's rows: retry at once with half the page,
                    // down to the one row that waits.
                    rows_per_page = (rows_per_page / 2).max(1);
                }
                Err(e) if e.is_transient() && failures < settings::MAX_RETRIES.get() => {
                    failures += 1;
                    if !self.back_off(failures) {
                        return false;
                    }
                }
                Err(e) => {
                    self.fail(&e);
                    return false;
                }
            }
        }
    }

    /// Sleeps before a retry: 50 ms, doubling, at most one second. False if cancelled meanwhile.
    fn back_off(&self, failures: i32) -> bool {
        let millis = 50u64 << failures.clamp(0, 5);
        BackgroundWorker::wait_latch(Some(Duration::from_millis(millis.min(1000))));
        matches!(in_transaction(|| catalog::job_state(self.job_id)), Ok(Ok(Some(s))) if s == RUNNING)
    }

    fn fail(&self, e: &PageError) {
        let job_table =
            in_transaction(|| catalog::job_table(self.job_id, self.position)).ok().and_then(|r| r.ok()).flatten();
        record_failure(self.job_id, job_table.as_ref(), e);
    }

    /// One page, inside its own transaction.
    fn page(&mut self, rows_per_page: i32) -> Page {
        let job = catalog::job(self.job_id)
            .unwrap_or_else(|e| error!("{e}"))
            .unwrap_or_else(|| error!("backfill {} no longer exists", self.job_id));
        if job.state != RUNNING && !job.is_waiting() {
            return Page::Stopped(job.state);
        }
        // backfill_set() takes effect here.
        self.batch_size = job.batch_size;
        self.pacer.set_rate(job.rows_per_second);
        if let Some(reason) = pipeline::blocker(&job) {
            if catalog::set_waiting(self.job_id, Some(&reason)).unwrap_or_else(|e| error!("{e}")) {
                log!("pg_backfill {}: paused, {reason}", self.job_id);
            }
            return Page::Waiting;
        }
        if job.is_waiting() && catalog::set_waiting(self.job_id, None).unwrap_or_else(|e| error!("{e}")) {
            log!("pg_backfill {}: continues, the slot's consumer is back and caught up", self.job_id);
        }
        let progress = catalog::job_table(self.job_id, self.position)
            .unwrap_or_else(|e| error!("{e}"))
            .unwrap_or_else(|| error!("backfill {} lost its table {}", self.job_id, self.position));
        self.owner = privilege::owner_of(self.table.relid);
        privilege::require_starter_rights(&job.started_by, self.table.relid, &self.table.qualified_name());
        let signer = Signer::for_this_transaction();
        if progress.state == "pending" {
            return self.start_scan(&progress, &signer);
        }
        let Some(upper_bound) = progress.upper_bound.clone() else {
            return self.end_scan(progress.rows_done, &signer);
        };
        report_activity(&format!(
            "backfill {}: {} after key ({})",
            self.job_id,
            self.table.qualified_name(),
            progress.cursor.as_deref().map(|c| c.join(", ")).unwrap_or_default()
        ));
        if !self.row.describes(self.table.relid) {
            self.reload_columns();
        }
        let cursor = progress.cursor.clone();
        let Some(page_end) = self.page_end(cursor.as_deref(), &upper_bound, rows_per_page) else {
            return self.end_scan(progress.rows_done, &signer);
        };
        let (rows, bytes) = self.deliver(cursor.as_deref(), &page_end, rows_per_page, &signer);
        if page_end == upper_bound {
            // The table's ranges are locked before this range's row is updated, as in every
            // other end and start: always in the same order, so workers never deadlock.
            let ranges = self.lock_table_ranges();
            catalog::advance_cursor(self.job_id, self.position, page_end, rows, bytes)
                .unwrap_or_else(|e| error!("{e}"));
            return self.end_scan_locked(progress.rows_done + rows, &ranges, &signer);
        }
        catalog::advance_cursor(self.job_id, self.position, page_end.clone(), rows, bytes)
            .unwrap_or_else(|e| error!("{e}"));
        self.report_progress(&page_end, &progress, &upper_bound, progress.rows_done + rows);
        Page::More
    }

    /// Every few seconds: a progress sample (for the rate over the last minute) and the share
    /// of the key range scanned (for the time left); at backfill.log_interval, a log line.
    fn report_progress(&mut self, cursor: &[String], progress: &JobTable, upper_bound: &[String], rows_done: i64) {
        if self.last_sample.is_some_and(|at| at.elapsed() < PROGRESS_SAMPLE_INTERVAL) {
            return;
        }
        self.last_sample = Some(Instant::now());
        catalog::record_progress(self.job_id).unwrap_or_else(|e| error!("{e}"));
        // The histogram's bounds are cast to the key's type: as the table's owner.
        let fraction = privilege::run_as(self.owner, || {
            Spi::get_one_with_args::<f64>(
                &self.queries.key_fraction(),
                &[
                    cursor[0].clone().into(),
                    upper_bound[0].clone().into(),
                    progress.lower_bound.as_ref().map(|l| l[0].clone()).into(),
                    self.table.schema.clone().into(),
                    self.table.name.clone().into(),
                    self.table.key[0].name.clone().into(),
                ],
            )
        })
        .unwrap_or(None);
        catalog::set_key_fraction(self.job_id, self.position, fraction).unwrap_or_else(|e| error!("{e}"));
        let interval = settings::LOG_INTERVAL_S.get();
        if interval > 0 && self.last_log.elapsed() >= Duration::from_secs(interval as u64) {
            self.last_log = Instant::now();
            let percent = fraction.map(|f| format!("{:.1}% of the key range, ", 100.0 * f)).unwrap_or_default();
            log!(
                "pg_backfill {}: {} {percent}{rows_done} of about {} rows",
                self.job_id,
                self.table.qualified_name(),
                progress.rows_estimated
            );
        }
    }

    /// Fixes the upper bound (the greatest key now) and sends the start marker.
    fn start_scan(&mut self, progress: &JobTable, signer: &Signer) -> Page {
        let ranges = self.lock_table_ranges();
        let first_range = ranges.iter().all(|(position, state, _)| *position == self.position || state == "pending");
        // The greatest key now: the upper bound of a table scanned whole or of its last range,
        // and what the start marker announces.
        let greatest = (first_range || progress.upper_bound.is_none()).then(|| self.greatest_key()).flatten();
        if first_range {
            let json = greatest.as_ref().map(|(_, json)| json.as_slice());
            let rows_estimated = ranges.len() as i64 * progress.rows_estimated;
            let marker = message::table_start(self.job_id, self.slot.as_deref(), &self.table, json, rows_estimated);
            message::emit_marker(self.prefix, signer, marker);
        }
        let upper_bound = progress.upper_bound.clone().or(greatest.map(|(key, _)| key));
        catalog::start_table(self.job_id, self.position, upper_bound.clone()).unwrap_or_else(|e| error!("{e}"));
        let bound = upper_bound
            .as_deref()
            .map(|k| format!("key ({})", k.join(", ")))
            .unwrap_or_else(|| "nothing: it is empty".into());
        log!("pg_backfill {}: scanning {} up to {bound}", self.job_id, self.table.qualified_name());
        if upper_bound.is_none() {
            return self.end_scan_locked(0, &ranges, signer);
        }
        Page::More
    }

    /// The greatest key of the table now, as text values and as JSON values; None if empty.
    fn greatest_key(&self) -> Option<(Vec<String>, Vec<String>)> {
        privilege::run_as(self.owner, || {
            Spi::connect(|client| {
                let rows = client.select(&self.queries.upper_bound(), None, &[])?;
                if rows.is_empty() {
                    return Ok::<_, pgrx::spi::Error>(None);
                }
                let row = rows.first();
                let k = self.queries.key_len();
                let column = |i: usize| row.get::<String>(i).map(|v| v.unwrap_or_default());
                let key = (1..=k).map(column).collect::<Result<Vec<_>, _>>()?;
                let json = (k + 1..=2 * k).map(column).collect::<Result<Vec<_>, _>>()?;
                Ok(Some((key, json)))
            })
        })
        .unwrap_or_else(|e| error!("{e}"))
    }

    /// Every range of this table in the backfill (one, unless parallel), locked in order.
    fn lock_table_ranges(&self) -> Vec<(i32, String, i64)> {
        catalog::lock_table_ranges(self.job_id, self.position).unwrap_or_else(|e| error!("{e}"))
    }

    /// Ends the scan of a range whose rows `ranges` are locked: marks it done and, if it is
    /// the table's last range to end, sends the table's end marker with the table's row count.
    fn end_scan_locked(&mut self, rows: i64, ranges: &[(i32, String, i64)], signer: &Signer) -> Page {
        let others = ranges.iter().filter(|(position, _, _)| *position != self.position);
        if others.clone().all(|(_, state, _)| state == DONE) {
            let total = rows + others.map(|(_, _, rows)| rows).sum::<i64>();
            let marker = message::table_end(self.job_id, self.slot.as_deref(), &self.table, total);
            message::emit_marker(self.prefix, signer, marker);
            log!("pg_backfill {}: {} done, {total} rows", self.job_id, self.table.qualified_name());
        }
        catalog::finish_table(self.job_id, self.position).unwrap_or_else(|e| error!("{e}"));
        Page::TableDone
    }

    /// Ends the scan of this range when no key is left in it.
    fn end_scan(&mut self, rows: i64, signer: &Signer) -> Page {
        let ranges = self.lock_table_ranges();
        self.end_scan_locked(rows, &ranges, signer)
    }

    /// The table's columns changed since the scan began (ALTER TABLE): rows are rendered, and
    /// pages queried, as the table is now. Its key cannot change under a scan ordered by it.
    fn reload_columns(&mut self) {
        // The page's snapshot was taken before the ALTER TABLE committed (describes() waited
        // for it): the catalog is read with a snapshot taken now.
        unsafe {
            pg_sys::PopActiveSnapshot();
            pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
        }
        let table = eligibility::require(self.table.relid);
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
            "pg_backfill {}: the columns of {} changed; rows are read as they are now",
            self.job_id,
            table.qualified_name()
        );
        for (_, plan) in self.page_rows_plans.drain() {
            unsafe { pg_sys::SPI_freeplan(plan) };
        }
        self.page_end_plans.clear();
        self.queries = ScanQueries::new(&table);
        self.key_columns = table.key.iter().map(|k| k.position).collect();
        self.row = RowJson::new(&table.columns);
        self.messages = ReadMessage::new(self.job_id, self.slot.as_deref(), &table);
        self.table = table;
    }

    /// A page query's parameters: the cursor (unless at the start), then `then`.
    fn key_args(cursor: Option<&[String]>, then: &[String]) -> Vec<String> {
        cursor.unwrap_or_default().iter().chain(then).cloned().collect()
    }

    /// The last key of the next page, or None when no key is left up to the upper bound.
    fn page_end(&mut self, cursor: Option<&[String]>, upper_bound: &[String], rows: i32) -> Option<Vec<String>> {
        let mut args: Vec<pgrx::datum::DatumWithOid> =
            Self::key_args(cursor, upper_bound).into_iter().map(|v| v.into()).collect();
        args.push(i64::from(rows).into());
        let after_cursor = cursor.is_some();
        let queries = &self.queries;
        let types = args.len();
        let plan = self.page_end_plans.entry(after_cursor).or_insert_with(|| {
            let mut oids = vec![PgOid::BuiltIn(PgBuiltInOids::TEXTOID); types - 1];
            oids.push(PgOid::BuiltIn(PgBuiltInOids::INT8OID));
            Spi::connect(|client| client.prepare(queries.page_end(after_cursor).as_str(), &oids).map(|p| p.keep()))
                .unwrap_or_else(|e| error!("could not prepare the page bound query: {e}"))
        });
        privilege::run_as(self.owner, || {
            Spi::connect(|client| {
                let result = client.select(&*plan, None, &args)?;
                if result.is_empty() {
                    return Ok::<_, pgrx::spi::Error>(None);
                }
                // No row, or max() of no rows (NULL): no key is left. Key columns are never NULL.
                let row = result.first();
                (0..self.queries.key_len()).map(|i| row.get::<String>(i + 1)).collect::<Result<Option<Vec<_>>, _>>()
            })
        })
        .unwrap_or_else(|e| error!("{e}"))
    }

    /// Locks and reads every row from the cursor (exclusive) to the page's end (inclusive),
    /// emitting one message per row. Returns rows and payload bytes delivered.
    fn deliver(
        &mut self,
        cursor: Option<&[String]>,
        page_end: &[String],
        rows_per_page: i32,
        signer: &Signer,
    ) -> (i64, i64) {
        let locking = if settings::TEST_SKIP_ROW_LOCKS.get() {
            Locking::None
        } else if rows_per_page == 1 {
            let timeout = settings::LOCK_TIMEOUT_MS.get().to_string();
            Spi::run_with_args("SELECT pg_catalog.set_config('lock_timeout', $1, true)", &[timeout.into()])
                .unwrap_or_else(|e| error!("{e}"));
            Locking::Wait
        } else {
            Locking::NoWait
        };
        let args = Self::key_args(cursor, page_end);
        let queries = &self.queries;
        let plan = *self
            .page_rows_plans
            .entry((cursor.is_some(), locking))
            .or_insert_with(|| delivery::prepare(&queries.page_rows(cursor.is_some(), locking), args.len()));
        let mut sink = delivery::Sink {
            key_columns: &self.key_columns,
            partitioned: self.table.partitioned,
            row: &mut self.row,
            messages: &mut self.messages,
            prefix: self.prefix,
            signer,
            rows: 0,
            bytes: 0,
        };
        // The rows' casts to json and the key's input functions are user code: as the owner.
        privilege::run_as(self.owner, || delivery::run(plan, &args, &mut sink));
        (sink.rows, sink.bytes)
    }
}

/// Paces a backfill to a rate with a token bucket: rows are allowed as time passes, and at most
/// a page or a tenth of a second's worth can be saved up, so the rate holds over any window of a
/// second or more whatever the page size, with no fixed sleep per page.
struct Pacer {
    rows_per_second: Option<f64>,
    allowance: f64,
    last: Instant,
}

impl Pacer {
    fn new(rows_per_second: Option<i32>) -> Self {
        Pacer { rows_per_second: rows_per_second.map(f64::from), allowance: 0.0, last: Instant::now() }
    }

    fn refill(&mut self, rate: f64, capacity: f64) {
        let now = Instant::now();
        self.allowance = (self.allowance + rate * now.duration_since(self.last).as_secs_f64()).min(capacity);
        self.last = now;
    }

    /// Sleeps until a page of `rows` fits the rate.
    fn wait_for(&mut self, rows: i32) {
        let Some(rate) = self.rows_per_second else { return };
        let needed = f64::from(rows);
        let capacity = needed.max(rate / 10.0);
        self.refill(rate, capacity);
        while self.allowance < needed {
            let wait = Duration::from_secs_f64((needed - self.allowance) / rate);
            BackgroundWorker::wait_latch(Some(wait.max(Duration::from_millis(1))));
            self.refill(rate, capacity);
        }
    }

    fn set_rate(&mut self, rows_per_second: Option<i32>) {
        self.rows_per_second = rows_per_second.map(f64::from);
    }

    fn spend(&mut self, rows: i32) {
        if self.rows_per_second.is_some() {
            self.allowance -= f64::from(rows);
        }
    }
}

fn reload_config_if_asked() {
    unsafe {
        if pg_sys::ConfigReloadPending != 0 {
            pg_sys::ConfigReloadPending = 0;
            pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP);
        }
    }
}

fn report_activity(what: &str) {
    if let Ok(what) = CString::new(what) {
        unsafe { pg_sys::pgstat_report_activity(pg_sys::BackendState::STATE_RUNNING, what.as_ptr()) };
    }
}

/// Stops the backfill in state failed, with the error, the table and the key it stopped at.
fn record_failure(job_id: i64, table: Option<&JobTable>, e: &PageError) {
    let recorded = in_transaction(AssertUnwindSafe(|| {
        let place = table
            .map(|t| {
                let cursor = t.cursor.as_deref().map(|c| c.join(", ")).unwrap_or_else(|| "(start)".into());
                format!(" [table {}, stopped after key {cursor}]", eligibility::relation_name(t.relid))
            })
            .unwrap_or_default();
        let message = format!("{}{place}", e.message);
        warning!("pg_backfill {job_id} failed: {} {message}", e.sqlstate);
        catalog::finish_job(job_id, FAILED, Some((&e.sqlstate, &message))).unwrap_or_else(|e| error!("{e}"));
    }));
    if let Err(e) = recorded {
        warning!("pg_backfill {job_id}: could not record its failure: {}", e.message);
    }
}
