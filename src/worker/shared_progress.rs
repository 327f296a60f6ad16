//! Each running backfill worker's progress in shared memory, as PostgreSQL keeps the entries
//! behind its progress views (pg_stat_progress_*): one slot per worker process, written by that
//! process alone as it goes, read by `backfill_progress` from any database of the cluster, and
//! freed when the process exits, however it exits.
//!
//! Only with the library in shared_preload_libraries: shared memory is sized before the
//! server starts. Without it the board does not exist, and [`snapshot`] says so (None).
//!
//! No lock: a slot is claimed by a compare-and-swap of its pid, and its owner writes it under
//! a change counter (odd while it writes), which a reader checks before and after it copies
//! the slot, as pgstat's `st_changecount` protocol does. A reader never waits for a worker,
//! and a worker never waits for a reader.

use pgrx::pg_sys;
use std::sync::atomic::{fence, AtomicI32, AtomicI64, AtomicPtr, AtomicU32, AtomicUsize, Ordering};

/// What a worker is doing, as `backfill_progress.phase` shows it (docs/reference.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Phase {
    /// Admitted; reading its backfill and opening its next table's scan (the start marker).
    Starting = 0,
    /// Delivering pages.
    Scanning = 1,
    /// Held back by the slot's consumer: none is connected, or it lags past max_lag.
    WaitingForConsumer = 2,
    /// Held back by the source: a standby replaying behind, or a slot retaining WAL.
    WaitingForSource = 3,
    /// Slowed down by the server's load (max_active_sessions).
    WaitingForLoad = 4,
    /// Its ranges are done: marking the backfill done (the last worker) and exiting.
    Finishing = 5,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Scanning => "scanning",
            Phase::WaitingForConsumer => "waiting for consumer",
            Phase::WaitingForSource => "waiting for source",
            Phase::WaitingForLoad => "waiting for load",
            Phase::Finishing => "finishing",
        }
    }

    fn of(value: u32) -> Phase {
        [Phase::Scanning, Phase::WaitingForConsumer, Phase::WaitingForSource, Phase::WaitingForLoad, Phase::Finishing]
            .into_iter()
            .find(|phase| *phase as u32 == value)
            .unwrap_or(Phase::Starting)
    }

    /// The phase of a worker held back for a reason of this kind (throttle/wait.rs's kinds).
    pub fn waiting_for(kind: &str) -> Phase {
        match kind {
            "consumer_away" | "consumer_lag" => Phase::WaitingForConsumer,
            "load" => Phase::WaitingForLoad,
            _ => Phase::WaitingForSource,
        }
    }
}

/// One worker's slot. Every field is an atomic, so that a reader's copy of a slot being
/// written is torn at worst, never undefined; the change counter tells the reader to copy again.
#[repr(C)]
struct Slot {
    /// The owning process; 0 for a free slot.
    pid: AtomicI32,
    /// Even while the slot is stable, odd while its owner writes it.
    changes: AtomicU32,
    database: AtomicU32,
    /// The role that started the backfill (views decide visibility by it).
    role: AtomicU32,
    backfill_id: AtomicI64,
    worker: AtomicI32,
    relid: AtomicU32,
    position: AtomicI32,
    phase: AtomicU32,
    rows_total: AtomicI64,
    rows_done: AtomicI64,
    bytes_done: AtomicI64,
    pages_done: AtomicI64,
    started_at: AtomicI64,
    phase_since: AtomicI64,
}

/// A copy of one running worker's slot.
#[derive(Debug, Clone)]
pub struct WorkerProgress {
    pub pid: i32,
    pub database: pg_sys::Oid,
    pub role: pg_sys::Oid,
    pub backfill_id: i64,
    pub worker: i32,
    /// The table it scans now (InvalidOid before its first table).
    pub relid: pg_sys::Oid,
    /// Its range's position in the backfill (backfill_tables.position).
    pub position: i32,
    pub phase: Phase,
    pub rows_total: i64,
    pub rows_done: i64,
    pub bytes_done: i64,
    pub pages_done: i64,
    pub started_at: pg_sys::TimestampTz,
    pub phase_since: pg_sys::TimestampTz,
}

/// The board in shared memory (null unless preloaded), its slot count, and this process's
/// slot (its index plus one; 0 for none).
static BOARD: AtomicPtr<Slot> = AtomicPtr::new(std::ptr::null_mut());
static SLOTS: AtomicUsize = AtomicUsize::new(0);
static MY_SLOT: AtomicUsize = AtomicUsize::new(0);

static mut PREVIOUS_REQUEST_HOOK: pg_sys::shmem_request_hook_type = None;
static mut PREVIOUS_STARTUP_HOOK: pg_sys::shmem_startup_hook_type = None;

const BOARD_NAME: &std::ffi::CStr = c"pg_backfill progress";

/// Asks for the board's shared memory; called from _PG_init while shared_preload_libraries loads.
pub fn install() {
    // SAFETY: hooks are chained in the postmaster, while it loads the preloaded libraries,
    // before any process that could call them exists.
    unsafe {
        PREVIOUS_REQUEST_HOOK = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(request_board);
        PREVIOUS_STARTUP_HOOK = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(start_board);
    }
}

/// One slot per background worker the server may run (max_worker_processes, fixed at server
/// start): every backfill worker is one, so backfill.max_workers, which a reload can raise,
/// never outgrows the board.
fn slot_count() -> usize {
    // SAFETY: a setting of the postmaster's, final once shared memory is requested.
    unsafe { pg_sys::max_worker_processes }.max(1) as usize
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn request_board() {
    // SAFETY: the hook chain PostgreSQL calls in the postmaster; sizes requested before shared
    // memory is created.
    unsafe {
        if let Some(previous) = PREVIOUS_REQUEST_HOOK {
            previous();
        }
        pg_sys::RequestAddinShmemSpace(slot_count() * std::mem::size_of::<Slot>());
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn start_board() {
    // SAFETY: the hook chain PostgreSQL calls when it creates shared memory (at start and after
    // every crash restart, which so frees the slots of workers killed without exiting). The
    // lock is PostgreSQL's AddinShmemInitLock (MainLWLockArray[21] on 15 to 18).
    unsafe {
        if let Some(previous) = PREVIOUS_STARTUP_HOOK {
            previous();
        }
        let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock;
        pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let count = slot_count();
        let mut found = false;
        let board = pg_sys::ShmemInitStruct(BOARD_NAME.as_ptr(), count * std::mem::size_of::<Slot>(), &mut found)
            .cast::<Slot>();
        if !found {
            // All zeros is a free slot in every field (atomics are plain integers in memory).
            std::ptr::write_bytes(board, 0, count);
        }
        pg_sys::LWLockRelease(init_lock);
        SLOTS.store(count, Ordering::Relaxed);
        BOARD.store(board, Ordering::Release);
    }
}

fn slots() -> &'static [Slot] {
    let board = BOARD.load(Ordering::Acquire);
    if board.is_null() {
        return &[];
    }
    // SAFETY: the board holds SLOTS slots for the server's lifetime, and every field is atomic.
    unsafe { std::slice::from_raw_parts(board, SLOTS.load(Ordering::Relaxed)) }
}

fn my_slot() -> Option<&'static Slot> {
    MY_SLOT.load(Ordering::Relaxed).checked_sub(1).and_then(|index| slots().get(index))
}

fn now() -> pg_sys::TimestampTz {
    // SAFETY: reads the clock.
    unsafe { pg_sys::GetCurrentTimestamp() }
}

/// Writes this process's slot, if it has one, under the change counter.
fn write(update: impl FnOnce(&Slot)) {
    let Some(slot) = my_slot() else { return };
    let changes = slot.changes.load(Ordering::Relaxed);
    slot.changes.store(changes.wrapping_add(1), Ordering::Relaxed);
    fence(Ordering::Release);
    update(slot);
    slot.changes.store(changes.wrapping_add(2), Ordering::Release);
}

/// Takes a slot for this worker process of backfill `backfill_id` of `database`, started by
/// `role`; freed when the process exits (by any path: done, error, FATAL, SIGTERM). A process
/// killed without exiting (SIGKILL) makes the postmaster restart the server, which clears the
/// board. Without a board (not preloaded) or a free slot, the worker runs unseen here.
pub fn claim(database: pg_sys::Oid, role: pg_sys::Oid, backfill_id: i64, worker: i32) {
    // SAFETY: this process's pid.
    let pid = unsafe { pg_sys::MyProcPid };
    if my_slot().is_none() {
        let Some(index) = slots()
            .iter()
            .position(|slot| slot.pid.compare_exchange(0, pid, Ordering::AcqRel, Ordering::Relaxed).is_ok())
        else {
            return;
        };
        MY_SLOT.store(index + 1, Ordering::Relaxed);
        // SAFETY: registers a callback that proc_exit runs, with no argument.
        unsafe { pg_sys::on_shmem_exit(Some(release), pg_sys::Datum::from(0)) };
    }
    let at = now();
    write(|slot| {
        slot.database.store(database.to_u32(), Ordering::Relaxed);
        slot.role.store(role.to_u32(), Ordering::Relaxed);
        slot.backfill_id.store(backfill_id, Ordering::Relaxed);
        slot.worker.store(worker, Ordering::Relaxed);
        slot.relid.store(0, Ordering::Relaxed);
        slot.position.store(0, Ordering::Relaxed);
        for counter in [&slot.rows_total, &slot.rows_done, &slot.bytes_done, &slot.pages_done] {
            counter.store(0, Ordering::Relaxed);
        }
        slot.phase.store(Phase::Starting as u32, Ordering::Relaxed);
        slot.started_at.store(at, Ordering::Relaxed);
        slot.phase_since.store(at, Ordering::Relaxed);
    });
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn release(_code: i32, _arg: pg_sys::Datum) {
    // A slot readers skip first (no backfill), then a free one.
    write(|slot| slot.backfill_id.store(0, Ordering::Relaxed));
    if let Some(slot) = my_slot() {
        MY_SLOT.store(0, Ordering::Relaxed);
        slot.pid.store(0, Ordering::Release);
    }
}

/// The worker enters `phase` (its time is kept only when the phase changes).
pub fn set_phase(phase: Phase) {
    if my_slot().is_some_and(|slot| slot.phase.load(Ordering::Relaxed) == phase as u32) {
        return;
    }
    let at = now();
    write(|slot| {
        slot.phase.store(phase as u32, Ordering::Relaxed);
        slot.phase_since.store(at, Ordering::Relaxed);
    });
}

/// The worker starts (or resumes) the scan of table `relid`'s range at `position`, with
/// `rows_done` of about `rows_estimated` rows delivered already.
pub fn set_range(relid: pg_sys::Oid, position: i32, rows_done: i64, rows_estimated: i64) {
    write(|slot| {
        slot.relid.store(relid.to_u32(), Ordering::Relaxed);
        slot.position.store(position, Ordering::Relaxed);
        slot.rows_done.store(rows_done, Ordering::Relaxed);
        slot.rows_total.store(rows_estimated.max(rows_done), Ordering::Relaxed);
        slot.bytes_done.store(0, Ordering::Relaxed);
        slot.pages_done.store(0, Ordering::Relaxed);
    });
}

/// A page of the range delivers `bytes` of messages, which brings the range's rows to
/// `rows_done`. (Written before the page commits, as its cursor is: a page that rolls back
/// after that is retried, and sets the rows again from the cursor's count, but counts its
/// bytes and itself twice, an overcount of a page.)
pub fn delivered(rows_done: i64, bytes: i64) {
    write(|slot| {
        let done = rows_done;
        slot.rows_done.store(done, Ordering::Relaxed);
        // The estimate, raised to the rows delivered once they pass it.
        slot.rows_total.fetch_max(done, Ordering::Relaxed);
        slot.bytes_done.fetch_add(bytes, Ordering::Relaxed);
        slot.pages_done.fetch_add(1, Ordering::Relaxed);
    });
}

/// Every running worker's progress now; None when the board does not exist (the library is
/// not in shared_preload_libraries).
pub fn snapshot() -> Option<Vec<WorkerProgress>> {
    if BOARD.load(Ordering::Acquire).is_null() {
        return None;
    }
    Some(slots().iter().filter_map(read).collect())
}

/// A consistent copy of a slot in use; None for a free one.
fn read(slot: &Slot) -> Option<WorkerProgress> {
    loop {
        let before = slot.changes.load(Ordering::Acquire);
        if before % 2 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let copy = WorkerProgress {
            pid: slot.pid.load(Ordering::Relaxed),
            database: pg_sys::Oid::from(slot.database.load(Ordering::Relaxed)),
            role: pg_sys::Oid::from(slot.role.load(Ordering::Relaxed)),
            backfill_id: slot.backfill_id.load(Ordering::Relaxed),
            worker: slot.worker.load(Ordering::Relaxed),
            relid: pg_sys::Oid::from(slot.relid.load(Ordering::Relaxed)),
            position: slot.position.load(Ordering::Relaxed),
            phase: Phase::of(slot.phase.load(Ordering::Relaxed)),
            rows_total: slot.rows_total.load(Ordering::Relaxed),
            rows_done: slot.rows_done.load(Ordering::Relaxed),
            bytes_done: slot.bytes_done.load(Ordering::Relaxed),
            pages_done: slot.pages_done.load(Ordering::Relaxed),
            started_at: slot.started_at.load(Ordering::Relaxed),
            phase_since: slot.phase_since.load(Ordering::Relaxed),
        };
        fence(Ordering::Acquire);
        if slot.changes.load(Ordering::Relaxed) == before {
            // (A slot just claimed, or being freed, has no backfill yet, or no longer.)
            return (copy.pid != 0 && copy.backfill_id != 0).then_some(copy);
        }
    }
}
