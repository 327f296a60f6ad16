//! The WAL of this process's own transactions.

use pgrx::pg_sys;

/// Waits until this process's last commit is flushed to disk, as a commit with
/// `synchronous_commit = on` would have, but after the commit, with its locks released.
pub fn flush_last_commit() {
    // SAFETY: XactLastCommitEnd is this process's own (the end of its last commit record, 0
    // before any), and XLogFlush takes any position up to the WAL inserted; it is what a
    // synchronous commit calls, and the WAL writer calls it outside any transaction too.
    unsafe {
        let end = pg_sys::XactLastCommitEnd;
        if end != 0 {
            pg_sys::XLogFlush(end);
        }
    }
}

/// Flushes the WAL inserted so far, on a primary: a walsender sends only flushed WAL, and on a
/// source that commits nothing more the tail of it (a non-transactional record, an asynchronous
/// commit's) may wait for the background writers, seconds (measured: a comparison bound to a
/// slot waited 21 s on an idle source for what it took 1.9 s to see with commits going on).
pub fn flush_inserted() {
    // SAFETY: outside recovery, XLogFlush takes any position up to the WAL inserted, which
    // GetXLogInsertRecPtr returns; RecoveryInProgress only reads shared state.
    unsafe {
        if !pg_sys::RecoveryInProgress() {
            pg_sys::XLogFlush(pg_sys::GetXLogInsertRecPtr());
        }
    }
}
