-- The history of questions: one row per call of a function that answers one (see
-- sql_query_engine.history). Its owner reads every row; other roles see only their own (row
-- level security), told apart by OID, so that a role dropped and created again under the same
-- name, or renamed, is never another role. The OID is looked up by the role's exact name
-- (quote_ident: a name is not read as an identifier, which would fold "Alice" to alice). Written in the caller's transaction, best effort:
-- skipped in read-only transactions and on standbys (the server log keeps an audit line of
-- every call; see sql_query_engine.audit_log).
CREATE TABLE @extschema@.nl_history (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    role name NOT NULL DEFAULT current_user,
    function text NOT NULL,
    session text,
    question text NOT NULL,
    sql text,
    status text NOT NULL,
    attempts jsonb NOT NULL,
    row_count integer,
    ms double precision NOT NULL,
    llm_calls integer NOT NULL,
    prompt_tokens integer NOT NULL,
    completion_tokens integer NOT NULL,
    role_id oid NOT NULL DEFAULT pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid
);
CREATE INDEX nl_history_role_id_at_idx ON @extschema@.nl_history (role_id, at);
ALTER TABLE @extschema@.nl_history ENABLE ROW LEVEL SECURITY;
-- A row a role writes is its own, under its own name (and dated by nl_row_role as it is
-- written): the table's owner reads who asked what and when from it.
CREATE POLICY own_rows ON @extschema@.nl_history
    USING (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid)
    WITH CHECK (role_id = pg_catalog.quote_ident(current_user)::pg_catalog.regrole::pg_catalog.oid
                AND role = current_user);
-- Its privileges: privileges.sql.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.nl_history', '');

-- A row names its role twice: by OID, which means something only in the cluster that wrote it,
-- and by name, which is how a dump carries roles (pg_dumpall --roles-only creates them again,
-- under other OIDs). A row that comes in (restored from a dump, copied by logical replication)
-- under an OID that is not the role of its name here goes to the role of that name, or to none
-- (0: only the table's owner reads it), as a restore's GRANTs go to roles by name. Nothing in a
-- row tells which cluster's OID it holds: a copy of a cluster's files (a base backup, a
-- snapshot) shares its system identifier and hands out the same OIDs to other roles. The owner's
-- own updates keep a row's OID unless they change its name: a row of a role since renamed (or
-- dropped, its name taken by a new role) stays with the role that wrote it. Updates a
-- subscription applies (session_replication_role replica) come from the other cluster, and go
-- by name. to_regrole needs no right on pg_roles.
--
-- A row a role writes itself is its own, under its own OID and name: row security checks that
-- for the roles it applies to, and this for those it does not (BYPASSRLS), which would
-- otherwise write turns into another role's conversations (read into that role's prompts) and
-- history or feedback under its name, also in replica mode (a role may be let set
-- session_replication_role, and a subscription need not apply as the owner). And it is dated
-- as it is written, whatever it says: not `now()`, the start of its transaction, which a
-- writer could hold open to backdate it (or a session turn, to have it expire early). Only the
-- table's owner (a restore, a subscription applying as the owner) writes rows as given. No role
-- but the owner may call it: a trigger of another table would write nothing of these.
CREATE FUNCTION @extschema@.nl_row_role() RETURNS trigger
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
-- Its privileges: privileges.sql.
CREATE TRIGGER nl_row_role BEFORE INSERT OR UPDATE ON @extschema@.nl_history
    FOR EACH ROW EXECUTE FUNCTION @extschema@.nl_row_role();
-- Also for the rows a logical replication subscription applies.
ALTER TABLE @extschema@.nl_history ENABLE ALWAYS TRIGGER nl_row_role;
