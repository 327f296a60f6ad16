//! Which rows a backfill delivers: those its filter (`filter => ...`) passes and, when it names
//! its pipeline's publication and that publication has a row filter for the table
//! (`CREATE PUBLICATION ... FOR TABLE t WHERE (...)`), only those the publication publishes. A
//! backfill never sends a row that pgoutput withholds from the same consumer: none of that
//! row's later changes would follow it, and it would stay in the consumer's copy for ever.
//!
//! Why the order holds with the publication's filter, as with any filter: a page evaluates it
//! on rows it holds locked, so each read shows the row as the publication judged it at the
//! page's commit. A later change of the row is decoded after the page, and pgoutput evaluates
//! the same filter on the row's old and new versions: an UPDATE into the filter reaches the
//! consumer as an INSERT of the whole row, one out of it as a DELETE, one outside it not at all
//! (PostgreSQL has the filter's columns in the replica identity, so the old version has them).
//! The consumer therefore ends with exactly the rows the publication publishes.
//!
//! The publication's filter is PostgreSQL's own text of it (`pg_get_expr` of
//! `pg_publication_rel.prqual`), which may call only immutable built-in functions and operators
//! on built-in types (PostgreSQL refuses anything else in a publication's filter): it runs as
//! the starter's filter does, in the same query, AND-ed with it. It is recorded per table when
//! the backfill starts (`backfill.job_table.publication_filter`), and each page compares the
//! publication's filter now with it: changed (`ALTER PUBLICATION ... SET TABLE t WHERE ...`),
//! the backfill stops rather than send rows the publication now withholds.

use crate::model::table::Table;
use crate::pg::errors::raise;
use pgrx::PgSqlErrorCode::*;

/// The filter a backfill's pages run on `table`: the publication's row filter (`published`)
/// AND the filter given (`given`); either alone, or none.
///
/// The given filter goes in as selection/filter.rs checks it, between `(\n` and `\n)` (a comment at
/// its end stops at the line's end). It must have been checked alone first (start/estimate.rs's
/// `backfill_filter`): one that closes the parenthesis around it, `true) OR (true`, is one
/// expression again once AND-ed with another, and would pass the combined filter's check while
/// it undid the publication's.
pub fn combined(published: Option<&str>, given: Option<&str>) -> Option<String> {
    match (published, given) {
        (Some(published), Some(given)) => Some(format!("({published}) AND (\n{given}\n)")),
        (published, given) => published.or(given).map(str::to_string),
    }
}

/// The publication's row filter for `table` is still `recorded`, the one the backfill started
/// with: checked at every page, with `now` ([`crate::selection::publication::published`]).
pub fn require_same_published_filter(publication: &str, table: &Table, recorded: Option<&str>, now: Option<&str>) {
    if recorded == now {
        return;
    }
    let shown = |filter: Option<&str>| filter.map(|f| format!("WHERE {f}")).unwrap_or_else(|| "no row filter".into());
    raise(
        ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "publication \"{publication}\" changed its row filter for table {} during its backfill",
            table.qualified_name()
        ),
        format!(
            "The backfill started with {}; the publication now has {}. A backfill sends exactly the rows the \
             publication publishes.",
            shown(recorded),
            shown(now)
        ),
        Some("Cancel the backfill and start a new one: it follows the publication's row filter as it is then.".into()),
    );
}
