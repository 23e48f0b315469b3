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
//! With `MONAD_BENCH_LIST=1`, the four paths list a 1,000-entry directory (`list_dir`, the
//! reference's `list_directory`) instead, which shows what each hop costs for a larger result.
//! `MONAD_BENCH_SIZE=N` makes the file the four paths read N bytes instead of 4 KiB.
//!
//! Each path is warmed up, then timed call by call in rounds that rotate which path goes first;
//! the report gives median and 99th percentile, and each MCP path's median against path 1 (the
//! MCP overhead) and against path 4.
//!
//! Then, with the official MCP Python SDK as the client (`tests/python/bench_mcp.py`, run by the
//! interpreter of `target/mcp-venv`, or `$MONAD_TEST_PYTHON`): `monad-client mcp` (path 2)
//! against the reference server on the same folder, over stdio, for a 4 KiB read, a 248 KiB read
//! (whole) and a 1,000-entry listing; target: Monad's median at most 1.0x the reference's. For
//! these, Monad runs as a user runs it: the `monad-server` binary and a `monad-client attach`
//! process, each in a process of its own (the paths above share this process with the server
//! and the attached client). Skipped, loudly, without the venv or the reference server. With
//! `MONAD_BENCH_PIN=1` the client runs on the first CPU only and every server process (each
//! side's stdio server, Monad's server and attached client) on the last, so that the client's
//! work never shares a core with the servers'. Each line also gives the client's own CPU per
//! call. See `docs/benchmarks.md`.

use std::path::{Path as FsPath, PathBuf};
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
    Library(Agent, &'static str, Value),
    Mcp(RunningService<RoleClient, ()>, &'static str, Value),
}

impl Path {
    async fn read(&self) {
        match self {
            Path::Library(agent, tool, args) => {
                let reply = agent
                    .call(None, tool, args.clone(), |_| {})
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

/// The Python with the MCP SDK, if there is one.
fn python() -> Option<PathBuf> {
    let candidate = match std::env::var_os("MONAD_TEST_PYTHON") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/mcp-venv/bin/python"),
    };
    let works = std::process::Command::new(&candidate)
        .args(["-c", "import mcp"])
        .output()
        .is_ok_and(|o| o.status.success());
    works.then_some(candidate)
}

fn main() {
    let quick = monad_tests::bench::quick();
    let (warmup, rounds, per_round) = if quick { (50, 5, 100) } else { (300, 10, 500) };
    let only = std::env::var("MONAD_BENCH_ONLY").unwrap_or_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(quick, &only, warmup, rounds, per_round));
}

async fn run(quick: bool, only: &str, warmup: usize, rounds: usize, per_round: usize) {
    let free = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let http = free.local_addr().expect("its address");
    drop(free);
    let server = TestServer::start_with(|c| c.http = Some(http)).await;
    let dir = tempfile::tempdir().expect("folder");
    let line = "the quick brown fox jumps over the lazy dog, again and again.\n";
    let size = std::env::var("MONAD_BENCH_SIZE").map_or(SIZE, |s| {
        s.parse()
            .unwrap_or_else(|_| panic!("MONAD_BENCH_SIZE={s}: a number of bytes, please"))
    });
    let content: String = line.repeat(size / line.len() + 1)[..size].to_owned();
    std::fs::write(dir.path().join("bench.txt"), &content).expect("file");
    for (name, size) in [("small.txt", 4096), ("large.txt", 248 * 1024)] {
        let content = &line.repeat(size / line.len() + 1)[..size];
        std::fs::write(dir.path().join(name), content).expect("file");
    }
    std::fs::create_dir(dir.path().join("many")).expect("dir");
    for i in 0..1000 {
        std::fs::write(dir.path().join(format!("many/f{i:04}.txt")), "x").expect("file");
    }
    let mut options = attach_options(dir.path(), "laptop");
    options.allow = vec![ToolClass::Read];
    let _attached = Attachment::start(&server.client_config(), options, None).await;

    let config_dir = tempfile::tempdir().expect("config dir");
    server
        .client_config()
        .save(config_dir.path())
        .expect("config");
    if only.is_empty() || only.contains("python") {
        python_sdk(quick, dir.path()).await;
    }
    if !only.is_empty() && !only.contains("rmcp") {
        return;
    }

    let mut paths: Vec<(&str, Path)> = Vec::new();
    let agent = Agent::connect(&server.client_config())
        .await
        .expect("agent");
    // `MONAD_BENCH_LIST=1`: the four paths list the 1,000-entry directory instead of reading.
    let list = std::env::var_os("MONAD_BENCH_LIST").is_some();
    let (tool, args, their_tool, their_args) = if list {
        (
            "list_dir",
            json!({"path": "many", "workspace": "laptop"}),
            "list_directory",
            json!({"path": dir.path().join("many").to_string_lossy()}),
        )
    } else {
        (
            "read_file",
            json!({"path": "bench.txt", "workspace": "laptop"}),
            "read_text_file",
            json!({"path": dir.path().join("bench.txt").to_string_lossy()}),
        )
    };
    paths.push((
        "Agent::call (library, no MCP)",
        Path::Library(agent, tool, args.clone()),
    ));

    // A temporary home and no MONAD_* from outside, like every child of the tests.
    let mut cmd = monad_tests::command("monad-client");
    cmd.arg("mcp")
        .stderr(std::process::Stdio::inherit())
        .env("MONAD_CONFIG_DIR", config_dir.path())
        .env("RUST_LOG", "warn")
        .kill_on_drop(true);
    let stdio = ().serve(TokioChildProcess::new(cmd).expect("monad-client mcp")).await;
    paths.push((
        "MCP stdio (monad-client mcp)",
        Path::Mcp(stdio.expect("initialize"), tool, args.clone()),
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
        Path::Mcp(over_http, tool, args),
    ));

    match reference_server() {
        Some(bin) => {
            let mut cmd = tokio::process::Command::new("node");
            cmd.arg(bin).arg(dir.path()).kill_on_drop(true);
            let reference = ().serve(TokioChildProcess::new(cmd).expect("node")).await;
            paths.push((
                "reference server-filesystem (local disk)",
                Path::Mcp(
                    reference.expect("initialize the reference server"),
                    their_tool,
                    their_args,
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
    let what = if list {
        "list_dir of 1,000 entries".to_owned()
    } else {
        format!("read_file of a {SIZE} B file")
    };
    println!(
        "{what}, {} calls per path ({} rounds), median / p99:",
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

/// What the Python bench scripts share: the interpreter, the folder, the client's config, the
/// reference server and the rounds.
struct Scripts<'a> {
    python: PathBuf,
    dir: &'a FsPath,
    config_dir: &'a FsPath,
    reference: PathBuf,
    rounds: usize,
    per_round: usize,
}

impl Scripts<'_> {
    /// Runs `tests/python/<script>` on the shared arguments and `extra`; its standard output.
    async fn run(&self, script: &str, extra: &[&str]) -> String {
        let output = tokio::process::Command::new(&self.python)
            .arg(
                PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("python")
                    .join(script),
            )
            .arg("--client")
            .arg(monad_tests::binary("monad-client"))
            .arg("--config-dir")
            .arg(self.config_dir)
            .args(["--workspace", "laptop"])
            .arg("--dir")
            .arg(self.dir)
            .arg("--reference")
            .arg(&self.reference)
            .args(["--rounds", &self.rounds.to_string()])
            .args(["--per-round", &self.per_round.to_string()])
            .args(extra)
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true)
            .output()
            .await
            .expect("python runs");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "{script} failed ({}):\n{stdout}",
            output.status
        );
        stdout
    }
}

/// Monad as a user runs it: `monad-server` in a process of its own, and `dir` attached as
/// `laptop` (read pre-approved) by a `monad-client attach` process of its own, each with the
/// runtime its binary starts. The client's config (logged in as the first user) is in
/// `config_dir`; everything stops when this drops.
struct AsUsersRunIt {
    config_dir: tempfile::TempDir,
    server: monad_tests::ServerProcess,
    _data: tempfile::TempDir,
    attach: tokio::process::Child,
    _drain: tokio::task::JoinHandle<()>,
}

impl AsUsersRunIt {
    async fn start(dir: &FsPath) -> AsUsersRunIt {
        use tokio::io::AsyncBufReadExt;
        let (server, data, config_dir) = monad_tests::ServerProcess::logged_in().await;
        let mut attach = monad_tests::command("monad-client")
            .arg("attach")
            .arg(dir)
            .args(["--name", "laptop", "--non-interactive", "--allow", "read"])
            .env("MONAD_CONFIG_DIR", config_dir.path())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("monad-client attach starts");
        let mut attach_err =
            tokio::io::BufReader::new(attach.stderr.take().expect("piped")).lines();
        monad_tests::wait_for_line(
            &mut attach_err,
            Duration::from_secs(30),
            "the attach confirmation",
            |l| l.starts_with("attached "),
        )
        .await;
        // Two lines per call: read, so that the pipe never fills.
        let drain =
            tokio::spawn(async move { while let Ok(Some(_)) = attach_err.next_line().await {} });
        AsUsersRunIt {
            config_dir,
            server,
            _data: data,
            attach,
            _drain: drain,
        }
    }
}

/// The Python SDK cases: `monad-client mcp` against the reference server, in one run of
/// `tests/python/bench_mcp.py`, which checks both sides' answers and prints one JSON line per case.
/// Monad's server and attached client are the real binaries here ([`AsUsersRunIt`]), as the
/// issue's comparison with a local server is about what a user runs.
async fn python_sdk(quick: bool, dir: &FsPath) {
    let Some(python) = python() else {
        eprintln!(
            "SKIPPED the Python SDK cases: no Python with the MCP SDK (set MONAD_TEST_PYTHON, or \
             run scripts/test, which creates target/mcp-venv)"
        );
        return;
    };
    let Some(reference) = reference_server() else {
        eprintln!("SKIPPED the Python SDK cases: no reference server in target/mcp-node");
        return;
    };
    let (warmup, rounds, per_round) = if quick { (10, 2, 20) } else { (50, 10, 100) };
    let monad = AsUsersRunIt::start(dir).await;
    let scripts = Scripts {
        python,
        dir,
        config_dir: monad.config_dir.path(),
        reference,
        rounds,
        per_round,
    };
    let case = std::env::var("MONAD_BENCH_CASE").unwrap_or_default();
    let warmup = warmup.to_string();
    let mut extra = vec!["--warmup", &warmup, "--only", &case];
    // `MONAD_BENCH_PIN=1`: the client on one core, every server process on the other.
    let pinned = std::env::var_os("MONAD_BENCH_PIN").is_some();
    let pids = pinned.then(|| {
        let attach = monad.attach.id().expect("running");
        format!("{},{attach}", monad.server.pid())
    });
    if let Some(pids) = &pids {
        extra.extend(["--pin-servers", pids]);
    }
    let stdout = scripts.run("bench_mcp.py", &extra).await;
    println!(
        "Python SDK over stdio: monad-client mcp (attached folder) against the reference server \
         (local disk), median / p99, target: Monad's median <= 1.0x{}:",
        if pinned {
            "; pinned: the client on one core, the servers on the other"
        } else {
            ""
        }
    );
    for line in stdout.lines() {
        let case: Value = serde_json::from_str(line).expect("a JSON line");
        let side = |s: &str| {
            (
                case[s]["median_us"].as_f64().expect("median"),
                case[s]["p99_us"].as_f64().expect("p99"),
            )
        };
        let ((m50, m99), (r50, r99)) = (side("monad"), side("reference"));
        let ratio = m50 / r50;
        let mut rounds: Vec<f64> = case["round_ratios"]
            .as_array()
            .expect("round_ratios")
            .iter()
            .map(|r| r.as_f64().expect("a ratio"))
            .collect();
        rounds.sort_by(f64::total_cmp);
        let sdk = |s: &str| case[s]["sdk_us"].as_f64().expect("sdk_us");
        let cpu = |s: &str| case[s]["client_cpu_us"].as_f64().expect("client_cpu_us");
        println!(
            "  {:<20} Monad {:>8.0} us {:>8.0} us   reference {:>8.0} us {:>8.0} us   x{ratio:.2} {}  ({} calls each; per round x{:.2} to x{:.2}; the SDK's own parse and check of one answer: Monad {:.0} us, reference {:.0} us; the client's CPU per call: Monad {:.0} us, reference {:.0} us; pieces the SDK read an answer in: Monad {}, reference {})",
            case["case"].as_str().unwrap_or("?"),
            m50,
            m99,
            r50,
            r99,
            if ratio <= 1.0 { "PASS" } else { "OVER" },
            case["calls"],
            rounds.first().copied().unwrap_or(f64::NAN),
            rounds.last().copied().unwrap_or(f64::NAN),
            sdk("monad"),
            sdk("reference"),
            cpu("monad"),
            cpu("reference"),
            case["monad"]["pieces"],
            case["reference"]["pieces"],
        );
    }

    // The same calls without an SDK: what each server's processes take on their own.
    let stdout = scripts.run("raw_mcp.py", &[]).await;
    println!(
        "The same calls without an SDK (tests/python/raw_mcp.py: JSON-RPC lines over the same \
         pipes, blocking reads), medians:"
    );
    for line in stdout.lines() {
        println!("  {line}");
    }
}
