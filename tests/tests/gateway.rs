//! sqe-gateway end to end: a real cluster, the scripted model, the gateway binary, and the
//! official OpenAI and MCP Python SDKs as clients (tests/clients/gateway_clients.py). The
//! gateway logs in as an authenticator role; tokens select the roles requests run as.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};
use serde_json::Value;
use sql_query_engine_e2e::clients::clients_python;
use sql_query_engine_e2e::cluster::free_port;
use sql_query_engine_e2e::gateway::{gateway_binary, repo, Gateway};
use sql_query_engine_e2e::{cluster, peak_kb, Reply, ScriptedLlm};

struct Setup {
    database: String,
    llm: ScriptedLlm,
    database_url: String,
    reader: String,
    token: String,
    limited_token: String,
    tokens: PathBuf,
}

fn setup() -> Setup {
    let c = cluster();
    let database = c.fresh_database();
    let llm = ScriptedLlm::start();
    let id = database.clone();
    let (authenticator, reader, limited) = (
        format!("authenticator_{id}"),
        format!("reader_{id}"),
        format!("limited_{id}"),
    );
    let mut admin = c.connect(&database);
    // A comment of 100,000 characters, and a table in a schema the reader may not use.
    let long_comment = "n".repeat(100_000);
    admin
        .batch_execute(&format!(
            "CREATE ROLE {authenticator} LOGIN NOINHERIT;
             CREATE ROLE {reader}; GRANT SELECT ON customers, orders TO {reader};
             CREATE ROLE {limited}; GRANT SELECT ON customers TO {limited};
             GRANT {reader}, {limited} TO {authenticator};
             CREATE SCHEMA shared; CREATE TABLE shared.log (v int);
             CREATE FUNCTION shared.run(text) RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER
                 AS $$ BEGIN EXECUTE $1; RETURN true; END $$;
             CREATE DOMAIN shared.sqltext AS text CHECK (shared.run(VALUE));
             GRANT USAGE ON SCHEMA shared TO PUBLIC;
             CREATE TABLE shared.notes (v int); GRANT SELECT ON shared.notes TO {reader};
             COMMENT ON TABLE shared.notes IS '{long_comment}';
             CREATE SCHEMA hidden; CREATE TABLE hidden.plans (v int);
             GRANT SELECT ON hidden.plans TO {reader};
             ALTER DATABASE {database} SET sql_query_engine.llm_url = '{}';
             ALTER DATABASE {database} SET sql_query_engine.vote = off;
             ALTER DATABASE {database} SET sql_query_engine.max_repairs = 1;",
            llm.url()
        ))
        .unwrap();
    llm.respond_with(|request| {
        let asked = request.last_message();
        let sql = [
            ("Fix this SQL query", "SELECT name FROM customers"),
            (
                "And how many of them are there?",
                "SELECT count(*) AS n FROM customers WHERE country = 'DE'",
            ),
            (
                "Which customers are from Germany?",
                "SELECT name FROM customers WHERE country = 'DE' ORDER BY name",
            ),
            (
                "How many orders are there?",
                "SELECT count(*) AS n FROM orders",
            ),
            ("Delete every order", "DELETE FROM orders"),
            ("Take your time", "SELECT 1 AS slow"),
            (
                "Which backend answers?",
                "SELECT 'backend-' || pg_backend_pid() AS backend",
            ),
            (
                "Exact amounts",
                "SELECT 9.50 AS price, 123456789012345678901.23 AS big, 1e400 AS huge",
            ),
            (
                "A wall of text",
                "SELECT repeat('x', 200000) AS wall FROM generate_series(1, 50)",
            ),
        ]
        .iter()
        .find(|(q, _)| asked.contains(q))
        .map(|(_, sql)| *sql)?;
        if sql.contains("slow") {
            return Some(Reply::Slow(
                Duration::from_secs(30),
                Box::new(Reply::sql(sql)),
            ));
        }
        Some(Reply::sql(sql))
    });
    let (token, limited_token) = (format!("reader-token-{id}"), format!("limited-token-{id}"));
    let tokens = sql_query_engine_e2e::scratch(&format!("tokens-{id}"));
    std::fs::write(
        &tokens,
        format!("# test tokens\n{token} {reader}\n{limited_token} {limited}\n"),
    )
    .unwrap();
    let database_url = format!(
        "host={} port={} user={authenticator} dbname={database}",
        c.host, c.port
    );
    Setup {
        database,
        llm,
        database_url,
        reader,
        token,
        limited_token,
        tokens,
    }
}

#[test]
fn the_official_openai_and_mcp_sdks_work_against_the_gateway() {
    let s = setup();
    let gateway = Gateway::start(&s.database_url, &s.tokens);
    let output = Command::new(clients_python())
        .arg(repo().join("tests/clients/gateway_clients.py"))
        .args(["--base", &format!("http://127.0.0.1:{}", gateway.port)])
        .args([
            "--model",
            &s.database,
            "--token",
            &s.token,
            "--limited-token",
            &s.limited_token,
        ])
        .arg("--gateway")
        .arg(gateway_binary())
        .args(["--database-url", &s.database_url, "--role", &s.reader])
        .output()
        .expect("running the client SDKs");
    assert!(
        output.status.success(),
        "the clients failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // The follow-up in the same chat saw the first question and its SQL.
    let follow_up = s
        .llm
        .requests()
        .into_iter()
        .find(|r| r.last_message().contains("And how many of them are there?"))
        .expect("the follow-up reached the model");
    assert!(follow_up
        .text()
        .contains("Which customers are from Germany?"));
    // Nothing the clients sent changed the data.
    let mut admin = cluster().connect(&s.database);
    let orders: i64 = admin
        .query_one("SELECT count(*) FROM orders", &[])
        .unwrap()
        .get(0);
    assert_eq!(orders, 6);
    let logged: i64 = admin
        .query_one("SELECT count(*) FROM shared.log", &[])
        .unwrap()
        .get(0);
    assert_eq!(logged, 0, "check_sql ran a domain's CHECK");
    // Requests ran as the token's role, and the history says so.
    let roles: Vec<String> = admin
        .query("SELECT DISTINCT role::text FROM nl_history ORDER BY 1", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(roles.contains(&s.reader), "{roles:?}");
    // The MCP sessions' thumbs-up (over HTTP and over stdio) wait for review, as the reader.
    let pending: Vec<String> = admin
        .query(
            "SELECT role::text FROM nl_feedback WHERE status = 'pending' AND correct",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(pending, [s.reader.clone(), s.reader.clone()]);

    // The same over plain HTTP, for chat clients' rating buttons.
    let history_id: i64 = admin
        .query_one(
            "SELECT max(id) FROM nl_history WHERE role = $1::text::name AND status = 'ok'",
            &[&s.reader],
        )
        .unwrap()
        .get(0);
    let post = |token: &str, body: &str| -> (u16, Value) {
        let response = ureq::post(&format!("{}/v1/feedback", gateway.url()))
            .set("Authorization", &format!("Bearer {token}"))
            .set("Content-Type", "application/json")
            .send_string(body);
        let (status, text) = match response {
            Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
            Err(ureq::Error::Status(status, r)) => (status, r.into_string().unwrap_or_default()),
            Err(e) => panic!("the gateway did not answer: {e}"),
        };
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    };
    let (status, given) = post(
        &s.token,
        &format!(
            r#"{{"history_id": {history_id}, "correct": false, "corrected_sql": "SELECT count(*) AS n FROM orders WHERE amount > 0"}}"#
        ),
    );
    assert_eq!(status, 200, "{given}");
    assert_eq!(given["status"], "pending", "{given}");
    let (status, given) = post(&s.token, r#"{"history_id": "one"}"#);
    assert_eq!(status, 400, "{given}");
    // Another role cannot vouch for the reader's answers.
    let (status, given) = post(
        &s.limited_token,
        &format!(r#"{{"history_id": {history_id}, "correct": true}}"#),
    );
    assert_eq!(status, 404, "{given}");
    assert_eq!(given["error"]["code"], "42704", "{given}");
}

#[test]
fn a_client_that_goes_away_cancels_its_question_and_tokens_reload_on_sighup() {
    let s = setup();
    let gateway = Gateway::start(&s.database_url, &s.tokens);
    let body = format!(
        r#"{{"model":"{}","messages":[{{"role":"user","content":"Take your time"}}]}}"#,
        s.database
    );
    let stream = gateway.send_chat(&s.token, &body);
    let mut admin = cluster().connect(&s.database);
    wait_for_nl_calls(
        &mut admin,
        true,
        Duration::from_secs(10),
        "the question never started",
    );
    drop(stream);
    wait_for_nl_calls(
        &mut admin,
        false,
        Duration::from_secs(5),
        "the question went on after the client left",
    );
    // Also when a byte came after the body (a pipelined request, or a stray one), which hyper
    // keeps unread while the answer is pending.
    let mut stream = gateway.send_chat(&s.token, &body);
    stream.write_all(b"X").unwrap();
    wait_for_nl_calls(
        &mut admin,
        true,
        Duration::from_secs(10),
        "the question never started",
    );
    drop(stream);
    wait_for_nl_calls(
        &mut admin,
        false,
        Duration::from_secs(5),
        "the question went on after the client left, a byte after its body",
    );

    // A new token works after SIGHUP, without a restart.
    let new_token = format!("later-token-{}", s.database);
    let status = |token: &str| gateway.models_status(token);
    assert!(status(&new_token).contains("401"));
    let mut tokens = std::fs::read_to_string(&s.tokens).unwrap();
    tokens.push_str(&format!("{new_token} {}\n", s.reader));
    std::fs::write(&s.tokens, tokens).unwrap();
    // SAFETY: signals the gateway process this test started.
    unsafe { libc::kill(gateway.child.id() as i32, libc::SIGHUP) };
    let started = Instant::now();
    while !status(&new_token).contains("200") {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the tokens were not reloaded"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // An edit that removes a token and adds a wrong line (a short token) is not taken, but the
    // token it removed is revoked; the others stay.
    let mut tokens = std::fs::read_to_string(&s.tokens)
        .unwrap()
        .replace(&format!("{new_token} {}\n", s.reader), "");
    tokens.push_str(&format!("short {}\n", s.reader));
    std::fs::write(&s.tokens, tokens).unwrap();
    // SAFETY: signals the gateway process this test started.
    unsafe { libc::kill(gateway.child.id() as i32, libc::SIGHUP) };
    let started = Instant::now();
    while !status(&new_token).contains("401") {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a token removed from a file with a wrong line stayed in force"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(status(&s.token).contains("200"));
}

/// A gateway whose log has no reader any more (a logger it was piped to that died) still
/// reloads its tokens on SIGHUP: a token removed from the file is revoked, one added is taken,
/// each time (a reload writes to the log: the file's mode, readable by others here, and what
/// was reloaded).
#[test]
fn a_gateway_whose_log_reader_is_gone_still_reloads_its_tokens() {
    let s = setup();
    let (reader, writer) = std::io::pipe().expect("a pipe");
    let gateway = Gateway::start_with_stderr(
        &s.database_url,
        &s.tokens,
        &["--pool-size", "4"],
        std::process::Stdio::from(writer),
    );
    drop(reader);
    let status = |token: &str| gateway.models_status(token);
    assert!(status(&s.token).contains("200"));
    let reload_until = |token: &str, wanted: &str, said: &str| {
        // SAFETY: signals the gateway process this test started.
        unsafe { libc::kill(gateway.child.id() as i32, libc::SIGHUP) };
        let started = Instant::now();
        while !status(token).contains(wanted) {
            assert!(started.elapsed() < Duration::from_secs(5), "{said}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let tokens = std::fs::read_to_string(&s.tokens).unwrap();
    std::fs::write(
        &s.tokens,
        tokens.replace(&format!("{} {}\n", s.token, s.reader), ""),
    )
    .unwrap();
    reload_until(&s.token, "401", "the removed token stayed in force");
    std::fs::write(&s.tokens, &tokens).unwrap();
    reload_until(&s.token, "200", "the token added again was not taken");
}

/// Runs the gateway with `args` and waits for it to exit: its status and what it said.
fn gateway_exits(database_url: &str, tokens: &Path, extra: &[&str]) -> (bool, String) {
    let mut child = Command::new(gateway_binary())
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port())])
        .arg("--database-url")
        .arg(database_url)
        .arg("--tokens")
        .arg(tokens)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting sqe-gateway");
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut said = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut said)
                .unwrap();
            return (status.success(), said);
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the gateway neither started nor exited"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_gateway_refuses_a_superuser_login_and_token_roles_that_can_run_their_own_code() {
    let s = setup();
    let c = cluster();
    let superuser_url = format!(
        "host={} port={} user={} dbname={}",
        c.host, c.port, c.user, s.database
    );
    let (started, said) = gateway_exits(&superuser_url, &s.tokens, &[]);
    assert!(!started && said.contains("is a superuser"), "{said}");
    // A login role that may become a superuser is one.
    let id = s.database.clone();
    let dba = format!("dba_{id}");
    let mut admin = c.connect(&s.database);
    admin
        .batch_execute(&format!(
            "CREATE ROLE {dba} SUPERUSER NOLOGIN; GRANT {dba} TO authenticator_{id};"
        ))
        .unwrap();
    let (started, said) = gateway_exits(&s.database_url, &s.tokens, &[]);
    assert!(
        !started && said.contains(&format!("may become such a role ({dba}")),
        "{said}"
    );
    admin
        .batch_execute(&format!(
            "REVOKE {dba} FROM authenticator_{id}; DROP ROLE {dba};"
        ))
        .unwrap();
    // So is one that may read the server's files: it acts as the server.
    admin
        .batch_execute(&format!(
            "GRANT pg_read_server_files TO authenticator_{id};"
        ))
        .unwrap();
    let (started, said) = gateway_exits(&s.database_url, &s.tokens, &[]);
    assert!(
        !started && said.contains("may become such a role (pg_read_server_files"),
        "{said}"
    );
    admin
        .batch_execute(&format!(
            "REVOKE pg_read_server_files FROM authenticator_{id};"
        ))
        .unwrap();
    // So is one granted EXECUTE on a built-in that reads the server's files.
    admin
        .batch_execute(&format!(
            "GRANT EXECUTE ON FUNCTION pg_catalog.pg_read_file(text) TO authenticator_{id};"
        ))
        .unwrap();
    let (started, said) = gateway_exits(&s.database_url, &s.tokens, &[]);
    assert!(
        !started && said.contains(&format!("may become such a role (authenticator_{id}")),
        "{said}"
    );
    admin
        .batch_execute(&format!(
            "REVOKE EXECUTE ON FUNCTION pg_catalog.pg_read_file(text) FROM authenticator_{id};"
        ))
        .unwrap();

    // The extension's functions are called by its schema's name: a schema another role owns
    // (public, of a database it owns) could hold that role's nl_call instead.
    let schema_owner = format!("schema_owner_{id}");
    admin
        .batch_execute(&format!(
            "CREATE ROLE {schema_owner}; ALTER DATABASE {id} OWNER TO {schema_owner};"
        ))
        .unwrap();
    let (started, said) = gateway_exits(&s.database_url, &s.tokens, &[]);
    assert!(
        !started && said.contains("whose owner is not a superuser"),
        "{said}"
    );
    admin
        .batch_execute(&format!("ALTER DATABASE {id} OWNER TO CURRENT_USER"))
        .unwrap();

    // Roles that may create objects, or own some, through the authenticator's eyes.
    let (creator, owner) = (format!("creator_{id}"), format!("owner_{id}"));
    admin
        .batch_execute(&format!(
            "CREATE ROLE {creator}; GRANT CREATE ON SCHEMA public TO {creator};
             CREATE ROLE {owner};
             CREATE FUNCTION public.owned_code() RETURNS int LANGUAGE sql AS 'SELECT 1';
             ALTER FUNCTION public.owned_code() OWNER TO {owner};
             GRANT {creator}, {owner} TO authenticator_{id};
             CREATE ROLE stranger_{id};"
        ))
        .unwrap();
    let good = std::fs::read_to_string(&s.tokens).unwrap();
    // And a role the login role may not become, whose every request would fail.
    let stranger = format!("stranger_{id}");
    for (role, why) in [
        (&creator, "it may create objects in schema public"),
        (&owner, "it owns function public.owned_code()"),
        (&stranger, "the login role may not become it"),
    ] {
        let risky = sql_query_engine_e2e::scratch(&format!("risky-tokens-{id}-{role}"));
        std::fs::write(&risky, format!("{good}risky-token-{id}-1 {role}\n")).unwrap();
        let (started, said) = gateway_exits(&s.database_url, &risky, &[]);
        assert!(
            !started && said.contains(&format!("role {role}: {why}")),
            "{said}"
        );
    }

    // A reload leaves out the tokens of such a role, and puts the others in force.
    let gateway = Gateway::start(&s.database_url, &s.tokens);
    let status = |token: &str| gateway.models_status(token);
    let sneaky = format!("sneaky-token-{id}-0001");
    let fresh = format!("fresh-token-{id}-00001");
    let hangup = || {
        // SAFETY: signals the gateway process this test started.
        unsafe { libc::kill(gateway.child.id() as i32, libc::SIGHUP) };
    };
    std::fs::write(
        &s.tokens,
        format!("{good}{sneaky} {creator}\n{fresh} {}\n", s.reader),
    )
    .unwrap();
    hangup();
    // The reload checks the roles in the database, then puts the whole file in force at once:
    // once the new token works, the reload is done.
    let asked = std::time::Instant::now();
    while !status(&fresh).contains("200") && asked.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        status(&s.token).contains("200"),
        "the old tokens stay in force"
    );
    assert!(
        status(&sneaky).contains("401"),
        "a risky role was let in on SIGHUP"
    );
    assert!(
        status(&fresh).contains("200"),
        "the file's other tokens are put in force"
    );
    // While the roles cannot be checked (the database refuses the gateway), a token removed
    // from the file is revoked all the same, and one added waits.
    admin
        .batch_execute(&format!(
            "ALTER ROLE authenticator_{id} NOLOGIN;
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE usename = 'authenticator_{id}';"
        ))
        .unwrap();
    let later = format!("later-token-{id}-00001");
    std::fs::write(&s.tokens, format!("{good}{later} {}\n", s.reader)).unwrap();
    hangup();
    let asked = std::time::Instant::now();
    while status(&fresh).contains("200") && asked.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        status(&fresh).contains("401"),
        "a removed token still works"
    );
    assert!(
        status(&later).contains("401"),
        "an unchecked token was let in"
    );
    assert!(
        status(&s.token).contains("200"),
        "a kept token stopped working"
    );
    admin
        .batch_execute(&format!("ALTER ROLE authenticator_{id} LOGIN"))
        .unwrap();
    // Once they can be checked again, the added token is put in force.
    // (Asked again until then: connections the database ended may fail a check or two.)
    let asked = std::time::Instant::now();
    while !status(&later).contains("200") && asked.elapsed() < Duration::from_secs(20) {
        hangup();
        std::thread::sleep(Duration::from_millis(1500));
    }
    assert!(status(&later).contains("200"));
    drop(gateway);

    // The opt-in starts with a warning.
    std::fs::write(&s.tokens, format!("{good}{sneaky} {creator}\n")).unwrap();
    let mut child = Command::new(gateway_binary())
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port())])
        .arg("--database-url")
        .arg(&s.database_url)
        .arg("--tokens")
        .arg(&s.tokens)
        .arg("--allow-object-owners")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let mut said = Vec::new();
    let mut byte = [0u8; 1];
    while !String::from_utf8_lossy(&said).contains("listening on") {
        if stderr.read(&mut byte).unwrap() == 0 {
            break;
        }
        said.push(byte[0]);
    }
    let _ = child.kill();
    let _ = child.wait();
    let said = String::from_utf8_lossy(&said);
    assert!(
        said.contains("WARNING") && said.contains(&creator) && said.contains("listening on"),
        "{said}"
    );
    // Whatever the opt-in, a role the login role may not become is refused: not granted, or
    // (PostgreSQL 16 on) granted without the SET option, which SET ROLE needs.
    let version: i32 = admin
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .unwrap()
        .get(0);
    let mut strangers = vec![stranger.clone()];
    if version >= 160000 {
        let unset = format!("unset_{id}");
        admin
            .batch_execute(&format!(
                "CREATE ROLE {unset}; GRANT {unset} TO authenticator_{id} WITH SET FALSE;"
            ))
            .unwrap();
        strangers.push(unset);
    }
    for role in strangers {
        let file = sql_query_engine_e2e::scratch(&format!("stranger-tokens-{id}-{role}"));
        std::fs::write(&file, format!("{good}stranger-token-{id}-01 {role}\n")).unwrap();
        let (started, said) = gateway_exits(&s.database_url, &file, &["--allow-object-owners"]);
        assert!(
            !started && said.contains(&format!("role {role}: the login role may not become it")),
            "{said}"
        );
    }
}

/// A chat completion request body for `question` on `s`'s database.
fn chat(s: &Setup, question: &str) -> String {
    format!(
        r#"{{"model":"{}","messages":[{{"role":"user","content":"{question}"}}]}}"#,
        s.database
    )
}

/// A POST of a chat completion with `token`, waiting at most 20 s for the answer.
fn post_chat(gateway: &Gateway, token: &str) -> ureq::Request {
    ureq::post(&format!("{}/v1/chat/completions", gateway.url()))
        .set("Authorization", &format!("Bearer {token}"))
        .set("Content-Type", "application/json")
        .timeout(Duration::from_secs(20))
}

/// The calls of `nl_call` running in the test's database, as another connection sees them.
fn running_nl_calls(admin: &mut postgres::Client) -> i64 {
    admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE state = 'active' AND query LIKE '%nl_call%' AND pid <> pg_backend_pid() \
               AND datname = current_database()",
            &[],
        )
        .unwrap()
        .get(0)
}

/// Waits until calls of `nl_call` run (`running`) or none does, failing with `said` after
/// `within`.
fn wait_for_nl_calls(admin: &mut postgres::Client, running: bool, within: Duration, said: &str) {
    let started = Instant::now();
    while (running_nl_calls(admin) > 0) != running {
        assert!(started.elapsed() < within, "{said}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Asks, as the reader, a question the model thinks about for 30 s, and returns once its call
/// runs in the database (the connection it holds, to drop for the cancel).
fn one_slow_call(s: &Setup, gateway: &Gateway) -> std::net::TcpStream {
    let slow = gateway.send_chat(&s.token, &chat(s, "Take your time"));
    let mut admin = cluster().connect(&s.database);
    wait_for_nl_calls(&mut admin, true, Duration::from_secs(10), "never started");
    slow
}

/// A request that finds every database connection busy is answered 503 with Retry-After once
/// `--pool-wait` has passed, instead of waiting for as long as the busy one takes.
#[test]
fn a_full_pool_answers_503_with_retry_after_instead_of_waiting() {
    let s = setup();
    let gateway = Gateway::start_with(
        &s.database_url,
        &s.tokens,
        // Its role may have two calls running: the pool, not the role's share, is full.
        &["--pool-size", "1", "--pool-wait", "1", "--role-calls", "2"],
    );
    // The one connection thinks for 30 s.
    let slow = one_slow_call(&s, &gateway);
    let asked = Instant::now();
    let response =
        post_chat(&gateway, &s.token).send_string(&chat(&s, "How many orders are there?"));
    let waited = asked.elapsed();
    match response {
        Err(ureq::Error::Status(503, response)) => {
            assert_eq!(response.header("Retry-After"), Some("2"));
            let body: Value = serde_json::from_str(&response.into_string().unwrap()).unwrap();
            assert!(
                body["error"]["message"].as_str().unwrap().contains("busy"),
                "{body}"
            );
        }
        other => panic!("expected 503, got {other:?}"),
    }
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "answered after {waited:?}"
    );
    drop(slow);
}

/// A reload vets the file's roles on a connection of its own: with every pooled connection
/// held by a call (token holders may keep them so), a token added to the file is put in force.
#[test]
fn a_reload_vets_the_tokens_while_every_pooled_connection_is_busy() {
    let s = setup();
    let gateway = Gateway::start_with(
        &s.database_url,
        &s.tokens,
        &["--pool-size", "1", "--pool-wait", "1"],
    );
    let slow = one_slow_call(&s, &gateway);
    let added = format!("added-token-{}", s.database);
    let mut tokens = std::fs::read_to_string(&s.tokens).unwrap();
    tokens.push_str(&format!("{added} {}\n", s.reader));
    std::fs::write(&s.tokens, tokens).unwrap();
    // SAFETY: signals the gateway process this test started.
    unsafe { libc::kill(gateway.child.id() as i32, libc::SIGHUP) };
    let started = Instant::now();
    while !gateway.models_status(&added).contains("200") {
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "the added token was not put in force"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(slow);
}

/// A client that leaves frees no place while the backend still runs its query (cancelled, but
/// not yet stopped: here its process is held still, as a stretch of code that checks for no
/// cancel would hold it): the next request waits for the backend, instead of a new backend
/// starting beside it, so that `--pool-size` bounds busy backends.
#[test]
fn a_client_that_leaves_frees_its_place_only_once_its_backend_is_idle() {
    let s = setup();
    let gateway = Gateway::start_with(
        &s.database_url,
        &s.tokens,
        &["--pool-size", "1", "--pool-wait", "1", "--role-calls", "2"],
    );
    let mut admin = cluster().connect(&s.database);
    let slow = one_slow_call(&s, &gateway);
    let pid: i32 = admin
        .query_one(
            "SELECT pid FROM pg_stat_activity \
             WHERE state = 'active' AND query LIKE '%nl_call%' AND pid <> pg_backend_pid() \
               AND datname = current_database()",
            &[],
        )
        .unwrap()
        .get(0);
    /// Sends `signal` to the backend's process.
    fn signal(pid: i32, signal: &str) {
        let sent = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill {signal} {pid}");
    }
    // Held still (it waits for the model: it holds no lock), then gone.
    signal(pid, "-STOP");
    drop(slow);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        running_nl_calls(&mut admin),
        1,
        "the backend's query ended while it was held"
    );
    let response =
        post_chat(&gateway, &s.token).send_string(&chat(&s, "How many orders are there?"));
    signal(pid, "-CONT");
    assert!(
        matches!(response, Err(ureq::Error::Status(503, _))),
        "served beside the backend still running: {response:?}"
    );
    // Once the backend takes the cancel and is idle, the place is free again.
    wait_for_nl_calls(&mut admin, false, Duration::from_secs(30), "never ended");
    let started = Instant::now();
    loop {
        match post_chat(&gateway, &s.token).send_string(&chat(&s, "How many orders are there?")) {
            Ok(_) => break,
            Err(e) => assert!(started.elapsed() < Duration::from_secs(10), "{e:?}"),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One role's requests take at most `--role-calls` connections: the next is answered 429
/// with Retry-After, while another role's request is served from the rest of the pool.
#[test]
fn one_roles_flood_leaves_connections_to_the_other_roles() {
    let s = setup();
    let gateway = Gateway::start_with(
        &s.database_url,
        &s.tokens,
        &["--pool-size", "3", "--role-calls", "1", "--pool-wait", "1"],
    );
    // The reader's one call thinks for 30 s.
    let slow = one_slow_call(&s, &gateway);
    match post_chat(&gateway, &s.token).send_string(&chat(&s, "How many orders are there?")) {
        Err(ureq::Error::Status(429, response)) => {
            assert_eq!(response.header("Retry-After"), Some("2"));
            let body: Value = serde_json::from_str(&response.into_string().unwrap()).unwrap();
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("already has 1 calls running"),
                "{body}"
            );
        }
        other => panic!("expected 429, got {other:?}"),
    }
    // Streamed, the refusal keeps its status too: the call ends before any progress line (its
    // progress channel closes as it ends, which once made about half of them a 200 stream).
    let streamed = format!(
        r#"{{"model":"{}","stream":true,"messages":[{{"role":"user","content":"How many orders are there?"}}]}}"#,
        s.database
    );
    for _ in 0..12 {
        match post_chat(&gateway, &s.token).send_string(&streamed) {
            Err(ureq::Error::Status(429, response)) => {
                assert_eq!(response.header("Retry-After"), Some("2"));
            }
            other => panic!("expected 429 for a streamed request, got {other:?}"),
        }
    }
    // Two connections are free: the other role is answered.
    let answered = post_chat(&gateway, &s.limited_token)
        .send_string(&chat(&s, "Which customers are from Germany?"))
        .expect("the other role is served");
    assert_eq!(answered.status(), 200);
    let body: Value = serde_json::from_str(&answered.into_string().unwrap()).unwrap();
    assert!(
        body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .contains("Bruno"),
        "{body}"
    );
    drop(slow);
}

#[test]
fn an_overload_planted_next_to_the_extensions_procedure_is_never_called() {
    let s = setup();
    let id = s.database.clone();
    let planter = format!("planter_{id}");
    let mut admin = cluster().connect(&s.database);
    // A role that may create in the extension's schema (public here, as on databases made
    // before PostgreSQL 15) adds an nl_call whose INOUT answer is text: an untyped NULL in the
    // gateway's CALL would choose it.
    admin
        .batch_execute(&format!(
            "CREATE ROLE {planter}; GRANT CREATE ON SCHEMA public TO {planter};
             CREATE TABLE public.loot (what text); GRANT INSERT ON public.loot TO PUBLIC;
             SET ROLE {planter};
             CREATE PROCEDURE public.nl_call(question text, session text, INOUT answer text,
                                             turns jsonb, run_as text, progress boolean)
                 LANGUAGE plpgsql AS $$
                 BEGIN INSERT INTO public.loot VALUES (question); answer := NULL; END $$;
             RESET ROLE;"
        ))
        .unwrap();
    let gateway = Gateway::start(&s.database_url, &s.tokens);
    let response = ureq::post(&format!("{}/v1/chat/completions", gateway.url()))
        .set("Authorization", &format!("Bearer {}", s.token))
        .set("Content-Type", "application/json")
        .send_string(&format!(
            r#"{{"model":"{}","messages":[{{"role":"user","content":"How many orders are there?"}}]}}"#,
            s.database
        ))
        .expect("an answer");
    let answer: Value = serde_json::from_str(&response.into_string().unwrap()).unwrap();
    let content = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(content.contains('6'), "{answer}");
    let looted: i64 = admin
        .query_one("SELECT count(*) FROM public.loot", &[])
        .unwrap()
        .get(0);
    assert_eq!(looted, 0, "the planted procedure ran");
}

/// The gateway calls the extension's functions by its schema's name: a call is made only while
/// that schema is the one it started with and a superuser owns it. Given away after the start
/// (public, with its database) and renamed (by a superuser with event triggers off: the
/// extension refuses renames), its new owner puts a procedure of its own under the old name:
/// the gateway refuses the question (503) and the impostor never runs.
#[test]
fn a_schema_given_away_after_the_start_takes_no_call() {
    let s = setup();
    let id = s.database.clone();
    let gateway = Gateway::start(&s.database_url, &s.tokens);
    // The status of a question's answer.
    let ask = || -> u16 {
        match post_chat(&gateway, &s.token).send_string(&chat(&s, "How many orders are there?")) {
            Ok(response) => response.status(),
            Err(ureq::Error::Status(code, _)) => code,
            Err(e) => panic!("no answer: {e}"),
        }
    };
    assert_eq!(ask(), 200);
    let mut admin = cluster().connect(&s.database);
    admin
        .batch_execute(&format!(
            "CREATE ROLE given_{id}; ALTER DATABASE {id} OWNER TO given_{id};
             ALTER EVENT TRIGGER nl_schema_kept DISABLE; ALTER SCHEMA public RENAME TO moved;
             ALTER EVENT TRIGGER nl_schema_kept ENABLE ALWAYS;
             SET ROLE given_{id};
             CREATE SCHEMA public;
             GRANT USAGE ON SCHEMA public TO PUBLIC;
             CREATE TABLE public.loot (what text); GRANT INSERT ON public.loot TO PUBLIC;
             CREATE PROCEDURE public.nl_call(question text, session text, INOUT answer jsonb,
                                             turns jsonb, run_as text, progress boolean)
                 LANGUAGE plpgsql AS $$
                 BEGIN INSERT INTO public.loot VALUES (question); answer := '{{}}'; END $$;
             RESET ROLE;"
        ))
        .unwrap();
    assert_eq!(ask(), 503, "answered with the schema given away");
    let looted: i64 = admin
        .query_one("SELECT count(*) FROM public.loot", &[])
        .unwrap()
        .get(0);
    assert_eq!(looted, 0, "the impostor's procedure ran");
}

/// The gateway's own checks (its login role's reach at start and on every reload, the tokens'
/// roles) run as the login role but on pg_catalog's search path alone: an operator another role
/// put on the login role's path, a closer match for a comparison of the checks, never runs.
/// And a reload checks the login role's reach again: granted a role that acts as the server
/// since the start, it keeps no token in force.
#[test]
fn the_gateways_checks_run_no_planted_operator_and_a_reload_checks_the_login_role_again() {
    let s = setup();
    let id = s.database.clone();
    let planter = format!("planter_{id}");
    let mut admin = cluster().connect(&s.database);
    admin
        .batch_execute(&format!(
            "CREATE ROLE {planter}; GRANT CREATE ON SCHEMA public TO {planter};
             CREATE TABLE public.loot (what text); GRANT INSERT ON public.loot TO PUBLIC;
             SET ROLE {planter};
             CREATE FUNCTION public.lt(oid, integer) RETURNS boolean LANGUAGE plpgsql AS $$
                 BEGIN INSERT INTO public.loot VALUES (session_user); RETURN $1::bigint < $2; END $$;
             CREATE OPERATOR public.< (LEFTARG = oid, RIGHTARG = integer, FUNCTION = public.lt);
             CREATE FUNCTION public.eq(oid, regclass) RETURNS boolean LANGUAGE plpgsql AS $$
                 BEGIN INSERT INTO public.loot VALUES (session_user); RETURN $1 = $2::oid; END $$;
             CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = regclass, FUNCTION = public.eq);
             RESET ROLE;"
        ))
        .unwrap();
    // Positive control: the login role's own query on its path picks the planted operator.
    let mut login = Client::connect(&s.database_url, NoTls).unwrap();
    login
        .batch_execute("SELECT 1 FROM pg_catalog.pg_proc p WHERE p.oid < 16384 LIMIT 1")
        .unwrap();
    let looted = |admin: &mut Client| -> i64 {
        admin
            .query_one("SELECT count(*) FROM public.loot", &[])
            .unwrap()
            .get(0)
    };
    assert_eq!(
        looted(&mut admin),
        1,
        "the planted operator is a closer match"
    );
    admin.batch_execute("TRUNCATE public.loot").unwrap();
    drop(login);

    let gateway = Gateway::start(&s.database_url, &s.tokens);
    assert!(gateway.models_status(&s.token).contains("200"));
    let reload = || {
        // SAFETY: signals the gateway process this test started.
        unsafe { libc::kill(gateway.child.id() as i32, libc::SIGHUP) };
    };
    // A reload that adds a token: once it works, the reload's checks have run.
    let new_token = format!("later-token-{id}");
    let mut tokens = std::fs::read_to_string(&s.tokens).unwrap();
    tokens.push_str(&format!("{new_token} {}\n", s.reader));
    std::fs::write(&s.tokens, tokens).unwrap();
    reload();
    let started = Instant::now();
    while !gateway.models_status(&new_token).contains("200") {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the tokens were not reloaded"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(looted(&mut admin), 0, "the planted operator ran in a check");

    admin
        .batch_execute(&format!("GRANT pg_read_server_files TO authenticator_{id}"))
        .unwrap();
    reload();
    let started = Instant::now();
    while !gateway.models_status(&s.token).contains("401") {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the token stayed in force"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    admin
        .batch_execute(&format!(
            "REVOKE pg_read_server_files FROM authenticator_{id}"
        ))
        .unwrap();
}

#[test]
fn a_connection_that_asks_nothing_in_time_is_closed() {
    let s = setup();
    let gateway = Gateway::start_with(
        &s.database_url,
        &s.tokens,
        &["--pool-size", "2", "--header-timeout", "1"],
    );
    let address = format!("127.0.0.1:{}", gateway.port);
    // One sends nothing, one sends its headers a line at a time and stops half way.
    let mut idle = std::net::TcpStream::connect(&address).unwrap();
    let mut slow = std::net::TcpStream::connect(&address).unwrap();
    slow.write_all(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n")
        .unwrap();
    for stream in [&mut idle, &mut slow] {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let started = Instant::now();
        let mut buffer = Vec::new();
        // The server closes the connection (EOF) instead of waiting for the rest.
        let read = stream.read_to_end(&mut buffer);
        assert!(read.is_ok(), "still open after {:?}", started.elapsed());
        assert!(started.elapsed() < Duration::from_secs(5));
    }
    // A client that asks in time is answered.
    assert!(gateway.models_status(&s.token).contains(" 200 "));
}

/// Connections without a known token cannot keep the gateway from clients with one: they hold
/// at most half the places (the oldest is closed when a new one comes), each for the login
/// timeout at most, whatever the header timeout.
#[test]
fn connections_that_never_log_in_leave_room_for_those_that_do() {
    let s = setup();
    let gateway = Gateway::start_with(
        &s.database_url,
        &s.tokens,
        &[
            "--pool-size",
            "2",
            "--max-connections",
            "8",
            "--header-timeout",
            "60",
        ],
    );
    let address = format!("127.0.0.1:{}", gateway.port);
    // More silent connections than there are places, and some that trickle their headers.
    let mut silent: Vec<std::net::TcpStream> = (0..20)
        .map(|_| std::net::TcpStream::connect(&address).unwrap())
        .collect();
    for stream in silent.iter_mut().take(5) {
        stream
            .write_all(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n")
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(500));
    for _ in 0..3 {
        let mut client = std::net::TcpStream::connect(&address).unwrap();
        write!(
            client,
            "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n\
             Connection: close\r\n\r\n",
            s.token
        )
        .unwrap();
        let started = Instant::now();
        let status = status_line(&mut client, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("no answer after {:?}: {e}", started.elapsed()));
        assert!(status.contains(" 200 "), "{status}");
    }
    drop(silent);
}

/// A client that asks for a large answer and never reads it is disconnected once the gateway
/// has waited `--write-timeout` for it to read: the answer does not stay in the gateway's memory.
#[test]
fn a_client_that_reads_nothing_of_its_answer_is_disconnected() {
    let s = setup();
    let gateway = Gateway::start_with(
        &s.database_url,
        &s.tokens,
        &["--pool-size", "2", "--write-timeout", "2"],
    );
    // 50 rows of 200 000 characters: far more than the sockets' buffers hold.
    let whole = 50 * 200_000;
    let first = std::time::Instant::now();
    let answer = gateway.chat(
        &s.token,
        &serde_json::from_str::<Value>(&chat(&s, "A wall of text")).unwrap(),
        &[],
    );
    assert_eq!(answer.status, 200, "{:?}", answer.error);
    assert!(answer.content.len() > whole, "a reading client gets it all");

    let made = first.elapsed();
    let mut stalled = gateway.send_chat(&s.token, &chat(&s, "A wall of text"));
    // The answer is ready in about the time the first took; then the gateway waits 2 s for a
    // read. Waited twice that, and 2 s more, at least 8 s.
    std::thread::sleep((made * 2 + Duration::from_secs(4)).max(Duration::from_secs(8)));
    stalled
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut received = Vec::new();
    let read = stalled.read_to_end(&mut received);
    // What the buffers held, then the end of the connection; not the rest of the answer.
    assert!(read.is_ok(), "the connection stayed open: {read:?}");
    assert!(
        received.len() < whole,
        "{} bytes: the whole answer was still there to read",
        received.len()
    );
    // The gateway goes on serving.
    assert!(gateway.models_status(&s.token).contains(" 200 "));
}

/// The status line of what `stream` is answered, waiting at most `wait`.
fn status_line(stream: &mut std::net::TcpStream, wait: Duration) -> std::io::Result<String> {
    stream.set_read_timeout(Some(wait))?;
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stream), &mut line)?;
    Ok(line.trim_end().to_string())
}

/// A client that sends all of a body but its last byte is answered 408 once `--body-timeout`
/// has passed: a body does not stay in the gateway's memory for as long as a client likes. And
/// no more connections are served at once than `--max-connections`: the next waits its turn.
#[test]
fn a_body_sent_too_slowly_is_refused_and_connections_beyond_the_limit_wait() {
    let s = setup();
    let gateway = Gateway::start_with(
        &s.database_url,
        &s.tokens,
        &["--body-timeout", "5", "--max-connections", "2"],
    );
    let address = format!("127.0.0.1:{}", gateway.port);
    let held: Vec<std::net::TcpStream> = (0..2)
        .map(|_| {
            let mut c = std::net::TcpStream::connect(&address).unwrap();
            write!(
                c,
                "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\
                 Authorization: Bearer {}\r\nContent-Type: application/json\r\n\
                 Content-Length: 1000\r\n\r\n",
                s.token
            )
            .unwrap();
            c.write_all(&[b' '; 999]).unwrap();
            c
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut third = std::net::TcpStream::connect(&address).unwrap();
    write!(
        third,
        "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n\
         Connection: close\r\n\r\n",
        s.token
    )
    .unwrap();
    let waiting = status_line(&mut third, Duration::from_millis(1000));
    assert!(
        waiting.is_err(),
        "served beyond --max-connections: {waiting:?}"
    );
    for mut c in held {
        let status = status_line(&mut c, Duration::from_secs(10)).unwrap();
        assert!(status.starts_with("HTTP/1.1 408"), "{status}");
    }
    let status = status_line(&mut third, Duration::from_secs(10)).unwrap();
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
}

/// Two tokens of one role are two clients: a session name one of them chose is not the
/// other's, so neither sees (or adds to) the other's conversation.
/// A pooled connection serves one role only: what a call's code leaves in its backend that a
/// rollback does not undo (the random seed `setseed` set, dblink's named connections,
/// sequences' `currval`) is never another role's. With one connection in the pool, each role
/// is answered by a backend of its own, another role's idle one closed for it.
#[test]
fn a_pooled_backend_never_serves_two_roles() {
    let s = setup();
    // The answer names its backend (pg_backend_pid, a read of server state).
    cluster()
        .connect(&s.database)
        .batch_execute(&format!(
            "ALTER DATABASE {} SET sql_query_engine.allow_system_catalogs = on",
            s.database
        ))
        .unwrap();
    let gateway = Gateway::start_with(&s.database_url, &s.tokens, &["--pool-size", "1"]);
    let backend = |token: &str| -> String {
        let body = serde_json::from_str(&chat(&s, "Which backend answers?")).unwrap();
        let answer = gateway.chat(token, &body, &[]);
        assert_eq!(answer.status, 200, "{answer:?}");
        // The value, in the table after the SQL.
        let text = answer.content;
        let at = text
            .rfind("backend-")
            .expect("the backend's pid in the answer");
        text[at..]
            .chars()
            .skip("backend-".len())
            .take_while(char::is_ascii_digit)
            .collect()
    };
    let first = backend(&s.token);
    let other = backend(&s.limited_token);
    let again = backend(&s.token);
    assert_ne!(first, other, "the reader's backend answered the other role");
    assert_ne!(other, again, "the other role's backend answered the reader");
}

#[test]
fn two_tokens_of_one_role_never_share_a_conversation() {
    let s = setup();
    let other = format!("second-reader-token-{}", s.database);
    let tokens = sql_query_engine_e2e::scratch(&format!("tokens-two-{}", s.database));
    std::fs::write(
        &tokens,
        format!("{} {}\n{other} {}\n", s.token, s.reader, s.reader),
    )
    .unwrap();
    let gateway = Gateway::start_with(&s.database_url, &tokens, &[]);
    let ask = |token: &str, question: &str| {
        let body = serde_json::json!({
            "model": s.database,
            "messages": [{"role": "user", "content": question}],
        });
        let answer = gateway.chat(token, &body, &[("X-Sqe-Session", "team")]);
        assert_eq!(answer.status, 200, "{answer:?}");
        s.llm.requests().last().unwrap().text()
    };
    ask(&s.token, "Which customers are from Germany?");
    let asked = ask(&other, "And how many of them are there?");
    assert!(
        !asked.contains("Which customers are from Germany?"),
        "{asked}"
    );
    // The same token's follow-up has its context (control).
    let asked = ask(&s.token, "And how many of them are there?");
    assert!(
        asked.contains("Which customers are from Germany?"),
        "{asked}"
    );
}

/// Opens an MCP session with `token`: the status, and the session's id (the answer read
/// whole, so that the request is no longer being served).
fn mcp_initialize(gateway: &Gateway, token: &str) -> (u16, Option<String>) {
    let sent = ureq::post(&format!("{}/mcp", gateway.url()))
        .set("Authorization", &format!("Bearer {token}"))
        .set("Content-Type", "application/json")
        .set("Accept", "application/json, text/event-stream")
        .timeout(Duration::from_secs(20))
        .send_string(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"test","version":"1"}}}"#,
        );
    match sent {
        Ok(r) => {
            let (status, session) = (r.status(), r.header("mcp-session-id").map(str::to_string));
            r.into_string().expect("the answer, read whole");
            (status, session)
        }
        Err(ureq::Error::Status(code, _)) => (code, None),
        Err(e) => panic!("the gateway did not answer: {e}"),
    }
}

/// An initialized MCP session of `token`: a function that posts a JSON-RPC message into it and
/// returns the answer's body, read whole.
fn mcp_session<'a>(gateway: &'a Gateway, token: &'a str) -> impl Fn(&str) -> String + 'a {
    let (status, session) = mcp_initialize(gateway, token);
    assert_eq!(status, 200);
    let session = session.expect("a session id");
    let post = move |body: &str| {
        let answer = ureq::post(&format!("{}/mcp", gateway.url()))
            .set("Authorization", &format!("Bearer {token}"))
            .set("Content-Type", "application/json")
            .set("Accept", "application/json, text/event-stream")
            .set("Mcp-Session-Id", &session)
            .timeout(Duration::from_secs(20))
            .send_string(body)
            .expect("the MCP answer");
        // Whole, however large (into_string stops at 10 MB).
        let mut text = String::new();
        answer.into_reader().read_to_string(&mut text).unwrap();
        text
    };
    post(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    post
}

/// A token has at most `--max-requests-per-token` requests served at once, an MCP event stream
/// counted for as long as it is open: one token's streams cannot take the connections every
/// token shares. The place is given back when the stream's client goes.
#[test]
fn a_token_is_served_its_share_of_requests_event_streams_included() {
    let s = setup();
    let gateway = Gateway::start_with(
        &s.database_url,
        &s.tokens,
        &["--max-requests-per-token", "1"],
    );
    let (status, session) = mcp_initialize(&gateway, &s.token);
    assert_eq!(status, 200);
    let session = session.expect("a session id");
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", gateway.port)).unwrap();
    write!(
        stream,
        "GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n\
         Accept: text/event-stream\r\nMcp-Session-Id: {session}\r\n\r\n",
        s.token
    )
    .unwrap();
    let line = status_line(&mut stream, Duration::from_secs(20)).unwrap();
    assert!(line.contains(" 200 "), "{line}");
    // The stream is open: the token's next request is refused, another token's served.
    let refused = gateway.models_status(&s.token);
    assert!(refused.contains(" 429 "), "{refused}");
    // But it may still close a session (what the session limit's refusal advises).
    let closed = ureq::delete(&format!("{}/mcp", gateway.url()))
        .set("Authorization", &format!("Bearer {}", s.token))
        .set("Mcp-Session-Id", &session)
        .timeout(Duration::from_secs(20))
        .call()
        .map(|r| r.status())
        .unwrap_or_else(|e| match e {
            ureq::Error::Status(code, _) => code,
            e => panic!("the gateway did not answer: {e}"),
        });
    assert_ne!(closed, 429, "DELETE /mcp is not held back");
    let other = gateway.models_status(&s.limited_token);
    assert!(other.contains(" 200 "), "{other}");
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = gateway.models_status(&s.token);
        if status.contains(" 200 ") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still refused after the stream closed: {status}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A token holds at most `--max-connections-per-token` connections, each from its first
/// request with the token until it closes: idle keep-alive connections that ask something now
/// and then cannot take the places every token shares. A request without a known token ends
/// its connection, so a revoked token keeps none.
#[test]
fn a_token_holds_its_share_of_connections_and_a_request_without_one_ends_its_connection() {
    let s = setup();
    let gateway = Gateway::start_with(
        &s.database_url,
        &s.tokens,
        &["--max-connections-per-token", "2"],
    );
    // Sends a GET /v1/models on `stream` (kept alive) and reads its status and whole response.
    let ask = |stream: &mut std::net::TcpStream, token: Option<&str>| -> String {
        let authorization = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        write!(
            stream,
            "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n{authorization}\r\n"
        )
        .unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
        let mut head = Vec::new();
        loop {
            let mut line = String::new();
            std::io::BufRead::read_line(&mut reader, &mut line).unwrap();
            if line.trim_end().is_empty() {
                break;
            }
            head.push(line.trim_end().to_string());
        }
        let length: usize = head
            .iter()
            .find_map(|h| {
                h.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap())
            })
            .unwrap_or(0);
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        head.join("\n")
    };
    let connect = || std::net::TcpStream::connect(("127.0.0.1", gateway.port)).unwrap();
    let closed = |stream: &mut std::net::TcpStream| {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut rest = Vec::new();
        matches!(stream.read_to_end(&mut rest), Ok(0))
    };
    let mut held: Vec<_> = (0..2).map(|_| connect()).collect();
    for stream in &mut held {
        let head = ask(stream, Some(&s.token));
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    }
    // Both still open and idle: a third connection of the token is refused, and closed.
    let mut third = connect();
    let head = ask(&mut third, Some(&s.token));
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");
    assert!(closed(&mut third), "the refused connection stayed open");
    // Another token is served; the held connections still are.
    let other = gateway.models_status(&s.limited_token);
    assert!(other.contains(" 200 "), "{other}");
    let head = ask(&mut held[0], Some(&s.token));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // A request without the token on a held connection is refused and ends that connection,
    // which frees its place.
    let head = ask(&mut held[1], None);
    assert!(head.starts_with("HTTP/1.1 401"), "{head}");
    assert!(
        closed(&mut held[1]),
        "a connection stayed open after a request without a token"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = gateway.models_status(&s.token);
        if status.contains(" 200 ") {
            break;
        }
        assert!(Instant::now() < deadline, "no place came free: {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The token holds two again (one kept alive, one new) ...
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut second = loop {
        let mut stream = connect();
        if ask(&mut stream, Some(&s.token)).starts_with("HTTP/1.1 200") {
            break stream;
        }
        assert!(Instant::now() < deadline, "no second place came free");
        std::thread::sleep(Duration::from_millis(100));
    };
    // ... and another token's request on one of them moves it to that token's count: a
    // connection does not stay on the first token's (revoked, say) while others use it.
    let head = ask(&mut held[0], Some(&s.limited_token));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut third = connect();
    let head = ask(&mut third, Some(&s.token));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(ask(&mut second, Some(&s.token)).starts_with("HTTP/1.1 200"));
}

/// A token opens MCP sessions up to `--max-mcp-sessions-per-token`; then it is answered 503
/// until one ends, and other tokens still open theirs. A session is its token's alone.
#[test]
fn mcp_sessions_are_limited_per_token() {
    let s = setup();
    let gateway = Gateway::start_with(
        &s.database_url,
        &s.tokens,
        &["--max-mcp-sessions-per-token", "2"],
    );
    let initialize = |token: &str| mcp_initialize(&gateway, token);
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let (status, session) = initialize(&s.token);
        assert_eq!(status, 200);
        sessions.push(session.expect("a session id"));
    }
    assert_eq!(initialize(&s.token).0, 503);
    // A session is its token's: another token naming it is told there is no such session, and
    // cannot close it.
    let close = |token: &str, session: &str| match ureq::delete(&format!("{}/mcp", gateway.url()))
        .set("Authorization", &format!("Bearer {token}"))
        .set("Mcp-Session-Id", session)
        .timeout(Duration::from_secs(20))
        .call()
    {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(code, _)) => code,
        Err(e) => panic!("the gateway did not answer: {e}"),
    };
    assert_eq!(close(&s.limited_token, &sessions[0]), 404);
    assert_eq!(initialize(&s.token).0, 503, "the session still counts");
    // Nor does a session header that names no session of the token open one past the limit:
    // one the session manager cannot read (not text) is no session of it.
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"test","version":"1"}}}"#;
    let mut raw = std::net::TcpStream::connect(format!("127.0.0.1:{}", gateway.port)).unwrap();
    let mut request = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: {}\r\nConnection: close\r\nMcp-Session-Id: ",
        s.token,
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(b"\x80\xff\r\n\r\n");
    request.extend_from_slice(body.as_bytes());
    raw.write_all(&request).unwrap();
    let line = status_line(&mut raw, Duration::from_secs(20)).unwrap();
    assert!(line.contains(" 404 "), "{line}");
    assert_eq!(
        initialize(&s.limited_token).0,
        200,
        "another token has its own"
    );
    // The owner closes its session, and may open another.
    assert_ne!(close(&s.token, &sessions[0]), 404);
    assert_eq!(initialize(&s.token).0, 200);
}

/// MCP: a request id is one request's at a time. The rmcp server answered a repeated id's
/// newer request and kept the older one's channel for the session's life: a client repeating
/// ids while the first ran grew the gateway's memory without bound.
#[test]
fn an_mcp_request_id_is_one_requests_while_it_may_be_answered() {
    let s = setup();
    let gateway = Gateway::start(&s.database_url, &s.tokens);
    let (status, session) = mcp_initialize(&gateway, &s.token);
    assert_eq!(status, 200);
    let session = session.expect("a session id");
    let post = |body: &str| match ureq::post(&format!("{}/mcp", gateway.url()))
        .set("Authorization", &format!("Bearer {}", s.token))
        .set("Content-Type", "application/json")
        .set("Accept", "application/json, text/event-stream")
        .set("Mcp-Session-Id", &session)
        .timeout(Duration::from_secs(20))
        .send_string(body)
    {
        Ok(r) => {
            let status = r.status();
            r.into_string().expect("the answer, read whole");
            (status, String::new())
        }
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => panic!("the gateway did not answer: {e}"),
    };
    let initialized = post(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    assert!(initialized.0 < 300, "{initialized:?}");
    // A slow question under id 7, whose client goes before the answer.
    let body = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"ask","arguments":{"question":"Take your time"}}}"#;
    let mut slow = std::net::TcpStream::connect(format!("127.0.0.1:{}", gateway.port)).unwrap();
    write!(
        slow,
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Mcp-Session-Id: {session}\r\nContent-Length: {}\r\n\r\n{body}",
        s.token,
        body.len()
    )
    .unwrap();
    let line = status_line(&mut slow, Duration::from_secs(20)).unwrap();
    assert!(line.contains(" 200 "), "{line}");
    let ping = |id: &str| post(&format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#));
    for same in ["7", "7.0", "7e0"] {
        let (status, said) = ping(same);
        assert_eq!(status, 409, "{same}: {said}");
        assert!(said.contains("id 7"), "{said}");
    }
    drop(slow);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        ping("7").0,
        409,
        "the call may still run for its gone client"
    );
    // An id whose answer was sent whole may be used again; another id is another request.
    assert_eq!(ping("8").0, 200);
    assert_eq!(ping("8").0, 200);
}

/// Every request, refused ones too, leaves a line in the gateway's access log: where it came
/// from, the role and the token's fingerprint, never the token itself.
#[test]
fn every_request_leaves_a_line_in_the_access_log_without_the_token() {
    let s = setup();
    let log = sql_query_engine_e2e::scratch(&format!("gateway-access-{}", s.database));
    let gateway = Gateway::start_logged(
        &s.database_url,
        &s.tokens,
        &["--pool-size", "2"],
        Some(&log),
    );
    assert!(gateway.models_status(&s.token).contains(" 200 "));
    assert!(gateway
        .models_status("not-anyones-token-0123456789")
        .contains(" 401 "));
    let text = std::fs::read_to_string(&log).unwrap();
    let access: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("sqe-gateway: access 127.0.0.1:"))
        .collect();
    assert!(
        access
            .iter()
            .any(|l| l.contains(&format!(" {} ", s.reader)) && l.contains(" GET /v1/models 200 ")),
        "{text}"
    );
    assert!(
        access
            .iter()
            .any(|l| l.contains(" - - GET /v1/models 401 ")),
        "{text}"
    );
    assert!(!text.contains(&s.token), "the token is in the log: {text}");
    // A request whose client went away before its answer leaves its line too.
    let body = format!(
        r#"{{"model":"{}","messages":[{{"role":"user","content":"Take your time"}}]}}"#,
        s.database
    );
    let stream = gateway.send_chat(&s.token, &body);
    std::thread::sleep(Duration::from_millis(1500));
    drop(stream);
    let started = Instant::now();
    loop {
        let text = std::fs::read_to_string(&log).unwrap();
        if text.lines().any(|l| {
            l.contains(&format!(" {} ", s.reader)) && l.contains(" POST /v1/chat/completions ")
        }) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no line for the abandoned request: {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An MCP tool call whose client goes away is cancelled, as a chat request is: its answer
/// could reach no one, and it would go on holding a connection of its role.
#[test]
fn an_mcp_tool_call_whose_client_goes_away_is_cancelled() {
    let s = setup();
    let gateway = Gateway::start(&s.database_url, &s.tokens);
    let session = McpSession::open(&gateway, &s.token);
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "ask", "arguments": {"question": "Take your time"}}})
    .to_string();
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", gateway.port)).unwrap();
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n\
         Accept: application/json, text/event-stream\r\nMcp-Session-Id: {}\r\n\
         MCP-Protocol-Version: 2025-06-18\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{call}",
        s.token,
        session.id,
        call.len()
    )
    .unwrap();
    let mut admin = cluster().connect(&s.database);
    wait_for_nl_calls(
        &mut admin,
        true,
        Duration::from_secs(10),
        "the question never started",
    );
    drop(stream);
    wait_for_nl_calls(
        &mut admin,
        false,
        Duration::from_secs(5),
        "the tool call went on after its client left",
    );
}

/// An MCP session of `token`, initialized; posts to it answer with their status and body.
struct McpSession<'a> {
    gateway: &'a Gateway,
    token: &'a str,
    id: String,
}

impl McpSession<'_> {
    fn open<'a>(gateway: &'a Gateway, token: &'a str) -> McpSession<'a> {
        let (status, id) = mcp_initialize(gateway, token);
        assert_eq!(status, 200);
        let session = McpSession {
            gateway,
            token,
            id: id.expect("a session id"),
        };
        let initialized = session.post(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        assert!(initialized.0 < 300, "{initialized:?}");
        session
    }

    fn request(&self, method: &str) -> ureq::Request {
        ureq::request(method, &format!("{}/mcp", self.gateway.url()))
            .set("Authorization", &format!("Bearer {}", self.token))
            .set("Accept", "application/json, text/event-stream")
            .set("Mcp-Session-Id", &self.id)
            .set("MCP-Protocol-Version", "2025-06-18")
            .timeout(Duration::from_secs(20))
    }

    fn post(&self, body: &str) -> (u16, String) {
        let sent = self
            .request("POST")
            .set("Content-Type", "application/json")
            .send_string(body);
        match sent {
            Ok(r) => (r.status(), r.into_string().expect("the answer, read whole")),
            Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
            Err(e) => panic!("the gateway did not answer: {e}"),
        }
    }

    /// `run_sql` of `sql`: the event stream of its answer.
    fn run_sql(&self, id: u32, sql: &str) -> String {
        let call = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "run_sql", "arguments": {"sql": sql}}});
        let (status, body) = self.post(&call.to_string());
        assert_eq!(status, 200, "{body}");
        body
    }
}

/// `sqe://tables` decides which tables the role may read from the grants as stored: with
/// `has_any_column_privilege`, every column of each table it may not read whole was looked up
/// in the pooled backend's catalog cache, which kept it for as long as the connection lived
/// (here 40 tables of 1,600 columns nobody was granted: 64,000 entries).
#[test]
fn the_tables_resource_costs_the_pooled_backend_nothing_for_tables_the_role_may_not_read() {
    let s = setup();
    let mut admin = cluster().connect(&s.database);
    let gateway = Gateway::start(&s.database_url, &s.tokens);
    let session = McpSession::open(&gateway, &s.token);
    let read = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "resources/read",
        "params": {"uri": "sqe://tables"}});
    let (status, body) = session.post(&read.to_string());
    assert_eq!(status, 200, "{body}");
    // The private memory of the gateway's backends (the catalog cache is in it).
    let private_kb = |admin: &mut Client| -> u64 {
        let pids: Vec<i32> = admin
            .query(
                "SELECT pid FROM pg_stat_activity WHERE usename = $1",
                &[&format!("authenticator_{}", s.database)],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(!pids.is_empty(), "no backend of the gateway");
        pids.iter()
            .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
            .filter_map(|status| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("RssAnon:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
            .sum()
    };
    let columns = (1..=1600)
        .map(|i| format!("c{i} int"))
        .collect::<Vec<_>>()
        .join(", ");
    for i in 0..40 {
        admin
            .batch_execute(&format!("CREATE TABLE shared.wide{i} ({columns})"))
            .unwrap();
    }
    let before = private_kb(&mut admin);
    let (status, body) = session.post(&read.to_string());
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("notes") && !body.contains("wide1"), "{body}");
    let grown = private_kb(&mut admin).saturating_sub(before);
    assert!(
        grown < 16 * 1024,
        "the gateway's backends grew by {grown} kB"
    );
}

/// An ERROR a query raises is the query's, whatever its SQLSTATE: a function in a view can
/// raise 57P01 ("terminating connection due to administrator command") or 08006 as well as a
/// server going down. Nor does a backend that ends under the call (here the view terminates
/// its own backend, as a DBA's pg_terminate_backend or the memory watch would) take its server
/// out: the server answers a check of its own, so the answer is the call's error, and nothing
/// is asked again on another server (before, it was, and ended its backend there too).
#[test]
fn an_error_a_query_raises_does_not_take_a_read_server_out_of_rotation() {
    let s = setup();
    let mut admin = cluster().connect(&s.database);
    admin
        .batch_execute(&format!(
            "CREATE FUNCTION shared.shutdown_said() RETURNS int LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'terminating connection due to administrator command'
                 USING ERRCODE = '57P01'; END $$;
             CREATE VIEW shared.unwell AS SELECT shared.shutdown_said() AS n;
             CREATE FUNCTION shared.end_me() RETURNS boolean LANGUAGE sql SECURITY DEFINER
                 AS $$ SELECT pg_terminate_backend(pg_backend_pid()) $$;
             CREATE VIEW shared.ender AS SELECT shared.end_me() AS n;
             GRANT SELECT ON shared.unwell, shared.ender TO {};",
            s.reader
        ))
        .unwrap();
    let log = sql_query_engine_e2e::scratch(&format!("gateway-unwell-{}", s.database));
    // The read server is the primary itself under another name: where a call went shows in
    // the log only when it failed.
    let gateway = Gateway::start_logged(
        &s.database_url,
        &s.tokens,
        &["--pool-size", "4", "--read-database-url", &s.database_url],
        Some(&log),
    );
    let session = McpSession::open(&gateway, &s.token);
    for id in 2..5 {
        let answer = session.run_sql(id, "SELECT n FROM shared.unwell");
        assert!(
            answer.contains("57P01") && answer.contains("administrator command"),
            "{answer}"
        );
    }
    let answer = session.run_sql(5, "SELECT n FROM shared.ender");
    assert!(answer.contains("\"isError\":true"), "{answer}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains("asking another") && !text.contains("left the rotation"),
        "{text}"
    );
}

/// A conflict with recovery (40001) is asked of another server once at most: a view's own code
/// may raise the same SQLSTATE, and the whole call, its model requests among them, would
/// otherwise be made on every server.
#[test]
fn a_conflict_a_view_raises_is_asked_of_another_server_once_at_most() {
    let s = setup();
    let mut admin = cluster().connect(&s.database);
    admin
        .batch_execute(&format!(
            "CREATE FUNCTION conflict() RETURNS int LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'canceling statement due to conflict with recovery'
                 USING ERRCODE = '40001'; END $$;
             CREATE VIEW conflicted AS SELECT conflict() AS n;
             GRANT SELECT ON conflicted TO {};
             ALTER DATABASE {} SET sql_query_engine.max_repairs = 0;",
            s.reader, s.database
        ))
        .unwrap();
    s.llm.on(
        "the conflicted number",
        vec![Reply::sql("SELECT n FROM conflicted"); 4],
    );
    // Two read servers and the primary, all the same server under other names.
    let gateway = Gateway::start_with(
        &s.database_url,
        &s.tokens,
        &[
            "--read-database-url",
            &s.database_url,
            "--read-database-url",
            &s.database_url,
        ],
    );
    let _ = post_chat(&gateway, &s.token).send_string(&chat(&s, "the conflicted number"));
    let asked = s
        .llm
        .requests()
        .iter()
        .filter(|r| r.last_message().contains("the conflicted number"))
        .count();
    assert_eq!(asked, 2, "asked on {asked} servers");
}

/// Numbers reach clients as the database wrote them: a numeric keeps its scale and its digits
/// (not read as a float: `9.5`, `1.2345678901234568e20`), and one beyond a float's range does
/// not make the whole answer fail.
#[test]
fn numbers_reach_chat_and_mcp_clients_exactly() {
    let s = setup();
    let gateway = Gateway::start(&s.database_url, &s.tokens);
    let huge = format!("1{}", "0".repeat(400));
    let exact = ["9.50", "123456789012345678901.23", huge.as_str()];
    let answer = post_chat(&gateway, &s.token)
        .send_string(&chat(&s, "Exact amounts"))
        .expect("the chat answer")
        .into_string()
        .unwrap();
    for number in exact {
        assert!(answer.contains(number), "{number} not in {answer}");
    }
    let post = mcp_session(&gateway, &s.token);
    let ran = post(
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_sql","arguments":{"sql":"SELECT 9.50 AS price, 123456789012345678901.23 AS big, 1e400 AS huge"}}}"#,
    );
    assert!(!ran.contains("\"isError\":true"), "{ran}");
    for number in exact {
        assert!(ran.contains(number), "{number} not in {ran}");
    }
}

/// A large answer takes the gateway about its size in memory, not the fifty times its values
/// weigh once parsed (each small number a value of its own): any token's answers of
/// `max_result_bytes` could take the gateway most of a gigabyte each.
#[test]
fn a_large_answer_takes_the_gateway_about_its_size_in_memory() {
    let s = setup();
    let gateway = Gateway::start(&s.database_url, &s.tokens);
    let post = mcp_session(&gateway, &s.token);
    let pid = i32::try_from(gateway.child.id()).unwrap();
    let before = peak_kb(pid).expect("the gateway's peak memory");
    // 900,000 numbers: about 13 MB of JSON, within max_result_bytes (which counts each value
    // as 16 bytes at least).
    let ran = post(
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_sql","arguments":{"sql":"SELECT ARRAY(SELECT 1000000000000::int8 FROM generate_series(1, 900)) AS a FROM generate_series(1, 1000)"}}}"#,
    );
    assert!(
        !ran.contains("\"isError\":true") && ran.len() > 10_000_000,
        "{}",
        &ran[..ran.len().min(2000)]
    );
    let grew = peak_kb(pid).expect("the gateway's peak memory") - before;
    eprintln!("the gateway grew by {grew} kB for {} bytes", ran.len());
    assert!(grew < 250_000, "the gateway grew by {grew} kB");
}

/// What another role stored (or the model wrote) reaches MCP clients with nothing that steers
/// a terminal: an error quoting a value (22P02) has its control characters written out, and a
/// result's strings have DEL, C1 controls and bidirectional overrides escaped as JSON does the
/// others (OSC 52 would set a terminal client's clipboard).
#[test]
fn what_another_role_stored_reaches_mcp_clients_written_out() {
    let s = setup();
    let mut admin = cluster().connect(&s.database);
    admin
        .batch_execute(&format!(
            "CREATE TABLE public.notes (note text);
             INSERT INTO public.notes VALUES (E'\\x1b]52;c;eA==\\x07' || chr(155) || '2J' || chr(8238));
             GRANT SELECT ON public.notes TO {};",
            s.reader
        ))
        .unwrap();
    let gateway = Gateway::start(&s.database_url, &s.tokens);
    let post = mcp_session(&gateway, &s.token);
    let steers = |c: char| {
        c == '\u{1b}'
            || c == '\u{7}'
            || ('\u{7f}'..='\u{9f}').contains(&c)
            || ('\u{202a}'..='\u{202e}').contains(&c)
    };
    for sql in ["SELECT note FROM notes", "SELECT note::int AS n FROM notes"] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"run_sql","arguments":{{"sql":"{sql}"}}}}}}"#
        );
        let answer = post(&body);
        assert!(!answer.chars().any(steers), "{sql}: {answer:?}");
        assert!(answer.contains("52;c;eA=="), "{sql}: {answer}");
    }
}

/// `sqe://tables` lists relations another role may have made, each with a comment of up to
/// 1,000 characters, which JSON writes as up to six bytes each (control characters): the
/// list is cut at 4 MB of JSON (before, 800 such tables made 4.8 MB, and 10,000 sixty).
#[test]
fn the_tables_resource_is_bounded_in_bytes() {
    let s = setup();
    cluster()
        .connect(&s.database)
        .batch_execute(
            "DO $$ BEGIN FOR i IN 1..800 LOOP
                 EXECUTE format('CREATE TABLE shared.t%s (a int)', i);
                 EXECUTE format('COMMENT ON TABLE shared.t%s IS %L', i, repeat(E'\\x01', 1000));
                 EXECUTE format('GRANT SELECT ON shared.t%s TO PUBLIC', i);
             END LOOP; END $$;",
        )
        .unwrap();
    let gateway = Gateway::start(&s.database_url, &s.tokens);
    let session = McpSession::open(&gateway, &s.token);
    let read = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "resources/read",
        "params": {"uri": "sqe://tables"}});
    let (status, body) = session.post(&read.to_string());
    assert_eq!(status, 200, "{}", &body[..body.len().min(500)]);
    let listed = body.matches(r#"\"name\":\"t"#).count();
    assert!(listed > 100 && listed < 800, "{listed} tables listed");
    assert!(body.len() < 6 << 20, "{} bytes", body.len());
}
