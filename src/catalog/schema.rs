//! The installed schema: which of pg_backfill's tables and columns this database has.
//!
//! Between the library's replacement by a newer one and `ALTER EXTENSION pg_backfill UPDATE`,
//! the new code runs against an older schema (pg_test/test_upgrade.py, from every version
//! 0.1.0 on). What that schema has is read here, from the catalog caches, into [`Capabilities`];
//! every other file asks it, and none probes the catalog for pg_backfill's own objects or names
//! a version (scripts/check_structure.py refuses both). What older code left behind in a
//! running server is here too: 0.2.0's pause reason while it waited, 0.2.0's worker arguments.

use pgrx::pg_sys;
use std::cell::Cell;

/// What the installed schema has, each named for what the code asks, with the version that
/// added it. A field is false until `ALTER EXTENSION pg_backfill UPDATE` reaches that version.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Table (0.10.0 on a view) `backfill.message_key` (0.2.0): messages are signed. Without
    /// it they go unsigned, as 0.1.0 wrote them.
    pub message_key: bool,
    /// `backfill.job.lock_mode` (0.3.0). Without it a backfill locks as `auto` does.
    pub job_lock_mode: bool,
    /// `backfill.job_table.pages_table_locked` and `pages_row_locked` (0.3.0): the count of
    /// pages by lock path.
    pub lock_path_counts: bool,
    /// `backfill.job.max_replica_lag_bytes`, `max_retained_wal_bytes`, `max_active_sessions`
    /// (0.4.0). Without them a backfill follows the settings.
    pub source_limits: bool,
    /// Table `backfill.job_key` (0.5.0): keyed backfills.
    pub job_key: bool,
    /// `backfill.job.slot_identity` (0.7.0). Without it a backfill knows its slot by name only.
    pub slot_identity: bool,
    /// `backfill.job.rows_per_message` (0.7.0). Without it a backfill sends a `read` per row.
    pub rows_per_message: bool,
    /// Table `backfill.job_error` (0.7.0): the errors that failed a backfill.
    pub job_error: bool,
    /// Table `backfill.job_shard` (0.7.0): backfills of a Citus distributed table.
    pub job_shard: bool,
    /// `backfill.job.row_filter` (0.8.0).
    pub row_filter: bool,
    /// `backfill.job_table.column_list` and `column_attnums` (0.9.0).
    pub column_list: bool,
    /// `backfill.job_table.publication_filter` (0.10.0).
    pub publication_filter: bool,
    /// Tables `backfill.follow` and `backfill.follow_table` (0.10.0): follows of a publication.
    pub follows: bool,
}

impl Capabilities {
    /// From the installed relations' columns, each `relation.column`.
    #[cfg(any(test, feature = "pg_test"))]
    fn of(columns: &[String]) -> Self {
        Self::from_schema(
            |relation, column| columns.iter().any(|c| *c == format!("{relation}.{column}")),
            |relation| columns.iter().any(|c| c.split_once('.').is_some_and(|(r, _)| r == relation)),
        )
    }

    /// From the catalog as PostgreSQL's own lookups see it now: the relations of schema
    /// `backfill` (tables, views) and their columns.
    fn installed() -> Self {
        // SAFETY: catalog cache lookups, in a transaction (capabilities() is only called in one);
        // each name is a NUL-terminated string that outlives the call.
        let relation = |name: &str| unsafe {
            let schema = pg_sys::get_namespace_oid(c"backfill".as_ptr(), true);
            let name = std::ffi::CString::new(name).ok()?;
            let oid = pg_sys::get_relname_relid(name.as_ptr(), schema);
            let kind = pg_sys::get_rel_relkind(oid) as u8;
            (schema != pg_sys::InvalidOid && oid != pg_sys::InvalidOid && matches!(kind, b'r' | b'p' | b'v'))
                .then_some(oid)
        };
        Self::from_schema(
            |table, column| {
                relation(table).is_some_and(|oid| {
                    let column = std::ffi::CString::new(column).unwrap_or_default();
                    // SAFETY: as above; InvalidAttrNumber (0) for a missing or dropped column.
                    unsafe { pg_sys::get_attnum(oid, column.as_ptr()) > 0 }
                })
            },
            |table| relation(table).is_some(),
        )
    }

    fn from_schema(has: impl Fn(&str, &str) -> bool, exists: impl Fn(&str) -> bool) -> Self {
        Capabilities {
            message_key: exists("message_key"),
            job_lock_mode: has("job", "lock_mode"),
            lock_path_counts: has("job_table", "pages_table_locked") && has("job_table", "pages_row_locked"),
            source_limits: has("job", "max_replica_lag_bytes")
                && has("job", "max_retained_wal_bytes")
                && has("job", "max_active_sessions"),
            job_key: exists("job_key"),
            slot_identity: has("job", "slot_identity"),
            rows_per_message: has("job", "rows_per_message"),
            job_error: exists("job_error"),
            job_shard: exists("job_shard"),
            row_filter: has("job", "row_filter"),
            column_list: has("job_table", "column_list") && has("job_table", "column_attnums"),
            publication_filter: has("job_table", "publication_filter"),
            follows: exists("follow") && exists("follow_table"),
        }
    }

    /// A select-list item: `expression` where the schema has it (`present`), else a NULL of its
    /// type, so that one query reads every schema.
    pub fn column_or_null(present: bool, expression: &str, sql_type: &str) -> String {
        if present {
            expression.to_string()
        } else {
            format!("NULL::{sql_type}")
        }
    }
}

thread_local! {
    /// What was read, until an invalidation says the catalog may have changed.
    static READ: Cell<Option<Capabilities>> = const { Cell::new(None) };
    /// Whether the callbacks that forget it are registered (once per process).
    static WATCHING: Cell<bool> = const { Cell::new(false) };
}

/// What this database's schema has. Read from the catalog caches, which see every committed
/// change whose invalidation this process has read (and its own transaction's), and kept until
/// an invalidation of a relation, a column or a relation's name arrives: `ALTER EXTENSION
/// pg_backfill UPDATE` adds tables and columns, in this transaction or another. It was read
/// with a query once per transaction before, which took a sixth of a backfill worker's time on
/// a schema of many small tables. In a transaction.
pub fn capabilities() -> Capabilities {
    watch_catalog();
    if let Some(capabilities) = READ.get() {
        return capabilities;
    }
    let capabilities = Capabilities::installed();
    READ.set(Some(capabilities));
    capabilities
}

/// Registers, once per process, the callbacks that forget what was read when the catalog
/// changes: any relation's invalidation (a column added, dropped or renamed), and any change of
/// pg_class or pg_attribute rows (a table created, which invalidates no relation).
fn watch_catalog() {
    if !WATCHING.replace(true) {
        // SAFETY: registers callbacks that only clear this process's cache; they run inside
        // PostgreSQL's invalidation processing, and neither raise nor allocate.
        unsafe {
            pg_sys::CacheRegisterRelcacheCallback(Some(forget_on_relcache_change), pg_sys::Datum::from(0));
            for cache in [pg_sys::SysCacheIdentifier::RELNAMENSP, pg_sys::SysCacheIdentifier::ATTNAME] {
                pg_sys::CacheRegisterSyscacheCallback(
                    cache as _,
                    Some(forget_on_syscache_change),
                    pg_sys::Datum::from(0),
                );
            }
        }
    }
}

/// Any relation changed (or every one, `relid` invalid): what was read may be out of date.
unsafe extern "C-unwind" fn forget_on_relcache_change(_arg: pg_sys::Datum, _relid: pg_sys::Oid) {
    READ.set(None);
}

/// A relation's name or a column changed (or every one): what was read may be out of date.
unsafe extern "C-unwind" fn forget_on_syscache_change(_arg: pg_sys::Datum, _cache: std::ffi::c_int, _hash: u32) {
    READ.set(None);
}

/// A backfill a 0.2.0 worker (still running the old code after the library was replaced, until
/// it exits) paused "waiting..." while its consumer was away: it is running. SQL over
/// `backfill.job`'s `state` and `pause_reason`.
pub const PAUSED_WHILE_WAITING: &str =
    "(state OPERATOR(pg_catalog.=) 'paused' AND pause_reason OPERATOR(pg_catalog.~~) 'waiting%')";

/// Whether pg_backfill is installed in this database: its own table `backfill.job`, not one a
/// database owner made under that name (the resumer runs as the bootstrap superuser, in every
/// database).
pub fn installed() -> bool {
    crate::pg::spi::select_one::<bool>(
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_depend d
                          JOIN pg_catalog.pg_extension e ON e.oid OPERATOR(pg_catalog.=) d.refobjid
                         WHERE e.extname OPERATOR(pg_catalog.=) 'pg_backfill'
                           AND d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                           AND d.objid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('backfill.job')
                           AND d.deptype OPERATOR(pg_catalog.=) 'e')",
        &[],
    )
    .ok()
    .flatten()
    .unwrap_or(false)
}

/// The relation `backfill.message_key` (a view, a table before 0.10.0), if there is one.
pub fn message_key_relation() -> Option<pg_sys::Oid> {
    // SAFETY: catalog cache lookups, in a transaction (as every caller is); the names are
    // NUL-terminated constants. (A cache lookup, not a query: a worker asks every page.)
    let oid = unsafe {
        let schema = pg_sys::get_namespace_oid(c"backfill".as_ptr(), true);
        if schema == pg_sys::InvalidOid {
            return None;
        }
        pg_sys::get_relname_relid(c"message_key".as_ptr(), schema)
    };
    (oid != pg_sys::InvalidOid).then_some(oid)
}

/// Waits for an `ALTER EXTENSION pg_backfill UPDATE` in progress (its scripts lock backfill.job
/// first) before the transaction takes its snapshot: a snapshot taken before the update commits
/// would see the update's new tables and columns in the catalog, but not the rows it wrote.
///
/// # Safety
/// In a transaction.
pub unsafe fn wait_for_extension_update() {
    let schema = pg_sys::get_namespace_oid(c"backfill".as_ptr(), true);
    if schema == pg_sys::InvalidOid {
        return;
    }
    let job = pg_sys::get_relname_relid(c"job".as_ptr(), schema);
    if job != pg_sys::InvalidOid {
        // Held to the transaction's end, as the page's own read of the table would hold it.
        pg_sys::LockRelationOid(job, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
    }
}

/// The start arguments of a worker registered by 0.2.0 and restarted by the postmaster after
/// its library was replaced: "<database> <starter xid> <worker>" in `bgw_extra`, and the
/// backfill id as its main argument (0 for the resumer). None if `extra` is not of that form.
pub fn older_worker_arguments(extra: &str, main_arg: i64) -> Option<OldWorkerArguments> {
    let mut fields = extra.split(' ').map(str::parse::<u64>);
    let (database, starter_xid, worker) = (fields.next()?.ok()?, fields.next()?.ok()?, fields.next()?.ok()?);
    Some(OldWorkerArguments {
        database: database as u32,
        backfill_id: (main_arg != 0).then_some(main_arg),
        starter_xid,
        worker: worker as i32,
    })
}

/// What a worker registered by older code was started for.
pub struct OldWorkerArguments {
    pub database: u32,
    /// None: the resumer.
    pub backfill_id: Option<i64>,
    pub starter_xid: u64,
    pub worker: i32,
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::*;
    use pgrx::prelude::*;

    #[pg_test]
    fn a_schema_has_what_its_relations_have() {
        let capabilities = capabilities();
        assert!(capabilities.message_key && capabilities.job_shard && capabilities.publication_filter);
        let old = Capabilities::of(&["job.id".to_string(), "job_table.position".to_string()]);
        assert_eq!(old, Capabilities::default());
    }

    #[pg_test]
    fn a_relation_changed_in_the_transaction_is_read_again() {
        assert!(capabilities().publication_filter);
        Spi::run("ALTER TABLE backfill.job_table RENAME COLUMN publication_filter TO renamed").unwrap();
        let renamed = capabilities().publication_filter;
        Spi::run("ALTER TABLE backfill.job_table RENAME COLUMN renamed TO publication_filter").unwrap();
        assert!(!renamed);
        assert!(capabilities().publication_filter);
    }

    #[pg_test]
    fn a_0_2_0_workers_arguments_are_read() {
        let task = older_worker_arguments("16384 750 1", 7).unwrap();
        assert_eq!((task.database, task.backfill_id, task.starter_xid, task.worker), (16384, Some(7), 750, 1));
        assert_eq!(older_worker_arguments("16384 0 0", 0).unwrap().backfill_id, None);
        assert!(older_worker_arguments(r#"{"Resume":{"db":1}}"#, 0).is_none());
    }
}
