//! The QUIC client side of a pinned certificate, shared by everything that reaches a Monad
//! server: the client (the certificate pinned at `login`, trust on first use like ssh's
//! known_hosts) and a server forwarding a call to another host of its store (the certificate the
//! hosts share). Exactly one certificate is accepted, by its SHA-256; the handshake signature
//! is still verified, so only the holder of that certificate's key can pass.
//!
//! Also [`endpoint`], the UDP socket every QUIC endpoint of Monad (server, client, host to
//! host) runs on.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

/// How often a connection made with [`pinned_config`] sends a keep-alive.
pub const KEEP_ALIVE: Duration = Duration::from_secs(2);
/// How long a connection made with [`pinned_config`] lives without hearing from its peer.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(8);

/// SHA-256 of a certificate's DER bytes, as 64 lowercase hex digits.
pub fn fingerprint(cert_der: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, cert_der);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Accepts exactly the certificate whose SHA-256 is `pinned`, and notes the one presented.
#[derive(Debug)]
struct PinnedVerifier {
    pinned: String,
    provider: Arc<CryptoProvider>,
    /// The fingerprint the server presented, to explain a mismatch.
    seen: Mutex<Option<String>>,
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let presented = fingerprint(end_entity);
        let matches = presented == self.pinned;
        *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(presented);
        if matches {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Which certificate a server presented during a handshake made with [`pinned_config`].
#[derive(Debug, Clone)]
pub struct Presented(Arc<PinnedVerifier>);

impl Presented {
    /// The SHA-256 of the certificate the server presented, once a handshake reached it.
    pub fn fingerprint(&self) -> Option<String> {
        self.0
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// A QUIC client configuration that accepts exactly one server certificate, the one whose
/// SHA-256 is `fingerprint` (64 lowercase hex digits), speaks TLS 1.3 (ring) with ALPN `alpn`,
/// and keeps the connection alive ([`KEEP_ALIVE`], [`IDLE_TIMEOUT`]). The error is rustls's or
/// quinn's, as text.
pub fn pinned_config(
    fingerprint: &str,
    alpn: &[u8],
) -> Result<(quinn::ClientConfig, Presented), String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = Arc::new(PinnedVerifier {
        pinned: fingerprint.to_owned(),
        provider: provider.clone(),
        seen: Mutex::new(None),
    });
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(verifier.clone())
        .with_no_client_auth();
    tls.alpn_protocols = vec![alpn.to_vec()];
    let crypto =
        quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(|e| e.to_string())?;
    let mut client = quinn::ClientConfig::new(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport.keep_alive_interval(Some(KEEP_ALIVE));
    transport.max_idle_timeout(Some(
        quinn::IdleTimeout::try_from(IDLE_TIMEOUT).expect("in range"),
    ));
    // What a server may open towards a client: requests to an attached folder, each a stream
    // of its own; nothing else (no one-way streams, no datagrams), so that a server cannot
    // make a client hold what it never reads.
    transport.max_concurrent_bidi_streams(SERVER_STREAMS.into());
    transport.max_concurrent_uni_streams(0u32.into());
    transport.datagram_receive_buffer_size(None);
    client.transport_config(Arc::new(transport));
    Ok((client, Presented(verifier)))
}

/// Requests a server may have open towards a client at once (an attached folder's calls in
/// flight); more wait for one to end. quinn's default was 100.
pub const SERVER_STREAMS: u32 = 64;

/// The receive and send buffer a QUIC endpoint's UDP socket asks for. A result of a few hundred
/// KiB arrives as a burst of datagrams faster than the receiving task drains them; with the
/// kernel's default buffer (208 KiB of accounting, about 90 datagrams) the rest were dropped and
/// the call waited out quinn's loss recovery (846 drops in 1,000 reads of 248 KiB,
/// `docs/benchmarks.md`). The kernel caps it at `net.core.rmem_max` / `wmem_max`.
pub const SOCKET_BUFFER: usize = 4 << 20;

/// A QUIC endpoint on a UDP socket bound to `addr`, with [`SOCKET_BUFFER`] for its buffers (as
/// much of it as the kernel grants; a refusal leaves the defaults), serving when `server` is
/// given. Must be called within a Tokio runtime.
pub fn endpoint(
    addr: std::net::SocketAddr,
    server: Option<quinn::ServerConfig>,
) -> std::io::Result<quinn::Endpoint> {
    let socket = udp_socket(addr)?;
    let runtime =
        quinn::default_runtime().ok_or_else(|| std::io::Error::other("no async runtime found"))?;
    quinn::Endpoint::new(quinn::EndpointConfig::default(), server, socket, runtime)
}

/// A QUIC client endpoint ([`endpoint`]) for reaching a peer of the IP family `v6` says, on an
/// unspecified address and a port the system picks.
pub fn client_endpoint(v6: bool) -> std::io::Result<quinn::Endpoint> {
    let any = if v6 {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    };
    endpoint(std::net::SocketAddr::new(any, 0), None)
}

/// A UDP socket bound to `addr` with [`SOCKET_BUFFER`] asked for its buffers.
fn udp_socket(addr: std::net::SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    let socket = std::net::UdpSocket::bind(addr)?;
    let state = quinn::udp::UdpSocketState::new((&socket).into())?;
    if let Err(e) = state.set_recv_buffer_size((&socket).into(), SOCKET_BUFFER) {
        tracing::debug!("cannot enlarge the UDP receive buffer: {e}");
    }
    if let Err(e) = state.set_send_buffer_size((&socket).into(), SOCKET_BUFFER) {
        tracing::debug!("cannot enlarge the UDP send buffer: {e}");
    }
    Ok(socket)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the kernel grants at most, from `/proc/sys/net/core/NAME`.
    fn kernel_max(name: &str) -> usize {
        std::fs::read_to_string(format!("/proc/sys/net/core/{name}"))
            .expect("a Linux kernel")
            .trim()
            .parse()
            .expect("a number")
    }

    #[test]
    fn an_endpoints_socket_has_the_buffers_it_asked_for_as_far_as_the_kernel_allows() {
        let socket = udp_socket("127.0.0.1:0".parse().unwrap()).unwrap();
        let state = quinn::udp::UdpSocketState::new((&socket).into()).unwrap();
        // Linux reports twice what it grants (the rest is its bookkeeping).
        let want = |max: &str| SOCKET_BUFFER.min(kernel_max(max));
        let recv = state.recv_buffer_size((&socket).into()).unwrap();
        assert!(recv >= want("rmem_max"), "receive buffer {recv}");
        let send = state.send_buffer_size((&socket).into()).unwrap();
        assert!(send >= want("wmem_max"), "send buffer {send}");
    }
}
