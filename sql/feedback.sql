-- Feedback on answers (nl_feedback): a recorded answer marked right or wrong, or corrected.
-- Feedback from a role that may write nl_examples becomes a verified example at once
-- (`promoted`, naming it); anyone else's waits for review (`pending`: the table's owner sees
-- every row, and promotes one with nl_example_add). A wrong answer without a correction is
-- `noted`. Each role sees and writes only its own rows, told apart by OID as in nl_history.
CREATE TABLE @extschema@.nl_feedback (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    role name NOT NULL DEFAULT current_user,
    role_id oid NOT NULL DEFAULT pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid,
    history_id bigint NOT NULL,
    question text NOT NULL,
    correct boolean NOT NULL,
    -- the SQL the feedback vouches for: the answer's, or the correction (NULL when noted)
    sql text,
    status text NOT NULL CHECK (status IN ('promoted', 'pending', 'noted')),
    example_id bigint
);
ALTER TABLE @extschema@.nl_feedback ENABLE ROW LEVEL SECURITY;
-- A row a role writes is its own, under its own name (dated by nl_row_role), on an answer of its own
-- history (which row security shows it alone) and with that answer's question; only a role that
-- may write nl_examples records feedback as promoted (the owner reviews the pending rows), and
-- only a promoted row names an example (nl_feedback_example checks which). A noted row (a wrong
-- answer, no correction) vouches for no SQL, a pending or promoted one for some.
CREATE POLICY own_rows ON @extschema@.nl_feedback
    USING (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid)
    WITH CHECK (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid
                AND role = current_user
                AND EXISTS (SELECT FROM @extschema@.nl_history h
                            WHERE h.id = nl_feedback.history_id
                              AND h.role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid
                              AND h.question = nl_feedback.question)
                AND (sql IS NULL) = (status = 'noted')
                AND (status <> 'noted' OR NOT correct)
                AND (status = 'promoted' OR example_id IS NULL)
                AND (status <> 'promoted' OR pg_catalog.has_table_privilege(
                         '@extschema@.nl_examples'::pg_catalog.regclass, 'INSERT')));
-- Its privileges: privileges.sql.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.nl_feedback', '');
-- Restored rows go to the role of their name (see nl_row_role in history.sql).
CREATE TRIGGER nl_row_role BEFORE INSERT OR UPDATE ON @extschema@.nl_feedback
    FOR EACH ROW EXECUTE FUNCTION @extschema@.nl_row_role();
ALTER TABLE @extschema@.nl_feedback ENABLE ALWAYS TRIGGER nl_row_role;

-- A promoted row names the example its role made of that answer with that SQL. Checked here,
-- where nl_examples is read only for a promoted row, not in the policy: a policy's subquery
-- locks nl_examples, and needs SELECT on it, for every row, so that a role that may lock it
-- would hold up every role's feedback. The table's owner (and a superuser) writes rows as
-- given, as row security lets it: a restore keeps them.
CREATE FUNCTION @extschema@.nl_feedback_example() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF (SELECT pg_has_role(c.relowner, 'USAGE') FROM pg_class c WHERE c.oid = TG_RELID) THEN
        RETURN NEW;
    END IF;
    -- What the policy checks, for a writer it does not bind (BYPASSRLS): feedback on an
    -- answer of its own, with that answer's question, whose status says what it vouches for.
    IF NOT pg_catalog.row_security_active(TG_RELID) AND NOT (
            EXISTS (SELECT FROM @extschema@.nl_history h
                    WHERE h.id = NEW.history_id
                      AND h.role_id = quote_ident(current_user)::regrole::oid
                      AND h.question = NEW.question)
            AND (NEW.sql IS NULL) = (NEW.status = 'noted')
            AND (NEW.status <> 'noted' OR NOT NEW.correct)
            AND (NEW.status = 'promoted' OR NEW.example_id IS NULL)
            AND (NEW.status <> 'promoted' OR has_table_privilege(
                     '@extschema@.nl_examples'::regclass, 'INSERT'))) THEN
        RAISE EXCEPTION 'feedback is on an answer of your own history, with its question'
            USING ERRCODE = '42501';
    END IF;
    IF NEW.status <> 'promoted' THEN
        RETURN NEW;
    END IF;
    IF NOT EXISTS (SELECT FROM @extschema@.nl_examples e
                   WHERE e.id = NEW.example_id AND e.history_id = NEW.history_id
                     AND e.sql = NEW.sql AND e.added_by = current_user) THEN
        RAISE EXCEPTION 'example % is not one you made of answer % with its SQL',
            NEW.example_id, NEW.history_id USING ERRCODE = '42501';
    END IF;
    RETURN NEW;
END
$$;
-- Its privileges: privileges.sql.
CREATE TRIGGER nl_feedback_example BEFORE INSERT ON @extschema@.nl_feedback
    FOR EACH ROW EXECUTE FUNCTION @extschema@.nl_feedback_example();
-- Also in replica mode, which a role may be let set: only the owner writes rows as given.
ALTER TABLE @extschema@.nl_feedback ENABLE ALWAYS TRIGGER nl_feedback_example;
