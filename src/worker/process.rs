//! The background worker: one per backfill (or per key range, with parallel workers). It scans
//! its tables in order, one page per transaction (`page.rs`), retries transient failures with
//! back-off, and records why it stops. How every backfill worker starts, whatever its entry
//! (`start`: the coordinator's follower of a Citus distributed backfill starts so too).

use crate::catalog::job;
use crate::catalog::job_table::{self, JobTable};
use crate::model::state::{JobState, RangeState};
use crate::model::table;
use crate::pg::compat;
use crate::pg::errors::OrInternal;
use crate::pg::locks;
use crate::pg::privilege;
use crate::pg::settings;
use crate::throttle::pacing;
use crate::worker::activity::{self, worker_name};
use crate::worker::launcher::{self, admit_within_cap, Entry};
use crate::worker::scan::{Page, TableScan};
use crate::worker::shared_progress::{self, Phase};
use crate::worker::xact::{in_transaction, in_transaction_retried, who, PageError};
use pgrx::bgworkers::{BackgroundWorker, SignalWakeFlags};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;
use std::ffi::CString;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

/// The worker that scans a backfill's tables (and the per-database resumer after a restart).
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn backfill_worker_main(arg: pg_sys::Datum) {
    if let Some(Work::Backfill { backfill_id, worker }) = start(arg, Entry::Scan) {
        run(backfill_id, worker);
        start_what_follows_queued(backfill_id);
    }
}

/// What a worker process is to do once started.
#[derive(Debug, PartialEq, Eq)]
pub enum Work {
    /// Scan (or follow, on a Citus coordinator) worker `worker` of a backfill, admitted.
    Backfill { backfill_id: i64, worker: i32 },
    /// Start what the follows have queued (the dispatcher's entry, follow/dispatch.rs).
    Dispatch,
}

/// A backfill that ended (done, failed, cancelled) frees its slot and its workers: a dispatcher
/// starts the next table a follow has queued for a free slot now. (One that was paused holds
/// its slot; one that is still running, another worker of it will end.)
fn start_what_follows_queued(backfill_id: i64) {
    let ended = in_transaction(|| {
        job::job_state(backfill_id)
            .is_some_and(|state| matches!(state, JobState::Done | JobState::Failed | JobState::Cancelled))
    });
    if ended.unwrap_or(false) {
        launcher::dispatch_now();
    }
}

/// What every backfill worker process does first, whatever its entry (this file's, or the Citus
/// coordinator's follower: citus/follower.rs): signals, connecting, waiting for the transaction
/// that launched it, its lock and admission, its session settings. The backfill and the worker's
/// number, once admitted, or the dispatcher's work under its entry; None when there is nothing
/// (more) for this process to do: it was the resumer, the starter rolled back, the backfill is
/// another entry's, or the start failed (then recorded).
pub fn start(arg: pg_sys::Datum, entry: Entry) -> Option<Work> {
    // SIGTERM (pg_terminate_backend, shutdown) ends the worker at once, as for any backend:
    // the open page rolls back, the process exits with code 1, and the postmaster restarts it.
    // SAFETY: installs PostgreSQL's own handler, as any backend has it.
    unsafe {
        compat::die_on_sigterm();
    }
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP);

    let Some(task) = launcher::Task::of_this_worker(arg) else {
        log!("pg_backfill: a worker with unreadable start arguments ({:?}) stops", BackgroundWorker::get_extra());
        // A clean exit before touching shared state; 0, so it is not restarted.
        compat::exit_process(0)
    };
    let database = task.database();
    let (backfill_id, worker, starter_xid) = match task {
        launcher::Task::Backfill { backfill_id, worker, starter_xid, .. } => (backfill_id, worker, starter_xid),
        launcher::Task::Resume { .. } | launcher::Task::Dispatch { .. } => (0, 0, 0),
    };
    // A worker of a database dropped since (DROP DATABASE ... WITH (FORCE) terminates it) would
    // fail to connect and be restarted every second for ever: it stops for good instead. Its
    // backfills went with the database. (Before connecting, the database's directory is the
    // one thing a process can look at.)
    if !std::path::Path::new(&format!("base/{database}")).exists() {
        log!("pg_backfill {backfill_id}: database {database} no longer exists, its worker stops");
        // A clean exit, before the process has touched any shared state: the postmaster does
        // not restart a worker that exits with 0.
        compat::exit_process(0);
    }
    // Counted by backfill_start() against backfill.max_workers from the moment it is visible.
    launcher::show_as(&match task {
        launcher::Task::Backfill { .. } => activity::starting_name(backfill_id, worker),
        launcher::Task::Resume { .. } => activity::RESUMER_NAME.into(),
        launcher::Task::Dispatch { .. } => activity::DISPATCHER_NAME.into(),
    });
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(pg_sys::Oid::from(database)), None);
    launcher::override_search_path();
    // Log lines name the database; its name is read once, in a transaction.
    let _ = in_transaction(|| who(backfill_id));

    match task {
        launcher::Task::Resume { .. } => {
            launcher::resume_database();
            return None;
        }
        // (Under another entry: registered so by an earlier library.)
        launcher::Task::Dispatch { .. } if entry == Entry::Dispatch => return Some(Work::Dispatch),
        launcher::Task::Dispatch { .. } => {
            launcher::dispatch_now();
            return None;
        }
        launcher::Task::Backfill { .. } => {}
    }
    if !wait_for_starter(starter_xid) {
        return None;
    }
    // A process registered under the other entry (by a library from before the Citus follower
    // had an entry of its own, restarted by the postmaster since) hands the backfill over.
    if let Ok(own) = in_transaction(|| Entry::of(backfill_id)) {
        if own != entry {
            launcher::hand_over(own, backfill_id, worker);
            return None;
        }
    }
    if !wait_for_worker_lock(backfill_id, worker) {
        return None;
    }
    let started = in_transaction(|| {
        admit_within_cap();
        configure_session(&worker_name(backfill_id, worker));
        if worker == 0 {
            // SAFETY: this process's pid.
            let pid = unsafe { pg_sys::MyProcPid };
            job::set_worker_pid(backfill_id, Some(pid));
        }
    });
    match started {
        Ok(()) => Some(Work::Backfill { backfill_id, worker }),
        Err(e) => {
            record_failure(backfill_id, None, &e);
            None
        }
    }
}

/// One process per worker of a backfill: one launched by backfill_resume() while the paused one
/// is still finishing its page waits here until that one has exited (the lock is held until the
/// process exits). While it waits it looks at the backfill each time round: cancelled, paused
/// again or ended meanwhile, it exits, since nothing is left for it to do. False then.
fn wait_for_worker_lock(backfill_id: i64, worker: i32) -> bool {
    loop {
        match in_transaction(|| locks::try_lock_worker(backfill_id, worker)) {
            Ok(true) => return true,
            Ok(false) => {}
            Err(e) => {
                record_failure(backfill_id, None, &e);
                return false;
            }
        }
        // (As the worker reads it: a backfill a 0.2.0 worker paused while waiting is running.)
        match in_transaction(|| job::job(backfill_id).map(|job| job.state)) {
            Ok(Some(JobState::Running)) | Err(_) => {}
            Ok(Some(state)) => {
                log!("{}: {state} while its worker waited to start, its worker exits", who(backfill_id));
                return false;
            }
            Ok(None) => {
                log!("{}: no longer exists, its worker exits", who(backfill_id));
                return false;
            }
        }
        pacing::sleep(Duration::from_millis(100));
    }
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
        // Each page statement takes its own snapshot, after the page's lock (lock.rs): READ
        // COMMITTED, whatever the server's, the database's or the role's default.
        ("default_transaction_isolation", "read committed".into()),
        ("statement_timeout", "0".into()),
        // The page queries are prepared once; their plans do not depend on the key values, so
        // planning them again for every page would be wasted work.
        ("plan_cache_mode", "force_generic_plan".into()),
        ("idle_in_transaction_session_timeout", "0".into()),
    ];
    for (name, value) in settings {
        Spi::run_with_args("SELECT pg_catalog.set_config($1, $2, false)", &[name.into(), value.into()])
            .or_internal(&format!("set {name}"));
    }
    // Citus hides shards from catalog queries of sessions not its own: a shard the worker
    // scans would look dropped (see pg/citus.rs). Only when Citus is loaded.
    Spi::run(
        "SELECT pg_catalog.set_config('citus.override_table_visibility', 'off', false)
          WHERE pg_catalog.current_setting('citus.override_table_visibility', true) IS NOT NULL",
    )
    .or_internal("show Citus's shards");
}

/// Waits until the transaction that launched the worker (backfill_start or backfill_resume)
/// ends. Returns false when it rolled back, so there is nothing to do.
fn wait_for_starter(starter_xid: u64) -> bool {
    if starter_xid == 0 {
        return true; // relaunched after a restart: nobody to wait for
    }
    loop {
        let status = in_transaction(|| {
            crate::pg::spi::select_one::<String>(
                "SELECT pg_catalog.pg_xact_status($1::pg_catalog.text::pg_catalog.xid8)",
                &[starter_xid.to_string().into()],
            )
            .ok()
            .flatten()
        });
        match status.ok().flatten().as_deref() {
            Some("in progress") => {
                pacing::sleep(Duration::from_millis(50));
            }
            Some("committed") => return true,
            // Too old for the commit log (a worker restarted long after its start): whether
            // the backfill exists, and runs, is the next step's to find out.
            None => return true,
            _ => return false,
        }
    }
}

/// Scans every range of the backfill's tables that is this worker's and not done yet; the last
/// worker to finish marks the backfill done. Every way out leaves the backfill's state saying
/// why: done, failed with the error, or the state that stopped it (paused, cancelled).
fn run(backfill_id: i64, worker: i32) {
    let loaded = in_transaction_retried(|| {
        job::job(backfill_id).map(|job| {
            let starter = privilege::role_named(&job.started_by).unwrap_or(pg_sys::InvalidOid);
            (job, job_table::job_tables(backfill_id), starter)
        })
    });
    let (job, tables, starter) = match loaded {
        Ok(Some(loaded)) => loaded,
        Ok(None) => return log!("{}: no longer exists, its worker exits", who(backfill_id)),
        Err(e) => return record_failure(backfill_id, None, &e),
    };
    if job.state != JobState::Running {
        return log!("{}: {}, its worker exits", who(backfill_id), job.state);
    }
    // SAFETY: this backend's database, set when it connected.
    shared_progress::claim(unsafe { pg_sys::MyDatabaseId }, starter, backfill_id, worker);
    let prefix = CString::new(job.message_prefix.clone()).unwrap_or_else(|_| c"backfill".into());
    for table in tables.iter().filter(|t| t.state != RangeState::Done && t.worker == worker) {
        shared_progress::set_phase(Phase::Starting);
        shared_progress::set_range(table.relid, table.position, table.rows_done, table.rows_estimated);
        let mut scan = match TableScan::open(backfill_id, &job, table, &prefix) {
            Ok(scan) => scan,
            Err(e) => return record_failure(backfill_id, Some(table), &e),
        };
        let scanned = scan_table(&mut scan);
        let _ = in_transaction(|| scan.forget_plans());
        if !scanned {
            return;
        }
    }
    shared_progress::set_phase(Phase::Finishing);
    let finished = in_transaction_retried(|| {
        wait_for_flush_at_commit();
        job_table::all_ranges_done(backfill_id)
            && job::move_job(backfill_id, &[JobState::Running], JobState::Done, None, None)
    });
    match finished {
        Ok(true) => log!("{}: done", who(backfill_id)),
        // Another worker's range is still running (the last one marks it done), or the
        // backfill was paused or cancelled meanwhile (its state says so).
        Ok(false) => log!("{}: this worker's ranges are done, its worker exits", who(backfill_id)),
        Err(e) => record_failure(backfill_id, None, &e),
    }
}

/// While the worker rests on a busy server, it creates the WAL segment its pages (and the
/// application) will write next, before anyone needs it: the commit that would otherwise first
/// write into it waits for its creation, and every commit behind that one too (pg/wal.rs). It
/// does so at the start of its rest, so the creation takes nothing from the rest's length nor
/// adds to it. If it cannot (a full disk), the commit that needs the segment will say so: the
/// worker only logs it.
fn prepare_next_wal_segment(backfill_id: i64) {
    let Some(segment) = crate::pg::wal::next_segment_to_prepare() else { return };
    if let Err(e) = in_transaction(AssertUnwindSafe(|| segment.create())) {
        log!("{}: could not create the next WAL segment ahead of its writers: {}", who(backfill_id), e.message);
    }
}

/// Pages until the table is done (true) or the backfill stops (false).
fn scan_table(scan: &mut TableScan) -> bool {
    let mut failures = 0;
    loop {
        reload_config_if_asked();
        if !scan.throttle().ready_for_page() {
            // Not its turn yet: look at the backfill again (cancelled, paused, paced anew?).
            match in_transaction(AssertUnwindSafe(|| scan.refresh())) {
                Ok(Err(state)) => {
                    log!("{}: {state}, its worker exits", who(scan.backfill_id()));
                    return false;
                }
                Ok(Ok(_)) | Err(_) => continue,
            }
        }
        let result = in_transaction(AssertUnwindSafe(|| scan.page()));
        match result {
            Ok(Page::Waiting) => {
                pacing::sleep(pacing::LONGEST_SLEEP);
            }
            Ok(Page::More) => {
                scan.throttle().page_delivered();
                if scan.throttle().resting() {
                    prepare_next_wal_segment(scan.backfill_id());
                }
                failures = 0;
            }
            Ok(Page::TableDone) => return true,
            Ok(Page::Stopped(state)) => {
                log!("{}: {state}, its worker exits", who(scan.backfill_id()));
                return false;
            }
            // A writer holds one of the page's rows: the page is retried at once, with half the
            // rows (the guard shrinks the page, when it can).
            Err(e) if e.code == ERRCODE_LOCK_NOT_AVAILABLE && scan.throttle().shrink_after_lock_conflict() => {}
            Err(e) if e.is_transient() && failures < settings::max_retries() => {
                failures += 1;
                if !back_off(scan, failures) {
                    return false;
                }
            }
            Err(e) => {
                fail(scan, &e);
                return false;
            }
        }
    }
}

/// Sleeps before a retry: 50 ms, doubling, at most one second. False if the backfill was
/// stopped meanwhile (its state says why); a failure to look is the next retry's to report.
fn back_off(scan: &TableScan, failures: i32) -> bool {
    let millis = 50u64 << failures.clamp(0, 5);
    pacing::sleep(Duration::from_millis(millis));
    !matches!(in_transaction(|| job::job_state(scan.backfill_id())), Ok(Some(state)) if state != JobState::Running)
}

fn fail(scan: &TableScan, e: &PageError) {
    let job_table = in_transaction(|| job_table::job_table(scan.backfill_id(), scan.position())).ok().flatten();
    record_failure(scan.backfill_id(), job_table.as_ref(), e);
}

fn reload_config_if_asked() {
    // SAFETY: the flag the SIGHUP handler sets, read and cleared by this process alone.
    unsafe {
        if pg_sys::ConfigReloadPending != 0 {
            pg_sys::ConfigReloadPending = 0;
            pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP);
        }
    }
}

/// Pages commit without waiting for the WAL flush. The commit that ends a backfill (done or
/// failed) waits for it, so that once the backfill shows it, every message it delivered is
/// flushed and decodable.
fn wait_for_flush_at_commit() {
    Spi::run("SELECT pg_catalog.set_config('synchronous_commit', 'on', true)")
        .or_internal("make the commit wait for the flush");
}

/// Stops the backfill in state failed, with the error, the table and the key it stopped at.
fn record_failure(backfill_id: i64, table: Option<&JobTable>, e: &PageError) {
    let recorded = in_transaction(AssertUnwindSafe(|| {
        wait_for_flush_at_commit();
        let cursor =
            table.map(|t| t.cursor.as_deref().map(crate::pg::encoding::show_key).unwrap_or_else(|| "(start)".into()));
        let table_name = table.map(|t| table::relation_name(t.relid));
        let place = match (&table_name, &cursor) {
            (Some(name), Some(cursor)) => format!(" [table {name}, stopped after key {cursor}]"),
            _ => String::new(),
        };
        // Stored as errors are reported (see errors::for_server): it names tables and keys.
        let text = |text: &str| crate::pg::errors::for_server(text).into_owned();
        let message = text(&format!("{}{place}", e.message));
        warning!("{} failed: {} {message}", who(backfill_id), e.sqlstate);
        if job::move_job(backfill_id, &[JobState::Running], JobState::Failed, None, Some((&e.sqlstate, &message))) {
            job::record_error(&job::JobError {
                backfill_id,
                relid: table.map(|t| t.relid),
                table: table_name.as_deref(),
                stopped_after_key: cursor.as_deref().map(text).as_deref(),
                sqlstate: &e.sqlstate,
                message: &text(&e.primary),
                detail: e.detail.as_deref().map(text).as_deref(),
            });
        }
    }));
    if let Err(e) = recorded {
        warning!("{}: could not record its failure: {}", who(backfill_id), e.message);
    }
}
