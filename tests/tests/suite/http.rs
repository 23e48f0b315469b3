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
    request_to(addr, method, "/mcp", headers, body)
}

/// [`request`] on `path`.
fn request_to(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut text = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n",
        addr.port(),
        body.len()
    );
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str("\r\n");
    text.push_str(body);
    exchange(addr, [text.as_bytes()])
}

/// Sends `pieces` on a connection of their own and reads the answer to its end.
fn exchange<'a>(addr: SocketAddr, pieces: impl IntoIterator<Item = &'a [u8]>) -> Answer {
    let mut stream = TcpStream::connect(addr).expect("connects");
    stream.set_read_timeout(Some(STEP)).expect("read time-out");
    for piece in pieces {
        stream.write_all(piece).expect("sent");
    }
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

/// Opens an MCP session as the holder of `auth` (`Bearer ...`); its id.
fn open_session(http: SocketAddr, auth: &str) -> String {
    let opened = request(http, "POST", &[("Authorization", auth)], INITIALIZE);
    assert_eq!(opened.status, 200, "{opened:?}");
    opened
        .header("mcp-session-id")
        .expect("a session id")
        .to_owned()
}

/// The headers of a request in MCP session `id` as the holder of `auth`.
fn session_headers<'a>(auth: &'a str, id: &'a str) -> [(&'a str, &'a str); 3] {
    [
        ("Authorization", auth),
        ("Mcp-Session-Id", id),
        ("MCP-Protocol-Version", "2025-06-18"),
    ]
}

/// Opens an MCP session as the holder of `auth` and says it is initialized; its id.
fn initialized_session(http: SocketAddr, auth: &str) -> String {
    let id = open_session(http, auth);
    let initialized = request(http, "POST", &session_headers(auth, &id), INITIALIZED);
    assert_eq!(initialized.status, 202, "{initialized:?}");
    id
}

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
        // Connections that authenticated (those that did not make room for newcomers).
        let held: Vec<TcpStream> = (0..3)
            .map(|_| {
                let mut stream = TcpStream::connect(http).expect("connects");
                keep_alive(&mut stream, Some(&format!("Bearer {token}")), INITIALIZE);
                let head = answer_head(&mut stream);
                assert!(head.starts_with("HTTP/1.1 200"), "{head}");
                stream
            })
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
        let id = open_session(http, &ana);
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

/// On a loopback address, every path answers only to loopback host names: a page on another
/// site whose name resolves to 127.0.0.1 (DNS rebinding) reached the API and the web view under
/// its own name; only `/mcp` checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_loopback_every_path_refuses_a_host_that_is_not_loopback() {
    let (server, http) = server(|_| {}).await;
    let bearer = format!("Bearer {}", server.token);
    blocking("requests under other host names", move || {
        let get = |path: &str, host: &str| {
            let text = format!(
                "GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: {bearer}\r\n\
                 Connection: close\r\n\r\n"
            );
            let mut stream = TcpStream::connect(http).expect("connects");
            stream.set_read_timeout(Some(STEP)).expect("read time-out");
            stream.write_all(text.as_bytes()).expect("sent");
            let mut raw = String::new();
            let _ = stream.read_to_string(&mut raw);
            parse(&raw)
        };
        let port = http.port();
        for path in ["/api/v1/sessions", "/login", "/"] {
            for host in ["evil.example", "evil.example:80", "127.0.0.1.evil.example"] {
                let answer = get(path, host);
                assert_eq!(answer.status, 403, "{path} as {host}: {answer:?}");
            }
            for host in [
                format!("127.0.0.1:{port}"),
                format!("localhost:{port}"),
                "127.0.0.1".to_owned(),
            ] {
                let answer = get(path, &host);
                assert_ne!(answer.status, 403, "{path} as {host}: {answer:?}");
            }
        }
    })
    .await;
}

/// `default` in `_meta.sessionId` is the caller's own default, as over QUIC: a second user who
/// named it was refused, "belongs to another user".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_user_who_names_default_over_mcp_gets_their_own() {
    let (server, http) = server(|_| {}).await;
    let ana = format!("Bearer {}", server.token);
    let ben = format!("Bearer {}", server.create_token("ben"));
    const NAMING_DEFAULT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"_meta":{"sessionId":"default"},"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    blocking("two users naming default", move || {
        let session_of = |auth: &str| {
            let opened = request(http, "POST", &[("Authorization", auth)], NAMING_DEFAULT);
            assert_eq!(opened.status, 200, "{opened:?}");
            assert!(!opened.body.contains("\"error\""), "{opened:?}");
            let at = opened
                .body
                .find("\"sessionId\":\"")
                .expect("the session in _meta")
                + 13;
            opened.body[at..].split('"').next().unwrap().to_owned()
        };
        assert_eq!(session_of(&ana), "default");
        let bens = session_of(&ben);
        assert_ne!(bens, "default", "ana's is not ben's");
        assert_eq!(session_of(&ben), bens, "and it stays his");
    })
    .await;
}

/// A connection to `http` from `127.0.0.<n>` (on Linux every address of 127/8 is the loopback
/// interface's). Call from a blocking task.
fn from_loopback(n: u8, http: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
    socket
        .bind(SocketAddr::from(([127, 0, 0, n], 0)))
        .expect("bound to 127.0.0.x");
    let stream = tokio::runtime::Handle::current()
        .block_on(socket.connect(http))
        .expect("connects");
    let stream = stream.into_std().expect("a std stream");
    stream.set_nonblocking(false).expect("blocking");
    stream
}

/// A request on a keep-alive connection (no `Connection: close`).
fn keep_alive(stream: &mut TcpStream, auth: Option<&str>, body: &str) {
    let auth = auth
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    let text = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(text.as_bytes()).expect("sent");
}

/// Reads the status line and headers of the next answer on `stream` (bounded).
fn answer_head(stream: &mut TcpStream) -> String {
    stream.set_read_timeout(Some(STEP)).expect("read time-out");
    let mut out = Vec::new();
    let mut byte = [0u8; 1];
    while !out.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => out.push(byte[0]),
            other => panic!(
                "no answer head: {other:?} after {:?}",
                String::from_utf8_lossy(&out)
            ),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_closes_its_connection() {
    // Nothing expires during the test: only the refusal may close the connection.
    let (_server, http) = server(|c| c.http_limits.idle_timeout = Duration::from_secs(600)).await;
    blocking("refused requests on keep-alive connections", move || {
        let mut no_token = TcpStream::connect(http).expect("connects");
        keep_alive(&mut no_token, None, INITIALIZE);
        let said = read_until_closed(&mut no_token);
        assert!(said.starts_with("HTTP/1.1 401"), "{said}");
        let mut bad_token = TcpStream::connect(http).expect("connects");
        keep_alive(&mut bad_token, Some("Bearer not-a-token"), INITIALIZE);
        let said = read_until_closed(&mut bad_token);
        assert!(said.starts_with("HTTP/1.1 401"), "{said}");
        let mut evil = TcpStream::connect(http).expect("connects");
        evil.write_all(
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://evil.example\r\n\
              Content-Length: 0\r\n\r\n",
        )
        .expect("sent");
        let said = read_until_closed(&mut evil);
        assert!(said.starts_with("HTTP/1.1 403"), "{said}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_authenticate_cannot_keep_a_token_holder_out() {
    let (server, http) = server(|c| {
        c.http_limits.max_connections = 4;
        // Nothing expires: only making room can let the token holder in.
        c.http_limits.header_timeout = Duration::from_secs(600);
        c.http_limits.idle_timeout = Duration::from_secs(600);
    })
    .await;
    let token = server.token.clone();
    blocking(
        "connections without a token from four addresses",
        move || {
            let mut held: Vec<TcpStream> = (2..6).map(|n| from_loopback(n, http)).collect();
            // Each sends nothing, or half a head; none ever shows a token.
            held[0].write_all(b"POST /mcp HTTP/1.1\r\n").expect("sent");
            let mut honest = TcpStream::connect(http).expect("connects");
            keep_alive(&mut honest, Some(&format!("Bearer {token}")), INITIALIZE);
            let head = answer_head(&mut honest);
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            // The oldest made room.
            held[0].set_read_timeout(Some(STEP)).expect("read time-out");
            let said = read_until_closed(&mut held[0]);
            assert!(!said.contains("200"), "{said}");
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holds_at_most_its_bound_of_connections() {
    let (server, http) = server(|c| {
        c.http_limits.max_connections = 8;
        c.http_limits.max_connections_per_address = 2;
        c.http_limits.header_timeout = Duration::from_secs(600);
    })
    .await;
    let token = server.token.clone();
    blocking("three connections from one address", move || {
        let _held: Vec<TcpStream> = (0..2).map(|_| from_loopback(2, http)).collect();
        let mut third = from_loopback(2, http);
        third.set_read_timeout(Some(STEP)).expect("read time-out");
        let said = read_until_closed(&mut third);
        assert!(said.starts_with("HTTP/1.1 503"), "{said}");
        assert!(said.contains("http_max_connections_per_address"), "{said}");
        // Another address is served.
        let mut honest = TcpStream::connect(http).expect("connects");
        keep_alive(&mut honest, Some(&format!("Bearer {token}")), INITIALIZE);
        let head = answer_head(&mut honest);
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_authenticated_is_not_kept_idle() {
    let (_server, http) = server(|c| {
        c.http_limits.header_timeout = Duration::from_millis(300);
        c.http_limits.idle_timeout = Duration::from_secs(600);
    })
    .await;
    blocking("a request elsewhere than /mcp, then idle", move || {
        let mut stream = TcpStream::connect(http).expect("connects");
        stream
            .write_all(b"GET /elsewhere HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .expect("sent");
        // Answered, then closed well before the ten-minute idle time-out.
        let said = read_until_closed(&mut stream);
        assert!(said.starts_with("HTTP/1.1 "), "{said}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_that_trickles_is_cut_after_the_body_time_out() {
    let (server, http) = server(|c| {
        c.http_limits.body_timeout = Duration::from_millis(300);
        c.http_limits.idle_timeout = Duration::from_secs(600);
    })
    .await;
    let token = server.token.clone();
    blocking("a body that never ends", move || {
        let mut stream = TcpStream::connect(http).expect("connects");
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
             Content-Length: {}\r\n\r\n{}",
            INITIALIZE.len(),
            &INITIALIZE[..10]
        );
        stream.write_all(head.as_bytes()).expect("sent");
        stream.set_read_timeout(Some(STEP)).expect("read time-out");
        let said = read_until_closed(&mut stream);
        assert!(!said.contains("200"), "{said}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_user_holds_at_most_their_bound_of_connections() {
    let (server, http) = server(|c| {
        c.http_limits.max_connections_per_user = 2;
        c.http_limits.idle_timeout = Duration::from_secs(600);
    })
    .await;
    let ana = format!("Bearer {}", server.token);
    let ben = format!("Bearer {}", server.create_token("ben"));
    blocking("three connections of one user", move || {
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut stream = TcpStream::connect(http).expect("connects");
            keep_alive(&mut stream, Some(&ana), INITIALIZE);
            let head = answer_head(&mut stream);
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            held.push(stream);
        }
        let mut third = TcpStream::connect(http).expect("connects");
        keep_alive(&mut third, Some(&ana), INITIALIZE);
        let said = read_until_closed(&mut third);
        assert!(said.starts_with("HTTP/1.1 429"), "{said}");
        assert!(said.contains("http_max_connections_per_user"), "{said}");
        // Another user is served.
        let mut other = TcpStream::connect(http).expect("connects");
        keep_alive(&mut other, Some(&ben), INITIALIZE);
        let head = answer_head(&mut other);
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    })
    .await;
}

/// An MCP request's body counts in its user's call memory before rmcp makes a tree of it: one
/// of more values than any tool takes is refused with `413`, one whose tree would take the
/// user's calls past their bound with `429` naming the key, and a call within it goes through.
/// (A 4 MiB body of small numbers became a 64 MiB tree, any number of them at once while they
/// waited for a landing or a call slot.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_requests_tree_is_counted_before_it_is_made() {
    const MIB: usize = 1024 * 1024;
    let (server, http) = server(|c| c.quotas.max_call_bytes_per_user = 5 * MIB).await;
    let ana = format!("Bearer {}", server.token);
    blocking("MCP calls of many values", move || {
        let id = initialized_session(http, &ana);
        let headers = session_headers(&ana, &id);
        let call = |values: usize| {
            let argv = serde_json::Value::Array(vec![serde_json::json!(0); values]);
            let body = serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": {"name": "run_command", "arguments": {"argv": argv}}});
            request(http, "POST", &headers, &body.to_string())
        };
        let many = call(1_000_001);
        assert_eq!(many.status, 413, "{many:?}");
        assert!(
            many.body.contains("more than 1000000 JSON values"),
            "{many:?}"
        );
        let big = call(120_000);
        assert_eq!(big.status, 429, "{big:?}");
        assert!(
            big.body.contains("server.max_call_bytes_per_user"),
            "{big:?}"
        );
        // Within the bound it reaches the tool (which refuses an argv of numbers), and what the
        // refused ones held came back.
        let within_bound = call(50_000);
        assert_eq!(within_bound.status, 200, "{within_bound:?}");
        assert!(within_bound.body.contains("argv"), "{within_bound:?}");
        assert!(
            within_bound.body.contains("\"isError\":true"),
            "{within_bound:?}"
        );
        assert_eq!(request(http, "POST", &headers, PING).status, 200);
    })
    .await;
}

/// A `POST` to `path` whose body is sent in chunks of 64 KiB (no `Content-Length`).
fn chunked_request(addr: SocketAddr, path: &str, auth: &str, body: &str) -> Answer {
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {auth}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    let chunks: Vec<Vec<u8>> = body
        .as_bytes()
        .chunks(64 * 1024)
        .map(|chunk| [format!("{:x}\r\n", chunk.len()).as_bytes(), chunk, b"\r\n"].concat())
        .collect();
    let pieces = std::iter::once(head.as_bytes())
        .chain(chunks.iter().map(Vec::as_slice))
        .chain([b"0\r\n\r\n".as_slice()]);
    exchange(addr, pieces)
}

/// Whether `done` comes true within 5 s, looked at every 20 ms.
fn comes_true(done: impl Fn() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !done() {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// A request's body counts in its user's call memory as it arrives, not once it is whole, on
/// `/mcp` and on the workspace service API alike: a connection that has sent all of a large
/// body but its end holds it in the server's memory, and another request that would take the
/// user past their bound meanwhile is refused with `429`; once that connection goes, what it
/// held comes back. The refused request is read to its end, so that its sender gets the answer
/// whole. (Counted only once whole, each of a user's 64 connections could hold a body
/// of the largest size uncounted: 1.5 GiB over the API.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_counts_in_its_users_memory_while_it_arrives() {
    const MIB: usize = 1024 * 1024;
    let (server, http) = server(|c| {
        c.quotas.max_call_bytes_per_user = 5 * MIB;
        c.http_limits.idle_timeout = Duration::from_secs(600);
    })
    .await;
    let auth = format!("Bearer {}", server.token);
    let state = server.state().clone();
    blocking("bodies held while they arrive", move || {
        for (path, body) in [
            (
                "/mcp",
                r#"{"jsonrpc":"2.0","id":9,"method":"ping","params":{"pad":"PAD"}}"#,
            ),
            ("/api/v1/workspaces", r#"{"name":"w","pad":"PAD"}"#),
        ] {
            // 3.5 MiB of a 4 MiB body (the most `/mcp` takes), its end never sent.
            let mut held = TcpStream::connect(http).expect("connects");
            let head = format!(
                "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {auth}\r\n\
                 Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
                 Content-Length: {}\r\n\r\n",
                4 * MIB
            );
            held.write_all(head.as_bytes()).expect("sent");
            held.write_all(&vec![b' '; 7 * MIB / 2]).expect("sent");
            // Counted as it arrived (counted once whole, it never was).
            let held_now = || state.call_bytes_held("admin");
            let counted = comes_true(|| held_now() >= 7 * MIB / 2);
            assert!(counted, "{path}: {} held", held_now());
            // 2 MiB more passes 5 MiB: refused, with the answer read whole.
            let other = body.replace("PAD", &"x".repeat(2 * MIB));
            let headers = [("Authorization", auth.as_str())];
            let refused = request_to(http, "POST", path, &headers, &other);
            assert_eq!(refused.status, 429, "{path}: {refused:?}");
            assert!(
                refused.body.contains("server.max_call_bytes_per_user"),
                "{path}: {refused:?}"
            );
            // The same in chunks, of no announced length.
            let chunked = chunked_request(http, path, &auth, &other);
            assert_eq!(chunked.status, 429, "{path}: {chunked:?}");
            // Once `held` goes, what it held comes back, and the same request is served.
            drop(held);
            assert!(
                comes_true(|| held_now() == 0),
                "{path}: {} held",
                held_now()
            );
            let served = request_to(http, "POST", path, &headers, &other);
            assert_ne!(served.status, 429, "{path}: {served:?}");
            assert_ne!(served.status, 0, "{path}: {served:?}");
        }
    })
    .await;
}

/// An answer relayed from an attached client is counted as the tree the MCP front makes of it,
/// not only as its text: 8 MB of small numbers, within a 64 MiB bound as text, is a tree of
/// about 200 MB, refused with `limit_exceeded` before it is made (it was made, uncounted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answers_tree_is_counted_before_the_mcp_front_makes_it() {
    const MIB: usize = 1024 * 1024;
    let (server, http) = server(|c| c.quotas.max_call_bytes_per_user = 64 * MIB).await;
    let fake = monad_tests::FakeClient::attach(
        &server.client_config(),
        "fake",
        vec![monad_protocol::ToolName::ReadFile],
    )
    .await;
    let ana = format!("Bearer {}", server.token);
    let call = move || {
        let id = initialized_session(http, &ana);
        let headers = session_headers(&ana, &id);
        let body = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"a.txt","workspace":"fake"}}}"#;
        request(http, "POST", &headers, body)
    };
    let asked = tokio::task::spawn_blocking(call.clone());
    let pad = serde_json::Value::Array(vec![serde_json::json!(0); 4 * MIB]);
    fake.answer_run(serde_json::json!({"path": "a.txt", "content": "x", "pad": pad}))
        .await;
    let answer = within(STEP, "the call's answer", asked).await.unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(
        answer.body.contains("limit_exceeded") && answer.body.contains("\"isError\":true"),
        "{}",
        &answer.body[..answer.body.len().min(400)]
    );
    assert!(answer.body.len() < 4096, "the answer was passed on");
    // What it held came back: a small answer goes through.
    let asked = tokio::task::spawn_blocking(call);
    fake.answer_run(serde_json::json!({"path": "a.txt", "content": "x"}))
        .await;
    let answer = within(STEP, "the call's answer", asked).await.unwrap();
    assert!(answer.body.contains("\"isError\":false"), "{answer:?}");
}

/// An MCP session ends when the token that opened it is revoked (checked every 5 s), not only
/// its calls: its own stream kept getting notifications, and the session stayed, until rmcp's
/// idle time-out of 5 minutes. Another token of the same user then finds no such session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_session_ends_when_its_token_is_revoked() {
    let (server, http) = server(|_| {}).await;
    let first = format!("Bearer {}", server.token);
    let second = format!("Bearer {}", server.create_token("admin"));
    let session = {
        let first = first.clone();
        blocking("a session opened", move || {
            initialized_session(http, &first)
        })
        .await
    };
    let ping = move |auth: String, session: String| {
        blocking("a ping", move || {
            request(http, "POST", &session_headers(&auth, &session), PING).status
        })
    };
    assert_eq!(
        ping(second.clone(), session.clone()).await,
        200,
        "the user's own"
    );
    let id = server.token.split('_').nth(1).expect("mnd_ID_SECRET");
    assert!(server.state().tokens.revoke(id).unwrap());
    within(STEP, "the session to end", async {
        while ping(second.clone(), session.clone()).await != 404 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
}

/// An MCP answer over HTTP keeps its count in its user's memory while its host does not read
/// it, and gives it back once the host has gone: a guard beside the API's answers', which were
/// given back as soon as they were handed to the connection
/// (`web::quota::answers_a_client_does_not_read_count_in_its_users_memory`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_answer_a_host_does_not_read_stays_counted_until_it_is_taken() {
    const MIB: usize = 1024 * 1024;
    let (server, http) = server(|c| {
        c.quotas.max_call_bytes_per_user = 256 * MIB;
        c.http_limits.idle_timeout = Duration::from_secs(600);
    })
    .await;
    let fake = monad_tests::FakeClient::attach(
        &server.client_config(),
        "fake",
        vec![monad_protocol::ToolName::ReadFile],
    )
    .await;
    let ana = format!("Bearer {}", server.token);
    let id = {
        let ana = ana.clone();
        blocking("an MCP session", move || initialized_session(http, &ana)).await
    };
    let body = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"a.txt","workspace":"fake"}}}"#;
    let mut text = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n",
        http.port(),
        body.len()
    );
    for (name, value) in session_headers(&ana, &id) {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str("\r\n");
    text.push_str(body);
    let unread = {
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        socket.set_recv_buffer_size(4096).expect("a small window");
        let mut stream = socket.connect(http).await.expect("connects");
        tokio::io::AsyncWriteExt::write_all(&mut stream, text.as_bytes())
            .await
            .expect("sent");
        stream
    };
    let content = "x".repeat(12 * MIB);
    fake.answer_run(serde_json::json!({
        "path": "a.txt", "content": content, "start_line": 1, "lines": 1, "size": 12 * MIB,
        "binary": false, "truncated": false,
    }))
    .await;
    let state = server.state().clone();
    let held_now = move || state.call_bytes_held("admin");
    let counted = {
        let held_now = held_now.clone();
        blocking("the answer counted", move || {
            comes_true(|| held_now() >= 12 * MIB)
        })
        .await
    };
    assert!(counted, "{} held", held_now());
    // Still counted a while later: the host has read none of it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(held_now() >= 12 * MIB, "{} held", held_now());
    drop(unread);
    let back = {
        let held_now = held_now.clone();
        blocking("the count given back", move || {
            comes_true(|| held_now() == 0)
        })
        .await
    };
    assert!(back, "{} held", held_now());
}
