-- 0.11.0 -> 0.12.0
\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.12.0'" to load this file. \quit

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
