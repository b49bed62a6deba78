-- Saved questions and typed answers as a user meets their refusals: each is raised before the
-- model is asked anything (no endpoint is configured here), with its SQLSTATE.
CREATE EXTENSION sql_query_engine;
\set VERBOSITY default
CREATE SCHEMA reports;
CREATE TABLE reports.a_table (x int);
CREATE VIEW reports.a_view AS SELECT 1 AS x;
CREATE ROLE sqe_regress_saver;
GRANT USAGE ON SCHEMA reports TO sqe_regress_saver;
SET ROLE sqe_regress_saver;
SELECT nl_view('in_public', 'how many?');
SELECT nl_view('reports.mine', 'how many?');
RESET ROLE;
SELECT nl_view('nowhere.v', 'how many?');
SELECT nl_view('reports.a_view', 'how many?');
SELECT nl_view('reports.a_table', 'how many?', replace => true);
SELECT nl_view('a.b.c', 'how many?');
SELECT nl_view_refresh('reports.a_view');
SELECT nl_view_refresh('reports.no_such_view');
BEGIN READ ONLY;
SELECT nl_view('reports.v', 'how many?');
ROLLBACK;
CREATE DOMAIN reports.checked AS text CHECK (VALUE <> '');
CREATE TYPE reports.shape AS (label reports.checked);
SELECT * FROM nl_query_as('how many?', NULL::reports.shape);
SELECT * FROM nl_query_as('how many?', NULL::int);
DROP SCHEMA reports CASCADE;
DROP ROLE sqe_regress_saver;
DROP EXTENSION sql_query_engine;
