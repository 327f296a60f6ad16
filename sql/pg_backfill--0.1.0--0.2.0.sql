-- pg_backfill 0.1.0 -> 0.2.0: the security release.
-- - The state tables are no longer readable by PUBLIC (the extension's owner and pg_monitor read them);
--   the views show each role its own backfills, and no key values, counts or errors of tables it
--   cannot SELECT.
-- - No function is executable by PUBLIC but the views' helpers: docs/security.md shows the grants.
-- - Every message carries an authentication tag keyed with backfill.message_key.
-- What changed for a DBA: CHANGELOG.md, section 0.2.0.
\echo Use "ALTER EXTENSION pg_backfill UPDATE TO '0.2.0'" to load this file. \quit

-- The state tables first, and in the order a worker's page takes them (job, then job_table):
-- a script that took job_table first and then altered job would deadlock with a running page.
LOCK TABLE backfill.job, backfill.job_table IN ACCESS EXCLUSIVE MODE;

-- The state is no longer dumped (see sql/catalog.sql): the tables stay members of the
-- extension, no longer as configuration tables.
ALTER EXTENSION pg_backfill DROP TABLE backfill.job_progress;
ALTER EXTENSION pg_backfill ADD TABLE backfill.job_progress;
ALTER EXTENSION pg_backfill DROP TABLE backfill.job_table;
ALTER EXTENSION pg_backfill ADD TABLE backfill.job_table;
ALTER EXTENSION pg_backfill DROP TABLE backfill.job;
ALTER EXTENSION pg_backfill ADD TABLE backfill.job;

-- NULL arguments are errors (22004) that name the argument, no longer a silent NULL.
ALTER FUNCTION backfill.cancel(bigint) CALLED ON NULL INPUT;
ALTER FUNCTION backfill.pause(bigint) CALLED ON NULL INPUT;
ALTER FUNCTION backfill.resume(bigint) CALLED ON NULL INPUT;

REVOKE SELECT ON backfill.job, backfill.job_table, backfill.job_progress FROM PUBLIC;
GRANT SELECT ON backfill.job, backfill.job_table, backfill.job_progress TO pg_monitor;

COMMENT ON COLUMN backfill.job_table.job_id IS 'The backfill (backfill.job.id)';
COMMENT ON COLUMN backfill.job_progress.job_id IS 'The backfill (backfill.job.id)';
COMMENT ON COLUMN backfill.job_progress.at IS 'When the sample was taken';
COMMENT ON COLUMN backfill.job_progress.rows_done IS 'Rows the backfill had delivered then, over all its tables';

-- 32 bytes from four random UUIDs (pg_strong_random; 488 random bits), hashed.
CREATE FUNCTION backfill.random_key() RETURNS bytea
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$ SELECT sha256(convert_to(gen_random_uuid()::text || gen_random_uuid()::text ||
                               gen_random_uuid()::text || gen_random_uuid()::text, 'UTF8')) $$;
COMMENT ON FUNCTION backfill.random_key() IS 'A new message key: 32 random bytes';

CREATE TABLE backfill.message_key (
    id         integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key        bytea NOT NULL DEFAULT backfill.random_key() CHECK (octet_length(key) >= 32),
    created_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp()
);
COMMENT ON TABLE backfill.message_key IS 'Keys of the messages'' authentication tags (HMAC-SHA256); the newest signs new messages, older ones still verify old messages. Readable only by the extension''s owner and the roles it grants.';
COMMENT ON COLUMN backfill.message_key.id IS 'Key id, carried in every tag (auth = "<id>:<hex>")';
COMMENT ON COLUMN backfill.message_key.key IS '32 random bytes';
COMMENT ON COLUMN backfill.message_key.created_at IS 'When the key was made (CREATE EXTENSION or backfill_rotate_key())';
-- Not dumped: a restored database is another database, with a key of its own.
INSERT INTO backfill.message_key DEFAULT VALUES;
-- Only the extension's owner reads the key: privileges that ALTER DEFAULT PRIVILEGES gave the
-- new table are taken back; docs/security.md shows the grant for consumers.
DO $$
DECLARE
    grantee oid;
BEGIN
    FOR grantee IN SELECT DISTINCT a.grantee FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
                    WHERE c.oid = 'backfill.message_key'::pg_catalog.regclass AND a.grantee <> c.relowner
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON backfill.message_key FROM %s',
                                  CASE grantee WHEN 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(grantee::regrole::text) END);
    END LOOP;
END
$$;

-- New entry points in the library.
CREATE  FUNCTION "backfill_message_valid"(
	"content" TEXT, /* Option < & str > */
	"xid" bigint /* Option < i64 > */
) RETURNS bool /* bool */
STABLE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'message_valid_wrapper';
CREATE  FUNCTION backfill."auto_resume"() RETURNS bool /* bool */
STRICT STABLE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'auto_resume_wrapper';
CREATE  FUNCTION backfill."workers_running"(
	"backfill_id" bigint /* i64 */
) RETURNS INT /* i32 */
STRICT STABLE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'workers_running_wrapper';
CREATE  FUNCTION backfill."waiting_for"(
	"backfill_id" bigint /* i64 */
) RETURNS TEXT /* Option < String > */
STRICT STABLE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'waiting_for_wrapper';

-- The views are made anew (columns change from plain to filtered).
DROP VIEW backfill_status, backfill_tables;

CREATE FUNCTION backfill.visible(started_by name)
RETURNS boolean
LANGUAGE sql STABLE
AS $$ SELECT pg_catalog.pg_has_role('pg_monitor', 'MEMBER')
             OR EXISTS (SELECT FROM pg_catalog.pg_roles r
                         WHERE r.rolname OPERATOR(pg_catalog.=) started_by AND pg_catalog.pg_has_role(r.oid, 'MEMBER')) $$;
COMMENT ON FUNCTION backfill.visible(name) IS
'Whether the current role sees a backfill started by this role: a member of it, a superuser or a member of pg_monitor';

-- The views show each role the backfills started by it or a role it is a member of;
-- superusers and members of pg_monitor see every backfill. Key values, counts and errors
-- show only to a role that may SELECT the tables (or pg_monitor). security_barrier: the filter
-- runs before any function in a query on the view sees a row.
CREATE VIEW backfill_status WITH (security_barrier) AS
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
       CASE WHEN v.readable THEN j.last_error END AS last_error
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
COMMENT ON COLUMN backfill_status.waiting_for IS 'What a running backfill''s workers wait for now, if anything: a row lock held by another process (its pid)';
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
       CASE WHEN v.readable THEN jt.rows_done END AS rows_done,
       CASE WHEN v.readable THEN jt.rows_estimated END AS rows_estimated,
       CASE WHEN v.readable THEN jt.bytes_done END AS bytes_done,
       jt.last_page_lsn,
       jt.started_at,
       jt.finished_at
  FROM backfill.job_table jt
  JOIN backfill.job j ON j.id = jt.job_id
 CROSS JOIN LATERAL (SELECT pg_catalog.pg_has_role('pg_monitor', 'MEMBER')
                            OR coalesce(pg_catalog.has_table_privilege(jt.relid, 'SELECT'), false) AS readable) v
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

GRANT SELECT ON backfill_status, backfill_tables TO PUBLIC;

-- Authenticated messages (docs/consumers.md, "Authenticated messages").
CREATE FUNCTION backfill_key(OUT key_id integer, OUT key bytea)
LANGUAGE sql STABLE
AS $$ SELECT id, key FROM backfill.message_key ORDER BY id DESC LIMIT 1 $$;
COMMENT ON FUNCTION backfill_key() IS
'The key that signs new messages, for consumers that verify them (needs SELECT on backfill.message_key).';

CREATE FUNCTION backfill_rotate_key(retire_old_keys boolean DEFAULT false)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    made integer;
BEGIN
    IF retire_old_keys IS NULL THEN
        RAISE EXCEPTION 'argument retire_old_keys of backfill_rotate_key must not be NULL'
            USING ERRCODE = 'null_value_not_allowed',
                  DETAIL = 'backfill_rotate_key was called with retire_old_keys => NULL.',
                  HINT = 'Pass true to delete the old keys (a key leaked), or leave it out to keep them.';
    END IF;
    INSERT INTO backfill.message_key DEFAULT VALUES RETURNING id INTO made;
    IF retire_old_keys THEN
        DELETE FROM backfill.message_key WHERE id < made;
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
SELECT 'pg_logical_emit_message is executable by PUBLIC',
       NOT (pg_catalog.has_function_privilege('public', 'pg_catalog.pg_logical_emit_message(boolean, text, text)', 'EXECUTE')
            OR pg_catalog.has_function_privilege('public', 'pg_catalog.pg_logical_emit_message(boolean, text, bytea)', 'EXECUTE')),
       'Any role can write a message with pg_backfill''s prefix into every consumer''s stream; only consumers that check each message''s auth tag tell it from a genuine one.',
       'REVOKE EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, text), pg_catalog.pg_logical_emit_message(boolean, text, bytea) FROM PUBLIC;'
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
COMMENT ON FUNCTION backfill_security_check() IS
'Checks the privileges that keep the message stream trustworthy; each row that is not ok has the statement that fixes it.';

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
                  DETAIL = format('Backfills %s are running or paused.', array_to_string(running, ', ')),
                  HINT = 'Cancel them first: SELECT backfill_cancel(id) FROM backfill_status WHERE state IN (''running'', ''paused'');';
    END IF;
END
$$;
COMMENT ON FUNCTION backfill.refuse_drop_while_running() IS 'Event trigger: refuses DROP EXTENSION pg_backfill while backfills run or are paused';
CREATE EVENT TRIGGER backfill_refuse_drop_while_running ON ddl_command_start WHEN TAG IN ('DROP EXTENSION')
    EXECUTE FUNCTION backfill.refuse_drop_while_running();
REVOKE EXECUTE ON FUNCTION
    backfill_estimate(regclass[], integer), backfill_estimate(regclass, integer), backfill_estimate(text, integer),
    backfill_start(regclass[], boolean, integer, integer, name, name, bigint, integer),
    backfill_start(regclass, boolean, integer, integer, name, name, bigint, integer),
    backfill_start(text, boolean, integer, integer, name, name, bigint, integer),
    backfill_cancel(bigint), backfill_pause(bigint), backfill_resume(bigint),
    backfill_set(bigint, integer, integer, bigint), backfill_wait(bigint, interval),
    backfill_key(), backfill_rotate_key(boolean), backfill_message_valid(text, bigint), backfill_security_check()
  FROM PUBLIC;

-- The entry points the wrappers above call, and the views' helpers.
COMMENT ON FUNCTION backfill.estimate(oid[], integer) IS 'Entry point of backfill_estimate()';
COMMENT ON FUNCTION backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer) IS 'Entry point of backfill_start()';
COMMENT ON FUNCTION backfill.cancel(bigint) IS 'Entry point of backfill_cancel()';
COMMENT ON FUNCTION backfill.pause(bigint) IS 'Entry point of backfill_pause()';
COMMENT ON FUNCTION backfill.resume(bigint) IS 'Entry point of backfill_resume()';
COMMENT ON FUNCTION backfill.set(bigint, integer, integer, bigint) IS 'Entry point of backfill_set()';
COMMENT ON FUNCTION backfill.wait(bigint, double precision) IS 'Entry point of backfill_wait() (timeout in milliseconds)';
COMMENT ON FUNCTION backfill.max_slot_lag_bytes() IS 'backfill.max_slot_lag in bytes, for backfill_status';
COMMENT ON FUNCTION backfill.auto_resume() IS 'Whether pg_backfill is preloaded, so that running backfills resume after a restart';
COMMENT ON FUNCTION backfill.workers_running(bigint) IS 'Background workers of a backfill of this database running now';
COMMENT ON FUNCTION backfill.waiting_for(bigint) IS 'What the workers of a backfill wait for now (a row lock held by a pid), or NULL';
COMMENT ON FUNCTION backfill_message_valid(text, bigint) IS
'Whether a message is genuine: its auth tag verifies for the transaction id its decoder reported (needs SELECT on backfill.message_key)';

-- Nothing that starts, controls or reveals backfills is executable by PUBLIC: docs/security.md shows
-- the grants for operators and for consumers. The views' helpers stay executable by all.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA backfill FROM PUBLIC;
GRANT EXECUTE ON FUNCTION backfill.max_slot_lag_bytes(), backfill.auto_resume(), backfill.workers_running(bigint),
                          backfill.waiting_for(bigint), backfill.visible(name) TO PUBLIC;
