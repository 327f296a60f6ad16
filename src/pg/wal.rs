//! The WAL of this process's own transactions, and how far a replication slot's walsender has
//! sent it.

use pgrx::pg_sys;
use std::ptr::{addr_of, read_volatile};

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

/// Flushes the WAL up to `end`, on a primary: a walsender sends only flushed WAL, and on a
/// source that commits nothing more the tail of it (a non-transactional record, an asynchronous
/// commit's) may wait for the background writers, seconds (measured: a comparison bound to a
/// slot waited 21 s on an idle source for what it took 1.9 s to see with commits going on).
///
/// `end` must be the end of a record already inserted, as `END_OF_INSERTED_WAL` gives it; not
/// `pg_current_wal_insert_lsn()`, which at a page's start points past the page's header, to WAL
/// not written yet, which XLogFlush refuses ("xlog flush request ... is not satisfied").
pub fn flush_up_to(end: u64) {
    // SAFETY: outside recovery, XLogFlush takes any position up to the end of the WAL inserted;
    // RecoveryInProgress only reads shared state.
    unsafe {
        if !pg_sys::RecoveryInProgress() {
            pg_sys::XLogFlush(end);
        }
    }
}

/// The end of the WAL inserted so far, as `pg_lsn` text; on a standby, the WAL replayed.
///
/// `pg_current_wal_insert_lsn()` is where the next record will start: when the last one ended
/// at a page's end, that is past the next page's header (24 bytes; 40 on a segment's first
/// page), which no record fills yet. The headers' sizes are checked against PostgreSQL's below.
pub const END_OF_INSERTED_WAL: &str =
    "SELECT (CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_replay_lsn()
                  ELSE (SELECT CASE WHEN in_page OPERATOR(pg_catalog.=) header
                                    THEN inserted OPERATOR(pg_catalog.-) header::pg_catalog.numeric
                                    ELSE inserted END
                          FROM (SELECT inserted, in_segment OPERATOR(pg_catalog.%) page_size AS in_page,
                                       CASE WHEN in_segment OPERATOR(pg_catalog.<) page_size THEN 40 ELSE 24 END AS header
                                  FROM (SELECT pg_catalog.pg_current_wal_insert_lsn() AS inserted) i,
                                       LATERAL (SELECT (inserted OPERATOR(pg_catalog.-) '0/0'::pg_catalog.pg_lsn)
                                                           OPERATOR(pg_catalog.%) pg_catalog.pg_size_bytes(pg_catalog.current_setting('wal_segment_size'))
                                                           AS in_segment,
                                                       pg_catalog.current_setting('wal_block_size')::pg_catalog.int4 AS page_size) s) w)
             END)::pg_catalog.text";

// The page headers END_OF_INSERTED_WAL steps back over: SizeOfXLogShortPHD and
// SizeOfXLogLongPHD, MAXALIGNed.
const _: () = {
    const fn maxaligned(size: usize) -> usize {
        size.next_multiple_of(pg_sys::MAXIMUM_ALIGNOF as usize)
    }
    assert!(maxaligned(std::mem::size_of::<pg_sys::XLogPageHeaderData>()) == 24);
    assert!(maxaligned(std::mem::size_of::<pg_sys::XLogLongPageHeaderData>()) == 40);
};

/// The WAL segment after the one being written, when three quarters of this one are written
/// and the next does not exist yet (neither created nor recycled by a checkpoint); None
/// otherwise, and on a standby.
///
/// The first write into a segment that does not exist creates it, by default filling its 16 MB
/// with zeros and syncing them (`wal_init_zero`). The process that writes first is whoever
/// commits then, holding WALWriteLock, so every commit behind it waits that long: a backfill
/// writing WAL fast makes the application meet that wait every few seconds (bench/README.md).
/// The checkpointer prepares one segment ahead this way (PreallocXlogFiles), only at a
/// checkpoint.
pub fn next_segment_to_prepare() -> Option<WalSegment> {
    // SAFETY: RecoveryInProgress, GetXLogInsertRecPtr and GetWALInsertionTimeLine only read
    // shared state (the last two only outside recovery); wal_segment_size is set at startup.
    let (inserted, timeline, segment_size) = unsafe {
        if pg_sys::RecoveryInProgress() {
            return None;
        }
        (pg_sys::GetXLogInsertRecPtr(), pg_sys::GetWALInsertionTimeLine(), pg_sys::wal_segment_size as u64)
    };
    if inserted % segment_size < segment_size / 4 * 3 {
        return None;
    }
    let next = WalSegment { number: inserted / segment_size + 1, timeline };
    // A backend's working directory is the data directory.
    let path = format!("pg_wal/{}", next.file_name(segment_size));
    (!std::path::Path::new(&path).exists()).then_some(next)
}

/// A WAL segment: its number and the timeline it is for.
pub struct WalSegment {
    number: u64,
    timeline: pg_sys::TimeLineID,
}

impl WalSegment {
    /// Its file's name in pg_wal, as PostgreSQL's XLogFileName() writes it.
    fn file_name(&self, segment_size: u64) -> String {
        let per_id = 0x1_0000_0000 / segment_size;
        format!("{:08X}{:08X}{:08X}", self.timeline, self.number / per_id, self.number % per_id)
    }

    /// Creates it as the first write into it would (or finds it made meanwhile). Raises an
    /// ERROR if it cannot (a full disk): call it inside a transaction.
    pub fn create(&self) {
        // SAFETY: XLogFileInit is what the checkpointer's PreallocXlogFiles and every WAL
        // writer call: it creates the segment under a temporary name and renames it into place
        // under ControlFileLock (or opens the one a concurrent writer installed), cleaning up
        // after itself before it raises an error. The descriptor it returns is a plain one
        // (BasicOpenFile), closed here as PreallocXlogFiles closes it.
        unsafe {
            let fd = pg_sys::XLogFileInit(self.number, self.timeline);
            drop(<std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd));
        }
    }
}

/// A `pg_lsn`'s text ("16/B374D848") as a WAL position.
pub fn lsn_from_text(text: &str) -> Option<u64> {
    let (high, low) = text.split_once('/')?;
    Some(u64::from_str_radix(high, 16).ok()? << 32 | u64::from_str_radix(low, 16).ok()?)
}

/// How far the walsender streaming logical slot `slot` has decoded and sent the WAL (its
/// `pg_stat_replication.sent_lsn`); None while no walsender streams it (no consumer, or one
/// reading it with `pg_logical_slot_get_changes`).
///
/// Read from shared memory, as PostgreSQL's own views do, because the views show a walsender's
/// positions only to the roles of `pg_read_all_stats`, and a worker runs as the role that
/// started its backfill.
pub fn slot_sent_lsn(slot: &str) -> Option<u64> {
    let pid = slot_user_pid(slot)?;
    // SAFETY: WalSndCtl's array has max_wal_senders entries, in shared memory for the server's
    // life. Each field is a plain aligned integer read whole, without the walsender's spinlock
    // (C's inline functions): a walsender that exits meanwhile, or one that reuses the entry,
    // gives a stale position, which the caller only waits on for a bounded time.
    unsafe {
        let control = pg_sys::WalSndCtl;
        if control.is_null() {
            return None;
        }
        let senders = (*control).walsnds.as_ptr();
        (0..pg_sys::max_wal_senders.max(0) as usize)
            .map(|i| senders.add(i))
            .find(|sender| read_volatile(addr_of!((**sender).pid)) == pid)
            .map(|sender| read_volatile(addr_of!((*sender).sentPtr)))
    }
}

/// The pid of the process using replication slot `slot` now, if one does.
pub fn slot_user_pid(slot: &str) -> Option<i32> {
    // SAFETY: ReplicationSlotCtl's array has max_replication_slots entries, in shared memory for
    // the server's life. Read without ReplicationSlotControlLock: a slot created or dropped
    // meanwhile may show a name being written, which then matches no slot, or a stale user, which
    // the caller allows (slot_sent_lsn). The name is copied out whole before it is looked at.
    unsafe {
        let control = pg_sys::ReplicationSlotCtl;
        if control.is_null() {
            return None;
        }
        let slots = (*control).replication_slots.as_ptr();
        (0..pg_sys::max_replication_slots.max(0) as usize).map(|i| slots.add(i)).find_map(|entry| {
            if !read_volatile(addr_of!((*entry).in_use)) {
                return None;
            }
            let name = read_volatile(addr_of!((*entry).data.name.data));
            let length = name.iter().position(|c| *c == 0).unwrap_or(name.len());
            let same = name[..length].iter().map(|c| *c as u8).eq(slot.bytes());
            let pid = crate::pg::compat::slot_active_pid(entry);
            (same && pid != 0).then_some(pid)
        })
    }
}
