//! The database side: a bounded pool of connections logged in as the *authenticator* role (no
//! privileges of its own, NOINHERIT, member of the roles it may become), and one call of the
//! extension per request, in its own transaction, as the request's role (`SET LOCAL ROLE`),
//! PostgREST's pattern. The extension's progress NOTICEs are read from the connection as they
//! arrive. A request that is dropped (client gone, timeout) cancels its query.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool::managed::{self, Metrics, Object, RecycleResult};
use serde_json::Value;
use tokio::sync::mpsc::UnboundedSender;
use tokio_postgres::{AsyncMessage, CancelToken, Client, Config, NoTls};

/// One call of the extension.
#[derive(Debug, Clone)]
pub enum Call {
    /// `nl_ask`: the answer's rows and its trace. With `turns` (the conversation's earlier
    /// turns, from the request) the session only labels the history.
    Ask {
        question: String,
        session: Option<String>,
        turns: Option<Value>,
    },
    /// `nl_generate`: the SQL only.
    Generate { question: String },
    /// `nl_check`: the guard alone.
    Check { sql: String },
    /// `nl_run`: the caller's own SQL in the sandbox.
    Run { sql: String },
    /// `nl_schema`: what the model is told.
    Schema { question: Option<String> },
    /// `nl_fix`: the caller's SQL, repaired.
    Fix {
        sql: String,
        question: Option<String>,
    },
    /// The relations the role can read.
    Tables,
    /// `nl_feedback`: an answer (its history id) marked right, or corrected.
    Feedback {
        history_id: i64,
        correct: bool,
        corrected_sql: Option<String>,
    },
}

/// Why a call failed.
#[derive(Debug)]
pub enum DbError {
    /// PostgreSQL said no: SQLSTATE, message, detail and hint.
    Sql {
        sqlstate: String,
        message: String,
        detail: Option<String>,
        hint: Option<String>,
    },
    /// No connection became free in time.
    Busy,
    /// The database could not be reached.
    Unavailable(String),
}

impl From<tokio_postgres::Error> for DbError {
    fn from(e: tokio_postgres::Error) -> Self {
        match e.as_db_error() {
            Some(db) => DbError::Sql {
                sqlstate: db.code().code().to_string(),
                message: db.message().to_string(),
                detail: db.detail().map(str::to_string),
                hint: db.hint().map(str::to_string),
            },
            None => DbError::Unavailable(e.to_string()),
        }
    }
}

/// A pooled connection, with the channel its NOTICEs go to while a request holds it.
pub struct Conn {
    client: Client,
    notices: Arc<Mutex<Option<UnboundedSender<String>>>>,
}

pub struct Manager {
    config: Config,
}

impl managed::Manager for Manager {
    type Type = Conn;
    type Error = tokio_postgres::Error;

    async fn create(&self) -> Result<Conn, tokio_postgres::Error> {
        let (client, mut connection) = self.config.connect(NoTls).await?;
        let notices: Arc<Mutex<Option<UnboundedSender<String>>>> = Arc::new(Mutex::new(None));
        let forward = Arc::clone(&notices);
        tokio::spawn(async move {
            while let Some(message) =
                futures::future::poll_fn(|cx| connection.poll_message(cx)).await
            {
                match message {
                    Ok(AsyncMessage::Notice(notice)) => {
                        let sender = forward.lock().ok().and_then(|s| s.clone());
                        if let Some(sender) = sender {
                            let _ = sender.send(notice.message().to_string());
                        }
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        });
        Ok(Conn { client, notices })
    }

    async fn recycle(&self, conn: &mut Conn, _: &Metrics) -> RecycleResult<tokio_postgres::Error> {
        if conn.client.is_closed() {
            return Err(managed::RecycleError::message("the connection is closed"));
        }
        Ok(())
    }
}

/// Cancels the running query when dropped before `disarm`: the request was abandoned.
struct CancelOnDrop(Option<CancelToken>);

impl CancelOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(token) = self.0.take() {
            eprintln!("sqe-gateway: request abandoned, cancelling its query");
            tokio::spawn(async move {
                if let Err(e) = token.cancel_query(NoTls).await {
                    eprintln!("sqe-gateway: cancelling an abandoned query failed: {e}");
                }
            });
        }
    }
}

pub struct Db {
    pool: managed::Pool<Manager>,
    /// The database's name (the model id users select).
    pub database: String,
    /// The extension's schema, quoted: its functions are called by qualified name.
    schema: String,
}

/// For each role name of `$1` that exists: why it may run its own code in the gateway's
/// session (NULL when it may not). `reach` is every role it may become (itself included).
const RISKY_ROLES_SQL: &str = "
WITH wanted AS (
    SELECT DISTINCT r.oid, r.rolname, r.rolsuper
    FROM pg_catalog.unnest($1::text[]) AS t(name)
    JOIN pg_catalog.pg_roles r ON r.rolname = t.name),
reach AS (
    SELECT w.oid AS token_role, m.oid AS role, m.rolname, m.rolsuper
    FROM wanted w JOIN pg_catalog.pg_roles m ON pg_catalog.pg_has_role(w.oid, m.oid, 'MEMBER')),
temp AS (
    SELECT oid FROM pg_catalog.pg_namespace WHERE nspname ~ '^pg_(toast_)?temp_')
SELECT w.rolname::text, coalesce(
    (SELECT 'it is or may become the superuser ' || pg_catalog.quote_ident(x.rolname)
     FROM reach x WHERE x.token_role = w.oid AND x.rolsuper LIMIT 1),
    (SELECT 'it may create schemas in this database (as ' || pg_catalog.quote_ident(x.rolname) || ')'
     FROM reach x WHERE x.token_role = w.oid
       AND pg_catalog.has_database_privilege(x.role, pg_catalog.current_database(), 'CREATE') LIMIT 1),
    (SELECT 'it may create objects in schema ' || pg_catalog.quote_ident(n.nspname)
            || ' (as ' || pg_catalog.quote_ident(x.rolname) || ')'
     FROM reach x, pg_catalog.pg_namespace n
     WHERE x.token_role = w.oid AND n.oid NOT IN (SELECT oid FROM temp)
       AND pg_catalog.has_schema_privilege(x.role, n.oid, 'CREATE') LIMIT 1),
    (SELECT 'it owns schema ' || pg_catalog.quote_ident(n.nspname)
     FROM reach x JOIN pg_catalog.pg_namespace n ON n.nspowner = x.role
     WHERE x.token_role = w.oid AND n.oid NOT IN (SELECT oid FROM temp) LIMIT 1),
    (SELECT 'it owns relation ' || pg_catalog.quote_ident(n.nspname) || '.'
            || pg_catalog.quote_ident(c.relname)
     FROM reach x JOIN pg_catalog.pg_class c ON c.relowner = x.role
     JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE x.token_role = w.oid AND c.relnamespace NOT IN (SELECT oid FROM temp) LIMIT 1),
    (SELECT 'it owns function ' || pg_catalog.quote_ident(n.nspname) || '.'
            || pg_catalog.quote_ident(p.proname) || '('
            || pg_catalog.pg_get_function_identity_arguments(p.oid) || ')'
     FROM reach x JOIN pg_catalog.pg_proc p ON p.proowner = x.role
     JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
     WHERE x.token_role = w.oid AND p.pronamespace NOT IN (SELECT oid FROM temp) LIMIT 1),
    (SELECT 'it owns type ' || t.oid::pg_catalog.regtype::text
     FROM reach x JOIN pg_catalog.pg_type t ON t.typowner = x.role
     WHERE x.token_role = w.oid AND t.typnamespace NOT IN (SELECT oid FROM temp) LIMIT 1))
FROM wanted w
ORDER BY 1";

/// `name` as an SQL identifier.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

impl Db {
    pub async fn connect(url: &str, pool_size: usize, wait: Duration) -> anyhow::Result<Db> {
        let config: Config = url.parse()?;
        let pool = managed::Pool::builder(Manager {
            config: config.clone(),
        })
        .max_size(pool_size)
        .wait_timeout(Some(wait))
        .create_timeout(Some(wait))
        .runtime(deadpool::Runtime::Tokio1)
        .build()?;
        // Fail at start-up, not at the first request, when the database is unreachable or
        // the extension is missing.
        let conn: Object<Manager> = pool
            .get()
            .await
            .map_err(|e| anyhow::anyhow!("connecting to the database: {e}"))?;
        let superuser: bool = conn
            .client
            .query_one(
                "SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = session_user",
                &[],
            )
            .await?
            .get(0);
        if superuser {
            anyhow::bail!(
                "the login role of --database-url is a superuser: the code of views, policies \
                 and functions that other roles own would run with a superuser's rights (it can \
                 RESET ROLE); log in as a role with no privileges of its own that may become the \
                 tokens' roles (see README, \"the gateway\")"
            );
        }
        let schema: Option<String> = conn
            .client
            .query_opt(
                "SELECT pg_catalog.quote_ident(n.nspname) FROM pg_catalog.pg_extension e \
                 JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace \
                 WHERE e.extname = 'sql_query_engine'",
                &[],
            )
            .await?
            .map(|row| row.get(0));
        drop(conn);
        let schema = schema.ok_or_else(|| {
            anyhow::anyhow!("the extension sql_query_engine is not installed in this database")
        })?;
        Ok(Db {
            pool,
            database: config.get_dbname().unwrap_or("postgres").to_string(),
            schema,
        })
    }

    /// Why each of `roles` should not be a token's role: it is (or may become) a superuser, it
    /// may create objects outside pg_temp, or it owns relations, functions, types or schemas
    /// (directly or through a role it may become). Such a role can write code (a view or
    /// policy calling `set_config('role', ...)` and `query_to_xml`, a function with SET ROLE)
    /// that runs in the gateway's session, where SET ROLE is checked against the login role:
    /// it would reach every role the login role may become. Roles that do not exist are left
    /// out (their requests fail).
    pub async fn risky_roles(&self, roles: &[String]) -> Result<Vec<(String, String)>, DbError> {
        let conn: Object<Manager> = self.pool.get().await.map_err(|e| match e {
            managed::PoolError::Timeout(_) => DbError::Busy,
            other => DbError::Unavailable(other.to_string()),
        })?;
        let rows = conn.client.query(RISKY_ROLES_SQL, &[&roles]).await?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                let why: Option<String> = row.get(1);
                why.map(|why| (row.get(0), why))
            })
            .collect())
    }

    /// Runs `call` as `role` (the login role when `None`) in one transaction; NOTICEs go to
    /// `progress` as they arrive. Dropping the future cancels the query.
    pub async fn call(
        &self,
        role: Option<&str>,
        call: &Call,
        progress: Option<UnboundedSender<String>>,
    ) -> Result<Value, DbError> {
        let mut conn: Object<Manager> = self.pool.get().await.map_err(|e| match e {
            managed::PoolError::Timeout(_) => DbError::Busy,
            other => DbError::Unavailable(other.to_string()),
        })?;
        let streaming = progress.is_some();
        if let Ok(mut sender) = conn.notices.lock() {
            *sender = progress;
        }
        let guard = CancelOnDrop(Some(conn.client.cancel_token()));
        let result = run(&mut conn.client, &self.schema, role, call, streaming).await;
        guard.disarm();
        if let Ok(mut sender) = conn.notices.lock() {
            *sender = None;
        }
        result
    }
}

async fn run(
    client: &mut Client,
    schema: &str,
    role: Option<&str>,
    call: &Call,
    progress: bool,
) -> Result<Value, DbError> {
    let tx = client.transaction().await?;
    if let Some(role) = role {
        tx.batch_execute(&format!("SET LOCAL ROLE {}", quote_ident(role)))
            .await?;
    }
    if progress {
        tx.batch_execute("SET LOCAL sql_query_engine.progress = on")
            .await?;
    }
    let json = |text: String| serde_json::from_str::<Value>(&text).unwrap_or(Value::Null);
    let value = match call {
        Call::Ask {
            question,
            session,
            turns,
        } => {
            let turns = turns.as_ref().map(Value::to_string);
            json(
                tx.query_one(
                    &format!("SELECT {schema}.nl_ask($1, $2, $3::text::jsonb)::text"),
                    &[question, session, &turns],
                )
                .await?
                .get(0),
            )
        }
        Call::Generate { question } => Value::String(
            tx.query_one(&format!("SELECT {schema}.nl_generate($1)"), &[question])
                .await?
                .get(0),
        ),
        Call::Check { sql } => {
            tx.execute(&format!("SELECT {schema}.nl_check($1)"), &[sql])
                .await?;
            Value::Bool(true)
        }
        Call::Run { sql } => json(
            tx.query_one(
                &format!(
                    "SELECT coalesce(pg_catalog.jsonb_agg(r), '[]')::text \
                     FROM {schema}.nl_run($1) r"
                ),
                &[sql],
            )
            .await?
            .get(0),
        ),
        Call::Schema { question } => Value::String(
            tx.query_one(&format!("SELECT {schema}.nl_schema($1)"), &[question])
                .await?
                .get(0),
        ),
        Call::Fix { sql, question } => Value::String(
            tx.query_one(&format!("SELECT {schema}.nl_fix($1, $2)"), &[sql, question])
                .await?
                .get(0),
        ),
        Call::Feedback {
            history_id,
            correct,
            corrected_sql,
        } => json(
            tx.query_one(
                &format!("SELECT {schema}.nl_feedback($1, $2, $3)::text"),
                &[history_id, correct, corrected_sql],
            )
            .await?
            .get(0),
        ),
        Call::Tables => json({
            tx.batch_execute("SET LOCAL search_path = pg_catalog, pg_temp")
                .await?;
            tx.query_one(
                "SELECT coalesce(json_agg(json_build_object(
                     'schema', n.nspname, 'name', c.relname,
                     'kind', CASE c.relkind WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view'
                                  WHEN 'f' THEN 'foreign table' ELSE 'table' END,
                     'comment', obj_description(c.oid, 'pg_class'))
                   ORDER BY n.nspname, c.relname), '[]')::text
                 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                 WHERE c.relkind IN ('r', 'v', 'm', 'f', 'p') AND NOT c.relispartition
                   AND n.nspname <> ALL (ARRAY['pg_catalog', 'information_schema'])
                   AND n.nspname !~ '^pg_toast'
                   AND pg_catalog.has_any_column_privilege(c.oid, 'SELECT')",
                &[],
            )
            .await?
            .get(0)
        }),
    };
    tx.commit().await?;
    Ok(value)
}
