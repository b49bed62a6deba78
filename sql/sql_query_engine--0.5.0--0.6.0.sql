-- sql_query_engine 0.5.0 -> 0.6.0 (ALTER EXTENSION sql_query_engine UPDATE TO '0.6.0').
\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.6.0'" to load this file. \quit

-- A row a role writes into nl_history or nl_feedback is under its own name and of now. Before,
-- only the OID was checked: a role could write a row naming another role, dated in the past,
-- or (in nl_feedback) marked promoted without the right to write examples, and the tables'
-- owner, who reviews them, would read it as such.
ALTER POLICY own_rows ON @extschema@.nl_history
    USING (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid)
    WITH CHECK (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid
                AND role = current_user AND at = pg_catalog.now());
ALTER POLICY own_rows ON @extschema@.nl_feedback
    USING (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid)
    WITH CHECK (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid
                AND role = current_user AND at = pg_catalog.now()
                AND (status <> 'promoted' OR pg_catalog.has_table_privilege(
                         '@extschema@.nl_examples'::pg_catalog.regclass, 'INSERT')));
