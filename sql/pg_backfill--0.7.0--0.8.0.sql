-- pg_backfill 0.7.0 -> 0.8.0: backfill_compare() and backfill_repair() of Citus distributed tables;
-- checksums and comparisons read a table as its owner, so backfill.row_hash() is executable by all;
-- backfill_start(..., filter => ...); progress as rows against the rows expected.
-- What changed for a DBA: CHANGELOG.md, section 0.8.0.
\echo Use "ALTER EXTENSION pg_backfill UPDATE TO '0.8.0'" to load this file. \quit

-- (As every update script: the state tables first, in the order a worker's page takes them.)
LOCK TABLE backfill.job, backfill.job_table IN ACCESS EXCLUSIVE MODE;

-- backfill_repair() of a distributed table: each worker node's keyed backfill of its shards.
-- (As pgrx writes it into a fresh install's script, from src/api/keyed.rs.)
CREATE FUNCTION backfill."set_keys_of"(
	"id" bigint,
	"tbl" oid,
	"keys" jsonb
) RETURNS bigint
LANGUAGE c
AS 'MODULE_PATHNAME', 'set_keys_of_wrapper';
COMMENT ON FUNCTION backfill.set_keys_of(bigint, oid, jsonb) IS 'The keys of one table of a backfill started in this transaction (a worker node''s backfill of its shards, for backfill_repair() on the Citus coordinator); returns the backfill''s id';
REVOKE EXECUTE ON FUNCTION backfill.set_keys_of(bigint, oid, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION backfill.set_keys_of(bigint, oid, jsonb) TO PUBLIC;

DROP FUNCTION backfill.start_on_node(regclass[], boolean, integer, integer, name, name, bigint, integer);
CREATE FUNCTION backfill.start_on_node(tables regclass[], confirm boolean, batch_size integer,
                                       rows_per_second integer, slot name, publication name,
                                       max_lag bigint, parallel integer, shard_keys jsonb DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    started bigint;
    state text;
    message text;
    detail text;
    hint text;
BEGIN
    started := @extschema@.backfill_start(tables, confirm, batch_size, rows_per_second, slot, publication,
                                          max_lag, parallel);
    IF shard_keys IS NOT NULL
       -- (In parentheses: IF would take the CASE's THEN for its own.)
       AND (CASE WHEN jsonb_typeof(shard_keys) = 'array' THEN jsonb_array_length(shard_keys) END
            IS DISTINCT FROM cardinality(tables)) THEN
        RAISE EXCEPTION 'shard_keys must be a JSON array of one key list per table'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = format('%s tables were given; their keys are given in the same order.', cardinality(tables)),
                  HINT = 'backfill_repair() on the coordinator passes them: run that there.';
    END IF;
    FOR i IN 1 .. CASE WHEN shard_keys IS NULL THEN 0 ELSE cardinality(tables) END LOOP
        PERFORM backfill.set_keys_of(started, tables[i], shard_keys -> (i - 1));
    END LOOP;
    RETURN jsonb_build_object('id', started);
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
                            detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
    RETURN jsonb_build_object('sqlstate', state, 'message', message, 'detail', detail, 'hint', hint);
END
$$;
COMMENT ON FUNCTION backfill.start_on_node(regclass[], boolean, integer, integer, name, name, bigint, integer, jsonb) IS
'backfill_start() on a Citus worker node for the coordinator (with each table''s keys, for backfill_repair()), with its error returned as JSON (sqlstate, message, detail, hint) instead of raised';
-- It grants nothing backfill_start() does not: it runs as its caller, who needs EXECUTE on that.
REVOKE EXECUTE ON FUNCTION backfill.start_on_node(regclass[], boolean, integer, integer, name, name, bigint, integer, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION backfill.start_on_node(regclass[], boolean, integer, integer, name, name, bigint, integer, jsonb) TO PUBLIC;

-- A checksum or a comparison reads a table as its owner (its code, such as a cast to json of its
-- key's type, never runs as the superuser who checks it), who may hold no grant of pg_backfill's.
GRANT EXECUTE ON FUNCTION backfill.row_hash(anyelement) TO PUBLIC;

-- backfill_start(..., filter => ...) and backfill_estimate(..., filter => ...): only the rows a
-- boolean expression is true for, run as the role that started the backfill.
ALTER TABLE backfill.job ADD COLUMN row_filter text;
COMMENT ON COLUMN backfill.job.row_filter IS 'The filter given to backfill_start() (filter => ...): a boolean SQL expression over the table''s columns, run as the role that started it; only rows it is true for are delivered. NULL: every row';

-- Progress that agrees with itself: percent_done and time_left from rows_done against the rows
-- expected (rows_estimated), no longer from key-range histograms. And the row filter.
CREATE OR REPLACE VIEW backfill_status WITH (security_barrier) AS
SELECT j.id,
       j.state,
       j.pause_reason,
       t.tables,
       t.current_table,
       CASE WHEN v.readable THEN t.rows_done END AS rows_done,
       CASE WHEN v.readable THEN t.rows_expected END AS rows_estimated,
       -- Progress is rows_done against rows_estimated, the one definition of both (docs/reference.md
       -- #progress): truncated, never rounded up, and below 100 until the backfill is done.
       CASE WHEN NOT v.readable THEN NULL
            WHEN j.state = 'done' THEN 100.0
            ELSE least(99.9, pg_catalog.trunc((100 OPERATOR(pg_catalog.*) t.rows_done)::numeric
                                              OPERATOR(pg_catalog./) nullif(t.rows_expected, 0), 1)) END AS percent_done,
       CASE WHEN v.readable THEN r.rows_per_second END AS rows_per_second_last_minute,
       CASE WHEN v.readable AND j.state = 'running' AND r.rows_per_second OPERATOR(pg_catalog.>) 0
            THEN pg_catalog.make_interval(secs => pg_catalog.round((t.rows_expected OPERATOR(pg_catalog.-) t.rows_done)::numeric
                                                                   OPERATOR(pg_catalog./) r.rows_per_second))
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
       backfill.source_limit('max_active_sessions', j.max_active_sessions)::integer AS max_active_sessions,
       CASE WHEN j.state = 'running' THEN backfill.waiting_kind(j.id) END AS waiting_kind,
       j.rows_per_message,
       CASE WHEN v.readable THEN j.row_filter END AS row_filter
  FROM backfill.job j
 CROSS JOIN LATERAL (
        SELECT pg_catalog.array_agg(jt.relid ORDER BY jt.position) AS tables,
               (pg_catalog.array_agg(jt.relid ORDER BY jt.position) FILTER (WHERE jt.state = 'running'))[1] AS current_table,
               pg_catalog.sum(jt.rows_done)::bigint AS rows_done,
               -- The rows expected in all: a finished range's rows; a pending one's estimate (at
               -- least 1, as once it runs); a running one's estimate, or one more than its rows
               -- once it has passed it. Each row delivered then raises rows_done at least as much
               -- as this, and a range that ends lowers it: the percentage never goes backwards.
               pg_catalog.sum(CASE jt.state WHEN 'done' THEN jt.rows_done
                                            ELSE greatest(jt.rows_estimated, jt.rows_done OPERATOR(pg_catalog.+) 1) END)::bigint
                   AS rows_expected,
               pg_catalog.bool_and(coalesce(pg_catalog.has_table_privilege(jt.relid, 'SELECT'), false)) AS all_selectable
          FROM backfill.job_table jt
         WHERE jt.job_id = j.id) t
 CROSS JOIN LATERAL (SELECT backfill.may_act_as(CURRENT_USER, 'pg_monitor') OR t.all_selectable AS readable) v
  LEFT JOIN LATERAL (
        SELECT ((pg_catalog.max(p.rows_done) OPERATOR(pg_catalog.-) pg_catalog.min(p.rows_done))
                OPERATOR(pg_catalog./) nullif(extract(epoch FROM pg_catalog.max(p.at) OPERATOR(pg_catalog.-) pg_catalog.min(p.at)), 0))::bigint
               AS rows_per_second
          FROM backfill.job_progress p
         WHERE p.job_id = j.id AND p.at OPERATOR(pg_catalog.>) (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) interval '1 minute')) r ON true
  LEFT JOIN pg_catalog.pg_replication_slots s ON s.slot_name = j.slot_name
  LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = j.worker_pid AND j.state IN ('running', 'paused')
 WHERE backfill.visible(j.started_by);
COMMENT ON COLUMN backfill_status.time_left IS 'The rows still expected (rows_estimated - rows_done) at the last minute''s rate';
COMMENT ON COLUMN backfill_status.rows_estimated IS 'Rows expected in all: the rows of each finished table or range, and the planner''s estimate of each other one, raised to one more than its rows delivered once they pass it';
COMMENT ON COLUMN backfill_status.percent_done IS 'rows_done against rows_estimated, truncated to a tenth; never goes backwards, below 100 until done, 100 once done';
COMMENT ON COLUMN backfill_status.row_filter IS 'The filter it started with (filter => ...): only rows it is true for are delivered; NULL: every row';

-- The new trailing argument makes new functions: the old wrappers are kept aside under other
-- names until their grants are copied, then dropped (as 0.7.0 did for rows_per_message). The old
-- entry points stay: the SQL of an earlier version calls them until it is updated.
ALTER FUNCTION backfill_estimate(regclass[], integer) RENAME TO backfill_estimate_0_7_0;
ALTER FUNCTION backfill_estimate(regclass, integer) RENAME TO backfill_estimate_0_7_0;
ALTER FUNCTION backfill_estimate(text, integer) RENAME TO backfill_estimate_0_7_0;
ALTER FUNCTION backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer) RENAME TO backfill_start_0_7_0;
ALTER FUNCTION backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer) RENAME TO backfill_start_0_7_0;
ALTER FUNCTION backfill_start(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer) RENAME TO backfill_start_0_7_0;

CREATE  FUNCTION backfill."estimate"(
	"tables" oid[], /* :: std :: option :: Option < Vec < Option < pg_sys :: Oid > > > */
	"batch_size" INT, /* Option < i32 > */
	"filter" text /* Option < Text > */
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
AS 'MODULE_PATHNAME', 'estimate_filtered_wrapper';
CREATE  FUNCTION backfill."start"(
	"tables" oid[], /* :: std :: option :: Option < Vec < Option < pg_sys :: Oid > > > */
	"confirm" bool, /* Option < bool > */
	"batch_size" INT, /* Option < i32 > */
	"rows_per_second" INT, /* Option < i32 > */
	"slot" text, /* Option < Text > */
	"publication" text, /* Option < Text > */
	"max_lag" bigint, /* Option < i64 > */
	"parallel" INT, /* Option < i32 > */
	"filter" text /* Option < Text > */
) RETURNS bigint /* i64 */
 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'start_filtered_wrapper';
COMMENT ON FUNCTION backfill.estimate(oid[], integer, text) IS 'Entry point of backfill_estimate()';
COMMENT ON FUNCTION backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer, text) IS 'Entry point of backfill_start()';
COMMENT ON FUNCTION backfill.estimate(oid[], integer) IS 'Entry point of backfill_estimate() before 0.8.0 (no filter): the SQL of an earlier version calls it until ALTER EXTENSION UPDATE';
COMMENT ON FUNCTION backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer) IS 'Entry point of backfill_start() before 0.8.0 (no filter): the SQL of an earlier version calls it until ALTER EXTENSION UPDATE';

CREATE FUNCTION backfill_estimate(tables regclass[], batch_size integer DEFAULT 1000, filter text DEFAULT NULL)
RETURNS TABLE (table_name regclass, eligible boolean, reason text, key_columns name[],
               rows_estimated bigint, bytes_estimated bigint, pages bigint)
LANGUAGE sql VOLATILE
AS $$ SELECT e.table_name::regclass, e.eligible, e.reason, e.key_columns::name[],
             e.rows_estimated, e.bytes_estimated, e.pages
        FROM backfill.estimate(tables::oid[], batch_size, filter) e $$;
COMMENT ON FUNCTION backfill_estimate(regclass[], integer, text) IS
'For each table: whether it can be backfilled (and why not), its key, and the rows, message bytes and pages a backfill would deliver. Uses statistics and a small sample, never a full scan.';

CREATE FUNCTION backfill_estimate(table_name regclass, batch_size integer DEFAULT 1000, filter text DEFAULT NULL)
RETURNS TABLE (table_name regclass, eligible boolean, reason text, key_columns name[],
               rows_estimated bigint, bytes_estimated bigint, pages bigint)
LANGUAGE sql VOLATILE
AS $$ SELECT * FROM backfill_estimate(ARRAY[table_name], batch_size, filter) $$;
COMMENT ON FUNCTION backfill_estimate(regclass, integer, text) IS 'backfill_estimate() of one table';

CREATE FUNCTION backfill_estimate(table_name text, batch_size integer DEFAULT 1000, filter text DEFAULT NULL)
RETURNS TABLE (table_name regclass, eligible boolean, reason text, key_columns name[],
               rows_estimated bigint, bytes_estimated bigint, pages bigint)
LANGUAGE sql VOLATILE
AS $$ SELECT * FROM backfill_estimate(ARRAY[table_name::regclass], batch_size, filter) $$;
COMMENT ON FUNCTION backfill_estimate(text, integer, text) IS 'backfill_estimate() of one table, by name';

CREATE FUNCTION backfill_start(tables regclass[], confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL,
                               parallel integer DEFAULT 1, max_replica_lag bigint DEFAULT NULL,
                               max_retained_wal bigint DEFAULT NULL, max_active_sessions integer DEFAULT NULL,
                               keys jsonb DEFAULT NULL, rows_per_message integer DEFAULT NULL,
                               filter text DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.set_keys(backfill.set_source_limits(backfill.set_rows_per_message(backfill.start(
         backfill.refuse_node_options(tables::oid[], keys, max_replica_lag, max_retained_wal, max_active_sessions, rows_per_message),
         confirm, batch_size, rows_per_second, slot::text, publication::text, max_lag, parallel, filter), rows_per_message),
                                       max_replica_lag, max_retained_wal, max_active_sessions), keys) $$;
COMMENT ON FUNCTION backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text) IS
'Starts a backfill of the tables (all or nothing) and returns its id. Without confirm => true it starts nothing and reports the estimate. keys => a JSON array of key objects: only those keys of the one table, each read or, without a row, delivered absent. rows_per_message => N: each page''s rows in reads messages of up to N rows (NULL: backfill.rows_per_message).';

CREATE FUNCTION backfill_start(table_name regclass, confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL,
                               parallel integer DEFAULT 1, max_replica_lag bigint DEFAULT NULL,
                               max_retained_wal bigint DEFAULT NULL, max_active_sessions integer DEFAULT NULL,
                               keys jsonb DEFAULT NULL, rows_per_message integer DEFAULT NULL,
                               filter text DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.set_keys(backfill.set_source_limits(backfill.set_rows_per_message(backfill.start(
         backfill.refuse_node_options(ARRAY[table_name]::oid[], keys, max_replica_lag, max_retained_wal, max_active_sessions, rows_per_message),
         confirm, batch_size, rows_per_second, slot::text, publication::text, max_lag, parallel, filter), rows_per_message),
                                       max_replica_lag, max_retained_wal, max_active_sessions), keys) $$;
COMMENT ON FUNCTION backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text) IS 'backfill_start() of one table';

-- See backfill_estimate(text): makes backfill_start('public.orders', confirm => true) resolve.
CREATE FUNCTION backfill_start(table_name text, confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL,
                               parallel integer DEFAULT 1, max_replica_lag bigint DEFAULT NULL,
                               max_retained_wal bigint DEFAULT NULL, max_active_sessions integer DEFAULT NULL,
                               keys jsonb DEFAULT NULL, rows_per_message integer DEFAULT NULL,
                               filter text DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.set_keys(backfill.set_source_limits(backfill.set_rows_per_message(backfill.start(
         backfill.refuse_node_options(ARRAY[table_name::regclass]::oid[], keys, max_replica_lag, max_retained_wal, max_active_sessions, rows_per_message),
         confirm, batch_size, rows_per_second, slot::text, publication::text, max_lag, parallel, filter), rows_per_message),
                                       max_replica_lag, max_retained_wal, max_active_sessions), keys) $$;
COMMENT ON FUNCTION backfill_start(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text) IS 'backfill_start() of one table, by name';

REVOKE EXECUTE ON FUNCTION
    backfill_estimate(regclass[], integer, text),
    backfill_estimate(regclass, integer, text),
    backfill_estimate(text, integer, text),
    backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text),
    backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text),
    backfill_start(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text),
    backfill.estimate(oid[], integer, text),
    backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer, text)
  FROM PUBLIC;

-- Who could execute an old function may execute its successor (an old entry point, the new one). (Every operator and function is
-- pg_catalog's: this runs as a superuser, with the extension's schema, which other roles may be
-- able to create objects in, on the path.)
DO $$
DECLARE
    kept record;
BEGIN
    FOR kept IN
        SELECT DISTINCT g.successor, a.grantee, r.rolname, a.is_grantable
          FROM (VALUES ('backfill_estimate_0_7_0(regclass[], integer)', 'backfill_estimate(regclass[], integer, text)'),
                       ('backfill_estimate_0_7_0(regclass, integer)', 'backfill_estimate(regclass, integer, text)'),
                       ('backfill_estimate_0_7_0(text, integer)', 'backfill_estimate(text, integer, text)'),
                       ('backfill_start_0_7_0(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer)', 'backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text)'),
                       ('backfill_start_0_7_0(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer)', 'backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text)'),
                       ('backfill_start_0_7_0(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer)', 'backfill_start(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text)'),
                       ('backfill.estimate(oid[], integer)', 'backfill.estimate(oid[], integer, text)'),
                       ('backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer)', 'backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer, text)'))
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
DROP FUNCTION backfill_estimate_0_7_0(regclass[], integer);
DROP FUNCTION backfill_estimate_0_7_0(regclass, integer);
DROP FUNCTION backfill_estimate_0_7_0(text, integer);
DROP FUNCTION backfill_start_0_7_0(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer);
DROP FUNCTION backfill_start_0_7_0(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer);
DROP FUNCTION backfill_start_0_7_0(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer);

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
       NOT pg_catalog.has_function_privilege('public', 'backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer, text)', 'EXECUTE'),
       'Every role could start backfills of the tables it may update, and take background workers.',
       'REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA backfill FROM PUBLIC;'
$$;
