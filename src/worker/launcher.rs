//! Starting workers: the registration of a backfill's workers and the cap on how many run, the
//! launcher that runs after every server start when the library is preloaded, and the
//! per-database resumer it starts.

use crate::catalog::job;
use crate::catalog::job_shard;
use crate::catalog::schema;
use crate::pg::errors::raise;
use crate::pg::errors::OrInternal;
use crate::pg::privilege;
use crate::pg::settings;
use crate::worker::activity::{self, worker_name, DISPATCHER_NAME, RESUMER_NAME, WORKERS_OF_BACKFILL};
use crate::worker::xact::{in_transaction, who};
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;
use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::time::Duration;

/// Registers the worker of a backfill, running `entry`. It connects to this database and,
/// before doing anything, waits for the transaction that recorded the backfill (which may not
/// have committed yet; registration is not transactional) and gives up if that one rolled back.
fn launch(entry: Entry, backfill_id: i64, worker: i32, starter_xid: u64) -> bool {
    // SAFETY: this backend's database, set when it connected.
    let database = unsafe { pg_sys::MyDatabaseId }.to_u32();
    register(Task::Backfill { database, backfill_id, worker, starter_xid }, entry)
}

/// The function a worker process runs, named as the library exports it: the worker layer starts
/// the Citus coordinator's follower and the follows' dispatcher by their names, without
/// importing them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// `backfill_worker_main` (worker/process.rs): scans the backfill's tables; also the
    /// per-database resumer.
    Scan,
    /// `backfill_follower_main` (citus/follower.rs): on a Citus coordinator, follows the worker
    /// nodes' backfills of a distributed table, which scan its shards.
    Follow,
    /// `backfill_dispatcher_main` (follow/dispatch.rs): starts what the follows have queued.
    Dispatch,
}

impl Entry {
    /// The entry of backfill `id`'s workers, in a transaction: a backfill with shard rows (of a
    /// distributed table, started on the coordinator) is followed, any other scanned.
    pub fn of(backfill_id: i64) -> Entry {
        if job_shard::shards_of(backfill_id).is_empty() {
            Entry::Scan
        } else {
            Entry::Follow
        }
    }

    fn function(self) -> &'static str {
        match self {
            Entry::Scan => "backfill_worker_main",
            Entry::Follow => "backfill_follower_main",
            Entry::Dispatch => "backfill_dispatcher_main",
        }
    }
}

/// What a backfill worker process (of either [`Entry`]) is started for: its typed start argument, passed
/// as JSON in the worker's `bgw_extra` (at most 127 bytes; the longest task takes about 100).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Task {
    /// Scan worker `worker` of a backfill's ranges, once transaction `starter_xid` (the one
    /// that recorded or resumed it; 0 after a restart) has committed.
    Backfill {
        #[serde(rename = "db")]
        database: u32,
        #[serde(rename = "id")]
        backfill_id: i64,
        worker: i32,
        #[serde(rename = "xid")]
        starter_xid: u64,
    },
    /// After a server restart: relaunch the workers of a database's running backfills.
    Resume {
        #[serde(rename = "db")]
        database: u32,
    },
    /// Start what the follows of a database have queued for the slots that are free.
    Dispatch {
        #[serde(rename = "db")]
        database: u32,
    },
}

impl Task {
    pub fn database(&self) -> u32 {
        match *self {
            Task::Backfill { database, .. } | Task::Resume { database } | Task::Dispatch { database } => database,
        }
    }

    /// The task a worker was started with, or one registered by older code and restarted by
    /// the postmaster after its library was replaced (catalog/schema.rs reads its arguments).
    pub fn of_this_worker(main_arg: pg_sys::Datum) -> Option<Task> {
        let extra = BackgroundWorker::get_extra();
        serde_json::from_str(extra).ok().or_else(|| {
            let old = schema::older_worker_arguments(extra, main_arg.value() as i64)?;
            Some(match old.backfill_id {
                None => Task::Resume { database: old.database },
                Some(backfill_id) => Task::Backfill {
                    database: old.database,
                    backfill_id,
                    worker: old.worker,
                    starter_xid: old.starter_xid,
                },
            })
        })
    }
}

/// Registers a process running `entry` for a task.
fn register(task: Task, entry: Entry) -> bool {
    let name = match task {
        Task::Backfill { backfill_id, worker, .. } => worker_name(backfill_id, worker),
        Task::Resume { .. } => RESUMER_NAME.into(),
        Task::Dispatch { .. } => DISPATCHER_NAME.into(),
    };
    let extra = serde_json::to_string(&task).expect("a task serializes");
    debug_assert!(extra.len() < pg_sys::BGW_EXTRALEN as usize, "{extra}");
    BackgroundWorkerBuilder::new(&name)
        .set_type("pg_backfill")
        .set_library("pg_backfill")
        .set_function(entry.function())
        .set_extra(&extra)
        .enable_spi_access()
        // A worker that is terminated or crashes exits with code 1 and is started again after
        // this pause; one that finishes, fails or is cancelled exits with 0 and is not.
        .set_restart_time(Some(Duration::from_secs(1)))
        .load_dynamic()
        .is_ok()
}

/// Launches a worker of backfill `id`, which first waits for this transaction to commit.
pub fn launch_in_this_transaction(id: i64, worker: i32) {
    // SAFETY: assigns (or returns) this transaction's id; the caller is in a transaction on a primary.
    let starter_xid = unsafe { pg_sys::GetTopFullTransactionId() }.value;
    let entry = privilege::as_extension_owner(|| Entry::of(id));
    if !launch(entry, id, worker, starter_xid) {
        raise(
            ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            "could not start the backfill's background worker",
            "Every background worker slot is in use (max_worker_processes).",
            Some("Wait for a backfill to finish, or raise max_worker_processes and restart the server.".into()),
        );
    }
}

/// Sets this worker's application_name before it connects, so that pg_stat_activity shows it
/// from its first moment there: with the priority of a client's, above any the database or
/// role sets, below the session's (configure_session() replaces it).
pub fn show_as(name: &str) {
    let name = CString::new(name).expect("no NUL in a worker's name");
    // SAFETY: sets a GUC of this process, before it connects.
    unsafe {
        pg_sys::SetConfigOption(
            c"application_name".as_ptr(),
            name.as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_CLIENT,
        );
    }
}

/// Backfill workers, in every database, other than this process: those admitted
/// (`pg_backfill 7`, as each names itself when admitted), and with `starting` also those
/// launched and not yet admitted (`pg_backfill starting 7`). The resumer is neither.
fn backfill_workers(starting: bool) -> i32 {
    let pattern = if starting { activity::ANY_WORKER_NAME } else { activity::ADMITTED_WORKER_NAME };
    activity::read_activity_afresh();
    crate::pg::spi::select_one::<i32>(
        "SELECT pg_catalog.count(*)::int FROM pg_catalog.pg_stat_activity
          WHERE backend_type OPERATOR(pg_catalog.=) 'pg_backfill'
            AND application_name OPERATOR(pg_catalog.~) $1
            AND pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()",
        &[pattern.into()],
    )
    .or_internal("count the backfill workers")
    .unwrap_or(0)
}

/// The workers a backfill may take, as backfill.max_workers limits them: for every role, or for
/// one that is not a superuser, less backfill.superuser_reserved_workers.
#[derive(Clone, Copy)]
enum WorkerCap {
    All,
    ForNonSuperusers,
}

impl WorkerCap {
    fn workers(self) -> i32 {
        match self {
            WorkerCap::All => settings::max_workers(),
            WorkerCap::ForNonSuperusers => settings::max_workers() - settings::superuser_reserved_workers(),
        }
    }

    /// The settings that make the cap, as a DBA reads them in the error.
    fn described(self) -> String {
        match self {
            WorkerCap::All => format!("backfill.max_workers ({})", settings::max_workers()),
            WorkerCap::ForNonSuperusers => format!(
                "backfill.max_workers ({}) less backfill.superuser_reserved_workers ({}), kept for superusers",
                settings::max_workers(),
                settings::superuser_reserved_workers()
            ),
        }
    }
}

/// 53400: `needed` more workers do not fit `cap` with `running` already taken. A request larger
/// than the cap itself can never fit, however long one waits: the hint says what fits instead.
fn too_many_workers(cap: WorkerCap, running: i32, needed: i32) -> ! {
    let (workers, described) = (cap.workers(), cap.described());
    let message = match cap {
        WorkerCap::All => "too many backfill workers",
        WorkerCap::ForNonSuperusers => "too many backfill workers for a role that is not a superuser",
    };
    if needed > workers {
        raise(
            ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            message,
            format!("This backfill needs {needed} workers, which can never fit {described}: {workers} at most."),
            Some(match workers {
                1.. => format!(
                    "Start it with parallel => {workers} or fewer, or raise backfill.max_workers in postgresql.conf \
                     and reload (it keeps background workers free for parallel query and logical replication)."
                ),
                _ => "Raise backfill.max_workers, or lower backfill.superuser_reserved_workers, in postgresql.conf and reload."
                    .into(),
            }),
        );
    }
    raise(
        ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
        message,
        format!(
            "{running} backfill worker(s) run or are starting now and this backfill needs {needed} more; {described}: \
             {workers} at most."
        ),
        Some(
            "Wait for a running backfill to end (SELECT id, workers_running FROM backfill_status WHERE state = 'running';), \
             use fewer parallel workers, or raise backfill.max_workers in postgresql.conf and reload."
                .into(),
        ),
    )
}

/// backfill_start() and backfill_resume(): refuses a backfill whose workers would take more
/// than backfill.max_workers background workers in all, counting those still starting. (Two
/// calls at the same moment may both pass, as may one made while another's worker is launched
/// and not yet visible; each worker checks again when it starts, see [`admit_within_cap`].)
///
/// A role that is not a superuser leaves backfill.superuser_reserved_workers of them free.
pub fn require_worker_slots(needed: i32) {
    let running = privilege::as_extension_owner(|| backfill_workers(true));
    // SAFETY: reads whether the current role is a superuser.
    let superuser = unsafe { pg_sys::superuser() };
    let caps: &[WorkerCap] = if superuser { &[WorkerCap::All] } else { &[WorkerCap::All, WorkerCap::ForNonSuperusers] };
    // (A request larger than a cap is refused as such first, whoever runs.)
    for cap in caps.iter().copied() {
        if needed > cap.workers() {
            too_many_workers(cap, running, needed);
        }
    }
    for cap in caps.iter().copied() {
        if running + needed > cap.workers() {
            too_many_workers(cap, running, needed);
        }
    }
}

/// A starting worker is admitted only while fewer than backfill.max_workers are: checked under
/// a cluster-wide lock, held until the worker's application_name (which counts it) commits.
pub fn admit_within_cap() {
    crate::pg::locks::lock_worker_admissions();
    // (Not those still starting: two starting at once would each count the other and both stop.)
    let running = backfill_workers(false);
    if running >= settings::max_workers() {
        too_many_workers(WorkerCap::All, running, 1);
    }
}

/// Wakes the workers of a backfill of this database from their sleep (pacing, back-off,
/// waiting for a consumer) when this transaction commits, so that a cancel, pause or new
/// pacing takes effect at once.
pub fn wake_workers_at_commit(backfill_id: i64) {
    activity::read_activity_afresh();
    let pids = privilege::as_extension_owner(|| {
        Spi::connect(|client| {
            client
                .select(
                    &format!("SELECT a.pid FROM pg_catalog.pg_stat_activity a WHERE {WORKERS_OF_BACKFILL}"),
                    None,
                    &[backfill_id.into()],
                )?
                .map(|row| row.get::<i32>(1))
                .collect::<Result<Vec<_>, _>>()
        })
    })
    .unwrap_or_default();
    let pids: Vec<i32> = pids.into_iter().flatten().collect();
    pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Commit, move || {
        for pid in pids {
            // SAFETY: BackendPidGetProc returns a live process's PGPROC or null; setting
            // another process's latch is how PostgreSQL itself wakes a backend.
            unsafe {
                let process = pg_sys::BackendPidGetProc(pid);
                if !process.is_null() {
                    pg_sys::SetLatch(&mut (*process).procLatch);
                }
            }
        }
    });
}

/// A worker connects as the bootstrap superuser, with its database's settings: a database
/// owner may have set a search_path (ALTER DATABASE ... SET) that puts its own functions,
/// operators and types first. Before any statement, the path is fixed to the catalog, with a
/// priority no setting of the database, role or session can override.
pub fn override_search_path() {
    // SAFETY: sets a GUC of this process, before any query runs.
    unsafe {
        pg_sys::SetConfigOption(
            c"search_path".as_ptr(),
            c"pg_catalog, pg_temp".as_ptr(),
            pg_sys::GucContext::PGC_SUSET,
            pg_sys::GucSource::PGC_S_OVERRIDE,
        );
    }
}

/// Starts a dispatcher worker (follow/dispatch.rs) now, which starts what the follows have
/// queued for the slots that are free, in a transaction of its own, when a follow is live: from
/// a worker of pg_backfill's whose backfill ended (which frees its slot), the resumer after a
/// restart, or a dispatcher registered under the scan worker's entry by an earlier library.
/// Never from a client's transaction: see [`dispatch_at_commit`].
pub fn dispatch_now() {
    let following = in_transaction(|| {
        schema::installed()
            && schema::capabilities().follows
            && privilege::as_extension_owner(crate::catalog::follow::any_live_follow)
    });
    if !following.unwrap_or(false) {
        return;
    }
    // SAFETY: this process's database, set when it connected.
    let database = unsafe { pg_sys::MyDatabaseId }.to_u32();
    if !register(Task::Dispatch { database }, Entry::Dispatch) {
        warning!("pg_backfill: no free background worker slot to start the follows' queued backfills");
    }
}

/// Whether this transaction has asked for a dispatcher at its commit already.
static DISPATCH_ASKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// When this transaction commits, and only then, a dispatcher worker starts what the follows
/// have queued (follow/dispatch.rs, in a transaction of its own). A client's statement (a
/// DDL that queued a table, a cancel that freed a slot) asks for it instead of starting
/// backfills itself: nothing it registers can outlive a rollback, or wait on a transaction its
/// client leaves open, and no role's DDL runs a start, takes pg_backfill's locks or switches
/// roles inside its own transaction. Once per transaction however often it is asked (a
/// rolled-back subtransaction's request stands, and costs one dispatcher that finds nothing).
pub fn dispatch_at_commit() {
    use std::sync::atomic::Ordering::Relaxed;
    if DISPATCH_ASKED.swap(true, Relaxed) {
        return;
    }
    // SAFETY: this backend's database, set when it connected.
    let database = unsafe { pg_sys::MyDatabaseId }.to_u32();
    pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Commit, move || {
        DISPATCH_ASKED.store(false, Relaxed);
        // (After the commit nothing may raise: a dispatcher that cannot be registered leaves the
        // queue for the next backfill's end, the next DDL or the next restart.)
        if !register(Task::Dispatch { database }, Entry::Dispatch) {
            warning!("pg_backfill: no free background worker slot to start the follows' queued backfills");
        }
    });
    pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Abort, || DISPATCH_ASKED.store(false, Relaxed));
    // (A prepared transaction's queued tables wait for the next dispatch: a backfill's end, the
    // next statement that queues one, a restart. The next transaction of this session asks anew.)
    pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Prepare, || DISPATCH_ASKED.store(false, Relaxed));
}

/// After a server restart (the launcher starts one such worker per database): relaunches the
/// workers of the database's running backfills, then has a dispatcher start what the follows
/// have queued for the slots that are free ([`dispatch_now`]), and exits.
pub fn resume_database() {
    let jobs = in_transaction(|| {
        if schema::installed() {
            job::jobs_to_resume().into_iter().map(|(id, parallel)| (id, parallel, Entry::of(id))).collect()
        } else {
            Vec::new()
        }
    });
    for (backfill_id, parallel, entry) in jobs.unwrap_or_default() {
        if (0..parallel).all(|worker| launch(entry, backfill_id, worker, 0)) {
            log!("{}: resumed after the server restart", who(backfill_id));
        } else {
            warning!("{}: could not resume it: no free background worker slot", who(backfill_id));
        }
    }
    dispatch_now();
}

/// A worker process started under the wrong entry (see worker/process.rs, `start`): launches
/// the backfill's worker under `entry` instead (the caller then exits, before it takes the
/// worker's lock).
pub fn hand_over(entry: Entry, backfill_id: i64, worker: i32) {
    log!("{}: its worker hands over to {}", who(backfill_id), entry.function());
    if !launch(entry, backfill_id, worker, 0) {
        warning!("{}: could not hand over: no free background worker slot", who(backfill_id));
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
    override_search_path();
    let databases = in_transaction(|| {
        Spi::connect(|client| {
            client
                .select("SELECT oid FROM pg_catalog.pg_database WHERE datallowconn AND NOT datistemplate", None, &[])?
                .map(|row| row.get::<pg_sys::Oid>(1).map(|oid| oid.unwrap_or(pg_sys::InvalidOid)))
                .collect::<Result<Vec<_>, _>>()
        })
        .or_internal("list the databases")
    });
    for database in databases.unwrap_or_default() {
        if !register(Task::Resume { database: database.to_u32() }, Entry::Scan) {
            warning!("pg_backfill launcher: no free background worker slot to resume backfills");
        }
    }
}

/// Registers the launcher; called from _PG_init while shared_preload_libraries loads.
pub fn register_launcher() {
    // SAFETY: a flag the postmaster sets at start.
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
