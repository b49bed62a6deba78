-- The upgrade path: from the first release, through every upgrade script, to this one.
CREATE EXTENSION sql_query_engine VERSION '0.1.0';
SELECT extversion FROM pg_extension WHERE extname = 'sql_query_engine';
ALTER EXTENSION sql_query_engine UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'sql_query_engine';
SELECT pg_describe_object(classid, objid, objsubid) AS member
FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
WHERE e.extname = 'sql_query_engine' AND d.deptype = 'e'
  -- tables' row types are members since PostgreSQL 17; the extension has no types of its own
  AND d.classid <> 'pg_type'::regclass
ORDER BY 1;
DROP EXTENSION sql_query_engine;
