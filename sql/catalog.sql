-- pg_backfill state. The internal tables live in schema "backfill" and are written only by the
-- extension's functions and workers; users read the views backfill_status and backfill_tables.

CREATE SCHEMA backfill;
COMMENT ON SCHEMA backfill IS 'pg_backfill internal state; read it through the backfill_status and backfill_tables views';
-- Entry points live here. The state tables can be read by all (the views show the same), but
-- only the extension's functions, acting as the extension's owner, write them.
GRANT USAGE ON SCHEMA backfill TO PUBLIC;

CREATE TABLE backfill.job (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    state               text NOT NULL DEFAULT 'running'
                        CHECK (state IN ('running', 'paused', 'done', 'cancelled', 'failed')),
    started_by          name NOT NULL,
    batch_size          integer NOT NULL CHECK (batch_size > 0),
    rows_per_second     integer CHECK (rows_per_second > 0),
    message_prefix      text NOT NULL,
    slot_name           name,
    publication_name    name,
    max_lag_bytes       bigint CHECK (max_lag_bytes > 0),
    pause_reason        text,
    watermark_lsn       pg_lsn,
    worker_pid          integer,
    started_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    launched_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at         timestamptz,
    last_error_sqlstate text,
    last_error          text
);
COMMENT ON TABLE backfill.job IS 'One row per backfill started with backfill_start()';
COMMENT ON COLUMN backfill.job.id IS 'Backfill id, returned by backfill_start() and carried in every message';
COMMENT ON COLUMN backfill.job.state IS 'running, paused, done, cancelled or failed';
COMMENT ON COLUMN backfill.job.started_by IS 'Role that called backfill_start(); it or a member of it may cancel';
COMMENT ON COLUMN backfill.job.batch_size IS 'Rows per page (one page is one transaction)';
COMMENT ON COLUMN backfill.job.rows_per_second IS 'Pacing: most rows delivered per second, on average over a few seconds; NULL for no limit';
COMMENT ON COLUMN backfill.job.message_prefix IS 'Prefix of the logical decoding messages of this backfill';
COMMENT ON COLUMN backfill.job.slot_name IS 'Logical replication slot of the consumer the backfill is for, if given';
COMMENT ON COLUMN backfill.job.publication_name IS 'Publication of that consumer, if given: every table is in it';
COMMENT ON COLUMN backfill.job.max_lag_bytes IS 'Back-pressure: the backfill waits while the slot lags more than this (NULL: backfill.max_slot_lag)';
COMMENT ON COLUMN backfill.job.pause_reason IS 'Why a paused backfill is paused: by backfill_pause(), or waiting for the slot''s consumer';
COMMENT ON COLUMN backfill.job.watermark_lsn IS 'WAL position after the last page: the stream holds every read once its consumer confirms past it';
COMMENT ON COLUMN backfill.job.worker_pid IS 'Process id of the background worker while one runs';
COMMENT ON COLUMN backfill.job.started_at IS 'When backfill_start() was called';
COMMENT ON COLUMN backfill.job.launched_at IS 'When its worker was last launched by backfill_start() or backfill_resume()';
COMMENT ON COLUMN backfill.job.finished_at IS 'When the backfill reached done, cancelled or failed (cleared by backfill_resume)';
COMMENT ON COLUMN backfill.job.last_error_sqlstate IS 'SQLSTATE of the error that failed the backfill';
COMMENT ON COLUMN backfill.job.last_error IS 'Message, detail and place of the error that failed the backfill';

CREATE TABLE backfill.job_table (
    job_id          bigint NOT NULL REFERENCES backfill.job (id) ON DELETE CASCADE,
    position        integer NOT NULL,
    relid           regclass NOT NULL,
    key_columns     name[] NOT NULL,
    state           text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'running', 'done')),
    upper_bound     text[],
    cursor          text[],
    rows_estimated  bigint NOT NULL,
    rows_done       bigint NOT NULL DEFAULT 0,
    bytes_done      bigint NOT NULL DEFAULT 0,
    key_fraction_done float8,
    last_page_lsn   pg_lsn,
    started_at      timestamptz,
    finished_at     timestamptz,
    PRIMARY KEY (job_id, position)
);
CREATE INDEX ON backfill.job_table (relid);
COMMENT ON TABLE backfill.job_table IS 'One row per table of each backfill: its scan state and cursor';
COMMENT ON COLUMN backfill.job_table.position IS 'Order in which the backfill scans its tables';
COMMENT ON COLUMN backfill.job_table.relid IS 'The table';
COMMENT ON COLUMN backfill.job_table.key_columns IS 'Columns of the primary key or replica identity index the scan is ordered by';
COMMENT ON COLUMN backfill.job_table.state IS 'pending (not started), running (scan under way) or done (end marker sent)';
COMMENT ON COLUMN backfill.job_table.upper_bound IS 'Greatest key when the scan started (text form); rows inserted above it arrive through the stream';
COMMENT ON COLUMN backfill.job_table.cursor IS 'Last key delivered (text form), committed with the messages of its page';
COMMENT ON COLUMN backfill.job_table.rows_estimated IS 'Planner estimate of the rows when the backfill started';
COMMENT ON COLUMN backfill.job_table.rows_done IS 'Read messages delivered';
COMMENT ON COLUMN backfill.job_table.bytes_done IS 'Bytes of read message payload delivered';
COMMENT ON COLUMN backfill.job_table.key_fraction_done IS 'Share of the key range up to the upper bound already scanned, from the key''s histogram in pg_stats';
COMMENT ON COLUMN backfill.job_table.last_page_lsn IS 'WAL position at the end of the table''s last delivered page; its commit record follows';
COMMENT ON COLUMN backfill.job_table.started_at IS 'When the scan started (upper bound fixed, start marker sent)';
COMMENT ON COLUMN backfill.job_table.finished_at IS 'When the scan ended (end marker sent)';

CREATE TABLE backfill.job_progress (
    job_id    bigint NOT NULL REFERENCES backfill.job (id) ON DELETE CASCADE,
    at        timestamptz NOT NULL,
    rows_done bigint NOT NULL,
    PRIMARY KEY (job_id, at)
);
COMMENT ON TABLE backfill.job_progress IS 'Progress samples of running backfills (the last two minutes), for their recent rate';

-- Keep the state in pg_dump output, like pg_cron does for its jobs.
SELECT pg_catalog.pg_extension_config_dump('backfill.job', '');
SELECT pg_catalog.pg_extension_config_dump('backfill.job_table', '');
SELECT pg_catalog.pg_extension_config_dump('backfill.job_progress', '');

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
       j.batch_size,
       j.rows_per_second,
       coalesce(j.max_lag_bytes, (SELECT setting::bigint * 1024 FROM pg_catalog.pg_settings
                                  WHERE name = 'backfill.max_slot_lag')) AS max_lag_bytes,
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
COMMENT ON COLUMN backfill_tables.cursor IS 'Last key delivered; the scan resumes after it';
COMMENT ON COLUMN backfill_tables.upper_bound IS 'Greatest key when the scan started; rows inserted later arrive through the stream';
COMMENT ON COLUMN backfill_tables.bytes_done IS 'Bytes of message payload delivered';

GRANT SELECT ON backfill.job, backfill.job_table, backfill.job_progress, backfill_status, backfill_tables TO PUBLIC;
