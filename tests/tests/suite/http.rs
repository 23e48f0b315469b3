//! The HTTP listener has time-outs and limits (issue 9, item 13): half-sent request heads and
//! idle connections are cut, connections are bounded, `Origin` is checked on `/mcp`, and each
//! MCP session belongs to the user who opened it. Over real TCP.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use monad_tests::{STEP, TestServer, within};

/// A server with its HTTP endpoint on a free loopback port, tuned by `tune`.
async fn server(tune: impl FnOnce(&mut monad_server::ServerConfig)) -> (TestServer, SocketAddr) {
    let free = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let http = free.local_addr().expect("its address");
    drop(free);
    let server = TestServer::start_with(|c| {
        c.http = Some(http);
        tune(c);
    })
    .await;
    (server, http)
}

/// An answer: status code, headers (lowercase names), body.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One request on its own connection (`Connection: close`), read to its end.
fn request(addr: SocketAddr, method: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    let mut text = format!(
        "{method} /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n",
        addr.port(),
        body.len()
    );
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str("\r\n");
    text.push_str(body);
    let mut stream = TcpStream::connect(addr).expect("connects");
    stream.set_read_timeout(Some(STEP)).expect("read time-out");
    stream.write_all(text.as_bytes()).expect("sent");
    let mut raw = String::new();
    let _ = stream.read_to_string(&mut raw);
    parse(&raw)
}

fn parse(raw: &str) -> Answer {
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((raw, ""));
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_lowercase(), v.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
const PING: &str = r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#;

/// Runs blocking socket work off the runtime, bounded.
async fn blocking<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    within(STEP, what, tokio::task::spawn_blocking(f))
        .await
        .expect("the blocking task")
}

/// Reads from `stream` until the server closes it; what it sent.
fn read_until_closed(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the server did not close the connection: {e}"),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_is_cut_after_the_header_time_out_and_others_are_served() {
    let (server, http) = server(|c| {
        c.http_limits.header_timeout = Duration::from_millis(300);
    })
    .await;
    let token = server.token.clone();
    let slow = blocking("the slowloris", move || {
        let mut stream = TcpStream::connect(http).expect("connects");
        stream
            .write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            .expect("half a head");
        stream.set_read_timeout(Some(STEP)).expect("read time-out");
        // Meanwhile an honest client is served.
        let honest = request(
            http,
            "POST",
            &[("Authorization", &format!("Bearer {token}"))],
            INITIALIZE,
        );
        (read_until_closed(&mut stream), honest)
    })
    .await;
    let (cut, honest) = slow;
    assert!(!cut.contains("200"), "the half head got an answer: {cut}");
    assert_eq!(honest.status, 200, "{honest:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed_after_the_idle_time_out() {
    let (server, http) = server(|c| {
        c.http_limits.idle_timeout = Duration::from_millis(300);
    })
    .await;
    let token = server.token.clone();
    let said = blocking("an idle keep-alive connection", move || {
        let mut stream = TcpStream::connect(http).expect("connects");
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
             Content-Length: {}\r\n\r\n{INITIALIZE}",
            INITIALIZE.len()
        );
        stream.write_all(head.as_bytes()).expect("sent");
        stream.set_read_timeout(Some(STEP)).expect("read time-out");
        // Answered, then left idle on a keep-alive connection: closed by the server.
        read_until_closed(&mut stream)
    })
    .await;
    assert!(said.starts_with("HTTP/1.1 200"), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_bound_are_answered_503_and_closed() {
    let (server, http) = server(|c| c.http_limits.max_connections = 3).await;
    let token = server.token.clone();
    blocking("connections over the bound", move || {
        let held: Vec<TcpStream> = (0..3)
            .map(|_| TcpStream::connect(http).expect("connects"))
            .collect();
        // The fourth: a clear refusal at once, not a hang.
        let mut fourth = TcpStream::connect(http).expect("connects");
        fourth.set_read_timeout(Some(STEP)).expect("read time-out");
        let said = read_until_closed(&mut fourth);
        assert!(said.starts_with("HTTP/1.1 503"), "{said}");
        // A slot that frees is used again (the server notices the close, then serves).
        drop(held);
        let deadline = std::time::Instant::now() + STEP;
        loop {
            let answer = request(
                http,
                "POST",
                &[("Authorization", &format!("Bearer {token}"))],
                INITIALIZE,
            );
            if answer.status == 200 {
                break;
            }
            assert_eq!(answer.status, 503, "{answer:?}");
            assert!(std::time::Instant::now() < deadline, "no slot freed");
            std::thread::yield_now();
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_that_is_not_allowed_is_refused_before_anything_else() {
    let (server, http) = server(|c| {
        c.http_limits.allowed_origins = vec!["https://app.example".into()];
    })
    .await;
    let bearer = format!("Bearer {}", server.token);
    let answers = blocking("requests with origins", move || {
        let own = format!("http://127.0.0.1:{}", http.port());
        let localhost = format!("http://localhost:{}", http.port());
        [
            (
                "http://evil.example",
                request(
                    http,
                    "POST",
                    &[
                        ("Authorization", &bearer),
                        ("Origin", "http://evil.example"),
                    ],
                    INITIALIZE,
                ),
            ),
            (
                "no token, evil",
                request(
                    http,
                    "POST",
                    &[("Origin", "http://evil.example")],
                    INITIALIZE,
                ),
            ),
            (
                "null",
                request(
                    http,
                    "POST",
                    &[("Authorization", &bearer), ("Origin", "null")],
                    INITIALIZE,
                ),
            ),
            (
                "another port",
                request(
                    http,
                    "POST",
                    &[("Authorization", &bearer), ("Origin", "http://127.0.0.1:1")],
                    INITIALIZE,
                ),
            ),
            (
                "own",
                request(
                    http,
                    "POST",
                    &[("Authorization", &bearer), ("Origin", &own)],
                    INITIALIZE,
                ),
            ),
            (
                "localhost",
                request(
                    http,
                    "POST",
                    &[("Authorization", &bearer), ("Origin", &localhost)],
                    INITIALIZE,
                ),
            ),
            (
                "configured",
                request(
                    http,
                    "POST",
                    &[
                        ("Authorization", &bearer),
                        ("Origin", "https://app.example"),
                    ],
                    INITIALIZE,
                ),
            ),
            (
                "none",
                request(http, "POST", &[("Authorization", &bearer)], INITIALIZE),
            ),
        ]
    })
    .await;
    for (origin, answer) in answers {
        let allowed = matches!(origin, "own" | "localhost" | "configured" | "none");
        if allowed {
            assert_eq!(answer.status, 200, "{origin}: {answer:?}");
        } else {
            assert_eq!(answer.status, 403, "{origin}: {answer:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_users_requests_on_an_mcp_session_are_not_found_and_leave_it_alone() {
    let (server, http) = server(|_| {}).await;
    let ana = format!("Bearer {}", server.token);
    let ben = format!("Bearer {}", server.create_token("ben"));
    blocking("two users and one MCP session", move || {
        let opened = request(http, "POST", &[("Authorization", &ana)], INITIALIZE);
        assert_eq!(opened.status, 200, "{opened:?}");
        let id = opened
            .header("mcp-session-id")
            .expect("a session id")
            .to_owned();
        let in_session = |auth: &str| {
            vec![
                ("Authorization", auth.to_owned()),
                ("Mcp-Session-Id", id.clone()),
                ("MCP-Protocol-Version", "2025-06-18".to_owned()),
            ]
        };
        let as_refs =
            |h: &Vec<(&'static str, String)>| -> Vec<(&'static str, String)> { h.clone() };
        let send = |method: &str, auth: &str, body: &str| {
            let headers = as_refs(&in_session(auth));
            let refs: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
            request(http, method, &refs, body)
        };
        assert_eq!(send("POST", &ana, INITIALIZED).status, 202);
        for (method, body) in [("DELETE", ""), ("POST", PING), ("GET", "")] {
            let answer = send(method, &ben, body);
            assert_eq!(answer.status, 404, "ben's {method}: {answer:?}");
        }
        // Ana's session is still there and works.
        let ping = send("POST", &ana, PING);
        assert_eq!(ping.status, 200, "{ping:?}");
        assert!(ping.body.contains("\"result\""), "{ping:?}");
        // Her own DELETE ends it; after that it is gone for her too.
        assert!(send("DELETE", &ana, "").status < 300);
        assert_eq!(send("POST", &ana, PING).status, 404);
    })
    .await;
}
