//! The official MCP TypeScript SDK (`@modelcontextprotocol/sdk`, installed into
//! `target/mcp-node` by `scripts/test`), the `Client` and `StdioClientTransport` most hosts are
//! built on, drives `monad-client mcp` over stdio against a folder attached from "a laptop":
//! `tests/mcp/stdio_host.mjs`. Node gives the server socket pairs for its standard streams, not
//! pipes, and the SDK checks every `structuredContent` against the tool's `outputSchema` with
//! Ajv, which writes a warning to the host's console for anything in a schema it does not know.
//!
//! Without node or the SDK the test says so loudly and passes under a bare `cargo test`, and
//! fails under `scripts/test` (the README's test command, which installs them).

use std::path::PathBuf;

use monad_protocol::{ToolClass, ToolName};
use monad_tests::{Attachment, STEP, attach_options, binary, folder};

use super::{peer_output, saved_config, server};

/// `target/mcp-node` with the SDK, and whether node runs.
fn sdk() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/mcp-node");
    let node = std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let installed = dir
        .join("node_modules/@modelcontextprotocol/sdk/package.json")
        .exists();
    (node && installed).then_some(dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_sdk_host_drives_stdio_over_sockets_and_its_schema_check_has_nothing_to_say() {
    let Some(sdk) = sdk() else {
        monad_tests::peer_missing(
            "typescript_sdk_host_drives_stdio_over_sockets_and_its_schema_check_has_nothing_to_say",
            "no node, or no @modelcontextprotocol/sdk in target/mcp-node (run scripts/test)",
        );
        return;
    };
    let (server, _http) = server().await;
    let dir = folder(&[
        ("notes.txt", "hello from the laptop\n"),
        ("docs/guide.md", "# guide\n"),
    ]);
    let mut options = attach_options(dir.path(), "laptop");
    options.allow = vec![ToolClass::Read];
    let _attached = Attachment::start(&server.client_config(), options, None).await;
    let config_dir = saved_config(&server.client_config());
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mcp/stdio_host.mjs");
    let mut peer = tokio::process::Command::new("node");
    peer.arg(script)
        .arg(sdk)
        .arg(binary("monad-client"))
        .arg(config_dir.path())
        .arg("laptop");
    let (stdout, _) = peer_output(peer, "the TypeScript SDK host", STEP * 3).await;
    let seen: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(seen["stdio"], serde_json::json!(["socket", "socket"]));
    assert_eq!(seen["tools"], ToolName::ALL.len(), "every tool is listed");
    assert_eq!(seen["with_output_schema"], ToolName::ALL.len());
    assert_eq!(seen["read"], "hello from the laptop\n");
    let text = seen["read_text"].as_str().unwrap_or_default();
    assert!(text.ends_with("1\thello from the laptop"), "{text}");
    assert_eq!(seen["entries"], serde_json::json!(["docs/", "notes.txt"]));
    assert_eq!(seen["missing"], serde_json::json!([true, "not_found"]));
    // Before the schemas lost schemars' `uint64`-style formats, Ajv wrote 40 warnings here.
    assert_eq!(
        seen["warnings"],
        serde_json::json!([]),
        "the host's console"
    );
}
