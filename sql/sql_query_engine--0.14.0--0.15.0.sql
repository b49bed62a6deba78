-- 0.14.0 -> 0.15.0
\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.15.0'" to load this file. \quit

-- The extension's schema must be one only superusers can create in. Its install and update
-- scripts run as a superuser with that schema first on the search path: an operator or
-- function another role put there that matches a call more closely than pg_catalog's (say
-- `->>(jsonb, jsonb)` for `turn ->> 'sql'`) would run with the superuser's rights
-- (CVE-2018-1058). And the extension finds its tables by the schema's name, which the schema's
-- owner could give to a schema of its own. So no role that is not a superuser may create in
-- it or have its owner's rights (pg_database_owner stands for the database's owner: `public`
-- of a database a superuser owns will do), and no function, aggregate or operator in it may
-- run code such a role owns or may replace. Roles are asked as PostgreSQL answers for them
-- (has_schema_privilege, pg_has_role), so grants through other roles count. This block opens
-- the install script and every update script (a test in store.rs checks they are the same);
-- each of its operators is pg_catalog's, named so. An update script then resolves names in
-- pg_catalog alone, so an object committed after this check is never found.
DO $$
DECLARE
    schema_oid pg_catalog.oid := '@extschema@'::pg_catalog.regnamespace::pg_catalog.oid;
    database_owner_oid pg_catalog.oid := 'pg_database_owner'::pg_catalog.regrole::pg_catalog.oid;
    schema_owner_oid pg_catalog.oid;
    creators text;
    their_code text;
BEGIN
    SELECT CASE WHEN n.nspowner OPERATOR(pg_catalog.=) database_owner_oid
                THEN (SELECT d.datdba FROM pg_catalog.pg_database d
                       WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
                ELSE n.nspowner END
      INTO schema_owner_oid
      FROM pg_catalog.pg_namespace n WHERE n.oid OPERATOR(pg_catalog.=) schema_oid;
    SELECT pg_catalog.string_agg(w.who, ', ') INTO creators FROM (
        (SELECT 'PUBLIC' AS who
           FROM pg_catalog.pg_namespace n,
                pg_catalog.aclexplode(COALESCE(n.nspacl,
                    pg_catalog.acldefault('n'::pg_catalog."char", n.nspowner))) a
          WHERE n.oid OPERATOR(pg_catalog.=) schema_oid
            AND a.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid
            AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'::pg_catalog.text)
        UNION ALL
        (SELECT pg_catalog.quote_ident(r.rolname::pg_catalog.text)
           FROM pg_catalog.pg_roles r
          WHERE NOT r.rolsuper
            AND r.oid OPERATOR(pg_catalog.<>) database_owner_oid
            AND (pg_catalog.has_schema_privilege(r.oid, schema_oid, 'CREATE'::pg_catalog.text)
                 OR pg_catalog.pg_has_role(r.oid, schema_owner_oid, 'USAGE'::pg_catalog.text))
          ORDER BY 1 LIMIT 20)) w;
    WITH code AS (
        SELECT pg_catalog.format('function %s', p.oid::pg_catalog.regprocedure) AS what,
               p.proowner AS owner
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace OPERATOR(pg_catalog.=) schema_oid
        UNION ALL
        SELECT pg_catalog.format('aggregate %s', a.aggfnoid::pg_catalog.regprocedure),
               s.proowner
          FROM pg_catalog.pg_aggregate a
          JOIN pg_catalog.pg_proc p
            ON p.oid OPERATOR(pg_catalog.=) a.aggfnoid::pg_catalog.oid
          JOIN pg_catalog.pg_proc s ON s.oid OPERATOR(pg_catalog.=) ANY (ARRAY[
               a.aggtransfn::pg_catalog.oid, a.aggfinalfn::pg_catalog.oid,
               a.aggcombinefn::pg_catalog.oid, a.aggserialfn::pg_catalog.oid,
               a.aggdeserialfn::pg_catalog.oid, a.aggmtransfn::pg_catalog.oid,
               a.aggminvtransfn::pg_catalog.oid, a.aggmfinalfn::pg_catalog.oid])
         WHERE p.pronamespace OPERATOR(pg_catalog.=) schema_oid
        UNION ALL
        SELECT pg_catalog.format('operator %s', o.oid::pg_catalog.regoperator), c.owner
          FROM pg_catalog.pg_operator o
          CROSS JOIN LATERAL (
              SELECT o.oprowner AS owner
              UNION ALL
              SELECT s.proowner FROM pg_catalog.pg_proc s
               WHERE s.oid OPERATOR(pg_catalog.=) ANY (ARRAY[o.oprcode::pg_catalog.oid,
                     o.oprrest::pg_catalog.oid, o.oprjoin::pg_catalog.oid])) c
         WHERE o.oprnamespace OPERATOR(pg_catalog.=) schema_oid),
    owners AS (SELECT DISTINCT code.owner FROM code),
    untrusted AS (
        SELECT w.owner FROM owners w
         WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_roles s
                            WHERE s.oid OPERATOR(pg_catalog.=) w.owner AND s.rolsuper)
            OR EXISTS (SELECT FROM pg_catalog.pg_roles r
                        WHERE NOT r.rolsuper
                          AND pg_catalog.pg_has_role(r.oid, w.owner, 'USAGE'::pg_catalog.text)))
    SELECT pg_catalog.string_agg(DISTINCT f.what, ', ') INTO their_code FROM (
        SELECT code.what FROM code
          JOIN untrusted u ON u.owner OPERATOR(pg_catalog.=) code.owner
         LIMIT 20) f;
    IF creators IS NOT NULL OR their_code IS NOT NULL THEN
        RAISE EXCEPTION 'sql_query_engine cannot be installed or updated in schema %: a role that is not a superuser owns it, may create in it or owns functions or operators in it',
            '@extschema@'
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('Roles that are not superusers but may create in it or act as its owner: %s. Functions, aggregates and operators in it whose code such roles own or may replace: %s. An operator or function of theirs that matches a call of the extension''s script more closely than pg_catalog''s would run with your rights, and the schema''s owner could put tables of its own in place of the extension''s.',
                      COALESCE(creators, 'none'), COALESCE(their_code, 'none')),
                  HINT = 'Install it in a schema of its own: CREATE SCHEMA nl; GRANT USAGE ON SCHEMA nl TO PUBLIC; CREATE EXTENSION sql_query_engine SCHEMA nl; and add nl to the search path (ALTER DATABASE ... SET search_path = "$user", public, nl). To update it where it is, a superuser takes the schema (ALTER SCHEMA ... OWNER TO), revokes CREATE on it from those roles and moves their functions and operators out first.';
    END IF;
END
$$;
SET LOCAL search_path = pg_catalog, pg_temp;

-- A rename of the extension's schema is refused from now on (see schema_name.sql). The
-- functions that name the schema are made again, with the name it has now: one renamed
-- before this update would have left its old name to whichever schema took it.
CREATE OR REPLACE FUNCTION @extschema@.nl_examples_provenance() RETURNS trigger
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

CREATE OR REPLACE FUNCTION @extschema@.nl_example_remove(example_id bigint) RETURNS boolean
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH gone AS (DELETE FROM @extschema@.nl_examples WHERE id = example_id RETURNING 1)
    SELECT count(*) > 0 FROM gone
$$;

CREATE OR REPLACE FUNCTION @extschema@.nl_feedback_example() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.status <> 'promoted'
       OR (SELECT pg_has_role(c.relowner, 'USAGE') FROM pg_class c WHERE c.oid = TG_RELID) THEN
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

CREATE OR REPLACE FUNCTION @extschema@.nl_query_as("question" text, "shape" anyelement)
RETURNS SETOF anyelement
VOLATILE PARALLEL UNSAFE
LANGUAGE sql
AS $$
    SELECT pg_catalog.jsonb_populate_record(shape, r)
    FROM @extschema@.nl_query_shaped(question, pg_catalog.pg_typeof(shape)::pg_catalog.oid) AS r
$$;

-- The extension's SQL functions and triggers (nl_query_as, nl_example_remove, the examples'
-- and the feedback's checks) name its objects by the schema's name at install, and look the
-- name up again each time they are planned: renamed, the schema would leave its old name to
-- whatever schema another role with CREATE on the database then makes, whose objects those
-- functions would run as their caller. A rename of the extension's schema is refused, whoever
-- makes it; to move the extension, drop it and create it in the other schema. Reads the
-- catalog only, as the role that renames.
CREATE FUNCTION @extschema@.nl_schema_kept() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension e
               JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
               WHERE e.extname = 'sql_query_engine'
                 AND pg_catalog.quote_ident(n.nspname) <> '@extschema@') THEN
        RAISE EXCEPTION 'the schema of sql_query_engine cannot be renamed'
            USING ERRCODE = '55000',
                  DETAIL = 'The extension''s SQL finds its objects by the name @extschema@, which another schema could then take.',
                  HINT = 'To move the extension, drop it and create it in the other schema.';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION @extschema@.nl_schema_kept() FROM PUBLIC;
CREATE EVENT TRIGGER nl_schema_kept ON ddl_command_end WHEN TAG IN ('ALTER SCHEMA')
    EXECUTE FUNCTION @extschema@.nl_schema_kept();

-- Restored or replicated rows go to the role of their name (see nl_row_role in history.sql).
CREATE TRIGGER nl_row_role BEFORE INSERT OR UPDATE ON @extschema@.nl_sessions
    FOR EACH ROW EXECUTE FUNCTION @extschema@.nl_row_role();
ALTER TABLE @extschema@.nl_sessions ENABLE ALWAYS TRIGGER nl_row_role;

-- Examples written before 0.14.0 by a role granted INSERT may be longer than the table now
-- takes: they are never shown (retrieval reads examples up to that length), and a dump of the
-- table would not restore (the check refuses them, and with them every row of the COPY).
DO $$
DECLARE
    longer bigint;
BEGIN
    SELECT count(*) INTO longer FROM @extschema@.nl_examples
    WHERE pg_catalog.length(question) > 10000 OR pg_catalog.length(sql) > 100000;
    IF longer > 0 THEN
        RAISE WARNING '% verified examples of @extschema@.nl_examples are longer than 10,000 characters of question or 100,000 of SQL', longer
            USING DETAIL = 'They are never shown, and a dump of the table would not restore.',
                  HINT = 'Look at them and delete them: DELETE FROM @extschema@.nl_examples WHERE length(question) > 10000 OR length(sql) > 100000;';
    END IF;
END
$$;
