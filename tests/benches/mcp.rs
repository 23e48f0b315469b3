//! The MCP front's cost: the same `read_file` of a 4 KiB file through four paths, timed in the
//! same run by the same client code.
//!
//! `cargo bench -p monad-tests --bench mcp` (add `-- --quick`, or set `MONAD_BENCH_QUICK=1`, for
//! a smoke run). The server runs in this process; the file sits in a folder attached through the
//! client library (so it is "remote": agent → server → attached client over QUIC loopback). The
//! paths:
//!
//! 1. `Agent::call`: the library path of `monad-client call`, no MCP.
//! 2. MCP over stdio: rmcp's client → the real `monad-client mcp` binary → QUIC as in 1.
//! 3. MCP over Streamable HTTP: rmcp's client → the server's `/mcp` (no QUIC hop to the server,
//!    one to the attached client).
//! 4. The reference MCP filesystem server (`@modelcontextprotocol/server-filesystem`, Node)
//!    reading the same file from its local disk (`read_text_file`), through the same rmcp client
//!    over stdio. Skipped, loudly, when it is not installed in `target/mcp-node` (`.ci/run`
//!    installs it).
//!
//! Each path is warmed up, then timed call by call in rounds that rotate which path goes first;
//! the report gives median and 99th percentile, and each MCP path's median against path 1 (the
//! MCP overhead) and against path 4. See `docs/benchmarks.md`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use monad_client::agent::Agent;
use monad_protocol::ToolClass;
use monad_protocol::wire::Outcome;
use monad_tests::{Attachment, TestServer, attach_options};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde_json::{Value, json};

/// Size of the file read.
const SIZE: usize = 4096;

/// One way to read the file.
enum Path {
    Library(Agent),
    Mcp(RunningService<RoleClient, ()>, &'static str, Value),
}

impl Path {
    async fn read(&self) {
        match self {
            Path::Library(agent) => {
                let reply = agent
                    .call(
                        None,
                        "read_file",
                        json!({"path": "bench.txt", "workspace": "laptop"}),
                        |_| {},
                    )
                    .await
                    .expect("the call answers");
                assert!(matches!(reply.outcome, Outcome::Ok { .. }));
            }
            Path::Mcp(client, tool, args) => {
                let params = CallToolRequestParams::new(*tool)
                    .with_arguments(args.as_object().cloned().unwrap_or_default());
                let result = client.call_tool(params).await.expect("tools/call answers");
                assert_ne!(result.is_error, Some(true), "{result:?}");
            }
        }
    }
}

fn stats(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

fn us(d: Duration) -> String {
    format!("{:.0} us", d.as_secs_f64() * 1e6)
}

fn reference_server() -> Option<PathBuf> {
    let bin = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/mcp-node/node_modules/.bin/mcp-server-filesystem");
    bin.exists().then_some(bin)
}

fn main() {
    let quick = monad_tests::bench::quick();
    let (warmup, rounds, per_round) = if quick { (50, 5, 100) } else { (300, 10, 500) };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(warmup, rounds, per_round));
}

async fn run(warmup: usize, rounds: usize, per_round: usize) {
    let free = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let http = free.local_addr().expect("its address");
    drop(free);
    let server = TestServer::start_with(|c| c.http = Some(http)).await;
    let dir = tempfile::tempdir().expect("folder");
    let line = "the quick brown fox jumps over the lazy dog, again and again.\n";
    let content: String = line.repeat(SIZE / line.len() + 1)[..SIZE].to_owned();
    std::fs::write(dir.path().join("bench.txt"), &content).expect("file");
    let mut options = attach_options(dir.path(), "laptop");
    options.allow = vec![ToolClass::Read];
    let _attached = Attachment::start(&server.client_config(), options, None).await;

    let mut paths: Vec<(&str, Path)> = Vec::new();
    let agent = Agent::connect(&server.client_config())
        .await
        .expect("agent");
    paths.push(("Agent::call (library, no MCP)", Path::Library(agent)));

    let config_dir = tempfile::tempdir().expect("config dir");
    server
        .client_config()
        .save(config_dir.path())
        .expect("config");
    // A temporary home and no MONAD_* from outside, like every child of the tests.
    let mut cmd = monad_tests::command("monad-client");
    cmd.arg("mcp")
        .stderr(std::process::Stdio::inherit())
        .env("MONAD_CONFIG_DIR", config_dir.path())
        .env("RUST_LOG", "warn")
        .kill_on_drop(true);
    let stdio = ().serve(TokioChildProcess::new(cmd).expect("monad-client mcp")).await;
    let args = json!({"path": "bench.txt", "workspace": "laptop"});
    paths.push((
        "MCP stdio (monad-client mcp)",
        Path::Mcp(stdio.expect("initialize"), "read_file", args.clone()),
    ));

    // reqwest has no process-wide crypto provider here: the client comes TLS-configured.
    let http_client = monad_server::llm::http_client_builder()
        .expect("TLS set up")
        .build()
        .expect("an HTTP client");
    let transport = StreamableHttpClientTransport::with_client(
        http_client,
        StreamableHttpClientTransportConfig::with_uri(format!("http://{http}/mcp"))
            .auth_header(server.token.clone()),
    );
    let over_http = ().serve(transport).await.expect("initialize over HTTP");
    paths.push((
        "MCP Streamable HTTP (server /mcp)",
        Path::Mcp(over_http, "read_file", args),
    ));

    match reference_server() {
        Some(bin) => {
            let mut cmd = tokio::process::Command::new("node");
            cmd.arg(bin).arg(dir.path()).kill_on_drop(true);
            let reference = ().serve(TokioChildProcess::new(cmd).expect("node")).await;
            let file = dir.path().join("bench.txt");
            paths.push((
                "reference server-filesystem (local disk)",
                Path::Mcp(
                    reference.expect("initialize the reference server"),
                    "read_text_file",
                    json!({"path": file.to_string_lossy()}),
                ),
            ));
        }
        None => eprintln!(
            "SKIPPED the reference MCP filesystem server: not in target/mcp-node (run .ci/run)"
        ),
    }

    for (_, path) in &paths {
        for _ in 0..warmup {
            path.read().await;
        }
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); paths.len()];
    for round in 0..rounds {
        for k in 0..paths.len() {
            let i = (round + k) % paths.len();
            for _ in 0..per_round {
                let start = Instant::now();
                paths[i].1.read().await;
                samples[i].push(start.elapsed());
            }
        }
    }
    let medians: Vec<(Duration, Duration)> = samples.into_iter().map(stats).collect();
    println!(
        "read_file of a {SIZE} B file, {} calls per path ({} rounds), median / p99:",
        rounds * per_round,
        rounds
    );
    let library = medians[0].0.as_secs_f64();
    let reference = (paths.len() == 4).then(|| medians[3].0.as_secs_f64());
    for ((name, _), (p50, p99)) in paths.iter().zip(&medians) {
        let mut line = format!("  {name:<42} {:>8} {:>8}", us(*p50), us(*p99));
        line.push_str(&format!(
            "   x{:.2} of library",
            p50.as_secs_f64() / library
        ));
        if let Some(reference) = reference {
            line.push_str(&format!(
                ", x{:.2} of reference",
                p50.as_secs_f64() / reference
            ));
        }
        println!("{line}");
    }
}
