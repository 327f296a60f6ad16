//! How a page locks what it reads, so that a consumer applying reads as upserts never sees a
//! read overwrite a newer change: the lock policy, in one place.
//!
//! A read is a message in the page's transaction; a writer's change is decoded at its own
//! commit. A read may only carry a value that no change committed after it can still be
//! missing, and no change may commit, between the read's snapshot and the read's commit, to a
//! row it read. Two ways keep that:
//!
//! - **Row locks** (`FOR SHARE` of the page's rows): a writer of one of those rows waits for the
//!   page to commit, so its change is decoded after the read. Every locked row is written to:
//!   its xmax, a heap lock record in WAL, a full-page image of each page after a checkpoint,
//!   and the page loses its all-frozen bit, so the next aggressive vacuum rereads it.
//!
//! - **The table in SHARE mode**, taken *before* the page's queries take their snapshots. SHARE
//!   conflicts with ROW EXCLUSIVE, which every INSERT, UPDATE, DELETE and MERGE holds on the
//!   table until its transaction ends. So when the lock is granted no transaction that wrote
//!   the table is still in progress: each has committed (the page's snapshots, taken after the
//!   lock, see its changes, decoded before the page's commit) or aborted. While the page holds
//!   the lock no writer can write the table at all: its change commits after the page. Nothing
//!   is written to the rows. The argument's conditions, checked against PostgreSQL 15:
//!   - Snapshots: the page's statements run through SPI, not read-only, each with a snapshot
//!     taken when it starts (READ COMMITTED), after the lock. (The page bound's query may see
//!     an older snapshot: it only picks where the page ends, and the page reads every row up
//!     to there with the new one.)
//!   - Fast-path locks: writers take ROW EXCLUSIVE through their backend's fast path, which
//!     the lock manager does not see; a request for SHARE, a "strong" lock, first moves every
//!     backend's fast-path locks on the table into the shared table (FastPathTransferRelation-
//!     Locks) and makes later weak requests go there, so the conflict is seen.
//!   - Isolation: the worker runs READ COMMITTED whatever the defaults (worker/process.rs), and a page
//!     takes the table path only in READ COMMITTED: under REPEATABLE READ every statement would
//!     reuse a snapshot taken before the lock.
//!   - Lock queues: a page never enters the table's lock queue (ConditionalLockRelationOid;
//!     `table` retries it every few milliseconds up to backfill.lock_timeout). A queued page
//!     would make every writer that arrives wait behind it, and, holding ACCESS SHARE from its
//!     recheck, could close a deadlock cycle with a writer that goes on to TRUNCATE or ALTER
//!     the table. The attempt also fails while a writer, or a DDL statement, waits in the
//!     queue: they go first.
//!   - VACUUM and autovacuum take SHARE UPDATE EXCLUSIVE, which conflicts with SHARE: an
//!     ordinary autovacuum, which only tries its lock, skips a table whose pages hold it (a
//!     quiet table accumulates no dead rows meanwhile); an anti-wraparound one waits for a
//!     page. A page finds the table busy while any VACUUM runs, and locks rows. Plain readers
//!     (ACCESS SHARE) and other backfills (SHARE) never wait.
//!   - Partitions: a writer that names a partition locks the partition only, not its parent.
//!     Locking every partition is not done yet: a partitioned table's pages take row locks.
//!
//!   The cost moves to writers: one that arrives while a page holds the table waits for the
//!   rest of that page. `backfill.table_lock_max_ms` bounds it: table-locked pages are sized
//!   so that each takes about that long at most (halved when one takes longer). In `auto`, a
//!   page that finds a writer takes row locks, and so do the pages of the next second: a
//!   table being written keeps row locks, and its writers never queue behind a page.
//!   And in `auto`, a scan whose table-locked pages of a row or two still take half the bound
//!   (their fixed cost, such as a long filter's check, is near it) locks rows from then on.

use crate::model::state::LockMode;
use crate::pg::settings::{self, LockModeSetting};
use crate::stream::scan::RowLocks;
use pgrx::pg_sys;
use std::time::{Duration, Instant};

/// backfill.lock_mode as a backfill records it when it starts.
pub fn lock_mode() -> LockMode {
    match settings::lock_mode() {
        LockModeSetting::Auto => LockMode::Auto,
        LockModeSetting::Rows => LockMode::Rows,
        LockModeSetting::Table => LockMode::Table,
    }
}

/// How one page's rows are locked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Locking {
    /// Lock every row or fail at once: a page holding some row locks never waits for another.
    NoWait,
    /// Wait (up to `lock_timeout`) for the one row of a one-row page, which holds nothing else.
    Wait,
    /// No row locks: the page holds the table in SHARE mode.
    Table,
    /// No lock at all: only for the test that shows the locks are needed.
    None,
}

impl Locking {
    /// Whether a page so locked may rest once it holds its lock (the gentle default's rests
    /// within a page): not while it holds the table, which makes every writer wait until it
    /// commits.
    pub fn lets_the_page_rest(self) -> bool {
        self != Locking::Table
    }

    /// The row locks of a page's rows query.
    pub fn row_locks(self) -> RowLocks {
        match self {
            Locking::NoWait => RowLocks::NoWait,
            Locking::Wait => RowLocks::Wait,
            Locking::Table | Locking::None => RowLocks::None,
        }
    }
}

/// After a failed attempt at the table, `auto` takes row locks for this long.
const ROWS_AFTER_A_WRITER: Duration = Duration::from_secs(1);

/// One scan's lock policy, with what it learned from its last pages.
pub struct LockPolicy {
    pub mode: LockMode,
    /// Set when `auto` found a writer: row locks until then.
    rows_until: Option<Instant>,
    /// The most rows a table-locked page may have, to stay within backfill.table_lock_max_ms.
    table_page_rows: i32,
    /// Set in `auto` once a table-locked page of a row or two took more than half of
    /// backfill.table_lock_max_ms: row locks for the rest of the scan (see `table_page_took`).
    fixed_cost_near_bound: bool,
}

impl LockPolicy {
    pub fn new(mode: LockMode, partitioned: bool, batch_size: i32) -> Self {
        let mode = if partitioned && mode == LockMode::Auto { LockMode::Rows } else { mode };
        // The first table-locked page is small; the next ones grow toward the time bound.
        LockPolicy { mode, rows_until: None, table_page_rows: batch_size.clamp(1, 100), fixed_cost_near_bound: false }
    }

    /// Locks what the next page needs, before its queries take their snapshots, and returns how
    /// its rows are to be locked and how many rows it may have. In a transaction.
    pub fn lock_page(&mut self, relid: pg_sys::Oid, rows: i32) -> (Locking, i32) {
        if settings::skip_row_locks() {
            return (Locking::None, rows);
        }
        // SAFETY: reads this transaction's isolation level.
        let read_committed = unsafe { pg_sys::XactIsoLevel } == pg_sys::XACT_READ_COMMITTED as i32;
        match self.mode {
            LockMode::Table if read_committed => {
                let deadline = Instant::now() + settings::lock_timeout();
                while !try_share_lock(relid) {
                    if Instant::now() >= deadline {
                        crate::pg::errors::raise(
                            pgrx::PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
                            "could not lock the table in SHARE mode for a page",
                            "Writers held or awaited it for all of backfill.lock_timeout (lock_mode table).",
                            Some("The page is retried with back-off; lock_mode auto would lock rows instead.".into()),
                        );
                    }
                    crate::throttle::pacing::sleep(Duration::from_millis(5));
                }
                (Locking::Table, rows.min(self.table_page_rows))
            }
            LockMode::Auto
                if read_committed
                    && !self.fixed_cost_near_bound
                    && self.rows_until.is_none_or(|until| Instant::now() >= until) =>
            {
                if try_share_lock(relid) {
                    self.rows_until = None;
                    (Locking::Table, rows.min(self.table_page_rows))
                } else {
                    self.rows_until = Some(Instant::now() + ROWS_AFTER_A_WRITER);
                    (row_locking(rows), rows)
                }
            }
            LockMode::Auto | LockMode::Rows | LockMode::Table => (row_locking(rows), rows),
        }
    }

    /// A table-locked page of `rows` rows held the table this long (from its lock to its
    /// cursor's update, just before the commit): the next ones are sized to hold it at most
    /// backfill.table_lock_max_ms, in proportion, growing at most twofold a page.
    ///
    /// A page's time is not all in proportion to its rows: each page also pays a fixed cost (its
    /// queries' planning, a long filter's check on every page). When that cost alone comes near
    /// the bound, smaller pages cannot meet it: they shrink to a row or two and the scan crawls
    /// (a 10,000-value filter: a row a page, under load). So in `auto`, once a table-locked page
    /// of a row or two takes more than half the bound, the scan's pages lock rows instead, and
    /// take their whole batch size: row locks hold up no writer of another row.
    pub fn table_page_took(&mut self, rows: i32, held: Duration, batch_size: i32) {
        let max = settings::table_lock_max().as_secs_f64();
        if self.mode == LockMode::Auto && rows <= 2 && held.as_secs_f64() > max / 2.0 {
            self.fixed_cost_near_bound = true;
        }
        let fitting = f64::from(rows.max(1)) * max / held.as_secs_f64().max(1e-6);
        let next = fitting.min(f64::from(self.table_page_rows) * 2.0);
        self.table_page_rows = (next as i32).clamp(1, batch_size.max(1));
    }
}

/// The table in SHARE mode until the page's transaction ends, if it is free now: never waits,
/// never queues; false while a writer holds or awaits the table.
fn try_share_lock(relid: pg_sys::Oid) -> bool {
    // SAFETY: a conditional relation lock, released with the transaction.
    unsafe { pg_sys::ConditionalLockRelationOid(relid, pg_sys::ShareLock as pg_sys::LOCKMODE) }
}

/// Row locks: a page of several rows never waits for one (it shrinks instead, see worker/process.rs);
/// a one-row page waits up to backfill.lock_timeout.
fn row_locking(rows: i32) -> Locking {
    if rows == 1 {
        set_lock_timeout();
        Locking::Wait
    } else {
        Locking::NoWait
    }
}

fn set_lock_timeout() {
    use crate::pg::errors::OrInternal;
    let timeout = settings::lock_timeout().as_millis().to_string();
    pgrx::Spi::run_with_args("SELECT pg_catalog.set_config('lock_timeout', $1, true)", &[timeout.into()])
        .or_internal("set the page's lock_timeout");
}
