//! The `ToolExecutor`: routes a call to a workspace and runs it there, or runs a session tool.

use std::sync::Arc;
use std::time::Duration;

use monad_protocol::io::{read_message, write_message};
use monad_protocol::tools::{MemoryRecallArgs, MemoryStoreArgs, WorkspacesArgs};
use monad_protocol::wire::{Message, Outcome, WorkspaceRef};
use monad_protocol::{ErrorCode, ToolError, ToolName};
use serde_json::{Value, json};

use crate::fsutil::now_rfc3339;
use crate::recorder::Recorder;
use crate::route::{self, Plan, View};
use crate::session::{ClientLink, Session, Snapshot, Target};
use crate::store::{ArtifactKind, ArtifactMeta, AuditRecord};

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

/// Routes and runs tool calls. Stateless: everything it needs is in the session.
#[derive(Debug, Clone, Default)]
pub struct Executor {
    /// Longest a call may take end to end.
    pub call_timeout: Option<Duration>,
    /// Where audit records and artifacts go; `None` records nothing.
    pub recorder: Option<Recorder>,
}

/// The answer to one call.
#[derive(Debug, Clone, PartialEq)]
pub struct CallOutput {
    /// The workspace that ran it, when one was reached.
    pub workspace: Option<WorkspaceRef>,
    /// How it ended.
    pub outcome: Outcome,
}

impl CallOutput {
    fn error(workspace: Option<WorkspaceRef>, error: ToolError) -> CallOutput {
        CallOutput {
            workspace,
            outcome: Outcome::Error { error },
        }
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
        let started = std::time::Instant::now();
        let time = now_rfc3339();
        let target = describe_target(&args);
        let run = self.call_inner(session, tool, args, progress);
        let (output, decided_by) = match self.call_timeout {
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
                    "server",
                ),
            },
            None => run.await,
        };
        if let Some(recorder) = &self.recorder {
            if let Some(meta) = session.touch() {
                recorder.save_meta(meta);
            }
            record(
                recorder,
                session,
                tool,
                &output,
                Record {
                    time,
                    target,
                    decided_by,
                    duration: started.elapsed(),
                },
            );
        }
        output
    }

    /// Runs the call; also says who decided it ran (`trust`, `policy`, `user`, ... as the
    /// client reported, `server` when no workspace was reached, `session` for session tools).
    async fn call_inner(
        &self,
        session: &Arc<Session>,
        tool: &str,
        args: Value,
        progress: &dyn ProgressSink,
    ) -> (CallOutput, &'static str) {
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
                "server",
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
                "server",
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
            (Err(e), _) | (_, Err(e)) => return (CallOutput::error(None, e), "server"),
        };
        let primary = WorkspaceRef {
            name: "primary".into(),
            uri: session.primary_uri(),
        };
        match tool {
            ToolName::Workspaces => {
                return (session_tool(primary, workspaces(session, &args)), "session");
            }
            ToolName::MemoryStore => {
                return (
                    session_tool(primary, memory_store(session, args).await),
                    "session",
                );
            }
            ToolName::MemoryRecall => {
                return (
                    session_tool(primary, memory_recall(session, args).await),
                    "session",
                );
            }
            _ => {}
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
        let index = match route::plan(tool, target.as_deref(), path.as_deref(), &views) {
            Ok(Plan::Run(i)) => i,
            Ok(Plan::FirstContaining { candidates, path }) => {
                let mut tried = Vec::new();
                let mut found = None;
                for i in candidates {
                    tried.push(snapshots[i].info.name.as_str());
                    if contains(&snapshots[i], &path).await {
                        found = Some(i);
                        break;
                    }
                }
                match found {
                    Some(i) => i,
                    None => {
                        return (
                            CallOutput::error(None, route::not_in_any(&path, &tried)),
                            "server",
                        );
                    }
                }
            }
            Err(e) => return (CallOutput::error(None, e), "server"),
        };
        let snapshot = &snapshots[index];
        let workspace = Some(WorkspaceRef {
            name: snapshot.info.name.clone(),
            uri: snapshot.info.uri.clone(),
        });
        let (result, decided_by) = match &snapshot.target {
            Target::Primary(sandbox) => (
                sandbox
                    .call(tool, args)
                    .await
                    .map_err(|e| e.to_tool_error()),
                "trust",
            ),
            Target::Attached(Some(link)) => {
                let ran =
                    run_on_client(link, &session.id, &snapshot.info.name, tool, args, progress)
                        .await;
                if let (Some(recorder), Some(record)) = (&self.recorder, &snapshot.record) {
                    recorder.touch(record, &session.id);
                }
                ran
            }
            Target::Attached(None) => (Err(disconnected(&snapshot.info.name)), "server"),
        };
        let output = match result {
            Ok(result) => CallOutput {
                workspace,
                outcome: Outcome::Ok { result },
            },
            Err(error) => CallOutput::error(workspace, error),
        };
        (output, decided_by)
    }
}

fn session_tool(primary: WorkspaceRef, result: Result<Value, ToolError>) -> CallOutput {
    match result {
        Ok(result) => CallOutput {
            workspace: Some(primary),
            outcome: Outcome::Ok { result },
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
        Target::Primary(sandbox) => {
            let sandbox = sandbox.clone();
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
/// read back. A connection that drops mid-call is `workspace_disconnected`, at once. Also says who
/// decided, as the client reported it.
async fn run_on_client(
    link: &ClientLink,
    session: &str,
    name: &str,
    tool: ToolName,
    args: Value,
    progress: &dyn ProgressSink,
) -> (Result<Value, ToolError>, &'static str) {
    let Ok((mut send, mut recv)) = link.conn.open_bi().await else {
        return (Err(disconnected(name)), "server");
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
        return (Err(disconnected(name)), "server");
    }
    let _ = send.finish();
    let mut decided_by = "client";
    loop {
        match read_message(&mut recv, MAX_CLIENT_MESSAGE).await {
            Ok(Some(Message::Progress { message, .. })) => progress.progress(&message),
            Ok(Some(Message::Decided { by, .. })) => decided_by = decider(&by),
            Ok(Some(Message::Result { outcome, .. })) => {
                return match outcome {
                    Outcome::Ok { result } => (Ok(result), decided_by),
                    Outcome::Error { error } => (Err(error), decided_by),
                };
            }
            Ok(Some(other)) => {
                return (
                    Err(ToolError::new(
                        ErrorCode::Malformed,
                        format!("the client of `{name}` answered with a `{}`", other.kind()),
                    )),
                    decided_by,
                );
            }
            Ok(None) | Err(_) => return (Err(disconnected(name)), decided_by),
        }
    }
}

/// The client's word for who decided, as one of the audit log's fixed words.
fn decider(by: &str) -> &'static str {
    match by {
        "trust" => "trust",
        "policy" => "policy",
        "user" => "user",
        "timeout" => "timeout",
        "no_terminal" => "no_terminal",
        _ => "client",
    }
}

/// What the recorder needs besides the call itself.
struct Record {
    time: String,
    target: String,
    decided_by: &'static str,
    duration: Duration,
}

/// Sends a call's audit line and artifacts to the recorder.
fn record(recorder: &Recorder, session: &Session, tool: &str, output: &CallOutput, r: Record) {
    let call_id = uuid::Uuid::new_v4().to_string();
    let workspace = output.workspace.as_ref().map(|w| w.name.clone());
    let (decision, outcome) = match &output.outcome {
        Outcome::Ok { .. } => ("allowed", "ok".to_owned()),
        Outcome::Error { error } if error.code == ErrorCode::Denied => {
            ("denied", error.code.as_str().to_owned())
        }
        // Refused before any workspace (or anyone) decided: routing failed, bad arguments.
        Outcome::Error { error } if r.decided_by == "server" => {
            ("none", error.code.as_str().to_owned())
        }
        Outcome::Error { error } => ("allowed", error.code.as_str().to_owned()),
    };
    recorder.audit(
        &session.id,
        AuditRecord {
            time: r.time.clone(),
            call_id: call_id.clone(),
            tool: tool.to_owned(),
            workspace: workspace.clone(),
            target: r.target,
            decision: decision.to_owned(),
            decided_by: r.decided_by.to_owned(),
            outcome,
            duration_ms: r.duration.as_millis() as u64,
        },
    );
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
            (head.bytes, head.total)
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
        && matches!(tool, "write_file" | "edit_file")
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

/// The path, pattern or command line a call acts on, in one line for the audit log.
fn describe_target(args: &Value) -> String {
    if let Some(argv) = args.get("argv").and_then(Value::as_array) {
        let words: Vec<&str> = argv.iter().filter_map(Value::as_str).collect();
        return words.join(" ");
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
    Ok(json!({ "session": session.id, "workspaces": list }))
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
        .call(ToolName::WriteFile, write)
        .await
        .map_err(|e| e.to_tool_error())?;
    Ok(json!({ "key": args.key, "stored": true }))
}

async fn memory_recall(session: &Session, args: Value) -> Result<Value, ToolError> {
    let args: MemoryRecallArgs = parse(ToolName::MemoryRecall, args)?;
    let sandbox = session.primary.clone();
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
}
