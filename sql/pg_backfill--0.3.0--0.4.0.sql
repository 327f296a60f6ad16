-- pg_backfill 0.3.0 -> 0.4.0: back-pressure from the whole source.
-- - backfill_start() and backfill_set() take max_replica_lag, max_retained_wal and
--   max_active_sessions (settings backfill.max_replica_lag, backfill.max_retained_wal,
--   backfill.max_active_sessions); backfill.job records them; backfill_status shows the limits
--   in force and, in waiting_for, what holds a backfill back.
-- - backfill_checksum(): key ranges of a table with row counts and checksums.
-- - The table_end marker lists the sequences the table's columns own.
-- - The grants on the old backfill_start() and backfill_set() carry over to the new ones.
-- What changed for a DBA: CHANGELOG.md, section 0.4.0.
\echo Use "ALTER EXTENSION pg_backfill UPDATE TO '0.4.0'" to load this file. \quit

-- The state tables first, and in the order a worker's page takes them (job, then job_table):
-- a script that took job_table first and then altered job would deadlock with a running page.
LOCK TABLE backfill.job, backfill.job_table IN ACCESS EXCLUSIVE MODE;

ALTER TABLE backfill.job ADD COLUMN max_replica_lag_bytes bigint CHECK (max_replica_lag_bytes >= 0);
ALTER TABLE backfill.job ADD COLUMN max_retained_wal_bytes bigint CHECK (max_retained_wal_bytes >= 0);
ALTER TABLE backfill.job ADD COLUMN max_active_sessions integer CHECK (max_active_sessions >= 0);
COMMENT ON COLUMN backfill.job.max_replica_lag_bytes IS 'Back-pressure: pages wait while a physical standby replays more than this behind (NULL: backfill.max_replica_lag; 0: off)';
COMMENT ON COLUMN backfill.job.max_retained_wal_bytes IS 'Back-pressure: pages wait while a replication slot retains more WAL than this (NULL: backfill.max_retained_wal; 0: off)';
COMMENT ON COLUMN backfill.job.max_active_sessions IS 'Back-pressure: pages slow down while more client sessions than this are active (NULL: backfill.max_active_sessions; 0: off)';

CREATE  FUNCTION backfill."set_source_limits"(
	"id" bigint, /* Option < i64 > */
	"max_replica_lag" bigint, /* Option < i64 > */
	"max_retained_wal" bigint, /* Option < i64 > */
	"max_active_sessions" INT /* Option < i32 > */
) RETURNS bigint /* Option < i64 > */
 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'set_source_limits_wrapper';

CREATE  FUNCTION backfill."source_limit"(
	"setting" text, /* Option < Text > */
	"option" bigint /* Option < i64 > */
) RETURNS bigint /* Option < i64 > */
STABLE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'source_limit_wrapper';

-- As every entry point: executable by who may execute backfill.start() or backfill.set(); the
-- view's helper by all.
REVOKE EXECUTE ON FUNCTION backfill.set_source_limits(bigint, bigint, bigint, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION backfill.source_limit(text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION backfill.source_limit(text, bigint) TO PUBLIC;
DO $$
DECLARE
    operator record;
BEGIN
    -- backfill_start() and backfill_set() call it: who may call either (directly, or granted
    -- ALL FUNCTIONS IN SCHEMA backfill before it existed) may call it. (pg_catalog's operators
    -- only: see below.)
    FOR operator IN
        SELECT DISTINCT a.grantee, r.rolname, a.is_grantable
          FROM pg_catalog.pg_proc p
         CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
          LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
         WHERE p.oid OPERATOR(pg_catalog.=) ANY (ARRAY[
                   'backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer)'::pg_catalog.regprocedure::pg_catalog.oid,
                   'backfill.set(bigint, integer, integer, bigint)'::pg_catalog.regprocedure::pg_catalog.oid])
           AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE' AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION backfill.set_source_limits(bigint, bigint, bigint, integer) TO %s%s',
                                  CASE WHEN operator.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(operator.rolname) END,
                                  CASE WHEN operator.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$$;

-- The old signatures go (a new trailing argument makes a new function), and who could execute
-- them may execute the new ones: they are kept aside under other names until their grants are
-- copied.
ALTER FUNCTION backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer) RENAME TO backfill_start_0_3_0;
ALTER FUNCTION backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer) RENAME TO backfill_start_0_3_0;
ALTER FUNCTION backfill_start(text, boolean, integer, integer, name, name, bigint, integer) RENAME TO backfill_start_0_3_0;
ALTER FUNCTION backfill_set(bigint, integer, integer, bigint) RENAME TO backfill_set_0_3_0;

CREATE FUNCTION backfill_start(tables regclass[], confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL,
                               parallel integer DEFAULT 1, max_replica_lag bigint DEFAULT NULL,
                               max_retained_wal bigint DEFAULT NULL, max_active_sessions integer DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.set_source_limits(backfill.start(tables::oid[], confirm, batch_size, rows_per_second, slot::text,
                                                      publication::text, max_lag, parallel),
                                       max_replica_lag, max_retained_wal, max_active_sessions) $$;
COMMENT ON FUNCTION backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer) IS
'Starts a backfill of the tables (all or nothing) and returns its id. Without confirm => true it starts nothing and reports the estimate.';

CREATE FUNCTION backfill_start(table_name regclass, confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL,
                               parallel integer DEFAULT 1, max_replica_lag bigint DEFAULT NULL,
                               max_retained_wal bigint DEFAULT NULL, max_active_sessions integer DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.set_source_limits(backfill.start(ARRAY[table_name]::oid[], confirm, batch_size, rows_per_second, slot::text,
                                                      publication::text, max_lag, parallel),
                                       max_replica_lag, max_retained_wal, max_active_sessions) $$;
COMMENT ON FUNCTION backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer) IS 'backfill_start() of one table';

-- See backfill_estimate(text): makes backfill_start('public.orders', confirm => true) resolve.
CREATE FUNCTION backfill_start(table_name text, confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL,
                               parallel integer DEFAULT 1, max_replica_lag bigint DEFAULT NULL,
                               max_retained_wal bigint DEFAULT NULL, max_active_sessions integer DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.set_source_limits(backfill.start(ARRAY[table_name::regclass]::oid[], confirm, batch_size, rows_per_second, slot::text,
                                                      publication::text, max_lag, parallel),
                                       max_replica_lag, max_retained_wal, max_active_sessions) $$;
COMMENT ON FUNCTION backfill_start(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer) IS 'backfill_start() of one table, by name';

CREATE FUNCTION backfill_set(id bigint, batch_size integer DEFAULT NULL, rows_per_second integer DEFAULT NULL,
                             max_lag bigint DEFAULT NULL, max_replica_lag bigint DEFAULT NULL,
                             max_retained_wal bigint DEFAULT NULL, max_active_sessions integer DEFAULT NULL)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.set(backfill.set_source_limits(id, max_replica_lag, max_retained_wal, max_active_sessions),
                          batch_size, rows_per_second, max_lag) $$;
COMMENT ON FUNCTION backfill_set(bigint, integer, integer, bigint, bigint, bigint, integer) IS
'Changes the pacing and back-pressure of a running or paused backfill (applied at its next page). NULL keeps a value; 0 removes a limit.';

REVOKE EXECUTE ON FUNCTION
    backfill_estimate(regclass[], integer), backfill_estimate(regclass, integer), backfill_estimate(text, integer),
    backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer),
    backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer),
    backfill_start(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer),
    backfill_cancel(bigint), backfill_pause(bigint), backfill_resume(bigint),
    backfill_set(bigint, integer, integer, bigint, bigint, bigint, integer), backfill_wait(bigint, interval),
    backfill_key(), backfill_rotate_key(boolean), backfill_message_valid(text, bigint), backfill_security_check()
  FROM PUBLIC;

DO $$
DECLARE
    kept record;
BEGIN
    -- (Every operator and function is pg_catalog's: this runs as a superuser, with the
    -- extension's schema, which other roles may be able to create objects in, on the path.)
    FOR kept IN
        SELECT new.oid::pg_catalog.regprocedure AS new_function, a.grantee, r.rolname, a.is_grantable
          FROM pg_catalog.pg_proc old
          JOIN pg_catalog.pg_proc new
            ON new.proname OPERATOR(pg_catalog.=) pg_catalog.replace(old.proname::pg_catalog.text, '_0_3_0', '')::pg_catalog.name
           AND new.pronamespace OPERATOR(pg_catalog.=) old.pronamespace
           AND new.proargtypes[0] OPERATOR(pg_catalog.=) old.proargtypes[0]
         CROSS JOIN LATERAL pg_catalog.aclexplode(old.proacl) a
          LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
         WHERE old.proname OPERATOR(pg_catalog.=) ANY ('{backfill_start_0_3_0,backfill_set_0_3_0}'::pg_catalog.name[])
           AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE' AND a.grantee OPERATOR(pg_catalog.<>) old.proowner
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s%s', kept.new_function,
                                  CASE WHEN kept.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(kept.rolname) END,
                                  CASE WHEN kept.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$$;
DROP FUNCTION backfill_start_0_3_0(regclass[], boolean, integer, integer, name, name, bigint, integer);
DROP FUNCTION backfill_start_0_3_0(regclass, boolean, integer, integer, name, name, bigint, integer);
DROP FUNCTION backfill_start_0_3_0(text, boolean, integer, integer, name, name, bigint, integer);
DROP FUNCTION backfill_set_0_3_0(bigint, integer, integer, bigint);

CREATE OR REPLACE VIEW backfill_status WITH (security_barrier) AS
SELECT j.id,
       j.state,
       j.pause_reason,
       t.tables,
       t.current_table,
       CASE WHEN v.readable THEN t.rows_done END AS rows_done,
       CASE WHEN v.readable THEN t.rows_estimated END AS rows_estimated,
       CASE WHEN NOT v.readable THEN NULL
            WHEN j.state = 'done' THEN 100.0 ELSE pg_catalog.round((100 OPERATOR(pg_catalog.*) t.fraction_done)::numeric, 1) END AS percent_done,
       CASE WHEN v.readable THEN r.rows_per_second END AS rows_per_second_last_minute,
       CASE WHEN v.readable AND j.state = 'running' AND r.rows_per_second OPERATOR(pg_catalog.>) 0
            THEN pg_catalog.make_interval(secs => pg_catalog.round(((1 OPERATOR(pg_catalog.-) t.fraction_done) OPERATOR(pg_catalog.*) t.rows_estimated
                                                               OPERATOR(pg_catalog./) r.rows_per_second)::numeric))
       END AS time_left,
       j.slot_name,
       -- (A standby has no current WAL position of its own: it shows what it has replayed.)
       pg_catalog.pg_wal_lsn_diff(CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_replay_lsn()
                                       ELSE pg_catalog.pg_current_wal_lsn() END,
                                  s.confirmed_flush_lsn)::bigint AS slot_lag_bytes,
       j.watermark_lsn,
       j.state = 'done' AND (j.slot_name IS NULL OR s.confirmed_flush_lsn >= j.watermark_lsn) AS delivered,
       a.pid AS worker_pid,
       backfill.workers_running(j.id) AS workers_running,
       CASE WHEN j.state = 'running' THEN backfill.waiting_for(j.id) END AS waiting_for,
       j.parallel,
       j.batch_size,
       j.rows_per_second,
       CASE WHEN j.slot_name IS NOT NULL THEN coalesce(j.max_lag_bytes, backfill.max_slot_lag_bytes()) END AS max_lag_bytes,
       j.publication_name,
       j.message_prefix,
       backfill.auto_resume() AS auto_resume,
       j.started_by,
       j.started_at,
       j.finished_at,
       CASE WHEN v.readable THEN j.last_error_sqlstate END AS last_error_sqlstate,
       CASE WHEN v.readable THEN j.last_error END AS last_error,
       j.lock_mode,
       backfill.source_limit('max_replica_lag', j.max_replica_lag_bytes) AS max_replica_lag_bytes,
       backfill.source_limit('max_retained_wal', j.max_retained_wal_bytes) AS max_retained_wal_bytes,
       backfill.source_limit('max_active_sessions', j.max_active_sessions)::integer AS max_active_sessions
  FROM backfill.job j
 CROSS JOIN LATERAL (
        SELECT pg_catalog.array_agg(jt.relid ORDER BY jt.position) AS tables,
               (pg_catalog.array_agg(jt.relid ORDER BY jt.position) FILTER (WHERE jt.state = 'running'))[1] AS current_table,
               pg_catalog.sum(jt.rows_done)::bigint AS rows_done,
               pg_catalog.sum(jt.rows_estimated)::bigint AS rows_estimated,
               coalesce(pg_catalog.sum(jt.rows_estimated OPERATOR(pg_catalog.*) CASE jt.state WHEN 'done' THEN 1
                                                              WHEN 'pending' THEN 0
                                                              ELSE coalesce(jt.key_fraction_done,
                                                                            least(1, jt.rows_done::float8 OPERATOR(pg_catalog./) nullif(jt.rows_estimated, 0)), 0)
                                                 END) OPERATOR(pg_catalog./) nullif(pg_catalog.sum(jt.rows_estimated), 0), 0) AS fraction_done,
               pg_catalog.bool_and(coalesce(pg_catalog.has_table_privilege(jt.relid, 'SELECT'), false)) AS all_selectable
          FROM backfill.job_table jt
         WHERE jt.job_id = j.id) t
 CROSS JOIN LATERAL (SELECT pg_catalog.pg_has_role('pg_monitor', 'MEMBER') OR t.all_selectable AS readable) v
  LEFT JOIN LATERAL (
        SELECT ((pg_catalog.max(p.rows_done) OPERATOR(pg_catalog.-) pg_catalog.min(p.rows_done))
                OPERATOR(pg_catalog./) nullif(extract(epoch FROM pg_catalog.max(p.at) OPERATOR(pg_catalog.-) pg_catalog.min(p.at)), 0))::bigint
               AS rows_per_second
          FROM backfill.job_progress p
         WHERE p.job_id = j.id AND p.at OPERATOR(pg_catalog.>) (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) interval '1 minute')) r ON true
  LEFT JOIN pg_catalog.pg_replication_slots s ON s.slot_name = j.slot_name
  LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = j.worker_pid AND j.state IN ('running', 'paused')
 WHERE backfill.visible(j.started_by);
COMMENT ON COLUMN backfill_status.waiting_for IS 'What a running backfill''s workers wait for now, if anything: a row lock held by another process (its pid), the slot''s consumer (none connected, or lagging past max_lag_bytes), a standby replaying past max_replica_lag_bytes, a slot retaining more than max_retained_wal_bytes, or the server''s load past max_active_sessions (then it slows down rather than waits)';
COMMENT ON COLUMN backfill_status.max_replica_lag_bytes IS 'Pages wait while a physical standby replays more than this behind; NULL: no limit';
COMMENT ON COLUMN backfill_status.max_retained_wal_bytes IS 'Pages wait while a replication slot retains more WAL than this; NULL: no limit';
COMMENT ON COLUMN backfill_status.max_active_sessions IS 'Pages slow down while more client sessions than this are active; NULL: no limit';
COMMENT ON FUNCTION backfill.set_source_limits(bigint, bigint, bigint, integer) IS 'Entry point of the back-pressure options of backfill_start() and backfill_set(); returns the backfill''s id';
COMMENT ON FUNCTION backfill.source_limit(text, bigint) IS 'The back-pressure limit in force for a backfill''s option (NULL: the setting; 0: off), for backfill_status';

-- backfill_checksum(): key ranges of a table with their row counts and checksums.

CREATE  FUNCTION backfill."row_hash"(
	"row" anyelement /* AnyElement */
) RETURNS bigint /* i64 */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'row_hash_wrapper';

CREATE  FUNCTION backfill."checksum"(
	"table" oid, /* Option < pg_sys :: Oid > */
	"ranges" INT, /* Option < i32 > */
	"level" text, /* Option < Text > */
	"bounds" jsonb /* Option < JsonB > */
) RETURNS TABLE (
	"range" INT,  /* i32 */
	"lower" jsonb,  /* Option < JsonB > */
	"upper" jsonb,  /* Option < JsonB > */
	"rows" bigint,  /* i64 */
	"checksum" TEXT  /* Option < String > */
)
 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'checksum_wrapper';

CREATE FUNCTION backfill_checksum(tbl regclass, ranges integer DEFAULT 1024, level text DEFAULT 'hash',
                                  bounds jsonb DEFAULT NULL)
RETURNS TABLE (range integer, lower jsonb, upper jsonb, rows bigint, checksum text)
LANGUAGE sql VOLATILE
AS $$ SELECT * FROM backfill.checksum(tbl::oid, ranges, level, bounds) $$;
COMMENT ON FUNCTION backfill_checksum(regclass, integer, text, jsonb) IS
'One row per key range of the table: its bounds, row count and checksum (level count or hash), as the caller may read it; bounds => the ranges of another checksum, to compare two tables over identical ranges.';

-- Like every function: not PUBLIC's; an operator's (granted as docs/security.md says: ALL FUNCTIONS
-- IN SCHEMA backfill, and the public ones by name), so granted to who may run backfill.start().
REVOKE EXECUTE ON FUNCTION backfill_checksum(regclass, integer, text, jsonb), backfill.checksum(oid, integer, text, jsonb),
                           backfill.row_hash(anyelement) FROM PUBLIC;
DO $$
DECLARE
    operator record;
BEGIN
    FOR operator IN
        SELECT DISTINCT a.grantee, r.rolname, a.is_grantable
          FROM pg_catalog.pg_proc p
         CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
          LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
         WHERE p.oid OPERATOR(pg_catalog.=)
                   'backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer)'::pg_catalog.regprocedure::pg_catalog.oid
           AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE' AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION backfill_checksum(regclass, integer, text, jsonb), '
                                  'backfill.checksum(oid, integer, text, jsonb), backfill.row_hash(anyelement) TO %s%s',
                                  CASE WHEN operator.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(operator.rolname) END,
                                  CASE WHEN operator.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$$;
COMMENT ON FUNCTION backfill.checksum(oid, integer, text, jsonb) IS 'Entry point of backfill_checksum()';
COMMENT ON FUNCTION backfill.row_hash(anyelement) IS 'A table row''s 64-bit hash over its columns'' binary send formats (SipHash-2-4), for backfill_checksum()';
