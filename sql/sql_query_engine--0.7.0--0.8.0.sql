\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.8.0'" to load this file. \quit

-- The extension's schema must be one only superusers can create in. Its install and update
-- scripts run as a superuser with that schema first on the search path: an operator or
-- function another role put there that matches a call more closely than pg_catalog's (say
-- `->>(jsonb, jsonb)` for `turn ->> 'sql'`) would run with the superuser's rights
-- (CVE-2018-1058). And the extension finds its tables by the schema's name, which the schema's
-- owner could give to a schema of its own. So its owner and every role granted CREATE on it
-- must be superusers (pg_database_owner stands for the database's owner: `public` of a
-- database a superuser owns will do), and no function or operator in it may belong to another
-- role. This block opens the install script and every update script (a test in store.rs
-- checks they are the same); each of its operators is pg_catalog's, named so.
DO $$
DECLARE
    schema_oid pg_catalog.oid := '@extschema@'::pg_catalog.regnamespace::pg_catalog.oid;
    creators text;
    their_code text;
BEGIN
    SELECT pg_catalog.string_agg(DISTINCT CASE
               WHEN c.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
               ELSE pg_catalog.quote_ident(r.rolname::pg_catalog.text) END, ', ')
      INTO creators
      FROM pg_catalog.pg_namespace n
      CROSS JOIN LATERAL (
          SELECT n.nspowner AS grantee
          UNION ALL
          SELECT a.grantee
            FROM pg_catalog.aclexplode(COALESCE(n.nspacl,
                     pg_catalog.acldefault('n'::pg_catalog."char", n.nspowner))) a
           WHERE a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'::pg_catalog.text) c
      LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) CASE
          WHEN c.grantee OPERATOR(pg_catalog.=)
               'pg_database_owner'::pg_catalog.regrole::pg_catalog.oid
          THEN (SELECT d.datdba FROM pg_catalog.pg_database d
                 WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
          ELSE c.grantee END
     WHERE n.oid OPERATOR(pg_catalog.=) schema_oid AND r.rolsuper IS NOT TRUE;
    SELECT pg_catalog.string_agg(f.what, ', ') INTO their_code FROM (
        SELECT pg_catalog.format('function %s', p.oid::pg_catalog.regprocedure) AS what
          FROM pg_catalog.pg_proc p
          JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) p.proowner
         WHERE p.pronamespace OPERATOR(pg_catalog.=) schema_oid AND NOT r.rolsuper
        UNION ALL
        SELECT pg_catalog.format('operator %s', o.oid::pg_catalog.regoperator)
          FROM pg_catalog.pg_operator o
          JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) o.oprowner
         WHERE o.oprnamespace OPERATOR(pg_catalog.=) schema_oid AND NOT r.rolsuper
         LIMIT 20) f;
    IF creators IS NOT NULL OR their_code IS NOT NULL THEN
        RAISE EXCEPTION 'sql_query_engine cannot be installed or updated in schema %: a role that is not a superuser owns it, may create in it or owns functions or operators in it',
            '@extschema@'
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('Owner or may create in it: %s. Their functions and operators in it: %s. An operator or function of theirs that matches a call of the extension''s script more closely than pg_catalog''s would run with your rights, and the schema''s owner could put tables of its own in place of the extension''s.',
                      COALESCE(creators, 'none'), COALESCE(their_code, 'none')),
                  HINT = 'Install it in a schema of its own: CREATE SCHEMA nl; GRANT USAGE ON SCHEMA nl TO PUBLIC; CREATE EXTENSION sql_query_engine SCHEMA nl; and add nl to the search path (ALTER DATABASE ... SET search_path = "$user", public, nl). To update it where it is, a superuser takes the schema (ALTER SCHEMA ... OWNER TO), revokes CREATE on it from those roles and moves their functions and operators out first.';
    END IF;
END
$$;
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
