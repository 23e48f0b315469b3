//! A scripted model provider: a local HTTP server on `127.0.0.1:0` that speaks both wire APIs
//! Monad talks to (OpenAI Chat Completions at `/v1/chat/completions`, Anthropic Messages at
//! `/v1/messages`), streaming included, and answers each request with the next scripted
//! [`Reply`]. It records every request (path, headers, JSON body) so tests can check what Monad
//! sent.
//!
//! ```no_run
//! # async fn f() {
//! use monad_tests::provider::{Reply, ScriptedProvider};
//! let provider = ScriptedProvider::start(vec![
//!     Reply::tool_call("call_1", "read_file", serde_json::json!({"path": "a.txt"})),
//!     Reply::text(["It says ", "hello."]),
//! ])
//! .await;
//! let base_url = provider.openai_base_url(); // or anthropic_base_url()
//! # }
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::watch;

/// One scripted answer to one model request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A streamed answer: text pieces, then tool calls, then the finish reason (`tool_calls` when
    /// there are calls, else `stop`), then usage.
    Stream {
        /// Text, one delta per piece.
        text: Vec<String>,
        /// Tool calls: id, name, arguments (sent in two pieces to exercise assembling).
        calls: Vec<(String, String, Value)>,
        /// Tokens reported: (input, output).
        usage: (u64, u64),
    },
    /// An error status with the API's error body; `retry_after` as the header, in seconds.
    Status {
        /// The HTTP status.
        status: u16,
        /// The error's message.
        message: String,
        /// The `retry-after` header.
        retry_after: Option<u64>,
    },
    /// Text pieces, then the connection breaks before the answer is complete.
    Drop {
        /// What is sent before the break.
        text: Vec<String>,
    },
    /// Text pieces, then nothing until the request goes away (for cancellation); the server
    /// counts requests whose stream was dropped by the client ([`ScriptedProvider::abandoned`]).
    Hang {
        /// What is sent before the wait.
        text: Vec<String>,
    },
    /// A whole answer, its end marker included, then the connection kept open with nothing
    /// more, as a proxy that holds it may.
    Linger {
        /// The answer's text.
        text: Vec<String>,
    },
    /// These SSE events (an event's name, when the API names them, and its data) as they are,
    /// then the end of the response: what the other replies cannot say (a finish for the
    /// output limit, an error inside the stream).
    Events(Vec<(Option<&'static str>, String)>),
    /// A redirect (307) to `location`.
    Redirect {
        /// Where to.
        location: String,
    },
}

impl Reply {
    /// Streamed text and stop.
    pub fn text<S: Into<String>>(pieces: impl IntoIterator<Item = S>) -> Reply {
        Reply::Stream {
            text: pieces.into_iter().map(Into::into).collect(),
            calls: Vec::new(),
            usage: (10, 5),
        }
    }

    /// One tool call and nothing else.
    pub fn tool_call(id: &str, name: &str, arguments: Value) -> Reply {
        Reply::Stream {
            text: Vec::new(),
            calls: vec![(id.to_owned(), name.to_owned(), arguments)],
            usage: (10, 5),
        }
    }
}

/// A request the server received.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The path (`/v1/chat/completions` or `/v1/messages`).
    pub path: String,
    /// Headers, lower-case names (the last value of each).
    pub headers: BTreeMap<String, String>,
    /// The JSON body.
    pub body: Value,
}

struct Shared {
    script: Mutex<VecDeque<Reply>>,
    requests: Mutex<Vec<Recorded>>,
    abandoned: watch::Sender<usize>,
}

/// The running server; it stops when dropped.
pub struct ScriptedProvider {
    addr: SocketAddr,
    shared: Arc<Shared>,
    count: watch::Receiver<usize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ScriptedProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
struct AppState {
    shared: Arc<Shared>,
    count: Arc<watch::Sender<usize>>,
}

impl ScriptedProvider {
    /// Starts a server that answers requests with `script`, in order (a request past its end gets
    /// a 500 saying so).
    pub async fn start(script: Vec<Reply>) -> ScriptedProvider {
        let shared = Arc::new(Shared {
            script: Mutex::new(script.into()),
            requests: Mutex::default(),
            abandoned: watch::channel(0).0,
        });
        let (tx, count) = watch::channel(0);
        let state = AppState {
            shared: shared.clone(),
            count: Arc::new(tx),
        };
        let app = axum::Router::new()
            .route("/v1/chat/completions", axum::routing::post(openai))
            .route("/v1/messages", axum::routing::post(anthropic))
            .with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the scripted provider");
        let addr = listener.local_addr().expect("its address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        ScriptedProvider {
            addr,
            shared,
            count,
            task,
        }
    }

    /// A server's `config.toml` whose `[llm]` talks to this provider with `kind` (no key: its
    /// variable is never set), plus `extra` lines of `[llm]`.
    pub fn llm_config(&self, kind: monad_server::llm::ProviderKind, extra: &str) -> String {
        let base_url = match kind {
            monad_server::llm::ProviderKind::Openai => self.openai_base_url(),
            monad_server::llm::ProviderKind::Anthropic => self.anthropic_base_url(),
        };
        format!(
            "[llm]\nprovider = \"{}\"\nbase_url = \"{base_url}\"\nmodel = \"scripted-model\"\n\
             api_key_env = \"MONAD_TEST_UNSET_KEY\"\n{extra}",
            kind.as_str()
        )
    }

    /// `base_url` for `provider = "openai"`.
    pub fn openai_base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// `base_url` for `provider = "anthropic"`.
    pub fn anthropic_base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Forgets the replies not used yet.
    pub fn clear(&self) {
        self.shared.script.lock().unwrap().clear();
    }

    /// Appends replies to the script.
    pub fn push(&self, replies: impl IntoIterator<Item = Reply>) {
        self.shared.script.lock().unwrap().extend(replies);
    }

    /// The requests received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// Waits (bounded by [`crate::STEP`]) until `n` requests have arrived.
    pub async fn wait_for_requests(&self, n: usize) -> Vec<Recorded> {
        let mut count = self.count.clone();
        crate::within(
            crate::STEP,
            &format!("{n} requests at the scripted provider"),
            count.wait_for(|c| *c >= n),
        )
        .await
        .expect("the provider runs");
        self.requests()
    }

    /// Waits (bounded by [`crate::STEP`]) until the client went away from `n` [`Reply::Hang`]
    /// streams.
    pub async fn wait_for_abandoned(&self, n: usize) {
        let mut abandoned = self.shared.abandoned.subscribe();
        crate::within(
            crate::STEP,
            &format!("{n} abandoned streams at the scripted provider"),
            abandoned.wait_for(|c| *c >= n),
        )
        .await
        .expect("the provider runs");
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Api {
    OpenAi,
    Anthropic,
}

async fn openai(State(state): State<AppState>, request: Request) -> Response {
    answer(state, Api::OpenAi, request).await
}

async fn anthropic(State(state): State<AppState>, request: Request) -> Response {
    answer(state, Api::Anthropic, request).await
}

async fn answer(state: AppState, api: Api, request: Request) -> Response {
    let path = request.uri().path().to_owned();
    let headers = header_map(request.headers());
    let bytes = axum::body::to_bytes(request.into_body(), 16 << 20)
        .await
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let model = body["model"].as_str().unwrap_or("").to_owned();
    state.shared.requests.lock().unwrap().push(Recorded {
        path,
        headers,
        body,
    });
    let reply = state.shared.script.lock().unwrap().pop_front();
    state.count.send_modify(|c| *c += 1);
    let Some(reply) = reply else {
        return error_response(api, 500, "the script has no more replies", None);
    };
    match reply {
        Reply::Status {
            status,
            message,
            retry_after,
        } => error_response(api, status, &message, retry_after),
        Reply::Stream { text, calls, usage } => sse(
            api_events(api, &model, &text, &calls, usage, true),
            Tail::End,
        ),
        Reply::Drop { text } => sse(
            api_events(api, &model, &text, &[], (0, 0), false),
            Tail::Break,
        ),
        Reply::Hang { text } => sse(
            api_events(api, &model, &text, &[], (0, 0), false),
            Tail::Hang(state.shared.clone()),
        ),
        Reply::Linger { text } => sse(
            api_events(api, &model, &text, &[], (10, 5), true),
            Tail::Hang(state.shared.clone()),
        ),
        Reply::Events(events) => sse(events, Tail::End),
        Reply::Redirect { location } => Response::builder()
            .status(StatusCode::TEMPORARY_REDIRECT)
            .header("location", location)
            .body(Body::empty())
            .expect("a valid response"),
    }
}

fn header_map(headers: &HeaderMap) -> BTreeMap<String, String> {
    headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_ascii_lowercase(),
                v.to_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

fn error_response(api: Api, status: u16, message: &str, retry_after: Option<u64>) -> Response {
    let body = match api {
        Api::OpenAi => {
            json!({"error": {"message": message, "type": "scripted_error", "code": null}})
        }
        Api::Anthropic => {
            let kind = if status == 429 {
                "rate_limit_error"
            } else {
                "api_error"
            };
            json!({"type": "error", "error": {"type": kind, "message": message}})
        }
    };
    let mut response = Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json");
    if let Some(seconds) = retry_after {
        response = response.header("retry-after", seconds.to_string());
    }
    response
        .body(Body::from(body.to_string()))
        .expect("a valid response")
}

/// The SSE events (name, JSON data) of an answer in `api`'s format; `complete`: with the finish
/// and end markers.
fn api_events(
    api: Api,
    model: &str,
    text: &[String],
    calls: &[(String, String, Value)],
    usage: (u64, u64),
    complete: bool,
) -> Vec<(Option<&'static str>, String)> {
    let mut out = Vec::new();
    match api {
        Api::OpenAi => {
            let chunk = |delta: Value, finish: Value| {
                json!({"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": 0,
                       "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
                .to_string()
            };
            out.push((
                None,
                chunk(json!({"role": "assistant", "content": ""}), Value::Null),
            ));
            for piece in text {
                out.push((None, chunk(json!({"content": piece}), Value::Null)));
            }
            for (i, (id, name, args)) in calls.iter().enumerate() {
                let args = args.to_string();
                let (a, b) = args.split_at(args.len() / 2);
                out.push((
                    None,
                    chunk(
                        json!({"tool_calls": [{"index": i, "id": id, "type": "function",
                                               "function": {"name": name, "arguments": a}}]}),
                        Value::Null,
                    ),
                ));
                out.push((
                    None,
                    chunk(
                        json!({"tool_calls": [{"index": i, "function": {"arguments": b}}]}),
                        Value::Null,
                    ),
                ));
            }
            if complete {
                let reason = if calls.is_empty() {
                    "stop"
                } else {
                    "tool_calls"
                };
                out.push((None, chunk(json!({}), json!(reason))));
                out.push((
                    None,
                    json!({"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": 0,
                           "model": model, "choices": [],
                           "usage": {"prompt_tokens": usage.0, "completion_tokens": usage.1,
                                     "total_tokens": usage.0.saturating_add(usage.1)}})
                    .to_string(),
                ));
                out.push((None, "[DONE]".to_owned()));
            }
        }
        Api::Anthropic => {
            let ev = |name: &'static str, v: Value| (Some(name), v.to_string());
            out.push(ev(
                "message_start",
                json!({"type": "message_start", "message": {"id": "msg_scripted", "type": "message",
                       "role": "assistant", "content": [], "model": model, "stop_reason": null,
                       "stop_sequence": null, "usage": {"input_tokens": usage.0, "output_tokens": 1}}}),
            ));
            let mut index = 0;
            if !text.is_empty() {
                out.push(ev(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                ));
                out.push(ev("ping", json!({"type": "ping"})));
                for piece in text {
                    out.push(ev(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}),
                    ));
                }
                if complete {
                    out.push(ev(
                        "content_block_stop",
                        json!({"type": "content_block_stop", "index": 0}),
                    ));
                }
                index = 1;
            }
            for (id, name, args) in calls {
                let args = args.to_string();
                let (a, b) = args.split_at(args.len() / 2);
                out.push(ev(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": index,
                           "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
                ));
                for part in ["", a, b] {
                    out.push(ev(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": index,
                               "delta": {"type": "input_json_delta", "partial_json": part}}),
                    ));
                }
                out.push(ev(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": index}),
                ));
                index += 1;
            }
            if complete {
                let reason = if calls.is_empty() {
                    "end_turn"
                } else {
                    "tool_use"
                };
                out.push(ev(
                    "message_delta",
                    json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": null},
                           "usage": {"output_tokens": usage.1}}),
                ));
                out.push(ev("message_stop", json!({"type": "message_stop"})));
            }
        }
    }
    out
}

enum Tail {
    End,
    Break,
    Hang(Arc<Shared>),
}

/// Counts a hanging stream the client dropped.
struct Abandon(Arc<Shared>);

impl Drop for Abandon {
    fn drop(&mut self) {
        self.0.abandoned.send_modify(|c| *c += 1);
    }
}

fn sse(events: Vec<(Option<&'static str>, String)>, tail: Tail) -> Response {
    let frames: Vec<Result<Bytes, std::io::Error>> = events
        .into_iter()
        .map(|(name, data)| {
            let mut frame = String::new();
            if let Some(name) = name {
                frame.push_str(&format!("event: {name}\n"));
            }
            frame.push_str(&format!("data: {data}\n\n"));
            Ok(Bytes::from(frame))
        })
        .collect();
    let head = futures_util::stream::iter(frames);
    let body = match tail {
        Tail::End => Body::from_stream(head),
        Tail::Break => Body::from_stream(futures_util::StreamExt::chain(
            head,
            futures_util::stream::once(async {
                // Pending once: the server writes out what it has buffered (the events above)
                // before the error closes the connection.
                tokio::task::yield_now().await;
                Err(std::io::Error::other("scripted: the stream breaks here"))
            }),
        )),
        Tail::Hang(shared) => Body::from_stream(futures_util::StreamExt::chain(
            head,
            futures_util::stream::once(async move {
                let _guard = Abandon(shared);
                std::future::pending::<()>().await;
                Ok::<Bytes, std::io::Error>(Bytes::new())
            }),
        )),
    };
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(body)
        .expect("a valid response")
}
