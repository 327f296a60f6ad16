//! Planning a backfill: what it would deliver (the estimate), how a table splits into key ranges
//! for parallel workers, and how many pages it takes.

use crate::catalog::job_table;
use crate::model::table::Table;
use crate::pg::encoding::{KeyText, Text};
use crate::pg::errors::raise;
use crate::pg::privilege;
use crate::stream::message::ReadMessage;
use crate::stream::scan::ScanQueries;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;

/// What a backfill of a table would deliver.
#[derive(Debug, Clone, Copy, Default)]
pub struct Estimate {
    pub rows: i64,
    pub bytes: i64,
}

/// Rows sampled to estimate the average message size.
const SAMPLE_ROWS: f64 = 2000.0;

/// Estimates rows from the planner (catalog statistics, or the relation size for a table never
/// analyzed) and the average message size from a block sample: never a full scan.
/// With a row filter, the rows are the planner's for the filtered scan (checking the filter:
/// [`check_filter`]); the message size stays the average of every row's.
pub fn estimate(table: &Table, prefix_len: usize, filter: Option<&str>) -> Estimate {
    let filtered_rows = filter.map(|filter| check_filter(table, filter));
    // The sample renders rows with row_to_json, which runs the casts to json of user-defined
    // types: as the table's owner, whoever asks.
    privilege::read_as(table.owner, table.relid, || sample(table, prefix_len, filtered_rows))
}

/// Checks a row filter on `table` (selection/filter.rs) as the calling role, who will have started
/// the backfill whose worker runs it, with the worker's search_path and restrictions; returns
/// the planner's rows for the filtered scan.
#[track_caller]
pub fn check_filter(table: &Table, filter: &str) -> f64 {
    if table.partitioned {
        raise(
            ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("table {} cannot be backfilled with a filter", table.qualified_name()),
            "It is partitioned: a filtered page finds its rows again by their row ids, which are unique \
             only within one partition.",
            Some("Backfill its partitions, each with the filter.".into()),
        );
    }
    crate::selection::filter::require_bounded(filter, &table.qualified_name());
    let query = ScanQueries::new(table).filter_check(filter);
    // SAFETY: the current user's id.
    let caller = unsafe { pg_sys::GetUserId() };
    let name = table.qualified_name();
    privilege::read_as(caller, table.relid, || crate::selection::filter::check(&query, &name))
}

/// The planner's rows of the whole table, whatever a backfill's filter: what a sample of it is
/// sized by. (Sized by a selective filter's few rows, a sample took every block: 949 MB and
/// 16 s to split a 2M-row table for two workers.)
fn table_rows(table: &Table) -> f64 {
    let relation = table.qualified_name();
    crate::pg::spi::planned_rows(&format!("SELECT * FROM {relation}"))
        .unwrap_or_else(|| {
            raise(
                ERRCODE_INTERNAL_ERROR,
                "could not estimate the table's rows",
                relation,
                Some(crate::pg::errors::BUG_HINT.into()),
            )
        })
        .max(0.0)
}

/// The percentage of a table of `rows` rows that a block sample of about `wanted` rows reads.
fn sample_percent(wanted: f64, rows: f64) -> f64 {
    (100.0 * wanted / rows.max(1.0)).clamp(0.0001, 100.0)
}

/// The filter a backfill of `table` runs (selection/row_filter.rs): `given` (`filter => ...`) AND
/// its publication's row filter `published`. The given filter is checked alone first, as the
/// caller's (see [`crate::selection::row_filter::combined`]); the result is checked by
/// [`estimate`].
#[track_caller]
pub fn backfill_filter(table: &Table, given: Option<&str>, published: Option<&str>) -> Option<String> {
    if let (Some(given), Some(_)) = (given, published) {
        check_filter(table, given);
    }
    crate::selection::row_filter::combined(published, given)
}

fn sample(table: &Table, prefix_len: usize, filtered_rows: Option<f64>) -> Estimate {
    let relation = table.qualified_name();
    let all_rows = table_rows(table);
    let rows = filtered_rows.unwrap_or(all_rows).max(0.0);
    // The average message is every row's (see [`estimate`]): sampled from the whole table.
    let percent = sample_percent(SAMPLE_ROWS, all_rows);
    // Each value's JSON is measured on its own: a row's whole JSON (row_to_json) can pass 1 GB
    // and fail, when each of its values is far smaller. A value stored in more than 512 kB is
    // not rendered at all, since one compressed 255 to 1 can hold more than 128 MB, whose JSON
    // (up to six bytes a character) could pass 1 GB: a text stands for its length (read
    // without decompressing it), anything else for four times its stored size.
    let values: Vec<String> = table
        .columns
        .iter()
        .map(|c| {
            let column = format!("t.{}", crate::pg::encoding::quote_ident(&c.name));
            let large = if [pg_sys::TEXTOID, pg_sys::VARCHAROID, pg_sys::BPCHAROID].contains(&c.type_oid) {
                format!("pg_catalog.octet_length({column})::bigint OPERATOR(pg_catalog.+) 2")
            } else {
                format!("4 OPERATOR(pg_catalog.*) pg_catalog.pg_column_size({column})::bigint")
            };
            format!(
                "coalesce(CASE WHEN pg_catalog.pg_column_size({column}) OPERATOR(pg_catalog.>) 524288 THEN {large}
                               ELSE pg_catalog.octet_length(pg_catalog.to_json({column})::pg_catalog.text) END, 4)"
            )
        })
        .collect();
    let values = if values.is_empty() { "0".to_string() } else { values.join(" OPERATOR(pg_catalog.+) ") };
    let sample_sql = |from: String| {
        format!(
            "SELECT pg_catalog.avg({values} OPERATOR(pg_catalog.+) pg_catalog.octet_length(pg_catalog.concat({key})))::pg_catalog.float8,
                    pg_catalog.count(*)
               FROM {from}",
            key = crate::stream::scan::key_json_values(table)
        )
    };
    let sampled = |from: String| {
        let (avg, count) = Spi::connect(|client| {
            let row = client.select(&sample_sql(from), Some(1), &[])?;
            let row = row.first();
            Ok::<_, pgrx::spi::Error>((row.get::<f64>(1)?, row.get::<i64>(2)?.unwrap_or(0)))
        })
        .ok()?;
        pgrx::debug1!("pg_backfill: {relation}: the average message size sampled from {count} rows");
        avg
    };
    // A small or sparse table can yield an empty block sample; its first rows are as good.
    let avg_row_json = sampled(format!("{relation} t TABLESAMPLE pg_catalog.system ({percent})"))
        .or_else(|| sampled(format!("(SELECT * FROM {relation} LIMIT {SAMPLE_ROWS}) t")))
        .unwrap_or(0.0);
    // The row's braces, labels and commas around its values, and the envelope of a backfill's
    // first ids (a few more digits later do not matter here).
    let punctuation = 2 + table.columns.iter().map(|c| crate::stream::json::label(&c.name).len() + 1).sum::<usize>();
    let punctuation = punctuation - usize::from(!table.columns.is_empty());
    let envelope = ReadMessage::new(1, None, table, 1).envelope_len() + prefix_len + punctuation;
    let rows = rows.round() as i64;
    Estimate { rows, bytes: (rows as f64 * (avg_row_json + envelope as f64)).round() as i64 }
}

/// A table's key ranges, one per worker, split at quantiles of the key so that skewed keys
/// still split into ranges of about equal rows: of the key's histogram (pg_stats) for a
/// one-column key, of a block sample of whole key tuples for a composite key. A table with
/// neither (a one-column key without statistics, too few sampled keys) is scanned whole.
pub fn key_ranges(table: &Table, rows: i64, parallel: i32) -> Vec<job_table::NewRange> {
    let whole = || vec![whole_table(rows)];
    if parallel == 1 {
        return whole();
    }
    // The keys are cast to and from the key's types (a domain's check, a type's output
    // function are user code): as the owner.
    let quantiles = privilege::read_as(table.owner, table.relid, || {
        if table.key.len() == 1 {
            histogram_bounds(table)
        } else {
            sampled_keys(table)
        }
    });
    if quantiles.len() < parallel as usize * 2 {
        let why = if table.key.len() == 1 {
            "has no usable key statistics (ANALYZE it)"
        } else {
            "has too few rows to split"
        };
        notice!("table {} {why}: one worker scans it", table.qualified_name());
        return whole();
    }
    let splits: Vec<Vec<KeyText>> =
        (1..parallel as usize).map(|i| quantiles[i * (quantiles.len() - 1) / parallel as usize].clone()).collect();
    (0..parallel as usize)
        .map(|part| job_table::NewRange {
            part: part as i32,
            worker: part as i32,
            lower_bound: part.checked_sub(1).map(|p| splits[p].clone()),
            upper_bound: splits.get(part).cloned(),
            rows_estimated: rows / i64::from(parallel),
        })
        .collect()
}

/// A table scanned whole, by one worker (the first, until the plan spreads its tables).
pub fn whole_table(rows: i64) -> job_table::NewRange {
    job_table::NewRange { part: 0, worker: 0, lower_bound: None, upper_bound: None, rows_estimated: rows }
}

/// Whether a table of a backfill of several is split among its workers, rather than scanned
/// whole by one: when it holds more than a 1/(2 x parallel) share of the backfill's rows. The
/// tables scanned whole then go, largest first, to the worker with the fewest rows so far,
/// which keeps every worker within half a worker's share of the others: a backfill of hundreds
/// of small tables keeps its workers busy across tables, without paying each table's start and
/// end once per worker.
pub fn splits(rows: i64, total_rows: i64, parallel: i32) -> bool {
    parallel > 1 && rows.saturating_mul(2 * i64::from(parallel)) > total_rows
}

/// The one-column key's histogram bounds, in key order, each a key.
fn histogram_bounds(table: &Table) -> Vec<Vec<KeyText>> {
    crate::pg::spi::select_one::<Vec<KeyText>>(
        &ScanQueries::new(table).histogram(),
        &[Text(table.schema.clone()).into(), Text(table.name.clone()).into(), Text(table.key[0].name.clone()).into()],
    )
    .ok()
    .flatten()
    .unwrap_or_default()
    .into_iter()
    .map(|bound| vec![bound])
    .collect()
}

/// Keys sampled for a composite key's quantiles: enough for ranges within a few percent of
/// equal, read from a block sample, never the whole table.
const SAMPLE_KEYS: f64 = 10_000.0;

/// Whole key tuples of a block sample of about SAMPLE_KEYS rows of the table (whatever the
/// backfill's filter: [`table_rows`]), in key order. (pg_stats has no histogram of a composite
/// key: its columns' histograms are independent, and their quantiles are not the key's.)
fn sampled_keys(table: &Table) -> Vec<Vec<KeyText>> {
    let percent = sample_percent(SAMPLE_KEYS, table_rows(table));
    let queries = ScanQueries::new(table);
    let key_len = queries.key_len();
    let keys: Vec<Vec<KeyText>> = Spi::connect(|client| {
        client
            .select(&queries.key_sample(percent), None, &[])?
            .map(|row| (1..=key_len).map(|i| row.get::<KeyText>(i)).collect::<Result<Option<Vec<_>>, _>>())
            .collect::<Result<Option<Vec<_>>, _>>()
    })
    .ok()
    .flatten()
    .unwrap_or_default();
    pgrx::debug1!("pg_backfill: {}: split at quantiles of {} sampled keys", table.qualified_name(), keys.len());
    keys
}

/// Pages (transactions) a backfill of `rows` rows takes.
pub fn pages(rows: i64, batch_size: i32) -> i64 {
    (rows + i64::from(batch_size) - 1) / i64::from(batch_size)
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use super::*;

    #[pg_test]
    fn skewed_keys_split_into_ranges_of_about_equal_rows() {
        // Half the rows below 1,000, the other half spread up to 10,000,000.
        Spi::run(
            "CREATE TABLE skew (id bigint PRIMARY KEY);
             INSERT INTO skew SELECT g FROM generate_series(1, 5000) g;
             INSERT INTO skew SELECT 10000 + 2000 * g FROM generate_series(1, 5000) g;
             ANALYZE skew;",
        )
        .unwrap();
        let relid = Spi::get_one::<pg_sys::Oid>("SELECT 'skew'::regclass::oid").unwrap().unwrap();
        let ranges = key_ranges(&crate::model::table::inspect(relid).unwrap(), 10_000, 4);
        assert_eq!(ranges.len(), 4);
        assert!(ranges[0].lower_bound.is_none() && ranges[3].upper_bound.is_none());
        for pair in ranges.windows(2) {
            assert_eq!(pair[0].upper_bound, pair[1].lower_bound);
        }
        let count = |lower: &Option<Vec<KeyText>>, upper: &Option<Vec<KeyText>>| {
            Spi::get_one_with_args::<i64>(
                "SELECT count(*) FROM skew WHERE ($1::bigint IS NULL OR id > $1::bigint) AND ($2::bigint IS NULL OR id <= $2::bigint)",
                &[lower.as_ref().map(|l| l[0].clone()).into(), upper.as_ref().map(|u| u[0].clone()).into()],
            )
            .unwrap()
            .unwrap()
        };
        for range in &ranges {
            let rows = count(&range.lower_bound, &range.upper_bound);
            assert!((2000..=3000).contains(&rows), "a range of {rows} rows");
        }
    }
}
