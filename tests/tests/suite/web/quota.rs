//! Per-user storage quotas on API writes: workspace records and uploaded artifact bytes. A user
//! who tries to fill the server's disk through the API is refused with a `507` and stores
//! nothing more; deleting frees the quota; concurrent writes cannot pass it together; another
//! user is not affected.

use std::sync::Arc;

use base64::Engine;
use serde_json::{Value, json};

use monad_tests::TestServer;

use super::{Answer, Api, new_session, server_with};

/// Uploads `size` bytes as a `tool_output` of `session` to `workspace`, answer as it comes.
async fn upload(api: &Api, workspace: &str, session: &str, size: usize) -> Answer {
    upload_with(api, workspace, session, size, json!({})).await
}

/// [`upload`], with `metadata`.
async fn upload_with(
    api: &Api,
    workspace: &str,
    session: &str,
    size: usize,
    metadata: Value,
) -> Answer {
    api.post(
        &format!("/api/v1/workspaces/{workspace}/artifacts"),
        &json!({
            "sessionId": session,
            "artifactType": "tool_output",
            "artifactName": "out.txt",
            "contentType": "text/plain",
            "contentBase64": base64::engine::general_purpose::STANDARD.encode(vec![b'x'; size]),
            "metadata": metadata,
        }),
    )
    .await
}

/// Creates a workspace (`local` at `path`, or `general`), answer as it comes.
async fn create(api: &Api, path: Option<&str>) -> Answer {
    let body = match path {
        Some(p) => json!({"workspaceScope": "local", "localPath": p}),
        None => json!({"workspaceScope": "general"}),
    };
    api.post("/api/v1/workspaces", &body).await
}

/// A `507` with the JSON error `quota_exceeded` whose message names `what`.
fn assert_over_quota(answer: &Answer, what: &str) {
    assert_eq!(answer.status, 507, "{}", answer.text());
    let body: Value = answer.json();
    assert_eq!(body["error"], "quota_exceeded", "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains(what), "should mention `{what}`: {message}");
}

/// What an upload by [`upload`] of `size` bytes counts against its user's quota: its content,
/// and its record and metadata, which name its workspace (by an id as long as a UUID's).
fn charged(size: usize) -> u64 {
    monad_server::store::Upload {
        workspace_id: uuid::Uuid::nil().to_string(),
        task_id: None,
        step_id: None,
        name: Some("out.txt".into()),
        metadata: serde_json::Map::new(),
    }
    .charged_bytes(size as u64)
}

/// The bytes of the artifacts `api`'s user can list in `sessions`.
async fn stored_bytes(api: &Api, sessions: &[String]) -> u64 {
    let mut total = 0;
    for session in sessions {
        let mut next: Option<String> = None;
        loop {
            let path = format!("/api/v1/sessions/{session}/artifacts?limit=100");
            let answer = match &next {
                Some(t) => api.get(&format!("{path}&nextToken={t}")).await,
                None => api.get(&path).await,
            };
            if answer.status == 404 {
                break;
            }
            let page = answer.json();
            for a in page["artifacts"].as_array().unwrap() {
                total += a["size"].as_u64().unwrap();
            }
            match page.get("nextToken").and_then(Value::as_str) {
                Some(t) => next = Some(t.to_owned()),
                None => break,
            }
        }
    }
    total
}

#[tokio::test]
async fn uploads_past_the_users_byte_quota_are_refused_with_507_and_store_nothing() {
    // Room for 4,000 + 4,000 + 2,000 bytes, with their records.
    let quota = charged(4_000) * 2 + charged(2_000);
    let (server, http) = server_with(|c| c.quotas.max_artifact_bytes_per_user = quota).await;
    let ana = Api::new(http, &server.token);
    let ws = ana.workspace(Some("/big")).await;
    assert_eq!(ws.len(), 36, "a UUID: {ws}");
    let (s1, s2) = (new_session(), new_session());
    assert_eq!(upload(&ana, &ws, &s1, 4_000).await.status, 201);
    assert_eq!(upload(&ana, &ws, &s2, 4_000).await.status, 201);
    // 8,000 stored: 4,000 more would pass the quota, in any session and any workspace.
    assert_over_quota(&upload(&ana, &ws, &s1, 4_000).await, &quota.to_string());
    let other = ana.workspace(None).await;
    let s3 = new_session();
    assert_over_quota(&upload(&ana, &other, &s3, 4_000).await, "quota");
    // A history snapshot counts too: its stored JSON is larger than the room left.
    let long = "y".repeat(3_000);
    let answer = ana.snapshot(&ws, &s1, "t", &[("user", &long)]).await;
    assert_over_quota(&answer, "quota");
    assert!(
        ana.get(&format!("/api/v1/sessions/{s1}/history"))
            .await
            .json()["messages"]
            .as_array()
            .unwrap()
            .is_empty(),
        "a refused snapshot does not become the conversation"
    );
    assert_eq!(
        stored_bytes(&ana, &[s1.clone(), s2.clone(), s3.clone()]).await,
        8_000
    );
    // What is left still fits.
    assert_eq!(upload(&ana, &ws, &s2, 2_000).await.status, 201);
    assert_over_quota(&upload(&ana, &ws, &s2, 1).await, "quota");

    // Another user has a quota of their own.
    let bob = Api::new(http, &server.create_token("bob"));
    let bobs = bob.workspace(None).await;
    assert_eq!(upload(&bob, &bobs, &new_session(), 9_000).await.status, 201);

    // Deleting the workspace removes its artifacts and frees the quota.
    assert_eq!(
        ana.delete(&format!("/api/v1/workspaces/{ws}")).await.status,
        204
    );
    assert_eq!(stored_bytes(&ana, &[s1, s2]).await, 0);
    assert_eq!(upload(&ana, &other, &s3, 9_000).await.status, 201);
}

#[tokio::test]
async fn a_replaced_history_snapshot_counts_once_and_deleting_its_session_frees_it() {
    let (server, http) = server_with(|c| c.quotas.max_artifact_bytes_per_user = 20_000).await;
    let ana = Api::new(http, &server.token);
    let ws = ana.workspace(Some("/h")).await;
    let session = new_session();
    let text = "z".repeat(6_000);
    // Ten snapshots of about 6 KB: each replaces the last, so the total stays near 6 KB.
    for task in 0..10 {
        let answer = ana
            .snapshot(&ws, &session, &format!("t{task}"), &[("user", &text)])
            .await;
        assert_eq!(answer.status, 201, "{}", answer.text());
    }
    assert_eq!(upload(&ana, &ws, &new_session(), 12_000).await.status, 201);
    assert_over_quota(&upload(&ana, &ws, &new_session(), 4_000).await, "quota");
    // Deleting the session (the registry's delete, as `session delete` does) frees its bytes.
    server
        .state()
        .registry
        .delete(&session)
        .expect("the session is deleted");
    assert_eq!(upload(&ana, &ws, &new_session(), 4_000).await.status, 201);
}

#[tokio::test]
async fn workspaces_past_the_users_record_quota_are_refused_with_507_and_deleting_frees_one() {
    let (server, http) = server_with(|c| c.quotas.max_workspaces_per_user = 3).await;
    let ana = Api::new(http, &server.token);
    let local = ana.workspace(Some("/a")).await;
    let general = ana.workspace(None).await;
    // A folder attached over QUIC is a record of the user too.
    server
        .state()
        .registry
        .store()
        .resolve_record("admin", "device-1", "~/dev/monad", "lap:~/dev/monad")
        .unwrap();
    assert_over_quota(&create(&ana, None).await, "3");
    assert_over_quota(&create(&ana, Some("/b")).await, "workspace");
    // An existing local record comes back: nothing new is stored.
    let again = create(&ana, Some("/a")).await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.json()["workspaceId"], local.as_str());
    let records = server
        .state()
        .registry
        .store()
        .records(Some("admin"))
        .unwrap();
    assert_eq!(records.len(), 3, "{records:?}");

    // Another user is not affected.
    let bob = Api::new(http, &server.create_token("bob"));
    assert_eq!(create(&bob, None).await.status, 201);

    assert_eq!(
        ana.delete(&format!("/api/v1/workspaces/{general}"))
            .await
            .status,
        204
    );
    assert_eq!(create(&ana, Some("/b")).await.status, 201);
    assert_over_quota(&create(&ana, None).await, "workspace");
}

/// Many uploads at once, each fitting alone: exactly as many as the quota holds are stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_uploads_cannot_pass_the_byte_quota_together() {
    let quota = charged(3_000) * 3 + 100;
    let (server, http) = server_with(|c| c.quotas.max_artifact_bytes_per_user = quota).await;
    let api = Arc::new(Api::new(http, &server.token));
    let ws = api.workspace(Some("/race")).await;
    assert_eq!(ws.len(), 36, "a UUID: {ws}");
    let sessions: Vec<String> = (0..12).map(|_| new_session()).collect();
    let uploads: Vec<_> = sessions
        .iter()
        .map(|session| {
            let (api, ws, session) = (api.clone(), ws.clone(), session.clone());
            tokio::spawn(async move { upload(&api, &ws, &session, 3_000).await.status })
        })
        .collect();
    let mut statuses = Vec::new();
    for upload in uploads {
        statuses.push(upload.await.unwrap());
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 201).count(),
        3,
        "{statuses:?}"
    );
    assert!(
        statuses.iter().all(|s| *s == 201 || *s == 507),
        "{statuses:?}"
    );
    assert_eq!(stored_bytes(&api, &sessions).await, 9_000);
}

/// An upload's metadata (up to 64 KiB, stored with it) and its record count, not only its
/// content: before, uploads of no content with 64 KiB of metadata each counted nothing, and any
/// number of them grew the artifact index without bound.
#[tokio::test]
async fn uploads_of_no_content_count_their_metadata_and_record() {
    let (server, http) = server_with(|c| c.quotas.max_artifact_bytes_per_user = 1024 * 1024).await;
    let ana = Api::new(http, &server.token);
    let ws = ana.workspace(Some("/meta")).await;
    let metadata = json!({"notes": "m".repeat(60 * 1024)});
    let mut stored = 0;
    for _ in 0..40 {
        let answer = upload_with(&ana, &ws, &new_session(), 0, metadata.clone()).await;
        if answer.status == 507 {
            assert_over_quota(&answer, "with their record and metadata");
            break;
        }
        assert_eq!(answer.status, 201, "{}", answer.text());
        stored += 1;
    }
    assert_eq!(
        stored, 16,
        "1 MiB holds 16 uploads of 60 KiB of metadata each"
    );
    // An empty upload without metadata still counts its record.
    let (server, http) = server_with(|c| {
        c.quotas.max_artifact_bytes_per_user = charged(0) * 3;
    })
    .await;
    let ana = Api::new(http, &server.token);
    let ws = ana.workspace(None).await;
    let s = new_session();
    for _ in 0..3 {
        assert_eq!(upload(&ana, &ws, &s, 0).await.status, 201);
    }
    assert_over_quota(&upload(&ana, &ws, &s, 0).await, "quota");
}

/// Many workspace creations at once: exactly as many as the quota holds are made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creations_cannot_pass_the_workspace_quota_together() {
    let (server, http) = server_with(|c| c.quotas.max_workspaces_per_user = 4).await;
    let api = Arc::new(Api::new(http, &server.token));
    let creations: Vec<_> = (0..16)
        .map(|i| {
            let api = api.clone();
            tokio::spawn(async move {
                let path = format!("/p{i}");
                create(&api, (i % 2 == 0).then_some(path.as_str()))
                    .await
                    .status
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for creation in creations {
        statuses.push(creation.await.unwrap());
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 201).count(),
        4,
        "{statuses:?}"
    );
    let records = server
        .state()
        .registry
        .store()
        .records(Some("admin"))
        .unwrap();
    assert_eq!(records.len(), 4);
}

/// A server whose users' calls may hold 5 MiB in memory, its API as its first user, a workspace
/// of theirs and a new session id.
async fn five_mib_of_call_memory() -> (TestServer, Api, String, String) {
    let (server, http) = server_with(|c| c.quotas.max_call_bytes_per_user = 5 * 1024 * 1024).await;
    let api = Api::new(http, &server.token);
    let workspace = api.workspace(None).await;
    (server, api, workspace, new_session())
}

/// `answer` is the `429` of a request past its user's call memory, naming the key.
fn assert_over_call_memory(answer: &Answer) {
    assert_eq!(answer.status, 429, "{}", answer.text());
    assert_eq!(
        answer.json()["error"],
        "limit_exceeded",
        "{}",
        answer.text()
    );
    assert!(
        answer.text().contains("server.max_call_bytes_per_user"),
        "{}",
        answer.text()
    );
}

/// An API body counts in its user's call memory before a tree is made of it: an upload whose
/// `metadata` holds more values than any request takes is a `400`, one whose tree would take
/// the user past their bound a `429` naming the key, and one within it is stored. (A 24 MiB
/// `metadata` of small numbers became a 384 MiB tree.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_bodys_tree_is_counted_before_it_is_made() {
    let (_server, api, workspace, session) = five_mib_of_call_memory().await;
    let upload = |zeros: usize| {
        upload_with(
            &api,
            &workspace,
            &session,
            1,
            json!({"many": vec![0; zeros]}),
        )
    };
    let many = upload(1_000_001).await;
    assert_eq!(many.status, 400, "{}", many.text());
    assert!(
        many.text().contains("more than 1000000 JSON values"),
        "{}",
        many.text()
    );
    assert_over_call_memory(&upload(120_000).await);
    let fits = upload(1_000).await;
    assert_eq!(fits.status, 201, "{}", fits.text());
}

/// An upload's decoded content counts in its user's call memory beside its body: an upload whose
/// body fits the user's bound but whose body and content together do not is refused with `429`
/// naming the key, and stores nothing; a smaller one is stored. (The content, up to 16 MiB, was
/// decoded uncounted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uploads_decoded_content_counts_with_its_body() {
    const MIB: usize = 1024 * 1024;
    let (_server, api, workspace, session) = five_mib_of_call_memory().await;
    // A body of 3 MiB (the content in base64) and 2.25 MiB decoded: 5.25 MiB together.
    assert_over_call_memory(&upload(&api, &workspace, &session, 9 * MIB / 4).await);
    let listed = api
        .get(&format!("/api/v1/sessions/{session}/artifacts"))
        .await;
    assert!(
        listed.status == 404 || listed.json()["artifacts"] == json!([]),
        "{}",
        listed.text()
    );
    let fits = upload(&api, &workspace, &session, MIB).await;
    assert_eq!(fits.status, 201, "{}", fits.text());
}

/// One user's uploads whose bodies never come do not hold up another user's: the turns that
/// bound the decoding of uploads across users are taken once a body is in, not while it is
/// awaited. (Four heads without bodies, as many as `UPLOADS_AT_ONCE`, held every turn until the
/// body deadline, 60 s, and every upload queued behind them was cut off with no answer.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_whose_bodies_never_come_do_not_hold_up_another_users() {
    use tokio::io::AsyncWriteExt;
    let (server, http) = super::server().await;
    let mallory = server.create_token("mallory");
    let mut stalled = Vec::new();
    for _ in 0..monad_server::http::api::UPLOADS_AT_ONCE + 1 {
        let mut stream = tokio::net::TcpStream::connect(http)
            .await
            .expect("connects");
        let head = format!(
            "POST /api/v1/workspaces/x/artifacts HTTP/1.1\r\nHost: {http}\r\n\
             Authorization: Bearer {mallory}\r\nContent-Type: application/json\r\n\
             Content-Length: 1000000\r\n\r\n{{\"sessionId\": \"default\", "
        );
        stream.write_all(head.as_bytes()).await.expect("head sent");
        stalled.push(stream);
    }
    // Time for the server to take the heads in (and, before the fix, every turn).
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let api = Api::new(http, &server.token);
    let workspace = api.workspace(None).await;
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        upload(&api, &workspace, &new_session(), 1000),
    )
    .await
    .expect("another user's upload is answered while the stalled bodies are awaited");
    assert_eq!(answer.status, 201, "{}", answer.text());
    drop(stalled);
}

/// Answers a client asked for and does not read count in its user's call memory
/// (`server.max_call_bytes_per_user`) until they are sent, and one past the bound is `429`: a
/// user asking for a large artifact on each of their connections and reading none held them all,
/// uncounted (64 connections of 16 MiB each, past the bound that counts the same answers over
/// QUIC and MCP). Once the connections go, what they held comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_a_client_does_not_read_count_in_its_users_memory() {
    use tokio::io::AsyncWriteExt;
    const MIB: usize = 1024 * 1024;
    let (server, http) = server_with(|c| {
        c.quotas.max_call_bytes_per_user = 32 * MIB;
        c.http_limits.idle_timeout = std::time::Duration::from_secs(600);
    })
    .await;
    let api = Api::new(http, &server.token);
    let ws = api.workspace(None).await;
    let up = upload(&api, &ws, &new_session(), 12 * MIB).await;
    assert_eq!(up.status, 201, "{}", up.text());
    let id = up.json()["artifactId"].as_str().unwrap().to_owned();
    let path = format!("/api/v1/workspaces/{ws}/artifacts/{id}");
    let state = server.state().clone();
    let held_now = move || state.call_bytes_held("admin");
    let comes_true = |want: &dyn Fn(usize) -> bool| {
        let deadline = std::time::Instant::now() + monad_tests::STEP;
        while std::time::Instant::now() < deadline {
            if want(held_now()) {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        false
    };
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {http}\r\nAuthorization: Bearer {}\r\n\r\n",
        server.token
    );
    let mut unread = Vec::new();
    for n in 1..=2 {
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        socket.set_recv_buffer_size(4096).expect("a small window");
        let mut stream = socket.connect(http).await.expect("connects");
        stream.write_all(request.as_bytes()).await.expect("sent");
        unread.push(stream);
        assert!(
            comes_true(&|held| held >= n * 12 * MIB),
            "answer {n}: {} held",
            held_now()
        );
    }
    // A third would take 36 MiB: refused, saying which bound.
    let third = api.get(&path).await;
    assert_eq!(third.status, 429, "{}", third.text());
    assert!(
        third.text().contains("server.max_call_bytes_per_user"),
        "{}",
        third.text()
    );
    drop(unread);
    assert!(comes_true(&|held| held == 0), "{} held", held_now());
    let whole = api.get(&path).await;
    assert_eq!(whole.status, 200);
    assert_eq!(whole.body.len(), 12 * MIB);
}

/// The most memory a process has held (`VmHWM`), in KiB.
fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

/// Regression (memory): a history snapshot's upload read every artifact of its session into
/// memory, metadata trees and all, twice (the quota's check of the snapshot it replaces, and
/// the store's tally): 200 uploads of 64 KiB of `[0,0,...]` metadata are about 210 MB of trees,
/// and a user filling their quota so took the server down for everyone. The server now reads
/// only the snapshot's own record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_upload_reads_only_the_snapshot_it_replaces_not_every_artifact() {
    let data = tempfile::tempdir().unwrap();
    let server =
        monad_tests::ServerProcess::start_args(data.path(), &[], None, &["--http", "127.0.0.1:0"])
            .await;
    let token = server.first_token.clone().expect("a first start");
    let api = Api::new(server.http.expect("HTTP served"), &token);
    let workspace = api.workspace(None).await;
    let session = super::new_session();
    let zeros = vec![Value::from(0); 32_000];
    for _ in 0..200 {
        let answer = upload_with(&api, &workspace, &session, 1, json!({ "a": zeros })).await;
        assert_eq!(answer.status, 201, "{}", answer.text());
    }
    let before = peak_kib(server.pid());
    let answer = api
        .snapshot(&workspace, &session, "t1", &[("user", "hello")])
        .await;
    assert_eq!(answer.status, 201, "{}", answer.text());
    let grew = peak_kib(server.pid()).saturating_sub(before);
    assert!(
        grew < 64 * 1024,
        "the server's peak memory grew by {grew} KiB for one snapshot"
    );
}

/// Regression: a snapshot past what a conversation holds (8 MiB of text) was answered `507
/// quota_exceeded`, telling the uploader to clear the conversation with the command line: the
/// request itself is too large, and no room made would let it in. It is a `400` naming the
/// bound, and nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_past_what_a_conversation_holds_is_a_bad_request_naming_the_bound() {
    let (server, http) = server_with(|_| {}).await;
    let api = Api::new(http, &server.token);
    let workspace = api.workspace(None).await;
    let session = super::new_session();
    let long = "x".repeat((8 << 20) + 1);
    let answer = api
        .snapshot(&workspace, &session, "t1", &[("user", long.as_str())])
        .await;
    assert_eq!(answer.status, 400, "{}", answer.text());
    let body = answer.json();
    assert_eq!(body["error"], "bad_request", "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("8 MiB"),
        "{body}"
    );
    // Nothing stored: the session was not even made.
    let listed = api
        .get(&format!("/api/v1/sessions/{session}/artifacts"))
        .await;
    assert_eq!(listed.status, 404, "{}", listed.text());
}
