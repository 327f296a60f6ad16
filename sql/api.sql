-- The public SQL surface: regclass arguments and named defaults, so that calls read well in
-- psql and in migration scripts. Each calls its entry point in schema backfill.

CREATE FUNCTION backfill_estimate(tables regclass[], batch_size integer DEFAULT 1000)
RETURNS TABLE (table_name regclass, eligible boolean, reason text, key_columns name[],
               rows_estimated bigint, bytes_estimated bigint, pages bigint)
LANGUAGE sql VOLATILE
AS $$ SELECT e.table_name::regclass, e.eligible, e.reason, e.key_columns::name[],
             e.rows_estimated, e.bytes_estimated, e.pages
        FROM backfill.estimate(tables::oid[], batch_size) e $$;
COMMENT ON FUNCTION backfill_estimate(regclass[], integer) IS
'For each table: whether it can be backfilled (and why not), its key, and the rows, message bytes and pages a backfill would deliver. Uses statistics and a small sample, never a full scan.';

CREATE FUNCTION backfill_estimate(table_name regclass, batch_size integer DEFAULT 1000)
RETURNS TABLE (table_name regclass, eligible boolean, reason text, key_columns name[],
               rows_estimated bigint, bytes_estimated bigint, pages bigint)
LANGUAGE sql VOLATILE
AS $$ SELECT * FROM backfill_estimate(ARRAY[table_name], batch_size) $$;
COMMENT ON FUNCTION backfill_estimate(regclass, integer) IS 'backfill_estimate() of one table';

-- A quoted table name is of unknown type, which regclass and regclass[] would both accept:
-- this form takes it, so that backfill_estimate('public.orders') just works.
CREATE FUNCTION backfill_estimate(table_name text, batch_size integer DEFAULT 1000)
RETURNS TABLE (table_name regclass, eligible boolean, reason text, key_columns name[],
               rows_estimated bigint, bytes_estimated bigint, pages bigint)
LANGUAGE sql VOLATILE
AS $$ SELECT * FROM backfill_estimate(ARRAY[table_name::regclass], batch_size) $$;
COMMENT ON FUNCTION backfill_estimate(text, integer) IS 'backfill_estimate() of one table, by name';

CREATE FUNCTION backfill_start(tables regclass[], confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.start(tables::oid[], confirm, batch_size, rows_per_second, slot::text, publication::text, max_lag) $$;
COMMENT ON FUNCTION backfill_start(regclass[], boolean, integer, integer, name, name, bigint) IS
'Starts a backfill of the tables (all or nothing) and returns its id. Without confirm => true it starts nothing and reports the estimate.';

CREATE FUNCTION backfill_start(table_name regclass, confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.start(ARRAY[table_name]::oid[], confirm, batch_size, rows_per_second, slot::text, publication::text, max_lag) $$;
COMMENT ON FUNCTION backfill_start(regclass, boolean, integer, integer, name, name, bigint) IS 'backfill_start() of one table';

-- See backfill_estimate(text): makes backfill_start('public.orders', confirm => true) resolve.
CREATE FUNCTION backfill_start(table_name text, confirm boolean DEFAULT false, batch_size integer DEFAULT 1000,
                               rows_per_second integer DEFAULT NULL, slot name DEFAULT NULL,
                               publication name DEFAULT NULL, max_lag bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.start(ARRAY[table_name::regclass]::oid[], confirm, batch_size, rows_per_second, slot::text, publication::text, max_lag) $$;
COMMENT ON FUNCTION backfill_start(text, boolean, integer, integer, name, name, bigint) IS 'backfill_start() of one table, by name';

CREATE FUNCTION backfill_cancel(id bigint)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.cancel(id) $$;
COMMENT ON FUNCTION backfill_cancel(bigint) IS
'Stops a running backfill at its next page; what it delivered stays delivered, its state becomes cancelled.';

CREATE FUNCTION backfill_pause(id bigint)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.pause(id) $$;
COMMENT ON FUNCTION backfill_pause(bigint) IS
'Pauses a running backfill at its next page: its worker exits, holding no lock and no transaction. backfill_resume() continues it.';

CREATE FUNCTION backfill_resume(id bigint)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.resume(id) $$;
COMMENT ON FUNCTION backfill_resume(bigint) IS
'Continues a paused or failed backfill from its cursor, with a new worker.';

CREATE FUNCTION backfill_set(id bigint, batch_size integer DEFAULT NULL, rows_per_second integer DEFAULT NULL,
                             max_lag bigint DEFAULT NULL)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.set(id, batch_size, rows_per_second, max_lag) $$;
COMMENT ON FUNCTION backfill_set(bigint, integer, integer, bigint) IS
'Changes the pacing of a running or paused backfill (applied at its next page). NULL keeps a value; 0 removes a limit.';

CREATE FUNCTION backfill_wait(id bigint, timeout interval DEFAULT NULL)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$ SELECT backfill.wait(id, extract(epoch FROM timeout)::float8 * 1000) $$;
COMMENT ON FUNCTION backfill_wait(bigint, interval) IS
'Waits until the backfill is done and, with a slot, delivered (true) or the timeout passes (false); an error if it fails or is cancelled.';
