//! sqe-gateway: sql_query_engine for chat UIs (an OpenAI-compatible API) and agents (MCP).
//!
//! A thin front: it adds no NL-to-SQL logic of its own but calls the extension's functions, so
//! behaviour, guard and settings stay in the database. It logs in as an *authenticator* role
//! (no privileges of its own); each request's bearer token selects the role the request runs
//! as, in its own transaction (`SET LOCAL ROLE`).
//!
//!   sqe-gateway serve --listen ADDR --database-url URL [--read-database-url URL ...] --tokens FILE
//!   sqe-gateway mcp-stdio --database-url URL [--role ROLE]

#![cfg_attr(not(test), deny(clippy::print_stderr, clippy::print_stdout))]

/// A line of the gateway's log (stderr). A log that cannot be written (its reader gone: a
/// logger piped to that died) fails nothing: `eprintln!` would panic, and a panic in a
/// background loop (the tokens' reload, the read servers' health checks) would end that loop
/// for good. `clippy::print_stderr` keeps `eprintln!` out.
macro_rules! log_line {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

mod admission;
mod app;
mod conversation;
mod db;
mod errors;
mod housekeeping;
mod mcp;
mod openai;
mod shares;
mod shown;
mod tokens;
mod watch;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use clap::{Args, Parser, Subcommand};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServiceExt;

use crate::app::App;
use crate::db::Db;
use crate::errors::ApiError;
use crate::shown::in_log;
use crate::tokens::Tokens;

#[derive(Parser)]
#[command(
    name = "sqe-gateway",
    version,
    about = "sql_query_engine over HTTP (OpenAI-compatible and MCP) and MCP stdio"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve /v1/models, /v1/chat/completions, /v1/feedback and /mcp.
    Serve(Box<Serve>),
    /// MCP over stdio, for local clients.
    McpStdio {
        #[arg(long)]
        database_url: String,
        /// Run as this role (SET LOCAL ROLE) instead of the login role.
        #[arg(long)]
        role: Option<String>,
        /// A tool call is cancelled after this many seconds.
        #[arg(long, default_value_t = 300)]
        request_timeout: u64,
    },
}

// The options of `serve` (a doc comment here would replace the subcommand's help).
#[derive(Args)]
struct Serve {
    /// Address to listen on, e.g. 127.0.0.1:8085.
    #[arg(long)]
    listen: SocketAddr,
    /// The authenticator role's connection to the primary:
    /// postgresql://authenticator@host/db.
    #[arg(long)]
    database_url: String,
    /// A read server (a streaming standby of the primary), as the same role; repeat for
    /// several. Questions go to them round-robin while they pass their health checks.
    #[arg(long)]
    read_database_url: Vec<String>,
    /// Seconds between health checks of the read servers.
    #[arg(long, default_value_t = 2)]
    health_interval: u64,
    /// File of `TOKEN ROLE` lines; read again on SIGHUP.
    #[arg(long)]
    tokens: String,
    /// Database connections at most, per server.
    #[arg(long, default_value_t = 16)]
    pool_size: usize,
    /// Seconds a request waits for a free connection before it is answered 503 with
    /// Retry-After (and for a place among its role's calls before 429).
    #[arg(long, default_value_t = 5)]
    pool_wait: u64,
    /// Calls one role may have running at once (default: half of --pool-size, at least 1),
    /// so that one token's flood of requests leaves connections to the other roles.
    #[arg(long)]
    role_calls: Option<usize>,
    /// A request is cancelled after this many seconds.
    #[arg(long, default_value_t = 300)]
    request_timeout: u64,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    max_body: usize,
    /// Seconds a request's body may take to arrive whole once its headers have; a slower one
    /// is answered 408.
    #[arg(long, default_value_t = 30)]
    body_timeout: u64,
    /// Connections served at once; more wait to be accepted. With --max-body, this bounds the
    /// memory request bodies may hold.
    #[arg(long, default_value_t = 256)]
    max_connections: usize,
    /// MCP sessions open at once, in all and per token; a session idle for 5 minutes ends.
    #[arg(long, default_value_t = 1024)]
    max_mcp_sessions: usize,
    #[arg(long, default_value_t = 64)]
    max_mcp_sessions_per_token: usize,
    /// Requests one token may have served at once, each until its response has been sent whole
    /// (an MCP or chat event stream for as long as it is open); more are answered 429 with
    /// Retry-After. Keep it below --max-connections, which all tokens share.
    #[arg(long, default_value_t = 64)]
    max_requests_per_token: usize,
    /// Connections one token may hold open, each from its first request with that token until
    /// it closes; a request without a known token closes its connection. Keep it below
    /// --max-connections, which all tokens share.
    #[arg(long, default_value_t = 64)]
    max_connections_per_token: usize,
    /// Seconds a connection may take to send a request's headers, and stay idle between
    /// requests, before it is closed.
    #[arg(long, default_value_t = 30)]
    header_timeout: u64,
    /// Seconds a response may wait for the client to read 16 kB of it before the connection is
    /// closed: a client that never reads does not hold its answer in memory.
    #[arg(long, default_value_t = 30)]
    write_timeout: u64,
    /// Seconds a new connection has to send a request with a known token before it is closed.
    /// Connections that have not yet done so hold at most half of --max-connections (the
    /// oldest is closed when a new one comes).
    #[arg(long, default_value_t = 10)]
    login_timeout: u64,
    /// Rows shown at most in a chat answer's table.
    #[arg(long, default_value_t = 50)]
    max_table_rows: usize,
    /// The model id clients select (default: the database's name).
    #[arg(long)]
    model: Option<String>,
    /// Host names the MCP endpoint answers to (besides localhost and 127.0.0.1).
    #[arg(long)]
    allowed_host: Vec<String>,
    /// Start (with a warning) even when a token's role may create objects or owns some:
    /// its code could SET ROLE to any role the login role may become.
    #[arg(long)]
    allow_object_owners: bool,
}

/// Every route needs a known bearer token; it decides the role. Every request is written to
/// the access log (stderr): when it ended, where it came from, the role and the token's
/// fingerprint (never the token), the method and path (never the query string or the body),
/// the status and how long it took; refused ones too, so that guessing and flooding leave a
/// trace.
async fn authenticate(State(app): State<App>, mut request: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let peer = request
        .extensions()
        .get::<watch::Peer>()
        .map(|watch::Peer(peer)| peer.to_string())
        .unwrap_or_else(|| "-".into());
    let mut line = AccessLine {
        peer,
        who: "- -".to_string(),
        method: request.method().to_string(),
        path: request.uri().path().to_string(),
        started,
        status: None,
    };
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let response = match token.and_then(|t| app.tokens.role(t)) {
        Some(role) => {
            line.who = format!("{} {}", role.name.escape_debug(), role.client);
            request.extensions_mut().insert(role);
            next.run(request).await
        }
        // A request without a known token ends its connection: a proven connection is never
        // closed to make room, so a revoked token (or none) must not keep one alive.
        None => {
            let mut response = admission::closing(ApiError::unauthorized().into_response());
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            response
        }
    };
    line.status = Some(response.status().as_u16());
    response
}

/// A request's line of the access log, written when it is dropped: also for a request whose
/// handler never returned (its client gone, its task ended by a panic), with `-` for status.
struct AccessLine {
    peer: String,
    who: String,
    method: String,
    path: String,
    started: std::time::Instant,
    status: Option<u16>,
}

impl Drop for AccessLine {
    fn drop(&mut self) {
        let status = self
            .status
            .map_or_else(|| "-".to_string(), |s| s.to_string());
        // Control characters of a path are escaped: a line of the log is one request. A log
        // that cannot be written (its reader gone) fails no request.
        let _ = writeln!(
            std::io::stderr().lock(),
            "sqe-gateway: access {} {} {} {} {status} {} ms",
            self.peer,
            self.who,
            self.method,
            self.path.escape_debug(),
            self.started.elapsed().as_millis()
        );
    }
}

async fn not_found() -> ApiError {
    ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        "invalid_request_error",
        "no such endpoint: the gateway serves /v1/models, /v1/chat/completions and /mcp",
    )
}

async fn serve(options: Serve) -> anyhow::Result<()> {
    let Serve {
        listen,
        database_url,
        read_database_url,
        health_interval,
        tokens: tokens_file,
        pool_size,
        pool_wait,
        role_calls,
        request_timeout,
        max_body,
        body_timeout,
        max_connections,
        max_mcp_sessions,
        max_mcp_sessions_per_token,
        max_requests_per_token,
        max_connections_per_token,
        header_timeout,
        write_timeout,
        login_timeout,
        max_table_rows,
        model,
        allowed_host,
        allow_object_owners,
    } = options;
    let db = Arc::new(
        Db::connect(
            &database_url,
            &read_database_url,
            pool_size,
            Duration::from_secs(pool_wait),
            role_calls.unwrap_or(pool_size.div_ceil(2)),
        )
        .await?,
    );
    db.watch_readers(Duration::from_secs(health_interval.max(1)));
    let entries =
        Tokens::read(&tokens_file).map_err(|e| anyhow::anyhow!("reading the tokens: {e}"))?;
    let refused = refused_roles(&db, &entries, allow_object_owners)
        .await
        .map_err(|e| anyhow::anyhow!("refusing to start: {e}"))?;
    if !refused.is_empty() {
        anyhow::bail!("refusing to start: {}", refusal(&refused));
    }
    let tokens = Tokens::default();
    tokens.set(entries);
    let app = App {
        model: model.unwrap_or_else(|| db.database.clone()),
        db: Arc::clone(&db),
        tokens: tokens.clone(),
        timeout: Duration::from_secs(request_timeout),
        max_body,
        max_table_rows,
    };

    // The tokens file is read again on SIGHUP (see `reload`).
    let reloading = tokens.clone();
    let vetting = Arc::clone(&db);
    tokio::spawn(async move {
        let Ok(mut hangups) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        else {
            return;
        };
        while hangups.recv().await.is_some() {
            reload(&vetting, &reloading, &tokens_file, allow_object_owners).await;
        }
    });

    let mut hosts = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    hosts.extend(allowed_host);
    let config = StreamableHttpServerConfig::default().with_allowed_hosts(hosts);
    let cancel = config.cancellation_token.clone();
    let mcp_db = Arc::clone(&db);
    let mcp_timeout = Duration::from_secs(request_timeout);
    // A finished answer is not kept for a client to resume its stream (rmcp keeps it 60 s by
    // default): a token's answers, each up to the extension's result bound, would pile up in
    // memory beyond every limit the gateway sets.
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.completed_cache_ttl = Duration::ZERO;
    let sessions = Arc::new(sessions);
    let mcp = StreamableHttpService::new(
        move || {
            Ok(mcp::Mcp::new(
                Arc::clone(&mcp_db),
                mcp::Caller::Token,
                mcp_timeout,
            ))
        },
        Arc::clone(&sessions),
        config,
    );
    let admission = Arc::new(admission::Admission::new(
        Duration::from_secs(body_timeout.max(1)),
        max_body,
        sessions,
        admission::Shares {
            sessions: max_mcp_sessions,
            client_sessions: max_mcp_sessions_per_token,
            client_requests: max_requests_per_token,
            client_connections: max_connections_per_token,
        },
        Duration::from_secs(request_timeout),
    ));
    let router = Router::new()
        .route("/v1/models", get(openai::models))
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/feedback", post(openai::feedback))
        .nest_service("/mcp", mcp)
        .fallback(not_found)
        // In the order a request meets them: its token, its token's share of requests, its
        // body, its MCP session.
        .layer(middleware::from_fn_with_state(
            Arc::clone(&admission),
            admission::mcp_sessions,
        ))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&admission),
            admission::read_body,
        ))
        .layer(middleware::from_fn_with_state(
            admission,
            admission::requests,
        ))
        .layer(middleware::from_fn_with_state(app.clone(), authenticate))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(app);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    log_line!("sqe-gateway: listening on {}", listener.local_addr()?);
    watch::serve(
        listener,
        router,
        watch::Limits {
            header_timeout: Duration::from_secs(header_timeout.max(1)),
            write_timeout: Duration::from_secs(write_timeout.max(1)),
            login_timeout: Duration::from_secs(login_timeout.max(1)),
            max_connections,
        },
        async move {
            // Ctrl-C, or SIGTERM as systemd, Docker and Kubernetes stop a service.
            let terminate = async {
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(mut signal) => {
                        signal.recv().await;
                    }
                    Err(_) => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                () = terminate => {}
            }
            cancel.cancel();
        },
    )
    .await;
    Ok(())
}

/// What `Db::risky_roles` says of a token's role that does not exist.
const MISSING_ROLE: &str = "no role of that name exists";
/// What `Db::risky_roles` says of a token's role that the login role may not become (each of
/// its requests would fail).
const NOT_GRANTED_ROLE: &str = "the login role may not become it";
/// Longest wait for the check of the tokens' roles on a reload.
const VET_TIMEOUT: Duration = Duration::from_secs(10);

/// The roles of `entries` that may not have a token, each with why: a role that may run code of
/// its own in the gateway's session (see `Db::risky_roles`), unless `allow` (then it warns), and
/// a role that does not exist (a role made later would never be vetted, and a name PostgreSQL
/// reads as no role, `none`, would leave the login role in charge) or that the login role may
/// not become, whatever `allow` says.
/// `Err` when they could not be checked.
async fn refused_roles(
    db: &Db,
    entries: &[(String, String)],
    allow: bool,
) -> Result<Vec<(String, String)>, String> {
    let roles: Vec<String> = entries.iter().map(|(_, role)| role.clone()).collect();
    let risky = match db
        .risky_roles(&roles)
        .await
        .map_err(|e| format!("checking the tokens' roles failed: {e:?}"))?
    {
        Ok(risky) => risky,
        Err(reaching) => {
            let why = format!(
                "the login role of --database-url is or may become {reaching}, which reaches \
                 as far as a superuser (refused, as at start-up)"
            );
            return Ok(roles.into_iter().map(|role| (role, why.clone())).collect());
        }
    };
    let mut refused = Vec::new();
    for (role, why) in risky {
        if why == MISSING_ROLE {
            refused.push((role, format!("{why} (create it, then reload the tokens)")));
        } else if why == NOT_GRANTED_ROLE {
            refused.push((
                role,
                format!("{why} (grant it to the login role, then reload the tokens)"),
            ));
        } else if allow {
            log_line!(
                "sqe-gateway: WARNING: role {}: {}; its tokens can run code of their own in \
                 the gateway's session (allowed by --allow-object-owners)",
                in_log(&role),
                in_log(&why)
            );
        } else {
            refused.push((role, why));
        }
    }
    Ok(refused)
}

/// What the log says of `refused` roles.
fn refusal(refused: &[(String, String)]) -> String {
    let list: Vec<String> = refused
        .iter()
        // What the catalog says (object names another role chose) on one line.
        .map(|(role, why)| format!("role {}: {}", in_log(role), in_log(why)))
        .collect();
    format!(
        "a token's role can run code of its own in the gateway's session, where SET ROLE \
         reaches every role the login role may become, or does not exist: {}; give tokens roles \
         that own nothing and may create nothing (or pass --allow-object-owners)",
        list.join("; ")
    )
}

/// Reads the tokens file again and puts in force what may be: at once, the tokens already in
/// force for the same role (a token removed from the file is revoked before anything is
/// checked); then, once `refused_roles` has checked them, the file's tokens less those of the
/// roles it refuses. When the roles cannot be checked in `VET_TIMEOUT` (the database down or
/// busy), a token added waits for a reload that can check it. A file that cannot be read
/// changes nothing; one with a wrong line is not taken, but a token in force that none of its
/// well-formed lines lists (with its role, once) is revoked: an edit that removes a leaked
/// token and adds a wrong line revokes it.
async fn reload(db: &Db, tokens: &Tokens, path: &str, allow: bool) {
    let entries = match Tokens::read(path) {
        Ok(entries) => entries,
        Err(e) => {
            let revoked = match e.well_formed {
                Some(listed) => {
                    let kept = tokens.kept(&listed);
                    let before = tokens.count();
                    let after = tokens.set(kept);
                    format!(
                        "; {} token(s) it no longer lists revoked",
                        before.saturating_sub(after)
                    )
                }
                None => String::new(),
            };
            log_line!("sqe-gateway: tokens not reloaded: {}{revoked}", e.why);
            return;
        }
    };
    // A token removed from the file is revoked before anything is checked.
    tokens.set(tokens.kept(&entries));
    // Up to three times: each pooled connection the server closed since (a restart,
    // terminated backends) fails a check, and the pool then opens a new one.
    let check = async {
        let mut checked = refused_roles(db, &entries, allow).await;
        for _ in 0..2 {
            if checked.is_ok() {
                break;
            }
            checked = refused_roles(db, &entries, allow).await;
        }
        checked
    };
    let checked = tokio::time::timeout(VET_TIMEOUT, check)
        .await
        .unwrap_or_else(|_| Err("checking the tokens' roles took too long".to_string()));
    let in_force = match checked {
        Ok(refused) => {
            if !refused.is_empty() {
                log_line!(
                    "sqe-gateway: tokens left out of the reload: {}",
                    refusal(&refused)
                );
            }
            entries
                .into_iter()
                .filter(|(_, role)| !refused.iter().any(|(r, _)| r == role))
                .collect()
        }
        Err(e) => {
            log_line!(
                "sqe-gateway: {e}; tokens removed from the file are revoked, tokens added wait \
                 for the next reload"
            );
            tokens.kept(&entries)
        }
    };
    log_line!("sqe-gateway: tokens reloaded ({})", tokens.set(in_force));
}

async fn mcp_stdio(
    database_url: String,
    role: Option<String>,
    request_timeout: u64,
) -> anyhow::Result<()> {
    // One client on stdio: its calls may use the whole pool.
    let db = Arc::new(Db::connect(&database_url, &[], 4, Duration::from_secs(30), 4).await?);
    let running = mcp::Mcp::new(
        db,
        mcp::Caller::Fixed(role),
        Duration::from_secs(request_timeout),
    )
    .serve(rmcp::transport::stdio())
    .await?;
    running.waiting().await?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Serve(options) => serve(*options).await,
        Command::McpStdio {
            database_url,
            role,
            request_timeout,
        } => mcp_stdio(database_url, role, request_timeout).await,
    }
}
