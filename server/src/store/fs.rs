//! The filesystem store: the embedded default.
//!
//! Metadata files are replaced atomically (write, fsync, rename, fsync the directory). Logs
//! (`session.md`, `audit.jsonl`, the artifact index) are appended with one `write` per record
//! and fsynced before the call returns; a crash can at worst leave a torn last record, which
//! readers skip (a torn `session.md` block reads as a shorter message).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tracing::warn;

use super::history::{self, History, HistoryMessage, render_message};
use super::*;
use crate::fsutil::{
    PRIVATE_FILE, create_private_dir, create_workspace_root, now_rfc3339, write_atomic,
};

/// The filesystem store rooted at the data directory.
#[derive(Debug)]
pub struct FsStore {
    root: PathBuf,
    /// One lock per session while someone holds or waits for it (an entry goes with its last
    /// holder, so the map does not grow with every session ever touched).
    session_locks: Mutex<HashMap<String, Arc<Gate>>>,
    /// Sessions whose `session.md` this store has read whole (and kept aside if corrupt), so
    /// appends can go straight to the end of the file.
    checked: Mutex<std::collections::HashSet<String>>,
    /// Every session's metadata, read from disk at the first listing and kept in step with
    /// every write through this store since (a running server is the data dir's only writer:
    /// it holds the lock), so listings do not read thousands of files.
    metas: Mutex<Option<Metas>>,
    /// Each session's audit log as far as it was counted ([`AuditTally`]).
    audit_tallies: Mutex<HashMap<String, AuditTally>>,
    /// Tallies forgotten (an append cut back, a delete), under `audit_tallies`' lock: a count
    /// that began before one keeps nothing it read ([`FsStore::forget_tally`]).
    audit_forgets: std::sync::atomic::AtomicU64,
    bindings: Mutex<Option<BindingsFile>>,
    /// `folder_sessions.toml`, read on first use.
    folders: Mutex<Option<FoldersFile>>,
    workspaces: Mutex<Option<HashMap<String, WorkspaceFile>>>,
    /// Devices of one user with a binding, at most (binding one more forgets the user's least
    /// recently used).
    max_devices_per_user: usize,
    /// Opened to look, by a command that only reads (`session show`, `workspace list`): a
    /// corrupt file is reported and left where it is, and nothing is written; the server keeps
    /// it aside at its next read ([`FsStore::inspecting`]).
    inspecting: bool,
}

/// How many records a session's audit log holds in its whole lines up to `upto` bytes, in the
/// file of that device and inode: a count reads only the lines appended since (a log is only
/// ever appended to; a torn end is cut back to its last whole line, never before `upto`). A
/// listing counts each row's log: counting records, not lines, read every log whole each time.
#[derive(Debug, Clone, Copy, Default)]
struct AuditTally {
    dev: u64,
    ino: u64,
    /// When the file was made: an inode freed by a deleted session's log may be the next one's.
    born: Option<std::time::SystemTime>,
    upto: u64,
    records: usize,
}

/// Every session's metadata, kept by owner: one owner's listing or count touches their own
/// sessions only, not every user's, while it holds the lock every load and save takes.
#[derive(Debug, Default)]
struct Metas {
    by_owner: HashMap<String, HashMap<String, SessionMeta>>,
    /// Each session's owner, by id.
    owners: HashMap<String, String>,
    /// Deletions begun or ended: a load that read a session's metadata from disk puts it in
    /// only when none came in between ([`FsStore::load`]).
    deletions: u64,
}

impl Metas {
    fn of(all: HashMap<String, SessionMeta>) -> Metas {
        let mut metas = Metas::default();
        for meta in all.into_values() {
            metas.insert(meta);
        }
        metas
    }

    fn get(&self, id: &str) -> Option<&SessionMeta> {
        self.by_owner.get(self.owners.get(id)?)?.get(id)
    }

    fn insert(&mut self, meta: SessionMeta) {
        if self.owners.get(&meta.id) != Some(&meta.owner) {
            self.remove(&meta.id);
            self.owners.insert(meta.id.clone(), meta.owner.clone());
        }
        self.by_owner
            .entry(meta.owner.clone())
            .or_default()
            .insert(meta.id.clone(), meta);
    }

    fn remove(&mut self, id: &str) {
        let Some(owner) = self.owners.remove(id) else {
            return;
        };
        if let Some(owned) = self.by_owner.get_mut(&owner) {
            owned.remove(id);
            if owned.is_empty() {
                self.by_owner.remove(&owner);
            }
        }
    }

    fn owned(&self, owner: &str) -> impl Iterator<Item = &SessionMeta> {
        self.by_owner
            .get(owner)
            .into_iter()
            .flat_map(HashMap::values)
    }

    fn all(&self) -> impl Iterator<Item = &SessionMeta> {
        self.by_owner.values().flat_map(HashMap::values)
    }
}

/// A binding's use is written down again (on a lookup) once it is this old, so that its
/// recency stays known without a write on every connection.
const BINDING_TOUCH_MS: u64 = 24 * 60 * 60 * 1000;

/// Sessions whose `session.md` an [`FsStore`] remembers having read whole, at most.
const CHECKED_MAX: usize = 4096;

/// A session's lock: busy or free, and a condition to wait on.
#[derive(Debug, Default)]
struct Gate {
    busy: Mutex<bool>,
    free: std::sync::Condvar,
}

/// A held session lock; dropping it frees the session and, when nobody else holds or waits
/// for it, removes its entry from the map.
struct SessionLock<'a> {
    store: &'a FsStore,
    id: String,
    gate: Arc<Gate>,
}

impl Drop for SessionLock<'_> {
    fn drop(&mut self) {
        *self.gate.busy.lock().unwrap_or_else(|p| p.into_inner()) = false;
        self.gate.free.notify_one();
        let mut locks = self
            .store
            .session_locks
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // Only the map and this guard hold it, and nobody can take it without the map's lock.
        if Arc::strong_count(&self.gate) == 2 {
            locks.remove(&self.id);
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkspaceFile {
    record: WorkspaceRecord,
    sessions: Vec<WorkspaceSession>,
}

/// `folder_sessions.toml`: the folder registry of MCP roots, one `[[folders]]` table per
/// (user, device, folder).
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FoldersFile {
    #[serde(default)]
    folders: Vec<crate::roots::FolderSessions>,
}

/// `bindings.toml`: `[bindings.<user>.<device id>]` holds the device's session and when the
/// binding was last used, `[defaults]` maps users to their default sessions.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct BindingsFile {
    #[serde(default)]
    bindings: BTreeMap<String, BTreeMap<String, Binding>>,
    #[serde(default)]
    defaults: BTreeMap<String, String>,
}

/// One device's binding: its session, and when it was last used (Unix milliseconds; within one
/// user's bindings each later use has a larger value, so equal clocks still order them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "BindingForm")]
struct Binding {
    session: String,
    used: u64,
}

/// How a binding may be written: as a table, or (before uses were recorded) the session alone,
/// which counts as used longest ago.
#[derive(Deserialize)]
#[serde(untagged)]
enum BindingForm {
    Session(String),
    Used { session: String, used: u64 },
}

impl From<BindingForm> for Binding {
    fn from(form: BindingForm) -> Binding {
        match form {
            BindingForm::Session(session) => Binding { session, used: 0 },
            BindingForm::Used { session, used } => Binding { session, used },
        }
    }
}

/// `bindings.toml` as versions before per-user bindings wrote it: device id -> session, with
/// each user's default under the key `user:<name>`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OldBindingsFile {
    #[serde(default)]
    bindings: BTreeMap<String, String>,
}

impl BindingsFile {
    /// The old layout in the new one: `user:<name>` becomes the default of `<name>` when the
    /// session is that user's; a device key becomes a binding of the session's owner. Entries
    /// of sessions that no longer exist, or a `user:` key naming someone other than the
    /// session's owner (a device id that claimed it), are dropped. `owner` says who owns a
    /// session.
    fn migrate(old: OldBindingsFile, owner: impl Fn(&str) -> Option<String>) -> BindingsFile {
        let mut new = BindingsFile::default();
        for (key, session) in old.bindings {
            let Some(owner) = owner(&session) else {
                continue;
            };
            match key.strip_prefix("user:") {
                Some(user) if user == owner => {
                    new.defaults.insert(owner, session);
                }
                Some(_) => {}
                None => {
                    new.bindings
                        .entry(owner)
                        .or_default()
                        .insert(key, Binding { session, used: 0 });
                }
            }
        }
        new
    }

    /// `user`'s `device` is bound to `session`, used at `now`; when that makes more than `max`
    /// devices of the user, the least recently used goes. Whether anything changed (binding
    /// again to the same session changes nothing, unless its use is a day old).
    fn bind(&mut self, user: &str, device: &str, session: &str, now: u64, max: usize) -> bool {
        let devices = self.bindings.entry(user.to_owned()).or_default();
        if let Some(binding) = devices.get(device)
            && binding.session == session
            && now.saturating_sub(binding.used) < BINDING_TOUCH_MS
        {
            return false;
        }
        let latest = devices.values().map(|b| b.used).max().unwrap_or(0);
        let used = now.max(latest.saturating_add(1));
        devices.insert(
            device.to_owned(),
            Binding {
                session: session.to_owned(),
                used,
            },
        );
        while devices.len() > max.max(1) {
            let oldest = devices
                .iter()
                .min_by_key(|(_, b)| b.used)
                .map(|(d, _)| d.clone())
                .expect("more than one device");
            devices.remove(&oldest);
        }
        true
    }

    /// The session `user`'s `device` is bound to, noting the use (a change, when the last one
    /// noted is a day old).
    fn lookup(&mut self, user: &str, device: &str, now: u64) -> (Option<String>, bool) {
        let Some(devices) = self.bindings.get_mut(user) else {
            return (None, false);
        };
        let latest = devices.values().map(|b| b.used).max().unwrap_or(0);
        let Some(binding) = devices.get_mut(device) else {
            return (None, false);
        };
        let stale = now.saturating_sub(binding.used) >= BINDING_TOUCH_MS;
        if stale {
            binding.used = now.max(latest.saturating_add(1));
        }
        (Some(binding.session.clone()), stale)
    }
}

/// Now, in Unix milliseconds.
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn map_io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |e| StoreError::io(op, path, e)
}

fn atomic(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    write_atomic(path, bytes, PRIVATE_FILE).map_err(|e| StoreError::Io {
        op: "write",
        path: path.display().to_string(),
        source: std::io::Error::other(e.to_string()),
    })
}

/// Opens `path` to append to it (and to read its last byte), creating it (private) when
/// absent.
fn open_append(path: &Path) -> Result<std::fs::File, StoreError> {
    std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(PRIVATE_FILE)
        .open(path)
        .map_err(map_io("open", path))
}

/// Appends `bytes` (whole lines) with one write, then fsyncs. A write that fails part way (a
/// full disk) is cut off again, so the file never keeps part of a line that the next append
/// would run into. A file whose last line a crash cut (it does not end with a line break) has
/// that part of a line cut first: it was never a whole record and no reader can take it, and
/// the first line written after it would otherwise have run into it and been lost with it.
fn append_durable(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let mut file = open_append(path)?;
    let mut before = file.metadata().map_err(map_io("stat", path))?.len();
    let whole = whole_lines_end(&file, before).map_err(map_io("read", path))?;
    if whole < before {
        file.set_len(whole)
            .map_err(map_io("cut a torn line of", path))?;
        tracing::warn!(
            "{}: cut the last {} bytes, part of a line a crash left, before appending",
            path.display(),
            before - whole
        );
        before = whole;
    }
    if let Err(e) = file.write_all(bytes) {
        let _ = file.set_len(before);
        return Err(StoreError::io("append to", path, e));
    }
    file.sync_data().map_err(map_io("sync", path))
}

/// Where the whole lines of a file `len` bytes long end: just after its last line break (0
/// when it has none), read backwards a piece at a time.
fn whole_lines_end(file: &std::fs::File, len: u64) -> std::io::Result<u64> {
    use std::os::unix::fs::FileExt;
    let mut end = len;
    let mut piece = [0u8; 4096];
    while end > 0 {
        let start = end.saturating_sub(piece.len() as u64);
        let got = &mut piece[..(end - start) as usize];
        file.read_exact_at(got, start)?;
        if let Some(at) = got.iter().rposition(|&b| b == b'\n') {
            return Ok(start + at as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// How long a temporary file must have been left alone before start-up removes it: far longer
/// than any atomic write takes.
pub const STALE_TEMP_AGE: std::time::Duration = std::time::Duration::from_secs(5 * 60);

/// Whether `name` is the name of an atomic write's temporary file: `.<name>.<pid>.<n>.tmp`.
fn is_temp_name(name: &str) -> bool {
    let Some(inner) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")) else {
        return false;
    };
    let mut parts = inner.rsplitn(3, '.');
    let (Some(n), Some(pid), Some(base)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    !base.is_empty() && n.parse::<u64>().is_ok() && pid.parse::<u32>().is_ok()
}

/// Moves a corrupt file aside as `<name>.corrupt-<time>` so nothing is lost; when the store is
/// only looking ([`FsStore::inspecting`]), says so and leaves it.
fn keep_aside(path: &Path, why: &str, inspecting: bool) -> Result<(), StoreError> {
    if inspecting {
        warn!(
            "{} is corrupt ({why}); left as it is (the server keeps it aside as \
             .corrupt-<time> when it next reads it)",
            path.display()
        );
        return Ok(());
    }
    let stamp = now_rfc3339().replace(':', "");
    let ext = path
        .extension()
        .map(|e| format!("{}.", e.to_string_lossy()))
        .unwrap_or_default();
    let mut aside = path.with_extension(format!("{ext}corrupt-{stamp}"));
    // Never over an earlier copy kept aside in the same second.
    let mut n = 2;
    while aside.exists() {
        aside = path.with_extension(format!("{ext}corrupt-{stamp}-{n}"));
        n += 1;
    }
    warn!(
        "{} is corrupt ({why}); kept aside as {}",
        path.display(),
        aside.display()
    );
    // Not kept aside, it is not written over either: the caller's fresh file waits.
    std::fs::rename(path, &aside).map_err(|e| {
        warn!("cannot keep {} aside: {e}", path.display());
        StoreError::io("keep aside", path, e)
    })
}

impl FsStore {
    /// A store in `data_dir` (created as needed).
    pub fn new(data_dir: &Path) -> FsStore {
        FsStore {
            root: data_dir.to_path_buf(),
            session_locks: Mutex::new(HashMap::new()),
            checked: Mutex::new(std::collections::HashSet::new()),
            metas: Mutex::new(None),
            audit_tallies: Mutex::new(HashMap::new()),
            audit_forgets: std::sync::atomic::AtomicU64::new(0),
            bindings: Mutex::new(None),
            folders: Mutex::new(None),
            workspaces: Mutex::new(None),
            max_devices_per_user: crate::config::Quotas::default().max_devices_per_user,
            inspecting: false,
        }
    }

    /// Refuses a write to `path` by a store that only looks ([`FsStore::inspecting`]): what it
    /// holds in memory may stand for a corrupt file it left in place, which a write would
    /// replace without keeping it aside.
    fn writable(&self, path: &Path) -> Result<(), StoreError> {
        if self.inspecting {
            return Err(StoreError::Invalid(format!(
                "{} is not written by a command that only looks",
                path.display()
            )));
        }
        Ok(())
    }

    /// The store in `data_dir` for a command that only looks (`session list`, `session show`,
    /// `workspace list`, ...), possibly while the server runs: a corrupt file is reported and
    /// left where it is rather than kept aside, a corrupt `session.md` is an error rather than
    /// a fresh conversation, and nothing is written.
    pub fn inspecting(data_dir: &Path) -> FsStore {
        FsStore {
            inspecting: true,
            ..FsStore::new(data_dir)
        }
    }

    /// Remembers at most `max` devices per user (at least 1); binding one more forgets the
    /// user's least recently used device.
    pub fn with_max_devices_per_user(mut self, max: usize) -> FsStore {
        self.max_devices_per_user = max.max(1);
        self
    }

    /// `sessions/<id>`.
    pub fn session_dir(&self, id: &str) -> PathBuf {
        self.root.join("sessions").join(id)
    }

    /// Removes the temporary files that atomic writes leave behind when the process dies between
    /// writing one and renaming it (`.<name>.<pid>.<n>.tmp`, see `fsutil::write_atomic`), in
    /// the directories the server writes: the data dir, `tls/`, `workspaces/`, and each
    /// session's directory and `artifacts/`. Never inside a primary workspace (its files belong
    /// to the tools), and never one modified in the last [`STALE_TEMP_AGE`]: a write may be
    /// under way, by this process or by a command that works beside a running server
    /// (`monad-server token create`). Returns how many it removed.
    pub fn remove_stale_temp_files(&self) -> usize {
        // A session whose delete was cut short after its directory was renamed away: what
        // still names it (device bindings, a user's default, workspace records) goes too.
        let mut removed =
            crate::fsutil::remove_deleting_leftovers(&self.root.join("sessions"), |id| {
                // Not when a session of that id exists again (`default`, made anew on use):
                // what names it is the new one's. Under the session's lock, where a session is
                // made, so that one made meanwhile is seen.
                if check_id(id).is_err() {
                    return;
                }
                let _guard = self.lock(id);
                if !self.session_dir(id).exists()
                    && let Err(e) = self
                        .unbind_session(id)
                        .and_then(|()| self.forget_session(id))
                {
                    warn!("session {id}, deleted: cannot forget its bindings: {e}");
                }
            });
        let mut dirs = vec![
            self.root.clone(),
            self.root.join("tls"),
            self.workspaces_dir(),
        ];
        if let Ok(sessions) = std::fs::read_dir(self.root.join("sessions")) {
            for session in sessions.flatten() {
                if session.file_type().is_ok_and(|t| t.is_dir()) {
                    let artifacts = session.path().join("artifacts");
                    // What a crash left of deleted artifacts in the pack goes now.
                    let name = session.file_name().to_string_lossy().into_owned();
                    if check_id(&name).is_ok() && artifacts.join(PACK).exists() {
                        let _guard = self.lock(&name);
                        if let Err(e) = erase_unnamed_at_start(&artifacts) {
                            warn!(
                                "session {name}: cannot free what its artifact pack no longer \
                                 names: {e}"
                            );
                        }
                    }
                    dirs.push(artifacts);
                    dirs.push(session.path());
                }
            }
        }
        for dir in dirs {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name();
                let is_file = entry.file_type().is_ok_and(|t| t.is_file());
                let old = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age >= STALE_TEMP_AGE);
                if is_file && old && is_temp_name(&name.to_string_lossy()) {
                    match std::fs::remove_file(entry.path()) {
                        Ok(()) => removed += 1,
                        Err(e) => warn!("cannot remove {}: {e}", entry.path().display()),
                    }
                }
            }
        }
        removed
    }

    /// Writes `session.toml` and caches it; the caller holds the session's lock.
    fn save_locked(&self, meta: &SessionMeta) -> Result<(), StoreError> {
        let dir = self.session_dir(&meta.id);
        create_private_dir(&dir).map_err(map_io("create", &dir))?;
        let text = toml::to_string(meta).expect("metadata serializes");
        atomic(&dir.join("session.toml"), text.as_bytes())?;
        self.cache_meta(meta);
        Ok(())
    }

    /// Forgets session `id`'s audit tally, and keeps a count that began before from keeping
    /// what it read.
    fn forget_tally(&self, id: &str) {
        let mut tallies = self.audit_tallies.lock().unwrap_or_else(|p| p.into_inner());
        tallies.remove(id);
        self.audit_forgets
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Takes session `id`'s lock; it is given back when the guard drops.
    fn lock(&self, id: &str) -> SessionLock<'_> {
        let gate = self
            .session_locks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.to_owned())
            .or_default()
            .clone();
        let mut busy = gate.busy.lock().unwrap_or_else(|p| p.into_inner());
        while *busy {
            busy = gate.free.wait(busy).unwrap_or_else(|p| p.into_inner());
        }
        *busy = true;
        drop(busy);
        SessionLock {
            store: self,
            id: id.to_owned(),
            gate,
        }
    }

    fn history_path(&self, id: &str) -> PathBuf {
        self.session_dir(id).join("session.md")
    }

    fn fresh_history(&self, id: &str) -> Result<History, StoreError> {
        let meta = self.load(id)?;
        Ok(history::empty(
            meta.as_ref()
                .map(|m| m.created_at.clone())
                .unwrap_or_else(now_rfc3339),
            meta.as_ref().and_then(|m| m.provider.clone()),
            meta.as_ref().and_then(|m| m.model.clone()),
        ))
    }

    fn is_checked(&self, id: &str) -> bool {
        self.checked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(id)
    }

    fn mark_checked(&self, id: &str, checked: bool) {
        let mut set = self.checked.lock().unwrap_or_else(|p| p.into_inner());
        if checked {
            // Bounded: forgetting only costs a session one more whole read at its next append.
            if set.len() >= CHECKED_MAX {
                set.clear();
            }
            set.insert(id.to_owned());
        } else {
            set.remove(id);
        }
    }

    /// Reads `session.md` whole, with the session's lock held. A corrupt file is kept aside and
    /// replaced by the frontmatter; a missing one is written with it when `write_missing`.
    fn read_history(&self, id: &str, write_missing: bool) -> Result<History, StoreError> {
        let path = self.history_path(id);
        let parsed = match std::fs::read(&path) {
            Ok(bytes) => match torn_text(&bytes) {
                Some(text) => history::parse(text).map_err(|e| e.to_string()),
                None => Err("it is not UTF-8".to_owned()),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let fresh = self.fresh_history(id)?;
                if write_missing {
                    atomic(&path, history::render_frontmatter(&fresh).as_bytes())?;
                    self.mark_checked(id, true);
                }
                return Ok(fresh);
            }
            Err(e) => return Err(StoreError::io("read", &path, e)),
        };
        let history = match parsed {
            Ok(history) => history,
            Err(why) if self.inspecting => {
                return Err(StoreError::Invalid(format!(
                    "{} is corrupt ({why}); the server keeps it aside as .corrupt-<time> and \
                     starts the conversation again when it next reads it",
                    path.display()
                )));
            }
            Err(why) => {
                keep_aside(&path, &why, false)?;
                let fresh = self.fresh_history(id)?;
                atomic(&path, history::render_frontmatter(&fresh).as_bytes())?;
                fresh
            }
        };
        self.mark_checked(id, true);
        Ok(history)
    }

    /// Reads a session's `session.toml`. A corrupt one is an `Invalid` error, and stays where
    /// it is: it names the session's owner, so nothing may be re-created over it (the operator
    /// repairs it).
    fn load_from_disk(&self, id: &str) -> Result<Option<SessionMeta>, StoreError> {
        let path = self.session_dir(id).join("session.toml");
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::io("read", &path, e)),
        };
        let why = match toml::from_str::<SessionMeta>(&text) {
            Ok(meta) if meta.id == id => return Ok(Some(meta)),
            Ok(meta) => format!("it names session {}", meta.id),
            Err(e) => crate::fsutil::toml_problem(&text, &e),
        };
        Err(StoreError::Invalid(format!(
            "{} is corrupt: {why}",
            path.display()
        )))
    }

    /// `look` at every session's metadata, read from disk first if it was not yet.
    fn with_metas<T>(&self, look: impl FnOnce(&Metas) -> T) -> Result<T, StoreError> {
        let mut guard = self.metas.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = Some(Metas::of(self.scan_sessions()?));
        }
        Ok(look(guard.as_ref().expect("loaded above")))
    }

    fn cache_meta(&self, meta: &SessionMeta) {
        if let Some(metas) = self
            .metas
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            metas.insert(meta.clone());
        }
    }

    /// Every session's metadata, from disk (unreadable ones are skipped with a warning).
    fn scan_sessions(&self) -> Result<HashMap<String, SessionMeta>, StoreError> {
        let dir = self.root.join("sessions");
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(HashMap::new()),
            Err(e) => return Err(StoreError::io("list", &dir, e)),
        };
        let mut out = HashMap::new();
        for entry in entries.flatten() {
            let Ok(id) = entry.file_name().into_string() else {
                continue;
            };
            if check_id(&id).is_err() {
                continue;
            }
            match self.load_from_disk(&id) {
                Ok(Some(meta)) => {
                    out.insert(id, meta);
                }
                Ok(None) => {}
                Err(e) => warn!("skipping session {id}: {e}"),
            }
        }
        Ok(out)
    }

    fn workspaces_dir(&self) -> PathBuf {
        self.root.join("workspaces")
    }

    /// Runs `f` on the workspace cache, loading it from disk on first use.
    fn with_workspaces<R>(
        &self,
        f: impl FnOnce(&mut HashMap<String, WorkspaceFile>, &Path) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let mut guard = self.workspaces.lock().unwrap_or_else(|p| p.into_inner());
        let dir = self.workspaces_dir();
        if guard.is_none() {
            let mut map = HashMap::new();
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => Some(entries),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(StoreError::io("list", &dir, e)),
            };
            for entry in entries.into_iter().flatten().flatten() {
                let path = entry.path();
                if path.extension().is_none_or(|e| e != "json") {
                    continue;
                }
                // A file that cannot be read is not corrupt: with descriptors or memory used up
                // the error is returned and the records are read again next time; one that
                // cannot be read for its own reason (a directory of that name, another user's
                // file) is left where it is, said, and the others are read.
                let bytes = match std::fs::read(&path) {
                    Ok(bytes) => bytes,
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(nix::libc::EMFILE | nix::libc::ENFILE | nix::libc::ENOMEM)
                        ) =>
                    {
                        return Err(StoreError::io("read", &path, e));
                    }
                    Err(e) => {
                        warn!("{}: skipped, it cannot be read: {e}", path.display());
                        continue;
                    }
                };
                let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
                match serde_json::from_slice::<WorkspaceFile>(&bytes) {
                    // Its id names the file it is written to: it must be that file's own name.
                    Ok(file)
                        if check_id(&file.record.id).is_ok()
                            && stem.as_deref() == Some(file.record.id.as_str()) =>
                    {
                        map.insert(file.record.id.clone(), file);
                    }
                    // Left where it is when it cannot be moved: it is not written over.
                    Ok(_) => {
                        let _ = keep_aside(&path, "its id is not its file's name", self.inspecting);
                    }
                    Err(e) => {
                        let _ = keep_aside(&path, &e.to_string(), self.inspecting);
                    }
                }
            }
            *guard = Some(map);
        }
        let out = f(guard.as_mut().expect("loaded above"), &dir);
        // A write that failed may leave `f`'s change in memory alone: the records are read
        // again from the disk at their next use, so that none is served that the disk does not
        // hold (a deleted record came back at the restart; until then it was gone).
        if matches!(out, Err(StoreError::Io { .. })) {
            *guard = None;
        }
        out
    }

    fn write_workspace(dir: &Path, file: &WorkspaceFile) -> Result<(), StoreError> {
        create_private_dir(dir).map_err(map_io("create", dir))?;
        let bytes = serde_json::to_vec_pretty(file).expect("records serialize");
        atomic(&dir.join(format!("{}.json", file.record.id)), &bytes)
    }

    /// Runs `f` on the bindings (read on first use); `f` says whether it changed them, and
    /// they are written back when it did.
    fn with_bindings<R>(
        &self,
        f: impl FnOnce(&mut BindingsFile) -> (R, bool),
    ) -> Result<R, StoreError> {
        let mut guard = self.bindings.lock().unwrap_or_else(|p| p.into_inner());
        let path = self.root.join("bindings.toml");
        if guard.is_none() {
            let (file, migrated) = match std::fs::read_to_string(&path) {
                Ok(text) => match toml::from_str::<BindingsFile>(&text) {
                    Ok(file) => (file, false),
                    Err(e) => match toml::from_str::<OldBindingsFile>(&text) {
                        Ok(old) => {
                            let owner = |id: &str| self.load(id).ok().flatten().map(|m| m.owner);
                            (BindingsFile::migrate(old, owner), true)
                        }
                        Err(_) => {
                            let why = crate::fsutil::toml_problem(&text, &e);
                            keep_aside(&path, &why, self.inspecting)?;
                            (BindingsFile::default(), false)
                        }
                    },
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    (BindingsFile::default(), false)
                }
                // Not text: corrupt, as the folder registry's is (it failed every call before).
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    keep_aside(&path, "not UTF-8 text", self.inspecting)?;
                    (BindingsFile::default(), false)
                }
                Err(e) => return Err(StoreError::io("read", &path, e)),
            };
            if migrated && !self.inspecting {
                self.write_bindings(&path, &file)?;
            }
            *guard = Some(file);
        }
        let file = guard.as_mut().expect("loaded above");
        let (out, changed) = f(file);
        if changed {
            // Written, or forgotten: a change the disk does not hold is not served (read
            // again from the disk at the next use).
            let written = self
                .writable(&path)
                .and_then(|()| self.write_bindings(&path, file));
            if let Err(e) = written {
                *guard = None;
                return Err(e);
            }
        }
        Ok(out)
    }

    fn write_bindings(&self, path: &Path, file: &BindingsFile) -> Result<(), StoreError> {
        let text = toml::to_string(file).expect("bindings serialize");
        create_private_dir(&self.root).map_err(map_io("create", &self.root))?;
        atomic(path, text.as_bytes())
    }
}

impl FsStore {
    /// Runs `f` on the folder registry (read on first use: a corrupt file is kept aside with a
    /// warning, never deleted, and the registry starts empty); `f` says whether it changed it,
    /// and it is written back (atomically) when it did.
    fn with_folders<R>(
        &self,
        f: impl FnOnce(&mut FoldersFile) -> (R, bool),
    ) -> Result<R, StoreError> {
        let mut guard = self.folders.lock().unwrap_or_else(|p| p.into_inner());
        let path = self.root.join("folder_sessions.toml");
        if guard.is_none() {
            let file = match std::fs::read_to_string(&path) {
                Ok(text) => match toml::from_str::<FoldersFile>(&text) {
                    Ok(file) => file,
                    Err(e) => {
                        let why = crate::fsutil::toml_problem(&text, &e);
                        keep_aside(&path, &why, self.inspecting)?;
                        FoldersFile::default()
                    }
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => FoldersFile::default(),
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    keep_aside(&path, "not UTF-8 text", self.inspecting)?;
                    FoldersFile::default()
                }
                Err(e) => return Err(StoreError::io("read", &path, e)),
            };
            *guard = Some(file);
        }
        let file = guard.as_mut().expect("loaded above");
        let (out, changed) = f(file);
        if changed {
            // Written, or forgotten (read again from the disk at the next use).
            let written = self.writable(&path).and_then(|()| {
                let text = toml::to_string(file).expect("the folder registry serializes");
                create_private_dir(&self.root).map_err(map_io("create", &self.root))?;
                atomic(&path, text.as_bytes())
            });
            if let Err(e) = written {
                *guard = None;
                return Err(e);
            }
        }
        Ok(out)
    }
}

impl FolderStore for FsStore {
    fn folder_sessions(
        &self,
        user: &str,
        device: &str,
    ) -> Result<Vec<crate::roots::FolderSessions>, StoreError> {
        self.with_folders(|file| {
            let mine = file
                .folders
                .iter()
                .filter(|e| e.user == user && e.device == device)
                .cloned()
                .collect();
            (mine, false)
        })
    }

    fn save_folder_sessions(&self, entry: &crate::roots::FolderSessions) -> Result<(), StoreError> {
        self.with_folders(|file| {
            let at = file.folders.iter().position(|e| {
                e.user == entry.user && e.device == entry.device && e.folder == entry.folder
            });
            let changed = match (at, entry.is_empty()) {
                (Some(at), true) => {
                    file.folders.remove(at);
                    true
                }
                (Some(at), false) => {
                    let changed = file.folders[at] != *entry;
                    file.folders[at] = entry.clone();
                    changed
                }
                (None, true) => false,
                (None, false) => {
                    // The user's folders are bounded: the ones used longest ago go first.
                    let mut theirs: Vec<(u64, usize)> = (file.folders.iter().enumerate())
                        .filter(|(_, e)| e.user == entry.user)
                        .map(|(at, e)| (e.last_use(), at))
                        .collect();
                    let over =
                        (theirs.len() + 1).saturating_sub(crate::roots::MAX_FOLDERS_PER_USER);
                    if over > 0 {
                        theirs.sort_unstable();
                        let mut gone: Vec<usize> =
                            theirs[..over].iter().map(|&(_, at)| at).collect();
                        gone.sort_unstable_by(|a, b| b.cmp(a));
                        for at in gone {
                            file.folders.remove(at);
                        }
                    }
                    file.folders.push(entry.clone());
                    true
                }
            };
            ((), changed)
        })
    }

    fn prune_folder_sessions(
        &self,
        now: u64,
        last_active: &HashMap<String, u64>,
    ) -> Result<usize, StoreError> {
        self.with_folders(|file| {
            let (mut changed, mut pruned) = (false, 0);
            for entry in &mut file.folders {
                let (entry_changed, entry_pruned) = entry.prune_by_activity(now, last_active);
                changed |= entry_changed;
                pruned += usize::from(entry_pruned);
            }
            file.folders.retain(|e| !e.is_empty());
            (pruned, changed)
        })
    }
}

impl SessionStore for FsStore {
    fn create(&self, meta: &SessionMeta) -> Result<(), StoreError> {
        check_id(&meta.id)?;
        let dir = self.session_dir(&meta.id);
        let toml_path = dir.join("session.toml");
        // Under the session's lock from the check to the write: of two racing creations, one
        // makes the session and the other is told it exists.
        let _guard = self.lock(&meta.id);
        if toml_path.exists() {
            return Err(StoreError::Invalid(format!("session {} exists", meta.id)));
        }
        create_workspace_root(&dir.join("workspace")).map_err(map_io("create", &dir))?;
        // A session whose metadata was lost (kept aside as corrupt) keeps its conversation.
        let md = dir.join("session.md");
        if !md.exists() {
            let history = history::empty(
                meta.created_at.clone(),
                meta.provider.clone(),
                meta.model.clone(),
            );
            atomic(&md, history::render_frontmatter(&history).as_bytes())?;
        }
        // session.toml last: a session exists once its metadata does.
        self.save_locked(meta)
    }

    /// From the cache when it has it. Otherwise from disk, without the session's lock (a load
    /// does not wait for a write), and put in the cache only if nothing came in between: a
    /// session deleted meanwhile (read before it went, put back after, it was listed, counted
    /// and loaded until a restart), or saved meanwhile (an older copy over the newer).
    fn load(&self, id: &str) -> Result<Option<SessionMeta>, StoreError> {
        check_id(id)?;
        let seen = match self
            .metas
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            Some(metas) => match metas.get(id) {
                Some(meta) => return Ok(Some(meta.clone())),
                None => Some(metas.deletions),
            },
            None => None,
        };
        let meta = self.load_from_disk(id)?;
        if let (Some(meta), Some(seen)) = (&meta, seen)
            && let Some(metas) = self
                .metas
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_mut()
            && metas.deletions == seen
            && metas.get(id).is_none()
        {
            metas.insert(meta.clone());
        }
        Ok(meta)
    }

    fn save(&self, meta: &SessionMeta) -> Result<(), StoreError> {
        check_id(&meta.id)?;
        // Under the session's lock, so the cache ends up holding what the disk holds.
        let _guard = self.lock(&meta.id);
        self.save_locked(meta)
    }

    fn all_sessions(&self) -> Result<Vec<SessionMeta>, StoreError> {
        self.with_metas(|metas| metas.all().cloned().collect())
    }

    fn owner_sessions(&self, owner: &str) -> Result<Vec<SessionMeta>, StoreError> {
        self.with_metas(|metas| metas.owned(owner).cloned().collect())
    }

    fn count_sessions(&self, owner: &str) -> Result<usize, StoreError> {
        self.with_metas(|metas| metas.by_owner.get(owner).map_or(0, HashMap::len))
    }

    fn delete(&self, id: &str) -> Result<(), StoreError> {
        check_id(id)?;
        let _guard = self.lock(id);
        let dir = self.session_dir(id);
        self.mark_checked(id, false);
        // Out of the cache before the files go, and again after: a listing's scan or a load
        // may have read it from disk in between ([`FsStore::load`]).
        let uncache = || {
            if let Some(metas) = self
                .metas
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_mut()
            {
                metas.remove(id);
                metas.deletions += 1;
            }
        };
        uncache();
        self.forget_tally(id);
        // Renamed away first: a delete cut short leaves nothing under the id that its next
        // creator (of any user) would take over as its own.
        let gone = crate::fsutil::remove_dir_by_rename(&dir);
        uncache();
        match gone {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(StoreError::NotFound(format!("session {id}")))
            }
            Err(e) => Err(StoreError::io("delete", &dir, e)),
        }
    }

    fn history(&self, id: &str) -> Result<History, StoreError> {
        check_id(id)?;
        let _guard = self.lock(id);
        self.read_history(id, false)
    }

    fn append(&self, id: &str, message: &HistoryMessage) -> Result<(), StoreError> {
        check_id(id)?;
        let _guard = self.lock(id);
        let path = self.history_path(id);
        if !self.is_checked(id) {
            // Read it whole once: appending to a corrupt file would bury the new message in
            // what is kept aside at the next read. (Also writes a missing file's frontmatter.)
            self.read_history(id, true)?;
        }
        let rendered = render_message(message);
        // The file's own size, under the session's lock: measured and written as one step.
        let size = match std::fs::metadata(&path) {
            Ok(meta) => meta.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(StoreError::io("look at", &path, e)),
        };
        history_fits(id, size.saturating_add(rendered.len() as u64))?;
        append_durable(&path, rendered.as_bytes())
    }

    fn replace(&self, id: &str, history: &History) -> Result<(), StoreError> {
        check_id(id)?;
        // Counted as every store and the requests before it count it: a replace they let
        // through is not refused here after they changed the session.
        history_fits(id, history_bytes(&history.messages))?;
        let _guard = self.lock(id);
        atomic(&self.history_path(id), history::render(history).as_bytes())?;
        self.mark_checked(id, true);
        Ok(())
    }

    fn set_history_model(
        &self,
        id: &str,
        provider: Option<&str>,
        model: Option<&str>,
    ) -> Result<(), StoreError> {
        check_id(id)?;
        let _guard = self.lock(id);
        if self.load(id)?.is_none() {
            return Err(StoreError::NotFound(format!("session {id}")));
        }
        let mut history = self.read_history(id, false)?;
        history.provider = provider.map(str::to_owned);
        history.model = model.map(str::to_owned);
        atomic(&self.history_path(id), history::render(&history).as_bytes())?;
        self.mark_checked(id, true);
        Ok(())
    }

    fn audit(&self, id: &str, records: &[AuditRecord]) -> Result<(), StoreError> {
        check_id(id)?;
        if records.is_empty() {
            return Ok(());
        }
        let mut bytes = Vec::new();
        for r in records {
            serde_json::to_writer(&mut bytes, r).expect("records serialize");
            bytes.push(b'\n');
        }
        let appended = append_durable(&self.session_dir(id).join("audit.jsonl"), &bytes);
        if appended.is_err() {
            // Cut back to where it was: a count that read the lines meanwhile is not kept.
            self.forget_tally(id);
        }
        appended
    }

    fn audit_log(&self, id: &str) -> Result<Vec<AuditRecord>, StoreError> {
        check_id(id)?;
        read_jsonl(&self.session_dir(id).join("audit.jsonl"))
    }

    /// The records [`SessionStore::audit_page`] pages through, in the log's whole lines: a line
    /// that is not a record (one a later version wrote, one edited by hand) is not counted, as
    /// it is not paged, so that the last page of a count is the last records. Only the lines
    /// appended since the last count are read ([`AuditTally`]), a line at a time.
    fn audit_count(&self, id: &str) -> Result<usize, StoreError> {
        use std::io::{BufRead, Seek};
        use std::os::unix::fs::MetadataExt;
        check_id(id)?;
        let path = self.session_dir(id).join("audit.jsonl");
        let forgets = self.audit_forgets.load(std::sync::atomic::Ordering::SeqCst);
        let file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(StoreError::io("read", &path, e)),
        };
        let meta = file.metadata().map_err(map_io("stat", &path))?;
        let known = self
            .audit_tallies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .copied();
        let born = meta.created().ok();
        let mut tally = known
            .filter(|t| {
                (t.dev, t.ino, t.born) == (meta.dev(), meta.ino(), born) && t.upto <= meta.len()
            })
            .unwrap_or(AuditTally {
                dev: meta.dev(),
                ino: meta.ino(),
                born,
                ..AuditTally::default()
            });
        if tally.upto < meta.len() {
            let mut reader = std::io::BufReader::with_capacity(64 * 1024, file);
            reader
                .seek(std::io::SeekFrom::Start(tally.upto))
                .map_err(map_io("read", &path))?;
            let mut line = Vec::new();
            loop {
                line.clear();
                let n = reader
                    .read_until(b'\n', &mut line)
                    .map_err(map_io("read", &path))?;
                // A torn end (no line break yet) is not a record, and is read again next time.
                let Some(text) = line.strip_suffix(b"\n") else {
                    break;
                };
                if !text.is_empty() && serde_json::from_slice::<AuditRecord>(text).is_ok() {
                    tally.records += 1;
                }
                tally.upto += n as u64;
            }
            let mut tallies = self.audit_tallies.lock().unwrap_or_else(|p| p.into_inner());
            if self.audit_forgets.load(std::sync::atomic::Ordering::SeqCst) == forgets {
                tallies.insert(id.to_owned(), tally);
            }
        }
        Ok(tally.records)
    }

    /// A line at a time: only the records asked for are kept, the others read and dropped (so
    /// that positions are those of [`SessionStore::audit_log`], which skips a line that is not a
    /// record); a page of a log of millions of calls held the whole log, as records, in memory.
    fn audit_page(
        &self,
        id: &str,
        offset: usize,
        limit: usize,
    ) -> Result<(Vec<AuditRecord>, usize), StoreError> {
        check_id(id)?;
        let path = self.session_dir(id).join("audit.jsonl");
        let mut page = Vec::new();
        let total = each_record_line(&path, |at, line| {
            if at >= offset && page.len() < limit {
                serde_json::from_slice(line).map(|record| page.push(record))
            } else {
                serde_json::from_slice::<AuditRecord>(line).map(|_| ())
            }
        })?;
        Ok((page, total))
    }

    fn config_text(&self, id: &str) -> Result<Option<(String, String)>, StoreError> {
        check_id(id)?;
        let path = self.session_dir(id).join("config.toml");
        match monad_protocol::settings_file::read(&path) {
            Ok(text) => Ok(text.map(|text| (path.display().to_string(), text))),
            Err(e) => Err(StoreError::io("read", &path, e)),
        }
    }
}

/// Reads a JSON-lines file, a line at a time ([`each_record_line`]); a line that does not parse
/// (a torn last record) is skipped.
fn read_jsonl<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<T>, StoreError> {
    let mut records = Vec::new();
    each_record_line(path, |_, line| {
        serde_json::from_slice(line).map(|record| records.push(record))
    })?;
    Ok(records)
}

/// An index line as its bytes, and, when it reads as one, the artifact it names and where its
/// content is.
type RawIndexLine = (Vec<u8>, Option<IndexRef>);

/// Of an index line read whole ([`IndexLine`]), what a rewrite of the index needs: the
/// artifact's id and its content's place in the pack. The line's tree (an upload's metadata,
/// up to 64 KiB of JSON, can be a tree of about 1 MiB) is not kept: a rewrite holds one at a
/// time, not one per artifact of the session.
struct IndexRef {
    id: String,
    pack: Option<[u64; 2]>,
}

/// The artifact index's whole lines, each as its bytes (its newline included) and what it says:
/// `None` for a line that does not read as an index line (a corrupt one, or a newer version's),
/// which a rewrite keeps as it is: a corrupt file's lines are never dropped, nor the pack
/// bytes they may name. A torn last line (no newline: a crash in an append) is left out, as
/// the next append would cut it.
fn index_lines(index: &Path) -> Result<Vec<RawIndexLine>, StoreError> {
    Ok(parse_index_lines(&index_bytes(index)?))
}

/// The artifact index's bytes; none when there is no index.
fn index_bytes(index: &Path) -> Result<Vec<u8>, StoreError> {
    match std::fs::read(index) {
        Ok(bytes) => Ok(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(StoreError::io("read", index, e)),
    }
}

/// [`index_lines`] of the index's `bytes`.
fn parse_index_lines(bytes: &[u8]) -> Vec<RawIndexLine> {
    bytes
        .split_inclusive(|&b| b == b'\n')
        .filter(|line| line.ends_with(b"\n") && line.len() > 1)
        .map(|line| {
            let parsed = serde_json::from_slice::<IndexLine>(&line[..line.len() - 1])
                .ok()
                .map(|l| IndexRef {
                    id: l.meta.id,
                    pack: l.pack,
                });
            (line.to_vec(), parsed)
        })
        .collect()
}

/// Calls `each` with every non-empty line of the JSON Lines file at `path` and how many records
/// came before it; a line `each` cannot read (a torn last record) is skipped with a warning. How
/// many records there are. One line is held at a time.
fn each_record_line(
    path: &Path,
    mut each: impl FnMut(usize, &[u8]) -> Result<(), serde_json::Error>,
) -> Result<usize, StoreError> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(StoreError::io("read", path, e)),
    };
    each_record_line_of(&file, path, |_, records, line| each(records, line))
}

/// [`each_record_line`] over `file` (open at its start; `path` names it in messages), with
/// each line's byte offset in the file as well.
fn each_record_line_of(
    file: &std::fs::File,
    path: &Path,
    mut each: impl FnMut(u64, usize, &[u8]) -> Result<(), serde_json::Error>,
) -> Result<usize, StoreError> {
    use std::io::BufRead;
    let mut reader = std::io::BufReader::with_capacity(64 * 1024, file);
    let mut line = Vec::new();
    let mut records = 0;
    let mut at = 0u64;
    loop {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .map_err(map_io("read", path))?;
        if n == 0 {
            return Ok(records);
        }
        let start = at;
        at += n as u64;
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        if text.is_empty() {
            continue;
        }
        match each(start, records, text) {
            Ok(()) => records += 1,
            Err(e) => warn!("{}: skipping an unreadable record: {e}", path.display()),
        }
    }
}

impl WorkspaceStore for FsStore {
    fn resolve_record(
        &self,
        user: &str,
        device_id: &str,
        path: &str,
        uri: &str,
    ) -> Result<WorkspaceRecord, StoreError> {
        self.with_workspaces(|map, dir| {
            if let Some(file) = map.values_mut().find(|f| {
                f.record.user == user && f.record.device_id == device_id && f.record.path == path
            }) {
                if file.record.uri != uri {
                    file.record.uri = uri.to_owned();
                    FsStore::write_workspace(dir, file)?;
                }
                return Ok(file.record.clone());
            }
            let now = now_rfc3339();
            let file = WorkspaceFile {
                record: WorkspaceRecord {
                    id: uuid::Uuid::new_v4().to_string(),
                    user: user.to_owned(),
                    device_id: device_id.to_owned(),
                    path: path.to_owned(),
                    uri: uri.to_owned(),
                    created_at: now.clone(),
                    last_active: now,
                },
                sessions: Vec::new(),
            };
            FsStore::write_workspace(dir, &file)?;
            let record = file.record.clone();
            map.insert(record.id.clone(), file);
            Ok(record)
        })
    }

    fn record(&self, id: &str) -> Result<Option<WorkspaceRecord>, StoreError> {
        self.with_workspaces(|map, _| Ok(map.get(id).map(|f| f.record.clone())))
    }

    fn records(&self, user: Option<&str>) -> Result<Vec<WorkspaceRecord>, StoreError> {
        self.with_workspaces(|map, _| {
            let mut out: Vec<WorkspaceRecord> = map
                .values()
                .filter(|f| user.is_none_or(|u| f.record.user == u))
                .map(|f| f.record.clone())
                .collect();
            out.sort_by(|a, b| b.last_active.cmp(&a.last_active).then(a.id.cmp(&b.id)));
            Ok(out)
        })
    }

    /// One pass over the records, under the records' lock once (paging through each record's
    /// sessions took it, and cloned and sorted the record's sessions, once a page).
    fn session_records(&self, user: &str, session: &str) -> Result<Vec<String>, StoreError> {
        self.with_workspaces(|map, _| {
            let mut found: Vec<(&str, &str)> = map
                .values()
                .filter(|f| {
                    f.record.user == user && f.sessions.iter().any(|s| s.session == session)
                })
                .map(|f| (f.record.last_active.as_str(), f.record.id.as_str()))
                .collect();
            found.sort_by(|a, b| b.0.cmp(a.0).then(a.1.cmp(b.1)));
            Ok(found.into_iter().map(|(_, id)| id.to_owned()).collect())
        })
    }

    fn touch_record(&self, id: &str, session: &str, calls: u64) -> Result<(), StoreError> {
        self.with_workspaces(|map, dir| {
            let Some(file) = map.get_mut(id) else {
                return Err(StoreError::NotFound(format!("workspace record {id}")));
            };
            let now = now_rfc3339();
            file.record.last_active = now.clone();
            match file.sessions.iter_mut().find(|s| s.session == session) {
                Some(s) => {
                    s.last_active = now;
                    s.calls += calls;
                }
                None => file.sessions.push(WorkspaceSession {
                    session: session.to_owned(),
                    first_at: now.clone(),
                    last_active: now,
                    calls,
                }),
            }
            FsStore::write_workspace(dir, file)
        })
    }

    fn record_sessions(
        &self,
        id: &str,
        limit: usize,
        next: Option<&str>,
    ) -> Result<Page<WorkspaceSession>, StoreError> {
        if !(1..=100).contains(&limit) {
            return Err(StoreError::Invalid(format!(
                "limit {limit} is out of range: 1 to 100"
            )));
        }
        let after = next.map(decode_cursor).transpose()?;
        self.with_workspaces(|map, _| {
            let Some(file) = map.get(id) else {
                return Err(StoreError::NotFound(format!("workspace record {id}")));
            };
            Ok(page(&file.sessions, limit, after.as_ref()))
        })
    }

    fn add_record(&self, record: &WorkspaceRecord) -> Result<(), StoreError> {
        check_id(&record.id)?;
        self.with_workspaces(|map, dir| {
            if map.contains_key(&record.id) {
                return Err(StoreError::Invalid(format!(
                    "workspace record {} exists",
                    record.id
                )));
            }
            let file = WorkspaceFile {
                record: record.clone(),
                sessions: Vec::new(),
            };
            FsStore::write_workspace(dir, &file)?;
            map.insert(record.id.clone(), file);
            Ok(())
        })
    }

    fn delete_record(&self, id: &str) -> Result<(), StoreError> {
        check_id(id)?;
        self.with_workspaces(|map, dir| {
            if map.remove(id).is_none() {
                return Err(StoreError::NotFound(format!("workspace record {id}")));
            }
            let path = dir.join(format!("{id}.json"));
            match std::fs::remove_file(&path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(StoreError::io("delete", &path, e)),
            }
        })
    }

    fn forget_session(&self, session: &str) -> Result<(), StoreError> {
        self.with_workspaces(|map, dir| {
            for file in map.values_mut() {
                let before = file.sessions.len();
                file.sessions.retain(|s| s.session != session);
                if file.sessions.len() != before {
                    FsStore::write_workspace(dir, file)?;
                }
            }
            Ok(())
        })
    }
}

/// The order of a session list: most recent first, then by id, so the order is total and a
/// cursor names a position exactly.
fn order_key(s: &WorkspaceSession) -> (std::cmp::Reverse<&str>, &str) {
    (
        std::cmp::Reverse(s.last_active.as_str()),
        s.session.as_str(),
    )
}

/// A keyset page: the `limit` items after `after` in the list order.
pub(crate) fn page(
    all: &[WorkspaceSession],
    limit: usize,
    after: Option<&(String, String)>,
) -> Page<WorkspaceSession> {
    let mut sorted: Vec<&WorkspaceSession> = all.iter().collect();
    sorted.sort_by(|a, b| order_key(a).cmp(&order_key(b)));
    let start = match after {
        Some((last_active, session)) => {
            let key = (std::cmp::Reverse(last_active.as_str()), session.as_str());
            sorted.partition_point(|s| order_key(s) <= key)
        }
        None => 0,
    };
    let items: Vec<WorkspaceSession> = sorted[start..]
        .iter()
        .take(limit)
        .map(|s| (*s).clone())
        .collect();
    let next = (start + items.len() < sorted.len())
        .then(|| {
            items
                .last()
                .map(|s| encode_cursor(&s.last_active, &s.session))
        })
        .flatten();
    Page { items, next }
}

/// An opaque cursor: the hex of `last_active \n session`.
pub(crate) fn encode_cursor(last_active: &str, session: &str) -> String {
    format!("{last_active}\n{session}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub(crate) fn decode_cursor(token: &str) -> Result<(String, String), StoreError> {
    let bad = || StoreError::Invalid(format!("`{token}` is not a page token from this server"));
    // Hex digits only: anything else (a multi-byte character) is refused before slicing.
    if !token.len().is_multiple_of(2)
        || token.len() > 512
        || !token.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Err(bad());
    }
    let bytes: Vec<u8> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&token[i..i + 2], 16))
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    let (a, s) = text.split_once('\n').ok_or_else(bad)?;
    Ok((a.to_owned(), s.to_owned()))
}

impl BindingStore for FsStore {
    fn bound_session(&self, user: &str, device_id: &str) -> Result<Option<String>, StoreError> {
        self.with_bindings(|file| file.lookup(user, device_id, unix_ms()))
    }

    fn bind(&self, user: &str, device_id: &str, session: &str) -> Result<(), StoreError> {
        let max = self.max_devices_per_user;
        self.with_bindings(|file| ((), file.bind(user, device_id, session, unix_ms(), max)))
    }

    fn default_session(&self, user: &str) -> Result<Option<String>, StoreError> {
        self.with_bindings(|file| (file.defaults.get(user).cloned(), false))
    }

    fn set_default_session(&self, user: &str, session: &str) -> Result<(), StoreError> {
        self.with_bindings(|file| {
            let before = file.defaults.insert(user.to_owned(), session.to_owned());
            ((), before.as_deref() != Some(session))
        })
    }

    fn unbind_session(&self, session: &str) -> Result<(), StoreError> {
        self.with_bindings(|file| {
            let mut changed = false;
            for devices in file.bindings.values_mut() {
                let before = devices.len();
                devices.retain(|_, b| b.session != session);
                changed |= devices.len() != before;
            }
            file.bindings.retain(|_, devices| !devices.is_empty());
            let before = file.defaults.len();
            file.defaults.retain(|_, s| s != session);
            changed |= file.defaults.len() != before;
            ((), changed)
        })
    }

    fn devices_bound_to(&self, session: &str) -> Result<usize, StoreError> {
        self.with_bindings(|file| {
            let n = file
                .bindings
                .values()
                .flat_map(|devices| devices.values())
                .filter(|b| b.session == session)
                .count();
            (n, false)
        })
    }
}

/// The file that holds a session's artifact contents one after another (`artifacts/pack`),
/// except the history snapshot, which each upload replaces and so keeps a file of its own.
///
/// Appending to one file instead of creating a file per artifact is what keeps recording cheap:
/// a new file per tool call cost the server about a third of its CPU in the end-to-end bench
/// (ext4 inode allocation, the rename, the directory fsync; see `docs/benchmarks.md`).
const PACK: &str = "pack";

/// One line of `artifacts/index.jsonl`: the metadata, and where the content is in the pack
/// (absent for a content file of its own, `<id>.bin`, as earlier versions wrote every artifact).
#[derive(Debug, Serialize, Deserialize)]
pub struct IndexLine {
    /// The artifact's metadata.
    #[serde(flatten)]
    pub meta: ArtifactMeta,
    /// `[offset, length]` of the content in `artifacts/pack`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack: Option<[u64; 2]>,
}

/// Of an index line, its artifact's id alone: what a lookup reads of every line, without
/// making a tree of its metadata.
#[derive(Deserialize)]
struct IndexId<'a> {
    #[serde(borrow)]
    id: std::borrow::Cow<'a, str>,
}

/// Of an index line, its artifact's id and the call it came from, without its metadata's tree.
#[derive(Deserialize)]
struct IndexCall<'a> {
    #[serde(borrow)]
    id: std::borrow::Cow<'a, str>,
    #[serde(default, borrow)]
    call_id: Option<std::borrow::Cow<'a, str>>,
}

impl FsStore {
    /// The latest index lines of the artifacts of `calls`, in the order they first came (as
    /// [`FsStore::index`]'s): every line is read for its id and call alone, and only those of
    /// `calls` whole. An artifact whose latest line is of another call is not theirs.
    fn index_of_calls(
        &self,
        session: &str,
        calls: &std::collections::HashSet<String>,
    ) -> Result<Vec<ArtifactMeta>, StoreError> {
        let path = self.session_dir(session).join("artifacts/index.jsonl");
        let mut order: Vec<String> = Vec::new();
        let mut found: HashMap<String, ArtifactMeta> = HashMap::new();
        each_record_line(&path, |_, line| {
            let IndexCall { id, call_id } = serde_json::from_slice(line)?;
            if call_id.is_some_and(|c| calls.contains(c.as_ref())) {
                let read: IndexLine = serde_json::from_slice(line)?;
                if !found.contains_key(id.as_ref()) {
                    order.push(id.clone().into_owned());
                }
                found.insert(id.into_owned(), read.meta);
            } else if found.contains_key(id.as_ref()) {
                // Its latest line is of another call, when it is an index line at all (one that
                // is not is skipped here as everywhere else, and must not take an earlier one's
                // place).
                serde_json::from_slice::<IndexLine>(line)?;
                found.remove(id.as_ref());
            }
            Ok(())
        })?;
        Ok(order
            .into_iter()
            .filter_map(|id| found.remove(&id))
            .collect())
    }

    /// The latest index line of artifact `id`: every line is read for its id alone, and only
    /// the lines of `id` whole (a download made a tree of every artifact's metadata).
    fn index_line(&self, session: &str, id: &str) -> Result<Option<IndexLine>, StoreError> {
        let path = self.session_dir(session).join("artifacts/index.jsonl");
        let mut found = None;
        each_record_line(&path, |_, line| {
            if serde_json::from_slice::<IndexId<'_>>(line)?.id == id {
                found = Some(serde_json::from_slice(line)?);
            }
            Ok(())
        })?;
        Ok(found)
    }

    /// `limit` artifacts from position `offset(total)` of [`FsStore::index`]'s order (the same
    /// lines, skipped the same way), `total` being how many there are. One pass over the index
    /// keeps where each id's latest
    /// line is, making no more than one line's tree at a time; the page's lines are then read
    /// again from the same open file (a rewrite in between, a delete's, renames a new file over
    /// it: this one stays whole; a line cut off its end meanwhile, or another in its place, is
    /// left out).
    fn index_page(
        &self,
        session: &str,
        offset: impl FnOnce(usize) -> usize,
        limit: usize,
    ) -> Result<ArtifactPage, StoreError> {
        use std::os::unix::fs::FileExt;
        let path = self.session_dir(session).join("artifacts/index.jsonl");
        let file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(ArtifactPage::default());
            }
            Err(e) => return Err(StoreError::io("read", &path, e)),
        };
        // Each id in the order it first came, and where its latest line is (offset, length).
        let mut order: Vec<String> = Vec::new();
        let mut latest: HashMap<String, (u64, usize)> = HashMap::new();
        each_record_line_of(&file, &path, |start, _, line| {
            let id = serde_json::from_slice::<IndexLine>(line)?.meta.id;
            if !latest.contains_key(&id) {
                order.push(id.clone());
            }
            latest.insert(id, (start, line.len()));
            Ok(())
        })?;
        let total = order.len();
        // Where the page starts, of all there are (the latest `n` start at `total - n`).
        let offset = offset(total);
        let mut page = Vec::new();
        let mut end = offset.min(total);
        for id in order.iter().skip(offset).take(limit) {
            end += 1;
            let (start, len) = latest[id];
            let mut bytes = vec![0; len];
            match file.read_exact_at(&mut bytes, start) {
                Ok(()) => {}
                // Cut in place meanwhile (a torn line, or a failed append, taken off the end).
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => continue,
                Err(e) => return Err(StoreError::io("read", &path, e)),
            }
            match serde_json::from_slice::<IndexLine>(&bytes) {
                // The same line, not what an append put in its place after a cut.
                Ok(read) if read.meta.id == *id => page.push(read.meta),
                Ok(_) => {}
                Err(e) => warn!("{}: skipping an unreadable record: {e}", path.display()),
            }
        }
        Ok(ArtifactPage {
            artifacts: page,
            end,
            total,
        })
    }

    /// The index's lines, the latest for each id, oldest id first (a replaced artifact, the
    /// history snapshot, keeps its place).
    fn index(&self, session: &str) -> Result<Vec<IndexLine>, StoreError> {
        let all: Vec<IndexLine> =
            read_jsonl(&self.session_dir(session).join("artifacts/index.jsonl"))?;
        let mut order: Vec<String> = Vec::new();
        let mut latest: HashMap<String, IndexLine> = HashMap::new();
        for line in all {
            if !latest.contains_key(&line.meta.id) {
                order.push(line.meta.id.clone());
            }
            latest.insert(line.meta.id.clone(), line);
        }
        Ok(order
            .into_iter()
            .filter_map(|id| latest.remove(&id))
            .collect())
    }
}

impl FsStore {
    /// Stores tool outputs and diffs of one session (ids checked by the caller): their contents
    /// appended to the pack and made durable with one sync, then their index lines with one.
    /// On an error none of them is in the index (content already appended stays unnamed, as
    /// after a crash mid-write).
    fn put_packed(&self, run: &[(ArtifactMeta, Vec<u8>)]) -> Result<(), StoreError> {
        let Some((first, _)) = run.first() else {
            return Ok(());
        };
        let dir = self.session_dir(&first.session).join("artifacts");
        let _guard = self.lock(&first.session);
        create_private_dir(&dir).map_err(map_io("create", &dir))?;
        let contents: Vec<&[u8]> = run.iter().map(|(_, c)| c.as_slice()).collect();
        let ranges = append_to_pack(&dir.join(PACK), &contents)?;
        let mut lines = Vec::new();
        for ((meta, _), range) in run.iter().zip(ranges) {
            serde_json::to_writer(
                &mut lines,
                &IndexLine {
                    meta: meta.clone(),
                    pack: Some(range),
                },
            )
            .expect("metadata serializes");
            lines.push(b'\n');
        }
        append_durable(&dir.join("index.jsonl"), &lines)
    }
}

/// Appends each of `contents` to the pack, one after the other, and makes them durable with one
/// sync; returns where each went. The caller holds the session's lock, and this store is the
/// pack's only writer, so the end does not move between the seek and the writes. A write cut
/// short by a crash leaves bytes no index line names; the next content goes after them.
fn append_to_pack(path: &Path, contents: &[&[u8]]) -> Result<Vec<[u64; 2]>, StoreError> {
    use std::io::{Seek, SeekFrom};
    let mut file = open_append(path)?;
    let mut offset = file.seek(SeekFrom::End(0)).map_err(map_io("seek", path))?;
    let mut ranges = Vec::with_capacity(contents.len());
    for content in contents {
        file.write_all(content).map_err(map_io("append to", path))?;
        ranges.push([offset, content.len() as u64]);
        offset += content.len() as u64;
    }
    file.sync_data().map_err(map_io("sync", path))?;
    Ok(ranges)
}

/// `bytes` as text, or as much of it as is text when only its last line is not: a crash that
/// cut an append in the middle of a character leaves a torn last line, which reads as a
/// shorter message (as a torn line of ASCII does), not as a corrupt conversation. `None` when
/// bytes before the last line are not UTF-8.
fn torn_text(bytes: &[u8]) -> Option<&str> {
    match std::str::from_utf8(bytes) {
        Ok(text) => Some(text),
        Err(e) => {
            let valid = e.valid_up_to();
            let last_line = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            (e.error_len().is_none() || valid >= last_line)
                .then(|| std::str::from_utf8(&bytes[..valid]).ok())
                .flatten()
        }
    }
}

/// Reads `[offset, length]` of the pack; a range the pack does not hold whole is an error.
fn read_from_pack(path: &Path, [offset, len]: [u64; 2]) -> Result<Vec<u8>, StoreError> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path).map_err(map_io("open", path))?;
    // Checked against the pack before anything is allocated: a corrupt index line's length
    // (a TiB) would otherwise end the whole process.
    let size = file.metadata().map_err(map_io("read", path))?.len();
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(corrupt_pack(path, offset, len));
    }
    let len = usize::try_from(len).map_err(|_| corrupt_pack(path, offset, len))?;
    let mut content = vec![0; len];
    file.read_exact_at(&mut content, offset).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            corrupt_pack(path, offset, len as u64)
        } else {
            StoreError::io("read", path, e)
        }
    })?;
    Ok(content)
}

fn corrupt_pack(path: &Path, offset: u64, len: u64) -> StoreError {
    StoreError::io(
        "read",
        path,
        std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!(
                "the index names bytes {offset}..{} that the pack does not hold",
                offset.saturating_add(len)
            ),
        ),
    )
}

/// Frees the pack's bytes in `ranges` (a deleted artifact's content must not stay readable on
/// disk): punches holes where the filesystem can, writes zeros over them where it cannot, and
/// makes that durable.
fn erase_from_pack(path: &Path, ranges: &[[u64; 2]]) -> Result<(), StoreError> {
    use nix::fcntl::{FallocateFlags, fallocate};
    use std::os::unix::fs::FileExt;
    let file = match std::fs::OpenOptions::new().write(true).open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StoreError::io("open", path, e)),
    };
    let size = file.metadata().map_err(map_io("stat", path))?.len();
    for &[offset, len] in ranges {
        // Only what the pack holds: a range past its end (a corrupt line) has nothing to erase.
        let len = len.min(size.saturating_sub(offset));
        if len == 0 {
            continue;
        }
        let (Ok(start), Ok(n)) = (i64::try_from(offset), i64::try_from(len)) else {
            continue;
        };
        let punched = fallocate(
            &file,
            FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
            start,
            n,
        );
        if punched.is_err() {
            static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];
            let mut at = offset;
            let end = offset + len;
            while at < end {
                let chunk = usize::try_from(end - at).map_or(ZEROS.len(), |n| n.min(ZEROS.len()));
                file.write_all_at(&ZEROS[..chunk], at)
                    .map_err(map_io("erase in", path))?;
                at += chunk as u64;
            }
        }
    }
    file.sync_data().map_err(map_io("sync", path))
}

/// Frees the bytes of `dir`'s pack that no line of its index (`lines`) names: a deleted
/// artifact's, when a crash came between the index's rewrite and the erasing (they stayed on
/// disk for good), or an upload's whose line was never written. Nothing when a line cannot be
/// read: it may name bytes. The caller holds the session's lock.
fn erase_unnamed<'a>(
    dir: &Path,
    lines: impl IntoIterator<Item = &'a RawIndexLine>,
) -> Result<(), StoreError> {
    let mut named = Vec::new();
    for (_, parsed) in lines {
        match parsed {
            Some(line) => named.extend(line.pack),
            None => return Ok(()),
        }
    }
    let pack = dir.join(PACK);
    let size = match std::fs::metadata(&pack) {
        Ok(meta) => meta.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StoreError::io("stat", &pack, e)),
    };
    named.sort_unstable();
    let mut unnamed = Vec::new();
    let mut at = 0u64;
    for [offset, len] in named {
        if offset > at {
            unnamed.push([at, offset - at]);
        }
        at = at.max(offset.saturating_add(len));
    }
    if size > at {
        unnamed.push([at, size - at]);
    }
    // A range erased before stays in the pack as a hole (and its partly covered edge blocks as
    // zeros): only what still holds data is erased (and synced), not every hole again at every
    // start.
    let file = std::fs::File::open(&pack).map_err(map_io("open", &pack))?;
    unnamed.retain(|&[offset, len]| holds_data(&file, offset, len));
    if unnamed.is_empty() {
        return Ok(());
    }
    erase_from_pack(&pack, &unnamed)
}

/// Whether bytes `offset..offset + len` of `file` hold anything but zeros: the whole blocks in
/// the range by `SEEK_DATA` (a hole holds none), the partly covered blocks at its ends read.
/// True when it cannot tell.
fn holds_data(file: &std::fs::File, offset: u64, len: u64) -> bool {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let Ok(block) = file.metadata().map(|m| m.blksize().max(1)) else {
        return true;
    };
    let end = offset.saturating_add(len);
    let (inner_start, inner_end) = (offset.div_ceil(block) * block, end / block * block);
    let zeros = |from: u64, to: u64| {
        if from >= to {
            return true;
        }
        let mut bytes = vec![0u8; (to - from) as usize];
        file.read_exact_at(&mut bytes, from).is_ok() && bytes.iter().all(|&b| b == 0)
    };
    if inner_start >= inner_end {
        // Within a block or two: read.
        return !zeros(offset, end);
    }
    let Ok(start) = i64::try_from(inner_start) else {
        return true;
    };
    let inner_data = match nix::unistd::lseek(file, start, nix::unistd::Whence::SeekData) {
        Ok(data) => (data as u64) < inner_end,
        // No data from here on.
        Err(nix::errno::Errno::ENXIO) => false,
        // A file system that cannot say.
        Err(_) => true,
    };
    inner_data || !zeros(offset, inner_start) || !zeros(inner_end, end)
}

/// [`erase_unnamed`] for the pack of the artifacts directory `dir`, at a start. Nothing when
/// the index ends in a line without its line break (a torn append that readers may still take
/// as an artifact). The caller holds the session's lock.
fn erase_unnamed_at_start(dir: &Path) -> Result<(), StoreError> {
    let bytes = index_bytes(&dir.join("index.jsonl"))?;
    if !bytes.is_empty() && !bytes.ends_with(b"\n") {
        return Ok(());
    }
    erase_unnamed(dir, &parse_index_lines(&bytes))
}

impl ArtifactStore for FsStore {
    fn put_artifact(&self, meta: &ArtifactMeta, content: &[u8]) -> Result<(), StoreError> {
        check_id(&meta.session)?;
        check_id(&meta.id)?;
        let dir = self.session_dir(&meta.session).join("artifacts");
        // Under the session's lock, so that a deletion rewriting the index loses no line, and
        // appends to the pack do not interleave.
        let _guard = self.lock(&meta.session);
        create_private_dir(&dir).map_err(map_io("create", &dir))?;
        // The content is durable before the index line that names it is written.
        let pack = match meta.kind {
            ArtifactKind::SessionHistory => {
                atomic(&dir.join(format!("{}.bin", meta.id)), content)?;
                None
            }
            ArtifactKind::ToolOutput | ArtifactKind::FileDiff => {
                append_to_pack(&dir.join(PACK), &[content])?.pop()
            }
        };
        let mut line = serde_json::to_vec(&IndexLine {
            meta: meta.clone(),
            pack,
        })
        .expect("metadata serializes");
        line.push(b'\n');
        let index = dir.join("index.jsonl");
        if meta.kind == ArtifactKind::SessionHistory {
            // A snapshot replaces the last one: its line takes the old one's place (the
            // index is written again), so that the index does not grow by a line, of up to
            // 64 KiB of metadata, at every upload.
            let all = index_lines(&index)?;
            let ours = |parsed: &Option<IndexRef>| parsed.as_ref().is_some_and(|l| l.id == meta.id);
            if all.iter().any(|(_, parsed)| ours(parsed)) {
                let mut kept = Vec::new();
                let mut placed = false;
                for (raw, parsed) in &all {
                    if !ours(parsed) {
                        kept.extend_from_slice(raw);
                    } else if !placed {
                        kept.extend_from_slice(&line);
                        placed = true;
                    }
                }
                return atomic(&index, &kept);
            }
        }
        append_durable(&index, &line)
    }

    /// A session's tool outputs and diffs go to its pack together, with one sync, then their
    /// index lines with one more (instead of two syncs each); anything else, and an artifact
    /// whose id is refused, goes through [`ArtifactStore::put_artifact`], in its place.
    fn put_artifacts(&self, artifacts: &[(ArtifactMeta, Vec<u8>)]) -> Vec<Result<(), StoreError>> {
        let mut results = Vec::with_capacity(artifacts.len());
        for run in artifacts.chunk_by(|(a, _), (b, _)| a.session == b.session) {
            let packed = |(meta, _): &(ArtifactMeta, Vec<u8>)| {
                matches!(meta.kind, ArtifactKind::ToolOutput | ArtifactKind::FileDiff)
                    && check_id(&meta.session).is_ok()
                    && check_id(&meta.id).is_ok()
            };
            if run.len() < 2 || !run.iter().all(packed) {
                results.extend(run.iter().map(|(m, c)| self.put_artifact(m, c)));
                continue;
            }
            match self.put_packed(run) {
                Ok(()) => results.extend(run.iter().map(|_| Ok(()))),
                Err(e) => results.extend(run.iter().map(|_| Err(e.again()))),
            }
        }
        results
    }

    fn artifacts(&self, session: &str) -> Result<Vec<ArtifactMeta>, StoreError> {
        check_id(session)?;
        Ok(self.index(session)?.into_iter().map(|l| l.meta).collect())
    }

    fn artifact_page(
        &self,
        session: &str,
        offset: usize,
        limit: usize,
    ) -> Result<ArtifactPage, StoreError> {
        check_id(session)?;
        self.index_page(session, |_| offset, limit)
    }

    /// One pass over the index, one line's tree at a time (the latest line of an id counts).
    fn uploaded_bytes_in(&self, session: &str, ids: Option<&[String]>) -> Result<u64, StoreError> {
        check_id(session)?;
        let path = self.session_dir(session).join("artifacts/index.jsonl");
        let mut charged: HashMap<String, u64> = HashMap::new();
        each_record_line(&path, |_, line| {
            let id = serde_json::from_slice::<IndexId<'_>>(line)?.id;
            if ids.is_none_or(|ids| ids.iter().any(|wanted| *wanted == id)) {
                let line: IndexLine = serde_json::from_slice(line)?;
                charged.insert(line.meta.id.clone(), line.meta.charged_bytes());
            }
            Ok(())
        })?;
        Ok(charged.values().fold(0, |sum, &n| sum.saturating_add(n)))
    }

    fn latest_artifacts(&self, session: &str, n: usize) -> Result<Vec<ArtifactMeta>, StoreError> {
        check_id(session)?;
        // One pass over the index, which counts them on the way.
        Ok(self
            .index_page(session, |total| total.saturating_sub(n), n)?
            .artifacts)
    }

    fn call_artifacts(
        &self,
        session: &str,
        calls: &std::collections::HashSet<String>,
    ) -> Result<Vec<ArtifactMeta>, StoreError> {
        check_id(session)?;
        self.index_of_calls(session, calls)
    }

    fn artifact(&self, session: &str, id: &str) -> Result<(ArtifactMeta, Vec<u8>), StoreError> {
        check_id(session)?;
        check_id(id).map_err(|_| StoreError::NotFound(format!("artifact {id}")))?;
        let line = self
            .index_line(session, id)?
            .ok_or_else(|| StoreError::NotFound(format!("artifact {id} in session {session}")))?;
        let dir = self.session_dir(session).join("artifacts");
        let content = match line.pack {
            Some(range) => read_from_pack(&dir.join(PACK), range)?,
            None => {
                let path = dir.join(format!("{id}.bin"));
                std::fs::read(&path).map_err(map_io("read", &path))?
            }
        };
        Ok((line.meta, content))
    }

    fn delete_artifacts(&self, session: &str, ids: &[String]) -> Result<(), StoreError> {
        check_id(session)?;
        let dir = self.session_dir(session).join("artifacts");
        let index = dir.join("index.jsonl");
        let _guard = self.lock(session);
        let all = index_lines(&index)?;
        let mut kept = Vec::new();
        let mut kept_lines = Vec::new();
        let mut erase = Vec::new();
        let mut packed_left = false;
        for line in &all {
            let (raw, parsed) = line;
            match parsed {
                Some(line) if ids.contains(&line.id) => erase.extend(line.pack),
                // One it cannot read may name bytes of the pack: the pack stays with it.
                _ => {
                    packed_left |= parsed.as_ref().is_none_or(|line| line.pack.is_some());
                    kept.extend_from_slice(raw);
                    kept_lines.push(line);
                }
            }
        }
        if !all.is_empty() {
            // The index first: an artifact it no longer names is gone even if a crash keeps
            // its content.
            atomic(&index, &kept)?;
        }
        let pack = dir.join(PACK);
        if packed_left {
            erase_from_pack(&pack, &erase)?;
            // And what an earlier delete cut short left; the delete itself is done.
            if let Err(e) = erase_unnamed(&dir, kept_lines) {
                warn!("session {session}: cannot free what its artifact pack no longer names: {e}");
            }
        } else {
            match std::fs::remove_file(&pack) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io("delete", &pack, e)),
            }
        }
        for id in ids {
            if check_id(id).is_err() {
                continue;
            }
            let path = dir.join(format!("{id}.bin"));
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io("delete", &path, e)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(id: &str) -> SessionMeta {
        SessionMeta {
            id: id.into(),
            name: None,
            owner: "ana".into(),
            created_at: "2026-01-01T00:00:00Z".into(),
            last_active: "2026-01-01T00:00:00Z".into(),
            provider: Some("claude".into()),
            model: None,
            focus: None,
            folders: Vec::new(),
        }
    }

    /// One owner's listing and count are their sessions, kept in step with creates, saves
    /// and deletes, as a fresh store reading the disk finds them.
    #[test]
    fn an_owners_sessions_are_theirs_through_every_change() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        let of = |owner: &str, n: usize| SessionMeta {
            owner: owner.into(),
            ..meta(&format!("{owner}-{n}"))
        };
        store.create(&of("ana", 1)).unwrap();
        // The cache is made here; what follows keeps it in step.
        assert_eq!(store.count_sessions("ana").unwrap(), 1);
        for n in 0..3 {
            store.create(&of("bob", n)).unwrap();
        }
        store.create(&of("ana", 2)).unwrap();
        let mut renamed = of("ana", 2);
        renamed.name = Some("two".into());
        store.save(&renamed).unwrap();
        store.delete("bob-1").unwrap();
        let ids = |store: &FsStore, owner: &str| {
            let mut ids: Vec<String> = store
                .owner_sessions(owner)
                .unwrap()
                .into_iter()
                .map(|m| m.id)
                .collect();
            ids.sort();
            ids
        };
        for store in [&store, &FsStore::new(dir.path())] {
            assert_eq!(ids(store, "ana"), ["ana-1", "ana-2"]);
            assert_eq!(ids(store, "bob"), ["bob-0", "bob-2"]);
            assert!(ids(store, "cy").is_empty());
            assert_eq!(store.count_sessions("ana").unwrap(), 2);
            assert_eq!(store.count_sessions("bob").unwrap(), 2);
            assert_eq!(store.count_sessions("cy").unwrap(), 0);
            let named = store.owner_sessions("ana").unwrap();
            assert!(named.iter().any(|m| m.name.as_deref() == Some("two")));
            assert_eq!(store.all_sessions().unwrap().len(), 4);
        }
        store.delete("bob-0").unwrap();
        store.delete("bob-2").unwrap();
        assert!(
            !store
                .metas
                .lock()
                .unwrap()
                .as_ref()
                .unwrap()
                .by_owner
                .contains_key("bob")
        );
    }

    #[test]
    fn a_page_token_that_is_not_hex_is_refused_not_a_panic() {
        for token in ["aéa", "éé", "zz", "0g", "a"] {
            assert!(decode_cursor(token).is_err(), "{token}");
        }
        let token = encode_cursor("2026-01-01T00:00:00Z", "s1");
        assert_eq!(
            decode_cursor(&token).unwrap(),
            ("2026-01-01T00:00:00Z".to_owned(), "s1".to_owned())
        );
    }

    #[test]
    fn sessions_history_and_audit_survive_a_new_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        store.create(&meta("default")).unwrap();
        assert!(store.create(&meta("default")).is_err());
        let msg = HistoryMessage {
            role: Role::User,
            text: "hi".into(),
        };
        store.append("default", &msg).unwrap();
        let record = AuditRecord {
            time: "t".into(),
            call_id: "c".into(),
            tool: "read_file".into(),
            workspace: None,
            target: "a".into(),
            decision: super::AuditDecision::Allowed,
            decided_by: super::Decider::Trust,
            outcome: super::AuditOutcome::Ok,
            duration_ms: 1,
        };
        store
            .audit("default", std::slice::from_ref(&record))
            .unwrap();
        let again = FsStore::new(dir.path());
        assert_eq!(again.load("default").unwrap().unwrap(), meta("default"));
        let h = again.history("default").unwrap();
        assert_eq!(h.messages, vec![msg]);
        assert_eq!(h.provider.as_deref(), Some("claude"));
        assert_eq!(again.audit_log("default").unwrap(), vec![record]);
        assert_eq!(again.all_sessions().unwrap().len(), 1);
        assert!(again.load("../etc").is_err());
    }

    proptest::proptest! {
        // Each case fsyncs a few files: fewer cases than the pure round trips in `history`.
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
        #[test]
        fn appended_messages_read_back_through_the_store(
            messages in proptest::collection::vec(crate::store::history::props::message(), 1..5)
        ) {
            let dir = tempfile::tempdir().unwrap();
            let store = FsStore::new(dir.path());
            store.create(&meta("default")).unwrap();
            for m in &messages {
                store.append("default", m).unwrap();
            }
            proptest::prop_assert_eq!(&store.history("default").unwrap().messages, &messages);
            // And from the file alone, as a restarted server reads it.
            let again = FsStore::new(dir.path());
            proptest::prop_assert_eq!(again.history("default").unwrap().messages, messages);
        }
    }

    #[test]
    fn corrupt_files_are_kept_aside_and_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        store.create(&meta("default")).unwrap();
        let sdir = dir.path().join("sessions/default");
        std::fs::write(sdir.join("session.md"), "garbage without frontmatter").unwrap();
        let h = store.history("default").unwrap();
        assert!(h.messages.is_empty());
        let names: Vec<String> = std::fs::read_dir(&sdir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().any(|n| n.starts_with("session.md.corrupt-")),
            "{names:?}"
        );
        std::fs::write(sdir.join("session.toml"), "id = [").unwrap();
        assert!(matches!(store.load("default"), Err(StoreError::Invalid(_))));
        assert!(
            matches!(store.load("default"), Err(StoreError::Invalid(_))),
            "left in place: it names the session's owner"
        );
        assert_eq!(
            std::fs::read_to_string(sdir.join("session.toml")).unwrap(),
            "id = ["
        );
        std::fs::write(dir.path().join("bindings.toml"), "[[[").unwrap();
        assert_eq!(store.bound_session("ana", "d").unwrap(), None);
    }

    #[test]
    fn listings_follow_every_write_after_the_first_scan() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        store.create(&meta("default")).unwrap();
        assert_eq!(store.all_sessions().unwrap().len(), 1, "scanned from disk");
        let mut other = meta("6f9619ff-8b86-4011-b42d-00c04fc964ff");
        store.create(&other).unwrap();
        other.last_active = "2027-01-01T00:00:00Z".into();
        store.save(&other).unwrap();
        let sorted = |store: &FsStore| {
            let mut all = store.all_sessions().unwrap();
            all.sort_by(|a, b| a.id.cmp(&b.id));
            all
        };
        assert_eq!(sorted(&store), vec![other.clone(), meta("default")]);
        assert_eq!(store.load(&other.id).unwrap(), Some(other.clone()));
        store.delete("default").unwrap();
        assert_eq!(store.load("default").unwrap(), None);
        assert_eq!(sorted(&store), vec![other]);
        assert_eq!(
            sorted(&FsStore::new(dir.path())),
            sorted(&store),
            "the disk agrees"
        );
    }

    #[test]
    fn a_corrupt_session_toml_is_never_created_over_and_a_removed_one_keeps_the_conversation() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        store.create(&meta("default")).unwrap();
        let msg = HistoryMessage {
            role: Role::User,
            text: "keep me".into(),
        };
        store.append("default", &msg).unwrap();
        let toml = dir.path().join("sessions/default/session.toml");
        std::fs::write(&toml, "id = [").unwrap();
        let again = FsStore::new(dir.path());
        assert!(again.all_sessions().unwrap().is_empty(), "skipped");
        assert!(again.create(&meta("default")).is_err(), "not created over");
        assert_eq!(std::fs::read_to_string(&toml).unwrap(), "id = [");
        // The operator removes (or restores) it: a new creation keeps the conversation.
        std::fs::remove_file(&toml).unwrap();
        again.create(&meta("default")).unwrap();
        assert_eq!(again.history("default").unwrap().messages, vec![msg]);
    }

    #[test]
    fn a_user_keeps_at_most_their_bound_of_devices_and_the_least_recently_used_goes() {
        let mut file = BindingsFile::default();
        let now = 1_000_000;
        for (n, device) in ["a", "b", "c"].into_iter().enumerate() {
            assert!(file.bind("ana", device, "s1", now + n as u64, 3));
        }
        // Binding again to the same session changes nothing (no write).
        assert!(!file.bind("ana", "a", "s1", now + 10, 3));
        // "a" is used (a day later, so noted), then a fourth device comes: "b" goes.
        let later = now + BINDING_TOUCH_MS;
        assert_eq!(file.lookup("ana", "a", later), (Some("s1".into()), true));
        assert!(file.bind("ana", "d", "s2", later, 3));
        let kept: Vec<&str> = file.bindings["ana"].keys().map(String::as_str).collect();
        assert_eq!(kept, ["a", "c", "d"]);
        // Equal clocks still order uses; another user's devices are not counted.
        assert!(file.bind("ana", "e", "s2", later, 3));
        assert!(!file.bindings["ana"].contains_key("c"));
        assert!(file.bind("ben", "x", "s3", 0, 3));
        assert_eq!(file.bindings["ana"].len(), 3);
        // Bindings written before uses were recorded read as used longest ago.
        let old: BindingsFile =
            toml::from_str("[bindings.ana]\nold = \"s1\"\n").expect("the previous layout");
        assert_eq!(old.bindings["ana"]["old"].used, 0);
    }

    #[test]
    fn bindings_of_the_old_layout_are_migrated_on_load() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        let ana = "6f9619ff-8b86-4011-b42d-00c04fc964f1";
        let ben = "6f9619ff-8b86-4011-b42d-00c04fc964f2";
        for (id, owner) in [("default", "ana"), (ana, "ana"), (ben, "ben")] {
            let mut m = meta(id);
            m.owner = owner.into();
            store.create(&m).unwrap();
        }
        let old = format!(
            "[bindings]\n\
             \"user:ana\" = \"default\"\n\
             \"user:ben\" = \"{ben}\"\n\
             \"user:carol\" = \"{ben}\"\n\
             \"dev-a\" = \"{ana}\"\n\
             \"dev-b\" = \"{ben}\"\n\
             \"dev-gone\" = \"aaaaaaaa-8b86-4011-b42d-00c04fc964f3\"\n"
        );
        std::fs::write(dir.path().join("bindings.toml"), old).unwrap();
        let store = FsStore::new(dir.path());
        assert_eq!(
            store.default_session("ana").unwrap().as_deref(),
            Some("default")
        );
        assert_eq!(store.default_session("ben").unwrap().as_deref(), Some(ben));
        assert_eq!(
            store.default_session("carol").unwrap(),
            None,
            "not carol's session"
        );
        assert_eq!(
            store.bound_session("ana", "dev-a").unwrap().as_deref(),
            Some(ana)
        );
        assert_eq!(
            store.bound_session("ben", "dev-b").unwrap().as_deref(),
            Some(ben)
        );
        assert_eq!(store.bound_session("ana", "dev-b").unwrap(), None);
        assert_eq!(store.bound_session("ana", "dev-gone").unwrap(), None);
        // Written back in the new layout, which a new store reads as it is.
        let text = std::fs::read_to_string(dir.path().join("bindings.toml")).unwrap();
        assert!(toml::from_str::<BindingsFile>(&text).is_ok(), "{text}");
        assert!(!text.contains("user:"), "{text}");
        let again = FsStore::new(dir.path());
        assert_eq!(again.default_session("ben").unwrap().as_deref(), Some(ben));
        assert_eq!(again.devices_bound_to(ben).unwrap(), 1);
        again.unbind_session(ben).unwrap();
        assert_eq!(again.default_session("ben").unwrap(), None);
        assert_eq!(again.devices_bound_to(ben).unwrap(), 0);
    }

    #[test]
    fn per_session_memory_does_not_grow_with_every_session_touched() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        let msg = HistoryMessage {
            role: Role::User,
            text: "hi".into(),
        };
        for i in 0..20 {
            let id = format!("00000000-0000-4000-8000-{i:012}");
            store.create(&meta(&id)).unwrap();
            store.append(&id, &msg).unwrap();
            store.history(&id).unwrap();
        }
        assert_eq!(
            store.session_locks.lock().unwrap().len(),
            0,
            "locks go with their holders"
        );
        for i in 0..CHECKED_MAX * 2 {
            store.mark_checked(&format!("s{i}"), true);
        }
        assert!(store.checked.lock().unwrap().len() <= CHECKED_MAX);
        // Still one lock per session: racing appends to one session all land, whole.
        let id = "00000000-0000-4000-8000-000000000000";
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..10 {
                        store.append(id, &msg).unwrap();
                    }
                });
            }
        });
        assert_eq!(store.history(id).unwrap().messages.len(), 41);
        assert_eq!(store.session_locks.lock().unwrap().len(), 0);
    }

    #[test]
    fn torn_audit_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        store.create(&meta("default")).unwrap();
        let path = dir.path().join("sessions/default/audit.jsonl");
        std::fs::write(&path, "{\"time\":\"t\",\"call_i").unwrap();
        assert!(store.audit_log("default").unwrap().is_empty());
    }

    #[test]
    fn pages_have_no_duplicates_and_no_gaps() {
        let all: Vec<WorkspaceSession> = (0..250)
            .map(|i| WorkspaceSession {
                session: format!("s{i:03}"),
                first_at: "x".into(),
                // Many ties on purpose.
                last_active: format!("2026-01-{:02}T00:00:00Z", 1 + i % 7),
                calls: 1,
            })
            .collect();
        let mut seen = Vec::new();
        let mut next: Option<(String, String)> = None;
        loop {
            let p = page(&all, 20, next.as_ref());
            assert!(p.items.len() <= 20);
            seen.extend(p.items.iter().map(|s| s.session.clone()));
            match p.next {
                Some(token) => next = Some(decode_cursor(&token).unwrap()),
                None => break,
            }
        }
        let mut sorted = seen.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 250, "no duplicates");
        assert_eq!(seen.len(), 250, "no gaps");
        assert!(decode_cursor("zz").is_err());
    }

    #[test]
    fn workspace_records_resolve_idempotently() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        let a = store.resolve_record("ana", "d1", "~/p", "lap:~/p").unwrap();
        let b = store
            .resolve_record("ana", "d1", "~/p", "lap2:~/p")
            .unwrap();
        assert_eq!(a.id, b.id);
        assert_eq!(b.uri, "lap2:~/p");
        let c = store.resolve_record("ana", "d2", "~/p", "x:~/p").unwrap();
        assert_ne!(a.id, c.id);
        store.touch_record(&a.id, "default", 2).unwrap();
        let again = FsStore::new(dir.path());
        let page = again.record_sessions(&a.id, 20, None).unwrap();
        assert_eq!(page.items.len(), 1);
        assert_eq!(page.items[0].calls, 2);
        assert!(again.record_sessions(&a.id, 0, None).is_err());
        assert!(again.record_sessions(&a.id, 101, None).is_err());
    }

    /// Regression: a record's id was taken from its content and named the file it was written
    /// back to (`"id": "../../x"` wrote outside the data dir); and a record that could not be
    /// read was set aside as corrupt (now: skipped and left, or with descriptors used up an
    /// error, read again next time).
    #[test]
    fn a_workspace_record_is_its_file_and_one_that_cannot_be_read_is_not_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        let a = store.resolve_record("ana", "d1", "~/p", "lap:~/p").unwrap();
        let records = dir.path().join("workspaces");
        let text = std::fs::read_to_string(records.join(format!("{}.json", a.id))).unwrap();
        let escaping = text.replace(&a.id, "../../escaped");
        let other = "7c9e6679-7425-40de-944b-e07fc1f90ae7";
        std::fs::write(records.join(format!("{other}.json")), &escaping).unwrap();
        let again = FsStore::new(dir.path());
        assert!(again.record(&a.id).unwrap().is_some());
        assert!(again.record("../../escaped").unwrap().is_none());
        assert!(!records.join(format!("{other}.json")).exists(), "set aside");
        again
            .resolve_record("ana", "d1", "~/p", "lap3:~/p")
            .unwrap();
        assert!(!dir.path().parent().unwrap().join("escaped.json").exists());
        // One that cannot be read (a directory of that name) is skipped, left where it is,
        // and the others are read.
        let unreadable = records.join("3fa85f64-5717-4562-b3fc-2c963f66afa6.json");
        std::fs::create_dir(&unreadable).unwrap();
        let later = FsStore::new(dir.path());
        assert!(later.record(&a.id).unwrap().is_some());
        assert!(unreadable.is_dir());
        let aside: Vec<String> = std::fs::read_dir(&records)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".corrupt-"))
            .collect();
        assert_eq!(aside.len(), 1, "{aside:?}");
    }

    #[test]
    fn artifacts_round_trip_and_history_snapshots_replace() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        store.create(&meta("default")).unwrap();
        let art = |id: &str, kind| ArtifactMeta {
            id: id.into(),
            session: "default".into(),
            kind,
            workspace: None,
            tool: None,
            call_id: None,
            created_at: "t".into(),
            content_type: "application/json".into(),
            size: 2,
            truncated: false,
            original_size: 2,
            upload: None,
        };
        store
            .put_artifact(&art("a1", ArtifactKind::ToolOutput), b"{}")
            .unwrap();
        store
            .put_artifact(&art("session_history", ArtifactKind::SessionHistory), b"v1")
            .unwrap();
        store
            .put_artifact(&art("session_history", ArtifactKind::SessionHistory), b"v2")
            .unwrap();
        store
            .put_artifact(&art("a2", ArtifactKind::ToolOutput), b"{}")
            .unwrap();
        for _ in 0..50 {
            store
                .put_artifact(&art("session_history", ArtifactKind::SessionHistory), b"v3")
                .unwrap();
        }
        let list = store.artifacts("default").unwrap();
        let ids: Vec<&str> = list.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(
            ids,
            ["a1", "session_history", "a2"],
            "the snapshot keeps its place"
        );
        assert_eq!(
            store.artifact("default", "session_history").unwrap().1,
            b"v3"
        );
        // One line per artifact: a replaced snapshot's line is written over, not added to
        // (before, the index grew by a line, up to 64 KiB of metadata, per upload).
        let index =
            std::fs::read_to_string(dir.path().join("sessions/default/artifacts/index.jsonl"))
                .unwrap();
        assert_eq!(index.lines().count(), 3, "{index}");
        assert!(store.artifact("default", "nope").is_err());
        assert!(store.artifact("default", "../../x").is_err());
    }

    #[test]
    fn deleted_artifacts_are_gone_and_the_others_stay_after_a_new_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        store.create(&meta("default")).unwrap();
        for id in ["a1", "a2", "a3"] {
            let art = ArtifactMeta {
                id: id.into(),
                session: "default".into(),
                kind: ArtifactKind::ToolOutput,
                workspace: None,
                tool: None,
                call_id: None,
                created_at: "t".into(),
                content_type: "text/plain".into(),
                size: 1,
                truncated: false,
                original_size: 1,
                upload: None,
            };
            store.put_artifact(&art, b"x").unwrap();
        }
        store
            .delete_artifacts("default", &["a1".into(), "a3".into(), "missing".into()])
            .unwrap();
        let again = FsStore::new(dir.path());
        let left: Vec<String> = again
            .artifacts("default")
            .unwrap()
            .into_iter()
            .map(|m| m.id)
            .collect();
        assert_eq!(left, ["a2"]);
        assert!(again.artifact("default", "a1").is_err());
        assert!(
            !dir.path()
                .join("sessions/default/artifacts/a1.bin")
                .exists()
        );
    }

    /// A store with session `default` and one tool output in its pack, `a0`.
    fn with_one_tool_output() -> (tempfile::TempDir, FsStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        store.create(&meta("default")).unwrap();
        store
            .put_artifact(&tool_output("a0", b"{\"n\":0}"), b"{\"n\":0}")
            .unwrap();
        (dir, store)
    }

    fn tool_output(id: &str, content: &[u8]) -> ArtifactMeta {
        ArtifactMeta {
            id: id.into(),
            session: "default".into(),
            kind: ArtifactKind::ToolOutput,
            workspace: None,
            tool: None,
            call_id: None,
            created_at: "t".into(),
            content_type: "application/json".into(),
            size: content.len() as u64,
            truncated: false,
            original_size: content.len() as u64,
            upload: None,
        }
    }

    /// A line of an artifact's id that is not an index line (a later version's, one edited by
    /// hand) is skipped by every reading of the index; it took the artifact out of its call's.
    #[test]
    fn a_line_that_is_not_an_index_line_does_not_take_an_artifact_from_its_call() {
        let (dir, store) = with_one_tool_output();
        let mut x = tool_output("x", b"x");
        x.call_id = Some("c".into());
        store.put_artifact(&x, b"x").unwrap();
        let calls = |c: &str| -> Vec<String> {
            let calls = [c.to_owned()].into_iter().collect();
            let found = store.call_artifacts("default", &calls).unwrap();
            found.into_iter().map(|a| a.id).collect()
        };
        assert_eq!(calls("c"), ["x"]);
        let index = dir.path().join("sessions/default/artifacts/index.jsonl");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&index)
            .unwrap();
        std::io::Write::write_all(&mut file, b"{\"id\":\"x\"}\n").unwrap();
        assert_eq!(calls("c"), ["x"]);
        assert_eq!(
            store.artifact("default", "x").unwrap().0.call_id.as_deref(),
            Some("c")
        );
        // A real line moving it to another call does.
        let mut moved = x.clone();
        moved.call_id = Some("d".into());
        store.put_artifact(&moved, b"x").unwrap();
        assert!(calls("c").is_empty());
        assert_eq!(calls("d"), ["x"]);
    }

    /// A session deleted while another thread loaded it stays deleted: the load read it before
    /// it went and put it back in the metadata's cache after, where listings, counts and loads
    /// found it until a restart.
    #[test]
    fn a_load_racing_a_delete_does_not_bring_the_session_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(FsStore::new(dir.path()));
        for round in 0..300 {
            let id = format!("s{round}");
            store.create(&meta(&id)).unwrap();
            // The cache filled, as after any listing.
            assert!(store.all_sessions().unwrap().iter().any(|m| m.id == id));
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let loader = {
                let (store, stop, id) = (store.clone(), stop.clone(), id.clone());
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let _ = store.load(&id);
                    }
                })
            };
            store.delete(&id).unwrap();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            loader.join().unwrap();
            assert_eq!(store.load(&id).unwrap(), None, "round {round}");
            assert!(
                !store.all_sessions().unwrap().iter().any(|m| m.id == id),
                "round {round}"
            );
        }
    }

    #[test]
    fn tool_outputs_share_one_pack_file_and_each_reads_back_its_own_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        store.create(&meta("default")).unwrap();
        let contents: Vec<Vec<u8>> = (0..50)
            .map(|i| format!("{{\"n\":{i},\"pad\":\"{}\"}}", "x".repeat(i * 7)).into_bytes())
            .collect();
        for (i, c) in contents.iter().enumerate() {
            store
                .put_artifact(&tool_output(&format!("a{i}"), c), c)
                .unwrap();
        }
        let artifacts = dir.path().join("sessions/default/artifacts");
        let mut names: Vec<String> = std::fs::read_dir(&artifacts)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["index.jsonl", "pack"], "no file per artifact");
        let again = FsStore::new(dir.path());
        for (i, c) in contents.iter().enumerate() {
            assert_eq!(&again.artifact("default", &format!("a{i}")).unwrap().1, c);
        }
    }

    /// A delete cut short between the index's rewrite and the erasing (a crash) left the
    /// deleted artifact's bytes in the pack for good: the next start frees what no line
    /// names, and the artifacts still named read back whole.
    #[test]
    fn a_deleted_artifacts_bytes_left_by_a_crash_are_erased_at_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        store.create(&meta("default")).unwrap();
        let contents = [
            &b"{\"a\":1}"[..],
            b"{\"secret\":\"TOPSECRET\"}",
            b"{\"c\":3}",
        ];
        for (i, c) in contents.iter().enumerate() {
            store
                .put_artifact(&tool_output(&format!("a{i}"), c), c)
                .unwrap();
        }
        // The index rewritten without a1, as a delete does first; then the crash.
        let artifacts = dir.path().join("sessions/default/artifacts");
        let index = artifacts.join("index.jsonl");
        let kept: String = std::fs::read_to_string(&index)
            .unwrap()
            .lines()
            .filter(|l| !l.contains("\"a1\""))
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(&index, kept).unwrap();
        let pack = || std::fs::read(artifacts.join(PACK)).unwrap();
        let has_secret = |bytes: &[u8]| bytes.windows(9).any(|w| w == b"TOPSECRET");
        assert!(has_secret(&pack()));
        let again = FsStore::new(dir.path());
        again.remove_stale_temp_files();
        assert!(!has_secret(&pack()), "the deleted artifact's bytes stayed");
        assert_eq!(again.artifact("default", "a0").unwrap().1, contents[0]);
        assert_eq!(again.artifact("default", "a2").unwrap().1, contents[2]);
        // A line it cannot read may name bytes: nothing is erased then; nor when the last
        // line lacks its line break (a torn append a reader may still take as an artifact).
        std::fs::write(artifacts.join(PACK), b"0123456789").unwrap();
        std::fs::write(&index, "not json\n").unwrap();
        again.remove_stale_temp_files();
        assert_eq!(pack(), b"0123456789");
        let mut torn = serde_json::to_string(&IndexLine {
            meta: tool_output("t", b"0123"),
            pack: Some([0, 4]),
        })
        .unwrap();
        std::fs::write(&index, &torn).unwrap();
        again.remove_stale_temp_files();
        assert_eq!(pack(), b"0123456789");
        torn.push('\n');
        std::fs::write(&index, &torn).unwrap();
        again.remove_stale_temp_files();
        assert_eq!(&pack()[..4], b"0123", "named");
        assert_eq!(&pack()[4..], &[0; 6], "not named");
    }

    /// Regression: an index line naming a TiB of the pack made the read allocate it first,
    /// which ended the process (a length near `u64::MAX` panicked).
    #[test]
    fn an_index_line_naming_more_than_the_pack_holds_is_an_error_not_an_abort() {
        let (dir, _store) = with_one_tool_output();
        let index = dir.path().join("sessions/default/artifacts/index.jsonl");
        let line = std::fs::read_to_string(&index).unwrap();
        let mut record: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
        for (i, len) in [1u64 << 40, u64::MAX].into_iter().enumerate() {
            record["id"] = format!("big{i}").into();
            record["pack"] = serde_json::json!([0, len]);
            let mut text = std::fs::read_to_string(&index).unwrap();
            text.push_str(&format!("{record}\n"));
            std::fs::write(&index, text).unwrap();
            let again = FsStore::new(dir.path());
            let e = again.artifact("default", &format!("big{i}")).unwrap_err();
            assert!(e.to_string().contains("does not hold"), "{e}");
        }
        assert_eq!(
            FsStore::new(dir.path())
                .artifact("default", "a0")
                .unwrap()
                .1,
            b"{\"n\":0}"
        );
    }

    /// Regression: a `bindings.toml` that is not UTF-8 failed every call that looked at a
    /// binding, for good; it is set aside as corrupt, as the folder registry's is.
    #[test]
    fn bindings_that_are_not_text_are_set_aside_and_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("bindings.toml"), b"\xff\xfe garbage").unwrap();
        let store = FsStore::new(dir.path());
        assert_eq!(store.bound_session("ana", "dev1").unwrap(), None);
        store.bind("ana", "dev1", "default").unwrap();
        assert_eq!(
            FsStore::new(dir.path())
                .bound_session("ana", "dev1")
                .unwrap(),
            Some("default".to_owned())
        );
        let aside = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(".corrupt-"))
            .count();
        assert_eq!(aside, 1);
    }

    /// Regression: the index was written again from the lines it could read, so a delete (or a
    /// snapshot's replacement) dropped a corrupt line, or a newer version's, and the pack
    /// holding its bytes when no line it could read named the pack.
    #[test]
    fn a_rewrite_of_the_index_keeps_the_lines_it_cannot_read_and_their_pack() {
        let (dir, store) = with_one_tool_output();
        let artifacts = dir.path().join("sessions/default/artifacts");
        let index = artifacts.join("index.jsonl");
        let mut text = std::fs::read_to_string(&index).unwrap();
        let unread = "{\"kind\":\"from_a_newer_version\",\"pack\":[0,7]}\n";
        text.push_str(unread);
        std::fs::write(&index, &text).unwrap();
        store
            .delete_artifacts("default", &["a0".to_owned()])
            .unwrap();
        let after = std::fs::read_to_string(&index).unwrap();
        assert_eq!(after, unread, "the line it cannot read stays");
        assert!(artifacts.join(PACK).exists(), "the pack it may name stays");
        // A snapshot's replacement keeps it too.
        let history = ArtifactMeta {
            kind: ArtifactKind::SessionHistory,
            ..tool_output("session_history", b"h")
        };
        store.put_artifact(&history, b"v1").unwrap();
        store.put_artifact(&history, b"v2").unwrap();
        let after = std::fs::read_to_string(&index).unwrap();
        assert!(after.starts_with(unread), "{after}");
        assert_eq!(after.lines().count(), 2, "{after}");
    }

    /// Regression: a crash that cut an append inside a character left `session.md` not quite
    /// UTF-8, and the whole conversation was set aside as corrupt.
    #[test]
    fn a_conversation_cut_inside_a_character_keeps_its_earlier_messages() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        store.create(&meta("default")).unwrap();
        let first = HistoryMessage {
            role: Role::User,
            text: "héllo wörld".into(),
        };
        store.append("default", &first).unwrap();
        let path = dir.path().join("sessions/default/session.md");
        let whole = std::fs::read(&path).unwrap();
        for torn in [
            &b"\n## Assistant\n\nsecond: \xc3"[..],
            b"\n## Assistant\n\nse\xffcond",
        ] {
            let mut bytes = whole.clone();
            bytes.extend_from_slice(torn);
            std::fs::write(&path, &bytes).unwrap();
            let history = FsStore::new(dir.path()).history("default").unwrap();
            assert_eq!(history.messages[0].text, "héllo wörld", "{history:?}");
        }
        // Bytes that are not UTF-8 before the last line are a corrupt file, as before.
        let mut bytes = whole.clone();
        bytes.extend_from_slice(b"\n## Assistant\n\n\xff\nmore\n");
        std::fs::write(&path, &bytes).unwrap();
        let history = FsStore::new(dir.path()).history("default").unwrap();
        assert!(history.messages.is_empty(), "{history:?}");
    }

    #[test]
    fn an_artifact_page_skips_the_lines_a_whole_listing_skips_and_pages_on_without_repeats() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        store.create(&meta("default")).unwrap();
        for id in ["a", "b"] {
            store.put_artifact(&tool_output(id, b"x"), b"x").unwrap();
        }
        // A corrupt line, a line whose id reads but not the rest (a field of another type),
        // then more artifacts, and a torn last line.
        let index = dir.path().join("sessions/default/artifacts/index.jsonl");
        let mut newer = serde_json::to_value(IndexLine {
            meta: tool_output("newer", b"x"),
            pack: None,
        })
        .unwrap();
        newer["size"] = serde_json::json!("large");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&index)
            .unwrap();
        writeln!(file, "not json").unwrap();
        writeln!(file, "{newer}").unwrap();
        drop(file);
        for id in ["c", "d"] {
            store.put_artifact(&tool_output(id, b"x"), b"x").unwrap();
        }
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&index)
            .unwrap();
        write!(file, "{{\"id\":").unwrap();
        drop(file);
        let whole: Vec<String> = store
            .artifacts("default")
            .unwrap()
            .into_iter()
            .map(|a| a.id)
            .collect();
        assert_eq!(whole, ["a", "b", "c", "d"]);
        for limit in 1..=5 {
            let mut ids = Vec::new();
            let mut offset = 0;
            loop {
                let page = store.artifact_page("default", offset, limit).unwrap();
                assert_eq!(page.total, 4);
                ids.extend(page.artifacts.into_iter().map(|a| a.id));
                assert!(page.end > offset || page.end == page.total);
                if page.end >= page.total {
                    break;
                }
                offset = page.end;
            }
            assert_eq!(ids, whole, "pages of {limit}");
        }
        for n in 0..=5 {
            let latest: Vec<String> = store
                .latest_artifacts("default", n)
                .unwrap()
                .into_iter()
                .map(|a| a.id)
                .collect();
            assert_eq!(latest, whole[4usize.saturating_sub(n)..], "the latest {n}");
        }
    }

    #[test]
    fn artifacts_stored_together_read_back_in_order_as_if_stored_one_by_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        store.create(&meta("default")).unwrap();
        let other = "7c9e6679-7425-40de-944b-e07fc1f90ae7";
        store.create(&meta(other)).unwrap();
        store
            .put_artifact(&tool_output("before", b"one by one"), b"one by one")
            .unwrap();
        let in_other = |id: &str, c: &[u8]| ArtifactMeta {
            session: other.into(),
            ..tool_output(id, c)
        };
        let history = ArtifactMeta {
            kind: ArtifactKind::SessionHistory,
            ..tool_output("session_history", b"h")
        };
        let bad = tool_output("../escape", b"no");
        let batch: Vec<(ArtifactMeta, Vec<u8>)> = vec![
            (tool_output("b0", b"zero"), b"zero".to_vec()),
            (tool_output("b1", b"one"), b"one".to_vec()),
            (in_other("o0", b"other zero"), b"other zero".to_vec()),
            (in_other("o1", b"other one"), b"other one".to_vec()),
            (tool_output("b2", b"two"), b"two".to_vec()),
            (history, b"h".to_vec()),
            (bad, b"no".to_vec()),
            (tool_output("b3", b"three"), b"three".to_vec()),
        ];
        let results = store.put_artifacts(&batch);
        let ok: Vec<bool> = results.iter().map(Result::is_ok).collect();
        assert_eq!(ok, [true, true, true, true, true, true, false, true]);

        let again = FsStore::new(dir.path());
        let ids = |session: &str| -> Vec<String> {
            again
                .artifacts(session)
                .unwrap()
                .into_iter()
                .map(|m| m.id)
                .collect()
        };
        assert_eq!(
            ids("default"),
            ["before", "b0", "b1", "b2", "session_history", "b3"]
        );
        assert_eq!(ids(other), ["o0", "o1"]);
        for (meta, content) in batch.iter().filter(|(m, _)| m.id != "../escape") {
            let (got, bytes) = again.artifact(&meta.session, &meta.id).unwrap();
            assert_eq!((&got, &bytes), (meta, content), "{}", meta.id);
        }
        assert_eq!(
            again.artifact("default", "before").unwrap().1,
            b"one by one"
        );
    }

    #[test]
    fn a_deleted_packed_artifact_leaves_no_readable_bytes_and_the_pack_goes_with_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        store.create(&meta("default")).unwrap();
        let secret = b"SECRET-CONTENT-4f1d".repeat(300);
        store
            .put_artifact(&tool_output("keep", b"kept"), b"kept")
            .unwrap();
        store
            .put_artifact(&tool_output("gone", &secret), &secret)
            .unwrap();
        store
            .put_artifact(&tool_output("last", b"last"), b"last")
            .unwrap();
        store.delete_artifacts("default", &["gone".into()]).unwrap();
        let pack = dir.path().join("sessions/default/artifacts/pack");
        let bytes = std::fs::read(&pack).unwrap();
        assert!(
            !bytes.windows(19).any(|w| w == b"SECRET-CONTENT-4f1d"),
            "a deleted artifact's bytes are erased from the pack"
        );
        assert_eq!(store.artifact("default", "keep").unwrap().1, b"kept");
        assert_eq!(store.artifact("default", "last").unwrap().1, b"last");
        assert!(matches!(
            store.artifact("default", "gone"),
            Err(StoreError::NotFound(_))
        ));
        store
            .delete_artifacts("default", &["keep".into(), "last".into()])
            .unwrap();
        assert!(!pack.exists(), "the pack goes with its last artifact");
        assert!(store.artifacts("default").unwrap().is_empty());
    }

    #[test]
    fn an_index_line_naming_bytes_the_pack_lacks_is_an_error_not_short_content() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        store.create(&meta("default")).unwrap();
        store
            .put_artifact(&tool_output("a", b"abcdef"), b"abcdef")
            .unwrap();
        let pack = dir.path().join("sessions/default/artifacts/pack");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&pack)
            .unwrap()
            .set_len(3)
            .unwrap();
        let err = store.artifact("default", "a").unwrap_err().to_string();
        assert!(err.contains("does not hold"), "{err}");
    }

    #[test]
    fn artifacts_written_one_file_each_by_earlier_versions_still_read_and_delete() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        store.create(&meta("default")).unwrap();
        let artifacts = dir.path().join("sessions/default/artifacts");
        std::fs::create_dir_all(&artifacts).unwrap();
        let old = tool_output("old", b"{\"old\":1}");
        std::fs::write(artifacts.join("old.bin"), b"{\"old\":1}").unwrap();
        let mut line = serde_json::to_vec(&old).unwrap();
        line.push(b'\n');
        std::fs::write(artifacts.join("index.jsonl"), line).unwrap();
        store
            .put_artifact(&tool_output("new", b"{}"), b"{}")
            .unwrap();
        assert_eq!(store.artifact("default", "old").unwrap().1, b"{\"old\":1}");
        assert_eq!(store.artifact("default", "new").unwrap().1, b"{}");
        store.delete_artifacts("default", &["old".into()]).unwrap();
        assert!(!artifacts.join("old.bin").exists());
        assert_eq!(store.artifact("default", "new").unwrap().1, b"{}");
    }

    #[test]
    fn an_added_record_survives_a_new_store_and_a_deleted_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        let record = WorkspaceRecord {
            id: "0b6c2b2e-0000-4000-8000-000000000001".into(),
            user: "ana".into(),
            device_id: "http".into(),
            path: String::new(),
            uri: "general:x".into(),
            created_at: "t".into(),
            last_active: "t".into(),
        };
        store.add_record(&record).unwrap();
        assert!(store.add_record(&record).is_err(), "ids are unique");
        assert_eq!(
            FsStore::new(dir.path()).record(&record.id).unwrap(),
            Some(record.clone())
        );
        store.delete_record(&record.id).unwrap();
        assert!(matches!(
            store.delete_record(&record.id),
            Err(StoreError::NotFound(_))
        ));
        assert_eq!(FsStore::new(dir.path()).record(&record.id).unwrap(), None);
    }

    #[test]
    fn the_audit_count_and_pages_follow_the_log_and_skip_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        store.create(&meta("default")).unwrap();
        assert_eq!(store.audit_count("default").unwrap(), 0);
        let records: Vec<AuditRecord> = (0..5)
            .map(|i| AuditRecord {
                time: "t".into(),
                call_id: format!("c{i}"),
                tool: "read_file".into(),
                workspace: None,
                target: format!("f{i}"),
                decision: super::super::AuditDecision::Allowed,
                decided_by: Decider::Trust,
                outcome: super::super::AuditOutcome::Ok,
                duration_ms: 1,
            })
            .collect();
        store.audit("default", &records).unwrap();
        let path = dir.path().join("sessions/default/audit.jsonl");
        let mut torn = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut torn, b"{\"time\":").unwrap();
        assert_eq!(store.audit_count("default").unwrap(), 5);
        let (page, total) = store.audit_page("default", 3, 10).unwrap();
        assert_eq!(total, 5);
        assert_eq!(
            page.iter().map(|r| r.target.as_str()).collect::<Vec<_>>(),
            ["f3", "f4"]
        );
        // What is written after the torn line (the server restarted after a crash) is all
        // there: the first record used to run into the torn line and be lost with it.
        let mut after = records[..2].to_vec();
        after[0].target = "after-1".into();
        after[1].target = "after-2".into();
        store.audit("default", &after[..1]).unwrap();
        store.audit("default", &after[1..]).unwrap();
        assert_eq!(store.audit_count("default").unwrap(), 7);
        let (page, total) = store.audit_page("default", 5, 10).unwrap();
        assert_eq!(total, 7);
        assert_eq!(
            page.iter().map(|r| r.target.as_str()).collect::<Vec<_>>(),
            ["after-1", "after-2"]
        );
        // A line that is JSON but not a record is skipped alike, inside a page or out of it.
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut file, b"{\"not\":\"a record\"}\n\n").unwrap();
        store.audit("default", &records[..1]).unwrap();
        // Read a line at a time, every page is that slice of the whole log.
        let all = store.audit_log("default").unwrap();
        assert_eq!(all.len(), 8);
        // And the count is theirs: the last page of a count ends at the last record.
        assert_eq!(store.audit_count("default").unwrap(), all.len());
        for offset in 0..10 {
            for limit in 0..10 {
                let (page, total) = store.audit_page("default", offset, limit).unwrap();
                assert_eq!(total, all.len());
                let want: Vec<&AuditRecord> = all.iter().skip(offset).take(limit).collect();
                assert_eq!(page.iter().collect::<Vec<_>>(), want, "{offset} {limit}");
            }
        }
        // Counted again from where it was, and afresh in a store that never counted it.
        store.audit("default", &records[..2]).unwrap();
        assert_eq!(store.audit_count("default").unwrap(), all.len() + 2);
        assert_eq!(
            FsStore::new(dir.path()).audit_count("default").unwrap(),
            all.len() + 2
        );
        // A session deleted and made again under its id is counted afresh.
        store.delete("default").unwrap();
        store.create(&meta("default")).unwrap();
        assert_eq!(store.audit_count("default").unwrap(), 0);
        store.audit("default", &records[..1]).unwrap();
        assert_eq!(store.audit_count("default").unwrap(), 1);
    }

    #[test]
    fn stale_temporary_files_go_and_nothing_else_does() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let session = root.join("sessions/default");
        for d in [
            "tls",
            "workspaces",
            "sessions/default/artifacts",
            "sessions/default/workspace",
        ] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        let stale = [
            root.join(".tokens.toml.4294967.0.tmp"),
            root.join("tls/.key.pem.4294967.1.tmp"),
            root.join("workspaces/.abc.json.4294967.2.tmp"),
            session.join(".session.toml.4294967.3.tmp"),
            session.join("artifacts/.0f.bin.4294967.4.tmp"),
        ];
        let kept = [
            root.join("tokens.toml"),
            root.join(".notes.tmp"),
            root.join("x.toml.4294967.0.tmp"),
            root.join(".x.toml.pid.0.tmp"),
            session.join("session.toml.corrupt-20261126T000000Z"),
            session.join("workspace/.draft.md.4294967.0.tmp"),
        ];
        let long_ago = std::time::SystemTime::now() - STALE_TEMP_AGE * 2;
        for path in stale.iter().chain(&kept) {
            std::fs::write(path, b"x").unwrap();
            let file = std::fs::File::options().write(true).open(path).unwrap();
            file.set_modified(long_ago).unwrap();
        }
        // A write that may still be under way: too recent to touch.
        let recent = root.join(".bindings.toml.4294967.9.tmp");
        std::fs::write(&recent, b"x").unwrap();
        let store = FsStore::new(root);
        assert_eq!(store.remove_stale_temp_files(), stale.len());
        for path in &stale {
            assert!(!path.exists(), "{} should be gone", path.display());
        }
        for path in kept.iter().chain([&recent]) {
            assert!(path.exists(), "{} should stay", path.display());
        }
        assert_eq!(store.remove_stale_temp_files(), 0);
    }

    /// A mount point in `dir`, gone with the value (lazily, wherever it was moved).
    struct Mounted(std::path::PathBuf);

    impl Drop for Mounted {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }

    /// Regression: a delete removed the session's files in directory order, so one cut short
    /// (a crash; a directory it may not empty) could leave its conversation and workspace
    /// without its metadata, which the next creator of that id, of any user, took over.
    #[test]
    fn a_delete_cut_short_leaves_nothing_under_the_id() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        store.create(&meta("s1")).unwrap();
        let secret = HistoryMessage {
            role: Role::User,
            text: "secret of ana".into(),
        };
        store.append("s1", &secret).unwrap();
        std::fs::write(dir.path().join("sessions/s1/workspace/notes.txt"), "ana's").unwrap();
        // A mount point cannot be removed: the removal stops part of the way.
        let busy = dir.path().join("sessions/s1/workspace/busy");
        std::fs::create_dir(&busy).unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "tmpfs"])
            .arg(&busy)
            .status()
            .unwrap();
        assert!(status.success(), "this test mounts a tmpfs (it needs root)");
        let _mounted = Mounted(busy);
        let _ = store.delete("s1");
        assert!(!dir.path().join("sessions/s1").exists());
        let mut bob = meta("s1");
        bob.owner = "bob".into();
        store.create(&bob).unwrap();
        let history = store.history("s1").unwrap();
        assert!(history.messages.is_empty(), "{history:?}");
        assert!(
            !dir.path().join("sessions/s1/workspace/notes.txt").exists(),
            "the new session's workspace holds the old one's file"
        );
        // What was left is removed at a start once it can be (not while this process makes it).
        let leftover = std::fs::read_dir(dir.path().join("sessions"))
            .unwrap()
            .flatten()
            .find(|e| e.file_name().to_string_lossy().starts_with(".deleting-"))
            .expect("the part not removed is set aside")
            .path();
        assert!(
            std::process::Command::new("umount")
                .arg(leftover.join("workspace/busy"))
                .status()
                .unwrap()
                .success()
        );
        assert_eq!(
            store.remove_stale_temp_files(),
            0,
            "ours, still being removed"
        );
        let renamed = leftover.with_file_name(".deleting-s1.1.0");
        std::fs::rename(&leftover, &renamed).unwrap();
        // A crash before the delete's end left a device bound to it: unbound with the sweep
        // (bob's session of that id gone too; one that exists keeps what names it).
        store
            .bind("ana", "00000000-0000-4000-8000-000000000009", "s1")
            .unwrap();
        assert_eq!(store.remove_stale_temp_files(), 1);
        assert!(!renamed.exists());
        assert_eq!(
            store.devices_bound_to("s1").unwrap(),
            1,
            "bob's s1 exists: what names it is his"
        );
        std::fs::create_dir(&renamed).unwrap();
        std::fs::remove_dir_all(dir.path().join("sessions/s1")).unwrap();
        assert_eq!(store.remove_stale_temp_files(), 1);
        assert_eq!(store.devices_bound_to("s1").unwrap(), 0);
    }

    #[test]
    fn the_folder_registry_survives_a_new_store_and_empty_entries_leave() {
        use crate::roots::{FolderSessions, STALE_AFTER_MS};
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        let mut a = FolderSessions::new("ana", "dev1", "/home/ana/p", "s1", 1_000);
        a.use_session("s2", 2_000, true);
        let b = FolderSessions::new("ana", "dev2", "/home/ana/p", "s3", 3_000);
        let c = FolderSessions::new("bob", "dev1", "/home/bob/q", "s4", 3_000);
        for e in [&a, &b, &c] {
            store.save_folder_sessions(e).unwrap();
        }
        let again = FsStore::new(dir.path());
        assert_eq!(
            again.folder_sessions("ana", "dev1").unwrap(),
            vec![a.clone()]
        );
        assert_eq!(
            again.folder_sessions("ana", "dev2").unwrap(),
            vec![b.clone()]
        );
        assert_eq!(again.folder_sessions("bob", "dev2").unwrap(), vec![]);
        // Replaced by (user, device, folder), not added.
        a.use_session("s1", 4_000, true);
        again.save_folder_sessions(&a).unwrap();
        assert_eq!(
            again.folder_sessions("ana", "dev1").unwrap(),
            vec![a.clone()]
        );
        // Stale sessions go; an entry left without sessions goes with them. A session whose
        // metadata says it was active since is not stale, whenever a host last landed in it
        // (its entry is saved, not counted as pruned).
        let active = HashMap::from([("s3".to_owned(), 2_999 + STALE_AFTER_MS)]);
        assert_eq!(
            again
                .prune_folder_sessions(3_000 + STALE_AFTER_MS, &active)
                .unwrap(),
            2
        );
        let third = FsStore::new(dir.path());
        let left = third.folder_sessions("ana", "dev1").unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].active, "s1");
        assert_eq!(left[0].sessions.keys().collect::<Vec<_>>(), ["s1"]);
        let kept = third.folder_sessions("ana", "dev2").unwrap();
        assert_eq!(kept[0].sessions["s3"], 2_999 + STALE_AFTER_MS);
        assert!(third.folder_sessions("bob", "dev1").unwrap().is_empty());
        let mut gone = left[0].clone();
        gone.sessions.clear();
        third.save_folder_sessions(&gone).unwrap();
        assert!(
            FsStore::new(dir.path())
                .folder_sessions("ana", "dev1")
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn a_corrupt_folder_registry_is_kept_aside_and_the_registry_starts_empty() {
        use crate::roots::FolderSessions;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("folder_sessions.toml");
        for garbage in [&b"[[folders]]\nuser = 3\n"[..], &b"\xff\xfe not text"[..]] {
            std::fs::write(&path, garbage).unwrap();
            let store = FsStore::new(dir.path());
            assert!(store.folder_sessions("ana", "dev1").unwrap().is_empty());
            let kept: Vec<Vec<u8>> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| {
                    p.to_string_lossy()
                        .contains("folder_sessions.toml.corrupt-")
                })
                .map(|p| std::fs::read(p).unwrap())
                .collect();
            assert!(
                kept.iter().any(|k| k == garbage),
                "the corrupt bytes are kept"
            );
            let entry = FolderSessions::new("ana", "dev1", "/p", "s1", 1);
            store.save_folder_sessions(&entry).unwrap();
            assert_eq!(
                FsStore::new(dir.path())
                    .folder_sessions("ana", "dev1")
                    .unwrap(),
                vec![entry]
            );
        }
    }
}

#[cfg(test)]
mod write_failures {
    use super::*;

    /// Regression: the bindings, the folder registry and the workspace records were changed in
    /// memory before they were written; a write that failed (a full disk) answered an error
    /// but the change stayed, served until a restart undid it (a device bound to a session
    /// the disk never heard of, a deleted record back after the restart). A failed write now
    /// leaves the store as the disk has it.
    #[test]
    fn a_write_that_fails_leaves_the_store_as_the_disk_has_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::new(dir.path());
        store.bind("ana", "dev-1", "s1").unwrap();
        let path = dir.path().join("bindings.toml");
        let durable = std::fs::read(&path).unwrap();
        // The file's place taken by a directory that is not empty: the next write's rename
        // fails.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("x"), b"x").unwrap();
        assert!(store.bind("ana", "dev-1", "s2").is_err());
        std::fs::remove_dir_all(&path).unwrap();
        std::fs::write(&path, &durable).unwrap();
        assert_eq!(
            store.bound_session("ana", "dev-1").unwrap().as_deref(),
            Some("s1")
        );

        // A record whose delete failed is still listed.
        let record = store
            .resolve_record("ana", "dev-1", "/home/ana/p", "laptop:/home/ana/p")
            .unwrap();
        let file = dir
            .path()
            .join("workspaces")
            .join(format!("{}.json", record.id));
        let kept = std::fs::read(&file).unwrap();
        std::fs::remove_file(&file).unwrap();
        std::fs::create_dir(&file).unwrap();
        std::fs::write(file.join("x"), b"x").unwrap();
        assert!(store.delete_record(&record.id).is_err());
        std::fs::remove_dir_all(&file).unwrap();
        std::fs::write(&file, &kept).unwrap();
        assert_eq!(store.record(&record.id).unwrap(), Some(record));
    }
}
