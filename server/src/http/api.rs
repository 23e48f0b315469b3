//! `/api/v1`: the workspace service of seed 004 and the sessions, as JSON with seed 004's field
//! names (camelCase). Every handler authenticates with the bearer token ([`ApiUser`]), checks
//! ownership first (another user's anything is a `404`), validates the whole input before it
//! writes anything, and does its store work on the blocking pool.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State as Shared};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::signin::{ApiUser, Credential};
use super::{
    BodyNotRead, HttpError, Web, blocking_held, owned_record, owned_session, page_limit, user_slot,
};
use crate::feed::{Event, Phase};
use crate::fsutil::now_rfc3339;
use crate::quota::Held;
use crate::server::State;
use crate::state::{NotHeld, over_call_memory};
use crate::store::{
    ArtifactKind, ArtifactMeta, AuditRecord, History, HistoryMessage, RecordRoom, Role, StoreError,
    Upload, WorkspaceRecord,
};

/// The largest request body accepted (an artifact of 16 MiB, base64-encoded, with room).
pub const MAX_BODY: usize = 24 * 1024 * 1024;

/// Artifact uploads read and decoded at once, over all users: a bound on the memory they take
/// (a body is held, then decoded from JSON and base64: a few times [`MAX_BODY`] at the peak).
pub const UPLOADS_AT_ONCE: usize = 4;
/// The longest id, name or time string accepted in a request.
pub const MAX_FIELD: usize = 1024;
/// The device id that workspace records created through the API carry.
pub const API_DEVICE: &str = "http";

/// The API's routes.
pub fn routes() -> Router<Arc<Web>> {
    Router::new()
        .route("/api/v1/openapi.json", get(openapi))
        .route("/api/v1/workspaces", axum::routing::post(create_workspace))
        .route(
            "/api/v1/workspaces/{id}",
            get(get_workspace).delete(delete_workspace),
        )
        .route(
            "/api/v1/workspaces/{id}/artifacts",
            axum::routing::post(upload_artifact),
        )
        .route(
            "/api/v1/workspaces/{id}/artifacts/{artifact}",
            get(workspace_artifact),
        )
        .route("/api/v1/workspaces/{id}/sessions", get(workspace_sessions))
        .route("/api/v1/sessions", get(list_sessions))
        .route("/api/v1/sessions/{id}", get(get_session))
        .route("/api/v1/sessions/{id}/history", get(session_history))
        .route("/api/v1/sessions/{id}/artifacts", get(session_artifacts))
        .route(
            "/api/v1/sessions/{id}/artifacts/{artifact}",
            get(session_artifact),
        )
        .route("/api/v1/sessions/{id}/audit", get(session_audit))
        .route("/api/v1/sessions/{id}/events", get(session_events))
        .route("/api/v1", axum::routing::any(unknown))
        .route("/api/v1/{*rest}", axum::routing::any(unknown))
        .layer(axum::middleware::map_response(errors_in_json))
}

/// The refusals axum makes itself (a method a path does not take, a path that does not decode)
/// as the API's JSON errors; every other answer as it is.
async fn errors_in_json(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes().starts_with(b"application/json"));
    if is_json || !status.is_client_error() {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    // axum's own messages are one short line; anything longer is cut.
    let said = axum::body::to_bytes(body, 4096).await.unwrap_or_default();
    let said = String::from_utf8_lossy(&said);
    let (code, message) = if status == StatusCode::METHOD_NOT_ALLOWED {
        // axum adds the `Allow` header around this layer, after it.
        (
            "method_not_allowed".to_owned(),
            "this API path does not take that method; the `Allow` header says which it takes"
                .to_owned(),
        )
    } else if status == StatusCode::BAD_REQUEST {
        (
            "bad_request".to_owned(),
            format!("the path is not valid: {said}"),
        )
    } else {
        let reason = status.canonical_reason().unwrap_or("refused");
        (
            reason.to_lowercase().replace(' ', "_"),
            format!("{reason}: {said}"),
        )
    };
    let body = serde_json::to_vec(&super::ErrorBody {
        error: code,
        message,
    })
    .unwrap_or_default();
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body))
}

async fn unknown() -> HttpError {
    HttpError::not_found("this API path")
}

// ---------------------------------------------------------------------------------------------
// Types: requests and responses, the OpenAPI document's schemas.

/// `workspaceScope`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WorkspaceScope {
    /// A project directory on the user's machine: one record per (user, `localPath`), reused
    /// by every session in it (the record of a folder attached over QUIC is the same).
    Local,
    /// No project directory: a new workspace every time, holding one session.
    General,
}

impl WorkspaceScope {
    /// The scope of a record: `general` records have no folder (an empty path); every local
    /// record has one, since a folder is attached or created by its path.
    pub fn of(record: &WorkspaceRecord) -> WorkspaceScope {
        if record.path.is_empty() {
            WorkspaceScope::General
        } else {
            WorkspaceScope::Local
        }
    }
}

/// `POST /api/v1/workspaces`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateWorkspace {
    /// `local` or `general`.
    pub workspace_scope: WorkspaceScope,
    /// The project directory, for `local` (required there, refused for `general`).
    #[serde(default)]
    pub local_path: Option<String>,
    /// Accepted for seed 004's shape; this server has one tenant.
    #[serde(default)]
    pub tenant_id: Option<String>,
    /// When given, must be the token's own user.
    #[serde(default)]
    pub user_id: Option<String>,
}

/// The answer to `POST /api/v1/workspaces`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceCreated {
    /// The workspace's id.
    pub workspace_id: String,
    /// Its scope.
    pub workspace_scope: WorkspaceScope,
    /// When it was created, RFC 3339.
    pub created_at: String,
}

/// A workspace (`GET /api/v1/workspaces/{id}`).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceView {
    /// The workspace's id.
    pub workspace_id: String,
    /// Its scope.
    pub workspace_scope: WorkspaceScope,
    /// The owner.
    pub user_id: String,
    /// The project directory (`local` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_path: Option<String>,
    /// Its URI when a client attached it (`<client>:<path>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    /// Created, RFC 3339.
    pub created_at: String,
    /// Last upload or tool call in it, RFC 3339.
    pub last_active_at: String,
}

impl WorkspaceView {
    fn of(record: &WorkspaceRecord) -> WorkspaceView {
        let scope = WorkspaceScope::of(record);
        WorkspaceView {
            workspace_id: record.id.clone(),
            workspace_scope: scope,
            user_id: record.user.clone(),
            local_path: (scope == WorkspaceScope::Local).then(|| record.path.clone()),
            uri: (record.device_id != API_DEVICE && scope == WorkspaceScope::Local)
                .then(|| record.uri.clone()),
            created_at: record.created_at.clone(),
            last_active_at: record.last_active.clone(),
        }
    }
}

/// `POST /api/v1/workspaces/{id}/artifacts`: one of three bodies, told apart by
/// `artifactType`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(tag = "artifactType", rename_all = "snake_case")]
pub enum UploadArtifact {
    /// The output of a tool call.
    ToolOutput(FileArtifact),
    /// The diff of a file write or edit.
    FileDiff(FileArtifact),
    /// The session's conversation after a task; replaces the session's previous snapshot.
    SessionHistory(HistorySnapshot),
}

/// A `tool_output` or `file_diff` upload.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileArtifact {
    /// The session (`default` or a UUID); made on first use, as when a client opens it.
    pub session_id: String,
    /// The task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// The step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_id: Option<String>,
    /// Its name (a file name).
    pub artifact_name: String,
    /// Its media type, served back with it.
    pub content_type: String,
    /// The content, base64 (standard alphabet, padded).
    pub content_base64: String,
    /// Anything else the uploader keeps with it (an object).
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
}

/// A `session_history` upload: the whole conversation after a task.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HistorySnapshot {
    /// The session (`default` or a UUID).
    pub session_id: String,
    /// The task after which it was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_after_task_id: Option<String>,
    /// When it was taken, RFC 3339.
    pub snapshot_at: String,
    /// The conversation, oldest first.
    pub messages: Vec<SnapshotMessage>,
}

/// One message of a snapshot.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotMessage {
    /// Its id, as the uploader numbered it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// Who said it.
    pub role: MessageRole,
    /// What was said (Markdown).
    pub content: String,
    /// When, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
}

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MessageRole {
    /// The system prompt.
    System,
    /// The person.
    User,
    /// The model.
    Assistant,
}

impl MessageRole {
    fn of(role: Role) -> MessageRole {
        match role {
            Role::System => MessageRole::System,
            Role::User => MessageRole::User,
            Role::Assistant => MessageRole::Assistant,
        }
    }

    fn role(self) -> Role {
        match self {
            MessageRole::System => Role::System,
            MessageRole::User => Role::User,
            MessageRole::Assistant => Role::Assistant,
        }
    }
}

/// The answer to an upload.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactCreated {
    /// The artifact's id (a session's history snapshot keeps one id across uploads).
    pub artifact_id: String,
    /// `workspaces/{workspaceId}/artifacts/{artifactId}`.
    pub artifact_uri: String,
}

/// A session in a listing.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionSummary {
    /// `default` or a UUID.
    pub session_id: String,
    /// Its name, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Created (in a workspace listing: first used in the workspace), RFC 3339.
    pub created_at: String,
    /// Last activity (in a workspace listing: in the workspace), RFC 3339.
    pub last_task_at: String,
    /// Tasks: tool calls of the session (in a workspace listing: tool calls run in the
    /// workspace plus history snapshots uploaded to it, one per finished task).
    pub task_count: u64,
}

/// A page of sessions.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionsPage {
    /// Most recent activity first.
    pub sessions: Vec<SessionSummary>,
    /// The next page's token; only when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_token: Option<String>,
}

/// A workspace of a session.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionWorkspace {
    /// Short name (`primary`, or an attached folder's).
    pub name: String,
    /// URI.
    pub uri: String,
    /// `full` or `restricted`.
    pub trust: String,
    /// `server` or `client`.
    pub host: String,
    /// Whether its client is connected now (always true for the primary).
    pub online: bool,
}

/// A session (`GET /api/v1/sessions/{id}`).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionView {
    /// `default` or a UUID.
    pub session_id: String,
    /// Its name, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Created, RFC 3339.
    pub created_at: String,
    /// Last activity, RFC 3339.
    pub last_task_at: String,
    /// Tool calls recorded.
    pub task_count: u64,
    /// Model provider, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Model, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Its workspaces now: the primary, and the attached folders while it is loaded.
    pub workspaces: Vec<SessionWorkspace>,
    /// The workspace records (attached folders, API workspaces) it was used in.
    pub workspace_ids: Vec<String>,
}

/// A session's conversation (`GET /api/v1/sessions/{id}/history`), from `session.md`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistoryView {
    /// The session.
    pub session_id: String,
    /// Model provider, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Model, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Created, RFC 3339.
    pub created_at: String,
    /// Oldest first; `messageId` is the message's position (`msg_001`, ...).
    pub messages: Vec<SnapshotMessage>,
}

/// An artifact's metadata.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactView {
    /// Its id.
    pub artifact_id: String,
    /// `tool_output`, `file_diff` or `session_history`.
    pub artifact_type: String,
    /// The session.
    pub session_id: String,
    /// Its name, when uploaded with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_name: Option<String>,
    /// Media type.
    pub content_type: String,
    /// Bytes stored.
    pub size: u64,
    /// True when cut at the server's artifact cap.
    pub truncated: bool,
    /// Stored, RFC 3339.
    pub created_at: String,
    /// The workspace record it was uploaded to (API uploads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_id: Option<String>,
    /// The workspace (short name) whose tool call made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// The tool that made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The call that made it (matches the audit record's `callId`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// The task (API uploads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// The step (API uploads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_id: Option<String>,
    /// The uploader's metadata.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
    /// In an event: its metadata was left out, being past 4 KiB as JSON (the session's
    /// listing of artifacts has it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub metadata_left_out: bool,
}

/// A page of a session's artifacts.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactList {
    /// Oldest first.
    pub artifacts: Vec<ArtifactView>,
    /// How many artifacts the session has in all.
    pub total: u64,
    /// The next page's token; only when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_token: Option<String>,
}

/// One tool call of the audit log.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    /// When it started, RFC 3339.
    pub time: String,
    /// Its id (its artifacts carry it too).
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// The workspace that ran it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// The path, pattern or command line.
    pub target: String,
    /// `allowed`, `denied`, `timeout`, `cancelled` or `none`.
    pub decision: String,
    /// Who decided: `trust`, `policy`, `user`, `timeout`, `no_terminal`, `server`, ...
    pub decided_by: String,
    /// `ok` or an error code.
    pub outcome: String,
    /// Wall time in milliseconds.
    pub duration_ms: u64,
}

impl AuditEntry {
    /// The API's view of an audit record.
    pub fn of(r: &AuditRecord) -> AuditEntry {
        AuditEntry {
            time: r.time.clone(),
            call_id: r.call_id.clone(),
            tool: r.tool.clone(),
            workspace: r.workspace.clone(),
            target: r.target.clone(),
            decision: r.decision.as_str().to_owned(),
            decided_by: r.decided_by.as_str().to_owned(),
            outcome: r.outcome.as_str().to_owned(),
            duration_ms: r.duration_ms,
        }
    }
}

/// A page of the audit log.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditPage {
    /// Oldest first.
    pub records: Vec<AuditEntry>,
    /// How many records the log has in all.
    pub total: u64,
    /// The next page's token; only when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_token: Option<String>,
}

/// A tool call in progress (`call_started`, `call_waiting`, `call_decided`, `call_ended`).
/// Its record comes as a `call` event once written: the one with the same `time`, `tool` and
/// `target`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CallProgress {
    /// The call's number while it runs (the same in each of its events; not its `callId`,
    /// which its record gets).
    pub live_id: u64,
    /// The tool.
    pub tool: String,
    /// When it started, RFC 3339: its record's `time`. Absent when nobody followed the session
    /// as the call started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    /// What it acts on, as in its record's `target`. Absent as `time` is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// The workspace it was routed to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// That workspace's URI (`<device>:<path>` for an attached folder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    /// Who decided (`call_decided` on): `trust`, `policy`, `user`, `timeout`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    /// Whether it was allowed to run (`call_decided` on; absent when nobody could say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed: Option<bool>,
}

impl CallProgress {
    fn of(p: &crate::feed::Progress) -> CallProgress {
        CallProgress {
            live_id: p.live_id,
            tool: p.tool.to_owned(),
            time: p.time.clone(),
            target: p.target.clone(),
            workspace: p.workspace.clone(),
            uri: p.uri.clone(),
            decided_by: p.decided_by.map(|d| d.as_str().to_owned()),
            allowed: p.allowed,
        }
    }
}

/// A message appended to the conversation, as its event carries it.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventMessage {
    /// Who said it.
    pub role: MessageRole,
    /// What was said (Markdown), at most its first 16 KiB.
    pub content: String,
    /// Bytes of `content` cut off after its first 16 KiB, when it was longer: the session's
    /// conversation (`GET /api/v1/sessions/{id}/history`) has it whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_left_out: Option<u64>,
}

/// An event of `GET /api/v1/sessions/{id}/events` (the SSE event name is `type`).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SessionEvent {
    /// Sent first: the stream is following the session.
    Ready {
        /// The session.
        #[serde(rename = "sessionId")]
        session_id: String,
    },
    /// A tool call started: routed to a workspace, where it runs (a folder's client may still
    /// have to decide: see `call_waiting`).
    CallStarted(CallProgress),
    /// A tool call was sent to an attached folder's client, which decides whether it runs; it
    /// waits for its owner's approval when the folder is restricted and its policy does not
    /// allow it already.
    CallWaiting(CallProgress),
    /// A tool call was decided: it runs, or was refused (`allowed`).
    CallDecided(CallProgress),
    /// A tool call ended; its `call` record follows once written.
    CallEnded(CallProgress),
    /// A tool call ended or was refused: its record.
    Call(AuditEntry),
    /// A message was appended to the conversation.
    Message(EventMessage),
    /// The conversation was replaced (a snapshot upload, a clear).
    History {
        /// The session.
        #[serde(rename = "sessionId")]
        session_id: String,
    },
    /// An artifact was stored.
    Artifact(ArtifactView),
    /// The stream fell behind and missed this many events; read the log again.
    Lagged {
        /// Events missed.
        missed: u64,
    },
}

impl SessionEvent {
    fn of(session: &str, event: Event) -> SessionEvent {
        match event {
            Event::Call { record } => SessionEvent::Call(AuditEntry::of(&record)),
            Event::Message { message, left_out } => SessionEvent::Message(EventMessage {
                role: MessageRole::of(message.role),
                content: message.text,
                content_left_out: (left_out > 0).then_some(left_out as u64),
            }),
            Event::History => SessionEvent::History {
                session_id: session.to_owned(),
            },
            Event::Artifact {
                meta,
                metadata_left_out,
            } => SessionEvent::Artifact(ArtifactView {
                metadata_left_out,
                ..artifact_view(&meta)
            }),
            Event::Progress { call } => {
                let progress = CallProgress::of(&call);
                match call.phase {
                    Phase::Started => SessionEvent::CallStarted(progress),
                    Phase::Waiting => SessionEvent::CallWaiting(progress),
                    Phase::Decided => SessionEvent::CallDecided(progress),
                    Phase::Ended => SessionEvent::CallEnded(progress),
                }
            }
        }
    }

    /// The SSE event name.
    pub fn name(&self) -> &'static str {
        match self {
            SessionEvent::Ready { .. } => "ready",
            SessionEvent::CallStarted(_) => "call_started",
            SessionEvent::CallWaiting(_) => "call_waiting",
            SessionEvent::CallDecided(_) => "call_decided",
            SessionEvent::CallEnded(_) => "call_ended",
            SessionEvent::Call(_) => "call",
            SessionEvent::Message(_) => "message",
            SessionEvent::History { .. } => "history",
            SessionEvent::Artifact(_) => "artifact",
            SessionEvent::Lagged { .. } => "lagged",
        }
    }
}

/// Query of a paged listing.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PageQuery {
    /// 1 to 100, default 20.
    pub limit: Option<String>,
    /// The token of the previous page.
    pub next_token: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// Helpers.

/// An artifact's public id: the session and its id in the session, so that a workspace's
/// artifact is found without another index (`<session>.<artifact>`).
pub fn public_id(meta: &ArtifactMeta) -> String {
    format!("{}.{}", meta.session, meta.id)
}

/// The session and artifact ids a public id names.
fn parse_public_id(id: &str) -> Option<(&str, &str)> {
    id.split_once('.')
}

/// The API's view of an artifact's metadata.
pub fn artifact_view(meta: &ArtifactMeta) -> ArtifactView {
    let upload = meta.upload.as_deref();
    ArtifactView {
        artifact_id: public_id(meta),
        artifact_type: meta.kind.as_str().to_owned(),
        session_id: meta.session.clone(),
        artifact_name: upload.and_then(|u| u.name.clone()),
        content_type: meta.content_type.clone(),
        size: meta.size,
        truncated: meta.truncated,
        created_at: meta.created_at.clone(),
        workspace_id: upload.map(|u| u.workspace_id.clone()),
        workspace: meta.workspace.clone(),
        tool: meta.tool.clone(),
        call_id: meta.call_id.clone(),
        task_id: upload.and_then(|u| u.task_id.clone()),
        step_id: upload.and_then(|u| u.step_id.clone()),
        metadata: upload.map(|u| u.metadata.clone()).unwrap_or_default(),
        metadata_left_out: false,
    }
}

/// A tool error from the registry as an HTTP answer.
fn tool_error(e: monad_protocol::ToolError) -> HttpError {
    use monad_protocol::ErrorCode;
    match e.code {
        ErrorCode::InvalidArguments | ErrorCode::Malformed => HttpError::bad(e.message),
        ErrorCode::NotFound | ErrorCode::Unauthorized | ErrorCode::Denied => {
            HttpError::not_found("session")
        }
        ErrorCode::LimitExceeded => HttpError {
            status: StatusCode::TOO_MANY_REQUESTS,
            code: "limit_exceeded",
            message: e.message,
        },
        _ => HttpError::internal(e.message),
    }
}

/// A text field of a request: at most [`MAX_FIELD`] bytes, no control characters.
fn field(name: &str, value: &str) -> Result<(), HttpError> {
    if value.len() > MAX_FIELD {
        return Err(HttpError::bad(format!(
            "`{name}` is longer than {MAX_FIELD} bytes"
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(HttpError::bad(format!(
            "`{name}` holds a control character"
        )));
    }
    Ok(())
}

/// A required, non-empty text field.
fn required(name: &str, value: &str) -> Result<(), HttpError> {
    if value.trim().is_empty() {
        return Err(HttpError::bad(format!("`{name}` is empty")));
    }
    field(name, value)
}

/// A JSON body of at most [`MAX_BODY`] bytes, read as `T`: a body over the limit, or one that
/// is not `T`, is a `400` saying so. The body and the tree it becomes count in `user`'s call
/// memory (`server.max_call_bytes_per_user`, `429` past it; counted before the tree is made, a
/// body of more values than any request takes is a `400`) for as long as the returned count is
/// kept: until the handler has answered.
async fn json_body<T: serde::de::DeserializeOwned>(
    state: &State,
    user: &str,
    body: Body,
) -> Result<(T, Held), HttpError> {
    let (bytes, memory) = body_bytes(state, user, body).await?;
    Ok((parse_body(&bytes)?, memory))
}

/// Reads a request's body whole, counted in `user`'s call memory (the count lasts as long as the
/// [`Held`]); nothing is parsed yet.
async fn body_bytes(
    state: &State,
    user: &str,
    body: Body,
) -> Result<(bytes::Bytes, Held), HttpError> {
    let memory = state.call_bytes.holder(user);
    let bytes = match super::read_body_held(body, MAX_BODY, &memory).await {
        Ok(bytes) => bytes,
        Err(BodyNotRead::TooLarge) => {
            let refused = format!("the body is over {MAX_BODY} bytes, or did not arrive whole");
            return Err(HttpError::bad(refused));
        }
        Err(BodyNotRead::NotHeld(NotHeld::TooManyValues(e))) => {
            return Err(HttpError::bad(format!("the body is refused: {e}")));
        }
        Err(BodyNotRead::NotHeld(NotHeld::OverMemory(error))) => return Err(tool_error(error)),
    };
    Ok((bytes, memory))
}

/// A request's body as JSON of type `T`, or the `400` saying what is wrong with it.
fn parse_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, HttpError> {
    serde_json::from_slice(bytes).map_err(|e| HttpError::bad(format!("the body is not valid: {e}")))
}

fn json<T: Serialize>(status: StatusCode, value: &T) -> Response {
    (status, axum::Json(value)).into_response()
}

fn query(
    q: Result<Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<PageQuery, HttpError> {
    q.map(|Query(q)| q)
        .map_err(|e| HttpError::bad(format!("the query is not valid: {e}")))
}

// ---------------------------------------------------------------------------------------------
// Handlers.

/// The document, made once: it is the same for every request, which needs no sign-in, and
/// making it (every schema of the API) is work a stream of requests would repeat for nothing.
async fn openapi() -> Response {
    static DOCUMENT: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let body = DOCUMENT.get_or_init(|| {
        serde_json::to_vec(&super::openapi::document()).expect("the document serializes")
    });
    (
        StatusCode::OK,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body.as_slice(),
    )
        .into_response()
}

async fn create_workspace(
    Shared(web): Shared<Arc<Web>>,
    ApiUser(user): ApiUser,
    body: Body,
) -> Result<Response, HttpError> {
    let (request, _memory): (CreateWorkspace, _) = json_body(&web.state, &user, body).await?;
    if let Some(claimed) = &request.user_id
        && *claimed != user
    {
        return Err(HttpError::bad(format!(
            "`userId` `{claimed}` is not the user of this token"
        )));
    }
    if let Some(tenant) = &request.tenant_id {
        field("tenantId", tenant)?;
    }
    let path = match (request.workspace_scope, &request.local_path) {
        (WorkspaceScope::Local, Some(path)) => {
            required("localPath", path)?;
            Some(path.clone())
        }
        (WorkspaceScope::Local, None) => {
            return Err(HttpError::bad("a `local` workspace needs `localPath`"));
        }
        (WorkspaceScope::General, Some(_)) => {
            return Err(HttpError::bad("a `general` workspace has no `localPath`"));
        }
        (WorkspaceScope::General, None) => None,
    };
    let state = web.state.clone();
    let slot = user_slot(&web.state, &user).await?;
    let (record, created) = blocking_held(slot, move || create_record(&state, &user, path)).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(json(
        status,
        &WorkspaceCreated {
            workspace_id: record.id.clone(),
            workspace_scope: WorkspaceScope::of(&record),
            created_at: record.created_at,
        },
    ))
}

/// The record of `user`'s `local` folder (the one a client attached, if any, else the API's),
/// or a new `general` one; and whether it was made now.
fn create_record(
    state: &State,
    user: &str,
    path: Option<String>,
) -> Result<(WorkspaceRecord, bool), HttpError> {
    let store = state.registry.store();
    let max = state.config.quotas.max_workspaces_per_user;
    let room = crate::store::record_room(store.as_ref(), user, max, |r| {
        path.as_ref().is_some_and(|path| r.path == *path)
    })
    .map_err(HttpError::store)?;
    let _creating = match room {
        RecordRoom::Known(record) => return Ok((record, false)),
        RecordRoom::Full(count) => {
            return Err(HttpError::quota(format!(
                "user `{user}` has {count} workspaces, the most this server keeps for one user \
                 (server.max_workspaces_per_user = {max}); delete one to make another"
            )));
        }
        RecordRoom::Free(creating) => creating,
    };
    match path {
        Some(path) => {
            let record = store
                .resolve_record(user, API_DEVICE, &path, &format!("{API_DEVICE}:{path}"))
                .map_err(HttpError::store)?;
            Ok((record, true))
        }
        None => {
            let id = uuid::Uuid::new_v4().to_string();
            let now = now_rfc3339();
            let record = WorkspaceRecord {
                id: id.clone(),
                user: user.to_owned(),
                device_id: API_DEVICE.to_owned(),
                path: String::new(),
                uri: format!("general:{id}"),
                created_at: now.clone(),
                last_active: now,
            };
            store.add_record(&record).map_err(HttpError::store)?;
            Ok((record, true))
        }
    }
}

async fn get_workspace(
    Shared(web): Shared<Arc<Web>>,
    ApiUser(user): ApiUser,
    Path(id): Path<String>,
) -> Result<Response, HttpError> {
    let state = web.state.clone();
    let slot = user_slot(&web.state, &user).await?;
    let record = blocking_held(slot, move || owned_record(&state, &user, &id)).await?;
    Ok(json(StatusCode::OK, &WorkspaceView::of(&record)))
}

async fn delete_workspace(
    Shared(web): Shared<Arc<Web>>,
    ApiUser(user): ApiUser,
    Path(id): Path<String>,
) -> Result<Response, HttpError> {
    let state = web.state.clone();
    let storing = STORING.of(&user).lock_owned().await;
    let slot = user_slot(&web.state, &user).await?;
    blocking_held(slot, move || {
        let _storing = storing;
        let record = owned_record(&state, &user, &id)?;
        remove_workspace(&state, &record)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Every session a record lists.
fn record_session_ids(state: &State, record: &str) -> Result<Vec<String>, HttpError> {
    let store = state.registry.store();
    let mut ids = Vec::new();
    let mut next: Option<String> = None;
    loop {
        let page = store
            .record_sessions(record, 100, next.as_deref())
            .map_err(HttpError::store)?;
        ids.extend(page.items.into_iter().map(|s| s.session));
        match page.next {
            Some(n) => next = Some(n),
            None => return Ok(ids),
        }
    }
}

/// A user's, taken by an upload of theirs before it is decoded until its write is done (the
/// quota's check and the write are one step: uploads at once cannot pass it together), and by a
/// delete of one of their workspaces for all of it (an upload to a workspace deleted meanwhile
/// stored its artifact under a record that was gone, unreachable, its bytes still counted).
/// Per user: one lock for every user let one user's delete of a workspace of thousands of
/// sessions hold up every other user's uploads. Taken before the work goes to the blocking
/// pool, so that a wait holds no thread and no decoding turn.
static STORING: crate::quota::UserLocks<tokio::sync::Mutex<()>> = crate::quota::UserLocks::new();

/// Removes a workspace as seed 004 says: its artifacts and the history snapshots uploaded to
/// it (the conversation of a session whose snapshot came from it is cleared), then the record.
/// The caller holds the user's [`STORING`].
fn remove_workspace(state: &State, record: &WorkspaceRecord) -> Result<(), HttpError> {
    let store = state.registry.store();
    for session in record_session_ids(state, &record.id)? {
        // Their ids alone, read a page at a time: a session's every artifact with its
        // metadata at once could take gigabytes (an upload's 64 KiB of metadata is a tree of
        // up to about 1 MiB).
        let (mut ids, mut history) = (Vec::new(), false);
        let walked = crate::store::each_artifact(store.as_ref(), &session, |m| {
            if m.upload
                .as_ref()
                .is_some_and(|u| u.workspace_id == record.id)
            {
                ids.push(m.id.clone());
                history |= m.kind == ArtifactKind::SessionHistory;
            }
            Ok(())
        });
        match walked {
            Ok(()) => {}
            Err(StoreError::NotFound(_)) => continue,
            Err(e) => return Err(HttpError::store(e)),
        }
        if ids.is_empty() {
            continue;
        }
        // The conversation first: the artifacts are how a retry knows this session took the
        // workspace's conversation, so a delete cut short between the two (a crash) must leave
        // them for the retry to clear it (the other way round, a retry answered 204 and left
        // the conversation).
        // A session that cannot be read now stops the delete: its artifacts are what a retry
        // goes by.
        if history && let Some(meta) = store.load(&session).map_err(HttpError::store)? {
            let cleared = crate::store::history::empty(meta.created_at, meta.provider, meta.model);
            store
                .replace(&session, &cleared)
                .map_err(HttpError::store)?;
        }
        store
            .delete_artifacts(&session, &ids)
            .map_err(HttpError::store)?;
    }
    store.delete_record(&record.id).map_err(HttpError::store)
}

async fn upload_artifact(
    Shared(web): Shared<Arc<Web>>,
    ApiUser(user): ApiUser,
    Path(id): Path<String>,
    body: Body,
) -> Result<Response, HttpError> {
    // The whole body is read and checked before anything is looked up or written. Reading it
    // takes no turn: a body that is slow to come (or never comes, until the body deadline) holds
    // only its own connection and its user's call memory, not the other users' uploads.
    let (bytes, memory) = body_bytes(&web.state, &user, body).await?;
    // At most UPLOADS_AT_ONCE bodies are decoded at a time, over all users (each can take
    // several times MAX_BODY while it is decoded); the others wait with their bodies read and
    // counted.
    let storing = STORING.of(&user).lock_owned().await;
    // The user's own turn before the turn every user shares: waiting for theirs must not hold
    // one of the few that decode uploads.
    let slot = user_slot(&web.state, &user).await?;
    let turn = web.uploads.clone().acquire_owned().await;
    let state = web.state.clone();
    // Decoded, checked and stored on the blocking pool: tens of milliseconds of parsing and
    // base64 for a body of MAX_BODY, which on a runtime worker held up every other request and
    // connection it serves. The turn and the count go with the content: they last until it is
    // stored, even when the client goes away meanwhile (the handler is dropped, the store's
    // work is not).
    let created = blocking_held(slot, move || {
        let _storing = storing;
        let _turn = turn;
        let upload: UploadArtifact = parse_body(&bytes)?;
        drop(bytes);
        let checked = check_upload(upload, &memory)?;
        store_upload(&state, &user, &id, checked)
    })
    .await?;
    Ok(json(StatusCode::CREATED, &created))
}

/// Takes `n` bytes more in an upload's `memory`, or the `429` saying `what` would pass the bound.
fn take(memory: &Held, n: usize, what: &str) -> Result<(), HttpError> {
    if memory.take(n) {
        Ok(())
    } else {
        Err(tool_error(over_call_memory(memory.limit(), what)))
    }
}

/// An upload, checked: what will be stored.
struct Checked {
    session: String,
    kind: ArtifactKind,
    content_type: String,
    content: Vec<u8>,
    upload: Upload,
    /// The conversation, for a history snapshot.
    history: Option<Vec<HistoryMessage>>,
}

/// Checks every field of an upload and decodes its content, counted in `memory`; nothing is
/// stored yet.
fn check_upload(upload: UploadArtifact, memory: &Held) -> Result<Checked, HttpError> {
    let session_of = |id: &str| {
        crate::session::normalize_id(id).map_err(|_| {
            HttpError::bad(format!(
                "`sessionId` `{id}` is neither `default` nor a UUID"
            ))
        })
    };
    match upload {
        UploadArtifact::ToolOutput(file) => {
            check_file(ArtifactKind::ToolOutput, file, session_of, memory)
        }
        UploadArtifact::FileDiff(file) => {
            check_file(ArtifactKind::FileDiff, file, session_of, memory)
        }
        UploadArtifact::SessionHistory(snapshot) => {
            let session = session_of(&snapshot.session_id)?;
            required("snapshotAt", &snapshot.snapshot_at)?;
            if let Some(task) = &snapshot.snapshot_after_task_id {
                field("snapshotAfterTaskId", task)?;
            }
            for (i, m) in snapshot.messages.iter().enumerate() {
                for (name, value) in [("messageId", &m.message_id), ("timestamp", &m.timestamp)] {
                    if let Some(v) = value {
                        field(&format!("messages[{i}].{name}"), v)?;
                    }
                }
            }
            // The conversation's copy and the stored copy count beside the body they came
            // from, until stored: the first before it is made, the second once made (its size
            // is known then).
            let texts = snapshot.messages.iter().map(|m| m.content.len()).sum();
            take(memory, texts, "the snapshot")?;
            let history = snapshot
                .messages
                .iter()
                .map(|m| HistoryMessage {
                    role: m.role.role(),
                    text: m.content.clone(),
                })
                .collect();
            let content = serde_json::to_vec_pretty(&snapshot).map_err(HttpError::internal)?;
            take(memory, content.capacity(), "the snapshot")?;
            Ok(Checked {
                session,
                kind: ArtifactKind::SessionHistory,
                content_type: "application/json".into(),
                content,
                upload: Upload {
                    workspace_id: String::new(),
                    task_id: snapshot.snapshot_after_task_id.clone(),
                    step_id: None,
                    name: None,
                    metadata: Map::new(),
                },
                history: Some(history),
            })
        }
    }
}

/// Largest `metadata` of an upload, as JSON text.
pub const MAX_METADATA_BYTES: usize = 64 * 1024;
/// Deepest `metadata` of an upload: its index line nests it three levels further, within what
/// the store reads back (serde_json's 128).
pub const MAX_METADATA_DEPTH: usize = 32;

/// An upload's `metadata` is kept in its session's artifact index, which every listing, download
/// and quota check reads whole: refused past [`MAX_METADATA_BYTES`] (one upload's metadata of
/// 20 MiB, uncounted, made every listing hold gigabytes) and past [`MAX_METADATA_DEPTH`] (nested
/// 125 deep, it was stored and answered `201`, then never read back).
fn check_metadata(metadata: &Map<String, Value>) -> Result<(), HttpError> {
    // The map itself is one level.
    let deepest = 1 + metadata
        .values()
        .map(monad_protocol::values::nesting)
        .max()
        .unwrap_or(0);
    if deepest > MAX_METADATA_DEPTH {
        return Err(HttpError::bad(format!(
            "`metadata` is nested {deepest} levels deep; at most {MAX_METADATA_DEPTH}"
        )));
    }
    // Counted as written, not made: metadata can be nearly the whole body.
    let mut counted = crate::executor::CappedWriter::new(0);
    let size = match serde_json::to_writer(&mut counted, metadata) {
        Ok(()) => counted.total(),
        Err(_) => u64::MAX,
    };
    if size > MAX_METADATA_BYTES as u64 {
        return Err(HttpError::bad(format!(
            "`metadata` is {size} bytes as JSON; at most {MAX_METADATA_BYTES} (put large data \
             in the content)"
        )));
    }
    Ok(())
}

fn check_file(
    kind: ArtifactKind,
    file: FileArtifact,
    session_of: impl Fn(&str) -> Result<String, HttpError>,
    memory: &Held,
) -> Result<Checked, HttpError> {
    let session = session_of(&file.session_id)?;
    required("artifactName", &file.artifact_name)?;
    required("contentType", &file.content_type)?;
    if HeaderValue::from_str(&file.content_type).is_err() || !file.content_type.contains('/') {
        return Err(HttpError::bad(format!(
            "`contentType` `{}` is not a media type",
            file.content_type
        )));
    }
    for (name, value) in [("taskId", &file.task_id), ("stepId", &file.step_id)] {
        if let Some(v) = value {
            field(name, v)?;
        }
    }
    check_metadata(&file.metadata)?;
    // The decoded content counts beside the body it came in, until the upload is stored.
    let decoded = base64::decoded_len_estimate(file.content_base64.len());
    take(memory, decoded, "the upload's content")?;
    let content = base64::engine::general_purpose::STANDARD
        .decode(file.content_base64.as_bytes())
        .map_err(|e| HttpError::bad(format!("`contentBase64` is not base64: {e}")))?;
    Ok(Checked {
        session,
        kind,
        content_type: file.content_type,
        content,
        upload: Upload {
            workspace_id: String::new(),
            task_id: file.task_id,
            step_id: file.step_id,
            name: Some(file.artifact_name),
            metadata: file.metadata,
        },
        history: None,
    })
}

/// Stores a checked upload in `user`'s workspace `id`; the caller holds the user's [`STORING`].
fn store_upload(
    state: &State,
    user: &str,
    id: &str,
    mut checked: Checked,
) -> Result<ArtifactCreated, HttpError> {
    let record = owned_record(state, user, id)?;
    let store = state.registry.store();
    // `default` is the caller's own default, never the session of whoever used `default`
    // first; one the caller has none of yet is made only once the checks below pass (as over
    // QUIC, on first need), so that a refused upload makes nothing.
    let new_default = checked.session == crate::session::DEFAULT_SESSION
        && match state.registry.existing_id(&checked.session, user) {
            Some(own) => {
                checked.session = own;
                false
            }
            None => true,
        };
    // A snapshot past what a conversation holds is refused before anything is stored (the
    // store would refuse it only after its artifact was kept).
    // The request itself is too large, whatever the user stores: a `400` naming the bound
    // (not the `507` of a quota, which deleting something would make room for).
    if let Some(messages) = &checked.history {
        let bytes = crate::store::history_bytes(messages);
        if crate::store::history_fits(&checked.session, bytes).is_err() {
            return Err(HttpError::bad(format!(
                "the snapshot's messages hold {bytes} bytes of text, past the {} MiB a \
                 conversation holds at most: send a shorter snapshot",
                crate::store::MAX_HISTORY_BYTES >> 20
            )));
        }
    }
    // Another user's session is a 404, before anything is made; so is one whose metadata
    // cannot be read (the store's words would name the server's files).
    let not_found = || HttpError::not_found(format!("session `{}`", checked.session));
    if !new_default {
        match store.load(&checked.session) {
            Ok(Some(meta)) if meta.owner != user => return Err(not_found()),
            Ok(_) => {}
            Err(StoreError::Invalid(_) | StoreError::NotFound(_)) => return Err(not_found()),
            Err(e) => return Err(HttpError::store(e)),
        }
    }
    // The caller holds the user's STORING: the quota check and the write are one step, and
    // uploads at once cannot pass it together. (Only API uploads count, and they all pass
    // here; deletes meanwhile only free room.) The workspace is looked up again in the same
    // step: one deleted since (its delete takes the step too) gets nothing stored for it.
    owned_record(state, user, id)?;
    checked.upload.workspace_id = record.id.clone();
    check_quota(state, user, &checked, new_default)?;
    // The check below and the write that adds the session to the record are one step under
    // the same STORING, the record's user's (a record is one user's): two uploads naming
    // different sessions to one `general` workspace at once cannot both pass. (A lock of every
    // user's `general` uploads held each user's upload up behind any other's.)
    if WorkspaceScope::of(&record) == WorkspaceScope::General {
        let page = store
            .record_sessions(&record.id, 1, None)
            .map_err(HttpError::store)?;
        if let Some(other) = page
            .items
            .first()
            .filter(|s| new_default || s.session != checked.session)
        {
            return Err(HttpError {
                status: StatusCode::CONFLICT,
                code: "conflict",
                message: format!(
                    "a `general` workspace holds one session, and this one holds `{}`",
                    other.session
                ),
            });
        }
    }
    let session = state
        .registry
        .open_own(&checked.session, user)
        .map_err(tool_error)?;
    let size = checked.content.len() as u64;
    let meta = ArtifactMeta {
        id: match checked.kind {
            // One snapshot per session: the same id, replaced by each upload.
            ArtifactKind::SessionHistory => "session_history".into(),
            ArtifactKind::ToolOutput | ArtifactKind::FileDiff => uuid::Uuid::new_v4().to_string(),
        },
        session: session.id.clone(),
        kind: checked.kind,
        workspace: None,
        tool: checked
            .upload
            .metadata
            .get("toolName")
            .and_then(Value::as_str)
            .map(str::to_owned),
        call_id: None,
        created_at: now_rfc3339(),
        content_type: checked.content_type,
        size,
        truncated: false,
        original_size: size,
        upload: Some(Box::new(checked.upload)),
    };
    store
        .put_artifact(&meta, &checked.content)
        .map_err(HttpError::store)?;
    let tasks = match checked.history {
        Some(messages) => {
            let m = session.meta();
            let history = History {
                provider: m.provider,
                model: m.model,
                created_at: m.created_at,
                messages,
            };
            store
                .replace(&session.id, &history)
                .map_err(HttpError::store)?;
            1
        }
        None => 0,
    };
    store
        .touch_record(&record.id, &session.id, tasks)
        .map_err(HttpError::store)?;
    if let Some(meta) = session.touch() {
        store.save(&meta).map_err(HttpError::store)?;
    }
    let artifact_id = public_id(&meta);
    Ok(ArtifactCreated {
        artifact_uri: format!("workspaces/{}/artifacts/{artifact_id}", record.id),
        artifact_id,
    })
}

/// Refuses an upload that would take `user`'s uploaded bytes past
/// `max_artifact_bytes_per_user` (a history snapshot replaces the session's previous one, whose
/// bytes it frees). The caller holds the uploads' lock until the upload is stored.
fn check_quota(
    state: &State,
    user: &str,
    checked: &Checked,
    new_default: bool,
) -> Result<(), HttpError> {
    let store = state.registry.store();
    let used = match store.uploaded_bytes(user).map_err(HttpError::store)? {
        Some(used) => used,
        None => crate::store::uploaded_bytes(store.as_ref(), user).map_err(HttpError::store)?,
    };
    let replaced = match checked.kind {
        // A default not made yet has no snapshot to replace (`default` there is another
        // user's session).
        ArtifactKind::SessionHistory if new_default => 0,
        ArtifactKind::SessionHistory => crate::store::session_uploaded_bytes(
            store.as_ref(),
            &checked.session,
            Some(&["session_history".to_owned()]),
        )
        .map_err(HttpError::store)?,
        ArtifactKind::ToolOutput | ArtifactKind::FileDiff => 0,
    };
    let size = checked.content.len() as u64;
    let charged = checked.upload.charged_bytes(size);
    let after = used.saturating_sub(replaced).saturating_add(charged);
    let max = state.config.quotas.max_artifact_bytes_per_user;
    if after > max {
        return Err(HttpError::quota(format!(
            "storing these {size} bytes ({charged} with their record and metadata) would take \
             the artifacts user `{user}` uploaded to {after} bytes, over this server's quota of \
             {max} bytes per user (server.max_artifact_bytes_per_user); delete workspaces to \
             free room"
        )));
    }
    Ok(())
}

/// An artifact's content as a download: its own content type, never interpreted by the
/// browser as part of this site (a sandboxing CSP, `nosniff`, and an attachment unless it is
/// JSON or plain text).
pub fn download(meta: &ArtifactMeta, content: Vec<u8>) -> Response {
    let content_type = HeaderValue::from_str(&meta.content_type)
        .unwrap_or(HeaderValue::from_static("application/octet-stream"));
    let name = meta
        .upload
        .as_ref()
        .and_then(|u| u.name.as_deref())
        .unwrap_or(&meta.id);
    // Only safe characters in the header's file name; the full name is in the metadata.
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    attachment(content, content_type, &safe)
}

/// A private file to download, never shown as part of this site: `nosniff`, a sandboxing CSP,
/// not cached (not kept by the browser after sign-out), an attachment named `file_name` (made
/// of safe characters by the caller).
pub fn attachment(body: impl Into<Body>, content_type: HeaderValue, file_name: &str) -> Response {
    let mut response = (StatusCode::OK, body.into()).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, content_type);
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox; default-src 'none'"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{file_name}\"")) {
        headers.insert(header::CONTENT_DISPOSITION, v);
    }
    response
}

/// `user`'s artifact by public id, in session `session` when given; `404` for anything else.
pub fn owned_artifact(
    state: &State,
    user: &str,
    public: &str,
    session: Option<&str>,
) -> Result<(ArtifactMeta, Vec<u8>), HttpError> {
    let not_found = || HttpError::not_found(format!("artifact `{public}`"));
    let (s, a) = parse_public_id(public).ok_or_else(not_found)?;
    if session.is_some_and(|want| want != s) {
        return Err(not_found());
    }
    // The session as its owner's id: `default` is the caller's own default, which may be a
    // session of another id; the one whose id is `default` may be another user's.
    let owned = owned_session(state, user, s).map_err(|_| not_found())?;
    match state.registry.store().artifact(&owned.id, a) {
        Ok(found) => Ok(found),
        Err(StoreError::NotFound(_)) | Err(StoreError::Invalid(_)) => Err(not_found()),
        Err(e) => Err(HttpError::internal(e)),
    }
}

async fn workspace_artifact(
    Shared(web): Shared<Arc<Web>>,
    ApiUser(user): ApiUser,
    Path((id, artifact)): Path<(String, String)>,
) -> Result<Response, HttpError> {
    let state = web.state.clone();
    let slot = user_slot(&web.state, &user).await?;
    let (meta, content) = blocking_held(slot, move || {
        owned_record(&state, &user, &id)?;
        let (meta, content) = owned_artifact(&state, &user, &artifact, None)?;
        if meta.upload.as_ref().is_none_or(|u| u.workspace_id != id) {
            return Err(HttpError::not_found(format!("artifact `{artifact}`")));
        }
        Ok((meta, content))
    })
    .await?;
    Ok(download(&meta, content))
}

async fn workspace_sessions(
    Shared(web): Shared<Arc<Web>>,
    ApiUser(user): ApiUser,
    Path(id): Path<String>,
    q: Result<Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, HttpError> {
    let q = query(q)?;
    let limit = page_limit(q.limit.as_deref())?;
    let web2 = web.clone();
    let slot = user_slot(&web.state, &user).await?;
    let page = blocking_held(slot, move || {
        workspace_sessions_page(&web2, &user, &id, limit, q.next_token.as_deref())
    })
    .await?;
    Ok(json(StatusCode::OK, &page))
}

/// One page of the sessions of `user`'s workspace `id`.
pub fn workspace_sessions_page(
    web: &Web,
    user: &str,
    id: &str,
    limit: usize,
    next: Option<&str>,
) -> Result<SessionsPage, HttpError> {
    let state = &web.state;
    owned_record(state, user, id)?;
    let listing = format!("workspace:{id}");
    let cursor = next
        .map(|t| web.signer.verify(user, &listing, t))
        .transpose()
        .map_err(|e| HttpError::bad(e.to_string()))?;
    let page = state
        .registry
        .store()
        .record_sessions(id, limit, cursor.as_deref())
        .map_err(HttpError::store)?;
    Ok(SessionsPage {
        sessions: page
            .items
            .into_iter()
            .map(|s| SessionSummary {
                name: state
                    .registry
                    .store()
                    .load(&s.session)
                    .ok()
                    .flatten()
                    .and_then(|m| m.name),
                session_id: s.session,
                created_at: s.first_at,
                last_task_at: s.last_active,
                task_count: s.calls,
            })
            .collect(),
        next_token: page.next.map(|n| web.signer.sign(user, &listing, &n)),
    })
}

async fn list_sessions(
    Shared(web): Shared<Arc<Web>>,
    ApiUser(user): ApiUser,
    q: Result<Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, HttpError> {
    let q = query(q)?;
    let limit = page_limit(q.limit.as_deref())?;
    let web2 = web.clone();
    let slot = user_slot(&web.state, &user).await?;
    let page = blocking_held(slot, move || {
        sessions_page(&web2, &user, limit, q.next_token.as_deref())
    })
    .await?;
    Ok(json(StatusCode::OK, &page))
}

/// One page of `user`'s sessions, most recent activity first.
pub fn sessions_page(
    web: &Web,
    user: &str,
    limit: usize,
    next: Option<&str>,
) -> Result<SessionsPage, HttpError> {
    const LISTING: &str = "sessions";
    let state = &web.state;
    let cursor = next
        .map(|t| web.signer.verify(user, LISTING, t))
        .transpose()
        .map_err(|e| HttpError::bad(e.to_string()))?;
    let (infos, next) = state
        .registry
        .list_page(user, limit, cursor.as_deref())
        .map_err(tool_error)?;
    let store = state.registry.store();
    let sessions = infos
        .into_iter()
        .map(|info| {
            let meta = store.load(&info.id).ok().flatten();
            SessionSummary {
                task_count: store.audit_count(&info.id).unwrap_or(0) as u64,
                name: meta.and_then(|m| m.name),
                session_id: info.id,
                created_at: info.created_at,
                last_task_at: info.last_active,
            }
        })
        .collect();
    Ok(SessionsPage {
        sessions,
        next_token: next.map(|n| web.signer.sign(user, LISTING, &n)),
    })
}

/// The view of a session `user` owns.
pub fn session_view(state: &State, user: &str, id: &str) -> Result<SessionView, HttpError> {
    let meta = owned_session(state, user, id)?;
    let store = state.registry.store();
    let live = state
        .registry
        .loaded_of(user)
        .into_iter()
        .find(|s| s.id == meta.id);
    let workspaces = match &live {
        Some(session) => session
            .workspaces()
            .into_iter()
            .map(|w| SessionWorkspace {
                name: w.info.name,
                uri: w.info.uri,
                trust: w.info.trust.as_str().to_owned(),
                host: match w.info.host {
                    monad_protocol::wire::Host::Server => "server".into(),
                    monad_protocol::wire::Host::Client => "client".into(),
                },
                online: w.info.online,
            })
            .collect(),
        None => vec![SessionWorkspace {
            name: "primary".into(),
            uri: format!("server:/sessions/{}", meta.id),
            trust: "full".into(),
            host: "server".into(),
            online: true,
        }],
    };
    let workspace_ids = store
        .session_records(user, &meta.id)
        .map_err(HttpError::store)?;
    Ok(SessionView {
        task_count: store.audit_count(&meta.id).unwrap_or(0) as u64,
        session_id: meta.id,
        name: meta.name,
        created_at: meta.created_at,
        last_task_at: live.map_or(meta.last_active, |s| s.meta().last_active),
        provider: meta.provider,
        model: meta.model,
        workspaces,
        workspace_ids,
    })
}

async fn get_session(
    Shared(web): Shared<Arc<Web>>,
    ApiUser(user): ApiUser,
    Path(id): Path<String>,
) -> Result<Response, HttpError> {
    let state = web.state.clone();
    let slot = user_slot(&web.state, &user).await?;
    let view = blocking_held(slot, move || session_view(&state, &user, &id)).await?;
    Ok(json(StatusCode::OK, &view))
}

/// The conversation of a session `user` owns.
pub fn history_view(state: &State, user: &str, id: &str) -> Result<HistoryView, HttpError> {
    let meta = owned_session(state, user, id)?;
    let history = state
        .registry
        .store()
        .history(&meta.id)
        .map_err(HttpError::store)?;
    Ok(HistoryView {
        session_id: meta.id,
        provider: history.provider,
        model: history.model,
        created_at: history.created_at,
        messages: history
            .messages
            .into_iter()
            .enumerate()
            .map(|(i, m)| SnapshotMessage {
                message_id: Some(format!("msg_{:03}", i + 1)),
                role: MessageRole::of(m.role),
                content: m.text,
                timestamp: None,
            })
            .collect(),
    })
}

async fn session_history(
    Shared(web): Shared<Arc<Web>>,
    ApiUser(user): ApiUser,
    Path(id): Path<String>,
) -> Result<Response, HttpError> {
    let state = web.state.clone();
    let slot = user_slot(&web.state, &user).await?;
    let view = blocking_held(slot, move || history_view(&state, &user, &id)).await?;
    Ok(json(StatusCode::OK, &view))
}

/// Where the page `next` (a page token of `listing` for `user`, or none: the first) starts; a
/// token changed, or made for another user or listing, is a `400`.
pub fn page_offset(
    web: &Web,
    user: &str,
    listing: &str,
    next: Option<&str>,
) -> Result<usize, HttpError> {
    match next {
        None => Ok(0),
        Some(t) => web
            .signer
            .verify(user, listing, t)
            .ok()
            .and_then(|p| p.parse::<usize>().ok())
            .ok_or_else(|| HttpError::bad(super::token::BadToken.to_string())),
    }
}

/// One page of the artifacts of a session `user` owns, oldest first. A position names the
/// same artifact unless an earlier one is deleted between pages.
pub fn artifact_page(
    web: &Web,
    user: &str,
    id: &str,
    limit: usize,
    next: Option<&str>,
) -> Result<ArtifactList, HttpError> {
    let meta = owned_session(&web.state, user, id)?;
    let listing = format!("artifacts:{}", meta.id);
    let offset = page_offset(web, user, &listing, next)?;
    let page = HttpError::store_or_nothing(
        web.state
            .registry
            .store()
            .artifact_page(&meta.id, offset, limit),
    )?;
    Ok(ArtifactList {
        artifacts: page.artifacts.iter().map(artifact_view).collect(),
        total: page.total as u64,
        next_token: (page.end > offset && page.end < page.total)
            .then(|| web.signer.sign(user, &listing, &page.end.to_string())),
    })
}

async fn session_artifacts(
    Shared(web): Shared<Arc<Web>>,
    ApiUser(user): ApiUser,
    Path(id): Path<String>,
    q: Result<Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, HttpError> {
    let q = query(q)?;
    let limit = page_limit(q.limit.as_deref())?;
    let web2 = web.clone();
    let slot = user_slot(&web.state, &user).await?;
    let page = blocking_held(slot, move || {
        artifact_page(&web2, &user, &id, limit, q.next_token.as_deref())
    })
    .await?;
    Ok(json(StatusCode::OK, &page))
}

async fn session_artifact(
    Shared(web): Shared<Arc<Web>>,
    ApiUser(user): ApiUser,
    Path((id, artifact)): Path<(String, String)>,
) -> Result<Response, HttpError> {
    let state = web.state.clone();
    let slot = user_slot(&web.state, &user).await?;
    let (meta, content) = blocking_held(slot, move || {
        owned_artifact(&state, &user, &artifact, Some(&id))
    })
    .await?;
    Ok(download(&meta, content))
}

/// One page of the audit log of a session `user` owns, oldest first.
pub fn audit_page(
    web: &Web,
    user: &str,
    id: &str,
    limit: usize,
    next: Option<&str>,
) -> Result<AuditPage, HttpError> {
    let meta = owned_session(&web.state, user, id)?;
    let listing = format!("audit:{}", meta.id);
    let offset = page_offset(web, user, &listing, next)?;
    let (records, total) = web
        .state
        .registry
        .store()
        .audit_page(&meta.id, offset, limit)
        .map_err(HttpError::store)?;
    let end = offset + records.len();
    Ok(AuditPage {
        records: records.iter().map(AuditEntry::of).collect(),
        total: total as u64,
        next_token: (end < total).then(|| web.signer.sign(user, &listing, &end.to_string())),
    })
}

async fn session_audit(
    Shared(web): Shared<Arc<Web>>,
    ApiUser(user): ApiUser,
    Path(id): Path<String>,
    q: Result<Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, HttpError> {
    let q = query(q)?;
    let limit = page_limit(q.limit.as_deref())?;
    let web2 = web.clone();
    let slot = user_slot(&web.state, &user).await?;
    let page = blocking_held(slot, move || {
        audit_page(&web2, &user, &id, limit, q.next_token.as_deref())
    })
    .await?;
    Ok(json(StatusCode::OK, &page))
}

/// How often an event stream checks that its credential and the session still stand, when no
/// event comes to check them on.
const RECHECK: std::time::Duration = std::time::Duration::from_secs(5);

/// The least time between two of an event stream's checks: events that come faster wait for
/// the next check together (each check is store work: a token and a session looked up, two
/// queries of a database), so that a session's many followers do not make a check each per
/// event. An event waits at most this long for it.
const CHECK_GAP: std::time::Duration = std::time::Duration::from_millis(250);

/// Most events one check lets through together: a stream's own copies of them.
const MAX_PENDING: usize = 32;

/// The next event of `rx` a stream may deliver (see [`event_stream`]), `None` when it ends:
/// from `pending` (events
/// that came before the last check that passed), else the next to come, checked with `check`
/// (every [`RECHECK`] without one, on `ticks`) at most every [`CHECK_GAP`] since `checked`,
/// with what came in the meantime, which then waits in `pending`. No event is delivered unless
/// a check that passed began after it was published.
async fn next_checked<C, F>(
    rx: &mut tokio::sync::broadcast::Receiver<Event>,
    session: &str,
    pending: &mut std::collections::VecDeque<SessionEvent>,
    checked: &mut Option<tokio::time::Instant>,
    ticks: &mut tokio::time::Interval,
    shutdown: &tokio_util::sync::CancellationToken,
    check: C,
) -> Option<SessionEvent>
where
    C: Fn() -> F,
    F: std::future::Future<Output = bool>,
{
    use tokio::sync::broadcast::error::{RecvError, TryRecvError};
    if !pending.is_empty() {
        // A client reading slowly is checked again on the way through what waits.
        if checked.is_some_and(|at| at.elapsed() >= RECHECK) && !passes(&check, checked).await {
            pending.clear();
            return None;
        }
        return pending.pop_front();
    }
    let as_event = |got: Result<Event, RecvError>| match got {
        Ok(event) => Some(SessionEvent::of(session, event)),
        Err(RecvError::Lagged(missed)) => Some(SessionEvent::Lagged { missed }),
        Err(RecvError::Closed) => None,
    };
    loop {
        let got = tokio::select! {
            () = shutdown.cancelled() => return None,
            _ = ticks.tick() => None,
            got = rx.recv() => Some(got),
        };
        let Some(got) = got else {
            if !passes(&check, checked).await {
                return None;
            }
            continue;
        };
        let first = as_event(got)?;
        // A backlog of a batch or more is checked at once: spacing it would cap a stream at a
        // batch per gap, and the channel would drop what a fast reader has not taken.
        if let Some(due) = checked
            .map(|at| at + CHECK_GAP)
            .filter(|_| rx.len() + 1 < MAX_PENDING)
        {
            tokio::select! {
                () = shutdown.cancelled() => return None,
                () = tokio::time::sleep_until(due) => {}
            }
        }
        pending.push_back(first);
        // The rest stay in the channel (shared by every follower) for the next check.
        while pending.len() < MAX_PENDING {
            let more = match rx.try_recv() {
                Ok(event) => Ok(event),
                Err(TryRecvError::Lagged(missed)) => Err(RecvError::Lagged(missed)),
                Err(TryRecvError::Empty | TryRecvError::Closed) => break,
            };
            pending.extend(as_event(more));
        }
        if !passes(&check, checked).await {
            pending.clear();
            return None;
        }
        return pending.pop_front();
    }
}

/// Runs an event stream's `check`: whether it passed, noting in `checked` when a check that
/// passed began (what came before then may go out).
async fn passes<C, F>(check: &C, checked: &mut Option<tokio::time::Instant>) -> bool
where
    C: Fn() -> F,
    F: std::future::Future<Output = bool>,
{
    let began = tokio::time::Instant::now();
    let passed = check().await;
    if passed {
        *checked = Some(began);
    }
    passed
}

/// The server-sent events of a session: `ready` first, then its events as they happen, until
/// the client goes, the server shuts down, or access is gone: before each event, and every
/// [`RECHECK`] without one, the stream checks that `credential` still stands for `user` (a
/// revoked token, a sign-out) and that `user` still owns the session (a deleted session, whose
/// id another user's session may take); when not, it ends without sending the event.
pub fn event_stream(
    web: Arc<Web>,
    session: String,
    user: String,
    credential: Credential,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>> + use<>> {
    let rx = web.state.feed.subscribe(&session);
    let first = SessionEvent::Ready {
        session_id: session.clone(),
    };
    let mut ticks = tokio::time::interval(RECHECK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let watch = Watch {
        web,
        session,
        user,
        credential,
        rx: Some(rx),
        ticks,
        pending: Default::default(),
        checked: None,
    };
    let stream =
        futures_util::stream::unfold((Some(first), watch), |(first, mut watch)| async move {
            if let Some(first) = first {
                return Some((Ok(sse(&first)), (None, watch)));
            }
            let Watch {
                web,
                session,
                user,
                credential,
                rx,
                ticks,
                pending,
                checked,
            } = &mut watch;
            let check = || still_allowed(web, user, session, credential);
            let shutdown = web.shutdown.clone();
            let next = next_checked(
                rx.as_mut()?,
                session,
                pending,
                checked,
                ticks,
                &shutdown,
                check,
            )
            .await;
            next.map(|event| (Ok(sse(&event)), (None, watch)))
        });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// What an event stream keeps between events. Dropped with the stream (the client went): its
/// follow of the session is released.
struct Watch {
    web: Arc<Web>,
    session: String,
    user: String,
    credential: Credential,
    /// Taken only by `drop`.
    rx: Option<tokio::sync::broadcast::Receiver<Event>>,
    ticks: tokio::time::Interval,
    /// Events that came before the last check that passed, not delivered yet.
    pending: std::collections::VecDeque<SessionEvent>,
    /// When the last check that passed began.
    checked: Option<tokio::time::Instant>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(rx) = self.rx.take() {
            self.web.state.feed.release(&self.session, rx);
        }
    }
}

/// Whether an event stream of `user` following `session` may go on (see [`event_stream`]).
async fn still_allowed(web: &Arc<Web>, user: &str, session: &str, credential: &Credential) -> bool {
    let (web, user, session, credential) = (
        web.clone(),
        user.to_owned(),
        session.to_owned(),
        credential.clone(),
    );
    tokio::task::spawn_blocking(move || {
        // The same session, still theirs: `default` may now mean a default of the user's own
        // while the stream follows the well-known one, which another user may hold by now.
        credential.still_valid(&web, &user)
            && owned_session(&web.state, &user, &session).is_ok_and(|meta| meta.id == session)
    })
    .await
    .unwrap_or(false)
}

fn sse(event: &SessionEvent) -> SseEvent {
    SseEvent::default()
        .event(event.name())
        .json_data(event)
        .unwrap_or_else(|_| SseEvent::default().event("error"))
}

async fn session_events(
    Shared(web): Shared<Arc<Web>>,
    ApiUser(user): ApiUser,
    headers: axum::http::HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, HttpError> {
    let state = web.state.clone();
    let owner = user.clone();
    let slot = user_slot(&web.state, &user).await?;
    let meta = blocking_held(slot, move || owned_session(&state, &owner, &id)).await?;
    // `ApiUser` accepted this request's bearer token, so it is there.
    let token = super::bearer(&headers).unwrap_or_default().to_owned();
    Ok(event_stream(web, meta.id, user, Credential::Bearer(token)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Regression: an event stream checked its credential and session (store work: two
    /// database queries) before every event, so one user's 64 streams made 64 checks per
    /// event of a busy session. Events that come together share one check, a check comes at
    /// most every `CHECK_GAP`, and none is delivered past a check that failed.
    #[tokio::test(start_paused = true)]
    async fn events_that_come_together_share_a_check_and_none_passes_one_that_failed() {
        let (tx, mut rx) = tokio::sync::broadcast::channel(1024);
        let mut pending = std::collections::VecDeque::new();
        let mut checked = None;
        let mut ticks = tokio::time::interval(std::time::Duration::from_secs(3600));
        ticks.tick().await;
        let shutdown = tokio_util::sync::CancellationToken::new();
        let checks = AtomicUsize::new(0);
        let allowed = std::sync::atomic::AtomicBool::new(true);
        let check = || {
            checks.fetch_add(1, Ordering::SeqCst);
            let allowed = allowed.load(Ordering::SeqCst);
            async move { allowed }
        };
        let mut next = async |rx: &mut tokio::sync::broadcast::Receiver<Event>| {
            next_checked(
                rx,
                "s",
                &mut pending,
                &mut checked,
                &mut ticks,
                &shutdown,
                check,
            )
            .await
        };
        for _ in 0..100 {
            tx.send(Event::History).unwrap();
        }
        for _ in 0..100 {
            assert!(matches!(
                next(&mut rx).await,
                Some(SessionEvent::History { .. })
            ));
        }
        assert_eq!(
            checks.load(Ordering::SeqCst),
            100usize.div_ceil(MAX_PENDING),
            "one check for each MAX_PENDING of what came together"
        );
        // Events in a steady stream: a check at most every CHECK_GAP.
        let started = tokio::time::Instant::now();
        let before = checks.load(Ordering::SeqCst) as u128;
        for _ in 0..20 {
            tx.send(Event::History).unwrap();
            assert!(matches!(
                next(&mut rx).await,
                Some(SessionEvent::History { .. })
            ));
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let gaps = started.elapsed().as_millis() / CHECK_GAP.as_millis() + 1;
        let made = checks.load(Ordering::SeqCst) as u128 - before;
        assert!(made <= gaps, "{made} checks in {:?}", started.elapsed());
        // A client reading slowly: what waits is checked again once RECHECK has gone by.
        for _ in 0..3 {
            tx.send(Event::History).unwrap();
        }
        assert!(next(&mut rx).await.is_some());
        let before = checks.load(Ordering::SeqCst);
        tokio::time::sleep(RECHECK).await;
        assert!(next(&mut rx).await.is_some());
        assert_eq!(checks.load(Ordering::SeqCst), before + 1, "checked again");
        assert!(next(&mut rx).await.is_some());
        assert_eq!(checks.load(Ordering::SeqCst), before + 1);
        // Access gone: what came before the check that failed is not delivered.
        allowed.store(false, Ordering::SeqCst);
        tx.send(Event::History).unwrap();
        tx.send(Event::History).unwrap();
        assert!(next(&mut rx).await.is_none());
        assert!(pending.is_empty());
    }
}
