//! Routing: which workspace runs a call (DESIGN.md, "Routing").
//!
//! Folders here are attached with reads pre-approved, so no prompt is involved (the last test's
//! has nothing pre-approved and nobody to ask: what reaches its policy is denied).

use monad_client::attach::AttachEvent;
use monad_protocol::{ErrorCode, ToolClass, ToolName};
use std::time::Duration;

use monad_client::config::ClientConfig;
use monad_tests::{
    Attachment, STEP, TestServer, attach_options, call, err, expect_code, folder, ok, within,
};
use serde_json::json;

/// Attaches `dir` as `name`, reads pre-approved, nobody to ask for anything else.
async fn attach_readable(server: &TestServer, dir: &std::path::Path, name: &str) -> Attachment {
    let mut options = attach_options(dir, name);
    options.allow = vec![ToolClass::Read];
    Attachment::start(&server.client_config(), options, None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_in_attached_folder_returns_content_and_names_the_workspace() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let laptop = folder(&[("notes/todo.md", "ship it\n")]);
    let attached = attach_readable(&server, laptop.path(), "lap").await;
    assert_eq!(attached.session, "default");
    assert_eq!(attached.workspace.name, "lap");
    assert!(attached.workspace.online);

    let reply = call(&agent, "read_file", json!({"path": "notes/todo.md"})).await;
    let uri = reply.workspace.as_ref().map(|w| w.uri.clone());
    let (result, ran_in) = ok(reply);
    assert_eq!(result["content"], "ship it\n");
    assert_eq!(ran_in, "lap");
    assert_eq!(uri.as_deref(), Some(attached.workspace.uri.as_str()));
    assert!(
        attached
            .workspace
            .uri
            .ends_with(&laptop.path().to_string_lossy().into_owned()),
        "the URI names the folder as given: {}",
        attached.workspace.uri
    );

    // A file only the primary workspace has is read there.
    ok(call(
        &agent,
        "write_file",
        json!({"path": "plan.md", "content": "primary plan\n"}),
    )
    .await);
    let (result, ran_in) = ok(call(&agent, "read_file", json!({"path": "plan.md"})).await);
    assert_eq!(result["content"], "primary plan\n");
    assert_eq!(ran_in, "primary");
    assert!(
        server.primary_dir("default").join("plan.md").is_file(),
        "writes without a workspace go to the primary workspace"
    );
    assert!(!laptop.path().join("plan.md").exists());
}

/// A file whose name is not UTF-8, in an attached folder: listed with U+FFFD, and read over QUIC
/// by the name as listed, named workspace or not (it was "does not exist" either way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_that_is_not_utf8_is_read_by_the_name_its_listing_shows() {
    use std::os::unix::ffi::OsStrExt;
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let laptop = folder(&[]);
    let name = std::ffi::OsStr::from_bytes(b"r\xe9sum\xe9.txt");
    std::fs::write(laptop.path().join(name), "latin-1 name\n").unwrap();
    let _attached = attach_readable(&server, laptop.path(), "lap").await;
    let (listed, _) = ok(call(&agent, "list_dir", json!({"workspace": "lap"})).await);
    let shown = listed["entries"][0]
        .as_str()
        .unwrap_or_else(|| panic!("{listed}"))
        .to_owned();
    assert_eq!(shown, "r\u{FFFD}sum\u{FFFD}.txt");
    for args in [
        json!({"path": shown, "workspace": "lap"}),
        json!({"path": shown}),
    ] {
        let (read, ran_in) = ok(call(&agent, "read_file", args).await);
        assert_eq!(
            (read["content"].as_str(), ran_in.as_str()),
            (Some("latin-1 name\n"), "lap")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_in_both_goes_to_primary_unless_a_workspace_is_named() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let laptop = folder(&[("both.txt", "laptop copy\n"), ("only-lap.txt", "lap\n")]);
    let attached = attach_readable(&server, laptop.path(), "lap").await;
    // Named: without `workspace` the write would go where the file already is (the folder).
    ok(call(
        &agent,
        "write_file",
        json!({"path": "both.txt", "content": "primary copy\n", "workspace": "primary"}),
    )
    .await);

    let (result, ran_in) = ok(call(&agent, "read_file", json!({"path": "both.txt"})).await);
    assert_eq!(
        (result["content"].as_str(), ran_in.as_str()),
        (Some("primary copy\n"), "primary")
    );

    let (result, ran_in) = ok(call(&agent, "read_file", json!({"path": "only-lap.txt"})).await);
    assert_eq!(
        (result["content"].as_str(), ran_in.as_str()),
        (Some("lap\n"), "lap")
    );

    // By short name and by URI.
    for target in ["lap", attached.workspace.uri.as_str()] {
        let (result, ran_in) = ok(call(
            &agent,
            "read_file",
            json!({"path": "both.txt", "workspace": target}),
        )
        .await);
        assert_eq!(result["content"], "laptop copy\n", "workspace {target}");
        assert_eq!(ran_in, "lap");
    }
    let (result, ran_in) = ok(call(
        &agent,
        "read_file",
        json!({"path": "both.txt", "workspace": "primary"}),
    )
    .await);
    assert_eq!(
        (result["content"].as_str(), ran_in.as_str()),
        (Some("primary copy\n"), "primary")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_workspace_and_missing_path_fail_saying_what_exists() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let laptop = folder(&[("a.txt", "a\n")]);
    let _attached = attach_readable(&server, laptop.path(), "lap").await;

    let message = expect_code(
        call(
            &agent,
            "read_file",
            json!({"path": "a.txt", "workspace": "desktop"}),
        )
        .await,
        ErrorCode::WorkspaceNotFound,
    );
    assert!(message.contains("desktop"), "{message}");
    assert!(
        message.contains("primary, lap"),
        "lists the workspaces: {message}"
    );

    // An empty `workspace` is one left out.
    let (_, workspace) = ok(call(
        &agent,
        "read_file",
        json!({"path": "a.txt", "workspace": ""}),
    )
    .await);
    assert_eq!(workspace, "lap");

    let message = expect_code(
        call(&agent, "read_file", json!({"path": "nowhere.txt"})).await,
        ErrorCode::NotFound,
    );
    assert!(message.contains("nowhere.txt"), "{message}");
    assert!(
        message.contains("tried: primary, lap"),
        "lists what was tried: {message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspaces_tool_lists_primary_and_attached() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let laptop = folder(&[]);
    let attached = attach_readable(&server, laptop.path(), "lap").await;

    let (result, ran_in) = ok(call(&agent, "workspaces", json!({})).await);
    assert_eq!(ran_in, "primary");
    assert_eq!(result["session"], "default");
    let list = result["workspaces"].as_array().expect("a list");
    let names: Vec<&str> = list.iter().filter_map(|w| w["name"].as_str()).collect();
    assert_eq!(names, ["primary", "lap"]);
    assert_eq!(list[0]["uri"], "server:/sessions/default");
    assert_eq!(list[0]["host"], "server");
    assert_eq!(list[0]["trust"], "full");
    assert_eq!(list[1]["uri"], attached.workspace.uri);
    assert_eq!(list[1]["host"], "client");
    assert_eq!(list[1]["trust"], "restricted");
    assert_eq!(list[1]["online"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_attached_folders_are_tried_in_attach_order() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let first = folder(&[("shared.txt", "from first\n")]);
    let second = folder(&[
        ("shared.txt", "from second\n"),
        ("own.txt", "second's own\n"),
    ]);
    let _a = attach_readable(&server, first.path(), "first").await;
    let _b = attach_readable(&server, second.path(), "second").await;

    let (result, ran_in) = ok(call(&agent, "read_file", json!({"path": "shared.txt"})).await);
    assert_eq!(
        (result["content"].as_str(), ran_in.as_str()),
        (Some("from first\n"), "first")
    );
    let (result, ran_in) = ok(call(&agent, "read_file", json!({"path": "own.txt"})).await);
    assert_eq!(
        (result["content"].as_str(), ran_in.as_str()),
        (Some("second's own\n"), "second")
    );
    let (result, ran_in) = ok(call(
        &agent,
        "read_file",
        json!({"path": "shared.txt", "workspace": "second"}),
    )
    .await);
    assert_eq!(
        (result["content"].as_str(), ran_in.as_str()),
        (Some("from second\n"), "second")
    );

    let message = expect_code(
        call(&agent, "stat", json!({"path": "missing"})).await,
        ErrorCode::NotFound,
    );
    assert!(
        message.contains("tried: primary, first, second"),
        "{message}"
    );
}

/// Attaches `dir` as `name` with `--focus`, reads and writes pre-approved, from the device of
/// `config`.
async fn attach_focused(config: &ClientConfig, dir: &std::path::Path, name: &str) -> Attachment {
    let mut options = attach_options(dir, name);
    options.allow = vec![ToolClass::Read, ToolClass::Write];
    options.focus = true;
    Attachment::start(config, options, None).await
}

/// Waits (bounded) until the session's `workspaces` says `online` of `name`.
async fn until_online(agent: &monad_client::agent::Agent, name: &str, online: bool) {
    within(STEP, "the folder's state to change", async {
        loop {
            let (listed, _) = ok(call(agent, "workspaces", json!({})).await);
            let now = listed["workspaces"]
                .as_array()
                .unwrap()
                .iter()
                .any(|w| w["name"] == name && w["online"] == true);
            if now == online {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// `search`'s `context` and `files_only` reach an attached folder's client (of this version)
/// and come back: the lines around a match, marked, and each file with a match once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folders_search_shows_lines_around_matches_and_lists_files_only() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let laptop = folder(&[
        (
            "src/lib.rs",
            "// one\npub fn hello() {}\n// two\npub fn bye() {}\n",
        ),
        ("src/main.rs", "fn main() {}\n"),
    ]);
    let _attached = attach_focused(&server.client_config(), laptop.path(), "lap").await;
    let args = json!({"pattern": "pub fn", "context": 1});
    let (found, ran_in) = ok(call(&agent, "search", args).await);
    assert_eq!(ran_in, "lap");
    let lines: Vec<(u64, bool)> = found["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["line_number"].as_u64().unwrap(),
                m["context"] == json!(true),
            )
        })
        .collect();
    assert_eq!(
        lines,
        [(1, true), (2, false), (3, true), (4, false)],
        "{found}"
    );
    let args = json!({"pattern": "fn ", "files_only": true});
    let (found, _) = ok(call(&agent, "search", args).await);
    assert_eq!(found["files_only"], json!(true), "{found}");
    let files: Vec<&str> = found["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["path"].as_str().unwrap())
        .collect();
    assert_eq!(files, ["src/lib.rs", "src/main.rs"], "{found}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_focus_folder_calls_without_a_workspace_act_in_it() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let laptop = folder(&[
        ("src/lib.rs", "pub fn hello() {}\n"),
        ("README.md", "the project\n"),
    ]);
    let _attached = attach_focused(&server.client_config(), laptop.path(), "lap").await;
    // The primary workspace has a file too, so that an empty primary proves nothing.
    ok(call(
        &agent,
        "write_file",
        json!({"path": "plan.md", "content": "primary plan\n", "workspace": "primary"}),
    )
    .await);

    let (listed, ran_in) = ok(call(&agent, "list_dir", json!({})).await);
    assert_eq!(ran_in, "lap", "list_dir of the root");
    let paths: Vec<&str> = listed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e.as_str())
        .collect();
    assert!(
        paths.contains(&"src/") && paths.contains(&"README.md"),
        "{paths:?}"
    );
    assert!(!paths.contains(&"plan.md"), "{paths:?}");

    let (found, ran_in) = ok(call(&agent, "glob", json!({"pattern": "**/*.rs"})).await);
    assert_eq!(ran_in, "lap", "glob");
    assert_eq!(found["paths"], json!(["src/lib.rs"]));

    let (found, ran_in) = ok(call(&agent, "search", json!({"pattern": "fn hello"})).await);
    assert_eq!(ran_in, "lap", "search");
    assert_eq!(found["matches"][0]["path"], "src/lib.rs");

    // A new file, in a new folder: written in the focus, and read back from there.
    let (_, ran_in) = ok(call(
        &agent,
        "write_file",
        json!({"path": "notes/todo.md", "content": "ship it\n"}),
    )
    .await);
    assert_eq!(ran_in, "lap", "write_file of a new file");
    assert_eq!(
        std::fs::read_to_string(laptop.path().join("notes/todo.md")).unwrap(),
        "ship it\n"
    );
    assert!(!server.primary_dir("default").join("notes").exists());
    let (read, ran_in) = ok(call(&agent, "read_file", json!({"path": "notes/todo.md"})).await);
    assert_eq!(ran_in, "lap", "read_file");
    assert_eq!(read["content"], "ship it\n");

    // A file only the primary has is still found there.
    let (read, ran_in) = ok(call(&agent, "read_file", json!({"path": "plan.md"})).await);
    assert_eq!(
        (read["content"].as_str(), ran_in.as_str()),
        (Some("primary plan\n"), "primary")
    );

    // `workspaces` says where calls go.
    let (listed, _) = ok(call(&agent, "workspaces", json!({})).await);
    assert_eq!(listed["focus"], "lap");
    let routing = listed["routing"].as_str().unwrap();
    assert!(routing.contains("focus workspace `lap` first"), "{routing}");
    assert!(routing.contains("a new file goes to `lap`"), "{routing}");
}

/// A new file named without `workspace` goes where its directory is: the agent listed `many/`
/// in the attached folder and wrote `many/new.txt`, which went into a second `many/` made in
/// the primary workspace. A directory only the primary has takes it there, and a file in the
/// root, or in a directory no workspace has, goes to the first as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_file_goes_where_its_directory_is() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let laptop = folder(&[("many/a/one.txt", "1\n")]);
    let mut options = attach_options(laptop.path(), "lap");
    options.allow = vec![ToolClass::Read, ToolClass::Write];
    let _attached = Attachment::start(&server.client_config(), options, None).await;
    ok(call(
        &agent,
        "write_file",
        json!({"path": "docs/plan.md", "content": "p\n", "workspace": "primary"}),
    )
    .await);
    for (path, goes) in [
        ("many/new.txt", "lap"),
        ("many/a/b/c/deep.txt", "lap"),
        ("docs/more.md", "primary"),
        ("top.txt", "primary"),
        ("nowhere/x.txt", "primary"),
    ] {
        let (written, ran_in) = ok(call(
            &agent,
            "write_file",
            json!({"path": path, "content": "new\n"}),
        )
        .await);
        assert_eq!(ran_in, goes, "{path}: {written}");
    }
    assert!(laptop.path().join("many/new.txt").is_file());
    assert!(laptop.path().join("many/a/b/c/deep.txt").is_file());
    let primary = server.primary_dir("default");
    assert!(
        !primary.join("many").exists(),
        "a second many/ in the primary"
    );
    assert!(primary.join("docs/more.md").is_file());
    assert!(primary.join("nowhere/x.txt").is_file());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_focus_stays_while_its_folder_is_offline_and_comes_back_with_it() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let laptop = folder(&[("only-lap.txt", "lap\n")]);
    let device = server.client_config();
    let attached = attach_focused(&device, laptop.path(), "lap").await;
    let (_, ran_in) = ok(call(&agent, "list_dir", json!({})).await);
    assert_eq!(ran_in, "lap");

    // The connection goes: the folder is offline, and still the focus.
    drop(attached);
    until_online(&agent, "lap", false).await;
    let (listed, _) = ok(call(&agent, "workspaces", json!({})).await);
    assert_eq!(listed["focus"], "lap", "{listed}");
    let routing = listed["routing"].as_str().unwrap();
    assert!(
        routing.contains("focus workspace `lap` is offline"),
        "{routing}"
    );
    // A call without `workspace` cannot reach it, and goes nowhere else meanwhile; named, a
    // workspace is reached.
    let message = expect_code(
        call(&agent, "list_dir", json!({})).await,
        ErrorCode::WorkspaceDisconnected,
    );
    assert!(message.contains("focus workspace `lap`"), "{message}");
    let (_, ran_in) = ok(call(&agent, "list_dir", json!({"workspace": "primary"})).await);
    assert_eq!(ran_in, "primary");

    // Attached again, without --focus: the focus again.
    let mut options = attach_options(laptop.path(), "lap");
    options.allow = vec![ToolClass::Read];
    let again = Attachment::start(&device, options, None).await;
    assert_eq!(again.workspace.name, "lap");
    let (_, ran_in) = ok(call(&agent, "list_dir", json!({})).await);
    assert_eq!(ran_in, "lap");
}

/// An offline folder, the focus among them, stays in its session across a restart of the
/// server: before, the restarted server had forgotten it, and a new file without `workspace`
/// went to the primary workspace, the second copy the focus exists to prevent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offline_focus_folder_stays_across_a_restart_of_the_server() {
    let server = TestServer::start().await;
    let laptop = folder(&[("only-lap.txt", "lap\n")]);
    let other = folder(&[("b.txt", "b\n")]);
    let device = server.client_config();
    let attached = attach_focused(&device, laptop.path(), "lap").await;
    let mut options = attach_options(other.path(), "other");
    options.allow = vec![ToolClass::Read];
    let second = Attachment::start(&device, options, None).await;
    let agent = server.agent().await;
    drop(attached);
    drop(second);
    until_online(&agent, "lap", false).await;
    drop(agent);
    let server = server.stop().await.restart().await;
    let agent = server.agent().await;
    let (listed, _) = ok(call(&agent, "workspaces", json!({})).await);
    assert_eq!(listed["focus"], "lap", "{listed}");
    let names: Vec<(&str, bool)> = listed["workspaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["name"].as_str().unwrap(), w["online"].as_bool().unwrap()))
        .collect();
    // The focus is kept; another offline folder is not (it would hold back every new file).
    assert_eq!(names, [("primary", true), ("lap", false)], "{listed}");
    let message = expect_code(
        call(
            &agent,
            "write_file",
            json!({"path": "new.txt", "content": "x"}),
        )
        .await,
        ErrorCode::WorkspaceDisconnected,
    );
    assert!(message.contains("focus workspace `lap`"), "{message}");
    let primary = server.data_dir().join("sessions/default/workspace/new.txt");
    assert!(
        !primary.exists(),
        "written in the primary workspace instead"
    );
    // Attached again (without --focus): the same folder, the focus again, as before the restart.
    let mut options = attach_options(laptop.path(), "lap");
    options.allow = vec![ToolClass::Read, ToolClass::Write];
    let again = Attachment::start(&device, options, None).await;
    assert_eq!(again.workspace.name, "lap");
    let (_, ran_in) = ok(call(
        &agent,
        "write_file",
        json!({"path": "new.txt", "content": "x"}),
    )
    .await);
    assert_eq!(ran_in, "lap");
    assert!(laptop.path().join("new.txt").exists());
    // Detached by name, it is gone for good, across a restart too.
    drop(again);
    until_online(&agent, "lap", false).await;
    agent.detach(None, "lap").await.expect("detached");
    drop(agent);
    let server = server.stop().await.restart().await;
    let agent = server.agent().await;
    let (listed, _) = ok(call(&agent, "workspaces", json!({})).await);
    assert_eq!(
        listed["workspaces"].as_array().unwrap().len(),
        1,
        "{listed}"
    );
    assert_eq!(listed["focus"], json!(null), "{listed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_focus_ends_when_its_folder_is_detached_by_name() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let laptop = folder(&[]);
    let _attached = attach_focused(&server.client_config(), laptop.path(), "lap").await;
    within(STEP, "detach", agent.detach(None, "lap"))
        .await
        .expect("detached");
    let (listed, _) = ok(call(&agent, "workspaces", json!({})).await);
    assert_eq!(listed["focus"], json!(null), "{listed}");
    assert!(
        listed["routing"]
            .as_str()
            .unwrap()
            .contains("no focus workspace"),
        "{listed}"
    );
}

/// `monad-client attach DIR --name NAME` (reads and writes pre-approved, `--focus` when asked)
/// as a process of its own, so that it can be killed or stopped, from the device whose config
/// is in `config_dir` (saved there on first use); returns once it is attached.
async fn attach_process(
    server: &TestServer,
    config_dir: &std::path::Path,
    dir: &std::path::Path,
    name: &str,
    focus: bool,
) -> tokio::process::Child {
    use tokio::io::AsyncBufReadExt;
    if !config_dir.join("config.toml").exists() {
        server.client_config().save(config_dir).unwrap();
    }
    let mut cmd = monad_tests::command("monad-client");
    cmd.arg("attach")
        .arg(dir)
        .args([
            "--name",
            name,
            "--allow",
            "read",
            "write",
            "--non-interactive",
        ])
        .env("MONAD_CONFIG_DIR", config_dir);
    if focus {
        cmd.arg("--focus");
    }
    let mut child = cmd.spawn().expect("monad-client starts");
    let mut stderr = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    monad_tests::wait_for_line(&mut stderr, STEP, "the attach confirmation", |l| {
        l.starts_with("attached ")
    })
    .await;
    // Keep reading its standard error, so that it never waits on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = stderr.next_line().await {} });
    child
}

/// Issue 11, item 2: with its focus folder killed (`kill -9`), an un-targeted write of a file
/// that only that folder has was created in the primary workspace, and once the folder came
/// back reads went to it again: two copies. It fails now, saying what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_of_a_file_in_an_offline_focus_folder_is_refused_not_created_in_the_primary() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let config = tempfile::tempdir().unwrap();
    let laptop = folder(&[("notes.txt", "from the laptop\n")]);
    let mut child = attach_process(&server, config.path(), laptop.path(), "lap", true).await;
    let (read, ran_in) = ok(call(&agent, "read_file", json!({"path": "notes.txt"})).await);
    assert_eq!(
        (read["content"].as_str(), ran_in.as_str()),
        (Some("from the laptop\n"), "lap")
    );

    child.start_kill().expect("SIGKILL sent");
    within(STEP, "the client to die", child.wait())
        .await
        .unwrap();
    until_online(&agent, "lap", false).await;
    let (listed, _) = ok(call(&agent, "workspaces", json!({})).await);
    assert_eq!(listed["focus"], "lap", "the focus stays, offline: {listed}");

    for (tool, args) in [
        (
            "write_file",
            json!({"path": "notes.txt", "content": "from the agent\n"}),
        ),
        (
            "edit_file",
            json!({"path": "notes.txt", "old_string": "laptop", "new_string": "agent"}),
        ),
    ] {
        let message = expect_code(
            call(&agent, tool, args).await,
            ErrorCode::WorkspaceDisconnected,
        );
        for part in ["`lap`", "offline", "`workspace`"] {
            assert!(message.contains(part), "{tool}: {part}: {message}");
        }
    }
    assert!(!server.primary_dir("default").join("notes.txt").exists());
    // Nor is a read taken elsewhere.
    let message = expect_code(
        call(&agent, "read_file", json!({"path": "notes.txt"})).await,
        ErrorCode::WorkspaceDisconnected,
    );
    assert!(message.contains("focus workspace `lap`"), "{message}");
    // Named, the write goes where the agent says.
    let (_, ran_in) = ok(call(
        &agent,
        "write_file",
        json!({"path": "other.txt", "content": "x\n", "workspace": "primary"}),
    )
    .await);
    assert_eq!(ran_in, "primary");

    // The folder comes back (a new process, without --focus): the focus again, and the write
    // goes to the one copy.
    let _child = attach_process(&server, config.path(), laptop.path(), "lap", false).await;
    let (written, ran_in) = ok(call(
        &agent,
        "write_file",
        json!({"path": "notes.txt", "content": "from the agent\n"}),
    )
    .await);
    assert_eq!(
        (ran_in.as_str(), &written["created"]),
        ("lap", &json!(false))
    );
    assert_eq!(
        std::fs::read_to_string(laptop.path().join("notes.txt")).unwrap(),
        "from the agent\n"
    );
    assert!(!server.primary_dir("default").join("notes.txt").exists());
}

/// Issue 11 review, item 2: a probe that got no answer counted as "the folder does not have the
/// file", so a write of a file the (online, but stuck) folder has was created in the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_folder_cannot_answer_the_probe_is_refused_not_created_in_the_primary() {
    // Long enough an idle time-out that the folder is still online when the call is routed.
    let server =
        TestServer::start_with(|c| c.transport.idle_timeout = Duration::from_secs(8)).await;
    let agent = server.agent().await;
    let config = tempfile::tempdir().unwrap();
    let laptop = folder(&[("notes.txt", "from the laptop\n")]);
    let child = attach_process(&server, config.path(), laptop.path(), "lap", false).await;
    let pid = nix::unistd::Pid::from_raw(child.id().expect("running") as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("stopped");
    let reply = within(
        STEP,
        "the write",
        agent.call(
            None,
            "write_file",
            json!({"path": "notes.txt", "content": "from the agent\n"}),
            |_| {},
        ),
    )
    .await
    .expect("the server answers");
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
    let error = monad_tests::err(reply);
    assert!(
        matches!(
            error.code,
            ErrorCode::WorkspaceDisconnected | ErrorCode::Timeout
        ),
        "{error:?}"
    );
    assert!(error.message.contains("`lap`"), "{}", error.message);
    assert!(error.message.contains("`workspace`"), "{}", error.message);
    assert!(!server.primary_dir("default").join("notes.txt").exists());
    assert_eq!(
        std::fs::read_to_string(laptop.path().join("notes.txt")).unwrap(),
        "from the laptop\n"
    );
}

/// Issue 11 review, item 3: a take-over re-attach with `--name` renamed the folder but left
/// the focus on the old name, so a later folder given that name silently became the focus.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_focus_follows_its_folder_when_a_re_attach_renames_it() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let laptop = folder(&[("mine.txt", "the focus\n")]);
    let other = folder(&[("theirs.txt", "another folder\n")]);
    // The same device attaches the same folder again (another terminal), under a new name.
    let device = server.client_config();
    let first = attach_focused(&device, laptop.path(), "lap").await;
    let mut options = attach_options(laptop.path(), "work");
    options.allow = vec![ToolClass::Read];
    options.exact_name = true;
    let renamed = Attachment::start(&device, options, None).await;
    assert_eq!(renamed.workspace.name, "work");
    drop(first);
    let (listed, _) = ok(call(&agent, "workspaces", json!({})).await);
    let names: Vec<&str> = listed["workspaces"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w["name"].as_str())
        .collect();
    assert_eq!(names, ["primary", "work"], "renamed, not added: {listed}");
    assert_eq!(listed["focus"], "work", "{listed}");

    let mut options = attach_options(other.path(), "lap");
    options.allow = vec![ToolClass::Read];
    options.exact_name = true;
    let _other = Attachment::start(&server.client_config(), options, None).await;
    let (listed, _) = ok(call(&agent, "workspaces", json!({})).await);
    assert_eq!(listed["focus"], "work", "{listed}");
    let (entries, ran_in) = ok(call(&agent, "list_dir", json!({})).await);
    assert_eq!(ran_in, "work", "{entries}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_to_a_file_that_exists_only_in_a_folder_goes_to_that_folder() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let laptop = folder(&[("hello.txt", "hello from the laptop\n")]);
    let mut options = attach_options(laptop.path(), "lap");
    options.allow = vec![ToolClass::Read, ToolClass::Write];
    let _attached = Attachment::start(&server.client_config(), options, None).await;

    let (read, ran_in) = ok(call(&agent, "read_file", json!({"path": "hello.txt"})).await);
    assert_eq!(
        (read["content"].as_str(), ran_in.as_str()),
        (Some("hello from the laptop\n"), "lap")
    );
    // No focus: the write still goes where the file is, never a second copy in the primary.
    let (written, ran_in) = ok(call(
        &agent,
        "write_file",
        json!({"path": "hello.txt", "content": "hello again\n"}),
    )
    .await);
    assert_eq!(ran_in, "lap");
    assert_eq!(written["created"], false);
    assert_eq!(
        std::fs::read_to_string(laptop.path().join("hello.txt")).unwrap(),
        "hello again\n"
    );
    assert!(!server.primary_dir("default").join("hello.txt").exists());
    let (read, ran_in) = ok(call(&agent, "read_file", json!({"path": "hello.txt"})).await);
    assert_eq!(
        (read["content"].as_str(), ran_in.as_str()),
        (Some("hello again\n"), "lap")
    );

    // A new file, without a focus: the primary.
    let (_, ran_in) = ok(call(
        &agent,
        "write_file",
        json!({"path": "fresh.txt", "content": "new\n"}),
    )
    .await);
    assert_eq!(ran_in, "primary");
}

/// Without a focus, a write of a file that a later folder has, while an earlier one that may
/// have it too is offline, fails rather than writing the later one's copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_found_below_an_offline_folder_is_refused() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let first = folder(&[("README.md", "first\n")]);
    let second = folder(&[("README.md", "second\n")]);
    let writable = |dir: &std::path::Path, name: &str| {
        let mut options = attach_options(dir, name);
        options.allow = vec![ToolClass::Read, ToolClass::Write];
        options
    };
    let config = server.client_config();
    let early = Attachment::start(&config, writable(first.path(), "early"), None).await;
    let _late = Attachment::start(&config, writable(second.path(), "late"), None).await;
    drop(early);
    until_online(&agent, "early", false).await;
    let message = expect_code(
        call(
            &agent,
            "write_file",
            json!({"path": "README.md", "content": "agent\n"}),
        )
        .await,
        ErrorCode::WorkspaceDisconnected,
    );
    for part in ["`late` has it", "`early`", "offline", "`workspace`"] {
        assert!(message.contains(part), "{part}: {message}");
    }
    assert_eq!(
        std::fs::read_to_string(second.path().join("README.md")).unwrap(),
        "second\n"
    );
    // Named, it is written.
    let (_, ran_in) = ok(call(
        &agent,
        "write_file",
        json!({"path": "README.md", "content": "agent\n", "workspace": "late"}),
    )
    .await);
    assert_eq!(ran_in, "late");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_asked_to_run_a_read_where_the_path_is_decides_nothing_when_it_is_not_there() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    // The focus, so that it is asked first; nothing pre-approved and nobody to ask: any call
    // that reaches its policy is denied.
    let laptop = folder(&[("only-here.txt", "the laptop's\n")]);
    let mut options = attach_options(laptop.path(), "lap");
    options.focus = true;
    let mut attached = Attachment::start(&server.client_config(), options, None).await;
    ok(call(
        &agent,
        "write_file",
        json!({"path": "notes.md", "content": "primary notes\n", "workspace": "primary"}),
    )
    .await);

    // Not in the folder: it says so, decides nothing, and the read runs in the primary.
    let (result, ran_in) = ok(call(&agent, "read_file", json!({"path": "notes.md"})).await);
    assert_eq!(
        (result["content"].as_str(), ran_in.as_str()),
        (Some("primary notes\n"), "primary")
    );
    // In the folder: its policy decides, as for any call there.
    let message = expect_code(
        call(&agent, "read_file", json!({"path": "only-here.txt"})).await,
        ErrorCode::Denied,
    );
    assert!(message.contains("without a terminal to ask"), "{message}");
    // Nowhere: each was asked, none ran it.
    let message = expect_code(
        call(&agent, "stat", json!({"path": "missing"})).await,
        ErrorCode::NotFound,
    );
    assert!(message.contains("tried: lap, primary"), "{message}");
    // The folder's own account: one call decided, the one whose path it has.
    let decided = loop {
        match attached.next_event().await {
            AttachEvent::Decided { tool, target, .. } => break (tool, target),
            AttachEvent::Focus { .. } => continue,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(decided, (ToolName::ReadFile, "only-here.txt".to_owned()));
    let more = tokio::time::timeout(Duration::from_millis(300), attached.next_event()).await;
    assert!(more.is_err(), "{more:?}");
}

/// A path that leads out of a folder through a link on its way (`up/` → `..`) is there, in
/// that folder: a call that names no workspace is refused for what the path is, as the same
/// call naming the folder is, not reported as absent from every workspace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_out_through_a_link_on_its_way_is_refused_for_that_not_found_nowhere() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let laptop = folder(&[("proj/README.md", "hi\n")]);
    std::os::unix::fs::symlink("..", laptop.path().join("proj/up")).unwrap();
    std::os::unix::fs::symlink("loop", laptop.path().join("proj/loop")).unwrap();
    let _attached = attach_readable(&server, &laptop.path().join("proj"), "lap").await;

    for path in ["up/proj/README.md", "loop/x"] {
        let named = err(call(
            &agent,
            "read_file",
            json!({"path": path, "workspace": "lap"}),
        )
        .await);
        assert_ne!(named.code, ErrorCode::NotFound, "{path}: {named}");
        let routed = err(call(&agent, "read_file", json!({"path": path})).await);
        assert_eq!(
            (routed.code, &routed.message),
            (named.code, &named.message),
            "{path}"
        );
    }
    assert_eq!(
        err(call(&agent, "read_file", json!({"path": "up/proj/README.md"})).await).code,
        ErrorCode::OutsideWorkspace
    );
    // A path that is nowhere is still reported so.
    expect_code(
        call(&agent, "read_file", json!({"path": "no/such/x"})).await,
        ErrorCode::NotFound,
    );
}

/// An agent sees, before it runs anything, what network each workspace's commands get: the
/// server's policy for the primary workspace, and for a folder the one its client gives, still
/// known while the folder is offline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspaces_say_what_network_each_workspaces_commands_get() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let laptop = folder(&[("a.txt", "a\n")]);
    let mut options = attach_options(laptop.path(), "lap");
    options.exec.network = monad_sandbox::NetworkMode::Allowlist;
    options.exec.allow = vec!["pypi.org".into(), "*.github.com".into()];
    let device = server.client_config();
    let attached = Attachment::start(&device, options, None).await;
    let wanted = "network to pypi.org, *.github.com only";
    assert_eq!(attached.workspace.network.as_deref(), Some(wanted));

    let (listed, _) = ok(call(&agent, "workspaces", json!({})).await);
    let networks = |listed: &serde_json::Value| -> Vec<(String, Option<String>)> {
        listed["workspaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| {
                (
                    w["name"].as_str().unwrap().to_owned(),
                    w["network"].as_str().map(str::to_owned),
                )
            })
            .collect()
    };
    assert_eq!(
        networks(&listed),
        [
            ("primary".to_owned(), Some("no network".to_owned())),
            ("lap".to_owned(), Some(wanted.to_owned())),
        ],
        "{listed}"
    );
    // The model's text says it on each workspace's line.
    let text = monad_protocol::render::text(ToolName::Workspaces, None, &listed);
    assert!(
        text.contains("on the server, trusted (runs at once), commands get no network"),
        "{text}"
    );
    assert!(text.contains(&format!("commands get {wanted}")), "{text}");

    drop(attached);
    until_online(&agent, "lap", false).await;
    let (listed, _) = ok(call(&agent, "workspaces", json!({})).await);
    assert_eq!(
        networks(&listed)[1],
        ("lap".to_owned(), Some(wanted.to_owned())),
        "still known offline: {listed}"
    );
    // Attached again under another policy: what its client says now is listed.
    let mut options = attach_options(laptop.path(), "lap");
    options.exec.network = monad_sandbox::NetworkMode::Host;
    let again = Attachment::start(&device, options, None).await;
    assert_eq!(again.workspace.name, "lap");
    let (listed, _) = ok(call(&agent, "workspaces", json!({})).await);
    assert_eq!(
        networks(&listed)[1],
        (
            "lap".to_owned(),
            Some("full network (the host's)".to_owned())
        ),
        "{listed}"
    );
}
