//! A pipeline's publication, read one way: pgoutput's, by OID. Whether it holds a table (a
//! table renamed or moved to another schema is still the table it lists), what it publishes of
//! it, its columns and its row filter, which a backfill for the publication's consumer follows
//! (columns.rs, row_filter.rs), and which tables it holds, for a backfill of all of them or a
//! follow. The one place that reads pg_publication_rel, pg_publication_namespace and
//! pg_publication_tables (pg/compat.rs's version shims aside), and that says a publication
//! does not exist.

use crate::model::table::Table;
use crate::pg::encoding::Text;
use crate::pg::errors::{raise, OrInternal};
use crate::pg::privilege;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;

/// What a publication publishes of a table, as pgoutput sends it.
#[derive(Default, Clone)]
pub struct Published {
    /// Its columns, in the table's order, when they are not all of the table's columns.
    pub columns: Option<Vec<String>>,
    /// Its row filter (`CREATE PUBLICATION ... FOR TABLE t WHERE (...)`), as SQL text: only the
    /// rows it is true for are published.
    pub row_filter: Option<String>,
}

/// What `publication` publishes of `table` (see [`Published`]). Raises if the publication does
/// not exist, or does not hold the table under the table's own name.
///
/// It holds the table when it publishes one of the table's leaves as the table or one of its
/// partitions: a partition that `publish_via_partition_root` publishes as its partitioned table
/// is in no change under its own name, and a backfill of it alone would send reads its consumer
/// cannot place. A partitioned table without partitions has nothing withheld.
///
/// As pgoutput decides, for each of the table's leaves (a plain table is its own): the
/// publication holds the leaf when it lists it, its schema or an ancestor's (or is FOR ALL
/// TABLES), and publishes it as its topmost held ancestor with `publish_via_partition_root`,
/// else as itself. That relation's column list in the publication gives its columns (without
/// one: every column, the generated ones as
/// [`crate::pg::compat::publishes_stored_generated_columns`] says), and its row filter the
/// rows, unless the publication is FOR ALL TABLES or lists its schema.
///
/// A partitioned table's rows are published partition by partition: every partition must be
/// held, with one and the same column list, or the backfill would send what the publication
/// withholds from some of them (their columns, or their rows); and none with a row filter, which
/// a backfill of a partitioned table cannot apply. Raises otherwise, naming the partition.
pub fn published(publication: &str, table: &Table) -> Published {
    let leaves = published_leaves(publication, table);
    if leaves.is_empty() && !exists(publication) {
        no_such_publication(publication);
    }
    let name = table.qualified_name();
    if !leaves.is_empty() && !leaves.iter().any(|leaf| leaf.held && leaf.as_the_table) {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("table {name} is not in publication \"{publication}\""),
            "A backfill delivers only the pipeline's own tables: the consumer would never receive the changes that follow the snapshot.",
            Some(format!("Add it first: ALTER PUBLICATION {} ADD TABLE {name};", crate::pg::encoding::quote_ident(publication))),
        );
    }
    if table.partitioned {
        if let Some(leaf) = leaves.iter().find(|leaf| !leaf.held) {
            raise(
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("partition {} of table {name} is not in publication \"{publication}\"", leaf.name),
                "A backfill of a partitioned table delivers every partition's rows; the pipeline's consumer \
                 receives no change of this one.",
                Some(format!(
                    "Add it to the publication, or backfill the published partitions one by one: \
                     SELECT backfill_start(ARRAY[...]::regclass[], publication => {});",
                    pgrx::spi::quote_literal(publication)
                )),
            );
        }
        let as_set = |list: &[String]| list.iter().cloned().collect::<std::collections::BTreeSet<String>>();
        if let Some(leaf) = leaves.iter().find(|leaf| as_set(&leaf.columns) != as_set(&leaves[0].columns)) {
            raise(
                ERRCODE_FEATURE_NOT_SUPPORTED,
                format!("the partitions of table {name} are published with different columns"),
                format!(
                    "Publication \"{publication}\" publishes partition {} with other columns than {}; \
                     a backfill of the partitioned table sends one set of columns for every partition.",
                    leaf.name, leaves[0].name
                ),
                Some("Backfill the partitions one by one, each with its publication's columns.".into()),
            );
        }
        if let Some((leaf, filter)) = leaves.iter().find_map(|leaf| Some((leaf, leaf.row_filter.as_ref()?))) {
            // (A partition published as its partitioned table is published as nothing else, and
            // cannot be backfilled on its own: its reads would name another table than its changes.)
            let (whose, hint) = if leaf.as_ancestor {
                (
                    "the rows of its partitions, published as those of their partitioned table,".to_string(),
                    "No backfill can follow that filter yet: backfill the table for a publication without a row \
                     filter for it; or publish its partitions with publish_via_partition_root = false, each with \
                     the row filter, and backfill them one by one."
                        .to_string(),
                )
            } else {
                (
                    format!("the rows of partition {}", leaf.name),
                    format!(
                        "Backfill its partitions one by one, each of which follows the publication's row filter: \
                         SELECT backfill_start(ARRAY[...]::regclass[], publication => {});",
                        pgrx::spi::quote_literal(publication)
                    ),
                )
            };
            raise(
                ERRCODE_FEATURE_NOT_SUPPORTED,
                format!("table {name} cannot be backfilled for publication \"{publication}\""),
                format!(
                    "The publication publishes only {whose} where {filter}; a backfill of a partitioned table \
                     cannot filter its rows (a filtered page finds its rows again by their row ids, which are \
                     unique only within one partition)."
                ),
                Some(hint),
            );
        }
    }
    let Some(first) = leaves.into_iter().next().filter(|leaf| leaf.held) else { return Published::default() };
    // In the table's order (a partition's columns have its partitioned table's names).
    let in_order = crate::pg::spi::column_names(table.relid);
    let every_column = in_order.iter().all(|c| first.columns.contains(c)) && first.columns.len() == in_order.len();
    Published {
        columns: (!every_column).then(|| in_order.into_iter().filter(|c| first.columns.contains(c)).collect()),
        row_filter: first.row_filter,
    }
}

/// One leaf of a table as a publication publishes it (see [`published`]).
struct PublishedLeaf {
    /// Its name, for messages.
    name: String,
    held: bool,
    /// Whether it is published as an ancestor (`publish_via_partition_root`).
    as_ancestor: bool,
    /// Whether it is published as the table or one of the table's partitions.
    as_the_table: bool,
    /// Its published columns' names, in attribute order.
    columns: Vec<String>,
    row_filter: Option<String>,
}

/// The leaves of `table` (itself, if it is not partitioned) as `publication` publishes them;
/// none when the publication does not exist (or the table is partitioned, without partitions).
fn published_leaves(publication: &str, table: &Table) -> Vec<PublishedLeaf> {
    // Whether the publication lists the relation `rel` itself, or its schema.
    let in_schema = |rel: &str| {
        format!(
            "EXISTS (SELECT FROM pg_catalog.pg_publication_namespace n
                       JOIN pg_catalog.pg_class c ON c.relnamespace OPERATOR(pg_catalog.=) n.pnnspid
                      WHERE n.pnpubid OPERATOR(pg_catalog.=) p.oid AND c.oid OPERATOR(pg_catalog.=) {rel})"
        )
    };
    let lists = |rel: &str| {
        format!(
            "(EXISTS (SELECT FROM pg_catalog.pg_publication_rel r
                       WHERE r.prpubid OPERATOR(pg_catalog.=) p.oid AND r.prrelid OPERATOR(pg_catalog.=) {rel}
                         AND {adds})
              OR {})",
            in_schema(rel),
            adds = crate::pg::compat::publication_rel_adds("r"),
        )
    };
    // Whether the publication is FOR ALL TABLES and does not leave the relation `rel` out.
    let all_tables =
        |rel: &str| format!("(p.puballtables AND NOT {})", crate::pg::compat::excepted_from_all_tables("p", rel));
    let query = format!(
        "SELECT l.relid::pg_catalog.regclass::pg_catalog.text,
                {all_tables} OR {listed} OR top.relid IS NOT NULL,
                ARRAY(SELECT a.attname::pg_catalog.text FROM pg_catalog.pg_attribute a
                       WHERE a.attrelid OPERATOR(pg_catalog.=) s.relid
                         AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped
                         AND CASE WHEN r.prattrs IS NOT NULL
                                  THEN a.attnum OPERATOR(pg_catalog.=) ANY (r.prattrs::pg_catalog.int2[])
                                  ELSE a.attgenerated OPERATOR(pg_catalog.=) ''
                                    OR (a.attgenerated OPERATOR(pg_catalog.=) 's' AND {stored}) END
                       ORDER BY a.attnum),
                CASE WHEN NOT p.puballtables AND NOT {schema_listed}
                     THEN pg_catalog.pg_get_expr(r.prqual, r.prrelid) END,
                s.relid OPERATOR(pg_catalog.<>) l.relid,
                s.relid OPERATOR(pg_catalog.=) $2
                  OR EXISTS (SELECT FROM pg_catalog.pg_partition_tree($2::pg_catalog.regclass) t
                              WHERE t.relid::pg_catalog.oid OPERATOR(pg_catalog.=) s.relid)
           FROM pg_catalog.pg_publication p
          CROSS JOIN (SELECT t.relid::pg_catalog.oid FROM pg_catalog.pg_partition_tree($2::pg_catalog.regclass) t
                       WHERE t.isleaf
                      -- (A table that is neither partitioned nor a partition has no tree.)
                      UNION ALL
                      SELECT $2 WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_partition_tree($2::pg_catalog.regclass))) l
           -- Its topmost ancestor the publication holds (any, FOR ALL TABLES: its root).
           LEFT JOIN LATERAL (
                SELECT x.relid::pg_catalog.oid FROM pg_catalog.pg_partition_ancestors(l.relid) WITH ORDINALITY x(relid, level)
                 WHERE x.level OPERATOR(pg_catalog.>) 1 AND ({ancestor_in_all_tables} OR {ancestor_listed})
                 ORDER BY x.level DESC LIMIT 1) top ON true
          -- The relation it is published as.
          CROSS JOIN LATERAL (SELECT CASE WHEN p.pubviaroot AND top.relid IS NOT NULL THEN top.relid ELSE l.relid END AS relid) s
           LEFT JOIN pg_catalog.pg_publication_rel r
                  ON NOT p.puballtables AND r.prpubid OPERATOR(pg_catalog.=) p.oid AND r.prrelid OPERATOR(pg_catalog.=) s.relid
          WHERE p.pubname OPERATOR(pg_catalog.=) $1",
        all_tables = all_tables("l.relid"),
        listed = lists("l.relid"),
        ancestor_in_all_tables = all_tables("x.relid"),
        ancestor_listed = lists("x.relid"),
        schema_listed = in_schema("s.relid"),
        stored = crate::pg::compat::publishes_stored_generated_columns("p"),
    );
    // (Kept prepared: a backfill of many tables reads it for each of them.)
    let read = || {
        crate::pg::spi::run_prepared(&query, false, &[Text::from(publication).into(), table.relid.into()], |rows| {
            rows.map(|row| {
                Ok(PublishedLeaf {
                    name: row.get::<Text>(1)?.map(|t| t.0).unwrap_or_default(),
                    held: row.get::<bool>(2)?.unwrap_or(false),
                    columns: row.get::<Vec<Text>>(3)?.map(crate::pg::encoding::strings).unwrap_or_default(),
                    row_filter: row.get::<Text>(4)?.map(|t| t.0),
                    as_ancestor: row.get::<bool>(5)?.unwrap_or(false),
                    as_the_table: row.get::<bool>(6)?.unwrap_or(false),
                })
            })
            .collect::<Result<Vec<_>, pgrx::spi::Error>>()
        })
        .or_internal("read what the publication publishes")
    };
    // The row filter's text is parsed again, as the backfill's filter, with the filter's
    // settings (selection/filter.rs): printed with the same ones, its constants read back as they were
    // printed, and it prints the same at the start and on every page, which compare it.
    privilege::with_portable_settings(|| {
        crate::selection::filter::with_filter_settings(|| {
            crate::pg::settings::with_settings(&[(c"quote_all_identifiers", c"off")], read)
        })
    })
}

/// The relations a publication holds, as pgoutput names their changes (pg_publication_tables:
/// with `publish_via_partition_root` a partitioned table, else its partitions), each with its
/// leaves, the tables that hold its rows (a plain table is its own leaf). pg_backfill's own
/// tables, which a FOR ALL TABLES publication holds too, are left out: they are not the
/// pipeline's data. None when the publication does not exist.
pub struct PublicationTables {
    /// In name order.
    pub tables: Vec<pg_sys::Oid>,
    /// (leaf, the listed relation it belongs to).
    pub leaves: Vec<(pg_sys::Oid, pg_sys::Oid)>,
}

pub fn publication_tables(publication: &str) -> Option<PublicationTables> {
    let rows = Spi::connect(|client| {
        client
            .select(
                "WITH listed AS (
                     SELECT c.oid AS relid, n.nspname, c.relname
                       FROM pg_catalog.pg_publication_tables pt
                       JOIN pg_catalog.pg_namespace n ON n.nspname OPERATOR(pg_catalog.=) pt.schemaname
                       JOIN pg_catalog.pg_class c ON c.relnamespace OPERATOR(pg_catalog.=) n.oid
                                                 AND c.relname OPERATOR(pg_catalog.=) pt.tablename
                      WHERE pt.pubname OPERATOR(pg_catalog.=) $1
                        AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d
                                          JOIN pg_catalog.pg_extension e ON e.oid OPERATOR(pg_catalog.=) d.refobjid
                                         WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                                           AND d.objid OPERATOR(pg_catalog.=) c.oid AND d.deptype OPERATOR(pg_catalog.=) 'e'
                                           AND e.extname OPERATOR(pg_catalog.=) 'pg_backfill'))
                 SELECT t.relid, l.relid
                   FROM listed t
                  CROSS JOIN LATERAL (SELECT p.relid::pg_catalog.oid FROM pg_catalog.pg_partition_tree(t.relid) p WHERE p.isleaf
                                      -- (A table that is neither partitioned nor a partition has no tree.)
                                      UNION ALL
                                      SELECT t.relid WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_partition_tree(t.relid))) l
                  WHERE EXISTS (SELECT FROM pg_catalog.pg_publication p WHERE p.pubname OPERATOR(pg_catalog.=) $1)
                  ORDER BY t.nspname, t.relname, l.relid",
                None,
                &[Text::from(publication).into()],
            )?
            .map(|row| Ok((row.get::<pg_sys::Oid>(1)?, row.get::<pg_sys::Oid>(2)?)))
            .collect::<Result<Vec<_>, pgrx::spi::Error>>()
    })
    .or_internal("read the publication's tables");
    if !exists(publication) {
        return None;
    }
    let mut tables: Vec<pg_sys::Oid> = Vec::new();
    let mut leaves = Vec::new();
    for (table, leaf) in rows {
        let (Some(table), Some(leaf)) = (table, leaf) else { continue };
        if tables.last() != Some(&table) {
            tables.push(table);
        }
        leaves.push((leaf, table));
    }
    Some(PublicationTables { tables, leaves })
}

/// backfill_start(publication => ...) with no tables: every table the publication holds, as
/// pgoutput names their changes. An error if the publication does not exist or holds none.
pub fn tables_of_publication(publication: &str) -> Vec<pg_sys::Oid> {
    let Some(held) = publication_tables(publication) else { no_such_publication(publication) };
    if held.tables.is_empty() {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("publication \"{publication}\" holds no table"),
            "Without a list of tables, the backfill is of every table the publication holds, and it holds none.",
            Some(format!(
                "Add the pipeline's tables first: ALTER PUBLICATION {} ADD TABLE ...;",
                crate::pg::encoding::quote_ident(publication)
            )),
        );
    }
    held.tables
}

/// Whether `publication` exists.
fn exists(publication: &str) -> bool {
    crate::pg::spi::select_one::<bool>(
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_publication WHERE pubname OPERATOR(pg_catalog.=) $1)",
        &[Text::from(publication).into()],
    )
    .or_internal("read the publication")
    .unwrap_or(false)
}

/// The error of a publication named that does not exist: a start's, a page's or a follow's.
#[track_caller]
pub fn no_such_publication(publication: &str) -> ! {
    raise(
        ERRCODE_UNDEFINED_OBJECT,
        format!("publication \"{publication}\" does not exist"),
        "The publication names the tables the pipeline captures.",
        Some("Name the consumer's publication: SELECT pubname FROM pg_publication; lists them.".into()),
    )
}

/// The catalog generation (pg/catalog_changes.rs) at which a scan last found its table still
/// published as it reads it: a page reads the publication again only when the generation moved.
#[derive(Default)]
pub struct Confirmed(Option<u64>);

impl Confirmed {
    /// On a page of a scan of `table` for `publication`, whose transaction read the catalog's
    /// `generation` right after its snapshot, before any lock: unless this scan found the
    /// publication unchanged at that generation, what the publication publishes of the table
    /// now ([`published`]: an error if it no longer holds it), handed to `check`, which raises
    /// if the scan's reads no longer match it.
    pub fn recheck(&mut self, publication: &str, table: &Table, generation: u64, check: impl FnOnce(&Published)) {
        if self.0 == Some(generation) {
            return;
        }
        check(&published(publication, table));
        self.0 = Some(generation);
    }
}
