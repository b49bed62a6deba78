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
-- Not on nl_sessions: its key is (role_id, session, id), so an id a role takes ahead there
-- clashes only with its own rows.
CREATE TRIGGER nl_drawn_id BEFORE INSERT ON @extschema@.nl_history
    FOR EACH ROW EXECUTE FUNCTION @extschema@.nl_drawn_id();
CREATE TRIGGER nl_drawn_id BEFORE INSERT ON @extschema@.nl_feedback
    FOR EACH ROW EXECUTE FUNCTION @extschema@.nl_drawn_id();
CREATE TRIGGER nl_drawn_id BEFORE INSERT ON @extschema@.nl_examples
    FOR EACH ROW EXECUTE FUNCTION @extschema@.nl_drawn_id();
-- Also in replica mode, which a role may be let set: only the owner writes ids as given. No
-- role but the owner may call it (a trigger of another table).
ALTER TABLE @extschema@.nl_history ENABLE ALWAYS TRIGGER nl_drawn_id;
ALTER TABLE @extschema@.nl_feedback ENABLE ALWAYS TRIGGER nl_drawn_id;
ALTER TABLE @extschema@.nl_examples ENABLE ALWAYS TRIGGER nl_drawn_id;
-- Its privileges: privileges.sql.
-- A dump carries where each identity stands, not only the tables' rows: restored without it,
-- every insert would draw an id a restored row holds (history lost, examples and feedback
-- refused).
SELECT pg_catalog.pg_extension_config_dump('@extschema@.nl_history_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.nl_feedback_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.nl_examples_id_seq', '');
