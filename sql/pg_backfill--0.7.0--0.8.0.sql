-- pg_backfill 0.7.0 -> 0.8.0: backfill_compare() and backfill_repair() of Citus distributed tables;
-- checksums and comparisons read a table as its owner, so backfill.row_hash() is executable by all.
\echo Use "ALTER EXTENSION pg_backfill UPDATE TO '0.8.0'" to load this file. \quit

-- (As every update script: the state tables first, in the order a worker's page takes them.)
LOCK TABLE backfill.job, backfill.job_table IN ACCESS EXCLUSIVE MODE;

-- backfill_repair() of a distributed table: each worker node's keyed backfill of its shards.
-- (As pgrx writes it into a fresh install's script, from src/api/keyed.rs.)
CREATE FUNCTION backfill."set_keys_of"(
	"id" bigint,
	"tbl" oid,
	"keys" jsonb
) RETURNS bigint
LANGUAGE c
AS 'MODULE_PATHNAME', 'set_keys_of_wrapper';
COMMENT ON FUNCTION backfill.set_keys_of(bigint, oid, jsonb) IS 'The keys of one table of a backfill started in this transaction (a worker node''s backfill of its shards, for backfill_repair() on the Citus coordinator); returns the backfill''s id';
REVOKE EXECUTE ON FUNCTION backfill.set_keys_of(bigint, oid, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION backfill.set_keys_of(bigint, oid, jsonb) TO PUBLIC;

DROP FUNCTION backfill.start_on_node(regclass[], boolean, integer, integer, name, name, bigint, integer);
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
-- It grants nothing backfill_start() does not: it runs as its caller, who needs EXECUTE on that.
REVOKE EXECUTE ON FUNCTION backfill.start_on_node(regclass[], boolean, integer, integer, name, name, bigint, integer, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION backfill.start_on_node(regclass[], boolean, integer, integer, name, name, bigint, integer, jsonb) TO PUBLIC;

-- A checksum or a comparison reads a table as its owner (its code, such as a cast to json of its
-- key's type, never runs as the superuser who checks it), who may hold no grant of pg_backfill's.
GRANT EXECUTE ON FUNCTION backfill.row_hash(anyelement) TO PUBLIC;
