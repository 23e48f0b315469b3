//! The MCP front, driven by rmcp's own client over both transports: `monad-client mcp` (the real
//! binary, over stdio) and the server's Streamable HTTP endpoint (with a bearer token).
//! `python` drives both with the official MCP Python SDK; `model_text` measures the text a model
//! reads against the reference filesystem server.

// rmcp marks logging deprecated (SEP-2577); the protocol versions Monad speaks still have it.
#![allow(deprecated)]

mod conformance;
mod model_text;
mod python;
mod roots;
mod typescript;

use std::future::Future;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use monad_client::approval::{ApprovalRequest, Approver, Decision};
use monad_protocol::ToolClass;
use monad_tests::{Attachment, STEP, TestServer, attach_options, folder, within};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientRequest, InitializeRequestParams,
    LoggingMessageNotificationParam, ProgressNotificationParam, RequestMetaObject, Tool,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, ServiceExt};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::sync::mpsc;

/// What the host saw besides answers.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    ListChanged,
    Progress(String),
    Log(String),
}

/// An rmcp client handler that records notifications, and may name a session in `initialize`.
#[derive(Debug, Clone)]
struct Host {
    seen: mpsc::UnboundedSender<Seen>,
    session: Option<String>,
}

impl ClientHandler for Host {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.seen.send(Seen::ListChanged);
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self
            .seen
            .send(Seen::Progress(params.message.unwrap_or_default()));
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let text = params.data.as_str().unwrap_or_default().to_owned();
        let _ = self.seen.send(Seen::Log(text));
    }

    fn get_info(&self) -> InitializeRequestParams {
        let mut info = InitializeRequestParams::default();
        if let Some(session) = &self.session {
            let mut meta = RequestMetaObject::new();
            meta.insert("sessionId".into(), session.clone().into());
            info.meta = Some(meta);
        }
        info
    }
}

/// Which transport a case runs over.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Via {
    Stdio,
    Http,
}

/// A connected MCP host and what it sees.
struct Connected {
    client: RunningService<RoleClient, Host>,
    seen: mpsc::UnboundedReceiver<Seen>,
    _config_dir: Option<TempDir>,
}

impl Connected {
    /// Waits (bounded) for a notification that `wanted` accepts, skipping others.
    async fn expect(&mut self, what: &str, wanted: impl Fn(&Seen) -> bool) -> Seen {
        within(STEP, what, async {
            loop {
                let seen = self.seen.recv().await.expect("the client is running");
                if wanted(&seen) {
                    break seen;
                }
            }
        })
        .await
    }

    async fn tools(&self) -> Vec<Tool> {
        within(STEP, "tools/list", self.client.list_all_tools())
            .await
            .expect("tools/list answers")
    }

    async fn call(&self, tool: &str, args: Value) -> CallToolResult {
        self.try_call(tool, args).await.expect("tools/call answers")
    }

    async fn try_call(
        &self,
        tool: &str,
        args: Value,
    ) -> Result<CallToolResult, rmcp::ServiceError> {
        let params = CallToolRequestParams::new(tool.to_owned())
            .with_arguments(args.as_object().cloned().unwrap_or_default());
        within(STEP, "tools/call", self.client.call_tool(params)).await
    }
}

/// A server with its HTTP endpoint on a free loopback port.
async fn server() -> (TestServer, SocketAddr) {
    let free = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let http = free.local_addr().expect("its address");
    drop(free);
    let server = TestServer::start_with(|c| c.http = Some(http)).await;
    (server, http)
}

/// `config` saved in a temporary directory, as a host's `MONAD_CONFIG_DIR`.
fn saved_config(config: &monad_client::config::ClientConfig) -> TempDir {
    let dir = tempfile::tempdir().expect("config dir");
    config.save(dir.path()).expect("config saved");
    dir
}

/// Runs `peer` (an SDK's script) to its end within `limit`; returns its standard output and
/// error, and fails the test with both when it fails.
async fn peer_output(
    mut peer: tokio::process::Command,
    what: &str,
    limit: std::time::Duration,
) -> (String, String) {
    let output = within(limit, what, peer.kill_on_drop(true).output())
        .await
        .unwrap_or_else(|e| panic!("{what} does not start: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "{what} failed:\n{stdout}\n{stderr}"
    );
    (stdout, stderr)
}

/// `monad-client mcp` logged in through the config saved in `config_dir`, as an rmcp transport
/// (a temporary home and no MONAD_* from outside, like every child of the tests).
fn stdio_bridge(config_dir: &std::path::Path) -> TokioChildProcess {
    let mut cmd = monad_tests::command("monad-client");
    cmd.arg("mcp")
        .stderr(std::process::Stdio::inherit())
        .env("MONAD_CONFIG_DIR", config_dir)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true);
    TokioChildProcess::new(cmd).expect("monad-client mcp starts")
}

/// Connects an rmcp client over `via`, naming `session` in `initialize` if given.
async fn connect(
    server: &TestServer,
    http: SocketAddr,
    via: Via,
    session: Option<&str>,
) -> Result<Connected, rmcp::service::ClientInitializeError> {
    let (tx, seen) = mpsc::unbounded_channel();
    let host = Host {
        seen: tx,
        session: session.map(str::to_owned),
    };
    let (client, config_dir) = match via {
        Via::Stdio => {
            let dir = saved_config(&server.client_config());
            let transport = stdio_bridge(dir.path());
            let client = within(STEP, "initialize over stdio", host.serve(transport)).await?;
            (client, Some(dir))
        }
        Via::Http => {
            let config =
                StreamableHttpClientTransportConfig::with_uri(format!("http://{http}/mcp"))
                    .auth_header(server.token.clone());
            // reqwest has no process-wide crypto provider here: the client comes TLS-configured.
            let http_client = monad_server::llm::http_client_builder()
                .expect("TLS set up")
                .build()
                .expect("an HTTP client");
            let transport = StreamableHttpClientTransport::with_client(http_client, config);
            let client = within(STEP, "initialize over HTTP", host.serve(transport)).await?;
            (client, None)
        }
    };
    Ok(Connected {
        client,
        seen,
        _config_dir: config_dir,
    })
}

fn text(result: &CallToolResult) -> String {
    serde_json::to_value(&result.content[0]).expect("content serializes")["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn workspace_description(tool: &Tool) -> String {
    tool.input_schema["properties"]["workspace"]["description"]
        .as_str()
        .expect("workspace has a description")
        .to_owned()
}

/// Lists, calls, fails and follows a folder attaching and detaching, over `via`.
async fn tools_calls_and_list_changed(via: Via) {
    let (server, http) = server().await;
    let mut host = connect(&server, http, via, None)
        .await
        .expect("the host connects");
    let tools = host.tools().await;
    assert_eq!(tools.len(), monad_protocol::ToolName::ALL.len(), "{via:?}");
    let read = tools.iter().find(|t| t.name == "read_file").unwrap();
    let hints = read.annotations.clone().expect("annotations");
    assert_eq!(hints.read_only_hint, Some(true));
    let run = tools.iter().find(|t| t.name == "run_command").unwrap();
    assert_eq!(
        run.annotations.clone().unwrap().destructive_hint,
        Some(true)
    );
    let described = workspace_description(read);
    assert!(described.contains("`primary`"), "{described}");
    assert!(!described.contains("`laptop`"), "{described}");

    let dir = folder(&[("notes.txt", "hello from the laptop\n")]);
    let mut options = attach_options(dir.path(), "laptop");
    options.allow = vec![ToolClass::Read];
    let attached = Attachment::start(&server.client_config(), options, None).await;
    host.expect("tools/list_changed after attach", |s| {
        *s == Seen::ListChanged
    })
    .await;
    let tools = host.tools().await;
    let read = tools.iter().find(|t| t.name == "read_file").unwrap();
    let described = workspace_description(read);
    assert!(described.contains("`laptop`"), "{described}");
    assert!(described.contains("restricted"), "{described}");

    // Routed like any call: the path exists only in the attached folder.
    let result = host.call("read_file", json!({"path": "notes.txt"})).await;
    assert_eq!(result.is_error, Some(false), "{}", text(&result));
    let structured = result.structured_content.clone().unwrap();
    assert_eq!(structured["workspace"]["name"], "laptop");
    assert_eq!(structured["result"]["content"], "hello from the laptop\n");
    assert!(text(&result).contains("hello from the laptop"));

    // Tool failures are results with isError and a sentence, not protocol errors.
    let missing = host
        .call(
            "read_file",
            json!({"path": "nope.txt", "workspace": "laptop"}),
        )
        .await;
    assert_eq!(missing.is_error, Some(true));
    assert!(
        text(&missing).starts_with("not_found:"),
        "{}",
        text(&missing)
    );
    let denied = host
        .call(
            "write_file",
            json!({"path": "x.txt", "content": "x", "workspace": "laptop"}),
        )
        .await;
    assert_eq!(denied.is_error, Some(true));
    assert!(text(&denied).starts_with("denied:"), "{}", text(&denied));
    assert!(text(&denied).contains("--allow write"), "{}", text(&denied));
    let outside = host
        .call(
            "read_file",
            json!({"path": "../../etc/passwd", "workspace": "laptop"}),
        )
        .await;
    assert!(
        text(&outside).starts_with("outside_workspace:"),
        "{}",
        text(&outside)
    );
    let bad_args = host.call("read_file", json!({"pth": "x"})).await;
    assert!(
        text(&bad_args).starts_with("invalid_arguments:"),
        "{}",
        text(&bad_args)
    );
    // An unknown tool is a protocol error.
    assert!(host.try_call("rm_rf", json!({})).await.is_err());

    drop(attached);
    host.expect("tools/list_changed after detach", |s| {
        *s == Seen::ListChanged
    })
    .await;
    let _ = host.client.cancel().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_over_stdio_lists_calls_and_follows_attachments() {
    tools_calls_and_list_changed(Via::Stdio).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_over_http_lists_calls_and_follows_attachments() {
    tools_calls_and_list_changed(Via::Http).await;
}

/// A command's long output reaches the model as its two ends, with what was left out counted
/// and how to read it, and programs whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_command_output_reaches_the_model_by_its_ends_and_programs_whole() {
    let (server, http) = server().await;
    let host = connect(&server, http, Via::Stdio, None)
        .await
        .expect("the host connects");
    let result = host
        .call(
            "run_command",
            json!({"argv": ["seq", "1", "100000"], "workspace": "primary"}),
        )
        .await;
    assert_eq!(result.is_error, Some(false), "{:.300}", text(&result));
    let all: String = (1..=100_000).map(|n| format!("{n}\n")).collect();
    let structured = result.structured_content.clone().unwrap();
    assert!(
        structured["result"]["stdout"] == all.as_str(),
        "programs get every line"
    );
    let shown = text(&result);
    assert!(shown.len() < 4_000, "{} bytes of text", shown.len());
    let head: String = (1..=128).map(|n| format!("{n}\n")).collect();
    assert!(
        shown.contains(&format!(
            "--- stdout: 100000 lines, {} bytes; its first and last lines are shown here\n{head}\
             [... 99744 lines (",
            all.len()
        )),
        "{shown}"
    );
    let tail: String = (99_873..=100_000).map(|n| format!("{n}\n")).collect();
    assert!(shown.ends_with(tail.trim_end()), "{shown}");

    // Over the output cap (1 MiB), its start and its end are kept: what failed is at the end.
    let result = host
        .call(
            "run_command",
            json!({"argv": ["sh", "-c", "seq 1 400000; echo FINAL_ERROR: it failed; exit 1"],
                   "workspace": "primary"}),
        )
        .await;
    let structured = result.structured_content.clone().unwrap();
    let ran = &structured["result"];
    assert_eq!(ran["exit_code"], 1);
    assert_eq!(ran["stdout_truncated"], true);
    let stdout = ran["stdout"].as_str().unwrap();
    assert!(stdout.starts_with("1\n2\n3\n"), "{:.100}", stdout);
    assert!(stdout.ends_with("400000\nFINAL_ERROR: it failed\n"));
    assert_eq!(stdout.len(), 1024 * 1024);
    let at = ran["stdout_gap"]["at"].as_u64().unwrap() as usize;
    let dropped = ran["stdout_gap"]["dropped"].as_u64().unwrap() as usize;
    let whole: usize = (1..=400_000)
        .map(|n: u32| n.to_string().len() + 1)
        .sum::<usize>()
        + "FINAL_ERROR: it failed\n".len();
    assert_eq!(stdout.len() + dropped, whole);
    assert_eq!(at, 512 * 1024);
    let shown = text(&result);
    assert!(shown.starts_with("exit status 1"), "{:.200}", shown);
    assert!(shown.ends_with("400000\nFINAL_ERROR: it failed"), "{shown}");
    assert!(
        shown.contains(&format!(
            "--- stdout: {whole} bytes, more than the output cap keeps"
        )),
        "{shown}"
    );
    let _ = host.client.cancel().await;
}

/// A result large enough to travel as a raw body (from the attached client to the server, and
/// from the server to `monad-client mcp`) reaches the host whole.
async fn large_read_arrives_whole(via: Via) {
    let (server, http) = server().await;
    let line = "{\"k\": \"v\\n\"}\tlíne ✓\n";
    let content = line.repeat(1024 * 1024 / line.len());
    let dir = folder(&[("big.json", &content)]);
    let mut options = attach_options(dir.path(), "laptop");
    options.allow = vec![ToolClass::Read];
    options.limits.read_max_bytes = 2 * 1024 * 1024;
    options.limits.read_default_lines = 100_000;
    let _attached = Attachment::start(&server.client_config(), options, None).await;
    let host = connect(&server, http, via, None)
        .await
        .expect("the host connects");
    let result = host
        .call(
            "read_file",
            json!({"path": "big.json", "workspace": "laptop"}),
        )
        .await;
    assert_eq!(
        result.is_error,
        Some(false),
        "{via:?}: {:.300}",
        text(&result)
    );
    let structured = result.structured_content.clone().unwrap();
    assert!(
        structured["result"]["content"] == content.as_str(),
        "{via:?}: the content differs"
    );
    let _ = host.client.cancel().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_over_stdio_large_read_arrives_whole() {
    large_read_arrives_whole(Via::Stdio).await;
}

/// Starts `cmd` (`monad-client mcp`, or what execs it) as a host does: its standard input and
/// output piped, logged in through the config in `config`.
fn front_on_pipes(
    mut cmd: tokio::process::Command,
    config: &std::path::Path,
) -> tokio::process::Child {
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .env("MONAD_CONFIG_DIR", config)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .expect("monad-client mcp starts")
}

/// The lines `monad-client mcp` answers in.
type Answers = tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>;

/// `monad-client mcp` started on pipes ([`front_on_pipes`]): the process, where its requests go
/// and its answers' lines.
fn mcp_front(
    config: &std::path::Path,
) -> (tokio::process::Child, tokio::process::ChildStdin, Answers) {
    use tokio::io::AsyncBufReadExt;
    let mut cmd = monad_tests::command("monad-client");
    cmd.arg("mcp");
    let mut front = front_on_pipes(cmd, config);
    let requests = front.stdin.take().expect("its standard input");
    let answers =
        tokio::io::BufReader::new(front.stdout.take().expect("its standard output")).lines();
    (front, requests, answers)
}

/// Sends `initialize` as the host `name` and waits for its answer.
async fn initialize<R: tokio::io::AsyncBufRead + Unpin>(
    requests: &mut tokio::process::ChildStdin,
    answers: &mut tokio::io::Lines<R>,
    name: &str,
) -> Value {
    let init = json!({
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": name, "version": "1"},
    });
    ask(requests, answers, 1, "initialize", init).await
}

/// Writes a JSON-RPC request to `monad-client mcp` and reads lines until its answer.
async fn ask<R: tokio::io::AsyncBufRead + Unpin>(
    requests: &mut tokio::process::ChildStdin,
    answers: &mut tokio::io::Lines<R>,
    id: u64,
    method: &str,
    params: Value,
) -> Value {
    use tokio::io::AsyncWriteExt;
    let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    requests
        .write_all(format!("{request}\n").as_bytes())
        .await
        .expect("request written");
    loop {
        let line = within(STEP, method, answers.next_line())
            .await
            .expect("an answer")
            .expect("before the end");
        let answer: Value = serde_json::from_str(&line).expect("JSON");
        // A notification (the warning that this host declares no roots) is not the answer.
        if answer["id"] == id {
            return answer;
        }
    }
}

/// A host that closes its side once it has sent its last call still gets that call's answer,
/// although the call told progress meanwhile (every 2 s): once the host's side is closed, rmcp
/// writes no notification, and the call waited on its first until rmcp gave up on the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_over_stdio_answers_a_call_that_told_progress_after_its_host_closed_its_side() {
    use tokio::io::AsyncWriteExt;
    let (server, _http) = server().await;
    let config = saved_config(&server.client_config());
    let (mut front, mut requests, mut answers) = mcp_front(config.path());
    initialize(&mut requests, &mut answers, "leaving").await;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    // Long enough for the command to tell progress before it ends.
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "run_command", "arguments": {"argv": ["sleep", "4.5"]},
        "_meta": {"progressToken": "t"}}});
    requests
        .write_all(format!("{initialized}\n{call}\n").as_bytes())
        .await
        .unwrap();
    drop(requests);
    let mut seen = Vec::new();
    while let Some(line) = within(STEP * 2, "the answers", answers.next_line())
        .await
        .expect("its output")
    {
        seen.push(serde_json::from_str::<Value>(&line).expect("JSON"));
    }
    let answer = seen.iter().find(|m| m["id"] == 2);
    let answer = answer.unwrap_or_else(|| panic!("no answer to the call: {seen:?}"));
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    assert_eq!(
        answer["result"]["structuredContent"]["result"]["exit_code"], 0,
        "{answer}"
    );
    within(STEP, "the front to exit", front.wait())
        .await
        .unwrap();
}

/// `monad-client mcp` grows the pipe its host reads answers from the first time an answer does
/// not fit in it, so that a large answer goes in at one write rather than 64 KiB each time the
/// host has read a piece; small answers leave it as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_over_stdio_grows_the_pipe_its_answers_go_into_for_a_large_one() {
    use monad_client::mcp::PIPE_BYTES;
    use nix::fcntl::{FcntlArg, fcntl};
    let (server, _http) = server().await;
    let line = "the quick brown fox jumps over the lazy dog, again and again.\n";
    let big = line.repeat(100 * 1024 / line.len());
    let dir = folder(&[("small.txt", line), ("big.txt", &big)]);
    let mut options = attach_options(dir.path(), "laptop");
    options.allow = vec![ToolClass::Read];
    let _attached = Attachment::start(&server.client_config(), options, None).await;
    let config = saved_config(&server.client_config());
    let (_front, mut requests, mut answers) = mcp_front(config.path());
    let capacity = |answers: &mut Answers| {
        let pipe: &tokio::process::ChildStdout = answers.get_mut().get_ref();
        usize::try_from(fcntl(pipe, FcntlArg::F_GETPIPE_SZ).expect("a pipe")).unwrap()
    };
    let at_start = capacity(&mut answers);
    initialize(&mut requests, &mut answers, "pipe").await;
    let read = |path: &str| json!({"name": "read_file", "arguments": {"path": path, "workspace": "laptop"}});
    let small = ask(
        &mut requests,
        &mut answers,
        2,
        "tools/call",
        read("small.txt"),
    )
    .await;
    assert_eq!(small["result"]["isError"], false, "{small}");
    assert_eq!(
        capacity(&mut answers),
        at_start,
        "a small answer left the pipe alone"
    );
    let large = ask(
        &mut requests,
        &mut answers,
        3,
        "tools/call",
        read("big.txt"),
    )
    .await;
    assert_eq!(large["result"]["isError"], false, "{large:.300}");
    assert_eq!(
        large["result"]["structuredContent"]["result"]["content"], big,
        "the large answer arrived whole"
    );
    let grown = capacity(&mut answers);
    assert!(
        grown >= PIPE_BYTES,
        "{grown} after a {}-byte answer",
        large.to_string().len()
    );
}

/// A `write_file` as large as a workspace takes (16 MiB) is a longer request line than that
/// once JSON-escaped: `monad-client mcp` takes it and answers, as it does one a byte over the
/// limit (refused by the workspace), rather than dropping the line and leaving its host waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_over_stdio_answers_a_write_as_large_as_a_workspace_takes() {
    let (server, _http) = server().await;
    let config = saved_config(&server.client_config());
    let (_front, mut requests, mut answers) = mcp_front(config.path());
    initialize(&mut requests, &mut answers, "big").await;
    let limit = monad_sandbox::Limits::default().write_max_bytes as usize;
    // Lines of 1 KiB with their line breaks: the request line is longer than the content.
    let mut content = format!("{}\n", "x".repeat(1023)).repeat(limit / 1024);
    assert_eq!(content.len(), limit);
    // As large as the workspace takes: written; a byte more: refused by the workspace.
    for (id, over) in [(2, false), (3, true)] {
        if over {
            content.push('x');
        }
        let args = json!({"path": "big.txt", "content": content});
        let params = json!({"name": "write_file", "arguments": args});
        let answer = ask(&mut requests, &mut answers, id, "tools/call", params).await;
        let result = &answer["result"];
        assert_eq!(result["isError"], over, "{answer:.300}");
        if over {
            let code = &result["structuredContent"]["error"]["code"];
            assert_eq!(code, "limit_exceeded", "{answer:.300}");
        } else {
            let written = &result["structuredContent"]["result"]["bytes_written"];
            assert_eq!(written, limit, "{answer:.300}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_over_http_large_read_arrives_whole() {
    large_read_arrives_whole(Via::Http).await;
}

/// An approver that never answers, and says when it is asked and when the question is withdrawn.
struct Hanging {
    asked: mpsc::UnboundedSender<ApprovalRequest>,
    withdrawn: mpsc::UnboundedSender<()>,
}

struct Withdrawn(mpsc::UnboundedSender<()>);

impl Drop for Withdrawn {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

impl Approver for Hanging {
    fn decide(&self, request: ApprovalRequest) -> Pin<Box<dyn Future<Output = Decision> + Send>> {
        let _ = self.asked.send(request);
        let guard = Withdrawn(self.withdrawn.clone());
        Box::pin(async move {
            let _guard = guard;
            std::future::pending().await
        })
    }
}

/// A folder `laptop` (holding `notes.txt`) attached to a server, whose owner never answers:
/// each question asked, and each withdrawn, arrives on its receiver.
struct Unanswered {
    asked: mpsc::UnboundedReceiver<ApprovalRequest>,
    withdrawn: mpsc::UnboundedReceiver<()>,
    _attached: Attachment,
    _dir: TempDir,
}

impl Unanswered {
    async fn attach(server: &TestServer) -> Unanswered {
        let (asked_tx, asked) = mpsc::unbounded_channel();
        let (withdrawn_tx, withdrawn) = mpsc::unbounded_channel();
        let approver = Hanging {
            asked: asked_tx,
            withdrawn: withdrawn_tx,
        };
        let dir = folder(&[("notes.txt", "x\n")]);
        let attached = Attachment::start(
            &server.client_config(),
            attach_options(dir.path(), "laptop"),
            Some(Arc::new(approver)),
        )
        .await;
        Unanswered {
            asked,
            withdrawn,
            _attached: attached,
            _dir: dir,
        }
    }
}

/// While a call waits for approval the host sees progress and a log line; cancelling the
/// request withdraws the prompt on the laptop.
async fn approval_progress_and_cancel(via: Via) {
    let (server, http) = server().await;
    let mut host = connect(&server, http, via, None)
        .await
        .expect("the host connects");
    let mut laptop = Unanswered::attach(&server).await;

    let params = CallToolRequestParams::new("read_file")
        .with_arguments(json!({"path": "notes.txt"}).as_object().cloned().unwrap());
    let handle = host
        .client
        .send_cancellable_request(
            ClientRequest::CallToolRequest(CallToolRequest::new(params)),
            PeerRequestOptions::no_options(),
        )
        .await
        .expect("the call is sent");
    let request = within(STEP, "the approval prompt", laptop.asked.recv())
        .await
        .expect("asked");
    assert_eq!(request.target, "notes.txt");
    // Progress travels with the call, the log line on the host's standalone stream (over
    // HTTP): they may come in either order.
    let (mut progress, mut log) = (false, false);
    while !(progress && log) {
        match host
            .expect("progress and a log line", |s| {
                !matches!(s, Seen::ListChanged)
            })
            .await
        {
            Seen::Progress(m) => progress |= m.contains("waiting for the user"),
            Seen::Log(m) => log |= m.contains("to approve `read_file`"),
            Seen::ListChanged => {}
        }
    }

    handle
        .cancel(Some("the user changed their mind".into()))
        .await
        .expect("cancel is sent");
    within(STEP, "the prompt to be withdrawn", laptop.withdrawn.recv())
        .await
        .expect("withdrawn");
    let _ = host.client.cancel().await;
}

/// The attack: a host ends `monad-client mcp` (SIGTERM, as the MCP SDKs do when they shut down
/// and the server has not exited) while a call waits for the folder's owner. The process used
/// to die without a word to the server, which noticed when the connection timed out (about
/// 8 s): until then the prompt stayed up, and an approval ran a call for a host that was gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_over_stdio_ended_by_a_signal_closes_its_connection_and_withdraws_the_prompt() {
    // (signal, whether the front starts with SIGINT ignored, as a background job of a
    // non-interactive shell does: it must stay ignored, not become a way to end it)
    for (signal, ignoring) in [
        (nix::sys::signal::SIGTERM, false),
        (nix::sys::signal::SIGINT, false),
        (nix::sys::signal::SIGTERM, true),
    ] {
        let (server, _http) = server().await;
        let mut laptop = Unanswered::attach(&server).await;
        let config = saved_config(&server.client_config());
        let cmd = if ignoring {
            // `trap '' INT` ignores SIGINT, and `exec` keeps it so for the program.
            let mut sh = monad_tests::command("monad-client");
            let sh = sh.as_std_mut();
            let program = sh.get_program().to_owned();
            let mut cmd = tokio::process::Command::new("sh");
            cmd.arg("-c")
                .arg(r#"trap '' INT; exec "$0" mcp"#)
                .arg(program)
                .envs(sh.get_envs().filter_map(|(k, v)| Some((k, v?))));
            cmd
        } else {
            let mut cmd = monad_tests::command("monad-client");
            cmd.arg("mcp");
            cmd
        };
        let mut front = front_on_pipes(cmd, config.path());
        let mut requests = front.stdin.take().expect("its standard input");
        let mut answers = tokio::io::BufReader::new(front.stdout.take().expect("its output"));
        let mut lines = tokio::io::AsyncBufReadExt::lines(&mut answers);
        initialize(&mut requests, &mut lines, "signal").await;
        let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "read_file", "arguments": {"path": "notes.txt", "workspace": "laptop"}}});
        tokio::io::AsyncWriteExt::write_all(&mut requests, format!("{call}\n").as_bytes())
            .await
            .expect("the call is written");
        within(STEP, "the approval prompt", laptop.asked.recv())
            .await
            .expect("asked");
        let pid = nix::unistd::Pid::from_raw(front.id().expect("running") as i32);
        if ignoring {
            nix::sys::signal::kill(pid, nix::sys::signal::SIGINT).expect("signalled");
            let _ = ask(&mut requests, &mut lines, 3, "ping", json!({})).await;
            assert!(
                front.try_wait().expect("its state").is_none(),
                "an ignored SIGINT ended it"
            );
        }
        nix::sys::signal::kill(pid, signal).expect("signalled");
        let status = within(STEP, "monad-client mcp to exit", front.wait())
            .await
            .expect("reaped");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(signal as i32),
            "ended by {signal}: {status}"
        );
        // Withdrawn because the front closed its connection, well before the connection's
        // time-out could have told the server.
        within(
            monad_protocol::pin::IDLE_TIMEOUT / 2,
            "the prompt to be withdrawn",
            laptop.withdrawn.recv(),
        )
        .await
        .expect("withdrawn");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_over_stdio_reports_approval_progress_and_cancel_withdraws_the_prompt() {
    approval_progress_and_cancel(Via::Stdio).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_over_http_reports_approval_progress_and_cancel_withdraws_the_prompt() {
    approval_progress_and_cancel(Via::Http).await;
}

async fn session_meta_resumes_the_session(via: Via) {
    let (server, http) = server().await;
    let id = "6f9619ff-8b86-d011-b42d-00c04fc964ff";
    let first = connect(&server, http, via, Some(id))
        .await
        .expect("the host connects");
    let info = first.client.peer_info().expect("server info");
    let meta = info.meta.clone().expect("initialize answers with _meta");
    assert_eq!(meta.get("sessionId"), Some(&Value::from(id)));
    let stored = first
        .call("memory_store", json!({"key": "plan", "text": "ship it"}))
        .await;
    assert_eq!(stored.is_error, Some(false), "{}", text(&stored));
    let _ = first.client.cancel().await;
    assert!(server.primary_dir(id).join("memory/plan.md").is_file());

    // A later connection naming the same id works in the same session...
    let again = connect(&server, http, via, Some(id))
        .await
        .expect("resumed");
    let recalled = again.call("memory_recall", json!({})).await;
    let notes = &recalled.structured_content.clone().unwrap()["result"]["notes"];
    assert_eq!(notes[0]["text"], "ship it", "{notes}");
    // A query that matches nothing says the memory holds notes (it read as an empty memory),
    // and the result still fits the tool's outputSchema.
    let missed = again.call("memory_recall", json!({"query": "zzz"})).await;
    assert_eq!(
        text(&missed),
        "No note matches the query; the memory holds 1 note (without `query`, every note)."
    );
    assert_eq!(
        missed.structured_content.clone().unwrap()["result"]["not_matching"],
        1
    );
    // ... and one without it works in `default`, which has no such note.
    let other = connect(&server, http, via, None).await.expect("default");
    let recalled = other.call("memory_recall", json!({})).await;
    let notes = &recalled.structured_content.clone().unwrap()["result"]["notes"];
    assert_eq!(notes, &json!([]));

    // A session id that is neither `default` nor a UUID fails initialize; so does a prefix of
    // an existing session's id (over stdio it opened that session, where HTTP refused it).
    assert!(connect(&server, http, via, Some("../etc")).await.is_err());
    assert!(
        connect(&server, http, via, Some(&id[..8])).await.is_err(),
        "a prefix names no session"
    );
    let _ = again.client.cancel().await;
    let _ = other.client.cancel().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_over_stdio_initialize_meta_session_id_resumes_that_session() {
    session_meta_resumes_the_session(Via::Stdio).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_over_http_initialize_meta_session_id_resumes_that_session() {
    session_meta_resumes_the_session(Via::Http).await;
}

/// One raw HTTP/1.1 POST to the MCP endpoint; returns the status line and headers.
fn post(addr: SocketAddr, authorization: Option<&str>) -> String {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let mut request = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if let Some(value) = authorization {
        request.push_str(&format!("Authorization: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    let mut stream = std::net::TcpStream::connect(addr).expect("connects");
    stream.set_read_timeout(Some(STEP)).expect("read time-out");
    stream.write_all(request.as_bytes()).expect("sent");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
        .split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_lowercase()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_over_http_refuses_requests_without_a_valid_token() {
    let (server, http) = server().await;
    let revoked = server.create_token("ben");
    let id = server.state().tokens.list().unwrap()[1].id.clone();
    assert!(server.state().tokens.revoke(&id).unwrap());
    let answers = tokio::task::spawn_blocking(move || {
        [
            post(http, None),
            post(http, Some("Bearer mnd_not_a_token")),
            post(http, Some(&format!("Bearer {revoked}"))),
            post(http, Some("Basic YWRtaW46YWRtaW4=")),
        ]
    })
    .await
    .unwrap();
    for answer in answers {
        assert!(answer.starts_with("http/1.1 401"), "{answer}");
        assert!(answer.contains("www-authenticate: bearer"), "{answer}");
    }
    let token = server.token.clone();
    let ok = tokio::task::spawn_blocking(move || post(http, Some(&format!("Bearer {token}"))))
        .await
        .unwrap();
    assert!(!ok.starts_with("http/1.1 401"), "{ok}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_over_stdio_reconnects_after_a_server_restart_and_keeps_following_the_session() {
    let (server, http) = server().await;
    let mut host = connect(&server, http, Via::Stdio, None)
        .await
        .expect("the host connects");
    host.tools().await;
    let server = server.stop().await.restart().await;
    // The bridge watches again on a new connection and tells the host to list again.
    host.expect("tools/list_changed after the reconnect", |s| {
        *s == Seen::ListChanged
    })
    .await;
    let dir = folder(&[("notes.txt", "back again\n")]);
    let mut options = attach_options(dir.path(), "laptop");
    options.allow = vec![ToolClass::Read];
    let _attached = Attachment::start(&server.client_config(), options, None).await;
    host.expect("tools/list_changed after attach", |s| {
        *s == Seen::ListChanged
    })
    .await;
    let result = host.call("read_file", json!({"path": "notes.txt"})).await;
    assert_eq!(result.is_error, Some(false), "{}", text(&result));
    assert_eq!(
        result.structured_content.unwrap()["result"]["content"],
        "back again\n"
    );
    let _ = host.client.cancel().await;
}

/// A token revoked while one of its calls runs over MCP HTTP cuts that call short: it is
/// cancelled (its command stopped) and answered as such, rather than left to run out its time
/// on a token that no longer holds. (Its later requests were already refused.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_over_http_is_cancelled_when_its_token_is_revoked() {
    let (server, http) = server().await;
    let host = connect(&server, http, Via::Http, None)
        .await
        .expect("the host connects");
    let primary = server.data_dir().join("sessions/default/workspace");
    let args = json!({
        "argv": ["sh", "-c", "echo started > running; exec sleep 60.25"],
        "workspace": "primary",
        "timeout_ms": 120_000,
    });
    let call = tokio::spawn(async move { host.try_call("run_command", args).await });
    // Its `sleep` is found by its argument (the command's own PID is its namespace's).
    let sleeping = || {
        std::fs::read_dir("/proc").unwrap().flatten().any(|p| {
            std::fs::read(p.path().join("cmdline")).is_ok_and(|c| c == b"sleep\x0060.25\x00")
        })
    };
    within(STEP, "the command to start", async {
        while !(primary.join("running").exists() && sleeping()) {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await;
    let id = server.token.split('_').nth(1).expect("mnd_ID_SECRET");
    assert!(server.state().tokens.revoke(id).unwrap());
    // Checked every 5 s: the call ends well within `STEP`, not after its 60 s.
    let answered = call.await.expect("the call's task");
    match answered {
        Ok(result) => {
            assert_eq!(result.is_error, Some(true), "{result:?}");
            assert!(text(&result).contains("revoked"), "{}", text(&result));
        }
        Err(e) => assert!(e.to_string().contains("revoked"), "{e}"),
    }
    within(STEP, "the command to be stopped", async {
        while sleeping() {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await;
}

/// Out of order over stdio: a notification or a response before `initialize` is ignored (the
/// bridge exited on it, its host none the wiser), a ping there is answered and another request
/// refused with an error; a second `initialize` is answered in the same session; the session
/// goes on after each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_over_stdio_answers_messages_out_of_order_and_goes_on() {
    use tokio::io::AsyncWriteExt;
    let (server, _http) = server().await;
    let config = saved_config(&server.client_config());
    let (mut front, mut requests, mut answers) = mcp_front(config.path());
    for early in [
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}),
        json!({"jsonrpc": "2.0", "id": 40, "result": {}}),
    ] {
        requests
            .write_all(format!("{early}\n").as_bytes())
            .await
            .expect("written");
    }
    let ping = ask(&mut requests, &mut answers, 7, "ping", json!({})).await;
    assert_eq!(ping["result"], json!({}), "{ping}");
    let list = ask(&mut requests, &mut answers, 8, "tools/list", json!({})).await;
    assert!(list["error"].is_object(), "{list:.300}");
    let first = initialize(&mut requests, &mut answers, "order").await;
    assert!(first["result"]["serverInfo"].is_object(), "{first:.300}");
    // A second `initialize` is answered as the first (the session kept).
    let again = initialize(&mut requests, &mut answers, "order").await;
    assert_eq!(
        again["result"]["_meta"], first["result"]["_meta"],
        "{again:.300}"
    );
    let call = json!({"name": "write_file", "arguments": {"path": "a.txt", "content": "in order"}});
    let wrote = ask(&mut requests, &mut answers, 9, "tools/call", call).await;
    assert_eq!(wrote["result"]["isError"], false, "{wrote:.300}");
    assert!(
        front.try_wait().expect("its state").is_none(),
        "still running"
    );
}

/// `monad-client mcp` in front of a server older than protocol minor 13 does not offer the model
/// `search`'s `context` and `files_only`, which that server would refuse; in front of a current
/// one it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_arguments_an_older_server_lacks_are_not_offered_to_the_model() {
    use monad_protocol::io::{read_message, write_message};
    use monad_protocol::wire::{Host, Message, Trust, WorkspaceInfo};
    let listed = async |minor: u32| -> Vec<String> {
        let server = monad_tests::RogueServer::start(|_| {});
        let endpoint = server.endpoint.clone();
        // Answers each listing and watch of the workspaces with the primary alone: a listing's
        // stream ends, a watch's stays open until the test ends (its tasks aborted together).
        let rogue = tokio::spawn(async move {
            let conn = monad_tests::RogueServer::welcome_as(&endpoint, minor).await;
            let mut streams = tokio::task::JoinSet::new();
            while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                streams.spawn(async move {
                    let (id, watch) = match read_message(&mut recv, 1 << 20).await {
                        Ok(Some(Message::ListWorkspaces { id, .. })) => (id, false),
                        Ok(Some(Message::Watch { id, .. })) => (id, true),
                        _ => return,
                    };
                    let primary = WorkspaceInfo {
                        name: "primary".into(),
                        uri: "server:/sessions/default".into(),
                        trust: Trust::Full,
                        host: Host::Server,
                        online: true,
                        tools: monad_protocol::ToolName::WORKSPACE_TOOLS.to_vec(),
                        network: None,
                    };
                    let answer = Message::Workspaces {
                        id,
                        session: "default".into(),
                        workspaces: vec![primary],
                    };
                    let _ = write_message(&mut send, &answer).await;
                    if watch {
                        std::future::pending::<()>().await;
                    }
                    let _ = send.finish();
                    let _ = send.stopped().await;
                });
            }
            drop(endpoint);
        });
        let dir = saved_config(&server.client_config());
        let transport = stdio_bridge(dir.path());
        let client = within(STEP, "initialize over stdio", ().serve(transport))
            .await
            .expect("initialized");
        let tools = within(STEP, "tools/list", client.list_all_tools())
            .await
            .expect("listed");
        // A search naming `context` all the same (a host that listed the tools before a
        // reconnect) is refused by the front, saying why, before it reaches an older server.
        let params = CallToolRequestParams::new("search").with_arguments(
            json!({"pattern": "x", "context": 2})
                .as_object()
                .cloned()
                .unwrap(),
        );
        let called = within(STEP, "tools/call", client.call_tool(params))
            .await
            .expect("answered");
        if minor < monad_protocol::wire::SEARCH_CONTEXT_MINOR {
            assert_eq!(called.is_error, Some(true), "{called:?}");
            assert!(
                text(&called).contains("does not take `context`"),
                "{}",
                text(&called)
            );
        }
        rogue.abort();
        let search = tools
            .iter()
            .find(|t| t.name == "search")
            .expect("search is listed");
        let mut properties: Vec<String> = search.input_schema["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        properties.sort();
        properties
    };
    let older = listed(monad_protocol::wire::SEARCH_CONTEXT_MINOR - 1).await;
    assert!(older.contains(&"pattern".to_owned()), "{older:?}");
    assert!(
        !older.contains(&"context".to_owned()) && !older.contains(&"files_only".to_owned()),
        "{older:?}"
    );
    let current = listed(monad_protocol::wire::PROTOCOL_MINOR).await;
    assert!(
        current.contains(&"context".to_owned()) && current.contains(&"files_only".to_owned()),
        "{current:?}"
    );
}
