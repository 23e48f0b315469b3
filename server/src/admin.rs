//! What `monad-server session ...` and `monad-server workspace ...` do, on the data directory.
//!
//! Reading works while the server runs. Deleting (`session delete`, `session gc`) goes through
//! the running server when there is one: a running server keeps sessions and workspace records
//! in memory and would write a deleted session back, so the command asks it, over its
//! administration socket (`<data_dir>/admin.sock`, [`serve_socket`]), to delete them itself.
//! With no server running, the command takes the data directory's lock (`server.lock`, held
//! by a running server) and deletes on disk.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use monad_protocol::wire::{History, WorkspaceRecord, WorkspaceSession};
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tracing::{info, warn};

use crate::session::Registry;
use crate::settings::Layers;
use crate::store::{ArtifactMeta, AuditRecord, FsStore, Page, SessionMeta, Store, StoreError};

/// The data directory's lock: held by a running server for its whole life, and by a command
/// that changes the directory while no server runs (`session delete`, `session gc`). The file
/// says who holds it (`PID WHAT`), so that whoever finds it taken can say by whom.
#[derive(Debug)]
pub struct DataLock {
    _lock: Flock<File>,
}

impl Drop for DataLock {
    /// Says nobody holds it any more, so that a later holder that writes no note (a server of
    /// an earlier version) is not taken for this one.
    fn drop(&mut self) {
        let _ = self._lock.set_len(0);
    }
}

/// Refuses a command that writes in `data_dir` when this process's user is not the directory's
/// owner (the server's user): what it wrote would be its own, mode 0600, which the server could
/// not read. `sudo monad-server token revoke` left `tokens.toml` root's: the server could no longer
/// read its tokens, so the revoked token's connections stayed and every new one was refused.
pub fn writes_as_owner(data_dir: &Path, command: &str) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(data_dir) else {
        return Ok(());
    };
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() == me {
        return Ok(());
    }
    let owner = nix::unistd::User::from_uid(meta.uid().into())
        .ok()
        .flatten()
        .map_or_else(|| format!("uid {}", meta.uid()), |u| u.name);
    Err(format!(
        "{} belongs to {owner}, the server's user, and `monad-server {command}` would write \
         files there as uid {me}, which the server could not read: run it as {owner} (`sudo -u \
         {owner} monad-server {command} ...`)",
        data_dir.display()
    ))
}

/// Why the data directory's lock could not be taken.
#[derive(Debug)]
pub struct LockRefused {
    /// The sentence for the user: who holds it, or what failed.
    pub message: String,
    /// Who holds it, when someone does.
    pub holder: Option<Holder>,
}

/// Who holds the data directory's lock, as its file says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// A serving server (or a version that did not say who it was).
    Server,
    /// A command working on the directory while no server runs.
    Command,
}

impl DataLock {
    /// What a serving server writes as its part in the lock file.
    pub const SERVER: &'static str = "monad-server serving";

    /// Takes the lock on `<data_dir>/server.lock` for `what` (a server: [`DataLock::SERVER`];
    /// a command: `monad-server session gc`, say), or says who holds it.
    pub fn take(data_dir: &Path, what: &str) -> Result<DataLock, LockRefused> {
        let other = |message: String| LockRefused {
            message,
            holder: None,
        };
        crate::fsutil::create_private_dir(data_dir)
            .map_err(|e| other(format!("{}: {e}", data_dir.display())))?;
        let path = data_dir.join("server.lock");
        let file = File::options()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .mode(crate::fsutil::PRIVATE_FILE)
            // Never through a link, nor a FIFO or device in its place: the lock is written to.
            .custom_flags((nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK).bits())
            .open(&path)
            .map_err(|e| other(format!("{}: {e}", path.display())))?;
        if !file.metadata().is_ok_and(|m| m.is_file()) {
            return Err(other(format!(
                "{} is not a regular file: remove it (nothing else is in it)",
                path.display()
            )));
        }
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(mut lock) => {
                // Who holds it, for whoever finds it taken; the lock stands without it. Written
                // over the last holder's and then cut to its length, so that a reader never
                // finds the file empty (its first line is the note).
                let note = format!("{} {what}\n", std::process::id());
                let noted = {
                    use std::io::{Seek, Write};
                    lock.rewind()
                        .and_then(|_| lock.write_all(note.as_bytes()))
                        .and_then(|()| lock.set_len(note.len() as u64))
                };
                if let Err(e) = noted {
                    warn!("cannot note this process in {}: {e}", path.display());
                }
                Ok(DataLock { _lock: lock })
            }
            Err((file, nix::errno::Errno::EWOULDBLOCK)) => {
                let note = std::io::read_to_string(file).unwrap_or_default();
                let note = note.lines().next().unwrap_or("").trim();
                let (pid, what) = note.split_once(' ').unwrap_or(("", note));
                // A file without a note was written by a version that did not say who it
                // was: a server.
                let holder = if what.is_empty() || what == Self::SERVER {
                    Holder::Server
                } else {
                    Holder::Command
                };
                let process = match pid.parse::<u32>() {
                    Ok(pid) => format!(" (process {pid})"),
                    Err(_) => String::new(),
                };
                let (who, wait) = match holder {
                    Holder::Server => (
                        format!("a monad-server{process} is running on it"),
                        "stop it first",
                    ),
                    Holder::Command => (
                        format!(
                            "`{}`{process} is working on it",
                            monad_protocol::text::printable(what)
                        ),
                        "wait for it to finish",
                    ),
                };
                Err(LockRefused {
                    message: format!(
                        "{} is in use: {who} (it holds {}); {wait}",
                        data_dir.display(),
                        path.display()
                    ),
                    holder: Some(holder),
                })
            }
            Err((_, errno)) => Err(other(format!("cannot lock {}: {errno}", path.display()))),
        }
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

/// Administration of a data directory and the store its server keeps records in.
pub struct Admin {
    data_dir: PathBuf,
    store: Arc<dyn Store>,
    /// Whether the store is PostgreSQL (`[store] url`), not the files of the data directory.
    in_database: bool,
}

impl Admin {
    /// Administration of `data_dir` with the filesystem store, whatever its `config.toml` says
    /// (for what only touches the directory: the certificate, the address file).
    pub fn new(data_dir: &Path) -> Admin {
        Admin {
            data_dir: data_dir.to_path_buf(),
            store: Arc::new(FsStore::new(data_dir)),
            in_database: false,
        }
    }

    /// Administration of `data_dir` with the store its server uses: PostgreSQL when its
    /// `config.toml` (or `MONAD_STORE_URL`) names one under `[store] url`, else the files of
    /// the directory. A bad URL or an unreachable database is an error that says so.
    pub fn open(data_dir: &Path) -> Result<Admin, crate::ServerError> {
        Admin::open_with(data_dir, false)
    }

    /// [`Admin::open`] for a command that only looks (`session show`, `workspace list`, ...):
    /// with the files of the data directory, a corrupt one is reported and left where it is
    /// ([`FsStore::inspecting`]), not kept aside as the server does.
    pub fn open_to_look(data_dir: &Path) -> Result<Admin, crate::ServerError> {
        Admin::open_with(data_dir, true)
    }

    fn open_with(data_dir: &Path, looking: bool) -> Result<Admin, crate::ServerError> {
        let settings = crate::settings::store_settings(data_dir)?;
        let Some(url) = settings.url.as_deref().filter(|u| !u.trim().is_empty()) else {
            let store = if looking {
                FsStore::inspecting(data_dir)
            } else {
                FsStore::new(data_dir)
            };
            return Ok(Admin {
                data_dir: data_dir.to_path_buf(),
                store: Arc::new(store),
                in_database: false,
            });
        };
        let blobs = crate::store::blobs_for(&settings, data_dir)?;
        let store = crate::store::PgStore::connect(url, data_dir, blobs, settings.pool_options())
            .map_err(|e| {
            crate::ServerError::Invalid(format!("the store ([store] url): {e}"))
        })?;
        Ok(Admin {
            data_dir: data_dir.to_path_buf(),
            store: Arc::new(store),
            in_database: true,
        })
    }

    /// Every session, most recently active first.
    pub fn sessions(&self) -> Result<Vec<SessionMeta>, StoreError> {
        let mut all = self.store.all_sessions()?;
        all.sort_by(|a, b| b.last_active.cmp(&a.last_active).then(a.id.cmp(&b.id)));
        Ok(all)
    }

    /// One session's metadata.
    pub fn meta(&self, id: &str) -> Result<SessionMeta, StoreError> {
        self.store
            .load(id)?
            .ok_or_else(|| StoreError::NotFound(format!("session {id}")))
    }

    /// One session's report.
    pub fn show(&self, id: &str) -> Result<SessionReport, StoreError> {
        let meta = self.meta(id)?;
        let history = self.store.history(id)?;
        // Counted a page at a time: a log of any size is never held whole.
        let (mut calls, mut denied) = (0, 0);
        self.each_audit_page(id, |page| -> Result<(), StoreError> {
            calls += page.len();
            denied += page
                .iter()
                .filter(|a| a.decision == crate::store::AuditDecision::Denied)
                .count();
            Ok(())
        })?;
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
            calls,
            denied,
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

    /// One artifact, by its id or a unique start of it.
    pub fn artifact(
        &self,
        id: &str,
        artifact: &str,
    ) -> Result<(ArtifactMeta, Vec<u8>), StoreError> {
        let ids: Vec<String> = self.artifacts(id)?.into_iter().map(|a| a.id).collect();
        let listed = format!("`monad-server session artifacts {id}` lists them");
        let artifact = crate::session::match_id_prefix("artifact", &listed, artifact, &ids)
            .map_err(|e| StoreError::Invalid(e.message))?;
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
        let ids: Vec<String> = self.workspaces()?.into_iter().map(|r| r.id).collect();
        let listed = "`monad-server workspace list` lists them";
        let id = crate::session::match_id_prefix("workspace record", listed, id, &ids)
            .map_err(|e| StoreError::Invalid(e.message))?;
        let record = self
            .store
            .record(id)?
            .ok_or_else(|| StoreError::NotFound(format!("workspace record {id}")))?;
        Ok((record, self.store.record_sessions(id, limit, next)?))
    }

    fn registry(&self) -> Registry {
        Registry::new(&self.data_dir, self.store.clone(), Layers::default())
    }

    /// The id of the one session whose id is or starts with `prefix` (as docker and git take
    /// ids).
    pub fn resolve(&self, prefix: &str) -> Result<String, String> {
        let ids: Vec<String> = self
            .store
            .all_sessions()
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|m| m.id)
            .collect();
        crate::session::match_prefix(prefix, &ids)
            .map(str::to_owned)
            .map_err(|e| {
                // Left out of the listing because its metadata cannot be read: say so, not
                // that it does not exist (by its whole id or a unique start of it).
                let unreadable = match self.unreadable_start(prefix, &ids).as_slice() {
                    [id] => self.store.load(id).err().map(|why| (id.clone(), why)),
                    _ => None,
                };
                match unreadable {
                    Some((id, why)) => format!("session `{id}` cannot be read: {why}"),
                    None => e.message,
                }
            })
    }

    /// The sessions of the data directory whose id is, or starts with, `prefix` and which the
    /// listing `ids` left out (their metadata cannot be read). An exact id counts whether its
    /// directory is here or not (a store elsewhere).
    fn unreadable_start(&self, prefix: &str, ids: &[String]) -> Vec<String> {
        let here: Vec<String> = std::fs::read_dir(self.data_dir.join("sessions"))
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|entry| entry.file_name().into_string().ok())
                    .filter(|id| {
                        id.starts_with(prefix)
                            && crate::store::check_id(id).is_ok()
                            && !ids.contains(id)
                    })
                    .collect()
            })
            .unwrap_or_default();
        // An exact id wins, and one of a store elsewhere (no directory here) is asked for.
        if here.iter().any(|id| id == prefix)
            || (here.is_empty() && crate::store::check_id(prefix).is_ok())
        {
            return vec![prefix.to_owned()];
        }
        here
    }

    /// Who deletes: the running server (through its socket), or this process (holding the
    /// data directory's lock, so that no server starts meanwhile).
    /// `command` (`session gc`, say) is what the lock file names while this process holds it.
    pub fn remover(&self, command: &str) -> Result<Remover, String> {
        // Files this process writes (the lock's first) would be its user's, which the server
        // may not read; and a running server's socket answers only its own user.
        writes_as_owner(&self.data_dir, command)?;
        match DataLock::take(&self.data_dir, &format!("monad-server {command}")) {
            Ok(lock) => Ok(Remover::Here {
                registry: Box::new(self.registry()),
                _lock: lock,
            }),
            Err(refused) if refused.holder == Some(Holder::Command) => Err(refused.message),
            // Held by a server, or not to be opened by this user (the server's own files are
            // private): a running server's socket is the way, and decides who may.
            Err(refused) => {
                let socket = self.data_dir.join(ADMIN_SOCKET);
                if socket.exists() {
                    Ok(Remover::Server(socket))
                } else if refused.holder.is_some() {
                    Err(format!(
                        "{} (it is older than this command and cannot delete sessions while it \
                         runs)",
                        refused.message
                    ))
                } else {
                    Err(refused.message)
                }
            }
        }
    }
}

/// The file where a serving server notes the address it listens on, for `token create`'s
/// login line.
pub const ADDRESS_FILE: &str = "address";

/// Parses `session gc --max-age`: `90` or `90d` (days), `12h` (hours).
pub fn parse_age(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (digits, unit) = match text.strip_suffix('d') {
        Some(days) => (days, 86_400),
        None => match text.strip_suffix('h') {
            Some(hours) => (hours, 3_600),
            None => (text, 86_400),
        },
    };
    match digits.parse::<u64>() {
        Ok(n) if !digits.starts_with('+') => Ok(Duration::from_secs(n.saturating_mul(unit))),
        _ => Err(format!(
            "`{}` is not an age: give days (`90` or `90d`) or hours (`12h`)",
            monad_protocol::text::printable(text)
        )),
    }
}

/// An age in a few words: `90 days`, `12 hours`, `1 day`.
pub fn describe_age(age: Duration) -> String {
    let secs = age.as_secs();
    let (n, one, many) = if secs.is_multiple_of(86_400) {
        (secs / 86_400, "day", "days")
    } else {
        (secs / 3_600, "hour", "hours")
    };
    monad_protocol::output::count(n as usize, one, many)
}

impl Admin {
    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The fingerprint of the server's certificate; `None` before the first start (or
    /// `token create`) made one.
    pub fn fingerprint(&self) -> Result<Option<String>, String> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let path = self.data_dir.join("tls").join("cert.pem");
        if !path.exists() {
            return Ok(None);
        }
        CertificateDer::from_pem_file(&path)
            .map(|cert| Some(crate::tls::fingerprint(&cert)))
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Makes the certificate when there is none yet (as the first start does) and returns its
    /// fingerprint.
    pub fn ensure_certificate(&self) -> Result<String, crate::ServerError> {
        crate::tls::load_or_create(&self.data_dir.join("tls")).map(|(id, _)| id.fingerprint)
    }

    /// Notes the address a serving server listens on ([`ADDRESS_FILE`]).
    pub fn record_address(&self, addr: &str) -> Result<(), crate::ServerError> {
        crate::fsutil::write_atomic(
            &self.data_dir.join(ADDRESS_FILE),
            format!("{addr}\n").as_bytes(),
            crate::fsutil::PRIVATE_FILE,
        )
    }

    /// The address the server last listened on, when it noted one.
    pub fn address(&self) -> Option<String> {
        std::fs::read_to_string(self.data_dir.join(ADDRESS_FILE))
            .ok()
            .map(|a| a.trim().to_owned())
            .filter(|a| !a.is_empty())
    }

    /// Some of a session's tool calls from its audit log, from byte `offset` on (0: the first),
    /// and the offset after the last whole line read: at most [`AUDIT_PAGE_BYTES`] of the file
    /// (more only for a single longer line) or [`AUDIT_PAGE_RECORDS`] rows, so that a log of
    /// any size is printed a page at a time rather than read whole into memory. The same offset
    /// back means the log holds nothing more yet (`session audit` pages on, and `--follow`
    /// polls, from the offset returned).
    ///
    /// In PostgreSQL, `offset` is the log's cursor ([`SessionStore::audit_after`]: the
    /// sequence number of the last row read), not bytes.
    pub fn audit_from(&self, id: &str, offset: u64) -> Result<(Vec<AuditRecord>, u64), String> {
        use std::io::{Read, Seek};
        if self.in_database {
            // Records that cannot be read are skipped, and not read again.
            return self
                .store
                .audit_after(id, offset, AUDIT_PAGE_RECORDS)
                .map_err(|e| e.to_string());
        }
        let path = self.data_dir.join("sessions").join(id).join("audit.jsonl");
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let failed = |e: std::io::Error| format!("{}: {e}", path.display());
        let mut file = std::io::BufReader::new(file);
        file.seek(std::io::SeekFrom::Start(offset))
            .map_err(failed)?;
        let mut bytes = Vec::new();
        file.by_ref()
            .take(AUDIT_PAGE_BYTES)
            .read_to_end(&mut bytes)
            .map_err(failed)?;
        // A line longer than a page is read to its end.
        if bytes.len() as u64 == AUDIT_PAGE_BYTES && !bytes.contains(&b'\n') {
            let mut rest = Vec::new();
            std::io::BufRead::read_until(&mut file, b'\n', &mut rest).map_err(failed)?;
            bytes.extend_from_slice(&rest);
        }
        // Only whole lines: a line being written is read on the next turn.
        let end = bytes
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |at| at + 1);
        let records = bytes[..end]
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .filter_map(|l| serde_json::from_slice(l).ok())
            .collect();
        Ok((records, offset + end as u64))
    }

    /// Every page of a session's audit log from its start ([`Admin::audit_from`]), given to
    /// `each` in order; returns the offset after the last (where `session audit --follow` goes
    /// on).
    pub fn each_audit_page<E: From<StoreError>>(
        &self,
        id: &str,
        mut each: impl FnMut(Vec<AuditRecord>) -> Result<(), E>,
    ) -> Result<u64, E> {
        let mut offset = 0;
        loop {
            let (page, next) = self
                .audit_from(id, offset)
                .map_err(|why| E::from(StoreError::Invalid(why)))?;
            each(page)?;
            if next == offset {
                return Ok(offset);
            }
            offset = next;
        }
    }

    /// Whether session `id` exists.
    pub fn exists(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self.store.load(id)?.is_some())
    }
}

/// How much of a session's audit file [`Admin::audit_from`] reads at once.
pub const AUDIT_PAGE_BYTES: u64 = 4 * 1024 * 1024;

/// How many audit rows [`Admin::audit_from`] reads at once from PostgreSQL.
pub const AUDIT_PAGE_RECORDS: usize = 10_000;

/// The running server's administration socket, in the data directory (mode 0600 in a 0700
/// directory; the server also checks that a peer runs as its own user).
pub const ADMIN_SOCKET: &str = "admin.sock";

/// How long the socket waits for a connected peer's request line.
const ADMIN_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Largest request on the administration socket.
const MAX_ADMIN_REQUEST: u64 = 1024 * 1024;

/// A request on the administration socket: one JSON line, answered by one [`AdminAnswer`] line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum AdminRequest {
    /// The sessions unused for `max_age_secs` (never a user's default, never one in use).
    Unused {
        /// The age, in seconds.
        max_age_secs: u64,
    },
    /// Delete these sessions; with `max_age_secs`, only those still unused for that long.
    /// Sessions in use are kept.
    Delete {
        /// Their ids.
        sessions: Vec<String>,
        /// Delete only those still unused for this long (`session gc`).
        #[serde(default)]
        max_age_secs: Option<u64>,
    },
}

/// The answer on the administration socket.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminAnswer {
    /// For [`AdminRequest::Unused`]: the sessions.
    #[serde(default)]
    pub unused: Vec<SessionMeta>,
    /// For [`AdminRequest::Delete`]: the sessions deleted.
    #[serde(default)]
    pub deleted: Vec<String>,
    /// For [`AdminRequest::Delete`]: the sessions kept, with why.
    #[serde(default)]
    pub kept: Vec<(String, String)>,
    /// Why the request failed as a whole.
    #[serde(default)]
    pub error: Option<String>,
}

/// Who deletes sessions (see [`Admin::remover`]).
pub enum Remover {
    /// This process, on disk, holding the data directory's lock.
    Here {
        /// The sessions of the data directory.
        registry: Box<Registry>,
        /// Held until the deleting is done.
        _lock: DataLock,
    },
    /// The running server, through its administration socket.
    Server(PathBuf),
}

impl Remover {
    /// Whether a running server deletes.
    pub fn through_server(&self) -> bool {
        matches!(self, Remover::Server(_))
    }

    /// The sessions unused for `max_age` (never a user's default, never one in use), oldest first.
    pub fn unused(&self, max_age: Duration) -> Result<Vec<SessionMeta>, String> {
        match self {
            Remover::Here { registry, .. } => registry.unused_for(max_age).map_err(|e| e.message),
            Remover::Server(socket) => Ok(ask(
                socket,
                &AdminRequest::Unused {
                    max_age_secs: max_age.as_secs(),
                },
            )?
            .unused),
        }
    }

    /// Deletes `sessions` (with `max_age`: only those still unused for that long); returns
    /// those deleted and those kept, with why.
    pub fn delete(
        &self,
        sessions: &[String],
        max_age: Option<Duration>,
    ) -> Result<Removed, String> {
        match self {
            Remover::Here { registry, .. } => Ok(delete_in(registry, sessions, max_age)),
            Remover::Server(socket) => {
                let answer = ask(
                    socket,
                    &AdminRequest::Delete {
                        sessions: sessions.to_vec(),
                        max_age_secs: max_age.map(|a| a.as_secs()),
                    },
                )?;
                Ok((answer.deleted, answer.kept))
            }
        }
    }
}

/// The sessions deleted, and those kept with why.
pub type Removed = (Vec<String>, Vec<(String, String)>);

/// Deletes `sessions` from `registry` (with `max_age`: only those still unused for that long).
fn delete_in(registry: &Registry, sessions: &[String], max_age: Option<Duration>) -> Removed {
    let still_unused: Option<Vec<String>> = max_age.map(|age| {
        registry
            .unused_for(age)
            .map(|all| all.into_iter().map(|m| m.id).collect())
            .unwrap_or_default()
    });
    let (mut deleted, mut kept) = (Vec::new(), Vec::new());
    for id in sessions {
        if let Some(unused) = &still_unused
            && !unused.contains(id)
        {
            kept.push((id.clone(), "used since it was listed".to_owned()));
            continue;
        }
        match registry.delete(id) {
            Ok(()) => deleted.push(id.clone()),
            Err(e) => kept.push((id.clone(), e.message)),
        }
    }
    (deleted, kept)
}

/// Sends one request to the server's administration socket and reads its answer.
fn ask(socket: &Path, request: &AdminRequest) -> Result<AdminAnswer, String> {
    use std::io::{BufRead, Write};
    let failed = |e: std::io::Error| {
        format!(
            "cannot reach the running monad-server through {}: {e}",
            socket.display()
        )
    };
    let stream = std::os::unix::net::UnixStream::connect(socket).map_err(failed)?;
    let mut line = serde_json::to_string(request).map_err(|e| e.to_string())?;
    line.push('\n');
    // A server that refuses answers without reading: its answer is read even when the
    // request could not be written whole.
    let written = (&stream).write_all(line.as_bytes());
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut answer = String::new();
    let read = std::io::BufReader::new(&stream).read_line(&mut answer);
    if answer.is_empty() {
        written.and(read).map_err(failed)?;
    }
    let answer: AdminAnswer = serde_json::from_str(&answer)
        .map_err(|e| format!("the running monad-server answered oddly: {e}"))?;
    match answer.error {
        Some(error) => Err(error),
        None => Ok(answer),
    }
}

/// Serves the administration socket at `path` until `stop` turns true: the running server's
/// side of `session delete` and `session gc`. Only a peer of the server's own user is heard.
pub async fn serve_socket(
    state: Arc<crate::server::State>,
    path: PathBuf,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    // A socket left by an earlier server of this data dir (this one holds its lock).
    let _ = std::fs::remove_file(&path);
    let listener = match tokio::net::UnixListener::bind(&path) {
        Ok(listener) => listener,
        Err(e) => {
            return warn!(
                "cannot serve {} ({e}): `monad-server session delete` and `session gc` need \
                 the server stopped",
                path.display()
            );
        }
    };
    if let Err(e) = std::fs::set_permissions(
        &path,
        std::os::unix::fs::PermissionsExt::from_mode(crate::fsutil::PRIVATE_FILE),
    ) {
        warn!("cannot make {} private: {e}", path.display());
    }
    let me = nix::unistd::geteuid().as_raw();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stopping| *stopping) => break,
        };
        let Ok((stream, _)) = accepted else {
            // Out of descriptors, say: wait a little rather than spin.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        if stream.peer_cred().map(|c| c.uid()).ok() != Some(me) {
            warn!("refused an administration request from another user");
            tokio::spawn(refuse(stream));
            continue;
        }
        let state = state.clone();
        tokio::spawn(async move { admin_request(&state, stream).await });
    }
    let _ = std::fs::remove_file(&path);
}

/// Tells a peer of another user that it is not heard, and hangs up.
async fn refuse(mut stream: tokio::net::UnixStream) {
    let answer = AdminAnswer {
        error: Some("refused: only the user the monad-server runs as may administer it".to_owned()),
        ..AdminAnswer::default()
    };
    let mut text = serde_json::to_string(&answer).unwrap_or_default();
    text.push('\n');
    let _ = stream.write_all(text.as_bytes()).await;
    let _ = stream.shutdown().await;
}

async fn admin_request(state: &Arc<crate::server::State>, stream: tokio::net::UnixStream) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader =
        tokio::io::BufReader::new(tokio::io::AsyncReadExt::take(read, MAX_ADMIN_REQUEST));
    // A peer that never finishes its line is not waited for.
    let read = tokio::time::timeout(ADMIN_READ_TIMEOUT, reader.read_line(&mut line)).await;
    let read = read.unwrap_or_else(|_| {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no whole request within 10 s",
        ))
    });
    let answer = match read {
        Err(e) => AdminAnswer {
            error: Some(format!("cannot read the request: {e}")),
            ..AdminAnswer::default()
        },
        Ok(_) => match serde_json::from_str::<AdminRequest>(&line) {
            Err(e) => AdminAnswer {
                error: Some(format!("malformed request: {e}")),
                ..AdminAnswer::default()
            },
            Ok(request) => {
                let state = state.clone();
                tokio::task::spawn_blocking(move || answer_admin(&state.registry, request))
                    .await
                    .unwrap_or_else(|e| AdminAnswer {
                        error: Some(e.to_string()),
                        ..AdminAnswer::default()
                    })
            }
        },
    };
    let mut text = serde_json::to_string(&answer).unwrap_or_default();
    text.push('\n');
    let _ = write.write_all(text.as_bytes()).await;
    let _ = write.shutdown().await;
}

fn answer_admin(registry: &Registry, request: AdminRequest) -> AdminAnswer {
    match request {
        AdminRequest::Unused { max_age_secs } => {
            match registry.unused_for(Duration::from_secs(max_age_secs)) {
                Ok(unused) => AdminAnswer {
                    unused,
                    ..AdminAnswer::default()
                },
                Err(e) => AdminAnswer {
                    error: Some(e.message),
                    ..AdminAnswer::default()
                },
            }
        }
        AdminRequest::Delete {
            sessions,
            max_age_secs,
        } => {
            let (deleted, kept) =
                delete_in(registry, &sessions, max_age_secs.map(Duration::from_secs));
            for id in &deleted {
                info!(session = %id, "deleted (monad-server session delete or gc)");
            }
            AdminAnswer {
                deleted,
                kept,
                ..AdminAnswer::default()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: `sudo monad-server token revoke` wrote `tokens.toml` as root, mode 0600, and
    /// the server (another user) could no longer read its tokens.
    #[test]
    fn a_command_that_writes_runs_as_the_data_directorys_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        assert_eq!(writes_as_owner(&data, "token revoke"), Ok(()));
        assert_eq!(
            writes_as_owner(&dir.path().join("none"), "token revoke"),
            Ok(())
        );
        if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::chown(&data, Some(54_321), Some(54_321)).unwrap();
            let refused = writes_as_owner(&data, "token revoke").unwrap_err();
            assert!(
                refused.contains("uid 54321") && refused.contains("sudo -u"),
                "{refused}"
            );
        }
    }

    /// Regression: the lock file was opened through a symbolic link in its place and cut to
    /// its note, truncating the file the link led to.
    #[test]
    fn the_lock_is_never_taken_through_a_link_or_on_a_fifo() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let precious = dir.path().join("precious.txt");
        std::fs::write(&precious, "keep me").unwrap();
        std::os::unix::fs::symlink(&precious, data.join("server.lock")).unwrap();
        assert!(DataLock::take(&data, "test").is_err());
        assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep me");
        std::fs::remove_file(data.join("server.lock")).unwrap();
        nix::unistd::mkfifo(&data.join("server.lock"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let refused = DataLock::take(&data, "test").err().unwrap();
        assert!(
            refused.message.contains("not a regular file"),
            "{}",
            refused.message
        );
        std::fs::remove_file(data.join("server.lock")).unwrap();
        let _held = DataLock::take(&data, "test").unwrap();
    }

    #[test]
    fn max_age_takes_days_bare_or_with_d_and_hours_with_h() {
        assert_eq!(parse_age("90"), Ok(Duration::from_secs(90 * 86_400)));
        assert_eq!(parse_age("90d"), Ok(Duration::from_secs(90 * 86_400)));
        assert_eq!(parse_age("12h"), Ok(Duration::from_secs(12 * 3_600)));
        assert_eq!(parse_age("0"), Ok(Duration::ZERO));
        for bad in ["", "d", "12m", "1.5", "-3", "+3", "90 days", "x1\u{1b}"] {
            let e = parse_age(bad).unwrap_err();
            assert!(e.contains("not an age"), "{bad:?}: {e}");
            assert!(!e.contains('\u{1b}'), "escaped: {e}");
        }
        assert_eq!(describe_age(Duration::from_secs(86_400)), "1 day");
        assert_eq!(describe_age(Duration::from_secs(12 * 3_600)), "12 hours");
    }
}
