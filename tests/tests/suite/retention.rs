//! Lifetimes (DESIGN.md, "Stale cleanup"): `monad-server session gc --max-age DAYS` and
//! `session delete ID`, run as a user runs them, with the server stopped.

use std::path::Path;

use monad_protocol::wire::Trust;
use monad_server::store::SessionMeta;
use monad_tests::{
    Attachment, STEP, ServerProcess, attach_options, call_in, connect_agent, folder, ok,
    server_command, within,
};
use serde_json::json;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `monad-server session ARGS --data-dir DIR`.
async fn session_command(data: &Path, args: &[&str]) -> std::process::Output {
    let dir = data.to_string_lossy().into_owned();
    let mut all = vec!["session"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--data-dir", &dir]);
    server_command(&all).await
}

/// Sets a session's `last_active` in its `session.toml` (the server must be stopped).
fn age(data: &Path, id: &str, last_active: &str) {
    let path = data.join("sessions").join(id).join("session.toml");
    let mut meta: SessionMeta = toml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    meta.last_active = last_active.to_owned();
    std::fs::write(&path, toml::to_string(&meta).unwrap()).unwrap();
}

/// The device bindings of user `admin` in `bindings.toml`: device id -> { session, used }.
fn bindings(data: &Path) -> toml::Table {
    let text = std::fs::read_to_string(data.join("bindings.toml")).unwrap_or_default();
    let table: toml::Table = toml::from_str(&text).unwrap();
    table
        .get("bindings")
        .and_then(|b| b.get("admin"))
        .and_then(|b| b.as_table())
        .cloned()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_and_delete_remove_sessions_with_their_bindings_artifacts_and_records() {
    gc_and_delete_on(Backend::new(None)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_and_delete_remove_sessions_with_everything_they_keep_on_postgresql() {
    let Some(url) = pg_url("gc_and_delete_remove_sessions_with_everything_they_keep_on_postgresql")
    else {
        return;
    };
    gc_and_delete_on(Backend::new(Some(url))).await;
}

/// `session gc` and `session delete` on a backend, beside a running server and without one.
async fn gc_and_delete_on(backend: Backend) {
    let (old, keep, doomed) = (
        "aaaaaaaa-0000-4000-8000-000000000001",
        "aaaaaaaa-0000-4000-8000-000000000002",
        "aaaaaaaa-0000-4000-8000-000000000003",
    );
    let dir = backend.data.path();
    if let Some(url) = &backend.pg {
        std::fs::write(
            dir.join("config.toml"),
            format!("[store]\nurl = \"{url}\"\n"),
        )
        .unwrap();
    }
    // Read through a store of the backend (with the server stopped, for the files).
    let bindings = |_: &Path| backend.bindings();
    let record_sessions = |_: &Path, record: &str| backend.record_sessions(record);
    let age = |_: &Path, id: &str, last_active: &str| backend.age_session(id, last_active);
    let server = ServerProcess::start(dir, &[]).await;
    let token = server.first_token.clone().expect("first start");
    let (config_a, config_b, config_laptop) = (
        server.client_config(&token),
        server.client_config(&token),
        server.client_config(&token),
    );
    let a = connect_agent(&config_a).await;
    let b = connect_agent(&config_b).await;
    // Device B works in `doomed`, device A in `keep` then `old` (its binding).
    ok(call_in(
        &b,
        Some(doomed),
        "write_file",
        json!({"path": "d.txt", "content": "d"}),
    )
    .await);
    ok(call_in(
        &a,
        Some(keep),
        "write_file",
        json!({"path": "k.txt", "content": "k"}),
    )
    .await);
    ok(call_in(
        &a,
        Some(old),
        "write_file",
        json!({"path": "o.txt", "content": "o"}),
    )
    .await);
    ok(call_in(&a, Some("default"), "workspaces", json!({})).await);
    ok(call_in(&a, Some(old), "workspaces", json!({})).await);
    // One folder, used in three sessions.
    let laptop = folder(&[("f.txt", "f\n")]);
    for session in [old, keep, doomed] {
        let mut options = attach_options(laptop.path(), "lap");
        options.session = Some(session.into());
        options.trust = Trust::Full;
        let attachment = Attachment::start(&config_laptop, options, None).await;
        ok(call_in(
            &a,
            Some(session),
            "read_file",
            json!({"path": "f.txt", "workspace": "lap"}),
        )
        .await);
        drop(attachment);
    }
    let record = within(STEP, "records", a.records()).await.unwrap()[0]
        .id
        .clone();
    // A may have been re-bound by the last call; bind it to `old` again.
    within(STEP, "open", a.open_session(Some(old)))
        .await
        .unwrap();
    within(STEP, "open", b.open_session(Some(doomed)))
        .await
        .unwrap();

    // While the server runs, deleting goes through it; without a terminal to confirm on and
    // without --yes it is refused, and --dry-run only lists: nothing is touched.
    for args in [&["delete", doomed][..], &["gc", "--max-age", "0"][..]] {
        let out = session_command(dir, args).await;
        assert!(!out.status.success(), "{args:?} deleted without --yes");
        let err = text(&out.stderr);
        assert!(err.contains("--yes"), "{args:?}: {err}");
    }
    let out = session_command(dir, &["gc", "--max-age", "0", "--dry-run"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains(doomed) && err.contains("through the running server"),
        "{err}"
    );
    assert!(dir.join("sessions").join(doomed).is_dir());
    // Reading works beside it.
    let out = session_command(dir, &["list", "--json"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    server.stop().await;

    let devices = bindings(dir);
    let device_a = &config_a.device_id;
    let device_b = &config_b.device_id;
    let session_of = |device: &str| devices[device]["session"].as_str().map(str::to_owned);
    assert_eq!(session_of(device_a).as_deref(), Some(old));
    assert_eq!(session_of(device_b).as_deref(), Some(doomed));
    assert_eq!(record_sessions(dir, &record), {
        let mut v = vec![old.to_owned(), keep.to_owned(), doomed.to_owned()];
        v.sort();
        v
    });

    // `old` and `default` were last used years ago; only `old` goes.
    age(dir, old, "2020-01-01T00:00:00Z");
    age(dir, "default", "2020-01-01T00:00:00Z");
    let out = session_command(dir, &["gc", "--max-age", "30", "--yes"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("{old}\n"));
    assert!(
        !dir.join("sessions").join(old).exists(),
        "workspace, history, artifacts gone"
    );
    assert!(
        backend.store().load("default").unwrap().is_some(),
        "never default"
    );
    assert_eq!(backend.store().load(old).unwrap(), None);
    assert!(dir.join("sessions").join(keep).is_dir());
    assert!(
        !bindings(dir).contains_key(device_a.as_str()),
        "A's binding went with it"
    );
    assert!(!record_sessions(dir, &record).contains(&old.to_owned()));
    let out = session_command(dir, &["artifacts", old]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("does not exist"),
        "{}",
        text(&out.stderr)
    );

    // `delete` takes one session with everything it had.
    let out = session_command(dir, &["delete", doomed, "--yes"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!dir.join("sessions").join(doomed).exists());
    assert!(!bindings(dir).contains_key(device_b.as_str()));
    assert_eq!(record_sessions(dir, &record), vec![keep.to_owned()]);
    let out = session_command(dir, &["delete", doomed, "--yes"]).await;
    assert!(!out.status.success(), "a second delete");
    assert!(
        text(&out.stderr).contains("does not exist"),
        "{}",
        text(&out.stderr)
    );
    let out = session_command(dir, &["delete", "../tokens", "--yes"]).await;
    assert!(!out.status.success());
    assert_eq!(dir.join("tokens.toml").is_file(), backend.pg.is_none());

    let out = session_command(dir, &["list", "--json"]).await;
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let mut ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, ["aaaaaaaa-0000-4000-8000-000000000002", "default"]);

    // The restarted server agrees: A's unnamed calls go to `default`, the record lists `keep`.
    let server = ServerProcess::start(dir, &[]).await;
    let a = connect_agent(&server.retarget(&config_a)).await;
    let (result, _) = ok(call_in(&a, None, "workspaces", json!({})).await);
    assert_eq!(result["session"], "default");
    let (page, next) = within(
        STEP,
        "record sessions",
        a.record_sessions(&record, None, None),
    )
    .await
    .unwrap();
    assert_eq!(next, None);
    assert_eq!(
        page.iter().map(|s| s.session.as_str()).collect::<Vec<_>>(),
        [keep]
    );
    server.stop().await;

    // Even `--max-age 0` (everything unused since now) never takes `default`.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let out = session_command(dir, &["gc", "--max-age", "0", "--yes"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("{keep}\n"));
    assert!(dir.join("sessions/default").is_dir());
    assert!(record_sessions(dir, &record).is_empty());
}

/// A backend for the auto-purge cases: the filesystem store of a data dir, or PostgreSQL at a
/// URL (its database reached with `psql` to age what the traits cannot).
struct Backend {
    data: tempfile::TempDir,
    pg: Option<String>,
}

impl Backend {
    fn new(pg: Option<String>) -> Backend {
        Backend {
            data: tempfile::tempdir().unwrap(),
            pg,
        }
    }

    /// A fresh store on the backend (a new `FsStore` reads the files again).
    fn store(&self) -> std::sync::Arc<dyn monad_server::store::Store> {
        use monad_server::store::{FsBlobs, FsStore, PgStore, pg::PoolOptions};
        let dir = self.data.path();
        match &self.pg {
            None => std::sync::Arc::new(FsStore::new(dir)),
            Some(url) => std::sync::Arc::new(
                PgStore::connect(
                    url,
                    dir,
                    std::sync::Arc::new(FsBlobs::new(&dir.join("blobs"))),
                    PoolOptions::default(),
                )
                .expect("the PostgreSQL store connects"),
            ),
        }
    }

    /// The device bindings of user `admin`: device id -> { session } (the server stopped, for
    /// the files).
    fn bindings(&self) -> toml::Table {
        match &self.pg {
            None => bindings(self.data.path()),
            Some(url) => psql(
                url,
                "SELECT device_id || ' ' || session_id FROM bindings WHERE user_name = 'admin'",
            )
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(device, session)| {
                let mut entry = toml::Table::new();
                entry.insert("session".into(), toml::Value::String(session.into()));
                (device.to_owned(), toml::Value::Table(entry))
            })
            .collect(),
        }
    }

    /// The sessions a workspace record lists, sorted.
    fn record_sessions(&self, record: &str) -> Vec<String> {
        let page = self.store().record_sessions(record, 100, None).unwrap();
        let mut ids: Vec<String> = page.items.into_iter().map(|s| s.session).collect();
        ids.sort();
        ids
    }

    /// Sets a session's last activity in the store (the server stopped). In PostgreSQL by SQL:
    /// a store that holds no lease of a session a server has served only moves its activity
    /// forward.
    fn age_session(&self, id: &str, last_active: &str) {
        match &self.pg {
            None => {
                let store = self.store();
                let mut meta = store.load(id).unwrap().expect("the session exists");
                meta.last_active = last_active.to_owned();
                store.save(&meta).unwrap();
            }
            Some(url) => {
                psql(
                    url,
                    &format!("UPDATE sessions SET last_active = '{last_active}' WHERE id = '{id}'"),
                );
            }
        }
    }

    /// Sets a workspace record's last activity, under the store (no store instance open).
    fn age_record(&self, id: &str, last_active: &str) {
        match &self.pg {
            None => {
                let path = self
                    .data
                    .path()
                    .join("workspaces")
                    .join(format!("{id}.json"));
                let mut file: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
                file["record"]["last_active"] = json!(last_active);
                std::fs::write(&path, serde_json::to_string(&file).unwrap()).unwrap();
            }
            Some(url) => {
                psql(
                    url,
                    &format!(
                        "UPDATE workspaces SET last_active = '{last_active}' WHERE id = '{id}'"
                    ),
                );
            }
        }
    }
}

/// Runs SQL in the database of `url` (the tests' cluster).
fn psql(url: &str, sql: &str) -> String {
    let database = url.rsplit('/').next().unwrap();
    monad_tests::pg::cluster()
        .unwrap()
        .psql(database, sql)
        .unwrap()
}

fn pg_url(test: &str) -> Option<String> {
    super::pg_store::pg_url(test)
}

const LONG_AGO: &str = "2020-01-01T00:00:00Z";

#[test]
fn the_auto_purge_takes_old_sessions_and_unused_records_never_default_busy_or_unreadable() {
    auto_purge_on(Backend::new(None));
}

#[test]
fn the_auto_purge_takes_old_sessions_and_unused_records_on_postgresql() {
    let Some(url) = pg_url("the_auto_purge_takes_old_sessions_and_unused_records_on_postgresql")
    else {
        return;
    };
    auto_purge_on(Backend::new(Some(url)));
}

/// The purge pass ([`Registry::purge`]) on a backend, with times written into the store.
fn auto_purge_on(backend: Backend) {
    use monad_protocol::wire::{HistoryMessage, HistoryRole, WorkspaceRecord};
    use monad_server::session::{Purge, Registry};
    use monad_server::settings::Layers;
    use monad_server::store::{ArtifactKind, ArtifactMeta};
    let (old, old2, recent, busy, garbled) = (
        "bbbbbbbb-0000-4000-8000-000000000001",
        "bbbbbbbb-0000-4000-8000-000000000002",
        "bbbbbbbb-0000-4000-8000-000000000003",
        "bbbbbbbb-0000-4000-8000-000000000004",
        "bbbbbbbb-0000-4000-8000-000000000005",
    );
    let record = |id: &str, last_active: &str| WorkspaceRecord {
        id: id.into(),
        user: "ana".into(),
        device_id: "00000000-0000-4000-8000-000000000001".into(),
        path: format!("/home/ana/{id}"),
        uri: format!("lap:/home/ana/{id}"),
        created_at: LONG_AGO.into(),
        last_active: last_active.into(),
    };
    let (orphan, of_old, of_recent, fresh) = (
        "cccccccc-0000-4000-8000-000000000001",
        "cccccccc-0000-4000-8000-000000000002",
        "cccccccc-0000-4000-8000-000000000003",
        "cccccccc-0000-4000-8000-000000000004",
    );
    {
        let store = backend.store();
        let now = monad_server::fsutil::now_rfc3339();
        for (id, last_active) in [
            ("default", LONG_AGO),
            (old, LONG_AGO),
            (old2, "2020-01-02T00:00:00Z"),
            (recent, now.as_str()),
            (busy, LONG_AGO),
            (garbled, "1 day ago"),
        ] {
            store
                .create(&SessionMeta {
                    id: id.into(),
                    name: None,
                    owner: "ana".into(),
                    created_at: LONG_AGO.into(),
                    last_active: last_active.into(),
                    provider: None,
                    model: None,
                    focus: None,
                    folders: Vec::new(),
                })
                .unwrap();
        }
        // `old` has a conversation, an audit log and an artifact.
        store
            .append(
                old,
                &HistoryMessage {
                    role: HistoryRole::User,
                    text: "hello".into(),
                },
            )
            .unwrap();
        store
            .put_artifact(
                &ArtifactMeta {
                    id: "a1".into(),
                    session: old.into(),
                    kind: ArtifactKind::ToolOutput,
                    workspace: None,
                    tool: Some("read_file".into()),
                    call_id: Some("c1".into()),
                    created_at: LONG_AGO.into(),
                    content_type: "application/json".into(),
                    size: 2,
                    truncated: false,
                    original_size: 2,
                    upload: None,
                },
                b"{}",
            )
            .unwrap();
        for (id, last_active) in [
            (orphan, LONG_AGO),
            (of_old, LONG_AGO),
            (of_recent, LONG_AGO),
            (fresh, now.as_str()),
        ] {
            store.add_record(&record(id, last_active)).unwrap();
        }
        store.touch_record(of_old, old, 1).unwrap();
        store.touch_record(of_recent, recent, 1).unwrap();
    }
    // Touching made them active now: long ago again.
    backend.age_record(of_old, LONG_AGO);
    backend.age_record(of_recent, LONG_AGO);

    let store = backend.store();
    let registry = Registry::new(backend.data.path(), store.clone(), Layers::default());
    // A call in flight in `busy` holds it.
    let in_flight = registry.open(busy, "ana").unwrap();
    let month = Purge {
        max_age: std::time::Duration::from_secs(30 * 86_400),
        every: std::time::Duration::from_secs(3600),
        max_per_pass: 1,
    };
    // One deletion per pass at most: the oldest first, then the next.
    let first = registry.purge(&month).unwrap();
    let ids = |p: &monad_server::session::Purged| -> Vec<String> {
        let mut ids: Vec<String> = p.sessions.iter().map(|m| m.id.clone()).collect();
        ids.extend(p.records.iter().map(|r| r.id.clone()));
        ids
    };
    assert_eq!(ids(&first), [old]);
    assert!(first.more);
    let all = Purge {
        max_per_pass: 100,
        ..month
    };
    let second = registry.purge(&all).unwrap();
    let mut taken = ids(&second);
    taken.sort();
    assert_eq!(taken, [old2, orphan, of_old], "{second:?}");
    assert!(!second.more);
    // What went, went with everything it kept.
    assert_eq!(store.load(old).unwrap(), None);
    assert!(
        store
            .history(old)
            .map(|h| h.messages.is_empty())
            .unwrap_or(true)
    );
    assert!(store.audit_log(old).map(|a| a.is_empty()).unwrap_or(true));
    assert!(store.artifact(old, "a1").is_err());
    assert!(store.artifacts(old).map(|a| a.is_empty()).unwrap_or(true));
    // Never `default`, never the busy one, never one whose age cannot be read; the recent
    // session and the record it uses stay.
    for id in ["default", recent, busy, garbled] {
        assert!(store.load(id).unwrap().is_some(), "{id}");
    }
    for id in [of_recent, fresh] {
        assert!(store.record(id).unwrap().is_some(), "{id}");
    }
    for id in [orphan, of_old] {
        assert_eq!(store.record(id).unwrap(), None, "{id}");
    }
    // Once its call ends, the busy session goes on the next pass.
    drop(in_flight);
    let third = registry.purge(&all).unwrap();
    assert_eq!(ids(&third), [busy]);
    assert!(registry.purge(&all).unwrap() == Default::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_server_purges_what_is_inactive_past_max_age_days() {
    the_running_server_purges(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_server_purges_what_is_inactive_past_max_age_days_on_postgresql() {
    let Some(url) =
        pg_url("the_running_server_purges_what_is_inactive_past_max_age_days_on_postgresql")
    else {
        return;
    };
    the_running_server_purges(Some(url)).await;
}

/// `[retention] max_age_days` on a backend: sessions and records made by a real server, aged
/// in the store while it is stopped, go once it runs again; the rest stay.
async fn the_running_server_purges(pg: Option<String>) {
    let (old, keep) = (
        "dddddddd-0000-4000-8000-000000000001",
        "dddddddd-0000-4000-8000-000000000002",
    );
    let backend = Backend::new(pg.clone());
    let dir = backend.data.path();
    let store_section = pg
        .as_deref()
        .map(|url| format!("[store]\nurl = \"{url}\"\n"))
        .unwrap_or_default();
    std::fs::write(dir.join("config.toml"), &store_section).unwrap();
    let server = ServerProcess::start(dir, &[]).await;
    let token = server.first_token.clone().expect("first start");
    let (config_a, config_laptop) = (server.client_config(&token), server.client_config(&token));
    let a = connect_agent(&config_a).await;
    for session in [old, keep] {
        ok(call_in(
            &a,
            Some(session),
            "write_file",
            json!({"path": "x.txt", "content": "x"}),
        )
        .await);
    }
    ok(call_in(&a, Some("default"), "workspaces", json!({})).await);
    // A folder used in `old` only.
    let laptop = folder(&[("f.txt", "f\n")]);
    let mut options = attach_options(laptop.path(), "lap");
    options.session = Some(old.into());
    options.trust = Trust::Full;
    let attachment = Attachment::start(&config_laptop, options, None).await;
    ok(call_in(
        &a,
        Some(old),
        "read_file",
        json!({"path": "f.txt", "workspace": "lap"}),
    )
    .await);
    drop(attachment);
    let record = within(STEP, "records", a.records()).await.unwrap()[0]
        .id
        .clone();
    drop(a);
    server.stop().await;

    // `old`, `default` and the folder's record were last used years ago.
    match &pg {
        None => {
            age(dir, old, LONG_AGO);
            age(dir, "default", LONG_AGO);
        }
        Some(url) => {
            psql(
                url,
                &format!(
                    "UPDATE sessions SET last_active = '{LONG_AGO}' WHERE id IN ('{old}', 'default')"
                ),
            );
        }
    }
    backend.age_record(&record, LONG_AGO);
    std::fs::write(
        dir.join("config.toml"),
        format!("{store_section}[retention]\nmax_age_days = 30\npurge_every_secs = 1\n"),
    )
    .unwrap();
    let server = ServerProcess::start(dir, &[("RUST_LOG", "monad_server=info")]).await;
    let listed = |what: &'static str| async move {
        let out =
            server_command(&[what, "list", "--json", "--data-dir", dir.to_str().unwrap()]).await;
        assert!(out.status.success(), "{}", text(&out.stderr));
        let items: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        items
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["id"].as_str().unwrap().to_owned())
            .collect::<Vec<String>>()
    };
    within(STEP * 4, "the auto-purge", async {
        loop {
            let gone = !listed("session").await.contains(&old.to_owned())
                && !listed("workspace").await.contains(&record);
            if gone {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await;
    let mut sessions = listed("session").await;
    sessions.sort();
    assert_eq!(sessions, [keep, "default"]);
    let said = server.stop().await;
    assert!(
        said.contains("auto-purge: deleted an inactive session") && said.contains(old),
        "{said}"
    );
    assert!(
        said.contains("auto-purge: deleted an inactive workspace record") && said.contains(&record),
        "{said}"
    );
}

/// With `[store] objects`, the offline `session` commands read and delete artifact content in
/// the S3 bucket, where the server put it (they once used the data dir's blob files: `artifact`
/// said the content was missing and `delete` left it in the bucket).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offline_session_commands_read_and_delete_artifact_content_on_s3() {
    let Some(pg) = super::pg_store::Pg::with_s3(
        "the_offline_session_commands_read_and_delete_artifact_content_on_s3",
    ) else {
        return;
    };
    let (doomed, kept) = (
        "bbbbbbbb-0000-4000-8000-000000000001",
        "bbbbbbbb-0000-4000-8000-000000000002",
    );
    let data = tempfile::tempdir().unwrap();
    let dir = data.path();
    let env = pg.env();
    let envs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let server = ServerProcess::start(dir, &envs).await;
    let token = server.first_token.clone().expect("first start");
    let agent = connect_agent(&server.client_config(&token)).await;
    for session in [doomed, kept] {
        ok(call_in(
            &agent,
            Some(session),
            "write_file",
            json!({"path": "a.txt", "content": format!("written in {session}\n")}),
        )
        .await);
    }
    drop(agent);
    server.stop().await;
    let in_bucket = |session: &str| {
        pg.object_keys()
            .expect("a bucket")
            .iter()
            .filter(|k| k.starts_with(&format!("{session}/")))
            .count()
    };
    assert!(in_bucket(doomed) > 0 && in_bucket(kept) > 0);
    assert!(
        !dir.join("blobs").join(doomed).exists(),
        "nothing of it on the host"
    );

    let session = |args: &[&str]| {
        let mut cmd = monad_tests::command("monad-server");
        cmd.arg("session")
            .args(args)
            .arg("--data-dir")
            .arg(dir)
            .envs(env.iter().cloned());
        let what = format!("`monad-server session {}`", args.join(" "));
        async move { within(STEP, &what, cmd.output()).await.unwrap() }
    };
    let out = session(&["artifacts", doomed, "--json"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let artifacts: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(!artifacts.is_empty());
    let mut shown = String::new();
    for artifact in &artifacts {
        let id = artifact["id"].as_str().unwrap();
        let out = session(&["artifact", doomed, id]).await;
        assert!(out.status.success(), "{id}: {}", text(&out.stderr));
        shown.push_str(&text(&out.stdout));
    }
    assert!(shown.contains(&format!("written in {doomed}")), "{shown}");

    let out = session(&["delete", doomed, "--yes"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(in_bucket(doomed), 0, "its content went with it");
    assert!(in_bucket(kept) > 0, "the other session's content stays");
}
