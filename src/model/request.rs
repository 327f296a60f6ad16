//! What a caller asks of a backfill: one typed request per verb. Each version's SQL entry point
//! builds its verb's request from the arguments it has (`api/`); the request is checked whole
//! before anything is written, then recorded and launched by one path (`worker/admit.rs`).
//!
//! A start's options are one set (`StartOptions`), whoever starts: backfill_start(), a follow
//! (which stores them), backfill_repair() and a Citus coordinator for its nodes; backfill_set()
//! changes some of them (`SetRequest`). A new option is a field here, an argument of the newest
//! entry point, and one line in each older entry point's adapter (which leaves it at its
//! default).

use crate::model::table;
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
    /// The limits as the SQL functions take them (max_active_sessions an integer).
    pub fn of_arguments(
        max_replica_lag: Option<i64>,
        max_retained_wal: Option<i64>,
        max_active_sessions: Option<i32>,
    ) -> SourceOptions {
        SourceOptions { max_replica_lag, max_retained_wal, max_active_sessions: max_active_sessions.map(i64::from) }
    }

    pub fn is_empty(&self) -> bool {
        self.max_replica_lag.is_none() && self.max_retained_wal.is_none() && self.max_active_sessions.is_none()
    }
}

/// A start's options: its batching, pacing, workers, consumer lag, limits on the source and
/// message format. One set, built from the SQL arguments in one place (api/request.rs) and
/// checked in one (start/options.rs), whoever starts: backfill_start(), a follow (which stores
/// them for every backfill it starts), backfill_repair(), a Citus coordinator for its nodes.
#[derive(Clone, Copy)]
pub struct StartOptions {
    pub batch_size: i32,
    /// None: no limit (0 given).
    pub rows_per_second: Option<i32>,
    pub parallel: i32,
    pub max_lag: Option<i64>,
    pub source: SourceOptions,
    /// None: backfill.rows_per_message, read when the backfill is recorded.
    pub rows_per_message: Option<i32>,
}

/// backfill_set()'s request: the start options a running backfill may change, each None to keep
/// it (max_lag 0, a limit on the source -1: the setting's again).
pub struct SetRequest {
    pub batch_size: Option<i32>,
    pub rows_per_second: Option<i32>,
    pub max_lag: Option<i64>,
    pub source: SourceOptions,
}

/// backfill_start()'s request, checked (`api/request.rs`, `start/options.rs`): every argument
/// present or defaulted, each in its range, the tables listed once each.
pub struct StartRequest {
    pub tables: Vec<pg_sys::Oid>,
    pub confirm: bool,
    pub slot: Option<String>,
    pub publication: Option<String>,
    pub options: StartOptions,
    /// Given keys (a JSON array of key objects): only those rows of the one table.
    pub keys: Option<serde_json::Value>,
    pub filter: Option<String>,
    pub columns: Option<Vec<String>>,
}

/// backfill_start()'s batch_size when none is given (sql/api.sql).
const DEFAULT_BATCH_SIZE: i32 = 1000;

impl StartRequest {
    /// The limits on the source the backfill records: as given, and for a backfill started with
    /// no pacing option (neither rows_per_second nor max_active_sessions),
    /// backfill.default_max_active_sessions where the DBA set one. Otherwise it records no
    /// pacing, and its workers follow the duty cycle of the gentle default (throttle/duty.rs).
    pub fn recorded_source_limits(&self) -> SourceOptions {
        let source = self.options.source;
        let unpaced = self.options.rows_per_second.is_none() && source.max_active_sessions.is_none();
        let default = unpaced.then(crate::pg::settings::default_max_active_sessions).flatten();
        SourceOptions { max_active_sessions: source.max_active_sessions.or(default), ..source }
    }

    /// The statement that starts this request's backfill: the caller's arguments, each as given,
    /// and confirm => true (the hint of a start without it, to paste as it is).
    pub fn confirmed_call(&self) -> String {
        let literal = |text: &str| pgrx::spi::quote_literal(text);
        let names: Vec<String> = self.tables.iter().map(|relid| literal(&table::relation_name(*relid))).collect();
        let tables = match names.as_slice() {
            [one] => one.clone(),
            many => format!("ARRAY[{}]::regclass[]", many.join(", ")),
        };
        let number = |name: &str, value: Option<i64>| value.map(|v| format!("{name} => {v}"));
        let text = |name: &str, value: Option<&str>| value.map(|v| format!("{name} => {}", literal(v)));
        let columns = self.columns.as_ref().map(|columns| {
            let names: Vec<String> = columns.iter().map(|c| literal(c)).collect();
            format!("columns => ARRAY[{}]", names.join(", "))
        });
        let given = &self.options;
        let options = [
            number("batch_size", Some(i64::from(given.batch_size)).filter(|b| *b != i64::from(DEFAULT_BATCH_SIZE))),
            number("rows_per_second", given.rows_per_second.map(i64::from)),
            text("slot", self.slot.as_deref()),
            text("publication", self.publication.as_deref()),
            number("max_lag", given.max_lag),
            number("parallel", Some(i64::from(given.parallel)).filter(|p| *p != 1)),
            number("max_replica_lag", given.source.max_replica_lag),
            number("max_retained_wal", given.source.max_retained_wal),
            number("max_active_sessions", given.source.max_active_sessions),
            text("keys", self.keys.as_ref().map(|k| k.to_string()).as_deref()),
            number("rows_per_message", given.rows_per_message.map(i64::from)),
            text("filter", self.filter.as_deref()),
            columns,
        ];
        let arguments: Vec<String> =
            [Some(tables), Some("confirm => true".into())].into_iter().chain(options).flatten().collect();
        format!("SELECT backfill_start({});", arguments.join(", "))
    }

    /// The options given, named as backfill_start() names them, that a backfill of a Citus
    /// distributed table may refuse (`citus/rules.rs`).
    pub fn options_given(&self) -> Vec<&'static str> {
        [
            ("filter", self.filter.is_some()),
            ("columns", self.columns.is_some()),
            ("keys", self.keys.is_some()),
            ("max_replica_lag", self.options.source.max_replica_lag.is_some()),
            ("max_retained_wal", self.options.source.max_retained_wal.is_some()),
            ("max_active_sessions", self.options.source.max_active_sessions.is_some()),
            ("rows_per_message", self.options.rows_per_message.is_some()),
        ]
        .into_iter()
        .filter_map(|(option, given)| given.then_some(option))
        .collect()
    }
}

/// backfill_compare()'s request, and backfill_repair()'s comparison: every argument present
/// (`call` names the function, for its errors); verification checks the ranges (verify/compare.rs).
pub struct CompareRequest {
    pub call: &'static str,
    pub source: pg_sys::Oid,
    pub target: pg_sys::Oid,
    /// count, aggregate or hash (verify/checksum.rs's Level).
    pub level: String,
    pub passes: i32,
    pub slot: SlotChoice,
    pub columns: Option<Vec<String>>,
    /// backfill_repair() with confirm => true: the comparison is followed by a backfill.
    pub starts_backfill: bool,
}

/// The slot whose consumer a comparison waits for, so that the copy holds every change before
/// each pass.
pub enum SlotChoice {
    /// slot => NULL (the default): the slot of the source's latest backfill that is running,
    /// paused or done, if one has a slot. Never a cancelled or failed backfill's: its consumer
    /// may be long gone, and every pass would wait a minute for it.
    Latest,
    /// slot => '': none (a slot's name is never empty), whatever the source's backfills.
    NoSlot,
    Named(String),
}

impl SlotChoice {
    /// The choice the SQL argument `slot` makes.
    pub fn of_argument(slot: Option<String>) -> SlotChoice {
        match slot {
            None => SlotChoice::Latest,
            Some(slot) if slot.is_empty() => SlotChoice::NoSlot,
            Some(slot) => SlotChoice::Named(slot),
        }
    }
}

/// backfill_checksum()'s request.
pub struct ChecksumRequest {
    pub table: pg_sys::Oid,
    pub ranges: Option<i32>,
    pub level: String,
    /// The ranges of another checksum (a JSON array of upper bounds), to compare two tables.
    pub bounds: Option<serde_json::Value>,
    pub columns: Option<Vec<String>>,
}
