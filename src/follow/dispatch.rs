//! A follow's dispatch, one backfill per slot: the dispatcher worker (registered at the commit
//! of a statement that queued tables, when a backfill ends, after a restart) starts the pending
//! tables of every follow whose slot is free, as the follow's creator.

use crate::catalog::follow::{self, EntryState, Follow, Why};
use crate::catalog::schema;
use crate::follow::{request_of, still_followable};
use crate::pg::errors::raise;
use crate::pg::privilege::{self, as_extension_owner};
use crate::selection::publication::publication_tables;
use crate::start::start_backfill;
use crate::worker::launcher::Entry;
use crate::worker::process::Work;
use crate::worker::xact::{in_subtransaction, in_transaction, PageError};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;
use std::ffi::{CStr, CString};

/// The dispatcher: a worker started by worker/launcher.rs (at a commit that queued tables, when
/// a backfill ends, after a restart) that starts what the follows have queued, in a
/// transaction, then exits.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn backfill_dispatcher_main(arg: pg_sys::Datum) {
    if crate::worker::process::start(arg, Entry::Dispatch) != Some(Work::Dispatch) {
        return;
    }
    let dispatched = in_transaction(|| {
        if schema::installed() {
            dispatch_follows();
        }
    });
    if let Err(e) = dispatched {
        warning!("pg_backfill: could not start the follows' queued backfills: {}", e.message);
    }
}

/// A backfill was cancelled, which frees its slot: when this transaction commits, a dispatcher
/// starts what the slot's follows queued. Nothing on a schema without follows, or none live.
pub fn dispatch_when_committed() {
    if crate::catalog::schema::capabilities().follows && as_extension_owner(follow::any_live_follow) {
        crate::worker::launcher::dispatch_at_commit();
    }
}

/// Starts the next queued backfill of every follow whose slot is free: called when a backfill
/// ends (which frees its slot, or a worker a start waited for), and after a server restart.
/// Nothing on a schema without follows (the library replaced, before ALTER EXTENSION UPDATE).
pub fn dispatch_follows() {
    if !crate::catalog::schema::capabilities().follows {
        return;
    }
    for follow in as_extension_owner(follow::live_follows) {
        if still_followable(&follow).is_some() {
            dispatch(&follow);
        }
    }
}

/// Starts one backfill of the follow's pending tables, oldest first, when its slot is free. All
/// of them in one backfill; if that cannot start, each on its own in the order added, each that
/// cannot recorded as failed, until one starts (a start that must only wait, [`must_wait`],
/// leaves them all queued). Pending tables no longer in the publication (removed, dropped) are
/// skipped.
fn dispatch(follow: &Follow) {
    // (Nothing queued, nothing to serialize: a DDL's transaction then holds no lock of ours.)
    if as_extension_owner(|| follow::pending(follow.id)).is_empty() {
        return;
    }
    // Starts are serialized (as worker/admit.rs serializes them): a second dispatch for the
    // slot, as two parallel workers of one backfill end, waits here and then finds the slot taken.
    crate::pg::locks::lock_backfill_starts();
    if as_extension_owner(|| crate::catalog::job::running_backfill_of_slot(&follow.slot)).is_some() {
        return;
    }
    let Some(held) = as_extension_owner(|| publication_tables(&follow.publication)) else { return };
    let pending = as_extension_owner(|| follow::pending(follow.id));
    let (wanted, gone): (Vec<_>, Vec<_>) = pending.into_iter().partition(|entry| held.tables.contains(&entry.relid));
    if !gone.is_empty() {
        let gone: Vec<i64> = gone.iter().map(|entry| entry.entry).collect();
        let why = Why::skipped("removed from the publication or dropped before its turn");
        as_extension_owner(|| follow::settle(&gone, EntryState::Skipped, None, Some(&why)));
    }
    if wanted.is_empty() {
        return;
    }
    let entries: Vec<i64> = wanted.iter().map(|entry| entry.entry).collect();
    match start_as_creator(follow, wanted.iter().map(|entry| entry.relid).collect()) {
        Ok(backfill_id) => return as_extension_owner(|| started(follow, &entries, backfill_id)),
        Err(e) if must_wait(&e) => return as_extension_owner(|| waits(follow, &wanted[0].table_name, &e)),
        Err(_) => {}
    }
    for entry in &wanted {
        match start_as_creator(follow, vec![entry.relid]) {
            Ok(backfill_id) => return as_extension_owner(|| started(follow, &[entry.entry], backfill_id)),
            Err(e) if must_wait(&e) => return as_extension_owner(|| waits(follow, &entry.table_name, &e)),
            Err(e) => {
                let reason = format!("{}: {}", e.sqlstate, e.message);
                warning!(
                    "pg_backfill: follow {} could not start the backfill of table {}: {reason}",
                    follow.id,
                    entry.table_name
                );
                as_extension_owner(|| {
                    let why = Why { reason: &e.primary, sqlstate: Some(&e.sqlstate), detail: e.detail.as_deref() };
                    follow::settle(&[entry.entry], EntryState::Failed, None, Some(&why));
                    follow::record_error(follow.id, &format!("table {}: {reason}", entry.table_name));
                });
            }
        }
    }
}

/// A start refused for a while only: every background worker a backfill may take is in use
/// (53400), or the table is being backfilled by another backfill (55006). The tables stay
/// queued, in their order, for the next dispatch: when any backfill ends, or at the next DDL.
fn must_wait(e: &PageError) -> bool {
    matches!(e.code, ERRCODE_CONFIGURATION_LIMIT_EXCEEDED | ERRCODE_OBJECT_IN_USE)
}

fn waits(follow: &Follow, table: &str, e: &PageError) {
    follow::record_error(follow.id, &format!("table {table} waits: {}: {}", e.sqlstate, e.message));
}

fn started(follow: &Follow, entries: &[i64], backfill_id: i64) {
    follow::settle(entries, EntryState::Started, Some(backfill_id), None);
    follow::record_start(follow.id, backfill_id);
}

/// backfill_start() of `tables` for the follow, as the role that created it (its rights checked
/// as that call checks a caller's), in a subtransaction: an error is returned, not raised.
fn start_as_creator(follow: &Follow, tables: Vec<pg_sys::Oid>) -> Result<i64, PageError> {
    let request = request_of(follow, tables);
    let settings: Vec<(CString, CString)> = follow
        .settings
        .iter()
        .filter_map(|(name, value)| Some((CString::new(name.as_str()).ok()?, CString::new(value.as_str()).ok()?)))
        .collect();
    let settings: Vec<(&CStr, &CStr)> =
        settings.iter().map(|(name, value)| (name.as_c_str(), value.as_c_str())).collect();
    in_subtransaction(|| {
        require_role_exists(follow);
        crate::pg::settings::with_settings(&settings, || privilege::run_as(follow.role, || start_backfill(&request)))
    })
}

fn require_role_exists(follow: &Follow) {
    // SAFETY: a catalog-cache lookup of a role by oid.
    let exists = unsafe { !pg_sys::GetUserNameFromId(follow.role, true).is_null() };
    if !exists {
        raise(
            ERRCODE_UNDEFINED_OBJECT,
            format!("the role that created follow {} no longer exists", follow.id),
            "A follow starts its backfills with the rights of the role that created it.",
            Some(format!(
                "End it and follow the publication again as another role: SELECT backfill_unfollow({}, {});",
                pgrx::spi::quote_literal(&follow.publication),
                pgrx::spi::quote_literal(&follow.slot)
            )),
        );
    }
}
