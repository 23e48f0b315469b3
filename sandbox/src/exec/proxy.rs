//! The network proxy of `network = "allowlist"`: HTTP (`CONNECT`, and plain `http://` requests)
//! and SOCKS5 on one port, for one command.
//!
//! The command has a network namespace of its own with nothing but a loopback, so it cannot
//! reach anything else; its supervisor makes a listening socket on that loopback and passes it
//! out (see [`super::child`]). The proxy accepts on it from outside the namespace, so the
//! connections it makes go out through the host's network, after [`NetPolicy`] has checked the
//! name and every address it resolved to. Each connection asked for, let through or refused, is
//! reported to the sink (the command's result, then the audit log).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use monad_protocol::tools::NetworkEvent;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::netpolicy::{Host, NetPolicy};

/// Where the proxy reports what it did.
pub(crate) type Sink = Arc<dyn Fn(NetworkEvent) + Send + Sync>;

/// Connections one workspace's commands may have open through its proxy at once.
const MAX_CONNECTIONS: usize = 64;

/// The connections one user's workspaces may have open through their proxies at once,
/// together: each holds two of the host's descriptors, and a user's many sessions, each with
/// its workspace's bound of [`MAX_CONNECTIONS`], could otherwise take the descriptors every
/// other user's connections need.
#[derive(Debug)]
pub struct ConnectionBudgets {
    per_user: usize,
    users: std::sync::Mutex<std::collections::HashMap<String, std::sync::Weak<Semaphore>>>,
}

impl ConnectionBudgets {
    /// Budgets of `per_user` connections each.
    pub fn new(per_user: usize) -> Arc<ConnectionBudgets> {
        Arc::new(ConnectionBudgets {
            per_user,
            users: Default::default(),
        })
    }

    /// `user`'s budget, shared by every workspace of theirs that holds it.
    pub(crate) fn of(&self, user: &str) -> Budget {
        let mut users = self.users.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(sem) = users.get(user).and_then(std::sync::Weak::upgrade) {
            return Budget {
                sem,
                max: self.per_user,
            };
        }
        // Users whose workspaces are all gone are forgotten.
        users.retain(|_, sem| sem.strong_count() > 0);
        let sem = Arc::new(Semaphore::new(self.per_user));
        users.insert(user.to_owned(), Arc::downgrade(&sem));
        Budget {
            sem,
            max: self.per_user,
        }
    }
}

/// One user's connections through every proxy of theirs (see [`ConnectionBudgets`]).
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    sem: Arc<Semaphore>,
    max: usize,
}

/// A connection's place in its proxy's bound of [`MAX_CONNECTIONS`] and in its user's
/// [`Budget`], given back when the last of the connection and the name lookup it started ends:
/// a lookup that outlives its connection (a slow name server: the connection gave up after
/// [`CONNECT_TIMEOUT`], the system's resolver has not) keeps its blocking thread, and so its
/// place, so that commands opening and dropping connections to such names cannot pile up
/// threads on the host's blocking pool, which every workspace's file tools share.
pub(crate) struct Slot {
    _proxy: tokio::sync::OwnedSemaphorePermit,
    _user: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// Why a connection was closed as soon as it was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    /// The workspace's proxy holds [`MAX_CONNECTIONS`].
    Workspace,
    /// The user's workspaces hold their [`Budget`] (this many).
    User(usize),
}
/// Longest a client may take to say where it wants to go.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a name may take to resolve, and a connection to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Largest HTTP request head accepted.
const MAX_HEAD: usize = 16 * 1024;
/// How long the proxy waits after a failed accept (out of descriptors, say) before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// What a connection the proxy could not read a destination from is recorded as.
const UNREAD: &str = "(a request the proxy could not read)";

/// Serves until dropped (the command ended); dropping it ends every connection too. With a
/// `budget`, the user's connections over all their proxies are bounded too.
pub(crate) async fn serve(
    listener: TcpListener,
    policy: Arc<NetPolicy>,
    sink: Sink,
    budget: Option<Budget>,
) {
    let over = sink.clone();
    accept_loop(
        || async { listener.accept().await.map(|(stream, _)| stream) },
        move |stream, slot| {
            let (policy, sink) = (policy.clone(), sink.clone());
            async move { handle(stream, &policy, &sink, slot).await }
        },
        budget,
        // Closed at once, and recorded: a connection is never made without a trace.
        move |why| {
            over(NetworkEvent {
                host: "(a connection over the proxy's bound)".to_owned(),
                port: 0,
                allowed: false,
                address: None,
                reason: Some(match why {
                    Over::Workspace => {
                        format!("more than {MAX_CONNECTIONS} connections at once: closed")
                    }
                    Over::User(max) => format!(
                        "more than {max} connections at once over all this user's workspaces \
                         (server.max_proxy_connections_per_user): closed"
                    ),
                }),
            })
        },
    )
    .await
}

/// Takes connections from `accept` and runs `handle` on each with its [`Slot`], at most
/// [`MAX_CONNECTIONS`] at once, and with a `budget` only while it has room (more are closed at
/// once, each told to `over` with why).
async fn accept_loop<S, A, H>(
    mut accept: impl FnMut() -> A,
    mut handle: impl FnMut(S, Arc<Slot>) -> H,
    budget: Option<Budget>,
    mut over: impl FnMut(Over),
) where
    A: std::future::Future<Output = std::io::Result<S>>,
    H: std::future::Future<Output = ()> + Send + 'static,
{
    let mut connections = tokio::task::JoinSet::new();
    let places = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        tokio::select! {
            accepted = accept() => {
                let stream = match accepted {
                    Ok(stream) => stream,
                    Err(e) => {
                        // The listener stays; try again shortly rather than spin.
                        tracing::debug!("the network proxy's accept failed: {e}");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                };
                let Ok(place) = places.clone().try_acquire_owned() else {
                    drop(stream);
                    over(Over::Workspace);
                    continue;
                };
                let permit = match &budget {
                    None => None,
                    Some(budget) => match budget.sem.clone().try_acquire_owned() {
                        Ok(permit) => Some(permit),
                        Err(_) => {
                            drop(stream);
                            over(Over::User(budget.max));
                            continue;
                        }
                    },
                };
                connections.spawn(handle(stream, Arc::new(Slot { _proxy: place, _user: permit })));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// What a client asked for.
struct Request {
    host: Host,
    port: u16,
    kind: Kind,
}

enum Kind {
    Socks,
    /// `CONNECT`, with the bytes the client sent right after its head (kept for the origin).
    Connect(Vec<u8>),
    /// A plain HTTP request: its head rewritten for the origin server with the bytes of the
    /// body already read, and how many bytes of its body are still to come. Nothing after its
    /// body is passed on: the next request on the connection could be for another host.
    Http(Vec<u8>, u64),
}

/// Serves one connection, holding its `slot` until it ends.
async fn handle(mut client: TcpStream, policy: &NetPolicy, sink: &Sink, slot: Arc<Slot>) {
    let _ = client.set_nodelay(true);
    let request = match tokio::time::timeout(HANDSHAKE_TIMEOUT, read_request(&mut client)).await {
        Ok(Ok(request)) => request,
        Ok(Err(Refusal {
            host,
            port,
            reason,
            kind,
        })) => {
            // Recorded whether or not a destination could be read from it: a request the proxy
            // cannot read is a refused connection too (the reason names what was asked for).
            sink(NetworkEvent {
                host: host.unwrap_or_else(|| UNREAD.to_owned()),
                port: port.unwrap_or(0),
                allowed: false,
                address: None,
                reason: Some(reason.clone()),
            });
            answer_refused(&mut client, kind, &reason).await;
            return;
        }
        Err(_) => {
            sink(NetworkEvent {
                host: UNREAD.to_owned(),
                port: 0,
                allowed: false,
                address: None,
                reason: Some(format!(
                    "no request within {} s",
                    HANDSHAKE_TIMEOUT.as_secs()
                )),
            });
            return;
        }
    };
    let event = |allowed: bool, address: Option<SocketAddr>, reason: Option<String>| NetworkEvent {
        host: request.host.to_string(),
        port: request.port,
        allowed,
        address: address.map(|a| a.to_string()),
        reason,
    };
    let tunnel = matches!(request.kind, Kind::Socks | Kind::Connect(_));
    let upstream = match connect(policy, &request.host, request.port, tunnel, &slot).await {
        Ok(upstream) => upstream,
        Err(reason) => {
            sink(event(false, None, Some(reason.clone())));
            answer_refused(&mut client, kind_of(&request.kind), &reason).await;
            return;
        }
    };
    let (mut upstream, address) = upstream;
    sink(event(true, Some(address), None));
    let ready = match &request.kind {
        Kind::Socks => {
            // Succeeded; the bound address is not meaningful here.
            client.write_all(&[5, 0, 0, 1, 0, 0, 0, 0, 0, 0]).await
        }
        Kind::Connect(early) => {
            match client
                .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                .await
            {
                Ok(()) => upstream.write_all(early).await,
                Err(e) => Err(e),
            }
        }
        Kind::Http(head, _) => upstream.write_all(head).await,
    };
    if ready.is_err() {
        return;
    }
    match request.kind {
        Kind::Http(_, body_left) => {
            // The rest of this request's body, then nothing more from the client; the answer
            // goes back until the origin ends it.
            let (mut client_read, mut client_write) = client.split();
            let (mut upstream_read, mut upstream_write) = upstream.split();
            let body = async {
                let mut body = (&mut client_read).take(body_left);
                let _ = tokio::io::copy(&mut body, &mut upstream_write).await;
                std::future::pending::<()>().await
            };
            tokio::select! {
                _ = tokio::io::copy(&mut upstream_read, &mut client_write) => {}
                () = body => {}
            }
        }
        Kind::Socks | Kind::Connect(_) => {
            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        }
    }
}

/// Resolves (for a name, the lookup holding the connection's `slot`), checks (as a `tunnel`
/// when it is one), and connects to the first address that answers.
async fn connect(
    policy: &NetPolicy,
    host: &Host,
    port: u16,
    tunnel: bool,
    slot: &Arc<Slot>,
) -> Result<(TcpStream, SocketAddr), String> {
    if tunnel {
        policy.check_tunnel(host, port)?;
    } else {
        policy.check_name(host, port)?;
    }
    let addresses: Vec<IpAddr> = match host {
        Host::Address(ip) => vec![*ip],
        Host::Name(name) => {
            let resolved = resolve(name, port, slot.clone(), CONNECT_TIMEOUT, |name, port| {
                std::net::ToSocketAddrs::to_socket_addrs(&(name, port)).map(Iterator::collect)
            })
            .await?;
            let mut ips: Vec<IpAddr> = Vec::new();
            for address in resolved {
                if !ips.contains(&address.ip()) {
                    ips.push(address.ip());
                }
            }
            ips
        }
    };
    let own = super::netpolicy::own_addresses()?;
    let allowed = policy.check_addresses(host, port, &addresses, &own)?;
    let mut last = String::new();
    for address in allowed {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok((stream, address));
            }
            Ok(Err(e)) => last = format!("{address}: {e}"),
            Err(_) => last = format!("{address}: no answer in time"),
        }
    }
    Err(format!("cannot connect to {host}:{port} ({last})"))
}

/// `name`'s addresses by `lookup` (the system's resolver, which blocks) on the blocking pool,
/// waited for `within`; the lookup holds `slot` until it returns, however long after the wait
/// ([`Slot`]). What tokio's own `lookup_host` does, but for the slot.
async fn resolve(
    name: &str,
    port: u16,
    slot: Arc<Slot>,
    within: Duration,
    lookup: impl FnOnce(&str, u16) -> std::io::Result<Vec<SocketAddr>> + Send + 'static,
) -> Result<Vec<SocketAddr>, String> {
    let owned = name.to_owned();
    let looked_up = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        lookup(&owned, port)
    });
    match tokio::time::timeout(within, looked_up).await {
        Err(_) => Err(format!("{name} did not resolve in time")),
        Ok(Err(e)) => Err(format!("{name} could not be looked up: {e}")),
        Ok(Ok(Err(e))) => Err(format!("{name} does not resolve: {e}")),
        Ok(Ok(Ok(addresses))) => Ok(addresses),
    }
}

/// A request refused before any connection was tried.
struct Refusal {
    host: Option<String>,
    port: Option<u16>,
    reason: String,
    kind: RefusalKind,
}

#[derive(Clone, Copy)]
enum RefusalKind {
    Socks,
    Http,
}

fn kind_of(kind: &Kind) -> RefusalKind {
    match kind {
        Kind::Socks => RefusalKind::Socks,
        Kind::Connect(_) | Kind::Http(..) => RefusalKind::Http,
    }
}

async fn answer_refused(client: &mut TcpStream, kind: RefusalKind, reason: &str) {
    let _ = match kind {
        // "Connection not allowed by ruleset".
        RefusalKind::Socks => client.write_all(&[5, 2, 0, 1, 0, 0, 0, 0, 0, 0]).await,
        RefusalKind::Http => {
            let body = format!("Monad refused this connection: {reason}\n");
            let answer = format!(
                "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            client.write_all(answer.as_bytes()).await
        }
    };
    let _ = client.shutdown().await;
}

fn refuse<T>(kind: RefusalKind, reason: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal {
        host: None,
        port: None,
        reason: reason.into(),
        kind,
    })
}

async fn read_request<S: AsyncRead + AsyncWrite + Unpin>(
    client: &mut S,
) -> Result<Request, Refusal> {
    let first = client
        .read_u8()
        .await
        .or_else(|_| refuse(RefusalKind::Http, "the connection closed"))?;
    if first == 5 {
        read_socks(client).await
    } else {
        read_http(client, first).await
    }
}

/// SOCKS5 (RFC 1928), no authentication, `CONNECT` only.
async fn read_socks<S: AsyncRead + AsyncWrite + Unpin>(client: &mut S) -> Result<Request, Refusal> {
    let io = |_| Refusal {
        host: None,
        port: None,
        reason: "the SOCKS handshake broke off".into(),
        kind: RefusalKind::Socks,
    };
    let count = client.read_u8().await.map_err(io)?;
    let mut methods = vec![0u8; usize::from(count)];
    client.read_exact(&mut methods).await.map_err(io)?;
    if !methods.contains(&0) {
        let _ = client.write_all(&[5, 0xff]).await;
        return refuse(
            RefusalKind::Socks,
            "the client offered no method without authentication",
        );
    }
    client.write_all(&[5, 0]).await.map_err(io)?;
    let mut head = [0u8; 4];
    client.read_exact(&mut head).await.map_err(io)?;
    let [version, command, _, kind] = head;
    if version != 5 {
        return refuse(RefusalKind::Socks, "not SOCKS version 5");
    }
    let host = match kind {
        1 => {
            let mut ip = [0u8; 4];
            client.read_exact(&mut ip).await.map_err(io)?;
            Host::Address(IpAddr::from(ip))
        }
        4 => {
            let mut ip = [0u8; 16];
            client.read_exact(&mut ip).await.map_err(io)?;
            Host::Address(IpAddr::from(ip))
        }
        3 => {
            let len = client.read_u8().await.map_err(io)?;
            let mut name = vec![0u8; usize::from(len)];
            client.read_exact(&mut name).await.map_err(io)?;
            let name = String::from_utf8_lossy(&name).into_owned();
            match Host::parse(&name) {
                Ok(host) => host,
                // Recorded as asked for (its port read too), escaped: a name a command makes up
                // is refused in the owner's view and the audit log, not only answered.
                Err(why) => {
                    let port = client.read_u16().await.map_err(io)?;
                    return Err(Refusal {
                        host: Some(name.escape_debug().to_string()),
                        port: Some(port),
                        reason: why,
                        kind: RefusalKind::Socks,
                    });
                }
            }
        }
        _ => return refuse(RefusalKind::Socks, "an unknown SOCKS address type"),
    };
    let port = client.read_u16().await.map_err(io)?;
    if command != 1 {
        // "Command not supported": only CONNECT (no BIND, no UDP ASSOCIATE).
        let _ = client.write_all(&[5, 7, 0, 1, 0, 0, 0, 0, 0, 0]).await;
        return Err(Refusal {
            host: Some(host.to_string()),
            port: Some(port),
            reason: "only SOCKS CONNECT is supported (no UDP, no BIND)".into(),
            kind: RefusalKind::Socks,
        });
    }
    Ok(Request {
        host,
        port,
        kind: Kind::Socks,
    })
}

/// An HTTP proxy request: `CONNECT host:port`, or a plain request for an `http://` URL.
async fn read_http<S: AsyncRead + Unpin>(client: &mut S, first: u8) -> Result<Request, Refusal> {
    let mut buf = vec![first];
    let end = loop {
        if let Some(at) = find(&buf, b"\r\n\r\n") {
            break at + 4;
        }
        if buf.len() > MAX_HEAD {
            return refuse(RefusalKind::Http, "the request head is too large");
        }
        let mut chunk = [0u8; 4096];
        let n = client
            .read(&mut chunk)
            .await
            .or_else(|_| refuse(RefusalKind::Http, "the connection broke"))?;
        if n == 0 {
            return refuse(RefusalKind::Http, "the request ended early");
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = std::str::from_utf8(&buf[..end])
        .or_else(|_| refuse(RefusalKind::Http, "the request head is not text"))?;
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut words = request_line.split(' ');
    let (Some(method), Some(target), Some(version)) = (words.next(), words.next(), words.next())
    else {
        return refuse(RefusalKind::Http, "a malformed request line");
    };
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) =
            split_host_port(target, None).or_else(|why| refuse(RefusalKind::Http, why))?;
        return Ok(Request {
            host,
            port,
            kind: Kind::Connect(buf[end..].to_vec()),
        });
    }
    let Some(rest) = target.strip_prefix("http://") else {
        return refuse(
            RefusalKind::Http,
            "this proxy takes `CONNECT host:port` and `http://` URLs (use CONNECT for https)",
        );
    };
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    let (host, port) =
        split_host_port(authority, Some(80)).or_else(|why| refuse(RefusalKind::Http, why))?;
    // For the origin server: the path only, the URL's host as `Host` (the one the policy
    // checked: a shared front must not be asked for another site), no proxy headers, one
    // request per connection (the next one could be for another host).
    let mut out = format!("{method} {path} {version}\r\nHost: {authority}\r\n");
    // Lines end in CRLF and nowhere else: a bare LF or CR inside one would end a line for an
    // origin that takes them, and smuggle a header (`Host`) or a request past these checks.
    if request_line.contains(['\r', '\n']) {
        return refuse(RefusalKind::Http, "a bare CR or LF in the request line");
    }
    let mut content_length: Option<u64> = None;
    for line in lines {
        if line.is_empty() {
            continue;
        }
        if line.contains(['\r', '\n']) {
            return refuse(RefusalKind::Http, "a bare CR or LF in a header line");
        }
        if line.starts_with([' ', '\t']) {
            // A folded line (obsolete): it continues a header whose name was checked.
            return refuse(
                RefusalKind::Http,
                "a folded header line (obsolete in HTTP/1.1)",
            );
        }
        let name = line.split(':').next().unwrap_or_default().trim();
        if name.eq_ignore_ascii_case("transfer-encoding") {
            // Where a chunked body ends is for the origin to decide: through CONNECT, whose
            // tunnel carries what the client sends as it is.
            return refuse(
                RefusalKind::Http,
                "a body in chunks (Transfer-Encoding) through an http:// URL: use https \
                 (CONNECT) or a Content-Length",
            );
        }
        if name.eq_ignore_ascii_case("content-length") {
            let value = line
                .split_once(':')
                .map(|(_, v)| v.trim())
                .unwrap_or_default();
            let length = value
                .parse::<u64>()
                .ok()
                .filter(|_| value.bytes().all(|b| b.is_ascii_digit()));
            match (length, content_length) {
                (Some(n), None) => content_length = Some(n),
                (Some(n), Some(m)) if n == m => {}
                _ => return refuse(RefusalKind::Http, "a Content-Length that is not one number"),
            }
        }
        let skip = [
            "host",
            "proxy-connection",
            "proxy-authorization",
            "connection",
            "keep-alive",
        ]
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h));
        if !skip {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    let mut bytes = out.into_bytes();
    // Of what came after the head, the body only.
    let body = content_length.unwrap_or(0);
    let read = buf.len() - end;
    let first = usize::try_from(body).map_or(read, |body| body.min(read));
    bytes.extend_from_slice(&buf[end..end + first]);
    Ok(Request {
        host,
        port,
        kind: Kind::Http(bytes, body - first as u64),
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// `host:port`, `[v6]:port`, or (with a default port) `host`.
fn split_host_port(text: &str, default: Option<u16>) -> Result<(Host, u16), String> {
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (inside, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("`{text}` is not host:port"))?;
        (inside, after.strip_prefix(':'))
    } else {
        match text.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        }
    };
    let port = match (port, default) {
        (Some(p), _) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("`{text}` has no valid port"))?,
        (None, Some(d)) => d,
        (None, None) => return Err(format!("`{text}` has no port")),
    };
    Ok((Host::parse(host)?, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn http_requests_are_rewritten_for_the_origin() {
        let request = b"GET http://example.com:8080/a?b HTTP/1.1\r\nHost: example.com:8080\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\nContent-Length: 4\r\n\r\nbody";
        let mut reader = &request[1..];
        let parsed = read_http(&mut reader, request[0]).await.ok().unwrap();
        assert_eq!(parsed.host, Host::Name("example.com".into()));
        assert_eq!(parsed.port, 8080);
        let Kind::Http(head, _) = parsed.kind else {
            panic!("a plain request");
        };
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "GET /a?b HTTP/1.1\r\nHost: example.com:8080\r\nAccept: */*\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbody"
        );
    }

    /// Regression: a bare LF inside a header line went to the origin as it was (an origin that
    /// ends lines at LF read a second `Host`), and everything the client sent after its
    /// request followed it (a second request, for another host, on the same connection).
    #[tokio::test]
    async fn a_plain_request_carries_one_request_for_its_own_host_only() {
        for smuggled in [
            &b"GET http://allowed.example/ HTTP/1.1\r\nX-A: 1\nHost: internal.example\r\n\r\n"[..],
            b"GET http://allowed.example/ HTTP/1.1\r\nX-A: 1\rHost: internal.example\r\n\r\n",
            b"GET http://allowed.example/ HTTP/1.1\nHost: internal.example\r\n\r\n",
            b"POST http://allowed.example/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"POST http://allowed.example/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 40\r\n\r\n",
            b"POST http://allowed.example/ HTTP/1.1\r\nContent-Length: +1\r\n\r\n",
        ] {
            let mut reader = &smuggled[1..];
            assert!(
                read_http(&mut reader, smuggled[0]).await.is_err(),
                "{}",
                String::from_utf8_lossy(smuggled)
            );
        }
        // What follows the body is not the origin's: here, a second request.
        let pipelined = b"POST http://allowed.example/ HTTP/1.1\r\nContent-Length: 2\r\n\r\nhiGET / HTTP/1.1\r\nHost: internal.example\r\n\r\n";
        let mut reader = &pipelined[1..];
        let parsed = read_http(&mut reader, pipelined[0]).await.ok().unwrap();
        let Kind::Http(head, left) = parsed.kind else {
            panic!("a plain request");
        };
        let head = String::from_utf8(head).unwrap();
        assert!(head.ends_with("\r\n\r\nhi"), "{head}");
        assert!(!head.contains("internal"), "{head}");
        assert_eq!(left, 0);
        let partial = b"POST http://allowed.example/ HTTP/1.1\r\nContent-Length: 10\r\n\r\nhi";
        let mut reader = &partial[1..];
        let parsed = read_http(&mut reader, partial[0]).await.ok().unwrap();
        assert!(matches!(parsed.kind, Kind::Http(_, 8)));
    }

    /// Regression: bytes a client sent right after its `CONNECT` head (a TLS hello sent without
    /// waiting for the answer) were dropped.
    #[tokio::test]
    async fn bytes_after_a_connect_head_are_kept_for_the_origin() {
        let request =
            b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n\x16\x03\x01early";
        let mut reader = &request[1..];
        let parsed = read_http(&mut reader, request[0]).await.ok().unwrap();
        let Kind::Connect(early) = parsed.kind else {
            panic!("a CONNECT");
        };
        assert_eq!(early, b"\x16\x03\x01early");
    }

    /// Regression: a failing accept (out of descriptors: `EMFILE`) was retried at once,
    /// forever, at 100% CPU.
    #[tokio::test(start_paused = true)]
    async fn accept_errors_back_off_instead_of_spinning() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let calls = AtomicUsize::new(0);
        let serving = accept_loop(
            || {
                let n = calls.fetch_add(1, Ordering::Relaxed);
                async move {
                    if n >= 10_000 {
                        // Enough to tell: stop answering rather than spin the test forever.
                        std::future::pending::<()>().await;
                    }
                    Err::<TcpStream, _>(std::io::Error::from_raw_os_error(nix::libc::EMFILE))
                }
            },
            |_: TcpStream, _| async {},
            None,
            |_| {},
        );
        // Paused time: a loop that sleeps lets the clock run to the time-out.
        let _ = tokio::time::timeout(Duration::from_secs(1), serving).await;
        let calls = calls.load(Ordering::Relaxed);
        assert!(calls <= 21, "{calls} accepts in one second");
    }

    /// Regression: connections past the bound were closed without a trace; each is told now.
    #[tokio::test]
    async fn connections_past_the_bound_are_closed_and_told() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (accepted, over) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let serving = accept_loop(
            || {
                let n = accepted.fetch_add(1, Ordering::Relaxed);
                async move {
                    if n >= MAX_CONNECTIONS + 10 {
                        std::future::pending::<()>().await;
                    }
                    Ok::<(), std::io::Error>(())
                }
            },
            // Each connection stays open.
            |(), slot| async move {
                let _slot = slot;
                std::future::pending::<()>().await
            },
            None,
            |why| {
                assert_eq!(why, Over::Workspace);
                over.fetch_add(1, Ordering::Relaxed);
            },
        );
        let _ = tokio::time::timeout(Duration::from_millis(200), serving).await;
        assert_eq!(over.load(Ordering::Relaxed), 10);
    }

    /// One user's proxies share a budget: with 64 connections a workspace, a user's many
    /// sessions held two descriptors a connection each, as many as they liked. Two proxies of
    /// one user, a budget of 30: 30 connections in all, the rest told; another user's proxy
    /// has a budget of its own, and a connection that ends gives its place back.
    #[tokio::test]
    async fn a_users_proxies_share_one_budget() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let budgets = ConnectionBudgets::new(30);
        // Held all along: the semaphore the proxies take from, looked at once they are gone.
        let ana = budgets.of("ana");
        let over = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let proxy = |user: &str, connections: usize| {
            let (over, released) = (over.clone(), released.clone());
            let accepted = AtomicUsize::new(0);
            let budget = Some(budgets.of(user));
            async move {
                let serving = accept_loop(
                    || {
                        let n = accepted.fetch_add(1, Ordering::Relaxed);
                        async move {
                            if n >= connections {
                                std::future::pending::<()>().await;
                            }
                            Ok::<(), std::io::Error>(())
                        }
                    },
                    // Each connection stays open until released.
                    move |(), slot| {
                        let mut released = released.clone();
                        async move {
                            let _ = released.wait_for(|r| *r).await;
                            drop(slot);
                        }
                    },
                    budget,
                    |why| {
                        assert_eq!(why, Over::User(30));
                        over.fetch_add(1, Ordering::Relaxed);
                    },
                );
                let _ = tokio::time::timeout(Duration::from_millis(200), serving).await;
            }
        };
        tokio::join!(proxy("ana", 20), proxy("ana", 20), proxy("bo", 25));
        assert_eq!(over.load(Ordering::Relaxed), 10, "ana's 40 over her 30");
        release.send(true).unwrap();
        // Their connections end with the proxies (their tasks are dropped once the runtime
        // gets to them): the budget is whole again.
        assert!(Arc::ptr_eq(&ana.sem, &budgets.of("ana").sem), "one budget");
        let whole = async {
            while ana.sem.available_permits() < 30 {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), whole)
            .await
            .expect("the budget is whole again");
    }

    /// Regression: a name lookup outlived its connection (a slow name server: the connection
    /// gave up after its time-out, the system's resolver had not) while the connection gave its
    /// places back, so a command that opened and dropped connections to such a name piled up
    /// blocked threads on the host's blocking pool, which every workspace's file tools share.
    /// The lookup now keeps the connection's places (its proxy's and its user's) until it
    /// returns.
    #[tokio::test]
    async fn a_lookup_that_outlives_its_connection_keeps_its_places() {
        let budget = ConnectionBudgets::new(2).of("ana");
        let proxy = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let slot = Arc::new(Slot {
            _proxy: proxy.clone().try_acquire_owned().unwrap(),
            _user: Some(budget.sem.clone().try_acquire_owned().unwrap()),
        });
        let (answer, answered) = std::sync::mpsc::channel::<()>();
        let slow = move |_: &str, _: u16| {
            let _ = answered.recv();
            Ok(vec![SocketAddr::from(([192, 0, 2, 1], 443))])
        };
        let resolved = resolve("slow.example", 443, slot, Duration::from_millis(50), slow).await;
        assert_eq!(
            resolved.unwrap_err(),
            "slow.example did not resolve in time"
        );
        // The connection is gone; its lookup is not.
        assert_eq!(budget.sem.available_permits(), 1);
        assert_eq!(proxy.available_permits(), MAX_CONNECTIONS - 1);
        answer.send(()).unwrap();
        let whole = async {
            while budget.sem.available_permits() < 2 || proxy.available_permits() < MAX_CONNECTIONS
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), whole)
            .await
            .expect("its places are given back when it returns");

        // A lookup in time gives its addresses, and a failed one says why.
        let slot = || {
            Arc::new(Slot {
                _proxy: proxy.clone().try_acquire_owned().unwrap(),
                _user: None,
            })
        };
        let quick = |_: &str, port: u16| Ok(vec![SocketAddr::from(([192, 0, 2, 1], port))]);
        let found = resolve("a.example", 80, slot(), Duration::from_secs(5), quick).await;
        assert_eq!(found.unwrap(), [SocketAddr::from(([192, 0, 2, 1], 80))]);
        let none = |_: &str, _: u16| Err(std::io::Error::other("no such name"));
        let failed = resolve("b.example", 80, slot(), Duration::from_secs(5), none).await;
        assert_eq!(
            failed.unwrap_err(),
            "b.example does not resolve: no such name"
        );
    }

    /// Regression: the client's `Host` header went to the origin unchanged, so a shared front
    /// (a CDN, an ingress) that the allowlist lets through could be asked for any site behind it.
    #[tokio::test]
    async fn a_plain_request_names_the_host_of_its_url_only() {
        for request in [
            &b"GET http://allowed.example/x HTTP/1.1\r\nHost: internal.example\r\nAccept: */*\r\n\r\n"[..],
            b"GET http://allowed.example/x HTTP/1.1\r\nhost: internal.example\r\nHOST : other\r\n\r\n",
            b"GET http://allowed.example/x HTTP/1.0\r\n\r\n",
        ] {
            let mut reader = &request[1..];
            let parsed = read_http(&mut reader, request[0]).await.ok().unwrap();
            let Kind::Http(head, _) = parsed.kind else {
                panic!("a plain request");
            };
            let head = String::from_utf8(head).unwrap();
            assert!(
                !head.contains("internal") && !head.contains("other"),
                "{head}"
            );
            assert_eq!(head.to_ascii_lowercase().matches("host").count(), 1, "{head}");
            assert!(head.contains("\r\nHost: allowed.example\r\n"), "{head}");
        }
        // A folded header line could carry anything past a check of names: refused.
        let folded = b"GET http://allowed.example/ HTTP/1.1\r\nX-A: 1\r\n Host: internal\r\n\r\n";
        let mut reader = &folded[1..];
        assert!(read_http(&mut reader, folded[0]).await.is_err());
    }

    #[tokio::test]
    async fn connect_and_bad_requests() {
        let request = b"CONNECT [2001:db8::1]:443 HTTP/1.1\r\nHost: x\r\n\r\n";
        let mut reader = &request[1..];
        let parsed = read_http(&mut reader, request[0]).await.ok().unwrap();
        assert_eq!(parsed.port, 443);
        assert!(matches!(parsed.kind, Kind::Connect(ref early) if early.is_empty()));
        for bad in [
            &b"GET https://x/ HTTP/1.1\r\n\r\n"[..],
            b"CONNECT x HTTP/1.1\r\n\r\n",
            b"CONNECT a b:1 HTTP/1.1\r\n\r\n",
            b"garbage\r\n\r\n",
        ] {
            let mut reader = &bad[1..];
            assert!(read_http(&mut reader, bad[0]).await.is_err(), "{bad:?}");
        }
        let huge = vec![b'a'; MAX_HEAD * 2];
        let mut reader = &huge[1..];
        assert!(read_http(&mut reader, huge[0]).await.is_err());
    }

    /// A SOCKS name that is no host name is refused with its port and the name as asked for,
    /// escaped, so that the refusal is recorded (it was answered, and recorded nowhere).
    #[tokio::test]
    async fn a_malformed_socks_name_is_refused_with_what_was_asked_for() {
        let name = b"no such\x1b[2Jname";
        let mut asked = vec![1, 0, 5, 1, 0, 3, name.len() as u8];
        asked.extend_from_slice(name);
        asked.extend_from_slice(&443u16.to_be_bytes());
        let (mut proxy, mut command) = tokio::io::duplex(1024);
        command.write_all(&asked).await.unwrap();
        let Err(refusal) = read_socks(&mut proxy).await else {
            panic!("a malformed name was taken");
        };
        assert_eq!(refusal.host.as_deref(), Some(r"no such\u{1b}[2Jname"));
        assert_eq!(refusal.port, Some(443));
        assert!(!refusal.reason.is_empty());
        let mut answer = [0u8; 2];
        command.read_exact(&mut answer).await.unwrap();
        assert_eq!(
            answer,
            [5, 0],
            "the method was chosen before the name was read"
        );
    }
}
