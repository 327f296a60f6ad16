//! The gentle default: a backfill with no pacing of its own (neither rows_per_second nor
//! max_active_sessions) works a bounded share of its time while the server is busy.
//!
//! After each page, its worker rests for a multiple of the page's own time (gh-ost's
//! `--nice-ratio`): at a duty cycle of 15% (the default), 85/15 = about 5.7 times as long as
//! the page took. (It was 20%, then 15%, while a page's time was its wall time, then 12. With the worker's waits
//! for a CPU left out, 7 moved under 8,500 rows/s on a slower 2-core host, and 10, in the same
//! pgbench runs, kept 0.95 and 0.91 of its TPS at 4 and 16 clients, grew its p99 by 22% at 4 and
//! moved 12,324 and 10,991 rows/s. With the walsender's waits for a CPU left out too, and rests
//! between a page's queries, 12 kept 0.94 and 0.91 of pgbench's TPS at 4 and 16 clients, grew its
//! p99 by 26% at 4 and moved 11,525 and 11,120 rows/s. With the wait for the walsender's first
//! look put off (a sixth fewer wake-ups a page), 15 kept 0.93 and 0.91 of pgbench's TPS at 4
//! and 16 clients, grew its p99 by 19% at 4 and moved 10,667 and 8,446 rows/s, where in one
//! run 12 and 15 had kept 0.88 and 0.91 at 4 clients, grown the p99 by 31% and 23%, and moved
//! 8,503 and 11,972 rows/s. With a pipeline's page flushed after the walsender's first look
//! and the walsender's CPU time counted, 15 kept 0.95 and 0.92 in one run, grew the p99 by 16%
//! and moved 13,873 and 10,262 rows/s, where the code before kept 0.94 and 0.87, grew it by 22%
//! and moved 12,483 and 9,198; bench/README.md.)
//! The page's time is its wall time less what the worker waited for a CPU (the scheduler's
//! runqueue, [`waited_for_cpu`]), so it counts what the page cost the server and what the
//! server made it wait for a lock, and, for a pipeline's backfill, what the slot's walsender ran
//! on a CPU until it had decoded and sent the page ([`wait_until_sent`]): the decoding is the
//! page's cost too, paid by another process (left out, the rests bounded only the worker's
//! share, and on 2 cores pgbench paid for the walsender's: bench/README.md). A wait for a CPU
//! is not, the worker's or the walsender's: counted, a saturated server's backfill rested
//! for as long as other processes held the CPUs and slowed to two thirds of its rate as pgbench
//! went from 4 clients to 16. While it rests, its pages are short (200 rows at most), and it
//! rests within a page too, after every [`WORK_SLICE`] of it, between the page's queries (its
//! reads of the backfill, the slot and the table, which are most of a page's work) as between
//! its rows, so that the application meets the backfill as a little work often, not a burst:
//! what the application's latency feels is how long the backfill holds a CPU at a time, more
//! than how much of it (bench/README.md: a process busy 20% of the time added 84% to pgbench's
//! p99 latency in bursts of 2.5 ms, and 9% in bursts of 50 µs).
//! The busier the server, the longer each page's wall time; its rests follow the work in it.
//! The backfill's share of a core and of the WAL written is then at most the duty cycle, however
//! many sessions are active (its row locks are held through the rests within a page: a few milliseconds a page), and it still
//! moves at that share of its speed; a session count only says whether anyone is there to be
//! disturbed. On an idle server it does not rest at all.

use crate::pg::settings;
use crate::throttle::pacing::{sleep, LONGEST_SLEEP};
use crate::throttle::wait::WaitReason;
use pgrx::pg_sys;
use std::time::{Duration, Instant};

/// The server is busy while more client sessions than this are active, on average over about a
/// second (backpressure.rs counts them): a session at work most of the time, not a psql session
/// that looks at backfill_status now and then.
pub const BUSY_ABOVE: f64 = 0.5;

/// How much of the last cycle's rate the rate shown keeps: smoothed over a few pages.
const SMOOTHING: f64 = 0.8;

/// The longest a page's time waits for the slot's walsender to send it: a consumer that lags
/// far behind is the pipeline's wait (pipeline.rs, max_lag_bytes), not the page's cost.
const LONGEST_SEND_WAIT: Duration = Duration::from_secs(1);

/// How often the wait for the walsender looks at its position: finely at first, as a short page
/// is sent within a millisecond or two (a latch wait's millisecond would be most of the page's
/// time, and four times that its rest), then once a millisecond.
const SEND_WAIT_FINE_STEP: Duration = Duration::from_micros(50);
const SEND_WAIT_FINE_FOR: Duration = Duration::from_millis(5);
const SEND_WAIT_STEP: Duration = Duration::from_millis(1);

/// The wait's first look comes after this share of the last page's wait: resting pages are of
/// about the same size, so until then the walsender is still sending, and a look would only
/// cost the worker a sleep and a wake-up (each look is both, and on 2 cores a wake-up is about
/// as dear as a page's query: bench/README.md). Less than the whole, so that a page sent sooner
/// than the last is seen soon after it is, and the next page's first look comes sooner still.
const SEND_WAIT_FIRST_LOOK_SHARE: f64 = 0.75;

/// The most rows of a page while the worker rests: the application's transactions then meet
/// short pages, each a little of the backfill's work, rather than a few meeting a long one
/// (pgbench at 4 clients, bench/README.md: pages of 1,000 rows grew its p99 latency by about
/// 60%, pages of 200 by about 20%, at the same duty cycle). A DBA's smaller batch_size stays.
pub const RESTING_PAGE_ROWS: i32 = 200;

/// The longest a resting worker works within a page before it rests for its share of that
/// work: between a page's rows, when the page holds no table lock (a table-locked page makes
/// writers wait for it, and is kept as short as it can be).
pub const WORK_SLICE: Duration = Duration::from_micros(100);

/// The longest rest within a page: what a slice's share asks beyond it is rested after the page.
/// A page holds its row locks through its rests; a writer of one of its rows waits for them, so
/// they stay short (at 10%, a slice's rest is 0.9 ms; at 1% it would be 10 ms).
pub const LONGEST_REST_WITHIN_PAGE: Duration = Duration::from_millis(1);

pub struct DutyCycle {
    /// The share of its time the worker may work now (from backfill.default_duty_cycle); None
    /// while it need not rest (a backfill with pacing of its own, an idle server).
    share: Option<f64>,
    /// The active sessions that made the server busy, for waiting_for.
    active: f64,
    /// The slot of the backfill's pipeline, whose walsender decodes each page.
    slot: Option<String>,
    /// When the page under way began (the worker's turn came).
    page_began: Instant,
    /// When the worker's present stretch of work began: its page's start, or the end of its
    /// last rest within the page.
    working_since: Instant,
    /// How long the worker had waited for a CPU when that stretch began (None: the kernel does
    /// not say, and a stretch's time is its wall time).
    waited_for_cpu_since: Option<Duration>,
    /// The rest the page's slices asked for beyond [`LONGEST_REST_WITHIN_PAGE`]: rested after it.
    owed: Duration,
    /// How long the last page waited for the walsender to send it (its wall time).
    last_send_wait: Duration,
    /// Until when the worker rests after its last page.
    rest_until: Instant,
    /// The worker's rate over its last pages and rests (rows/s, smoothed); 0 before the first.
    rate: f64,
}

impl DutyCycle {
    pub fn new() -> Self {
        let now = Instant::now();
        DutyCycle {
            share: None,
            active: 0.0,
            slot: None,
            page_began: now,
            working_since: now,
            waited_for_cpu_since: None,
            owed: Duration::ZERO,
            last_send_wait: Duration::ZERO,
            rest_until: now,
            rate: 0.0,
        }
    }

    /// Follows the backfill and the server as they are now: `gentle` for a backfill with no
    /// pacing of its own, `active` the sessions counted (None: not counted), `slot` its
    /// pipeline's.
    pub fn follow(&mut self, gentle: bool, active: Option<f64>, slot: Option<&str>) {
        if self.slot.as_deref() != slot {
            self.slot = slot.map(str::to_owned);
        }
        let busy = active.filter(|active| *active > BUSY_ABOVE);
        self.share = if gentle { busy.and(settings::default_duty_cycle()) } else { None };
        match (self.share, busy) {
            (Some(_), Some(active)) => self.active = active,
            // No longer resting (backfill_set() gave it pacing of its own, the server is idle):
            // the next page goes at once.
            _ => self.rest_until = Instant::now(),
        }
    }

    /// Whether the worker's rest is over; if not, rests toward its end (at most
    /// [`LONGEST_SLEEP`]) and tells whether it is over after that.
    pub fn rested(&mut self) -> bool {
        let left = self.rest_until.saturating_duration_since(Instant::now());
        if !left.is_zero() {
            // Whole milliseconds, rounded up (a latch wait's unit): the rest is then over.
            sleep(Duration::from_millis(left.as_millis() as u64 + 1).min(LONGEST_SLEEP));
        }
        Instant::now() >= self.rest_until
    }

    /// Whether the worker rests after its pages now.
    pub fn resting(&self) -> bool {
        self.share.is_some()
    }

    /// The most rows the next page may have: [`RESTING_PAGE_ROWS`] while the worker rests.
    pub fn page_limit(&self) -> i32 {
        if self.resting() {
            RESTING_PAGE_ROWS
        } else {
            i32::MAX
        }
    }

    /// The worker's turn came: its page begins now.
    pub fn page_begins(&mut self) {
        self.page_began = Instant::now();
        self.stretch_begins(self.page_began);
        self.owed = Duration::ZERO;
    }

    /// A stretch of work begins at `now`: the page's start, or the end of a rest within it.
    fn stretch_begins(&mut self, now: Instant) {
        self.working_since = now;
        // Read only while resting: a page that will not rest needs no time of its own.
        self.waited_for_cpu_since = self.share.and_then(|_| waited_for_cpu());
    }

    /// What the present stretch of work took: its time, less what the worker waited for a CPU
    /// in it (the scheduler's, not the page's: see the module's doc).
    fn stretch_worked(&self) -> Duration {
        let wall = self.working_since.elapsed();
        match (self.waited_for_cpu_since, waited_for_cpu()) {
            (Some(before), Some(now)) => wall.saturating_sub(now.saturating_sub(before)),
            _ => wall,
        }
    }

    /// Within a page that holds no table lock: once the worker has worked [`WORK_SLICE`] since
    /// its last rest, rests for its share of that work (at most [`LONGEST_REST_WITHIN_PAGE`],
    /// the rest after the page). It shows as an `Extension` wait in pg_stat_activity, as its
    /// rests between pages do.
    pub fn rest_within_page(&mut self) {
        let Some(share) = self.share else { return };
        // The slice is of wall time (a cheap clock read between rows); its rest, of the work.
        if self.working_since.elapsed() < WORK_SLICE {
            return;
        }
        let worked = self.stretch_worked();
        let due = worked.mul_f64((1.0 - share) / share);
        let rest = due.min(LONGEST_REST_WITHIN_PAGE);
        self.owed += due - rest;
        // On the clock, not the latch: a latch wait's unit, the millisecond, would be several
        // times the work before it. A cancel or a signal waits at most that long.
        // SAFETY: this process's own wait event, set and cleared around the wait as
        // pgstat_report_wait_start() and pgstat_report_wait_end() do (static inline in C).
        unsafe { std::ptr::write_volatile(pg_sys::my_wait_event_info, pg_sys::PG_WAIT_EXTENSION) };
        std::thread::sleep(rest);
        // SAFETY: as above.
        unsafe { std::ptr::write_volatile(pg_sys::my_wait_event_info, 0) };
        pg_sys::check_for_interrupts!();
        self.stretch_begins(Instant::now());
    }

    /// A page that delivered `rows` rows ended (its lock may have given it fewer rows than it
    /// asked for): the worker rests for its share of the page's time since its last rest, and
    /// what its rests within the page left owing.
    pub fn page_delivered(&mut self, rows: i64) {
        let Some(share) = self.share else { return };
        let mut worked = self.stretch_worked();
        // Pages commit without waiting for their WAL to reach the disk (worker/process.rs). A
        // resting worker sees that its page's WAL is flushed: a walsender sends only flushed WAL,
        // and the application's next commits would otherwise wait for it. The flush's wait is
        // not counted in the page's time: it is the disk's latency, about the same for a page of
        // 200 rows as of 1,000 (one fsync), and counted, it made a short page's rest several
        // times what its work called for (bench/README.md).
        let flushing = match &self.slot {
            Some(slot) => {
                // (Never more than the fine looks' span: a wait stretched by a stalled walsender
                // says nothing of how long the next page takes to send.)
                let first_look = self.last_send_wait.mul_f64(SEND_WAIT_FIRST_LOOK_SHARE).min(SEND_WAIT_FINE_FOR);
                let sent = wait_until_sent(slot, first_look);
                self.last_send_wait = sent.wall;
                worked += sent.decoding;
                sent.flushing
            }
            None => timed_flush_of_last_commit(),
        };
        let rest = worked.mul_f64((1.0 - share) / share) + std::mem::take(&mut self.owed);
        self.rest_until = Instant::now() + rest;
        // The page's whole cycle: its work and its rests, within it and after it.
        let cycle =
            (self.page_began.elapsed().saturating_sub(flushing) + rest).max(Duration::from_micros(1)).as_secs_f64();
        let rate = rows as f64 / cycle;
        self.rate = if self.rate == 0.0 { rate } else { SMOOTHING * self.rate + (1.0 - SMOOTHING) * rate };
    }

    /// What the duty cycle does to the backfill now, for backfill_status.waiting_for; None
    /// while the worker does not rest.
    pub fn holding_back(&self) -> Option<WaitReason> {
        let share = self.share?;
        Some(WaitReason::DutyCycle { active: self.active, percent: (share * 100.0).round() as i32, rate: self.rate })
    }
}

/// How long this process has waited for a CPU since it started: the kernel's runqueue wait
/// (`/proc/thread-self/schedstat`; a background worker is a process of one thread). The file
/// stays open, read from its start each time (one pread, about a microsecond). None where the
/// kernel does not keep it (built without schedstats).
fn waited_for_cpu() -> Option<Duration> {
    thread_local! {
        static SCHEDSTAT: Option<std::fs::File> = std::fs::File::open("/proc/thread-self/schedstat").ok();
    }
    SCHEDSTAT.with(|file| Some(schedstat(file.as_ref()?)?.waited_for_cpu))
}

/// The `schedstat` file of process `pid` (a walsender is a process of one thread), for
/// [`schedstat`]; None if it is gone. Held open across a wait, it stays that process's: a
/// pid reused meanwhile is another file.
fn process_schedstat(pid: i32) -> Option<std::fs::File> {
    std::fs::File::open(format!("/proc/{pid}/schedstat")).ok()
}

/// What a `schedstat` file says of its process since it started (the kernel's
/// Documentation/scheduler/sched-stats.rst: its first two fields, in nanoseconds).
struct Schedstat {
    /// The time it ran on a CPU.
    on_cpu: Duration,
    /// The time it waited for one (the runqueue).
    waited_for_cpu: Duration,
}

fn schedstat(file: &std::fs::File) -> Option<Schedstat> {
    use std::os::unix::fs::FileExt;
    let mut text = [0u8; 96];
    let read = file.read_at(&mut text, 0).ok()?;
    let mut fields = std::str::from_utf8(&text[..read]).ok()?.split_whitespace();
    let mut nanoseconds = || fields.next()?.parse().ok().map(Duration::from_nanos);
    Some(Schedstat { on_cpu: nanoseconds()?, waited_for_cpu: nanoseconds()? })
}

/// Flushes this process's last commit ([`crate::pg::wal::flush_last_commit`]), and tells how
/// long that took.
fn timed_flush_of_last_commit() -> Duration {
    let before = Instant::now();
    crate::pg::wal::flush_last_commit();
    before.elapsed()
}

/// A wait for the walsender: how long it took, what the walsender ran meanwhile (its decoding:
/// the page's time), and how long the page's flush took in it.
struct SendWait {
    wall: Duration,
    decoding: Duration,
    flushing: Duration,
}

/// Waits until the walsender streaming `slot` has sent this process's last commit, at most
/// [`LONGEST_SEND_WAIT`], looking first after `first_look` (if it streams the slot); at once
/// while no walsender streams the slot.
///
/// The commit's WAL is flushed after that first look, not before it: by then a commit of the
/// application's has usually flushed it along with its own, and the page costs the disk no
/// fsync of its own. Flushed at once, each page's fsync came between the application's: at
/// the same duty cycle, pgbench at 4 clients kept 0.95 of its TPS with the flush put off and
/// 0.82 without, and its p99 grew by 16% against 49% (bench/README.md). Where nobody else
/// commits, the worker's own flush comes after the look all the same; the look then grows
/// with the wait it delays, up to [`SEND_WAIT_FINE_FOR`]: at most that much idle a page, with
/// nobody's commits for a page's fsync to come between.
///
/// What of the wait is the page's time is the walsender's CPU time meanwhile: decoding and
/// sending the page is the page's cost, paid by another process, where the walsender's sleeps
/// (until the WAL is flushed, until it is woken) and its waits for a CPU cost the server nothing
/// (where the kernel does not say, the wait's wall time, less its flush).
fn wait_until_sent(slot: &str, first_look: Duration) -> SendWait {
    // SAFETY: XactLastCommitEnd is this process's own: the end of its last commit record.
    let commit_end = unsafe { pg_sys::XactLastCommitEnd };
    let began = Instant::now();
    let sender = crate::pg::wal::slot_user_pid(slot).and_then(process_schedstat);
    let sender_ran_before = sender.as_ref().and_then(schedstat).map(|stat| stat.on_cpu);
    if sender.is_some() && !first_look.is_zero() {
        std::thread::sleep(first_look);
        pg_sys::check_for_interrupts!();
    }
    let flushing = timed_flush_of_last_commit();
    while crate::pg::wal::slot_sent_lsn(slot).is_some_and(|sent| sent < commit_end)
        && began.elapsed() < LONGEST_SEND_WAIT
    {
        if began.elapsed() < SEND_WAIT_FINE_FOR {
            std::thread::sleep(SEND_WAIT_FINE_STEP);
            pg_sys::check_for_interrupts!();
        } else {
            sleep(SEND_WAIT_STEP);
        }
    }
    let wall = began.elapsed();
    // (A walsender that exited meanwhile reads as nothing: the wall time, less the flush.)
    let decoding = match (sender_ran_before, sender.as_ref().and_then(schedstat)) {
        (Some(before), Some(now)) => now.on_cpu.saturating_sub(before),
        _ => wall.saturating_sub(flushing),
    };
    SendWait { wall, decoding, flushing }
}
