-- The demo database: a small shop.
CREATE TABLE customers (
    customer_id integer PRIMARY KEY,
    name text NOT NULL,
    country text NOT NULL,
    signed_up date NOT NULL
);
COMMENT ON COLUMN customers.country IS 'ISO 3166 two-letter country code';

CREATE TABLE products (
    product_id integer PRIMARY KEY,
    name text NOT NULL,
    category text NOT NULL,
    price numeric(10,2) NOT NULL
);

CREATE TABLE orders (
    order_id integer PRIMARY KEY,
    customer_id integer NOT NULL REFERENCES customers(customer_id),
    ordered_at timestamp NOT NULL,
    status text NOT NULL CHECK (status IN ('placed', 'shipped', 'delivered', 'cancelled'))
);

CREATE TABLE order_items (
    order_id integer NOT NULL REFERENCES orders(order_id),
    product_id integer NOT NULL REFERENCES products(product_id),
    quantity integer NOT NULL,
    PRIMARY KEY (order_id, product_id)
);

INSERT INTO customers
SELECT i, (ARRAY['Ada','Bruno','Chiara','Dmitri','Elif','Farah','Goran','Hana','Ivo','Jun'])[i],
       (ARRAY['GB','DE','IT','DE','TR','FR','RS','JP','HR','JP'])[i],
       date '2023-01-01' + (i * 37)
FROM generate_series(1, 10) AS i;

INSERT INTO products VALUES
    (1, 'Espresso beans 1kg', 'coffee', 24.90), (2, 'Filter papers', 'accessories', 3.50),
    (3, 'Hand grinder', 'equipment', 89.00), (4, 'Green tea 100g', 'tea', 7.25),
    (5, 'Milk frother', 'equipment', 39.99), (6, 'Decaf beans 500g', 'coffee', 13.40),
    (7, 'Gift card', 'gift', 25.00);

INSERT INTO orders
SELECT i, 1 + (i * 7) % 10, timestamp '2024-01-03 09:00' + (i * interval '4 days 3 hours'),
       (ARRAY['placed','shipped','delivered','delivered','cancelled'])[1 + i % 5]
FROM generate_series(1, 90) AS i;

INSERT INTO order_items
SELECT o, 1 + (o * 5 + k) % 6, 1 + (o + k) % 3
FROM generate_series(1, 90) AS o, generate_series(0, 1 + o % 2) AS k
ON CONFLICT DO NOTHING;

ANALYZE;
