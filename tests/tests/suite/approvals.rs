//! Approvals in a restricted workspace, enforced by the client (DESIGN.md, "The jail" and
//! "Security model"): a scripted user answers, or nobody does.

use std::sync::Arc;
use std::time::Duration;

use monad_client::approval::{Approver, Decision, ScriptedApprover};
use monad_protocol::wire::Trust;
use monad_protocol::{ErrorCode, ToolClass, ToolName};
use monad_tests::{
    Attachment, STEP, TestServer, attach_options, call, expect_code, folder, ok, within,
};
use serde_json::json;
use tempfile::TempDir;

/// A server, an agent and a folder attached as `lap` whose user answers from `script`.
async fn scripted(
    script: impl IntoIterator<Item = Option<Decision>>,
    files: &[(&str, &str)],
) -> (
    TestServer,
    monad_client::agent::Agent,
    TempDir,
    Attachment,
    Arc<ScriptedApprover>,
) {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let dir = folder(files);
    let (attachment, approver) = Attachment::scripted(
        &server.client_config(),
        attach_options(dir.path(), "lap"),
        script,
    )
    .await;
    (server, agent, dir, attachment, approver)
}

fn read(path: &str) -> serde_json::Value {
    json!({"path": path, "workspace": "lap"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_once_runs_and_asks_again_next_time() {
    let (_server, agent, _dir, _a, approver) = scripted(
        [Some(Decision::AllowOnce), Some(Decision::Deny)],
        &[("a.txt", "alpha\n")],
    )
    .await;
    let (result, ran_in) = ok(call(&agent, "read_file", read("a.txt")).await);
    assert_eq!(
        (result["content"].as_str(), ran_in.as_str()),
        (Some("alpha\n"), "lap")
    );
    // Asked again: this time the user denies.
    expect_code(
        call(&agent, "read_file", read("a.txt")).await,
        ErrorCode::Denied,
    );
    let seen = approver.seen();
    assert_eq!(seen.len(), 2, "asked twice: {seen:?}");
    assert_eq!(seen[0].tool, ToolName::ReadFile);
    assert_eq!(seen[0].session, "default");
    assert!(seen[0].target.contains("a.txt"), "{}", seen[0].target);
}

/// Regression: a read's prompt showed the path as given, not the file it reads: a cloned
/// repository's `CONTRIBUTING.md` leading to `.git/config` was approved as a read of
/// `CONTRIBUTING.md`, and the agent got the remote's URL with its token. The prompt says
/// which file it reads; a link swapped while it waits is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reads_prompt_names_the_file_a_link_on_its_path_leads_to() {
    let (_server, agent, dir, _a, approver) = scripted(
        [Some(Decision::AllowOnce), Some(Decision::AllowOnce)],
        &[
            ("dotgit/config", "url = https://token@example.com/x\n"),
            ("notes.md", "notes\n"),
        ],
    )
    .await;
    std::os::unix::fs::symlink("dotgit/config", dir.path().join("CONTRIBUTING.md")).unwrap();
    ok(call(&agent, "read_file", read("CONTRIBUTING.md")).await);
    let seen = approver.seen();
    assert_eq!(seen[0].through_link.as_deref(), Some("dotgit/config"));
    let drawn = monad_client::prompt::render(&seen[0]).lines.join("\n");
    assert!(
        drawn.contains("reads        dotgit/config (a symbolic link on the path leads there)"),
        "{drawn}"
    );
    // A plain file's read says nothing of the kind.
    ok(call(&agent, "read_file", read("notes.md")).await);
    assert_eq!(approver.seen()[1].through_link, None);
}

/// An owner who, while asked, finds the link leading elsewhere (a command already running
/// swaps it): allowed, the read is refused rather than reading what they were not shown.
struct SwapsLinkThenAllows(std::path::PathBuf);

impl Approver for SwapsLinkThenAllows {
    fn decide(
        &self,
        _request: monad_client::approval::ApprovalRequest,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Decision> + Send>> {
        let link = self.0.join("CONTRIBUTING.md");
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink("dotgit/credentials", &link).unwrap();
        Box::pin(async { Decision::AllowOnce })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_read_whose_link_was_swapped_while_it_waited_reads_nothing() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let dir = folder(&[
        ("dotgit/config", "[core]\n"),
        ("dotgit/credentials", "token\n"),
    ]);
    std::os::unix::fs::symlink("dotgit/config", dir.path().join("CONTRIBUTING.md")).unwrap();
    let _a = Attachment::start(
        &server.client_config(),
        attach_options(dir.path(), "lap"),
        Some(Arc::new(SwapsLinkThenAllows(dir.path().to_owned())) as Arc<dyn Approver>),
    )
    .await;
    let message = expect_code(
        call(&agent, "read_file", read("CONTRIBUTING.md")).await,
        ErrorCode::Denied,
    );
    assert!(message.contains("no longer leads"), "{message}");
    // A plain file when its owner was asked, a link when the read would come: refused too.
    let plain = dir.path().join("CONTRIBUTING.md");
    std::fs::remove_file(&plain).unwrap();
    std::fs::write(&plain, "how to help\n").unwrap();
    let message = expect_code(
        call(&agent, "read_file", read("CONTRIBUTING.md")).await,
        ErrorCode::Denied,
    );
    assert!(message.contains("no longer leads"), "{message}");
}

/// A second folder asking for a name the session already has is listed under another: its/// A second folder asking for a name the session already has is listed under another: its
/// prompts call it by that name, not by the first folder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_names_the_folder_as_the_session_lists_it() {
    let (server, agent, _dir, _a, _approver) = scripted([], &[]).await;
    let other = folder(&[("b.txt", "beta\n")]);
    let (second, approver) = Attachment::scripted(
        &server.client_config(),
        attach_options(other.path(), "lap"),
        [Some(Decision::AllowOnce)],
    )
    .await;
    let listed = second.workspace.name.clone();
    assert_ne!(listed, "lap");
    ok(call(
        &agent,
        "read_file",
        json!({"path": "b.txt", "workspace": listed}),
    )
    .await);
    assert_eq!(approver.seen()[0].workspace, listed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_always_is_not_asked_again_for_the_same_class() {
    let (_server, agent, dir, _a, approver) =
        scripted([Some(Decision::AllowAlways)], &[("a.txt", "alpha\n")]).await;
    for _ in 0..3 {
        ok(call(&agent, "read_file", read("a.txt")).await);
    }
    ok(call(&agent, "list_dir", json!({"workspace": "lap"})).await);
    assert_eq!(approver.seen().len(), 1, "only the first read was asked");
    // A write is another class: asked (and the exhausted script denies).
    expect_code(
        call(
            &agent,
            "write_file",
            json!({"path": "a.txt", "content": "x", "workspace": "lap"}),
        )
        .await,
        ErrorCode::Denied,
    );
    assert_eq!(approver.seen().len(), 2);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        "alpha\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_refuses_and_leaves_the_file_unchanged() {
    let (_server, agent, dir, _a, approver) =
        scripted([Some(Decision::Deny)], &[("a.txt", "alpha\n")]).await;
    let message = expect_code(
        call(
            &agent,
            "write_file",
            json!({"path": "a.txt", "content": "overwritten\n", "workspace": "lap"}),
        )
        .await,
        ErrorCode::Denied,
    );
    assert!(message.contains("denied"), "{message}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        "alpha\n"
    );
    assert_eq!(approver.seen().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_always_refuses_later_calls_without_asking() {
    let (_server, agent, dir, _a, approver) = scripted(
        [Some(Decision::DenyAlways), Some(Decision::AllowOnce)],
        &[("a.txt", "alpha\n")],
    )
    .await;
    expect_code(
        call(
            &agent,
            "edit_file",
            json!({"path": "a.txt", "old_string": "alpha", "new_string": "beta", "workspace": "lap"}),
        )
        .await,
        ErrorCode::Denied,
    );
    // Same class (write), not asked: the AllowOnce left in the script is never used.
    let message = expect_code(
        call(
            &agent,
            "write_file",
            json!({"path": "b.txt", "content": "b", "workspace": "lap"}),
        )
        .await,
        ErrorCode::Denied,
    );
    assert!(message.contains("chose to deny"), "{message}");
    assert_eq!(approver.seen().len(), 1);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        "alpha\n"
    );
    assert!(!dir.path().join("b.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_prompt_times_out_without_running_and_says_nobody_answered() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let dir = folder(&[("a.txt", "alpha\n")]);
    let approver = Arc::new(ScriptedApprover::new([None]));
    let mut options = attach_options(dir.path(), "lap");
    options.prompt_timeout = Duration::from_millis(300);
    let _a = Attachment::start(
        &server.client_config(),
        options,
        Some(approver.clone() as Arc<dyn Approver>),
    )
    .await;
    // A time-out is not a denial: the agent is told nobody answered.
    let message = expect_code(
        call(&agent, "read_file", read("a.txt")).await,
        ErrorCode::Timeout,
    );
    assert!(message.contains("nobody answered"), "{message}");
    assert!(
        message.contains("0.3 s"),
        "says how long it waited: {message}"
    );
    assert_eq!(approver.seen().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_and_edit_prompts_carry_the_diff() {
    let (_server, agent, dir, _a, approver) = scripted(
        [Some(Decision::Deny), Some(Decision::AllowOnce)],
        &[("a.txt", "old line\nkeep\n")],
    )
    .await;
    expect_code(
        call(
            &agent,
            "write_file",
            json!({"path": "new.txt", "content": "brand new\n", "workspace": "lap"}),
        )
        .await,
        ErrorCode::Denied,
    );
    ok(call(
        &agent,
        "edit_file",
        json!({"path": "a.txt", "old_string": "old line", "new_string": "new line", "workspace": "lap"}),
    )
    .await);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        "new line\nkeep\n"
    );
    let seen = approver.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].tool, ToolName::WriteFile);
    let diff = seen[0].diff.as_deref().expect("a write carries its diff");
    assert!(diff.contains("+brand new"), "{diff}");
    assert_eq!(seen[1].tool, ToolName::EditFile);
    let diff = seen[1].diff.as_deref().expect("an edit carries its diff");
    assert!(diff.contains("-old line"), "{diff}");
    assert!(diff.contains("+new line"), "{diff}");
    assert!(seen[1].scope.contains("write"), "{}", seen[1].scope);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_into_a_new_folder_creates_it_and_its_prompt_names_the_directories() {
    let (_server, agent, dir, _a, approver) = scripted(
        [Some(Decision::AllowOnce)],
        &[("src/main.rs", "fn main() {}\n")],
    )
    .await;
    ok(call(
        &agent,
        "write_file",
        json!({"path": "src/new/deep/mod.rs", "content": "pub fn f() {}\n", "workspace": "lap"}),
    )
    .await);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("src/new/deep/mod.rs")).unwrap(),
        "pub fn f() {}\n"
    );
    let seen = approver.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].creates, ["src/new", "src/new/deep"]);
    let shown = monad_client::prompt::render(&seen[0]).lines.join("\n");
    assert!(
        shown.contains("creates      new directories src/new/, src/new/deep/"),
        "{shown}"
    );
}

/// A user who, before answering, removes a directory of the folder (as an approved background
/// command, or the user, could while the prompt waits).
struct RemovesThenAllows {
    dir: std::path::PathBuf,
    seen: std::sync::Mutex<Vec<monad_client::approval::ApprovalRequest>>,
}

impl Approver for RemovesThenAllows {
    fn decide(
        &self,
        request: monad_client::approval::ApprovalRequest,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Decision> + Send>> {
        self.seen.lock().unwrap().push(request);
        std::fs::remove_dir_all(&self.dir).unwrap();
        Box::pin(async { Decision::AllowOnce })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_makes_no_directory_its_prompt_did_not_show() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let dir = folder(&[("src/main.rs", "fn main() {}\n")]);
    let approver = Arc::new(RemovesThenAllows {
        dir: dir.path().join("src"),
        seen: Default::default(),
    });
    let _a = Attachment::start(
        &server.client_config(),
        attach_options(dir.path(), "lap"),
        Some(approver.clone() as Arc<dyn Approver>),
    )
    .await;
    // Shown: `src/new/` only. By the answer, `src/` is gone: the write would make it too.
    let message = expect_code(
        call(
            &agent,
            "write_file",
            json!({"path": "src/new/mod.rs", "content": "x\n", "workspace": "lap"}),
        )
        .await,
        ErrorCode::Denied,
    );
    assert!(message.contains("`src/`"), "{message}");
    assert!(message.contains("did not cover"), "{message}");
    assert_eq!(approver.seen.lock().unwrap()[0].creates, ["src/new"]);
    assert!(!dir.path().join("src").exists(), "nothing was made");
}

/// A user who, before answering, writes the file a call names (as they may in an editor while
/// the prompt waits, or a command the agent left running may), then allows.
struct WritesThenAllows {
    dir: std::path::PathBuf,
    /// What is written, by the file's name.
    contents: Vec<(&'static str, &'static str)>,
}

impl Approver for WritesThenAllows {
    fn decide(
        &self,
        request: monad_client::approval::ApprovalRequest,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Decision> + Send>> {
        let name = request.args["path"].as_str().unwrap();
        let (_, content) = self.contents.iter().find(|(n, _)| *n == name).unwrap();
        std::fs::write(self.dir.join(name), content).unwrap();
        Box::pin(async { Decision::AllowOnce })
    }
}

/// The owner approves the diff the prompt shows: a file created or changed while it waited is
/// not overwritten with a change they never saw, though no tool had read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_write_does_not_overwrite_what_changed_while_the_prompt_waited() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let dir = folder(&[("unread.txt", "line1\n")]);
    let contents = vec![
        ("new.txt", "owner precious data\n"),
        ("unread.txt", "line1\nowner added important line\n"),
    ];
    let _a = Attachment::start(
        &server.client_config(),
        attach_options(dir.path(), "lap"),
        Some(Arc::new(WritesThenAllows {
            dir: dir.path().to_owned(),
            contents: contents.clone(),
        }) as Arc<dyn Approver>),
    )
    .await;
    for (name, content) in contents {
        let message = expect_code(
            call(
                &agent,
                "write_file",
                json!({"path": name, "content": "agent content\n", "workspace": "lap"}),
            )
            .await,
            ErrorCode::Io,
        );
        assert!(
            message.contains("while its owner was being asked"),
            "{message}"
        );
        let now = std::fs::read_to_string(dir.path().join(name)).unwrap();
        assert_eq!(now, content, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_reaches_the_agent_while_it_waits_for_approval() {
    let (_server, agent, _dir, _a, _approver) =
        scripted([Some(Decision::AllowOnce)], &[("a.txt", "alpha\n")]).await;
    let mut progress = Vec::new();
    let reply = within(
        STEP,
        "the approved read",
        agent.call(None, "read_file", read("a.txt"), |p| {
            progress.push(p.to_owned())
        }),
    )
    .await
    .expect("the call is answered");
    ok(reply);
    assert!(
        progress.iter().any(|p| p.contains("waiting for the user")),
        "progress: {progress:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_interactive_denies_saying_how_to_pre_approve() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let dir = folder(&[("a.txt", "alpha\n")]);
    let _a = Attachment::start(
        &server.client_config(),
        attach_options(dir.path(), "lap"),
        None,
    )
    .await;
    let message = expect_code(
        call(&agent, "read_file", read("a.txt")).await,
        ErrorCode::Denied,
    );
    assert!(message.contains("--allow read"), "{message}");
    let message = expect_code(
        call(
            &agent,
            "run_command",
            json!({"argv": ["true"], "workspace": "lap"}),
        )
        .await,
        ErrorCode::Denied,
    );
    assert!(message.contains("--allow exec"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_read_lets_reads_through_but_not_writes() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let dir = folder(&[("a.txt", "alpha\n")]);
    let mut options = attach_options(dir.path(), "lap");
    options.allow = vec![ToolClass::Read];
    let _a = Attachment::start(&server.client_config(), options, None).await;
    ok(call(&agent, "read_file", read("a.txt")).await);
    ok(call(
        &agent,
        "search",
        json!({"pattern": "alp", "workspace": "lap"}),
    )
    .await);
    let message = expect_code(
        call(
            &agent,
            "write_file",
            json!({"path": "a.txt", "content": "x", "workspace": "lap"}),
        )
        .await,
        ErrorCode::Denied,
    );
    assert!(message.contains("--allow write"), "{message}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        "alpha\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_trust_runs_writes_without_asking() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let dir = folder(&[("a.txt", "alpha\n")]);
    let approver = Arc::new(ScriptedApprover::new([]));
    let mut options = attach_options(dir.path(), "lap");
    options.trust = Trust::Full;
    let attached = Attachment::start(
        &server.client_config(),
        options,
        Some(approver.clone() as Arc<dyn Approver>),
    )
    .await;
    assert_eq!(attached.workspace.trust, Trust::Full);
    ok(call(
        &agent,
        "write_file",
        json!({"path": "a.txt", "content": "rewritten\n", "workspace": "lap"}),
    )
    .await);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        "rewritten\n"
    );
    assert!(approver.seen().is_empty(), "full trust never asks");
}
