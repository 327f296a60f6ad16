//! A scan's start and end: the upper bound fixed and the table's start marker sent by the first
//! range to start, the end marker (with the table's row count) by the last range to end. A
//! table's ranges are locked in order before any of them moves, so workers never deadlock.

use super::{Page, TableScan};
use crate::catalog::job_table::{self, JobTable, Range};
use crate::model::state::RangeState;
use crate::pg::encoding::{show_key, KeyText, Text};
use crate::pg::errors::OrInternal;
use crate::pg::privilege;
use crate::stream::message;
use crate::stream::sign::Signer;
use crate::worker::xact::who;
use pgrx::prelude::*;

impl TableScan<'_> {
    /// Fixes the upper bound (the greatest key now) and sends the start marker.
    pub(super) fn start_scan(&mut self, progress: &JobTable, signer: &Signer) -> Page {
        let ranges = self.lock_table_ranges();
        let position = self.context.position;
        let first_range = ranges.iter().all(|r| r.position == position || r.state == RangeState::Pending);
        // The greatest key now: the upper bound of a table scanned whole or of its last range,
        // and what the start marker announces.
        let greatest = (first_range || progress.upper_bound.is_none()).then(|| self.greatest_key()).flatten();
        let (backfill_id, table) = (self.context.backfill_id, &self.shape.table);
        if first_range {
            let json = greatest.as_ref().map(|(_, json)| json.as_slice());
            let rows_estimated = ranges.len() as i64 * progress.rows_estimated;
            let filter = self.context.row_filter.as_deref();
            let marker =
                message::table_start(backfill_id, self.context.slot.as_deref(), table, json, rows_estimated, filter);
            message::emit_marker(self.context.prefix, signer, marker);
        }
        let upper_bound = progress.upper_bound.clone().or(greatest.map(|(key, _)| key));
        job_table::move_range(backfill_id, position, RangeState::Running, upper_bound.clone());
        let bound = upper_bound
            .as_deref()
            .map(|k| format!("key ({})", show_key(k)))
            .unwrap_or_else(|| "nothing: it is empty".into());
        log!("{}: scanning {} up to {bound}", who(backfill_id), table.qualified_name());
        if upper_bound.is_none() {
            return self.end_scan_locked(0, &ranges, signer);
        }
        Page::More
    }

    /// Every range of this table in the backfill (one, unless parallel), locked in order.
    pub(super) fn lock_table_ranges(&self) -> Vec<Range> {
        job_table::lock_table_ranges(self.context.backfill_id, self.context.position)
    }

    /// Ends the scan of a range whose rows `ranges` are locked: marks it done and, if it is
    /// the table's last range to end, sends the table's end marker with the table's row count.
    pub(super) fn end_scan_locked(&mut self, rows: i64, ranges: &[Range], signer: &Signer) -> Page {
        let (backfill_id, position, table) = (self.context.backfill_id, self.context.position, &self.shape.table);
        let others = ranges.iter().filter(|r| r.position != position);
        if others.clone().all(|r| r.state == RangeState::Done) {
            let total = rows + others.map(|r| r.rows_done).sum::<i64>();
            // Of the columns its reads carry only: a column list withholds the others' too.
            let mut sequences = message::OwnedSequence::of(table.relid, &self.context.started_by);
            sequences.retain(|s| table.columns.iter().any(|c| c.name == s.column));
            let marker = message::table_end(backfill_id, self.context.slot.as_deref(), table, total, &sequences);
            message::emit_marker(self.context.prefix, signer, marker);
            log!("{}: {} done, {total} rows", who(backfill_id), table.qualified_name());
        }
        job_table::move_range(backfill_id, position, RangeState::Done, None);
        Page::TableDone
    }

    /// Ends the scan of this range when no key is left in it.
    pub(super) fn end_scan(&mut self, rows: i64, signer: &Signer) -> Page {
        let ranges = self.lock_table_ranges();
        self.end_scan_locked(rows, &ranges, signer)
    }

    /// The scan's upper bound, as text values and as JSON values, None if the table is empty:
    /// a keyed scan's greatest key given, else the table's greatest key now.
    fn greatest_key(&self) -> Option<(Vec<KeyText>, Vec<String>)> {
        if self.context.keyed {
            return job_table::last_key(self.context.backfill_id, self.context.position);
        }
        let queries = &self.shape.queries;
        privilege::read_as(self.shape.owner, self.shape.table.relid, || {
            Spi::connect(|client| {
                let rows = client.select(&queries.upper_bound(), None, &[])?;
                if rows.is_empty() {
                    return Ok::<_, pgrx::spi::Error>(None);
                }
                let row = rows.first();
                let k = queries.key_len();
                // Key columns are never NULL.
                let key = (1..=k)
                    .map(|i| row.get::<KeyText>(i).map(Option::unwrap_or_default))
                    .collect::<Result<Vec<_>, _>>()?;
                let json = (k + 1..=2 * k)
                    .map(|i| row.get::<Text>(i).map(|v| v.map(|t| t.0).unwrap_or_default()))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Some((key, json)))
            })
        })
        .or_internal("read the table's greatest key")
    }
}
