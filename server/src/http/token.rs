//! Page tokens (`nextToken`): opaque to clients and tamper-proof. A token is the position of
//! the next page (the store's cursor, or an offset) with an HMAC-SHA256 over the user, the
//! listing it belongs to and that position, under a key of this server's. A token changed in any
//! byte, made for another user or for another listing, fails to verify and is a `400`; it never
//! names a position in someone else's data.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::hmac;

/// The longest token accepted (a cursor is an RFC 3339 time and an id).
const MAX_TOKEN: usize = 1024;

/// Signs and verifies page tokens.
#[derive(Debug)]
pub struct Signer {
    key: hmac::Key,
}

/// A token that is not one this server made for this user and listing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`nextToken` is not a page token this server gave for this listing")]
pub struct BadToken;

impl Signer {
    /// A signer with a fresh random key.
    pub fn random() -> Signer {
        use ring::rand::SecureRandom;
        let mut key = [0u8; 32];
        ring::rand::SystemRandom::new()
            .fill(&mut key)
            .expect("the system random generator works");
        Signer::with_key(&key)
    }

    /// A signer whose key is derived from the hosts' shared `[cluster] secret` (HKDF-SHA256):
    /// every host of a deployment verifies the tokens any of them gave, so a `nextToken` works
    /// whichever host a load balancer sends the next page's request to.
    pub fn from_secret(secret: &[u8]) -> Signer {
        use ring::hkdf;
        let key: hmac::Key = hkdf::Salt::new(hkdf::HKDF_SHA256, b"monad page tokens")
            .extract(secret)
            .expand(&[b"nextToken"], hmac::HMAC_SHA256)
            .expect("one key's length is a valid HKDF output")
            .into();
        Signer { key }
    }

    /// A signer with this key.
    pub fn with_key(key: &[u8]) -> Signer {
        Signer {
            key: hmac::Key::new(hmac::HMAC_SHA256, key),
        }
    }

    /// What the MAC covers: user and listing (each with its length, so that no two pairs
    /// run together into the same bytes), then the position.
    fn message(user: &str, listing: &str, position: &[u8]) -> Vec<u8> {
        let mut message = Vec::with_capacity(user.len() + listing.len() + position.len() + 16);
        for part in [user.as_bytes(), listing.as_bytes()] {
            message.extend((part.len() as u64).to_be_bytes());
            message.extend(part);
        }
        message.extend(position);
        message
    }

    /// The token of `position` in `listing` for `user`.
    pub fn sign(&self, user: &str, listing: &str, position: &str) -> String {
        let tag = hmac::sign(
            &self.key,
            &Signer::message(user, listing, position.as_bytes()),
        );
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(position),
            URL_SAFE_NO_PAD.encode(tag.as_ref())
        )
    }

    /// The position a token names, if this server made it for `user` and `listing`.
    pub fn verify(&self, user: &str, listing: &str, token: &str) -> Result<String, BadToken> {
        if token.len() > MAX_TOKEN {
            return Err(BadToken);
        }
        let (position, tag) = token.split_once('.').ok_or(BadToken)?;
        let position = URL_SAFE_NO_PAD.decode(position).map_err(|_| BadToken)?;
        let tag = URL_SAFE_NO_PAD.decode(tag).map_err(|_| BadToken)?;
        // `hmac::verify` compares in constant time.
        hmac::verify(&self.key, &Signer::message(user, listing, &position), &tag)
            .map_err(|_| BadToken)?;
        String::from_utf8(position).map_err(|_| BadToken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_verifies_only_for_its_user_and_listing_and_unchanged() {
        let signer = Signer::random();
        let token = signer.sign("ana", "sessions", "2026-01-01T00:00:00Z\nabc");
        assert_eq!(
            signer.verify("ana", "sessions", &token).unwrap(),
            "2026-01-01T00:00:00Z\nabc"
        );
        assert_eq!(signer.verify("bob", "sessions", &token), Err(BadToken));
        assert_eq!(signer.verify("ana", "audit:x", &token), Err(BadToken));
        let mut forged = token.clone().into_bytes();
        forged[2] ^= 1;
        let forged = String::from_utf8_lossy(&forged).into_owned();
        assert_eq!(signer.verify("ana", "sessions", &forged), Err(BadToken));
        assert_eq!(signer.verify("ana", "sessions", "nonsense"), Err(BadToken));
        assert_eq!(
            Signer::random().verify("ana", "sessions", &token),
            Err(BadToken)
        );
    }

    /// Regression: each host signed with a random key of its own, so behind a load balancer a
    /// `nextToken` sent to another host of the deployment was a `400`. Hosts of one secret
    /// verify each other's tokens; another secret's are refused.
    #[test]
    fn hosts_of_one_secret_verify_each_others_tokens() {
        let (one, two) = (
            Signer::from_secret(b"the hosts' secret"),
            Signer::from_secret(b"the hosts' secret"),
        );
        let token = one.sign("ana", "sessions", "42");
        assert_eq!(two.verify("ana", "sessions", &token).unwrap(), "42");
        assert_eq!(
            Signer::from_secret(b"another secret").verify("ana", "sessions", &token),
            Err(BadToken)
        );
        assert_eq!(two.verify("bob", "sessions", &token), Err(BadToken));
    }
}
