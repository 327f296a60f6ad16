//! pg_backfill: delivers the rows a table already holds through the logical decoding stream,
//! in key order, as transactional "read" messages, exactly once.
//!
//! The layers, lowest first; a folder imports only from folders below it (checked by
//! scripts/check_structure.py):
//!
//! - `pg/`: PostgreSQL plumbing: errors with SQLSTATE, detail and hint (`errors.rs`), the
//!   database's encoding and UTF-8 (`encoding.rs`), reads through SPI (`spi.rs`), the
//!   `backfill.*` settings (`settings.rs`), who runs what (`privilege.rs`), pg_backfill's own
//!   locks, on tags no SQL statement can take (`locks.rs`), checks of SQL
//!   arguments (`args.rs`), node trees and lists (`nodes.rs`), a query's rows handed to Rust as
//!   the executor produces them (`receiver.rs`), a read that reaches only the table it checked
//!   (`read_guard.rs`), where PostgreSQL's C API differs between the majors built for, one shim
//!   per difference (`compat.rs`), whether the catalog a publication is read from may have
//!   changed, from PostgreSQL's invalidations (`catalog_changes.rs`), and what Citus's metadata
//!   says of a table: a shard's distributed table, a table's distribution (`citus.rs`), and the
//!   flush of the process's own last commit (`wal.rs`).
//! - `model/`: a table as a backfill sees it, its key and columns (`table.rs`); the states
//!   and modes of backfills and their ranges (`state.rs`); what a caller asks of a backfill,
//!   one typed request per verb (`request.rs`).
//! - `selection/`: which rows and columns a backfill reads: its filter, checked before anything
//!   starts (`filter.rs`), the publication's row filter AND-ed with it (`row_filter.rs`), its
//!   column list's rules (`columns.rs`), the pipeline's publication, read by OID as pgoutput
//!   reads it: whether it holds a table, its columns and row filter, the tables it holds
//!   (`publication.rs`), and the one rule of how a table is read, by a scan, a checksum
//!   and a comparison alike: `ONLY`, or a partitioned table with its partitions (`scanned.rs`).
//! - `catalog/`: the state tables: one row per backfill and its message keys (`job.rs`), one
//!   per table or key range with its cursor (`job_table.rs`), and for a backfill of a Citus
//!   distributed table each shard's node and node backfill (`job_shard.rs`); the follows of a
//!   publication and their queues of added tables (`follow.rs`); which of these
//!   tables and columns the installed schema has, the one place that asks (`schema.rs`).
//! - `stream/`: what reaches the stream: the key-ordered page queries and how they lock their
//!   rows (`scan.rs`), a row's JSON (`json.rs`), the messages (`message.rs`), their
//!   authentication tags, with the key the worker hands in (`sign.rs`), and the hot path from
//!   executor to message (`delivery.rs`).
//! - `throttle/`: what holds a backfill back: how pages lock (`lock.rs`), rows_per_second
//!   (`pacing.rs`), the consumer's slot (`pipeline.rs`), the source's standbys, slots and load
//!   (`backpressure.rs`), the gentle default's rests on a busy server (`duty.rs`), and the typed
//!   reason a page waits (`wait.rs`).
//! - `verify/`: backfill_checksum() (`checksum.rs`, `aggregate.rs`, `row_hash.rs`,
//!   `row_encoding.rs`: what a row's hash is computed over, `numeric_jsonb.rs`: numeric's and
//!   jsonb's encodings, `parallel_heap_scan.rs`: its parallel scan, `cost.rs`: what a table's
//!   size says of how to sample and count it), keys as JSON (`key_json.rs`), backfill_compare()
//!   (`compare.rs`) and the tables it reads, here, through dblink or a Citus coordinator
//!   (`sides.rs`), and what it asks of a table spread over other servers, with such a table's
//!   checksum put together from their answers (`fan_out.rs`).
//! - `worker/`: the background worker: its process, tables in order, retries, failures
//!   (`process.rs`), how its processes show in pg_stat_activity (`activity.rs`), the one path
//!   by which a backfill is recorded and its workers launched (`admit.rs`), registering workers
//!   by entry and the preloaded launcher (`launcher.rs`), its transactions (`xact.rs`), and
//!   `scan/`: the scan of one table, one page per transaction, where the cursor is advanced
//!   (`mod.rs`: `TableScan` and `page()`), its start and end markers (`markers.rs`), pages of
//!   a key range (`range_page.rs`) and of given keys (`keyed_page.rs`), what holds its pages
//!   back and their size (`throttle.rs`), progress samples and log lines (`progress.rs`); each
//!   running worker's progress in shared memory, for backfill_progress (`shared_progress.rs`).
//! - `citus/`: Citus's coordinator side: talking to the worker nodes, as the calling role
//!   (`nodes.rs`), a distributed table's backfill started on its nodes (`coordinator.rs`), the
//!   options such a table refuses, one table of rules (`rules.rs`), control passed on to the
//!   nodes (`control.rs`), the coordinator's worker, a background worker entry of its own that
//!   follows the nodes' backfills (`follower.rs`), a distributed table's estimate from theirs
//!   (`estimate.rs`), and its checksums and stream positions from its nodes, as verification
//!   asks them (`verify.rs`).
//! - `start/`: starting a backfill, whoever asks: the one fork between a Citus distributed
//!   table's backfill and a local one (`mod.rs`), its options checked (`options.rs`), a local
//!   backfill's plan, its tables checked, estimated and spread over its workers (`plan.rs`),
//!   the estimate and key ranges (`estimate.rs`), and a keyed backfill's keys (`keys.rs`).
//! - `follow/`: backfill_follow(): the tables added to a publication queued at the DDL
//!   (`queue.rs`) and backfilled into its slot one backfill at a time by the dispatcher worker,
//!   as the follow's creator (`dispatch.rs`); creating, ending and waiting for a follow (`mod.rs`).
//! - `api/`: the SQL functions, which only adapt SQL to requests: each version's entry point an
//!   adapter that builds its verb's request (`request.rs`): backfill_start() (`start.rs`),
//!   backfill_estimate() (`estimate.rs`), pause, resume, set, wait and cancel (`control.rs`),
//!   keys given to a Citus node's backfill (`keyed.rs`), the entry points only an earlier
//!   version's SQL calls, in one file (`old_sql.rs`), backfill_repair()
//!   (`repair.rs`), backfill_checksum() and backfill_compare(), which hand Citus's side to
//!   verification (`verify.rs`), the monitoring views' helpers (`views.rs`), and the follows'
//!   verbs and event trigger (`follow.rs`).
//!
use pgrx::prelude::*;

mod api;
mod catalog;
mod citus;
mod follow;
mod model;
mod pg;
mod selection;
mod start;
mod stream;
mod throttle;
mod verify;
mod worker;

::pgrx::pg_module_magic!(name, version);

extension_sql_file!("../sql/catalog.sql", name = "catalog", bootstrap);
extension_sql_file!("../sql/api.sql", name = "api", finalize);

/// Schema of the internal state and entry points (created by `sql/catalog.sql`).
#[pg_schema]
mod backfill {}

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    pg::settings::define();
    pg::read_guard::install();
    // Preloaded, the library also resumes running backfills after every server start.
    // SAFETY: a flag PostgreSQL sets while it loads shared_preload_libraries.
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        api::views::PRELOADED.store(true, std::sync::atomic::Ordering::Relaxed);
        // And keeps each running worker's progress in shared memory, for backfill_progress.
        worker::shared_progress::install();
        worker::launcher::register_launcher();
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
