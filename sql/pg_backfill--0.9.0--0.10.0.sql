-- pg_backfill 0.9.0 -> 0.10.0: hostile pass 4 (issue 31).
\echo Use "ALTER EXTENSION pg_backfill UPDATE TO '0.10.0'" to load this file. \quit
