-- The SQL surface of pg_backfill, by subject: starting, controlling a backfill, following a
-- publication, watching (the views), verifying a copy, authenticated messages, Citus, and the
-- extension's guard against its own DROP. The functions take regclass arguments and named
-- defaults, so that calls read well in psql and in migration scripts; each calls its entry point
-- in schema backfill (declared by pgrx from src/). Then, in one closing block, what each entry
-- point is for, and every privilege: what PUBLIC may execute and read (docs/security.md gives
-- the grants for operators and consumers).

-- === Starting: the estimate, and backfill_start() ==================================================

CREATE FUNCTION backfill_estimate(tables regclass[], batch_size integer DEFAULT 1000, filter text DEFAULT NULL,
                                  columns text[] DEFAULT NULL)
RETURNS TABLE (table_name regclass, eligible boolean, reason text, key_columns name[],
               rows_estimated bigint, bytes_estimated bigint, pages bigint)
LANGUAGE sql VOLATILE
AS $$ SELECT e.table_name::pg_catalog.regclass, e.eligible, e.reason, e.key_columns::pg_catalog.name[],
             e.rows_estimated, e.bytes_estimated, e.pages
        FROM backfill.estimate(tables::pg_catalog.oid[], batch_size, filter, columns) e $$;
COMMENT ON FUNCTION backfill_estimate(regclass[], integer, text, text[]) IS
'For each table: whether it can be backfilled (and why not), its key, and the rows, message bytes and pages a backfill would deliver. Uses statistics and a small sample, never a full scan.';

CREATE FUNCTION backfill_estimate(table_name regclass, batch_size integer DEFAULT 1000, filter text DEFAULT NULL,
                                  columns text[] DEFAULT NULL)
RETURNS TABLE (table_name regclass, eligible boolean, reason text, key_columns name[],
               rows_estimated bigint, bytes_estimated bigint, pages bigint)
LANGUAGE sql VOLATILE
AS $$ SELECT * FROM @extschema@.backfill_estimate(ARRAY[table_name], batch_size, filter, columns) $$;
COMMENT ON FUNCTION backfill_estimate(regclass, integer, text, text[]) IS 'backfill_estimate() of one table';

-- A quoted table name is of unknown type, which regclass and regclass[] would both accept:
-- this form takes it, so that backfill_estimate('public.orders') just works.
CREATE FUNCTION backfill_estimate(table_name text, batch_size integer DEFAULT 1000, filter text DEFAULT NULL,
                                  columns text[] DEFAULT NULL)
RETURNS TABLE (table_name regclass, eligible boolean, reason text, key_columns name[],
               rows_estimated bigint, bytes_estimated bigint, pages bigint)
LANGUAGE sql VOLATILE
AS $$ SELECT * FROM @extschema@.backfill_estimate(ARRAY[table_name::pg_catalog.regclass], batch_size, filter, columns) $$;
COMMENT ON FUNCTION backfill_estimate(text, integer, text, text[]) IS 'backfill_estimate() of one table, by name';

CREATE FUNCTION backfill_start(tables regclass[] DEFAULT NULL, confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL,
                               parallel integer DEFAULT 1, max_replica_lag bigint DEFAULT NULL,
                               max_retained_wal bigint DEFAULT NULL, max_active_sessions integer DEFAULT NULL,
                               keys jsonb DEFAULT NULL, rows_per_message integer DEFAULT NULL,
                               filter text DEFAULT NULL, columns text[] DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
-- One call with every option: backfill.start() builds the request, checks it whole, records it
-- and launches its workers (src/api/start.rs).
AS $$ SELECT backfill.start(tables::pg_catalog.oid[], confirm, batch_size, rows_per_second, slot::pg_catalog.text,
                            publication::pg_catalog.text, max_lag, parallel, max_replica_lag, max_retained_wal,
                            max_active_sessions, keys, rows_per_message, filter, columns) $$;
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
AS $$ SELECT @extschema@.backfill_start(ARRAY[table_name], confirm, batch_size, rows_per_second, slot, publication, max_lag,
                                       parallel, max_replica_lag, max_retained_wal, max_active_sessions, keys,
                                       rows_per_message, filter, columns) $$;
COMMENT ON FUNCTION backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text, text[]) IS 'backfill_start() of one table';

-- See backfill_estimate(text): makes backfill_start('public.orders', confirm => true) resolve.
CREATE FUNCTION backfill_start(table_name text, confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL,
                               parallel integer DEFAULT 1, max_replica_lag bigint DEFAULT NULL,
                               max_retained_wal bigint DEFAULT NULL, max_active_sessions integer DEFAULT NULL,
                               keys jsonb DEFAULT NULL, rows_per_message integer DEFAULT NULL,
                               filter text DEFAULT NULL, columns text[] DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT @extschema@.backfill_start(ARRAY[table_name::pg_catalog.regclass], confirm, batch_size, rows_per_second, slot, publication, max_lag,
                                       parallel, max_replica_lag, max_retained_wal, max_active_sessions, keys,
                                       rows_per_message, filter, columns) $$;
COMMENT ON FUNCTION backfill_start(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text, text[]) IS 'backfill_start() of one table, by name';

-- === Controlling a backfill ========================================================================

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
'Continues a paused or failed backfill from its cursor, with a new worker (refused when its slot is gone: cancel it).';

CREATE FUNCTION backfill_cancel(id bigint)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.cancel(id) $$;
COMMENT ON FUNCTION backfill_cancel(bigint) IS
'Stops a running or paused backfill at its next page, or ends a failed one; what it delivered stays delivered, its state becomes cancelled.';

CREATE FUNCTION backfill_set(id bigint, batch_size integer DEFAULT NULL, rows_per_second integer DEFAULT NULL,
                             max_lag bigint DEFAULT NULL, max_replica_lag bigint DEFAULT NULL,
                             max_retained_wal bigint DEFAULT NULL, max_active_sessions integer DEFAULT NULL)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.set(id, batch_size, rows_per_second, max_lag, max_replica_lag, max_retained_wal, max_active_sessions) $$;
COMMENT ON FUNCTION backfill_set(bigint, integer, integer, bigint, bigint, bigint, integer) IS
'Changes the pacing and back-pressure of a running or paused backfill (applied at its next page). NULL keeps a value; 0 removes a limit.';

CREATE FUNCTION backfill_wait(id bigint, timeout interval DEFAULT NULL)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.wait(id, extract(epoch FROM timeout)::pg_catalog.float8 OPERATOR(pg_catalog.*) 1000) $$;
COMMENT ON FUNCTION backfill_wait(bigint, interval) IS
'Waits until the backfill is done and, with a slot, delivered (true) or the timeout passes (false); an error if it fails or is cancelled.';

CREATE FUNCTION backfill_purge(older_than interval)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.purge(older_than) $$;
COMMENT ON FUNCTION backfill_purge(interval) IS
'Deletes the backfills that ended (done or cancelled) more than older_than ago, among those the caller may control, with their tables, keys, progress and errors; returns how many. Failed ones stay until resumed or cancelled.';

-- === Following a publication =======================================================================

CREATE FUNCTION backfill_follow(publication name, slot name, batch_size integer DEFAULT 1000,
                                rows_per_second integer DEFAULT NULL, parallel integer DEFAULT 1,
                                max_lag bigint DEFAULT NULL, max_replica_lag bigint DEFAULT NULL,
                                max_retained_wal bigint DEFAULT NULL, max_active_sessions integer DEFAULT NULL,
                                rows_per_message integer DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.follow(publication::pg_catalog.text, slot::pg_catalog.text, batch_size, rows_per_second, parallel,
                             max_lag, max_replica_lag, max_retained_wal, max_active_sessions, rows_per_message) $$;
COMMENT ON FUNCTION backfill_follow(name, name, integer, integer, integer, bigint, bigint, bigint, integer, integer) IS
'Follows a publication into a slot: from now on every table added to the publication (ADD TABLE, SET TABLE, ADD TABLES IN SCHEMA, a table moved into a published schema, a partition attached) is backfilled into the slot, once, with these options, as backfill_start(..., slot => slot, publication => publication) would start it, as the role that calls this. One backfill per slot at a time: tables added meanwhile wait, in the order added. Returns the follow''s id.';

CREATE FUNCTION backfill_unfollow(publication name, slot name)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.unfollow(publication::pg_catalog.text, slot::pg_catalog.text) $$;
COMMENT ON FUNCTION backfill_unfollow(name, name) IS
'Ends the follow of the publication into the slot: tables still waiting are skipped; a backfill it started runs on.';

CREATE FUNCTION backfill_follow_wait(publication name, slot name, timeout interval DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.follow_wait(publication::pg_catalog.text, slot::pg_catalog.text,
                                  extract(epoch FROM timeout)::pg_catalog.float8 OPERATOR(pg_catalog.*) 1000) $$;
COMMENT ON FUNCTION backfill_follow_wait(name, name, interval) IS
'Waits until every table queued for the follow has been started (or skipped, or failed), and returns the follow''s last started backfill (for backfill_wait); an error after the timeout.';

-- At the end of every statement that can add tables to a publication (or drop one), each
-- live follow whose publication the statement may have changed has its queue brought up to
-- the catalog, in the statement's transaction; a dispatcher starts the queued backfills once it
-- commits. The function runs as the extension's owner, and calls into the library only while a
-- follow is live: no role's DDL needs a grant of pg_backfill's, or its library, to run.
CREATE FUNCTION backfill.follow_publication_changes()
RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ BEGIN
    IF EXISTS (SELECT FROM backfill.follow WHERE ended_at IS NULL) THEN
        PERFORM backfill.follow_ddl(TG_TAG);
    END IF;
END $$;
COMMENT ON FUNCTION backfill.follow_publication_changes() IS 'Event trigger: queues the tables a statement added to a followed publication; a dispatcher starts them once the statement commits';
CREATE EVENT TRIGGER backfill_follow_publication_changes ON ddl_command_end
    WHEN TAG IN ('ALTER PUBLICATION', 'DROP PUBLICATION', 'ALTER TABLE', 'CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO',
                 'DROP TABLE', 'CREATE SCHEMA')
    EXECUTE FUNCTION backfill.follow_publication_changes();

-- === Watching: the views ===========================================================================

CREATE FUNCTION backfill.visible(started_by name)
RETURNS boolean
LANGUAGE sql STABLE
AS $$ SELECT backfill.may_act_as(CURRENT_USER, 'pg_monitor') OR backfill.may_act_as(CURRENT_USER, started_by) $$;
COMMENT ON FUNCTION backfill.visible(name) IS
'Whether the current role sees a backfill started by this role: one that may act as it or as pg_monitor (backfill.may_act_as), or a superuser';

-- The views show each role the backfills started by it or a role it is a member of;
-- superusers and members of pg_monitor see every backfill. Counts, rates and SQLSTATEs show to
-- a role that may SELECT the tables, or to pg_monitor (as PostgreSQL's progress views show
-- theirs); what can hold a table's values (key values, a filter, an error's text) only to a
-- role that may SELECT the tables, and to superusers (also once a table is dropped). security_barrier: the filter runs before any function in a
-- query on the view sees a row.
CREATE VIEW backfill_status WITH (security_barrier) AS
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
COMMENT ON VIEW backfill_status IS 'One row per backfill: state, progress, who started it and why it failed';
COMMENT ON COLUMN backfill_status.state IS 'running (waiting_for says if it waits, and for what), paused (by backfill_pause), done, cancelled or failed';
COMMENT ON COLUMN backfill_status.pause_reason IS 'Why it is paused: by backfill_pause()';
COMMENT ON COLUMN backfill_status.rows_per_second_last_minute IS 'Delivery rate over the last minute';
COMMENT ON COLUMN backfill_status.time_left IS 'The rows still expected (rows_estimated - rows_done) at the rate of the last 10 seconds (of the last minute, with one sample in those 10 seconds)';
COMMENT ON COLUMN backfill_status.slot_lag_bytes IS 'WAL the slot''s consumer has not confirmed yet';
COMMENT ON COLUMN backfill_status.watermark_lsn IS 'WAL position after the last page';
COMMENT ON COLUMN backfill_status.delivered IS 'Done, and (with a slot) its consumer has confirmed past the watermark';
COMMENT ON COLUMN backfill_status.auto_resume IS 'Whether pg_backfill is in shared_preload_libraries, so that running backfills resume after a server restart';
COMMENT ON COLUMN backfill_status.tables IS 'Tables of the backfill, in scan order';
COMMENT ON COLUMN backfill_status.current_table IS 'Table being scanned now';
COMMENT ON COLUMN backfill_status.rows_done IS 'Read messages delivered so far';
COMMENT ON COLUMN backfill_status.rows_estimated IS 'Rows expected in all: the rows of each finished table or range, and the planner''s estimate of each other one, raised to one more than its rows delivered once they pass it';
COMMENT ON COLUMN backfill_status.percent_done IS 'rows_done against rows_estimated, truncated to a tenth; never goes backwards, below 100 until done, 100 once done';
COMMENT ON COLUMN backfill_status.waiting_for IS 'What a running backfill''s workers wait for now, if anything: a row lock held by another process (its pid), the slot''s consumer (none connected, or lagging past max_lag_bytes), a standby replaying past max_replica_lag_bytes, a slot retaining more than max_retained_wal_bytes, or the server''s load: past max_active_sessions (then it slows down rather than waits), or, for a backfill with no pacing option, a busy server (then it rests after each page, backfill.default_duty_cycle)';
COMMENT ON COLUMN backfill_status.rows_per_message IS 'Most rows per message: 1, a read message per row; more, reads messages of up to this many rows';
COMMENT ON COLUMN backfill_status.row_filter IS 'The filter it started with (filter => ...): only rows it is true for are delivered; NULL: every row';
COMMENT ON COLUMN backfill_status.waiting_kind IS 'The kind of what a running backfill''s workers wait for now, stable for monitoring: row_lock, consumer_away, consumer_lag, replica_lag, retained_wal or load (then it slows down, or rests after each page, rather than waits); NULL when nothing holds it back';
COMMENT ON COLUMN backfill_status.worker_pid IS 'Process id of the running background worker, if any';
COMMENT ON COLUMN backfill_status.last_error_sqlstate IS 'SQLSTATE of the error that failed the backfill';
COMMENT ON COLUMN backfill_status.last_error IS 'Message of the error that failed the backfill, with the table and key';
COMMENT ON COLUMN backfill_status.id IS 'Backfill id, returned by backfill_start() and carried in every message';
COMMENT ON COLUMN backfill_status.slot_name IS 'Replication slot of the consumer the backfill is for, if given';
COMMENT ON COLUMN backfill_status.workers_running IS 'Background workers of the backfill running now';
COMMENT ON COLUMN backfill_status.parallel IS 'Workers the backfill runs with (parallel => N)';
COMMENT ON COLUMN backfill_status.batch_size IS 'Rows per page (one page is one transaction)';
COMMENT ON COLUMN backfill_status.rows_per_second IS 'Pacing: most rows delivered per second; NULL for no limit';
COMMENT ON COLUMN backfill_status.max_lag_bytes IS 'With a slot: the backfill waits while its consumer lags more than this';
COMMENT ON COLUMN backfill_status.publication_name IS 'Publication of the consumer, if given';
COMMENT ON COLUMN backfill_status.message_prefix IS 'Prefix of the backfill''s logical decoding messages';
COMMENT ON COLUMN backfill_status.started_by IS 'Role that started the backfill';
COMMENT ON COLUMN backfill_status.started_at IS 'When backfill_start() was called';
COMMENT ON COLUMN backfill_status.finished_at IS 'When the backfill reached done, cancelled or failed';
COMMENT ON COLUMN backfill_status.max_replica_lag_bytes IS 'Pages wait while a physical standby replays more than this behind; NULL: no limit';
COMMENT ON COLUMN backfill_status.max_retained_wal_bytes IS 'Pages wait while a replication slot retains more WAL than this; NULL: no limit';
COMMENT ON COLUMN backfill_status.max_active_sessions IS 'Pages slow down while more client sessions than this are active; NULL: no limit';
COMMENT ON COLUMN backfill_status.lock_mode IS 'How its pages lock what they read: auto, rows or table (backfill.lock_mode when it started)';

CREATE VIEW backfill_tables WITH (security_barrier) AS
SELECT jt.job_id AS backfill_id,
       jt.position,
       jt.relid AS table_name,
       jt.part,
       CASE WHEN j.state IN ('cancelled', 'failed') AND jt.state <> 'done' THEN j.state
            ELSE jt.state END AS state,
       jt.key_columns,
       CASE WHEN v.readable THEN jt.cursor END AS cursor,
       CASE WHEN v.readable THEN jt.upper_bound END AS upper_bound,
       CASE WHEN v.countable THEN jt.rows_done END AS rows_done,
       CASE WHEN v.countable THEN jt.rows_estimated END AS rows_estimated,
       CASE WHEN v.countable THEN jt.bytes_done END AS bytes_done,
       jt.last_page_lsn,
       jt.started_at,
       jt.finished_at,
       jt.pages_table_locked,
       jt.pages_row_locked
  FROM backfill.job_table jt
  JOIN backfill.job j ON j.id = jt.job_id
 CROSS JOIN LATERAL (SELECT r.readable, backfill.may_act_as(CURRENT_USER, 'pg_monitor') OR r.readable AS countable
                       FROM (SELECT coalesce(pg_catalog.has_table_privilege(jt.relid, 'SELECT'), false)
                                    OR coalesce((SELECT u.rolsuper FROM pg_catalog.pg_roles u WHERE u.rolname OPERATOR(pg_catalog.=) CURRENT_USER), false) AS readable) r) v
 WHERE backfill.visible(j.started_by);
COMMENT ON VIEW backfill_tables IS 'One row per table of each backfill: scan state, cursor and counters';
COMMENT ON COLUMN backfill_tables.state IS 'pending, running, done; or the backfill''s cancelled/failed for a table it did not finish';
COMMENT ON COLUMN backfill_tables.part IS 'Key range of the table (with parallel workers; 0 otherwise)';
COMMENT ON COLUMN backfill_tables.cursor IS 'Last key delivered; the scan resumes after it';
COMMENT ON COLUMN backfill_tables.upper_bound IS 'Greatest key when the scan started; rows inserted later arrive through the stream';
COMMENT ON COLUMN backfill_tables.bytes_done IS 'Bytes of message payload delivered';
COMMENT ON COLUMN backfill_tables.backfill_id IS 'The backfill (backfill_status.id)';
COMMENT ON COLUMN backfill_tables.position IS 'Order in which the backfill scans its tables and ranges';
COMMENT ON COLUMN backfill_tables.table_name IS 'The table';
COMMENT ON COLUMN backfill_tables.key_columns IS 'Columns of the key the scan is ordered by';
COMMENT ON COLUMN backfill_tables.rows_done IS 'Read messages delivered';
COMMENT ON COLUMN backfill_tables.rows_estimated IS 'Planner estimate of the rows when the backfill started';
COMMENT ON COLUMN backfill_tables.last_page_lsn IS 'WAL position at the end of the last delivered page';
COMMENT ON COLUMN backfill_tables.started_at IS 'When the scan started (upper bound fixed, start marker sent)';
COMMENT ON COLUMN backfill_tables.finished_at IS 'When the scan ended (end marker sent)';
COMMENT ON COLUMN backfill_tables.pages_table_locked IS 'Pages that held the table in SHARE mode, writing nothing to its rows';
COMMENT ON COLUMN backfill_tables.pages_row_locked IS 'Pages that locked their rows FOR SHARE';

CREATE VIEW backfill_errors WITH (security_barrier) AS
SELECT e.job_id AS backfill_id,
       e.occurred_at,
       e.table_name,
       CASE WHEN v.readable THEN e.stopped_after_key END AS stopped_after_key,
       CASE WHEN v.countable THEN e.sqlstate END AS sqlstate,
       CASE WHEN v.readable THEN e.message END AS message,
       CASE WHEN v.readable THEN e.detail END AS detail,
       NULL::bigint AS follow_id
  FROM backfill.job_error e
  JOIN backfill.job j ON j.id = e.job_id
 CROSS JOIN LATERAL (SELECT r.readable, backfill.may_act_as(CURRENT_USER, 'pg_monitor') OR r.readable AS countable
                       FROM (SELECT coalesce(pg_catalog.has_table_privilege(e.relid, 'SELECT'), false)
                                    OR coalesce((SELECT u.rolsuper FROM pg_catalog.pg_roles u WHERE u.rolname OPERATOR(pg_catalog.=) CURRENT_USER), false) AS readable) r) v
 WHERE backfill.visible(j.started_by)
UNION ALL
-- A table a follow could not start (backfill_follow()): no backfill, the follow's error.
SELECT NULL::bigint,
       t.settled_at,
       t.table_name,
       NULL::text,
       CASE WHEN v.countable THEN t.sqlstate END,
       CASE WHEN v.readable THEN t.reason END,
       CASE WHEN v.readable THEN t.detail END,
       t.follow_id
  FROM backfill.follow_table t
  JOIN backfill.follow f ON f.id = t.follow_id
  LEFT JOIN pg_catalog.pg_roles o ON o.oid = f.created_by
 CROSS JOIN LATERAL (SELECT r.readable, backfill.may_act_as(CURRENT_USER, 'pg_monitor') OR r.readable AS countable
                       FROM (SELECT coalesce(pg_catalog.has_table_privilege(t.relid, 'SELECT'), false)
                                    OR coalesce((SELECT u.rolsuper FROM pg_catalog.pg_roles u WHERE u.rolname OPERATOR(pg_catalog.=) CURRENT_USER), false) AS readable) r) v
 WHERE t.state = 'failed' AND backfill.visible(o.rolname);
COMMENT ON VIEW backfill_errors IS 'Every error that failed a backfill, oldest first: backfill_status.last_error shows the latest only, and a resume clears it; and every table a follow (backfill_follow()) could not start, with no backfill';
COMMENT ON COLUMN backfill_errors.follow_id IS 'For a table a follow could not start: the follow (backfill_follows.id); backfill_id is then NULL';
COMMENT ON COLUMN backfill_errors.backfill_id IS 'The backfill (backfill_status.id)';
COMMENT ON COLUMN backfill_errors.occurred_at IS 'When it failed';
COMMENT ON COLUMN backfill_errors.table_name IS 'The table it was scanning when it failed, if any';
COMMENT ON COLUMN backfill_errors.stopped_after_key IS 'The last key it had delivered of that table';
COMMENT ON COLUMN backfill_errors.sqlstate IS 'SQLSTATE of the error';
COMMENT ON COLUMN backfill_errors.message IS 'The error''s message';
COMMENT ON COLUMN backfill_errors.detail IS 'The error''s detail, if any';

CREATE VIEW backfill_follows WITH (security_barrier) AS
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
COMMENT ON VIEW backfill_follows IS 'One row per follow (backfill_follow()), shown to the role that created it, its members, superusers and pg_monitor';
COMMENT ON COLUMN backfill_follows.id IS 'Follow id, returned by backfill_follow()';
COMMENT ON COLUMN backfill_follows.publication IS 'The publication followed';
COMMENT ON COLUMN backfill_follows.slot IS 'The slot its backfills are bound to';
COMMENT ON COLUMN backfill_follows.state IS 'following; slot missing (the slot is gone: the follow ends when it next acts); ended';
COMMENT ON COLUMN backfill_follows.options IS 'The options of the backfills it starts, as backfill_start() names them (those given)';
COMMENT ON COLUMN backfill_follows.created_by IS 'The role that created it: its backfills are started as this role, with its rights';
COMMENT ON COLUMN backfill_follows.created_at IS 'When backfill_follow() was called';
COMMENT ON COLUMN backfill_follows.last_started_at IS 'When it last started a backfill';
COMMENT ON COLUMN backfill_follows.last_backfill_id IS 'The backfill it last started (backfill_status.id)';
COMMENT ON COLUMN backfill_follows.pending_tables IS 'Tables added to the publication that wait for the slot, in the order added';
COMMENT ON COLUMN backfill_follows.last_error IS 'Why it last could not start a table''s backfill (the table, SQLSTATE and message)';
COMMENT ON COLUMN backfill_follows.last_error_at IS 'When';
COMMENT ON COLUMN backfill_follows.ended_at IS 'When it ended';
COMMENT ON COLUMN backfill_follows.end_reason IS 'Why it ended: backfill_unfollow(), or its publication or slot dropped';

-- Progress the way PostgreSQL shows its own (backfill_progress): one row per running backfill worker of the whole
-- cluster, from shared memory, readable from any database that has the extension, in the shape
-- of PostgreSQL's progress views (pg_stat_progress_*). backfill.progress() decides which rows
-- the caller sees, as backfill_status does (it is executable by all, so it checks, not the view).
CREATE VIEW backfill_progress AS
SELECT p.pid,
       p.datid,
       d.datname,
       p.backfill_id,
       p.worker,
       p.relid,
       p.position,
       p.phase,
       p.rows_total,
       p.rows_done,
       p.bytes_done,
       p.pages_done,
       p.started_by,
       p.started_at,
       p.phase_since
  FROM backfill.progress() p
  LEFT JOIN pg_catalog.pg_database d ON d.oid OPERATOR(pg_catalog.=) p.datid;
COMMENT ON VIEW backfill_progress IS 'One row per running backfill worker of the cluster, of every database, as PostgreSQL''s progress views show theirs (needs pg_backfill in shared_preload_libraries)';
COMMENT ON COLUMN backfill_progress.pid IS 'Process id of the worker';
COMMENT ON COLUMN backfill_progress.datid IS 'OID of the database of the backfill';
COMMENT ON COLUMN backfill_progress.datname IS 'Name of the database of the backfill';
COMMENT ON COLUMN backfill_progress.backfill_id IS 'The backfill (backfill_status.id in its database)';
COMMENT ON COLUMN backfill_progress.worker IS 'The worker''s number among the backfill''s parallel workers (0 for the first)';
COMMENT ON COLUMN backfill_progress.relid IS 'OID of the table the worker scans now; NULL before its first';
COMMENT ON COLUMN backfill_progress.position IS 'The range it scans now (backfill_tables.position); NULL before its first';
COMMENT ON COLUMN backfill_progress.phase IS 'starting, scanning, waiting for consumer, waiting for source, waiting for load or finishing';
COMMENT ON COLUMN backfill_progress.rows_total IS 'Rows of the range it scans: the planner''s estimate, raised to rows_done once they pass it';
COMMENT ON COLUMN backfill_progress.rows_done IS 'Rows of the range delivered, before this worker too (the range''s cursor count)';
COMMENT ON COLUMN backfill_progress.bytes_done IS 'Bytes of message payload this worker process has delivered of the range';
COMMENT ON COLUMN backfill_progress.pages_done IS 'Pages (transactions) this worker process has delivered of the range';
COMMENT ON COLUMN backfill_progress.started_by IS 'Role that started the backfill';
COMMENT ON COLUMN backfill_progress.started_at IS 'When this worker process started working on the backfill';
COMMENT ON COLUMN backfill_progress.phase_since IS 'When the worker entered its phase';

-- === Verifying a copy ==============================================================================

CREATE FUNCTION backfill_checksum(tbl regclass, ranges integer DEFAULT 1024, level text DEFAULT 'hash',
                                  bounds jsonb DEFAULT NULL, columns text[] DEFAULT NULL)
RETURNS TABLE (range integer, lower jsonb, upper jsonb, rows bigint, checksum text)
LANGUAGE sql VOLATILE
AS $$ SELECT * FROM backfill.checksum(tbl::pg_catalog.oid, ranges, level, bounds, columns) $$;
COMMENT ON FUNCTION backfill_checksum(regclass, integer, text, jsonb, text[]) IS
'One row per key range of the table: its bounds, row count and checksum (level count, aggregate or hash), as the caller may read it; bounds => the ranges of another checksum, to compare two tables over identical ranges; columns => only those columns'' values (a copy made with a column list).';

CREATE FUNCTION backfill_compare(source regclass, target regclass, level text DEFAULT 'hash',
                                 passes integer DEFAULT 3, slot name DEFAULT NULL, columns text[] DEFAULT NULL)
RETURNS TABLE (key jsonb, status text)
LANGUAGE sql VOLATILE
AS $$ SELECT * FROM backfill.compare(source::pg_catalog.oid, target::pg_catalog.oid, level, passes, slot::pg_catalog.text, columns) $$;
COMMENT ON FUNCTION backfill_compare(regclass, regclass, text, integer, name, text[]) IS
'The keys whose rows differ between source and target (a local table, or a postgres_fdw foreign table with pg_backfill on its server, through dblink): missing, extra, different, or unsettled (still changing on the source at the last pass). Re-checks each difference after the stream has caught up (the slot''s confirmed position): slot => NULL follows the slot of the source''s latest running, paused or done backfill, if one has a slot, slot => '''' none; a NOTICE names the slot followed. columns => compares only those columns'' values (a copy made with a column list).';

CREATE FUNCTION backfill_repair(source regclass, target regclass, confirm boolean DEFAULT false,
                                level text DEFAULT 'hash', passes integer DEFAULT 3, slot name DEFAULT NULL,
                                batch_size integer DEFAULT 1000, columns text[] DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.repair(source::pg_catalog.oid, target::pg_catalog.oid, confirm, level, passes, slot::pg_catalog.text, batch_size, columns) $$;
COMMENT ON FUNCTION backfill_repair(regclass, regclass, boolean, text, integer, name, integer, text[]) IS
'Compares source and target (backfill_compare()) and starts one backfill of exactly the differing keys of the source, through the slot the comparison followed (none with slot => ''''); returns its id, or NULL when nothing differs. Without confirm => true it starts nothing and reports what differs. columns => compares those columns and re-delivers them only.';

-- === Authenticated messages (docs/consumers.md, docs/security.md) ==================================

-- The message keys, as consumers read them: SELECT on this view is the consumer's grant. The
-- bytes come from the sequences that hold them (sql/catalog.sql says why), which only the
-- extension's owner reads: backfill.message_key_bytes() reads them as the owner for a caller
-- that may SELECT this view.
CREATE VIEW backfill.message_key AS
SELECT s.id, backfill.message_key_bytes(s.id) AS key, s.created_at
  FROM backfill.message_key_store s;
COMMENT ON VIEW backfill.message_key IS 'Keys of the messages'' authentication tags (HMAC-SHA256); the newest signs new messages, older ones still verify old messages. Readable only by the extension''s owner and the roles it grants.';
COMMENT ON COLUMN backfill.message_key.id IS 'Key id, carried in every tag (auth = "<id>:<hex>")';
COMMENT ON COLUMN backfill.message_key.key IS '32 random bytes';
COMMENT ON COLUMN backfill.message_key.created_at IS 'When the key was made (CREATE EXTENSION or backfill_rotate_key())';

CREATE FUNCTION backfill_key(OUT key_id integer, OUT key bytea)
LANGUAGE sql STABLE
AS $$ SELECT id, key FROM backfill.message_key ORDER BY id DESC LIMIT 1 $$;
COMMENT ON FUNCTION backfill_key() IS
'The key that signs new messages, for consumers that verify them (needs SELECT on backfill.message_key).';

COMMENT ON FUNCTION backfill_message_valid(text, bigint) IS
'Whether a message is genuine: its auth tag verifies for the transaction id its decoder reported (needs SELECT on backfill.message_key)';

-- The xid as decoders report it: pg_logical_slot_peek_changes() and _get_changes() return it as
-- type xid, which has no cast to bigint. (Not STRICT: a NULL xid is 22004, naming it.) Executable
-- by all, granting nothing: it calls backfill_message_valid(text, bigint), which needs the
-- consumer's grant (EXECUTE, checked for the caller when the call runs, and SELECT on the keys),
-- so that a consumer granted before 0.11.0 uses it as it is.
CREATE FUNCTION backfill_message_valid(content text, xid pg_catalog.xid)
RETURNS boolean
LANGUAGE sql STABLE
AS $$ SELECT @extschema@.backfill_message_valid(content, xid::pg_catalog.text::pg_catalog.int8) $$;
COMMENT ON FUNCTION backfill_message_valid(text, xid) IS
'backfill_message_valid() with the xid column of pg_logical_slot_peek_changes() as it is (type xid)';

CREATE FUNCTION backfill_rotate_key(retire_old_keys boolean DEFAULT false)
RETURNS integer
-- (client_min_messages: on a Citus node, each ALTER EXTENSION ... ADD or DROP SEQUENCE below
-- gets a notice that Citus does not pass it on to the other nodes, which it need not: each node
-- has keys of its own.)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp SET client_min_messages = warning
AS $$
DECLARE
    made integer;
    retired oid[];
    part oid;
BEGIN
    IF retire_old_keys IS NULL THEN
        RAISE EXCEPTION 'argument retire_old_keys of backfill_rotate_key must not be NULL'
            USING ERRCODE = 'null_value_not_allowed',
                  DETAIL = 'backfill_rotate_key was called with retire_old_keys => NULL.',
                  HINT = 'Pass true to delete the old keys (a key leaked), or leave it out to keep them.';
    END IF;
    made := backfill.make_message_key();
    IF retire_old_keys THEN
        -- A retired key's bytes go with it: its sequences are dropped.
        FOR retired IN DELETE FROM backfill.message_key_store WHERE id OPERATOR(pg_catalog.<) made RETURNING key_sequences LOOP
            FOREACH part IN ARRAY retired LOOP
                EXECUTE format('ALTER EXTENSION pg_backfill DROP SEQUENCE %s', part::regclass);
                EXECUTE format('DROP SEQUENCE %s', part::regclass);
            END LOOP;
        END LOOP;
    END IF;
    RETURN made;
END
$$;
COMMENT ON FUNCTION backfill_rotate_key(boolean) IS
'Makes a new message key, which signs every page from the next one on; returns its id. Old keys still verify old messages, unless retire_old_keys => true deletes them (for a key that leaked).';

CREATE FUNCTION backfill_security_check()
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

-- === Citus: a backfill of a distributed table started on the coordinator (docs/citus.md) ===========

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
       CASE WHEN v.countable THEN jt.rows_done END AS rows_done,
       CASE WHEN v.countable THEN jt.rows_estimated END AS rows_estimated,
       CASE WHEN v.readable THEN s.node_error END AS node_error
  FROM backfill.job_shard s
  JOIN backfill.job_table jt ON jt.job_id = s.job_id AND jt.position = s.position
  JOIN backfill.job j ON j.id = s.job_id
 CROSS JOIN LATERAL (SELECT r.readable, backfill.may_act_as(CURRENT_USER, 'pg_monitor') OR r.readable AS countable
                       FROM (SELECT coalesce(pg_catalog.has_table_privilege(jt.relid, 'SELECT'), false)
                                    OR coalesce((SELECT u.rolsuper FROM pg_catalog.pg_roles u WHERE u.rolname OPERATOR(pg_catalog.=) CURRENT_USER), false) AS readable) r) v
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

-- What the coordinator runs on each worker node, as the role that called backfill_start() there:
-- that node's backfill_start(), its error (SQLSTATE, message, detail, hint) returned as JSON
-- rather than raised, so that the coordinator can raise it again as it was, naming the node.
-- shard_keys (backfill_repair()): a JSON array of each table's keys, in the order of tables.
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
    -- The keys' shape first: an argument error before any start, or any wait for a worker.
    IF shard_keys IS NOT NULL
       -- (In parentheses: IF would take the CASE's THEN for its own.)
       AND (CASE WHEN jsonb_typeof(shard_keys) = 'array' THEN jsonb_array_length(shard_keys) END
            IS DISTINCT FROM cardinality(tables)) THEN
        RAISE EXCEPTION 'shard_keys must be a JSON array of one key list per table'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = format('%s tables were given; their keys are given in the same order.', cardinality(tables)),
                  HINT = 'backfill_repair() on the coordinator passes them: run that there.';
    END IF;
    started := @extschema@.backfill_start(tables, confirm, batch_size, rows_per_second, slot, publication,
                                          max_lag, parallel);
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

-- === The extension itself ==========================================================================

-- DROP EXTENSION while backfills run would leave their workers failing on missing tables and
-- start ids again at 1 under consumers that hold the old ids: it is refused until they end.
CREATE FUNCTION backfill.refuse_drop_while_running()
RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    running bigint[];
BEGIN
    IF current_query() !~* 'drop\s+extension\s.*\mpg_backfill\M' THEN
        RETURN;
    END IF;
    SELECT array_agg(id ORDER BY id) INTO running FROM backfill.job WHERE state IN ('running', 'paused');
    IF running IS NOT NULL THEN
        RAISE EXCEPTION 'cannot drop extension pg_backfill while backfills run'
            USING ERRCODE = 'object_in_use',
                  DETAIL = CASE WHEN cardinality(running) = 1 THEN format('Backfill %s is running or paused.', running[1])
                                ELSE format('Backfills %s are running or paused.', array_to_string(running, ', ')) END,
                  HINT = 'Cancel them first: SELECT backfill_cancel(id) FROM backfill_status WHERE state IN (''running'', ''paused'');';
    END IF;
END
$$;
COMMENT ON FUNCTION backfill.refuse_drop_while_running() IS 'Event trigger: refuses DROP EXTENSION pg_backfill while backfills run or are paused';
CREATE EVENT TRIGGER backfill_refuse_drop_while_running ON ddl_command_start WHEN TAG IN ('DROP EXTENSION')
    EXECUTE FUNCTION backfill.refuse_drop_while_running();

-- === The entry points in schema backfill, which pgrx declares from src/: what each is for ==========

COMMENT ON FUNCTION backfill.estimate(oid[], integer, text, text[]) IS 'Entry point of backfill_estimate()';
COMMENT ON FUNCTION backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer, bigint, bigint, integer, jsonb, integer, text, text[]) IS 'Entry point of backfill_start(): every option, one call';
COMMENT ON FUNCTION backfill.cancel(bigint) IS 'Entry point of backfill_cancel()';
COMMENT ON FUNCTION backfill.follow(text, text, integer, integer, integer, bigint, bigint, bigint, integer, integer) IS 'Entry point of backfill_follow()';
COMMENT ON FUNCTION backfill.unfollow(text, text) IS 'Entry point of backfill_unfollow()';
COMMENT ON FUNCTION backfill.follow_wait(text, text, double precision) IS 'Entry point of backfill_follow_wait() (timeout in milliseconds)';
COMMENT ON FUNCTION backfill.follow_ddl(text) IS 'The event trigger''s work at the end of a statement (its command tag) that may have changed a followed publication''s tables';
COMMENT ON FUNCTION backfill.pause(bigint) IS 'Entry point of backfill_pause()';
COMMENT ON FUNCTION backfill.resume(bigint) IS 'Entry point of backfill_resume()';
COMMENT ON FUNCTION backfill.purge(interval) IS 'Entry point of backfill_purge()';
COMMENT ON FUNCTION backfill.set(bigint, integer, integer, bigint, bigint, bigint, integer) IS 'Entry point of backfill_set(): every option, one call';
COMMENT ON FUNCTION backfill.checksum(oid, integer, text, jsonb, text[]) IS 'Entry point of backfill_checksum()';
COMMENT ON FUNCTION backfill.checksum(oid, integer, text, jsonb) IS 'Entry point of backfill_checksum() before 0.9.0 (no column list): the SQL of an earlier version, and a comparison from another server''s, call it';
COMMENT ON FUNCTION backfill.set_keys_of(bigint, oid, jsonb) IS 'The keys of one table of a backfill started in this transaction (a worker node''s backfill of its shards, for backfill_repair() on the Citus coordinator); returns the backfill''s id';
COMMENT ON FUNCTION backfill.compare(oid, oid, text, integer, text, text[]) IS 'Entry point of backfill_compare()';
COMMENT ON FUNCTION backfill.repair(oid, oid, boolean, text, integer, text, integer, text[]) IS 'Entry point of backfill_repair()';
COMMENT ON FUNCTION backfill.row_hash(anyelement) IS 'A table row''s 64-bit hash over its columns'' binary send formats (XXH3-64; floats as SQL compares them, arrays and composites element by element, jsonb as the tokens of a walk of it, text in UTF-8), for backfill_checksum()';
COMMENT ON FUNCTION backfill.source_limit(text, bigint) IS 'The back-pressure limit in force for a backfill''s option (NULL: the setting; 0: off), for backfill_status';
COMMENT ON FUNCTION backfill.wait(bigint, double precision) IS 'Entry point of backfill_wait() (timeout in milliseconds)';
COMMENT ON FUNCTION backfill.max_slot_lag_bytes() IS 'backfill.max_slot_lag in bytes, for backfill_status';
COMMENT ON FUNCTION backfill.auto_resume() IS 'Whether pg_backfill is preloaded, so that running backfills resume after a restart';
COMMENT ON FUNCTION backfill.workers_running(bigint) IS 'Background workers of a backfill of this database running now';
COMMENT ON FUNCTION backfill.may_act_as(text, text) IS 'Whether role member holds the privileges of role role or may SET ROLE to it (a bare member, granted WITH INHERIT FALSE, SET FALSE on 16+, may not): who sees and controls a role''s backfills';
COMMENT ON FUNCTION backfill.waiting_for(bigint) IS 'What the workers of a backfill wait for now (a row lock held by a pid, the slot''s consumer, the source''s limits or load), or NULL';
COMMENT ON FUNCTION backfill.waiting_kind(bigint) IS 'The kind of what the workers of a backfill wait for now (row_lock, consumer_away, consumer_lag, replica_lag, retained_wal, load), or NULL';
COMMENT ON FUNCTION backfill.message_key_bytes(integer) IS 'A message key''s bytes, read from its sequences as the extension''s owner, for a caller that may SELECT backfill.message_key (its column key)';
COMMENT ON FUNCTION backfill.progress() IS 'Every running backfill worker of the cluster the caller may see, from shared memory, for backfill_progress';

-- === Privileges: what PUBLIC may execute and read ==================================================

-- The message keys: readable by the extension's owner and the roles it grants (consumers) only.
SELECT backfill.revoke_from_all_but_owner('backfill.message_key');

-- The views: readable by all, each showing a role what it may see.
GRANT SELECT ON backfill_status, backfill_tables TO PUBLIC;
GRANT SELECT ON backfill_errors TO PUBLIC;
GRANT SELECT ON backfill_follows TO PUBLIC;
GRANT SELECT ON backfill_shards TO PUBLIC;
GRANT SELECT ON backfill_progress TO PUBLIC;

-- Nothing that starts, controls or reveals backfills is executable by PUBLIC: docs/security.md shows
-- the grants for operators and for consumers. The views' helpers stay executable by all.
REVOKE EXECUTE ON FUNCTION
    backfill_estimate(regclass[], integer, text, text[]), backfill_estimate(regclass, integer, text, text[]), backfill_estimate(text, integer, text, text[]),
    backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text, text[]),
    backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text, text[]),
    backfill_start(text, boolean, integer, integer, name, name, bigint, integer, bigint, bigint, integer, jsonb, integer, text, text[]),
    backfill_cancel(bigint), backfill_pause(bigint), backfill_resume(bigint), backfill_purge(interval),
    backfill_set(bigint, integer, integer, bigint, bigint, bigint, integer), backfill_wait(bigint, interval),
    backfill_key(), backfill_rotate_key(boolean), backfill_message_valid(text, bigint), backfill_security_check(),
    backfill_checksum(regclass, integer, text, jsonb, text[]), backfill_compare(regclass, regclass, text, integer, name, text[]),
    backfill_repair(regclass, regclass, boolean, text, integer, name, integer, text[]),
    backfill_follow(name, name, integer, integer, integer, bigint, bigint, bigint, integer, integer),
    backfill_unfollow(name, name), backfill_follow_wait(name, name, interval)
  FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA backfill FROM PUBLIC;

-- The views' helpers, executable by all again:
GRANT EXECUTE ON FUNCTION backfill.max_slot_lag_bytes(), backfill.auto_resume(), backfill.workers_running(bigint),
                          backfill.waiting_for(bigint), backfill.waiting_kind(bigint), backfill.visible(name),
                          backfill.source_limit(text, bigint), backfill.may_act_as(text, text) TO PUBLIC;
-- backfill.row_hash() too: a hash of a row its caller already has. A comparison reads a table as
-- its owner (privilege::read_as_owner), who may hold no grant of pg_backfill's.
GRANT EXECUTE ON FUNCTION backfill.row_hash(anyelement) TO PUBLIC;
-- backfill.message_key_bytes() too: it reads a key only for a caller that may SELECT
-- backfill.message_key, whose column key it is.
GRANT EXECUTE ON FUNCTION backfill.message_key_bytes(integer) TO PUBLIC;
-- backfill.start_on_node() too: it grants nothing backfill_start() does not, running as its
-- caller, who needs EXECUTE on that.
GRANT EXECUTE ON FUNCTION backfill.start_on_node(regclass[], boolean, integer, integer, name, name, bigint, integer, jsonb) TO PUBLIC;
-- backfill.set_keys_of() too: it only narrows a backfill its caller started in the same
-- transaction, to keys of a table the caller may backfill.
GRANT EXECUTE ON FUNCTION backfill.set_keys_of(bigint, oid, jsonb) TO PUBLIC;
-- backfill.progress() too, as the other views' helpers: it shows only what backfill_progress shows.
GRANT EXECUTE ON FUNCTION backfill.progress() TO PUBLIC;
