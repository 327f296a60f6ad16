//! The `backfill.*` settings. Each is an ordinary GUC with a unit and a documented default,
//! read through an accessor that returns what the code needs (a `Duration`, bytes, a count),
//! so that no call site converts units.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::prelude::*;
use pgrx::{pg_sys, PostgresGucEnum};
use std::ffi::{CStr, CString};
use std::time::Duration;

/// Prefix of every logical decoding message; recorded per backfill when it starts.
static MESSAGE_PREFIX: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c"backfill"));

/// How long a one-row page waits for a row lock held by a writer before it gives up and retries.
static LOCK_TIMEOUT_MS: GucSetting<i32> = GucSetting::<i32>::new(200);

/// backfill.lock_mode's values: an enum setting, so that PostgreSQL refuses any other when it is
/// set (the catalog's LockMode, model/state.rs, is what a backfill records).
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum LockModeSetting {
    #[name = c"auto"]
    Auto,
    #[name = c"rows"]
    Rows,
    #[name = c"table"]
    Table,
}

/// backfill.lock_mode: how a new backfill's pages lock (see lock.rs); recorded per backfill.
static LOCK_MODE: GucSetting<LockModeSetting> = GucSetting::<LockModeSetting>::new(LockModeSetting::Auto);

/// backfill.table_lock_max_ms: how long a page holding its table in SHARE mode may hold up writers.
static TABLE_LOCK_MAX_MS: GucSetting<i32> = GucSetting::<i32>::new(50);

/// How many times in a row a page may fail for a transient reason before the backfill fails.
static MAX_RETRIES: GucSetting<i32> = GucSetting::<i32>::new(100);

/// Back-pressure: a backfill for a slot waits while the slot lags more than this (kB).
static MAX_SLOT_LAG_KB: GucSetting<i32> = GucSetting::<i32>::new(1024 * 1024);

/// Back-pressure from standbys: pages wait while a physical standby replays more than this
/// behind (kB; 0 = off).
static MAX_REPLICA_LAG_KB: GucSetting<i32> = GucSetting::<i32>::new(0);

/// Back-pressure from slots: pages wait while a slot retains more WAL than this (MB; 0 = off;
/// -1 = half of max_slot_wal_keep_size where that is set).
static MAX_RETAINED_WAL_MB: GucSetting<i32> = GucSetting::<i32>::new(-1);

/// Back-pressure from load: pages slow down while more client sessions than this are active
/// (0 = off).
static MAX_ACTIVE_SESSIONS: GucSetting<i32> = GucSetting::<i32>::new(0);

/// How often a running backfill logs a progress line (seconds; 0 turns it off).
static LOG_INTERVAL_S: GucSetting<i32> = GucSetting::<i32>::new(60);

/// The load limit a backfill started with no pacing option records (active sessions; 0: none,
/// and it runs on the duty cycle of backfill.default_duty_cycle instead).
static DEFAULT_MAX_ACTIVE_SESSIONS: GucSetting<i32> = GucSetting::<i32>::new(0);

/// The share of its time (percent) a worker of a backfill with no pacing of its own spends on
/// pages while the server is busy; 100: no rest.
static DEFAULT_DUTY_CYCLE: GucSetting<i32> = GucSetting::<i32>::new(15);

/// How often backfill_wait() reports the progress of what it waits for (seconds; 0: never).
static WAIT_REPORT_INTERVAL_S: GucSetting<i32> = GucSetting::<i32>::new(10);

/// The largest message a backfill writes, in bytes.
static MAX_MESSAGE_SIZE: GucSetting<i32> = GucSetting::<i32>::new(64 * 1024 * 1024);

/// backfill.rows_per_message: rows per message of a new backfill (1: one `read` per row).
static ROWS_PER_MESSAGE: GucSetting<i32> = GucSetting::<i32>::new(1);

/// The most rows a message may carry: as many as a page may hold (a batch never spans pages).
pub const MAX_ROWS_PER_MESSAGE: i32 = 100_000;

/// What backfill.max_message_size can be raised to. PostgreSQL reads a WAL record back only if
/// it fits one allocation (1 GB minus one byte, headers included), and a decoder may need
/// more than the message (wal2json escapes it into a JSON string: up to twice its size).
pub const MAX_MESSAGE_SIZE_CEILING: i32 = 256 * 1024 * 1024;

/// The most keys that backfill_compare() and backfill_repair() keep as differing (and that a
/// keyed backfill takes): each costs the backend's memory (see docs/verification.md's figures).
static COMPARE_MAX_KEYS: GucSetting<i32> = GucSetting::<i32>::new(100_000);

/// The most ranges a checksum (backfill_checksum(), and so a comparison's first pass) splits a
/// table into: each costs the backend's memory.
static CHECKSUM_MAX_RANGES: GucSetting<i32> = GucSetting::<i32>::new(10_000);

/// The most ranges backfill.checksum_max_ranges can be raised to.
pub const CHECKSUM_MAX_RANGES_CEILING: i32 = 1_000_000;

/// Background workers all backfills of the cluster may use at once.
static MAX_WORKERS: GucSetting<i32> = GucSetting::<i32>::new(4);

/// Of backfill.max_workers, how many only superusers' backfills may take, so that no
/// operator's backfills can take every worker (as superuser_reserved_connections does).
static SUPERUSER_RESERVED_WORKERS: GucSetting<i32> = GucSetting::<i32>::new(1);

/// Test-only: read pages without row locks, to show that the ordering tests catch the race.
/// Only in builds with the `test_hooks` feature, which the test suite installs.
#[cfg(feature = "test_hooks")]
static TEST_SKIP_ROW_LOCKS: GucSetting<bool> = GucSetting::<bool>::new(false);

/// The context of the settings a start reads and records for the life of a backfill
/// (backfill.message_prefix, backfill.lock_mode, backfill.rows_per_message,
/// backfill.default_max_active_sessions): superuser. A user-settable one may be set per database
/// by the database's owner (`ALTER DATABASE ... SET`), and every session of that database, a
/// superuser's included, then starts backfills with it: its reads under another prefix, where
/// the consumer does not look, or its pages unpaced on a shared primary. A role the DBA trusts
/// with them is granted `SET ON PARAMETER` (docs/security.md), as for PostgreSQL's own settings.
const RECORDED_BY_A_START: GucContext = GucContext::Suset;

pub fn define() {
    // SAFETY: the check hook is guarded against panics (#[pg_guard]) and only reads its value.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"backfill.message_prefix",
            c"Prefix of the logical decoding messages a new backfill emits.",
            c"Consumers filter messages by prefix. Recorded per backfill when it starts. 1 to 64 printable \
              ASCII characters.",
            &MESSAGE_PREFIX,
            RECORDED_BY_A_START,
            GucFlags::default(),
            Some(check_message_prefix),
            None,
            None,
        );
    }
    GucRegistry::define_int_guc(
        c"backfill.compare_max_keys",
        c"The most differing keys a comparison keeps (in the memory of the backend that runs it).",
        c"A comparison that finds more fails with 54000 instead of filling the backend's memory: \
          a copy that far from its source wants a new backfill, not a list of its differences. \
          Only a superuser may raise it: each key costs memory.",
        &COMPARE_MAX_KEYS,
        1,
        100_000_000,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"backfill.checksum_max_ranges",
        c"The most key ranges a checksum splits a table into (in the memory of the backend that runs it).",
        c"A checksum of more ranges, or of more bounds, fails with 54000. Only a superuser may \
          raise it: each range costs memory.",
        &CHECKSUM_MAX_RANGES,
        1,
        CHECKSUM_MAX_RANGES_CEILING,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"backfill.lock_timeout",
        c"How long a one-row page waits for a row lock held by a writer.",
        c"Pages of several rows never wait for a row lock: they shrink instead. A one-row page \
          waits this long, then backs off and retries, so a backfill never holds up a writer \
          nor closes a deadlock cycle with it.",
        &LOCK_TIMEOUT_MS,
        1,
        60_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_enum_guc(
        c"backfill.lock_mode",
        c"How a new backfill's pages lock what they read: auto, rows or table.",
        c"rows: FOR SHARE of the page's rows (written into every row read). table: the table in \
          SHARE mode for the page (writers wait for it; nothing is written to the rows). auto: \
          the table when no writer is at it, else the rows. Recorded per backfill when it starts.",
        &LOCK_MODE,
        RECORDED_BY_A_START,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"backfill.table_lock_max_ms",
        c"How long a page that holds its table in SHARE mode may hold up writers.",
        c"Table-locked pages are sized to take at most about this long; a writer that arrives \
          meanwhile waits for the rest of the page.",
        &TABLE_LOCK_MAX_MS,
        1,
        10_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"backfill.max_retries",
        c"How many consecutive transient failures of a page a backfill tolerates before it fails.",
        c"Transient failures are lock timeouts, deadlocks, serialization failures and \
          statement timeouts; each retry backs off exponentially up to 5 seconds.",
        &MAX_RETRIES,
        0,
        1_000_000,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"backfill.max_slot_lag",
        c"A backfill for a slot waits while the slot's consumer lags more than this.",
        c"The lag is the WAL the slot's consumer has not confirmed: while it is above this, the \
          backfill pauses instead of making the server retain more WAL. backfill_start(..., \
          max_lag => ...) overrides it per backfill.",
        &MAX_SLOT_LAG_KB,
        1024,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_int_guc(
        c"backfill.max_replica_lag",
        c"Backfills wait while a physical standby replays further behind than this; 0 turns it off.",
        c"The lag is the WAL between this primary's current position and a standby's replay \
          position in pg_stat_replication. backfill_start(..., max_replica_lag => ...) tightens \
          it per backfill.",
        &MAX_REPLICA_LAG_KB,
        0,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_int_guc(
        c"backfill.max_retained_wal",
        c"Backfills wait while a replication slot retains more WAL than this; 0 turns it off.",
        c"Any slot of the cluster counts, whatever its database or plugin: its restart_lsn keeps \
          WAL on disk. -1 (the default) is half of max_slot_wal_keep_size where that is set, \
          and off where it is not. backfill_start(..., max_retained_wal => ...) tightens it.",
        &MAX_RETAINED_WAL_MB,
        -1,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_MB,
    );
    GucRegistry::define_int_guc(
        c"backfill.max_active_sessions",
        c"Backfills slow down while more client sessions than this are active; 0 turns it off.",
        c"Counts client backends running a statement (state active), averaged over about a \
          second. Above the limit a backfill's rate halves, down to a page a second a worker; \
          below it the rate recovers gradually. backfill_start(..., max_active_sessions => ...) \
          tightens it per backfill.",
        &MAX_ACTIVE_SESSIONS,
        0,
        pg_sys::MAX_BACKENDS as i32,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"backfill.log_interval",
        c"How often a running backfill logs a progress line.",
        c"0 turns progress lines off; state changes are always logged.",
        &LOG_INTERVAL_S,
        0,
        86_400,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"backfill.default_max_active_sessions",
        c"The max_active_sessions a backfill started with no pacing option records (neither rows_per_second nor max_active_sessions); 0: none.",
        c"0 (the default) records none: such a backfill runs on the duty cycle of \
          backfill.default_duty_cycle. A positive value makes it slow down as \
          max_active_sessions does: while more client sessions than this are active its rate \
          halves, down to a page a second.",
        &DEFAULT_MAX_ACTIVE_SESSIONS,
        0,
        pg_sys::MAX_BACKENDS as i32,
        RECORDED_BY_A_START,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"backfill.default_duty_cycle",
        c"The share of its time, in percent, a worker of a backfill with no pacing of its own spends on pages while the server is busy.",
        c"A backfill with neither rows_per_second nor max_active_sessions rests after each page, \
          while client sessions are active (more than half a session on average over about a \
          second), for as long as keeps its pages to this share of its time: at 15, 85/15 (about 5.7) times \
          the page's own time, less what the worker waited for a CPU, for a pipeline's backfill \
          with what the slot's walsender ran on a CPU until it had sent the page. Its cost to the application is then bounded however many \
          sessions are active; on an idle server it runs at full speed. 100 turns the rest off. \
          Read by running backfills at their next page.",
        &DEFAULT_DUTY_CYCLE,
        1,
        100,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"backfill.wait_report_interval",
        c"How often backfill_wait() reports the progress of the backfill it waits for, as a NOTICE.",
        c"The NOTICE has the percentage, the rows done and expected, the rate, the time left and \
          what the backfill waits for, if anything. 0 turns it off; so does client_min_messages \
          above notice.",
        &WAIT_REPORT_INTERVAL_S,
        0,
        86_400,
        GucContext::Userset,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"backfill.max_message_size",
        c"The largest message a backfill writes; a row whose message would be larger fails it.",
        c"PostgreSQL 15 writes a logical message of any size but cannot read back a WAL record \
          of 1 GB or more: every slot, and the server's recovery after a crash, would fail on \
          it. The setting cannot exceed 256MB, so that even a decoder that escapes the message \
          stays far from that limit.",
        &MAX_MESSAGE_SIZE,
        1024,
        MAX_MESSAGE_SIZE_CEILING,
        GucContext::Sighup,
        GucFlags::UNIT_BYTE,
    );
    GucRegistry::define_int_guc(
        c"backfill.rows_per_message",
        c"Rows per message of a new backfill started without rows_per_message.",
        c"1 sends one read message per row; more sends each page's rows in reads messages of up \
          to this many rows, each within backfill.max_message_size. Recorded per backfill when it \
          starts.",
        &ROWS_PER_MESSAGE,
        1,
        MAX_ROWS_PER_MESSAGE,
        RECORDED_BY_A_START,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"backfill.max_workers",
        c"How many background workers all backfills of the cluster may use at once.",
        c"Background workers come from max_worker_processes, which parallel query and logical \
          replication share: the default leaves them headroom. A backfill that would exceed \
          it is refused (SQLSTATE 53400).",
        &MAX_WORKERS,
        1,
        pg_sys::MAX_BACKENDS as i32,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"backfill.superuser_reserved_workers",
        c"Of backfill.max_workers, how many only superusers' backfills may take.",
        c"A role that is not a superuser starts a backfill only while its workers leave this many \
          free, so that one operator cannot take every worker from everyone else.",
        &SUPERUSER_RESERVED_WORKERS,
        0,
        pg_sys::MAX_BACKENDS as i32,
        GucContext::Sighup,
        GucFlags::default(),
    );
    #[cfg(feature = "test_hooks")]
    GucRegistry::define_bool_guc(
        c"backfill.test_skip_row_locks",
        c"For tests only: read pages without row locks (breaks the ordering guarantee).",
        c"Exists so that the test suite can show that its ordering test fails without locks.",
        &TEST_SKIP_ROW_LOCKS,
        GucContext::Suset,
        GucFlags::NO_SHOW_ALL,
    );
}

/// Whether pages skip their row locks: only ever in a test build that asks for it.
pub fn skip_row_locks() -> bool {
    #[cfg(feature = "test_hooks")]
    return TEST_SKIP_ROW_LOCKS.get();
    #[cfg(not(feature = "test_hooks"))]
    false
}

/// Longest message prefix: a prefix is written into every message's WAL record.
const MAX_PREFIX_LEN: usize = 64;

/// What is wrong with a message prefix, if anything. Consumers filter by it and it is repeated
/// in every record, so it must be 1 to 64 printable ASCII characters.
fn prefix_problem(prefix: &[u8]) -> Option<String> {
    if prefix.is_empty() {
        Some("it is empty".to_string())
    } else if prefix.len() > MAX_PREFIX_LEN {
        Some(format!("it is {} bytes long", prefix.len()))
    } else {
        prefix
            .iter()
            .position(|b| !(0x20..=0x7e).contains(b))
            .map(|at| format!("byte {} is not printable ASCII", at + 1))
    }
}

/// backfill.message_prefix's check hook: PostgreSQL refuses (22023) a prefix that is not 1 to 64
/// printable ASCII characters when it is set (SET, ALTER SYSTEM, postgresql.conf), not at the
/// next backfill_start().
#[pg_guard]
unsafe extern "C-unwind" fn check_message_prefix(
    newval: *mut *mut std::ffi::c_char,
    _extra: *mut *mut std::ffi::c_void,
    _source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: PostgreSQL passes the new value, a NUL-terminated string or NULL.
    let prefix = unsafe {
        if newval.is_null() || (*newval).is_null() {
            c""
        } else {
            CStr::from_ptr(*newval)
        }
    };
    let Some(problem) = prefix_problem(prefix.to_bytes()) else { return true };
    let detail = format!("The prefix must be 1 to {MAX_PREFIX_LEN} printable ASCII characters; {problem}.");
    let detail = CString::new(detail).unwrap_or_default();
    // SAFETY: the detail and hint are copied into the current memory context, where PostgreSQL
    // reads them when it reports the refusal.
    unsafe {
        pg_sys::GUC_check_errdetail_string = pg_sys::pstrdup(detail.as_ptr());
        pg_sys::GUC_check_errhint_string = pg_sys::pstrdup(
            c"Consumers filter messages by it: for example SET backfill.message_prefix = 'backfill';".as_ptr(),
        );
    }
    false
}

/// The message prefix in force (its check hook admits only a valid one).
pub fn message_prefix() -> String {
    MESSAGE_PREFIX.get().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default()
}

/// The slot lag past which a backfill for a slot waits, in bytes (backfill.max_slot_lag); also
/// for the status view: calling it loads the library, so the view shows the setting in force
/// even in a session that has not used pg_backfill yet.
#[pgrx::pg_extern(schema = "backfill", stable)]
pub fn max_slot_lag_bytes() -> i64 {
    i64::from(MAX_SLOT_LAG_KB.get()) * 1024
}

/// How long a one-row page waits for a row lock held by a writer (backfill.lock_timeout).
pub fn lock_timeout() -> Duration {
    Duration::from_millis(LOCK_TIMEOUT_MS.get().max(0) as u64)
}

/// backfill.lock_mode as set.
pub fn lock_mode() -> LockModeSetting {
    LOCK_MODE.get()
}

/// How long a page holding its table in SHARE mode may hold up writers (backfill.table_lock_max_ms).
pub fn table_lock_max() -> Duration {
    Duration::from_millis(TABLE_LOCK_MAX_MS.get().max(0) as u64)
}

/// Consecutive transient failures of a page before the backfill fails (backfill.max_retries).
pub fn max_retries() -> i32 {
    MAX_RETRIES.get()
}

/// The replay lag of a standby past which pages wait, in bytes; 0: off (backfill.max_replica_lag).
pub fn max_replica_lag_bytes() -> i64 {
    i64::from(MAX_REPLICA_LAG_KB.get()) * 1024
}

/// The WAL a slot may retain before pages wait, in bytes; 0: off; None: half of
/// max_slot_wal_keep_size (backfill.max_retained_wal = -1).
pub fn max_retained_wal_bytes() -> Option<i64> {
    match MAX_RETAINED_WAL_MB.get() {
        -1 => None,
        mb => Some(i64::from(mb) * 1024 * 1024),
    }
}

/// Active client sessions past which pages slow down; 0: off (backfill.max_active_sessions).
pub fn max_active_sessions() -> i64 {
    i64::from(MAX_ACTIVE_SESSIONS.get())
}

/// How often a running backfill logs a progress line; None: never (backfill.log_interval).
pub fn log_interval() -> Option<Duration> {
    let seconds = LOG_INTERVAL_S.get();
    (seconds > 0).then(|| Duration::from_secs(seconds as u64))
}

/// The max_active_sessions of a backfill started with no pacing option; None: unpaced
/// (backfill.default_max_active_sessions).
pub fn default_max_active_sessions() -> Option<i64> {
    let sessions = DEFAULT_MAX_ACTIVE_SESSIONS.get();
    (sessions > 0).then_some(i64::from(sessions))
}

/// The share of its time a worker of a backfill with no pacing of its own spends on pages while
/// the server is busy, as a fraction; None: all of it (backfill.default_duty_cycle = 100).
pub fn default_duty_cycle() -> Option<f64> {
    let percent = DEFAULT_DUTY_CYCLE.get();
    (percent < 100).then(|| f64::from(percent) / 100.0)
}

/// How often backfill_wait() reports progress; None: never (backfill.wait_report_interval).
pub fn wait_report_interval() -> Option<Duration> {
    let seconds = WAIT_REPORT_INTERVAL_S.get();
    (seconds > 0).then(|| Duration::from_secs(seconds as u64))
}

/// The largest message a backfill writes, in bytes (backfill.max_message_size).
pub fn max_message_bytes() -> usize {
    MAX_MESSAGE_SIZE.get().max(0) as usize
}

/// The most message bytes a page should carry: half of logical_decoding_work_mem. A page is one
/// transaction for the decoder, which keeps a transaction in memory up to that setting and
/// spills it to disk past it (pg_stat_replication_slots.spill_bytes); half leaves room for
/// the reorder buffer's own bookkeeping of each message (about 100 bytes each, measured in
/// bench/README.md). (The walsender may run with another value: this is the server's.)
pub fn page_bytes_bound() -> i64 {
    // SAFETY: reads an int GUC of the server, in kilobytes.
    let kilobytes = unsafe { pg_sys::logical_decoding_work_mem };
    i64::from(kilobytes.max(64)) * 1024 / 2
}

/// Rows per message of a new backfill that does not say (backfill.rows_per_message).
pub fn rows_per_message() -> i32 {
    ROWS_PER_MESSAGE.get()
}

/// The most differing keys a comparison keeps, and keys a keyed backfill takes
/// (backfill.compare_max_keys).
pub fn compare_max_keys() -> usize {
    COMPARE_MAX_KEYS.get().max(0) as usize
}

/// The most ranges a checksum splits a table into (backfill.checksum_max_ranges).
pub fn checksum_max_ranges() -> i32 {
    CHECKSUM_MAX_RANGES.get()
}

/// Background workers all backfills of the cluster may use at once (backfill.max_workers).
pub fn max_workers() -> i32 {
    MAX_WORKERS.get()
}

/// Of those, how many only superusers' backfills may take (backfill.superuser_reserved_workers).
pub fn superuser_reserved_workers() -> i32 {
    SUPERUSER_RESERVED_WORKERS.get()
}

/// Runs `f` with `settings` (name, value), and every setting `f` changes undone when it returns.
/// An error inside `f` aborts the (sub)transaction, which restores the settings by itself.
/// The values are pg_backfill's own, or those a follow recorded from its creator's session
/// (which could set them): set with a superuser's context, as the settings a start records are
/// superuser's ([`RECORDED_BY_A_START`]), whoever's session this is.
pub fn with_settings<R>(settings: &[(&std::ffi::CStr, &std::ffi::CStr)], f: impl FnOnce() -> R) -> R {
    // SAFETY: a GUC nest level opened here and closed below, once `f` has returned (nothing
    // opened inside `f` is still open then); the settings are copied by set_config_option.
    let nest_level = unsafe {
        let nest_level = pg_sys::NewGUCNestLevel();
        for (name, value) in settings {
            pg_sys::set_config_option(
                name.as_ptr(),
                value.as_ptr(),
                pg_sys::GucContext::PGC_SUSET,
                pg_sys::GucSource::PGC_S_SESSION,
                pg_sys::GucAction::GUC_ACTION_SAVE,
                true,
                0,
                false,
            );
        }
        nest_level
    };
    let result = f();
    // SAFETY: the nest level opened above.
    unsafe { pg_sys::AtEOXact_GUC(false, nest_level) };
    result
}
