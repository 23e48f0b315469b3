//! The built-in agent loop's own cost, with the model's time taken out: a real server whose
//! `[llm]` points at the scripted provider (an instant model on loopback), an agent prompting
//! over QUIC (`Agent::prompt`), a folder attached with full trust (nothing prompts).
//!
//! Figures (see `docs/benchmarks.md`, "The built-in agent"):
//! - (a) one tool round trip inside a turn: a turn whose model asks for one `read_file` of a
//!   4 KiB file and then answers, minus a turn whose model only answers; set against what the
//!   round trip must cost anyway: the same call made directly (`Agent::call`) plus one more
//!   model request (Monad's own provider client against the same scripted server).
//! - (b) first token: from sending the prompt to the first streamed text at the front, against
//!   the provider client's own time to its first text event for the same kind of request.
//!
//! ```text
//! cargo bench -p monad-tests --bench agent              # full run
//! cargo bench -p monad-tests --bench agent -- --quick   # smoke run
//! ```

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use monad_client::agent::Agent;
use monad_protocol::agent::AgentEvent;
use monad_protocol::wire::Trust;
use monad_server::llm::{self, Endpoint, HttpProvider, Provider, ProviderKind, Request};
use monad_tests::bench::{Stats, fmt_dur};
use monad_tests::provider::{Reply, ScriptedProvider};
use monad_tests::{Attachment, TestServer, attach_options};
use serde_json::json;

fn main() {
    let quick = monad_tests::bench::quick();
    let (warmup, rounds) = if quick { (10, 40) } else { (50, 400) };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(warmup, rounds));
}

/// One prompt; returns its time and the time to its first streamed text.
async fn prompt(agent: &Agent, text: &str) -> (Duration, Duration) {
    let start = Instant::now();
    let mut first = None;
    let reply = agent
        .prompt(None, text, |e| {
            if matches!(e, AgentEvent::Text { .. }) && first.is_none() {
                first = Some(start.elapsed());
            }
        })
        .await
        .expect("the turn is answered");
    let total = start.elapsed();
    assert!(
        matches!(
            reply.result.stop,
            monad_protocol::agent::StopReason::Answered
        ),
        "the turn ends with the model's answer: {:?}",
        reply.result.stop
    );
    (total, first.expect("the turn streamed text"))
}

/// One request through Monad's own provider client: its time to the first text and to the end.
async fn direct(provider: &HttpProvider, request: &Request) -> (Duration, Duration) {
    let start = Instant::now();
    let mut stream = provider
        .stream(request)
        .await
        .expect("the provider answers");
    let mut first = None;
    while let Some(event) = stream.next().await {
        if matches!(event.expect("a good stream"), llm::Event::Text(_)) && first.is_none() {
            first = Some(start.elapsed());
        }
    }
    (start.elapsed(), first.expect("the answer had text"))
}

async fn run(warmup: usize, rounds: usize) {
    let provider = ScriptedProvider::start(Vec::new()).await;
    let base_url = provider.openai_base_url();
    let toml = provider.llm_config(ProviderKind::Openai, "");
    let server = TestServer::start_with(|config| {
        std::fs::write(config.data_dir.join("config.toml"), toml).expect("config.toml written");
    })
    .await;
    let dir = tempfile::tempdir().expect("folder");
    let line = "the quick brown fox jumps over the lazy dog, again and again.\n";
    std::fs::write(dir.path().join("small.txt"), &line.repeat(70)[..4096]).expect("file");
    let mut options = attach_options(dir.path(), "bench");
    options.trust = Trust::Full;
    let _attached = Attachment::start(&server.client_config(), options, None).await;
    let agent = Agent::connect(&server.client_config())
        .await
        .expect("agent");
    let client = HttpProvider::new(Endpoint {
        kind: ProviderKind::Openai,
        base_url: base_url.clone(),
        api_key: None,
        idle_timeout: Duration::from_secs(30),
    })
    .expect("provider client");
    // The kind of request the loop sends for a short turn: the system prompt, one message, the
    // session's tools as the model sees them.
    let request = Request {
        model: "scripted-model".into(),
        system: "You are a test.".into(),
        messages: vec![llm::Message::User("read small.txt".into())],
        tools: Vec::new(),
        max_output_tokens: 1024,
    };
    let args = json!({"path": "small.txt", "workspace": "bench"});

    let mut plain = Vec::new();
    let mut with_tool = Vec::new();
    let mut call = Vec::new();
    let mut model = Vec::new();
    let mut first_front = Vec::new();
    let mut first_direct = Vec::new();
    for round in 0..warmup + rounds {
        // A fresh conversation each round, so every turn sends the same context.
        agent.history_clear(None).await.expect("history cleared");
        provider.push([
            Reply::text(["It ", "says ", "hello."]),
            Reply::tool_call("call_1", "read_file", args.clone()),
            Reply::text(["Read ", "it."]),
            Reply::text(["It ", "says ", "hello."]),
        ]);
        let (t_plain, t_first) = prompt(&agent, "say hello").await;
        let (t_tool, _) = prompt(&agent, "read small.txt").await;
        let start = Instant::now();
        agent
            .call(None, "read_file", args.clone(), |_| {})
            .await
            .expect("direct call");
        let t_call = start.elapsed();
        let (t_model, t_model_first) = direct(&client, &request).await;
        if round >= warmup {
            plain.push(t_plain);
            with_tool.push(t_tool);
            call.push(t_call);
            model.push(t_model);
            first_front.push(t_first);
            first_direct.push(t_model_first);
        }
    }
    let plain = Stats::of(&mut plain);
    let with_tool = Stats::of(&mut with_tool);
    let call = Stats::of(&mut call);
    let model = Stats::of(&mut model);
    let first_front = Stats::of(&mut first_front);
    let first_direct = Stats::of(&mut first_direct);
    let round_trip = with_tool.median.saturating_sub(plain.median);
    let floor = call.median + model.median;
    let added_first = first_front.median.saturating_sub(first_direct.median);
    println!("built-in agent bench ({rounds} rounds, {warmup} warm-up; medians / p99)");
    println!("  turn, model answers at once          {}", plain.show());
    println!(
        "  turn, one read_file then the answer  {}",
        with_tool.show()
    );
    println!("  read_file 4 KiB by Agent::call       {}", call.show());
    println!("  one model request (provider client)  {}", model.show());
    println!(
        "(a) tool round trip in a turn: {} (difference of medians); floor: call + model request \
         {}; the loop adds {}",
        fmt_dur(round_trip),
        fmt_dur(floor),
        fmt_dur(round_trip.saturating_sub(floor))
    );
    println!(
        "(b) first token: at the front {}; provider client alone {}; Monad adds {}",
        first_front.show(),
        first_direct.show(),
        fmt_dur(added_first)
    );
}
