-- pg_backfill 0.10.0 -> 0.11.0. What changed for a DBA: CHANGELOG.md, section 0.11.0.
\echo Use "ALTER EXTENSION pg_backfill UPDATE TO '0.11.0'" to load this file. \quit
