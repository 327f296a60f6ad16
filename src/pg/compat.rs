//! The one place where PostgreSQL's C API differs between the majors this crate builds for
//! (15, 17, 18 and 19, chosen by the cargo feature `pg15`, `pg17`, `pg18` or `pg19`). Each difference is one small
//! function here with the meaning the rest of the code relies on; no other file asks which
//! version it is built for.

use pgrx::pg_sys;
use std::ffi::{c_char, c_int};

/// The attributes of a tuple descriptor, dropped columns included, in column order.
///
/// 18 moved them behind an array of `CompactAttribute`s (`attrs` is gone); `TupleDescAttr`,
/// PostgreSQL's own accessor, gives the first, and they still lie side by side.
///
/// # Safety
/// `tupdesc` is a valid tuple descriptor that outlives the slice.
pub unsafe fn tuple_attributes<'a>(tupdesc: pg_sys::TupleDesc) -> &'a [pg_sys::FormData_pg_attribute] {
    let count = (*tupdesc).natts as usize;
    #[cfg(any(feature = "pg15", feature = "pg17"))]
    let first = (*tupdesc).attrs.as_ptr();
    #[cfg(any(feature = "pg18", feature = "pg19"))]
    let first = pg_sys::TupleDescAttr(tupdesc, 0).cast_const();
    std::slice::from_raw_parts(first, count)
}

/// The relation's primary key index, or `InvalidOid`: a deferrable primary key does not count,
/// as its rows may be briefly non-unique.
///
/// 18 added `deferrable_ok` (false keeps 15's meaning: 15's relcache never returned one).
///
/// # Safety
/// `relation` is open.
pub unsafe fn primary_key_index(relation: pg_sys::Relation) -> pg_sys::Oid {
    #[cfg(any(feature = "pg15", feature = "pg17"))]
    return pg_sys::RelationGetPrimaryKeyIndex(relation);
    #[cfg(any(feature = "pg18", feature = "pg19"))]
    return pg_sys::RelationGetPrimaryKeyIndex(relation, false);
}

/// Whether rows of `tupdesc` have a virtual generated column: one whose value is computed when
/// a query reads it, never stored (a stored tuple holds NULL in its place).
///
/// 18 added them (`has_generated_virtual`); 15 and 17 have none.
///
/// # Safety
/// `tupdesc` is a valid tuple descriptor.
pub unsafe fn has_virtual_generated_columns(tupdesc: pg_sys::TupleDesc) -> bool {
    #[cfg(any(feature = "pg15", feature = "pg17"))]
    return {
        let _ = tupdesc;
        false
    };
    #[cfg(any(feature = "pg18", feature = "pg19"))]
    return {
        let constraints = (*tupdesc).constr;
        !constraints.is_null() && (*constraints).has_generated_virtual
    };
}

unsafe extern "C-unwind" {
    /// PostgreSQL's own SIGTERM handler for backends (pgrx only wraps it as a Rust fn).
    #[cfg(any(feature = "pg15", feature = "pg17", feature = "pg18"))]
    #[link_name = "die"]
    fn postgres_die(signal: c_int);
    /// 19's handlers are given the signal's sender too (`SIGNAL_ARGS`).
    #[cfg(feature = "pg19")]
    #[link_name = "die"]
    fn postgres_die(signal: c_int, info: *const pg_sys::pg_signal_info);
}

/// SIGTERM (pg_terminate_backend, shutdown) ends this process at once, as it ends any backend:
/// PostgreSQL's own handler (`die`), installed with `pqsignal` (which 18's headers map to
/// `pqsignal_be` inside the server).
///
/// # Safety
/// The process is a backend or a background worker of PostgreSQL's.
pub unsafe fn die_on_sigterm() {
    #[cfg(any(feature = "pg15", feature = "pg17"))]
    pg_sys::pqsignal(pg_sys::SIGTERM as c_int, Some(postgres_die));
    #[cfg(any(feature = "pg18", feature = "pg19"))]
    pg_sys::pqsignal_be(pg_sys::SIGTERM as c_int, Some(postgres_die));
}

/// Joins a parallel scan of `relation` that `scan` describes (initialized by the leader).
///
/// 19 takes the scan's options beyond those the function sets itself (a sequential scan that may
/// use a strategy, synchronize and read page at a time): none, as before 19.
///
/// # Safety
/// `relation` is open and locked; `scan` was initialized for it.
pub unsafe fn begin_parallel_scan(
    relation: pg_sys::Relation,
    scan: pg_sys::ParallelTableScanDesc,
) -> pg_sys::TableScanDesc {
    #[cfg(any(feature = "pg15", feature = "pg17", feature = "pg18"))]
    return pg_sys::table_beginscan_parallel(relation, scan);
    #[cfg(feature = "pg19")]
    return pg_sys::table_beginscan_parallel(relation, scan, 0);
}

/// Whether `member` may act as `role`: it holds the role's privileges or may `SET ROLE` to it
/// (a superuser may both).
///
/// On 15 every member may `SET ROLE` (`is_member_of_role`). 16 separated membership from both
/// powers: a member granted `WITH INHERIT FALSE, SET FALSE` is still a member (what
/// `pg_has_role(..., 'MEMBER')` answers) yet may do nothing as the role.
pub fn may_act_as(member: pg_sys::Oid, role: pg_sys::Oid) -> bool {
    #[cfg(feature = "pg15")]
    // SAFETY: catalog lookups of two role ids, inside a transaction.
    return unsafe { pg_sys::is_member_of_role(member, role) };
    #[cfg(any(feature = "pg17", feature = "pg18", feature = "pg19"))]
    // SAFETY: catalog lookups of two role ids, inside a transaction.
    return unsafe { pg_sys::has_privs_of_role(member, role) || pg_sys::member_can_set_role(member, role) };
}

/// The shared memory a parallel scan of index `index`, with no scan key and no ordering, takes
/// (its part of a parallel context's segment) for `workers` workers.
///
/// 17 added the scan keys' counts; 18 the instrumentation and the workers' count, which 19 took
/// out again (17's signature).
///
/// # Safety
/// `index` is open; `snapshot` is the scan's snapshot.
pub unsafe fn index_parallel_scan_size(
    index: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    workers: std::ffi::c_int,
) -> usize {
    #[cfg(feature = "pg15")]
    return {
        let _ = workers;
        pg_sys::index_parallelscan_estimate(index, snapshot)
    };
    #[cfg(any(feature = "pg17", feature = "pg19"))]
    return {
        let _ = workers;
        pg_sys::index_parallelscan_estimate(index, 0, 0, snapshot)
    };
    #[cfg(feature = "pg18")]
    return pg_sys::index_parallelscan_estimate(index, 0, 0, snapshot, false, true, workers);
}

/// Initializes, in `target` (of [`index_parallel_scan_size`]), a parallel scan of `index` of
/// table `heap` under `snapshot`, for `workers` workers, without instrumentation.
///
/// # Safety
/// As [`index_parallel_scan_size`]; `target` has the room it returned.
pub unsafe fn index_parallel_scan_initialize(
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    workers: std::ffi::c_int,
    target: pg_sys::ParallelIndexScanDesc,
) {
    #[cfg(any(feature = "pg15", feature = "pg17", feature = "pg19"))]
    {
        let _ = workers;
        pg_sys::index_parallelscan_initialize(heap, index, snapshot, target);
    }
    #[cfg(feature = "pg18")]
    {
        let mut no_instrumentation: *mut pg_sys::SharedIndexScanInstrumentation = std::ptr::null_mut();
        pg_sys::index_parallelscan_initialize(
            heap,
            index,
            snapshot,
            false,
            true,
            workers,
            &mut no_instrumentation,
            target,
        );
    }
}

/// A participant's scan of the parallel index scan `pscan` ([`index_parallel_scan_initialize`]),
/// with no scan key and no ordering.
///
/// 18 added the instrumentation (none here); 19 the scan's options beyond those the function
/// sets itself (none, as before 19).
///
/// # Safety
/// `heap` and `index` are open, the relations `pscan` was initialized for.
pub unsafe fn index_begin_parallel_scan(
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    pscan: pg_sys::ParallelIndexScanDesc,
) -> pg_sys::IndexScanDesc {
    #[cfg(any(feature = "pg15", feature = "pg17"))]
    return pg_sys::index_beginscan_parallel(heap, index, 0, 0, pscan);
    #[cfg(feature = "pg18")]
    return pg_sys::index_beginscan_parallel(heap, index, std::ptr::null_mut(), 0, 0, pscan);
    #[cfg(feature = "pg19")]
    return pg_sys::index_beginscan_parallel(heap, index, std::ptr::null_mut(), 0, 0, pscan, 0);
}

/// Ends the process with `code` (`proc_exit`). 18's headers declare it `pg_noreturn` in a way
/// the bindings no longer see, so the shim restores the `!`.
pub fn exit_process(code: i32) -> ! {
    // SAFETY: proc_exit runs the process's exit callbacks and never returns.
    unsafe { pg_sys::proc_exit(code) };
    #[cfg(any(feature = "pg18", feature = "pg19"))]
    unreachable!("proc_exit returned")
}

// Not in pgrx's bindings. 15: XLogRecPtr LogLogicalMessage(const char *prefix,
// const char *message, size_t size, bool transactional); 17 added `bool flush`.
unsafe extern "C-unwind" {
    #[cfg(feature = "pg15")]
    fn LogLogicalMessage(prefix: *const c_char, message: *const c_char, size: usize, transactional: bool) -> u64;
    #[cfg(any(feature = "pg17", feature = "pg18", feature = "pg19"))]
    fn LogLogicalMessage(
        prefix: *const c_char,
        message: *const c_char,
        size: usize,
        transactional: bool,
        flush: bool,
    ) -> u64;
}

/// Writes a transactional logical decoding message to WAL; returns its record's LSN.
///
/// 17's `flush` is false: PostgreSQL honours it only for non-transactional messages (which
/// nothing else makes durable), and these are transactional, decoded only once their
/// transaction commits; whether a page's commit waits for the flush is decided in page.rs.
///
/// # Safety
/// `prefix` is a NUL-terminated string and `message` points to `size` readable bytes. An ERROR
/// raised inside longjmps: call it under `pg_guard_ffi_boundary`.
pub unsafe fn log_transactional_message(prefix: *const c_char, message: *const c_char, size: usize) -> u64 {
    #[cfg(feature = "pg15")]
    return LogLogicalMessage(prefix, message, size, true);
    #[cfg(any(feature = "pg17", feature = "pg18", feature = "pg19"))]
    return LogLogicalMessage(prefix, message, size, true, false);
}

/// SQL: whether the publication of the `pg_catalog.pg_publication` row `publication` (an alias)
/// publishes a table's stored generated columns when it has no column list for the table, as
/// pgoutput sends them.
///
/// 15 and 17 never do: their pgoutput skips every generated column, though their
/// `pg_publication_tables.attnames` lists them. 18 does when the publication says
/// `publish_generated_columns = stored` (`pubgencols` 's'); a virtual one never goes.
pub fn publishes_stored_generated_columns(publication: &str) -> String {
    if cfg!(any(feature = "pg18", feature = "pg19")) {
        format!("({publication}.pubgencols OPERATOR(pg_catalog.=) 's')")
    } else {
        "false".into()
    }
}

/// SQL: whether a FOR ALL TABLES publication, the `pg_catalog.pg_publication` row `publication`
/// (an alias), leaves out the relation `relation` (an oid expression): it, or a partitioned
/// table it is a partition of, is in the publication's EXCEPT list.
///
/// 19 added `FOR ALL TABLES EXCEPT (TABLE ...)`, kept as `pg_publication_rel` rows with
/// `prexcept` (a partitioned table there takes its partitions with it; a partition cannot be
/// named alone). Before 19 a FOR ALL TABLES publication leaves out none.
pub fn excepted_from_all_tables(publication: &str, relation: &str) -> String {
    if cfg!(feature = "pg19") {
        format!(
            "EXISTS (SELECT FROM pg_catalog.pg_publication_rel e
                      WHERE e.prpubid OPERATOR(pg_catalog.=) {publication}.oid AND e.prexcept
                        AND (e.prrelid OPERATOR(pg_catalog.=) {relation}
                             OR e.prrelid OPERATOR(pg_catalog.=) ANY (
                                    ARRAY(SELECT a.relid FROM pg_catalog.pg_partition_ancestors({relation}) a))))"
        )
    } else {
        "false".into()
    }
}

/// SQL: whether the `pg_catalog.pg_publication_rel` row `row` (an alias) adds its relation to
/// the publication: on 19 a row may instead be an entry of a FOR ALL TABLES publication's EXCEPT
/// list (`prexcept`; [`excepted_from_all_tables`]).
pub fn publication_rel_adds(row: &str) -> String {
    if cfg!(feature = "pg19") {
        format!("(NOT {row}.prexcept)")
    } else {
        "true".into()
    }
}

/// SQL: whether the `pg_catalog.pg_replication_slots` row (unaliased) is a standby's copy of
/// its primary's failover slot, made by the slotsync worker (`sync_replication_slots`) and kept,
/// `synced` still true, when the standby was promoted.
///
/// 17 added failover slots and their synchronization; 15 has none.
pub fn slot_is_synchronized_copy() -> &'static str {
    if cfg!(feature = "pg15") {
        "false"
    } else {
        "(synced AND failover)"
    }
}

/// Whether logical decoding turns itself on at `wal_level = replica` while a logical slot exists,
/// so that the level in force is `effective_wal_level`'s rather than `wal_level`'s.
///
/// 19 does (it raises the level when the first logical slot is created, and lowers it some time
/// after the last is dropped); before 19 only `wal_level = logical` writes logical WAL.
pub fn logical_decoding_follows_slots() -> bool {
    cfg!(feature = "pg19")
}

/// The process that uses replication slot `slot` now (a walsender streaming it, a backend in
/// `pg_logical_slot_get_changes`), or 0 for none: `pg_replication_slots.active_pid`.
///
/// 19 records the user's process number (`active_proc`) instead of its pid.
///
/// # Safety
/// `slot` points into `ReplicationSlotCtl`'s array, in shared memory for the server's life. The
/// field is read without the slot's spinlock (which needs C's inline functions): a plain aligned
/// integer, read whole; the value may be stale by the time it is used, which the caller allows.
pub unsafe fn slot_active_pid(slot: *const pg_sys::ReplicationSlot) -> c_int {
    #[cfg(any(feature = "pg15", feature = "pg17", feature = "pg18"))]
    {
        std::ptr::read_volatile(std::ptr::addr_of!((*slot).active_pid))
    }
    #[cfg(feature = "pg19")]
    {
        let number = std::ptr::read_volatile(std::ptr::addr_of!((*slot).active_proc));
        if number == pg_sys::INVALID_PROC_NUMBER || pg_sys::ProcGlobal.is_null() {
            return 0;
        }
        std::ptr::read_volatile(std::ptr::addr_of!((*(*pg_sys::ProcGlobal).allProcs.add(number as usize)).pid))
    }
}
