//! Back-pressure from the whole source, beyond the backfill's own slot (see pipeline.rs): the
//! replay lag of physical standbys and the WAL retained by replication slots pause a backfill's
//! pages; the server's load slows them. Each limit is a setting that a backfill's option
//! overrides (NULL: the setting; 0: off).

use crate::catalog::job::SourceOptions;
use crate::pg::encoding::Text;
use crate::pg::errors::OrInternal;
use crate::pg::settings;
use crate::throttle::wait::WaitReason;
use pgrx::prelude::*;
use std::time::{Duration, Instant};

#[derive(Clone, Copy)]
pub enum SourceLimit {
    /// Bytes a physical standby may replay behind this primary.
    ReplicaLag,
    /// Bytes of WAL any replication slot may retain.
    RetainedWal,
    /// Client sessions that may be active before the backfill slows down.
    ActiveSessions,
}

impl SourceLimit {
    fn named(name: &str) -> Option<Self> {
        match name {
            "max_replica_lag" => Some(SourceLimit::ReplicaLag),
            "max_retained_wal" => Some(SourceLimit::RetainedWal),
            "max_active_sessions" => Some(SourceLimit::ActiveSessions),
            _ => None,
        }
    }

    /// The setting, in the option's unit (bytes, sessions); None when it is off.
    fn setting(self) -> Option<i64> {
        let value = match self {
            SourceLimit::ReplicaLag => settings::max_replica_lag_bytes(),
            SourceLimit::RetainedWal => settings::max_retained_wal_bytes().unwrap_or_else(|| {
                // SAFETY: a GUC variable of the server, read in the process that owns it.
                match unsafe { pg_sys::max_slot_wal_keep_size_mb } {
                    // Half: a slot at the limit then still has the other half before the
                    // server invalidates it, for what everything else writes meanwhile.
                    keep if keep > 0 => i64::from(keep) * 1024 * 1024 / 2,
                    _ => 0,
                }
            }),
            SourceLimit::ActiveSessions => settings::max_active_sessions(),
        };
        (value > 0).then_some(value)
    }

    /// The limit in force for a backfill with this option. An option can only tighten the
    /// setting, which protects the whole server and is the DBA's: the smaller of the two is in
    /// force, and 0 (off) turns a limit off only where the setting is off.
    pub fn in_force(self, option: Option<i64>) -> Option<i64> {
        let setting = self.setting();
        match option {
            None | Some(0) => setting,
            Some(value) => Some(setting.map_or(value, |setting| setting.min(value))),
        }
    }
}

/// The limit in force, for the status view: `setting` is the option's name.
#[pg_extern(schema = "backfill", stable)]
fn source_limit(setting: Option<Text>, option: Option<i64>) -> Option<i64> {
    SourceLimit::named(&setting?.0).and_then(|limit| limit.in_force(option))
}

/// Why pages must wait for the source now, if they must: a standby replaying too far behind,
/// or a slot retaining too much WAL. Read without a transaction id, so waiting writes nothing.
pub fn blocker(options: &SourceOptions, own_slot: Option<&str>) -> Option<WaitReason> {
    if let Some(limit) = SourceLimit::ReplicaLag.in_force(options.max_replica_lag) {
        // Physical walsenders connect to no database. A standby that has not reported a replay
        // position yet is judged by what it flushed. The lag is counted from the insert
        // position, not from what is written: pages commit asynchronously, and since 17 the WAL
        // writer is woken only once wal_writer_flush_after (1 MB) is unwritten, so the written
        // position trailed this worker's own WAL by up to that much, and pages went on that far
        // past the limit.
        let furthest = two_columns(
            "SELECT r.application_name,
                    pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_insert_lsn(), coalesce(r.replay_lsn, r.flush_lsn))::bigint
               FROM pg_catalog.pg_stat_replication r
               JOIN pg_catalog.pg_stat_activity a ON a.pid OPERATOR(pg_catalog.=) r.pid
              WHERE a.datid IS NULL AND coalesce(r.replay_lsn, r.flush_lsn) IS NOT NULL
              ORDER BY 2 DESC LIMIT 1",
            None,
        );
        if let Some((standby, lag)) = furthest.filter(|(_, lag)| *lag > limit) {
            return Some(WaitReason::ReplicaLag { standby, lag, limit });
        }
    }
    if let Some(limit) = SourceLimit::RetainedWal.in_force(options.max_retained_wal) {
        // The backfill's own slot is its consumer's, held to max_lag (pipeline.rs): its
        // restart_lsn moves only at running-transactions records, which a backfill alone on a
        // quiet server would wait for. (From the WAL inserted: see pipeline.rs.)
        let greediest = two_columns(
            "SELECT slot_name::pg_catalog.text, pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_insert_lsn(), restart_lsn)::bigint
               FROM pg_catalog.pg_replication_slots
              WHERE restart_lsn IS NOT NULL
                AND (slot_name::pg_catalog.text OPERATOR(pg_catalog.=) $1
                     AND database OPERATOR(pg_catalog.=) pg_catalog.current_database()) IS NOT TRUE
              ORDER BY 2 DESC LIMIT 1",
            own_slot,
        );
        if let Some((slot, retained)) = greediest.filter(|(_, retained)| *retained > limit) {
            return Some(WaitReason::RetainedWal { slot, retained, limit });
        }
    }
    None
}

/// The first row of a query of a name and a number, if any.
fn two_columns(sql: &str, parameter: Option<&str>) -> Option<(String, i64)> {
    Spi::connect(|client| {
        let rows = client.select(sql, Some(1), &[parameter.map(Text::from).into()])?;
        if rows.is_empty() {
            return Ok::<_, pgrx::spi::Error>(None);
        }
        let row = rows.first();
        Ok(Some((row.get::<Text>(1)?.map(|t| t.0).unwrap_or_default(), row.get::<i64>(2)?.unwrap_or(0))))
    })
    .or_internal("read the source's replication state")
}

/// How often a worker counts the active sessions.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// How long the count of active sessions is averaged over: long enough that a burst of a busy
/// but not overloaded application does not count, short enough to follow a load spike.
const SMOOTHING: Duration = Duration::from_secs(1);
/// Over the limit, a worker's rate halves this often...
const HALVES_EVERY: Duration = Duration::from_millis(500);
/// ... and under it, it climbs back linearly, to what it was in this long.
const RECOVERS_IN: Duration = Duration::from_secs(10);

/// Adapts a worker's rate to the server's load: multiplicative decrease while more client
/// sessions are active than the limit, gradual recovery after, as TCP does with congestion.
pub struct LoadGovernor {
    /// The active client sessions, smoothed over a few samples.
    active: f64,
    /// The rate the load holds this worker to (rows/s); None while it does not.
    cap: Option<f64>,
    /// The worker's rate while the load does not hold it back (smoothed): where recovery ends.
    free_rate: f64,
    rows_since_sample: i64,
    last_sample: Instant,
    /// The duty cycle's first count: its looks so far, the sessions they found, and the last
    /// one's time.
    first_looks: u32,
    first_total: i64,
    first_look_at: Instant,
}

impl LoadGovernor {
    pub fn new() -> Self {
        // The first look is at once.
        let last_sample = Instant::now().checked_sub(SAMPLE_EVERY).unwrap_or_else(Instant::now);
        LoadGovernor {
            active: f64::NAN,
            cap: None,
            free_rate: 0.0,
            rows_since_sample: 0,
            last_sample,
            first_looks: 0,
            first_total: 0,
            first_look_at: last_sample,
        }
    }

    pub fn delivered(&mut self, rows: i64) {
        self.rows_since_sample += rows;
    }

    /// The rate the load allows this worker now (None: any), given the limit in force, the
    /// worker's share of its pacing and the slowest it may go (`floor`: one page a second, so
    /// that a busy server still sees the backfill progress). Samples the load at most every
    /// [`SAMPLE_EVERY`]: with a limit, or when `watched` (the duty cycle reads it: duty.rs).
    pub fn allowed_rate(&mut self, limit: Option<i64>, watched: bool, paced: Option<f64>, floor: f64) -> Option<f64> {
        if watched && limit.is_none() && self.first_looks < FIRST_COUNT_LOOKS {
            self.count_first();
            return None;
        }
        let elapsed = self.last_sample.elapsed();
        if elapsed < SAMPLE_EVERY {
            return self.cap.filter(|_| limit.is_some());
        }
        let seconds = elapsed.as_secs_f64();
        let achieved = self.rows_since_sample as f64 / seconds;
        self.rows_since_sample = 0;
        self.last_sample = Instant::now();
        // What the worker does when nothing holds it back is where a recovery ends: learnt
        // whether a limit is set or not (it may be set later), and not while it waits.
        if self.cap.is_none() && paced.is_none() && achieved > 0.0 {
            self.free_rate = if self.free_rate == 0.0 { achieved } else { 0.8 * self.free_rate + 0.2 * achieved };
        }
        if limit.is_some() || watched {
            let weight = 1.0 - (-seconds / SMOOTHING.as_secs_f64()).exp();
            self.active = if self.active.is_nan() {
                // Under a limit, the first look is the average: a worker that starts on a server
                // past the DBA's limit starts slow. (The duty cycle's first count: count_first.)
                active_sessions() as f64
            } else {
                self.active + weight * (active_sessions() as f64 - self.active)
            };
        } else {
            self.active = f64::NAN;
            // Watched again later, the duty cycle counts afresh.
            self.first_looks = 0;
            self.first_total = 0;
        }
        let Some(limit) = limit else {
            self.cap = None;
            return None;
        };
        let floor = paced.map_or(floor, |paced| floor.min(paced));
        let ceiling = paced.unwrap_or(self.free_rate).max(floor);
        // (A worker that slept through a long pacing wait adapts as if for one second.)
        let seconds = seconds.min(1.0);
        self.cap = if self.active > limit as f64 {
            let from = self.cap.unwrap_or(ceiling);
            Some((from * 0.5f64.powf(seconds / HALVES_EVERY.as_secs_f64())).max(floor))
        } else if let Some(cap) = self.cap {
            let raised = cap + ceiling * seconds / RECOVERS_IN.as_secs_f64();
            (raised < ceiling).then_some(raised)
        } else {
            None
        };
        self.cap
    }

    /// The duty cycle's first count: the mean of [`FIRST_COUNT_LOOKS`] looks, not one, since one
    /// look may catch a session at work for a moment (a monitor's query, the starter's own), and
    /// resting for it cost an idle server's backfill a tenth of its speed (measured,
    /// bench/README.md). The looks are taken as the worker goes, [`FIRST_COUNT_STEP`] apart,
    /// never waited for: until the last, the count is the mean of the looks so far, and the
    /// worker rests or not by it. Waited for, 80 ms before its first page, they cost an idle
    /// server's backfill of 1M rows 2% of its time; now its first look finds no session at work
    /// and its pages go at once, and one that caught a monitor's query rests until the next look.
    /// Then the average follows each look, every [`SAMPLE_EVERY`].
    fn count_first(&mut self) {
        if self.first_looks > 0 && self.first_look_at.elapsed() < FIRST_COUNT_STEP {
            return;
        }
        self.first_total += active_sessions();
        self.first_looks += 1;
        self.first_look_at = Instant::now();
        self.active = self.first_total as f64 / f64::from(self.first_looks);
        // The average's next look is a sample's time after the count's last.
        self.last_sample = self.first_look_at;
        self.rows_since_sample = 0;
    }

    /// The active client sessions, averaged over about a second; None while they are not
    /// counted (neither a limit nor the duty cycle reads them).
    pub fn active(&self) -> Option<f64> {
        (!self.active.is_nan()).then_some(self.active)
    }

    /// What the load does to the backfill now, for backfill_status.waiting_for; None when the
    /// load does not hold it back.
    pub fn holding_back(&self, limit: Option<i64>) -> Option<WaitReason> {
        let (rate, limit) = (self.cap?, limit?);
        Some(WaitReason::Load { active: self.active, limit, rate })
    }
}

/// The looks of the duty cycle's first count, [`FIRST_COUNT_STEP`] apart.
const FIRST_COUNT_LOOKS: u32 = 5;
const FIRST_COUNT_STEP: Duration = Duration::from_millis(20);

/// Client sessions running a statement now, this one aside (a worker is not a client backend),
/// and those sleeping in an extension's wait, as backfill_wait() does, which cost nothing.
fn active_sessions() -> i64 {
    crate::pg::spi::select_one::<i64>(
        "SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_get_activity(NULL) a
          WHERE a.backend_type OPERATOR(pg_catalog.=) 'client backend' AND a.state OPERATOR(pg_catalog.=) 'active'
            AND (a.wait_event_type OPERATOR(pg_catalog.=) 'Extension') IS NOT TRUE",
        &[],
    )
    .or_internal("count the active sessions")
    .unwrap_or(0)
}
