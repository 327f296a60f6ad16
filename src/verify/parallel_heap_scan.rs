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
/// the serial queries must read.
pub fn scan(
    relid: pg_sys::Oid,
    name: &str,
    key_column: &str,
    bounds: &[i64],
    hash: bool,
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
        if workers == 0 {
            pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
            return None;
        }
        let key_width = c_int::from((*tuple_attribute(rel, key_index as usize)).attlen);
        let participants = workers as usize + 1;

        pg_sys::EnterParallelMode();
        let context =
            pg_sys::CreateParallelContext(c"pg_backfill".as_ptr(), c"backfill_parallel_scan_worker".as_ptr(), workers);
        let sizes = [
            std::mem::size_of::<Task>(),
            std::mem::size_of_val(bounds),
            participants * ranges * std::mem::size_of::<RangeSum>(),
            pg_sys::table_parallelscan_estimate(rel, snapshot),
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
        task.write(Task { relid, key_index, key_width, bounds: bounds.len(), participants, hash });
        let shared_bounds = allocate(KEY_BOUNDS, sizes[1]).cast::<i64>();
        std::ptr::copy_nonoverlapping(bounds.as_ptr(), shared_bounds, bounds.len());
        let sums = allocate(KEY_SUMS, sizes[2]).cast::<RangeSum>();
        std::slice::from_raw_parts_mut(sums, participants * ranges).fill(RangeSum { rows: 0, sum: 0 });
        let parallel_scan = allocate(KEY_SCAN, sizes[3]).cast::<pg_sys::ParallelTableScanDescData>();
        pg_sys::table_parallelscan_initialize(rel, parallel_scan, snapshot);

        pg_sys::LaunchParallelWorkers(context);
        // This backend reads blocks too, as the last participant, unless
        // parallel_leader_participation is off, as in a Gather; all of them when no worker
        // could be started.
        if pg_sys::parallel_leader_participation || (*context).nworkers_launched == 0 {
            participate(rel, parallel_scan, &*task, bounds, sums, workers as usize);
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
            if hash { "hashed" } else { "counted" },
            (*context).nworkers_launched,
            rows_by_participant[workers as usize]
        );
        pg_sys::DestroyParallelContext(context);
        pg_sys::ExitParallelMode();
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
        let parallel_scan = pg_sys::shm_toc_lookup(toc, KEY_SCAN, false).cast::<pg_sys::ParallelTableScanDescData>();
        let rel = pg_sys::table_open(task.relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        participate(rel, parallel_scan, task, bounds, sums, pg_sys::ParallelWorkerNumber as usize);
        pg_sys::table_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
    }
}

/// Reads blocks of the parallel scan until none is left, and writes the counts and sums of
/// what it read into participant `participant`'s part of `sums`.
///
/// # Safety
/// `rel` is the task's table, open; `parallel_scan` its initialized parallel scan; `sums` has
/// room for the task's participants' ranges.
unsafe fn participate(
    rel: pg_sys::Relation,
    parallel_scan: pg_sys::ParallelTableScanDesc,
    task: &Task,
    bounds: &[i64],
    sums: *mut RangeSum,
    participant: usize,
) {
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
    std::ptr::copy_nonoverlapping(mine.as_ptr(), sums.add(participant * ranges), ranges);
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
