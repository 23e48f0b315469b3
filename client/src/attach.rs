//! `monad-client attach`: keep a folder attached to a session, run what the server asks there
//! once the user allows it, and reconnect (re-attaching by itself) when the connection drops.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use monad_protocol::io::{read_message, write_message, write_messages};
use monad_protocol::text::printable;
use monad_protocol::tools::{
    ProcessInfo, ProcessKillArgs, ProcessListResult, ProcessReadArgs, ProcessWriteArgs,
    RunCommandResult,
};
use monad_protocol::wire::{
    BODY_MINOR, CLI_MINOR, ELSEWHERE_MINOR, FOCUS_MINOR, MAX_NETWORK_EVENTS, Message,
    NETWORK_MINOR, NETWORK_POLICY_MINOR, Outcome, ROOTS_MINOR, Role, ToolResult, Trust,
    WorkspaceInfo,
};
use monad_protocol::{ErrorCode, ToolClass, ToolError, ToolName};
use monad_sandbox::exec::WRITE_TOOK;
use monad_sandbox::{ExecPolicy, Limits, NetworkAudit, NetworkBatch, Sandbox};
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::{debug, info};

use crate::ClientError;
use crate::approval::{
    ApprovalRequest, Approver, Basis, Policy, Rule, Verdict, describe, nobody_to_ask,
    runs_nothing_else,
};
use crate::config::ClientConfig;
use crate::connect::connect_in_order;
use crate::site::{CommandPlace, Lookup, locate, lookup};

/// Largest request accepted: a 16 MiB write (the default `write_max_bytes`) as JSON, with room
/// for escapes. Requests are buffered whole, so this bounds memory per request.
const MAX_REQUEST: usize = 40 * 1024 * 1024;
/// Bytes a folder's requests may hold at once, by default: each as it is read, the tree it becomes
/// (counted before it is made, `monad_protocol::values::tree_bytes`) and the diff of a write waiting
/// for its owner. A server opening a hundred streams of 40 MiB held 4 GiB of the laptop's
/// memory; past this a request is refused (`limit_exceeded`) and nothing more of it is read.
const REQUESTS_HELD_MAX: usize = 256 * 1024 * 1024;
/// What a request may hold whatever the others hold: a probe, a read, a listing are always
/// served (a probe refused for the writes waiting for their owner sent the agent's reads an
/// internal error). At most [`monad_protocol::pin::SERVER_STREAMS`] of them at once.
const SMALL_REQUEST: usize = 64 * 1024;

/// What a folder's requests hold in memory at once, up to `max`.
#[derive(Debug)]
struct RequestMemory {
    held: std::sync::atomic::AtomicUsize,
    max: usize,
}

impl RequestMemory {
    fn new(max: usize) -> RequestMemory {
        RequestMemory {
            held: std::sync::atomic::AtomicUsize::new(0),
            max,
        }
    }
}

/// One request's share of its folder's [`RequestMemory`], given back when dropped.
struct Holding<'a> {
    memory: &'a RequestMemory,
    held: usize,
}

impl<'a> Holding<'a> {
    fn new(memory: &'a RequestMemory) -> Holding<'a> {
        Holding { memory, held: 0 }
    }

    /// Takes `n` bytes more; false (nothing taken) past the folder's bound, unless this request
    /// holds at most [`SMALL_REQUEST`] with them.
    fn take(&mut self, n: usize) -> bool {
        use std::sync::atomic::Ordering;
        let max = self.memory.max;
        let small = self.held.saturating_add(n) <= SMALL_REQUEST;
        let taken = self
            .memory
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(n).filter(|&after| after <= max || small)
            });
        if taken.is_ok() {
            self.held += n;
        }
        taken.is_ok()
    }

    /// The error of a request that would hold more than its folder's requests may.
    fn refused(&self, what: &str) -> ToolError {
        ToolError::new(
            ErrorCode::LimitExceeded,
            format!(
                "{what} would take this folder's requests past {} of the client's memory; wait \
                 for its other calls to finish",
                match self.memory.max {
                    max if max >= 1 << 20 => format!("{} MiB", max >> 20),
                    max => format!("{max} bytes"),
                }
            ),
        )
    }
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        self.memory
            .held
            .fetch_sub(self.held, std::sync::atomic::Ordering::AcqRel);
    }
}

/// A request's message from its bytes, its tree counted in `held` before it is made.
fn decode_request(bytes: &[u8], held: &mut Holding<'_>) -> Result<Message, ToolError> {
    use monad_protocol::values::{MAX_REQUEST_VALUES, tree_bytes};
    let unreadable = |e: serde_json::Error| {
        ToolError::new(
            ErrorCode::Malformed,
            format!("the request cannot be read: {e}"),
        )
    };
    if !held.take(tree_bytes(bytes, MAX_REQUEST_VALUES).map_err(unreadable)?) {
        return Err(held.refused("the request"));
    }
    Message::from_json(bytes).map_err(unreadable)
}

/// How long a server has to answer an attach (it may load the session from its store first).
const ATTACH_ANSWER_WAIT: Duration = Duration::from_secs(60);

/// The attach request's id on each connection; `Run` and `Probe` name it.
const ATTACHMENT_ID: u64 = 1;

/// How to attach a folder.
#[derive(Debug, Clone)]
pub struct AttachOptions {
    /// The folder.
    pub dir: PathBuf,
    /// The folder as the workspace's URI shows it, and its identity on the server (a second
    /// attach of the same path takes the workspace over): `dir` written from the home
    /// directory (`~/...`) when under it.
    pub shown_path: String,
    /// The session; `None` for the device's bound session, else `default`.
    pub session: Option<String>,
    /// Short name wanted; `None` for the folder's base name.
    pub name: Option<String>,
    /// `name` must be used as given (`attach --name`): the attach fails when the session cannot
    /// give the folder that name (taken, reserved, invalid) instead of making it unique.
    pub exact_name: bool,
    /// Detaches when it turns true (Ctrl-C, SIGTERM): the server hears of it at once, so a
    /// call waiting on the folder fails at once instead of when the connection times out.
    pub stop: Option<tokio::sync::watch::Receiver<bool>>,
    /// Trust level.
    pub trust: Trust,
    /// Classes pre-approved with `--allow`.
    pub allow: Vec<ToolClass>,
    /// How long a prompt waits before it denies.
    pub prompt_timeout: Duration,
    /// Bytes the folder's requests may hold at once ([`REQUESTS_HELD_MAX`] unless changed).
    pub requests_held_max: usize,
    /// Limits of the folder's tools.
    pub limits: Limits,
    /// Command policy of the folder.
    pub exec: ExecPolicy,
    /// The tools offered.
    pub tools: Vec<ToolName>,
    /// Make the folder the session's focus (`--focus`): calls that name no workspace try it
    /// first.
    pub focus: bool,
    /// First and longest wait between reconnection attempts.
    pub backoff: (Duration, Duration),
    /// The user chose never to be asked (`--non-interactive`): with no approver, a denial
    /// says so, rather than that there is no terminal.
    pub non_interactive: bool,
}

impl AttachOptions {
    /// The `monad-client attach` line that attaches this folder again as it is, with `class`
    /// pre-approved too: its name, session, pre-approved classes and choices of asking and
    /// focus (other options, such as `--trust`, are not repeated).
    pub fn attach_again(&self, class: ToolClass) -> String {
        // Quoted as a shell reads it back, `~/` left outside the quotes for the shell to expand.
        let path = match self.shown_path.strip_prefix("~/") {
            Some(rest) => format!("~/{}", monad_protocol::text::shell_words(&[rest])),
            None if self.shown_path == "~" => "~".to_owned(),
            None => monad_protocol::text::shell_words(&[&self.shown_path]),
        };
        let mut line = format!("monad-client attach {path}");
        let mut words = Vec::new();
        // Only a name the user gave: the one made from the folder (`.dotfiles`, `primary`, or a
        // name another folder has, listed with a suffix) is made again the same way, and as
        // `--name` it would have to be taken exactly.
        if let Some(name) = self.name.as_ref().filter(|_| self.exact_name) {
            words.extend(["--name".to_owned(), name.clone()]);
        }
        if let Some(session) = &self.session {
            words.extend(["--session".to_owned(), session.clone()]);
        }
        let mut allow = self.allow.clone();
        if !allow.contains(&class) {
            allow.push(class);
        }
        for class in allow {
            words.extend(["--allow".to_owned(), class.as_str().to_owned()]);
        }
        if self.non_interactive {
            words.push("--non-interactive".to_owned());
        }
        if self.focus {
            words.push("--focus".to_owned());
        }
        line.push(' ');
        line.push_str(&monad_protocol::text::shell_words(&words));
        line
    }

    /// Restricted, nothing pre-approved, every workspace tool offered. `dir` should be the folder
    /// itself, resolved (`canonicalize`), as `attach` and chat's `/attach` give it: its identity
    /// is then the same whatever way it was typed (`.`, a relative name, a symbolic link).
    pub fn new(dir: PathBuf) -> AttachOptions {
        AttachOptions {
            shown_path: home_relative(&dir),
            dir,
            session: None,
            name: None,
            exact_name: false,
            stop: None,
            trust: Trust::Restricted,
            allow: Vec::new(),
            prompt_timeout: Duration::from_secs(120),
            requests_held_max: REQUESTS_HELD_MAX,
            limits: Limits::default(),
            exec: ExecPolicy::default(),
            tools: ToolName::WORKSPACE_TOOLS.to_vec(),
            focus: false,
            backoff: (Duration::from_millis(200), Duration::from_secs(10)),
            non_interactive: false,
        }
    }
}

/// `path` (absolute, resolved) as `~/...` when it is under the home directory, else as it is:
/// as DESIGN.md's URIs show a folder (one user's `~` is one place), never the words typed.
fn home_relative(path: &Path) -> String {
    let home = crate::config::canonical_home();
    relative_to(path, home.as_deref())
}

/// [`home_relative`] with the home directory given.
fn relative_to(path: &Path, home: Option<&Path>) -> String {
    // A home of `/` (a service account) would make every path `~/...`: no home then.
    let home = home.filter(|home| home.parent().is_some());
    match home.and_then(|home| path.strip_prefix(home).ok()) {
        Some(rest) if rest.as_os_str().is_empty() => "~".to_owned(),
        Some(rest) => format!("~/{}", rest.to_string_lossy()),
        None => path.to_string_lossy().into_owned(),
    }
}

/// What happens to an attachment, for the terminal and for tests.
#[derive(Debug, Clone, PartialEq)]
pub enum AttachEvent {
    /// Attached (again) to a session.
    Attached {
        /// The session.
        session: String,
        /// The workspace as the session lists it.
        workspace: WorkspaceInfo,
        /// The host it is attached through (`HOST:PORT`, one of the config's addresses): after
        /// a host died, another one of the deployment.
        server: String,
    },
    /// `--focus` was asked for: whether the folder is now the session's focus (a server older
    /// than protocol minor [`FOCUS_MINOR`] cannot make it one).
    Focus {
        /// True when the folder is the focus.
        set: bool,
    },
    /// The session's focus moved to this folder, or away from it, other than at this attach's
    /// asking (`--focus`): an agent's calls that name no workspace try the focus first.
    FocusMoved {
        /// True when the folder is now the focus.
        focus: bool,
        /// The session's focus now, when it has one.
        now: Option<String>,
        /// The session, when it is another than the one the folder attached to: one the
        /// folder serves too (an MCP host's roots landed on it there).
        session: Option<String>,
    },
    /// The network policy refused connections the folder's commands asked its proxy for (one
    /// event per batch the audit log is sent).
    NetworkRefused(NetworkRefused),
    /// A re-attach landed in another session than the one before (this device's binding
    /// changed meanwhile): the earlier session's background processes were ended and its
    /// "always" answers forgotten, so the new session can neither use nor see them.
    SessionChanged {
        /// The session before.
        from: String,
        /// The session now.
        to: String,
        /// How many background processes were ended.
        processes: usize,
        /// How many remembered answers were forgotten.
        rules: usize,
    },
    /// The host asked serves nothing of the session: another host of the deployment does, and
    /// keeps it; the folder attaches there now.
    Elsewhere {
        /// That host's `HOST:PORT`.
        host: String,
        /// Why, as the server said it.
        reason: String,
    },
    /// The connection dropped; reconnecting after `retry_in`.
    Disconnected {
        /// Why.
        reason: String,
        /// The wait before the next attempt.
        retry_in: Duration,
    },
    /// A call was decided (by the policy, or by the user's answer to a prompt): it starts now
    /// (`allowed`), or it was refused. An allowed call is followed by [`AttachEvent::Finished`].
    Decided {
        /// The tool.
        tool: ToolName,
        /// Its path or command line in one line, escaped (safe to print).
        target: String,
        /// Whether it was allowed (and so starts now).
        allowed: bool,
        /// Why: pre-approved, remembered, full trust, the user's answer, no terminal, ...
        basis: Basis,
    },
    /// An allowed call ended: finished, failed, timed out, or cancelled while it ran.
    Finished {
        /// The tool.
        tool: ToolName,
        /// Its path or command line in one line, escaped (safe to print).
        target: String,
        /// How it ended.
        end: CallEnd,
    },
}

impl AttachEvent {
    /// The line the attach terminal prints for this event, escaped (safe to print); `None` for
    /// a refusal the prompt already showed the answer of.
    pub fn line(&self) -> Option<String> {
        match self {
            AttachEvent::Attached {
                session,
                workspace,
                server,
            } => Some(format!(
                "attached {} as `{}` to session {} on {} ({}); Ctrl-C disconnects",
                shown_name(&workspace.uri),
                shown_name(&workspace.name),
                shown_name(session),
                shown_name(server),
                workspace.trust.as_str()
            )),
            AttachEvent::Focus { set: true } => Some(
                "this folder is the session's focus: an agent's calls that name no workspace \
                 try it first"
                    .into(),
            ),
            AttachEvent::Focus { set: false } => Some(
                "--focus ignored: the server is too old to make a folder the session's focus; \
                 agents must name this folder's workspace"
                    .into(),
            ),
            AttachEvent::FocusMoved {
                focus: true,
                session: None,
                ..
            } => Some(
                "this folder is now the session's focus: an agent's calls that name no \
                 workspace try it first"
                    .into(),
            ),
            AttachEvent::FocusMoved {
                focus: false,
                now: Some(now),
                session: None,
            } => Some(format!(
                "this folder is no longer the session's focus: `{}` is, and an agent's calls \
                 that name no workspace try it first",
                shown_name(now)
            )),
            AttachEvent::FocusMoved {
                focus: false,
                now: None,
                session: None,
            } => Some(
                "this folder is no longer the session's focus; the session has none now".into(),
            ),
            AttachEvent::FocusMoved {
                focus: true,
                session: Some(session),
                ..
            } => Some(format!(
                "this folder is now the focus of session {}, which it serves as well (an MCP \
                 host's roots, an editor's new session over ACP, or `sessions --new`, put it \
                 there): an agent's calls in that \
                 session that name no workspace try it first",
                shown_name(session)
            )),
            AttachEvent::FocusMoved {
                focus: false,
                now,
                session: Some(session),
            } => Some(format!(
                "this folder is no longer the focus of session {}{}",
                shown_name(session),
                match now {
                    Some(now) => format!(": `{}` is", shown_name(now)),
                    None => "; it has none now".into(),
                }
            )),
            AttachEvent::NetworkRefused(refused) => Some(refused.line()),
            AttachEvent::SessionChanged {
                from,
                to,
                processes,
                rules,
            } => Some(format!(
                "re-attached to session {} instead of {}: ended {processes} background \
                 process{} of session {} and forgot its {rules} remembered answer{}",
                printable(to),
                printable(from),
                if *processes == 1 { "" } else { "es" },
                printable(from),
                if *rules == 1 { "" } else { "s" },
            )),
            // Words that may be the server's (up to a message's size), bounded.
            AttachEvent::Elsewhere { host, reason } => Some(format!(
                "{}: attaching there ({})",
                shown_reason(reason),
                shown_name(host)
            )),
            AttachEvent::Disconnected { reason, retry_in } => Some(format!(
                "{}; reconnecting in {:.1} s",
                shown_reason(reason),
                retry_in.as_secs_f64()
            )),
            AttachEvent::Decided {
                tool,
                target,
                allowed: true,
                basis,
            } => Some(format!("▶ {tool} {target} ({}): started", basis.describe())),
            // A prompt shows its own answer.
            AttachEvent::Decided {
                basis: Basis::User | Basis::Timeout,
                ..
            } => None,
            AttachEvent::Decided {
                tool,
                target,
                allowed: false,
                basis,
            } => Some(format!("✗ {tool} {target} ({})", basis.describe())),
            AttachEvent::Finished { tool, target, end } => {
                let mark = if end.succeeded() { '✓' } else { '✗' };
                Some(format!("{mark} {tool} {target}: {}", end.describe()))
            }
        }
    }
}

/// Connections the network policy refused a folder's commands, in one batch of the audit's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkRefused {
    /// The first one refused: its `host:port` and why.
    pub first: String,
    /// How many more: refused, or only counted by the audit (past its rate, whether allowed or
    /// not).
    pub more: u64,
}

impl NetworkRefused {
    /// The refused connections of `batch`, when there are any.
    fn of(batch: &monad_sandbox::NetworkBatch) -> Option<NetworkRefused> {
        let mut refused = batch.events.iter().filter(|e| !e.allowed);
        let first = refused.next()?;
        let why = first
            .reason
            .as_deref()
            .map(|why| format!(" ({why})"))
            .unwrap_or_default();
        Some(NetworkRefused {
            first: format!("{}:{}{why}", first.host, first.port),
            more: refused.count() as u64 + batch.dropped,
        })
    }

    fn line(&self) -> String {
        let more = match self.more {
            0 => String::new(),
            n => format!(" (and {n} more asked for)"),
        };
        format!(
            "network: the folder's policy refused a command's connection to {}{more}",
            printable(&self.first)
        )
    }
}

/// How an allowed call ended, for the attach terminal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallEnd {
    /// It finished (a command: with exit code 0).
    Ok,
    /// A command exited with this code, not 0.
    Exited(i32),
    /// A command was ended by this signal.
    Signalled(i32),
    /// A command runs on in the background as this process.
    Background(String),
    /// It failed with this error code.
    Failed(ErrorCode),
    /// Its time limit ran out (a command was killed).
    TimedOut,
    /// A `process_kill` sent nothing: the process had exited meanwhile.
    NotDelivered,
    /// A `process_write` stopped partway (the process stopped reading, or closed its input):
    /// the error's code and what it says of the part the process took.
    WriteCut(ErrorCode, String),
    /// The agent withdrew the call (or the connection to the server ended) while it ran; a
    /// command was killed. What it did before that stays done.
    Cancelled,
}

impl CallEnd {
    /// How a call of `tool` with `outcome` ended.
    pub fn of(tool: ToolName, outcome: &Outcome) -> CallEnd {
        match outcome {
            // Part of the text the owner approved may have reached the process: said, with how
            // much (the error says so), not as a plain failure.
            Outcome::Error { error }
                if tool == ToolName::ProcessWrite && error.message.contains(WRITE_TOOK) =>
            {
                let took = &error.message[error.message.find(WRITE_TOOK).unwrap_or(0)..];
                // What it took, not what the agent is told to send next.
                let took = took.split(": send").next().unwrap_or(took);
                CallEnd::WriteCut(error.code, monad_protocol::text::head(took, 200).to_owned())
            }
            Outcome::Error { error } if error.code == ErrorCode::Timeout => CallEnd::TimedOut,
            Outcome::Error { error } => CallEnd::Failed(error.code),
            Outcome::Ok { result } if tool == ToolName::ProcessKill => {
                match result.value().get("delivered") {
                    Some(serde_json::Value::Bool(false)) => CallEnd::NotDelivered,
                    _ => CallEnd::Ok,
                }
            }
            Outcome::Ok { .. } if tool != ToolName::RunCommand => CallEnd::Ok,
            Outcome::Ok { result } => {
                // Read from the tree or the text as it is: neither is copied for it.
                let Ok(ran) = result.decode::<RunCommandResult>() else {
                    return CallEnd::Ok;
                };
                match (ran.timed_out, ran.process, ran.exit_code, ran.signal) {
                    (true, ..) => CallEnd::TimedOut,
                    (false, Some(process), ..) => CallEnd::Background(process),
                    (false, None, _, Some(signal)) => CallEnd::Signalled(signal),
                    (false, None, Some(code), None) if code != 0 => CallEnd::Exited(code),
                    (false, None, _, None) => CallEnd::Ok,
                }
            }
        }
    }

    /// Whether it did what was asked.
    pub fn succeeded(&self) -> bool {
        match self {
            CallEnd::Ok | CallEnd::Background(_) => true,
            CallEnd::Exited(_)
            | CallEnd::Signalled(_)
            | CallEnd::Failed(_)
            | CallEnd::TimedOut
            | CallEnd::NotDelivered
            | CallEnd::WriteCut(..)
            | CallEnd::Cancelled => false,
        }
    }

    /// In a few words, escaped.
    pub fn describe(&self) -> String {
        match self {
            CallEnd::Ok => "ok".into(),
            CallEnd::Exited(code) => format!("exit code {code}"),
            CallEnd::Signalled(signal) => format!("ended by signal {signal}"),
            CallEnd::Background(process) => {
                format!("runs on in the background as {}", printable(process))
            }
            CallEnd::Failed(code) => format!("error: {}", code.as_str()),
            CallEnd::TimedOut => "timed out".into(),
            CallEnd::NotDelivered => "not delivered: the process had exited".into(),
            CallEnd::WriteCut(code, took) => {
                format!("error: {}: {}", code.as_str(), printable(took))
            }
            CallEnd::Cancelled => {
                "cancelled while it ran (a command is killed; what it did so far stays done)".into()
            }
        }
    }
}

/// Longest target a call's lines show, in characters ([`line_target`]).
const TARGET_SHOWN: usize = 200;

/// A call's target as its lines (started, ended) show it: at most [`TARGET_SHOWN`] characters,
/// its middle said as what it leaves out. An argument of 100 KB (a command line, a path) made
/// each of its lines that long, pushing the rest of the attach's lines off the screen. The
/// prompt is given the call whole (a field too long to draw there is paged whole).
fn line_target(target: String) -> String {
    crate::prompt::middle_said(target.into(), TARGET_SHOWN, "").into_owned()
}

/// A name the server sent (a session, a workspace) as a line shows it: escaped, and at most
/// [`TARGET_SHOWN`] characters (a server could send 64 KiB of one).
fn shown_name(name: &str) -> String {
    line_target(printable(name).into_owned())
}

/// Why an attachment ended or moved, as its line shows it: escaped, and at most
/// [`REASON_SHOWN`] characters (a server's reason may be 64 KiB, drawn again at every
/// reconnect; this client's own reasons are a few hundred).
fn shown_reason(reason: &str) -> String {
    crate::prompt::middle_said(printable(reason), REASON_SHOWN, "").into_owned()
}

/// The longest reason an attach line shows whole, in characters.
const REASON_SHOWN: usize = 1_000;

/// Says [`CallEnd::Cancelled`] when dropped before [`Running::end`]: the call's future was
/// dropped (the agent cancelled, or the connection ended) while it ran.
struct Running {
    events: Option<mpsc::UnboundedSender<AttachEvent>>,
    tool: ToolName,
    target: String,
    ended: bool,
}

impl Running {
    fn end(mut self, outcome: &Outcome) {
        self.ended = true;
        self.send(CallEnd::of(self.tool, outcome));
    }

    fn send(&self, end: CallEnd) {
        if let Some(events) = &self.events {
            let _ = events.send(AttachEvent::Finished {
                tool: self.tool,
                target: self.target.clone(),
                end,
            });
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.ended {
            self.send(CallEnd::Cancelled);
        }
    }
}

/// Everything a request handler needs, shared across reconnects.
struct Folder {
    sandbox: Arc<Sandbox>,
    policy: Policy,
    approver: Option<Arc<dyn Approver>>,
    options: AttachOptions,
    events: Option<mpsc::UnboundedSender<AttachEvent>>,
    /// The session of the latest attach, to tell a re-attach into another one.
    session: std::sync::Mutex<Option<String>>,
    /// The name the session lists the folder under (`alpha-2` when `alpha` was taken), once
    /// attached: what its prompts call it.
    listed_as: std::sync::Mutex<Option<String>>,
    /// The connections its commands ask the network proxy for, as they happen: sent to the
    /// server (by one connection at a time) for the session's audit log.
    network: tokio::sync::Mutex<Option<NetworkAudit>>,
    /// What its requests hold in memory at once.
    requests: RequestMemory,
    /// The session that started each background process the folder keeps. A folder serves
    /// every session of its user it is shared into (an MCP host's landing, `sessions --new`),
    /// one process table for all: a session's process tools see and reach its own processes
    /// only. Pruned to what the table keeps at each start, so bounded by it.
    started: std::sync::Mutex<Vec<(String, String)>>,
}

impl Folder {
    /// The folder's name for its owner: the one the session lists it under, else the one asked
    /// for, else its path.
    fn shown_name(&self) -> String {
        let listed = self.listed_as.lock().unwrap_or_else(|p| p.into_inner());
        listed
            .clone()
            .or_else(|| self.options.name.clone())
            .unwrap_or_else(|| self.options.shown_path.clone())
    }

    fn emit(&self, event: AttachEvent) {
        if let Some(events) = &self.events {
            let _ = events.send(event);
        }
    }

    fn started(&self) -> std::sync::MutexGuard<'_, Vec<(String, String)>> {
        self.started.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes that `session` started background process `id`, forgetting the processes the
    /// folder's table no longer keeps.
    fn note_started(&self, id: &str, session: &str) {
        let mut started = self.started();
        started.retain(|(process, _)| process != id && self.sandbox.keeps_process(process));
        started.push((id.to_owned(), session.to_owned()));
    }

    /// What a full process table means for `session` when the folder keeps processes other
    /// sessions started (it is shared into several of its user's): how many of its places they
    /// hold, which this session can neither see nor free.
    async fn others_in_table(&self, session: &str) -> Option<String> {
        let listed = self
            .sandbox
            .call(ToolName::ProcessList, serde_json::json!({}))
            .await
            .ok()?;
        let list = serde_json::from_value::<ProcessListResult>(listed).ok()?;
        let others = list
            .processes
            .iter()
            .filter(|p| !self.started_by(&p.process, session))
            .count();
        (others > 0).then(|| {
            format!(
                "{others} of them {} other sessions' of this folder, which this session cannot \
                 see or end: they are freed when those sessions read or end them, or when the \
                 folder is attached again",
                if others == 1 { "is" } else { "are" }
            )
        })
    }

    /// Whether `session` started background process `id`.
    fn started_by(&self, id: &str, session: &str) -> bool {
        self.started()
            .iter()
            .any(|(process, by)| process == id && by == session)
    }
}

/// Attaches `options.dir` and serves it until a fatal error (a refused token, a changed
/// certificate, a folder that cannot be opened); network failures are retried with backoff.
/// Dropping the future detaches.
pub async fn attach(
    config: &ClientConfig,
    options: AttachOptions,
    approver: Option<Arc<dyn Approver>>,
    events: Option<mpsc::UnboundedSender<AttachEvent>>,
) -> Result<(), ClientError> {
    // A folder is known by its path as text (its URI, its workspace record, an MCP root
    // matched against it): two paths that differ only in bytes that are not UTF-8 would read
    // alike, and one would take the other over.
    if options.dir.to_str().is_none() {
        return Err(ClientError::Folder(format!(
            "{}: its path is not valid UTF-8, and a folder is known by its path as text; \
             rename it (or the directory that holds it) so that its path is",
            options.dir.display()
        )));
    }
    let sandbox = Sandbox::open(&options.dir, options.limits.clone(), options.exec.clone())
        .map_err(|e| ClientError::Folder(format!("{}: {e}", options.dir.display())))?;
    if !sandbox
        .jail()
        .dir()
        .dir_metadata()
        .is_ok_and(|m| m.is_dir())
    {
        return Err(ClientError::Folder(format!(
            "{} is not a directory",
            options.dir.display()
        )));
    }
    let network = tokio::sync::Mutex::new(sandbox.take_network_audit());
    let requests = RequestMemory::new(options.requests_held_max);
    let folder = Arc::new(Folder {
        network,
        requests,
        sandbox: Arc::new(sandbox),
        policy: Policy::new(options.trust, options.allow.clone()),
        approver,
        events,
        options,
        session: std::sync::Mutex::new(None),
        listed_as: std::sync::Mutex::new(None),
        started: std::sync::Mutex::new(Vec::new()),
    });
    let (first_wait, max_wait) = folder.options.backoff;
    let mut wait = first_wait;
    let mut stop = folder.options.stop.clone();
    // The host whose connection was lost last: it may be down, so the deployment's other hosts
    // are tried first.
    let mut lost: Option<String> = None;
    // The host the last attach was sent to (another host of the deployment serves the session
    // and keeps it): tried alone, at once; then the config's hosts again. Sent twice in a row,
    // the backoff's wait comes first (two hosts that each name the other while the session
    // moves between them).
    let mut elsewhere: Option<String> = None;
    let mut sent_elsewhere = false;
    loop {
        let sent_to = elsewhere.take();
        let servers = match &sent_to {
            Some(host) => vec![host.clone()],
            None => crate::connect::order(&config.addresses(), lost.as_deref()),
        };
        let reason = match serve_once(config, &servers, &folder).await {
            Ok(Served::Lost {
                server,
                reason,
                attached_for,
            }) => {
                wait = wait_after_lost(wait, attached_for, first_wait);
                sent_elsewhere = false;
                lost = Some(server);
                reason
            }
            Ok(Served::Stopped) => return Ok(()),
            Err(ClientError::Elsewhere { host, reason }) => {
                elsewhere = Some(host.clone());
                if !std::mem::replace(&mut sent_elsewhere, true) {
                    debug!("{}; attaching at {}", printable(&reason), printable(&host));
                    folder.emit(AttachEvent::Elsewhere { host, reason });
                    continue;
                }
                format!("{reason}; to be attached there ({host})")
            }
            // The host it was sent to cannot be reached from here, or is not of this
            // deployment (another certificate): the hosts of its config again, in turn.
            Err(
                e @ (ClientError::Unreachable(_)
                | ClientError::FingerprintMismatch { .. }
                | ClientError::Protocol(_)),
            ) if sent_to.is_some() => {
                sent_elsewhere = false;
                let host = sent_to.as_deref().unwrap_or_default();
                match e {
                    // Not the mismatch's own advice (log in again with the new fingerprint):
                    // the user's pin is right, the address the folder was sent to is not.
                    ClientError::FingerprintMismatch { presented, .. } => format!(
                        "cannot attach at {host}, where the session is served: another \
                         certificate answers there (fingerprint {presented}), not this \
                         deployment's; the host that sent the folder there advertises a wrong \
                         address (its operator sets `serve --advertise`)"
                    ),
                    e => format!("cannot attach at {host}, where the session is served: {e}"),
                }
            }
            Err(e) if e.is_fatal() => return Err(e),
            Err(e) => {
                sent_elsewhere = false;
                e.to_string()
            }
        };
        // Said once, by the event's line on the attach terminal; the log has it at debug.
        debug!(
            "{}; reconnecting in {} ms",
            printable(&reason),
            wait.as_millis()
        );
        folder.emit(AttachEvent::Disconnected {
            reason,
            retry_in: wait,
        });
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = stopped(stop.as_mut()) => return Ok(()),
        }
        wait = (wait * 2).min(max_wait);
    }
}

/// How long an attachment must have lasted for its loss to start the backoff afresh.
const STEADY_ATTACHMENT: Duration = Duration::from_secs(2);

/// The wait before reconnecting after an attachment that lasted `attached_for` was lost: the
/// first again after one that held ([`STEADY_ATTACHMENT`]), else the backoff goes on (a server
/// that closed each attachment at once, or two hosts passing a lease to and fro, had the
/// folder reconnect five times a second for ever, a full handshake and its lines each time).
fn wait_after_lost(wait: Duration, attached_for: Duration, first: Duration) -> Duration {
    if attached_for >= STEADY_ATTACHMENT {
        first
    } else {
        wait
    }
}

/// How a connection's attachment ended.
enum Served {
    /// The connection to `server` was lost (why): reconnect.
    Lost {
        /// The host it was attached through.
        server: String,
        /// Why the connection ended.
        reason: String,
        /// How long it was attached (from the server's answer to the attach).
        attached_for: Duration,
    },
    /// [`AttachOptions::stop`] turned true: detached, and the server told.
    Stopped,
}

/// Resolves once `stop` turns true; never without one.
async fn stopped(stop: Option<&mut tokio::sync::watch::Receiver<bool>>) {
    match stop {
        Some(stop) => {
            if stop.wait_for(|s| *s).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// What the server says on an attach stream after `attached`: the attachment ended
/// ([`Message::Detached`], why), returned; the session's focus moved to or from the folder
/// ([`Message::Focused`]), told to its owner. Pending forever otherwise (an older server says
/// nothing).
async fn next_notice(recv: &mut quinn::RecvStream, folder: &Folder) -> String {
    loop {
        match read_message(recv, 64 * 1024).await {
            Ok(Some(Message::Detached { reason, .. })) => return reason,
            Ok(Some(Message::Focused {
                focus,
                now,
                session,
                ..
            })) => {
                folder.emit(AttachEvent::FocusMoved {
                    focus,
                    now,
                    session,
                });
            }
            Ok(Some(other)) => debug!("ignored `{}` on the attach stream", other.kind()),
            Ok(None) | Err(_) => return std::future::pending().await,
        }
    }
}

/// One connection's life: connect (to the first of `servers` that answers), attach, serve
/// requests until the connection ends. `Ok` means it was attached and then lost (the reason) or
/// stopped, `Err` that it never got attached, or that the server ended the attachment
/// ([`ClientError::Detached`]).
async fn serve_once(
    config: &ClientConfig,
    servers: &[String],
    folder: &Arc<Folder>,
) -> Result<Served, ClientError> {
    let mut stop = folder.options.stop.clone();
    let connection = tokio::select! {
        connected = connect_in_order(config, Role::Client, servers) => connected?,
        () = stopped(stop.as_mut()) => return Ok(Served::Stopped),
    };
    let conn = connection.conn.clone();
    let o = &folder.options;
    // An older server refuses a field it does not know: asked only of one that knows it.
    let focus = o.focus && connection.minor >= FOCUS_MINOR;
    // What an MCP host's roots are matched against: the folder as this device names it, whole.
    let absolute = (connection.minor >= ROOTS_MINOR && o.dir.is_absolute())
        .then(|| o.dir.to_str().map(str::to_owned))
        .flatten();
    let asked = async {
        let (mut send, mut recv) = conn
            .open_bi()
            .await
            .map_err(|e| ClientError::Unreachable(e.to_string()))?;
        write_message(
            &mut send,
            &Message::Attach {
                id: ATTACHMENT_ID,
                session: o.session.clone(),
                name: o.name.clone(),
                path: o.shown_path.clone(),
                trust: o.trust,
                tools: o.tools.clone(),
                focus,
                folder: absolute,
                exact_name: o.exact_name && o.name.is_some() && connection.minor >= CLI_MINOR,
                network: (connection.minor >= NETWORK_POLICY_MINOR)
                    .then(|| o.exec.network_summary()),
            },
        )
        .await
        .map_err(|e| ClientError::Unreachable(e.to_string()))?;
        let answer = read_message(&mut recv, 64 * 1024).await;
        Ok::<_, ClientError>((send, recv, answer))
    };
    // A server that never answers (or never grants the stream) neither keeps the owner's
    // Ctrl-C from detaching nor holds the folder for ever: it is tried again, as one that
    // cannot be reached.
    let (mut send, mut recv, answer) = tokio::select! {
        asked = tokio::time::timeout(ATTACH_ANSWER_WAIT, asked) => match asked {
            Ok(asked) => asked?,
            Err(_) => {
                connection.close("no answer to attach").await;
                return Err(ClientError::Unreachable(format!(
                    "{} did not answer the attach within {} s",
                    connection.server,
                    ATTACH_ANSWER_WAIT.as_secs()
                )));
            }
        },
        () = stopped(stop.as_mut()) => {
            connection.close("detached").await;
            return Ok(Served::Stopped);
        }
    };
    match answer {
        Ok(Some(Message::Attached {
            session, workspace, ..
        })) => {
            // An older server makes a taken name unique instead of refusing it: the folder
            // leaves again, and the user hears why.
            if let Some(wanted) = o.name.as_deref().filter(|_| o.exact_name)
                && workspace.name != wanted
            {
                connection.close("the name is taken").await;
                return Err(ClientError::Refused(ToolError::new(
                    ErrorCode::AlreadyExists,
                    format!(
                        "the name `{}` is taken in session {} (the server offered `{}`): \
                         choose another --name",
                        printable(wanted),
                        printable(&session),
                        printable(&workspace.name)
                    ),
                )));
            }
            info!(
                session = %printable(&session),
                workspace = %printable(&workspace.name),
                uri = %printable(&workspace.uri),
                server = %connection.server,
                "attached"
            );
            // Before any request of the new session is served: what the earlier session left
            // in this folder (background processes, "always" answers) is not the new one's.
            let earlier = folder
                .session
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .replace(session.clone());
            let changed = earlier.filter(|earlier| *earlier != session).map(|from| {
                let processes = folder.sandbox.end_processes();
                folder.started().clear();
                let rules = folder.policy.forget(&from);
                AttachEvent::SessionChanged {
                    from,
                    to: session.clone(),
                    processes,
                    rules,
                }
            });
            *folder.listed_as.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(workspace.name.clone());
            folder.emit(AttachEvent::Attached {
                session,
                workspace,
                server: connection.server.clone(),
            });
            if o.focus {
                folder.emit(AttachEvent::Focus { set: focus });
            }
            if let Some(changed) = changed {
                // Said once, by the event's line on the attach terminal.
                debug!("{}", changed.line().unwrap_or_default());
                folder.emit(changed);
            }
        }
        Ok(Some(Message::Error { error, .. })) => return Err(ClientError::Refused(error)),
        Ok(Some(Message::Elsewhere { host, reason, .. }))
            if connection.minor >= ELSEWHERE_MINOR =>
        {
            connection.close("attaching at another host").await;
            // Connected to with the same pinned certificate, so the token goes there only if
            // it holds the deployment's key. An address that names no host is not followed:
            // tried again, as a refusal (the hosts of the config, in turn).
            return match monad_protocol::address::check_destination(&host) {
                Ok(()) => Err(ClientError::Elsewhere { host, reason }),
                Err(why) => Err(ClientError::Refused(ToolError::new(
                    ErrorCode::WorkspaceDisconnected,
                    format!(
                        "{reason}; its address cannot be attached at ({}: {why})",
                        printable(&host)
                    ),
                ))),
            };
        }
        Ok(Some(other)) => {
            return Err(ClientError::Protocol(format!(
                "the server answered attach with `{}`",
                other.kind()
            )));
        }
        Ok(None) | Err(_) => {
            return Err(ClientError::Unreachable(
                "the server closed the attach stream".into(),
            ));
        }
    }
    // `send` stays open: finishing it would detach. A server that takes them gets the folder's
    // network connections on it as they happen (an older one audits those a result carries).
    let bodies = connection.minor >= BODY_MINOR;
    let mut network = if connection.minor >= NETWORK_MINOR {
        Some(folder.network.lock().await)
    } else {
        None
    };
    let mut requests = tokio::task::JoinSet::new();
    let attached_at = std::time::Instant::now();
    let end = {
        // One reader for the whole attachment: a message is never cut by another branch.
        let notice = next_notice(&mut recv, folder);
        tokio::pin!(notice);
        // The folder's connections are written beside the loop, not inside one of its
        // branches: a server that stops granting the stream credit holds this writer only,
        // never the requests, the server's notices or the owner's Ctrl-C.
        let reporting = report_network(network.as_deref_mut(), &mut send, folder);
        tokio::pin!(reporting);
        loop {
            tokio::select! {
                notice = &mut notice => break Ended::Detached(notice),
                () = stopped(stop.as_mut()) => break Ended::Stopped,
                e = &mut reporting => {
                    break Ended::Lost(format!("connection to {} lost: {e}", connection.server));
                }
                accepted = conn.accept_bi() => match accepted {
                    Ok((send, recv)) => {
                        let folder = folder.clone();
                        requests.spawn(async move {
                            handle_request(&folder, bodies, send, recv).await
                        });
                    }
                    Err(e) => {
                        break Ended::Lost(format!("connection to {} lost: {e}", connection.server));
                    }
                },
                Some(_) = requests.join_next(), if !requests.is_empty() => {}
            }
        }
    };
    match end {
        Ended::Detached(notice) => {
            drop(requests);
            connection.close("detached by the server").await;
            Err(ClientError::Detached(notice))
        }
        Ended::Stopped => {
            // Calls in flight end here; the server hears at once that the folder left.
            drop(requests);
            let _ = send.finish();
            connection.close("detached").await;
            Ok(Served::Stopped)
        }
        Ended::Lost(reason) => {
            drop(send);
            Ok(Served::Lost {
                server: connection.server.clone(),
                reason,
                attached_for: attached_at.elapsed(),
            })
        }
    }
}

/// How an attachment's serving loop ended.
enum Ended {
    /// The server detached the folder, saying why.
    Detached(String),
    /// The owner stopped the attach.
    Stopped,
    /// The connection was lost.
    Lost(String),
}

/// The next connections to report; pending forever when there is nothing to report them from.
async fn next_network(feed: Option<&mut Option<NetworkAudit>>) -> Option<NetworkBatch> {
    match feed.and_then(Option::as_mut) {
        Some(feed) => feed.next().await,
        None => std::future::pending().await,
    }
}

/// Sends the folder's connections on the attach stream as they happen, [`MAX_NETWORK_EVENTS`]
/// a message, and tells the owner those the policy refused; returns only when the stream
/// fails.
async fn report_network(
    mut feed: Option<&mut Option<NetworkAudit>>,
    send: &mut quinn::SendStream,
    folder: &Folder,
) -> std::io::Error {
    loop {
        let Some(batch) = next_network(feed.as_deref_mut()).await else {
            return std::future::pending().await;
        };
        // The owner sees what the folder's commands were refused, not only the audit.
        if let Some(refused) = NetworkRefused::of(&batch) {
            folder.emit(AttachEvent::NetworkRefused(refused));
        }
        let mut dropped = batch.dropped;
        let mut events = batch.events;
        while !events.is_empty() || dropped > 0 {
            let rest = events.split_off(events.len().min(MAX_NETWORK_EVENTS));
            let message = Message::Network {
                attachment: ATTACHMENT_ID,
                events: std::mem::replace(&mut events, rest),
                dropped: std::mem::take(&mut dropped),
            };
            if let Err(e) = write_message(send, &message).await {
                return e;
            }
        }
    }
}

/// One request from the server: run a tool (after approval), or answer a probe; a run with
/// `if_present` is answered as a probe first, and runs only where the path is. `bodies`: the
/// server takes large results as bodies.
async fn handle_request(
    folder: &Folder,
    bodies: bool,
    mut send: quinn::SendStream,
    recv: quinn::RecvStream,
) {
    // A request is one message and the stream's end; that end, which may come after the
    // message, is read (`stream::let_go`), so that the server is not told to stop a stream it
    // finished.
    let mut recv = monad_protocol::stream::QuietRecv::new(recv);
    let mut held = Holding::new(&folder.requests);
    let read =
        monad_protocol::io::read_frames(&mut *recv, MAX_REQUEST, &mut |n| held.take(n)).await;
    let request = match read {
        Ok(Some(bytes)) => {
            recv.let_go();
            decode_request(&bytes, &mut held).map(Some)
        }
        Ok(None) => Ok(None),
        Err(monad_protocol::io::ReadError::Refused) => {
            // The rest is read and let go, not held, so that the server, still sending it,
            // reads the answer (a stream stopped under it reads as the folder gone).
            let mut rest = tokio::io::AsyncReadExt::take(&mut *recv, MAX_REQUEST as u64);
            let _ = tokio::io::copy(&mut rest, &mut tokio::io::sink()).await;
            recv.let_go();
            Err(held.refused("the request"))
        }
        Err(e) => Err(e.to_tool_error()),
    };
    let request = match request {
        Ok(Some(m)) => m,
        Ok(None) => return,
        // Too much to hold: a result, which the server passes on to the agent as the call's
        // failure (an `error` reads there as a client that does not speak the protocol).
        Err(error) if error.code == ErrorCode::LimitExceeded => {
            let answer = Message::Result {
                id: 0,
                workspace: None,
                outcome: Outcome::Error { error },
                body: None,
            };
            let _ = write_message(&mut send, &answer).await;
            let _ = send.finish();
            return;
        }
        Err(error) => {
            let _ = write_message(&mut send, &Message::Error { id: 0, error }).await;
            let _ = send.finish();
            return;
        }
    };
    match request {
        Message::Probe { id, path, .. } => {
            let _ = write_message(&mut send, &presence(folder, id, &path).await).await;
            let _ = send.finish();
        }
        Message::Run {
            id,
            session,
            tool,
            args,
            if_present,
            ..
        } => {
            // Asked to run only where the path is: first the probe's answer; where the path is
            // not, nothing is checked, nobody is asked and nothing runs.
            if let Some(path) = if_present {
                let answer = presence(folder, id, &path).await;
                let said = write_message(&mut send, &answer).await;
                if !matches!(answer, Message::Probed { exists: true, .. }) || said.is_err() {
                    let _ = send.finish();
                    return;
                }
            }
            let stopped = send.stopped();
            let run = run(folder, &mut held, &mut send, id, &session, tool, args);
            let (outcome, decided) = tokio::select! {
                // The server stopped reading: the agent cancelled, or routing gave up on a
                // `run` with `if_present` whose `probed` came too late. Dropping `run`
                // withdraws a pending prompt and kills a running command; a stop already there
                // comes first, so that a run the server gave up on does not start.
                biased;
                _ = stopped => return,
                ran = run => ran,
            };
            let _ = send_result(&mut send, id, decided, outcome, bodies).await;
            let _ = send.finish();
        }
        other => {
            let _ = write_message(
                &mut send,
                &Message::Error {
                    id: 0,
                    error: ToolError::new(
                        ErrorCode::Malformed,
                        format!("a server cannot send `{}` to a client", other.kind()),
                    ),
                },
            )
            .await;
            let _ = send.finish();
        }
    }
}

/// The answer to a probe of `path` (or the probe a `run` carries): `probed`, or an `error` when
/// the folder could not be looked in, which the server takes as "could not be asked", not "no"
/// (a write must not go elsewhere while the file may be here).
async fn presence(folder: &Folder, id: u64, path: &str) -> Message {
    match folder.sandbox.exists_async(path).await {
        Ok(exists) => Message::Probed { id, exists },
        Err(e) => Message::Error {
            id,
            error: e.to_tool_error(),
        },
    }
}

/// Sends a run's `decided` (if it got that far) and result in one write: a large `content` as a
/// raw body after them (when `bodies`), moved into one chunk that quinn sends without copying it
/// again.
async fn send_result(
    send: &mut quinn::SendStream,
    id: u64,
    decided: Option<Message>,
    mut outcome: Outcome,
    bodies: bool,
) -> std::io::Result<()> {
    let body = if bodies { outcome.split_body() } else { None };
    let head = Message::Result {
        id,
        workspace: None,
        outcome,
        body: body.as_ref().map(|(body, _)| body.clone()),
    };
    match &decided {
        Some(decided) => write_messages(send, &[decided, &head]).await?,
        None => write_message(send, &head).await?,
    }
    if let Some((_, bytes)) = body {
        send.write_chunk(bytes::Bytes::from(bytes)).await?;
    }
    Ok(())
}

/// Checks, approves, then runs, one tool call. Returns its outcome and, when a decision was made
/// and not sent yet, the `decided` message for the server's audit log (sent with the result, so
/// that both share a packet).
///
/// A call that cannot run ([`Sandbox::check`]) is refused at once, before the policy and before
/// anyone is asked; no `decided` goes out for it (nobody decided).
async fn run(
    folder: &Folder,
    held: &mut Holding<'_>,
    send: &mut quinn::SendStream,
    id: u64,
    session: &str,
    tool: ToolName,
    args: Value,
) -> (Outcome, Option<Message>) {
    let o = &folder.options;
    // As the tool will read them: the prompt, the rule and the run see the same numbers
    // (`"background_after_ms": 1000.0` showed no background and the default time-out).
    let args = monad_protocol::tools::with_whole_numbers(args);
    // The prompt shows the call whole; its lines (decided, started, ended) show its ends.
    let described = describe(tool, &args);
    let target = line_target(described.clone());
    let ran = |allowed: bool, basis: Basis| AttachEvent::Decided {
        tool,
        target: target.clone(),
        allowed,
        basis,
    };
    if !o.tools.contains(&tool) {
        let outcome = error(
            ErrorCode::Denied,
            format!("this folder does not offer `{tool}`"),
        );
        return (outcome, None);
    }
    // Another session's background process (the folder is shared into several of its user's
    // sessions) is answered as one that is not there, before anyone is asked: neither its
    // output, its input nor its end are this session's.
    // (Arguments that are not right are the check's to refuse, below, as for any call.)
    let named = match tool {
        ToolName::ProcessRead => tool
            .decode_args_ref::<ProcessReadArgs>(&args)
            .map(|a| a.process),
        ToolName::ProcessWrite => tool
            .decode_args_ref::<ProcessWriteArgs>(&args)
            .map(|a| a.process),
        ToolName::ProcessKill => tool
            .decode_args_ref::<ProcessKillArgs>(&args)
            .map(|a| a.process),
        _ => Err(String::new()),
    };
    if let Ok(id) = named
        && !folder.started_by(&id, session)
    {
        let error = Sandbox::no_such_process(&id).to_tool_error();
        return (Outcome::Error { error }, None);
    }
    let may_outlive = monad_protocol::tools::may_outlive_its_call(tool.as_str(), &args);
    // What "always" would cover depends on where a command's program is found, and where it
    // really runs when a link on its `cwd`'s way leads elsewhere (`out` leading to the root:
    // `rm -rf ./*` in `out` is not what it reads as). The owner is shown both.
    let place = command_place(folder, tool, &args).await;
    let rule = Rule::of(tool, &args, &place);
    let keeps_lookup = matches!(rule, Rule::Command { .. });
    let known = folder.policy.check(session, tool, &rule);
    // Checked before the policy answers or anyone is asked. For a write or an edit that will be
    // asked about, the check is the preview, whose diff the prompt shows.
    let asking = known.is_none() && folder.approver.is_some();
    let checked = if asking && matches!(tool, ToolName::WriteFile | ToolName::EditFile) {
        let sandbox = folder.sandbox.clone();
        let preview_args = args.clone();
        tokio::task::spawn_blocking(move || sandbox.preview(tool, &preview_args))
            .await
            .unwrap_or_else(|e| {
                Err(monad_sandbox::SandboxError::Io {
                    op: "check",
                    path: String::new(),
                    source: std::io::Error::other(e.to_string()),
                })
            })
    } else {
        folder.sandbox.check_async(tool, &args).await.map(|()| None)
    };
    // A write's diff waits with it for its owner: counted with the request.
    let checked = checked.and_then(|preview| match &preview {
        Some(p) if !held.take(p.diff.len()) => Err(monad_sandbox::SandboxError::LimitExceeded(
            held.refused("this write's diff").message,
        )),
        _ => Ok(preview),
    });
    let preview = match checked {
        Ok(preview) => preview,
        Err(e) => {
            debug!(%tool, "refused before asking: {e}");
            folder.emit(ran(false, Basis::Invalid));
            let mut error = e.to_tool_error();
            // A full table of a shared folder may be full of what this session cannot see.
            if may_outlive
                && error.code == ErrorCode::LimitExceeded
                && let Some(note) = folder.others_in_table(session).await
            {
                error.message = format!("{}; {note}", error.message);
            }
            return (Outcome::Error { error }, None);
        }
    };
    // A read whose path leads elsewhere through a symbolic link (`CONTRIBUTING.md` to
    // `.git/config`) shows where: its owner is asked about the file it reads.
    let read_place = if asking {
        reached_through_link(folder, tool, &args).await
    } else {
        None
    };
    let mut approved = None;
    let (verdict, basis) = match known {
        Some(known) => known,
        None => match &folder.approver {
            None if o.non_interactive => (
                Verdict::Deny(nobody_to_ask(tool, &o.attach_again(tool.class()), true)),
                Basis::NonInteractive,
            ),
            None => (
                Verdict::Deny(nobody_to_ask(tool, &o.attach_again(tool.class()), false)),
                Basis::NoTerminal,
            ),
            Some(approver) => {
                let _ = write_message(
                    send,
                    &Message::Progress {
                        id,
                        message: format!(
                            "waiting for the user of {} to approve `{tool}`",
                            o.shown_path
                        ),
                    },
                )
                .await;
                // Which program a process tool acts on: what decides what written text does.
                let process = match tool {
                    ToolName::ProcessWrite | ToolName::ProcessKill => {
                        process_info(&folder.sandbox, &args).await
                    }
                    _ => None,
                };
                // A write or an edit is made as its owner was shown it, or not at all: only
                // the directories shown are made, and only the version of the file the diff
                // was made from is replaced (the folder may change while the prompt waits).
                // The diff goes to the prompt; the rest stays for the call.
                let mut shown = preview;
                let diff = shown.as_mut().map(|p| std::mem::take(&mut p.diff));
                let creates = shown.as_ref().map_or_else(Vec::new, |p| p.creates.clone());
                let through_link = shown
                    .as_ref()
                    .and_then(|p| p.through_link.clone())
                    .or_else(|| read_place.clone());
                let bytes_note = shown.as_ref().and_then(|p| p.bytes_note.clone());
                approved = shown;
                let request = ApprovalRequest {
                    process,
                    session: session.to_owned(),
                    workspace: folder.shown_name(),
                    folder: folder.options.shown_path.clone(),
                    tool,
                    target: described,
                    diff,
                    creates,
                    through_link,
                    bytes_note,
                    runs_in: place.runs_in.clone(),
                    program: (tool == ToolName::RunCommand).then(|| place.site.shown()),
                    network: o.exec.network_summary(),
                    default_timeout_ms: o.limits.command_default_timeout_ms,
                    scope: rule.scope(session),
                    deadline: std::time::Instant::now() + o.prompt_timeout,
                    args: args.clone(),
                };
                match tokio::time::timeout(o.prompt_timeout, approver.decide(request)).await {
                    Ok(decision) => (folder.policy.record(session, rule, decision), Basis::User),
                    Err(_) => (Verdict::Deny(String::new()), Basis::Timeout),
                }
            }
        },
    };
    // For the server's audit log: who decided. The server cannot change the decision.
    let decided = Message::Decided {
        id,
        allowed: verdict == Verdict::Allow,
        by: basis.decider(),
    };
    if let Verdict::Deny(reason) = verdict {
        debug!(%tool, "denied");
        folder.emit(ran(false, basis));
        let outcome = if basis == Basis::Timeout {
            error(
                ErrorCode::Timeout,
                format!(
                    "nobody answered: the user of {} did not answer the prompt within {} s, so \
                     the call was not run",
                    o.shown_path,
                    // Not `as_secs`: a time-out under a second would read "within 0 s".
                    o.prompt_timeout.as_secs_f64()
                ),
            )
        } else {
            error(ErrorCode::Denied, reason)
        };
        return (outcome, Some(decided));
    }
    // A read reads what its owner was shown: a link made or swapped while they were asked
    // would have it read another file.
    if basis == Basis::User
        && tool.class() == monad_protocol::tools::ToolClass::Read
        && reached_through_link(folder, tool, &args).await != read_place
    {
        folder.emit(ran(false, Basis::Invalid));
        return changed_while_asked(
            id,
            "the folder changed while the call waited for approval: its path no longer leads \
             where its user was shown; nothing was read (call again to be asked about what it \
             reads now)"
                .into(),
        );
    }
    // A command runs where, and as what, its owner was shown it would: a link on its
    // directory's way swapped while they were asked (by a command already running) would take
    // an approved `rm` to another place, and a `.venv/bin/python3` made meanwhile would run
    // instead of the `/usr/bin/python3` they approved.
    if tool == ToolName::RunCommand && basis == Basis::User {
        let now = command_place(folder, tool, &args).await;
        let shown = |p: &Option<String>| p.clone().unwrap_or_else(|| "where its `cwd` says".into());
        let changed = if now.site != place.site {
            Some(format!(
                "its program is now {}, not {}",
                now.site.shown(),
                place.site.shown()
            ))
        } else if now.runs_in != place.runs_in {
            Some(format!(
                "its directory now leads to {}, not {}",
                shown(&now.runs_in),
                shown(&place.runs_in)
            ))
        } else if keeps_lookup
            // One too large to pin is another each time: the owner was told they would be
            // asked each time, and they just were.
            && !(now.lookup.too_large && place.lookup.too_large)
            && now.lookup != place.lookup
        {
            Some(format!(
                "a program it may start by name was added, changed or removed in {}",
                now.lookup.shown_dirs()
            ))
        } else {
            None
        };
        if let Some(changed) = changed {
            folder.emit(ran(false, Basis::Invalid));
            return changed_while_asked(
                id,
                format!(
                    "the folder changed while the command waited for approval: {changed} as its \
                     user was shown; nothing was run (call again to be asked about what it \
                     would run now)"
                ),
            );
        }
    }
    // A command may run long, and a user's answer deserves to be on record: the decision goes
    // out now, so the audit log keeps it even if the connection is lost before the result.
    // Otherwise it goes with the result, in the same packet.
    let decided = if basis == Basis::User || tool == ToolName::RunCommand {
        let _ = write_message(send, &decided).await;
        None
    } else {
        Some(decided)
    };
    // Said now, not when it ends: a long command, or one the agent cancels, is seen running.
    folder.emit(ran(true, basis));
    let running = Running {
        events: folder.events.clone(),
        tool,
        target: target.clone(),
        ended: false,
    };
    // A long command says how it is going (how long, its latest line), relayed as progress.
    let (lines, mut progress) = mpsc::unbounded_channel::<String>();
    let relay = move |line: &str| {
        let _ = lines.send(line.to_owned());
    };
    let sandbox = folder.sandbox.clone();
    let call = async {
        match approved {
            Some(approved) => sandbox
                .call_approved(tool, args, approved)
                .await
                .map(ToolResult::from),
            // Encoded for the wire at once, not made a tree first.
            None => sandbox.call_for_wire(tool, args, Some(&relay)).await,
        }
    };
    tokio::pin!(call);
    let answer = loop {
        tokio::select! {
            answer = &mut call => break answer,
            Some(message) = progress.recv() => {
                let _ = write_message(send, &Message::Progress { id, message }).await;
            }
        }
    };
    let outcome = match answer {
        Ok(result) => Outcome::Ok {
            result: owned_processes(folder, session, tool, may_outlive, result),
        },
        Err(e) => Outcome::Error {
            error: e.to_tool_error(),
        },
    };
    running.end(&outcome);
    (outcome, decided)
}

/// A result as `session` may have it: a command's background process noted as the session's
/// (before the result, with its id, goes out), and a `process_list` cut to the session's own.
fn owned_processes(
    folder: &Folder,
    session: &str,
    tool: ToolName,
    may_outlive: bool,
    result: ToolResult,
) -> ToolResult {
    match tool {
        // Only a command that may go to the background is looked into (its output may be
        // megabytes).
        ToolName::RunCommand if may_outlive => {
            #[derive(serde::Deserialize)]
            struct Started {
                process: Option<String>,
            }
            if let Ok(Started { process: Some(id) }) = result.decode::<Started>() {
                folder.note_started(&id, session);
            }
            result
        }
        ToolName::ProcessList => match result.decode::<ProcessListResult>() {
            Ok(mut list) => {
                list.processes
                    .retain(|p| folder.started_by(&p.process, session));
                serde_json::to_value(list)
                    .map_or_else(|_| ToolResult::from(no_processes()), ToolResult::from)
            }
            // Not a listing this client can read: nothing of it is shown.
            Err(_) => ToolResult::from(no_processes()),
        },
        _ => result,
    }
}

fn no_processes() -> Value {
    serde_json::json!({"processes": []})
}

/// The entry of this folder's process table for the process `args` names, if it is there.
async fn process_info(sandbox: &Arc<Sandbox>, args: &Value) -> Option<ProcessInfo> {
    let id = args.get("process").and_then(Value::as_str)?;
    let listed = sandbox
        .call(ToolName::ProcessList, serde_json::json!({}))
        .await
        .ok()?;
    let list: ProcessListResult = serde_json::from_value(listed).ok()?;
    list.processes.into_iter().find(|p| p.process == id)
}

/// The answer to call `id`, approved, that the folder changed under while its owner was asked
/// (`why`): denied, and on record as refused by the client, which it was: nothing ran.
fn changed_while_asked(id: u64, why: String) -> (Outcome, Option<Message>) {
    let decided = Message::Decided {
        id,
        allowed: false,
        by: Basis::Invalid.decider(),
    };
    (error(ErrorCode::Denied, why), Some(decided))
}

/// Where a read-only call's `path` really is, relative to the folder, when a symbolic link on
/// the way makes it another place than the path says; `None` when it is where it says, cannot
/// be found, or the tool reads no path.
async fn reached_through_link(folder: &Folder, tool: ToolName, args: &Value) -> Option<String> {
    if tool.class() != monad_protocol::tools::ToolClass::Read {
        return None;
    }
    let path = args.get("path").and_then(Value::as_str)?.to_owned();
    let sandbox = folder.sandbox.clone();
    tokio::task::spawn_blocking(move || sandbox.directory_elsewhere(&path))
        .await
        .ok()
        .flatten()
}

/// Where a call's command finds its program, where it really runs when a link on its `cwd`'s
/// way makes that another place than `cwd` says ([`Sandbox::directory_elsewhere`]), and how the
/// names it runs are found ([`lookup`], for a command whose rule keeps it: not one of the inert
/// programs, which run nothing else); for other tools, none of it. On the blocking pool: the
/// lookup reads directories.
async fn command_place(folder: &Folder, tool: ToolName, args: &Value) -> CommandPlace {
    if tool != ToolName::RunCommand {
        return CommandPlace::default();
    }
    let sandbox = folder.sandbox.clone();
    let args = args.clone();
    let look = move || {
        let program = args
            .get("argv")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str);
        let site = program.map_or_else(Default::default, |program| locate(&sandbox, program));
        let runs_in = args
            .get("cwd")
            .and_then(Value::as_str)
            .and_then(|cwd| sandbox.directory_elsewhere(cwd));
        let inert = program.is_some_and(|p| runs_nothing_else(p, &site));
        CommandPlace {
            lookup: if inert {
                Lookup::default()
            } else {
                lookup(&sandbox)
            },
            site,
            runs_in,
        }
    };
    // Not looked at (a task that panicked): the narrowest rule, which nothing remembered is.
    tokio::task::spawn_blocking(look).await.unwrap_or_default()
}

fn error(code: ErrorCode, message: String) -> Outcome {
    Outcome::Error {
        error: ToolError::new(code, message),
    }
}

#[cfg(test)]
mod backoff_tests {
    use super::*;

    /// Regression: every lost attachment started the backoff afresh, however short it was: a
    /// server that closed each attachment at once had the folder reconnect five times a
    /// second for ever. Only one that held starts it afresh.
    #[test]
    fn only_an_attachment_that_held_starts_the_backoff_afresh() {
        let (first, now) = (Duration::from_millis(200), Duration::from_millis(3_200));
        assert_eq!(wait_after_lost(now, Duration::from_millis(5), first), now);
        assert_eq!(wait_after_lost(now, STEADY_ATTACHMENT, first), first);
        assert_eq!(
            wait_after_lost(now, Duration::from_secs(3_600), first),
            first
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A request's tree is counted before it is made, and one of more values than any
    /// request takes is refused; what a folder's requests hold comes back when they end.
    #[test]
    fn a_requests_tree_is_counted_before_it_is_made() {
        use monad_protocol::values::{MAX_REQUEST_VALUES, VALUE_BYTES};
        let memory = RequestMemory::new(REQUESTS_HELD_MAX);
        let run = |values: usize| {
            let argv = vec![json!("x"); values];
            serde_json::to_vec(
                &json!({"type": "run", "id": 7, "attachment": 1, "session": "s",
                "tool": "run_command", "args": {"argv": argv}}),
            )
            .unwrap()
        };
        let mut held = Holding::new(&memory);
        let error = decode_request(&run(MAX_REQUEST_VALUES), &mut held).unwrap_err();
        assert!(
            error.message.contains("more than 1000000 JSON values"),
            "{}",
            error.message
        );
        let message = decode_request(&run(1_000), &mut held).expect("a request");
        assert!(matches!(message, Message::Run { id: 7, .. }), "{message:?}");
        assert!(held.held >= 1_000 * VALUE_BYTES, "{}", held.held);
        let mut other = Holding::new(&memory);
        assert!(
            !other.take(REQUESTS_HELD_MAX),
            "past the bound with the first one's"
        );
        drop(held);
        assert!(
            other.take(REQUESTS_HELD_MAX),
            "all of it once the first one ended"
        );
        // A small request is held whatever the others hold.
        let mut probe = Holding::new(&memory);
        assert!(probe.take(SMALL_REQUEST), "a small request past the bound");
        assert!(!probe.take(1), "not one byte more");
        drop((probe, other));
        assert_eq!(memory.held.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    /// A focus notice shows the names the server sent escaped and bounded.
    #[test]
    fn a_focus_notice_shows_the_servers_names_bounded() {
        let long = format!("s\u{1b}[2J{}", "x".repeat(60 * 1024));
        let line = AttachEvent::FocusMoved {
            focus: false,
            now: Some(long.clone()),
            session: Some(long),
        }
        .line()
        .unwrap();
        assert!(line.chars().count() < 600, "{}", line.len());
        assert!(line.contains("s\\u{1b}[2J"), "{line}");
    }

    /// A call's lines show a long target by its two ends, a short one whole.
    #[test]
    fn a_long_target_is_shown_by_its_ends_on_a_calls_lines() {
        let argv: Vec<String> = std::iter::once("echo".to_owned())
            .chain((0..20_000).map(|i| format!("w{i}")))
            .collect();
        let target = line_target(describe(ToolName::RunCommand, &json!({"argv": argv})));
        assert!(target.chars().count() < TARGET_SHOWN + 60, "{target}");
        assert!(target.starts_with("$ echo w0 w1 w2"), "{target}");
        assert!(target.ends_with("w19998 w19999"), "{target}");
        assert!(target.contains("characters not shown⟩"), "{target}");
        let short = describe(ToolName::ReadFile, &json!({"path": "src/lib.rs"}));
        assert_eq!(line_target(short.clone()), short);
        let event = AttachEvent::Finished {
            tool: ToolName::RunCommand,
            target,
            end: CallEnd::Cancelled,
        };
        assert!(event.line().unwrap().chars().count() < 400);
    }

    /// Regression: the server's words on the attach's own lines (a reason it closed the
    /// attachment for, the host it sends the folder to, the workspace's name and URI) were
    /// drawn whole: up to 64 KiB each, again at every reconnect.
    #[test]
    fn the_servers_words_on_the_attach_lines_are_bounded() {
        let long = "reason ".repeat(10_000);
        let lines = [
            AttachEvent::Disconnected {
                reason: long.clone(),
                retry_in: Duration::from_millis(200),
            },
            AttachEvent::Elsewhere {
                host: long.clone(),
                reason: long.clone(),
            },
        ];
        for event in lines {
            let line = event.line().unwrap();
            assert!(line.chars().count() < 1_500, "{}", line.len());
        }
        let own = "cannot attach at 10.0.0.2:4433, where the session is served: another \
                   certificate answers there";
        let line = AttachEvent::Disconnected {
            reason: own.into(),
            retry_in: Duration::from_millis(200),
        }
        .line()
        .unwrap();
        assert!(line.starts_with(own), "{line}");
    }

    /// A batch of the audit's with refused connections is one line on the owner's terminal,
    /// the first named with why, the rest counted; one with none says nothing.
    #[test]
    fn refused_connections_are_one_line_naming_the_first() {
        let event = |host: &str, allowed: bool| monad_protocol::tools::NetworkEvent {
            host: host.into(),
            port: 443,
            allowed,
            address: None,
            reason: (!allowed).then(|| "not in the allowlist".into()),
        };
        let batch = monad_sandbox::NetworkBatch {
            events: vec![
                event("ok.example", true),
                event("x1.example\u{1b}[2J", false),
                event("x2.example", false),
            ],
            dropped: 40,
        };
        let refused = NetworkRefused::of(&batch).unwrap();
        assert_eq!(refused.more, 41);
        assert_eq!(
            refused.line(),
            "network: the folder's policy refused a command's connection to \
             x1.example\\u{1b}[2J:443 (not in the allowlist) (and 41 more asked for)"
        );
        let allowed = monad_sandbox::NetworkBatch {
            events: vec![event("ok.example", true)],
            dropped: 3,
        };
        assert_eq!(NetworkRefused::of(&allowed), None);
    }

    /// The attach line a denial suggests keeps the folder's flags, and its path is quoted as a
    /// shell reads it back (a name with a space or `;` would otherwise be two words, or two
    /// commands), `~/` left for the shell to expand.
    #[test]
    fn the_attach_line_to_run_again_keeps_the_flags_and_quotes_the_path() {
        let mut o = AttachOptions::new(PathBuf::from("/x"));
        o.shown_path = "~/dev/my proj;rm -rf ~".into();
        o.name = Some("lap top".into());
        o.exact_name = true;
        o.allow = vec![ToolClass::Read];
        o.non_interactive = true;
        assert_eq!(
            o.attach_again(ToolClass::Exec),
            "monad-client attach ~/'dev/my proj;rm -rf ~' --name 'lap top' --allow read \
             --allow exec --non-interactive"
        );
        o.shown_path = "~".into();
        assert!(
            o.attach_again(ToolClass::Exec)
                .starts_with("monad-client attach ~ --name")
        );
        // A name made from the folder, not given: not repeated, so that it is made again the
        // same way rather than demanded exactly (`.dotfiles` is not a short name).
        o.exact_name = false;
        o.name = Some(".dotfiles".into());
        assert!(
            !o.attach_again(ToolClass::Exec).contains("--name"),
            "{}",
            o.attach_again(ToolClass::Exec)
        );
        o.shown_path = "/srv/plain".into();
        o.name = None;
        o.non_interactive = false;
        o.focus = true;
        assert_eq!(
            o.attach_again(ToolClass::Read),
            "monad-client attach /srv/plain --allow read --focus"
        );
    }

    #[test]
    fn a_folder_under_the_home_directory_is_written_from_it() {
        let home = Some(Path::new("/home/ana"));
        assert_eq!(relative_to(Path::new("/home/ana"), home), "~");
        assert_eq!(
            relative_to(Path::new("/home/ana/dev/monad"), home),
            "~/dev/monad"
        );
        // Whole components only; elsewhere, without a home, or with `/` as the home: as it is.
        for (path, home) in [
            ("/home/anabel/proj", home),
            ("/no-home-here/proj", home),
            ("/home/ana/proj", None),
            ("/srv/proj", Some(Path::new("/"))),
        ] {
            assert_eq!(relative_to(Path::new(path), home), path, "{home:?}");
        }
        // The options of every attach (the command's, chat's `/attach`) start from the user's.
        let user = crate::config::canonical_home();
        match user.filter(|home| home.parent().is_some()) {
            Some(home) => assert_eq!(
                AttachOptions::new(home.join("dev/monad")).shown_path,
                "~/dev/monad"
            ),
            None => assert_eq!(
                AttachOptions::new(PathBuf::from("/srv/proj")).shown_path,
                "/srv/proj"
            ),
        }
    }

    fn command(result: Value) -> Outcome {
        let mut base = json!({"timed_out": false, "stdout": "", "stderr": "",
            "stdout_truncated": false, "stderr_truncated": false, "duration_ms": 5,
            "sandbox": "landlock"});
        if let (Some(base), Some(extra)) = (base.as_object_mut(), result.as_object()) {
            base.extend(extra.clone());
        }
        Outcome::Ok {
            result: base.into(),
        }
    }

    #[test]
    fn a_call_end_says_how_it_ended() {
        let cases = [
            (command(json!({"exit_code": 0})), CallEnd::Ok),
            (command(json!({"exit_code": 2})), CallEnd::Exited(2)),
            (command(json!({"signal": 9})), CallEnd::Signalled(9)),
            (
                command(json!({"timed_out": true, "signal": 9})),
                CallEnd::TimedOut,
            ),
            (
                command(json!({"process": "proc-1"})),
                CallEnd::Background("proc-1".into()),
            ),
            (
                error(ErrorCode::NotFound, "gone".into()),
                CallEnd::Failed(ErrorCode::NotFound),
            ),
            (error(ErrorCode::Timeout, "late".into()), CallEnd::TimedOut),
        ];
        for (outcome, want) in cases {
            assert_eq!(
                CallEnd::of(ToolName::RunCommand, &outcome),
                want,
                "{outcome:?}"
            );
        }
        // A process that exited, read by `process_read`, is not how the read ended.
        let read = command(json!({"exit_code": 2}));
        assert_eq!(CallEnd::of(ToolName::ProcessRead, &read), CallEnd::Ok);
        // A kill that sent nothing, and a write the process took part of, say so (they were
        // `ok`, and `timed out` or `error: invalid_arguments`, though part of the approved text
        // reached the process).
        let kill = |delivered: bool| Outcome::Ok {
            result: json!({"process": "p", "signal": "TERM", "delivered": delivered}).into(),
        };
        assert_eq!(CallEnd::of(ToolName::ProcessKill, &kill(true)), CallEnd::Ok);
        let missed = CallEnd::of(ToolName::ProcessKill, &kill(false));
        assert_eq!(missed, CallEnd::NotDelivered);
        assert!(!missed.succeeded());
        let cut = error(
            ErrorCode::Timeout,
            "process `p` is not reading: it is not reading its standard input; it took the \
             first 4096 of 9000 bytes (the first 4096 characters) and the rest was not written: \
             send only the text from character 4097 on (counting from 1)"
                .into(),
        );
        let end = CallEnd::of(ToolName::ProcessWrite, &cut);
        assert_eq!(
            end.describe(),
            "error: timeout: it took the first 4096 of 9000 bytes (the first 4096 characters) \
             and the rest was not written"
        );
        let none = error(
            ErrorCode::Timeout,
            "it is not reading its standard input".into(),
        );
        assert_eq!(
            CallEnd::of(ToolName::ProcessWrite, &none),
            CallEnd::TimedOut,
            "nothing taken: a plain time-out"
        );
    }

    #[test]
    fn a_folder_sent_to_another_host_is_told_where_and_why_escaped() {
        let event = AttachEvent::Elsewhere {
            host: "b.example:4433".into(),
            reason: "session s is served by another host (b.example:4433), where a folder is \
                     attached to it\u{1b}[2J"
                .into(),
        };
        assert_eq!(
            event.line().as_deref(),
            Some(
                "session s is served by another host (b.example:4433), where a folder is \
                 attached to it\\u{1b}[2J: attaching there (b.example:4433)"
            )
        );
    }

    #[test]
    fn event_lines_say_when_a_call_starts_and_how_it_ends() {
        let decided = |allowed, basis| AttachEvent::Decided {
            tool: ToolName::RunCommand,
            target: "$ make".into(),
            allowed,
            basis,
        };
        let finished = |end| AttachEvent::Finished {
            tool: ToolName::RunCommand,
            target: "$ make".into(),
            end,
        };
        let cases = [
            (
                decided(true, Basis::Remembered),
                Some("▶ run_command $ make (remembered): started"),
            ),
            (
                decided(true, Basis::User),
                Some("▶ run_command $ make (answered): started"),
            ),
            (
                decided(false, Basis::NoTerminal),
                Some("✗ run_command $ make (no terminal)"),
            ),
            (decided(false, Basis::User), None),
            (decided(false, Basis::Timeout), None),
            (finished(CallEnd::Ok), Some("✓ run_command $ make: ok")),
            (
                finished(CallEnd::Exited(2)),
                Some("✗ run_command $ make: exit code 2"),
            ),
            (
                finished(CallEnd::TimedOut),
                Some("✗ run_command $ make: timed out"),
            ),
            (
                finished(CallEnd::Background("proc-\u{1b}1".into())),
                Some("✓ run_command $ make: runs on in the background as proc-\\u{1b}1"),
            ),
        ];
        for (event, want) in cases {
            assert_eq!(event.line().as_deref(), want, "{event:?}");
        }
        let changed = AttachEvent::SessionChanged {
            from: "s1".into(),
            to: "s\u{202e}2".into(),
            processes: 2,
            rules: 1,
        };
        assert_eq!(
            changed.line().as_deref(),
            Some(
                "re-attached to session s\\u{202e}2 instead of s1: ended 2 background processes \
                 of session s1 and forgot its 1 remembered answer"
            )
        );
        let attached = AttachEvent::Attached {
            session: "s1".into(),
            workspace: WorkspaceInfo {
                name: "lap".into(),
                uri: "monad://laptop/home/me/lap".into(),
                trust: Trust::Restricted,
                host: monad_protocol::wire::Host::Client,
                online: true,
                tools: Vec::new(),
                network: None,
            },
            server: "10.0.0.2:4433".into(),
        };
        assert_eq!(
            attached.line().as_deref(),
            Some(
                "attached monad://laptop/home/me/lap as `lap` to session s1 on 10.0.0.2:4433 \
                 (restricted); Ctrl-C disconnects"
            ),
            "the host it is on is named"
        );
        let cancelled = finished(CallEnd::Cancelled).line().unwrap();
        assert!(
            cancelled.starts_with("✗ run_command $ make: cancelled"),
            "{cancelled}"
        );
    }
}
