//! Pacing (`rows_per_second`), and every sleep of a worker (and of backfill_wait()).

use pgrx::pg_sys;
use std::time::{Duration, Instant};

/// The longest a worker sleeps before it looks at its backfill again (a cancel, pause or
/// backfill_set() also wakes it at once: they set its latch).
pub const LONGEST_SLEEP: Duration = Duration::from_secs(1);

/// Every sleep of a worker: on its latch, so that a signal, backfill_cancel(), backfill_pause()
/// and backfill_set() wake it; the process exits if the postmaster dies meanwhile.
pub fn sleep(duration: Duration) {
    let millis = duration.min(LONGEST_SLEEP).as_millis() as std::ffi::c_long;
    let events = pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH;
    // SAFETY: this process's own latch, waited on and reset as every backend does; an interrupt
    // (termination) is then served.
    unsafe {
        pg_sys::WaitLatch(pg_sys::MyLatch, events as i32, millis, pg_sys::PG_WAIT_EXTENSION);
        pg_sys::ResetLatch(pg_sys::MyLatch);
    }
    pg_sys::check_for_interrupts!();
}

/// A worker's share of the backfill's total rate, `workers` scanning: each paces itself to an
/// equal share, and the others speed up as workers finish their ranges.
pub fn share(rows_per_second: Option<i32>, workers: i64) -> Option<f64> {
    rows_per_second.map(|total| f64::from(total) / workers.max(1) as f64)
}

/// Paces a backfill to a rate with a token bucket: rows are allowed as time passes, and at most
/// a page or a tenth of a second's worth can be saved up, so the rate holds over any window of a
/// second or more whatever the page size, with no fixed sleep per page.
pub struct Pacer {
    rows_per_second: Option<f64>,
    allowance: f64,
    last: Instant,
}

impl Pacer {
    /// A worker's pacer, to `rows_per_second` (see [`share`]); None for no limit.
    pub fn new(rows_per_second: Option<f64>) -> Self {
        Pacer { rows_per_second, allowance: 0.0, last: Instant::now() }
    }

    fn refill(&mut self, rate: f64, capacity: f64) {
        let now = Instant::now();
        self.allowance = (self.allowance + rate * now.duration_since(self.last).as_secs_f64()).min(capacity);
        self.last = now;
    }

    /// The largest page the rate allows: a second's worth of rows, so that no page waits for
    /// its turn longer than a second.
    pub fn page_limit(&self) -> i32 {
        self.rows_per_second.map_or(i32::MAX, |rate| rate.ceil().clamp(1.0, f64::from(i32::MAX)) as i32)
    }

    /// The largest first page: a tenth of a second of the rate, so that a paced backfill's first
    /// rows show at once rather than after a whole batch's worth of time (pages then double up
    /// to the batch, as after a lock conflict).
    pub fn first_page_limit(&self) -> i32 {
        self.rows_per_second.map_or(i32::MAX, |rate| (rate / 10.0).ceil().clamp(1.0, f64::from(i32::MAX)) as i32)
    }

    /// Whether a page of `rows` fits the rate now; if not, sleeps toward it (at most
    /// [`LONGEST_SLEEP`]) and tells whether it fits after that.
    pub fn ready_for(&mut self, rows: i32) -> bool {
        let Some(rate) = self.rows_per_second else { return true };
        let needed = f64::from(rows);
        let capacity = needed.max(rate / 10.0);
        self.refill(rate, capacity);
        if self.allowance < needed {
            sleep(Duration::from_secs_f64((needed - self.allowance) / rate).max(Duration::from_millis(1)));
            self.refill(rate, capacity);
        }
        self.allowance >= needed
    }

    /// The worker's rate from now on (a share of the backfill's, perhaps held back by load).
    pub fn set_rate(&mut self, rows_per_second: Option<f64>) {
        self.rows_per_second = rows_per_second;
    }

    pub fn spend(&mut self, rows: i32) {
        if self.rows_per_second.is_some() {
            self.allowance -= f64::from(rows);
        }
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::*;
    use pgrx::prelude::*;

    #[pg_test]
    fn a_page_is_at_most_a_second_of_the_rate() {
        assert_eq!(Pacer::new(share(None, 1)).page_limit(), i32::MAX);
        assert_eq!(Pacer::new(share(Some(2), 1)).page_limit(), 2);
        assert_eq!(Pacer::new(share(Some(5000), 1)).page_limit(), 5000);
    }

    #[pg_test]
    fn a_first_page_is_a_tenth_of_a_second_of_the_rate() {
        assert_eq!(Pacer::new(share(None, 1)).first_page_limit(), i32::MAX);
        assert_eq!(Pacer::new(share(Some(2000), 1)).first_page_limit(), 200);
        assert_eq!(Pacer::new(share(Some(5), 1)).first_page_limit(), 1);
    }

    #[pg_test]
    fn workers_share_the_total_rate() {
        assert_eq!(Pacer::new(share(Some(10_000), 2)).page_limit(), 5000);
        let mut pacer = Pacer::new(share(Some(10_000), 4));
        assert_eq!(pacer.page_limit(), 2500);
        pacer.set_rate(share(Some(10_000), 1)); // the others finished their ranges
        assert_eq!(pacer.page_limit(), 10_000);
    }

    #[pg_test]
    fn the_rate_allows_a_page_once_its_rows_are_earned() {
        let mut pacer = Pacer::new(share(Some(1000), 1));
        // 1000 rows/s: a 100-row page is earned in 0.1 s, which one call sleeps for.
        let started = Instant::now();
        while !pacer.ready_for(100) {}
        assert!(started.elapsed() >= Duration::from_millis(90));
        pacer.spend(100);
        assert!(!pacer.ready_for(1000) || started.elapsed() >= Duration::from_millis(990));
    }
}
