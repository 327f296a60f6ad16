-- pg_backfill 0.10.0 -> 0.11.0. What changed for a DBA: CHANGELOG.md, section 0.11.0.
\echo Use "ALTER EXTENSION pg_backfill UPDATE TO '0.11.0'" to load this file. \quit

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
-- EXTENSION UPDATE, and the older signatures stay after it, each able to start a backfill.
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
