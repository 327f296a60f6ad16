//! Follows: backfill_follow(), backfill_unfollow(), and what makes a follow act.
//!
//! A follow of a publication into a slot backfills every table later added to the publication
//! into the slot, once, as `backfill_start(tables, slot => ..., publication => ...)` would:
//!
//! - **Enqueue, at the DDL.** An event trigger at the end of every statement that can change a
//!   publication's tables (sql/api.sql) calls [`follow_ddl`]: in the statement's own transaction,
//!   each live follow's publication is compared with the tables the follow knew it to hold, and
//!   the added ones are queued (`backfill.follow_table`). The queue rows commit with the DDL, or
//!   roll back with it.
//! - **Dispatch, one backfill per slot.** [`dispatch`] starts one backfill of the pending tables
//!   when the slot has no running or paused backfill: right after the enqueue (the new backfill's
//!   worker waits for the DDL's commit, so the table's first change and its backfill start from
//!   the same transaction), when a backfill bound to the slot ends (its worker, and
//!   backfill_cancel()), and after a server restart (the resumer). The backfill is started as
//!   the follow's creator, through backfill_start()'s own code, in a subtransaction: a start
//!   that fails (the role lacks a right, the table has no key) is recorded in the queue entry and
//!   the follow's last_error, and never fails the statement that added the table.
//! - **End.** The publication or the slot gone ends the follow, with the reason.

use crate::api::request::check_options;
use crate::api::start::start_backfill;
use crate::catalog::follow::{self, EntryState, Follow, FollowOptions, Why};
use crate::model::request::{SourceOptions, StartRequest};
use crate::pg::args::{deadline_after, require_primary, required};
use crate::pg::encoding::Text;
use crate::pg::errors::{raise, OrInternal};
use crate::pg::privilege::{self, as_extension_owner};
use crate::selection::publication::{no_such_publication, publication_tables, PublicationTables};
use crate::throttle::pipeline;
use crate::worker::xact::{in_subtransaction, PageError};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;
use std::ffi::{CStr, CString};

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
/// these options. Returns the follow's id.
#[pg_extern(schema = "backfill", name = "follow")]
#[allow(clippy::too_many_arguments)]
fn follow_publication(
    publication: Option<Text>,
    slot: Option<Text>,
    batch_size: Option<i32>,
    rows_per_second: Option<i32>,
    parallel: Option<i32>,
    max_lag: Option<i64>,
    max_replica_lag: Option<i64>,
    max_retained_wal: Option<i64>,
    max_active_sessions: Option<i32>,
    rows_per_message: Option<i32>,
) -> i64 {
    const CALL: &str = "backfill_follow";
    require_primary("follow a publication");
    let publication = required(publication, CALL, "publication").0;
    let slot = required(slot, CALL, "slot").0;
    let options = FollowOptions {
        batch_size: required(batch_size, CALL, "batch_size"),
        // 0: no limit, as backfill_start() takes it.
        rows_per_second: rows_per_second.filter(|rate| *rate != 0),
        parallel: required(parallel, CALL, "parallel"),
        max_lag,
        source: SourceOptions {
            max_replica_lag,
            max_retained_wal,
            max_active_sessions: max_active_sessions.map(i64::from),
        },
        rows_per_message,
    };
    // The options are checked as backfill_start() checks them, once here and again at each start.
    check_options(&request_of(&publication, &slot, &options, Vec::new()), rows_per_second);
    privilege::require_replication(&slot);
    pipeline::require_slot(&slot);
    let Some(held) = publication_tables(&publication) else { no_such_publication(&publication) };
    if let Some(existing) = as_extension_owner(|| follow::live_follow(&publication, &slot)) {
        raise(
            ERRCODE_DUPLICATE_OBJECT,
            format!("publication \"{publication}\" is already followed into slot \"{slot}\""),
            format!("Follow {existing} backfills the tables added to it; a publication is followed once per slot."),
            Some(format!(
                "To change its options, end it first: SELECT backfill_unfollow({}, {});",
                pgrx::spi::quote_literal(&publication),
                pgrx::spi::quote_literal(&slot)
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
    as_extension_owner(|| {
        follow::insert_follow(&publication, &slot, role, &options, &settings, (&held.tables, &leaves))
    })
}

/// backfill_unfollow(): ends the follow of `publication` into `slot`; its pending tables are
/// skipped, and a backfill it started runs on.
#[pg_extern(schema = "backfill", name = "unfollow")]
fn unfollow(publication: Option<Text>, slot: Option<Text>) -> bool {
    const CALL: &str = "backfill_unfollow";
    require_primary("end a follow");
    let publication = required(publication, CALL, "publication").0;
    let slot = required(slot, CALL, "slot").0;
    let id = require_follow_of_caller(&publication, &slot, "end");
    as_extension_owner(|| follow::end_follow(id, "ended by backfill_unfollow()"))
}

/// backfill_follow_wait(): blocks until every table queued for the follow when it was called has
/// been started (or skipped, or failed), since a follow's backfills start once the statement
/// that added their tables commits, in a worker of their own; returns the follow's last started
/// backfill (NULL if it never started one), for backfill_wait(). After the timeout, an error.
#[pg_extern(schema = "backfill", name = "follow_wait")]
fn follow_wait(publication: Option<Text>, slot: Option<Text>, timeout_ms: Option<f64>) -> Option<i64> {
    const CALL: &str = "backfill_follow_wait";
    let publication = required(publication, CALL, "publication").0;
    let slot = required(slot, CALL, "slot").0;
    let id = require_follow_of_caller(&publication, &slot, "wait for");
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

/// The event trigger's work, at the end of a statement that may have added tables to a
/// publication (sql/api.sql lists the commands): queue what each followed publication gained,
/// under the follow's lock, and have a dispatcher start what a free slot can take once the
/// statement's transaction commits. Cheap when the statement changes no followed publication.
///
/// Called by the event trigger's function, which runs as the extension's owner (SECURITY
/// DEFINER) and only while a follow is live: no role's DDL needs EXECUTE on it, or the library.
/// Nothing here starts a backfill, takes pg_backfill's locks or runs as another role inside the
/// DDL's transaction; the dispatcher does that in a transaction of its own.
#[pg_extern(schema = "backfill", name = "follow_ddl")]
fn follow_ddl_of(command_tag: Option<Text>) {
    // (ALTER PUBLICATION ... DROP TABLE reports no object among the statement's commands: a
    // statement on a publication brings every follow up to date.)
    follow_statement(command_tag.is_some_and(|tag| tag.0.ends_with(" PUBLICATION")));
}

/// The event trigger's work in 0.10.0's SQL, which calls it (without the command's tag) until
/// ALTER EXTENSION UPDATE: as for a statement on a publication.
#[pg_extern(schema = "backfill", name = "follow_ddl")]
fn follow_ddl() {
    if as_extension_owner(follow::any_live_follow) {
        follow_statement(true);
    }
}

fn follow_statement(on_a_publication: bool) {
    let queued = as_extension_owner(|| {
        follow::skip_dropped_pending();
        let created = follow::relations_created_by_the_statement();
        let mut queued = false;
        for follow_id in follow::follows_the_statement_may_change(on_a_publication, &created) {
            // Read unlocked first: most statements leave what the publication holds as the
            // follow knows it, and then take no lock (concurrent DDL does not queue behind it).
            // One that changed it locks the follow and looks again, on a snapshot taken after
            // any other statement that changed it has committed.
            let Some(unlocked) = follow::live_follow_by_id(follow_id) else { continue };
            let Some(held) = still_followable(&unlocked) else { continue };
            if !knows_otherwise(&new_to(unlocked, &created), &held) {
                continue;
            }
            let Some(follow) = follow::lock_live_follow(follow_id) else { continue };
            let Some(held) = still_followable(&follow) else { continue };
            let follow = new_to(follow, &created);
            enqueue_added(&follow, &held);
            queued |= !follow::pending(follow.id).is_empty();
        }
        queued
    });
    if queued {
        crate::worker::launcher::dispatch_at_commit();
    }
}

/// The follow, as knowing nothing of the relations the statement created: a new relation is
/// new, whatever the follow may know of a dropped one whose oid it took.
fn new_to(mut follow: Follow, created: &[pg_sys::Oid]) -> Follow {
    follow.known_tables.retain(|table| !created.contains(table));
    follow.known_leaves.retain(|leaf| !created.contains(leaf));
    follow
}

/// Whether the publication holds other relations, or other leaves, than the follow knows.
fn knows_otherwise(follow: &Follow, held: &PublicationTables) -> bool {
    let sorted = |oids: &mut dyn Iterator<Item = pg_sys::Oid>| {
        let mut oids: Vec<u32> = oids.map(|oid| oid.to_u32()).collect();
        oids.sort_unstable();
        oids
    };
    sorted(&mut held.tables.iter().copied()) != sorted(&mut follow.known_tables.iter().copied())
        || sorted(&mut held.leaves.iter().map(|(leaf, _)| *leaf)) != sorted(&mut follow.known_leaves.iter().copied())
}

/// A backfill was cancelled, which frees its slot: when this transaction commits, a dispatcher
/// starts what the slot's follows queued. Nothing on a schema without follows, or none live.
pub fn dispatch_when_committed() {
    if crate::catalog::schema::capabilities().follows && as_extension_owner(follow::any_live_follow) {
        crate::worker::launcher::dispatch_at_commit();
    }
}

/// Hands the worker layer [`dispatch_follows`], which it calls without importing the API (from
/// _PG_init, in every process that loads the library).
pub fn install() {
    crate::worker::launcher::set_follow_dispatch(dispatch_follows);
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

/// The publication's tables, while both the publication and the slot exist; otherwise the
/// follow ends, with the reason, and None.
fn still_followable(follow: &Follow) -> Option<PublicationTables> {
    let (held, slot_exists) =
        as_extension_owner(|| (publication_tables(&follow.publication), slot_exists(&follow.slot)));
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

fn slot_exists(slot: &str) -> bool {
    crate::pg::spi::select_one::<bool>(
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_replication_slots
                         WHERE slot_name OPERATOR(pg_catalog.=) $1 AND database OPERATOR(pg_catalog.=) pg_catalog.current_database())",
        &[Text::from(slot).into()],
    )
    .or_internal("read the replication slots")
    .unwrap_or(false)
}

/// Queues the tables the publication gained since the follow last looked, skips the pending
/// ones it lost, and records what it holds now. As the extension's owner.
///
/// A relation the publication now lists (pg_publication_tables: ADD TABLE, SET TABLE, ADD
/// TABLES IN SCHEMA, a table moved into a listed schema, created in one, a partition attached
/// with publish_via_partition_root = false) is queued when it brings at least one new leaf:
/// `publish_via_partition_root` turned on or off lists other relations over the same rows,
/// which the consumer has. A new leaf under a relation listed before (a partition attached to
/// a partitioned table published through its root) is published as that root: no backfill of
/// the partition alone can name its rows as their changes do (selection/publication.rs), so it
/// is refused, unless it was empty.
fn enqueue_added(follow: &Follow, held: &PublicationTables) {
    let new_leaf = |leaf: &pg_sys::Oid| !follow.known_leaves.contains(leaf);
    let added: Vec<pg_sys::Oid> = held
        .tables
        .iter()
        .copied()
        .filter(|table| !follow.known_tables.contains(table))
        .filter(|table| held.leaves.iter().any(|(leaf, of)| of == table && new_leaf(leaf)))
        .collect();
    for relid in &added {
        enqueue(follow, *relid);
    }
    for (leaf, root) in held.leaves.iter().filter(|(leaf, root)| new_leaf(leaf) && follow.known_tables.contains(root)) {
        let name = crate::model::table::relation_name(*leaf);
        if empty_and_locked_here(*leaf) {
            follow::enqueue(follow.id, *leaf, &name, EntryState::Skipped, Some(&Why::skipped(EMPTY)));
        } else {
            let root = crate::model::table::relation_name(*root);
            let reason = format!(
                "partition {name} was attached to {root}, which publication \"{}\" publishes through its root \
                 (publish_via_partition_root): a backfill of the partition alone would name its rows otherwise than \
                 their changes; backfill {root} with backfill_start(), or publish its partitions as themselves",
                follow.publication
            );
            refuse(follow, *leaf, &name, &reason);
        }
    }
    for removed in follow.known_tables.iter().filter(|table| !held.tables.contains(table)) {
        follow::skip_pending(follow.id, *removed, "removed from the publication before its turn");
    }
    // (Most statements change no followed publication: they write nothing.)
    if knows_otherwise(follow, held) {
        let leaves: Vec<pg_sys::Oid> = held.leaves.iter().map(|(leaf, _)| *leaf).collect();
        follow::set_known(follow.id, &held.tables, &leaves);
    }
}

/// Why a table needs no backfill: created (or attached, or moved) empty by the statement.
const EMPTY: &str = "empty when added";

/// Queues one added relation: pending, unless it needs no backfill or can have none.
fn enqueue(follow: &Follow, relid: pg_sys::Oid) {
    if follow::is_pending(follow.id, relid) {
        return;
    }
    let name = crate::model::table::relation_name(relid);
    if crate::pg::citus::is_distributed(relid) {
        let reason = format!(
            "table {name} is a Citus distributed table, which follows do not backfill yet: start its backfill on the \
             coordinator with SELECT backfill_start({}, confirm => true, slot => {}, publication => {});",
            pgrx::spi::quote_literal(&name),
            pgrx::spi::quote_literal(&follow.slot),
            pgrx::spi::quote_literal(&follow.publication)
        );
        return refuse(follow, relid, &name, &reason);
    }
    let skipped = match crate::catalog::job::running_backfill_of_table_in_slot(relid, &follow.slot) {
        Some(running) => Some(format!("already being backfilled into the slot by backfill {running}")),
        None => empty_and_locked_here(relid).then(|| EMPTY.to_string()),
    };
    match skipped {
        Some(reason) => follow::enqueue(follow.id, relid, &name, EntryState::Skipped, Some(&Why::skipped(&reason))),
        None => follow::enqueue(follow.id, relid, &name, EntryState::Pending, None),
    }
}

/// Queues a table no follow can backfill as failed (0A000), with why, which becomes the
/// follow's last error too.
fn refuse(follow: &Follow, relid: pg_sys::Oid, name: &str, reason: &str) {
    follow::record_error(follow.id, &format!("table {name}: 0A000: {reason}"));
    let why = Why { reason, sqlstate: Some("0A000"), detail: None };
    follow::enqueue(follow.id, relid, name, EntryState::Failed, Some(&why));
}

/// Whether the relation holds no row, and none can be written to it before this transaction
/// commits: every leaf under it (a plain table is its own) is held by this transaction in
/// ACCESS EXCLUSIVE mode (CREATE TABLE, ATTACH PARTITION, ALTER TABLE SET SCHEMA and LOCK TABLE
/// take it) and has no page at all. Judged by the leaves' storage, never by a read: a read
/// would see what this transaction's snapshot sees, not what a REPEATABLE READ DDL's snapshot
/// misses, nor a row security policy hides. A table merely added to a publication (ALTER
/// PUBLICATION takes a weaker lock), or whose pages once held rows, gets its (quick) backfill.
fn empty_and_locked_here(relid: pg_sys::Oid) -> bool {
    crate::pg::spi::select_one::<bool>(
        "SELECT COALESCE(pg_catalog.bool_and(
                    pg_catalog.pg_relation_size(leaf.relid) OPERATOR(pg_catalog.=) 0
                    AND EXISTS (SELECT FROM pg_catalog.pg_locks l
                                 WHERE l.locktype OPERATOR(pg_catalog.=) 'relation'
                                   AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                                                                           WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
                                   AND l.relation OPERATOR(pg_catalog.=) leaf.relid
                                   AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()
                                   AND l.mode OPERATOR(pg_catalog.=) 'AccessExclusiveLock' AND l.granted)), true)
           FROM (SELECT p.relid FROM pg_catalog.pg_partition_tree($1) p WHERE p.isleaf
                 -- (A table that is neither partitioned nor a partition has no tree.)
                 UNION ALL
                 SELECT $1 WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_partition_tree($1))) leaf",
        &[relid.into()],
    )
    .or_internal("look whether the added table is empty")
    .unwrap_or(false)
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
    let request = request_of(&follow.publication, &follow.slot, &follow.options, tables);
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

/// backfill_start()'s request for `tables` with a follow's options, bound to its slot and publication.
fn request_of(publication: &str, slot: &str, options: &FollowOptions, tables: Vec<pg_sys::Oid>) -> StartRequest {
    StartRequest {
        tables,
        confirm: true,
        batch_size: options.batch_size,
        rows_per_second: options.rows_per_second,
        slot: Some(slot.to_string()),
        publication: Some(publication.to_string()),
        max_lag: options.max_lag,
        parallel: options.parallel,
        source: options.source,
        keys: None,
        rows_per_message: options.rows_per_message,
        filter: None,
        columns: None,
    }
}
