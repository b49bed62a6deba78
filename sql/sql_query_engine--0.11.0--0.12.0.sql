-- 0.11.0 -> 0.12.0
\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.12.0'" to load this file. \quit

-- Every change to the examples goes to the server log, whoever makes it and however
-- (`nl_example_add`, `nl_example_remove`, a promotion from feedback, or the table's own DML
-- by a role granted it): an example decides what matching questions of every role are asked
-- with, so planting one and removing it afterwards must leave a trace. At LOG, as the calls'
-- audit lines are (`sql_query_engine.audit_log = off` or `errors` leaves them out).
CREATE FUNCTION @extschema@.nl_examples_audit() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    who text := pg_catalog.format('role %s (oid %s)', pg_catalog.to_json(current_user::text),
        pg_catalog.to_regrole(pg_catalog.quote_ident(current_user))::pg_catalog.oid);
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
        RAISE LOG 'sql_query_engine: every example removed (TRUNCATE) by %', who;
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN
        fields := ARRAY[OLD.question, OLD.sql];
    ELSE
        fields := ARRAY[NEW.question, NEW.sql];
    END IF;
    -- Each field on one line, as the calls' audit lines write it: a backslash doubled, line
    -- breaks and tabs as \n \r \t, and every other control or format character (what steers
    -- a terminal or reorders text) as \u{hex}.
    FOR i IN 1..2 LOOP
        fields[i] := pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(
            pg_catalog.left(fields[i], 100000), E'\\', E'\\\\'), E'\n', E'\\n'), E'\r', E'\\r'),
            E'\t', E'\\t');
        FOR c IN SELECT DISTINCT m[1] FROM pg_catalog.regexp_matches(fields[i],
            '([\u0001-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e007f])',
            'g') AS m LOOP
            fields[i] := pg_catalog.replace(fields[i], c,
                pg_catalog.format('\u{%s}', pg_catalog.to_hex(pg_catalog.ascii(c))));
        END LOOP;
    END LOOP;
    RAISE LOG 'sql_query_engine: example % % by %',
        CASE TG_OP WHEN 'DELETE' THEN OLD.id ELSE NEW.id END,
        CASE TG_OP WHEN 'INSERT' THEN 'added' WHEN 'UPDATE' THEN 'changed' ELSE 'removed' END,
        who
        USING DETAIL = 'question: ' || fields[1] || E'\nsql: ' || fields[2];
    RETURN NULL;
END
$$;
CREATE TRIGGER nl_examples_audit AFTER INSERT OR UPDATE OR DELETE ON @extschema@.nl_examples
    FOR EACH ROW EXECUTE FUNCTION @extschema@.nl_examples_audit();
CREATE TRIGGER nl_examples_audit_truncate AFTER TRUNCATE ON @extschema@.nl_examples
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.nl_examples_audit();
