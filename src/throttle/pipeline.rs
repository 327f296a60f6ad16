//! The consumer a backfill is for: its replication slot (its publication is read by
//! selection/publication.rs). A backfill for a slot pauses while the slot has no active consumer
//! and waits while the consumer lags, so that it never makes the server retain WAL that nobody
//! reads.

use crate::catalog::job::Job;
use crate::pg::encoding::Text;
use crate::pg::errors::raise;
use crate::pg::errors::OrInternal;
use crate::pg::settings;
use crate::throttle::wait::WaitReason;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;

/// backfill_start(..., slot => ...): the slot must exist, be logical and belong to this database.
pub fn require_slot(slot: &str) {
    let found = crate::pg::spi::select_one::<Text>(
        "SELECT slot_type OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) coalesce(database::pg_catalog.text, '')
                OPERATOR(pg_catalog.||) ':'
                OPERATOR(pg_catalog.||) coalesce((database OPERATOR(pg_catalog.=) pg_catalog.current_database())::pg_catalog.text, 'false')
           FROM pg_catalog.pg_replication_slots WHERE slot_name OPERATOR(pg_catalog.=) $1",
        &[slot.into()],
    )
    .ok()
    .flatten()
    .map(|t| t.0);
    let Some(found) = found else {
        raise(
            ERRCODE_UNDEFINED_OBJECT,
            format!("replication slot \"{slot}\" does not exist"),
            "A backfill for a pipeline needs the pipeline's logical replication slot.",
            Some(format!(
                "Create it, or name an existing one: SELECT pg_create_logical_replication_slot({}, 'pgoutput');",
                spi::quote_literal(slot)
            )),
        );
    };
    let mut parts = found.splitn(3, ':');
    let (kind, database, here) = (parts.next(), parts.next(), parts.next());
    if kind != Some("logical") {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("replication slot \"{slot}\" is not a logical slot"),
            "Backfill messages are only decoded by logical replication slots.",
            Some(
                "Name the consumer's logical slot: SELECT slot_name FROM pg_replication_slots WHERE slot_type = 'logical'; \
                 lists them."
                    .into(),
            ),
        );
    }
    if here != Some("true") {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("replication slot \"{slot}\" belongs to another database"),
            format!(
                "Slot \"{slot}\" decodes database \"{}\"; the backfill's messages are written here.",
                database.unwrap_or("")
            ),
            Some("Start the backfill in the slot's database.".into()),
        );
    }
}

/// Whether logical slot `slot` of this database exists.
pub fn slot_exists(slot: &str) -> bool {
    crate::pg::spi::select_one::<bool>(
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_replication_slots
                         WHERE slot_name OPERATOR(pg_catalog.=) $1 AND database OPERATOR(pg_catalog.=) pg_catalog.current_database())",
        &[Text::from(slot).into()],
    )
    .or_internal("read the replication slots")
    .unwrap_or(false)
}

/// A slot's identity, which its name is not: a slot dropped and created again under the same
/// name is another slot, and its consumer never receives what was written before it was made.
/// PostgreSQL gives slots no id; each has a directory, `pg_replslot/<name>` (a temporary slot
/// too), made when the slot is created: its inode and its birth time (to the nanosecond) tell
/// one creation from the next (a freed inode is soon reused). None if the slot has none.
pub fn slot_identity(slot: &str) -> Option<String> {
    // (A backend's working directory is the data directory.)
    let metadata = std::fs::metadata(std::path::Path::new("pg_replslot").join(slot)).ok()?;
    let born = metadata.created().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
    use std::os::unix::fs::MetadataExt;
    Some(match born {
        Some(born) => format!("{}@{}.{:09}", metadata.ino(), born.as_secs(), born.subsec_nanos()),
        None => metadata.ino().to_string(),
    })
}

/// Why the backfill must wait for its slot's consumer now, if it must; an error if the slot is
/// gone, is another slot of the same name, or was invalidated.
///
/// After a failover the slot is the promoted standby's copy of the one the backfill was started
/// for, in a directory of its own: another identity, yet the same slot, whose consumer carries on
/// from it (docs/operations.md, "Failover"). Only the slotsync worker makes a slot `synced` (a
/// standby's slot cannot be created, dropped or used by hand), and a slot created on the
/// promoted server is not: a synchronized copy is accepted for the slot of its name, any other
/// slot of a new identity refused. What this cannot tell apart: a slot dropped and created again
/// on the old primary, with `failover`, while that primary's workers did not read it (the
/// backfill paused by backfill_pause(), or between their last page and the crash), then copied
/// to the standby: PostgreSQL keeps no trace of a slot's creation that the copy would carry.
///
/// So a copy is taken only by workers that watched the slot up to the failover: a running
/// backfill, resumed by the promoted server's launcher. Its first look adopts the copy's
/// identity (job::adopt_slot_identity), so that the copy is the slot it knows from then on: one
/// created again on this server is refused as before, and after a further failover only the
/// next server's copy of this copy is taken the same way. A backfill that was paused or failed
/// watched nothing: backfill_resume refuses a synchronized copy of a new identity for it
/// ([`require_watched_slot`]), which may be a copy of a slot created again, on any server of
/// the chain, while nobody looked (what the docs' "Failover" says). What is left: a slot created
/// again between the running workers' last look and the failover.
pub fn blocker(job: &Job, backfill_id: i64) -> Option<WaitReason> {
    let slot = job.slot_name.as_deref()?;
    // The lag from the WAL inserted, not written: the worker commits asynchronously, and on a
    // busy server the WAL writer can be several pages behind what the backfill has emitted (a
    // run stopped 370 kB past its limit, measured from the written position).
    // (Kept prepared: every page of a pipeline's backfill asks.) A logical slot belongs to one
    // database: one of that name made for another database (once this one's was dropped; names
    // are the cluster's) decodes none of the backfill's messages, a synchronized copy of one
    // included, so it is not looked at.
    let sql = format!(
        "SELECT active, pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_insert_lsn(), confirmed_flush_lsn)::bigint,
                wal_status, {synchronized_copy}
           FROM pg_catalog.pg_replication_slots
          WHERE slot_name OPERATOR(pg_catalog.=) $1 AND database OPERATOR(pg_catalog.=) pg_catalog.current_database()",
        synchronized_copy = crate::pg::compat::slot_is_synchronized_copy(),
    );
    let row = crate::pg::spi::run_prepared(&sql, false, &[Text::from(slot).into()], |rows| {
        if rows.is_empty() {
            return Ok::<_, spi::Error>(None);
        }
        let row = rows.first();
        Ok(Some((
            row.get::<bool>(1)?.unwrap_or(false),
            row.get::<i64>(2)?.unwrap_or(0),
            row.get::<String>(3)?,
            row.get::<bool>(4)?.unwrap_or(false),
        )))
    })
    .or_internal("read the slot");
    let Some((active, lag, wal_status, synchronized_copy)) = row else {
        raise(
            ERRCODE_UNDEFINED_OBJECT,
            format!("replication slot \"{slot}\" no longer exists"),
            "The backfill was started for it; its messages would reach no consumer (a slot of that name made for \
             another database is another slot, which decodes none of them).",
            Some("Start a new backfill for the pipeline's current slot.".into()),
        );
    };
    let identity = slot_identity(slot);
    if job.slot_identity.is_some() && identity != job.slot_identity && synchronized_copy {
        if let Some(identity) = &identity {
            crate::catalog::job::adopt_slot_identity(backfill_id, identity);
        }
    } else if job.slot_identity.is_some() && identity != job.slot_identity {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("replication slot \"{slot}\" was dropped and created again"),
            "The backfill was started for the slot of that name that was dropped: what it delivered \
             after that slot's consumer last confirmed never reaches the new slot.",
            Some("Start a new backfill for the pipeline's new slot.".into()),
        );
    }
    if wal_status.as_deref() == Some("lost") {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("replication slot \"{slot}\" was invalidated"),
            "The server removed WAL its consumer had not received (wal_status lost, see max_slot_wal_keep_size): \
             the slot can no longer be read, so the backfill's messages would reach no consumer.",
            Some("Create the pipeline's slot again, re-sync its consumer, and start a new backfill for it.".into()),
        );
    }
    let slot = slot.to_string();
    if !active {
        return Some(WaitReason::ConsumerAway { slot });
    }
    let limit = job.max_lag_bytes.unwrap_or_else(settings::max_slot_lag_bytes);
    (lag > limit).then_some(WaitReason::ConsumerLag { slot, lag, limit })
}

/// backfill_resume() of a backfill that was paused or failed, bound to `slot`, whose identity
/// when it started (or when its workers last adopted a failover's copy) was `recorded`: a
/// synchronized copy of another identity is refused. Its workers did not watch the slot while
/// it was paused or failed, and a failover's copy of the slot they watched cannot be told from a
/// copy of one dropped and created again meanwhile, with `failover`, on a primary of the chain
/// (see [`blocker`]). A slot of a new identity that is not a copy is left to the workers, which
/// fail the backfill naming it.
pub fn require_watched_slot(backfill_id: i64, slot: &str, recorded: &str) {
    let synchronized_copy = crate::pg::spi::select_one::<bool>(
        &format!(
            "SELECT {} FROM pg_catalog.pg_replication_slots
              WHERE slot_name OPERATOR(pg_catalog.=) $1 AND database OPERATOR(pg_catalog.=) pg_catalog.current_database()",
            crate::pg::compat::slot_is_synchronized_copy()
        ),
        &[Text::from(slot).into()],
    )
    .or_internal("read the slot")
    .unwrap_or(false);
    if !synchronized_copy || slot_identity(slot).as_deref() == Some(recorded) {
        return;
    }
    raise(
        ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("cannot resume backfill {backfill_id}: replication slot \"{slot}\" may not be the slot it was started for"),
        format!(
            "Slot \"{slot}\" is a standby's synchronized copy, promoted, of a slot that the backfill's workers did not \
             watch while it was paused or failed: it cannot be told from a copy of a slot dropped and created again \
             meanwhile, whose consumer never received what the backfill wrote before."
        ),
        Some(format!(
            "SELECT backfill_cancel({backfill_id}); ends it; start a new backfill for slot \"{slot}\" to deliver its tables."
        )),
    );
}
