//! What pg_backfill needs to know of Citus, read from Citus's own metadata when Citus is
//! installed in the database (and nothing when it is not: every function here answers "not
//! Citus" then).
//!
//! In a Citus cluster a distributed table is a shell on the coordinator; its rows live in shards
//! (`orders_102008`), ordinary tables on the worker nodes, each node writing its own WAL. A
//! backfill of a distributed table is therefore one backfill per node, of the shards it holds,
//! in that node's stream (see `citus/`); this file answers the questions each side asks.

use crate::pg::encoding::Text;
use crate::pg::errors::OrInternal;
use pgrx::prelude::*;

/// Whether Citus is installed in this database (its metadata tables exist).
pub fn installed() -> bool {
    crate::pg::spi::select_one::<bool>(
        "SELECT pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL \
            AND pg_catalog.to_regprocedure('pg_catalog.master_run_on_worker(text[], integer[], text[], boolean)') IS NOT NULL",
        &[],
    )
    .or_internal("look for Citus")
    .unwrap_or(false)
}

/// Citus hides shards from catalog queries (pg_class, and the views over it) of sessions that
/// are not its own, which would make a shard look dropped to the worker's and the API's catalog
/// queries. Runs `f` with shards visible, when Citus is loaded at all.
pub fn with_shards_visible<R>(f: impl FnOnce() -> R) -> R {
    const SHARD_VISIBILITY: &std::ffi::CStr = c"citus.override_table_visibility";
    // SAFETY: a read of a GUC by name, missing_ok: NULL when Citus is not loaded.
    let loaded = unsafe { !pg_sys::GetConfigOption(SHARD_VISIBILITY.as_ptr(), true, false).is_null() };
    if loaded {
        crate::pg::settings::with_settings(&[(SHARD_VISIBILITY, c"off")], f)
    } else {
        f()
    }
}

/// The distributed table a shard belongs to: messages of a shard's backfill name it, as Citus's
/// change data capture names the shard's changes.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardOf {
    pub shard_id: i64,
    pub schema: String,
    pub name: String,
}

/// The distributed table whose shard `relid` is, if it is one. Citus names a shard after its
/// table and shard id (`orders_102008`, or a hash of a long name followed by the id), in the
/// table's schema: the id is taken from the name, and the shard is recognized only if Citus's
/// own `shard_name()` of that table and id names this very relation, and this node holds a
/// placement of that shard. A table merely named like a shard is not one.
pub fn shard_of(relid: pg_sys::Oid) -> Option<ShardOf> {
    if !installed() {
        return None;
    }
    Spi::connect(|client| {
        let rows = client.select(
            "SELECT s.shardid, t.relname::pg_catalog.text, n.nspname::pg_catalog.text
               FROM pg_catalog.pg_class r
               JOIN pg_catalog.pg_dist_shard s
                 ON s.shardid OPERATOR(pg_catalog.=)
                    pg_catalog.substring(r.relname::pg_catalog.text, '_([0-9]{1,18})$')::bigint
               JOIN pg_catalog.pg_class t ON t.oid OPERATOR(pg_catalog.=) s.logicalrelid
               JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) t.relnamespace
              WHERE r.oid OPERATOR(pg_catalog.=) $1
                AND t.relnamespace OPERATOR(pg_catalog.=) r.relnamespace
                -- This node holds a placement of the shard: elsewhere a table of that name is
                -- not the shard (anyone who may create tables could name one so).
                AND EXISTS (SELECT FROM pg_catalog.pg_dist_placement p
                              JOIN pg_catalog.pg_dist_local_group g ON g.groupid OPERATOR(pg_catalog.=) p.groupid
                             WHERE p.shardid OPERATOR(pg_catalog.=) s.shardid)
                AND pg_catalog.shard_name(s.logicalrelid, s.shardid) OPERATOR(pg_catalog.=)
                    ANY (ARRAY[pg_catalog.quote_ident(r.relname::pg_catalog.text),
                               pg_catalog.quote_ident(n.nspname::pg_catalog.text) OPERATOR(pg_catalog.||) '.'
                                   OPERATOR(pg_catalog.||) pg_catalog.quote_ident(r.relname::pg_catalog.text)])",
            Some(1),
            &[relid.into()],
        )?;
        if rows.is_empty() {
            return Ok::<_, pgrx::spi::Error>(None);
        }
        let row = rows.first();
        Ok(match (row.get::<i64>(1)?, row.get::<Text>(2)?, row.get::<Text>(3)?) {
            (Some(shard_id), Some(name), Some(schema)) => Some(ShardOf { shard_id, schema: schema.0, name: name.0 }),
            _ => None,
        })
    })
    .or_internal("read Citus's shard metadata")
}

/// How Citus distributes a table: `None` for a table Citus does not manage.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Distribution {
    /// Hash- or range-distributed (or a single-shard table of a schema): shards on worker nodes.
    Distributed,
    /// Replicated to every node.
    Reference,
    /// A Citus local table: one shard, on the coordinator.
    Local,
}

/// How Citus distributes table `relid`; None for a table it does not manage, or without Citus.
pub fn distribution(relid: pg_sys::Oid) -> Option<Distribution> {
    if !installed() {
        return None;
    }
    let kind = crate::pg::spi::select_one::<String>(
        "SELECT CASE WHEN p.partmethod OPERATOR(pg_catalog.<>) 'n' THEN 'distributed'
                     WHEN p.repmodel OPERATOR(pg_catalog.=) 't' THEN 'reference'
                     ELSE 'local' END
           FROM pg_catalog.pg_dist_partition p
          WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1",
        &[relid.into()],
    )
    .or_internal("read Citus's table metadata");
    match kind.as_deref() {
        Some("distributed") => Some(Distribution::Distributed),
        Some("reference") => Some(Distribution::Reference),
        Some(_) => Some(Distribution::Local),
        None => None,
    }
}

/// Whether `relid` is a Citus distributed table (false without Citus).
pub fn is_distributed(relid: pg_sys::Oid) -> bool {
    distribution(relid) == Some(Distribution::Distributed)
}

/// The distribution column of a distributed table (None for other tables, or without Citus).
pub fn distribution_column(relid: pg_sys::Oid) -> Option<String> {
    if !installed() {
        return None;
    }
    crate::pg::spi::select_one::<String>(
        "SELECT pg_catalog.column_to_column_name(p.logicalrelid, p.partkey)::pg_catalog.text
           FROM pg_catalog.pg_dist_partition p
          WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1 AND p.partmethod OPERATOR(pg_catalog.<>) 'n'",
        &[relid.into()],
    )
    .or_internal("read the table's distribution column")
}

/// Whether this server is the Citus coordinator (the node whose group is 0).
pub fn is_coordinator() -> bool {
    crate::pg::spi::select_one::<bool>(
        "SELECT coalesce((SELECT groupid OPERATOR(pg_catalog.=) 0 FROM pg_catalog.pg_dist_local_group), true)",
        &[],
    )
    .or_internal("read Citus's node metadata")
    .unwrap_or(true)
}

/// Raises an error when shard `shard` no longer has a placement on this node: it moved (shard
/// move, rebalance, node drain) or was split. Its rows are then changed, and their changes
/// decoded, on another node: a read written here would reach this node's stream only, out of
/// order with them. (Citus drops the old placement later, so the table is still there to read.)
pub fn require_placement_here(shard: &ShardOf, shard_table: &str) {
    let here = crate::pg::spi::select_one::<bool>(
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_placement p
                          JOIN pg_catalog.pg_dist_local_group g ON g.groupid OPERATOR(pg_catalog.=) p.groupid
                         WHERE p.shardid OPERATOR(pg_catalog.=) $1)",
        &[shard.shard_id.into()],
    )
    .or_internal("read Citus's placement metadata")
    .unwrap_or(false);
    if !here {
        let table = crate::pg::encoding::quote_qualified(&shard.schema, &shard.name);
        crate::pg::errors::raise(
            pgrx::PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("shard {} of distributed table {table} left this node during its backfill", shard.shard_id),
            format!(
                "Shard table {shard_table} was moved or split (a shard move, rebalance or node drain): its rows' \
                 changes are now written on another node, and reads written here would not sort against them. \
                 Its rows up to the cursor were delivered in this node's stream."
            ),
            Some(format!(
                "When the shard events are over, start the backfill of {table} again on the coordinator: \
                 SELECT backfill_start('{table}', confirm => true);"
            )),
        );
    }
}

/// The coordinator's own placement of reference table `relid`: Citus's change data capture
/// emits a reference table's changes from the coordinator only, so its backfill reads that
/// placement, in the coordinator's stream. None when the coordinator holds none.
pub fn coordinator_placement(relid: pg_sys::Oid) -> Option<pg_sys::Oid> {
    crate::pg::spi::select_one::<pg_sys::Oid>(
        "SELECT pg_catalog.to_regclass(pg_catalog.shard_name(s.logicalrelid, s.shardid, false))::pg_catalog.oid
           FROM pg_catalog.pg_dist_shard s
           JOIN pg_catalog.pg_dist_placement p ON p.shardid OPERATOR(pg_catalog.=) s.shardid
          WHERE s.logicalrelid OPERATOR(pg_catalog.=) $1 AND p.groupid OPERATOR(pg_catalog.=) 0",
        &[relid.into()],
    )
    .or_internal("read Citus's placement metadata")
}
