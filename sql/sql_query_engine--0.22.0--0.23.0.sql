-- 0.22.0 -> 0.23.0
\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.23.0'" to load this file. \quit


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

-- What roles made while they held privileges that 0.20.0 and 0.21.0 took away outlived the
-- revoke, and a fresh install has none of it: a trigger of theirs on a table of the extension
-- (it runs as whoever writes a row: a superuser's call writes its history), a trigger of a table
-- of theirs that calls one of the extension's trigger functions (the examples' audit would write
-- lines of their choosing to the server log), a foreign key of their table to one of the
-- extension's (its actions run at every delete of an example, and its locks are held), and what
-- they passed on with a grant option (INSERT on nl_examples granted to PUBLIC made every role an
-- example writer), also on columns. Each is dropped or revoked, and named in a WARNING; so is
-- what default privileges gave beyond a fresh install's (SELECT on nl_sessions' sequence).
-- First, and waiting at most so long for another session's lock on a table of a role's: an
-- open transaction of the role's would otherwise hold up the update, and every role's calls
-- behind the locks it takes on the extension's tables.
DO $$
DECLARE
    extension_oid oid := (SELECT e.oid FROM pg_extension e
                          WHERE e.extname = 'sql_query_engine');
    undone record;
    forged bigint;
    -- The caller's own bound, put back at the end (as a local setting of its transaction).
    caller_lock_timeout text := current_setting('lock_timeout');
BEGIN
    PERFORM set_config('lock_timeout', '30s', true);
    FOR undone IN
        WITH members AS (
            SELECT d.objid AS oid FROM pg_depend d
             WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_extension'::regclass
               AND d.refobjid = extension_oid AND d.deptype = 'e'),
        functions AS (
            SELECT d.objid AS oid FROM pg_depend d
             WHERE d.classid = 'pg_proc'::regclass AND d.refclassid = 'pg_extension'::regclass
               AND d.refobjid = extension_oid AND d.deptype = 'e')
        -- Triggers on the extension's tables that are not the extension's, and triggers of
        -- other tables that call its trigger functions.
        -- (Not a partition's clone of a trigger, dropped with its parent's.)
        SELECT format('DROP TRIGGER IF EXISTS %I ON %I.%I', t.tgname, n.nspname, c.relname)
                   AS command,
               format('trigger %I on %I.%I dropped', t.tgname, n.nspname, c.relname) AS what
          FROM pg_trigger t
          JOIN pg_class c ON c.oid = t.tgrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE NOT t.tgisinternal AND t.tgparentid = 0
           AND (t.tgrelid IN (SELECT oid FROM members))
               <> (t.tgfoid IN (SELECT oid FROM functions))
        UNION ALL
        -- Foreign keys of other tables to the extension's (not a partition's, dropped with its
        -- parent's).
        SELECT format('ALTER TABLE %I.%I DROP CONSTRAINT IF EXISTS %I', n.nspname, c.relname,
                   k.conname),
               format('foreign key %I of %I.%I dropped', k.conname, n.nspname, c.relname)
          FROM pg_constraint k
          JOIN pg_class c ON c.oid = k.conrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE k.contype = 'f' AND k.conparentid = 0 AND k.confrelid IN (SELECT oid FROM members)
           AND k.conrelid NOT IN (SELECT oid FROM members)
        UNION ALL
        -- Grant options (granted by the owner: revoking them takes what was passed on).
        SELECT format('REVOKE GRANT OPTION FOR %s ON %s %I.%I FROM %s CASCADE',
                   a.privilege_type, CASE c.relkind WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END,
                   n.nspname, c.relname, quote_ident(r.rolname::text)),
               format('grant option for %s on %I.%I revoked from %I', a.privilege_type,
                   n.nspname, c.relname, r.rolname)
          FROM pg_class c
          JOIN pg_namespace n ON n.oid = c.relnamespace
          CROSS JOIN LATERAL aclexplode(c.relacl) a
          JOIN pg_roles r ON r.oid = a.grantee
         WHERE c.oid IN (SELECT oid FROM members)
           AND a.is_grantable AND a.grantee <> c.relowner AND a.grantor = c.relowner
    LOOP
        RAISE WARNING 'sql_query_engine: %', undone.what;
        EXECUTE undone.command;
    END LOOP;
    -- Then what a fresh install does not give (privileges.sql): every privilege of a role but
    -- the owner beyond SELECT on the tables, INSERT on nl_history, nl_sessions and
    -- nl_feedback, SELECT on the sequences of the ids those tables draw from PUBLIC, and
    -- INSERT and DELETE on nl_examples granted to a role (not PUBLIC) that writes examples.
    FOR undone IN
        SELECT format('REVOKE %s ON %s %I.%I FROM %s CASCADE', a.privilege_type,
                   CASE c.relkind WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END,
                   n.nspname, c.relname,
                   CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                        ELSE quote_ident(r.rolname::text) END) AS command,
               format('%s on %I.%I revoked from %s', a.privilege_type, n.nspname, c.relname,
                   CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                        ELSE quote_ident(r.rolname::text) END) AS what
          FROM pg_depend d
          JOIN pg_class c ON c.oid = d.objid
          JOIN pg_namespace n ON n.oid = c.relnamespace
          CROSS JOIN LATERAL aclexplode(c.relacl) a
          LEFT JOIN pg_roles r ON r.oid = a.grantee
         WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_extension'::regclass
           AND d.refobjid = extension_oid AND d.deptype = 'e'
           AND a.grantee <> c.relowner
           AND NOT (a.privilege_type = 'SELECT' AND c.relkind <> 'S')
           AND NOT (a.privilege_type = 'SELECT' AND a.grantee = 0
                    AND c.relname IN ('nl_history_id_seq', 'nl_feedback_id_seq',
                                      'nl_examples_id_seq'))
           AND NOT (a.privilege_type = 'INSERT'
                    AND c.relname IN ('nl_history', 'nl_sessions', 'nl_feedback'))
           AND NOT (a.privilege_type IN ('INSERT', 'DELETE') AND a.grantee <> 0
                    AND c.relname = 'nl_examples')
    LOOP
        RAISE WARNING 'sql_query_engine: %', undone.what;
        EXECUTE undone.command;
    END LOOP;
    -- Column grants: a fresh install has none, and a grant a role made on a column with the
    -- grant option it had on the table is not taken with that option (it is recorded on the
    -- column alone). A grant of the owner's is revoked; one of another grantor's, by giving
    -- that grantor the option on the column and taking it back at once, with what it gave.
    FOR undone IN
        SELECT DISTINCT
               CASE WHEN x.grantor <> c.relowner
                    THEN format('GRANT %s (%I) ON %I.%I TO %I WITH GRANT OPTION',
                                x.privilege_type, a.attname, n.nspname, c.relname, g.rolname)
               END AS lend,
               format('REVOKE %s (%I) ON %I.%I FROM %s CASCADE', x.privilege_type,
                      a.attname, n.nspname, c.relname,
                      CASE WHEN x.grantor <> c.relowner THEN quote_ident(g.rolname::text)
                           WHEN x.grantee = 0 THEN 'PUBLIC'
                           ELSE quote_ident(r.rolname::text) END) AS command,
               format('%s (%I) on %I.%I revoked from %s', x.privilege_type, a.attname,
                      n.nspname, c.relname,
                      CASE WHEN x.grantor <> c.relowner
                           THEN pg_catalog.format('what %I gave', g.rolname)
                           WHEN x.grantee = 0 THEN 'PUBLIC'
                           ELSE quote_ident(r.rolname::text) END) AS what
          FROM pg_depend d
          JOIN pg_class c ON c.oid = d.objid
          JOIN pg_namespace n ON n.oid = c.relnamespace
          JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND a.attacl IS NOT NULL
          CROSS JOIN LATERAL aclexplode(a.attacl) x
          JOIN pg_roles g ON g.oid = x.grantor
          LEFT JOIN pg_roles r ON r.oid = x.grantee
         WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_extension'::regclass
           AND d.refobjid = extension_oid AND d.deptype = 'e'
           AND x.grantee <> c.relowner
    LOOP
        RAISE WARNING 'sql_query_engine: %', undone.what;
        IF undone.lend IS NOT NULL THEN
            EXECUTE undone.lend;
        END IF;
        EXECUTE undone.command;
    END LOOP;
    -- Rows whose name is not their writer's: from 0.3.0 to 0.5.0 row security checked only a
    -- row's OID, and a role could write rows under another's name. A restore (or logical
    -- replication) gives each row to the role of its name.
    SELECT (SELECT count(*) FROM @extschema@.nl_history
             WHERE role_id <> 0 AND to_regrole(quote_ident(role)) IS DISTINCT FROM role_id)
         + (SELECT count(*) FROM @extschema@.nl_feedback
             WHERE role_id <> 0 AND to_regrole(quote_ident(role)) IS DISTINCT FROM role_id)
         + (SELECT count(*) FROM @extschema@.nl_sessions
             WHERE role_id <> 0 AND to_regrole(quote_ident(role)) IS DISTINCT FROM role_id)
      INTO forged;
    IF forged > 0 THEN
        RAISE WARNING 'sql_query_engine: % rows of nl_history, nl_feedback and nl_sessions name a role other than the one that wrote them', forged
            USING HINT = 'A role could write such rows before 0.5.0 (or the role of the name was renamed since). A restore or logical replication gives each row to the role of its name: review them (role_id is the writer) before either.';
    END IF;
    PERFORM set_config('lock_timeout', caller_lock_timeout, true);
END
$$;

-- Rows are dated as they are written, not at the start of their transaction (`now()`), which a
-- writer could hold open to backdate a row of the history, the feedback or the examples, or to
-- have a session turn expire early: for every writer but the table's owner, nl_row_role and
-- nl_examples_provenance set the time themselves, whatever the row says (row security no longer
-- compares it with now()), and the columns default to the clock.
ALTER TABLE @extschema@.nl_history ALTER COLUMN at SET DEFAULT pg_catalog.clock_timestamp();
ALTER TABLE @extschema@.nl_sessions ALTER COLUMN at SET DEFAULT pg_catalog.clock_timestamp();
ALTER TABLE @extschema@.nl_feedback ALTER COLUMN at SET DEFAULT pg_catalog.clock_timestamp();
ALTER TABLE @extschema@.nl_examples ALTER COLUMN added_at SET DEFAULT pg_catalog.clock_timestamp();
ALTER POLICY own_rows ON @extschema@.nl_history
    WITH CHECK (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid
                AND role = current_user);
ALTER POLICY own_sessions ON @extschema@.nl_sessions
    WITH CHECK (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid
                AND role = current_user);
ALTER POLICY own_rows ON @extschema@.nl_feedback
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
CREATE OR REPLACE FUNCTION @extschema@.nl_row_role() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' AND NOT (SELECT pg_has_role(c.relowner, 'USAGE') FROM pg_class c
                                  WHERE c.oid = TG_RELID) THEN
        IF NEW.role IS DISTINCT FROM current_user
                OR NEW.role_id IS DISTINCT FROM quote_ident(current_user)::regrole::oid THEN
            RAISE EXCEPTION 'a row of % is its writer''s own, under its own name',
                TG_TABLE_NAME USING ERRCODE = '42501';
        END IF;
        NEW.at := clock_timestamp();
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
CREATE OR REPLACE FUNCTION @extschema@.nl_examples_provenance() RETURNS trigger
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

