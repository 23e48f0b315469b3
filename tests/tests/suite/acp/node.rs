//! The official TypeScript SDK (`@agentclientprotocol/sdk`, installed into `target/acp-node` by
//! `scripts/test`) as an independent ACP client of `monad-client acp`: `tests/acp/client.mjs`
//! runs initialize, two `session/new`s (a fresh one, then `_meta.sessionId: "default"`), a prompt
//! whose tool calls ask the editor (one allowed, one rejected), `session/load` and a prompt in an
//! unknown session, and prints what it saw.

use std::path::PathBuf;

use monad_client::approval::Decision;
use monad_tests::provider::{Reply, ScriptedProvider};
use monad_tests::{Attachment, STEP, attach_options, folder, within};
use serde_json::{Value, json};

use super::{acp_command, server_for};

/// `target/acp-node` with the SDK, and whether node runs.
fn sdk() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/acp-node");
    let node = std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    (node
        && dir
            .join("node_modules/@agentclientprotocol/sdk/package.json")
            .exists())
    .then_some(dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_sdk_drives_sessions_prompts_permissions_and_errors() {
    let Some(sdk) = sdk() else {
        monad_tests::peer_missing(
            "the_typescript_sdk_drives_sessions_prompts_permissions_and_errors",
            "no node, or no @agentclientprotocol/sdk in target/acp-node (run scripts/test)",
        );
        return;
    };
    let provider = ScriptedProvider::start(vec![
        Reply::Stream {
            text: vec!["Reading.".into()],
            calls: vec![(
                "call_read".into(),
                "read_file".into(),
                json!({"path": "notes.txt", "workspace": "lap"}),
            )],
            usage: (10, 5),
        },
        Reply::tool_call(
            "call_edit",
            "edit_file",
            json!({"path": "notes.txt", "old_string": "draft", "new_string": "final", "workspace": "lap"}),
        ),
        Reply::text(["Left as it was."]),
    ])
    .await;
    let server = server_for(&provider).await;
    let dir = folder(&[("notes.txt", "status: draft\n")]);
    let (_lap, approver) = Attachment::scripted(
        &server.client_config(),
        attach_options(dir.path(), "lap"),
        [Some(Decision::AllowOnce), Some(Decision::AllowOnce)],
    )
    .await;
    let config = tempfile::tempdir().unwrap();
    // The config the agent uses; the node script starts the same binary with the same env.
    let agent = acp_command(&server, config.path());
    let binary = agent.as_std().get_program().to_owned();
    let mut node = tokio::process::Command::new("node");
    node.arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("acp/client.mjs"))
        .arg(&sdk)
        .arg(&binary)
        .env("ACP_ANSWERS", "allow,reject")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true);
    for (key, value) in agent.as_std().get_envs() {
        match value {
            Some(value) => node.env(key, value),
            None => node.env_remove(key),
        };
    }
    let output = within(STEP * 2, "the node client", node.output())
        .await
        .expect("node runs");
    assert!(output.status.success(), "{output:?}");
    let seen: Value = serde_json::from_slice(&output.stdout).expect("the client's JSON");

    assert_eq!(seen["initialize"]["protocolVersion"], 1, "{seen}");
    assert_eq!(seen["initialize"]["agentCapabilities"]["loadSession"], true);
    let fresh = seen["fresh"].as_str().unwrap();
    assert_eq!(fresh.len(), 36, "a fresh UUID: {fresh}");
    assert_eq!(seen["resumed"], "default");
    assert_eq!(seen["stopReason"], "end_turn");

    let of = |phase: &str, kind: &str| -> Vec<Value> {
        seen["updates"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|u| u["phase"] == phase && u["update"]["sessionUpdate"] == kind)
            .map(|u| u["update"].clone())
            .collect()
    };
    let text: String = of("prompt", "agent_message_chunk")
        .iter()
        .filter_map(|u| u["content"]["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(text, "Reading.Left as it was.");
    let calls = of("prompt", "tool_call");
    assert_eq!(calls.len(), 2, "{seen}");
    assert_eq!(calls[0]["kind"], "read");
    let notes = dir.path().canonicalize().unwrap().join("notes.txt");
    assert_eq!(
        calls[0]["locations"][0]["path"],
        notes.to_str().unwrap(),
        "absolute, in this device's folder"
    );
    assert_eq!(calls[1]["kind"], "edit");
    let ends: Vec<Value> = of("prompt", "tool_call_update")
        .into_iter()
        .filter(|u| u["status"] == "completed" || u["status"] == "failed")
        .collect();
    assert_eq!(ends.len(), 2, "{seen}");
    assert_eq!(ends[0]["status"], "completed");
    assert!(ends[0].to_string().contains("status: draft"), "{}", ends[0]);
    assert_eq!(ends[1]["status"], "failed", "rejected in the editor");
    // The editor was asked twice; the laptop only for the call the editor allowed.
    assert_eq!(seen["permissions"].as_array().unwrap().len(), 2);
    assert_eq!(
        seen["permissions"][0]["toolCall"]["toolCallId"],
        "t1.call_read"
    );
    assert_eq!(
        approver.seen().len(),
        1,
        "the laptop never saw the rejected edit"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(),
        "status: draft\n"
    );
    // Load replayed the conversation (the resume had cleared what came before).
    let user: String = of("load", "user_message_chunk")
        .iter()
        .filter_map(|u| u["content"]["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(user, "Mark my notes as final.");
    let replayed: String = of("load", "agent_message_chunk")
        .iter()
        .filter_map(|u| u["content"]["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(replayed, "Reading.Left as it was.");
    // A prompt in an unknown session: an error, not a crash.
    let errors = seen["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{seen}");
    assert_eq!(errors[0]["code"], -32602, "{seen}");
}
