//! Sessions: each one's primary workspace on the server and the folders attached to it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use monad_protocol::wire::{Host, SessionInfo, Trust, WorkspaceInfo};
use monad_protocol::{ErrorCode, ToolError, ToolName};
use monad_sandbox::{ExecPolicy, Limits, Sandbox};
use serde::{Deserialize, Serialize};

use crate::fsutil::{now_rfc3339, write_atomic};

/// The id of the well-known session.
pub const DEFAULT_SESSION: &str = "default";

/// What `session.toml` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionMeta {
    /// `default` or a UUID.
    pub id: String,
    /// The user who owns it.
    pub owner: String,
    /// Creation time, RFC 3339.
    pub created_at: String,
}

/// A live connection to the client that attached a folder.
#[derive(Debug, Clone)]
pub struct ClientLink {
    /// The client's connection; the server opens a stream on it per call.
    pub conn: quinn::Connection,
    /// The id of the client's attach request, which names the folder on that connection.
    pub attachment: u64,
    /// Distinguishes this attachment from an earlier one of the same folder.
    pub generation: u64,
}

/// A folder attached to a session.
#[derive(Debug, Clone)]
pub struct Attached {
    /// Short name, unique in the session.
    pub name: String,
    /// `<client-name>:<path as given>`.
    pub uri: String,
    /// Trust level the client's user chose.
    pub trust: Trust,
    /// Tools the client offers for it.
    pub tools: Vec<ToolName>,
    /// The device that attached it.
    pub device_id: String,
    /// The path as the user gave it.
    pub path: String,
    /// The connection to its client; `None` while disconnected.
    pub link: Option<ClientLink>,
}

/// A session: its primary workspace and attached folders.
#[derive(Debug)]
pub struct Session {
    /// `default` or a UUID.
    pub id: String,
    /// The owning user.
    pub owner: String,
    /// Creation time, RFC 3339.
    pub created_at: String,
    /// The primary workspace (`sessions/<id>/workspace`, trust full).
    pub primary: Arc<Sandbox>,
    attached: Mutex<Vec<Attached>>,
    changes: tokio::sync::watch::Sender<u64>,
}

/// What routing and listing see of a workspace at one moment.
#[derive(Debug, Clone)]
pub enum Target {
    /// The session's own folder on the server.
    Primary(Arc<Sandbox>),
    /// An attached folder, through its client (`None` while offline).
    Attached(Option<ClientLink>),
}

/// A workspace as of one moment: what it is and how to reach it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// As listed to agents.
    pub info: WorkspaceInfo,
    /// How to run tools there.
    pub target: Target,
}

impl Session {
    /// The URI of the primary workspace.
    pub fn primary_uri(&self) -> String {
        format!("server:/sessions/{}", self.id)
    }

    /// Every workspace, primary first, then attached in attach order.
    pub fn workspaces(&self) -> Vec<Snapshot> {
        let mut out = vec![Snapshot {
            info: WorkspaceInfo {
                name: "primary".into(),
                uri: self.primary_uri(),
                trust: Trust::Full,
                host: Host::Server,
                online: true,
                tools: ToolName::WORKSPACE_TOOLS.to_vec(),
            },
            target: Target::Primary(self.primary.clone()),
        }];
        let attached = self.attached.lock().unwrap_or_else(|p| p.into_inner());
        out.extend(attached.iter().map(|a| Snapshot {
            info: WorkspaceInfo {
                name: a.name.clone(),
                uri: a.uri.clone(),
                trust: a.trust,
                host: Host::Client,
                online: a.link.is_some(),
                tools: a.tools.clone(),
            },
            target: Target::Attached(a.link.clone()),
        }));
        out
    }

    /// The session as listed to its owner.
    pub fn info(&self) -> SessionInfo {
        SessionInfo {
            id: self.id.clone(),
            owner: self.owner.clone(),
            created_at: self.created_at.clone(),
            workspaces: self.workspaces().into_iter().map(|s| s.info).collect(),
        }
    }

    /// Attaches a folder (or re-attaches it after a reconnect: same device and path get their
    /// old name back). Returns the workspace as listed.
    pub fn attach(&self, mut folder: Attached, wanted: Option<&str>) -> WorkspaceInfo {
        let mut attached = self.attached.lock().unwrap_or_else(|p| p.into_inner());
        let info = if let Some(existing) = attached
            .iter_mut()
            .find(|a| a.device_id == folder.device_id && a.path == folder.path)
        {
            existing.link = folder.link;
            existing.trust = folder.trust;
            existing.tools = folder.tools;
            existing.uri = folder.uri;
            existing.clone()
        } else {
            let base = sanitize_name(wanted.unwrap_or(&folder.name));
            let taken = |n: &str| n == "primary" || attached.iter().any(|a| a.name == n);
            let mut name = base.clone();
            let mut n = 2;
            while taken(&name) {
                name = format!("{base}-{n}");
                n += 1;
            }
            folder.name = name;
            attached.push(folder.clone());
            folder
        };
        drop(attached);
        self.changed();
        WorkspaceInfo {
            name: info.name,
            uri: info.uri,
            trust: info.trust,
            host: Host::Client,
            online: true,
            tools: info.tools,
        }
    }

    /// Marks the folder attached under `generation` as disconnected. A newer attachment of the
    /// same folder (after a reconnect) is left alone.
    pub fn detach(&self, generation: u64) {
        let mut attached = self.attached.lock().unwrap_or_else(|p| p.into_inner());
        let mut changed = false;
        for a in attached.iter_mut() {
            if a.link.as_ref().is_some_and(|l| l.generation == generation) {
                a.link = None;
                changed = true;
            }
        }
        drop(attached);
        if changed {
            self.changed();
        }
    }

    /// A receiver that ticks whenever the workspace list changes.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n += 1);
    }
}

/// A short workspace name from a folder name: no slashes or control characters, at most 64
/// characters, never empty.
fn sanitize_name(raw: &str) -> String {
    let name: String = raw
        .chars()
        .filter(|c| !c.is_control() && *c != '/' && *c != '\\' && *c != ':')
        .take(64)
        .collect();
    let name = name.trim().trim_matches('.').to_owned();
    if name.is_empty() {
        "folder".to_owned()
    } else {
        name
    }
}

/// All sessions, loaded from disk on first use.
#[derive(Debug)]
pub struct Registry {
    dir: PathBuf,
    limits: Limits,
    exec: ExecPolicy,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
}

impl Registry {
    /// Sessions under `<data_dir>/sessions`, whose primary workspaces get these limits and policy.
    pub fn new(data_dir: &Path, limits: Limits, exec: ExecPolicy) -> Registry {
        Registry {
            dir: data_dir.join("sessions"),
            limits,
            exec,
            sessions: Mutex::new(HashMap::new()),
        }
    }

    /// Opens session `id` for `user`: loads it, or creates it when no session has that id yet.
    /// A session of another user is refused.
    pub fn open(&self, id: &str, user: &str) -> Result<Arc<Session>, ToolError> {
        let id = normalize_id(id)?;
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(session) = sessions.get(&id) {
            return owned_by(session, user).map(|()| session.clone());
        }
        let dir = self.dir.join(&id);
        let meta_path = dir.join("session.toml");
        let meta = match std::fs::read_to_string(&meta_path) {
            Ok(text) => toml::from_str::<SessionMeta>(&text).map_err(|e| {
                ToolError::new(ErrorCode::Internal, format!("{}: {e}", meta_path.display()))
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let meta = SessionMeta {
                    id: id.clone(),
                    owner: user.to_owned(),
                    created_at: now_rfc3339(),
                };
                std::fs::create_dir_all(dir.join("workspace")).map_err(internal)?;
                let text = toml::to_string(&meta).map_err(internal)?;
                write_atomic(&meta_path, text.as_bytes(), 0o644)
                    .map_err(|e| ToolError::new(ErrorCode::Internal, e.to_string()))?;
                meta
            }
            Err(e) => return Err(internal(e)),
        };
        std::fs::create_dir_all(dir.join("workspace")).map_err(internal)?;
        let primary = Sandbox::open(
            &dir.join("workspace"),
            self.limits.clone(),
            self.exec.clone(),
        )
        .map_err(internal)?;
        let session = Arc::new(Session {
            id: meta.id,
            owner: meta.owner,
            created_at: meta.created_at,
            primary: Arc::new(primary),
            attached: Mutex::new(Vec::new()),
            changes: tokio::sync::watch::channel(0).0,
        });
        owned_by(&session, user)?;
        sessions.insert(id, session.clone());
        Ok(session)
    }

    /// The sessions `user` owns, on disk or in memory.
    pub fn list(&self, user: &str) -> Vec<SessionInfo> {
        let mut ids: Vec<String> = std::fs::read_dir(&self.dir)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .filter(|e| e.path().join("session.toml").is_file())
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        ids.sort();
        ids.into_iter()
            .filter_map(|id| self.open(&id, user).ok())
            .map(|s| s.info())
            .collect()
    }
}

fn owned_by(session: &Session, user: &str) -> Result<(), ToolError> {
    if session.owner == user {
        Ok(())
    } else {
        Err(ToolError::new(
            ErrorCode::Unauthorized,
            format!("session `{}` belongs to another user", session.id),
        ))
    }
}

/// `default`, or a UUID in its canonical lowercase hyphenated form.
pub fn normalize_id(id: &str) -> Result<String, ToolError> {
    if id == DEFAULT_SESSION {
        return Ok(id.to_owned());
    }
    uuid::Uuid::parse_str(id)
        .map(|u| u.hyphenated().to_string())
        .map_err(|_| {
            ToolError::new(
                ErrorCode::InvalidArguments,
                format!("session id `{id}` is neither `default` nor a UUID"),
            )
        })
}

fn internal(e: impl std::fmt::Display) -> ToolError {
    ToolError::new(ErrorCode::Internal, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> (tempfile::TempDir, Registry) {
        let dir = tempfile::tempdir().unwrap();
        let reg = Registry::new(dir.path(), Limits::default(), ExecPolicy::default());
        (dir, reg)
    }

    #[test]
    fn sessions_are_created_reused_and_owned() {
        let (dir, reg) = registry();
        let s = reg.open("default", "ana").unwrap();
        assert!(dir.path().join("sessions/default/workspace").is_dir());
        assert!(dir.path().join("sessions/default/session.toml").is_file());
        assert!(Arc::ptr_eq(&s, &reg.open("default", "ana").unwrap()));
        let err = reg.open("default", "ben").unwrap_err();
        assert_eq!(err.code, ErrorCode::Unauthorized);
        // After a restart (a new registry), ownership still holds.
        let reg2 = Registry::new(dir.path(), Limits::default(), ExecPolicy::default());
        assert_eq!(
            reg2.open("default", "ben").unwrap_err().code,
            ErrorCode::Unauthorized
        );
        assert_eq!(reg2.list("ana").len(), 1);
        assert!(reg2.list("ben").is_empty());
    }

    #[test]
    fn session_ids_must_be_default_or_uuids() {
        let (_dir, reg) = registry();
        for bad in ["../x", "", "abc", "default/../../etc"] {
            assert_eq!(
                reg.open(bad, "ana").unwrap_err().code,
                ErrorCode::InvalidArguments,
                "{bad}"
            );
        }
        let upper = "6F9619FF-8B86-D011-B42D-00C04FC964FF";
        let s = reg.open(upper, "ana").unwrap();
        assert_eq!(s.id, upper.to_lowercase());
    }

    #[test]
    fn attach_names_are_unique_and_reconnects_keep_theirs() {
        let (_dir, reg) = registry();
        let s = reg.open("default", "ana").unwrap();
        let folder = |device: &str, path: &str| Attached {
            name: "monad".into(),
            uri: format!("{device}:{path}"),
            trust: Trust::Restricted,
            tools: vec![ToolName::ReadFile],
            device_id: device.into(),
            path: path.into(),
            link: None,
        };
        assert_eq!(s.attach(folder("d1", "~/a/monad"), None).name, "monad");
        assert_eq!(s.attach(folder("d2", "~/b/monad"), None).name, "monad-2");
        assert_eq!(
            s.attach(folder("d1", "~/c"), Some("primary")).name,
            "primary-2"
        );
        assert_eq!(
            s.attach(folder("d1", "~/a/monad"), None).name,
            "monad",
            "re-attach"
        );
        let names: Vec<String> = s.workspaces().into_iter().map(|w| w.info.name).collect();
        assert_eq!(names, ["primary", "monad", "monad-2", "primary-2"]);
    }
}
