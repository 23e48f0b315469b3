//! The messages exchanged over QUIC, as internally tagged serde enums.
//!
//! A connection speaks ALPN [`ALPN`] (the major version is in the ALPN, so a peer of another major
//! version fails the TLS handshake with a clear ALPN error). Its first bidirectional stream, opened
//! by the connecting side, carries [`Message::Hello`], answered by [`Message::Welcome`] or
//! [`Message::Refused`]. After that every request has its own bidirectional stream: agents open
//! streams toward the server for calls; the server opens streams toward an attached client to run
//! tools in its folders. Each message is JSON in frames ([`crate::frame`]). Cancelling a request
//! is resetting its stream.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ToolError;
use crate::tools::ToolName;

/// The ALPN protocol id; its suffix is the protocol's major version.
pub const ALPN: &[u8] = b"monad/1";
/// Major version, also in [`ALPN`]: peers with another major version cannot talk.
pub const PROTOCOL_MAJOR: u32 = 1;
/// Minor version: additions that older peers can ignore. The lower of the two is used.
pub const PROTOCOL_MINOR: u32 = 0;

/// The minor version both sides speak: the lower of the two.
#[allow(clippy::unnecessary_min_or_max)] // PROTOCOL_MINOR is 0 today; it will not stay so
pub fn negotiate_minor(peer: u32) -> u32 {
    peer.min(PROTOCOL_MINOR)
}

/// What the connecting side is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// A laptop attaching folders (`monad-client attach`).
    Client,
    /// Something that calls tools (`monad-client call`, `mcp`, an agent host).
    Agent,
}

/// How much a workspace is trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trust {
    /// Tools run at once.
    Full,
    /// Each action waits for the client user's decision.
    Restricted,
}

impl Trust {
    /// `full` or `restricted`.
    pub fn as_str(self) -> &'static str {
        match self {
            Trust::Full => "full",
            Trust::Restricted => "restricted",
        }
    }
}

/// Where a workspace lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Host {
    /// On the server (the primary workspace).
    Server,
    /// On an attached client machine.
    Client,
}

/// A workspace as agents and users see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceInfo {
    /// Short name, unique in the session (`primary`, or the attached folder's name).
    pub name: String,
    /// URI: `server:/sessions/<id>` or `<client-name>:<path as the user gave it>`.
    pub uri: String,
    /// Trust level.
    pub trust: Trust,
    /// Where it lives.
    pub host: Host,
    /// False while an attached workspace's client is disconnected.
    pub online: bool,
    /// The tools it offers.
    pub tools: Vec<ToolName>,
}

/// A session as listed to its owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionInfo {
    /// `default` or a UUID.
    pub id: String,
    /// The owning user.
    pub owner: String,
    /// Creation time, RFC 3339.
    pub created_at: String,
    /// Its workspaces, primary first, then attached in attach order.
    pub workspaces: Vec<WorkspaceInfo>,
}

/// Which workspace ran a call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceRef {
    /// Short name.
    pub name: String,
    /// URI.
    pub uri: String,
}

/// How a tool call ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
pub enum Outcome {
    /// The tool's JSON result.
    Ok {
        /// The result, as the tool's result type serializes.
        result: Value,
    },
    /// The tool failed; `error.code` says how.
    Error {
        /// What went wrong.
        error: ToolError,
    },
}

/// Every message of the protocol. The `type` field names the variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Message {
    /// First message of a connection, from the connecting side.
    Hello {
        /// The sender's major version (must equal [`PROTOCOL_MAJOR`]).
        protocol: u32,
        /// The sender's minor version.
        minor: u32,
        /// What the sender is.
        role: Role,
        /// The bearer token (`monad-server token create`).
        token: String,
        /// The sender's stable device id.
        device_id: String,
        /// The sender's machine name, used in workspace URIs.
        client_name: String,
        /// Optional features the sender understands.
        #[serde(default)]
        capabilities: Vec<String>,
    },
    /// The server accepts the connection.
    Welcome {
        /// The major version in use.
        protocol: u32,
        /// The minor version in use (the lower of both sides').
        minor: u32,
        /// The user the token belongs to.
        user: String,
        /// The server's name and version.
        server: String,
    },
    /// The server refuses the connection; it closes it after this message.
    Refused {
        /// Why (`unauthorized`, `unsupported`, `malformed`).
        error: ToolError,
    },

    /// Agent to server: run a tool in a session.
    Call {
        /// Request id, echoed in the answer.
        id: u64,
        /// The session; default: the device's bound session, else `default`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
        /// Tool name (see [`ToolName`]).
        tool: String,
        /// The tool's arguments, including the optional `workspace`.
        args: Value,
    },
    /// While a call waits (for approval, for a slow client): a line for the caller.
    Progress {
        /// The request id.
        id: u64,
        /// What is happening.
        message: String,
    },
    /// The answer to [`Message::Call`] and to [`Message::Run`].
    Result {
        /// The request id.
        id: u64,
        /// The workspace that ran the call (absent when none was reached).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        workspace: Option<WorkspaceRef>,
        /// How it ended.
        outcome: Outcome,
    },
    /// Agent to server: the user's sessions.
    ListSessions {
        /// Request id.
        id: u64,
    },
    /// The answer to [`Message::ListSessions`].
    Sessions {
        /// The request id.
        id: u64,
        /// The sessions the user owns.
        sessions: Vec<SessionInfo>,
    },
    /// Agent to server: the workspaces of a session.
    ListWorkspaces {
        /// Request id.
        id: u64,
        /// The session; default: the device's bound session, else `default`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
    },
    /// Agent to server: the workspaces of a session now and after every change (a folder
    /// attached, detached, gone offline). The server answers with [`Message::Workspaces`] at
    /// once and again on each change, until the agent closes the stream.
    Watch {
        /// Request id.
        id: u64,
        /// The session; default: the device's bound session, else `default`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
    },
    /// The answer to [`Message::ListWorkspaces`], and each update of a [`Message::Watch`].
    Workspaces {
        /// The request id.
        id: u64,
        /// The session (its id resolved).
        session: String,
        /// Primary first, then attached in attach order.
        workspaces: Vec<WorkspaceInfo>,
    },
    /// A request failed as a whole (bad session, malformed request).
    Error {
        /// The request id (0 when it could not be read).
        id: u64,
        /// What went wrong.
        error: ToolError,
    },

    /// Client to server: attach a folder to a session. The stream stays open for as long as the
    /// folder is attached; finishing or resetting it detaches.
    Attach {
        /// Request id; the server names the attachment by it in [`Message::Run`].
        id: u64,
        /// The session; default: the device's bound session, else `default`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
        /// Short name wanted; default: the folder's base name.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// The folder as the user gave it (for the URI; the server never opens it).
        path: String,
        /// Trust level the user chose.
        trust: Trust,
        /// The tools the client offers for this folder.
        tools: Vec<ToolName>,
    },
    /// The server accepted an attachment.
    Attached {
        /// The request id of the [`Message::Attach`].
        id: u64,
        /// The session it joined.
        session: String,
        /// The workspace as the session now lists it.
        workspace: WorkspaceInfo,
    },
    /// Server to client: run a tool in an attached folder.
    Run {
        /// Request id.
        id: u64,
        /// The attachment (the id of its [`Message::Attach`]).
        attachment: u64,
        /// The session the call comes from.
        session: String,
        /// The tool.
        tool: ToolName,
        /// Its arguments.
        args: Value,
    },
    /// Server to client: does this path exist in the attached folder? Used for routing only;
    /// answered without a prompt, since it reveals only existence.
    Probe {
        /// Request id.
        id: u64,
        /// The attachment.
        attachment: u64,
        /// The path, as the tool call gave it.
        path: String,
    },
    /// The answer to [`Message::Probe`].
    Probed {
        /// The request id.
        id: u64,
        /// True when the path exists inside the folder.
        exists: bool,
    },
}

impl Message {
    /// Encodes the message as JSON (the payload that [`crate::frame::frames`] cuts up).
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("messages always serialize")
    }

    /// Decodes a message from JSON.
    pub fn from_json(bytes: &[u8]) -> Result<Message, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// The variant's wire name, for logs and errors.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "hello",
            Message::Welcome { .. } => "welcome",
            Message::Refused { .. } => "refused",
            Message::Call { .. } => "call",
            Message::Progress { .. } => "progress",
            Message::Result { .. } => "result",
            Message::ListSessions { .. } => "list_sessions",
            Message::Sessions { .. } => "sessions",
            Message::ListWorkspaces { .. } => "list_workspaces",
            Message::Watch { .. } => "watch",
            Message::Workspaces { .. } => "workspaces",
            Message::Error { .. } => "error",
            Message::Attach { .. } => "attach",
            Message::Attached { .. } => "attached",
            Message::Run { .. } => "run",
            Message::Probe { .. } => "probe",
            Message::Probed { .. } => "probed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
    use serde_json::json;

    fn workspace() -> WorkspaceInfo {
        WorkspaceInfo {
            name: "monad".into(),
            uri: "macbook:~/dev/monad".into(),
            trust: Trust::Restricted,
            host: Host::Client,
            online: true,
            tools: ToolName::WORKSPACE_TOOLS.to_vec(),
        }
    }

    fn every_message() -> Vec<Message> {
        vec![
            Message::Hello {
                protocol: PROTOCOL_MAJOR,
                minor: PROTOCOL_MINOR,
                role: Role::Client,
                token: "t".into(),
                device_id: "d".into(),
                client_name: "macbook".into(),
                capabilities: vec!["progress".into()],
            },
            Message::Welcome {
                protocol: 1,
                minor: 0,
                user: "ana".into(),
                server: "monad-server 0.1.0".into(),
            },
            Message::Refused {
                error: ToolError::new(ErrorCode::Unauthorized, "bad token"),
            },
            Message::Call {
                id: 7,
                session: Some("default".into()),
                tool: "read_file".into(),
                args: json!({"path": "a"}),
            },
            Message::Progress {
                id: 7,
                message: "waiting for approval".into(),
            },
            Message::Result {
                id: 7,
                workspace: Some(WorkspaceRef {
                    name: "primary".into(),
                    uri: "server:/sessions/default".into(),
                }),
                outcome: Outcome::Ok {
                    result: json!({"content": "x"}),
                },
            },
            Message::Result {
                id: 8,
                workspace: None,
                outcome: Outcome::Error {
                    error: ToolError::new(ErrorCode::NotFound, "nope"),
                },
            },
            Message::ListSessions { id: 1 },
            Message::Sessions {
                id: 1,
                sessions: vec![SessionInfo {
                    id: "default".into(),
                    owner: "ana".into(),
                    created_at: "2026-11-26T00:00:00Z".into(),
                    workspaces: vec![workspace()],
                }],
            },
            Message::ListWorkspaces {
                id: 4,
                session: None,
            },
            Message::Watch {
                id: 5,
                session: Some("default".into()),
            },
            Message::Workspaces {
                id: 4,
                session: "default".into(),
                workspaces: vec![workspace()],
            },
            Message::Error {
                id: 0,
                error: ToolError::new(ErrorCode::Malformed, "x"),
            },
            Message::Attach {
                id: 3,
                session: None,
                name: Some("monad".into()),
                path: "~/dev/monad".into(),
                trust: Trust::Restricted,
                tools: vec![ToolName::ReadFile],
            },
            Message::Attached {
                id: 3,
                session: "default".into(),
                workspace: workspace(),
            },
            Message::Run {
                id: 9,
                attachment: 3,
                session: "default".into(),
                tool: ToolName::EditFile,
                args: json!({"path": "a", "old_string": "x", "new_string": "y"}),
            },
            Message::Probe {
                id: 10,
                attachment: 3,
                path: "src/lib.rs".into(),
            },
            Message::Probed {
                id: 10,
                exists: true,
            },
        ]
    }

    #[test]
    fn every_message_round_trips() {
        let all = every_message();
        let kinds: std::collections::HashSet<&str> = all.iter().map(Message::kind).collect();
        assert_eq!(kinds.len(), 17, "one case per message type");
        for message in all {
            let bytes = message.to_json();
            let back = Message::from_json(&bytes).unwrap();
            assert_eq!(back, message);
            let value: Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(value["type"], message.kind());
        }
    }

    #[test]
    fn unknown_types_and_fields_are_refused() {
        assert!(Message::from_json(br#"{"type":"launch_missiles","id":1}"#).is_err());
        assert!(Message::from_json(br#"{"type":"list_sessions","id":1,"extra":true}"#).is_err());
        assert!(Message::from_json(br#"{"type":"list_sessions"}"#).is_err());
        assert!(Message::from_json(b"not json").is_err());
    }
}
