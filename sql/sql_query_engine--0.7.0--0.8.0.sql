-- 0.8.0: an example's provenance is whoever inserts it, now, from an answer of its own.
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
