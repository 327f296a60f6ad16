-- pg_backfill 0.7.0 -> 0.8.0
\echo Use "ALTER EXTENSION pg_backfill UPDATE TO '0.8.0'" to load this file. \quit

-- (As every update script: the state tables first, in the order a worker's page takes them.)
LOCK TABLE backfill.job, backfill.job_table IN ACCESS EXCLUSIVE MODE;
