-- pg_backfill 0.2.0 -> 0.3.0:
-- - A subscription of a FOR ALL TABLES publication discards the state tables' rows (replica triggers).
-- - Pages lock the table in SHARE mode instead of their rows when nobody writes it
--   (backfill.lock_mode: auto, rows, table); backfill_tables counts the pages of each path.
-- - Waiting for the slot's consumer is no longer 'paused' with a 'waiting...' pause_reason: the
--   backfill stays running, and backfill_status.waiting_for says what it waits for.
-- What changed for a DBA: CHANGELOG.md, section 0.3.0.
\echo Use "ALTER EXTENSION pg_backfill UPDATE TO '0.3.0'" to load this file. \quit

-- The state tables first, and in the order a worker's page takes them (job, then job_table):
-- a script that took job_table first and then altered job would deadlock with a running page.
LOCK TABLE backfill.job, backfill.job_table IN ACCESS EXCLUSIVE MODE;

-- A FOR ALL TABLES publication publishes these tables too: a native subscriber applies their
-- rows into tables of the same names, or stops ("relation backfill.job does not exist"). A
-- subscriber with the extension installed has the tables, and these triggers, which fire only
-- in a subscription's apply worker (session_replication_role = replica), discard the
-- publisher's rows there: the subscriber's backfills, ids and keys stay its own.
CREATE FUNCTION backfill.discard_replicated_row() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$ BEGIN RETURN NULL; END $$;
COMMENT ON FUNCTION backfill.discard_replicated_row() IS 'Trigger that discards the rows a subscription applies to pg_backfill''s state tables (replica triggers only)';
REVOKE ALL ON FUNCTION backfill.discard_replicated_row() FROM PUBLIC;
DO $$
DECLARE
    state_table text;
BEGIN
    FOREACH state_table IN ARRAY ARRAY['job', 'job_table', 'job_progress', 'message_key'] LOOP
        EXECUTE pg_catalog.format(
            'CREATE TRIGGER discard_replicated_row BEFORE INSERT OR UPDATE OR DELETE ON backfill.%I
                 FOR EACH ROW EXECUTE FUNCTION backfill.discard_replicated_row()', state_table);
        EXECUTE pg_catalog.format('ALTER TABLE backfill.%I ENABLE REPLICA TRIGGER discard_replicated_row', state_table);
    END LOOP;
END
$$;

-- A backfill that 0.2.0 paused while it waited for its consumer is running, as 0.3.0 has it.
-- (Its workers, if they still run 0.2.0's code, set and clear that pause themselves as before.)
UPDATE backfill.job SET state = 'running', pause_reason = NULL
 WHERE state = 'paused' AND pause_reason LIKE 'waiting%';
COMMENT ON COLUMN backfill.job.state IS 'running (also while it waits for its slot''s consumer), paused (by backfill_pause), done, cancelled or failed';
COMMENT ON COLUMN backfill.job.pause_reason IS 'Why a paused backfill is paused: by backfill_pause()';
COMMENT ON COLUMN backfill_status.state IS 'running (waiting_for says if it waits, and for what), paused (by backfill_pause), done, cancelled or failed';
COMMENT ON COLUMN backfill_status.pause_reason IS 'Why it is paused: by backfill_pause()';
COMMENT ON COLUMN backfill_status.waiting_for IS 'What a running backfill''s workers wait for now, if anything: a row lock held by another process (its pid), or the slot''s consumer (none connected, or lagging past max_lag_bytes)';
COMMENT ON FUNCTION backfill.waiting_for(bigint) IS 'What the workers of a backfill wait for now (a row lock held by a pid, or the slot''s consumer), or NULL';

-- Lock modes (see src/lock.rs): recorded per backfill, and pages counted by path. Columns go
-- last, as a fresh install has them; the views gain theirs at the end.
ALTER TABLE backfill.job ADD COLUMN lock_mode text NOT NULL DEFAULT 'auto'
    CHECK (lock_mode IN ('auto', 'rows', 'table'));
ALTER TABLE backfill.job_table ADD COLUMN pages_table_locked bigint NOT NULL DEFAULT 0;
ALTER TABLE backfill.job_table ADD COLUMN pages_row_locked bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN backfill.job.lock_mode IS 'How its pages lock what they read: auto (the table when no writer is at it, else the rows), rows or table (backfill.lock_mode when it started)';
COMMENT ON COLUMN backfill.job_table.pages_table_locked IS 'Pages that held the table in SHARE mode (no row locks written)';
COMMENT ON COLUMN backfill.job_table.pages_row_locked IS 'Pages that locked their rows FOR SHARE';
CREATE OR REPLACE VIEW backfill_status WITH (security_barrier) AS
SELECT j.id,
       j.state,
       j.pause_reason,
       t.tables,
       t.current_table,
       CASE WHEN v.readable THEN t.rows_done END AS rows_done,
       CASE WHEN v.readable THEN t.rows_estimated END AS rows_estimated,
       CASE WHEN NOT v.readable THEN NULL
            WHEN j.state = 'done' THEN 100.0 ELSE round((100 * t.fraction_done)::numeric, 1) END AS percent_done,
       CASE WHEN v.readable THEN r.rows_per_second END AS rows_per_second_last_minute,
       CASE WHEN v.readable AND j.state = 'running' AND r.rows_per_second > 0
            THEN make_interval(secs => round(((1 - t.fraction_done) * t.rows_estimated / r.rows_per_second)::numeric))
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
       j.lock_mode
  FROM backfill.job j
 CROSS JOIN LATERAL (
        SELECT array_agg(jt.relid ORDER BY jt.position) AS tables,
               (array_agg(jt.relid ORDER BY jt.position) FILTER (WHERE jt.state = 'running'))[1] AS current_table,
               sum(jt.rows_done)::bigint AS rows_done,
               sum(jt.rows_estimated)::bigint AS rows_estimated,
               coalesce(sum(jt.rows_estimated * CASE jt.state WHEN 'done' THEN 1
                                                              WHEN 'pending' THEN 0
                                                              ELSE coalesce(jt.key_fraction_done,
                                                                            least(1, jt.rows_done::float8 / nullif(jt.rows_estimated, 0)), 0)
                                                 END) / nullif(sum(jt.rows_estimated), 0), 0) AS fraction_done,
               bool_and(coalesce(pg_catalog.has_table_privilege(jt.relid, 'SELECT'), false)) AS all_selectable
          FROM backfill.job_table jt
         WHERE jt.job_id = j.id) t
 CROSS JOIN LATERAL (SELECT pg_catalog.pg_has_role('pg_monitor', 'MEMBER') OR t.all_selectable AS readable) v
  LEFT JOIN LATERAL (
        SELECT ((max(p.rows_done) - min(p.rows_done)) / nullif(extract(epoch FROM max(p.at) - min(p.at)), 0))::bigint
               AS rows_per_second
          FROM backfill.job_progress p
         WHERE p.job_id = j.id AND p.at > pg_catalog.clock_timestamp() - interval '1 minute') r ON true
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
 CROSS JOIN LATERAL (SELECT pg_catalog.pg_has_role('pg_monitor', 'MEMBER')
                            OR coalesce(pg_catalog.has_table_privilege(jt.relid, 'SELECT'), false) AS readable) v
 WHERE backfill.visible(j.started_by);
COMMENT ON COLUMN backfill_status.lock_mode IS 'How its pages lock what they read: auto, rows or table (backfill.lock_mode when it started)';
COMMENT ON COLUMN backfill_tables.pages_table_locked IS 'Pages that held the table in SHARE mode, writing nothing to its rows';
COMMENT ON COLUMN backfill_tables.pages_row_locked IS 'Pages that locked their rows FOR SHARE';
