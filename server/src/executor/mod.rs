//! The executor: decides where a call goes and runs it there, or runs a session tool, and says
//! what is recorded of it.
//!
//! The executor decides; the [`link`] carries. Routing is the pure [`route::plan`] with the
//! containment checks it asks for; a primary workspace's call runs in the server's sandbox; an
//! attached folder's is carried to its client by the link, written against any bidirectional
//! byte stream ([`link::Connection`]), QUIC in the server and in-memory pipes in the tests below.
//! What is recorded of a call (its audit line, who decided, its artifacts) is built in
//! `record`; the session tools (`workspaces`, `memory_store`, `memory_recall`) are in
//! `session_tools`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use monad_protocol::tools::{ProcessListResult, UnavailableWorkspace};
use monad_protocol::wire::{Outcome, ToolResult, Trust, WorkspaceRef};
use monad_protocol::{ErrorCode, ToolError, ToolName};
use serde_json::{Value, json};

use crate::fsutil::now_rfc3339;
use crate::recorder::Recorder;
use crate::route::{self, Plan, Presence, Unasked, View};
use crate::session::{Session, Snapshot, Target};
use crate::store::Decider;

pub mod link;
mod record;
mod session_tools;
#[cfg(test)]
mod tests;

pub use link::{Conn, PendingBody, RelayError};
pub(crate) use record::{CappedWriter, record_network};

use link::{CallWatch, RunRequest, disconnected};
use record::{Record, Tap, Verdict, audit_network, describe_target, describe_whole, record};
use session_tools::{memory_recall, memory_store, workspaces};

/// Something that shows a caller how a call is going while it waits.
pub trait ProgressSink: Send + Sync {
    /// One line of progress.
    fn progress(&self, message: &str);
}

impl<F: Fn(&str) + Send + Sync> ProgressSink for F {
    fn progress(&self, message: &str) {
        self(message)
    }
}

/// What a gate is asked about a call before it goes to a restricted workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermissionAsk {
    /// The tool.
    pub tool: String,
    /// The restricted workspace the call was routed to.
    pub workspace: WorkspaceRef,
    /// What it acts on, in one line, as in the audit log.
    pub what: String,
}

/// Asked before a call runs in a restricted workspace (the built-in agent's front, such as an
/// ACP editor): `false` denies the call there and then (the folder's owner is not asked; the
/// audit log says the front decided); `true` lets it go on to the folder's own policy and
/// prompt, which still decide. Calls in workspaces of full trust are never asked.
pub trait PermissionGate: Send + Sync {
    /// Whether the front's user allows the call.
    fn ask(
        &self,
        ask: PermissionAsk,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + '_>>;
}

/// Routes and runs tool calls. Stateless: everything it needs is in the session.
#[derive(Debug, Clone, Default)]
pub struct Executor {
    /// Longest a call may take end to end.
    pub call_timeout: Option<Duration>,
    /// Where audit records and artifacts go; `None` records nothing.
    pub recorder: Option<Recorder>,
    /// Where calls in progress are told to the sessions' followers.
    pub feed: crate::feed::Feed,
}

/// The answer to one call.
#[derive(Debug)]
pub struct CallOutput {
    /// The workspace that ran it, when one was reached.
    pub workspace: Option<WorkspaceRef>,
    /// How it ended.
    pub outcome: Outcome,
    /// A large field of the result still on its way from the attached client: relay it with
    /// [`PendingBody::relay`] or wait for it with [`CallOutput::complete`].
    pub body: Option<PendingBody>,
}

impl CallOutput {
    fn error(workspace: Option<WorkspaceRef>, error: ToolError) -> CallOutput {
        CallOutput {
            workspace,
            outcome: Outcome::Error { error },
            body: None,
        }
    }

    /// The whole answer, with a pending body read and put into the result (for callers that
    /// need the result as one value, such as the MCP front).
    pub async fn complete(self) -> (Option<WorkspaceRef>, Outcome) {
        let CallOutput {
            workspace,
            mut outcome,
            body,
        } = self;
        if let Some(pending) = body
            && let Err(error) = pending.read_into(&mut outcome).await
        {
            outcome = Outcome::Error { error };
        }
        (workspace, outcome)
    }
}

impl Executor {
    /// Runs `tool` with `args` in `session`, and records it: an audit line, a `tool_output`
    /// artifact, and a `file_diff` for a write or edit (written after the answer, off the hot
    /// path).
    pub async fn call(
        &self,
        session: &Arc<Session>,
        tool: &str,
        args: Value,
        progress: &dyn ProgressSink,
    ) -> CallOutput {
        self.call_gated(session, tool, args, progress, None).await
    }

    /// Like [`Executor::call`]; a call routed to a restricted workspace first asks `gate`
    /// (when given), whose rejection denies it without asking the folder's owner.
    pub async fn call_gated(
        &self,
        session: &Arc<Session>,
        tool: &str,
        args: Value,
        progress: &dyn ProgressSink,
        gate: Option<&dyn PermissionGate>,
    ) -> CallOutput {
        let started = Instant::now();
        let time = now_rfc3339();
        let target = describe_target(&args);
        let deadline = self
            .call_timeout
            .map(|limit| tokio::time::Instant::now() + limit);
        // If this future is dropped before the call finishes (the agent cancelled), the guard
        // records it as cancelled, with what was known by then.
        let mut unfinished = Unfinished {
            recorder: self.recorder.as_ref(),
            session,
            tool,
            time: Some(time.clone()),
            target: target.clone(),
            started,
            known: Arc::new(Known::live(crate::feed::LiveCall::start(
                &self.feed, session, tool, &time, &target,
            ))),
        };
        let known = unfinished.known.clone();
        let run = self.call_inner(session, tool, args, progress, gate, &known);
        let (mut output, verdict) = match self.call_timeout {
            Some(limit) => match tokio::time::timeout(limit, run).await {
                Ok(out) => out,
                Err(_) => (
                    CallOutput::error(
                        None,
                        ToolError::new(
                            ErrorCode::Timeout,
                            format!("the call did not finish within {} s", limit.as_secs()),
                        ),
                    ),
                    known.verdict().unwrap_or(Verdict::NOBODY),
                ),
            },
            None => run.await,
        };
        unfinished.time = None;
        known.ended();
        tracing::debug!(
            session = %session.id,
            tool,
            workspace = output.workspace.as_ref().map_or("-", |w| w.name.as_str()),
            ok = matches!(output.outcome, Outcome::Ok { .. }),
            ms = started.elapsed().as_millis() as u64,
            "tool call"
        );
        if let Some(pending) = &mut output.body {
            pending.deadline = deadline;
        }
        if let Some(recorder) = &self.recorder {
            if let Some(meta) = session.touch() {
                recorder.save_meta(meta);
            }
            match &mut output.body {
                // Recorded when the body is done with, so that the record says how it ended.
                Some(pending) => {
                    let retention = &session.settings.retention;
                    let cap = if retention.keep_artifacts {
                        usize::try_from(retention.artifact_max_bytes).unwrap_or(usize::MAX)
                    } else {
                        0
                    };
                    pending.tap = Some(Tap {
                        recorder: recorder.clone(),
                        session: Arc::clone(session),
                        tool: tool.to_owned(),
                        time,
                        target,
                        verdict,
                        started,
                        workspace: output.workspace.clone(),
                        outcome: output.outcome.clone(),
                        head: Vec::new(),
                        cap,
                        failed: None,
                    });
                }
                None => record(
                    recorder,
                    session,
                    tool,
                    &output,
                    Record {
                        time,
                        target,
                        verdict,
                        duration: started.elapsed(),
                        unseen: 0,
                    },
                ),
            }
        }
        output
    }

    /// Runs the call; also says who decided it ran (`trust`, `policy`, `user`, ... as the
    /// client reported, `server` when no workspace was reached, `session` for session tools).
    /// What is known as it goes (the workspace, the client's decision) is kept in `known`, for
    /// the record of a call cancelled before it finished.
    async fn call_inner(
        &self,
        session: &Arc<Session>,
        tool: &str,
        args: Value,
        progress: &dyn ProgressSink,
        gate: Option<&dyn PermissionGate>,
        known: &Known,
    ) -> (CallOutput, Verdict) {
        let Some(tool) = ToolName::parse(tool) else {
            let known: Vec<&str> = ToolName::ALL.iter().map(|t| t.as_str()).collect();
            return (
                CallOutput::error(
                    None,
                    ToolError::new(
                        ErrorCode::InvalidArguments,
                        format!(
                            "unknown tool `{}`; the tools are: {}",
                            record::kept_tool_name(tool),
                            known.join(", ")
                        ),
                    ),
                ),
                Verdict::NOBODY,
            );
        };
        let Value::Object(map) = &args else {
            return (
                CallOutput::error(
                    None,
                    ToolError::new(
                        ErrorCode::InvalidArguments,
                        format!("the arguments of `{tool}` must be a JSON object"),
                    ),
                ),
                Verdict::NOBODY,
            );
        };
        let string_arg = |key: &str| -> Result<Option<String>, ToolError> {
            match map.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(ToolError::new(
                    ErrorCode::InvalidArguments,
                    format!("`{key}` must be a string"),
                )),
            }
        };
        let (target, path) = match (string_arg("workspace"), string_arg("path")) {
            // An empty `workspace` is one left unset: models fill optional strings with "".
            (Ok(t), Ok(p)) => (t.filter(|t| !t.is_empty()), p),
            (Err(e), _) | (_, Err(e)) => return (CallOutput::error(None, e), Verdict::NOBODY),
        };
        let primary = WorkspaceRef {
            name: "primary".into(),
            uri: session.primary_uri(),
        };
        match tool {
            ToolName::Workspaces => {
                return (
                    session_tool(primary, workspaces(session, &args)),
                    Verdict::SESSION,
                );
            }
            ToolName::MemoryStore => {
                return (
                    session_tool(primary, memory_store(session, args).await),
                    Verdict::SESSION,
                );
            }
            ToolName::MemoryRecall => {
                return (
                    session_tool(primary, memory_recall(session, args).await),
                    Verdict::SESSION,
                );
            }
            _ => {}
        }

        // A process tool goes where its process runs (the agent need not say), or says the
        // session has no such process.
        let mut target = target;
        if target.is_none() {
            if ToolName::PROCESS_TOOLS.contains(&tool) {
                // Missing or not a string: the workspace's own check says so.
                if let Ok(Some(id)) = string_arg("process") {
                    match session.process_workspace(&id) {
                        Some(name) => target = Some(name),
                        // Wrong arguments are said first, as a workspace says them.
                        None if tool.args_error(&args).is_some() => {}
                        None => {
                            return (
                                CallOutput::error(
                                    None,
                                    ToolError::new(
                                        ErrorCode::NotFound,
                                        format!(
                                            "this session has no background process `{id}` \
                                             (`process_list` lists a workspace's)"
                                        ),
                                    ),
                                ),
                                Verdict::NOBODY,
                            );
                        }
                    }
                }
            } else if tool == ToolName::ProcessList {
                // With none (the session started none that runs or waits to be read), the
                // session's empty list, where one workspace's answer would speak for that
                // workspace alone; wrong arguments go on to a workspace's check, which says so.
                let names = session.process_workspaces();
                if !names.is_empty() || tool.args_error(&args).is_none() {
                    return self
                        .list_processes(session, &names, progress, gate, known)
                        .await;
                }
            }
        }
        let snapshots = session.workspaces();
        let views: Vec<View<'_>> = snapshots
            .iter()
            .map(|s| View {
                name: &s.info.name,
                uri: &s.info.uri,
                online: s.info.online,
                offers: s.info.tools.contains(&tool),
            })
            .collect();
        let focus = session
            .focus()
            .and_then(|name| snapshots.iter().position(|s| s.info.name == name));
        let (index, ran) =
            match route::plan(tool, target.as_deref(), path.as_deref(), &views, focus) {
                Ok(Plan::Run(i)) => (i, None),
                Ok(Plan::FirstContaining {
                    candidates,
                    path,
                    otherwise,
                    offline,
                }) => {
                    let mut probes = Vec::new();
                    let mut ran = None;
                    for i in candidates {
                        let snapshot = &snapshots[i];
                        let asked = self
                            .run_if_present(
                                session, snapshot, tool, &args, &path, progress, gate, known,
                            )
                            .await;
                        let presence = match asked {
                            Some(Ok(answer)) => {
                                ran = Some((i, answer));
                                break;
                            }
                            Some(Err(presence)) => presence,
                            None => contains(snapshot, &path).await,
                        };
                        probes.push((i, presence));
                        if route::probing_ends(tool, presence, Some(i) == focus) {
                            break;
                        }
                    }
                    // It ran where the path was: the first that has it, which is where
                    // `settle` sends a call that changes nothing (`route::may_run_where_found`).
                    if let Some((i, answer)) = ran {
                        (i, Some(answer))
                    } else {
                        match route::settle(
                            tool, &path, &probes, otherwise, &offline, &views, focus,
                        ) {
                            // A new file (no workspace has it): where its directory is,
                            // when only some have that.
                            Ok(i)
                                if Some(i) == otherwise
                                    && focus.is_none()
                                    && probes.iter().all(|(_, p)| *p == Presence::Absent) =>
                            {
                                let order: Vec<usize> = probes.iter().map(|(i, _)| *i).collect();
                                let home = home_of_new_file(&snapshots, &order, &path).await;
                                (home.unwrap_or(i), None)
                            }
                            Ok(i) => (i, None),
                            // Arguments no workspace would take (a misspelled `ofset`) are
                            // what the agent must mend, not where the path is.
                            Err(e) => {
                                let e = match tool.args_error(&args) {
                                    Some(why) => ToolError::new(ErrorCode::InvalidArguments, why),
                                    None => e,
                                };
                                return (CallOutput::error(None, e), Verdict::NOBODY);
                            }
                        }
                    }
                }
                Err(e) => return (CallOutput::error(None, e), Verdict::NOBODY),
            };
        let snapshot = &snapshots[index];
        let workspace = workspace_ref(snapshot);
        let (result, body, verdict) = match ran {
            // It ran where the path was (and its workspace is known since the client said so).
            Some(answer) => (answer.result, answer.body, answer.verdict),
            None => {
                known.set_workspace(workspace.clone());
                self.run_at(session, snapshot, tool, args, progress, gate, known)
                    .await
            }
        };
        if let Ok(result) = &result {
            let (name, uri) = (&snapshot.info.name, &snapshot.info.uri);
            session.note_process(tool, result, name, uri, snapshot.record.as_deref());
        }
        let output = match result {
            Ok(result) => CallOutput {
                workspace,
                outcome: Outcome::Ok { result },
                body,
            },
            Err(error) => CallOutput::error(workspace, error),
        };
        (output, verdict)
    }

    /// Where finding `path` in `snapshot`'s workspace would run the call there at once (a
    /// folder whose client takes it, a tool that only reads, no front asking its user first),
    /// asks the client to run it only if the path is there: one round trip, not a probe and
    /// then the run. `None` where that does not apply (the caller probes); else the answer, or
    /// what the client said instead ([`link::run_if_present`]).
    #[allow(clippy::too_many_arguments)]
    async fn run_if_present(
        &self,
        session: &Arc<Session>,
        snapshot: &Snapshot,
        tool: ToolName,
        args: &Value,
        path: &str,
        progress: &dyn ProgressSink,
        gate: Option<&dyn PermissionGate>,
        known: &Known,
    ) -> Option<Result<link::Answer<link::ConnRecv>, Presence>> {
        let Target::Attached(Some(link)) = &snapshot.target else {
            return None;
        };
        let mut args = args.clone();
        if !link.runs_if_present()
            || !route::may_run_where_found(tool)
            || front_asks(snapshot, gate)
            // Refused by `run_at`, after the probe, for what it is.
            || link.takes(&snapshot.info.name, tool, &mut args).is_err()
        {
            return None;
        }
        let watch = Reached {
            known,
            workspace: workspace_ref(snapshot),
        };
        let request = RunRequest {
            attachment: link.attachment,
            session: &session.id,
            name: &snapshot.info.name,
            full_trust: snapshot.info.trust == monad_protocol::wire::Trust::Full,
            tool,
            args,
        };
        let answer = link::run_if_present(&link.conn, request, path, progress, &watch).await;
        if answer.is_ok() {
            self.touch(session, snapshot);
        }
        Some(answer)
    }

    /// Runs a routed call in `snapshot`'s workspace: in the primary's sandbox, or on the
    /// attached folder's client (after the front's permission for a restricted one, when the
    /// front asks).
    #[allow(clippy::too_many_arguments)]
    async fn run_at(
        &self,
        session: &Arc<Session>,
        snapshot: &Snapshot,
        tool: ToolName,
        args: Value,
        progress: &dyn ProgressSink,
        gate: Option<&dyn PermissionGate>,
        known: &Known,
    ) -> (
        Result<ToolResult, ToolError>,
        Option<link::PendingBody>,
        Verdict,
    ) {
        let mut args = args;
        if let Target::Attached(Some(link)) = &snapshot.target
            && let Err(e) = link.takes(&snapshot.info.name, tool, &mut args)
        {
            return (Err(e), None, Verdict::NOBODY);
        }
        match &snapshot.target {
            Target::Primary(primary) => {
                known.set_verdict(Verdict::TRUST);
                (
                    match primary.sandbox().await {
                        Ok(sandbox) => {
                            // From its first use, the connections its commands ask for go to
                            // the audit log as they happen.
                            if let Some(recorder) = &self.recorder
                                && let Some(feed) = sandbox.take_network_audit()
                            {
                                tokio::spawn(audit_network(
                                    recorder.clone(),
                                    session.owner.clone(),
                                    session.id.clone(),
                                    snapshot.info.name.clone(),
                                    feed,
                                ));
                            }
                            let relay = |line: &str| progress.progress(line);
                            sandbox
                                .call_for_wire(tool, args, Some(&relay))
                                .await
                                .map_err(|e| e.to_tool_error())
                        }
                        Err(e) => Err(e),
                    },
                    None,
                    Verdict::TRUST,
                )
            }
            Target::Attached(Some(_))
                if front_asks(snapshot, gate)
                    && let Some(gate) = gate
                    && !gate
                        .ask(PermissionAsk {
                            tool: tool.as_str().to_owned(),
                            workspace: WorkspaceRef {
                                name: snapshot.info.name.clone(),
                                uri: snapshot.info.uri.clone(),
                            },
                            what: describe_whole(&args),
                        })
                        .await =>
            {
                let verdict = Verdict {
                    by: Decider::Front,
                    allowed: Some(false),
                };
                known.set_verdict(verdict);
                (
                    Err(ToolError::new(
                        ErrorCode::Denied,
                        format!(
                            "the user rejected `{tool}` in workspace `{}` from their editor; \
                             the folder's owner was not asked",
                            snapshot.info.name
                        ),
                    )),
                    None,
                    verdict,
                )
            }
            Target::Attached(Some(link)) => {
                let request = RunRequest {
                    attachment: link.attachment,
                    session: &session.id,
                    name: &snapshot.info.name,
                    full_trust: snapshot.info.trust == monad_protocol::wire::Trust::Full,
                    tool,
                    args,
                };
                let answer = link::run(&link.conn, request, progress, known).await;
                self.touch(session, snapshot);
                (answer.result, answer.body, answer.verdict)
            }
            Target::Attached(None) => (
                Err(disconnected(&snapshot.info.name)),
                None,
                Verdict::NOBODY,
            ),
        }
    }

    /// Notes that an attached folder's workspace record was used.
    fn touch(&self, session: &Session, snapshot: &Snapshot) {
        if let (Some(recorder), Some(record)) = (&self.recorder, &snapshot.record) {
            recorder.touch(record, &session.id);
        }
    }
}

/// Whether a call routed to `snapshot`'s workspace asks the front's user first (`gate`, for a
/// restricted folder): then the folder is not sent the call before it is routed there.
fn front_asks(snapshot: &Snapshot, gate: Option<&dyn PermissionGate>) -> bool {
    snapshot.info.trust == Trust::Restricted && gate.is_some()
}

/// A snapshot's workspace, as a result names it.
fn workspace_ref(snapshot: &Snapshot) -> Option<WorkspaceRef> {
    Some(WorkspaceRef {
        name: snapshot.info.name.clone(),
        uri: snapshot.info.uri.clone(),
    })
}

/// The call's watch while a client is asked to run it only if the path is there: once the
/// client says it is, the call is routed there, then it waits for the client's decision as any
/// run.
struct Reached<'a> {
    known: &'a Known,
    workspace: Option<WorkspaceRef>,
}

impl CallWatch for Reached<'_> {
    fn sent(&self) {
        self.known.set_workspace(self.workspace.clone());
        self.known.sent();
    }

    fn decided(&self, verdict: Verdict) {
        self.known.decided(verdict);
    }
}

impl Executor {
    /// `process_list` without a workspace: each of `names` (the session's workspaces with
    /// background processes) listed in turn, as a call naming it would; merged, each process
    /// with its workspace. One that cannot be listed (offline, refused) is reported in
    /// `unavailable` rather than failing the call. Recorded under the first workspace listed;
    /// the answer names it only when it is the one listed. With no `names`, an empty list.
    async fn list_processes(
        &self,
        session: &Arc<Session>,
        names: &[String],
        progress: &dyn ProgressSink,
        gate: Option<&dyn PermissionGate>,
        known: &Known,
    ) -> (CallOutput, Verdict) {
        let mut merged = ProcessListResult {
            processes: Vec::new(),
            unavailable: Vec::new(),
        };
        let mut first: Option<(Option<WorkspaceRef>, Verdict)> = None;
        for name in names {
            let (output, verdict) = Box::pin(self.call_inner(
                session,
                ToolName::ProcessList.as_str(),
                json!({ "workspace": name }),
                progress,
                gate,
                &Known::default(),
            ))
            .await;
            let listed = match output.outcome {
                Outcome::Ok { result } => {
                    serde_json::from_value::<ProcessListResult>(result.into_value()).map_err(|e| {
                        ToolError::new(
                            ErrorCode::Internal,
                            format!("the workspace answered something else: {e}"),
                        )
                    })
                }
                Outcome::Error { error } => Err(error),
            };
            match listed {
                Ok(listed) => {
                    merged
                        .processes
                        .extend(listed.processes.into_iter().map(|mut p| {
                            p.workspace = Some(name.clone());
                            p
                        }));
                    if first.is_none() {
                        known.set_workspace(output.workspace.clone());
                        known.set_verdict(verdict);
                        first = Some((output.workspace, verdict));
                    }
                }
                Err(error) => merged.unavailable.push(UnavailableWorkspace {
                    workspace: name.clone(),
                    code: error.code.as_str().to_owned(),
                    message: error.message,
                }),
            }
        }
        // No workspace answered: the session's own empty list when none was asked.
        let nobody = if names.is_empty() {
            Verdict::SESSION
        } else {
            Verdict::NOBODY
        };
        let (workspace, verdict) = first.unwrap_or((None, nobody));
        // A list of several workspaces is no one workspace's: each process names its own.
        let workspace = if names.len() == 1 { workspace } else { None };
        let result = serde_json::to_value(merged).expect("a list serializes");
        (
            CallOutput {
                workspace,
                outcome: Outcome::Ok {
                    result: result.into(),
                },
                body: None,
            },
            verdict,
        )
    }
}

/// What is known about a call while it runs, for the record of one cancelled before it ends.
/// Also tells the session's followers how the call goes (`.1`).
#[derive(Debug, Default)]
struct Known(
    std::sync::Mutex<(Option<WorkspaceRef>, Option<Verdict>)>,
    crate::feed::LiveCall,
);

impl Known {
    fn live(live: crate::feed::LiveCall) -> Known {
        Known(std::sync::Mutex::default(), live)
    }

    fn set_workspace(&self, workspace: Option<WorkspaceRef>) {
        if let Some(w) = &workspace {
            self.1.routed(&w.name, &w.uri);
        }
        self.0.lock().unwrap_or_else(|p| p.into_inner()).0 = workspace;
    }

    fn set_verdict(&self, verdict: Verdict) {
        self.1.decided(verdict.by, verdict.allowed);
        self.0.lock().unwrap_or_else(|p| p.into_inner()).1 = Some(verdict);
    }

    /// The call ended.
    fn ended(&self) {
        self.1.ended();
    }

    fn verdict(&self) -> Option<Verdict> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).1
    }

    fn workspace(&self) -> Option<WorkspaceRef> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).0.clone()
    }
}

impl CallWatch for Known {
    /// Sent to an attached folder's client, which decides.
    fn sent(&self) {
        self.1.waiting();
    }

    fn decided(&self, verdict: Verdict) {
        self.set_verdict(verdict);
    }
}

/// Records a call as cancelled when dropped while still armed (`time` is set): the call's future
/// was dropped before it finished, because the agent cancelled.
struct Unfinished<'a> {
    recorder: Option<&'a Recorder>,
    session: &'a Arc<Session>,
    tool: &'a str,
    /// When the call started; `None` once it finished (disarmed).
    time: Option<String>,
    target: String,
    started: Instant,
    known: Arc<Known>,
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        let (Some(recorder), Some(time)) = (self.recorder, self.time.take()) else {
            return;
        };
        let output = CallOutput::error(
            self.known.workspace(),
            ToolError::new(
                ErrorCode::Cancelled,
                "the agent cancelled the call before it finished",
            ),
        );
        record(
            recorder,
            self.session,
            self.tool,
            &output,
            Record {
                time,
                target: std::mem::take(&mut self.target),
                verdict: self.known.verdict().unwrap_or(Verdict::NOBODY),
                duration: self.started.elapsed(),
                unseen: 0,
            },
        );
    }
}

fn session_tool(primary: WorkspaceRef, result: Result<Value, ToolError>) -> CallOutput {
    match result {
        Ok(result) => CallOutput {
            workspace: Some(primary),
            outcome: Outcome::Ok {
                result: result.into(),
            },
            body: None,
        },
        Err(error) => CallOutput::error(Some(primary), error),
    }
}

/// Where a file that no workspace has (`path`, relative) is written when the call names no
/// workspace and the session has no focus (a focus takes new files): the first of `order` that
/// has its deepest directory that any of them has, so that `many/new.txt`, where only an
/// attached folder has `many/`, is not written into a second `many/` in the primary workspace.
/// `None` when none has any of its directories, or a workspace cannot answer whether it has
/// one (it is not passed over), or the path is absolute or climbs: the plan's first candidate
/// takes it, as before. The workspaces are asked together, a directory at a time.
async fn home_of_new_file(snapshots: &[Snapshot], order: &[usize], path: &str) -> Option<usize> {
    use std::path::{Component, Path, PathBuf};
    if order.len() < 2 {
        return None;
    }
    let mut names = Vec::new();
    for part in Path::new(path).components() {
        match part {
            Component::Normal(name) => names.push(name),
            Component::CurDir => {}
            // Absolute, or climbing: where it leads is each workspace's to say.
            _ => return None,
        }
    }
    names.pop();
    while !names.is_empty() {
        let dir: PathBuf = names.iter().collect();
        let dir = dir.to_str()?;
        let asked =
            futures_util::future::join_all(order.iter().map(|&i| contains(&snapshots[i], dir)))
                .await;
        for (&i, presence) in order.iter().zip(asked) {
            match presence {
                Presence::Present => return Some(i),
                Presence::Absent => {}
                Presence::Unknown(_) => return None,
            }
        }
        names.pop();
    }
    None
}

/// Whether `path` exists in the workspace: locally for the primary, by a probe for a client.
async fn contains(snapshot: &Snapshot, path: &str) -> Presence {
    match &snapshot.target {
        Target::Primary(primary) => {
            let Ok(sandbox) = primary.sandbox().await else {
                return Presence::Unknown(Unasked::Failed);
            };
            match sandbox.exists_async(path).await {
                Ok(true) => Presence::Present,
                Ok(false) => Presence::Absent,
                Err(_) => Presence::Unknown(Unasked::Failed),
            }
        }
        Target::Attached(Some(link)) => link::probe(&link.conn, link.attachment, path).await,
        Target::Attached(None) => Presence::Unknown(Unasked::Disconnected),
    }
}
