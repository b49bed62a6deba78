//! The Model Context Protocol server, for agents and IDEs: over streamable HTTP at `/mcp` (the
//! bearer token selects the role, as for the OpenAI API) and over stdio (the login role, or
//! `--role`). Every tool goes through the extension and all but `give_feedback` (which writes
//! only the extension's feedback and example tables) are read-only: `run_sql` and `fix_sql`
//! run the caller's SQL through the same guard and sandbox as generated SQL, so a
//! `COMMIT; DELETE ...` changes nothing.

use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, ListResourcesResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData as McpError, RoleServer, ServerHandler};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

use axum::extract::ConnectInfo;

use crate::app::Role;
use crate::db::{Answer, Call, Db, DbError};
use crate::shown::{json_escaped, legible};
use crate::watch::ClientGone;

#[derive(Debug, Deserialize, JsonSchema)]
pub struct AskParams {
    /// The question, in plain language.
    pub question: String,
    /// A name for the conversation: later questions with the same name may build on it.
    #[serde(default)]
    pub session: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct QuestionParams {
    /// The question, in plain language.
    pub question: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SqlParams {
    /// One SQL statement.
    pub sql: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct FixParams {
    /// The SQL to repair.
    pub sql: String,
    /// What it is meant to answer, when known.
    #[serde(default)]
    pub question: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SchemaParams {
    /// Only what this question needs (the whole schema without one).
    #[serde(default)]
    pub question: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct FeedbackParams {
    /// The answer's `history_id`, as `ask` returned it.
    pub history_id: i64,
    /// Whether the answer was right.
    pub correct: bool,
    /// The query that answers the question, when the answer was wrong.
    #[serde(default)]
    pub corrected_sql: Option<String>,
}

#[derive(Clone)]
pub struct Mcp {
    db: Arc<Db>,
    caller: Caller,
    /// How long one tool call may take (`--request-timeout`).
    timeout: Duration,
    tool_router: ToolRouter<Mcp>,
}

/// Whose calls a server's are.
#[derive(Clone)]
pub enum Caller {
    /// Over HTTP: each request's token (the HTTP layer puts its role on the request).
    Token,
    /// Over stdio: one client, one role (`None`: the login role).
    Fixed(Option<String>),
}

const TABLES_URI: &str = "sqe://tables";
const SCHEMA_URI: &str = "sqe://schema";

/// The role of a request, and its client: the ones the HTTP layer put there for its token, or
/// the fixed role of the one client on standard input and output.
type Client = (Option<String>, Option<String>);

/// Over HTTP a request without its token's role is refused, never run as the login role.
fn role_of(server: &Mcp, context: &RequestContext<RoleServer>) -> Result<Client, String> {
    match &server.caller {
        Caller::Fixed(role) => Ok((role.clone(), None)),
        Caller::Token => context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Role>())
            .map(|r| (Some(r.name.clone()), Some(r.client.clone())))
            .ok_or_else(|| "no role for this request".to_string()),
    }
}

/// What a client is told of a failed call: the error's message and hint, never its detail.
fn said(error: DbError) -> String {
    legible(&said_plainly(error), false)
}

/// `said`, before its control characters are written out.
fn said_plainly(error: DbError) -> String {
    match error.for_clients() {
        DbError::Sql {
            sqlstate,
            message,
            hint,
            ..
        } => match hint {
            Some(hint) => format!("ERROR {sqlstate}: {message}\nHINT: {hint}"),
            None => format!("ERROR {sqlstate}: {message}"),
        },
        DbError::Busy => "every database connection is busy; try again".to_string(),
        DbError::RoleBusy(calls) => format!(
            "this role already has {calls} calls running, its share of the gateway; try again \
             when one has ended"
        ),
        DbError::Unavailable(cause) => format!("the database is unavailable: {cause}"),
    }
}

impl Mcp {
    pub fn new(db: Arc<Db>, caller: Caller, timeout: Duration) -> Self {
        Mcp {
            db,
            caller,
            timeout,
            tool_router: Self::tool_router(),
        }
    }

    async fn call(
        &self,
        context: &RequestContext<RoleServer>,
        call: Call,
        shape: impl FnOnce(Answer) -> Answer,
    ) -> Result<CallToolResult, McpError> {
        let (role, client) = match role_of(self, context) {
            Ok(found) => found,
            Err(e) => return Ok(CallToolResult::error(vec![ContentBlock::text(e)])),
        };
        let call = call.of_client(client.as_deref());
        match self.bounded(context, role.as_deref(), &call).await {
            Ok(answer) => Ok(CallToolResult::success(vec![ContentBlock::text(
                json_escaped(&shape(answer).json()),
            )])),
            Err(said) => Ok(CallToolResult::error(vec![ContentBlock::text(said)])),
        }
    }

    /// Runs `call` as `role`; dropping the call cancels its query, at the gateway's timeout,
    /// when the client cancels the request (`notifications/cancelled`) or its session ends,
    /// and when the connection that asked goes away (its answer could reach no one, and the
    /// token's count of requests being served no longer holds the call). The answer, or what
    /// the client is told instead.
    async fn bounded(
        &self,
        context: &RequestContext<RoleServer>,
        role: Option<&str>,
        call: &Call,
    ) -> Result<Answer, String> {
        let gone = context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<ConnectInfo<ClientGone>>())
            .map(|ConnectInfo(ClientGone(gone))| gone.clone())
            .unwrap_or_default();
        tokio::select! {
            () = gone.cancelled() => Err("the client went away; its query was cancelled".into()),
            answered = tokio::time::timeout(self.timeout, self.db.call(role, call, None)) => {
                match answered {
                    Err(_) => Err(format!(
                        "the request took longer than {} s, the gateway's limit; its query was \
                         cancelled",
                        self.timeout.as_secs()
                    )),
                    Ok(result) => result.map_err(said),
                }
            }
            _ = context.ct.cancelled() => Err("the request was cancelled".into()),
        }
    }
}

#[tool_router]
impl Mcp {
    #[tool(
        description = "Answer a question about the database in plain language: the rows, the SQL that produced them and how it went. The SQL is generated, checked and run read-only as your role.",
        annotations(
            title = "Ask the database",
            read_only_hint = true,
            open_world_hint = false
        )
    )]
    async fn ask(
        &self,
        Parameters(p): Parameters<AskParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let call = Call::Ask {
            question: p.question,
            session: p.session,
            turns: None,
        };
        self.call(&context, call, |answer| {
            let trace = &answer.value;
            Answer {
                value: json!({
                    "status": trace["status"], "sql": trace["sql"], "columns": trace["columns"],
                    "row_count": trace["row_count"], "truncated": trace["truncated"],
                    "attempts": trace["attempts"].as_array().map_or(0, Vec::len),
                    "history_id": trace["history_id"],
                }),
                rows: Some(answer.rows.unwrap_or_default()),
            }
        })
        .await
    }

    #[tool(
        description = "Write the SQL that answers a question, checked and planned but not run.",
        annotations(title = "Generate SQL", read_only_hint = true, open_world_hint = false)
    )]
    async fn generate_sql(
        &self,
        Parameters(p): Parameters<QuestionParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let call = Call::Generate {
            question: p.question,
        };
        self.call(&context, call, |sql| {
            Answer::of(json!({ "sql": sql.value }))
        })
        .await
    }

    #[tool(
        description = "Check one SQL statement with the guard (a single read-only query, allowed functions only) without running it.",
        annotations(title = "Check SQL", read_only_hint = true, open_world_hint = false)
    )]
    async fn check_sql(
        &self,
        Parameters(p): Parameters<SqlParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        self.call(&context, Call::Check { sql: p.sql }, |_| {
            Answer::of(json!({ "ok": true }))
        })
        .await
    }

    #[tool(
        description = "Run your own SQL read-only, the way generated SQL runs: through the guard, in a subtransaction that is always rolled back, with a statement timeout and a row cap. Returns the rows.",
        annotations(
            title = "Run SQL read-only",
            read_only_hint = true,
            open_world_hint = false
        )
    )]
    async fn run_sql(
        &self,
        Parameters(p): Parameters<SqlParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        self.call(&context, Call::Run { sql: p.sql }, |answer| Answer {
            value: json!({}),
            rows: Some(answer.rows.unwrap_or_default()),
        })
        .await
    }

    #[tool(
        description = "Repair SQL that fails or returns nothing: it is run read-only and, when it fails, repaired from PostgreSQL's errors. Returns the SQL that works.",
        annotations(title = "Fix SQL", read_only_hint = true, open_world_hint = false)
    )]
    async fn fix_sql(
        &self,
        Parameters(p): Parameters<FixParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let call = Call::Fix {
            sql: p.sql,
            question: p.question,
        };
        self.call(&context, call, |sql| {
            Answer::of(json!({ "sql": sql.value }))
        })
        .await
    }

    #[tool(
        description = "Say whether an answer of `ask` was right, or give the query that answers it: feedback becomes a verified example of the question (for roles that may write examples) or waits for review. The only tool that writes, and only to the extension's own feedback and example tables.",
        annotations(
            title = "Give feedback on an answer",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn give_feedback(
        &self,
        Parameters(p): Parameters<FeedbackParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let call = Call::Feedback {
            history_id: p.history_id,
            correct: p.correct,
            corrected_sql: p.corrected_sql,
        };
        self.call(&context, call, |given| given).await
    }

    #[tool(
        description = "The schema you may read, as the model sees it (only what a question needs, when given).",
        annotations(
            title = "Describe the schema",
            read_only_hint = true,
            open_world_hint = false
        )
    )]
    async fn describe_schema(
        &self,
        Parameters(p): Parameters<SchemaParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let call = Call::Schema {
            question: p.question,
        };
        self.call(&context, call, |schema| {
            Answer::of(json!({ "schema": schema.value }))
        })
        .await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Mcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new(
            "sqe-gateway",
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions(
            "Ask questions about a PostgreSQL database in plain language (ask), or work with SQL \
             (generate_sql, check_sql, run_sql, fix_sql). Everything is read-only and runs with \
             the privileges of your role.",
        )
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        Ok(ListResourcesResult::with_all_items(vec![
            Resource::new(TABLES_URI, "tables")
                .with_description("The tables and views your role can read")
                .with_mime_type("application/json"),
            Resource::new(SCHEMA_URI, "schema")
                .with_description("The schema as the model sees it")
                .with_mime_type("text/plain"),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let call = match request.uri.as_str() {
            TABLES_URI => Call::Tables,
            SCHEMA_URI => Call::Schema { question: None },
            _ => {
                return Err(McpError::resource_not_found(
                    "resource not found",
                    Some(json!({ "uri": request.uri })),
                ))
            }
        };
        let (role, _) = role_of(self, &context).map_err(|e| McpError::invalid_request(e, None))?;
        // As a tool call is.
        let answer = self
            .bounded(&context, role.as_deref(), &call)
            .await
            .map_err(|said| McpError::internal_error(said, None))?;
        let text = match &answer.value {
            Value::String(s) => legible(s, false),
            _ => json_escaped(&answer.json()),
        };
        Ok(ReadResourceResult::new(vec![ResourceContents::text(text, request.uri.clone())]).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_login_refusal_names_nothing_of_the_gateway() {
        let said = said(DbError::Sql {
            sqlstate: "28000".into(),
            message: "no pg_hba.conf entry for host \"10.0.3.7\", user \"authenticator\", \
                      database \"shop\""
                .into(),
            detail: None,
            hint: Some("pg_hba.conf".into()),
            server_side: true,
        });
        assert!(said.starts_with("ERROR 28000: "), "{said}");
        assert!(
            !said.contains("10.0.3.7") && !said.contains("authenticator"),
            "{said}"
        );
        // Nor any other refusal of the connection (here a FATAL at connect).
        let said = super::said(DbError::Sql {
            sqlstate: "3D000".into(),
            message: "database \"shop\" does not exist".into(),
            detail: None,
            hint: None,
            server_side: true,
        });
        assert!(said.starts_with("ERROR 3D000: "), "{said}");
        assert!(!said.contains("shop"), "{said}");
    }
}
