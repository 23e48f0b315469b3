//! Workspace-level integration tests: the real server and the real client over loopback QUIC.
//!
//! The end-to-end suite lives in `tests/tests/` (one binary, `all`, with its cases in
//! `tests/tests/suite/`); the sandbox's own suites (escapes, races, tools, commands) live in
//! `sandbox/tests/`. This library is what the suite stands on:
//!
//! - [`TestServer`]: an in-process `monad-server` on `127.0.0.1:0` with a temporary data dir and
//!   short timeouts; [`TestServer::stop`] shuts it down gracefully and gives back a
//!   [`StoppedServer`], which [`StoppedServer::restart`]s on the same port and data dir.
//! - [`Attachment`]: a folder attached through the client library ([`monad_client::attach`]),
//!   with its events, started once the server has confirmed the attachment; dropping it detaches.
//! - [`folder`]: a temporary folder with files in it; [`call`] and friends: an agent's call with
//!   a deadline; [`binary`] and [`command`]: the real `monad-server` and `monad-client` binaries,
//!   built when missing or older than their sources, and killed when their handle drops.
//! - [`provider::ScriptedProvider`]: a model provider on `127.0.0.1:0` that speaks the OpenAI and
//!   Anthropic wire APIs and replays scripted answers, recording what it was sent.
//!
//! Every wait is bounded: a test that would hang fails with a message saying what it waited for.
#![deny(missing_docs)]

pub mod pg;
pub mod provider;
pub mod s3;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use monad_client::ClientError;
use monad_client::agent::{Agent, CallReply};
use monad_client::approval::{Approver, Decision, ScriptedApprover};
use monad_client::attach::{AttachEvent, AttachOptions, attach};
use monad_client::config::ClientConfig;
use monad_protocol::wire::{Outcome, WorkspaceInfo};
use monad_protocol::{ErrorCode, ToolError};
use monad_server::server::State;
use monad_server::{Server, ServerConfig};
use serde_json::Value;
use tempfile::TempDir;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// The longest any single step of a test may wait for something that should happen at once
/// (a connection, an attachment, a reply). Generous, so a loaded machine does not fail tests;
/// a hang still fails instead of blocking the suite.
pub const STEP: Duration = Duration::from_secs(20);

/// Awaits `future` for at most `limit`; panics naming `what` when it does not finish in time.
pub async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, future).await {
        Ok(value) => value,
        Err(_) => panic!("timed out after {limit:?} waiting for {what}"),
    }
}

/// A test whose peer (a Python SDK, a Node package) is missing: under `scripts/test`, which
/// installs every peer and sets `MONAD_TEST_REQUIRE_PEERS`, that is a failure; under a bare
/// `cargo test` the test says loudly that it did not run.
pub fn peer_missing(test: &str, why: &str) {
    assert!(
        std::env::var_os("MONAD_TEST_REQUIRE_PEERS").is_none(),
        "{test} did not run: {why}"
    );
    eprintln!("SKIPPED {test}: {why}");
}

/// A server configuration for tests: loopback, an ephemeral port, and short transport timeouts
/// so that a killed peer is noticed in about two seconds.
pub fn test_config(data_dir: PathBuf) -> ServerConfig {
    let mut config = ServerConfig::new(data_dir);
    config.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    config.transport.keep_alive = Duration::from_millis(300);
    config.transport.idle_timeout = Duration::from_secs(2);
    config.hello_timeout = Duration::from_secs(5);
    config.call_timeout = Duration::from_secs(60);
    config.shutdown_grace = Duration::from_secs(10);
    config
}

/// A server running in this process, on its own runtime task.
#[derive(Debug)]
pub struct TestServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its certificate's SHA-256, hex.
    pub fingerprint: String,
    /// The first token, made on first start for user `admin`.
    pub token: String,
    state: Arc<State>,
    config: ServerConfig,
    data: TempDir,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl TestServer {
    /// Starts a server with [`test_config`] in a fresh temporary data dir.
    pub async fn start() -> TestServer {
        TestServer::start_with(|_| {}).await
    }

    /// Starts a server with [`test_config`] as changed by `tune`.
    pub async fn start_with(tune: impl FnOnce(&mut ServerConfig)) -> TestServer {
        let data = tempfile::tempdir().expect("temporary data dir");
        let mut config = test_config(data.path().to_path_buf());
        tune(&mut config);
        let (server, first) = Server::bind(config.clone()).expect("the server binds");
        let first = first.expect("a fresh data dir makes a first token");
        TestServer::run(server, config, data, first.token)
    }

    fn run(server: Server, mut config: ServerConfig, data: TempDir, token: String) -> TestServer {
        let addr = server.local_addr();
        // A restart must come back on the same port.
        config.listen = addr;
        let fingerprint = server.fingerprint().to_owned();
        let state = server.state().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async move {
            let _ = stopped.await;
        }));
        TestServer {
            addr,
            fingerprint,
            token,
            state,
            config,
            data,
            stop,
            task,
        }
    }

    /// The server's shared state: its tokens and sessions.
    pub fn state(&self) -> &Arc<State> {
        &self.state
    }

    /// Holds the recorder up, as a store that does not keep up would: it waits on a job of
    /// `user`'s, counted as `holds` bytes of their records, until the sender returned is used
    /// or dropped (or a minute passes).
    pub fn hold_up_recorder(&self, user: &str, holds: usize) -> std::sync::mpsc::Sender<()> {
        let recorder = self.state().executor.recorder.clone().expect("a recorder");
        let (release, held_up) = std::sync::mpsc::channel::<()>();
        recorder.artifact_made(
            user,
            monad_server::store::ArtifactMeta {
                id: "held-up".into(),
                session: "00000000-0000-4000-8000-000000000000".into(),
                kind: monad_server::store::ArtifactKind::ToolOutput,
                workspace: None,
                tool: None,
                call_id: None,
                created_at: "2026-12-02T00:00:00Z".into(),
                content_type: "application/json".into(),
                size: 0,
                truncated: false,
                original_size: 0,
                upload: None,
            },
            holds,
            Box::new(move |_| {
                let _ = held_up.recv_timeout(Duration::from_secs(60));
                Vec::new()
            }),
        );
        release
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// The data dir.
    pub fn data_dir(&self) -> &Path {
        self.data.path()
    }

    /// The audit log of session `session`, parsed line by line, once it has at least `n` lines
    /// (the recorder writes them after the answers; a bounded wait).
    pub async fn audit_lines(&self, session: &str, n: usize) -> Vec<Value> {
        let path = self
            .data_dir()
            .join("sessions")
            .join(session)
            .join("audit.jsonl");
        within(STEP, "the audit lines", async {
            loop {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let lines: Vec<Value> = text
                    .lines()
                    .filter_map(|l| serde_json::from_str(l).ok())
                    .collect();
                if lines.len() >= n {
                    return lines;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
    }

    /// The root of the primary workspace of session `id` on disk.
    pub fn primary_dir(&self, id: &str) -> PathBuf {
        self.data_dir().join("sessions").join(id).join("workspace")
    }

    /// A client configuration for user `admin` (the first token), with a fresh device id.
    pub fn client_config(&self) -> ClientConfig {
        self.client_config_with(&self.token)
    }

    /// A client configuration with `token`, with a fresh device id.
    pub fn client_config_with(&self, token: &str) -> ClientConfig {
        ClientConfig::new(&self.addr.to_string(), token, &self.fingerprint)
            .expect("the server's fingerprint is well-formed")
    }

    /// A token for `user`, made through the server's token store.
    pub fn create_token(&self, user: &str) -> String {
        self.state.tokens.create(user).expect("token created").1
    }

    /// An agent connected as `admin`.
    pub async fn agent(&self) -> Agent {
        connect_agent(&self.client_config()).await
    }

    /// Shuts the server down gracefully and waits (bounded) until it has stopped. The data dir
    /// and port are kept for [`StoppedServer::restart`].
    pub async fn stop(self) -> StoppedServer {
        let TestServer {
            addr,
            fingerprint,
            token,
            state,
            config,
            data,
            stop,
            task,
        } = self;
        // The state holds the attached clients' connections; they must go with the server.
        drop(state);
        let _ = stop.send(());
        let limit = config.shutdown_grace + STEP;
        within(limit, "the server to shut down", task)
            .await
            .expect("the server task does not panic");
        StoppedServer {
            addr,
            fingerprint,
            token,
            config,
            data,
        }
    }

    /// Starts the shutdown and returns at once; the returned handle resolves when the server
    /// has stopped.
    pub fn begin_shutdown(self) -> JoinHandle<StoppedServer> {
        tokio::spawn(self.stop())
    }
}

/// A server that was shut down; its data dir (tokens, certificate, sessions) is kept.
#[derive(Debug)]
pub struct StoppedServer {
    /// The address it listened on.
    pub addr: SocketAddr,
    /// Its certificate's SHA-256, hex (unchanged by a restart).
    pub fingerprint: String,
    /// The first token.
    pub token: String,
    config: ServerConfig,
    data: TempDir,
}

impl StoppedServer {
    /// The data dir.
    pub fn data_dir(&self) -> &Path {
        self.data.path()
    }

    /// Starts a new server on the same address and data dir.
    pub async fn restart(self) -> TestServer {
        // The old endpoint's socket is released by its driver task, just after the server's
        // run ends: retry briefly while the port is still taken.
        let bind = async {
            loop {
                match Server::bind(self.config.clone()) {
                    Err(monad_server::ServerError::Io { error: source, .. })
                        if source.kind() == std::io::ErrorKind::AddrInUse =>
                    {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    other => return other,
                }
            }
        };
        let (server, first) = within(STEP, "the old server's port to be free", bind)
            .await
            .expect("the server binds again");
        assert!(first.is_none(), "a restart makes no new first token");
        assert_eq!(server.fingerprint(), self.fingerprint, "same certificate");
        TestServer::run(server, self.config, self.data, self.token)
    }
}

/// Connects an agent, panicking with the error when it cannot.
pub async fn connect_agent(config: &ClientConfig) -> Agent {
    within(STEP, "an agent to connect", Agent::connect(config))
        .await
        .unwrap_or_else(|e| panic!("the agent cannot connect: {e}"))
}

/// A connection to the server whose handshake is done and which has said nothing yet. Returns
/// the endpoint (keep it alive) and the connection.
pub async fn connect_without_hello(config: &ClientConfig) -> (quinn::Endpoint, quinn::Connection) {
    connect_over(config, None).await
}

/// [`connect_without_hello`], over `transport` when given (a receive window of the test's
/// choosing, say).
async fn connect_over(
    config: &ClientConfig,
    transport: Option<quinn::TransportConfig>,
) -> (quinn::Endpoint, quinn::Connection) {
    let (mut client, _) =
        monad_client::connect::pinned_config(&config.fingerprint, monad_protocol::wire::ALPN)
            .expect("a client configuration");
    if let Some(transport) = transport {
        client.transport_config(Arc::new(transport));
    }
    let mut endpoint =
        quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).expect("a UDP socket");
    endpoint.set_default_client_config(client);
    let addr: SocketAddr = config.server.parse().expect("a loopback address");
    let conn = within(
        STEP,
        "the handshake",
        endpoint.connect(addr, "localhost").expect("connecting"),
    )
    .await
    .expect("the handshake succeeds");
    (endpoint, conn)
}

/// A connection that says hello by hand, announcing protocol minor version `minor` (to play an
/// older peer). Returns the endpoint (keep it alive), the connection, and the minor version the
/// server's welcome settled on.
pub async fn connect_speaking(
    config: &ClientConfig,
    role: monad_protocol::wire::Role,
    minor: u32,
) -> (quinn::Endpoint, quinn::Connection, u32) {
    connect_speaking_over(config, role, minor, None).await
}

/// [`connect_speaking`], over `transport` when given.
pub async fn connect_speaking_over(
    config: &ClientConfig,
    role: monad_protocol::wire::Role,
    minor: u32,
    transport: Option<quinn::TransportConfig>,
) -> (quinn::Endpoint, quinn::Connection, u32) {
    use monad_protocol::io::{read_message, write_message};
    use monad_protocol::wire::{self, Message};
    let (endpoint, conn) = connect_over(config, transport).await;
    let (mut send, mut recv) = conn.open_bi().await.expect("a stream");
    let hello = Message::Hello {
        protocol: wire::PROTOCOL_MAJOR,
        minor,
        role,
        token: config.token.clone(),
        device_id: config.device_id.clone(),
        client_name: config.client_name.clone(),
        capabilities: Vec::new(),
        forwarded_for: None,
    };
    write_message(&mut send, &hello).await.expect("hello sent");
    let _ = send.finish();
    match within(STEP, "the welcome", read_message(&mut recv, 1 << 20)).await {
        Ok(Some(Message::Welcome { minor, .. })) => (endpoint, conn, minor),
        other => panic!("the server answered the hello with {other:?}"),
    }
}

/// An attached client driven by hand: it attaches over a real connection, then the test answers
/// each request from the server itself, so it can send what the real client never would (a body
/// cut short, bytes that are not text, a stream that stalls).
#[derive(Debug)]
pub struct FakeClient {
    /// The client's connection.
    pub connection: monad_client::connect::Connection,
    /// The workspace as the session lists it.
    pub workspace: WorkspaceInfo,
    /// The attach stream; dropping it detaches.
    _attach: quinn::SendStream,
}

impl FakeClient {
    /// Connects as a client and attaches a workspace called `name` (full trust, offering
    /// `tools`) to the default session.
    pub async fn attach(
        config: &ClientConfig,
        name: &str,
        tools: Vec<monad_protocol::ToolName>,
    ) -> FakeClient {
        use monad_protocol::wire::Message;
        let (answer, connection, send) =
            FakeClient::ask_attach(config, Some(name), &format!("/fake/{name}"), tools).await;
        let workspace = match answer {
            Message::Attached { workspace, .. } => workspace,
            other => panic!("the server answered attach with {other:?}"),
        };
        FakeClient {
            connection,
            workspace,
            _attach: send,
        }
    }

    /// Connects as a client and asks to attach `path` (full trust, offering `tools`, named
    /// `name` when given) to the default session; returns the server's answer, whatever it
    /// is, with the connection and the attach stream (an attachment lasts while both do).
    pub async fn ask_attach(
        config: &ClientConfig,
        name: Option<&str>,
        path: &str,
        tools: Vec<monad_protocol::ToolName>,
    ) -> (
        monad_protocol::wire::Message,
        monad_client::connect::Connection,
        quinn::SendStream,
    ) {
        use monad_protocol::io::{read_message, write_message};
        use monad_protocol::wire::{Message, Role, Trust};
        let connection = within(
            STEP,
            "a client to connect",
            monad_client::connect::connect(config, Role::Client),
        )
        .await
        .unwrap_or_else(|e| panic!("the client cannot connect: {e}"));
        let (mut send, mut recv) = connection.conn.open_bi().await.expect("a stream");
        let attach = Message::Attach {
            id: 1,
            session: None,
            name: name.map(str::to_owned),
            path: path.to_owned(),
            trust: Trust::Full,
            tools,
            focus: false,
            folder: None,
            exact_name: false,
            network: None,
        };
        write_message(&mut send, &attach)
            .await
            .expect("attach sent");
        let answer = within(
            STEP,
            "the answer to attach",
            read_message(&mut recv, 1 << 20),
        )
        .await
        .expect("a readable answer")
        .expect("an answer");
        (answer, connection, send)
    }

    /// Sends `message` on the attach stream, as a client reports its folder's network
    /// connections there.
    pub async fn report(&mut self, message: &monad_protocol::wire::Message) {
        monad_protocol::io::write_message(&mut self._attach, message)
            .await
            .expect("a report sent");
    }

    /// Sends `bytes` as they are on the attach stream (a report cut short, say).
    pub async fn report_raw(&mut self, bytes: &[u8]) {
        self._attach.write_all(bytes).await.expect("bytes sent");
    }

    /// Ends the attach stream, as a client detaching does, and waits (bounded) until the
    /// server has read all of it.
    pub async fn end_reports(&mut self) {
        let _ = self._attach.finish();
        let _ = within(STEP, "the attach stream read", self._attach.stopped()).await;
    }

    /// Waits (bounded) for the server's next request, a `run`, answers it with `result` as a
    /// success, and returns the tool it named.
    pub async fn answer_run(&self, result: Value) -> monad_protocol::ToolName {
        use monad_protocol::wire::{Message, Outcome};
        let (request, mut send, _recv) = self.next_request().await;
        let Message::Run { id, tool, .. } = request else {
            panic!("the server asked {request:?}, not a run");
        };
        let answer = Message::Result {
            id,
            workspace: None,
            outcome: Outcome::Ok {
                result: result.into(),
            },
            body: None,
        };
        monad_protocol::io::write_message(&mut send, &answer)
            .await
            .expect("answered");
        let _ = send.finish();
        tool
    }

    /// Waits (bounded) for the server's next request; returns it with its stream.
    pub async fn next_request(
        &self,
    ) -> (
        monad_protocol::wire::Message,
        quinn::SendStream,
        quinn::RecvStream,
    ) {
        let (send, mut recv) = within(
            STEP,
            "a request from the server",
            self.connection.conn.accept_bi(),
        )
        .await
        .expect("the server opens a stream");
        let message = within(
            STEP,
            "the request",
            monad_protocol::io::read_message(&mut recv, 1 << 20),
        )
        .await
        .expect("a readable request")
        .expect("a request, not an empty stream");
        (message, send, recv)
    }
}

/// A temporary folder holding `files` (`(relative path, content)`; parents are created).
pub fn folder(files: &[(&str, &str)]) -> TempDir {
    let dir = tempfile::tempdir().expect("temporary folder");
    for (path, content) in files {
        let path = dir.path().join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("parent dirs");
        }
        std::fs::write(&path, content).expect("file written");
    }
    give_to_command_user(dir.path());
    dir
}

/// The user commands run as when the tests run as root: a folder it owns is one whose commands
/// run as that user (a folder root owns would have them run as `nobody`, who could not write it).
pub const COMMAND_UID: u32 = 65534;

/// Gives `path` and everything under it to [`COMMAND_UID`] when the tests run as root, as a
/// person's folder belongs to them; does nothing otherwise.
pub fn give_to_command_user(path: &Path) {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    std::os::unix::fs::lchown(path, Some(COMMAND_UID), Some(COMMAND_UID)).expect("chown");
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        for entry in std::fs::read_dir(path).expect("read_dir") {
            give_to_command_user(&entry.expect("entry").path());
        }
    }
}

/// Attach options for tests: the short name `name`, restricted, a short prompt time-out and a
/// fast reconnect backoff.
pub fn attach_options(dir: &Path, name: &str) -> AttachOptions {
    let mut options = AttachOptions::new(dir.to_path_buf());
    options.name = Some(name.to_owned());
    options.prompt_timeout = Duration::from_secs(10);
    options.backoff = (Duration::from_millis(50), Duration::from_millis(500));
    options
}

/// A folder attached through the client library, running on its own task.
#[derive(Debug)]
pub struct Attachment {
    /// The session it joined.
    pub session: String,
    /// The workspace as the session lists it.
    pub workspace: WorkspaceInfo,
    events: mpsc::UnboundedReceiver<AttachEvent>,
    task: JoinHandle<Result<(), ClientError>>,
}

impl Attachment {
    /// Attaches with `options` and waits (bounded) until the server confirms it.
    pub async fn start(
        config: &ClientConfig,
        options: AttachOptions,
        approver: Option<Arc<dyn Approver>>,
    ) -> Attachment {
        let (tx, mut events) = mpsc::unbounded_channel();
        let config = config.clone();
        let mut task =
            tokio::spawn(async move { attach(&config, options, approver, Some(tx)).await });
        let (session, workspace) = next_attached(&mut events, &mut task).await;
        Attachment {
            session,
            workspace,
            events,
            task,
        }
    }

    /// [`Attachment::start`] with a [`ScriptedApprover`] of `decisions` as the folder's owner
    /// (then it denies); returns the attachment and the approver, which keeps what it was asked.
    pub async fn scripted(
        config: &ClientConfig,
        options: AttachOptions,
        decisions: impl IntoIterator<Item = Option<Decision>>,
    ) -> (Attachment, Arc<ScriptedApprover>) {
        let approver = Arc::new(ScriptedApprover::new(decisions));
        let owner = approver.clone() as Arc<dyn Approver>;
        (
            Attachment::start(config, options, Some(owner)).await,
            approver,
        )
    }

    /// Waits (bounded) for the next `Attached` event (after a reconnect), skipping others;
    /// records and returns the workspace.
    pub async fn wait_attached(&mut self) -> WorkspaceInfo {
        let (session, workspace) = next_attached(&mut self.events, &mut self.task).await;
        self.session = session;
        self.workspace = workspace.clone();
        workspace
    }

    /// Waits (bounded) for the next event.
    pub async fn next_event(&mut self) -> AttachEvent {
        within(STEP, "an attach event", self.events.recv())
            .await
            .expect("attach is still running")
    }
}

/// The next `Attached` event; panics with attach's result if it ends first.
async fn next_attached(
    events: &mut mpsc::UnboundedReceiver<AttachEvent>,
    task: &mut JoinHandle<Result<(), ClientError>>,
) -> (String, WorkspaceInfo) {
    next_picked(
        events,
        task,
        "the folder to be attached",
        |event| match event {
            AttachEvent::Attached {
                session, workspace, ..
            } => Some((session, workspace)),
            _ => None,
        },
    )
    .await
}

/// The first of an attach's next events that `pick` takes, within [`STEP`] (`what` names it in
/// the time-out); panics with attach's result if it ends first.
pub async fn next_picked<T>(
    events: &mut mpsc::UnboundedReceiver<AttachEvent>,
    task: &mut JoinHandle<Result<(), ClientError>>,
    what: &str,
    mut pick: impl FnMut(AttachEvent) -> Option<T>,
) -> T {
    within(STEP, what, async {
        loop {
            match events.recv().await {
                Some(event) => {
                    if let Some(picked) = pick(event) {
                        return picked;
                    }
                }
                None => panic!("attach ended before {what}: {:?}", task.await),
            }
        }
    })
    .await
}

impl Drop for Attachment {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Calls `tool` in the default session with a deadline; panics when the request itself fails
/// (a refused or broken connection), so tests see the tool's outcome.
pub async fn call(agent: &Agent, tool: &str, args: Value) -> CallReply {
    call_in(agent, None, tool, args).await
}

/// Like [`call`], in `session`.
pub async fn call_in(agent: &Agent, session: Option<&str>, tool: &str, args: Value) -> CallReply {
    within(
        STEP,
        &format!("`{tool}` to answer"),
        agent.call(session, tool, args, |_| {}),
    )
    .await
    .unwrap_or_else(|e| panic!("`{tool}` failed as a request: {e}"))
}

/// Whether a `process_list` result `listing` shows `process` (its id) running.
pub fn process_running(listing: &Value, process: &Value) -> bool {
    listing["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|p| p["process"] == *process && p["running"] == Value::Bool(true))
}

/// The result of a call that must succeed, and the name of the workspace that ran it.
pub fn ok(reply: CallReply) -> (Value, String) {
    let workspace = reply.workspace.map(|w| w.name).unwrap_or_default();
    match reply.outcome {
        Outcome::Ok { result } => (result.into_value(), workspace),
        Outcome::Error { error } => panic!("expected success, got {error} (in `{workspace}`)"),
    }
}

/// The error of a call that must fail.
pub fn err(reply: CallReply) -> ToolError {
    match reply.outcome {
        Outcome::Error { error } => error,
        Outcome::Ok { result } => panic!("expected an error, got {result}"),
    }
}

/// Asserts that a call failed with `code`, and returns its message.
pub fn expect_code(reply: CallReply, code: ErrorCode) -> String {
    let error = err(reply);
    assert_eq!(error.code, code, "wrong code: {error}");
    error.message
}

/// The binaries [`binary`] knows, and the crates their code comes from.
const BINARIES: [&str; 2] = ["monad-server", "monad-client"];
const BINARY_SOURCES: [&str; 4] = ["protocol", "sandbox", "server", "client"];

/// The path of one of the workspace's binaries (`monad-server`, `monad-client`) in the target
/// dir the tests run from. `cargo test --workspace` builds them; otherwise (`cargo test -p
/// monad-tests`) they are built here, once per run, when missing or older than their sources.
pub fn binary(name: &str) -> PathBuf {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    assert!(BINARIES.contains(&name), "unknown binary {name}");
    let exe = std::env::current_exe().expect("the test executable's path");
    // <target>/<profile>/deps/<test binary>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test executable is in <target>/<profile>/deps");
    let built = BUILT.get_or_init(|| {
        if binaries_are_stale(profile_dir) {
            build_binaries(profile_dir)
        } else {
            Ok(())
        }
    });
    if let Err(e) = built {
        panic!(
            "cannot build the binaries the tests run ({e}); try `cargo build --workspace --bins`"
        );
    }
    profile_dir.join(name)
}

/// Whether a binary is missing or older than a source file it is built from (the way cargo
/// decides, by modification time).
fn binaries_are_stale(profile_dir: &Path) -> bool {
    fn newest(path: &Path, newest_seen: &mut std::time::SystemTime) {
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            return;
        };
        if meta.is_dir() {
            for entry in std::fs::read_dir(path).into_iter().flatten().flatten() {
                newest(&entry.path(), newest_seen);
            }
        } else if let Ok(modified) = meta.modified() {
            *newest_seen = (*newest_seen).max(modified);
        }
    }
    let built = BINARIES
        .iter()
        .map(|b| std::fs::metadata(profile_dir.join(b)).and_then(|m| m.modified()))
        .collect::<Result<Vec<_>, _>>();
    let Some(oldest_binary) = built.ok().and_then(|times| times.into_iter().min()) else {
        return true;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root");
    let mut sources = std::time::SystemTime::UNIX_EPOCH;
    newest(&root.join("Cargo.toml"), &mut sources);
    newest(&root.join("Cargo.lock"), &mut sources);
    for krate in BINARY_SOURCES {
        newest(&root.join(krate).join("Cargo.toml"), &mut sources);
        newest(&root.join(krate).join("build.rs"), &mut sources);
        newest(&root.join(krate).join("src"), &mut sources);
    }
    sources > oldest_binary
}

/// Runs `cargo build --bins` for the server and the client into the profile dir the tests run
/// from. Cargo's own variables for this test run are removed from the environment: build
/// scripts watch some of them, and a difference would rebuild half the dependency tree.
fn build_binaries(profile_dir: &Path) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target_dir = profile_dir.parent().ok_or("no target dir")?;
    let profile = profile_dir
        .file_name()
        .and_then(|p| p.to_str())
        .ok_or("no profile")?;
    let mut cmd = std::process::Command::new(cargo);
    cmd.args([
        "build",
        "--quiet",
        "-p",
        "monad-server",
        "-p",
        "monad-client",
        "--bins",
    ])
    .arg("--target-dir")
    .arg(target_dir)
    .current_dir(env!("CARGO_MANIFEST_DIR"));
    match profile {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_MANIFEST_")
            || matches!(
                &*key,
                "OUT_DIR" | "CARGO_CRATE_NAME" | "CARGO_PRIMARY_PACKAGE" | "CARGO_TARGET_TMPDIR"
            )
        {
            cmd.env_remove(&*key);
        }
    }
    let out = cmd.output().map_err(|e| format!("cannot run cargo: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "cargo build failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A command for one of the workspace's binaries: no stdin, stdout and stderr piped, every
/// `MONAD_*` variable of this process removed, a temporary `HOME`, `XDG_CONFIG_HOME` and
/// `XDG_DATA_HOME` of its own (so nothing a test runs can read or change the user's real config
/// or data, nor see another test's), and the process killed when its handle drops.
pub fn command(name: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(binary(name));
    let home = child_home();
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .env("HOME", home.join("home"))
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("XDG_DATA_HOME", home.join("data"))
        .env("XDG_CACHE_HOME", home.join("cache"))
        .env("XDG_RUNTIME_DIR", home.join("run"))
        .env("RUST_LOG", "warn")
        .kill_on_drop(true);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("MONAD_") {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// A fresh directory for one child's home, config, data, cache and runtime directories, under
/// one temporary directory per test process (`monad-tests-<pid>-*` in the system's temporary
/// directory). A child can outlive the test that started it by a little, so these are not
/// removed per test; the next test process removes those of processes that are gone.
fn child_home() -> PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let root = ROOT.get_or_init(|| {
        remove_homes_of_gone_processes();
        tempfile::Builder::new()
            .prefix(&format!("monad-tests-{}-", std::process::id()))
            .tempdir()
            .expect("a temporary directory for the children's homes")
            .keep()
    });
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let home = root.join(n.to_string());
    for dir in ["home", "config", "data", "cache", "run"] {
        std::fs::create_dir_all(home.join(dir)).expect("a child's home directory");
    }
    home
}

fn remove_homes_of_gone_processes() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("monad-tests-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Reads lines from a child's output until one satisfies `wanted`; panics (with what was read)
/// on end of output or after `limit`.
pub async fn wait_for_line<R: tokio::io::AsyncBufRead + Unpin>(
    lines: &mut tokio::io::Lines<R>,
    limit: Duration,
    what: &str,
    wanted: impl Fn(&str) -> bool,
) -> String {
    let mut seen = Vec::new();
    let found = tokio::time::timeout(limit, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if wanted(&line) {
                return Some(line);
            }
            seen.push(line);
        }
        None
    })
    .await;
    match found {
        Ok(Some(line)) => line,
        Ok(None) => panic!("output ended before {what}; it said:\n{}", seen.join("\n")),
        Err(_) => panic!(
            "no {what} within {limit:?}; output so far:\n{}",
            seen.join("\n")
        ),
    }
}

/// A real `monad-server` process serving a data dir: loopback, an ephemeral port, MCP over HTTP
/// off. Its standard error is collected (see [`ServerProcess::stderr`]) so tests can look for
/// warnings; it is killed when dropped.
#[derive(Debug)]
pub struct ServerProcess {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its certificate's SHA-256, hex.
    pub fingerprint: String,
    /// The token printed at the first start, when this start was the first.
    pub first_token: Option<String>,
    /// Where it serves HTTP (`/mcp`, `/api/v1`), when started with `--http` in its arguments.
    pub http: Option<SocketAddr>,
    child: tokio::process::Child,
    stderr: Arc<std::sync::Mutex<Vec<String>>>,
}

impl ServerProcess {
    /// A server process on a fresh data dir, and a client config logged in to it as its first
    /// user: the server, its data dir and the config dir (for `MONAD_CONFIG_DIR`).
    pub async fn logged_in() -> (ServerProcess, TempDir, TempDir) {
        let data = tempfile::tempdir().expect("temporary data dir");
        let server = ServerProcess::start(data.path(), &[]).await;
        let token = server.first_token.clone().expect("a first start");
        let config = tempfile::tempdir().expect("temporary config dir");
        server
            .client_config(&token)
            .save(config.path())
            .expect("the client config is saved");
        (server, data, config)
    }

    /// Starts `monad-server --data-dir DIR` with the extra environment variables `envs` and
    /// waits (bounded) until it listens; panics with its output when it does not.
    pub async fn start(data_dir: &Path, envs: &[(&str, &str)]) -> ServerProcess {
        ServerProcess::start_with(data_dir, envs, None).await
    }

    /// [`ServerProcess::start`], with the process's umask set to `umask` when given (through
    /// `sh`, which sets it and then becomes `monad-server`).
    pub async fn start_with(
        data_dir: &Path,
        envs: &[(&str, &str)],
        umask: Option<u32>,
    ) -> ServerProcess {
        ServerProcess::start_args(data_dir, envs, umask, &[]).await
    }

    /// [`ServerProcess::start`], with MCP over HTTP on `http` (a free loopback port).
    pub async fn start_with_http(
        data_dir: &Path,
        envs: &[(&str, &str)],
        http: SocketAddr,
    ) -> ServerProcess {
        let http = http.to_string();
        ServerProcess::start_args(data_dir, envs, None, &["--http", &http]).await
    }

    /// [`ServerProcess::start_with`], with `args` added to the command line (e.g. `--store`);
    /// with `--http 127.0.0.1:0` among them, HTTP is served (else it is off).
    pub async fn start_args(
        data_dir: &Path,
        envs: &[(&str, &str)],
        umask: Option<u32>,
        args: &[&str],
    ) -> ServerProcess {
        use tokio::io::AsyncBufReadExt;
        let mut cmd = match umask {
            None => command("monad-server"),
            Some(mask) => {
                let mut cmd = command("monad-server");
                let program = cmd.as_std().get_program().to_owned();
                let mut sh = tokio::process::Command::new("sh");
                sh.arg("-c")
                    .arg(format!("umask {mask:03o} && exec \"$0\" \"$@\""))
                    .arg(program);
                // The same set-up as `command`.
                sh.stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .env_remove("MONAD_CONFIG_DIR")
                    .env_remove("MONAD_DATA_DIR")
                    .env("RUST_LOG", "warn")
                    .kill_on_drop(true);
                cmd = sh;
                cmd
            }
        };
        cmd.arg("--data-dir")
            .arg(data_dir)
            .args(["--listen", "127.0.0.1:0"])
            .args(args);
        if !args.contains(&"--http") {
            cmd.arg("--no-http");
        }
        for (key, value) in envs {
            cmd.env(key, value);
        }
        let mut child = cmd.spawn().expect("monad-server starts");
        let mut err_lines = tokio::io::BufReader::new(child.stderr.take().expect("piped")).lines();
        let mut out_lines = tokio::io::BufReader::new(child.stdout.take().expect("piped")).lines();
        let mut seen = Vec::new();
        let mut addr = None;
        let mut fingerprint = None;
        let mut http = None;
        let mut first = false;
        let started = within(STEP, "monad-server to start listening", async {
            while let Ok(Some(line)) = err_lines.next_line().await {
                if let Some(rest) = line.strip_prefix("monad-server listening on ") {
                    addr = rest.split_whitespace().next().and_then(|a| a.parse().ok());
                }
                if let Some(rest) = line.strip_prefix("MCP for AI hosts: http://") {
                    http = rest.split('/').next().and_then(|a| a.parse().ok());
                }
                if let Some(rest) = line.strip_prefix("certificate fingerprint: ") {
                    fingerprint = Some(rest.trim().to_owned());
                }
                let done = line.starts_with("First start") || line.starts_with("create a token");
                first |= line.starts_with("First start");
                seen.push(line);
                if done {
                    return true;
                }
            }
            false
        })
        .await;
        let (Some(addr), Some(fingerprint), true) = (addr, fingerprint, started) else {
            panic!("monad-server did not start; it said:\n{}", seen.join("\n"));
        };
        let first_token = if first {
            let login = wait_for_line(&mut out_lines, STEP, "the login line", |l| {
                l.starts_with("MONAD_TOKEN=") || l.starts_with("monad-client login ")
            })
            .await;
            let words: Vec<&str> = login.split_whitespace().collect();
            let token = match words[0].strip_prefix("MONAD_TOKEN=") {
                Some(token) => token,
                None => {
                    let at = words.iter().position(|w| *w == "--token").expect("a token");
                    words[at + 1]
                }
            };
            Some(token.to_owned())
        } else {
            None
        };
        let stderr = Arc::new(std::sync::Mutex::new(seen));
        let sink = stderr.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = err_lines.next_line().await {
                sink.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        tokio::spawn(async move { while let Ok(Some(_)) = out_lines.next_line().await {} });
        ServerProcess {
            addr,
            fingerprint,
            first_token,
            http,
            child,
            stderr,
        }
    }

    /// A client configuration for `token`, with a fresh device id.
    pub fn client_config(&self, token: &str) -> ClientConfig {
        ClientConfig::new(&self.addr.to_string(), token, &self.fingerprint)
            .expect("the server's fingerprint is well-formed")
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("still running")
    }

    /// `config` pointed at this server (same token and device id), e.g. after a restart on
    /// another port.
    pub fn retarget(&self, config: &ClientConfig) -> ClientConfig {
        let mut config = config.clone();
        config.server = self.addr.to_string();
        config.fingerprint = self.fingerprint.clone();
        config
    }

    /// What it has written to standard error so far.
    pub fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .join("\n")
    }

    /// Kills it with SIGKILL and waits (bounded) until it is gone.
    pub async fn kill(mut self) {
        self.child.start_kill().expect("SIGKILL sent");
        within(STEP, "monad-server to die", self.child.wait())
            .await
            .expect("monad-server is reaped");
    }

    /// Pauses it (SIGSTOP), as a stopped VM or a long pause would: it answers nothing, and its
    /// timers and threads stand still, until [`ServerProcess::resume`].
    pub fn pause(&self) {
        self.signal(nix::sys::signal::Signal::SIGSTOP);
    }

    /// Lets a paused server go on (SIGCONT).
    pub fn resume(&self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = self.child.id().expect("still running") as i32;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).expect("signal sent");
    }

    /// Sends it SIGTERM (a graceful shutdown), without waiting.
    pub fn terminate(&self) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits until it exits, at most `limit` (panics past it): how it exited and what it wrote
    /// to standard error.
    pub async fn exited(mut self, limit: Duration) -> (std::process::ExitStatus, String) {
        let status = within(limit, "monad-server to exit", self.child.wait())
            .await
            .expect("monad-server is reaped");
        tokio::time::sleep(Duration::from_millis(50)).await;
        (status, self.stderr())
    }

    /// Stops it with SIGTERM (a graceful shutdown) and waits (bounded); panics unless it exits
    /// successfully. Returns what it wrote to standard error.
    pub async fn stop(mut self) -> String {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let status = within(STEP, "monad-server to stop", self.child.wait())
            .await
            .expect("monad-server is reaped");
        // Let the collector take the last lines.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let said = self.stderr();
        assert!(
            status.success(),
            "monad-server exited with {status}:\n{said}"
        );
        said
    }
}

/// Runs `monad-server` with `args` to completion (bounded) and returns its output.
pub async fn server_command(args: &[&str]) -> std::process::Output {
    let output = command("monad-server").args(args).output();
    within(STEP, &format!("`monad-server {}`", args.join(" ")), output)
        .await
        .expect("monad-server runs")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_get_a_temporary_home_and_config_and_data_dirs_and_no_monad_variables() {
        let cmd = command("monad-client");
        let envs: std::collections::HashMap<_, _> = cmd
            .as_std()
            .get_envs()
            .map(|(k, v)| (k.to_owned(), v.map(|v| v.to_owned())))
            .collect();
        let real_home = std::env::var_os("HOME");
        for key in ["HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME"] {
            let dir = envs
                .get(std::ffi::OsStr::new(key))
                .cloned()
                .flatten()
                .unwrap_or_else(|| panic!("{key} is not set for the child"));
            let dir = PathBuf::from(dir);
            assert!(dir.is_dir(), "{key}={} exists", dir.display());
            assert!(
                dir.starts_with(std::env::temp_dir()),
                "{key}={}",
                dir.display()
            );
            assert_ne!(Some(dir.into_os_string()), real_home, "{key}");
        }
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("MONAD_") {
                assert_eq!(envs.get(&key), Some(&None), "{key:?} is removed");
            }
        }
    }
}

/// Timing statistics and formatting shared by the benches in `tests/benches/`.
pub mod bench {
    use std::time::Duration;

    /// Whether a bench should make a smoke run: `-- --quick`, or `MONAD_BENCH_QUICK` set to
    /// anything but empty or `0`.
    pub fn quick() -> bool {
        std::env::args().any(|a| a == "--quick")
            || std::env::var("MONAD_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
    }

    /// Median, 99th percentile (nearest rank) and mean of a set of timings.
    #[derive(Debug, Clone, Copy)]
    pub struct Stats {
        /// The median (the mean of the middle two for an even count).
        pub median: Duration,
        /// The smallest sample with at least 99% of all samples at or below it.
        pub p99: Duration,
        /// The arithmetic mean.
        pub mean: Duration,
    }

    impl Stats {
        /// The statistics of `samples` (sorted in place). Panics on an empty set.
        pub fn of(samples: &mut [Duration]) -> Stats {
            assert!(!samples.is_empty(), "no samples");
            samples.sort_unstable();
            let n = samples.len();
            let rank = (0.99 * n as f64).ceil() as usize;
            let median = if n % 2 == 1 {
                samples[n / 2]
            } else {
                (samples[n / 2 - 1] + samples[n / 2]) / 2
            };
            Stats {
                median,
                p99: samples[rank.clamp(1, n) - 1],
                mean: samples.iter().sum::<Duration>() / n as u32,
            }
        }

        /// `median / p99`, human-readable.
        pub fn show(&self) -> String {
            format!("{} / {}", fmt_dur(self.median), fmt_dur(self.p99))
        }
    }

    /// A duration in the unit that reads best (ns, µs, ms, s).
    pub fn fmt_dur(d: Duration) -> String {
        let ns = d.as_nanos() as f64;
        if ns < 1_000.0 {
            format!("{ns:.0} ns")
        } else if ns < 1_000_000.0 {
            format!("{:.1} µs", ns / 1e3)
        } else if ns < 1_000_000_000.0 {
            format!("{:.2} ms", ns / 1e6)
        } else {
            format!("{:.2} s", ns / 1e9)
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn median_p99_and_mean_by_nearest_rank() {
            let mut odd: Vec<Duration> = (1..=5).rev().map(Duration::from_micros).collect();
            let s = Stats::of(&mut odd);
            assert_eq!(
                (s.median, s.p99, s.mean),
                (
                    Duration::from_micros(3),
                    Duration::from_micros(5),
                    Duration::from_micros(3)
                )
            );
            let mut hundred: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
            let s = Stats::of(&mut hundred);
            assert_eq!(s.p99, Duration::from_micros(99));
            assert_eq!(s.median, Duration::from_nanos(50_500));
            assert_eq!(fmt_dur(Duration::from_nanos(1_500)), "1.5 µs");
        }
    }
}

/// A child process on a pseudo-terminal: what a person sees in a real terminal, and the keys
/// they type. Its standard input, output and error are the terminal's slave side; the test holds
/// the master side, reads everything written to the screen (collected by a thread) and sends
/// keys. The child is killed when this drops.
#[derive(Debug)]
pub struct Pty {
    master: std::os::fd::OwnedFd,
    screen: Arc<std::sync::Mutex<Vec<u8>>>,
    grew: tokio::sync::watch::Receiver<usize>,
    /// The child.
    pub child: tokio::process::Child,
}

impl Pty {
    /// Spawns `cmd` (from [`command`]) with the terminal as its standard input, output and
    /// error.
    pub fn spawn(mut cmd: tokio::process::Command) -> Pty {
        let pty = nix::pty::openpty(None, None).expect("a pseudo-terminal");
        let slave = |fd: &std::os::fd::OwnedFd| {
            std::process::Stdio::from(fd.try_clone().expect("a copy of the slave side"))
        };
        cmd.stdin(slave(&pty.slave))
            .stdout(slave(&pty.slave))
            .stderr(slave(&pty.slave));
        let child = cmd.spawn().expect("the child starts on the terminal");
        drop(pty.slave);
        let screen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tell, grew) = tokio::sync::watch::channel(0usize);
        let mut reader =
            std::fs::File::from(pty.master.try_clone().expect("a copy of the master side"));
        let sink = screen.clone();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = [0u8; 4096];
            // Ends with EIO once the child and every copy of the slave side are gone.
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut screen = sink.lock().unwrap_or_else(|p| p.into_inner());
                screen.extend_from_slice(&buf[..n]);
                let _ = tell.send(screen.len());
            }
        });
        Pty {
            master: pty.master,
            screen,
            grew,
            child,
        }
    }

    /// Everything written to the terminal so far, as bytes.
    pub fn bytes(&self) -> Vec<u8> {
        self.screen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Everything written to the terminal so far, as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes()).into_owned()
    }

    /// Whether the terminal echoes what is typed and gives it line by line (its modes as a shell
    /// leaves them for the next program), read from the master side: what the child left them
    /// at, once it has exited.
    pub fn echoes_lines(&self) -> bool {
        use nix::sys::termios::LocalFlags;
        let modes = nix::sys::termios::tcgetattr(&self.master).expect("the terminal's modes");
        modes
            .local_flags
            .contains(LocalFlags::ECHO | LocalFlags::ICANON)
    }

    /// Types `keys`.
    pub fn send(&self, keys: &[u8]) {
        let mut written = 0;
        while written < keys.len() {
            written += nix::unistd::write(&self.master, &keys[written..]).expect("keys typed");
        }
    }

    /// Waits (bounded) until `what` appears on the screen at or after byte `from`; returns the
    /// position just after it. Panics with the screen when it does not appear.
    pub async fn wait_for(&mut self, what: &str, from: usize) -> usize {
        let found = |screen: &[u8]| {
            screen
                .get(from..)
                .and_then(|tail| {
                    tail.windows(what.len().max(1))
                        .position(|w| w == what.as_bytes())
                })
                .map(|at| from + at + what.len())
        };
        let grew = &mut self.grew;
        let screen = &self.screen;
        let waited = tokio::time::timeout(STEP, async {
            loop {
                if let Some(at) = found(&screen.lock().unwrap_or_else(|p| p.into_inner())) {
                    return Some(at);
                }
                if grew.changed().await.is_err() {
                    return found(&screen.lock().unwrap_or_else(|p| p.into_inner()));
                }
            }
        })
        .await;
        match waited {
            Ok(Some(at)) => at,
            _ => panic!(
                "`{what}` did not appear on the terminal; it shows:\n{}",
                self.text()
            ),
        }
    }
}

/// A QUIC server of a test's own, speaking the real protocol only as far as the test makes it:
/// for what a compromised or broken server does to a client. Listens on a free port of
/// 127.0.0.1 with a fresh certificate; `transport` adjusts its transport (a small stream
/// window, say).
pub struct RogueServer {
    /// Its endpoint: accept connections with [`RogueServer::welcome`].
    pub endpoint: quinn::Endpoint,
    /// Where it listens.
    pub address: SocketAddr,
    fingerprint: String,
    _tls: TempDir,
}

impl RogueServer {
    /// Starts listening.
    pub fn start(transport: impl FnOnce(&mut quinn::TransportConfig)) -> RogueServer {
        let tls = tempfile::tempdir().unwrap();
        let (identity, _) = monad_server::tls::load_or_create(tls.path()).unwrap();
        let mut quic = monad_server::tls::quic_config(&identity, &Default::default()).unwrap();
        let mut config = monad_server::config::Transport::default().quinn();
        transport(&mut config);
        quic.transport_config(Arc::new(config));
        let endpoint =
            monad_protocol::pin::endpoint("127.0.0.1:0".parse().unwrap(), Some(quic)).unwrap();
        let address = endpoint.local_addr().unwrap();
        RogueServer {
            endpoint,
            address,
            fingerprint: identity.fingerprint,
            _tls: tls,
        }
    }

    /// A client config logged in to it (with a token it takes without looking).
    pub fn client_config(&self) -> ClientConfig {
        ClientConfig::new(&self.address.to_string(), "mnd_a_b", &self.fingerprint).unwrap()
    }

    /// Accepts the next connection and answers its hello with a welcome (user `ana`), then
    /// lets it open a few streams, as a server does once it knows the connection's role.
    pub async fn welcome(endpoint: &quinn::Endpoint) -> quinn::Connection {
        RogueServer::welcome_as(endpoint, monad_protocol::wire::PROTOCOL_MINOR).await
    }

    /// [`RogueServer::welcome`], saying protocol minor `minor` (a server of an older version).
    pub async fn welcome_as(endpoint: &quinn::Endpoint, minor: u32) -> quinn::Connection {
        use monad_protocol::io::{read_message, write_message};
        use monad_protocol::wire::{self, Message};
        let conn = endpoint.accept().await.unwrap().await.unwrap();
        let (mut send, mut recv) = conn.accept_bi().await.unwrap();
        let hello = read_message(&mut recv, 1 << 20).await.unwrap();
        assert!(matches!(hello, Some(Message::Hello { .. })), "{hello:?}");
        let welcome = Message::Welcome {
            protocol: wire::PROTOCOL_MAJOR,
            minor,
            user: "ana".into(),
            server: "rogue".into(),
        };
        write_message(&mut send, &welcome).await.unwrap();
        let _ = send.finish();
        conn.set_max_concurrent_bi_streams(4u32.into());
        conn
    }
}
