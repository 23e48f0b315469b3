//! What happens when things go wrong: a client killed mid-call, a server restart, malformed
//! input, a shutdown with calls in flight. Never a hang, never a panic, never a lost answer.

use std::path::Path;
use std::time::{Duration, Instant};

use monad_client::attach::AttachEvent;
use monad_protocol::frame::{FLAG_FIN, MAX_FRAME_PAYLOAD, encode_header};
use monad_protocol::io::read_message;
use monad_protocol::wire::Message;
use monad_protocol::{ErrorCode, ToolClass, ToolName};
use monad_tests::{
    Attachment, STEP, TestServer, attach_options, call, command, connect_agent, expect_code,
    folder, ok, wait_for_line, within,
};
use serde_json::json;
use tokio::io::AsyncBufReadExt;

/// Polls (with a deadline) until `path` is a non-empty file; returns its content.
async fn wait_for_file(path: &Path, what: &str) -> String {
    within(STEP, what, async {
        loop {
            match std::fs::read_to_string(path) {
                Ok(text) if !text.is_empty() => return text,
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_client_mid_call_is_workspace_disconnected_promptly() {
    let server = TestServer::start().await;
    let config_dir = tempfile::tempdir().unwrap();
    server.client_config().save(config_dir.path()).unwrap();
    let dir = folder(&[]);
    let mut client = command("monad-client")
        .arg("attach")
        .arg(dir.path())
        .args(["--name", "lap", "--allow", "exec", "--non-interactive"])
        .env("MONAD_CONFIG_DIR", config_dir.path())
        .spawn()
        .expect("monad-client starts");
    let mut stderr = tokio::io::BufReader::new(client.stderr.take().unwrap()).lines();
    wait_for_line(&mut stderr, STEP, "the attach confirmation", |l| {
        l.starts_with("attached ")
    })
    .await;

    let agent = server.agent().await;
    let caller = agent.clone();
    let running = tokio::spawn(async move {
        caller
            .call(
                None,
                "run_command",
                json!({"argv": ["sh", "-c", "echo $$ > started; exec sleep 30"], "workspace": "lap"}),
                |_| {},
            )
            .await
    });
    // The command runs on the client once `started` holds its pid.
    let pid: i32 = wait_for_file(&dir.path().join("started"), "the command to start")
        .await
        .trim()
        .parse()
        .expect("a pid");

    let killed = Instant::now();
    client.start_kill().expect("SIGKILL sent");
    within(STEP, "the client to die", client.wait())
        .await
        .unwrap();
    // The orphaned `sleep` has nobody left to kill it.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    let reply = within(
        Duration::from_secs(10),
        "the call to fail after its client was killed",
        running,
    )
    .await
    .expect("the call task does not panic")
    .expect("the server answers the call");
    let message = expect_code(reply, ErrorCode::WorkspaceDisconnected);
    assert!(message.contains("lap"), "{message}");
    // The audit log still says who let the command run: the client sent its decision before
    // running it.
    if let Some(recorder) = &server.state().executor.recorder {
        recorder.flush();
    }
    let audit = std::fs::read_to_string(server.data_dir().join("sessions/default/audit.jsonl"))
        .expect("an audit log");
    let line: serde_json::Value = audit
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .find(|l: &serde_json::Value| l["tool"] == "run_command")
        .expect("the command is in the audit log");
    assert_eq!(line["decided_by"], "policy", "{line}");
    assert_eq!(line["outcome"], "workspace_disconnected", "{line}");
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "noticed after {:?}",
        killed.elapsed()
    );

    // The workspace is listed offline, and calls to it fail at once.
    within(STEP, "the workspace to be listed offline", async {
        loop {
            let (result, _) = ok(call(&agent, "workspaces", json!({})).await);
            if result["workspaces"][1]["online"] == false {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    expect_code(
        call(&agent, "list_dir", json!({"workspace": "lap"})).await,
        ErrorCode::WorkspaceDisconnected,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attached_folder_comes_back_by_itself_after_a_server_restart() {
    let server = TestServer::start().await;
    let dir = folder(&[("a.txt", "alpha\n")]);
    let mut options = attach_options(dir.path(), "lap");
    options.allow = vec![ToolClass::Read];
    let mut attached = Attachment::start(&server.client_config(), options, None).await;
    let config = server.client_config();
    let agent = connect_agent(&config).await;
    let (_, ran_in) = ok(call(&agent, "read_file", json!({"path": "a.txt"})).await);
    assert_eq!(ran_in, "lap");
    drop(agent);

    let stopped = server.stop().await;
    loop {
        match attached.next_event().await {
            AttachEvent::Disconnected { .. } => break,
            AttachEvent::Decided { .. } | AttachEvent::Finished { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }

    // Kept alive to the end: dropping a TestServer shuts it down.
    let _server = stopped.restart().await;
    let workspace = attached.wait_attached().await;
    assert_eq!(
        (workspace.name.as_str(), attached.session.as_str()),
        ("lap", "default")
    );
    let agent = connect_agent(&config).await;
    let (result, ran_in) = ok(call(&agent, "read_file", json!({"path": "a.txt"})).await);
    assert_eq!(
        (result["content"].as_str(), ran_in.as_str()),
        (Some("alpha\n"), "lap")
    );
    let (result, _) = ok(call(&agent, "workspaces", json!({})).await);
    assert_eq!(
        result["workspaces"].as_array().map(Vec::len),
        Some(2),
        "re-attached under the same entry: {result}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_attached_folders_and_watches_does_not_wait_out_its_grace() {
    let server = TestServer::start().await;
    let grace = server.config().shutdown_grace;
    let dir = folder(&[]);
    let mut attached = Attachment::start(
        &server.client_config(),
        attach_options(dir.path(), "lap"),
        None,
    )
    .await;
    let agent = server.agent().await;
    let mut watch = within(STEP, "a watch", agent.watch(None))
        .await
        .expect("the watch starts");
    let (_, first) = within(STEP, "the first list", watch.recv())
        .await
        .expect("a list");
    assert_eq!(first.len(), 2);

    // Nothing is in flight: neither the held attachment nor the open watch may keep the
    // server waiting for its grace period.
    let stopping = Instant::now();
    let _stopped = server.stop().await;
    let took = stopping.elapsed();
    assert!(took < grace / 2, "shutdown took {took:?} (grace {grace:?})");
    // Both peers are told.
    within(STEP, "the watch to end", async {
        while watch.recv().await.is_some() {}
    })
    .await;
    match attached.next_event().await {
        AttachEvent::Disconnected { .. } => {}
        other => panic!("unexpected {other:?}"),
    }
}

/// One frame with FIN around `payload`.
fn frame(payload: &[u8]) -> Vec<u8> {
    let mut bytes = encode_header(payload.len(), true).to_vec();
    bytes.extend_from_slice(payload);
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_frames_fail_only_their_own_stream() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let mut oversized = ((MAX_FRAME_PAYLOAD + 1) as u32).to_be_bytes().to_vec();
    oversized.push(FLAG_FIN);
    oversized.extend(std::iter::repeat_n(b'x', 64 * 1024));
    let mut truncated = encode_header(100, true).to_vec();
    truncated.extend_from_slice(br#"{"type":"#);
    // (what, bytes, must the server answer with an error rather than just close the stream)
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("garbage JSON", frame(b"{this is not json"), true),
        (
            "an unknown message type",
            frame(br#"{"type":"launch_missiles","id":1}"#),
            true,
        ),
        (
            "a message agents do not send",
            frame(br#"{"type":"probed","id":1,"exists":true}"#),
            true,
        ),
        (
            "unknown frame flags",
            vec![0, 0, 0, 2, 0x80, b'{', b'}'],
            true,
        ),
        ("a truncated frame", truncated, true),
        (
            "a frame header announcing more than 1 MiB",
            oversized,
            false,
        ),
    ];
    for (what, bytes, must_answer) in cases {
        let (mut send, mut recv) = within(STEP, "a stream", agent.quic().open_bi())
            .await
            .unwrap_or_else(|e| panic!("{what}: cannot open a stream: {e}"));
        // The server may stop reading before all is sent: that is one of the right answers.
        let _ = send.write_all(&bytes).await;
        let _ = send.finish();
        let answer = within(
            STEP,
            &format!("the answer to {what}"),
            read_message(&mut recv, 1024 * 1024),
        )
        .await;
        match answer {
            Ok(Some(Message::Error { error, .. })) => {
                assert_eq!(error.code, ErrorCode::Malformed, "{what}: {error}")
            }
            Ok(None) | Err(_) if !must_answer => {}
            other => panic!("{what}: expected a malformed error, got {other:?}"),
        }
        // The same connection still serves calls.
        let (_, ran_in) = ok(call(&agent, "workspaces", json!({})).await);
        assert_eq!(ran_in, "primary", "after {what}");
    }
    // And so does a new one.
    let other = server.agent().await;
    ok(call(&other, "workspaces", json!({})).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_an_in_flight_call_finish() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    ok(call(&agent, "workspaces", json!({})).await);
    let marker = server.primary_dir("default").join("started");
    let caller = agent.clone();
    let running = tokio::spawn(async move {
        caller
            .call(
                None,
                "run_command",
                json!({"argv": ["sh", "-c", "echo yes > started; sleep 1; echo finished"]}),
                |_| {},
            )
            .await
    });
    wait_for_file(&marker, "the command to start").await;
    let stopping = server.begin_shutdown();
    let reply = within(STEP, "the in-flight call", running)
        .await
        .expect("the call task does not panic")
        .expect("the in-flight call is answered during the shutdown");
    let (result, ran_in) = ok(reply);
    assert_eq!(ran_in, "primary");
    assert_eq!(result["exit_code"], 0, "{result}");
    assert_eq!(result["stdout"], "finished\n", "{result}");
    within(STEP, "the shutdown to complete", stopping)
        .await
        .expect("the shutdown task does not panic");
}

/// A server that takes an attached folder's network reports and then stops granting the attach
/// stream credit (a compromised server, or one whose reader is stuck): the folder still answers
/// its requests. Regression: the reports were written inside the attachment's loop, so a write
/// waiting for credit held every other branch: no request was taken, and the owner's Ctrl-C
/// did nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stops_reading_network_reports_still_gets_answers() {
    use monad_protocol::io::write_message;
    use monad_protocol::wire::{Host, Trust, WorkspaceInfo};
    use monad_sandbox::NetworkMode;
    // A stream window of 4 KiB, never moved on for the attach stream, which is not read.
    let server = monad_tests::RogueServer::start(|transport| {
        transport.stream_receive_window(4096u32.into());
    });
    let endpoint = server.endpoint.clone();
    let (conn_tx, conn_rx) = tokio::sync::oneshot::channel();
    let rogue = tokio::spawn(async move {
        let conn = monad_tests::RogueServer::welcome(&endpoint).await;
        let (mut send, mut recv) = conn.accept_bi().await.unwrap();
        let Some(Message::Attach { id, name, .. }) =
            read_message(&mut recv, 1 << 20).await.unwrap()
        else {
            panic!("no attach");
        };
        let attached = Message::Attached {
            id,
            session: "default".into(),
            workspace: WorkspaceInfo {
                name: name.unwrap_or_else(|| "lap".into()),
                uri: "lap:/x".into(),
                trust: Trust::Restricted,
                host: Host::Client,
                online: true,
                tools: ToolName::ALL.to_vec(),
                network: None,
            },
        };
        write_message(&mut send, &attached).await.unwrap();
        let _ = conn_tx.send(conn.clone());
        // The attach stream is held, never read again.
        std::future::pending::<()>().await;
        drop((send, recv, endpoint));
    });
    let config = server.client_config();
    let laptop = folder(&[("here.txt", "x")]);
    let mut options = attach_options(laptop.path(), "lap");
    options.allow = vec![ToolClass::Read, ToolClass::Exec];
    options.exec.network = NetworkMode::Allowlist;
    options.exec.allow = vec!["192.0.2.1:80".into()];
    let mut attached = Attachment::start(&config, options, None).await;
    let conn = within(STEP, "the attach", conn_rx).await.unwrap();
    // Refused connections to long names: about 250 bytes of report each, 10 KiB in all.
    let long = format!("{0}.{0}.{0}.", "h".repeat(60));
    let script = format!(
        "for i in $(seq 40); do curl -sS --noproxy '' -x http://127.0.0.1:3128 http://{long}$i.example/; done; true"
    );
    let ask = |message: Message| {
        let conn = conn.clone();
        async move {
            let (mut send, mut recv) = conn.open_bi().await.unwrap();
            write_message(&mut send, &message).await.unwrap();
            let mut answers = Vec::new();
            while let Some(answer) = read_message(&mut recv, 1 << 24).await.unwrap() {
                answers.push(answer);
            }
            answers
        }
    };
    let ran = within(
        STEP,
        "the command's answer",
        ask(Message::Run {
            id: 1,
            attachment: 1,
            session: "default".into(),
            tool: ToolName::RunCommand,
            args: json!({"argv": ["sh", "-c", script]}),
            if_present: None,
        }),
    )
    .await;
    assert!(
        ran.iter().any(|m| matches!(m, Message::Result { .. })),
        "{ran:?}"
    );
    // The owner was told of the refusals (so the reports were made), and the folder still
    // answers.
    loop {
        if let AttachEvent::NetworkRefused(_) = attached.next_event().await {
            break;
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let probed = within(
        Duration::from_secs(10),
        "a probe's answer while the reports wait for credit",
        ask(Message::Probe {
            id: 2,
            attachment: 1,
            path: "here.txt".into(),
        }),
    )
    .await;
    assert!(
        matches!(probed.as_slice(), [Message::Probed { exists: true, .. }]),
        "{probed:?}"
    );
    rogue.abort();
}
