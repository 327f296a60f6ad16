//! A read of a table reaches that table and no other: the one the caller locked and checked.
//!
//! pg_backfill checks a table by its OID (its owner, the caller's rights, its columns) and then
//! reads it with SQL, by name: `FROM ONLY public.t`. Between the two, a name can come to mean
//! another relation: the online-migration swap (`t` renamed away, another table renamed to
//! `t`), or a schema renamed and replaced by one of the same name. The page would then read
//! the other table, as the checked table's owner, and run the other table's code (a cast to
//! json of its column's type) with that owner's rights, a superuser's for a table a superuser
//! owns.
//!
//! [`reading`] closes that for every query run inside it: the executor's permission check
//! (which sees every relation a plan reads, after parse analysis and planning and before any
//! row is read or any user code runs on one) refuses a plan that reads another relation than
//! the guarded one, other than the system catalogs, pg_backfill's own tables and this node's
//! shards of the guarded table (Citus). Only the queries that `reading`'s closure runs itself
//! are checked, not those that code of the table runs while they execute (a SQL function's own queries, which may read what they like):
//! those start inside the guarded query's `ExecutorRun`, one level deeper.

use crate::pg::errors::raise;
use crate::pg::nodes::list_of;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;
use std::cell::Cell;

/// The guarded read: the relation, and the executor depth of the queries to check.
#[derive(Clone, Copy)]
struct Guard {
    relid: pg_sys::Oid,
    depth: u32,
}

thread_local! {
    /// How many `ExecutorRun`s are running in this backend, one inside another.
    static RUN_DEPTH: Cell<u32> = const { Cell::new(0) };
    /// The read that [`reading`] guards now, if any.
    static GUARD: Cell<Option<Guard>> = const { Cell::new(None) };
}

static mut NEXT_EXECUTOR_RUN: pg_sys::ExecutorRun_hook_type = None;
static mut NEXT_CHECK_PERMISSIONS: pg_sys::ExecutorCheckPerms_hook_type = None;

/// Installs the hooks (from `_PG_init`, once per backend that loads the library).
pub fn install() {
    // SAFETY: _PG_init runs once per process, before any query of this library; each hook
    // chains to the one installed before it.
    unsafe {
        NEXT_EXECUTOR_RUN = pg_sys::ExecutorRun_hook;
        pg_sys::ExecutorRun_hook = Some(executor_run);
        NEXT_CHECK_PERMISSIONS = pg_sys::ExecutorCheckPerms_hook;
        pg_sys::ExecutorCheckPerms_hook = Some(check_permissions);
    }
}

/// Runs `f`, whose queries read table `relid`, refusing any of them
/// whose plan reads another relation (see the module's comment). Guards nest: the innermost
/// one applies, and the outer one again once it returns.
pub fn reading<R>(relid: pg_sys::Oid, f: impl FnOnce() -> R) -> R {
    let depth = RUN_DEPTH.with(Cell::get);
    let outer = GUARD.with(|guard| guard.replace(Some(Guard { relid, depth })));
    // Restored on the way out, also when `f` raises (an error unwinds through here).
    struct Restore(Option<Guard>);
    impl Drop for Restore {
        fn drop(&mut self) {
            GUARD.with(|guard| guard.set(self.0));
        }
    }
    let _restore = Restore(outer);
    f()
}

/// Counts the executor's depth around the next hook (or the standard `ExecutorRun`).
/// (18 dropped `execute_once`.)
#[cfg(any(feature = "pg15", feature = "pg17"))]
#[pg_guard]
unsafe extern "C-unwind" fn executor_run(
    query: *mut pg_sys::QueryDesc,
    direction: pg_sys::ScanDirection::Type,
    count: u64,
    execute_once: bool,
) {
    let _depth = Deeper::enter();
    match NEXT_EXECUTOR_RUN {
        Some(next) => next(query, direction, count, execute_once),
        None => pg_sys::standard_ExecutorRun(query, direction, count, execute_once),
    }
}

/// Counts the executor's depth around the next hook (or the standard `ExecutorRun`).
#[cfg(any(feature = "pg18", feature = "pg19"))]
#[pg_guard]
unsafe extern "C-unwind" fn executor_run(
    query: *mut pg_sys::QueryDesc,
    direction: pg_sys::ScanDirection::Type,
    count: u64,
) {
    let _depth = Deeper::enter();
    match NEXT_EXECUTOR_RUN {
        Some(next) => next(query, direction, count),
        None => pg_sys::standard_ExecutorRun(query, direction, count),
    }
}

/// One level of `ExecutorRun`, left also when it raises.
struct Deeper;

impl Deeper {
    fn enter() -> Deeper {
        RUN_DEPTH.with(|depth| depth.set(depth.get() + 1));
        Deeper
    }
}

impl Drop for Deeper {
    fn drop(&mut self) {
        RUN_DEPTH.with(|depth| depth.set(depth.get().saturating_sub(1)));
    }
}

#[cfg(feature = "pg15")]
#[pg_guard]
unsafe extern "C-unwind" fn check_permissions(range_table: *mut pg_sys::List, report: bool) -> bool {
    // 15: the relations to check are the range table's entries with permissions to check
    // (inheritance children, which need none, carry no requiredPerms).
    let relations = list_of::<pg_sys::RangeTblEntry>(range_table)
        .into_iter()
        .filter(|rte| (**rte).rtekind == pg_sys::RTEKind::RTE_RELATION && (**rte).requiredPerms != 0)
        .map(|rte| (*rte).relid);
    require_guarded(relations);
    match NEXT_CHECK_PERMISSIONS {
        Some(next) => next(range_table, report),
        None => true,
    }
}

#[cfg(any(feature = "pg17", feature = "pg18", feature = "pg19"))]
#[pg_guard]
unsafe extern "C-unwind" fn check_permissions(
    range_table: *mut pg_sys::List,
    permissions: *mut pg_sys::List,
    report: bool,
) -> bool {
    // 16 and later: one RTEPermissionInfo per relation the query names (not per partition).
    let relations = list_of::<pg_sys::RTEPermissionInfo>(permissions).into_iter().map(|info| (*info).relid);
    require_guarded(relations);
    match NEXT_CHECK_PERMISSIONS {
        Some(next) => next(range_table, permissions, report),
        None => true,
    }
}

/// Under a guard, and at its depth: every relation is the guarded one, a system catalog, one of
/// pg_backfill's own tables or this node's shard of the guarded table; raises otherwise.
fn require_guarded(relations: impl Iterator<Item = pg_sys::Oid>) {
    let Some(guard) = GUARD.with(Cell::get) else { return };
    if RUN_DEPTH.with(Cell::get) != guard.depth {
        return;
    }
    for relid in relations {
        if relid == guard.relid || is_catalog_or_own(relid) || is_shard_here_of(relid, guard.relid) {
            continue;
        }
        let (read, checked) = (name_of(relid), name_of(guard.relid));
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("relation {read} is not table {checked}, which pg_backfill checked and locked"),
            format!(
                "A name pg_backfill reads table {checked} by (OID {}) now names relation {read} (OID {}): a table \
                 or schema was renamed, or another took its name, during the backfill or check. pg_backfill reads \
                 only the table it checked.",
                u32::from(guard.relid),
                u32::from(relid)
            ),
            Some("Start the backfill or check again, naming the table as it is called now.".into()),
        );
    }
}

/// A relation's schema-qualified name, or its OID once it has none.
fn name_of(relid: pg_sys::Oid) -> String {
    // SAFETY: catalog-cache lookups by OID; each returns NULL or a palloc'd C string.
    unsafe {
        let name = pg_sys::get_rel_name(relid);
        let schema = pg_sys::get_namespace_name(pg_sys::get_rel_namespace(relid));
        if name.is_null() || schema.is_null() {
            return format!("with OID {}", u32::from(relid));
        }
        let text = |s: *mut std::ffi::c_char| std::ffi::CStr::from_ptr(s).to_string_lossy().into_owned();
        crate::pg::encoding::quote_qualified(&text(schema), &text(name))
    }
}

/// Whether `relid` is this node's placement of a shard of Citus table `table`: Citus plans a
/// query of a Citus local table as a query of its shard.
fn is_shard_here_of(relid: pg_sys::Oid, table: pg_sys::Oid) -> bool {
    crate::pg::citus::shard_of(relid)
        .is_some_and(|shard| crate::pg::encoding::quote_qualified(&shard.schema, &shard.name) == name_of(table))
}

/// A relation of `pg_catalog`, or of pg_backfill's own schema.
fn is_catalog_or_own(relid: pg_sys::Oid) -> bool {
    // SAFETY: catalog-cache lookups by OID and by name; missing_ok.
    unsafe {
        let namespace = pg_sys::get_rel_namespace(relid);
        namespace == pg_sys::Oid::from(pg_sys::PG_CATALOG_NAMESPACE)
            || (namespace != pg_sys::InvalidOid && namespace == pg_sys::get_namespace_oid(c"backfill".as_ptr(), true))
    }
}
