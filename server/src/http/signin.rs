//! Who a request is: a bearer token for the API, a sign-in cookie for the web view.
//!
//! Signing in with a token gives the browser a random sign-in id in a cookie that is
//! `HttpOnly` (scripts cannot read it), `SameSite=Strict` (no other site's page can make the
//! browser send it) and `Secure` when the request came over HTTPS (through a TLS-terminating
//! proxy that says `X-Forwarded-Proto: https`; a forged header only makes the cookie stricter).
//! The server keeps only the SHA-256 of each sign-in id, and looks it up by that hash, as the
//! token store does with tokens, so timing reveals nothing an attacker can use; the token it
//! was made from is checked again on every request, so revoking the token signs the browser
//! out. State-changing forms are accepted only from the same site: the `Origin` header must be
//! this server's own (or, without one, `Sec-Fetch-Site: same-origin`), and the form must carry
//! the sign-in's form token.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};

use super::{HttpError, Web, bearer};
use crate::auth::sha256_hex;

/// The sign-in cookie's name over plain HTTP.
pub const COOKIE: &str = "monad_signin";
/// Its name over HTTPS: a browser keeps a `__Host-` cookie only when it is `Secure`, has
/// `Path=/` and names no domain, so a page of a neighbouring host (`evil.example.com` beside
/// `monad.example.com`) cannot set one for this server (a sign-in of its own choosing, or one
/// that shadows the user's).
pub const HOST_COOKIE: &str = "__Host-monad_signin";
/// How long a sign-in lasts.
pub const LIFETIME: Duration = Duration::from_secs(12 * 60 * 60);
/// Sign-ins one user may hold at once (signing in once more ends their oldest).
pub const MAX_PER_USER: usize = 16;
/// Sign-ins the server holds at once (the oldest go first).
pub const MAX_TOTAL: usize = 4096;

#[derive(Debug, Clone)]
struct Signin {
    user: String,
    token: String,
    since: Instant,
}

/// The signed-in browsers, by the SHA-256 of their sign-in id.
#[derive(Debug, Default)]
pub struct Signins {
    by_hash: Mutex<HashMap<String, Signin>>,
}

/// A fresh sign-in.
#[derive(Debug, Clone)]
pub struct NewSignin {
    /// The sign-in id (the cookie's value).
    pub id: String,
}

fn random_hex() -> String {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .expect("the system random generator works");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Signins {
    /// Signs `user` in with `token` (already verified).
    pub fn sign_in(&self, user: &str, token: &str) -> NewSignin {
        let fresh = NewSignin { id: random_hex() };
        let mut map = self.by_hash.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, s| s.since.elapsed() < LIFETIME);
        let evict = |map: &mut HashMap<String, Signin>, of: Option<&str>| {
            let oldest = map
                .iter()
                .filter(|(_, s)| of.is_none_or(|u| s.user == u))
                .min_by_key(|(_, s)| s.since)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                map.remove(&k);
            }
        };
        while map.values().filter(|s| s.user == user).count() >= MAX_PER_USER {
            evict(&mut map, Some(user));
        }
        while map.len() >= MAX_TOTAL {
            evict(&mut map, None);
        }
        map.insert(
            sha256_hex(fresh.id.as_bytes()),
            Signin {
                user: user.to_owned(),
                token: token.to_owned(),
                since: Instant::now(),
            },
        );
        fresh
    }

    fn lookup(&self, id: &str) -> Option<Signin> {
        let hash = sha256_hex(id.as_bytes());
        let mut map = self.by_hash.lock().unwrap_or_else(|p| p.into_inner());
        match map.get(&hash) {
            Some(s) if s.since.elapsed() < LIFETIME => Some(s.clone()),
            Some(_) => {
                map.remove(&hash);
                None
            }
            None => None,
        }
    }

    /// Ends a sign-in.
    pub fn sign_out(&self, id: &str) {
        self.by_hash
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&sha256_hex(id.as_bytes()));
    }
}

/// What a long-lived response (an event stream) was opened with, to be checked again while it
/// runs: a request is authorized once, but a stream outlives a revoked token or a sign-out.
#[derive(Debug, Clone)]
pub enum Credential {
    /// The API's bearer token.
    Bearer(String),
    /// A browser's sign-in id (its cookie).
    Signin(String),
}

impl Credential {
    /// Whether it still stands for `user`: the token is still valid (for a sign-in: the sign-in
    /// still exists and the token it was made from is still valid). Reads the token file when
    /// it changed: call it off the async workers.
    pub fn still_valid(&self, web: &Web, user: &str) -> bool {
        let token = match self {
            Credential::Bearer(token) => token.clone(),
            Credential::Signin(id) => match web.signins.lookup(id) {
                Some(signin) if signin.user == user => signin.token,
                _ => return false,
            },
        };
        matches!(web.state.tokens.verify(&token), Ok(Some(u)) if u == user)
    }
}

/// The value of cookie `name` in a request.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Whether the request came over HTTPS (as a TLS-terminating proxy says).
fn over_https(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

/// The sign-in cookie's name for a request: [`HOST_COOKIE`] over HTTPS (the only one read
/// there), [`COOKIE`] over plain HTTP, where a browser keeps no `__Host-` cookie.
fn cookie_name(headers: &HeaderMap) -> &'static str {
    if over_https(headers) {
        HOST_COOKIE
    } else {
        COOKIE
    }
}

/// The `Set-Cookie` value that gives a browser its sign-in.
pub fn set_cookie(headers: &HeaderMap, id: &str) -> String {
    let secure = if over_https(headers) { "; Secure" } else { "" };
    format!(
        "{}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        cookie_name(headers),
        LIFETIME.as_secs()
    )
}

/// The `Set-Cookie` value that removes it.
pub fn clear_cookie(headers: &HeaderMap) -> String {
    let secure = if over_https(headers) { "; Secure" } else { "" };
    format!(
        "{}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{secure}",
        cookie_name(headers)
    )
}

/// Whether a state-changing request comes from a page of this same server: its `Origin` names
/// the host the request was sent to (scheme and port included), or, without an `Origin`, the
/// browser says `Sec-Fetch-Site: same-origin`. Anything else (another site's form, a request
/// with neither header) is refused.
pub fn same_site(headers: &HeaderMap) -> bool {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    match headers.get(header::ORIGIN).map(|v| v.to_str()) {
        Some(Ok(origin)) => {
            let Some(host) = host else {
                return false;
            };
            let scheme = if over_https(headers) { "https" } else { "http" };
            origin.eq_ignore_ascii_case(&format!("{scheme}://{host}"))
        }
        Some(Err(_)) => false,
        None => headers
            .get("sec-fetch-site")
            .is_some_and(|v| v.as_bytes() == b"same-origin"),
    }
}

/// The user of an API request (`Authorization: Bearer <token>`).
#[derive(Debug, Clone)]
pub struct ApiUser(pub String);

impl FromRequestParts<Arc<Web>> for ApiUser {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, web: &Arc<Web>) -> Result<Self, Response> {
        let unauthorized = |message: &str| {
            closing(
                HttpError {
                    status: StatusCode::UNAUTHORIZED,
                    code: "unauthorized",
                    message: message.to_owned(),
                }
                .into_response(),
            )
        };
        let Some(token) = bearer(&parts.headers) else {
            return Err(unauthorized(
                "missing `Authorization: Bearer <token>`; create a token with `monad-server token create`",
            ));
        };
        match web.state.tokens.verify_off(token).await {
            Ok(Some(user)) => {
                if !crate::mcp::connection_counts_for(&parts.extensions, &user) {
                    return Err(too_many());
                }
                Ok(ApiUser(user))
            }
            Ok(None) => Err(unauthorized(
                "the token is unknown or revoked; create one with `monad-server token create`",
            )),
            Err(e) => Err(HttpError::internal(e).into_response()),
        }
    }
}

fn too_many() -> Response {
    closing(
        HttpError {
            status: StatusCode::TOO_MANY_REQUESTS,
            code: "too_many_connections",
            message: "this user has too many HTTP connections open \
                      (server.http_max_connections_per_user); close some, or try again later"
                .into(),
        }
        .into_response(),
    )
}

/// `response`, with its connection closed after it, as `/mcp` closes a refused one: a request
/// that does not authenticate, or is over its user's connections, does not keep a connection
/// (one a revoked token held stayed open, taking a place of `http_max_connections`, while its
/// holder sent one refused request after another).
fn closing(mut response: Response) -> Response {
    response.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    response
}

/// The signed-in user of a web page request (the sign-in cookie); without one, the browser is
/// sent to the sign-in page (an htmx request is told so with `HX-Redirect`).
#[derive(Debug, Clone)]
pub struct PageUser {
    /// The user.
    pub user: String,
    /// The sign-in id (from the cookie).
    pub signin: String,
}

/// What a sign-in's form token is signed for.
const FORM: &str = "form";

impl PageUser {
    /// The token this sign-in's forms carry: the server's MAC over the user and the hash of
    /// the sign-in id, so it is the same on every page and worthless to anyone else.
    pub fn form_token(&self, web: &Web) -> String {
        web.signer
            .sign(&self.user, FORM, &sha256_hex(self.signin.as_bytes()))
    }

    /// Whether `form_token` is this sign-in's (the MAC is checked in constant time).
    pub fn form_token_ok(&self, web: &Web, form_token: &str) -> bool {
        web.signer
            .verify(&self.user, FORM, form_token)
            .is_ok_and(|signed| signed == sha256_hex(self.signin.as_bytes()))
    }
}

impl FromRequestParts<Arc<Web>> for PageUser {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, web: &Arc<Web>) -> Result<Self, Response> {
        let to_signin = || {
            if parts.headers.contains_key("hx-request") {
                (StatusCode::UNAUTHORIZED, [("hx-redirect", "/login")]).into_response()
            } else {
                Redirect::to("/login").into_response()
            }
        };
        let Some(id) = cookie(&parts.headers, cookie_name(&parts.headers)) else {
            return Err(to_signin());
        };
        let Some(signin) = web.signins.lookup(id) else {
            return Err(to_signin());
        };
        // The token it was made from must still be valid: revoking it signs the browser out.
        match web.state.tokens.verify_off(&signin.token).await {
            Ok(Some(user)) if user == signin.user => {
                if !crate::mcp::connection_counts_for(&parts.extensions, &user) {
                    return Err(too_many());
                }
                Ok(PageUser {
                    user,
                    signin: id.to_owned(),
                })
            }
            Ok(_) => {
                web.signins.sign_out(id);
                Err(to_signin())
            }
            Err(e) => Err(HttpError::internal(e).into_response()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn only_requests_from_the_same_origin_count_as_same_site() {
        let host = ("host", "127.0.0.1:8080");
        assert!(same_site(&headers(&[
            host,
            ("origin", "http://127.0.0.1:8080")
        ])));
        assert!(!same_site(&headers(&[
            host,
            ("origin", "http://evil.example")
        ])));
        assert!(!same_site(&headers(&[
            host,
            ("origin", "http://127.0.0.1:8081")
        ])));
        assert!(!same_site(&headers(&[host, ("origin", "null")])));
        assert!(!same_site(&headers(&[host])));
        assert!(same_site(&headers(&[
            host,
            ("sec-fetch-site", "same-origin")
        ])));
        assert!(!same_site(&headers(&[
            host,
            ("sec-fetch-site", "cross-site")
        ])));
        assert!(!same_site(&headers(&[
            host,
            ("sec-fetch-site", "same-site")
        ])));
    }

    #[test]
    fn a_users_oldest_signin_goes_when_they_hold_too_many() {
        let signins = Signins::default();
        let first = signins.sign_in("ana", "t");
        for _ in 0..MAX_PER_USER {
            signins.sign_in("ana", "t");
        }
        assert!(signins.lookup(&first.id).is_none());
        let other = signins.sign_in("bob", "t");
        assert_eq!(signins.lookup(&other.id).unwrap().user, "bob");
        signins.sign_out(&other.id);
        assert!(signins.lookup(&other.id).is_none());
    }

    #[test]
    fn the_cookie_is_httponly_and_strict_and_secure_over_https() {
        let plain = set_cookie(&HeaderMap::new(), "abc");
        assert!(plain.contains("HttpOnly") && plain.contains("SameSite=Strict"));
        assert!(!plain.contains("Secure"));
        let tls = set_cookie(&headers(&[("x-forwarded-proto", "https")]), "abc");
        assert!(tls.ends_with("; Secure"));
        // Over HTTPS its name keeps neighbouring hosts from setting it; over plain HTTP a
        // browser would keep no such cookie.
        assert!(tls.starts_with("__Host-monad_signin=abc; Path=/;"), "{tls}");
        assert!(!tls.contains("Domain"));
        assert!(plain.starts_with("monad_signin=abc;"), "{plain}");
        let cleared = clear_cookie(&headers(&[("x-forwarded-proto", "https")]));
        assert!(cleared.starts_with("__Host-monad_signin=;"), "{cleared}");
        // What is read is the one of the request's scheme: over HTTPS a plain `monad_signin`
        // (which another host of the domain can set) is not taken.
        let tossed = headers(&[
            ("x-forwarded-proto", "https"),
            ("cookie", "monad_signin=planted"),
        ]);
        assert_eq!(cookie(&tossed, cookie_name(&tossed)), None);
        let both = headers(&[
            ("x-forwarded-proto", "https"),
            ("cookie", "monad_signin=planted; __Host-monad_signin=mine"),
        ]);
        assert_eq!(cookie(&both, cookie_name(&both)), Some("mine"));
    }
}
