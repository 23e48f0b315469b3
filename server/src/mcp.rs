//! The MCP front over Streamable HTTP: `http://<--http address>/mcp`.
//!
//! Every request must carry `Authorization: Bearer <token>` with a token of `monad-server token`
//! (the same tokens as QUIC); anything else is answered `401` before it reaches MCP. Calls go
//! straight to the [`Executor`](crate::executor::Executor), without a QUIC hop. What hosts see
//! (tools, results, progress, `tools/list_changed`) is [`monad_protocol::mcp::McpFront`], shared
//! with `monad-client mcp`; this module only provides its [`Backend`].

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
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::ServerError;
use crate::server::State;
use crate::session::Session;

/// The path of the MCP endpoint.
pub const PATH: &str = "/mcp";

/// The user a request's bearer token belongs to, put in the request's extensions by the
/// authentication layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpUser(pub String);

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

    fn session(&self, caller: &Extensions, id: Option<&str>) -> Result<Arc<Session>, ToolError> {
        let user = caller_user(caller)?;
        match id {
            Some(id) => self.state.registry.open(id, &user.0),
            // HTTP has no device to bind: the user's default session.
            None => self.state.registry.resolve(None, &user.0, None),
        }
    }
}

/// The user the authentication layer found for a request.
fn caller_user(caller: &Extensions) -> Result<&McpUser, ToolError> {
    caller
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<McpUser>())
        .ok_or_else(|| ToolError::new(ErrorCode::Unauthorized, "no authenticated user"))
}

fn listing(session: &Session) -> Vec<WorkspaceInfo> {
    session.workspaces().into_iter().map(|w| w.info).collect()
}

impl Backend for ExecutorBackend {
    async fn open(
        &self,
        caller: &Extensions,
        session: Option<&str>,
    ) -> Result<(String, Vec<WorkspaceInfo>), ToolError> {
        let session = self.session(caller, session)?;
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
        let _user_call = self.state.user_call(&user.0)?;
        let session = self.session(caller, Some(session))?;
        // Counted like a QUIC agent's call, body included: shutdown keeps the attached clients
        // the call needs until it is done.
        let _in_flight = self.state.call_in_flight();
        let sink = move |line: &str| {
            let _ = progress.send(line.to_owned());
        };
        let output = self
            .state
            .executor
            .call(&session, tool.as_str(), args, &sink)
            .await;
        Ok(output.complete().await)
    }

    async fn watch(
        &self,
        caller: &Extensions,
        session: &str,
    ) -> Result<mpsc::Receiver<Vec<WorkspaceInfo>>, ToolError> {
        let session = self.session(caller, Some(session))?;
        let mut changes = session.subscribe();
        let (tx, rx) = mpsc::channel(8);
        let _ = tx.try_send(listing(&session));
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    changed = changes.changed() => {
                        if changed.is_err() || tx.send(listing(&session)).await.is_err() {
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
/// `WWW-Authenticate: Bearer`); lets the others through with their [`McpUser`].
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
            [(header::WWW_AUTHENTICATE, "Bearer realm=\"monad\"")],
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
    match state.tokens.verify(token) {
        Ok(Some(user)) => {
            request.extensions_mut().insert(McpUser(user));
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
                "the server cannot read its tokens\n",
            )
                .into_response()
        }
    }
}

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

/// The HTTP application: the MCP endpoint at [`PATH`] behind token authentication.
/// `local` is the address it is served on: on a loopback address only loopback `Host` headers
/// are accepted (against DNS rebinding); elsewhere any host is, since every request needs a
/// token anyway. Cancelling `shutdown` ends every MCP session.
pub fn router(state: Arc<State>, local: SocketAddr, shutdown: CancellationToken) -> axum::Router {
    let mut config = StreamableHttpServerConfig::default().with_cancellation_token(shutdown);
    if !local.ip().is_loopback() {
        config = config.disable_allowed_hosts();
    }
    let backend = Arc::new(ExecutorBackend::new(state.clone()));
    let service = StreamableHttpService::new(
        move || Ok(McpFront::new(backend.clone(), None)),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    axum::Router::new()
        .route_service(PATH, service)
        .layer(middleware::from_fn(delete_answers_no_content))
        .layer(middleware::from_fn_with_state(state, authenticate))
}

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
    /// Serves the MCP endpoint on `listener` until [`Http::shutdown`].
    pub fn spawn(listener: std::net::TcpListener, state: Arc<State>) -> Result<Http, ServerError> {
        let local = listener
            .local_addr()
            .map_err(|e| ServerError::io("inspect", "the HTTP listener", e))?;
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| ServerError::io("listen (HTTP) on", local.to_string(), e))?;
        let shutdown = CancellationToken::new();
        let app = router(state, local, shutdown.clone());
        let stop = shutdown.clone();
        info!("MCP over HTTP on http://{local}{PATH}");
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await;
            if let Err(e) = served {
                warn!("HTTP endpoint stopped: {e}");
            }
        });
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
