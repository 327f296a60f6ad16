//! A table as a backfill sees it: its columns, the key its scan is ordered by, its owner, and
//! whether the current role may backfill it. Shared by the SQL functions and the worker.

use crate::pg::compat;
use crate::pg::encoding::{strings, Text};
use crate::pg::errors::raise;
use crate::pg::errors::OrInternal;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::{self, *};

/// A column of the table, in attribute order (dropped columns left out, as row_to_json does).
#[derive(Debug, Clone)]
pub struct Column {
    pub name: String,
    pub type_oid: pg_sys::Oid,
}

/// One column of the key a table is scanned by (primary key, else replica identity index).
#[derive(Debug, Clone)]
pub struct KeyColumn {
    pub name: String,
    /// Its index in the table's columns.
    pub position: usize,
    /// The column's type, schema-qualified whatever the search_path (see [`qualified_type`]): the
    /// type the cursor's text form is cast back to.
    pub type_name: String,
    /// The index's collation, qualified and quoted, so that the scan sorts as the index does.
    pub collation: Option<String>,
}

/// A table that can be backfilled.
#[derive(Debug, Clone)]
pub struct Table {
    pub relid: pg_sys::Oid,
    /// As whom every query that reads the table runs (see `privilege.rs`).
    pub owner: pg_sys::Oid,
    /// The index the key comes from (primary key, else replica identity index).
    pub key_index: pg_sys::Oid,
    pub schema: String,
    pub name: String,
    pub partitioned: bool,
    /// The columns its rows are delivered with: every column, or those of its column list.
    pub columns: Vec<Column>,
    /// The backfill's column list (`columns => ...`, or its publication's), when it has one.
    pub column_list: Option<Vec<String>>,
    /// The attribute numbers of the list's columns, in the same order: what they are, whatever
    /// they are called later (a column renamed, or dropped and added again, is another column).
    pub column_attnums: Vec<i16>,
    pub key: Vec<KeyColumn>,
    /// The Citus distributed table this table is a shard of: its messages name that table.
    pub shard_of: Option<crate::pg::citus::ShardOf>,
}

/// Why a table cannot be backfilled, in the words an error or the estimate shows.
#[derive(Debug, Clone)]
pub struct Ineligible {
    pub code: PgSqlErrorCode,
    pub reason: String,
    pub hint: Option<String>,
}

impl Table {
    /// `schema.table`, quoted where needed.
    pub fn qualified_name(&self) -> String {
        crate::pg::encoding::quote_qualified(&self.schema, &self.name)
    }

    pub fn key_names(&self) -> Vec<String> {
        self.key.iter().map(|k| k.name.clone()).collect()
    }

    /// The table as a backfill with column list `list` delivers it: those columns only, in the
    /// table's order (as a publication's column list, whatever order they were named in).
    /// `Err` names the first listed column the table does not have (any more). The list is
    /// checked by selection/columns.rs: it holds the key.
    pub fn project(mut self, list: Option<Vec<String>>) -> Result<Table, String> {
        let Some(list) = list else { return Ok(self) };
        if let Some(missing) = list.iter().find(|name| !self.columns.iter().any(|c| &c.name == *name)) {
            return Err(missing.clone());
        }
        self.columns.retain(|c| list.contains(&c.name));
        for key in &mut self.key {
            key.position = self.columns.iter().position(|c| c.name == key.name).unwrap_or_default();
        }
        self.column_list = Some(list);
        Ok(self)
    }
}

/// The key a table `c` (pg_class) is read in the order of, as `LEFT JOIN LATERAL (...) k`: its
/// primary key, else its replica identity index (valid ones), key columns only (an index's
/// INCLUDE columns aside), in index order, with their types (`oid:typmod`), collations and
/// whether their operator classes are pg_catalog's defaults, and the index's access method (see
/// [`not_btree`]). One rule for backfills and for verification (two drifted: a checksum took
/// INCLUDE columns for key columns).
const KEY_OF_TABLE: &str = "  LEFT JOIN LATERAL (
        SELECT pg_catalog.array_agg(a.attname::pg_catalog.text ORDER BY k.ord) AS names,
               pg_catalog.array_agg(a.atttypid::pg_catalog.text OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) a.atttypmod
                         ORDER BY k.ord) AS types,
               pg_catalog.array_agg(cn.nspname::pg_catalog.text ORDER BY k.ord) AS collation_schemas,
               pg_catalog.array_agg(coll.collname::pg_catalog.text ORDER BY k.ord) AS collations,
               pg_catalog.bool_and(opc.opcdefault AND opc.opcnamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace)
                   AS all_default_opclasses,
               pg_catalog.min(i.indexrelid) AS index, pg_catalog.min(i.access_method) AS access_method
          FROM (SELECT i.indexrelid, i.indrelid, i.indkey, i.indcollation, i.indclass, i.indnkeyatts,
                       (SELECT am.amname::pg_catalog.text FROM pg_catalog.pg_class ic
                          JOIN pg_catalog.pg_am am ON am.oid OPERATOR(pg_catalog.=) ic.relam
                         WHERE ic.oid OPERATOR(pg_catalog.=) i.indexrelid) AS access_method
                  FROM pg_catalog.pg_index i
                 WHERE i.indrelid OPERATOR(pg_catalog.=) c.oid AND (i.indisprimary OR i.indisreplident) AND i.indisvalid
                 ORDER BY i.indisprimary DESC
                 LIMIT 1) i
         CROSS JOIN LATERAL ROWS FROM (pg_catalog.unnest(i.indkey::pg_catalog.int2[]), pg_catalog.unnest(i.indcollation::pg_catalog.oid[]),
                                     pg_catalog.unnest(i.indclass::pg_catalog.oid[]))
               WITH ORDINALITY AS k(attnum, collid, opclass, ord)
          JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) i.indrelid
                                        AND a.attnum OPERATOR(pg_catalog.=) k.attnum
          JOIN pg_catalog.pg_opclass opc ON opc.oid OPERATOR(pg_catalog.=) k.opclass
          LEFT JOIN pg_catalog.pg_collation coll ON coll.oid OPERATOR(pg_catalog.=) k.collid
          LEFT JOIN pg_catalog.pg_namespace cn ON cn.oid OPERATOR(pg_catalog.=) coll.collnamespace
         WHERE k.ord OPERATOR(pg_catalog.<=) i.indnkeyatts) k ON true";

fn inspect_sql() -> String {
    format!(
        "
SELECT n.nspname::pg_catalog.text, c.relname::pg_catalog.text, c.relkind::pg_catalog.text, c.relpersistence::pg_catalog.text,
       pg_catalog.has_table_privilege(c.oid, 'SELECT'),
       n.nspname OPERATOR(pg_catalog.=) ANY (ARRAY['pg_catalog', 'information_schema', 'pg_toast', 'backfill']::pg_catalog.name[]),
       k.names, k.types, k.collations, k.all_default_opclasses, cols.names, cols.types,
       pg_catalog.has_any_column_privilege(c.oid, 'UPDATE'), pg_catalog.row_security_active(c.oid), c.relowner, k.index,
       k.collation_schemas, k.access_method
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
{KEY_OF_TABLE}
  LEFT JOIN LATERAL (
        SELECT pg_catalog.array_agg(a.attname::pg_catalog.text ORDER BY a.attnum) AS names, pg_catalog.array_agg(a.atttypid ORDER BY a.attnum) AS types
          FROM pg_catalog.pg_attribute a
         WHERE a.attrelid OPERATOR(pg_catalog.=) c.oid AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped) cols ON true
 WHERE c.oid OPERATOR(pg_catalog.=) $1"
    )
}

/// The columns of a table's key (see [`KEY_OF_TABLE`]), in key order: (name, type as SQL
/// writes it, schema-qualified); empty when it has none. `Err` when its key index is not a
/// btree index ([`not_btree`]).
pub fn key_of(relid: pg_sys::Oid) -> Result<Vec<(String, String)>, Ineligible> {
    let sql = format!(
        "SELECT k.names, k.types, k.index, k.access_method FROM pg_catalog.pg_class c {KEY_OF_TABLE} WHERE c.oid OPERATOR(pg_catalog.=) $1"
    );
    let key = crate::pg::spi::run_prepared(&sql, false, &[relid.into()], |rows| {
        if rows.is_empty() {
            return Ok::<_, spi::Error>(None);
        }
        let row = rows.first();
        let index = row.get::<pg_sys::Oid>(3)?.zip(row.get::<Text>(4)?);
        Ok(row.get::<Vec<Text>>(1)?.zip(row.get::<Vec<String>>(2)?).map(|key| (key, index)))
    })
    .or_internal("read the table's key");
    let Some(((names, types), index)) = key else { return Ok(Vec::new()) };
    if let Some(why) = index.and_then(|(index, access_method)| not_btree(relid, index, &access_method.0)) {
        return Err(why);
    }
    Ok(strings(names).into_iter().zip(types.iter().map(|t| qualified_type(t))).collect())
}

/// Why table `relid`'s key index `index`, of access method `access_method`, cannot be its key,
/// or None when it can: it must be a btree index. A backfill's page finds its last key, and a
/// checksum its ranges' rows, through the order of the key's btree index; an index of another
/// kind has none (a temporal primary key, `WITHOUT OVERLAPS` on 18, is a GiST index), and each
/// page, or each range, would sort or scan the whole table: a backfill of 50,000 rows crawled
/// at 19 rows a second, holding the table in SHARE mode.
fn not_btree(relid: pg_sys::Oid, index: pg_sys::Oid, access_method: &str) -> Option<Ineligible> {
    if access_method == "btree" {
        return None;
    }
    let qualified = relation_name(relid);
    Some(Ineligible {
        code: ERRCODE_FEATURE_NOT_SUPPORTED,
        reason: format!(
            "its key index {} is a {access_method} index, not a btree index: its rows are read in the order of \
             their key, which only a btree index keeps (a primary key WITHOUT OVERLAPS is a GiST index), and \
             without one every page would sort the whole table",
            relation_name(index)
        ),
        hint: Some(format!(
            "Give it a btree key: a primary key on plain columns, or, on a table without a primary key, a unique \
             btree index on NOT NULL columns as its replica identity: ALTER TABLE {qualified} REPLICA IDENTITY \
             USING INDEX ...;"
        )),
    })
}

/// Each key column's collation, qualified and quoted, where the index has one.
fn collations(schemas: Option<Vec<Option<Text>>>, names: Option<Vec<Option<Text>>>) -> Vec<Option<String>> {
    let schemas = schemas.unwrap_or_default();
    names
        .unwrap_or_default()
        .into_iter()
        .zip(schemas)
        .map(|(name, schema)| Some(crate::pg::encoding::quote_qualified(&schema?.0, &name?.0)))
        .collect()
}

fn relkind_name(relkind: &str) -> &'static str {
    match relkind {
        "v" => "a view",
        "m" => "a materialized view",
        "f" => "a foreign table",
        "S" => "a sequence",
        "i" | "I" => "an index",
        "c" => "a composite type",
        "t" => "a TOAST table",
        _ => "not a table",
    }
}

/// Looks a table up and decides whether it can be backfilled by the current user.
pub fn inspect(relid: pg_sys::Oid) -> Result<Table, Ineligible> {
    crate::pg::citus::with_shards_visible(|| inspect_visible(relid))
}

fn inspect_visible(relid: pg_sys::Oid) -> Result<Table, Ineligible> {
    // (Kept prepared: a backfill of many tables inspects each.)
    let row = crate::pg::spi::run_prepared(&inspect_sql(), false, &[relid.into()], |rows| {
        if rows.is_empty() {
            return Ok(None);
        }
        let row = rows.first();
        Ok::<_, spi::Error>(Some((
            row.get::<Text>(1)?.map(|t| t.0).unwrap_or_default(),
            row.get::<Text>(2)?.map(|t| t.0).unwrap_or_default(),
            row.get::<String>(3)?.unwrap_or_default(),
            row.get::<String>(4)?.unwrap_or_default(),
            row.get::<bool>(5)?.unwrap_or(false),
            row.get::<bool>(6)?.unwrap_or(false),
            row.get::<Vec<Text>>(7)?.map(strings),
            row.get::<Vec<String>>(8)?,
            collations(row.get::<Vec<Option<Text>>>(17)?, row.get::<Vec<Option<Text>>>(9)?),
            row.get::<bool>(10)?,
            row.get::<Vec<Text>>(11)?.map(strings).unwrap_or_default(),
            row.get::<Vec<pg_sys::Oid>>(12)?.unwrap_or_default(),
            row.get::<bool>(13)?.unwrap_or(false),
            row.get::<bool>(14)?.unwrap_or(true),
            row.get::<pg_sys::Oid>(15)?.unwrap_or(pg_sys::InvalidOid),
            row.get::<pg_sys::Oid>(16)?.unwrap_or(pg_sys::InvalidOid),
            row.get::<Text>(18)?.map(|t| t.0),
        )))
    })
    .or_internal("inspect the table");

    let Some((
        schema,
        name,
        relkind,
        persistence,
        can_select,
        system,
        names,
        types,
        collations,
        default_opclasses,
        column_names,
        column_types,
        can_update,
        row_security,
        owner,
        key_index,
        access_method,
    )) = row
    else {
        return Err(Ineligible {
            code: ERRCODE_UNDEFINED_TABLE,
            reason: format!("no relation has OID {relid:?}; it was dropped"),
            hint: None,
        });
    };
    let qualified = crate::pg::encoding::quote_qualified(&schema, &name);
    let ineligible = |code, reason: String, hint: Option<String>| Err(Ineligible { code, reason, hint });

    if relkind != "r" && relkind != "p" {
        return ineligible(
            ERRCODE_WRONG_OBJECT_TYPE,
            format!("it is {}, not an ordinary or partitioned table", relkind_name(&relkind)),
            Some("Backfill the table the relation reads from.".into()),
        );
    }
    if system {
        return ineligible(
            ERRCODE_WRONG_OBJECT_TYPE,
            "it is a system or pg_backfill table, whose changes are not decoded as table changes".into(),
            None,
        );
    }
    if persistence == "t" {
        return ineligible(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "it is a temporary table: its changes are never written to WAL, so no consumer could follow them".into(),
            None,
        );
    }
    if persistence == "u" {
        return ineligible(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "it is unlogged: its changes are never written to WAL, so no consumer could follow them".into(),
            Some(format!("Make it logged first: ALTER TABLE {qualified} SET LOGGED;")),
        );
    }
    if !can_select {
        return ineligible(
            ERRCODE_INSUFFICIENT_PRIVILEGE,
            "the current role has no SELECT privilege on it".into(),
            Some(format!(
                "A role that may read the table must start its backfill: GRANT SELECT ON {qualified} TO ...;"
            )),
        );
    }
    if !can_update {
        return ineligible(
            ERRCODE_INSUFFICIENT_PRIVILEGE,
            "the current role has no UPDATE privilege on it: a backfill locks its rows FOR SHARE, \
             which PostgreSQL allows only to roles that may update them"
                .into(),
            Some(format!(
                "A role that may update the table must start its backfill: GRANT UPDATE ON {qualified} TO ...;"
            )),
        );
    }
    if row_security {
        return ineligible(
            ERRCODE_INSUFFICIENT_PRIVILEGE,
            "row-level security filters its rows for the current role, but a backfill delivers every row".into(),
            Some("Start it as the table's owner or as a role with BYPASSRLS.".into()),
        );
    }
    let (Some(names), Some(types)) = (names, types) else {
        return ineligible(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "it has no primary key and no replica identity index, so there is no key to scan it in order by".into(),
            Some(format!(
                "Add a primary key, or make a unique index on NOT NULL columns its replica identity: \
                 ALTER TABLE {qualified} REPLICA IDENTITY USING INDEX ...;"
            )),
        );
    };
    // (Before the operator classes: a GiST key's are btree_gist's, and its kind is the reason.)
    if let Some(why) = access_method.and_then(|access_method| not_btree(relid, key_index, &access_method)) {
        return Err(why);
    }
    if default_opclasses != Some(true) {
        return ineligible(
            ERRCODE_FEATURE_NOT_SUPPORTED,
            "its key index uses an operator class that is not a default one of PostgreSQL's own \
             (pg_catalog), whose order the scan cannot follow: the scan compares keys with \
             pg_catalog's operators only, so that no operator of another schema runs"
                .into(),
            Some("Use a primary key or replica identity index on columns of built-in types (or enums and domains over them).".into()),
        );
    }
    let columns: Vec<Column> =
        column_names.into_iter().zip(column_types).map(|(name, type_oid)| Column { name, type_oid }).collect();
    let key = names
        .into_iter()
        .zip(types)
        .enumerate()
        .map(|(i, (name, type_name))| KeyColumn {
            // A key index's columns are columns of the table (an index on an expression is
            // never a primary key or a replica identity).
            position: columns.iter().position(|c| c.name == name).unwrap_or_default(),
            name,
            type_name: qualified_type(&type_name),
            collation: collations.get(i).cloned().flatten(),
        })
        .collect();
    let shard_of = crate::pg::citus::shard_of(relid);
    Ok(Table {
        relid,
        owner,
        key_index,
        schema,
        name,
        partitioned: relkind == "p",
        columns,
        column_list: None,
        column_attnums: Vec::new(),
        key,
        shard_of,
    })
}

/// The table as a page finds it.
pub struct Recheck {
    /// Its owner now: the page's queries run as this role.
    pub owner: pg_sys::Oid,
    /// Whether its columns are still those the rows are rendered with (no ALTER TABLE added,
    /// dropped or retyped one).
    pub same_columns: bool,
}

impl Table {
    /// Looks at the table as it is now, at the start of a page, and locks it as the page query
    /// does until the transaction ends, so that it stays so for the page. Raises an error that
    /// names it when it can no longer be backfilled as it was: dropped (42P01), made unlogged
    /// (its changes no longer reach the stream; 55000), given another key index, whose order
    /// the cursor does not follow (55000), or, for a Citus shard, moved to another node (55000).
    pub fn recheck(&self, same_columns: impl FnOnce(pg_sys::TupleDesc) -> bool) -> Recheck {
        let name = self.qualified_name();
        // SAFETY: the relation is opened, read and closed here; the lock stays until the
        // transaction ends.
        unsafe {
            let relation = pg_sys::try_relation_open(self.relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
            if relation.is_null() {
                if let Some(shard) = &self.shard_of {
                    // Citus drops a shard's table after moving it: say that it moved.
                    crate::pg::citus::require_placement_here(shard, &name);
                }
                raise(
                    ERRCODE_UNDEFINED_TABLE,
                    format!("table {name} was dropped during its backfill"),
                    format!("Its rows up to the cursor were delivered; table {name} no longer exists."),
                    Some("Cancel the backfill, or resume it to go on with its other tables.".into()),
                );
            }
            let form = &*(*relation).rd_rel;
            let persistence = form.relpersistence as u8;
            let primary = compat::primary_key_index(relation);
            let key_index =
                if primary != pg_sys::InvalidOid { primary } else { pg_sys::RelationGetReplicaIndex(relation) };
            let found = Recheck { owner: form.relowner, same_columns: same_columns((*relation).rd_att) };
            pg_sys::relation_close(relation, pg_sys::NoLock as pg_sys::LOCKMODE);
            if persistence != pg_sys::RELPERSISTENCE_PERMANENT {
                raise(
                    ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                    format!("table {name} became unlogged during its backfill"),
                    "The changes of an unlogged table are never written to WAL, so no consumer could follow them.",
                    Some(format!("Make it logged again (ALTER TABLE {name} SET LOGGED;) and start a new backfill.")),
                );
            }
            if key_index != self.key_index {
                raise(
                    ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                    format!("the key of table {name} changed during its backfill"),
                    format!(
                        "The scan is ordered by ({}), the key it had when the backfill started; its primary \
                         key or replica identity index was dropped or replaced since.",
                        self.key_names().join(", ")
                    ),
                    Some("Start a new backfill of the table.".into()),
                );
            }
            if let Some(shard) = &self.shard_of {
                crate::pg::citus::require_placement_here(shard, &name);
            }
            found
        }
    }
}

/// A type as SQL text, schema-qualified (`public.mood`, `integer`) from `<oid>:<typmod>`.
/// format_type() leaves a type unqualified when the caller's search_path shows it, and the
/// name is later resolved under another path (`pg_catalog, pg_temp`), where it could be a
/// type the caller created in pg_temp.
pub(crate) fn qualified_type(oid_and_typmod: &str) -> String {
    let (oid, typmod) = oid_and_typmod.split_once(':').unwrap_or((oid_and_typmod, "-1"));
    let oid = pg_sys::Oid::from(oid.parse::<u32>().unwrap_or_default());
    let typmod = typmod.parse::<i32>().unwrap_or(-1);
    let flags = (pg_sys::FORMAT_TYPE_TYPEMOD_GIVEN | pg_sys::FORMAT_TYPE_FORCE_QUALIFY) as u16;
    // SAFETY: formats a type named by a catalog row; the string is palloc'd and read at once.
    let formatted = unsafe { std::ffi::CStr::from_ptr(pg_sys::format_type_extended(oid, typmod, flags)) };
    if formatted.to_bytes().is_ascii() || crate::pg::encoding::database_is_utf8() {
        return formatted.to_string_lossy().into_owned();
    }
    // A name that is not ASCII, in a database whose SQL pg_backfill writes in ASCII: the type's
    // own qualified name (a key type's typmod never changes how its values compare).
    crate::pg::spi::select_one::<Vec<Text>>(
        "SELECT ARRAY[n.nspname::pg_catalog.text, t.typname::pg_catalog.text] FROM pg_catalog.pg_type t
           JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) t.typnamespace
          WHERE t.oid OPERATOR(pg_catalog.=) $1",
        &[oid.into()],
    )
    .ok()
    .flatten()
    .map(|parts| crate::pg::encoding::quote_qualified(&parts[0].0, &parts[1].0))
    .unwrap_or_else(|| formatted.to_string_lossy().into_owned())
}

/// Like [`inspect`], but an ineligible table is an error that names it.
pub fn require(relid: pg_sys::Oid) -> Table {
    inspect(relid).unwrap_or_else(|why| {
        let name = relation_name(relid);
        raise(
            why.code,
            format!("table {name} cannot be backfilled"),
            format!("Table {name}: {}.", why.reason),
            why.hint,
        )
    })
}

/// The relation's name as regclass prints it (qualified when not on the search path).
pub fn relation_name(relid: pg_sys::Oid) -> String {
    crate::pg::spi::select_one::<Text>("SELECT $1::pg_catalog.regclass::pg_catalog.text", &[relid.into()])
        .ok()
        .flatten()
        .map(|t| t.0)
        .unwrap_or_else(|| format!("{relid:?}"))
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use super::*;

    fn inspect_table(ddl: &str) -> Result<Table, Ineligible> {
        Spi::run(ddl).unwrap();
        inspect(Spi::get_one::<pg_sys::Oid>("SELECT 'elig_t'::regclass::oid").unwrap().unwrap())
    }

    #[pg_test]
    fn primary_key_columns_come_in_index_order_with_their_types() {
        let table = inspect_table("CREATE TABLE elig_t (a int, b numeric(10,2), c text, PRIMARY KEY (c, a))").unwrap();
        let key: Vec<(String, String)> = table.key.iter().map(|k| (k.name.clone(), k.type_name.clone())).collect();
        assert_eq!(key, vec![("c".into(), "pg_catalog.text".into()), ("a".into(), "integer".into())]);
        assert!(table.key[0].collation.as_deref().unwrap().contains("default"));
    }

    #[pg_test]
    fn replica_identity_index_is_the_key_when_there_is_no_primary_key() {
        let table = inspect_table(
            "CREATE TABLE elig_t (code text NOT NULL, n int);
             CREATE UNIQUE INDEX elig_code ON elig_t (code COLLATE \"C\");
             ALTER TABLE elig_t REPLICA IDENTITY USING INDEX elig_code;",
        )
        .unwrap();
        assert_eq!(table.key_names(), vec!["code".to_string()]);
        assert_eq!(table.key[0].collation.as_deref(), Some("pg_catalog.\"C\""));
    }

    #[pg_test]
    fn table_without_key_is_ineligible_with_a_hint() {
        let why = inspect_table("CREATE TABLE elig_t (a int)").unwrap_err();
        assert_eq!(why.code, PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE);
        assert!(why.reason.contains("no primary key"));
        assert!(why.hint.unwrap().contains("REPLICA IDENTITY USING INDEX"));
    }
}
