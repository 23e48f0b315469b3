//! Wire errors: a stable code and a human sentence, separate from any crate's internal errors.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The stable, machine-readable kind of a failed tool call or request.
///
/// Codes are part of the protocol: scripts and agents match on them, so a code is never renamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The arguments do not fit the tool's schema or make no sense together.
    InvalidArguments,
    /// No workspace of the session has the name or URI the call gave.
    WorkspaceNotFound,
    /// The file or directory named does not exist, or no workspace could serve the call.
    NotFound,
    /// The path leads outside the workspace root (`..`, an absolute path, a symbolic link, a magic
    /// link) or names something the jail never opens (a device, a FIFO, a socket).
    OutsideWorkspace,
    /// The path exists but is the wrong kind of thing (a directory where a file was expected, ...).
    WrongFileType,
    /// The target already exists and the call would not replace it.
    AlreadyExists,
    /// `edit_file` found `old_string` zero times, or more than once without `replace_all`.
    NoMatch,
    /// The user, or a policy, refused the call.
    Denied,
    /// The workspace's client went away while the call ran.
    WorkspaceDisconnected,
    /// A hard limit was hit in a way that cannot be answered with a truncated result.
    LimitExceeded,
    /// The command did not finish in its time limit.
    Timeout,
    /// Commands cannot run here because the kernel cannot sandbox them and the operator did not
    /// allow unsandboxed execution.
    SandboxUnavailable,
    /// The operating system refused or failed the operation.
    Io,
    /// The token is missing, unknown or revoked, or the session belongs to another user.
    Unauthorized,
    /// The peer speaks a protocol version or feature this side does not.
    Unsupported,
    /// A message could not be read: bad framing, bad JSON, an unknown type, an oversized frame.
    Malformed,
    /// The caller cancelled the request.
    Cancelled,
    /// A bug or an unexpected state on the side that answered.
    Internal,
}

impl ErrorCode {
    /// The code as it appears on the wire (`snake_case`).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArguments => "invalid_arguments",
            ErrorCode::WorkspaceNotFound => "workspace_not_found",
            ErrorCode::NotFound => "not_found",
            ErrorCode::OutsideWorkspace => "outside_workspace",
            ErrorCode::WrongFileType => "wrong_file_type",
            ErrorCode::AlreadyExists => "already_exists",
            ErrorCode::NoMatch => "no_match",
            ErrorCode::Denied => "denied",
            ErrorCode::WorkspaceDisconnected => "workspace_disconnected",
            ErrorCode::LimitExceeded => "limit_exceeded",
            ErrorCode::Timeout => "timeout",
            ErrorCode::SandboxUnavailable => "sandbox_unavailable",
            ErrorCode::Io => "io",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Unsupported => "unsupported",
            ErrorCode::Malformed => "malformed",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::Internal => "internal",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed tool call as it travels: a code to match on and a sentence to show a person or a model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolError {
    /// What kind of failure this is.
    pub code: ErrorCode,
    /// One sentence saying what went wrong and, where there is one, what to do about it.
    pub message: String,
}

impl ToolError {
    /// A new error with the given code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ToolError {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ToolError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_serializes_as_its_as_str() {
        let all = [
            ErrorCode::InvalidArguments,
            ErrorCode::WorkspaceNotFound,
            ErrorCode::NotFound,
            ErrorCode::OutsideWorkspace,
            ErrorCode::WrongFileType,
            ErrorCode::AlreadyExists,
            ErrorCode::NoMatch,
            ErrorCode::Denied,
            ErrorCode::WorkspaceDisconnected,
            ErrorCode::LimitExceeded,
            ErrorCode::Timeout,
            ErrorCode::SandboxUnavailable,
            ErrorCode::Io,
            ErrorCode::Unauthorized,
            ErrorCode::Unsupported,
            ErrorCode::Malformed,
            ErrorCode::Cancelled,
            ErrorCode::Internal,
        ];
        for code in all {
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            let back: ErrorCode = serde_json::from_str(&json).unwrap();
            assert_eq!(back, code);
        }
    }

    #[test]
    fn tool_error_round_trips_and_refuses_unknown_fields() {
        let err = ToolError::new(ErrorCode::NoMatch, "old_string not found");
        let json = serde_json::to_value(&err).unwrap();
        assert_eq!(json["code"], "no_match");
        assert_eq!(serde_json::from_value::<ToolError>(json).unwrap(), err);
        let bad = serde_json::json!({"code": "io", "message": "x", "extra": 1});
        assert!(serde_json::from_value::<ToolError>(bad).is_err());
    }
}
