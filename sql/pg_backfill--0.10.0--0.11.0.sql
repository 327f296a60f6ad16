-- pg_backfill 0.10.0 -> 0.11.0. What changed for a DBA: CHANGELOG.md, section 0.11.0.
\echo Use "ALTER EXTENSION pg_backfill UPDATE TO '0.11.0'" to load this file. \quit

-- Follows: a statement that may add tables to a followed publication only queues them (under
-- the follow's lock), as the extension's owner; a dispatcher worker starts them once the
-- statement's transaction commits. The event trigger calls into the library only while a follow
-- is live, and needs no grant of any role's; CREATE SCHEMA, which can create tables, is seen.
CREATE OR REPLACE FUNCTION backfill.follow_publication_changes()
RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ BEGIN
    IF EXISTS (SELECT FROM backfill.follow WHERE ended_at IS NULL) THEN
        PERFORM backfill.follow_ddl(TG_TAG);
    END IF;
END $$;
COMMENT ON FUNCTION backfill.follow_publication_changes() IS 'Event trigger: queues the tables a statement added to a followed publication; a dispatcher starts them once the statement commits';
DROP EVENT TRIGGER backfill_follow_publication_changes;
CREATE EVENT TRIGGER backfill_follow_publication_changes ON ddl_command_end
    WHEN TAG IN ('ALTER PUBLICATION', 'DROP PUBLICATION', 'ALTER TABLE', 'CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO',
                 'DROP TABLE', 'CREATE SCHEMA')
    EXECUTE FUNCTION backfill.follow_publication_changes();
CREATE FUNCTION backfill.follow_ddl(command_tag text) RETURNS void
LANGUAGE c AS 'MODULE_PATHNAME', 'follow_ddl_of_wrapper';
COMMENT ON FUNCTION backfill.follow_ddl() IS 'The event trigger''s work in 0.10.0 (no command tag): the SQL of that version calls it until ALTER EXTENSION UPDATE';
REVOKE EXECUTE ON FUNCTION backfill.follow_ddl() FROM PUBLIC;
COMMENT ON FUNCTION backfill.follow_ddl(text) IS 'The event trigger''s work at the end of a statement (its command tag) that may have changed a followed publication''s tables';
REVOKE EXECUTE ON FUNCTION backfill.follow_ddl(text) FROM PUBLIC;
