//! The official MCP Python SDK (`mcp` from PyPI) drives `monad-client mcp` over stdio and the
//! server's HTTP endpoint, against a folder attached from "a laptop": an independent
//! implementation of the protocol checks ours. The script is `tests/python/mcp_e2e.py`.
//!
//! The interpreter is `$MONAD_TEST_PYTHON`, else `target/mcp-venv/bin/python` (the virtualenv
//! `.ci/run` creates). Without one that can `import mcp` the test says so loudly and passes under a bare
//! `cargo test`, and fails under `scripts/test` (the README's test command, which installs it).

use std::path::PathBuf;

use monad_protocol::{ToolClass, ToolName};
use monad_tests::{Attachment, STEP, attach_options, binary, folder};

use super::{peer_output, saved_config, server};

/// The Python with the MCP SDK, if there is one.
pub(super) fn python() -> Option<PathBuf> {
    let candidate = match std::env::var_os("MONAD_TEST_PYTHON") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/mcp-venv/bin/python"),
    };
    let works = std::process::Command::new(&candidate)
        .args(["-c", "import mcp, httpx2"])
        .output()
        .is_ok_and(|o| o.status.success());
    works.then_some(candidate)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_drives_both_transports_against_an_attached_folder() {
    let Some(python) = python() else {
        monad_tests::peer_missing(
            "python_sdk_drives_both_transports_against_an_attached_folder",
            "no Python with the MCP SDK (set MONAD_TEST_PYTHON, or run scripts/test, which creates \
             target/mcp-venv)",
        );
        return;
    };
    let (server, http) = server().await;
    let dir = folder(&[
        ("notes.txt", "hello from the laptop\n"),
        ("docs/guide.md", "# guide\n"),
    ]);
    // A symbolic link, which a listing names apart (`kinds`).
    std::os::unix::fs::symlink("notes.txt", dir.path().join("latest")).expect("a link");
    let mut options = attach_options(dir.path(), "laptop");
    options.allow = vec![ToolClass::Read];
    let _attached = Attachment::start(&server.client_config(), options, None).await;
    let config_dir = saved_config(&server.client_config());
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/mcp_e2e.py");
    let mut peer = tokio::process::Command::new(python);
    peer.arg(script)
        .arg("--client")
        .arg(binary("monad-client"))
        .arg("--config-dir")
        .arg(config_dir.path())
        .args(["--http", &format!("http://{http}/mcp")])
        .args(["--token", &server.token, "--workspace", "laptop"])
        .env("RUST_LOG", "warn");
    let (stdout, _) = peer_output(peer, "the Python SDK script", STEP * 3).await;
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    for (line, transport) in lines.iter().zip(["stdio", "http"]) {
        assert_eq!(line["transport"], transport);
        assert_eq!(line["tools"], ToolName::ALL.len(), "every tool is listed");
        assert_eq!(line["read"], "hello from the laptop");
        assert_eq!(line["error"], "not_found");
    }
}
