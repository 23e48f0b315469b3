//! The built-in agent's turn as data: what a front sees while a turn runs ([`AgentEvent`]) and
//! how it ended ([`TurnResult`]). The server's agent loop produces them; the wire carries them
//! ([`crate::wire::Message::AgentEvent`], [`crate::wire::Message::TurnDone`]); the fronts (chat,
//! ACP) only translate them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ToolError;
use crate::wire::WorkspaceRef;

/// Most bytes of a tool result's text an [`AgentEvent::ToolCallEnded`] carries to a front (the
/// model gets the whole text).
pub const MAX_EVENT_TEXT: usize = 16 * 1024;

/// One thing that happens during a turn, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum AgentEvent {
    /// More of the assistant's text, as the model generates it.
    Text {
        /// The new text.
        text: String,
    },
    /// The model called a tool; it is being routed and run (and may wait for an approval).
    ToolCallStarted {
        /// The call's id (the provider's).
        call_id: String,
        /// The tool's name as the model wrote it.
        tool: String,
        /// Its arguments as the model wrote them.
        args: Value,
    },
    /// A line about a running tool call while it waits (for its user's approval, for a slow
    /// machine).
    ToolCallProgress {
        /// The call's id.
        call_id: String,
        /// What it waits for.
        message: String,
    },
    /// A tool call ended.
    ToolCallEnded {
        /// The call's id.
        call_id: String,
        /// The tool's name.
        tool: String,
        /// The workspace that ran it, when one was reached.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        workspace: Option<WorkspaceRef>,
        /// The error, when it failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<ToolError>,
        /// The result as the model got it, cut to [`MAX_EVENT_TEXT`] bytes.
        text: String,
        /// Whether `text` was cut.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        truncated: bool,
    },
    /// (Only on a prompt sent with `ask: true`; minor [`crate::wire::PERMISSION_MINOR`]) A call
    /// about to run in a restricted workspace waits for the front's
    /// [`crate::wire::Message::PermissionAnswer`]: a rejection denies it without asking the
    /// folder's owner; an approval lets it go on to the owner's own policy and prompt.
    Permission {
        /// The call's id (the same as in [`AgentEvent::ToolCallStarted`]).
        call_id: String,
        /// The tool.
        tool: String,
        /// The restricted workspace it would run in.
        workspace: WorkspaceRef,
        /// What it acts on, in one line (a path, a pattern, a command line), as in the audit
        /// log; empty when the call names nothing.
        what: String,
    },
    /// The provider is rate limiting; the loop waits and asks again.
    Retrying {
        /// How long it waits, in milliseconds.
        after_ms: u64,
        /// The provider's message.
        message: String,
    },
}

/// Why a turn ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case", deny_unknown_fields)]
pub enum StopReason {
    /// The model answered.
    Answered,
    /// The front cancelled the turn.
    Cancelled,
    /// The model made more tool calls than `llm.max_tool_calls_per_turn` allows.
    ToolCallLimit {
        /// The limit.
        limit: u32,
    },
    /// The turn used more tokens than `llm.max_tokens_per_turn` allows.
    TokenLimit {
        /// The limit.
        limit: u64,
    },
    /// The model stopped at `llm.max_output_tokens`.
    Length,
    /// The provider refused to go on (a content filter, a refusal).
    Refused {
        /// What the provider said.
        message: String,
    },
    /// The turn could not go on: no model configured, the provider failed or is unreachable.
    Failed {
        /// What went wrong, in a sentence.
        message: String,
    },
}

/// How a turn ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnResult {
    /// Why it ended.
    pub stop: StopReason,
    /// Tool calls the model made in this turn.
    pub tool_calls: u32,
    /// Tokens read over all of the turn's model requests, as the provider reported them.
    pub input_tokens: u64,
    /// Tokens generated over all of them.
    pub output_tokens: u64,
}

/// `text` cut to at most `max` bytes on a character boundary, and whether it was cut.
pub fn cut(text: &str, max: usize) -> (String, bool) {
    if text.len() <= max {
        return (text.to_owned(), false);
    }
    (crate::text::head(text, max).to_owned(), true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;
    use serde_json::json;

    fn round_trip<T: Serialize + for<'de> Deserialize<'de> + PartialEq + std::fmt::Debug>(v: T) {
        let text = serde_json::to_string(&v).unwrap();
        assert_eq!(serde_json::from_str::<T>(&text).unwrap(), v, "{text}");
    }

    #[test]
    fn every_event_and_result_round_trips() {
        round_trip(AgentEvent::Text { text: "hi".into() });
        round_trip(AgentEvent::ToolCallStarted {
            call_id: "c".into(),
            tool: "read_file".into(),
            args: json!({"path": "a"}),
        });
        round_trip(AgentEvent::ToolCallEnded {
            call_id: "c".into(),
            tool: "read_file".into(),
            workspace: Some(WorkspaceRef {
                name: "lap".into(),
                uri: "monad://x".into(),
            }),
            error: Some(ToolError::new(ErrorCode::Denied, "no")),
            text: "denied: no".into(),
            truncated: true,
        });
        round_trip(AgentEvent::ToolCallProgress {
            call_id: "c".into(),
            message: "waiting for approval".into(),
        });
        round_trip(AgentEvent::Permission {
            call_id: "c".into(),
            tool: "edit_file".into(),
            workspace: WorkspaceRef {
                name: "lap".into(),
                uri: "monad://x".into(),
            },
            what: "notes/a.txt".into(),
        });
        round_trip(AgentEvent::Retrying {
            after_ms: 1000,
            message: "slow".into(),
        });
        for stop in [
            StopReason::Answered,
            StopReason::Cancelled,
            StopReason::ToolCallLimit { limit: 3 },
            StopReason::TokenLimit { limit: 9 },
            StopReason::Length,
            StopReason::Refused {
                message: "x".into(),
            },
            StopReason::Failed {
                message: "y".into(),
            },
        ] {
            round_trip(TurnResult {
                stop,
                tool_calls: 1,
                input_tokens: 2,
                output_tokens: 3,
            });
        }
        assert!(
            serde_json::from_str::<AgentEvent>(r#"{"type":"text","text":"a","x":1}"#).is_err(),
            "unknown fields are refused"
        );
    }

    #[test]
    fn cutting_keeps_whole_characters() {
        assert_eq!(cut("abc", 3), ("abc".into(), false));
        assert_eq!(cut("aé", 2), ("a".into(), true));
        assert_eq!(cut("", 0), (String::new(), false));
    }
}
