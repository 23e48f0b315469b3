//! The recorder: writes audit records, artifacts, workspace-record activity and session
//! metadata off the hot path, on one background thread, batching what arrives together.
//!
//! A tool call's answer does not wait for its audit line or artifacts to reach the disk; they
//! follow within milliseconds. [`Recorder::flush`] waits for everything sent so far (used on
//! shutdown and by tests).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc;

use tracing::warn;

use crate::store::{ArtifactMeta, AuditRecord, SessionMeta, Store};

enum Job {
    Audit(String, AuditRecord),
    Artifact(ArtifactMeta, Vec<u8>),
    Touch { record: String, session: String },
    SaveMeta(SessionMeta),
    Flush(std::sync::mpsc::Sender<()>),
}

/// A handle to the recorder thread; clones share it.
#[derive(Clone)]
pub struct Recorder {
    jobs: mpsc::Sender<Job>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Recorder")
    }
}

impl Recorder {
    /// Starts the recorder thread writing to `store`.
    pub fn start(store: Arc<dyn Store>) -> Recorder {
        let (jobs, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("recorder".into())
            .spawn(move || run(store, rx))
            .expect("the recorder thread starts");
        Recorder { jobs }
    }

    /// Records an audit line for a session.
    pub fn audit(&self, session: &str, record: AuditRecord) {
        let _ = self.jobs.send(Job::Audit(session.to_owned(), record));
    }

    /// Stores an artifact.
    pub fn artifact(&self, meta: ArtifactMeta, content: Vec<u8>) {
        let _ = self.jobs.send(Job::Artifact(meta, content));
    }

    /// Notes a call in an attached folder's workspace record.
    pub fn touch(&self, record: &str, session: &str) {
        let _ = self.jobs.send(Job::Touch {
            record: record.to_owned(),
            session: session.to_owned(),
        });
    }

    /// Saves a session's metadata.
    pub fn save_meta(&self, meta: SessionMeta) {
        let _ = self.jobs.send(Job::SaveMeta(meta));
    }

    /// Waits until everything sent before this call is written.
    pub fn flush(&self) {
        let (tx, rx) = std::sync::mpsc::channel();
        if self.jobs.send(Job::Flush(tx)).is_ok() {
            let _ = rx.recv();
        }
    }
}

fn run(store: Arc<dyn Store>, rx: mpsc::Receiver<Job>) {
    while let Ok(first) = rx.recv() {
        // Take whatever else is already queued, so a burst costs one fsync per session.
        let mut batch = vec![first];
        batch.extend(rx.try_iter());
        let mut audits: HashMap<String, Vec<AuditRecord>> = HashMap::new();
        let mut touches: HashMap<(String, String), u64> = HashMap::new();
        let mut waiters = Vec::new();
        // Artifacts in a row are stored together (the filesystem store syncs a session's
        // pack and index once for all of them), before any session save that follows them.
        let mut artifacts = Vec::new();
        for job in batch {
            match job {
                Job::Audit(session, record) => audits.entry(session).or_default().push(record),
                Job::Artifact(meta, content) => artifacts.push((meta, content)),
                Job::Touch { record, session } => {
                    *touches.entry((record, session)).or_default() += 1
                }
                Job::SaveMeta(meta) => {
                    put_artifacts(store.as_ref(), std::mem::take(&mut artifacts));
                    if let Err(e) = store.save(&meta) {
                        warn!("cannot save session {}: {e}", meta.id);
                    }
                }
                Job::Flush(done) => waiters.push(done),
            }
        }
        put_artifacts(store.as_ref(), artifacts);
        for (session, records) in audits {
            if let Err(e) = store.audit(&session, &records) {
                warn!("cannot write the audit log of {session}: {e}");
            }
        }
        for ((record, session), calls) in touches {
            if let Err(e) = store.touch_record(&record, &session, calls) {
                warn!("cannot update workspace record {record}: {e}");
            }
        }
        for done in waiters {
            let _ = done.send(());
        }
    }
}

/// Stores `artifacts` together, and says which could not be stored.
fn put_artifacts(store: &dyn Store, artifacts: Vec<(ArtifactMeta, Vec<u8>)>) {
    if artifacts.is_empty() {
        return;
    }
    for ((meta, _), result) in artifacts.iter().zip(store.put_artifacts(&artifacts)) {
        if let Err(e) = result {
            warn!("cannot store artifact {} of {}: {e}", meta.id, meta.session);
        }
    }
}
