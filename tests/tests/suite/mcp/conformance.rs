//! The official MCP conformance suite (`@modelcontextprotocol/conformance` 0.1.10) against the
//! server's HTTP endpoint: the server scenarios that apply to Monad (the others need the suite's
//! fixture tools, resources, prompts or completions, which Monad does not have; see
//! `docs/mcp.md`). The suite cannot send headers, so `tests/conformance/auth-proxy.js` adds the
//! bearer token in front of the endpoint.
//!
//! The suite is looked up in `target/mcp-node` (where `scripts/test` installs it), or in
//! `$MONAD_TEST_CONFORMANCE` (a directory holding `node_modules`). Without it, or without
//! `node`, the test says so loudly and passes under a bare `cargo test`; under `scripts/test` (the
//! README's test command) it fails.

use std::path::PathBuf;
use std::time::Duration;

use monad_tests::{STEP, within};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::server;

/// The scenarios that apply to Monad; each must pass with no failure.
const SCENARIOS: [&str; 6] = [
    "server-initialize",
    "ping",
    "logging-set-level",
    "tools-list",
    "server-sse-multiple-streams",
    "server-sse-polling",
];

fn suite() -> Option<PathBuf> {
    let dir = match std::env::var_os("MONAD_TEST_CONFORMANCE") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/mcp-node"),
    };
    let bin = dir.join("node_modules/.bin/conformance");
    let node = std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    (node && bin.exists()).then_some(bin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite_server_scenarios_pass_against_the_http_endpoint() {
    let Some(conformance) = suite() else {
        monad_tests::peer_missing(
            "conformance_suite_server_scenarios_pass_against_the_http_endpoint",
            "no node, or no @modelcontextprotocol/conformance in target/mcp-node (run scripts/test)",
        );
        return;
    };
    let (server, http) = server().await;
    let proxy_script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("conformance/auth-proxy.js");
    let mut proxy = tokio::process::Command::new("node")
        .arg(proxy_script)
        .args(["0", &format!("http://{http}"), &server.token])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node starts the proxy");
    let mut lines = BufReader::new(proxy.stdout.take().unwrap()).lines();
    let listening = within(STEP, "the proxy to listen", lines.next_line())
        .await
        .expect("proxy output")
        .expect("a line");
    let url = format!(
        "{}/mcp",
        listening
            .strip_prefix("listening on ")
            .expect("the proxy says where it listens")
    );
    for scenario in SCENARIOS {
        let run = tokio::process::Command::new(&conformance)
            .args(["server", "--url", &url, "--scenario", scenario])
            .kill_on_drop(true)
            .output();
        let output = within(Duration::from_secs(90), scenario, run)
            .await
            .expect("the suite runs");
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let summary = all
            .lines()
            .rev()
            .find(|l| l.contains("Passed: "))
            .unwrap_or_default();
        assert!(
            summary.contains(", 0 failed"),
            "{scenario}: {summary}\n{all}"
        );
    }
}
