-- 0.19.0 -> 0.20.0
\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.20.0'" to load this file. \quit

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

-- A row a role writes itself is its own, under its own OID and name, and of now, also for a
-- role row security does not apply to (BYPASSRLS), and in replica mode: see nl_row_role in
-- history.sql.
CREATE OR REPLACE FUNCTION @extschema@.nl_row_role() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' AND NOT (SELECT pg_has_role(c.relowner, 'USAGE') FROM pg_class c
                                  WHERE c.oid = TG_RELID) THEN
        IF NEW.role IS DISTINCT FROM current_user
                OR NEW.role_id IS DISTINCT FROM quote_ident(current_user)::regrole::oid
                OR NEW.at IS DISTINCT FROM now() THEN
            RAISE EXCEPTION 'a row of % is its writer''s own, under its own name, and of now',
                TG_TABLE_NAME USING ERRCODE = '42501';
        END IF;
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.role IS NOT DISTINCT FROM OLD.role
            AND pg_catalog.current_setting('session_replication_role') <> 'replica' THEN
        RETURN NEW;
    END IF;
    IF NEW.role_id <> 0 THEN
        NEW.role_id := coalesce(
            pg_catalog.to_regrole(pg_catalog.quote_ident(NEW.role))::pg_catalog.oid, 0);
    END IF;
    RETURN NEW;
END
$$;

-- Feedback from a writer row security does not bind is held to what the policy checks (see
-- feedback.sql).
CREATE OR REPLACE FUNCTION @extschema@.nl_feedback_example() RETURNS trigger
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

-- The checks of who writes what fire in replica mode too, which a role may be let set; only
-- the tables' owner writes rows as given.
ALTER TABLE @extschema@.nl_feedback ENABLE ALWAYS TRIGGER nl_feedback_example;
ALTER TABLE @extschema@.nl_history ENABLE ALWAYS TRIGGER nl_drawn_id;
ALTER TABLE @extschema@.nl_feedback ENABLE ALWAYS TRIGGER nl_drawn_id;
ALTER TABLE @extschema@.nl_examples ENABLE ALWAYS TRIGGER nl_drawn_id;
ALTER TABLE @extschema@.nl_examples ENABLE ALWAYS TRIGGER nl_examples_provenance;
ALTER TABLE @extschema@.nl_examples ENABLE ALWAYS TRIGGER nl_examples_audit;
ALTER TABLE @extschema@.nl_examples ENABLE ALWAYS TRIGGER nl_examples_audit_truncate;

-- The trigger functions are the owner's to call: attached to a table of a role's own, the
-- examples' audit would write lines of its choosing into the server log.
REVOKE EXECUTE ON FUNCTION @extschema@.nl_row_role() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION @extschema@.nl_feedback_example() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION @extschema@.nl_drawn_id() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION @extschema@.nl_examples_provenance() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION @extschema@.nl_examples_audit() FROM PUBLIC;

-- Every question sums the rows of the schemas it reads through an index (see
-- schema_version.sql).
CREATE INDEX nl_schema_changes_schema_idx ON @extschema@.nl_schema_changes (schema_name)
    INCLUDE (changes);

-- An example's source is an answer of its writer's own history, also for a writer row
-- security does not bind (see examples.sql).
CREATE OR REPLACE FUNCTION @extschema@.nl_examples_provenance() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF (SELECT pg_has_role(c.relowner, 'USAGE') FROM pg_class c WHERE c.oid = TG_RELID) THEN
        RETURN NEW;
    END IF;
    NEW.added_by := current_user;
    NEW.added_at := now();
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

-- nl_query_as converts every row as the call runs, right after its type is checked again (see
-- query_as.sql).
CREATE OR REPLACE FUNCTION @extschema@.nl_query_as("question" text, "shape" anyelement)
RETURNS SETOF anyelement
VOLATILE PARALLEL UNSAFE
LANGUAGE plpgsql
AS $$
BEGIN
    -- EXECUTE: planned at each call, with the type's columns as they are then (a plan kept
    -- for the session would expand `p.*` as it was when first planned).
    RETURN QUERY EXECUTE
        $q$SELECT p.* FROM @extschema@.nl_query_shaped($1, pg_catalog.pg_typeof($2)::pg_catalog.oid) AS r,
             LATERAL pg_catalog.jsonb_populate_record($2, r) AS p$q$
        USING question, shape;
END
$$;

-- The event triggers fire in replica mode too.
ALTER EVENT TRIGGER nl_schema_changed ENABLE ALWAYS;
ALTER EVENT TRIGGER nl_schema_kept ENABLE ALWAYS;
