//! backfill_checksum(): one row per key range of a table with its row count and a checksum, so
//! that a destination can be checked against its source range by range. The row hash and the
//! scan that sums it are in row_hash.rs.

use crate::pg::encoding::in_utf8;
use crate::pg::encoding::quote_ident;
use crate::pg::errors::{raise, OrInternal};
use crate::verify::key_json::{checked_keys, key_expression, key_from_json, require_ascending};
use pgrx::prelude::*;
use pgrx::JsonB;
use pgrx::PgSqlErrorCode::*;
use std::collections::HashMap;

/// Sampled keys per range, to place the bounds (ANALYZE's histograms are too coarse for
/// thousands of ranges), and at least this many in all.
const SAMPLE_PER_RANGE: f64 = 30.0;
const MIN_SAMPLE: f64 = 10_000.0;

/// How a checksum summarizes a range.
#[derive(Clone, Copy, PartialEq)]
pub enum Level {
    /// The row count only.
    Count,
    /// The row count and per column its NULLs and, by type, an exact sum or the least and
    /// greatest value (see [`aggregates`]).
    Aggregate,
    /// The row count and the sum of the rows' hashes.
    Hash,
}

impl Level {
    pub fn parse(level: &str) -> Level {
        match level {
            "count" => Level::Count,
            "aggregate" => Level::Aggregate,
            "hash" => Level::Hash,
            other => raise(
                ERRCODE_INVALID_PARAMETER_VALUE,
                format!("checksum level \"{other}\" does not exist"),
                "The levels are count (rows per range), aggregate (rows, and per column its NULLs and \
                 its sum or its least and greatest value) and hash (rows and the sum of their hashes).",
                Some("level => 'hash'".into()),
            ),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Level::Count => "count",
            Level::Aggregate => "aggregate",
            Level::Hash => "hash",
        }
    }
}

/// The columns of a table's key (primary key, else replica identity index), in key order:
/// (name, type as SQL writes it).
pub fn key_columns(relid: pg_sys::Oid, table: &str) -> Vec<(String, String)> {
    // The key a backfill reads the table by (model/table.rs): one rule for both.
    let columns = crate::model::table::key_of(relid).unwrap_or_else(|why| {
        raise(why.code, format!("table {table} cannot be checked"), format!("Table {table}: {}.", why.reason), why.hint)
    });
    if columns.is_empty() {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("table {table} has no key to split into ranges"),
            "A checksum splits a table by its primary key, else its replica identity index.",
            Some(format!("ALTER TABLE {table} ADD PRIMARY KEY (...);")),
        );
    }
    // Bounds and keys travel as JSON objects keyed by the key's names, and JSON is read here as
    // UTF-8: in another encoding a name that is not ASCII would not be found again (a comparison
    // then found no difference).
    let not_ascii = columns.iter().find(|(name, _)| !name.is_ascii());
    if let Some((name, _)) = not_ascii.filter(|_| !crate::pg::encoding::database_takes_utf8()) {
        raise(
            ERRCODE_FEATURE_NOT_SUPPORTED,
            format!(
                "table {table} cannot be checked: its key column {} has a name that is not ASCII",
                crate::pg::encoding::quote_ident(name)
            ),
            format!(
                "In a database encoded in {}, checksums and comparisons need a key whose columns' names are ASCII.",
                crate::pg::encoding::database_encoding_name()
            ),
            Some(format!("Rename it: ALTER TABLE {table} RENAME COLUMN ... TO ...;")),
        );
    }
    columns
}

/// backfill_checksum() of a table of this server (api/verify.rs): ranges of the table's key, with
/// the bounds `bounds` (a JSON array of key objects, ascending) or, without them, about `ranges`
/// ranges of equal rows placed from a sample of the keys. The caller must be allowed to read the
/// table; it is read as its owner (privilege::read_as_owner).
pub fn checksum(
    relid: pg_sys::Oid,
    ranges: Option<i32>,
    level: Level,
    bounds: Option<JsonB>,
    columns: Option<Vec<String>>,
) -> Vec<RangeRow> {
    let name = crate::model::table::relation_name(relid);
    require_readable(relid, &name);
    let key = key_columns(relid, &name);
    let columns = hashed_columns(relid, &name, &key, columns);
    // (The aggregate level writes dates and times as text: in one format on every server.)
    crate::pg::privilege::read_as_owner(relid, || {
        let bounds = checksum_bounds(relid, &key, ranges, bounds, |ranges| sampled_bounds(relid, &key, ranges));
        in_utf8(|| summarize(relid, &key, &bounds, level, columns.as_deref()))
    })
}

/// The columns a checksum or a comparison of table `relid` hashes and aggregates, given a
/// column list (`columns => ...`, checked as a backfill's is; NULL: every column): the listed
/// ones and the key's (`key`), in the table's order. A name that is not one of the table's
/// columns is an error (42703).
///
/// The key is always among them, listed or not, as it is among the columns a backfill with
/// that list delivers: without it, two rows of one range whose listed values were swapped
/// between their keys would hash to the same sum, and a copy that mixed rows up would agree.
pub fn hashed_columns(
    relid: pg_sys::Oid,
    name: &str,
    key: &[(String, String)],
    given: Option<Vec<String>>,
) -> Option<Vec<String>> {
    let given = given?;
    let columns = crate::pg::spi::column_names(relid);
    if let Some(missing) = given.iter().find(|c| !columns.contains(c)) {
        raise(
            ERRCODE_UNDEFINED_COLUMN,
            format!("column {} of table {name} does not exist", quote_ident(missing)),
            "columns => names the columns whose values are compared, with the key's, which are compared whatever it \
             names; NULL: every column.",
            Some("List the columns the copy was made with: backfill_start()'s columns => ....".into()),
        );
    }
    let hashed = |c: &String| given.contains(c) || key.iter().any(|(k, _)| k == c);
    Some(columns.into_iter().filter(hashed).collect())
}

/// A row as backfill.row_hash() takes it: `backfill_row`, or the row of its listed columns.
pub fn hashed_row(columns: Option<&[String]>) -> String {
    match columns {
        // (`backfill_row.*`, not `backfill_row`: a column of that name would be taken instead.)
        None => "backfill_row.*".into(),
        Some(columns) => format!("ROW({})", listed_columns(columns)),
    }
}

/// `backfill_row.a, backfill_row.b`: the listed columns of the row.
fn listed_columns(columns: &[String]) -> String {
    columns.iter().map(|c| format!("backfill_row.{}", quote_ident(c))).collect::<Vec<_>>().join(", ")
}

/// The bounds of a checksum's ranges: `bounds` as given, checked (ascending key objects of the
/// table's key, at most backfill.checksum_max_ranges ranges), or `sample(ranges)`.
pub fn checksum_bounds(
    relid: pg_sys::Oid,
    key: &[(String, String)],
    ranges: Option<i32>,
    bounds: Option<JsonB>,
    sample: impl FnOnce(i32) -> Vec<serde_json::Value>,
) -> Vec<serde_json::Value> {
    let most_ranges = crate::pg::settings::checksum_max_ranges();
    match bounds {
        Some(bounds) => {
            let bounds = checked_keys(
                bounds.0,
                key,
                "bounds",
                (
                    most_ranges as usize - 1,
                    &format!(
                        "A checksum splits a table into at most backfill.checksum_max_ranges ({most_ranges}) ranges: \
                         at most {} bounds.",
                        most_ranges - 1
                    ),
                    "Pass fewer bounds, or ask a superuser to raise backfill.checksum_max_ranges.",
                ),
            );
            require_ascending(relid, key, &bounds);
            bounds
        }
        None => {
            let ranges = crate::pg::args::required(ranges, "backfill_checksum", "ranges");
            if ranges < 1 {
                raise(
                    ERRCODE_INVALID_PARAMETER_VALUE,
                    format!("ranges {ranges} is out of range"),
                    "A checksum splits a table into at least 1 range.",
                    Some("ranges => 1024".into()),
                );
            }
            if ranges > most_ranges {
                raise(
                    ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                    format!("ranges {ranges} is more than backfill.checksum_max_ranges ({most_ranges})"),
                    "Each range of a checksum costs the memory of the backend that computes it.",
                    Some("Ask for fewer ranges, or ask a superuser to raise backfill.checksum_max_ranges.".into()),
                );
            }
            sample(ranges)
        }
    }
}

/// The caller may read the table (a checksum runs as the caller and reads every row).
pub fn require_readable(relid: pg_sys::Oid, name: &str) {
    let readable =
        crate::pg::spi::select_one::<bool>("SELECT pg_catalog.has_table_privilege($1, 'SELECT')", &[relid.into()])
            .ok()
            .flatten();
    if readable != Some(true) {
        raise(
            ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("permission denied for table {name}"),
            "A checksum reads every row of the table, as the role that calls it.",
            Some(format!("GRANT SELECT ON {name} TO ...;")),
        );
    }
}

/// About `ranges` - 1 bounds at equal steps of a sample of the keys of table `relid`,
/// duplicates merged.
pub fn sampled_bounds(relid: pg_sys::Oid, key: &[(String, String)], ranges: i32) -> Vec<serde_json::Value> {
    if ranges == 1 {
        return Vec::new();
    }
    let name = crate::selection::scanned::by_oid(relid);
    let rows = crate::pg::spi::planned_rows(&format!("SELECT * FROM {name}")).unwrap_or(0.0).max(1.0);
    let sampled = (SAMPLE_PER_RANGE * f64::from(ranges)).max(MIN_SAMPLE);
    let percent = (100.0 * sampled / rows).clamp(0.0001, 100.0);
    // Rows, not blocks: a block sample of a table whose keys follow its physical order would
    // place the bounds in clumps. Drawn as ANALYZE draws them, blocks first, then a row of each
    // (a random line pointer of a random block, fetched by TID): that reads about one block a
    // sampled row, where BERNOULLI visits every row of the table (half the count level's time
    // on 10M rows). A partitioned table, or one never vacuumed or analyzed, is sampled by
    // BERNOULLI.
    let sample = if percent >= 100.0 {
        String::new()
    } else if let Some((blocks, rows_per_block)) = crate::verify::cost::block_shape(relid) {
        format!(
            "WHERE s.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(
                 SELECT pg_catalog.format('(%s,%s)',
                            pg_catalog.floor(pg_catalog.random() OPERATOR(pg_catalog.*) {blocks}),
                            1 OPERATOR(pg_catalog.+) pg_catalog.floor(pg_catalog.random() OPERATOR(pg_catalog.*) {rows_per_block})
                        )::pg_catalog.tid
                   FROM pg_catalog.generate_series(1, {draws})))",
            // (Draws that miss, a dead row or a line pointer past the block's rows, give none.)
            draws = (sampled * 1.25).ceil() as i64,
        )
    } else {
        format!("TABLESAMPLE pg_catalog.bernoulli ({percent})")
    };
    bounds_of_sample(key, ranges, "", &format!("{name} AS s {sample}"))
}

/// About `ranges` - 1 bounds at equal steps of the keys of the rows of `from` (a FROM item named
/// `s`, after the query `with`, if any), duplicates merged.
pub fn bounds_of_sample(key: &[(String, String)], ranges: i32, with: &str, from: &str) -> Vec<serde_json::Value> {
    // The key columns are renamed k1, k2... at once: the sample's row numbers and count, and the
    // bound, are then columns beside names of this query's own, whatever the key's names are.
    let renamed: Vec<String> =
        key.iter().enumerate().map(|(i, (n, _))| format!("s.{} AS k{}", quote_ident(n), i + 1)).collect();
    let in_key_order: Vec<String> = key.iter().map(|(n, _)| format!("s.{}", quote_ident(n))).collect();
    let columns: Vec<String> = (1..=key.len()).map(|i| format!("k{i}")).collect();
    let object: Vec<String> = key
        .iter()
        .zip(&columns)
        .map(|((n, _), column)| format!("{}, s.{column}", crate::pg::encoding::quote_literal(n)))
        .collect();
    let sql = format!(
        "{with} SELECT pg_catalog.jsonb_agg(b.bound ORDER BY {columns}) FROM (
             SELECT DISTINCT ON ({columns}) pg_catalog.jsonb_build_object({object}) AS bound, {columns}
               FROM (SELECT {renamed}, pg_catalog.row_number() OVER (ORDER BY {in_key_order}) AS i,
                            pg_catalog.count(*) OVER () AS m
                       FROM {from}) s
              -- The first sampled key of each of $1 equal shares of the sample but the first.
              WHERE s.i OPERATOR(pg_catalog.>) 1
                AND (((s.i OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog.*) $1) OPERATOR(pg_catalog./) s.m)
                    OPERATOR(pg_catalog.>) (((s.i OPERATOR(pg_catalog.-) 2) OPERATOR(pg_catalog.*) $1) OPERATOR(pg_catalog./) s.m)
              ORDER BY {columns}) b",
        columns = columns.join(", "),
        object = object.join(", "),
        renamed = renamed.join(", "),
        in_key_order = in_key_order.join(", "),
    );
    let bounds = crate::pg::spi::select_one::<JsonB>(&sql, &[i64::from(ranges).into()]).or_internal("sample the keys");
    match bounds.map(|b| b.0) {
        Some(serde_json::Value::Array(bounds)) => bounds,
        _ => Vec::new(),
    }
}

pub type RangeRow = (i32, Option<JsonB>, Option<JsonB>, i64, Option<String>);

/// The table's ranges: at the count level, an index scan of the key per range; at the others,
/// one scan of the table, each row's range given by width_bucket over the bounds.
pub fn summarize(
    relid: pg_sys::Oid,
    key: &[(String, String)],
    bounds: &[serde_json::Value],
    level: Level,
    columns: Option<&[String]>,
) -> Vec<RangeRow> {
    let name = &crate::selection::scanned::by_oid(relid);
    // (The table's alias must not be one of its columns' names: a column named like it would
    // be what backfill.row_hash() gets.)
    let of_row = key_expression(key, |column, _| format!("backfill_row.{}", quote_ident(column)));
    let parameter = || JsonB(serde_json::Value::Array(bounds.to_vec()));
    let with_bounds = format!(
        "WITH bounds AS (
             SELECT e.o::pg_catalog.int4 AS o, {} FROM pg_catalog.jsonb_array_elements($1) WITH ORDINALITY AS e(b, o))",
        key.iter()
            .enumerate()
            .map(|(i, (column, type_name))| { format!("{} AS k{i}", key_from_json("e.b", column, type_name)) })
            .collect::<Vec<_>>()
            .join(", ")
    );
    let bound = |alias: &str| {
        let parts: Vec<String> = (0..key.len()).map(|i| format!("{alias}.k{i}")).collect();
        if parts.len() == 1 {
            parts[0].clone()
        } else {
            format!("ROW({})", parts.join(", "))
        }
    };
    let range = if bounds.is_empty() {
        "0".to_string()
    } else {
        format!(
            "pg_catalog.width_bucket({of_row}, (SELECT pg_catalog.array_agg({} ORDER BY b.o) FROM bounds b))",
            bound("b")
        )
    };
    // Each range's (number, rows, checksum), from a query that gives them.
    let read = |sql: &str| {
        Spi::connect(|client| {
            let rows = client.select(sql, None, &[parameter().into()])?;
            rows.map(|row| {
                let range = row.get::<i32>(1)?.unwrap_or_default();
                Ok((range, (row.get::<i64>(2)?.unwrap_or_default(), row.get::<String>(3)?)))
            })
            .collect::<Result<HashMap<_, _>, pgrx::spi::Error>>()
        })
        .or_internal("summarize the table's ranges")
    };
    // An integer key's range is found by a binary search of its bounds (width_bucket costs a
    // function call and ten comparisons through the type's comparison function); such a table
    // is counted and hashed in parallel where it can be (parallel_heap_scan.rs).
    let integer_bounds: Option<Vec<i64>> = match key {
        [(column, type_name)] if matches!(type_name.as_str(), "smallint" | "integer" | "bigint") => {
            bounds.iter().map(|b| b.get(column).and_then(serde_json::Value::as_i64)).collect()
        }
        _ => None,
    };
    // (The parallel scan hashes whole rows: a column list's are hashed by the query.)
    // (Counting reads the key's index where it is cheaper, else the table unless its rows are
    // so much wider than its keys that 1,024 scans of the index beat it.)
    let in_parallel = |hash: bool| {
        if hash && columns.is_some() {
            return None;
        }
        let heap_allowed = hash || !crate::verify::cost::rows_much_wider_than_keys(relid);
        let (rows, sums) = crate::verify::parallel_heap_scan::scan(
            relid,
            &crate::pg::spi::qualified_name(relid),
            &key[0].0,
            integer_bounds.as_ref()?,
            hash,
            heap_allowed,
        )?;
        Some((0..=bounds.len()).map(|i| (i as i32, (rows[i], hash.then(|| sums[i].to_string())))).collect())
    };
    let found: HashMap<i32, (i64, Option<String>)> = match level {
        Level::Count if let Some(found) = in_parallel(false) => found,
        // Else each range counted by its own scan of the key's index, which reads the index
        // alone where the visibility map allows: cheaper than the table when its rows are wide.
        Level::Count => {
            let count = |condition: &str| {
                format!(
                    "(SELECT pg_catalog.count(*) FROM {name} backfill_row WHERE {condition}), NULL::pg_catalog.text"
                )
            };
            let sql = if bounds.is_empty() {
                format!("SELECT 0, {}", count("true"))
            } else {
                format!(
                    "{with_bounds}
                     SELECT 0, {below} FROM bounds f WHERE f.o OPERATOR(pg_catalog.=) 1
                     UNION ALL
                     SELECT l.o, {between} FROM bounds l JOIN bounds u ON u.o OPERATOR(pg_catalog.=) (l.o OPERATOR(pg_catalog.+) 1)
                     UNION ALL
                     SELECT l.o, {above} FROM bounds l WHERE l.o OPERATOR(pg_catalog.=) {last}",
                    below = count(&format!("{of_row} OPERATOR(pg_catalog.<) {}", bound("f"))),
                    between = count(&format!(
                        "{of_row} OPERATOR(pg_catalog.>=) {} AND {of_row} OPERATOR(pg_catalog.<) {}",
                        bound("l"),
                        bound("u")
                    )),
                    above = count(&format!("{of_row} OPERATOR(pg_catalog.>=) {}", bound("l"))),
                    last = bounds.len(),
                )
            };
            read(&sql)
        }
        // Aggregated by the query itself, which may aggregate in parallel.
        // (The planner cannot tell that there are few ranges, and would sort every row, whole,
        // to group them; and compiling the aggregates' expressions costs more than it saves.)
        Level::Aggregate => crate::pg::settings::with_settings(&[(c"enable_sort", c"off"), (c"jit", c"off")], || {
            read(&format!(
                "{with_bounds} SELECT {range}::integer, pg_catalog.count(*), {} FROM {name} backfill_row GROUP BY 1",
                crate::verify::aggregate::expression(relid, columns)
            ))
        }),
        Level::Hash if let Some(found) = in_parallel(true) => found,
        Level::Hash => {
            let first = match integer_bounds {
                Some(_) => format!("{of_row}::pg_catalog.int8"),
                None => format!("{range}::integer"),
            };
            let row = columns.map(listed_columns).unwrap_or_else(|| "backfill_row.*".into());
            let sql = format!("{with_bounds} SELECT {first}, {row} FROM {name} backfill_row");
            let sums = crate::verify::row_hash::scan(&sql, parameter(), bounds.len() + 1, integer_bounds);
            (0..=bounds.len()).map(|i| (i as i32, (sums.rows[i], Some(sums.sums[i].to_string())))).collect()
        }
    };
    (0..=bounds.len())
        .map(|i| {
            let (rows, checksum) = found.get(&(i as i32)).cloned().unwrap_or((0, None));
            let checksum = checksum.or((level == Level::Hash).then(|| "0".to_string()));
            let lower = i.checked_sub(1).map(|b| JsonB(bounds[b].clone()));
            let upper = bounds.get(i).map(|b| JsonB(b.clone()));
            (i as i32 + 1, lower, upper, rows, checksum)
        })
        .collect()
}
