-- pg_backfill 0.9.0 -> 0.10.0. What changed for a DBA: CHANGELOG.md, section 0.10.0.
\echo Use "ALTER EXTENSION pg_backfill UPDATE TO '0.10.0'" to load this file. \quit

-- pg_monitor sees counts, rates and SQLSTATEs of every backfill, but key values, filters
-- and errors' texts only where it may SELECT the table (as any role; superusers see all).
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
       CASE WHEN v.countable AND j.state = 'running' AND r.rows_per_second OPERATOR(pg_catalog.>) 0
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
CREATE OR REPLACE VIEW backfill_errors WITH (security_barrier) AS
SELECT e.job_id AS backfill_id,
       e.occurred_at,
       e.table_name,
       CASE WHEN v.readable THEN e.stopped_after_key END AS stopped_after_key,
       CASE WHEN v.countable THEN e.sqlstate END AS sqlstate,
       CASE WHEN v.readable THEN e.message END AS message,
       CASE WHEN v.readable THEN e.detail END AS detail
  FROM backfill.job_error e
  JOIN backfill.job j ON j.id = e.job_id
 CROSS JOIN LATERAL (SELECT r.readable, backfill.may_act_as(CURRENT_USER, 'pg_monitor') OR r.readable AS countable
                       FROM (SELECT coalesce(pg_catalog.has_table_privilege(e.relid, 'SELECT'), false)
                                    OR coalesce((SELECT u.rolsuper FROM pg_catalog.pg_roles u WHERE u.rolname OPERATOR(pg_catalog.=) CURRENT_USER), false) AS readable) r) v
 WHERE backfill.visible(j.started_by);
CREATE OR REPLACE VIEW backfill_shards WITH (security_barrier) AS
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

-- The SQL wrappers are safe whatever the caller's search_path. Their bodies,
-- parsed with the caller's search_path at every call (or inlined into the caller's query), name
-- every type, operator and function with its schema (pg_catalog, backfill, @extschema@);
-- backfill_rotate_key() runs with search_path = pg_catalog, pg_temp; backfill_security_check()
-- names the types of backfill.start()'s signature with theirs.

CREATE OR REPLACE FUNCTION backfill_estimate(tables regclass[], batch_size integer DEFAULT 1000, filter text DEFAULT NULL,
                                  columns text[] DEFAULT NULL)
RETURNS TABLE (table_name regclass, eligible boolean, reason text, key_columns name[],
               rows_estimated bigint, bytes_estimated bigint, pages bigint)
LANGUAGE sql VOLATILE
AS $$ SELECT e.table_name::pg_catalog.regclass, e.eligible, e.reason, e.key_columns::pg_catalog.name[],
             e.rows_estimated, e.bytes_estimated, e.pages
        FROM backfill.estimate(tables::pg_catalog.oid[], batch_size, filter, columns) e $$;

CREATE OR REPLACE FUNCTION backfill_estimate(table_name regclass, batch_size integer DEFAULT 1000, filter text DEFAULT NULL,
                                  columns text[] DEFAULT NULL)
RETURNS TABLE (table_name regclass, eligible boolean, reason text, key_columns name[],
               rows_estimated bigint, bytes_estimated bigint, pages bigint)
LANGUAGE sql VOLATILE
AS $$ SELECT * FROM @extschema@.backfill_estimate(ARRAY[table_name], batch_size, filter, columns) $$;

CREATE OR REPLACE FUNCTION backfill_estimate(table_name text, batch_size integer DEFAULT 1000, filter text DEFAULT NULL,
                                  columns text[] DEFAULT NULL)
RETURNS TABLE (table_name regclass, eligible boolean, reason text, key_columns name[],
               rows_estimated bigint, bytes_estimated bigint, pages bigint)
LANGUAGE sql VOLATILE
AS $$ SELECT * FROM @extschema@.backfill_estimate(ARRAY[table_name::pg_catalog.regclass], batch_size, filter, columns) $$;

CREATE OR REPLACE FUNCTION backfill_start(tables regclass[], confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL,
                               parallel integer DEFAULT 1, max_replica_lag bigint DEFAULT NULL,
                               max_retained_wal bigint DEFAULT NULL, max_active_sessions integer DEFAULT NULL,
                               keys jsonb DEFAULT NULL, rows_per_message integer DEFAULT NULL,
                               filter text DEFAULT NULL, columns text[] DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.set_keys(backfill.set_source_limits(backfill.set_rows_per_message(backfill.start(
         backfill.refuse_node_options(tables::pg_catalog.oid[], keys, max_replica_lag, max_retained_wal, max_active_sessions, rows_per_message),
         confirm, batch_size, rows_per_second, slot::pg_catalog.text, publication::pg_catalog.text, max_lag, parallel, filter, columns), rows_per_message),
                                       max_replica_lag, max_retained_wal, max_active_sessions), keys) $$;

CREATE OR REPLACE FUNCTION backfill_start(table_name regclass, confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL,
                               parallel integer DEFAULT 1, max_replica_lag bigint DEFAULT NULL,
                               max_retained_wal bigint DEFAULT NULL, max_active_sessions integer DEFAULT NULL,
                               keys jsonb DEFAULT NULL, rows_per_message integer DEFAULT NULL,
                               filter text DEFAULT NULL, columns text[] DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.set_keys(backfill.set_source_limits(backfill.set_rows_per_message(backfill.start(
         backfill.refuse_node_options(ARRAY[table_name]::pg_catalog.oid[], keys, max_replica_lag, max_retained_wal, max_active_sessions, rows_per_message),
         confirm, batch_size, rows_per_second, slot::pg_catalog.text, publication::pg_catalog.text, max_lag, parallel, filter, columns), rows_per_message),
                                       max_replica_lag, max_retained_wal, max_active_sessions), keys) $$;

CREATE OR REPLACE FUNCTION backfill_start(table_name text, confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL,
                               parallel integer DEFAULT 1, max_replica_lag bigint DEFAULT NULL,
                               max_retained_wal bigint DEFAULT NULL, max_active_sessions integer DEFAULT NULL,
                               keys jsonb DEFAULT NULL, rows_per_message integer DEFAULT NULL,
                               filter text DEFAULT NULL, columns text[] DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.set_keys(backfill.set_source_limits(backfill.set_rows_per_message(backfill.start(
         backfill.refuse_node_options(ARRAY[table_name::pg_catalog.regclass]::pg_catalog.oid[], keys, max_replica_lag, max_retained_wal, max_active_sessions, rows_per_message),
         confirm, batch_size, rows_per_second, slot::pg_catalog.text, publication::pg_catalog.text, max_lag, parallel, filter, columns), rows_per_message),
                                       max_replica_lag, max_retained_wal, max_active_sessions), keys) $$;

CREATE OR REPLACE FUNCTION backfill_checksum(tbl regclass, ranges integer DEFAULT 1024, level text DEFAULT 'hash',
                                  bounds jsonb DEFAULT NULL, columns text[] DEFAULT NULL)
RETURNS TABLE (range integer, lower jsonb, upper jsonb, rows bigint, checksum text)
LANGUAGE sql VOLATILE
AS $$ SELECT * FROM backfill.checksum(tbl::pg_catalog.oid, ranges, level, bounds, columns) $$;

CREATE OR REPLACE FUNCTION backfill_compare(source regclass, target regclass, level text DEFAULT 'hash',
                                 passes integer DEFAULT 3, slot name DEFAULT NULL, columns text[] DEFAULT NULL)
RETURNS TABLE (key jsonb, status text)
LANGUAGE sql VOLATILE
AS $$ SELECT * FROM backfill.compare(source::pg_catalog.oid, target::pg_catalog.oid, level, passes, slot::pg_catalog.text, columns) $$;

CREATE OR REPLACE FUNCTION backfill_repair(source regclass, target regclass, confirm boolean DEFAULT false,
                                level text DEFAULT 'hash', passes integer DEFAULT 3, slot name DEFAULT NULL,
                                batch_size integer DEFAULT 1000, columns text[] DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.repair(source::pg_catalog.oid, target::pg_catalog.oid, confirm, level, passes, slot::pg_catalog.text, batch_size, columns) $$;

CREATE OR REPLACE FUNCTION backfill_wait(id bigint, timeout interval DEFAULT NULL)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.wait(id, extract(epoch FROM timeout)::pg_catalog.float8 OPERATOR(pg_catalog.*) 1000) $$;

-- (backfill_rotate_key() and backfill_security_check(), qualified too, are replaced in the
-- message keys' section below, which changes them further.)

-- The message keys leave every decoded stream. Their bytes move from the
-- rows of backfill.message_key, which every test_decoding and wal2json slot and every FOR ALL
-- TABLES publication decoded, into sequences (see sql/catalog.sql); backfill.message_key becomes
-- a view of the same columns, which reads them for the roles granted SELECT on it. The keys
-- that were in the table were exposed already: docs/security.md says to rotate with
-- retire_old_keys once consumers have verified what is in flight.
CREATE FUNCTION backfill.revoke_from_all_but_owner(relation regclass) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    grantee oid;
BEGIN
    FOR grantee IN SELECT DISTINCT a.grantee FROM pg_class c, aclexplode(c.relacl) a
                    WHERE c.oid = relation AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('REVOKE ALL ON %s FROM %s', relation, CASE grantee WHEN 0 THEN 'PUBLIC' ELSE grantee::regrole::text END);
    END LOOP;
END
$$;
COMMENT ON FUNCTION backfill.revoke_from_all_but_owner(regclass) IS 'Takes back every privilege on a relation of the message keys from all but its owner';

CREATE TABLE backfill.message_key_store (
    id            integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at    timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    key_sequences oid[] NOT NULL CHECK (pg_catalog.cardinality(key_sequences) >= 4)
);
COMMENT ON TABLE backfill.message_key_store IS 'The message keys (read them through backfill.message_key): each key''s id and the sequences that hold its bytes, out of every decoded stream';
COMMENT ON COLUMN backfill.message_key_store.id IS 'Key id, carried in every tag (auth = "<id>:<hex>")';
COMMENT ON COLUMN backfill.message_key_store.created_at IS 'When the key was made (CREATE EXTENSION or backfill_rotate_key())';
COMMENT ON COLUMN backfill.message_key_store.key_sequences IS 'The sequences (their oids) that hold the key''s bytes, eight each (a bigint''s big-endian bytes), in order';
SELECT backfill.revoke_from_all_but_owner('backfill.message_key_store');

CREATE FUNCTION backfill.store_message_key(key_id integer, key bytea) RETURNS oid[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    key_owner regrole := (SELECT relowner FROM pg_class WHERE oid = 'backfill.message_key_store'::regclass);
    parts oid[] := '{}';
    part regclass;
BEGIN
    IF octet_length(key) < 32 OR octet_length(key) % 8 <> 0 THEN
        RAISE EXCEPTION 'message key % cannot be stored', key_id
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = format('It has %s bytes; a message key has a multiple of 8 bytes, at least 32.', octet_length(key)),
                  HINT = 'Make a new key instead: SELECT backfill_rotate_key(retire_old_keys => true);';
    END IF;
    FOR n IN 1 .. octet_length(key) / 8 LOOP
        EXECUTE format('CREATE SEQUENCE backfill.%I AS bigint MINVALUE -9223372036854775808 MAXVALUE 9223372036854775807',
                       format('message_key_%s_%s', key_id, n));
        part := format('backfill.%I', format('message_key_%s_%s', key_id, n))::regclass;
        -- The bytes go in by setval, never as START: pg_sequence, which every role may read,
        -- holds a sequence's start. (A bigint's range is exactly every 8 bytes.)
        PERFORM setval(part, ('x' || encode(substr(key, 8 * n - 7, 8), 'hex'))::bit(64)::bigint, true);
        EXECUTE format('ALTER SEQUENCE %s OWNER TO %s', part, key_owner);
        PERFORM backfill.revoke_from_all_but_owner(part);
        EXECUTE format('COMMENT ON SEQUENCE %s IS %L', part,
                       format('Bytes %s to %s of message key %s (backfill.message_key)', 8 * n - 7, 8 * n, key_id));
        IF NOT EXISTS (SELECT FROM pg_depend d
                        WHERE d.classid = 'pg_class'::regclass AND d.objid = part AND d.deptype = 'e') THEN
            EXECUTE format('ALTER EXTENSION pg_backfill ADD SEQUENCE %s', part);
        END IF;
        parts := parts || part::oid;
    END LOOP;
    RETURN parts;
END
$$;
COMMENT ON FUNCTION backfill.store_message_key(integer, bytea) IS 'Stores a message key''s bytes in sequences of its own; returns them';

CREATE FUNCTION backfill.make_message_key() RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    made integer := nextval(pg_get_serial_sequence('backfill.message_key_store', 'id')::regclass);
BEGIN
    INSERT INTO backfill.message_key_store (id, key_sequences) OVERRIDING SYSTEM VALUE
    VALUES (made, backfill.store_message_key(made, backfill.random_key()));
    RETURN made;
END
$$;
COMMENT ON FUNCTION backfill.make_message_key() IS 'Makes a new message key; returns its id';

-- The keys move, under their ids; new ids go on from the old table's.
INSERT INTO backfill.message_key_store (id, created_at, key_sequences) OVERRIDING SYSTEM VALUE
SELECT id, created_at, backfill.store_message_key(id, key) FROM backfill.message_key ORDER BY id;
SELECT pg_catalog.setval(pg_catalog.pg_get_serial_sequence('backfill.message_key_store', 'id'), s.last_value, s.is_called)
  FROM backfill.message_key_id_seq s;
CREATE TRIGGER discard_replicated_row BEFORE INSERT OR UPDATE OR DELETE ON backfill.message_key_store
    FOR EACH ROW EXECUTE FUNCTION backfill.discard_replicated_row();
ALTER TABLE backfill.message_key_store ENABLE REPLICA TRIGGER discard_replicated_row;

CREATE FUNCTION backfill."message_key_bytes"(
	"key_id" INT /* core::option::Option<i32> */
) RETURNS bytea /* core::option::Option<alloc::vec::Vec<u8>> */
STABLE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'message_key_bytes_wrapper';
COMMENT ON FUNCTION backfill.message_key_bytes(integer) IS 'A message key''s bytes, read from its sequences as the extension''s owner, for a caller that may SELECT backfill.message_key (its column key)';
REVOKE EXECUTE ON FUNCTION backfill.revoke_from_all_but_owner(regclass), backfill.store_message_key(integer, bytea),
                           backfill.make_message_key(), backfill.message_key_bytes(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION backfill.message_key_bytes(integer) TO PUBLIC;

-- The table becomes a view of the same name and columns; the roles granted the table (the
-- consumer grant of docs/security.md) are granted the view.
ALTER TABLE backfill.message_key RENAME TO message_key_before_0_10_0;
CREATE VIEW backfill.message_key AS
SELECT s.id, backfill.message_key_bytes(s.id) AS key, s.created_at
  FROM backfill.message_key_store s;
COMMENT ON VIEW backfill.message_key IS 'Keys of the messages'' authentication tags (HMAC-SHA256); the newest signs new messages, older ones still verify old messages. Readable only by the extension''s owner and the roles it grants.';
COMMENT ON COLUMN backfill.message_key.id IS 'Key id, carried in every tag (auth = "<id>:<hex>")';
COMMENT ON COLUMN backfill.message_key.key IS '32 random bytes';
COMMENT ON COLUMN backfill.message_key.created_at IS 'When the key was made (CREATE EXTENSION or backfill_rotate_key())';
SELECT backfill.revoke_from_all_but_owner('backfill.message_key');
DO $$
DECLARE
    granted record;
BEGIN
    FOR granted IN SELECT a.grantee, a.privilege_type, a.is_grantable
                     FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
                    WHERE c.oid OPERATOR(pg_catalog.=) 'backfill.message_key_before_0_10_0'::pg_catalog.regclass
                      AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
    LOOP
        EXECUTE pg_catalog.format('GRANT %s ON backfill.message_key TO %s%s', granted.privilege_type,
                                  CASE WHEN granted.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC' ELSE granted.grantee::pg_catalog.regrole::pg_catalog.text END,
                                  CASE WHEN granted.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$$;
DROP TABLE backfill.message_key_before_0_10_0;

CREATE OR REPLACE FUNCTION backfill_rotate_key(retire_old_keys boolean DEFAULT false)
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

-- backfill_security_check() also flags privileges on pg_backfill's sequences, which hold the keys.
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
-- The keys' bytes are in sequences of schema backfill that only their owner may read (a role
-- with SELECT or USAGE on one reads a part of a key; with UPDATE or USAGE it changes it).
SELECT 'pg_backfill''s sequences are accessible to other roles than their owner',
       pg_catalog.count(*) OPERATOR(pg_catalog.=) 0,
       'The message keys are kept in sequences of schema backfill: a role that can read them can forge messages that verify.',
       CASE WHEN pg_catalog.count(*) OPERATOR(pg_catalog.>) 0 THEN
       pg_catalog.format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA backfill FROM %s; SELECT backfill_rotate_key(retire_old_keys => true);',
                         pg_catalog.string_agg(DISTINCT CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC' ELSE a.grantee::pg_catalog.regrole::pg_catalog.text END, ', '))
       END
  FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
 WHERE c.relnamespace OPERATOR(pg_catalog.=) 'backfill'::pg_catalog.regnamespace
   AND c.relkind OPERATOR(pg_catalog.=) 'S' AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
UNION ALL
SELECT 'backfills can be started by PUBLIC',
       NOT pg_catalog.has_function_privilege('public', 'backfill.start(pg_catalog.oid[], boolean, integer, integer, pg_catalog.text, pg_catalog.text, bigint, integer, bigint, bigint, integer, pg_catalog.jsonb, integer, pg_catalog.text, pg_catalog.text[])', 'EXECUTE'),
       'Every role could start backfills of the tables it may update, and take background workers.',
       'REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA backfill FROM PUBLIC;'
$$;

-- A publication's row filter is the backfill's, recorded per table.
LOCK TABLE backfill.job, backfill.job_table IN ACCESS EXCLUSIVE MODE;
ALTER TABLE backfill.job_table ADD COLUMN publication_filter text;
COMMENT ON COLUMN backfill.job_table.publication_filter IS 'The row filter of the backfill''s publication for the table when it started (pg_get_expr of pg_publication_rel.prqual): only rows it is true for are delivered (AND the backfill''s own filter); a page stops the backfill when the publication''s filter is no longer this. NULL: none';

-- backfill_start() and backfill_set() each call one entry point with every option (the
-- request is checked whole before anything is written, and recorded with one INSERT). The entry
-- points of 0.9.0 stay, for its SQL, until ALTER EXTENSION UPDATE.
CREATE  FUNCTION backfill."start"(
	"tables" oid[], /* :: std :: option :: Option < Vec < Option < pg_sys :: Oid > > > */
	"confirm" bool, /* Option < bool > */
	"batch_size" INT, /* Option < i32 > */
	"rows_per_second" INT, /* Option < i32 > */
	"slot" text, /* Option < Text > */
	"publication" text, /* Option < Text > */
	"max_lag" bigint, /* Option < i64 > */
	"parallel" INT, /* Option < i32 > */
	"max_replica_lag" bigint, /* Option < i64 > */
	"max_retained_wal" bigint, /* Option < i64 > */
	"max_active_sessions" INT, /* Option < i32 > */
	"keys" jsonb, /* Option < JsonB > */
	"rows_per_message" INT, /* Option < i32 > */
	"filter" text, /* Option < Text > */
	"columns" text[] /* :: std :: option :: Option < Vec < Option < Text > > > */
) RETURNS bigint /* i64 */
 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'start_every_option_wrapper';
CREATE  FUNCTION backfill."set"(
	"id" bigint, /* Option < i64 > */
	"batch_size" INT, /* Option < i32 > */
	"rows_per_second" INT, /* Option < i32 > */
	"max_lag" bigint, /* Option < i64 > */
	"max_replica_lag" bigint, /* Option < i64 > */
	"max_retained_wal" bigint, /* Option < i64 > */
	"max_active_sessions" INT /* Option < i32 > */
) RETURNS bool /* bool */
 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'set_every_option_wrapper';
REVOKE EXECUTE ON FUNCTION
    backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer, bigint, bigint, integer, jsonb, integer, text, text[]),
    backfill.set(bigint, integer, integer, bigint, bigint, bigint, integer)
  FROM PUBLIC;
COMMENT ON FUNCTION backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer, bigint, bigint, integer, jsonb, integer, text, text[]) IS 'Entry point of backfill_start(): every option, one call';
COMMENT ON FUNCTION backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer, text, text[]) IS 'Entry point of backfill_start() in 0.9.0 (its SQL chains the other options): the SQL of that version calls it until ALTER EXTENSION UPDATE';
COMMENT ON FUNCTION backfill.refuse_node_options(oid[], jsonb, bigint, bigint, integer, integer) IS 'Part of backfill_start() in 0.9.0: refuses the options a backfill of a Citus distributed table does not pass on to its nodes; returns the tables';
COMMENT ON FUNCTION backfill.set(bigint, integer, integer, bigint, bigint, bigint, integer) IS 'Entry point of backfill_set(): every option, one call';
COMMENT ON FUNCTION backfill.set(bigint, integer, integer, bigint) IS 'Entry point of backfill_set() in 0.9.0 and before (pacing; its SQL chains backfill.set_source_limits()): that SQL calls it until ALTER EXTENSION UPDATE';
COMMENT ON FUNCTION backfill.set_source_limits(bigint, bigint, bigint, integer) IS 'The back-pressure options of backfill_start() and backfill_set() in the SQL of 0.9.0 and before, which calls it until ALTER EXTENSION UPDATE; returns the backfill''s id';
COMMENT ON FUNCTION backfill.set_keys(bigint, jsonb) IS 'backfill_start()''s keys in the SQL of 0.9.0 and before, which calls it until ALTER EXTENSION UPDATE; returns the backfill''s id';
COMMENT ON FUNCTION backfill.set_rows_per_message(bigint, integer) IS 'backfill_start()''s rows_per_message in the SQL of 0.9.0, which calls it until ALTER EXTENSION UPDATE; returns the backfill''s id';

-- Who could execute an old entry point may execute its successor (as in 0.8.0--0.9.0).
DO $$
DECLARE
    kept record;
BEGIN
    FOR kept IN
        SELECT DISTINCT g.successor, a.grantee, r.rolname, a.is_grantable
          FROM (VALUES ('backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer, text, text[])',
                        'backfill.start(oid[], boolean, integer, integer, text, text, bigint, integer, bigint, bigint, integer, jsonb, integer, text, text[])'),
                       ('backfill.set(bigint, integer, integer, bigint)',
                        'backfill.set(bigint, integer, integer, bigint, bigint, bigint, integer)'))
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

CREATE OR REPLACE FUNCTION backfill_start(tables regclass[] DEFAULT NULL, confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
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
CREATE OR REPLACE FUNCTION backfill_start(table_name regclass, confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
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
CREATE OR REPLACE FUNCTION backfill_start(table_name text, confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
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
CREATE OR REPLACE FUNCTION backfill_set(id bigint, batch_size integer DEFAULT NULL, rows_per_second integer DEFAULT NULL,
                             max_lag bigint DEFAULT NULL, max_replica_lag bigint DEFAULT NULL,
                             max_retained_wal bigint DEFAULT NULL, max_active_sessions integer DEFAULT NULL)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.set(id, batch_size, rows_per_second, max_lag, max_replica_lag, max_retained_wal, max_active_sessions) $$;

-- backfill_security_check()'s items state what should hold, so
-- that ok = t reads the right way round; its details say why (the REVOKE of
-- pg_logical_emit_message is per database; backfill.start() is what backfill_start() wraps), and
-- the fix for PUBLIC's start revokes backfill.start() alone, leaving the views' helpers.
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
SELECT 'backfills cannot be started by PUBLIC',
       NOT pg_catalog.has_function_privilege('public', 'backfill.start(pg_catalog.oid[], boolean, integer, integer, pg_catalog.text, pg_catalog.text, bigint, integer, bigint, bigint, integer, pg_catalog.jsonb, integer, pg_catalog.text, pg_catalog.text[])', 'EXECUTE'),
       'backfill_start() is a wrapper of backfill.start(), which does the work and checks no grant of its own: a role that may execute backfill.start() starts backfills of the tables it may update, and takes background workers, whatever its grants on backfill_start(). (The other functions of schema backfill that PUBLIC may execute are the views'' helpers, which start nothing.)',
       'REVOKE EXECUTE ON FUNCTION backfill.start(pg_catalog.oid[], boolean, integer, integer, pg_catalog.text, pg_catalog.text, bigint, integer, bigint, bigint, integer, pg_catalog.jsonb, integer, pg_catalog.text, pg_catalog.text[]) FROM PUBLIC;'
$$;
COMMENT ON FUNCTION backfill_security_check() IS
'Checks the privileges that keep the message stream trustworthy: each row states what should hold, ok says whether it does, and a row that is not ok has the statement that fixes it.';

-- Progress the way PostgreSQL shows its own: backfill_progress, one row per running backfill worker
-- of the cluster, from shared memory (the library keeps it when preloaded), with its function.
CREATE FUNCTION backfill."progress"() RETURNS TABLE (
	"pid" INT,  /* i32 */
	"datid" oid,  /* pg_sys :: Oid */
	"backfill_id" bigint,  /* i64 */
	"worker" INT,  /* i32 */
	"relid" oid,  /* Option < pg_sys :: Oid > */
	"position" INT,  /* Option < i32 > */
	"phase" TEXT,  /* & '_ str */
	"rows_total" bigint,  /* i64 */
	"rows_done" bigint,  /* i64 */
	"bytes_done" bigint,  /* i64 */
	"pages_done" bigint,  /* i64 */
	"started_by" TEXT,  /* Option < String > */
	"started_at" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"phase_since" timestamp with time zone  /* Option < TimestampWithTimeZone > */
)
STRICT VOLATILE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'progress_wrapper';
-- As a fresh install has it: revoked from PUBLIC with every function of the schema, then granted.
REVOKE EXECUTE ON FUNCTION backfill.progress() FROM PUBLIC;
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
GRANT SELECT ON backfill_progress TO PUBLIC;
COMMENT ON FUNCTION backfill.progress() IS 'Every running backfill worker of the cluster the caller may see, from shared memory, for backfill_progress';
-- Executable by all, as the other views' helpers: it shows only what backfill_progress shows.
GRANT EXECUTE ON FUNCTION backfill.progress() TO PUBLIC;

-- For the DBA's routine: backfill_purge(); backfill_cancel() of a failed
-- backfill; backfill_compare() and backfill_repair() with slot => '' (none), never the slot of a
-- cancelled or failed backfill; "Backfill 12 is running" for one.
CREATE  FUNCTION backfill."purge"(
	"older_than" interval /* core::option::Option<pgrx::datum::interval::Interval> */
) RETURNS bigint /* i64 */
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'purge_wrapper';

CREATE FUNCTION backfill_purge(older_than interval)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.purge(older_than) $$;
COMMENT ON FUNCTION backfill_purge(interval) IS
'Deletes the backfills that ended (done or cancelled) more than older_than ago, among those the caller may control, with their tables, keys, progress and errors; returns how many. Failed ones stay until resumed or cancelled.';
REVOKE EXECUTE ON FUNCTION backfill.purge(interval), backfill_purge(interval) FROM PUBLIC;
COMMENT ON FUNCTION backfill.purge(interval) IS 'Entry point of backfill_purge()';
COMMENT ON FUNCTION backfill_compare(regclass, regclass, text, integer, name, text[]) IS
'The keys whose rows differ between source and target (a local table, or a postgres_fdw foreign table with pg_backfill on its server, through dblink): missing, extra, different, or unsettled (still changing on the source at the last pass). Re-checks each difference after the stream has caught up (the slot''s confirmed position): slot => NULL follows the slot of the source''s latest running, paused or done backfill, if one has a slot, slot => '''' none; a NOTICE names the slot followed. columns => compares only those columns'' values (a copy made with a column list).';
COMMENT ON FUNCTION backfill_repair(regclass, regclass, boolean, text, integer, name, integer, text[]) IS
'Compares source and target (backfill_compare()) and starts one backfill of exactly the differing keys of the source, through the slot the comparison followed (none with slot => ''''); returns its id, or NULL when nothing differs. Without confirm => true it starts nothing and reports what differs. columns => compares those columns and re-delivers them only.';
COMMENT ON FUNCTION backfill_cancel(bigint) IS
'Stops a running or paused backfill at its next page, or ends a failed one; what it delivered stays delivered, its state becomes cancelled.';
COMMENT ON FUNCTION backfill_resume(bigint) IS
'Continues a paused or failed backfill from its cursor, with a new worker (refused when its slot is gone: cancel it).';
CREATE OR REPLACE FUNCTION backfill.refuse_drop_while_running()
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

-- (backfill_status.time_left at the rate of the last 10 seconds.)
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
  LEFT JOIN pg_catalog.pg_replication_slots s ON s.slot_name = j.slot_name
  LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = j.worker_pid AND j.state IN ('running', 'paused')
 WHERE backfill.visible(j.started_by);
COMMENT ON COLUMN backfill_status.time_left IS 'The rows still expected (rows_estimated - rows_done) at the rate of the last 10 seconds (of the last minute, with one sample in those 10 seconds)';

-- Follows: backfill_follow() and backfill_unfollow(), their state tables, the view
-- backfill_follows and the event trigger that queues the tables added to a followed publication;
-- backfill_start() with no tables takes every table of its publication (tables DEFAULT NULL).
-- Follows (backfill_follow()): a publication followed into a slot, so that every table added to
-- the publication is backfilled into the slot by itself, and its queue. Not dumped, as the
-- backfills are not: a follow names a slot, which a dump does not carry either.
CREATE TABLE backfill.follow (
    id                     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    publication_name       name NOT NULL,
    slot_name              name NOT NULL,
    created_by             oid NOT NULL,
    created_at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    batch_size             integer NOT NULL CHECK (batch_size BETWEEN 1 AND 100000),
    rows_per_second        integer CHECK (rows_per_second > 0),
    parallel               integer NOT NULL DEFAULT 1 CHECK (parallel BETWEEN 1 AND 16),
    max_lag_bytes          bigint CHECK (max_lag_bytes > 0),
    max_replica_lag_bytes  bigint CHECK (max_replica_lag_bytes >= -1),
    max_retained_wal_bytes bigint CHECK (max_retained_wal_bytes >= -1),
    max_active_sessions    integer CHECK (max_active_sessions >= -1),
    rows_per_message       integer CHECK (rows_per_message BETWEEN 1 AND 100000),
    settings               jsonb NOT NULL DEFAULT '{}',
    known_tables           oid[] NOT NULL DEFAULT '{}',
    known_leaves           oid[] NOT NULL DEFAULT '{}',
    last_started_at        timestamptz,
    last_backfill_id       bigint,
    last_error             text,
    last_error_at          timestamptz,
    ended_at               timestamptz,
    end_reason             text
);
-- One live follow per publication and slot.
CREATE UNIQUE INDEX follow_live_idx ON backfill.follow (publication_name, slot_name) WHERE ended_at IS NULL;
COMMENT ON TABLE backfill.follow IS 'One row per follow (backfill_follow()): every table added to the publication is backfilled into the slot';
COMMENT ON COLUMN backfill.follow.id IS 'Follow id, returned by backfill_follow()';
COMMENT ON COLUMN backfill.follow.publication_name IS 'The publication followed';
COMMENT ON COLUMN backfill.follow.slot_name IS 'The slot its backfills are bound to, one at a time';
COMMENT ON COLUMN backfill.follow.created_by IS 'The role that created it (its oid): every backfill it starts is started as this role, with its rights';
COMMENT ON COLUMN backfill.follow.created_at IS 'When backfill_follow() was called';
COMMENT ON COLUMN backfill.follow.batch_size IS 'batch_size of the backfills it starts';
COMMENT ON COLUMN backfill.follow.rows_per_second IS 'rows_per_second of the backfills it starts; NULL for none';
COMMENT ON COLUMN backfill.follow.parallel IS 'parallel of the backfills it starts';
COMMENT ON COLUMN backfill.follow.max_lag_bytes IS 'max_lag of the backfills it starts; NULL: backfill.max_slot_lag';
COMMENT ON COLUMN backfill.follow.max_replica_lag_bytes IS 'max_replica_lag of the backfills it starts; NULL: the setting';
COMMENT ON COLUMN backfill.follow.max_retained_wal_bytes IS 'max_retained_wal of the backfills it starts; NULL: the setting';
COMMENT ON COLUMN backfill.follow.max_active_sessions IS 'max_active_sessions of the backfills it starts; NULL: the setting';
COMMENT ON COLUMN backfill.follow.rows_per_message IS 'rows_per_message of the backfills it starts; NULL: backfill.rows_per_message';
COMMENT ON COLUMN backfill.follow.settings IS 'The settings a start reads from its session (backfill.message_prefix, lock_mode, rows_per_message, default_max_active_sessions) as the session that created the follow had them: every backfill it starts, from whichever session or worker, starts with them';
COMMENT ON COLUMN backfill.follow.known_tables IS 'The relations the publication listed (pg_publication_tables) when the follow last looked';
COMMENT ON COLUMN backfill.follow.known_leaves IS 'Their leaves (a plain table is its own): a partition attached to a listed partitioned table is a new leaf';
COMMENT ON COLUMN backfill.follow.last_started_at IS 'When it last started a backfill';
COMMENT ON COLUMN backfill.follow.last_backfill_id IS 'The backfill it last started';
COMMENT ON COLUMN backfill.follow.last_error IS 'Why it last could not start a table''s backfill';
COMMENT ON COLUMN backfill.follow.last_error_at IS 'When';
COMMENT ON COLUMN backfill.follow.ended_at IS 'When it ended: backfill_unfollow(), or its publication or slot dropped';
COMMENT ON COLUMN backfill.follow.end_reason IS 'Why it ended';

CREATE TABLE backfill.follow_table (
    entry       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    follow_id   bigint NOT NULL REFERENCES backfill.follow (id) ON DELETE CASCADE,
    relid       oid NOT NULL,
    table_name  text NOT NULL,
    queued_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    state       text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'started', 'skipped', 'failed')),
    backfill_id bigint,
    reason      text,
    sqlstate    text,
    detail      text,
    settled_at  timestamptz
);
CREATE INDEX follow_table_follow_id_state_idx ON backfill.follow_table (follow_id, state);
COMMENT ON TABLE backfill.follow_table IS 'The queue of each follow: one row per table added to its publication, in the order added';
COMMENT ON COLUMN backfill.follow_table.entry IS 'Its place in the queue: the order added';
COMMENT ON COLUMN backfill.follow_table.follow_id IS 'The follow (backfill.follow.id)';
COMMENT ON COLUMN backfill.follow_table.relid IS 'The table added (its oid: a dropped table''s entry is skipped)';
COMMENT ON COLUMN backfill.follow_table.table_name IS 'Its name when it was added';
COMMENT ON COLUMN backfill.follow_table.queued_at IS 'When the statement that added it ran';
COMMENT ON COLUMN backfill.follow_table.state IS 'pending (waits for the slot), started (in backfill_id), skipped (needed none: removed from the publication or dropped before its turn, already being backfilled into the slot, or empty when added) or failed (could not be started: reason)';
COMMENT ON COLUMN backfill.follow_table.backfill_id IS 'The backfill that delivers it, once started';
COMMENT ON COLUMN backfill.follow_table.reason IS 'Why it was skipped, or the message of the error that failed it';
COMMENT ON COLUMN backfill.follow_table.sqlstate IS 'SQLSTATE of the error that failed it';
COMMENT ON COLUMN backfill.follow_table.detail IS 'The detail of that error, if any';
COMMENT ON COLUMN backfill.follow_table.settled_at IS 'When it was started, skipped or failed';
GRANT SELECT ON backfill.follow, backfill.follow_table TO pg_monitor;
DO $$
DECLARE
    state_table text;
BEGIN
    FOREACH state_table IN ARRAY ARRAY['follow', 'follow_table'] LOOP
        EXECUTE pg_catalog.format(
            'CREATE TRIGGER discard_replicated_row BEFORE INSERT OR UPDATE OR DELETE ON backfill.%I
                 FOR EACH ROW EXECUTE FUNCTION backfill.discard_replicated_row()', state_table);
        EXECUTE pg_catalog.format('ALTER TABLE backfill.%I ENABLE REPLICA TRIGGER discard_replicated_row', state_table);
    END LOOP;
END
$$;
CREATE  FUNCTION backfill."follow"(
	"publication" text, /* Option < Text > */
	"slot" text, /* Option < Text > */
	"batch_size" INT, /* Option < i32 > */
	"rows_per_second" INT, /* Option < i32 > */
	"parallel" INT, /* Option < i32 > */
	"max_lag" bigint, /* Option < i64 > */
	"max_replica_lag" bigint, /* Option < i64 > */
	"max_retained_wal" bigint, /* Option < i64 > */
	"max_active_sessions" INT, /* Option < i32 > */
	"rows_per_message" INT /* Option < i32 > */
) RETURNS bigint /* i64 */
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'follow_publication_wrapper';
CREATE  FUNCTION backfill."unfollow"(
	"publication" text, /* Option < Text > */
	"slot" text /* Option < Text > */
) RETURNS bool /* bool */
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'unfollow_wrapper';
CREATE  FUNCTION backfill."follow_ddl"() RETURNS void
STRICT
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'follow_ddl_wrapper';
REVOKE EXECUTE ON FUNCTION backfill.follow(text, text, integer, integer, integer, bigint, bigint, bigint, integer, integer),
                           backfill.unfollow(text, text) FROM PUBLIC;
COMMENT ON FUNCTION backfill.follow(text, text, integer, integer, integer, bigint, bigint, bigint, integer, integer) IS 'Entry point of backfill_follow()';
COMMENT ON FUNCTION backfill.unfollow(text, text) IS 'Entry point of backfill_unfollow()';
COMMENT ON FUNCTION backfill.follow_ddl() IS 'The event trigger''s work at the end of a statement that may have changed a followed publication''s tables';
-- Executable by PUBLIC: every role's DDL runs it, through the event trigger (sql/api.sql says
-- why). As a fresh install has it: revoked from PUBLIC with every function of the schema, then granted.
REVOKE EXECUTE ON FUNCTION backfill.follow_ddl() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION backfill.follow_ddl() TO PUBLIC;
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
  LEFT JOIN pg_catalog.pg_replication_slots s ON s.slot_name = f.slot_name
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
GRANT SELECT ON backfill_follows TO PUBLIC;
REVOKE EXECUTE ON FUNCTION backfill_follow(name, name, integer, integer, integer, bigint, bigint, bigint, integer, integer),
                           backfill_unfollow(name, name) FROM PUBLIC;

-- At the end of every statement that can add tables to a publication (or drop one, or a table),
-- each live follow's queue is brought up to the catalog, in the statement's transaction.
CREATE FUNCTION backfill.follow_publication_changes()
RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$ BEGIN PERFORM backfill.follow_ddl(); END $$;
REVOKE EXECUTE ON FUNCTION backfill.follow_publication_changes() FROM PUBLIC;
COMMENT ON FUNCTION backfill.follow_publication_changes() IS 'Event trigger: queues the tables a statement added to a followed publication, and starts what a free slot can take';
CREATE EVENT TRIGGER backfill_follow_publication_changes ON ddl_command_end
    WHEN TAG IN ('ALTER PUBLICATION', 'DROP PUBLICATION', 'ALTER TABLE', 'CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO',
                 'DROP TABLE')
    EXECUTE FUNCTION backfill.follow_publication_changes();

-- A table a follow could not start shows in backfill_errors too (follow_id, no backfill_id).
CREATE OR REPLACE VIEW backfill_errors WITH (security_barrier) AS
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

-- backfill.start_on_node(): the shape of shard_keys is checked before the start, so that an
-- argument error is never hidden by a wait for a worker (53400).
CREATE OR REPLACE FUNCTION backfill.start_on_node(tables regclass[], confirm boolean, batch_size integer,
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
