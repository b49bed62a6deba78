//! The gateway as chat UIs use it, replayed from the request bodies the real clients sent
//! (tests/fixtures/chat_clients, recorded from Open WebUI 0.12.4 in Chromium): a follow-up, a
//! regenerated answer, an edited earlier question, two chats that start alike, the title, tags
//! and follow-up tasks, concurrent requests of one chat. Each is checked against what the model
//! was sent and what the history recorded.

use postgres::Client;
use serde_json::{json, Value};
use sql_query_engine_e2e::gateway::{repo, Gateway};
use sql_query_engine_e2e::llm::Request;
use sql_query_engine_e2e::{cluster, Reply, ScriptedLlm};

/// The questions of the recordings, and the SQL the model answers them with.
const ANSWERS: &[(&str, &str)] = &[
    (
        "How many customers are there?",
        "SELECT count(*) AS customers FROM customers",
    ),
    (
        "And how many of them are from Germany?",
        "SELECT count(*) AS customers FROM customers WHERE country = 'DE'",
    ),
    (
        "How many products are there?",
        "SELECT count(*) AS products FROM products",
    ),
    (
        "Which products have never been ordered?",
        "SELECT p.name FROM products p WHERE NOT EXISTS \
         (SELECT 1 FROM order_items i WHERE i.product_id = p.product_id)",
    ),
];

struct Chat {
    database: String,
    llm: ScriptedLlm,
    gateway: Gateway,
    token: String,
}

impl Chat {
    fn start() -> Chat {
        let c = cluster();
        let database = c.fresh_database();
        let llm = ScriptedLlm::start();
        let (authenticator, reader) = (
            format!("authenticator_{database}"),
            format!("reader_{database}"),
        );
        c.connect(&database)
            .batch_execute(&format!(
                "CREATE TABLE products (product_id int PRIMARY KEY, name text NOT NULL);
                 CREATE TABLE order_items (order_id int, product_id int REFERENCES products);
                 INSERT INTO products VALUES (1, 'Lamp'), (2, 'Gift card');
                 INSERT INTO order_items VALUES (10, 1);
                 CREATE ROLE {authenticator} LOGIN NOINHERIT;
                 CREATE ROLE {reader};
                 GRANT SELECT ON customers, orders, products, order_items TO {reader};
                 GRANT {reader} TO {authenticator};
                 ALTER DATABASE {database} SET sql_query_engine.llm_url = '{}';
                 ALTER DATABASE {database} SET sql_query_engine.vote = off;
                 ALTER DATABASE {database} SET sql_query_engine.max_repairs = 1;",
                llm.url()
            ))
            .unwrap();
        llm.respond_with(|request| {
            let asked = request.last_message();
            let (_, sql) = ANSWERS
                .iter()
                .filter(|(question, _)| asked.contains(question))
                .max_by_key(|(question, _)| question.len())?;
            Some(Reply::sql(sql))
        });
        let token = format!("chat-token-{database}");
        let tokens = sql_query_engine_e2e::scratch(&format!("chat-tokens-{database}"));
        std::fs::write(&tokens, format!("{token} {reader}\n")).unwrap();
        let database_url = format!(
            "host={} port={} user={authenticator} dbname={database}",
            c.host, c.port
        );
        let gateway = Gateway::start(&database_url, &tokens);
        Chat {
            database,
            llm,
            gateway,
            token,
        }
    }

    fn admin(&self) -> Client {
        cluster().connect(&self.database)
    }

    /// `body` as the client sent it, for this database's model.
    fn send(
        &self,
        body: &Value,
        headers: &[(&str, &str)],
    ) -> sql_query_engine_e2e::gateway::Answer {
        let mut body = body.clone();
        body["model"] = json!(self.database);
        self.gateway.chat(&self.token, &body, headers)
    }

    /// The requests the model got for `question` (as the newest message).
    fn asked(&self, question: &str) -> Vec<Request> {
        self.llm
            .requests()
            .into_iter()
            .filter(|r| r.last_message().contains(question))
            .collect()
    }

    /// The history, oldest first: (question, session).
    fn history(&self) -> Vec<(String, Option<String>)> {
        self.admin()
            .query("SELECT question, session FROM nl_history ORDER BY id", &[])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }
}

/// The recorded requests of a client: (step, body), in the order it sent them.
fn recorded(file: &str) -> Vec<(String, Value)> {
    let path = repo().join("tests/fixtures/chat_clients").join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let fixture: Value = serde_json::from_str(&text).unwrap();
    fixture["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["step"].as_str().unwrap().to_string(), r["body"].clone()))
        .collect()
}

fn is_task(body: &Value) -> bool {
    body["messages"][0]["content"]
        .as_str()
        .is_some_and(|c| c.starts_with("### Task:"))
}

/// The task's key in Open WebUI's template ("title", "tags", "follow_ups").
fn task_key(body: &Value) -> &'static str {
    let text = body["messages"][0]["content"].as_str().unwrap_or_default();
    ["title", "tags", "follow_ups"]
        .into_iter()
        .find(|k| text.contains(&format!("{{ \"{k}\"")))
        .unwrap_or("?")
}

#[test]
fn open_webui_chats_follow_the_request_and_its_tasks_never_reach_the_database() {
    let chat = Chat::start();
    let requests = recorded("openwebui-0.12.4.json");
    assert!(requests.len() >= 15, "{} requests recorded", requests.len());
    let mut questions = 0;
    for (step, body) in &requests {
        let answer = chat.send(body, &[]);
        assert_eq!(answer.status, 200, "{step}: {answer:?}");
        if is_task(body) {
            // Answered by the gateway, in the JSON Open WebUI parses.
            let parsed: Value = serde_json::from_str(&answer.content)
                .unwrap_or_else(|e| panic!("{step}: {e}: {}", answer.content));
            let key = task_key(body);
            match key {
                "title" => assert!(
                    parsed["title"]
                        .as_str()
                        .is_some_and(|t| t.starts_with("How many")),
                    "{step}: {parsed}"
                ),
                "tags" | "follow_ups" => assert_eq!(parsed, json!({ key: [] }), "{step}"),
                other => panic!("{step}: an unexpected task {other}"),
            }
        } else {
            questions += 1;
            assert!(
                answer.content.contains("```sql\nSELECT"),
                "{step}: {}",
                answer.content
            );
            // Progress in words a user follows, before the answer.
            assert!(
                answer
                    .reasoning
                    .iter()
                    .any(|l| l == "asking the model for a query"),
                "{step}: {:?}",
                answer.reasoning
            );
            assert!(
                answer
                    .reasoning
                    .iter()
                    .any(|l| l.starts_with("the first query: 1 row")),
                "{step}: {:?}",
                answer.reasoning
            );
            assert!(
                answer.content.starts_with("1 row.") || answer.content.starts_with("2 rows."),
                "{step}: {}",
                answer.content
            );
        }
    }
    assert_eq!(questions, 6);

    // No task ever reached the model or the database.
    let requests_to_model = chat.llm.requests();
    assert!(
        !requests_to_model
            .iter()
            .any(|r| r.text().contains("### Task:")),
        "a task reached the model"
    );
    assert_eq!(requests_to_model.len(), 6, "one model call per question");

    // The follow-up and its regeneration: the same context, the first question with the SQL
    // of its answer, and no duplicate turn.
    let follow_ups = chat.asked("And how many of them are from Germany?");
    assert_eq!(follow_ups.len(), 2);
    assert_eq!(
        follow_ups[0].body["messages"], follow_ups[1].body["messages"],
        "the regenerated answer was asked with another context"
    );
    let context = follow_ups[0].text();
    assert_eq!(context.matches("How many customers are there?").count(), 1);
    assert!(context.contains(r#"{"sql":"SELECT count(*) AS customers FROM customers"}"#));

    // The edited first question starts over: nothing earlier in its context.
    let edited = chat.asked("How many products are there?");
    assert_eq!(edited.len(), 1);
    let roles: Vec<&str> = edited[0].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user"], "the edited question had context");
    assert!(!edited[0].text().contains("How many customers are there?"));

    // Chat B starts like chat A; its follow-up sees chat B only.
    let b = chat.asked("Which products have never been ordered?");
    assert_eq!(b.len(), 1);
    assert!(b[0].text().contains("How many customers are there?"));
    assert!(
        !b[0].text().contains("Germany"),
        "chat B saw chat A's follow-up"
    );

    // History: the six questions, no task, and no server-side session state.
    let history = chat.history();
    let asked: Vec<&str> = history.iter().map(|(q, _)| q.as_str()).collect();
    assert_eq!(
        asked,
        [
            "How many customers are there?",
            "And how many of them are from Germany?",
            "And how many of them are from Germany?",
            "How many products are there?",
            "How many customers are there?",
            "Which products have never been ordered?",
        ]
    );
    assert!(history.iter().all(|(_, session)| session.is_none()));
    let sessions: i64 = chat
        .admin()
        .query_one("SELECT count(*) FROM nl_sessions", &[])
        .unwrap()
        .get(0);
    assert_eq!(sessions, 0);
}

#[test]
fn concurrent_requests_of_one_chat_are_each_answered_once_with_their_own_context() {
    let chat = Chat::start();
    let requests = recorded("openwebui-0.12.4.json");
    // Chat A as Open WebUI sends it at once: the title task beside the first question, then
    // the follow-up twice (an answer regenerated while the first was still running), with
    // the chat id header a proxy may add.
    let chat_a: Vec<&Value> = requests
        .iter()
        .filter(|(step, _)| step.starts_with("chat A: first") || step.starts_with("chat A: follow"))
        .map(|(_, body)| body)
        .collect();
    let follow_up = requests
        .iter()
        .find(|(step, body)| step == "chat A: follow-up" && !is_task(body))
        .map(|(_, body)| body.clone())
        .unwrap();
    let mut bodies: Vec<Value> = chat_a.into_iter().cloned().collect();
    bodies.push(follow_up);
    let answers: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = bodies
            .iter()
            .map(|body| scope.spawn(|| chat.send(body, &[("X-OpenWebUI-Chat-Id", "chat-a")])))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(answers.iter().all(|a| a.status == 200), "{answers:?}");
    let mut asked: Vec<String> = chat.history().into_iter().map(|(q, _)| q).collect();
    asked.sort();
    assert_eq!(
        asked,
        [
            "And how many of them are from Germany?",
            "And how many of them are from Germany?",
            "How many customers are there?",
        ]
    );
    // The chat id is the history's label (after the token's fingerprint), and nothing else.
    assert!(chat
        .history()
        .iter()
        .all(|(_, s)| s.as_deref().is_some_and(|s| s.ends_with("/chat-chat-a"))));
    for request in chat.asked("And how many of them are from Germany?") {
        assert_eq!(
            request
                .text()
                .matches("How many customers are there?")
                .count(),
            1
        );
    }
}

#[test]
fn a_client_that_sends_only_the_last_message_keeps_a_server_side_session() {
    let chat = Chat::start();
    let ask = |question: &str| {
        chat.send(
            &json!({"messages": [{"role": "user", "content": question}], "stream": false}),
            &[("X-Sqe-Session", "kiosk-1")],
        )
    };
    assert_eq!(ask("How many customers are there?").status, 200);
    assert_eq!(ask("And how many of them are from Germany?").status, 200);
    let follow_up = chat.asked("And how many of them are from Germany?");
    assert!(follow_up[0]
        .text()
        .contains("How many customers are there?"));
    let turns: i32 = chat
        .admin()
        .query_one(
            "SELECT count(*)::int FROM nl_sessions \
             WHERE session LIKE '%/kiosk-1' AND question IS NOT NULL",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(turns, 2);
}

#[test]
fn a_message_that_is_no_question_gets_a_short_explanation_not_a_string_of_failures() {
    let chat = Chat::start();
    chat.llm.on(
        "Hello there!",
        vec![
            Reply::Content("Hello! How can I help you today?".into()),
            Reply::Content("I can only help with questions about your data.".into()),
        ],
    );
    // The recorded first question of a chat, with a greeting instead.
    let requests = recorded("openwebui-0.12.4.json");
    let (_, first) = requests
        .iter()
        .find(|(step, body)| step.starts_with("chat A: first") && !is_task(body))
        .unwrap();
    let mut body = first.clone();
    body["messages"][0]["content"] = json!("Hello there!");
    let answer = chat.send(&body, &[]);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(
        answer
            .content
            .starts_with("This does not look like a question about the data"),
        "{answer:?}"
    );
    assert!(
        answer
            .content
            .contains("> I can only help with questions about your data."),
        "{}",
        answer.content
    );
    assert_eq!(chat.asked("Hello there!").len(), 2, "asked more than twice");
}

#[test]
fn librechat_titles_are_answered_by_the_gateway_and_its_follow_up_has_its_context() {
    let chat = Chat::start();
    let requests = recorded("librechat-0.8.7.json");
    for (step, body) in &requests {
        let answer = chat.send(body, &[]);
        assert_eq!(answer.status, 200, "{step}: {answer:?}");
        if step.starts_with("title") {
            let title = match body.get("response_format") {
                Some(_) => {
                    let parsed: Value = serde_json::from_str(&answer.content)
                        .unwrap_or_else(|e| panic!("{step}: {e}: {}", answer.content));
                    parsed["title"].as_str().unwrap_or_default().to_string()
                }
                None => answer.content.clone(),
            };
            assert_eq!(title, "How many customers are there", "{step}");
        } else {
            assert!(
                answer.content.contains("```sql\nSELECT"),
                "{step}: {answer:?}"
            );
        }
    }
    let asked = chat.llm.requests();
    assert_eq!(asked.len(), 2, "only the two questions reached the model");
    assert!(!asked
        .iter()
        .any(|r| r.text().contains("5-word-or-less") || r.text().contains("Analyze this")));
    let follow_up = chat.asked("And how many of them are from Germany?");
    assert!(follow_up[0]
        .text()
        .contains(r#"{"sql":"SELECT count(*) AS customers FROM customers"}"#));
    assert_eq!(chat.history().len(), 2);
}
