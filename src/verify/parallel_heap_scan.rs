//! The count and hash levels' scan in parallel, for a table with one integer key. One process
//! hashing every row costs as much per row as the rows are wide: on a table of 750-byte rows it
//! took 13 times a count(*), which PostgreSQL runs in parallel; and 1,024 index scans, one a
//! range, took 2.3 to 2.6 times it. Here PostgreSQL's parallel workers and this backend take
//! blocks from one parallel table scan, as the participants of a Parallel Seq Scan do (same
//! block allocation, same ring buffer, the same snapshot), each counts (and hashes) the rows it
//! reads per range, and this backend adds up their sums. Counts and sums of hashes do not
//! depend on the order of the rows, so they are those of the serial queries (checksum.rs,
//! row_hash::scan), which still serve every case this one does not take (see
//! [`planned_workers`]).
//!
//! Counting needs the keys only: where the visibility map says nearly every block of the table
//! is all-visible, the participants share a parallel scan of the key's index instead, and read
//! the keys from it as an index-only scan does (a block not all-visible has its row looked up
//! for the snapshot), as PostgreSQL's own count(*) does then (`Parallel Index Only Scan`). On
//! 15, whose planner takes that plan for 1M frozen rows of eight columns, counting the table's
//! blocks took 4 times its count(*) ([`counting_index`]).

use crate::pg::compat;
use crate::verify::row_encoding::RowHasher;
use pgrx::pg_sys;
use std::ffi::c_int;

/// The most ranges summed in parallel: each participant's sums take 24 bytes a range of
/// shared memory.
const MAX_PARALLEL_RANGES: usize = 65_536;

/// The entries of the parallel context's table of contents (parallel.c's own are near 2^64).
const KEY_TASK: u64 = 1;
const KEY_BOUNDS: u64 = 2;
const KEY_SUMS: u64 = 3;
const KEY_SCAN: u64 = 4;

/// What every participant reads: the table and its key.
#[repr(C)]
struct Task {
    relid: pg_sys::Oid,
    /// The key's index, when the participants read it instead of the table (InvalidOid).
    index_relid: pg_sys::Oid,
    /// The key column's index in the table's descriptor.
    key_index: c_int,
    /// Its width in bytes: 2, 4 or 8.
    key_width: c_int,
    bounds: usize,
    /// Participants, each with `ranges` row counts and sums: the workers, then this backend.
    participants: usize,
    /// Whether rows are hashed too, or only counted.
    hash: bool,
}

/// One participant's counts and sums, per range.
#[repr(C)]
#[derive(Clone, Copy)]
struct RangeSum {
    rows: i64,
    sum: i128,
}

/// Each range's row count and (with `hash`) sum of hashes of table `relid` (`name` in
/// messages), whose key is its column `key_column`, an integer, with ranges split at `bounds`;
/// computed by parallel workers, or None when this table, role, server or transaction is one
/// the serial queries must read. Without `hash`, the rows are counted from the key's index where
/// [`counting_index`] finds it cheaper; without `heap_allowed`, only from there.
pub fn scan(
    relid: pg_sys::Oid,
    name: &str,
    key_column: &str,
    bounds: &[i64],
    hash: bool,
    heap_allowed: bool,
) -> Option<(Vec<i64>, Vec<i128>)> {
    let ranges = bounds.len() + 1;
    let key_column = std::ffi::CString::new(key_column).ok()?;
    if ranges > MAX_PARALLEL_RANGES {
        return None;
    }
    // SAFETY: the table is opened (and locked, as a query reading it would lock it, until the
    // end of the transaction) and closed here; the parallel context lives between
    // EnterParallelMode() and ExitParallelMode() below, or, after an error, until the
    // transaction's abort destroys it; shared memory is laid out as estimated.
    unsafe {
        let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let key_index = pg_sys::get_attnum(relid, key_column.as_ptr()) as c_int - 1;
        // (The parallel scan reads the caller's snapshot: the one its serial query would read.)
        let snapshot = if pg_sys::ActiveSnapshotSet() { pg_sys::GetActiveSnapshot() } else { std::ptr::null_mut() };
        // A virtual generated column is NULL in the stored tuples a participant reads: a row
        // hashed here would not be the row a query reads, which computes it (the serial query).
        let stored_rows_differ = hash && compat::has_virtual_generated_columns((*rel).rd_att);
        let workers = if key_index < 0 || snapshot.is_null() || stored_rows_differ { 0 } else { planned_workers(rel) };
        let index = if workers == 0 || hash { None } else { counting_index(rel, key_index) };
        if workers == 0 || (index.is_none() && !heap_allowed) {
            pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
            return None;
        }
        let index_relid = index.map_or(pg_sys::InvalidOid, |index| (*index).rd_id);
        let key_width = c_int::from((*tuple_attribute(rel, key_index as usize)).attlen);
        let participants = workers as usize + 1;

        pg_sys::EnterParallelMode();
        let context =
            pg_sys::CreateParallelContext(c"pg_backfill".as_ptr(), c"backfill_parallel_scan_worker".as_ptr(), workers);
        let sizes = [
            std::mem::size_of::<Task>(),
            std::mem::size_of_val(bounds),
            participants * ranges * std::mem::size_of::<RangeSum>(),
            match index {
                Some(index) => compat::index_parallel_scan_size(index, snapshot, workers),
                None => pg_sys::table_parallelscan_estimate(rel, snapshot),
            },
        ];
        for size in sizes {
            // (shm_toc_estimate_chunk and shm_toc_estimate_keys.)
            (*context).estimator.space_for_chunks += buffer_aligned(size);
            (*context).estimator.number_of_keys += 1;
        }
        pg_sys::InitializeParallelDSM(context);
        let toc = (*context).toc;
        let allocate = |key: u64, size: usize| {
            let chunk = pg_sys::shm_toc_allocate(toc, size);
            pg_sys::shm_toc_insert(toc, key, chunk);
            chunk
        };
        let task = allocate(KEY_TASK, sizes[0]).cast::<Task>();
        task.write(Task { relid, index_relid, key_index, key_width, bounds: bounds.len(), participants, hash });
        let shared_bounds = allocate(KEY_BOUNDS, sizes[1]).cast::<i64>();
        std::ptr::copy_nonoverlapping(bounds.as_ptr(), shared_bounds, bounds.len());
        let sums = allocate(KEY_SUMS, sizes[2]).cast::<RangeSum>();
        std::slice::from_raw_parts_mut(sums, participants * ranges).fill(RangeSum { rows: 0, sum: 0 });
        let parallel_scan = allocate(KEY_SCAN, sizes[3]);
        match index {
            Some(index) => compat::index_parallel_scan_initialize(rel, index, snapshot, workers, parallel_scan.cast()),
            None => pg_sys::table_parallelscan_initialize(rel, parallel_scan.cast(), snapshot),
        }

        pg_sys::LaunchParallelWorkers(context);
        // This backend reads blocks too, as the last participant, unless
        // parallel_leader_participation is off, as in a Gather; all of them when no worker
        // could be started.
        if pg_sys::parallel_leader_participation || (*context).nworkers_launched == 0 {
            participate(rel, index, parallel_scan, &*task, bounds, sums, workers as usize);
        }
        pg_sys::WaitForParallelWorkersToFinish(context);

        let mut rows = vec![0i64; ranges];
        let mut hash_sums = vec![0i128; ranges];
        let mut rows_by_participant = vec![0i64; participants];
        for (i, part) in std::slice::from_raw_parts(sums, participants * ranges).iter().enumerate() {
            rows[i % ranges] += part.rows;
            hash_sums[i % ranges] += part.sum;
            rows_by_participant[i / ranges] += part.rows;
        }
        let by_workers: i64 = rows_by_participant[..workers as usize].iter().sum();
        pgrx::debug1!(
            "pg_backfill: {name} {} by {} of {workers} parallel workers ({by_workers} rows) and this backend ({} rows)",
            match (hash, index.is_some()) {
                (true, _) => "hashed",
                (false, true) => "counted from its key's index",
                (false, false) => "counted",
            },
            (*context).nworkers_launched,
            rows_by_participant[workers as usize]
        );
        pg_sys::DestroyParallelContext(context);
        pg_sys::ExitParallelMode();
        if let Some(index) = index {
            pg_sys::index_close(index, pg_sys::NoLock as pg_sys::LOCKMODE);
        }
        pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        Some((rows, hash_sums))
    }
}

/// The entry point of a parallel worker of [`scan`] (parallel.c looks it up by name).
///
/// # Safety
/// Called by PostgreSQL in a parallel worker, with the table of contents [`scan`] filled.
#[pgrx::pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn backfill_parallel_scan_worker(
    _segment: *mut pg_sys::dsm_segment,
    toc: *mut pg_sys::shm_toc,
) {
    // SAFETY: the entries [`scan`] wrote, read as it wrote them; the worker runs in the
    // leader's transaction, which holds the table's lock.
    unsafe {
        let task = &*pg_sys::shm_toc_lookup(toc, KEY_TASK, false).cast::<Task>();
        let bounds =
            std::slice::from_raw_parts(pg_sys::shm_toc_lookup(toc, KEY_BOUNDS, false).cast::<i64>(), task.bounds);
        let sums = pg_sys::shm_toc_lookup(toc, KEY_SUMS, false).cast::<RangeSum>();
        let parallel_scan = pg_sys::shm_toc_lookup(toc, KEY_SCAN, false);
        let rel = pg_sys::table_open(task.relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let index = (task.index_relid != pg_sys::InvalidOid)
            .then(|| pg_sys::index_open(task.index_relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE));
        participate(rel, index, parallel_scan, task, bounds, sums, pg_sys::ParallelWorkerNumber as usize);
        if let Some(index) = index {
            pg_sys::index_close(index, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        }
        pg_sys::table_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
    }
}

/// Reads the parallel scan (of the table, or of `index`, the key's index) until nothing is left,
/// and writes the counts and sums of what it read into participant `participant`'s part of `sums`.
///
/// # Safety
/// `rel` is the task's table, open, and `index` its index, open, when the task reads it;
/// `parallel_scan` their initialized parallel scan; `sums` has room for the task's
/// participants' ranges.
unsafe fn participate(
    rel: pg_sys::Relation,
    index: Option<pg_sys::Relation>,
    parallel_scan: *mut std::ffi::c_void,
    task: &Task,
    bounds: &[i64],
    sums: *mut RangeSum,
    participant: usize,
) {
    let ranges = bounds.len() + 1;
    let mine = match index {
        Some(index) => count_from_index(rel, index, parallel_scan.cast(), task, bounds),
        None => read_table(rel, parallel_scan.cast(), task, bounds),
    };
    std::ptr::copy_nonoverlapping(mine.as_ptr(), sums.add(participant * ranges), ranges);
}

/// The ranges' counts (and sums) of the rows of the blocks of the parallel table scan this
/// participant gets.
///
/// # Safety
/// As [`participate`]'s, for the table.
unsafe fn read_table(
    rel: pg_sys::Relation,
    parallel_scan: pg_sys::ParallelTableScanDesc,
    task: &Task,
    bounds: &[i64],
) -> Vec<RangeSum> {
    let ranges = bounds.len() + 1;
    let mut mine = vec![RangeSum { rows: 0, sum: 0 }; ranges];
    let tupdesc = (*rel).rd_att;
    let natts = (*tupdesc).natts;
    let mut hasher = RowHasher::new(tupdesc, 0);
    let scan = crate::pg::compat::begin_parallel_scan(rel, parallel_scan);
    let slot = pg_sys::table_slot_create(rel, std::ptr::null_mut());
    // What hashing a row allocates (detoasted values, send formats), freed after each row.
    let row_memory = pg_sys::AllocSetContextCreateInternal(
        pg_sys::CurrentMemoryContext,
        c"backfill row hash".as_ptr(),
        0,
        pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
        pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
    );
    while pg_sys::table_scan_getnextslot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot) {
        pgrx::check_for_interrupts!();
        // (Counting reads the columns up to the key only.)
        let needed = if task.hash { natts } else { task.key_index + 1 };
        if c_int::from((*slot).tts_nvalid) < needed {
            pg_sys::slot_getsomeattrs_int(slot, needed);
        }
        let values = std::slice::from_raw_parts((*slot).tts_values, natts as usize);
        let nulls = std::slice::from_raw_parts((*slot).tts_isnull, natts as usize);
        let key = values[task.key_index as usize].value();
        let key = match task.key_width {
            2 => key as i16 as i64,
            4 => key as i32 as i64,
            _ => key as i64,
        };
        // As row_hash::scan: the number of bounds at or below the key.
        let range = &mut mine[bounds.partition_point(|bound| *bound <= key)];
        range.rows += 1;
        if task.hash {
            let caller_memory = pg_sys::MemoryContextSwitchTo(row_memory);
            range.sum += i128::from(hasher.hash(values, nulls) as i64);
            pg_sys::MemoryContextSwitchTo(caller_memory);
            pg_sys::MemoryContextReset(row_memory);
        }
    }
    pg_sys::ExecDropSingleTupleTableSlot(slot);
    pg_sys::table_endscan(scan);
    pg_sys::MemoryContextDelete(row_memory);
    mine
}

/// The ranges' counts of the keys of the index entries of the parallel index scan this
/// participant gets, each the key of a row the snapshot sees: as an index-only scan does, an
/// entry whose table block is all-visible counts as it is, another only if the snapshot sees a
/// row of its entry's chain (index_fetch_heap).
///
/// # Safety
/// As [`participate`]'s, for the index; the index's first column is the task's key, an integer
/// that is never NULL ([`counting_index`]).
unsafe fn count_from_index(
    rel: pg_sys::Relation,
    index: pg_sys::Relation,
    parallel_scan: pg_sys::ParallelIndexScanDesc,
    task: &Task,
    bounds: &[i64],
) -> Vec<RangeSum> {
    let mut mine = vec![RangeSum { rows: 0, sum: 0 }; bounds.len() + 1];
    let scan = compat::index_begin_parallel_scan(rel, index, parallel_scan);
    (*scan).xs_want_itup = true;
    pg_sys::index_rescan(scan, std::ptr::null_mut(), 0, std::ptr::null_mut(), 0);
    let slot = pg_sys::table_slot_create(rel, std::ptr::null_mut());
    let mut visibility_map = pg_sys::InvalidBuffer as pg_sys::Buffer;
    loop {
        let tid = pg_sys::index_getnext_tid(scan, pg_sys::ScanDirection::ForwardScanDirection);
        if tid.is_null() {
            break;
        }
        pgrx::check_for_interrupts!();
        let block = (u32::from((*tid).ip_blkid.bi_hi) << 16) | u32::from((*tid).ip_blkid.bi_lo);
        let all_visible = pg_sys::visibilitymap_get_status(rel, block, &mut visibility_map)
            & pg_sys::VISIBILITYMAP_ALL_VISIBLE as u8
            != 0;
        if !all_visible && !pg_sys::index_fetch_heap(scan, slot) {
            continue;
        }
        // The entry's key: its first attribute, right after the tuple's header (no NULL
        // bitmap: the key is never NULL), aligned to 8 bytes, which suits every integer type.
        let entry = (*scan).xs_itup.cast::<u8>();
        let data = entry.add(std::mem::size_of::<pg_sys::IndexTupleData>().next_multiple_of(8));
        let key = match task.key_width {
            2 => i64::from(data.cast::<i16>().read_unaligned()),
            4 => i64::from(data.cast::<i32>().read_unaligned()),
            _ => data.cast::<i64>().read_unaligned(),
        };
        mine[bounds.partition_point(|bound| *bound <= key)].rows += 1;
    }
    if visibility_map != pg_sys::InvalidBuffer as pg_sys::Buffer {
        pg_sys::ReleaseBuffer(visibility_map);
    }
    pg_sys::ExecDropSingleTupleTableSlot(slot);
    pg_sys::index_endscan(scan);
    mine
}

/// The key's index, open, when counting reads it rather than the table: the primary key, a
/// valid B-tree whose first column is the key (column `key_index` of the table), which
/// PostgreSQL scans in parallel; and a table whose blocks are nearly all all-visible (90%, at its
/// last VACUUM), so that its rows are rarely looked up. Then the index's keys cost a fraction of
/// the table's blocks (on 1M frozen rows of eight columns, 2,745 index blocks against 16,383).
/// Not under serializable isolation, whose predicate locks an index-only read would take on
/// the table's blocks. None otherwise, or where no such index exists.
///
/// # Safety
/// `rel` is open.
unsafe fn counting_index(rel: pg_sys::Relation, key_index: c_int) -> Option<pg_sys::Relation> {
    let class = &*(*rel).rd_rel;
    let mostly_all_visible = class.relpages > 0 && i64::from(class.relallvisible) * 10 >= i64::from(class.relpages) * 9;
    if !mostly_all_visible || pg_sys::XactIsoLevel == pg_sys::XACT_SERIALIZABLE as c_int {
        return None;
    }
    let index_relid = compat::primary_key_index(rel);
    if index_relid == pg_sys::InvalidOid {
        return None;
    }
    let index = pg_sys::index_open(index_relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
    let form = &*(*index).rd_index;
    let first_column = *form.indkey.values.as_ptr();
    let suitable = (*(*index).rd_rel).relam == pg_sys::BTREE_AM_OID
        && form.indisvalid
        && form.indnkeyatts >= 1
        && i32::from(first_column) == key_index + 1
        && !(*index).rd_indam.is_null()
        && (*(*index).rd_indam).amcanparallel;
    if suitable {
        Some(index)
    } else {
        pg_sys::index_close(index, pg_sys::NoLock as pg_sys::LOCKMODE);
        None
    }
}

/// The parallel workers a scan of `rel` gets, as the planner gives a Parallel Seq Scan of it:
/// one from min_parallel_table_scan_size, one more at each three times that, at most
/// max_parallel_workers_per_gather, or the table's parallel_workers storage parameter. 0 for
/// a table the serial scan reads: a temporary one (only its backend sees its buffers), a
/// partitioned one, one with row-level security for this role (its policies apply to a query,
/// and their expressions are the role's); one this role may not read as a
/// whole (the serial query raises the error); one with a column whose send function is not
/// built in (parallel safety is not known); and in a database whose encoding is not UTF-8 (a
/// worker's text conversions are not set up).
///
/// # Safety
/// `rel` is an open relation.
unsafe fn planned_workers(rel: pg_sys::Relation) -> c_int {
    let class = &*(*rel).rd_rel;
    let relid = (*rel).rd_id;
    let readable = || {
        pg_sys::pg_class_aclcheck(relid, pg_sys::GetUserId(), pg_sys::ACL_SELECT as pg_sys::AclMode)
            == pg_sys::AclResult::ACLCHECK_OK
    };
    if pg_sys::IsInParallelMode()
        || pg_sys::max_parallel_workers_per_gather <= 0
        || pg_sys::GetDatabaseEncoding() != pg_sys::pg_enc::PG_UTF8 as c_int
        || class.relkind != pg_sys::RELKIND_RELATION as std::ffi::c_char
        || class.relpersistence == pg_sys::RELPERSISTENCE_TEMP as std::ffi::c_char
        || pg_sys::check_enable_rls(relid, pg_sys::InvalidOid, true) != pg_sys::CheckEnableRlsResult::RLS_NONE as c_int
        || !readable()
        || !RowHasher::new((*rel).rd_att, 0).built_in()
    {
        return 0;
    }
    let options = (*rel).rd_options.cast::<pg_sys::StdRdOptions>();
    if !options.is_null() && (*options).parallel_workers >= 0 {
        return (*options).parallel_workers.min(pg_sys::max_parallel_workers_per_gather);
    }
    let blocks = pg_sys::RelationGetNumberOfBlocksInFork(rel, pg_sys::ForkNumber::MAIN_FORKNUM) as i64;
    let mut threshold = i64::from(pg_sys::min_parallel_table_scan_size.max(1));
    if blocks < threshold {
        return 0;
    }
    let mut workers = 1;
    while blocks >= threshold * 3 {
        workers += 1;
        threshold *= 3;
    }
    workers.min(pg_sys::max_parallel_workers_per_gather)
}

/// # Safety
/// `index` is below the relation's column count.
unsafe fn tuple_attribute(rel: pg_sys::Relation, index: usize) -> *const pg_sys::FormData_pg_attribute {
    &compat::tuple_attributes((*rel).rd_att)[index]
}

/// BUFFERALIGN: shared memory chunks start at multiples of 32 bytes.
fn buffer_aligned(size: usize) -> usize {
    size.next_multiple_of(pg_sys::ALIGNOF_BUFFER as usize)
}
