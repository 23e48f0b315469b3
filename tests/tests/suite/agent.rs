//! The built-in agent loop, end to end: a real server whose `[llm]` points at the scripted
//! provider, an agent sending prompts over QUIC (`Agent::prompt`), folders attached through the
//! client library with scripted approvers.

use std::time::Duration;

use monad_client::agent::{Agent, PromptOptions, PromptReply};
use monad_client::approval::Decision;
use monad_protocol::agent::{AgentEvent, StopReason};
use monad_protocol::wire::{HistoryMessage, HistoryRole, Trust};
use monad_server::llm::ProviderKind;
use monad_tests::provider::{Reply, ScriptedProvider};
use monad_tests::{
    Attachment, STEP, ServerProcess, TestServer, attach_options, connect_agent, folder, within,
};
use serde_json::{Value, json};

const KINDS: [ProviderKind; 2] = [ProviderKind::Openai, ProviderKind::Anthropic];

/// A server whose `[llm]` talks to `provider` with `kind`, plus `extra` lines of `[llm]`.
async fn server_for(provider: &ScriptedProvider, kind: ProviderKind, extra: &str) -> TestServer {
    let toml = provider.llm_config(kind, extra);
    TestServer::start_with(|config| {
        std::fs::write(config.data_dir.join("config.toml"), toml).expect("config.toml written");
    })
    .await
}

/// Sends `text` and collects the turn's events.
async fn prompt(agent: &Agent, text: &str) -> (PromptReply, Vec<AgentEvent>) {
    let mut events = Vec::new();
    let reply = within(
        STEP * 2,
        "the turn to end",
        agent.prompt(None, text, |e| events.push(e)),
    )
    .await
    .expect("the prompt is answered");
    (reply, events)
}

fn streamed_text(events: &[AgentEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

fn session_md(server: &TestServer) -> String {
    std::fs::read_to_string(server.data_dir().join("sessions/default/session.md"))
        .unwrap_or_default()
}

/// The tool results' texts in a request body of either API.
fn tool_results(request: &Value, kind: ProviderKind) -> Vec<String> {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    match kind {
        ProviderKind::Openai => messages
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| m["content"].as_str().unwrap_or("").to_owned())
            .collect(),
        ProviderKind::Anthropic => messages
            .iter()
            .filter_map(|m| m["content"].as_array())
            .flatten()
            .filter(|b| b["type"] == "tool_result")
            .map(|b| b["content"].as_str().unwrap_or("").to_owned())
            .collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_reads_and_edits_a_file_in_a_restricted_folder_through_approvals() {
    for kind in KINDS {
        let provider = ScriptedProvider::start(vec![
            Reply::Stream {
                text: vec!["Let me read it.".into()],
                calls: vec![(
                    "call_read".into(),
                    "read_file".into(),
                    json!({"path": "notes.txt", "workspace": "lap"}),
                )],
                usage: (100, 10),
            },
            Reply::tool_call(
                "call_edit",
                "edit_file",
                json!({"path": "notes.txt", "old_string": "draft", "new_string": "final", "workspace": "lap"}),
            ),
            Reply::text(["Done: ", "notes.txt now says final."]),
        ])
        .await;
        let server = server_for(&provider, kind, "").await;
        let dir = folder(&[("notes.txt", "status: draft\n")]);
        let (_lap, approver) = Attachment::scripted(
            &server.client_config(),
            attach_options(dir.path(), "lap"),
            [Some(Decision::AllowOnce), Some(Decision::AllowOnce)],
        )
        .await;
        let agent = server.agent().await;

        let (reply, events) = prompt(&agent, "Mark my notes as final.").await;

        assert_eq!(reply.result.stop, StopReason::Answered, "{kind:?}");
        assert_eq!(reply.result.tool_calls, 2);
        assert_eq!(reply.result.input_tokens, 120, "usage summed over the turn");
        assert_eq!(reply.session, "default");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(),
            "status: final\n",
            "{kind:?}: the file changed"
        );
        assert_eq!(
            approver.seen().len(),
            2,
            "both calls were approved by the laptop"
        );
        assert_eq!(
            streamed_text(&events),
            "Let me read it.Done: notes.txt now says final."
        );
        let calls: Vec<(&str, &str, Option<&str>)> = events
            .iter()
            .filter_map(|e| match e {
                AgentEvent::ToolCallStarted { call_id, tool, .. } => {
                    Some(("started", tool.as_str(), Some(call_id.as_str())))
                }
                AgentEvent::ToolCallEnded {
                    tool,
                    workspace,
                    error,
                    ..
                } => {
                    assert!(error.is_none(), "{error:?}");
                    Some((
                        "ended",
                        tool.as_str(),
                        workspace.as_ref().map(|w| w.name.as_str()),
                    ))
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            calls,
            [
                ("started", "read_file", Some("call_read")),
                ("ended", "read_file", Some("lap")),
                ("started", "edit_file", Some("call_edit")),
                ("ended", "edit_file", Some("lap")),
            ]
        );

        // The model got the file as render::text writes it, and the tools as MCP describes them.
        let requests = provider.wait_for_requests(3).await;
        let results = tool_results(&requests[1].body, kind);
        assert_eq!(results.len(), 1, "{kind:?}");
        assert!(results[0].contains("status: draft"), "{}", results[0]);
        assert!(results[0].contains("lap"), "the result names its workspace");
        let tools = requests[0].body["tools"].as_array().unwrap();
        let read_file = tools
            .iter()
            .find(|t| t.pointer("/function/name").or(t.get("name")) == Some(&json!("read_file")))
            .expect("read_file is offered");
        let description = read_file
            .pointer("/function/description")
            .or(read_file.get("description"))
            .and_then(Value::as_str)
            .unwrap();
        let (_, workspaces) = agent.workspaces(None).await.unwrap();
        let mcp = monad_protocol::mcp::tool(monad_protocol::ToolName::ReadFile, &workspaces);
        assert_eq!(
            Some(description),
            mcp.description.as_deref(),
            "the MCP description"
        );
        assert_eq!(
            read_file
                .pointer("/function/parameters")
                .or(read_file.get("input_schema"))
                .unwrap(),
            &Value::Object((*mcp.input_schema).clone()),
            "the MCP schema"
        );

        // session.md: frontmatter with provider and model, the user's message, the assistant's.
        let md = session_md(&server);
        assert!(md.contains(&format!("provider: {}", kind.as_str())), "{md}");
        assert!(md.contains("model: scripted-model"), "{md}");
        let expected = "## User\n\nMark my notes as final.\n\n## Assistant\n\nLet me read it.\n\n\
                        ## Assistant\n\nDone: notes.txt now says final.\n";
        assert!(md.contains(expected), "{md}");
        assert!(
            !md.contains("status: draft"),
            "tool results are not in session.md"
        );

        // The audit log has both calls, decided by the laptop's user.
        let lines = server.audit_lines("default", 2).await;
        let tools: Vec<&str> = lines.iter().filter_map(|l| l["tool"].as_str()).collect();
        assert_eq!(tools, ["read_file", "edit_file"], "{lines:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_laptop_that_is_away_is_reported_offline_and_the_turn_goes_on() {
    let provider = ScriptedProvider::start(vec![
        Reply::tool_call(
            "c1",
            "read_file",
            json!({"path": "a.txt", "workspace": "lap"}),
        ),
        Reply::text(["Your laptop is offline."]),
    ])
    .await;
    let server = server_for(&provider, ProviderKind::Openai, "").await;
    let dir = folder(&[("a.txt", "alpha\n")]);
    let lap = Attachment::start(
        &server.client_config(),
        attach_options(dir.path(), "lap"),
        None,
    )
    .await;
    let agent = server.agent().await;
    drop(lap);
    within(STEP, "the laptop to be offline", async {
        loop {
            let (_, workspaces) = agent.workspaces(None).await.unwrap();
            if workspaces.iter().any(|w| w.name == "lap" && !w.online) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;

    let (reply, events) = prompt(&agent, "What is in a.txt on my laptop?").await;

    assert_eq!(reply.result.stop, StopReason::Answered);
    let ended = events
        .iter()
        .find_map(|e| match e {
            AgentEvent::ToolCallEnded { error, text, .. } => Some((error.clone(), text.clone())),
            _ => None,
        })
        .expect("the call ended");
    assert!(ended.0.is_some(), "the call failed");
    let requests = provider.wait_for_requests(2).await;
    let results = tool_results(&requests[1].body, ProviderKind::Openai);
    assert_eq!(
        results,
        std::slice::from_ref(&ended.1),
        "the model got the same text"
    );
    assert!(results[0].contains("offline"), "{}", results[0]);
    assert!(session_md(&server).contains("Your laptop is offline."));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_call_limit_ends_the_turn_without_running_the_rest() {
    let provider = ScriptedProvider::start(vec![Reply::Stream {
        text: vec![],
        calls: vec![
            (
                "c1".into(),
                "write_file".into(),
                json!({"path": "one.txt", "content": "1"}),
            ),
            (
                "c2".into(),
                "write_file".into(),
                json!({"path": "two.txt", "content": "2"}),
            ),
        ],
        usage: (1, 1),
    }])
    .await;
    let server = server_for(
        &provider,
        ProviderKind::Anthropic,
        "max_tool_calls_per_turn = 1\n",
    )
    .await;
    let agent = server.agent().await;
    let (reply, _) = prompt(&agent, "write two files").await;
    assert_eq!(reply.result.stop, StopReason::ToolCallLimit { limit: 1 });
    assert_eq!(reply.result.tool_calls, 1);
    assert!(server.primary_dir("default").join("one.txt").exists());
    assert!(!server.primary_dir("default").join("two.txt").exists());
    assert_eq!(
        provider.requests().len(),
        1,
        "the model was not asked again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_limit_ends_the_turn_after_the_step_that_crossed_it() {
    let provider = ScriptedProvider::start(vec![Reply::Stream {
        text: vec!["Listing.".into()],
        calls: vec![("c1".into(), "list_dir".into(), json!({}))],
        usage: (900, 200),
    }])
    .await;
    let server = server_for(
        &provider,
        ProviderKind::Openai,
        "max_tokens_per_turn = 1000\n",
    )
    .await;
    let agent = server.agent().await;
    let (reply, events) = prompt(&agent, "list").await;
    assert_eq!(reply.result.stop, StopReason::TokenLimit { limit: 1000 });
    assert_eq!(reply.result.tool_calls, 0, "nothing ran after the limit");
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, AgentEvent::ToolCallStarted { .. }))
    );
    assert!(
        session_md(&server).contains("Listing."),
        "what was said is kept"
    );
}

/// Token counts a provider made up cannot take a turn past its bound by wrapping round: the
/// tally saturates (it overflowed: a panic in a debug build, a count of 0 in a release one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_token_counts_do_not_wrap_past_the_limit() {
    for kind in [ProviderKind::Openai, ProviderKind::Anthropic] {
        let provider = ScriptedProvider::start(vec![Reply::Stream {
            text: vec!["Listing.".into()],
            calls: vec![("c1".into(), "list_dir".into(), json!({}))],
            usage: (u64::MAX, 1),
        }])
        .await;
        let server = server_for(&provider, kind, "max_tokens_per_turn = 1000\n").await;
        let agent = server.agent().await;
        let (reply, _) = prompt(&agent, "list").await;
        assert_eq!(
            reply.result.stop,
            StopReason::TokenLimit { limit: 1000 },
            "{kind:?}"
        );
        assert_eq!(reply.result.tool_calls, 0, "{kind:?}: nothing ran");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_is_waited_out_and_the_conversation_continues_across_turns() {
    let provider = ScriptedProvider::start(vec![
        Reply::Status {
            status: 429,
            message: "slow down".into(),
            retry_after: Some(0),
        },
        Reply::text(["First answer."]),
        Reply::text(["Second answer."]),
    ])
    .await;
    let server = server_for(&provider, ProviderKind::Anthropic, "").await;
    let agent = server.agent().await;
    let (reply, events) = prompt(&agent, "first question").await;
    assert_eq!(reply.result.stop, StopReason::Answered);
    assert_eq!(
        events.first(),
        Some(&AgentEvent::Retrying {
            after_ms: 0,
            message: "slow down".into()
        })
    );
    assert_eq!(streamed_text(&events), "First answer.");
    let (reply, _) = prompt(&agent, "second question").await;
    assert_eq!(reply.result.stop, StopReason::Answered);
    let requests = provider.wait_for_requests(3).await;
    assert_eq!(
        requests[2].body["messages"],
        json!([
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "First answer."},
            {"role": "user", "content": "second question"},
        ]),
        "the second turn carries the first"
    );
}

/// Regression: a turn did not count as activity (only tool calls did), so a session used only
/// to talk kept the `last_active` of its creation, and retention or `session gc` deleted it,
/// conversation and all, while it was in use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_without_tool_calls_counts_as_activity() {
    let provider = ScriptedProvider::start(vec![
        Reply::text(["First answer."]),
        Reply::text(["Second answer."]),
    ])
    .await;
    let server = server_for(&provider, ProviderKind::Anthropic, "").await;
    let agent = server.agent().await;
    let last_active = || {
        let loaded = server.state().registry.loaded_of(agent.user());
        assert_eq!(loaded.len(), 1, "one session");
        loaded[0].meta().last_active
    };
    let (reply, _) = prompt(&agent, "first question").await;
    assert_eq!(reply.result.stop, StopReason::Answered);
    let before = last_active();
    // `last_active` counts whole seconds.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (reply, _) = prompt(&agent, "second question").await;
    assert_eq!(reply.result.stop, StopReason::Answered);
    let after = last_active();
    assert!(after > before, "{before} then {after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oldest_turns_are_left_out_past_the_context_budget() {
    let provider =
        ScriptedProvider::start(vec![Reply::text(["a".repeat(40_000)]), Reply::text(["ok"])]).await;
    // The budget leaves room for everything the first request held (the system prompt, the
    // tools, a short question) and a little more, not for the first turn's 10,000-token answer.
    let server = server_for(&provider, ProviderKind::Openai, "").await;
    let agent = server.agent().await;
    prompt(&agent, "first").await;
    let first = provider.wait_for_requests(1).await[0]
        .body
        .to_string()
        .len() as u64
        / 4;
    drop(agent);
    let stopped = server.stop().await;
    std::fs::write(
        stopped.data_dir().join("config.toml"),
        std::fs::read_to_string(stopped.data_dir().join("config.toml"))
            .unwrap()
            .replace(
                "[llm]\n",
                &format!("[llm]\ncontext_budget_tokens = {}\n", first + 1000),
            ),
    )
    .unwrap();
    let server = stopped.restart().await;
    let agent = server.agent().await;
    let (reply, _) = prompt(&agent, "second").await;
    assert_eq!(reply.result.stop, StopReason::Answered);
    let requests = provider.wait_for_requests(2).await;
    let messages = &requests[1].body["messages"];
    assert_eq!(messages[0]["role"], "system", "the system prompt stays");
    assert_eq!(
        messages.as_array().unwrap()[1..],
        [json!({"role": "user", "content": "second"})],
        "the first turn was left out"
    );
}

/// Waits (bounded) until the default session's `session.md` holds `text`.
async fn until_session_md_holds(server: &TestServer, text: &str) {
    within(STEP, &format!("{text:?} in session.md"), async {
        while !session_md(server).contains(text) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// Prompts "long task" and waits for the turn's first text; then runs `then` and drops the
/// turn's future (which resets its stream).
async fn at_first_text(agent: &Agent, then: impl FnOnce()) {
    let (first_text, got_text) = tokio::sync::oneshot::channel::<()>();
    let mut first_text = Some(first_text);
    let turn = agent.prompt(None, "long task", move |e| {
        if matches!(e, AgentEvent::Text { .. })
            && let Some(tx) = first_text.take()
        {
            let _ = tx.send(());
        }
    });
    tokio::select! {
        r = turn => panic!("the turn ended by itself: {r:?}"),
        _ = within(STEP, "the first text", got_text) => then(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_stops_the_model_and_keeps_what_it_said() {
    let provider = ScriptedProvider::start(vec![
        Reply::Hang {
            text: vec!["Working on it".into()],
        },
        Reply::text(["Back."]),
    ])
    .await;
    let server = server_for(&provider, ProviderKind::Openai, "").await;
    let agent = server.agent().await;
    // The prompt's future is dropped: its stream is reset.
    at_first_text(&agent, || {}).await;
    provider.wait_for_abandoned(1).await;
    until_session_md_holds(&server, "## Assistant\n\nWorking on it\n").await;
    // The session is free for the next turn.
    let (reply, events) = prompt(&agent, "still there?").await;
    assert_eq!(reply.result.stop, StopReason::Answered);
    assert_eq!(streamed_text(&events), "Back.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_mid_turn_keeps_what_the_model_said() {
    // The front goes away without cancelling first (its process ended, its network went):
    // the server sees the connection close, not the prompt's stream reset. The turn still ends
    // properly, and what the model said stays in session.md.
    let provider = ScriptedProvider::start(vec![Reply::Hang {
        text: vec!["Working on it".into()],
    }])
    .await;
    let server = server_for(&provider, ProviderKind::Openai, "").await;
    let agent = server.agent().await;
    at_first_text(&agent, || agent.quic().close(0u32.into(), b"gone")).await;
    provider.wait_for_abandoned(1).await;
    until_session_md_holds(&server, "## Assistant\n\nWorking on it\n").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_model_the_turn_fails_clearly_and_writes_nothing() {
    let server = TestServer::start().await;
    let agent = server.agent().await;
    let (reply, events) = prompt(&agent, "hello?").await;
    match &reply.result.stop {
        StopReason::Failed { message } => assert!(message.contains("model"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert!(events.is_empty());
    assert!(!session_md(&server).contains("hello?"));
}

/// A prompt's text counts against what a conversation holds, as a client's append does: a turn
/// whose question would take it past the bound fails before the model is asked, and keeps
/// nothing (each prompt of up to a request's size grew it without end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_past_what_a_conversation_holds_fails_and_keeps_nothing() {
    let provider = ScriptedProvider::start(vec![]).await;
    let server = server_for(&provider, ProviderKind::Openai, "").await;
    let agent = server.agent().await;
    let huge = "q".repeat(monad_server::store::MAX_HISTORY_BYTES as usize + 1);
    let (reply, _) = prompt(&agent, &huge).await;
    match &reply.result.stop {
        StopReason::Failed { message } => {
            assert!(message.contains("8 MiB one holds at most"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    assert!(!session_md(&server).contains("qqqq"));
    assert!(provider.requests().is_empty(), "the model was not asked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_error_ends_the_turn_with_its_message() {
    for kind in KINDS {
        let provider = ScriptedProvider::start(vec![Reply::Status {
            status: 400,
            message: "model `scripted-model` does not exist".into(),
            retry_after: None,
        }])
        .await;
        let server = server_for(&provider, kind, "").await;
        let agent = server.agent().await;
        let (reply, _) = prompt(&agent, "hi").await;
        match &reply.result.stop {
            StopReason::Failed { message } => {
                assert!(message.contains("does not exist"), "{message}");
                assert!(message.contains("400"), "{message}");
            }
            other => panic!("{kind:?}: {other:?}"),
        }
        assert!(
            session_md(&server).contains("## User\n\nhi\n"),
            "the question is kept"
        );
    }
}

/// A tool call's id goes to the editor with a permission request, and comes back with the
/// answer, which the server reads up to a bound: a longer one could never be answered (the
/// editor's "allow" was recorded as its rejection, and every restricted call after it refused).
/// Such a call ends the turn, saying why, and runs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_whose_id_could_not_be_answered_ends_the_turn() {
    let long = "c".repeat(monad_protocol::wire::MAX_CALL_ID_LEN + 1);
    let provider =
        ScriptedProvider::start(vec![Reply::tool_call(&long, "workspaces", json!({}))]).await;
    let server = server_for(&provider, ProviderKind::Openai, "").await;
    let agent = server.agent().await;
    let (reply, events) = prompt(&agent, "hi").await;
    match &reply.result.stop {
        StopReason::Failed { message } => {
            assert!(
                message.contains("a tool call whose id is over"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(reply.result.tool_calls, 0, "{events:?}");
}

/// An OpenAI chunk of `delta` and `finish` (null or a reason), as the API streams it.
fn openai_chunk(delta: Value, finish: Value) -> (Option<&'static str>, String) {
    let chunk = json!({"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 0,
                       "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    (None, chunk.to_string())
}

/// Regression: an answer cut at `llm.max_output_tokens` inside a call's arguments ran the call,
/// which was refused for arguments that are not an object; nothing told the model it had hit
/// its output limit, and it tried the same large write again step after step. The cut call
/// runs nothing and its answer says why; a whole call before it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cut_off_at_the_output_limit_runs_nothing_and_the_model_is_told_why() {
    let server =
        cut_off_after_a_whole_call("write_file", "{\"path\": \"big.txt\", \"content\": \"aaaa")
            .await;
    assert!(
        !server
            .data_dir()
            .join("sessions/default/workspace/big.txt")
            .exists()
    );
}

/// Regression: a call cut at the output limit before any of its arguments came read as `{}` and
/// ran (a `list_dir` of the root here, where the model may have meant any folder); it runs
/// nothing now, as a call cut inside its arguments, while an earlier whole call of `{}` runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cut_off_before_any_arguments_runs_nothing() {
    cut_off_after_a_whole_call("list_dir", "").await;
}

/// A turn whose answer (at `max_output_tokens = 300`) holds a whole `workspaces` call of `{}`,
/// then a call of `tool` whose arguments so far are `arguments` when the answer stops at the
/// limit: the whole call ran, the cut one ran nothing and its answer says why. Returns the
/// server, for what the cut call would have changed.
async fn cut_off_after_a_whole_call(tool: &str, arguments: &str) -> TestServer {
    let provider = ScriptedProvider::start(vec![
        Reply::Events(vec![
            openai_chunk(
                json!({"tool_calls": [{"index": 0, "id": "whole", "type": "function",
                        "function": {"name": "workspaces", "arguments": "{}"}}]}),
                Value::Null,
            ),
            openai_chunk(
                json!({"tool_calls": [{"index": 1, "id": "cut", "type": "function",
                        "function": {"name": tool, "arguments": arguments}}]}),
                Value::Null,
            ),
            openai_chunk(json!({}), json!("length")),
            (None, "[DONE]".into()),
        ]),
        Reply::text(["I will send less at once."]),
    ])
    .await;
    let server = server_for(&provider, ProviderKind::Openai, "max_output_tokens = 300\n").await;
    let agent = server.agent().await;
    let (reply, events) = prompt(&agent, "go on").await;
    assert_eq!(reply.result.stop, StopReason::Answered, "{events:?}");
    let requests = provider.wait_for_requests(2).await;
    let results = tool_results(&requests[1].body, ProviderKind::Openai);
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(
        results[0].contains("workspace"),
        "the whole call ran: {results:?}"
    );
    assert!(
        results[1].contains("cut off") && results[1].contains("300 tokens, llm.max_output_tokens"),
        "the cut call ran: {results:?}"
    );
    server
}

/// Regression: a call without an id (some OpenAI-compatible servers send none), or with an id
/// another call of the answer used, went back to the provider so, which refuses the next
/// request over it. Each call goes by one id of its own, in the model's message and its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_without_an_id_or_sharing_one_go_back_to_the_model_each_by_an_id_of_its_own() {
    let provider = ScriptedProvider::start(vec![
        Reply::Stream {
            text: Vec::new(),
            calls: vec![
                (String::new(), "workspaces".into(), json!({})),
                ("dup".into(), "workspaces".into(), json!({})),
                ("dup".into(), "workspaces".into(), json!({})),
            ],
            usage: (10, 5),
        },
        Reply::text(["Done."]),
    ])
    .await;
    let server = server_for(&provider, ProviderKind::Openai, "").await;
    let agent = server.agent().await;
    let (reply, events) = prompt(&agent, "look").await;
    assert_eq!(reply.result.stop, StopReason::Answered, "{events:?}");
    let requests = provider.wait_for_requests(2).await;
    let messages = requests[1].body["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let asked: Vec<String> = messages
        .iter()
        .filter_map(|m| m["tool_calls"].as_array())
        .flatten()
        .map(|c| c["id"].as_str().unwrap_or("").to_owned())
        .collect();
    let answered: Vec<String> = messages
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["tool_call_id"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(asked, answered);
    assert_eq!(asked.len(), 3, "{asked:?}");
    assert_eq!(asked[1], "dup");
    let unique: std::collections::BTreeSet<&String> = asked.iter().collect();
    assert_eq!(unique.len(), 3, "{asked:?}");
    assert!(asked.iter().all(|id| !id.is_empty()), "{asked:?}");
}

/// Regression: Anthropic's "overloaded" ended the turn, said in the stream before any of the
/// answer (`overloaded_error`) or as status 529, where a 429 is waited out. Both are now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_provider_is_waited_out_as_a_rate_limit() {
    let ev = |name: &'static str, v: Value| (Some(name), v.to_string());
    let provider = ScriptedProvider::start(vec![
        Reply::Events(vec![
            ev(
                "message_start",
                json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
                       "role": "assistant", "content": [], "model": "m", "stop_reason": null,
                       "stop_sequence": null, "usage": {"input_tokens": 5, "output_tokens": 1}}}),
            ),
            ev(
                "error",
                json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
            ),
        ]),
        Reply::Status {
            status: 529,
            message: "Overloaded again".into(),
            retry_after: Some(0),
        },
        Reply::text(["Here."]),
    ])
    .await;
    let server = server_for(&provider, ProviderKind::Anthropic, "").await;
    let agent = server.agent().await;
    let (reply, events) = prompt(&agent, "hi").await;
    assert_eq!(reply.result.stop, StopReason::Answered, "{events:?}");
    let retries: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Retrying { message, .. } => Some(message.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(retries, ["Overloaded", "Overloaded again"]);
    assert_eq!(streamed_text(&events), "Here.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_during_an_approval_withdraws_it_and_the_audit_says_cancelled() {
    let provider = ScriptedProvider::start(vec![Reply::tool_call(
        "c1",
        "read_file",
        json!({"path": "a.txt", "workspace": "lap"}),
    )])
    .await;
    let server = server_for(&provider, ProviderKind::Openai, "").await;
    let dir = folder(&[("a.txt", "alpha\n")]);
    // Nobody answers the laptop's prompt.
    let (_lap, approver) = Attachment::scripted(
        &server.client_config(),
        attach_options(dir.path(), "lap"),
        [None],
    )
    .await;
    let agent = server.agent().await;
    let (asked_tx, asked) = tokio::sync::oneshot::channel::<()>();
    let mut asked_tx = Some(asked_tx);
    let turn = agent.prompt(None, "read a.txt", move |e| {
        if let AgentEvent::ToolCallProgress { message, .. } = &e
            && message.contains("waiting for the user")
            && let Some(tx) = asked_tx.take()
        {
            let _ = tx.send(());
        }
    });
    tokio::select! {
        r = turn => panic!("the turn ended although nobody approved: {r:?}"),
        _ = within(STEP, "the approval prompt", asked) => {}
    }
    let lines = server.audit_lines("default", 1).await;
    assert_eq!(
        (&lines[0]["tool"], &lines[0]["outcome"]),
        (&json!("read_file"), &json!("cancelled")),
        "{lines:?}"
    );
    assert_eq!(approver.seen().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_prompt_while_a_turn_runs_is_refused() {
    let provider = ScriptedProvider::start(vec![Reply::Hang {
        text: vec!["Thinking".into()],
    }])
    .await;
    let server = server_for(&provider, ProviderKind::Anthropic, "").await;
    let agent = server.agent().await;
    let other = server.agent().await;
    let (started_tx, started) = tokio::sync::oneshot::channel::<()>();
    let mut started_tx = Some(started_tx);
    let turn = agent.prompt(None, "long task", move |_| {
        if let Some(tx) = started_tx.take() {
            let _ = tx.send(());
        }
    });
    tokio::pin!(turn);
    tokio::select! {
        r = &mut turn => panic!("the turn ended by itself: {r:?}"),
        _ = within(STEP, "the first turn to start", started) => {}
    }
    let refused = within(
        STEP,
        "the second prompt",
        other.prompt(None, "me too", |_| {}),
    )
    .await
    .expect_err("refused");
    refused_saying(refused, "already answering");
    assert!(!session_md(&server).contains("me too"), "nothing written");
}

/// Checks that `refused` is a `limit_exceeded` refusal whose message says `says`.
fn refused_saying(refused: monad_client::ClientError, says: &str) {
    match refused {
        monad_client::ClientError::Refused(error) => {
            assert_eq!(
                error.code,
                monad_protocol::ErrorCode::LimitExceeded,
                "{error:?}"
            );
            assert!(error.message.contains(says), "{says}: {error:?}");
        }
        other => panic!("{other:?}"),
    }
}

/// One user's turns of the built-in agent at once are bounded over all their sessions
/// (`server.max_turns_per_user`): each talks to the model with the operator's key, and one
/// user's turns in their every session at once spent the key's rate limit for every user.
/// Another user's turn is theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_users_turns_at_once_are_bounded_over_all_their_sessions() {
    let provider = ScriptedProvider::start(vec![
        Reply::Hang {
            text: vec!["Thinking".into()],
        },
        Reply::Stream {
            text: vec!["Hello".into()],
            calls: Vec::new(),
            usage: (1, 1),
        },
        Reply::Stream {
            text: vec!["Again".into()],
            calls: Vec::new(),
            usage: (1, 1),
        },
    ])
    .await;
    let toml = provider.llm_config(ProviderKind::Anthropic, "");
    let server = TestServer::start_with(|config| {
        std::fs::write(config.data_dir.join("config.toml"), toml).expect("config.toml written");
        config.quotas.max_turns_per_user = 1;
    })
    .await;
    let agent = server.agent().await;
    let [first, other] = [(); 2].map(|()| async {
        within(STEP, "a session", agent.open_session(None))
            .await
            .expect("a session")
            .id
    });
    let (first, other) = (first.await, other.await);
    let (started_tx, started) = tokio::sync::oneshot::channel::<()>();
    let mut started_tx = Some(started_tx);
    let turn = agent.prompt(Some(&first), "long task", move |_| {
        if let Some(tx) = started_tx.take() {
            let _ = tx.send(());
        }
    });
    let mut turn = Box::pin(turn);
    tokio::select! {
        r = &mut turn => panic!("the turn ended by itself: {r:?}"),
        _ = within(STEP, "the first turn to start", started) => {}
    }
    let refused = within(
        STEP,
        "a prompt in another session",
        agent.prompt(Some(&other), "me too", |_| {}),
    )
    .await
    .expect_err("refused");
    refused_saying(refused, "max_turns_per_user");
    // Ben's turn is his own.
    let ben = connect_agent(&server.client_config_with(&server.create_token("ben"))).await;
    let (reply, _) = prompt(&ben, "hi").await;
    assert_eq!(reply.result.stop, StopReason::Answered, "{reply:?}");
    // A message sent right after cancelling the turn waits for it to wind down, in its
    // session, rather than being refused for the turn it replaces.
    drop(turn);
    let again = within(
        STEP * 2,
        "the message after the cancel",
        agent.prompt(Some(&first), "again", |_| {}),
    )
    .await
    .expect("answered, not refused");
    assert_eq!(again.result.stop, StopReason::Answered, "{again:?}");
}

/// A real server process whose `[llm]` reads its key from `MONAD_CHAT_TEST_KEY` (set to `key`
/// in its environment only) and talks to `provider`, plus `extra` lines of `[llm]`.
async fn keyed_server_process(
    data: &std::path::Path,
    provider: &ScriptedProvider,
    key: &str,
    extra: &str,
) -> ServerProcess {
    std::fs::create_dir_all(data).unwrap();
    std::fs::write(
        data.join("config.toml"),
        format!(
            "[llm]\nprovider = \"openai\"\nbase_url = \"{}\"\nmodel = \"scripted-model\"\n\
             api_key_env = \"MONAD_CHAT_TEST_KEY\"\n{extra}",
            provider.openai_base_url()
        ),
    )
    .unwrap();
    ServerProcess::start(data, &[("MONAD_CHAT_TEST_KEY", key)]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_base_url_the_client_chose_never_receives_the_operators_key() {
    let key = "sk-operator-secret-0123456789";
    let operator = ScriptedProvider::start(vec![]).await;
    let attacker = ScriptedProvider::start(vec![Reply::text(["stolen"])]).await;
    let data = tempfile::tempdir().unwrap();
    let server = keyed_server_process(&data.path().join("d"), &operator, key, "").await;
    let token = server.first_token.clone().expect("first start");
    let agent = connect_agent(&server.client_config(&token)).await;
    let options = PromptOptions {
        model: None,
        base_url: Some(attacker.openai_base_url()),
    };
    let answer = within(
        STEP * 2,
        "the prompt",
        agent.prompt_with(None, "hello", &options, |_| {}),
    )
    .await;
    for request in attacker.requests() {
        assert!(
            !request.headers.values().any(|v| v.contains(key)),
            "the client-chosen base URL received the operator's key: {:?}",
            request.headers
        );
    }
    match answer {
        Err(monad_client::ClientError::Refused(error)) => {
            assert_eq!(error.code, monad_protocol::ErrorCode::Denied, "{error:?}");
            assert!(
                error.message.contains("allowed_base_urls"),
                "the refusal says how to allow it: {error:?}"
            );
        }
        other => panic!("a base URL the operator did not allow is refused: {other:?}"),
    }
    assert!(attacker.requests().is_empty(), "nothing was sent there");
    assert!(
        operator.requests().is_empty(),
        "nor to the operator's provider"
    );
}

/// The operator's key pays for whatever model a turn uses: with `llm.allowed_models` set, a
/// client may choose only those (and the session's own), so one user cannot run up the bill on
/// the most expensive model the key can reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_the_operator_did_not_allow_is_refused_before_the_provider_is_asked() {
    let key = "sk-operator-secret-0123456789";
    let operator = ScriptedProvider::start(vec![Reply::text(["from the small one"])]).await;
    let data = tempfile::tempdir().unwrap();
    let extra = "allowed_models = [\"small-*\"]\n";
    let server = keyed_server_process(&data.path().join("d"), &operator, key, extra).await;
    let token = server.first_token.clone().expect("first start");
    let agent = connect_agent(&server.client_config(&token)).await;
    let choose = |model: &str| PromptOptions {
        model: Some(model.to_owned()),
        base_url: None,
    };
    let refused = within(
        STEP,
        "the prompt",
        agent.prompt_with(None, "hello", &choose("huge-reasoner"), |_| {}),
    )
    .await;
    match refused {
        Err(monad_client::ClientError::Refused(error)) => {
            assert_eq!(error.code, monad_protocol::ErrorCode::Denied, "{error:?}");
            assert!(
                error.message.contains("huge-reasoner")
                    && error.message.contains("llm.allowed_models"),
                "the refusal names the model and how to allow it: {error:?}"
            );
        }
        other => panic!("a model the operator did not allow is refused: {other:?}"),
    }
    assert!(operator.requests().is_empty(), "the provider was not asked");
    // One the list allows is used for that prompt.
    let reply = within(
        STEP * 2,
        "the prompt",
        agent.prompt_with(None, "hello", &choose("small-2025"), |_| {}),
    )
    .await
    .expect("answered");
    assert_eq!(reply.result.stop, StopReason::Answered);
    let requests = operator.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].body["model"], json!("small-2025"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_base_url_and_model_the_operator_allowed_are_used_for_that_prompt() {
    let key = "sk-operator-secret-0123456789";
    let operator = ScriptedProvider::start(vec![]).await;
    let allowed = ScriptedProvider::start(vec![Reply::text(["from the allowed one"])]).await;
    let data = tempfile::tempdir().unwrap();
    let extra = format!("allowed_base_urls = [\"{}\"]\n", allowed.openai_base_url());
    let server = keyed_server_process(&data.path().join("d"), &operator, key, &extra).await;
    let token = server.first_token.clone().expect("first start");
    let agent = connect_agent(&server.client_config(&token)).await;
    let options = PromptOptions {
        model: Some("other-model".into()),
        base_url: Some(allowed.openai_base_url()),
    };
    let mut text = String::new();
    let reply = within(
        STEP * 2,
        "the prompt",
        agent.prompt_with(None, "hello", &options, |e| {
            if let AgentEvent::Text { text: t } = e {
                text.push_str(&t);
            }
        }),
    )
    .await
    .expect("answered");
    assert_eq!(reply.result.stop, StopReason::Answered);
    assert_eq!(text, "from the allowed one");
    let requests = allowed.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].body["model"], json!("other-model"));
    assert_eq!(
        requests[0].headers.get("authorization").map(String::as_str),
        Some(format!("Bearer {key}").as_str()),
        "an allowed URL gets the key"
    );
    assert!(operator.requests().is_empty());
    // Anything else is still refused, and an empty model too.
    for options in [
        PromptOptions {
            model: None,
            base_url: Some(format!("{}/", allowed.openai_base_url())),
        },
        PromptOptions {
            model: Some(" ".into()),
            base_url: None,
        },
    ] {
        let refused = within(
            STEP,
            "the prompt",
            agent.prompt_with(None, "again", &options, |_| {}),
        )
        .await;
        assert!(
            matches!(refused, Err(monad_client::ClientError::Refused(_))),
            "{options:?}: {refused:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_info_counts_the_messages_the_next_turn_sends_with_the_loops_own_trimming() {
    let provider = ScriptedProvider::start(vec![]).await;
    // A budget that holds the system prompt and the tools, and only the latest turns.
    let server = server_for(
        &provider,
        ProviderKind::Anthropic,
        "context_budget_tokens = 1\n",
    )
    .await;
    let agent = server.agent().await;
    let info = within(STEP, "chat_info", agent.chat_info(None))
        .await
        .unwrap();
    assert_eq!(
        (
            info.session.as_str(),
            info.provider.as_str(),
            info.model.as_str()
        ),
        ("default", "anthropic", "scripted-model")
    );
    assert_eq!((info.messages, info.context_messages), (0, 0));
    assert_eq!(info.workspaces[0].name, "primary");
    for (role, text) in [
        (HistoryRole::System, "be brief"),
        (HistoryRole::User, "one"),
        (HistoryRole::Assistant, "1"),
        (HistoryRole::User, "two"),
        (HistoryRole::Assistant, "2"),
    ] {
        agent
            .history_append(
                None,
                HistoryMessage {
                    role,
                    text: text.into(),
                },
            )
            .await
            .unwrap();
    }
    let info = agent.chat_info(None).await.unwrap();
    assert_eq!(info.messages, 5);
    assert_eq!(info.conversation_messages, 4);
    assert_eq!(
        info.context_messages, 0,
        "a budget smaller than the system prompt leaves every earlier turn out"
    );
    let roomy = TestServer::start_with(|_| {}).await;
    let agent = roomy.agent().await;
    for text in ["a", "b", "c"] {
        agent
            .history_append(
                None,
                HistoryMessage {
                    role: HistoryRole::User,
                    text: text.into(),
                },
            )
            .await
            .unwrap();
    }
    let info = agent.chat_info(None).await.unwrap();
    assert_eq!((info.conversation_messages, info.context_messages), (3, 3));
    assert_eq!(info.model, "", "no model set");
}

/// Optional: one real turn against a model server running on this machine, which the test
/// harness cannot install (no model weights are reachable from the package registries). Set
/// `MONAD_TEST_LIVE_LLM_URL` (an OpenAI-compatible base URL such as Ollama's
/// `http://127.0.0.1:11434/v1`, or an Anthropic-compatible one with
/// `MONAD_TEST_LIVE_LLM_PROVIDER=anthropic`) and `MONAD_TEST_LIVE_LLM_MODEL` (a model with tool
/// calling, e.g. `qwen2.5:3b`); `MONAD_TEST_LIVE_LLM_KEY_ENV` names the variable that holds a
/// key, when the server needs one. See `docs/agent.md`. Without them it says loudly that it did
/// not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_a_real_local_model_reads_a_file_through_a_tool_and_answers_from_it() {
    let (Ok(base_url), Ok(model)) = (
        std::env::var("MONAD_TEST_LIVE_LLM_URL"),
        std::env::var("MONAD_TEST_LIVE_LLM_MODEL"),
    ) else {
        eprintln!(
            "SKIPPED (optional, not run): no real model server. Set MONAD_TEST_LIVE_LLM_URL and \
             MONAD_TEST_LIVE_LLM_MODEL to run one turn against it (docs/agent.md)."
        );
        return;
    };
    let provider = std::env::var("MONAD_TEST_LIVE_LLM_PROVIDER").unwrap_or("openai".into());
    let key_env =
        std::env::var("MONAD_TEST_LIVE_LLM_KEY_ENV").unwrap_or("MONAD_TEST_UNSET_KEY".into());
    live_turn(&provider, &base_url, &model, &key_env).await;
}

/// The optional test's harness, run against the scripted provider playing a model that does what
/// was asked, so the optional test's own checks are known to work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_optional_real_model_turn_passes_with_a_model_that_does_what_it_is_asked() {
    let provider = ScriptedProvider::start(vec![
        Reply::tool_call(
            "c1",
            "read_file",
            json!({"path": "notes.txt", "workspace": "lap"}),
        ),
        Reply::text(["The secret word is ", &live_word(), "."]),
    ])
    .await;
    live_turn(
        "openai",
        &provider.openai_base_url(),
        "scripted-model",
        "MONAD_TEST_UNSET_KEY",
    )
    .await;
}

/// A word no model knows in advance, so an answer naming it can only come from the file.
fn live_word() -> String {
    format!("quokka{}", std::process::id())
}

/// One turn with `[llm]` set to the given provider: the model is asked to read a file in a
/// folder (attached with full trust, so nothing waits for a person) and name the word in it.
async fn live_turn(provider: &str, base_url: &str, model: &str, key_env: &str) {
    let toml = format!(
        "[llm]\nprovider = {provider:?}\nbase_url = {base_url:?}\nmodel = {model:?}\n\
         api_key_env = {key_env:?}\n"
    );
    let server = TestServer::start_with(|config| {
        std::fs::write(config.data_dir.join("config.toml"), toml).expect("config.toml written");
    })
    .await;
    let word = live_word();
    let dir = folder(&[("notes.txt", &format!("The secret word is {word}.\n"))]);
    let mut options = attach_options(dir.path(), "lap");
    options.trust = Trust::Full;
    let _lap = Attachment::start(&server.client_config(), options, None).await;
    let agent = server.agent().await;

    let mut events = Vec::new();
    let reply = within(
        Duration::from_secs(600),
        "the model's turn to end",
        agent.prompt(
            None,
            "Use the read_file tool to read notes.txt in the workspace `lap`, then tell me the \
             secret word it contains.",
            |e| events.push(e),
        ),
    )
    .await
    .expect("the prompt is answered");

    assert_eq!(reply.result.stop, StopReason::Answered, "{events:?}");
    let read = events.iter().any(
        |e| matches!(e, AgentEvent::ToolCallEnded { tool, error: None, .. } if tool == "read_file"),
    );
    assert!(read, "the model read the file through the tool: {events:?}");
    let answer = streamed_text(&events);
    assert!(
        answer.contains(&word),
        "the answer names the word: {answer}"
    );
    let md = session_md(&server);
    assert!(md.contains(&format!("model: {model}")), "{md}");
    assert!(md.contains(&word), "session.md holds the turn: {md}");
}

/// Regression: a provider's answer was bounded only in its raw bytes (64 MiB): one of 3.5
/// million tool calls took 3 GB of the server's memory, a 5 MB tool name went whole into the
/// audit log, and calls of 20 MB of arguments step after step grew the turn past 8 GB. An
/// answer holds at most 256 calls, names of at most 256 bytes, and a turn holds what the user's
/// calls may hold at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_providers_answer_and_a_turn_are_bounded_in_what_they_hold() {
    let many: Vec<(String, String, serde_json::Value)> = (0..300)
        .map(|i| (format!("c{i}"), "list_dir".to_owned(), json!({})))
        .collect();
    let long_name = vec![("c1".to_owned(), "x".repeat(300), json!({}))];
    for kind in [ProviderKind::Openai, ProviderKind::Anthropic] {
        for (calls, said) in [
            (many.clone(), "more than 256 tool calls"),
            (long_name.clone(), "a tool name of more than 256 bytes"),
        ] {
            let provider = ScriptedProvider::start(vec![Reply::Stream {
                text: vec![],
                calls,
                usage: (1, 1),
            }])
            .await;
            let server = server_for(&provider, kind, "").await;
            let agent = server.agent().await;
            let (reply, _) = prompt(&agent, "go").await;
            let StopReason::Failed { message } = &reply.result.stop else {
                panic!("{kind:?}: {:?}", reply.result.stop);
            };
            assert!(message.contains(said), "{kind:?}: {message}");
            assert_eq!(reply.result.tool_calls, 0, "{kind:?}: nothing ran");
        }
    }
    // Arguments larger than what the user's calls may hold at once end the turn.
    let big = vec![(
        "c1".to_owned(),
        "read_file".to_owned(),
        json!({"path": "a.txt", "junk": "x".repeat(2 * 1024 * 1024)}),
    )];
    let provider = ScriptedProvider::start(vec![Reply::Stream {
        text: vec![],
        calls: big,
        usage: (1, 1),
    }])
    .await;
    let server = server_for(
        &provider,
        ProviderKind::Openai,
        "[server]\nmax_call_bytes_per_user = 1048576\n",
    )
    .await;
    let agent = server.agent().await;
    let (reply, _) = prompt(&agent, "go").await;
    let StopReason::Failed { message } = &reply.result.stop else {
        panic!("{:?}", reply.result.stop);
    };
    assert!(message.contains("max_call_bytes_per_user"), "{message}");
    assert_eq!(reply.result.tool_calls, 0);
    assert_eq!(
        server.state().call_bytes_held("admin"),
        0,
        "let go with the turn"
    );
}

/// Processes the built-in agent's turn leaves running end when the token the turn was asked
/// with is revoked, as those a token's own calls start: a leaked token's turn left its loops
/// running until the server stopped. One moved to the background after a while
/// (`background_after_ms`) counts too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_tokens_turn_leaves_no_process_running() {
    let looping = |key: &str, value: Value| {
        let mut args = json!({"argv": ["sh", "-c", "while true; do sleep 0.1; done"]});
        args[key] = value;
        args
    };
    let provider = ScriptedProvider::start(vec![
        Reply::tool_call("c1", "run_command", looping("background", json!(true))),
        Reply::tool_call(
            "c2",
            "run_command",
            looping("background_after_ms", json!(50)),
        ),
        Reply::text(["Started two loops."]),
    ])
    .await;
    let server = server_for(&provider, ProviderKind::Openai, "").await;
    let leaked = server.create_token("carol");
    let kept = server.create_token("carol");
    let intruder = connect_agent(&server.client_config_with(&leaked)).await;
    let owner = connect_agent(&server.client_config_with(&kept)).await;
    prompt(&intruder, "start two loops").await;
    let running = || async {
        let (listing, _) =
            monad_tests::ok(monad_tests::call(&owner, "process_list", json!({})).await);
        listing["processes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["running"] == json!(true))
            .count()
    };
    assert_eq!(running().await, 2);
    let id = leaked.split('_').nth(1).expect("mnd_ID_SECRET");
    assert!(server.state().tokens.revoke(id).unwrap());
    within(Duration::from_secs(20), "the turn's loops to end", async {
        while running().await > 0 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
}

/// Regression: a front that stops reading its prompt's stream froze the turn: the server wrote
/// each event in the loop that polls the turn, and once QUIC's flow control held a write up,
/// the turn (its longest time, a cancel) was not polled again. The session stayed claimed
/// ("already answering"), and could not be deleted, until the connection died. Now the turn
/// ends at its longest time, and the session takes another prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_that_stops_reading_does_not_hold_its_turn_past_its_longest_time() {
    // Some 4 MB of text, past what QUIC lets the server write ahead of a reader.
    let piece = "x".repeat(2048);
    let provider = ScriptedProvider::start(vec![
        Reply::text(std::iter::repeat_n(piece, 2000)),
        Reply::text(["Second answer."]),
    ])
    .await;
    let server = server_for(&provider, ProviderKind::Openai, "max_turn_secs = 2\n").await;
    let (_endpoint, stuck, _) = monad_tests::connect_speaking(
        &server.client_config(),
        monad_protocol::wire::Role::Agent,
        monad_protocol::wire::PROTOCOL_MINOR,
    )
    .await;
    let (mut send, _recv_never_read) = stuck.open_bi().await.unwrap();
    let prompt_message = monad_protocol::wire::Message::Prompt {
        id: 1,
        session: None,
        text: "write a lot".into(),
        ask: false,
        model: None,
        base_url: None,
    };
    monad_protocol::io::write_message(&mut send, &prompt_message)
        .await
        .unwrap();
    provider.wait_for_requests(1).await;
    let agent = server.agent().await;
    let reply = within(STEP, "the session to take another prompt", async {
        loop {
            match agent.prompt(None, "and now?", |_| {}).await {
                Err(e) if e.to_string().contains("already answering") => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                other => return other.expect("the second prompt is answered"),
            }
        }
    })
    .await;
    assert_eq!(reply.result.stop, StopReason::Answered);
    drop(send);
}

/// A turn has a longest time (`llm.max_turn_secs`): a provider that sends a little and then
/// holds its stream within `idle_timeout_secs` held the turn, and the session, for as long as it
/// liked. The turn ends, saying why, and what the model said is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_ends_at_its_longest_time() {
    let provider = ScriptedProvider::start(vec![Reply::Hang {
        text: vec!["Thinking".into()],
    }])
    .await;
    let server = server_for(
        &provider,
        ProviderKind::Openai,
        "idle_timeout_secs = 600\nmax_turn_secs = 1\n",
    )
    .await;
    let agent = server.agent().await;
    let (reply, _) = prompt(&agent, "take your time").await;
    match &reply.result.stop {
        StopReason::Failed { message } => {
            assert!(message.contains("llm.max_turn_secs"), "{message}")
        }
        other => panic!("ended otherwise: {other:?}"),
    }
    provider.wait_for_abandoned(1).await;
    until_session_md_holds(&server, "## Assistant\n\nThinking\n").await;
}

/// A front asked about a turn's calls knows each by an id of its own: a model may give its calls
/// no id, or the same one twice, and a front's answer is matched to its question by the id, so
/// an editor's late "allow" for one call reached another that reused it (a review found it).
/// Here two calls without ids, and one reusing another's, are each asked about under an id no
/// other has, and the events of each call carry that id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_knows_each_call_by_an_id_no_other_call_of_the_turn_has() {
    let read = |path: &str| json!({"path": path, "workspace": "lap"});
    let provider = ScriptedProvider::start(vec![
        Reply::Stream {
            text: Vec::new(),
            calls: vec![
                (String::new(), "read_file".into(), read("a.txt")),
                (String::new(), "read_file".into(), read("b.txt")),
                ("call_1".into(), "read_file".into(), read("a.txt")),
                ("call_1".into(), "read_file".into(), read("b.txt")),
            ],
            usage: (10, 5),
        },
        Reply::text(["Nothing read."]),
    ])
    .await;
    let server = server_for(&provider, ProviderKind::Openai, "").await;
    let dir = folder(&[("a.txt", "a\n"), ("b.txt", "b\n")]);
    let (_lap, approver) = Attachment::scripted(
        &server.client_config(),
        attach_options(dir.path(), "lap"),
        [],
    )
    .await;
    let agent = server.agent().await;
    let (mut started, mut asked) = (Vec::new(), Vec::new());
    let reply = within(
        STEP * 2,
        "the turn to end",
        agent.prompt_asking(
            None,
            "read them",
            |event| {
                if let AgentEvent::ToolCallStarted { call_id, .. } = event {
                    started.push(call_id);
                }
            },
            |event| {
                if let AgentEvent::Permission { call_id, .. } = event {
                    asked.push(call_id.clone());
                }
                std::future::ready(false)
            },
        ),
    )
    .await
    .expect("the prompt is answered");
    assert_eq!(reply.result.tool_calls, 4);
    assert_eq!(
        asked, started,
        "each call asked about under the id it started with"
    );
    assert_eq!(asked.len(), 4);
    let unique: std::collections::HashSet<&String> = asked.iter().collect();
    assert_eq!(unique.len(), 4, "{asked:?}");
    assert!(asked.iter().all(|id| !id.is_empty()), "{asked:?}");
    assert_eq!(
        asked[2], "call_1",
        "a model's own id is kept when it is the first"
    );
    assert!(
        approver.seen().is_empty(),
        "the editor refused: the owner was never asked"
    );
}

/// The built-in agent's calls are refused, as every front's are, while the records of its
/// user's calls waiting for a store that does not keep up hold their limit: a model asking for
/// call after call does not grow what waits without bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_built_in_agents_calls_wait_for_the_store_as_other_calls_do() {
    let provider = ScriptedProvider::start(vec![
        Reply::Stream {
            text: vec!["hello".into()],
            calls: vec![],
            usage: (1, 1),
        },
        Reply::Stream {
            text: vec![],
            calls: vec![(
                "c1".into(),
                "write_file".into(),
                json!({"path": "one.txt", "content": "1"}),
            )],
            usage: (1, 1),
        },
        Reply::Stream {
            text: vec!["done".into()],
            calls: vec![],
            usage: (1, 1),
        },
    ])
    .await;
    let server = server_for(&provider, ProviderKind::Openai, "").await;
    let agent = server.agent().await;
    // A first turn records the model in the session (which waits for the recorder).
    prompt(&agent, "hello").await;
    // The store held up with the user's limit of records waiting.
    let release = server.hold_up_recorder(
        "admin",
        server.state().config.quotas.max_call_bytes_per_user,
    );
    let (reply, _) = prompt(&agent, "write a file").await;
    assert_eq!(reply.result.stop, StopReason::Answered);
    let requests = provider.requests();
    let results = tool_results(&requests[2].body, ProviderKind::Openai);
    assert!(
        results.len() == 1 && results[0].contains("records waiting to be written"),
        "{results:?}"
    );
    assert!(
        !server.primary_dir("default").join("one.txt").exists(),
        "the call ran"
    );
    release.send(()).expect("the recorder waits");
}
