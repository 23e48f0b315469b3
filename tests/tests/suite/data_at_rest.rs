//! Data at rest is private (issue 9, item 11): the data dir and every session directory are
//! 0700 and every file the server writes is 0600, from creation on, whatever the umask; a data
//! dir an older version left readable is tightened at start-up.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use monad_client::agent::Agent;
use monad_protocol::ToolClass;
use monad_protocol::wire::{HistoryMessage, HistoryRole};
use monad_tests::{
    Attachment, STEP, ServerProcess, TestServer, attach_options, call_in, connect_agent, folder,
    ok, within,
};
use serde_json::json;

const SESSION: &str = "0c0ffee0-0000-4000-8000-000000000001";

/// Every directory and file under `data_dir` whose mode is not private, except the primary
/// workspaces (`sessions/<id>/workspace`), whose modes are the tools' business.
fn not_private(data_dir: &Path) -> Vec<String> {
    fn walk(path: &Path, data_dir: &Path, out: &mut Vec<String>) {
        let meta = std::fs::symlink_metadata(path).expect("stat");
        let mode = meta.permissions().mode() & 0o777;
        let rel = path.strip_prefix(data_dir).unwrap();
        let in_sessions = rel.components().count() == 3 && rel.starts_with("sessions");
        if meta.is_dir() && in_sessions && rel.ends_with("workspace") {
            return;
        }
        if meta.is_dir() {
            if mode != 0o700 {
                out.push(format!("{}/ is {mode:o}", rel.display()));
            }
            for entry in std::fs::read_dir(path).expect("list") {
                walk(&entry.expect("entry").path(), data_dir, out);
            }
        } else if mode != 0o600 {
            out.push(format!("{} is {mode:o}", rel.display()));
        }
    }
    let mut out = Vec::new();
    walk(data_dir, data_dir, &mut out);
    out
}

/// A session with history, audit lines, artifacts, a device binding and a workspace record.
async fn use_a_session(agent: &Agent, config: &monad_client::config::ClientConfig) {
    within(
        STEP,
        "a history append",
        agent.history_append(
            Some(SESSION),
            HistoryMessage {
                role: HistoryRole::User,
                text: "a secret plan".into(),
            },
        ),
    )
    .await
    .expect("appended");
    ok(call_in(
        agent,
        Some(SESSION),
        "write_file",
        json!({"path": "notes.txt", "content": "read from a laptop\n"}),
    )
    .await);
    let dir = folder(&[("laptop.txt", "private\n")]);
    let mut options = attach_options(dir.path(), "laptop");
    options.session = Some(SESSION.into());
    options.allow = vec![ToolClass::Read];
    let attached = Attachment::start(config, options, None).await;
    ok(call_in(
        agent,
        Some(SESSION),
        "read_file",
        json!({"path": "laptop.txt"}),
    )
    .await);
    drop(attached);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_the_server_writes_is_private_even_with_umask_zero() {
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("monad");
    let server = ServerProcess::start_with(&dir, &[], Some(0)).await;
    let token = server.first_token.clone().expect("a first start");
    let config = server.client_config(&token);
    let agent = connect_agent(&config).await;
    use_a_session(&agent, &config).await;
    drop(agent);
    server.stop().await;
    // What the run wrote: all of it, checked.
    for expected in [
        "tokens.toml",
        "bindings.toml",
        "server.lock",
        "tls/key.pem",
        "sessions/0c0ffee0-0000-4000-8000-000000000001/session.md",
        "sessions/0c0ffee0-0000-4000-8000-000000000001/session.toml",
        "sessions/0c0ffee0-0000-4000-8000-000000000001/audit.jsonl",
        "sessions/0c0ffee0-0000-4000-8000-000000000001/artifacts/index.jsonl",
    ] {
        assert!(dir.join(expected).is_file(), "{expected} was written");
    }
    assert!(
        std::fs::read_dir(dir.join("workspaces")).unwrap().count() > 0,
        "a workspace record was written"
    );
    let loose = not_private(&dir);
    assert!(loose.is_empty(), "not private: {loose:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_left_readable_by_an_older_version_is_tightened_at_start() {
    let server = TestServer::start().await;
    let config = server.client_config();
    let agent = connect_agent(&config).await;
    use_a_session(&agent, &config).await;
    drop(agent);
    let stopped = server.stop().await;
    // As an older version left it: directories 0755, files 0644 (the workspace's own modes are
    // left as they are).
    fn widen(path: &Path) {
        let meta = std::fs::symlink_metadata(path).unwrap();
        let mode = if meta.is_dir() { 0o755 } else { 0o644 };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        if meta.is_dir() {
            for entry in std::fs::read_dir(path).unwrap() {
                widen(&entry.unwrap().path());
            }
        }
    }
    widen(stopped.data_dir());
    let server = stopped.restart().await;
    within(
        STEP,
        "the start-up housekeeping",
        server.state().housekeeping(),
    )
    .await;
    let loose = not_private(server.data_dir());
    assert!(loose.is_empty(), "not private: {loose:#?}");
}
