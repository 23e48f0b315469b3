//! The store traits on both backends (the filesystem and PostgreSQL), and what only the
//! PostgreSQL store has: the unique resolve under concurrency, migrations, the connection
//! errors, content written before its row.

use std::sync::Arc;

use monad_protocol::wire::{HistoryMessage, HistoryRole, WorkspaceRecord};
use monad_server::roots::FolderSessions;
use monad_server::store::pg::{MIGRATIONS, PoolOptions};
use monad_server::store::{
    ArtifactKind, ArtifactMeta, ArtifactStore, AuditDecision, AuditOutcome, AuditRecord,
    BindingStore, BlobEntry, Blobs, Decider, FolderStore, FsBlobs, FsStore, History, PgStore,
    S3Blobs, S3Options, SessionMeta, SessionStore, Store, StoreError, Swept, Upload,
    WorkspaceStore,
};
use monad_tests::{STEP, peer_missing, pg, s3, test_config, within};

/// A fresh database for `test`, or `None` (after saying so) when PostgreSQL is missing.
pub fn pg_url(test: &str) -> Option<String> {
    match pg::database() {
        Ok(url) => Some(url),
        Err(why) => {
            peer_missing(test, &why);
            None
        }
    }
}

/// The PostgreSQL store a parametrized case runs on: the database at `url`, with artifact
/// content in the S3 bucket `objects` when given (else under the data dir).
#[derive(Debug, Clone)]
pub struct Pg {
    /// `postgres://...`.
    pub url: String,
    /// The bucket of the artifact content, if any.
    pub objects: Option<s3::Bucket>,
}

impl Pg {
    /// PostgreSQL alone, at a fresh database for `test` (`None` when it is missing).
    pub fn alone(test: &str) -> Option<Pg> {
        Some(Pg {
            url: pg_url(test)?,
            objects: None,
        })
    }

    /// PostgreSQL and a fresh S3 bucket for `test` (`None` when either is missing).
    pub fn with_s3(test: &str) -> Option<Pg> {
        Some(Pg {
            url: pg_url(test)?,
            objects: Some(s3_bucket(test)?),
        })
    }

    /// Points an in-process server's configuration at it.
    pub fn configure(&self, config: &mut monad_server::ServerConfig) {
        config.store.url = Some(self.url.clone());
        if let Some(bucket) = &self.objects {
            config.store.objects = Some(bucket.url.clone());
            config.store.object_vars = bucket.vars.clone();
        }
    }

    /// The environment of a server process that uses it.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![("MONAD_STORE_URL".to_owned(), self.url.clone())];
        if let Some(bucket) = &self.objects {
            env.push(("MONAD_STORE_OBJECTS".to_owned(), bucket.url.clone()));
            env.extend(bucket.vars.iter().cloned());
        }
        env
    }

    /// The keys its bucket holds, sorted (`None` without a bucket).
    pub fn object_keys(&self) -> Option<Vec<String>> {
        self.objects.as_ref().map(|b| keys(&s3_blobs(b)))
    }
}

/// A fresh bucket on the test process's S3-compatible server for `test`, or `None` (after
/// saying so) when there is no server.
pub fn s3_bucket(test: &str) -> Option<s3::Bucket> {
    match s3::bucket() {
        Ok(bucket) => Some(bucket),
        Err(why) => {
            peer_missing(test, &why);
            None
        }
    }
}

/// The blobs of `bucket`.
fn s3_blobs(bucket: &s3::Bucket) -> S3Blobs {
    S3Blobs::connect(&bucket.url, bucket.vars.clone(), S3Options::default())
        .expect("the bucket is reachable")
}

/// The keys `blobs` holds, sorted.
fn keys(blobs: &dyn Blobs) -> Vec<String> {
    let mut keys: Vec<String> = blobs.list().unwrap().into_iter().map(|e| e.key).collect();
    keys.sort();
    keys
}

fn pg_store(url: &str, data: &std::path::Path) -> PgStore {
    PgStore::connect(
        url,
        data,
        Arc::new(FsBlobs::new(&data.join("blobs"))),
        PoolOptions::default(),
    )
    .expect("the PostgreSQL store connects")
}

fn meta(id: &str, owner: &str, last_active: &str) -> SessionMeta {
    SessionMeta {
        id: id.into(),
        name: None,
        owner: owner.into(),
        created_at: "2026-01-01T00:00:00Z".into(),
        last_active: last_active.into(),
        provider: Some("anthropic".into()),
        model: None,
        focus: None,
        folders: Vec::new(),
    }
}

fn msg(role: HistoryRole, text: &str) -> HistoryMessage {
    HistoryMessage {
        role,
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

fn artifact(session: &str, id: &str, kind: ArtifactKind) -> ArtifactMeta {
    ArtifactMeta {
        id: id.into(),
        session: session.into(),
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

/// Every trait method's contract, as the callers rely on it; the same for both backends.
fn exercise(store: &dyn Store) {
    // Sessions.
    store
        .create(&meta("default", "ana", "2026-01-01T00:00:00Z"))
        .unwrap();
    assert!(
        store.create(&meta("default", "ana", "x")).is_err(),
        "ids are unique"
    );
    store
        .create(&meta("s2", "ana", "2026-01-03T00:00:00Z"))
        .unwrap();
    store
        .create(&meta("s3", "ben", "2026-01-02T00:00:00Z"))
        .unwrap();
    assert_eq!(store.load("nope").unwrap(), None);
    assert!(store.load("../x").is_err(), "a bad id is refused");
    let mut m = store.load("s2").unwrap().unwrap();
    assert_eq!(m, meta("s2", "ana", "2026-01-03T00:00:00Z"));
    m.name = Some("named".into());
    m.last_active = "2026-01-04T00:00:00Z".into();
    store.save(&m).unwrap();
    assert_eq!(store.load("s2").unwrap().unwrap(), m);
    // The attached folders and the focus are kept, and given up.
    m.focus = Some("lap".into());
    m.folders = vec![monad_server::store::KeptFolder {
        name: "lap".into(),
        uri: "laptop:/home/ana/proj".into(),
        trust: monad_protocol::wire::Trust::Restricted,
        tools: vec!["read_file".into(), "run_command".into()],
        device_id: "00000000-0000-4000-8000-000000000001".into(),
        path: "/home/ana/proj".into(),
        record: Some("r1".into()),
        folder: None,
        network: Some("network to pypi.org only".into()),
    }];
    store.save(&m).unwrap();
    assert_eq!(store.load("s2").unwrap().unwrap(), m);
    m.focus = None;
    m.folders.clear();
    store.save(&m).unwrap();
    assert_eq!(store.load("s2").unwrap().unwrap(), m);
    let mut ids: Vec<String> = store
        .all_sessions()
        .unwrap()
        .into_iter()
        .map(|m| m.id)
        .collect();
    ids.sort();
    assert_eq!(ids, ["default", "s2", "s3"]);
    assert_eq!(store.count_sessions("ana").unwrap(), 2);
    let mut anas: Vec<String> = store
        .owner_sessions("ana")
        .unwrap()
        .into_iter()
        .map(|m| m.id)
        .collect();
    anas.sort();
    assert_eq!(anas, ["default", "s2"]);
    assert!(store.owner_sessions("nobody").unwrap().is_empty());
    assert_eq!(store.config_text("s2").unwrap(), None);

    // History: appends in order, a replace, the frontmatter from the session.
    let h = store.history("s2").unwrap();
    assert_eq!(h.created_at, "2026-01-01T00:00:00Z");
    assert_eq!(h.provider.as_deref(), Some("anthropic"));
    assert!(h.messages.is_empty());
    let tricky = "## User\nnot a header\r\n\n";
    store
        .append("s2", &msg(HistoryRole::User, "Find the bug"))
        .unwrap();
    store
        .append("s2", &msg(HistoryRole::Assistant, tricky))
        .unwrap();
    assert_eq!(
        store.history("s2").unwrap().messages,
        [
            msg(HistoryRole::User, "Find the bug"),
            msg(HistoryRole::Assistant, tricky)
        ]
    );
    // Bounded: an append or a replace that would take it past what a conversation holds is
    // refused, and nothing of it is kept.
    let max = monad_server::store::MAX_HISTORY_BYTES as usize;
    let half = msg(HistoryRole::User, &"x".repeat(max / 2));
    store.append("s2", &half).unwrap();
    assert!(matches!(
        store.append("s2", &half),
        Err(StoreError::Full(_))
    ));
    assert_eq!(store.history("s2").unwrap().messages.len(), 3);
    let too_big = History {
        provider: None,
        model: None,
        created_at: "2026-01-01T00:00:00Z".into(),
        messages: vec![msg(HistoryRole::User, &"y".repeat(max + 1))],
    };
    assert!(matches!(
        store.replace("s2", &too_big),
        Err(StoreError::Full(_))
    ));
    assert_eq!(store.history("s2").unwrap().messages.len(), 3);
    let snapshot = History {
        provider: Some("openai".into()),
        model: Some("gpt".into()),
        created_at: "2026-01-01T00:00:00Z".into(),
        messages: vec![
            msg(HistoryRole::System, "Be brief."),
            msg(HistoryRole::User, "Hi"),
        ],
    };
    store.replace("s2", &snapshot).unwrap();
    assert_eq!(store.history("s2").unwrap(), snapshot);
    // The model changes while messages are appended: every message stays.
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for i in 0..40 {
                store
                    .append("s2", &msg(HistoryRole::User, &format!("m{i}")))
                    .unwrap();
            }
        });
        for i in 0..40 {
            store
                .set_history_model("s2", Some("openai"), Some(&format!("gpt-{i}")))
                .unwrap();
        }
    });
    let h = store.history("s2").unwrap();
    assert_eq!(h.model.as_deref(), Some("gpt-39"));
    assert_eq!(h.provider.as_deref(), Some("openai"));
    assert_eq!(
        h.messages.len(),
        42,
        "no message appended meanwhile is lost"
    );
    assert_eq!(h.messages[..2], snapshot.messages[..]);
    assert!(matches!(
        store.set_history_model("nope", None, None),
        Err(StoreError::NotFound(_))
    ));
    store.replace("s2", &snapshot).unwrap();
    store
        .append("s3", &msg(HistoryRole::User, "the Bug is here"))
        .unwrap();
    assert_eq!(store.search_sessions("ana", "be BRIEF").unwrap(), ["s2"]);
    assert_eq!(store.search_sessions("ben", "bug").unwrap(), ["s3"]);
    assert!(store.search_sessions("ana", "bug").unwrap().is_empty());
    // Paged: every page is that slice of the whole, and says whether more follow.
    let all = store.search_sessions("ana", "").unwrap();
    assert!(all.len() >= 2, "{all:?}");
    for offset in 0..=all.len() + 1 {
        for limit in 0..=all.len() + 1 {
            let (page, more) = store.search_page("ana", "", offset, limit).unwrap();
            let want: Vec<String> = all.iter().skip(offset).take(limit).cloned().collect();
            assert_eq!(page, want, "{offset} {limit}");
            assert_eq!(more, all.len() > offset + limit, "{offset} {limit}");
        }
    }

    // Audit: appended in order, counted, paged by position.
    store.audit("s2", &[audit("c1"), audit("c2")]).unwrap();
    store.audit("s2", &[audit("c3")]).unwrap();
    store.audit("s2", &[]).unwrap();
    assert_eq!(store.audit_count("s2").unwrap(), 3);
    let calls = |r: Vec<AuditRecord>| r.into_iter().map(|r| r.call_id).collect::<Vec<_>>();
    assert_eq!(calls(store.audit_log("s2").unwrap()), ["c1", "c2", "c3"]);
    let (page, total) = store.audit_page("s2", 1, 1).unwrap();
    assert_eq!((calls(page), total), (vec!["c2".to_owned()], 3));
    assert_eq!(store.audit_log("s3").unwrap(), []);
    // Read through, and followed, by a cursor: with another session's records between its
    // own, every record once and in order; the cursor stays where it is when nothing is new.
    store.audit("default", &[audit("other")]).unwrap();
    store.audit("s2", &[audit("c4")]).unwrap();
    let (mut read, mut cursor) = (Vec::new(), 0);
    loop {
        let (page, next) = store.audit_after("s2", cursor, 2).unwrap();
        assert!(page.len() <= 2);
        read.extend(calls(page));
        if next == cursor {
            break;
        }
        cursor = next;
    }
    assert_eq!(read, ["c1", "c2", "c3", "c4"]);
    assert_eq!(
        store.audit_after("s2", cursor, 2).unwrap(),
        (vec![], cursor)
    );
    store.audit("s2", &[audit("c5")]).unwrap();
    let (page, next) = store.audit_after("s2", cursor, 2).unwrap();
    assert_eq!((calls(page), next > cursor), (vec!["c5".to_owned()], true));
    assert_eq!(store.audit_after("s3", 0, 2).unwrap(), (vec![], 0));

    // Workspace records: the resolve is idempotent (the URI follows), sessions page by cursor.
    let r = store
        .resolve_record("ana", "dev-1", "/home/ana/proj", "laptop:/home/ana/proj")
        .unwrap();
    let again = store
        .resolve_record("ana", "dev-1", "/home/ana/proj", "mac:/home/ana/proj")
        .unwrap();
    assert_eq!(again.id, r.id);
    assert_eq!(again.uri, "mac:/home/ana/proj");
    let other = store
        .resolve_record("ana", "dev-2", "/home/ana/proj", "x")
        .unwrap();
    assert_ne!(other.id, r.id, "another device is another record");
    assert_eq!(
        store.record(&r.id).unwrap().unwrap().uri,
        "mac:/home/ana/proj"
    );
    assert_eq!(store.records(Some("ana")).unwrap().len(), 2);
    assert_eq!(store.records(Some("ben")).unwrap().len(), 0);
    for (session, calls) in [("s2", 2), ("default", 1), ("s3", 4), ("s2", 1)] {
        store.touch_record(&r.id, session, calls).unwrap();
    }
    assert!(matches!(
        store.touch_record("missing", "s2", 1),
        Err(StoreError::NotFound(_))
    ));
    let mut seen = Vec::new();
    let mut next = None;
    loop {
        let page = store.record_sessions(&r.id, 2, next.as_deref()).unwrap();
        assert!(page.items.len() <= 2);
        seen.extend(page.items);
        match page.next {
            Some(n) => next = Some(n),
            None => break,
        }
    }
    let mut sessions: Vec<(String, u64)> =
        seen.iter().map(|s| (s.session.clone(), s.calls)).collect();
    sessions.sort();
    assert_eq!(
        sessions,
        [("default".into(), 1), ("s2".into(), 3), ("s3".into(), 4)]
    );
    assert!(store.record_sessions(&r.id, 0, None).is_err());
    assert!(store.record_sessions(&r.id, 2, Some("zz")).is_err());
    // The records a session's folders were used in, found by the session.
    store.touch_record(&other.id, "s2", 1).unwrap();
    let mut of_s2 = store.session_records("ana", "s2").unwrap();
    of_s2.sort();
    let mut both = vec![r.id.clone(), other.id.clone()];
    both.sort();
    assert_eq!(of_s2, both);
    assert_eq!(
        store.session_records("ana", "s3").unwrap(),
        std::slice::from_ref(&r.id)
    );
    assert!(store.session_records("ben", "s2").unwrap().is_empty());
    assert!(store.session_records("ana", "nope").unwrap().is_empty());
    let general = WorkspaceRecord {
        id: "0b6f9a51-8a39-4d52-9a7e-1f1de0d1c0a1".into(),
        user: "ana".into(),
        device_id: "api".into(),
        path: String::new(),
        uri: "general:x".into(),
        created_at: "2026-01-01T00:00:00Z".into(),
        last_active: "2026-01-01T00:00:00Z".into(),
    };
    store.add_record(&general).unwrap();
    assert!(store.add_record(&general).is_err(), "ids are unique");
    let second = WorkspaceRecord {
        id: "1b6f9a51-8a39-4d52-9a7e-1f1de0d1c0a1".into(),
        ..general.clone()
    };
    store.add_record(&second).unwrap();
    store.forget_session("s3").unwrap();
    let page = store.record_sessions(&r.id, 100, None).unwrap();
    assert!(page.items.iter().all(|s| s.session != "s3"));
    store.delete_record(&second.id).unwrap();
    assert!(matches!(
        store.delete_record(&second.id),
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(store.record(&second.id).unwrap(), None);

    // Bindings and defaults.
    assert_eq!(store.bound_session("ana", "dev-1").unwrap(), None);
    store.bind("ana", "dev-1", "s2").unwrap();
    store.bind("ana", "dev-2", "s2").unwrap();
    store.bind("ben", "dev-1", "s3").unwrap();
    assert_eq!(
        store.bound_session("ana", "dev-1").unwrap().as_deref(),
        Some("s2")
    );
    assert_eq!(
        store.bound_session("ben", "dev-1").unwrap().as_deref(),
        Some("s3")
    );
    assert_eq!(store.devices_bound_to("s2").unwrap(), 2);
    store.set_default_session("ana", "s2").unwrap();
    assert_eq!(store.default_session("ana").unwrap().as_deref(), Some("s2"));
    store.unbind_session("s2").unwrap();
    assert_eq!(store.devices_bound_to("s2").unwrap(), 0);
    assert_eq!(store.default_session("ana").unwrap(), None);
    assert_eq!(
        store.bound_session("ben", "dev-1").unwrap().as_deref(),
        Some("s3")
    );

    // The folder registry.
    let now = 1_800_000_000_000;
    let mut entry = FolderSessions::new("ana", "dev-1", "/home/ana/proj", "s2", now);
    entry.use_session("default", now - 10, false);
    store.save_folder_sessions(&entry).unwrap();
    store
        .save_folder_sessions(&FolderSessions::new("ana", "dev-1", "/tmp/x", "default", 1))
        .unwrap();
    let mut worked = FolderSessions::new("ana", "dev-1", "/tmp/y", "s9", 1);
    store.save_folder_sessions(&worked).unwrap();
    assert_eq!(store.folder_sessions("ana", "dev-1").unwrap().len(), 3);
    assert_eq!(store.folder_sessions("ana", "dev-9").unwrap(), []);
    // The entry used at 1 ms is stale by now and goes; the first stays, and so does the one
    // whose session was active since, by its metadata, though no host landed in it.
    let active = std::collections::HashMap::from([("s9".to_owned(), now - 5)]);
    assert_eq!(store.prune_folder_sessions(now, &active).unwrap(), 1);
    let mut left = store.folder_sessions("ana", "dev-1").unwrap();
    left.sort_by(|a, b| a.folder.cmp(&b.folder));
    worked.use_session("s9", now - 5, false);
    assert_eq!(left, [entry.clone(), worked.clone()]);
    for mut gone in [entry.clone(), worked] {
        gone.sessions.clear();
        store.save_folder_sessions(&gone).unwrap();
    }
    assert_eq!(store.folder_sessions("ana", "dev-1").unwrap(), []);
    // One user's folders are bounded over all their devices: one more forgets the one used
    // longest ago (a user attaching and landing in ever new paths grew it for a day).
    use monad_server::roots::MAX_FOLDERS_PER_USER;
    for i in 0..MAX_FOLDERS_PER_USER + 2 {
        let device = format!("dev-{}", i % 3);
        let folder = format!("/f/{i}");
        let at = now + i as u64;
        let entry = FolderSessions::new("cy", &device, &folder, "s1", at);
        store.save_folder_sessions(&entry).unwrap();
    }
    let theirs: Vec<FolderSessions> = (0..3)
        .flat_map(|d| store.folder_sessions("cy", &format!("dev-{d}")).unwrap())
        .collect();
    assert_eq!(theirs.len(), MAX_FOLDERS_PER_USER);
    for gone in ["/f/0", "/f/1"] {
        assert!(theirs.iter().all(|e| e.folder != gone), "{gone} is kept");
    }
    let last = format!("/f/{}", MAX_FOLDERS_PER_USER + 1);
    assert!(theirs.iter().any(|e| e.folder == last));
    // Another user's are theirs.
    assert_eq!(store.folder_sessions("ana", "dev-1").unwrap(), []);
    for i in 0..MAX_FOLDERS_PER_USER + 2 {
        let mut gone =
            FolderSessions::new("cy", &format!("dev-{}", i % 3), &format!("/f/{i}"), "s1", 1);
        gone.sessions.clear();
        store.save_folder_sessions(&gone).unwrap();
    }

    // Artifacts: listed oldest first, a replaced history snapshot keeps its place.
    store
        .put_artifact(
            &artifact("s2", "session_history", ArtifactKind::SessionHistory),
            b"{}",
        )
        .unwrap();
    store
        .put_artifact(&artifact("s2", "a1", ArtifactKind::ToolOutput), b"[1]")
        .unwrap();
    let mut snapshot2 = artifact("s2", "session_history", ArtifactKind::SessionHistory);
    snapshot2.size = 9;
    store.put_artifact(&snapshot2, b"{\"v\": 2}").unwrap();
    let mut uploaded = artifact("s2", "up1", ArtifactKind::ToolOutput);
    uploaded.upload = Some(Box::new(Upload {
        workspace_id: general.id.clone(),
        task_id: Some("t".into()),
        step_id: None,
        name: Some("notes.txt".into()),
        metadata: Default::default(),
    }));
    store.put_artifact(&uploaded, b"notes").unwrap();
    let list: Vec<String> = store
        .artifacts("s2")
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert_eq!(list, ["session_history", "a1", "up1"]);
    // By pages, in the same order, the replaced snapshot's latest metadata in its place.
    let page = |offset, limit| store.artifact_page("s2", offset, limit).unwrap();
    let first = page(0, 2);
    assert_eq!((first.end, first.total), (2, 3));
    assert_eq!(
        first
            .artifacts
            .iter()
            .map(|a| a.id.as_str())
            .collect::<Vec<_>>(),
        ["session_history", "a1"]
    );
    assert_eq!(
        first.artifacts[0].size, 9,
        "the latest of a replaced artifact"
    );
    let rest = page(2, 2);
    assert_eq!((rest.artifacts, rest.end), (vec![uploaded.clone()], 3));
    let past = page(3, 2);
    assert_eq!((past.artifacts.len(), past.end, past.total), (0, 3, 3));
    assert_eq!(
        store.artifact_page("nobody-s", 0, 5).unwrap(),
        Default::default()
    );
    // The latest, as a session's page shows them.
    let latest = |n| -> Vec<String> {
        let found = store.latest_artifacts("s2", n).unwrap();
        found.into_iter().map(|a| a.id).collect()
    };
    assert_eq!(latest(2), ["a1", "up1"]);
    assert_eq!(latest(5), ["session_history", "a1", "up1"]);
    assert!(latest(0).is_empty());
    assert!(store.latest_artifacts("nobody-s", 5).unwrap().is_empty());
    // Those of some calls alone (all three here say they came from call `c1`).
    let of_calls = |calls: &[&str]| -> Vec<String> {
        let calls = calls.iter().map(|c| c.to_string()).collect();
        store
            .call_artifacts("s2", &calls)
            .unwrap()
            .into_iter()
            .map(|a| a.id)
            .collect()
    };
    assert_eq!(of_calls(&["c1", "c9"]), ["session_history", "a1", "up1"]);
    assert_eq!(of_calls(&["c2"]), Vec::<String>::new());
    assert_eq!(of_calls(&[]), Vec::<String>::new());
    let (m, body) = store.artifact("s2", "session_history").unwrap();
    assert_eq!((m.size, body.as_slice()), (9, &b"{\"v\": 2}"[..]));
    assert_eq!(
        store.artifact("s2", "up1").unwrap(),
        (uploaded, b"notes".to_vec())
    );
    assert!(matches!(
        store.artifact("s2", "nope"),
        Err(StoreError::NotFound(_))
    ));
    store
        .delete_artifacts("s2", &["a1".into(), "never".into()])
        .unwrap();
    let list: Vec<String> = store
        .artifacts("s2")
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert_eq!(list, ["session_history", "up1"]);

    // Deleting a session takes everything it keeps.
    store.delete("s2").unwrap();
    assert_eq!(store.load("s2").unwrap(), None);
    assert!(matches!(store.delete("s2"), Err(StoreError::NotFound(_))));
    assert_eq!(store.audit_count("s2").unwrap(), 0);
    assert_eq!(store.artifacts("s2").unwrap(), []);
    assert_eq!(store.count_sessions("ana").unwrap(), 1);

    // Two sessions' history snapshots uploaded to one workspace (each with the fixed id) keep
    // their own content, and one's going leaves the other's (in PostgreSQL they shared their
    // content's key: the second upload's content was served for the first, and deleting one
    // took the other's).
    let snapshot_of = |session: &str, body: &[u8]| {
        let mut snapshot = artifact(session, "session_history", ArtifactKind::SessionHistory);
        snapshot.size = body.len() as u64;
        snapshot.upload = Some(Box::new(Upload {
            workspace_id: general.id.clone(),
            task_id: None,
            step_id: None,
            name: None,
            metadata: Default::default(),
        }));
        store.put_artifact(&snapshot, body).unwrap();
    };
    snapshot_of("default", b"ana's");
    snapshot_of("s3", b"ben's");
    assert_eq!(
        store.artifact("default", "session_history").unwrap().1,
        b"ana's"
    );
    store
        .delete_artifacts("s3", &["session_history".into()])
        .unwrap();
    assert_eq!(
        store.artifact("default", "session_history").unwrap().1,
        b"ana's"
    );
}

#[test]
fn the_filesystem_store_keeps_every_trait_contract() {
    let data = tempfile::tempdir().unwrap();
    exercise(&FsStore::new(data.path()));
}

#[test]
fn the_postgres_store_keeps_every_trait_contract() {
    let Some(url) = pg_url("the_postgres_store_keeps_every_trait_contract") else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    exercise(&pg_store(&url, data.path()));
    // Its artifact content is under the blob keys, and a session's went with it.
    assert!(!data.path().join("blobs/s2/session_history").exists());
}

#[test]
fn the_postgres_store_with_s3_keeps_every_trait_contract() {
    let test = "the_postgres_store_with_s3_keeps_every_trait_contract";
    let (Some(url), Some(bucket)) = (pg_url(test), s3_bucket(test)) else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let store = PgStore::connect(
        &url,
        data.path(),
        Arc::new(s3_blobs(&bucket)),
        PoolOptions::default(),
    )
    .unwrap();
    exercise(&store);
    // The content is in the bucket, under seed 004's keys, and none of it on disk; the deleted
    // session's went with it, and the replaced snapshot left no stale object.
    assert!(!data.path().join("blobs").exists());
    let held = keys(&s3_blobs(&bucket));
    assert!(!held.iter().any(|k| k.starts_with("s2/")), "{held:?}");
}

/// Blobs whose writes land and then "crash" the writer: the content is stored, and the caller
/// sees an error before it can write the row, as a process killed between the two would.
struct CrashAfterPut(Arc<dyn Blobs>);

impl Blobs for CrashAfterPut {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.0.put(key, bytes)?;
        Err(StoreError::Invalid(
            "the writer died after the content".into(),
        ))
    }
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.0.get(key)
    }
    fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.0.delete(key)
    }
    fn list_page(
        &self,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<BlobEntry>, Option<String>), StoreError> {
        self.0.list_page(cursor, limit)
    }
}

/// The crash window on one blob store: content without a row is invisible, kept while it may be
/// a write in flight, then swept; content a row names is never swept.
fn a_crash_between_content_and_row(url: &str, blobs: Arc<dyn Blobs>) {
    let data = tempfile::tempdir().unwrap();
    let store = PgStore::connect(url, data.path(), blobs.clone(), PoolOptions::default()).unwrap();
    let crashing = PgStore::connect(
        url,
        data.path(),
        Arc::new(CrashAfterPut(blobs.clone())),
        PoolOptions::default(),
    )
    .unwrap();
    store.create(&meta("s1", "ana", "t")).unwrap();
    store
        .put_artifact(&artifact("s1", "kept", ArtifactKind::ToolOutput), b"[1]")
        .unwrap();
    assert!(
        crashing
            .put_artifact(&artifact("s1", "lost", ArtifactKind::ToolOutput), b"[2]")
            .is_err()
    );
    assert_eq!(keys(&*blobs), ["s1/kept", "s1/lost"], "the content landed");
    // No row names nothing: the lost write is not listed, and reading it is "not found".
    let ids: Vec<String> = store
        .artifacts("s1")
        .unwrap()
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(ids, ["kept"]);
    assert!(matches!(
        store.artifact("s1", "lost"),
        Err(StoreError::NotFound(_))
    ));
    // Within the grace period it may be a write in flight: kept.
    let hour = std::time::Duration::from_secs(3600);
    assert_eq!(
        store.sweep_orphans(hour).unwrap(),
        Swept {
            listed: 2,
            removed: 0
        }
    );
    assert_eq!(keys(&*blobs), ["s1/kept", "s1/lost"]);
    // Past it: swept, and what a row names stays readable.
    assert_eq!(
        store.sweep_orphans(std::time::Duration::ZERO).unwrap(),
        Swept {
            listed: 2,
            removed: 1
        }
    );
    assert_eq!(keys(&*blobs), ["s1/kept"]);
    assert_eq!(store.artifact("s1", "kept").unwrap().1, b"[1]");
    // In pages (of 2 here; the bucket was listed, and every row read, whole): content named and
    // not, in three scopes, each key looked at once and only the orphans removed.
    store.create(&meta("s2", "ana", "t")).unwrap();
    for i in 0..3 {
        let named = artifact("s2", &format!("n{i}"), ArtifactKind::ToolOutput);
        store.put_artifact(&named, b"[3]").unwrap();
        blobs.put(&format!("s2/o{i}"), b"lost").unwrap();
    }
    blobs.put("s9/o", b"lost").unwrap();
    assert_eq!(
        store
            .sweep_orphans_paged(std::time::Duration::ZERO, 2)
            .unwrap(),
        Swept {
            listed: 8,
            removed: 4
        }
    );
    assert_eq!(keys(&*blobs), ["s1/kept", "s2/n0", "s2/n1", "s2/n2"]);
    // Deleting the sessions deletes their objects.
    store.delete("s1").unwrap();
    store.delete("s2").unwrap();
    assert_eq!(keys(&*blobs), Vec::<String>::new());
}

#[test]
fn a_crash_between_content_and_row_leaves_no_row_and_the_orphan_is_swept_on_s3() {
    let test = "a_crash_between_content_and_row_leaves_no_row_and_the_orphan_is_swept_on_s3";
    let (Some(url), Some(bucket)) = (pg_url(test), s3_bucket(test)) else {
        return;
    };
    a_crash_between_content_and_row(&url, Arc::new(s3_blobs(&bucket)));
}

#[test]
fn a_crash_between_content_and_row_leaves_no_row_and_the_orphan_is_swept_on_files() {
    let test = "a_crash_between_content_and_row_leaves_no_row_and_the_orphan_is_swept_on_files";
    let Some(url) = pg_url(test) else {
        return;
    };
    let blobs = tempfile::tempdir().unwrap();
    a_crash_between_content_and_row(&url, Arc::new(FsBlobs::new(blobs.path())));
}

#[test]
fn objects_under_a_prefix_are_keyed_by_scope_and_artifact_and_others_are_left_alone() {
    let test = "objects_under_a_prefix_are_keyed_by_scope_and_artifact_and_others_are_left_alone";
    let Some(bucket) = s3_bucket(test) else {
        return;
    };
    let root = s3_blobs(&bucket);
    let prefixed = S3Blobs::connect(
        &format!("{}/team/prod", bucket.url),
        bucket.vars.clone(),
        S3Options::default(),
    )
    .unwrap();
    prefixed.put("w1/a1", b"content").unwrap();
    assert_eq!(
        prefixed.get("w1/a1").unwrap().as_deref(),
        Some(&b"content"[..])
    );
    assert_eq!(prefixed.get("w1/none").unwrap(), None);
    prefixed.delete("w1/none").unwrap();
    assert_eq!(keys(&prefixed), ["w1/a1"]);
    // Seen from the bucket's root, the object is `team/prod/w1/a1`: no blob key, not listed.
    assert_eq!(keys(&root), Vec::<String>::new());
    root.put("w1/a1", b"other").unwrap();
    assert_eq!(
        prefixed.get("w1/a1").unwrap().as_deref(),
        Some(&b"content"[..])
    );
    for bad in ["../x/y", "a", "a/b/c", "/a/b", "a/.."] {
        assert!(prefixed.put(bad, b"x").is_err(), "{bad}");
        assert!(prefixed.get(bad).is_err(), "{bad}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starting_server_sweeps_orphaned_objects_in_the_background_and_keeps_named_ones() {
    let test = "a_starting_server_sweeps_orphaned_objects_in_the_background_and_keeps_named_ones";
    let Some(pg) = Pg::with_s3(test) else {
        return;
    };
    let bucket = pg.objects.clone().unwrap();
    // A host wrote an artifact, and died after the content of another one.
    let data = tempfile::tempdir().unwrap();
    let store = PgStore::connect(
        &pg.url,
        data.path(),
        Arc::new(s3_blobs(&bucket)),
        PoolOptions::default(),
    )
    .unwrap();
    store.create(&meta("s1", "ana", "t")).unwrap();
    store
        .put_artifact(&artifact("s1", "named", ArtifactKind::ToolOutput), b"[1]")
        .unwrap();
    drop(store);
    s3_blobs(&bucket).put("s1/orphan", b"[2]").unwrap();
    assert_eq!(pg.object_keys().unwrap(), ["s1/named", "s1/orphan"]);
    // A server starts on the same store, with no grace: its start-up sweep takes the orphan.
    let server = monad_tests::TestServer::start_with(|c| {
        pg.configure(c);
        c.store.orphan_grace_secs = 0;
    })
    .await;
    within(STEP, "the orphan to be swept", async {
        while pg.object_keys().unwrap() != ["s1/named"] {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_url_a_missing_bucket_or_an_unreachable_endpoint_fails_the_start_clearly() {
    let test = "a_bad_url_a_missing_bucket_or_an_unreachable_endpoint_fails_the_start_clearly";
    let (Some(url), Some(bucket)) = (pg_url(test), s3_bucket(test)) else {
        return;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let unreachable: Vec<(String, String)> = bucket
        .vars
        .iter()
        .map(|(k, v)| match k.as_str() {
            "AWS_ENDPOINT_URL" => (k.clone(), format!("http://127.0.0.1:{port}")),
            _ => (k.clone(), v.clone()),
        })
        .collect();
    let https_only: Vec<(String, String)> = bucket
        .vars
        .iter()
        .filter(|(k, _)| k != "AWS_ALLOW_HTTP")
        .cloned()
        .collect();
    for (pg, objects, vars, says) in [
        (
            Some(url.clone()),
            "bucket".to_owned(),
            bucket.vars.clone(),
            "not an object store URL".to_owned(),
        ),
        (
            Some(url.clone()),
            "s3://no-such-bucket-here".to_owned(),
            bucket.vars.clone(),
            "cannot use s3://no-such-bucket-here".to_owned(),
        ),
        (
            Some(url.clone()),
            bucket.url.clone(),
            unreachable,
            format!("cannot use {} at http://127.0.0.1:{port}", bucket.url),
        ),
        (
            Some(url.clone()),
            bucket.url.clone(),
            https_only,
            "cannot use".to_owned(),
        ),
        (
            None,
            bucket.url.clone(),
            bucket.vars.clone(),
            "an object store needs the PostgreSQL store".to_owned(),
        ),
    ] {
        let data = tempfile::tempdir().unwrap();
        let mut config = test_config(data.path().to_path_buf());
        config.store.url = pg;
        config.store.objects = Some(objects.clone());
        config.store.object_vars = vars;
        config.store.connect_timeout_secs = 2;
        config.store.op_timeout_secs = 5;
        let bind = tokio::task::spawn_blocking(move || {
            monad_server::Server::bind(config)
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        let e = within(STEP, "the start to fail", bind)
            .await
            .unwrap()
            .unwrap_err();
        assert!(e.contains(&says), "{objects}: {e}");
        assert!(e.contains("[store] objects"), "{e}");
        assert!(!e.contains("monad-test-secret"), "no credential in {e}");
        assert!(!data.path().join("tokens.toml").exists(), "no token made");
    }
}

#[test]
fn concurrent_resolves_of_one_folder_from_several_hosts_make_one_record() {
    let Some(url) = pg_url("concurrent_resolves_of_one_folder_from_several_hosts_make_one_record")
    else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    // Several stores on one database: several hosts, each with its own pool.
    let stores: Vec<Arc<PgStore>> = (0..4)
        .map(|_| Arc::new(pg_store(&url, data.path())))
        .collect();
    let barrier = Arc::new(std::sync::Barrier::new(16));
    let threads: Vec<_> = (0..16)
        .map(|i| {
            let store = stores[i % stores.len()].clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                store
                    .resolve_record("ana", "dev-1", "/home/ana/proj", &format!("laptop-{i}:/p"))
                    .unwrap()
                    .id
            })
        })
        .collect();
    let ids: std::collections::BTreeSet<String> =
        threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(stores[0].records(Some("ana")).unwrap().len(), 1);
}

/// A store on `url` of one connection whose operations time out after a second; its blobs in
/// `data`.
fn impatient_store(url: &str, data: &std::path::Path) -> PgStore {
    PgStore::connect(
        url,
        data,
        Arc::new(FsBlobs::new(&data.join("blobs"))),
        PoolOptions {
            size: 1,
            connect_timeout: std::time::Duration::from_secs(5),
            op_timeout: std::time::Duration::from_secs(1),
        },
    )
    .unwrap()
}
/// Waits until exactly `n` statements of `database` wait on a lock, then checks, half a second
/// later, that no more came to wait (`why` says what the count stands for).
pub async fn steadily_waiting_on_locks(database: &str, n: usize, why: &str) {
    let blocked = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                   AND wait_event_type = 'Lock'";
    let cluster = pg::cluster().unwrap();
    let n = n.to_string();
    within(STEP, "statements to wait on a lock", async {
        while cluster.psql(database, blocked).unwrap() != n {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(cluster.psql(database, blocked).unwrap(), n, "{why}");
}

/// The database of `url`, and another client of it holding `table` for `secs` seconds (from an
/// async test: the wait for the lock runs on the blocking pool); returns once it holds it.
pub async fn holding(
    url: &str,
    table: &'static str,
    secs: u32,
) -> (String, std::thread::JoinHandle<Result<String, String>>) {
    let database = url.rsplit('/').next().unwrap().to_owned();
    let holder = {
        let database = database.clone();
        tokio::task::spawn_blocking(move || hold_table(&database, table, secs))
            .await
            .unwrap()
    };
    (database, holder)
}

/// Another client of `database` holding `table` for `secs` seconds; returns once it holds it.
pub fn hold_table(
    database: &str,
    table: &str,
    secs: u32,
) -> std::thread::JoinHandle<Result<String, String>> {
    let holder = {
        let (database, table) = (database.to_owned(), table.to_owned());
        std::thread::spawn(move || {
            pg::cluster().unwrap().psql(
                &database,
                &format!(
                    "BEGIN; LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE; \
                     SELECT pg_sleep({secs}); COMMIT;"
                ),
            )
        })
    };
    let locked = format!(
        "SELECT count(*) FROM pg_locks WHERE relation = '{table}'::regclass \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND mode = 'AccessExclusiveLock' AND granted"
    );
    let cluster = pg::cluster().unwrap();
    let start = std::time::Instant::now();
    while cluster.psql(database, &locked).unwrap() != "1" {
        assert!(start.elapsed() < STEP, "the lock was never taken");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    holder
}

/// An operation that timed out inside a transaction does not hand its connection, still in
/// that transaction, to the next one: what the next one writes is committed. (The session's
/// unbinding opened its transaction with a bare `BEGIN`, and a connection went back to the pool
/// when its operation was dropped: a later write on it went into the open transaction, said it
/// succeeded, and was never committed.)
#[test]
fn an_operation_that_timed_out_midway_leaves_no_open_transaction_behind() {
    let Some(url) = pg_url("an_operation_that_timed_out_midway_leaves_no_open_transaction_behind")
    else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let store = impatient_store(&url, data.path());
    store
        .create(&meta("s1", "ana", "2026-01-01T00:00:00Z"))
        .unwrap();
    store
        .create(&meta("s2", "ben", "2026-01-01T00:00:00Z"))
        .unwrap();
    let cluster = pg::cluster().unwrap();
    let database = url.rsplit('/').next().unwrap().to_owned();
    // Another client holds the bindings table for a while.
    let holder = hold_table(&database, "bindings", 3);
    let e = store.unbind_session("s1").unwrap_err().to_string();
    assert!(e.contains("took longer than"), "{e}");
    holder.join().unwrap().unwrap();
    store.set_default_session("ben", "s2").unwrap();
    assert_eq!(
        cluster
            .psql(
                &database,
                "SELECT session_id FROM defaults WHERE user_name = 'ben'"
            )
            .unwrap(),
        "s2",
        "what the store said it wrote is committed"
    );
}

/// A statement the store stopped waiting for is stopped in the database as well: a search over
/// a user's every conversation whose request had failed after the operation's time-out ran on
/// in PostgreSQL (a closed connection is noticed only when it sends), and its user could start
/// another each time.
#[test]
fn a_statement_the_store_stopped_waiting_for_does_not_run_on_in_the_database() {
    let Some(url) =
        pg_url("a_statement_the_store_stopped_waiting_for_does_not_run_on_in_the_database")
    else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let store = impatient_store(&url, data.path());
    store
        .create(&meta("s1", "ana", "2026-01-01T00:00:00Z"))
        .unwrap();
    store
        .append("s1", &msg(HistoryRole::User, "hello there"))
        .unwrap();
    let cluster = pg::cluster().unwrap();
    let database = url.rsplit('/').next().unwrap().to_owned();
    // Another client holds the messages for longer than anything below takes.
    let holder = hold_table(&database, "messages", 8);
    let e = store
        .search_sessions("ana", "hello")
        .unwrap_err()
        .to_string();
    assert!(e.contains("took longer than"), "{e}");
    let running = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                   AND pid <> pg_backend_pid() AND state = 'active' \
                   AND query LIKE '%string_agg%'";
    let asked = std::time::Instant::now();
    while cluster.psql(&database, running).unwrap() != "0" {
        assert!(
            asked.elapsed() < std::time::Duration::from_secs(4),
            "the search still runs in the database"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(!holder.is_finished(), "the lock was let go first");
    holder.join().unwrap().unwrap();
    assert_eq!(store.search_sessions("ana", "hello").unwrap(), ["s1"]);
}

#[test]
fn migrations_are_applied_once_and_a_newer_schema_is_refused() {
    let Some(url) = pg_url("migrations_are_applied_once_and_a_newer_schema_is_refused") else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    drop(pg_store(&url, data.path()));
    drop(pg_store(&url, data.path()));
    let cluster = pg::cluster().unwrap();
    let database = url.rsplit('/').next().unwrap();
    let newest = MIGRATIONS.last().unwrap().0;
    assert_eq!(
        cluster
            .psql(
                database,
                "SELECT string_agg(version::text, ',') FROM monad_schema"
            )
            .unwrap(),
        (1..=newest)
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    // A newer binary migrated it: this one refuses it, saying so, and changes nothing.
    let future = newest + 1;
    cluster
        .psql(
            database,
            &format!("INSERT INTO monad_schema (version, name) VALUES ({future}, 'future')"),
        )
        .unwrap();
    let e = PgStore::connect(
        &url,
        data.path(),
        Arc::new(FsBlobs::new(&data.path().join("blobs"))),
        PoolOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains(&format!(
            "schema is at version {future}, newer than this monad-server knows"
        )),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_or_unreachable_store_url_fails_the_start_with_a_clear_message() {
    // Nothing listens on a port that was just free; the start fails within the connect
    // time-out, naming the database, and no data-dir lock or token is left behind.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for (url, says) in [
        (
            format!("postgres://monad@127.0.0.1:{port}/db"),
            format!("cannot connect to PostgreSQL at 127.0.0.1:{port}/db"),
        ),
        (
            "mysql://nope".to_owned(),
            "not a PostgreSQL connection string".to_owned(),
        ),
    ] {
        let data = tempfile::tempdir().unwrap();
        let mut config = test_config(data.path().to_path_buf());
        config.store.url = Some(url.clone());
        config.store.connect_timeout_secs = 2;
        let bind = tokio::task::spawn_blocking(move || {
            monad_server::Server::bind(config)
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        let e = within(STEP, "the start to fail", bind)
            .await
            .unwrap()
            .unwrap_err();
        assert!(e.contains(&says), "{url}: {e}");
        assert!(e.contains("[store] url"), "{e}");
        assert!(!data.path().join("tokens.toml").exists(), "no token made");
    }
    // From the environment too (`MONAD_STORE_URL` is `[store] url`).
    let data = tempfile::tempdir().unwrap();
    std::fs::write(
        data.path().join("config.toml"),
        "[store]\nurl = \"mysql://x\"\n",
    )
    .unwrap();
    let e = monad_server::Server::bind(test_config(data.path().to_path_buf()))
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a PostgreSQL connection string"), "{e}");
}

/// Blobs that refuse every write, and can lose what they hold.
struct Failing(FsBlobs, bool);

impl Blobs for Failing {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        if self.1 {
            return Err(StoreError::Invalid("the blob store is full".into()));
        }
        self.0.put(key, bytes)
    }
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.0.get(key)
    }
    fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.0.delete(key)
    }
    fn list_page(
        &self,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<BlobEntry>, Option<String>), StoreError> {
        self.0.list_page(cursor, limit)
    }
}

#[test]
fn an_artifact_row_is_written_only_after_its_content_and_lost_content_is_a_clear_error() {
    let Some(url) = pg_url(
        "an_artifact_row_is_written_only_after_its_content_and_lost_content_is_a_clear_error",
    ) else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let blobs = data.path().join("blobs");
    let open = |failing: bool| {
        PgStore::connect(
            &url,
            data.path(),
            Arc::new(Failing(FsBlobs::new(&blobs), failing)),
            PoolOptions::default(),
        )
        .unwrap()
    };
    let refusing = open(true);
    refusing.create(&meta("s1", "ana", "t")).unwrap();
    let e = refusing
        .put_artifact(&artifact("s1", "a1", ArtifactKind::ToolOutput), b"x")
        .unwrap_err();
    assert!(e.to_string().contains("full"), "{e}");
    assert_eq!(
        refusing.artifacts("s1").unwrap(),
        [],
        "no row without its content"
    );

    let store = open(false);
    store
        .put_artifact(&artifact("s1", "a1", ArtifactKind::ToolOutput), b"x")
        .unwrap();
    std::fs::remove_file(blobs.join("s1/a1")).unwrap();
    let e = store.artifact("s1", "a1").unwrap_err().to_string();
    assert!(
        e.contains("artifact a1 of session s1 is indexed but its content (s1/a1) is missing"),
        "{e}"
    );
}

#[test]
fn tokens_live_hashed_in_postgresql_and_the_token_commands_find_them_through_config_toml() {
    let Some(url) = pg_url(
        "tokens_live_hashed_in_postgresql_and_the_token_commands_find_them_through_config_toml",
    ) else {
        return;
    };
    use monad_server::auth::TokenStore;
    let data = tempfile::tempdir().unwrap();
    std::fs::write(
        data.path().join("config.toml"),
        format!("[store]\nurl = \"{url}\"\n"),
    )
    .unwrap();
    // What `monad-server token create` opens, beside a server that runs on the same database.
    let command = TokenStore::open(data.path()).unwrap();
    let server = TokenStore::in_postgres(data.path(), Arc::new(pg_store(&url, data.path())));
    let (record, token) = command.create("ana").unwrap();
    assert_eq!(server.verify(&token).unwrap().as_deref(), Some("ana"));
    assert_eq!(server.verify("mnd_nope").unwrap(), None);
    assert_eq!(server.list().unwrap(), std::slice::from_ref(&record));
    assert!(!data.path().join("tokens.toml").exists(), "no token file");
    let database = url.rsplit('/').next().unwrap();
    let rows = pg::cluster()
        .unwrap()
        .psql(
            database,
            "SELECT id || ' ' || user_name || ' ' || hash FROM tokens",
        )
        .unwrap();
    assert!(
        rows.contains(&record.hash) && !rows.contains(&token),
        "{rows}"
    );
    assert!(command.revoke(&record.id).unwrap());
    assert!(!command.revoke(&record.id).unwrap());
    assert_eq!(
        server.verify(&token).unwrap(),
        None,
        "revoked everywhere at once"
    );
    assert!(
        TokenStore::open(data.path())
            .unwrap()
            .create("a b")
            .is_err()
    );
}

/// Runs SQL in the database of `url` (the tests' cluster).
pub fn psql(url: &str, sql: &str) -> String {
    let database = url.rsplit('/').next().unwrap();
    pg::cluster().unwrap().psql(database, sql).unwrap()
}

/// Regression (from a review): a session's audit rows are appended by the host that holds its
/// lease and by a bystander recording (a network report that reached it), and a row whose
/// sequence number was taken before another's but committed after it was passed for good by a
/// reader's cursor (`session audit --follow`). Appends of one session wait for each other to
/// their commits: a second append waits while another holds the session's append lock in an
/// open transaction, and a cursor that follows the log reads every row once, in order.
#[test]
fn a_followed_audit_log_misses_no_row_committed_late() {
    let Some(url) = pg_url("a_followed_audit_log_misses_no_row_committed_late") else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let store = pg_store(&url, data.path());
    store.create(&meta("s1", "ana", "t")).unwrap();
    store.audit("s1", &[audit("c1")]).unwrap();
    let (_, mut cursor) = store.audit_after("s1", 0, 10).unwrap();
    let template = serde_json::to_string(&audit("late"))
        .unwrap()
        .replace('\'', "''");
    // Another writer's append, in a transaction held open for two seconds.
    let late = {
        let url = url.clone();
        std::thread::spawn(move || {
            psql(
                &url,
                &format!(
                    "BEGIN; SELECT pg_advisory_xact_lock(hashtextextended('audit:' || 's1', 0)); \
                     INSERT INTO audit (session_id, record) VALUES ('s1', '{template}'); \
                     SELECT pg_sleep(2); COMMIT;"
                ),
            )
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(500));
    // This append waits for it, and its row comes after; the log is followed as soon as it
    // returns, and again once the other has ended.
    store.audit("s1", &[audit("next")]).unwrap();
    let mut read = Vec::new();
    let mut follow = |read: &mut Vec<String>| loop {
        let (page, next) = store.audit_after("s1", cursor, 10).unwrap();
        read.extend(page.into_iter().map(|r| r.call_id));
        if next == cursor {
            break;
        }
        cursor = next;
    };
    follow(&mut read);
    late.join().unwrap();
    follow(&mut read);
    assert_eq!(read, ["late", "next"]);
}

#[test]
fn corrupt_rows_are_a_clear_error_or_skipped_and_never_serve_another_sessions_data() {
    let Some(url) =
        pg_url("corrupt_rows_are_a_clear_error_or_skipped_and_never_serve_another_sessions_data")
    else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let store = pg_store(&url, data.path());
    store
        .create(&meta("s1", "ana", "2026-01-01T00:00:00Z"))
        .unwrap();
    store
        .create(&meta("s2", "ben", "2026-01-01T00:00:00Z"))
        .unwrap();
    store
        .create(&meta("s3", "cy", "2026-01-01T00:00:00Z"))
        .unwrap();
    store
        .put_artifact(&artifact("s1", "a1", ArtifactKind::ToolOutput), b"ana's")
        .unwrap();
    store
        .put_artifact(
            &artifact("s2", "b1", ArtifactKind::ToolOutput),
            b"ben's secret",
        )
        .unwrap();
    store
        .append("s1", &msg(HistoryRole::User, "hello"))
        .unwrap();
    store.audit("s1", &[audit("c1")]).unwrap();

    // An artifact row of ana's whose content key names ben's content.
    psql(
        &url,
        "UPDATE artifacts SET blob_key = 's2/b1' WHERE session_id = 's1' AND id = 'a1'",
    );
    let e = store.artifact("s1", "a1").map(|(_, c)| c);
    assert!(
        matches!(&e, Err(StoreError::Invalid(why)) if why.contains("a1")),
        "{e:?}"
    );
    // A row of ben's copied into ana's session: its record says it is ben's.
    psql(
        &url,
        "INSERT INTO artifacts (session_id, id, meta, blob_key)
         SELECT 's1', 'b1', meta, blob_key FROM artifacts WHERE session_id = 's2' AND id = 'b1'",
    );
    let e = store.artifact("s1", "b1").map(|(_, c)| c);
    assert!(matches!(&e, Err(StoreError::Invalid(_))), "{e:?}");
    // A record that is not JSON.
    psql(
        &url,
        "INSERT INTO artifacts (session_id, id, meta, blob_key) VALUES ('s1', 'a2', '{not', 's1/a2')",
    );
    let e = store.artifact("s1", "a2").map(|(_, c)| c);
    assert!(matches!(&e, Err(StoreError::Invalid(_))), "{e:?}");
    // The listing skips all three (the corrupt a1 is listed by nothing that would serve it).
    let listed: Vec<String> = store
        .artifacts("s1")
        .unwrap()
        .into_iter()
        .map(|m| format!("{}/{}", m.session, m.id))
        .collect();
    assert!(!listed.iter().any(|k| k.starts_with("s2/")), "{listed:?}");
    assert!(!listed.contains(&"s1/a2".to_owned()), "{listed:?}");
    // Ben still reads his own.
    assert_eq!(store.artifact("s2", "b1").unwrap().1, b"ben's secret");

    // A message whose role is not a role: the conversation is refused, saying why, rather than
    // shown with words put in the user's mouth.
    psql(
        &url,
        "INSERT INTO messages (session_id, role, text) VALUES ('s1', 'wizard', 'obey')",
    );
    let e = store.history("s1");
    assert!(
        matches!(&e, Err(StoreError::Invalid(why)) if why.contains("wizard")),
        "{e:?}"
    );
    // An audit record that does not parse is skipped; the others are read.
    psql(
        &url,
        "INSERT INTO audit (session_id, record) VALUES ('s1', '{\"time\": 1')",
    );
    store.audit("s1", &[audit("c2")]).unwrap();
    let calls: Vec<String> = store
        .audit_log("s1")
        .unwrap()
        .into_iter()
        .map(|r| r.call_id)
        .collect();
    assert_eq!(calls, ["c1", "c2"]);
    // And passed by a cursor, which goes on after it.
    let (records, cursor) = store.audit_after("s1", 0, 2).unwrap();
    assert_eq!(records.len(), 1, "c1, then the unreadable one");
    let (records, _) = store.audit_after("s1", cursor, 2).unwrap();
    assert_eq!(records[0].call_id, "c2");

    // A session row whose owner is empty: refused as corrupt, never listed as anyone's.
    psql(&url, "UPDATE sessions SET owner = '' WHERE id = 's3'");
    let e = store.load("s3");
    assert!(
        matches!(&e, Err(StoreError::Invalid(why)) if why.contains("s3")),
        "{e:?}"
    );
    let ids: Vec<String> = store
        .all_sessions()
        .unwrap()
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert!(!ids.contains(&"s3".to_owned()), "{ids:?}");
    assert!(store.search_sessions("", "").unwrap().is_empty());

    // A folder registry row that does not parse: an error that says so.
    psql(
        &url,
        "INSERT INTO folder_sessions (user_name, device_id, folder, active, sessions)
         VALUES ('ana', 'd1', '/x', 's1', '[oops')",
    );
    let e = store.folder_sessions("ana", "d1");
    assert!(matches!(&e, Err(StoreError::Invalid(_))), "{e:?}");
}

/// Regression: with several hosts on one database, a host searched conversations through a
/// cache of what each held, which only its own appends updated: a word another host appended
/// was never found there (until a restart). The database's own search answers now.
#[test]
fn a_search_on_one_host_finds_what_another_host_appended() {
    let Some(url) = pg_url("a_search_on_one_host_finds_what_another_host_appended") else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let host = || {
        monad_server::store::observed::observe(
            Arc::new(pg_store(&url, data.path())),
            monad_server::feed::Feed::new(),
        )
    };
    let (a, b) = (host(), host());
    let id = uuid::Uuid::new_v4().to_string();
    a.create(&meta(&id, "ana", "2026-01-01T00:00:01Z")).unwrap();
    a.append(&id, &msg(HistoryRole::User, "deploy the cluster"))
        .unwrap();
    assert_eq!(
        a.search_sessions("ana", "deploy").unwrap(),
        vec![id.clone()]
    );
    assert!(a.search_sessions("ana", "kubernetes").unwrap().is_empty());
    b.append(&id, &msg(HistoryRole::Assistant, "kubernetes is up"))
        .unwrap();
    assert_eq!(
        a.search_sessions("ana", "kubernetes").unwrap(),
        vec![id.clone()]
    );
    let (page, more) = a.search_page("ana", "kubernetes", 0, 10).unwrap();
    assert_eq!((page, more), (vec![id], false));
}

/// A shutdown waits for a store that does not answer at most its grace (10 s at least) for the
/// records, and as long again for the sessions' metadata, then exits, saying what was lost;
/// before, each session's save waited out the store's 60 s time-out, one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_stops_answering_does_not_hold_a_shutdown() {
    let Some(pg) = Pg::alone("a_store_that_stops_answering_does_not_hold_a_shutdown") else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let mut env = pg.env();
    env.push(("MONAD_SERVER_SHUTDOWN_GRACE_SECS".into(), "0".into()));
    // Leases that outlast the test: a record waiting on the held table holds its session's
    // lease row (the write's fencing reads it `FOR SHARE`), so the renewal waits too, and with
    // the default 10 s the lease expired during the shutdown's 10 s wait for the records on a
    // busy machine: the saves were then refused at once as fenced, not left waiting, and the
    // shutdown went another way than the one this test is about.
    env.push(("MONAD_CLUSTER_LEASE_SECS".into(), "600".into()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let server = monad_tests::ServerProcess::start(data.path(), &env).await;
    let token = server.first_token.clone().expect("a first start");
    let agent = monad_tests::connect_agent(&server.client_config(&token)).await;
    // Sessions with activity not saved yet (their last activity is saved at most once a
    // minute, and at shutdown).
    for n in 0..3 {
        let session = within(STEP, "a session", agent.open_session(None))
            .await
            .expect("a session")
            .id;
        monad_tests::ok(
            monad_tests::call_in(
                &agent,
                Some(&session),
                "write_file",
                serde_json::json!({"path": format!("{n}.txt"), "content": "x"}),
            )
            .await,
        );
    }
    drop(agent);
    // Another client holds the sessions table: every save of the server waits on it.
    let database = pg.url.rsplit('/').next().unwrap().to_owned();
    let holder = hold_table(&database, "sessions", 90);
    let cluster = pg::cluster().unwrap();
    server.terminate();
    let (status, said) = server.exited(std::time::Duration::from_secs(40)).await;
    assert!(status.success(), "{status}: {said}");
    assert!(
        said.contains("took none of the sessions' metadata"),
        "{said}"
    );
    // The holder let go.
    cluster
        .psql(
            &database,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE query LIKE '%pg_sleep(90)%' AND datname = current_database() \
             AND pid <> pg_backend_pid()",
        )
        .unwrap();
    let _ = holder.join();
}

/// Looking up a session that is not in memory is store work: it waits for one of the user's
/// turns (`server.max_store_work_per_user`), held by the lookup to its end. Prompts, workspace
/// listings and watches take no call slot, and a lookup by name reads every session of the
/// user's: without the turn, one user's lookups of a slow table piled up on the blocking threads
/// and the database connections every user shares. A lookup waits rather than being refused:
/// an attach refused after a restart is one its client gives up on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_session_lookups_take_turns_at_the_store() {
    let Some(pg) = Pg::alone("a_users_session_lookups_take_turns_at_the_store") else {
        return;
    };
    let server = monad_tests::TestServer::start_with(|c| {
        pg.configure(c);
        c.quotas.max_store_work_per_user = 1;
    })
    .await;
    let agent = Arc::new(server.agent().await);
    agent.workspaces(None).await.unwrap();
    let (database, holder) = holding(&pg.url, "sessions", 4).await;
    // Three lookups of sessions not in memory: one runs (and waits on the table), the others
    // wait for their turn, none is refused.
    let mut lookups = tokio::task::JoinSet::new();
    for i in 0..3 {
        let agent = agent.clone();
        lookups.spawn(async move { agent.workspaces(Some(&format!("s{i}"))).await });
    }
    steadily_waiting_on_locks(&database, 1, "one lookup at a time reads the table").await;
    while let Some(looked_up) = within(
        STEP,
        "the lookups once the table is free",
        lookups.join_next(),
    )
    .await
    {
        // Read, not refused: no such session.
        let said = looked_up
            .unwrap()
            .expect_err("no session of that name")
            .to_string();
        assert!(said.contains("does not exist"), "{said}");
    }
    let _ = tokio::task::spawn_blocking(move || holder.join()).await;
    server.stop().await;
}

/// Regression: an attach's own store work (where its folder lands, its workspace record) ran
/// on the blocking pool without one of the user's turns at the store, so one user's attaches
/// (512 in flight over 64 connections, or dropped with their connections while the work went
/// on) took every thread of the pool all users share, each waiting on the store. With one turn,
/// three attaches of folders new to a slow table: one works on it, the others wait for their
/// turn off the pool (they waited on the table, three threads), and all three attach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_attaches_take_turns_at_the_store() {
    use monad_protocol::wire::Message;
    let Some(pg) = Pg::alone("a_users_attaches_take_turns_at_the_store") else {
        return;
    };
    let server = monad_tests::TestServer::start_with(|c| {
        pg.configure(c);
        c.quotas.max_store_work_per_user = 1;
    })
    .await;
    let config = server.client_config();
    let (first, _connection, _stream) =
        monad_tests::FakeClient::ask_attach(&config, Some("w0"), "/fake/w0", vec![]).await;
    assert!(matches!(first, Message::Attached { .. }), "{first:?}");
    let (database, holder) = holding(&pg.url, "workspaces", 4).await;
    let mut attaches = tokio::task::JoinSet::new();
    for i in 1..=3 {
        let config = config.clone();
        attaches.spawn(async move {
            let (name, path) = (format!("w{i}"), format!("/fake/w{i}"));
            monad_tests::FakeClient::ask_attach(&config, Some(&name), &path, vec![])
                .await
                .0
        });
    }
    steadily_waiting_on_locks(&database, 1, "one attach at a time works on the table").await;
    // Waited for, never refused (a refused attach is one its client gives up on): all three
    // attach once the table is free.
    while let Some(answer) = within(STEP, "the attaches' answers", attaches.join_next()).await {
        let answer = answer.unwrap();
        assert!(matches!(answer, Message::Attached { .. }), "{answer:?}");
    }
    let _ = tokio::task::spawn_blocking(move || holder.join()).await;
    server.stop().await;
}

/// Regression: a session given up to another host (a folder attaching there) saved its
/// activity with the registry's lock held, so every lookup of every session on the host, each a
/// quick look into memory, waited for the database (up to its time-out), and the host stopped
/// answering. Another session in memory is found at once while the save waits on a held table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_given_up_to_another_host_saves_without_holding_up_other_sessions() {
    let Some(pg) = Pg::alone("a_session_given_up_to_another_host_saves_without_holding") else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(pg_store(&pg.url, data.path()));
    let registry = Arc::new(monad_server::session::Registry::new(
        data.path(),
        store,
        monad_server::settings::Layers::default(),
    ));
    let leaving = registry.create("ana").unwrap();
    let other = registry.create("ana").unwrap().id.clone();
    // Activity a second after the creation: saved as the session leaves.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert!(leaving.touch().is_none());
    let id = leaving.id.clone();
    drop(leaving);
    let (database, holder) = holding(&pg.url, "sessions", 4).await;
    let given = {
        let registry = registry.clone();
        tokio::task::spawn_blocking(move || registry.give_up(&id, "ana"))
    };
    steadily_waiting_on_locks(&database, 1, "the save waits on the table").await;
    let found = within(
        std::time::Duration::from_secs(2),
        "another session in memory, while the save waits",
        tokio::task::spawn_blocking({
            let registry = registry.clone();
            move || registry.open(&other, "ana").map(|s| s.id.clone())
        }),
    )
    .await
    .unwrap();
    assert!(found.is_ok(), "{found:?}");
    assert!(
        within(STEP, "the session given up", given)
            .await
            .unwrap()
            .unwrap()
    );
    let _ = tokio::task::spawn_blocking(move || holder.join()).await;
}

/// Regression: a store that could not be read was read as "no sessions": with the database
/// down or slow, `monad-client sessions` listed none and exited 0, the HTTP listing answered
/// 200 with none, and a session's prefix matched none. They fail, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_listing_the_store_cannot_answer_is_an_error_not_an_empty_list() {
    let Some(pg) = Pg::alone("a_session_listing_the_store_cannot_answer_is_an_error") else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let store = PgStore::connect(
        &pg.url,
        data.path(),
        Arc::new(FsBlobs::new(&data.path().join("blobs"))),
        PoolOptions {
            op_timeout: std::time::Duration::from_secs(1),
            ..PoolOptions::default()
        },
    )
    .unwrap();
    let registry = Arc::new(monad_server::session::Registry::new(
        data.path(),
        Arc::new(store),
        monad_server::settings::Layers::default(),
    ));
    let id = registry.create("ana").unwrap().id.clone();
    assert_eq!(registry.list("ana").unwrap().len(), 1);
    let (_database, holder) = holding(&pg.url, "sessions", 4).await;
    let listed = {
        let registry = registry.clone();
        tokio::task::spawn_blocking(move || registry.list("ana"))
            .await
            .unwrap()
    };
    let e = listed.expect_err("a listing the store did not answer");
    assert_eq!(e.code, monad_protocol::ErrorCode::Internal, "{e:?}");
    let prefixed = {
        let registry = registry.clone();
        let prefix = id[..8].to_owned();
        tokio::task::spawn_blocking(move || registry.by_prefix(&prefix, "ana"))
            .await
            .unwrap()
    };
    assert_ne!(
        prefixed.expect_err("not answered").code,
        monad_protocol::ErrorCode::NotFound
    );
    let _ = tokio::task::spawn_blocking(move || holder.join()).await;
}
