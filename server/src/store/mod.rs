//! Storage: what a session keeps, behind four traits with the filesystem as the embedded default.
//!
//! | trait | keeps | filesystem layout |
//! |---|---|---|
//! | [`SessionStore`] | session metadata, `session.md`, `audit.jsonl`, per-session config | `sessions/<id>/` |
//! | [`WorkspaceStore`] | workspace records: attached folders by (user, device, path), with their sessions | `workspaces/<id>.json` |
//! | [`BindingStore`] | (user, device id) → last session; user → default session | `bindings.toml` |
//! | [`FolderStore`] | the folder registry of MCP roots: (user, device, folder) → its sessions and the active one | `folder_sessions.toml` |
//! | [`ArtifactStore`] | `tool_output`, `file_diff`, `session_history` artifacts and their index | `sessions/<id>/artifacts/` |
//!
//! The traits are synchronous and `Send + Sync`; async callers run them on the blocking pool.
//! Every method is one logical operation on keyed records or blobs, so the PostgreSQL store
//! ([`PgStore`], chosen by `[store] url`, see [`open`]) implements them without changing
//! callers: session metadata, messages, audit records, workspace records, bindings, the folder
//! registry and the artifact index are rows (listings are indexed queries, pagination a keyset
//! cursor on `(last_active, session_id)`), and artifact content goes through [`Blobs`] under
//! `{workspaceId or sessionId}/{artifactId}`. See `docs/operations.md`, "Storage backends".

pub mod blobs;
mod fs;
pub mod history;
pub mod observed;
pub mod pg;
pub mod s3;

use serde::{Deserialize, Serialize};

pub use blobs::{BlobEntry, Blobs, FsBlobs, Swept};
pub use fs::FsStore;
pub(crate) use fs::{decode_cursor, encode_cursor};
pub use history::{History, HistoryMessage, Role};
pub use monad_protocol::wire::{Decider, WorkspaceRecord, WorkspaceSession};
pub use pg::PgStore;
pub use s3::{S3Blobs, S3Options};

/// What can go wrong in a store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// On what.
        path: String,
        /// The underlying error (in the message, so it is not also a `source`).
        source: std::io::Error,
    },
    /// A record does not exist.
    #[error("{0} does not exist")]
    NotFound(String),
    /// A value is not acceptable (a bad page token, a bad id).
    #[error("{0}")]
    Invalid(String),
    /// The database failed or could not be reached (the PostgreSQL store).
    #[error("database: {0}")]
    Database(String),
    /// The object store failed or could not be reached (artifact content on S3).
    #[error("object store: {0}")]
    Objects(String),
    /// This host may not write the session: another host serves it (its lease was taken over,
    /// or this host's expired). Nothing was written.
    #[error("session {session}: {why}; this host no longer writes it, nothing was written")]
    Fenced {
        /// The session.
        session: String,
        /// Why, e.g. the epoch that took over.
        why: String,
    },
    /// A bound of what the store keeps would be passed ([`MAX_HISTORY_BYTES`]). Nothing was
    /// written.
    #[error("{0}")]
    Full(String),
}

impl StoreError {
    /// The same error again, for each of several operations that one failure ended (an I/O
    /// error's kind and message are kept).
    pub(crate) fn again(&self) -> StoreError {
        match self {
            StoreError::Io { op, path, source } => StoreError::Io {
                op,
                path: path.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            StoreError::NotFound(what) => StoreError::NotFound(what.clone()),
            StoreError::Invalid(what) => StoreError::Invalid(what.clone()),
            StoreError::Database(what) => StoreError::Database(what.clone()),
            StoreError::Objects(what) => StoreError::Objects(what.clone()),
            StoreError::Fenced { session, why } => StoreError::Fenced {
                session: session.clone(),
                why: why.clone(),
            },
            StoreError::Full(what) => StoreError::Full(what.clone()),
        }
    }

    pub(crate) fn io(
        op: &'static str,
        path: &std::path::Path,
        source: std::io::Error,
    ) -> StoreError {
        StoreError::Io {
            op,
            path: path.display().to_string(),
            source,
        }
    }
}

/// What `session.toml` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionMeta {
    /// `default` or a UUID.
    pub id: String,
    /// Human name, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The owning user.
    pub owner: String,
    /// Creation time, RFC 3339.
    pub created_at: String,
    /// Last activity (a call, a history change), RFC 3339.
    pub last_active: String,
    /// Model provider, when an agent host said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Model, when an agent host said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The focus workspace's short name, when the session has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub focus: Option<String>,
    /// The focus folder (at most one: the focus, when it is an attached folder), kept so that
    /// it stays the session's focus, offline, across a restart of the server or the session's
    /// leaving memory: calls without `workspace` that it would take then fail, as they do while
    /// the server runs, rather than run in another workspace. A list, for what a later version
    /// may keep. An earlier version refuses a `session.toml` that has it (see
    /// `docs/operations.md`, downgrades).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub folders: Vec<KeptFolder>,
}

/// An attached folder as a session keeps it ([`SessionMeta::folders`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptFolder {
    /// Its short name in the session.
    pub name: String,
    /// Its URI.
    pub uri: String,
    /// The trust its user chose.
    pub trust: monad_protocol::wire::Trust,
    /// The tools its client offers (names; one a later version added is skipped when read).
    pub tools: Vec<String>,
    /// The device that attached it.
    pub device_id: String,
    /// The folder as the user gave it.
    pub path: String,
    /// Its workspace record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<String>,
    /// Its absolute path on its device, when its client said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folder: Option<String>,
    /// What network its commands get, when its client said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
}

/// One line of `audit.jsonl`: a tool call and what became of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditRecord {
    /// When the call started, RFC 3339.
    pub time: String,
    /// The call's id, shared with its artifacts.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// The workspace that ran it (absent when none was reached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// The path, pattern or command line it acted on.
    pub target: String,
    /// What was decided: `allowed`, `denied`, `timeout` (nobody answered the prompt),
    /// `cancelled` (the agent gave up), or `none` (refused before anyone decided: routing
    /// failed, bad arguments, a call that cannot run).
    pub decision: AuditDecision,
    /// Who decided (see [`Decider`]): `trust`, `policy` (pre-approved or remembered), `user` (a
    /// prompt), `timeout`, `no_terminal`, `server` (refused before reaching a workspace),
    /// `session` (a session tool), `client`.
    pub decided_by: Decider,
    /// `ok`, or the error code.
    pub outcome: AuditOutcome,
    /// Wall time of the call in milliseconds.
    pub duration_ms: u64,
}

/// What became of a call, as the audit log says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditDecision {
    /// It ran (whatever its outcome).
    Allowed,
    /// The user, or the client's policy, refused it.
    Denied,
    /// Nobody answered its prompt in time; it did not run.
    Timeout,
    /// The agent cancelled it before it finished.
    Cancelled,
    /// Nobody decided: it was refused before (routing failed, bad arguments, a call that cannot
    /// run), or the server's time limit ended it first.
    None,
}

impl AuditDecision {
    /// Every decision, in the order above.
    pub const ALL: [AuditDecision; 5] = [
        AuditDecision::Allowed,
        AuditDecision::Denied,
        AuditDecision::Timeout,
        AuditDecision::Cancelled,
        AuditDecision::None,
    ];

    /// The word in the audit log.
    pub fn as_str(self) -> &'static str {
        match self {
            AuditDecision::Allowed => "allowed",
            AuditDecision::Denied => "denied",
            AuditDecision::Timeout => "timeout",
            AuditDecision::Cancelled => "cancelled",
            AuditDecision::None => "none",
        }
    }
}

impl<'de> Deserialize<'de> for AuditDecision {
    /// A word this version does not know (from a newer server) reads as `none` rather than
    /// hiding the whole line.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let word = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        Ok(AuditDecision::ALL
            .into_iter()
            .find(|d| d.as_str() == word)
            .unwrap_or(AuditDecision::None))
    }
}

/// How a call ended, as the audit log says it: `ok`, or its error code.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AuditOutcome {
    /// It succeeded.
    Ok,
    /// It failed with this code.
    Failed(monad_protocol::ErrorCode),
    /// A word this version does not know (from a newer server), kept as it was.
    Other(String),
}

impl AuditOutcome {
    /// The word in the audit log.
    pub fn as_str(&self) -> &str {
        match self {
            AuditOutcome::Ok => "ok",
            AuditOutcome::Failed(code) => code.as_str(),
            AuditOutcome::Other(word) => word,
        }
    }
}

impl Serialize for AuditOutcome {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for AuditOutcome {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::IntoDeserializer;
        let word = String::deserialize(deserializer)?;
        if word == "ok" {
            return Ok(AuditOutcome::Ok);
        }
        let code: Result<monad_protocol::ErrorCode, serde::de::value::Error> =
            monad_protocol::ErrorCode::deserialize(word.as_str().into_deserializer());
        Ok(match code {
            Ok(code) => AuditOutcome::Failed(code),
            Err(_) => AuditOutcome::Other(word),
        })
    }
}

/// The kinds of artifact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArtifactKind {
    /// The output of a tool call (its JSON result or error), capped.
    ToolOutput,
    /// The unified diff of a write or edit.
    FileDiff,
    /// The session's history snapshot; one per session, each upload replaces it.
    SessionHistory,
}

impl ArtifactKind {
    /// The kind as written (`tool_output`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ArtifactKind::ToolOutput => "tool_output",
            ArtifactKind::FileDiff => "file_diff",
            ArtifactKind::SessionHistory => "session_history",
        }
    }
}

/// An artifact's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArtifactMeta {
    /// Id, unique in the session.
    pub id: String,
    /// The session.
    pub session: String,
    /// What it is.
    pub kind: ArtifactKind,
    /// The workspace of the call, for tool outputs and diffs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// The tool, for tool outputs and diffs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The call it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// When it was stored, RFC 3339.
    pub created_at: String,
    /// `application/json` or `text/x-diff`.
    pub content_type: String,
    /// Bytes stored.
    pub size: u64,
    /// True when the content was cut at the artifact cap.
    pub truncated: bool,
    /// The size before the cut.
    pub original_size: u64,
    /// What the workspace service API was told at upload (absent for what the executor
    /// recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload: Option<Box<Upload>>,
}

/// What an upload through the workspace service API (`POST /api/v1/workspaces/{id}/artifacts`)
/// names beside the content: seed 004's artifact record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Upload {
    /// The workspace record it was uploaded to.
    pub workspace_id: String,
    /// The task, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// The step, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_id: Option<String>,
    /// The name the uploader gave it (a file name, as the uploader wrote it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The uploader's metadata object, as given.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

/// What an upload's record (its id, session, kind, times and sizes) takes beside its content
/// and its [`Upload`], counted for each upload: an upload of no content still takes room.
pub const UPLOAD_RECORD_BYTES: u64 = 512;

impl Upload {
    /// What storing an upload of `content` bytes with this record takes, as
    /// `max_artifact_bytes_per_user` counts it: the content, what the uploader named and
    /// described (its metadata, up to 64 KiB, is stored with every artifact), and
    /// [`UPLOAD_RECORD_BYTES`].
    pub fn charged_bytes(&self, content: u64) -> u64 {
        let record = serde_json::to_vec(self).map_or(0, |v| v.len() as u64);
        content
            .saturating_add(record)
            .saturating_add(UPLOAD_RECORD_BYTES)
    }
}

impl ArtifactMeta {
    /// What this artifact counts against its owner's `max_artifact_bytes_per_user`: an
    /// upload's [`Upload::charged_bytes`]; nothing for what the recorder stored.
    pub fn charged_bytes(&self) -> u64 {
        self.upload
            .as_ref()
            .map_or(0, |upload| upload.charged_bytes(self.size))
    }
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Page<T> {
    /// The items of this page.
    pub items: Vec<T>,
    /// Opaque token for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// The most a conversation may hold, in bytes (its messages' text, [`history_bytes`]; an append
/// to the filesystem store counts its file, headers included, which holds more): far more than any model reads, and small enough that reading
/// it whole (as `history show` and the built-in agent do) stays cheap. Every write of it is
/// bounded here, whoever makes it (a client's append or replace, a prompt, the agent's answers,
/// an uploaded snapshot): each append of up to a request's size grew it without end.
pub const MAX_HISTORY_BYTES: u64 = 8 << 20;

/// The bytes a conversation of `messages` holds, as [`MAX_HISTORY_BYTES`] counts them: their
/// text.
pub(crate) fn history_bytes(messages: &[HistoryMessage]) -> u64 {
    messages.iter().map(|m| m.text.len() as u64).sum()
}

/// Refuses ([`StoreError::Full`]) a conversation of session `id` that would hold `bytes`, past
/// [`MAX_HISTORY_BYTES`].
pub(crate) fn history_fits(id: &str, bytes: u64) -> Result<(), StoreError> {
    if bytes <= MAX_HISTORY_BYTES {
        return Ok(());
    }
    Err(StoreError::Full(format!(
        "the conversation of session {id} would hold {bytes} bytes, past the {} MiB one holds \
         at most: clear it (`history clear`) or replace it with a shorter one (`history \
         replace`)",
        MAX_HISTORY_BYTES >> 20
    )))
}

/// Whether `user` may have one more workspace record, for a folder `is_it` finds among their
/// records if they have one already: the API's `local` workspaces and folders attached over
/// QUIC alike, within `max_workspaces_per_user` (`max`).
pub(crate) enum RecordRoom {
    /// It has one: nothing new is stored, whatever the quota.
    Known(WorkspaceRecord),
    /// Room for one: hold this while it is added, so that creations at once cannot pass the
    /// quota together.
    Free(std::sync::MutexGuard<'static, ()>),
    /// The user has this many, the most.
    Full(usize),
}

/// [`RecordRoom`] for `user`'s folder that `is_it` finds. One that has a record takes no lock.
pub(crate) fn record_room(
    store: &dyn Store,
    user: &str,
    max: usize,
    is_it: impl Fn(&WorkspaceRecord) -> bool,
) -> Result<RecordRoom, StoreError> {
    static CREATIONS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    if let Some(known) = store.records(Some(user))?.into_iter().find(|r| is_it(r)) {
        return Ok(RecordRoom::Known(known));
    }
    let creating = CREATIONS.lock().unwrap_or_else(|p| p.into_inner());
    // Again under the lock: one may have been made meanwhile.
    let records = store.records(Some(user))?;
    if let Some(known) = records.iter().find(|r| is_it(r)) {
        return Ok(RecordRoom::Known(known.clone()));
    }
    if records.len() >= max {
        return Ok(RecordRoom::Full(records.len()));
    }
    Ok(RecordRoom::Free(creating))
}

/// Sessions: metadata, history, audit log, per-session config.
pub trait SessionStore: Send + Sync {
    /// Creates a session; fails if the id exists.
    fn create(&self, meta: &SessionMeta) -> Result<(), StoreError>;
    /// Loads a session's metadata; `None` when there is no such session. A corrupt record is
    /// kept aside (renamed) and reported as [`StoreError::Invalid`].
    fn load(&self, id: &str) -> Result<Option<SessionMeta>, StoreError>;
    /// Replaces a session's metadata (atomically). PostgreSQL replaces only a session that
    /// exists (`NotFound` otherwise: a copy a host still had loaded does not make a deleted
    /// session again), and from a host that does not hold the session's lease only moves its
    /// last activity forward ([`PgStore`]'s `save`); the filesystem store, on its one host,
    /// writes what it is given.
    fn save(&self, meta: &SessionMeta) -> Result<(), StoreError>;
    /// Every session's metadata (unreadable ones are skipped with a warning).
    fn all_sessions(&self) -> Result<Vec<SessionMeta>, StoreError>;
    /// The metadata of `owner`'s sessions (a database selects them by its index on the owner,
    /// rather than every user's rows per listing).
    fn owner_sessions(&self, owner: &str) -> Result<Vec<SessionMeta>, StoreError> {
        Ok(self
            .all_sessions()?
            .into_iter()
            .filter(|m| m.owner == owner)
            .collect())
    }
    /// How many sessions `owner` has (a database counts them with an index on the owner).
    fn count_sessions(&self, owner: &str) -> Result<usize, StoreError> {
        Ok(self
            .all_sessions()?
            .iter()
            .filter(|m| m.owner == owner)
            .count())
    }
    /// Deletes a session and everything it keeps (workspace, history, audit, artifacts).
    fn delete(&self, id: &str) -> Result<(), StoreError>;
    /// The conversation. A corrupt `session.md` is kept aside and an empty one takes its place.
    fn history(&self, id: &str) -> Result<History, StoreError>;
    /// Appends one message (durable when this returns); refused ([`StoreError::Full`]) when
    /// the conversation would hold more than [`MAX_HISTORY_BYTES`], measured and written as one
    /// step.
    fn append(&self, id: &str, message: &HistoryMessage) -> Result<(), StoreError>;
    /// Replaces the whole conversation (atomically); refused as [`SessionStore::append`] is
    /// past [`MAX_HISTORY_BYTES`].
    fn replace(&self, id: &str, history: &History) -> Result<(), StoreError>;
    /// Sets the conversation's provider and model (`session.md`'s frontmatter), every message
    /// kept: one step with the appends, so that none made meanwhile is lost (as it would be by
    /// reading the conversation and replacing it).
    fn set_history_model(
        &self,
        id: &str,
        provider: Option<&str>,
        model: Option<&str>,
    ) -> Result<(), StoreError>;
    /// Appends audit records.
    fn audit(&self, id: &str, records: &[AuditRecord]) -> Result<(), StoreError>;
    /// The audit log (a torn last line, from a crash, is skipped).
    fn audit_log(&self, id: &str) -> Result<Vec<AuditRecord>, StoreError>;
    /// The per-session config overrides (`config.toml`), raw, with its path for messages.
    fn config_text(&self, id: &str) -> Result<Option<(String, String)>, StoreError>;
    /// How many audit records a session has (a database counts rows; the default reads the
    /// log).
    fn audit_count(&self, id: &str) -> Result<usize, StoreError> {
        Ok(self.audit_log(id)?.len())
    }
    /// `limit` audit records from position `offset` (0 = the oldest), and how many there are in
    /// all. The log is append-only, so a position names the same record for ever (a database
    /// keeps a sequence number per session and pages on it).
    fn audit_page(
        &self,
        id: &str,
        offset: usize,
        limit: usize,
    ) -> Result<(Vec<AuditRecord>, usize), StoreError> {
        let all = self.audit_log(id)?;
        let total = all.len();
        Ok((all.into_iter().skip(offset).take(limit).collect(), total))
    }
    /// Up to `limit` audit records after `cursor` (0: from the oldest), and the cursor after the
    /// last of them (`cursor` itself when there are none yet): how a log is read through and
    /// followed. The default's cursor is a position ([`SessionStore::audit_page`]); a database
    /// pages on its own sequence, each page found by its index rather than by counting the
    /// rows before it.
    fn audit_after(
        &self,
        id: &str,
        cursor: u64,
        limit: usize,
    ) -> Result<(Vec<AuditRecord>, u64), StoreError> {
        let from = usize::try_from(cursor).unwrap_or(usize::MAX);
        let (records, total) = self.audit_page(id, from, limit)?;
        let next = from.saturating_add(limit).min(total);
        Ok((records, (next as u64).max(cursor)))
    }
    /// The ids of `owner`'s sessions whose conversation contains every word of `query`
    /// (case-insensitive), most recently active first (a database answers it with one query
    /// over the messages; the default reads each conversation).
    fn search_sessions(&self, owner: &str, query: &str) -> Result<Vec<String>, StoreError> {
        let words: Vec<String> = query.split_whitespace().map(str::to_lowercase).collect();
        let mut owned: Vec<SessionMeta> = self
            .all_sessions()?
            .into_iter()
            .filter(|m| m.owner == owner)
            .collect();
        owned.sort_by(|a, b| b.last_active.cmp(&a.last_active).then(a.id.cmp(&b.id)));
        let mut hits = Vec::new();
        for meta in owned {
            let Ok(history) = self.history(&meta.id) else {
                continue;
            };
            if conversation_contains(&history, &words) {
                hits.push(meta.id);
            }
        }
        Ok(hits)
    }
    /// Whether the store answers [`SessionStore::search_sessions`] from the messages it holds
    /// (a database's query), so that a wrapper's cache of what conversations hold must not
    /// stand in for it: with several hosts on one database, a host's cache never saw the
    /// messages other hosts appended.
    fn searches_itself(&self) -> bool {
        false
    }
    /// The page of [`SessionStore::search_sessions`] from position `offset`, at most `limit`
    /// ids, and whether more follow. A store may stop reading once it has them (the default
    /// searches everything and cuts).
    fn search_page(
        &self,
        owner: &str,
        query: &str,
        offset: usize,
        limit: usize,
    ) -> Result<(Vec<String>, bool), StoreError> {
        let all = self.search_sessions(owner, query)?;
        let more = all.len() > offset.saturating_add(limit);
        Ok((all.into_iter().skip(offset).take(limit).collect(), more))
    }
}

/// Session ids (`default` or a UUID), record and artifact ids (`session_history`, UUIDs):
/// letters, digits, `-` and `_` only, at most 64, so that an id never names anything but one
/// entry of its directory, and is a safe blob key part.
pub fn check_id(id: &str) -> Result<(), StoreError> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!("`{id}` is not a session id")))
    }
}

/// Whether a conversation contains every one of `words` (lowercased), case-insensitively: what
/// [`SessionStore::search_sessions`] asks of each conversation.
pub fn conversation_contains(history: &History, words: &[String]) -> bool {
    let mut text = String::new();
    for m in &history.messages {
        text.push_str(&m.text.to_lowercase());
        text.push('\n');
    }
    words.iter().all(|w| text.contains(w.as_str()))
}

/// Workspace records.
pub trait WorkspaceStore: Send + Sync {
    /// The record of (user, device, path), created on first use; `uri` is updated.
    fn resolve_record(
        &self,
        user: &str,
        device_id: &str,
        path: &str,
        uri: &str,
    ) -> Result<WorkspaceRecord, StoreError>;
    /// One record.
    fn record(&self, id: &str) -> Result<Option<WorkspaceRecord>, StoreError>;
    /// Every record (of one user, when given), most recently active first.
    fn records(&self, user: Option<&str>) -> Result<Vec<WorkspaceRecord>, StoreError>;
    /// Notes activity of the folder in a session (`calls` new calls).
    fn touch_record(&self, id: &str, session: &str, calls: u64) -> Result<(), StoreError>;
    /// The sessions the folder was used in, most recent first, `limit` (1-100) a page.
    fn record_sessions(
        &self,
        id: &str,
        limit: usize,
        next: Option<&str>,
    ) -> Result<Page<WorkspaceSession>, StoreError>;
    /// The ids of `user`'s records whose folder was used in `session`, most recently active
    /// first (as [`WorkspaceStore::records`] orders them): what a session's view lists, found
    /// without paging through every record's sessions (a query of an index, or one pass).
    fn session_records(&self, user: &str, session: &str) -> Result<Vec<String>, StoreError> {
        let mut ids = Vec::new();
        for record in self.records(Some(user))? {
            let mut next: Option<String> = None;
            loop {
                let page = self.record_sessions(&record.id, 100, next.as_deref())?;
                if page.items.iter().any(|s| s.session == session) {
                    ids.push(record.id.clone());
                    break;
                }
                match page.next {
                    Some(n) => next = Some(n),
                    None => break,
                }
            }
        }
        Ok(ids)
    }
    /// Forgets a deleted session in every record.
    fn forget_session(&self, session: &str) -> Result<(), StoreError>;
    /// Adds a record made elsewhere (a `general` workspace of the workspace service API, which
    /// is never resolved by path); fails if its id exists.
    fn add_record(&self, record: &WorkspaceRecord) -> Result<(), StoreError>;
    /// Removes a record and its list of sessions.
    fn delete_record(&self, id: &str) -> Result<(), StoreError>;
}

/// Device bindings and per-user defaults. A binding is keyed by (user, device): the session
/// a user last used from a device. A default is keyed by user alone, in a place no device id
/// can name. (A database keeps them as `bindings (user, device_id) -> session` and
/// `defaults (user) -> session` rows.)
pub trait BindingStore: Send + Sync {
    /// The session `user` last used from `device_id`.
    fn bound_session(&self, user: &str, device_id: &str) -> Result<Option<String>, StoreError>;
    /// Binds `user`'s device to a session.
    fn bind(&self, user: &str, device_id: &str, session: &str) -> Result<(), StoreError>;
    /// The default session of `user` (for requests that name none, from no bound device).
    fn default_session(&self, user: &str) -> Result<Option<String>, StoreError>;
    /// Sets the default session of `user`.
    fn set_default_session(&self, user: &str, session: &str) -> Result<(), StoreError>;
    /// Removes every binding and default that names a session.
    fn unbind_session(&self, session: &str) -> Result<(), StoreError>;
    /// How many devices are bound to a session.
    fn devices_bound_to(&self, session: &str) -> Result<usize, StoreError>;
}

/// The folder registry of MCP roots (seed 002): per user, device and folder (its absolute path
/// on the device), the sessions worked in there with their last use and the active session
/// ([`crate::roots::FolderSessions`]). (PostgreSQL keeps it as `folder_sessions (user_name,
/// device_id, folder) -> (active, sessions)` rows, the sessions and their last use as JSON.)
pub trait FolderStore: Send + Sync {
    /// The entries of `user`'s device, as stored (the caller prunes stale sessions).
    fn folder_sessions(
        &self,
        user: &str,
        device: &str,
    ) -> Result<Vec<crate::roots::FolderSessions>, StoreError>;
    /// Stores an entry, replacing the one of the same (user, device, folder); an entry with no
    /// sessions removes it.
    fn save_folder_sessions(&self, entry: &crate::roots::FolderSessions) -> Result<(), StoreError>;
    /// Forgets sessions unused since [`crate::roots::STALE_AFTER_MS`] before `now` (Unix ms)
    /// in every entry, and entries left empty; returns how many entries lost sessions. A session's
    /// use is its entry's or its last activity in `last_active` (Unix ms by session id),
    /// whichever is later ([`crate::roots::FolderSessions::prune_by_activity`]).
    fn prune_folder_sessions(
        &self,
        now: u64,
        last_active: &std::collections::HashMap<String, u64>,
    ) -> Result<usize, StoreError>;
}

/// Artifacts and their index.
pub trait ArtifactStore: Send + Sync {
    /// Stores an artifact. For `session_history`, replaces the session's previous one.
    fn put_artifact(&self, meta: &ArtifactMeta, content: &[u8]) -> Result<(), StoreError>;
    /// Stores several artifacts, in order, with one result per artifact: what
    /// [`ArtifactStore::put_artifact`] would do for each. A store that can make a session's
    /// artifacts durable together (one sync for all of them instead of one each) does so; the
    /// recorder hands it whatever calls ended while it was writing the previous ones.
    fn put_artifacts(&self, artifacts: &[(ArtifactMeta, Vec<u8>)]) -> Vec<Result<(), StoreError>> {
        artifacts
            .iter()
            .map(|(meta, content)| self.put_artifact(meta, content))
            .collect()
    }
    /// A session's artifacts, oldest first.
    fn artifacts(&self, session: &str) -> Result<Vec<ArtifactMeta>, StoreError>;
    /// `limit` of a session's artifacts from position `offset` (0 = the oldest): what a
    /// listing shows without reading every artifact's metadata into memory (an upload's may
    /// hold 64 KiB).
    fn artifact_page(
        &self,
        session: &str,
        offset: usize,
        limit: usize,
    ) -> Result<ArtifactPage, StoreError> {
        let all = self.artifacts(session)?;
        let total = all.len();
        let artifacts: Vec<ArtifactMeta> = all.into_iter().skip(offset).take(limit).collect();
        Ok(ArtifactPage {
            end: offset.min(total) + artifacts.len(),
            artifacts,
            total,
        })
    }
    /// A session's latest `n` artifacts, oldest first: what its page shows.
    fn latest_artifacts(&self, session: &str, n: usize) -> Result<Vec<ArtifactMeta>, StoreError> {
        let total = self.artifact_page(session, usize::MAX, 0)?.total;
        Ok(self
            .artifact_page(session, total.saturating_sub(n), n)?
            .artifacts)
    }
    /// The artifacts of a session that came from the calls `calls` (by their call ids), oldest
    /// first: what a page showing some calls needs, without every artifact's metadata.
    fn call_artifacts(
        &self,
        session: &str,
        calls: &std::collections::HashSet<String>,
    ) -> Result<Vec<ArtifactMeta>, StoreError> {
        Ok(self
            .artifacts(session)?
            .into_iter()
            .filter(|a| a.call_id.as_ref().is_some_and(|c| calls.contains(c)))
            .collect())
    }
    /// What the artifacts uploaded to `session` (those named by `ids`, when given) count
    /// against their owner's quota ([`ArtifactMeta::charged_bytes`]), read without every
    /// artifact's metadata in memory at once (an upload's may hold 64 KiB, a tree many times
    /// that): a stream of the index, or a query of the ids named.
    fn uploaded_bytes_in(&self, session: &str, ids: Option<&[String]>) -> Result<u64, StoreError> {
        uploaded_bytes_by_pages(self, session, ids)
    }
    /// One artifact with its content.
    fn artifact(&self, session: &str, id: &str) -> Result<(ArtifactMeta, Vec<u8>), StoreError>;
    /// Removes artifacts of a session (ids it does not have are ignored).
    fn delete_artifacts(&self, session: &str, ids: &[String]) -> Result<(), StoreError>;
    /// The bytes of the artifacts uploaded through the API (those with an
    /// [`ArtifactMeta::upload`]) in `owner`'s sessions, when this store keeps that total (what
    /// `max_artifact_bytes_per_user` bounds); `None` when it does not, and the caller adds them
    /// up with [`uploaded_bytes`]. The server's store keeps it ([`observed::Observed`]); a
    /// database answers it with a sum over an index on the owner.
    fn uploaded_bytes(&self, owner: &str) -> Result<Option<u64>, StoreError> {
        let _ = owner;
        Ok(None)
    }
}

/// A page of a session's artifacts ([`ArtifactStore::artifact_page`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ArtifactPage {
    /// The page's artifacts, oldest first; one that cannot be read is left out.
    pub artifacts: Vec<ArtifactMeta>,
    /// The position after the page's last: where the next page starts, whatever was left out.
    pub end: usize,
    /// How many artifacts the session has.
    pub total: usize,
}

/// The bytes of the artifacts uploaded through the API in `owner`'s sessions, added up from
/// each session's index (a scan: [`ArtifactStore::uploaded_bytes`] is the cheap way).
pub fn uploaded_bytes(store: &dyn Store, owner: &str) -> Result<u64, StoreError> {
    let mut total = 0;
    for meta in store.all_sessions()? {
        if meta.owner == owner {
            total += session_uploaded_bytes(store, &meta.id, None)?;
        }
    }
    Ok(total)
}

/// The bytes of the artifacts uploaded through the API in `session` (those named by `ids`, when
/// given); 0 for a session that keeps none.
pub fn session_uploaded_bytes(
    store: &dyn Store,
    session: &str,
    ids: Option<&[String]>,
) -> Result<u64, StoreError> {
    match store.uploaded_bytes_in(session, ids) {
        Err(StoreError::NotFound(_)) => Ok(0),
        counted => counted,
    }
}

/// How many artifacts' metadata a walk over a session's artifacts holds at once
/// ([`each_artifact`]): each may be a tree of about 1 MiB.
pub const ARTIFACTS_READ_AT_ONCE: usize = 32;

/// [`ArtifactStore::uploaded_bytes_in`] by walking the session's artifacts a page at a time
/// ([`each_artifact`]): what a store without a better way answers it with.
pub fn uploaded_bytes_by_pages<S: ArtifactStore + ?Sized>(
    store: &S,
    session: &str,
    ids: Option<&[String]>,
) -> Result<u64, StoreError> {
    let mut charged = 0u64;
    each_artifact(store, session, |m| {
        if ids.is_none_or(|ids| ids.contains(&m.id)) {
            charged = charged.saturating_add(m.charged_bytes());
        }
        Ok(())
    })?;
    Ok(charged)
}

/// Calls `each` with every artifact of `session`, oldest first, reading them a page of
/// [`ARTIFACTS_READ_AT_ONCE`] at a time ([`Store::artifact_page`]) rather than all at once;
/// stops at `each`'s first error.
pub fn each_artifact<S: ArtifactStore + ?Sized>(
    store: &S,
    session: &str,
    mut each: impl FnMut(&ArtifactMeta) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let mut offset = 0;
    loop {
        let page = store.artifact_page(session, offset, ARTIFACTS_READ_AT_ONCE)?;
        for meta in &page.artifacts {
            each(meta)?;
        }
        if page.artifacts.is_empty() || page.end >= page.total {
            return Ok(());
        }
        offset = page.end;
    }
}

/// The store `config` names: `fs` (the filesystem store in the data dir) when `[store] url` is
/// absent, else PostgreSQL at that URL with artifact content in `<data_dir>/blobs`, or in the
/// S3 bucket of `[store] objects`. A bad URL, an unreachable database or object store (within
/// `connect_timeout_secs`), a missing bucket or a schema newer than this binary is an error
/// that names what failed, never a panic or a hang. `[store] objects` without PostgreSQL is
/// refused: the filesystem store keeps artifact content in its session directories.
///
/// With PostgreSQL, the orphan sweep runs in the background (see [`spawn_sweeper`]).
///
/// With PostgreSQL, this host is named in leases by a fresh id, the address of
/// `[cluster] advertise` and the lease time of `[cluster] lease_secs`, and its leases are
/// renewed in the background (see [`pg::lease::spawn_renewal`]).
///
/// Returns the store, the tokens kept beside it (`tokens.toml`, or the database's table), and
/// the PostgreSQL store again when it is one (for the leases).
pub fn open(
    config: &crate::ServerConfig,
    fs: std::sync::Arc<FsStore>,
) -> Result<Opened, crate::ServerError> {
    let objects = config.store.objects_url();
    let Some(url) = config.store.url.as_deref().filter(|u| !u.trim().is_empty()) else {
        if let Some(objects) = objects {
            return Err(crate::ServerError::Invalid(format!(
                "the store ([store] objects = {objects}): an object store needs the PostgreSQL \
                 store ([store] url); the filesystem store keeps artifact content in its data dir"
            )));
        }
        return Ok((fs, crate::auth::TokenStore::new(&config.data_dir), None));
    };
    let blobs = blobs_for(&config.store, &config.data_dir)?;
    let store = PgStore::connect(url, &config.data_dir, blobs, config.store.pool_options())
        .map_err(|e| crate::ServerError::Invalid(format!("the store ([store] url): {e}")))?
        .with_max_devices_per_user(config.quotas.max_devices_per_user)
        .with_host(pg::Host::of_machine(
            &pg::Host::machine_id(&config.data_dir)?,
            config.cluster.advertise.clone().unwrap_or_default(),
            config.cluster.lease_time(),
        ));
    tracing::info!("records are kept in PostgreSQL at {}", store.name());
    let store = std::sync::Arc::new(store);
    pg::lease::spawn_renewal(std::sync::Arc::downgrade(&store));
    spawn_sweeper(
        std::sync::Arc::downgrade(&store),
        std::time::Duration::from_secs(config.store.orphan_grace_secs),
        std::time::Duration::from_secs(config.store.sweep_interval_secs),
    );
    let tokens = crate::auth::TokenStore::in_postgres(&config.data_dir, store.clone());
    Ok((store.clone(), tokens, Some(store)))
}

/// What [`open`] opened: the store, the tokens, and the PostgreSQL store when it is one.
pub type Opened = (
    std::sync::Arc<dyn Store>,
    crate::auth::TokenStore,
    Option<std::sync::Arc<PgStore>>,
);

/// Where the PostgreSQL store keeps artifact content by `settings`: the object store
/// `[store] objects` names, connected (and its bucket listed once), else `<data_dir>/blobs`.
/// Both the server and the offline `session`/`workspace` commands take it from here, so that
/// they read and delete the same content.
pub fn blobs_for(
    settings: &crate::settings::StoreSettings,
    data_dir: &std::path::Path,
) -> Result<std::sync::Arc<dyn Blobs>, crate::ServerError> {
    Ok(match settings.objects_url() {
        Some(objects) => {
            let blobs = S3Blobs::connect(objects, settings.aws_vars(), settings.s3_options())
                .map_err(|e| {
                    crate::ServerError::Invalid(format!("the store ([store] objects): {e}"))
                })?;
            tracing::info!("artifact content is kept in {}", blobs.name());
            std::sync::Arc::new(blobs)
        }
        None => std::sync::Arc::new(FsBlobs::new(&data_dir.join("blobs"))),
    })
}

/// Sweeps `store`'s orphaned artifact content ([`PgStore::sweep_orphans`] with `grace`), and
/// this host's directories of sessions deleted on another host ([`PgStore::sweep_session_dirs`]),
/// on a thread of its own: at once, then every `interval` (never again when it is zero), until the
/// store is dropped. A failed sweep is logged and tried again at the next interval.
pub fn spawn_sweeper(
    store: std::sync::Weak<PgStore>,
    grace: std::time::Duration,
    interval: std::time::Duration,
) {
    let sweep = move |store: &std::sync::Weak<PgStore>| -> bool {
        let Some(store) = store.upgrade() else {
            return false;
        };
        match store.sweep_orphans(grace) {
            Ok(swept) if swept.removed > 0 => tracing::info!(
                "orphan sweep: removed {} of {} artifact contents no row names",
                swept.removed,
                swept.listed
            ),
            Ok(_) => tracing::debug!("orphan sweep: nothing to remove"),
            Err(e) => tracing::warn!("orphan sweep failed (tried again later): {e}"),
        }
        match store.sweep_session_dirs(grace) {
            Ok(0) => {}
            Ok(removed) => tracing::info!(
                "orphan sweep: removed the directories of {removed} sessions deleted on another \
                 host"
            ),
            Err(e) => tracing::warn!("the sweep of deleted sessions' directories failed: {e}"),
        }
        true
    };
    let spawned = std::thread::Builder::new()
        .name("orphan-sweep".into())
        .spawn(move || {
            if !sweep(&store) || interval.is_zero() {
                return;
            }
            // Wakes every second to notice a dropped store; sweeps once per interval.
            let tick = std::time::Duration::from_secs(1).min(interval);
            let mut waited = std::time::Duration::ZERO;
            loop {
                std::thread::sleep(tick);
                if store.strong_count() == 0 {
                    return;
                }
                waited += tick;
                if waited < interval {
                    continue;
                }
                waited = std::time::Duration::ZERO;
                if !sweep(&store) {
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("the orphan sweep did not start: {e}");
    }
}

/// The stores a server runs on.
pub trait Store:
    SessionStore + WorkspaceStore + BindingStore + ArtifactStore + FolderStore
{
}

impl<T: SessionStore + WorkspaceStore + BindingStore + ArtifactStore + FolderStore> Store for T {}

#[cfg(test)]
mod tests {
    use super::AuditOutcome;
    use monad_protocol::ErrorCode;

    #[test]
    fn an_audit_outcome_is_written_as_the_word_it_always_was_and_read_back() {
        for (outcome, word) in [
            (AuditOutcome::Ok, "ok"),
            (AuditOutcome::Failed(ErrorCode::Denied), "denied"),
            (
                AuditOutcome::Failed(ErrorCode::WorkspaceDisconnected),
                "workspace_disconnected",
            ),
            (
                AuditOutcome::Other("from_a_newer_server".into()),
                "from_a_newer_server",
            ),
        ] {
            let json = serde_json::to_value(&outcome).unwrap();
            assert_eq!(json, serde_json::json!(word));
            assert_eq!(
                serde_json::from_value::<AuditOutcome>(json).unwrap(),
                outcome
            );
        }
    }
}
