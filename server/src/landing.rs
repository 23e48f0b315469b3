//! Where an MCP host lands, from its roots, and how the folder registry
//! ([`crate::roots::FolderSessions`]) follows attaches and `sessions --new`. The decisions are
//! the pure functions of [`crate::roots`]; this module reads and writes the registry and the
//! sessions. Blocking (store I/O): callers run it on the blocking pool.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use monad_protocol::wire::MAX_ROOTS;
use monad_protocol::{ErrorCode, ToolError};
use tracing::{debug, warn};

use crate::auth::DeviceId;
use crate::roots::{FolderSessions, best_match, parse_root};
use crate::session::{Attached, HostHold, Registry, Session, store_error};
use crate::store::StoreError;

/// Where a host landed.
#[derive(Debug)]
pub(crate) struct Landed {
    /// The session to work in.
    pub session: Arc<Session>,
    /// The folder a root matched.
    pub folder: Option<String>,
    /// The session's focus after landing.
    pub focus: Option<String>,
    /// Whether that focus is a folder offline now.
    pub focus_offline: bool,
    /// The host's hold on the focus when it is the folder its roots matched: its connection
    /// keeps it while the host works there.
    pub hold: Option<HostHold>,
}

/// The time now, Unix milliseconds.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Whether `e` may pass (the disk or the database failing now) rather than say what is there:
/// a corrupt record ([`StoreError::Invalid`]) stays corrupt.
fn passing(e: &StoreError) -> bool {
    !matches!(e, StoreError::Invalid(_) | StoreError::NotFound(_))
}

/// The registry's entries of `user`'s device, stale sessions (and sessions that no longer
/// exist) pruned, and the pruning saved. A registry that cannot be read now is an error, not an
/// empty one: a landing would save a new entry over the folder's sessions (a corrupt one is
/// read as empty, and written over, as the files store keeps a corrupt file aside). An entry
/// with a session whose metadata cannot be read now is kept as it is (that session is not known
/// to be gone); a session whose metadata is corrupt goes, as one that does not exist.
fn entries(
    registry: &Registry,
    user: &str,
    device: &DeviceId,
    now: u64,
) -> Result<Vec<FolderSessions>, StoreError> {
    let store = registry.store();
    let mut entries = match store.folder_sessions(user, device.as_str()) {
        Ok(entries) => entries,
        Err(e) if !passing(&e) => {
            warn!("folder registry: {e}: read as empty");
            Vec::new()
        }
        Err(e) => return Err(e),
    };
    for entry in &mut entries {
        // A session's work counts as its use here (seed 002 touches a session on each tool
        // call): a host working in it for days keeps it.
        let before = entry.clone();
        let ids: Vec<String> = entry.sessions.keys().cloned().collect();
        // The owners of the sessions whose metadata was read here (`None`: no such session),
        // so that pruning does not read it again.
        let mut owners: HashMap<String, Option<String>> = HashMap::new();
        let mut unreadable = false;
        for id in ids {
            // A session in memory knows how long it has been idle; one that is not (after a
            // restart, or dropped when idle) has its last activity in its metadata.
            let used = match registry.idle_of(&id) {
                Some(idle) => {
                    Some(now.saturating_sub(u64::try_from(idle.as_millis()).unwrap_or(u64::MAX)))
                }
                None => match store.load(&id) {
                    Ok(meta) => {
                        let used = meta
                            .as_ref()
                            .and_then(|meta| crate::fsutil::parse_rfc3339(&meta.last_active))
                            .map(|secs| secs.saturating_mul(1000).min(now));
                        owners.insert(id.clone(), meta.map(|meta| meta.owner));
                        used
                    }
                    Err(e) if passing(&e) => {
                        warn!("folder registry: session {id} could not be read: {e}");
                        unreadable = true;
                        break;
                    }
                    Err(e) => {
                        warn!("folder registry: session {id}: {e}: left out");
                        owners.insert(id.clone(), None);
                        None
                    }
                },
            };
            if let Some(used) = used {
                entry.use_session(&id, used, false);
            }
        }
        if unreadable {
            *entry = before;
            continue;
        }
        entry.prune(now, |id| match owners.get(id) {
            Some(owner) => owner.as_deref() == Some(user),
            None => registry.exists_for(id, user),
        });
        if *entry != before
            && let Err(e) = store.save_folder_sessions(entry)
        {
            warn!("folder registry: {e}");
        }
    }
    entries.retain(|e| !e.is_empty());
    Ok(entries)
}

/// The folders `device` has attached and online now, in any of `user`'s sessions, with their
/// absolute paths.
fn live(registry: &Registry, user: &str, device: &DeviceId) -> Vec<(Arc<Session>, Attached)> {
    let mut live = Vec::new();
    for session in registry.loaded_of(user) {
        for folder in session.online_folders(device) {
            if folder.folder.is_some() {
                live.push((session.clone(), folder));
            }
        }
    }
    // One order whatever the map's: by session id.
    live.sort_by(|a, b| a.0.id.cmp(&b.0.id));
    live
}

/// The folder `roots` pick: among the folders attached and online now, when one holds a root;
/// else among every folder known for the device (the registry's too). So a folder the registry
/// remembers, offline now, does not win over the online folder around it, where the host would
/// see nothing.
fn pick(
    roots: &[PathBuf],
    entries: &[FolderSessions],
    live: &[(Arc<Session>, Attached)],
) -> Option<String> {
    let online: Vec<&str> = live
        .iter()
        .filter_map(|(_, a)| a.folder.as_deref())
        .collect();
    best_match(roots, &online)
        .or_else(|| best_match(roots, &known_folders(entries, live)))
        .map(|(_, folder)| folder.to_owned())
}

/// Every folder known for the device: the registry's and the live ones, each once.
fn known_folders<'a>(
    entries: &'a [FolderSessions],
    live: &'a [(Arc<Session>, Attached)],
) -> Vec<&'a str> {
    let mut folders: Vec<&str> = entries.iter().map(|e| e.folder.as_str()).collect();
    for (_, a) in live {
        if let Some(f) = a.folder.as_deref()
            && !folders.contains(&f)
        {
            folders.push(f);
        }
    }
    folders
}

/// Makes `folder` reachable in `session` when it is attached and online anywhere (sharing the
/// link of a live attachment elsewhere) and returns its short name there.
fn bring(
    registry: &Registry,
    session: &Arc<Session>,
    device: &DeviceId,
    folder: &str,
    live: &[(Arc<Session>, Attached)],
) -> Option<String> {
    if let Some(here) = session
        .online_folders(device)
        .into_iter()
        .find(|a| a.folder.as_deref() == Some(folder))
    {
        return Some(here.name);
    }
    let (_, there) = live
        .iter()
        .find(|(_, a)| a.folder.as_deref() == Some(folder))?;
    registry.share(there, session).map(|info| info.name)
}

/// Focuses `session` on the folder attached (and online) there, if it is.
fn focus_if_attached(session: &Session, device: &DeviceId, folder: &str) {
    if let Some(here) = session
        .online_folders(device)
        .into_iter()
        .find(|a| a.folder.as_deref() == Some(folder))
        && let Err(e) = session.set_focus(&here.name)
    {
        debug!(session = %session.id, "focus: {}", e.message);
    }
}

fn save(registry: &Registry, entry: &FolderSessions) {
    if let Err(e) = registry.store().save_folder_sessions(entry) {
        warn!("folder registry: {e}");
    }
}

/// Lands a host of `user` on `device` by its `roots` (a session it asked for wins; see
/// `docs/mcp.md`, "Roots"). Roots that are not absolute `file:` URIs are skipped; more than
/// [`MAX_ROOTS`] is an error.
pub(crate) fn land(
    registry: &Registry,
    user: &str,
    device: &DeviceId,
    roots: &[String],
    requested: Option<&str>,
    now: u64,
    mine: Option<&HostHold>,
) -> Result<Landed, ToolError> {
    if roots.len() > MAX_ROOTS {
        return Err(ToolError::new(
            ErrorCode::InvalidArguments,
            format!(
                "{} roots: at most {MAX_ROOTS} are looked at; send the first ones",
                roots.len()
            ),
        ));
    }
    let parsed: Vec<PathBuf> = roots
        .iter()
        .filter_map(|uri| {
            parse_root(uri)
                .inspect_err(|why| {
                    let shown = monad_protocol::text::printable(uri.get(..200).unwrap_or(uri));
                    debug!("root `{shown}` skipped: {why}");
                })
                .ok()
        })
        .collect();
    let folders = registry.folders_of(user);
    let _held = folders.lock().unwrap_or_else(|p| p.into_inner());
    let entries = entries(registry, user, device, now).map_err(store_error)?;
    let live = live(registry, user, device);
    let matched = pick(&parsed, &entries, &live);
    let session = match (requested, &matched) {
        (Some(id), _) => {
            let session = registry.resolve(Some(id), user, Some(device))?;
            // Not under another host working there.
            if let Some(folder) = &matched
                && !session.focus_held_against(device, folder, mine)
            {
                focus_if_attached(&session, device, folder);
            }
            session
        }
        (None, None) => registry.resolve(None, user, Some(device))?,
        (None, Some(folder)) => {
            let entry = entries.iter().find(|e| &e.folder == folder);
            let there = live
                .iter()
                .find(|(_, a)| a.folder.as_deref() == Some(folder));
            let active = match (entry, there) {
                (Some(entry), _) => entry.active.clone(),
                (None, Some((session, _))) => session.id.clone(),
                (None, None) => registry.create(user)?.id.clone(),
            };
            let mut session = registry.resolve(Some(&active), user, Some(device))?;
            // A session whose settings refuse the folder (attached with full trust, where
            // `attach.allow_full_trust = false`) would have the host work without it: the
            // session the folder is attached to now instead, which took it.
            if let Some((home, attached)) = there
                && session.refuses(attached.trust)
            {
                session = home.clone();
            }
            // One focus per session, shared by its agents: a session focused on another
            // device's folder, online, is that device's hosts'; one focused on another folder
            // an MCP host landed on is that host's. Moving the focus under them would send
            // their un-targeted writes to this folder; this host gets a session of its own for
            // its folder instead (which becomes the folder's active session).
            if session.focus_held_against(device, folder, mine) {
                let own = registry.create(user)?;
                session = registry.resolve(Some(&own.id), user, Some(device))?;
            }
            let mut entry = entry.cloned().unwrap_or_else(|| {
                FolderSessions::new(user, device.as_str(), folder, &session.id, now)
            });
            entry.use_session(&session.id, now, true);
            save(registry, &entry);
            if let Some(name) = bring(registry, &session, device, folder, &live)
                && let Err(e) = session.set_focus(&name)
            {
                debug!(session = %session.id, "focus: {}", e.message);
            }
            session
        }
    };
    let hold = matched
        .as_deref()
        .and_then(|folder| session.hold_for_host(device, folder));
    let focus = session.focus();
    let focus_offline = focus.as_ref().is_some_and(|name| {
        session
            .workspaces()
            .iter()
            .any(|w| w.info.name == *name && !w.info.online)
    });
    Ok(Landed {
        focus,
        focus_offline,
        session,
        folder: matched,
        hold,
    })
}

/// The session an attach that names none goes to: the folder's active session, when the
/// registry has one for it (exactly this folder, on this device) and it still exists. The use
/// is noted. A registry that cannot be read is an error: the folder would attach elsewhere
/// than where its host works.
pub(crate) fn attach_target(
    registry: &Registry,
    user: &str,
    device: &DeviceId,
    folder: &str,
    now: u64,
) -> Result<Option<String>, ToolError> {
    let folders = registry.folders_of(user);
    let _held = folders.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut entry) = entries(registry, user, device, now)
        .map_err(store_error)?
        .into_iter()
        .find(|e| e.folder == folder)
    else {
        return Ok(None);
    };
    let active = entry.active.clone();
    entry.use_session(&active, now, false);
    save(registry, &entry);
    Ok(Some(active))
}

/// `sessions --new` run at `path`: when a folder `device` attached is, or contains, `path`, the
/// new `session` becomes its active session and the folder, when online anywhere, serves it too
/// and is its focus. Returns the folder. A path that is not absolute (or has `..`) matches
/// nothing.
pub(crate) fn start_in_folder(
    registry: &Registry,
    user: &str,
    device: &DeviceId,
    path: &str,
    session: &Arc<Session>,
    now: u64,
) -> Option<String> {
    let path = Path::new(path);
    if !path.is_absolute()
        || path
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return None;
    }
    let folders = registry.folders_of(user);
    let _held = folders.lock().unwrap_or_else(|p| p.into_inner());
    let entries = entries(registry, user, device, now)
        .inspect_err(|e| warn!("folder registry: {e}: the new session is not its folder's"))
        .ok()?;
    let live = live(registry, user, device);
    let folder = pick(&[path.to_path_buf()], &entries, &live)?;
    let mut entry = entries
        .iter()
        .find(|e| e.folder == folder)
        .cloned()
        .unwrap_or_else(|| FolderSessions::new(user, device.as_str(), &folder, &session.id, now));
    entry.use_session(&session.id, now, true);
    save(registry, &entry);
    if let Some(name) = bring(registry, session, device, &folder, &live)
        && let Err(e) = session.set_focus(&name)
    {
        debug!(session = %session.id, "focus: {}", e.message);
    }
    Some(folder)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Layers;
    use crate::store::{FolderStore, FsStore};

    /// A folder attached with full trust, whose active session's settings refuse such folders:
    /// the host lands where the folder is attached, which becomes its active session, so that
    /// its next `attach` (naming no session) goes there too, not where it would be refused.
    #[tokio::test]
    async fn a_host_is_not_landed_where_its_folder_would_be_refused() {
        use crate::session::tests::live_folder_at;
        use monad_protocol::wire::Trust;
        const LOCKED: &str = "00000000-0000-4000-8000-00000000c001";
        const HOME: &str = "00000000-0000-4000-8000-00000000c002";
        const FOLDER: &str = "/home/ana/two";
        let dir = tempfile::tempdir().unwrap();
        crate::session::tests::refusing_full_trust(dir.path(), LOCKED);
        let store = Arc::new(FsStore::new(dir.path()));
        let registry = Registry::new(dir.path(), store.clone(), Layers::default());
        let device = DeviceId::parse("00000000-0000-4000-8000-000000000001").unwrap();
        let now = now_ms();
        let locked = registry.open(LOCKED, "ana").unwrap();
        assert!(locked.refuses(Trust::Full));
        let home = registry.open(HOME, "ana").unwrap();
        // The folder's active session is the locked one (a host landed there when the folder
        // was attached restricted); it is attached with full trust in another now.
        store
            .save_folder_sessions(&FolderSessions::new(
                "ana",
                device.as_str(),
                FOLDER,
                LOCKED,
                now,
            ))
            .unwrap();
        let (full, _kicked, _peer) = live_folder_at(&registry, HOME, 1, Trust::Full, Some(FOLDER));
        home.attach(full, None);
        let roots = [format!("file://{FOLDER}/src")];
        let landed = land(&registry, "ana", &device, &roots, None, now, None).unwrap();
        assert_eq!(landed.session.id, HOME);
        assert_eq!(landed.folder.as_deref(), Some(FOLDER));
        assert_eq!(landed.focus.as_deref(), Some("two"));
        assert!(!landed.focus_offline);
        assert!(locked.workspaces().iter().all(|w| w.info.name != "two"));
        assert_eq!(
            attach_target(&registry, "ana", &device, FOLDER, now)
                .unwrap()
                .as_deref(),
            Some(HOME)
        );
    }

    /// A landing reads a folder's entry and saves it whole: `sessions --new` run many times at
    /// once in one folder must not save over each other (each new session stays in the entry).
    #[test]
    fn sessions_started_at_once_in_one_folder_are_all_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(FsStore::new(dir.path()));
        let registry = Registry::new(dir.path(), store.clone(), Layers::default());
        let device = DeviceId::parse(&uuid::Uuid::new_v4().to_string()).unwrap();
        let now = now_ms();
        let first = registry.create("ana").unwrap();
        store
            .save_folder_sessions(&FolderSessions::new(
                "ana",
                device.as_str(),
                "/home/ana/proj",
                &first.id,
                now,
            ))
            .unwrap();
        let started: Vec<Arc<Session>> = (0..12).map(|_| registry.create("ana").unwrap()).collect();
        std::thread::scope(|scope| {
            for session in &started {
                let (registry, device) = (&registry, &device);
                scope.spawn(move || {
                    start_in_folder(registry, "ana", device, "/home/ana/proj/src", session, now)
                });
            }
        });
        let entry = &store.folder_sessions("ana", device.as_str()).unwrap()[0];
        for session in started.iter().chain([&first]) {
            assert!(
                entry.sessions.contains_key(&session.id),
                "{} lost: {entry:?}",
                session.id
            );
        }
    }

    /// A session of a folder's entry whose metadata cannot be read is not taken for gone: the
    /// entry keeps it, as active, where a landing pruned it and moved the folder's active
    /// session (a store's passing failure forgot where the folder's host worked).
    #[test]
    fn a_session_that_cannot_be_read_is_not_pruned_from_its_folder() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(FsStore::new(dir.path()));
        let device = DeviceId::parse(&uuid::Uuid::new_v4().to_string()).unwrap();
        let now = now_ms();
        let (active, other) = {
            let registry = Registry::new(dir.path(), store.clone(), Layers::default());
            (
                registry.create("ana").unwrap().id.clone(),
                registry.create("ana").unwrap().id.clone(),
            )
        };
        let mut entry = FolderSessions::new("ana", device.as_str(), "/home/ana/p", &other, now);
        entry.use_session(&active, now, true);
        store.save_folder_sessions(&entry).unwrap();
        // A fresh registry and store (nothing in memory), the active session's metadata
        // unreadable now (a directory where its file is: the read fails, as a disk's would).
        let store = Arc::new(FsStore::new(dir.path()));
        let registry = Registry::new(dir.path(), store.clone(), Layers::default());
        let meta = dir
            .path()
            .join("sessions")
            .join(&active)
            .join("session.toml");
        std::fs::remove_file(&meta).unwrap();
        std::fs::create_dir(&meta).unwrap();
        let roots = ["file:///home/ana/p".to_owned()];
        assert!(land(&registry, "ana", &device, &roots, None, now, None).is_err());
        let kept = store.folder_sessions("ana", device.as_str()).unwrap();
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert_eq!(kept[0].active, active);
        assert!(kept[0].sessions.contains_key(&other), "{kept:?}");
        // Corrupt, it stays corrupt: it goes from the folder, which is not locked out.
        std::fs::remove_dir(&meta).unwrap();
        std::fs::write(&meta, "id = [").unwrap();
        let landed = land(&registry, "ana", &device, &roots, None, now, None).unwrap();
        assert_eq!(landed.session.id, other);
    }
}
