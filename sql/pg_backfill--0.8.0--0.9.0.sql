-- pg_backfill 0.8.0 -> 0.9.0: column lists (columns => ...) for backfill_start(), backfill_estimate(),
-- backfill_checksum(), backfill_compare() and backfill_repair(); a publication's column list is a
-- backfill's default.
-- What changed for a DBA: CHANGELOG.md, section 0.9.0.
\echo Use "ALTER EXTENSION pg_backfill UPDATE TO '0.9.0'" to load this file. \quit

-- (As every update script: the state tables first, in the order a worker's page takes them.)
LOCK TABLE backfill.job, backfill.job_table IN ACCESS EXCLUSIVE MODE;

ALTER TABLE backfill.job_table ADD COLUMN column_list text[], ADD COLUMN column_attnums smallint[];
COMMENT ON COLUMN backfill.job_table.column_list IS 'The columns its reads carry, in the table''s order (columns => ..., or the publication''s column list); NULL: every column';
COMMENT ON COLUMN backfill.job_table.column_attnums IS 'The attribute numbers of column_list''s columns when it started: a listed column renamed, or dropped and added again, is another column and stops it';

-- The new trailing argument makes new functions: the old wrappers are kept aside under other
-- names until their grants are copied, then dropped (as 0.8.0 did for filter). The old entry
-- points stay: the SQL of an earlier version calls them until it is updated, and a comparison
-- from another server's older pg_backfill calls backfill.checksum() with four arguments.

ALTER FUNCTION backfill_estimate(regclass[], integer, text) RENAME TO backfill_estimate_0_8_0;
ALTER FUNCTION backfill_estimate(regclass, integer, text) RENAME TO backfill_estimate_0_8_0;
ALTER FUNCTION backfill_estimate(text, integer, text) RENAME TO backfill_estimate_0_8_0;
ALTER FUNCTION backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text) RENAME TO backfill_start_0_8_0;
ALTER FUNCTION backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text) RENAME TO backfill_start_0_8_0;
ALTER FUNCTION backfill_start(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text) RENAME TO backfill_start_0_8_0;
ALTER FUNCTION backfill_checksum(regclass, integer, text, jsonb) RENAME TO backfill_checksum_0_8_0;
ALTER FUNCTION backfill_compare(regclass, regclass, text, integer, name) RENAME TO backfill_compare_0_8_0;
ALTER FUNCTION backfill_repair(regclass, regclass, boolean, text, integer, name, integer) RENAME TO backfill_repair_0_8_0;

CREATE  FUNCTION backfill."estimate"(
	"tables" oid[], /* :: std :: option :: Option < Vec < Option < pg_sys :: Oid > > > */
	"batch_size" INT, /* Option < i32 > */
	"filter" text, /* Option < Text > */
	"columns" text[] /* :: std :: option :: Option < Vec < Option < Text > > > */
) RETURNS TABLE (
	"table_name" oid,  /* pg_sys :: Oid */
	"eligible" bool,  /* bool */
	"reason" text,  /* Option < Text > */
	"key_columns" text[],  /* :: std :: option :: Option < Vec < Text > > */
	"rows_estimated" bigint,  /* Option < i64 > */
	"bytes_estimated" bigint,  /* Option < i64 > */
	"pages" bigint  /* Option < i64 > */
)
 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'estimate_of_columns_wrapper';
CREATE  FUNCTION backfill."start"(
	"tables" oid[], /* :: std :: option :: Option < Vec < Option < pg_sys :: Oid > > > */
	"confirm" bool, /* Option < bool > */
	"batch_size" INT, /* Option < i32 > */
	"rows_per_second" INT, /* Option < i32 > */
	"slot" text, /* Option < Text > */
	"publication" text, /* Option < Text > */
	"max_lag" bigint, /* Option < i64 > */
	"parallel" INT, /* Option < i32 > */
	"filter" text, /* Option < Text > */
	"columns" text[] /* :: std :: option :: Option < Vec < Option < Text > > > */
) RETURNS bigint /* i64 */
 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'start_of_columns_wrapper';
CREATE  FUNCTION backfill."checksum"(
	"table" oid, /* Option < pg_sys :: Oid > */
	"ranges" INT, /* Option < i32 > */
	"level" text, /* Option < Text > */
	"bounds" jsonb, /* Option < JsonB > */
	"columns" text[] /* :: std :: option :: Option < Vec < Option < Text > > > */
) RETURNS TABLE (
	"range" INT,  /* i32 */
	"lower" jsonb,  /* Option < JsonB > */
	"upper" jsonb,  /* Option < JsonB > */
	"rows" bigint,  /* i64 */
	"checksum" TEXT  /* Option < String > */
)
 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'checksum_columns_wrapper';
CREATE  FUNCTION backfill."compare"(
	"source" oid, /* Option < pg_sys :: Oid > */
	"target" oid, /* Option < pg_sys :: Oid > */
	"level" text, /* Option < Text > */
	"passes" INT, /* Option < i32 > */
	"slot" text, /* Option < Text > */
	"columns" text[] /* :: std :: option :: Option < Vec < Option < Text > > > */
) RETURNS TABLE (
	"key" jsonb,  /* JsonB */
	"status" TEXT  /* String */
)
 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'compare_columns_wrapper';
CREATE  FUNCTION backfill."repair"(
	"source" oid, /* Option < pg_sys :: Oid > */
	"target" oid, /* Option < pg_sys :: Oid > */
	"confirm" bool, /* Option < bool > */
	"level" text, /* Option < Text > */
	"passes" INT, /* Option < i32 > */
	"slot" text, /* Option < Text > */
	"batch_size" INT, /* Option < i32 > */
	"columns" text[] /* :: std :: option :: Option < Vec < Option < Text > > > */
) RETURNS bigint /* Option < i64 > */
 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'repair_columns_wrapper';

COMMENT ON FUNCTION backfill.estimate(oid[], integer, text, text[]) IS 'Entry point of backfill_estimate()';
COMMENT ON FUNCTION backfill.estimate(oid[], integer, text) IS 'Entry point of backfill_estimate() in 0.8.0 (no column list): the SQL of that version calls it until ALTER EXTENSION UPDATE';
COMMENT ON FUNCTION backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer, text, text[]) IS 'Entry point of backfill_start()';
COMMENT ON FUNCTION backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer, text) IS 'Entry point of backfill_start() in 0.8.0 (no column list): the SQL of that version calls it until ALTER EXTENSION UPDATE';
COMMENT ON FUNCTION backfill.checksum(oid, integer, text, jsonb, text[]) IS 'Entry point of backfill_checksum()';
COMMENT ON FUNCTION backfill.checksum(oid, integer, text, jsonb) IS 'Entry point of backfill_checksum() before 0.9.0 (no column list): the SQL of an earlier version, and a comparison from another server''s, call it';
COMMENT ON FUNCTION backfill.compare(oid, oid, text, integer, text, text[]) IS 'Entry point of backfill_compare()';
COMMENT ON FUNCTION backfill.compare(oid, oid, text, integer, text) IS 'Entry point of backfill_compare() before 0.9.0 (no column list): the SQL of an earlier version calls it until ALTER EXTENSION UPDATE';
COMMENT ON FUNCTION backfill.repair(oid, oid, boolean, text, integer, text, integer, text[]) IS 'Entry point of backfill_repair()';
COMMENT ON FUNCTION backfill.repair(oid, oid, boolean, text, integer, text, integer) IS 'Entry point of backfill_repair() before 0.9.0 (no column list): the SQL of an earlier version calls it until ALTER EXTENSION UPDATE';

CREATE FUNCTION backfill_estimate(tables regclass[], batch_size integer DEFAULT 1000, filter text DEFAULT NULL,
                                  columns text[] DEFAULT NULL)
RETURNS TABLE (table_name regclass, eligible boolean, reason text, key_columns name[],
               rows_estimated bigint, bytes_estimated bigint, pages bigint)
LANGUAGE sql VOLATILE
AS $$ SELECT e.table_name::regclass, e.eligible, e.reason, e.key_columns::name[],
             e.rows_estimated, e.bytes_estimated, e.pages
        FROM backfill.estimate(tables::oid[], batch_size, filter, columns) e $$;
COMMENT ON FUNCTION backfill_estimate(regclass[], integer, text, text[]) IS
'For each table: whether it can be backfilled (and why not), its key, and the rows, message bytes and pages a backfill would deliver. Uses statistics and a small sample, never a full scan.';

CREATE FUNCTION backfill_estimate(table_name regclass, batch_size integer DEFAULT 1000, filter text DEFAULT NULL,
                                  columns text[] DEFAULT NULL)
RETURNS TABLE (table_name regclass, eligible boolean, reason text, key_columns name[],
               rows_estimated bigint, bytes_estimated bigint, pages bigint)
LANGUAGE sql VOLATILE
AS $$ SELECT * FROM backfill_estimate(ARRAY[table_name], batch_size, filter, columns) $$;
COMMENT ON FUNCTION backfill_estimate(regclass, integer, text, text[]) IS 'backfill_estimate() of one table';

CREATE FUNCTION backfill_estimate(table_name text, batch_size integer DEFAULT 1000, filter text DEFAULT NULL,
                                  columns text[] DEFAULT NULL)
RETURNS TABLE (table_name regclass, eligible boolean, reason text, key_columns name[],
               rows_estimated bigint, bytes_estimated bigint, pages bigint)
LANGUAGE sql VOLATILE
AS $$ SELECT * FROM backfill_estimate(ARRAY[table_name::regclass], batch_size, filter, columns) $$;
COMMENT ON FUNCTION backfill_estimate(text, integer, text, text[]) IS 'backfill_estimate() of one table, by name';

CREATE FUNCTION backfill_start(tables regclass[], confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL,
                               parallel integer DEFAULT 1, max_replica_lag bigint DEFAULT NULL,
                               max_retained_wal bigint DEFAULT NULL, max_active_sessions integer DEFAULT NULL,
                               keys jsonb DEFAULT NULL, rows_per_message integer DEFAULT NULL,
                               filter text DEFAULT NULL, columns text[] DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.set_keys(backfill.set_source_limits(backfill.set_rows_per_message(backfill.start(
         backfill.refuse_node_options(tables::oid[], keys, max_replica_lag, max_retained_wal, max_active_sessions, rows_per_message),
         confirm, batch_size, rows_per_second, slot::text, publication::text, max_lag, parallel, filter, columns), rows_per_message),
                                       max_replica_lag, max_retained_wal, max_active_sessions), keys) $$;
COMMENT ON FUNCTION backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text, text[]) IS
'Starts a backfill of the tables (all or nothing) and returns its id. Without confirm => true it starts nothing and reports the estimate. keys => a JSON array of key objects: only those keys of the one table, each read or, without a row, delivered absent. rows_per_message => N: each page''s rows in reads messages of up to N rows (NULL: backfill.rows_per_message). filter => a boolean SQL expression: only the rows it is true for. columns => the columns each read carries (the key among them; NULL: every column, or the publication''s column list).';

CREATE FUNCTION backfill_start(table_name regclass, confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL,
                               parallel integer DEFAULT 1, max_replica_lag bigint DEFAULT NULL,
                               max_retained_wal bigint DEFAULT NULL, max_active_sessions integer DEFAULT NULL,
                               keys jsonb DEFAULT NULL, rows_per_message integer DEFAULT NULL,
                               filter text DEFAULT NULL, columns text[] DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.set_keys(backfill.set_source_limits(backfill.set_rows_per_message(backfill.start(
         backfill.refuse_node_options(ARRAY[table_name]::oid[], keys, max_replica_lag, max_retained_wal, max_active_sessions, rows_per_message),
         confirm, batch_size, rows_per_second, slot::text, publication::text, max_lag, parallel, filter, columns), rows_per_message),
                                       max_replica_lag, max_retained_wal, max_active_sessions), keys) $$;
COMMENT ON FUNCTION backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text, text[]) IS 'backfill_start() of one table';

CREATE FUNCTION backfill_start(table_name text, confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL,
                               parallel integer DEFAULT 1, max_replica_lag bigint DEFAULT NULL,
                               max_retained_wal bigint DEFAULT NULL, max_active_sessions integer DEFAULT NULL,
                               keys jsonb DEFAULT NULL, rows_per_message integer DEFAULT NULL,
                               filter text DEFAULT NULL, columns text[] DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.set_keys(backfill.set_source_limits(backfill.set_rows_per_message(backfill.start(
         backfill.refuse_node_options(ARRAY[table_name::regclass]::oid[], keys, max_replica_lag, max_retained_wal, max_active_sessions, rows_per_message),
         confirm, batch_size, rows_per_second, slot::text, publication::text, max_lag, parallel, filter, columns), rows_per_message),
                                       max_replica_lag, max_retained_wal, max_active_sessions), keys) $$;
COMMENT ON FUNCTION backfill_start(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text, text[]) IS 'backfill_start() of one table, by name';

CREATE FUNCTION backfill_checksum(tbl regclass, ranges integer DEFAULT 1024, level text DEFAULT 'hash',
                                  bounds jsonb DEFAULT NULL, columns text[] DEFAULT NULL)
RETURNS TABLE (range integer, lower jsonb, upper jsonb, rows bigint, checksum text)
LANGUAGE sql VOLATILE
AS $$ SELECT * FROM backfill.checksum(tbl::oid, ranges, level, bounds, columns) $$;
COMMENT ON FUNCTION backfill_checksum(regclass, integer, text, jsonb, text[]) IS
'One row per key range of the table: its bounds, row count and checksum (level count, aggregate or hash), as the caller may read it; bounds => the ranges of another checksum, to compare two tables over identical ranges; columns => only those columns'' values (a copy made with a column list).';

CREATE FUNCTION backfill_compare(source regclass, target regclass, level text DEFAULT 'hash',
                                 passes integer DEFAULT 3, slot name DEFAULT NULL, columns text[] DEFAULT NULL)
RETURNS TABLE (key jsonb, status text)
LANGUAGE sql VOLATILE
AS $$ SELECT * FROM backfill.compare(source::oid, target::oid, level, passes, slot::text, columns) $$;
COMMENT ON FUNCTION backfill_compare(regclass, regclass, text, integer, name, text[]) IS
'The keys whose rows differ between source and target (a local table, or a postgres_fdw foreign table with pg_backfill on its server, through dblink): missing, extra, different, or unsettled (still changing on the source at the last pass). Re-checks each difference after the stream has caught up (the slot''s confirmed position). columns => compares only those columns'' values (a copy made with a column list).';

CREATE FUNCTION backfill_repair(source regclass, target regclass, confirm boolean DEFAULT false,
                                level text DEFAULT 'hash', passes integer DEFAULT 3, slot name DEFAULT NULL,
                                batch_size integer DEFAULT 1000, columns text[] DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.repair(source::oid, target::oid, confirm, level, passes, slot::text, batch_size, columns) $$;
COMMENT ON FUNCTION backfill_repair(regclass, regclass, boolean, text, integer, name, integer, text[]) IS
'Compares source and target (backfill_compare()) and starts one backfill of exactly the differing keys of the source, through the slot; returns its id, or NULL when nothing differs. Without confirm => true it starts nothing and reports what differs. columns => compares those columns and re-delivers them only.';

REVOKE EXECUTE ON FUNCTION
    backfill_estimate(regclass[], integer, text, text[]),
    backfill_estimate(regclass, integer, text, text[]),
    backfill_estimate(text, integer, text, text[]),
    backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text, text[]),
    backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text, text[]),
    backfill_start(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text, text[]),
    backfill_checksum(regclass, integer, text, jsonb, text[]),
    backfill_compare(regclass, regclass, text, integer, name, text[]),
    backfill_repair(regclass, regclass, boolean, text, integer, name, integer, text[]),
    backfill.estimate(oid[], integer, text, text[]),
    backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer, text, text[]),
    backfill.checksum(oid, integer, text, jsonb, text[]),
    backfill.compare(oid, oid, text, integer, text, text[]),
    backfill.repair(oid, oid, boolean, text, integer, text, integer, text[])
  FROM PUBLIC;

-- Who could execute an old function may execute its successor (an old entry point, the new one).
-- (Every operator and function is pg_catalog's: this runs as a superuser, with the extension's
-- schema, which other roles may be able to create objects in, on the path.)
DO $$
DECLARE
    kept record;
BEGIN
    FOR kept IN
        SELECT DISTINCT g.successor, a.grantee, r.rolname, a.is_grantable
          FROM (VALUES ('backfill_estimate_0_8_0(regclass[], integer, text)', 'backfill_estimate(regclass[], integer, text, text[])'),
                       ('backfill_estimate_0_8_0(regclass, integer, text)', 'backfill_estimate(regclass, integer, text, text[])'),
                       ('backfill_estimate_0_8_0(text, integer, text)', 'backfill_estimate(text, integer, text, text[])'),
                       ('backfill_start_0_8_0(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text)', 'backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text, text[])'),
                       ('backfill_start_0_8_0(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text)', 'backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text, text[])'),
                       ('backfill_start_0_8_0(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text)', 'backfill_start(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text, text[])'),
                       ('backfill_checksum_0_8_0(regclass, integer, text, jsonb)', 'backfill_checksum(regclass, integer, text, jsonb, text[])'),
                       ('backfill_compare_0_8_0(regclass, regclass, text, integer, name)', 'backfill_compare(regclass, regclass, text, integer, name, text[])'),
                       ('backfill_repair_0_8_0(regclass, regclass, boolean, text, integer, name, integer)', 'backfill_repair(regclass, regclass, boolean, text, integer, name, integer, text[])'),
                       ('backfill.estimate(oid[], integer, text)', 'backfill.estimate(oid[], integer, text, text[])'),
                       ('backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer, text)', 'backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer, text, text[])'),
                       ('backfill.checksum(oid, integer, text, jsonb)', 'backfill.checksum(oid, integer, text, jsonb, text[])'),
                       ('backfill.compare(oid, oid, text, integer, text)', 'backfill.compare(oid, oid, text, integer, text, text[])'),
                       ('backfill.repair(oid, oid, boolean, text, integer, text, integer)', 'backfill.repair(oid, oid, boolean, text, integer, text, integer, text[])'))
               AS g(predecessor, successor)
          JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) g.predecessor::pg_catalog.regprocedure::pg_catalog.oid
         CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
          LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
         WHERE a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE' AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s%s', kept.successor,
                                  CASE WHEN kept.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(kept.rolname) END,
                                  CASE WHEN kept.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$$;

DROP FUNCTION backfill_estimate_0_8_0(regclass[], integer, text);
DROP FUNCTION backfill_estimate_0_8_0(regclass, integer, text);
DROP FUNCTION backfill_estimate_0_8_0(text, integer, text);
DROP FUNCTION backfill_start_0_8_0(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text);
DROP FUNCTION backfill_start_0_8_0(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text);
DROP FUNCTION backfill_start_0_8_0(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text);
DROP FUNCTION backfill_checksum_0_8_0(regclass, integer, text, jsonb);
DROP FUNCTION backfill_compare_0_8_0(regclass, regclass, text, integer, name);
DROP FUNCTION backfill_repair_0_8_0(regclass, regclass, boolean, text, integer, name, integer);

-- backfill_security_check() names backfill.start() by its new signature.
CREATE OR REPLACE FUNCTION backfill_security_check()
RETURNS TABLE (item text, ok boolean, detail text, fix text)
LANGUAGE sql STABLE
AS $$
-- Whatever signatures the server has: (boolean, text, text) and (boolean, text, bytea), to
-- which PostgreSQL 17 added a fourth argument, flush.
SELECT 'pg_logical_emit_message is executable by PUBLIC',
       NOT pg_catalog.bool_or(pg_catalog.has_function_privilege('public', p.oid, 'EXECUTE')),
       'Any role can write a message with pg_backfill''s prefix into every consumer''s stream; only consumers that check each message''s auth tag tell it from a genuine one.',
       pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC;',
                         pg_catalog.string_agg(pg_catalog.format('pg_catalog.pg_logical_emit_message(%s)', pg_catalog.oidvectortypes(p.proargtypes)),
                                               ', ' ORDER BY p.oid))
  FROM pg_catalog.pg_proc p
 WHERE p.proname OPERATOR(pg_catalog.=) 'pg_logical_emit_message'
   AND p.pronamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace
UNION ALL
SELECT 'the message key is readable by PUBLIC',
       NOT pg_catalog.has_table_privilege('public', 'backfill.message_key', 'SELECT'),
       'A role that can read the key can forge messages that verify.',
       'REVOKE ALL ON backfill.message_key FROM PUBLIC; SELECT backfill_rotate_key(retire_old_keys => true);'
UNION ALL
SELECT 'backfills can be started by PUBLIC',
       NOT pg_catalog.has_function_privilege('public', 'backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer, text, text[])', 'EXECUTE'),
       'Every role could start backfills of the tables it may update, and take background workers.',
       'REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA backfill FROM PUBLIC;'
$$;
