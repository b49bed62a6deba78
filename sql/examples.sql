-- Verified examples: question -> SQL pairs a human approved. The few most similar to a new
-- question go into the prompt. Anyone may read them; only roles that may write this table (its
-- owner, and whoever the owner grants INSERT/DELETE) can add or remove examples.
CREATE TABLE @extschema@.nl_examples (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    question text NOT NULL CHECK (btrim(question) <> ''),
    sql text NOT NULL,
    added_by name NOT NULL DEFAULT current_user,
    added_at timestamptz NOT NULL DEFAULT now(),
    -- The question's words as retrieval sees them: examples are found through this index, so
    -- that a question costs the same with ten examples or a hundred thousand.
    terms text[] GENERATED ALWAYS AS (@extschema@.nl_example_words(question)) STORED,
    -- the recorded answer (nl_history) it came from, when it came from feedback
    history_id bigint
);
-- Without GIN's pending list, which every look-up would scan until a vacuum merged it: examples
-- are written rarely and read on every question.
CREATE INDEX nl_examples_terms_idx ON @extschema@.nl_examples USING gin (terms)
    WITH (fastupdate = off);
GRANT SELECT ON @extschema@.nl_examples TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.nl_examples', '');

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

-- Every change to the examples goes to the server log, whoever makes it and however
-- (`nl_example_add`, `nl_example_remove`, a promotion from feedback, or the table's own DML
-- by a role granted it): an example decides what matching questions of every role are asked
-- with, so planting one and removing it afterwards must leave a trace. At LOG, as the calls'
-- audit lines are (`sql_query_engine.audit_log = off` or `errors` leaves them out); each field
-- on one line (JSON-quoted).
CREATE FUNCTION @extschema@.nl_examples_audit() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    who text := pg_catalog.format('role %s (oid %s)', pg_catalog.to_json(current_user::text),
        pg_catalog.to_regrole(pg_catalog.quote_ident(current_user))::pg_catalog.oid);
BEGIN
    IF coalesce(pg_catalog.current_setting('sql_query_engine.audit_log', true), '')
           NOT IN ('all', '') THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'TRUNCATE' THEN
        RAISE LOG 'sql_query_engine: every example removed (TRUNCATE) by %', who;
    ELSIF TG_OP = 'DELETE' THEN
        RAISE LOG 'sql_query_engine: example % removed by %', OLD.id, who
            USING DETAIL = 'question: ' || pg_catalog.to_json(pg_catalog.left(OLD.question, 100000))
                || E'\nsql: ' || pg_catalog.to_json(pg_catalog.left(OLD.sql, 100000));
    ELSE
        RAISE LOG 'sql_query_engine: example % % by %', NEW.id,
            CASE TG_OP WHEN 'INSERT' THEN 'added' ELSE 'changed' END, who
            USING DETAIL = 'question: ' || pg_catalog.to_json(pg_catalog.left(NEW.question, 100000))
                || E'\nsql: ' || pg_catalog.to_json(pg_catalog.left(NEW.sql, 100000));
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER nl_examples_audit AFTER INSERT OR UPDATE OR DELETE ON @extschema@.nl_examples
    FOR EACH ROW EXECUTE FUNCTION @extschema@.nl_examples_audit();
CREATE TRIGGER nl_examples_audit_truncate AFTER TRUNCATE ON @extschema@.nl_examples
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.nl_examples_audit();

-- nl_example_add(question, sql) is a function of the library: it checks the SQL with the
-- guard on the caller's search path, then inserts on the pinned one.

-- Removes an example; returns whether it existed.
CREATE FUNCTION @extschema@.nl_example_remove(example_id bigint) RETURNS boolean
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH gone AS (DELETE FROM @extschema@.nl_examples WHERE id = example_id RETURNING 1)
    SELECT count(*) > 0 FROM gone
$$;
