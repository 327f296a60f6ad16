//! A start's options checked, whoever asks for the start (backfill_start(), a follow for every
//! backfill it starts, backfill_set() for the limits on the source): each in its range, and a
//! server that decodes the backfill's messages.

use crate::model::request::{SetRequest, SourceOptions, StartOptions};
use crate::pg::args::{check_batch_size, check_rate, check_rows_per_message};
use crate::pg::compat;
use crate::pg::encoding::Text;
use crate::pg::errors::raise;
use pgrx::PgSqlErrorCode::*;

const MAX_PARALLEL: i32 = 16;

/// A start's options (backfill_start()'s, or a follow's for every backfill it starts), each in
/// its range (`has_slot`: max_lag needs a slot), and a server that decodes them.
pub fn check_options(options: &StartOptions, has_slot: bool) {
    check_batch_size(options.batch_size);
    check_parallel(options.parallel);
    check_rate(options.rows_per_second);
    if let Some(rows_per_message) = options.rows_per_message {
        check_rows_per_message(rows_per_message);
    }
    check_source_limits(&options.source);
    check_max_lag(options.max_lag, has_slot);
    require_logical_decoding();
}

/// backfill_set()'s changes, each in its range.
pub fn check_changes(changes: &SetRequest) {
    if let Some(batch_size) = changes.batch_size {
        check_batch_size(batch_size);
    }
    check_rate(changes.rows_per_second);
    if let Some(lag) = changes.max_lag.filter(|lag| *lag < 0) {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            format!("max_lag {lag} is out of range"),
            "max_lag is in bytes: positive, or 0 to follow backfill.max_slot_lag again.",
            Some("Pass 0 for the setting's lag, or a positive number of bytes such as max_lag => 104857600.".into()),
        );
    }
    check_source_limits(&changes.source);
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
fn check_source_limits(options: &SourceOptions) {
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
