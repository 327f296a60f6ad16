-- pg_backfill 0.6.0 -> 0.7.0: a backfill for a slot records which slot of that name it is for
-- (a slot dropped and created again under the same name fails it), and backfill.row_hash() is
-- STABLE (an enum label it reads can be renamed). The row hash now follows SQL equality for
-- floats (one NaN, -0 as 0) and reads arrays and composites element by element: checksums of
-- tables with such columns differ from 0.6.0's, and a comparison refuses a server of the other.
-- What changed for a DBA: CHANGELOG.md, section 0.7.0.
\echo Use "ALTER EXTENSION pg_backfill UPDATE TO '0.7.0'" to load this file. \quit

-- backfill.job_error and the view backfill_errors keep every error that failed a backfill.
-- backfill.job_shard, the view backfill_shards and backfill.start_on_node(): backfills of Citus
-- distributed tables, started on the coordinator.
-- backfill_status gains waiting_kind, the stable kind of what a running backfill waits for.

-- (As every update script: the state tables first, in the order a worker's page takes them.)
LOCK TABLE backfill.job, backfill.job_table IN ACCESS EXCLUSIVE MODE;

ALTER TABLE backfill.job ADD COLUMN slot_identity text;
COMMENT ON COLUMN backfill.job.slot_identity IS 'Which slot of that name it was when the backfill started (its directory''s inode and birth time): a slot dropped and created again fails the backfill';

-- backfill_start(..., rows_per_message => N): each page's rows in "reads" messages of up to N
-- rows; a backfill of 0.6.0 sends a "read" per row, as 1 does.
ALTER TABLE backfill.job ADD COLUMN rows_per_message integer NOT NULL DEFAULT 1 CHECK (rows_per_message BETWEEN 1 AND 100000);
COMMENT ON COLUMN backfill.job.rows_per_message IS 'Most rows per message: 1 sends a read message per row, more sends reads messages of up to this many rows (backfill.rows_per_message when it started, unless given)';

ALTER FUNCTION backfill.row_hash(anyelement) STABLE;

COMMENT ON FUNCTION backfill.row_hash(anyelement) IS 'A table row''s 64-bit hash over its columns'' binary send formats (XXH3-64; floats as SQL compares them, arrays and composites element by element, jsonb as the tokens of a walk of it, text in UTF-8), for backfill_checksum()';

-- backfill_security_check() names pg_logical_emit_message by whatever signatures the server
-- has: 17 added an argument, and 0.6.0's check failed there ("function ... does not exist").
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
       NOT pg_catalog.has_function_privilege('public', 'backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer)', 'EXECUTE'),
       'Every role could start backfills of the tables it may update, and take background workers.',
       'REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA backfill FROM PUBLIC;'
$$;

-- Who sees and controls a role's backfills: a role that may act as it (backfill.may_act_as),
-- no longer any member. Since 16 a member granted WITH INHERIT FALSE, SET FALSE has neither
-- the role's privileges nor the right to become it, yet pg_has_role(..., 'MEMBER') counted it.
CREATE  FUNCTION backfill."may_act_as"(
	"member" TEXT, /* &str */
	"role" TEXT /* &str */
) RETURNS bool /* bool */
STRICT STABLE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'may_act_as_wrapper';
COMMENT ON FUNCTION backfill.may_act_as(text, text) IS 'Whether role member holds the privileges of role role or may SET ROLE to it (a bare member, granted WITH INHERIT FALSE, SET FALSE on 16+, may not): who sees and controls a role''s backfills';
REVOKE EXECUTE ON FUNCTION backfill.may_act_as(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION backfill.may_act_as(text, text) TO PUBLIC;
CREATE OR REPLACE FUNCTION backfill.visible(started_by name)
RETURNS boolean
LANGUAGE sql STABLE
AS $$ SELECT backfill.may_act_as(CURRENT_USER, 'pg_monitor') OR backfill.may_act_as(CURRENT_USER, started_by) $$;
COMMENT ON FUNCTION backfill.visible(name) IS
'Whether the current role sees a backfill started by this role: one that may act as it or as pg_monitor (backfill.may_act_as), or a superuser';

CREATE FUNCTION backfill."waiting_kind"(
	"backfill_id" bigint /* i64 */
) RETURNS text /* Option < Text > */
STRICT STABLE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'waiting_kind_wrapper';
COMMENT ON FUNCTION backfill.waiting_kind(bigint) IS 'The kind of what the workers of a backfill wait for now (row_lock, consumer_away, consumer_lag, replica_lag, retained_wal, load), or NULL';
-- (Revoked, then granted: the privileges of a fresh install, in its order.)
REVOKE EXECUTE ON FUNCTION backfill.waiting_kind(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION backfill.waiting_kind(bigint) TO PUBLIC;

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
       backfill.source_limit('max_active_sessions', j.max_active_sessions)::integer AS max_active_sessions,
       CASE WHEN j.state = 'running' THEN backfill.waiting_kind(j.id) END AS waiting_kind,
       j.rows_per_message
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
CREATE OR REPLACE VIEW backfill_tables WITH (security_barrier) AS
SELECT jt.job_id AS backfill_id,
       jt.position,
       jt.relid AS table_name,
       jt.part,
       CASE WHEN j.state IN ('cancelled', 'failed') AND jt.state <> 'done' THEN j.state
            ELSE jt.state END AS state,
       jt.key_columns,
       CASE WHEN v.readable THEN jt.cursor END AS cursor,
       CASE WHEN v.readable THEN jt.upper_bound END AS upper_bound,
       CASE WHEN v.readable THEN jt.rows_done END AS rows_done,
       CASE WHEN v.readable THEN jt.rows_estimated END AS rows_estimated,
       CASE WHEN v.readable THEN jt.bytes_done END AS bytes_done,
       jt.last_page_lsn,
       jt.started_at,
       jt.finished_at,
       jt.pages_table_locked,
       jt.pages_row_locked
  FROM backfill.job_table jt
  JOIN backfill.job j ON j.id = jt.job_id
 CROSS JOIN LATERAL (SELECT backfill.may_act_as(CURRENT_USER, 'pg_monitor')
                            OR coalesce(pg_catalog.has_table_privilege(jt.relid, 'SELECT'), false) AS readable) v
 WHERE backfill.visible(j.started_by);
COMMENT ON COLUMN backfill_status.rows_per_message IS 'Most rows per message: 1, a read message per row; more, reads messages of up to this many rows';
COMMENT ON COLUMN backfill_status.waiting_kind IS 'The kind of what a running backfill''s workers wait for now, stable for monitoring: row_lock, consumer_away, consumer_lag, replica_lag, retained_wal or load (then it slows down rather than waits); NULL when nothing holds it back';

CREATE TABLE backfill.job_error (
    job_id            bigint NOT NULL REFERENCES backfill.job (id) ON DELETE CASCADE,
    occurred_at       timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    relid             oid,
    table_name        text,
    stopped_after_key text,
    sqlstate          text NOT NULL,
    message           text NOT NULL,
    detail            text
);
CREATE INDEX job_error_job_id_occurred_at_idx ON backfill.job_error (job_id, occurred_at);
COMMENT ON TABLE backfill.job_error IS 'Every error that failed a backfill, oldest first (last_error shows the latest only, and a resume clears it)';
COMMENT ON COLUMN backfill.job_error.job_id IS 'The backfill (backfill.job.id)';
COMMENT ON COLUMN backfill.job_error.occurred_at IS 'When it failed';
COMMENT ON COLUMN backfill.job_error.relid IS 'The table it was scanning, if any';
COMMENT ON COLUMN backfill.job_error.table_name IS 'That table''s name when it failed';
COMMENT ON COLUMN backfill.job_error.stopped_after_key IS 'The last key it had delivered of that table ((start) for none)';
COMMENT ON COLUMN backfill.job_error.sqlstate IS 'SQLSTATE of the error';
COMMENT ON COLUMN backfill.job_error.message IS 'The error''s message';
COMMENT ON COLUMN backfill.job_error.detail IS 'The error''s detail, if any';
GRANT SELECT ON backfill.job_error TO pg_monitor;
CREATE TRIGGER discard_replicated_row BEFORE INSERT OR UPDATE OR DELETE ON backfill.job_error
    FOR EACH ROW EXECUTE FUNCTION backfill.discard_replicated_row();
ALTER TABLE backfill.job_error ENABLE REPLICA TRIGGER discard_replicated_row;

CREATE VIEW backfill_errors WITH (security_barrier) AS
SELECT e.job_id AS backfill_id,
       e.occurred_at,
       e.table_name,
       CASE WHEN v.readable THEN e.stopped_after_key END AS stopped_after_key,
       CASE WHEN v.readable THEN e.sqlstate END AS sqlstate,
       CASE WHEN v.readable THEN e.message END AS message,
       CASE WHEN v.readable THEN e.detail END AS detail
  FROM backfill.job_error e
  JOIN backfill.job j ON j.id = e.job_id
 CROSS JOIN LATERAL (SELECT backfill.may_act_as(CURRENT_USER, 'pg_monitor')
                            OR coalesce(pg_catalog.has_table_privilege(e.relid, 'SELECT'), false) AS readable) v
 WHERE backfill.visible(j.started_by);
COMMENT ON VIEW backfill_errors IS 'Every error that failed a backfill, oldest first: backfill_status.last_error shows the latest only, and a resume clears it';
COMMENT ON COLUMN backfill_errors.backfill_id IS 'The backfill (backfill_status.id)';
COMMENT ON COLUMN backfill_errors.occurred_at IS 'When it failed';
COMMENT ON COLUMN backfill_errors.table_name IS 'The table it was scanning when it failed, if any';
COMMENT ON COLUMN backfill_errors.stopped_after_key IS 'The last key it had delivered of that table';
COMMENT ON COLUMN backfill_errors.sqlstate IS 'SQLSTATE of the error';
COMMENT ON COLUMN backfill_errors.message IS 'The error''s message';
COMMENT ON COLUMN backfill_errors.detail IS 'The error''s detail, if any';
GRANT SELECT ON backfill_errors TO PUBLIC;

-- A backfill of a Citus distributed table, started on the coordinator: one backfill on each
-- worker node, of the shards it holds (see docs/citus.md). The coordinator's backfill has one
-- job_table row per shard placement, and here the node and the node's backfill that delivers it.
CREATE TABLE backfill.job_shard (
    job_id           bigint NOT NULL,
    position         integer NOT NULL,
    shard_id         bigint NOT NULL,
    shard_name       text NOT NULL,
    node_name        text NOT NULL,
    node_port        integer NOT NULL,
    node_backfill_id bigint NOT NULL,
    node_state       text,
    node_error       text,
    PRIMARY KEY (job_id, position),
    FOREIGN KEY (job_id, position) REFERENCES backfill.job_table (job_id, position) ON DELETE CASCADE
);
COMMENT ON TABLE backfill.job_shard IS 'For a backfill of a Citus distributed table: each shard placement''s node and the backfill there that delivers it';
COMMENT ON COLUMN backfill.job_shard.job_id IS 'The backfill (backfill.job.id), on the coordinator';
COMMENT ON COLUMN backfill.job_shard.position IS 'Its row in backfill.job_table';
COMMENT ON COLUMN backfill.job_shard.shard_id IS 'The shard (pg_dist_shard.shardid)';
COMMENT ON COLUMN backfill.job_shard.shard_name IS 'The shard''s table on the node';
COMMENT ON COLUMN backfill.job_shard.node_name IS 'The node that holds the placement (pg_dist_node.nodename)';
COMMENT ON COLUMN backfill.job_shard.node_port IS 'Its port';
COMMENT ON COLUMN backfill.job_shard.node_backfill_id IS 'The backfill on that node that delivers the shard (its backfill_status.id)';
COMMENT ON COLUMN backfill.job_shard.node_state IS 'That backfill''s state when the coordinator last looked';
COMMENT ON COLUMN backfill.job_shard.node_error IS 'Its last error, if it failed';
GRANT SELECT ON backfill.job_shard TO pg_monitor;
CREATE TRIGGER discard_replicated_row BEFORE INSERT OR UPDATE OR DELETE ON backfill.job_shard
    FOR EACH ROW EXECUTE FUNCTION backfill.discard_replicated_row();
ALTER TABLE backfill.job_shard ENABLE REPLICA TRIGGER discard_replicated_row;

-- Citus: a backfill of a distributed table started on the coordinator (see docs/citus.md).
CREATE VIEW backfill_shards WITH (security_barrier) AS
SELECT s.job_id AS backfill_id,
       s.position,
       jt.relid AS table_name,
       s.shard_id,
       s.shard_name,
       s.node_name,
       s.node_port,
       s.node_backfill_id,
       CASE WHEN j.state IN ('cancelled', 'failed') AND jt.state <> 'done' THEN j.state
            ELSE jt.state END AS state,
       s.node_state,
       CASE WHEN v.readable THEN jt.rows_done END AS rows_done,
       CASE WHEN v.readable THEN jt.rows_estimated END AS rows_estimated,
       CASE WHEN v.readable THEN s.node_error END AS node_error
  FROM backfill.job_shard s
  JOIN backfill.job_table jt ON jt.job_id = s.job_id AND jt.position = s.position
  JOIN backfill.job j ON j.id = s.job_id
 CROSS JOIN LATERAL (SELECT backfill.may_act_as(CURRENT_USER, 'pg_monitor')
                            OR coalesce(pg_catalog.has_table_privilege(jt.relid, 'SELECT'), false) AS readable) v
 WHERE backfill.visible(j.started_by);
COMMENT ON VIEW backfill_shards IS 'For a backfill of a Citus distributed table, on the coordinator: each shard placement, its node, and the backfill there that delivers it';
COMMENT ON COLUMN backfill_shards.backfill_id IS 'The backfill (backfill_status.id)';
COMMENT ON COLUMN backfill_shards.position IS 'Its row in backfill_tables';
COMMENT ON COLUMN backfill_shards.table_name IS 'The distributed table';
COMMENT ON COLUMN backfill_shards.shard_id IS 'The shard (pg_dist_shard.shardid), as messages carry it in "shard"';
COMMENT ON COLUMN backfill_shards.shard_name IS 'The shard''s table on the node';
COMMENT ON COLUMN backfill_shards.node_name IS 'The worker node that holds the placement';
COMMENT ON COLUMN backfill_shards.node_port IS 'Its port';
COMMENT ON COLUMN backfill_shards.node_backfill_id IS 'The backfill on that node that delivers the shard, in that node''s stream';
COMMENT ON COLUMN backfill_shards.state IS 'pending, running, done; or the backfill''s cancelled/failed for a shard it did not finish';
COMMENT ON COLUMN backfill_shards.node_state IS 'The node''s backfill''s state when the coordinator last looked (about every second)';
COMMENT ON COLUMN backfill_shards.rows_done IS 'Read messages of the shard delivered on its node';
COMMENT ON COLUMN backfill_shards.rows_estimated IS 'The node''s estimate of the shard''s rows';
COMMENT ON COLUMN backfill_shards.node_error IS 'The node''s backfill''s error, if it failed';
GRANT SELECT ON backfill_shards TO PUBLIC;

-- What the coordinator runs on each worker node, as the role that called backfill_start() there:
-- that node's backfill_start(), its error (SQLSTATE, message, detail, hint) returned as JSON
-- rather than raised, so that the coordinator can raise it again as it was, naming the node.
CREATE FUNCTION backfill.start_on_node(tables regclass[], confirm boolean, batch_size integer,
                                       rows_per_second integer, slot name, publication name,
                                       max_lag bigint, parallel integer)
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
    RETURN jsonb_build_object('id', started);
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
                            detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
    RETURN jsonb_build_object('sqlstate', state, 'message', message, 'detail', detail, 'hint', hint);
END
$$;
COMMENT ON FUNCTION backfill.start_on_node(regclass[], boolean, integer, integer, name, name, bigint, integer) IS
'backfill_start() on a Citus worker node for the coordinator, with its error returned as JSON (sqlstate, message, detail, hint) instead of raised';
-- It grants nothing backfill_start() does not: it runs as its caller, who needs EXECUTE on that.
REVOKE EXECUTE ON FUNCTION backfill.start_on_node(regclass[], boolean, integer, integer, name, name, bigint, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION backfill.start_on_node(regclass[], boolean, integer, integer, name, name, bigint, integer) TO PUBLIC;

-- backfill_start() refuses, before anything starts, the options a backfill of a Citus
-- distributed table does not pass on to its nodes (backfill.refuse_node_options(), which the new
-- backfill_start() below calls).
CREATE  FUNCTION backfill."refuse_node_options"(
	"tables" oid[], /* :: std :: option :: Option < Vec < Option < pg_sys :: Oid > > > */
	"keys" jsonb, /* Option < JsonB > */
	"max_replica_lag" bigint, /* Option < i64 > */
	"max_retained_wal" bigint, /* Option < i64 > */
	"max_active_sessions" INT, /* Option < i32 > */
	"rows_per_message" INT /* Option < i32 > */
) RETURNS oid[] /* :: std :: option :: Option < Vec < Option < pg_sys :: Oid > > > */
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'refuse_node_options_wrapper';
-- (Revoked, then granted: the privileges of a fresh install, in its order. Executable by all: it
-- only refuses options or returns the tables it is given, and an operator granted the schema's
-- functions before it existed keeps starting backfills.)
REVOKE EXECUTE ON FUNCTION backfill.refuse_node_options(oid[], jsonb, bigint, bigint, integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION backfill.refuse_node_options(oid[], jsonb, bigint, bigint, integer, integer) TO PUBLIC;
COMMENT ON FUNCTION backfill.refuse_node_options(oid[], jsonb, bigint, bigint, integer, integer) IS 'Part of backfill_start(): refuses the options a backfill of a Citus distributed table does not pass on to its nodes; returns the tables';

-- backfill_start() gains rows_per_message. The old signatures go (a new trailing argument makes
-- a new function): they are kept aside under other names until their grants are copied.
ALTER FUNCTION backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb) RENAME TO backfill_start_0_6_0;
ALTER FUNCTION backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb) RENAME TO backfill_start_0_6_0;
ALTER FUNCTION backfill_start(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb) RENAME TO backfill_start_0_6_0;

CREATE  FUNCTION backfill."set_rows_per_message"(
	"id" bigint, /* Option < i64 > */
	"rows_per_message" INT /* Option < i32 > */
) RETURNS bigint /* Option < i64 > */
 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'set_rows_per_message_wrapper';
COMMENT ON FUNCTION backfill.set_rows_per_message(bigint, integer) IS 'Entry point of backfill_start()''s rows_per_message; returns the backfill''s id';

CREATE FUNCTION backfill_start(tables regclass[], confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL,
                               parallel integer DEFAULT 1, max_replica_lag bigint DEFAULT NULL,
                               max_retained_wal bigint DEFAULT NULL, max_active_sessions integer DEFAULT NULL,
                               keys jsonb DEFAULT NULL, rows_per_message integer DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.set_keys(backfill.set_source_limits(backfill.set_rows_per_message(backfill.start(
         backfill.refuse_node_options(tables::oid[], keys, max_replica_lag, max_retained_wal, max_active_sessions, rows_per_message),
         confirm, batch_size, rows_per_second, slot::text, publication::text, max_lag, parallel), rows_per_message),
                                       max_replica_lag, max_retained_wal, max_active_sessions), keys) $$;
COMMENT ON FUNCTION backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer) IS
'Starts a backfill of the tables (all or nothing) and returns its id. Without confirm => true it starts nothing and reports the estimate. keys => a JSON array of key objects: only those keys of the one table, each read or, without a row, delivered absent. rows_per_message => N: each page''s rows in reads messages of up to N rows (NULL: backfill.rows_per_message).';

CREATE FUNCTION backfill_start(table_name regclass, confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL,
                               parallel integer DEFAULT 1, max_replica_lag bigint DEFAULT NULL,
                               max_retained_wal bigint DEFAULT NULL, max_active_sessions integer DEFAULT NULL,
                               keys jsonb DEFAULT NULL, rows_per_message integer DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.set_keys(backfill.set_source_limits(backfill.set_rows_per_message(backfill.start(
         backfill.refuse_node_options(ARRAY[table_name]::oid[], keys, max_replica_lag, max_retained_wal, max_active_sessions, rows_per_message),
         confirm, batch_size, rows_per_second, slot::text, publication::text, max_lag, parallel), rows_per_message),
                                       max_replica_lag, max_retained_wal, max_active_sessions), keys) $$;
COMMENT ON FUNCTION backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer) IS 'backfill_start() of one table';

-- See backfill_estimate(text): makes backfill_start('public.orders', confirm => true) resolve.
CREATE FUNCTION backfill_start(table_name text, confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL,
                               parallel integer DEFAULT 1, max_replica_lag bigint DEFAULT NULL,
                               max_retained_wal bigint DEFAULT NULL, max_active_sessions integer DEFAULT NULL,
                               keys jsonb DEFAULT NULL, rows_per_message integer DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.set_keys(backfill.set_source_limits(backfill.set_rows_per_message(backfill.start(
         backfill.refuse_node_options(ARRAY[table_name::regclass]::oid[], keys, max_replica_lag, max_retained_wal, max_active_sessions, rows_per_message),
         confirm, batch_size, rows_per_second, slot::text, publication::text, max_lag, parallel), rows_per_message),
                                       max_replica_lag, max_retained_wal, max_active_sessions), keys) $$;
COMMENT ON FUNCTION backfill_start(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer) IS 'backfill_start() of one table, by name';

REVOKE EXECUTE ON FUNCTION
    backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer),
    backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer),
    backfill_start(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer),
    backfill.set_rows_per_message(bigint, integer)
  FROM PUBLIC;

-- Who could execute the old backfill_start() may execute the new one, and who could execute
-- backfill.start() its new entry point. (Every operator and function is pg_catalog's: this runs
-- as a superuser, with the extension's schema, which other roles may be able to create objects
-- in, on the path.)
DO $$
DECLARE
    kept record;
BEGIN
    FOR kept IN
        SELECT DISTINCT g.successor, a.grantee, r.rolname, a.is_grantable
          FROM (VALUES ('backfill_start_0_6_0(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb)', 'backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer)'),
                       ('backfill_start_0_6_0(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb)', 'backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer)'),
                       ('backfill_start_0_6_0(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb)', 'backfill_start(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer)'),
                       ('backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer)', 'backfill.set_rows_per_message(bigint, integer)'))
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
DROP FUNCTION backfill_start_0_6_0(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb);
DROP FUNCTION backfill_start_0_6_0(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb);
DROP FUNCTION backfill_start_0_6_0(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb);
