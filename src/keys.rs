//! Backfills of given keys: `backfill_start(..., keys => ...)`, which backfill_repair() starts.
//!
//! The keys are checked, cast to the key's types, sorted and deduplicated when the backfill
//! starts (as the table's owner: a key type's input function is its code), and kept in
//! `backfill.job_key`. The worker then delivers them in pages of at most `batch_size` keys: a
//! key with a row is read as any row is; a key without one is delivered as `absent`.
//!
//! Why an `absent` sorts right against a concurrent insert of its key: a keyed page always
//! holds the table in SHARE mode (lock.rs) from before its queries take their snapshots until
//! it commits. No writer of the table is in progress when the lock is granted, and none can
//! write it until the page commits. A key the page finds absent was therefore absent in every
//! committed state before the page's commit, and an insert of it commits after the page, so its
//! change is decoded after the `absent`. (Row locks could not give this: an absent row has none.)

use crate::args::required;
use crate::auth::Signer;
use crate::encoding::{quote_ident, KeyText, Text};
use crate::errors::{raise, OrInternal};
use crate::lock::LockMode;
use crate::page::{Page, TableScan};
use crate::privilege::{self, as_extension_owner};
use crate::ranges::{self, GivenKey, JobTable};
use crate::table::Table;
use crate::{catalog, message};
use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;
use pgrx::JsonB;
use pgrx::PgSqlErrorCode::*;

/// backfill.set_keys(): makes the backfill `id`, started in this transaction, deliver exactly
/// the keys `keys` (a JSON array of key objects) of its one table. NULL keys: the whole table,
/// as started. Returns the id, so that backfill_start()'s SQL wrapper chains it.
#[pg_extern(schema = "backfill", name = "set_keys")]
fn set_keys(id: Option<i64>, keys: Option<JsonB>) -> Option<i64> {
    let Some(keys) = keys else { return id };
    let id = required(id, "backfill_start", "id");
    record_keys(id, keys.0);
    Some(id)
}

/// Records the keys of backfill `id` (see [`set_keys`]).
pub fn record_keys(id: i64, keys: serde_json::Value) {
    // Only in the transaction that started it: its worker starts at commit and finds the keys.
    let xmin = as_extension_owner(|| catalog::recorded_by(id));
    // SAFETY: asks whether an xid is this transaction's (or a subtransaction's); no side effect.
    let started_here = xmin.is_some_and(|xmin| unsafe {
        pg_sys::TransactionIdIsCurrentTransactionId(pg_sys::TransactionId::from(xmin as u32))
    });
    if !started_here {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("keys cannot be given to backfill {id}"),
            "Keys are given when a backfill starts, in the same statement.",
            Some("SELECT backfill_start('public.orders', confirm => true, keys => '[{\"id\": 7}]');".into()),
        );
    }
    let tables = as_extension_owner(|| ranges::job_tables(id));
    let [job_table] = tables.as_slice() else {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            "keys need a backfill of one table by one worker",
            format!("The backfill has {} tables or key ranges; keys name rows of one table.", tables.len()),
            Some("Start one backfill per table, with parallel => 1.".into()),
        );
    };
    if as_extension_owner(|| ranges::is_keyed(id, job_table.position)) {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("backfill {id} already has its keys"),
            "Keys are given once, when the backfill starts; a second list would be delivered with the first.",
            Some("Give every key in one list: backfill_start(..., keys => '[{\"id\": 7}, {\"id\": 8}]').".into()),
        );
    }
    let table = crate::table::require(job_table.relid);
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
    let most = crate::settings::COMPARE_MAX_KEYS.get() as usize;
    let keys = crate::key_json::checked_keys(
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
    let sorted = privilege::run_as(table.owner, || sorted_keys(&table, keys));
    as_extension_owner(|| {
        store(id, job_table.position, &sorted, key.len());
        catalog::set_lock_mode(id, LockMode::Table);
    });
}

/// The keys cast to the key's types, deduplicated, in the key index's order.
fn sorted_keys(table: &Table, keys: Vec<serde_json::Value>) -> Vec<GivenKey> {
    let column = |i: usize| format!("k.c{i}");
    let casts: Vec<String> = table
        .key
        .iter()
        .enumerate()
        .map(|(i, k)| format!("{} AS c{i}", crate::key_json::key_from_json("e.v", &k.name, &k.type_name)))
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

fn store(id: i64, position: i32, keys: &[GivenKey], key_len: usize) {
    let text: Vec<KeyText> = keys.iter().flat_map(|k| k.text.iter().cloned()).collect();
    let json: Vec<Text> = keys.iter().flat_map(|k| k.json.iter().map(|j| Text(j.clone()))).collect();
    Spi::run_with_args(
        "INSERT INTO backfill.job_key (job_id, position, ordinal, key, key_json)
         SELECT $1, $2, o, $3[(o - 1) * $5 + 1 : o * $5], $4[(o - 1) * $5 + 1 : o * $5]
           FROM pg_catalog.generate_series(1, $6) AS o;
         UPDATE backfill.job_table SET rows_estimated = $6 WHERE job_id = $1 AND position = $2",
        &[id.into(), position.into(), text.into(), json.into(), (key_len as i32).into(), (keys.len() as i64).into()],
    )
    .or_internal("record the backfill's keys")
}

impl TableScan<'_> {
    /// The scan's upper bound, as text values and as JSON values, None if the table is empty:
    /// a keyed scan's greatest key given, else the table's greatest key now.
    pub(crate) fn greatest_key(&self) -> Option<(Vec<KeyText>, Vec<String>)> {
        if self.keyed {
            return ranges::last_key(self.backfill_id, self.position);
        }
        privilege::run_as(self.owner, || {
            Spi::connect(|client| {
                let rows = client.select(&self.queries.upper_bound(), None, &[])?;
                if rows.is_empty() {
                    return Ok::<_, pgrx::spi::Error>(None);
                }
                let row = rows.first();
                let k = self.queries.key_len();
                // Key columns are never NULL.
                let key = (1..=k)
                    .map(|i| row.get::<KeyText>(i).map(Option::unwrap_or_default))
                    .collect::<Result<Vec<_>, _>>()?;
                let json = (k + 1..=2 * k)
                    .map(|i| row.get::<Text>(i).map(|v| v.map(|t| t.0).unwrap_or_default()))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Some((key, json)))
            })
        })
        .or_internal("read the table's greatest key")
    }

    /// One page of a keyed scan: the next keys, each read (if its row exists) or delivered
    /// absent, under the table's SHARE lock (see the module's comment).
    pub(crate) fn key_page(&mut self, progress: &JobTable, rows_per_page: i32, signer: &Signer) -> Page {
        let (locking, rows_per_page) = self.locks.lock_page(self.table.relid, rows_per_page);
        let keys = ranges::next_keys(self.backfill_id, self.position, progress.rows_done, rows_per_page);
        let Some(last) = keys.last() else {
            return self.end_scan(progress.rows_done, signer);
        };
        // One text[] of values per key column.
        let args: Vec<DatumWithOid> = (0..self.table.key.len())
            .map(|column| keys.iter().map(|k| k.text[column].clone()).collect::<Vec<_>>().into())
            .collect();
        let (read, mut bytes) = self.deliver_rows(&key_rows(&self.table, locking), &args, signer);
        let absent_sql = absent_keys(&self.table);
        let absent: Vec<i64> = privilege::run_as(self.owner, || {
            crate::sql::run_prepared(&absent_sql, false, &args, |rows| {
                rows.map(|row| Ok(row.get::<i64>(1)?.unwrap_or_default())).collect()
            })
        })
        .or_internal("find the absent keys");
        for ordinal in &absent {
            let key = &keys[*ordinal as usize - 1];
            let marker = message::absent(self.backfill_id, self.slot.as_deref(), &self.table, &key.json);
            bytes += marker.len() as i64;
            message::emit_marker(self.prefix, signer, marker);
        }
        self.load.delivered(read + absent.len() as i64);
        let counted = self.counts_lock_paths.then_some(locking == crate::lock::Locking::Table);
        ranges::advance_cursor(self.backfill_id, self.position, last.text.clone(), keys.len() as i64, bytes, counted);
        Page::More
    }
}

/// A keyed page's SQL: the key's columns (`t.a` or `(t.a, t.b)`), the page's keys cast back to
/// the key's types (`k.c0::type, ...`), and where they come from: one text[] parameter per key
/// column, unnested together.
struct KeySql {
    columns: String,
    casts: Vec<String>,
    unnest: String,
    names: String,
}

impl KeySql {
    fn of(table: &Table) -> Self {
        let columns = table.key.iter().map(|k| format!("t.{}", quote_ident(&k.name))).collect::<Vec<_>>();
        // ROWS FROM: a qualified unnest() takes one array (only a bare one in FROM takes several).
        let params =
            (1..=table.key.len()).map(|i| format!("pg_catalog.unnest(${i}::pg_catalog.text[])")).collect::<Vec<_>>();
        KeySql {
            columns: if columns.len() == 1 { columns[0].clone() } else { format!("({})", columns.join(", ")) },
            casts: table.key.iter().enumerate().map(|(i, k)| format!("k.c{i}::{}", k.type_name)).collect(),
            unnest: format!("ROWS FROM ({})", params.join(", ")),
            names: (0..table.key.len()).map(|i| format!("c{i}")).collect::<Vec<_>>().join(", "),
        }
    }
}

/// The rows of a keyed page, for delivery: those of the given keys that exist.
fn key_rows(table: &Table, locking: crate::lock::Locking) -> String {
    let KeySql { columns, casts, unnest, names } = KeySql::of(table);
    let order = table.key.iter().map(|k| format!("t.{}", quote_ident(&k.name))).collect::<Vec<_>>().join(", ");
    let lock = locking.clause();
    format!(
        "SELECT {} FROM ONLY {} t WHERE {columns} IN (SELECT {} FROM {unnest} AS k({names})) ORDER BY {order}{lock}",
        crate::json::select_list(&table.columns),
        table.qualified_name(),
        casts.join(", "),
    )
}

/// The ordinals (from 1) of the page's keys that have no row.
fn absent_keys(table: &Table) -> String {
    let KeySql { columns, casts, unnest, names } = KeySql::of(table);
    let key = if casts.len() == 1 { casts[0].clone() } else { format!("({})", casts.join(", ")) };
    format!(
        "SELECT k.o FROM {unnest} WITH ORDINALITY AS k({names}, o)
          WHERE NOT EXISTS (SELECT FROM ONLY {} t WHERE {columns} = {key})",
        table.qualified_name()
    )
}
