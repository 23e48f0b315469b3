//! What `monad-server session ...` and `monad-server workspace ...` do, on the data directory.
//!
//! Reading works while the server runs. Deleting (`session delete`, `session gc`) needs the
//! server stopped: a running server keeps sessions and workspace records in memory and would
//! write a deleted session back, so those commands take the data directory's lock
//! (`server.lock`, held by a running server) and refuse when they cannot.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use monad_protocol::wire::{History, WorkspaceRecord, WorkspaceSession};
use nix::fcntl::{Flock, FlockArg};
use serde::Serialize;

use crate::session::Registry;
use crate::settings::Layers;
use crate::store::{
    ArtifactMeta, ArtifactStore, BindingStore, FsStore, Page, SessionMeta, SessionStore, Store,
    StoreError, WorkspaceStore,
};

/// The data directory's lock: held by a running server for its whole life.
#[derive(Debug)]
pub struct DataLock {
    _lock: Flock<File>,
}

impl DataLock {
    /// Takes the lock on `<data_dir>/server.lock`, or says who holds it.
    pub fn take(data_dir: &Path) -> Result<DataLock, String> {
        crate::fsutil::create_private_dir(data_dir)
            .map_err(|e| format!("{}: {e}", data_dir.display()))?;
        let path = data_dir.join("server.lock");
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(crate::fsutil::PRIVATE_FILE)
            .open(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Flock::lock(file, FlockArg::LockExclusiveNonblock)
            .map(|lock| DataLock { _lock: lock })
            .map_err(|_| {
                format!(
                    "a monad-server is running on {} (it holds {}); stop it first",
                    data_dir.display(),
                    path.display()
                )
            })
    }
}

/// A session as `session show` reports it.
#[derive(Debug, Clone, Serialize)]
pub struct SessionReport {
    /// Its metadata.
    pub meta: SessionMeta,
    /// Messages in `session.md`.
    pub messages: usize,
    /// Tool calls in the audit log.
    pub calls: usize,
    /// Of which denied.
    pub denied: usize,
    /// Artifacts stored.
    pub artifacts: usize,
    /// The workspace records (attached folders) used in it.
    pub workspaces: Vec<WorkspaceRecord>,
    /// Devices bound to it.
    pub bound_devices: usize,
}

/// Administration of a data directory.
pub struct Admin {
    data_dir: PathBuf,
    store: Arc<FsStore>,
}

impl Admin {
    /// Administration of `data_dir`.
    pub fn new(data_dir: &Path) -> Admin {
        Admin {
            data_dir: data_dir.to_path_buf(),
            store: Arc::new(FsStore::new(data_dir)),
        }
    }

    /// Every session, most recently active first.
    pub fn sessions(&self) -> Result<Vec<SessionMeta>, StoreError> {
        let mut all = self.store.all_sessions()?;
        all.sort_by(|a, b| b.last_active.cmp(&a.last_active).then(a.id.cmp(&b.id)));
        Ok(all)
    }

    /// One session's report.
    pub fn show(&self, id: &str) -> Result<SessionReport, StoreError> {
        let meta = self
            .store
            .load(id)?
            .ok_or_else(|| StoreError::NotFound(format!("session {id}")))?;
        let history = self.store.history(id)?;
        let audit = self.store.audit_log(id)?;
        let mut workspaces = Vec::new();
        for record in self.store.records(None)? {
            if self
                .all_sessions_of(&record.id)?
                .iter()
                .any(|s| s.session == id)
            {
                workspaces.push(record);
            }
        }
        Ok(SessionReport {
            messages: history.messages.len(),
            calls: audit.len(),
            denied: audit
                .iter()
                .filter(|a| a.decision == crate::store::AuditDecision::Denied)
                .count(),
            artifacts: self.store.artifacts(id)?.len(),
            workspaces,
            bound_devices: self.store.devices_bound_to(id)?,
            meta,
        })
    }

    fn all_sessions_of(&self, record: &str) -> Result<Vec<WorkspaceSession>, StoreError> {
        let mut out = Vec::new();
        let mut next = None;
        loop {
            let page = self.store.record_sessions(record, 100, next.as_deref())?;
            out.extend(page.items);
            match page.next {
                Some(token) => next = Some(token),
                None => return Ok(out),
            }
        }
    }

    /// A session's conversation.
    pub fn history(&self, id: &str) -> Result<History, StoreError> {
        if self.store.load(id)?.is_none() {
            return Err(StoreError::NotFound(format!("session {id}")));
        }
        self.store.history(id)
    }

    /// A session's artifacts.
    pub fn artifacts(&self, id: &str) -> Result<Vec<ArtifactMeta>, StoreError> {
        if self.store.load(id)?.is_none() {
            return Err(StoreError::NotFound(format!("session {id}")));
        }
        self.store.artifacts(id)
    }

    /// One artifact.
    pub fn artifact(
        &self,
        id: &str,
        artifact: &str,
    ) -> Result<(ArtifactMeta, Vec<u8>), StoreError> {
        self.store.artifact(id, artifact)
    }

    /// Workspace records, most recently active first.
    pub fn workspaces(&self) -> Result<Vec<WorkspaceRecord>, StoreError> {
        self.store.records(None)
    }

    /// One workspace record and a page of its sessions.
    pub fn workspace(
        &self,
        id: &str,
        limit: usize,
        next: Option<&str>,
    ) -> Result<(WorkspaceRecord, Page<WorkspaceSession>), StoreError> {
        let record = self
            .store
            .record(id)?
            .ok_or_else(|| StoreError::NotFound(format!("workspace record {id}")))?;
        Ok((record, self.store.record_sessions(id, limit, next)?))
    }

    fn registry(&self) -> Registry {
        let store: Arc<dyn Store> = self.store.clone();
        Registry::new(&self.data_dir, store, Layers::default())
    }

    /// Deletes a session (the server must be stopped).
    pub fn delete(&self, id: &str) -> Result<(), String> {
        let _lock = DataLock::take(&self.data_dir)?;
        self.registry().delete(id).map_err(|e| e.message)
    }

    /// Deletes sessions unused for `days` (never `default`; the server must be stopped).
    pub fn gc(&self, days: u64) -> Result<Vec<String>, String> {
        let _lock = DataLock::take(&self.data_dir)?;
        self.registry()
            .gc(Duration::from_secs(days.saturating_mul(86_400)))
            .map_err(|e| e.message)
    }
}
