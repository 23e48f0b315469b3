//! The executor and the link, end to end in memory: a session with a folder attached over
//! [`link::memory`], whose far end is a scripted client speaking the real frames of
//! monad-protocol; the audit log and artifacts are read back from a real (filesystem) store.
//! No process, no socket.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use monad_protocol::frame::{self, MAX_FRAME_PAYLOAD};
use monad_protocol::io::{read_message, write_message, write_messages};
use monad_protocol::wire::{self, Body, Message, Outcome, Trust, reset};
use monad_protocol::{ErrorCode, ToolError, ToolName};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::link::{SendHalf, memory};
use super::*;
use crate::auth::DeviceId;
use crate::session::{Attached, ClientLink, Registry};
use crate::settings::Layers;
use crate::store::{ArtifactKind, AuditDecision, AuditOutcome, AuditRecord, FsStore, Store};

/// The attach request's id that names the folder on its connection.
const ATTACHMENT: u64 = 7;

/// A bound on waits for events that must happen: a hang fails the test instead of stalling it.
async fn bounded<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .unwrap_or_else(|_| panic!("{what} hung"))
}

struct Fixture {
    _dir: tempfile::TempDir,
    store: Arc<dyn Store>,
    recorder: Recorder,
    session: Arc<Session>,
    executor: Executor,
    /// The attached folder's name in the session.
    folder: String,
}

impl Fixture {
    /// A session with one restricted folder attached through an in-memory connection, and the
    /// far end of that connection.
    fn new() -> (Fixture, memory::Peer) {
        Fixture::with_client(wire::PROTOCOL_MINOR)
    }

    /// [`Fixture::new`], its client speaking protocol minor `minor`.
    fn with_client(minor: u32) -> (Fixture, memory::Peer) {
        Fixture::with(minor, Trust::Restricted)
    }

    /// [`Fixture::new`], its client speaking protocol minor `minor`, its folder attached with
    /// `trust`.
    fn with(minor: u32, trust: Trust) -> (Fixture, memory::Peer) {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(FsStore::new(dir.path()));
        let registry = Registry::new(dir.path(), store.clone(), Layers::default());
        let session = registry.open("default", "ana").unwrap();
        let recorder = Recorder::start(store.clone());
        let (conn, peer) = memory::pair();
        let (kick, _) = tokio::sync::mpsc::unbounded_channel();
        let info = session.attach(
            Attached {
                name: "project".into(),
                uri: "laptop:~/project".into(),
                trust,
                tools: ToolName::ALL.to_vec(),
                device_id: DeviceId::parse("00000000-0000-4000-8000-000000000001").unwrap(),
                path: "~/project".into(),
                record: None,
                folder: None,
                network: None,
                link: Some(ClientLink {
                    conn: Conn::Memory(conn),
                    attachment: ATTACHMENT,
                    generation: 1,
                    minor,
                    kick,
                }),
            },
            None,
        );
        let executor = Executor {
            call_timeout: None,
            recorder: Some(recorder.clone()),
            feed: Default::default(),
        };
        let fixture = Fixture {
            _dir: dir,
            store,
            recorder,
            session,
            executor,
            folder: info.name,
        };
        (fixture, peer)
    }

    /// Calls `tool` in the attached folder, collecting its progress lines.
    async fn call(&self, tool: &str, mut args: Value, progress: &Lines) -> CallOutput {
        args["workspace"] = Value::String(self.folder.clone());
        self.executor
            .call(&self.session, tool, args, progress)
            .await
    }

    /// The session's audit log, once everything sent to the recorder is written.
    fn audit(&self) -> Vec<AuditRecord> {
        self.recorder.flush();
        self.store.audit_log(&self.session.id).unwrap()
    }

    /// The only audit line, checked to be of `tool` in the folder.
    fn only_audit_line(&self, tool: &str) -> AuditRecord {
        let mut log = self.audit();
        assert_eq!(log.len(), 1, "{log:?}");
        let line = log.remove(0);
        assert_eq!(line.tool, tool);
        assert_eq!(line.workspace.as_deref(), Some(self.folder.as_str()));
        line
    }
}

/// Progress lines, as a caller sees them; each also goes to `tx` when set.
#[derive(Default)]
struct Lines {
    seen: Mutex<Vec<String>>,
    tx: Option<tokio::sync::mpsc::UnboundedSender<String>>,
}

impl ProgressSink for Lines {
    fn progress(&self, message: &str) {
        self.seen.lock().unwrap().push(message.to_owned());
        if let Some(tx) = &self.tx {
            let _ = tx.send(message.to_owned());
        }
    }
}

/// The scripted client: takes the next stream the server opens and reads its request. Returns
/// the request, the rest of what the server sends, and the way back.
async fn next_request(peer: &mut memory::Peer) -> (Message, DuplexStream, DuplexStream) {
    let (mut from_server, to_server) = peer.accept().await.expect("the server opened a stream");
    let request = read_message(&mut from_server, frame::DEFAULT_MAX_MESSAGE)
        .await
        .expect("a well-framed request")
        .expect("a request");
    (request, from_server, to_server)
}

fn run_id(request: &Message) -> u64 {
    match request {
        Message::Run { id, .. } => *id,
        other => panic!("expected a run, got {other:?}"),
    }
}

fn result(id: u64, outcome: Outcome, body: Option<Body>) -> Message {
    Message::Result {
        id,
        workspace: None,
        outcome,
        body,
    }
}

/// A successful result with `value`, and no body.
fn ok_result(id: u64, value: Value) -> Message {
    result(
        id,
        Outcome::Ok {
            result: value.into(),
        },
        None,
    )
}

fn error_of(output: &CallOutput) -> &ToolError {
    match &output.outcome {
        Outcome::Error { error } => error,
        Outcome::Ok { result } => panic!("expected an error, got {result}"),
    }
}

#[tokio::test]
async fn a_call_is_carried_to_the_client_and_its_answer_comes_back() {
    let (fx, mut peer) = Fixture::new();
    let progress = Lines::default();
    let client = async {
        let (request, mut from_server, mut to_server) = next_request(&mut peer).await;
        let Message::Run {
            id,
            attachment,
            session,
            tool,
            args,
            if_present,
        } = request
        else {
            panic!("expected a run, got {request:?}");
        };
        assert_eq!(attachment, ATTACHMENT);
        assert_eq!(session, fx.session.id);
        assert_eq!(tool, ToolName::ReadFile);
        assert_eq!(args["path"], "src/lib.rs");
        // Named, the folder is not asked first whether it has the path.
        assert_eq!(if_present, None);
        // The server finished its side after the request.
        assert!(matches!(
            read_message(&mut from_server, 1024).await,
            Ok(None)
        ));
        let progress = Message::Progress {
            id,
            message: "reading".into(),
        };
        let decided = Message::Decided {
            id,
            allowed: true,
            by: Decider::Policy,
        };
        let answer = ok_result(
            id,
            json!({"path": "src/lib.rs", "content": "fn main() {}\n"}),
        );
        write_messages(&mut to_server, &[&progress, &decided, &answer])
            .await
            .unwrap();
    };
    let (output, ()) = bounded(
        "the call",
        futures_join(
            fx.call("read_file", json!({"path": "src/lib.rs"}), &progress),
            client,
        ),
    )
    .await;
    assert_eq!(output.workspace.as_ref().unwrap().name, fx.folder);
    let Outcome::Ok { result } = &output.outcome else {
        panic!("{:?}", output.outcome);
    };
    let result = result.value();
    assert_eq!(result["content"], "fn main() {}\n");
    assert!(output.body.is_none());
    assert_eq!(*progress.seen.lock().unwrap(), ["reading"]);
    let line = fx.only_audit_line("read_file");
    assert_eq!(line.decision, AuditDecision::Allowed);
    assert_eq!(line.decided_by, Decider::Policy);
    assert_eq!(line.outcome, AuditOutcome::Ok);
    assert_eq!(line.target, "src/lib.rs");
    let artifacts = fx.store.artifacts(&fx.session.id).unwrap();
    assert_eq!(artifacts.len(), 1);
    assert_eq!(artifacts[0].kind, ArtifactKind::ToolOutput);
}

#[tokio::test]
async fn a_client_s_long_progress_lines_are_cut_before_they_are_passed_on() {
    let (fx, mut peer) = Fixture::new();
    let progress = Lines::default();
    // A megabyte of progress, and a line whose cut would fall inside a character.
    let long = "x".repeat(1 << 20);
    let wide = format!("{}é and more", "y".repeat(wire::MAX_PROGRESS - 1));
    let client = async {
        let (request, _from_server, mut to_server) = next_request(&mut peer).await;
        let id = run_id(&request);
        let lines = [&long, &wide, &"short".to_owned()].map(|message| Message::Progress {
            id,
            message: message.clone(),
        });
        let answer = ok_result(id, json!({"path": "a.txt", "content": ""}));
        write_messages(&mut to_server, &[&lines[0], &lines[1], &lines[2], &answer])
            .await
            .unwrap();
    };
    let (output, ()) = bounded(
        "the call",
        futures_join(
            fx.call("read_file", json!({"path": "a.txt"}), &progress),
            client,
        ),
    )
    .await;
    assert!(matches!(output.outcome, Outcome::Ok { .. }), "{output:?}");
    let seen = progress.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[0], long[..wire::MAX_PROGRESS]);
    assert_eq!(seen[1], wide[..wire::MAX_PROGRESS - 1]);
    assert_eq!(seen[2], "short");
}

#[tokio::test]
async fn a_command_killed_at_its_time_limit_is_logged_as_timed_out_and_one_that_failed_as_ok() {
    for (timed_out, exit_code, logged) in [
        (true, Value::Null, AuditOutcome::Failed(ErrorCode::Timeout)),
        // The call did what it was asked: the command ran and said it failed.
        (false, json!(2), AuditOutcome::Ok),
    ] {
        let (fx, mut peer) = Fixture::new();
        let client = async {
            let (request, _, mut to_server) = next_request(&mut peer).await;
            let id = run_id(&request);
            let decided = Message::Decided {
                id,
                allowed: true,
                by: Decider::User,
            };
            let answer = ok_result(
                id,
                json!({"exit_code": exit_code, "timed_out": timed_out, "stdout": "", "stderr": "",
                       "stdout_truncated": false, "stderr_truncated": false,
                       "duration_ms": 1000, "sandbox": "landlock"}),
            );
            write_messages(&mut to_server, &[&decided, &answer])
                .await
                .unwrap();
        };
        let (output, ()) = bounded(
            "the command",
            futures_join(
                fx.call(
                    "run_command",
                    json!({"argv": ["sleep", "5"], "timeout_ms": 1000}),
                    &Lines::default(),
                ),
                client,
            ),
        )
        .await;
        assert!(matches!(output.outcome, Outcome::Ok { .. }));
        let line = fx.only_audit_line("run_command");
        assert_eq!(line.decision, AuditDecision::Allowed);
        assert_eq!(line.outcome, logged, "timed out: {timed_out}");
    }
}

/// `futures::join!` for two futures, without the macro's crate.
async fn futures_join<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    tokio::join!(a, b)
}

/// The content of a large read: lines of text, `len` bytes.
fn large_content(len: usize) -> String {
    let line = "a line of a large file, with some ünïcödé in it\n";
    line.repeat(len / line.len() + 1)[..len].to_owned()
}

/// The scripted client answers a read with a body announced as `len` bytes: it sends `content`,
/// then ends its stream.
async fn answer_with_body(peer: &mut memory::Peer, content: &str, len: u64) {
    let (request, _from_server, mut to_server) = next_request(peer).await;
    let id = run_id(&request);
    let head = result(
        id,
        Outcome::Ok {
            result: json!({"path": "big.txt", "total_lines": 100}).into(),
        },
        Some(Body {
            field: "content".into(),
            len,
        }),
    );
    write_message(&mut to_server, &head).await.unwrap();
    // Written in pieces, as it would arrive.
    for piece in content.as_bytes().chunks(10_000) {
        if to_server.write_all(piece).await.is_err() {
            return;
        }
    }
}

/// A `read_file` call that the scripted client answers with `content` as a body, written on a
/// task of its own as the relay takes it: the call's output, and that task.
async fn a_read_answered_with_body(
    fx: &Fixture,
    mut peer: memory::Peer,
    content: &str,
) -> (CallOutput, tokio::task::JoinHandle<()>) {
    let client = {
        let content = content.to_owned();
        tokio::spawn(async move {
            answer_with_body(&mut peer, &content, content.len() as u64).await;
        })
    };
    let output = bounded(
        "the call",
        fx.call("read_file", json!({"path": "big.txt"}), &Lines::default()),
    )
    .await;
    (output, client)
}

/// Relays a pending body whole to an agent's end of a pipe; what the agent read.
async fn relay_to_an_agent(pending: super::link::PendingBody) -> Vec<u8> {
    let (mut sink, mut agent) = memory::pipe();
    let agent_reads = async {
        let mut got = Vec::new();
        agent.read_to_end(&mut got).await.unwrap();
        got
    };
    let relay = async {
        let relayed = pending.relay(&mut sink).await;
        sink.finish();
        relayed
    };
    let (relayed, got) = bounded("the relay", futures_join(relay, agent_reads)).await;
    assert_eq!(relayed, Ok(()));
    got
}

#[tokio::test]
async fn a_large_read_is_relayed_to_the_agent_as_a_body() {
    let (fx, peer) = Fixture::new();
    let content = large_content(300 * 1024);
    let (output, client) = a_read_answered_with_body(&fx, peer, &content).await;
    let Outcome::Ok { result } = &output.outcome else {
        panic!("{:?}", output.outcome);
    };
    assert!(
        result.value().get("content").is_none(),
        "the content follows"
    );
    let pending = output.body.expect("a pending body");
    assert_eq!(pending.body.field, "content");
    assert_eq!(pending.body.len, content.len() as u64);
    assert_eq!(relay_to_an_agent(pending).await, content.as_bytes());
    bounded("the client", client).await.unwrap();
    let line = fx.only_audit_line("read_file");
    assert_eq!(line.outcome, AuditOutcome::Ok);
    // The artifact keeps the result with the head of the content.
    let artifacts = fx.store.artifacts(&fx.session.id).unwrap();
    let (meta, bytes) = fx.store.artifact(&fx.session.id, &artifacts[0].id).unwrap();
    assert_eq!(meta.kind, ArtifactKind::ToolOutput);
    let kept = String::from_utf8_lossy(&bytes);
    assert!(kept.contains("a line of a large file"), "{kept}");
    assert!(meta.original_size > content.len() as u64);
}

/// The artifact keeps the head of a body up to its cap. A cap that cuts a character in two is
/// no reason to lose the head: it is recorded as the text it is.
#[tokio::test]
async fn a_body_whose_head_the_cap_cuts_mid_character_is_recorded_as_text() {
    let (fx, peer) = Fixture::new();
    let cap = fx.session.settings.retention.artifact_max_bytes as usize;
    // Three-byte characters, so that the cap falls inside one of them.
    assert_ne!(cap % 3, 0, "the cap falls inside a character");
    let content = "\u{20ac}".repeat(cap / 3 + 1000);
    let (output, client) = a_read_answered_with_body(&fx, peer, &content).await;
    let pending = output.body.expect("a pending body");
    assert_eq!(relay_to_an_agent(pending).await, content.as_bytes());
    bounded("the client", client).await.unwrap();
    assert_eq!(fx.only_audit_line("read_file").outcome, AuditOutcome::Ok);
    let artifacts = fx.store.artifacts(&fx.session.id).unwrap();
    let (meta, bytes) = fx.store.artifact(&fx.session.id, &artifacts[0].id).unwrap();
    assert!(meta.truncated);
    // The artifact is the head of the result's JSON, itself cut at the cap.
    let text = String::from_utf8_lossy(&bytes);
    let start = text.find("\"content\":\"").expect("the content") + "\"content\":\"".len();
    let kept = text[start..].trim_end_matches('\u{fffd}');
    assert!(
        kept.len() > cap / 2,
        "the head is kept ({} bytes)",
        kept.len()
    );
    assert!(
        kept.chars().all(|c| c == '\u{20ac}'),
        "the head is the text"
    );
}

#[tokio::test]
async fn a_large_read_is_put_back_into_the_result_for_a_caller_that_needs_one_value() {
    let (fx, mut peer) = Fixture::new();
    let content = large_content(200 * 1024);
    let call = async {
        fx.call("read_file", json!({"path": "big.txt"}), &Lines::default())
            .await
            .complete()
            .await
    };
    let ((workspace, outcome), ()) = bounded(
        "the call",
        futures_join(
            call,
            answer_with_body(&mut peer, &content, content.len() as u64),
        ),
    )
    .await;
    assert_eq!(workspace.unwrap().name, fx.folder);
    let Outcome::Ok { result } = outcome else {
        panic!("{outcome:?}");
    };
    let result = result.into_value();
    assert_eq!(result["content"].as_str().unwrap(), content);
    assert_eq!(result["total_lines"], 100);
    assert_eq!(fx.only_audit_line("read_file").outcome, AuditOutcome::Ok);
}

/// The client asks its user, and tells the server so; the user's answer (`allowed`) comes only
/// once the server has relayed the wait to the agent.
async fn approval(allowed: bool) -> (Fixture, CallOutput, Vec<String>) {
    let (fx, mut peer) = Fixture::new();
    let (tx, mut shown) = tokio::sync::mpsc::unbounded_channel();
    let progress = Lines {
        seen: Mutex::default(),
        tx: Some(tx),
    };
    let (answer_tx, answer_rx) = tokio::sync::oneshot::channel::<()>();
    let client = async {
        let (request, _from_server, mut to_server) = next_request(&mut peer).await;
        let id = run_id(&request);
        let waiting = Message::Progress {
            id,
            message: "waiting for the user of ~/project to approve `write_file`".into(),
        };
        write_message(&mut to_server, &waiting).await.unwrap();
        // The user takes their time: nothing more until the agent has seen the wait.
        answer_rx.await.unwrap();
        let outcome = if allowed {
            Outcome::Ok {
                result: json!({"path": "notes.md", "bytes_written": 2, "diff": "+hi\n"}).into(),
            }
        } else {
            Outcome::Error {
                error: ToolError::new(ErrorCode::Denied, "the user denied `write_file`"),
            }
        };
        let decided = Message::Decided {
            id,
            allowed,
            by: Decider::User,
        };
        write_messages(&mut to_server, &[&decided, &result(id, outcome, None)])
            .await
            .unwrap();
    };
    let agent = async {
        let line = shown.recv().await.expect("the wait is shown");
        assert!(line.starts_with("waiting for the user"), "{line}");
        answer_tx.send(()).unwrap();
    };
    let call = fx.call(
        "write_file",
        json!({"path": "notes.md", "content": "hi"}),
        &progress,
    );
    let (output, (), ()) =
        bounded("the approval", async { tokio::join!(call, client, agent) }).await;
    let seen = progress.seen.lock().unwrap().clone();
    (fx, output, seen)
}

#[tokio::test]
async fn an_approval_wait_is_shown_to_the_agent_then_the_allowed_call_runs() {
    let (fx, output, seen) = approval(true).await;
    assert!(matches!(output.outcome, Outcome::Ok { .. }), "{output:?}");
    assert_eq!(seen.len(), 1, "{seen:?}");
    let line = fx.only_audit_line("write_file");
    assert_eq!(line.decision, AuditDecision::Allowed);
    assert_eq!(line.decided_by, Decider::User);
    assert_eq!(line.outcome, AuditOutcome::Ok);
    let kinds: Vec<ArtifactKind> = fx
        .store
        .artifacts(&fx.session.id)
        .unwrap()
        .into_iter()
        .map(|a| a.kind)
        .collect();
    assert!(kinds.contains(&ArtifactKind::FileDiff), "{kinds:?}");
}

#[tokio::test]
async fn an_approval_wait_is_shown_to_the_agent_then_the_denied_call_is_refused() {
    let (fx, output, _) = approval(false).await;
    assert_eq!(error_of(&output).code, ErrorCode::Denied);
    let line = fx.only_audit_line("write_file");
    assert_eq!(line.decision, AuditDecision::Denied);
    assert_eq!(line.decided_by, Decider::User);
    assert_eq!(line.outcome, AuditOutcome::Failed(ErrorCode::Denied));
}

#[tokio::test]
async fn a_client_that_goes_away_mid_call_fails_the_call_as_disconnected() {
    let (fx, mut peer) = Fixture::new();
    let client = async {
        let (request, from_server, to_server) = next_request(&mut peer).await;
        run_id(&request);
        // The laptop closes: its streams and the connection go.
        drop((from_server, to_server));
        drop(peer);
    };
    let (output, ()) = bounded(
        "the call",
        futures_join(
            fx.call("stat", json!({"path": "src"}), &Lines::default()),
            client,
        ),
    )
    .await;
    let error = error_of(&output);
    assert_eq!(error.code, ErrorCode::WorkspaceDisconnected);
    assert!(error.message.contains(&fx.folder), "{error}");
    let line = fx.only_audit_line("stat");
    assert_eq!(
        line.outcome,
        AuditOutcome::Failed(ErrorCode::WorkspaceDisconnected)
    );
    // And a call after that finds the connection gone at once.
    let output = bounded(
        "the next call",
        fx.call("stat", json!({"path": "src"}), &Lines::default()),
    )
    .await;
    assert_eq!(error_of(&output).code, ErrorCode::WorkspaceDisconnected);
}

#[tokio::test]
async fn a_client_that_goes_away_mid_body_fails_the_relay_and_the_record() {
    let (fx, mut peer) = Fixture::new();
    let content = large_content(100 * 1024);
    // Announces twice what it sends, then ends its stream.
    let client = {
        let content = content.clone();
        tokio::spawn(async move {
            answer_with_body(&mut peer, &content, 2 * content.len() as u64).await;
        })
    };
    let output = bounded(
        "the call",
        fx.call("read_file", json!({"path": "big.txt"}), &Lines::default()),
    )
    .await;
    let pending = output.body.expect("a pending body");
    let (mut sink, mut agent) = memory::pipe();
    let agent_reads = async {
        let mut got = Vec::new();
        let _ = agent.read_to_end(&mut got).await;
        got.len()
    };
    let (relayed, got) = bounded(
        "the relay",
        futures_join(pending.relay(&mut sink), agent_reads),
    )
    .await;
    assert_eq!(
        relayed,
        Err(RelayError::Malformed("ended before its announced length"))
    );
    assert_eq!(sink.reset, Some(reset::MALFORMED), "the agent is told");
    assert!(got <= content.len());
    bounded("the client", client).await.unwrap();
    let line = fx.only_audit_line("read_file");
    assert_eq!(line.outcome, AuditOutcome::Failed(ErrorCode::Malformed));
}

/// The scripted client answers the run with `bytes`, raw, then ends its stream.
async fn answer_raw(peer: &mut memory::Peer, bytes: Vec<u8>) {
    let (request, _from_server, mut to_server) = next_request(peer).await;
    run_id(&request);
    let _ = to_server.write_all(&bytes).await;
}

/// Calls `stat` and has the client answer `bytes`.
async fn call_answered_with(bytes: Vec<u8>) -> (Fixture, CallOutput) {
    let (fx, mut peer) = Fixture::new();
    let (output, ()) = bounded(
        "the call",
        futures_join(
            fx.call("stat", json!({"path": "src"}), &Lines::default()),
            answer_raw(&mut peer, bytes),
        ),
    )
    .await;
    (fx, output)
}

fn frame_of(payload: &[u8]) -> Vec<u8> {
    let mut bytes = frame::encode_header(payload.len(), true).to_vec();
    bytes.extend_from_slice(payload);
    bytes
}

#[tokio::test]
async fn a_malformed_answer_from_the_client_is_a_malformed_error_not_a_success() {
    let oversized_header = {
        let len = (MAX_FRAME_PAYLOAD as u32 + 1).to_be_bytes();
        vec![len[0], len[1], len[2], len[3], frame::FLAG_FIN]
    };
    let cases: [(&str, Vec<u8>); 4] = [
        ("a frame larger than a frame may be", oversized_header),
        (
            "a frame with unknown flags",
            vec![0, 0, 0, 2, 0x80, b'{', b'}'],
        ),
        ("a frame of something else than JSON", frame_of(b"not json")),
        (
            "a message of no known type",
            frame_of(br#"{"type":"no_such_message","id":1}"#),
        ),
    ];
    for (what, bytes) in cases {
        let (fx, output) = call_answered_with(bytes).await;
        let error = error_of(&output);
        assert_eq!(error.code, ErrorCode::Malformed, "{what}: {error}");
        assert!(error.message.contains(&fx.folder), "{what}: {error}");
        let line = fx.only_audit_line("stat");
        assert_eq!(
            line.outcome,
            AuditOutcome::Failed(ErrorCode::Malformed),
            "{what}"
        );
    }
}

#[tokio::test]
async fn a_result_announcing_an_oversized_body_is_refused_before_reading_it() {
    let answer = Message::Result {
        id: 1,
        workspace: None,
        outcome: Outcome::Ok {
            result: json!({"path": "big.txt"}).into(),
        },
        body: Some(Body {
            field: "content".into(),
            len: link::MAX_CLIENT_MESSAGE as u64 + 1,
        }),
    };
    let (fx, output) = call_answered_with(frame_of(&answer.to_json())).await;
    let error = error_of(&output);
    assert_eq!(error.code, ErrorCode::LimitExceeded, "{error}");
    assert!(output.body.is_none());
    let line = fx.only_audit_line("stat");
    assert_eq!(line.outcome, AuditOutcome::Failed(ErrorCode::LimitExceeded));
}

#[tokio::test]
async fn a_cancelled_call_stops_the_client_stream_and_is_recorded_as_cancelled() {
    let (fx, mut peer) = Fixture::new();
    let (reached_tx, reached) = tokio::sync::oneshot::channel::<()>();
    let (cancelled, cancelled_rx) = tokio::sync::oneshot::channel::<()>();
    // The client waits for its user; the agent cancels meanwhile.
    let client = tokio::spawn(async move {
        let (request, mut from_server, mut to_server) = next_request(&mut peer).await;
        let id = run_id(&request);
        let waiting = Message::Progress {
            id,
            message: "waiting for approval".into(),
        };
        write_message(&mut to_server, &waiting).await.unwrap();
        reached_tx.send(()).unwrap();
        // Nothing more comes from the server.
        assert!(matches!(
            read_message(&mut from_server, 1024).await,
            Ok(None)
        ));
        // Once the server dropped the call, its answer has nowhere to go.
        cancelled_rx.await.unwrap();
        let late = ok_result(id, json!({"path": "src"}));
        write_message(&mut to_server, &late).await
    });
    let (tx, mut shown) = tokio::sync::mpsc::unbounded_channel();
    let progress = Lines {
        seen: Mutex::default(),
        tx: Some(tx),
    };
    let call = fx.call("stat", json!({"path": "src"}), &progress);
    let finished = bounded("the cancel", async {
        tokio::select! {
            output = call => Some(output),
            _ = async {
                reached.await.unwrap();
                shown.recv().await
            } => None,
        }
    })
    .await;
    assert!(
        finished.is_none(),
        "the call was still waiting: {finished:?}"
    );
    cancelled.send(()).unwrap();
    let late = bounded("the client", client).await.unwrap();
    assert_eq!(
        late.map_err(|e| e.kind()),
        Err(std::io::ErrorKind::BrokenPipe),
        "the client's stream is closed once the call is dropped"
    );
    let line = fx.only_audit_line("stat");
    assert_eq!(line.decision, AuditDecision::Cancelled);
    assert_eq!(line.outcome, AuditOutcome::Failed(ErrorCode::Cancelled));
}

#[tokio::test]
async fn a_path_is_looked_for_in_the_folder_of_an_older_client_with_a_probe() {
    let (fx, mut peer) = Fixture::with_client(wire::IF_PRESENT_MINOR - 1);
    // The primary workspace has no `only/on/laptop.txt`: routing asks the client, then runs.
    let output = routed_call(
        &fx,
        &mut peer,
        "stat",
        json!({"path": "only/on/laptop.txt"}),
        async |peer| {
            let answer = json!({"path": "only/on/laptop.txt", "kind": "file"});
            probed_then_run(peer, "only/on/laptop.txt", answer).await;
        },
        None,
    )
    .await;
    assert!(matches!(output.outcome, Outcome::Ok { .. }), "{output:?}");
    assert_eq!(output.workspace.unwrap().name, fx.folder);
}

/// Calls `tool` with `args` (no `workspace`) while `client` plays the folder's client; then
/// checks that the client was asked nothing more.
async fn routed_call(
    fx: &Fixture,
    peer: &mut memory::Peer,
    tool: &str,
    args: Value,
    client: impl AsyncFnOnce(&mut memory::Peer),
    gate: Option<&dyn PermissionGate>,
) -> CallOutput {
    let progress = Lines::default();
    let call = fx
        .executor
        .call_gated(&fx.session, tool, args, &progress, gate);
    let (output, ()) = bounded("the call", futures_join(call, client(peer))).await;
    let more = tokio::time::timeout(Duration::from_millis(100), peer.accept()).await;
    assert!(more.is_err(), "the client was asked something more");
    output
}

#[tokio::test]
async fn a_read_without_workspace_runs_where_the_path_is_in_one_round_trip() {
    let (fx, mut peer) = Fixture::new();
    let output = routed_call(
        &fx,
        &mut peer,
        "read_file",
        json!({"path": "only/on/laptop.txt"}),
        async |peer| {
            // The primary has no such file: the folder is asked to run the read if it has it.
            let (request, _from_server, mut to_server) = next_request(peer).await;
            let Message::Run {
                id,
                tool,
                if_present,
                ..
            } = request
            else {
                panic!("expected a run, got {request:?}");
            };
            assert_eq!(tool, ToolName::ReadFile);
            assert_eq!(if_present.as_deref(), Some("only/on/laptop.txt"));
            let present = Message::Probed { id, exists: true };
            let decided = Message::Decided {
                id,
                allowed: true,
                by: Decider::Policy,
            };
            let answer = ok_result(id, json!({"path": "only/on/laptop.txt", "content": "hi\n"}));
            write_messages(&mut to_server, &[&present, &decided, &answer])
                .await
                .unwrap();
        },
        None,
    )
    .await;
    assert!(matches!(output.outcome, Outcome::Ok { .. }), "{output:?}");
    assert_eq!(output.workspace.unwrap().name, fx.folder);
    let line = fx.only_audit_line("read_file");
    assert_eq!(line.decision, AuditDecision::Allowed);
    assert_eq!(line.decided_by, Decider::Policy);
}

#[tokio::test]
async fn a_folder_without_the_path_runs_nothing_and_routing_goes_on_but_never_past_a_silent_focus()
{
    for silent in [false, true] {
        let (fx, mut peer) = Fixture::new();
        // The primary has `docs`; the folder, the focus, is asked first.
        let progress = Lines::default();
        let args = json!({"path": "docs/a.md", "content": "a\n", "workspace": "primary"});
        let written = fx
            .executor
            .call(&fx.session, "write_file", args, &progress)
            .await;
        assert!(matches!(written.outcome, Outcome::Ok { .. }), "{written:?}");
        fx.session.set_focus(&fx.folder).unwrap();
        let output = routed_call(
            &fx,
            &mut peer,
            "list_dir",
            json!({"path": "docs"}),
            async |peer| {
                let (request, _from_server, mut to_server) = next_request(peer).await;
                let Message::Run { id, if_present, .. } = request else {
                    panic!("expected a run, got {request:?}");
                };
                assert_eq!(if_present.as_deref(), Some("docs"));
                if !silent {
                    let absent = Message::Probed { id, exists: false };
                    write_message(&mut to_server, &absent).await.unwrap();
                }
                // Gone without a word: as a probe whose client went away.
            },
            None,
        )
        .await;
        if silent {
            // The focus could not say: the call does not go past it to another copy.
            let error = error_of(&output);
            assert_eq!(error.code, ErrorCode::WorkspaceDisconnected, "{error:?}");
            assert!(
                error
                    .message
                    .contains("the focus workspace `project` could not be asked"),
                "{error:?}"
            );
            continue;
        }
        assert!(matches!(output.outcome, Outcome::Ok { .. }), "{output:?}");
        assert_eq!(output.workspace.unwrap().name, "primary");
        // Recorded where it ran, as the primary's call.
        let log = fx.audit();
        assert_eq!(log.len(), 2, "{log:?}");
        assert_eq!(log[1].workspace.as_deref(), Some("primary"));
        assert_eq!(log[1].decided_by, Decider::Trust);
        assert!(peer.stops().is_empty(), "{:?}", peer.stops());
    }
}

#[tokio::test]
async fn a_path_found_nowhere_with_a_misspelled_argument_reports_the_argument() {
    for (args, code, said) in [
        (
            json!({"path": "nope.txt", "ofset": 5}),
            ErrorCode::InvalidArguments,
            "unknown field `ofset`",
        ),
        (
            json!({"path": "nope.txt", "offset": 5}),
            ErrorCode::NotFound,
            "does not exist in any workspace",
        ),
    ] {
        let (fx, mut peer) = Fixture::new();
        let output = routed_call(
            &fx,
            &mut peer,
            "read_file",
            args,
            async |peer| {
                let (request, _from_server, mut to_server) = next_request(peer).await;
                let Message::Run { id, .. } = request else {
                    panic!("expected a run, got {request:?}");
                };
                let absent = Message::Probed { id, exists: false };
                write_message(&mut to_server, &absent).await.unwrap();
            },
            None,
        )
        .await;
        let error = error_of(&output);
        assert_eq!(error.code, code, "{error:?}");
        assert!(error.message.contains(said), "{error:?}");
    }
}

#[tokio::test]
async fn a_read_cancelled_while_its_folder_is_asked_is_recorded_as_far_as_it_got() {
    for said in [false, true] {
        let (fx, mut peer) = Fixture::new();
        let (asked_tx, asked) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done) = tokio::sync::oneshot::channel::<()>();
        let client = tokio::spawn(async move {
            let (request, _from_server, mut to_server) = next_request(&mut peer).await;
            let Message::Run { id, .. } = request else {
                panic!("expected a run, got {request:?}");
            };
            if said {
                let present = Message::Probed { id, exists: true };
                let waiting = Message::Progress {
                    id,
                    message: "waiting for approval".into(),
                };
                write_messages(&mut to_server, &[&present, &waiting])
                    .await
                    .unwrap();
            }
            asked_tx.send(()).unwrap();
            done.await.unwrap();
            (peer, to_server)
        });
        let (tx, mut shown) = tokio::sync::mpsc::unbounded_channel();
        let progress = Lines {
            seen: Mutex::default(),
            tx: Some(tx),
        };
        let call = fx
            .executor
            .call(&fx.session, "stat", json!({"path": "src"}), &progress);
        let finished = bounded("the cancel", async {
            tokio::select! {
                output = call => Some(output),
                _ = async {
                    asked.await.unwrap();
                    if said {
                        // The folder said it has the path: the call is on its way there.
                        shown.recv().await;
                    }
                } => None,
            }
        })
        .await;
        assert!(
            finished.is_none(),
            "the call was still waiting: {finished:?}"
        );
        done_tx.send(()).unwrap();
        let _ = bounded("the client", client).await.unwrap();
        let log = fx.audit();
        assert_eq!(log.len(), 1, "{log:?}");
        assert_eq!(log[0].decision, AuditDecision::Cancelled);
        // Not routed while only asked; the folder's once it said it has the path.
        let workspace = said.then(|| fx.folder.clone());
        assert_eq!(log[0].workspace, workspace, "said: {said}");
    }
}

/// The scripted client answers a probe of `path` that it exists, then the run that follows
/// (which must not be conditional) with `result`.
async fn probed_then_run(peer: &mut memory::Peer, path: &str, answer: Value) {
    let (request, _from_server, mut to_server) = next_request(peer).await;
    let Message::Probe {
        id, path: asked, ..
    } = request
    else {
        panic!("expected a probe, got {request:?}");
    };
    assert_eq!(asked, path);
    write_message(&mut to_server, &Message::Probed { id, exists: true })
        .await
        .unwrap();
    drop(to_server);
    let (request, _from_server, mut to_server) = next_request(peer).await;
    let Message::Run { id, if_present, .. } = request else {
        panic!("expected a run, got {request:?}");
    };
    assert_eq!(if_present, None);
    let answer = ok_result(id, answer);
    write_message(&mut to_server, &answer).await.unwrap();
}

#[tokio::test]
async fn a_write_is_probed_before_it_runs() {
    let (fx, mut peer) = Fixture::new();
    let output = routed_call(
        &fx,
        &mut peer,
        "edit_file",
        json!({"path": "a.rs", "old_string": "x", "new_string": "y"}),
        async |peer| {
            probed_then_run(peer, "a.rs", json!({"path": "a.rs", "replacements": 1})).await
        },
        None,
    )
    .await;
    assert!(matches!(output.outcome, Outcome::Ok { .. }), "{output:?}");
}

/// A front's permission that allows everything, counting what it was asked and keeping what
/// each question showed.
#[derive(Default)]
struct Allow(
    std::sync::atomic::AtomicUsize,
    std::sync::Mutex<Vec<String>>,
);

impl PermissionGate for Allow {
    fn ask(
        &self,
        ask: PermissionAsk,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + '_>> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.1.lock().unwrap().push(ask.what);
        Box::pin(async { true })
    }
}

/// An editor asked to allow a call is shown the call whole, however long (the audit keeps its
/// first 64 KiB): cut, a command of 64 KiB of filler hid its end from the one who allowed it.
#[tokio::test]
async fn a_front_is_asked_about_the_call_whole() {
    let (fx, mut peer) = Fixture::new();
    let gate = Allow::default();
    let path = format!("{}/payload.txt", "d".repeat(100 * 1024));
    let output = routed_call(
        &fx,
        &mut peer,
        "stat",
        json!({ "path": path }),
        async |peer| {
            probed_then_run(peer, &path, json!({"kind": "file"})).await;
        },
        Some(&gate),
    )
    .await;
    assert!(matches!(output.outcome, Outcome::Ok { .. }), "{output:?}");
    let asked = gate.1.lock().unwrap().clone();
    assert_eq!(asked, std::slice::from_ref(&path), "the whole path");
    let line = fx.only_audit_line("stat");
    assert!(line.target.len() < path.len(), "the audit keeps its head");
}

#[tokio::test]
async fn a_front_that_asks_its_user_is_asked_only_for_the_folder_that_has_the_path() {
    let (fx, mut peer) = Fixture::new();
    let gate = Allow::default();
    let output = routed_call(
        &fx,
        &mut peer,
        "stat",
        json!({"path": "only/on/laptop.txt"}),
        async |peer| {
            probed_then_run(peer, "only/on/laptop.txt", json!({"kind": "file"})).await;
        },
        Some(&gate),
    )
    .await;
    assert!(matches!(output.outcome, Outcome::Ok { .. }), "{output:?}");
    assert_eq!(gate.0.load(std::sync::atomic::Ordering::SeqCst), 1);

    // A folder without the path: probed, never run, and the front's user never asked.
    let (fx, mut peer) = Fixture::new();
    let gate = Allow::default();
    let output = routed_call(
        &fx,
        &mut peer,
        "stat",
        json!({"path": "nowhere"}),
        async |peer| {
            let (request, _from_server, mut to_server) = next_request(peer).await;
            let Message::Probe { id, .. } = request else {
                panic!("expected a probe, got {request:?}");
            };
            let absent = Message::Probed { id, exists: false };
            write_message(&mut to_server, &absent).await.unwrap();
        },
        Some(&gate),
    )
    .await;
    assert_eq!(error_of(&output).code, ErrorCode::NotFound);
    assert_eq!(gate.0.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_fully_trusted_folder_behind_a_front_that_asks_runs_a_read_where_the_path_is_unasked() {
    // The front's user is asked only about restricted folders: a fully trusted one is sent the
    // read with its probe, as without a gate.
    let (fx, mut peer) = Fixture::with(wire::PROTOCOL_MINOR, Trust::Full);
    let gate = Allow::default();
    let output = read_if_present(
        &fx,
        &mut peer,
        json!({"path": "only/on/laptop.txt"}),
        async |id, mut to_server| {
            let present = Message::Probed { id, exists: true };
            let answer = ok_result(id, json!({"path": "only/on/laptop.txt", "content": ""}));
            write_messages(&mut to_server, &[&present, &answer])
                .await
                .unwrap();
        },
        Some(&gate),
    )
    .await;
    assert!(matches!(output.outcome, Outcome::Ok { .. }), "{output:?}");
    assert_eq!(output.workspace.unwrap().name, fx.folder);
    assert_eq!(gate.0.load(std::sync::atomic::Ordering::SeqCst), 0);
    let line = fx.only_audit_line("read_file");
    assert_eq!(line.decision, AuditDecision::Allowed);
}

/// Calls `read_file` with `args` (no `workspace`) while the scripted client takes the `run` with
/// `if_present` it must get and plays it with `then` ([`conditional_run`]).
async fn read_if_present<F: Future<Output = ()>>(
    fx: &Fixture,
    peer: &mut memory::Peer,
    args: Value,
    then: impl FnOnce(u64, DuplexStream) -> F,
    gate: Option<&dyn PermissionGate>,
) -> CallOutput {
    routed_call(
        fx,
        peer,
        "read_file",
        args,
        async move |peer| conditional_run(peer, then).await,
        gate,
    )
    .await
}

/// The scripted client takes a `run` with `if_present` and gives it to `then` with its way back.
async fn conditional_run<F: Future<Output = ()>>(
    peer: &mut memory::Peer,
    then: impl FnOnce(u64, DuplexStream) -> F,
) {
    let (request, _from_server, to_server) = next_request(peer).await;
    let Message::Run { id, if_present, .. } = request else {
        panic!("expected a run, got {request:?}");
    };
    assert!(if_present.is_some(), "a run with `if_present`");
    then(id, to_server).await;
}

#[tokio::test(start_paused = true)]
async fn a_folder_that_does_not_say_in_time_is_passed_over_for_a_read_and_told_to_stop() {
    let (fx, mut peer) = Fixture::new();
    let (late_tx, late) = tokio::sync::oneshot::channel();
    let output = read_if_present(
        &fx,
        &mut peer,
        json!({"path": "slow.txt"}),
        async |id, mut to_server| {
            // Says nothing until the server has given up (the clock is paused: the 10 s
            // go by as soon as nothing else can run).
            tokio::time::sleep(Duration::from_secs(11)).await;
            let present = Message::Probed { id, exists: true };
            let _ = late_tx.send(write_message(&mut to_server, &present).await);
        },
        None,
    )
    .await;
    let error = error_of(&output);
    assert_eq!(error.code, ErrorCode::NotFound, "{error:?}");
    assert!(
        error
            .message
            .contains("`project` could not be asked (its client did not answer within 10 s"),
        "{}",
        error.message
    );
    assert!(late.await.unwrap().is_err(), "the stream was let go of");
}

#[tokio::test]
async fn a_folder_that_runs_the_read_before_saying_it_has_the_path_is_stopped_and_passed_over() {
    let (fx, mut peer) = Fixture::new();
    let output = read_if_present(
        &fx,
        &mut peer,
        json!({"path": "a.txt"}),
        async |id, mut to_server| {
            let decided = Message::Decided {
                id,
                allowed: true,
                by: Decider::Policy,
            };
            write_message(&mut to_server, &decided).await.unwrap();
            // Nothing after that is taken.
            let mut late = Ok(());
            for _ in 0..100 {
                late = write_message(&mut to_server, &decided).await;
                if late.is_err() {
                    break;
                }
                tokio::task::yield_now().await;
            }
            assert!(late.is_err(), "the stream is still read");
        },
        None,
    )
    .await;
    let error = error_of(&output);
    assert_eq!(error.code, ErrorCode::NotFound, "{error:?}");
    assert!(
        error
            .message
            .contains("`project` could not be asked (looking there failed"),
        "{}",
        error.message
    );
    assert_eq!(peer.stops(), [reset::MALFORMED]);
}

#[tokio::test]
async fn a_folder_that_goes_away_after_saying_it_has_the_path_fails_the_call_as_disconnected() {
    let (fx, mut peer) = Fixture::new();
    let output = read_if_present(
        &fx,
        &mut peer,
        json!({"path": "a.txt"}),
        async |id, mut to_server| {
            let present = Message::Probed { id, exists: true };
            write_message(&mut to_server, &present).await.unwrap();
        },
        None,
    )
    .await;
    // It ran there: the folder is named, and no other workspace is tried.
    let error = error_of(&output);
    assert_eq!(error.code, ErrorCode::WorkspaceDisconnected, "{error:?}");
    assert_eq!(output.workspace.unwrap().name, fx.folder);
    let line = fx.only_audit_line("read_file");
    assert_eq!(
        line.outcome,
        AuditOutcome::Failed(ErrorCode::WorkspaceDisconnected)
    );
}

/// A folder's client older than `search`'s `context` and `files_only` refuses them as unknown
/// fields, after its owner was asked: the server refuses such a search itself, naming the
/// client, and sends the client one whose values ask for nothing without them.
#[tokio::test]
async fn a_search_with_context_is_refused_for_an_older_client_and_empty_values_are_left_out() {
    let (fx, mut peer) = Fixture::with_client(wire::SEARCH_CONTEXT_MINOR - 1);
    for asks in [
        json!({"pattern": "x", "context": 2, "workspace": "project"}),
        json!({"pattern": "x", "files_only": true, "workspace": "project"}),
    ] {
        let output = routed_call(&fx, &mut peer, "search", asks, async |_| {}, None).await;
        let Outcome::Error { error } = &output.outcome else {
            panic!("{output:?}");
        };
        assert_eq!(error.code, ErrorCode::InvalidArguments, "{error:?}");
        assert!(
            error.message.contains("newer monad-client") && error.message.contains("`project`"),
            "{}",
            error.message
        );
    }
    let nothing =
        json!({"pattern": "x", "context": 0, "files_only": false, "workspace": "project"});
    let output = routed_call(
        &fx,
        &mut peer,
        "search",
        nothing,
        async |peer| {
            let (request, _from_server, mut to_server) = next_request(peer).await;
            let Message::Run { id, args, .. } = request else {
                panic!("expected a run, got {request:?}");
            };
            assert_eq!(args, json!({"pattern": "x", "workspace": "project"}));
            let found = json!({"matches": [], "files_searched": 1, "truncated": false});
            write_message(&mut to_server, &ok_result(id, found))
                .await
                .unwrap();
        },
        None,
    )
    .await;
    assert!(matches!(output.outcome, Outcome::Ok { .. }), "{output:?}");
}

#[tokio::test]
async fn a_memory_recall_answers_with_a_bounded_share_of_the_notes_and_counts_the_rest() {
    use monad_protocol::tools::{
        MEMORY_RECALL_MAX_BYTES, MEMORY_RECALL_SCAN_MAX_BYTES, MemoryRecallResult,
    };
    let (fx, _peer) = Fixture::new();
    let progress = Lines::default();
    let call = async |tool: &str, args: Value| {
        let output = fx.executor.call(&fx.session, tool, args, &progress).await;
        match output.outcome {
            Outcome::Ok { result } => result.into_value(),
            other => panic!("{tool}: {other:?}"),
        }
    };
    // Enough notes of 250,000 bytes that reading them all passes the scan's bound; the last
    // one, in key order, holds the word looked for.
    let note = 250_000;
    let count = MEMORY_RECALL_SCAN_MAX_BYTES / note as u64 + 3;
    for i in 0..count {
        let text = "a".repeat(note);
        call(
            "memory_store",
            json!({"key": format!("n{i:03}"), "text": text}),
        )
        .await;
    }
    call("memory_store", json!({"key": "z", "text": "the needle"})).await;
    // A small note after one that does not fit is still shown.
    call("memory_store", json!({"key": "n001a", "text": "small"})).await;
    let all = count + 2;

    // Without a query: the notes in key order that fit, the others counted.
    let recalled: MemoryRecallResult =
        serde_json::from_value(call("memory_recall", json!({})).await).unwrap();
    let shown: usize = recalled
        .notes
        .iter()
        .map(|n| n.key.len() + n.text.len())
        .sum();
    assert!(
        shown <= MEMORY_RECALL_MAX_BYTES,
        "{shown} bytes of notes in one answer"
    );
    let keys: Vec<&str> = recalled.notes.iter().map(|n| n.key.as_str()).collect();
    assert_eq!(keys, ["n000", "n001a"]);
    assert_eq!(recalled.notes.len() as u64 + recalled.not_shown, all);
    assert_eq!(recalled.not_matching, 0);

    // A query: the notes past what one recall reads are not looked at, and said to be left out
    // rather than not matching.
    let recalled: MemoryRecallResult =
        serde_json::from_value(call("memory_recall", json!({"query": "needle"})).await).unwrap();
    assert!(recalled.notes.is_empty(), "{:?}", recalled.notes.len());
    assert!(recalled.not_shown >= 1, "{}", recalled.not_shown);
    assert_eq!(recalled.not_matching + recalled.not_shown, all);
    // Every note read but the small one is of `note` bytes.
    let read = (recalled.not_matching - 1) * note as u64;
    assert!(
        read < MEMORY_RECALL_SCAN_MAX_BYTES + note as u64,
        "{read} bytes read"
    );
}
