-- pg_backfill 0.10.0 -> 0.11.0. What changed for a DBA: CHANGELOG.md, section 0.11.0.
\echo Use "ALTER EXTENSION pg_backfill UPDATE TO '0.11.0'" to load this file. \quit

-- Follows: a statement that may add tables to a followed publication only queues them (under
-- the follow's lock), as the extension's owner; a dispatcher worker starts them once the
-- statement's transaction commits. The event trigger calls into the library only while a follow
-- is live, and needs no grant of any role's; CREATE SCHEMA, which can create tables, is seen.
CREATE OR REPLACE FUNCTION backfill.follow_publication_changes()
RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ BEGIN
    IF EXISTS (SELECT FROM backfill.follow WHERE ended_at IS NULL) THEN
        PERFORM backfill.follow_ddl(TG_TAG);
    END IF;
END $$;
COMMENT ON FUNCTION backfill.follow_publication_changes() IS 'Event trigger: queues the tables a statement added to a followed publication; a dispatcher starts them once the statement commits';
DROP EVENT TRIGGER backfill_follow_publication_changes;
CREATE EVENT TRIGGER backfill_follow_publication_changes ON ddl_command_end
    WHEN TAG IN ('ALTER PUBLICATION', 'DROP PUBLICATION', 'ALTER TABLE', 'CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO',
                 'DROP TABLE', 'CREATE SCHEMA')
    EXECUTE FUNCTION backfill.follow_publication_changes();
CREATE FUNCTION backfill.follow_ddl(command_tag text) RETURNS void
LANGUAGE c AS 'MODULE_PATHNAME', 'follow_ddl_of_wrapper';
COMMENT ON FUNCTION backfill.follow_ddl(text) IS 'The event trigger''s work at the end of a statement (its command tag) that may have changed a followed publication''s tables';
REVOKE EXECUTE ON FUNCTION backfill.follow_ddl(text) FROM PUBLIC;

-- ===== The entry points of earlier versions' SQL =====
-- The library still serves each of them (src/api/old_sql.rs), for a database whose SQL is not yet
-- updated. An updated database calls none of them, and a fresh install declares none: dropped.
-- (The older signatures of backfill.start() could each start a backfill; none is left behind.)
DROP FUNCTION backfill.follow_ddl(),
              backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer),
              backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer, text),
              backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer, text, text[]),
              backfill.estimate(oid[], integer),
              backfill.estimate(oid[], integer, text),
              backfill.set(bigint, integer, integer, bigint),
              backfill.set_source_limits(bigint, bigint, bigint, integer),
              backfill.set_keys(bigint, jsonb),
              backfill.set_rows_per_message(bigint, integer),
              backfill.refuse_node_options(oid[], jsonb, bigint, bigint, integer, integer),
              backfill.compare(oid, oid, text, integer, text),
              backfill.repair(oid, oid, boolean, text, integer, text, integer);

-- ===== Slots of this database, and backfill_message_valid() over a peek's xid =====
-- (The settings a start records became superuser settings in the library: nothing here. Values
-- set per database or role before stay in force: docs/security.md says how to list them.)
--
-- A replication slot is looked up as a slot of this database: slot names are the cluster's, and
-- once a backfill's (or a follow's) slot is dropped another database may make one of that name,
-- which decodes none of this database's messages. backfill_status (slot_lag_bytes, delivered) and
-- backfill_follows (state) join pg_replication_slots on the database as well as the name.
CREATE OR REPLACE VIEW backfill_status WITH (security_barrier) AS
SELECT j.id,
       j.state,
       j.pause_reason,
       t.tables,
       t.current_table,
       CASE WHEN v.countable THEN t.rows_done END AS rows_done,
       CASE WHEN v.countable THEN t.rows_expected END AS rows_estimated,
       -- Progress is rows_done against rows_estimated, the one definition of both (docs/reference.md
       -- #progress): truncated, never rounded up, and below 100 until the backfill is done.
       CASE WHEN NOT v.countable THEN NULL
            WHEN j.state = 'done' THEN 100.0
            ELSE least(99.9, pg_catalog.trunc((100 OPERATOR(pg_catalog.*) t.rows_done)::numeric
                                              OPERATOR(pg_catalog./) nullif(t.rows_expected, 0), 1)) END AS percent_done,
       CASE WHEN v.countable THEN r.rows_per_second END AS rows_per_second_last_minute,
       -- At the rate of the last 10 seconds, where there is one: a slow start (a worker's first
       -- page) or a changed rate would drag the minute's average for a minute.
       CASE WHEN v.countable AND j.state = 'running' AND coalesce(r.recent_rows_per_second, r.rows_per_second) OPERATOR(pg_catalog.>) 0
            THEN pg_catalog.make_interval(secs => pg_catalog.round((t.rows_expected OPERATOR(pg_catalog.-) t.rows_done)::numeric
                                                                   OPERATOR(pg_catalog./) coalesce(r.recent_rows_per_second, r.rows_per_second)))
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
       CASE WHEN v.countable THEN j.last_error_sqlstate END AS last_error_sqlstate,
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
 CROSS JOIN LATERAL (SELECT r.readable, backfill.may_act_as(CURRENT_USER, 'pg_monitor') OR r.readable AS countable
                       FROM (SELECT t.all_selectable OR coalesce((SELECT u.rolsuper FROM pg_catalog.pg_roles u WHERE u.rolname OPERATOR(pg_catalog.=) CURRENT_USER), false) AS readable) r) v
  LEFT JOIN LATERAL (
        SELECT ((pg_catalog.max(p.rows_done) OPERATOR(pg_catalog.-) pg_catalog.min(p.rows_done))
                OPERATOR(pg_catalog./) nullif(extract(epoch FROM pg_catalog.max(p.at) OPERATOR(pg_catalog.-) pg_catalog.min(p.at)), 0))::bigint
               AS rows_per_second,
               ((pg_catalog.max(p.rows_done) FILTER (WHERE p.at OPERATOR(pg_catalog.>) (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) interval '10 seconds'))
                 OPERATOR(pg_catalog.-) pg_catalog.min(p.rows_done) FILTER (WHERE p.at OPERATOR(pg_catalog.>) (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) interval '10 seconds')))
                OPERATOR(pg_catalog./) nullif(extract(epoch FROM pg_catalog.max(p.at) FILTER (WHERE p.at OPERATOR(pg_catalog.>) (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) interval '10 seconds'))
                                                 OPERATOR(pg_catalog.-) pg_catalog.min(p.at) FILTER (WHERE p.at OPERATOR(pg_catalog.>) (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) interval '10 seconds'))), 0))::bigint
               AS recent_rows_per_second
          FROM backfill.job_progress p
         WHERE p.job_id = j.id AND p.at OPERATOR(pg_catalog.>) (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) interval '1 minute')) r ON true
  LEFT JOIN pg_catalog.pg_replication_slots s ON s.slot_name = j.slot_name AND s.database = pg_catalog.current_database()
  LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = j.worker_pid AND j.state IN ('running', 'paused')
 WHERE backfill.visible(j.started_by);

CREATE OR REPLACE VIEW backfill_follows WITH (security_barrier) AS
SELECT f.id,
       f.publication_name AS publication,
       f.slot_name AS slot,
       CASE WHEN f.ended_at IS NOT NULL THEN 'ended'
            WHEN s.slot_name IS NULL THEN 'slot missing'
            ELSE 'following' END AS state,
       pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object(
           'batch_size', f.batch_size, 'rows_per_second', f.rows_per_second, 'parallel', f.parallel,
           'max_lag', f.max_lag_bytes, 'max_replica_lag', f.max_replica_lag_bytes,
           'max_retained_wal', f.max_retained_wal_bytes, 'max_active_sessions', f.max_active_sessions,
           'rows_per_message', f.rows_per_message)) AS options,
       r.rolname AS created_by,
       f.created_at,
       f.last_started_at,
       f.last_backfill_id,
       q.pending_tables,
       f.last_error,
       f.last_error_at,
       f.ended_at,
       f.end_reason
  FROM backfill.follow f
  LEFT JOIN pg_catalog.pg_roles r ON r.oid = f.created_by
  LEFT JOIN pg_catalog.pg_replication_slots s ON s.slot_name = f.slot_name AND s.database = pg_catalog.current_database()
 CROSS JOIN LATERAL (SELECT pg_catalog.array_agg(t.relid::pg_catalog.regclass ORDER BY t.entry) AS pending_tables
                       FROM backfill.follow_table t
                      WHERE t.follow_id = f.id AND t.state = 'pending') q
 WHERE backfill.may_act_as(CURRENT_USER, 'pg_monitor') OR backfill.may_act_as(CURRENT_USER, r.rolname);

-- backfill_message_valid() takes the xid column of pg_logical_slot_peek_changes() as it is.
-- Executable by all, granting nothing: it calls backfill_message_valid(text, bigint), which needs
-- the consumer's grant, so that a consumer granted before 0.11.0 uses it as it is.
CREATE FUNCTION backfill_message_valid(content text, xid pg_catalog.xid)
RETURNS boolean
LANGUAGE sql STABLE
AS $$ SELECT @extschema@.backfill_message_valid(content, xid::pg_catalog.text::pg_catalog.int8) $$;
COMMENT ON FUNCTION backfill_message_valid(text, xid) IS
'backfill_message_valid() with the xid column of pg_logical_slot_peek_changes() as it is (type xid)';

-- Follows: backfill_follow_wait(), since a follow's backfills start once the statement that
-- added their tables commits.
CREATE FUNCTION backfill.follow_wait(publication text, slot text, timeout_ms double precision) RETURNS bigint
LANGUAGE c AS 'MODULE_PATHNAME', 'follow_wait_wrapper';
COMMENT ON FUNCTION backfill.follow_wait(text, text, double precision) IS 'Entry point of backfill_follow_wait() (timeout in milliseconds)';
REVOKE EXECUTE ON FUNCTION backfill.follow_wait(text, text, double precision) FROM PUBLIC;
CREATE FUNCTION backfill_follow_wait(publication name, slot name, timeout interval DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.follow_wait(publication::pg_catalog.text, slot::pg_catalog.text,
                                  extract(epoch FROM timeout)::pg_catalog.float8 OPERATOR(pg_catalog.*) 1000) $$;
COMMENT ON FUNCTION backfill_follow_wait(name, name, interval) IS
'Waits until every table queued for the follow has been started (or skipped, or failed), and returns the follow''s last started backfill (for backfill_wait); an error after the timeout.';
REVOKE EXECUTE ON FUNCTION backfill_follow_wait(name, name, interval) FROM PUBLIC;

-- Starts that no role can block, and the PUBLIC grants of every signature.
-- backfill_security_check() reports PUBLIC's EXECUTE on every signature of backfill.start(),
-- backfill.repair() and backfill.follow(), as pg_proc lists them (0.10.0 looked at one of the
-- four signatures of backfill.start()). The library's changes need nothing else of the schema:
-- its locks are tags no SQL statement can take (src/pg/locks.rs), whatever the version of the SQL.
CREATE OR REPLACE FUNCTION backfill_security_check()
RETURNS TABLE (item text, ok boolean, detail text, fix text)
LANGUAGE sql STABLE
AS $$
-- Whatever signatures the server has: (boolean, text, text) and (boolean, text, bytea), to
-- which PostgreSQL 17 added a fourth argument, flush.
SELECT 'pg_logical_emit_message is not executable by PUBLIC',
       NOT pg_catalog.bool_or(pg_catalog.has_function_privilege('public', p.oid, 'EXECUTE')),
       'Otherwise any role can write a message with pg_backfill''s prefix into every consumer''s stream; only consumers that check each message''s auth tag tell it from a genuine one. The privilege is per database: run the fix in every database, and in template1 for the databases created later.',
       pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC;',
                         pg_catalog.string_agg(pg_catalog.format('pg_catalog.pg_logical_emit_message(%s)', pg_catalog.oidvectortypes(p.proargtypes)),
                                               ', ' ORDER BY p.oid))
  FROM pg_catalog.pg_proc p
 WHERE p.proname OPERATOR(pg_catalog.=) 'pg_logical_emit_message'
   AND p.pronamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace
UNION ALL
SELECT 'the message key is not readable by PUBLIC',
       NOT pg_catalog.has_table_privilege('public', 'backfill.message_key', 'SELECT'),
       'Otherwise any role can read the key, and forge messages that verify.',
       'REVOKE ALL ON backfill.message_key FROM PUBLIC; SELECT backfill_rotate_key(retire_old_keys => true);'
UNION ALL
-- The keys' bytes are in sequences of schema backfill that only their owner may read (a role
-- with SELECT or USAGE on one reads a part of a key; with UPDATE or USAGE it changes it).
SELECT 'pg_backfill''s sequences are accessible to their owner only',
       pg_catalog.count(*) OPERATOR(pg_catalog.=) 0,
       'The message keys are kept in sequences of schema backfill: another role that can read them can forge messages that verify.',
       CASE WHEN pg_catalog.count(*) OPERATOR(pg_catalog.>) 0 THEN
       pg_catalog.format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA backfill FROM %s; SELECT backfill_rotate_key(retire_old_keys => true);',
                         pg_catalog.string_agg(DISTINCT CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC' ELSE a.grantee::pg_catalog.regrole::pg_catalog.text END, ', '))
       END
  FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
 WHERE c.relnamespace OPERATOR(pg_catalog.=) 'backfill'::pg_catalog.regnamespace
   AND c.relkind OPERATOR(pg_catalog.=) 'S' AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
UNION ALL
-- Every signature of every function of schema backfill that starts backfills, as pg_proc lists
-- them: each version's SQL calls its own signature of backfill.start() (or repair()) until ALTER
-- EXTENSION UPDATE, which drops the older ones (until then each can start a backfill).
SELECT 'backfills cannot be started by PUBLIC',
       pg_catalog.count(*) FILTER (WHERE pg_catalog.has_function_privilege('public', p.oid, 'EXECUTE')) OPERATOR(pg_catalog.=) 0,
       'backfill_start(), backfill_repair() and backfill_follow() are wrappers of backfill.start(), backfill.repair() and backfill.follow(), which do the work and check no grant of their own: a role that may execute one of them, in any of its signatures, starts backfills of the tables it may update, and takes background workers, whatever its grants on the wrappers. (The other functions of schema backfill that PUBLIC may execute are the views'' helpers, which start nothing.)',
       CASE WHEN pg_catalog.bool_or(pg_catalog.has_function_privilege('public', p.oid, 'EXECUTE')) THEN
       pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC;',
                         pg_catalog.string_agg(p.oid::pg_catalog.regprocedure::pg_catalog.text, ', '
                                               ORDER BY p.proname OPERATOR(pg_catalog.<>) 'start', p.proname, p.pronargs)
                           FILTER (WHERE pg_catalog.has_function_privilege('public', p.oid, 'EXECUTE')))
       END
  FROM pg_catalog.pg_proc p
 WHERE p.pronamespace OPERATOR(pg_catalog.=) 'backfill'::pg_catalog.regnamespace
   AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['start', 'repair', 'follow']::pg_catalog.name[])
$$;
COMMENT ON FUNCTION backfill_security_check() IS
'Checks the privileges that keep the message stream trustworthy: each row states what should hold, ok says whether it does, and a row that is not ok has the statement that fixes it.';

-- ===== The default backfill rests under load (backfill.default_duty_cycle): what the status says =====
COMMENT ON COLUMN backfill_status.waiting_for IS 'What a running backfill''s workers wait for now, if anything: a row lock held by another process (its pid), the slot''s consumer (none connected, or lagging past max_lag_bytes), a standby replaying past max_replica_lag_bytes, a slot retaining more than max_retained_wal_bytes, or the server''s load: past max_active_sessions (then it slows down rather than waits), or, for a backfill with no pacing option, a busy server (then it rests after each page, backfill.default_duty_cycle)';
COMMENT ON COLUMN backfill_status.waiting_kind IS 'The kind of what a running backfill''s workers wait for now, stable for monitoring: row_lock, consumer_away, consumer_lag, replica_lag, retained_wal or load (then it slows down, or rests after each page, rather than waits); NULL when nothing holds it back';
COMMENT ON FUNCTION backfill.waiting_for(bigint) IS 'What the workers of a backfill wait for now (a row lock held by a pid, the slot''s consumer, the source''s limits or load), or NULL';
