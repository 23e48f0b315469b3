//! One user cannot exhaust the server (issue 9, item 12): sessions that are only on disk or
//! only listed hold no descriptor, and each user's sessions, connections and calls are bounded,
//! so a second user still works when the first is over their limits.

use std::sync::Arc;

use monad_client::ClientError;
use monad_client::agent::Agent;
use monad_protocol::wire::{PROTOCOL_MINOR, Role};
use monad_protocol::{ErrorCode, ToolName};
use monad_tests::{
    FakeClient, STEP, ServerProcess, TestServer, call_in, connect_agent, connect_speaking,
    connect_without_hello, ok, within,
};
use serde_json::json;

/// How many descriptors process `pid` has open.
fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the server's descriptors are listed")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_do_not_grow_with_sessions_opened_by_requests() {
    let data = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(data.path(), &[]).await;
    let token = server.first_token.clone().expect("a first start");
    let agent = Arc::new(connect_agent(&server.client_config(&token)).await);
    ok(call_in(&agent, None, "workspaces", json!({})).await);
    let before = open_descriptors(server.pid());
    const SESSIONS: usize = 2000;
    const WORKERS: usize = 16;
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..WORKERS {
        let agent = agent.clone();
        workers.spawn(async move {
            for i in (w..SESSIONS).step_by(WORKERS) {
                let id = format!("00000000-0000-4000-8000-{i:012}");
                // Half only listed or looked at, half used: a file written in each.
                let (tool, args) = if i % 2 == 0 {
                    ("workspaces", json!({}))
                } else {
                    ("write_file", json!({"path": "a.txt", "content": "x"}))
                };
                ok(call_in(&agent, Some(&id), tool, args).await);
            }
        });
    }
    while let Some(done) = workers.join_next().await {
        done.expect("a worker");
    }
    let after = open_descriptors(server.pid());
    // The default bound on sessions in memory per user is 256; each holds at most its
    // workspace's directory. Without bounds every session opened kept one.
    assert!(
        after <= before + 300,
        "{before} descriptors before, {after} after opening {SESSIONS} sessions"
    );
    server.stop().await;
}

/// The refusal of a request, which must be `limit_exceeded` saying what to do.
fn expect_limit<T: std::fmt::Debug>(result: Result<T, ClientError>, setting: &str) {
    match result {
        Err(ClientError::Refused(e)) => {
            assert_eq!(e.code, ErrorCode::LimitExceeded, "{setting}: {e}");
            assert!(e.message.contains(setting), "names {setting}: {e}");
        }
        Ok(answer) => panic!("{setting}: answered {answer:?}"),
        Err(e) => panic!("{setting}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_over_their_limits_is_refused_while_another_still_works() {
    let server = TestServer::start_with(|c| {
        c.quotas.max_connections_per_user = 3;
        c.quotas.max_calls_per_user = 2;
        c.quotas.max_sessions_in_memory_per_user = 1;
    })
    .await;
    let config = server.client_config();
    // admin: a folder attached to `default` that never answers, and two calls waiting on it.
    let fake = FakeClient::attach(&config, "stuck", vec![ToolName::ReadFile]).await;
    let agent = Arc::new(connect_agent(&config).await);
    let mut stuck = tokio::task::JoinSet::new();
    for _ in 0..2 {
        let agent = agent.clone();
        stuck.spawn(async move {
            let args = json!({"path": "a.txt", "workspace": "stuck"});
            let _ = agent.call(None, "read_file", args, |_| {}).await;
        });
    }
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(fake.next_request().await);
    }
    // A third call: over admin's calls in flight.
    let third = within(
        STEP,
        "the third call",
        agent.call(None, "workspaces", json!({}), |_| {}),
    )
    .await;
    expect_limit(third, "server.max_calls_per_user");
    // A second session in memory while `default` is in use: over admin's sessions in memory
    // (asked with a request that is not a tool call), and not even created.
    let admins = "00000000-0000-4000-8000-0000000000aa";
    let second = within(STEP, "a second session", agent.history(Some(admins))).await;
    expect_limit(second, "server.max_sessions_in_memory_per_user");
    assert!(!server.data_dir().join("sessions").join(admins).exists());
    // A third connection is fine, a fourth is refused at its hello.
    let _third_connection = connect_agent(&config).await;
    match within(STEP, "a fourth connection", Agent::connect(&config)).await {
        Err(ClientError::Refused(e)) => {
            assert_eq!(e.code, ErrorCode::LimitExceeded, "{e}");
            assert!(e.message.contains("server.max_connections_per_user"), "{e}");
        }
        Ok(_) => panic!("a fourth connection was accepted"),
        Err(e) => panic!("{e}"),
    }

    // Ben is not affected: he connects, calls, and uses two sessions one after the other
    // (the first, idle, makes room for the second).
    let ben = connect_agent(&server.client_config_with(&server.create_token("ben"))).await;
    let bens = "00000000-0000-4000-8000-0000000000bb";
    let write = json!({"path": "b.txt", "content": "b"});
    ok(call_in(&ben, Some(bens), "write_file", write).await);
    let other = "00000000-0000-4000-8000-0000000000cc";
    ok(call_in(&ben, Some(other), "workspaces", json!({})).await);
    let (read, _) = ok(call_in(&ben, Some(bens), "read_file", json!({"path": "b.txt"})).await);
    assert_eq!(read["content"], "b");

    // When admin's calls end, admin can call again.
    drop(held);
    drop(fake);
    while stuck.join_next().await.is_some() {}
    ok(call_in(&agent, None, "workspaces", json!({})).await);
}

/// Opens a request stream on `agent`'s connection and sends only part of a request: a frame
/// that announces 1,000 bytes, and 10 of them. The server is left reading it.
async fn half_a_request(agent: &Agent) -> (quinn::SendStream, quinn::RecvStream) {
    let (mut send, recv) = within(STEP, "a stream", agent.quic().open_bi())
        .await
        .expect("a stream");
    send.write_all(&monad_protocol::frame::encode_header(1000, true))
        .await
        .expect("a frame header");
    send.write_all(&[b' '; 10]).await.expect("part of it");
    (send, recv)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_still_arriving_are_bounded_per_user() {
    let server = TestServer::start_with(|c| {
        c.quotas.max_calls_per_user = 2;
        c.request_read_timeout = std::time::Duration::from_secs(600);
    })
    .await;
    let agent = server.agent().await;
    let mut held = vec![half_a_request(&agent).await, half_a_request(&agent).await];
    // Once the server is reading both, the user may have no more requests being read: a whole
    // call is refused before it is read.
    within(STEP, "a call to be refused", async {
        loop {
            // A held request that reached the server while one of these calls was being read
            // was refused itself (the server answered it): hold another in its place.
            for slot in held.iter_mut() {
                let mut byte = [0u8; 1];
                let answered =
                    tokio::time::timeout(std::time::Duration::ZERO, slot.1.read(&mut byte)).await;
                if answered.is_ok() {
                    *slot = half_a_request(&agent).await;
                }
            }
            match agent.call(None, "workspaces", json!({}), |_| {}).await {
                Err(ClientError::Refused(e)) if e.code == ErrorCode::LimitExceeded => {
                    assert!(e.message.contains("server.max_calls_per_user"), "{e}");
                    break;
                }
                Ok(_) => tokio::task::yield_now().await,
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await;
    // Given up, they give their slots back.
    drop(held);
    within(STEP, "a call to be served again", async {
        while agent
            .call(None, "workspaces", json!({}), |_| {})
            .await
            .is_err()
        {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_never_finishes_arriving_is_cut_after_the_read_time_out() {
    let server = TestServer::start_with(|c| {
        c.request_read_timeout = std::time::Duration::from_millis(300);
    })
    .await;
    let agent = server.agent().await;
    let (_send, mut recv) = half_a_request(&agent).await;
    let answer = within(
        STEP,
        "the server to give up on the request",
        recv.read_to_end(1 << 20),
    )
    .await
    .expect("an answer, then the end of the stream");
    let message = monad_protocol::io::read_message(&mut answer.as_slice(), 1 << 20)
        .await
        .expect("a message")
        .expect("not empty");
    match message {
        monad_protocol::wire::Message::Error { error, .. } => {
            assert_eq!(error.code, ErrorCode::Timeout, "{error}");
            assert!(error.message.contains("request_read_timeout"), "{error}");
        }
        other => panic!("not an error: {other:?}"),
    }
    // The connection goes on.
    ok(call_in(&agent, None, "workspaces", json!({})).await);
}

/// How many streams `conn` may open at once, up to `up_to`: it opens them (sending nothing) until
/// one is not granted within half a second (quinn's `open_bi` waits for the server's credit).
async fn streams_granted(conn: &quinn::Connection, up_to: u32) -> u32 {
    let mut held = Vec::new();
    while held.len() < up_to as usize {
        match tokio::time::timeout(std::time::Duration::from_millis(500), conn.open_bi()).await {
            Ok(opened) => held.push(opened.expect("the connection is up")),
            Err(_) => break,
        }
    }
    held.len() as u32
}

/// quinn reserves state at connect for every stream a peer may open, so a connection that never
/// says hello (or an attached client, which needs one stream per folder) must not be allowed the
/// 128 streams an agent gets: 1,000 such connections held about 10 MiB more of the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_gets_streams_for_its_role_only_after_its_hello() {
    use monad_server::config::CLIENT_STREAMS;
    let server = TestServer::start().await;
    let config = server.client_config();
    // Before the hello: the hello's stream, and no second one.
    let (_silent_endpoint, silent) = connect_without_hello(&config).await;
    assert_eq!(
        streams_granted(&silent, 2).await,
        1,
        "a connection that has not said hello may open one stream"
    );

    // An attached client: `CLIENT_STREAMS` at once (one fewer while its hello's stream is
    // still counted), and no more.
    let (_client_endpoint, client, _) =
        connect_speaking(&config, Role::Client, PROTOCOL_MINOR).await;
    let granted = streams_granted(&client, CLIENT_STREAMS + 1).await;
    assert!(
        (CLIENT_STREAMS - 1..=CLIENT_STREAMS).contains(&granted),
        "an attached client may open {CLIENT_STREAMS} streams at once, it got {granted}"
    );

    // An agent: every request the connection may have in flight, and the refusals beyond.
    let (_agent_endpoint, agent, _) = connect_speaking(&config, Role::Agent, PROTOCOL_MINOR).await;
    let max = server.config().transport.max_streams;
    assert_eq!(
        streams_granted(&agent, max - 1).await,
        max - 1,
        "an agent may open {max} streams at once (one fewer while its hello's stream counts)"
    );
}
