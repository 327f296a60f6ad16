-- pg_backfill 0.7.0 -> 0.8.0
\echo Use "ALTER EXTENSION pg_backfill UPDATE TO '0.8.0'" to load this file. \quit

-- (As every update script: the state tables first, in the order a worker's page takes them.)
LOCK TABLE backfill.job, backfill.job_table IN ACCESS EXCLUSIVE MODE;

-- Progress that agrees with itself: percent_done and time_left from rows_done against the rows
-- expected (rows_estimated), no longer from key-range histograms.
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
       j.rows_per_message
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
