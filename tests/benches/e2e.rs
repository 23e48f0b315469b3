//! Monad end to end against raw QUIC, timed in the same run on the same machine.
//!
//! `cargo bench -p monad-tests --bench e2e` (add `-- --quick`, or set `MONAD_BENCH_QUICK=1`, for
//! a smoke run). The server is the real `monad-server` binary in its own process (built on first
//! use, like the end-to-end suite does); the agent and the attached clients run in this process.
//! The raw QUIC peer is this same executable re-run as `--echo-server`, also in its own process,
//! with the same rustls (ring, TLS 1.3) and quinn transport settings as Monad. See
//! `docs/benchmarks.md`.
//!
//! Figures:
//! - (a) `read_file` of a 4 KiB file, agent → server → attached client and back, p50 and p99,
//!   against a raw QUIC round trip of the same payload (fresh bidirectional stream per request).
//!   Target: p50 at most 3x the raw echo's p50.
//! - (b) `read_file` of a 64 MiB text file through the same path, in MiB/s, against one raw QUIC
//!   stream carrying 64 MiB. Target: at least 50% of the raw throughput.
//! - (c) 1,000 clients (50 in a quick run) attached at once to a fresh server process, calls
//!   running on all of them concurrently (every one must succeed). Target: at most 50 KiB of
//!   server RSS per attached client, measured when the server is idle again.
//!
//! For information, (a) and (b) also time the same bytes through a raw QUIC relay (the raw peer
//! fetching them from an origin in this process, like Monad's server from the attached client):
//! the floor of any design with two hops, on this machine.
//!
//! `MONAD_BENCH_ALONE=monad|echo|relay|routed` (with `MONAD_BENCH_ONLY=a`) runs one of figure (a)'s
//! operations alone, back to back, for `MONAD_BENCH_ALONE_SECS` (10 by default), to read CPU,
//! datagrams and context switches per call from outside.

use monad_tests::bench::{Stats, fmt_dur};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use monad_client::agent::Agent;
use monad_client::attach::{AttachEvent, AttachOptions, attach};
use monad_client::config::ClientConfig;
use monad_protocol::wire::{Outcome, Role, Trust};
use monad_sandbox::Limits;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Size of the small file (figure a).
const SMALL: usize = 4096;
/// Size of the large file (figure b).
const LARGE: usize = 64 * 1024 * 1024;
/// Length of every line of both files, newline included.
const LINE: usize = 64;
/// Attached clients (figure c), in a full run and in a quick one.
const CLIENTS: usize = 1000;
const CLIENTS_QUICK: usize = 50;
/// Agents sharing the concurrent calls of figure c: each connection takes at most 64 requests
/// in flight, so `IN_FLIGHT` concurrent calls need several.
const AGENTS: usize = 8;
/// Calls of figure c in flight at once, over the `AGENTS` connections.
const IN_FLIGHT: usize = 200;
/// Clients of figure c attaching at the same time (under the server's 32 pending handshakes per
/// address).
const HANDSHAKING: usize = 24;
/// ALPN of the raw peer.
const RAW_ALPN: &[u8] = b"bench-echo";

// ---------------------------------------------------------------------------------------------
// Statistics and output

fn mib_per_s(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / (1024.0 * 1024.0) / d.as_secs_f64()
}

fn header() {
    println!(
        "{:<34} {:>30} {:>30} {:>8} {:>11}  verdict",
        "figure", "monad", "raw quic", "ratio", "target"
    );
    println!("{}", "-".repeat(126));
}

fn line(figure: &str, monad: &str, raw: &str, ratio: &str, target: &str, verdict: &str) {
    println!("{figure:<34} {monad:>30} {raw:>30} {ratio:>8} {target:>11}  {verdict}");
}

fn verdict(pass: bool) -> &'static str {
    if pass { "PASS" } else { "OVER" }
}

/// The timed iterations of a figure: the variable `name` when set, else `default`.
fn iters_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------------------------
// Fixtures

/// `len` bytes of text in lines of [`LINE`] bytes, the first characters of each line being its
/// number (so that files differ and a wrong answer is caught).
fn text(len: usize, tag: usize) -> String {
    assert_eq!(len % LINE, 0);
    let mut text = String::with_capacity(len);
    for i in 0..len / LINE {
        let line = format!("{tag:04} {i:08} the quick brown fox jumps over the lazy dog");
        text.push_str(&format!("{line:<width$}\n", width = LINE - 1));
    }
    assert_eq!(text.len(), len);
    text
}

// ---------------------------------------------------------------------------------------------
// Child processes

/// A child process killed (and reaped) when this handle drops.
struct Proc {
    child: Child,
    /// Kept open: the child may still write to it, and the echo server exits when its stdin
    /// closes.
    _stdout: BufReader<std::process::ChildStdout>,
}

impl Proc {
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads stdout lines until one starts with `prefix`; panics with what was read otherwise.
fn read_until_line(out: &mut BufReader<std::process::ChildStdout>, prefixes: &[&str]) -> String {
    let mut seen = String::new();
    loop {
        let mut l = String::new();
        match out.read_line(&mut l) {
            Ok(0) | Err(_) => {
                panic!("the child ended before printing `{prefixes:?}…`; it said:\n{seen}")
            }
            Ok(_) if prefixes.iter().any(|p| l.starts_with(p)) => return l.trim_end().to_owned(),
            Ok(_) => seen.push_str(&l),
        }
    }
}

/// The real `monad-server` in a fresh data dir, and what its first start printed.
struct MonadServer {
    proc: Proc,
    addr: String,
    token: String,
    fingerprint: String,
    data: tempfile::TempDir,
}

impl MonadServer {
    /// Starts `binary` on a fresh data dir whose `config.toml` is `config` (if any).
    /// MONAD_BENCH_SERVER_TOML, when set, is the `config.toml` instead (for experiments).
    fn start(binary: &Path, config: Option<&str>) -> MonadServer {
        let data = tempfile::Builder::new()
            .prefix("monad-bench-server-")
            .tempdir()
            .expect("temporary data dir");
        if let Some(toml) = std::env::var("MONAD_BENCH_SERVER_TOML")
            .ok()
            .or(config.map(str::to_owned))
        {
            std::fs::create_dir_all(data.path().join("data")).expect("data dir");
            std::fs::write(data.path().join("data/config.toml"), toml).expect("config.toml");
        }
        // Its log (warnings and up) goes to a file beside the data dir, shown if not empty.
        let log = std::fs::File::create(data.path().join("server.log")).expect("log file");
        let mut child = Command::new(binary)
            .arg("--data-dir")
            .arg(data.path().join("data"))
            .args(["--listen", "127.0.0.1:0", "--no-http"])
            .env_remove("MONAD_DATA_DIR")
            .env_remove("MONAD_CONFIG_DIR")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        // `MONAD_TOKEN=TOKEN monad-client login --server ADDR --fingerprint HEX`; a server
        // older than that (MONAD_BENCH_SERVER) printed `monad-client login ... --token TOKEN`.
        let login = read_until_line(&mut stdout, &["MONAD_TOKEN=", "monad-client login"]);
        let words: Vec<&str> = login.split_whitespace().collect();
        let after = |flag: &str| {
            let at = words.iter().position(|w| *w == flag).expect("flag printed");
            words[at + 1].to_owned()
        };
        let token = match words[0].strip_prefix("MONAD_TOKEN=") {
            Some(token) => token.to_owned(),
            None => after("--token"),
        };
        MonadServer {
            addr: after("--server"),
            token,
            fingerprint: after("--fingerprint"),
            proc: Proc {
                child,
                _stdout: stdout,
            },
            data,
        }
    }

    /// Prints the warnings and errors the server logged so far, if any.
    fn show_log(&self) {
        let log = std::fs::read_to_string(self.data.path().join("server.log")).unwrap_or_default();
        let noted: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .collect();
        if !noted.is_empty() {
            println!("    the server logged:\n      {}", noted.join("\n      "));
        }
    }

    /// A client configuration with a fresh device id.
    fn client_config(&self) -> ClientConfig {
        ClientConfig::new(&self.addr, &self.token, &self.fingerprint).expect("valid login line")
    }

    /// The server's memory and threads, as `/proc/<pid>/status` says.
    fn mem(&self) -> Mem {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.proc.pid()))
            .expect("the server's /proc status");
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no {name} in /proc status"))
        };
        Mem {
            rss: field("VmRSS:"),
            peak: field("VmHWM:"),
            threads: field("Threads:"),
        }
    }

    /// Waits (at most 20 s) until the server is idle: no more threads than `threads` (tokio lets
    /// idle blocking-pool threads go after 10 s) and the same RSS for a second.
    async fn settle(&self, threads: u64) -> (Mem, Duration) {
        let started = Instant::now();
        let mut last = self.mem();
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = self.mem();
            let steady = now.rss == last.rss && now.threads <= threads;
            if (steady && started.elapsed() >= Duration::from_secs(1))
                || started.elapsed() >= Duration::from_secs(20)
            {
                return (now, started.elapsed());
            }
            last = now;
        }
    }
}

/// A process's memory in KiB, and its threads.
#[derive(Clone, Copy)]
struct Mem {
    rss: u64,
    peak: u64,
    threads: u64,
}

/// The raw QUIC peer in its own process: this executable with `--echo-server`.
struct EchoServer {
    _proc: Proc,
    addr: SocketAddr,
    cert: CertificateDer<'static>,
}

impl EchoServer {
    fn start() -> EchoServer {
        let exe = std::env::current_exe().expect("the bench executable");
        let mut child = Command::new(exe)
            .arg("--echo-server")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the echo server");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let ready = read_until_line(&mut stdout, &["ECHO "]);
        let mut words = ready.split_whitespace().skip(1);
        let addr = words.next().expect("address").parse().expect("an address");
        let cert = from_hex(words.next().expect("certificate"));
        EchoServer {
            _proc: Proc {
                child,
                _stdout: stdout,
            },
            addr,
            cert: CertificateDer::from(cert),
        }
    }
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The raw QUIC peer
//
// A request is one bidirectional stream: a mode byte, a big-endian `u32` length and a payload,
// up to the end of the stream. The answer depends on the mode:

/// Answer with the payload.
const MODE_ECHO: u8 = 0;
/// Answer with `length` bytes of text.
const MODE_SEND: u8 = 1;
/// Relay, store and forward: fetch `length` bytes from the origin peer named by the payload
/// (`ADDR CERT-HEX`) with a `MODE_SEND` request, read all of it, then answer with it. The
/// shape of Monad's path (agent → server → client and back) with nothing but QUIC in it.
const MODE_RELAY_STORE: u8 = 2;
/// Relay, cut through: the same, forwarding each chunk as it arrives.
const MODE_RELAY_STREAM: u8 = 3;

/// A raw peer's state.
struct RawPeer {
    /// [`LARGE`] bytes of text to answer `MODE_SEND` from.
    big: Vec<u8>,
    /// This peer's own endpoint (also used to connect to an origin when relaying).
    endpoint: quinn::Endpoint,
    /// The connection to the origin, made by the first relayed request.
    origin: tokio::sync::OnceCell<quinn::Connection>,
}

/// A raw peer's endpoint on loopback: a fresh self-signed certificate (rcgen), rustls with
/// ring and TLS 1.3, and Monad's server transport settings exactly.
fn raw_endpoint() -> (quinn::Endpoint, CertificateDer<'static>) {
    let generated =
        rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("certificate");
    let cert = generated.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        generated.signing_key.serialize_der(),
    ));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .expect("certificate and key");
    tls.alpn_protocols = vec![RAW_ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls).expect("QUIC TLS");
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    // Monad's server raises a connection's streams once its hello says it is an agent; the raw
    // peer has no hello, so it starts with what an agent's connection gets.
    let settings = monad_server::config::Transport::default();
    let mut transport = settings.quinn();
    transport.max_concurrent_bidi_streams(settings.streams_for(Role::Agent).into());
    config.transport_config(Arc::new(transport));
    let endpoint =
        quinn::Endpoint::server(config, SocketAddr::from(([127, 0, 0, 1], 0))).expect("bind");
    (endpoint, cert)
}

/// Serves raw requests on `peer.endpoint` until it closes.
async fn serve_raw(peer: Arc<RawPeer>) {
    while let Some(incoming) = peer.endpoint.accept().await {
        let peer = peer.clone();
        tokio::spawn(async move {
            let Ok(conn) = incoming.await else { return };
            while let Ok((send, recv)) = conn.accept_bi().await {
                tokio::spawn(answer_raw(peer.clone(), send, recv));
            }
        });
    }
}

async fn answer_raw(peer: Arc<RawPeer>, mut send: quinn::SendStream, mut recv: quinn::RecvStream) {
    let Ok(request) = recv.read_to_end(1 << 20).await else {
        return;
    };
    let (mode, len, payload) = (
        request[0],
        u32::from_be_bytes(request[1..5].try_into().expect("length")) as usize,
        &request[5..],
    );
    match mode {
        MODE_ECHO => {
            let _ = send.write_all(payload).await;
        }
        MODE_SEND => {
            let _ = send.write_all(&peer.big[..len]).await;
        }
        MODE_RELAY_STORE | MODE_RELAY_STREAM => {
            let origin = peer
                .origin
                .get_or_init(|| async {
                    let named = std::str::from_utf8(payload).expect("origin");
                    let (addr, cert) = named.split_once(' ').expect("ADDR CERT");
                    let config = raw_client_config(CertificateDer::from(from_hex(cert)));
                    peer.endpoint
                        .connect_with(config, addr.parse().expect("address"), "localhost")
                        .expect("connect")
                        .await
                        .expect("handshake with the origin")
                })
                .await;
            let (mut o_send, mut o_recv) = origin.open_bi().await.expect("open a stream");
            o_send
                .write_all(&raw_request(MODE_SEND, len, &[]))
                .await
                .expect("send");
            let _ = o_send.finish();
            if mode == MODE_RELAY_STORE {
                let all = o_recv.read_to_end(usize::MAX).await.expect("origin answer");
                let _ = send.write_all(&all).await;
            } else {
                while let Some(chunk) = o_recv
                    .read_chunk(usize::MAX, true)
                    .await
                    .expect("origin answer")
                {
                    if send.write_chunk(chunk.bytes).await.is_err() {
                        return;
                    }
                }
            }
        }
        other => panic!("unknown raw mode {other}"),
    }
    let _ = send.finish();
}

/// `--echo-server`: prints `ECHO <addr> <certificate DER as hex>`, then serves raw requests
/// until its stdin closes (the bench ended or died).
fn echo_server_main() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let (endpoint, cert) = raw_endpoint();
        println!(
            "ECHO {} {}",
            endpoint.local_addr().expect("address"),
            to_hex(&cert)
        );
        std::io::stdout().flush().expect("stdout");
        std::thread::spawn(|| {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            std::process::exit(0);
        });
        serve_raw(Arc::new(RawPeer {
            big: text(LARGE, 0).into_bytes(),
            endpoint,
            origin: tokio::sync::OnceCell::new(),
        }))
        .await;
    });
}

/// The origin of relayed raw requests, in this process (where Monad's attached client is):
/// `ADDR CERT-HEX`, as a relay request's payload names it.
fn start_origin() -> String {
    let (endpoint, cert) = raw_endpoint();
    let named = format!(
        "{} {}",
        endpoint.local_addr().expect("address"),
        to_hex(&cert)
    );
    tokio::spawn(serve_raw(Arc::new(RawPeer {
        big: text(LARGE, 0).into_bytes(),
        endpoint,
        origin: tokio::sync::OnceCell::new(),
    })));
    named
}

/// A client configuration that pins `cert` by its fingerprint, exactly as monad-client does
/// (same verifier, same transport settings), with the raw echo's ALPN.
fn raw_client_config(cert: CertificateDer<'static>) -> quinn::ClientConfig {
    monad_client::connect::pinned_config(&monad_client::connect::fingerprint(&cert), RAW_ALPN)
        .expect("a valid pinned configuration")
        .0
}

/// A raw QUIC connection to the echo server.
struct RawClient {
    conn: quinn::Connection,
    _endpoint: quinn::Endpoint,
}

impl RawClient {
    async fn connect(server: &EchoServer) -> RawClient {
        let mut endpoint =
            quinn::Endpoint::client(SocketAddr::from(([0, 0, 0, 0], 0))).expect("UDP socket");
        endpoint.set_default_client_config(raw_client_config(server.cert.clone()));
        let conn = endpoint
            .connect(server.addr, "localhost")
            .expect("connect")
            .await
            .expect("handshake with the echo server");
        RawClient {
            conn,
            _endpoint: endpoint,
        }
    }

    /// One request on a fresh stream: sends `request`, reads the answer to the end, checks its
    /// length.
    async fn round_trip(&self, request: &[u8], answer_len: usize) -> Vec<u8> {
        let (mut send, mut recv) = self.conn.open_bi().await.expect("open a stream");
        send.write_all(request).await.expect("send");
        send.finish().expect("finish");
        let answer = recv.read_to_end(usize::MAX).await.expect("answer");
        assert_eq!(answer.len(), answer_len, "raw answer length");
        answer
    }
}

/// A raw request: the mode, the length, then `payload`.
fn raw_request(mode: u8, len: usize, payload: &[u8]) -> Vec<u8> {
    let mut request = vec![mode];
    request.extend_from_slice(&(len as u32).to_be_bytes());
    request.extend_from_slice(payload);
    request
}

// ---------------------------------------------------------------------------------------------
// Monad helpers

/// A folder attached on its own task; dropping it detaches.
struct Attached {
    task: JoinHandle<()>,
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Attaches `dir` as `name` (full trust: no prompts) and waits until the server confirms it.
async fn attach_folder(config: ClientConfig, dir: &Path, name: &str, limits: Limits) -> Attached {
    let mut options = AttachOptions::new(dir.to_path_buf());
    options.name = Some(name.to_owned());
    options.trust = Trust::Full;
    options.limits = limits;
    let (tx, mut events) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        if let Err(e) = attach(&config, options, None, Some(tx)).await {
            panic!("attach failed: {e}");
        }
    });
    let attached = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match events.recv().await {
                Some(AttachEvent::Attached { workspace, .. }) => break workspace,
                Some(AttachEvent::Disconnected { reason, .. }) => {
                    panic!("`{name}` disconnected while attaching: {reason}")
                }
                Some(_) => {}
                None => panic!("attach of `{name}` ended before attaching"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("`{name}` not attached within 60 s"));
    assert_eq!(attached.name, name, "the workspace got the name asked for");
    // Keep draining events so the channel does not grow.
    tokio::spawn(async move { while events.recv().await.is_some() {} });
    Attached { task }
}

/// Calls `read_file` on `path` in workspace `workspace` of the default session; returns the
/// content, panicking on any failure.
async fn read_file(agent: &Agent, workspace: &str, path: &str) -> String {
    read_routed(agent, workspace, path, true).await
}

/// [`read_file`], naming `workspace` in the call when `named`, else leaving routing to find it
/// there (the primary is looked in first: the file must not be there).
async fn read_routed(agent: &Agent, workspace: &str, path: &str, named: bool) -> String {
    let args = if named {
        json!({"path": path, "workspace": workspace})
    } else {
        json!({"path": path})
    };
    let reply = agent
        .call(Some("default"), "read_file", args, |_| {})
        .await
        .unwrap_or_else(|e| panic!("read_file in `{workspace}` failed as a request: {e}"));
    let name = reply.workspace.map(|w| w.name).unwrap_or_default();
    assert_eq!(name, workspace, "the call ran where it was sent");
    match reply.outcome {
        Outcome::Ok { result } => match result.into_value() {
            Value::Object(mut map) => {
                assert_eq!(
                    map.get("truncated"),
                    Some(&Value::Bool(false)),
                    "whole file"
                );
                match map.remove("content") {
                    Some(Value::String(content)) => content,
                    other => panic!("no content in the result: {other:?}"),
                }
            }
            other => panic!("result is not an object: {other}"),
        },
        Outcome::Error { error } => panic!("read_file in `{workspace}` failed: {error}"),
    }
}

/// Limits of the attached folder of figures a and b: the 64 MiB file fits whole.
fn big_limits() -> Limits {
    Limits {
        read_max_bytes: 2 * LARGE as u64,
        read_default_lines: 2 * (LARGE / LINE) as u64,
        ..Limits::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Figures

/// Figures a and b: one server, one attached folder, one agent connection; the raw peer and
/// the raw origin (for the relay rows) beside them.
async fn latency_and_throughput(quick: bool, binary: &Path, only: &str) {
    let server = MonadServer::start(binary, None);
    let echo = EchoServer::start();
    let origin = start_origin();
    let folder = tempfile::Builder::new()
        .prefix("monad-bench-folder-")
        .tempdir()
        .expect("temporary folder");
    let small = text(SMALL, 1);
    let large = text(LARGE, 0);
    std::fs::write(folder.path().join("small.txt"), &small).expect("write small.txt");
    std::fs::write(folder.path().join("large.txt"), &large).expect("write large.txt");
    let _attached =
        attach_folder(server.client_config(), folder.path(), "bench", big_limits()).await;
    let agent = Agent::connect(&server.client_config())
        .await
        .expect("agent connects");
    let raw = RawClient::connect(&echo).await;
    let ctx = Ctx { agent, raw, origin };
    if only.contains('a') {
        small_round_trips(quick, &ctx, &small).await;
    }
    if only.contains('b') {
        large_reads(quick, &ctx, large).await;
    }
    server.show_log();
}

/// What figures a and b call.
struct Ctx {
    agent: Agent,
    raw: RawClient,
    /// The raw origin, as relay requests name it.
    origin: String,
}

/// One of the operations figures a and b compare.
#[derive(Clone, Copy, PartialEq)]
enum Op {
    /// Monad's `read_file` of this file, of this size.
    Monad(&'static str, usize),
    /// The same, the call naming no workspace: routing finds the folder.
    Routed(&'static str, usize),
    /// A raw request with this mode, answered with this many bytes.
    Raw(u8, usize),
}

impl Ctx {
    async fn run(&self, op: Op) {
        match op {
            Op::Monad(path, len) => {
                let content = read_file(&self.agent, "bench", path).await;
                assert_eq!(content.len(), len);
            }
            Op::Routed(path, len) => {
                let content = read_routed(&self.agent, "bench", path, false).await;
                assert_eq!(content.len(), len);
            }
            Op::Raw(mode, len) => {
                let request = match mode {
                    MODE_ECHO => raw_request(mode, len, &vec![b'x'; len]),
                    MODE_SEND => raw_request(mode, len, &[]),
                    _ => raw_request(mode, len, self.origin.as_bytes()),
                };
                self.raw.round_trip(&request, len).await;
            }
        }
    }

    /// Times each of `ops` `iters` times after `warmup` untimed rounds. Every round runs each
    /// operation once, the order rotating from round to round, so drift in machine load
    /// affects all alike.
    async fn time(&self, ops: &[Op], warmup: usize, iters: usize) -> Vec<Stats> {
        let mut samples = vec![Vec::with_capacity(iters); ops.len()];
        for round in 0..warmup + iters {
            for k in 0..ops.len() {
                let at = (round + k) % ops.len();
                let t = Instant::now();
                self.run(ops[at]).await;
                if round >= warmup {
                    samples[at].push(t.elapsed());
                }
            }
        }
        samples.iter_mut().map(|s| Stats::of(s)).collect()
    }
}

/// Figure a: the 4 KiB read against the raw echo (the target) and, for information, the same
/// bytes through a raw relay (two hops, like Monad's), and the read naming no workspace (routing
/// looks in the primary, then asks the folder to run it if it has the file: one round trip).
async fn small_round_trips(quick: bool, ctx: &Ctx, small: &str) {
    let (warmup, iters) = if quick {
        (200, 500)
    } else {
        (500, iters_or("MONAD_BENCH_ITERS_A", 5000))
    };
    assert_eq!(read_file(&ctx.agent, "bench", "small.txt").await, small);
    let ops = [
        Op::Monad("small.txt", SMALL),
        Op::Raw(MODE_ECHO, SMALL),
        Op::Raw(MODE_RELAY_STORE, SMALL),
        Op::Routed("small.txt", SMALL),
    ];
    if let Ok(alone) = std::env::var("MONAD_BENCH_ALONE") {
        let op = match alone.as_str() {
            "monad" => ops[0],
            "echo" => ops[1],
            "relay" => ops[2],
            "routed" => ops[3],
            other => panic!("MONAD_BENCH_ALONE={other}: monad, echo, relay or routed, please"),
        };
        return alone_for(ctx, &alone, op, warmup).await;
    }
    let stats = ctx.time(&ops, warmup, iters).await;
    let (m, echo, relay, routed) = (stats[0], stats[1], stats[2], stats[3]);
    let ratio = m.median.as_secs_f64() / echo.median.as_secs_f64();
    let p = |s: Stats| format!("{} / {}", fmt_dur(s.median), fmt_dur(s.p99));
    line(
        "(a) read_file 4 KiB, p50 / p99",
        &p(m),
        &format!("echo {}", p(echo)),
        &format!("{ratio:.2}x"),
        "<= 3.00x",
        verdict(ratio <= 3.0),
    );
    line(
        "    against a raw 2-hop relay",
        &p(m),
        &format!("relay {}", p(relay)),
        &format!(
            "{:.2}x",
            m.median.as_secs_f64() / relay.median.as_secs_f64()
        ),
        "-",
        "INFO",
    );
    line(
        "    naming no workspace (routed)",
        &p(routed),
        &format!("named {}", p(m)),
        &format!(
            "{:.2}x",
            routed.median.as_secs_f64() / m.median.as_secs_f64()
        ),
        "-",
        "INFO",
    );
}

/// `MONAD_BENCH_ALONE`: figure a's operation `op` alone, back to back, for
/// `MONAD_BENCH_ALONE_SECS` seconds (10 by default) after `warmup` untimed calls and a 2 s pause
/// that announces the start. Interleaved, as figure a runs, what one operation leaves behind
/// (a stream's end, a record) lands on the next, often another side's; alone, each pays its own,
/// and CPU, datagrams and context switches per call can be read from outside during the run
/// (`docs/benchmarks.md`).
async fn alone_for(ctx: &Ctx, name: &str, op: Op, warmup: usize) {
    let secs = std::env::var("MONAD_BENCH_ALONE_SECS")
        .map_or(10, |s| {
            s.parse().unwrap_or_else(|_| {
                panic!("MONAD_BENCH_ALONE_SECS={s}: a number of seconds, please")
            })
        })
        .max(1);
    for _ in 0..warmup {
        ctx.run(op).await;
    }
    println!(
        "{name} alone: starting in 2 s, for {secs} s (bench pid {})",
        std::process::id()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let started = Instant::now();
    let mut samples = Vec::new();
    while started.elapsed() < Duration::from_secs(secs) {
        let t = Instant::now();
        ctx.run(op).await;
        samples.push(t.elapsed());
    }
    let took = started.elapsed();
    let calls = samples.len();
    let s = Stats::of(&mut samples);
    println!(
        "{name} alone: {calls} calls in {:.2} s, {} per call; p50 {} / p99 {}",
        took.as_secs_f64(),
        fmt_dur(took / calls.max(1) as u32),
        fmt_dur(s.median),
        fmt_dur(s.p99)
    );
}

/// Figure b: the 64 MiB read against one raw stream (the target) and, for information, the
/// same bytes through a raw relay, stored and forwarded (as Monad's server does with a
/// message) or cut through. The first Monad answer is checked byte for byte.
async fn large_reads(quick: bool, ctx: &Ctx, large: String) {
    let (warmup, iters) = if quick {
        (1, 2)
    } else {
        (2, iters_or("MONAD_BENCH_ITERS_B", 10))
    };
    assert!(read_file(&ctx.agent, "bench", "large.txt").await == large);
    drop(large);
    let ops = [
        Op::Monad("large.txt", LARGE),
        Op::Raw(MODE_SEND, LARGE),
        Op::Raw(MODE_RELAY_STORE, LARGE),
        Op::Raw(MODE_RELAY_STREAM, LARGE),
    ];
    let stats = ctx.time(&ops, warmup, iters).await;
    let rate = |s: Stats| mib_per_s(LARGE, s.median);
    let shown = |s: Stats| format!("{:.0} MiB/s ({})", rate(s), fmt_dur(s.median));
    let share = rate(stats[0]) / rate(stats[1]);
    line(
        "(b) read_file 64 MiB, throughput",
        &shown(stats[0]),
        &format!("stream {}", shown(stats[1])),
        &format!("{:.0}%", share * 100.0),
        ">= 50%",
        verdict(share >= 0.5),
    );
    for (name, s) in [
        ("    against a raw relay, stored", stats[2]),
        ("    against a raw relay, cut through", stats[3]),
    ] {
        line(
            name,
            &shown(stats[0]),
            &format!("relay {}", shown(s)),
            &format!("{:.0}%", rate(stats[0]) / rate(s) * 100.0),
            "-",
            "INFO",
        );
    }
}

/// Figure c: a fresh server; its RSS with agents connected, then with `CLIENTS` folders
/// attached, then after calls on all of them at once.
async fn many_clients(quick: bool, binary: &Path) {
    let clients = if quick { CLIENTS_QUICK } else { CLIENTS };
    // Every client and agent here is the same user, whose connections the server caps at 64 by
    // default; this figure is about many users' folders at once, so the cap is raised above the
    // count.
    let config = format!(
        "[server]\nmax_connections_per_user = {}\n",
        clients + AGENTS + 8
    );
    let server = MonadServer::start(binary, Some(&config));
    let mut agents = Vec::new();
    for _ in 0..AGENTS {
        agents.push(Arc::new(
            Agent::connect(&server.client_config())
                .await
                .expect("agent connects"),
        ));
    }
    // Warm the server up on its primary workspace (threads, first allocations) before the
    // baseline, so that one-time costs are not charged to the clients.
    for (i, agent) in agents.iter().enumerate() {
        for _ in 0..20 {
            let reply = agent
                .call(
                    Some("default"),
                    "write_file",
                    json!({"path": format!("warm{i}.txt"), "content": text(SMALL, i), "workspace": "primary"}),
                    |_| {},
                )
                .await
                .expect("write_file");
            assert!(matches!(reply.outcome, Outcome::Ok { .. }), "{reply:?}");
            assert_eq!(
                read_file(agent, "primary", &format!("warm{i}.txt"))
                    .await
                    .len(),
                SMALL
            );
        }
    }
    // The warm-up's blocking threads are gone after 10 s; what stays is the idle server.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let before = server.mem();

    let root = tempfile::Builder::new()
        .prefix("monad-bench-clients-")
        .tempdir()
        .expect("temporary folder");
    let mut contents = Vec::new();
    let mut dirs: Vec<PathBuf> = Vec::new();
    for i in 0..clients {
        let dir = root.path().join(format!("c{i:04}"));
        std::fs::create_dir(&dir).expect("client folder");
        let content = text(SMALL, i);
        std::fs::write(dir.join("small.txt"), &content).expect("write");
        contents.push(content);
        dirs.push(dir);
    }
    let started = Instant::now();
    // The server admits at most 32 pending handshakes from one address (all of these come from
    // 127.0.0.1), so at most `HANDSHAKING` attach at a time; the rest wait their turn.
    let handshaking = Arc::new(tokio::sync::Semaphore::new(HANDSHAKING));
    let attaching: Vec<_> = dirs
        .iter()
        .enumerate()
        .map(|(i, dir)| {
            // Its own configuration: a separate device id, connection and UDP socket.
            let config = server.client_config();
            let dir = dir.clone();
            let handshaking = handshaking.clone();
            tokio::spawn(async move {
                let _turn = handshaking.acquire_owned().await.expect("semaphore open");
                attach_folder(config, &dir, &format!("c{i:04}"), Limits::default()).await
            })
        })
        .collect();
    let mut attached = Vec::new();
    for a in attaching {
        attached.push(a.await.expect("attach task"));
    }
    let attach_time = started.elapsed();
    let busy = server.mem();
    let (after_attach, attach_settle) = server.settle(before.threads).await;
    let per = |m: Mem| m.rss.saturating_sub(before.rss) as f64 / clients as f64;
    let per_client = per(after_attach);
    // Printed before the calls of (c'), so that the figure stands even if they fail.
    line(
        "(c) server RSS per attached client",
        &format!("{per_client:.1} KiB"),
        "-",
        "-",
        "<= 50 KiB",
        verdict(per_client <= 50.0),
    );

    // Every client serves calls at the same time: one task per client, AGENTS connections.
    let rounds = if quick { 2 } else { 10 };
    let contents = Arc::new(contents);
    let in_flight = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let started = Instant::now();
    let calls: Vec<_> = (0..clients)
        .map(|i| {
            let agent = agents[i % AGENTS].clone();
            let contents = contents.clone();
            let in_flight = in_flight.clone();
            tokio::spawn(async move {
                let name = format!("c{i:04}");
                for _ in 0..rounds {
                    let turn = in_flight.acquire().await.expect("semaphore open");
                    let content = read_file(&agent, &name, "small.txt").await;
                    drop(turn);
                    assert!(
                        content == contents[i],
                        "`{name}` answered with its own file"
                    );
                }
            })
        })
        .collect();
    for c in calls {
        c.await.expect("every call succeeds");
    }
    let call_time = started.elapsed();
    let (after_calls, calls_settle) = server.settle(before.threads).await;

    let per_client_calls = per(after_calls);
    line(
        "    same, after concurrent calls",
        &format!("{per_client_calls:.1} KiB"),
        "-",
        "-",
        "-",
        "INFO",
    );
    println!(
        "    server RSS, idle: {} KiB with {AGENTS} agents ({} threads); {} KiB with {clients} \
         clients attached (attached in {}; {} KiB and {} threads right after, settled in {}); \
         {} KiB after {} calls, {IN_FLIGHT} at a time (in {}; settled in {}); peak {} KiB",
        before.rss,
        before.threads,
        after_attach.rss,
        fmt_dur(attach_time),
        busy.rss,
        busy.threads,
        fmt_dur(attach_settle),
        after_calls.rss,
        clients * rounds,
        fmt_dur(call_time),
        fmt_dur(calls_settle),
        after_calls.peak,
    );
    drop(attached);
    server.show_log();
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--echo-server") {
        return echo_server_main();
    }
    // Figure c holds a UDP socket and a folder's directory handles per attached client in this
    // process: more than the usual soft limit of 1,024 descriptors for 1,000 clients.
    if let Ok((_, hard)) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
    {
        let _ =
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard);
    }
    let quick = monad_tests::bench::quick();
    let started = Instant::now();
    // MONAD_BENCH_SERVER names a server binary to use as it is; by default the workspace's is
    // built (or checked) first, in the profile this bench runs in.
    let binary = match std::env::var_os("MONAD_BENCH_SERVER") {
        Some(path) => PathBuf::from(path),
        None => monad_tests::binary("monad-server"),
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    println!(
        "monad end-to-end bench{} (server: {}, built or checked in {})",
        if quick { " --quick" } else { "" },
        binary.display(),
        fmt_dur(started.elapsed()),
    );
    header();
    // MONAD_BENCH_ONLY=ab (or c, …) runs a subset of the figures.
    let only = std::env::var("MONAD_BENCH_ONLY").unwrap_or_else(|_| "abc".into());
    runtime.block_on(async {
        if only.contains('a') || only.contains('b') {
            latency_and_throughput(quick, &binary, &only).await;
        }
        if only.contains('c') {
            many_clients(quick, &binary).await;
        }
    });
    println!("total {}", fmt_dur(started.elapsed()));
}
