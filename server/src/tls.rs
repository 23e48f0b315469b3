//! The server's TLS identity: a self-signed certificate made on first start, and its fingerprint.

use std::os::unix::fs::OpenOptionsExt;
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

/// Loads `tls/cert.pem` and `tls/key.pem`, creating them (key mode 0600) when both are absent
/// (or a start that made them was cut short: `tls/.making`), under a lock (`tls/.lock`), so that two processes starting on a new data dir (a server and a
/// `token create`) make one identity. One of the two without the other is an error naming the
/// missing one: a new identity there changed the fingerprint every client and host pinned,
/// silently (one file copied to another host, a key behind a link not mounted yet).
/// Returns the identity and whether it was just created.
pub fn load_or_create(tls_dir: &Path) -> Result<(Identity, bool), ServerError> {
    let cert_path = tls_dir.join("cert.pem");
    let key_path = tls_dir.join("key.pem");
    // A link counts as there, wherever it leads: reading it then says what is wrong.
    let there = |path: &Path| path.symlink_metadata().is_ok();
    let _lock = if there(&cert_path) && there(&key_path) && !there(&tls_dir.join(".making")) {
        None
    } else {
        crate::fsutil::create_private_dir(tls_dir)
            .map_err(|e| ServerError::io("create", tls_dir, e))?;
        let lock_path = tls_dir.join(".lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(crate::fsutil::PRIVATE_FILE)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&lock_path)
            .map_err(|e| ServerError::io("open", &lock_path, e))?;
        let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| ServerError::io("lock", &lock_path, e.into()))?;
        Some(lock)
    };
    // Made while the identity is being made: a start cut short between its two files (the
    // key is written first) made no identity anyone pinned, and the next start makes it anew.
    let making = tls_dir.join(".making");
    let cut_short = there(&making);
    let created = match (there(&cert_path), there(&key_path)) {
        (true, true) if !cut_short => false,
        (true, false) | (false, true) if !cut_short => {
            let (found, missing) = if there(&cert_path) {
                (&cert_path, &key_path)
            } else {
                (&key_path, &cert_path)
            };
            return Err(ServerError::Tls(format!(
                "{} is there but {} is not: the server's identity is the two together; put \
                 the missing one back (copy both to another host), or remove both to make a \
                 new identity, whose new fingerprint every client must then pin again",
                found.display(),
                missing.display()
            )));
        }
        _ => {
            std::fs::write(&making, b"").map_err(|e| ServerError::io("write", &making, e))?;
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
            std::fs::remove_file(&making).map_err(|e| ServerError::io("remove", &making, e))?;
            true
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: one of the two files without the other (a key behind a link not mounted
    /// yet, a certificate copied alone to another host) made a new identity over both,
    /// silently changing the fingerprint every client pinned; and two processes starting on a
    /// new data dir could each make one, a key of one beside a certificate of the other.
    #[test]
    fn one_half_of_the_identity_is_an_error_and_two_starts_make_one() {
        let dir = tempfile::tempdir().unwrap();
        let tls = dir.path().join("tls");
        let made: Vec<String> = std::thread::scope(|s| {
            let starts: Vec<_> = (0..4)
                .map(|_| s.spawn(|| load_or_create(&tls).unwrap().0.fingerprint))
                .collect();
            starts.into_iter().map(|t| t.join().unwrap()).collect()
        });
        assert!(made.iter().all(|f| f == &made[0]), "{made:?}");
        let (again, created) = load_or_create(&tls).unwrap();
        assert!(!created);
        assert_eq!(again.fingerprint, made[0]);

        let key = std::fs::read(tls.join("key.pem")).unwrap();
        std::fs::remove_file(tls.join("key.pem")).unwrap();
        let e = load_or_create(&tls).unwrap_err().to_string();
        assert!(e.contains("key.pem is not"), "{e}");
        assert!(!tls.join("key.pem").exists(), "nothing made");
        // A link that leads nowhere is there: reading it says so, and nothing is made.
        std::os::unix::fs::symlink(dir.path().join("not-mounted/key.pem"), tls.join("key.pem"))
            .unwrap();
        let e = load_or_create(&tls).unwrap_err().to_string();
        assert!(e.contains("key.pem"), "{e}");
        assert!(tls.join("key.pem").symlink_metadata().unwrap().is_symlink());
        std::fs::remove_file(tls.join("key.pem")).unwrap();
        std::fs::write(tls.join("key.pem"), key).unwrap();
        assert_eq!(load_or_create(&tls).unwrap().0.fingerprint, made[0]);

        // A first start cut short between the two files: the next makes the identity anew.
        let fresh = dir.path().join("fresh");
        std::fs::create_dir(&fresh).unwrap();
        std::fs::write(fresh.join(".making"), b"").unwrap();
        std::fs::write(fresh.join("key.pem"), b"half").unwrap();
        let (made, created) = load_or_create(&fresh).unwrap();
        assert!(created);
        assert!(!fresh.join(".making").exists());
        assert_eq!(
            load_or_create(&fresh).unwrap().0.fingerprint,
            made.fingerprint
        );
    }
}
