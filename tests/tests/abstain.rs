//! Saying "not sure" instead of guessing: every trace says how sure its answer is and why,
//! and with `abstain = when_in_doubt` a doubtful answer is withheld (SQLSTATE 42P08, the
//! interpretations in DETAIL), and nl_answer asks back instead.

use std::time::{Duration, Instant};

use sql_query_engine_e2e::{db_error, Reply, Session};

/// A first query that comes back empty, then three candidates that each find something else.
fn disagreeing(s: &Session, question: &str) {
    s.llm.on(
        question,
        vec![
            Reply::sql("SELECT name FROM customers WHERE country = 'Deutschland'"),
            Reply::Choices(vec![
                serde_json::json!({ "sql": "SELECT name FROM customers WHERE country = 'DE'" })
                    .to_string(),
                serde_json::json!({ "sql": "SELECT name FROM customers WHERE country = 'GB'" })
                    .to_string(),
                serde_json::json!({ "sql": "SELECT name FROM customers" }).to_string(),
            ]),
        ],
    );
}

fn session() -> Session {
    let mut s = Session::new();
    s.client
        .batch_execute(
            "SET sql_query_engine.vote = when_in_doubt; SET sql_query_engine.candidates = 3;
             SET sql_query_engine.max_repairs = 0;",
        )
        .unwrap();
    s
}

/// A session that withholds doubtful answers.
fn withholding() -> Session {
    let mut s = session();
    s.client
        .batch_execute("SET sql_query_engine.abstain = when_in_doubt")
        .unwrap();
    s
}

#[test]
fn the_trace_says_how_sure_and_a_doubtful_answer_is_withheld_when_asked() {
    let mut s = session();
    disagreeing(&s, "the German customers");
    let trace = s.trace("the German customers").unwrap();
    assert_eq!(trace["confidence"]["level"], "low", "{trace}");
    let doubts = trace["confidence"]["doubts"].to_string();
    assert!(
        doubts.contains("did not agree: 1 of 3 gave the answer's result"),
        "{doubts}"
    );
    // Off (the default): the best guess is still the answer.
    disagreeing(&s, "the German customers, as rows");
    assert!(!s.query("the German customers, as rows").unwrap().is_empty());

    s.client
        .batch_execute("SET sql_query_engine.abstain = when_in_doubt")
        .unwrap();
    disagreeing(&s, "the German customers, once more");
    let error = s.query("the German customers, once more").unwrap_err();
    let (code, message, detail) = db_error(&error);
    assert_eq!(code, "42P08", "{message}");
    assert!(message.contains("not sure enough"), "{message}");
    assert!(detail.contains("1. ") && detail.contains("2. "), "{detail}");
    assert!(detail.contains("country = 'DE'"), "{detail}");

    // nl_answer asks back, without asking the model to describe rows it does not trust.
    disagreeing(&s, "the German customers, in words");
    let calls = s.llm.requests().len();
    let said: String = s
        .client
        .query_one("SELECT nl_answer('the German customers, in words')", &[])
        .unwrap()
        .get(0);
    assert!(said.starts_with("I am not sure what you mean"), "{said}");
    assert!(said.contains("Which of these did you mean?"), "{said}");
    assert_eq!(
        s.llm.requests().len(),
        calls + 2,
        "the query and the candidates only"
    );
}

#[test]
fn agreeing_answers_are_sure_and_an_empty_one_is_not() {
    let mut s = withholding();
    let de = "SELECT name FROM customers WHERE country = 'DE' ORDER BY name";
    s.llm.on(
        "customers in Germany",
        vec![
            Reply::sql("SELECT name FROM customers WHERE country = 'Germany'"),
            Reply::Choices(vec![
                serde_json::json!({ "sql": de }).to_string(),
                serde_json::json!({ "sql": de }).to_string(),
                serde_json::json!({ "sql": "SELECT name FROM customers" }).to_string(),
            ]),
        ],
    );
    let rows = s.query("customers in Germany").unwrap();
    assert_eq!(rows.len(), 2, "2 of 3 alternatives agreed: sure enough");

    // Without a vote, an empty result is a doubt.
    s.client
        .batch_execute("SET sql_query_engine.vote = off")
        .unwrap();
    s.llm.on(
        "customers in Atlantis",
        vec![Reply::sql(
            "SELECT name FROM customers WHERE country = 'AT'",
        )],
    );
    let error = s.query("customers in Atlantis").unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "42P08", "{message}");
    assert!(message.contains("empty result"), "{message}");
}

#[test]
fn nothing_is_never_a_sure_answer_however_many_queries_agree() {
    let mut s = withholding();
    // A misspelt value makes an aggregate over no rows: one row of nulls, which every
    // candidate of the same model agrees on.
    let null_row = "SELECT max(name) AS last_name FROM customers WHERE country = 'Austria'";
    let empty = "SELECT name FROM customers WHERE country = 'Austria'";
    for (question, sql, why) in [
        (
            "the last Austrian customer",
            null_row,
            "every value of the answer is null",
        ),
        ("the Austrian customers", empty, "empty result"),
    ] {
        let unanimous = Reply::Choices(vec![serde_json::json!({ "sql": sql }).to_string(); 3]);
        s.llm.on(question, vec![Reply::sql(sql), unanimous]);
        let error = s.query(question).unwrap_err();
        let (code, message, detail) = db_error(&error);
        assert_eq!(code, "42P08", "{question}: {message}");
        assert!(message.contains(why), "{question}: {message}");
        assert!(detail.contains("Austria"), "{question}: {detail}");
    }
    // A null beside a value is an answer.
    let counted = "SELECT max(name) AS last_name, count(*) AS n FROM customers \
                   WHERE country = 'Austria'";
    let unanimous = Reply::Choices(vec![serde_json::json!({ "sql": counted }).to_string(); 3]);
    s.llm.on(
        "how many Austrian customers",
        vec![Reply::sql(counted), unanimous],
    );
    assert_eq!(s.query("how many Austrian customers").unwrap().len(), 1);
}

#[test]
fn withholding_doubt_checks_an_answer_with_rows_and_stops_at_a_split_vote() {
    let mut s = withholding();
    s.client
        .batch_execute("SET sql_query_engine.max_repairs = 2")
        .unwrap();
    let de = "SELECT name FROM customers WHERE country = 'DE' ORDER BY name";
    let choices = |sqls: [&str; 3]| {
        Reply::Choices(
            sqls.iter()
                .map(|sql| serde_json::json!({ "sql": sql }).to_string())
                .collect(),
        )
    };
    // A first answer with rows is put to a vote: two of three candidates agree with it.
    s.llm.on(
        "names of the German customers",
        vec![
            Reply::sql(de),
            choices([
                de,
                "SELECT name FROM customers WHERE country = 'DE'",
                "SELECT 1",
            ]),
        ],
    );
    let before = s.llm.requests().len();
    let rows = s.query("names of the German customers").unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(s.llm.requests().len(), before + 2, "the query and the vote");

    // Candidates that each find something else: withheld at once, no repair is asked for
    // (two were allowed).
    s.llm.on(
        "the customers that matter",
        vec![
            Reply::sql("SELECT name FROM customers"),
            choices([
                de,
                "SELECT name FROM customers WHERE country = 'GB'",
                "SELECT name FROM customers WHERE country = 'IT'",
            ]),
            Reply::sql("SELECT name FROM customers"),
        ],
    );
    let before = s.llm.requests().len();
    let error = s.query("the customers that matter").unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "42P08", "{message}");
    assert_eq!(
        s.llm.requests().len(),
        before + 2,
        "no repair after the split"
    );

    // The same answer with abstain off is the first query's, without a vote.
    s.client
        .batch_execute("SET sql_query_engine.abstain = off")
        .unwrap();
    s.llm.on(
        "the customers that count",
        vec![Reply::sql("SELECT name FROM customers")],
    );
    let before = s.llm.requests().len();
    assert_eq!(s.query("the customers that count").unwrap().len(), 4);
    assert_eq!(s.llm.requests().len(), before + 1);
}

/// A vote the answer budget ends counts as far as it came: the alternatives that finished
/// before the budget ran out are kept (a vote is streamed), and those that did not come back
/// count against the answer.
#[test]
fn a_vote_cut_by_the_answer_budget_keeps_the_alternatives_that_finished() {
    let mut s = withholding();
    s.client
        .batch_execute(
            "SET sql_query_engine.candidates = 4; SET sql_query_engine.answer_budget = '5s';",
        )
        .unwrap();
    let de = "SELECT name FROM customers WHERE country = 'DE' ORDER BY name";
    let sql = || serde_json::json!({ "sql": de }).to_string();
    let stalled_vote = |finished: usize| Reply::Stream {
        finished: vec![sql(); finished],
        stalled: 4 - finished,
        hold: Duration::from_secs(30),
    };
    s.llm.on(
        "German customers, quickly",
        vec![Reply::sql(de), stalled_vote(2)],
    );
    let started = Instant::now();
    let rows = s.query("German customers, quickly").unwrap();
    assert_eq!(
        rows.len(),
        2,
        "2 of the 4 came back, agreeing: half, sure enough"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the budget ended the wait, not the stream: {:?}",
        started.elapsed()
    );
    let vote = s
        .llm
        .requests()
        .last()
        .cloned()
        .expect("the vote's request");
    assert_eq!(
        (vote.body["n"].as_u64(), vote.body["stream"].as_bool()),
        (Some(4), Some(true)),
        "several choices are streamed"
    );

    // One of four is not half of them, though it is all that came back.
    s.llm.on(
        "German customers, hastily",
        vec![Reply::sql(de), stalled_vote(1)],
    );
    let error = s.query("German customers, hastily").unwrap_err();
    let (code, message, _) = db_error(&error);
    assert_eq!(code, "42P08", "{message}");
    assert!(
        message.contains("1 of 4 (3 did not come back)"),
        "{message}"
    );
}

/// An endpoint that streams more choices than the vote asked for gets only as many run as
/// were asked for, also when the stream is cut short (here by the answer budget): each is a
/// query run as the caller.
#[test]
fn a_vote_runs_no_more_alternatives_than_it_asked_for() {
    let mut s = withholding();
    s.client
        .batch_execute(
            "SET sql_query_engine.candidates = 4; SET sql_query_engine.answer_budget = '5s';",
        )
        .unwrap();
    let de = "SELECT name FROM customers WHERE country = 'DE' ORDER BY name";
    s.llm.on(
        "German customers, many times over",
        vec![
            Reply::sql(de),
            Reply::Stream {
                finished: (0..12)
                    .map(|i| serde_json::json!({ "sql": format!("{de} /* {i} */") }).to_string())
                    .collect(),
                stalled: 1,
                hold: Duration::from_secs(30),
            },
        ],
    );
    let trace = s.trace("German customers, many times over").unwrap();
    let attempts = trace["attempts"].as_array().expect("attempts").len();
    assert!(attempts <= 5, "{attempts} queries ran: {trace}");
}

/// A withheld answer is not the conversation's: the next question of the session is asked
/// without it (only answers given are earlier turns). In a read-only transaction the turns are
/// kept in the backend's memory (as in Redis), where the ERROR that withholds the answer does
/// not take them back as it takes back a row of `nl_sessions`.
#[test]
fn a_withheld_answer_is_no_turn_of_the_conversation() {
    let mut s = withholding();
    s.client
        .batch_execute("SET default_transaction_read_only = on")
        .unwrap();
    disagreeing(&s, "the German customers, in a talk");
    let error = s
        .client
        .query(
            "SELECT nl_query($1, 'talk')::text",
            &[&"the German customers, in a talk"],
        )
        .unwrap_err();
    assert_eq!(db_error(&error).0, "42P08");
    s.llm.on(
        "and how many orders are there",
        vec![
            Reply::sql("SELECT count(*) AS n FROM orders"),
            Reply::Choices(vec![
                serde_json::json!({ "sql": "SELECT count(*) AS n FROM orders" }).to_string(),
                serde_json::json!({ "sql": "SELECT count(order_id) AS n FROM orders" }).to_string(),
                serde_json::json!({ "sql": "SELECT count(*) AS n FROM orders" }).to_string(),
            ]),
        ],
    );
    s.client
        .query(
            "SELECT nl_query($1, 'talk')::text",
            &[&"and how many orders are there"],
        )
        .unwrap();
    let asked = s
        .llm
        .requests()
        .into_iter()
        .map(|r| r.text())
        .find(|t| t.contains("and how many orders are there"))
        .unwrap();
    assert!(
        !asked.contains("the German customers, in a talk"),
        "a withheld answer was a turn:\n{asked}"
    );
}

/// The abstention's SQLSTATE (42P08) is the abstention's alone: a query whose code raised
/// 42P08 itself (another role's view, `RAISE ... USING ERRCODE`) fails as any query error does,
/// raised as XX000 with the query's own SQLSTATE in DETAIL, and `nl_answer` raises it rather
/// than asking back as if it had withheld a doubtful answer (before, it returned a clarifying
/// question, even with `abstain = off`).
#[test]
fn a_querys_own_42p08_is_not_taken_for_an_abstention() {
    let mut s = session();
    s.client
        .batch_execute(
            "CREATE FUNCTION ambiguous() RETURNS int LANGUAGE plpgsql AS
               $$ BEGIN RAISE EXCEPTION 'which one?' USING ERRCODE = '42P08'; END $$;
             CREATE VIEW vague AS SELECT ambiguous() AS n;
             SET sql_query_engine.vote = off;",
        )
        .unwrap();
    for function in ["nl_query", "nl_answer"] {
        let question = format!("how vague, by {function}");
        s.llm.on(&question, vec![Reply::sql("SELECT n FROM vague")]);
        let error = s
            .client
            .query_one(&format!("SELECT {function}($1)::text"), &[&question])
            .unwrap_err();
        let (code, message, detail) = db_error(&error);
        assert_eq!(code, "XX000", "{function}: {message}");
        assert!(message.contains("which one?"), "{message}");
        assert!(
            detail.contains("SQLSTATE of the query's error: 42P08"),
            "{detail}"
        );
    }
}
