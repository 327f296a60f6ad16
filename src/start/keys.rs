//! Backfills of given keys: `backfill_start(..., keys => ...)`, which backfill_repair() starts
//! (the SQL of 0.9.0 and a Citus worker node give them through api/keyed.rs).
//!
//! The keys are checked, cast to the key's types, sorted and deduplicated when the backfill
//! starts (as the table's owner: a key type's input function is its code), and kept in
//! `backfill.job_key`. The worker then delivers them in pages (worker/keyed_page.rs).

use crate::catalog::job;
use crate::catalog::job_table::{self, GivenKey};
use crate::model::state::LockMode;
use crate::model::table::Table;
use crate::pg::encoding::{KeyText, Text};
use crate::pg::errors::{raise, OrInternal};
use crate::pg::privilege::{self, as_extension_owner};
use pgrx::prelude::*;
use pgrx::JsonB;
use pgrx::PgSqlErrorCode::*;

/// Records the keys of backfill `id`, started in this transaction by the SQL of 0.9.0 or
/// before, or by a worker node's backfill_start() for the coordinator: of its one table, or of
/// `table` (backfill.set_keys_of()).
pub fn record_keys(id: i64, table: Option<pg_sys::Oid>, keys: serde_json::Value) {
    // Only in the transaction that started it: its worker starts at commit and finds the keys.
    require_starting_here(
        id,
        format!("keys cannot be given to backfill {id}"),
        "Keys are given when a backfill starts, in the same statement.",
        "SELECT backfill_start('public.orders', confirm => true, keys => '[{\"id\": 7}]');",
    );
    let mut tables = as_extension_owner(|| job_table::job_tables(id));
    if let Some(table) = table {
        tables.retain(|job_table| job_table.relid == table);
    }
    require_one_range(tables.len());
    let job_table = &tables[0];
    if as_extension_owner(|| job_table::is_keyed(id, job_table.position)) {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("backfill {id} already has its keys"),
            "Keys are given once, when the backfill starts; a second list would be delivered with the first.",
            Some("Give every key in one list: backfill_start(..., keys => '[{\"id\": 7}, {\"id\": 8}]').".into()),
        );
    }
    let table = crate::model::table::require(job_table.relid);
    let filtered = as_extension_owner(|| job::job(id)).is_some_and(|job| job.row_filter.is_some());
    let sorted = checked_keys(&table, keys, filtered);
    as_extension_owner(|| {
        store(id, job_table.position, &sorted, table.key.len());
        job::set_lock_mode(id, LockMode::Table);
    });
}

/// The entry points that shape a backfill as it starts (backfill.set_keys() and
/// set_rows_per_message() of the SQL of 0.9.0, set_keys_of() of a Citus worker node's start):
/// backfill `id` must have been inserted by this transaction, so that no worker has run it (a
/// backfill this transaction only changed, by backfill_set(), pause or resume, is refused with
/// `message`, `detail` and `hint`), and by the calling role. Whoever else holds the transaction
/// (a role whose DDL a follow started the backfill in, a SET ROLE since) may not narrow it.
#[track_caller]
pub fn require_starting_here(id: i64, message: String, detail: &str, hint: &str) {
    if !as_extension_owner(|| job::inserted_in_this_transaction(id)) {
        raise(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, message, detail, Some(hint.into()));
    }
    let started_by = as_extension_owner(|| job::job(id)).map(|job| job.started_by).unwrap_or_default();
    let caller = privilege::current_role_name();
    if started_by != caller {
        raise(
            ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("permission denied to shape backfill {id}"),
            format!(
                "Backfill {id} was started by role {started_by} in this transaction; only that role gives its \
                 keys and message format, as it starts it, and the caller is {caller}."
            ),
            Some(format!(
                "Give them in {started_by}'s own call: backfill_start(..., keys => ..., rows_per_message => ...)."
            )),
        );
    }
}

/// Keys name rows of one table, delivered by one worker: a backfill of `ranges` tables or key
/// ranges takes none.
pub fn require_one_range(ranges: usize) {
    if ranges != 1 {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            "keys need a backfill of one table by one worker",
            format!("The backfill has {ranges} such tables or key ranges; keys name rows of one table."),
            Some("Start one backfill per table, with parallel => 1.".into()),
        );
    }
}

/// The keys `keys` (a JSON array of key objects) of `table`, checked, cast to the key's types,
/// deduplicated and sorted in the key index's order, before anything is written. `filtered`:
/// the backfill has a filter, which keys cannot take.
pub fn checked_keys(table: &Table, keys: serde_json::Value, filtered: bool) -> Vec<GivenKey> {
    if filtered {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            format!("a backfill of table {} cannot take both keys and a filter", table.qualified_name()),
            "A keyed backfill delivers a key without a row as absent, for the consumer to delete: a row the \
             filter leaves out would be neither read nor absent, and a consumer could not tell which.",
            Some(
                "Give only the keys whose rows pass the filter: keys => (SELECT jsonb_agg(...) WHERE <filter>).".into(),
            ),
        );
    }
    if table.partitioned {
        raise(
            ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("table {} cannot be backfilled by keys", table.qualified_name()),
            "It is partitioned: a keyed backfill locks its table against writers, which a writer naming a \
             partition does not wait for.",
            Some("Backfill the partitions' keys, one backfill per partition.".into()),
        );
    }
    let key: Vec<(String, String)> = table.key.iter().map(|k| (k.name.clone(), k.type_name.clone())).collect();
    // (The keys are cast, sorted and stored when the backfill starts, in this backend's memory.)
    let most = crate::pg::settings::compare_max_keys();
    let keys = crate::verify::key_json::checked_keys(
        keys,
        &key,
        "keys",
        (
            most,
            "A keyed backfill takes at most backfill.compare_max_keys keys, as many as a comparison lists.",
            "Backfill the whole table instead, or raise the setting: SET backfill.compare_max_keys = ...;",
        ),
    );
    if keys.is_empty() {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            "keys is empty",
            "A keyed backfill delivers the keys given; an empty list would deliver nothing.",
            Some("Leave keys out (NULL) to backfill the whole table.".into()),
        );
    }
    // Cast as the table's owner: a key type's input function and ordering are its code.
    privilege::read_as(table.owner, table.relid, || sorted_keys(table, keys))
}

/// The keys cast to the key's types, deduplicated, in the key index's order.
fn sorted_keys(table: &Table, keys: Vec<serde_json::Value>) -> Vec<GivenKey> {
    let column = |i: usize| format!("k.c{i}");
    let casts: Vec<String> = table
        .key
        .iter()
        .enumerate()
        .map(|(i, k)| format!("{} AS c{i}", crate::verify::key_json::key_from_json("e.v", &k.name, &k.type_name)))
        .collect();
    let order: Vec<String> = table
        .key
        .iter()
        .enumerate()
        .map(|(i, k)| {
            format!("{}{}", column(i), k.collation.as_ref().map(|c| format!(" COLLATE {c}")).unwrap_or_default())
        })
        .collect();
    let as_text: Vec<String> = (0..table.key.len()).map(|i| format!("{}::pg_catalog.text", column(i))).collect();
    let as_json: Vec<String> =
        (0..table.key.len()).map(|i| format!("pg_catalog.to_json({})::pg_catalog.text", column(i))).collect();
    let sql = format!(
        "SELECT ARRAY[{}], ARRAY[{}]
           FROM (SELECT DISTINCT {} FROM pg_catalog.jsonb_array_elements($1) AS e(v)) k
          ORDER BY {}",
        as_text.join(", "),
        as_json.join(", "),
        casts.join(", "),
        order.join(", ")
    );
    let keys = JsonB(serde_json::Value::Array(keys));
    Spi::connect(|client| {
        client
            .select(&sql, None, &[keys.into()])?
            .map(|row| GivenKey::of_row(&row))
            .collect::<Result<Vec<_>, pgrx::spi::Error>>()
    })
    .or_internal("read the keys")
}

/// Records the keys of range `position` of backfill `id`; the range's estimate becomes their number.
pub fn store(id: i64, position: i32, keys: &[GivenKey], key_len: usize) {
    let text: Vec<KeyText> = keys.iter().flat_map(|k| k.text.iter().cloned()).collect();
    let json: Vec<Text> = keys.iter().flat_map(|k| k.json.iter().map(|j| Text(j.clone()))).collect();
    Spi::run_with_args(
        "INSERT INTO backfill.job_key (job_id, position, ordinal, key, key_json)
         SELECT $1, $2, o, $3[f.lo : f.hi], $4[f.lo : f.hi]
           FROM pg_catalog.generate_series(1, $6) AS o
          CROSS JOIN LATERAL (SELECT (o OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog.*) $5 OPERATOR(pg_catalog.+) 1,
                                     o OPERATOR(pg_catalog.*) $5) AS f(lo, hi);
         UPDATE backfill.job_table SET rows_estimated = $6
          WHERE job_id OPERATOR(pg_catalog.=) $1 AND position OPERATOR(pg_catalog.=) $2",
        &[id.into(), position.into(), text.into(), json.into(), (key_len as i32).into(), (keys.len() as i64).into()],
    )
    .or_internal("record the backfill's keys")
}
