-- Verified examples: question -> SQL pairs a human approved. The few most similar to a new
-- question go into the prompt. Anyone may read them; only roles that may write this table (its
-- owner, and whoever the owner grants INSERT/DELETE) can add or remove examples.
CREATE TABLE @extschema@.nl_examples (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    question text NOT NULL CHECK (btrim(question) <> ''),
    sql text NOT NULL,
    added_by name NOT NULL DEFAULT current_user,
    added_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    -- The question's words as retrieval sees them: examples are found through this index, so
    -- that a question costs the same with ten examples or a hundred thousand.
    terms text[] GENERATED ALWAYS AS (@extschema@.nl_example_words(question)) STORED,
    -- the recorded answer (nl_history) it came from, when it came from feedback
    history_id bigint
);
-- Held to what nl_example_add takes, also for rows written straight into the table (a role
-- granted INSERT): every matching question of every role reads and checks them. NOT VALID:
-- rows written before 0.14.0 stay (they are only read up to a bound).
ALTER TABLE @extschema@.nl_examples ADD CONSTRAINT nl_examples_bounded
    CHECK (pg_catalog.length(question) <= 10000 AND pg_catalog.length(sql) <= 100000) NOT VALID;
-- Without GIN's pending list, which every look-up would scan until a vacuum merged it: examples
-- are written rarely and read on every question.
CREATE INDEX nl_examples_terms_idx ON @extschema@.nl_examples USING gin (terms)
    WITH (fastupdate = off);
-- Its privileges: privileges.sql.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.nl_examples', '');

-- Who added an example, and when, is whoever inserts or changes it, as it does (not at the start
-- of its transaction, which it could hold open to backdate the example): a role that may write
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
    NEW.added_at := clock_timestamp();
    -- Its own answer, also for a writer row security does not bind (BYPASSRLS).
    IF NEW.history_id IS NOT NULL AND NOT EXISTS (
        SELECT FROM @extschema@.nl_history h
        WHERE h.id = NEW.history_id
          AND h.role_id = quote_ident(current_user)::regrole::oid) THEN
        RAISE EXCEPTION 'no answer % in your history', NEW.history_id
            USING ERRCODE = '42501';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER nl_examples_provenance BEFORE INSERT OR UPDATE ON @extschema@.nl_examples
    FOR EACH ROW EXECUTE FUNCTION @extschema@.nl_examples_provenance();
-- Also in replica mode, which a role may be let set; no role but the owner may call it.
ALTER TABLE @extschema@.nl_examples ENABLE ALWAYS TRIGGER nl_examples_provenance;
-- Its privileges: privileges.sql.

-- Every change to the examples goes to the server log, whoever makes it and however
-- (`nl_example_add`, `nl_example_remove`, a promotion from feedback, or the table's own DML
-- by a role granted it): an example decides what matching questions of every role are asked
-- with, so planting one and removing it afterwards must leave a trace. At LOG, as the calls'
-- audit lines are (`sql_query_engine.audit_log = off` or `errors` leaves them out). Its
-- literals are read with standard_conforming_strings on, whatever the session set: off, the
-- escapes of its pattern and markers would lose their backslashes.
CREATE FUNCTION @extschema@.nl_examples_audit() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET standard_conforming_strings = on
AS $$
DECLARE
    fields text[];
    c text;
BEGIN
    -- The setting as the library defines it (an enum): a placeholder any role may set before
    -- the library is loaded in its session is not it.
    IF EXISTS (SELECT FROM pg_catalog.pg_settings
               WHERE name = 'sql_query_engine.audit_log' AND vartype = 'enum'
                 AND setting <> 'all') THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'TRUNCATE' THEN
        fields := ARRAY[current_user::text];
    ELSIF TG_OP = 'DELETE' THEN
        fields := ARRAY[current_user::text, OLD.question, OLD.sql];
    ELSE
        fields := ARRAY[current_user::text, NEW.question, NEW.sql];
    END IF;
    -- Each field on one line, as the calls' audit lines write it: cut at 100,000 characters
    -- (saying so), a backslash doubled, line breaks and tabs as \n \r \t, and every other
    -- control or format character or one drawn as nothing (what steers a terminal, reorders
    -- or hides text: the characters text::printable_char refuses, a test in text.rs checks)
    -- as \u{hex}.
    FOR i IN 1..pg_catalog.array_length(fields, 1) LOOP
        IF pg_catalog.length(fields[i]) > 100000 THEN
            fields[i] := pg_catalog.left(fields[i], 100000) || pg_catalog.format(
                ' ... (cut at 100000 of %s characters)', pg_catalog.length(fields[i]));
        END IF;
        fields[i] := pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(
            fields[i], E'\\', E'\\\\'), E'\n', E'\\n'), E'\r', E'\\r'), E'\t', E'\\t');
        FOR c IN SELECT DISTINCT m[1] FROM pg_catalog.regexp_matches(fields[i],
            '([\u0001-\u001f\u007f-\u009f\u00ad\u034f\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u115f-\u1160\u17b4-\u17b5\u180b-\u180f\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff])',
            'g') AS m LOOP
            fields[i] := pg_catalog.replace(fields[i], c,
                pg_catalog.format('\u{%s}', pg_catalog.to_hex(pg_catalog.ascii(c))));
        END LOOP;
    END LOOP;
    -- The role's name quoted, its own quotes escaped.
    fields[1] := pg_catalog.format('role "%s" (oid %s)', pg_catalog.replace(fields[1], '"', E'\\"'),
        pg_catalog.to_regrole(pg_catalog.quote_ident(current_user))::pg_catalog.oid);
    IF TG_OP = 'TRUNCATE' THEN
        RAISE LOG 'sql_query_engine: every example removed (TRUNCATE) by %', fields[1];
        RETURN NULL;
    END IF;
    RAISE LOG 'sql_query_engine: example % % by %',
        CASE TG_OP WHEN 'DELETE' THEN OLD.id ELSE NEW.id END,
        CASE TG_OP WHEN 'INSERT' THEN 'added' WHEN 'UPDATE' THEN 'changed' ELSE 'removed' END,
        fields[1]
        USING DETAIL = 'question: ' || fields[2] || E'\nsql: ' || fields[3];
    RETURN NULL;
END
$$;
CREATE TRIGGER nl_examples_audit AFTER INSERT OR UPDATE OR DELETE ON @extschema@.nl_examples
    FOR EACH ROW EXECUTE FUNCTION @extschema@.nl_examples_audit();
CREATE TRIGGER nl_examples_audit_truncate AFTER TRUNCATE ON @extschema@.nl_examples
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.nl_examples_audit();
-- Also in replica mode (a change applied there is a change too). No role but the owner may
-- call it: attached to a table of a role's own, it would write example lines of its choosing.
ALTER TABLE @extschema@.nl_examples ENABLE ALWAYS TRIGGER nl_examples_audit;
ALTER TABLE @extschema@.nl_examples ENABLE ALWAYS TRIGGER nl_examples_audit_truncate;
-- Its privileges: privileges.sql.

-- nl_example_add(question, sql) is a function of the library: it checks the SQL with the
-- guard on the caller's search path, then inserts on the pinned one.

-- Removes an example; returns whether it existed.
CREATE FUNCTION @extschema@.nl_example_remove(example_id bigint) RETURNS boolean
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH gone AS (DELETE FROM @extschema@.nl_examples WHERE id = example_id RETURNING 1)
    SELECT count(*) > 0 FROM gone
$$;
