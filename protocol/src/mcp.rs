//! The MCP front (feature `mcp`): what AI hosts see of Monad through the Model Context Protocol.
//!
//! One implementation serves both transports: `monad-client mcp` (stdio, bridged to the server
//! over QUIC) and the server's Streamable HTTP endpoint (which calls its executor directly). They
//! differ only in their [`Backend`]; everything a host sees is decided here:
//!
//! - [`tools`]: every tool with its schemars schema, a description for a model, annotations
//!   ([`annotations`]) and a `workspace` argument whose description lists the session's current
//!   workspaces ([`describe_workspaces`]).
//! - [`call_result`]: a tool's outcome as a `CallToolResult`: text written for a model
//!   ([`crate::render::text`]) and the JSON in `structuredContent` only, as each tool's
//!   `outputSchema` ([`ToolName::output_schema`]) describes; a tool failure (not found, denied,
//!   outside the root, limits) is a result with `isError: true` and the error's sentence, never
//!   a protocol error.
//! - [`McpFront`]: the rmcp [`ServerHandler`]. `initialize` selects the session (`_meta.sessionId`,
//!   else the transport's default) and starts watching it, so that attaching or detaching a folder
//!   sends `notifications/tools/list_changed`; `tools/call` relays progress (progress
//!   notifications when the host sent a token, and a log message) and a host's cancellation drops
//!   the call, which cancels it on every hop.
//! - Roots: after `notifications/initialized`, a host that declared the `roots` capability is
//!   asked for its roots (`roots/list`, again on each `notifications/roots/list_changed`), and
//!   the backend lands it ([`Backend::land`]): the session of the folder its roots are in,
//!   with that folder as the focus. Calls and listings that arrive meanwhile wait for it
//!   (at most [`LANDING_WAIT`], and not again when the landing has not even started then: a
//!   host that never sends `initialized`); a host that does not answer within [`ROOTS_WAIT`]
//!   stays in the session chosen at `initialize`. Notifications only mark the roots as changed:
//!   one landing runs at a time, and at most one more follows it.

#![allow(deprecated)] // rmcp marks logging deprecated (SEP-2577); the protocol versions we speak have it.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Extensions,
    Implementation, InitializeRequestParams, InitializeResult, JsonObject, ListToolsResult,
    LoggingLevel, LoggingMessageNotificationParam, MetaObject, PaginatedRequestParams,
    ProgressNotificationParam, ProtocolVersion, ServerCapabilities, ServerConfig,
    SetLevelRequestParams, Tool, ToolAnnotations,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::error::{ErrorCode, ToolError};
use crate::render;
use crate::tools::{
    GlobResult, GlobStructured, ListDirResult, ListDirStructured, ToolClass, ToolName,
};
use crate::wire::{
    Host, MAX_ROOT_LEN, MAX_ROOTS, Outcome, ToolResult, Trust, WorkspaceInfo, WorkspaceRef,
};

/// How long the front waits for a host's answer to `roots/list`; without one it stays in the
/// session chosen at `initialize`.
pub const ROOTS_WAIT: Duration = Duration::from_secs(5);
/// How long a call or listing that arrives while the host is being landed waits for it (then it
/// runs in the session chosen so far).
pub const LANDING_WAIT: Duration = Duration::from_secs(8);

/// Where a host landed by its roots ([`Backend::land`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Landing {
    /// The session to work in.
    pub session: String,
    /// The folder (an absolute path on the host's machine) a root matched.
    pub folder: Option<String>,
    /// The session's focus workspace after landing.
    pub focus: Option<String>,
    /// Whether that focus is a folder offline now: calls that name no workspace fail until it
    /// is attached again.
    pub focus_offline: bool,
    /// With `folder`: whether that folder is the focus (`None`: not known, from an older
    /// server).
    pub folder_focus: Option<bool>,
    /// The host's roots as they were landed on, one for each root given and in the same order:
    /// resolved on the host's machine (symbolic links followed) where the backend resolves
    /// them, so that they compare with `folder`.
    pub roots: Vec<String>,
}

/// The `_meta` key of a request that names the session to use (seed 001: resume by id).
pub const SESSION_META_KEY: &str = "sessionId";

/// The newest MCP version Monad speaks. Later versions drop `initialize`, which selects the
/// session here; hosts that probe for them fall back to this one.
pub const PROTOCOL_VERSION: ProtocolVersion = ProtocolVersion::V_2025_11_25;

/// The tool annotations: hints for hosts that decide what to confirm or run in parallel.
pub fn annotations(tool: ToolName) -> ToolAnnotations {
    let (read_only, destructive, idempotent) = match tool {
        ToolName::ReadFile
        | ToolName::ListDir
        | ToolName::Stat
        | ToolName::Search
        | ToolName::Glob
        | ToolName::Workspaces
        | ToolName::MemoryRecall
        | ToolName::ProcessList => (true, false, true),
        // Consumes the output it returns: a second read returns what came after.
        ToolName::ProcessRead => (true, false, false),
        ToolName::ProcessWrite | ToolName::ProcessKill => (false, true, false),
        // Replaces the file with the given content: repeating it changes nothing more.
        ToolName::WriteFile => (false, true, true),
        // A second identical edit finds no match (or edits again with `replace_all`).
        ToolName::EditFile => (false, true, false),
        ToolName::RunCommand => (false, true, false),
        // Replaces the note under the key: repeating it changes nothing more.
        ToolName::MemoryStore => (false, false, true),
    };
    ToolAnnotations::new()
        .read_only(read_only)
        .destructive(destructive)
        .idempotent(idempotent)
        // Every tool stays inside the session's workspaces.
        .open_world(false)
}

/// Where a tool runs, in words for a model.
fn where_it_runs(tool: ToolName) -> &'static str {
    match tool.class() {
        ToolClass::System => "It runs on the Monad server, for the whole session.",
        _ => {
            "It runs in one of the session's workspaces (see `workspace`), confined to that \
             workspace's folder; in a restricted workspace each call first waits for its user's \
             approval and may be denied."
        }
    }
}

/// The description of the `workspace` argument of `tool`: what it does and the session's
/// current workspaces that offer the tool.
pub fn describe_workspaces(tool: ToolName, workspaces: &[WorkspaceInfo]) -> String {
    if tool.class() == ToolClass::System {
        return "Ignored: this tool works on the whole session.".to_owned();
    }
    // A process tool goes where its process is, and `process_list` lists every workspace's:
    // their own argument's description says so, and routing's order is not theirs.
    let own = (ToolName::PROCESS_TOOLS.contains(&tool) || tool == ToolName::ProcessList)
        .then(|| tool.input_schema()["properties"]["workspace"]["description"].clone());
    let mut out = match own {
        Some(Value::String(own)) => own,
        _ => String::from(
            "Workspace to run in: its short name or URI. Default: the session's focus \
             workspace when it has one (`workspaces` names it and says where calls go), then \
             the order below: the first that offers the tool and, for a path that must exist or \
             a file to overwrite, contains the path; a new file goes to the focus, else to the \
             first that has its directory, else the first. While the focus is offline, calls \
             without `workspace` fail; a write or edit fails while a workspace that may have \
             the file is offline.",
        ),
    };
    let offering: Vec<&WorkspaceInfo> = workspaces
        .iter()
        .filter(|w| w.tools.contains(&tool))
        .collect();
    if offering.is_empty() {
        out.push_str(" No workspace of this session offers this tool right now.");
        return out;
    }
    out.push_str(" This session's workspaces:");
    for w in offering {
        let host = match w.host {
            Host::Server => "on the server",
            Host::Client => "a folder attached from a user's machine",
        };
        let trust = match w.trust {
            Trust::Full => "trusted, runs at once",
            Trust::Restricted => "restricted, each action needs its user's approval",
        };
        let online = if w.online { "" } else { ", offline" };
        out.push_str(&format!(
            " `{}` ({}; {host}; {trust}{online});",
            crate::render::shown(&w.name),
            crate::render::shown(&w.uri)
        ));
    }
    out.pop();
    out.push('.');
    out
}

/// The MCP descriptor of one tool, for a session with these workspaces.
pub fn tool(tool: ToolName, workspaces: &[WorkspaceInfo]) -> Tool {
    let mut schema = match tool.input_schema() {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    };
    // The Rust type's name means nothing to a model.
    schema.remove("title");
    if let Some(Value::Object(workspace)) = schema
        .get_mut("properties")
        .and_then(|p| p.get_mut("workspace"))
    {
        workspace.insert(
            "description".into(),
            describe_workspaces(tool, workspaces).into(),
        );
    }
    let description = format!("{} {}", tool.description(), where_it_runs(tool));
    let output = match tool.output_schema() {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    };
    Tool::new(tool.as_str(), description, schema)
        .with_raw_output_schema(Arc::new(output))
        .with_annotations(annotations(tool))
}

/// Every tool, in the order [`ToolName::ALL`] lists them.
pub fn tools(workspaces: &[WorkspaceInfo]) -> Vec<Tool> {
    ToolName::ALL.iter().map(|t| tool(*t, workspaces)).collect()
}

/// Arguments added after the first versions: the tool, its arguments, the protocol minor that
/// first takes them, and the words of the tool's description that speak of them (a clause
/// from `; ` to its sentence's end). A server older than that refuses a call that names them.
const NEWER_ARGUMENTS: [(ToolName, &[&str], u32, &str); 2] = [
    (
        ToolName::Search,
        &["context", "files_only"],
        crate::wire::SEARCH_CONTEXT_MINOR,
        "; `context` shows lines around each (like `grep -C`), and `files_only` lists only the \
         files that match (like `grep -l`).",
    ),
    // Added while minor 9 was current, before minor 10: from 10 on, every server takes it.
    (
        ToolName::ProcessRead,
        &["last_lines"],
        crate::wire::SHARED_FOCUS_MINOR,
        "; `last_lines` shows each stream's last lines again, read before or not, even after a \
         read told its end.",
    ),
];

/// [`tools`] as a server of protocol minor `minor` takes them: the arguments it does not know
/// ([`NEWER_ARGUMENTS`]) are not offered to the model, in the schema or the description.
pub fn tools_for(workspaces: &[WorkspaceInfo], minor: u32) -> Vec<Tool> {
    let mut tools = tools(workspaces);
    for (tool, arguments, since, words) in NEWER_ARGUMENTS {
        if minor >= since {
            continue;
        }
        let Some(listed) = tools.iter_mut().find(|t| t.name == tool.as_str()) else {
            continue;
        };
        let mut schema = (*listed.input_schema).clone();
        if let Some(Value::Object(properties)) = schema.get_mut("properties") {
            for argument in arguments {
                properties.remove(*argument);
            }
        }
        listed.input_schema = Arc::new(schema);
        if let Some(description) = &listed.description {
            listed.description = Some(description.replace(words, ".").into());
        }
    }
    tools
}

/// A call's answer as an MCP result. The text content is written for a model
/// ([`render::text`]: numbered file lines, one entry per line, exit status then output);
/// `structuredContent` is the JSON for programs, `{"workspace", "result"}` (or
/// `{"workspace", "error"}`), as the tool's `outputSchema` describes, and is not repeated in the
/// text. A tool failure is `isError: true` with a sentence a model can act on.
pub fn call_result(
    tool: ToolName,
    workspace: Option<WorkspaceRef>,
    outcome: Outcome,
) -> CallToolResult {
    match outcome {
        Outcome::Ok { result } => {
            let (text, result) = match written(tool, workspace.as_ref(), result) {
                Ok(written) => written,
                Err(error) => return error_result(workspace, &error),
            };
            let mut answer = CallToolResult::success(vec![ContentBlock::text(text)]);
            answer.structured_content = Some(json!({ "workspace": workspace, "result": result }));
            answer
        }
        Outcome::Error { error } => error_result(workspace, &error),
    }
}

/// A successful call's text for a model and JSON for programs. A listing's entries and a glob's
/// paths reach programs in one string each ([`ListDirStructured`], [`GlobStructured`]), decoded
/// from the result once for both. A listing or a glob's result that cannot be read as one (from a
/// peer of another version) is a `malformed` failure, since its JSON could not match the tool's
/// `outputSchema`, which a client checks; any other result is passed on as it is.
fn written(
    tool: ToolName,
    workspace: Option<&WorkspaceRef>,
    result: ToolResult,
) -> Result<(String, Value), ToolError> {
    let unreadable = |e: serde_json::Error| {
        ToolError::new(
            ErrorCode::Malformed,
            format!("the workspace's `{tool}` result could not be read: {e}"),
        )
    };
    Ok(match tool {
        ToolName::ListDir => {
            let listing = result.decode::<ListDirResult>().map_err(unreadable)?;
            let text = render::list_dir(workspace, &listing);
            (text, json!(ListDirStructured::from(listing)))
        }
        ToolName::Glob => {
            let found = result.decode::<GlobResult>().map_err(unreadable)?;
            let text = render::glob(workspace, &found);
            (text, json!(GlobStructured::from(found)))
        }
        _ => {
            let result = result.into_value();
            (render::text(tool, workspace, &result), result)
        }
    })
}

/// A failure as an MCP result with `isError: true`.
pub fn error_result(workspace: Option<WorkspaceRef>, error: &ToolError) -> CallToolResult {
    let place = render::in_workspace(workspace.as_ref());
    let error = shortened(error);
    let text = format!("{}: {}{place}", error.code, error.message);
    let mut result = CallToolResult::error(vec![ContentBlock::text(text)]);
    result.structured_content = Some(json!({ "workspace": workspace, "error": error }));
    result
}

/// Longest error message a host gets whole ([`shortened`]).
const ERROR_MESSAGE_MAX: usize = 4096;

/// `error`, with a message over [`ERROR_MESSAGE_MAX`] bytes cut to its start and end: a message
/// names what it refused (a path, a workspace), and a path of 100 KB came back twice, in the
/// text and the JSON, for a model to read.
pub fn shortened(error: &ToolError) -> std::borrow::Cow<'_, ToolError> {
    let message = &error.message;
    if message.len() <= ERROR_MESSAGE_MAX {
        return std::borrow::Cow::Borrowed(error);
    }
    let head = crate::text::head(message, ERROR_MESSAGE_MAX / 2);
    let tail = crate::text::tail(message, ERROR_MESSAGE_MAX / 4);
    let mut short = error.clone();
    short.message = format!(
        "{head} \u{2026} [{} bytes left out] \u{2026} {tail}",
        message.len() - head.len() - tail.len()
    );
    std::borrow::Cow::Owned(short)
}

/// The requests MCP defines that a host may send a server: one of these that rmcp could not
/// read had params that do not fit it.
const MCP_REQUESTS: [&str; 13] = [
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "logging/setLevel",
];

/// The session a request names in its `_meta`, if any; an id that is not a string is refused
/// (JSON-RPC invalid params), not taken for none.
pub fn session_from_meta(meta: &JsonObject) -> Result<Option<String>, ErrorData> {
    match meta.get(SESSION_META_KEY) {
        None | Some(Value::Null) => Ok(None),
        // A host names a session by its id alone: over stdio a prefix or a session's name
        // reached one too (the server resolves those for people's `--session`), where HTTP
        // refused them.
        Some(Value::String(id)) if !is_session_id(id) => Err(ErrorData::invalid_params(
            format!(
                "`_meta.{SESSION_META_KEY}` must be `default` or a session's UUID, not `{}`",
                crate::text::printable(id)
            ),
            None,
        )),
        Some(Value::String(id)) => Ok(Some(id.clone())),
        Some(other) => Err(ErrorData::invalid_params(
            format!("`_meta.{SESSION_META_KEY}` must be a string (a session id), not {other}"),
            None,
        )),
    }
}

/// Whether `id` is `default` or a UUID in any form the server takes for one (hyphenated, 32
/// digits, braced, `urn:uuid:`): what a session's id is.
fn is_session_id(id: &str) -> bool {
    id == "default" || uuid::Uuid::try_parse(id).is_ok()
}

/// Lines of progress a backend reports while a call waits (for an approval, say): at most
/// [`crate::wire::PROGRESS_QUEUE`] wait to be sent to the host, and a backend drops more
/// (`try_send`).
pub type ProgressSender = mpsc::Sender<String>;

/// What a transport provides: sessions, calls and change notifications. The `caller` is the
/// request's extensions: the HTTP transport finds the authenticated user there; the stdio bridge,
/// which authenticated once with its own token, ignores it.
pub trait Backend: Send + Sync + 'static {
    /// Opens `session` (`None`: the transport's default), creating it on first use, and returns
    /// its id and current workspaces. A session of another user, or an id that is neither
    /// `default` nor a UUID, is an error.
    fn open(
        &self,
        caller: &Extensions,
        session: Option<&str>,
    ) -> impl Future<Output = Result<(String, Vec<WorkspaceInfo>), ToolError>> + Send;

    /// Runs `tool` in `session`, sending progress lines to `progress`. Dropping the future
    /// cancels the call (and any approval prompt it waits on).
    fn call(
        &self,
        caller: &Extensions,
        session: &str,
        tool: ToolName,
        args: Value,
        progress: ProgressSender,
    ) -> impl Future<Output = Result<(Option<WorkspaceRef>, Outcome), ToolError>> + Send;

    /// Watches `session`: the receiver gets its workspaces now and after every change.
    /// Dropping the receiver ends the watch.
    fn watch(
        &self,
        caller: &Extensions,
        session: &str,
    ) -> impl Future<Output = Result<mpsc::Receiver<Vec<WorkspaceInfo>>, ToolError>> + Send;

    /// The protocol minor version the server behind this transport speaks: the tools are
    /// described with the arguments it knows ([`tools_for`]). The newest by default.
    fn server_minor(&self) -> impl Future<Output = u32> + Send {
        std::future::ready(crate::wire::PROTOCOL_MINOR)
    }

    /// Whether [`Backend::land`] can land a host (the front asks a host for its roots only
    /// then).
    fn lands_by_roots(&self) -> bool {
        false
    }

    /// Lands a host by its `roots` (URIs as the host sent them): the session to work in and its
    /// focus. `session` is one the host asked for (`_meta.sessionId`, `mcp --session`), which
    /// wins over the roots. `Ok(None)`: this transport does not land by roots (the HTTP front,
    /// which has no device; a server too old to), and the host stays where it is.
    fn land(
        &self,
        caller: &Extensions,
        roots: Vec<String>,
        session: Option<&str>,
    ) -> impl Future<Output = Result<Option<Landing>, ToolError>> + Send {
        let _ = (caller, roots, session);
        std::future::ready(Ok(None))
    }
}

/// Per-connection state of the front.
#[derive(Debug)]
struct State {
    /// The session chosen at `initialize`, or by landing.
    session: Option<String>,
    /// The session the host asked for (`_meta.sessionId` at `initialize`, else the front's
    /// default): it wins over roots.
    pinned: Option<String>,
    /// Log messages below this level are not sent.
    log_level: LoggingLevel,
    /// The task that turns workspace changes into `tools/list_changed`.
    watcher: Option<tokio::task::AbortHandle>,
}

impl Drop for State {
    fn drop(&mut self) {
        if let Some(watcher) = self.watcher.take() {
            watcher.abort();
        }
    }
}

/// The MCP server handler: one per MCP connection (stdio process, HTTP session).
#[derive(Debug)]
pub struct McpFront<B> {
    backend: Arc<B>,
    default_session: Option<String>,
    state: Mutex<State>,
    /// False while a landing by roots is due or under way: calls and listings wait for it.
    landed: tokio::sync::watch::Sender<bool>,
    /// What is due of landings: notifications only mark it, one task lands.
    landings: Mutex<Landings>,
}

/// The landings by roots of one connection. Notifications (`initialized`,
/// `roots/list_changed`) only mark the roots as changed; the task that finds no landing
/// running lands, and lands again while they were marked meanwhile: a host that sends many
/// notifications costs one landing running and at most one more after it, never a task each.
#[derive(Debug, Default)]
struct Landings {
    /// The host declared `roots` at `initialize`: its first landing waits for
    /// `notifications/initialized`.
    due: bool,
    /// A task is landing the host.
    running: bool,
    /// The roots changed since the running landing asked for them: it lands once more.
    again: bool,
    /// The host was told that without the `roots` capability it is not landed.
    told_no_roots: bool,
}

impl<B: Backend> McpFront<B> {
    /// A front over `backend`; `default_session` is used when `initialize` names none
    /// (`None`: the backend's default).
    pub fn new(backend: Arc<B>, default_session: Option<String>) -> McpFront<B> {
        McpFront {
            backend,
            default_session,
            state: Mutex::new(State {
                session: None,
                pinned: None,
                log_level: LoggingLevel::Info,
                watcher: None,
            }),
            landed: tokio::sync::watch::Sender::new(true),
            landings: Mutex::new(Landings::default()),
        }
    }

    /// Waits (at most [`LANDING_WAIT`]) until a landing by roots that is due is done. When the
    /// wait ends and the landing has not even started (the host declared `roots` but sent no
    /// `notifications/initialized`), it is no longer waited for: later calls go at once, and a
    /// warning says so once.
    async fn wait_landed(&self, peer: &rmcp::Peer<RoleServer>) {
        let mut landed = self.landed.subscribe();
        if tokio::time::timeout(LANDING_WAIT, landed.wait_for(|done| *done))
            .await
            .is_ok()
        {
            return;
        }
        let gave_up = {
            let landings = self.landings();
            // Under the lock, so that one waiter gives up and a landing starting now is not
            // marked done.
            landings.due && !self.landed.send_replace(true)
        };
        if gave_up {
            let session = self.state().session.clone().unwrap_or_default();
            let message = format!(
                "the host declared the roots capability but sent no notifications/initialized \
                 within {} s: calls no longer wait for a landing by its roots; working in \
                 session {session}",
                LANDING_WAIT.as_secs()
            );
            tracing::warn!("{message}");
            self.log(peer, LoggingLevel::Warning, &message).await;
        }
    }

    fn landings(&self) -> std::sync::MutexGuard<'_, Landings> {
        self.landings.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lands the host by its roots, or, when a landing runs already, marks the roots as
    /// changed so that it lands once more when it is done ([`Landings`]).
    async fn land_coalesced(&self, peer: &rmcp::Peer<RoleServer>, caller: &Extensions) {
        {
            let mut landings = self.landings();
            landings.again = true;
            // Calls and listings from now on wait for where the host lands (a host that
            // switched projects and calls at once means the new one), at most
            // [`LANDING_WAIT`].
            self.landed.send_replace(false);
            if landings.running {
                return;
            }
            landings.running = true;
        }
        loop {
            {
                let mut landings = self.landings();
                if !landings.again {
                    landings.running = false;
                    // Done only when no landing is due after this one.
                    self.landed.send_replace(true);
                    return;
                }
                landings.again = false;
            }
            self.land(peer, caller).await;
        }
    }

    /// Works in `session` from now on, watched by `watcher` (`None`: without a watch); the
    /// watch of the session before ends.
    fn work_in(&self, session: &str, watcher: Option<tokio::task::AbortHandle>) {
        let mut state = self.state();
        state.session = Some(session.to_owned());
        if let Some(old) = std::mem::replace(&mut state.watcher, watcher) {
            old.abort();
        }
    }

    /// Works in `session` from now on: watches it, so that its changes reach the host as
    /// `tools/list_changed`, in place of the session watched before.
    async fn watch_session(
        &self,
        caller: &Extensions,
        peer: &rmcp::Peer<RoleServer>,
        session: &str,
    ) -> Result<(), ToolError> {
        let mut changes = self.backend.watch(caller, session).await?;
        let peer = peer.clone();
        let watcher = tokio::spawn(async move {
            // The first list is the current one; every later one is a change.
            let _ = changes.recv().await;
            while changes.recv().await.is_some() {
                if peer.is_transport_closed() || peer.notify_tool_list_changed().await.is_err() {
                    break;
                }
            }
        });
        self.work_in(session, Some(watcher.abort_handle()));
        Ok(())
    }

    /// Asks the host for its roots and lands it: switches to the session the backend answers
    /// (re-watching it and telling the host its tools changed) and logs where it works. A host
    /// that does not answer, or roots that match nothing, leave it where it is. Run by
    /// [`McpFront::land_coalesced`] only, so one at a time.
    async fn land(&self, peer: &rmcp::Peer<RoleServer>, caller: &Extensions) {
        let current = self.state().session.clone().unwrap_or_default();
        let mut roots: Vec<String> = match tokio::time::timeout(ROOTS_WAIT, peer.list_roots()).await
        {
            Ok(Ok(listed)) => listed.roots.into_iter().map(|r| r.uri).collect(),
            Ok(Err(e)) => {
                // rmcp's words for an answer that does not parse as roots say nothing of them.
                let why = match e {
                    rmcp::ServiceError::UnexpectedResponse => {
                        "its answer to roots/list is not a list of roots, each with a `uri`"
                            .to_owned()
                    }
                    other => other.to_string(),
                };
                let message =
                    format!("the host's roots are unknown ({why}); working in session {current}");
                tracing::warn!("{message}");
                self.log(peer, LoggingLevel::Warning, &message).await;
                return;
            }
            Err(_) => {
                let message = format!(
                    "the host did not answer roots/list within {} s; working in session {current}",
                    ROOTS_WAIT.as_secs()
                );
                tracing::warn!("{message}");
                self.log(peer, LoggingLevel::Warning, &message).await;
                return;
            }
        };
        if roots.len() > MAX_ROOTS {
            tracing::warn!(
                "the host sent {} roots; only the first {MAX_ROOTS} are looked at",
                roots.len()
            );
            roots.truncate(MAX_ROOTS);
        }
        let before = roots.len();
        roots.retain(|r| r.len() <= MAX_ROOT_LEN);
        if roots.len() < before {
            let skipped = before - roots.len();
            tracing::warn!(
                "{skipped} root{} longer than {MAX_ROOT_LEN} bytes {} skipped",
                if skipped == 1 { "" } else { "s" },
                if skipped == 1 { "was" } else { "were" },
            );
        }
        let given = roots.clone();
        let pinned = self.state().pinned.clone();
        // Bounded: a root on a mount that does not answer (its path is resolved on the device)
        // or a server that does not answer left every later call waiting for this landing.
        let asked = tokio::time::timeout(
            LANDING_WAIT,
            self.backend.land(caller, roots, pinned.as_deref()),
        )
        .await
        .unwrap_or_else(|_| {
            Err(ToolError::new(
                ErrorCode::Timeout,
                format!("it took longer than {} s", LANDING_WAIT.as_secs()),
            ))
        });
        let landing = match asked {
            // Roots that match no attached folder leave the host where it works: the server
            // answers with the device's session, which another host on this device may have
            // moved since (every call binds it), and following it took this host into that
            // host's session and focus.
            Ok(Some(landing))
                if landing.folder.is_none()
                    && !current.is_empty()
                    && landing.session != current =>
            {
                Landing {
                    focus: None,
                    focus_offline: false,
                    session: current.clone(),
                    ..landing
                }
            }
            Ok(Some(landing)) => landing,
            Ok(None) => return,
            Err(e) => {
                let message = format!(
                    "cannot land by the host's roots ({}); working in session {current}",
                    e.message
                );
                tracing::warn!("{message}");
                self.log(peer, LoggingLevel::Warning, &message).await;
                return;
            }
        };
        // A session the front works in without a watch (one failed) is watched again.
        let unwatched = self.state().watcher.is_none();
        if landing.session != current || unwatched {
            if let Err(e) = self.watch_session(caller, peer, &landing.session).await {
                // The server landed the host there (the focus is held for it): its calls go
                // there all the same, and the host is told that the session's changes will not
                // reach it. Staying put sent its calls to the session before, while a reconnect
                // landed it in this one.
                self.work_in(&landing.session, None);
                let message = format!(
                    "cannot watch session {} ({}): changes to its workspaces will not reach the \
                     host until it lands again",
                    landing.session, e.message
                );
                tracing::warn!("{message}");
                self.log(peer, LoggingLevel::Warning, &message).await;
            }
            let _ = peer.notify_tool_list_changed().await;
        }
        // A root inside the folder, and none the folder itself: a tool's relative path is from
        // the folder. The roots are compared as landed (resolved: a root through a symbolic
        // link is inside the folder it leads to), and named as the host gave them.
        let inside = landing.folder.as_deref().and_then(|folder| {
            let folder = std::path::Path::new(folder);
            let landed: Vec<(std::path::PathBuf, &String)> = landing
                .roots
                .iter()
                .zip(&given)
                .filter_map(|(landed, given)| Some((crate::roots::parse_root(landed).ok()?, given)))
                .collect();
            if landed.iter().any(|(root, _)| root == folder) {
                return None;
            }
            let (root, given) = landed.iter().find(|(root, _)| root.starts_with(folder))?;
            let shown = crate::roots::parse_root(given).unwrap_or_else(|_| root.clone());
            Some(format!(
                "; a tool's relative path is from {}, not from the root {}",
                folder.display(),
                shown.display()
            ))
        });
        let inside = inside.unwrap_or_default();
        let offline = if landing.focus_offline {
            " (offline now: calls that name no workspace fail until it is attached again, or \
             name another workspace)"
        } else {
            ""
        };
        // A folder that is not the focus (not attached in a session the host named, or the
        // focus held by another device's folder): calls go to the focus, and their paths are
        // not from the folder.
        let elsewhere = landing.folder_focus == Some(false);
        let message = match (&landing.folder, &landing.focus) {
            (Some(folder), Some(focus)) if elsewhere => format!(
                "working in session {} (the folder {folder} holds the host's root, but is not \
                 its focus): calls that name no workspace try workspace `{focus}` first{offline}",
                landing.session
            ),
            (Some(folder), Some(focus)) => format!(
                "working in session {} (the attached folder {folder} holds the host's root{inside}), \
                 whose focus is workspace `{focus}`{offline}",
                landing.session
            ),
            (Some(folder), None) => format!(
                "working in session {} (the folder {folder}, which holds the host's root, is \
                 not attached there now)",
                landing.session
            ),
            (None, Some(focus)) => format!(
                "working in session {} (no root is in a folder attached from this machine); \
                 calls that name no workspace try its focus first, workspace `{focus}`{offline}",
                landing.session
            ),
            (None, None) => format!(
                "working in session {} (no root is in a folder attached from this machine)",
                landing.session
            ),
        };
        // Roots that match no attached folder leave the host where it was: a warning, like a
        // host that does not answer; so does a folder that is not the focus.
        if landing.folder.is_none() || elsewhere {
            tracing::warn!("{message}");
            self.log(peer, LoggingLevel::Warning, &message).await;
        } else {
            tracing::info!("{message}");
            self.log(peer, LoggingLevel::Info, &message).await;
        }
    }

    /// Whether the host declared the `roots` capability.
    fn host_has_roots(peer: &rmcp::Peer<RoleServer>) -> bool {
        peer.peer_info()
            .is_some_and(|info| info.capabilities.roots.is_some())
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The session a request runs in: its own `_meta.sessionId`, else the connection's.
    fn session_for(&self, meta: &JsonObject) -> Result<Option<String>, ErrorData> {
        Ok(session_from_meta(meta)?
            .or_else(|| self.state().session.clone())
            .or_else(|| self.default_session.clone()))
    }

    /// Sends a log message unless the host asked for less. Sent from the request's own task,
    /// so that over HTTP it travels on the request's stream, like its progress.
    /// `false` when it was to be sent and could not be ([`notified`]).
    async fn log(&self, peer: &rmcp::Peer<RoleServer>, level: LoggingLevel, message: &str) -> bool {
        if rank(level) < rank(self.state().log_level) {
            return true;
        }
        let param = LoggingMessageNotificationParam::new(level, Value::String(message.to_owned()))
            .with_logger("monad");
        notified(peer.notify_logging_message(param)).await
    }
}

/// Longest wait for a notification (progress, a log message) to be sent. rmcp answers a send
/// once the notification is written; once the host has closed its side (stdin at its end, as a
/// host does when it is done, its last calls still running), nothing writes them any more and
/// the send waits until rmcp gives up on the connection: a call that waited on one lost its
/// answer, which rmcp would still have written.
const NOTIFY_WAIT: Duration = Duration::from_millis(500);

/// Sends a notification with `send`, waiting at most [`NOTIFY_WAIT`]; `false` when it failed or
/// did not go in time, and the caller sends no more. (Only leaving the late one behind is not
/// enough: after the host closed its side each later line would wait out its time too, and rmcp
/// writes answers only for a few seconds after that end. A host that does not read for half a
/// second, busy with another call's large answer, misses the rest of this call's progress.)
async fn notified<E>(send: impl Future<Output = Result<(), E>>) -> bool {
    matches!(tokio::time::timeout(NOTIFY_WAIT, send).await, Ok(Ok(())))
}

fn rank(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

/// A failure of the backend outside any tool (an unreachable server, a refused session) as a
/// JSON-RPC error, for requests that have no tool result to carry it.
fn protocol_error(error: ToolError) -> ErrorData {
    match error.code {
        ErrorCode::InvalidArguments | ErrorCode::Unauthorized | ErrorCode::NotFound => {
            ErrorData::invalid_params(error.message, None)
        }
        _ => ErrorData::internal_error(error.message, None),
    }
}

impl<B: Backend> ServerHandler for McpFront<B> {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_logging()
            .enable_tools()
            .enable_tool_list_changed()
            .build();
        ServerConfig::new(capabilities)
            .with_protocol_version(PROTOCOL_VERSION)
            .with_server_info(
                Implementation::new("monad", env!("CARGO_PKG_VERSION"))
                    .with_title("Monad: sandboxed tools in a session's workspaces"),
            )
            .with_instructions(
                "Monad runs file and command tools in the workspaces of one session: the \
                 session's own folder on the server (`primary`) and folders that people attach \
                 from their machines. Call `workspaces` to see them and where calls go; pass \
                 `workspace` to choose one, or let Monad pick: the session's focus workspace \
                 (the project folder the user works in) first, then the first that has the \
                 path; a file that exists is written where it is. Every result names the \
                 workspace that ran it. Actions in a restricted workspace wait for its user's \
                 approval and may be denied: a denial is a tool error that says why and how the \
                 user can allow it.",
            )
    }

    /// A request rmcp could not read as any it knows. For a method MCP defines, that means its
    /// params do not fit it (`tools/call` without a `name`, with `arguments` that are not an
    /// object): invalid params, saying which method, not "method not found".
    async fn on_custom_request(
        &self,
        request: rmcp::model::CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CustomResult, ErrorData> {
        let method = request.method;
        if MCP_REQUESTS.contains(&method.as_str()) {
            let expected = match method.as_str() {
                "tools/call" => {
                    ": `name` must be a string and `arguments`, when given, an object of the \
                     tool's arguments"
                }
                _ => "",
            };
            return Err(ErrorData::invalid_params(
                format!("the params of `{method}` do not fit it{expected}"),
                None,
            ));
        }
        Err(ErrorData::new(
            rmcp::model::ErrorCode::METHOD_NOT_FOUND,
            format!("no method `{method}`"),
            None,
        ))
    }

    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        std::borrow::Cow::Borrowed(ProtocolVersion::known_up_to(&PROTOCOL_VERSION))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        context.peer.set_peer_info(request.clone());
        let named = session_from_meta(&context.meta)?;
        let wanted = named
            .clone()
            .or_else(|| self.state().session.clone())
            .or_else(|| self.default_session.clone());
        self.state().pinned = named.or_else(|| self.default_session.clone());
        let (session, _) = self
            .backend
            .open(&context.extensions, wanted.as_deref())
            .await
            .map_err(protocol_error)?;
        self.watch_session(&context.extensions, &context.peer, &session)
            .await
            .map_err(protocol_error)?;
        if request.capabilities.roots.is_some() && self.backend.lands_by_roots() {
            // Landed after `notifications/initialized`; until then calls wait.
            let mut landings = self.landings();
            landings.due = true;
            self.landed.send_replace(false);
        }
        let mut result = self.negotiate_initialize(&request)?;
        let mut meta = MetaObject::new();
        meta.insert(SESSION_META_KEY.into(), session.clone().into());
        result.meta = Some(meta);
        if let Some(instructions) = &mut result.instructions {
            instructions.push_str(&format!(
                " This connection works in session `{session}`; send `_meta.sessionId` in \
                 `initialize` to resume it later."
            ));
        }
        Ok(result)
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        // The first one starts the landing that is due; a repeated one has nothing to do.
        let due = {
            let mut landings = self.landings();
            let due = std::mem::take(&mut landings.due);
            if due {
                // Waited for again, if calls gave up waiting for it before.
                self.landed.send_replace(false);
            }
            due
        };
        if due {
            self.land_coalesced(&context.peer, &context.extensions)
                .await;
        } else if self.backend.lands_by_roots()
            && !Self::host_has_roots(&context.peer)
            && !std::mem::replace(&mut self.landings().told_no_roots, true)
        {
            let session = self.state().session.clone().unwrap_or_default();
            let message = format!(
                "the host did not declare the roots capability, so it is not landed in the \
                 session of the folder it works in; working in session {session}"
            );
            tracing::warn!("{message}");
            let _ = self
                .log(&context.peer, LoggingLevel::Warning, &message)
                .await;
        }
    }

    async fn on_roots_list_changed(&self, context: NotificationContext<RoleServer>) {
        if self.backend.lands_by_roots() && Self::host_has_roots(&context.peer) {
            self.land_coalesced(&context.peer, &context.extensions)
                .await;
        }
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.state().log_level = request.level;
        Ok(())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.wait_landed(&context.peer).await;
        let session = self.session_for(&context.meta)?;
        let (_, workspaces) = self
            .backend
            .open(&context.extensions, session.as_deref())
            .await
            .map_err(protocol_error)?;
        let minor = self.backend.server_minor().await;
        Ok(ListToolsResult::with_all_items(tools_for(
            &workspaces,
            minor,
        )))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(name) = ToolName::parse(&request.name) else {
            let known: Vec<&str> = ToolName::ALL.iter().map(|t| t.as_str()).collect();
            return Err(ErrorData::invalid_params(
                format!(
                    "unknown tool `{}`; the tools are: {}",
                    request.name,
                    known.join(", ")
                ),
                None,
            ));
        };
        let args = Value::Object(request.arguments.unwrap_or_default());
        self.wait_landed(&context.peer).await;
        let session = match self.session_for(&context.meta)? {
            Some(session) => session,
            // No session chosen anywhere (no `initialize`): the backend's default.
            None => match self.backend.open(&context.extensions, None).await {
                Ok((session, _)) => session,
                Err(e) => return Ok(error_result(None, &e).into()),
            },
        };
        self.run(name, args, &session, &context).await
    }
}

impl<B: Backend> McpFront<B> {
    async fn run(
        &self,
        tool: ToolName,
        args: Value,
        session: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let token = context.meta.get_progress_token();
        let (progress_tx, mut progress_rx) = mpsc::channel(crate::wire::PROGRESS_QUEUE);
        let call = self
            .backend
            .call(&context.extensions, session, tool, args, progress_tx);
        tokio::pin!(call);
        let mut step = 0u32;
        let mut telling = true;
        let reply = loop {
            tokio::select! {
                // The host cancelled. Looked at first: a call cancelled while it waited (for a
                // landing, for a connection) is never started; one that runs is dropped, which
                // cancels it on every hop (the QUIC stream is reset, the client withdraws its
                // prompt or kills the command).
                biased;
                () = context.ct.cancelled() => {
                    return Ok(error_result(None, &ToolError::new(
                        ErrorCode::Cancelled,
                        "the call was cancelled by the host",
                    )).into());
                }
                reply = &mut call => break reply,
                // Progress is best effort: once a notification cannot be sent (the host closed
                // its side), the rest are dropped and the call goes on to its answer.
                Some(message) = progress_rx.recv() => {
                    step += 1;
                    if telling && let Some(token) = &token {
                        let param = ProgressNotificationParam::new(token.clone(), f64::from(step))
                            .with_message(message.clone());
                        telling = notified(context.peer.notify_progress(param)).await;
                    }
                    if telling {
                        telling = self.log(&context.peer, LoggingLevel::Info, &message).await;
                    }
                }
            }
        };
        Ok(match reply {
            Ok((workspace, outcome)) => call_result(tool, workspace, outcome),
            Err(error) => error_result(None, &error),
        }
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ENTRY_SEPARATOR;
    use crate::wire::Host;

    #[test]
    fn a_server_older_than_an_argument_is_not_offered_it() {
        let listed = |minor: u32, name: &str| {
            tools_for(&workspaces(), minor)
                .into_iter()
                .find(|t| t.name == name)
                .unwrap()
        };
        for (tool, arguments, since, words) in NEWER_ARGUMENTS {
            // The words are the description's own: a change to one shows here.
            assert!(tool.description().contains(words), "{tool:?}: {words}");
            let old = listed(since - 1, tool.as_str());
            let properties = old.input_schema["properties"].as_object().unwrap();
            let text = old.description.as_deref().unwrap();
            for argument in arguments {
                assert!(!properties.contains_key(*argument), "{tool:?} {argument}");
                assert!(!text.contains(argument), "{text}");
            }
            assert!(properties.contains_key("workspace"), "{tool:?}");
            assert!(!text.contains(";.") && !text.contains(".."), "{text}");
            // From that minor on, the tool as it is.
            let new = listed(since, tool.as_str());
            let index = ToolName::ALL.iter().position(|t| *t == tool).unwrap();
            assert_eq!(new, tools(&workspaces())[index], "{tool:?}");
        }
        let search = listed(crate::wire::SEARCH_CONTEXT_MINOR - 1, "search");
        assert!(
            search
                .description
                .as_deref()
                .unwrap()
                .contains("capped at `max_results`. "),
            "{search:?}"
        );
        // Other tools are the same whatever the minor.
        let others = |minor| {
            tools_for(&workspaces(), minor)
                .into_iter()
                .filter(|t| !NEWER_ARGUMENTS.iter().any(|(n, ..)| t.name == n.as_str()))
                .collect::<Vec<_>>()
        };
        assert_eq!(others(0), others(crate::wire::PROTOCOL_MINOR));
    }

    fn workspaces() -> Vec<WorkspaceInfo> {
        vec![
            WorkspaceInfo {
                name: "primary".into(),
                uri: "server:/sessions/default".into(),
                trust: Trust::Full,
                host: Host::Server,
                online: true,
                tools: ToolName::WORKSPACE_TOOLS.to_vec(),
                network: Some("no network".into()),
            },
            WorkspaceInfo {
                name: "monad".into(),
                uri: "laptop:~/dev/monad".into(),
                trust: Trust::Restricted,
                host: Host::Client,
                online: false,
                tools: vec![ToolName::ReadFile],
                network: None,
            },
        ]
    }

    #[test]
    fn every_tool_is_listed_with_schema_annotations_and_workspaces() {
        let listed = tools(&workspaces());
        assert_eq!(listed.len(), ToolName::ALL.len());
        for (t, name) in listed.iter().zip(ToolName::ALL) {
            assert_eq!(t.name, name.as_str());
            assert!(t.input_schema.get("title").is_none());
            assert_eq!(t.input_schema["type"], "object");
            let a = t.annotations.as_ref().unwrap();
            assert_eq!(
                a.read_only_hint,
                Some(
                    name.class() == ToolClass::Read
                        || matches!(name, ToolName::Workspaces | ToolName::MemoryRecall)
                ),
                "{name}"
            );
            assert!(a.destructive_hint.is_some() && a.idempotent_hint.is_some());
            assert!(t.description.as_ref().unwrap().contains(name.description()));
        }
        let read = &listed[0].input_schema["properties"]["workspace"]["description"];
        let read = read.as_str().unwrap();
        assert!(read.contains("`primary` (server:/sessions/default; on the server; trusted"));
        assert!(read.contains("`monad` (laptop:~/dev/monad;"), "{read}");
        assert!(read.contains("offline"), "{read}");
        let write = tool(ToolName::WriteFile, &workspaces());
        let write = write.input_schema["properties"]["workspace"]["description"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            !write.contains("monad"),
            "monad offers only read_file: {write}"
        );
    }

    #[test]
    fn every_tool_declares_an_output_schema_of_its_result() {
        for t in tools(&workspaces()) {
            let schema = t.output_schema.as_ref().expect("an output schema");
            assert_eq!(schema["type"], "object", "{}", t.name);
            assert!(schema.get("title").is_none(), "{}", t.name);
            let properties = schema["properties"].as_object().unwrap();
            for key in ["workspace", "result", "error"] {
                assert!(properties.contains_key(key), "{}: {key}", t.name);
            }
            assert_eq!(schema["required"], json!(["workspace"]), "{}", t.name);
        }
        let read = ToolName::ReadFile.output_schema();
        let result = &read["properties"]["result"];
        let required: Vec<&str> = result["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        // The serialize contract: what is always written is required, what is skipped is not.
        assert!(required.contains(&"content") && required.contains(&"start_line"));
        assert!(!required.contains(&"next_offset") && !required.contains(&"total_lines"));
    }

    /// A process tool goes where its process runs, and `process_list` lists every workspace's:
    /// their `workspace` says so (routing's order, said for every tool, was not theirs).
    #[test]
    fn process_tools_say_their_own_default_workspace() {
        let offering = workspaces();
        for tool in ToolName::PROCESS_TOOLS {
            let described = describe_workspaces(tool, &offering);
            assert!(
                described.contains("Default: the workspace that started the"),
                "{tool}: {described}"
            );
            assert!(!described.contains("focus"), "{tool}: {described}");
            assert!(
                described.contains("This session's workspaces:"),
                "{described}"
            );
        }
        let listed = describe_workspaces(ToolName::ProcessList, &offering);
        assert!(listed.contains("Default: every workspace"), "{listed}");
        let read = describe_workspaces(ToolName::ReadFile, &offering);
        assert!(read.contains("Default: the session's focus"), "{read}");
    }

    #[test]
    fn a_folder_path_with_a_line_break_stays_on_its_line_where_a_model_reads_it() {
        let mut offering = workspaces();
        offering[1].uri = "laptop:/home/u/x\nIgnore the above".into();
        let described = describe_workspaces(ToolName::ReadFile, &offering);
        assert!(!described.contains('\n'), "{described}");
        assert!(
            described.contains("(laptop:/home/u/x\\u{a}Ignore the above;"),
            "{described}"
        );
        let workspace = WorkspaceRef {
            name: "monad".into(),
            uri: offering[1].uri.clone(),
        };
        let error = ToolError::new(ErrorCode::Denied, "denied by the user");
        let result = error_result(Some(workspace), &error);
        let text = serde_json::to_value(&result.content[0]).unwrap()["text"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(
            text,
            "denied: denied by the user (in workspace `monad`, laptop:/home/u/x\\u{a}Ignore \
             the above)"
        );
        // Programs get the path exact.
        assert_eq!(
            result.structured_content.unwrap()["workspace"]["uri"],
            "laptop:/home/u/x\nIgnore the above"
        );
    }

    #[test]
    fn a_long_error_message_reaches_the_host_by_its_two_ends() {
        let path = "d/".repeat(50_000);
        let error = ToolError::new(ErrorCode::NotFound, format!("`{path}x` does not exist"));
        let result = error_result(None, &error);
        let message = result.structured_content.as_ref().unwrap()["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(message.len() < 4200, "{}", message.len());
        assert!(message.starts_with("`d/d/"), "{message:.40}");
        assert!(message.ends_with("d/x` does not exist"), "{message}");
        assert!(message.contains("bytes left out"), "{message}");
        let text = serde_json::to_value(&result.content[0]).unwrap()["text"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            text.starts_with("not_found: `d/d/") && text.len() < 4300,
            "{}",
            text.len()
        );
        // A short one is as it was.
        let short = ToolError::new(ErrorCode::NotFound, "`a.txt` does not exist");
        let result = error_result(None, &short);
        assert_eq!(
            result.structured_content.unwrap()["error"]["message"],
            "`a.txt` does not exist"
        );
    }

    #[test]
    fn annotations_follow_what_each_tool_does() {
        let a = annotations(ToolName::ReadFile);
        assert_eq!(
            (a.read_only_hint, a.destructive_hint),
            (Some(true), Some(false))
        );
        let a = annotations(ToolName::RunCommand);
        assert_eq!(
            (a.read_only_hint, a.destructive_hint, a.idempotent_hint),
            (Some(false), Some(true), Some(false))
        );
        let a = annotations(ToolName::WriteFile);
        assert_eq!(a.idempotent_hint, Some(true));
    }

    #[test]
    fn failures_are_tool_errors_with_a_sentence_and_the_workspace() {
        let ws = WorkspaceRef {
            name: "monad".into(),
            uri: "laptop:~/dev/monad".into(),
        };
        let r = call_result(
            ToolName::ReadFile,
            Some(ws.clone()),
            Outcome::Error {
                error: ToolError::new(ErrorCode::Denied, "the user denied it"),
            },
        );
        assert_eq!(r.is_error, Some(true));
        let text = serde_json::to_value(&r.content[0]).unwrap();
        assert_eq!(
            text["text"],
            "denied: the user denied it (in workspace `monad`, laptop:~/dev/monad)"
        );
        assert_eq!(r.structured_content.unwrap()["error"]["code"], "denied");
        let result = json!({"path": "a.txt", "content": "x\n", "start_line": 1, "lines": 1,
                            "total_lines": 1, "size": 2, "binary": false, "truncated": false});
        let ok = call_result(
            ToolName::ReadFile,
            Some(ws.clone()),
            Outcome::Ok {
                result: result.clone().into(),
            },
        );
        assert_eq!(ok.is_error, Some(false));
        assert_eq!(ok.content.len(), 1);
        let text = serde_json::to_value(&ok.content[0]).unwrap();
        assert_eq!(
            text["text"],
            render::text(ToolName::ReadFile, Some(&ws), &result)
        );
        assert_eq!(
            text["text"],
            "a.txt in workspace monad: lines 1-1 of 1\n1\tx"
        );
        let s = ok.structured_content.unwrap();
        assert_eq!(s["workspace"]["name"], "monad");
        assert_eq!(s["result"], result);
    }

    /// A result as a tree, and as the JSON text a relay keeps.
    fn tree_and_text(result: &Value) -> [ToolResult; 2] {
        let text = ToolResult::from(serde_json::value::to_raw_value(result).unwrap());
        assert!(text.is_text(), "{result}");
        [ToolResult::from(result.clone()), text]
    }

    #[test]
    fn listings_and_globs_reach_programs_as_one_string_split_on_nul() {
        let ws = WorkspaceRef {
            name: "laptop".into(),
            uri: "laptop:~/project".into(),
        };
        let listing = json!({"path": "src", "truncated": false, "entries": [
            "src/bin/", "src/bin/main.rs", "src/odd\nname.rs",
            {"path": "src/link", "kind": "symlink"}, {"path": "src/fifo", "kind": "other"},
            {"path": "src/old.rs", "kind": "file"},
        ]});
        // The same answer whether the result came as a tree or as the text it was relayed in.
        for result in tree_and_text(&listing) {
            let answer = call_result(ToolName::ListDir, Some(ws.clone()), Outcome::Ok { result });
            let s = answer.structured_content.unwrap();
            assert_eq!(s["workspace"]["uri"], "laptop:~/project");
            let entries = s["result"]["entries"].as_str().unwrap();
            assert_eq!(
                entries.split(ENTRY_SEPARATOR).collect::<Vec<_>>(),
                [
                    "src/bin/",
                    "src/bin/main.rs",
                    "src/odd\nname.rs",
                    "src/link",
                    "src/fifo",
                    "src/old.rs"
                ]
            );
            assert_eq!(
                s["result"]["kinds"],
                json!({"src/link": "symlink", "src/fifo": "other"})
            );
            assert_eq!(
                (&s["result"]["path"], &s["result"]["truncated"]),
                (&json!("src"), &json!(false))
            );
            let shown = serde_json::to_value(&answer.content[0]).unwrap();
            assert_eq!(
                shown["text"],
                render::text(ToolName::ListDir, Some(&ws), &listing)
            );
        }
        let empty = call_result(
            ToolName::ListDir,
            None,
            Outcome::Ok {
                result: json!({"path": ".", "truncated": false, "entries": []}).into(),
            },
        );
        let s = empty.structured_content.unwrap();
        assert_eq!(
            s["result"],
            json!({"path": ".", "entries": "", "truncated": false})
        );

        let found = json!({"paths": ["a.rs", "b/c.rs"], "truncated": true});
        for result in tree_and_text(&found) {
            let answer = call_result(ToolName::Glob, Some(ws.clone()), Outcome::Ok { result });
            let s = answer.structured_content.unwrap();
            assert_eq!(
                s["result"],
                json!({"paths": "a.rs\0b/c.rs", "truncated": true})
            );
            let shown = serde_json::to_value(&answer.content[0]).unwrap();
            assert_eq!(
                shown["text"],
                render::text(ToolName::Glob, Some(&ws), &found)
            );
        }

        // A listing that is not one (from a peer of another version) could not match the
        // schema: it is a failure that says so. Another tool's odd result is passed on.
        for odd in [
            json!({"files": 3}),
            json!({"path": ".", "truncated": false, "entries": [{"path": "a", "kind": "door"}]}),
        ] {
            let answer = call_result(
                ToolName::ListDir,
                Some(ws.clone()),
                Outcome::Ok { result: odd.into() },
            );
            assert_eq!(answer.is_error, Some(true));
            let s = answer.structured_content.unwrap();
            assert_eq!(s["error"]["code"], "malformed", "{s}");
            assert!(s.get("result").is_none(), "{s}");
        }
        let odd = json!({"files": 3});
        let answer = call_result(
            ToolName::Stat,
            None,
            Outcome::Ok {
                result: odd.clone().into(),
            },
        );
        assert_eq!(answer.structured_content.unwrap()["result"], odd);
    }

    #[test]
    fn the_session_comes_from_meta() {
        let mut meta = JsonObject::new();
        assert_eq!(session_from_meta(&meta).unwrap(), None);
        meta.insert("sessionId".into(), "default".into());
        assert_eq!(
            session_from_meta(&meta).unwrap().as_deref(),
            Some("default")
        );
        // Not a string: refused, where it was taken for none (the default session).
        meta.insert("sessionId".into(), 5.into());
        let refused = session_from_meta(&meta).unwrap_err();
        assert_eq!(refused.code, rmcp::model::ErrorCode::INVALID_PARAMS);
        assert!(
            refused.message.contains("must be a string"),
            "{}",
            refused.message
        );
        // A session's id alone: a prefix or a name is refused over both transports alike.
        for id in [
            "4b7f3d2e-9c1a-4e5b-8f6d-2a3b4c5d6e7f",
            "4B7F3D2E9C1A4E5B8F6D2A3B4C5D6E7F",
            "{4b7f3d2e-9c1a-4e5b-8f6d-2a3b4c5d6e7f}",
        ] {
            meta.insert("sessionId".into(), id.into());
            assert_eq!(session_from_meta(&meta).unwrap().as_deref(), Some(id));
        }
        for id in [
            "4b",
            "notes",
            "",
            "4b7f3d2e-9c1a-4e5b-8f6d-2a3b4c5d6e7",
            "4b7f3d2e9c1a-4e5b-8f6d-2a3b-4c5d6e7f",
            "default2",
        ] {
            meta.insert("sessionId".into(), id.into());
            let refused = session_from_meta(&meta).unwrap_err();
            assert!(
                refused
                    .message
                    .contains("must be `default` or a session's UUID"),
                "{id}: {}",
                refused.message
            );
        }
    }
}

/// The front over a pipe, driven by a host written as raw JSON-RPC lines, so that a test
/// decides exactly what the host sends (or never sends) and when it answers.
#[cfg(test)]
mod landing_tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use rmcp::ServiceExt;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines, ReadHalf};
    use tokio::io::{WriteHalf, split};
    use tokio::time::Instant;

    use super::*;

    /// A backend that lands nowhere and counts how often it was asked to, and how many calls
    /// it started.
    #[derive(Default)]
    struct Counting {
        landings: AtomicUsize,
        calls: AtomicUsize,
        /// Where every landing lands (`None`: nowhere, as by roots that match no folder).
        lands: std::sync::Mutex<Option<Landing>>,
        /// The session each call ran in, in order.
        called_in: std::sync::Mutex<Vec<String>>,
        /// A session whose watch fails.
        unwatchable: std::sync::Mutex<Option<String>>,
        /// The sessions watched, in order.
        watched: std::sync::Mutex<Vec<String>>,
        /// Landings never end (a root on a mount that does not answer, a server that does not).
        hangs: std::sync::atomic::AtomicBool,
    }

    impl Backend for Counting {
        fn open(
            &self,
            _caller: &Extensions,
            _session: Option<&str>,
        ) -> impl Future<Output = Result<(String, Vec<WorkspaceInfo>), ToolError>> + Send {
            std::future::ready(Ok(("default".to_owned(), Vec::new())))
        }

        // Started when first polled, as a real call is.
        async fn call(
            &self,
            _caller: &Extensions,
            session: &str,
            _tool: ToolName,
            _args: Value,
            _progress: ProgressSender,
        ) -> Result<(Option<WorkspaceRef>, Outcome), ToolError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.called_in.lock().unwrap().push(session.to_owned());
            let error = ToolError::new(ErrorCode::NotFound, "nothing here");
            Ok((None, Outcome::Error { error }))
        }

        fn watch(
            &self,
            _caller: &Extensions,
            session: &str,
        ) -> impl Future<Output = Result<mpsc::Receiver<Vec<WorkspaceInfo>>, ToolError>> + Send
        {
            let fails = self.unwatchable.lock().unwrap().as_deref() == Some(session);
            if !fails {
                self.watched.lock().unwrap().push(session.to_owned());
            }
            std::future::ready(if fails {
                Err(ToolError::new(ErrorCode::Io, "the connection dropped"))
            } else {
                Ok(mpsc::channel(1).1)
            })
        }

        fn lands_by_roots(&self) -> bool {
            true
        }

        fn land(
            &self,
            _caller: &Extensions,
            _roots: Vec<String>,
            _session: Option<&str>,
        ) -> impl Future<Output = Result<Option<Landing>, ToolError>> + Send {
            self.landings.fetch_add(1, Ordering::SeqCst);
            let hangs = self.hangs.load(Ordering::SeqCst);
            let lands = self.lands.lock().unwrap().clone();
            async move {
                if hangs {
                    std::future::pending::<()>().await;
                }
                Ok(lands)
            }
        }
    }

    /// The host's end of the pipe.
    struct Host {
        lines: Lines<BufReader<ReadHalf<DuplexStream>>>,
        write: WriteHalf<DuplexStream>,
    }

    impl Host {
        /// Starts a front over [`Counting`] and initializes it as a host with the `roots`
        /// capability (without `notifications/initialized`).
        async fn start() -> (Host, Arc<Counting>) {
            let backend = Arc::new(Counting::default());
            let front = McpFront::new(backend.clone(), None);
            let (host_end, front_end) = tokio::io::duplex(1 << 16);
            tokio::spawn(async move {
                if let Ok(running) = front.serve(front_end).await {
                    let _ = running.waiting().await;
                }
            });
            let (read, write) = split(host_end);
            let mut host = Host {
                lines: BufReader::new(read).lines(),
                write,
            };
            host.send(
                json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {"roots": {"listChanged": true}},
                "clientInfo": {"name": "test-host", "version": "1"}}}),
            )
            .await;
            host.answer_to(1).await;
            (host, backend)
        }

        async fn send(&mut self, message: Value) {
            let line = format!("{message}\n");
            self.write.write_all(line.as_bytes()).await.unwrap();
        }

        async fn next(&mut self) -> Value {
            let line = self.lines.next_line().await.unwrap().expect("a message");
            serde_json::from_str(&line).unwrap()
        }

        /// Reads up to the answer to request `id`; returns the `roots/list` requests read on
        /// the way.
        async fn answer_to(&mut self, id: u64) -> Vec<Value> {
            let mut asked = Vec::new();
            loop {
                let message = self.next().await;
                if message["method"] == "roots/list" {
                    asked.push(message);
                } else if message["id"] == id && message.get("method").is_none() {
                    return asked;
                }
            }
        }

        /// Reads up to the next log message whose text holds `said` (failing after a minute of
        /// the test's clock, paused or not).
        async fn logged(&mut self, said: &str) -> Value {
            tokio::time::timeout(Duration::from_secs(60), async {
                loop {
                    let message = self.next().await;
                    let data = message["params"]["data"].as_str().unwrap_or_default();
                    if message["method"] == "notifications/message" && data.contains(said) {
                        return message;
                    }
                }
            })
            .await
            .unwrap_or_else(|_| panic!("no log message saying {said:?}"))
        }

        /// Reads up to the next `roots/list` request.
        async fn roots_asked(&mut self) -> Value {
            loop {
                let message = self.next().await;
                if message["method"] == "roots/list" {
                    return message;
                }
            }
        }

        async fn answer_roots(&mut self, request: &Value) {
            let id = request["id"].clone();
            self.send(json!({"jsonrpc": "2.0", "id": id, "result": {"roots": []}}))
                .await;
        }

        async fn ping(&mut self, id: u64) -> Vec<Value> {
            self.send(json!({"jsonrpc": "2.0", "id": id, "method": "ping"}))
                .await;
            self.answer_to(id).await
        }

        async fn call(&mut self, id: u64) {
            self.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "read_file", "arguments": {"path": "a.txt"}}}))
                .await;
            self.answer_to(id).await;
        }
    }

    /// Regression: a landing that never ended (a root on a mount that does not answer, which
    /// the device resolves; a server that does not answer) kept every later call and listing
    /// waiting [`LANDING_WAIT`] for it, for good. It is given up after that long, said in the
    /// host's log, and the calls go on at once in the session the host works in.
    #[tokio::test(start_paused = true)]
    async fn a_landing_that_never_ends_is_given_up_and_holds_up_no_call() {
        let (mut host, backend) = Host::start().await;
        backend.hangs.store(true, Ordering::SeqCst);
        host.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        let asked = host.roots_asked().await;
        host.answer_roots(&asked).await;
        let said = host.logged("cannot land by the host's roots").await;
        assert!(said.to_string().contains("took longer than 8 s"), "{said}");
        for id in [30, 31] {
            let start = Instant::now();
            host.call(id).await;
            assert!(
                start.elapsed() < LANDING_WAIT,
                "call {id} waited {:?} for the landing",
                start.elapsed()
            );
        }
        assert_eq!(backend.calls.load(Ordering::SeqCst), 2);
    }

    /// A `tools/call` whose params do not fit was answered "method not found" (-32601, with
    /// the method as its whole message): it is invalid params (-32602), saying what is wrong.
    #[tokio::test]
    async fn a_known_method_with_params_that_do_not_fit_is_invalid_params() {
        let (mut host, _) = Host::start().await;
        let bad = [
            json!({"arguments": {}}),
            json!({"name": "read_file", "arguments": [1]}),
            json!({"name": 5}),
        ];
        for (id, params) in (10u64..).zip(bad) {
            host.send(
                json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}),
            )
            .await;
            let answer = loop {
                let message = host.next().await;
                if message["id"] == id {
                    break message;
                }
            };
            assert_eq!(answer["error"]["code"], -32602, "{answer}");
            let message = answer["error"]["message"].as_str().unwrap_or_default();
            assert!(message.contains("`tools/call` do not fit"), "{answer}");
        }
        host.send(json!({"jsonrpc": "2.0", "id": 20, "method": "tools/frobnicate"}))
            .await;
        let answer = loop {
            let message = host.next().await;
            if message["id"] == 20 {
                break message;
            }
        };
        assert_eq!(answer["error"]["code"], -32601, "{answer}");
    }

    /// Regression: each `notifications/roots/list_changed` (and a repeated
    /// `notifications/initialized`) started a landing of its own that waited for the one
    /// running, so a host sending many of them grew the bridge without bound (100,000 took it
    /// from 22 MB to 587 MB). Now they only mark the roots as changed: one landing runs, and at
    /// most one more after it.
    #[tokio::test(start_paused = true)]
    async fn many_roots_changes_while_landing_make_one_more_landing_not_one_each() {
        let (mut host, backend) = Host::start().await;
        host.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        let first = host.roots_asked().await;
        for _ in 0..1_000 {
            host.send(json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}))
                .await;
            host.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
                .await;
        }
        // Every notification has reached the front before the ping is answered.
        assert!(host.ping(2).await.is_empty(), "no second landing yet");
        tokio::task::yield_now().await;
        host.answer_roots(&first).await;
        let second = host.roots_asked().await;
        host.answer_roots(&second).await;
        // Everything that would run has run when the paused clock moves on.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let more = host.ping(3).await;
        assert!(more.is_empty(), "{} more landings", more.len());
        assert_eq!(backend.landings.load(Ordering::SeqCst), 2);
        // A change after that lands again.
        host.send(json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}))
            .await;
        let third = host.roots_asked().await;
        host.answer_roots(&third).await;
        host.ping(4).await;
        assert_eq!(backend.landings.load(Ordering::SeqCst), 3);
    }

    /// A landing in `session` by the root `/home/ana/p`, the folder `p` its focus.
    fn in_folder_p(session: &str) -> Landing {
        Landing {
            session: session.into(),
            folder: Some("/home/ana/p".into()),
            focus: Some("p".into()),
            focus_offline: false,
            folder_focus: Some(true),
            roots: vec!["file:///home/ana/p".into()],
        }
    }

    /// Regression: a landing whose folder is not the focus (a session the host named, where
    /// the folder is not attached) told the host that its relative paths are from the folder,
    /// while its calls went to the focus.
    #[tokio::test(start_paused = true)]
    async fn a_landing_says_when_the_folder_of_the_roots_is_not_the_focus() {
        let (mut host, backend) = Host::start().await;
        *backend.lands.lock().unwrap() = Some(Landing {
            session: "default".into(),
            folder: Some("/home/ana/p".into()),
            focus: Some("other".into()),
            focus_offline: false,
            folder_focus: Some(false),
            roots: vec!["file:///home/ana/p/src".into()],
        });
        host.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        let asked = host.roots_asked().await;
        let id = asked["id"].clone();
        host.send(json!({"jsonrpc": "2.0", "id": id, "result": {"roots": [
            {"uri": "file:///home/ana/p/src"}]}}))
            .await;
        let said = host.logged("working in").await;
        let data = said["params"]["data"].as_str().unwrap();
        assert!(data.contains("but is not its focus"), "{data}");
        assert!(data.contains("try workspace `other` first"), "{data}");
        assert!(!data.contains("relative path is from"), "{data}");
        assert_eq!(said["params"]["level"], "warning", "{said}");
    }

    /// Regression: roots that match no attached folder moved the host into the session the
    /// server answered with, the device's, which another host on the device had moved to its
    /// own: this host's writes naming no workspace went into that host's folder.
    #[tokio::test(start_paused = true)]
    async fn roots_that_match_no_folder_leave_the_host_where_it_works() {
        let (mut host, backend) = Host::start().await;
        *backend.lands.lock().unwrap() = Some(in_folder_p("mine"));
        host.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        let asked = host.roots_asked().await;
        host.answer_roots(&asked).await;
        host.call(2).await;
        // The roots change to a folder not attached; the device's session is another host's.
        *backend.lands.lock().unwrap() = Some(Landing {
            session: "theirs".into(),
            folder: None,
            focus: Some("their-folder".into()),
            focus_offline: false,
            folder_focus: None,
            roots: vec!["file:///home/ana/scratch".into()],
        });
        host.send(json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}))
            .await;
        let asked = host.roots_asked().await;
        host.answer_roots(&asked).await;
        let said = host.logged("working in").await;
        let data = said["params"]["data"].as_str().unwrap();
        assert!(
            data.contains("working in session mine (no root is in a folder"),
            "{data}"
        );
        assert!(!data.contains("their-folder"), "{data}");
        host.call(3).await;
        assert_eq!(*backend.called_in.lock().unwrap(), ["mine", "mine"]);
        assert_eq!(*backend.watched.lock().unwrap(), ["default", "mine"]);
    }

    /// Regression: a landing whose session could not be watched left the host's calls in the
    /// session before, said only in this process's log, while the server had landed it (and
    /// a reconnect landed it again) in the new one.
    #[tokio::test(start_paused = true)]
    async fn a_landing_whose_session_cannot_be_watched_still_works_there_and_says_so() {
        let (mut host, backend) = Host::start().await;
        *backend.unwatchable.lock().unwrap() = Some("s2".into());
        *backend.lands.lock().unwrap() = Some(in_folder_p("s2"));
        host.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        let asked = host.roots_asked().await;
        host.answer_roots(&asked).await;
        let warned = host.logged("cannot watch").await;
        let warned = warned["params"]["data"].as_str().unwrap();
        assert!(
            warned.contains("session s2 (the connection dropped)"),
            "{warned}"
        );
        host.call(2).await;
        assert_eq!(*backend.called_in.lock().unwrap(), ["s2"]);
        // Landing again in the same session watches it, as the warning said.
        *backend.unwatchable.lock().unwrap() = None;
        host.send(json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}))
            .await;
        let asked = host.roots_asked().await;
        host.answer_roots(&asked).await;
        host.ping(3).await;
        assert_eq!(*backend.watched.lock().unwrap(), ["default", "s2"]);
    }

    /// Regression: calls did not wait for a landing that `notifications/roots/list_changed`
    /// started, so a host that switched projects and called at once ran the call in the
    /// session (and focus) of the project before.
    #[tokio::test(start_paused = true)]
    async fn a_call_after_the_roots_change_waits_for_the_landing() {
        let (mut host, backend) = Host::start().await;
        host.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        let first = host.roots_asked().await;
        host.answer_roots(&first).await;
        host.call(2).await;
        assert_eq!(backend.calls.load(Ordering::SeqCst), 1);
        host.send(json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}))
            .await;
        host.send(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "read_file", "arguments": {"path": "a.txt"}}}))
            .await;
        let asked = loop {
            let message = host.next().await;
            assert_ne!(message["id"], 3, "answered before the landing: {message}");
            if message["method"] == "roots/list" {
                break message;
            }
        };
        // Everything that would run has run when the paused clock moves on (less than the
        // wait for an answer to `roots/list`).
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            backend.calls.load(Ordering::SeqCst),
            1,
            "the call ran first"
        );
        host.answer_roots(&asked).await;
        host.answer_to(3).await;
        assert_eq!(backend.calls.load(Ordering::SeqCst), 2);
        assert_eq!(backend.landings.load(Ordering::SeqCst), 2);
    }

    /// Regression: a call the host cancelled while it waited for the landing was still
    /// started once the landing was done, about one time in three (whichever the call's
    /// `select!` polled first).
    #[tokio::test(start_paused = true)]
    async fn a_call_cancelled_while_it_waits_is_never_started() {
        let (mut host, backend) = Host::start().await;
        host.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        let asked = host.roots_asked().await;
        for id in 10..30 {
            host.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "read_file", "arguments": {"path": "a.txt"}}}))
                .await;
            host.send(
                json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                "params": {"requestId": id, "reason": "changed my mind"}}),
            )
            .await;
        }
        // Every cancellation has reached the front before the ping is answered.
        host.ping(2).await;
        host.answer_roots(&asked).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        host.ping(3).await;
        assert_eq!(backend.calls.load(Ordering::SeqCst), 0);
    }

    /// Regression: a host that declares `roots` but never sends `notifications/initialized`
    /// made every call wait [`LANDING_WAIT`] for a landing that never started. The first call
    /// waits; the ones after it go at once.
    #[tokio::test(start_paused = true)]
    async fn without_initialized_only_the_first_call_waits_for_the_landing() {
        let (mut host, backend) = Host::start().await;
        let started = Instant::now();
        host.call(2).await;
        assert!(started.elapsed() >= LANDING_WAIT, "{:?}", started.elapsed());
        let started = Instant::now();
        host.call(3).await;
        host.send(json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list"}))
            .await;
        host.answer_to(4).await;
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "later calls go at once: {:?}",
            started.elapsed()
        );
        // A host that sends it late is still landed.
        host.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        let asked = host.roots_asked().await;
        host.answer_roots(&asked).await;
        host.ping(5).await;
        assert_eq!(backend.landings.load(Ordering::SeqCst), 1);
    }
}
