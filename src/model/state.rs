//! The states of a backfill and of its ranges: closed sets, as the CHECK constraints on
//! `backfill.job.state` and `backfill.job_table.state` have them (sql/catalog.sql). Every
//! change of a backfill's state goes through `catalog::move_job`, of a range's through
//! `ranges::move_range`.
//!
//! ```text
//!                 backfill_pause              backfill_resume
//!   running ──────────────────────► paused ──────────────────► running
//!      │  ╲  worker: every range scanned                          ▲
//!      │   ╰──────────────────────────────► done                  │
//!      │  worker: an error a retry cannot fix                     │
//!      ├──────────────────────────────────► failed ───────────────╯ backfill_resume
//!      │                                                          
//!      ╰── backfill_cancel (also from paused) ──► cancelled
//! ```
//!
//! A running backfill may wait, for its slot's consumer (away, or lagging past max_lag) or for
//! a row lock: it is still running, as a backend waiting on a lock is still active, and
//! `backfill_status.waiting_for` says for what.

use std::fmt;

/// A backfill's state (`backfill.job.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    /// Its workers scan, wait, or are about to start.
    Running,
    /// Stopped by backfill_pause(); no worker, nothing held.
    Paused,
    /// Every range scanned; its last commit is flushed.
    Done,
    /// Stopped for good by backfill_cancel().
    Cancelled,
    /// Stopped by an error a retry cannot fix; backfill_resume() retries from the cursor.
    Failed,
}

impl JobState {
    pub const fn as_str(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Paused => "paused",
            JobState::Done => "done",
            JobState::Cancelled => "cancelled",
            JobState::Failed => "failed",
        }
    }

    /// The state a `backfill.job.state` value names (its CHECK admits no other).
    pub fn parse(state: &str) -> JobState {
        match state {
            "running" => JobState::Running,
            "paused" => JobState::Paused,
            "done" => JobState::Done,
            "cancelled" => JobState::Cancelled,
            _ => JobState::Failed,
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The state of one key range of a table (`backfill.job_table.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeState {
    /// Not started: its upper bound is not fixed yet.
    Pending,
    Running,
    Done,
}

impl RangeState {
    pub const fn as_str(self) -> &'static str {
        match self {
            RangeState::Pending => "pending",
            RangeState::Running => "running",
            RangeState::Done => "done",
        }
    }

    /// The state a `backfill.job_table.state` value names (its CHECK admits no other).
    pub fn parse(state: &str) -> RangeState {
        match state {
            "pending" => RangeState::Pending,
            "running" => RangeState::Running,
            _ => RangeState::Done,
        }
    }
}

/// How a backfill's pages lock (`backfill_start(..., lock_mode => ...)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// The table when no writer is at it, else the page's rows.
    Auto,
    /// Always the page's rows: writers never wait for a page.
    Rows,
    /// Always the table: a page waits for writers (up to backfill.lock_timeout, then retries).
    Table,
}

impl LockMode {
    pub const fn as_str(self) -> &'static str {
        match self {
            LockMode::Auto => "auto",
            LockMode::Rows => "rows",
            LockMode::Table => "table",
        }
    }

    pub fn parse(mode: &str) -> Option<LockMode> {
        match mode {
            "auto" => Some(LockMode::Auto),
            "rows" => Some(LockMode::Rows),
            "table" => Some(LockMode::Table),
            _ => None,
        }
    }
}
