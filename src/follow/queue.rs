//! A follow's queue: at the end of every statement that may change a followed publication's
//! tables, what each followed publication gained is queued, in the statement's own transaction,
//! and a dispatcher is asked for at its commit (`dispatch.rs`).

use crate::catalog::follow::{self, EntryState, Follow, Why};
use crate::follow::still_followable;
use crate::pg::errors::OrInternal;
use crate::pg::privilege::as_extension_owner;
use crate::selection::publication::PublicationTables;
use pgrx::prelude::*;

/// The event trigger's work, at the end of a statement that may have added tables to a
/// publication (sql/api.sql lists the commands): queue what each followed publication gained,
/// under the follow's lock, and have a dispatcher start what a free slot can take once the
/// statement's transaction commits. Cheap when the statement changes no followed publication.
///
/// Called by the event trigger's function, which runs as the extension's owner (SECURITY
/// DEFINER) and only while a follow is live: no role's DDL needs EXECUTE on it, or the library.
/// Nothing here starts a backfill, takes pg_backfill's locks or runs as another role inside the
/// DDL's transaction; the dispatcher does that in a transaction of its own.
pub fn statement(on_a_publication: bool) {
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
