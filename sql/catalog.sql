-- pg_backfill state. The internal tables live in schema "backfill" and are written only by the
-- extension's functions and workers; users read the views backfill_status and backfill_tables.

CREATE SCHEMA backfill;
COMMENT ON SCHEMA backfill IS 'pg_backfill internal state; read it through the backfill_status and backfill_tables views';
-- Entry points live here (executable only by the roles granted them). The state tables are
-- read and written by the extension's functions acting as the extension's owner; users read the
-- views, which show each role its own backfills.
GRANT USAGE ON SCHEMA backfill TO PUBLIC;

CREATE TABLE backfill.job (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    state               text NOT NULL DEFAULT 'running'
                        CHECK (state IN ('running', 'paused', 'done', 'cancelled', 'failed')),
    started_by          name NOT NULL,
    batch_size          integer NOT NULL CHECK (batch_size > 0),
    rows_per_second     integer CHECK (rows_per_second > 0),
    parallel            integer NOT NULL DEFAULT 1 CHECK (parallel BETWEEN 1 AND 16),
    message_prefix      text NOT NULL,
    slot_name           name,
    publication_name    name,
    max_lag_bytes       bigint CHECK (max_lag_bytes > 0),
    pause_reason        text,
    watermark_lsn       pg_lsn,
    worker_pid          integer,
    started_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    launched_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at         timestamptz,
    last_error_sqlstate text,
    last_error          text,
    lock_mode           text NOT NULL DEFAULT 'auto' CHECK (lock_mode IN ('auto', 'rows', 'table')),
    max_replica_lag_bytes  bigint CHECK (max_replica_lag_bytes >= 0),
    max_retained_wal_bytes bigint CHECK (max_retained_wal_bytes >= 0),
    max_active_sessions    integer CHECK (max_active_sessions >= 0),
    slot_identity       text,
    rows_per_message    integer NOT NULL DEFAULT 1 CHECK (rows_per_message BETWEEN 1 AND 100000),
    row_filter          text
);
COMMENT ON TABLE backfill.job IS 'One row per backfill started with backfill_start()';
COMMENT ON COLUMN backfill.job.id IS 'Backfill id, returned by backfill_start() and carried in every message';
COMMENT ON COLUMN backfill.job.state IS 'running (also while it waits for its slot''s consumer), paused (by backfill_pause), done, cancelled or failed';
COMMENT ON COLUMN backfill.job.started_by IS 'Role that called backfill_start(); it or a member of it may cancel';
COMMENT ON COLUMN backfill.job.batch_size IS 'Rows per page (one page is one transaction)';
COMMENT ON COLUMN backfill.job.rows_per_second IS 'Pacing: most rows delivered per second, on average over a few seconds; NULL for no limit';
COMMENT ON COLUMN backfill.job.parallel IS 'Workers; each scans its own key range of every table';
COMMENT ON COLUMN backfill.job.message_prefix IS 'Prefix of the logical decoding messages of this backfill';
COMMENT ON COLUMN backfill.job.slot_name IS 'Logical replication slot of the consumer the backfill is for, if given';
COMMENT ON COLUMN backfill.job.slot_identity IS 'Which slot of that name it was when the backfill started (its directory''s inode and birth time): a slot dropped and created again fails the backfill';
COMMENT ON COLUMN backfill.job.rows_per_message IS 'Most rows per message: 1 sends a read message per row, more sends reads messages of up to this many rows (backfill.rows_per_message when it started, unless given)';
COMMENT ON COLUMN backfill.job.row_filter IS 'The filter given to backfill_start() (filter => ...): a boolean SQL expression over the table''s columns, run as the role that started it; only rows it is true for are delivered. NULL: every row';
COMMENT ON COLUMN backfill.job.publication_name IS 'Publication of that consumer, if given: every table is in it';
COMMENT ON COLUMN backfill.job.max_lag_bytes IS 'Back-pressure: the backfill waits while the slot lags more than this (NULL: backfill.max_slot_lag)';
COMMENT ON COLUMN backfill.job.max_replica_lag_bytes IS 'Back-pressure: pages wait while a physical standby replays more than this behind (NULL: backfill.max_replica_lag; 0: off)';
COMMENT ON COLUMN backfill.job.max_retained_wal_bytes IS 'Back-pressure: pages wait while a replication slot retains more WAL than this (NULL: backfill.max_retained_wal; 0: off)';
COMMENT ON COLUMN backfill.job.max_active_sessions IS 'Back-pressure: pages slow down while more client sessions than this are active (NULL: backfill.max_active_sessions; 0: off)';
COMMENT ON COLUMN backfill.job.pause_reason IS 'Why a paused backfill is paused: by backfill_pause()';
COMMENT ON COLUMN backfill.job.watermark_lsn IS 'WAL position after the last page: the stream holds every read once its consumer confirms past it';
COMMENT ON COLUMN backfill.job.worker_pid IS 'Process id of the background worker while one runs';
COMMENT ON COLUMN backfill.job.started_at IS 'When backfill_start() was called';
COMMENT ON COLUMN backfill.job.launched_at IS 'When its worker was last launched by backfill_start() or backfill_resume()';
COMMENT ON COLUMN backfill.job.finished_at IS 'When the backfill reached done, cancelled or failed (cleared by backfill_resume)';
COMMENT ON COLUMN backfill.job.last_error_sqlstate IS 'SQLSTATE of the error that failed the backfill';
COMMENT ON COLUMN backfill.job.lock_mode IS 'How its pages lock what they read: auto (the table when no writer is at it, else the rows), rows or table (backfill.lock_mode when it started)';
COMMENT ON COLUMN backfill.job.last_error IS 'Message, detail and place of the error that failed the backfill';

CREATE TABLE backfill.job_table (
    job_id          bigint NOT NULL REFERENCES backfill.job (id) ON DELETE CASCADE,
    position        integer NOT NULL,
    relid           regclass NOT NULL,
    part            integer NOT NULL DEFAULT 0,
    worker          integer NOT NULL DEFAULT 0,
    lower_bound     text[],
    key_columns     name[] NOT NULL,
    state           text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'running', 'done')),
    upper_bound     text[],
    cursor          text[],
    rows_estimated  bigint NOT NULL,
    rows_done       bigint NOT NULL DEFAULT 0,
    bytes_done      bigint NOT NULL DEFAULT 0,
    key_fraction_done float8,
    last_page_lsn   pg_lsn,
    started_at      timestamptz,
    finished_at     timestamptz,
    pages_table_locked bigint NOT NULL DEFAULT 0,
    pages_row_locked   bigint NOT NULL DEFAULT 0,
    column_list     text[],
    column_attnums  smallint[],
    publication_filter text,
    PRIMARY KEY (job_id, position)
);
CREATE INDEX ON backfill.job_table (relid);
COMMENT ON TABLE backfill.job_table IS 'One row per table (per key range, with parallel workers) of each backfill: its scan state and cursor';
COMMENT ON COLUMN backfill.job_table.position IS 'Order in which the backfill scans its tables and ranges';
COMMENT ON COLUMN backfill.job_table.part IS 'Key range of the table (0 when it is scanned whole)';
COMMENT ON COLUMN backfill.job_table.worker IS 'Worker that scans this range';
COMMENT ON COLUMN backfill.job_table.lower_bound IS 'Key after which the range starts (text form); NULL from the start of the table';
COMMENT ON COLUMN backfill.job_table.relid IS 'The table';
COMMENT ON COLUMN backfill.job_table.column_list IS 'The columns its reads carry, in the table''s order (columns => ..., or the publication''s column list); NULL: every column';
COMMENT ON COLUMN backfill.job_table.column_attnums IS 'The attribute numbers of column_list''s columns when it started: a listed column renamed, or dropped and added again, is another column and stops it';
COMMENT ON COLUMN backfill.job_table.publication_filter IS 'The row filter of the backfill''s publication for the table when it started (pg_get_expr of pg_publication_rel.prqual): only rows it is true for are delivered (AND the backfill''s own filter); a page stops the backfill when the publication''s filter is no longer this. NULL: none';
COMMENT ON COLUMN backfill.job_table.key_columns IS 'Columns of the primary key or replica identity index the scan is ordered by';
COMMENT ON COLUMN backfill.job_table.state IS 'pending (not started), running (scan under way) or done (end marker sent)';
COMMENT ON COLUMN backfill.job_table.upper_bound IS 'Greatest key when the scan started (text form); rows inserted above it arrive through the stream';
COMMENT ON COLUMN backfill.job_table.cursor IS 'Last key delivered (text form), committed with the messages of its page';
COMMENT ON COLUMN backfill.job_table.rows_estimated IS 'Planner estimate of the rows when the backfill started';
COMMENT ON COLUMN backfill.job_table.rows_done IS 'Read messages delivered';
COMMENT ON COLUMN backfill.job_table.bytes_done IS 'Bytes of read message payload delivered';
COMMENT ON COLUMN backfill.job_table.key_fraction_done IS 'Share of the key range up to the upper bound already scanned, from the key''s histogram in pg_stats';
COMMENT ON COLUMN backfill.job_table.last_page_lsn IS 'WAL position at the end of the table''s last delivered page; its commit record follows';
COMMENT ON COLUMN backfill.job_table.started_at IS 'When the scan started (upper bound fixed, start marker sent)';
COMMENT ON COLUMN backfill.job_table.finished_at IS 'When the scan ended (end marker sent)';
COMMENT ON COLUMN backfill.job_table.pages_table_locked IS 'Pages that held the table in SHARE mode (no row locks written)';
COMMENT ON COLUMN backfill.job_table.pages_row_locked IS 'Pages that locked their rows FOR SHARE';

CREATE TABLE backfill.job_key (
    job_id   bigint NOT NULL,
    position integer NOT NULL,
    ordinal  integer NOT NULL,
    key      text[] NOT NULL,
    key_json text[] NOT NULL,
    PRIMARY KEY (job_id, position, ordinal),
    FOREIGN KEY (job_id, position) REFERENCES backfill.job_table (job_id, position) ON DELETE CASCADE
);
COMMENT ON TABLE backfill.job_key IS 'The keys a keyed backfill (backfill_start(keys => ...), backfill_repair()) delivers, in key order';
COMMENT ON COLUMN backfill.job_key.job_id IS 'The backfill (backfill.job.id)';
COMMENT ON COLUMN backfill.job_key.position IS 'Its table (backfill.job_table.position)';
COMMENT ON COLUMN backfill.job_key.ordinal IS 'The key''s place in key order, from 1: the keys up to rows_done are delivered';
COMMENT ON COLUMN backfill.job_key.key IS 'The key''s values, text form';
COMMENT ON COLUMN backfill.job_key.key_json IS 'The key''s values as JSON, as messages carry them';

CREATE TABLE backfill.job_progress (
    job_id    bigint NOT NULL REFERENCES backfill.job (id) ON DELETE CASCADE,
    at        timestamptz NOT NULL,
    rows_done bigint NOT NULL,
    PRIMARY KEY (job_id, at)
);
COMMENT ON TABLE backfill.job_progress IS 'Progress samples of running backfills (the last two minutes), for their recent rate';
COMMENT ON COLUMN backfill.job_table.job_id IS 'The backfill (backfill.job.id)';
COMMENT ON COLUMN backfill.job_progress.job_id IS 'The backfill (backfill.job.id)';
COMMENT ON COLUMN backfill.job_progress.at IS 'When the sample was taken';
COMMENT ON COLUMN backfill.job_progress.rows_done IS 'Rows the backfill had delivered then, over all its tables';

CREATE TABLE backfill.job_error (
    job_id            bigint NOT NULL REFERENCES backfill.job (id) ON DELETE CASCADE,
    occurred_at       timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    relid             oid,
    table_name        text,
    stopped_after_key text,
    sqlstate          text NOT NULL,
    message           text NOT NULL,
    detail            text
);
CREATE INDEX job_error_job_id_occurred_at_idx ON backfill.job_error (job_id, occurred_at);
COMMENT ON TABLE backfill.job_error IS 'Every error that failed a backfill, oldest first (last_error shows the latest only, and a resume clears it)';
COMMENT ON COLUMN backfill.job_error.job_id IS 'The backfill (backfill.job.id)';
COMMENT ON COLUMN backfill.job_error.occurred_at IS 'When it failed';
COMMENT ON COLUMN backfill.job_error.relid IS 'The table it was scanning, if any';
COMMENT ON COLUMN backfill.job_error.table_name IS 'That table''s name when it failed';
COMMENT ON COLUMN backfill.job_error.stopped_after_key IS 'The last key it had delivered of that table ((start) for none)';
COMMENT ON COLUMN backfill.job_error.sqlstate IS 'SQLSTATE of the error';
COMMENT ON COLUMN backfill.job_error.message IS 'The error''s message';
COMMENT ON COLUMN backfill.job_error.detail IS 'The error''s detail, if any';
GRANT SELECT ON backfill.job_error TO pg_monitor;

-- The state is not dumped. A dump is restored into another database: a cursor there would
-- claim rows delivered through WAL that database never wrote, a restored running backfill
-- would block its tables and resume from that cursor, and its id sequence would start over.
-- A restored database starts with no backfills.

-- Key values, errors and counts of every table: for the extension's owner and pg_monitor only.
GRANT SELECT ON backfill.job, backfill.job_table, backfill.job_progress, backfill.job_key TO pg_monitor;

-- 32 bytes from four random UUIDs (pg_strong_random; 488 random bits), hashed.
CREATE FUNCTION backfill.random_key() RETURNS bytea
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$ SELECT sha256(convert_to(gen_random_uuid()::text || gen_random_uuid()::text ||
                               gen_random_uuid()::text || gen_random_uuid()::text, 'UTF8')) $$;
COMMENT ON FUNCTION backfill.random_key() IS 'A new message key: 32 random bytes';

-- Only the owner of one of the relations that hold or show the message keys uses it: the
-- privileges that ALTER DEFAULT PRIVILEGES gave it when it was made are taken back
-- (docs/security.md shows the grant for consumers).
CREATE FUNCTION backfill.revoke_from_all_but_owner(relation regclass) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    grantee oid;
BEGIN
    FOR grantee IN SELECT DISTINCT a.grantee FROM pg_class c, aclexplode(c.relacl) a
                    WHERE c.oid = relation AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('REVOKE ALL ON %s FROM %s', relation, CASE grantee WHEN 0 THEN 'PUBLIC' ELSE grantee::regrole::text END);
    END LOOP;
END
$$;
COMMENT ON FUNCTION backfill.revoke_from_all_but_owner(regclass) IS 'Takes back every privilege on a relation of the message keys from all but its owner';

-- The message keys. A key's bytes are kept in sequences, eight in each (a bigint), never in a
-- table's rows: logical decoding decodes the rows of every table, pg_backfill's own included,
-- into every test_decoding and wal2json slot (they have no publication) and every FOR ALL TABLES
-- publication, and whoever read a key there could forge messages that verify. No decoder of
-- PostgreSQL 15 to 18 decodes a sequence's value (pg_largeobject, a catalog, would not be
-- decoded either, but pg_dump dumps large objects). Sequences are WAL-logged, so a standby has
-- the keys and verifies after a failover; pg_upgrade carries their values; as members of the
-- extension pg_dump leaves them out; only their owner, the extension's owner, reads them.
-- Consumers read the keys through the view backfill.message_key (sql/api.sql). The sequences
-- are named by oid, not regclass: a native subscriber of a FOR ALL TABLES publication receives
-- these rows, and regclass's input would look the publisher's sequences up there, and fail,
-- before the trigger below discards the row.
CREATE TABLE backfill.message_key_store (
    id            integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at    timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    key_sequences oid[] NOT NULL CHECK (pg_catalog.cardinality(key_sequences) >= 4)
);
COMMENT ON TABLE backfill.message_key_store IS 'The message keys (read them through backfill.message_key): each key''s id and the sequences that hold its bytes, out of every decoded stream';
COMMENT ON COLUMN backfill.message_key_store.id IS 'Key id, carried in every tag (auth = "<id>:<hex>")';
COMMENT ON COLUMN backfill.message_key_store.created_at IS 'When the key was made (CREATE EXTENSION or backfill_rotate_key())';
COMMENT ON COLUMN backfill.message_key_store.key_sequences IS 'The sequences (their oids) that hold the key''s bytes, eight each (a bigint''s big-endian bytes), in order';
SELECT backfill.revoke_from_all_but_owner('backfill.message_key_store');

-- Stores a key's bytes in new sequences backfill.message_key_<id>_<n>, members of the extension
-- (at CREATE EXTENSION and its updates they are already), and returns them.
CREATE FUNCTION backfill.store_message_key(key_id integer, key bytea) RETURNS oid[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    key_owner regrole := (SELECT relowner FROM pg_class WHERE oid = 'backfill.message_key_store'::regclass);
    parts oid[] := '{}';
    part regclass;
BEGIN
    IF octet_length(key) < 32 OR octet_length(key) % 8 <> 0 THEN
        RAISE EXCEPTION 'message key % cannot be stored', key_id
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = format('It has %s bytes; a message key has a multiple of 8 bytes, at least 32.', octet_length(key)),
                  HINT = 'Make a new key instead: SELECT backfill_rotate_key(retire_old_keys => true);';
    END IF;
    FOR n IN 1 .. octet_length(key) / 8 LOOP
        EXECUTE format('CREATE SEQUENCE backfill.%I AS bigint MINVALUE -9223372036854775808 MAXVALUE 9223372036854775807',
                       format('message_key_%s_%s', key_id, n));
        part := format('backfill.%I', format('message_key_%s_%s', key_id, n))::regclass;
        -- The bytes go in by setval, never as START: pg_sequence, which every role may read,
        -- holds a sequence's start. (A bigint's range is exactly every 8 bytes.)
        PERFORM setval(part, ('x' || encode(substr(key, 8 * n - 7, 8), 'hex'))::bit(64)::bigint, true);
        EXECUTE format('ALTER SEQUENCE %s OWNER TO %s', part, key_owner);
        PERFORM backfill.revoke_from_all_but_owner(part);
        EXECUTE format('COMMENT ON SEQUENCE %s IS %L', part,
                       format('Bytes %s to %s of message key %s (backfill.message_key)', 8 * n - 7, 8 * n, key_id));
        IF NOT EXISTS (SELECT FROM pg_depend d
                        WHERE d.classid = 'pg_class'::regclass AND d.objid = part AND d.deptype = 'e') THEN
            EXECUTE format('ALTER EXTENSION pg_backfill ADD SEQUENCE %s', part);
        END IF;
        parts := parts || part::oid;
    END LOOP;
    RETURN parts;
END
$$;
COMMENT ON FUNCTION backfill.store_message_key(integer, bytea) IS 'Stores a message key''s bytes in sequences of its own; returns them';

-- Makes a new key; returns its id.
CREATE FUNCTION backfill.make_message_key() RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    made integer := nextval(pg_get_serial_sequence('backfill.message_key_store', 'id')::regclass);
BEGIN
    INSERT INTO backfill.message_key_store (id, key_sequences) OVERRIDING SYSTEM VALUE
    VALUES (made, backfill.store_message_key(made, backfill.random_key()));
    RETURN made;
END
$$;
COMMENT ON FUNCTION backfill.make_message_key() IS 'Makes a new message key; returns its id';

-- Not dumped: a restored database is another database, with a key of its own.
SELECT backfill.make_message_key();

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
    FOREACH state_table IN ARRAY ARRAY['job', 'job_table', 'job_key', 'job_progress', 'job_error', 'message_key_store'] LOOP
        EXECUTE pg_catalog.format(
            'CREATE TRIGGER discard_replicated_row BEFORE INSERT OR UPDATE OR DELETE ON backfill.%I
                 FOR EACH ROW EXECUTE FUNCTION backfill.discard_replicated_row()', state_table);
        EXECUTE pg_catalog.format('ALTER TABLE backfill.%I ENABLE REPLICA TRIGGER discard_replicated_row', state_table);
    END LOOP;
END
$$;

-- A backfill of a Citus distributed table, started on the coordinator: one backfill on each
-- worker node, of the shards it holds (see docs/citus.md). The coordinator's backfill has one
-- job_table row per shard placement, and here the node and the node's backfill that delivers it.
CREATE TABLE backfill.job_shard (
    job_id           bigint NOT NULL,
    position         integer NOT NULL,
    shard_id         bigint NOT NULL,
    shard_name       text NOT NULL,
    node_name        text NOT NULL,
    node_port        integer NOT NULL,
    node_backfill_id bigint NOT NULL,
    node_state       text,
    node_error       text,
    PRIMARY KEY (job_id, position),
    FOREIGN KEY (job_id, position) REFERENCES backfill.job_table (job_id, position) ON DELETE CASCADE
);
COMMENT ON TABLE backfill.job_shard IS 'For a backfill of a Citus distributed table: each shard placement''s node and the backfill there that delivers it';
COMMENT ON COLUMN backfill.job_shard.job_id IS 'The backfill (backfill.job.id), on the coordinator';
COMMENT ON COLUMN backfill.job_shard.position IS 'Its row in backfill.job_table';
COMMENT ON COLUMN backfill.job_shard.shard_id IS 'The shard (pg_dist_shard.shardid)';
COMMENT ON COLUMN backfill.job_shard.shard_name IS 'The shard''s table on the node';
COMMENT ON COLUMN backfill.job_shard.node_name IS 'The node that holds the placement (pg_dist_node.nodename)';
COMMENT ON COLUMN backfill.job_shard.node_port IS 'Its port';
COMMENT ON COLUMN backfill.job_shard.node_backfill_id IS 'The backfill on that node that delivers the shard (its backfill_status.id)';
COMMENT ON COLUMN backfill.job_shard.node_state IS 'That backfill''s state when the coordinator last looked';
COMMENT ON COLUMN backfill.job_shard.node_error IS 'Its last error, if it failed';
GRANT SELECT ON backfill.job_shard TO pg_monitor;
CREATE TRIGGER discard_replicated_row BEFORE INSERT OR UPDATE OR DELETE ON backfill.job_shard
    FOR EACH ROW EXECUTE FUNCTION backfill.discard_replicated_row();
ALTER TABLE backfill.job_shard ENABLE REPLICA TRIGGER discard_replicated_row;

-- Follows (backfill_follow()): a publication followed into a slot, so that every table added to
-- the publication is backfilled into the slot by itself, and its queue. Not dumped, as the
-- backfills are not: a follow names a slot, which a dump does not carry either.
CREATE TABLE backfill.follow (
    id                     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    publication_name       name NOT NULL,
    slot_name              name NOT NULL,
    created_by             oid NOT NULL,
    created_at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    batch_size             integer NOT NULL CHECK (batch_size BETWEEN 1 AND 100000),
    rows_per_second        integer CHECK (rows_per_second > 0),
    parallel               integer NOT NULL DEFAULT 1 CHECK (parallel BETWEEN 1 AND 16),
    max_lag_bytes          bigint CHECK (max_lag_bytes > 0),
    max_replica_lag_bytes  bigint CHECK (max_replica_lag_bytes >= -1),
    max_retained_wal_bytes bigint CHECK (max_retained_wal_bytes >= -1),
    max_active_sessions    integer CHECK (max_active_sessions >= -1),
    rows_per_message       integer CHECK (rows_per_message BETWEEN 1 AND 100000),
    settings               jsonb NOT NULL DEFAULT '{}',
    known_tables           oid[] NOT NULL DEFAULT '{}',
    known_leaves           oid[] NOT NULL DEFAULT '{}',
    last_started_at        timestamptz,
    last_backfill_id       bigint,
    last_error             text,
    last_error_at          timestamptz,
    ended_at               timestamptz,
    end_reason             text
);
-- One live follow per publication and slot.
CREATE UNIQUE INDEX follow_live_idx ON backfill.follow (publication_name, slot_name) WHERE ended_at IS NULL;
COMMENT ON TABLE backfill.follow IS 'One row per follow (backfill_follow()): every table added to the publication is backfilled into the slot';
COMMENT ON COLUMN backfill.follow.id IS 'Follow id, returned by backfill_follow()';
COMMENT ON COLUMN backfill.follow.publication_name IS 'The publication followed';
COMMENT ON COLUMN backfill.follow.slot_name IS 'The slot its backfills are bound to, one at a time';
COMMENT ON COLUMN backfill.follow.created_by IS 'The role that created it (its oid): every backfill it starts is started as this role, with its rights';
COMMENT ON COLUMN backfill.follow.created_at IS 'When backfill_follow() was called';
COMMENT ON COLUMN backfill.follow.batch_size IS 'batch_size of the backfills it starts';
COMMENT ON COLUMN backfill.follow.rows_per_second IS 'rows_per_second of the backfills it starts; NULL for none';
COMMENT ON COLUMN backfill.follow.parallel IS 'parallel of the backfills it starts';
COMMENT ON COLUMN backfill.follow.max_lag_bytes IS 'max_lag of the backfills it starts; NULL: backfill.max_slot_lag';
COMMENT ON COLUMN backfill.follow.max_replica_lag_bytes IS 'max_replica_lag of the backfills it starts; NULL: the setting';
COMMENT ON COLUMN backfill.follow.max_retained_wal_bytes IS 'max_retained_wal of the backfills it starts; NULL: the setting';
COMMENT ON COLUMN backfill.follow.max_active_sessions IS 'max_active_sessions of the backfills it starts; NULL: the setting';
COMMENT ON COLUMN backfill.follow.rows_per_message IS 'rows_per_message of the backfills it starts; NULL: backfill.rows_per_message';
COMMENT ON COLUMN backfill.follow.settings IS 'The settings a start reads from its session (backfill.message_prefix, lock_mode, rows_per_message, default_max_active_sessions) as the session that created the follow had them: every backfill it starts, from whichever session or worker, starts with them';
COMMENT ON COLUMN backfill.follow.known_tables IS 'The relations the publication listed (pg_publication_tables) when the follow last looked';
COMMENT ON COLUMN backfill.follow.known_leaves IS 'Their leaves (a plain table is its own): a partition attached to a listed partitioned table is a new leaf';
COMMENT ON COLUMN backfill.follow.last_started_at IS 'When it last started a backfill';
COMMENT ON COLUMN backfill.follow.last_backfill_id IS 'The backfill it last started';
COMMENT ON COLUMN backfill.follow.last_error IS 'Why it last could not start a table''s backfill';
COMMENT ON COLUMN backfill.follow.last_error_at IS 'When';
COMMENT ON COLUMN backfill.follow.ended_at IS 'When it ended: backfill_unfollow(), or its publication or slot dropped';
COMMENT ON COLUMN backfill.follow.end_reason IS 'Why it ended';

CREATE TABLE backfill.follow_table (
    entry       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    follow_id   bigint NOT NULL REFERENCES backfill.follow (id) ON DELETE CASCADE,
    relid       oid NOT NULL,
    table_name  text NOT NULL,
    queued_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    state       text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'started', 'skipped', 'failed')),
    backfill_id bigint,
    reason      text,
    sqlstate    text,
    detail      text,
    settled_at  timestamptz
);
CREATE INDEX follow_table_follow_id_state_idx ON backfill.follow_table (follow_id, state);
COMMENT ON TABLE backfill.follow_table IS 'The queue of each follow: one row per table added to its publication, in the order added';
COMMENT ON COLUMN backfill.follow_table.entry IS 'Its place in the queue: the order added';
COMMENT ON COLUMN backfill.follow_table.follow_id IS 'The follow (backfill.follow.id)';
COMMENT ON COLUMN backfill.follow_table.relid IS 'The table added (its oid: a dropped table''s entry is skipped)';
COMMENT ON COLUMN backfill.follow_table.table_name IS 'Its name when it was added';
COMMENT ON COLUMN backfill.follow_table.queued_at IS 'When the statement that added it ran';
COMMENT ON COLUMN backfill.follow_table.state IS 'pending (waits for the slot), started (in backfill_id), skipped (needed none: removed from the publication or dropped before its turn, already being backfilled into the slot, or empty when added) or failed (could not be started: reason)';
COMMENT ON COLUMN backfill.follow_table.backfill_id IS 'The backfill that delivers it, once started';
COMMENT ON COLUMN backfill.follow_table.reason IS 'Why it was skipped, or the message of the error that failed it';
COMMENT ON COLUMN backfill.follow_table.sqlstate IS 'SQLSTATE of the error that failed it';
COMMENT ON COLUMN backfill.follow_table.detail IS 'The detail of that error, if any';
COMMENT ON COLUMN backfill.follow_table.settled_at IS 'When it was started, skipped or failed';
GRANT SELECT ON backfill.follow, backfill.follow_table TO pg_monitor;
DO $$
DECLARE
    state_table text;
BEGIN
    FOREACH state_table IN ARRAY ARRAY['follow', 'follow_table'] LOOP
        EXECUTE pg_catalog.format(
            'CREATE TRIGGER discard_replicated_row BEFORE INSERT OR UPDATE OR DELETE ON backfill.%I
                 FOR EACH ROW EXECUTE FUNCTION backfill.discard_replicated_row()', state_table);
        EXECUTE pg_catalog.format('ALTER TABLE backfill.%I ENABLE REPLICA TRIGGER discard_replicated_row', state_table);
    END LOOP;
END
$$;
