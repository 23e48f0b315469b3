//! The server's TLS identity: a self-signed certificate made on first start, and its fingerprint.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::ServerError;
use crate::fsutil::write_atomic;

/// The certificate and key the server presents.
#[derive(Debug)]
pub struct Identity {
    /// The certificate, DER.
    pub cert: CertificateDer<'static>,
    /// The private key.
    pub key: PrivateKeyDer<'static>,
    /// SHA-256 of the certificate, lowercase hex: what clients pin.
    pub fingerprint: String,
}

/// SHA-256 of a certificate's DER bytes, as 64 lowercase hex digits: what clients pin.
pub use monad_protocol::pin::fingerprint;

/// Loads `tls/cert.pem` and `tls/key.pem`, creating them (key mode 0600) when absent.
/// Returns the identity and whether it was just created.
pub fn load_or_create(tls_dir: &Path) -> Result<(Identity, bool), ServerError> {
    let cert_path = tls_dir.join("cert.pem");
    let key_path = tls_dir.join("key.pem");
    let created = if cert_path.exists() && key_path.exists() {
        false
    } else {
        crate::fsutil::create_private_dir(tls_dir)
            .map_err(|e| ServerError::io("create", tls_dir, e))?;
        let mut names = vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "::1".to_owned(),
        ];
        if let Ok(host) = std::fs::read_to_string("/etc/hostname") {
            let host = host.trim();
            if !host.is_empty() {
                names.push(host.to_owned());
            }
        }
        let generated = rcgen::generate_simple_self_signed(names)
            .map_err(|e| ServerError::Tls(format!("cannot generate a certificate: {e}")))?;
        write_atomic(
            &key_path,
            generated.signing_key.serialize_pem().as_bytes(),
            0o600,
        )?;
        write_atomic(
            &cert_path,
            generated.cert.pem().as_bytes(),
            crate::fsutil::PRIVATE_FILE,
        )?;
        true
    };
    let cert = CertificateDer::from_pem_file(&cert_path)
        .map_err(|e| ServerError::Tls(format!("{}: {e}", cert_path.display())))?;
    let key = PrivateKeyDer::from_pem_file(&key_path)
        .map_err(|e| ServerError::Tls(format!("{}: {e}", key_path.display())))?;
    let fingerprint = fingerprint(&cert);
    Ok((
        Identity {
            cert,
            key,
            fingerprint,
        },
        created,
    ))
}

/// The QUIC server configuration: TLS 1.3 with ring, ALPN `monad/1`, and the transport bounds.
pub fn quic_config(
    identity: &Identity,
    transport: &crate::config::Transport,
) -> Result<quinn::ServerConfig, ServerError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| ServerError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(vec![identity.cert.clone()], identity.key.clone_key())
        .map_err(|e| ServerError::Tls(e.to_string()))?;
    tls.alpn_protocols = vec![monad_protocol::wire::ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
        .map_err(|e| ServerError::Tls(e.to_string()))?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    config.transport_config(Arc::new(transport.quinn()));
    Ok(config)
}
