//! pg_backfill: delivers the rows a table already holds through the logical decoding stream,
//! in key order, as transactional "read" messages, exactly once.
//!
//! Where to look:
//! - `api.rs`: the SQL functions that estimate and start backfills; `control.rs`: those that
//!   pause, resume, change, wait for and cancel them; `args.rs`: checks of their arguments.
//! - `table.rs`: a table as a backfill sees it: columns, key, owner; whether it can be backfilled.
//! - `plan.rs`: the estimate, the key ranges of parallel workers, the page count.
//! - `scan.rs`: the key-ordered page queries (keyset pagination, row locks).
//! - `delivery.rs`: the hot path: each row of a locked page becomes a message as it is read.
//! - `launcher.rs`: registering workers (and the cap on them); the preloaded launcher and resumer.
//! - `worker.rs`: the background worker's process: its tables in order, retries, failures.
//! - `page.rs`: one page is one transaction; the cursor is advanced there; the ordering argument.
//! - `pacing.rs`, `progress.rs`: rows_per_second; progress samples and log lines.
//! - `xact.rs`: the worker's transactions and the errors they raise.
//! - `pipeline.rs`: the consumer's slot and publication; pausing for it and back-pressure.
//! - `catalog.rs`: the state tables the worker and the API share.
//! - `json.rs`: a row's JSON, rendered from its columns as row_to_json renders it.
//! - `message.rs`: the JSON messages consumers receive.
//! - `settings.rs`: the `backfill.*` GUCs.
//! - `privilege.rs`: who runs what: the caller's checks, the table owner's queries, the state.
//! - `auth.rs`: the messages' authentication tags.
//! - `status.rs`: helpers of the monitoring views.
//! - `keys.rs`: backfills of given keys (repairs), and the `absent` message of a missing key.
//! - `checksum.rs`, `aggregate.rs`, `row_hash.rs`, `row_encoding.rs` (what a row's hash is
//!   computed over), `parallel_scan.rs`: backfill_checksum(); `key_json.rs`: keys as JSON objects
//!   (bounds, keys given, keys reported);
//!   `compare.rs`: backfill_compare() and backfill_repair(); `side.rs`: the tables they read,
//!   here or through dblink.
//! - `sql.rs`: reads through SPI that leave the transaction read-only (views, standbys).
//! - `errors.rs`: how user errors are raised (SQLSTATE, detail, hint).
//! - `pg_compat.rs`: where PostgreSQL's C API differs between 15 and 18, one shim per
//!   difference.

use pgrx::prelude::*;

mod aggregate;
mod api;
mod args;
mod auth;
mod backpressure;
mod catalog;
mod checksum;
mod compare;
mod control;
mod delivery;
mod encoding;
mod errors;
mod json;
mod key_json;
mod keys;
mod launcher;
mod lock;
mod message;
mod pacing;
mod page;
mod parallel_scan;
mod pg_compat;
mod pipeline;
mod plan;
mod privilege;
mod progress;
mod ranges;
mod row_encoding;
mod row_hash;
mod scan;
mod settings;
mod side;
mod sql;
mod state;
mod status;
mod stored_form;
mod table;
mod worker;
mod xact;

::pgrx::pg_module_magic!(name, version);

extension_sql_file!("../sql/catalog.sql", name = "catalog", bootstrap);
extension_sql_file!("../sql/api.sql", name = "api", finalize);

/// Schema of the internal state and entry points (created by `sql/catalog.sql`).
#[pg_schema]
mod backfill {}

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    settings::define();
    // Preloaded, the library also resumes running backfills after every server start.
    // SAFETY: a flag PostgreSQL sets while it loads shared_preload_libraries.
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        status::PRELOADED.store(true, std::sync::atomic::Ordering::Relaxed);
        launcher::register_launcher();
    }
}

#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec!["wal_level = 'logical'", "max_worker_processes = 16"]
    }
}
