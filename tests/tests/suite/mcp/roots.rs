//! MCP roots: the official MCP Python SDK plays a host whose roots are folders attached from
//! the same device (`tests/python/mcp_roots.py`), against the real `monad-client mcp`, the real
//! server and real attachments over loopback QUIC. The host names no workspace and must see the
//! folder: it lands in the folder's session with the folder as the focus.

use std::path::{Path, PathBuf};

use monad_client::ClientError;
use monad_client::config::ClientConfig;
use monad_protocol::wire::MAX_ROOTS;
use monad_protocol::{ErrorCode, ToolClass};
use monad_tests::{
    Attachment, STEP, TestServer, attach_options, binary, call_in, connect_agent, folder, within,
};
use serde_json::Value;
use tempfile::TempDir;

use super::python::python;
use super::{peer_output, saved_config};

/// A `file://` URI of an absolute path, percent-encoded as hosts send them.
fn file_uri(path: &Path) -> String {
    let mut uri = String::from("file://");
    for byte in path.to_str().expect("a UTF-8 path").bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'/' | b'-' | b'_' | b'.' | b'~' => {
                uri.push(byte as char);
            }
            other => uri.push_str(&format!("%{other:02X}")),
        }
    }
    uri
}

/// Lands `agent` by `roots`, in `session` when it names one, on a server that lands by roots.
async fn land_by(
    agent: &monad_client::agent::Agent,
    roots: Vec<String>,
    session: Option<&str>,
) -> monad_client::agent::Landing {
    within(STEP, "a landing", agent.land(roots, session))
        .await
        .expect("landed")
        .expect("a server that lands by roots")
}

/// A project folder (`notes.txt`, `src/main.rs`) inside a fresh directory, under a name with a
/// space (so its root URI has a percent escape); its canonical path.
fn project(name: &str, note: &str) -> (TempDir, PathBuf) {
    let outer = folder(&[]);
    let dir = outer.path().join(name);
    std::fs::create_dir_all(dir.join("src")).expect("project dir");
    std::fs::write(dir.join("notes.txt"), note).expect("notes");
    std::fs::write(dir.join("src/main.rs"), "fn main() {}\n").expect("main.rs");
    let canonical = dir.canonicalize().expect("canonical");
    (outer, canonical)
}

/// Attaches `dir` from the device of `config` as `name` (reads pre-approved), into `session`
/// (`None`: where the server puts it).
async fn attach(
    config: &ClientConfig,
    dir: &Path,
    name: &str,
    session: Option<&str>,
) -> Attachment {
    let mut options = attach_options(dir, name);
    options.allow = vec![ToolClass::Read];
    options.session = session.map(str::to_owned);
    Attachment::start(config, options, None).await
}

/// Binds the device of `config` to `default` again (attaching into a named session binds it
/// there), so that a host that lands by nothing lands in `default`.
async fn bind_default(config: &ClientConfig) {
    let agent = connect_agent(config).await;
    within(STEP, "open default", agent.open_session(Some("default")))
        .await
        .expect("default opens");
}

/// Runs the Python host with `args`; returns its JSON lines. `None` when there is no Python
/// with the SDK (the test then says so and passes, or fails under `scripts/test`).
async fn host(config_dir: &Path, args: &[String]) -> Option<Vec<Value>> {
    host_said(config_dir, args).await.map(|(looks, _)| looks)
}

/// Like [`host`], with what was written on standard error (the bridge's included).
async fn host_said(config_dir: &Path, args: &[String]) -> Option<(Vec<Value>, String)> {
    let Some(python) = python() else {
        monad_tests::peer_missing(
            "mcp roots",
            "no Python with the MCP SDK (set MONAD_TEST_PYTHON, or run scripts/test)",
        );
        return None;
    };
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/mcp_roots.py");
    let mut peer = tokio::process::Command::new(python);
    peer.arg(script)
        .arg("--client")
        .arg(binary("monad-client"))
        .arg("--config-dir")
        .arg(config_dir)
        .args(args);
    let (stdout, stderr) = peer_output(peer, "the Python host", STEP * 2).await;
    let looks = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    Some((looks, stderr))
}

/// A server, and a project `proj` attached from the device into a session of its own, the
/// device's binding back on `default`: a host that is not landed stays in `default`.
struct Attached {
    _server: TestServer,
    _project: TempDir,
    proj: PathBuf,
    _attachment: Attachment,
    /// The host's config dir (the device's).
    dir: TempDir,
}

impl Attached {
    async fn elsewhere() -> Attached {
        let server = TestServer::start().await;
        let config = server.client_config();
        let agent = connect_agent(&config).await;
        let (project, proj) = project("proj", "x\n");
        let work = within(STEP, "session", agent.open_session(None))
            .await
            .expect("a session");
        let attachment = attach(&config, &proj, "proj", Some(&work.id)).await;
        bind_default(&config).await;
        let dir = saved_config(&config);
        Attached {
            _server: server,
            _project: project,
            proj,
            _attachment: attachment,
            dir,
        }
    }
}

fn roots(uris: &[String]) -> Vec<String> {
    uris.iter()
        .flat_map(|u| ["--root".to_owned(), u.clone()])
        .collect()
}

/// Checks that a look of the host saw project `name` (with `note`) without naming it.
fn sees(look: &Value, session: &str, name: &str, note: &str) {
    assert_eq!(look["session"], session, "{look}");
    assert_eq!(look["focus"], name, "{look}");
    assert_eq!(look["list_workspace"], name, "{look}");
    assert_eq!(
        look["list"],
        serde_json::json!(["notes.txt", "src/"]),
        "{look}"
    );
    assert_eq!(look["read"], note, "{look}");
    assert_eq!(look["read_workspace"], name, "{look}");
    let found = look["search"].as_str().unwrap_or_default();
    assert!(found.contains("notes.txt:1:"), "{look}");
    assert_eq!(look["search_error"], false, "{look}");
}

fn look_args() -> Vec<String> {
    ["--read", "notes.txt", "--search", r"\S"]
        .map(str::to_owned)
        .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_root_is_an_attached_folder_lands_in_its_session_and_sees_it() {
    let server = TestServer::start().await;
    let config = server.client_config();
    let (_p, proj) = project("my proj", "hello from the project\n");
    let agent = connect_agent(&config).await;
    let work = within(STEP, "a session", agent.open_session(None))
        .await
        .expect("a new session");
    let attached = attach(&config, &proj, "proj", Some(&work.id)).await;
    assert_eq!(attached.session, work.id);
    bind_default(&config).await;
    let dir = saved_config(&config);

    // The root is the folder itself, then a directory inside it: the same landing.
    for root in [proj.clone(), proj.join("src")] {
        let mut args = roots(&[file_uri(&root)]);
        args.extend(look_args());
        let Some(looks) = host(dir.path(), &args).await else {
            return;
        };
        assert_eq!(looks.len(), 1);
        sees(&looks[0], &work.id, "proj", "hello from the project\n");
        let landing = looks[0]["landings"][0]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            landing.contains("whose focus is workspace `proj`"),
            "{landing}"
        );
        // A root inside the folder: the host is told where a tool's paths start.
        let told = landing.contains(&format!(
            "a tool's relative path is from {}, not from the root {}",
            proj.display(),
            root.display()
        ));
        assert_eq!(told, root != proj, "{landing}");
    }
    assert!(
        server.data_dir().join("folder_sessions.toml").exists(),
        "the registry is kept in the data dir"
    );
}

/// Issue 11 review, item 4: `attach` sends the folder resolved, but the host's roots went as
/// given, so a root that is a symlink to the folder (or inside it through one) matched nothing;
/// then, once it matched, the note on where a tool's paths start was left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_that_reaches_an_attached_folder_through_a_symlink_lands_in_it() {
    let server = TestServer::start().await;
    let config = server.client_config();
    let (_p, proj) = project("proj", "through a link\n");
    let links = folder(&[]);
    std::os::unix::fs::symlink(&proj, links.path().join("alias")).expect("symlink");
    let agent = connect_agent(&config).await;
    let work = within(STEP, "a session", agent.open_session(None))
        .await
        .expect("a new session");
    let _attached = attach(&config, &proj, "proj", Some(&work.id)).await;
    bind_default(&config).await;
    let dir = saved_config(&config);
    let alias = links.path().join("alias");
    for root in [alias.clone(), alias.join("src")] {
        let mut args = roots(&[file_uri(&root)]);
        args.extend(look_args());
        let Some(looks) = host(dir.path(), &args).await else {
            return;
        };
        sees(&looks[0], &work.id, "proj", "through a link\n");
        // A root inside the folder through the link: the host is told where a tool's paths
        // start, naming its root as it gave it (this was left out: the root as given was not
        // inside the folder as attached).
        let landing = looks[0]["landings"][0].as_str().unwrap_or_default();
        let told = landing.contains(&format!(
            "a tool's relative path is from {}, not from the root {}",
            proj.display(),
            root.display()
        ));
        assert_eq!(told, root != alias, "{landing}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_new_in_a_folder_makes_the_next_landing_a_new_session_with_the_folder() {
    let server = TestServer::start().await;
    let config = server.client_config();
    let (_p, proj) = project("proj", "first\n");
    let attached = attach(&config, &proj, "proj", None).await;
    let dir = saved_config(&config);
    let mut args = roots(&[file_uri(&proj)]);
    args.extend(look_args());
    let Some(first) = host(dir.path(), &args).await else {
        return;
    };
    sees(&first[0], &attached.session, "proj", "first\n");

    // `sessions --new`, run inside the folder.
    let mut cmd = monad_tests::command("monad-client");
    cmd.args(["sessions", "--new"])
        .current_dir(proj.join("src"))
        .env("MONAD_CONFIG_DIR", dir.path());
    let out = within(STEP, "sessions --new", cmd.output())
        .await
        .expect("it runs");
    assert!(out.status.success(), "{out:?}");
    let fresh = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert_ne!(fresh, attached.session);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("`proj`"),
        "says the folder works in it: {out:?}"
    );

    let Some(second) = host(dir.path(), &args).await else {
        return;
    };
    sees(&second[0], &fresh, "proj", "first\n");

    // One attachment, served in both sessions; its detach takes it offline in both.
    let agent = connect_agent(&config).await;
    let mut watch = within(STEP, "watch", agent.watch(Some(&fresh)))
        .await
        .expect("watch");
    let mut old = within(STEP, "watch", agent.watch(Some(&attached.session)))
        .await
        .expect("watch");
    drop(attached);
    for updates in [&mut watch, &mut old] {
        within(STEP, "the folder to go offline", async {
            loop {
                let (_, list) = updates.recv().await.expect("the watch runs");
                let proj = list.iter().find(|w| w.name == "proj").expect("listed");
                if !proj.online {
                    break;
                }
            }
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_folder_s_active_session_survives_a_server_restart() {
    restart_keeps_the_folder_s_session(|_| {}).await;
}

/// A folder attached, a session of its own for it (the device's binding back on `default`, so
/// that only the registry knows it), the server stopped, `meanwhile` done to its data dir, and
/// restarted: the attachment reconnects by itself and, naming no session, goes to the folder's
/// active session (from the registry on disk), and a host whose root is the folder lands there.
async fn restart_keeps_the_folder_s_session(meanwhile: impl FnOnce(&Path)) {
    let server = TestServer::start().await;
    let config = server.client_config();
    let (_p, proj) = project("proj", "kept\n");
    let mut attached = attach(&config, &proj, "proj", None).await;
    let dir = saved_config(&config);
    let agent = connect_agent(&config).await;
    let fresh = within(
        STEP,
        "a new session for the folder",
        agent.open_session_in(None, proj.to_str()),
    )
    .await
    .expect("opened");
    assert_ne!(fresh.id, attached.session);
    bind_default(&config).await;
    drop(agent);

    let stopped = server.stop().await;
    meanwhile(stopped.data_dir());
    let server = stopped.restart().await;
    attached.wait_attached().await;
    assert_eq!(
        attached.session, fresh.id,
        "re-attached into the folder's active session, not sent back to the default"
    );
    let mut args = roots(&[file_uri(&proj)]);
    args.extend(look_args());
    let Some(looks) = host(dir.path(), &args).await else {
        return;
    };
    sees(&looks[0], &fresh.id, "proj", "kept\n");
    drop(server);
}

/// One focus per session: a host on another device, landing in a session whose focus is this
/// device's folder, gets a session of its own for its folder instead of moving the focus (which
/// would send the first host's un-targeted writes into the other device's folder).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_on_another_device_does_not_move_the_focus_under_the_first() {
    let server = TestServer::start().await;
    let first = server.client_config();
    let second = server.client_config();
    let (_p1, proj) = project("proj", "first device\n");
    let (_p2, proj2) = project("proj2", "second device\n");
    let _a1 = attach(&first, &proj, "proj", Some("default")).await;
    let dir1 = saved_config(&first);
    let mut args1 = roots(&[file_uri(&proj)]);
    args1.extend(look_args());
    let Some(looks) = host(dir1.path(), &args1).await else {
        return;
    };
    sees(&looks[0], "default", "proj", "first device\n");

    let _a2 = attach(&second, &proj2, "proj2", Some("default")).await;
    let dir2 = saved_config(&second);
    let mut args2 = roots(&[file_uri(&proj2)]);
    args2.extend(look_args());
    let Some(looks) = host(dir2.path(), &args2).await else {
        return;
    };
    let own = looks[0]["session"].as_str().unwrap_or_default().to_owned();
    assert_ne!(own, "default", "{}", looks[0]);
    sees(&looks[0], &own, "proj2", "second device\n");

    // The first host still works in its folder, and so does the second, again.
    let Some(looks) = host(dir1.path(), &args1).await else {
        return;
    };
    sees(&looks[0], "default", "proj", "first device\n");
    let Some(looks) = host(dir2.path(), &args2).await else {
        return;
    };
    sees(&looks[0], &own, "proj2", "second device\n");
}

/// A folder the registry remembers, offline now, does not take a root from the online folder
/// around it: the host lands where it can see the project.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offline_inner_folder_does_not_win_a_root_from_the_online_folder_around_it() {
    let server = TestServer::start().await;
    let config = server.client_config();
    let (_p, outer) = project("outer", "outer note\n");
    let inner = outer.join("inner");
    std::fs::create_dir_all(inner.join("src")).unwrap();
    std::fs::write(inner.join("notes.txt"), "inner note\n").unwrap();
    let agent = connect_agent(&config).await;
    let inner_session = within(STEP, "a session", agent.open_session(None))
        .await
        .expect("a new session");
    let outer_session = within(STEP, "a session", agent.open_session(None))
        .await
        .expect("a new session");
    let dir = saved_config(&config);
    // The inner folder is attached, and a host lands in it: the registry remembers it.
    let attached_inner = attach(&config, &inner, "inner", Some(&inner_session.id)).await;
    bind_default(&config).await;
    let mut args = roots(&[file_uri(&inner)]);
    args.extend(look_args());
    let Some(looks) = host(dir.path(), &args).await else {
        return;
    };
    assert_eq!(
        looks[0]["session"],
        inner_session.id.as_str(),
        "{}",
        looks[0]
    );
    drop(attached_inner);
    let _outer = attach(&config, &outer, "outer", Some(&outer_session.id)).await;
    bind_default(&config).await;
    // A root inside the inner folder, which only the online outer folder holds now.
    let mut args = roots(&[file_uri(&inner.join("src"))]);
    args.extend(look_args());
    let Some(looks) = host(dir.path(), &args).await else {
        return;
    };
    let look = &looks[0];
    assert_eq!(look["session"], outer_session.id.as_str(), "{look}");
    assert_eq!(look["focus"], "outer", "{look}");
    assert_eq!(look["read"], "outer note\n", "{look}");
    assert_eq!(look["read_workspace"], "outer", "{look}");
}

/// Seed 002's 24 hours count from a session's last use, its work included: a host that landed
/// in a folder's session more than a day ago and has worked in it since keeps it, through a
/// restart too (the registry's own timestamp is only when a host last landed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_worked_in_since_its_landing_a_day_ago_survives_a_restart() {
    // As if the last landing were 25 hours ago; the session's own metadata says it was active
    // just now.
    restart_keeps_the_folder_s_session(|data| {
        let path = data.join("folder_sessions.toml");
        let mut registry: toml::Table =
            toml::from_str(&std::fs::read_to_string(&path).unwrap()).expect("the registry is TOML");
        let day_ago = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
            - 25 * 3_600_000;
        let mut aged = 0;
        for entry in registry["folders"].as_array_mut().expect("entries") {
            for (_, used) in entry["sessions"].as_table_mut().expect("sessions") {
                *used = toml::Value::Integer(day_ago);
                aged += 1;
            }
        }
        assert!(aged >= 1, "{registry}");
        std::fs::write(&path, toml::to_string(&registry).unwrap()).unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roots_list_changed_to_another_folder_switches_the_session_and_focus() {
    let server = TestServer::start().await;
    let config = server.client_config();
    let agent = connect_agent(&config).await;
    let (_a, a) = project("alpha", "alpha notes\n");
    let (_b, b) = project("beta", "beta notes\n");
    let sa = within(STEP, "session", agent.open_session(None))
        .await
        .expect("a");
    let sb = within(STEP, "session", agent.open_session(None))
        .await
        .expect("b");
    let _in_a = attach(&config, &a, "alpha", Some(&sa.id)).await;
    let _in_b = attach(&config, &b, "beta", Some(&sb.id)).await;
    bind_default(&config).await;
    let dir = saved_config(&config);
    let mut args = roots(&[file_uri(&a)]);
    args.extend(["--change-to".to_owned(), file_uri(&b)]);
    args.extend(look_args());
    let Some(looks) = host(dir.path(), &args).await else {
        return;
    };
    assert_eq!(looks.len(), 2, "{looks:?}");
    sees(&looks[0], &sa.id, "alpha", "alpha notes\n");
    sees(&looks[1], &sb.id, "beta", "beta notes\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_with_no_matching_root_or_without_roots_stays_in_its_default_session() {
    let fx = Attached::elsewhere().await;
    let (proj, dir) = (fx.proj.clone(), &fx.dir);
    let elsewhere = folder(&[]);
    let near = proj.with_file_name("proj2");
    std::fs::create_dir_all(&near).expect("a sibling");
    let cases: Vec<Vec<String>> = vec![
        vec!["--no-roots".into()],
        roots(&[file_uri(elsewhere.path())]),
        // A sibling whose name starts like the folder's is not inside it.
        roots(&[file_uri(&near)]),
        // A parent of the folder is not inside it.
        roots(&[file_uri(proj.parent().expect("a parent"))]),
        roots(&[]),
    ];
    for case in cases {
        let Some(looks) = host(dir.path(), &case).await else {
            return;
        };
        assert_eq!(looks[0]["session"], "default", "{case:?}: {}", looks[0]);
        assert_eq!(looks[0]["focus"], Value::Null, "{case:?}: {}", looks[0]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_never_answers_roots_list_works_in_its_default_session() {
    let fx = Attached::elsewhere().await;
    let (proj, dir) = (fx.proj.clone(), &fx.dir);
    let mut args = roots(&[file_uri(&proj)]);
    args.push("--never-answer".into());
    let Some(looks) = host(dir.path(), &args).await else {
        return;
    };
    // Its calls waited for the landing, which gave up: they ran in the default session.
    assert_eq!(looks[0]["session"], "default", "{}", looks[0]);
    assert_eq!(looks[0]["focus"], Value::Null, "{}", looks[0]);
    let logs = looks[0]["logs"].to_string();
    assert!(
        logs.contains("did not answer roots/list"),
        "the host is told: {logs}"
    );
}

/// Regression: the bridge's default log filter was `monad_client=warn`, which hid the warnings
/// of the roots code (`monad_protocol`): without `RUST_LOG`, nothing reached standard error,
/// though docs/mcp.md promises a warning there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_left_in_its_default_session_is_warned_on_stderr_without_rust_log() {
    let fx = Attached::elsewhere().await;
    let (proj, dir) = (fx.proj.clone(), &fx.dir);
    let elsewhere = folder(&[]);
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--no-roots".into()],
            "did not declare the roots capability",
        ),
        (
            [roots(&[file_uri(&proj)]), vec!["--error-answer".into()]].concat(),
            "the host's roots are unknown",
        ),
        (
            [roots(&[file_uri(&proj)]), vec!["--never-answer".into()]].concat(),
            "did not answer roots/list",
        ),
        (
            roots(&[file_uri(elsewhere.path())]),
            "no root is in a folder attached from this machine",
        ),
    ];
    for (mut case, warning) in cases {
        case.push("--default-log".into());
        let Some((looks, stderr)) = host_said(dir.path(), &case).await else {
            return;
        };
        assert_eq!(looks[0]["session"], "default", "{case:?}: {}", looks[0]);
        assert!(
            stderr.contains("WARN") && stderr.contains(warning),
            "{case:?}: `{warning}` on stderr:\n{stderr}"
        );
        let logs = looks[0]["logs"].to_string();
        assert!(logs.contains(warning), "{case:?}: the host is told: {logs}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_roots_are_skipped_and_too_many_are_cut_without_harm() {
    let server = TestServer::start().await;
    let config = server.client_config();
    let agent = connect_agent(&config).await;
    let (_p, proj) = project("proj", "found\n");
    let work = within(STEP, "session", agent.open_session(None))
        .await
        .expect("a session");
    let _attached = attach(&config, &proj, "proj", Some(&work.id)).await;
    bind_default(&config).await;
    let dir = saved_config(&config);
    let good = file_uri(&proj);
    let path = proj.to_str().expect("UTF-8");
    let bad: Vec<String> = vec![
        format!("https://example.com{path}"),
        path.to_owned(),
        "relative/dir".into(),
        format!("file://another-machine{path}"),
        format!("file://{path}/%ff%fe"),
        format!("file://{path}/%zz"),
        format!("file://{path}/../proj"),
        format!("file://{path}?q=1"),
        format!("file:///{}", "a/".repeat(3000)),
        String::new(),
        "file:".into(),
    ];
    // Bad roots first, then the folder: the bad ones are skipped, the folder still lands.
    let mut listed = bad.clone();
    listed.push(good.clone());
    let file = dir.path().join("roots.json");
    std::fs::write(&file, serde_json::to_vec(&listed).expect("json")).expect("roots file");
    let mut args = vec!["--roots-file".to_owned(), file.display().to_string()];
    args.extend(look_args());
    let Some(looks) = host(dir.path(), &args).await else {
        return;
    };
    sees(&looks[0], &work.id, "proj", "found\n");

    // A huge list: only the first MAX_ROOTS are looked at, so a match after them lands nowhere.
    let mut huge: Vec<String> = (0..MAX_ROOTS + 36)
        .map(|i| format!("file:///nowhere/{i}"))
        .collect();
    huge.push(good.clone());
    std::fs::write(&file, serde_json::to_vec(&huge).expect("json")).expect("roots file");
    // Landing bound the device to the folder's session: back to `default`.
    bind_default(&config).await;
    let Some(looks) = host(
        dir.path(),
        &["--roots-file".to_owned(), file.display().to_string()],
    )
    .await
    else {
        return;
    };
    assert_eq!(looks[0]["session"], "default", "{}", looks[0]);
    assert_eq!(looks[0]["focus"], Value::Null, "{}", looks[0]);

    // The server bounds what an agent sends too: a clear error, nothing changed.
    let too_many: Vec<String> = (0..=MAX_ROOTS).map(|_| good.clone()).collect();
    match within(STEP, "land", agent.land(too_many, None)).await {
        Err(ClientError::Refused(e)) => {
            assert_eq!(e.code, ErrorCode::InvalidArguments);
            assert!(e.message.contains("at most"), "{}", e.message);
        }
        other => panic!("too many roots are refused: {other:?}"),
    }
    let landed = within(STEP, "land", agent.land(bad, None))
        .await
        .expect("bad roots are no error")
        .expect("this server lands by roots");
    assert_eq!(landed.folder, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_the_host_names_wins_over_its_roots() {
    let server = TestServer::start().await;
    let config = server.client_config();
    let agent = connect_agent(&config).await;
    let (_p, proj) = project("proj", "x\n");
    let work = within(STEP, "session", agent.open_session(None))
        .await
        .expect("a session");
    let other = within(STEP, "session", agent.open_session(None))
        .await
        .expect("another session");
    let _attached = attach(&config, &proj, "proj", Some(&work.id)).await;
    bind_default(&config).await;
    let dir = saved_config(&config);
    let mut args = roots(&[file_uri(&proj)]);
    args.extend(["--".to_owned(), "--session".to_owned(), other.id.clone()]);
    let Some(looks) = host(dir.path(), &args).await else {
        return;
    };
    assert_eq!(looks[0]["session"], other.id.as_str(), "{}", looks[0]);
    assert_eq!(
        looks[0]["focus"],
        Value::Null,
        "the folder is not attached there"
    );
    // Named, and the folder is attached there: the roots set the focus.
    let mut args = roots(&[file_uri(&proj)]);
    args.extend(["--".to_owned(), "--session".to_owned(), work.id.clone()]);
    let Some(looks) = host(dir.path(), &args).await else {
        return;
    };
    assert_eq!(looks[0]["session"], work.id.as_str(), "{}", looks[0]);
    assert_eq!(looks[0]["focus"], "proj", "{}", looks[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_user_claiming_the_device_id_cannot_land_in_or_share_the_folder() {
    let server = TestServer::start().await;
    let owner = server.client_config();
    let (_p, proj) = project("proj", "private\n");
    let owners = connect_agent(&owner).await;
    let work = within(STEP, "session", owners.open_session(None))
        .await
        .expect("a session");
    let _attached = attach(&owner, &proj, "proj", Some(&work.id)).await;
    // The owner's host landed once: the folder has a registry entry too.
    let landed = within(STEP, "land", owners.land(vec![file_uri(&proj)], None))
        .await
        .expect("lands")
        .expect("lands by roots");
    assert_eq!(landed.session, work.id);

    let token = server.create_token("mallory");
    let mut mallory = server.client_config_with(&token);
    mallory.device_id = owner.device_id.clone();
    let agent = connect_agent(&mallory).await;
    let theirs = within(STEP, "land", agent.land(vec![file_uri(&proj)], None))
        .await
        .expect("no error")
        .expect("lands by roots");
    assert_ne!(theirs.session, work.id, "never the owner's session");
    assert_eq!(
        theirs.folder, None,
        "the owner's folder matches nothing of theirs"
    );
    assert_eq!(theirs.focus, None);
    let fresh = within(
        STEP,
        "sessions --new in the folder",
        agent.open_session_in(None, proj.to_str()),
    )
    .await
    .expect("a session of their own");
    for session in [&theirs.session, &fresh.id] {
        let (_, listed) = within(STEP, "workspaces", agent.workspaces(Some(session)))
            .await
            .expect("their session");
        assert_eq!(
            listed.iter().map(|w| w.name.as_str()).collect::<Vec<_>>(),
            ["primary"],
            "the owner's folder is not shared into {session}"
        );
    }
    let (_, owners_list) = within(STEP, "workspaces", owners.workspaces(Some(&work.id)))
        .await
        .expect("the owner's session");
    assert_eq!(owners_list.len(), 2, "the owner's session is unchanged");
}

/// Two hosts of one device, each working in its own folder, both folders attached into one
/// session: the second host's landing does not move the focus under the first (whose writes
/// that name no workspace would then land in the second's project); it works in a session of
/// its own, with its folder. The first host's hold on the focus ends with its connection: a
/// host landing afterwards may move it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_host_in_another_folder_does_not_move_the_focus_under_the_first() {
    let server = TestServer::start().await;
    let config = server.client_config();
    let (_p1, one) = project("one", "first\n");
    let (_p2, two) = project("two", "second\n");
    let mut attached = Vec::new();
    for (dir, name) in [(&one, "one"), (&two, "two")] {
        let mut options = attach_options(dir, name);
        options.allow = vec![ToolClass::Read, ToolClass::Write];
        options.session = Some("default".into());
        attached.push(Attachment::start(&config, options, None).await);
    }
    let land = async |agent: &monad_client::agent::Agent, root: &Path, session: Option<&str>| {
        land_by(agent, vec![file_uri(root)], session).await
    };
    let write = async |agent: &monad_client::agent::Agent, session: &str, path: &str| {
        let args = serde_json::json!({"path": path, "content": "x\n"});
        let reply = within(
            STEP,
            "a write",
            agent.call(Some(session), "write_file", args, |_| {}),
        )
        .await
        .expect("the write is answered");
        reply.workspace.expect("a workspace ran it").name
    };

    let first = connect_agent(&config).await;
    let landed = land(&first, &one, None).await;
    assert_eq!(landed.session, "default");
    assert_eq!(landed.focus.as_deref(), Some("one"));

    let second = connect_agent(&config).await;
    let other = land(&second, &two, None).await;
    assert_ne!(
        other.session, "default",
        "the second host took the first's session"
    );
    assert_eq!(other.focus.as_deref(), Some("two"));

    // Each host's write that names no workspace lands in its own project.
    assert_eq!(write(&first, "default", "from_first.txt").await, "one");
    assert_eq!(
        write(&second, &other.session, "from_second.txt").await,
        "two"
    );
    assert!(one.join("from_first.txt").exists() && !two.join("from_first.txt").exists());
    assert!(two.join("from_second.txt").exists() && !one.join("from_second.txt").exists());

    // The first host landing again (its roots changed to the same folder) keeps its focus.
    let again = land(&first, &one, None).await;
    assert_eq!(
        (again.session.as_str(), again.focus.as_deref()),
        ("default", Some("one"))
    );

    // Gone, it holds nothing: a host landing on `two` in `default` moves the focus there
    // (once the server has seen the connection end).
    first.close("done").await;
    drop(first);
    let third = connect_agent(&config).await;
    let moved = within(
        STEP,
        "the focus to move once the first host is gone",
        async {
            loop {
                let landed = land(&third, &two, Some("default")).await;
                if landed.focus.as_deref() == Some("two") {
                    break landed;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        },
    )
    .await;
    assert_eq!(moved.session, "default");
    assert_eq!(write(&third, "default", "from_third.txt").await, "two");
}

/// `monad-client mcp`'s backend lands again on a connection it makes after the last one ended
/// (the server gone and back, a network change): the host's hold on its focus goes with the
/// connection that landed, and a second host landing afterwards must still find it held. The
/// calls' connection lands again at the next call; the watch's at once, when it reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridge_lands_again_on_a_new_connection_and_keeps_its_hold_on_the_focus() {
    use monad_protocol::mcp::Backend;
    let server = TestServer::start().await;
    let config = server.client_config();
    let (_p1, one) = project("one", "first\n");
    let (_p2, two) = project("two", "second\n");
    let _a1 = attach(&config, &one, "one", Some("default")).await;
    let _a2 = attach(&config, &two, "two", Some("default")).await;
    let caller = rmcp::model::Extensions::default();

    // The calls' connection.
    let bridge = monad_client::mcp::AgentBackend::new(config.clone());
    let landed = within(
        STEP,
        "the bridge to land",
        bridge.land(&caller, vec![file_uri(&one)], None),
    )
    .await
    .expect("landed")
    .expect("a server that lands by roots");
    assert_eq!(landed.session, "default");
    assert_eq!(landed.focus.as_deref(), Some("one"));
    bridge.close("gone for a while").await;
    // Once the server has let the closed connection's hold go, a landing on `two` moves the
    // focus; moved back and let go, `one` is the focus and nobody holds it.
    let third = connect_agent(&config).await;
    within(STEP, "the closed connection's hold to go", async {
        while land_by(&third, vec![file_uri(&two)], Some("default"))
            .await
            .focus
            .as_deref()
            != Some("two")
        {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(
        land_by(&third, vec![file_uri(&one)], Some("default"))
            .await
            .focus
            .as_deref(),
        Some("one")
    );
    land_by(&third, Vec::new(), Some("default")).await;
    // The bridge's next call connects again, and lands again first.
    let (session, _) = within(
        STEP,
        "the bridge to reconnect",
        bridge.open(&caller, Some("default")),
    )
    .await
    .expect("reconnected");
    assert_eq!(session, "default");
    let second = connect_agent(&config).await;
    let other = land_by(&second, vec![file_uri(&two)], None).await;
    assert_ne!(
        other.session, "default",
        "the bridge's hold was lost with its connection"
    );
    assert_eq!(other.focus.as_deref(), Some("two"));

    // The watch's connection, made again by itself, lands again before its first list (in a
    // session of their own: the bridge above still holds `default`'s focus).
    let work = within(STEP, "a session", third.open_session(None))
        .await
        .expect("a session")
        .id;
    let (_p3, three) = project("three", "third\n");
    let (_p4, four) = project("four", "fourth\n");
    let _a3 = attach(&config, &three, "three", Some(&work)).await;
    let _a4 = attach(&config, &four, "four", Some(&work)).await;
    let watcher = monad_client::mcp::AgentBackend::new(config.clone());
    let landed = within(
        STEP,
        "a landing",
        watcher.land(&caller, vec![file_uri(&three)], Some(&work)),
    )
    .await
    .expect("landed")
    .expect("a server that lands by roots");
    assert_eq!(landed.focus.as_deref(), Some("three"));
    let mut lists = within(STEP, "a watch", watcher.watch(&caller, &work))
        .await
        .expect("watching");
    within(STEP, "the first list", lists.recv())
        .await
        .expect("a list");
    watcher.close("gone for a while").await;
    within(STEP, "the list after the watch reconnected", lists.recv())
        .await
        .expect("a list");
    let fourth = connect_agent(&config).await;
    let other = land_by(&fourth, vec![file_uri(&four)], None).await;
    assert_ne!(other.session, work, "the watch did not land again");
    // The host's roots change to another folder of the session: its own hold, on the
    // connection the watch made again, does not hold it back (its calls use that connection
    // too; on one of their own, the focus stayed on `three` while the host worked in `five`).
    let (_p5, five) = project("five", "fifth\n");
    let _a5 = attach(&config, &five, "five", Some(&work)).await;
    let moved = within(
        STEP,
        "a landing on another folder",
        watcher.land(&caller, vec![file_uri(&five)], Some(&work)),
    )
    .await
    .expect("landed")
    .expect("a server that lands by roots");
    assert_eq!(moved.session, work);
    assert_eq!(moved.focus.as_deref(), Some("five"));
}

/// The next move of the session's focus to or from an attached folder, as its owner is told
/// (other events skipped).
async fn next_focus_move(attached: &mut Attachment) -> (bool, Option<String>) {
    let (focus, now, session) = next_focus_move_anywhere(attached).await;
    assert_eq!(
        session, None,
        "a move in another session than the folder's own"
    );
    (focus, now)
}

/// The next move of the focus to or from an attached folder in any session it serves (`None`:
/// the one it attached to), within [`STEP`].
async fn next_focus_move_anywhere(
    attached: &mut Attachment,
) -> (bool, Option<String>, Option<String>) {
    within(STEP, "the owner to hear", async {
        loop {
            if let monad_client::attach::AttachEvent::FocusMoved {
                focus,
                now,
                session,
            } = attached.next_event().await
            {
                return (focus, now, session);
            }
        }
    })
    .await
}

/// The owner of an attached folder is told when a host's landing makes it the session's focus
/// (an agent's calls that name no workspace then go there), and when the focus leaves it for
/// another folder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_s_owner_is_told_when_the_focus_moves_to_it_or_away() {
    let server = TestServer::start().await;
    let config = server.client_config();
    let (_p1, one) = project("one", "first\n");
    let (_p2, two) = project("two", "second\n");
    let mut first = attach(&config, &one, "one", Some("default")).await;
    let mut second = attach(&config, &two, "two", Some("default")).await;
    let agent = connect_agent(&config).await;
    let land = async |root: &Path| land_by(&agent, vec![file_uri(root)], Some("default")).await;
    assert_eq!(land(&one).await.focus.as_deref(), Some("one"));
    assert_eq!(
        next_focus_move(&mut first).await,
        (true, Some("one".to_owned()))
    );
    // The same host's roots move to the other folder: the focus follows, and both owners hear.
    assert_eq!(land(&two).await.focus.as_deref(), Some("two"));
    assert_eq!(
        next_focus_move(&mut first).await,
        (false, Some("two".to_owned()))
    );
    assert_eq!(
        next_focus_move(&mut second).await,
        (true, Some("two".to_owned()))
    );
    // Their terminals say so in words.
    let line = monad_client::attach::AttachEvent::FocusMoved {
        focus: false,
        now: Some("two".into()),
        session: None,
    }
    .line()
    .unwrap();
    assert!(
        line.contains("no longer the session's focus: `two` is"),
        "{line}"
    );
}

/// A host that lands where the focus is a folder offline now is told so: every call that
/// names no workspace then fails until the folder is back (the landing said only "whose focus
/// is workspace `one`").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_landing_on_a_focus_that_is_offline_says_so() {
    let server = TestServer::start().await;
    let config = server.client_config();
    let (_p1, one) = project("one", "first\n");
    let first = attach(&config, &one, "one", Some("default")).await;
    let agent = connect_agent(&config).await;
    let land = async || land_by(&agent, vec![file_uri(&one)], Some("default")).await;
    let landed = land().await;
    assert_eq!(
        (landed.focus.as_deref(), landed.focus_offline),
        (Some("one"), false)
    );
    drop(first);
    within(STEP, "a landing on the folder offline", async {
        loop {
            let landed = land().await;
            if landed.focus_offline {
                assert_eq!(landed.focus.as_deref(), Some("one"));
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// Two folders of this device attached into `default`, `one` and `two`; a holder landed on
/// `one` (it holds `default`'s focus), then a host landed on `two`, which got a session of its
/// own (`shared`) that `two` is shared into, as its focus.
struct SharedIn {
    server: TestServer,
    config: ClientConfig,
    _projects: [TempDir; 2],
    two: PathBuf,
    _first: Attachment,
    second: Attachment,
    holder: monad_client::agent::Agent,
    host: monad_client::agent::Agent,
    shared: String,
}

async fn shared_into_a_host_s_session() -> SharedIn {
    let server = TestServer::start().await;
    let config = server.client_config();
    let (p1, one) = project("one", "first\n");
    let (p2, two) = project("two", "second\n");
    let first = attach(&config, &one, "one", Some("default")).await;
    let second = attach(&config, &two, "two", Some("default")).await;
    let holder = connect_agent(&config).await;
    let held = land_by(&holder, vec![file_uri(&one)], None).await;
    assert_eq!(
        (held.session.as_str(), held.focus.as_deref()),
        ("default", Some("one"))
    );
    let host = connect_agent(&config).await;
    let landed = land_by(&host, vec![file_uri(&two)], None).await;
    assert_ne!(landed.session, "default");
    assert_eq!(landed.focus.as_deref(), Some("two"));
    SharedIn {
        server,
        config,
        _projects: [p1, p2],
        two,
        _first: first,
        second,
        holder,
        host,
        shared: landed.session,
    }
}

/// A host whose roots land on a folder whose session's focus another host holds gets a session
/// of its own, which the folder then serves too, as its focus: the folder's owner is told so,
/// naming that session, and told again when the focus leaves it there (its terminal said
/// nothing: it only watched the session the folder attached to).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_s_owner_is_told_of_the_focus_in_another_session_it_serves() {
    let SharedIn {
        server: _server,
        config,
        two: _,
        mut second,
        shared,
        // Bound, not dropped: the folders, the first attach and the landed hosts last the test.
        holder: _holder,
        host: _host,
        _projects,
        _first,
        ..
    } = shared_into_a_host_s_session().await;
    assert_eq!(
        next_focus_move_anywhere(&mut second).await,
        (true, Some("two".to_owned()), Some(shared.clone()))
    );
    // A third folder attached into that session as its focus: the focus there leaves `two`,
    // and its owner hears that as well.
    let (_p3, three) = project("three", "third\n");
    let mut options = attach_options(&three, "three");
    options.allow = vec![ToolClass::Read];
    options.session = Some(shared.clone());
    options.focus = true;
    let _third = Attachment::start(&config, options, None).await;
    assert_eq!(
        next_focus_move_anywhere(&mut second).await,
        (false, Some("three".to_owned()), Some(shared.clone()))
    );
    let line = monad_client::attach::AttachEvent::FocusMoved {
        focus: true,
        now: Some("two".into()),
        session: Some(shared.clone()),
    }
    .line()
    .unwrap();
    assert!(
        line.contains(&format!(
            "now the focus of session {}, which it serves as well",
            shared
        )),
        "{line}"
    );
}

/// Whether session `session` lists workspace `name` online, as `agent` sees it.
async fn online_in(agent: &monad_client::agent::Agent, session: &str, name: &str) -> bool {
    let (_, workspaces) = within(STEP, "the workspaces", agent.workspaces(Some(session)))
        .await
        .expect("listed");
    workspaces.iter().any(|w| w.name == name && w.online)
}

/// Waits (bounded) until session `session` lists workspace `name` offline, or not at all.
async fn gone_from(agent: &monad_client::agent::Agent, session: &str, name: &str) {
    within(STEP, "the folder to go offline", async {
        while online_in(agent, session, name).await {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// A read of `notes.txt` by `agent` in `session`, in `workspace` or naming none: its text, or
/// why it failed.
async fn notes(
    agent: &monad_client::agent::Agent,
    session: &str,
    workspace: Option<&str>,
) -> Result<String, String> {
    let mut args = serde_json::json!({"path": "notes.txt"});
    if let Some(workspace) = workspace {
        args["workspace"] = workspace.into();
    }
    match call_in(agent, Some(session), "read_file", args)
        .await
        .outcome
    {
        monad_protocol::wire::Outcome::Ok { result } => Ok(result.into_value()["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned()),
        monad_protocol::wire::Outcome::Error { error } => Err(error.to_string()),
    }
}

/// A folder shared into a host's session (the host landed on it while the folder's own session
/// had its focus held) comes back there when it attaches again: by a new attach that takes the
/// old connection over, and by one after the old one went. Before, the host's session kept it
/// offline, and every call of the host that named no workspace failed until the host landed
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_attached_again_comes_back_in_the_sessions_it_was_shared_into() {
    // The folders and the first attach last the test, held in the fixture.
    let fx = shared_into_a_host_s_session().await;
    assert_eq!(
        notes(&fx.host, &fx.shared, None).await.as_deref(),
        Ok("second\n")
    );

    // Attached again while the first attach still runs: the new one takes it over.
    let again = attach(&fx.config, &fx.two, "two", Some("default")).await;
    drop(fx.second);
    assert_eq!(
        notes(&fx.host, &fx.shared, None).await.as_deref(),
        Ok("second\n")
    );
    assert!(online_in(&fx.host, &fx.shared, "two").await);

    // Gone, then attached again.
    drop(again);
    gone_from(&fx.holder, "default", "two").await;
    gone_from(&fx.host, &fx.shared, "two").await;
    let third = attach(&fx.config, &fx.two, "two", Some("default")).await;
    assert!(online_in(&fx.host, &fx.shared, "two").await);
    assert_eq!(
        notes(&fx.host, &fx.shared, None).await.as_deref(),
        Ok("second\n")
    );

    // A session whose owner detached the folder by name does not get it back.
    drop(third);
    gone_from(&fx.holder, "default", "two").await;
    gone_from(&fx.host, &fx.shared, "two").await;
    let detached = within(STEP, "a detach", fx.host.detach(Some(&fx.shared), "two")).await;
    assert!(detached.is_ok(), "{detached:?}");
    let _fourth = attach(&fx.config, &fx.two, "two", Some("default")).await;
    let (_, listed) = within(STEP, "the workspaces", fx.host.workspaces(Some(&fx.shared)))
        .await
        .expect("listed");
    assert!(listed.iter().all(|w| w.name != "two"), "{listed:?}");
}

/// A folder shared into a host's session and detached there by name keeps serving its own
/// session, and its owner hears that it is no longer the focus there. Before, the detach
/// stopped the folder's `attach`, and its own session lost it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_detached_by_name_where_it_was_shared_in_serves_its_own_session_on() {
    // The folders and the first attach last the test, held in the fixture.
    let mut fx = shared_into_a_host_s_session().await;
    let told = |now: Option<&str>, focus| (focus, now.map(str::to_owned), Some(fx.shared.clone()));
    assert_eq!(
        next_focus_move_anywhere(&mut fx.second).await,
        told(Some("two"), true)
    );
    let detached = within(STEP, "a detach", fx.host.detach(Some(&fx.shared), "two")).await;
    assert!(detached.is_ok(), "{detached:?}");
    assert_eq!(
        next_focus_move_anywhere(&mut fx.second).await,
        told(None, false)
    );
    assert!(online_in(&fx.holder, "default", "two").await);
    assert_eq!(
        notes(&fx.holder, "default", Some("two")).await.as_deref(),
        Ok("second\n")
    );
}
