//! OpenAI-compatible Chat Completions: `POST {base_url}/chat/completions` with `stream: true`.
//!
//! The request follows the documented body (`model`, `messages` with `system`, `user`,
//! `assistant` + `tool_calls`, and `tool` messages, `tools` of `type: "function"` with JSON Schema
//! `parameters`, `stream`, `stream_options.include_usage`, `max_completion_tokens`); servers that
//! do not know a field (older local servers and `stream_options`) ignore it. The stream is
//! `data:` lines of `chat.completion.chunk` objects ending with `data: [DONE]`; tool calls come as
//! deltas keyed by `index`, their `arguments` a JSON text in pieces.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{Decoder, Event, FinishReason, LlmError, Message, Request, ToolCall, Usage};

/// The request body for `request`.
pub fn request_body(request: &Request) -> Value {
    let mut messages = Vec::with_capacity(request.messages.len() + 1);
    if !request.system.is_empty() {
        messages.push(json!({"role": "system", "content": request.system}));
    }
    for message in &request.messages {
        messages.push(match message {
            Message::User(text) => json!({"role": "user", "content": text}),
            Message::Assistant { text, tool_calls } => {
                let mut m = json!({
                    "role": "assistant",
                    "content": if text.is_empty() { Value::Null } else { Value::String(text.clone()) },
                });
                if !tool_calls.is_empty() {
                    m["tool_calls"] = tool_calls
                        .iter()
                        .map(|c| {
                            json!({
                                "id": c.id,
                                "type": "function",
                                "function": {"name": c.name, "arguments": arguments_text(&c.arguments)},
                            })
                        })
                        .collect();
                }
                m
            }
            Message::ToolResult {
                call_id,
                text,
                is_error: _,
            } => json!({"role": "tool", "tool_call_id": call_id, "content": text}),
        });
    }
    let mut body = json!({
        "model": request.model,
        "messages": messages,
        "stream": true,
        "stream_options": {"include_usage": true},
        "max_completion_tokens": request.max_output_tokens,
    });
    if !request.tools.is_empty() {
        body["tools"] = request
            .tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                })
            })
            .collect();
    }
    body
}

/// Arguments as the JSON text the API carries (a string the model wrote stays as it was).
fn arguments_text(arguments: &Value) -> String {
    match arguments {
        Value::String(raw) => raw.clone(),
        other => other.to_string(),
    }
}

#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// Decodes the chunk stream.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    /// The calls being put together, in the order they started.
    calls: Vec<PartialCall>,
    /// Which of `calls` a delta of each `index` adds to: the last call started at it.
    by_index: BTreeMap<u64, usize>,
    /// The calls the answer started, and the bytes of their arguments, over the whole answer
    /// (`calls` is emptied at each `finish_reason`, and the stream read on to `[DONE]`).
    started: usize,
    argument_bytes: usize,
    finish: Option<FinishReason>,
    finished_sent: bool,
    done: bool,
}

impl StreamDecoder {
    fn take_calls(&mut self) -> Vec<Event> {
        self.by_index.clear();
        std::mem::take(&mut self.calls)
            .into_iter()
            .map(|c| {
                Event::ToolCall(ToolCall {
                    id: c.id,
                    name: c.name,
                    arguments: super::parse_arguments(&c.arguments),
                })
            })
            .collect()
    }
}

impl StreamDecoder {
    /// Where in `calls` the call a delta at `index` (carrying `id`, when it does, and a
    /// function name: `named`) adds to is: the last one started at that index, or a new one. A
    /// delta that names a function with another id than that call's starts a new call: Ollama
    /// gives every call of an answer `index` 0, each with its own id, and adding them together
    /// made one call of the last one's name with every call's arguments run together. One
    /// without a name goes on with the call (some servers give each piece of a call's
    /// arguments an id of its own).
    fn slot(&mut self, index: u64, id: Option<&str>, named: bool) -> usize {
        let goes_on =
            |call: &PartialCall| !named || id.is_none_or(|id| call.id.is_empty() || call.id == id);
        match self.by_index.get(&index) {
            Some(&at) if goes_on(&self.calls[at]) => at,
            _ => {
                self.started += 1;
                self.calls.push(PartialCall::default());
                self.by_index.insert(index, self.calls.len() - 1);
                self.calls.len() - 1
            }
        }
    }
}

impl Decoder for StreamDecoder {
    fn feed(&mut self, _event: &str, data: &str) -> Result<Vec<Event>, LlmError> {
        let data = data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(self.finish());
        }
        let chunk: Value = serde_json::from_str(data)
            .map_err(|e| LlmError::Protocol(format!("a chunk that is not JSON ({e})")))?;
        // `"error": null` in every chunk is no error (Foundry Local sends it); a string is the
        // message itself (Ollama's `{"error": "..."}`).
        if let Some(error) = chunk.get("error").filter(|e| !e.is_null()) {
            let message = error
                .get("message")
                .or(Some(error))
                .and_then(Value::as_str)
                .map(str::to_owned)
                .unwrap_or_else(|| error.to_string());
            return Err(LlmError::Protocol(format!(
                "an error: {}",
                super::cut_error(&message)
            )));
        }
        let mut out = Vec::new();
        for choice in chunk
            .get("choices")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            if choice.get("index").and_then(Value::as_u64).unwrap_or(0) != 0 {
                continue;
            }
            let delta = choice.get("delta").unwrap_or(&Value::Null);
            if let Some(text) = delta.get("content").and_then(Value::as_str)
                && !text.is_empty()
            {
                out.push(Event::Text(text.to_owned()));
            }
            for call in delta
                .get("tool_calls")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default()
            {
                let index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
                let id = call
                    .get("id")
                    .and_then(Value::as_str)
                    .filter(|id| !id.is_empty());
                let function = call.get("function").unwrap_or(&Value::Null);
                // An empty name is none: LM Studio sends `"name": ""` with each piece of a
                // call's arguments, each piece with an id of its own.
                let name = function
                    .get("name")
                    .and_then(Value::as_str)
                    .filter(|name| !name.is_empty());
                let at = self.slot(index, id, name.is_some());
                let partial = &mut self.calls[at];
                // The id the call started with: a later piece's own id names no call.
                if let Some(id) = id.filter(|_| partial.id.is_empty()) {
                    partial.id = id.to_owned();
                }
                // A name is sent whole once, or in pieces (Gemini), or whole again with every
                // piece of the call (MiniMax through NVIDIA NIM): the same name again adds
                // nothing.
                if let Some(name) = name
                    && partial.name != name
                {
                    partial.name.push_str(name);
                }
                if let Some(args) = function.get("arguments").and_then(Value::as_str) {
                    partial.arguments.push_str(args);
                    self.argument_bytes += args.len();
                }
                super::check_call(self.started, &partial.name, self.argument_bytes)?;
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                out.extend(self.take_calls());
                self.finish = Some(match reason {
                    "stop" => FinishReason::Stop,
                    "tool_calls" | "function_call" => FinishReason::ToolCalls,
                    "length" => FinishReason::Length,
                    "content_filter" => FinishReason::Refused(reason.to_owned()),
                    other => FinishReason::Other(other.to_owned()),
                });
            }
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            let n = |k: &str| usage.get(k).and_then(Value::as_u64).unwrap_or(0);
            out.push(Event::Usage(Usage {
                input_tokens: n("prompt_tokens"),
                output_tokens: n("completion_tokens"),
            }));
        }
        Ok(out)
    }

    fn over(&self) -> bool {
        self.done
    }

    fn done(&self) -> bool {
        self.done || self.finish.is_some()
    }

    fn finish(&mut self) -> Vec<Event> {
        let mut out = self.take_calls();
        if !self.finished_sent {
            self.finished_sent = true;
            let reason = self.finish.clone().unwrap_or(if out.is_empty() {
                FinishReason::Stop
            } else {
                FinishReason::ToolCalls
            });
            out.push(Event::Finish(reason));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::ToolSpec;
    use super::*;

    fn request() -> Request {
        Request {
            model: "gpt-test".into(),
            system: "You are Monad's agent.".into(),
            messages: vec![
                Message::User("read a.txt".into()),
                Message::Assistant {
                    text: String::new(),
                    tool_calls: vec![ToolCall {
                        id: "call_1".into(),
                        name: "read_file".into(),
                        arguments: json!({"path": "a.txt"}),
                    }],
                },
                Message::ToolResult {
                    call_id: "call_1".into(),
                    text: "a.txt\n1\thello".into(),
                    is_error: false,
                },
                Message::Assistant {
                    text: "It says hello.".into(),
                    tool_calls: vec![],
                },
            ],
            tools: vec![ToolSpec {
                name: "read_file".into(),
                description: "Read a file.".into(),
                parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
            }],
            max_output_tokens: 1024,
        }
    }

    #[test]
    fn the_request_has_the_documented_chat_completions_shape() {
        assert_eq!(
            request_body(&request()),
            json!({
                "model": "gpt-test",
                "messages": [
                    {"role": "system", "content": "You are Monad's agent."},
                    {"role": "user", "content": "read a.txt"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "call_1", "type": "function",
                         "function": {"name": "read_file", "arguments": "{\"path\":\"a.txt\"}"}}
                    ]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "a.txt\n1\thello"},
                    {"role": "assistant", "content": "It says hello."},
                ],
                "tools": [{"type": "function", "function": {
                    "name": "read_file", "description": "Read a file.",
                    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
                }}],
                "stream": true,
                "stream_options": {"include_usage": true},
                "max_completion_tokens": 1024,
            })
        );
    }

    #[test]
    fn arguments_the_model_wrote_badly_go_back_as_written() {
        let mut r = request();
        r.messages = vec![Message::Assistant {
            text: String::new(),
            tool_calls: vec![ToolCall {
                id: "c".into(),
                name: "x".into(),
                arguments: Value::String("{oops".into()),
            }],
        }];
        r.tools.clear();
        let body = request_body(&r);
        assert_eq!(
            body["messages"][1]["tool_calls"][0]["function"]["arguments"],
            "{oops"
        );
        assert!(body.get("tools").is_none(), "no tools: no `tools` key");
    }

    fn feed_all(d: &mut StreamDecoder, chunks: &[&str]) -> Vec<Event> {
        chunks.iter().flat_map(|c| d.feed("", c).unwrap()).collect()
    }

    #[test]
    fn text_and_tool_calls_are_assembled_from_deltas() {
        let mut d = StreamDecoder::default();
        let events = feed_all(
            &mut d,
            &[
                r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"Let me "}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"content":"look."}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"read_file","arguments":""}}]}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"stat","arguments":"{\"path\":"}}]}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"path\":\"a\"}"}}]}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"\"b\"}"}}]}}]}"#,
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
                r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}"#,
                "[DONE]",
            ],
        );
        assert_eq!(
            events,
            vec![
                Event::Text("Let me ".into()),
                Event::Text("look.".into()),
                Event::ToolCall(ToolCall {
                    id: "call_a".into(),
                    name: "read_file".into(),
                    arguments: json!({"path": "a"})
                }),
                Event::ToolCall(ToolCall {
                    id: "call_b".into(),
                    name: "stat".into(),
                    arguments: json!({"path": "b"})
                }),
                Event::Usage(Usage {
                    input_tokens: 12,
                    output_tokens: 5
                }),
                Event::Finish(FinishReason::ToolCalls),
            ]
        );
        assert!(d.done());
        assert_eq!(d.finish(), vec![], "nothing twice");
    }

    /// Regression: Ollama gives every call of an answer `index` 0, each with an id of its own;
    /// they were added together into one call of the last one's name, with both calls'
    /// arguments run together (not JSON). A delta naming a function with another id starts a
    /// new call; one without a name goes on with the last call started at its index, whatever
    /// its id (some servers give each piece an id of its own).
    #[test]
    fn calls_that_share_an_index_but_not_an_id_stay_apart() {
        let mut d = StreamDecoder::default();
        let events = feed_all(
            &mut d,
            &[
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","function":{"name":"write_file","arguments":"{\"path\":"}}]}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"piece_2","function":{"arguments":"\"a.py\"}"}}]}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_b","function":{"name":"stat","arguments":"{\"path\":\"b.py\"}"}}]}}]}"#,
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
                "[DONE]",
            ],
        );
        assert_eq!(
            events,
            vec![
                Event::ToolCall(ToolCall {
                    id: "call_a".into(),
                    name: "write_file".into(),
                    arguments: json!({"path": "a.py"})
                }),
                Event::ToolCall(ToolCall {
                    id: "call_b".into(),
                    name: "stat".into(),
                    arguments: json!({"path": "b.py"})
                }),
                Event::Finish(FinishReason::ToolCalls),
            ]
        );
    }

    /// Regression: the calls of an answer were counted since its last `finish_reason`, and the
    /// stream is read on to `[DONE]`: chunks of 200 calls each, every one with a finish, passed
    /// the bound of 256 without end.
    #[test]
    fn an_answers_calls_are_counted_over_the_whole_stream() {
        let chunk = |from: usize| {
            let calls: Vec<serde_json::Value> = (from..from + 200)
                .map(|i| json!({"index": i, "id": format!("c{i}"), "function": {"name": "stat", "arguments": "{}"}}))
                .collect();
            json!({"choices": [{"index": 0, "delta": {"tool_calls": calls}, "finish_reason": "tool_calls"}]})
                .to_string()
        };
        let mut d = StreamDecoder::default();
        assert!(d.feed("", &chunk(0)).is_ok());
        let e = d.feed("", &chunk(200)).unwrap_err();
        assert!(e.to_string().contains("more than 256 tool calls"), "{e}");
        // And their arguments together.
        let mut d = StreamDecoder::default();
        let big = "x".repeat(3 * 1024 * 1024);
        let one = |i: usize| {
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "function": {"name": "stat", "arguments": big}}]}}]})
                .to_string()
        };
        assert!(d.feed("", &one(0)).is_ok());
        let e = d.feed("", &one(1)).unwrap_err();
        assert!(
            e.to_string().contains("arguments take more than 4 MiB"),
            "{e}"
        );
    }

    /// Regression: LM Studio sends each piece of a call's arguments with `"name": ""` and an id
    /// of its own, which started a call of no name per piece; MiniMax through NVIDIA NIM sends
    /// the whole name with every piece, which was run together (`read_fileread_file`). Gemini's
    /// name in pieces is still joined.
    #[test]
    fn a_calls_name_sent_empty_or_again_with_each_piece_names_one_call() {
        let call = |id: &str, name: &str, args: &str| {
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "id": id, "function": {"name": name, "arguments": args}}
            ]}}]})
            .to_string()
        };
        let end = r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#;
        let read = |id: &str| {
            vec![
                Event::ToolCall(ToolCall {
                    id: id.into(),
                    name: "read_file".into(),
                    arguments: json!({"path": "x"}),
                }),
                Event::Finish(FinishReason::ToolCalls),
            ]
        };
        let lm_studio = [
            call("a", "read_file", ""),
            call("b", "", "{\"path\":"),
            call("c", "", "\"x\"}"),
            end.to_owned(),
            "[DONE]".to_owned(),
        ];
        let repeated = [
            call("a", "read_file", "{\"path\":"),
            call("a", "read_file", "\"x\"}"),
            end.to_owned(),
            "[DONE]".to_owned(),
        ];
        let pieces = [
            call("a", "read_", "{\"path\":"),
            call("", "file", "\"x\"}"),
            end.to_owned(),
            "[DONE]".to_owned(),
        ];
        for chunks in [&lm_studio[..], &repeated[..], &pieces[..]] {
            let chunks: Vec<&str> = chunks.iter().map(String::as_str).collect();
            assert_eq!(feed_all(&mut StreamDecoder::default(), &chunks), read("a"));
        }
    }

    /// Regression: `"error": null` in each chunk (Foundry Local) failed every answer; an error
    /// that is a string is its message, not the string quoted.
    #[test]
    fn a_chunks_null_error_is_none_and_a_string_error_is_its_message() {
        let mut d = StreamDecoder::default();
        let events = d
            .feed(
                "",
                r#"{"choices":[{"index":0,"delta":{"content":"hi"}}],"error":null}"#,
            )
            .unwrap();
        assert_eq!(events, vec![Event::Text("hi".into())]);
        let e = d.feed("", r#"{"error":"model not loaded"}"#).unwrap_err();
        assert_eq!(
            e.to_string(),
            LlmError::Protocol("an error: model not loaded".into()).to_string()
        );
    }

    #[test]
    fn an_error_chunk_is_an_error_and_a_stream_without_finish_is_not_done() {
        let mut d = StreamDecoder::default();
        d.feed("", r#"{"choices":[{"index":0,"delta":{"content":"Hi"}}]}"#)
            .unwrap();
        assert!(!d.done());
        let e = d
            .feed("", r#"{"error":{"message":"model overloaded"}}"#)
            .unwrap_err();
        assert!(e.to_string().contains("model overloaded"), "{e}");
        assert!(matches!(
            StreamDecoder::default().feed("", "not json"),
            Err(LlmError::Protocol(_))
        ));
    }

    #[test]
    fn a_server_that_stops_after_finish_reason_without_done_still_completes() {
        let mut d = StreamDecoder::default();
        feed_all(
            &mut d,
            &[r#"{"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}"#],
        );
        assert!(d.done());
        assert_eq!(d.finish(), vec![Event::Finish(FinishReason::Stop)]);
    }
}
