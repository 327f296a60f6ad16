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
use std::cell::RefCell;
use std::time::{Duration, Instant};

/// How often a running backfill samples its progress.
const PROGRESS_SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// When this worker last sampled its progress and last logged it: one clock across its tables,
/// so that a backfill of many small tables samples once a second, not once a table (a sample
/// at each of 200 tables of 5,000 rows cost a tenth of the worker's time).
struct ProgressClock {
    /// None until the first sample, which is taken at once.
    last_sample: Option<Instant>,
    last_log: Option<Instant>,
}

thread_local! {
    static CLOCK: RefCell<ProgressClock> = const { RefCell::new(ProgressClock { last_sample: None, last_log: None }) };
}

/// Whether a progress sample is due (none yet, or the last a second ago); if so, it counts as
/// taken now.
pub(super) fn sample_due() -> bool {
    CLOCK.with(|clock| {
        let mut clock = clock.borrow_mut();
        if clock.last_sample.is_some_and(|at| at.elapsed() < PROGRESS_SAMPLE_INTERVAL) {
            return false;
        }
        clock.last_sample = Some(Instant::now());
        true
    })
}

/// Whether this worker has yet to sample from a page: its first scan samples before its first
/// page too, so that the rate shows from the moment the scan began, with the first page.
pub(super) fn before_first_sample() -> bool {
    CLOCK.with(|clock| clock.borrow().last_sample.is_none())
}

/// Whether a log line is due (backfill.log_interval since the last, or since the first call);
/// if so, it counts as written now.
fn log_due() -> bool {
    CLOCK.with(|clock| {
        let mut clock = clock.borrow_mut();
        let last_log = *clock.last_log.get_or_insert_with(Instant::now);
        if settings::log_interval().is_none_or(|interval| last_log.elapsed() < interval) {
            return false;
        }
        clock.last_log = Some(Instant::now());
        true
    })
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
        if !sample_due() {
            return;
        }
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
        if log_due() {
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
