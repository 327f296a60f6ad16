//! What holds a scan's pages back, and the page size that follows from it: the backfill's rate
//! (pacing), the server's load (max_active_sessions, or the gentle default's duty cycle), the
//! consumer's slot and the source (pipeline, back-pressure: the wait gate), and how pages lock
//! (a lock conflict halves the page; pages grow back).

use crate::catalog::job::Job;
use crate::model::state::LockMode;
use crate::throttle::backpressure::{self, LoadGovernor, SourceLimit};
use crate::throttle::duty::DutyCycle;
use crate::throttle::lock::{LockPolicy, Locking};
use crate::throttle::pacing::{self, Pacer};
use crate::throttle::pipeline;
use crate::throttle::wait::WaitReason;
use crate::worker::activity;
use crate::worker::shared_progress::{self, Phase};
use crate::worker::xact::who;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::time::Duration;

pub struct Throttle {
    pacer: Pacer,
    /// What the server's load allows this worker (backfill.max_active_sessions).
    load: LoadGovernor,
    /// The rests of a backfill with no pacing of its own on a busy server (the gentle default).
    duty: DutyCycle,
    locks: LockPolicy,
    /// The backfill's batch_size (backfill_set() may change it): the most rows of a page.
    batch_size: i32,
    /// Rows the next page may have: batch_size, what a second of the rate allows, halved after
    /// a lock conflict, growing back twofold a page (as from a paced backfill's small first page).
    rows_per_page: i32,
    /// Rows of the last page's size in bytes that fit settings::page_bytes_bound(): a page
    /// larger than the decoder's memory would be spilled to disk by every walsender.
    rows_within_bytes: i32,
    /// Rows the page under way delivered (its lock may have given it fewer than rows_per_page).
    page_rows_delivered: i64,
    /// The kind of what the backfill waits for now, if anything: logged when it changes.
    waiting: Option<&'static str>,
    /// Whether the load slows it down now: logged when it changes.
    slowed_by_load: bool,
}

impl Throttle {
    pub(super) fn new(job: &Job, partitioned: bool) -> Self {
        let pacer = Pacer::new(pacing::share(job.rows_per_second, i64::from(job.parallel)));
        Throttle {
            rows_per_page: job.batch_size.min(pacer.first_page_limit()),
            pacer,
            load: LoadGovernor::new(),
            duty: DutyCycle::new(),
            locks: LockPolicy::new(job.lock_mode, partitioned, job.batch_size),
            batch_size: job.batch_size,
            rows_within_bytes: i32::MAX,
            page_rows_delivered: 0,
            waiting: None,
            slowed_by_load: false,
        }
    }

    /// Follows the backfill as it is now: its batch_size, its rate shared by `sharing` workers
    /// and held down by the server's load, and, with no pacing of its own, the duty cycle.
    pub(super) fn follow(&mut self, job: &Job, sharing: i64) {
        self.batch_size = job.batch_size;
        let share = pacing::share(job.rows_per_second, sharing);
        let limit = SourceLimit::ActiveSessions.in_force(job.source.max_active_sessions);
        // No pacing of its own: max_active_sessions => 0 is the DBA's "unpaced".
        let gentle = job.rows_per_second.is_none() && job.source.max_active_sessions.is_none();
        let rate = match self.load.allowed_rate(limit, gentle, share, f64::from(job.batch_size)) {
            Some(allowed) => Some(share.map_or(allowed, |share| share.min(allowed))),
            None => share,
        };
        self.pacer.set_rate(rate);
        self.duty.follow(gentle, self.load.active(), job.slot_name.as_deref());
    }

    /// Whether the next page may begin now: the worker's rest after its last page is over, and
    /// the page fits the rate (if not, it slept toward both, at most a second).
    pub fn ready_for_page(&mut self) -> bool {
        self.rows_per_page = self
            .rows_per_page
            .min(self.batch_size)
            .min(self.pacer.page_limit())
            .min(self.rows_within_bytes)
            .min(self.duty.page_limit());
        let ready = self.duty.rested() && self.pacer.ready_for(self.rows_per_page);
        if ready {
            self.duty.page_begins();
        }
        ready
    }

    /// Whether the worker rests after its pages (the gentle default, on a busy server).
    pub fn resting(&self) -> bool {
        self.duty.resting()
    }

    /// Between a page's queries and its rows: the gentle default's rest within the page, when
    /// one is due.
    pub fn rest_within_page(&mut self) {
        self.duty.rest_within_page();
    }

    /// A page was delivered: its rows are spent from the rate, the worker rests for its duty
    /// cycle, and the next page may grow back after a lock conflict made pages small.
    pub fn page_delivered(&mut self) {
        self.pacer.spend(self.rows_per_page);
        self.duty.page_delivered(std::mem::take(&mut self.page_rows_delivered));
        self.rows_per_page = (self.rows_per_page * 2).min(self.batch_size);
    }

    /// A writer held one of the page's rows (NOWAIT): the page is retried at once with half the
    /// rows, down to the one row that waits. False when it cannot shrink (one row, or pages that
    /// lock the table).
    pub fn shrink_after_lock_conflict(&mut self) -> bool {
        if self.rows_per_page <= 1 || self.locks.mode == LockMode::Table {
            return false;
        }
        self.rows_per_page = (self.rows_per_page / 2).max(1);
        true
    }

    /// The wait gate: whether the consumer's slot or the source holds pages back now. Says so in
    /// pg_stat_activity, and in the log when the kind of what it waits for changes.
    pub(super) fn holds_back(&mut self, job: &Job, backfill_id: i64) -> bool {
        let blocker = pipeline::blocker(job, backfill_id)
            .or_else(|| backpressure::blocker(&job.source, job.slot_name.as_deref()));
        let Some(reason) = blocker else {
            if self.waiting.take().is_some() {
                log!("{}: continues, what it waited for is back and caught up", who(backfill_id));
            }
            return false;
        };
        // Logged when the kind of what it waits for changes, not each time its figures do.
        if self.waiting != Some(reason.kind()) {
            log!("{}: waits for {reason}", who(backfill_id));
        }
        activity::report(&activity::waiting(&reason));
        shared_progress::set_phase(Phase::waiting_for(reason.kind()));
        self.waiting = Some(reason.kind());
        true
    }

    /// What the server's load does to the backfill now, if anything (logged when that changes):
    /// a limit on the active sessions, or the duty cycle.
    pub(super) fn slowed_by_load(&mut self, job: &Job, backfill_id: i64) -> Option<WaitReason> {
        let limit = SourceLimit::ActiveSessions.in_force(job.source.max_active_sessions);
        let slowed = self.load.holding_back(limit).or_else(|| self.duty.holding_back());
        if slowed.is_some() != self.slowed_by_load {
            match &slowed {
                Some(reason) => log!("{}: slows down for {reason}", who(backfill_id)),
                None => log!("{}: back to its full rate, the server's load is down", who(backfill_id)),
            }
            self.slowed_by_load = slowed.is_some();
        }
        slowed
    }

    /// Locks what the next page needs, before its queries take their snapshots (lock.rs): how
    /// its rows are locked, and how many it may have.
    pub(super) fn lock_page(&mut self, relid: pg_sys::Oid) -> (Locking, i32) {
        self.locks.lock_page(relid, self.rows_per_page)
    }

    /// A page delivered `rows` rows in `bytes` of messages (the load counts the rows).
    pub(super) fn delivered(&mut self, rows: i64, bytes: i64) {
        self.load.delivered(rows);
        self.page_rows_delivered = rows;
        // The next pages are sized to the rows of this one: wide rows, small pages.
        if rows > 0 && bytes > 0 {
            let fitting = crate::pg::settings::page_bytes_bound() as f64 * rows as f64 / bytes as f64;
            self.rows_within_bytes = (fitting as i64).clamp(1, i64::from(i32::MAX)) as i32;
        }
    }

    /// A table-locked page of `rows` rows held the table this long: the next are sized to it.
    pub(super) fn table_page_took(&mut self, rows: i32, held: Duration) {
        self.locks.table_page_took(rows, held, self.batch_size);
    }
}
