//! Several hosts on one PostgreSQL store: one owner per live session through a lease with a
//! fencing epoch; a former owner's late writes are refused.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use monad_client::approval::{Approver, Decision, ScriptedApprover};
use monad_client::attach::AttachEvent;
use monad_client::config::ClientConfig;
use monad_protocol::wire::{HistoryMessage, HistoryRole};
use monad_server::store::pg::{Host, Lease, PoolOptions};
use monad_server::store::{
    ArtifactKind, ArtifactMeta, ArtifactStore, AuditDecision, AuditOutcome, AuditRecord, Decider,
    FsBlobs, History, PgStore, SessionMeta, SessionStore, StoreError,
};
use monad_tests::{
    Attachment, STEP, ServerProcess, attach_options, call_in, connect_agent, err, folder,
    next_picked, ok, within,
};
use serde_json::json;

use super::pg_store::{Pg, pg_url, psql};

/// A host on the database at `url`: its own data dir, artifact content in `blobs` (shared by
/// the hosts, as an object store would be), leases of `ttl`.
fn host(url: &str, data: &std::path::Path, blobs: &std::path::Path, ttl: Duration) -> PgStore {
    PgStore::connect(
        url,
        data,
        Arc::new(FsBlobs::new(blobs)),
        PoolOptions::default(),
    )
    .expect("the PostgreSQL store connects")
    .with_host(Host::new("127.0.0.1:1", ttl))
}

/// Two hosts on the database at `url`, sharing artifact content, with leases of ten minutes
/// (none expires unless the test makes it); and the directory they keep their files in.
fn two_stores(url: &str) -> (tempfile::TempDir, PgStore, PgStore) {
    let dir = tempfile::tempdir().unwrap();
    let blobs = dir.path().join("objects");
    let ttl = Duration::from_secs(600);
    let one = host(url, &dir.path().join("one"), &blobs, ttl);
    let two = host(url, &dir.path().join("two"), &blobs, ttl);
    (dir, one, two)
}

/// A session `id` of `owner`, made at the start of 2026, never used since.
fn fresh_meta(id: &str, owner: &str) -> SessionMeta {
    SessionMeta {
        id: id.into(),
        name: None,
        owner: owner.into(),
        created_at: "2026-01-01T00:00:00Z".into(),
        last_active: "2026-01-01T00:00:00Z".into(),
        provider: None,
        model: None,
        focus: None,
        folders: Vec::new(),
    }
}

fn message(text: &str) -> HistoryMessage {
    HistoryMessage {
        role: HistoryRole::User,
        text: text.into(),
    }
}

fn audit(call: &str) -> AuditRecord {
    AuditRecord {
        time: "2026-01-01T00:00:01Z".into(),
        call_id: call.into(),
        tool: "read_file".into(),
        workspace: Some("primary".into()),
        target: "a.txt".into(),
        decision: AuditDecision::Allowed,
        decided_by: Decider::Trust,
        outcome: AuditOutcome::Ok,
        duration_ms: 3,
    }
}

fn artifact(id: &str, kind: ArtifactKind) -> ArtifactMeta {
    ArtifactMeta {
        id: id.into(),
        session: "s1".into(),
        kind,
        workspace: None,
        tool: Some("write_file".into()),
        call_id: Some("c1".into()),
        created_at: "2026-01-01T00:00:02Z".into(),
        content_type: "application/json".into(),
        size: 2,
        truncated: false,
        original_size: 2,
        upload: None,
    }
}

fn fenced<T: std::fmt::Debug>(what: &str, result: Result<T, StoreError>) {
    match result {
        Err(StoreError::Fenced { session, .. }) => assert_eq!(session, "s1", "{what}"),
        other => panic!("{what}: the stale owner's write was not fenced: {other:?}"),
    }
}

/// Regression: a host that never took a session's lease (it forwards the session's calls to its
/// holder, and answers its history requests itself) kept a copy of the session loaded, and its
/// saves replaced the whole record: the focus folder the holder had kept since was lost, and a
/// copy saved after the session was deleted made the session again. Such a host's save now
/// only moves the last activity forward, and a deleted session stays deleted.
#[test]
fn a_bystanders_copy_keeps_the_holders_folders_and_does_not_bring_a_deleted_session_back() {
    let Some(url) = pg_url("a_bystanders_copy_keeps_the_holders_folders") else {
        return;
    };
    let (_dir, one, two) = two_stores(&url);
    one.create(&fresh_meta("s1", "ana")).unwrap();
    assert_eq!(one.take_lease("s1").unwrap(), Lease::Held { epoch: 1 });
    let stale = two.load("s1").unwrap().unwrap();

    // The holder keeps a focus; the bystander's copy, loaded before, has none.
    let mut kept = one.load("s1").unwrap().unwrap();
    kept.focus = Some("lap".into());
    kept.last_active = "2026-01-01T00:00:05Z".into();
    one.save(&kept).unwrap();
    let mut touched = stale.clone();
    touched.last_active = "2026-01-01T00:00:09Z".into();
    touched.model = Some("stale".into());
    two.save(&touched).unwrap();
    let now = one.load("s1").unwrap().unwrap();
    assert_eq!(
        now.focus.as_deref(),
        Some("lap"),
        "the holder's focus stays"
    );
    assert_eq!(now.last_active, "2026-01-01T00:00:09Z");
    assert_eq!(now.model, None, "the holder's model stays");
    // An older activity does not move it back.
    two.save(&stale).unwrap();
    assert_eq!(
        one.load("s1").unwrap().unwrap().last_active,
        "2026-01-01T00:00:09Z"
    );
    // A host that released the lease is a bystander too: another may have taken it since.
    one.release_lease("s1").unwrap();
    two.save(&touched).unwrap();
    assert_eq!(
        one.load("s1").unwrap().unwrap().focus.as_deref(),
        Some("lap")
    );

    // Deleted, the session is not made again by a copy's save, by either host.
    one.delete("s1").unwrap();
    for (host, store) in [("the bystander", &two), ("the deleting host", &one)] {
        match store.save(&touched) {
            Err(StoreError::NotFound(_)) => {}
            other => panic!("{host}'s save of a deleted session: {other:?}"),
        }
    }
    assert!(one.load("s1").unwrap().is_none());
}

/// Regression: a session deleted on one host left its directory (its primary workspace, with
/// its files) on every other host that had served it, for good, and a session made again with
/// its id there (seed 001's `default`, by whichever user comes first) found the deleted one's
/// files in its workspace. A create starts from an empty directory, and each host's sweep
/// removes the directories of sessions that no longer exist.
#[test]
fn a_session_deleted_on_one_host_leaves_no_files_on_another() {
    let Some(url) = pg_url("a_session_deleted_on_one_host_leaves_no_files") else {
        return;
    };
    let (dir, one, two) = two_stores(&url);
    one.create(&fresh_meta("s1", "ana")).unwrap();
    one.create(&fresh_meta("s2", "ana")).unwrap();
    // Host two served both sessions: their primary workspaces there hold files.
    for id in ["s1", "s2"] {
        let workspace = dir.path().join(format!("two/sessions/{id}/workspace"));
        std::fs::create_dir_all(&workspace).unwrap();
        std::fs::write(workspace.join("secret.txt"), "ana's\n").unwrap();
    }
    one.delete("s1").unwrap();

    // Made again by another user at host two: an empty workspace.
    two.create(&fresh_meta("s1", "bob")).unwrap();
    let workspace = dir.path().join("two/sessions/s1/workspace");
    assert!(workspace.is_dir());
    assert!(
        !workspace.join("secret.txt").exists(),
        "the deleted session's file is in the new one's workspace"
    );
    two.delete("s1").unwrap();

    // Deleted on host one again: host two's sweep removes its directory, and only that one.
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("secret.txt"), "bob's\n").unwrap();
    assert_eq!(
        two.sweep_session_dirs(Duration::from_secs(3600)).unwrap(),
        0,
        "too recent"
    );
    assert_eq!(two.sweep_session_dirs(Duration::ZERO).unwrap(), 1);
    assert!(!dir.path().join("two/sessions/s1").exists());
    assert!(
        dir.path()
            .join("two/sessions/s2/workspace/secret.txt")
            .exists()
    );
}

/// Regression: a write of a session that waited on a lock (here a table another client held)
/// held its lease row `FOR SHARE` from its fencing check on, and the renewal of that lease, an
/// `UPDATE` of the row, waited behind it: the lease expired while the host was alive and
/// renewing, and the host's other writes of the session were refused as fenced. The check now
/// takes the weaker `FOR KEY SHARE`, which a renewal does not wait for; a take-over still waits
/// for the writes in flight (it locks the row `FOR UPDATE` first).
#[test]
fn a_write_waiting_on_a_lock_holds_up_neither_the_lease_renewal_nor_other_writes() {
    let Some(url) = pg_url("a_write_waiting_on_a_lock_holds_up_neither") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ttl = Duration::from_secs(2);
    let store = Arc::new(host(
        &url,
        &dir.path().join("one"),
        &dir.path().join("objects"),
        ttl,
    ));
    store.create(&fresh_meta("s1", "ana")).unwrap();
    assert_eq!(store.take_lease("s1").unwrap(), Lease::Held { epoch: 1 });
    let database = url.rsplit('/').next().unwrap().to_owned();
    let holder = super::pg_store::hold_table(&database, "messages", 6);
    // A history append checks its lease, then waits on the table.
    let writer = {
        let store = store.clone();
        std::thread::spawn(move || store.append("s1", &message("waits")))
    };
    let waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                   AND query LIKE '%FROM messages%'";
    let start = std::time::Instant::now();
    while psql(&url, waiting) != "1" {
        assert!(
            start.elapsed() < STEP,
            "the append never waited on the table"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The host renews its leases meanwhile, past the lease time.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let renewals = {
        let (store, done) = (store.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                store.renew_leases().unwrap();
                std::thread::sleep(Duration::from_millis(400));
            }
        })
    };
    std::thread::sleep(ttl + Duration::from_secs(1));
    // The session's other writes go on (this one after the append: both lock the session).
    store.audit("s1", &[audit("meanwhile")]).unwrap();
    assert_eq!(store.held_epoch("s1"), Some(1));
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    renewals.join().unwrap();
    holder.join().unwrap().unwrap();
    writer.join().unwrap().unwrap();
}

#[test]
fn a_stale_owners_late_writes_are_refused_after_another_host_took_its_lease_over() {
    let Some(url) = pg_url("a_stale_owners_late_writes_are_refused") else {
        return;
    };
    let (_dir, one, two) = two_stores(&url);
    one.create(&fresh_meta("s1", "ana")).unwrap();

    assert_eq!(one.take_lease("s1").unwrap(), Lease::Held { epoch: 1 });
    match two.take_lease("s1").unwrap() {
        Lease::Elsewhere {
            holder,
            address,
            epoch,
        } => {
            assert_eq!(holder, one.host().id);
            assert_eq!(address, "127.0.0.1:1");
            assert_eq!(epoch, 1);
        }
        held => panic!("a live lease was taken from its holder: {held:?}"),
    }
    // While host one serves the session, another host does not delete it.
    fenced(
        "a delete by a host that does not serve it",
        two.delete("s1"),
    );

    // Host one pauses past its lease's expiry (its clock is the database's); host two takes
    // the session over at a higher epoch and writes.
    psql(
        &url,
        "UPDATE leases SET expires_at = now() - interval '1 second' WHERE session_id = 's1'",
    );
    assert_eq!(two.take_lease("s1").unwrap(), Lease::Held { epoch: 2 });
    two.append("s1", &message("from two")).unwrap();
    two.audit("s1", &[audit("two")]).unwrap();
    two.put_artifact(&artifact("a2", ArtifactKind::ToolOutput), b"[2]")
        .unwrap();
    two.put_artifact(
        &artifact("session_history", ArtifactKind::SessionHistory),
        b"22",
    )
    .unwrap();
    let saved = two.load("s1").unwrap().unwrap();

    // Host one wakes up and writes as if it still owned the session: every write is refused.
    assert_eq!(one.held_epoch("s1"), Some(1), "it has not noticed yet");
    fenced("append", one.append("s1", &message("late")));
    fenced(
        "replace",
        one.replace(
            "s1",
            &History {
                created_at: "2026-01-01T00:00:00Z".into(),
                provider: None,
                model: None,
                messages: vec![message("rewritten")],
            },
        ),
    );
    fenced("audit", one.audit("s1", &[audit("one")]));
    fenced(
        "artifact",
        one.put_artifact(&artifact("a1", ArtifactKind::ToolOutput), b"[1]"),
    );
    fenced(
        "the history snapshot",
        one.put_artifact(
            &artifact("session_history", ArtifactKind::SessionHistory),
            b"11",
        ),
    );
    fenced(
        "delete artifacts",
        one.delete_artifacts("s1", &["a2".to_owned()]),
    );
    let mut meta = saved.clone();
    meta.name = Some("renamed by one".into());
    fenced("save", one.save(&meta));
    fenced("delete", one.delete("s1"));

    // Only host two's writes are there.
    let history = two.history("s1").unwrap();
    let texts: Vec<&str> = history.messages.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(texts, ["from two"]);
    let calls: Vec<String> = two
        .audit_log("s1")
        .unwrap()
        .into_iter()
        .map(|r| r.call_id)
        .collect();
    assert_eq!(calls, ["two"]);
    let ids: Vec<String> = two
        .artifacts("s1")
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert_eq!(ids, ["a2", "session_history"]);
    assert_eq!(two.artifact("s1", "session_history").unwrap().1, b"22");
    assert_eq!(two.load("s1").unwrap().unwrap(), saved);

    // Host one's renewal finds the lease lost and forgets it; host two's keeps its own.
    assert_eq!(one.renew_leases().unwrap(), ["s1"]);
    assert_eq!(one.held_epoch("s1"), None);
    // Having noticed, it is still no bystander: its writes stay refused until it takes the
    // lease again.
    fenced(
        "a write after the renewal found the lease lost",
        one.append("s1", &message("later still")),
    );
    assert!(matches!(
        one.take_lease("s1").unwrap(),
        Lease::Elsewhere { epoch: 2, .. }
    ));
    fenced(
        "a write after finding another host holds it",
        one.audit("s1", &[audit("one again")]),
    );
    assert!(two.renew_leases().unwrap().is_empty());
    assert_eq!(two.held_epoch("s1"), Some(2));
}

#[test]
fn a_released_lease_is_taken_at_once_by_another_host_at_a_higher_epoch() {
    let Some(url) = pg_url("a_released_lease_is_taken_at_once") else {
        return;
    };
    let (_dir, one, two) = two_stores(&url);
    assert_eq!(one.take_lease("s1").unwrap(), Lease::Held { epoch: 1 });
    assert_eq!(
        one.take_lease("s1").unwrap(),
        Lease::Held { epoch: 1 },
        "its holder keeps its epoch"
    );
    one.release_lease("s1").unwrap();
    assert_eq!(one.held_epoch("s1"), None);
    assert_eq!(two.take_lease("s1").unwrap(), Lease::Held { epoch: 2 });
    two.release_leases();
    assert_eq!(one.take_lease("s1").unwrap(), Lease::Held { epoch: 3 });
}

#[test]
fn a_host_is_told_once_of_each_lease_another_host_took_over_and_never_of_one_that_only_expired() {
    let Some(url) = pg_url("a_host_is_told_once_of_each_lease_another_host_took") else {
        return;
    };
    let (_dir, one, two) = two_stores(&url);
    let told = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sink = told.clone();
    one.on_lease_lost(Box::new(move |s| sink.lock().unwrap().push(s.to_owned())));
    for session in ["s1", "s2", "s3", "s4"] {
        assert_eq!(one.take_lease(session).unwrap(), Lease::Held { epoch: 1 });
    }
    // The first host stood still past three of its leases; the second host took two of them.
    psql(
        &url,
        "UPDATE leases SET expires_at = now() WHERE session_id IN ('s1', 's2', 's3')",
    );
    assert_eq!(two.take_lease("s1").unwrap(), Lease::Held { epoch: 2 });
    assert_eq!(two.take_lease("s2").unwrap(), Lease::Held { epoch: 2 });
    // Found by a take (a call for it), then by a renewal; each told once. The lease that only
    // expired is renewed at its epoch, neither lost nor told: nobody else took it (before, it
    // was lost with the others, and after a database outage longer than the lease every
    // session of the host went to whichever host a call reached first).
    assert!(matches!(
        one.take_lease("s2").unwrap(),
        Lease::Elsewhere { .. }
    ));
    let lost = one.renew_leases().unwrap();
    assert_eq!(lost, ["s1"]);
    assert_eq!(*told.lock().unwrap(), ["s2", "s1"]);
    assert_eq!(one.held_epoch("s3"), Some(1));
    assert!(matches!(
        two.take_lease("s3").unwrap(),
        Lease::Elsewhere { .. }
    ));
    assert!(one.renew_leases().unwrap().is_empty());
    assert!(matches!(
        one.take_lease("s2").unwrap(),
        Lease::Elsewhere { .. }
    ));
    assert_eq!(*told.lock().unwrap(), ["s2", "s1"]);
    // Taken over later: told at the next renewal.
    psql(
        &url,
        "UPDATE leases SET expires_at = now() WHERE session_id = 's3'",
    );
    assert_eq!(two.take_lease("s3").unwrap(), Lease::Held { epoch: 2 });
    assert_eq!(one.renew_leases().unwrap(), ["s3"]);
    assert_eq!(*told.lock().unwrap(), ["s2", "s1", "s3"]);
    // A lease given up is not lost.
    one.release_lease("s4").unwrap();
    assert_eq!(two.take_lease("s4").unwrap(), Lease::Held { epoch: 2 });
    assert!(one.renew_leases().unwrap().is_empty());
    assert_eq!(*told.lock().unwrap(), ["s2", "s1", "s3"]);
}

/// Regression: a host renewed its leases through the connections its users' work takes, first
/// come first served: a few slow queries of one user (here, every connection waiting on a
/// table another client holds) delayed the renewal past the lease time, and every session of
/// the host went to another. The renewal has a connection of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hosts_renewal_does_not_wait_behind_its_users_work() {
    let Some(url) = pg_url("a_hosts_renewal_does_not_wait_behind_its_users_work") else {
        return;
    };
    let (_dir, one, _two) = two_stores(&url);
    let one = Arc::new(one);
    assert_eq!(one.take_lease("s1").unwrap(), Lease::Held { epoch: 1 });
    let (database, holder) = super::pg_store::holding(&url, "sessions", 4).await;
    // Every connection of the pool (8) waits on the table.
    let mut loads = tokio::task::JoinSet::new();
    for i in 0..8 {
        let one = one.clone();
        loads.spawn_blocking(move || one.load(&format!("user-{i}")));
    }
    super::pg_store::steadily_waiting_on_locks(&database, 8, "the pool's every connection waits")
        .await;
    let renewed = within(
        Duration::from_secs(2),
        "the renewal while the users' work waits",
        tokio::task::spawn_blocking({
            let one = one.clone();
            move || one.renew_leases()
        }),
    )
    .await
    .unwrap();
    assert_eq!(renewed.unwrap(), Vec::<String>::new());
    while let Some(load) = within(STEP, "the loads", loads.join_next()).await {
        load.unwrap().unwrap();
    }
    let _ = tokio::task::spawn_blocking(move || holder.join()).await;
}

#[test]
fn a_restarted_server_takes_its_own_live_leases_over_at_once_and_fences_its_former_process() {
    let Some(url) = pg_url("a_restarted_server_takes_its_own_live_leases") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let machine = Host::machine_id(&data).unwrap();
    assert_eq!(
        Host::machine_id(&data).unwrap(),
        machine,
        "kept in the data dir"
    );
    let process = |ttl| {
        PgStore::connect(
            &url,
            &data,
            Arc::new(FsBlobs::new(&dir.path().join("objects"))),
            PoolOptions::default(),
        )
        .unwrap()
        .with_host(Host::of_machine(&machine, "127.0.0.1:1", ttl))
    };
    let before = process(Duration::from_secs(600));
    let other = host(
        &url,
        &dir.path().join("other"),
        &dir.path().join("objects"),
        Duration::from_secs(600),
    );
    before.create(&fresh_meta("s1", "ana")).unwrap();
    assert_eq!(before.take_lease("s1").unwrap(), Lease::Held { epoch: 1 });
    assert!(matches!(
        other.take_lease("s1").unwrap(),
        Lease::Elsewhere { epoch: 1, .. }
    ));
    // The next process of the same data dir (the first one died; the data dir's lock lets only
    // one run) does not wait for the lease to expire.
    let after = process(Duration::from_secs(600));
    assert_eq!(after.take_lease("s1").unwrap(), Lease::Held { epoch: 2 });
    after.append("s1", &message("after the restart")).unwrap();
    fenced(
        "the former process",
        before.append("s1", &message("from the past")),
    );
    let texts: Vec<String> = after
        .history("s1")
        .unwrap()
        .messages
        .into_iter()
        .map(|m| m.text)
        .collect();
    assert_eq!(texts, ["after the restart"]);
}

/// A session both hosts serve in the tests below.
const SESSION: &str = "4b7f3d2e-9c1a-4e5b-8f6d-2a3b4c5d6e7f";

/// Starts a `monad-server` process on the database of `pg` with the hosts' `secret`, leases of
/// `lease_secs`, and the certificate of `tls` (another host's data dir) when given: hosts of one
/// store share `tls/`.
async fn start_host(
    pg: &Pg,
    data: &Path,
    secret: &str,
    lease_secs: u64,
    tls: Option<&Path>,
) -> ServerProcess {
    start_host_env(pg, data, secret, lease_secs, tls, None, &[]).await
}

/// [`start_host`], with MCP over HTTP on `http` when given and the environment variables
/// `extra` besides.
async fn start_host_env(
    pg: &Pg,
    data: &Path,
    secret: &str,
    lease_secs: u64,
    tls: Option<&Path>,
    http: Option<std::net::SocketAddr>,
    extra: &[(&str, &str)],
) -> ServerProcess {
    if let Some(from) = tls {
        std::fs::create_dir_all(data.join("tls")).unwrap();
        for file in ["cert.pem", "key.pem"] {
            std::fs::copy(from.join("tls").join(file), data.join("tls").join(file)).unwrap();
        }
    }
    let mut env = pg.env();
    env.push(("MONAD_CLUSTER_SECRET".into(), secret.into()));
    env.push(("MONAD_CLUSTER_LEASE_SECS".into(), lease_secs.to_string()));
    env.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    let envs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    match http {
        Some(http) => ServerProcess::start_with_http(data, &envs, http).await,
        None => ServerProcess::start(data, &envs).await,
    }
}

/// Two hosts of one store with the hosts' secret and leases of `lease_secs`: the first, and a
/// second sharing its certificate (hosts of one store share `tls/`); with the first start's
/// token, and their data dirs (kept for as long as the hosts run).
async fn two_hosts(
    pg: &Pg,
    lease_secs: u64,
) -> (ServerProcess, ServerProcess, String, [tempfile::TempDir; 2]) {
    let dirs = [dir(), dir()];
    let first = start_host(pg, dirs[0].path(), "the-hosts-secret", lease_secs, None).await;
    let second = start_host(
        pg,
        dirs[1].path(),
        "the-hosts-secret",
        lease_secs,
        Some(dirs[0].path()),
    )
    .await;
    let token = first
        .first_token
        .clone()
        .expect("the first host's first start");
    (first, second, token, dirs)
}

/// Attaches `laptop` to `SESSION` at the host `config` names, restricted, with `approver`.
async fn attach_laptop(
    config: &ClientConfig,
    laptop: &Path,
    approver: &Arc<ScriptedApprover>,
) -> Attachment {
    let mut options = attach_options(laptop, "lap");
    options.session = Some(SESSION.into());
    Attachment::start(config, options, Some(approver.clone() as Arc<dyn Approver>)).await
}

/// A laptop's folder holding `notes.txt`, attached as `lap` to `SESSION` at the host `config`
/// names (bounded), its user allowing `answers` calls once each: the folder (keep it) and the
/// attachment.
async fn notes_laptop_at(config: &ClientConfig, answers: usize) -> (tempfile::TempDir, Attachment) {
    let laptop = folder(&[("notes.txt", "written on the laptop\n")]);
    let approver = Arc::new(ScriptedApprover::new(vec![
        Some(Decision::AllowOnce);
        answers
    ]));
    let attached = within(
        STEP,
        "the laptop's attach",
        attach_laptop(config, laptop.path(), &approver),
    )
    .await;
    assert_eq!(attached.session, SESSION);
    (laptop, attached)
}

/// Hosts A and B on `pg` (in `dirs`, leases of 2 s, one certificate), B advertising `address`
/// to laptops and hosts, or A's own address when none is given: a host that names a wrong
/// place for itself.
async fn hosts_b_advertising(
    pg: &Pg,
    dirs: &[tempfile::TempDir; 2],
    address: Option<&str>,
) -> (ServerProcess, ServerProcess) {
    let a = start_host(pg, dirs[0].path(), "the-hosts-secret", 2, None).await;
    let address = address.map_or_else(|| a.addr.to_string(), str::to_owned);
    let b = start_host_env(
        pg,
        dirs[1].path(),
        "the-hosts-secret",
        2,
        Some(dirs[0].path()),
        None,
        &[("MONAD_ADVERTISE", address.as_str())],
    )
    .await;
    (a, b)
}

/// A second laptop's folder (`other.txt`), attached as `other` to `SESSION` at the host
/// `config` names, in a task of its own: the folder (keep it), the task, and its events.
fn second_laptop(
    config: &ClientConfig,
    approver: Option<Arc<dyn Approver>>,
) -> (
    tempfile::TempDir,
    tokio::task::JoinHandle<Result<(), monad_client::ClientError>>,
    tokio::sync::mpsc::UnboundedReceiver<AttachEvent>,
) {
    let other = folder(&[("other.txt", "another laptop\n")]);
    let mut options = attach_options(other.path(), "other");
    options.session = Some(SESSION.into());
    let (tx, events) = tokio::sync::mpsc::unbounded_channel();
    let config = config.clone();
    let task = tokio::spawn(async move {
        monad_client::attach::attach(&config, options, approver, Some(tx)).await
    });
    (other, task, events)
}

/// Sends `request` on a stream of its own over `conn`, finished, and reads the answer (bounded).
async fn ask(
    conn: &quinn::Connection,
    request: &monad_protocol::wire::Message,
    what: &str,
) -> Option<monad_protocol::wire::Message> {
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    monad_protocol::io::write_message(&mut send, request)
        .await
        .unwrap();
    send.finish().unwrap();
    within(
        STEP,
        what,
        monad_protocol::io::read_message(&mut recv, 64 * 1024),
    )
    .await
    .unwrap()
}

fn read_notes() -> serde_json::Value {
    json!({"path": "notes.txt", "workspace": "lap"})
}

fn dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// Waits (bounded) until `sql`, run in the database of `pg`, says `t`.
async fn until_true(pg: &Pg, what: &str, sql: &str) {
    within(STEP, what, async {
        while psql(&pg.url, sql) != "t" {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
}

/// Waits (bounded) until the shared store's audit holds `count` calls of `tool` in `SESSION`.
async fn until_audited(pg: &Pg, what: &str, count: usize, tool: &str) {
    let sql = format!(
        "SELECT count(*) = {count} FROM audit WHERE session_id = '{SESSION}'
         AND record LIKE '%{tool}%'"
    );
    until_true(pg, what, &sql).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_on_one_host_reads_a_file_on_a_laptop_attached_to_another() {
    let Some(pg) = Pg::alone("an_agent_on_one_host_reads_a_file_on_a_laptop_attached") else {
        return;
    };
    let (b, a, token, dirs) = two_hosts(&pg, 10).await;
    let (data_b, data_c) = (&dirs[0], dir());
    assert_eq!(
        a.fingerprint, b.fingerprint,
        "the hosts share one certificate"
    );

    let laptop = folder(&[("notes.txt", "written on the laptop\n")]);
    let approver = Arc::new(ScriptedApprover::new([Some(Decision::AllowOnce)]));
    let _attached = attach_laptop(&b.client_config(&token), laptop.path(), &approver).await;

    // The agent reaches host A; the laptop is on host B: the call goes there, is approved on
    // the laptop, and the content comes back.
    let agent = connect_agent(&a.client_config(&token)).await;
    let (result, workspace) = ok(call_in(&agent, Some(SESSION), "read_file", read_notes()).await);
    assert_eq!(workspace, "lap");
    assert!(
        result.to_string().contains("written on the laptop"),
        "{result}"
    );
    let asked = approver.seen();
    assert_eq!(
        asked.len(),
        1,
        "the laptop's user was asked once: {asked:?}"
    );
    // Host B recorded it (its audit, in the shared store).
    until_audited(&pg, "the forwarded call to be recorded", 1, "read_file").await;
    // The session's workspaces, answered by host B, say what network each one's commands get
    // (host B heard the forwarding host say minor 0; host A's agent speaks the newest).
    let (listed, _) = ok(call_in(&agent, Some(SESSION), "workspaces", json!({})).await);
    let networks: Vec<&str> = listed["workspaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["network"].as_str().unwrap_or("(missing)"))
        .collect();
    assert_eq!(networks, ["no network", "no network"], "{listed}");

    // A conversation runs where its session is served: a prompt at host A is refused, naming
    // host B (it ran on A, its calls in A's primary workspace, away from the laptop).
    let refused = within(
        STEP,
        "the prompt's refusal",
        agent.prompt(Some(SESSION), "what do the notes say?", |_| {}),
    )
    .await
    .expect_err("a prompt where the session is not served is refused")
    .to_string();
    assert!(
        refused.contains("is served by the host at") && refused.contains(SESSION),
        "{refused}"
    );
    assert_eq!(approver.seen().len(), 1, "nothing more reached the laptop");

    // A host with another secret cannot forward: host B refuses it, and the agent is told.
    let c = start_host(
        &pg,
        data_c.path(),
        "not-the-hosts-secret",
        10,
        Some(data_b.path()),
    )
    .await;
    let agent_c = connect_agent(&c.client_config(&token)).await;
    let refused = within(
        STEP,
        "the refusal",
        agent_c.call(Some(SESSION), "read_file", read_notes(), |_| {}),
    )
    .await
    .expect_err("host B refuses a host with another secret")
    .to_string();
    assert!(
        refused.contains(SESSION)
            && refused.contains("owner host")
            && refused.contains("refused")
            && refused.contains("secret"),
        "{refused}"
    );
    assert_eq!(approver.seen().len(), 1, "nothing reached the laptop");
}

/// Regression: a host connected to another host holding the lock on all its connections to
/// hosts, so while it tried one that does not answer (a host gone, its lease not expired yet:
/// up to the 3 s connect time-out each try), every call it forwarded to any other host waited.
/// A call forwarded to a host that answers goes on while another waits on a silent one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_does_not_answer_holds_up_no_call_forwarded_to_another() {
    let Some(pg) = Pg::alone("a_host_that_does_not_answer_holds_up_no_call_forwarded") else {
        return;
    };
    let (b, a, token, _dirs) = two_hosts(&pg, 10).await;
    let (_laptop, _attached) = notes_laptop_at(&b.client_config(&token), 0).await;
    let agent = connect_agent(&a.client_config(&token)).await;
    // Forwarded to host B once: its connection is made and kept.
    ok(call_in(&agent, Some(SESSION), "workspaces", json!({})).await);
    // Session `dark`, served (says its lease) by a host that does not answer.
    const DARK: &str = "0d0d0d0d-0000-4000-8000-000000000001";
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let address = silent.local_addr().unwrap().to_string();
    psql(
        &pg.url,
        &format!(
            "INSERT INTO sessions (id, owner, created_at, last_active, history_created_at)
             SELECT '{DARK}', owner, created_at, last_active, history_created_at
             FROM sessions WHERE id = '{SESSION}';
             INSERT INTO leases (session_id, holder, address, epoch, expires_at)
             VALUES ('{DARK}', 'gone', '{address}', 1, now() + interval '1 hour')"
        ),
    );
    let waiting = {
        let agent = connect_agent(&a.client_config(&token)).await;
        tokio::spawn(async move {
            agent
                .call(Some(DARK), "workspaces", json!({}), |_| {})
                .await
        })
    };
    // Its connect under way (it waits 3 s), a call for the session host B serves: it waited
    // for the end of that connect (about 2.7 s from here) before.
    tokio::time::sleep(Duration::from_millis(300)).await;
    ok(within(
        Duration::from_millis(2_200),
        "a call forwarded to host B while another waits on a silent host",
        agent.call(Some(SESSION), "workspaces", json!({}), |_| {}),
    )
    .await
    .unwrap());
    let dark = within(STEP, "the call for the silent host's session", waiting)
        .await
        .unwrap();
    let said = match dark {
        Ok(reply) => match reply.outcome {
            monad_protocol::wire::Outcome::Error { error } => error.message,
            other => panic!("{other:?}"),
        },
        Err(e) => e.to_string(),
    };
    assert!(
        said.contains(DARK) && said.contains("unreachable"),
        "{said}"
    );
}

/// Regression: each host signed page tokens with a random key of its own, so behind a load
/// balancer a `nextToken` sent to another host of the deployment was refused (`400`, "not a
/// page token this server gave"). Hosts of one `[cluster] secret` share the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_token_one_host_gave_is_good_at_another() {
    let Some(pg) = Pg::alone("a_page_token_one_host_gave_is_good_at_another") else {
        return;
    };
    let free = || {
        let free = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        free.local_addr().expect("its address")
    };
    let dirs = [dir(), dir()];
    let secret = "the-hosts-secret";
    let a = start_host_env(&pg, dirs[0].path(), secret, 10, None, Some(free()), &[]).await;
    let b = start_host_env(
        &pg,
        dirs[1].path(),
        secret,
        10,
        Some(dirs[0].path()),
        Some(free()),
        &[],
    )
    .await;
    let token = a.first_token.clone().expect("the first host's first start");
    let agent = connect_agent(&a.client_config(&token)).await;
    for session in [SESSION, "0e0e0e0e-0000-4000-8000-000000000002"] {
        ok(call_in(&agent, Some(session), "workspaces", json!({})).await);
    }
    let at_a = super::web::Api::new(a.http.expect("HTTP on host A"), &token);
    let at_b = super::web::Api::new(b.http.expect("HTTP on host B"), &token);
    let first = at_a.get("/api/v1/sessions?limit=1").await;
    assert_eq!(first.status, 200, "{}", first.text());
    let next = first.json()["nextToken"]
        .as_str()
        .expect("a next page")
        .to_owned();
    let second = at_b
        .get(&format!("/api/v1/sessions?limit=1&nextToken={next}"))
        .await;
    assert_eq!(second.status, 200, "{}", second.text());
}

/// Regression: a background process started through a call forwarded to the host serving the
/// session outlived its token's revocation (the host it ran on was given no token; the host
/// that had it noted only what ran on itself). Revoked, it ends; another token's goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_tokens_process_started_through_another_host_ends() {
    let Some(pg) = Pg::alone("a_revoked_tokens_process_started_through_another_host") else {
        return;
    };
    let (b, a, kept, dirs) = two_hosts(&pg, 10).await;
    let (_laptop, _attached) = notes_laptop_at(&b.client_config(&kept), 0).await;
    let mut create = monad_tests::command("monad-server");
    create
        .envs(pg.env())
        .arg("--data-dir")
        .arg(dirs[1].path())
        .args(["token", "create"]);
    let out = within(STEP, "`token create`", create.output())
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    let leaked = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("MONAD_TOKEN="))
        .unwrap_or_else(|| panic!("a token in {line}"))
        .to_owned();

    // Both agents reach host A; the session is served by host B (the laptop is there), so
    // their commands in its primary workspace run on B.
    let intruder = connect_agent(&a.client_config(&leaked)).await;
    let owner = connect_agent(&a.client_config(&kept)).await;
    let primary = format!("server:/sessions/{SESSION}");
    let loop_args = |file: &str| {
        json!({
            "argv": ["sh", "-c", format!("while true; do echo x >> {file}; sleep 0.1; done")],
            "background": true,
            "workspace": primary,
        })
    };
    let start = |agent, file| call_in(agent, Some(SESSION), "run_command", loop_args(file));
    let (theirs, _) = ok(start(&intruder, "theirs.txt").await);
    let (mine, _) = ok(start(&owner, "mine.txt").await);
    let running = monad_tests::process_running;
    let list = || {
        call_in(
            &owner,
            Some(SESSION),
            "process_list",
            json!({"workspace": primary}),
        )
    };
    let (listing, _) = ok(list().await);
    assert!(
        running(&listing, &theirs["process"]) && running(&listing, &mine["process"]),
        "{listing}"
    );
    until_audited(&pg, "host B to have run the loops", 2, "run_command").await;

    let id = leaked.split('_').nth(1).expect("mnd_ID_SECRET");
    psql(&pg.url, &format!("DELETE FROM tokens WHERE id = '{id}'"));
    within(STEP, "the revoked token's loop to end", async {
        loop {
            let (listing, _) = ok(list().await);
            if !running(&listing, &theirs["process"]) {
                assert!(running(&listing, &mine["process"]), "{listing}");
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    let kill = json!({"process": mine["process"], "signal": "KILL", "workspace": primary});
    ok(call_in(&owner, Some(SESSION), "process_kill", kill).await);
}

/// An MCP host that names its session in `initialize`.
#[derive(Debug, Clone)]
struct McpHost;

impl rmcp::ClientHandler for McpHost {
    fn get_info(&self) -> rmcp::model::InitializeRequestParams {
        let mut info = rmcp::model::InitializeRequestParams::default();
        let mut meta = rmcp::model::RequestMetaObject::new();
        meta.insert("sessionId".into(), SESSION.into());
        info.meta = Some(meta);
        info
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_host_on_one_host_reads_a_file_on_a_laptop_attached_to_another() {
    use rmcp::ServiceExt;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

    let Some(pg) = Pg::alone("an_mcp_host_on_one_host_reads_a_file") else {
        return;
    };
    let (data_a, data_b) = (dir(), dir());
    let b = start_host(&pg, data_b.path(), "the-hosts-secret", 10, None).await;
    let free = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let http = free.local_addr().expect("its address");
    drop(free);
    let _a = start_host_env(
        &pg,
        data_a.path(),
        "the-hosts-secret",
        10,
        Some(data_b.path()),
        Some(http),
        &[],
    )
    .await;
    let token = b.first_token.clone().expect("the first host's first start");
    let laptop = folder(&[("notes.txt", "written on the laptop\n")]);
    let approver = Arc::new(ScriptedApprover::new([Some(Decision::AllowOnce)]));
    let _attached = attach_laptop(&b.client_config(&token), laptop.path(), &approver).await;

    let config = StreamableHttpClientTransportConfig::with_uri(format!("http://{http}/mcp"))
        .auth_header(token);
    let http_client = monad_server::llm::http_client_builder()
        .expect("TLS set up")
        .build()
        .expect("an HTTP client");
    let transport = StreamableHttpClientTransport::with_client(http_client, config);
    let client = within(STEP, "initialize over HTTP", McpHost.serve(transport))
        .await
        .expect("host A's /mcp answers");
    let params = rmcp::model::CallToolRequestParams::new("read_file")
        .with_arguments(read_notes().as_object().cloned().unwrap_or_default());
    let result = within(STEP, "tools/call", client.call_tool(params))
        .await
        .expect("tools/call answers");
    let shown = serde_json::to_string(&result.content).unwrap();
    assert_ne!(result.is_error, Some(true), "{shown}");
    assert!(shown.contains("written on the laptop"), "{shown}");
    assert_eq!(approver.seen().len(), 1, "the laptop's user was asked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_owner_host_is_killed_another_takes_its_sessions_over_with_nothing_lost() {
    let Some(pg) = Pg::alone("when_the_owner_host_is_killed") else {
        return;
    };
    let (b, a, token, _dirs) = two_hosts(&pg, 1).await;
    let laptop = folder(&[("notes.txt", "written on the laptop\n")]);
    let approver = Arc::new(ScriptedApprover::new([
        Some(Decision::AllowOnce),
        Some(Decision::AllowOnce),
    ]));
    // The laptop's config: one device, whichever host it reaches.
    let laptop_config = b.client_config(&token);
    let attached = attach_laptop(&laptop_config, laptop.path(), &approver).await;

    // Through host A, served by host B: a read, a write (a diff artifact), a history message.
    let agent = connect_agent(&a.client_config(&token)).await;
    ok(call_in(&agent, Some(SESSION), "read_file", read_notes()).await);
    ok(call_in(
        &agent,
        Some(SESSION),
        "write_file",
        json!({"path": "notes.txt", "content": "changed\n", "workspace": "lap"}),
    )
    .await);
    within(
        STEP,
        "a history append",
        agent.history_append(
            Some(SESSION),
            HistoryMessage {
                role: HistoryRole::User,
                text: "before the kill".into(),
            },
        ),
    )
    .await
    .unwrap();
    until_true(
        &pg,
        "both calls and the diff to be recorded",
        &format!(
            "SELECT (SELECT count(*) FROM audit WHERE session_id = '{SESSION}') = 2
                AND (SELECT count(*) FROM artifacts WHERE session_id = '{SESSION}'
                     AND meta LIKE '%file_diff%') = 1"
        ),
    )
    .await;
    let holder_b = lease_of_session(&pg);

    // Host B dies. Until its lease expires, the session is nobody's to serve; then the laptop
    // attaches to host A, which takes the session over at a higher epoch.
    b.kill().await;
    drop(attached);
    until_true(
        &pg,
        "host B's lease to expire",
        &format!("SELECT expires_at <= now() FROM leases WHERE session_id = '{SESSION}'"),
    )
    .await;
    let approver = Arc::new(ScriptedApprover::new([Some(Decision::AllowOnce)]));
    let _attached = attach_laptop(&a.retarget(&laptop_config), laptop.path(), &approver).await;
    assert_taken_over(&holder_b, &lease_of_session(&pg));

    // Calls work again, and what was written before the kill is all there.
    let (result, _) = ok(call_in(&agent, Some(SESSION), "read_file", read_notes()).await);
    assert!(result.to_string().contains("changed"), "{result}");
    let (_, history) = within(STEP, "the history", agent.history(Some(SESSION)))
        .await
        .unwrap();
    let texts: Vec<&str> = history.messages.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(texts, ["before the kill"]);
    until_true(
        &pg,
        "the audit to hold the calls of both hosts",
        &format!(
            "SELECT (SELECT count(*) FROM audit WHERE session_id = '{SESSION}') = 3
                AND (SELECT count(*) FROM artifacts WHERE session_id = '{SESSION}'
                     AND meta LIKE '%file_diff%') = 1"
        ),
    )
    .await;
}

/// Regression: a host that took a session over (its holder died) worked on the copy it had
/// loaded before, while it only forwarded the session's calls: the focus folder the holder had
/// kept since was not there, so a write that names no workspace ran in the primary workspace
/// rather than being refused while the focus is offline, and the copy was saved over the
/// record. The host reads the record again when it takes the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_taking_a_session_over_works_on_its_record_not_on_an_older_copy() {
    let Some(pg) = Pg::alone("a_host_taking_a_session_over_works_on_its_record") else {
        return;
    };
    let (a, b, token, dirs) = two_hosts(&pg, 1).await;
    let agent_a = connect_agent(&a.client_config(&token)).await;
    let agent_b = connect_agent(&b.client_config(&token)).await;
    // Host A serves the session; host B forwards a call there, and keeps a copy loaded.
    ok(call_in(&agent_a, Some(SESSION), "workspaces", json!({})).await);
    ok(call_in(&agent_b, Some(SESSION), "workspaces", json!({})).await);

    // A folder attached at host A becomes the focus, kept in the record; then goes offline.
    let laptop = folder(&[("notes.txt", "on the laptop\n")]);
    let mut options = attach_options(laptop.path(), "lap");
    options.session = Some(SESSION.into());
    options.focus = true;
    let attached = within(
        STEP,
        "the laptop's attach",
        Attachment::start(&a.client_config(&token), options, None),
    )
    .await;
    until_true(
        &pg,
        "the focus to be kept",
        &format!("SELECT kept LIKE '%lap%' FROM sessions WHERE id = '{SESSION}'"),
    )
    .await;
    drop(attached);

    // Host A dies; once its lease expired, host B takes the session over.
    a.kill().await;
    until_true(
        &pg,
        "host A's lease to expire",
        &format!("SELECT expires_at <= now() FROM leases WHERE session_id = '{SESSION}'"),
    )
    .await;
    let error = err(call_in(
        &agent_b,
        Some(SESSION),
        "write_file",
        json!({"path": "new.txt", "content": "x"}),
    )
    .await);
    assert!(
        error.message.contains("lap"),
        "refused while the focus is offline: {error}"
    );
    assert!(
        !dirs[1]
            .path()
            .join(format!("sessions/{SESSION}/workspace/new.txt"))
            .exists()
    );
    b.stop().await;
    assert_eq!(
        psql(
            &pg.url,
            &format!("SELECT kept LIKE '%lap%' FROM sessions WHERE id = '{SESSION}'")
        ),
        "t",
        "the record keeps its focus"
    );
}

/// The live lease of `SESSION`, as `holder epoch`.
fn lease_of_session(pg: &Pg) -> String {
    psql(
        &pg.url,
        &format!(
            "SELECT holder || ' ' || epoch FROM leases
             WHERE session_id = '{SESSION}' AND expires_at > now()"
        ),
    )
}

/// Asserts that the lease `after` (`holder epoch`, [`lease_of_session`]) is another host's
/// than `before`, at a higher epoch.
fn assert_taken_over(before: &str, after: &str) {
    let (old, new) = (
        before.split_once(' ').expect("a lease"),
        after.split_once(' ').expect("a lease"),
    );
    assert_ne!(old.0, new.0, "another host holds it: {before} then {after}");
    assert!(
        new.1.parse::<i64>().unwrap() > old.1.parse::<i64>().unwrap(),
        "{before} then {after}"
    );
}

/// A host that holds a session only because an agent's calls ran there gives it up to a laptop
/// attaching at another host: the attach goes through at once (it waited out the lease and was
/// refused, since the idle session stays in its host's memory for hours, renewed), and the
/// agent's next calls reach the folder through the host it attached to. A host where a folder
/// is attached keeps its session: a second laptop attaching elsewhere is sent there at once,
/// told why, and attaches there (before, it was refused and tried again, at the one host its
/// config names, until the other let go); a client of an older protocol minor is refused,
/// told where and why. An agent's own connection cannot ask a host to give a session up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_only_ran_an_agents_calls_gives_the_session_up_to_a_laptop_attaching_elsewhere()
{
    let Some(pg) = Pg::alone("a_host_that_only_ran_an_agents_calls_gives_the_session_up") else {
        return;
    };
    // Leases of 60 s: waiting one out would take longer than any step of the test may.
    let (a, b, token, _dirs) = two_hosts(&pg, 60).await;

    // An agent's call on host A, in the session's primary workspace: A serves the session.
    let agent = connect_agent(&a.client_config(&token)).await;
    ok(call_in(&agent, Some(SESSION), "list_dir", json!({"path": "."})).await);
    let before = lease_of_session(&pg);
    assert!(!before.is_empty(), "host A holds the session's lease");

    // A laptop attaches at host B: A gives the session up, and B takes it at a higher epoch.
    let (_laptop, attached) = notes_laptop_at(&b.client_config(&token), 2).await;
    let after = lease_of_session(&pg);
    assert_taken_over(&before, &after);

    // The agent, still on host A, reads the laptop's file: forwarded to B, approved there.
    let (result, workspace) = ok(call_in(&agent, Some(SESSION), "read_file", read_notes()).await);
    assert_eq!(workspace, "lap");
    assert!(
        result.to_string().contains("written on the laptop"),
        "{result}"
    );

    // A second laptop whose config names host A only: B keeps the session (a folder is attached
    // there) and says so at once; A sends the laptop to B, where it attaches.
    let approver = Arc::new(ScriptedApprover::new([Some(Decision::AllowOnce)]));
    let (_other, mut second, mut events) = second_laptop(
        &a.client_config(&token),
        Some(approver as Arc<dyn Approver>),
    );
    let mut sent = None;
    let server = next_picked(
        &mut events,
        &mut second,
        "the second laptop's attach",
        |event| match event {
            AttachEvent::Elsewhere { host, reason } => {
                sent = Some((host, reason));
                None
            }
            AttachEvent::Attached {
                session, server, ..
            } => {
                assert_eq!(session, SESSION);
                Some(server)
            }
            AttachEvent::Disconnected { reason, .. } => {
                panic!("the second laptop did not attach: {reason}")
            }
            _ => None,
        },
    )
    .await;
    assert_eq!(server, b.addr.to_string(), "attached through host B");
    let (host, reason) = sent.expect("told where the session is served");
    assert_eq!(host, b.addr.to_string());
    assert!(
        reason.contains(SESSION) && reason.contains("a folder is attached to it"),
        "{reason}"
    );
    assert_eq!(lease_of_session(&pg), after, "host B still holds it");
    // The agent on host A reads the second laptop's file, forwarded to B.
    let (result, workspace) = ok(call_in(
        &agent,
        Some(SESSION),
        "read_file",
        json!({"path": "other.txt", "workspace": "other"}),
    )
    .await);
    assert_eq!(workspace, "other");
    assert!(result.to_string().contains("another laptop"), "{result}");
    second.abort();

    // A client of the previous protocol minor, which does not know where to go, is refused at
    // once, with the host named (it tries again until B lets go).
    let (_endpoint, older, _) = monad_tests::connect_speaking(
        &a.client_config(&token),
        monad_protocol::wire::Role::Client,
        monad_protocol::wire::ELSEWHERE_MINOR - 1,
    )
    .await;
    let attach = monad_protocol::wire::Message::Attach {
        id: 1,
        session: Some(SESSION.into()),
        name: Some("old".into()),
        path: "/old".into(),
        trust: monad_protocol::wire::Trust::Restricted,
        tools: Vec::new(),
        focus: false,
        folder: None,
        exact_name: false,
        network: None,
    };
    match ask(&older, &attach, "the answer to an older client's attach").await {
        Some(monad_protocol::wire::Message::Error { error, .. }) => {
            assert_eq!(
                error.code,
                monad_protocol::ErrorCode::WorkspaceDisconnected,
                "{error:?}"
            );
            assert!(
                error.message.contains(&b.addr.to_string())
                    && error.message.contains("a folder is attached to it"),
                "{error:?}"
            );
        }
        other => panic!("an older client's attach answered {other:?}"),
    }
    assert_eq!(lease_of_session(&pg), after, "host B still holds it");

    // An agent's own connection asking host B to give the session up is refused.
    let own = connect_agent(&b.client_config(&token)).await;
    let request = monad_protocol::wire::Message::Yield {
        id: 7,
        session: SESSION.into(),
    };
    match ask(own.quic(), &request, "the answer to an agent's yield").await {
        Some(monad_protocol::wire::Message::Error { id: 7, error }) => {
            assert_eq!(error.code, monad_protocol::ErrorCode::Denied, "{error:?}");
        }
        other => panic!("an agent's yield answered {other:?}"),
    }
    let (result, _) = ok(call_in(&agent, Some(SESSION), "read_file", read_notes()).await);
    assert!(result.to_string().contains("written on the laptop"));
    assert_eq!(lease_of_session(&pg), after, "host B still holds it");
    drop(attached);
}

/// A laptop sent to the host that keeps its session, at an address where it finds another
/// certificate (that host advertises an address the laptop cannot use: here another server's),
/// does not give up: it says where it could not attach, and goes on with the hosts its config
/// names, with its back-off. (A fingerprint mismatch ends an attach to a host of the config:
/// that host is the one the user logged in to.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_laptop_sent_to_a_host_it_cannot_use_goes_on_with_the_hosts_it_knows() {
    let Some(pg) = Pg::alone("a_laptop_sent_to_a_host_it_cannot_use") else {
        return;
    };
    // Another deployment's server, with a certificate of its own, where host B says it is.
    let stranger = monad_tests::TestServer::start().await;
    let stranger_addr = stranger.addr.to_string();
    let dirs = [dir(), dir()];
    let (a, b) = hosts_b_advertising(&pg, &dirs, Some(&stranger_addr)).await;
    let token = a.first_token.clone().expect("the first host's first start");

    // A laptop attached at host B: B keeps the session.
    let laptop = folder(&[("notes.txt", "written on the laptop\n")]);
    let approver = Arc::new(ScriptedApprover::new([Some(Decision::AllowOnce)]));
    let _attached = attach_laptop(&b.client_config(&token), laptop.path(), &approver).await;

    // A second laptop whose config names host A: A cannot ask B (it is not where B says), waits
    // B's lease out, and sends the laptop to B's advertised address, where it finds another
    // certificate.
    let (_other, mut second, mut events) = second_laptop(&a.client_config(&token), None);
    let failed = next_picked(
        &mut events,
        &mut second,
        "the attempt at B's address",
        |event| match event {
            AttachEvent::Disconnected { reason, .. } if reason.starts_with("cannot attach at") => {
                Some(reason)
            }
            AttachEvent::Attached { server, .. } => {
                panic!("the second laptop attached through {server}")
            }
            _ => None,
        },
    )
    .await;
    assert!(
        failed.contains(&stranger_addr) && failed.contains("certificate"),
        "{failed}"
    );
    // Not the end of the attach: it tries host A again, and is sent to B again.
    let again = next_picked(
        &mut events,
        &mut second,
        "the next attempt",
        |event| match event {
            AttachEvent::Elsewhere { host, .. } => Some(host),
            _ => None,
        },
    )
    .await;
    assert_eq!(again, stranger_addr);
    assert!(!second.is_finished(), "the attach goes on");
    second.abort();
}

/// Two hosts that send a laptop to each other (here host B advertises host A's address, so A
/// sends the laptop back to itself) do not make it loop: the first time it is sent, it tries
/// there at once; sent again in a row, it waits its back-off first, and the wait grows each time
/// it is sent again, as after any other refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_laptop_sent_back_and_forth_waits_its_back_off_between_tries() {
    let Some(pg) = Pg::alone("a_laptop_sent_back_and_forth") else {
        return;
    };
    let dirs = [dir(), dir()];
    let (a, b) = hosts_b_advertising(&pg, &dirs, None).await;
    let a_addr = a.addr.to_string();
    let token = a.first_token.clone().expect("the first host's first start");

    // A laptop attached at host B: B keeps the session, and says it is at A's address.
    let (_laptop, _attached) = notes_laptop_at(&b.client_config(&token), 0).await;

    // A second laptop whose config names host A. A asks the host at B's address to give the
    // session up: itself, which has nothing to give. It waits B's lease out (B renews it), then
    // sends the laptop to where B says it is: A again.
    let (_other, mut second, mut events) = second_laptop(&a.client_config(&token), None);
    let mut sent = Vec::new();
    let mut waits = Vec::new();
    while waits.len() < 2 {
        let event = next_picked(
            &mut events,
            &mut second,
            "the next attempt's end",
            |event| match event {
                AttachEvent::Elsewhere { host, .. } => Some(Ok(host)),
                AttachEvent::Disconnected { reason, retry_in } => Some(Err((reason, retry_in))),
                AttachEvent::Attached { server, .. } => {
                    panic!("the second laptop attached through {server}")
                }
                _ => None,
            },
        )
        .await;
        match event {
            Ok(host) => {
                sent.push(host);
                assert_eq!(sent.len(), 1, "sent again without a wait: {sent:?}");
            }
            Err((reason, retry_in)) => {
                assert!(
                    reason.contains(&format!("to be attached there ({a_addr})")),
                    "{reason}"
                );
                waits.push(retry_in);
            }
        }
    }
    // Sent once and tried there at once; sent again, a wait, and a longer one the next time.
    assert_eq!(sent, std::slice::from_ref(&a_addr), "waits {waits:?}");
    assert!(
        waits[0] > Duration::ZERO && waits[1] > waits[0],
        "{waits:?}"
    );
    assert!(!second.is_finished(), "the attach goes on");
    second.abort();
}

/// A session a host drops from memory to make room for another of its user's
/// (`max_sessions_in_memory_per_user`) gives its lease up, as one unloaded for being idle does,
/// so that a laptop attaching to it at another host gets in at once. Before, the host kept
/// renewing the lease of a session it no longer had, for as long as it ran: the laptop waited
/// the lease out and was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_dropped_from_memory_to_make_room_gives_its_lease_up() {
    let Some(pg) = Pg::alone("a_session_dropped_from_memory_to_make_room") else {
        return;
    };
    // Leases of 60 s: one kept would outlast every step of the test.
    let dirs = [dir(), dir()];
    let one_in_memory = [("MONAD_SERVER_MAX_SESSIONS_IN_MEMORY_PER_USER", "1")];
    let a = start_host_env(
        &pg,
        dirs[0].path(),
        "the-hosts-secret",
        60,
        None,
        None,
        &one_in_memory,
    )
    .await;
    let b = start_host(
        &pg,
        dirs[1].path(),
        "the-hosts-secret",
        60,
        Some(dirs[0].path()),
    )
    .await;
    let token = a.first_token.clone().expect("the first host's first start");

    // The agent's call on host A: A serves the session.
    let agent = connect_agent(&a.client_config(&token)).await;
    ok(call_in(&agent, Some(SESSION), "list_dir", json!({"path": "."})).await);
    assert!(
        !lease_of_session(&pg).is_empty(),
        "host A holds the session's lease"
    );

    // A call in another session of the same user: A drops the first from memory, and its lease
    // goes with it.
    let other = "5c8e4f3a-0d2b-4f6c-9a7e-3b4c5d6e7f80";
    ok(call_in(&agent, Some(other), "list_dir", json!({"path": "."})).await);
    until_true(
        &pg,
        "the dropped session's lease to go",
        &format!(
            "SELECT NOT EXISTS (SELECT 1 FROM leases WHERE session_id = '{SESSION}' \
             AND expires_at > now())"
        ),
    )
    .await;

    // A laptop attaching to it at host B gets in at once.
    let (_laptop, _attached) = notes_laptop_at(&b.client_config(&token), 1).await;
    // The agent, on host A, reads the laptop's file through B.
    let (result, _) = ok(call_in(&agent, Some(SESSION), "read_file", read_notes()).await);
    assert!(
        result.to_string().contains("written on the laptop"),
        "{result}"
    );
}

/// A host paused past its lease (a stopped VM), whose session another host took over
/// meanwhile, lets the session's folder go when it wakes: the laptop reconnects (to the woken
/// host, the only one its config names, which asks the other host to give the session up) and
/// attaches again, and the agent's calls through the other host reach the folder again.
/// Before, the laptop stayed attached to the woken host, which no longer served the session,
/// out of every call's reach, until something else made it reconnect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_woken_after_its_lease_was_taken_over_lets_its_folders_go() {
    let Some(pg) = Pg::alone("a_host_woken_after_its_lease_was_taken_over") else {
        return;
    };
    // Leases of 2 s: host A's pause outlasts its lease and stays within QUIC's 8 s idle
    // time-out, so the laptop's connection to it survives the pause.
    let (a, b, token, _dirs) = two_hosts(&pg, 2).await;
    let (_laptop, mut attached) = notes_laptop_at(&a.client_config(&token), 8).await;
    let agent = connect_agent(&b.client_config(&token)).await;
    let (result, _) = ok(call_in(&agent, Some(SESSION), "read_file", read_notes()).await);
    assert!(result.to_string().contains("written on the laptop"));
    let before = lease_of_session(&pg);
    // Recorded first: host A is paused between transactions, not inside one.
    until_audited(&pg, "the read to be recorded", 1, "read_file").await;

    // Host A stands still. Once its lease has run out, an agent's call at host B (in the
    // session's primary workspace) takes the session over.
    a.pause();
    until_true(
        &pg,
        "host A's lease to expire",
        &format!("SELECT expires_at <= now() FROM leases WHERE session_id = '{SESSION}'"),
    )
    .await;
    let primary = json!({"path": ".", "workspace": "primary"});
    ok(call_in(&agent, Some(SESSION), "list_dir", primary).await);
    assert_taken_over(&before, &lease_of_session(&pg));

    // Host A wakes, finds its lease lost, and lets the laptop go: the laptop attaches again,
    // and the agent's read reaches it.
    a.resume();
    attached.wait_attached().await;
    within(STEP, "a read of the laptop's file through host B", async {
        loop {
            let reply = call_in(&agent, Some(SESSION), "read_file", read_notes()).await;
            match reply.outcome {
                monad_protocol::wire::Outcome::Ok { result }
                    if result.to_string().contains("written on the laptop") =>
                {
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    })
    .await;
}

#[tokio::test]
async fn serve_refuses_an_advertised_address_that_is_not_host_and_port() {
    let data = dir();
    let dir_arg = data.path().to_str().unwrap();
    for bad in ["10.0.0.2", "host:notaport", ":4433"] {
        let out = monad_tests::server_command(&[
            "--data-dir",
            dir_arg,
            "--listen",
            "127.0.0.1:0",
            "--no-http",
            "--advertise",
            bad,
        ])
        .await;
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad}: {said}");
        assert!(
            said.contains("is not HOST:PORT") && said.contains(bad),
            "{bad}: {said}"
        );
    }
}
