-- A small shop: enough to answer questions with joins, exact numerics, dates and empty results.
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
    ordered_on date NOT NULL,
    amount numeric(10,2) NOT NULL
);

CREATE TABLE secrets (
    id integer PRIMARY KEY,
    note text
);

INSERT INTO customers VALUES
    (1, 'Ada', 'GB'), (2, 'Bruno', 'DE'), (3, 'Chiara', 'IT'), (4, 'Dmitri', 'DE');
INSERT INTO orders VALUES
    (10, 1, '2024-01-05', 9.50), (11, 1, '2024-02-11', 120.00), (12, 2, '2024-03-01', 35.25),
    (13, 3, '2023-12-24', 80.00), (14, 4, '2024-06-30', 5.00), (15, 2, '2024-07-14', 64.10);
INSERT INTO secrets VALUES (1, 'do not show');
