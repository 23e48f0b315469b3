//! `monad-client chat` in a real terminal: the client binary runs in tmux (a real pty) against
//! an in-process server whose `[llm]` talks to the scripted provider; the test types keys and
//! reads the screen (bounded polling of `tmux capture-pane`).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use monad_server::llm::ProviderKind;
use monad_tests::provider::{Reply, ScriptedProvider};
use monad_tests::{STEP, TestServer, binary, folder};
use serde_json::json;

/// A tmux server of its own (`tmux -L NAME`) with one session `chat`; killed when dropped, so a
/// failing test leaves nothing behind.
struct Tmux {
    socket: String,
    /// The socket's file, removed with the server.
    socket_path: Option<std::path::PathBuf>,
}

impl Tmux {
    /// Runs `argv` in a 120x40 terminal; the pane stays after the program exits, so its exit
    /// status can be read.
    fn start(argv: &[String]) -> Tmux {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let socket = format!(
            "monad-chat-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let mut tmux = Tmux {
            socket,
            socket_path: None,
        };
        let mut args: Vec<String> = [
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-x",
            "120",
            "-y",
            "40",
            "-s",
            "chat",
        ]
        .map(String::from)
        .to_vec();
        args.extend(argv.iter().cloned());
        args.extend([";", "set-option", "-t", "chat", "remain-on-exit", "on"].map(String::from));
        tmux.run(&args);
        let path = tmux.run(&["display-message", "-p", "#{socket_path}"].map(String::from));
        tmux.socket_path = Some(path.trim().into());
        tmux
    }

    fn run(&self, args: &[String]) -> String {
        let out = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .env_remove("TMUX")
            .output()
            .expect("tmux runs");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types `text` and Enter.
    fn line(&self, text: &str) {
        self.run(&["send-keys", "-t", "chat", "-l", text].map(String::from));
        self.key("Enter");
    }

    /// Presses a key (`Enter`, `C-c`, `y`).
    fn key(&self, key: &str) {
        self.run(&["send-keys", "-t", "chat", key].map(String::from));
    }

    /// The whole pane, history included, wrapped lines joined.
    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-J", "-S", "-", "-t", "chat"].map(String::from))
    }

    /// Waits (bounded by [`STEP`], polling the screen) until `what` is on it `n` times.
    async fn wait_for_n(&self, what: &str, n: usize) -> String {
        let deadline = tokio::time::Instant::now() + STEP;
        loop {
            let screen = self.screen();
            if screen.matches(what).count() >= n {
                return screen;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what:?} (x{n}) did not appear; the screen:\n{screen}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn wait_for(&self, what: &str) -> String {
        self.wait_for_n(what, 1).await
    }

    /// `Some(status)` once the program exited: `sh` (which runs it, see [`chat_command`])
    /// writes its exit status to `status` (tmux may reap a dead pane's process late, so its
    /// `pane_dead` is not waited on).
    fn exit_status(status: &Path) -> Option<i32> {
        std::fs::read_to_string(status).ok()?.trim().parse().ok()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .arg("kill-server")
            .output();
        if let Some(path) = &self.socket_path {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The command line that runs `monad-client chat` with only the environment it needs (the
/// client config in `config_dir`, a temporary home).
fn chat_command(config_dir: &Path, home: &Path, status: &Path) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        // Ctrl-C goes to the whole foreground group: `sh` must outlive it to write the status
        // (a trapped signal is back to its default in the program it runs).
        "trap true INT; s=\"$1\"; shift; \"$@\"; echo $? > \"$s.tmp\" && mv \"$s.tmp\" \"$s\""
            .into(),
        "sh".into(),
        status.display().to_string(),
        "env".into(),
        "-i".into(),
        format!("PATH={}", std::env::var("PATH").unwrap_or_default()),
        format!("HOME={}", home.display()),
        "TERM=xterm".into(),
        "RUST_LOG=warn".into(),
        format!("MONAD_CONFIG_DIR={}", config_dir.display()),
        binary("monad-client").display().to_string(),
        "chat".into(),
    ]
}

fn tmux_missing() -> bool {
    if Command::new("tmux").arg("-V").output().is_ok() {
        return false;
    }
    monad_tests::peer_missing("chat in tmux", "tmux is not installed");
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_in_a_real_terminal_streams_runs_tools_asks_approvals_and_obeys_its_commands() {
    if tmux_missing() {
        return;
    }
    let provider = ScriptedProvider::start(vec![
        Reply::text(["Hello ", "from the ", "model."]),
        Reply::tool_call(
            "call_read",
            "read_file",
            json!({"path": "a.txt", "workspace": "lap"}),
        ),
        Reply::text(["The file says hi."]),
        Reply::Hang {
            text: vec!["Thinking".into()],
        },
        Reply::text(["Back again."]),
    ])
    .await;
    let toml = provider.llm_config(ProviderKind::Openai, "");
    let server = TestServer::start_with(|config| {
        std::fs::write(config.data_dir.join("config.toml"), toml).expect("config.toml written");
    })
    .await;
    let config_dir = tempfile::tempdir().unwrap();
    server.client_config().save(config_dir.path()).unwrap();
    // The chat's home holds the folder it attaches, reached through a symbolic link.
    let home = folder(&[("lap/a.txt", "hi from the laptop\n")]);
    let link = home.path().join("link");
    std::os::unix::fs::symlink("lap", &link).unwrap();
    let session_md = server.data_dir().join("sessions/default/session.md");

    let status_file = home.path().join("status");
    let tmux = Tmux::start(&chat_command(config_dir.path(), home.path(), &status_file));
    tmux.wait_for("chat with the agent of session default")
        .await;

    // Streamed text.
    tmux.line("hello");
    tmux.wait_for("Hello from the model.").await;

    // A restricted folder attached from the chat: its approval prompt appears here and is
    // answered with a key; the tool call's line and outcome follow.
    // Typed as a person types it: `~` is the home directory, as a shell would make it.
    tmux.line("/attach ~/link");
    tmux.wait_for("(restricted: approve its actions here)")
        .await;
    tmux.line("read a.txt");
    tmux.wait_for("approval needed").await;
    tmux.wait_for("answer within").await;
    tmux.key("y");
    tmux.wait_for("allowed once").await;
    // The transcript's line for the call: above the question when it came first, else after
    // the answer (never drawn under the question).
    tmux.wait_for("⚙ read_file [lap] a.txt").await;
    tmux.wait_for("✓ read_file in `lap`: ok (").await;
    let screen = tmux.wait_for("The file says hi.").await;
    // The transcript shows the call once: not again in the folder's own start and end lines.
    assert!(!screen.contains("▶ read_file"), "{screen}");
    assert!(!screen.contains("✓ read_file a.txt"), "{screen}");

    // Between turns, a call from another agent: the folder's prompt shows here; once it is
    // answered, the folder's lines say what ran and the input line's `> ` is back.
    let outsider = server.agent().await;
    let outside = tokio::spawn(async move {
        outsider
            .call(
                Some("default"),
                "read_file",
                json!({"path": "a.txt", "workspace": "lap"}),
                |_| {},
            )
            .await
    });
    tmux.wait_for_n("approval needed", 2).await;
    tmux.wait_for_n("answer within", 2).await;
    // While the question is up, a call that cannot run is refused at once, with a line of the
    // folder's: it waits for the answer. Drawn under the question, it was followed by the
    // input line's `> `, and the owner's next message answered the question.
    let refused = server.agent().await;
    let bad = json!({"path": "missing-dir/", "workspace": "lap", "offset": 0});
    let reply = refused
        .call(Some("default"), "read_file", bad, |_| {})
        .await
        .expect("the refused call is answered");
    assert!(
        matches!(reply.outcome, monad_protocol::wire::Outcome::Error { .. }),
        "{reply:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let screen = tmux.screen();
    let last = screen.lines().rev().find(|l| !l.trim().is_empty());
    assert!(
        last.is_some_and(|l| l.contains("answer within")),
        "a line was drawn under the question:\n{screen}"
    );
    tmux.key("y");
    tmux.wait_for("✓ read_file a.txt: ok").await;
    tmux.wait_for("✗ read_file").await;
    let reply = monad_tests::within(STEP, "the outside call", outside)
        .await
        .unwrap()
        .expect("the outside call is answered");
    assert!(
        matches!(reply.outcome, monad_protocol::wire::Outcome::Ok { .. }),
        "{reply:?}"
    );
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let screen = tmux.screen();
        let last = screen.lines().rev().find(|l| !l.trim().is_empty());
        if last.map(str::trim_end) == Some(">") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the input line did not come back:\n{screen}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // /workspace and /context ask the server.
    tmux.line("/workspace");
    let screen = tmux.wait_for("workspaces\n").await;
    let screen = if screen.contains("  lap  ") {
        screen
    } else {
        tmux.wait_for("  lap  ").await
    };
    // The folder's identity and URI are the folder itself, from the home directory, as
    // `monad-client attach` gives them: not the words typed.
    // (In columns: the URI padded to the longest one.)
    assert!(
        screen.lines().any(|l| l.trim_start().starts_with("lap ")
            && l.contains(":~/lap ")
            && l.trim_end().ends_with("(attached, restricted, no network)")),
        "{screen}"
    );
    assert!(screen.contains("session   default"), "{screen}");
    assert!(screen.contains("provider  openai"), "{screen}");
    assert!(screen.contains("model     scripted-model"), "{screen}");
    assert!(screen.contains("messages  4"), "{screen}");
    assert!(
        screen.contains("primary  server:/sessions/default"),
        "{screen}"
    );
    tmux.line("/context");
    tmux.wait_for("context: 4 messages in the context window (of 4 in the conversation)")
        .await;

    // Ctrl-C during a turn cancels it and comes back to the input line.
    tmux.line("take your time");
    tmux.wait_for("Thinking").await;
    tmux.key("C-c");
    tmux.wait_for("(cancelled)").await;
    provider.wait_for_abandoned(1).await;
    tmux.line("still there?");
    tmux.wait_for("Back again.").await;

    // /clear: session.md back to its frontmatter.
    assert!(
        std::fs::read_to_string(&session_md)
            .unwrap()
            .contains("## User")
    );
    tmux.line("/clear");
    tmux.wait_for("conversation cleared").await;
    let text = std::fs::read_to_string(&session_md).unwrap();
    assert!(
        !text.contains("## "),
        "only the frontmatter is left: {text}"
    );
    assert!(
        text.starts_with("---\n") && text.contains("model: scripted-model"),
        "{text}"
    );

    tmux.line("/help");
    tmux.wait_for("/attach DIR").await;
    tmux.line("/nonsense");
    tmux.wait_for("unknown command /nonsense").await;

    // /quit: exit status 0, and the folder attached from the chat is detached: gone from the
    // session, not left there offline.
    tmux.line("/quit");
    tmux.wait_for("detached `lap`").await;
    let deadline = tokio::time::Instant::now() + STEP;
    let status = loop {
        if let Some(status) = Tmux::exit_status(&status_file) {
            break status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "chat did not exit: {}",
            tmux.screen()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status, 0, "{}", tmux.screen());
    let agent = server.agent().await;
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let (_, workspaces) = agent.workspaces(Some("default")).await.unwrap();
        if workspaces.iter().all(|w| w.name != "lap") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the folder stayed in the session: {workspaces:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_switches_to_a_new_session_that_the_next_chat_resumes_and_quits_on_ctrl_d_and_ctrl_c()
{
    if tmux_missing() {
        return;
    }
    let server = TestServer::start().await;
    let config_dir = tempfile::tempdir().unwrap();
    server.client_config().save(config_dir.path()).unwrap();
    let home = tempfile::tempdir().unwrap();
    // The first chat starts in the default session and switches to a new one; the device is
    // bound to it, so the second chat starts there.
    let mut expected = "default".to_owned();
    for key in ["C-d", "C-c"] {
        let status_file = home.path().join(format!("status-{key}"));
        let tmux = Tmux::start(&chat_command(config_dir.path(), home.path(), &status_file));
        tmux.wait_for(&format!("chat with the agent of session {expected} "))
            .await;
        tmux.line("/session");
        tmux.wait_for(&format!("session {expected}\n")).await;
        tmux.line("/session new");
        let screen = tmux.wait_for("now in session ").await;
        expected = screen
            .split("now in session ")
            .nth(1)
            .and_then(|rest| rest.lines().next())
            .unwrap()
            .trim()
            .to_owned();
        assert_eq!(expected.len(), 36, "a fresh UUID: {screen}");
        tmux.key(key);
        let deadline = tokio::time::Instant::now() + STEP;
        let status = loop {
            if let Some(status) = Tmux::exit_status(&status_file) {
                break status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{key}: chat did not exit: {}",
                tmux.screen()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(status, 0, "{key}: {}", tmux.screen());
    }
}
