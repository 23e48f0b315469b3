//! What a session's storage costs (issue 4, item 10), timed on the machine in use.
//!
//! `cargo bench -p monad-tests --bench storage` (add `-- --quick`, or set `MONAD_BENCH_QUICK=1`,
//! for a smoke run). Everything runs in this process: the filesystem store and the registry
//! directly, and an in-process server with an agent over loopback QUIC for the protocol figures.
//! Data dirs are on the disk (`std::env::temp_dir()`, normally `/tmp`), so every fsync is real.
//! See `docs/benchmarks.md`.
//!
//! Figures:
//! - (a) appending 10,000 messages to one `session.md` with `FsStore::append` (one write and one
//!   fdatasync each), per append, against the floor: the same bytes appended with `write` +
//!   `fdatasync` on a plain file. Then the same through the protocol (`Agent::history_append`,
//!   fewer messages: each is a round trip plus the same fsync). Information: there is no target.
//! - (b) listing sessions with 10,000 sessions on disk: `Registry::list` on a fresh store (which
//!   reads every `session.toml` once to build its index; a server does that in the background
//!   at start) and warm; through the server, `Agent::sessions()` (the whole list in one answer)
//!   and the first page of 20 (`Agent::sessions_page`); and warm, the list of a user with none of
//!   them (what one user's listing costs beside another's sessions). Target for the warm
//!   listing and the first page: < 50 ms.
//! - (c) the first page (20) of a workspace record's session list, the record used by 10,000
//!   sessions: `WorkspaceStore::record_sessions` on a fresh store (which loads the record) and
//!   warm, and `Agent::record_sessions` through the server. Target: < 50 ms.
//! - (d) 10,000 idle sessions loaded in a `Registry`: resident memory and file descriptors per
//!   session. Information: there is no target.
//! - (e) both backends through the store traits, the filesystem store and the PostgreSQL store
//!   (a private cluster started here with PostgreSQL's default durability, fsync on, on the same
//!   disk): a history append, the session list with 10,000 sessions (`SessionStore::all_sessions`
//!   and `Registry::list` on a fresh registry), and a 4 KiB artifact write; and the 4 KiB
//!   artifact write on PostgreSQL with the content on S3 (`moto_server` on loopback, see
//!   `monad_tests::s3`). `--backends` runs only this figure. Information: there is no target.

use monad_tests::bench::{Stats, fmt_dur};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use monad_protocol::wire::{HistoryMessage, HistoryRole, WorkspaceRecord, WorkspaceSession};
use monad_server::fsutil::rfc3339;
use monad_server::session::Registry;
use monad_server::settings::Layers;
use monad_server::store::{FsStore, SessionMeta, SessionStore, Store, WorkspaceStore, history};
use monad_tests::TestServer;

/// Sessions on disk for figures b to d.
const SESSIONS: usize = 10_000;
/// Messages appended directly (figure a).
const APPENDS: usize = 10_000;
/// Messages appended through the protocol (figure a), full run.
const PROTOCOL_APPENDS: usize = 2_000;
/// Target of the listings (figures b and c).
const LIST_TARGET: Duration = Duration::from_millis(50);

// ---------------------------------------------------------------------------------------------
// Statistics and output

fn header() {
    println!(
        "{:<48} {:>26} {:>26} {:>9}  verdict",
        "figure", "median / p99", "baseline / note", "target"
    );
    println!("{}", "-".repeat(122));
}

fn row(figure: &str, value: &str, baseline: &str, target: &str, verdict: &str) {
    println!("{figure:<48} {value:>26} {baseline:>26} {target:>9}  {verdict}");
}

fn verdict(d: Duration) -> &'static str {
    if d < LIST_TARGET { "PASS" } else { "OVER" }
}

/// Times `f` once.
fn time<T>(f: impl FnOnce() -> T) -> (Duration, T) {
    let start = Instant::now();
    let out = f();
    (start.elapsed(), out)
}

// ---------------------------------------------------------------------------------------------
// Fixtures

/// The `i`th session id.
fn session_id(i: usize) -> String {
    format!("{:08x}-0000-4000-8000-{:012x}", i as u32, i)
}

/// Writes `n` sessions owned by `admin` straight to disk, in the store's format (no fsync: the
/// fixture is not what is measured). Session `i` was last active `i` seconds after a fixed
/// instant, so the most recent is the last.
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
        let empty = history::empty(meta.created_at.clone(), None, None);
        std::fs::write(dir.join("session.md"), history::render_frontmatter(&empty)).unwrap();
    }
}

/// Writes one workspace record of `admin` used by `n` sessions; returns its id.
fn write_record(data: &Path, n: usize) -> String {
    let base = 1_780_000_000u64;
    let id = "7d3c2b1a-0000-4000-8000-00000000beef".to_owned();
    let record = WorkspaceRecord {
        id: id.clone(),
        user: "admin".into(),
        device_id: "bench-device".into(),
        path: "~/dev/project".into(),
        uri: "laptop:~/dev/project".into(),
        created_at: rfc3339(base),
        last_active: rfc3339(base + n as u64),
    };
    // In attach order (oldest first), as the store keeps them.
    let sessions: Vec<WorkspaceSession> = (0..n)
        .map(|i| WorkspaceSession {
            session: session_id(i),
            first_at: rfc3339(base + i as u64),
            last_active: rfc3339(base + i as u64),
            calls: i as u64 % 17,
        })
        .collect();
    let dir = data.join("workspaces");
    std::fs::create_dir_all(&dir).unwrap();
    let file = serde_json::json!({ "record": record, "sessions": sessions });
    std::fs::write(
        dir.join(format!("{id}.json")),
        serde_json::to_vec_pretty(&file).unwrap(),
    )
    .unwrap();
    id
}

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

// ---------------------------------------------------------------------------------------------
// Figures

/// (a) Appends, directly and through the protocol.
fn appends(rt: &tokio::runtime::Runtime, quick: bool) {
    let n = if quick { 500 } else { APPENDS };
    let data = tempfile::tempdir().unwrap();
    let store = FsStore::new(data.path());
    let meta = SessionMeta {
        id: "default".into(),
        name: None,
        owner: "admin".into(),
        created_at: rfc3339(1_780_000_000),
        last_active: rfc3339(1_780_000_000),
        provider: Some("anthropic".into()),
        model: Some("claude".into()),
        focus: None,
        folders: Vec::new(),
    };
    store.create(&meta).unwrap();
    let message = |i: usize| HistoryMessage {
        role: if i.is_multiple_of(2) {
            HistoryRole::User
        } else {
            HistoryRole::Assistant
        },
        text: format!(
            "Message {i}. A typical turn of a conversation, a few lines long.\n\nIt has a \
             paragraph or two, maybe a list:\n- one\n- two"
        ),
    };
    // The floor: the same bytes, appended with one write and one fdatasync each.
    let floor_path = data.path().join("floor.md");
    let mut floor = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&floor_path)
        .unwrap();
    let mut direct = Vec::with_capacity(n);
    let mut raw = Vec::with_capacity(n);
    let total = Instant::now();
    // Alternate, so drift in disk load affects both alike.
    for i in 0..n {
        let m = message(i);
        let (d, r) = time(|| store.append("default", &m));
        r.unwrap();
        direct.push(d);
        let bytes = history::render_message(&m);
        let (d, ()) = time(|| {
            floor.write_all(bytes.as_bytes()).unwrap();
            floor.sync_data().unwrap();
        });
        raw.push(d);
    }
    let wall = total.elapsed();
    let (read, h) = time(|| store.history("default").unwrap());
    assert_eq!(h.messages.len(), n);
    assert_eq!(h.messages[n - 1], message(n - 1));
    let direct = Stats::of(&mut direct);
    let raw = Stats::of(&mut raw);
    row(
        &format!("(a) FsStore::append x {n} (fsync each)"),
        &direct.show(),
        &format!("write+fdatasync {}", raw.show()),
        "-",
        "INFO",
    );
    row(
        "    mean per append / floor mean",
        &fmt_dur(direct.mean),
        &fmt_dur(raw.mean),
        "-",
        "INFO",
    );
    println!(
        "    ({n} appends and {n} floor writes in {}; reading back {n} messages: {})",
        fmt_dur(wall),
        fmt_dur(read)
    );

    // Through the protocol: an agent appends to `default` on an in-process server.
    let n = if quick { 200 } else { PROTOCOL_APPENDS };
    rt.block_on(async {
        let server = TestServer::start().await;
        let agent = server.agent().await;
        let mut samples = Vec::with_capacity(n);
        for i in 0..n {
            let start = Instant::now();
            agent
                .history_append(Some("default"), message(i))
                .await
                .unwrap();
            samples.push(start.elapsed());
        }
        let (_, h) = agent.history(Some("default")).await.unwrap();
        assert_eq!(h.messages.len(), n);
        let stats = Stats::of(&mut samples);
        row(
            &format!("(a) Agent::history_append x {n}"),
            &stats.show(),
            &format!("mean {}", fmt_dur(stats.mean)),
            "-",
            "INFO",
        );
        server.stop().await;
    });
}

/// (b) and (c): listings over 10,000 sessions.
fn listings(rt: &tokio::runtime::Runtime, quick: bool) {
    let data = tempfile::tempdir().unwrap();
    let (made, ()) = time(|| write_sessions(data.path(), SESSIONS));
    let record = write_record(data.path(), SESSIONS);
    println!(
        "    (fixture: {SESSIONS} sessions and a record of {SESSIONS} sessions written in {})",
        fmt_dur(made)
    );
    let reps = if quick { 5 } else { 30 };

    // (b) The session list, in the registry.
    let fresh = || {
        let store: Arc<dyn Store> = Arc::new(FsStore::new(data.path()));
        Registry::new(data.path(), store, Layers::default())
    };
    let mut cold = Vec::new();
    for _ in 0..if quick { 2 } else { 5 } {
        let registry = fresh();
        let (d, list) = time(|| registry.list("admin").unwrap());
        assert_eq!(list.len(), SESSIONS);
        assert_eq!(list[0].id, session_id(SESSIONS - 1), "most recent first");
        cold.push(d);
    }
    let cold = Stats::of(&mut cold);
    row(
        &format!("(b) Registry::list, {SESSIONS} sessions, cold"),
        &cold.show(),
        "builds the index, once",
        "-",
        "INFO",
    );
    let registry = fresh();
    registry.list("admin").unwrap();
    let mut warm: Vec<Duration> = (0..reps)
        .map(|_| time(|| registry.list("admin").unwrap()).0)
        .collect();
    let warm = Stats::of(&mut warm);
    row(
        &format!("(b) Registry::list, {SESSIONS} sessions, warm"),
        &warm.show(),
        "",
        "< 50 ms",
        verdict(warm.median),
    );
    // Another user's list on the same server: their own sessions (none), not everyone's.
    let mut others: Vec<Duration> = (0..reps * 10)
        .map(|_| {
            let (d, list) = time(|| registry.list("bea").unwrap());
            assert!(list.is_empty());
            d
        })
        .collect();
    let others = Stats::of(&mut others);
    row(
        &format!("(b) Registry::list of another user, beside {SESSIONS}"),
        &others.show(),
        "one user's sessions, not all",
        "-",
        "INFO",
    );

    // (c) A record's first page, in the store.
    let mut cold = Vec::new();
    for _ in 0..if quick { 2 } else { 5 } {
        let store = FsStore::new(data.path());
        let (d, page) = time(|| store.record_sessions(&record, 20, None).unwrap());
        assert_eq!(page.items.len(), 20);
        assert_eq!(page.items[0].session, session_id(SESSIONS - 1));
        cold.push(d);
    }
    let cold = Stats::of(&mut cold);
    row(
        &format!("(c) record_sessions 1st page, {SESSIONS}, fresh"),
        &cold.show(),
        "loads the record",
        "< 50 ms",
        verdict(cold.median),
    );
    let store = FsStore::new(data.path());
    let mut warm: Vec<Duration> = (0..reps * 10)
        .map(|_| time(|| store.record_sessions(&record, 20, None).unwrap()).0)
        .collect();
    let warm = Stats::of(&mut warm);
    row(
        &format!("(c) record_sessions 1st page, {SESSIONS}, warm"),
        &warm.show(),
        "",
        "< 50 ms",
        verdict(warm.median),
    );

    // Both through the protocol, from an agent, on an in-process server on this data dir.
    rt.block_on(async {
        let dir = data.path().to_path_buf();
        let server = TestServer::start_with(|config| config.data_dir = dir).await;
        let agent = server.agent().await;
        let (first, sessions) = {
            let start = Instant::now();
            let sessions = agent.sessions().await.unwrap();
            (start.elapsed(), sessions)
        };
        assert_eq!(sessions.len(), SESSIONS);
        let mut samples = Vec::new();
        for _ in 0..reps {
            let start = Instant::now();
            let sessions = agent.sessions().await.unwrap();
            samples.push(start.elapsed());
            assert_eq!(sessions.len(), SESSIONS);
        }
        let stats = Stats::of(&mut samples);
        row(
            &format!("(b) Agent::sessions(), all {SESSIONS}"),
            &stats.show(),
            &format!("first call {}", fmt_dur(first)),
            "-",
            "INFO",
        );
        // Where the whole list's time goes: one answer of every session, as JSON.
        let answer = monad_protocol::wire::Message::Sessions {
            id: 1,
            sessions,
            next: None,
        };
        let mut encode = Vec::new();
        let mut decode = Vec::new();
        let mut size = 0;
        for _ in 0..5 {
            let (d, bytes) = time(|| serde_json::to_vec(&answer).unwrap());
            encode.push(d);
            size = bytes.len();
            decode.push(
                time(|| serde_json::from_slice::<monad_protocol::wire::Message>(&bytes).unwrap()).0,
            );
        }
        println!(
            "    (that answer is {:.1} MB of JSON: encoding {}, decoding {} (medians))",
            size as f64 / 1e6,
            fmt_dur(Stats::of(&mut encode).median),
            fmt_dur(Stats::of(&mut decode).median)
        );
        let first = {
            let start = Instant::now();
            agent.sessions_page(Some(20), None).await.unwrap();
            start.elapsed()
        };
        let mut samples = Vec::new();
        for _ in 0..reps * 10 {
            let start = Instant::now();
            let (page, next) = agent.sessions_page(Some(20), None).await.unwrap();
            samples.push(start.elapsed());
            assert_eq!((page.len(), next.is_some()), (20, true));
            assert_eq!(page[0].id, session_id(SESSIONS - 1));
        }
        let stats = Stats::of(&mut samples);
        row(
            &format!("(b) Agent::sessions_page 1st page (20), {SESSIONS}"),
            &stats.show(),
            &format!("first call {}", fmt_dur(first)),
            "< 50 ms",
            verdict(stats.median),
        );
        let first = {
            let start = Instant::now();
            agent
                .record_sessions(&record, Some(20), None)
                .await
                .unwrap();
            start.elapsed()
        };
        let mut samples = Vec::new();
        for _ in 0..reps * 10 {
            let start = Instant::now();
            let (page, next) = agent
                .record_sessions(&record, Some(20), None)
                .await
                .unwrap();
            samples.push(start.elapsed());
            assert_eq!((page.len(), next.is_some()), (20, true));
        }
        let stats = Stats::of(&mut samples);
        row(
            &format!("(c) Agent::record_sessions 1st page, {SESSIONS}"),
            &stats.show(),
            &format!("first call {}", fmt_dur(first)),
            "< 50 ms",
            verdict(stats.median),
        );
        server.stop().await;
    });
}

/// (d) Memory of idle sessions loaded in a registry.
fn idle_sessions(quick: bool) {
    let n = if quick { 2_000 } else { SESSIONS };
    let data = tempfile::tempdir().unwrap();
    write_sessions(data.path(), n);
    let store: Arc<dyn Store> = Arc::new(FsStore::new(data.path()));
    let registry = Registry::new(data.path(), store, Layers::default());
    // Warm up the allocator and the code paths on a few sessions, not counted.
    let ids: Vec<String> = (0..n).map(session_id).collect();
    let (rss, fds) = (resident_bytes(), open_fds());
    let (took, ()) = time(|| {
        for id in &ids {
            registry.open(id, "admin").unwrap();
        }
    });
    assert_eq!(registry.loaded(), n);
    let (rss_after, fds_after) = (resident_bytes(), open_fds());
    let per = rss_after.saturating_sub(rss) as f64 / n as f64;
    row(
        &format!("(d) {n} idle sessions loaded: RSS per session"),
        &format!("{:.1} KiB", per / 1024.0),
        &format!(
            "total {:.1} MiB",
            rss_after.saturating_sub(rss) as f64 / 1048576.0
        ),
        "-",
        "INFO",
    );
    row(
        &format!("(d) {n} idle sessions loaded: fds per session"),
        &format!("{:.2}", (fds_after - fds) as f64 / n as f64),
        &format!("load {} each", fmt_dur(took / n as u32)),
        "-",
        "INFO",
    );
    let (unload, dropped) = time(|| registry.unload_idle(Duration::ZERO));
    assert_eq!(dropped, n);
    println!(
        "    (unloading them: {}; fds afterwards: {})",
        fmt_dur(unload),
        open_fds()
    );
}

/// (e) One backend's figures through the traits (only the artifact writes when
/// `artifacts_only`: the other figures do not touch artifact content).
fn backend_figures(
    name: &str,
    store: Arc<dyn Store>,
    data: &Path,
    quick: bool,
    artifacts_only: bool,
) {
    use monad_server::store::{ArtifactKind, ArtifactMeta};
    let base = 1_780_000_000u64;
    let meta = |i: usize| SessionMeta {
        id: session_id(i),
        name: None,
        owner: "admin".into(),
        created_at: rfc3339(base),
        last_active: rfc3339(base + i as u64),
        provider: None,
        model: None,
        focus: None,
        folders: Vec::new(),
    };
    store.create(&meta(0)).unwrap();
    if !artifacts_only {
        backend_appends(name, &*store, quick);
    }
    // Artifact writes, 4 KiB each.
    let content = vec![b'x'; 4096];
    let n = if quick { 200 } else { 1_000 };
    let mut samples: Vec<Duration> = (0..n)
        .map(|i| {
            let artifact = ArtifactMeta {
                id: format!("a{i}"),
                session: session_id(0),
                kind: ArtifactKind::ToolOutput,
                workspace: Some("primary".into()),
                tool: Some("read_file".into()),
                call_id: Some(format!("c{i}")),
                created_at: rfc3339(base),
                content_type: "application/json".into(),
                size: 4096,
                truncated: false,
                original_size: 4096,
                upload: None,
            };
            time(|| store.put_artifact(&artifact, &content).unwrap()).0
        })
        .collect();
    let stats = Stats::of(&mut samples);
    row(
        &format!("(e) {name}: 4 KiB artifact write x {n}"),
        &stats.show(),
        &format!("mean {}", fmt_dur(stats.mean)),
        "-",
        "INFO",
    );
    if artifacts_only {
        return;
    }
    // The session list with 10,000 sessions (created through the store; not timed).
    let sessions = if quick { 1_000 } else { SESSIONS };
    let (made, ()) = time(|| {
        for i in 1..sessions {
            store.create(&meta(i)).unwrap();
        }
    });
    println!(
        "    ({name}: {sessions} sessions created through the store in {})",
        fmt_dur(made)
    );
    let reps = if quick { 5 } else { 20 };
    let mut all: Vec<Duration> = (0..reps)
        .map(|_| {
            let (d, list) = time(|| store.all_sessions().unwrap());
            assert_eq!(list.len(), sessions);
            d
        })
        .collect();
    let all = Stats::of(&mut all);
    row(
        &format!("(e) {name}: all_sessions, {sessions}"),
        &all.show(),
        "",
        "-",
        "INFO",
    );
    let mut listed: Vec<Duration> = (0..reps)
        .map(|_| {
            let registry = Registry::new(data, store.clone(), Layers::default());
            let (d, list) = time(|| registry.list("admin").unwrap());
            assert_eq!(list.len(), sessions);
            assert_eq!(list[0].id, session_id(sessions - 1), "most recent first");
            d
        })
        .collect();
    let listed = Stats::of(&mut listed);
    row(
        &format!("(e) {name}: Registry::list, {sessions}"),
        &listed.show(),
        "fresh registry",
        "< 50 ms",
        verdict(listed.median),
    );
}

/// (e) History appends to one session.
fn backend_appends(name: &str, store: &dyn Store, quick: bool) {
    let message = |i: usize| HistoryMessage {
        role: HistoryRole::User,
        text: format!("Message {i}. A typical turn of a conversation, a few lines long."),
    };
    let n = if quick { 300 } else { 2_000 };
    let mut samples: Vec<Duration> = (0..n)
        .map(|i| time(|| store.append(&session_id(0), &message(i)).unwrap()).0)
        .collect();
    let stats = Stats::of(&mut samples);
    row(
        &format!("(e) {name}: append x {n}"),
        &stats.show(),
        &format!("mean {}", fmt_dur(stats.mean)),
        "-",
        "INFO",
    );
}

/// (e) The filesystem store and the PostgreSQL store, side by side.
fn backends(quick: bool) {
    let data = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(FsStore::new(data.path()));
    backend_figures("FsStore", store, data.path(), quick, false);
    let cluster = match monad_tests::pg::Cluster::start(monad_tests::pg::Durability::Durable) {
        Ok(cluster) => cluster,
        Err(why) => {
            println!("    (e) PostgreSQL: not run: {why}");
            return;
        }
    };
    let url = cluster.create_database().unwrap();
    let data = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(
        monad_server::store::PgStore::connect(
            &url,
            data.path(),
            Arc::new(monad_server::store::FsBlobs::new(
                &data.path().join("blobs"),
            )),
            monad_server::store::pg::PoolOptions::default(),
        )
        .unwrap(),
    );
    backend_figures("PgStore", store, data.path(), quick, false);
    // PostgreSQL with the artifact content on S3 (an S3-compatible server on loopback).
    let s3 = match monad_tests::s3::S3Server::start() {
        Ok(s3) => s3,
        Err(why) => {
            println!("    (e) PostgreSQL+S3: not run: {why}");
            return;
        }
    };
    let bucket = s3.create_bucket().unwrap();
    let url = cluster.create_database().unwrap();
    let data = tempfile::tempdir().unwrap();
    let blobs = monad_server::store::S3Blobs::connect(
        &bucket.url,
        bucket.vars.clone(),
        monad_server::store::S3Options::default(),
    )
    .unwrap();
    let store: Arc<dyn Store> = Arc::new(
        monad_server::store::PgStore::connect(
            &url,
            data.path(),
            Arc::new(blobs),
            monad_server::store::pg::PoolOptions::default(),
        )
        .unwrap(),
    );
    backend_figures("PgStore+S3", store, data.path(), quick, true);
}

fn main() {
    // Each loaded session holds its workspace's directory open, as in the server.
    if let Ok((_, hard)) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
    {
        let _ =
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard);
    }
    let quick = monad_tests::bench::quick();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "storage bench ({}; data dirs in {})",
        if quick { "quick" } else { "full" },
        std::env::temp_dir().display()
    );
    header();
    let only_backends = std::env::args().any(|a| a == "--backends");
    backends(quick);
    if only_backends {
        return;
    }
    // Memory first, while the process is small and the allocator has not grown for others.
    idle_sessions(quick);
    listings(&rt, quick);
    appends(&rt, quick);
}
