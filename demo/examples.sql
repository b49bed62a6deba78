-- A verified example: a question a person answered with SQL they checked. The examples most
-- similar to a question go into its prompt, so the model sees how this schema is joined.
SELECT nl_example_add(
    'What was the revenue per product category in 2024?',
    $$SELECT p.category, sum(oi.quantity * p.price) AS revenue
FROM orders o
JOIN order_items oi ON oi.order_id = o.order_id
JOIN products p ON p.product_id = oi.product_id
WHERE o.ordered_at >= '2024-01-01' AND o.ordered_at < '2025-01-01' AND o.status <> 'cancelled'
GROUP BY p.category
ORDER BY revenue DESC$$
) AS example_id;
