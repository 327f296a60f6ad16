//! backfill_follow(), backfill_unfollow(), backfill_follow_wait() and the event trigger's entry
//! points: their arguments checked and handed to follow/, which does the work.

use crate::api::request::{start_options, StartOptionArgs};
use crate::model::request::SourceOptions;
use crate::pg::args::{require_primary, required};
use crate::pg::encoding::Text;
use pgrx::prelude::*;

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
    let source = SourceOptions::of_arguments(max_replica_lag, max_retained_wal, max_active_sessions);
    let args = StartOptionArgs { batch_size, rows_per_second, parallel, max_lag, source, rows_per_message };
    crate::follow::create(&publication, &slot, start_options(CALL, args))
}

/// backfill_unfollow(): ends the follow of `publication` into `slot`; its pending tables are
/// skipped, and a backfill it started runs on.
#[pg_extern(schema = "backfill", name = "unfollow")]
fn unfollow(publication: Option<Text>, slot: Option<Text>) -> bool {
    const CALL: &str = "backfill_unfollow";
    require_primary("end a follow");
    let publication = required(publication, CALL, "publication").0;
    let slot = required(slot, CALL, "slot").0;
    crate::follow::end(&publication, &slot)
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
    crate::follow::wait(&publication, &slot, timeout_ms)
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
    crate::follow::queue::statement(command_tag.is_some_and(|tag| tag.0.ends_with(" PUBLICATION")));
}
