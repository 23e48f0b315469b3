//! Large results: a `read_file` content of 64 KiB or more travels after its result message as a
//! raw body, relayed by the server as it arrives. It must come out whole and byte for byte,
//! through every path (attached client, primary workspace, the executor's whole-value path the
//! MCP front uses), be recorded, and fail cleanly when its sender fails mid-body.

use std::time::{Duration, Instant};

use monad_protocol::io::{read_message, write_message};
use monad_protocol::wire::{BODY_MINOR, Body, Message, Outcome, Role};
use monad_protocol::{ErrorCode, ToolClass, ToolError, ToolName};
use monad_server::admin::Admin;
use monad_server::store::ArtifactKind;
use monad_tests::{
    Attachment, FakeClient, STEP, TestServer, attach_options, call, connect_speaking, expect_code,
    folder, ok, within,
};
use serde_json::{Value, json};

/// At least `len` bytes of text that JSON must escape all over: quotes, backslashes, tabs, a
/// control character, and multi-byte characters, numbered so that a misplaced chunk shows.
fn awkward_text(len: usize) -> String {
    let mut text = String::with_capacity(len + 64);
    let mut n = 0;
    while text.len() < len {
        text.push_str(&format!(
            "{n:07} é \"quoted\" back\\slash\ttab \u{1} ✓ 🦀 line\n"
        ));
        n += 1;
    }
    text
}

/// Puts `big.txt` holding `attached` in a folder attached as `lap` (reads allowed, caps raised to
/// fit it), and holding `primary` in the default session's primary workspace, whose default caps
/// (256 KiB, 2,000 lines) it must fit. Keep the returned pair alive.
async fn big_files(
    server: &TestServer,
    attached: &str,
    primary: &str,
) -> (tempfile::TempDir, Attachment) {
    let dir = folder(&[("big.txt", attached)]);
    let mut options = attach_options(dir.path(), "lap");
    options.allow = vec![ToolClass::Read];
    options.limits.read_max_bytes = 2 * attached.len() as u64;
    options.limits.read_default_lines = 1_000_000;
    let attachment = Attachment::start(&server.client_config(), options, None).await;
    std::fs::write(server.primary_dir("default").join("big.txt"), primary).unwrap();
    (dir, attachment)
}

fn audit(server: &TestServer) -> Vec<Value> {
    if let Some(recorder) = &server.state().executor.recorder {
        recorder.flush();
    }
    let path = server.data_dir().join("sessions/default/audit.jsonl");
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("an audit line is JSON"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_reads_arrive_whole_from_attached_and_primary_workspaces_and_are_recorded() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    ok(call(&agent, "workspaces", json!({})).await);

    let attached_text = awkward_text(3 * 1024 * 1024);
    let primary_text = awkward_text(80 * 1024);
    let _attached = big_files(&server, &attached_text, &primary_text).await;

    for (workspace, text) in [("lap", &attached_text), ("primary", &primary_text)] {
        let (result, ran_in) = ok(call(
            &agent,
            "read_file",
            json!({"path": "big.txt", "workspace": workspace}),
        )
        .await);
        assert_eq!(ran_in, workspace);
        let content = result["content"].as_str().expect("content is text");
        assert!(content == text.as_str(), "{workspace}: content differs");
        assert_eq!(result["size"], text.len() as u64, "{workspace}");
        assert_eq!(result["truncated"], false, "{workspace}");
        assert_eq!(result["path"], "big.txt", "{workspace}");
    }

    // Cut by a line limit: the head of the file, still as a body.
    let (result, _) = ok(call(
        &agent,
        "read_file",
        json!({"path": "big.txt", "workspace": "lap", "limit": 20_000}),
    )
    .await);
    let content = result["content"].as_str().unwrap();
    assert!(content.len() > 64 * 1024);
    assert_eq!(content.lines().count(), 20_000);
    assert!(attached_text.starts_with(content));
    assert_eq!(result["truncated"], true);
    assert_eq!(result["next_offset"], 20_001);

    // The executor's whole-value path (the MCP front's) puts the body back into the result.
    let session = server
        .state()
        .registry
        .resolve(Some("default"), "admin", None)
        .unwrap();
    let output = server
        .state()
        .executor
        .call(
            &session,
            "read_file",
            json!({"path": "big.txt", "workspace": "lap"}),
            &|_: &str| {},
        )
        .await;
    assert!(
        output.body.is_some(),
        "a large result from a client has a body"
    );
    let (workspace, outcome) = output.complete().await;
    assert_eq!(workspace.unwrap().name, "lap");
    match outcome {
        Outcome::Ok { result } => assert!(result.value()["content"] == attached_text.as_str()),
        Outcome::Error { error } => panic!("the whole-value path failed: {error}"),
    }

    // Recorded: the audit line says ok; the artifact keeps the head and says how big it was.
    let lines = audit(&server);
    let reads: Vec<&Value> = lines
        .iter()
        .filter(|l| l["tool"] == "read_file" && l["workspace"] == "lap")
        .collect();
    assert_eq!(reads.len(), 3, "{lines:?}");
    for line in reads {
        assert_eq!(line["outcome"], "ok", "{line}");
        assert_eq!(line["decision"], "allowed", "{line}");
    }
    let admin = Admin::new(server.data_dir());
    let artifacts = admin.artifacts("default").unwrap();
    let outputs: Vec<_> = artifacts
        .iter()
        .filter(|m| {
            m.kind == ArtifactKind::ToolOutput
                && m.tool.as_deref() == Some("read_file")
                && m.workspace.as_deref() == Some("lap")
        })
        .collect();
    assert_eq!(outputs.len(), 3, "{artifacts:?}");
    let cap = session.settings.retention.artifact_max_bytes;
    for meta in outputs {
        assert!(meta.truncated, "{meta:?}");
        assert!(meta.original_size > 20_000 * 50, "{meta:?}");
        assert_eq!(meta.size, cap, "{meta:?}");
        let (_, bytes) = admin.artifact("default", &meta.id).unwrap();
        let kept = String::from_utf8_lossy(&bytes);
        assert!(
            kept.starts_with(r#"{"status":"ok","result":{"#),
            "{kept:.200}"
        );
        assert!(
            kept.contains(r#"0000000 é \"quoted\" back\\slash\ttab \u0001"#),
            "{kept:.300}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_of_an_older_minor_version_gets_large_results_inline() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    ok(call(&agent, "workspaces", json!({})).await);
    let text = awkward_text(1024 * 1024);
    let primary_text = awkward_text(80 * 1024);
    let _attached = big_files(&server, &text, &primary_text).await;

    let (_endpoint, conn, minor) =
        connect_speaking(&server.client_config(), Role::Agent, BODY_MINOR - 1).await;
    assert_eq!(minor, BODY_MINOR - 1, "the server speaks the older version");
    for (workspace, expected) in [("lap", &text), ("primary", &primary_text)] {
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        let request = Message::Call {
            id: 5,
            session: None,
            tool: "read_file".into(),
            args: json!({"path": "big.txt", "workspace": workspace}),
        };
        write_message(&mut send, &request).await.unwrap();
        send.finish().unwrap();
        let answer = within(STEP, "the answer", read_message(&mut recv, 64 << 20)).await;
        let Ok(Some(Message::Result {
            outcome: Outcome::Ok { result },
            body: None,
            ..
        })) = answer
        else {
            panic!("{workspace}: expected a whole result with no body, got {answer:?}");
        };
        assert!(
            result.value()["content"] == expected.as_str(),
            "{workspace}: content differs"
        );
        // Nothing follows the result.
        let rest = recv.read_to_end(1 << 20).await.unwrap();
        assert!(
            rest.is_empty(),
            "{workspace}: {} bytes after the result",
            rest.len()
        );
    }
}

/// Starts a `read_file` of `big.txt` in the fake workspace, on its own task.
fn read_big(
    agent: &monad_client::agent::Agent,
) -> tokio::task::JoinHandle<monad_client::agent::CallReply> {
    let agent = agent.clone();
    tokio::spawn(async move {
        agent
            .call(
                None,
                "read_file",
                json!({"path": "big.txt", "workspace": "fake"}),
                |_| {},
            )
            .await
            .expect("the server answers")
    })
}

/// A result announcing a body of `len` bytes for `content`.
async fn head(send: &mut quinn::SendStream, outcome: Outcome, len: u64) {
    let message = Message::Result {
        id: 1,
        workspace: None,
        outcome,
        body: Some(Body {
            field: "content".into(),
            len,
        }),
    };
    write_message(send, &message).await.expect("head sent");
}

fn ok_head() -> Outcome {
    Outcome::Ok {
        result: json!({"path": "big.txt", "size": 1, "binary": false}).into(),
    }
}

async fn reply(
    call: tokio::task::JoinHandle<monad_client::agent::CallReply>,
    what: &str,
) -> monad_client::agent::CallReply {
    within(STEP, what, call)
        .await
        .expect("the call task does not panic")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_its_client_fails_to_send_fails_the_call_cleanly() {
    let server = TestServer::start_with(|c| c.call_timeout = Duration::from_secs(3)).await;
    let agent = server.agent().await;
    let fake = FakeClient::attach(&server.client_config(), "fake", vec![ToolName::ReadFile]).await;
    const MIB: u64 = 1024 * 1024;
    let chunk = vec![b'x'; 100 * 1024];

    // The client resets its stream mid-body.
    let reading = read_big(&agent);
    let (request, mut send, _recv) = fake.next_request().await;
    assert!(matches!(request, Message::Run { .. }), "{request:?}");
    head(&mut send, ok_head(), MIB).await;
    send.write_all(&chunk).await.unwrap();
    send.reset(0u32.into()).unwrap();
    let message = expect_code(
        reply(reading, "a reset body").await,
        ErrorCode::WorkspaceDisconnected,
    );
    assert!(message.contains("fake"), "{message}");

    // The client ends its stream before the announced length, or sends more than it announced.
    let reading = read_big(&agent);
    let (_, mut send, _recv) = fake.next_request().await;
    head(&mut send, ok_head(), MIB).await;
    send.write_all(&chunk).await.unwrap();
    send.finish().unwrap();
    let message = expect_code(reply(reading, "a short body").await, ErrorCode::Malformed);
    assert!(message.contains("shorter"), "{message}");
    let reading = read_big(&agent);
    let (_, mut send, _recv) = fake.next_request().await;
    head(&mut send, ok_head(), 10).await;
    send.write_all(b"0123456789 and more").await.unwrap();
    send.finish().unwrap();
    expect_code(reply(reading, "a long body").await, ErrorCode::Malformed);

    // Bytes that are not text: the relay stops at the first bad byte.
    let reading = read_big(&agent);
    let (_, mut send, _recv) = fake.next_request().await;
    head(&mut send, ok_head(), 4).await;
    send.write_all(&[b'a', 0xff, 0xfe, b'b']).await.unwrap();
    send.finish().unwrap();
    let message = expect_code(
        reply(reading, "a body that is not text").await,
        ErrorCode::Malformed,
    );
    assert!(message.contains("UTF-8"), "{message}");

    // Announcements the server refuses before relaying anything.
    let refused: [(Outcome, u64, ErrorCode); 3] = [
        (
            Outcome::Ok {
                result: json!({"content": "already here"}).into(),
            },
            10,
            ErrorCode::Malformed,
        ),
        (
            Outcome::Error {
                error: ToolError::new(ErrorCode::NotFound, "no such file"),
            },
            10,
            ErrorCode::Malformed,
        ),
        (ok_head(), 1 << 40, ErrorCode::LimitExceeded),
    ];
    for (outcome, len, code) in refused {
        let what = format!("{outcome:?} with {len} bytes");
        let reading = read_big(&agent);
        let (_, mut send, _recv) = fake.next_request().await;
        head(&mut send, outcome, len).await;
        let _ = send.write_all(b"0123456789").await;
        let _ = send.finish();
        expect_code(reply(reading, &what).await, code);
    }

    // A body that stalls runs into the call's time limit.
    let started = Instant::now();
    let reading = read_big(&agent);
    let (_, mut send, _recv) = fake.next_request().await;
    head(&mut send, ok_head(), MIB).await;
    send.write_all(&chunk).await.unwrap();
    expect_code(reply(reading, "a stalled body").await, ErrorCode::Timeout);
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    drop(send);

    // An agent that takes the result but stops reading its body does not hold the relay (nor
    // the client's stream) past the call's time limit.
    let started = Instant::now();
    let (_endpoint, conn, _) =
        connect_speaking(&server.client_config(), Role::Agent, BODY_MINOR).await;
    let (mut agent_send, mut agent_recv) = conn.open_bi().await.unwrap();
    let request = Message::Call {
        id: 9,
        session: None,
        tool: "read_file".into(),
        args: json!({"path": "big.txt", "workspace": "fake"}),
    };
    write_message(&mut agent_send, &request).await.unwrap();
    agent_send.finish().unwrap();
    let (_, mut send, _recv) = fake.next_request().await;
    const BIG: usize = 16 * 1024 * 1024;
    head(&mut send, ok_head(), BIG as u64).await;
    let answer = within(STEP, "the head", read_message(&mut agent_recv, 1 << 20)).await;
    assert!(
        matches!(answer, Ok(Some(Message::Result { body: Some(_), .. }))),
        "{answer:?}"
    );
    let wrote = within(
        Duration::from_secs(10),
        "the relay to give up on a stalled agent",
        send.write_all(&vec![b'y'; BIG]),
    )
    .await;
    assert!(wrote.is_err(), "the client's stream is stopped");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    drop((agent_recv, conn));

    // The whole-value path (the MCP front's) fails the same way, and keeps nothing half-read.
    let session = server
        .state()
        .registry
        .resolve(Some("default"), "admin", None)
        .unwrap();
    let executor = &server.state().executor;
    let answer = async {
        let (_, mut send, _recv) = fake.next_request().await;
        head(&mut send, ok_head(), MIB).await;
        send.write_all(&chunk).await.unwrap();
        send.reset(0u32.into()).unwrap();
    };
    let whole = async {
        let output = executor
            .call(
                &session,
                "read_file",
                json!({"path": "big.txt", "workspace": "fake"}),
                &|_: &str| {},
            )
            .await;
        output.complete().await
    };
    let ((_, outcome), ()) = within(STEP, "the whole-value path", async {
        tokio::join!(whole, answer)
    })
    .await;
    match outcome {
        Outcome::Error { error } => {
            assert_eq!(error.code, ErrorCode::WorkspaceDisconnected, "{error}")
        }
        Outcome::Ok { .. } => panic!("a cut body completed"),
    }

    // The client's connection goes away mid-body.
    let reading = read_big(&agent);
    let (_, mut send, _recv) = fake.next_request().await;
    head(&mut send, ok_head(), MIB).await;
    send.write_all(&chunk).await.unwrap();
    fake.connection.conn.close(0u32.into(), b"gone");
    expect_code(
        reply(reading, "a body whose client left").await,
        ErrorCode::WorkspaceDisconnected,
    );

    // The server and the agent's connection go on serving.
    let (result, _) = ok(call(&agent, "workspaces", json!({})).await);
    assert_eq!(result["workspaces"][0]["name"], "primary");

    // Every failure is in the audit log as what it was.
    let outcomes: Vec<String> = audit(&server)
        .iter()
        .filter(|l| l["tool"] == "read_file")
        .map(|l| l["outcome"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        outcomes,
        [
            "workspace_disconnected",
            "malformed",
            "malformed",
            "malformed",
            "malformed",
            "malformed",
            "limit_exceeded",
            "timeout",
            "timeout",
            "workspace_disconnected",
            "workspace_disconnected",
        ]
    );
}
