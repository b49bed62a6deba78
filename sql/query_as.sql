-- Answers typed as a row type the caller names: SELECT * FROM nl_query_as('...', NULL::my_type).
-- nl_query_shaped asks for exactly the type's columns (repairing answers with other ones) and
-- keys each row by the type's field names, column by column; jsonb_populate_record converts
-- the values (nl_query_shaped refuses types whose conversion would run code of their own, and
-- checks the type again, as the catalog is, once the answer is there). Every row is converted
-- as the call runs (RETURN QUERY EXECUTE), right after that check, not as its caller fetches them
-- (a cursor, a driver's fetch size): a CHECK the type's owner gave a domain of it meanwhile
-- would run as the caller. No search path of its own: the question is asked on the caller's.
CREATE FUNCTION @extschema@.nl_query_as("question" text, "shape" anyelement)
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
