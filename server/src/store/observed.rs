//! A store that tells the [`Feed`] what it wrote: every [`Store`] method goes to the inner store
//! unchanged; after an audit append, a history change or a new artifact succeeds, the session's
//! followers get an [`Event`]. This is the one hook the live view needs, wherever the write
//! comes from (the executor's recorder, a client's history request, the built-in agent, the
//! HTTP API).
//!
//! It also keeps, per user, the bytes of the artifacts they uploaded through the API
//! ([`ArtifactStore::uploaded_bytes`], what `max_artifact_bytes_per_user` bounds): counted from
//! the store the first time a user's total is asked for, then kept up to date by every upload and
//! delete, which all pass here. Nothing is counted for the artifacts the recorder writes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{
    ArtifactKind, ArtifactMeta, ArtifactStore, AuditRecord, BindingStore, FolderStore, History,
    HistoryMessage, Page, SessionMeta, SessionStore, Store, StoreError, WorkspaceRecord,
    WorkspaceSession, WorkspaceStore,
};
use crate::feed::{Event, Feed};

/// The inner store, observed.
pub struct Observed {
    inner: Arc<dyn Store>,
    feed: Feed,
    /// Bytes uploaded through the API, per user whose total was asked for. Held while an
    /// upload or a delete changes it, so that the total and the store agree.
    uploads: Mutex<HashMap<String, u64>>,
}

impl Observed {
    /// The owner of `session`, when their total is kept (nothing is read when no total is).
    fn tracked_owner(
        &self,
        totals: &HashMap<String, u64>,
        session: &str,
    ) -> Result<Option<String>, StoreError> {
        if totals.is_empty() {
            return Ok(None);
        }
        Ok(self
            .inner
            .load(session)?
            .map(|m| m.owner)
            .filter(|owner| totals.contains_key(owner)))
    }

    /// Runs `write`, which adds `added` uploaded bytes to `session` and frees those `freed`
    /// finds there (read before it): the owner's total, when kept, follows. When the change
    /// cannot be told, every total is dropped, to be counted again on its next use.
    fn accounted(
        &self,
        session: &str,
        freed: impl FnOnce(&dyn Store) -> Result<u64, StoreError>,
        added: u64,
        write: impl FnOnce() -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut totals = self.uploads.lock().unwrap_or_else(|p| p.into_inner());
        let owner = self.tracked_owner(&totals, session);
        let bytes = match &owner {
            Ok(Some(_)) => freed(self.inner.as_ref()),
            _ => Ok(0),
        };
        write()?;
        match (owner, bytes) {
            (Ok(None), _) => {}
            (Ok(Some(owner)), Ok(bytes)) => {
                if let Some(total) = totals.get_mut(&owner) {
                    *total = total.saturating_sub(bytes).saturating_add(added);
                }
            }
            _ => totals.clear(),
        }
        Ok(())
    }
}

impl SessionStore for Observed {
    fn create(&self, meta: &SessionMeta) -> Result<(), StoreError> {
        self.inner.create(meta)
    }
    fn load(&self, id: &str) -> Result<Option<SessionMeta>, StoreError> {
        self.inner.load(id)
    }
    fn save(&self, meta: &SessionMeta) -> Result<(), StoreError> {
        self.inner.save(meta)
    }
    fn all_sessions(&self) -> Result<Vec<SessionMeta>, StoreError> {
        self.inner.all_sessions()
    }
    fn count_sessions(&self, owner: &str) -> Result<usize, StoreError> {
        self.inner.count_sessions(owner)
    }
    fn delete(&self, id: &str) -> Result<(), StoreError> {
        self.accounted(
            id,
            |store| super::session_uploaded_bytes(store, id, None),
            0,
            || self.inner.delete(id),
        )
    }
    fn history(&self, id: &str) -> Result<History, StoreError> {
        self.inner.history(id)
    }
    fn append(&self, id: &str, message: &HistoryMessage) -> Result<(), StoreError> {
        self.inner.append(id, message)?;
        self.feed.publish_with(id, || Event::Message {
            message: message.clone(),
        });
        Ok(())
    }
    fn replace(&self, id: &str, history: &History) -> Result<(), StoreError> {
        self.inner.replace(id, history)?;
        self.feed.publish(id, Event::History);
        Ok(())
    }
    fn audit(&self, id: &str, records: &[AuditRecord]) -> Result<(), StoreError> {
        self.inner.audit(id, records)?;
        for record in records {
            self.feed.publish_with(id, || Event::Call {
                record: record.clone(),
            });
        }
        Ok(())
    }
    fn audit_log(&self, id: &str) -> Result<Vec<AuditRecord>, StoreError> {
        self.inner.audit_log(id)
    }
    fn config_text(&self, id: &str) -> Result<Option<(String, String)>, StoreError> {
        self.inner.config_text(id)
    }
    fn audit_count(&self, id: &str) -> Result<usize, StoreError> {
        self.inner.audit_count(id)
    }
    fn audit_page(
        &self,
        id: &str,
        offset: usize,
        limit: usize,
    ) -> Result<(Vec<AuditRecord>, usize), StoreError> {
        self.inner.audit_page(id, offset, limit)
    }
    fn search_sessions(&self, owner: &str, query: &str) -> Result<Vec<String>, StoreError> {
        self.inner.search_sessions(owner, query)
    }
}

impl WorkspaceStore for Observed {
    fn resolve_record(
        &self,
        user: &str,
        device_id: &str,
        path: &str,
        uri: &str,
    ) -> Result<WorkspaceRecord, StoreError> {
        self.inner.resolve_record(user, device_id, path, uri)
    }
    fn record(&self, id: &str) -> Result<Option<WorkspaceRecord>, StoreError> {
        self.inner.record(id)
    }
    fn records(&self, user: Option<&str>) -> Result<Vec<WorkspaceRecord>, StoreError> {
        self.inner.records(user)
    }
    fn touch_record(&self, id: &str, session: &str, calls: u64) -> Result<(), StoreError> {
        self.inner.touch_record(id, session, calls)
    }
    fn record_sessions(
        &self,
        id: &str,
        limit: usize,
        next: Option<&str>,
    ) -> Result<Page<WorkspaceSession>, StoreError> {
        self.inner.record_sessions(id, limit, next)
    }
    fn forget_session(&self, session: &str) -> Result<(), StoreError> {
        self.inner.forget_session(session)
    }
    fn add_record(&self, record: &WorkspaceRecord) -> Result<(), StoreError> {
        self.inner.add_record(record)
    }
    fn delete_record(&self, id: &str) -> Result<(), StoreError> {
        self.inner.delete_record(id)
    }
}

impl BindingStore for Observed {
    fn bound_session(&self, user: &str, device_id: &str) -> Result<Option<String>, StoreError> {
        self.inner.bound_session(user, device_id)
    }
    fn bind(&self, user: &str, device_id: &str, session: &str) -> Result<(), StoreError> {
        self.inner.bind(user, device_id, session)
    }
    fn default_session(&self, user: &str) -> Result<Option<String>, StoreError> {
        self.inner.default_session(user)
    }
    fn set_default_session(&self, user: &str, session: &str) -> Result<(), StoreError> {
        self.inner.set_default_session(user, session)
    }
    fn unbind_session(&self, session: &str) -> Result<(), StoreError> {
        self.inner.unbind_session(session)
    }
    fn devices_bound_to(&self, session: &str) -> Result<usize, StoreError> {
        self.inner.devices_bound_to(session)
    }
}

impl FolderStore for Observed {
    fn folder_sessions(
        &self,
        user: &str,
        device: &str,
    ) -> Result<Vec<crate::roots::FolderSessions>, StoreError> {
        self.inner.folder_sessions(user, device)
    }
    fn save_folder_sessions(&self, entry: &crate::roots::FolderSessions) -> Result<(), StoreError> {
        self.inner.save_folder_sessions(entry)
    }
    fn prune_folder_sessions(&self, now: u64) -> Result<usize, StoreError> {
        self.inner.prune_folder_sessions(now)
    }
}

impl ArtifactStore for Observed {
    fn put_artifact(&self, meta: &ArtifactMeta, content: &[u8]) -> Result<(), StoreError> {
        if meta.upload.is_some() {
            // An upload replaces an artifact of the same id (the session's history snapshot):
            // the owner's total loses the old one's bytes and gains the new one's.
            let kind = meta.kind;
            self.accounted(
                &meta.session,
                |store| match kind {
                    ArtifactKind::SessionHistory => super::session_uploaded_bytes(
                        store,
                        &meta.session,
                        Some(std::slice::from_ref(&meta.id)),
                    ),
                    ArtifactKind::ToolOutput | ArtifactKind::FileDiff => Ok(0),
                },
                meta.size,
                || self.inner.put_artifact(meta, content),
            )?;
        } else {
            self.inner.put_artifact(meta, content)?;
        }
        self.feed.publish_with(&meta.session, || Event::Artifact {
            meta: Box::new(meta.clone()),
        });
        Ok(())
    }
    fn artifacts(&self, session: &str) -> Result<Vec<ArtifactMeta>, StoreError> {
        self.inner.artifacts(session)
    }
    fn artifact(&self, session: &str, id: &str) -> Result<(ArtifactMeta, Vec<u8>), StoreError> {
        self.inner.artifact(session, id)
    }
    fn delete_artifacts(&self, session: &str, ids: &[String]) -> Result<(), StoreError> {
        self.accounted(
            session,
            |store| super::session_uploaded_bytes(store, session, Some(ids)),
            0,
            || self.inner.delete_artifacts(session, ids),
        )
    }
    fn uploaded_bytes(&self, owner: &str) -> Result<Option<u64>, StoreError> {
        let mut totals = self.uploads.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(total) = totals.get(owner) {
            return Ok(Some(*total));
        }
        // Counted once, with the lock held: no upload or delete can pass meanwhile.
        let total = super::uploaded_bytes(self.inner.as_ref(), owner)?;
        totals.insert(owner.to_owned(), total);
        Ok(Some(total))
    }
}

/// Wraps a store so that it publishes to `feed`.
pub fn observe(inner: Arc<dyn Store>, feed: Feed) -> Arc<dyn Store> {
    Arc::new(Observed {
        inner,
        feed,
        uploads: Mutex::default(),
    })
}
