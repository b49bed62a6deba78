\echo Use "ALTER EXTENSION sql_query_engine UPDATE TO '0.9.0'" to load this file. \quit
-- 0.9.0: feedback is on an answer of the role's own history. Before, a role could insert a
-- row of nl_feedback (its own, pending) on another role's answer, which the owner's review
-- queue then showed as a correction of that answer.
ALTER POLICY own_rows ON @extschema@.nl_feedback
    WITH CHECK (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid
                AND role = current_user AND at = pg_catalog.now()
                AND EXISTS (SELECT FROM @extschema@.nl_history h
                            WHERE h.id = nl_feedback.history_id
                              AND h.role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid)
                AND (status <> 'promoted' OR pg_catalog.has_table_privilege(
                         '@extschema@.nl_examples'::pg_catalog.regclass, 'INSERT')));
