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
