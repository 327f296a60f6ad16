-- pg_backfill 0.5.0 -> 0.6.0: the aggregate level of backfill_checksum() and
-- backfill_compare() (per column its NULLs, and an exact sum or its least and greatest value).
-- The count level now counts each range by a scan of the key's index; no object changes for it.
-- The row hash is now XXH3-64 (was SipHash-2-4) of the same bytes but jsonb's, which are now
-- the tokens of a walk of the document: checksums of 0.5.0 and 0.6.0 differ, and a comparison
-- refuses a remote server whose pg_backfill hashes rows otherwise.
-- What changed for a DBA: CHANGELOG.md, section 0.6.0.
\echo Use "ALTER EXTENSION pg_backfill UPDATE TO '0.6.0'" to load this file. \quit

-- (As every update script: the state tables first, in the order a worker's page takes them.)
LOCK TABLE backfill.job, backfill.job_table IN ACCESS EXCLUSIVE MODE;

COMMENT ON FUNCTION backfill_checksum(regclass, integer, text, jsonb) IS
'One row per key range of the table: its bounds, row count and checksum (level count, aggregate or hash), as the caller may read it; bounds => the ranges of another checksum, to compare two tables over identical ranges.';

COMMENT ON FUNCTION backfill.row_hash(anyelement) IS 'A table row''s 64-bit hash over its columns'' binary send formats (XXH3-64; jsonb as the tokens of a walk of it), for backfill_checksum()';
