//! The recorder: writes audit records, artifacts, workspace-record activity and session
//! metadata off the hot path, on one background thread, batching what arrives together.
//!
//! A tool call's answer does not wait for its audit line or artifacts to reach the disk; they
//! follow within milliseconds. What arrives within [`GATHER`] of the first job is written as one
//! batch (group commit), so calls in quick succession share their syncs and file updates instead
//! of paying five syncs each. Workspace-record activity (last use, call counts) is only a
//! statistic, so it is written at most every [`TOUCH_EVERY`]: rewriting a folder's record after
//! every batch was the recorder's largest cost when an agent read large files in a loop.
//! [`Recorder::flush`] waits for everything sent so far, activity included (used on shutdown and
//! by tests), and does not wait out the gathering.
//!
//! What waits to be written counts against its user's record bytes ([`Recorder::counting`]:
//! bounded by the server's `max_call_bytes_per_user`, apart from what calls hold) until it is
//! written: a record is never refused, but a user whose records pile up (calls faster than a
//! slow store takes them) has their next calls refused, rather than the queue growing without
//! bound.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tracing::warn;

use crate::quota::{Held, PerUser};
use crate::store::{ArtifactMeta, AuditRecord, SessionMeta, Store};

/// How an artifact's bytes are made on the recorder thread, as its job is taken from the batch;
/// it may fill in the artifact's sizes.
pub type MakeArtifact = Box<dyn FnOnce(&mut ArtifactMeta) -> Vec<u8> + Send>;

enum Job {
    Audit(String, AuditRecord),
    Artifact(ArtifactMeta, Vec<u8>),
    /// An artifact, and how to make its bytes.
    Make(ArtifactMeta, MakeArtifact),
    Touch {
        record: String,
        session: String,
    },
    /// Saves the latest snapshot of this session's metadata ([`MetaSaves`]), if not yet saved.
    SaveMeta(String),
    Flush(std::sync::mpsc::Sender<()>),
}

/// A job, and what its user is charged for it until it is written.
type Queued = (Job, Option<Held>);

/// What an audit line is counted as beyond its target (its time, ids, names).
const AUDIT_LINE_BYTES: usize = 256;

/// A handle to the recorder thread; clones share it.
#[derive(Clone)]
pub struct Recorder {
    jobs: mpsc::Sender<Queued>,
    /// Unparked by a flush, which ends the gathering at once (see [`gather`]).
    thread: std::thread::Thread,
    /// Each user's bytes in memory, which what waits to be written counts against.
    bytes: Option<Arc<PerUser>>,
    /// The snapshots of sessions' metadata not saved yet.
    metas: Arc<MetaSaves>,
}

/// The sessions' metadata the recorder is to save: the latest snapshot of each, not yet saved,
/// and whether it is still to save any ([`Recorder::abandon_within`]).
#[derive(Default)]
struct MetaSaves {
    pending: std::sync::Mutex<HashMap<String, SessionMeta>>,
    /// True once the shutdown saves the sessions' metadata itself.
    abandoned: std::sync::atomic::AtomicBool,
    /// Held by the thread across each save, so that the shutdown can wait for one it began.
    saving: std::sync::Mutex<()>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Recorder")
    }
}

impl Recorder {
    /// Starts the recorder thread writing to `store`.
    pub fn start(store: Arc<dyn Store>) -> Recorder {
        Recorder::start_with_window(store, GATHER)
    }

    /// Starts the recorder thread, gathering each batch for `window`.
    fn start_with_window(store: Arc<dyn Store>, window: Duration) -> Recorder {
        let (jobs, rx) = mpsc::channel::<Queued>();
        let metas = Arc::new(MetaSaves::default());
        let saves = metas.clone();
        let thread = std::thread::Builder::new()
            .name("recorder".into())
            .spawn(move || run(store, rx, window, &saves))
            .expect("the recorder thread starts")
            .thread()
            .clone();
        Recorder {
            jobs,
            thread,
            bytes: None,
            metas,
        }
    }

    /// This recorder, with what waits to be written counted in `bytes` (each user's record
    /// bytes) until it is written.
    pub fn counting(mut self, bytes: Arc<PerUser>) -> Recorder {
        self.bytes = Some(bytes);
        self
    }

    /// Queues `job`, charging `user` `n` bytes until it is written.
    fn send(&self, user: &str, n: usize, job: Job) {
        let charge = self.bytes.as_ref().map(|bytes| {
            let held = bytes.holder(user);
            held.take_anyway(n);
            held
        });
        let _ = self.jobs.send((job, charge));
    }

    /// Records an audit line for a session of `user`'s.
    pub fn audit(&self, user: &str, session: &str, record: AuditRecord) {
        let n = AUDIT_LINE_BYTES + record.target.len() + session.len();
        self.send(user, n, Job::Audit(session.to_owned(), record));
    }

    /// Stores an artifact of a session of `user`'s.
    pub fn artifact(&self, user: &str, meta: ArtifactMeta, content: Vec<u8>) {
        self.send(user, content.len(), Job::Artifact(meta, content));
    }

    /// Stores the artifact `meta` of a session of `user`'s with the bytes `make` gives, made on
    /// the recorder thread: for one whose bytes take long to make (a large read's output
    /// serialized as JSON), so that the call's path does not wait for them. `holds` is what
    /// `make` keeps in memory until then.
    pub fn artifact_made(&self, user: &str, meta: ArtifactMeta, holds: usize, make: MakeArtifact) {
        self.send(user, holds, Job::Make(meta, make));
    }

    /// Notes a call in an attached folder's workspace record.
    pub fn touch(&self, record: &str, session: &str) {
        let _ = self.jobs.send((
            Job::Touch {
                record: record.to_owned(),
                session: session.to_owned(),
            },
            None,
        ));
    }

    /// Saves a session's metadata.
    pub fn save_meta(&self, meta: SessionMeta) {
        let id = meta.id.clone();
        self.metas
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone(), meta);
        let _ = self.jobs.send((Job::SaveMeta(id), None));
    }

    /// Takes back the snapshot of session `id`'s metadata the recorder has not saved yet, if
    /// any: for a caller that saves the session's newest state itself (a session leaving this
    /// host), or whose snapshot is older than the record (a lease just taken, several hosts).
    pub fn take_meta(&self, id: &str) -> Option<SessionMeta> {
        self.metas
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id)
    }

    /// Stops the recorder from saving sessions' metadata from now on, and hands over the
    /// snapshots it has not saved yet: for a shutdown that gave up waiting for the recorder and
    /// saves them itself, over which an older one the recorder still held must not be written
    /// afterwards. A save the recorder has begun is waited for, at most `wait`; `false` with
    /// the snapshots when it had not ended by then. Its other work goes on.
    pub fn abandon_within(&self, wait: Duration) -> (Vec<SessionMeta>, bool) {
        use std::sync::atomic::Ordering;
        self.metas.abandoned.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + wait;
        let settled = loop {
            // A save that panicked left it poisoned: it ended.
            if !matches!(
                self.metas.saving.try_lock(),
                Err(std::sync::TryLockError::WouldBlock)
            ) {
                break true;
            }
            if Instant::now() >= deadline {
                break false;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let pending =
            std::mem::take(&mut *self.metas.pending.lock().unwrap_or_else(|p| p.into_inner()));
        (pending.into_values().collect(), settled)
    }

    /// Waits until everything sent before this call is written, or until `deadline` has gone
    /// by: whether it was written (not when the recorder's thread is gone, with what it held).
    /// A store that does not answer (a database gone) must not hold a shutdown for ever.
    pub fn flush_within(&self, deadline: Duration) -> bool {
        let (tx, rx) = std::sync::mpsc::channel();
        if self.jobs.send((Job::Flush(tx), None)).is_err() {
            return false;
        }
        self.thread.unpark();
        rx.recv_timeout(deadline).is_ok()
    }

    /// Waits until everything sent before this call is written.
    pub fn flush(&self) {
        // A deadline past any instant waits without one.
        self.flush_within(Duration::MAX);
    }
    /// Saves `meta` in `store` now, after what the recorder holds: a snapshot it took before
    /// (a call's activity, queued for up to a batch) is written first, so it cannot write over
    /// this newer one (a model or name just set). Blocking.
    pub fn save_after(
        recorder: Option<&Recorder>,
        store: &dyn crate::store::Store,
        meta: &crate::store::SessionMeta,
    ) -> Result<(), crate::store::StoreError> {
        if let Some(recorder) = recorder {
            recorder.flush();
        }
        store.save(meta)
    }
}

/// How long the recorder gathers jobs after the first one of a batch. A call's records reach the
/// disk at most this much later than without gathering; in exchange, a session making a call
/// every millisecond or two syncs its files once per batch instead of once per call, which on
/// a small machine leaves the cores to the calls themselves (`docs/benchmarks.md`, the MCP
/// bench).
pub const GATHER: Duration = Duration::from_millis(10);

/// How often, at most, the recorder rewrites the workspace records that calls were made in.
pub const TOUCH_EVERY: Duration = Duration::from_secs(1);

/// Most jobs in one batch: a flood is written in bounded steps.
const MAX_BATCH: usize = 4096;

/// The next batch: the first job, then what arrives within `window` of it, until a flush is
/// asked for or the batch is full. With `due`, an empty batch when no job arrives before it.
/// `None` when every sender is gone.
///
/// Within the window the thread is parked, not blocked on the channel: a receiver blocked on a
/// channel is woken by every send, a context switch per job and several per tool call, where
/// parked it is woken once, when the window ends. A flush unparks it ([`Recorder::flush`]).
fn gather(
    rx: &mpsc::Receiver<Queued>,
    window: Duration,
    due: Option<Instant>,
) -> Option<Vec<Queued>> {
    let first = match due {
        None => rx.recv().ok()?,
        Some(due) => match rx.recv_timeout(due.saturating_duration_since(Instant::now())) {
            Ok(job) => job,
            Err(mpsc::RecvTimeoutError::Timeout) => return Some(Vec::new()),
            Err(mpsc::RecvTimeoutError::Disconnected) => return None,
        },
    };
    let until = Instant::now() + window;
    let mut flush = matches!(first, (Job::Flush(_), _));
    let mut batch = vec![first];
    loop {
        for job in rx.try_iter().take(MAX_BATCH.saturating_sub(batch.len())) {
            flush |= matches!(job, (Job::Flush(_), _));
            batch.push(job);
        }
        if flush || batch.len() >= MAX_BATCH {
            break;
        }
        let Some(left) = until.checked_duration_since(Instant::now()) else {
            break;
        };
        // May return early (an unpark meant for an earlier flush, or spuriously): the loop
        // takes what came and parks again for what is left of the window.
        std::thread::park_timeout(left);
    }
    Some(batch)
}

fn run(store: Arc<dyn Store>, rx: mpsc::Receiver<Queued>, window: Duration, metas: &MetaSaves) {
    // What it writes follows the answers: its waking must not preempt them.
    if let Err(e) = monad_sandbox::run_as_background() {
        tracing::debug!("the recorder runs at the usual scheduling policy: {e}");
    }
    // Calls per (workspace record, session) not yet written, and when they must be.
    let mut touches: HashMap<(String, String), u64> = HashMap::new();
    let mut touch_due: Option<Instant> = None;
    while let Some(batch) = gather(&rx, window, touch_due) {
        let mut audits: HashMap<String, Vec<AuditRecord>> = HashMap::new();
        let mut waiters = Vec::new();
        // Artifacts in a row are stored together (the filesystem store syncs a session's
        // pack and index once for all of them), before any session save that follows them.
        let mut artifacts = Vec::new();
        // Given back once the batch is written.
        let mut charges = Vec::new();
        for (job, charge) in batch {
            charges.extend(charge);
            match job {
                Job::Audit(session, record) => audits.entry(session).or_default().push(record),
                Job::Artifact(meta, content) => artifacts.push((meta, content)),
                Job::Make(mut meta, make) => {
                    // A panic while making one artifact must not end the recorder.
                    let made =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| make(&mut meta)));
                    match made {
                        Ok(bytes) => artifacts.push((meta, bytes)),
                        Err(_) => warn!(
                            "artifact {} of session {} could not be made; it is not stored",
                            meta.id, meta.session
                        ),
                    }
                }
                Job::Touch { record, session } => {
                    *touches.entry((record, session)).or_default() += 1;
                    touch_due.get_or_insert_with(|| Instant::now() + TOUCH_EVERY);
                }
                Job::SaveMeta(id) => {
                    put_artifacts(store.as_ref(), std::mem::take(&mut artifacts));
                    let _saving = metas.saving.lock().unwrap_or_else(|p| p.into_inner());
                    if metas.abandoned.load(std::sync::atomic::Ordering::SeqCst) {
                        continue;
                    }
                    // The latest snapshot, once: a later job of the same session finds none.
                    let taken = metas
                        .pending
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&id);
                    let Some(meta) = taken else {
                        continue;
                    };
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
        drop(charges);
        if !waiters.is_empty() || touch_due.is_some_and(|due| Instant::now() >= due) {
            write_touches(store.as_ref(), std::mem::take(&mut touches));
            touch_due = None;
        }
        for done in waiters {
            let _ = done.send(());
        }
    }
    write_touches(store.as_ref(), touches);
}

/// Adds `touches` (calls per workspace record and session) to the workspace records.
fn write_touches(store: &dyn Store, touches: HashMap<(String, String), u64>) {
    for ((record, session), calls) in touches {
        if let Err(e) = store.touch_record(&record, &session, calls) {
            warn!("cannot update workspace record {record}: {e}");
        }
    }
}

/// Stores `artifacts` together, and says which could not be stored. Each session's are put next
/// to each other (in the order they came), so that the store writes each session's once.
fn put_artifacts(store: &dyn Store, mut artifacts: Vec<(ArtifactMeta, Vec<u8>)>) {
    if artifacts.is_empty() {
        return;
    }
    artifacts.sort_by(|(a, _), (b, _)| a.session.cmp(&b.session));
    for ((meta, _), result) in artifacts.iter().zip(store.put_artifacts(&artifacts)) {
        if let Err(e) = result {
            warn!("cannot store artifact {} of {}: {e}", meta.id, meta.session);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ArtifactKind, ArtifactStore, AuditDecision, AuditOutcome, Decider};
    use crate::store::{FsStore, SessionStore, WorkspaceStore};

    const HOUR: Duration = Duration::from_secs(3600);

    #[cfg(target_os = "linux")]
    #[test]
    fn the_recorder_thread_is_scheduled_as_background_work() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(FsStore::new(dir.path()));
        let recorder = Recorder::start(store.clone());
        let a = "00000000-0000-4000-8000-00000000000a";
        create_session(&store, a);
        // An artifact made on the recorder's thread says how that thread is scheduled.
        let seen = Arc::new(std::sync::Mutex::new(None));
        let there = seen.clone();
        recorder.artifact_made(
            "u",
            meta(a, 1),
            0,
            Box::new(move |_| {
                *there.lock().unwrap() = Some(monad_sandbox::is_background().unwrap());
                Vec::new()
            }),
        );
        recorder.flush();
        assert_eq!(*seen.lock().unwrap(), Some(true));
    }

    fn audit(n: u64) -> Queued {
        let job = Job::Audit(
            "s".into(),
            AuditRecord {
                time: "2026-11-27T00:00:00Z".into(),
                call_id: format!("call-{n}"),
                tool: "read_file".into(),
                workspace: None,
                target: String::new(),
                decision: AuditDecision::Allowed,
                decided_by: Decider::Trust,
                outcome: AuditOutcome::Ok,
                duration_ms: n,
            },
        );
        (job, None)
    }

    fn calls(batch: &[Queued]) -> Vec<u64> {
        batch
            .iter()
            .filter_map(|(j, _)| match j {
                Job::Audit(_, r) => Some(r.duration_ms),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_flush_ends_the_gathering_at_once() {
        let (tx, rx) = mpsc::channel();
        let (done, _) = mpsc::channel();
        tx.send(audit(1)).unwrap();
        tx.send((Job::Flush(done), None)).unwrap();
        // The sender stays: only the flush can end a window of an hour.
        let batch = gather(&rx, HOUR, None).unwrap();
        assert_eq!(calls(&batch), [1]);
        assert!(matches!(batch.last(), Some((Job::Flush(_), _))));
    }

    #[test]
    fn a_full_batch_ends_the_gathering_and_the_rest_waits_for_the_next() {
        let (tx, rx) = mpsc::channel();
        for n in 0..MAX_BATCH as u64 + 3 {
            tx.send(audit(n)).unwrap();
        }
        let batch = gather(&rx, HOUR, None).unwrap();
        assert_eq!(batch.len(), MAX_BATCH);
        let (done, _) = mpsc::channel();
        tx.send((Job::Flush(done), None)).unwrap();
        let next = gather(&rx, HOUR, None).unwrap();
        let n = MAX_BATCH as u64;
        assert_eq!(calls(&next), [n, n + 1, n + 2]);
    }

    #[test]
    fn jobs_sent_while_gathering_join_the_batch() {
        let (tx, rx) = mpsc::channel();
        tx.send(audit(1)).unwrap();
        let gatherer = std::thread::current();
        let sender = std::thread::spawn(move || {
            for n in 2..=4 {
                tx.send(audit(n)).unwrap();
                std::thread::sleep(Duration::from_millis(5));
            }
            let (done, _) = mpsc::channel();
            tx.send((Job::Flush(done), None)).unwrap();
            // As `Recorder::flush` does: the gathering thread is parked, not blocked on the
            // channel.
            gatherer.unpark();
        });
        let batch = gather(&rx, HOUR, None).unwrap();
        sender.join().unwrap();
        assert_eq!(calls(&batch), [1, 2, 3, 4]);
        assert!(gather(&rx, HOUR, None).is_none(), "every sender is gone");
    }

    #[test]
    fn jobs_sent_within_the_window_join_it_and_do_not_end_it() {
        let (tx, rx) = mpsc::channel();
        tx.send(audit(1)).unwrap();
        let window = Duration::from_millis(300);
        let sender = std::thread::spawn(move || {
            for n in 2..=4 {
                std::thread::sleep(Duration::from_millis(20));
                tx.send(audit(n)).unwrap();
            }
            tx
        });
        let started = Instant::now();
        let batch = gather(&rx, window, None).unwrap();
        // Nothing but the window's end (or a flush) ends the gathering: the jobs that came
        // within it are all in, and none of them cut it short.
        assert!(
            started.elapsed() >= window,
            "ended after {:?}",
            started.elapsed()
        );
        assert_eq!(calls(&batch), [1, 2, 3, 4]);
        drop(sender.join().unwrap());
    }

    #[test]
    fn with_something_due_the_gathering_ends_empty_when_nothing_arrives() {
        let (_tx, rx) = mpsc::channel::<Queued>();
        let batch = gather(&rx, HOUR, Some(Instant::now() + Duration::from_millis(20))).unwrap();
        assert!(batch.is_empty());
    }

    #[test]
    fn a_flush_ends_a_long_window_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(FsStore::new(dir.path()));
        let record = store.resolve_record("ana", "d1", "~/p", "lap:~/p").unwrap();
        let recorder = Recorder::start_with_window(store.clone(), Duration::from_secs(60));
        recorder.touch(&record.id, "default");
        // Let the recorder take the touch and park for the window.
        std::thread::sleep(Duration::from_millis(50));
        let started = Instant::now();
        recorder.flush();
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the flush waited {:?}: it did not wake the gathering",
            started.elapsed()
        );
        assert_eq!(calls_in(&store, &record.id), 1);
    }

    /// Regression: a session's metadata queued by its activity (the model it had) was written
    /// after a newer one saved directly (a model just set), which it undid. Saved after what
    /// the recorder holds, the newer one stays.
    #[test]
    fn a_snapshot_the_recorder_holds_does_not_write_over_a_newer_save() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(FsStore::new(dir.path()));
        let mut meta = crate::store::SessionMeta {
            id: "4b7f3d2e-9c1a-4e5b-8f6d-2a3b4c5d6e7f".into(),
            owner: "ana".into(),
            created_at: "2026-01-01T00:00:00Z".into(),
            last_active: "2026-01-01T00:00:00Z".into(),
            name: None,
            provider: None,
            model: Some("old".into()),
            focus: None,
            folders: Vec::new(),
        };
        store.create(&meta).unwrap();
        let recorder = Recorder::start_with_window(store.clone(), Duration::from_millis(300));
        recorder.save_meta(meta.clone());
        // Let the recorder take it and gather.
        std::thread::sleep(Duration::from_millis(50));
        meta.model = Some("new".into());
        Recorder::save_after(Some(&recorder), store.as_ref(), &meta).unwrap();
        recorder.flush();
        let saved = store.load(&meta.id).unwrap().unwrap();
        assert_eq!(saved.model.as_deref(), Some("new"));
    }

    /// The calls recorded in `record` for session `default`.
    fn calls_in(store: &FsStore, record: &str) -> u64 {
        let page = store.record_sessions(record, 20, None).unwrap();
        page.items.iter().map(|s| s.calls).sum()
    }

    /// A store in a temporary folder with one workspace record, and a recorder writing to it.
    fn a_record_and_its_recorder() -> (
        tempfile::TempDir,
        Arc<FsStore>,
        crate::store::WorkspaceRecord,
        Recorder,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(FsStore::new(dir.path()));
        let record = store.resolve_record("ana", "d1", "~/p", "lap:~/p").unwrap();
        let recorder = Recorder::start(store.clone());
        (dir, store, record, recorder)
    }

    #[test]
    fn a_flush_writes_the_activity_gathered_so_far() {
        let (_dir, store, record, recorder) = a_record_and_its_recorder();
        for _ in 0..5 {
            recorder.touch(&record.id, "default");
        }
        recorder.flush();
        assert_eq!(calls_in(&store, &record.id), 5);
        recorder.touch(&record.id, "default");
        recorder.flush();
        assert_eq!(calls_in(&store, &record.id), 6, "added, not replaced");
    }

    #[test]
    fn activity_reaches_the_record_within_touch_every_without_a_flush() {
        let (_dir, store, record, recorder) = a_record_and_its_recorder();
        let started = Instant::now();
        // Calls spread over more than one batch, then nothing more.
        for _ in 0..3 {
            recorder.touch(&record.id, "default");
            std::thread::sleep(GATHER * 2);
        }
        let deadline = started + TOUCH_EVERY * 5;
        while calls_in(&store, &record.id) < 3 {
            assert!(
                Instant::now() < deadline,
                "the activity was not written without a flush"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(calls_in(&store, &record.id), 3);
        drop(recorder);
    }

    /// A session `id` in `store`.
    fn create_session(store: &FsStore, id: &str) {
        store
            .create(&SessionMeta {
                id: id.into(),
                name: None,
                owner: "ana".into(),
                created_at: "2026-11-27T00:00:00Z".into(),
                last_active: "2026-11-27T00:00:00Z".into(),
                provider: None,
                model: None,
                focus: None,
                folders: Vec::new(),
            })
            .unwrap();
    }

    /// The `n`th artifact of `session`, named after the session's last character and `n`.
    fn meta(session: &str, n: u32) -> ArtifactMeta {
        ArtifactMeta {
            id: format!("{}-{n}", &session[session.len() - 1..]),
            session: session.into(),
            kind: ArtifactKind::ToolOutput,
            workspace: None,
            tool: Some("read_file".into()),
            call_id: None,
            created_at: "2026-11-27T00:00:00Z".into(),
            content_type: "application/json".into(),
            size: 1,
            truncated: false,
            original_size: 1,
            upload: None,
        }
    }

    /// The ids of `session`'s artifacts, in the order stored.
    fn listed(store: &FsStore, session: &str) -> Vec<String> {
        let artifacts = store.artifacts(session).unwrap();
        artifacts.into_iter().map(|m| m.id).collect()
    }

    #[test]
    fn artifacts_of_several_sessions_in_one_batch_are_all_stored_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(FsStore::new(dir.path()));
        let recorder = Recorder::start(store.clone());
        let (a, b) = (
            "00000000-0000-4000-8000-00000000000a",
            "00000000-0000-4000-8000-00000000000b",
        );
        for id in [a, b] {
            create_session(&store, id);
        }
        // Interleaved, as calls of two sessions reach the recorder.
        for (session, n) in [(a, 1), (b, 1), (a, 2), (b, 2), (a, 3)] {
            recorder.artifact("u", meta(session, n), format!("{session}{n}").into_bytes());
        }
        recorder.flush();
        for (session, count) in [(a, 3), (b, 2)] {
            let short = &session[session.len() - 1..];
            let expected: Vec<String> = (1..=count).map(|n| format!("{short}-{n}")).collect();
            assert_eq!(listed(&store, session), expected);
            for n in 1..=count {
                let (_, content) = store.artifact(session, &format!("{short}-{n}")).unwrap();
                assert_eq!(content, format!("{session}{n}").into_bytes());
            }
        }
    }

    #[test]
    fn an_artifact_made_on_the_thread_is_stored_in_its_place_and_one_that_panics_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(FsStore::new(dir.path()));
        let recorder = Recorder::start(store.clone());
        let a = "00000000-0000-4000-8000-00000000000a";
        create_session(&store, a);
        recorder.artifact("u", meta(a, 1), b"one".to_vec());
        recorder.artifact_made(
            "u",
            meta(a, 2),
            0,
            Box::new(|meta| {
                meta.size = 3;
                b"two".to_vec()
            }),
        );
        recorder.artifact_made(
            "u",
            meta(a, 9),
            0,
            Box::new(|_| panic!("a make that fails")),
        );
        recorder.artifact("u", meta(a, 3), b"three".to_vec());
        recorder.flush();
        assert_eq!(listed(&store, a), ["a-1", "a-2", "a-3"]);
        let (made, content) = store.artifact(a, "a-2").unwrap();
        assert_eq!(content, b"two");
        assert_eq!(made.size, 3, "the sizes the make fills in are kept");
        // The recorder goes on after the panic.
        recorder.artifact("u", meta(a, 4), b"four".to_vec());
        recorder.flush();
        assert_eq!(listed(&store, a), ["a-1", "a-2", "a-3", "a-4"]);
    }

    /// The session of [`stuck_recorder`].
    const STUCK_SESSION: &str = "00000000-0000-4000-8000-00000000000a";

    /// A recorder writing to a store in a new directory (kept by the first), held up on the
    /// first artifact of session [`STUCK_SESSION`] until the sender sends ([`held_up`]).
    fn stuck_recorder() -> (tempfile::TempDir, Arc<FsStore>, Recorder, mpsc::Sender<()>) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(FsStore::new(dir.path()));
        let recorder = Recorder::start(store.clone());
        create_session(&store, STUCK_SESSION);
        let release = held_up(&recorder, meta(STUCK_SESSION, 1), 0);
        (dir, store, recorder, release)
    }

    /// The recorder held up on artifact `meta` of `ana`'s, which holds `holds` bytes, until the
    /// sender given back sends (the store not answering).
    fn held_up(recorder: &Recorder, meta: ArtifactMeta, holds: usize) -> mpsc::Sender<()> {
        let (release, held_up) = mpsc::channel::<()>();
        recorder.artifact_made(
            "ana",
            meta,
            holds,
            Box::new(move |_| {
                let _ = held_up.recv();
                b"one".to_vec()
            }),
        );
        release
    }

    /// Regression: a shutdown that gave up waiting for the recorder (a store that took long)
    /// saved every session's metadata, and then the recorder, once the store let it, wrote an
    /// older snapshot it still held over what was saved: a session's last activity, its focus or
    /// its folders went back.
    #[test]
    fn an_abandoned_recorder_saves_no_metadata_over_what_was_saved_after() {
        let (_dir, store, recorder, release) = stuck_recorder();
        let a = STUCK_SESSION;
        let named = |name: &str| {
            let mut meta = store.load(a).unwrap().unwrap();
            meta.name = Some(name.into());
            meta
        };
        recorder.save_meta(named("older"));
        assert!(!recorder.flush_within(Duration::from_millis(100)));
        let (held, settled) = recorder.abandon_within(Duration::from_secs(1));
        assert!(settled);
        // The snapshot it did not save is handed over.
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].name.as_deref(), Some("older"));
        store.save(&named("newer")).unwrap();
        release.send(()).unwrap();
        recorder.flush();
        let now = store.load(a).unwrap().unwrap();
        assert_eq!(now.name.as_deref(), Some("newer"));
        // Its other work goes on.
        recorder.artifact("ana", meta(a, 2), b"two".to_vec());
        recorder.flush();
        assert!(store.artifact(a, &meta(a, 2).id).is_ok());
    }

    /// Regression: what waited to be written counted against nothing, so a user whose calls
    /// came faster than a slow store took their records grew the queue without bound.
    #[test]
    fn what_waits_to_be_written_counts_against_its_user_until_written() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(FsStore::new(dir.path()));
        let bytes = PerUser::new(1_000);
        let recorder = Recorder::start(store.clone()).counting(bytes.clone());
        let a = "00000000-0000-4000-8000-00000000000a";
        create_session(&store, a);
        // The store held up: the recorder's thread waits on the first artifact's make.
        let release = held_up(&recorder, meta(a, 1), 100);
        recorder.artifact("ana", meta(a, 2), vec![b'x'; 2_000]);
        let (Job::Audit(_, record), _) = audit(3) else {
            unreachable!("an audit job")
        };
        recorder.audit("ana", a, record);
        let waiting = 100 + 2_000 + AUDIT_LINE_BYTES + a.len();
        assert_eq!(bytes.held("ana"), waiting);
        assert!(
            !bytes.holder("ana").take(1),
            "past the bound: the user's next are refused"
        );
        assert!(
            bytes.holder("ben").take(1_000),
            "another user's bound is their own"
        );
        release.send(()).unwrap();
        recorder.flush();
        assert_eq!(bytes.held("ana"), 0, "given back once written");
        assert_eq!(listed(&store, a), ["a-1", "a-2"]);
        assert_eq!(store.audit_log(a).unwrap().len(), 1, "nothing refused");
    }

    /// Regression: a shutdown waited for the recorder without end, so a store that did not
    /// answer (a database gone) held the server's exit for ever.
    #[test]
    fn a_flush_with_a_deadline_gives_up_on_a_store_that_does_not_answer() {
        let (_dir, store, recorder, release) = stuck_recorder();
        let a = STUCK_SESSION;
        assert!(!recorder.flush_within(Duration::from_millis(100)));
        release.send(()).unwrap();
        assert!(recorder.flush_within(Duration::from_secs(60)));
        assert_eq!(listed(&store, a), ["a-1"]);
    }
}
