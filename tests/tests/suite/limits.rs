//! One user cannot exhaust the server (issue 9, item 12): sessions that are only on disk or
//! only listed hold no descriptor, and each user's sessions, connections and calls are bounded,
//! so a second user still works when the first is over their limits.

use std::sync::Arc;

use monad_client::ClientError;
use monad_client::agent::Agent;
use monad_protocol::wire::{PROTOCOL_MINOR, Role};
use monad_protocol::{ErrorCode, ToolName};
use monad_tests::{
    Attachment, FakeClient, STEP, ServerProcess, TestServer, attach_options, call, call_in,
    connect_agent, connect_speaking, connect_without_hello, folder, ok, within,
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
    // So are requests that are not tool calls (they run on the blocking pool every user
    // shares): a listing, a history.
    let listing = within(STEP, "a listing", agent.sessions()).await;
    expect_limit(listing, "server.max_calls_per_user");
    let history = within(STEP, "a history", agent.history(None)).await;
    expect_limit(history, "server.max_calls_per_user");
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
    while stuck.join_next().await.is_some() {}
    // A second session in memory while `default` is in use (its folder attached): over
    // admin's sessions in memory (asked with a request that is not a tool call), and not even
    // created.
    let admins = "00000000-0000-4000-8000-0000000000aa";
    let second = within(STEP, "a second session", agent.history(Some(admins))).await;
    expect_limit(second, "server.max_sessions_in_memory_per_user");
    assert!(!server.data_dir().join("sessions").join(admins).exists());
    drop(fake);
    ok(call_in(&agent, None, "workspaces", json!({})).await);
}

/// A call's slot is free by the time its agent has the answer: a user who calls one at a time,
/// at a limit of one call in flight, is never refused for a call already answered, even from
/// another connection (which does not carry the first one's acknowledgement of the answer).
/// Before, the server kept the slot until the answer was acknowledged, and the next call, sent
/// at once, found it still taken; so did listings and histories, which count as calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_made_one_after_another_are_not_refused_at_a_limit_of_one() {
    let server = TestServer::start_with(|c| c.quotas.max_calls_per_user = 1).await;
    let agents = [
        connect_agent(&server.client_config()).await,
        connect_agent(&server.client_config()).await,
    ];
    let write = json!({"path": "a.txt", "content": "a"});
    ok(call_in(&agents[0], None, "write_file", write).await);
    for i in 0..100 {
        let read = agents[i % 2].call(None, "read_file", json!({"path": "a.txt"}), |_| {});
        if let Err(e) = within(STEP, "a call", read).await {
            panic!("call {i}, once the one before was answered: {e}");
        }
    }
    // A listing and a history count as calls do, and are as free once answered.
    for i in 0..50 {
        let (first, then) = (&agents[i % 2], &agents[(i + 1) % 2]);
        if let Err(e) = within(STEP, "a listing", first.sessions()).await {
            panic!("listing {i}: {e}");
        }
        if let Err(e) = within(STEP, "a history", then.history(None)).await {
            panic!("history {i}, once the listing was answered: {e}");
        }
        let read = first.call(None, "read_file", json!({"path": "a.txt"}), |_| {});
        if let Err(e) = within(STEP, "a call", read).await {
            panic!("call {i}, once the history was answered: {e}");
        }
    }
}

/// A client of its own that reports more network connections than a sandbox would, and
/// faster: the server writes no more lines than a sandbox keeps (a burst, then a few a second)
/// and counts the rest, so that one user cannot fill the recorder every user's records go
/// through, nor the disk (it wrote a line for each of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_reports_past_what_a_sandbox_sends_are_counted_not_written() {
    use monad_protocol::tools::NetworkEvent;
    use monad_protocol::wire::Message;
    use serde_json::Value;
    use std::time::Duration;
    let server = TestServer::start().await;
    // Two attach streams of one user share one allowance: a new stream brings none of its own.
    let mut fake = FakeClient::attach(&server.client_config(), "noisy", vec![]).await;
    let mut other = FakeClient::attach(&server.client_config(), "other", vec![]).await;
    let event = |i: usize| NetworkEvent {
        host: format!("h{i}.example"),
        port: 443,
        allowed: false,
        address: None,
        reason: Some("not in the allowlist".into()),
    };
    let (messages, per_message, dropped) = (100, 1_000, 5);
    for i in 0..messages {
        let report = Message::Network {
            attachment: 1,
            events: (0..per_message).map(event).collect(),
            dropped,
        };
        if i % 2 == 0 {
            fake.report(&report).await;
        } else {
            other.report(&report).await;
        }
    }
    fake.end_reports().await;
    other.end_reports().await;
    let sent = (messages * per_message) as u64 + messages as u64 * dropped;
    // Every connection is accounted for: a line each, or in a count.
    let accounted = |lines: &[Value]| -> (usize, u64) {
        let network: Vec<&Value> = lines.iter().filter(|l| l["tool"] == "network").collect();
        let counted: u64 = network
            .iter()
            .filter_map(|l| l["target"].as_str())
            .filter_map(|t| t.split_once(" connections not recorded"))
            .filter_map(|(n, _)| n.parse::<u64>().ok())
            .sum();
        let each = network
            .iter()
            .filter(|l| {
                !l["target"]
                    .as_str()
                    .is_some_and(|t| t.contains("connections not recorded"))
            })
            .count();
        (each, counted)
    };
    let lines = within(STEP, "every connection accounted for", async {
        loop {
            let lines = server.audit_lines("default", 0).await;
            let (each, counted) = accounted(&lines);
            if each as u64 + counted >= sent {
                return lines;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let (each, counted) = accounted(&lines);
    assert_eq!(each as u64 + counted, sent);
    let most = monad_sandbox::MAX_FOR_AUDIT + 60 * monad_sandbox::AUDIT_PER_SECOND as usize;
    assert!(each <= most, "{each} lines written");
    assert!(counted >= sent - most as u64, "{counted}");
}

/// A conversation grows by a client's appends up to what one holds at most, then refuses
/// more (each append of up to a request's size grew it without end, read whole by `history
/// show` and the built-in agent); a replace past it is refused too, and a clear makes room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_grows_only_up_to_what_one_holds() {
    use monad_protocol::wire::{History, HistoryMessage, HistoryRole};
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let big = |c: char| HistoryMessage {
        role: HistoryRole::User,
        text: c.to_string().repeat(3 << 20),
    };
    for c in ['a', 'b'] {
        within(STEP, "an append", agent.history_append(None, big(c)))
            .await
            .expect("within the bound");
    }
    let third = within(STEP, "a third append", agent.history_append(None, big('c'))).await;
    expect_limit(third, "the 8 MiB one holds at most");
    let (_, kept) = within(STEP, "the history", agent.history(None))
        .await
        .unwrap();
    assert_eq!(kept.messages.len(), 2, "nothing of the refused append kept");
    let too_big = History {
        provider: None,
        model: None,
        created_at: String::new(),
        messages: vec![big('d'), big('e'), big('f')],
    };
    let replaced = within(STEP, "a replace", agent.history_replace(None, too_big)).await;
    expect_limit(replaced, "the 8 MiB one holds at most");
    within(STEP, "a clear", agent.history_clear(None))
        .await
        .unwrap();
    within(
        STEP,
        "an append after",
        agent.history_append(None, big('g')),
    )
    .await
    .expect("room again");
}

/// A folder's path no file system takes is refused before anything keeps it, and folders
/// never attached before make workspace records only within the user's quota of them (each
/// attach of another path made one, without end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attaching_is_bounded_in_path_length_and_in_workspace_records() {
    use monad_protocol::wire::Message;
    let server = TestServer::start_with(|c| c.quotas.max_workspaces_per_user = 2).await;
    let config = server.client_config();
    let long = format!("/{}", "d/".repeat(2_100));
    match FakeClient::ask_attach(&config, None, &long, vec![ToolName::ReadFile])
        .await
        .0
    {
        Message::Error { error, .. } => {
            assert_eq!(error.code, ErrorCode::InvalidArguments, "{error}");
            assert!(error.message.contains("at most 4096"), "{error}");
        }
        other => panic!("a path of {} bytes: {other:?}", long.len()),
    }
    let mut kept = Vec::new();
    for path in ["/w/one", "/w/two"] {
        let (answer, conn, send) =
            FakeClient::ask_attach(&config, None, path, vec![ToolName::ReadFile]).await;
        assert!(matches!(answer, Message::Attached { .. }), "{answer:?}");
        kept.push((conn, send));
    }
    match FakeClient::ask_attach(&config, None, "/w/three", vec![ToolName::ReadFile])
        .await
        .0
    {
        Message::Error { error, .. } => {
            assert_eq!(error.code, ErrorCode::LimitExceeded, "{error}");
            assert!(
                error.message.contains("server.max_workspaces_per_user"),
                "{error}"
            );
        }
        other => panic!("a third folder: {other:?}"),
    }
    // A folder attached before is no new record: it attaches again.
    drop(kept);
    let (again, _conn, _send) =
        FakeClient::ask_attach(&config, None, "/w/one", vec![ToolName::ReadFile]).await;
    assert!(matches!(again, Message::Attached { .. }), "{again:?}");
}

/// A folder offering one tool many times over is kept with each tool once: the list was kept
/// as sent (8,000 entries fit the attach's bound), in the session's metadata, which every
/// listing of every session copied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_offers_each_tool_once_however_often_it_names_it() {
    let server = TestServer::start().await;
    let mut tools = vec![ToolName::Stat; 8_000];
    tools.push(ToolName::ReadFile);
    tools.push(ToolName::Stat);
    let fake = FakeClient::attach(&server.client_config(), "lap", tools).await;
    assert_eq!(
        fake.workspace.tools,
        vec![ToolName::Stat, ToolName::ReadFile],
        "as the server answered the attach"
    );
    let agent = server.agent().await;
    let (_, listed) = agent.workspaces(None).await.expect("the workspaces");
    let lap = listed
        .iter()
        .find(|w| w.name == "lap")
        .expect("the folder is listed");
    assert_eq!(lap.tools, vec![ToolName::Stat, ToolName::ReadFile]);
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

/// Whether this process runs as root: a server makes its users' cgroups only then (here, where
/// the suite runs as root, always; elsewhere the tests that need them say they did not run).
fn as_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .is_some_and(|uids| uids.split_whitespace().nth(1) == Some("0"));
    if !root {
        eprintln!("SKIPPED: a server makes its users' cgroups only as root");
    }
    root
}

/// The cgroup path of the processor's controller in a `/proc/<pid>/cgroup` text: a cgroup v1
/// hierarchy that has `cpu`, else the unified one.
fn cpu_cgroup(cgroups: &str) -> Option<&str> {
    let entries: Vec<(&str, &str)> = cgroups
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            Some((controllers, path))
        })
        .collect();
    entries
        .iter()
        .find(|(controllers, _)| controllers.split(',').any(|c| c == "cpu"))
        .or_else(|| {
            entries
                .iter()
                .find(|(controllers, _)| controllers.is_empty())
        })
        .map(|(_, path)| *path)
}

/// `cpu.stat` of cgroup `path` of the processor's controller, wherever its hierarchy is mounted.
fn cpu_stat(path: &str) -> String {
    [
        "/sys/fs/cgroup/cpu",
        "/sys/fs/cgroup/cpu,cpuacct",
        "/sys/fs/cgroup",
    ]
    .iter()
    .find_map(|mount| std::fs::read_to_string(format!("{mount}{path}/cpu.stat")).ok())
    .unwrap_or_else(|| panic!("no cpu.stat for cgroup {path}"))
}

/// Each user's commands together are one entity to the processor's scheduler, whatever number
/// of processes they run, and can be held to a ceiling (`server.max_cpu_percent_per_user`, a
/// cgroup's `cpu.max`, or cgroup v1's `cpu.cfs_quota_us`, per user). A user's thousand busy
/// background processes took the host's processors from every other user, and from the server
/// itself, with nothing to bound them: each was one more thread to the scheduler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_users_commands_share_the_processor_as_one_and_can_be_held_to_a_ceiling() {
    if !as_root() {
        return;
    }
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let other = connect_agent(&server.client_config_with(&server.create_token("bea"))).await;
    let where_it_runs = |agent: Agent| async move {
        let (r, _) = ok(call_in(
            &agent,
            None,
            "run_command",
            json!({"argv": ["cat", "/proc/self/cgroup"]}),
        )
        .await);
        r["stdout"].as_str().unwrap_or_default().to_owned()
    };
    let cgroups = where_it_runs(agent.clone()).await;
    let cpu = cpu_cgroup(&cgroups).expect("a cgroup of the processor");
    assert!(cpu.contains("/user-admin"), "{cgroups}");
    let theirs = where_it_runs(other.clone()).await;
    assert!(
        cpu_cgroup(&theirs).is_some_and(|c| c.contains("/user-bea")),
        "{theirs}"
    );
    // What it is for (informational: timings are not asserted): eight busy commands of
    // admin's beside one of bea's, which says what share of a processor it got. (Each command
    // is a session of its own, which a kernel with autogroups schedules as one: many busy
    // processes of one command were never the problem; many commands were.)
    let mut busy = Vec::new();
    for _ in 0..8 {
        let spin = json!({"argv": ["sh", "-c", "while :; do :; done"], "background": true});
        let (started, _) = ok(call_in(&agent, None, "run_command", spin).await);
        busy.push(
            started["process"]
                .as_str()
                .expect("a process id")
                .to_owned(),
        );
    }
    let share = "import time\n\
                 t, c = time.time(), time.process_time()\n\
                 while time.time() - t < 2: pass\n\
                 print(round(100 * (time.process_time() - c) / (time.time() - t)))\n";
    let (got, _) = ok(call_in(
        &other,
        None,
        "run_command",
        json!({"argv": ["python3", "-c", share]}),
    )
    .await);
    eprintln!(
        "bea's one busy command got {}% of a processor beside admin's eight",
        got["stdout"].as_str().unwrap_or_default().trim()
    );
    for id in busy {
        let kill = json!({"process": id, "signal": "KILL"});
        ok(call_in(&agent, None, "process_kill", kill).await);
    }
    drop(server);

    // With a ceiling of a fifth of a processor, a busy command is throttled.
    let server = TestServer::start_with(|c| c.quotas.max_cpu_percent_per_user = 20).await;
    let agent = server.agent().await;
    let cgroups = where_it_runs(agent.clone()).await;
    let cpu = cpu_cgroup(&cgroups).expect("a cgroup of the processor");
    let group = cpu.split("/user-admin").next().unwrap().to_owned() + "/user-admin";
    let spin = "end=$(( $(date +%s) + 2 )); while [ $(date +%s) -lt $end ]; do :; done";
    ok(call_in(
        &agent,
        None,
        "run_command",
        json!({"argv": ["sh", "-c", spin]}),
    )
    .await);
    let stat = cpu_stat(&group);
    let throttled = stat
        .lines()
        .find_map(|line| line.strip_prefix("nr_throttled "))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .expect("nr_throttled in cpu.stat");
    assert!(throttled > 0, "the ceiling did not hold it back: {stat}");
}

/// Reads process `id` of `session` until its output holds `want` or it ends: its standard output
/// and standard error so far, and the last answer.
async fn read_in_until(agent: &Agent, session: &str, id: &str, want: &str) -> (String, String) {
    let (mut out, mut err) = (String::new(), String::new());
    within(STEP, &format!("`{want}` from process {id}"), async {
        loop {
            let (r, _) = ok(call_in(
                agent,
                Some(session),
                "process_read",
                json!({"process": id, "wait_ms": 2000}),
            )
            .await);
            out.push_str(r["stdout"].as_str().unwrap_or_default());
            err.push_str(r["stderr"].as_str().unwrap_or_default());
            if out.contains(want) || r["running"] == false {
                return;
            }
        }
    })
    .await;
    (out, err)
}

/// Kills process `id` of `session` and waits until it has ended.
async fn end(agent: &Agent, session: &str, id: &str) {
    let kill = json!({"process": id, "signal": "KILL"});
    ok(call_in(agent, Some(session), "process_kill", kill).await);
    read_in_until(agent, session, id, "\u{0}never").await;
}

/// A command that starts `sleepers` processes that sleep, says `started` for each, then `all`,
/// and waits for them: it holds them (a command's processes end with it).
fn sleepers(sleepers: u32) -> serde_json::Value {
    let script =
        format!("for i in $(seq {sleepers}); do sleep 60 & echo started; done; echo all; wait");
    json!({"argv": ["sh", "-c", script], "background": true})
}

/// One user's commands over all their sessions are bounded together
/// (`server.max_processes_per_user`, a cgroup's `pids.max` per user): each session's primary
/// workspace runs its commands as a user of its own, so the per-workspace `max_processes` let one
/// user take every process id of the host through many sessions, and another user's commands
/// then failed to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_users_processes_are_bounded_over_all_their_sessions_while_another_still_works() {
    if !as_root() {
        return;
    }
    let server = TestServer::start_with(|c| c.quotas.max_processes_per_user = 40).await;
    let agent = connect_agent(&server.client_config()).await;
    let (one, two, three) = (
        "00000000-0000-4000-8000-0000000000a1",
        "00000000-0000-4000-8000-0000000000a2",
        "00000000-0000-4000-8000-0000000000a3",
    );
    // Session one holds 34 sleepers: with its supervisor, init and shell, 37 of admin's 40.
    let (held, _) = ok(call_in(&agent, Some(one), "run_command", sleepers(34)).await);
    let held = held["process"].as_str().expect("a process id").to_owned();
    let (out, err) = read_in_until(&agent, one, &held, "all").await;
    assert_eq!(out.matches("started").count(), 34, "{out}{err}");
    // Session two's shell gets what is left (its supervisor, init and itself), and its first
    // `fork` fails.
    let (started, _) = ok(call_in(&agent, Some(two), "run_command", sleepers(34)).await);
    let id = started["process"]
        .as_str()
        .expect("a process id")
        .to_owned();
    let (out, err) = read_in_until(&agent, two, &id, "all").await;
    let count = out.matches("started").count();
    assert_eq!(
        count, 0,
        "{count} of 34 started past the user's bound: {out}{err}"
    );
    assert!(err.contains("fork"), "{out}{err}");
    // Session three takes the last three: the user is at the bound.
    let (last, _) = ok(call_in(
        &agent,
        Some(three),
        "run_command",
        json!({"argv": ["sleep", "60"], "background": true}),
    )
    .await);
    let last = last["process"].as_str().expect("a process id").to_owned();
    // A command that cannot even start is refused, naming the bound, in any session.
    for session in [one, two, three] {
        let refused = monad_tests::err(
            call_in(
                &agent,
                Some(session),
                "run_command",
                json!({"argv": ["true"]}),
            )
            .await,
        );
        assert_eq!(refused.code, ErrorCode::LimitExceeded, "{refused}");
        assert!(
            refused.message.contains("server.max_processes_per_user")
                && refused
                    .message
                    .contains("may have 40 at once over all their sessions ("),
            "{refused}"
        );
    }

    // Ben is not affected.
    let ben = connect_agent(&server.client_config_with(&server.create_token("ben"))).await;
    let bens = "00000000-0000-4000-8000-0000000000bb";
    let (ran, _) = ok(call_in(&ben, Some(bens), "run_command", sleepers(20)).await);
    let bens_id = ran["process"].as_str().expect("a process id").to_owned();
    let (out, err) = read_in_until(&ben, bens, &bens_id, "all").await;
    assert_eq!(out.matches("started").count(), 20, "{out}{err}");

    // Once session one's command ends, admin's commands start again.
    end(&agent, one, &held).await;
    let (again, _) = ok(call_in(&agent, Some(three), "run_command", sleepers(10)).await);
    let again = again["process"].as_str().expect("a process id").to_owned();
    let (out, err) = read_in_until(&agent, three, &again, "all").await;
    assert_eq!(out.matches("started").count(), 10, "{out}{err}");
    for (agent, session, id) in [
        (&agent, three, &again),
        (&agent, three, &last),
        (&ben, bens, &bens_id),
    ] {
        end(agent, session, id).await;
    }
    server.stop().await;
}

/// A command that opens `n` tunnels through its workspace's proxy to `port` and holds them,
/// saying `ok` for each the proxy let through and `closed` for each it closed, then `all`.
fn tunnels(n: u32, port: u16) -> serde_json::Value {
    let script = format!(
        "import socket, time\n\
         held = []\n\
         for _ in range({n}):\n\
         \x20   s = socket.create_connection(('127.0.0.1', 3128), timeout=10)\n\
         \x20   s.sendall(b'CONNECT 127.0.0.1:{port} HTTP/1.1\\r\\nHost: 127.0.0.1:{port}\\r\\n\\r\\n')\n\
         \x20   try:\n\
         \x20       answer = s.recv(64)\n\
         \x20   except OSError:\n\
         \x20       answer = b''\n\
         \x20   print('ok' if answer.startswith(b'HTTP/1.1 200') else 'closed', flush=True)\n\
         \x20   held.append(s)\n\
         print('all', flush=True)\n\
         time.sleep(60)\n"
    );
    json!({"argv": ["python3", "-c", script], "background": true})
}

/// One user's connections through the network proxies of all their sessions are bounded
/// together (`server.max_proxy_connections_per_user`): each workspace's proxy took 64, and a
/// user with many sessions held two of the server's descriptors per connection, as many as
/// they liked. Another user's budget is their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_users_proxy_connections_are_bounded_over_all_their_sessions() {
    // An origin that takes connections and holds them.
    let origin = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = origin.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in origin.incoming().flatten() {
            held.push(stream);
        }
    });
    let server = TestServer::start_with(|c| {
        c.quotas.max_proxy_connections_per_user = 3;
        c.exec.network = monad_sandbox::NetworkMode::Allowlist;
        c.exec.allow = vec![format!("127.0.0.1:{port}")];
    })
    .await;
    let agent = connect_agent(&server.client_config()).await;
    let (one, two) = (
        "00000000-0000-4000-8000-0000000000c1",
        "00000000-0000-4000-8000-0000000000c2",
    );
    let mut held = Vec::new();
    let mut said = String::new();
    for session in [one, two] {
        let (started, _) =
            ok(call_in(&agent, Some(session), "run_command", tunnels(2, port)).await);
        let id = started["process"]
            .as_str()
            .expect("a process id")
            .to_owned();
        let (out, err) = read_in_until(&agent, session, &id, "all").await;
        assert!(out.contains("all"), "{out}{err}");
        said.push_str(&out);
        held.push((session, id));
    }
    assert_eq!(
        (said.matches("ok").count(), said.matches("closed").count()),
        (3, 1),
        "{said}"
    );
    // Ben is not affected.
    let ben = connect_agent(&server.client_config_with(&server.create_token("ben"))).await;
    let bens = "00000000-0000-4000-8000-0000000000cb";
    let (ran, _) = ok(call_in(&ben, Some(bens), "run_command", tunnels(3, port)).await);
    let bens_id = ran["process"].as_str().expect("a process id").to_owned();
    let (out, err) = read_in_until(&ben, bens, &bens_id, "all").await;
    assert_eq!(out.matches("ok").count(), 3, "{out}{err}");
    end(&ben, bens, &bens_id).await;
    for (session, id) in held {
        end(&agent, session, &id).await;
    }
    server.stop().await;
}

/// A `process_cgroup` that is no cgroup stops the start with an error naming it; with both
/// bounds off (`max_processes_per_user = 0`, `max_memory_per_user = 0`, and no processor
/// ceiling) it is not looked at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_cgroup_that_is_no_cgroup_is_refused_at_start() {
    let data = tempfile::tempdir().unwrap();
    let not_a_cgroup = tempfile::tempdir().unwrap();
    let config = |bound: u64| {
        format!(
            "[server]\nmax_processes_per_user = {bound}\nmax_memory_per_user = {bound}\n\
             process_cgroup = {:?}\n",
            not_a_cgroup.path().display().to_string()
        )
    };
    std::fs::write(data.path().join("config.toml"), config(100)).unwrap();
    let error = monad_server::Server::bind(monad_tests::test_config(data.path().to_path_buf()))
        .expect_err("a server started with a process_cgroup that is no cgroup")
        .to_string();
    assert!(
        error.contains("server.process_cgroup") && error.contains("is not a cgroup directory"),
        "{error}"
    );
    assert_eq!(std::fs::read_dir(not_a_cgroup.path()).unwrap().count(), 0);
    std::fs::write(data.path().join("config.toml"), config(0)).unwrap();
    let started = monad_server::Server::bind(monad_tests::test_config(data.path().to_path_buf()));
    assert!(started.is_ok(), "{:?}", started.err());
}

/// A command that builds a string of `bytes` bytes in its shell (twice that at its peak, while
/// the shell grows it), says `held`, then runs `then`.
fn holding(bytes: u64, then: &str) -> serde_json::Value {
    let script = format!("x=$(head -c {bytes} /dev/zero | tr '\\0' a); echo held; {then}");
    json!({"argv": ["sh", "-c", script]})
}

/// One user's commands over all their sessions share one memory bound
/// (`server.max_memory_per_user`, the same cgroups' memory bound): a command that fits alone
/// but not with the user's other commands is killed, and another user's is not. Before, each
/// command was bounded only by its own processes' address space (`[exec] max_memory_bytes`, off
/// by default), and one user's commands over many sessions could take the host's memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_users_memory_is_bounded_over_all_their_sessions_while_another_still_works() {
    if !as_root() {
        return;
    }
    // The server's process holds 256 MiB, as a busy one may: each command's supervisor and
    // init are copies of it, and the kernel, out of memory in the user's cgroup, would kill
    // the largest process there (a supervisor, with the command of another session) if they
    // were in it.
    let ballast = vec![1u8; 256 << 20];
    let server = TestServer::start_with(|c| c.quotas.max_memory_per_user = 100 << 20).await;
    let agent = connect_agent(&server.client_config()).await;
    let (one, two) = (
        "00000000-0000-4000-8000-0000000000a4",
        "00000000-0000-4000-8000-0000000000a5",
    );
    // Session one holds 40 MB (80 MB at its peak: under the user's 100 MiB).
    let mut hold = holding(40_000_000, "sleep 60");
    hold["background"] = json!(true);
    let (held, _) = ok(call_in(&agent, Some(one), "run_command", hold).await);
    let held = held["process"].as_str().expect("a process id").to_owned();
    let (out, err) = read_in_until(&agent, one, &held, "held").await;
    assert!(out.contains("held"), "{out}{err}");
    // The same in session two passes the bound with session one's: it is killed.
    let (r, _) = ok(call_in(&agent, Some(two), "run_command", holding(40_000_000, "")).await);
    assert_eq!(
        (r["signal"].clone(), r["memory_bound"].clone()),
        (json!(9), json!(true)),
        "{r}"
    );
    assert!(
        !r["stdout"].as_str().unwrap_or_default().contains("held"),
        "{r}"
    );
    // Ben's runs.
    let ben = connect_agent(&server.client_config_with(&server.create_token("ben"))).await;
    let bens = "00000000-0000-4000-8000-0000000000bc";
    let (r, _) = ok(call_in(&ben, Some(bens), "run_command", holding(40_000_000, "")).await);
    assert_eq!(
        (r["exit_code"].clone(), r["stdout"].clone()),
        (json!(0), json!("held\n")),
        "{r}"
    );
    assert_eq!(r.get("memory_bound"), None, "{r}");
    // Once session one's command ends, session two's runs.
    end(&agent, one, &held).await;
    let (r, _) = ok(call_in(&agent, Some(two), "run_command", holding(40_000_000, "")).await);
    assert_eq!(
        (r["exit_code"].clone(), r["stdout"].clone()),
        (json!(0), json!("held\n")),
        "{r}"
    );
    server.stop().await;
    assert_eq!(
        ballast.iter().map(|b| usize::from(*b)).sum::<usize>(),
        256 << 20
    );
}

/// A client's answer named a process of another workspace, which the session then sent that
/// process's `process_write` text (say, a password typed into it) to, and whose answers it took;
/// and ids of any length were kept. Now only an id as sandboxes make them, and never one that
/// another workspace started, is noted from a client's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_result_cannot_take_over_another_workspaces_process() {
    use monad_protocol::wire::Outcome;
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let tools = vec![ToolName::RunCommand, ToolName::ProcessWrite];
    let victim = FakeClient::attach(&server.client_config(), "victim", tools.clone()).await;
    let taker = FakeClient::attach(&server.client_config(), "taker", tools).await;
    // A call from the agent, answered by a fake client meanwhile.
    let calling = |tool: &'static str, args: serde_json::Value| {
        let agent = agent.clone();
        tokio::spawn(async move { call_in(&agent, None, tool, args).await })
    };
    // Each starts a background command; the taker's result names the victim's process, then
    // one of an id no sandbox makes.
    for (fake, process) in [
        (&victim, "proc-0000abcd"),
        (&taker, "proc-0000abcd"),
        (&taker, "proc-xx"),
    ] {
        let name = fake.workspace.name.clone();
        let running = calling(
            "run_command",
            json!({"argv": ["sleep", "60"], "background_after_ms": 0, "workspace": name}),
        );
        let tool = fake
            .answer_run(json!({"exit_code": null, "stdout": "", "stderr": "",
                "timed_out": false, "duration_ms": 1, "sandbox": "landlock", "process": process}))
            .await;
        assert_eq!(tool, ToolName::RunCommand);
        within(STEP, "the run's answer", running)
            .await
            .expect("no panic");
    }
    // Writing to the victim's process, naming no workspace, goes to the victim.
    let writing = calling(
        "process_write",
        json!({"process": "proc-0000abcd", "text": "hunter2\n"}),
    );
    let tool = victim
        .answer_run(json!({"process": "proc-0000abcd", "running": true, "written": 8}))
        .await;
    assert_eq!(tool, ToolName::ProcessWrite);
    ok(within(STEP, "the write's answer", writing)
        .await
        .expect("no panic"));
    // The id no sandbox makes was not kept: naming it alone finds no process.
    let unknown = call_in(
        &agent,
        None,
        "process_write",
        json!({"process": "proc-xx", "text": "x"}),
    )
    .await;
    assert!(
        matches!(unknown.outcome, Outcome::Error { .. }),
        "{:?}",
        unknown.outcome
    );
}

/// What one user's calls hold of attached clients' answers in the server's memory is bounded
/// over all their calls: a client that sends several large answers at once, slowly, gets the
/// one that would pass the bound refused, and the others through. (Each call read up to 256 MiB
/// of its answer into memory, and a user had 256 calls: 64 GiB.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answers_one_users_calls_hold_in_memory_are_bounded_together() {
    use monad_protocol::frame;
    use monad_protocol::wire::{Message, Outcome};
    const MIB: usize = 1024 * 1024;
    let server =
        TestServer::start_with(|config| config.quotas.max_call_bytes_per_user = 5 * MIB).await;
    let agent = server.agent().await;
    let fake = FakeClient::attach(&server.client_config(), "lap", vec![ToolName::ReadFile]).await;
    let calling = |path: &'static str| {
        let agent = agent.clone();
        tokio::spawn(async move {
            call_in(
                &agent,
                None,
                "read_file",
                json!({"path": path, "workspace": "lap"}),
            )
            .await
        })
    };
    // Two answers of 3 MiB each, all but their last frame sent: together past the bound.
    let mut held = Vec::new();
    for path in ["a.txt", "b.txt"] {
        let call = calling(path);
        let (request, mut send, _recv) = fake.next_request().await;
        let Message::Run { id, .. } = request else {
            panic!("the server asked {request:?}, not a run");
        };
        let content = "x".repeat(3 * MIB);
        let answer = Message::Result {
            id,
            workspace: None,
            outcome: Outcome::Ok {
                result: json!({"path": path, "content": content, "start_line": 1, "lines": 1,
                    "size": content.len(), "binary": false, "truncated": false})
                .into(),
            },
            body: None,
        };
        let bytes = answer.to_json();
        let pieces: Vec<_> = frame::frames(&bytes).collect();
        let (last, rest) = pieces.split_last().unwrap();
        for (header, payload) in rest {
            let _ = send.write_all(header).await;
            let _ = send.write_all(payload).await;
        }
        held.push((call, send, last.0, last.1.to_vec(), _recv));
    }
    // Then their ends.
    let mut outcomes = Vec::new();
    for (call, mut send, header, payload, _recv) in held {
        let _ = send.write_all(&header).await;
        let _ = send.write_all(&payload).await;
        let _ = send.finish();
        outcomes.push(
            within(STEP, "the call's answer", call)
                .await
                .unwrap()
                .outcome,
        );
    }
    let refused: Vec<_> = outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::Error { error } => Some(error),
            Outcome::Ok { .. } => None,
        })
        .collect();
    assert_eq!(
        refused.len(),
        1,
        "one answer through, one refused: {refused:?}"
    );
    assert_eq!(refused[0].code, ErrorCode::LimitExceeded, "{}", refused[0]);
    assert!(
        refused[0]
            .message
            .contains("server.max_call_bytes_per_user"),
        "{}",
        refused[0]
    );
    // What the calls held came back: an answer of the same size goes through alone.
    let call = calling("c.txt");
    let tool = fake
        .answer_run(
            json!({"path": "c.txt", "content": "y".repeat(3 * MIB), "start_line": 1,
            "lines": 1, "size": 3 * MIB, "binary": false, "truncated": false}),
        )
        .await;
    assert_eq!(tool, ToolName::ReadFile);
    ok(within(STEP, "the third call", call).await.unwrap());

    // A body read whole, for an agent of a version that takes results inline, counts too: one
    // past the bound is refused, one within it goes through.
    let (_endpoint, conn, _) = monad_tests::connect_speaking(
        &server.client_config(),
        Role::Agent,
        monad_protocol::wire::BODY_MINOR - 1,
    )
    .await;
    for (len, fits) in [(6 * MIB, false), (3 * MIB, true)] {
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        let request = Message::Call {
            id: 5,
            session: None,
            tool: "read_file".into(),
            args: json!({"path": "big.txt", "workspace": "lap"}),
        };
        monad_protocol::io::write_message(&mut send, &request)
            .await
            .unwrap();
        send.finish().unwrap();
        let (_, mut answer, _recv) = fake.next_request().await;
        let head = Message::Result {
            id: 1,
            workspace: None,
            outcome: Outcome::Ok {
                result: json!({"path": "big.txt", "size": len, "binary": false}).into(),
            },
            body: Some(monad_protocol::wire::Body {
                field: "content".into(),
                len: len as u64,
            }),
        };
        monad_protocol::io::write_message(&mut answer, &head)
            .await
            .unwrap();
        let _ = answer.write_all(&vec![b'z'; len]).await;
        let _ = answer.finish();
        let reply = within(
            STEP,
            "the answer",
            monad_protocol::io::read_message(&mut recv, 64 << 20),
        )
        .await;
        match reply {
            Ok(Some(Message::Result {
                outcome: Outcome::Ok { result },
                ..
            })) if fits => assert_eq!(result.value()["content"].as_str().map(str::len), Some(len)),
            Ok(Some(Message::Result {
                outcome: Outcome::Error { error },
                ..
            })) if !fits => assert!(
                error.code == ErrorCode::LimitExceeded
                    && error.message.contains("server.max_call_bytes_per_user"),
                "{error}"
            ),
            Ok(Some(Message::Result { outcome, .. })) => panic!(
                "{len} bytes: {}",
                match outcome {
                    Outcome::Ok { .. } => "went through".to_owned(),
                    Outcome::Error { error } => error.to_string(),
                }
            ),
            other => panic!("{len} bytes: {:?}", other.map(|m| m.map(|m| m.kind()))),
        }
    }
}

/// The tree a request becomes is counted before it is made: one of more values than any tool
/// takes is refused, and one whose tree would take its user's calls past what they may hold
/// is refused too, saying so; the user's next call goes through. (A 40 MiB request of small
/// numbers became a 640 MiB tree, held for as long as its call ran, 256 calls at once.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requests_tree_is_counted_before_it_is_made() {
    use monad_protocol::wire::Outcome;
    const MIB: usize = 1024 * 1024;
    let server =
        TestServer::start_with(|config| config.quotas.max_call_bytes_per_user = 5 * MIB).await;
    let agent = server.agent().await;
    // Refused before any call starts: the server's answer to the request itself.
    let refused = |args: serde_json::Value| {
        let agent = agent.clone();
        async move {
            match within(
                STEP,
                "the refusal",
                agent.call(None, "run_command", args, |_| {}),
            )
            .await
            {
                Err(ClientError::Refused(error)) => error,
                other => panic!(
                    "the request was not refused: {:?}",
                    other.map(|r| r.outcome)
                ),
            }
        }
    };
    let zeros = |n: usize| vec![0; n];
    let many = refused(json!({"argv": zeros(1_000_001)})).await;
    assert_eq!(many.code, ErrorCode::LimitExceeded, "{many}");
    assert!(
        many.message.contains("more than 1000000 JSON values"),
        "{many}"
    );
    let big = refused(json!({"argv": zeros(120_000)})).await;
    assert_eq!(big.code, ErrorCode::LimitExceeded, "{big}");
    assert!(
        big.message.contains("server.max_call_bytes_per_user"),
        "{big}"
    );
    // Within the bound it is read (and refused by the tool, for what it is), and what the
    // refused ones held came back.
    let within_bound = call_in(&agent, None, "run_command", json!({"argv": zeros(50_000)})).await;
    match within_bound.outcome {
        Outcome::Error { error } => assert_eq!(error.code, ErrorCode::InvalidArguments, "{error}"),
        Outcome::Ok { .. } => panic!("an argv of numbers ran"),
    }
    ok(call_in(&agent, None, "workspaces", json!({})).await);
}

/// An approver that never answers: each request it is shown waits (with its request and diff
/// held) until the attachment goes.
struct Waiting(Arc<std::sync::atomic::AtomicUsize>);

impl monad_client::approval::Approver for Waiting {
    fn decide(
        &self,
        _request: monad_client::approval::ApprovalRequest,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = monad_client::approval::Decision> + Send>>
    {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(std::future::pending())
    }
}

/// What an attached folder's requests hold in the client's memory at once is bounded: writes of
/// 1 MiB waiting for their owner (each holding its request and its diff, about 2 MiB) fill a
/// bound of 10.5 MiB at five; the others are refused with `limit_exceeded` rather than held (a
/// server could make a laptop hold gigabytes of requests it never finished or never answered;
/// the bound is 256 MiB unless changed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_an_attached_folders_requests_hold_is_bounded() {
    let server = TestServer::start().await;
    let dir = folder(&[]);
    let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut options = attach_options(dir.path(), "lap");
    options.prompt_timeout = std::time::Duration::from_secs(120);
    options.requests_held_max = 21 * 512 * 1024;
    let attachment = Attachment::start(
        &server.client_config(),
        options,
        Some(Arc::new(Waiting(asked.clone()))),
    )
    .await;
    let content = format!("{}\n", "x".repeat(1023)).repeat(1024);
    let agent = server.agent().await;
    let refused = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut calls = tokio::task::JoinSet::new();
    for n in 0..12 {
        let (agent, content, refused) = (agent.clone(), content.clone(), refused.clone());
        calls.spawn(async move {
            let args = json!({"path": format!("f{n}.txt"), "content": content, "workspace": "lap"});
            // Those held wait for their owner until the attachment goes.
            let Ok(reply) = agent.call(None, "write_file", args, |_| {}).await else {
                return;
            };
            if let monad_protocol::wire::Outcome::Error { error } = &reply.outcome
                && error.code == ErrorCode::LimitExceeded
            {
                assert!(
                    error.message.contains("this folder's requests"),
                    "{}",
                    error.message
                );
                refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
    }
    let count =
        |n: &Arc<std::sync::atomic::AtomicUsize>| n.load(std::sync::atomic::Ordering::SeqCst);
    within(STEP, "each write asked about or refused", async {
        while count(&asked) + count(&refused) < 12 {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(count(&asked) <= 5, "{} held", count(&asked));
    assert!(count(&refused) >= 7, "{} refused", count(&refused));
    drop(attachment);
    calls.abort_all();
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "nothing written"
    );
}

/// The answers to an agent's requests other than calls (a conversation, a listing) count
/// against what the user's requests may hold in memory until they are written: an agent that
/// asks for a large conversation on many streams and reads none of the answers (a stream window
/// of 1 KiB) holds at most that bound, and the answers past it are refused, saying so. (They
/// were written uncounted, without end: 64 connections of 64 streams each held its answer, a
/// conversation of up to 8 MiB and its JSON, for as long as the agent kept its connection.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_an_agent_does_not_read_are_bounded_with_its_calls() {
    use monad_protocol::io::{read_message, write_message};
    use monad_protocol::wire::{HistoryMessage, HistoryRole, Message};
    const MIB: usize = 1024 * 1024;
    let server =
        TestServer::start_with(|config| config.quotas.max_call_bytes_per_user = 3 * MIB).await;
    let agent = server.agent().await;
    let said = HistoryMessage {
        role: HistoryRole::User,
        text: "x".repeat(MIB),
    };
    agent.history_append(None, said).await.expect("appended");
    let mut transport = quinn::TransportConfig::default();
    transport.stream_receive_window(1024u32.into());
    let (_endpoint, conn, _) = monad_tests::connect_speaking_over(
        &server.client_config(),
        Role::Agent,
        PROTOCOL_MINOR,
        Some(transport),
    )
    .await;
    let mut streams = Vec::new();
    for id in 0..6 {
        let (mut send, recv) = conn.open_bi().await.unwrap();
        let ask = Message::HistoryGet { id, session: None };
        write_message(&mut send, &ask).await.unwrap();
        send.finish().unwrap();
        streams.push(recv);
    }
    // Two answers of a little over 1 MiB fit in 3 MiB; they wait for the agent to read them.
    let state = server.state().clone();
    within(STEP, "the unread answers to be counted", async {
        while state.call_bytes_held("admin") < 2 * MIB {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(state.call_bytes_held("admin") <= 3 * MIB);
    let (mut whole, mut refused) = (0, 0);
    for mut recv in streams {
        match within(STEP, "an answer", read_message(&mut recv, 16 * MIB)).await {
            Ok(Some(Message::HistoryIs { history, .. })) => {
                assert_eq!(history.messages.len(), 1);
                whole += 1;
            }
            Ok(Some(Message::Error { error, .. })) => {
                assert_eq!(error.code, ErrorCode::LimitExceeded, "{error}");
                assert!(
                    error.message.contains("server.max_call_bytes_per_user"),
                    "{error}"
                );
                refused += 1;
            }
            other => panic!("{:?}", other.map(|m| m.map(|m| m.kind()))),
        }
    }
    assert_eq!((whole, refused), (2, 4));
    // Read, they are let go; the user's next request goes through.
    within(STEP, "the answers to be let go", async {
        while state.call_bytes_held("admin") > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    let (_, history) = agent.history(None).await.expect("the conversation");
    assert_eq!(history.messages.len(), 1);
}

/// Regression: a call's records (its audit line, its output and diff artifacts) waited for the
/// recorder counted against nothing once its answer was written, so a user whose calls came
/// faster than the store took them (a slow disk, a database that does not answer) grew the
/// queue without bound. They count against the user's bytes in memory until written: past
/// the bound the user's next calls are refused, another user's are not, and nothing recorded
/// is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_waiting_for_the_store_count_against_their_users_memory() {
    const MIB: usize = 1024 * 1024;
    let server =
        TestServer::start_with(|config| config.quotas.max_call_bytes_per_user = 4 * MIB).await;
    let agent = server.agent().await;
    let other = connect_agent(&server.client_config_with(&server.create_token("bea"))).await;
    let content = "x".repeat(200 * 1024);
    ok(call(
        &agent,
        "write_file",
        json!({"path": "big.txt", "content": content}),
    )
    .await);
    // The store held up: the recorder waits on a job of nobody's until released.
    let release = server.hold_up_recorder("nobody", 0);
    let read = json!({"path": "big.txt", "limit": 100_000});
    let mut answered = 0;
    // The next call is refused, as a request.
    let refused = loop {
        let reply = within(
            STEP,
            "a read to answer",
            agent.call(None, "read_file", read.clone(), |_| {}),
        )
        .await;
        match reply {
            Ok(reply) => {
                ok(reply);
                answered += 1;
            }
            Err(e) => break e.to_string(),
        }
        assert!(
            answered < 64,
            "64 reads of 200 KiB waited for the store, none refused"
        );
    };
    assert!(
        refused.contains("records waiting to be written")
            && refused.contains("server.max_call_bytes_per_user"),
        "{refused}"
    );
    assert!(answered >= 10, "only {answered} calls before the bound");
    // Another user's calls are not held up by it.
    ok(call(&other, "list_dir", json!({})).await);
    // Once the store takes them, the user's calls go through again.
    release.send(()).unwrap();
    let flushed = server
        .state()
        .executor
        .recorder
        .clone()
        .expect("a recorder");
    tokio::task::spawn_blocking(move || flushed.flush())
        .await
        .unwrap();
    assert_eq!(server.state().record_bytes_held("admin"), 0);
    ok(call(&agent, "read_file", read).await);
}

/// Regression: what a client sent on its attach stream (a report of its folder's network
/// connections, up to 256 KiB) was held in the server's memory as it arrived, counted against
/// nothing: a user's connections could hold 128 MiB past their bound with reports they never
/// finished. They count with the user's calls (never refused: one a stream at most), so
/// that the user's next calls are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_an_attached_client_never_finishes_count_against_its_users_memory() {
    use monad_protocol::frame;
    const KIB: usize = 1024;
    let server =
        TestServer::start_with(|config| config.quotas.max_call_bytes_per_user = 1024 * KIB).await;
    let agent = server.agent().await;
    let mut clients = Vec::new();
    for n in 0..4 {
        let mut client = FakeClient::attach(
            &server.client_config(),
            &format!("lap{n}"),
            vec![ToolName::ReadFile],
        )
        .await;
        // A report of 240 KiB, all but its last byte sent.
        let report = format!(
            "{{\"type\":\"network\",\"pad\":\"{}\"}}",
            "x".repeat(240 * KIB)
        );
        let (header, payload) = frame::frames(report.as_bytes()).next().unwrap();
        client.report_raw(&header).await;
        client.report_raw(&payload[..payload.len() - 1]).await;
        clients.push(client);
    }
    let state = server.state().clone();
    within(STEP, "the reports to be counted", async {
        while state.call_bytes_held("admin") < 4 * 240 * KIB {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    // Past the bound with them: a request of 100 KiB is refused.
    let big = json!({"path": "big.txt", "content": "y".repeat(100 * KIB)});
    match agent.call(None, "write_file", big.clone(), |_| {}).await {
        Err(ClientError::Refused(e)) => {
            assert_eq!(e.code, ErrorCode::LimitExceeded, "{e}");
            assert!(e.message.contains("server.max_call_bytes_per_user"), "{e}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // A fifth past the bound is read all the same, and counted: no connection goes unrecorded
    // for the bound.
    let mut fifth =
        FakeClient::attach(&server.client_config(), "lap4", vec![ToolName::ReadFile]).await;
    let report = format!(
        "{{\"type\":\"network\",\"pad\":\"{}\"}}",
        "x".repeat(240 * KIB)
    );
    let (header, payload) = frame::frames(report.as_bytes()).next().unwrap();
    fifth.report_raw(&header).await;
    fifth.report_raw(&payload[..payload.len() - 1]).await;
    within(STEP, "the fifth report to be counted", async {
        while state.call_bytes_held("admin") < 5 * 240 * KIB {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    // The clients gone, what they held comes back.
    drop((clients, fifth));
    within(STEP, "the reports' bytes to come back", async {
        while state.call_bytes_held("admin") > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    ok(call(&agent, "write_file", big).await);
}
