//! The two model providers against the scripted provider server: what Monad sends (headers and
//! the documented request bodies) and how each answer, error and broken stream comes back.

use std::time::Duration;

use futures_util::StreamExt;
use monad_server::llm::{
    self, Endpoint, Event, FinishReason, HttpProvider, LlmError, Message, Provider, ProviderKind,
    Request, ToolCall, ToolSpec, Usage,
};
use monad_tests::provider::{Reply, ScriptedProvider};
use monad_tests::{STEP, within};
use serde_json::json;

const KINDS: [ProviderKind; 2] = [ProviderKind::Openai, ProviderKind::Anthropic];

fn provider(server: &ScriptedProvider, kind: ProviderKind) -> HttpProvider {
    let base_url = match kind {
        ProviderKind::Openai => server.openai_base_url(),
        ProviderKind::Anthropic => server.anthropic_base_url(),
    };
    HttpProvider::new(Endpoint {
        kind,
        base_url,
        api_key: Some("sk-test-key".into()),
        idle_timeout: STEP,
    })
    .unwrap()
}

fn request() -> Request {
    Request {
        model: "scripted-model".into(),
        system: "You are a test.".into(),
        messages: vec![
            Message::User("read a.txt".into()),
            Message::Assistant {
                text: String::new(),
                tool_calls: vec![ToolCall {
                    id: "call_0".into(),
                    name: "read_file".into(),
                    arguments: json!({"path": "a.txt"}),
                }],
            },
            Message::ToolResult {
                call_id: "call_0".into(),
                text: "1\thello".into(),
                is_error: false,
            },
        ],
        tools: vec![ToolSpec {
            name: "read_file".into(),
            description: "Read a file.".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        }],
        max_output_tokens: 100,
    }
}

/// Everything the stream says, or the first error.
async fn collect(p: &HttpProvider, r: &Request) -> Result<Vec<Event>, LlmError> {
    within(STEP, "the model's answer", async {
        let mut stream = p.stream(r).await?;
        let mut events = Vec::new();
        while let Some(event) = stream.next().await {
            events.push(event?);
        }
        Ok(events)
    })
    .await
}

#[tokio::test]
async fn both_providers_send_the_documented_request_with_their_auth_headers() {
    for kind in KINDS {
        let server = ScriptedProvider::start(vec![Reply::text(["ok"])]).await;
        collect(&provider(&server, kind), &request()).await.unwrap();
        let got = server.requests();
        assert_eq!(got.len(), 1);
        let expected_body = match kind {
            ProviderKind::Openai => llm::openai::request_body(&request()),
            ProviderKind::Anthropic => llm::anthropic::request_body(&request()),
        };
        assert_eq!(got[0].body, expected_body, "{kind:?}");
        assert_eq!(got[0].body["stream"], true);
        match kind {
            ProviderKind::Openai => {
                assert_eq!(got[0].path, "/v1/chat/completions");
                assert_eq!(got[0].headers["authorization"], "Bearer sk-test-key");
                assert!(!got[0].headers.contains_key("x-api-key"));
            }
            ProviderKind::Anthropic => {
                assert_eq!(got[0].path, "/v1/messages");
                assert_eq!(got[0].headers["x-api-key"], "sk-test-key");
                assert_eq!(got[0].headers["anthropic-version"], "2023-06-01");
                assert!(!got[0].headers.contains_key("authorization"));
            }
        }
        assert_eq!(got[0].headers["content-type"], "application/json");
    }
}

#[tokio::test]
async fn streamed_text_and_tool_calls_arrive_as_events() {
    for kind in KINDS {
        let server = ScriptedProvider::start(vec![
            Reply::Stream {
                text: vec!["Let me ".into(), "look.".into()],
                calls: vec![
                    ("c1".into(), "read_file".into(), json!({"path": "a.txt"})),
                    ("c2".into(), "stat".into(), json!({"path": "dir/b"})),
                ],
                usage: (30, 7),
            },
            Reply::text(["Done", "."]),
        ])
        .await;
        let p = provider(&server, kind);
        let events = collect(&p, &request()).await.unwrap();
        assert_eq!(
            events,
            vec![
                Event::Text("Let me ".into()),
                Event::Text("look.".into()),
                Event::ToolCall(ToolCall {
                    id: "c1".into(),
                    name: "read_file".into(),
                    arguments: json!({"path": "a.txt"})
                }),
                Event::ToolCall(ToolCall {
                    id: "c2".into(),
                    name: "stat".into(),
                    arguments: json!({"path": "dir/b"})
                }),
                Event::Usage(Usage {
                    input_tokens: 30,
                    output_tokens: 7
                }),
                Event::Finish(FinishReason::ToolCalls),
            ],
            "{kind:?}"
        );
        let events = collect(&p, &request()).await.unwrap();
        assert_eq!(
            events,
            vec![
                Event::Text("Done".into()),
                Event::Text(".".into()),
                Event::Usage(Usage {
                    input_tokens: 10,
                    output_tokens: 5
                }),
                Event::Finish(FinishReason::Stop),
            ],
            "{kind:?}"
        );
    }
}

#[tokio::test]
async fn an_error_status_carries_the_providers_message() {
    for kind in KINDS {
        let server = ScriptedProvider::start(vec![Reply::Status {
            status: 401,
            message: "invalid x-api-key".into(),
            retry_after: None,
        }])
        .await;
        let e = collect(&provider(&server, kind), &request())
            .await
            .unwrap_err();
        assert_eq!(
            e,
            LlmError::Http {
                status: 401,
                message: "invalid x-api-key".into()
            },
            "{kind:?}"
        );
    }
}

#[tokio::test]
async fn a_rate_limit_says_when_to_retry() {
    for kind in KINDS {
        let server = ScriptedProvider::start(vec![Reply::Status {
            status: 429,
            message: "too many requests".into(),
            retry_after: Some(12),
        }])
        .await;
        let e = collect(&provider(&server, kind), &request())
            .await
            .unwrap_err();
        assert_eq!(
            e,
            LlmError::RateLimited {
                retry_after: Some(Duration::from_secs(12)),
                message: "too many requests".into()
            },
            "{kind:?}"
        );
    }
}

#[tokio::test]
async fn a_stream_dropped_midway_is_an_error_after_the_text_that_arrived() {
    for kind in KINDS {
        let server = ScriptedProvider::start(vec![Reply::Drop {
            text: vec!["Half an ".into(), "answer".into()],
        }])
        .await;
        let p = provider(&server, kind);
        let mut stream = within(STEP, "the answer's head", p.stream(&request()))
            .await
            .unwrap();
        let mut text = String::new();
        let error = within(STEP, "the broken stream", async {
            loop {
                match stream.next().await {
                    Some(Ok(Event::Text(t))) => text.push_str(&t),
                    Some(Ok(other)) => panic!("{kind:?}: unexpected {other:?}"),
                    Some(Err(e)) => break e,
                    None => panic!("{kind:?}: the stream ended without an error"),
                }
            }
        })
        .await;
        assert_eq!(text, "Half an answer", "{kind:?}");
        assert!(matches!(error, LlmError::Dropped(_)), "{kind:?}: {error}");
        assert!(stream.next().await.is_none(), "nothing after the error");
    }
}

#[tokio::test]
async fn an_unreachable_provider_is_a_connect_error() {
    // A port that was free a moment ago and has nobody listening.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let p = HttpProvider::new(Endpoint {
        kind: ProviderKind::Openai,
        base_url: format!("http://{addr}/v1"),
        api_key: None,
        idle_timeout: STEP,
    })
    .unwrap();
    let e = collect(&p, &request()).await.unwrap_err();
    assert!(matches!(e, LlmError::Connect(_)), "{e}");
}

#[tokio::test]
async fn dropping_the_stream_ends_the_request_at_the_provider() {
    for kind in KINDS {
        let server = ScriptedProvider::start(vec![Reply::Hang {
            text: vec!["thinking".into()],
        }])
        .await;
        let p = provider(&server, kind);
        let mut stream = within(STEP, "the answer's head", p.stream(&request()))
            .await
            .unwrap();
        let first = within(STEP, "the first text", stream.next()).await;
        assert_eq!(first, Some(Ok(Event::Text("thinking".into()))));
        drop(stream);
        server.wait_for_abandoned(1).await;
    }
}

/// Regression: the decoders kept reading after the answer's end marker (`[DONE]`,
/// `message_stop`), so a complete answer on a connection that then stayed open failed at the
/// idle time-out, its tool calls never run.
#[tokio::test]
async fn a_complete_answer_on_a_connection_that_stays_open_ends_at_its_end_marker() {
    for kind in KINDS {
        let server = ScriptedProvider::start(vec![Reply::Linger {
            text: vec!["all ".into(), "done".into()],
        }])
        .await;
        let p = HttpProvider::new(Endpoint {
            kind,
            base_url: match kind {
                ProviderKind::Openai => server.openai_base_url(),
                ProviderKind::Anthropic => server.anthropic_base_url(),
            },
            api_key: None,
            // Longer than the wait below: the answer must end at its marker, not at this.
            idle_timeout: STEP * 3,
        })
        .unwrap();
        let events = collect(&p, &request()).await.unwrap();
        assert!(
            events.contains(&Event::Finish(FinishReason::Stop)),
            "{kind:?}: {events:?}"
        );
    }
}

/// Regression: reqwest followed a redirect with the request's headers but `Authorization`, so
/// Anthropic's `x-api-key` (and the whole conversation, on a 307) went to a host the operator
/// never allowed. A redirect is now the provider's error.
#[tokio::test]
async fn a_redirect_is_an_error_and_the_key_goes_nowhere_else() {
    let elsewhere = ScriptedProvider::start(vec![Reply::text(["stolen"])]).await;
    for kind in KINDS {
        let location = match kind {
            ProviderKind::Openai => format!("{}/chat/completions", elsewhere.openai_base_url()),
            ProviderKind::Anthropic => format!("{}/v1/messages", elsewhere.anthropic_base_url()),
        };
        let server = ScriptedProvider::start(vec![Reply::Redirect { location }]).await;
        let error = collect(&provider(&server, kind), &request())
            .await
            .unwrap_err();
        assert!(
            matches!(error, LlmError::Http { status: 307, .. }),
            "{kind:?}: {error}"
        );
    }
    assert!(
        elsewhere.requests().is_empty(),
        "{:?}",
        elsewhere.requests()
    );
}

/// A provider's error message of any length reaches the front at the length of a message.
#[tokio::test]
async fn a_long_error_message_is_cut() {
    for kind in KINDS {
        let server = ScriptedProvider::start(vec![Reply::Status {
            status: 500,
            message: "x".repeat(100_000),
            retry_after: None,
        }])
        .await;
        let error = collect(&provider(&server, kind), &request())
            .await
            .unwrap_err();
        let shown = error.to_string();
        assert!(shown.len() < 1_000, "{kind:?}: {} bytes", shown.len());
        assert!(shown.contains("xxx…"), "{kind:?}: {shown}");
    }
}
