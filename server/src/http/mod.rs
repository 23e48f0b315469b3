//! The workspace service over HTTP (seed 004) and the web view of sessions, on the server's
//! HTTP listener beside `/mcp`.
//!
//! - [`api`]: `/api/v1/...`, JSON with seed 004's field names, bearer tokens (the same as QUIC
//!   and `/mcp`); `/api/v1/openapi.json` is generated from the request and response types
//!   ([`openapi`]).
//! - [`pages`]: `/`, server-rendered HTML (maud) with htmx for partial updates; every asset is in
//!   the binary ([`assets`]). Sign-in with a token gives an HttpOnly, `SameSite=Strict` cookie
//!   ([`signin`]).
//! - [`token`]: the tamper-proof page tokens both use.
//!
//! Isolation: everything of another user answers `404`, exactly as something that does not
//! exist. Live updates come from [`crate::feed`].

pub mod api;
pub mod assets;
pub mod markdown;
pub mod openapi;
pub mod pages;
pub mod signin;
pub mod token;

use std::sync::Arc;

use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::quota::Held;
use crate::server::State;
use crate::state::{NotHeld, hold_request, over_call_memory};
use crate::store::{SessionMeta, StoreError};

/// What the HTTP front shares between requests.
#[derive(Debug)]
pub struct Web {
    /// The server's state.
    pub state: Arc<State>,
    /// Signs page tokens (a key per server process: a token outlives neither a restart nor
    /// its listing's meaning).
    pub signer: token::Signer,
    /// Signed-in browsers.
    pub signins: signin::Signins,
    /// Cancelled when the server shuts down: event streams end.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// Turns of artifact uploads ([`api::UPLOADS_AT_ONCE`]).
    pub uploads: Arc<tokio::sync::Semaphore>,
}

/// The HTTP routes of this module, to merge beside `/mcp`.
pub fn router(state: Arc<State>, shutdown: tokio_util::sync::CancellationToken) -> axum::Router {
    // With several hosts, one key for all of them (from their shared secret).
    let signer = match state.config.cluster.secret() {
        Some(secret) => token::Signer::from_secret(secret.expose().as_bytes()),
        None => token::Signer::random(),
    };
    let web = Arc::new(Web {
        state,
        signer,
        signins: signin::Signins::default(),
        shutdown,
        uploads: Arc::new(tokio::sync::Semaphore::new(api::UPLOADS_AT_ONCE)),
    });
    let counted = web.state.clone();
    api::routes().merge(pages::routes()).with_state(web).layer(
        axum::middleware::from_fn_with_state(counted, counted_answer),
    )
}

/// Counts an answer's body in its user's call memory (`server.max_call_bytes_per_user`) until it
/// has been sent: `429` when it would pass the bound. A client that asked for large answers (an
/// artifact of 16 MiB, a whole conversation) on many connections and never read them held them
/// all, past the bound that counts the same answers over QUIC and MCP. An answer of no known
/// length (an event stream) is counted by what makes its events; one of no user (a sign-in
/// page) is small.
pub(crate) async fn counted_answer(
    axum::extract::State(state): axum::extract::State<Arc<State>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    use http_body::Body as _;
    let connection = request
        .extensions()
        .get::<crate::mcp::HttpConnection>()
        .cloned();
    // A request that changes something has done it once it is answered: its answer is counted
    // whatever the user holds (a refusal would say it failed, and its retry would do it twice).
    let may_refuse = matches!(*request.method(), Method::GET | Method::HEAD);
    let response = next.run(request).await;
    // The connection's user is that of its latest authenticated request: this one's when it
    // was (a request that was not, a sign-in page, is small and counts for whoever it was).
    let Some(user) = connection.and_then(|c| c.user()) else {
        return response;
    };
    let Some(size) = response.body().size_hint().exact() else {
        return response;
    };
    let memory = state.call_bytes.holder(&user);
    let size = usize::try_from(size).unwrap_or(usize::MAX);
    if !may_refuse {
        memory.take_anyway(size);
    } else if !memory.take(size) {
        return HttpError {
            status: StatusCode::TOO_MANY_REQUESTS,
            code: "limit_exceeded",
            message: over_call_memory(memory.limit(), "this answer").message,
        }
        .into_response();
    }
    response.map(|body| axum::body::Body::new(CountedBody::new(body, memory)))
}

/// A response body that keeps `_guard` (what its answer counts in its user's memory:
/// [`counted_answer`]) until the connection has taken all of it but the last piece. Its bytes are handed over a piece at a time, each a copy: the connection
/// takes the next piece once it has room for it, so the count lasts while a client does not
/// read, and the pieces it still holds once the body is done with (its write buffer's, bounded)
/// do not keep the whole answer alive. (A body handed over whole was done with, and its count
/// given back, before any of it was sent.)
pub(crate) struct CountedBody<G> {
    inner: axum::body::Body,
    /// What is left of the frame being handed over.
    rest: bytes::Bytes,
    _guard: G,
}

impl<G> CountedBody<G> {
    /// The most handed over at once.
    const PIECE: usize = 64 * 1024;

    pub(crate) fn new(inner: axum::body::Body, guard: G) -> CountedBody<G> {
        CountedBody {
            inner,
            rest: bytes::Bytes::new(),
            _guard: guard,
        }
    }
}

impl<G: Unpin> http_body::Body for CountedBody<G> {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        use std::task::Poll;
        if self.rest.is_empty() {
            match std::pin::Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => self.rest = data,
                    Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                },
                other => return other,
            }
        }
        let n = self.rest.len().min(Self::PIECE);
        let piece = bytes::Bytes::copy_from_slice(&self.rest[..n]);
        bytes::Buf::advance(&mut self.rest, n);
        Poll::Ready(Some(Ok(http_body::Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let mut hint = self.inner.size_hint();
        let rest = self.rest.len() as u64;
        hint.set_lower(hint.lower() + rest);
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper + rest);
        }
        hint
    }
}

/// Why a request's body was not read ([`read_body_held`]).
pub(crate) enum BodyNotRead {
    /// It is over the size allowed, or did not arrive whole.
    TooLarge,
    /// It was not taken in its user's call memory.
    NotHeld(NotHeld),
}

/// Reads a request's body of at most `max` bytes, taking in `memory` what it holds as it
/// arrives (the buffer's growth, before each growth: doubling, up to the announced length),
/// then the tree it will become ([`hold_request`]). Counted while it arrives, not once whole:
/// each of a user's connections could otherwise hold a body of the largest size uncounted.
/// Nothing is taken for what has not arrived, as a QUIC request's frames are counted
/// (`monad_protocol::io::read_frames`). A body refused for memory is read to its end and let go,
/// so that its sender gets the answer rather than a connection cut while it was sending.
pub(crate) async fn read_body_held(
    mut body: axum::body::Body,
    max: usize,
    memory: &Held,
) -> Result<bytes::Bytes, BodyNotRead> {
    use http_body::Body as _;
    use http_body_util::BodyExt;
    let announced = body.size_hint().exact();
    let announced = announced.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    if announced.is_some_and(|n| n > max) {
        return Err(BodyNotRead::TooLarge);
    }
    let mut buffer: Vec<u8> = Vec::new();
    let mut refused = false;
    let mut arrived = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|_| BodyNotRead::TooLarge)?.into_data() else {
            continue; // trailers
        };
        arrived += data.len();
        if arrived > max {
            return Err(BodyNotRead::TooLarge);
        }
        if refused {
            continue;
        }
        if arrived > buffer.capacity() {
            let most = announced.unwrap_or(max).max(arrived);
            let capacity = arrived.max(buffer.capacity() * 2).min(most);
            if !memory.take(capacity - buffer.capacity()) {
                // What it held is let go and given back while the rest is read.
                refused = true;
                memory.give_back(buffer.capacity());
                buffer = Vec::new();
                continue;
            }
            buffer.reserve_exact(capacity - buffer.len());
        }
        buffer.extend_from_slice(&data);
    }
    if refused {
        let error = over_call_memory(memory.limit(), "the request");
        return Err(BodyNotRead::NotHeld(NotHeld::OverMemory(error)));
    }
    hold_request(memory, &buffer).map_err(BodyNotRead::NotHeld)?;
    Ok(buffer.into())
}

/// Default page size of a listing.
pub const DEFAULT_LIMIT: usize = 20;
/// Largest page size of a listing.
pub const MAX_LIMIT: usize = 100;

/// An error answer: a status and a JSON body `{"error": ..., "message": ...}` for the API, or a
/// short page for the web view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    /// The status.
    pub status: StatusCode,
    /// A stable word: `bad_request`, `not_found`, `unauthorized`, `forbidden`,
    /// `quota_exceeded`, `conflict`, `internal`.
    pub code: &'static str,
    /// What is wrong, for people.
    pub message: String,
}

/// The JSON body of an API error.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ErrorBody {
    /// A stable word: `bad_request`, `not_found`, `unauthorized`, `forbidden`,
    /// `quota_exceeded`, `conflict`, `internal`.
    pub error: String,
    /// What is wrong.
    pub message: String,
}

impl HttpError {
    /// `400`: the input is wrong, and says how.
    pub fn bad(message: impl Into<String>) -> HttpError {
        HttpError {
            status: StatusCode::BAD_REQUEST,
            code: "bad_request",
            message: message.into(),
        }
    }

    /// `404`: nothing of the caller's by that name (whether it exists for someone else or not).
    pub fn not_found(what: impl std::fmt::Display) -> HttpError {
        HttpError {
            status: StatusCode::NOT_FOUND,
            code: "not_found",
            message: format!("{what} not found"),
        }
    }

    /// `507 Insufficient Storage`: storing this would take the user past a storage quota
    /// (RFC 4918 §11.5; RFC 4331 §6 answers a write over a user's quota so). Nothing was stored;
    /// deleting something of theirs makes room. Not `413` (the request itself is not too large)
    /// nor `429` (waiting does not help).
    pub fn quota(message: impl Into<String>) -> HttpError {
        HttpError {
            status: StatusCode::INSUFFICIENT_STORAGE,
            code: "quota_exceeded",
            message: message.into(),
        }
    }

    /// `409`: another host serves the session now (this one's lease on it is gone); nothing
    /// was written. Asking again reaches whichever host serves it.
    pub fn conflict(message: impl Into<String>) -> HttpError {
        HttpError {
            status: StatusCode::CONFLICT,
            code: "conflict",
            message: message.into(),
        }
    }

    /// `500`, logged.
    pub fn internal(e: impl std::fmt::Display) -> HttpError {
        tracing::warn!("HTTP: {e}");
        HttpError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: "internal",
            message: "the server could not do that; its log says why".into(),
        }
    }

    /// What a store read found, nothing when what it reads is missing (a session's artifacts
    /// before its first), else its error as [`HttpError::store`] makes it.
    pub fn store_or_nothing<T: Default>(found: Result<T, StoreError>) -> Result<T, HttpError> {
        match found {
            Ok(found) => Ok(found),
            Err(StoreError::NotFound(_)) => Ok(T::default()),
            Err(e) => Err(HttpError::store(e)),
        }
    }

    /// A store error: a missing record is `404`, a refused value `400`, anything else `500`.
    pub fn store(e: StoreError) -> HttpError {
        match e {
            StoreError::NotFound(what) => HttpError::not_found(what),
            StoreError::Invalid(message) => HttpError::bad(message),
            e @ StoreError::Fenced { .. } => HttpError::conflict(e.to_string()),
            StoreError::Full(why) => HttpError::quota(why),
            e @ (StoreError::Io { .. } | StoreError::Database(_) | StoreError::Objects(_)) => {
                HttpError::internal(e)
            }
        }
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.code.to_owned(),
            message: self.message,
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"monad\""),
            );
        }
        response
    }
}

/// One of `user`'s requests in flight (`server.max_calls_per_user`, counted with their QUIC
/// requests and calls; `429` past it), then one of their turns at the store
/// (`server.max_store_work_per_user`, waited for), for store work.
pub(crate) async fn user_slot(
    state: &State,
    user: &str,
) -> Result<crate::state::StoreTurn, HttpError> {
    state.store_turn(user).await.map_err(|e| HttpError {
        status: StatusCode::TOO_MANY_REQUESTS,
        code: "limit_exceeded",
        message: e.message,
    })
}

/// Runs store work on the blocking pool every user shares, holding `slot` ([`user_slot`]) until
/// the work ends, even when its client goes away meanwhile (the handler is dropped, the work is
/// not): a client that sent a request and closed, again and again, piled work up on the pool
/// without a bound, each a reading of conversations or logs.
pub(crate) async fn blocking_held<T: Send + 'static>(
    slot: crate::state::StoreTurn,
    f: impl FnOnce() -> Result<T, HttpError> + Send + 'static,
) -> Result<T, HttpError> {
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        f()
    })
    .await
    .map_err(HttpError::internal)?
}

/// A session's metadata if `user` owns it; `404` otherwise (no such session, a malformed id, or
/// someone else's).
pub fn owned_session(state: &State, user: &str, id: &str) -> Result<SessionMeta, HttpError> {
    let not_found = || HttpError::not_found(format!("session `{id}`"));
    // `default` is the caller's own default, never another user's.
    let Some(id) = state.registry.existing_id(id, user) else {
        return Err(not_found());
    };
    let Ok(id) = crate::session::normalize_id(&id) else {
        return Err(not_found());
    };
    match state.registry.store().load(&id) {
        Ok(Some(meta)) if meta.owner == user => Ok(meta),
        Ok(_) | Err(StoreError::NotFound(_)) | Err(StoreError::Invalid(_)) => Err(not_found()),
        Err(e) => Err(HttpError::internal(e)),
    }
}

/// A workspace record if `user` owns it; `404` otherwise.
pub fn owned_record(
    state: &State,
    user: &str,
    id: &str,
) -> Result<crate::store::WorkspaceRecord, HttpError> {
    match state.registry.store().record(id) {
        Ok(Some(record)) if record.user == user => Ok(record),
        Ok(_) | Err(StoreError::NotFound(_)) | Err(StoreError::Invalid(_)) => {
            Err(HttpError::not_found(format!("workspace `{id}`")))
        }
        Err(e) => Err(HttpError::internal(e)),
    }
}

/// The bearer token of a request, if it has one.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
        .filter(|t| !t.is_empty())
}

/// A page size from `limit`: 1 to [`MAX_LIMIT`], [`DEFAULT_LIMIT`] when absent.
pub fn page_limit(limit: Option<&str>) -> Result<usize, HttpError> {
    match limit {
        None => Ok(DEFAULT_LIMIT),
        Some(raw) => match raw.parse::<usize>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
            _ => Err(HttpError::bad(format!(
                "limit `{raw}` is not a whole number from 1 to {MAX_LIMIT}"
            ))),
        },
    }
}
