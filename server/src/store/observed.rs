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
//!
//! And it answers the full-text search ([`SessionStore::search_sessions`]) without reading every
//! conversation: it keeps a [`Signature`] of each conversation it has read once (made on the
//! first search after a start, kept up to date by appends, dropped by replacements and deletes),
//! and reads only the conversations whose signature may hold every word.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use super::{
    ArtifactKind, ArtifactMeta, ArtifactPage, ArtifactStore, AuditRecord, BindingStore,
    FolderStore, History, HistoryMessage, Page, SessionMeta, SessionStore, Store, StoreError,
    WorkspaceRecord, WorkspaceSession, WorkspaceStore,
};
use crate::feed::{Event, Feed};

/// The inner store, observed.
pub struct Observed {
    inner: Arc<dyn Store>,
    feed: Feed,
    /// Bytes uploaded through the API, per user whose total was asked for.
    uploads: Mutex<HashMap<String, u64>>,
    /// Per owner: held while an upload or a delete of theirs changes the store and their total,
    /// and while their total is first counted, so that the total and the store agree. Per
    /// owner: a delete of a session whose workspace holds gigabytes held up every user's
    /// uploads and deletes.
    owners: crate::quota::UserLocks<Mutex<()>>,
    /// Signatures of the conversations, by session, for the search.
    signatures: Mutex<HashMap<String, Known>>,
    /// The number of the next read of a conversation for its signature ([`Known::Reading`]).
    readings: std::sync::atomic::AtomicU64,
}

/// What the search knows of a conversation.
#[derive(Debug)]
enum Known {
    /// A search reads it to make its signature (that read's number): a change meanwhile drops
    /// this, and the read's signature is not kept.
    Reading(u64),
    /// Its signature.
    Ready(Signature),
}

impl Observed {
    /// Drops a conversation's signature (made again on its next search).
    fn forget_signature(&self, session: &str) {
        self.signatures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(session);
    }

    /// Runs `write`, which adds `added` uploaded bytes to `session` and frees those `freed`
    /// finds there (read before it): the owner's total, when kept, follows. The owner's lock is
    /// held throughout (no other user waits). When the change cannot be told, every total is
    /// dropped, to be counted again on its next use.
    fn accounted(
        &self,
        session: &str,
        freed: impl FnOnce(&dyn Store) -> Result<u64, StoreError>,
        added: u64,
        write: impl FnOnce() -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let owner = self.inner.load(session).map(|meta| meta.map(|m| m.owner));
        let lock = match &owner {
            Ok(Some(owner)) => Some(self.owners.of(owner)),
            _ => None,
        };
        let _one_step = lock
            .as_ref()
            .map(|lock| lock.lock().unwrap_or_else(|p| p.into_inner()));
        let tracked = |owner: &str| {
            self.uploads
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(owner)
        };
        let bytes = match &owner {
            Ok(Some(owner)) if tracked(owner) => freed(self.inner.as_ref()),
            _ => Ok(0),
        };
        write()?;
        let mut totals = self.uploads.lock().unwrap_or_else(|p| p.into_inner());
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
    fn owner_sessions(&self, owner: &str) -> Result<Vec<SessionMeta>, StoreError> {
        self.inner.owner_sessions(owner)
    }
    fn count_sessions(&self, owner: &str) -> Result<usize, StoreError> {
        self.inner.count_sessions(owner)
    }
    fn delete(&self, id: &str) -> Result<(), StoreError> {
        self.forget_signature(id);
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
        let kept;
        let message = match without_nul(&message.text) {
            Some(text) => {
                kept = HistoryMessage {
                    role: message.role,
                    text,
                };
                &kept
            }
            None => message,
        };
        self.inner.append(id, message)?;
        {
            let mut signatures = self.signatures.lock().unwrap_or_else(|p| p.into_inner());
            match signatures.get_mut(id) {
                Some(Known::Ready(signature)) => signature.add(&message.text.to_lowercase()),
                // Read before this message, maybe: that read's signature would miss it.
                Some(Known::Reading(_)) => drop(signatures.remove(id)),
                None => {}
            }
        }
        self.feed.publish_with(id, || Event::message(message));
        Ok(())
    }
    fn replace(&self, id: &str, history: &History) -> Result<(), StoreError> {
        let kept;
        let history = if history.messages.iter().any(|m| m.text.contains('\0')) {
            let mut clean = history.clone();
            for message in &mut clean.messages {
                if let Some(text) = without_nul(&message.text) {
                    message.text = text;
                }
            }
            kept = clean;
            &kept
        } else {
            history
        };
        self.inner.replace(id, history)?;
        self.forget_signature(id);
        self.feed.publish(id, Event::History);
        Ok(())
    }
    fn set_history_model(
        &self,
        id: &str,
        provider: Option<&str>,
        model: Option<&str>,
    ) -> Result<(), StoreError> {
        self.inner.set_history_model(id, provider, model)?;
        self.feed.publish(id, Event::History);
        Ok(())
    }
    fn audit(&self, id: &str, records: &[AuditRecord]) -> Result<(), StoreError> {
        self.inner.audit(id, records)?;
        for record in records {
            self.feed.publish_with(id, || Event::call(record));
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
    fn audit_after(
        &self,
        id: &str,
        cursor: u64,
        limit: usize,
    ) -> Result<(Vec<AuditRecord>, u64), StoreError> {
        self.inner.audit_after(id, cursor, limit)
    }
    fn audit_page(
        &self,
        id: &str,
        offset: usize,
        limit: usize,
    ) -> Result<(Vec<AuditRecord>, usize), StoreError> {
        self.inner.audit_page(id, offset, limit)
    }
    fn searches_itself(&self) -> bool {
        self.inner.searches_itself()
    }
    fn search_sessions(&self, owner: &str, query: &str) -> Result<Vec<String>, StoreError> {
        if self.inner.searches_itself() {
            return self.inner.search_sessions(owner, query);
        }
        self.search(owner, query, usize::MAX)
    }
    fn search_page(
        &self,
        owner: &str,
        query: &str,
        offset: usize,
        limit: usize,
    ) -> Result<(Vec<String>, bool), StoreError> {
        if self.inner.searches_itself() {
            return self.inner.search_page(owner, query, offset, limit);
        }
        // One more than the page: whether more follow.
        let want = offset.saturating_add(limit).saturating_add(1);
        let hits = self.search(owner, query, want)?;
        let more = hits.len() == want;
        Ok((hits.into_iter().skip(offset).take(limit).collect(), more))
    }
}

impl Observed {
    /// The first `want` sessions of `owner` whose conversation holds every word of `query`
    /// (as [`SessionStore::search_sessions`]), reading only the conversations whose signature
    /// may hold them.
    fn search(&self, owner: &str, query: &str, want: usize) -> Result<Vec<String>, StoreError> {
        let words: Vec<String> = query.split_whitespace().map(str::to_lowercase).collect();
        let mut owned: Vec<SessionMeta> = self.inner.owner_sessions(owner)?;
        owned.sort_by(|a, b| b.last_active.cmp(&a.last_active).then(a.id.cmp(&b.id)));
        let mut hits = Vec::new();
        for meta in owned {
            let history = match self.known(&meta.id, &words) {
                // Not in this conversation: not read.
                Ok(false) => continue,
                Ok(true) => self.inner.history(&meta.id),
                // Read without the lock (a conversation of megabytes must not hold up every
                // user's appends); its signature kept only if nothing changed it meanwhile.
                Err(reading) => {
                    let history = self.inner.history(&meta.id);
                    self.keep_signature(&meta.id, reading, history.as_ref().ok());
                    history
                }
            };
            let Ok(history) = history else {
                continue;
            };
            if super::conversation_contains(&history, &words) {
                hits.push(meta.id);
                if hits.len() == want {
                    break;
                }
            }
        }
        Ok(hits)
    }

    fn new(inner: Arc<dyn Store>, feed: Feed) -> Observed {
        Observed {
            inner,
            feed,
            uploads: Mutex::default(),
            owners: crate::quota::UserLocks::new(),
            signatures: Mutex::default(),
            readings: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Whether the signature of conversation `id` says `words` may all be there; else (none
    /// yet) the number of the read that will make it, noted.
    fn known(&self, id: &str, words: &[String]) -> Result<bool, u64> {
        let mut signatures = self.signatures.lock().unwrap_or_else(|p| p.into_inner());
        match signatures.get(id) {
            Some(Known::Ready(s)) => Ok(words.iter().all(|w| s.may_contain(w))),
            _ => {
                let reading = self.readings.fetch_add(1, Ordering::Relaxed);
                signatures.insert(id.to_owned(), Known::Reading(reading));
                Err(reading)
            }
        }
    }

    /// Keeps the signature of `history`, conversation `id` as read `reading` found it (`None`:
    /// it could not be read), unless the conversation changed since the read was noted (an
    /// append or a replace dropped the note) or a later read noted itself.
    fn keep_signature(&self, id: &str, reading: u64, history: Option<&History>) {
        let mut signatures = self.signatures.lock().unwrap_or_else(|p| p.into_inner());
        if !matches!(signatures.get(id), Some(Known::Reading(r)) if *r == reading) {
            return;
        }
        match history {
            Some(history) => signatures.insert(id.to_owned(), Known::Ready(Signature::of(history))),
            None => signatures.remove(id),
        };
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
    fn session_records(&self, user: &str, session: &str) -> Result<Vec<String>, StoreError> {
        self.inner.session_records(user, session)
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
    fn prune_folder_sessions(
        &self,
        now: u64,
        last_active: &std::collections::HashMap<String, u64>,
    ) -> Result<usize, StoreError> {
        self.inner.prune_folder_sessions(now, last_active)
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
                meta.charged_bytes(),
                || self.inner.put_artifact(meta, content),
            )?;
        } else {
            self.inner.put_artifact(meta, content)?;
        }
        self.feed
            .publish_with(&meta.session, || Event::artifact(meta));
        Ok(())
    }
    /// Artifacts that are not uploads (tool outputs and diffs, as the recorder stores them)
    /// go to the inner store together; a batch with an upload goes one by one, as
    /// [`ArtifactStore::put_artifact`] accounts for each.
    fn put_artifacts(&self, artifacts: &[(ArtifactMeta, Vec<u8>)]) -> Vec<Result<(), StoreError>> {
        if artifacts.iter().any(|(meta, _)| meta.upload.is_some()) {
            return artifacts
                .iter()
                .map(|(meta, content)| self.put_artifact(meta, content))
                .collect();
        }
        let results = self.inner.put_artifacts(artifacts);
        for ((meta, _), result) in artifacts.iter().zip(&results) {
            if result.is_ok() {
                self.feed
                    .publish_with(&meta.session, || Event::artifact(meta));
            }
        }
        results
    }
    fn artifacts(&self, session: &str) -> Result<Vec<ArtifactMeta>, StoreError> {
        self.inner.artifacts(session)
    }
    fn uploaded_bytes_in(&self, session: &str, ids: Option<&[String]>) -> Result<u64, StoreError> {
        self.inner.uploaded_bytes_in(session, ids)
    }
    fn artifact_page(
        &self,
        session: &str,
        offset: usize,
        limit: usize,
    ) -> Result<ArtifactPage, StoreError> {
        self.inner.artifact_page(session, offset, limit)
    }
    fn latest_artifacts(&self, session: &str, n: usize) -> Result<Vec<ArtifactMeta>, StoreError> {
        self.inner.latest_artifacts(session, n)
    }
    fn call_artifacts(
        &self,
        session: &str,
        calls: &std::collections::HashSet<String>,
    ) -> Result<Vec<ArtifactMeta>, StoreError> {
        self.inner.call_artifacts(session, calls)
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
        let kept = |this: &Observed| {
            this.uploads
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(owner)
                .copied()
        };
        if let Some(total) = kept(self) {
            return Ok(Some(total));
        }
        // Counted once, with the owner's lock held: no upload or delete of theirs can pass
        // meanwhile (and one that counted it meanwhile is taken).
        let lock = self.owners.of(owner);
        let _one_step = lock.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(total) = kept(self) {
            return Ok(Some(total));
        }
        let total = super::uploaded_bytes(self.inner.as_ref(), owner)?;
        self.uploads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(owner.to_owned(), total);
        Ok(Some(total))
    }
}

/// `text` with each NUL made U+FFFD, when it holds one: PostgreSQL's text cannot hold NUL, and
/// a model's answer (or a prompt) with one failed its write there, after it was shown, while
/// the filesystem store took it; every store keeps the same text this way.
fn without_nul(text: &str) -> Option<String> {
    text.contains('\0').then(|| text.replace('\0', "\u{FFFD}"))
}

/// Wraps a store so that it publishes to `feed`.
pub fn observe(inner: Arc<dyn Store>, feed: Feed) -> Arc<dyn Store> {
    Arc::new(Observed::new(inner, feed))
}

/// The trigrams of `text` (already lowercased), as numbers.
fn trigrams(text: &str) -> impl Iterator<Item = u32> + '_ {
    text.as_bytes()
        .windows(3)
        .map(|w| (u32::from(w[0]) << 16) | (u32::from(w[1]) << 8) | u32::from(w[2]))
}

/// A conversation's signature for the full-text search: a bit set of the trigrams of its
/// messages, lowercased (one bit per trigram, by a hash). A word whose trigrams are not all set
/// is not in the conversation, so its `session.md` need not be read; one whose trigrams are all
/// set may be (a false positive is read and found not to match). Words of fewer than three
/// bytes pass every signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Signature {
    bits: Box<[u64]>,
    /// log2 of the number of bits.
    shift: u32,
}

impl Signature {
    /// Fewest and most bits of a signature: about two per byte of text, between these.
    const MIN_BITS: u32 = 9;
    const MAX_BITS: u32 = 16;

    /// The signature of a conversation.
    pub(crate) fn of(history: &History) -> Signature {
        let len: usize = history.messages.iter().map(|m| m.text.len()).sum();
        let want = (len.saturating_mul(2))
            .max(1)
            .next_power_of_two()
            .trailing_zeros();
        let shift = want.clamp(Self::MIN_BITS, Self::MAX_BITS);
        let mut signature = Signature {
            bits: vec![0u64; (1usize << shift) / 64].into_boxed_slice(),
            shift,
        };
        for message in &history.messages {
            signature.add(&message.text.to_lowercase());
        }
        signature
    }

    fn bit(&self, trigram: u32) -> usize {
        (trigram.wrapping_mul(0x9E37_79B1) >> (32 - self.shift)) as usize
    }

    /// Adds the trigrams of `text` (lowercased).
    pub(crate) fn add(&mut self, text: &str) {
        for t in trigrams(text) {
            let bit = self.bit(t);
            self.bits[bit / 64] |= 1 << (bit % 64);
        }
    }

    /// Whether `word` (lowercased) may be in the conversation.
    pub(crate) fn may_contain(&self, word: &str) -> bool {
        trigrams(word).all(|t| {
            let bit = self.bit(t);
            self.bits[bit / 64] & (1 << (bit % 64)) != 0
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{FsStore, Role};

    fn history(texts: &[&str]) -> History {
        let mut h = super::super::history::empty("2026-01-01T00:00:00Z".into(), None, None);
        h.messages = texts
            .iter()
            .map(|t| HistoryMessage {
                role: Role::User,
                text: (*t).to_owned(),
            })
            .collect();
        h
    }

    #[test]
    fn a_signature_lets_every_word_of_its_conversation_through_and_keeps_most_others_out() {
        let s = Signature::of(&history(&[
            "Deploy the Kubernetes cluster",
            "then run tests",
        ]));
        for word in [
            "deploy",
            "kubernetes",
            "cluster",
            "run",
            "tests",
            "ubern",
            "n t",
            "de",
        ] {
            assert!(s.may_contain(word), "{word}");
        }
        let out = ["quasar", "zebra", "xylophone", "fjord", "mnemonic"]
            .iter()
            .filter(|w| !s.may_contain(w))
            .count();
        assert!(
            out >= 4,
            "a small conversation's signature keeps most absent words out"
        );
    }

    fn session(store: &dyn Store, id: &str, owner: &str, when: &str) {
        store
            .create(&SessionMeta {
                id: id.into(),
                name: None,
                owner: owner.into(),
                created_at: when.into(),
                last_active: when.into(),
                provider: None,
                model: None,
                focus: None,
                folders: Vec::new(),
            })
            .unwrap();
    }

    /// An upload of `size` bytes to `session`.
    fn uploaded(id: &str, session: &str, size: u64) -> ArtifactMeta {
        ArtifactMeta {
            id: id.into(),
            session: session.into(),
            kind: ArtifactKind::ToolOutput,
            workspace: None,
            tool: None,
            call_id: None,
            created_at: "2026-01-01T00:00:00Z".into(),
            content_type: "text/plain".into(),
            size,
            truncated: false,
            original_size: size,
            upload: Some(Box::new(super::super::Upload {
                workspace_id: "w".into(),
                task_id: None,
                step_id: None,
                name: None,
                metadata: serde_json::Map::new(),
            })),
        }
    }

    /// Regression: a NUL in a message failed its write to PostgreSQL (`22021`), losing an
    /// answer already shown, where the filesystem store took it: every store gets U+FFFD.
    #[test]
    fn a_nul_in_a_message_is_kept_as_u_fffd_by_every_store() {
        let dir = tempfile::tempdir().unwrap();
        let observed = observe(Arc::new(FsStore::new(dir.path())), Feed::new());
        session(observed.as_ref(), A, "ana", "2026-01-01T00:00:01Z");
        let said = HistoryMessage {
            role: Role::Assistant,
            text: "a\0b".into(),
        };
        observed.append(A, &said).unwrap();
        assert_eq!(observed.history(A).unwrap().messages[0].text, "a\u{FFFD}b");
        let mut replaced = history(&["c\0d"]);
        replaced.created_at = "2026-01-01T00:00:00Z".into();
        observed.replace(A, &replaced).unwrap();
        assert_eq!(observed.history(A).unwrap().messages[0].text, "c\u{FFFD}d");
    }

    /// An owner's upload or delete waits only for that owner's: one user's long delete (a
    /// session whose workspace holds gigabytes) held a lock every user's uploads waited for.
    #[test]
    fn one_owners_writes_wait_for_their_own_lock_only() {
        let dir = tempfile::tempdir().unwrap();
        let observed = Arc::new(Observed::new(
            Arc::new(FsStore::new(dir.path())),
            Feed::new(),
        ));
        session(observed.as_ref(), A, "ana", "2026-01-01T00:00:01Z");
        session(observed.as_ref(), C, "bob", "2026-01-01T00:00:03Z");
        assert_eq!(observed.uploaded_bytes("ana").unwrap(), Some(0));
        assert_eq!(observed.uploaded_bytes("bob").unwrap(), Some(0));
        let ana = observed.owners.of("ana");
        let held = ana.lock().unwrap();
        // Bob's upload goes through while ana's lock is held.
        let bobs = uploaded("b1", C, 10);
        let o = observed.clone();
        let meta = bobs.clone();
        std::thread::spawn(move || o.put_artifact(&meta, b"0123456789"))
            .join()
            .unwrap()
            .unwrap();
        // Ana's waits for it.
        let (done, finished) = std::sync::mpsc::channel();
        let o = observed.clone();
        let anas = uploaded("a1", A, 5);
        let meta = anas.clone();
        std::thread::spawn(move || {
            o.put_artifact(&meta, b"01234").unwrap();
            done.send(()).unwrap();
        });
        assert!(
            finished
                .recv_timeout(std::time::Duration::from_millis(300))
                .is_err(),
            "ana's upload waits for ana's lock"
        );
        drop(held);
        finished
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap();
        assert_eq!(
            observed.uploaded_bytes("ana").unwrap(),
            Some(anas.charged_bytes())
        );
        assert_eq!(
            observed.uploaded_bytes("bob").unwrap(),
            Some(bobs.charged_bytes())
        );
    }

    /// A conversation read for its signature while a message is appended to it: the read may
    /// miss the message, so its signature is not kept, and the next search reads it again.
    /// (The read holds no lock: a user's conversation of megabytes held up every user's
    /// appends while it was read.)
    #[test]
    fn a_signature_read_while_its_conversation_changed_is_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = Observed::new(Arc::new(FsStore::new(dir.path())), Feed::new());
        session(&store, A, "ana", "2026-01-01T00:00:01Z");
        store
            .replace(A, &history(&["Refactor the parser"]))
            .unwrap();
        let words = ["kubernetes".to_owned()];
        for change in ["append", "replace"] {
            let Err(reading) = store.known(A, &words) else {
                panic!("no signature yet");
            };
            let before = store.history(A).unwrap();
            match change {
                "append" => store
                    .append(
                        A,
                        &HistoryMessage {
                            role: Role::Assistant,
                            text: "Kubernetes is up".into(),
                        },
                    )
                    .unwrap(),
                _ => store
                    .replace(A, &history(&["Refactor for Kubernetes"]))
                    .unwrap(),
            }
            store.keep_signature(A, reading, Some(&before));
            assert!(
                store.known(A, &words).is_err(),
                "{change}: the read's signature was not kept"
            );
            assert_eq!(
                store.search_sessions("ana", "kubernetes").unwrap(),
                [A],
                "{change}"
            );
            store
                .replace(A, &history(&["Refactor the parser"]))
                .unwrap();
        }
        // A read that nothing changed under is kept, and answers the next search alone.
        let Err(reading) = store.known(A, &words) else {
            panic!("no signature yet");
        };
        store.keep_signature(A, reading, Some(&store.history(A).unwrap()));
        assert_eq!(store.known(A, &words), Ok(false));
    }

    const A: &str = "00000000-0000-4000-8000-00000000000a";
    const B: &str = "00000000-0000-4000-8000-00000000000b";
    const C: &str = "00000000-0000-4000-8000-00000000000c";
    const D: &str = "00000000-0000-4000-8000-00000000000d";

    /// The search answers what reading every conversation answers, before and after appends,
    /// replacements and deletes made once the signatures exist.
    #[test]
    fn the_search_follows_every_change_of_a_conversation_after_its_signature_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let store = observe(Arc::new(FsStore::new(dir.path())), Feed::new());
        session(store.as_ref(), A, "ana", "2026-01-01T00:00:01Z");
        session(store.as_ref(), B, "ana", "2026-01-01T00:00:02Z");
        session(store.as_ref(), C, "bob", "2026-01-01T00:00:03Z");
        store
            .replace(A, &history(&["Refactor the parser"]))
            .unwrap();
        store.replace(B, &history(&["Deploy the server"])).unwrap();
        store
            .replace(C, &history(&["Refactor the parser too"]))
            .unwrap();
        let search = |q: &str| store.search_sessions("ana", q).unwrap();
        assert_eq!(search("PARSER"), vec![A.to_owned()]);
        assert_eq!(search("the"), vec![B.to_owned(), A.to_owned()]);
        assert!(search("kubernetes").is_empty());
        // Signatures exist now: each change is seen.
        store
            .append(
                B,
                &HistoryMessage {
                    role: Role::Assistant,
                    text: "Kubernetes is up".into(),
                },
            )
            .unwrap();
        assert_eq!(search("kubernetes deploy"), vec![B.to_owned()]);
        store
            .replace(A, &history(&["Now about Kubernetes"]))
            .unwrap();
        assert_eq!(search("kubernetes"), vec![B.to_owned(), A.to_owned()]);
        assert!(search("parser").is_empty());
        store.delete(B).unwrap();
        assert_eq!(search("kubernetes"), vec![A.to_owned()]);
        // Pages stop early and say whether more follow.
        session(store.as_ref(), D, "ana", "2026-01-01T00:00:04Z");
        store.replace(D, &history(&["Kubernetes again"])).unwrap();
        assert_eq!(
            store.search_page("ana", "kubernetes", 0, 1).unwrap(),
            (vec![D.to_owned()], true)
        );
        assert_eq!(
            store.search_page("ana", "kubernetes", 1, 1).unwrap(),
            (vec![A.to_owned()], false)
        );
        // The same answers as reading every conversation.
        for q in ["kubernetes", "the", "now about", "parser", "zz"] {
            let plain = FsStore::new(dir.path());
            assert_eq!(
                search(q),
                SessionStore::search_sessions(&plain, "ana", q).unwrap(),
                "{q}"
            );
        }
    }
}
