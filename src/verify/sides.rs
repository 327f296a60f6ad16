//! The two tables a comparison reads (compare.rs): the source, here, and its copy, here or, for
//! a postgres_fdw foreign table, on the foreign table's server through dblink (over the foreign
//! table's server and user mapping), where pg_backfill computes the checksums and row hashes.
//! Both run the same SQL, with every result column as text. A table spread over other servers (a
//! Citus distributed table, on its coordinator) is read as a table here (Citus runs the SQL on
//! its shards, on their nodes); only its sample and checksums come from those servers, through
//! the [`FanOut`] the SQL functions hand in (fan_out.rs).

use crate::pg::encoding::{quote_qualified, Text};
use crate::pg::errors::{raise, OrInternal};
use crate::verify::checksum::{self, Level};
use crate::verify::fan_out::FanOut;
use crate::verify::key_json;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;
use std::collections::{BTreeMap, BTreeSet};

/// Keys per query when listing given keys' rows.
const KEYS_PER_QUERY: usize = 5_000;

/// A table of the comparison, local or behind a foreign table's server.
pub enum Side {
    Local {
        name: String,
        relid: pg_sys::Oid,
    },
    /// A table here whose rows are spread over other servers (a Citus distributed table, on
    /// its coordinator), asked through `fan_out`.
    Spread {
        name: String,
        relid: pg_sys::Oid,
        fan_out: &'static dyn FanOut,
    },
    /// `scanned`: the remote table as a FROM clause reads it there (see [`Side::scanned_table`]).
    Remote {
        dblink: String,
        connection: String,
        name: String,
        scanned: String,
    },
}

/// A key's JSON text (as jsonb renders it: the same on both sides) and its row's
/// hash (None at the count level).
pub type Rows = BTreeMap<String, Row>;

/// A row as a comparison sees it: its hash (None at the count level) and, on the source, its
/// version (xmin): a row that changed and changed back between two reads is not the same row.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Row {
    pub hash: Option<String>,
    pub version: Option<String>,
}

impl Side {
    /// A table of this server: spread if `fan_out` spreads it.
    pub fn here(relid: pg_sys::Oid, fan_out: &'static dyn FanOut) -> Side {
        let name = crate::pg::spi::qualified_name(relid);
        if fan_out.spreads(relid) {
            Side::Spread { name, relid, fan_out }
        } else {
            Side::Local { name, relid }
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Side::Local { name, .. } | Side::Spread { name, .. } | Side::Remote { name, .. } => name,
        }
    }

    /// The table here (InvalidOid on another server).
    pub fn relid(&self) -> pg_sys::Oid {
        match self {
            Side::Local { relid, .. } | Side::Spread { relid, .. } => *relid,
            Side::Remote { .. } => pg_sys::InvalidOid,
        }
    }

    /// Bounds of about `ranges` ranges of equal rows, from a sample of the table's keys.
    pub fn sampled_bounds(&self, key: &[(String, String)], ranges: i32) -> Vec<serde_json::Value> {
        match self {
            // (Which reads the keys as the table's owner, and asks the nodes as the caller.)
            Side::Spread { relid, fan_out, .. } => fan_out.sampled_bounds(*relid, key, ranges),
            _ => self.reading(|| checksum::sampled_bounds(self.relid(), key, ranges)),
        }
    }

    /// Runs `f`, which reads the table, as its owner when it is here (privilege::read_as_owner;
    /// a spread table's parts then as their owner on their servers too); a remote table is
    /// read as its user mapping's user there, by its server's pg_backfill.
    fn reading<R>(&self, f: impl FnOnce() -> R) -> R {
        match self {
            Side::Local { relid, .. } | Side::Spread { relid, .. } => crate::pg::privilege::read_as_owner(*relid, f),
            Side::Remote { .. } => f(),
        }
    }

    /// The table as a FROM clause names it, here or there, by [`crate::selection::scanned`]'s
    /// rule: without inheritance children, whose rows a checksum of the table does not count either.
    pub fn scanned_table(&self) -> String {
        match self {
            Side::Local { relid, .. } | Side::Spread { relid, .. } => crate::selection::scanned::by_oid(*relid),
            Side::Remote { scanned, .. } => scanned.clone(),
        }
    }

    /// Runs `sql` (every column text) here or on the remote server; rows of `columns` texts.
    fn query(&self, sql: &str, columns: usize) -> Vec<Vec<Option<String>>> {
        let (sql, args): (String, Vec<pgrx::datum::DatumWithOid>) = match self {
            Side::Local { .. } | Side::Spread { .. } => (sql.to_string(), vec![]),
            Side::Remote { dblink, connection, .. } => (
                format!("SELECT * FROM {dblink}.dblink($1, $2) AS r({})", text_columns(columns)),
                vec![Text(connection.clone()).into(), Text(sql.to_string()).into()],
            ),
        };
        self.reading(|| {
            fresh_snapshot(|| {
                Spi::connect(|client| {
                    client
                        .select(&sql, None, &args)?
                        .map(|row| (1..=columns).map(|i| Ok(row.get::<Text>(i)?.map(|t| t.0))).collect())
                        .collect::<Result<Vec<_>, pgrx::spi::Error>>()
                })
            })
        })
        .or_internal("read the rows to compare")
    }

    /// (key, hash of the row or of its listed `columns`) of the rows `condition` selects
    /// (`backfill_row` names the row).
    pub fn rows(
        &self,
        key: &[(String, String)],
        (level, columns): (Level, Option<&[String]>),
        condition: &str,
        versioned: bool,
    ) -> Rows {
        let hash = match level {
            Level::Count => "NULL".to_string(),
            _ => format!("backfill.row_hash({})::pg_catalog.text", checksum::hashed_row(columns)),
        };
        let version = if versioned { "backfill_row.xmin::pg_catalog.text" } else { "NULL" };
        let sql = format!(
            "SELECT {}::pg_catalog.text, {hash}, {version} FROM {} backfill_row WHERE {condition}",
            key_json::json_object_of(key, "backfill_row."),
            self.scanned_table()
        );
        self.query(&sql, 3)
            .into_iter()
            .map(|mut r| (r[0].take().unwrap_or_default(), Row { hash: r[1].take(), version: r[2].take() }))
            .collect()
    }
}

fn text_columns(columns: usize) -> String {
    (1..=columns).map(|i| format!("c{i} text")).collect::<Vec<_>>().join(", ")
}

/// Runs `f` with a snapshot taken now: a comparison re-reads rows as they change, within one
/// statement (read committed).
pub fn fresh_snapshot<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: pushed here and popped after `f`; an error in `f` aborts the transaction, which
    // clears the snapshot stack.
    unsafe { pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot()) };
    let result = f();
    // SAFETY: the snapshot pushed above.
    unsafe { pg_sys::PopActiveSnapshot() };
    result
}

/// The copy: a table with the source's columns (name and type, in order; with a column list,
/// the listed ones) here, or a foreign table whose server runs pg_backfill.
pub fn target_side(
    source: pg_sys::Oid,
    target: pg_sys::Oid,
    function: &str,
    listed: Option<&[String]>,
    fan_out: &'static dyn FanOut,
) -> Side {
    let (source_name, target_name) =
        (crate::model::table::relation_name(source), crate::model::table::relation_name(target));
    if source == target {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{function} compares {source_name} with itself"),
            "The source and the target are the same table.",
            Some("Name the copy as the target.".into()),
        );
    }
    checksum::require_readable(target, &target_name);
    let columns = |relid: pg_sys::Oid| {
        Spi::connect(|client| {
            let rows = client.select(&columns_of("$1", listed), None, &[relid.into()])?;
            rows.map(|row| Ok(row.get::<Text>(1)?.map(|t| t.0).unwrap_or_default()))
                .collect::<Result<Vec<String>, pgrx::spi::Error>>()
        })
        .or_internal("read the tables' columns")
    };
    let (source_columns, target_columns) = (columns(source), columns(target));
    if source_columns != target_columns {
        raise(
            ERRCODE_DATATYPE_MISMATCH,
            format!("{target_name} does not have the columns of {source_name}"),
            format!(
                "Rows compare column by column: {source_name} has ({}), {target_name} has ({}).",
                source_columns.join(", "),
                target_columns.join(", ")
            ),
            Some(
                "Give the copy the same columns, with the same types, in the same order (or compare only its \
                 columns: columns => ...)."
                    .into(),
            ),
        );
    }
    let foreign = crate::pg::spi::select_one::<bool>(
        "SELECT c.relkind OPERATOR(pg_catalog.=) 'f' FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) $1",
        &[target.into()],
    )
    .or_internal("read the target's kind")
    .unwrap_or(false);
    if !foreign {
        let key = checksum::key_columns(target, &target_name);
        if key != checksum::key_columns(source, &source_name) {
            raise(
                ERRCODE_DATATYPE_MISMATCH,
                format!("{target_name} does not have the key of {source_name}"),
                "Rows are matched by key: both tables need the same primary key (or replica identity).",
                Some(format!("Give {target_name} the primary key columns of {source_name}, in the same order.")),
            );
        }
        return Side::here(target, fan_out);
    }
    let side = connect(target, &target_name);
    require_same_row_hash(&side, &target_name);
    // The foreign table's declaration may differ from the table it names.
    let remote_columns: Vec<String> = side
        .query(&columns_of(&crate::pg::encoding::quote_literal(side.name()), listed), 1)
        .into_iter()
        .filter_map(|mut r| r[0].take())
        .collect();
    if remote_columns != source_columns {
        raise(
            ERRCODE_DATATYPE_MISMATCH,
            format!("the table of foreign table {target_name} does not have the columns of {source_name}"),
            format!(
                "Rows compare column by column: {source_name} has ({}), {} on the foreign server has ({}).",
                source_columns.join(", "),
                side.name(),
                remote_columns.join(", ")
            ),
            Some("Give the copy the same columns, with the same types, in the same order.".into()),
        );
    }
    side
}

/// The columns of a table (`relation`: an SQL expression of its regclass), one row each, as
/// `name type`, in order; with a column list, the listed ones.
fn columns_of(relation: &str, listed: Option<&[String]>) -> String {
    // (As a JSON literal: ASCII, whatever the names; the same SQL runs on a remote server.)
    let only_listed = listed
        .map(|listed| {
            let names = spi::quote_literal(ascii_json(&serde_json::json!(listed).to_string()));
            format!(
                " AND a.attname::pg_catalog.text OPERATOR(pg_catalog.=) ANY (ARRAY(
                      SELECT pg_catalog.jsonb_array_elements_text({names}::pg_catalog.jsonb)))"
            )
        })
        .unwrap_or_default();
    format!(
        "SELECT pg_catalog.format('%I %s', a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod))
           FROM pg_catalog.pg_attribute a
          WHERE a.attrelid OPERATOR(pg_catalog.=) {relation}::pg_catalog.regclass
            AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped{only_listed}
          ORDER BY a.attnum"
    )
}

const CONNECTION: &str = "pg_backfill_compare";

/// A dblink connection to the foreign table's server, as its user mapping says.
fn connect(target: pg_sys::Oid, target_name: &str) -> Side {
    let dblink = crate::pg::spi::schema_of_extension("dblink").unwrap_or_else(|| {
        raise(
            ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("comparing with foreign table {target_name} needs the dblink extension"),
            "The checksums of a foreign table are computed on its server, whose queries run through dblink.",
            Some("CREATE EXTENSION dblink; (it ships with PostgreSQL)".into()),
        )
    });
    let remote = Spi::connect(|client| {
        let rows = client.select(
            "SELECT s.srvname::pg_catalog.text,
                    coalesce((SELECT o.option_value FROM pg_catalog.pg_options_to_table(ft.ftoptions) o
                               WHERE o.option_name OPERATOR(pg_catalog.=) 'schema_name'), n.nspname::pg_catalog.text),
                    coalesce((SELECT o.option_value FROM pg_catalog.pg_options_to_table(ft.ftoptions) o
                               WHERE o.option_name OPERATOR(pg_catalog.=) 'table_name'), c.relname::pg_catalog.text)
               FROM pg_catalog.pg_foreign_table ft
               JOIN pg_catalog.pg_foreign_server s ON s.oid OPERATOR(pg_catalog.=) ft.ftserver
               JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) ft.ftrelid
               JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
              WHERE ft.ftrelid OPERATOR(pg_catalog.=) $1",
            Some(1),
            &[target.into()],
        )?;
        let row = rows.first();
        let text = |i| row.get::<Text>(i).map(|t| t.map(|t| t.0).unwrap_or_default());
        Ok::<_, pgrx::spi::Error>((text(1)?, text(2)?, text(3)?))
    })
    .or_internal("read the foreign table's server");
    let (server, schema, table) = remote;
    // A connection of an earlier comparison that an error interrupted goes first.
    Spi::run(&format!(
        "SELECT {dblink}.dblink_disconnect(c) FROM pg_catalog.unnest({dblink}.dblink_get_connections()) AS c
          WHERE c OPERATOR(pg_catalog.=) '{CONNECTION}'"
    ))
    .or_internal("close an earlier comparison's connection");
    Spi::run_with_args(&format!("SELECT {dblink}.dblink_connect($1, $2)"), &[CONNECTION.into(), Text(server).into()])
        .or_internal("connect to the foreign table's server");
    // The remote session prints keys as this one does (privilege::with_portable_settings), and
    // resolves nothing on a search_path of its own.
    Spi::run_with_args(
        &format!("SELECT {dblink}.dblink_exec($1, $2)"),
        &[
            CONNECTION.into(),
            "SET search_path = pg_catalog, pg_temp; SET DateStyle = ISO; SET TimeZone = UTC; \
             SET IntervalStyle = postgres; SET extra_float_digits = 1"
                .into(),
        ],
    )
    .or_internal("set up the foreign table's session");
    let name = quote_qualified(&schema, &table);
    let mut remote = Side::Remote { dblink, connection: CONNECTION.into(), scanned: name.clone(), name };
    let partitioned = remote.query(
        &format!(
            "SELECT (c.relkind OPERATOR(pg_catalog.=) 'p')::pg_catalog.text FROM pg_catalog.pg_class c
              WHERE c.oid OPERATOR(pg_catalog.=) {}::pg_catalog.regclass",
            crate::pg::encoding::quote_literal(remote.name())
        ),
        1,
    );
    if let Side::Remote { scanned, name, .. } = &mut remote {
        *scanned = crate::selection::scanned::relation(
            name,
            partitioned.first().and_then(|row| row[0].as_deref()) == Some("true"),
        );
    }
    remote
}

/// The copy's server hashes rows as this one does: its checksums are comparable. (pg_backfill
/// 0.5.0 hashed the same bytes with another function.) Checked on one row of every kind of
/// encoding.
fn require_same_row_hash(remote: &Side, target_name: &str) {
    let version = remote
        .query(
            "SELECT e.extversion::pg_catalog.text FROM pg_catalog.pg_extension e
              WHERE e.extname OPERATOR(pg_catalog.=) 'pg_backfill'",
            1,
        )
        .into_iter()
        .next()
        .and_then(|mut row| row[0].take());
    let Some(version) = version else {
        raise(
            ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("the server of foreign table {target_name} has no pg_backfill"),
            "A foreign table's checksums are computed on its own server, by its pg_backfill.",
            Some("Install pg_backfill there too: CREATE EXTENSION pg_backfill;".into()),
        )
    };
    // (-0 and an array: 0.6.0 hashed both otherwise.)
    const PROBE: &str = "SELECT backfill.row_hash(ROW(1, 'probe'::pg_catalog.text, NULL::pg_catalog.int8, \
                         '{\"n\": [1.5, true, null], \"s\": \"x\"}'::pg_catalog.jsonb, 2.5::pg_catalog.numeric, \
                         '-0'::pg_catalog.float8, ARRAY[1, NULL]::pg_catalog.int4[]))::pg_catalog.text";
    let hash = |side: &Side| side.query(PROBE, 1).into_iter().next().and_then(|mut row| row[0].take());
    let here = hash(&Side::Local { name: String::new(), relid: pg_sys::InvalidOid });
    if hash(remote) != here {
        raise(
            ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("the server of foreign table {target_name} hashes rows otherwise than this one"),
            format!("Its pg_backfill ({version}) computes another row hash: every checksum would differ."),
            Some(
                "Install the same version of pg_backfill on both servers, then ALTER EXTENSION pg_backfill UPDATE;"
                    .into(),
            ),
        );
    }
}

pub fn disconnect(side: &Side) {
    if let Side::Remote { dblink, connection, .. } = side {
        Spi::run_with_args(&format!("SELECT {dblink}.dblink_disconnect($1)"), &[connection.as_str().into()])
            .or_internal("close the comparison's connection");
    }
}

/// The range checksums of `side` over `bounds`: (rows, checksum) per range.
pub fn range_sums(
    side: &Side,
    key: &[(String, String)],
    bounds: &[serde_json::Value],
    (level, columns): (Level, Option<&[String]>),
) -> Vec<(i64, Option<String>)> {
    match side {
        Side::Local { relid, .. } => side
            .reading(|| fresh_snapshot(|| checksum::summarize(*relid, key, bounds, level, columns)))
            .into_iter()
            .map(|(_, _, _, rows, sum)| (rows, sum))
            .collect(),
        // (Each server answers with a snapshot of its own, and reads its part as its owner.)
        Side::Spread { relid, fan_out, .. } => fan_out.range_sums(*relid, bounds, level),
        Side::Remote { name, .. } => {
            // (A column list needs the remote's pg_backfill 0.9.0 or later.)
            // (As JSON: an ASCII literal, whatever the names.)
            let columns = columns
                .map(|c| {
                    let names = spi::quote_literal(ascii_json(&serde_json::json!(c).to_string()));
                    format!(", ARRAY(SELECT pg_catalog.jsonb_array_elements_text({names}::pg_catalog.jsonb))")
                })
                .unwrap_or_default();
            let sql = format!(
                "SELECT rows::pg_catalog.text, checksum FROM backfill.checksum({}::pg_catalog.regclass::pg_catalog.oid, 1, {}, {}::pg_catalog.jsonb{columns}) ORDER BY range",
                crate::pg::encoding::quote_literal(name),
                spi::quote_literal(level.name()),
                spi::quote_literal(ascii_json(&serde_json::Value::Array(bounds.to_vec()).to_string()))
            );
            side.query(&sql, 2)
                .into_iter()
                .map(|mut r| (r[0].take().and_then(|n| n.parse().ok()).unwrap_or(0), r[1].take()))
                .collect()
        }
    }
}

/// JSON text with every character outside ASCII escaped (`\\u00e9`): a literal in SQL that the
/// comparison writes must be ASCII, whatever the database's encoding (see encoding.rs).
fn ascii_json(json: &str) -> String {
    let mut ascii = String::with_capacity(json.len());
    for c in json.chars() {
        if c.is_ascii() {
            ascii.push(c);
        } else {
            for unit in c.encode_utf16(&mut [0; 2]) {
                ascii.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    ascii
}

/// `backfill_row`'s key against a bound: `key >= bound` (`>=`) or `key < bound` (`<`).
pub fn against(key: &[(String, String)], op: &str, bound: &serde_json::Value) -> String {
    let literal = spi::quote_literal(ascii_json(&bound.to_string()));
    let row =
        key_json::key_expression(key, |column, _| format!("backfill_row.{}", crate::pg::encoding::quote_ident(column)));
    let bound = key_json::key_expression(key, |column, type_name| {
        key_json::key_from_json(&format!("{literal}::pg_catalog.jsonb"), column, type_name)
    });
    format!("{row} OPERATOR(pg_catalog.{op}) {bound}")
}

/// The condition of the rows of the given keys.
fn of_keys(key: &[(String, String)], keys: &[&String]) -> String {
    let literal =
        spi::quote_literal(ascii_json(&format!("[{}]", keys.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(","))));
    let row =
        key_json::key_expression(key, |column, _| format!("backfill_row.{}", crate::pg::encoding::quote_ident(column)));
    // (A subquery's columns, one per key column: `ROW(a, b) = ANY (SELECT ROW(...))` compares a
    // row with one column.)
    let each: Vec<String> =
        key.iter().map(|(column, type_name)| key_json::key_from_json("e.v", column, type_name)).collect();
    format!(
        "{row} OPERATOR(pg_catalog.=) ANY (SELECT {} FROM pg_catalog.jsonb_array_elements({literal}::pg_catalog.jsonb) AS e(v))",
        each.join(", ")
    )
}

/// The rows of `keys` on `side`.
pub fn rows_of_keys(
    side: &Side,
    key: &[(String, String)],
    measure: (Level, Option<&[String]>),
    keys: &BTreeSet<String>,
    versioned: bool,
) -> Rows {
    let keys: Vec<&String> = keys.iter().collect();
    keys.chunks(KEYS_PER_QUERY).flat_map(|chunk| side.rows(key, measure, &of_keys(key, chunk), versioned)).collect()
}
