//! What a model reads: the text block of Monad's results against the reference MCP filesystem
//! server's (`@modelcontextprotocol/server-filesystem`, Node, installed by `scripts/test` in
//! `target/mcp-node`), on the same calls over the same files: a 4 KiB read, a 248 KiB read and a
//! 1,000-entry listing. Monad's text (numbered lines under a header; one entry per line) must
//! stay within 1.1x of the reference's characters, and carry no JSON (that is in
//! `structuredContent` only).
//!
//! Without node or the package the test says so loudly and passes under a bare `cargo test`, and
//! fails under `scripts/test` (the README's test command, which installs it).

use std::path::PathBuf;

use monad_protocol::ToolClass;
use monad_tests::{Attachment, STEP, attach_options, within};
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};

use super::{Via, connect, server, text};

/// The reference server's entry point, when installed.
fn reference_server() -> Option<PathBuf> {
    let bin = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/mcp-node/node_modules/.bin/mcp-server-filesystem");
    let node = std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    (node && bin.exists()).then_some(bin)
}

async fn call(client: &RunningService<RoleClient, ()>, tool: &str, args: Value) -> CallToolResult {
    let params = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    let result = within(STEP, tool, client.call_tool(params))
        .await
        .expect("tools/call answers");
    assert_ne!(result.is_error, Some(true), "{tool}: {result:?}");
    result
}

fn only_text(result: &CallToolResult) -> String {
    assert_eq!(result.content.len(), 1, "one text block: {result:?}");
    text(result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_is_within_a_tenth_of_the_reference_server() {
    let Some(reference) = reference_server() else {
        monad_tests::peer_missing(
            "text_is_within_a_tenth_of_the_reference_server",
            "no node, or no @modelcontextprotocol/server-filesystem in target/mcp-node (run \
             scripts/test)",
        );
        return;
    };
    let dir = tempfile::tempdir().expect("folder");
    let line = "the quick brown fox jumps over the lazy dog, again and again.\n";
    for (name, size) in [("small.txt", 4096), ("large.txt", 248 * 1024)] {
        let content = &line.repeat(size / line.len() + 1)[..size];
        std::fs::write(dir.path().join(name), content).expect("file");
    }
    std::fs::create_dir(dir.path().join("many")).expect("dir");
    for i in 0..1000 {
        std::fs::write(dir.path().join(format!("many/f{i:04}.txt")), "x").expect("file");
    }

    let (server, http) = server().await;
    let mut options = attach_options(dir.path(), "laptop");
    options.allow = vec![ToolClass::Read];
    let _attached = Attachment::start(&server.client_config(), options, None).await;
    let monad = connect(&server, http, Via::Stdio, None)
        .await
        .expect("monad-client mcp connects");
    let mut cmd = tokio::process::Command::new("node");
    cmd.arg(reference).arg(dir.path()).kill_on_drop(true);
    let transport = TokioChildProcess::new(cmd).expect("node starts");
    let theirs = within(STEP, "initialize the reference server", ().serve(transport))
        .await
        .expect("the reference server initializes");

    let abs = |p: &str| dir.path().join(p).to_string_lossy().into_owned();
    let cases = [
        (
            "read 4 KiB",
            (
                "read_file",
                json!({"path": "small.txt", "workspace": "laptop"}),
            ),
            ("read_text_file", json!({"path": abs("small.txt")})),
        ),
        (
            "read 248 KiB",
            (
                "read_file",
                json!({"path": "large.txt", "workspace": "laptop", "limit": 10000}),
            ),
            ("read_text_file", json!({"path": abs("large.txt")})),
        ),
        (
            "list 1,000 entries",
            ("list_dir", json!({"path": "many", "workspace": "laptop"})),
            ("list_directory", json!({"path": abs("many")})),
        ),
    ];
    let mut report = Vec::new();
    for (what, (tool, args), (their_tool, their_args)) in cases {
        let ours = monad.call(tool, args).await;
        assert_eq!(ours.is_error, Some(false), "{what}: {ours:?}");
        let ours_text = only_text(&ours);
        let structured = ours.structured_content.clone().expect("structuredContent");
        assert_eq!(structured["workspace"]["name"], "laptop", "{what}");
        assert_eq!(structured["result"]["truncated"], false, "{what}");
        // The JSON is not repeated in the text.
        assert!(
            serde_json::from_str::<Value>(&ours_text).is_err(),
            "{what}: the text is JSON"
        );
        assert!(
            !ours_text.contains("\"content\"") && !ours_text.contains("\"entries\""),
            "{what}"
        );
        let their_text = text(&call(&theirs, their_tool, their_args).await);
        let (o, t) = (ours_text.chars().count(), their_text.chars().count());
        eprintln!(
            "{what}: Monad {o} characters, reference {t}: x{:.3}",
            o as f64 / t as f64
        );
        report.push(format!("{what}: {o} vs {t}"));
        assert!(o * 10 <= t * 11, "{what}: {o} characters against {t}");
    }
    // What the model sees is the file and the listing, in their order.
    let read = only_text(
        &monad
            .call(
                "read_file",
                json!({"path": "small.txt", "workspace": "laptop"}),
            )
            .await,
    );
    let mut lines = read.lines();
    assert_eq!(
        lines.next(),
        Some("small.txt in workspace laptop: lines 1-67 of 67"),
        "{read}"
    );
    assert_eq!(
        lines.next(),
        Some(format!(" 1\t{}", line.trim_end()).as_str())
    );
    let list = only_text(
        &monad
            .call("list_dir", json!({"path": "many", "workspace": "laptop"}))
            .await,
    );
    let mut lines = list.lines();
    assert_eq!(
        lines.next(),
        Some("many/ in workspace laptop: 1000 entries")
    );
    assert_eq!(lines.next(), Some("f0000.txt"));
    assert_eq!(lines.last(), Some("f0999.txt"));
    eprintln!("{}", report.join("; "));
}
