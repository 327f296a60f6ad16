//! backfill_estimate(): what a backfill of each table would deliver, or why it cannot run. Each
//! version's entry point builds the request; one function answers it.

use crate::api::request::table_list;
use crate::model::table;
use crate::pg::args::{check_batch_size, required};
use crate::pg::encoding::Text;
use crate::pg::settings;
use crate::selection::columns;
use crate::start::estimate as plan;
use pgrx::prelude::*;

// Texts, not Strings: names and reasons go back to the database in its own encoding.
type EstimateRow = (pg_sys::Oid, bool, Option<Text>, Option<Vec<Text>>, Option<i64>, Option<i64>, Option<i64>);

/// backfill_estimate() since 0.9.0: every option (a row filter and a column list).
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
    TableIterator::new(estimate_rows(&estimate_request(tables, batch_size, filter, columns)))
}

/// backfill_estimate()'s request, checked.
pub struct EstimateRequest {
    tables: Vec<pg_sys::Oid>,
    batch_size: i32,
    filter: Option<String>,
    columns: Option<Vec<String>>,
}

pub fn estimate_request(
    tables: Option<Vec<Option<pg_sys::Oid>>>,
    batch_size: Option<i32>,
    filter: Option<Text>,
    columns: Option<Vec<Option<Text>>>,
) -> EstimateRequest {
    let batch_size = required(batch_size, "backfill_estimate", "batch_size");
    check_batch_size(batch_size);
    EstimateRequest {
        tables: table_list(tables, None),
        batch_size,
        filter: filter.map(|f| f.0),
        columns: columns::given(columns),
    }
}

/// One row per table listed: its estimate, or why it cannot be backfilled.
pub fn estimate_rows(request: &EstimateRequest) -> Vec<EstimateRow> {
    // As backfill_start() would refuse: no table is eligible (a reason, not an error, so that a
    // dry run does not abort the script around it).
    if let Some(why) = crate::start::options::logical_decoding_missing() {
        let fix = crate::start::options::logical_decoding_fix();
        let reason = format!("logical decoding is not enabled on this server: {why} {fix}");
        return request
            .tables
            .iter()
            .map(|relid| (*relid, false, Some(Text(reason.clone())), None, None, None, None))
            .collect();
    }
    let prefix_len = settings::message_prefix().len();
    crate::pg::citus::with_shards_visible(|| {
        request
            .tables
            .iter()
            .zip(crate::citus::coordinator::local_tables(request.tables.clone()))
            .map(|(listed, relid)| {
                let only = Only { filter: request.filter.as_deref(), columns: request.columns.as_deref() };
                estimate_table(*listed, relid, request.batch_size, prefix_len, only)
            })
            .collect()
    })
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
