//! Pacing: `rows_per_second`.

use pgrx::bgworkers::BackgroundWorker;
use std::time::{Duration, Instant};

/// Paces a backfill to a rate with a token bucket: rows are allowed as time passes, and at most
/// a page or a tenth of a second's worth can be saved up, so the rate holds over any window of a
/// second or more whatever the page size, with no fixed sleep per page.
pub struct Pacer {
    rows_per_second: Option<f64>,
    allowance: f64,
    last: Instant,
}

impl Pacer {
    pub fn new(rows_per_second: Option<i32>) -> Self {
        Pacer { rows_per_second: rows_per_second.map(f64::from), allowance: 0.0, last: Instant::now() }
    }

    fn refill(&mut self, rate: f64, capacity: f64) {
        let now = Instant::now();
        self.allowance = (self.allowance + rate * now.duration_since(self.last).as_secs_f64()).min(capacity);
        self.last = now;
    }

    /// Sleeps until a page of `rows` fits the rate.
    pub fn wait_for(&mut self, rows: i32) {
        let Some(rate) = self.rows_per_second else { return };
        let needed = f64::from(rows);
        let capacity = needed.max(rate / 10.0);
        self.refill(rate, capacity);
        while self.allowance < needed {
            let wait = Duration::from_secs_f64((needed - self.allowance) / rate);
            BackgroundWorker::wait_latch(Some(wait.max(Duration::from_millis(1))));
            self.refill(rate, capacity);
        }
    }

    pub fn set_rate(&mut self, rows_per_second: Option<i32>) {
        self.rows_per_second = rows_per_second.map(f64::from);
    }

    pub fn spend(&mut self, rows: i32) {
        if self.rows_per_second.is_some() {
            self.allowance -= f64::from(rows);
        }
    }
}
