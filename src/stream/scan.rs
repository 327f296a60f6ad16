//! The queries of a table's scan: keyset pagination on its key, in the key index's order.
//!
//! A page is read in two steps. First the page's last key is found from the key alone (an
//! index scan with a LIMIT). Then every row between the cursor and that key is locked and read,
//! without a LIMIT. The cursor then moves to that key, whatever the second step returned: if a
//! writer changed a row's key between the two steps, the row's new version is either inside the
//! page (and read, locked, at its new key) or outside it (and its change reaches the stream
//! anyway), but no key that belongs to the page is ever skipped. A LIMIT on the locking query
//! would not give this: rows re-checked after a concurrent update drop out of a LIMIT's count
//! or come back out of order.

use crate::model::table::Table;
use crate::pg::encoding::quote_ident as quote_identifier;

/// How a page's query locks the rows it reads: which, page by page, is the lock policy's choice
/// (throttle/lock.rs), which gives it as this value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RowLocks {
    /// Lock every row or fail at once.
    NoWait,
    /// Wait (up to `lock_timeout`) for a row.
    Wait,
    /// No row locks (the page holds the table in SHARE mode, or a test shows the locks are needed).
    None,
}

impl RowLocks {
    /// The locking clause of a page's rows query (`t` names the table).
    pub fn clause(self) -> &'static str {
        match self {
            RowLocks::NoWait => " FOR SHARE OF t NOWAIT",
            RowLocks::Wait => " FOR SHARE OF t",
            RowLocks::None => "",
        }
    }
}

/// The SQL of one table's scan. Keys travel as text (their output form) and are cast back to
/// the key's types in the query, so any btree-orderable key type works the same way.
pub struct ScanQueries {
    key_types: Vec<String>,
    first_collation: Option<String>,
    partitioned: bool,
    from: String,
    key_json: String,
    row_columns: String,
    key_columns: String,
    key_text: String,
    order_asc: String,
    order_desc: String,
    key_row: String,
}

/// Key types whose text form is their JSON form and that have max().
const INTEGER_TYPES: [&str; 3] = ["smallint", "integer", "bigint"];

/// `to_json(t."a")::text, ...`: each key value as JSON, as row_to_json renders it. The message
/// assembles them into the `key` object. An integer's text is its JSON: it skips to_json, which
/// costs a type lookup per row.
pub fn key_json_values(table: &Table) -> String {
    table
        .key
        .iter()
        .map(|k| {
            if INTEGER_TYPES.contains(&k.type_name.as_str()) {
                format!("t.{}::pg_catalog.text", quote_identifier(&k.name))
            } else {
                format!("pg_catalog.to_json(t.{})::pg_catalog.text", quote_identifier(&k.name))
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

impl ScanQueries {
    pub fn new(table: &Table) -> Self {
        let column = |alias: &str, k: &crate::model::table::KeyColumn| {
            let collate = k.collation.as_ref().map(|c| format!(" COLLATE {c}")).unwrap_or_default();
            format!("{alias}.{}{collate}", quote_identifier(&k.name))
        };
        let list = |alias: &str, suffix: &str| {
            table.key.iter().map(|k| format!("{}{suffix}", column(alias, k))).collect::<Vec<_>>().join(", ")
        };
        ScanQueries {
            key_types: table.key.iter().map(|k| k.type_name.clone()).collect(),
            first_collation: table.key[0].collation.clone(),
            partitioned: table.partitioned,
            from: format!("{} t", crate::selection::scanned::of(table)),
            key_json: key_json_values(table),
            row_columns: crate::stream::json::select_list(&table.columns),
            key_text: table
                .key
                .iter()
                .map(|k| format!("t.{}::pg_catalog.text", quote_identifier(&k.name)))
                .collect::<Vec<_>>()
                .join(", "),
            key_columns: table
                .key
                .iter()
                .map(|k| format!("t.{}", quote_identifier(&k.name)))
                .collect::<Vec<_>>()
                .join(", "),
            order_asc: list("t", ""),
            order_desc: list("t", " DESC"),
            key_row: format!("ROW({})", list("t", "")),
        }
    }

    pub fn key_len(&self) -> usize {
        self.key_types.len()
    }

    /// `ROW($first::type, ...)`: a key bound as text parameters.
    fn params(&self, first: usize) -> String {
        let casts: Vec<String> =
            self.key_types.iter().enumerate().map(|(i, ty)| format!("${}::{ty}", first + i)).collect();
        format!("ROW({})", casts.join(", "))
    }

    /// Greatest key now, as text values then as JSON values: the scan's fixed upper bound.
    pub fn upper_bound(&self) -> String {
        format!("SELECT {}, {} FROM {} ORDER BY {} LIMIT 1", self.key_text, self.key_json, self.from, self.order_desc)
    }

    /// The share of the first key column's histogram (pg_stats) between the range's lower bound
    /// and the cursor, against the share up to the upper bound: how much of the key range is
    /// scanned, whatever the key's skew. Parameters: cursor, upper bound and lower bound (first
    /// column, text; the lower bound may be NULL), schema, table, column.
    pub fn key_fraction(&self) -> String {
        let ty = &self.key_types[0];
        let collate = self.first_collation.as_ref().map(|c| format!(" COLLATE {c}")).unwrap_or_default();
        let below = |param: &str| {
            format!(
                "(SELECT pg_catalog.count(*) FROM pg_catalog.unnest(s.histogram_bounds::pg_catalog.text::{ty}[]) b
                   WHERE b{collate} OPERATOR(pg_catalog.<=) {param}::{ty})"
            )
        };
        let lower = format!("coalesce({}, 0)", below("$3"));
        format!(
            "SELECT CASE WHEN {upper} OPERATOR(pg_catalog.<>) {lower}
                         THEN ({cursor} OPERATOR(pg_catalog.-) {lower})::pg_catalog.float8
                              OPERATOR(pg_catalog./) ({upper} OPERATOR(pg_catalog.-) {lower}) END
               FROM pg_catalog.pg_stats s
              WHERE s.schemaname OPERATOR(pg_catalog.=) $4 AND s.tablename OPERATOR(pg_catalog.=) $5
                AND s.attname OPERATOR(pg_catalog.=) $6 AND s.histogram_bounds IS NOT NULL
              ORDER BY s.inherited DESC LIMIT 1",
            cursor = below("$1"),
            upper = below("$2"),
        )
    }

    /// The first key column's histogram bounds (pg_stats), in key order, as text: where to
    /// split a table into ranges of about equal rows. Parameters: schema, table, column.
    pub fn histogram(&self) -> String {
        let ty = &self.key_types[0];
        format!(
            "SELECT pg_catalog.array_agg(u.b::pg_catalog.text ORDER BY u.i) FROM pg_catalog.pg_stats s,
                    pg_catalog.unnest(s.histogram_bounds::pg_catalog.text::{ty}[]) WITH ORDINALITY AS u(b, i)
              WHERE s.schemaname OPERATOR(pg_catalog.=) $1 AND s.tablename OPERATOR(pg_catalog.=) $2
                AND s.attname OPERATOR(pg_catalog.=) $3 AND s.histogram_bounds IS NOT NULL
                AND s.inherited OPERATOR(pg_catalog.=) (
                        SELECT pg_catalog.bool_or(inherited) FROM pg_catalog.pg_stats
                         WHERE schemaname OPERATOR(pg_catalog.=) $1 AND tablename OPERATOR(pg_catalog.=) $2
                           AND attname OPERATOR(pg_catalog.=) $3)"
        )
    }

    /// The keys of a block sample of about `percent` of the table, as text values, in key order:
    /// where to split a composite key into ranges of about equal rows.
    pub fn key_sample(&self, percent: f64) -> String {
        format!(
            "SELECT {} FROM {} TABLESAMPLE pg_catalog.system ({percent}) ORDER BY {}",
            self.key_text, self.from, self.order_asc
        )
    }

    /// The page's key range and how many parameters it binds.
    fn range(&self, after_cursor: bool) -> (String, usize) {
        let k = self.key_types.len();
        if after_cursor {
            (
                format!(
                    "{row} OPERATOR(pg_catalog.>) {lower} AND {row} OPERATOR(pg_catalog.<=) {upper}",
                    row = self.key_row,
                    lower = self.params(1),
                    upper = self.params(k + 1)
                ),
                2 * k,
            )
        } else {
            (format!("{} OPERATOR(pg_catalog.<=) {}", self.key_row, self.params(1)), k)
        }
    }

    /// The last key of the next page of at most `$limit` rows, as text values.
    /// Parameters: [cursor,] upper bound, limit.
    pub fn page_end(&self, after_cursor: bool) -> String {
        let (range, used) = self.range(after_cursor);
        // The greatest of the page's keys: max() for a lone integer key (no sort), else the
        // first of them in descending order (a top-1 sort, for any key).
        let (last, order) = match self.key_types.as_slice() {
            [ty] if INTEGER_TYPES.contains(&ty.as_str()) => {
                (format!("pg_catalog.max({})::pg_catalog.text", self.key_columns), String::new())
            }
            _ => (self.key_text.clone(), format!(" ORDER BY {} LIMIT 1", self.order_desc)),
        };
        format!(
            "SELECT {last} FROM (SELECT {columns} FROM {from} WHERE {range} ORDER BY {asc} LIMIT ${limit}) t{order}",
            columns = self.key_columns,
            from = self.from,
            asc = self.order_asc,
            limit = used + 1,
        )
    }

    /// Every row of the page: its columns, ready for json::RowJson (and its partition).
    /// Parameters: [cursor,] page end.
    pub fn page_rows(&self, after_cursor: bool, locks: RowLocks) -> String {
        let partition = if self.partitioned { ", t.tableoid::pg_catalog.regclass::pg_catalog.text" } else { "" };
        self.page_select(&format!("{}{partition}", self.row_columns), after_cursor, locks)
    }

    /// The row ids (ctid, as text) of every row of the page, locked as page_rows() locks them:
    /// a filtered page's rows, for the filter (selection/filter.rs). Parameters: [cursor,] page end.
    pub fn page_row_ids(&self, after_cursor: bool, locks: RowLocks) -> String {
        format!(
            "SELECT pg_catalog.array_agg(r.id) FROM ({}) r(id)",
            self.page_select("t.ctid::pg_catalog.text", after_cursor, locks)
        )
    }

    fn page_select(&self, columns: &str, after_cursor: bool, locks: RowLocks) -> String {
        let (range, _) = self.range(after_cursor);
        let lock = locks.clause();
        format!(
            "SELECT {columns} FROM {from} WHERE {range} ORDER BY {asc}{lock}",
            from = self.from,
            asc = self.order_asc,
        )
    }

    /// The rows of these row ids (locked by their page), as page_rows() reads them.
    /// Parameter: the row ids (text[]).
    pub fn rows_at(&self) -> String {
        format!(
            "SELECT {columns} FROM {from} WHERE {ids} ORDER BY {asc}",
            columns = self.row_columns,
            from = self.from,
            ids = ROW_IDS,
            asc = self.order_asc,
        )
    }

    /// Which of these row ids (locked by their page) pass the filter: the query the filter
    /// runs in, as the role that started the backfill. Parameter: the row ids (text[]).
    pub fn row_ids_passing(&self, filter: &str) -> String {
        self.filtered("pg_catalog.array_agg(t.ctid::pg_catalog.text)", ROW_IDS, filter)
    }

    /// The filter in a query that reads every row, for its check and its estimate: the same
    /// text around it as in row_ids_passing() (selection/filter.rs checks that it stays one
    /// expression).
    pub fn filter_check(&self, filter: &str) -> String {
        self.filtered("", "true", filter)
    }

    fn filtered(&self, columns: &str, condition: &str, filter: &str) -> String {
        format!("SELECT {columns} FROM {} WHERE {condition} AND (\n{filter}\n)", self.from)
    }
}

/// A row is found again by its id, in a page that holds it locked: its id cannot change.
const ROW_IDS: &str = "t.ctid OPERATOR(pg_catalog.=) ANY ($1::pg_catalog.text[]::pg_catalog.tid[])";

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::*;
    use pgrx::prelude::*;

    #[pg_test]
    fn page_queries_of_a_composite_collated_key_follow_the_index() {
        Spi::run("CREATE TABLE q (region text, id int, v jsonb, PRIMARY KEY (region, id))").unwrap();
        let relid = Spi::get_one::<pg_sys::Oid>("SELECT 'q'::regclass::oid").unwrap().unwrap();
        let queries = ScanQueries::new(&crate::model::table::inspect(relid).unwrap());
        let key = r#"ROW(t.region COLLATE pg_catalog."default", t.id)"#;
        assert_eq!(
            queries.page_rows(true, RowLocks::NoWait),
            format!(
                r#"SELECT t.region, t.id, t.v FROM ONLY public.q t WHERE {key} OPERATOR(pg_catalog.>) ROW($1::pg_catalog.text, $2::integer) AND {key} OPERATOR(pg_catalog.<=) ROW($3::pg_catalog.text, $4::integer) ORDER BY t.region COLLATE pg_catalog."default", t.id FOR SHARE OF t NOWAIT"#
            )
        );
        assert_eq!(
            queries.page_end(false),
            format!(
                r#"SELECT t.region::pg_catalog.text, t.id::pg_catalog.text FROM (SELECT t.region, t.id FROM ONLY public.q t WHERE {key} OPERATOR(pg_catalog.<=) ROW($1::pg_catalog.text, $2::integer) ORDER BY t.region COLLATE pg_catalog."default", t.id LIMIT $3) t ORDER BY t.region COLLATE pg_catalog."default" DESC, t.id DESC LIMIT 1"#
            )
        );
    }
}
