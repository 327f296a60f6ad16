//! What holds a backfill's pages back, as one typed reason: a stable kind, which monitoring
//! and tests match (`backfill_status.waiting_kind`), and figures for people (`waiting_for`).
//! The worker reports it in pg_stat_activity (worker/activity.rs); nothing parses its prose.

use std::fmt;

pub enum WaitReason {
    /// The slot has no consumer connected: the backfill waits for one.
    ConsumerAway { slot: String },
    /// The slot's consumer lags more than max_lag: the backfill waits for it to catch up.
    ConsumerLag { slot: String, lag: i64, limit: i64 },
    /// A physical standby replays more than max_replica_lag behind: pages wait.
    ReplicaLag { standby: String, lag: i64, limit: i64 },
    /// A replication slot retains more WAL than max_retained_wal: pages wait.
    RetainedWal { slot: String, retained: i64, limit: i64 },
    /// More client sessions are active than max_active_sessions: pages slow down (to `rate`
    /// rows/s), and keep slowed while the load recovers.
    Load { active: f64, limit: i64, rate: f64 },
    /// A backfill with no pacing of its own, on a busy server: its workers rest after each page,
    /// so that pages take `percent` of their time (backfill.default_duty_cycle; duty.rs); a
    /// worker goes at `rate` rows/s.
    DutyCycle { active: f64, percent: i32, rate: f64 },
}

impl WaitReason {
    /// The kind, as backfill_status.waiting_kind shows it (row_lock, the view's own, aside).
    pub fn kind(&self) -> &'static str {
        match self {
            WaitReason::ConsumerAway { .. } => "consumer_away",
            WaitReason::ConsumerLag { .. } => "consumer_lag",
            WaitReason::ReplicaLag { .. } => "replica_lag",
            WaitReason::RetainedWal { .. } => "retained_wal",
            WaitReason::Load { .. } | WaitReason::DutyCycle { .. } => "load",
        }
    }
}

impl fmt::Display for WaitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitReason::ConsumerAway { slot } => write!(f, "the consumer of slot \"{slot}\": none is connected"),
            WaitReason::ConsumerLag { slot, lag, limit } => {
                write!(f, "the consumer of slot \"{slot}\": it lags {lag} bytes, more than max_lag {limit}")
            }
            WaitReason::ReplicaLag { standby, lag, limit } => {
                write!(f, "standby \"{standby}\": it replays {lag} bytes behind, more than max_replica_lag {limit}")
            }
            WaitReason::RetainedWal { slot, retained, limit } => {
                write!(f, "WAL retained by slot \"{slot}\": {retained} bytes, more than max_retained_wal {limit}")
            }
            WaitReason::Load { active, limit, rate } if *active > *limit as f64 => write!(
                f,
                "server load: {active:.1} active sessions, more than max_active_sessions {limit}; slowed to {rate:.0} rows/s"
            ),
            WaitReason::Load { active, limit, rate } => write!(
                f,
                "server load: {active:.1} active sessions, at most max_active_sessions {limit}; recovering, at {rate:.0} rows/s"
            ),
            WaitReason::DutyCycle { active, percent, rate } => {
                write!(
                    f,
                    "server load: {active:.1} active sessions; with no pacing option, pages take {percent}% of the \
                     time (backfill.default_duty_cycle)"
                )?;
                if *rate > 0.0 {
                    write!(f, ", at {rate:.0} rows/s")?;
                }
                Ok(())
            }
        }
    }
}
