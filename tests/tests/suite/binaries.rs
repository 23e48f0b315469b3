//! The real binaries, as a user runs them (DESIGN.md, "Command lines"): first start, login,
//! attach, call.

use std::path::Path;
use std::process::Output;

use monad_tests::{STEP, command, folder, wait_for_line, within};
use serde_json::Value;
use tokio::io::AsyncBufReadExt;

/// Runs `monad-client` with `args` and the config in `config_dir`, to completion (bounded).
async fn client(config_dir: &Path, args: &[&str]) -> Output {
    let output = command("monad-client")
        .args(args)
        .env("MONAD_CONFIG_DIR", config_dir)
        .output();
    within(STEP, &format!("`monad-client {}`", args.join(" ")), output)
        .await
        .expect("monad-client runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_start_login_attach_and_call_work_from_the_command_line() {
    first_start_login_attach_and_call().await;
}

/// The README's path: first start, the printed login line pasted as is, attach, call.
async fn first_start_login_attach_and_call() {
    let data = tempfile::tempdir().unwrap();
    let config_dir = tempfile::tempdir().unwrap();
    let laptop = folder(&[("hello.txt", "hello from the laptop\n")]);

    let mut server = command("monad-server")
        .arg("--data-dir")
        .arg(data.path())
        .args(["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"])
        .spawn()
        .expect("monad-server starts");
    let mut stdout = tokio::io::BufReader::new(server.stdout.take().unwrap()).lines();
    // Regression: this test once started the server without `--http`, so it bound the default
    // HTTP port and failed whenever a real server ran on this machine: both listeners are on
    // ports of their own (`127.0.0.1:0` above), never the defaults.
    let login = wait_for_line(&mut stdout, STEP, "the login line", |l| {
        l.starts_with("MONAD_TOKEN=")
    })
    .await;
    // `MONAD_TOKEN=mnd_… monad-client login --server … --fingerprint …`: the token is not in
    // the client's argv.
    let words: Vec<&str> = login.split_whitespace().collect();
    let token = words[0].strip_prefix("MONAD_TOKEN=").unwrap().to_owned();
    assert!(token.starts_with("mnd_"), "{login}");
    assert!(!words.contains(&"--token"), "{login}");
    assert_eq!(words[1..3], ["monad-client", "login"], "{login}");
    let flag = |name: &str| {
        let at = words.iter().position(|w| *w == name);
        at.and_then(|i| words.get(i + 1))
            .copied()
            .unwrap_or_else(|| panic!("no {name} in `{login}`"))
    };
    let (addr, fingerprint) = (flag("--server"), flag("--fingerprint"));
    assert!(!addr.ends_with(":0"), "the real port is printed: {login}");
    assert_ne!(
        addr,
        monad_server::config::DEFAULT_LISTEN,
        "not the default port: {login}"
    );
    assert_eq!(fingerprint.len(), 64, "{login}");

    // The line pastes as is.
    let out = within(
        STEP,
        "login",
        command("monad-client")
            .args(&words[2..])
            .env("MONAD_TOKEN", &token)
            .env("MONAD_CONFIG_DIR", config_dir.path())
            .output(),
    )
    .await
    .unwrap();
    assert!(out.status.success(), "login failed: {}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("as admin"),
        "{}",
        text(&out.stderr)
    );
    assert!(config_dir.path().join("config.toml").is_file());

    let mut attach = command("monad-client")
        .arg("attach")
        .arg(laptop.path())
        .args(["--name", "laptop", "--non-interactive", "--allow", "read"])
        .env("MONAD_CONFIG_DIR", config_dir.path())
        .spawn()
        .expect("monad-client attach starts");
    let mut attach_err = tokio::io::BufReader::new(attach.stderr.take().unwrap()).lines();
    let attached = wait_for_line(&mut attach_err, STEP, "the attach confirmation", |l| {
        l.starts_with("attached ")
    })
    .await;
    assert!(attached.contains("`laptop`"), "{attached}");

    let out = client(
        config_dir.path(),
        &[
            "call",
            "read_file",
            "--args",
            r#"{"path": "hello.txt"}"#,
            "--json",
        ],
    )
    .await;
    assert!(out.status.success(), "call failed: {}", text(&out.stderr));
    let answer: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("--json output is JSON ({e}): {}", text(&out.stdout)));
    assert_eq!(answer["outcome"]["status"], "ok", "{answer}");
    assert_eq!(
        answer["outcome"]["result"]["content"],
        "hello from the laptop\n"
    );
    assert_eq!(answer["workspace"]["name"], "laptop", "{answer}");
    // The owner sees what ran without a prompt, and why.
    wait_for_line(&mut attach_err, STEP, "the read's event line", |l| {
        l.contains("read_file hello.txt (pre-approved: read)")
    })
    .await;
    assert!(
        answer["workspace"]["uri"]
            .as_str()
            .is_some_and(|u| u.ends_with(&*laptop.path().to_string_lossy())),
        "{answer}"
    );

    // A write was not pre-approved: a tool error (exit code 1), the reason in the JSON.
    let out = client(
        config_dir.path(),
        &[
            "call",
            "write_file",
            "--args",
            r#"{"path": "hello.txt", "content": "x"}"#,
            "--workspace",
            "laptop",
            "--json",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let answer: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(answer["outcome"]["error"]["code"], "denied", "{answer}");
    assert!(
        answer["outcome"]["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(&format!(
                "attaching again with `monad-client attach {} --name laptop --allow read \
                 --allow write --non-interactive`",
                laptop.path().display()
            ))),
        "the attach line to run keeps the flags it was attached with: {answer}"
    );
    // Denied because the user chose never to be asked, and said so: not "no terminal".
    assert!(
        answer["outcome"]["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("attached it with --non-interactive")),
        "{answer}"
    );
    assert_eq!(
        std::fs::read_to_string(laptop.path().join("hello.txt")).unwrap(),
        "hello from the laptop\n"
    );
    wait_for_line(
        &mut attach_err,
        STEP,
        "the refused write's event line",
        |l| l.contains("write_file hello.txt (--non-interactive)"),
    )
    .await;

    let out = client(config_dir.path(), &["sessions", "--json"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let sessions: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(sessions[0]["id"], "default", "{sessions}");
    assert_eq!(sessions[0]["workspaces"][1]["name"], "laptop", "{sessions}");

    // A config-less client says how to log in, in one line, with a failing exit code.
    let empty = tempfile::tempdir().unwrap();
    let out = client(empty.path(), &["sessions"]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("monad-client login"),
        "{}",
        text(&out.stderr)
    );

    // The children are killed when their handles drop (`kill_on_drop`).
    drop(attach);
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_takes_the_token_from_the_environment_standard_input_a_terminal_or_the_flag() {
    use tokio::io::AsyncWriteExt;
    let server = monad_tests::TestServer::start().await;
    let addr = server.addr.to_string();
    let login = [
        "login",
        "--server",
        &addr,
        "--fingerprint",
        &server.fingerprint,
    ];
    let saved_token = |dir: &Path| {
        let text = std::fs::read_to_string(dir.join("config.toml")).expect("config saved");
        let config: toml::Table = toml::from_str(&text).unwrap();
        config["token"].as_str().unwrap().to_owned()
    };

    // `login` with the token in MONAD_TOKEN and its config in `dir`.
    let login_in = async |dir: &Path| {
        within(
            STEP,
            "login",
            command("monad-client")
                .args(login)
                .env("MONAD_TOKEN", &server.token)
                .env("MONAD_CONFIG_DIR", dir)
                .output(),
        )
        .await
        .unwrap()
    };

    // MONAD_TOKEN.
    let dir = tempfile::tempdir().unwrap();
    let out = login_in(dir.path()).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(saved_token(dir.path()), server.token);

    // The first line of standard input.
    let dir = tempfile::tempdir().unwrap();
    let mut child = command("monad-client")
        .args(login)
        .env("MONAD_CONFIG_DIR", dir.path())
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(format!("{}\nignored\n", server.token).as_bytes())
        .await
        .unwrap();
    drop(stdin);
    let out = within(STEP, "login", child.wait_with_output())
        .await
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(saved_token(dir.path()), server.token);

    // A config that cannot be read is not replaced (its device id and settings would go).
    let dir = tempfile::tempdir().unwrap();
    let broken = "device_id = \"x\"\n[limits]\nread_max_bytes = 0\n";
    std::fs::write(dir.path().join("config.toml"), broken).unwrap();
    let out = login_in(dir.path()).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("move it aside"),
        "{}",
        text(&out.stderr)
    );
    // On one line, not with its line breaks shown as escapes.
    assert!(
        !text(&out.stderr).contains("\\u{a}"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("config.toml")).unwrap(),
        broken
    );

    // A device id the server would refuse is made again by login (the server's refusal says
    // `login` makes one), the settings kept.
    let dir = tempfile::tempdir().unwrap();
    let odd = format!(
        "server = \"10.0.0.2:7000\"\ntoken = \"\"\nfingerprint = \"{}\"\ndevice_id = \"nope\"\n\
         client_name = \"laptop\"\n[limits]\nread_max_bytes = 4096\n",
        "ab".repeat(32)
    );
    std::fs::write(dir.path().join("config.toml"), odd).unwrap();
    let out = login_in(dir.path()).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("new one"),
        "{}",
        text(&out.stderr)
    );
    let saved = monad_client::config::ClientConfig::load(dir.path()).unwrap();
    assert!(monad_client::config::check_device_id(&saved.device_id).is_ok());
    assert_eq!(saved.limits.map(|l| l.read_max_bytes), Some(4096));

    // `--token`, still accepted.
    let dir = tempfile::tempdir().unwrap();
    let out = client(
        dir.path(),
        &[&login[..], &["--token", &server.token]].concat(),
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(saved_token(dir.path()), server.token);

    // A terminal: asked for without echo.
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = command("monad-client");
    cmd.args(login).env("MONAD_CONFIG_DIR", dir.path());
    let mut pty = monad_tests::Pty::spawn(cmd);
    let at = pty.wait_for("token", 0).await;
    pty.send(format!("{}\n", server.token).as_bytes());
    pty.wait_for("logged in", at).await;
    assert!(
        !pty.text().contains(&server.token),
        "echoed: {}",
        pty.text()
    );
    assert_eq!(saved_token(dir.path()), server.token);

    // None at all: one clear line, nothing saved.
    let dir = tempfile::tempdir().unwrap();
    let out = client(dir.path(), &login).await;
    assert!(!out.status.success());
    let said = text(&out.stderr);
    assert_eq!(said.trim_end().lines().count(), 1, "{said}");
    assert!(
        said.contains("MONAD_TOKEN") && said.contains("--token"),
        "{said}"
    );
    assert!(!dir.path().join("config.toml").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_help_lists_every_tool_and_an_unknown_tool_is_refused_before_connecting() {
    let empty = tempfile::tempdir().unwrap();
    let out = client(empty.path(), &["call", "--help"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let help = text(&out.stdout);
    for tool in monad_protocol::ToolName::ALL {
        assert!(help.contains(tool.as_str()), "{tool} missing from:\n{help}");
    }
    assert!(
        help.contains("Usage: monad-client call [OPTIONS] [TOOL]"),
        "{help}"
    );
    // Not logged in either: the name is checked first, and the error lists the tools.
    let out = client(empty.path(), &["call", "read_fil", "--args", "{}"]).await;
    assert!(!out.status.success());
    let error = text(&out.stderr);
    assert!(
        error.contains("read_fil") && error.contains("process_kill"),
        "{error}"
    );
}

/// The command lists of `--help` give each command one short line on a terminal of 100
/// columns (its details are in the command's own `--help`), and help is wrapped to the terminal's width (`COLUMNS` when it is
/// not a terminal), not left as lines of any length. Both programs, every list of commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn help_lists_each_command_on_one_short_line_and_wraps_to_the_terminal() {
    let empty = tempfile::tempdir().unwrap();
    let help = async |program: &str, args: &[&str], columns: usize| {
        let output = command(program)
            .args(args)
            .env("MONAD_CONFIG_DIR", empty.path())
            .env("MONAD_DATA_DIR", empty.path())
            .env("COLUMNS", columns.to_string())
            .output();
        let what = format!("`{program} {}`", args.join(" "));
        let out = within(STEP, &what, output).await.expect("it runs");
        assert!(out.status.success(), "{what}: {}", text(&out.stderr));
        let help = text(&out.stdout);
        for line in help.lines() {
            assert!(
                line.chars().count() <= columns,
                "{what}: {line:?} in:\n{help}"
            );
        }
        help
    };
    let lists = [
        ("monad-client", &["--help"][..]),
        ("monad-client", &["history", "--help"]),
        ("monad-server", &["--help"]),
        ("monad-server", &["token", "--help"]),
        ("monad-server", &["session", "--help"]),
        ("monad-server", &["workspace", "--help"]),
    ];
    for (program, args) in lists {
        // One line each on a terminal of 100 columns.
        let out = help(program, args, 100).await;
        let commands: Vec<&str> = out
            .lines()
            .skip_while(|l| *l != "Commands:")
            .skip(1)
            .take_while(|l| !l.is_empty())
            .collect();
        assert!(commands.len() >= 3, "{out}");
        for line in &commands {
            // `  name  summary`: a line each (the summary not wrapped onto a next line, which
            // would start with spaces only), no sentence after the first.
            assert!(
                line.starts_with("  ") && !line.starts_with("   "),
                "{line:?}"
            );
            assert!(!line.trim_end_matches('.').contains(". "), "{line:?}");
        }
    }
    for (program, args) in lists {
        help(program, args, 60).await;
    }
    for args in [&["attach", "--help"][..], &["call", "--help"]] {
        help("monad-client", args, 60).await;
    }
    // The details are still there, in the command's own help.
    let call = help("monad-client", &["call", "--help"], 100).await;
    assert!(call.contains("Exit codes"), "{call}");
    let delete = help("monad-server", &["session", "delete", "--help"], 100).await;
    assert!(delete.contains("running server"), "{delete}");
}

/// Regression: errors of `call`'s own checks were built from the top-level command, so they
/// showed `Usage: monad-client <COMMAND>` instead of how `call` is used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_usage_errors_show_how_call_is_used() {
    let empty = tempfile::tempdir().unwrap();
    for args in [
        &["call", "read_file", "--args", "not json"][..],
        &["call", "read_file", "--args", "[1]"],
        &["call", "--args", "{}"],
        // Two workspaces named: one was silently dropped.
        &[
            "call",
            "read_file",
            "--args",
            r#"{"path": "a", "workspace": "proj"}"#,
            "--workspace",
            "primary",
        ],
    ] {
        let out = client(empty.path(), args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: a usage error");
        let error = text(&out.stderr);
        assert!(
            error.contains("Usage: monad-client call") && !error.contains("<COMMAND>"),
            "{args:?}: {error}"
        );
    }
}

/// Regression: an empty `MONAD_CONFIG_DIR` meant the current directory, so `login` wrote its
/// token to `./config.toml`. Empty is unset: the platform's config directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_monad_config_dir_is_unset_not_the_current_directory() {
    let server = monad_tests::TestServer::start().await;
    let addr = server.addr.to_string();
    let mut login = command("monad-client");
    login
        .args([
            "login",
            "--server",
            &addr,
            "--fingerprint",
            &server.fingerprint,
        ])
        .env("MONAD_TOKEN", &server.token)
        .env("MONAD_CONFIG_DIR", "");
    let out = leaves_the_current_directory_alone(login, "login").await;
    let said = text(&out.stderr);
    assert!(said.contains("/monad/config.toml"), "{said}");
}

/// The same for the server's `MONAD_DATA_DIR`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_monad_data_dir_is_unset_not_the_current_directory() {
    let platform = tempfile::tempdir().unwrap();
    let mut create = command("monad-server");
    create
        .args(["token", "create"])
        .env("MONAD_DATA_DIR", "")
        .env("XDG_DATA_HOME", platform.path());
    leaves_the_current_directory_alone(create, "token create").await;
    assert!(
        platform.path().join("monad").is_dir(),
        "the platform's data dir is used"
    );
}

/// A settings file that is a FIFO (or a device, or too large) is an error naming it, at once:
/// the server's start and its commands read `config.toml` to its end, and a FIFO there held
/// them for ever (a link to `/dev/zero`, until memory ran out); so did the client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settings_file_that_is_a_fifo_is_an_error_not_a_wait() {
    let fifo = |path: &Path| {
        nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    };
    let data = tempfile::tempdir().unwrap();
    fifo(&data.path().join("config.toml"));
    let free = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let listen = free.local_addr().unwrap().to_string();
    drop(free);
    for args in [
        &["serve", "--listen", &listen, "--no-http"][..],
        &["session", "list"],
        &["token", "list"],
    ] {
        let mut cmd = command("monad-server");
        cmd.arg("--data-dir").arg(data.path()).args(args);
        let out = within(
            STEP,
            "monad-server with a FIFO for config.toml",
            cmd.output(),
        )
        .await
        .unwrap();
        let said = text(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {said}");
        assert!(
            said.contains("config.toml") && said.contains("not a regular file"),
            "{args:?}: {said}"
        );
    }
    // A link to a device (/dev/zero read until memory ran out): named, nothing read.
    std::fs::remove_file(data.path().join("config.toml")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", data.path().join("config.toml")).unwrap();
    let mut cmd = command("monad-server");
    cmd.arg("--data-dir")
        .arg(data.path())
        .args(["session", "list"]);
    let out = within(
        STEP,
        "monad-server with /dev/zero for config.toml",
        cmd.output(),
    )
    .await
    .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not a regular file"),
        "{}",
        text(&out.stderr)
    );

    let config = tempfile::tempdir().unwrap();
    fifo(&config.path().join("config.toml"));
    let out = client(config.path(), &["status"]).await;
    let said = text(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("not a regular file"), "{said}");
}

/// Runs `cmd` in an empty directory: it succeeds and makes nothing there.
async fn leaves_the_current_directory_alone(
    mut cmd: tokio::process::Command,
    what: &str,
) -> Output {
    let here = tempfile::tempdir().unwrap();
    let out = within(STEP, what, cmd.current_dir(here.path()).output())
        .await
        .unwrap();
    assert!(out.status.success(), "{what}: {}", text(&out.stderr));
    assert!(
        std::fs::read_dir(here.path()).unwrap().next().is_none(),
        "{what}: nothing made in the current directory"
    );
    out
}

/// A logged-in client config for `server`, in a temporary directory.
fn logged_in(server: &monad_tests::TestServer) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    server.client_config().save(dir.path()).expect("config");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_prints_the_models_text_and_its_exit_code_says_how_the_call_went() {
    let server = monad_tests::TestServer::start().await;
    let config = logged_in(&server);
    let dir = config.path();
    let call = |tool: &'static str, args: &'static str| {
        let dir = dir.to_owned();
        async move { client(&dir, &["call", tool, "--args", args]).await }
    };

    let out = call(
        "write_file",
        r#"{"path": "a.txt", "content": "one\ntwo\n"}"#,
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout) == "Created a.txt in workspace primary (8 bytes).\n",
        "{}",
        text(&out.stdout)
    );
    let out = call("read_file", r#"{"path": "a.txt"}"#).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "a.txt in workspace primary: lines 1-2 of 2\n1\tone\n2\ttwo\n"
    );

    // A tool error: 1, the error on stderr, nothing on stdout.
    let out = call("read_file", r#"{"path": "no/such.txt"}"#).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "");
    assert!(
        text(&out.stderr).starts_with("monad-client: not_found: "),
        "{}",
        text(&out.stderr)
    );

    // A command that fails or times out: 3, with its status and output.
    let out = call(
        "run_command",
        r#"{"argv": ["sh", "-c", "echo out; echo err >&2; exit 4"]}"#,
    )
    .await;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(
        shown.starts_with("exit status 4 in workspace primary, after "),
        "{shown}"
    );
    assert!(
        shown.ends_with("\n--- stdout\nout\n--- stderr\nerr\n"),
        "{shown}"
    );
    let out = call(
        "run_command",
        r#"{"argv": ["sleep", "30"], "timeout_ms": 300}"#,
    )
    .await;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("timed out and was killed"),
        "{}",
        text(&out.stdout)
    );
    let out = call("run_command", r#"{"argv": ["true"]}"#).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    // `--json` keeps its shape and the same exit codes.
    let out = client(
        dir,
        &[
            "call",
            "run_command",
            "--args",
            r#"{"argv": ["false"]}"#,
            "--json",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let answer: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(answer["outcome"]["status"], "ok", "{answer}");
    assert_eq!(answer["outcome"]["result"]["exit_code"], 1, "{answer}");
    assert_eq!(answer["workspace"]["name"], "primary", "{answer}");

    // Usage errors are clap's 2, before connecting.
    let empty = tempfile::tempdir().unwrap();
    for args in [
        &["call", "read_file", "--args", "[1]"][..],
        &["call", "read_file", "--args", "{nope"],
        &["call"],
        &["call", "read_fil"],
        &["call", "read_file", "--bogus"],
    ] {
        let out = client(empty.path(), args).await;
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(text(&out.stderr).contains("error:"), "{args:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tools_arguments_are_shown_from_its_schema() {
    let empty = tempfile::tempdir().unwrap();
    let out = client(empty.path(), &["call", "run_command", "--help"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let help = text(&out.stdout);
    assert!(help.starts_with("run_command (exec tool)\n"), "{help}");
    for argument in [
        "\n  argv: list of string, required\n",
        "\n  timeout_ms: integer, optional\n",
        "\n  background: boolean, optional\n",
        "\n  workspace: string, optional\n",
    ] {
        assert!(
            help.contains(argument),
            "{argument:?} missing from:\n{help}"
        );
    }
    let out = client(empty.path(), &["tools", "run_command"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        help,
        "`tools TOOL` is `call TOOL --help`"
    );

    let out = client(empty.path(), &["tools"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let list = text(&out.stdout);
    for tool in monad_protocol::ToolName::ALL {
        assert!(
            list.lines().any(|l| l.starts_with(&format!("{tool} "))),
            "{tool} missing from:\n{list}"
        );
    }
    let out = client(empty.path(), &["tools", "--json"]).await;
    let tools: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(tools[0]["name"], "read_file");
    assert_eq!(tools[0]["input_schema"]["required"][0], "path");
    assert!(tools[0]["output_schema"]["properties"]["result"].is_object());
}

/// Runs `program args` with standard output and error going to pipes nobody reads any more (the
/// reader went away, as in `| head -1`), and returns its exit status.
async fn with_closed_pipes(
    program: &str,
    config_dir: Option<&Path>,
    args: &[&str],
) -> std::process::ExitStatus {
    let mut cmd = command(program);
    cmd.args(args);
    if let Some(dir) = config_dir {
        cmd.env("MONAD_CONFIG_DIR", dir);
    }
    // Pipes whose reading ends are closed before the program starts: its first write fails.
    let (reader, out) = std::io::pipe().expect("a pipe");
    drop(reader);
    let (reader, err) = std::io::pipe().expect("a pipe");
    drop(reader);
    cmd.stdout(out).stderr(err);
    let mut child = cmd.spawn().expect("starts");
    within(
        STEP,
        &format!("`{program} {}`", args.join(" ")),
        child.wait(),
    )
    .await
    .expect("exits")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_pipe_ends_the_output_without_a_panic() {
    let server = monad_tests::TestServer::start().await;
    let config = logged_in(&server);
    let dir = Some(config.path());
    let files: Vec<(String, &str)> = (0..300).map(|i| (format!("f{i:03}.txt"), "x")).collect();
    let files: Vec<(&str, &str)> = files.iter().map(|(n, c)| (n.as_str(), *c)).collect();
    let laptop = folder(&files);
    let mut options = monad_tests::attach_options(laptop.path(), "laptop");
    options.allow = vec![monad_protocol::ToolClass::Read];
    let _attached = monad_tests::Attachment::start(&server.client_config(), options, None).await;

    // A panic exits with 101; each of these ends with its own code instead.
    for (args, code) in [
        (&["call", "list_dir", "--workspace", "laptop"][..], 0),
        (&["call", "list_dir", "--workspace", "laptop", "--json"], 0),
        (&["call", "read_file", "--args", r#"{"path": "nope"}"#], 1),
        (&["sessions"], 0),
        (&["tools"], 0),
        (&["call", "read_file", "--help"], 0),
        (&["--help"], 0),
    ] {
        let status = with_closed_pipes("monad-client", dir, args).await;
        assert_eq!(status.code(), Some(code), "monad-client {args:?}");
    }
    let data = tempfile::tempdir().unwrap();
    let data = data.path().to_string_lossy().into_owned();
    for args in [
        &["--data-dir", &data, "token", "create"][..],
        &["--data-dir", &data, "token", "list"],
        &["--data-dir", &data, "session", "list"],
        &["--help"],
    ] {
        let status = with_closed_pipes("monad-server", None, args).await;
        assert_eq!(status.code(), Some(0), "monad-server {args:?}");
    }
}

/// A folder attached by a user who is not root: a `write_file` that replaces a file keeps its
/// group when the user is in it (the new file took the user's own group, and the others of
/// the file's group lost what its mode gave them). As uid 4242 in groups 4242 and 4343, through
/// `setpriv`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_by_a_user_who_is_not_root_keeps_the_files_group() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let (uid, own_group, shared_group) = (4242u32, 4242u32, 4343u32);
    let server = monad_tests::TestServer::start().await;
    let outer = tempfile::tempdir().unwrap();
    std::fs::set_permissions(outer.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let laptop = outer.path().join("project");
    std::fs::create_dir(&laptop).unwrap();
    std::fs::write(laptop.join("shared.txt"), "old\n").unwrap();
    std::os::unix::fs::chown(&laptop, Some(uid), Some(shared_group)).unwrap();
    std::fs::set_permissions(&laptop, std::fs::Permissions::from_mode(0o775)).unwrap();
    std::os::unix::fs::chown(laptop.join("shared.txt"), Some(uid), Some(shared_group)).unwrap();
    std::fs::set_permissions(
        laptop.join("shared.txt"),
        std::fs::Permissions::from_mode(0o664),
    )
    .unwrap();
    let config = outer.path().join("config");
    std::fs::create_dir(&config).unwrap();
    server.client_config().save(&config).expect("config");
    for entry in [config.clone(), config.join("config.toml")] {
        std::os::unix::fs::chown(&entry, Some(uid), Some(own_group)).unwrap();
    }
    let mut attach = tokio::process::Command::new("setpriv")
        .args([
            format!("--reuid={uid}"),
            format!("--regid={own_group}"),
            format!("--groups={own_group},{shared_group}"),
        ])
        .arg(monad_tests::binary("monad-client"))
        .arg("attach")
        .arg(&laptop)
        .args(["--name", "laptop", "--non-interactive", "--allow", "write"])
        .env("MONAD_CONFIG_DIR", &config)
        .env("HOME", outer.path())
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("setpriv starts monad-client attach");
    let mut attach_err = tokio::io::BufReader::new(attach.stderr.take().unwrap()).lines();
    wait_for_line(&mut attach_err, STEP, "the attach confirmation", |l| {
        l.starts_with("attached ")
    })
    .await;
    let agent = server.agent().await;
    let reply = monad_tests::call(
        &agent,
        "write_file",
        serde_json::json!({"path": "shared.txt", "content": "new\n", "workspace": "laptop"}),
    )
    .await;
    assert!(
        matches!(reply.outcome, monad_protocol::wire::Outcome::Ok { .. }),
        "{reply:?}"
    );
    let meta = std::fs::metadata(laptop.join("shared.txt")).unwrap();
    assert_eq!(
        std::fs::read_to_string(laptop.join("shared.txt")).unwrap(),
        "new\n"
    );
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o777),
        (uid, shared_group, 0o664),
        "the file's owner, group and mode after the write"
    );
    // A new file takes the group the system gives it (here the user's own), as any program's.
    let reply = monad_tests::call(
        &agent,
        "write_file",
        serde_json::json!({"path": "fresh.txt", "content": "x", "workspace": "laptop"}),
    )
    .await;
    assert!(
        matches!(reply.outcome, monad_protocol::wire::Outcome::Ok { .. }),
        "{reply:?}"
    );
    assert_eq!(
        std::fs::metadata(laptop.join("fresh.txt")).unwrap().gid(),
        own_group
    );
    drop(attach);
}
