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
