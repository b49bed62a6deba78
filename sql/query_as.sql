-- Answers typed as a row type the caller names: SELECT * FROM nl_query_as('...', NULL::my_type).
-- nl_query_shaped asks for exactly the type's columns (repairing answers with other ones) and
-- keys each row by the type's field names, column by column; jsonb_populate_record converts
-- the values (nl_query_shaped refuses types whose conversion would run code of their own).
CREATE FUNCTION @extschema@.nl_query_as("question" text, "shape" anyelement)
RETURNS SETOF anyelement
VOLATILE PARALLEL UNSAFE
LANGUAGE sql
AS $$
    SELECT pg_catalog.jsonb_populate_record(shape, r)
    FROM @extschema@.nl_query_shaped(question, pg_catalog.pg_typeof(shape)::pg_catalog.oid) AS r
$$;
