-- pg_backfill 0.2.0 -> 0.3.0:
-- - A subscription of a FOR ALL TABLES publication discards the state tables' rows (replica triggers).
-- - Waiting for the slot's consumer is no longer 'paused' with a 'waiting...' pause_reason: the
--   backfill stays running, and backfill_status.waiting_for says what it waits for.
\echo Use "ALTER EXTENSION pg_backfill UPDATE TO '0.3.0'" to load this file. \quit

-- A FOR ALL TABLES publication publishes these tables too: a native subscriber applies their
-- rows into tables of the same names, or stops ("relation backfill.job does not exist"). A
-- subscriber with the extension installed has the tables, and these triggers, which fire only
-- in a subscription's apply worker (session_replication_role = replica), discard the
-- publisher's rows there: the subscriber's backfills, ids and keys stay its own.
CREATE FUNCTION backfill.discard_replicated_row() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$ BEGIN RETURN NULL; END $$;
COMMENT ON FUNCTION backfill.discard_replicated_row() IS 'Trigger that discards the rows a subscription applies to pg_backfill''s state tables (replica triggers only)';
REVOKE ALL ON FUNCTION backfill.discard_replicated_row() FROM PUBLIC;
DO $$
DECLARE
    state_table text;
BEGIN
    FOREACH state_table IN ARRAY ARRAY['job', 'job_table', 'job_progress', 'message_key'] LOOP
        EXECUTE pg_catalog.format(
            'CREATE TRIGGER discard_replicated_row BEFORE INSERT OR UPDATE OR DELETE ON backfill.%I
                 FOR EACH ROW EXECUTE FUNCTION backfill.discard_replicated_row()', state_table);
        EXECUTE pg_catalog.format('ALTER TABLE backfill.%I ENABLE REPLICA TRIGGER discard_replicated_row', state_table);
    END LOOP;
END
$$;

-- A backfill that 0.2.0 paused while it waited for its consumer is running, as 0.3.0 has it.
-- (Its workers, if they still run 0.2.0's code, set and clear that pause themselves as before.)
UPDATE backfill.job SET state = 'running', pause_reason = NULL
 WHERE state = 'paused' AND pause_reason LIKE 'waiting%';
COMMENT ON COLUMN backfill.job.state IS 'running (also while it waits for its slot''s consumer), paused (by backfill_pause), done, cancelled or failed';
COMMENT ON COLUMN backfill.job.pause_reason IS 'Why a paused backfill is paused: by backfill_pause()';
COMMENT ON COLUMN backfill_status.state IS 'running (waiting_for says if it waits, and for what), paused (by backfill_pause), done, cancelled or failed';
COMMENT ON COLUMN backfill_status.pause_reason IS 'Why it is paused: by backfill_pause()';
COMMENT ON COLUMN backfill_status.waiting_for IS 'What a running backfill''s workers wait for now, if anything: a row lock held by another process (its pid), or the slot''s consumer (none connected, or lagging past max_lag_bytes)';
COMMENT ON FUNCTION backfill.waiting_for(bigint) IS 'What the workers of a backfill wait for now (a row lock held by a pid, or the slot''s consumer), or NULL';
