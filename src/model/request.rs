//! What a caller asks of a backfill: one typed request per verb. Each version's SQL entry point
//! builds its verb's request from the arguments it has (`api/`); the request is checked whole
//! before anything is written, then recorded and launched by one path (`worker/admit.rs`).
//!
//! A new option is a field here, an argument of the newest entry point, and one line in each
//! older entry point's adapter (which leaves it at its default).

use pgrx::prelude::*;

/// The limits a backfill has on the source, as its options say (None: the setting's; -1 in a
/// change: follow the setting again).
#[derive(Clone, Copy, Default)]
pub struct SourceOptions {
    pub max_replica_lag: Option<i64>,
    pub max_retained_wal: Option<i64>,
    pub max_active_sessions: Option<i64>,
}

impl SourceOptions {
    pub fn is_empty(&self) -> bool {
        self.max_replica_lag.is_none() && self.max_retained_wal.is_none() && self.max_active_sessions.is_none()
    }
}

/// backfill_start()'s request, checked (`api/request.rs`): every argument present or defaulted,
/// each in its range, the tables listed once each.
pub struct StartRequest {
    pub tables: Vec<pg_sys::Oid>,
    pub confirm: bool,
    pub batch_size: i32,
    pub rows_per_second: Option<i32>,
    pub slot: Option<String>,
    pub publication: Option<String>,
    pub max_lag: Option<i64>,
    pub parallel: i32,
    pub source: SourceOptions,
    /// Given keys (a JSON array of key objects): only those rows of the one table.
    pub keys: Option<serde_json::Value>,
    /// None: backfill.rows_per_message, read when the backfill is recorded.
    pub rows_per_message: Option<i32>,
    pub filter: Option<String>,
    pub columns: Option<Vec<String>>,
}

impl StartRequest {
    /// The options given, named as backfill_start() names them, that a backfill of a Citus
    /// distributed table may refuse (`citus/rules.rs`).
    pub fn options_given(&self) -> Vec<&'static str> {
        [
            ("filter", self.filter.is_some()),
            ("columns", self.columns.is_some()),
            ("keys", self.keys.is_some()),
            ("max_replica_lag", self.source.max_replica_lag.is_some()),
            ("max_retained_wal", self.source.max_retained_wal.is_some()),
            ("max_active_sessions", self.source.max_active_sessions.is_some()),
            ("rows_per_message", self.rows_per_message.is_some()),
        ]
        .into_iter()
        .filter_map(|(option, given)| given.then_some(option))
        .collect()
    }
}
