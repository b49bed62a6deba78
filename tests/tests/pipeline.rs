//! The self-healing pipeline end to end: nl_query, nl_generate and nl_trace through a real
//! client, with the scripted model.

use std::time::Duration;

use serde_json::json;
use sql_query_engine_e2e::{db_error, Reply, Session};

#[test]
fn rows_are_accepted_after_one_model_call() {
    let mut s = Session::new();
    s.llm.on(
        "Which customers are from Germany?",
        vec![Reply::sql(
            "SELECT name, country FROM customers WHERE country = 'DE' ORDER BY name",
        )],
    );
    let rows = s.query("Which customers are from Germany?").unwrap();
    assert_eq!(
        rows,
        vec![
            json!({"name": "Bruno", "country": "DE"}),
            json!({"name": "Dmitri", "country": "DE"})
        ]
    );
    let requests = s.llm.requests();
    assert_eq!(requests.len(), 1, "early accept: no second call");
    let told = requests[0].text();
    assert!(
        told.contains("Which customers are from Germany?"),
        "question verbatim"
    );
    assert!(told.contains("CREATE TABLE customers"), "schema context");
    assert!(
        told.contains("REFERENCES customers(customer_id)"),
        "foreign keys"
    );
    assert!(told.contains("ISO 3166 two-letter code"), "column comments");
    assert_eq!(requests[0].path, "/v1/chat/completions");
    assert_eq!(requests[0].body["stream"], false);
}

#[test]
fn values_are_built_by_postgres_in_query_order() {
    let mut s = Session::new();
    s.llm.on(
        "orders by amount",
        vec![Reply::sql(
            "SELECT order_id, amount, ordered_on, amount * 2 AS doubled FROM orders ORDER BY amount DESC LIMIT 3",
        )],
    );
    let rows = s.query("orders by amount").unwrap();
    let ids: Vec<i64> = rows
        .iter()
        .map(|r| r["order_id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [11, 13, 15], "rows keep the query's order");
    // exact numerics (scale kept) and dates as PostgreSQL renders them
    let first = &rows[0];
    assert_eq!(first["ordered_on"], "2024-02-11");
    assert_eq!(first["amount"].to_string(), "120.00");
    assert_eq!(first["doubled"].to_string(), "240.00");
}

#[test]
fn duplicate_column_names_are_all_kept() {
    let mut s = Session::new();
    s.llm.on(
        "pairs",
        vec![Reply::sql(
            "SELECT c.name, o.order_id AS name FROM customers c JOIN orders o USING (customer_id) WHERE o.order_id = 10",
        )],
    );
    let rows = s.query("pairs").unwrap();
    assert_eq!(rows, vec![json!({"name": "Ada", "name_2": 10})]);
}

#[test]
fn an_error_is_repaired_with_everything_postgres_said() {
    let mut s = Session::new();
    s.llm.on(
        "How many orders per customer name?",
        vec![
            Reply::sql("SELECT c.nme, count(*) FROM customers c JOIN orders o USING (customer_id) GROUP BY 1"),
            Reply::sql(
                "SELECT c.name, count(*) AS n FROM customers c JOIN orders o USING (customer_id) GROUP BY 1 ORDER BY 1",
            ),
        ],
    );
    let trace = s.trace("How many orders per customer name?").unwrap();
    assert_eq!(trace["status"], "ok");
    assert_eq!(trace["row_count"], 4);
    assert_eq!(trace["llm_calls"], 2);
    let first = &trace["attempts"][0];
    assert_eq!(first["outcome"], "error");
    assert_eq!(first["sqlstate"], "42703");
    assert_eq!(first["position"], 8, "the error position is recovered");
    assert_eq!(trace["attempts"][1]["outcome"], "rows");

    let repair = &s.llm.requests()[1];
    let feedback = repair.last_message();
    assert!(
        feedback.contains("SELECT c.nme, count(*)"),
        "failed SQL verbatim: {feedback}"
    );
    assert!(feedback.contains("42703"), "{feedback}");
    assert!(
        feedback.contains("column c.nme does not exist"),
        "{feedback}"
    );
    assert!(
        feedback.contains("HINT: Perhaps you meant to reference the column \"c.name\""),
        "{feedback}"
    );
    assert!(
        feedback.contains("The columns of customers are: customer_id, name, country."),
        "the repair names the columns of the tables the query used: {feedback}"
    );
    assert!(repair.text().contains("How many orders per customer name?"));
}

#[test]
fn a_column_on_the_wrong_table_is_mended_and_the_repair_is_asked_about_the_name_left() {
    let mut s = Session::new();
    s.llm.on(
        "names of customers who ordered",
        vec![
            // Joined to customers, it fails on another name no relation has: the repair starts
            // from the mended query, and is told which columns are named like the missing one.
            Reply::sql("SELECT o.name FROM orders o WHERE o.nickname IS NOT NULL"),
            Reply::sql("SELECT DISTINCT c.name FROM orders o JOIN customers c USING (customer_id)"),
        ],
    );
    let trace = s.trace("names of customers who ordered").unwrap();
    assert_eq!(trace["status"], "ok");
    let first = &trace["attempts"][0];
    assert_eq!(
        first["sql"],
        "SELECT customers.name FROM orders o JOIN customers ON customers.customer_id = \
         o.customer_id WHERE o.nickname IS NOT NULL"
    );
    assert_eq!(
        first["requalified"],
        json!(["o.name → customers.name, joined by customers.customer_id = o.customer_id"])
    );
    assert_eq!(first["sqlstate"], "42703");
    let feedback = s.llm.requests()[1].last_message();
    assert!(
        feedback.contains("JOIN customers ON customers.customer_id = o.customer_id WHERE"),
        "the repair starts from the mended query: {feedback}"
    );
    assert!(!feedback.contains("SELECT o.name"), "{feedback}");
    assert!(
        feedback.contains("column o.nickname does not exist"),
        "{feedback}"
    );
    assert!(
        feedback.contains(
            "No table has a column nickname; columns with a similar name: customers.name."
        ),
        "{feedback}"
    );
}

#[test]
fn a_column_behind_the_wrong_alias_runs_from_the_one_table_that_has_it_without_a_repair() {
    let mut s = Session::new();
    s.llm.on(
        "total amount per customer name",
        vec![Reply::sql(
            "SELECT O.name, sum(o.amount) AS total FROM customers c \
             JOIN orders o ON o.customer_id = c.customer_id \
             WHERE o.name <> 'nobody' GROUP BY o.name ORDER BY o.name",
        )],
    );
    let trace = s.trace("total amount per customer name").unwrap();
    assert_eq!(trace["status"], "ok");
    assert_eq!(trace["llm_calls"], 1, "no repair was asked for");
    let attempt = &trace["attempts"][0];
    assert_eq!(attempt["outcome"], "rows");
    assert_eq!(attempt["requalified"], json!(["o.name → c.name"]));
    assert_eq!(
        attempt["sql"],
        "SELECT c.name, sum(o.amount) AS total FROM customers c \
         JOIN orders o ON o.customer_id = c.customer_id \
         WHERE c.name <> 'nobody' GROUP BY c.name ORDER BY c.name"
    );
    assert_eq!(trace["sql"], attempt["sql"]);
}

#[test]
fn a_qualifier_is_read_in_the_select_it_is_written_in() {
    let mut s = Session::new();
    // The outer o (orders) has no name; the subquery's own o (customers) has, and keeps it.
    s.llm.on(
        "orders per customer whose name starts with A",
        vec![Reply::sql(
            "SELECT o.name, count(*) AS orders FROM customers c \
             JOIN orders o ON o.customer_id = c.customer_id \
             WHERE EXISTS (SELECT 1 FROM customers o WHERE o.customer_id = c.customer_id \
             AND o.name LIKE 'A%') GROUP BY o.name",
        )],
    );
    let trace = s
        .trace("orders per customer whose name starts with A")
        .unwrap();
    assert_eq!(trace["llm_calls"], 1, "no repair was asked for");
    let attempt = &trace["attempts"][0];
    assert_eq!(attempt["requalified"], json!(["o.name → c.name"]));
    assert_eq!(
        attempt["sql"],
        "SELECT c.name, count(*) AS orders FROM customers c \
         JOIN orders o ON o.customer_id = c.customer_id \
         WHERE EXISTS (SELECT 1 FROM customers o WHERE o.customer_id = c.customer_id \
         AND o.name LIKE 'A%') GROUP BY c.name"
    );
    assert_eq!(
        attempt["row_count"],
        s.scalar_i64(
            "SELECT count(DISTINCT customer_id) FROM orders JOIN customers USING (customer_id) \
             WHERE name LIKE 'A%'"
        )
    );
}

/// A session whose database also has payments, one per order, referencing orders.
fn session_with_payments() -> Session {
    let mut s = Session::new();
    s.client
        .batch_execute(
            "CREATE TABLE payments (payment_id int PRIMARY KEY,
                                    order_id int REFERENCES orders(order_id), paid numeric);
             INSERT INTO payments SELECT order_id, order_id, amount FROM orders;",
        )
        .unwrap();
    s
}

#[test]
fn a_column_two_joined_tables_share_runs_from_the_first_of_them() {
    let mut s = session_with_payments();
    // customer_id is in orders and customers, which the query joins on it: either is meant.
    s.llm.on(
        "paid per customer",
        vec![Reply::sql(
            "SELECT p.customer_id, sum(p.paid) AS paid FROM payments p \
             JOIN orders o ON o.order_id = p.order_id \
             JOIN customers c ON c.customer_id = o.customer_id \
             GROUP BY p.customer_id ORDER BY p.customer_id",
        )],
    );
    let trace = s.trace("paid per customer").unwrap();
    assert_eq!(trace["status"], "ok");
    assert_eq!(trace["llm_calls"], 1, "no repair was asked for");
    let attempt = &trace["attempts"][0];
    assert_eq!(
        attempt["requalified"],
        json!(["p.customer_id → o.customer_id"])
    );
    let expected: i64 = s.scalar_i64("SELECT count(DISTINCT customer_id) FROM orders");
    assert_eq!(attempt["row_count"], expected);
}

#[test]
fn a_rewrite_whose_names_resolve_is_repaired_from_its_own_error() {
    let mut s = session_with_payments();
    s.client
        .batch_execute("SET sql_query_engine.max_repairs = 1")
        .unwrap();
    // p.customer_id: orders has it (moved there); then p.paid is not grouped: the model's own
    // mistake, which the repair request shows on the moved query.
    let fixed = "SELECT o.customer_id, sum(p.paid) AS paid FROM payments p \
                 JOIN orders o ON o.order_id = p.order_id GROUP BY o.customer_id";
    s.llm.on(
        "paid per customer, per payment",
        vec![
            Reply::sql(
                "SELECT p.customer_id, p.paid FROM payments p \
                 JOIN orders o ON o.order_id = p.order_id GROUP BY p.customer_id",
            ),
            Reply::sql(fixed),
        ],
    );
    let trace = s.trace("paid per customer, per payment").unwrap();
    assert_eq!(trace["status"], "ok");
    assert_eq!(trace["llm_calls"], 2);
    let first = &trace["attempts"][0];
    assert_eq!(first["sqlstate"], "42803");
    assert_eq!(
        first["requalified"],
        json!(["p.customer_id → o.customer_id"])
    );
    assert_eq!(
        first["sql"],
        "SELECT o.customer_id, p.paid FROM payments p \
         JOIN orders o ON o.order_id = p.order_id GROUP BY o.customer_id"
    );
    let repair = s.llm.requests()[1].last_message();
    assert!(repair.contains("42803"), "{repair}");
    assert!(
        repair.contains("GROUP BY o.customer_id") && !repair.contains("p.customer_id"),
        "the repair starts from the moved query: {repair}"
    );
    assert_eq!(trace["attempts"][1]["sql"], fixed);
    assert_eq!(
        trace["attempts"][1]["row_count"],
        s.scalar_i64("SELECT count(DISTINCT customer_id) FROM orders")
    );
}

#[test]
fn a_table_the_model_skipped_is_joined_through_its_foreign_key_when_the_caller_may_read_it() {
    let mut s = Session::new();
    let role = format!("picker_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE TABLE order_items (order_id int REFERENCES orders(order_id), quantity int);
             INSERT INTO order_items SELECT order_id, 2 FROM orders;
             CREATE ROLE {role}; GRANT SELECT ON order_items TO {role};
             GRANT SELECT (order_id, amount) ON orders TO {role};"
        ))
        .unwrap();
    // order_items has no customer_id; orders, one foreign key away, has.
    let written = "SELECT oi.customer_id, sum(oi.quantity) AS items FROM order_items oi \
                   GROUP BY oi.customer_id ORDER BY oi.customer_id";
    s.llm.on("items per customer", vec![Reply::sql(written)]);
    let trace = s.trace("items per customer").unwrap();
    assert_eq!(trace["status"], "ok");
    assert_eq!(trace["llm_calls"], 1, "no repair was asked for");
    let attempt = &trace["attempts"][0];
    assert_eq!(
        attempt["requalified"],
        json!(["oi.customer_id → orders.customer_id, joined by orders.order_id = oi.order_id"])
    );
    assert_eq!(
        attempt["sql"],
        "SELECT orders.customer_id, sum(oi.quantity) AS items FROM order_items oi \
         JOIN orders ON orders.order_id = oi.order_id \
         GROUP BY orders.customer_id ORDER BY orders.customer_id"
    );
    let customers = s.scalar_i64("SELECT count(DISTINCT customer_id) FROM orders");
    assert_eq!(attempt["row_count"], customers);
    // The other way: orders has no quantity; order_items, whose key references orders, has.
    s.llm.on(
        "quantity per order",
        vec![Reply::sql("SELECT o.order_id, o.quantity FROM orders AS o")],
    );
    let trace = s.trace("quantity per order").unwrap();
    let attempt = &trace["attempts"][0];
    assert_eq!(
        attempt["sql"],
        "SELECT o.order_id, order_items.quantity FROM orders AS o \
         JOIN order_items ON order_items.order_id = o.order_id"
    );
    assert_eq!(
        attempt["row_count"],
        s.scalar_i64("SELECT count(*) FROM order_items")
    );

    // A role that may not read orders.customer_id: the model's query and error stand.
    without_repairs_as(&mut s, &role);
    left_to_the_model(
        &mut s,
        "items per customer, as a picker",
        written,
        None,
        "42703",
    );
}

/// Goes on as `role`, each model answer taken as it comes (no repair).
fn without_repairs_as(s: &mut Session, role: &str) {
    s.client
        .batch_execute(&format!(
            "SET sql_query_engine.max_repairs = 0; SET ROLE {role}"
        ))
        .unwrap();
}

/// Asks `question`, which the model answers with `sql` (and then `then`), and checks that
/// `sql` ran as written, without a rewrite, and failed with `sqlstate`. The trace.
fn left_to_the_model(
    s: &mut Session,
    question: &str,
    sql: &str,
    then: Option<&str>,
    sqlstate: &str,
) -> serde_json::Value {
    let replies = [Some(sql), then].into_iter().flatten().map(Reply::sql);
    s.llm.on(question, replies.collect());
    let trace = s.trace(question).unwrap();
    let first = &trace["attempts"][0];
    assert_eq!(first["sqlstate"], sqlstate, "{first}");
    assert_eq!(first["requalified"], json!([]));
    assert_eq!(first["sql"], sql);
    trace
}

#[test]
fn an_unqualified_column_of_a_table_a_key_away_is_read_from_it_joined() {
    let mut s = Session::new();
    let role = format!("counter_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE TABLE order_items (order_id int REFERENCES orders(order_id), quantity int);
             INSERT INTO order_items SELECT order_id, 2 FROM orders WHERE amount > 30;
             CREATE ROLE {role}; GRANT SELECT ON orders, order_items TO {role};
             GRANT SELECT (customer_id, name) ON customers TO {role};"
        ))
        .unwrap();
    // orders has no country; customers, whose key orders references, has.
    let written =
        "SELECT country, sum(amount) AS total FROM orders GROUP BY country ORDER BY country";
    s.llm.on("revenue per country", vec![Reply::sql(written)]);
    let trace = s.trace("revenue per country").unwrap();
    assert_eq!(trace["status"], "ok");
    assert_eq!(trace["llm_calls"], 1, "no repair was asked for");
    let attempt = &trace["attempts"][0];
    assert_eq!(
        attempt["requalified"],
        json!([
            "country → customers.country, joined by customers.customer_id = orders.customer_id"
        ])
    );
    assert_eq!(
        attempt["sql"],
        "SELECT country, sum(amount) AS total FROM orders \
         JOIN customers ON customers.customer_id = orders.customer_id \
         GROUP BY country ORDER BY country"
    );
    assert_eq!(
        attempt["row_count"],
        s.scalar_i64(
            "SELECT count(DISTINCT country) FROM customers JOIN orders USING (customer_id)"
        )
    );
    // In a subquery, the join goes into the subquery's FROM: the outer query is untouched.
    s.llm.on(
        "customers with a large order",
        vec![Reply::sql(
            "SELECT name FROM customers WHERE customer_id IN \
             (SELECT customer_id FROM orders WHERE quantity > 1) ORDER BY name",
        )],
    );
    let trace = s.trace("customers with a large order").unwrap();
    let attempt = &trace["attempts"][0];
    assert_eq!(
        attempt["sql"],
        "SELECT name FROM customers WHERE customer_id IN \
         (SELECT customer_id FROM orders JOIN order_items ON order_items.order_id = orders.order_id \
         WHERE quantity > 1) ORDER BY name"
    );
    assert_eq!(
        attempt["row_count"],
        s.scalar_i64(
            "SELECT count(DISTINCT customer_id) FROM orders JOIN order_items USING (order_id)"
        )
    );
    // Another SELECT of the query naming order_items (its own) does not stop the join.
    s.llm.on(
        "customers with an order item and a large order",
        vec![Reply::sql(
            "SELECT name FROM customers WHERE customer_id IN \
             (SELECT o.customer_id FROM orders o JOIN order_items i ON i.order_id = o.order_id) \
             AND customer_id IN (SELECT customer_id FROM orders WHERE quantity > 1) ORDER BY name",
        )],
    );
    let trace = s
        .trace("customers with an order item and a large order")
        .unwrap();
    let attempt = &trace["attempts"][0];
    assert_eq!(
        attempt["sql"],
        "SELECT name FROM customers WHERE customer_id IN \
         (SELECT o.customer_id FROM orders o JOIN order_items i ON i.order_id = o.order_id) \
         AND customer_id IN (SELECT customer_id FROM orders JOIN order_items ON \
         order_items.order_id = orders.order_id WHERE quantity > 1) ORDER BY name"
    );
    assert_eq!(
        attempt["row_count"],
        s.scalar_i64(
            "SELECT count(DISTINCT customer_id) FROM orders JOIN order_items USING (order_id)"
        )
    );
    // Two keys away, through orders: both are joined; order_id, which orders has too, stays
    // order_items'.
    let through_orders =
        "SELECT order_id, quantity FROM order_items WHERE country = 'DE' ORDER BY order_id";
    s.llm.on(
        "items bought from Germany",
        vec![Reply::sql(through_orders)],
    );
    let trace = s.trace("items bought from Germany").unwrap();
    let attempt = &trace["attempts"][0];
    assert_eq!(
        attempt["requalified"],
        json!([
            "country → customers.country, joined by orders.order_id = order_items.order_id, \
                then customers.customer_id = orders.customer_id"
        ])
    );
    assert_eq!(
        attempt["sql"],
        "SELECT order_items.order_id, quantity FROM order_items \
         JOIN orders ON orders.order_id = order_items.order_id \
         JOIN customers ON customers.customer_id = orders.customer_id \
         WHERE country = 'DE' ORDER BY order_items.order_id"
    );
    s.llm.on(
        "items bought from Germany, again",
        vec![Reply::sql(through_orders)],
    );
    assert_eq!(
        s.query("items bought from Germany, again").unwrap(),
        [
            json!({"order_id": 12, "quantity": 2}),
            json!({"order_id": 15, "quantity": 2})
        ]
    );

    // A role that may not read customers.country: the model's query and error stand.
    without_repairs_as(&mut s, &role);
    left_to_the_model(
        &mut s,
        "revenue per country, as a counter",
        written,
        None,
        "42703",
    );
    left_to_the_model(
        &mut s,
        "items bought from Germany, as a counter",
        through_orders,
        None,
        "42703",
    );
}

#[test]
fn a_column_each_group_has_one_value_of_is_read_through_the_key_it_depends_on() {
    let mut s = Session::new();
    let role = format!("grouper_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {role}; GRANT SELECT ON orders TO {role};
             GRANT SELECT (name, country) ON customers TO {role};"
        ))
        .unwrap();
    // Grouped by the orders' customer_id, reading the name of the customer joined on it:
    // SQLite and MySQL accept it, PostgreSQL wants customers' own key grouped.
    let written = "SELECT c.name, sum(o.amount) AS total FROM orders o \
                   JOIN customers c ON c.customer_id = o.customer_id \
                   GROUP BY o.customer_id ORDER BY total DESC";
    s.llm.on("revenue per customer", vec![Reply::sql(written)]);
    let trace = s.trace("revenue per customer").unwrap();
    assert_eq!(trace["status"], "ok");
    assert_eq!(trace["llm_calls"], 1, "no repair was asked for");
    let attempt = &trace["attempts"][0];
    assert_eq!(
        attempt["requalified"],
        json!(["c.name → GROUP BY c.customer_id"])
    );
    assert_eq!(
        attempt["sql"],
        "SELECT c.name, sum(o.amount) AS total FROM orders o \
         JOIN customers c ON c.customer_id = o.customer_id \
         GROUP BY c.customer_id, o.customer_id ORDER BY total DESC"
    );
    s.llm
        .on("revenue per customer, again", vec![Reply::sql(written)]);
    let top = &s.query("revenue per customer, again").unwrap()[0];
    assert_eq!(
        (&top["name"], top["total"].to_string()),
        (&json!("Ada"), "129.50".into())
    );
    // A column that varies within a group (one customer has several orders): no key
    // chooses a value for it, the error goes back to the model.
    let varies = "SELECT c.name, o.ordered_on FROM orders o \
                  JOIN customers c ON c.customer_id = o.customer_id GROUP BY c.customer_id";
    let fixed = "SELECT c.name, max(o.ordered_on) FROM orders o \
                 JOIN customers c ON c.customer_id = o.customer_id GROUP BY c.customer_id";
    let trace = left_to_the_model(
        &mut s,
        "last order day per customer",
        varies,
        Some(fixed),
        "42803",
    );
    assert_eq!(trace["attempts"][1]["sql"], fixed);
    assert!(s
        .llm
        .last_text()
        .contains("must appear in the GROUP BY clause"));

    // Equal through `=` between two types (here compared as float8, which equates two of
    // the bigint keys): the key does not pin one row, nothing is added.
    s.client
        .batch_execute(
            "CREATE TABLE accounts (id bigint PRIMARY KEY, holder text);
             INSERT INTO accounts VALUES (9007199254740992, 'Ann'), (9007199254740993, 'Ben');
             CREATE TABLE transfers (account float8, amount int);
             INSERT INTO transfers VALUES (9007199254740992, 5);",
        )
        .unwrap();
    let lossy = "SELECT a.holder, sum(t.amount) FROM transfers t \
                 JOIN accounts a ON a.id = t.account GROUP BY t.account";
    left_to_the_model(
        &mut s,
        "transfers per account holder",
        lossy,
        Some("SELECT 1"),
        "42803",
    );
    // A unique key of NOT NULL columns pins a row; not once inheritance children, whose rows
    // the table's key does not cover, are read with it.
    s.client
        .batch_execute(
            "CREATE TABLE people (id int PRIMARY KEY, email text NOT NULL UNIQUE, name text);
             INSERT INTO people VALUES (1, 'a@x', 'Ann'), (2, 'b@x', 'Ben');",
        )
        .unwrap();
    let by_email = "SELECT p.name, count(*) AS n FROM people p GROUP BY p.email";
    s.llm.on("people by email", vec![Reply::sql(by_email)]);
    let trace = s.trace("people by email").unwrap();
    assert_eq!(
        trace["attempts"][0]["requalified"],
        json!(["p.name → GROUP BY p.id"])
    );
    assert_eq!(trace["attempts"][0]["row_count"], 2);
    s.client
        .batch_execute(
            "CREATE TABLE vip (level int) INHERITS (people);
             INSERT INTO vip VALUES (3, 'a@x', 'Ann again', 1);",
        )
        .unwrap();
    left_to_the_model(
        &mut s,
        "people by email, with the vips",
        by_email,
        Some("SELECT 1"),
        "42803",
    );

    // A role that may not read customers' key: no key is grouped for it.
    without_repairs_as(&mut s, &role);
    left_to_the_model(
        &mut s,
        "revenue per customer, as a grouper",
        written,
        None,
        "42803",
    );
}

#[test]
fn a_join_written_the_wrong_way_round_runs_swapped() {
    let mut s = Session::new();
    s.client
        .batch_execute(
            "CREATE TABLE battle (id int PRIMARY KEY, name text);
             CREATE TABLE ship (id int PRIMARY KEY, lost_in_battle int REFERENCES battle(id),
                                ship_type text);
             INSERT INTO battle VALUES (1, 'Lepanto'), (2, 'Actium');
             INSERT INTO ship VALUES (1, 2, 'Brig'), (2, 1, 'Galley');",
        )
        .unwrap();
    let written = "SELECT DISTINCT T1.id, T1.name FROM battle AS T1 JOIN ship AS T2 \
                   ON T1.lost_in_battle = T2.id WHERE T2.ship_type = 'Brig'";
    s.llm.on(
        "battles that lost a brig",
        vec![Reply::sql(written), Reply::sql(written)],
    );
    let trace = s.trace("battles that lost a brig").unwrap();
    assert_eq!(trace["llm_calls"], 1, "no repair was asked for");
    let attempt = &trace["attempts"][0];
    assert_eq!(
        attempt["requalified"],
        json!(["t1.lost_in_battle = t2.id → t2.lost_in_battle = t1.id"])
    );
    assert_eq!(
        attempt["sql"],
        "SELECT DISTINCT T1.id, T1.name FROM battle AS T1 JOIN ship AS T2 \
         ON t2.lost_in_battle = t1.id WHERE T2.ship_type = 'Brig'"
    );
    assert_eq!(
        s.query("battles that lost a brig").unwrap(),
        vec![json!({"id": 2, "name": "Actium"})]
    );
}

#[test]
fn no_column_moves_to_a_table_the_caller_cannot_read_it_from() {
    let notices = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut s = Session::with_notices(std::sync::Arc::clone(&notices));
    let role = format!("clerk_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {role}; GRANT SELECT ON orders TO {role}; \
             GRANT SELECT (customer_id, country) ON customers TO {role}; \
             SET sql_query_engine.max_repairs = 1; SET sql_query_engine.progress = on; \
             SET ROLE {role};"
        ))
        .unwrap();
    s.llm.on(
        "names of customers who ordered",
        vec![
            Reply::sql("SELECT o.name FROM orders o JOIN customers c USING (customer_id)"),
            Reply::sql("SELECT c.country FROM orders o JOIN customers c USING (customer_id)"),
        ],
    );
    let trace = s.trace("names of customers who ordered").unwrap();
    assert_eq!(trace["llm_calls"], 2, "the model was asked for a repair");
    let first = &trace["attempts"][0];
    assert_eq!(first["sqlstate"], "42703");
    assert_eq!(first["requalified"], json!([]));
    assert_eq!(
        first["sql"],
        "SELECT o.name FROM orders o JOIN customers c USING (customer_id)"
    );
    let feedback = s.llm.requests()[1].last_message();
    assert!(
        !feedback.contains("name is a column of customers"),
        "a column the caller cannot read was named: {feedback}"
    );
    // Progress shows every query run: the model's, never one moved to customers.name.
    let notices = notices.lock().unwrap();
    assert!(notices
        .iter()
        .any(|n| n.contains("SELECT o.name FROM orders o")));
    assert!(
        !notices.iter().any(|n| n.contains("c.name")),
        "a query was run with a column the caller cannot read: {notices:?}"
    );
}

/// Progress notices carry the model's queries and errors: psql writes notices to the terminal
/// as they are, so a terminal's escape or a bidirectional override in them is written escaped.
#[test]
fn progress_notices_carry_no_terminal_escape() {
    let notices = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut s = Session::with_notices(std::sync::Arc::clone(&notices));
    s.client
        .batch_execute("SET sql_query_engine.progress = on")
        .unwrap();
    s.llm.on(
        "count them loudly",
        vec![Reply::sql(
            "SELECT count(*) AS n FROM customers -- \u{1b}]52;c;eA==\u{7}\u{202e}",
        )],
    );
    s.query("count them loudly").unwrap();
    let notices = notices.lock().unwrap();
    let shown = notices
        .iter()
        .find(|n| n.contains("FROM customers --"))
        .unwrap_or_else(|| panic!("{notices:?}"));
    assert!(
        shown.contains("\\u{1b}]52") && shown.contains("\\u{202e}"),
        "{shown}"
    );
    assert!(
        !shown.contains('\u{1b}') && !shown.contains('\u{202e}'),
        "{shown}"
    );
    drop(notices);
    // So does an ERROR whose DETAIL quotes the model's last query.
    s.client
        .batch_execute("SET sql_query_engine.max_repairs = 0")
        .unwrap();
    s.llm.on(
        "count them wrongly",
        vec![Reply::sql(
            "SELECT nosuchcol FROM customers -- \u{1b}]52;c;eA==\u{7}",
        )],
    );
    let error = s.query("count them wrongly").unwrap_err();
    let (_, message, detail) = db_error(&error);
    let said = format!("{message}\n{detail}");
    assert!(said.contains("\\u{1b}]52"), "{said}");
    assert!(
        !said.contains('\u{1b}') && !said.contains('\u{7}'),
        "{said}"
    );
}

/// Without foreign keys, a missing column's relation is reached through columns named alike,
/// shortest chain first; a column many relations share is followed once (the walk stays linear
/// in the columns however many relations share it).
#[test]
fn a_column_behind_tables_joined_by_names_alike_is_repaired_with_the_guessed_chain() {
    let mut s = Session::new();
    s.client
        .batch_execute(
            "CREATE TABLE visits (store_id int, visitor text);
             CREATE TABLE stores (store_id int, region_id int);
             CREATE TABLE regions (region_id int, region_name text);
             DO $$ BEGIN FOR i IN 1..300 LOOP
                 EXECUTE format('CREATE TABLE shelf_%s (store_id int, region_id int)', i);
             END LOOP; END $$;
             INSERT INTO regions VALUES (1, 'north');",
        )
        .unwrap();
    s.llm.on(
        "visitors per region",
        vec![
            Reply::sql("SELECT region_name, count(*) FROM visits GROUP BY 1"),
            Reply::sql("SELECT region_name, 1 AS n FROM regions"),
        ],
    );
    assert_eq!(s.query("visitors per region").unwrap().len(), 1);
    let repair = s.llm.requests()[1].last_message();
    assert!(
        repair.contains("region_name is a column of regions, probably joined by "),
        "{repair}"
    );
    let chain = &repair[repair.find("probably joined by").unwrap()..];
    assert!(
        chain.contains("visits.store_id = ") && chain.contains(".region_id = regions.region_id"),
        "{chain}"
    );
}

#[test]
fn an_unknown_alias_or_a_column_behind_the_wrong_alias_is_repaired_with_the_join_path() {
    let mut s = Session::new();
    s.client
        .batch_execute(
            "CREATE TABLE products (product_id int PRIMARY KEY, name text, price numeric);
             CREATE TABLE order_items (
                 order_id int REFERENCES orders(order_id),
                 product_id int REFERENCES products(product_id),
                 quantity int);",
        )
        .unwrap();
    s.llm.on(
        "revenue per customer",
        vec![
            Reply::sql(
                "SELECT c.name, sum(p.price) FROM customers c \
                 JOIN orders o ON o.customer_id = c.customer_id GROUP BY 1",
            ),
            // Two foreign keys away from order_items: not joined without the model.
            Reply::sql(
                "SELECT c.name, sum(oi.quantity) FROM customers c \
                 JOIN order_items oi ON oi.country = c.country GROUP BY 1",
            ),
            Reply::sql("SELECT name, 0 AS revenue FROM customers"),
        ],
    );
    assert_eq!(s.query("revenue per customer").unwrap().len(), 4);

    let unknown_alias = s.llm.requests()[1].last_message();
    assert!(
        unknown_alias.contains(
            "The query uses p.price, but no table in its FROM clause is named or aliased p"
        ),
        "{unknown_alias}"
    );
    assert!(
        unknown_alias.contains(
            "price is a column of products, joined by order_items.order_id = orders.order_id, \
             then order_items.product_id = products.product_id."
        ),
        "the join path through order_items: {unknown_alias}"
    );

    let wrong_table = s.llm.requests()[2].last_message();
    let feedback = &wrong_table[wrong_table.rfind("This query").unwrap()..];
    assert!(
        feedback.contains("order_items (oi) has no column country."),
        "{feedback}"
    );
    assert!(
        feedback.contains("country is a column of customers."),
        "{feedback}"
    );
}

#[test]
fn a_confirmed_empty_result_is_returned_as_empty() {
    let mut s = Session::new();
    let sql = "SELECT name FROM customers WHERE country = 'FR'";
    s.llm.on(
        "customers in France",
        vec![Reply::sql(sql), Reply::sql(sql)],
    );
    assert!(s.query("customers in France").unwrap().is_empty());
    let requests = s.llm.requests();
    assert_eq!(requests.len(), 2);
    let feedback = requests[1].last_message();
    assert!(
        feedback.contains("returned 0 rows") && feedback.contains(sql),
        "{feedback}"
    );

    s.llm.on(
        "customers in France again",
        vec![Reply::sql(sql), Reply::sql(sql)],
    );
    let trace = s.trace("customers in France again").unwrap();
    assert_eq!(trace["status"], "empty");
    assert_eq!(trace["confirmed_empty"], true);
    assert_eq!(
        trace["attempts"].as_array().unwrap().len(),
        1,
        "the same query is not run twice"
    );
}

#[test]
fn an_empty_result_can_be_repaired_into_rows() {
    let mut s = Session::new();
    s.llm.on(
        "customers in Germany",
        vec![
            Reply::sql("SELECT name FROM customers WHERE country = 'Germany'"),
            Reply::sql("SELECT name FROM customers WHERE country = 'DE' ORDER BY name"),
        ],
    );
    let rows = s.query("customers in Germany").unwrap();
    assert_eq!(
        rows,
        vec![json!({"name": "Bruno"}), json!({"name": "Dmitri"})]
    );
}

#[test]
fn when_repairs_run_out_the_best_result_is_returned() {
    let mut s = Session::new();
    let mut replies = vec![Reply::sql(
        "SELECT name FROM customers WHERE country = 'XX'",
    )];
    replies.extend((0..4).map(|i| Reply::sql(&format!("SELECT missing_{i} FROM customers"))));
    s.llm.on("hard question", replies);
    let trace = s.trace("hard question").unwrap();
    assert_eq!(trace["status"], "empty");
    assert_eq!(
        trace["sql"],
        "SELECT name FROM customers WHERE country = 'XX'"
    );
    let attempts = trace["attempts"].as_array().unwrap();
    assert_eq!(
        attempts.len(),
        5,
        "1 + max_repairs executions, the last repair included"
    );
    assert!(attempts[1..].iter().all(|a| a["outcome"] == "error"));
    assert_eq!(s.llm.requests().len(), 5);
}

#[test]
fn when_every_attempt_fails_the_last_error_is_raised() {
    let mut s = Session::new();
    s.client
        .batch_execute("SET sql_query_engine.max_repairs = 2")
        .unwrap();
    s.llm.on(
        "broken",
        (0..3)
            .map(|i| Reply::sql(&format!("SELECT nope_{i} FROM orders")))
            .collect(),
    );
    let error = s.query("broken").unwrap_err();
    let (code, message, detail) = db_error(&error);
    assert_eq!(code, "42703");
    assert!(message.contains("all 3 attempts failed"), "{message}");
    assert!(message.contains("nope_2"), "{message}");
    assert_eq!(detail, "last SQL: SELECT nope_2 FROM orders");
}

#[test]
fn a_write_is_refused_never_run_and_never_repaired() {
    let mut s = Session::new();
    s.llm
        .on("delete the orders", vec![Reply::sql("DELETE FROM orders")]);
    let error = s.query("delete the orders").unwrap_err();
    let (code, message, detail) = db_error(&error);
    assert_eq!(code, "25006");
    assert!(message.contains("DELETE"), "{message}");
    assert!(detail.contains("DELETE FROM orders"), "{detail}");
    assert_eq!(s.scalar_i64("SELECT count(*) FROM orders"), 6);
    assert_eq!(s.llm.requests().len(), 1);

    s.llm.on("drop it", vec![Reply::sql("DROP TABLE orders")]);
    let trace = s.trace("drop it").unwrap();
    assert_eq!(trace["status"], "refused");
    assert_eq!(trace["attempts"][0]["sqlstate"], "25006");
    assert_eq!(s.scalar_i64("SELECT count(*) FROM orders"), 6);
}

#[test]
fn the_callers_transaction_continues_unharmed() {
    let mut s = Session::new();
    s.llm.on(
        "count orders",
        vec![
            Reply::sql("SELECT count(*) FROM ordrs"),
            Reply::sql("SELECT count(*) AS n FROM orders"),
        ],
    );
    let mut tx = s.client.transaction().unwrap();
    tx.batch_execute("INSERT INTO customers VALUES (5, 'Eve', 'FR')")
        .unwrap();
    let row = tx
        .query_one("SELECT nl_query('count orders')::text", &[])
        .unwrap();
    assert_eq!(row.get::<_, &str>(0), r#"{"n": 6}"#);
    // still read-write, still the same transaction
    tx.batch_execute("INSERT INTO customers VALUES (6, 'Finn', 'FR')")
        .unwrap();
    tx.commit().unwrap();
    assert_eq!(
        s.scalar_i64("SELECT count(*) FROM customers WHERE country = 'FR'"),
        2
    );
}

#[test]
fn rows_beyond_max_rows_are_cut_and_the_trace_says_so() {
    let notices = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut s = Session::with_notices(std::sync::Arc::clone(&notices));
    s.client
        .batch_execute("SET sql_query_engine.max_rows = 3")
        .unwrap();
    s.llm.on(
        "all orders",
        vec![Reply::sql("SELECT order_id FROM orders ORDER BY order_id")],
    );
    s.llm.on(
        "all orders traced",
        vec![Reply::sql("SELECT order_id FROM orders ORDER BY order_id")],
    );
    assert_eq!(s.query("all orders").unwrap().len(), 3);
    assert!(
        notices
            .lock()
            .unwrap()
            .iter()
            .any(|n| n.starts_with("NOTICE") && n.contains("cut at 3 rows")),
        "{notices:?}"
    );
    let trace = s.trace("all orders traced").unwrap();
    assert_eq!(trace["row_count"], 3);
    assert_eq!(trace["truncated"], true);
}

#[test]
fn a_slow_query_times_out_and_is_repaired() {
    let mut s = Session::new();
    s.client
        .batch_execute("SET sql_query_engine.statement_timeout = 200")
        .unwrap();
    s.llm.on(
        "big count",
        vec![
            Reply::sql("SELECT count(*) FROM generate_series(1, 1000000000)"),
            Reply::sql("SELECT count(*) AS n FROM orders"),
        ],
    );
    let started = std::time::Instant::now();
    let trace = s.trace("big count").unwrap();
    assert!(started.elapsed().as_secs() < 10);
    assert_eq!(trace["attempts"][0]["sqlstate"], "57014");
    assert_eq!(trace["status"], "ok");
    let feedback = s.llm.requests()[1].last_message();
    assert!(feedback.contains("statement timeout"), "{feedback}");
}

#[test]
fn nl_generate_returns_sql_that_plans_and_never_runs_it() {
    let mut s = Session::new();
    s.llm.on(
        "orders total",
        vec![
            Reply::sql("SELECT sum(amount) FROM order"),
            // would run for minutes: planning it must not execute it
            Reply::sql("SELECT count(*) FROM generate_series(1, 10000000000)"),
        ],
    );
    let started = std::time::Instant::now();
    let sql = s.generate("orders total").unwrap();
    assert_eq!(sql, "SELECT count(*) FROM generate_series(1, 10000000000)");
    assert!(started.elapsed().as_secs() < 30, "the query was executed");
    let feedback = s.llm.requests()[1].last_message();
    assert!(
        feedback.contains("42601") && feedback.contains("syntax error"),
        "{feedback}"
    );
}

#[test]
fn answers_in_any_format_are_understood() {
    let mut s = Session::new();
    s.llm.on(
        "customer count",
        vec![Reply::Content(
            "<think>count rows</think>Here you go:\n```sql\nSELECT count(*) AS customers\nFROM customers; -- all\n```".into(),
        )],
    );
    assert_eq!(
        s.query("customer count").unwrap(),
        vec![json!({"customers": 4})]
    );
}

/// Switches the session to a new role that may read only the customers and orders (not the
/// fixture's `secrets`), with no repairs.
fn as_a_reader_of_customers_and_orders(s: &mut Session, prefix: &str) {
    let role = format!("{prefix}_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {role}; GRANT SELECT ON customers, orders TO {role}; \
             SET sql_query_engine.max_repairs = 0; SET ROLE {role};"
        ))
        .unwrap();
}

#[test]
fn tables_the_caller_cannot_read_are_not_in_the_prompt() {
    let mut s = Session::new();
    as_a_reader_of_customers_and_orders(&mut s, "analyst");
    s.llm.on(
        "anything secret",
        vec![Reply::sql("SELECT note FROM secrets")],
    );
    let error = s.query("anything secret").unwrap_err();
    let requests = s.llm.requests();
    assert!(
        !requests[0].text().contains("secrets"),
        "an unreadable table reached the model"
    );
    assert!(requests[0].text().contains("CREATE TABLE orders"));
    // the model named it anyway: it was not shown, so the query is refused before it runs
    // (and the server's privilege check would stop it)
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "42501");
    assert!(
        message.contains("relation public.secrets is not one of the tables and views shown"),
        "{message}"
    );
}

/// A name that a WITH query of the statement shadows where it is used is that query's, not the
/// table outside the caller's context it also names (which is refused before it is locked).
#[test]
fn a_with_query_named_like_a_table_outside_the_context_is_the_with_query() {
    let mut s = Session::new();
    s.client
        .batch_execute("CREATE TYPE pair AS (a int, b int)")
        .unwrap();
    as_a_reader_of_customers_and_orders(&mut s, "shadowing");
    for (question, sql, rows) in [
        (
            "shadowed",
            "WITH secrets AS (SELECT 1 AS n) SELECT n FROM secrets",
            json!([{"n": 1}]),
        ),
        (
            "shadowed recursively",
            "WITH RECURSIVE secrets(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM secrets \
             WHERE n < 3) SELECT count(*) AS c FROM secrets",
            json!([{"c": 3}]),
        ),
        (
            "shadowed in a subquery",
            "WITH secrets AS (SELECT 2 AS n) SELECT (SELECT n FROM secrets) AS m",
            json!([{"m": 2}]),
        ),
        // Row types in reach: a superuser's composite type, and a table's of the context.
        (
            "a superuser's composite",
            "SELECT (jsonb_populate_record(NULL::pair, '{\"a\": 1, \"b\": 2}')).a AS a",
            json!([{"a": 1}]),
        ),
        (
            "a row of the context",
            "SELECT (jsonb_populate_record(NULL::customers, '{\"customer_id\": 7}')).customer_id AS id",
            json!([{"id": 7}]),
        ),
    ] {
        s.llm.on(question, vec![Reply::sql(sql)]);
        let answer = s
            .query(question)
            .unwrap_or_else(|e| panic!("{sql}: {:?}", db_error(&e)));
        assert_eq!(json!(answer), rows, "{sql}");
    }
    // A WITH query sees only those before it (without RECURSIVE): here `secrets` is the table.
    s.llm.on(
        "not shadowed",
        vec![Reply::sql(
            "WITH a AS (SELECT note FROM secrets), secrets AS (SELECT 1 AS n) SELECT * FROM a",
        )],
    );
    let error = s.query("not shadowed").unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "42501", "{message}");
    assert!(
        message.contains("relation public.secrets is not one of the tables and views shown"),
        "{message}"
    );
}

#[test]
fn ddl_is_visible_to_the_very_next_question() {
    let mut s = Session::new();
    s.llm.on("first", vec![Reply::sql("SELECT 1 AS one")]);
    s.query("first").unwrap();
    assert!(!s.llm.requests()[0].text().contains("loyalty_points"));
    s.client
        .batch_execute("ALTER TABLE customers ADD COLUMN loyalty_points integer")
        .unwrap();
    s.llm.on("second", vec![Reply::sql("SELECT 1 AS one")]);
    s.query("second").unwrap();
    assert!(s.llm.requests()[1]
        .text()
        .contains("loyalty_points integer"));
}

#[test]
fn generated_queries_get_no_parallel_workers() {
    let mut s = Session::new();
    s.client
        .batch_execute(
            "CREATE TABLE big AS SELECT g AS id, g % 7 AS bucket FROM generate_series(1, 200000) g;
             ANALYZE big;
             SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0;
             SET min_parallel_table_scan_size = 0; SET max_parallel_workers_per_gather = 2;",
        )
        .unwrap();
    s.llm.on(
        "rows per bucket",
        vec![Reply::sql(
            "SELECT bucket, count(*) AS n FROM big GROUP BY bucket ORDER BY bucket",
        )],
    );
    // A superuser's query runs behind the gate, which is this backend's own: no workers.
    let trace = s.trace("rows per bucket").unwrap();
    assert_eq!(trace["row_count"], 7);
    assert_eq!(trace["attempts"][0]["parallel_workers"], 0, "{trace}");
    // Nor does any other role's query (its own login: a superuser's SET ROLE is still a
    // superuser's call), where the planner would choose them: a worker's memory is outside the
    // query's ceiling (max_query_memory).
    let (role, db) = (format!("parallel_{}", s.database), s.database.clone());
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT SELECT ON big TO {role}; GRANT CREATE ON DATABASE {db} TO {role};
             ALTER DATABASE {db} SET sql_query_engine.llm_url = '{}';",
            s.llm.url()
        ))
        .unwrap();
    let mut client = sql_query_engine_e2e::cluster().connect_as(&db, &role);
    client
        .batch_execute(
            "SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0;
             SET min_parallel_table_scan_size = 0; SET max_parallel_workers_per_gather = 2;",
        )
        .unwrap();
    s.llm.on(
        "rows per bucket, as a role",
        vec![Reply::sql(
            "SELECT bucket, count(*) AS n FROM big GROUP BY bucket ORDER BY bucket",
        )],
    );
    let text: String = client
        .query_one("SELECT nl_trace('rows per bucket, as a role')::text", &[])
        .unwrap()
        .get(0);
    let trace: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(trace["row_count"], 7);
    assert_eq!(trace["attempts"][0]["parallel_workers"], 0, "{trace}");
    // The planner would use them for the same query read directly.
    let plan: Vec<String> = client
        .query(
            "EXPLAIN SELECT bucket, count(*) AS n FROM big GROUP BY bucket ORDER BY bucket",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(plan.join("\n").contains("Workers Planned"), "{plan:?}");
    // Nor do the statements code of the query plans (the role's own view over its own
    // function, which asks the planner for workers).
    client
        .batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {role}_own;
             CREATE FUNCTION {role}_own.plan() RETURNS text LANGUAGE plpgsql
                 SET parallel_setup_cost = 0 SET parallel_tuple_cost = 0
                 SET min_parallel_table_scan_size = 0 SET max_parallel_workers_per_gather = 2 AS $$
             DECLARE line text; planned text := 'no workers';
             BEGIN
                 FOR line IN EXECUTE 'EXPLAIN SELECT bucket, count(*) FROM public.big GROUP BY 1' LOOP
                     IF line LIKE '%Workers Planned%' THEN planned := 'workers'; END IF;
                 END LOOP;
                 RETURN planned;
             END $$;
             CREATE VIEW {role}_own.plans AS SELECT {role}_own.plan() AS planned;"
        ))
        .unwrap_or_else(|e| panic!("{e:?}"));
    let direct: String = client
        .query_one(&format!("SELECT planned FROM {role}_own.plans"), &[])
        .unwrap()
        .get(0);
    assert_eq!(direct, "workers");
    s.llm.on(
        "how is it planned",
        vec![Reply::sql(&format!("SELECT planned FROM {role}_own.plans"))],
    );
    let rows = client
        .query("SELECT * FROM nl_query('how is it planned')", &[])
        .unwrap();
    let answer: serde_json::Value = rows[0].get(0);
    assert_eq!(answer["planned"], "no workers", "{answer}");
    // and a cut result still stops early and says so
    s.client
        .batch_execute("SET sql_query_engine.max_rows = 3")
        .unwrap();
    s.llm.on("all ids", vec![Reply::sql("SELECT id FROM big")]);
    let trace = s.trace("all ids").unwrap();
    assert_eq!(
        (trace["row_count"].as_i64(), trace["truncated"].as_bool()),
        (Some(3), Some(true))
    );
}

#[test]
fn in_doubt_candidates_are_asked_for_in_one_request_and_the_majority_answers() {
    let mut s = Session::new();
    s.client
        .batch_execute(
            "SET sql_query_engine.vote = when_in_doubt; SET sql_query_engine.candidates = 3",
        )
        .unwrap();
    let good = "SELECT name FROM customers WHERE country = 'DE' ORDER BY name";
    s.llm.on(
        "customers in Germany",
        vec![
            Reply::sql("SELECT name FROM customers WHERE country = 'Germany'"),
            Reply::Choices(vec![
                serde_json::json!({ "sql": good }).to_string(),
                serde_json::json!({ "sql": "SELECT name FROM customers WHERE country IN ('DE') ORDER BY 1" }).to_string(),
                serde_json::json!({ "sql": "SELECT name FROM customers" }).to_string(),
            ]),
        ],
    );
    let trace = s.trace("customers in Germany").unwrap();
    assert_eq!(trace["status"], "ok");
    assert_eq!(trace["row_count"], 2, "{trace}");
    assert_eq!(trace["vote"]["groups"], json!([1, 2, 1]), "{trace}");
    let attempts = trace["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 4);
    assert!(attempts[1..].iter().all(|a| a["candidate"] == true));
    let requests = s.llm.requests();
    assert_eq!(requests.len(), 2, "the candidates came in one request");
    assert_eq!(requests[1].body["n"], 3);
    assert!(requests[1].body["temperature"].as_f64().unwrap() > 0.0);
}

#[test]
fn an_endpoint_that_ignores_n_gets_the_candidates_all_at_once() {
    let mut s = Session::new();
    s.client
        .batch_execute(
            "SET sql_query_engine.vote = when_in_doubt; SET sql_query_engine.candidates = 3",
        )
        .unwrap();
    let good = "SELECT name FROM customers WHERE country = 'DE' ORDER BY name";
    let slow = |sql: &str| Reply::Slow(Duration::from_millis(700), Box::new(Reply::sql(sql)));
    // One choice per request whatever `n` says, as llama-cpp-python's server answers.
    s.llm.on(
        "customers in Germany",
        vec![
            Reply::sql("SELECT name FROM customers WHERE country = 'Germany'"),
            slow(good),
            slow(good),
            slow("SELECT name FROM customers"),
        ],
    );
    let trace = s.trace("customers in Germany").unwrap();
    assert_eq!(trace["row_count"], 2, "{trace}");
    assert_eq!(trace["vote"]["alternatives"], 3, "{trace}");
    let requests = s.llm.requests();
    assert_eq!(requests.len(), 4);
    assert_eq!(requests[1].body["n"], 3, "asked for several choices first");
    assert!(requests[2..].iter().all(|r| r.body.get("n").is_none()));
    assert_eq!(
        s.llm.most_in_flight(),
        2,
        "the two missing ones were asked together"
    );

    // Known now to answer one choice per request: all three at once.
    s.llm.on(
        "customers in Italy",
        vec![
            Reply::sql("SELECT name FROM customers WHERE country = 'Italy'"),
            slow("SELECT name FROM customers WHERE country = 'IT'"),
            slow("SELECT name FROM customers WHERE country = 'IT'"),
            slow("SELECT name FROM customers WHERE country IN ('IT')"),
        ],
    );
    let trace = s.trace("customers in Italy").unwrap();
    assert_eq!(trace["row_count"], 1, "{trace}");
    assert_eq!(trace["vote"]["agreed"], 3, "{trace}");
    assert_eq!(s.llm.requests().len(), 8);
    assert_eq!(s.llm.most_in_flight(), 3);

    // The answer budget ends the one still running: the two that came back are voted on.
    s.client
        .batch_execute("SET sql_query_engine.answer_budget = '5s'")
        .unwrap();
    s.llm.on(
        "customers in Italia",
        vec![
            Reply::sql("SELECT name FROM customers WHERE country = 'Italia'"),
            Reply::sql("SELECT name FROM customers WHERE country = 'IT'"),
            Reply::Slow(Duration::from_secs(30), Box::new(Reply::sql("SELECT 1"))),
            Reply::sql("SELECT name FROM customers WHERE country = 'IT'"),
        ],
    );
    let started = std::time::Instant::now();
    let trace = s.trace("customers in Italia").unwrap();
    assert!(started.elapsed() < Duration::from_secs(15), "{trace}");
    assert_eq!(trace["row_count"], 1, "{trace}");
    assert_eq!(
        (&trace["vote"]["asked"], &trace["vote"]["alternatives"]),
        (&json!(3), &json!(2)),
        "{trace}"
    );
    assert_eq!(trace["out_of_time"], true, "{trace}");

    // One of the three asked at once refused (an endpoint's limit on a burst), and refused
    // again when asked alone: the two that came back are voted on, and the call goes on.
    s.client
        .batch_execute("RESET sql_query_engine.answer_budget")
        .unwrap();
    let refused = || Reply::Status(400, r#"{"error": {"message": "too many at once"}}"#.into());
    s.llm.on(
        "customers in Italien",
        vec![
            Reply::sql("SELECT name FROM customers WHERE country = 'Italien'"),
            slow("SELECT name FROM customers WHERE country = 'IT'"),
            refused(),
            slow("SELECT name FROM customers WHERE country = 'IT'"),
            refused(),
        ],
    );
    let trace = s.trace("customers in Italien").unwrap();
    assert_eq!(trace["row_count"], 1, "{trace}");
    assert_eq!(trace["vote"]["alternatives"], 2, "{trace}");

    // What the endpoint's answers to one role's requests taught is that role's: another role
    // on the same connection (as the gateway's are) is asked for its choices in one request.
    let other = format!("other_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE ROLE {other}; GRANT SELECT ON customers TO {other}; SET ROLE {other};"
        ))
        .unwrap();
    let spain = "SELECT name FROM customers WHERE country = 'ES'";
    s.llm.on(
        "customers in Spain",
        vec![
            Reply::sql("SELECT name FROM customers WHERE country = 'Spain'"),
            Reply::Choices(vec![spain.into(), spain.into(), spain.into()]),
        ],
    );
    let before = s.llm.requests().len();
    s.trace("customers in Spain").unwrap();
    let requests = s.llm.requests();
    assert_eq!(
        requests.len(),
        before + 2,
        "one request for the three choices"
    );
    assert_eq!(requests[before + 1].body["n"], 3);
    s.client.batch_execute("RESET ROLE").unwrap();
}

#[test]
fn a_question_writes_nothing_but_its_history() {
    let mut s = Session::new();
    s.llm.on(
        "count them",
        vec![Reply::sql("SELECT count(*) AS n FROM orders"); 2],
    );
    s.client
        .batch_execute("SET sql_query_engine.history = off")
        .unwrap();
    let mut transaction = s.client.transaction().unwrap();
    transaction
        .query("SELECT nl_query('count them')", &[])
        .unwrap();
    let xid: Option<String> = transaction
        .query_one("SELECT pg_current_xact_id_if_assigned()::text", &[])
        .unwrap()
        .get(0);
    assert_eq!(xid, None, "answering assigned a transaction id");
    transaction.rollback().unwrap();
}

/// A query whose plan is absurd for a question goes back to the model with the reason before
/// it runs: a join without any join condition between two large tables, or a plan estimated far
/// beyond `statement_timeout`. The caller's own SQL (`nl_run`) is not second-guessed: it runs
/// into the timeout instead (the control).
#[test]
fn an_absurd_plan_is_repaired_before_it_runs() {
    let mut s = Session::new();
    s.client
        .batch_execute(
            "CREATE TABLE readings (id int PRIMARY KEY, sensor int, value int);
             CREATE TABLE sensors (id int PRIMARY KEY, site int);
             INSERT INTO readings SELECT i, i % 20000, i % 97 FROM generate_series(1, 20000) i;
             INSERT INTO sensors SELECT i, i % 50 FROM generate_series(0, 19999) i;
             ANALYZE readings, sensors;",
        )
        .unwrap();
    s.llm.on(
        "readings per site",
        vec![
            Reply::sql("SELECT s.site, count(*) AS n FROM readings r, sensors s GROUP BY s.site"),
            Reply::sql(
                "SELECT s.site, count(*) AS n FROM readings r JOIN sensors s ON s.id = r.sensor \
                 GROUP BY s.site",
            ),
        ],
    );
    let started = std::time::Instant::now();
    let trace = s.trace("readings per site").unwrap();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(trace["status"], "ok", "{trace}");
    assert_eq!(trace["row_count"], 50);
    let first = &trace["attempts"][0];
    assert_eq!(first["sqlstate"], "54000", "{first}");
    let message = first["message"].as_str().unwrap();
    assert!(
        message.contains("readings") && message.contains("sensors"),
        "{message}"
    );
    assert!(message.contains("without any join condition"), "{message}");
    let repair = s.llm.requests().last().unwrap().last_message();
    assert!(repair.contains("cartesian product"), "{repair}");

    // An estimate far beyond the time allowed (here 200 ms, which analysis and planning stay
    // well within even on a loaded machine), with join conditions.
    s.client
        .batch_execute("SET sql_query_engine.statement_timeout = 200")
        .unwrap();
    s.llm.on(
        "readings below each sensor value",
        vec![
            Reply::sql(
                "SELECT count(*) AS n FROM readings r JOIN sensors s ON r.value < s.site \
                 JOIN sensors t ON t.site > r.value",
            ),
            Reply::sql("SELECT 1 AS n"),
        ],
    );
    let trace = s.trace("readings below each sensor value").unwrap();
    let first = &trace["attempts"][0];
    assert_eq!(first["sqlstate"], "54000", "{first}");
    assert!(
        first["message"]
            .as_str()
            .unwrap()
            .contains("far more than sql_query_engine.statement_timeout"),
        "{first}"
    );
    assert_eq!(trace["status"], "ok");

    // With stored values kept from the model, the planner's estimates (its statistics'
    // choice) are not told: only that the plan was refused.
    s.client
        .batch_execute(
            "SET sql_query_engine.statement_timeout = 30000;
             SET sql_query_engine.sample_values = 0;",
        )
        .unwrap();
    s.llm.on(
        "readings per site, privately",
        vec![
            Reply::sql("SELECT s.site, count(*) AS n FROM readings r, sensors s GROUP BY s.site"),
            Reply::sql("SELECT 1 AS n"),
        ],
    );
    let trace = s.trace("readings per site, privately").unwrap();
    assert_eq!(trace["attempts"][0]["sqlstate"], "54000", "{trace}");
    let repair = s.llm.requests().last().unwrap().last_message();
    let told: Vec<&str> = repair.lines().filter(|l| l.starts_with("ERROR")).collect();
    assert_eq!(told.len(), 1, "{repair}");
    assert!(told[0].contains("the query was not run:"), "{repair}");
    assert!(
        !told[0].contains("20000"),
        "the estimates were told: {repair}"
    );
    s.client
        .batch_execute("RESET sql_query_engine.sample_values")
        .unwrap();

    // The caller's own query runs as written, and meets the timeout.
    s.client
        .batch_execute("SET sql_query_engine.statement_timeout = 500")
        .unwrap();
    let error = s
        .client
        .query(
            "SELECT * FROM nl_run('SELECT count(*) FROM readings r, sensors s')",
            &[],
        )
        .unwrap_err();
    assert_eq!(db_error(&error).0, "57014");
}

#[test]
fn a_count_over_a_value_the_data_stores_otherwise_is_repaired_or_else_doubted() {
    let mut s = Session::new();
    let reader = format!("misread_reader_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE TABLE shipments (id int, status text);
             INSERT INTO shipments SELECT g, CASE WHEN g % 3 = 0 THEN 'Shipped' ELSE 'Pending' END
               FROM generate_series(1, 30) g;
             CREATE ROLE {reader}; GRANT SELECT ON shipments TO {reader}; SET ROLE {reader};"
        ))
        .unwrap();
    // 'shipped' counts nothing: the model is told how the data spells it, and the repair's
    // count is the answer.
    let misread = "SELECT count(*) AS n FROM shipments WHERE status = 'shipped'";
    let stored = "SELECT count(*) AS n FROM shipments WHERE status = 'Shipped'";
    s.llm.on(
        "how many shipments were shipped",
        vec![Reply::sql(misread), Reply::sql(stored)],
    );
    let trace = s.trace("how many shipments were shipped").unwrap();
    let said = "'shipped' is stored as 'Shipped' in shipments.status";
    assert_eq!(trace["sql"], stored, "{trace}");
    assert_eq!(trace["attempts"][0]["questioned"], json!([said]));
    assert_eq!(trace["confidence"]["level"], "high", "{trace}");
    let feedback = s.llm.requests()[1].last_message();
    assert!(feedback.contains(said), "{feedback}");
    assert!(feedback.contains("returned rows"), "{feedback}");

    // The model stands by its query: that is the answer, and it is doubtful.
    s.llm.on(
        "how many were shipped, as written",
        vec![Reply::sql(misread), Reply::sql(misread)],
    );
    let trace = s.trace("how many were shipped, as written").unwrap();
    assert_eq!(trace["sql"], misread, "{trace}");
    assert_eq!(trace["row_count"], 1, "{trace}");
    assert_eq!(trace["confidence"]["level"], "low", "{trace}");
    assert!(
        trace["confidence"]["doubts"]
            .to_string()
            .contains("stored as 'Shipped'"),
        "{trace}"
    );

    // A string the data does not hold, nothing like a stored value, is not questioned.
    s.llm.on(
        "how many were returned",
        vec![Reply::sql(
            "SELECT count(*) AS n FROM shipments WHERE status = 'Returned'",
        )],
    );
    let trace = s.trace("how many were returned").unwrap();
    assert_eq!(
        trace["attempts"].as_array().map(Vec::len),
        Some(1),
        "{trace}"
    );
    assert_eq!(trace["confidence"]["level"], "high", "{trace}");
}

#[test]
fn a_sum_of_identifiers_is_repaired_or_else_doubted() {
    let mut s = Session::new();
    let reader = format!("sum_reader_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE TABLE singers (singer_id int PRIMARY KEY, name text);
             CREATE TABLE seasons (year int PRIMARY KEY);
             CREATE TABLE songs (song_id int PRIMARY KEY, singerid int REFERENCES singers,
                                 album_id int, year int REFERENCES seasons, sales int);
             INSERT INTO singers VALUES (1, 'Ann'), (2, 'Bo');
             INSERT INTO seasons VALUES (2020), (2021);
             INSERT INTO songs VALUES (10, 1, 7, 2020, 100), (11, 1, 7, 2021, 50),
                                      (12, 2, 8, 2021, 5);
             CREATE ROLE {reader}; GRANT SELECT ON singers, seasons, songs TO {reader};
             SET ROLE {reader};"
        ))
        .unwrap();
    // The model adds up the songs' primary key: it is told so, and the repair's sums answer.
    let ids = "SELECT s.name, SUM(t.song_id) AS total FROM singers s JOIN songs t \
               ON t.singerid = s.singer_id GROUP BY s.name";
    let sales = "SELECT s.name, SUM(t.sales) AS total FROM singers s JOIN songs t \
                 ON t.singerid = s.singer_id GROUP BY s.name";
    s.llm.on(
        "total sales of each singer",
        vec![Reply::sql(ids), Reply::sql(sales)],
    );
    let trace = s.trace("total sales of each singer").unwrap();
    assert_eq!(trace["sql"], sales, "{trace}");
    assert_eq!(trace["row_count"], 2, "{trace}");
    assert_eq!(trace["confidence"]["level"], "high", "{trace}");
    let said = trace["attempts"][0]["questioned"].to_string();
    assert!(
        said.contains("SUM(t.song_id) adds up identifiers (its name says it identifies rows)"),
        "{trace}"
    );
    let feedback = s.llm.requests()[1].last_message();
    assert!(feedback.contains("adds up identifiers"), "{feedback}");
    assert!(feedback.contains("returned rows"), "{feedback}");

    // A foreign key's column named ...id, and a column named ..._id, in a subquery and a
    // window: the model stands by its query, which is the answer, and it is doubtful.
    let keys = "SELECT (SELECT AVG(singerid) FROM songs) AS a, \
                SUM(album_id) OVER () AS b FROM songs";
    s.llm.on(
        "averages of the songs",
        vec![Reply::sql(keys), Reply::sql(keys)],
    );
    let trace = s.trace("averages of the songs").unwrap();
    assert_eq!(trace["sql"], keys, "{trace}");
    assert_eq!(trace["row_count"], 3, "{trace}");
    assert_eq!(trace["confidence"]["level"], "low", "{trace}");
    let said = trace["attempts"][0]["questioned"].to_string();
    assert!(
        said.contains("AVG(songs.singerid) averages identifiers (a foreign key column)"),
        "{trace}"
    );
    assert!(
        said.contains("SUM(songs.album_id) adds up identifiers (its name says it identifies rows)"),
        "{trace}"
    );
    assert!(
        trace["confidence"]["doubts"]
            .to_string()
            .contains("averages identifiers"),
        "{trace}"
    );

    // Counting identifiers, adding up a quantity, or averaging a key that holds a value (a year
    // referencing a table of years) is not questioned.
    let fine = "SELECT COUNT(song_id) AS n, SUM(sales) AS total, AVG(year) AS y FROM songs";
    s.llm.on("how many songs and sales", vec![Reply::sql(fine)]);
    let trace = s.trace("how many songs and sales").unwrap();
    assert_eq!(trace["sql"], fine, "{trace}");
    assert_eq!(trace["attempts"][0]["questioned"], json!([]), "{trace}");
    assert_eq!(trace["llm_calls"], 1, "{trace}");
}

/// Keys of different things compared (`d.dept_id = s.faculty_id`, where `faculty_id`
/// references faculty) join rows that have nothing to do with each other: the rows are
/// questioned, the model is told which key each column is, and its repair answers; a model that
/// stands by such a join gives a doubtful answer. Joins the schema's keys allow are not
/// questioned: a foreign key to the key it references (also through a table keyed by another,
/// which this role may not read, and while another session holds that table locked), and
/// like-named columns without a foreign key.
#[test]
fn keys_of_different_things_compared_are_repaired_or_else_doubted() {
    let mut s = Session::new();
    let reader = format!("keys_reader_{}", s.database);
    s.client
        .batch_execute(&format!(
            "CREATE TABLE departments (dept_id int PRIMARY KEY, name text);
             CREATE TABLE mentors (mentor_id int PRIMARY KEY, name text);
             CREATE SCHEMA vault; CREATE TABLE vault.keepers (keeper_id int PRIMARY KEY);
             CREATE TABLE faculty (faculty_id int PRIMARY KEY,
                                   dept_id int REFERENCES departments, name text,
                                   mentor int REFERENCES mentors,
                                   keeper int REFERENCES vault.keepers);
             CREATE TABLE sections (section_id int PRIMARY KEY,
                                    faculty_id int REFERENCES faculty, room text);
             CREATE TABLE offices (dept_id int PRIMARY KEY, floor int);
             CREATE TABLE people (person_id int PRIMARY KEY, name text);
             CREATE TABLE students (student_id int PRIMARY KEY REFERENCES people, year int);
             CREATE TABLE grades (grade_id int PRIMARY KEY, learner int REFERENCES students,
                                  score int);
             INSERT INTO departments VALUES (1, 'Math'), (2, 'Art');
             INSERT INTO mentors VALUES (1, 'Flo'), (2, 'Gus');
             INSERT INTO vault.keepers VALUES (1), (2);
             INSERT INTO faculty VALUES (1, 1, 'Ann', 1, 1), (2, 2, 'Bo', 2, 2),
                                        (3, 2, 'Cy', 2, 2);
             INSERT INTO sections VALUES (1, 1, 'A1'), (2, 2, 'B1'), (3, 3, 'B2');
             INSERT INTO offices VALUES (1, 3), (2, 4);
             INSERT INTO people VALUES (1, 'Di'), (2, 'Ed');
             INSERT INTO students VALUES (1, 2024), (2, 2025);
             INSERT INTO grades VALUES (100, 1, 90), (101, 2, 70);
             CREATE TABLE rooms (id int PRIMARY KEY, name text);
             CREATE TABLE courses (id int PRIMARY KEY, title text);
             INSERT INTO rooms VALUES (1, 'A1'), (2, 'B1');
             INSERT INTO courses VALUES (1, 'Algebra'), (2, 'Drawing');
             CREATE TABLE tenants (id int PRIMARY KEY);
             CREATE TABLE items (tenant_id int, item_id int, parent_id int,
                                 PRIMARY KEY (tenant_id, item_id),
                                 FOREIGN KEY (tenant_id, parent_id)
                                     REFERENCES items (tenant_id, item_id));
             INSERT INTO tenants VALUES (1); INSERT INTO items VALUES (1, 1, NULL), (1, 2, 1);
             CREATE ROLE {reader};
             GRANT SELECT ON departments, faculty, sections, offices, people, grades, rooms,
                             courses, tenants, items, vault.keepers TO {reader};
             SET ROLE {reader};"
        ))
        .unwrap();
    // A department's key compared with a section's teacher: told so, the repair answers.
    let unlike = "SELECT d.name, COUNT(*) AS n FROM departments d \
                  JOIN sections s ON d.dept_id = s.faculty_id GROUP BY d.name";
    let through = "SELECT d.name, COUNT(*) AS n FROM departments d \
                   JOIN faculty f ON f.dept_id = d.dept_id \
                   JOIN sections s ON s.faculty_id = f.faculty_id GROUP BY d.name";
    s.llm.on(
        "sections of each department",
        vec![Reply::sql(unlike), Reply::sql(through)],
    );
    let trace = s.trace("sections of each department").unwrap();
    assert_eq!(trace["sql"], through, "{trace}");
    assert_eq!(trace["row_count"], 2, "{trace}");
    assert_eq!(trace["confidence"]["level"], "high", "{trace}");
    let said = trace["attempts"][0]["questioned"].to_string();
    assert!(
        said.contains(
            "d.dept_id = s.faculty_id compares keys of different things \
             (departments.dept_id is the key of its table; \
             sections.faculty_id references faculty.faculty_id)"
        ),
        "{trace}"
    );
    let feedback = s.llm.requests()[1].last_message();
    assert!(
        feedback.contains("compares keys of different things"),
        "{feedback}"
    );

    // Through a WITH query and a derived table, named as the query writes them.
    let hidden = "WITH t AS (SELECT dept_id AS dept FROM departments) \
                  SELECT x.room FROM (SELECT faculty_id AS f, room FROM sections) x \
                  JOIN t ON t.dept = x.f";
    s.llm.on(
        "rooms of departments through queries",
        vec![Reply::sql(hidden), Reply::sql(hidden)],
    );
    let trace = s.trace("rooms of departments through queries").unwrap();
    assert_eq!(trace["confidence"]["level"], "low", "{trace}");
    assert!(
        trace["attempts"][0]["questioned"].to_string().contains(
            "t.dept = x.f compares keys of different things \
             (departments.dept_id is the key of its table; \
             sections.faculty_id references faculty.faculty_id)"
        ),
        "{trace}"
    );

    // Two tables' own keys compared, in a WHERE clause: the model stands by it, the answer
    // is doubtful.
    let keys = "SELECT s.room FROM sections s, departments d WHERE s.section_id = d.dept_id";
    s.llm.on(
        "rooms of the departments",
        vec![Reply::sql(keys), Reply::sql(keys)],
    );
    let trace = s.trace("rooms of the departments").unwrap();
    assert_eq!(trace["sql"], keys, "{trace}");
    assert_eq!(trace["confidence"]["level"], "low", "{trace}");
    assert!(
        trace["confidence"]["doubts"].to_string().contains(
            "s.section_id = d.dept_id compares keys of different things \
                 (sections.section_id is the key of its table; \
                 departments.dept_id is the key of its table)"
        ),
        "{trace}"
    );

    // Stood by, each doubtful, each key named only where this role may read it: mentors is
    // not granted, vault.keepers is but its schema is not (no USAGE); a chain of two foreign
    // keys names the key it ends at; two tables' own keys both named id.
    let stood_by = [
        (
            "teachers mentored by a department",
            "SELECT f.name FROM faculty f JOIN departments d ON f.mentor = d.dept_id",
            "f.mentor = d.dept_id compares keys of different things (faculty.mentor references \
             a key of a table the caller may not read; departments.dept_id is the key of its \
             table)",
        ),
        (
            "teachers kept by a department",
            "SELECT f.name FROM faculty f JOIN departments d ON f.keeper = d.dept_id",
            "f.keeper = d.dept_id compares keys of different things (faculty.keeper references \
             a key of a table the caller may not read; departments.dept_id is the key of its \
             table)",
        ),
        (
            "scores by department",
            "SELECT d.name, g.score FROM grades g JOIN departments d ON g.learner = d.dept_id",
            "g.learner = d.dept_id compares keys of different things (grades.learner \
             references people.person_id; departments.dept_id is the key of its table)",
        ),
        (
            "courses in each room",
            "SELECT r.name, c.title FROM rooms r JOIN courses c ON r.id = c.id",
            "r.id = c.id compares keys of different things (rooms.id is the key of its table; \
             courses.id is the key of its table)",
        ),
    ];
    for (question, sql, doubt) in stood_by {
        s.llm.on(question, vec![Reply::sql(sql), Reply::sql(sql)]);
        let trace = s.trace(question).unwrap();
        assert_eq!(
            (&trace["sql"], &trace["confidence"]["level"]),
            (&json!(sql), &json!("low")),
            "{trace}"
        );
        let said = trace["attempts"][0]["questioned"].to_string();
        assert!(said.contains(doubt), "{trace}");
    }
    let asked: String = s.llm.requests().iter().map(|r| r.last_message()).collect();
    for hidden in ["mentors", "keepers", "vault"] {
        assert!(!asked.contains(hidden), "{hidden}: {asked}");
    }

    // Allowed: a grade's learner is a student, whose key is a person's (students, which this
    // role may not read, is only looked at); like-named keys without a foreign key; a foreign
    // key to the key it references; a column a key of several columns maps onto itself. Not
    // questioned, one request each.
    let mut holder = s.second_connection();
    let fine = [
        (
            "scores of each person",
            "SELECT p.name, g.score FROM grades g JOIN people p ON g.learner = p.person_id",
        ),
        (
            "floors of the teachers",
            "SELECT f.name, o.floor FROM faculty f JOIN offices o ON o.dept_id = f.dept_id",
        ),
        (
            "teachers of each department",
            "SELECT d.name, f.name FROM departments d JOIN faculty f ON f.dept_id = d.dept_id",
        ),
        (
            "items of each tenant",
            "SELECT t.id, i.item_id FROM items i JOIN tenants t ON i.tenant_id = t.id",
        ),
    ];
    for (question, sql) in fine {
        s.llm.on(question, vec![Reply::sql(sql)]);
        let trace = s.trace(question).unwrap();
        assert_eq!(trace["sql"], sql, "{trace}");
        assert_eq!(trace["attempts"][0]["questioned"], json!([]), "{trace}");
        assert_eq!(trace["llm_calls"], 1, "{trace}");
    }
    // While another session holds students locked, the look-up does not wait for it.
    holder
        .batch_execute("BEGIN; LOCK TABLE students IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let sql = fine[0].1;
    s.llm.on("scores of every person", vec![Reply::sql(sql)]);
    let trace = s.trace("scores of every person").unwrap();
    assert_eq!(
        (&trace["sql"], &trace["row_count"]),
        (&json!(sql), &json!(2)),
        "{trace}"
    );
    holder.batch_execute("ROLLBACK").unwrap();
}

/// A share or a ratio of counts computed in integers comes out truncated (most often 0): the
/// rows are questioned, and the repair that divides numbers answers; a model that stands by it
/// gives a doubtful answer. Dividing numbers, or integers without an aggregate, is not
/// questioned.
#[test]
fn a_division_of_integer_aggregates_is_repaired_or_else_doubted() {
    let mut s = Session::new();
    let truncated = "SELECT COUNT(*) FILTER (WHERE amount > 100) * 100 / COUNT(*) AS pct \
                     FROM orders";
    let share = "SELECT COUNT(*) FILTER (WHERE amount > 100) * 100.0 / COUNT(*) AS pct \
                 FROM orders";
    s.llm.on(
        "share of big orders",
        vec![Reply::sql(truncated), Reply::sql(share)],
    );
    let trace = s.trace("share of big orders").unwrap();
    assert_eq!(trace["sql"], share, "{trace}");
    assert_eq!(trace["confidence"]["level"], "high", "{trace}");
    let said = trace["attempts"][0]["questioned"].to_string();
    assert!(
        said.contains(
            "an expression of COUNT(*) / COUNT(*) divides integers (as may other divisions of \
             the query), which drops the fraction"
        ),
        "{trace}"
    );
    let feedback = s.llm.requests()[1].last_message();
    assert!(feedback.contains("divides integers"), "{feedback}");

    let ratio = "SELECT c.country, COUNT(o.order_id) / COUNT(DISTINCT c.customer_id) AS per \
                 FROM customers c JOIN orders o ON o.customer_id = c.customer_id \
                 GROUP BY c.country";
    s.llm.on(
        "orders per customer by country",
        vec![Reply::sql(ratio), Reply::sql(ratio)],
    );
    let trace = s.trace("orders per customer by country").unwrap();
    assert_eq!(trace["sql"], ratio, "{trace}");
    assert_eq!(trace["confidence"]["level"], "low", "{trace}");
    let said = trace["attempts"][0]["questioned"].to_string();
    assert!(
        said.contains("COUNT(...) / COUNT(...) divides integers"),
        "{trace}"
    );

    // Guarded and cast the ways models write it: questioned all the same, once per query.
    let guarded = "SELECT COUNT(*) FILTER (WHERE amount > 100) * 100 / NULLIF(COUNT(*), 0) AS a, \
                   COUNT(DISTINCT customer_id)::int / COUNT(*)::int AS b FROM orders";
    s.llm.on(
        "guarded shares of orders",
        vec![Reply::sql(guarded), Reply::sql(guarded)],
    );
    let trace = s.trace("guarded shares of orders").unwrap();
    assert_eq!(trace["confidence"]["level"], "low", "{trace}");
    let said = trace["attempts"][0]["questioned"].as_array().cloned();
    assert_eq!(
        said.as_ref().map(Vec::len),
        Some(1),
        "one line for both divisions: {trace}"
    );
    assert!(
        trace["attempts"][0]["questioned"]
            .to_string()
            .contains("an expression of COUNT(*) / an expression of COUNT(*) divides integers"),
        "{trace}"
    );

    // Counts computed apart, in scalar subqueries.
    let apart = "SELECT (SELECT COUNT(*) FROM orders WHERE amount > 100) * 100 \
                 / (SELECT COUNT(*) FROM orders) AS pct";
    s.llm.on(
        "share of big orders apart",
        vec![Reply::sql(apart), Reply::sql(apart)],
    );
    let trace = s.trace("share of big orders apart").unwrap();
    assert_eq!(trace["confidence"]["level"], "low", "{trace}");
    assert!(
        trace["attempts"][0]["questioned"]
            .to_string()
            .contains("an expression of a subquery's COUNT(*) / a subquery's COUNT(*) divides"),
        "{trace}"
    );

    // Counts computed apart in WITH queries or derived tables, or chosen by CASE.
    let queries = "WITH big AS (SELECT COUNT(*) AS n FROM orders WHERE amount > 100) \
                   SELECT big.n * 100 / t.total AS pct \
                   FROM big, (SELECT COUNT(*) AS total FROM orders) t";
    let case = "SELECT CASE WHEN COUNT(*) > 0 THEN SUM(amount)::int ELSE 0 END \
                / COUNT(DISTINCT customer_id) AS per FROM orders";
    for (question, sql, line) in [
        (
            "share of big orders in queries",
            queries,
            "an expression of big.n (computed as COUNT(*)) / t.total (computed as COUNT(*)) \
             divides integers",
        ),
        (
            "amount per customer by case",
            case,
            "an expression of SUM(...) / COUNT(...) divides integers",
        ),
    ] {
        s.llm.on(question, vec![Reply::sql(sql), Reply::sql(sql)]);
        let trace = s.trace(question).unwrap();
        assert_eq!(trace["confidence"]["level"], "low", "{trace}");
        assert!(
            trace["attempts"][0]["questioned"]
                .to_string()
                .contains(line),
            "{trace}"
        );
    }

    // Numbers divided, integers without an aggregate, a constant divisor (buckets, pages):
    // not questioned.
    let fine = "SELECT COUNT(*)::numeric / COUNT(DISTINCT customer_id) AS per, \
                order_id / 10 AS bucket, COUNT(*) / 10 AS tens, COUNT(*) / (2 * 5) AS t, \
                MIN(order_id) / 2 AS half FROM orders GROUP BY order_id / 10";
    let pages = "SELECT order_id, row_number() OVER (ORDER BY order_id) / 10 AS page \
                 FROM orders";
    let numbers = "WITH t AS (SELECT COUNT(*)::numeric AS n, COUNT(*) AS m FROM orders) \
                   SELECT t.n / t.m AS one, t.m / 2 AS half, b.k / b.j AS k \
                   FROM t, (SELECT order_id / 10 AS k, order_id % 7 + 1 AS j FROM orders) b";
    for (question, sql) in [
        ("orders per customer by bucket", fine),
        ("pages of orders", pages),
        ("numbers of orders in queries", numbers),
    ] {
        s.llm.on(question, vec![Reply::sql(sql)]);
        let trace = s.trace(question).unwrap();
        assert_eq!(trace["sql"], sql, "{trace}");
        assert_eq!(trace["attempts"][0]["questioned"], json!([]), "{trace}");
        assert_eq!(trace["llm_calls"], 1, "{trace}");
    }
}

/// An IN subquery that selects a column of the outer query (its own table lacks the name, so
/// PostgreSQL looks outside) compares each row with itself: it is not run, the model is told
/// why, and its repair answers. A subquery correlated the usual way runs as written.
#[test]
fn an_in_subquery_that_selects_an_outer_column_is_repaired_instead_of_run() {
    let mut s = Session::new();
    let outer = "SELECT c.name FROM customers c \
                 WHERE c.country IN (SELECT country FROM orders WHERE amount > 100) ORDER BY 1";
    let fixed = "SELECT c.name FROM customers c \
                 WHERE c.customer_id IN (SELECT customer_id FROM orders WHERE amount > 100)";
    s.llm.on(
        "customers with an order over 100",
        vec![Reply::sql(outer), Reply::sql(fixed)],
    );
    let trace = s.trace("customers with an order over 100").unwrap();
    let attempts = trace["attempts"].as_array().unwrap();
    assert_eq!(attempts[0]["sqlstate"], "42P10", "{trace}");
    let message = attempts[0]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("selects c.country, a column of the outer query, not of orders"),
        "{message}"
    );
    assert_eq!(
        (&trace["status"], &trace["row_count"]),
        (&json!("ok"), &json!(1)),
        "the repair, not every customer: {trace}"
    );
    let repair = s.llm.requests()[1].last_message();
    assert!(repair.contains("a column of the outer query"), "{repair}");

    let correlated = "SELECT c.name FROM customers c WHERE c.customer_id IN \
                      (SELECT o.customer_id FROM orders o WHERE o.amount > 100 \
                       AND o.customer_id = c.customer_id)";
    s.llm.on("big spenders", vec![Reply::sql(correlated)]);
    let trace = s.trace("big spenders").unwrap();
    assert_eq!(
        (
            &trace["row_count"],
            trace["attempts"].as_array().map(Vec::len)
        ),
        (&json!(1), Some(1)),
        "{trace}"
    );
}
