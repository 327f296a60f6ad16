-- pg_backfill 0.4.0 -> 0.5.0: verification and repair.
-- - backfill_compare(): the keys whose rows differ between a table and its copy (local, or a
--   postgres_fdw foreign table through dblink), settled against the stream.
-- - backfill_start(..., keys => ...): a backfill of given keys; a key without a row is
--   delivered as an "absent" message. backfill_repair(): compare, then such a backfill.
-- - The grants on the old backfill_start() carry over to the new ones; the new functions go to
--   who may run what they build on.
-- What changed for a DBA: CHANGELOG.md, section 0.5.0.
\echo Use "ALTER EXTENSION pg_backfill UPDATE TO '0.5.0'" to load this file. \quit

-- The state tables first, and in the order a worker's page takes them (job, then job_table):
-- a script that took job_table first and then altered job would deadlock with a running page.
LOCK TABLE backfill.job, backfill.job_table IN ACCESS EXCLUSIVE MODE;

CREATE TABLE backfill.job_key (
    job_id   bigint NOT NULL,
    position integer NOT NULL,
    ordinal  integer NOT NULL,
    key      text[] NOT NULL,
    key_json text[] NOT NULL,
    PRIMARY KEY (job_id, position, ordinal),
    FOREIGN KEY (job_id, position) REFERENCES backfill.job_table (job_id, position) ON DELETE CASCADE
);
COMMENT ON TABLE backfill.job_key IS 'The keys a keyed backfill (backfill_start(keys => ...), backfill_repair()) delivers, in key order';
COMMENT ON COLUMN backfill.job_key.job_id IS 'The backfill (backfill.job.id)';
COMMENT ON COLUMN backfill.job_key.position IS 'Its table (backfill.job_table.position)';
COMMENT ON COLUMN backfill.job_key.ordinal IS 'The key''s place in key order, from 1: the keys up to rows_done are delivered';
COMMENT ON COLUMN backfill.job_key.key IS 'The key''s values, text form';
COMMENT ON COLUMN backfill.job_key.key_json IS 'The key''s values as JSON, as messages carry them';

CREATE TRIGGER discard_replicated_row BEFORE INSERT OR UPDATE OR DELETE ON backfill.job_key
    FOR EACH ROW EXECUTE FUNCTION backfill.discard_replicated_row();
ALTER TABLE backfill.job_key ENABLE REPLICA TRIGGER discard_replicated_row;
GRANT SELECT ON backfill.job_key TO pg_monitor;

CREATE  FUNCTION backfill."set_keys"(
	"id" bigint, /* Option < i64 > */
	"keys" jsonb /* Option < JsonB > */
) RETURNS bigint /* Option < i64 > */
 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'set_keys_wrapper';

CREATE  FUNCTION backfill."compare"(
	"source" oid, /* Option < pg_sys :: Oid > */
	"target" oid, /* Option < pg_sys :: Oid > */
	"level" text, /* Option < Text > */
	"passes" INT, /* Option < i32 > */
	"slot" text /* Option < Text > */
) RETURNS TABLE (
	"key" jsonb,  /* JsonB */
	"status" TEXT  /* String */
)
 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'compare_wrapper';

CREATE  FUNCTION backfill."repair"(
	"source" oid, /* Option < pg_sys :: Oid > */
	"target" oid, /* Option < pg_sys :: Oid > */
	"confirm" bool, /* Option < bool > */
	"level" text, /* Option < Text > */
	"passes" INT, /* Option < i32 > */
	"slot" text, /* Option < Text > */
	"batch_size" INT /* Option < i32 > */
) RETURNS bigint /* Option < i64 > */
 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'repair_wrapper';

-- The old signatures go (a new trailing argument makes a new function): they are kept aside
-- under other names until their grants are copied.
ALTER FUNCTION backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer) RENAME TO backfill_start_0_4_0;
ALTER FUNCTION backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer) RENAME TO backfill_start_0_4_0;
ALTER FUNCTION backfill_start(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer) RENAME TO backfill_start_0_4_0;

CREATE FUNCTION backfill_start(tables regclass[], confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL,
                               parallel integer DEFAULT 1, max_replica_lag bigint DEFAULT NULL,
                               max_retained_wal bigint DEFAULT NULL, max_active_sessions integer DEFAULT NULL,
                               keys jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.set_keys(backfill.set_source_limits(backfill.start(tables::oid[], confirm, batch_size, rows_per_second, slot::text,
                                                      publication::text, max_lag, parallel),
                                       max_replica_lag, max_retained_wal, max_active_sessions), keys) $$;
COMMENT ON FUNCTION backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb) IS
'Starts a backfill of the tables (all or nothing) and returns its id. Without confirm => true it starts nothing and reports the estimate. keys => a JSON array of key objects: only those keys of the one table, each read or, without a row, delivered absent.';

CREATE FUNCTION backfill_start(table_name regclass, confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL,
                               parallel integer DEFAULT 1, max_replica_lag bigint DEFAULT NULL,
                               max_retained_wal bigint DEFAULT NULL, max_active_sessions integer DEFAULT NULL,
                               keys jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.set_keys(backfill.set_source_limits(backfill.start(ARRAY[table_name]::oid[], confirm, batch_size, rows_per_second, slot::text,
                                                      publication::text, max_lag, parallel),
                                       max_replica_lag, max_retained_wal, max_active_sessions), keys) $$;
COMMENT ON FUNCTION backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb) IS 'backfill_start() of one table';

CREATE FUNCTION backfill_start(table_name text, confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL,
                               parallel integer DEFAULT 1, max_replica_lag bigint DEFAULT NULL,
                               max_retained_wal bigint DEFAULT NULL, max_active_sessions integer DEFAULT NULL,
                               keys jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.set_keys(backfill.set_source_limits(backfill.start(ARRAY[table_name::regclass]::oid[], confirm, batch_size, rows_per_second, slot::text,
                                                      publication::text, max_lag, parallel),
                                       max_replica_lag, max_retained_wal, max_active_sessions), keys) $$;
COMMENT ON FUNCTION backfill_start(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb) IS 'backfill_start() of one table, by name';

CREATE FUNCTION backfill_compare(source regclass, target regclass, level text DEFAULT 'hash',
                                 passes integer DEFAULT 3, slot name DEFAULT NULL)
RETURNS TABLE (key jsonb, status text)
LANGUAGE sql VOLATILE
AS $$ SELECT * FROM backfill.compare(source::oid, target::oid, level, passes, slot::text) $$;
COMMENT ON FUNCTION backfill_compare(regclass, regclass, text, integer, name) IS
'The keys whose rows differ between source and target (a local table, or a postgres_fdw foreign table with pg_backfill on its server, through dblink): missing, extra, different, or unsettled (still changing on the source at the last pass). Re-checks each difference after the stream has caught up (the slot''s confirmed position).';

CREATE FUNCTION backfill_repair(source regclass, target regclass, confirm boolean DEFAULT false,
                                level text DEFAULT 'hash', passes integer DEFAULT 3, slot name DEFAULT NULL,
                                batch_size integer DEFAULT 1000)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.repair(source::oid, target::oid, confirm, level, passes, slot::text, batch_size) $$;
COMMENT ON FUNCTION backfill_repair(regclass, regclass, boolean, text, integer, name, integer) IS
'Compares source and target (backfill_compare()) and starts one backfill of exactly the differing keys of the source, through the slot; returns its id, or NULL when nothing differs. Without confirm => true it starts nothing and reports what differs.';

REVOKE EXECUTE ON FUNCTION
    backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb),
    backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb),
    backfill_start(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb),
    backfill_compare(regclass, regclass, text, integer, name),
    backfill_repair(regclass, regclass, boolean, text, integer, name, integer),
    backfill.set_keys(bigint, jsonb), backfill.compare(oid, oid, text, integer, text),
    backfill.repair(oid, oid, boolean, text, integer, text, integer)
  FROM PUBLIC;

-- Who could execute a function of 0.4.0 may execute its successor, or what builds on it: the
-- new backfill_start() (its old self), backfill_compare() (backfill_checksum()), backfill_repair()
-- (backfill_start()), and their entry points (those of the functions they build on).
-- (Every operator and function is pg_catalog's: this runs as a superuser, with the extension's
-- schema, which other roles may be able to create objects in, on the path.)
DO $$
DECLARE
    kept record;
BEGIN
    FOR kept IN
        SELECT DISTINCT g.successor, a.grantee, r.rolname, a.is_grantable
          FROM (VALUES ('backfill_start_0_4_0(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer)', 'backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb)'),
                       ('backfill_start_0_4_0(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer)', 'backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb)'),
                       ('backfill_start_0_4_0(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer)', 'backfill_start(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb)'),
                       ('backfill_start_0_4_0(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer)', 'backfill_repair(regclass, regclass, boolean, text, integer, name, integer)'),
                       ('backfill_checksum(regclass, integer, text, jsonb)', 'backfill_compare(regclass, regclass, text, integer, name)'),
                       ('backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer)', 'backfill.set_keys(bigint, jsonb)'),
                       ('backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer)', 'backfill.repair(oid, oid, boolean, text, integer, text, integer)'),
                       ('backfill.checksum(oid, integer, text, jsonb)', 'backfill.compare(oid, oid, text, integer, text)'))
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
DROP FUNCTION backfill_start_0_4_0(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer);
DROP FUNCTION backfill_start_0_4_0(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer);
DROP FUNCTION backfill_start_0_4_0(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer);

COMMENT ON FUNCTION backfill.set_keys(bigint, jsonb) IS 'Entry point of backfill_start()''s keys; returns the backfill''s id';
COMMENT ON FUNCTION backfill.compare(oid, oid, text, integer, text) IS 'Entry point of backfill_compare()';
COMMENT ON FUNCTION backfill.repair(oid, oid, boolean, text, integer, text, integer) IS 'Entry point of backfill_repair()';
