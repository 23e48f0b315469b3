//! A crash (SIGKILL of the real `monad-server`) in the middle of a stream of writes, appends,
//! snapshots and new sessions: every file of the data dir still parses, and everything that was
//! acknowledged is there (DESIGN.md, "Durability").

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use monad_client::agent::Agent;
use monad_protocol::wire::{History, HistoryMessage, HistoryRole, Outcome, Trust};
use monad_server::store::{ArtifactMeta, AuditRecord, SessionMeta, history};
use monad_tests::{Attachment, STEP, ServerProcess, attach_options, connect_agent, folder, within};
use serde_json::json;

/// What the server acknowledged before it died.
#[derive(Debug, Default)]
struct Acks {
    /// `(path, content)` of every acknowledged `write_file` of a new file.
    files: Vec<(String, String)>,
    /// The last acknowledged and the last sent value of `counter.txt`, rewritten in place.
    counter: (Option<u64>, Option<u64>),
    /// Acknowledged appends, in order.
    appends: Vec<String>,
    /// The message count of the last acknowledged and the last sent snapshot of `default`.
    snapshot: (Option<usize>, Option<usize>),
    /// Sessions acknowledged as created.
    sessions: Vec<String>,
}

const SESSION: &str = "c4a5e0d2-6b1f-4f5e-9f3a-0d8c1e2b3a45";

fn text_of(i: usize) -> String {
    format!("message {i}\nwith a second line")
}

/// Runs `step(i)` for i = 0, 1, ... until it fails, counting successes in `total`.
async fn stream<F, Fut>(total: Arc<AtomicUsize>, mut step: F)
where
    F: FnMut(usize) -> Fut + Send,
    Fut: Future<Output = bool> + Send,
{
    for i in 0.. {
        if !step(i).await {
            return;
        }
        total.fetch_add(1, Ordering::Relaxed);
    }
}

fn is_ok(reply: &Result<monad_client::agent::CallReply, monad_client::ClientError>) -> bool {
    matches!(
        reply,
        Ok(monad_client::agent::CallReply {
            outcome: Outcome::Ok { .. },
            ..
        })
    )
}

/// Starts every stream of work; returns their tasks.
fn start_work(
    agent: &Agent,
    acks: &Arc<Mutex<Acks>>,
    total: &Arc<AtomicUsize>,
) -> tokio::task::JoinSet<()> {
    let mut tasks = tokio::task::JoinSet::new();
    // New files, from three writers at once, of varied sizes.
    for writer in 0..3 {
        let (agent, acks) = (agent.clone(), acks.clone());
        tasks.spawn(stream(total.clone(), move |i| {
            let (agent, acks) = (agent.clone(), acks.clone());
            async move {
                let path = format!("w{writer}-{i}.txt");
                let content = format!("writer {writer} file {i}\n").repeat(1 + (i * 37) % 400);
                let reply = agent
                    .call(
                        Some(SESSION),
                        "write_file",
                        json!({"path": path, "content": content}),
                        |_| {},
                    )
                    .await;
                if is_ok(&reply) {
                    acks.lock().unwrap().files.push((path, content));
                }
                reply.is_ok()
            }
        }));
    }
    // One file rewritten in place.
    let (a, k) = (agent.clone(), acks.clone());
    tasks.spawn(stream(total.clone(), move |i| {
        let (agent, acks) = (a.clone(), k.clone());
        async move {
            let value = i as u64;
            acks.lock().unwrap().counter.1 = Some(value);
            let reply = agent
                .call(
                    Some(SESSION),
                    "write_file",
                    json!({"path": "counter.txt", "content": format!("{value}\n").repeat(100)}),
                    |_| {},
                )
                .await;
            if is_ok(&reply) {
                acks.lock().unwrap().counter.0 = Some(value);
            }
            reply.is_ok()
        }
    }));
    // The conversation, one append after another.
    let (a, k) = (agent.clone(), acks.clone());
    tasks.spawn(stream(total.clone(), move |i| {
        let (agent, acks) = (a.clone(), k.clone());
        async move {
            let role = if i.is_multiple_of(2) {
                HistoryRole::User
            } else {
                HistoryRole::Assistant
            };
            let done = agent
                .history_append(
                    Some(SESSION),
                    HistoryMessage {
                        role,
                        text: text_of(i),
                    },
                )
                .await;
            if done.is_ok() {
                acks.lock().unwrap().appends.push(text_of(i));
            }
            done.is_ok()
        }
    }));
    // Snapshots of `default`, growing by one message each.
    let (a, k) = (agent.clone(), acks.clone());
    tasks.spawn(stream(total.clone(), move |i| {
        let (agent, acks) = (a.clone(), k.clone());
        async move {
            let count = i + 1;
            acks.lock().unwrap().snapshot.1 = Some(count);
            let snapshot = History {
                provider: Some("p".into()),
                model: Some("m".into()),
                created_at: String::new(),
                messages: (0..count)
                    .map(|j| HistoryMessage {
                        role: HistoryRole::User,
                        text: format!("snapshot line {j}"),
                    })
                    .collect(),
            };
            let done = agent.history_replace(Some("default"), snapshot).await;
            if done.is_ok() {
                acks.lock().unwrap().snapshot.0 = Some(count);
            }
            done.is_ok()
        }
    }));
    // New sessions (session.toml, session.md, bindings.toml).
    let (a, k) = (agent.clone(), acks.clone());
    tasks.spawn(stream(total.clone(), move |_| {
        let (agent, acks) = (a.clone(), k.clone());
        async move {
            match agent.open_session(None).await {
                Ok(info) => {
                    acks.lock().unwrap().sessions.push(info.id);
                    true
                }
                Err(_) => false,
            }
        }
    }));
    // Calls in an attached folder (its workspace record is rewritten on each).
    let a = agent.clone();
    tasks.spawn(stream(total.clone(), move |_| {
        let agent = a.clone();
        async move {
            let reply = agent
                .call(
                    Some(SESSION),
                    "read_file",
                    json!({"path": "a.txt", "workspace": "lap"}),
                    |_| {},
                )
                .await;
            reply.is_ok()
        }
    }));
    tasks
}

/// The complete lines of a JSON-lines file, each parsed by `parse`; a last line without its
/// newline (torn by the crash) is dropped.
fn jsonl<T>(path: &Path, parse: impl Fn(&str) -> serde_json::Result<T>) -> Vec<T> {
    let text = std::fs::read_to_string(path).unwrap();
    let complete = match text.rfind('\n') {
        Some(end) => &text[..=end],
        None => "",
    };
    complete
        .lines()
        .enumerate()
        .map(|(i, line)| {
            parse(line).unwrap_or_else(|e| panic!("{}:{}: {e}: {line}", path.display(), i + 1))
        })
        .collect()
}

/// Checks that every file the server keeps parses; returns how many were checked.
fn check_data_dir(dir: &Path, rel: &str, checked: &mut usize) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let rel = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        let what = path.display().to_string();
        assert!(!name.contains("corrupt"), "{what}: a file was kept aside");
        if entry.file_type().unwrap().is_dir() {
            // Tool files are checked against the acknowledgements; the certificate elsewhere.
            if name != "workspace" && name != "tls" {
                check_data_dir(&path, &rel, checked);
            }
            continue;
        }
        if name.starts_with('.') && name.ends_with(".tmp") {
            // An atomic write cut short: never renamed over anything, harmless.
            continue;
        }
        let read = || std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{what}: {e}"));
        match name.as_str() {
            // The administration socket a killed server leaves (the next one replaces it), and
            // the (empty) lock files.
            "server.lock" | "admin.sock" | "tokens.toml.lock" => {}
            "address" => {
                let text = read();
                text.trim()
                    .parse::<std::net::SocketAddr>()
                    .unwrap_or_else(|e| panic!("{what}: {e}: {text:?}"));
            }
            // The data dir's id in session leases (PostgreSQL).
            // The note that the first token was made (text, whole).
            "first-token-made" => assert!(read().ends_with('\n'), "{what}"),
            "host_id" => {
                let text = read();
                assert!(
                    text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit()),
                    "{what}: {text:?}"
                );
            }
            "session.toml" => {
                let meta: SessionMeta =
                    toml::from_str(&read()).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(rel.contains(&meta.id), "{what} names {}", meta.id);
            }
            "tokens.toml" | "bindings.toml" | "config.toml" => {
                toml::from_str::<toml::Table>(&read()).unwrap_or_else(|e| panic!("{what}: {e}"));
            }
            "session.md" => {
                history::parse(&read()).unwrap_or_else(|e| panic!("{what}: {e}"));
            }
            "audit.jsonl" => {
                jsonl(&path, |l| serde_json::from_str::<AuditRecord>(l));
            }
            "index.jsonl" => {
                // A line is the artifact's metadata, plus `pack: [offset, len]` when its bytes
                // sit in the session's pack file rather than in a file of their own.
                for mut line in jsonl(&path, |l| serde_json::from_str::<serde_json::Value>(l)) {
                    let pack = line.as_object_mut().and_then(|l| l.remove("pack"));
                    let meta: ArtifactMeta =
                        serde_json::from_value(line).unwrap_or_else(|e| panic!("{what}: {e}"));
                    let history = meta.kind == monad_server::store::ArtifactKind::SessionHistory;
                    match pack {
                        Some(range) => {
                            let [offset, len]: [u64; 2] = serde_json::from_value(range)
                                .unwrap_or_else(|e| panic!("{what}: pack range: {e}"));
                            let pack = path.with_file_name("pack");
                            let size = std::fs::metadata(&pack)
                                .unwrap_or_else(|e| panic!("{}: {e}", pack.display()))
                                .len();
                            assert!(!history, "{what}: a history snapshot in the pack");
                            assert_eq!(len, meta.size, "{what}: {} pack range", meta.id);
                            assert!(offset + len <= size, "{what}: {} past the pack", meta.id);
                        }
                        None => {
                            let body = path.with_file_name(format!("{}.bin", meta.id));
                            let len = std::fs::metadata(&body)
                                .unwrap_or_else(|e| panic!("{}: {e}", body.display()))
                                .len();
                            if !history {
                                assert_eq!(len, meta.size, "{}", body.display());
                            }
                        }
                    }
                }
            }
            // The bytes of a session's tool outputs and diffs, one after another.
            "pack" if rel.ends_with("artifacts/pack") => {}
            _ if name.ends_with(".bin") => {}
            // Artifact content of the PostgreSQL store (its rows name it).
            _ if rel.starts_with("blobs/") => {}
            _ if rel.starts_with("workspaces/") && name.ends_with(".json") => {
                serde_json::from_str::<serde_json::Value>(&read())
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
            }
            _ => panic!("unexpected file in the data dir: {what}"),
        }
        *checked += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_loses_nothing_acknowledged_and_leaves_every_file_parseable() {
    sigkill_mid_stream(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_loses_nothing_acknowledged_on_postgresql() {
    let Some(pg) =
        super::pg_store::Pg::alone("sigkill_mid_stream_loses_nothing_acknowledged_on_postgresql")
    else {
        return;
    };
    sigkill_mid_stream(Some(pg)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_loses_nothing_acknowledged_on_postgresql_and_s3() {
    let Some(pg) = super::pg_store::Pg::with_s3(
        "sigkill_mid_stream_loses_nothing_acknowledged_on_postgresql_and_s3",
    ) else {
        return;
    };
    sigkill_mid_stream(Some(pg)).await;
}

/// The SIGKILL case on a backend: the filesystem (`None`) or PostgreSQL (with S3).
async fn sigkill_mid_stream(pg: Option<super::pg_store::Pg>) {
    let data = tempfile::tempdir().unwrap();
    let env = pg.as_ref().map(|pg| pg.env()).unwrap_or_default();
    let envs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let server = ServerProcess::start(data.path(), &envs).await;
    let token = server.first_token.clone().expect("first start");
    let config = server.client_config(&token);
    let agent = connect_agent(&config).await;
    within(
        STEP,
        "the session to open",
        agent.open_session(Some(SESSION)),
    )
    .await
    .unwrap();
    let laptop = folder(&[("a.txt", "a\n")]);
    let mut options = attach_options(laptop.path(), "lap");
    options.session = Some(SESSION.into());
    options.trust = Trust::Full;
    let attachment = Attachment::start(&server.client_config(&token), options, None).await;

    let acks = Arc::new(Mutex::new(Acks::default()));
    let total = Arc::new(AtomicUsize::new(0));
    let mut tasks = start_work(&agent, &acks, &total);
    // Kill it in full flight: after enough acknowledged operations, with more in flight.
    within(STEP, "150 acknowledged operations", async {
        while total.load(Ordering::Relaxed) < 150 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    server.kill().await;
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    drop(attachment);
    let acks = std::mem::take(&mut *acks.lock().unwrap());
    assert!(
        acks.files.len() >= 5 && acks.appends.len() >= 5,
        "enough of each: {acks:?}"
    );

    // Every file the server keeps parses, as it was left.
    let mut checked = 0;
    check_data_dir(data.path(), "", &mut checked);
    // On PostgreSQL the records are rows; the data dir keeps the primary workspace and blobs.
    assert!(pg.is_some() || checked > 10, "only {checked} files checked");

    // Every acknowledged write is there, exactly.
    let primary = data.path().join("sessions").join(SESSION).join("workspace");
    for (path, content) in &acks.files {
        let found = std::fs::read_to_string(primary.join(path))
            .unwrap_or_else(|e| panic!("acknowledged {path} is missing: {e}"));
        assert!(found == *content, "acknowledged {path} differs");
    }
    let counter = std::fs::read_to_string(primary.join("counter.txt")).unwrap();
    let value: u64 = counter.lines().next().unwrap().parse().unwrap();
    assert_eq!(counter, format!("{value}\n").repeat(100), "whole");
    let (acked, sent) = acks.counter;
    assert!(
        acked.is_none_or(|a| value >= a) && sent.is_some_and(|s| value <= s),
        "counter.txt holds {value}; acknowledged {acked:?}, sent {sent:?}"
    );

    // The restarted server serves all of it.
    let server = ServerProcess::start(data.path(), &envs).await;
    let agent = connect_agent(&server.retarget(&config)).await;
    let (_, h) = within(STEP, "history", agent.history(Some(SESSION)))
        .await
        .unwrap();
    let texts: Vec<&str> = h.messages.iter().map(|m| m.text.as_str()).collect();
    assert!(
        texts.len() == acks.appends.len() || texts.len() == acks.appends.len() + 1,
        "{} acknowledged appends, {} in the history",
        acks.appends.len(),
        texts.len()
    );
    for (i, text) in texts.iter().enumerate() {
        assert_eq!(*text, text_of(i), "message {i}, in order");
    }
    let (_, h) = within(STEP, "history", agent.history(Some("default")))
        .await
        .unwrap();
    let (acked, sent) = acks.snapshot;
    let n = h.messages.len();
    assert!(
        acked.is_none_or(|a| n >= a) && sent.is_some_and(|s| n <= s) && (n > 0 || acked.is_none()),
        "default holds a snapshot of {n}; acknowledged {acked:?}, sent {sent:?}"
    );
    let listed = within(STEP, "sessions", agent.sessions()).await.unwrap();
    for id in &acks.sessions {
        assert!(listed.iter().any(|s| &s.id == id), "session {id} is gone");
    }
    let (read, _) = monad_tests::ok(
        monad_tests::call_in(
            &agent,
            Some(SESSION),
            "read_file",
            json!({"path": acks.files[0].0}),
        )
        .await,
    );
    assert_eq!(read["content"].as_str(), Some(acks.files[0].1.as_str()));
    let said = server.stop().await;
    assert!(!said.contains("corrupt"), "{said}");
}

/// The processes whose command line holds `marker`.
fn processes_marked(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline"))
            && String::from_utf8_lossy(&cmdline).contains(marker)
        {
            found.push(pid);
        }
    }
    found
}

/// A SIGKILLed server leaves no command behind without namespaces either, even one whose
/// orphans keep ending: each ending is a SIGCHLD to the supervisor (a child subreaper), which
/// looked for its caller only after a whole second without a signal, and so never did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_leaves_no_command_behind_without_namespaces() {
    let data = tempfile::tempdir().unwrap();
    std::fs::write(
        data.path().join("config.toml"),
        "[exec]\nnamespaces = \"off\"\n",
    )
    .unwrap();
    let server = ServerProcess::start(data.path(), &[]).await;
    let token = server.first_token.clone().expect("first start");
    let agent = connect_agent(&server.client_config(&token)).await;
    let marker = format!("monad-leftover-{}", std::process::id());
    monad_tests::ok(
        monad_tests::call(
            &agent,
            "run_command",
            json!({"argv": ["sh", "-c", "while :; do (sleep 0.3 &); sleep 0.2; done", marker],
                   "background": true}),
        )
        .await,
    );
    assert!(!processes_marked(&marker).is_empty(), "the command runs");
    server.kill().await;
    // The supervisor looks for its caller at least once a second.
    let mut left = processes_marked(&marker);
    for _ in 0..50 {
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = processes_marked(&marker);
    }
    for pid in &left {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    assert!(
        left.is_empty(),
        "left running 5 s after the server died: {left:?}"
    );
}
