//! Nobody without a token can keep others from connecting over QUIC: connections that finish
//! the TLS handshake and never say hello, from one address or from many, and Initial packets
//! from addresses that never answer (as spoofed ones would be), leave room for an honest client.
//! Real server, real QUIC on loopback; the attackers use other loopback addresses (127.0.0.x).

use std::io::IoSliceMut;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use monad_tests::{STEP, TestServer, call_in, connect_agent, ok, within};
use serde_json::json;

/// `127.0.0.<n>`: on Linux every address of 127/8 is the loopback interface's.
fn loopback(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, n))
}

/// A QUIC client endpoint on `from`, pinned to the server's certificate.
fn endpoint_on(server: &TestServer, from: IpAddr) -> quinn::Endpoint {
    let (client, _) =
        monad_client::connect::pinned_config(&server.fingerprint, monad_protocol::wire::ALPN)
            .expect("a client configuration");
    let mut endpoint =
        quinn::Endpoint::client(SocketAddr::new(from, 0)).expect("a UDP socket on 127.0.0.x");
    endpoint.set_default_client_config(client);
    endpoint
}

/// Opens `n` connections from `endpoint` that finish the TLS handshake and never say hello;
/// returns those the server let finish it.
async fn hello_less(
    endpoint: &quinn::Endpoint,
    server: SocketAddr,
    n: usize,
) -> Vec<quinn::Connection> {
    let mut held = Vec::new();
    for _ in 0..n {
        let connecting = endpoint.connect(server, "localhost").expect("connecting");
        if let Ok(conn) = within(STEP, "an attacker's handshake", connecting).await {
            held.push(conn);
        }
    }
    held
}

/// An honest agent connects and calls, whatever the attackers hold.
async fn an_honest_agent_gets_in(server: &TestServer) {
    let agent = connect_agent(&server.client_config()).await;
    ok(call_in(&agent, None, "workspaces", json!({})).await);
}

/// Waits (bounded) until the server closed `conn` for the reason `why`.
async fn closed_for(conn: &quinn::Connection, why: &str) {
    match within(
        STEP,
        "the server to close a hello-less connection",
        conn.closed(),
    )
    .await
    {
        quinn::ConnectionError::ApplicationClosed(close) => {
            assert_eq!(String::from_utf8_lossy(&close.reason), why, "{close:?}");
        }
        other => panic!("closed for another reason than {why:?}: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_less_connections_from_one_address_do_not_lock_others_out() {
    let server = TestServer::start_with(|c| {
        c.quotas.max_pending_handshakes = 8;
        c.quotas.max_pending_handshakes_per_address = 4;
        c.quotas.busy_pending_handshakes = 6;
        c.hello_timeout = Duration::from_secs(600);
    })
    .await;
    let attacker = endpoint_on(&server, loopback(2));
    let held = hello_less(&attacker, server.addr, 8).await;
    an_honest_agent_gets_in(&server).await;
    // Each one over the address's bound had to prove its address, then took the place of the
    // address's oldest unproved one: the address never holds more than four.
    for conn in &held[..held.len() - 4] {
        closed_for(conn, "too many connections without a hello").await;
    }
    assert!(
        held[held.len() - 4..]
            .iter()
            .all(|c| c.close_reason().is_none())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_less_connections_from_many_addresses_do_not_lock_others_out() {
    let server = TestServer::start_with(|c| {
        c.quotas.max_pending_handshakes = 8;
        c.quotas.busy_pending_handshakes = 4;
        // Only making room can let the honest client in: nothing expires.
        c.hello_timeout = Duration::from_secs(600);
        c.busy_hello_timeout = Duration::from_secs(600);
    })
    .await;
    let mut held = Vec::new();
    let mut endpoints = Vec::new();
    for n in 2..10 {
        let attacker = endpoint_on(&server, loopback(n));
        held.extend(hello_less(&attacker, server.addr, 2).await);
        endpoints.push(attacker);
    }
    an_honest_agent_gets_in(&server).await;
    // The oldest made room for newer ones, the honest client's among them.
    closed_for(&held[0], "too many connections without a hello").await;
}

/// A UDP socket that sends what its endpoint sends and delivers nothing back: the endpoint's
/// Initial packets leave from an address that never answers, as forged ones would. It counts
/// the Retry packets the server sent back (it asked for proof of the address first).
#[derive(Debug)]
struct Blackhole {
    inner: Arc<dyn quinn::AsyncUdpSocket>,
    heard: Arc<Heard>,
}

impl quinn::AsyncUdpSocket for Blackhole {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn quinn::UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &quinn::udp::Transmit<'_>) -> std::io::Result<()> {
        self.inner.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [quinn::udp::RecvMeta],
    ) -> Poll<std::io::Result<usize>> {
        loop {
            match self.inner.poll_recv(cx, bufs, meta) {
                Poll::Ready(Ok(n)) => {
                    for (buf, meta) in bufs.iter().zip(meta.iter()).take(n) {
                        let stride = meta.stride.max(1);
                        for start in (0..meta.len).step_by(stride) {
                            let first = buf[start];
                            // Long header: the top bit; the type in bits 4-5 (QUIC v1).
                            if first & 0x80 != 0 && (first & 0x30) >> 4 == 3 {
                                self.heard.retries.fetch_add(1, Ordering::SeqCst);
                                self.heard.told.notify_one();
                            }
                        }
                    }
                    // Swallowed: the endpoint never hears back.
                }
                other => return other,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// What a [`Blackhole`] heard: Retry packets.
#[derive(Debug, Default)]
struct Heard {
    retries: AtomicUsize,
    told: tokio::sync::Notify,
}

impl Heard {
    /// Waits (bounded) until at least `n` Retry packets came back.
    async fn retries(&self, n: usize) {
        within(STEP, "the server to ask for address validation", async {
            while self.retries.load(Ordering::SeqCst) < n {
                self.told.notified().await;
            }
        })
        .await;
    }
}

/// Starts `n` connection attempts from `from` through a [`Blackhole`]: Initial packets from an
/// address that never answers. Keep the endpoint and the attempts alive while they should last.
fn forged_initials(
    server: &TestServer,
    from: IpAddr,
    n: usize,
) -> (quinn::Endpoint, Vec<quinn::Connecting>, Arc<Heard>) {
    let runtime = quinn::default_runtime().expect("a runtime");
    let socket = std::net::UdpSocket::bind(SocketAddr::new(from, 0)).expect("a socket");
    let heard = Arc::new(Heard::default());
    let blackhole = Arc::new(Blackhole {
        inner: runtime.wrap_udp_socket(socket).expect("wrapped"),
        heard: heard.clone(),
    });
    let mut endpoint = quinn::Endpoint::new_with_abstract_socket(
        quinn::EndpointConfig::default(),
        None,
        blackhole,
        runtime,
    )
    .expect("an endpoint");
    let (client, _) =
        monad_client::connect::pinned_config(&server.fingerprint, monad_protocol::wire::ALPN)
            .expect("a client configuration");
    endpoint.set_default_client_config(client);
    let attempts = (0..n)
        .map(|_| {
            endpoint
                .connect(server.addr, "localhost")
                .expect("connecting")
        })
        .collect();
    (endpoint, attempts, heard)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initials_from_addresses_that_never_answer_do_not_lock_others_out() {
    let server = TestServer::start_with(|c| {
        c.quotas.max_pending_handshakes = 8;
        c.quotas.busy_pending_handshakes = 4;
        c.hello_timeout = Duration::from_secs(600);
        c.busy_hello_timeout = Duration::from_secs(600);
        // A handshake the peer never continues lasts until this idle time-out.
        c.transport.idle_timeout = Duration::from_secs(600);
    })
    .await;
    const FORGED: usize = 32;
    let (_endpoint, _attempts, heard) = forged_initials(&server, loopback(3), FORGED);
    // Once busy, the server asks every newcomer to prove its address, and a forged one cannot.
    heard.retries(FORGED - 4).await;
    an_honest_agent_gets_in(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_initials_in_a_clients_name_do_not_lock_that_client_out() {
    let server = TestServer::start_with(|c| {
        c.quotas.max_pending_handshakes = 8;
        c.quotas.max_pending_handshakes_per_address = 4;
        c.hello_timeout = Duration::from_secs(600);
        c.transport.idle_timeout = Duration::from_secs(600);
    })
    .await;
    // Initials "from" the honest client's own address, which it never answers.
    const FORGED: usize = 16;
    let (_endpoint, _attempts, heard) = forged_initials(&server, loopback(1), FORGED);
    heard.retries(FORGED - 4).await;
    an_honest_agent_gets_in(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_pressure_a_connection_that_never_says_hello_is_closed_soon() {
    let server = TestServer::start_with(|c| {
        c.quotas.max_pending_handshakes = 8;
        c.quotas.busy_pending_handshakes = 2;
        // Without pressure, a connection would have ten minutes to say hello.
        c.hello_timeout = Duration::from_secs(600);
        c.busy_hello_timeout = Duration::from_secs(1);
    })
    .await;
    let mut held = Vec::new();
    let mut endpoints = Vec::new();
    for n in 2..5 {
        let attacker = endpoint_on(&server, loopback(n));
        held.extend(hello_less(&attacker, server.addr, 2).await);
        endpoints.push(attacker);
    }
    assert_eq!(held.len(), 6, "six handshakes finished");
    // The two that came before the server was busy keep their ten minutes.
    for conn in &held[2..] {
        closed_for(conn, "no hello in time").await;
    }
    assert!(held[..2].iter().all(|c| c.close_reason().is_none()));
}
