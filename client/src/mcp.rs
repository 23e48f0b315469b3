//! `monad-client mcp`: an MCP server on stdio for AI hosts that launch a command, bridged to the
//! Monad server over QUIC as an agent.
//!
//! What hosts see is [`monad_protocol::mcp::McpFront`], shared with the server's HTTP endpoint;
//! this module provides its [`Backend`] over an [`Agent`]: calls and listings go to the server,
//! workspace changes come from a watch (re-established after a reconnect), and a host's
//! cancellation drops the call, which resets its QUIC stream and cancels it on every hop. A host
//! with roots is landed by the server ([`Agent::land`]): in the session of the folder its roots
//! are in, when this device attached it.

use std::sync::Arc;
use std::time::Duration;

use monad_protocol::mcp::{Backend, Landing, McpFront, ProgressSender};
use monad_protocol::wire::{Outcome, WorkspaceInfo, WorkspaceRef};
use monad_protocol::{ErrorCode, ToolError, ToolName};
use rmcp::ServiceExt;
use rmcp::model::{
    ClientJsonRpcMessage, ClientRequest, Extensions, JsonRpcMessage, ProtocolVersion,
    ServerJsonRpcMessage,
};
use rmcp::service::RoleServer;
use rmcp::transport::{IntoTransport, Transport};
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::ClientError;
use crate::agent::Agent;
use crate::config::ClientConfig;
use crate::interrupts::Signal;

/// A host's `file://` root with its path canonicalised on this device (symlinks resolved, as
/// `attach` resolves the folder it sends), so that a root reached through a symlink matches the
/// attached folder. A root the server would refuse ([`monad_protocol::roots::parse_root`]), and
/// a path that cannot be resolved (it does not exist), is sent as given; the server parses and
/// checks it either way.
fn canonical_root(uri: &str) -> String {
    let resolved = monad_protocol::roots::parse_root(uri)
        .ok()
        .and_then(|path| std::fs::canonicalize(path).ok());
    match resolved.map(|path| file_uri(&path)) {
        // Percent-encoding, or a longer target, may take it over what the server reads.
        Some(canonical) if canonical.len() <= monad_protocol::wire::MAX_ROOT_LEN => canonical,
        _ => uri.to_owned(),
    }
}

/// A `file://` URI of an absolute path, percent-encoded but for unreserved characters and `/`.
fn file_uri(path: &std::path::Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut uri = String::from("file://");
    for &byte in path.as_os_str().as_bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'/' | b'-' | b'_' | b'.' | b'~') {
            uri.push(byte as char);
        } else {
            uri.push_str(&format!("%{byte:02X}"));
        }
    }
    uri
}

/// Longest wait between attempts to re-establish a lost watch.
const MAX_RETRY: Duration = Duration::from_secs(10);

/// The stdio bridge's backend: one agent connection to the server, re-made when it drops.
#[derive(Debug)]
pub struct AgentBackend {
    config: ClientConfig,
    /// The connection, shared by the calls and the watch: made again by whichever needs it
    /// first, and used by both after. A watch that made its own held the host's focus on a
    /// connection the calls did not use, and the host's next landing (its roots changed) was
    /// held back by that hold as if another host's.
    agent: Arc<tokio::sync::Mutex<Option<Agent>>>,
    /// The host's last landing. A connection made again after one dropped lands there again,
    /// so that the server knows this host still works on its folder (the hold on the focus
    /// goes with the connection that landed): the watch's at once ([`Backend::watch`]), the
    /// calls' at their next call.
    landed: Arc<std::sync::Mutex<Option<Landed>>>,
}

/// Where the host landed: its roots as sent, the session and its focus then.
#[derive(Debug, Clone)]
struct Landed {
    roots: Vec<String>,
    session: String,
    focus: Option<String>,
}

/// Puts back the landing a new one took out ([`Landed`]) unless that one ended landed: when it
/// failed, or was dropped unfinished (the front gives a landing up after a bounded time).
struct RestoreLanded<'a> {
    landed: &'a std::sync::Mutex<Option<Landed>>,
    earlier: Option<Option<Landed>>,
}

impl Drop for RestoreLanded<'_> {
    fn drop(&mut self) {
        if let Some(earlier) = self.earlier.take() {
            *self.landed.lock().unwrap_or_else(|p| p.into_inner()) = earlier;
        }
    }
}

/// Lands `agent` again where the host landed (`landed`), in the same session: the hold on the
/// focus came with the connection that landed, and went with it. When the focus has moved
/// meanwhile (another host landed on another folder while this one had no connection), the
/// host's calls that name no workspace go elsewhere: said on standard error, the host's log.
async fn land_again(agent: &Agent, landed: &std::sync::Mutex<Option<Landed>>) {
    let Some(before) = landed.lock().unwrap_or_else(|p| p.into_inner()).clone() else {
        return;
    };
    let shown = |focus: &Option<String>| {
        focus.as_deref().map_or("none".into(), |f| {
            format!("`{}`", monad_protocol::text::printable(f))
        })
    };
    match agent
        .land(before.roots.clone(), Some(&before.session))
        .await
    {
        Ok(Some(now)) => {
            if now.focus != before.focus {
                warn!(
                    "after a reconnect, session {}'s focus is {} (it was {}): calls that name \
                     no workspace try it first; name `workspace` to work in the host's folder",
                    monad_protocol::text::printable(&now.session),
                    shown(&now.focus),
                    shown(&before.focus),
                );
            }
            note_landing(landed, &before, &now);
        }
        Ok(None) => {}
        Err(e) => debug!("landing again after a reconnect: {e}"),
    }
}

/// Keeps where a landing again (from `before`) put the host, so that the next reconnect
/// compares with it (a moved focus is said once, not at every reconnect after), unless the
/// host's roots changed meanwhile (`land` keeps the new landing then).
fn note_landing(
    landed: &std::sync::Mutex<Option<Landed>>,
    before: &Landed,
    now: &crate::agent::Landing,
) {
    let mut landed = landed.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(kept) = landed.as_mut().filter(|kept| kept.roots == before.roots) {
        kept.session.clone_from(&now.session);
        kept.focus.clone_from(&now.focus);
    }
}

/// The live agent in `slot`, connecting (again) with `config` if there is none or its
/// connection closed; a connection made again lands again where the host landed (`landed`).
async fn live_agent(
    config: &ClientConfig,
    slot: &tokio::sync::Mutex<Option<Agent>>,
    landed: &std::sync::Mutex<Option<Landed>>,
) -> Result<Agent, ToolError> {
    let mut agent = slot.lock().await;
    if let Some(live) = agent.as_ref().filter(|a| a.quic().close_reason().is_none()) {
        return Ok(live.clone());
    }
    let fresh = Agent::connect(config)
        .await
        .map_err(|e| to_tool_error(config, e))?;
    info!(server = %fresh.server(), "connected to the Monad server");
    land_again(&fresh, landed).await;
    *agent = Some(fresh.clone());
    Ok(fresh)
}

impl AgentBackend {
    /// A backend that connects with `config` when first needed.
    pub fn new(config: ClientConfig) -> AgentBackend {
        AgentBackend {
            config,
            agent: Arc::new(tokio::sync::Mutex::new(None)),
            landed: Arc::new(std::sync::Mutex::new(None)),
        }
    }

    /// The live agent, connecting (again) if there is none or its connection closed.
    async fn agent(&self) -> Result<Agent, ToolError> {
        live_agent(&self.config, &self.agent, &self.landed).await
    }

    /// Closes the connection to the server, if there is one (see [`crate::interrupts`]).
    pub async fn close(&self, reason: &str) {
        crate::agent::close_held(&self.agent, reason).await;
    }
}

/// A client failure outside any tool, as a sentence for a model and its user.
fn to_tool_error(config: &ClientConfig, error: ClientError) -> ToolError {
    match error {
        ClientError::Refused(error) => error,
        ClientError::Unreachable(why) => ToolError::new(
            ErrorCode::Io,
            format!(
                "cannot reach the Monad server at {}: {why}",
                config.shown_servers()
            ),
        ),
        other => ToolError::new(ErrorCode::Internal, other.to_string()),
    }
}

impl Backend for AgentBackend {
    async fn open(
        &self,
        _caller: &Extensions,
        session: Option<&str>,
    ) -> Result<(String, Vec<WorkspaceInfo>), ToolError> {
        self.agent()
            .await?
            .workspaces(session)
            .await
            .map_err(|e| to_tool_error(&self.config, e))
    }

    async fn call(
        &self,
        _caller: &Extensions,
        session: &str,
        tool: ToolName,
        mut args: Value,
        progress: ProgressSender,
    ) -> Result<(Option<WorkspaceRef>, Outcome), ToolError> {
        let agent = self.agent().await?;
        // A host that listed the tools before a reconnect to an older server may still name
        // what that server refuses as unknown: left out where it asks for nothing, else refused
        // saying why.
        if tool == ToolName::Search
            && agent.minor() < monad_protocol::wire::SEARCH_CONTEXT_MINOR
            && let Err(key) = monad_protocol::tools::SearchArgs::for_older_client(&mut args)
        {
            return Err(ToolError::new(
                ErrorCode::InvalidArguments,
                format!(
                    "search: the server is older than this client (protocol minor {}) and does \
                     not take `{key}`; search without it, or ask its operator to upgrade it",
                    agent.minor()
                ),
            ));
        }
        let reply = agent
            .call(Some(session), tool.as_str(), args, |line| {
                let _ = progress.try_send(line.to_owned());
            })
            .await
            .map_err(|e| to_tool_error(&self.config, e))?;
        Ok((reply.workspace, reply.outcome))
    }

    async fn server_minor(&self) -> u32 {
        match self.agent().await {
            Ok(agent) => agent.minor(),
            // Not reachable now: the tools as this version has them (a call says why it fails).
            Err(_) => monad_protocol::wire::PROTOCOL_MINOR,
        }
    }

    fn lands_by_roots(&self) -> bool {
        true
    }

    async fn land(
        &self,
        _caller: &Extensions,
        roots: Vec<String>,
        session: Option<&str>,
    ) -> Result<Option<Landing>, ToolError> {
        // Landing anew: a connection made for it does not land on the old roots first. A
        // landing that fails, or is given up (the front waits for it a bounded time), leaves
        // the host where it was, and so what to land on again.
        let earlier = self.landed.lock().unwrap_or_else(|p| p.into_inner()).take();
        let mut restore = RestoreLanded {
            landed: &self.landed,
            earlier: Some(earlier),
        };
        let agent = self.agent().await?;
        // As the folders were attached: resolved on this device, symlinks and all.
        let roots: Vec<String> = tokio::task::spawn_blocking(move || {
            roots.into_iter().map(|r| canonical_root(&r)).collect()
        })
        .await
        .map_err(|e| ToolError::new(ErrorCode::Internal, e.to_string()))?;
        let landed = agent
            .land(roots.clone(), session)
            .await
            .map_err(|e| to_tool_error(&self.config, e))?;
        restore.earlier = None;
        *self.landed.lock().unwrap_or_else(|p| p.into_inner()) = landed.as_ref().map(|l| Landed {
            roots: roots.clone(),
            session: l.session.clone(),
            focus: l.focus.clone(),
        });
        if landed.is_none() {
            warn!(
                "the Monad server is too old to land by the host's roots; working in the \
                 default session"
            );
        }
        Ok(landed.map(|l| Landing {
            session: l.session,
            folder: l.folder,
            focus: l.focus,
            focus_offline: l.focus_offline,
            folder_focus: l.folder_focus,
            roots,
        }))
    }

    async fn watch(
        &self,
        _caller: &Extensions,
        session: &str,
    ) -> Result<mpsc::Receiver<Vec<WorkspaceInfo>>, ToolError> {
        let agent = self.agent().await?;
        let mut updates = agent
            .watch(Some(session))
            .await
            .map_err(|e| to_tool_error(&self.config, e))?;
        let (tx, rx) = mpsc::channel(8);
        let config = self.config.clone();
        let session = session.to_owned();
        let (slot, landed) = (self.agent.clone(), self.landed.clone());
        tokio::spawn(async move {
            let mut retry = Duration::from_millis(200);
            loop {
                loop {
                    tokio::select! {
                        update = updates.recv() => match update {
                            Some((_, list)) => if tx.send(list).await.is_err() { return },
                            None => break,
                        },
                        () = tx.closed() => return,
                    }
                }
                // The watch ended: the connection dropped. Watch again on a new one; its first
                // list reaches the host as a change (folders may have come and gone meanwhile).
                loop {
                    debug!("workspace watch lost; retrying in {} ms", retry.as_millis());
                    tokio::select! {
                        () = tokio::time::sleep(retry) => {}
                        () = tx.closed() => return,
                    }
                    retry = (retry * 2).min(MAX_RETRY);
                    // At once, not at the host's next call (the connection made again lands
                    // again): until then, another host could take the focus this one works on.
                    let renewed = match live_agent(&config, &slot, &landed).await {
                        Ok(agent) => agent.watch(Some(&session)).await.ok(),
                        Err(_) => None,
                    };
                    if let Some(renewed) = renewed {
                        updates = renewed;
                        retry = Duration::from_millis(200);
                        break;
                    }
                }
            }
        });
        Ok(rx)
    }
}

/// Serves MCP on `transport` (stdio for `monad-client mcp`) until the host closes it, or
/// `interrupted` ends first (a signal, which this returns). `session`
/// is the session used when the host's `initialize` names none in `_meta.sessionId` (`None`: the
/// server's default for this device). Either way the connection to the server is closed before
/// this returns, so that the server cancels at once what is still running (see
/// [`crate::interrupts`]); after the host closed its input, the answers to calls already made
/// are still written for up to 5 s first (rmcp's drain), as a host that closes its input and
/// then reads may expect.
pub async fn serve<T, E, A>(
    config: ClientConfig,
    session: Option<String>,
    transport: T,
    interrupted: impl std::future::Future<Output = Signal>,
) -> Result<Option<Signal>, ClientError>
where
    T: IntoTransport<RoleServer, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let backend = Arc::new(AgentBackend::new(config));
    let front = McpFront::new(backend.clone(), session);
    let versions = rmcp::ServerHandler::supported_protocol_versions(&front).into_owned();
    let transport = InOrder::new(transport.into_transport(), versions);
    let served = async {
        let running = front
            .serve(transport)
            .await
            .map_err(|e| ClientError::Protocol(format!("MCP initialization failed: {e}")))?;
        running
            .waiting()
            .await
            .map_err(|e| ClientError::Protocol(format!("the MCP service stopped: {e}")))
    };
    let ended = tokio::select! {
        served = served => served.map(|_| None),
        signal = interrupted => Ok(Some(signal)),
    };
    backend
        .close(&crate::interrupts::ending(&ended, "the MCP host"))
        .await;
    ended
}

/// A host's messages in the order rmcp can serve them. Before a host's lifecycle starts (its
/// `initialize`, or a request carrying a newer protocol's metadata inline), rmcp answers a ping
/// and refuses other requests, but stops the service at anything else: a notification (a host
/// that sends `notifications/initialized` or a cancellation too early) or a response, and the
/// bridge exited with its host none the wiser. Those are dropped here, said on standard error
/// (the host's log). Should the two disagree on when the session starts, what rmcp would serve
/// could be dropped: rmcp is pinned to the version this mirrors (the workspace's `Cargo.toml`).
struct InOrder<T> {
    inner: T,
    /// The protocol versions the front serves (a request of another version is refused).
    versions: Vec<ProtocolVersion>,
    started: bool,
}

impl<T> InOrder<T> {
    fn new(inner: T, versions: Vec<ProtocolVersion>) -> Self {
        InOrder {
            inner,
            versions,
            started: false,
        }
    }

    /// Whether rmcp starts the host's lifecycle on `request` (as `serve_server` decides): an
    /// `initialize`, or a request with a served protocol's metadata complete inline.
    fn starts_lifecycle(&self, request: &ClientRequest) -> bool {
        use rmcp::model::GetMeta;
        match request {
            ClientRequest::InitializeRequest(_) => true,
            ClientRequest::PingRequest(_) | ClientRequest::DiscoverRequest(_) => false,
            request => {
                let meta = request.get_meta();
                meta.missing_required_keys(&ProtocolVersion::V_2026_07_28)
                    .is_empty()
                    && meta
                        .protocol_version()
                        .is_some_and(|v| self.versions.contains(&v))
            }
        }
    }
}

impl<T: Transport<RoleServer>> Transport<RoleServer> for InOrder<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        loop {
            let message = self.inner.receive().await?;
            match &message {
                JsonRpcMessage::Request(r) => {
                    self.started = self.started || self.starts_lifecycle(&r.request);
                }
                _ if self.started => {}
                JsonRpcMessage::Notification(n) => {
                    let method = serde_json::to_value(&n.notification)
                        .ok()
                        .and_then(|v| v.get("method").and_then(Value::as_str).map(str::to_owned));
                    warn!(
                        ?method,
                        "the host sent a notification before `initialize`; ignored"
                    );
                    continue;
                }
                _ => {
                    warn!("the host sent a response before `initialize`; ignored");
                    continue;
                }
            }
            return Some(message);
        }
    }

    fn close(&mut self) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

/// `monad-client mcp`: MCP over this process's stdin and stdout. When both are pipes (as hosts
/// launch a server), they are read and written on the runtime's reactor, each on its own open
/// file description, rather than through the blocking pool, a thread hand-off per message each
/// way; otherwise (a terminal, a file) through the blocking pool. The answers' pipe grows when
/// an answer does not fit ([`GrowingPipe`]).
/// `interrupted` ends it as in [`serve`] (`monad-client mcp`: SIGINT, SIGTERM and SIGHUP, see
/// [`crate::interrupts`]).
pub async fn serve_stdio(
    config: ClientConfig,
    session: Option<String>,
    interrupted: impl std::future::Future<Output = Signal>,
) -> Result<Option<Signal>, ClientError> {
    let (read, write) = rmcp::transport::stdio_pipes();
    let transport = rmcp::transport::async_rw::AsyncRwTransport::new(read, GrowingPipe::new(write))
        .with_max_line_length(MAX_REQUEST_LINE);
    serve(config, session, transport, interrupted).await
}

/// The longest request line taken from a host; a longer one is dropped, and said so on standard
/// error (the host's log), with no answer: a line cut short has no id to answer. rmcp's default
/// of 16 MiB was shorter than the `write_file` of 16 MiB that a workspace takes by default
/// (`write_max_bytes`) once its content is JSON-escaped, and the host waited for an answer
/// forever. Four times that and one more MiB holds such a write of ordinary text (its line
/// breaks and quotes escaped in two bytes each), or of text half made of control characters
/// (six bytes each). The buffer grows only as long lines come, and keeps its size afterwards (one
/// such line, one such buffer, for the bridge's life).
pub const MAX_REQUEST_LINE: usize = 65 * 1024 * 1024;

/// The capacity [`GrowingPipe`] asks for: Linux's default `/proc/sys/fs/pipe-max-size`, the
/// most an unprivileged process may ask for there. It holds the answer to a read at the default
/// cap of 256 KiB of ordinary text (a 248 KiB read's is a 541 KB line of JSON).
pub const PIPE_BYTES: usize = 1 << 20;

/// A pipe's capacity on Linux until someone changes it.
const DEFAULT_PIPE_BYTES: usize = 64 * 1024;

/// The answers' writer, which grows the pipe standard output is (when it is one) the first time
/// an answer does not fit in a default pipe ([`grow_pipe`]). With the default 64 KiB, a larger
/// answer went into the host's pipe a piece at a time: this process woke each time the host had
/// read one, on the core where the host was reading, and the host blocked mid-answer waiting for
/// the next. A 248 KiB read through the official Python SDK, twelve alternating pairs: faster in
/// ten (by 3–22%), the host no longer blocked mid-answer and was preempted 0.3–0.6 times per
/// call instead of 0.9–4.1 (`docs/benchmarks.md`, the Python SDK cases' thirteenth round).
/// Grown only when needed: Linux counts a pipe's capacity against its user's allowance of pipe
/// pages (`/proc/sys/fs/pipe-user-pages-soft`) as soon as it is set, and past it the user's new
/// pipes get two pages.
struct GrowingPipe<W> {
    inner: W,
    /// Whether growing was tried (it is tried once, whatever came of it).
    tried: bool,
}

impl<W> GrowingPipe<W> {
    fn new(inner: W) -> GrowingPipe<W> {
        GrowingPipe {
            inner,
            tried: false,
        }
    }

    /// Grows standard output's pipe, once, when `len` bytes are about to be written.
    fn fit(&mut self, len: usize) {
        if self.tried || len <= DEFAULT_PIPE_BYTES {
            return;
        }
        self.tried = true;
        match grow_pipe(std::io::stdout(), len, PIPE_BYTES) {
            Ok(bytes) => debug!(bytes, "standard output's pipe grown for a large answer"),
            // Not a pipe (a terminal, a file), or over what the system lets this user ask for.
            Err(e) => debug!("standard output keeps its buffer: {e}"),
        }
    }
}

impl<W: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for GrowingPipe<W> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.fit(buf.len());
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.fit(bufs.iter().map(|b| b.len()).sum());
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Makes the pipe `fd` hold `to` bytes (a power of two) when it holds less than `len` and less
/// than `to`; returns its capacity then. It never shrinks a pipe. The kernel takes pages as the
/// pipe fills.
#[cfg(target_os = "linux")]
fn grow_pipe(fd: impl std::os::fd::AsFd, len: usize, to: usize) -> nix::Result<usize> {
    use nix::fcntl::{FcntlArg, fcntl};
    let now = usize::try_from(fcntl(&fd, FcntlArg::F_GETPIPE_SZ)?).unwrap_or(0);
    if now >= len.min(to) {
        return Ok(now);
    }
    let to = i32::try_from(to).map_err(|_| nix::errno::Errno::EINVAL)?;
    let grown = fcntl(&fd, FcntlArg::F_SETPIPE_SZ(to))?;
    Ok(usize::try_from(grown).unwrap_or(0))
}

/// Pipes cannot be resized here: they keep the system's size.
#[cfg(not(target_os = "linux"))]
fn grow_pipe(
    _fd: impl std::os::fd::AsFd,
    _len: usize,
    _to: usize,
) -> Result<usize, std::io::Error> {
    Err(std::io::ErrorKind::Unsupported.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A landing again keeps where the host now is, so that a moved focus is said at the
    /// reconnect that finds it, not at every one after; a landing of other roots meanwhile is
    /// left as it is.
    #[test]
    fn a_landing_again_is_kept_for_the_next_reconnect_unless_the_roots_changed() {
        let before = Landed {
            roots: vec!["file:///p".into()],
            session: "s1".into(),
            focus: Some("p".into()),
        };
        let now = crate::agent::Landing {
            session: "s1".into(),
            folder: None,
            focus: Some("q".into()),
            focus_offline: false,
            folder_focus: None,
        };
        let landed = std::sync::Mutex::new(Some(before.clone()));
        note_landing(&landed, &before, &now);
        let kept = landed.lock().unwrap().clone().unwrap();
        assert_eq!(
            (kept.session.as_str(), kept.focus.as_deref()),
            ("s1", Some("q"))
        );
        let other = Landed {
            roots: vec!["file:///r".into()],
            session: "s2".into(),
            focus: Some("r".into()),
        };
        let landed = std::sync::Mutex::new(Some(other));
        note_landing(&landed, &before, &now);
        let kept = landed.lock().unwrap().clone().unwrap();
        assert_eq!(
            (kept.session.as_str(), kept.focus.as_deref()),
            ("s2", Some("r"))
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_pipe_grows_to_hold_a_large_answer_never_shrinks_and_anything_else_is_left_alone() {
        use nix::fcntl::{FcntlArg, fcntl};
        let capacity = |fd: &std::os::fd::OwnedFd| {
            usize::try_from(fcntl(fd, FcntlArg::F_GETPIPE_SZ).unwrap()).unwrap()
        };
        let (read, write) = nix::unistd::pipe().unwrap();
        // The smallest a pipe can be: one page (on any page size, under PIPE_BYTES).
        fcntl(&write, FcntlArg::F_SETPIPE_SZ(1)).unwrap();
        let small = capacity(&write);
        assert!(small < PIPE_BYTES, "{small}");
        // What fits leaves it as it is.
        assert_eq!(grow_pipe(&write, small, PIPE_BYTES).unwrap(), small);
        assert_eq!(capacity(&write), small);
        assert_eq!(
            grow_pipe(&write, small + 1, PIPE_BYTES).unwrap(),
            PIPE_BYTES
        );
        // One pipe: its reading end sees the same capacity.
        assert_eq!(capacity(&read), PIPE_BYTES);
        // An answer larger than the target does not take more.
        assert_eq!(
            grow_pipe(&write, 4 * PIPE_BYTES, PIPE_BYTES).unwrap(),
            PIPE_BYTES
        );
        // A pipe larger than the target stays so.
        assert_eq!(
            grow_pipe(&write, 4 * PIPE_BYTES, PIPE_BYTES / 4).unwrap(),
            PIPE_BYTES
        );
        assert_eq!(capacity(&read), PIPE_BYTES);
        let file = tempfile::tempfile().unwrap();
        assert!(grow_pipe(&file, 4 * PIPE_BYTES, PIPE_BYTES).is_err());
    }

    #[test]
    fn a_root_through_a_symlink_is_sent_as_the_folder_it_names() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("my proj");
        std::fs::create_dir_all(real.join("src")).unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("link")).unwrap();
        let real = real.canonicalize().unwrap();
        let link = file_uri(&dir.path().join("link"));
        assert_eq!(canonical_root(&link), file_uri(&real));
        assert_eq!(
            canonical_root(&format!("{link}/src")),
            file_uri(&real.join("src"))
        );
        assert!(
            file_uri(&real).ends_with("/my%20proj"),
            "{}",
            file_uri(&real)
        );
        let localhost = link.replacen("file://", "file://localhost", 1);
        assert_eq!(canonical_root(&localhost), file_uri(&real));
        // RFC 8089's form without an authority.
        let bare = link.replacen("file://", "file:", 1);
        assert_eq!(canonical_root(&bare), file_uri(&real));
        // A resolved root the server would not read (over its length) goes as given.
        let deep = dir.path().join("d".repeat(200));
        let mut far = deep.clone();
        while file_uri(&far).len() <= monad_protocol::wire::MAX_ROOT_LEN {
            far = far.join("%".repeat(200));
        }
        std::fs::create_dir_all(&far).unwrap();
        std::os::unix::fs::symlink(&far, dir.path().join("short")).unwrap();
        let short = file_uri(&dir.path().join("short"));
        assert_eq!(canonical_root(&short), short);
    }

    #[test]
    fn a_root_that_cannot_be_resolved_is_sent_as_given() {
        for uri in [
            "file:///no/such/folder/anywhere",
            "file://elsewhere/tmp",
            "https://example.com/x",
            "file:///tmp?x",
            "file:///bad%zz",
            "file:///bad%+1",
            "file:///nul%00",
        ] {
            assert_eq!(canonical_root(uri), uri);
        }
    }
}
