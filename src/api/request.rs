//! The requests of the SQL functions, built from their arguments and checked before anything
//! else runs: every argument present or defaulted, each in its range. What needs the tables
//! (their keys, rights, publication) is checked next, by the verb, still before any write.

use crate::model::request::{SourceOptions, StartOptions, StartRequest};
use crate::model::table;
use crate::pg::args::{require_primary, required};
use crate::pg::encoding::Text;
use crate::pg::errors::raise;
use crate::start::options::check_options;
use pgrx::prelude::*;
use pgrx::JsonB;
use pgrx::PgSqlErrorCode::*;

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
    let source = SourceOptions::of_arguments(args.max_replica_lag, args.max_retained_wal, args.max_active_sessions);
    let options = StartOptionArgs {
        batch_size: args.batch_size,
        rows_per_second: args.rows_per_second,
        parallel: args.parallel,
        max_lag: args.max_lag,
        source,
        rows_per_message: args.rows_per_message,
    };
    let request = StartRequest {
        tables: table_list(args.tables, publication.as_deref()),
        confirm: required(args.confirm, CALL, "confirm"),
        // Text, not String: names in the database's encoding, converted (see encoding.rs).
        slot: args.slot.map(|t| t.0),
        publication,
        options: start_options(CALL, options),
        keys: args.keys.map(|keys| keys.0),
        filter: args.filter.map(|t| t.0),
        columns: crate::selection::columns::given(args.columns),
    };
    check_options(&request.options, request.slot.is_some());
    request
}

/// A start's options as an SQL function receives them: backfill_start()'s, backfill_follow()'s.
pub struct StartOptionArgs {
    pub batch_size: Option<i32>,
    pub rows_per_second: Option<i32>,
    pub parallel: Option<i32>,
    pub max_lag: Option<i64>,
    pub source: SourceOptions,
    pub rows_per_message: Option<i32>,
}

/// The start options of `args` for SQL function `call` (every argument present or defaulted),
/// to be checked by start/options.rs.
pub fn start_options(call: &str, args: StartOptionArgs) -> StartOptions {
    StartOptions {
        batch_size: required(args.batch_size, call, "batch_size"),
        // 0: no limit, as in backfill_set() (check_rate refuses a negative rate).
        rows_per_second: args.rows_per_second.filter(|rate| *rate != 0),
        parallel: required(args.parallel, call, "parallel"),
        max_lag: args.max_lag,
        source: args.source,
        rows_per_message: args.rows_per_message,
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
