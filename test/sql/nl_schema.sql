-- The schema context exactly as the model reads it: compact DDL with keys, comments, enum
-- labels and sample values, and what a question about part of it is shown.
CREATE EXTENSION sql_query_engine;
SET client_min_messages = warning;
CREATE SCHEMA shop;
SET search_path = shop, public;
CREATE TYPE status AS ENUM ('open', 'shipped', 'returned');
CREATE TABLE customers (
    customer_id integer PRIMARY KEY,
    name text NOT NULL,
    country text NOT NULL
);
COMMENT ON TABLE customers IS 'People and companies that buy from the shop';
COMMENT ON COLUMN customers.country IS 'ISO 3166 two-letter code';
CREATE TABLE orders (
    order_id integer PRIMARY KEY,
    customer_id integer NOT NULL REFERENCES customers(customer_id),
    ordered_on date NOT NULL DEFAULT current_date,
    status status NOT NULL DEFAULT 'open',
    amount numeric(10,2) NOT NULL
);
CREATE VIEW big_orders AS SELECT * FROM orders WHERE amount > 100;
INSERT INTO customers VALUES (1, 'Ada', 'GB'), (2, 'Bruno', 'DE'), (3, 'Chiara', 'IT');
INSERT INTO orders VALUES (10, 1, '2024-01-05', 'open', 9.50), (11, 2, '2024-02-11', 'shipped', 120.00);
SET sql_query_engine.schemas = 'shop';
\pset format unaligned
\pset tuples_only on
SELECT nl_schema();
SET sql_query_engine.sample_values = 0;
SELECT nl_schema();
RESET sql_query_engine.sample_values;
SET sql_query_engine.prompt_budget = 100;
SELECT nl_schema('which customers from DE placed orders?');
DROP SCHEMA shop CASCADE;
DROP EXTENSION sql_query_engine;
