-- 0.12.0 -> 0.13.0
\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.13.0'" to load this file. \quit

-- Every change to the examples goes to the server log, whoever makes it and however
-- (`nl_example_add`, `nl_example_remove`, a promotion from feedback, or the table's own DML
-- by a role granted it): an example decides what matching questions of every role are asked
-- with, so planting one and removing it afterwards must leave a trace. At LOG, as the calls'
-- audit lines are (`sql_query_engine.audit_log = off` or `errors` leaves them out). Its
-- literals are read with standard_conforming_strings on, whatever the session set: off, the
-- escapes of its pattern and markers would lose their backslashes.
CREATE OR REPLACE FUNCTION @extschema@.nl_examples_audit() RETURNS trigger
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
    -- control or format character (what steers a terminal or reorders text) as \u{hex}.
    FOR i IN 1..pg_catalog.array_length(fields, 1) LOOP
        IF pg_catalog.length(fields[i]) > 100000 THEN
            fields[i] := pg_catalog.left(fields[i], 100000) || pg_catalog.format(
                ' ... (cut at 100000 of %s characters)', pg_catalog.length(fields[i]));
        END IF;
        fields[i] := pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(
            fields[i], E'\\', E'\\\\'), E'\n', E'\\n'), E'\r', E'\\r'), E'\t', E'\\t');
        FOR c IN SELECT DISTINCT m[1] FROM pg_catalog.regexp_matches(fields[i],
            '([\u0001-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e007f])',
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
