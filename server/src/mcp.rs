//! The MCP front over Streamable HTTP: `http://<--http address>/mcp`.
//!
//! Every request must carry `Authorization: Bearer <token>` with a token of `monad-server token`
//! (the same tokens as QUIC); anything else is answered `401` before it reaches MCP, and its
//! connection is closed. Calls go straight to the [`Executor`](crate::executor::Executor),
//! without a QUIC hop. What hosts see (tools, results, progress, `tools/list_changed`) is
//! [`monad_protocol::mcp::McpFront`], shared with `monad-client mcp`; this module only provides
//! its [`Backend`].

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State as Shared};
use axum::http::{Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use monad_protocol::mcp::{Backend, McpFront, ProgressSender};
use monad_protocol::wire::{Outcome, WorkspaceInfo, WorkspaceRef};
use monad_protocol::{ErrorCode, ToolError, ToolName};
use rmcp::model::Extensions;
use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::ServerError;
use crate::admission::{
    Admissions, Admitted, Bounds, Outcome as Admission, Refusal, Source, Standing,
};
use crate::http::BodyNotRead;
use crate::quota::{PerUser, Slot};
use crate::session::Session;
use crate::state::{Lookup, NotHeld, State, WorkspaceWatch, listing};

/// The path of the MCP endpoint.
pub const PATH: &str = "/mcp";
/// The largest MCP request body read: given to rmcp as its bound, and read whole (no more) by
/// [`counted_body`] before rmcp reads it.
const MAX_BODY: usize = 4 * 1024 * 1024;

/// The user a request's bearer token belongs to, put in the request's extensions by the
/// authentication layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpUser(pub String);

/// The hash of a request's bearer token ([`crate::auth::token_hash`]), beside its [`McpUser`]:
/// a call that runs is cancelled when the token is revoked.
#[derive(Debug, Clone, PartialEq, Eq)]
struct McpToken(String);

/// The HTTP transport's backend: sessions from the registry, calls through the executor.
#[derive(Debug)]
pub struct ExecutorBackend {
    state: Arc<State>,
}

impl ExecutorBackend {
    /// A backend over the server's state.
    pub fn new(state: Arc<State>) -> ExecutorBackend {
        ExecutorBackend { state }
    }

    async fn session(
        &self,
        caller: &Extensions,
        id: Option<&str>,
    ) -> Result<Arc<Session>, ToolError> {
        let user = caller_user(caller)?;
        self.state.session(&user.0, Lookup::Open(id)).await
    }
}

/// What this server's layers put in a request's extensions ([`McpUser`], [`McpToken`],
/// [`McpMemory`]), as rmcp hands the request's parts to a handler.
fn from_request<T: Send + Sync + 'static>(caller: &Extensions) -> Option<&T> {
    caller
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<T>())
}

/// The user the authentication layer found for a request.
fn caller_user(caller: &Extensions) -> Result<&McpUser, ToolError> {
    from_request::<McpUser>(caller)
        .ok_or_else(|| ToolError::new(ErrorCode::Unauthorized, "no authenticated user"))
}

impl Backend for ExecutorBackend {
    async fn open(
        &self,
        caller: &Extensions,
        session: Option<&str>,
    ) -> Result<(String, Vec<WorkspaceInfo>), ToolError> {
        let session = self.session(caller, session).await?;
        Ok((session.id.clone(), listing(&session)))
    }

    async fn call(
        &self,
        caller: &Extensions,
        session: &str,
        tool: ToolName,
        args: Value,
        progress: ProgressSender,
    ) -> Result<(Option<WorkspaceRef>, Outcome), ToolError> {
        let user = caller_user(caller)?;
        let sink = move |line: &str| {
            let _ = progress.try_send(line.to_owned());
        };
        // The answer counts with its request until the response is sent ([`counted_body`]).
        let memory = from_request::<McpMemory>(caller).map(|memory| memory.0.clone());
        // Counted like a QUIC agent's call, body included: shutdown keeps the attached clients
        // the call needs until it is done.
        let token = from_request::<McpToken>(caller).cloned();
        let run = async {
            let (output, _call) = self
                .state
                .call(
                    (&user.0, token.as_ref().map(|t| t.0.as_str())),
                    Lookup::Open(Some(session)),
                    tool.as_str(),
                    args,
                    &sink,
                    memory.clone(),
                )
                .await?;
            let (workspace, outcome) = output.complete().await;
            // The front makes a tree of the result: counted first.
            Ok(match &memory {
                Some(memory) => (workspace, crate::state::tree_held(memory, outcome)),
                None => (workspace, outcome),
            })
        };
        // Each request's token is checked as it comes; one that runs is cut short when the
        // token is revoked meanwhile (dropping it cancels it, as a QUIC agent's reset does).
        let Some(McpToken(token)) = token.clone() else {
            return run.await;
        };
        let revoked = crate::server::until_revoked(self.state.clone(), token, user.0.clone());
        tokio::select! {
            answered = run => answered,
            () = revoked => Err(ToolError::new(
                ErrorCode::Unauthorized,
                "the token was revoked while this call ran: the call was cancelled",
            )),
        }
    }

    async fn watch(
        &self,
        caller: &Extensions,
        session: &str,
    ) -> Result<mpsc::Receiver<Vec<WorkspaceInfo>>, ToolError> {
        let session = self.session(caller, Some(session)).await?;
        let mut watch = WorkspaceWatch::new(session);
        let (tx, rx) = mpsc::channel(8);
        let _ = tx.try_send(watch.listing());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    changed = watch.changed() => {
                        if !changed || tx.send(watch.listing()).await.is_err() {
                            break;
                        }
                    }
                    () = tx.closed() => break,
                }
            }
        });
        Ok(rx)
    }
}

/// Refuses any request without a valid `Authorization: Bearer <token>` (401, with
/// `WWW-Authenticate: Bearer`) and closes its connection; lets the others through with their
/// [`McpUser`], once their connection counts for that user (429 and closed over
/// `http_max_connections_per_user`).
async fn authenticate(
    Shared(state): Shared<Arc<State>>,
    mut request: Request,
    next: Next,
) -> Response {
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
        .filter(|t| !t.is_empty());
    let refuse = |status: StatusCode, message: &'static str| {
        (
            status,
            [
                (header::WWW_AUTHENTICATE, "Bearer realm=\"monad\""),
                (header::CONNECTION, "close"),
            ],
            message,
        )
            .into_response()
    };
    let Some(token) = token else {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "missing `Authorization: Bearer <token>`; create a token with `monad-server token create`\n",
        );
    };
    // Hashed once: what the store looks up, and what a running call is checked against.
    let hash = crate::auth::token_hash(token);
    match state.tokens.verify_hash_off(hash.clone()).await {
        Ok(Some(user)) => {
            if let Some(connection) = request.extensions().get::<HttpConnection>()
                && !connection.authenticated(&user)
            {
                debug!(%user, "refused: over server.http_max_connections_per_user");
                return (
                    StatusCode::TOO_MANY_REQUESTS,
                    [(header::CONNECTION, "close")],
                    "this user has too many HTTP connections open \
                     (server.http_max_connections_per_user); close some, or try again later\n",
                )
                    .into_response();
            }
            request.extensions_mut().insert(McpUser(user));
            request.extensions_mut().insert(McpToken(hash));
            next.run(request).await
        }
        Ok(None) => refuse(
            StatusCode::UNAUTHORIZED,
            "the token is unknown or revoked; create one with `monad-server token create`\n",
        ),
        Err(e) => {
            warn!("cannot read tokens: {e}");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(header::CONNECTION, "close")],
                "the server cannot read its tokens\n",
            )
                .into_response()
        }
    }
}

/// Counts a request's connection for `user` (as `/mcp` does once a token verifies): false when
/// `user` holds their bound of HTTP connections. Requests that did not come through [`serve`]
/// (tests calling the router directly) count for nobody.
pub(crate) fn connection_counts_for(extensions: &axum::http::Extensions, user: &str) -> bool {
    extensions
        .get::<HttpConnection>()
        .is_none_or(|connection| connection.authenticated(user))
}

/// Counts a `POST`'s body in its user's call memory (`server.max_call_bytes_per_user`) before
/// rmcp makes a tree of it: its bytes, and the tree's values counted without making one (a
/// body of more than [`crate::state::MAX_REQUEST_VALUES`] values is refused with `413`, one
/// past the user's bound with `429`). What is counted is held until the response's body is
/// done with: for a tool call, until its result is sent. (A 4 MiB body of small numbers became
/// a 64 MiB tree, any number of them while they waited for a landing or a call slot.)
async fn counted_body(Shared(state): Shared<Arc<State>>, request: Request, next: Next) -> Response {
    let Some(McpUser(user)) = request.extensions().get::<McpUser>().cloned() else {
        return next.run(request).await;
    };
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let memory = Arc::new(state.call_bytes.holder(&user));
    let bytes = match crate::http::read_body_held(body, MAX_BODY, &memory).await {
        Ok(bytes) => bytes,
        Err(BodyNotRead::TooLarge) => {
            let refused =
                format!("the request body is over {MAX_BODY} bytes, or did not arrive whole\n");
            return (StatusCode::PAYLOAD_TOO_LARGE, refused).into_response();
        }
        Err(BodyNotRead::NotHeld(NotHeld::TooManyValues(e))) => {
            let refused = format!("the request body is refused: {e}\n");
            return (StatusCode::PAYLOAD_TOO_LARGE, refused).into_response();
        }
        Err(BodyNotRead::NotHeld(NotHeld::OverMemory(error))) => {
            let refused = format!("{}\n", error.message);
            return (StatusCode::TOO_MANY_REQUESTS, refused).into_response();
        }
    };
    let mut request = Request::from_parts(parts, axum::body::Body::from(bytes));
    request.extensions_mut().insert(McpMemory(memory.clone()));
    let response = next.run(request).await;
    response.map(|body| {
        axum::body::Body::new(GuardedBody {
            body,
            _guard: memory,
        })
    })
}

/// What a `POST`'s body and the call it makes hold in memory ([`counted_body`]), in the
/// request's extensions for the call to count its answer in too.
#[derive(Clone)]
struct McpMemory(Arc<crate::quota::Held>);

/// rmcp answers a session's `DELETE` with `202 Accepted`; hosts expect `200` or `204` (the
/// Python SDK logs a warning at every disconnect otherwise). The session is gone at once, so
/// `204 No Content` is the honest answer.
async fn delete_answers_no_content(request: Request, next: Next) -> Response {
    let delete = request.method() == Method::DELETE;
    let mut response = next.run(request).await;
    if delete && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::NO_CONTENT;
    }
    response
}

/// The HTTP application: the workspace service API and the web view ([`crate::http`]), and the
/// MCP endpoint at [`PATH`] behind, from the outside in, the `Origin`
/// check (403), token authentication (401) and MCP session ownership (404).
/// `local` is the address it is served on: on a loopback address only loopback `Host` headers
/// are accepted, on every path (against DNS rebinding), and the server's own loopback origins;
/// elsewhere any host is, since every request needs a token anyway. Cancelling `shutdown` ends every MCP
/// session.
pub fn router(state: Arc<State>, local: SocketAddr, shutdown: CancellationToken) -> axum::Router {
    let web = crate::http::router(state.clone(), shutdown.clone());
    let mut config = StreamableHttpServerConfig::default()
        .with_cancellation_token(shutdown)
        .with_max_request_body_bytes(MAX_BODY);
    if !local.ip().is_loopback() {
        config = config.disable_allowed_hosts();
    }
    let backend = Arc::new(ExecutorBackend::new(state.clone()));
    let manager = Arc::new(LocalSessionManager::default());
    let sessions = Arc::new(McpSessions {
        owners: std::sync::Mutex::new(HashMap::new()),
        manager: manager.clone(),
        max_per_user: state.config.quotas.max_mcp_sessions_per_user,
        state: state.clone(),
    });
    let service = StreamableHttpService::new(
        move || Ok(McpFront::new(backend.clone(), None)),
        manager,
        config,
    );
    let origins = Arc::new(allowed_origins(
        local,
        &state.config.http_limits.allowed_origins,
    ));
    let app = axum::Router::new()
        .route_service(PATH, service)
        .layer(middleware::from_fn(delete_answers_no_content))
        .layer(middleware::from_fn_with_state(state.clone(), counted_body))
        .layer(middleware::from_fn_with_state(sessions, owned_sessions))
        .layer(middleware::from_fn_with_state(state, authenticate))
        .layer(middleware::from_fn_with_state(origins, check_origin))
        .merge(web);
    if local.ip().is_loopback() {
        // The API and the web view too, not only `/mcp`: a page on another site whose name
        // was made to resolve to 127.0.0.1 reaches them under its own name.
        app.layer(middleware::from_fn(loopback_host))
    } else {
        app
    }
}

/// Refuses a request whose `Host` (or HTTP/2 authority) is not a loopback name, with 403: for a
/// server served on a loopback address, against DNS rebinding.
async fn loopback_host(request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    if host.is_some_and(is_loopback_host) {
        next.run(request).await
    } else {
        (
            StatusCode::FORBIDDEN,
            [
                (header::CONNECTION, "close"),
                (header::CONTENT_TYPE, "application/json"),
            ],
            r#"{"error":"forbidden","message":"this server answers on a loopback address only to loopback host names (localhost, 127.0.0.1, [::1])"}"#,
        )
            .into_response()
    }
}

/// Whether `host` (`name[:port]`, `[v6]:port`) names this machine's loopback interface.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The origins `/mcp` accepts: the server's own loopback origins when it is served on a
/// loopback address, and the configured ones; compared in lowercase, without a final `/`.
pub fn allowed_origins(local: SocketAddr, configured: &[String]) -> HashSet<String> {
    let mut allowed: HashSet<String> = configured
        .iter()
        .map(|o| o.trim().trim_end_matches('/').to_ascii_lowercase())
        .collect();
    if local.ip().is_loopback() {
        let port = local.port();
        for host in ["127.0.0.1", "localhost", "[::1]"] {
            allowed.insert(format!("http://{host}:{port}"));
        }
    }
    allowed
}

/// Whether a request with this `Origin` header (if any) may reach `/mcp`. No header (a program,
/// not a browser) may; a header must name an allowed origin (the MCP specification asks this
/// of servers on local addresses, against DNS rebinding).
pub fn origin_allowed(origin: Option<&[u8]>, allowed: &HashSet<String>) -> bool {
    match origin {
        None => true,
        Some(value) => std::str::from_utf8(value)
            .is_ok_and(|v| allowed.contains(&v.trim().trim_end_matches('/').to_ascii_lowercase())),
    }
}

/// Refuses a request whose `Origin` is not allowed, with 403, before anything else, and closes
/// its connection.
async fn check_origin(
    Shared(allowed): Shared<Arc<HashSet<String>>>,
    request: Request,
    next: Next,
) -> Response {
    let origin = request.headers().get(header::ORIGIN).map(|v| v.as_bytes());
    if origin_allowed(origin, &allowed) {
        next.run(request).await
    } else {
        (
            StatusCode::FORBIDDEN,
            [(header::CONNECTION, "close")],
            "this origin may not use the MCP endpoint; the operator can allow it with \
             `server.http_allowed_origins`\n",
        )
            .into_response()
    }
}

/// Which user opened each MCP session (`Mcp-Session-Id`), and when it was last used.
struct McpSessions {
    owners: std::sync::Mutex<HashMap<String, (String, std::time::Instant)>>,
    manager: Arc<LocalSessionManager>,
    max_per_user: usize,
    state: Arc<State>,
}

impl McpSessions {
    /// Records `id` as `user`'s; forgets sessions that ended or expired (rmcp's session
    /// manager drops a session when its worker ends: on `DELETE`, on shutdown, after its idle
    /// keep-alive); and ends the user's least recently used sessions beyond the bound.
    async fn adopt(&self, id: String, user: String) {
        let known: Vec<String> = {
            let mut owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
            owners.insert(id.clone(), (user.clone(), std::time::Instant::now()));
            owners.keys().cloned().collect()
        };
        let gone: Vec<String> = {
            let live = self.manager.sessions.read().await;
            known
                .into_iter()
                .filter(|k| !live.contains_key(k.as_str()))
                .collect()
        };
        let surplus: Vec<String> = {
            let mut owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
            for k in &gone {
                owners.remove(k);
            }
            let mut mine: Vec<(std::time::Instant, String)> = owners
                .iter()
                .filter(|(k, (u, _))| *u == user && **k != id)
                .map(|(k, (_, t))| (*t, k.clone()))
                .collect();
            mine.sort();
            let over = (mine.len() + 1).saturating_sub(self.max_per_user);
            let surplus: Vec<String> = mine.into_iter().take(over).map(|(_, k)| k).collect();
            for k in &surplus {
                owners.remove(k);
            }
            surplus
        };
        for k in surplus {
            debug!("ending MCP session {k} of {user}: over server.max_mcp_sessions_per_user");
            let _ = self.manager.close_session(&k.into()).await;
        }
    }

    /// Ends session `id` when `token`, which opened it, is revoked (checked with every
    /// connection's, every few seconds), or returns once the session has ended otherwise
    /// (looked at as often). A session's own stream (a `GET`) kept receiving its notifications,
    /// and kept its Monad session in use, until rmcp's idle time-out.
    async fn end_when_revoked(self: Arc<Self>, id: String, token: String, user: String) {
        let revoked = crate::server::until_revoked(self.state.clone(), token, user.clone());
        tokio::pin!(revoked);
        let mut look = tokio::time::interval(crate::server::TOKEN_RECHECK);
        look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = &mut revoked => {
                    // Its calls are cancelled at the same sweep and answered as such: their
                    // answers go out first.
                    tokio::time::sleep(REVOKED_ANSWERS_GRACE).await;
                    debug!("ending MCP session {id} of {user}: its token was revoked");
                    self.forget(&id);
                    let _ = self.manager.close_session(&id.clone().into()).await;
                    return;
                }
                _ = look.tick() => {
                    if !self.manager.sessions.read().await.contains_key(id.as_str()) {
                        return;
                    }
                }
            }
        }
    }

    /// Whether `id` is `user`'s (noting its use).
    fn is_theirs(&self, id: &str, user: &str) -> bool {
        let mut owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        match owners.get_mut(id) {
            Some((owner, used)) if owner == user => {
                *used = std::time::Instant::now();
                true
            }
            _ => false,
        }
    }

    fn forget(&self, id: &str) {
        self.owners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }
}

/// Ties each MCP session to the user who opened it: a request naming a session that is not
/// the caller's (another user's, or none at all) is answered `404` as if it did not exist, and
/// never reaches it.
async fn owned_sessions(
    Shared(sessions): Shared<Arc<McpSessions>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(user) = request.extensions().get::<McpUser>().map(|u| u.0.clone()) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let named = request
        .headers()
        .get(SESSION_HEADER)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    match named {
        Some(id) => {
            if !sessions.is_theirs(&id, &user) {
                return (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
            }
            let delete = request.method() == Method::DELETE;
            let response = next.run(request).await;
            if delete && response.status().is_success() {
                sessions.forget(&id);
            }
            response
        }
        None => {
            let token = request.extensions().get::<McpToken>().cloned();
            let response = next.run(request).await;
            if let Some(id) = response.headers().get(SESSION_HEADER)
                && let Ok(id) = id.to_str()
            {
                sessions.adopt(id.to_owned(), user.clone()).await;
                if let Some(McpToken(token)) = token {
                    tokio::spawn(sessions.end_when_revoked(id.to_owned(), token, user));
                }
            }
            response
        }
    }
}

/// How long a session whose token was revoked stays for the answers of its cancelled calls
/// (written at once) before it is closed.
const REVOKED_ANSWERS_GRACE: Duration = Duration::from_secs(1);

/// The header that names an MCP session.
const SESSION_HEADER: &str = "mcp-session-id";

/// Binds the HTTP listener (at start-up, so that a taken port is a clear error at once).
pub fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, ServerError> {
    let listener = std::net::TcpListener::bind(addr)
        .map_err(|e| ServerError::io("listen (HTTP) on", addr.to_string(), e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| ServerError::io("configure", addr.to_string(), e))?;
    Ok(listener)
}

/// The running HTTP endpoint.
#[derive(Debug)]
pub struct Http {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Http {
    /// Serves the MCP endpoint on `listener` until [`Http::shutdown`]: each connection on its
    /// own task, admitted as [`serve`] says, each cut when a request head takes longer than the
    /// header time-out, a request body longer than the body time-out, or when it sits idle (no
    /// request in progress) for the idle time-out (the header time-out, if it never
    /// authenticated). A response in progress, such as a server-sent event stream, is none of
    /// these.
    pub fn spawn(listener: std::net::TcpListener, state: Arc<State>) -> Result<Http, ServerError> {
        let local = listener
            .local_addr()
            .map_err(|e| ServerError::io("inspect", "the HTTP listener", e))?;
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| ServerError::io("listen (HTTP) on", local.to_string(), e))?;
        let shutdown = CancellationToken::new();
        let limits = state.config.http_limits.clone();
        let app = router(state, local, shutdown.clone());
        let stop = shutdown.clone();
        info!("MCP over HTTP on http://{local}{PATH}");
        let task = tokio::spawn(serve(listener, app, limits, stop));
        Ok(Http { shutdown, task })
    }

    /// Ends every MCP session, stops accepting, and waits up to `grace` for open requests.
    pub async fn shutdown(self, grace: Duration) {
        self.shutdown.cancel();
        let mut task = self.task;
        if tokio::time::timeout(grace, &mut task).await.is_err() {
            debug!(
                "HTTP requests still open after {} s; closing",
                grace.as_secs()
            );
            task.abort();
        }
    }
}

/// What an HTTP connection is doing, for its time-outs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the rest of a request head (since the first byte, or since it opened).
    Head(tokio::time::Instant),
    /// Requests in progress (until their responses are sent whole); `body`: since when a
    /// request body has been arriving, while one is.
    Busy {
        requests: usize,
        body: Option<tokio::time::Instant>,
    },
    /// Nothing in progress since then.
    Idle(tokio::time::Instant),
}

/// The deadline of a phase, if it has one. A connection that never `authenticated` is not
/// kept idle longer than a request head may take.
fn deadline(
    phase: Phase,
    limits: &crate::config::HttpLimits,
    authenticated: bool,
) -> Option<tokio::time::Instant> {
    match phase {
        Phase::Head(since) => Some(since + limits.header_timeout),
        Phase::Idle(since) if authenticated => Some(since + limits.idle_timeout),
        Phase::Idle(since) => Some(since + limits.idle_timeout.min(limits.header_timeout)),
        Phase::Busy {
            body: Some(since), ..
        } => Some(since + limits.body_timeout),
        Phase::Busy { body: None, .. } => None,
    }
}

/// Resolves when the connection has stayed in a phase past its deadline.
async fn watchdog(
    mut phase: watch::Receiver<Phase>,
    limits: crate::config::HttpLimits,
    connection: HttpConnection,
) {
    loop {
        let now = *phase.borrow_and_update();
        match deadline(now, &limits, connection.is_authenticated()) {
            None => {
                if phase.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {
                        if *phase.borrow() == now {
                            return;
                        }
                    }
                    changed = phase.changed() => {
                        if changed.is_err() {
                            return std::future::pending().await;
                        }
                    }
                }
            }
        }
    }
}

/// A connection's socket, noting the first byte of a request head that arrives while idle.
struct Tracked {
    stream: tokio::net::TcpStream,
    phase: Arc<watch::Sender<Phase>>,
}

impl tokio::io::AsyncRead for Tracked {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.phase.send_if_modified(|phase| match phase {
                Phase::Idle(_) => {
                    *phase = Phase::Head(tokio::time::Instant::now());
                    true
                }
                _ => false,
            });
        }
        polled
    }
}

impl tokio::io::AsyncWrite for Tracked {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// A request in progress: the connection is busy until its response body is sent whole (or
/// dropped), which is when this goes.
struct InProgress(Arc<watch::Sender<Phase>>);

impl InProgress {
    /// A request starts; its body is still to arrive when `body`.
    fn start(phase: &Arc<watch::Sender<Phase>>, body: bool) -> InProgress {
        let now = tokio::time::Instant::now();
        phase.send_modify(|p| {
            *p = match *p {
                Phase::Busy {
                    requests,
                    body: since,
                } => Phase::Busy {
                    requests: requests + 1,
                    body: since.or(body.then_some(now)),
                },
                _ => Phase::Busy {
                    requests: 1,
                    body: body.then_some(now),
                },
            }
        });
        InProgress(phase.clone())
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0.send_modify(|p| {
            *p = match *p {
                Phase::Busy { requests, body } if requests > 1 => Phase::Busy {
                    requests: requests - 1,
                    body,
                },
                _ => Phase::Idle(tokio::time::Instant::now()),
            }
        });
    }
}

/// A request body that ends its connection's body deadline when it has arrived whole (or is
/// dropped unread).
struct ArrivingBody {
    body: hyper::body::Incoming,
    phase: Arc<watch::Sender<Phase>>,
    arrived: bool,
}

impl ArrivingBody {
    fn arrived(&mut self) {
        if !self.arrived {
            self.arrived = true;
            self.phase.send_if_modified(|p| match p {
                Phase::Busy { body, .. } if body.is_some() => {
                    *body = None;
                    true
                }
                _ => false,
            });
        }
    }
}

impl http_body::Body for ArrivingBody {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.body).poll_frame(cx);
        match &polled {
            std::task::Poll::Ready(None | Some(Err(_))) => this.arrived(),
            std::task::Poll::Ready(Some(Ok(_))) if this.body.is_end_stream() => this.arrived(),
            std::task::Poll::Ready(Some(Ok(_))) | std::task::Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for ArrivingBody {
    fn drop(&mut self) {
        self.arrived();
    }
}

/// One HTTP connection as its requests see it (in their extensions): its place among the open
/// connections, and the user it authenticated as, whose connection bound it counts against.
#[derive(Debug, Clone)]
pub(crate) struct HttpConnection(Arc<ConnectionState>);

#[derive(Debug)]
struct ConnectionState {
    place: Admitted,
    per_user: Arc<PerUser>,
    user: std::sync::Mutex<Option<(String, Slot)>>,
}

impl HttpConnection {
    /// A request on it authenticated as `user`: the connection counts for `user` (and is no
    /// longer one that never authenticated), unless `user` holds their bound of connections.
    fn authenticated(&self, user: &str) -> bool {
        let mut held = self.0.user.lock().unwrap_or_else(|p| p.into_inner());
        if held.as_ref().is_some_and(|(u, _)| u == user) {
            return true;
        }
        let Some(slot) = self.0.per_user.try_acquire(user) else {
            return false;
        };
        *held = Some((user.to_owned(), slot));
        self.0.place.promote(Standing::Verified);
        true
    }

    /// Whether a request on it ever authenticated.
    fn is_authenticated(&self) -> bool {
        self.0
            .user
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// The user its latest authenticated request was of: an HTTP/1 connection's requests come
    /// one at a time, so once a request was answered, the user it authenticated as.
    pub(crate) fn user(&self) -> Option<String> {
        let held = self.0.user.lock().unwrap_or_else(|p| p.into_inner());
        held.as_ref().map(|(user, _)| user.clone())
    }
}

/// A response body that keeps `_guard` until it is done with: its request [`InProgress`], or
/// what it counts in its user's memory ([`counted_body`]: an MCP answer's event stream stays
/// open after the answer, so the count lasts until the host has read it or gone).
struct GuardedBody<G> {
    body: axum::body::Body,
    _guard: G,
}

impl<G: Unpin> http_body::Body for GuardedBody<G> {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// What a connection that is not admitted is told before it is closed.
fn unavailable(message: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{message}",
        message.len()
    )
    .into_bytes()
}

/// Accepts connections until `stop`, then lets each finish its requests (gracefully) and
/// returns when all have ended. Open connections are bounded over all peers
/// (`http_max_connections`) and per address (`http_max_connections_per_address`, one more is
/// answered `503`); when all are taken, a newcomer takes the place of the oldest connection
/// that never authenticated, and is answered `503` only when every one did.
async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    limits: crate::config::HttpLimits,
    stop: CancellationToken,
) {
    let admissions = Admissions::new(Bounds {
        total: limits.max_connections,
        per_source: limits.max_connections_per_address,
    });
    let per_user = PerUser::new(limits.max_connections_per_user);
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            () = stop.cancelled() => break,
        };
        let (stream, remote) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, say: the listener stays; try again shortly.
                debug!("HTTP accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let place = match admissions.admit(Source::of(remote.ip()), Standing::Unverified) {
            Admission::Admitted(place) => place,
            Admission::Refused(Refusal::SourceFull) => {
                debug!(%remote, "refused: over server.http_max_connections_per_address");
                let _ = stream.try_write(&unavailable(
                    "too many HTTP connections from this address \
                     (server.http_max_connections_per_address); close some, or try again later\n",
                ));
                continue;
            }
            // `admit` never asks for a Retry (that is QUIC's); were it to, refuse.
            Admission::Refused(Refusal::Full) | Admission::Retry => {
                debug!(%remote, "refused: over server.http_max_connections");
                let _ = stream.try_write(&unavailable(
                    "the server has too many HTTP connections open; try again\n",
                ));
                continue;
            }
        };
        // Answers go out as they are written: with Nagle's algorithm on, a response written in
        // two pieces (a streamed MCP answer's head, then its event) waits for the client's
        // delayed ACK, 40 ms per call (`cargo bench -p monad-tests --bench mcp`, path 3).
        if let Err(e) = stream.set_nodelay(true) {
            debug!(%remote, "cannot set TCP_NODELAY: {e}");
        }
        let connection = HttpConnection(Arc::new(ConnectionState {
            place,
            per_user: per_user.clone(),
            user: std::sync::Mutex::new(None),
        }));
        let (app, limits, stop) = (app.clone(), limits.clone(), stop.clone());
        connections.spawn(serve_connection(stream, app, limits, stop, connection));
    }
    while connections.join_next().await.is_some() {}
}

/// Serves one connection with its time-outs, until it ends or is evicted to make room.
async fn serve_connection(
    stream: tokio::net::TcpStream,
    app: axum::Router,
    limits: crate::config::HttpLimits,
    stop: CancellationToken,
    peer: HttpConnection,
) {
    let phase = Arc::new(watch::channel(Phase::Head(tokio::time::Instant::now())).0);
    let dog = watchdog(phase.subscribe(), limits, peer.clone());
    let this = peer.clone();
    let io = hyper_util::rt::TokioIo::new(Tracked {
        stream,
        phase: phase.clone(),
    });
    let inner = hyper_util::service::TowerToHyperService::new(app);
    let service =
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let pending = !http_body::Body::is_end_stream(request.body());
            let in_progress = InProgress::start(&phase, pending);
            let mut request = request.map(|body| {
                axum::body::Body::new(ArrivingBody {
                    body,
                    phase: phase.clone(),
                    arrived: !pending,
                })
            });
            request.extensions_mut().insert(this.clone());
            let answer = hyper::service::Service::call(&inner, request);
            async move {
                let response = answer.await?;
                Ok::<_, std::convert::Infallible>(response.map(|body| GuardedBody {
                    body,
                    _guard: in_progress,
                }))
            }
        });
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The time-outs are the watchdog's, which knows a response in progress from an idle wait.
    builder.timer(hyper_util::rt::TokioTimer::new());
    builder.header_read_timeout(None);
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    tokio::pin!(dog);
    let mut stopping = false;
    loop {
        tokio::select! {
            served = connection.as_mut() => {
                if let Err(e) = served {
                    debug!("HTTP connection: {e}");
                }
                return;
            }
            () = &mut dog => {
                debug!("HTTP connection closed: header, body or idle time-out");
                return;
            }
            () = peer.0.place.evicted() => {
                debug!("HTTP connection closed: it never authenticated, and room was made for a newer one");
                return;
            }
            () = stop.cancelled(), if !stopping => {
                stopping = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}
