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

/// The sessions a workspace record file lists.
fn record_sessions(data: &Path, record: &str) -> Vec<String> {
    let path = data.join("workspaces").join(format!("{record}.json"));
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut ids: Vec<String> = file["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_and_delete_remove_sessions_with_their_bindings_artifacts_and_records() {
    let (old, keep, doomed) = (
        "aaaaaaaa-0000-4000-8000-000000000001",
        "aaaaaaaa-0000-4000-8000-000000000002",
        "aaaaaaaa-0000-4000-8000-000000000003",
    );
    let data = tempfile::tempdir().unwrap();
    let dir = data.path();
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
        dir.join("sessions/default/session.toml").is_file(),
        "never default"
    );
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
    assert!(dir.join("tokens.toml").is_file());

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
