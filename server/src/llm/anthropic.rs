//! Anthropic Messages: `POST {base_url}/v1/messages` with `stream: true`, headers `x-api-key` and
//! `anthropic-version`.
//!
//! The request follows the documented body: `model`, `max_tokens` (required), `system` as a
//! top-level string, `messages` alternating `user` and `assistant` whose content is blocks
//! (`text`, `tool_use` with an object `input`, and `tool_result` blocks in a user message,
//! `is_error` when the call failed), `tools` with `name`, `description` and `input_schema`, and
//! `stream`. Consecutive messages of one role are merged into one message (tool results and the
//! user's next words travel together). The stream is named SSE events: `message_start`,
//! `content_block_start` / `_delta` / `_stop`, `message_delta` (stop reason, usage),
//! `message_stop`, `ping`, `error`.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{Decoder, Event, FinishReason, LlmError, Message, Request, ToolCall, Usage};

/// The `anthropic-version` header sent.
pub const API_VERSION: &str = "2023-06-01";

/// The request body for `request`.
pub fn request_body(request: &Request) -> Value {
    let mut messages: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in &request.messages {
        let (role, blocks) = match message {
            Message::User(text) => ("user", vec![json!({"type": "text", "text": text})]),
            Message::Assistant { text, tool_calls } => {
                let mut blocks = Vec::new();
                // The API refuses a text block of whitespace alone ("text content blocks must
                // contain non-whitespace text"), which a model may stream before a call: sent
                // again with the history, it failed every later request of the session.
                if !text.trim().is_empty() {
                    blocks.push(json!({"type": "text", "text": text}));
                }
                for call in tool_calls {
                    let input = match &call.arguments {
                        Value::Object(_) => call.arguments.clone(),
                        // The API takes only objects; what the model wrote was refused already.
                        _ => json!({}),
                    };
                    blocks.push(json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input}));
                }
                ("assistant", blocks)
            }
            Message::ToolResult {
                call_id,
                text,
                is_error,
            } => {
                let mut block =
                    json!({"type": "tool_result", "tool_use_id": call_id, "content": text});
                if *is_error {
                    block["is_error"] = Value::Bool(true);
                }
                ("user", vec![block])
            }
        };
        if blocks.is_empty() {
            continue;
        }
        match messages.last_mut() {
            Some((last, existing)) if *last == role => existing.extend(blocks),
            _ => messages.push((role, blocks)),
        }
    }
    let messages: Vec<Value> = messages
        .into_iter()
        .map(|(role, blocks)| {
            // A lone text block is sent as a plain string, the form the API's examples use.
            let content = match blocks.as_slice() {
                [one] if one["type"] == "text" => one["text"].clone(),
                _ => Value::Array(blocks),
            };
            json!({"role": role, "content": content})
        })
        .collect();
    let mut body = json!({
        "model": request.model,
        "max_tokens": request.max_output_tokens,
        "messages": messages,
        "stream": true,
    });
    if !request.system.is_empty() {
        body["system"] = Value::String(request.system.clone());
    }
    if !request.tools.is_empty() {
        body["tools"] = request
            .tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}))
            .collect();
    }
    body
}

#[derive(Debug)]
enum Block {
    Text,
    Tool {
        id: String,
        name: String,
        json: String,
    },
    Other,
}

/// Most content blocks an answer may have started and not ended (each is held until it ends).
const MAX_OPEN_BLOCKS: usize = 1024;

/// Decodes the event stream.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    blocks: BTreeMap<u64, Block>,
    /// The tool calls the answer started so far, and the bytes of their arguments.
    tool_calls: usize,
    argument_bytes: usize,
    input_tokens: u64,
    finish: Option<FinishReason>,
    done: bool,
}

fn field<'a>(v: &'a Value, pointer: &str) -> Result<&'a Value, LlmError> {
    v.pointer(pointer)
        .ok_or_else(|| LlmError::Protocol(format!("an event without `{pointer}`: {v}")))
}

impl Decoder for StreamDecoder {
    fn feed(&mut self, event: &str, data: &str) -> Result<Vec<Event>, LlmError> {
        let v: Value = serde_json::from_str(data)
            .map_err(|e| LlmError::Protocol(format!("an event that is not JSON ({e})")))?;
        // The event's name is also its `type`; the type is what counts.
        let kind = v.get("type").and_then(Value::as_str).unwrap_or(event);
        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
        let mut out = Vec::new();
        match kind {
            "message_start" => {
                self.input_tokens = v
                    .pointer("/message/usage/input_tokens")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
            }
            "content_block_start" => {
                let block = field(&v, "/content_block")?;
                let b = match block.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        if let Some(t) = block.get("text").and_then(Value::as_str)
                            && !t.is_empty()
                        {
                            out.push(Event::Text(t.to_owned()));
                        }
                        Block::Text
                    }
                    Some("tool_use") => Block::Tool {
                        id: block
                            .get("id")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_owned(),
                        name: block
                            .get("name")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_owned(),
                        json: String::new(),
                    },
                    _ => Block::Other,
                };
                if let Block::Tool { name, .. } = &b {
                    self.tool_calls += 1;
                    super::check_call(self.tool_calls, name, self.argument_bytes)?;
                }
                if self.blocks.len() >= MAX_OPEN_BLOCKS {
                    return Err(LlmError::Protocol(format!(
                        "an answer with more than {MAX_OPEN_BLOCKS} content blocks open at once"
                    )));
                }
                self.blocks.insert(index, b);
            }
            "content_block_delta" => {
                let delta = field(&v, "/delta")?;
                match (
                    self.blocks.get_mut(&index),
                    delta.get("type").and_then(Value::as_str),
                ) {
                    (Some(Block::Text), Some("text_delta")) => {
                        if let Some(t) = delta.get("text").and_then(Value::as_str)
                            && !t.is_empty()
                        {
                            out.push(Event::Text(t.to_owned()));
                        }
                    }
                    (Some(Block::Tool { json, .. }), Some("input_json_delta")) => {
                        if let Some(p) = delta.get("partial_json").and_then(Value::as_str) {
                            json.push_str(p);
                            self.argument_bytes += p.len();
                            super::check_call(0, "", self.argument_bytes)?;
                        }
                    }
                    (None, _) => {
                        return Err(LlmError::Protocol(format!(
                            "a delta for block {index}, which never started"
                        )));
                    }
                    // Thinking, signatures and other blocks are not shown.
                    _ => {}
                }
            }
            "content_block_stop" => {
                if let Some(Block::Tool { id, name, json }) = self.blocks.remove(&index) {
                    out.push(Event::ToolCall(ToolCall {
                        id,
                        name,
                        arguments: super::parse_arguments(&json),
                    }));
                }
            }
            "message_delta" => {
                if let Some(reason) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.finish = Some(match reason {
                        "end_turn" | "stop_sequence" => FinishReason::Stop,
                        "tool_use" => FinishReason::ToolCalls,
                        "max_tokens" => FinishReason::Length,
                        "refusal" => FinishReason::Refused(reason.to_owned()),
                        other => FinishReason::Other(other.to_owned()),
                    });
                }
                if let Some(output) = v.pointer("/usage/output_tokens").and_then(Value::as_u64) {
                    let input = v
                        .pointer("/usage/input_tokens")
                        .and_then(Value::as_u64)
                        .unwrap_or(self.input_tokens);
                    out.push(Event::Usage(Usage {
                        input_tokens: input,
                        output_tokens: output,
                    }));
                }
            }
            "message_stop" => {
                self.done = true;
                out.extend(self.finish());
            }
            "ping" => {}
            "error" => {
                let kind = v
                    .pointer("/error/type")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let message = super::cut_error(
                    v.pointer("/error/message")
                        .and_then(Value::as_str)
                        .unwrap_or(kind),
                );
                return Err(match kind {
                    "overloaded_error" | "rate_limit_error" => LlmError::RateLimited {
                        retry_after: None,
                        message,
                    },
                    _ => LlmError::Protocol(format!("an error: {message}")),
                });
            }
            // New event types are to be ignored, the API's documentation says.
            _ => {}
        }
        Ok(out)
    }

    fn over(&self) -> bool {
        self.done
    }

    fn done(&self) -> bool {
        self.done
    }

    fn finish(&mut self) -> Vec<Event> {
        match self.finish.take() {
            Some(reason) => vec![Event::Finish(reason)],
            None if self.done => Vec::new(),
            None => vec![Event::Finish(FinishReason::Stop)],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::ToolSpec;
    use super::*;

    #[test]
    fn the_request_has_the_documented_messages_shape() {
        let request = Request {
            model: "claude-test".into(),
            system: "You are Monad's agent.".into(),
            messages: vec![
                Message::User("read a.txt and b.txt".into()),
                Message::Assistant {
                    text: "Reading.".into(),
                    tool_calls: vec![
                        ToolCall {
                            id: "toolu_1".into(),
                            name: "read_file".into(),
                            arguments: json!({"path": "a.txt"}),
                        },
                        ToolCall {
                            id: "toolu_2".into(),
                            name: "read_file".into(),
                            arguments: json!({"path": "b.txt"}),
                        },
                    ],
                },
                Message::ToolResult {
                    call_id: "toolu_1".into(),
                    text: "hello".into(),
                    is_error: false,
                },
                Message::ToolResult {
                    call_id: "toolu_2".into(),
                    text: "not found: b.txt".into(),
                    is_error: true,
                },
                Message::User("and now?".into()),
            ],
            tools: vec![ToolSpec {
                name: "read_file".into(),
                description: "Read a file.".into(),
                parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
            }],
            max_output_tokens: 2048,
        };
        assert_eq!(
            request_body(&request),
            json!({
                "model": "claude-test",
                "max_tokens": 2048,
                "system": "You are Monad's agent.",
                "stream": true,
                "messages": [
                    {"role": "user", "content": "read a.txt and b.txt"},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "Reading."},
                        {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a.txt"}},
                        {"type": "tool_use", "id": "toolu_2", "name": "read_file", "input": {"path": "b.txt"}},
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "hello"},
                        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "not found: b.txt", "is_error": true},
                        {"type": "text", "text": "and now?"},
                    ]},
                ],
                "tools": [{"name": "read_file", "description": "Read a file.",
                           "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}],
            })
        );
    }

    /// Regression: an assistant's text of whitespace alone (streamed before a call) was sent
    /// back as a text block, which the API refuses, failing every later request.
    #[test]
    fn an_assistants_text_of_whitespace_alone_is_not_sent() {
        let call = ToolCall {
            id: "toolu_1".into(),
            name: "stat".into(),
            arguments: json!({}),
        };
        let request = Request {
            model: "claude-test".into(),
            system: String::new(),
            messages: vec![
                Message::User("go".into()),
                Message::Assistant {
                    text: "\n\n".into(),
                    tool_calls: vec![call],
                },
                Message::ToolResult {
                    call_id: "toolu_1".into(),
                    text: "ok".into(),
                    is_error: false,
                },
                Message::Assistant {
                    text: " \n".into(),
                    tool_calls: Vec::new(),
                },
                Message::User("again".into()),
            ],
            tools: Vec::new(),
            max_output_tokens: 16,
        };
        assert_eq!(
            request_body(&request)["messages"],
            json!([
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "stat", "input": {}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"},
                    {"type": "text", "text": "again"},
                ]},
            ])
        );
    }

    #[test]
    fn the_documented_stream_decodes_to_text_tool_calls_usage_and_finish() {
        let mut d = StreamDecoder::default();
        let events: Vec<Event> = [
            ("message_start", r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-test","stop_reason":null,"usage":{"input_tokens":25,"output_tokens":1}}}"#),
            ("content_block_start", r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#),
            ("ping", r#"{"type": "ping"}"#),
            ("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Okay"}}"#),
            ("content_block_stop", r#"{"type":"content_block_stop","index":0}"#),
            ("content_block_start", r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_9","name":"read_file","input":{}}}"#),
            ("content_block_delta", r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}"#),
            ("content_block_delta", r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"path\": \"a"}}"#),
            ("content_block_delta", r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":".txt\"}"}}"#),
            ("content_block_stop", r#"{"type":"content_block_stop","index":1}"#),
            ("message_delta", r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":89}}"#),
            ("message_stop", r#"{"type":"message_stop"}"#),
        ]
        .iter()
        .flat_map(|(e, d2)| d.feed(e, d2).unwrap())
        .collect();
        assert_eq!(
            events,
            vec![
                Event::Text("Okay".into()),
                Event::ToolCall(ToolCall {
                    id: "toolu_9".into(),
                    name: "read_file".into(),
                    arguments: json!({"path": "a.txt"})
                }),
                Event::Usage(Usage {
                    input_tokens: 25,
                    output_tokens: 89
                }),
                Event::Finish(FinishReason::ToolCalls),
            ]
        );
        assert!(d.done());
    }

    #[test]
    fn an_error_event_is_typed() {
        let mut d = StreamDecoder::default();
        assert_eq!(
            d.feed(
                "error",
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#
            ),
            Err(LlmError::RateLimited {
                retry_after: None,
                message: "Overloaded".into()
            })
        );
        // An error's message in the stream is cut as one in a status answer is.
        let long = format!(
            r#"{{"type":"error","error":{{"type":"api_error","message":"{}"}}}}"#,
            "x".repeat(100_000)
        );
        let e = d.feed("error", &long).unwrap_err().to_string();
        assert!(e.len() < 1_000, "{} bytes", e.len());
        let e = d
            .feed(
                "error",
                r#"{"type":"error","error":{"type":"api_error","message":"boom"}}"#,
            )
            .unwrap_err();
        assert!(
            matches!(e, LlmError::Protocol(ref m) if m.contains("boom")),
            "{e}"
        );
        assert!(
            StreamDecoder::default()
                .feed(
                    "content_block_delta",
                    r#"{"type":"content_block_delta","index":4,"delta":{"type":"text_delta","text":"x"}}"#
                )
                .is_err(),
            "a delta for a block that never started"
        );
    }
}
