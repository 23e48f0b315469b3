//! What the workspace service API and the web view cost (issue 13, item 4), timed on the
//! machine in use.
//!
//! `cargo bench -p monad-tests --bench http` (add `-- --quick`, or set `MONAD_BENCH_QUICK=1`,
//! for a smoke run). A server runs in this process on loopback with its HTTP listener; requests
//! go through a real HTTP client (reqwest), one at a time, so each figure is the server's time
//! plus one loopback round trip and the client's parsing (an upper bound of the server time).
//! See `docs/benchmarks.md`.
//!
//! Figures:
//! - (a) `GET /api/v1/sessions` (first page of 20, and a page deep in the list through its
//!   `nextToken`) with 10,000 sessions. Target: < 50 ms.
//! - (b) the session list page `GET /` (50 rows) with 10,000 sessions, signed in. Target: < 50 ms.
//! - (c) a session page `GET /sessions/{id}` of a session with 5,000 tool calls (500 of them
//!   with a diff), and `GET /api/v1/sessions/{id}/audit?limit=100` deep in its log. Information.
//! - (d) artifact upload (`POST .../artifacts`, base64 in JSON) and download throughput, 1 MiB
//!   and 16 MiB artifacts. Information.
//! - (e) the full-text search of the session list page (`GET /?q=...`, over every session's
//!   conversation) with 10,000 sessions of six messages each: a word in 1% of them, a word in
//!   none, and two words that every session has (a full first page). Target: < 50 ms.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine;
use monad_server::Server;
use monad_server::fsutil::rfc3339;
use monad_server::store::{
    ArtifactKind, ArtifactMeta, ArtifactStore, AuditDecision, AuditOutcome, AuditRecord, Decider,
    FsStore, SessionMeta, SessionStore, history,
};
use monad_tests::bench::{Stats, fmt_dur, quick};
use monad_tests::test_config;
use serde_json::{Value, json};

/// Sessions on disk.
const SESSIONS: usize = 10_000;
/// Tool calls of the big session.
const CALLS: usize = 5_000;
/// Target of the listings.
const TARGET: Duration = Duration::from_millis(50);

fn session_id(i: usize) -> String {
    format!("{:08x}-0000-4000-8000-{:012x}", i as u32, i)
}

/// Words of the fixture's conversations.
const WORDS: &[&str] = &[
    "build",
    "test",
    "cargo",
    "deploy",
    "refactor",
    "module",
    "error",
    "timeout",
    "config",
    "parser",
    "server",
    "client",
    "token",
    "cache",
    "index",
    "query",
    "latency",
    "thread",
    "socket",
    "buffer",
    "review",
    "branch",
    "commit",
    "release",
    "schema",
    "migration",
];
/// A word in one session of a hundred.
const RARE: &str = "kubernetes";

/// Session `i`'s conversation: six messages of about forty words, `RARE` in one of a hundred.
fn conversation(i: usize) -> Vec<monad_server::store::HistoryMessage> {
    (0..6)
        .map(|j| {
            let mut text: Vec<&str> = (0..40)
                .map(|k| WORDS[(i * 7 + j * 13 + k * 3 + k * k) % WORDS.len()])
                .collect();
            if i.is_multiple_of(100) && j == 3 {
                text.push(RARE);
            }
            monad_server::store::HistoryMessage {
                role: if j % 2 == 0 {
                    monad_server::store::Role::User
                } else {
                    monad_server::store::Role::Assistant
                },
                text: format!("Please look at the {}.", text.join(" ")),
            }
        })
        .collect()
}

/// `n` sessions of `admin` straight on disk, each with a conversation (no fsync: the fixture is
/// not measured).
fn write_sessions(data: &Path, n: usize) {
    let base = 1_780_000_000u64;
    for i in 0..n {
        let id = session_id(i);
        let dir = data.join("sessions").join(&id);
        std::fs::create_dir_all(dir.join("workspace")).unwrap();
        let meta = SessionMeta {
            id: id.clone(),
            name: None,
            owner: "admin".into(),
            created_at: rfc3339(base),
            last_active: rfc3339(base + i as u64),
            provider: None,
            model: None,
            focus: None,
            folders: Vec::new(),
        };
        std::fs::write(dir.join("session.toml"), toml::to_string(&meta).unwrap()).unwrap();
        let mut talk = history::empty(meta.created_at.clone(), None, None);
        talk.messages = conversation(i);
        std::fs::write(dir.join("session.md"), history::render(&talk)).unwrap();
    }
}

/// The big session: `calls` audit lines, a diff for one in ten, a conversation.
fn write_big_session(data: &Path, id: &str, calls: usize) {
    let store = FsStore::new(data);
    let now = rfc3339(1_790_000_000);
    store
        .create(&SessionMeta {
            id: id.into(),
            name: Some("big".into()),
            owner: "admin".into(),
            created_at: now.clone(),
            last_active: now.clone(),
            provider: None,
            model: None,
            focus: None,
            folders: Vec::new(),
        })
        .unwrap();
    let mut history = history::empty(now.clone(), None, None);
    for i in 0..20 {
        history.messages.push(monad_server::store::HistoryMessage {
            role: if i % 2 == 0 {
                monad_server::store::Role::User
            } else {
                monad_server::store::Role::Assistant
            },
            text: format!("Message {i} with **Markdown** and `code`."),
        });
    }
    store.replace(id, &history).unwrap();
    let records: Vec<AuditRecord> = (0..calls)
        .map(|i| AuditRecord {
            time: rfc3339(1_790_000_000 + i as u64),
            call_id: format!("call-{i:06}"),
            tool: if i % 10 == 0 {
                "edit_file"
            } else {
                "read_file"
            }
            .into(),
            workspace: Some("primary".into()),
            target: format!("src/module_{}.rs", i % 97),
            decision: AuditDecision::Allowed,
            decided_by: Decider::Trust,
            outcome: AuditOutcome::Ok,
            duration_ms: (i % 13) as u64,
        })
        .collect();
    store.audit(id, &records).unwrap();
    for i in (0..calls).step_by(10) {
        let diff = format!(
            "--- a/src/module_{0}.rs\n+++ b/src/module_{0}.rs\n@@ -1,3 +1,3 @@\n fn a() {{}}\n-fn b() {{}}\n+fn b() {{ {i} }}\n fn c() {{}}\n",
            i % 97
        );
        store
            .put_artifact(
                &ArtifactMeta {
                    id: format!("diff-{i:06}"),
                    session: id.into(),
                    kind: ArtifactKind::FileDiff,
                    workspace: Some("primary".into()),
                    tool: Some("edit_file".into()),
                    call_id: Some(format!("call-{i:06}")),
                    created_at: now.clone(),
                    content_type: "text/x-diff".into(),
                    size: diff.len() as u64,
                    truncated: false,
                    original_size: diff.len() as u64,
                    upload: None,
                },
                diff.as_bytes(),
            )
            .unwrap();
    }
}

struct Client {
    base: String,
    token: String,
    cookie: String,
    http: reqwest::Client,
}

impl Client {
    async fn get(&self, path: &str, signed_in: bool) -> (u16, Vec<u8>) {
        let mut request = self.http.get(format!("{}{path}", self.base));
        request = if signed_in {
            request.header("cookie", &self.cookie)
        } else {
            request.bearer_auth(&self.token)
        };
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.bytes().await.unwrap().to_vec())
    }

    async fn post(&self, path: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.bytes().await.unwrap().to_vec())
    }
}

/// Times `runs` requests of `path`, after one warm-up.
async fn time_get(client: &Client, path: &str, signed_in: bool, runs: usize) -> Stats {
    let (status, body) = client.get(path, signed_in).await;
    assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&body));
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        let (status, _) = client.get(path, signed_in).await;
        samples.push(start.elapsed());
        assert_eq!(status, 200);
    }
    Stats::of(&mut samples)
}

fn row(figure: &str, stats: &Stats, target: Option<Duration>) {
    let verdict = match target {
        Some(t) if stats.p99 < t => "PASS (p99)",
        Some(t) if stats.median < t => "PASS (median)",
        Some(_) => "OVER",
        None => "info",
    };
    println!("{figure:<62} {:>24}  {verdict}", stats.show());
}

fn main() {
    let quick = quick();
    let sessions = if quick { 1_000 } else { SESSIONS };
    let calls = if quick { 500 } else { CALLS };
    let runs = if quick { 20 } else { 200 };
    let data = tempfile::tempdir().unwrap();
    write_sessions(data.path(), sessions);
    let big = "b16b16b1-0000-4000-8000-00000000b16b";
    write_big_session(data.path(), big, calls);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let http: SocketAddr = free.local_addr().unwrap();
        drop(free);
        let mut config = test_config(data.path().to_path_buf());
        config.http = Some(http);
        let (server, first) = Server::bind(config).unwrap();
        let token = first.expect("a first token").token;
        tokio::spawn(server.run(std::future::pending()));
        let http_client = monad_server::llm::http_client_builder()
            .unwrap()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let login = http_client
            .post(format!("http://{http}/login"))
            .header("origin", format!("http://{http}"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("token={token}"))
            .send()
            .await
            .unwrap();
        assert_eq!(login.status().as_u16(), 303);
        let cookie = login.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_owned();
        let client = Client {
            base: format!("http://{http}"),
            token,
            cookie,
            http: http_client,
        };
        println!(
            "{sessions} sessions, a session of {calls} tool calls; {runs} requests per figure, \
             one at a time (median / p99, round trip over loopback)"
        );
        println!("{}", "-".repeat(100));

        let first = time_get(&client, "/api/v1/sessions", false, runs).await;
        row(
            "(a) GET /api/v1/sessions (first page, 20)",
            &first,
            Some(TARGET),
        );
        // A page deep in the list: follow tokens half-way.
        let mut token = None;
        for _ in 0..(sessions / 2 / 100) {
            let path = match &token {
                Some(t) => format!("/api/v1/sessions?limit=100&nextToken={t}"),
                None => "/api/v1/sessions?limit=100".to_owned(),
            };
            let (_, body) = client.get(&path, false).await;
            let page: Value = serde_json::from_slice(&body).unwrap();
            token = page["nextToken"].as_str().map(str::to_owned);
        }
        let deep = time_get(
            &client,
            &format!("/api/v1/sessions?limit=100&nextToken={}", token.unwrap()),
            false,
            runs,
        )
        .await;
        row(
            "(a) GET /api/v1/sessions (page of 100, half-way)",
            &deep,
            Some(TARGET),
        );

        let page = time_get(&client, "/", true, runs).await;
        row(
            "(b) GET / (session list page, 50 rows)",
            &page,
            Some(TARGET),
        );

        let session_page = time_get(&client, &format!("/sessions/{big}"), true, runs / 4).await;
        row(
            &format!("(c) GET /sessions/{{id}} ({calls} calls, last 100 shown)"),
            &session_page,
            None,
        );
        let audit = time_get(
            &client,
            &format!("/api/v1/sessions/{big}/audit?limit=100"),
            false,
            runs / 4,
        )
        .await;
        row(
            "(c) GET /api/v1/sessions/{id}/audit?limit=100",
            &audit,
            None,
        );

        // (e) the full-text search over every conversation.
        let rare = time_get(&client, &format!("/?q={RARE}"), true, runs / 4).await;
        let (_, body) = client.get(&format!("/?q={RARE}"), true).await;
        let shown = String::from_utf8_lossy(&body)
            .matches("class=\"row session\"")
            .count();
        assert_eq!(
            shown,
            (sessions / 100).min(50),
            "the rare word's sessions are listed"
        );
        row(
            &format!("(e) GET /?q={RARE} (in 1% of {sessions} sessions)"),
            &rare,
            Some(TARGET),
        );
        let none = time_get(&client, "/?q=nowhere", true, runs / 4).await;
        row("(e) GET /?q=nowhere (in no session)", &none, Some(TARGET));
        let common = time_get(&client, "/?q=please+look", true, runs / 4).await;
        row(
            "(e) GET /?q=please+look (in every session: first 50)",
            &common,
            Some(TARGET),
        );

        // (d) upload and download throughput.
        let ws = {
            let (status, body) = client
                .post(
                    "/api/v1/workspaces",
                    json!({"workspaceScope": "local", "localPath": "/bench"})
                        .to_string()
                        .into_bytes(),
                )
                .await;
            assert!(status == 201 || status == 200);
            serde_json::from_slice::<Value>(&body).unwrap()["workspaceId"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        for (size, count) in [
            (1usize << 20, if quick { 5 } else { 50 }),
            (16 << 20, if quick { 2 } else { 8 }),
        ] {
            let content: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            let body = json!({
                "sessionId": session_id(0), "artifactType": "tool_output",
                "artifactName": "out.bin", "contentType": "application/octet-stream",
                "contentBase64": base64::engine::general_purpose::STANDARD.encode(&content),
            })
            .to_string()
            .into_bytes();
            let mut ids = Vec::new();
            let start = Instant::now();
            for _ in 0..count {
                let (status, answer) = client
                    .post(&format!("/api/v1/workspaces/{ws}/artifacts"), body.clone())
                    .await;
                assert_eq!(status, 201, "{}", String::from_utf8_lossy(&answer));
                ids.push(
                    serde_json::from_slice::<Value>(&answer).unwrap()["artifactId"]
                        .as_str()
                        .unwrap()
                        .to_owned(),
                );
            }
            let up = start.elapsed();
            let start = Instant::now();
            for id in &ids {
                let (status, got) = client
                    .get(&format!("/api/v1/workspaces/{ws}/artifacts/{id}"), false)
                    .await;
                assert_eq!(status, 200);
                assert_eq!(got.len(), size);
            }
            let down = start.elapsed();
            let mib = (size * count) as f64 / (1 << 20) as f64;
            println!(
                "{:<62} {:>24}  info",
                format!("(d) upload {} MiB artifacts x {count}", size >> 20),
                format!(
                    "{:.0} MiB/s ({} each)",
                    mib / up.as_secs_f64(),
                    fmt_dur(up / count as u32)
                )
            );
            println!(
                "{:<62} {:>24}  info",
                format!("(d) download {} MiB artifacts x {count}", size >> 20),
                format!(
                    "{:.0} MiB/s ({} each)",
                    mib / down.as_secs_f64(),
                    fmt_dur(down / count as u32)
                )
            );
        }
    });
}
