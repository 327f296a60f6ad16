//! Progress: the samples behind the rate of the last minute, the share of the key range
//! scanned (for the time left), and the periodic log line.

use super::TableScan;
use crate::catalog::job;
use crate::catalog::job_table::{self, JobTable};
use crate::pg::encoding::{KeyText, Text};
use crate::pg::privilege;
use crate::pg::settings;
use crate::worker::xact::who;
use pgrx::prelude::*;
use std::time::{Duration, Instant};

/// How often a running backfill samples its progress.
const PROGRESS_SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// When the scan last sampled its progress and last logged it.
pub(super) struct ProgressLog {
    /// None until the first page: it samples at once.
    last_sample: Option<Instant>,
    last_log: Instant,
}

impl ProgressLog {
    pub(super) fn new() -> Self {
        ProgressLog { last_sample: None, last_log: Instant::now() }
    }
}

/// Rows done as a percentage of those expected, as backfill_status.percent_done has it (truncated
/// to a tenth, below 100 until the scan ends).
fn percent_done(rows_done: i64, expected: i64) -> String {
    let tenths = (1000 * i128::from(rows_done) / i128::from(expected.max(1))).min(999);
    format!("{}.{}", tenths / 10, tenths % 10)
}

impl TableScan<'_> {
    /// Every few seconds: a progress sample (for the rate over the last minute) and the share
    /// of the key range scanned (for the time left); at backfill.log_interval, a log line.
    pub(super) fn report_progress(
        &mut self,
        cursor: &[KeyText],
        progress: &JobTable,
        upper_bound: &[KeyText],
        rows_done: i64,
    ) {
        if self.progress.last_sample.is_some_and(|at| at.elapsed() < PROGRESS_SAMPLE_INTERVAL) {
            return;
        }
        self.progress.last_sample = Some(Instant::now());
        job::record_progress(self.context.backfill_id);
        // The histogram's bounds are cast to the key's type: as the table's owner.
        let fraction = privilege::read_as(self.shape.owner, self.shape.table.relid, || {
            crate::pg::spi::select_one::<f64>(
                &self.shape.queries.key_fraction(),
                &[
                    cursor[0].clone().into(),
                    upper_bound[0].clone().into(),
                    progress.lower_bound.as_ref().map(|l| l[0].clone()).into(),
                    Text(self.shape.table.schema.clone()).into(),
                    Text(self.shape.table.name.clone()).into(),
                    Text(self.shape.table.key[0].name.clone()).into(),
                ],
            )
        })
        .unwrap_or(None);
        job_table::set_key_fraction(self.context.backfill_id, self.context.position, fraction);
        if settings::log_interval().is_some_and(|interval| self.progress.last_log.elapsed() >= interval) {
            self.progress.last_log = Instant::now();
            // Rows, as backfill_status counts them (the key range's share is no measure of rows).
            let expected = progress.rows_estimated.max(rows_done + 1);
            log!(
                "{}: {} {}% ({rows_done} of about {expected} rows)",
                who(self.context.backfill_id),
                self.shape.table.qualified_name(),
                percent_done(rows_done, expected)
            );
        }
    }
}
