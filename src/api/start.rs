//! The SQL functions. Their public signatures (regclass arguments, named defaults) are
//! declared in `sql/api.sql`, which calls these entry points in schema `backfill`.

use crate::api::plan::{self, Estimate};
use crate::catalog::job;
use crate::catalog::job_table;
use crate::citus::coordinator as distributed;
use crate::model::state::LockMode;
use crate::model::table::{self, Table};
use crate::pg::args::{check_batch_size, check_rate, check_rows_per_message, require_primary, required};
use crate::pg::encoding::Text;
use crate::pg::errors::raise;
use crate::pg::errors::OrInternal;
use crate::pg::privilege::{self, as_extension_owner};
use crate::pg::settings;
use crate::stream::columns;
use crate::throttle::pipeline;
use crate::worker::launcher;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;

const MAX_PARALLEL: i32 = 16;

// Texts, not Strings: names and reasons go back to the database in its own encoding.
type EstimateRow = (pg_sys::Oid, bool, Option<Text>, Option<Vec<Text>>, Option<i64>, Option<i64>, Option<i64>);

/// backfill_estimate(): what a backfill of each table would deliver, or why it cannot run.
// The row type must be spelled out here for pgrx to name the result columns.
#[allow(clippy::type_complexity)]
#[pg_extern(schema = "backfill", name = "estimate")]
fn estimate(
    tables: Option<Vec<Option<pg_sys::Oid>>>,
    batch_size: Option<i32>,
) -> TableIterator<
    'static,
    (
        name!(table_name, pg_sys::Oid),
        name!(eligible, bool),
        name!(reason, Option<Text>),
        name!(key_columns, Option<Vec<Text>>),
        name!(rows_estimated, Option<i64>),
        name!(bytes_estimated, Option<i64>),
        name!(pages, Option<i64>),
    ),
> {
    estimate_filtered(tables, batch_size, None)
}

/// backfill_estimate() with a row filter (0.8.0): a function of its own, so that the SQL of an
/// earlier version, which calls backfill.estimate() with two arguments, keeps working with this
/// library until ALTER EXTENSION UPDATE.
#[allow(clippy::type_complexity)]
#[pg_extern(schema = "backfill", name = "estimate")]
fn estimate_filtered(
    tables: Option<Vec<Option<pg_sys::Oid>>>,
    batch_size: Option<i32>,
    filter: Option<Text>,
) -> TableIterator<
    'static,
    (
        name!(table_name, pg_sys::Oid),
        name!(eligible, bool),
        name!(reason, Option<Text>),
        name!(key_columns, Option<Vec<Text>>),
        name!(rows_estimated, Option<i64>),
        name!(bytes_estimated, Option<i64>),
        name!(pages, Option<i64>),
    ),
> {
    estimate_of_columns(tables, batch_size, filter, None)
}

/// backfill_estimate() with a row filter and a column list (0.9.0; see [`estimate_filtered`]).
#[allow(clippy::type_complexity)]
#[pg_extern(schema = "backfill", name = "estimate")]
fn estimate_of_columns(
    tables: Option<Vec<Option<pg_sys::Oid>>>,
    batch_size: Option<i32>,
    filter: Option<Text>,
    columns: Option<Vec<Option<Text>>>,
) -> TableIterator<
    'static,
    (
        name!(table_name, pg_sys::Oid),
        name!(eligible, bool),
        name!(reason, Option<Text>),
        name!(key_columns, Option<Vec<Text>>),
        name!(rows_estimated, Option<i64>),
        name!(bytes_estimated, Option<i64>),
        name!(pages, Option<i64>),
    ),
> {
    let batch_size = required(batch_size, "backfill_estimate", "batch_size");
    check_batch_size(batch_size);
    let prefix_len = settings::message_prefix().len();
    let listed = table_list(tables);
    let filter = filter.map(|f| f.0);
    let columns = columns::given(columns);
    let rows: Vec<EstimateRow> = crate::pg::citus::with_shards_visible(|| {
        listed
            .iter()
            .zip(distributed::local_tables(listed.clone()))
            .map(|(listed, relid)| {
                let only = Only { filter: filter.as_deref(), columns: columns.as_deref() };
                estimate_table(*listed, relid, batch_size, prefix_len, only)
            })
            .collect()
    });
    TableIterator::new(rows)
}

/// What of a table a backfill delivers: the rows its filter passes, the columns of its list.
#[derive(Clone, Copy)]
struct Only<'a> {
    filter: Option<&'a str>,
    columns: Option<&'a [String]>,
}

impl Only<'_> {
    /// The options given, as the SQL functions name them.
    fn given(&self) -> Vec<&'static str> {
        [("filter", self.filter.is_some()), ("columns", self.columns.is_some())]
            .into_iter()
            .filter_map(|(option, given)| given.then_some(option))
            .collect()
    }
}

/// The estimate of table `listed`, read from `relid` (itself, or a Citus reference table's
/// placement on this node) or, for a distributed table, from its nodes; with a row filter, of
/// the rows it passes (an invalid filter is an error); with a column list, of those columns
/// (a column that is not the table's, or a list without the key, is an error).
fn estimate_table(
    listed: pg_sys::Oid,
    relid: pg_sys::Oid,
    batch_size: i32,
    prefix_len: usize,
    only: Only,
) -> EstimateRow {
    if let Some((why, _, _)) = crate::citus::rules::refusal("backfill_estimate", listed, &only.given()) {
        return (listed, false, Some(Text(why)), None, None, None, None);
    }
    if let Some(distributed) = crate::citus::estimate::estimate(listed, batch_size) {
        return match distributed {
            Ok(e) => (
                listed,
                true,
                None,
                Some(crate::pg::encoding::texts(&e.key)),
                Some(e.rows),
                Some(e.bytes),
                Some(e.pages),
            ),
            Err(why) => (listed, false, Some(Text(why)), None, None, None, None),
        };
    }
    match table::inspect(relid) {
        Ok(table) => {
            let list = columns::column_list(&table, only.columns, None);
            let table = columns::project(table, list, None);
            let estimate = plan::estimate(&table, prefix_len, only.filter);
            let pages = plan::pages(estimate.rows, batch_size);
            let key = crate::pg::encoding::texts(&table.key_names());
            (listed, true, None, Some(key), Some(estimate.rows), Some(estimate.bytes), Some(pages))
        }
        Err(why) => (listed, false, Some(Text(why.reason)), None, None, None, None),
    }
}

/// backfill_start(): validates every table (all or nothing), records the backfill and
/// launches its worker. Without confirm it only reports what it would deliver.
#[pg_extern(schema = "backfill", name = "start")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn start(
    tables: Option<Vec<Option<pg_sys::Oid>>>,
    confirm: Option<bool>,
    batch_size: Option<i32>,
    rows_per_second: Option<i32>,
    slot: Option<Text>,
    publication: Option<Text>,
    max_lag: Option<i64>,
    parallel: Option<i32>,
) -> i64 {
    start_filtered(tables, confirm, batch_size, rows_per_second, slot, publication, max_lag, parallel, None)
}

/// backfill_start() with a row filter (0.8.0): a function of its own, so that the SQL of an
/// earlier version, which calls backfill.start() with eight arguments, keeps working with this
/// library until ALTER EXTENSION UPDATE.
#[pg_extern(schema = "backfill", name = "start")]
#[allow(clippy::too_many_arguments)]
fn start_filtered(
    tables: Option<Vec<Option<pg_sys::Oid>>>,
    confirm: Option<bool>,
    batch_size: Option<i32>,
    rows_per_second: Option<i32>,
    slot: Option<Text>,
    publication: Option<Text>,
    max_lag: Option<i64>,
    parallel: Option<i32>,
    filter: Option<Text>,
) -> i64 {
    start_of_columns(tables, confirm, batch_size, rows_per_second, slot, publication, max_lag, parallel, filter, None)
}

/// backfill_start() with a row filter and a column list (0.9.0; see [`start_filtered`]).
#[pg_extern(schema = "backfill", name = "start")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn start_of_columns(
    tables: Option<Vec<Option<pg_sys::Oid>>>,
    confirm: Option<bool>,
    batch_size: Option<i32>,
    rows_per_second: Option<i32>,
    slot: Option<Text>,
    publication: Option<Text>,
    max_lag: Option<i64>,
    parallel: Option<i32>,
    filter: Option<Text>,
    columns: Option<Vec<Option<Text>>>,
) -> i64 {
    let columns = columns::given(columns);
    let only = Only { filter: filter.as_ref().map(|f| f.0.as_str()), columns: columns.as_deref() };
    // On a Citus worker node, the coordinator starts backfills of shards, which Citus hides.
    crate::pg::citus::with_shards_visible(|| {
        start_visible(tables, confirm, batch_size, rows_per_second, slot, publication, max_lag, parallel, only)
    })
}

#[allow(clippy::too_many_arguments)]
fn start_visible(
    tables: Option<Vec<Option<pg_sys::Oid>>>,
    confirm: Option<bool>,
    batch_size: Option<i32>,
    rows_per_second: Option<i32>,
    slot: Option<Text>,
    publication: Option<Text>,
    max_lag: Option<i64>,
    parallel: Option<i32>,
    only: Only,
) -> i64 {
    // Text, not String: names in the database's encoding, converted (see encoding.rs).
    let (slot, publication) = (slot.map(|t| t.0), publication.map(|t| t.0));
    require_primary("start a backfill");
    let confirm = required(confirm, "backfill_start", "confirm");
    let batch_size = required(batch_size, "backfill_start", "batch_size");
    let parallel = required(parallel, "backfill_start", "parallel");
    check_batch_size(batch_size);
    if !(1..=MAX_PARALLEL).contains(&parallel) {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            format!("parallel {parallel} is out of range"),
            format!("parallel is the number of workers and must be between 1 and {MAX_PARALLEL}."),
            Some("Each worker is a background worker: mind max_worker_processes.".into()),
        );
    }
    check_rate(rows_per_second);
    require_logical_decoding();
    let prefix = settings::message_prefix();
    let lock_mode = crate::throttle::lock::lock_mode();
    let relids = table_list(tables);
    let node_options = distributed::NodeOptions {
        batch_size,
        rows_per_second,
        slot: slot.as_deref(),
        publication: publication.as_deref(),
        max_lag,
        parallel,
        keys: None,
    };
    for relid in &relids {
        crate::citus::rules::refuse("backfill_start", *relid, &only.given());
    }
    if let Some(backfill_id) = distributed::start_if_distributed(&relids, confirm, &node_options) {
        return backfill_id;
    }
    let relids = distributed::local_tables(relids);
    let tables: Vec<Table> = relids.iter().map(|relid| table::require(*relid)).collect();
    refuse_partitions_of_listed_tables(&relids);
    if let Some(partitioned) = tables.iter().find(|t| t.partitioned && lock_mode == LockMode::Table) {
        raise(
            ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("table {} cannot be backfilled with lock_mode table", partitioned.qualified_name()),
            "It is partitioned: a writer that names a partition does not lock the partitioned table, so \
             locking it would not keep writers out. Its pages lock their rows.",
            Some("SET backfill.lock_mode = 'auto'; (or 'rows') and start it again.".into()),
        );
    }
    if let Some(slot) = &slot {
        privilege::require_replication(slot);
        pipeline::require_slot(slot);
    } else if max_lag.is_some() {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            "max_lag needs a slot",
            "max_lag limits how far the slot's consumer may lag; no slot was given.",
            Some("Name the consumer's slot: slot => 'my_slot'.".into()),
        );
    }
    if let Some(lag) = max_lag.filter(|lag| *lag <= 0) {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            format!("max_lag {lag} is out of range"),
            "max_lag is in bytes and must be positive.",
            Some("Pass NULL (the default) for backfill.max_slot_lag.".into()),
        );
    }
    if let Some(publication) = &publication {
        for table in &tables {
            pipeline::require_published(publication, table);
        }
    }
    // Each table as its reads deliver it: the columns of its list (an error if the list is not
    // valid for it).
    let tables: Vec<Table> = tables
        .into_iter()
        .map(|table| {
            let list = columns::column_list(&table, only.columns, publication.as_deref());
            columns::project(table, list, None)
        })
        .collect();
    // And its rows: those its publication publishes (its row filter, recorded per table: an
    // error if a backfill of the table cannot apply it), AND the filter given.
    let published_filters: Vec<Option<String>> = tables
        .iter()
        .map(|table| publication.as_deref().and_then(|publication| pipeline::published(publication, table).row_filter))
        .collect();
    let filters: Vec<Option<String>> = tables
        .iter()
        .zip(&published_filters)
        .map(|(table, published)| plan::backfill_filter(table, only.filter, published.as_deref()))
        .collect();

    // Two starts of the same table must not both pass the check below: serialize them.
    Spi::run("SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('pg_backfill.start'))")
        .or_internal("serialize backfill starts");
    if let Some(running) = slot.as_deref().and_then(|slot| as_extension_owner(|| job::running_backfill_of_slot(slot))) {
        raise(
            ERRCODE_OBJECT_IN_USE,
            format!("slot {} already has a running backfill", slot.as_deref().unwrap_or_default()),
            format!("Backfill {running} is delivering through it; a slot takes one backfill at a time."),
            Some(format!("Wait for it to finish, or cancel it: SELECT backfill_cancel({running});")),
        );
    }
    for table in &tables {
        if let Some(running) = as_extension_owner(|| job::running_backfill_of(table.relid)) {
            raise(
                ERRCODE_OBJECT_IN_USE,
                format!("table {} already has a running backfill", table.qualified_name()),
                format!("Backfill {running} is scanning it."),
                Some(format!("Wait for it to finish, or cancel it: SELECT backfill_cancel({running});")),
            );
        }
    }

    // (With a filter, this checks it on every table: an invalid one is an error here, never a
    // failed worker.)
    let estimates: Vec<Estimate> =
        tables.iter().zip(&filters).map(|(t, filter)| plan::estimate(t, prefix.len(), filter.as_deref())).collect();
    if !confirm {
        let rows: i64 = estimates.iter().map(|e| e.rows).sum();
        let bytes: i64 = estimates.iter().map(|e| e.bytes).sum();
        let first = table::relation_name(relids[0]);
        let example = if relids.len() == 1 { spi::quote_literal(&first) } else { "ARRAY[...]".into() };
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            "backfill not started: confirm => true is required",
            format!(
                "The backfill would deliver about {rows} rows ({}) from {} table(s) in about {} pages.",
                pretty_bytes(bytes),
                tables.len(),
                plan::pages(rows, batch_size),
            ),
            Some(format!("Review the estimate, then run: SELECT backfill_start({example}, confirm => true);")),
        );
    }

    launcher::require_worker_slots(parallel);
    let started_by = crate::pg::privilege::current_role_name();
    let backfill_id = as_extension_owner(|| {
        let backfill_id = job::insert_job(&job::NewJob {
            started_by: &started_by,
            batch_size,
            rows_per_second,
            message_prefix: &prefix,
            slot_name: slot.as_deref(),
            publication_name: publication.as_deref(),
            max_lag_bytes: max_lag,
            parallel,
        });
        if lock_mode != LockMode::Auto {
            job::set_lock_mode(backfill_id, lock_mode);
        }
        // The setting's default; backfill_start(rows_per_message => ...) overrides it next.
        let rows_per_message = settings::rows_per_message();
        if rows_per_message != 1 {
            job::set_rows_per_message(backfill_id, rows_per_message);
        }
        if let Some(slot) = &slot {
            job::set_slot_identity(backfill_id, pipeline::slot_identity(slot));
        }
        if let Some(filter) = only.filter {
            job::set_row_filter(backfill_id, filter);
        }
        let mut position = 0;
        for ((table, estimate), published_filter) in tables.iter().zip(&estimates).zip(&published_filters) {
            for range in plan::key_ranges(table, estimate.rows, parallel) {
                position += 1;
                job_table::insert_job_table(backfill_id, position, table.relid, table.key_names(), range);
            }
            if let Some(list) = &table.column_list {
                job_table::set_column_list(backfill_id, table.relid, list, &table.column_attnums);
            }
            if let Some(filter) = published_filter {
                job_table::set_publication_filter(backfill_id, table.relid, filter);
            }
        }
        backfill_id
    });

    for worker in 0..parallel {
        launcher::launch_in_this_transaction(backfill_id, worker);
    }
    backfill_id
}

/// backfill.set_rows_per_message(): makes the backfill `id`, started in this transaction, send
/// its rows `rows_per_message` at a time (NULL: backfill.rows_per_message, as it started).
/// Returns the id, so that backfill_start()'s SQL wrapper chains it.
///
/// Only at the start: a backfill keeps one format from its first row to its last, so that a
/// consumer never sees its reads change shape mid-table (backfill_set() does not change it).
#[pg_extern(schema = "backfill", name = "set_rows_per_message")]
fn set_rows_per_message(id: Option<i64>, rows_per_message: Option<i32>) -> Option<i64> {
    let Some(rows_per_message) = rows_per_message else { return id };
    check_rows_per_message(rows_per_message);
    let id = required(id, "backfill_start", "id");
    if !started_in_this_transaction(id) {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("rows_per_message cannot be changed for backfill {id}"),
            "A backfill's messages keep the format it started with; rows_per_message is given when it starts.",
            Some("Cancel it and start it again with SELECT backfill_start(..., rows_per_message => ...);".into()),
        );
    }
    as_extension_owner(|| job::set_rows_per_message(id, rows_per_message));
    Some(id)
}

/// Whether backfill `id` was recorded by this transaction (its worker starts at commit).
pub(crate) fn started_in_this_transaction(id: i64) -> bool {
    let xmin = as_extension_owner(|| job::recorded_by(id));
    // SAFETY: asks whether an xid is this transaction's (or a subtransaction's); no side effect.
    xmin.is_some_and(|xmin| unsafe {
        pg_sys::TransactionIdIsCurrentTransactionId(pg_sys::TransactionId::from(xmin as u32))
    })
}

/// The tables named, each once; NULLs and an empty list are errors.
fn table_list(tables: Option<Vec<Option<pg_sys::Oid>>>) -> Vec<pg_sys::Oid> {
    let tables = tables.unwrap_or_default();
    if tables.is_empty() {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            "no table to backfill",
            "The list of tables is NULL or empty.",
            Some(
                "Name at least one table, for example SELECT backfill_start('public.orders', confirm => true);".into(),
            ),
        );
    }
    let mut relids = Vec::with_capacity(tables.len());
    for relid in tables {
        let Some(relid) = relid else {
            raise(
                ERRCODE_NULL_VALUE_NOT_ALLOWED,
                "the list of tables contains NULL",
                "Every element must name a table.",
                None,
            );
        };
        if relids.contains(&relid) {
            let name = table::relation_name(relid);
            raise(
                ERRCODE_INVALID_PARAMETER_VALUE,
                format!("table {name} is listed twice"),
                "A backfill scans each table once.",
                Some(format!("Remove the second {name} from the list.")),
            );
        }
        relids.push(relid);
    }
    relids
}

/// A partitioned table's backfill reads its partitions: listing one of them as well would
/// deliver its rows twice.
fn refuse_partitions_of_listed_tables(relids: &[pg_sys::Oid]) {
    let nested = Spi::connect(|client| {
        let rows = client.select(
            "SELECT p.relid::pg_catalog.regclass::pg_catalog.text, a.relid::pg_catalog.regclass::pg_catalog.text
               FROM pg_catalog.unnest($1::pg_catalog.oid[]) p(relid)
               JOIN pg_catalog.unnest($1::pg_catalog.oid[]) a(relid) ON a.relid OPERATOR(pg_catalog.<>) p.relid
              WHERE a.relid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT pg_catalog.pg_partition_ancestors(p.relid)))
              LIMIT 1",
            None,
            &[relids.to_vec().into()],
        )?;
        if rows.is_empty() {
            return Ok::<_, pgrx::spi::Error>(None);
        }
        let row = rows.first();
        Ok(row.get::<Text>(1)?.map(|t| t.0).zip(row.get::<Text>(2)?.map(|t| t.0)))
    })
    .or_internal("read the partition tree");
    if let Some((partition, parent)) = nested {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            format!("table {partition} is listed with its partitioned table {parent}"),
            format!("A backfill of {parent} reads {partition} too: its rows would be delivered twice."),
            Some(format!("Remove {partition} from the list.")),
        );
    }
}

/// Read messages are only ever decoded when the server writes logical WAL.
fn require_logical_decoding() {
    let wal_level = crate::pg::spi::select_one::<String>("SELECT pg_catalog.current_setting('wal_level')", &[])
        .ok()
        .flatten()
        .unwrap_or_default();
    if wal_level != "logical" {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "logical decoding is not enabled on this server",
            format!("wal_level is \"{wal_level}\": the backfill's messages would never reach a decoder."),
            Some("Set wal_level = logical in postgresql.conf and restart the server.".into()),
        );
    }
}

fn pretty_bytes(bytes: i64) -> String {
    crate::pg::spi::select_one::<String>("SELECT pg_catalog.pg_size_pretty($1::bigint)", &[bytes.into()])
        .ok()
        .flatten()
        .unwrap_or_else(|| format!("{bytes} bytes"))
}
