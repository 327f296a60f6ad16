//! The requests of the SQL functions, built from their arguments and checked before anything
//! else runs: every argument present or defaulted, each in its range. What needs the tables
//! (their keys, rights, publication) is checked next, by the verb, still before any write.

use crate::model::request::{SourceOptions, StartRequest};
use crate::model::table;
use crate::pg::args::{check_batch_size, check_rate, check_rows_per_message, require_primary, required};
use crate::pg::compat;
use crate::pg::encoding::Text;
use crate::pg::errors::raise;
use pgrx::prelude::*;
use pgrx::JsonB;
use pgrx::PgSqlErrorCode::*;

const MAX_PARALLEL: i32 = 16;

/// backfill_start()'s arguments as an entry point receives them. Each version's entry point
/// fills those it has; the others keep their defaults (`..StartArgs::default()`).
#[derive(Default)]
pub struct StartArgs {
    pub tables: Option<Vec<Option<pg_sys::Oid>>>,
    pub confirm: Option<bool>,
    pub batch_size: Option<i32>,
    pub rows_per_second: Option<i32>,
    pub slot: Option<Text>,
    pub publication: Option<Text>,
    pub max_lag: Option<i64>,
    pub parallel: Option<i32>,
    pub max_replica_lag: Option<i64>,
    pub max_retained_wal: Option<i64>,
    pub max_active_sessions: Option<i32>,
    pub keys: Option<JsonB>,
    pub rows_per_message: Option<i32>,
    pub filter: Option<Text>,
    pub columns: Option<Vec<Option<Text>>>,
}

/// The request of `args`, checked; an argument out of range is an error naming it.
pub fn start_request(args: StartArgs) -> StartRequest {
    const CALL: &str = "backfill_start";
    require_primary("start a backfill");
    let publication = args.publication.map(|t| t.0);
    let request = StartRequest {
        tables: table_list(args.tables, publication.as_deref()),
        confirm: required(args.confirm, CALL, "confirm"),
        batch_size: required(args.batch_size, CALL, "batch_size"),
        // 0: no limit, as in backfill_set() (check_rate refuses a negative rate below).
        rows_per_second: args.rows_per_second.filter(|rate| *rate != 0),
        // Text, not String: names in the database's encoding, converted (see encoding.rs).
        slot: args.slot.map(|t| t.0),
        publication,
        max_lag: args.max_lag,
        parallel: required(args.parallel, CALL, "parallel"),
        source: SourceOptions {
            max_replica_lag: args.max_replica_lag,
            max_retained_wal: args.max_retained_wal,
            max_active_sessions: args.max_active_sessions.map(i64::from),
        },
        keys: args.keys.map(|keys| keys.0),
        rows_per_message: args.rows_per_message,
        filter: args.filter.map(|t| t.0),
        columns: crate::selection::columns::given(args.columns),
    };
    check_options(&request, args.rows_per_second);
    request
}

/// The pacing and batching options of `request` (backfill_start()'s, or a follow's for every
/// backfill it starts), each in its range; `rows_per_second` as given (0 is no limit); and a
/// server that decodes them.
pub fn check_options(request: &StartRequest, rows_per_second: Option<i32>) {
    check_batch_size(request.batch_size);
    check_parallel(request.parallel);
    check_rate(rows_per_second);
    if let Some(rows_per_message) = request.rows_per_message {
        check_rows_per_message(rows_per_message);
    }
    check_source_limits(&request.source);
    check_max_lag(request.max_lag, request.slot.is_some());
    require_logical_decoding();
}

fn check_parallel(parallel: i32) {
    if !(1..=MAX_PARALLEL).contains(&parallel) {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            format!("parallel {parallel} is out of range"),
            format!("parallel is the number of workers and must be between 1 and {MAX_PARALLEL}."),
            Some("Each worker is a background worker: mind max_worker_processes.".into()),
        );
    }
}

/// max_lag limits how far a slot's consumer may lag: it needs a slot, and a positive value.
fn check_max_lag(max_lag: Option<i64>, has_slot: bool) {
    if max_lag.is_some() && !has_slot {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            "max_lag needs a slot",
            "max_lag limits how far the slot's consumer may lag; no slot was given.",
            Some("Name the consumer's slot: slot => 'my_slot'.".into()),
        );
    }
    if let Some(lag) = max_lag.filter(|lag| *lag <= 0) {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            format!("max_lag {lag} is out of range"),
            "max_lag is in bytes and must be positive.",
            Some("Pass NULL (the default) for backfill.max_slot_lag.".into()),
        );
    }
}

/// The limits on the source of backfill_start() and backfill_set(): positive to tighten the
/// setting, 0 to turn a limit off where the setting is off, -1 to follow the setting.
pub fn check_source_limits(options: &SourceOptions) {
    for (name, value, unit) in [
        ("max_replica_lag", options.max_replica_lag, "bytes"),
        ("max_retained_wal", options.max_retained_wal, "bytes"),
        ("max_active_sessions", options.max_active_sessions, "active sessions"),
    ] {
        if let Some(value) = value.filter(|v| *v < -1) {
            raise(
                ERRCODE_INVALID_PARAMETER_VALUE,
                format!("{name} {value} is out of range"),
                format!(
                    "{name} is in {unit}: positive to tighten backfill.{name}, 0 to turn the limit off where \
                     the setting is off, -1 to follow the setting."
                ),
                Some("Pass NULL to keep the current value.".into()),
            );
        }
    }
}

/// The tables named, each once; NULLs and an empty list are errors. No list at all (NULL, the
/// default) with a publication: every table the publication holds, for a whole re-seed of its
/// pipeline.
pub fn table_list(tables: Option<Vec<Option<pg_sys::Oid>>>, publication: Option<&str>) -> Vec<pg_sys::Oid> {
    if let (None, Some(publication)) = (&tables, publication) {
        return crate::selection::publication::tables_of_publication(publication);
    }
    let tables = tables.unwrap_or_default();
    if tables.is_empty() {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            "no table to backfill",
            "The list of tables is NULL or empty.",
            Some(
                "Name at least one table, for example SELECT backfill_start('public.orders', confirm => true); \
                 or, for every table of the pipeline's publication, leave tables out and name the publication: \
                 SELECT backfill_start(publication => 'shop', slot => 'cdc', confirm => true);"
                    .into(),
            ),
        );
    }
    let mut relids = Vec::with_capacity(tables.len());
    for relid in tables {
        let Some(relid) = relid else {
            raise(
                ERRCODE_NULL_VALUE_NOT_ALLOWED,
                "the list of tables contains NULL",
                "Every element must name a table.",
                Some("Remove the NULL from the list, e.g. ARRAY['public.orders', 'public.lines']::regclass[].".into()),
            );
        };
        if relids.contains(&relid) {
            let name = table::relation_name(relid);
            raise(
                ERRCODE_INVALID_PARAMETER_VALUE,
                format!("table {name} is listed twice"),
                "A backfill scans each table once.",
                Some(format!("Remove the second {name} from the list.")),
            );
        }
        relids.push(relid);
    }
    relids
}

/// Why no backfill can run on this server, if none can: read messages are only ever decoded
/// when the server writes logical WAL. (backfill_estimate() gives it as every table's reason.)
/// On 19 the level in force counts: at `wal_level = replica`, logical decoding is on while a
/// logical slot exists (the consumer's, created before the backfill starts).
pub fn logical_decoding_missing() -> Option<String> {
    let setting = if compat::logical_decoding_follows_slots() { "effective_wal_level" } else { "wal_level" };
    let level =
        crate::pg::spi::select_one::<String>("SELECT pg_catalog.current_setting($1)", &[Text::from(setting).into()])
            .ok()
            .flatten()
            .unwrap_or_default();
    (level != "logical")
        .then(|| format!("{setting} is \"{level}\": the backfill's messages would never reach a decoder."))
}

/// What turns logical decoding on, for a hint.
pub fn logical_decoding_fix() -> &'static str {
    if compat::logical_decoding_follows_slots() {
        "Create the consumer's logical replication slot first (with wal_level = replica, logical decoding is on while one exists), or set wal_level = logical in postgresql.conf and restart the server."
    } else {
        "Set wal_level = logical in postgresql.conf and restart the server."
    }
}

fn require_logical_decoding() {
    if let Some(why) = logical_decoding_missing() {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "logical decoding is not enabled on this server",
            why,
            Some(logical_decoding_fix().into()),
        );
    }
}
