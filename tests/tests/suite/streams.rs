//! How a call's QUIC streams end. Every request is one message and its stream's end; the
//! server reads that end, so neither the agent nor the attached client is told to stop a stream
//! it had finished, a relayed body's stream included (quinn sends a STOP_SENDING for a stream dropped before its end was read,
//! and the peer acknowledges it: two datagrams per hop of every call, for nothing).

use std::time::Duration;

use monad_protocol::ToolName;
use monad_protocol::io::{read_message, write_message};
use monad_protocol::wire::{Body, Message, Outcome, PROTOCOL_MINOR, Role};
use monad_tests::{FakeClient, STEP, TestServer, connect_speaking, connect_speaking_over, within};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_ends_its_streams_without_stopping_either_peer() {
    let server = TestServer::start().await;
    let fake = FakeClient::attach(&server.client_config(), "fake", vec![ToolName::ReadFile]).await;
    let (_endpoint, agent, _) =
        connect_speaking(&server.client_config(), Role::Agent, PROTOCOL_MINOR).await;
    for i in 0..5 {
        let (mut send, mut recv) = agent.open_bi().await.expect("a stream");
        let call = Message::Call {
            id: 1,
            session: None,
            tool: "read_file".into(),
            args: json!({"path": "a.txt", "workspace": "fake"}),
        };
        write_message(&mut send, &call).await.expect("call sent");
        send.finish().expect("finished");

        // The attached client: the run, read to its end as the real client does, then the
        // result and the end of its own side.
        let (request, mut run_send, mut run_recv) = fake.next_request().await;
        assert!(matches!(request, Message::Run { .. }), "{request:?}");
        let rest = within(STEP, "the end of the run", run_recv.read_to_end(0)).await;
        assert_eq!(rest.expect("nothing after the run"), b"");
        // The last call's content comes as a body after the result, relayed by the server.
        let content = format!("call {i}");
        let with_body = i == 4;
        let result = Message::Result {
            id: 1,
            workspace: None,
            outcome: Outcome::Ok {
                result: if with_body {
                    json!({"path": "a.txt"}).into()
                } else {
                    json!({"content": content}).into()
                },
            },
            body: with_body.then(|| Body {
                field: "content".into(),
                len: content.len() as u64,
            }),
        };
        write_message(&mut run_send, &result)
            .await
            .expect("result sent");
        if with_body {
            run_send.write_all(content.as_bytes()).await.expect("body");
        }
        run_send.finish().expect("finished");

        match within(STEP, "the answer", read_message(&mut recv, 1 << 20)).await {
            Ok(Some(Message::Result {
                outcome: Outcome::Ok { result },
                body,
                ..
            })) => match body {
                None => assert_eq!(result.value()["content"], content),
                Some(body) => assert_eq!(body.len, content.len() as u64),
            },
            other => panic!("the server answered the call with {other:?}"),
        }
        let rest = within(STEP, "the end of the answer", recv.read_to_end(1 << 20)).await;
        let expected: &[u8] = if with_body { content.as_bytes() } else { b"" };
        assert_eq!(rest.expect("the rest of the answer"), expected);
    }
    // The server lets go of a request's stream after its answer; a STOP_SENDING would follow
    // within milliseconds.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        agent.stats().frame_rx.stop_sending,
        0,
        "STOP_SENDING frames the agent got"
    );
    assert_eq!(
        fake.connection.conn.stats().frame_rx.stop_sending,
        0,
        "STOP_SENDING frames the attached client got"
    );
}

/// A peer's FIN may leave in a datagram of its own, after its message (a loaded machine's
/// connection task sends what was written before the stream is finished). The server, done
/// with a hello or a request once its message is read, waits for that end rather than telling
/// the peer to stop a stream it finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_end_comes_after_its_answer_is_not_stopped() {
    let server = TestServer::start().await;
    let config = server.client_config();
    let (_endpoint, agent) = monad_tests::connect_without_hello(&config).await;
    // Each request finished only once its answer is in, well after the message itself.
    let requests = [
        Message::Hello {
            protocol: monad_protocol::wire::PROTOCOL_MAJOR,
            minor: PROTOCOL_MINOR,
            role: Role::Agent,
            token: config.token.clone(),
            device_id: config.device_id.clone(),
            client_name: config.client_name.clone(),
            capabilities: Vec::new(),
            forwarded_for: None,
        },
        Message::ListWorkspaces {
            id: 1,
            session: None,
        },
        Message::Call {
            id: 2,
            session: None,
            tool: "list_dir".into(),
            args: json!({"path": "."}),
        },
    ];
    for request in &requests {
        let (mut send, mut recv) = agent.open_bi().await.expect("a stream");
        write_message(&mut send, request).await.expect("sent");
        let answer = within(STEP, "the answer", recv.read_to_end(1 << 20)).await;
        assert!(
            !answer.expect("an answer").is_empty(),
            "no answer to {}",
            request.kind()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        send.finish().expect("finished");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        agent.stats().frame_rx.stop_sending,
        0,
        "STOP_SENDING frames the agent got"
    );
}

/// What an attach stream carries up to and including the `detached` that ends it: each a whole
/// message (a frame cut by another fails here), none missing before it.
async fn until_detached(recv: &mut quinn::RecvStream) -> Vec<Message> {
    let mut seen = Vec::new();
    loop {
        let message = within(
            STEP,
            "the server's next message",
            read_message(recv, 1 << 20),
        )
        .await
        .expect("a whole message, not a frame cut by another")
        .expect("not the stream's end before `detached`");
        let detached = matches!(message, Message::Detached { .. });
        seen.push(message);
        if detached {
            return seen;
        }
    }
}

/// Attaches folder `name` to the device's session over a connection of its own that speaks
/// `minor`, `focus` as asked; the attach stream, once `attached` is read.
async fn attach_speaking(
    config: &monad_client::config::ClientConfig,
    minor: u32,
    name: &str,
    focus: bool,
) -> (quinn::Endpoint, quinn::SendStream, quinn::RecvStream) {
    attach_over(config, minor, name, focus, None).await
}

/// [`attach_speaking`], over `transport` when given.
async fn attach_over(
    config: &monad_client::config::ClientConfig,
    minor: u32,
    name: &str,
    focus: bool,
    transport: Option<quinn::TransportConfig>,
) -> (quinn::Endpoint, quinn::SendStream, quinn::RecvStream) {
    let (endpoint, client, _) = connect_speaking_over(config, Role::Client, minor, transport).await;
    let (mut send, mut recv) = client.open_bi().await.expect("a stream");
    let attach = Message::Attach {
        id: 1,
        session: None,
        name: Some(name.to_owned()),
        path: format!("/fake/{name}"),
        trust: monad_protocol::wire::Trust::Full,
        tools: vec![ToolName::ReadFile],
        focus,
        folder: None,
        exact_name: false,
        network: None,
    };
    write_message(&mut send, &attach)
        .await
        .expect("attach sent");
    let attached = within(STEP, "attached", read_message(&mut recv, 1 << 20)).await;
    assert!(
        matches!(attached, Ok(Some(Message::Attached { .. }))),
        "{attached:?}"
    );
    (endpoint, send, recv)
}

/// A folder whose owner made it the focus is told when the focus moves away (`focused` on its
/// attach stream), but only by a client of minor [`FOCUSED_MINOR`] or later: an older one
/// would fail on a message it does not know. Each folder is then taken over by another attach,
/// and what its stream held before the `detached` that ends it is checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_client_that_knows_focused_is_sent_it() {
    use monad_protocol::wire::FOCUSED_MINOR;
    let server = TestServer::start().await;
    let config = server.client_config();
    for minor in [FOCUSED_MINOR - 1, FOCUSED_MINOR] {
        let name = format!("minor{minor}");
        let (_endpoint, _send, mut recv) = attach_speaking(&config, minor, &name, true).await;
        // Another folder takes the focus, then another attach of this one takes it over.
        let mover = format!("mover{minor}");
        let (_mover, _mover_send, _) = attach_speaking(&config, FOCUSED_MINOR, &mover, true).await;
        let _taker = FakeClient::attach(&config, &name, vec![ToolName::ReadFile]).await;
        let seen = until_detached(&mut recv).await;
        let focused = seen
            .iter()
            .filter(|m| matches!(m, Message::Focused { focus: false, .. }))
            .count();
        let expected = if minor >= FOCUSED_MINOR { 1 } else { 0 };
        assert_eq!(focused, expected, "minor {minor}: {seen:?}");
        assert_eq!(seen.len(), expected + 1, "minor {minor}: {seen:?}");
    }
    server.stop().await;
}

/// Folder `name`, attached (by the device of `config`) over a connection whose stream receive
/// window (16 bytes) is less than one `focused` message, loses the focus to another folder: the
/// server's write of that move stops inside it, held until the client reads. Returns what keeps both attachments (their
/// connections and the send sides of their attach streams, whose end would detach them) and
/// the attach stream of `name`.
async fn a_slow_folder_losing_the_focus(
    server: &TestServer,
    config: &monad_client::config::ClientConfig,
    name: &str,
) -> (
    (Vec<quinn::Endpoint>, Vec<quinn::SendStream>),
    quinn::RecvStream,
) {
    use monad_protocol::wire::FOCUSED_MINOR;
    let mut transport = quinn::TransportConfig::default();
    transport.stream_receive_window(quinn::VarInt::from_u32(16));
    let (endpoint, send, recv) =
        attach_over(config, FOCUSED_MINOR, name, true, Some(transport)).await;
    // Another folder takes the focus: the server tells `name`, which does not read.
    let (mover, mover_send, _) = attach_speaking(config, FOCUSED_MINOR, "mover", true).await;
    // Until the focus has moved (the move is what starts the write).
    within(STEP, "the focus to move", async {
        let session = loop {
            if let Some(session) = server
                .state()
                .registry
                .loaded_of("admin")
                .into_iter()
                .next()
            {
                break session;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        while session.focus().as_deref() != Some("mover") {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    ((vec![endpoint, mover], vec![send, mover_send]), recv)
}

/// A client that stops reading its attach stream holds the server's write of a focus move (its
/// receive window full): that write must not hold the folder's task past the server's shutdown.
/// It did: the task waited in the write, and every shutdown waited the whole grace for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_read_its_attach_stream_does_not_hold_the_shutdown() {
    // A grace the test would notice: far longer than it waits.
    let server = TestServer::start_with(|c| c.shutdown_grace = Duration::from_secs(600)).await;
    let config = server.client_config();
    let _held = a_slow_folder_losing_the_focus(&server, &config, "stuck").await;
    within(
        STEP,
        "the server to shut down without the grace",
        server.stop(),
    )
    .await;
}

/// A folder taken over while the server's write of a focus move to it is held (its client slow
/// to read) is told it was, after that move: the `detached` is written once the move's frames
/// are, never inside them, so that its client, reading on, gets two whole messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_taken_over_while_a_focus_move_is_held_hears_both_whole() {
    let server = TestServer::start().await;
    let config = server.client_config();
    let (_held, mut recv) = a_slow_folder_losing_the_focus(&server, &config, "slow").await;
    // Taken over, from the same device, while the move's write waits for the client.
    let _taker = FakeClient::attach(&config, "slow", vec![ToolName::ReadFile]).await;
    let seen = until_detached(&mut recv).await;
    assert!(
        matches!(
            seen.as_slice(),
            [
                Message::Focused { focus: false, .. },
                Message::Detached { .. }
            ]
        ),
        "{seen:?}"
    );
    server.stop().await;
}
