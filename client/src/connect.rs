//! Connecting to the server: QUIC with the certificate pinned by fingerprint, then the hello.

use std::time::Duration;

use monad_protocol::io::{read_message, write_message};
use monad_protocol::wire::{self, Message, Role};
use tracing::debug;

use crate::ClientError;
use crate::config::ClientConfig;

/// How long connecting and the hello may take: a server that answers does so in
/// milliseconds; one that does not (not running, UDP filtered) is reported soon.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The port `login --server HOST` means.
pub const DEFAULT_PORT: u16 = 4433;

/// `HOST:PORT` as given, or `HOST` with the default port ([`DEFAULT_PORT`]); `[::1]` and bare
/// IPv6 addresses get brackets.
pub fn with_default_port(server: &str) -> String {
    let server = server.trim();
    if server.parse::<std::net::SocketAddr>().is_ok() {
        return server.to_owned();
    }
    if let Ok(v6) = server.parse::<std::net::Ipv6Addr>() {
        return format!("[{v6}]:{DEFAULT_PORT}");
    }
    if server.starts_with('[') && server.ends_with(']') {
        return format!("{server}:{DEFAULT_PORT}");
    }
    // Whatever follows a colon is the port the user meant, even empty or not a number: kept as
    // typed, so that the check says what is wrong with it rather than with a port appended.
    if server.contains(':') {
        server.to_owned()
    } else {
        format!("{server}:{DEFAULT_PORT}")
    }
}

/// How a failure to find a host name's address starts: nothing was sent, so the hint about the
/// server and UDP does not apply.
const NO_ADDRESS: &str = "cannot find the address of";

/// What to check when the server does not answer (`why`: what failed).
fn unreachable_hint(server: &str, why: &str) -> String {
    if why.starts_with(NO_ADDRESS) {
        return "check the host name".to_owned();
    }
    if why == PORT_CLOSED {
        return format!("is `monad-server` running on {server}, on that port?");
    }
    format!("is `monad-server` running on {server}? is UDP allowed to it (QUIC runs over UDP)?")
}

/// The order to try the hosts in: the config's, except that the host whose connection was just
/// lost (`lost`: it may be down) goes last, so that a laptop whose host died re-attaches through
/// another one at once. A `lost` that is not listed is ignored.
pub fn order(addresses: &[String], lost: Option<&str>) -> Vec<String> {
    let Some(lost) = lost.filter(|l| addresses.iter().any(|a| a == l)) else {
        return addresses.to_vec();
    };
    addresses
        .iter()
        .filter(|a| *a != lost)
        .cloned()
        .chain(std::iter::once(lost.to_owned()))
        .collect()
}

/// The error when no host answered: every address tried, in order, with why; and what to
/// check.
pub fn unreachable(attempts: &[(String, String)]) -> ClientError {
    match attempts {
        [] => ClientError::Unreachable("no server to try".into()),
        [(server, why)] => ClientError::Unreachable(format!(
            "{server}: {why}; {}",
            unreachable_hint(server, why)
        )),
        several => {
            let tried: Vec<String> = several
                .iter()
                .map(|(server, why)| format!("{server}: {why}"))
                .collect();
            ClientError::Unreachable(format!(
                "none of the {} servers answered ({}); is `monad-server` running on them? is \
                 UDP allowed to them (QUIC runs over UDP)?",
                several.len(),
                tried.join("; ")
            ))
        }
    }
}

pub use monad_protocol::pin::{Presented, fingerprint};

/// An authenticated connection to the server.
#[derive(Debug, Clone)]
pub struct Connection {
    /// The QUIC connection.
    pub conn: quinn::Connection,
    /// The host it is connected to (`HOST:PORT`: one of the config's addresses, or the host an
    /// attach was sent to, [`monad_protocol::wire::Message::Elsewhere`]).
    pub server: String,
    /// The user the token authenticated as.
    pub user: String,
    /// The protocol's minor version on this connection (the lower of both sides').
    pub minor: u32,
    /// Keeps the local endpoint (its UDP socket) alive as long as the connection is used.
    _endpoint: quinn::Endpoint,
}

impl Connection {
    /// Closes the connection and waits (at most 1 s) until its close has been sent, so that the
    /// server knows at once, even when this process exits right after. Not until the connection
    /// has drained (`Endpoint::wait_idle`): that is three probe time-outs more, about 90 ms on
    /// loopback, which every command paid before it could exit.
    pub async fn close(&self, reason: &str) {
        // Already closed (by the server, a time-out, a lost network): nothing more goes out,
        // and waiting for a datagram would only make a failed command wait its full second.
        if self.conn.close_reason().is_some() {
            return;
        }
        // The close goes out as a datagram of its own (quinn counts no close frame it sends).
        let before = self.conn.stats().udp_tx.datagrams;
        self.conn.close(0u32.into(), reason.as_bytes());
        let sent = async {
            while self.conn.stats().udp_tx.datagrams == before {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), sent).await;
    }
}

/// Connects to the configured servers in the config's order, pins the certificate and says
/// hello as `role` (see [`connect_in_order`]).
pub async fn connect(config: &ClientConfig, role: Role) -> Result<Connection, ClientError> {
    connect_in_order(config, role, &config.addresses()).await
}

/// Connects to the first of `servers` that answers, each tried for at most
/// [`CONNECT_TIMEOUT`]: a host that does not answer (or is busy) is passed over, and when none
/// answers the error names every address tried and why. An answer that retrying cannot fix (a
/// changed certificate, a refused token) ends the attempt at once: another host of the same
/// deployment must not hide it.
pub async fn connect_in_order(
    config: &ClientConfig,
    role: Role,
    servers: &[String],
) -> Result<Connection, ClientError> {
    let mut attempts = Vec::with_capacity(servers.len());
    for server in servers {
        let attempt = tokio::time::timeout(CONNECT_TIMEOUT, connect_to(config, server, role));
        let why = match attempt.await {
            Ok(Ok(connection)) => return Ok(connection),
            Ok(Err(e)) if e.is_fatal() => return Err(e),
            Ok(Err(ClientError::Unreachable(why))) => why,
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()),
        };
        debug!(server = %server, "cannot connect: {why}");
        attempts.push((server.clone(), why));
    }
    Err(unreachable(&attempts))
}

/// Connects to each configured host in turn, for `login`, which checks them all: the
/// connections made (closed again), and the hosts that did not answer with why. An answer that
/// retrying cannot fix (a changed certificate, a refused token) from any host is the error.
pub async fn check_each(
    config: &ClientConfig,
    role: Role,
) -> Result<(Vec<Connection>, Vec<(String, String)>), ClientError> {
    let mut answered = Vec::new();
    let mut failed = Vec::new();
    for server in config.addresses() {
        let attempt = tokio::time::timeout(CONNECT_TIMEOUT, connect_to(config, &server, role));
        match attempt.await {
            Ok(Ok(connection)) => {
                connection.close("checked").await;
                answered.push(connection);
            }
            Ok(Err(e)) if e.is_fatal() => return Err(e),
            Ok(Err(ClientError::Unreachable(why))) => failed.push((server, why)),
            Ok(Err(e)) => failed.push((server, e.to_string())),
            Err(_) => failed.push((
                server,
                format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()),
            )),
        }
    }
    Ok((answered, failed))
}

/// A QUIC client configuration that accepts exactly one server certificate, the one whose
/// SHA-256 is `fingerprint` (in any form `login` accepts), speaks TLS 1.3 (ring) with ALPN
/// `alpn`, and uses the client's transport settings (keep-alive 2 s, idle time-out 8 s):
/// [`monad_protocol::pin::pinned_config`].
pub fn pinned_config(
    fingerprint: &str,
    alpn: &[u8],
) -> Result<(quinn::ClientConfig, Presented), ClientError> {
    let pinned = crate::config::normalize_fingerprint(fingerprint)?;
    monad_protocol::pin::pinned_config(&pinned, alpn).map_err(ClientError::Protocol)
}

/// How long the connect goes on after its machine said nothing listens on the port.
const REFUSAL_GRACE: Duration = Duration::from_millis(300);

/// Why a host whose port is closed was passed over ([`port_closed`]).
const PORT_CLOSED: &str = "nothing listens on that port (its machine said so)";

/// Resolves when `addr`'s machine says that nothing listens on its UDP port (an ICMP "port
/// unreachable", which a connected UDP socket receives as `ECONNREFUSED`); never otherwise.
/// QUIC itself ignores such an answer (quinn reports none), so a command run while the server
/// is stopped waited [`CONNECT_TIMEOUT`] for nothing; now it fails at once, as TCP's refusal
/// would. The probe is an empty datagram, which a QUIC server drops as too short to be a
/// packet; it is sent twice (an answer may be lost, or held back by the machine's rate limit
/// on ICMP).
async fn port_closed(addr: std::net::SocketAddr) {
    let refused = |e: &std::io::Error| e.kind() == std::io::ErrorKind::ConnectionRefused;
    let any = if addr.is_ipv6() {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    };
    let Ok(socket) = tokio::net::UdpSocket::bind(std::net::SocketAddr::new(any, 0)).await else {
        return std::future::pending().await;
    };
    if socket.connect(addr).await.is_err() {
        return std::future::pending().await;
    }
    for wait in [Duration::from_millis(500), CONNECT_TIMEOUT] {
        match socket.send(&[]).await {
            Err(e) if refused(&e) => return,
            _ => {}
        }
        let mut buf = [0u8; 1];
        let answer = tokio::time::timeout(wait, socket.recv(&mut buf)).await;
        if let Ok(Err(e)) = answer
            && refused(&e)
        {
            return;
        }
    }
    std::future::pending().await
}

/// Connects to `server` (one of the config's addresses) and says hello; an
/// [`ClientError::Unreachable`] says why, without the address.
async fn connect_to(
    config: &ClientConfig,
    server: &str,
    role: Role,
) -> Result<Connection, ClientError> {
    let host = server.rsplit_once(':').map_or(server, |(host, _)| host);
    let addr = tokio::net::lookup_host(server)
        .await
        .map_err(|e| ClientError::Unreachable(format!("{NO_ADDRESS} `{host}`: {e}")))?
        .next()
        .ok_or_else(|| ClientError::Unreachable(format!("{NO_ADDRESS} `{host}`: it has none")))?;
    if addr.ip().is_unspecified() {
        // A server listening on `0.0.0.0` listens on every address of its machine; that is no
        // address to send to (quinn says only "invalid remote address").
        return Err(ClientError::Unreachable(format!(
            "{NO_ADDRESS} the server: `{host}` means every address of the server's own \
             machine, not one to connect to; use its name or one of its addresses"
        )));
    }
    let (client, presented) = pinned_config(&config.fingerprint, wire::ALPN)?;
    let mut endpoint = monad_protocol::pin::client_endpoint(addr.is_ipv6())
        .map_err(|e| ClientError::Unreachable(format!("cannot open a UDP socket: {e}")))?;
    endpoint.set_default_client_config(client);
    let connecting = endpoint
        .connect(addr, "localhost")
        .map_err(|e| ClientError::Unreachable(e.to_string()))?;
    tokio::pin!(connecting);
    let connected = tokio::select! {
        connected = &mut connecting => connected,
        // A refusal is taken once the connect had a moment more: behind a balancer that sends
        // each source port its own way, the probe may reach a backend that is down while the
        // connect reaches one that answers.
        () = port_closed(addr) => match tokio::time::timeout(REFUSAL_GRACE, &mut connecting).await {
            Ok(connected) => connected,
            Err(_) => return Err(ClientError::Unreachable(PORT_CLOSED.into())),
        },
    };
    let conn = match connected {
        Ok(conn) => conn,
        Err(e) => {
            let expected = crate::config::normalize_fingerprint(&config.fingerprint)?;
            return Err(match presented.fingerprint() {
                Some(presented) if presented != expected => ClientError::FingerprintMismatch {
                    server: server.to_owned(),
                    expected,
                    presented,
                },
                _ => ClientError::Unreachable(e.to_string()),
            });
        }
    };
    let (mut send, recv) = conn
        .open_bi()
        .await
        .map_err(|e| ClientError::Unreachable(e.to_string()))?;
    // The welcome is the stream's one message: its end is read too (see `stream::let_go`).
    let mut recv = monad_protocol::stream::QuietRecv::new(recv);
    write_message(
        &mut send,
        &Message::Hello {
            protocol: wire::PROTOCOL_MAJOR,
            minor: wire::PROTOCOL_MINOR,
            role,
            token: config.token.clone(),
            device_id: config.device_id.clone(),
            client_name: config.client_name.clone(),
            capabilities: vec!["progress".into()],
            forwarded_for: None,
        },
    )
    .await
    .map_err(|e| ClientError::Unreachable(e.to_string()))?;
    let _ = send.finish();
    let welcome = read_message(&mut *recv, 64 * 1024).await;
    recv.let_go();
    match welcome {
        Ok(Some(Message::Welcome { user, minor, .. })) => Ok(Connection {
            conn,
            server: server.to_owned(),
            user,
            minor: minor.min(wire::PROTOCOL_MINOR),
            _endpoint: endpoint,
        }),
        Ok(Some(Message::Refused { error })) => Err(ClientError::Refused(error)),
        Ok(Some(other)) => Err(ClientError::Protocol(format!(
            "the server answered the hello with `{}`",
            other.kind()
        ))),
        Ok(None) => Err(ClientError::Protocol(
            "the server closed the hello stream".into(),
        )),
        Err(e) => Err(ClientError::Unreachable(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_without_a_port_gets_the_default_port() {
        for (given, meant) in [
            ("example.com", "example.com:4433"),
            ("example.com:5000", "example.com:5000"),
            ("10.0.0.2", "10.0.0.2:4433"),
            ("10.0.0.2:1", "10.0.0.2:1"),
            ("::1", "[::1]:4433"),
            ("[::1]", "[::1]:4433"),
            ("[::1]:9", "[::1]:9"),
            (" host ", "host:4433"),
            // A port out of range stays, for the check to name it; so does one that is empty
            // or not a number (`host::4433` was checked, an address nobody typed).
            ("example.com:99999", "example.com:99999"),
            ("host:", "host:"),
            ("host:abc", "host:abc"),
            ("127.0.0.1:4433/", "127.0.0.1:4433/"),
        ] {
            assert_eq!(with_default_port(given), meant, "{given}");
        }
    }

    fn list(addresses: &[&str]) -> Vec<String> {
        addresses.iter().map(|a| (*a).to_owned()).collect()
    }

    #[test]
    fn hosts_are_tried_in_the_configs_order() {
        let hosts = list(&["a:1", "b:2", "c:3"]);
        assert_eq!(order(&hosts, None), hosts);
        assert_eq!(order(&hosts, Some("x:9")), hosts, "an unlisted one");
    }

    #[test]
    fn a_host_whose_connection_was_just_lost_is_tried_last() {
        let hosts = list(&["a:1", "b:2", "c:3"]);
        assert_eq!(order(&hosts, Some("a:1")), list(&["b:2", "c:3", "a:1"]));
        assert_eq!(order(&hosts, Some("b:2")), list(&["a:1", "c:3", "b:2"]));
        assert_eq!(order(&hosts, Some("c:3")), hosts);
        let one = list(&["a:1"]);
        assert_eq!(order(&one, Some("a:1")), one, "the only one is still tried");
    }

    #[test]
    fn the_unreachable_error_names_every_host_tried_and_why() {
        let one = unreachable(&[("a:1".into(), "no answer within 3 s".into())]).to_string();
        assert!(one.contains("a:1: no answer within 3 s"), "{one}");
        assert!(one.contains("is `monad-server` running on a:1?"), "{one}");
        let two = unreachable(&[
            ("b:2".into(), "no answer within 3 s".into()),
            ("a:1".into(), "the name has no address".into()),
        ])
        .to_string();
        assert!(two.contains("none of the 2 servers answered"), "{two}");
        let (b, a) = (
            two.find("b:2: no answer within 3 s").expect("b named"),
            two.find("a:1: the name has no address").expect("a named"),
        );
        assert!(b < a, "in the order tried: {two}");
        assert!(two.contains("UDP"), "what to check: {two}");
        assert!(matches!(unreachable(&[]), ClientError::Unreachable(_)));
    }

    /// Regression: a name that does not resolve was blamed on the server and on UDP.
    #[tokio::test]
    async fn a_name_without_an_address_is_told_as_such() {
        let config = ClientConfig::new("nosuch.invalid:4433", "mnd_x", &"ab".repeat(32)).unwrap();
        let why = match connect_to(&config, "nosuch.invalid:4433", Role::Agent).await {
            Err(ClientError::Unreachable(why)) => why,
            other => panic!("{:?}", other.map(|_| ())),
        };
        let said = unreachable(&[("nosuch.invalid:4433".into(), why)]).to_string();
        assert!(
            said.contains("cannot find the address of `nosuch.invalid`"),
            "{said}"
        );
        assert!(
            said.contains("check the host name") && !said.contains("UDP"),
            "{said}"
        );
    }
}
