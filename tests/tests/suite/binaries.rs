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
    let data = tempfile::tempdir().unwrap();
    let config_dir = tempfile::tempdir().unwrap();
    let laptop = folder(&[("hello.txt", "hello from the laptop\n")]);

    let mut server = command("monad-server")
        .arg("--data-dir")
        .arg(data.path())
        .args(["--listen", "127.0.0.1:0"])
        .spawn()
        .expect("monad-server starts");
    let mut stdout = tokio::io::BufReader::new(server.stdout.take().unwrap()).lines();
    let login = wait_for_line(&mut stdout, STEP, "the login line", |l| {
        l.starts_with("monad-client login ")
    })
    .await;
    let words: Vec<&str> = login.split_whitespace().collect();
    let flag = |name: &str| {
        let at = words.iter().position(|w| *w == name);
        at.and_then(|i| words.get(i + 1))
            .copied()
            .unwrap_or_else(|| panic!("no {name} in `{login}`"))
    };
    let (addr, fingerprint) = (flag("--server"), flag("--fingerprint"));
    assert!(flag("--token").starts_with("mnd_"), "{login}");
    assert!(!addr.ends_with(":0"), "the real port is printed: {login}");
    assert_eq!(fingerprint.len(), 64, "{login}");

    // The line pastes as is.
    let out = client(config_dir.path(), &words[1..]).await;
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
