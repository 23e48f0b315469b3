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

/// Regression: the test above once started the server without `--http`, so it bound the default
/// `127.0.0.1:4480` and failed whenever a real server ran on this machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_start_works_while_another_server_holds_the_default_ports() {
    // Taken here when free; when it is not, something else already holds it, which makes the
    // same point.
    let _http = std::net::TcpListener::bind("127.0.0.1:4480");
    let _quic = std::net::UdpSocket::bind("127.0.0.1:4433");
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

    // A write was not pre-approved: exit code 2, the reason in the JSON.
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
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let answer: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(answer["outcome"]["error"]["code"], "denied", "{answer}");
    assert!(
        answer["outcome"]["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("--allow write")),
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
        |l| l.contains("write_file hello.txt (no terminal)"),
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

    // MONAD_TOKEN.
    let dir = tempfile::tempdir().unwrap();
    let out = within(
        STEP,
        "login",
        command("monad-client")
            .args(login)
            .env("MONAD_TOKEN", &server.token)
            .env("MONAD_CONFIG_DIR", dir.path())
            .output(),
    )
    .await
    .unwrap();
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
    // Not logged in either: the name is checked first, and the error lists the tools.
    let out = client(empty.path(), &["call", "read_fil", "--args", "{}"]).await;
    assert!(!out.status.success());
    let error = text(&out.stderr);
    assert!(
        error.contains("read_fil") && error.contains("process_kill"),
        "{error}"
    );
}
