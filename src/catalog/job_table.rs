//! The state table `backfill.job_table`, one row per table of a backfill (per key range, with
//! parallel workers): every read and write of it. Where a range's scan stands, its state
//! changes, and how the workers that share a table coordinate its markers. And the keys of a
//! keyed backfill, `backfill.job_key` (start/keys.rs).

use crate::catalog::schema;
use crate::model::state::RangeState;
use crate::pg::encoding::{texts, KeyText, Text};
use crate::pg::errors::OrInternal;
use crate::pg::spi::run_prepared;
use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;
use pgrx::spi::SpiResult;

/// One table of a backfill: where its scan stands.
pub struct JobTable {
    pub position: i32,
    pub relid: pg_sys::Oid,
    pub worker: i32,
    pub lower_bound: Option<Vec<KeyText>>,
    pub state: RangeState,
    pub cursor: Option<Vec<KeyText>>,
    pub upper_bound: Option<Vec<KeyText>>,
    pub rows_done: i64,
    pub rows_estimated: i64,
}

/// One key range of a table: the whole table, or with parallel workers the range after
/// `lower_bound` up to `upper_bound` (None for the last: fixed when its scan starts).
pub struct NewTable<'a> {
    pub relid: pg_sys::Oid,
    pub key_columns: &'a [String],
    /// Its column list and the list's attribute numbers (0.9.0 schema on).
    pub column_list: Option<(&'a [String], &'a [i16])>,
    /// Its publication's row filter when it started (selection/row_filter.rs; 0.10.0 schema on).
    pub publication_filter: Option<&'a str>,
}

/// A key range of a new backfill's table.
#[derive(Clone)]
pub struct NewRange {
    pub part: i32,
    /// The worker that scans it (0 to parallel - 1).
    pub worker: i32,
    pub lower_bound: Option<Vec<KeyText>>,
    pub upper_bound: Option<Vec<KeyText>>,
    pub rows_estimated: i64,
}

/// One key range of a table, as the workers that share the table see it.
pub struct Range {
    pub position: i32,
    pub state: RangeState,
    pub rows_done: i64,
}

const JOB_TABLE_COLUMNS: &str =
    "position, relid::pg_catalog.oid, state, cursor, upper_bound, rows_done, rows_estimated, worker, lower_bound";

fn job_tables_where(condition: &str, args: &[DatumWithOid]) -> SpiResult<Vec<JobTable>> {
    let sql = format!("SELECT {JOB_TABLE_COLUMNS} FROM backfill.job_table WHERE {condition} ORDER BY position");
    run_prepared(&sql, false, args, |rows| {
        rows.map(|row| {
            Ok(JobTable {
                position: row.get(1)?.unwrap_or_default(),
                relid: row.get(2)?.unwrap_or(pg_sys::InvalidOid),
                state: RangeState::parse(&row.get::<String>(3)?.unwrap_or_default()),
                cursor: row.get::<Vec<KeyText>>(4)?,
                upper_bound: row.get::<Vec<KeyText>>(5)?,
                rows_done: row.get(6)?.unwrap_or(0),
                rows_estimated: row.get(7)?.unwrap_or(0),
                worker: row.get(8)?.unwrap_or(0),
                lower_bound: row.get::<Vec<KeyText>>(9)?,
            })
        })
        .collect()
    })
}

/// The tables of a backfill, in scan order.
pub fn job_tables(backfill_id: i64) -> Vec<JobTable> {
    job_tables_where("job_id OPERATOR(pg_catalog.=) $1", &[backfill_id.into()])
        .or_internal("read the backfill's tables")
}

pub fn job_table(backfill_id: i64, position: i32) -> Option<JobTable> {
    job_tables_where(
        "job_id OPERATOR(pg_catalog.=) $1 AND position OPERATOR(pg_catalog.=) $2",
        &[backfill_id.into(), position.into()],
    )
    .or_internal("read the backfill's table")
    .pop()
}

/// How many workers of a backfill still have a range to scan: they share its rate.
pub fn workers_scanning(backfill_id: i64) -> i64 {
    let sql = "SELECT pg_catalog.count(DISTINCT worker) FROM backfill.job_table
                WHERE job_id OPERATOR(pg_catalog.=) $1 AND state OPERATOR(pg_catalog.<>) 'done'";
    run_prepared(sql, false, &[backfill_id.into()], |rows| Ok(rows.first().get::<i64>(1)?.unwrap_or(1)))
        .or_internal("count the backfill's workers")
}

/// The one way a range changes state: running, with its upper bound fixed, when its scan
/// starts; done when it ends.
pub fn move_range(backfill_id: i64, position: i32, to: RangeState, upper_bound: Option<Vec<KeyText>>) {
    Spi::run_with_args(
        "UPDATE backfill.job_table
            SET state = $3,
                upper_bound = CASE WHEN $3 OPERATOR(pg_catalog.=) 'running' THEN $4 ELSE upper_bound END,
                started_at = CASE WHEN $3 OPERATOR(pg_catalog.=) 'running' THEN pg_catalog.clock_timestamp()
                                  ELSE started_at END,
                finished_at = CASE WHEN $3 OPERATOR(pg_catalog.=) 'done' THEN pg_catalog.clock_timestamp() END
          WHERE job_id OPERATOR(pg_catalog.=) $1 AND position OPERATOR(pg_catalog.=) $2",
        &[backfill_id.into(), position.into(), to.as_str().into(), upper_bound.into()],
    )
    .or_internal("record the state of a range")
}

/// A page was delivered: the cursor moves to its last key, in the page's own transaction.
/// With `locked`, the count of pages that took that path goes up: `Some(true)` the table,
/// `Some(false)` the rows; None on an older schema, which has no such counts.
pub fn advance_cursor(
    backfill_id: i64,
    position: i32,
    cursor: Vec<KeyText>,
    rows: i64,
    bytes: i64,
    table_locked: Option<bool>,
) {
    let counted = match table_locked {
        Some(true) => ", pages_table_locked = pages_table_locked OPERATOR(pg_catalog.+) 1",
        Some(false) => ", pages_row_locked = pages_row_locked OPERATOR(pg_catalog.+) 1",
        None => "",
    };
    run_prepared(
        &format!(
            "UPDATE backfill.job_table
                SET cursor = $3, rows_done = rows_done OPERATOR(pg_catalog.+) $4,
                    bytes_done = bytes_done OPERATOR(pg_catalog.+) $5,
                    last_page_lsn = pg_catalog.pg_current_wal_insert_lsn(){counted}
              WHERE job_id OPERATOR(pg_catalog.=) $1 AND position OPERATOR(pg_catalog.=) $2"
        ),
        true,
        &[backfill_id.into(), position.into(), cursor.into(), rows.into(), bytes.into()],
        |_| Ok(()),
    )
    .or_internal("advance the cursor")
}

pub fn insert_job_table(backfill_id: i64, position: i32, table: &NewTable, range: NewRange) {
    // The columns of a later version are named only when given (see job::insert_job).
    let mut optional: Vec<(&str, DatumWithOid)> = Vec::new();
    if let Some((list, attnums)) = table.column_list {
        optional.push(("column_list", texts(list).into()));
        optional.push(("column_attnums", attnums.to_vec().into()));
    }
    if let Some(filter) = table.publication_filter {
        optional.push(("publication_filter", Text::from(filter).into()));
    }
    let names: String = optional.iter().map(|(column, _)| format!(", {column}")).collect();
    let values: String = (10..10 + optional.len()).map(|i| format!(", ${i}")).collect();
    let sql = format!(
        "INSERT INTO backfill.job_table (job_id, position, relid, part, worker, key_columns, lower_bound, cursor,
                                         upper_bound, rows_estimated{names})
         VALUES ($1, $2, $3::pg_catalog.oid::pg_catalog.regclass, $4, $9, $5::pg_catalog.name[], $6, $6, $7, $8{values})"
    );
    let mut args: Vec<DatumWithOid> = vec![
        backfill_id.into(),
        position.into(),
        table.relid.into(),
        range.part.into(),
        texts(table.key_columns).into(),
        range.lower_bound.into(),
        range.upper_bound.into(),
        range.rows_estimated.into(),
        range.worker.into(),
    ];
    args.extend(optional.into_iter().map(|(_, value)| value));
    Spi::run_with_args(&sql, &args).or_internal("record the backfill's tables")
}

/// The column list of a backfill's range, with its columns' attribute numbers, if it has one.
/// (An older schema without the columns, until ALTER EXTENSION UPDATE, has no lists.)
pub fn column_list(backfill_id: i64, position: i32) -> Option<(Vec<String>, Vec<i16>)> {
    if !schema::capabilities().column_list {
        return None;
    }
    let list = Spi::connect(|client| {
        let rows = client.select(
            "SELECT column_list, column_attnums FROM backfill.job_table
              WHERE job_id OPERATOR(pg_catalog.=) $1 AND position OPERATOR(pg_catalog.=) $2",
            Some(1),
            &[backfill_id.into(), position.into()],
        )?;
        if rows.is_empty() {
            return Ok(None);
        }
        let row = rows.first();
        Ok::<_, pgrx::spi::Error>(row.get::<Vec<Text>>(1)?.zip(Some(row.get::<Vec<i16>>(2)?.unwrap_or_default())))
    })
    .or_internal("read the backfill's column list");
    list.map(|(names, attnums)| (crate::pg::encoding::strings(names), attnums))
}

/// The row filter of the backfill's publication for a range's table when it started, if it had
/// one. (An older schema without the column, until ALTER EXTENSION UPDATE, recorded none.)
pub fn publication_filter(backfill_id: i64, position: i32) -> Option<String> {
    if !schema::capabilities().publication_filter {
        return None;
    }
    crate::pg::spi::select_one::<Text>(
        "SELECT publication_filter FROM backfill.job_table
          WHERE job_id OPERATOR(pg_catalog.=) $1 AND position OPERATOR(pg_catalog.=) $2",
        &[backfill_id.into(), position.into()],
    )
    .or_internal("read the publication's row filter")
    .map(|t| t.0)
}

/// Every range of the same table in this backfill, locked in position order, so that the
/// ranges' workers decide in turn which of them sends the table's start and end markers. A
/// table scanned whole has one range: itself.
pub fn lock_table_ranges(backfill_id: i64, position: i32) -> Vec<Range> {
    let ranges: SpiResult<Vec<Range>> = Spi::connect_mut(|client| {
        client
            .update(
                "SELECT r.position, r.state, r.rows_done FROM backfill.job_table r
                  WHERE r.job_id OPERATOR(pg_catalog.=) $1
                    AND r.relid OPERATOR(pg_catalog.=) (SELECT relid FROM backfill.job_table
                                                         WHERE job_id OPERATOR(pg_catalog.=) $1
                                                           AND position OPERATOR(pg_catalog.=) $2)
                  ORDER BY r.position FOR UPDATE",
                None,
                &[backfill_id.into(), position.into()],
            )?
            .map(|row| {
                Ok(Range {
                    position: row.get::<i32>(1)?.unwrap_or_default(),
                    state: RangeState::parse(&row.get::<String>(2)?.unwrap_or_default()),
                    rows_done: row.get::<i64>(3)?.unwrap_or(0),
                })
            })
            .collect()
    });
    ranges.or_internal("lock the table's ranges")
}

/// Whether every range of the backfill is done, with the backfill locked: of several workers,
/// the last to finish sees it, and marks the backfill done.
pub fn all_ranges_done(backfill_id: i64) -> bool {
    let done: SpiResult<bool> = Spi::connect_mut(|client| {
        client.update(
            "SELECT 1 FROM backfill.job WHERE id OPERATOR(pg_catalog.=) $1 FOR UPDATE",
            None,
            &[backfill_id.into()],
        )?;
        let pending = client.update(
            "SELECT 1 FROM backfill.job_table
              WHERE job_id OPERATOR(pg_catalog.=) $1 AND state OPERATOR(pg_catalog.<>) 'done' LIMIT 1",
            None,
            &[backfill_id.into()],
        )?;
        Ok(pending.is_empty())
    });
    done.or_internal("read the ranges' states")
}

pub fn set_key_fraction(backfill_id: i64, position: i32, fraction: Option<f64>) {
    Spi::run_with_args(
        "UPDATE backfill.job_table SET key_fraction_done = $3
          WHERE job_id OPERATOR(pg_catalog.=) $1 AND position OPERATOR(pg_catalog.=) $2",
        &[backfill_id.into(), position.into(), fraction.into()],
    )
    .or_internal("record progress")
}

/// One key of a keyed backfill: its values as text (to cast back) and as JSON (for messages).
pub struct GivenKey {
    pub text: Vec<KeyText>,
    pub json: Vec<String>,
}

impl GivenKey {
    /// From a row whose first column is the key's text values and second its JSON values.
    pub fn of_row(row: &pgrx::spi::SpiHeapTupleData) -> SpiResult<GivenKey> {
        Ok(GivenKey {
            text: row.get::<Vec<KeyText>>(1)?.unwrap_or_default(),
            json: crate::pg::encoding::strings(row.get::<Vec<Text>>(2)?.unwrap_or_default()),
        })
    }
}

/// Whether the scan of `position` delivers given keys rather than the whole table. (An older
/// schema without the keys' table, until ALTER EXTENSION UPDATE, has no keyed backfills.)
pub fn is_keyed(backfill_id: i64, position: i32) -> bool {
    schema::capabilities().job_key
        && crate::pg::spi::select_one::<bool>(
            "SELECT EXISTS (SELECT FROM backfill.job_key
                             WHERE job_id OPERATOR(pg_catalog.=) $1 AND position OPERATOR(pg_catalog.=) $2)",
            &[backfill_id.into(), position.into()],
        )
        .or_internal("read the backfill's keys")
        .unwrap_or(false)
}

/// The keys after the first `done`, at most `limit` of them.
pub fn next_keys(backfill_id: i64, position: i32, done: i64, limit: i32) -> Vec<GivenKey> {
    keys_where(
        "ordinal OPERATOR(pg_catalog.>) $3 ORDER BY ordinal LIMIT $4",
        &[backfill_id.into(), position.into(), done.into(), i64::from(limit).into()],
    )
}

/// The greatest key: what the table's start marker announces as its upper bound.
pub fn last_key(backfill_id: i64, position: i32) -> Option<(Vec<KeyText>, Vec<String>)> {
    keys_where("true ORDER BY ordinal DESC LIMIT 1", &[backfill_id.into(), position.into()])
        .pop()
        .map(|k| (k.text, k.json))
}

fn keys_where(condition: &str, args: &[DatumWithOid]) -> Vec<GivenKey> {
    let sql = format!(
        "SELECT key, key_json FROM backfill.job_key
          WHERE job_id OPERATOR(pg_catalog.=) $1 AND position OPERATOR(pg_catalog.=) $2 AND {condition}"
    );
    crate::pg::spi::run_prepared(&sql, false, args, |rows| rows.map(|row| GivenKey::of_row(&row)).collect())
        .or_internal("read the backfill's keys")
}
