//! The consumer a backfill is for: its replication slot and publication. A backfill for a slot
//! pauses while the slot has no active consumer and waits while the consumer lags, so that it
//! never makes the server retain WAL that nobody reads.

use crate::catalog::job::Job;
use crate::model::table::Table;
use crate::pg::encoding::Text;
use crate::pg::errors::raise;
use crate::pg::errors::OrInternal;
use crate::pg::privilege;
use crate::pg::settings;
use crate::throttle::wait::WaitReason;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::*;

/// backfill_start(..., slot => ...): the slot must exist, be logical and belong to this database.
pub fn require_slot(slot: &str) {
    let found = crate::pg::spi::select_one::<Text>(
        "SELECT slot_type OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) coalesce(database::pg_catalog.text, '')
                OPERATOR(pg_catalog.||) ':'
                OPERATOR(pg_catalog.||) coalesce((database OPERATOR(pg_catalog.=) pg_catalog.current_database())::pg_catalog.text, 'false')
           FROM pg_catalog.pg_replication_slots WHERE slot_name OPERATOR(pg_catalog.=) $1",
        &[slot.into()],
    )
    .ok()
    .flatten()
    .map(|t| t.0);
    let Some(found) = found else {
        raise(
            ERRCODE_UNDEFINED_OBJECT,
            format!("replication slot \"{slot}\" does not exist"),
            "A backfill for a pipeline needs the pipeline's logical replication slot.",
            Some(format!(
                "Create it, or name an existing one: SELECT pg_create_logical_replication_slot({}, 'pgoutput');",
                spi::quote_literal(slot)
            )),
        );
    };
    let mut parts = found.splitn(3, ':');
    let (kind, database, here) = (parts.next(), parts.next(), parts.next());
    if kind != Some("logical") {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("replication slot \"{slot}\" is not a logical slot"),
            "Backfill messages are only decoded by logical replication slots.",
            None,
        );
    }
    if here != Some("true") {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("replication slot \"{slot}\" belongs to another database"),
            format!(
                "Slot \"{slot}\" decodes database \"{}\"; the backfill's messages are written here.",
                database.unwrap_or("")
            ),
            Some("Start the backfill in the slot's database.".into()),
        );
    }
}

/// backfill_start(..., publication => ...): every table must be in the pipeline's publication:
/// a snapshot of a table the pipeline does not capture would never be followed by its changes.
pub fn require_published(publication: &str, table: &Table) {
    let published = crate::pg::spi::select_one::<bool>(
        // (NULL when the publication does not exist; false when it holds no table.)
        "SELECT CASE WHEN pg_catalog.count(p.oid) OPERATOR(pg_catalog.>) 0 THEN coalesce(
                 pg_catalog.bool_or(pt.schemaname OPERATOR(pg_catalog.=) $2 AND pt.tablename OPERATOR(pg_catalog.=) $3)
              OR pg_catalog.bool_or(p.puballtables)
              OR pg_catalog.bool_or(pt.schemaname OPERATOR(pg_catalog.=) $2
                                    AND pt.tablename OPERATOR(pg_catalog.=) ANY (
                                            SELECT c.relname FROM pg_catalog.pg_partition_tree($4::pg_catalog.regclass) pt2
                                              JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) pt2.relid)),
                 false) END
           FROM pg_catalog.pg_publication p
           LEFT JOIN pg_catalog.pg_publication_tables pt ON pt.pubname OPERATOR(pg_catalog.=) p.pubname
          WHERE p.pubname OPERATOR(pg_catalog.=) $1",
        &[Text::from(publication).into(), Text(table.schema.clone()).into(), Text(table.name.clone()).into(), table.relid.into()],
    )
    .ok()
    .flatten();
    match published {
        None => raise(
            ERRCODE_UNDEFINED_OBJECT,
            format!("publication \"{publication}\" does not exist"),
            "The publication names the tables the pipeline captures.",
            None,
        ),
        Some(false) => raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("table {} is not in publication \"{publication}\"", table.qualified_name()),
            "A backfill delivers only the pipeline's own tables: the consumer would never receive the changes that follow the snapshot.",
            Some(format!("Add it first: ALTER PUBLICATION {} ADD TABLE {};", crate::pg::encoding::quote_ident(publication), table.qualified_name())),
        ),
        Some(true) => {}
    }
}

/// What a publication publishes of a table, as pgoutput sends it.
#[derive(Default)]
pub struct Published {
    /// Its columns, in the table's order, when they are not all of the table's columns.
    pub columns: Option<Vec<String>>,
    /// Its row filter (`CREATE PUBLICATION ... FOR TABLE t WHERE (...)`), as SQL text: only the
    /// rows it is true for are published.
    pub row_filter: Option<String>,
}

/// What `publication` publishes of `table` (see [`Published`]); nothing withheld when it does
/// not hold the table.
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
    let name = table.qualified_name();
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
    /// Its published columns' names, in attribute order.
    columns: Vec<String>,
    row_filter: Option<String>,
}

/// The leaves of `table` (itself, if it is not partitioned) as `publication` publishes them;
/// none when the publication does not exist.
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
                       WHERE r.prpubid OPERATOR(pg_catalog.=) p.oid AND r.prrelid OPERATOR(pg_catalog.=) {rel})
              OR {})",
            in_schema(rel)
        )
    };
    let query = format!(
        "SELECT l.relid::pg_catalog.regclass::pg_catalog.text,
                p.puballtables OR {listed} OR top.relid IS NOT NULL,
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
                s.relid OPERATOR(pg_catalog.<>) l.relid
           FROM pg_catalog.pg_publication p
          CROSS JOIN (SELECT t.relid::pg_catalog.oid FROM pg_catalog.pg_partition_tree($2::pg_catalog.regclass) t
                       WHERE t.isleaf
                      -- (A table that is neither partitioned nor a partition has no tree.)
                      UNION ALL
                      SELECT $2 WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_partition_tree($2::pg_catalog.regclass))) l
           -- Its topmost ancestor the publication holds (any, FOR ALL TABLES: its root).
           LEFT JOIN LATERAL (
                SELECT x.relid::pg_catalog.oid FROM pg_catalog.pg_partition_ancestors(l.relid) WITH ORDINALITY x(relid, level)
                 WHERE x.level OPERATOR(pg_catalog.>) 1 AND (p.puballtables OR {ancestor_listed})
                 ORDER BY x.level DESC LIMIT 1) top ON true
          -- The relation it is published as.
          CROSS JOIN LATERAL (SELECT CASE WHEN p.pubviaroot AND top.relid IS NOT NULL THEN top.relid ELSE l.relid END AS relid) s
           LEFT JOIN pg_catalog.pg_publication_rel r
                  ON NOT p.puballtables AND r.prpubid OPERATOR(pg_catalog.=) p.oid AND r.prrelid OPERATOR(pg_catalog.=) s.relid
          WHERE p.pubname OPERATOR(pg_catalog.=) $1",
        listed = lists("l.relid"),
        ancestor_listed = lists("x.relid"),
        schema_listed = in_schema("s.relid"),
        stored = crate::pg::compat::publishes_stored_generated_columns("p"),
    );
    let read = || {
        Spi::connect(|client| {
            client
                .select(&query, None, &[Text::from(publication).into(), table.relid.into()])?
                .map(|row| {
                    Ok(PublishedLeaf {
                        name: row.get::<Text>(1)?.map(|t| t.0).unwrap_or_default(),
                        held: row.get::<bool>(2)?.unwrap_or(false),
                        columns: row.get::<Vec<Text>>(3)?.map(crate::pg::encoding::strings).unwrap_or_default(),
                        row_filter: row.get::<Text>(4)?.map(|t| t.0),
                        as_ancestor: row.get::<bool>(5)?.unwrap_or(false),
                    })
                })
                .collect::<Result<Vec<_>, pgrx::spi::Error>>()
        })
        .or_internal("read what the publication publishes")
    };
    // The row filter's text is parsed again, as the backfill's filter, with the filter's
    // settings (pg/filter.rs): printed with the same ones, its constants read back as they were
    // printed, and it prints the same at the start and on every page, which compare it.
    privilege::with_portable_settings(|| {
        crate::pg::filter::with_filter_settings(|| {
            crate::pg::settings::with_settings(&[(c"quote_all_identifiers", c"off")], read)
        })
    })
}

/// A slot's identity, which its name is not: a slot dropped and created again under the same
/// name is another slot, and its consumer never receives what was written before it was made.
/// PostgreSQL gives slots no id; each has a directory, `pg_replslot/<name>` (a temporary slot
/// too), made when the slot is created: its inode and its birth time (to the nanosecond) tell
/// one creation from the next (a freed inode is soon reused). None if the slot has none.
pub fn slot_identity(slot: &str) -> Option<String> {
    // (A backend's working directory is the data directory.)
    let metadata = std::fs::metadata(std::path::Path::new("pg_replslot").join(slot)).ok()?;
    let born = metadata.created().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
    use std::os::unix::fs::MetadataExt;
    Some(match born {
        Some(born) => format!("{}@{}.{:09}", metadata.ino(), born.as_secs(), born.subsec_nanos()),
        None => metadata.ino().to_string(),
    })
}

/// Why the backfill must wait for its slot's consumer now, if it must; an error if the slot is
/// gone, is another slot of the same name, or was invalidated.
pub fn blocker(job: &Job) -> Option<WaitReason> {
    let slot = job.slot_name.as_deref()?;
    // The lag from the WAL inserted, not written: the worker commits asynchronously, and on a
    // busy server the WAL writer can be several pages behind what the backfill has emitted (a
    // run stopped 370 kB past its limit, measured from the written position).
    let row = Spi::connect(|client| {
        let rows = client.select(
            "SELECT active, pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_insert_lsn(), confirmed_flush_lsn)::bigint,
                    wal_status
               FROM pg_catalog.pg_replication_slots WHERE slot_name OPERATOR(pg_catalog.=) $1",
            None,
            &[slot.into()],
        )?;
        if rows.is_empty() {
            return Ok::<_, spi::Error>(None);
        }
        let row = rows.first();
        Ok(Some((row.get::<bool>(1)?.unwrap_or(false), row.get::<i64>(2)?.unwrap_or(0), row.get::<String>(3)?)))
    })
    .or_internal("read the slot");
    let Some((active, lag, wal_status)) = row else {
        raise(
            ERRCODE_UNDEFINED_OBJECT,
            format!("replication slot \"{slot}\" no longer exists"),
            "The backfill was started for it; its messages would reach no consumer.",
            Some("Start a new backfill for the pipeline's current slot.".into()),
        );
    };
    if job.slot_identity.is_some() && slot_identity(slot) != job.slot_identity {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("replication slot \"{slot}\" was dropped and created again"),
            "The backfill was started for the slot of that name that was dropped: what it delivered \
             after that slot's consumer last confirmed never reaches the new slot.",
            Some("Start a new backfill for the pipeline's new slot.".into()),
        );
    }
    if wal_status.as_deref() == Some("lost") {
        raise(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("replication slot \"{slot}\" was invalidated"),
            "The server removed WAL its consumer had not received (wal_status lost, see max_slot_wal_keep_size): \
             the slot can no longer be read, so the backfill's messages would reach no consumer.",
            Some("Create the pipeline's slot again, re-sync its consumer, and start a new backfill for it.".into()),
        );
    }
    let slot = slot.to_string();
    if !active {
        return Some(WaitReason::ConsumerAway { slot });
    }
    let limit = job.max_lag_bytes.unwrap_or_else(settings::max_slot_lag_bytes);
    (lag > limit).then_some(WaitReason::ConsumerLag { slot, lag, limit })
}
