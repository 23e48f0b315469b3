//! What a session keeps (DESIGN.md, "Sessions and storage"): everything survives a restart,
//! corrupt files are kept aside without taking the server down, and settings come in layers
//! (global < session < environment).

use std::path::Path;

use monad_client::ClientError;
use monad_client::agent::Agent;
use monad_protocol::wire::{History, HistoryMessage, HistoryRole, Trust};
use monad_server::Server;
use monad_server::admin::Admin;
use monad_server::store::ArtifactKind;
use monad_tests::{
    Attachment, STEP, ServerProcess, TestServer, attach_options, call_in, connect_agent, folder,
    ok, server_command, test_config, within,
};
use serde_json::{Value, json};

use super::pg_store::{Pg, pg_url};

fn msg(role: HistoryRole, text: &str) -> HistoryMessage {
    HistoryMessage {
        role,
        text: text.to_owned(),
    }
}

/// Waits (bounded) for an agent request.
async fn ask<T>(what: &str, fut: impl Future<Output = Result<T, ClientError>>) -> T {
    within(STEP, what, fut)
        .await
        .unwrap_or_else(|e| panic!("{what} failed: {e}"))
}

/// The session a call without `session` lands in, as the `workspaces` tool reports it.
async fn session_of_unnamed_call(agent: &Agent) -> String {
    let (result, _) = ok(call_in(agent, None, "workspaces", json!({})).await);
    result["session"].as_str().expect("a session id").to_owned()
}

/// What the server says when `agent`'s call in `session` is refused as a request.
async fn refused(agent: &Agent, session: &str) -> String {
    let call = agent.call(Some(session), "read_file", json!({"path": "a"}), |_| {});
    match within(STEP, "a refusal", call).await {
        Ok(reply) => panic!("not refused: {reply:?}"),
        Err(e) => e.to_string(),
    }
}

/// Every file under `dir` with its content, sorted.
fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(at) = todo.pop() {
        for entry in std::fs::read_dir(&at).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                todo.push(path);
            } else {
                out.push((
                    path.strip_prefix(dir).unwrap().display().to_string(),
                    std::fs::read(&path).unwrap_or_default(),
                ));
            }
        }
    }
    out.sort();
    out
}

/// The names in `dir` that start with `prefix`.
fn entries_starting(dir: &Path, prefix: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_sessions_history_artifacts_bindings_and_workspace_records() {
    a_restart_keeps_everything(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_everything_on_postgresql() {
    let Some(pg) = Pg::alone("a_restart_keeps_everything_on_postgresql") else {
        return;
    };
    a_restart_keeps_everything(Some(pg)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_everything_on_postgresql_and_s3() {
    let Some(pg) = Pg::with_s3("a_restart_keeps_everything_on_postgresql_and_s3") else {
        return;
    };
    a_restart_keeps_everything(Some(pg)).await;
}

/// The restart case on a backend: the filesystem (`None`) or PostgreSQL (with S3).
async fn a_restart_keeps_everything(pg: Option<Pg>) {
    let server = TestServer::start_with(|c| {
        if let Some(pg) = &pg {
            pg.configure(c);
        }
    })
    .await;
    // On PostgreSQL, the first start's token is a row: no token file.
    assert_eq!(
        server.data_dir().join("tokens.toml").exists(),
        pg.is_none(),
        "tokens.toml"
    );
    // Three devices: A works in a UUID session, B in `default` and a cleared session, C is the
    // laptop that attaches a folder.
    let config_a = server.client_config();
    let config_b = server.client_config();
    let config_c = server.client_config();
    let a = connect_agent(&config_a).await;
    let b = connect_agent(&config_b).await;

    // B: the default session gets a conversation, then a snapshot replaces it.
    ask(
        "append",
        b.history_append(Some("default"), msg(HistoryRole::User, "old question")),
    )
    .await;
    let snapshot = History {
        provider: Some("anthropic".into()),
        model: Some("claude-test".into()),
        created_at: "ignored: the session keeps its own".into(),
        messages: vec![
            msg(HistoryRole::System, "You are careful."),
            msg(HistoryRole::User, "Summarise the repo."),
            msg(
                HistoryRole::Assistant,
                "It is a runtime.\n\n## User\nquoted",
            ),
        ],
    };
    ask(
        "replace",
        b.history_replace(Some("default"), snapshot.clone()),
    )
    .await;

    // B: a new session, used and then cleared; its frontmatter and files stay.
    let w = ask("open a new session", b.open_session(None)).await;
    ok(call_in(
        &b,
        Some(&w.id),
        "write_file",
        json!({"path": "keep.txt", "content": "kept across a clear\n"}),
    )
    .await);
    ask(
        "append",
        b.history_append(Some(&w.id), msg(HistoryRole::User, "to be cleared")),
    )
    .await;
    ask("clear", b.history_clear(Some(&w.id))).await;

    // A: a session opened by a UUID of its choosing (seed 001), with a conversation and a write.
    let u_id = "0b6f9a51-8a39-4d52-9a7e-1f1de0d1c0a1";
    let u = ask("open a session by id", a.open_session(Some(u_id))).await;
    assert_eq!(u.id, u_id);
    let conversation = vec![
        msg(HistoryRole::User, "Write the notes."),
        msg(HistoryRole::Assistant, "Done: notes.txt."),
    ];
    for m in &conversation {
        ask("append", a.history_append(Some(u_id), m.clone())).await;
    }
    ok(call_in(
        &a,
        Some(u_id),
        "write_file",
        json!({"path": "notes.txt", "content": "first line\nsecond line\n"}),
    )
    .await);

    // C: a folder attached to A's session, with one call in it.
    let laptop = folder(&[("src/main.rs", "fn main() {}\n")]);
    let mut options = attach_options(laptop.path(), "proj");
    options.session = Some(u_id.into());
    options.trust = Trust::Full;
    let attachment = Attachment::start(&config_c, options.clone(), None).await;
    assert_eq!(attachment.session, u_id);
    let (read, workspace) = ok(call_in(
        &a,
        Some(u_id),
        "read_file",
        json!({"path": "src/main.rs", "workspace": "proj"}),
    )
    .await);
    assert_eq!(
        (read["content"].as_str(), workspace.as_str()),
        (Some("fn main() {}\n"), "proj")
    );
    let records = ask("records", a.records()).await;
    assert_eq!(records.len(), 1, "{records:?}");
    let record = records[0].clone();
    assert_eq!(record.path, options.shown_path);
    let before = ask("sessions", a.sessions()).await;
    drop(attachment);

    // A graceful restart on the same data dir, with the temporary file a write cut short by a
    // crash an hour ago would leave: the new server removes it.
    let leftover = server.data_dir().join(".bindings.toml.4294967.0.tmp");
    std::fs::write(&leftover, "half a write").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&leftover)
        .unwrap()
        .set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(3600))
        .unwrap();
    let server = server.stop().await.restart().await;
    within(STEP, "the leftover temporary file to go", async {
        while leftover.exists() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    let a = connect_agent(&config_a).await;
    let b = connect_agent(&config_b).await;

    // Sessions: the same ids, owners and creation times.
    let after = ask("sessions", a.sessions()).await;
    let ids = |list: &[monad_protocol::wire::SessionInfo]| {
        let mut v: Vec<(String, String)> = list
            .iter()
            .map(|s| (s.id.clone(), s.created_at.clone()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(ids(&after), ids(&before));
    for id in ["default", u_id, w.id.as_str()] {
        assert!(after.iter().any(|s| s.id == id), "{id} missing: {after:?}");
    }

    // Bindings: a call that names no session goes to the device's last session.
    assert_eq!(session_of_unnamed_call(&a).await, u_id);
    assert_eq!(session_of_unnamed_call(&b).await, w.id);

    // History: appends in order; the snapshot (with the session's own creation time); the
    // cleared session keeps its frontmatter.
    let (_, h) = ask("history", a.history(Some(u_id))).await;
    assert_eq!(h.messages, conversation);
    let (_, h) = ask("history", b.history(Some("default"))).await;
    let default_created = after.iter().find(|s| s.id == "default").unwrap();
    assert_eq!(
        h,
        History {
            created_at: default_created.created_at.clone(),
            ..snapshot.clone()
        }
    );
    if pg.is_none() {
        let md =
            std::fs::read_to_string(server.data_dir().join("sessions/default/session.md")).unwrap();
        assert!(
            md.starts_with("---\nprovider: anthropic\nmodel: claude-test\ncreated_at: "),
            "{md}"
        );
    }
    let (_, h) = ask("history", b.history(Some(&w.id))).await;
    assert!(h.messages.is_empty(), "{h:?}");
    assert_eq!(h.created_at, w.created_at);
    let (kept, _) = ok(call_in(&b, Some(&w.id), "read_file", json!({"path": "keep.txt"})).await);
    assert_eq!(kept["content"], "kept across a clear\n");

    // Artifacts: the write's output and diff, the snapshot (read through the server's own store,
    // whichever it is).
    let admin = server.state().registry.store().clone();
    let artifacts = admin.artifacts(u_id).expect("artifacts of A's session");
    let write_output = artifacts
        .iter()
        .find(|m| m.kind == ArtifactKind::ToolOutput && m.tool.as_deref() == Some("write_file"))
        .unwrap_or_else(|| panic!("no tool_output of write_file: {artifacts:?}"));
    let diff = artifacts
        .iter()
        .find(|m| m.kind == ArtifactKind::FileDiff)
        .unwrap_or_else(|| panic!("no file_diff: {artifacts:?}"));
    assert_eq!(diff.call_id, write_output.call_id, "same call");
    assert_eq!(diff.workspace.as_deref(), Some("primary"));
    let (_, body) = admin.artifact(u_id, &diff.id).unwrap();
    let body = String::from_utf8(body).unwrap();
    assert!(body.contains("+second line"), "{body}");
    let (_, body) = admin.artifact(u_id, &write_output.id).unwrap();
    let outcome: Value = serde_json::from_slice(&body).expect("tool output is JSON");
    assert_eq!(outcome["status"], "ok", "{outcome}");
    assert!(
        artifacts
            .iter()
            .any(|m| m.tool.as_deref() == Some("read_file")
                && m.workspace.as_deref() == Some("proj")),
        "the call in the attached folder is recorded: {artifacts:?}"
    );
    let (meta, body) = admin.artifact("default", "session_history").unwrap();
    assert_eq!(meta.kind, ArtifactKind::SessionHistory);
    let stored: History = serde_json::from_slice(&body).expect("the snapshot is JSON");
    assert_eq!(stored.messages, snapshot.messages);
    assert!(admin.audit_count(u_id).unwrap() >= 2);
    assert_eq!(admin.history(u_id).unwrap().messages.len(), 2);
    if pg.is_none() {
        let report = Admin::new(server.data_dir()).show(u_id).unwrap();
        assert!(report.calls >= 2, "{report:?}");
        assert_eq!(report.messages, 2);
    }

    // Workspace records: re-attaching the folder resolves the same record, which lists A's
    // session.
    let attachment = Attachment::start(&config_c, options, None).await;
    assert_eq!(attachment.workspace.name, "proj");
    let records = ask("records", a.records()).await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].id, record.id, "same record after a restart");
    let (sessions, next) = ask("record sessions", a.record_sessions(&record.id, None, None)).await;
    assert_eq!(next, None);
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    assert_eq!(sessions[0].session, u_id);
    assert!(sessions[0].calls >= 1, "{sessions:?}");
    drop(attachment);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_files_are_kept_aside_with_a_warning_and_the_server_keeps_serving() {
    let data = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(data.path(), &[]).await;
    let token = server.first_token.clone().expect("first start");
    let config = server.client_config(&token);
    let laptop_config = server.client_config(&token);
    let agent = connect_agent(&config).await;
    let (md_bad, md_unread, toml_bad) = (
        "11111111-1111-4111-8111-111111111111",
        "22222222-2222-4222-8222-222222222222",
        "33333333-3333-4333-8333-333333333333",
    );
    for id in [md_bad, md_unread] {
        ask(
            "append",
            agent.history_append(Some(id), msg(HistoryRole::User, "before")),
        )
        .await;
    }
    ok(call_in(
        &agent,
        Some(toml_bad),
        "write_file",
        json!({"path": "kept.txt", "content": "still here\n"}),
    )
    .await);
    ask(
        "append",
        agent.history_append(Some(toml_bad), msg(HistoryRole::User, "a talk to keep")),
    )
    .await;
    ask(
        "append",
        agent.history_append(Some("default"), msg(HistoryRole::User, "default stays")),
    )
    .await;
    let laptop = folder(&[("a.txt", "a\n")]);
    let attachment =
        Attachment::start(&laptop_config, attach_options(laptop.path(), "lap"), None).await;
    let record = ask("records", agent.records()).await[0].id.clone();
    drop(attachment);
    ask("open", agent.open_session(Some(md_bad))).await;
    assert_eq!(session_of_unnamed_call(&agent).await, md_bad, "bound");
    server.stop().await;

    // Corrupt one file of each kind.
    let sessions = data.path().join("sessions");
    let garbage = "this is not what it should be\n## User\nhi\n";
    std::fs::write(sessions.join(md_bad).join("session.md"), garbage).unwrap();
    std::fs::write(
        sessions.join(md_unread).join("session.md"),
        b"\xff\xfe not UTF-8 \x00",
    )
    .unwrap();
    std::fs::write(sessions.join(toml_bad).join("session.toml"), "id = [broken").unwrap();
    std::fs::write(data.path().join("bindings.toml"), "[[[ nope").unwrap();
    let record_file = data
        .path()
        .join("workspaces")
        .join(format!("{record}.json"));
    std::fs::write(&record_file, "{ not json").unwrap();

    // The commands that only look leave every corrupt file where it is, and say what is wrong
    // with it rather than that the session does not exist.
    let before = tree(data.path());
    let d = data.path().to_str().unwrap();
    // By a unique start of its id too.
    let toml_prefix = &toml_bad[..13];
    for args in [
        &["session", "list"][..],
        &["workspace", "list"],
        &["workspace", "show", &record],
        &["session", "show", md_bad],
        &["session", "history", md_unread],
        &["session", "show", toml_bad],
        &["session", "artifacts", toml_bad],
        &["session", "show", toml_prefix],
        // Reads the devices bound to it, from the corrupt bindings.toml.
        &["session", "show", "default"],
        // Deletes nothing, and a session whose conversation is corrupt can be deleted.
        &["session", "delete", md_bad, "--dry-run"],
    ] {
        let out = server_command(&[&["--data-dir", d][..], args].concat()).await;
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!said.contains("kept aside as"), "{args:?}: {said}");
        match args {
            ["session", "show", "default"] => assert!(out.status.success(), "{said}"),
            ["session", "show" | "history", id] if *id != toml_bad && *id != toml_prefix => {
                assert!(!out.status.success(), "{args:?}");
                assert!(said.contains("session.md is corrupt"), "{args:?}: {said}");
            }
            ["session", _, id] if *id == toml_bad || *id == toml_prefix => {
                assert!(!out.status.success(), "{args:?}");
                assert!(
                    said.contains(&format!("session `{toml_bad}` cannot be read"))
                        && said.contains("session.toml is corrupt")
                        && !said.contains("does not exist"),
                    "{args:?}: {said}"
                );
                // Where in the file, on one line (not the parser's snippet, escaped).
                assert!(
                    said.contains("line 1:") && !said.contains("\\u{a}"),
                    "{args:?}: {said}"
                );
            }
            ["workspace", "show", _] => assert!(!out.status.success(), "{args:?}"),
            _ => assert!(out.status.success(), "{args:?}: {said}"),
        }
    }
    assert_eq!(
        tree(data.path()),
        before,
        "a command that only looks changed the data dir"
    );

    let server = ServerProcess::start(data.path(), &[]).await;
    let agent = connect_agent(&server.retarget(&config)).await;

    // Listing reads every session.toml: the corrupt one is skipped.
    let listed = ask("sessions", agent.sessions()).await;
    assert!(listed.iter().any(|s| s.id == md_bad), "{listed:?}");
    assert!(!listed.iter().any(|s| s.id == toml_bad), "{listed:?}");

    // A corrupt bindings.toml: the binding is lost, so unnamed calls go to `default`; the file
    // is kept aside, and new bindings work.
    assert_eq!(session_of_unnamed_call(&agent).await, "default");
    assert_eq!(
        entries_starting(data.path(), "bindings.toml.corrupt-").len(),
        1
    );

    // A corrupt session.md: the session starts with an empty conversation; the old file is kept.
    let (_, h) = ask("history", agent.history(Some(md_bad))).await;
    assert!(h.messages.is_empty(), "{h:?}");
    let dir = sessions.join(md_bad);
    let aside = entries_starting(&dir, "session.md.corrupt-");
    assert_eq!(aside.len(), 1, "kept aside once: {aside:?}");
    assert_eq!(
        std::fs::read_to_string(dir.join(&aside[0])).unwrap(),
        garbage
    );
    ask(
        "append",
        agent.history_append(Some(md_bad), msg(HistoryRole::User, "after")),
    )
    .await;
    let (_, h) = ask("history", agent.history(Some(md_bad))).await;
    assert_eq!(h.messages, vec![msg(HistoryRole::User, "after")]);

    // The same when the first thing after the restart is an append: the acknowledged message
    // is not swallowed by the corrupt file being kept aside later.
    ask(
        "append",
        agent.history_append(Some(md_unread), msg(HistoryRole::Assistant, "first after")),
    )
    .await;
    let (_, h) = ask("history", agent.history(Some(md_unread))).await;
    assert_eq!(h.messages, vec![msg(HistoryRole::Assistant, "first after")]);
    assert_eq!(
        entries_starting(&sessions.join(md_unread), "session.md.corrupt-").len(),
        1
    );

    // A corrupt session.toml: the session is refused, saying why, and left as it is for the
    // operator (it names the owner: nothing is re-created over it).
    let error = refused(&agent, toml_bad).await;
    assert!(error.contains("corrupt"), "{error}");
    let dir = sessions.join(toml_bad);
    assert!(entries_starting(&dir, "session.toml.corrupt-").is_empty());
    assert_eq!(
        std::fs::read_to_string(dir.join("session.toml")).unwrap(),
        "id = [broken"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("workspace/kept.txt")).unwrap(),
        "still here\n"
    );
    ask("open", agent.open_session(Some(md_bad))).await;
    assert_eq!(session_of_unnamed_call(&agent).await, md_bad, "bound again");
    toml::from_str::<toml::Table>(
        &std::fs::read_to_string(data.path().join("bindings.toml")).unwrap(),
    )
    .expect("a fresh bindings.toml");

    // A corrupt workspace record: kept aside; the folder gets a new record when attached.
    assert!(ask("records", agent.records()).await.is_empty());
    assert!(!record_file.exists());
    assert_eq!(
        entries_starting(
            &data.path().join("workspaces"),
            &format!("{record}.json.corrupt-")
        )
        .len(),
        1
    );
    let attachment = Attachment::start(
        &server.retarget(&laptop_config),
        attach_options(laptop.path(), "lap"),
        None,
    )
    .await;
    let records = ask("records", agent.records()).await;
    assert_eq!(records.len(), 1);
    assert_ne!(records[0].id, record);
    drop(attachment);

    // Other sessions were never affected.
    let (_, h) = ask("history", agent.history(Some("default"))).await;
    assert_eq!(h.messages, vec![msg(HistoryRole::User, "default stays")]);

    let said = server.stop().await;
    for file in [
        "session.md",
        "session.toml",
        "bindings.toml",
        &format!("{record}.json"),
    ] {
        assert!(
            said.lines()
                .any(|l| l.contains("WARN") && l.contains(file) && l.contains("corrupt")),
            "no warning about {file}:\n{said}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_global_config_stops_the_server_naming_file_line_and_key() {
    for (text, line, key) in [
        (
            "[limits]\nread_max_bytes = 10\n\nread_max_byts = 1\n",
            4,
            "read_max_byts",
        ),
        (
            "[retention]\nkeep_artifacts = true\nartifact_max_bytes = \"big\"\n",
            3,
            "artifact_max_bytes",
        ),
        ("[limitz]\nx = 1\n", 1, "limitz"),
    ] {
        let data = tempfile::tempdir().unwrap();
        let path = data.path().join("config.toml");
        std::fs::write(&path, text).unwrap();
        let error = Server::bind(test_config(data.path().to_path_buf()))
            .err()
            .unwrap_or_else(|| panic!("a server started with {text:?}"))
            .to_string();
        let place = format!("{}:{line}", path.display());
        assert!(error.contains(&place), "`{error}` does not say {place}");
        assert!(error.contains(key), "`{error}` does not name `{key}`");

        // The binary says the same in one line on stderr, with a failing exit code.
        let out = server_command(&[
            "--data-dir",
            &data.path().to_string_lossy(),
            "--listen",
            "127.0.0.1:0",
            "--no-http",
        ])
        .await;
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr.lines().last().unwrap_or_default();
        assert!(last.contains(&place) && last.contains(key), "{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_session_config_fails_that_session_only_with_file_line_and_key() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let bad = "44444444-4444-4444-8444-444444444444";
    let dir = server.data_dir().join("sessions").join(bad);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        "[limits]\nread_max_bytes = 100\nlist_max_entris = 3\n",
    )
    .unwrap();

    let refused = within(
        STEP,
        "a call in the misconfigured session",
        agent.call(Some(bad), "workspaces", json!({}), |_| {}),
    )
    .await
    .expect_err("the session cannot open");
    let ClientError::Refused(error) = refused else {
        panic!("expected a refusal, got {refused}");
    };
    let place = format!("{}:3", config.display());
    assert!(error.message.contains(&place), "{error}");
    assert!(error.message.contains("list_max_entris"), "{error}");
    // History requests say the same.
    let err = within(STEP, "history", agent.history(Some(bad)))
        .await
        .expect_err("refused");
    assert!(err.to_string().contains(&place), "{err}");

    // Every other session works.
    ok(call_in(&agent, Some("default"), "workspaces", json!({})).await);
    ask(
        "append",
        agent.history_append(Some("default"), msg(HistoryRole::User, "fine")),
    )
    .await;
    ask("open", agent.open_session(None)).await;

    // Fixing the file fixes the session, no restart needed.
    std::fs::write(&config, "[limits]\nread_max_bytes = 100\n").unwrap();
    ok(call_in(&agent, Some(bad), "workspaces", json!({})).await);
    server.stop().await;
}

/// Reads `big.txt` in `session` and returns the content's length and whether it was cut.
async fn read_big(agent: &Agent, session: &str) -> (usize, bool) {
    let (result, _) = ok(call_in(
        agent,
        Some(session),
        "read_file",
        json!({"path": "big.txt"}),
    )
    .await);
    (
        result["content"].as_str().expect("content").len(),
        result["truncated"].as_bool().expect("truncated flag"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_layer_global_then_session_then_environment() {
    let data = tempfile::tempdir().unwrap();
    let small = "55555555-5555-4555-8555-555555555555";
    let big = "x".repeat(999) + "\n";
    std::fs::write(
        data.path().join("config.toml"),
        "[limits]\nread_max_bytes = 500\n",
    )
    .unwrap();
    for session in ["default", small] {
        let dir = data.path().join("sessions").join(session);
        std::fs::create_dir_all(dir.join("workspace")).unwrap();
        std::fs::write(dir.join("workspace/big.txt"), &big).unwrap();
    }
    std::fs::write(
        data.path().join("sessions").join(small).join("config.toml"),
        "# this session reads little\n[limits]\nread_max_bytes = 100\n",
    )
    .unwrap();

    // global < session: the session's file wins in that session only.
    let server = ServerProcess::start(data.path(), &[]).await;
    let token = server.first_token.clone().expect("first start");
    let config = server.client_config(&token);
    let agent = connect_agent(&config).await;
    assert_eq!(read_big(&agent, "default").await, (500, true));
    assert_eq!(read_big(&agent, small).await, (100, true));
    server.stop().await;

    // session < environment: the variable wins everywhere.
    let server = ServerProcess::start(data.path(), &[("MONAD_LIMITS_READ_MAX_BYTES", "250")]).await;
    let agent = connect_agent(&server.retarget(&config)).await;
    assert_eq!(read_big(&agent, "default").await, (250, true));
    assert_eq!(read_big(&agent, small).await, (250, true));
    server.stop().await;

    // Keys the environment does not set keep the file's value: a big enough limit reads all.
    let server =
        ServerProcess::start(data.path(), &[("MONAD_LIMITS_READ_DEFAULT_LINES", "5")]).await;
    let agent = connect_agent(&server.retarget(&config)).await;
    assert_eq!(read_big(&agent, small).await, (100, true));
    server.stop().await;

    // A bad variable stops the server with its name.
    let out = {
        let mut cmd = monad_tests::command("monad-server");
        cmd.arg("--data-dir")
            .arg(data.path())
            .args(["--listen", "127.0.0.1:0", "--no-http"])
            .env("MONAD_LIMITS_READ_MAX_BYTES", "lots");
        within(STEP, "monad-server with a bad variable", cmd.output())
            .await
            .unwrap()
    };
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("MONAD_LIMITS_READ_MAX_BYTES"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_snapshots_and_appends_leave_every_file_whole() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let session = ask("open", agent.open_session(None)).await.id;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..24 {
        let agent = agent.clone();
        let session = session.clone();
        tasks.spawn(async move {
            let history = History {
                provider: Some(format!("provider-{i}")),
                model: Some("m".repeat(1 + i * 7)),
                created_at: String::new(),
                messages: (0..=i)
                    .map(|j| msg(HistoryRole::User, &format!("snapshot {i} message {j}")))
                    .collect(),
            };
            agent.history_replace(Some(&session), history).await?;
            agent
                .history_append(
                    Some(&session),
                    msg(HistoryRole::Assistant, &format!("append {i}")),
                )
                .await
        });
    }
    while let Some(done) = within(STEP, "the concurrent requests", tasks.join_next()).await {
        done.expect("no panic")
            .unwrap_or_else(|e| panic!("a concurrent replace or append failed: {e}"));
    }
    // Every file is whole: session.toml, session.md, the snapshot artifact.
    let dir = server.data_dir().join("sessions").join(&session);
    let meta: toml::Table =
        toml::from_str(&std::fs::read_to_string(dir.join("session.toml")).unwrap())
            .expect("session.toml parses");
    assert_eq!(meta["id"].as_str(), Some(session.as_str()));
    let (_, h) = ask("history", agent.history(Some(&session))).await;
    assert!(!h.messages.is_empty());
    assert!(entries_starting(&dir, "session.md.corrupt").is_empty());
    let admin = Admin::new(server.data_dir());
    let (_, body) = admin.artifact(&session, "session_history").unwrap();
    serde_json::from_slice::<History>(&body).expect("the snapshot artifact is whole");
    let leftovers: Vec<String> = entries_starting(&dir, ".");
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_session_toml_is_refused_and_its_session_never_changes_owner() {
    a_corrupt_session_is_refused_and_never_changes_owner(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_row_with_no_owner_is_refused_and_never_changes_owner_on_postgresql() {
    let Some(url) =
        pg_url("a_session_row_with_no_owner_is_refused_and_never_changes_owner_on_postgresql")
    else {
        return;
    };
    a_corrupt_session_is_refused_and_never_changes_owner(Some(url)).await;
}

/// The corrupt-metadata case on a backend: a `session.toml` that does not parse, or a row whose
/// owner is empty.
async fn a_corrupt_session_is_refused_and_never_changes_owner(pg: Option<String>) {
    let server = TestServer::start_with(|c| c.store.url = pg.clone()).await;
    let ben_token = server.create_token("ben");
    // admin owns the well-known `default` and a session of their own.
    let admin = server.agent().await;
    assert_eq!(session_of_unnamed_call(&admin).await, "default");
    let theirs = "44444444-4444-4444-8444-444444444444";
    ok(call_in(
        &admin,
        Some(theirs),
        "write_file",
        json!({"path": "mine.txt", "content": "admin's\n"}),
    )
    .await);
    drop(admin);
    let sessions = server.data_dir().join("sessions");
    let stopped = server.stop().await;
    let broken = "owner = [broken";
    let owners = |url: &str| {
        let database = url.rsplit('/').next().unwrap();
        monad_tests::pg::cluster()
            .unwrap()
            .psql(
                database,
                &format!(
                    "SELECT id || '=' || owner FROM sessions WHERE id IN ('default', '{theirs}') \
                     ORDER BY id"
                ),
            )
            .unwrap()
    };
    match &pg {
        None => {
            for id in ["default", theirs] {
                std::fs::write(sessions.join(id).join("session.toml"), broken).unwrap();
            }
        }
        Some(url) => {
            let database = url.rsplit('/').next().unwrap();
            monad_tests::pg::cluster()
                .unwrap()
                .psql(
                    database,
                    &format!("UPDATE sessions SET owner = '' WHERE id IN ('default', '{theirs}')"),
                )
                .unwrap();
        }
    }
    let server = stopped.restart().await;

    // Ben names each: refused, saying why; nothing of admin's is read or re-created for him.
    let ben = connect_agent(&server.client_config_with(&ben_token)).await;
    for id in ["default", theirs] {
        let error = refused(&ben, id).await;
        assert!(
            error.contains("session.toml") && error.contains("corrupt"),
            "{id}: {error}"
        );
    }
    // His unnamed calls go to a default of his own.
    assert_ne!(session_of_unnamed_call(&ben).await, "default");
    // The corrupt records are as they were, for the operator to repair.
    match &pg {
        None => {
            for id in ["default", theirs] {
                let dir = sessions.join(id);
                assert_eq!(
                    std::fs::read_to_string(dir.join("session.toml")).unwrap(),
                    broken
                );
                assert!(entries_starting(&dir, "session.toml.corrupt-").is_empty());
            }
        }
        Some(url) => assert_eq!(owners(url), format!("{theirs}=\ndefault=")),
    }
    let listed = ask("sessions", ben.sessions()).await;
    assert!(
        !listed.iter().any(|s| s.id == "default" || s.id == theirs),
        "{listed:?}"
    );
}
