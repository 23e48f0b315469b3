//! The command line as people who live in ssh, gh and docker expect it (issue 15): the real
//! `monad-server` and `monad-client` binaries, a terminal where one is needed ([`Pty`]).

use std::path::Path;
use std::process::Output;

use monad_protocol::ErrorCode;
use monad_tests::{Pty, STEP, ServerProcess, command, folder, wait_for_line, within};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `monad-client args` with the config in `config_dir`, to completion (bounded).
async fn client(config_dir: &Path, args: &[&str]) -> Output {
    let output = command("monad-client")
        .args(args)
        .env("MONAD_CONFIG_DIR", config_dir)
        .output();
    within(STEP, &format!("`monad-client {}`", args.join(" ")), output)
        .await
        .expect("monad-client runs")
}

/// Runs `monad-client args` with the config in `config_dir` and `input` on its standard input,
/// to completion (bounded).
async fn client_fed(config_dir: &Path, args: &[&str], input: &[u8]) -> Output {
    use tokio::io::AsyncWriteExt;
    let mut child = command("monad-client")
        .args(args)
        .env("MONAD_CONFIG_DIR", config_dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("monad-client starts");
    let mut stdin = child.stdin.take().expect("piped");
    stdin
        .write_all(input)
        .await
        .expect("standard input written");
    drop(stdin);
    within(
        STEP,
        &format!("`monad-client {}`", args.join(" ")),
        child.wait_with_output(),
    )
    .await
    .expect("monad-client runs")
}

/// Runs `monad-server --data-dir DIR args` to completion (bounded).
async fn server_cmd(data: &Path, args: &[&str]) -> Output {
    let mut all = vec!["--data-dir", data.to_str().unwrap()];
    all.extend_from_slice(args);
    monad_tests::server_command(&all).await
}

/// Regression: any variable of the environment whose name or value is not UTF-8 made every
/// `monad-server` command panic (`std::env::vars`), whatever it was. One Monad does not read is
/// left alone; one it reads is an error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_variable_that_is_not_utf8_is_no_panic() {
    use std::os::unix::ffi::OsStrExt;
    let data = tempfile::tempdir().unwrap();
    let odd = std::ffi::OsStr::from_bytes(b"caf\xe9");
    let run = |var: &'static str| {
        let mut cmd = command("monad-server");
        cmd.arg("--data-dir")
            .arg(data.path())
            .args(["session", "list", "--json"])
            .env(var, odd);
        async move { cmd.output().await.unwrap() }
    };
    let out = run("SOME_TOOL_SETTING").await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "[]");
    let out = run("MONAD_STORE_URL").await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("the environment variable MONAD_STORE_URL is not UTF-8 text"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        !text(&out.stderr).contains("panicked"),
        "{}",
        text(&out.stderr)
    );
}

/// Regression: `--data-dir " "` made a data directory named by a space (and `""` was refused
/// without saying why); a blank one is a usage error that says so, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_data_dir_is_a_usage_error() {
    let here = tempfile::tempdir().unwrap();
    for args in [
        &["--data-dir", "", "token", "create", "--user", "ana"][..],
        &["session", "list", "--data-dir", " "],
    ] {
        let out = command("monad-server")
            .current_dir(here.path())
            .args(args)
            .output()
            .await
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains("the data directory is empty"),
            "{}",
            text(&out.stderr)
        );
        assert_eq!(
            std::fs::read_dir(here.path()).unwrap().count(),
            0,
            "{args:?}"
        );
    }
}

/// A `monad-client attach` running without a terminal, its standard error read line by line.
struct Attaching {
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>,
    seen: Vec<String>,
}

impl Attaching {
    async fn start(config: &Path, args: &[&str]) -> Attaching {
        Attaching::start_in(config, &std::env::current_dir().unwrap(), args).await
    }

    /// Like [`Attaching::start`], run from the directory `cwd` (where a relative folder is).
    async fn start_in(config: &Path, cwd: &Path, args: &[&str]) -> Attaching {
        let mut child = command("monad-client")
            .arg("attach")
            .args(args)
            .current_dir(cwd)
            .env("MONAD_CONFIG_DIR", config)
            .spawn()
            .expect("attach starts");
        let lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let mut attaching = Attaching {
            child,
            lines,
            seen: Vec::new(),
        };
        attaching.wait_for("attached ").await;
        attaching
    }

    async fn wait_for(&mut self, what: &str) -> String {
        let line = wait_for_line(&mut self.lines, STEP, what, |l| l.contains(what)).await;
        self.seen.push(line.clone());
        line
    }

    /// Waits (bounded) for it to exit; returns its status and the rest of what it said.
    async fn exit(mut self) -> (std::process::ExitStatus, String) {
        let status = within(STEP, "attach to exit", self.child.wait())
            .await
            .expect("reaped");
        while let Ok(Some(line)) = self.lines.next_line().await {
            self.seen.push(line);
        }
        (status, self.seen.join("\n"))
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id().expect("running") as i32);
        nix::sys::signal::kill(pid, signal).expect("signalled");
    }
}

/// `monad-client status --json`.
async fn status(config: &Path) -> Value {
    let out = client(config, &["status", "--json"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

fn workspace_names(status: &Value) -> Vec<(String, bool)> {
    workspace_uris(status)
        .into_iter()
        .map(|(name, _, online)| (name, online))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attaching_a_folder_again_takes_it_over_and_the_first_attach_says_so_and_exits() {
    let (_server, _data, config) = ServerProcess::logged_in().await;
    let laptop = folder(&[("a.txt", "from the laptop\n")]);
    let dir = laptop.path().to_str().unwrap();
    let first = Attaching::start(config.path(), &[dir, "--allow", "read"]).await;
    let second = Attaching::start(config.path(), &[dir, "--allow", "read"]).await;
    let (status_first, said) = first.exit().await;
    assert!(status_first.success(), "{status_first}: {said}");
    assert!(
        said.contains("detached: this folder was attached again") && said.contains("took it over"),
        "{said}"
    );
    // One workspace, online, served by the second attach.
    let now = workspace_names(&status(config.path()).await);
    assert_eq!(now.len(), 2, "one folder: {now:?}");
    assert!(now[1].1, "online: {now:?}");
    let out = client(
        config.path(),
        &["call", "read_file", "--args", r#"{"path": "a.txt"}"#],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("from the laptop"));
    drop(second);
}

/// `(name, uri, online)` of the current session's workspaces.
fn workspace_uris(status: &Value) -> Vec<(String, String, bool)> {
    status["session"]["workspaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["name"].as_str().unwrap().to_owned(),
                w["uri"].as_str().unwrap().to_owned(),
                w["online"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// Regression: the folder was sent as typed (`.`, `proj`), and the server takes that as the
/// folder's identity: `attach .` in a second project took the first one's workspace over and
/// served the second folder under the first one's name, and one folder typed two ways became
/// two workspaces. The folder is now sent as its canonical path (`~/...` under the home
/// directory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_dot_in_two_projects_keeps_both_and_a_folder_typed_two_ways_is_one() {
    let (_server, _data, config) = ServerProcess::logged_in().await;
    let top = folder(&[
        ("p1/one.txt", "1\n"),
        ("p2/two.txt", "2\n"),
        ("d1/proj/in-d1.txt", "d1\n"),
        ("d2/proj/in-d2.txt", "d2\n"),
        ("ws3/three.txt", "3\n"),
    ]);
    let top_path = top.path().canonicalize().unwrap();
    let uri_ends =
        |uri: &str, dir: &str| uri.ends_with(&format!(":{}", top_path.join(dir).display()));
    let p1 = Attaching::start_in(
        config.path(),
        &top_path.join("p1"),
        &[".", "--allow", "read"],
    )
    .await;
    let p2 = Attaching::start_in(
        config.path(),
        &top_path.join("p2"),
        &[".", "--allow", "read"],
    )
    .await;
    let d1 = Attaching::start_in(
        config.path(),
        &top_path.join("d1"),
        &["proj", "--allow", "read"],
    )
    .await;
    let d2 = Attaching::start_in(
        config.path(),
        &top_path.join("d2"),
        &["proj", "--allow", "read"],
    )
    .await;
    let now = workspace_uris(&status(config.path()).await);
    let names: Vec<&str> = now.iter().map(|w| w.0.as_str()).collect();
    assert_eq!(names, ["primary", "p1", "p2", "proj", "proj-2"], "{now:?}");
    assert!(now.iter().all(|w| w.2), "all online: {now:?}");
    for ((_, uri, _), dir) in now[1..].iter().zip(["p1", "p2", "d1/proj", "d2/proj"]) {
        assert!(uri_ends(uri, dir), "{uri} names {dir} by its absolute path");
    }
    for (workspace, mine, theirs) in [
        ("p1", "one.txt", "two.txt"),
        ("p2", "two.txt", "one.txt"),
        ("proj", "in-d1.txt", "in-d2.txt"),
        ("proj-2", "in-d2.txt", "in-d1.txt"),
    ] {
        let out = client(
            config.path(),
            &["call", "list_dir", "--workspace", workspace, "--args", "{}"],
        )
        .await;
        assert!(out.status.success(), "{}", text(&out.stderr));
        let listed = text(&out.stdout);
        assert!(
            listed.contains(mine) && !listed.contains(theirs),
            "{workspace}: {listed}"
        );
    }

    // One folder typed two ways is one folder: the second attach takes the first one over.
    let relative = Attaching::start_in(config.path(), &top_path, &["ws3", "--allow", "read"]).await;
    let absolute = top_path.join("ws3");
    let absolute = Attaching::start(
        config.path(),
        &[absolute.to_str().unwrap(), "--allow", "read"],
    )
    .await;
    let (status_relative, said) = relative.exit().await;
    assert!(status_relative.success(), "{said}");
    assert!(said.contains("took it over"), "{said}");
    let now = workspace_uris(&status(config.path()).await);
    let ws3: Vec<_> = now.iter().filter(|w| w.0.starts_with("ws3")).collect();
    assert_eq!(ws3.len(), 1, "one workspace: {now:?}");
    assert!(ws3[0].2 && uri_ends(&ws3[0].1, "ws3"), "{now:?}");
    drop((p1, p2, d1, d2, absolute));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_that_cannot_be_used_is_an_error_not_a_silent_rename() {
    let (server, _data, config) = ServerProcess::logged_in().await;
    let one = folder(&[]);
    let two = folder(&[]);
    let (one, two) = (one.path().to_str().unwrap(), two.path().to_str().unwrap());
    let out = client(config.path(), &["attach", one, "--name", "primary"]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("`primary` is reserved"),
        "{}",
        text(&out.stderr)
    );
    let out = client(config.path(), &["attach", one, "--name", "a/b"]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("cannot be a short name"),
        "{}",
        text(&out.stderr)
    );

    let _kept = Attaching::start(config.path(), &[one, "--name", "work"]).await;
    let out = client(config.path(), &["attach", two, "--name", "work"]).await;
    assert!(!out.status.success(), "a second `work`");
    let said = text(&out.stderr);
    assert!(said.contains("the name `work` is taken"), "{said}");
    assert!(said.contains("monad-client detach work"), "{said}");
    let names: Vec<String> = workspace_names(&status(config.path()).await)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["primary", "work"], "no `work-2`");
    // Nothing was kept for the folders refused: only the one attached has a workspace record.
    let token = server.first_token.clone().unwrap();
    let agent = monad_tests::connect_agent(&server.client_config(&token)).await;
    let records = within(STEP, "records", agent.records()).await.unwrap();
    let paths: Vec<&str> = records.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths, [one], "{records:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_go_before_or_after_the_folder() {
    let (_server, _data, config) = ServerProcess::logged_in().await;
    let laptop = folder(&[]);
    let dir = laptop.path().to_str().unwrap();
    for args in [
        &["--allow", "read", dir][..],
        &["--allow", "read", "write", dir],
        &[dir, "--allow", "read"],
        &["--name", "x", dir, "--allow", "exec"],
        &["--allow", "write", dir, "--allow", "read"],
    ] {
        let attach = Attaching::start(config.path(), args).await;
        attach.signal(nix::sys::signal::Signal::SIGINT);
        let (status, said) = attach.exit().await;
        assert!(status.success(), "{args:?}: {said}");
    }
    // Two values that are no class: one is not the folder.
    for args in [
        &["attach", "--allow", "bogus", dir][..],
        &["attach", "--allow", "read", "x", "--allow", "write", dir],
        &["attach", "--allow", "bogus", "--allow", "read", dir],
    ] {
        let out = client(config.path(), args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: a usage error");
        assert!(
            text(&out.stderr).contains("read, write or exec"),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    let out = client(config.path(), &["attach", "--allow", "bogus", dir]).await;
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(
        text(&out.stderr).contains("read, write or exec")
            && text(&out.stderr).contains("Usage: monad-client attach"),
        "{}",
        text(&out.stderr)
    );
    // A prompt time-out the clock cannot hold (it overflowed at the first prompt, a panic), or
    // one shorter than the guard against keys typed early: refused before anything starts.
    for seconds in ["18446744073709551615", "604801", "0", "1"] {
        for command in [&["attach", dir][..], &["chat"]] {
            let mut args = command.to_vec();
            args.extend(["--prompt-timeout", seconds]);
            let out = client(config.path(), &args).await;
            assert_eq!(out.status.code(), Some(2), "{args:?}: a usage error");
            assert!(
                text(&out.stderr).contains("is not in 2..=604800"),
                "{args:?}: {}",
                text(&out.stderr)
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_detaches_like_ctrl_c_and_a_call_waiting_on_the_folder_fails_at_once() {
    let (server, _data, config) = ServerProcess::logged_in().await;
    let laptop = folder(&[]);
    let token = server.first_token.clone().unwrap();
    // SIGTERM, and its terminal closing (SIGHUP), alike.
    use nix::sys::signal::Signal;
    for signal in [Signal::SIGTERM, Signal::SIGHUP] {
        let (mut pty, at) = attached_on_a_terminal(config.path(), laptop.path()).await;
        let agent = monad_tests::connect_agent(&server.client_config(&token)).await;
        let path = format!("new-{signal}.txt");
        let args = json!({"path": path, "content": "x", "workspace": "lap"});
        let waiting =
            tokio::spawn(async move { monad_tests::call(&agent, "write_file", args).await });
        let at = pty.wait_for(&path, at).await;
        let pid = nix::unistd::Pid::from_raw(pty.child.id().unwrap() as i32);
        nix::sys::signal::kill(pid, signal).unwrap();
        // Said as it is: the folder leaves the session's online workspaces, not the session.
        pty.wait_for("disconnected: the folder stays in the session, offline", at)
            .await;
        let status = within(STEP, "attach to exit", pty.child.wait())
            .await
            .unwrap();
        assert!(status.success(), "{signal} detaches cleanly: {status}");
        // The waiting call ends now (its folder told the server it left), not after the
        // prompt's ten minutes or the connection's time-out.
        let reply = within(STEP, "the waiting call", waiting).await.unwrap();
        let error = monad_tests::err(reply);
        assert!(
            matches!(
                error.code,
                ErrorCode::WorkspaceDisconnected | ErrorCode::Cancelled
            ),
            "{signal}: {error:?}"
        );
        assert!(!laptop.path().join(&path).exists());
        let now = status_of(config.path()).await;
        assert!(
            now.contains(&("lap".to_owned(), false)),
            "{signal}: {now:?}"
        );
    }
}

/// `monad-client attach DIR &` in a shell with job control: the kernel stops a background job
/// that sets its terminal's mode, so the first prompt used to stop the whole attach (its
/// pre-approved calls, its connection's upkeep) until the shell resumed it. Now it serves on,
/// says the request waits for it to come to the foreground, and asks once it is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attach_in_the_background_serves_on_and_asks_once_in_the_foreground() {
    let (server, _data, config) = ServerProcess::logged_in().await;
    let laptop = folder(&[("notes.txt", "hello\n")]);
    // An interactive shell on its own terminal, with job control, as a person has.
    let base = command("monad-client");
    let mut shell = tokio::process::Command::new("setsid");
    shell
        .args(["--ctty", "bash", "--norc", "--noprofile", "-i"])
        .kill_on_drop(true);
    for (key, value) in base.as_std().get_envs() {
        if let Some(value) = value {
            shell.env(key, value);
        }
    }
    shell
        .env("MONAD_CONFIG_DIR", config.path())
        .env("PS1", "$ ");
    let mut pty = Pty::spawn(shell);
    let client = monad_tests::binary("monad-client");
    pty.send(
        format!(
            "{} attach {} --name lap --allow read --prompt-timeout 600 &\n",
            client.display(),
            laptop.path().display()
        )
        .as_bytes(),
    );
    let at = pty.wait_for("attached ", 0).await;
    // The job's process is no child of this test's: it is killed however the test ends, since
    // the shell's end does not end a job in the background.
    let screen = pty.text();
    let pid: i32 = screen
        .split("[1] ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("the job's process id: {screen}"));
    struct Killed(i32);
    impl Drop for Killed {
        fn drop(&mut self) {
            let pid = nix::unistd::Pid::from_raw(self.0);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
    let _attach = Killed(pid);
    let token = server.first_token.clone().unwrap();
    let asking = monad_tests::connect_agent(&server.client_config(&token)).await;
    let waiting = tokio::spawn(async move {
        asking
            .call(
                None,
                "write_file",
                json!({"path": "new.txt", "content": "x", "workspace": "lap"}),
                |_| {},
            )
            .await
    });
    let at = pty.wait_for("bring it to the foreground", at).await;
    // Still serving: a pre-approved read runs at once.
    let agent = monad_tests::connect_agent(&server.client_config(&token)).await;
    let reads = || async {
        let args = json!({"path": "notes.txt", "workspace": "lap"});
        let read = monad_tests::call(&agent, "read_file", args).await;
        assert_eq!(monad_tests::ok(read).0["content"], "hello\n");
    };
    reads().await;
    // In the foreground, the request is asked.
    pty.send(b"fg\n");
    let at = pty.wait_for("approval needed", at).await;
    // Stopped (Ctrl-Z) and sent to the background again while it asks: it serves on, the
    // prompt waiting for the foreground.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    pty.send(b"\x1a");
    let at = pty.wait_for("Stopped", at).await;
    pty.send(b"bg\n");
    pty.wait_for("&", at).await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    reads().await;
    // Keys typed for the shell meanwhile are the shell's.
    pty.send(b"true\n");
    reads().await;
    assert!(!waiting.is_finished());
    // Back in the foreground: the request is drawn again, and one key answers it.
    pty.send(b"fg\n");
    let at = pty.wait_for("approval needed", at).await;
    pty.wait_for("answer within", at).await;
    pty.send(b"n");
    let denied = within(STEP, "the denied call", waiting)
        .await
        .unwrap()
        .unwrap();
    let error = monad_tests::err(denied);
    assert_eq!(error.code, ErrorCode::Denied, "{error:?}");
    assert!(!laptop.path().join("new.txt").exists());
}

/// The attack: an agent's `monad-client call` is interrupted (Ctrl-C) while the folder's owner
/// is asked about it, and the owner approves a moment later. The call's process used to die
/// without a word to the server, which noticed only when the connection timed out (about 8 s),
/// so the prompt stayed up and an approval still ran the write for a caller that was gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_call_closes_its_connection_and_its_prompt_is_withdrawn_at_once() {
    let data = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(data.path(), &[("RUST_LOG", "monad_server=info")]).await;
    let config = tempfile::tempdir().unwrap();
    let token = server.first_token.clone().unwrap();
    server.client_config(&token).save(config.path()).unwrap();
    let laptop = folder(&[]);
    let (mut pty, mut at) = attached_on_a_terminal(config.path(), laptop.path()).await;
    // Ctrl-C, and the caller's terminal closing (SIGHUP), alike.
    use nix::sys::signal::Signal;
    for (i, signal) in [Signal::SIGINT, Signal::SIGHUP].into_iter().enumerate() {
        let path = format!("new-{signal}.txt");
        let caller = command("monad-client")
            .args(["call", "write_file", "--workspace", "lap", "--args"])
            .arg(json!({"path": path, "content": "x"}).to_string())
            .env("MONAD_CONFIG_DIR", config.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        at = pty.wait_for(&path, at).await;
        let pid = nix::unistd::Pid::from_raw(caller.id().unwrap() as i32);
        nix::sys::signal::kill(pid, signal).unwrap();
        let out = within(
            STEP,
            "the interrupted call to exit",
            caller.wait_with_output(),
        )
        .await
        .unwrap();
        // Ended by the signal itself, after closing: a shell's loop stops on Ctrl-C as for any
        // program (a child that only exits with 130 lets it carry on).
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            out.status.signal(),
            Some(signal as i32),
            "{}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains("interrupted: the call is cancelled"),
            "{signal}: {}",
            text(&out.stderr)
        );
        // Withdrawn because the caller closed its connection, well before the connection's
        // time-out could have told the server.
        at = within(
            monad_protocol::pin::IDLE_TIMEOUT / 2,
            "the prompt to be withdrawn",
            pty.wait_for("withdrawn", at),
        )
        .await;
        // The server logs why: the caller closed the connection, not a time-out.
        within(
            STEP,
            "the server's line for the caller's connection",
            async {
                while server
                    .stderr()
                    .lines()
                    .filter(|l| {
                        l.contains("disconnected: closed by the peer")
                            && l.contains("the caller interrupted the call")
                    })
                    .count()
                    <= i
                {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            },
        )
        .await;
        // A key pressed now answers nothing: the write never runs.
        pty.send(b"y");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(!laptop.path().join(&path).exists(), "{signal}");
    }
}

/// Two folders whose paths differ only in bytes that are not UTF-8 read alike as text, which is
/// how a folder is known (its URI): the second attach took the first one's place, and calls
/// went to the wrong folder. Such a path is refused, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_whose_path_is_not_utf8_is_refused_not_confused_with_another() {
    use std::os::unix::ffi::OsStrExt;
    let (_server, _data, config) = ServerProcess::logged_in().await;
    let parent = folder(&[]);
    let odd = parent
        .path()
        .join(std::ffi::OsStr::from_bytes(b"bad\xffdir"));
    std::fs::create_dir(&odd).unwrap();
    let out = within(
        STEP,
        "attach",
        command("monad-client")
            .arg("attach")
            .arg(&odd)
            .arg("--non-interactive")
            .env("MONAD_CONFIG_DIR", config.path())
            .output(),
    )
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("its path is not valid UTF-8"),
        "{}",
        text(&out.stderr)
    );
    let now = status_of(config.path()).await;
    assert_eq!(now.len(), 1, "only the primary: {now:?}");
}

/// Regression: with standard input on a terminal and standard error elsewhere (`2>attach.log`),
/// the approval prompt was drawn where its owner could not see it, and keys typed on the
/// terminal answered a question nobody read. A prompt needs both on a terminal: otherwise what
/// is not pre-approved is denied at once, as without a terminal, and the attach says why as it
/// starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_prompt_is_asked_where_its_question_cannot_be_seen() {
    let (_server, _data, config) = ServerProcess::logged_in().await;
    let laptop = folder(&[("notes.txt", "hi\n")]);
    let pty = nix::pty::openpty(None, None).unwrap();
    let mut attach = command("monad-client")
        .arg("attach")
        .arg(laptop.path())
        .args(["--name", "lap", "--prompt-timeout", "600"])
        .env("MONAD_CONFIG_DIR", config.path())
        .stdin(std::process::Stdio::from(pty.slave.try_clone().unwrap()))
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(attach.stderr.take().unwrap()).lines();
    let said = wait_for_line(&mut lines, STEP, "the attach's warning", |l| {
        l.contains("not a terminal")
    })
    .await;
    assert!(said.contains("will be denied"), "{said}");
    wait_for_line(&mut lines, STEP, "the attach", |l| l.contains("attached ")).await;
    let out = client(
        config.path(),
        &[
            "call",
            "read_file",
            "--workspace",
            "lap",
            "--args",
            r#"{"path": "notes.txt"}"#,
        ],
    )
    .await;
    assert!(!out.status.success(), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(err.contains("denied"), "denied at once, not asked: {err}");
    drop(pty);
}

/// `monad-client attach` of `laptop` as `lap`, on a terminal so that a call that needs
/// approval waits for its prompt (for 10 minutes, unanswered); once attached, with where its
/// screen is.
async fn attached_on_a_terminal(config: &Path, laptop: &Path) -> (Pty, usize) {
    let mut cmd = command("monad-client");
    cmd.arg("attach")
        .arg(laptop)
        .args(["--name", "lap", "--prompt-timeout", "600"])
        .env("MONAD_CONFIG_DIR", config);
    let mut pty = Pty::spawn(cmd);
    let at = pty.wait_for("attached ", 0).await;
    (pty, at)
}

/// `monad-server --data-dir DATA ARGS` on a terminal, once it asks `[y/N]`, with where its
/// screen is.
async fn asking(data: &Path, args: &[&str]) -> (Pty, usize) {
    let mut cmd = command("monad-server");
    cmd.arg("--data-dir").arg(data).args(args);
    let mut pty = Pty::spawn(cmd);
    let at = pty.wait_for("[y/N]", 0).await;
    (pty, at)
}

async fn status_of(config: &Path) -> Vec<(String, bool)> {
    workspace_names(&status(config).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detach_by_name_from_another_terminal_stops_the_attach_and_forgets_offline_folders() {
    let (_server, _data, config) = ServerProcess::logged_in().await;
    let laptop = folder(&[]);
    let dir = laptop.path().to_str().unwrap();
    let attach = Attaching::start(config.path(), &[dir, "--name", "lap"]).await;
    let out = client(config.path(), &["detach", "lap"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (status, said) = attach.exit().await;
    assert!(status.success(), "{said}");
    assert!(said.contains("detached by `monad-client detach`"), "{said}");
    assert_eq!(status_of(config.path()).await, [("primary".into(), true)]);

    // An offline folder (its attach killed) stays listed until it is forgotten.
    let mut attach = Attaching::start(config.path(), &[dir, "--name", "lap"]).await;
    attach.child.start_kill().unwrap();
    let _ = attach.exit().await;
    let offline = within(STEP, "the folder to go offline", async {
        loop {
            let now = status_of(config.path()).await;
            if now.contains(&("lap".to_owned(), false)) {
                return now;
            }
        }
    })
    .await;
    assert_eq!(offline.len(), 2, "{offline:?}");
    let out = client(config.path(), &["detach", "lap"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(status_of(config.path()).await, [("primary".into(), true)]);
    let out = client(config.path(), &["detach", "lap"]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no folder `lap`"),
        "{}",
        text(&out.stderr)
    );
    let out = client(config.path(), &["detach", "primary"]).await;
    assert!(!out.status.success());

    // A detach in another session, refused there, leaves this device where it was.
    let out = client(config.path(), &["sessions", "--new", "--name", "other"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let other = text(&out.stdout).trim().to_owned();
    let out = client(config.path(), &["sessions", "use", "default"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let never_used = "7e57ab1e-0000-4000-8000-000000000001";
    for session in [other.as_str(), &other[..8], never_used] {
        let out = client(config.path(), &["detach", "lap", "--session", session]).await;
        assert!(!out.status.success(), "{session}");
        assert_eq!(
            self::status(config.path()).await["session"]["id"],
            "default"
        );
    }
    // Nor does it make a session.
    let listed = client(config.path(), &["sessions"]).await;
    assert!(
        !text(&listed.stdout).contains(never_used),
        "{}",
        text(&listed.stdout)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_says_who_where_and_which_session_and_logout_forgets_the_token() {
    let (server, _data, config) = ServerProcess::logged_in().await;
    let out = client(config.path(), &["status"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    for wanted in [
        server.addr.to_string().as_str(),
        server.fingerprint.as_str(),
        "user         admin",
        "session      default",
        "primary",
        "online",
    ] {
        assert!(said.contains(wanted), "{wanted}: {said}");
    }
    let device = status(config.path()).await["device_id"].clone();
    let out = client(config.path(), &["logout"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = client(config.path(), &["status"]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not logged in"),
        "{}",
        text(&out.stderr)
    );
    // What is known is still shown: the server and fingerprint stay after a logout.
    assert!(
        text(&out.stdout).contains(&server.fingerprint)
            && text(&out.stdout).contains("logged in    no"),
        "{}",
        text(&out.stdout)
    );
    let out = client(config.path(), &["status", "--json"]).await;
    assert!(!out.status.success());
    let logged_out: Value = serde_json::from_slice(&out.stdout).expect("an object");
    assert_eq!(logged_out["logged_in"], false, "{logged_out}");
    assert_eq!(logged_out["fingerprint"], server.fingerprint.as_str());
    let saved = std::fs::read_to_string(config.path().join("config.toml")).unwrap();
    let token = server.first_token.clone().unwrap();
    assert!(!saved.contains(&token), "the token is gone: {saved}");
    // Logging in again keeps the device id (and so its bindings).
    let out = command("monad-client")
        .args(["login", "--server", &server.addr.to_string()])
        .args(["--fingerprint", &server.fingerprint])
        .env("MONAD_CONFIG_DIR", config.path())
        .env("MONAD_TOKEN", &token)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(status(config.path()).await["device_id"], device);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_mark_the_current_one_carry_names_take_prefixes_and_use_switches() {
    let (_server, _data, config) = ServerProcess::logged_in().await;
    // A name with a tab would split the listings' columns; a file is not a folder.
    let out = client(config.path(), &["sessions", "--new", "--name", "a\tb"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("no tab"),
        "{}",
        text(&out.stderr)
    );
    let file = config.path().join("config.toml");
    let out = client(
        config.path(),
        &["sessions", "--new", "--folder", file.to_str().unwrap()],
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("is not a directory"),
        "{}",
        text(&out.stderr)
    );
    let out = client(config.path(), &["sessions", "--new", "--name", "refactor"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_owned();
    let listed = client(config.path(), &["sessions"]).await;
    let rows: Vec<Vec<String>> = text(&listed.stdout)
        .lines()
        .map(|l| l.split('\t').map(str::to_owned).collect())
        .collect();
    assert!(
        !rows.iter().any(|r| r.contains(&"ID".to_owned())),
        "piped: no header: {rows:?}"
    );
    let row = rows.iter().find(|r| r[1] == id).expect("the new session");
    assert_eq!(
        (row[0].as_str(), row[2].as_str()),
        ("*", "refactor"),
        "{rows:?}"
    );
    assert!(!row[3].is_empty(), "last use");

    // Switch, back and forth, by a unique prefix once `default` exists.
    let out = client(config.path(), &["sessions", "use", "default"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = client(config.path(), &["sessions", "use", &id[..8]]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = client(config.path(), &["sessions", "use", "def"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json = client(config.path(), &["sessions", "--json"]).await;
    let json: Value = serde_json::from_slice(&json.stdout).unwrap();
    let current: Vec<&str> = json
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["current"] == true)
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(current, ["default"]);
    let out = client(config.path(), &["sessions", "use", &id[..8]]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("refactor"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(status(config.path()).await["session"]["id"], id.as_str());
    // A prefix works wherever a session is named.
    let out = client(
        config.path(),
        &[
            "history",
            "append",
            "--role",
            "user",
            "--text",
            "hi",
            "--session",
            &id[..6],
        ],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains(&id), "{}", text(&out.stderr));
    // Unknown: refused, nothing created.
    let out = client(config.path(), &["sessions", "use", "zzz"]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("does not exist"),
        "{}",
        text(&out.stderr)
    );
    // `--help` says what the default session is, the same way everywhere.
    for cmd in ["call", "chat", "detach"] {
        let out = client(config.path(), &[cmd, "--help"]).await;
        let help = text(&out.stdout)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            help.contains("default: this device's current session")
                && help.contains("else your default session"),
            "{cmd}: {help}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_create_prints_a_login_line_that_works_and_fingerprint_prints_the_certificates() {
    let (server, data, _config) = ServerProcess::logged_in().await;
    let out = server_cmd(data.path(), &["fingerprint"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), server.fingerprint);

    let out = server_cmd(data.path(), &["token", "create", "--user", "bob"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let line = text(&out.stdout);
    assert!(line.starts_with("MONAD_TOKEN=mnd_"), "{line}");
    assert!(
        line.contains(&format!("--server {}", server.addr)),
        "{line}"
    );
    assert!(
        line.contains(&format!("--fingerprint {}", server.fingerprint)),
        "{line}"
    );
    // Pasted as it is, it logs bob in.
    let config = tempfile::tempdir().unwrap();
    let bin = monad_tests::binary("monad-client");
    let pasted = line.replacen("monad-client", bin.to_str().unwrap(), 1);
    let mut sh = tokio::process::Command::new("sh");
    sh.arg("-c")
        .arg(pasted.trim())
        .env("MONAD_CONFIG_DIR", config.path())
        .kill_on_drop(true);
    let out = within(STEP, "the pasted login", sh.output()).await.unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("as bob"),
        "{}",
        text(&out.stderr)
    );

    // Before any start, a data dir has no certificate: said in one line.
    let fresh = tempfile::tempdir().unwrap();
    let out = server_cmd(fresh.path(), &["fingerprint"]).await;
    assert!(!out.status.success());
    assert_eq!(
        text(&out.stderr).trim().lines().count(),
        1,
        "{}",
        text(&out.stderr)
    );
    // A mistyped data dir is said to be missing, not made and shown empty; a file is not one.
    let typo = fresh.path().join("dtaa");
    for args in [
        &["token", "list"][..],
        &["session", "list"],
        &["fingerprint"],
    ] {
        let out = server_cmd(&typo, args).await;
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(
            text(&out.stderr).contains("no data directory at"),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(!typo.exists(), "{args:?} made it");
    }
    let file = fresh.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let out = server_cmd(&file, &["token", "list"]).await;
    assert!(
        text(&out.stderr).contains("is not a directory"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_start_that_cannot_listen_keeps_the_next_start_first_and_says_the_error_once() {
    let data = tempfile::tempdir().unwrap();
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = server_cmd(data.path(), &["--listen", &addr, "--no-http"]).await;
    assert!(!out.status.success());
    let said = text(&out.stderr);
    assert_eq!(
        said.matches("already in use").count(),
        1,
        "said once: {said}"
    );
    assert_eq!(said.trim().lines().count(), 1, "{said}");
    assert!(
        out.stdout.is_empty(),
        "no login line for a server that does not run"
    );
    drop(taken);
    let server = ServerProcess::start(data.path(), &[]).await;
    assert!(
        server.first_token.is_some(),
        "the next start is the first and prints the login line:\n{}",
        server.stderr()
    );
}

/// The first token is made once per data dir: a restart after every token was revoked made a
/// new `admin` token and printed it (a token no one asked for, in a log others may read, just
/// after the operator locked everyone out). Now it says that no token is valid, and `token
/// create` makes one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_every_token_was_revoked_makes_no_new_one() {
    let data = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(data.path(), &[]).await;
    assert!(server.first_token.is_some(), "{}", server.stderr());
    server.kill().await;
    let out = server_cmd(data.path(), &["token", "list", "--json"]).await;
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = listed[0]["id"].as_str().unwrap().to_owned();
    let out = server_cmd(data.path(), &["token", "revoke", &id]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));

    let server = ServerProcess::start(data.path(), &[]).await;
    assert!(
        server.first_token.is_none(),
        "no new token:\n{}",
        server.stderr()
    );
    assert!(
        server.stderr().contains("no token is valid"),
        "{}",
        server.stderr()
    );
    server.kill().await;
    let out = server_cmd(data.path(), &["token", "list", "--json"]).await;
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed, serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_are_tables_on_a_terminal_tsv_when_piped_and_json_everywhere() {
    let (server, data, config) = ServerProcess::logged_in().await;
    let d = data.path();
    // Some content: a named session with a message and an artifact.
    let out = client(config.path(), &["sessions", "--new", "--name", "notes"]).await;
    let id = text(&out.stdout).trim().to_owned();
    let out = client(
        config.path(),
        &["history", "append", "--role", "user", "--text", "hi"],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = client(
        config.path(),
        &[
            "call",
            "write_file",
            "--args",
            r#"{"path": "a.txt", "content": "x\n"}"#,
        ],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Stopped gracefully: what it recorded is on disk.
    server.stop().await;

    for args in [
        &["token", "list"][..],
        &["session", "list"],
        &["workspace", "list"],
        &["session", "artifacts", &id[..8]],
    ] {
        let out = server_cmd(d, args).await;
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        let piped = text(&out.stdout);
        assert!(
            !piped.contains("ID"),
            "{args:?}: no header when piped: {piped}"
        );
        let mut json = args.to_vec();
        json.push("--json");
        let out = server_cmd(d, &json).await;
        assert!(out.status.success(), "{json:?}: {}", text(&out.stderr));
        let value: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert!(value.is_array(), "{json:?}: {value}");
    }
    let out = server_cmd(d, &["token", "list"]).await;
    let fields: Vec<&str> = text(&out.stdout)
        .lines()
        .next()
        .unwrap()
        .split('\t')
        .map(|_| "")
        .collect();
    assert_eq!(fields.len(), 3, "id, user, created");
    // The columns in the client's order: id, name, (owner,) last active, created.
    let out = server_cmd(d, &["session", "list"]).await;
    let json = server_cmd(d, &["session", "list", "--json"]).await;
    let json: Value = serde_json::from_slice(&json.stdout).expect("JSON");
    let first: Vec<String> = text(&out.stdout)
        .lines()
        .next()
        .unwrap()
        .split('\t')
        .map(str::to_owned)
        .collect();
    assert_eq!(first[0], json[0]["id"].as_str().unwrap());
    assert_eq!(first[3], json[0]["last_active"].as_str().unwrap());
    assert_eq!(first[4], json[0]["created_at"].as_str().unwrap());
    let out = server_cmd(d, &["session", "history", &id[..8], "--json"]).await;
    let history: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(history["history"]["messages"][0]["text"], "hi");
    let out = server_cmd(d, &["session", "artifacts", &id[..8]]).await;
    assert!(
        text(&out.stdout).contains(" bytes"),
        "{}",
        text(&out.stdout)
    );
    // An artifact, like a session, by a unique start of its id.
    let out = server_cmd(d, &["session", "artifacts", &id[..8], "--json"]).await;
    let artifacts: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let output = artifacts
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["kind"] == "tool_output")
        .expect("the write's output");
    let artifact = output["id"].as_str().unwrap();
    let out = server_cmd(d, &["session", "artifact", &id[..8], &artifact[..8]]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("a.txt"), "{}", text(&out.stdout));
    let out = server_cmd(d, &["session", "artifact", &id[..8], "zz"]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("artifact `zz` does not exist"),
        "{}",
        text(&out.stderr)
    );

    // On a terminal: aligned under a header.
    let mut cmd = command("monad-server");
    cmd.arg("--data-dir").arg(d).args(["session", "list"]);
    let mut pty = Pty::spawn(cmd);
    let at = pty.wait_for("ID", 0).await;
    let after = pty.wait_for("LAST ACTIVE", at).await;
    pty.wait_for("CREATED", after).await;
    pty.wait_for("notes", at).await;
}

/// `session audit` of a log of several pages: read and printed a page at a time (it read the
/// whole log into memory first), every record once and in order, as one JSON array with
/// `--json` and one row each in the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_audit_prints_a_long_log_whole_a_page_at_a_time() {
    session_audit_of_a_long_log(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_audit_prints_a_long_log_whole_a_page_at_a_time_on_postgresql() {
    let Some(url) = super::pg_store::pg_url("session_audit_prints_a_long_log_on_postgresql") else {
        return;
    };
    session_audit_of_a_long_log(Some(&url)).await;
}

/// [`session_audit_prints_a_long_log_whole_a_page_at_a_time`] on a backend: past a page of the
/// file (4 MiB), or of the database (10,000 rows).
async fn session_audit_of_a_long_log(url: Option<&str>) {
    let (_server, data, config) = logged_in_on(url).await;
    let out = client(config.path(), &["call", "list_dir"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let first = within(STEP, "the call in the audit log", async {
        loop {
            let out = server_cmd(data.path(), &["session", "audit", "default", "--json"]).await;
            assert!(out.status.success(), "{}", text(&out.stderr));
            let all: Value = serde_json::from_slice(&out.stdout).expect("JSON");
            if let Some(first) = all.get(0) {
                return first.clone();
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    // Records numbered by their call id.
    let numbered = |i: usize| {
        let mut r = first.clone();
        r["call_id"] = json!(format!("c{i}"));
        r.to_string()
    };
    let count = match url {
        None => {
            let (mut more, mut count) = (String::new(), 0);
            while more.len() < 5 * 1024 * 1024 {
                more.push_str(&numbered(count));
                more.push('\n');
                count += 1;
            }
            use std::io::Write;
            let log = data.path().join("sessions/default/audit.jsonl");
            let mut file = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
            file.write_all(more.as_bytes()).unwrap();
            count
        }
        Some(url) => {
            let count = 10_050;
            let template = numbered(0)
                .replace("\"c0\"", "\"CALL\"")
                .replace('\'', "''");
            super::pg_store::psql(
                url,
                &format!(
                    "INSERT INTO audit (session_id, record) SELECT 'default', \
                     replace('{template}', '\"CALL\"', '\"c' || g || '\"') \
                     FROM generate_series(0, {}) AS g ORDER BY g",
                    count - 1
                ),
            );
            count
        }
    };
    let out = server_cmd(data.path(), &["session", "audit", "default", "--json"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let all: Value = serde_json::from_slice(&out.stdout).expect("one JSON array");
    let all = all.as_array().unwrap();
    assert_eq!(all.len(), count + 1);
    for (i, r) in all[1..].iter().enumerate() {
        assert_eq!(r["call_id"], format!("c{i}"), "in order, each once");
    }
    let out = server_cmd(data.path(), &["session", "audit", "default"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).lines().count(), count + 1);
    // `session show` counts them the same way, a page at a time.
    let out = server_cmd(data.path(), &["session", "show", "default", "--json"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(shown["calls"], count + 1, "{shown}");
    assert_eq!(shown["denied"], 0, "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_audit_shows_the_calls_and_follow_prints_new_ones() {
    session_audit_and_follow(None).await;
}

/// On PostgreSQL, `--follow` goes on from the log's cursor (the sequence number of its last row
/// read), each page found by the index rather than by counting the rows before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_audit_shows_the_calls_and_follow_prints_new_ones_on_postgresql() {
    let Some(url) = super::pg_store::pg_url("session_audit_follow_on_postgresql") else {
        return;
    };
    session_audit_and_follow(Some(&url)).await;
}

/// [`session_audit_shows_the_calls_and_follow_prints_new_ones`] on a backend.
async fn session_audit_and_follow(url: Option<&str>) {
    let (_server, data, config) = logged_in_on(url).await;
    let out = client(config.path(), &["call", "list_dir"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The audit log is written just after the answer: wait (bounded) for its line.
    let out = within(STEP, "the call in the audit log", async {
        loop {
            let out = server_cmd(data.path(), &["session", "audit", "default"]).await;
            assert!(out.status.success(), "{}", text(&out.stderr));
            if !out.stdout.is_empty() {
                return out;
            }
        }
    })
    .await;
    let row: Vec<String> = text(&out.stdout)
        .lines()
        .next()
        .expect("a row")
        .split('\t')
        .map(str::to_owned)
        .collect();
    // time, tool, workspace, who decided, decision, outcome, duration, target
    assert_eq!(
        row[1..6],
        ["list_dir", "primary", "trust", "allowed", "ok"],
        "{row:?}"
    );
    assert!(row[6].ends_with(" ms"), "{row:?}");
    let out = server_cmd(data.path(), &["session", "audit", "default", "--json"]).await;
    let all: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(all[0]["tool"], "list_dir");

    let mut follow = command("monad-server")
        .arg("--data-dir")
        .arg(data.path())
        .args(["session", "audit", "default", "--follow"])
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(follow.stdout.take().unwrap()).lines();
    wait_for_line(&mut lines, STEP, "the first call", |l| {
        l.contains("list_dir")
    })
    .await;
    let out = client(
        config.path(),
        &["call", "glob", "--args", r#"{"pattern": "*"}"#],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_for_line(&mut lines, STEP, "the new call", |l| l.contains("\tglob\t")).await;
    // Its reader gone (`| head -1`), the follow ends without waiting for a new call to write.
    drop(lines);
    let status = within(STEP, "the follow to end with its reader", follow.wait())
        .await
        .unwrap();
    assert!(status.success(), "{status}");
}

/// A server process on a fresh data dir whose `config.toml` names the PostgreSQL store at `url`
/// (the filesystem store when `None`), and a client config logged in to it.
async fn logged_in_on(url: Option<&str>) -> (ServerProcess, tempfile::TempDir, tempfile::TempDir) {
    let data = tempfile::tempdir().unwrap();
    if let Some(url) = url {
        std::fs::write(
            data.path().join("config.toml"),
            format!("[store]\nurl = \"{url}\"\n"),
        )
        .unwrap();
    }
    let server = ServerProcess::start(data.path(), &[]).await;
    let token = server.first_token.clone().expect("a first start");
    let config = tempfile::tempdir().unwrap();
    server.client_config(&token).save(config.path()).unwrap();
    (server, data, config)
}

/// Whether `monad-server session list` (which reads the configured store) lists `id`.
async fn listed(data: &Path, id: &str) -> bool {
    let out = server_cmd(data, &["session", "list", "--json"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let sessions: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    sessions
        .as_array()
        .expect("an array")
        .iter()
        .any(|s| s["id"] == id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_and_delete_work_through_the_running_server_and_ask_first() {
    gc_and_delete_through_the_running_server(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_and_delete_work_through_the_running_server_on_postgresql() {
    let Some(url) =
        super::pg_store::pg_url("gc_and_delete_work_through_the_running_server_on_postgresql")
    else {
        return;
    };
    gc_and_delete_through_the_running_server(Some(&url)).await;
}

/// `session gc` and `session delete` beside a running server, on a backend.
async fn gc_and_delete_through_the_running_server(url: Option<&str>) {
    let (server, data, config) = logged_in_on(url).await;
    let d = data.path();
    let out = client(config.path(), &["sessions", "--new", "--name", "old"]).await;
    let old = text(&out.stdout).trim().to_owned();
    let out = client(config.path(), &["sessions", "--new", "--name", "doomed"]).await;
    let doomed = text(&out.stdout).trim().to_owned();
    let out = client(config.path(), &["sessions", "use", "default"]).await;
    assert!(out.status.success());

    // --dry-run lists and deletes nothing; without a terminal, --yes is needed.
    let out = server_cmd(d, &["session", "gc", "--max-age", "0", "--dry-run"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stderr);
    assert!(said.contains(&old) && said.contains(&doomed), "{said}");
    assert!(
        said.contains("2 sessions") && said.contains("through the running server"),
        "{said}"
    );
    // The ids alone on standard output, for a script, as a real run prints those it deleted.
    let mut ids: Vec<String> = text(&out.stdout).lines().map(str::to_owned).collect();
    ids.sort();
    let mut both = vec![old.clone(), doomed.clone()];
    both.sort();
    assert_eq!(ids, both);
    // Reading beside it: the sessions of the configured store, by a prefix of their id.
    let out = server_cmd(d, &["session", "show", &old[..8], "--json"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(shown["meta"]["id"], old.as_str());
    assert_eq!(shown["meta"]["name"], "old");
    let out = server_cmd(d, &["session", "delete", &doomed[..8]]).await;
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("--yes"), "{}", text(&out.stderr));
    assert!(listed(d, &doomed).await);

    // On a terminal, it asks; `y` deletes, through the server, which forgets it at once.
    let (mut pty, at) = asking(d, &["session", "delete", &doomed[..8]]).await;
    pty.send(b"y\n");
    pty.wait_for("deleted 1 session (through the running server)", at)
        .await;
    assert!(!listed(d, &doomed).await);
    let theirs = client(config.path(), &["sessions", "--json"]).await;
    assert!(!text(&theirs.stdout).contains(&doomed));

    // `n` keeps it.
    let gc = ["session", "gc", "--max-age", "0"];
    let (mut pty, at) = asking(d, &gc).await;
    pty.send(b"n\n");
    pty.wait_for("nothing deleted", at).await;
    assert!(listed(d, &old).await);

    // Used while the question waits: kept, even at `--max-age 0` (any use before the answer
    // looked old enough, and it was deleted).
    let (mut pty, at) = asking(d, &gc).await;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let used = client(config.path(), &["call", "list_dir", "--session", &old]).await;
    assert!(used.status.success(), "{}", text(&used.stderr));
    pty.send(b"y\n");
    pty.wait_for("used since it was listed", at).await;
    assert!(listed(d, &old).await);

    // A session in use (a folder attached) is kept, whatever its age.
    let laptop = folder(&[]);
    let _attached = Attaching::start(
        config.path(),
        &[laptop.path().to_str().unwrap(), "--session", &old],
    )
    .await;
    let out = server_cmd(d, &["session", "gc", "--max-age", "0", "--yes"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!text(&out.stdout).contains(&old));
    assert!(listed(d, &old).await);
    // Gone before the next command looks for it: a server still dying can take that
    // command's connection on its administration socket and reset it.
    server.kill().await;

    // With no server, a command that deletes holds the directory's lock while it asks: a
    // server, or another such command, is told which process holds it and to wait for it.
    let (mut pty, at) = asking(d, &gc).await;
    let pid = pty.child.id().expect("it asks");
    let holder = format!("`monad-server session gc` (process {pid}) is working on it");
    let out = server_cmd(d, &["--listen", "127.0.0.1:0", "--no-http"]).await;
    assert!(!out.status.success());
    let said = text(&out.stderr);
    assert!(
        said.contains(&holder) && said.contains("wait for it to finish"),
        "{said}"
    );
    let out = server_cmd(d, &["session", "delete", &old[..8], "--yes"]).await;
    assert!(!out.status.success());
    let said = text(&out.stderr);
    assert!(
        said.contains(&holder) && !said.contains("older than"),
        "{said}"
    );
    pty.send(b"n\n");
    pty.wait_for("nothing deleted", at).await;

    // --max-age: days bare or with d, hours with h; anything else is refused.
    for bad in ["12m", "1.5", "-1", "soon"] {
        let age = format!("--max-age={bad}");
        let out = server_cmd(d, &["session", "gc", &age, "--dry-run"]).await;
        assert_eq!(out.status.code(), Some(2), "{bad}");
        assert!(
            text(&out.stderr).contains("not an age"),
            "{}",
            text(&out.stderr)
        );
    }
    for good in ["90", "90d", "12h"] {
        let out = server_cmd(d, &["session", "gc", "--max-age", good, "--dry-run"]).await;
        assert!(out.status.success(), "{good}: {}", text(&out.stderr));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_fails_with_what_to_check_and_a_host_alone_means_port_4433() {
    // A UDP port that never answers.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let config = tempfile::tempdir().unwrap();
    // `sessions` with a config naming `server`: it fails; what it said.
    let sessions_at = async |server: std::net::SocketAddr| {
        monad_client::config::ClientConfig::new(&server.to_string(), "mnd_x", &"0".repeat(64))
            .unwrap()
            .save(config.path())
            .unwrap();
        let out = client(config.path(), &["sessions"]).await;
        assert!(!out.status.success());
        text(&out.stderr)
    };
    let said = sessions_at(silent.local_addr().unwrap()).await;
    assert!(
        said.contains("is `monad-server` running on 127.0.0.1:"),
        "{said}"
    );
    assert!(said.contains("UDP"), "{said}");
    assert_eq!(said.trim().lines().count(), 1, "{said}");

    // A port nothing listens on: its machine says so, and the command fails at once with that
    // (it waited 3 s for an answer that never comes, as from a silent one).
    let closed = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let said = sessions_at(closed).await;
    assert!(
        said.contains(&format!("{closed}: nothing listens on that port"))
            && said.contains("on that port?")
            && !said.contains("no answer within"),
        "{said}"
    );

    let fresh = tempfile::tempdir().unwrap();
    let out = command("monad-client")
        .args([
            "login",
            "--server",
            // Not 127.0.0.1: a monad-server running here with its defaults listens there.
            "127.0.0.2",
            "--fingerprint",
            &"0".repeat(64),
        ])
        .env("MONAD_CONFIG_DIR", fresh.path())
        .env("MONAD_TOKEN", "mnd_x")
        .output();
    let out = within(STEP, "login", out).await.unwrap();
    assert!(!out.status.success(), "nothing answers as that server");
    let default = format!("127.0.0.2:{}", monad_client::connect::DEFAULT_PORT);
    assert!(
        text(&out.stderr).contains(&default),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_have_no_colour_when_piped_and_one_line_per_connection_refusal_and_call() {
    let data = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(data.path(), &[("RUST_LOG", "monad_server=debug")]).await;
    let token = server.first_token.clone().unwrap();
    let config = tempfile::tempdir().unwrap();
    server.client_config(&token).save(config.path()).unwrap();
    let out = client(config.path(), &["call", "list_dir"]).await;
    assert!(out.status.success());
    let bad = tempfile::tempdir().unwrap();
    server
        .client_config("mnd_wrong_secret_token")
        .save(bad.path())
        .unwrap();
    let out = client(bad.path(), &["sessions"]).await;
    assert!(!out.status.success());
    let logged = within(STEP, "the log lines", async {
        loop {
            let said = server.stderr();
            if said.contains("refused a connection") && said.contains("disconnected") {
                return said;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(
        !logged.contains('\u{1b}'),
        "no colour codes in a pipe:\n{logged}"
    );
    let connected: Vec<&str> = logged
        .lines()
        .filter(|l| l.contains(" connected"))
        .collect();
    assert_eq!(connected.len(), 1, "{logged}");
    assert!(connected[0].contains("user=admin"), "{logged}");
    assert!(
        logged
            .lines()
            .any(|l| l.contains("disconnected") && l.contains("user=admin"))
    );
    assert_eq!(
        logged
            .lines()
            .filter(|l| l.contains("refused a connection"))
            .count(),
        1,
        "{logged}"
    );
    assert!(
        !logged.contains("wrong_secret"),
        "the token is never logged:\n{logged}"
    );
    assert!(
        logged.lines().any(
            |l| l.contains("tool call") && l.contains("tool=\"list_dir\"")
                || l.contains("tool call") && l.contains("tool=list_dir")
        ),
        "{logged}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attach_terminal_says_each_thing_once() {
    let data = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(data.path(), &[]).await;
    let token = server.first_token.clone().unwrap();
    let config = tempfile::tempdir().unwrap();
    server.client_config(&token).save(config.path()).unwrap();
    let laptop = folder(&[]);
    let mut attach = Attaching::start(config.path(), &[laptop.path().to_str().unwrap()]).await;
    server.kill().await;
    attach.wait_for("reconnecting in").await;
    attach.wait_for("reconnecting in").await;
    attach.signal(nix::sys::signal::Signal::SIGINT);
    let (status, said) = attach.exit().await;
    assert!(status.success(), "{said}");
    let lost: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("reconnecting"))
        .collect();
    let distinct: std::collections::HashSet<&str> = lost.iter().copied().collect();
    assert!(
        !said.contains("WARN") && !said.contains("INFO"),
        "no log line repeats what the terminal says:\n{said}"
    );
    assert!(lost.len() >= 2 && distinct.len() == lost.len(), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latin1_and_utf16_files_are_read_as_text_and_a_binary_file_says_why() {
    let (_server, _data, config) = ServerProcess::logged_in().await;
    let laptop = folder(&[]);
    std::fs::write(laptop.path().join("latin1.txt"), b"caf\xe9 cr\xe8me\n").unwrap();
    let mut utf16 = vec![0xFF, 0xFE];
    utf16.extend(
        "h\u{e9}llo\nw\u{f6}rld\n"
            .encode_utf16()
            .flat_map(u16::to_le_bytes),
    );
    std::fs::write(laptop.path().join("utf16.txt"), utf16).unwrap();
    std::fs::write(
        laptop.path().join("image.png"),
        b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR",
    )
    .unwrap();
    let dir = laptop.path().to_str().unwrap();
    let _attached = Attaching::start(config.path(), &[dir, "--allow", "read"]).await;
    let read = |path: &'static str| {
        let config = config.path().to_owned();
        async move {
            let args = format!(r#"{{"path": "{path}"}}"#);
            let out = client(&config, &["call", "read_file", "--args", &args, "--json"]).await;
            assert!(out.status.success(), "{}", text(&out.stderr));
            let value: Value = serde_json::from_slice(&out.stdout).unwrap();
            value["outcome"]["result"].clone()
        }
    };
    let latin1 = read("latin1.txt").await;
    assert_eq!(latin1["content"], "café crème\n", "{latin1}");
    assert_eq!(latin1["encoding"], "windows-1252");
    assert_eq!(latin1["binary"], false);
    let utf16 = read("utf16.txt").await;
    assert_eq!(utf16["content"], "héllo\nwörld\n", "{utf16}");
    assert_eq!(utf16["encoding"], "utf-16le");
    assert_eq!(utf16["lines"], 2);
    let image = read("image.png").await;
    assert_eq!(image["binary"], true);
    assert_eq!(image["content"], "");
    assert!(
        image["binary_reason"]
            .as_str()
            .unwrap()
            .contains("NUL byte"),
        "{image}"
    );
    // The model's text says so too.
    let out = client(
        config.path(),
        &["call", "read_file", "--args", r#"{"path": "latin1.txt"}"#],
    )
    .await;
    assert!(
        text(&out.stdout).contains("decoded from windows-1252"),
        "{}",
        text(&out.stdout)
    );
    let out = client(
        config.path(),
        &["call", "read_file", "--args", r#"{"path": "image.png"}"#],
    )
    .await;
    assert!(
        text(&out.stdout).contains("not shown: it has a NUL byte"),
        "{}",
        text(&out.stdout)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_user_cannot_delete_sessions_through_the_running_servers_socket() {
    use std::os::unix::fs::PermissionsExt;
    let (_server, data, config) = ServerProcess::logged_in().await;
    let d = data.path();
    let out = client(config.path(), &["sessions", "--new", "--name", "mine"]).await;
    let mine = text(&out.stdout).trim().to_owned();
    let out = client(config.path(), &["sessions", "use", "default"]).await;
    assert!(out.status.success());
    // A careless operator opened the data dir and the socket to everyone: the server still
    // hears only its own user.
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = d.join("admin.sock");
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    let bin = monad_tests::binary("monad-server");
    let mut cmd = tokio::process::Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin)
        .arg("--data-dir")
        .arg(d)
        .args(["session", "gc", "--max-age", "0", "--yes"])
        .env("HOME", "/")
        .env("RUST_LOG", "warn")
        .kill_on_drop(true);
    let out = within(STEP, "gc as another user", cmd.output())
        .await
        .unwrap();
    assert!(!out.status.success(), "{}", text(&out.stdout));
    // The command itself says whose directory it is.
    let said = text(&out.stderr);
    assert!(said.contains("run it as"), "{said}");
    // And the socket, asked directly, hears only the server's own user.
    let ask = format!(
        "import socket; s = socket.socket(socket.AF_UNIX); s.connect({:?}); \
         print(s.makefile().readline()); \
         s.sendall(b'{{\"op\": \"delete\", \"sessions\": [\"{mine}\"]}}\\n')",
        socket.display().to_string()
    );
    let mut cmd = tokio::process::Command::new("setpriv");
    cmd.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "python3",
        "-c",
    ])
    .arg(&ask)
    // The system's Python: one under root's home is not the other user's to run.
    .env("PATH", "/usr/local/bin:/usr/bin:/bin")
    .kill_on_drop(true);
    let out = within(STEP, "the socket asked as another user", cmd.output())
        .await
        .unwrap();
    let said = text(&out.stdout);
    assert!(said.contains("refused"), "{said}{}", text(&out.stderr));
    assert!(d.join("sessions").join(&mine).is_dir(), "nothing deleted");
}

/// `attach` runs its folder on one thread; the lines it prints for each call must not hold that
/// thread up. With a standard error nobody reads (here a pipe shrunk to one page, full after a
/// few dozen calls' lines), calls keep being answered; the lines that wait for it are bounded
/// (those past the bound are counted, and the count is printed once the pipe is read again); and
/// told to stop while the pipe is full, the attachment exits (it used to hang there, writing its
/// last line).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attachment_whose_standard_error_is_not_read_keeps_answering_and_exits() {
    use std::os::fd::AsFd;
    let (_server, _data, config) = ServerProcess::logged_in().await;
    let dir = folder(&[("a.txt", "hello\n")]);
    let mut attaching = Attaching::start(
        config.path(),
        &[
            dir.path().to_str().unwrap(),
            "--name",
            "laptop",
            "--non-interactive",
            "--allow",
            "read",
        ],
    )
    .await;
    // From here on nothing reads the pipe, and it holds one page (4 KiB, or more where pages
    // are larger: the calls below are counted from what it holds).
    let stderr = attaching.lines.get_ref().get_ref();
    nix::fcntl::fcntl(stderr.as_fd(), nix::fcntl::FcntlArg::F_SETPIPE_SZ(4096))
        .expect("the pipe shrinks");
    let pipe = nix::fcntl::fcntl(stderr.as_fd(), nix::fcntl::FcntlArg::F_GETPIPE_SZ)
        .expect("the pipe's size") as usize;
    // Two lines of 25 to 45 bytes per call: this many calls fill the pipe.
    let fill = pipe / 70 + 20;
    let settings = monad_client::config::ClientConfig::load(config.path()).unwrap();
    let agent = monad_client::agent::Agent::connect(&settings)
        .await
        .unwrap();
    let read = |n: usize| {
        let agent = &agent;
        async move {
            let reply = within(
                STEP,
                &format!("call {n} with standard error full"),
                agent.call(
                    None,
                    "read_file",
                    json!({"path": "a.txt", "workspace": "laptop"}),
                    |_| {},
                ),
            )
            .await
            .expect("the call is answered");
            assert!(
                matches!(reply.outcome, monad_protocol::wire::Outcome::Ok { .. }),
                "call {n}: {:?}",
                reply.outcome
            );
        }
    };
    // The pipe full, then the 512 lines held (256 calls), then about 200 lines left out.
    for n in 0..fill + 256 + 100 {
        read(n).await;
    }
    // The pipe is read again: what was held comes out, and with the next call's lines, the
    // count of those left out.
    let note = tokio::select! {
        line = attaching.wait_for("not shown") => line,
        () = async {
            for n in fill + 356.. {
                read(n).await;
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        } => unreachable!(),
    };
    assert!(
        note.contains("lines not shown: standard error was not taking them"),
        "{note}"
    );
    let left_out: u64 = note
        .trim_start_matches('(')
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a count: {note}"));
    assert!(left_out >= 100, "{note}");
    // Full again, and told to stop: it exits all the same, after at most the second it gives
    // its last lines (and the moment it takes to tell the server).
    for n in 0..fill {
        read(n).await;
    }
    attaching.signal(nix::sys::signal::Signal::SIGTERM);
    let stopped = std::time::Instant::now();
    let status = within(
        STEP,
        "attach to exit with its standard error full",
        attaching.child.wait(),
    )
    .await
    .expect("reaped");
    assert!(status.success(), "{status}");
    assert!(
        stopped.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        stopped.elapsed()
    );
}

/// Each command closes its connection before it exits, so that the server lets it go at once
/// rather than at its idle time-out: a script that calls in a loop stays within the user's
/// connections (`server.max_connections_per_user`, 2 here). Before, some of the commands left
/// theirs open, and the next calls were refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_close_their_connection_so_a_loop_of_calls_stays_within_the_limit() {
    let server =
        monad_tests::TestServer::start_with(|c| c.quotas.max_connections_per_user = 2).await;
    let config = tempfile::tempdir().unwrap();
    server
        .client_config()
        .save(config.path())
        .expect("the client config is saved");
    let commands: [&[&str]; 4] = [
        &["call", "workspaces"],
        &["call", "stat", "--args", r#"{"path": "."}"#],
        &["status"],
        &["sessions"],
    ];
    for round in 0..4 {
        for args in commands {
            let out = client(config.path(), args).await;
            assert!(
                out.status.success(),
                "round {round}, `monad-client {}`: {}",
                args.join(" "),
                text(&out.stderr)
            );
        }
    }
    // A chat that cannot start (a session no id begins with) closes its connection too.
    for round in 0..3 {
        let out = client(config.path(), &["chat", "--session", "zzzz"]).await;
        assert!(!out.status.success(), "round {round}");
        assert!(
            !text(&out.stderr).contains("connections"),
            "round {round}: {}",
            text(&out.stderr)
        );
    }
    let out = client(config.path(), &["status"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// `token create` makes the data directory when there is none (a token before the first
/// start), and says so: with a mistyped `--data-dir` it makes a deployment no server uses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_create_says_when_it_makes_a_new_data_directory() {
    let parent = tempfile::tempdir().unwrap();
    let data = parent.path().join("typo");
    let out = server_cmd(&data, &["token", "create", "--user", "ana"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("made a new data directory"),
        "{}",
        text(&out.stderr)
    );
    let again = server_cmd(&data, &["token", "create", "--user", "ben"]).await;
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert!(
        !text(&again.stderr).contains("made a new data directory"),
        "{}",
        text(&again.stderr)
    );
}

/// `--args -` reads the arguments from standard input and `--args @FILE` from a file: one
/// command-line argument holds at most 128 KiB, less than a `write_file` of a large file; bad
/// JSON is quoted by its start, not echoed whole; a file that cannot be read is a usage error
/// (status 2), as bad JSON is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_takes_its_arguments_from_standard_input_or_a_file() {
    let (server, _data, config) = ServerProcess::logged_in().await;
    let content = "0123456789abcdef\n".repeat(200 * 1024 / 17);
    let args = json!({"path": "big.txt", "content": content, "workspace": "primary"}).to_string();
    let out = client_fed(
        config.path(),
        &["call", "write_file", "--json", "--args", "-"],
        args.as_bytes(),
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let file = config.path().join("args.json");
    std::fs::write(
        &file,
        json!({"path": "big.txt", "workspace": "primary", "limit": 100_000}).to_string(),
    )
    .unwrap();
    let at = format!("@{}", file.display());
    let out = client(
        config.path(),
        &["call", "read_file", "--json", "--args", &at],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let read: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        read["outcome"]["result"]["content"] == content.as_str(),
        "the file read back is not what was written ({} bytes of JSON)",
        out.stdout.len()
    );
    // A missing file, and bad JSON quoted by its start.
    let out = client(
        config.path(),
        &["call", "read_file", "--args", "@/nonexistent/a.json"],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("cannot read --args"),
        "{}",
        text(&out.stderr)
    );
    let bad = format!("{{{}", "x".repeat(100_000));
    let out = client(config.path(), &["call", "read_file", "--args", &bad]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(out.stderr.len() < 2000, "{}", out.stderr.len());
    // The arguments after the tool, in place of `--args`, in the same forms; not both.
    let out = client(config.path(), &["call", "read_file", "--json", &at]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let read: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(read["outcome"]["result"]["content"] == content.as_str());
    let given = json!({"path": "big.txt", "workspace": "primary", "limit": 1}).to_string();
    let out = client(config.path(), &["call", "read_file", &given]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("big.txt in workspace primary: lines 1-1 "),
        "{}",
        text(&out.stdout)
    );
    let out = client(
        config.path(),
        &["call", "read_file", &given, "--args", &given],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("cannot be used with"));
    let out = client(config.path(), &["call", "read_file", "[1]"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("ARGS must be a JSON object"),
        "{}",
        text(&out.stderr)
    );
    // An empty --workspace names none: a usage error, not a call routed as if it were left out.
    let out = client(
        config.path(),
        &["call", "read_file", "--workspace", "", &given],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("--workspace is empty"),
        "{}",
        text(&out.stderr)
    );
    drop(server);
}

/// A snapshot `history replace --file` cannot use is a usage error (2), said before connecting
/// (it was a failed command, 1, after a connection); `status --json` of a config directory
/// whose path is not UTF-8 prints it (it panicked); `sessions --new --folder` of such a folder
/// is refused, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_that_cannot_be_used_and_paths_that_are_not_utf8_are_said_clearly() {
    let (server, _data, config) = ServerProcess::logged_in().await;
    let not_json = config.path().join("not.json");
    std::fs::write(&not_json, "[1").unwrap();
    let not_history = config.path().join("other.json");
    std::fs::write(&not_history, r#"{"a": 1}"#).unwrap();
    let files = [
        ("/nonexistent/snapshot.json".to_owned(), "cannot read"),
        (not_json.display().to_string(), "is not JSON"),
        (not_history.display().to_string(), "is not a history"),
    ];
    for (file, said) in files {
        let out = client(config.path(), &["history", "replace", "--file", &file]).await;
        assert_eq!(out.status.code(), Some(2), "{file}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains(said), "{}", text(&out.stderr));
    }
    let shown = client(config.path(), &["history", "show", "--json"]).await;
    assert!(shown.status.success(), "{}", text(&shown.stderr));
    use std::os::unix::ffi::OsStrExt as _;
    let odd = config
        .path()
        .join(std::ffi::OsStr::from_bytes(b"conf\xffig"));
    std::fs::create_dir(&odd).unwrap();
    std::fs::copy(config.path().join("config.toml"), odd.join("config.toml")).unwrap();
    // `sessions --new --folder` of such a folder says it has no sessions to give (it started
    // a session of no folder, and said nothing).
    let out = command("monad-client")
        .args(["sessions", "--new", "--folder"])
        .arg(&odd)
        .env("MONAD_CONFIG_DIR", config.path())
        .output();
    let out = within(STEP, "sessions --new --folder", out).await.unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr)
            .contains("is not valid UTF-8: no folder of that path can be attached, so none"),
        "{}",
        text(&out.stderr)
    );
    let out = client(&odd, &["status", "--json"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        status["config"]
            .as_str()
            .is_some_and(|c| c.ends_with("conf\u{fffd}ig/config.toml")),
        "{status}"
    );
    drop(server);
}

/// Regression: Ctrl-C at `login`'s token prompt (which does not echo) ended the process with
/// the terminal's echo still off, so the shell after it showed nothing typed. The terminal gets
/// its echo back, the process ends by the signal as before, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_at_the_token_prompt_gives_the_terminal_its_echo_back() {
    let config = tempfile::tempdir().unwrap();
    let free = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let server = free.local_addr().unwrap().to_string();
    let mut cmd = command("monad-client");
    cmd.args([
        "login",
        "--server",
        &server,
        "--fingerprint",
        &"ab".repeat(32),
    ])
    .env("MONAD_CONFIG_DIR", config.path())
    .env_remove("MONAD_TOKEN");
    let mut pty = Pty::spawn(cmd);
    pty.wait_for("not shown as you type", 0).await;
    assert!(!pty.echoes_lines(), "the prompt turned echo off");
    pty.send(b"mnd_par");
    // Ctrl-C (the terminal is not the child's controlling one: the signal is sent as it would).
    let pid = nix::unistd::Pid::from_raw(pty.child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let status = within(STEP, "login to end on Ctrl-C", pty.child.wait())
        .await
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(2), "ended by SIGINT: {status:?}");
    assert!(pty.echoes_lines(), "echo is back: {}", pty.text());
    assert!(!config.path().join("config.toml").exists());
}

/// A malformed `login --server` or `--fingerprint` is a usage error (status 2, and where help
/// is), like any other bad flag; nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_flags_that_cannot_be_right_are_usage_errors() {
    let config = tempfile::tempdir().unwrap();
    let good = "ab".repeat(32);
    // Never reached (the flags are refused first), but never a port a real server may use.
    let free = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let server = free.local_addr().unwrap().to_string();
    let twice = ["--server", server.as_str(), "--server", server.as_str()];
    for (args, said) in [
        (
            &["--server", server.as_str(), "--fingerprint", "zz"][..],
            "not a certificate fingerprint",
        ),
        (
            &["--server", "host:99999", "--fingerprint", good.as_str()],
            "not a server address",
        ),
        (
            &[&twice[..], &["--fingerprint", good.as_str()]].concat(),
            "listed twice",
        ),
    ] {
        let out = client(
            config.path(),
            &[&["login", "--token", "mnd_x"][..], args].concat(),
        )
        .await;
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        let err = text(&out.stderr);
        assert!(err.contains(said) && err.contains("--help"), "{err}");
        assert!(!config.path().join("config.toml").exists());
    }
}

/// `monad-client chat` fed its messages on a pipe exits non-zero when the last one got no
/// answer (here: the server has no model), so that a script notices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_on_a_pipe_exits_non_zero_when_its_last_message_got_no_answer() {
    let (_server, _data, config) = ServerProcess::logged_in().await;
    let out = client_fed(config.path(), &["chat"], b"hello\n/help\n").await;
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(said.contains("no model"), "{said}");
    assert_eq!(out.status.code(), Some(1), "{said}");
}

/// `--listen` takes a host name as well as an address (`localhost:PORT` listens on
/// 127.0.0.1); a name that does not resolve is a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_listens_on_a_host_name() {
    let data = tempfile::tempdir().unwrap();
    let mut server = command("monad-server")
        .arg("--data-dir")
        .arg(data.path())
        .args(["--listen", "localhost:0", "--no-http"])
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(server.stderr.take().unwrap()).lines();
    let line = wait_for_line(&mut lines, STEP, "the listening line", |l| {
        l.starts_with("monad-server listening on ")
    })
    .await;
    assert!(
        line.starts_with("monad-server listening on 127.0.0.1:"),
        "{line}"
    );
    let free = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let unresolved = format!("no-such-host.invalid:{}", free.local_addr().unwrap().port());
    let out = server_cmd(data.path(), &["--listen", &unresolved]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("--listen"),
        "{}",
        text(&out.stderr)
    );
}

/// Serving's flags before another command would be ignored: `monad-server --store URL session
/// gc` cleaned the data directory's files, not the database it named. They are usage errors,
/// as after the command, and nothing is touched. Addresses no client could reach are refused
/// too: `token create --server` made a token and a login line that cannot work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serving_flags_before_another_command_and_unusable_addresses_are_usage_errors() {
    let data = tempfile::tempdir().unwrap();
    let made = server_cmd(data.path(), &["token", "create", "--user", "ana"]).await;
    assert!(made.status.success(), "{}", text(&made.stderr));
    let tokens = || std::fs::read(data.path().join("tokens.toml")).unwrap_or_default();
    let before = tokens();
    let free = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let listen = free.local_addr().unwrap().to_string();
    for (args, flag) in [
        (
            &[
                "--store",
                "postgres://u@localhost/x",
                "session",
                "gc",
                "--max-age",
                "1",
                "--dry-run",
            ][..],
            "--store",
        ),
        (&["--objects", "s3://b/p", "session", "list"], "--objects"),
        (&["--listen", &listen, "token", "create"], "--listen"),
        (&["--no-http", "workspace", "list"], "--no-http"),
        (
            &["--listen", &listen, "serve", "--no-http"],
            "after `serve`",
        ),
    ] {
        let out = server_cmd(data.path(), args).await;
        let said = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {said}");
        assert!(
            said.contains(flag) && said.contains("ignored"),
            "{args:?}: {said}"
        );
    }
    for bad in ["http://a b/", "host", "host:0", "a b:80"] {
        let out = server_cmd(data.path(), &["token", "create", "--server", bad]).await;
        let said = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {said}");
        assert!(said.contains("is not HOST:PORT"), "{bad}: {said}");
    }
    // Other values no command could take, before anything is done.
    for args in [
        &["token", "create", "--user", "bad name"][..],
        &["workspace", "show", "x", "--limit", "0"],
        &["workspace", "show", "x", "--limit", "101"],
    ] {
        let out = server_cmd(data.path(), args).await;
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    let empty = tempfile::tempdir().unwrap();
    let out = client(empty.path(), &["sessions", "use", ""]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let out = client(empty.path(), &["chat", "--base-url", "notaurl"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let out = client_fed(empty.path(), &["call", "stat", "--args", "-"], b"").await;
    let said = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("--args is empty"), "{said}");
    assert_eq!(tokens(), before, "a refused command changed the tokens");
    // A usable one still works.
    let out = server_cmd(
        data.path(),
        &["token", "create", "--server", "monad.example.com:7000"],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("--server monad.example.com:7000"),
        "{}",
        text(&out.stdout)
    );
}

/// A login whose `--fingerprint` is not the server's says that the fingerprint just given is
/// not the server's and where to find the right one, not to "log in again" (which the user is
/// doing); nothing is saved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_with_the_wrong_fingerprint_says_which_one_to_give() {
    let data = tempfile::tempdir().unwrap();
    let server = monad_tests::ServerProcess::start(data.path(), &[]).await;
    let token = server.first_token.clone().expect("a first start");
    let config = tempfile::tempdir().unwrap();
    let wrong = "0".repeat(64);
    let address = server.addr.to_string();
    let out = client(
        config.path(),
        &[
            "login",
            "--server",
            &address,
            "--fingerprint",
            &wrong,
            "--token",
            &token,
        ],
    )
    .await;
    let said = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("given with --fingerprint")
            && said.contains("monad-server fingerprint")
            && said.contains(&server.fingerprint)
            && !said.contains("log in again"),
        "{said}"
    );
    assert!(!config.path().join("config.toml").exists());
}

/// `sessions --new --folder DIR` for a folder this device has not attached cannot make the new
/// session the folder's active session: it says so, with the line that attaches it there,
/// rather than nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_new_for_a_folder_not_attached_says_so() {
    let (_server, _data, config) = ServerProcess::logged_in().await;
    let project = folder(&[]);
    let dir = project.path().to_str().unwrap();
    let out = client(config.path(), &["sessions", "--new", "--folder", dir]).await;
    let said = text(&out.stderr);
    assert!(out.status.success(), "{said}");
    let id = text(&out.stdout).trim().to_owned();
    assert!(
        said.contains("no folder of this device serves the new session")
            && said.contains(&format!("--session {id}")),
        "{said}"
    );
}

/// Attaching the whole filesystem (or one's home directory) is allowed, but said: every file
/// the user can read is then within the agents' reach. A project's folder is not warned of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attaching_the_filesystem_root_says_what_it_puts_within_reach() {
    let (_server, _data, config) = ServerProcess::logged_in().await;
    let project = folder(&[]);
    for (dir, name, warned) in [
        (Path::new("/"), "all", true),
        (project.path(), "proj", false),
    ] {
        let mut child = command("monad-client")
            .arg("attach")
            .arg(dir)
            .args(["--name", name, "--non-interactive"])
            .env("MONAD_CONFIG_DIR", config.path())
            .spawn()
            .expect("attach starts");
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let mut before = Vec::new();
        let attached = within(STEP, "the attach confirmation", async {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.starts_with("attached ") {
                    return true;
                }
                before.push(line);
            }
            false
        })
        .await;
        let said = before.join("\n");
        assert!(attached, "{dir:?}: {said}");
        assert_eq!(
            said.contains("warning: / is the whole filesystem"),
            warned,
            "{dir:?}: {said}"
        );
        let pid = nix::unistd::Pid::from_raw(child.id().expect("running") as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("signalled");
        within(STEP, "attach to exit", child.wait())
            .await
            .expect("reaped");
    }
}

/// A server that says welcome and then never answers the attach: Ctrl-C still detaches at once
/// (before, `attach` waited on the answer for as long as the server kept the connection alive,
/// and every later Ctrl-C, SIGTERM or SIGHUP did nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_ends_an_attach_the_server_never_answers() {
    use monad_protocol::io::read_message;
    use monad_protocol::wire::Message;
    let server = monad_tests::RogueServer::start(|_| {});
    let endpoint = server.endpoint.clone();
    // Says welcome, takes the attach, and answers nothing more (quinn keeps the connection
    // alive meanwhile).
    let (took, attach_taken) = tokio::sync::oneshot::channel();
    let rogue = tokio::spawn(async move {
        let conn = monad_tests::RogueServer::welcome(&endpoint).await;
        let (_send, mut recv) = conn.accept_bi().await.unwrap();
        let attach = read_message(&mut recv, 1 << 20).await.unwrap();
        assert!(matches!(attach, Some(Message::Attach { .. })), "{attach:?}");
        let _ = took.send(());
        std::future::pending::<()>().await;
        drop((conn, endpoint));
    });
    let config_dir = tempfile::tempdir().unwrap();
    server.client_config().save(config_dir.path()).unwrap();
    let laptop = folder(&[]);
    let mut attach = command("monad-client");
    attach
        .arg("attach")
        .arg(laptop.path())
        .args(["--name", "lap"])
        .env("MONAD_CONFIG_DIR", config_dir.path());
    let mut child = attach.spawn().unwrap();
    tokio::select! {
        taken = attach_taken => taken.unwrap(),
        exited = child.wait() => {
            let mut err = String::new();
            use tokio::io::AsyncReadExt;
            let _ = child.stderr.take().unwrap().read_to_string(&mut err).await;
            panic!("attach ended first ({exited:?}): {err}");
        }
        () = tokio::time::sleep(STEP) => {
            let _ = child.start_kill();
            let mut err = String::new();
            use tokio::io::AsyncReadExt;
            let _ = child.stderr.take().unwrap().read_to_string(&mut err).await;
            panic!("the attach never reached the server: {err}");
        }
    }
    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let status = within(
        std::time::Duration::from_secs(5),
        "attach to exit on Ctrl-C",
        child.wait(),
    )
    .await
    .unwrap();
    assert!(status.success(), "{status}");
    rogue.abort();
}

/// Whether a process whose command line holds `marker` runs on this machine.
fn process_with(marker: &str) -> bool {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .any(|entry| {
            std::fs::read(entry.path().join("cmdline"))
                .is_ok_and(|line| String::from_utf8_lossy(&line).contains(marker))
        })
}

/// A shutdown waits for the calls in flight (up to its grace); a second SIGTERM ends it at once,
/// with status 1 (before, it was swallowed: only SIGKILL ended a shutdown that waited).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_ends_a_shutdown_that_waits_for_a_call() {
    let data = tempfile::tempdir().unwrap();
    let mut server =
        ServerProcess::start(data.path(), &[("MONAD_SERVER_SHUTDOWN_GRACE_SECS", "300")]).await;
    let token = server.first_token.clone().expect("a first start");
    let agent = monad_tests::connect_agent(&server.client_config(&token)).await;
    let marker = format!("second-signal-{}", std::process::id());
    // The marker is the shell's `$0`: a shell that runs a lone command in its place (bash)
    // stays here, to wait.
    let argv = json!(["sh", "-c", "sleep 600 & wait", marker]);
    let _call = tokio::spawn(async move {
        agent
            .call(
                None,
                "run_command",
                json!({"argv": argv, "timeout_ms": 600_000}),
                |_| {},
            )
            .await
    });
    within(STEP, "the command to run", async {
        while !process_with(&marker) {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    server.terminate();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert!(server.running(), "the shutdown waits for the call");
    server.terminate();
    let (status, said) = server.exited(std::time::Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(1), "{said}");
    assert!(said.contains("a second signal"), "{said}");
}
