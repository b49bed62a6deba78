-- The privileges on the extension's tables, sequences and trigger functions are the ones given
-- here, and no others. Default privileges of the installing role (ALTER DEFAULT PRIVILEGES, in
-- this schema or in all) are given to every object it creates, the extension's too: UPDATE or
-- DELETE on nl_examples would let a role rewrite what every role's model is shown; TRIGGER on
-- any of them, attach code of its own that runs as whoever writes a row (a superuser too);
-- UPDATE on a sequence, set it back (every role's inserts fail on an id a row holds); TRUNCATE,
-- empty a table past row security; EXECUTE on a trigger function, attach it to a table of its
-- own (the examples' audit would write lines of its choosing to the server log). So every
-- privilege of a role other than the owner, PUBLIC's included, is revoked, and PUBLIC's given
-- again. Roles that may write examples are granted INSERT (and DELETE) on nl_examples by the
-- owner, after the install.
DO $$
DECLARE
    extension_oid pg_catalog.oid := (SELECT e.oid FROM pg_catalog.pg_extension e
        WHERE e.extname OPERATOR(pg_catalog.=) 'sql_query_engine'::pg_catalog.name);
    revoked record;
BEGIN
    FOR revoked IN
        SELECT DISTINCT pg_catalog.format('REVOKE ALL ON %s %I.%I FROM %s CASCADE',
                   CASE c.relkind WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END,
                   n.nspname, c.relname,
                   CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
                        ELSE pg_catalog.quote_ident(r.rolname::pg_catalog.text) END) AS command
          FROM pg_catalog.pg_depend d
          JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) d.objid
          JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
          CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) a
          LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
         WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
           AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
           AND d.refobjid OPERATOR(pg_catalog.=) extension_oid
           AND d.deptype OPERATOR(pg_catalog.=) 'e'::pg_catalog."char"
           AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
        UNION
        SELECT pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM %s CASCADE',
                   p.oid::pg_catalog.regprocedure,
                   CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
                        ELSE pg_catalog.quote_ident(r.rolname::pg_catalog.text) END)
          FROM pg_catalog.pg_depend d
          JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) d.objid
          CROSS JOIN LATERAL pg_catalog.aclexplode(COALESCE(p.proacl,
              pg_catalog.acldefault('f'::pg_catalog."char", p.proowner))) a
          LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
         WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
           AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
           AND d.refobjid OPERATOR(pg_catalog.=) extension_oid
           AND d.deptype OPERATOR(pg_catalog.=) 'e'::pg_catalog."char"
           -- (and the invalidation the COMMENT trigger sends: any role could send it for
           -- every relation, and make every backend build its caches again)
           AND (p.prorettype OPERATOR(pg_catalog.=) ANY (ARRAY[
                   'pg_catalog.trigger'::pg_catalog.regtype::pg_catalog.oid,
                   'pg_catalog.event_trigger'::pg_catalog.regtype::pg_catalog.oid])
                OR p.proname OPERATOR(pg_catalog.=) 'nl_relations_commented'::pg_catalog.name)
           AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
    LOOP
        EXECUTE revoked.command;
    END LOOP;
END
$$;
-- Every role reads the examples; reads and writes rows of its own history, conversations and
-- feedback (row security keeps each role to its own); and reads the sequences of the ids the
-- tables draw (nl_drawn_id compares a row's id with the draw).
GRANT SELECT ON @extschema@.nl_examples TO PUBLIC;
GRANT SELECT, INSERT ON @extschema@.nl_history, @extschema@.nl_sessions,
    @extschema@.nl_feedback TO PUBLIC;
GRANT SELECT ON SEQUENCE @extschema@.nl_history_id_seq, @extschema@.nl_feedback_id_seq,
    @extschema@.nl_examples_id_seq TO PUBLIC;
