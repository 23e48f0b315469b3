//! Model providers: the conversation as a request, and the model's answer as a stream of events.
//!
//! Two wire APIs, both streamed over server-sent events with tool calling:
//! - [`openai`]: OpenAI-compatible Chat Completions (`POST {base_url}/chat/completions`), which
//!   OpenAI, Ollama, llama.cpp's server and vLLM all serve;
//! - [`anthropic`]: Anthropic's Messages API (`POST {base_url}/v1/messages`).
//!
//! Each has a pure half (the request body from a [`Request`]; a decoder that turns one SSE event
//! into [`Event`]s and says when the answer is complete) and shares the I/O half here
//! ([`HttpProvider`]: `reqwest` on rustls with ring, SSE through `sse-stream`). The request and
//! response types are written here (see `docs/agent.md` for why no SDK crate was used).
//!
//! A [`Provider`] is what the agent loop talks to; tests give it a scripted one.

pub mod anthropic;
pub mod openai;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Which wire API a provider speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// OpenAI-compatible Chat Completions.
    #[default]
    Openai,
    /// Anthropic Messages.
    Anthropic,
}

impl ProviderKind {
    /// The name used in settings and in `session.md`'s frontmatter.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Openai => "openai",
            ProviderKind::Anthropic => "anthropic",
        }
    }

    /// Where the API is when `base_url` is not set.
    pub fn default_base_url(self) -> &'static str {
        match self {
            ProviderKind::Openai => "https://api.openai.com/v1",
            ProviderKind::Anthropic => "https://api.anthropic.com",
        }
    }

    /// The environment variable that holds the key when `api_key_env` is not set.
    pub fn default_api_key_env(self) -> &'static str {
        match self {
            ProviderKind::Openai => "OPENAI_API_KEY",
            ProviderKind::Anthropic => "ANTHROPIC_API_KEY",
        }
    }
}

/// A tool the model may call: the same name, description and JSON Schema as the MCP front's.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// The tool's wire name.
    pub name: String,
    /// What it does, written for a model.
    pub description: String,
    /// Its arguments' JSON Schema (an object schema).
    pub parameters: Value,
}

/// A tool call the model made.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The provider's id for the call; its result must carry it back.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments, as the model wrote them (a JSON object when the model behaved; anything
    /// else is kept as a string so the tool can refuse it with a clear error).
    pub arguments: Value,
}

/// One message of the conversation sent to a model.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// What the user said.
    User(String),
    /// What the model answered: text and the tool calls it made, in that order.
    Assistant {
        /// The text (may be empty when the model only called tools).
        text: String,
        /// The calls.
        tool_calls: Vec<ToolCall>,
    },
    /// The result of one tool call, as text for a model.
    ToolResult {
        /// The call's id.
        call_id: String,
        /// The result (or the error) as text.
        text: String,
        /// Whether the call failed.
        is_error: bool,
    },
}

/// What is sent to a model for one step of a turn.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The model's name.
    pub model: String,
    /// The system prompt (never trimmed).
    pub system: String,
    /// The conversation, oldest first.
    pub messages: Vec<Message>,
    /// The tools the model may call.
    pub tools: Vec<ToolSpec>,
    /// Most tokens the model may generate for this request.
    pub max_output_tokens: u32,
}

/// Tokens a request used, as the provider reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Tokens read (the prompt).
    pub input_tokens: u64,
    /// Tokens generated.
    pub output_tokens: u64,
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// It answered.
    Stop,
    /// It wants its tool calls run.
    ToolCalls,
    /// It reached `max_output_tokens`.
    Length,
    /// The provider refused to continue (a content filter, a refusal).
    Refused(String),
    /// Something the provider names that is none of the above.
    Other(String),
}

/// One thing a model's streamed answer says.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// More text.
    Text(String),
    /// A complete tool call (its arguments assembled from the deltas).
    ToolCall(ToolCall),
    /// Tokens used.
    Usage(Usage),
    /// The answer is complete.
    Finish(FinishReason),
}

/// Why a model request failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LlmError {
    /// The provider answered with an error status.
    #[error("the model provider answered HTTP {status}: {message}")]
    Http {
        /// The HTTP status.
        status: u16,
        /// The provider's own message (its error body's `message`, else the body's start).
        message: String,
    },
    /// The provider is rate limiting; try again after `retry_after` when it said.
    #[error("the model provider is rate limiting{}: {message}", retry_after.map(|d| format!(" (retry after {} s)", d.as_secs())).unwrap_or_default())]
    RateLimited {
        /// How long to wait, from `retry-after` (seconds or an HTTP date is not parsed: seconds
        /// only) or the provider's own header.
        retry_after: Option<Duration>,
        /// The provider's message.
        message: String,
    },
    /// The stream ended or broke before the answer was complete.
    #[error("the model's answer was cut off: {0}")]
    Dropped(String),
    /// The provider could not be reached.
    #[error("cannot reach the model provider: {0}")]
    Connect(String),
    /// The provider sent something that is not its API's format, or reported an error in-stream.
    #[error("the model provider sent {0}")]
    Protocol(String),
    /// The settings cannot be used (no model, no key, a bad URL).
    #[error("[llm] settings: {0}")]
    Config(String),
}

/// A stream of a model's answer.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<Event, LlmError>> + Send>>;

/// A future of a provider's answer.
pub type Answer<'a> = Pin<Box<dyn Future<Output = Result<EventStream, LlmError>> + Send + 'a>>;

/// A model behind an API. Dropping the stream (or the future) stops the request.
pub trait Provider: Send + Sync {
    /// Which API it speaks (for `session.md` and the front).
    fn kind(&self) -> ProviderKind;
    /// Sends `request` and streams the answer.
    fn stream<'a>(&'a self, request: &'a Request) -> Answer<'a>;
}

/// The settings a provider is made from (the `[llm]` section's connection keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The API.
    pub kind: ProviderKind,
    /// Its base URL (no trailing slash needed).
    pub base_url: String,
    /// The key, read from the environment variable the settings name (never stored).
    pub api_key: Option<String>,
    /// Longest wait for the response head, and then between two chunks of the stream.
    pub idle_timeout: Duration,
}

/// What decodes one API's stream: one SSE event at a time, pure.
pub trait Decoder: Send {
    /// Takes the SSE event named `event` (empty when unnamed) with its `data`; returns the events
    /// it completes.
    fn feed(&mut self, event: &str, data: &str) -> Result<Vec<Event>, LlmError>;
    /// Whether the answer is complete (its end marker was seen).
    fn done(&self) -> bool;
    /// Whether the stream's last event was seen (OpenAI's `[DONE]`, Anthropic's
    /// `message_stop`): nothing after it is read.
    fn over(&self) -> bool;
    /// What is still pending when the stream ends cleanly after `done` (e.g. calls waiting for
    /// OpenAI's `[DONE]`).
    fn finish(&mut self) -> Vec<Event>;
}

/// Both APIs over HTTPS (or plain HTTP for a local server).
pub struct HttpProvider {
    endpoint: Endpoint,
    client: reqwest::Client,
}

impl HttpProvider {
    /// A provider for `endpoint`. Fails when the URL is not http(s) or TLS cannot be set up.
    pub fn new(endpoint: Endpoint) -> Result<HttpProvider, LlmError> {
        let url = reqwest::Url::parse(&endpoint.base_url)
            .map_err(|e| LlmError::Config(format!("base_url {:?}: {e}", endpoint.base_url)))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(LlmError::Config(format!(
                "base_url {:?} must be http:// or https://",
                endpoint.base_url
            )));
        }
        let client = http_client_builder()?
            .connect_timeout(endpoint.idle_timeout)
            .read_timeout(endpoint.idle_timeout)
            // The key goes to the base URL the operator set or allowed, and nowhere else: a
            // redirect is an error (reqwest keeps headers such as `x-api-key` across hosts).
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| LlmError::Config(format!("HTTP client: {e}")))?;
        Ok(HttpProvider { endpoint, client })
    }

    fn url(&self) -> String {
        let base = self.endpoint.base_url.trim_end_matches('/');
        match self.endpoint.kind {
            ProviderKind::Openai => format!("{base}/chat/completions"),
            ProviderKind::Anthropic => format!("{base}/v1/messages"),
        }
    }

    async fn send(&self, request: &Request) -> Result<EventStream, LlmError> {
        let (body, decoder): (Value, Box<dyn Decoder>) = match self.endpoint.kind {
            ProviderKind::Openai => (
                openai::request_body(request),
                Box::new(openai::StreamDecoder::default()),
            ),
            ProviderKind::Anthropic => (
                anthropic::request_body(request),
                Box::new(anthropic::StreamDecoder::default()),
            ),
        };
        let mut builder = self
            .client
            .post(self.url())
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .body(body.to_string());
        builder = match (self.endpoint.kind, &self.endpoint.api_key) {
            (ProviderKind::Openai, Some(key)) => builder.bearer_auth(key),
            (ProviderKind::Anthropic, Some(key)) => builder.header("x-api-key", key),
            (_, None) => builder,
        };
        if self.endpoint.kind == ProviderKind::Anthropic {
            builder = builder.header("anthropic-version", anthropic::API_VERSION);
        }
        let response = builder
            .send()
            .await
            .map_err(|e| LlmError::Connect(chain(&e)))?;
        let status = response.status().as_u16();
        if !(200..300).contains(&status) {
            let retry_after = retry_after(response.headers());
            let text = error_text(response).await;
            return Err(status_error(status, retry_after, &text));
        }
        // An answer that never ends, or a line that never does, stops at the bound.
        let body = http_body_util::BodyExt::map_err(
            http_body_util::Limited::new(reqwest::Body::from(response), MAX_ANSWER_BYTES),
            |e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    std::io::Error::other(format!(
                        "the answer went on past {} MiB",
                        MAX_ANSWER_BYTES >> 20
                    ))
                } else {
                    std::io::Error::other(e)
                }
            },
        );
        let sse = sse_stream::SseStream::new(body);
        Ok(Box::pin(decode(sse, decoder)))
    }
}

impl Provider for HttpProvider {
    fn kind(&self) -> ProviderKind {
        self.endpoint.kind
    }

    fn stream<'a>(&'a self, request: &'a Request) -> Answer<'a> {
        Box::pin(self.send(request))
    }
}

/// An HTTP client builder on rustls with ring and the platform's roots. Every `reqwest` client
/// in the workspace must start here: the workspace builds reqwest without a crypto provider
/// (aws-lc-rs stays out of the tree), and `reqwest::Client::new()` would panic looking for a
/// process-wide one.
pub fn http_client_builder() -> Result<reqwest::ClientBuilder, LlmError> {
    Ok(reqwest::Client::builder().tls_backend_preconfigured(tls_config()?))
}

/// rustls on ring with the platform's roots (the workspace never builds aws-lc-rs).
fn tls_config() -> Result<rustls::ClientConfig, LlmError> {
    use rustls_platform_verifier::BuilderVerifierExt;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| LlmError::Config(format!("TLS: {e}")))?
        .with_platform_verifier()
        .map_err(|e| LlmError::Config(format!("TLS roots: {e}")))
        .map(|b| b.with_no_client_auth())
}

/// An error and its causes on one line (reqwest's own message is often just "error sending
/// request").
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// The most of one answer's stream that is read: far more than any model's longest answer in
/// events (a few hundred bytes of JSON each), and a bound on a stream that does not end.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// The longest one answer's stream is read for, however steadily it comes (the idle time-out
/// bounds the wait between two pieces).
pub const MAX_ANSWER_TIME: Duration = Duration::from_secs(60 * 60);

/// The most of an error answer's body that is read.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// The longest an error answer's body is read for.
const MAX_ERROR_TIME: Duration = Duration::from_secs(30);

/// The start of an error answer's body, as text: at most [`MAX_ERROR_BODY`] bytes of it, what
/// came within [`MAX_ERROR_TIME`].
async fn error_text(mut response: reqwest::Response) -> String {
    let mut body = Vec::new();
    let deadline = tokio::time::Instant::now() + MAX_ERROR_TIME;
    while body.len() < MAX_ERROR_BODY {
        match tokio::time::timeout_at(deadline, response.chunk()).await {
            Ok(Ok(Some(chunk))) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    body.truncate(MAX_ERROR_BODY);
    String::from_utf8_lossy(&body).into_owned()
}

/// `retry-after` in seconds (OpenAI and Anthropic both send seconds).
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers.get("retry-after")?.to_str().ok()?.trim();
    value
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
        .or_else(|| {
            value
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0 && *s < 1e9)
                .map(Duration::from_secs_f64)
        })
}

/// Characters of a provider's error message that are kept.
const MAX_ERROR_CHARS: usize = 500;

/// A provider's error message at the length of a message ([`MAX_ERROR_CHARS`]): one in the
/// stream may be as long as the answer (64 MiB), and goes to the user and the log.
pub(crate) fn cut_error(message: &str) -> String {
    match message.char_indices().nth(MAX_ERROR_CHARS) {
        Some((end, _)) => format!("{}…", message[..end].trim_end()),
        None => message.trim().to_owned(),
    }
}

/// The error for a non-2xx answer: the provider's own message (`error.message` in both APIs),
/// 429 and Anthropic's 529 ("overloaded") as [`LlmError::RateLimited`]: both pass.
pub fn status_error(status: u16, retry_after: Option<Duration>, body: &str) -> LlmError {
    let message = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .or_else(|| v.get("error").filter(|e| e.is_string()))
                .or_else(|| v.get("message"))
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .unwrap_or_else(|| body.to_owned());
    let message = cut_error(&message);
    if status == 429 || status == 529 {
        LlmError::RateLimited {
            retry_after,
            message,
        }
    } else {
        LlmError::Http { status, message }
    }
}

/// Drives a decoder over an SSE stream: events as they complete; a stream that ends or breaks
/// before the answer's end marker is [`LlmError::Dropped`]. Ends after the first error.
pub fn decode<S, E>(
    sse: S,
    decoder: Box<dyn Decoder>,
) -> impl Stream<Item = Result<Event, LlmError>>
where
    S: Stream<Item = Result<sse_stream::Sse, E>> + Send,
    E: std::fmt::Display,
{
    struct State<S> {
        sse: Pin<Box<S>>,
        decoder: Box<dyn Decoder>,
        pending: std::collections::VecDeque<Event>,
        ended: bool,
        deadline: tokio::time::Instant,
    }
    let state = State {
        sse: Box::pin(sse),
        decoder,
        pending: Default::default(),
        ended: false,
        deadline: tokio::time::Instant::now() + MAX_ANSWER_TIME,
    };
    futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(event) = st.pending.pop_front() {
                return Some((Ok(event), st));
            }
            if st.ended {
                return None;
            }
            let Ok(next) = tokio::time::timeout_at(st.deadline, st.sse.next()).await else {
                st.ended = true;
                return Some((
                    Err(LlmError::Dropped(format!(
                        "the answer was still coming after {} minutes",
                        MAX_ANSWER_TIME.as_secs() / 60
                    ))),
                    st,
                ));
            };
            match next {
                Some(Ok(sse)) => {
                    let Some(data) = sse.data.as_deref() else {
                        continue;
                    };
                    match st.decoder.feed(sse.event.as_deref().unwrap_or(""), data) {
                        Ok(events) => {
                            st.pending.extend(events);
                            // Nothing after the stream's last event is read: a connection
                            // that then stalls or breaks does not undo a complete answer.
                            st.ended = st.decoder.over();
                        }
                        Err(e) => {
                            st.ended = true;
                            return Some((Err(e), st));
                        }
                    }
                }
                // The answer was complete (its finish reason came) before the connection broke.
                Some(Err(_)) if st.decoder.done() => {
                    st.ended = true;
                    let rest = st.decoder.finish();
                    st.pending.extend(rest);
                }
                Some(Err(e)) => {
                    st.ended = true;
                    return Some((Err(LlmError::Dropped(e.to_string())), st));
                }
                None => {
                    st.ended = true;
                    if st.decoder.done() {
                        let rest = st.decoder.finish();
                        st.pending.extend(rest);
                        continue;
                    }
                    return Some((
                        Err(LlmError::Dropped(
                            "the stream ended before the answer was complete".into(),
                        )),
                        st,
                    ));
                }
            }
        }
    })
}

/// Most tool calls one answer may hold (a turn's own bound, `max_tool_calls_per_turn`, is
/// applied after; this one keeps a decoder from holding millions of them).
pub const MAX_CALLS_PER_ANSWER: usize = 256;

/// Most bytes of a tool's name as a model writes it (the tools' names are a few words).
pub const MAX_TOOL_NAME_BYTES: usize = 256;

/// Most bytes of the arguments of one answer's calls together, as a model writes them (each
/// becomes a tree of about 24 times its size at worst before anything counts it).
pub const MAX_ARGUMENT_BYTES: usize = 4 * 1024 * 1024;

/// Checks the tool calls a decoder is assembling, as their pieces come: the answer's `calls`
/// so far, a call's `name`, and the bytes of `arguments` of all the answer's calls so far. A
/// provider's answer is not trusted to be small: one of 59 MiB held 3.5 million calls, which
/// took 3 GB of the server's memory.
pub(crate) fn check_call(calls: usize, name: &str, arguments: usize) -> Result<(), LlmError> {
    if calls > MAX_CALLS_PER_ANSWER {
        return Err(LlmError::Protocol(format!(
            "an answer of more than {MAX_CALLS_PER_ANSWER} tool calls"
        )));
    }
    if name.len() > MAX_TOOL_NAME_BYTES {
        return Err(LlmError::Protocol(format!(
            "a tool name of more than {MAX_TOOL_NAME_BYTES} bytes"
        )));
    }
    if arguments > MAX_ARGUMENT_BYTES {
        return Err(LlmError::Protocol(format!(
            "tool calls whose arguments take more than {} MiB",
            MAX_ARGUMENT_BYTES >> 20
        )));
    }
    Ok(())
}

/// Parses a tool call's assembled arguments: a JSON value when they parse, else the raw text
/// (empty text is an empty object: a call of a tool without arguments). Arguments of more
/// values than a request may hold are not made a tree (a tree takes about 48 bytes a value: a
/// few MiB of small numbers would take hundreds): a short text says so, which the tool refuses.
///
/// Arguments nested deeper than [`MAX_ARGUMENT_NESTING`] are not kept either: the front is sent
/// them inside an event two levels deeper, and past serde_json's 127 levels its reader failed
/// and the turn's stream was dropped.
pub fn parse_arguments(raw: &str) -> Value {
    use monad_protocol::values::{MAX_REQUEST_VALUES, count, nesting};
    if raw.trim().is_empty() {
        return Value::Object(Default::default());
    }
    match count(raw.as_bytes(), MAX_REQUEST_VALUES) {
        Err(e) if e.is_data() => Value::String(format!(
            "(arguments of more than {MAX_REQUEST_VALUES} JSON values: not read)"
        )),
        _ => match serde_json::from_str(raw) {
            Ok(value) if nesting(&value) > MAX_ARGUMENT_NESTING => Value::String(format!(
                "(arguments nested more than {MAX_ARGUMENT_NESTING} levels deep: not read)"
            )),
            Ok(value) => value,
            Err(_) => Value::String(raw.to_owned()),
        },
    }
}

/// How deep a tool call's arguments may nest (a tool's arguments nest two or three levels).
pub const MAX_ARGUMENT_NESTING: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: arguments nested 126 levels deep were kept, and the front's reader, two
    /// levels deeper in the event, failed on them and dropped the turn's stream.
    #[test]
    fn arguments_nested_too_deep_are_not_read() {
        let deep = |n: usize| format!("{{\"x\":{}1{}}}", "[".repeat(n), "]".repeat(n));
        assert!(parse_arguments(&deep(MAX_ARGUMENT_NESTING - 1))["x"].is_array());
        assert_eq!(
            parse_arguments(&deep(125)),
            Value::String(format!(
                "(arguments nested more than {MAX_ARGUMENT_NESTING} levels deep: not read)"
            ))
        );
    }

    #[test]
    fn status_errors_carry_the_providers_message() {
        let e = status_error(
            401,
            None,
            r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error"}}"#,
        );
        assert_eq!(
            e,
            LlmError::Http {
                status: 401,
                message: "Incorrect API key provided".into()
            }
        );
        let e = status_error(
            429,
            Some(Duration::from_secs(7)),
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#,
        );
        assert_eq!(
            e,
            LlmError::RateLimited {
                retry_after: Some(Duration::from_secs(7)),
                message: "slow down".into()
            }
        );
        assert!(e.to_string().contains("retry after 7 s"), "{e}");
        // Anthropic's "overloaded" passes too.
        let e = status_error(
            529,
            None,
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        );
        assert_eq!(
            e,
            LlmError::RateLimited {
                retry_after: None,
                message: "Overloaded".into()
            }
        );
        let e = status_error(502, None, "bad gateway\n");
        assert_eq!(
            e,
            LlmError::Http {
                status: 502,
                message: "bad gateway".into()
            }
        );
    }

    #[test]
    fn retry_after_reads_seconds_and_ignores_the_rest() {
        let mut h = reqwest::header::HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert("retry-after", "3".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(3)));
        h.insert("retry-after", "1.5".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_millis(1500)));
        h.insert(
            "retry-after",
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&h), None);
        h.insert("retry-after", "-1".parse().unwrap());
        assert_eq!(retry_after(&h), None);
    }

    #[test]
    fn arguments_that_are_not_json_stay_text() {
        assert_eq!(parse_arguments(""), serde_json::json!({}));
        assert_eq!(
            parse_arguments(r#"{"path":"a"}"#),
            serde_json::json!({"path":"a"})
        );
        assert_eq!(
            parse_arguments("{\"path\":"),
            Value::String("{\"path\":".into())
        );
        // Too many values to make a tree of: not made.
        let many = format!(
            "[{}1]",
            "1,".repeat(monad_protocol::values::MAX_REQUEST_VALUES)
        );
        assert_eq!(
            parse_arguments(&many),
            Value::String("(arguments of more than 1000000 JSON values: not read)".into())
        );
    }

    fn sse(items: &[(&str, &str)]) -> Vec<Result<sse_stream::Sse, std::io::Error>> {
        items
            .iter()
            .map(|(event, data)| {
                let mut sse = sse_stream::Sse::default().data(*data);
                if !event.is_empty() {
                    sse = sse.event(*event);
                }
                Ok(sse)
            })
            .collect()
    }

    async fn drain(s: impl Stream<Item = Result<Event, LlmError>>) -> Vec<Result<Event, LlmError>> {
        s.collect().await
    }

    #[tokio::test]
    async fn a_stream_that_ends_cleanly_before_its_end_marker_is_dropped() {
        let cut = sse(&[("", r#"{"choices":[{"index":0,"delta":{"content":"Hal"}}]}"#)]);
        let got = drain(decode(
            futures_util::stream::iter(cut),
            Box::new(openai::StreamDecoder::default()),
        ))
        .await;
        assert_eq!(got[0], Ok(Event::Text("Hal".into())));
        assert!(matches!(got[1], Err(LlmError::Dropped(_))), "{got:?}");
        assert_eq!(got.len(), 2);
        let whole = sse(&[
            (
                "message_start",
                r#"{"type":"message_start","message":{"usage":{"input_tokens":3}}}"#,
            ),
            (
                "message_delta",
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":1}}"#,
            ),
            ("message_stop", r#"{"type":"message_stop"}"#),
        ]);
        let got = drain(decode(
            futures_util::stream::iter(whole),
            Box::new(anthropic::StreamDecoder::default()),
        ))
        .await;
        assert_eq!(
            got,
            vec![
                Ok(Event::Usage(Usage {
                    input_tokens: 3,
                    output_tokens: 1
                })),
                Ok(Event::Finish(FinishReason::Stop))
            ]
        );
    }

    #[test]
    fn a_base_url_that_is_not_http_is_refused() {
        let e = HttpProvider::new(Endpoint {
            kind: ProviderKind::Openai,
            base_url: "file:///etc".into(),
            api_key: None,
            idle_timeout: Duration::from_secs(1),
        })
        .err()
        .unwrap();
        assert!(matches!(e, LlmError::Config(_)), "{e}");
        assert!(
            HttpProvider::new(Endpoint {
                kind: ProviderKind::Anthropic,
                base_url: "not a url".into(),
                api_key: None,
                idle_timeout: Duration::from_secs(1),
            })
            .is_err()
        );
    }
}
