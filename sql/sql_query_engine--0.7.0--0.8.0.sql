\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.8.0'" to load this file. \quit
-- 0.8.0: an example's provenance is whoever inserts it, now, from an answer of its own; a
-- row's id in the extension's tables is the one its identity draws, and a dump keeps where
-- the identities stand.
-- Who added an example, and when, is whoever inserts or changes it, now: a role that may write
-- examples names no other role as the author, no other time, and no answer it cannot read
-- (another role's history row) as the source. The table's owner (and a superuser) writes rows
-- as given, as row security lets it: a restore keeps each example's provenance.
CREATE FUNCTION @extschema@.nl_examples_provenance() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF (SELECT pg_has_role(c.relowner, 'USAGE') FROM pg_class c WHERE c.oid = TG_RELID) THEN
        RETURN NEW;
    END IF;
    NEW.added_by := current_user;
    NEW.added_at := now();
    IF NEW.history_id IS NOT NULL AND NOT EXISTS (
        SELECT FROM @extschema@.nl_history h WHERE h.id = NEW.history_id) THEN
        RAISE EXCEPTION 'no answer % in your history', NEW.history_id
            USING ERRCODE = '42501';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER nl_examples_provenance BEFORE INSERT OR UPDATE ON @extschema@.nl_examples
    FOR EACH ROW EXECUTE FUNCTION @extschema@.nl_examples_provenance();

-- A row's id in the extension's tables is the one the table's identity drew for it. A role that
-- may insert (every role, into nl_history and nl_feedback) could otherwise take ids ahead of
-- the sequence (OVERRIDING SYSTEM VALUE), on which the inserts of every other role would then
-- fail: their history lost, their feedback refused. The identity's draw is the session's
-- current value of the sequence (each row is drawn for, then checked, before the next), which
-- every role may read (SELECT: its own rows' ids tell as much). The table's owner and
-- superusers write rows as given, as row security lets them: a restore keeps every id.
CREATE FUNCTION @extschema@.nl_drawn_id() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF (SELECT pg_has_role(c.relowner, 'USAGE') FROM pg_class c WHERE c.oid = TG_RELID) THEN
        RETURN NEW;
    END IF;
    IF NEW.id IS DISTINCT FROM
           currval(pg_get_serial_sequence(TG_RELID::regclass::text, 'id')::regclass) THEN
        RAISE EXCEPTION 'the id of a row of % is the one its identity draws', TG_TABLE_NAME
            USING ERRCODE = '42501';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER nl_drawn_id BEFORE INSERT ON @extschema@.nl_history
    FOR EACH ROW EXECUTE FUNCTION @extschema@.nl_drawn_id();
CREATE TRIGGER nl_drawn_id BEFORE INSERT ON @extschema@.nl_feedback
    FOR EACH ROW EXECUTE FUNCTION @extschema@.nl_drawn_id();
CREATE TRIGGER nl_drawn_id BEFORE INSERT ON @extschema@.nl_examples
    FOR EACH ROW EXECUTE FUNCTION @extschema@.nl_drawn_id();
GRANT SELECT ON SEQUENCE @extschema@.nl_history_id_seq, @extschema@.nl_feedback_id_seq,
    @extschema@.nl_examples_id_seq TO PUBLIC;
-- A dump carries where each identity stands, not only the tables' rows: restored without it,
-- every insert would draw an id a restored row holds (history lost, examples and feedback
-- refused).
SELECT pg_catalog.pg_extension_config_dump('@extschema@.nl_history_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.nl_feedback_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.nl_examples_id_seq', '');
