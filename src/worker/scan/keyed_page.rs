//! The pages of a backfill of given keys (start/keys.rs records them): each page delivers at
//! most `batch_size` keys, a key with a row read as any row is, a key without one as `absent`
//! (and, for a publication with a row filter, a key whose row the filter leaves out).
//!
//! Why an `absent` sorts right against a concurrent insert of its key: a keyed page always
//! holds the table in SHARE mode (throttle/lock.rs) from before its queries take their
//! snapshots until it commits. No writer of the table is in progress when the lock is granted,
//! and none can write it until the page commits. A key the page finds absent was therefore
//! absent in every committed state before the page's commit, and an insert of it commits after
//! the page, so its change is decoded after the `absent`. (Row locks could not give this: an
//! absent row has none.)

use super::{Page, TableScan};
use crate::catalog::job_table::{self, JobTable};
use crate::model::table::Table;
use crate::pg::encoding::quote_ident;
use crate::pg::errors::OrInternal;
use crate::pg::privilege;
use crate::stream::message;
use crate::stream::sign::Signer;
use crate::throttle::lock::Locking;
use crate::worker::shared_progress;
use pgrx::datum::DatumWithOid;

impl TableScan<'_> {
    /// One page of a keyed scan: the next keys, each read (if its row exists) or delivered
    /// absent, under the table's SHARE lock (see the module's comment).
    pub(super) fn key_page(&mut self, progress: &JobTable, signer: &Signer) -> Page {
        let (locking, rows_per_page) = self.throttle.lock_page(self.shape.table.relid);
        let (backfill_id, position) = (self.context.backfill_id, self.context.position);
        let keys = job_table::next_keys(backfill_id, position, progress.rows_done, rows_per_page);
        let Some(last) = keys.last() else {
            return self.end_scan(progress.rows_done, signer);
        };
        let table = &self.shape.table;
        // One text[] of values per key column.
        let args: Vec<DatumWithOid> = (0..table.key.len())
            .map(|column| keys.iter().map(|k| k.text[column].clone()).collect::<Vec<_>>().into())
            .collect();
        let filter = self.context.row_filter.clone();
        let absent_sql = absent_keys(table, filter.is_some());
        let (read, mut bytes, args) = match filter {
            None => {
                let rows_sql = key_rows(table, locking);
                // (However its rows are locked, a keyed page holds the table: see the module.)
                let (read, bytes) = self.deliver_rows(&rows_sql, &args, signer, Locking::Table);
                (read, bytes, args)
            }
            // The publication's row filter (a keyed backfill takes no filter of its own): a key
            // whose row it leaves out is absent from the publication's consumer too, which
            // receives the row's INSERT if a change brings it into the filter (selection/row_filter.rs).
            Some(filter) => {
                let ids_sql = key_row_ids(table, locking);
                let ids = privilege::read_as(self.shape.owner, self.shape.table.relid, || {
                    crate::pg::spi::select_one::<Vec<String>>(&ids_sql, &args)
                })
                .or_internal("list the keys' rows");
                let passing = ids.and_then(|ids| self.passing_row_ids(&filter, ids)).unwrap_or_default();
                let rows_sql = self.shape.queries.rows_at();
                let (read, bytes) = self.deliver_rows(&rows_sql, &[passing.clone().into()], signer, Locking::Table);
                (read, bytes, args.into_iter().chain([passing.into()]).collect())
            }
        };
        let absent: Vec<i64> = privilege::read_as(self.shape.owner, self.shape.table.relid, || {
            crate::pg::spi::run_prepared(&absent_sql, false, &args, |rows| {
                rows.map(|row| Ok(row.get::<i64>(1)?.unwrap_or_default())).collect()
            })
        })
        .or_internal("find the absent keys");
        for ordinal in &absent {
            let key = &keys[*ordinal as usize - 1];
            let marker = message::absent(backfill_id, self.context.slot.as_deref(), &self.shape.table, &key.json);
            bytes += marker.len() as i64;
            message::emit_marker(self.context.prefix, signer, marker);
        }
        self.throttle.delivered(read + absent.len() as i64, bytes);
        let counted = self.context.counts_lock_paths.then_some(locking == Locking::Table);
        job_table::advance_cursor(backfill_id, position, last.text.clone(), keys.len() as i64, bytes, counted);
        shared_progress::delivered(progress.rows_done + keys.len() as i64, bytes);
        Page::More
    }
}

/// A keyed page's SQL: the key's columns (`t.a` or `(t.a, t.b)`), the page's keys cast back to
/// the key's types (`k.c0::type, ...`), and where they come from: one text[] parameter per key
/// column, unnested together.
struct KeySql {
    columns: String,
    casts: Vec<String>,
    unnest: String,
    names: String,
}

impl KeySql {
    fn of(table: &Table) -> Self {
        let columns = table.key.iter().map(|k| format!("t.{}", quote_ident(&k.name))).collect::<Vec<_>>();
        // ROWS FROM: a qualified unnest() takes one array (only a bare one in FROM takes several).
        let params =
            (1..=table.key.len()).map(|i| format!("pg_catalog.unnest(${i}::pg_catalog.text[])")).collect::<Vec<_>>();
        KeySql {
            columns: if columns.len() == 1 { columns[0].clone() } else { format!("({})", columns.join(", ")) },
            casts: table.key.iter().enumerate().map(|(i, k)| format!("k.c{i}::{}", k.type_name)).collect(),
            unnest: format!("ROWS FROM ({})", params.join(", ")),
            names: (0..table.key.len()).map(|i| format!("c{i}")).collect::<Vec<_>>().join(", "),
        }
    }
}

/// The rows of a keyed page, for delivery: those of the given keys that exist.
fn key_rows(table: &Table, locking: Locking) -> String {
    let KeySql { columns, casts, unnest, names } = KeySql::of(table);
    let order = table.key.iter().map(|k| format!("t.{}", quote_ident(&k.name))).collect::<Vec<_>>().join(", ");
    let lock = locking.row_locks().clause();
    format!(
        "SELECT {} FROM {} t WHERE {columns} OPERATOR(pg_catalog.=) ANY (SELECT {} FROM {unnest} AS k({names}))
          ORDER BY {order}{lock}",
        crate::stream::json::select_list(&table.columns),
        crate::selection::scanned::of(table),
        casts.join(", "),
    )
}

/// The row ids (ctid, as text) of the rows of a keyed page's keys, locked as key_rows() locks
/// them: for the filter.
fn key_row_ids(table: &Table, locking: Locking) -> String {
    let KeySql { columns, casts, unnest, names } = KeySql::of(table);
    format!(
        "SELECT pg_catalog.array_agg(t.ctid::pg_catalog.text) FROM (SELECT t.ctid FROM {} t
          WHERE {columns} OPERATOR(pg_catalog.=) ANY (SELECT {} FROM {unnest} AS k({names})){}) t",
        crate::selection::scanned::of(table),
        casts.join(", "),
        locking.row_locks().clause(),
    )
}

/// The ordinals (from 1) of the page's keys that have no row; `filtered`: no row among those
/// whose ids the query's last parameter lists, the rows that passed the filter.
fn absent_keys(table: &Table, filtered: bool) -> String {
    let KeySql { columns, casts, unnest, names } = KeySql::of(table);
    let key = if casts.len() == 1 { casts[0].clone() } else { format!("({})", casts.join(", ")) };
    let passing = if filtered {
        format!(
            " AND t.ctid OPERATOR(pg_catalog.=) ANY (${}::pg_catalog.text[]::pg_catalog.tid[])",
            table.key.len() + 1
        )
    } else {
        String::new()
    };
    format!(
        "SELECT k.o FROM {unnest} WITH ORDINALITY AS k({names}, o)
          WHERE NOT EXISTS (SELECT FROM {} t WHERE {columns} OPERATOR(pg_catalog.=) {key}{passing})",
        crate::selection::scanned::of(table)
    )
}
