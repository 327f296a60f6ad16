-- pg_backfill 0.6.0 -> 0.7.0: a backfill for a slot records which slot of that name it is for
-- (a slot dropped and created again under the same name fails it), and backfill.row_hash() is
-- STABLE (an enum label it reads can be renamed). The row hash now follows SQL equality for
-- floats (one NaN, -0 as 0) and reads arrays and composites element by element: checksums of
-- tables with such columns differ from 0.6.0's, and a comparison refuses a server of the other.
\echo Use "ALTER EXTENSION pg_backfill UPDATE TO '0.7.0'" to load this file. \quit

-- (As every update script: the state tables first, in the order a worker's page takes them.)
LOCK TABLE backfill.job, backfill.job_table IN ACCESS EXCLUSIVE MODE;

ALTER TABLE backfill.job ADD COLUMN slot_identity text;
COMMENT ON COLUMN backfill.job.slot_identity IS 'Which slot of that name it was when the backfill started (its directory''s inode and birth time): a slot dropped and created again fails the backfill';

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
