-- The public SQL surface: functions with regclass arguments and named defaults, so that calls
-- read well in psql and in migration scripts (each calls its entry point in schema backfill),
-- and the monitoring views.

CREATE FUNCTION backfill_estimate(tables regclass[], batch_size integer DEFAULT 1000)
RETURNS TABLE (table_name regclass, eligible boolean, reason text, key_columns name[],
               rows_estimated bigint, bytes_estimated bigint, pages bigint)
LANGUAGE sql VOLATILE
AS $$ SELECT e.table_name::regclass, e.eligible, e.reason, e.key_columns::name[],
             e.rows_estimated, e.bytes_estimated, e.pages
        FROM backfill.estimate(tables::oid[], batch_size) e $$;
COMMENT ON FUNCTION backfill_estimate(regclass[], integer) IS
'For each table: whether it can be backfilled (and why not), its key, and the rows, message bytes and pages a backfill would deliver. Uses statistics and a small sample, never a full scan.';

CREATE FUNCTION backfill_estimate(table_name regclass, batch_size integer DEFAULT 1000)
RETURNS TABLE (table_name regclass, eligible boolean, reason text, key_columns name[],
               rows_estimated bigint, bytes_estimated bigint, pages bigint)
LANGUAGE sql VOLATILE
AS $$ SELECT * FROM backfill_estimate(ARRAY[table_name], batch_size) $$;
COMMENT ON FUNCTION backfill_estimate(regclass, integer) IS 'backfill_estimate() of one table';

-- A quoted table name is of unknown type, which regclass and regclass[] would both accept:
-- this form takes it, so that backfill_estimate('public.orders') just works.
CREATE FUNCTION backfill_estimate(table_name text, batch_size integer DEFAULT 1000)
RETURNS TABLE (table_name regclass, eligible boolean, reason text, key_columns name[],
               rows_estimated bigint, bytes_estimated bigint, pages bigint)
LANGUAGE sql VOLATILE
AS $$ SELECT * FROM backfill_estimate(ARRAY[table_name::regclass], batch_size) $$;
COMMENT ON FUNCTION backfill_estimate(text, integer) IS 'backfill_estimate() of one table, by name';

CREATE FUNCTION backfill_start(tables regclass[], confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL,
                               parallel integer DEFAULT 1)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.start(tables::oid[], confirm, batch_size, rows_per_second, slot::text, publication::text, max_lag, parallel) $$;
COMMENT ON FUNCTION backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer) IS
'Starts a backfill of the tables (all or nothing) and returns its id. Without confirm => true it starts nothing and reports the estimate.';

CREATE FUNCTION backfill_start(table_name regclass, confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL,
                               parallel integer DEFAULT 1)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.start(ARRAY[table_name]::oid[], confirm, batch_size, rows_per_second, slot::text, publication::text, max_lag, parallel) $$;
COMMENT ON FUNCTION backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer) IS 'backfill_start() of one table';

-- See backfill_estimate(text): makes backfill_start('public.orders', confirm => true) resolve.
CREATE FUNCTION backfill_start(table_name text, confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL,
                               parallel integer DEFAULT 1)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.start(ARRAY[table_name::regclass]::oid[], confirm, batch_size, rows_per_second, slot::text, publication::text, max_lag, parallel) $$;
COMMENT ON FUNCTION backfill_start(text, boolean, integer, integer, name, name, bigint, integer) IS 'backfill_start() of one table, by name';

CREATE FUNCTION backfill_cancel(id bigint)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.cancel(id) $$;
COMMENT ON FUNCTION backfill_cancel(bigint) IS
'Stops a running backfill at its next page; what it delivered stays delivered, its state becomes cancelled.';

CREATE FUNCTION backfill_pause(id bigint)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.pause(id) $$;
COMMENT ON FUNCTION backfill_pause(bigint) IS
'Pauses a running backfill at its next page: its worker exits, holding no lock and no transaction. backfill_resume() continues it.';

CREATE FUNCTION backfill_resume(id bigint)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.resume(id) $$;
COMMENT ON FUNCTION backfill_resume(bigint) IS
'Continues a paused or failed backfill from its cursor, with a new worker.';

CREATE FUNCTION backfill_set(id bigint, batch_size integer DEFAULT NULL, rows_per_second integer DEFAULT NULL,
                             max_lag bigint DEFAULT NULL)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.set(id, batch_size, rows_per_second, max_lag) $$;
COMMENT ON FUNCTION backfill_set(bigint, integer, integer, bigint) IS
'Changes the pacing of a running or paused backfill (applied at its next page). NULL keeps a value; 0 removes a limit.';

CREATE FUNCTION backfill_wait(id bigint, timeout interval DEFAULT NULL)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.wait(id, extract(epoch FROM timeout)::float8 * 1000) $$;
COMMENT ON FUNCTION backfill_wait(bigint, interval) IS
'Waits until the backfill is done and, with a slot, delivered (true) or the timeout passes (false); an error if it fails or is cancelled.';

CREATE VIEW backfill_status AS
SELECT j.id,
       j.state,
       j.pause_reason,
       t.tables,
       t.current_table,
       t.rows_done,
       t.rows_estimated,
       CASE WHEN j.state = 'done' THEN 100.0 ELSE round((100 * t.fraction_done)::numeric, 1) END AS percent_done,
       r.rows_per_second AS rows_per_second_last_minute,
       CASE WHEN j.state = 'running' AND r.rows_per_second > 0
            THEN make_interval(secs => round(((1 - t.fraction_done) * t.rows_estimated / r.rows_per_second)::numeric))
       END AS time_left,
       j.slot_name,
       pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint AS slot_lag_bytes,
       j.watermark_lsn,
       j.state = 'done' AND (j.slot_name IS NULL OR s.confirmed_flush_lsn >= j.watermark_lsn) AS delivered,
       a.pid AS worker_pid,
       (SELECT count(*) FROM pg_catalog.pg_stat_activity w
         WHERE w.backend_type = 'pg_backfill' AND split_part(w.application_name, '/', 1) = 'pg_backfill ' || j.id)::integer
         AS workers_running,
       j.parallel,
       j.batch_size,
       j.rows_per_second,
       CASE WHEN j.slot_name IS NOT NULL THEN coalesce(j.max_lag_bytes, backfill.max_slot_lag_bytes()) END AS max_lag_bytes,
       j.publication_name,
       j.message_prefix,
       pg_catalog.current_setting('shared_preload_libraries') ~ '(^|[ ,])pg_backfill($|[ ,])' AS auto_resume,
       j.started_by,
       j.started_at,
       j.finished_at,
       j.last_error_sqlstate,
       j.last_error
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
                                                 END) / nullif(sum(jt.rows_estimated), 0), 0) AS fraction_done
          FROM backfill.job_table jt
         WHERE jt.job_id = j.id) t
  LEFT JOIN LATERAL (
        SELECT ((max(p.rows_done) - min(p.rows_done)) / nullif(extract(epoch FROM max(p.at) - min(p.at)), 0))::bigint
               AS rows_per_second
          FROM backfill.job_progress p
         WHERE p.job_id = j.id AND p.at > pg_catalog.clock_timestamp() - interval '1 minute') r ON true
  LEFT JOIN pg_catalog.pg_replication_slots s ON s.slot_name = j.slot_name
  LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = j.worker_pid AND j.state IN ('running', 'paused');
COMMENT ON VIEW backfill_status IS 'One row per backfill: state, progress, who started it and why it failed';
COMMENT ON COLUMN backfill_status.state IS 'running, paused, done, cancelled or failed';
COMMENT ON COLUMN backfill_status.pause_reason IS 'Why it is paused: by backfill_pause(), or waiting for the slot''s consumer (inactive, or lagging past max_lag_bytes)';
COMMENT ON COLUMN backfill_status.rows_per_second_last_minute IS 'Delivery rate over the last minute';
COMMENT ON COLUMN backfill_status.time_left IS 'Estimated from the share of the key range still to scan and the last minute''s rate';
COMMENT ON COLUMN backfill_status.slot_lag_bytes IS 'WAL the slot''s consumer has not confirmed yet';
COMMENT ON COLUMN backfill_status.watermark_lsn IS 'WAL position after the last page';
COMMENT ON COLUMN backfill_status.delivered IS 'Done, and (with a slot) its consumer has confirmed past the watermark';
COMMENT ON COLUMN backfill_status.auto_resume IS 'Whether pg_backfill is in shared_preload_libraries, so that running backfills resume after a server restart';
COMMENT ON COLUMN backfill_status.tables IS 'Tables of the backfill, in scan order';
COMMENT ON COLUMN backfill_status.current_table IS 'Table being scanned now';
COMMENT ON COLUMN backfill_status.rows_done IS 'Read messages delivered so far';
COMMENT ON COLUMN backfill_status.rows_estimated IS 'Planner estimate of the rows when the backfill started';
COMMENT ON COLUMN backfill_status.percent_done IS 'Share of the key ranges scanned (from pg_stats histograms; rows against the estimate without them); 100 once done';
COMMENT ON COLUMN backfill_status.worker_pid IS 'Process id of the running background worker, if any';
COMMENT ON COLUMN backfill_status.last_error_sqlstate IS 'SQLSTATE of the error that failed the backfill';
COMMENT ON COLUMN backfill_status.last_error IS 'Message of the error that failed the backfill, with the table and key';

CREATE VIEW backfill_tables AS
SELECT jt.job_id AS backfill_id,
       jt.position,
       jt.relid AS table_name,
       jt.part,
       CASE WHEN j.state IN ('cancelled', 'failed') AND jt.state <> 'done' THEN j.state
            ELSE jt.state END AS state,
       jt.key_columns,
       jt.cursor,
       jt.upper_bound,
       jt.rows_done,
       jt.rows_estimated,
       jt.bytes_done,
       jt.last_page_lsn,
       jt.started_at,
       jt.finished_at
  FROM backfill.job_table jt
  JOIN backfill.job j ON j.id = jt.job_id;
COMMENT ON VIEW backfill_tables IS 'One row per table of each backfill: scan state, cursor and counters';
COMMENT ON COLUMN backfill_tables.state IS 'pending, running, done; or the backfill''s cancelled/failed for a table it did not finish';
COMMENT ON COLUMN backfill_tables.part IS 'Key range of the table (with parallel workers; 0 otherwise)';
COMMENT ON COLUMN backfill_tables.cursor IS 'Last key delivered; the scan resumes after it';
COMMENT ON COLUMN backfill_tables.upper_bound IS 'Greatest key when the scan started; rows inserted later arrive through the stream';
COMMENT ON COLUMN backfill_tables.bytes_done IS 'Bytes of message payload delivered';

GRANT SELECT ON backfill_status, backfill_tables TO PUBLIC;
