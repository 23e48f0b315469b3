//! Workspace records (seeds 002 and 004): one folder attached to hundreds of sessions is one
//! record, and its session list pages with no duplicates and no gaps, most recent first.

use std::collections::HashSet;
use std::time::Duration;

use monad_client::ClientError;
use monad_client::agent::Agent;
use monad_client::connect::connect;
use monad_protocol::io::{read_message, write_message};
use monad_protocol::wire::{Message, Role, Trust, WorkspaceSession};
use monad_protocol::{ErrorCode, ToolName};
use monad_tests::{STEP, TestServer, within};

/// The `i`th session id of the test.
fn session(i: usize) -> String {
    format!("00000000-0000-4000-8000-{i:012x}")
}

/// Attaches `path` to `session` on a client connection and detaches it again once the server
/// has confirmed (the record keeps the session).
async fn attach_once(conn: &quinn::Connection, session: &str, path: &str) {
    let (mut send, mut recv) = conn.open_bi().await.expect("a stream");
    let attach = Message::Attach {
        id: 1,
        session: Some(session.to_owned()),
        name: Some("proj".into()),
        path: path.to_owned(),
        trust: Trust::Restricted,
        tools: vec![ToolName::ReadFile],
        focus: false,
        folder: None,
        exact_name: false,
        network: None,
    };
    write_message(&mut send, &attach).await.expect("sent");
    match read_message(&mut recv, 1 << 20).await {
        Ok(Some(Message::Attached { session: s, .. })) => assert_eq!(s, session),
        other => panic!("attach to {session} answered {other:?}"),
    }
    send.finish().expect("finished");
}

/// Every page of the record's sessions with page size `limit`.
async fn walk(agent: &Agent, record: &str, limit: Option<u32>) -> Vec<WorkspaceSession> {
    let mut all = Vec::new();
    let mut next: Option<String> = None;
    let mut pages = 0;
    loop {
        let (page, token) = within(
            STEP,
            "a page",
            agent.record_sessions(record, limit, next.as_deref()),
        )
        .await
        .unwrap_or_else(|e| panic!("page {pages} with limit {limit:?}: {e}"));
        let cap = limit.unwrap_or(20) as usize;
        assert!(
            page.len() <= cap,
            "a page of {} with limit {cap}",
            page.len()
        );
        assert!(
            token.is_none() || page.len() == cap,
            "only the last page is short"
        );
        pages += 1;
        all.extend(page);
        match token {
            Some(token) => next = Some(token),
            None => return all,
        }
    }
}

fn refused_with(result: Result<impl std::fmt::Debug, ClientError>, code: ErrorCode) {
    match result {
        Err(ClientError::Refused(e)) => assert_eq!(e.code, code, "{e}"),
        other => panic!("expected a refusal with {code:?}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_used_by_300_sessions_pages_without_duplicates_or_gaps() {
    const SESSIONS: usize = 300;
    // Each attach creates a session and rewrites the record and the bindings, durably: on a
    // disk that is about 8 fsyncs per attach. Memory-backed storage keeps the test quick where
    // there is some; the behaviour is the same.
    let shm = tempfile::tempdir_in("/dev/shm").ok();
    let server = TestServer::start_with(|config| {
        if let Some(dir) = &shm {
            config.data_dir = dir.path().to_path_buf();
        }
    })
    .await;
    let laptop = server.client_config();
    let path = "~/dev/shared-project";
    let client = within(STEP, "a client connection", connect(&laptop, Role::Client))
        .await
        .expect("connected");
    // Attach the same folder (same device, same path) to 300 sessions, 16 at a time.
    let mut pending = tokio::task::JoinSet::new();
    for i in 0..SESSIONS {
        if pending.len() >= 16 {
            pending.join_next().await.unwrap().unwrap();
        }
        let conn = client.conn.clone();
        pending.spawn(async move { attach_once(&conn, &session(i), path).await });
    }
    while let Some(done) = within(STEP, "the attaches", pending.join_next()).await {
        done.unwrap();
    }
    let agent = server.agent().await;
    let records = within(STEP, "records", agent.records()).await.unwrap();
    assert_eq!(records.len(), 1, "one folder, one record: {records:?}");
    let record = records[0].id.clone();
    assert_eq!(records[0].path, path);

    // Three sessions become the most recent (timestamps are to the second).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let recent = [session(250), session(3), session(120)];
    for s in &recent {
        attach_once(&client.conn, s, path).await;
    }

    let reference = walk(&agent, &record, Some(100)).await;
    assert_eq!(reference.len(), SESSIONS, "no gaps");
    let ids: HashSet<&str> = reference.iter().map(|s| s.session.as_str()).collect();
    assert_eq!(ids.len(), SESSIONS, "no duplicates");
    assert_eq!(
        ids,
        (0..SESSIONS)
            .map(session)
            .collect::<HashSet<_>>()
            .iter()
            .map(String::as_str)
            .collect()
    );
    // Most recent first (ties by id), the re-attached three on top.
    for pair in reference.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert!(
            a.last_active > b.last_active
                || (a.last_active == b.last_active && a.session < b.session),
            "out of order: {a:?} before {b:?}"
        );
    }
    let top: HashSet<&str> = reference[..3].iter().map(|s| s.session.as_str()).collect();
    assert_eq!(top, recent.iter().map(String::as_str).collect());

    // Every page size walks the same list.
    for limit in [Some(1), Some(7), None, Some(33), Some(99)] {
        let walked = walk(&agent, &record, limit).await;
        assert!(walked == reference, "limit {limit:?} walks another list");
    }

    // Bad requests are refused as such.
    for token in ["zz", "not a token", "00", "", &"ab".repeat(300)] {
        refused_with(
            within(
                STEP,
                "a bad token",
                agent.record_sessions(&record, Some(5), Some(token)),
            )
            .await,
            ErrorCode::InvalidArguments,
        );
    }
    for limit in [0, 101, 5000] {
        refused_with(
            within(
                STEP,
                "a bad limit",
                agent.record_sessions(&record, Some(limit), None),
            )
            .await,
            ErrorCode::InvalidArguments,
        );
    }
    refused_with(
        within(
            STEP,
            "an unknown record",
            agent.record_sessions("nope", None, None),
        )
        .await,
        ErrorCode::NotFound,
    );
    // Another user's record does not exist for them.
    let other =
        monad_tests::connect_agent(&server.client_config_with(&server.create_token("eve"))).await;
    refused_with(
        within(
            STEP,
            "another user's record",
            other.record_sessions(&record, None, None),
        )
        .await,
        ErrorCode::NotFound,
    );
    assert!(
        within(STEP, "records", other.records())
            .await
            .unwrap()
            .is_empty()
    );

    // The user's session list pages the same way, in the same order as the whole list.
    let whole = within(STEP, "sessions", agent.sessions()).await.unwrap();
    assert_eq!(whole.len(), SESSIONS, "the 300 sessions");
    for limit in [1, 13, 100] {
        let mut walked = Vec::new();
        let mut next: Option<String> = None;
        loop {
            let (page, token) = within(
                STEP,
                "a page of sessions",
                agent.sessions_page(Some(limit), next.as_deref()),
            )
            .await
            .unwrap();
            assert!(page.len() <= limit as usize);
            walked.extend(page.into_iter().map(|s| s.id));
            match token {
                Some(token) => next = Some(token),
                None => break,
            }
        }
        let ids: Vec<String> = whole.iter().map(|s| s.id.clone()).collect();
        assert!(walked == ids, "limit {limit} walks another list");
    }
    refused_with(
        within(STEP, "a bad page", agent.sessions_page(Some(0), None)).await,
        ErrorCode::InvalidArguments,
    );
    refused_with(
        within(
            STEP,
            "a bad page",
            agent.sessions_page(Some(10), Some("zz")),
        )
        .await,
        ErrorCode::InvalidArguments,
    );

    // `monad-server workspace show` pages the same list.
    let admin = monad_server::admin::Admin::new(&server.config().data_dir);
    let (shown, page) = admin.workspace(&record, 50, None).unwrap();
    assert_eq!(shown.id, record);
    assert_eq!(page.items[..], reference[..50]);
    let (_, page) = admin.workspace(&record, 50, page.next.as_deref()).unwrap();
    assert_eq!(page.items[..], reference[50..100]);
    server.stop().await;
}
