//! pg_backfill's own heavyweight locks: the one that serializes the starts of a database, and
//! the one that keeps a backfill's worker to one process. Every use goes through here.
//!
//! They are advisory-class locks (PostgreSQL's user lock method: shown in pg_locks as
//! `advisory`, released at the end of the transaction, or of the process for a session lock)
//! whose tags no SQL statement can name. PostgreSQL's advisory lock functions build theirs with
//! SET_LOCKTAG_ADVISORY, whose last field (pg_locks.objsubid) is always 1 (one bigint key) or 2
//! (two int4 keys); ours carry a value of their own there, above both. So no role can take them
//! ahead, wait in their queue, hold them in a prepared transaction or release them: a role that
//! takes `pg_advisory_lock(hashtext('pg_backfill.start'))`, as 0.10.0 named its lock, blocks
//! nothing of pg_backfill's.

use crate::pg::errors::raise;
use pgrx::pg_sys;
use pgrx::PgSqlErrorCode::*;

/// pg_locks.objsubid of the lock that serializes the backfill starts of a database.
const START_LOCK_CLASS: u16 = 0x6273; // "bs"
/// pg_locks.objsubid of the lock of one worker of one backfill.
const WORKER_LOCK_CLASS: u16 = 0x6277; // "bw"

/// An advisory-class tag in this database (`field1`, as SET_LOCKTAG_ADVISORY sets it), of `class`.
fn tag(field2: u32, field3: u32, class: u16) -> pg_sys::LOCKTAG {
    pg_sys::LOCKTAG {
        // SAFETY: this backend's database, set when it connected.
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: field2,
        locktag_field3: field3,
        locktag_field4: class,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    }
}

/// Serializes the backfill starts of this database until this transaction ends: two starts of
/// the same table or slot must not both pass their checks. A transaction that took it cannot be
/// prepared (see [`refuse_prepare`]).
pub fn lock_backfill_starts() {
    let tag = tag(0, 0, START_LOCK_CLASS);
    // SAFETY: a transaction-level lock on a tag built above; waits like any lock (deadlocks are
    // detected, a cancel interrupts it) and is released when the transaction ends.
    let acquired = unsafe { pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, false, false) };
    if acquired == pg_sys::LockAcquireResult::LOCKACQUIRE_OK {
        pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::PrePrepare, refuse_prepare);
    }
}

/// A prepared transaction keeps its locks until COMMIT PREPARED, across restarts: one that held
/// the start lock would block every start of its database, and the workers it launched would
/// wait for it as long. PREPARE TRANSACTION is refused instead (as postgres_fdw refuses it for
/// a transaction that wrote to a foreign server). Refused too after a start rolled back to a
/// savepoint: its workers were registered all the same and wait for this transaction.
fn refuse_prepare() {
    raise(
        ERRCODE_FEATURE_NOT_SUPPORTED,
        "cannot PREPARE a transaction that started a backfill",
        "A backfill's workers wait for the transaction that started it, and starts of the database wait for \
         its lock: a prepared transaction would hold both until COMMIT PREPARED.",
        Some("Start backfills in a transaction of their own, committed with COMMIT.".into()),
    )
}

/// Tries to take the lock of worker `worker` of backfill `backfill_id`, for the rest of this
/// process's life; false when another process holds it (that worker's previous process, still
/// finishing). Backfill ids are taken modulo 2^32: two backfills 4 billion ids apart share a
/// tag, and then a worker of one waits for the same worker of the other, no more.
pub fn try_lock_worker(backfill_id: i64, worker: i32) -> bool {
    let tag = tag(worker as u32, backfill_id as u32, WORKER_LOCK_CLASS);
    // SAFETY: a session-level lock on a tag built above, without waiting; kept until the
    // process exits.
    let acquired = unsafe { pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, true, true) };
    acquired != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
}

/// Admits the starting workers of the cluster one at a time, until this transaction ends, so
/// that two do not both see room under backfill.max_workers. A lock tag no PostgreSQL object
/// uses: the shared catalog pg_database, object 0, with a sub-object of its own.
pub fn lock_worker_admissions() {
    const ADMISSION_LOCK_SUBID: u16 = 0x6266;
    // SAFETY: takes a heavyweight lock, released at the end of this transaction.
    unsafe {
        pg_sys::LockSharedObject(
            pg_sys::DatabaseRelationId,
            pg_sys::InvalidOid,
            ADMISSION_LOCK_SUBID,
            pg_sys::ExclusiveLock as pg_sys::LOCKMODE,
        );
    }
}
