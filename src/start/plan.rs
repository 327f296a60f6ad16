//! A backfill of tables read on this server: its tables checked, each as its reads deliver it
//! (its column list, its publication's columns and row filter, the filter given), estimated and
//! spread over the backfill's workers, all before anything is written; then admitted
//! (worker/admit.rs), which records it and launches its workers.

use crate::catalog::job::NewJob;
use crate::catalog::job_table::{self, GivenKey, NewRange, NewTable};
use crate::model::request::StartRequest;
use crate::model::state::LockMode;
use crate::model::table::{self, Table};
use crate::pg::encoding::Text;
use crate::pg::errors::raise;
use crate::pg::errors::OrInternal;
use crate::pg::privilege::{self, as_extension_owner};
use crate::pg::settings;
use crate::selection::columns;
use crate::selection::publication::{self, Published};
use crate::start::estimate::{self, Estimate};
use crate::start::keys;
use crate::throttle::pipeline;
use crate::worker::admit::{admit, Admission};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;

/// A backfill of tables read on this server, `relids` (a Citus reference table's placement here
/// stands for it).
pub fn start_local(request: &StartRequest, relids: &[pg_sys::Oid]) -> i64 {
    let plan = LocalPlan::of(request, relids);
    let prefix = settings::message_prefix();
    let started_by = crate::pg::privilege::current_role_name();
    let mut job = NewJob::of_request(request, &started_by, &prefix);
    job.lock_mode = if request.keys.is_some() { LockMode::Table } else { plan.lock_mode };
    job.slot_identity = request.slot.as_deref().and_then(pipeline::slot_identity);
    let tables = plan.tables.iter().map(|t| (t.table.relid, t.table.qualified_name())).collect();
    let unconfirmed = Box::new(|| plan.unconfirmed(request));
    let admission = Admission { job, tables, confirm: request.confirm, unconfirmed };
    admit(admission, |backfill_id| as_extension_owner(|| plan.record(backfill_id)))
}

/// A local backfill's tables, each checked and as its reads deliver it, before anything is
/// written.
struct LocalPlan {
    tables: Vec<PlannedTable>,
    lock_mode: LockMode,
}

struct PlannedTable {
    /// Projected onto its column list, if it has one.
    table: Table,
    publication_filter: Option<String>,
    estimate: Estimate,
    ranges: Vec<NewRange>,
    keys: Option<Vec<GivenKey>>,
}

impl LocalPlan {
    fn of(request: &StartRequest, relids: &[pg_sys::Oid]) -> LocalPlan {
        let lock_mode = crate::throttle::lock::lock_mode();
        let tables: Vec<Table> = relids.iter().map(|relid| table::require(*relid)).collect();
        refuse_partitions_of_listed_tables(relids);
        if let Some(partitioned) = tables.iter().find(|t| t.partitioned && lock_mode == LockMode::Table) {
            raise(
                ERRCODE_FEATURE_NOT_SUPPORTED,
                format!("table {} cannot be backfilled with lock_mode table", partitioned.qualified_name()),
                "It is partitioned: a writer that names a partition does not lock the partitioned table, so \
                 locking it would not keep writers out. Its pages lock their rows.",
                Some("SET backfill.lock_mode = 'auto'; (or 'rows') and start it again.".into()),
            );
        }
        if let Some(slot) = &request.slot {
            privilege::require_replication(slot);
            pipeline::require_slot(slot);
        }
        // What the publication publishes of each table, read once (an error if it holds one not).
        let published: Vec<Option<Published>> = tables
            .iter()
            .map(|table| request.publication.as_deref().map(|publication| publication::published(publication, table)))
            .collect();
        let mut tables: Vec<PlannedTable> = tables
            .into_iter()
            .zip(published)
            .map(|(table, published)| PlannedTable::of(request, table, published.as_ref()))
            .collect();
        spread_over_workers(&mut tables, request.options.parallel);
        let plan = LocalPlan { tables, lock_mode };
        if let Some(keys) = &request.keys {
            return plan.with_keys(keys.clone(), request.filter.is_some());
        }
        plan
    }

    /// A keyed backfill: its one table's keys, checked and sorted, stand for its one range.
    fn with_keys(mut self, keys: serde_json::Value, filtered: bool) -> LocalPlan {
        keys::require_one_range(self.tables.iter().map(|t| t.ranges.len()).sum());
        let planned = &mut self.tables[0];
        let keys = keys::checked_keys(&planned.table, keys, filtered);
        planned.ranges[0].rows_estimated = keys.len() as i64;
        planned.keys = Some(keys);
        self
    }

    /// Without confirm => true: what the backfill would deliver, and the command to start it.
    fn unconfirmed(&self, request: &StartRequest) -> (String, String) {
        let rows: i64 = self.tables.iter().map(|t| t.estimate.rows).sum();
        let bytes: i64 = self.tables.iter().map(|t| t.estimate.bytes).sum();
        let detail = format!(
            "The backfill would deliver about {rows} rows ({}) from {} table(s) in about {} pages.",
            pretty_bytes(bytes),
            self.tables.len(),
            estimate::pages(rows, request.options.batch_size),
        );
        (detail, format!("Review the estimate, then run: {}", request.confirmed_call()))
    }

    /// Writes the backfill's tables, their ranges and keys.
    fn record(&self, backfill_id: i64) {
        let mut position = 0;
        for planned in &self.tables {
            let key_names = planned.table.key_names();
            let record = NewTable {
                relid: planned.table.relid,
                key_columns: &key_names,
                column_list: planned.table.column_list.as_deref().map(|list| (list, &planned.table.column_attnums[..])),
                publication_filter: planned.publication_filter.as_deref(),
            };
            for range in &planned.ranges {
                position += 1;
                job_table::insert_job_table(backfill_id, position, &record, range.clone());
                if let Some(keys) = &planned.keys {
                    keys::store(backfill_id, position, keys, planned.table.key.len());
                }
            }
        }
    }
}

impl PlannedTable {
    /// `table` as its reads deliver it: the columns of its list (an error if the list is not
    /// valid for it), and the rows its publication publishes (`published`: its row filter,
    /// recorded) AND the filter given, estimated (which checks the filter: an invalid one is an
    /// error here, never a failed worker).
    fn of(request: &StartRequest, table: Table, published: Option<&Published>) -> PlannedTable {
        let publication = request.publication.as_deref().zip(published);
        let list = columns::column_list(&table, request.columns.as_deref(), publication);
        let table = columns::project(table, list, None);
        let publication_filter = published.and_then(|published| published.row_filter.clone());
        let filter = estimate::backfill_filter(&table, request.filter.as_deref(), publication_filter.as_deref());
        let estimate = estimate::estimate(&table, settings::message_prefix().len(), filter.as_deref());
        let ranges = vec![estimate::whole_table(estimate.rows)];
        PlannedTable { table, publication_filter, estimate, ranges, keys: None }
    }
}

/// Which worker scans which range (estimate::splits): the large tables split among all of them,
/// the others whole, each to the worker with the fewest rows so far, largest first.
fn spread_over_workers(tables: &mut [PlannedTable], parallel: i32) {
    let total_rows: i64 = tables.iter().map(|t| t.estimate.rows).sum();
    // (rows, tables) per worker: of equal rows (empty tables), the one with fewer tables.
    let mut rows_of_worker = vec![(0_i64, 0_usize); parallel.max(1) as usize];
    let mut whole: Vec<&mut PlannedTable> = Vec::new();
    for planned in tables.iter_mut() {
        if estimate::splits(planned.estimate.rows, total_rows, parallel) {
            planned.ranges = estimate::key_ranges(&planned.table, planned.estimate.rows, parallel);
            for range in &planned.ranges {
                let load = &mut rows_of_worker[range.worker as usize];
                *load = (load.0 + range.rows_estimated, load.1 + 1);
            }
        } else {
            whole.push(planned);
        }
    }
    whole.sort_by_key(|planned| std::cmp::Reverse(planned.estimate.rows));
    for planned in whole {
        let least_busy = (0..rows_of_worker.len()).min_by_key(|worker| rows_of_worker[*worker]).unwrap_or(0);
        planned.ranges[0].worker = least_busy as i32;
        let load = &mut rows_of_worker[least_busy];
        *load = (load.0 + planned.estimate.rows, load.1 + 1);
    }
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

fn pretty_bytes(bytes: i64) -> String {
    crate::pg::spi::select_one::<String>("SELECT pg_catalog.pg_size_pretty($1::bigint)", &[bytes.into()])
        .ok()
        .flatten()
        .unwrap_or_else(|| format!("{bytes} bytes"))
}
