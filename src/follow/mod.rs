//! Follows: what backfill_follow(), backfill_unfollow() and backfill_follow_wait() do (their SQL
//! adapters are api/follow.rs), and what makes a follow act: its queue (`queue.rs`) and its
//! dispatch (`dispatch.rs`).
//!
//! A follow of a publication into a slot backfills every table later added to the publication
//! into the slot, once, as `backfill_start(tables, slot => ..., publication => ...)` would:
//!
//! - **Enqueue, at the DDL.** An event trigger at the end of every statement that can change a
//!   publication's tables (sql/api.sql) calls [`queue::statement`]: in the statement's own
//!   transaction, each live follow's publication is compared with the tables the follow knew it
//!   to hold, and the added ones are queued (`backfill.follow_table`). The queue rows commit
//!   with the DDL, or roll back with it.
//! - **Dispatch, one backfill per slot.** The dispatcher, a worker of its own
//!   ([`dispatch::backfill_dispatcher_main`]), starts one backfill of the pending tables when the
//!   slot has no running or paused backfill. The worker layer starts it by its name: at the
//!   commit of a statement that queued tables, when a backfill ends (its worker, and
//!   backfill_cancel() at commit), and after a server restart (the resumer). The backfill is
//!   started as the follow's creator, through backfill_start()'s own code, in a
//!   subtransaction: a start that fails (the role lacks a right, the table has no key) is
//!   recorded in the queue entry and the follow's last_error, and never fails the statement
//!   that added the table.
//! - **End.** The publication or the slot gone ends the follow, with the reason.

pub(crate) mod dispatch;
pub(crate) mod queue;

use crate::catalog::follow::{self, Follow};
use crate::model::request::{StartOptions, StartRequest};
use crate::pg::args::deadline_after;
use crate::pg::errors::{raise, OrInternal};
use crate::pg::privilege::{self, as_extension_owner};
use crate::selection::publication::{no_such_publication, publication_tables, PublicationTables};
use crate::start::options::check_options;
use crate::throttle::pipeline;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;

/// The settings a start reads from its session (pg/settings.rs): a follow's backfills start with
/// those of the session that created the follow, never those of whichever session's DDL, or
/// worker, starts them: a DDL user's `SET backfill.message_prefix` would send a follow's reads
/// where its consumer does not look.
const START_SETTINGS: [&str; 4] = [
    "backfill.message_prefix",
    "backfill.lock_mode",
    "backfill.rows_per_message",
    "backfill.default_max_active_sessions",
];

/// backfill_follow(): every table later added to `publication` is backfilled into `slot`, with
/// `options`. Returns the follow's id.
pub fn create(publication: &str, slot: &str, options: StartOptions) -> i64 {
    // The options are checked as backfill_start() checks them, once here and again at each start.
    check_options(&options, true);
    privilege::require_replication(slot);
    pipeline::require_slot(slot);
    let Some(held) = publication_tables(publication) else { no_such_publication(publication) };
    if let Some(existing) = as_extension_owner(|| follow::live_follow(publication, slot)) {
        raise(
            ERRCODE_DUPLICATE_OBJECT,
            format!("publication \"{publication}\" is already followed into slot \"{slot}\""),
            format!("Follow {existing} backfills the tables added to it; a publication is followed once per slot."),
            Some(format!(
                "To change its options, end it first: SELECT backfill_unfollow({}, {});",
                pgrx::spi::quote_literal(publication),
                pgrx::spi::quote_literal(slot)
            )),
        );
    }
    let settings = crate::pg::spi::select_one::<pgrx::JsonB>(
        "SELECT pg_catalog.jsonb_object_agg(name, pg_catalog.current_setting(name))
           FROM pg_catalog.unnest($1::pg_catalog.text[]) name",
        &[START_SETTINGS.iter().map(|name| name.to_string()).collect::<Vec<String>>().into()],
    )
    .or_internal("read the settings of a start")
    .unwrap_or(pgrx::JsonB(serde_json::Value::Null));
    // SAFETY: the current user's id.
    let role = unsafe { pg_sys::GetUserId() };
    let leaves: Vec<pg_sys::Oid> = held.leaves.iter().map(|(leaf, _)| *leaf).collect();
    as_extension_owner(|| follow::insert_follow(publication, slot, role, &options, &settings, (&held.tables, &leaves)))
}

/// backfill_unfollow(): ends the follow of `publication` into `slot`; its pending tables are
/// skipped, and a backfill it started runs on.
pub fn end(publication: &str, slot: &str) -> bool {
    let id = require_follow_of_caller(publication, slot, "end");
    as_extension_owner(|| follow::end_follow(id, "ended by backfill_unfollow()"))
}

/// backfill_follow_wait(): blocks until every table queued for the follow when it was called has
/// been started (or skipped, or failed), since a follow's backfills start once the statement
/// that added their tables commits, in a worker of their own; returns the follow's last started
/// backfill (NULL if it never started one), for backfill_wait(). After the timeout, an error.
pub fn wait(publication: &str, slot: &str, timeout_ms: Option<f64>) -> Option<i64> {
    let id = require_follow_of_caller(publication, slot, "wait for");
    let deadline = deadline_after(timeout_ms);
    let up_to = as_extension_owner(|| follow::queue_progress(id, None)).last_entry;
    loop {
        let progress = as_extension_owner(|| follow::queue_progress(id, up_to));
        if progress.waiting == 0 || progress.ended {
            return progress.last_backfill_id;
        }
        if progress.queued_here {
            raise(
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("the tables queued for follow {id} cannot start before this transaction commits"),
                "A follow's backfills start once the statement that added their tables commits; waiting in that same \
                 transaction would never end.",
                Some("Commit first, then wait.".into()),
            );
        }
        if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            raise(
                ERRCODE_QUERY_CANCELED,
                format!("the tables queued for follow {id} did not start in time"),
                format!(
                    "{} of them still wait for slot \"{slot}\" (one backfill per slot at a time).",
                    progress.waiting
                ),
                Some(
                    "SELECT pending_tables, last_error FROM backfill_follows; shows them, and what they wait for."
                        .into(),
                ),
            );
        }
        crate::throttle::pacing::sleep(std::time::Duration::from_millis(50));
    }
}

/// The live follow of `publication` into `slot`, which the caller may act for (its creator, a
/// member, a superuser); an error otherwise.
fn require_follow_of_caller(publication: &str, slot: &str, verb: &str) -> i64 {
    let Some((id, creator)) = as_extension_owner(|| {
        let id = follow::live_follow(publication, slot)?;
        Some((id, follow::creator(id)))
    }) else {
        raise(
            ERRCODE_UNDEFINED_OBJECT,
            format!("publication \"{publication}\" is not followed into slot \"{slot}\""),
            "No live follow has that publication and slot.",
            Some("SELECT publication, slot, state FROM backfill_follows; lists the follows.".into()),
        );
    };
    let may = privilege::is_superuser() || creator.as_deref().is_some_and(privilege::caller_may_act_as);
    if !may {
        raise(
            ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("permission denied to {verb} follow {id}"),
            format!(
                "Follow {id} was created by role \"{}\"; only that role, its members and superusers may {verb} it.",
                creator.unwrap_or_default()
            ),
            None,
        );
    }
    id
}

/// The publication's tables, while both the publication and the slot exist; otherwise the
/// follow ends, with the reason, and None.
fn still_followable(follow: &Follow) -> Option<PublicationTables> {
    let (held, slot_exists) =
        as_extension_owner(|| (publication_tables(&follow.publication), pipeline::slot_exists(&follow.slot)));
    let reason = match (&held, slot_exists) {
        (None, _) => format!("publication \"{}\" was dropped or renamed", follow.publication),
        (Some(_), false) => format!("replication slot \"{}\" was dropped", follow.slot),
        (Some(_), true) => return held,
    };
    if as_extension_owner(|| follow::end_follow(follow.id, &reason)) {
        log!("pg_backfill: follow {} of publication \"{}\" ended: {reason}", follow.id, follow.publication);
    }
    None
}

/// backfill_start()'s request for `tables` with a follow's options, bound to its slot and publication.
fn request_of(follow: &Follow, tables: Vec<pg_sys::Oid>) -> StartRequest {
    StartRequest {
        tables,
        confirm: true,
        slot: Some(follow.slot.clone()),
        publication: Some(follow.publication.clone()),
        options: follow.options,
        keys: None,
        filter: None,
        columns: None,
    }
}
