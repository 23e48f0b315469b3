//! `/api/v1`: every endpoint through a real HTTP client, each bad input, a second user who
//! must see nothing, and paging over 300 sessions.

use std::collections::HashSet;

use monad_tests::{STEP, call_in, ok, within};
use serde_json::{Value, json};

use super::{Answer, Api, many_sessions, new_session, server};
use crate::suite::pg_store::Pg;

#[tokio::test]
async fn a_local_workspace_is_one_per_path_and_a_general_one_is_new_every_time() {
    let (server, http) = server().await;
    let api = Api::new(http, &server.token);
    let first = api
        .post(
            "/api/v1/workspaces",
            &json!({"workspaceScope": "local", "localPath": "/Users/ana/demo", "tenantId": "t"}),
        )
        .await;
    assert_eq!(first.status, 201, "{}", first.text());
    let again = api
        .post(
            "/api/v1/workspaces",
            &json!({"workspaceScope": "local", "localPath": "/Users/ana/demo"}),
        )
        .await;
    assert_eq!(again.status, 200);
    assert_eq!(first.json()["workspaceId"], again.json()["workspaceId"]);
    assert_eq!(first.json()["workspaceScope"], "local");
    assert!(first.json()["createdAt"].is_string());

    let g1 = api.workspace(None).await;
    let g2 = api.workspace(None).await;
    assert_ne!(g1, g2);
    let view = api.get(&format!("/api/v1/workspaces/{g1}")).await.json();
    assert_eq!(view["workspaceScope"], "general");
    assert!(view.get("localPath").is_none());

    // A folder attached over QUIC is the same record.
    let attached = server
        .state()
        .registry
        .store()
        .resolve_record("admin", "device-1", "~/dev/monad", "lap:~/dev/monad")
        .unwrap();
    let resolved = api.workspace(Some("~/dev/monad")).await;
    assert_eq!(resolved, attached.id);
    let view = api
        .get(&format!("/api/v1/workspaces/{resolved}"))
        .await
        .json();
    assert_eq!(view["localPath"], "~/dev/monad");
    assert_eq!(view["userId"], "admin");
}

#[tokio::test]
async fn artifacts_come_back_with_their_content_type_and_list_under_their_session() {
    artifacts_come_back_with_their_content_type_and_list_under_their_session_on(None).await;
}

#[tokio::test]
async fn artifacts_come_back_with_their_content_type_and_list_under_their_session_on_postgresql_and_s3()
 {
    let Some(pg) = Pg::with_s3(
        "artifacts_come_back_with_their_content_type_and_list_under_their_session_on_postgresql_and_s3",
    ) else {
        return;
    };
    artifacts_come_back_with_their_content_type_and_list_under_their_session_on(Some(pg)).await;
}

/// The case on a backend: the filesystem (`None`) or PostgreSQL with S3.
async fn artifacts_come_back_with_their_content_type_and_list_under_their_session_on(
    pg: Option<Pg>,
) {
    let (server, http) = super::server_on(pg.clone()).await;
    let api = Api::new(http, &server.token);
    let ws = api.workspace(Some("/p")).await;
    let session = new_session();
    let output = api
        .upload(
            &ws,
            "tool_output",
            &session,
            "pytest_output.txt",
            "text/plain",
            b"pytest output",
        )
        .await;
    let diff = "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old\n+new\n";
    let diff_id = api
        .upload(
            &ws,
            "file_diff",
            &session,
            "x.diff",
            "text/x-diff",
            diff.as_bytes(),
        )
        .await;
    let got = api
        .get(&format!("/api/v1/workspaces/{ws}/artifacts/{output}"))
        .await;
    assert_eq!(got.status, 200);
    assert_eq!(got.header("content-type"), "text/plain");
    assert_eq!(got.body, b"pytest output");
    assert_eq!(got.header("x-content-type-options"), "nosniff");
    assert_eq!(got.header("cache-control"), "no-store");
    let got = api
        .get(&format!("/api/v1/sessions/{session}/artifacts/{diff_id}"))
        .await;
    assert_eq!(got.text(), diff);

    let list = api
        .get(&format!("/api/v1/sessions/{session}/artifacts"))
        .await
        .json();
    let list = list["artifacts"].as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["artifactId"], output.as_str());
    assert_eq!(list[0]["artifactType"], "tool_output");
    assert_eq!(list[0]["artifactName"], "pytest_output.txt");
    assert_eq!(list[0]["taskId"], "task_001");
    assert_eq!(list[0]["stepId"], "step_001");
    assert_eq!(list[0]["workspaceId"], ws.as_str());
    assert_eq!(list[0]["metadata"]["toolName"], "RunCommand");
    assert_eq!(list[1]["artifactType"], "file_diff");
    // On S3, each is an object under seed 004's key `{workspaceId}/{artifactId}`, with the
    // API's id (`{sessionId}.{artifactId}`: the session's own ids, such as the history
    // snapshot's, are the same in every session).
    if let Some(keys) = pg.as_ref().and_then(Pg::object_keys) {
        let mut expected = vec![format!("{ws}/{output}"), format!("{ws}/{diff_id}")];
        expected.sort();
        assert_eq!(keys, expected);
    }

    // The session exists now, and the workspace lists it.
    let s = api.get(&format!("/api/v1/sessions/{session}")).await.json();
    assert_eq!(s["sessionId"], session.as_str());
    assert!(s["workspaceIds"].as_array().unwrap().contains(&json!(ws)));
    let page = api
        .get(&format!("/api/v1/workspaces/{ws}/sessions"))
        .await
        .json();
    assert_eq!(page["sessions"][0]["sessionId"], session.as_str());
    assert!(page.get("nextToken").is_none());
    // Another workspace's id does not reach it.
    let other = api.workspace(None).await;
    assert_eq!(
        api.get(&format!("/api/v1/workspaces/{other}/artifacts/{output}"))
            .await
            .status,
        404
    );
}

#[tokio::test]
async fn a_history_snapshot_replaces_the_last_one_and_becomes_the_conversation() {
    a_history_snapshot_replaces_the_last_one_and_becomes_the_conversation_on(None).await;
}

#[tokio::test]
async fn a_history_snapshot_replaces_the_last_one_and_becomes_the_conversation_on_postgresql_and_s3()
 {
    let Some(pg) = Pg::with_s3(
        "a_history_snapshot_replaces_the_last_one_and_becomes_the_conversation_on_postgresql_and_s3",
    ) else {
        return;
    };
    a_history_snapshot_replaces_the_last_one_and_becomes_the_conversation_on(Some(pg)).await;
}

/// The case on a backend: the filesystem (`None`) or PostgreSQL with S3.
async fn a_history_snapshot_replaces_the_last_one_and_becomes_the_conversation_on(pg: Option<Pg>) {
    let (server, http) = super::server_on(pg.clone()).await;
    let api = Api::new(http, &server.token);
    let ws = api.workspace(None).await;
    let session = new_session();
    let first = api
        .snapshot(
            &ws,
            &session,
            "task_001",
            &[("system", "be brief"), ("user", "hello")],
        )
        .await;
    assert_eq!(first.status, 201, "{}", first.text());
    let second = api
        .snapshot(
            &ws,
            &session,
            "task_002",
            &[("user", "Refactor the API client"), ("assistant", "Done.")],
        )
        .await;
    assert_eq!(first.json()["artifactId"], second.json()["artifactId"]);
    let id = second.json()["artifactId"].as_str().unwrap().to_owned();
    assert_eq!(
        second.json()["artifactUri"],
        format!("workspaces/{ws}/artifacts/{id}")
    );
    let payload = api
        .get(&format!("/api/v1/workspaces/{ws}/artifacts/{id}"))
        .await;
    assert_eq!(payload.header("content-type"), "application/json");
    let payload = payload.json();
    assert_eq!(payload["snapshotAfterTaskId"], "task_002");
    assert_eq!(payload["messages"][0]["content"], "Refactor the API client");

    let history = api
        .get(&format!("/api/v1/sessions/{session}/history"))
        .await
        .json();
    let messages = history["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[1]["role"], "assistant");
    assert_eq!(messages[1]["content"], "Done.");
    let artifacts = api
        .get(&format!("/api/v1/sessions/{session}/artifacts"))
        .await
        .json();
    assert_eq!(artifacts["artifacts"].as_array().unwrap().len(), 1);
    // Two snapshots: two finished tasks in the workspace.
    let page = api
        .get(&format!("/api/v1/workspaces/{ws}/sessions"))
        .await
        .json();
    assert_eq!(page["sessions"][0]["taskCount"], 2);
    // A general workspace holds one session.
    let other = api
        .snapshot(&ws, &new_session(), "t", &[("user", "x")])
        .await;
    assert_eq!(other.status, 409, "{}", other.text());
}

/// Uploads naming different sessions, sent to one `general` workspace at the same time: one
/// session gets it, the others a `409`, never two sessions in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_uploads_to_a_general_workspace_leave_it_one_session() {
    let (server, http) = server().await;
    let api = std::sync::Arc::new(Api::new(http, &server.token));
    let ws = api.workspace(None).await;
    let uploads: Vec<_> = (0..16)
        .map(|_| {
            let (api, ws) = (api.clone(), ws.clone());
            tokio::spawn(async move {
                api.snapshot(&ws, &new_session(), "t", &[("user", "x")])
                    .await
                    .status
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for upload in uploads {
        statuses.push(upload.await.unwrap());
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 201).count(),
        1,
        "{statuses:?}"
    );
    assert!(
        statuses.iter().all(|s| *s == 201 || *s == 409),
        "{statuses:?}"
    );
    let page = api
        .get(&format!("/api/v1/workspaces/{ws}/sessions"))
        .await
        .json();
    assert_eq!(page["sessions"].as_array().unwrap().len(), 1, "{page}");
}

async fn artifact_count(api: &Api, session: &str) -> usize {
    let answer = api
        .get(&format!("/api/v1/sessions/{session}/artifacts"))
        .await;
    if answer.status == 404 {
        return 0;
    }
    answer.json()["total"].as_u64().unwrap() as usize
}

/// Regression: a session's artifacts were listed whole in one answer (every artifact's
/// metadata, up to 64 KiB each for an upload, read into memory for each listing). They page
/// as the other listings do, oldest first, with no gaps and no duplicates, and a token works
/// for its own user and session only.
#[tokio::test]
async fn a_sessions_artifacts_page_oldest_first() {
    let (server, http) = server().await;
    let api = Api::new(http, &server.token);
    let ws = api.workspace(Some("/p")).await;
    let session = new_session();
    for n in 0..25 {
        let stored = api
            .post(
                &format!("/api/v1/workspaces/{ws}/artifacts"),
                &json!({"sessionId": session, "artifactType": "tool_output",
                        "artifactName": format!("{n:02}.txt"), "contentType": "text/plain",
                        "contentBase64": "aGk="}),
            )
            .await;
        assert_eq!(stored.status, 201, "{}", stored.text());
    }
    let path = format!("/api/v1/sessions/{session}/artifacts");
    let first = api.get(&path).await.json();
    assert_eq!(first["artifacts"].as_array().unwrap().len(), 20, "{first}");
    assert_eq!(first["total"], 25);
    let mut names = Vec::new();
    let mut next: Option<String> = None;
    loop {
        let url = match &next {
            Some(t) => format!("{path}?limit=7&nextToken={t}"),
            None => format!("{path}?limit=7"),
        };
        let page = api.get(&url).await;
        assert_eq!(page.status, 200, "{}", page.text());
        let page = page.json();
        let artifacts = page["artifacts"].as_array().unwrap();
        assert!(artifacts.len() <= 7);
        names.extend(
            artifacts
                .iter()
                .map(|a| a["artifactName"].as_str().unwrap().to_owned()),
        );
        match page.get("nextToken").and_then(Value::as_str) {
            Some(t) => next = Some(t.to_owned()),
            None => break,
        }
    }
    let expected: Vec<String> = (0..25).map(|n| format!("{n:02}.txt")).collect();
    assert_eq!(names, expected);
    // A token of another session's listing, or made up, is refused.
    let other = new_session();
    for _ in 0..2 {
        let stored = api
            .post(
                &format!("/api/v1/workspaces/{ws}/artifacts"),
                &json!({"sessionId": other, "artifactType": "tool_output",
                        "artifactName": "o.txt", "contentType": "text/plain",
                        "contentBase64": "aGk="}),
            )
            .await;
        assert_eq!(stored.status, 201, "{}", stored.text());
    }
    let theirs = api
        .get(&format!("/api/v1/sessions/{other}/artifacts?limit=1"))
        .await
        .json();
    let token = theirs["nextToken"].as_str().expect("a next page");
    api.get(&format!("{path}?nextToken={token}"))
        .await
        .assert_bad("nextToken");
    api.get(&format!("{path}?nextToken=forged"))
        .await
        .assert_bad("nextToken");
    api.get(&format!("{path}?limit=0"))
        .await
        .assert_bad("limit");
    api.get(&format!("{path}?limit=101"))
        .await
        .assert_bad("limit");
}

#[tokio::test]
async fn bad_input_is_a_400_that_says_what_is_wrong_and_stores_nothing() {
    let (server, http) = server().await;
    let api = Api::new(http, &server.token);
    let ws = api.workspace(Some("/p")).await;
    let session = new_session();
    let path = format!("/api/v1/workspaces/{ws}/artifacts");
    let upload = |over: Value| {
        let mut body = json!({
            "sessionId": session, "artifactType": "tool_output", "artifactName": "o.txt",
            "contentType": "text/plain", "contentBase64": "aGk=",
        });
        for (k, v) in over.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    api.post(&path, &upload(json!({"contentBase64": "not base64!"})))
        .await
        .assert_bad("contentBase64");
    api.post(&path, &upload(json!({"artifactType": "screenshot"})))
        .await
        .assert_bad("unknown variant `screenshot`");
    api.post(&path, &upload(json!({"sessionId": "../etc"})))
        .await
        .assert_bad("sessionId");
    api.post(
        &path,
        &upload(json!({"contentType": "text/plain\r\nX-Evil: 1"})),
    )
    .await
    .assert_bad("contentType");
    api.post(&path, &upload(json!({"colour": "red"})))
        .await
        .assert_bad("unknown field `colour`");
    // Metadata past its bounds: too large, too deep.
    let large = "m".repeat(monad_server::http::api::MAX_METADATA_BYTES);
    api.post(&path, &upload(json!({"metadata": {"k": large}})))
        .await
        .assert_bad("`metadata` is");
    let mut deep = json!(1);
    for _ in 0..monad_server::http::api::MAX_METADATA_DEPTH {
        deep = json!([deep]);
    }
    api.post(&path, &upload(json!({"metadata": {"k": deep}})))
        .await
        .assert_bad("nested");
    let mut missing = upload(json!({}));
    missing.as_object_mut().unwrap().remove("artifactName");
    api.post(&path, &missing).await.assert_bad("artifactName");
    api.post_raw(&path, b"{not json".to_vec())
        .await
        .assert_bad("not valid");
    let big = vec![b'a'; monad_server::http::api::MAX_BODY + 1];
    api.post_raw(&path, big).await.assert_bad("over");
    api.post(
        &path,
        &json!({"sessionId": session, "artifactType": "session_history", "snapshotAt": "t",
                "messages": [{"role": "tool", "content": "x"}]}),
    )
    .await
    .assert_bad("unknown variant `tool`");
    api.post("/api/v1/workspaces", &json!({"workspaceScope": "local"}))
        .await
        .assert_bad("localPath");
    api.post("/api/v1/workspaces", &json!({"workspaceScope": "cloud"}))
        .await
        .assert_bad("unknown variant `cloud`");
    api.post(
        "/api/v1/workspaces",
        &json!({"workspaceScope": "general", "userId": "bob"}),
    )
    .await
    .assert_bad("userId");
    for query in ["limit=0", "limit=101", "limit=ten", "limit=-1"] {
        api.get(&format!("/api/v1/sessions?{query}"))
            .await
            .assert_bad("limit");
        api.get(&format!("/api/v1/workspaces/{ws}/sessions?{query}"))
            .await
            .assert_bad("limit");
        api.get(&format!("/api/v1/sessions/{session}/audit?{query}"))
            .await
            .assert_bad("limit");
    }
    api.get("/api/v1/sessions?nextToken=forged")
        .await
        .assert_bad("nextToken");
    // Nothing was stored: no session, no artifact, no session in the workspace.
    assert_eq!(artifact_count(&api, &session).await, 0);
    assert_eq!(
        api.get(&format!("/api/v1/sessions/{session}")).await.status,
        404
    );
    let page = api
        .get(&format!("/api/v1/workspaces/{ws}/sessions"))
        .await
        .json();
    assert_eq!(page["sessions"], json!([]));
}

/// Metadata as deep and as large as it may be is stored and read back as it was sent.
#[tokio::test]
async fn metadata_at_its_bounds_is_stored_and_read_back() {
    use monad_server::http::api::{MAX_METADATA_BYTES, MAX_METADATA_DEPTH};
    let (server, http) = server().await;
    let api = Api::new(http, &server.token);
    let ws = api.workspace(Some("/p")).await;
    let session = new_session();
    let mut deep = json!(1);
    for _ in 1..MAX_METADATA_DEPTH {
        deep = json!([deep]);
    }
    // `{"d":…,"k":"…"}`: the string fills what the rest leaves of the bound.
    let rest = serde_json::to_vec(&json!({"d": deep, "k": ""}))
        .unwrap()
        .len();
    let metadata = json!({"d": deep, "k": "m".repeat(MAX_METADATA_BYTES - rest)});
    let stored = api
        .post(
            &format!("/api/v1/workspaces/{ws}/artifacts"),
            &json!({"sessionId": session, "artifactType": "tool_output",
                    "artifactName": "o.txt", "contentType": "text/plain",
                    "contentBase64": "aGk=", "metadata": metadata}),
        )
        .await;
    assert_eq!(stored.status, 201, "{}", stored.text());
    let list = api
        .get(&format!("/api/v1/sessions/{session}/artifacts"))
        .await
        .json();
    assert_eq!(list["artifacts"][0]["metadata"], metadata);
}

/// An artifact's event carries its upload's metadata only up to 4 KiB as JSON, and says when it
/// left it out (the listing has it whole): a session's last 256 events stay in memory until
/// each follower has read them, and events of uploads of 64 KiB of metadata each held
/// gigabytes for a few followed sessions.
#[tokio::test]
async fn an_artifacts_event_leaves_out_large_metadata_and_says_so() {
    use monad_server::feed::MAX_EVENT_METADATA;
    let (server, http) = server().await;
    let api = Api::new(http, &server.token);
    let ws = api.workspace(Some("/p")).await;
    let session = new_session();
    let upload = |name: &str, metadata: Value| {
        json!({"sessionId": session, "artifactType": "tool_output", "artifactName": name,
               "contentType": "text/plain", "contentBase64": "aGk=", "metadata": metadata})
    };
    let path = format!("/api/v1/workspaces/{ws}/artifacts");
    let first = api.post(&path, &upload("a.txt", json!({}))).await;
    assert_eq!(first.status, 201, "{}", first.text());
    let (mut events, _) = Events::ready(&api, &session).await;
    let large = json!({"k": "m".repeat(MAX_EVENT_METADATA)});
    let small = json!({"k": "m".repeat(100)});
    for (name, metadata) in [("large.txt", &large), ("small.txt", &small)] {
        let stored = api.post(&path, &upload(name, metadata.clone())).await;
        assert_eq!(stored.status, 201, "{}", stored.text());
    }
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let (name, data) = events.next().await;
        if name == "artifact" {
            seen.push(data);
        }
    }
    assert_eq!(seen[0]["artifactName"], "large.txt");
    assert_eq!(seen[0].get("metadata"), None, "{}", seen[0]);
    assert_eq!(seen[0]["metadataLeftOut"], true, "{}", seen[0]);
    assert_eq!(seen[1]["artifactName"], "small.txt");
    assert_eq!(seen[1]["metadata"], small);
    assert_eq!(seen[1].get("metadataLeftOut"), None, "{}", seen[1]);
    let list = api
        .get(&format!("/api/v1/sessions/{session}/artifacts"))
        .await
        .json();
    assert_eq!(
        list["artifacts"][1]["metadata"], large,
        "the listing has it whole"
    );
    assert_eq!(list["artifacts"][1].get("metadataLeftOut"), None);
}

/// The API's and the web view's store work counts as one of its user's requests in flight
/// (`server.max_calls_per_user`, with their QUIC calls), held by the work itself: past it, `429`
/// naming the key. It was uncounted, and went on on the blocking pool every user shares after
/// its client went away, so a client that sent a request and closed, again and again, piled
/// up readings of conversations and logs without a bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_apis_store_work_counts_with_its_users_requests_in_flight() {
    let (server, http) = super::server_with(|c| c.quotas.max_calls_per_user = 1).await;
    let api = Api::new(http, &server.token);
    let agent = server.agent().await;
    let marker = server.primary_dir("default").join("started");
    let running = {
        let agent = agent.clone();
        tokio::spawn(async move {
            let argv = json!(["sh", "-c", "touch started; sleep 3"]);
            call_in(&agent, None, "run_command", json!({"argv": argv})).await
        })
    };
    within(STEP, "the command to start", async {
        while !marker.exists() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    let refused = api.get("/api/v1/sessions").await;
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(refused.json()["error"], "limit_exceeded");
    assert!(
        refused.text().contains("server.max_calls_per_user"),
        "{}",
        refused.text()
    );
    ok(within(STEP, "the command", running).await.unwrap());
    let listed = api.get("/api/v1/sessions").await;
    assert_eq!(listed.status, 200, "{}", listed.text());
}

#[tokio::test]
async fn requests_without_a_valid_token_are_401() {
    let (server, http) = server().await;
    let nobody = Api::new(http, "not-a-token");
    let answer = nobody.get("/api/v1/sessions").await;
    assert_eq!(answer.status, 401);
    assert_eq!(answer.json()["error"], "unauthorized");
    let bare = super::http_client()
        .get(format!("http://{http}/api/v1/sessions"))
        .send()
        .await
        .unwrap();
    assert_eq!(bare.status().as_u16(), 401);
    assert!(bare.headers().contains_key("www-authenticate"));
    // A refused request does not keep its connection, even one a token authenticated before
    // (then revoked, say): the server closes it after the answer, though the request asked to
    // keep it open.
    let token = server.token.clone();
    let closed = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(http).unwrap();
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        stream
            .write_all(
                format!(
                    "GET /api/v1/sessions HTTP/1.1\r\nHost: {http}\r\n\
                     Authorization: Bearer {token}\r\n\r\n\
                     GET /api/v1/sessions HTTP/1.1\r\nHost: {http}\r\n\
                     Authorization: Bearer nope\r\n\r\n"
                )
                .as_bytes(),
            )
            .unwrap();
        let mut answer = Vec::new();
        let read = stream.read_to_end(&mut answer);
        (
            read.map_err(|e| e.kind()),
            String::from_utf8_lossy(&answer).into_owned(),
        )
    })
    .await
    .unwrap();
    let refused = closed.1.split("HTTP/1.1 401").nth(1);
    assert!(closed.1.starts_with("HTTP/1.1 200"), "{}", closed.1);
    assert!(
        refused.is_some_and(|r| r.to_lowercase().contains("connection: close")),
        "{}",
        closed.1
    );
    assert!(
        closed.0.is_ok(),
        "the connection stayed open: {:?}",
        closed.0
    );
    drop(server);
}

#[tokio::test]
async fn a_second_user_sees_nothing_of_the_first_and_their_ids_answer_404() {
    let (server, http) = server().await;
    let ana = Api::new(http, &server.token);
    let bob = Api::new(http, &server.create_token("bob"));
    let ws = ana.workspace(Some("/secret")).await;
    let session = new_session();
    let art = ana
        .upload(
            &ws,
            "tool_output",
            &session,
            "o.txt",
            "text/plain",
            b"secret",
        )
        .await;
    ana.snapshot(&ws, &session, "t1", &[("user", "secret plan")])
        .await;
    for extra in 0..3 {
        let _ = extra;
        ana.upload(
            &ws,
            "tool_output",
            &new_session(),
            "o.txt",
            "text/plain",
            b"x",
        )
        .await;
    }
    let bob_ws = bob.workspace(Some("/secret")).await;
    assert_ne!(
        bob_ws, ws,
        "the same path of another user is another workspace"
    );

    for path in [
        format!("/api/v1/workspaces/{ws}"),
        format!("/api/v1/workspaces/{ws}/sessions"),
        format!("/api/v1/workspaces/{ws}/artifacts/{art}"),
        format!("/api/v1/sessions/{session}"),
        format!("/api/v1/sessions/{session}/history"),
        format!("/api/v1/sessions/{session}/artifacts"),
        format!("/api/v1/sessions/{session}/artifacts/{art}"),
        format!("/api/v1/sessions/{session}/audit"),
        format!("/api/v1/sessions/{session}/events"),
        format!("/api/v1/workspaces/{bob_ws}/artifacts/{art}"),
    ] {
        let answer = bob.get(&path).await;
        assert_eq!(answer.status, 404, "{path}: {}", answer.text());
        assert_eq!(answer.json()["error"], "not_found");
        assert!(!answer.text().contains("secret"));
    }
    assert_eq!(
        bob.delete(&format!("/api/v1/workspaces/{ws}")).await.status,
        404
    );
    // Uploading into ana's workspace, or into ana's session through bob's own workspace.
    let into_hers = bob
        .post(
            &format!("/api/v1/workspaces/{ws}/artifacts"),
            &json!({"sessionId": new_session(), "artifactType": "tool_output", "artifactName": "x",
                    "contentType": "text/plain", "contentBase64": "eA=="}),
        )
        .await;
    assert_eq!(into_hers.status, 404);
    let into_her_session = bob
        .snapshot(&bob_ws, &session, "t", &[("user", "overwrite")])
        .await;
    assert_eq!(into_her_session.status, 404, "{}", into_her_session.text());
    // Bob's lists are empty of hers; her page token is no good to him.
    let list = bob.get("/api/v1/sessions").await.json();
    assert_eq!(list["sessions"], json!([]));
    let hers = ana.get("/api/v1/sessions?limit=1").await.json();
    let token = hers["nextToken"]
        .as_str()
        .expect("ana has more than one session");
    bob.get(&format!("/api/v1/sessions?nextToken={token}"))
        .await
        .assert_bad("nextToken");
    // And nothing of hers changed.
    let history = ana
        .get(&format!("/api/v1/sessions/{session}/history"))
        .await
        .json();
    assert_eq!(history["messages"][0]["content"], "secret plan");
    assert_eq!(
        ana.get(&format!("/api/v1/workspaces/{ws}")).await.status,
        200
    );
}

/// `default` names the caller's own default session, as over QUIC: a second user naming it got
/// a 404 (or over `/mcp`, "belongs to another user") because the first user's `default` was
/// taken for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_names_each_users_own_session() {
    let (server, http) = server().await;
    let ana = Api::new(http, &server.token);
    let bob = Api::new(http, &server.create_token("bob"));
    // An upload into `default`, in a workspace of its own; "YW5h" and "Ym9i" are "ana" and
    // "bob" in base64.
    let into_default = async |api: &Api, path: &str, content: &str| {
        let ws = api.workspace(Some(path)).await;
        let body = json!({"sessionId": "default", "artifactType": "tool_output",
                          "artifactName": "o.txt", "contentType": "text/plain",
                          "contentBase64": content});
        let stored = api
            .post(&format!("/api/v1/workspaces/{ws}/artifacts"), &body)
            .await;
        assert_eq!(stored.status, 201, "{}", stored.text());
    };
    into_default(&ana, "/a", "YW5h").await;
    // Bob has no default yet: his `default` is not found, and it is not hers.
    let none = bob.get("/api/v1/sessions/default").await;
    assert_eq!(none.status, 404, "{}", none.text());
    // An upload into `default` that is refused (a `general` workspace holds another session)
    // makes him none either: a refused request stores nothing.
    let general = bob.workspace(None).await;
    bob.upload(
        &general,
        "tool_output",
        &new_session(),
        "x.txt",
        "text/plain",
        b"x",
    )
    .await;
    let body = json!({"sessionId": "default", "artifactType": "tool_output",
                      "artifactName": "o.txt", "contentType": "text/plain",
                      "contentBase64": "Ym9i"});
    let refused = bob
        .post(&format!("/api/v1/workspaces/{general}/artifacts"), &body)
        .await;
    assert_eq!(refused.status, 409, "{}", refused.text());
    let none = bob.get("/api/v1/sessions/default").await;
    assert_eq!(
        none.status,
        404,
        "a refused upload made him a default: {}",
        none.text()
    );
    // A session whose metadata is corrupt is not found either, without the server's paths.
    let corrupt = new_session();
    let dir = server.data_dir().join("sessions").join(&corrupt);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("session.toml"), "not = [toml").unwrap();
    let mut into_corrupt = body.clone();
    into_corrupt["sessionId"] = corrupt.clone().into();
    let ws = bob.workspace(Some("/c")).await;
    let refused = bob
        .post(&format!("/api/v1/workspaces/{ws}/artifacts"), &into_corrupt)
        .await;
    assert_eq!(refused.status, 404, "{}", refused.text());
    assert!(
        !refused
            .text()
            .contains(&server.data_dir().display().to_string()),
        "{}",
        refused.text()
    );
    into_default(&bob, "/b", "Ym9i").await;
    let his_default = bob.get("/api/v1/sessions/default").await;
    assert_eq!(his_default.status, 200, "{}", his_default.text());
    let his_id = his_default.json()["sessionId"].as_str().unwrap().to_owned();
    assert_ne!(his_id, "default", "the well-known one is ana's");
    let artifacts = bob.get("/api/v1/sessions/default/artifacts").await;
    assert_eq!(artifacts.status, 200, "{}", artifacts.text());
    assert_eq!(
        artifacts.json()["artifacts"].as_array().map(Vec::len),
        Some(1)
    );
    // Hers is untouched and still hers.
    let her_default = ana.get("/api/v1/sessions/default").await.json();
    assert_eq!(her_default["sessionId"], "default");
    let her_artifacts = ana.get("/api/v1/sessions/default/artifacts").await.json();
    assert_eq!(her_artifacts["artifacts"].as_array().map(Vec::len), Some(1));
}

/// Every session id of a listing, page by page with `limit`, checking the order as it goes.
async fn page_all(api: &Api, path: &str, limit: usize) -> Vec<String> {
    let mut ids = Vec::new();
    let mut next: Option<String> = None;
    let mut last: Option<(String, String)> = None;
    loop {
        let url = match &next {
            Some(t) => format!("{path}?limit={limit}&nextToken={t}"),
            None => format!("{path}?limit={limit}"),
        };
        let page: Answer = api.get(&url).await;
        assert_eq!(page.status, 200, "{}", page.text());
        let page = page.json();
        let sessions = page["sessions"].as_array().unwrap();
        assert!(sessions.len() <= limit);
        for s in sessions {
            let key = (
                s["lastTaskAt"].as_str().unwrap().to_owned(),
                s["sessionId"].as_str().unwrap().to_owned(),
            );
            if let Some(prev) = &last {
                // Most recent first; ties by id.
                assert!(
                    prev.0 > key.0 || (prev.0 == key.0 && prev.1 < key.1),
                    "out of order: {prev:?} then {key:?}"
                );
            }
            last = Some(key.clone());
            ids.push(key.1);
        }
        match page.get("nextToken").and_then(Value::as_str) {
            Some(t) => {
                assert!(!sessions.is_empty());
                next = Some(t.to_owned());
            }
            None => return ids,
        }
    }
}

#[tokio::test]
async fn three_hundred_sessions_page_with_no_gaps_and_no_duplicates() {
    three_hundred_sessions_page(None).await;
}

#[tokio::test]
async fn three_hundred_sessions_page_with_no_gaps_and_no_duplicates_on_postgresql() {
    let Some(pg) =
        Pg::alone("three_hundred_sessions_page_with_no_gaps_and_no_duplicates_on_postgresql")
    else {
        return;
    };
    three_hundred_sessions_page(Some(pg)).await;
}

/// Paging over 300 sessions on a backend: the filesystem (`None`) or PostgreSQL.
async fn three_hundred_sessions_page(pg: Option<Pg>) {
    let (server, http) = super::server_on(pg).await;
    let api = Api::new(http, &server.token);
    let made = many_sessions(&server, "admin", 300);
    // Another user's sessions never show up.
    many_sessions(&server, "bob", 10);
    let listed = page_all(&api, "/api/v1/sessions", 7).await;
    assert_eq!(listed.len(), 300);
    let unique: HashSet<&String> = listed.iter().collect();
    assert_eq!(unique.len(), 300, "duplicates");
    assert_eq!(unique, made.iter().collect::<HashSet<_>>(), "gaps");

    // The same over a workspace's sessions.
    let ws = api.workspace(Some("/many")).await;
    let store = server.state().registry.store();
    for id in &made {
        store.touch_record(&ws, id, 1).unwrap();
    }
    let listed = page_all(&api, &format!("/api/v1/workspaces/{ws}/sessions"), 13).await;
    assert_eq!(listed.len(), 300);
    assert_eq!(
        listed.iter().collect::<HashSet<_>>(),
        made.iter().collect::<HashSet<_>>()
    );
    // Default page size, and a token is only given while more pages exist.
    let first = api.get("/api/v1/sessions").await.json();
    assert_eq!(first["sessions"].as_array().unwrap().len(), 20);
    let all = api.get("/api/v1/sessions?limit=100").await.json();
    assert!(all["nextToken"].is_string());
}

#[tokio::test]
async fn deleting_a_workspace_removes_its_artifacts_and_history() {
    deleting_a_workspace_removes_its_artifacts_and_history_on(None).await;
}

#[tokio::test]
async fn deleting_a_workspace_removes_its_artifacts_and_history_on_postgresql_and_s3() {
    let Some(pg) =
        Pg::with_s3("deleting_a_workspace_removes_its_artifacts_and_history_on_postgresql_and_s3")
    else {
        return;
    };
    deleting_a_workspace_removes_its_artifacts_and_history_on(Some(pg)).await;
}

/// A workspace delete that stops part of the way (a crash; here the session's directory made
/// immutable, which binds root too, so its conversation cannot be cleared) and is retried
/// clears the conversation: the artifacts that say the session took the workspace's
/// conversation went first, and the retry answered 204 leaving the conversation.
#[tokio::test]
async fn a_workspace_delete_retried_after_it_stopped_part_way_clears_the_conversation() {
    let (server, http) = super::server_on(None).await;
    let api = Api::new(http, &server.token);
    let ws = api.workspace(None).await;
    let session = new_session();
    api.snapshot(
        &ws,
        &session,
        "t",
        &[("user", "from the deleted workspace")],
    )
    .await;
    let dir = server.data_dir().join("sessions").join(&session);
    let chattr = |flag: &str| {
        std::process::Command::new("chattr")
            .arg(flag)
            .arg(&dir)
            .status()
            .unwrap()
            .success()
    };
    assert!(
        chattr("+i"),
        "this test sets the immutable flag (root, on ext4 or the like)"
    );
    let stopped = api.delete(&format!("/api/v1/workspaces/{ws}")).await;
    assert!(chattr("-i"));
    assert_eq!(stopped.status, 500, "{}", stopped.text());
    let retried = api.delete(&format!("/api/v1/workspaces/{ws}")).await;
    assert_eq!(retried.status, 204, "{}", retried.text());
    let history = api
        .get(&format!("/api/v1/sessions/{session}/history"))
        .await
        .json();
    assert_eq!(history["messages"], json!([]));
    assert_eq!(artifact_count(&api, &session).await, 0);
}

/// The case on a backend: the filesystem (`None`) or PostgreSQL with S3.
async fn deleting_a_workspace_removes_its_artifacts_and_history_on(pg: Option<Pg>) {
    let (server, http) = super::server_on(pg.clone()).await;
    let api = Api::new(http, &server.token);
    let ws = api.workspace(None).await;
    let session = new_session();
    let out = api
        .upload(&ws, "tool_output", &session, "o.txt", "text/plain", b"x")
        .await;
    let snap = api
        .snapshot(&ws, &session, "t", &[("user", "hi")])
        .await
        .json();
    let snap = snap["artifactId"].as_str().unwrap();
    let deleted = api.delete(&format!("/api/v1/workspaces/{ws}")).await;
    assert_eq!(deleted.status, 204, "{}", deleted.text());
    assert_eq!(
        api.get(&format!("/api/v1/workspaces/{ws}")).await.status,
        404
    );
    for art in [out.as_str(), snap] {
        assert_eq!(
            api.get(&format!("/api/v1/sessions/{session}/artifacts/{art}"))
                .await
                .status,
            404
        );
    }
    assert_eq!(artifact_count(&api, &session).await, 0);
    let history = api
        .get(&format!("/api/v1/sessions/{session}/history"))
        .await
        .json();
    assert_eq!(history["messages"], json!([]));
    assert_eq!(
        api.delete(&format!("/api/v1/workspaces/{ws}")).await.status,
        404
    );
    // Its objects went with it.
    if let Some(keys) = pg.as_ref().and_then(Pg::object_keys) {
        assert_eq!(keys, Vec::<String>::new());
    }
}

/// Server-sent events read from a response, one at a time.
struct Events {
    response: reqwest::Response,
    buffer: String,
}

impl Events {
    /// [`Events::open`], and its first event, `ready`, taken: the stream and what `ready` said.
    async fn ready(api: &Api, session: &str) -> (Events, Value) {
        let mut events = Events::open(api, session).await;
        let (name, ready) = events.next().await;
        assert_eq!(name, "ready", "{ready}");
        (events, ready)
    }

    async fn open(api: &Api, session: &str) -> Events {
        let response = api
            .client
            .get(format!("{}/api/v1/sessions/{session}/events", api.base))
            .bearer_auth(&api.token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        assert!(
            response.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        Events {
            response,
            buffer: String::new(),
        }
    }

    /// Every event until the server ends the stream (bounded by [`STEP`]).
    async fn until_the_end(&mut self) -> Vec<(String, Value)> {
        within(STEP, "the stream to end", async {
            let mut all = Vec::new();
            loop {
                while let Some(end) = self.buffer.find("\n\n") {
                    let block: String = self.buffer.drain(..end + 2).collect();
                    let name = block.lines().find_map(|l| l.strip_prefix("event:"));
                    let data: String = block
                        .lines()
                        .filter_map(|l| l.strip_prefix("data:"))
                        .map(str::trim_start)
                        .collect();
                    if let Some(name) = name {
                        all.push((name.trim().to_owned(), serde_json::from_str(&data).unwrap()));
                    }
                }
                match self.response.chunk().await {
                    Ok(Some(chunk)) => self.buffer.push_str(&String::from_utf8_lossy(&chunk)),
                    Ok(None) | Err(_) => return all,
                }
            }
        })
        .await
    }

    /// The next event's name and data (keep-alive comments skipped).
    async fn next(&mut self) -> (String, Value) {
        within(STEP, "an event", async {
            loop {
                if let Some(end) = self.buffer.find("\n\n") {
                    let block: String = self.buffer.drain(..end + 2).collect();
                    let mut name = String::new();
                    let mut data = String::new();
                    for line in block.lines() {
                        if let Some(v) = line.strip_prefix("event:") {
                            name = v.trim().to_owned();
                        } else if let Some(v) = line.strip_prefix("data:") {
                            data.push_str(v.trim_start());
                        }
                    }
                    if !name.is_empty() {
                        return (name, serde_json::from_str(&data).unwrap());
                    }
                    continue;
                }
                let chunk = self
                    .response
                    .chunk()
                    .await
                    .unwrap()
                    .expect("the stream stays open");
                self.buffer.push_str(&String::from_utf8_lossy(&chunk));
            }
        })
        .await
    }
}

/// A new session with one call of `tool` made in it by `agent`, its audit line written (a stream
/// opened after it starts past it); its id.
async fn session_after_a_call(
    server: &monad_tests::TestServer,
    agent: &monad_client::agent::Agent,
    tool: &str,
    args: Value,
) -> String {
    let session = new_session();
    ok(call_in(agent, Some(&session), tool, args).await);
    server.audit_lines(&session, 1).await;
    session
}

#[tokio::test]
async fn the_audit_log_pages_and_the_event_stream_follows_calls_as_they_happen() {
    let (server, http) = server().await;
    let api = Api::new(http, &server.token);
    let agent = server.agent().await;
    let session = session_after_a_call(
        &server,
        &agent,
        "write_file",
        json!({"path": "a.txt", "content": "1"}),
    )
    .await;
    let (mut events, ready) = Events::ready(&api, &session).await;
    assert_eq!(ready["sessionId"], session.as_str());
    for i in 0..4 {
        ok(call_in(
            &agent,
            Some(&session),
            "write_file",
            json!({"path": format!("f{i}.txt"), "content": "x"}),
        )
        .await);
    }
    let mut calls = Vec::new();
    while calls.len() < 4 {
        let (name, data) = events.next().await;
        // The first call's line may be announced after the stream opened, since the log's
        // line is readable a moment before the store announces it.
        if name == "call" && data["target"] != "a.txt" {
            calls.push(data);
        }
    }
    assert_eq!(calls[0]["tool"], "write_file");
    assert_eq!(calls[0]["target"], "f0.txt");
    assert_eq!(calls[0]["decision"], "allowed");
    assert_eq!(calls[0]["decidedBy"], "trust");
    assert_eq!(calls[0]["outcome"], "ok");
    assert_eq!(calls[0]["workspace"], "primary");

    let page = api
        .get(&format!("/api/v1/sessions/{session}/audit?limit=2"))
        .await
        .json();
    assert_eq!(page["total"], 5);
    assert_eq!(page["records"].as_array().unwrap().len(), 2);
    assert_eq!(page["records"][0]["target"], "a.txt");
    let token = page["nextToken"].as_str().unwrap();
    let rest = api
        .get(&format!(
            "/api/v1/sessions/{session}/audit?limit=10&nextToken={token}"
        ))
        .await
        .json();
    assert_eq!(rest["records"].as_array().unwrap().len(), 3);
    assert!(rest.get("nextToken").is_none());
    // A token of another session's log is refused.
    let other = new_session();
    ok(call_in(&agent, Some(&other), "list_dir", json!({})).await);
    api.get(&format!("/api/v1/sessions/{other}/audit?nextToken={token}"))
        .await
        .assert_bad("nextToken");

    let s = api.get(&format!("/api/v1/sessions/{session}")).await.json();
    assert_eq!(s["taskCount"], 5);
    assert_eq!(s["workspaces"][0]["name"], "primary");
    // The diff of each write is an artifact of its call.
    let artifacts = api
        .get(&format!("/api/v1/sessions/{session}/artifacts"))
        .await
        .json();
    assert!(
        artifacts["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["artifactType"] == "file_diff" && a["tool"] == "write_file")
    );
}

/// A message appended is followed with its first 16 KiB: a follower that stops reading keeps
/// a session's last events in the server, and a message may be megabytes. The event says how
/// much was cut off; the conversation has it whole.
#[tokio::test]
async fn a_long_message_is_followed_by_its_start_and_read_whole_from_the_conversation() {
    use monad_protocol::wire::{HistoryMessage, HistoryRole};
    let (server, http) = server().await;
    let api = Api::new(http, &server.token);
    let agent = server.agent().await;
    let session = new_session();
    let append = |text: String| {
        let message = HistoryMessage {
            role: HistoryRole::User,
            text,
        };
        within(
            STEP,
            "the append",
            agent.history_append(Some(&session), message),
        )
    };
    // The session is made by its first message; then it can be followed.
    append("first".to_owned()).await.unwrap();
    let (mut events, _) = Events::ready(&api, &session).await;
    // Cut inside a character: the event keeps whole characters only.
    let text = format!("{}é{}", "a".repeat(16 * 1024 - 1), "b".repeat(2_000_000));
    for text in [text.clone(), "short".to_owned()] {
        append(text).await.unwrap();
    }
    let (name, long) = events.next().await;
    assert_eq!(name, "message");
    let content = long["content"].as_str().unwrap();
    assert_eq!(content, &text[..16 * 1024 - 1]);
    assert_eq!(long["contentLeftOut"], text.len() - content.len());
    let (_, short) = events.next().await;
    assert_eq!(short["content"], "short");
    assert!(short.get("contentLeftOut").is_none(), "{short}");
    let history = api
        .get(&format!("/api/v1/sessions/{session}/history"))
        .await
        .json();
    assert_eq!(history["messages"][1]["content"], text.as_str());
}

/// A call with a long command line is followed with its target's first 4 KiB, the same
/// in its steps and its record (so a follower matches them); the audit log has its first 64 KiB,
/// how many bytes more and the hash of the whole.
#[tokio::test]
async fn a_long_target_is_followed_by_its_start_the_same_in_steps_and_record() {
    let (server, http) = server().await;
    let api = Api::new(http, &server.token);
    let agent = server.agent().await;
    let session =
        session_after_a_call(&server, &agent, "run_command", json!({"argv": ["true"]})).await;
    let (mut events, _) = Events::ready(&api, &session).await;
    let long = "x".repeat(100_000);
    ok(call_in(
        &agent,
        Some(&session),
        "run_command",
        json!({"argv": ["true", long]}),
    )
    .await);
    // The first call's line may be announced after the stream opened, since the log's line is
    // readable a moment before the store announces it.
    let (name, started) = loop {
        let (name, data) = next_call_event(&mut events).await;
        if !(name == "call" && data["target"] == "true") {
            break (name, data);
        }
    };
    assert_eq!(name, "call_started");
    let target = started["target"].as_str().unwrap().to_owned();
    assert!(target.len() < 4200, "{}", target.len());
    assert!(target.starts_with("true xxxx"), "{target:.40}");
    assert!(
        target.ends_with("bytes more)"),
        "{}",
        &target[target.len() - 40..]
    );
    let record = loop {
        let (name, data) = next_call_event(&mut events).await;
        if name == "call" {
            break data;
        }
    };
    assert_eq!(record["target"], target.as_str());
    let audit = api
        .get(&format!("/api/v1/sessions/{session}/audit"))
        .await
        .json();
    // The audit log keeps its first 64 KiB, how much more it had and the hash of the whole.
    let kept = audit["records"][1]["target"].as_str().unwrap_or_default();
    let whole = format!("true {long}");
    assert!(kept.starts_with(&whole[..64 * 1024]), "{}", &kept[..40]);
    assert!(
        kept.ends_with(&format!(
            " ({} bytes more; SHA-256 of the whole: {})",
            whole.len() - 64 * 1024,
            monad_server::auth::sha256_hex(whole.as_bytes())
        )),
        "{}",
        &kept[64 * 1024..]
    );
}

/// The next event whose name starts with `call` (calls in progress and records), others
/// (artifacts, messages) skipped.
async fn next_call_event(events: &mut Events) -> (String, Value) {
    loop {
        let (name, data) = events.next().await;
        if name.starts_with("call") {
            return (name, data);
        }
    }
}

/// A call to a restricted folder is followed as it goes: it starts (routed to the folder), waits
/// for the owner's decision before the owner answers, is decided by the owner, ends, and its
/// record follows with the same time, tool and target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_for_approval_is_followed_from_its_start_to_its_record() {
    let (server, http) = server().await;
    let api = Api::new(http, &server.token);
    let (_dir, attached, mut questions) =
        super::gated_folder(&server, &[("notes.txt", "x\n")]).await;
    let session = attached.session.clone();
    let agent = server.agent().await;
    let (mut events, _) = Events::ready(&api, &session).await;

    let call = call_in(
        &agent,
        Some(&session),
        "read_file",
        json!({"path": "notes.txt", "workspace": "lap"}),
    );
    let follow = async {
        let (name, started) = next_call_event(&mut events).await;
        assert_eq!(name, "call_started", "{started}");
        assert_eq!(started["tool"], "read_file");
        assert_eq!(started["workspace"], "lap");
        assert_eq!(started["target"], "notes.txt");
        let live = started["liveId"].clone();
        let (name, waiting) = next_call_event(&mut events).await;
        assert_eq!(name, "call_waiting", "{waiting}");
        assert_eq!(waiting["liveId"], live);
        assert_eq!(waiting["workspace"], "lap");
        // Pending, and the owner has not answered yet: now they do.
        let (question, answer) = within(STEP, "the owner to be asked", questions.recv())
            .await
            .expect("asked");
        assert_eq!(question.target, "notes.txt");
        answer
            .send(monad_client::approval::Decision::AllowOnce)
            .unwrap();
        let (name, decided) = next_call_event(&mut events).await;
        assert_eq!(name, "call_decided", "{decided}");
        assert_eq!(decided["liveId"], live);
        assert_eq!(decided["decidedBy"], "user");
        assert_eq!(decided["allowed"], true);
        let (name, ended) = next_call_event(&mut events).await;
        assert_eq!(name, "call_ended", "{ended}");
        assert_eq!(ended["liveId"], live);
        let (name, record) = next_call_event(&mut events).await;
        assert_eq!(name, "call", "{record}");
        assert_eq!(record["time"], started["time"]);
        assert_eq!(record["tool"], "read_file");
        assert_eq!(record["target"], "notes.txt");
        assert_eq!(record["decidedBy"], "user");
        assert_eq!(record["outcome"], "ok");
    };
    let (reply, ()) = tokio::join!(call, follow);
    let (result, ran_in) = ok(reply);
    assert_eq!(
        (result["content"].as_str(), ran_in.as_str()),
        (Some("x\n"), "lap")
    );
}

/// A stream is authorized when it opens, but it must not outlive its access: a revoked token's
/// stream ends before the next event, and a deleted session's stream ends too (its id may be
/// taken by another user's new session).
#[tokio::test]
async fn an_event_stream_ends_when_its_token_is_revoked_or_its_session_deleted() {
    let (server, http) = server().await;
    let agent = server.agent().await;
    let session = session_after_a_call(
        &server,
        &agent,
        "write_file",
        json!({"path": "a.txt", "content": "1"}),
    )
    .await;

    // A second token of the same user watches; then it is revoked.
    let watcher = server.create_token("admin");
    let id = watcher.split('_').nth(1).unwrap().to_owned();
    let (mut events, _) = Events::ready(&Api::new(http, &watcher), &session).await;
    assert!(server.state().tokens.revoke(&id).unwrap());
    ok(call_in(
        &agent,
        Some(&session),
        "write_file",
        json!({"path": "after-revoke.txt", "content": "2"}),
    )
    .await);
    let after = events.until_the_end().await;
    assert!(
        after.iter().all(|(name, _)| name != "call"),
        "a revoked token still saw: {after:?}"
    );

    // The session is deleted while a valid token watches it: the stream ends. (The write
    // above is recorded first: its line, written by the recorder a few milliseconds after the
    // answer, would otherwise reach the new stream, which is no part of what is tested.)
    if let Some(recorder) = &server.state().executor.recorder {
        recorder.flush();
    }
    let api = Api::new(http, &server.token);
    let (mut events, _) = Events::ready(&api, &session).await;
    drop(agent);
    // Deletable once the server has seen the agent go (a session in use is not deleted).
    let deadline = tokio::time::Instant::now() + STEP;
    while let Err(e) = server.state().registry.delete(&session) {
        assert!(tokio::time::Instant::now() < deadline, "not deleted: {e}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let after = events.until_the_end().await;
    assert!(after.iter().all(|(name, _)| name != "call"), "{after:?}");
    // Nobody follows the session any more: its channel is gone.
    let deadline = tokio::time::Instant::now() + STEP;
    while server.state().feed.channels() != 0 {
        assert!(tokio::time::Instant::now() < deadline, "a channel was left");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A stream that follows `default` ends when the well-known `default` is no longer its user's,
/// even when they have a default of their own to fall back on: it never goes on to deliver
/// another user's `default`. (The stream's recheck resolved `default` again, found the user's own
/// default session and let the stream follow the well-known one, now another user's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_on_default_ends_when_default_becomes_another_users() {
    let (server, http) = server().await;
    let ana = Api::new(http, &server.token);
    let bob = Api::new(http, &server.create_token("bob"));
    let into_default = async |api: &Api| {
        let ws = api.workspace(None).await;
        api.upload(&ws, "tool_output", "default", "o.txt", "text/plain", b"x")
            .await
    };
    // Ana holds the well-known `default`; Bob gets one of his own, kept as his default.
    into_default(&ana).await;
    into_default(&bob).await;
    let his_own = bob.get("/api/v1/sessions/default").await.json()["sessionId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(his_own, "default");
    // Ana's `default` goes; Bob's next use of `default` takes the well-known one, and he watches it.
    server.state().registry.delete("default").unwrap();
    into_default(&bob).await;
    let (mut events, _) = Events::ready(&bob, "default").await;
    // His goes too, and Ana takes it again: his stream must end rather than follow hers.
    server.state().registry.delete("default").unwrap();
    into_default(&ana).await;
    let after = events.until_the_end().await;
    assert!(
        after.iter().all(|(name, _)| name == "ready"),
        "Bob saw Ana's `default`: {after:?}"
    );
}

/// Every API error is JSON, those axum makes too: a method a path does not take (a `405` that
/// still says which it takes) and a path that is not UTF-8. (Both were plain text or empty.)
#[tokio::test]
async fn a_wrong_method_or_a_path_that_is_not_utf8_is_answered_in_json() {
    let (server, http) = server().await;
    let api = Api::new(http, &server.token);
    let wrong = api.get("/api/v1/workspaces").await;
    assert_eq!(wrong.status, 405, "{}", wrong.text());
    assert_eq!(
        wrong.json()["error"],
        "method_not_allowed",
        "{}",
        wrong.text()
    );
    assert!(
        wrong.header("allow").contains("POST"),
        "{:?}",
        wrong.headers
    );
    assert!(
        wrong.json()["message"]
            .as_str()
            .unwrap()
            .contains("`Allow`"),
        "{}",
        wrong.text()
    );
    let wrong = api.delete("/api/v1/sessions").await;
    assert_eq!(wrong.status, 405, "{}", wrong.text());
    assert_eq!(
        wrong.json()["error"],
        "method_not_allowed",
        "{}",
        wrong.text()
    );
    let odd = api.get("/api/v1/workspaces/%FF").await;
    odd.assert_bad("path");
    // The web view's pages are not the API: they keep their own answers.
    let page = api.delete("/").await;
    assert_eq!(page.status, 405);
}

#[tokio::test]
async fn the_openapi_document_is_generated_from_the_types_and_covers_every_path() {
    let (server, http) = server().await;
    let api = Api::new(http, &server.token);
    let doc = api.get("/api/v1/openapi.json").await.json();
    assert_eq!(doc, monad_server::http::openapi::document());
    assert_eq!(doc["openapi"], "3.0.3");
    for path in [
        "/api/v1/workspaces",
        "/api/v1/workspaces/{id}",
        "/api/v1/workspaces/{id}/artifacts",
        "/api/v1/workspaces/{id}/artifacts/{artifactId}",
        "/api/v1/workspaces/{id}/sessions",
        "/api/v1/sessions",
        "/api/v1/sessions/{id}",
        "/api/v1/sessions/{id}/history",
        "/api/v1/sessions/{id}/artifacts",
        "/api/v1/sessions/{id}/audit",
        "/api/v1/sessions/{id}/events",
    ] {
        assert!(doc["paths"].get(path).is_some(), "{path} missing");
    }
    let upload = &doc["components"]["schemas"]["UploadArtifact"];
    assert!(upload.to_string().contains("session_history"));
    assert_eq!(api.get("/api/v1/nothing/here").await.status, 404);
}

/// One user's requests working on the store take turns apart from their calls
/// (`server.max_store_work_per_user` at once; the next waits for one to end), while another
/// user's are served. Bounded only with their calls (256 in flight), one user's reads of a slow
/// table could take half the blocking threads, and every connection of the store's pool, and
/// everyone else's store work waited behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_users_store_work_takes_turns_apart_from_their_calls() {
    let Some(pg) = Pg::alone("one_users_store_work_takes_turns_apart_from_their_calls") else {
        return;
    };
    let (server, http) = super::server_with(|c| {
        pg.configure(c);
        c.quotas.max_store_work_per_user = 2;
    })
    .await;
    let ana = std::sync::Arc::new(Api::new(http, &server.token));
    let ben = Api::new(http, &server.create_token("ben"));
    let ws = ana.workspace(None).await;
    let session = new_session();
    ana.upload(
        &ws,
        "tool_output",
        &session,
        "out.txt",
        "text/plain",
        b"out",
    )
    .await;
    let database = pg.url.rsplit('/').next().unwrap().to_owned();
    let holder = {
        let database = database.clone();
        tokio::task::spawn_blocking(move || {
            crate::suite::pg_store::hold_table(&database, "artifacts", 6)
        })
        .await
        .unwrap()
    };
    // Three of ana's readings of the table: two wait on it, the third for its turn.
    let path = format!("/api/v1/sessions/{session}/artifacts");
    let waiting: Vec<_> = (0..3)
        .map(|_| {
            let (ana, path) = (ana.clone(), path.clone());
            tokio::spawn(async move { ana.get(&path).await })
        })
        .collect();
    crate::suite::pg_store::steadily_waiting_on_locks(
        &database,
        2,
        "the third reading waits for its turn, not on the table",
    )
    .await;
    // Another user's store work is theirs.
    let listed = ben.get("/api/v1/sessions").await;
    assert_eq!(listed.status, 200, "{}", listed.text());
    for waited in waiting {
        let answer = within(STEP, "a reading once the table is free", waited)
            .await
            .unwrap();
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    let _ = tokio::task::spawn_blocking(move || holder.join()).await;
}
