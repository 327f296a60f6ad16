//! One page of a scan of the table's key range: from the cursor to the page's last key, its rows
//! locked and read, one message each, and the cursor advanced, in the page's transaction.

use super::{Page, TableScan};
use crate::catalog::job_table::{self, JobTable};
use crate::pg::encoding::KeyText;
use crate::pg::errors::{raise, OrInternal};
use crate::pg::privilege;
use crate::pg::settings;
use crate::stream::delivery;
use crate::stream::sign::Signer;
use crate::throttle::lock::Locking;
use crate::worker::shared_progress;
use pgrx::PgSqlErrorCode::*;
use std::time::Instant;

impl TableScan<'_> {
    /// The next page of the range up to `upper_bound` (see the module's comment).
    pub(super) fn range_page(&mut self, progress: &JobTable, upper_bound: &[KeyText], signer: &Signer) -> Page {
        let cursor = progress.cursor.clone();
        // The page's lock comes before its queries take their snapshots (see lock.rs).
        let (locking, rows_per_page) = self.throttle.lock_page(self.shape.table.relid);
        let locked_at = Instant::now();
        let Some(page_end) = self.page_end(cursor.as_deref(), upper_bound, rows_per_page) else {
            return self.end_scan(progress.rows_done, signer);
        };
        // Rests between its queries as between its rows.
        if locking.lets_the_page_rest() {
            self.throttle.rest_within_page();
        }
        let (rows, bytes) = self.deliver(cursor.as_deref(), &page_end, locking, signer);
        self.throttle.delivered(rows, bytes);
        let table_locked = locking == Locking::Table;
        let counted = self.context.counts_lock_paths.then_some(table_locked);
        let (backfill_id, position) = (self.context.backfill_id, self.context.position);
        if page_end == upper_bound {
            // The table's ranges are locked before this range's row is updated, as in every
            // other end and start: always in the same order, so workers never deadlock.
            let ranges = self.lock_table_ranges();
            job_table::advance_cursor(backfill_id, position, page_end, rows, bytes, counted);
            shared_progress::delivered(progress.rows_done + rows, bytes);
            return self.end_scan_locked(progress.rows_done + rows, &ranges, signer);
        }
        job_table::advance_cursor(backfill_id, position, page_end.clone(), rows, bytes, counted);
        shared_progress::delivered(progress.rows_done + rows, bytes);
        self.report_progress(&page_end, progress, upper_bound, progress.rows_done + rows);
        if table_locked {
            self.throttle.table_page_took(rows as i32, locked_at.elapsed());
        }
        Page::More
    }

    /// A page query's parameters: the cursor (unless at the start), then `then`.
    fn key_args(cursor: Option<&[KeyText]>, then: &[KeyText]) -> Vec<KeyText> {
        cursor.unwrap_or_default().iter().chain(then).cloned().collect()
    }

    /// The last key of the next page, or None when no key is left up to the upper bound.
    fn page_end(&mut self, cursor: Option<&[KeyText]>, upper_bound: &[KeyText], rows: i32) -> Option<Vec<KeyText>> {
        let mut args: Vec<pgrx::datum::DatumWithOid> =
            Self::key_args(cursor, upper_bound).into_iter().map(|v| v.into()).collect();
        args.push(i64::from(rows).into());
        let sql = self.shape.queries.page_end(cursor.is_some());
        let key_len = self.shape.queries.key_len();
        privilege::read_as(self.shape.owner, self.shape.table.relid, || {
            crate::pg::spi::run_prepared(&sql, false, &args, |result| {
                if result.is_empty() {
                    return Ok(None);
                }
                // No row, or max() of no rows (NULL): no key is left. Key columns are never NULL.
                let row = result.first();
                (0..key_len).map(|i| row.get::<KeyText>(i + 1)).collect::<Result<Option<Vec<_>>, _>>()
            })
        })
        .or_internal("read the page's last key")
    }

    /// Locks and reads every row from the cursor (exclusive) to the page's end (inclusive),
    /// emitting one message per row. Returns rows and payload bytes delivered.
    fn deliver(
        &mut self,
        cursor: Option<&[KeyText]>,
        page_end: &[KeyText],
        locking: Locking,
        signer: &Signer,
    ) -> (i64, i64) {
        let args: Vec<pgrx::datum::DatumWithOid> =
            Self::key_args(cursor, page_end).into_iter().map(Into::into).collect();
        let Some(filter) = self.context.row_filter.clone() else {
            let sql = self.shape.queries.page_rows(cursor.is_some(), locking.row_locks());
            return self.deliver_rows(&sql, &args, signer, locking);
        };
        // A filtered page locks and lists its rows as the owner, as any page does. The filter is
        // the starter's code: it picks the rows to deliver as the starter, never as the owner or
        // the worker's superuser. They are then read as the owner. (Locked, no row can change
        // between the three queries; a row that enters or leaves the filter later does so by a
        // change, which the stream carries after this page.)
        let queries = &self.shape.queries;
        let ids = privilege::read_as(self.shape.owner, self.shape.table.relid, || {
            crate::pg::spi::select_one::<Vec<String>>(
                &queries.page_row_ids(cursor.is_some(), locking.row_locks()),
                &args,
            )
        })
        .or_internal("lock the page's rows");
        let Some(passing) = ids.and_then(|ids| self.passing_row_ids(&filter, ids)) else { return (0, 0) };
        let sql = self.shape.queries.rows_at();
        self.deliver_rows(&sql, &[passing.into()], signer, locking)
    }

    /// Which of the row ids `ids`, of rows the page holds locked, pass `filter`: run as the role
    /// that started the backfill, never as the owner or the worker's superuser (None: none).
    pub(super) fn passing_row_ids(&self, filter: &str, ids: Vec<String>) -> Option<Vec<String>> {
        let Some(starter) = privilege::role_named(&self.context.started_by) else {
            // (The page's recheck found the role: it was dropped since.)
            raise(
                ERRCODE_UNDEFINED_OBJECT,
                format!("role \"{}\" that started the backfill no longer exists", self.context.started_by),
                "A backfill's filter runs as the role that started it.",
                Some("Start a new backfill as a role that exists.".into()),
            )
        };
        let (queries, table_name) = (&self.shape.queries, self.shape.table.qualified_name());
        privilege::read_as(starter, self.shape.table.relid, || {
            // Checked again, as at its start: since then a column's type may have changed (its
            // cast now a volatile function of the table's owner), or a better overload of one
            // of its functions appeared; a volatile function or a subquery stops the backfill.
            crate::selection::filter::check_again(&queries.filter_check(filter), &table_name);
            crate::selection::filter::with_filter_settings(|| {
                crate::pg::spi::select_one::<Vec<String>>(&queries.row_ids_passing(filter), &[ids.into()])
            })
        })
        .or_internal("filter the page's rows")
    }

    /// Runs a page's rows query (`sql`, with `args`), emitting one message per row it returns;
    /// the page holds its rows as `locking` says. Returns rows and payload bytes delivered.
    pub(super) fn deliver_rows(
        &mut self,
        sql: &str,
        args: &[pgrx::datum::DatumWithOid],
        signer: &Signer,
        locking: Locking,
    ) -> (i64, i64) {
        let plan = crate::pg::spi::kept_plan(sql, args);
        let throttle = &mut self.throttle;
        let mut rest = || throttle.rest_within_page();
        let shape = &mut self.shape;
        let table_name = shape.table.qualified_name();
        let mut sink = delivery::Sink {
            key_columns: &shape.key_columns,
            partitioned: shape.table.partitioned,
            row: &mut shape.row,
            messages: &mut shape.messages,
            prefix: self.context.prefix,
            signer,
            max_message_size: settings::max_message_bytes(),
            table: &table_name,
            // The gentle default rests between the rows of a page that holds only row locks: a
            // page that holds the table makes every writer wait until it commits.
            before_row: locking.lets_the_page_rest().then_some(&mut rest as &mut dyn FnMut()),
            rows: 0,
            bytes: 0,
        };
        // The rows' casts to json and the key's input functions are user code: as the owner.
        privilege::read_as(shape.owner, shape.table.relid, || delivery::run(plan, args, &mut sink));
        (sink.rows, sink.bytes)
    }
}
