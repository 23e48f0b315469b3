//! Sessions: each one's primary workspace on the server and the folders attached to it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use monad_protocol::wire::{Host, SessionInfo, Trust, WorkspaceInfo};
use monad_protocol::{ErrorCode, ToolError, ToolName};
use monad_sandbox::Sandbox;
use monad_sandbox::exec::cgroup::ProcessGroups;
use tokio::sync::mpsc;
use tracing::warn;

use crate::auth::DeviceId;
use crate::fsutil::now_rfc3339;
use crate::settings::{Layers, Settings};
use crate::store::{KeptFolder, SessionMeta, Store, StoreError};
use monad_sandbox::exec::ConnectionBudgets;

/// The id of the well-known session.
pub const DEFAULT_SESSION: &str = "default";

/// How often a session's `last_active` reaches the disk at most (it is kept in memory between).
const META_SAVE_INTERVAL: Duration = Duration::from_secs(60);

/// A live connection to the client that attached a folder.
#[derive(Debug, Clone)]
pub struct ClientLink {
    /// The client's connection; the server opens a stream on it per call.
    pub conn: crate::executor::Conn,
    /// The id of the client's attach request, which names the folder on that connection.
    pub attachment: u64,
    /// Distinguishes this attachment from an earlier one of the same folder.
    pub generation: u64,
    /// The protocol minor version the connection speaks: what the client understands
    /// ([`ClientLink::reports_network`], [`ClientLink::runs_if_present`]).
    pub minor: u32,
    /// Tells the attachment's task to end it, with the reason its client is told (another
    /// attach of the folder took over, or `monad-client detach`).
    pub kick: tokio::sync::mpsc::UnboundedSender<String>,
}

impl ClientLink {
    /// Its client reports the folder's network connections on the attach stream as they
    /// happen (protocol minor [`monad_protocol::wire::NETWORK_MINOR`]): those a result carries
    /// are not audited again.
    pub fn reports_network(&self) -> bool {
        self.minor >= monad_protocol::wire::NETWORK_MINOR
    }

    /// Its client takes a `run` with `if_present` (protocol minor
    /// [`monad_protocol::wire::IF_PRESENT_MINOR`]): routing asks it to run a call only if the
    /// path is there, rather than probing first.
    pub fn runs_if_present(&self) -> bool {
        self.minor >= monad_protocol::wire::IF_PRESENT_MINOR
    }

    /// `args` of `tool` as its client takes them: a `search`'s `context` and `files_only`
    /// left out for a client older than protocol minor
    /// [`monad_protocol::wire::SEARCH_CONTEXT_MINOR`] where they ask for nothing, and the call
    /// refused, saying why, where they ask for what that client cannot do (it would refuse them
    /// as unknown, after its owner was asked).
    pub fn takes(
        &self,
        name: &str,
        tool: monad_protocol::ToolName,
        args: &mut serde_json::Value,
    ) -> Result<(), monad_protocol::ToolError> {
        if tool != monad_protocol::ToolName::Search
            || self.minor >= monad_protocol::wire::SEARCH_CONTEXT_MINOR
        {
            return Ok(());
        }
        monad_protocol::tools::SearchArgs::for_older_client(args).map_err(|key| {
            monad_protocol::ToolError::new(
                monad_protocol::ErrorCode::InvalidArguments,
                format!(
                    "`{key}` needs a newer monad-client than the one serving workspace \
                     `{name}` (protocol minor {}; {} or later takes it): search without it, \
                     or have the folder's owner update monad-client",
                    self.minor,
                    monad_protocol::wire::SEARCH_CONTEXT_MINOR
                ),
            )
        })
    }
}

/// What the `attach` of a folder that another attach of it took over is told.
pub const TAKEN_OVER: &str = "this folder was attached again to the session (from another \
                              terminal of this device), which took it over";

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
    pub device_id: DeviceId,
    /// The path as the user gave it.
    pub path: String,
    /// Its workspace record.
    pub record: Option<String>,
    /// The folder's absolute path on its device, when its client said (protocol minor
    /// [`monad_protocol::wire::ROOTS_MINOR`]): what MCP roots are matched against.
    pub folder: Option<String>,
    /// What network its commands get, in a few words, when its client said (protocol minor
    /// [`monad_protocol::wire::NETWORK_POLICY_MINOR`]; kept while it is offline).
    pub network: Option<String>,
    /// The connection to its client; `None` while disconnected.
    pub link: Option<ClientLink>,
}

impl Attached {
    /// The folder as its session keeps it ([`Session::keep`]).
    fn kept(&self) -> KeptFolder {
        KeptFolder {
            name: self.name.clone(),
            uri: self.uri.clone(),
            trust: self.trust,
            tools: self.tools.iter().map(|t| t.as_str().to_owned()).collect(),
            device_id: self.device_id.as_str().to_owned(),
            path: self.path.clone(),
            record: self.record.clone(),
            folder: self.folder.clone(),
            network: self.network.clone(),
        }
    }

    /// A kept folder, offline until its client attaches it again; `None` when its device id
    /// cannot be read. A tool a later version added is left out.
    fn offline(kept: &KeptFolder) -> Option<Attached> {
        Some(Attached {
            name: kept.name.clone(),
            uri: kept.uri.clone(),
            trust: kept.trust,
            tools: kept
                .tools
                .iter()
                .filter_map(|t| ToolName::parse(t))
                .collect(),
            device_id: DeviceId::parse(&kept.device_id).ok()?,
            path: kept.path.clone(),
            record: kept.record.clone(),
            folder: kept.folder.clone(),
            network: kept.network.clone(),
            link: None,
        })
    }
}

/// A session's primary workspace: its [`Sandbox`] (an open directory) is opened on first use,
/// once, off the async workers; a session that is only listed or looked at holds no descriptor.
#[derive(Debug)]
pub struct PrimaryWorkspace {
    root: PathBuf,
    limits: monad_sandbox::Limits,
    exec: monad_sandbox::ExecPolicy,
    /// The process groups of the server's users and this session's owner, whose group its
    /// commands join (`server.max_processes_per_user`, `server.max_memory_per_user`).
    groups: Option<(Arc<ProcessGroups>, String)>,
    /// The session's owner, and the budgets of proxy connections their commands share.
    owner: String,
    connections: Option<Arc<ConnectionBudgets>>,
    sandbox: tokio::sync::OnceCell<Arc<Sandbox>>,
}

impl PrimaryWorkspace {
    /// The workspace at `root`, not opened yet.
    pub fn new(
        root: PathBuf,
        limits: monad_sandbox::Limits,
        exec: monad_sandbox::ExecPolicy,
    ) -> PrimaryWorkspace {
        PrimaryWorkspace {
            root,
            limits,
            exec,
            groups: None,
            owner: String::new(),
            connections: None,
            sandbox: tokio::sync::OnceCell::new(),
        }
    }

    /// What network its commands get, in a few words (its `[exec]` policy's), bounded as a
    /// listing holds it ([`monad_protocol::wire::bounded_network`]).
    pub fn network(&self) -> String {
        monad_protocol::wire::bounded_network(&self.exec.network_summary())
    }

    /// Runs its commands in `owner`'s group of `groups`, bounded with the owner's other
    /// commands.
    pub fn in_group_of(mut self, groups: Option<Arc<ProcessGroups>>, owner: &str) -> Self {
        self.groups = groups.map(|groups| (groups, owner.to_owned()));
        self
    }

    /// Bounds its commands' proxy connections with `owner`'s others' in `budgets`.
    pub fn with_connection_budgets(
        mut self,
        budgets: Option<Arc<ConnectionBudgets>>,
        owner: &str,
    ) -> Self {
        self.connections = budgets;
        self.owner = owner.to_owned();
        self
    }

    /// Whether a background process started here is kept: still running, or exited with
    /// output not read yet (only once the sandbox is open).
    pub fn has_processes(&self) -> bool {
        self.sandbox
            .get()
            .is_some_and(|sandbox| sandbox.has_processes())
    }

    /// The sandbox, opened (and its root created) on the first call; later calls share it.
    pub async fn sandbox(&self) -> Result<Arc<Sandbox>, ToolError> {
        self.sandbox
            .get_or_try_init(|| async {
                let (root, limits, exec) =
                    (self.root.clone(), self.limits.clone(), self.exec.clone());
                let groups = self.groups.clone();
                let (owner, connections) = (self.owner.clone(), self.connections.clone());
                tokio::task::spawn_blocking(move || {
                    crate::fsutil::create_workspace_root(&root)?;
                    // Run as root, the server's commands run as an unprivileged user: the
                    // folder is theirs.
                    monad_sandbox::exec::give_to_command_user(&root, &exec)?;
                    let mut sandbox = Sandbox::open(&root, limits, exec)?;
                    if let Some(budgets) = &connections {
                        sandbox = sandbox.with_connection_budget(budgets, &owner);
                    }
                    Ok::<_, std::io::Error>(match groups {
                        Some((groups, owner)) => sandbox.in_process_group(groups, &owner),
                        None => sandbox,
                    })
                })
                .await
                .map_err(internal)?
                .map(Arc::new)
                .map_err(internal)
            })
            .await
            .cloned()
    }

    /// Whether the sandbox is open (it holds the root's directory open).
    pub fn is_open(&self) -> bool {
        self.sandbox.initialized()
    }
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
    /// The primary workspace (`sessions/<id>/workspace`, trust full), opened on first use.
    pub primary: Arc<PrimaryWorkspace>,
    /// The session's settings (global < session file < environment).
    pub settings: Settings,
    meta: Mutex<SessionMeta>,
    activity: Mutex<Activity>,
    attached: Mutex<Vec<Attached>>,
    changes: tokio::sync::watch::Sender<u64>,
    /// Background processes started in this session, the most recent last (bounded: the
    /// oldest go first).
    processes: Mutex<Vec<Started>>,
    /// The short name of the focus workspace: the one calls without `workspace` try first
    /// ([`Session::set_focus`]); it stays while the workspace is offline, follows it when it is
    /// renamed, and ends when it is detached by name ([`Session::forget`]). Watched by the
    /// attach streams of its folders, whose owners are told when it moves to or from theirs.
    focus: tokio::sync::watch::Sender<Option<String>>,
    /// The folders MCP hosts landed on and work in now, as (device, absolute path): one entry
    /// per host's connection, for as long as its [`HostHold`] lives.
    hosts: Mutex<Vec<(DeviceId, String)>>,
    /// Saves the metadata when the folders or the focus change ([`Session::keep`]).
    recorder: Option<crate::recorder::Recorder>,
    /// Several hosts: the lease epoch at which this copy was last read from the store
    /// ([`Registry::refresh`]); a lease taken at another epoch means another host may have
    /// changed the session since. Held while it is read again, so that calls after a take wait
    /// for the fresh copy.
    read_at_epoch: tokio::sync::Mutex<Option<i64>>,
}

/// An MCP host working in a session on the folder it landed on ([`Session::hold_for_host`]),
/// held by its connection: while it lives, another host's landing does not move the session's
/// focus away from that folder (`docs/mcp.md`, "Roots"). Dropped when the connection ends or the
/// host lands again.
#[derive(Debug)]
pub struct HostHold {
    session: Arc<Session>,
    device: DeviceId,
    folder: String,
}

impl Drop for HostHold {
    fn drop(&mut self) {
        let mut hosts = self.session.hosts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = hosts
            .iter()
            .position(|(d, f)| d == &self.device && f == &self.folder)
        {
            hosts.swap_remove(at);
        }
    }
}

/// Background processes a session remembers the workspace of (far more than a workspace may
/// keep at once).
const MAX_REMEMBERED_PROCESSES: usize = 1024;

/// Whether `id` is a process id as sandboxes make them (`proc-` and eight hexadecimal digits).
fn is_process_id(id: &str) -> bool {
    id.strip_prefix("proc-")
        .is_some_and(|hex| hex.len() == 8 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Attached folders one session keeps listing when some are offline: past it, a new one takes
/// the place of the oldest offline one.
pub const MAX_FOLDERS: usize = 64;

/// A background process a session started: where it runs, so that the agent need not say.
#[derive(Debug)]
struct Started {
    id: String,
    workspace: String,
    /// A read told its end: its workspace may still show its last lines (`process_read` with
    /// `last_lines`), but has nothing of it to list.
    ended: bool,
}

#[derive(Debug)]
struct Activity {
    last_used: Instant,
    last_saved: Instant,
    /// The in-memory `last_active` is newer than the one on disk.
    dirty: bool,
}

/// What routing and listing see of a workspace at one moment.
#[derive(Debug, Clone)]
pub enum Target {
    /// The session's own folder on the server.
    Primary(Arc<PrimaryWorkspace>),
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
    /// Its workspace record (attached folders).
    pub record: Option<String>,
}

impl Session {
    /// The URI of the primary workspace.
    pub fn primary_uri(&self) -> String {
        format!("server:/sessions/{}", self.id)
    }

    /// Whether the connections workspace `name`'s commands ask the network proxy for reach the
    /// audit log as they happen (the primary workspace's, and an online folder's whose client
    /// reports them) rather than with the results that carry them.
    pub fn reports_network(&self, name: &str) -> bool {
        self.workspaces()
            .into_iter()
            .find(|w| w.info.name == name)
            .is_some_and(|w| match w.target {
                Target::Primary(_) => true,
                Target::Attached(link) => link.as_ref().is_some_and(ClientLink::reports_network),
            })
    }

    /// Every workspace, primary first, then attached in attach order.
    pub fn workspaces(&self) -> Vec<Snapshot> {
        let mut out = vec![Snapshot {
            info: primary_info(&self.id, Some(self.primary.network())),
            target: Target::Primary(self.primary.clone()),
            record: None,
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
                network: a.network.clone(),
            },
            target: Target::Attached(a.link.clone()),
            record: a.record.clone(),
        }));
        out
    }

    /// The session as listed to its owner.
    pub fn info(&self) -> SessionInfo {
        SessionInfo {
            id: self.id.clone(),
            owner: self.owner.clone(),
            created_at: self.created_at.clone(),
            last_active: self.meta().last_active,
            name: self.meta().name,
            workspaces: self.workspaces().into_iter().map(|s| s.info).collect(),
        }
    }

    /// The current metadata (with the in-memory `last_active`).
    pub fn meta(&self) -> SessionMeta {
        self.meta.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Notes activity now. Returns the metadata to save when it is due (at most once a
    /// minute), so the caller writes it off the hot path.
    pub fn touch(&self) -> Option<SessionMeta> {
        let now = Instant::now();
        let mut activity = self.activity.lock().unwrap_or_else(|p| p.into_inner());
        activity.last_used = now;
        let mut meta = self.meta.lock().unwrap_or_else(|p| p.into_inner());
        meta.last_active = now_rfc3339();
        if now.duration_since(activity.last_saved) >= META_SAVE_INTERVAL {
            activity.last_saved = now;
            activity.dirty = false;
            Some(meta.clone())
        } else {
            activity.dirty = true;
            None
        }
    }

    /// The lease epoch this copy was last read from the store at ([`Session::read_at_epoch`]),
    /// locked: see [`crate::state::State::route`].
    pub(crate) async fn read_at_epoch(&self) -> tokio::sync::MutexGuard<'_, Option<i64>> {
        self.read_at_epoch.lock().await
    }

    /// Takes `stored`, the session's record read again once this host took its lease (several
    /// hosts on one store): what the host that held it changed meanwhile (the name, the model,
    /// the folder and focus it kept) replaces this host's older copy, which would otherwise be
    /// worked on and saved over it. Folders online here (none, unless one attached in a race)
    /// keep the session's folders and focus as they are; the later of the two activities stays.
    pub fn refresh(&self, stored: SessionMeta) {
        let mut meta = self.meta.lock().unwrap_or_else(|p| p.into_inner());
        let mut attached = self.attached.lock().unwrap_or_else(|p| p.into_inner());
        let (folders, focus) = if attached.iter().any(|a| a.link.is_some()) {
            (meta.folders.clone(), meta.focus.clone())
        } else {
            let (kept, focus) = kept_folders(&stored);
            *attached = kept;
            self.focus.send_if_modified(|now| {
                let moved = *now != focus;
                now.clone_from(&focus);
                moved
            });
            (stored.folders.clone(), stored.focus.clone())
        };
        drop(attached);
        let last_active = std::cmp::max(&meta.last_active, &stored.last_active).clone();
        *meta = SessionMeta {
            last_active,
            folders,
            focus,
            ..stored
        };
        drop(meta);
        self.changes.send_modify(|n| *n += 1);
    }

    /// The metadata to save when memory holds activity the disk does not; `None` when the disk
    /// is up to date. Either way the session counts as saved afterwards.
    fn unsaved(&self) -> Option<SessionMeta> {
        let mut activity = self.activity.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut activity.dirty).then(|| self.meta())
    }

    /// Records who the model is, when an agent host says.
    pub fn set_model(&self, provider: Option<String>, model: Option<String>) -> SessionMeta {
        let mut meta = self.meta.lock().unwrap_or_else(|p| p.into_inner());
        if provider.is_some() {
            meta.provider = provider;
        }
        if model.is_some() {
            meta.model = model;
        }
        meta.clone()
    }

    /// Gives the session a human name (`sessions --new --name`); returns the metadata to save.
    pub fn set_name(&self, name: String) -> SessionMeta {
        let mut meta = self.meta.lock().unwrap_or_else(|p| p.into_inner());
        meta.name = Some(name);
        meta.clone()
    }

    /// How long since the session was last used.
    pub fn idle(&self) -> Duration {
        self.activity
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last_used
            .elapsed()
    }

    /// Whether something still depends on this session object, so that it must stay in memory
    /// (dropping it would split the session in two at its next load): a request or task holding
    /// it (any reference besides the registry's own, on which this is called), a folder
    /// attached and online, a watcher (an MCP host, `watch`) waiting for its changes, or a
    /// background process of the primary workspace, still running or exited with output not
    /// read yet (unloading would kill the one and lose the other's output).
    /// The one predicate for unloading idle sessions and for evicting one to make room.
    pub fn in_use(self: &Arc<Self>) -> bool {
        self.kept_by().is_some()
    }

    /// What keeps this session in memory ([`Session::in_use`]), in words, if anything.
    pub fn kept_by(self: &Arc<Self>) -> Option<&'static str> {
        if self.has_online_attachments() {
            Some("a folder is attached to it")
        } else if Arc::strong_count(self) > 1 {
            Some("a call, a conversation or another request is using it")
        } else if self.changes.receiver_count() > 0 {
            Some("an agent follows its workspaces (an MCP host, `watch`)")
        } else if self.primary.has_processes() {
            Some("a background command of its primary workspace runs, or has output not read yet")
        } else {
            None
        }
    }

    /// When the session was last used.
    fn last_used(&self) -> Instant {
        self.activity
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last_used
    }

    /// Whether a client folder is attached and online.
    pub fn has_online_attachments(&self) -> bool {
        self.attached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|a| a.link.is_some())
    }

    /// The connections of the folders attached to this session and online now.
    pub fn online_links(&self) -> Vec<ClientLink> {
        self.attached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(|a| a.link.clone())
            .collect()
    }

    /// The folders `device` attached to this session that are online now.
    pub fn online_folders(&self, device: &DeviceId) -> Vec<Attached> {
        self.attached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|a| a.link.is_some() && &a.device_id == device)
            .cloned()
            .collect()
    }

    /// Whether this session's settings refuse a folder attached with `trust`: one with full
    /// trust where `attach.allow_full_trust = false`. Such a folder is neither attached here
    /// nor shared in, and a host is not landed here for it.
    pub fn refuses(&self, trust: Trust) -> bool {
        trust == Trust::Full && !self.settings.attach.allow_full_trust
    }

    /// Whether a host landing from `device` on `folder` (an absolute path there) must leave the
    /// focus where it is: the focus is a folder another device attached, online (that device's
    /// agents work in it), or another folder an MCP host landed on and works in now
    /// ([`HostHold`]). Moving the focus under either would send their calls that name no
    /// workspace, writes included, into this folder. `mine` is the landing host's own hold from
    /// its landing before, which holds nothing against it.
    pub fn focus_held_against(
        &self,
        device: &DeviceId,
        folder: &str,
        mine: Option<&HostHold>,
    ) -> bool {
        let Some(focus) = self.focus() else {
            return false;
        };
        let attached = self.attached.lock().unwrap_or_else(|p| p.into_inner());
        let Some(held) = attached.iter().find(|a| a.name == focus) else {
            return false;
        };
        if held.link.is_some() && &held.device_id != device {
            return true;
        }
        let Some(path) = held.folder.as_deref() else {
            return false;
        };
        if &held.device_id == device && path == folder {
            return false;
        }
        let holding = self
            .hosts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(d, f)| d == &held.device_id && f == path)
            .count();
        // The landing host's own hold (from its landing before) holds nothing against it.
        let own = mine.is_some_and(|mine| {
            std::ptr::eq(Arc::as_ptr(&mine.session), self)
                && mine.device == held.device_id
                && mine.folder == path
        });
        holding > usize::from(own)
    }

    /// Notes an MCP host working on `folder` of `device`, when that folder is the session's
    /// focus, until the returned hold is dropped; `None` when it is not the focus.
    pub fn hold_for_host(self: &Arc<Self>, device: &DeviceId, folder: &str) -> Option<HostHold> {
        let focus = self.focus()?;
        let is_focus = self
            .attached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|a| {
                a.name == focus && &a.device_id == device && a.folder.as_deref() == Some(folder)
            });
        if !is_focus {
            return None;
        }
        self.hosts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((device.clone(), folder.to_owned()));
        Some(HostHold {
            session: self.clone(),
            device: device.clone(),
            folder: folder.to_owned(),
        })
    }

    /// The workspace record of an attached folder, by short name.
    pub fn record_of(&self, name: &str) -> Option<String> {
        self.attached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|a| a.name == name)
            .and_then(|a| a.record.clone())
    }

    /// Attaches a folder (or re-attaches it after a reconnect: same device and path get their
    /// old name back). Returns the workspace as listed.
    pub fn attach(&self, folder: Attached, wanted: Option<&str>) -> WorkspaceInfo {
        let joining = Joining::Own {
            exact: false,
            quiet: None,
        };
        match self.attach_as(folder, wanted, joining) {
            Ok(Some(info)) => info,
            _ => unreachable!(
                "an attach of its own is always listed, and only an exact name is refused"
            ),
        }
    }

    /// Lists `folder`, a live attachment of another session's, here too, over its link, as
    /// `joining` says ([`Registry::share`], [`Registry::share_again`]). `None` when it is left
    /// out: a share never replaces a link that serves on (it would stop that attachment), and
    /// a share back never takes an entry its owner detached by name.
    pub(crate) fn attach_shared(
        &self,
        folder: Attached,
        joining: Joining,
    ) -> Option<WorkspaceInfo> {
        let wanted = folder.name.clone();
        self.attach_as(folder, Some(&wanted), joining)
            .ok()
            .flatten()
    }

    /// The generation of the link the session carries the first folder `which` picks over:
    /// `None` when it lists none, `Some(None)` while that one is offline.
    fn listed_link(&self, which: impl Fn(&Attached) -> bool) -> Option<Option<u64>> {
        self.attached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|a| which(a))
            .map(|a| a.link.as_ref().map(|l| l.generation))
    }

    /// The generation of the link the session carries the folder at `path` on `device` over:
    /// `None` when it does not list it or lists it offline.
    fn carried(&self, device: &DeviceId, path: &str) -> Option<u64> {
        self.listed_link(|a| a.device_id == *device && a.path == path)
            .flatten()
    }

    /// A folder's own attach ([`Session::attach`], or [`Session::attach_exact`] when `exact`),
    /// where `quiet` is the link of another session's attachment that a share left here: let
    /// go of without telling that attachment it was taken over (it serves its own session on)
    /// ([`Registry::attach_own`]).
    pub(crate) fn attach_own(
        &self,
        folder: Attached,
        wanted: Option<&str>,
        exact: bool,
        quiet: Option<u64>,
    ) -> Result<WorkspaceInfo, ToolError> {
        let listed = self.attach_as(folder, wanted, Joining::Own { exact, quiet })?;
        listed.ok_or_else(|| {
            ToolError::new(ErrorCode::Internal, "an attach of its own was not listed")
        })
    }

    /// Like [`Session::attach`], but the folder gets exactly the name `wanted` (`attach
    /// --name`): refused, with nothing changed, when it is not a valid short name, is
    /// reserved (`primary`), or another folder of the session has it (online or not).
    pub fn attach_exact(&self, folder: Attached, wanted: &str) -> Result<WorkspaceInfo, ToolError> {
        self.attach_own(folder, Some(wanted), true, None)
    }

    /// Whether the folder at `path` on `device` could take exactly the name `wanted` now (as
    /// [`Session::attach_exact`] checks it, which decides): so that an attach refused for its
    /// name is refused before anything is kept for it (a workspace record).
    pub fn name_usable_for(
        &self,
        device: &DeviceId,
        path: &str,
        wanted: &str,
    ) -> Result<(), ToolError> {
        let attached = self.attached.lock().unwrap_or_else(|p| p.into_inner());
        name_usable(
            wanted,
            attached
                .iter()
                .filter(|a| !(a.device_id == *device && a.path == path)),
        )
    }

    /// Attaches `folder` as `joining` says; `Ok(None)` when a share leaves it out (see
    /// [`Session::attach_shared`]).
    fn attach_as(
        &self,
        mut folder: Attached,
        wanted: Option<&str>,
        joining: Joining,
    ) -> Result<Option<WorkspaceInfo>, ToolError> {
        let mut attached = self.attached.lock().unwrap_or_else(|p| p.into_inner());
        let same = |a: &Attached| a.device_id == folder.device_id && a.path == folder.path;
        let (exact, quiet) = match joining {
            Joining::Own { exact, quiet } => (exact, quiet),
            _ => (false, None),
        };
        if exact && let Some(wanted) = wanted {
            name_usable(wanted, attached.iter().filter(|a| !same(a)))?;
        }
        // Decided under the same lock as the change: a detach by name cannot come between.
        let carried = |a: &Attached| a.link.as_ref().map(|l| l.generation);
        let left_out = match (joining, attached.iter().find(|a| same(a))) {
            (Joining::Own { .. }, _) => false,
            (Joining::Shared { again, over }, existing) => match existing {
                None => again,
                Some(e) => carried(e).is_some_and(|now| Some(now) != over),
            },
        };
        if left_out {
            return Ok(None);
        }
        let info = if let Some(existing) = attached.iter_mut().find(|a| same(a)) {
            // Another live attach of the same folder (not a reconnect of the same connection):
            // it is taken over, and told, so that it stops instead of showing a banner for a
            // folder it no longer serves.
            if let (Some(old), Some(new)) = (&existing.link, &folder.link)
                && old.conn.stable_id() != new.conn.stable_id()
                && quiet != Some(old.generation)
            {
                let _ = old.kick.send(TAKEN_OVER.to_owned());
            }
            if exact
                && let Some(wanted) = wanted
                && existing.name != wanted
            {
                // Renamed: the focus follows the folder, never the old name (which another
                // folder may take later).
                self.focus.send_if_modified(|focus| {
                    let renamed = focus.as_deref() == Some(existing.name.as_str());
                    if renamed {
                        *focus = Some(wanted.to_owned());
                    }
                    renamed
                });
                // Its background processes follow it too.
                self.processes_moved(&existing.name, Some(wanted));
                existing.name = wanted.to_owned();
            }
            existing.link = folder.link;
            existing.record = folder.record;
            existing.folder = folder.folder;
            existing.trust = folder.trust;
            existing.tools = folder.tools;
            existing.uri = folder.uri;
            // What its client says now (its policy may have changed, or its version).
            existing.network = folder.network;
            existing.clone()
        } else {
            // Past [`MAX_FOLDERS`], a new folder takes the place of the oldest offline one
            // that is not the focus (it comes back as new when it attaches again): each attach
            // of another path was kept, offline, without end. Folders online are bounded by
            // the user's connections.
            if attached.len() >= MAX_FOLDERS {
                let focus = self.focus.borrow().clone();
                if let Some(oldest) = attached
                    .iter()
                    .position(|a| a.link.is_none() && focus.as_deref() != Some(a.name.as_str()))
                {
                    let gone = attached.remove(oldest);
                    self.processes_moved(&gone.name, None);
                    tracing::debug!(
                        session = %self.id,
                        folder = %gone.name,
                        "an offline folder left the list for a new one"
                    );
                }
            }
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
        Ok(Some(WorkspaceInfo {
            name: info.name,
            uri: info.uri,
            trust: info.trust,
            host: Host::Client,
            online: true,
            tools: info.tools,
            network: info.network,
        }))
    }

    /// Detaches the folder named `name` (short name or URI) and forgets it: it is no longer
    /// listed, an online folder's `attach` is told why (`reason`) and stops, and it is not the
    /// focus any more. Returns it as it was; refused for the primary workspace and for a
    /// name the session does not have.
    pub fn forget(&self, name: &str, reason: &str) -> Result<Attached, ToolError> {
        self.forget_as(name, reason, None)
    }

    /// [`Session::forget`], where `quiet` is the link of another session's attachment that a
    /// share left here: its client is not told, since it serves its own session on
    /// ([`Registry::forget`]).
    pub(crate) fn forget_as(
        &self,
        name: &str,
        reason: &str,
        quiet: Option<u64>,
    ) -> Result<Attached, ToolError> {
        if name == "primary" || name == self.primary_uri() {
            return Err(ToolError::new(
                ErrorCode::InvalidArguments,
                "the primary workspace cannot be detached: it is the session's own folder",
            ));
        }
        let mut attached = self.attached.lock().unwrap_or_else(|p| p.into_inner());
        let Some(at) = attached
            .iter()
            .position(|a| a.name == name || a.uri == name)
        else {
            let names: Vec<String> = attached.iter().map(|a| a.name.clone()).collect();
            return Err(ToolError::new(
                ErrorCode::WorkspaceNotFound,
                if names.is_empty() {
                    format!(
                        "no folder `{name}` in session {}: none is attached",
                        self.id
                    )
                } else {
                    format!(
                        "no folder `{name}` in session {}; it has {}",
                        self.id,
                        names.join(", ")
                    )
                },
            ));
        };
        let gone = attached.remove(at);
        self.processes_moved(&gone.name, None);
        drop(attached);
        if let Some(link) = gone.link.as_ref().filter(|l| quiet != Some(l.generation)) {
            let _ = link.kick.send(reason.to_owned());
        }
        self.focus.send_if_modified(|focus| {
            let ended = focus.as_deref() == Some(gone.name.as_str());
            if ended {
                *focus = None;
            }
            ended
        });
        self.changed();
        Ok(gone)
    }

    /// Marks the folder attached under `generation` as disconnected. A newer attachment of the
    /// same folder (after a reconnect) is left alone. When it was the focus, it stays the focus,
    /// offline: meanwhile the calls without `workspace` it would take fail rather than run in
    /// another workspace ([`crate::route::focus_offline`]); it serves as the focus again when
    /// its client reconnects. Only a detach by name ([`Session::forget`]) ends the focus.
    pub fn detach(&self, generation: u64) {
        let mut attached = self.attached.lock().unwrap_or_else(|p| p.into_inner());
        let mut gone = false;
        for a in attached.iter_mut() {
            if a.link.as_ref().is_some_and(|l| l.generation == generation) {
                a.link = None;
                gone = true;
            }
        }
        drop(attached);
        if gone {
            self.changed();
        }
    }

    /// Makes workspace `name` (a short name or URI) the session's focus: calls that do not name
    /// a workspace try it first (see [`crate::route`]). It stays the focus until another is set,
    /// [`Session::clear_focus`], or it is detached by name ([`Session::forget`]); while its
    /// client is disconnected it is the focus, offline. Set by `monad-client attach --focus`; also the
    /// way for anything else that learns where the user works (an MCP host's roots). Refused
    /// for a workspace the session does not have, or an attached one that is offline.
    pub fn set_focus(&self, name: &str) -> Result<(), ToolError> {
        let Some(workspace) = self
            .workspaces()
            .into_iter()
            .find(|w| w.info.name == name || w.info.uri == name)
        else {
            return Err(ToolError::new(
                ErrorCode::WorkspaceNotFound,
                format!("no workspace `{name}` in this session to focus on"),
            ));
        };
        if !workspace.info.online {
            return Err(ToolError::new(
                ErrorCode::WorkspaceDisconnected,
                format!(
                    "workspace `{}` is disconnected; it can be the focus once its client \
                     reconnects",
                    workspace.info.name
                ),
            ));
        }
        let moved = self.focus.send_if_modified(|focus| {
            let moved = focus.as_deref() != Some(workspace.info.name.as_str());
            if moved {
                *focus = Some(workspace.info.name.clone());
            }
            moved
        });
        if moved {
            self.changed();
        }
        Ok(())
    }

    /// Ends the focus: calls without `workspace` go in priority order again.
    pub fn clear_focus(&self) {
        if self.focus.send_if_modified(|focus| focus.take().is_some()) {
            self.changed();
        }
    }

    /// The short name of the focus workspace, when the session has one.
    pub fn focus(&self) -> Option<String> {
        self.focus.borrow().clone()
    }

    /// The focus's short name as it moves ([`Session::focus`]), for an attach stream to tell its
    /// folder's owner when it moves to or from their folder.
    pub fn watch_focus(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.focus.subscribe()
    }

    /// The workspace that runs background process `id`, when this session started it.
    pub fn process_workspace(&self, id: &str) -> Option<String> {
        self.processes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|p| p.id == id)
            .map(|p| p.workspace.clone())
    }

    /// The workspaces that keep background processes this session started (running, or
    /// exited and not read to their end), each once, in the order of their oldest one.
    pub fn process_workspaces(&self) -> Vec<String> {
        let processes = self.processes.lock().unwrap_or_else(|p| p.into_inner());
        let mut names: Vec<String> = Vec::new();
        for process in processes.iter().filter(|p| !p.ended) {
            if !names.contains(&process.workspace) {
                names.push(process.workspace.clone());
            }
        }
        names
    }

    /// The background processes noted in workspace `from` are in `to` now (its folder was
    /// renamed), or in none (`None`: it left the session). Called while the folder list is
    /// locked, with the change: processes are found by workspace name, and a name left behind
    /// could be another folder's later, which would get the `process_write` text and the
    /// `process_kill` meant for a process of this one.
    fn processes_moved(&self, from: &str, to: Option<&str>) {
        let mut processes = self.processes.lock().unwrap_or_else(|p| p.into_inner());
        match to {
            Some(to) => processes
                .iter_mut()
                .filter(|p| p.workspace == from)
                .for_each(|p| p.workspace = to.to_owned()),
            None => processes.retain(|p| p.workspace != from),
        }
    }

    /// Notes what a call's result says about background processes: `run_command` started one
    /// (its `process`) in `workspace`; `process_read` read one to its end (`running: false`),
    /// which is still remembered, for its last lines.
    pub fn note_process(
        &self,
        tool: ToolName,
        result: &monad_protocol::wire::ToolResult,
        workspace: &str,
        uri: &str,
        record: Option<&str>,
    ) {
        // Only these two tools' results say anything about processes: no other result is
        // looked into (a relayed one would be parsed for it).
        if !matches!(tool, ToolName::RunCommand | ToolName::ProcessRead) {
            return;
        }
        /// What a result says of a process: read from its text alone, not as a tree of all of
        /// it (a client's answer could make one many times its size).
        #[derive(serde::Deserialize)]
        struct Said {
            process: Option<String>,
            running: Option<bool>,
        }
        let Ok(said) = result.decode::<Said>() else {
            return;
        };
        let Some(id) = said.process.as_deref() else {
            return;
        };
        // An id as sandboxes make them. A client's answer is not trusted to name a process of
        // another workspace (taking its `process_write` text and answering for it), nor to keep
        // ids of any length here.
        if !is_process_id(id) {
            tracing::warn!(
                session = %self.id,
                workspace,
                "a result named a process id that no sandbox makes; not kept"
            );
            return;
        }
        // The folder that ran the call, found by its URI and its workspace record (one device's
        // folder: two machines may share a host name) with the list locked, under the name it
        // has now, as a rename or a detach moves the processes noted (`processes_moved`): one
        // renamed while the call ran keeps its process, one detached (its name maybe another
        // folder's since) does not get it.
        let attached = self.attached.lock().unwrap_or_else(|p| p.into_inner());
        // The primary by its name too: an attached folder's URI is made of what its client
        // says, which could read like the primary's.
        let now = if workspace == "primary" && uri == self.primary_uri() {
            Some("primary".to_owned())
        } else {
            attached
                .iter()
                .find(|a| a.uri == uri && a.record.as_deref() == record)
                .map(|a| a.name.clone())
        };
        let Some(workspace) = now else {
            tracing::debug!(
                session = %self.id,
                workspace,
                process = id,
                "the folder that started the process left the session meanwhile; not kept"
            );
            return;
        };
        let workspace = workspace.as_str();
        let mut processes = self.processes.lock().unwrap_or_else(|p| p.into_inner());
        drop(attached);
        if processes
            .iter()
            .any(|p| p.id == id && p.workspace != workspace)
        {
            tracing::warn!(
                session = %self.id,
                workspace,
                process = id,
                "a result named another workspace's process; not taken over"
            );
            return;
        }
        match tool {
            ToolName::RunCommand => {
                processes.retain(|p| p.id != id);
                processes.push(Started {
                    id: id.to_owned(),
                    workspace: workspace.to_owned(),
                    ended: false,
                });
                // The oldest ended one goes first: a process still kept (a dev server started
                // long ago) keeps being found by its id alone.
                if processes.len() > MAX_REMEMBERED_PROCESSES {
                    let oldest = processes.iter().position(|p| p.ended).unwrap_or(0);
                    processes.remove(oldest);
                }
            }
            ToolName::ProcessRead if said.running == Some(false) => {
                if let Some(process) = processes.iter_mut().find(|p| p.id == id) {
                    process.ended = true;
                }
            }
            _ => {}
        }
    }

    /// A receiver that ticks whenever the workspace list changes.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn changed(&self) {
        self.keep();
        self.changes.send_modify(|n| *n += 1);
    }

    /// Keeps the focus, and the folder it is when it is an attached one, in the metadata
    /// ([`SessionMeta::folders`]), saved in the background by the recorder when they changed: a
    /// focus folder offline when the server stops, or when the session leaves memory, is the
    /// session's focus again, offline, when it is loaded (calls without `workspace` it would take
    /// fail meanwhile rather than run elsewhere). Other folders are not kept: an offline folder
    /// holds back every new file written without `workspace` (it may be there), and one kept for
    /// good would hold them back until detached by name. The metadata's lock is taken first, so
    /// that two changes at once save the later state, never the earlier.
    fn keep(&self) {
        let mut meta = self.meta.lock().unwrap_or_else(|p| p.into_inner());
        let focus = self.focus();
        let folders: Vec<KeptFolder> = self
            .attached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|a| focus.as_deref() == Some(a.name.as_str()))
            .map(Attached::kept)
            .collect();
        if meta.folders == folders && meta.focus == focus {
            return;
        }
        meta.folders = folders;
        meta.focus = focus;
        if let Some(recorder) = &self.recorder {
            recorder.save_meta(meta.clone());
        }
    }
}

/// The folders a session kept ([`Session::keep`]), offline, and its focus when it is one of
/// them (or the primary workspace). A folder whose device id cannot be read is left out, and
/// a tool a later version added.
fn kept_folders(meta: &SessionMeta) -> (Vec<Attached>, Option<String>) {
    let folders: Vec<Attached> = meta.folders.iter().filter_map(Attached::offline).collect();
    let focus = meta
        .focus
        .clone()
        .filter(|f| f == "primary" || folders.iter().any(|a| &a.name == f));
    (folders, focus)
}

/// A short workspace name from a folder name: no slashes, no control, format or invisible
/// characters ([`monad_protocol::text::is_hidden`]: bidi controls, zero-width characters,
/// variation selectors, tags, ...; they are dropped), at most 64 characters, never empty.
/// Whether `wanted` can be a folder's short name exactly as given, beside the `others`.
fn name_usable<'a>(
    wanted: &str,
    mut others: impl Iterator<Item = &'a Attached>,
) -> Result<(), ToolError> {
    let invalid = |why: String| Err(ToolError::new(ErrorCode::InvalidArguments, why));
    if wanted == "primary" {
        return invalid(
            "`primary` is reserved for the session's own workspace: choose another --name".into(),
        );
    }
    if sanitize_name(wanted) != wanted {
        return invalid(format!(
            "`{}` cannot be a short name: at most 64 characters, no `/`, `\\`, `:`, control or \
             invisible characters, no leading or trailing dots or spaces",
            monad_protocol::text::printable(wanted)
        ));
    }
    if let Some(other) = others.find(|a| a.name == wanted) {
        return Err(ToolError::new(
            ErrorCode::AlreadyExists,
            format!(
                "the name `{wanted}` is taken in this session by {} ({}): choose another \
                 --name, or forget that folder with `monad-client detach {wanted}`",
                other.uri,
                if other.link.is_some() {
                    "online"
                } else {
                    "offline"
                }
            ),
        ));
    }
    Ok(())
}

fn sanitize_name(raw: &str) -> String {
    let name: String = raw
        .chars()
        .filter(|&c| {
            !c.is_control() && !monad_protocol::text::is_hidden(c) && !matches!(c, '/' | '\\' | ':')
        })
        .take(64)
        .collect();
    let name = name.trim().trim_matches('.').to_owned();
    if name.is_empty() {
        "folder".to_owned()
    } else {
        name
    }
}

/// How a folder comes to be listed in a session ([`Session::attach_as`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Joining {
    /// By an attach of its own, under exactly the name it asked for when `exact`.
    Own {
        /// `attach --name`: that name or nothing.
        exact: bool,
        /// A link of another session's attachment that a share left here, replaced without
        /// telling that attachment (it serves its own session on).
        quiet: Option<u64>,
    },
    /// Shared from a live attachment in another session: into an entry offline, or carrying
    /// the link `over` (one that ended, or was taken over, or this very link), never over a
    /// link that serves on; with `again`, only into an entry the session lists already.
    Shared {
        /// A share back after the folder attached again ([`Registry::share_again`]).
        again: bool,
        /// The one link the share may replace.
        over: Option<u64>,
    },
}

/// A live attachment's link, as [`Registry::share`] needs it.
#[derive(Debug)]
struct Link {
    /// Its folder.
    folder: FolderKey,
    /// The session it attached into.
    home: String,
    /// The folder as attached, with this link: what is shared back over it.
    attached: Attached,
    /// Where the focus moves of the sessions it is shared into go: to the attachment's own
    /// task.
    moves: mpsc::Sender<SharedFocus>,
}

/// A folder as its attachments know it, whichever connection carries it: its owner, the
/// device it is on and its path there.
type FolderKey = (String, DeviceId, String);

/// The sessions a folder serves besides the one it attaches into, remembered across its
/// attachments ([`Registry::share`]).
#[derive(Debug, Default)]
struct Links {
    /// Live attachments by generation.
    live: HashMap<u64, Link>,
    /// Per folder, the other sessions it was shared into.
    shared: HashMap<FolderKey, Vec<std::sync::Weak<Session>>>,
}

/// A folder, and the sessions it was shared into, each with the link a share back may replace
/// there ([`Registry::shared_into`]).
type SharedInto = (FolderKey, Vec<(Arc<Session>, Option<u64>)>);

/// Folders whose shares are remembered at most; past it, those with no session left in memory
/// go first.
const SHARED_FOLDERS_MAX: usize = 4096;

/// The focus of a session an attachment was shared into, as it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedFocus {
    /// The session.
    pub session: String,
    /// The attachment's folder's short name there.
    pub name: String,
    /// The session's focus now (its short name), if any.
    pub now: Option<String>,
}

/// All sessions: loaded from the store on first use, dropped from memory when idle.
pub struct Registry {
    store: Arc<dyn Store>,
    layers: Layers,
    sessions_dir: PathBuf,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// Sessions of one user in memory at most.
    max_in_memory: usize,
    /// Sessions one user may have stored.
    max_stored: usize,
    /// Per user, creations under way: counted with the stored sessions, so that racing
    /// creations cannot pass the bound together (an entry goes when its last creation ends).
    creating: Mutex<HashMap<String, usize>>,
    /// Live attachments by generation, and the other sessions each folder was shared into
    /// ([`Registry::share`]): an attachment's detach takes it offline in all of them, and the
    /// folder's next attachment brings it back there ([`Registry::share_again`]).
    links: Mutex<Links>,
    /// Per user and device, the session it was last bound to here and when: a request naming
    /// that session again is answered from memory ([`Registry::resolve_in_memory`]). The weak
    /// reference is to the session as loaded then: one reloaded or re-created is bound afresh.
    recent_binds: Mutex<HashMap<(String, String), RecentBind>>,
    /// The most entries of `recent_binds` ([`RECENT_BINDS_MAX`]; fewer in tests).
    recent_binds_max: usize,
    /// Sessions being deleted: an open that read one from the store before its rows went
    /// must not put it in memory (it would write the deleted session back).
    deleting: Mutex<std::collections::HashSet<String>>,
    /// Sessions dropped from memory (idle, or to make room) whose leaving is not done yet.
    leaving: Leaving,
    /// Several hosts on one store: a session that leaves memory gives up its lease.
    cluster: Option<Arc<crate::cluster::Cluster>>,
    /// Held across a read-modify-write of a user's entries in the MCP roots registry
    /// ([`crate::landing`]): two landings, or a landing and `sessions --new`, would otherwise
    /// each save the entry as they read it, and one's sessions would be lost. One per user (the
    /// entries are each one user's): a lock of every user's held each landing and attach up
    /// behind another user's store reads and writes.
    folders: crate::quota::UserLocks<Mutex<()>>,
    /// The recorder of the sessions' calls, flushed before a session's rows go: a call's
    /// records (its metadata's last use among them) written after the delete would put the
    /// session back.
    recorder: Option<crate::recorder::Recorder>,
    /// The process groups that bound each user's commands together, when the server has them.
    groups: Option<Arc<ProcessGroups>>,
    /// The budgets that bound each user's proxy connections together.
    connections: Option<Arc<ConnectionBudgets>>,
}

/// A session a device was bound to here, as loaded then, and when.
type RecentBind = (std::sync::Weak<Session>, Instant);

/// Sessions dropped from memory whose leaving is not done yet: their activity is being saved
/// and their lease given up ([`Registry::let_go`]), after the registry's lock was released (both
/// are a store's write, which other requests must not wait on). An open of one waits until it
/// is done: loaded before, it would miss the activity being saved, and a call would be routed
/// here on the lease about to be given up, so that another host could take the session while
/// the call ran here.
#[derive(Default)]
struct Leaving {
    ids: Mutex<std::collections::HashSet<String>>,
    left: std::sync::Condvar,
}

/// How long an open waits for a session's leaving (a store's write or two, each bounded by
/// the store's own time-out).
const LEAVING_WAIT: Duration = Duration::from_secs(120);

impl Leaving {
    /// Marks `id` as leaving; under the registry's lock, as it leaves the map.
    fn start(&self, id: &str) {
        self.ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_owned());
    }

    /// `id` has left: the opens waiting for it go on.
    fn done(&self, id: &str) {
        self.ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        self.left.notify_all();
    }

    fn contains(&self, id: &str) -> bool {
        self.ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(id)
    }

    /// Waits until `id` is not leaving, at most `limit`: false when it still is.
    fn wait(&self, id: &str, limit: Duration) -> bool {
        let ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
        let (ids, _) = self
            .left
            .wait_timeout_while(ids, limit, |ids| ids.contains(id))
            .unwrap_or_else(|p| p.into_inner());
        !ids.contains(id)
    }
}

/// How long a binding made here is taken as current without asking the store again (the
/// store keeps a binding's last use to the day: sooner than that is enough).
const RECENT_BIND: Duration = Duration::from_secs(60 * 60);

/// Bindings remembered at most (past it the memory starts over: each is one store lookup away).
const RECENT_BINDS_MAX: usize = 65_536;

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("sessions_dir", &self.sessions_dir)
            .finish_non_exhaustive()
    }
}

impl Registry {
    /// Sessions kept in `store`, with primary workspaces under `<data_dir>/sessions/<id>/workspace`
    /// and settings from `layers`.
    pub fn new(data_dir: &Path, store: Arc<dyn Store>, layers: Layers) -> Registry {
        Registry {
            store,
            layers,
            sessions_dir: data_dir.join("sessions"),
            sessions: Mutex::new(HashMap::new()),
            max_in_memory: usize::MAX,
            max_stored: usize::MAX,
            creating: Mutex::new(HashMap::new()),
            links: Mutex::new(Links::default()),
            recent_binds: Mutex::new(HashMap::new()),
            recent_binds_max: RECENT_BINDS_MAX,
            deleting: Mutex::new(std::collections::HashSet::new()),
            leaving: Leaving::default(),
            cluster: None,
            recorder: None,
            folders: crate::quota::UserLocks::new(),
            groups: None,
            connections: None,
        }
    }

    /// Bounds each user's commands together in `groups` (`server.max_processes_per_user`,
    /// `server.max_memory_per_user`).
    pub fn with_process_groups(mut self, groups: Option<Arc<ProcessGroups>>) -> Registry {
        self.groups = groups;
        self
    }

    /// Bounds each user's commands' connections through their workspaces' network proxies
    /// together (`server.max_proxy_connections_per_user`).
    pub fn with_connection_budgets(mut self, budgets: Option<Arc<ConnectionBudgets>>) -> Registry {
        self.connections = budgets;
        self
    }

    /// The lock held while `user`'s entries in the MCP roots registry are read, changed and
    /// saved ([`crate::landing`], which runs on the blocking pool: it waits there).
    pub(crate) fn folders_of(&self, user: &str) -> Arc<Mutex<()>> {
        self.folders.of(user)
    }

    /// Flushes `recorder` before a session is deleted ([`Registry::delete`]).
    pub fn with_recorder(mut self, recorder: crate::recorder::Recorder) -> Registry {
        self.recorder = Some(recorder);
        self
    }

    /// Gives up a session's lease when it leaves memory (several hosts on one store).
    pub fn with_cluster(mut self, cluster: Option<Arc<crate::cluster::Cluster>>) -> Registry {
        self.cluster = cluster;
        self
    }

    /// Notes a new live attachment, `folder` with its link, of `user`, into session `home`,
    /// so that it can be shared into other sessions until it detaches
    /// ([`Registry::detach_everywhere`]). Returns where the focus of each session it is shared
    /// into is told, from the share on.
    pub fn link_attached(
        &self,
        user: &str,
        home: &str,
        folder: &Attached,
    ) -> mpsc::Receiver<SharedFocus> {
        // One at a time: a forwarder whose move waits sends the latest focus after it, so
        // that a client that does not read its stream holds one move per session, not all.
        let (moves, told) = mpsc::channel(1);
        if let Some(generation) = folder.link.as_ref().map(|l| l.generation) {
            let key = (
                user.to_owned(),
                folder.device_id.clone(),
                folder.path.clone(),
            );
            let link = Link {
                folder: key,
                home: home.to_owned(),
                attached: folder.clone(),
                moves,
            };
            self.links
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .live
                .insert(generation, link);
        }
        told
    }

    /// A folder's own attach into `session` ([`Session::attach`], or
    /// [`Session::attach_exact`] when `exact`). A link of another session's attachment that a
    /// share left there (the session listed the folder offline then) is replaced without
    /// telling that attachment it was taken over, which would stop it; decided while no share
    /// can come between (shares hold the same lock).
    pub fn attach_own(
        &self,
        session: &Session,
        folder: Attached,
        wanted: Option<&str>,
        exact: bool,
    ) -> Result<WorkspaceInfo, ToolError> {
        let links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        let quiet = session
            .carried(&folder.device_id, &folder.path)
            .filter(|g| {
                links
                    .live
                    .get(g)
                    .is_some_and(|link| link.home != session.id)
            });
        session.attach_own(folder, wanted, exact, quiet)
    }

    /// Detaches the folder `name` from `session` by name ([`Session::forget`]). One the session
    /// has over another session's attachment (shared in) is let go of without stopping that
    /// attachment, which serves its own session on.
    pub fn forget(
        &self,
        session: &Session,
        name: &str,
        reason: &str,
    ) -> Result<Attached, ToolError> {
        let links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        let by_name = session.listed_link(|a| a.name == name || a.uri == name);
        let quiet = by_name.flatten().filter(|g| {
            links
                .live
                .get(g)
                .is_some_and(|link| link.home != session.id)
        });
        session.forget_as(name, reason, quiet)
    }

    /// Shares a folder just attached into `home` ([`Registry::attach_own`]; `folder` with its
    /// live link) back into every session it was shared into before and that lists it offline,
    /// or over the link of `home`'s this attach took over there: an MCP host that landed on it
    /// there finds it again after the folder's connection dropped and came back, or after
    /// `attach` was run again. One still served by another attachment of the folder gets a
    /// live link when that one ends ([`Registry::detach_everywhere`]). A session whose owner
    /// detached the folder by name is left alone, and forgotten here.
    pub fn share_again(&self, folder: &Attached, home: &Session) {
        let Some(generation) = folder.link.as_ref().map(|l| l.generation) else {
            return;
        };
        let Some((key, before)) = self.shared_into(generation, home) else {
            return;
        };
        for (session, over) in &before {
            self.share_as(folder, session, true, *over);
        }
        self.forget_detached(&key);
    }

    /// The folder of the live link of `generation`, which attached into `home`, and the other
    /// sessions it was shared into that are still in memory, each with the link it carries the
    /// folder over when that is another link of `home`'s, which this attach took over there.
    fn shared_into(&self, generation: u64, home: &Session) -> Option<SharedInto> {
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        let Links { live, shared } = &mut *links;
        let key = live.get(&generation)?.folder.clone();
        let (_, device, path) = &key;
        // Only while this attach is the one its session carries: one taken over meanwhile by
        // another attach of the folder there must not take that one's shares over in turn.
        if home.carried(device, path) != Some(generation) {
            return None;
        }
        let sessions = shared.get_mut(&key)?;
        sessions.retain(|s| s.strong_count() > 0);
        let others = sessions
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .filter(|s| s.id != home.id)
            .map(|s| {
                let over = s
                    .carried(device, path)
                    .filter(|g| *g != generation && live.get(g).is_some_and(|l| l.home == home.id));
                (s, over)
            })
            .collect();
        Some((key, others))
    }

    /// Forgets, for the folder of `key`, the sessions that no longer list it (their owner
    /// detached it by name) or left memory.
    fn forget_detached(&self, key: &FolderKey) {
        let (_, device, path) = key;
        let lists = |s: &Session| {
            s.listed_link(|a| a.device_id == *device && a.path == *path)
                .is_some()
        };
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(sessions) = links.shared.get_mut(key) {
            sessions.retain(|s| s.upgrade().is_some_and(|s| lists(&s)));
            if sessions.is_empty() {
                links.shared.remove(key);
            }
        }
    }

    /// Attaches a live folder of one session to `into` as well, over the same link, so that
    /// calls in either reach it (an MCP host landing in the folder's session, `sessions --new`
    /// in the folder). Its short name is kept when free in `into`. `None` when the attachment
    /// has no link or already detached: a folder is never shown online where calls cannot
    /// reach it.
    pub fn share(&self, folder: &Attached, into: &Arc<Session>) -> Option<WorkspaceInfo> {
        self.share_as(folder, into, false, None)
    }

    /// [`Registry::share`], or with `again` a share back after the folder attached again, into
    /// an entry `into` lists already ([`Session::attach_shared`]). The share takes an entry
    /// offline, or over a link that ended, or over `taken_over` (one the new attach took over
    /// in its own session), never over a link that serves on. A folder attached with full
    /// trust is not shared into a session whose settings refuse such folders
    /// (`attach.allow_full_trust = false`), as its own attach there would be refused.
    fn share_as(
        &self,
        folder: &Attached,
        into: &Arc<Session>,
        again: bool,
        taken_over: Option<u64>,
    ) -> Option<WorkspaceInfo> {
        let link = folder.link.as_ref()?;
        let (generation, minor) = (link.generation, link.minor);
        if into.refuses(folder.trust) {
            return None;
        }
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        let Links { live, shared } = &mut *links;
        let link = live.get(&generation)?;
        // Decided while no attach of its own can come between (those hold this lock too).
        let over = into
            .carried(&folder.device_id, &folder.path)
            .filter(|g| *g == generation || !live.contains_key(g) || taken_over == Some(*g));
        let info = into.attach_shared(folder.clone(), Joining::Shared { again, over })?;
        // The same link shared there again (a landing, a link's end): its forwarder runs.
        let new_here = over != Some(generation);
        if !shared.contains_key(&link.folder) && shared.len() >= SHARED_FOLDERS_MAX {
            shared.retain(|_, sessions| sessions.iter().any(|s| s.strong_count() > 0));
        }
        let sessions = shared.entry(link.folder.clone()).or_default();
        sessions.retain(|s| s.strong_count() > 0 && !std::ptr::eq(s.as_ptr(), Arc::as_ptr(into)));
        sessions.push(Arc::downgrade(into));
        // The attachment's owner hears where that session's focus goes, as of its own: each
        // move, while both the session and the attachment last (a client that cannot hear
        // which session is told of its own only).
        if minor >= monad_protocol::wire::SHARED_FOCUS_MINOR
            && new_here
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let moves = link.moves.clone();
            let mut focus = into.watch_focus();
            let session = into.id.clone();
            let name = info.name.clone();
            let there = Arc::downgrade(into);
            let (device, path) = (folder.device_id.clone(), folder.path.clone());
            runtime.spawn(async move {
                loop {
                    // Only while the session carries this link: not after a detach by name
                    // there, nor once another link took its place. The move that finds it so
                    // is still told (a detach by name leaves the session without a focus), and
                    // is the last.
                    let carried = there.upgrade().and_then(|s| s.carried(&device, &path));
                    let serving = carried == Some(generation);
                    let now = focus.borrow_and_update().clone();
                    let told = SharedFocus {
                        session: session.clone(),
                        name: name.clone(),
                        now,
                    };
                    if moves.send(told).await.is_err() || !serving {
                        break;
                    }
                    // Until the session goes, or the attachment's task does.
                    tokio::select! {
                        changed = focus.changed() => if changed.is_err() { break },
                        () = moves.closed() => break,
                    }
                }
            });
        }
        Some(info)
    }

    /// Detaches the attachment of `generation` from `session` and from every session its
    /// folder was shared into. Those sessions stay remembered for the folder's next attachment
    /// ([`Registry::share_again`]); when another attachment of the folder lives (one that
    /// attached before this one's end, or an older one that serves on elsewhere), each left
    /// offline gets the link of the newest it can take now.
    pub fn detach_everywhere(&self, session: &Session, generation: u64) {
        let (shared, others) = {
            let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
            let Links { live, shared } = &mut *links;
            match live.remove(&generation) {
                Some(link) => {
                    let sessions: Vec<Arc<Session>> = shared
                        .get(&link.folder)
                        .map(|s| s.iter().filter_map(std::sync::Weak::upgrade).collect())
                        .unwrap_or_default();
                    // Those that live on, newest first, whatever their age: an older one may
                    // serve still.
                    let mut others: Vec<(u64, Attached)> = live
                        .iter()
                        .filter(|(_, l)| l.folder == link.folder)
                        .map(|(g, l)| (*g, l.attached.clone()))
                        .collect();
                    others.sort_by_key(|(g, _)| std::cmp::Reverse(*g));
                    (sessions, others)
                }
                None => (Vec::new(), Vec::new()),
            }
        };
        session.detach(generation);
        for other in &shared {
            other.detach(generation);
        }
        // Each session left offline takes the newest it can (one refuses a full-trust folder).
        for other in &shared {
            for (_, live) in &others {
                if self.share_as(live, other, true, None).is_some() {
                    break;
                }
            }
        }
    }

    /// The sessions of `user` in memory now (where attached folders are).
    pub fn loaded_of(&self, user: &str) -> Vec<Arc<Session>> {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|s| s.owner == user)
            .cloned()
            .collect()
    }

    /// How long session `id` has been idle, when it is in memory (a session that is not was
    /// not used since it was unloaded).
    pub fn idle_of(&self, id: &str) -> Option<Duration> {
        self.in_memory(id).map(|s| s.idle())
    }

    /// Whether session `id` exists and belongs to `user`.
    pub fn exists_for(&self, id: &str, user: &str) -> bool {
        self.owner_of(id).as_deref() == Some(user)
    }

    /// Bounds each user's sessions: `in_memory` loaded at once (more evict the user's least
    /// recently used session that is not [in use](Session::in_use), else are refused), `stored`
    /// in the store (more are refused). Without this, neither is bounded.
    pub fn with_quotas(mut self, in_memory: usize, stored: usize) -> Registry {
        self.max_in_memory = in_memory.max(1);
        self.max_stored = stored.max(1);
        self
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Opens session `id` for `user`: from memory, else from the store, else creates it (seed
    /// 001: opening an id that does not exist yet creates the session under that id). A session
    /// of another user is refused. A session whose `session.toml` is corrupt is refused for
    /// everyone (with a warning for the operator), never re-created: the file names its owner.
    pub fn open(&self, id: &str, user: &str) -> Result<Arc<Session>, ToolError> {
        self.open_or(id, user, true)
    }

    /// [`Registry::open`], creating the session when `create`, else refusing one that does not
    /// exist (`not_found`).
    /// Whether session `id` is being deleted ([`Registry::delete`]).
    fn being_deleted(&self, id: &str) -> bool {
        self.deleting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(id)
    }

    fn open_or(&self, id: &str, user: &str, create: bool) -> Result<Arc<Session>, ToolError> {
        let id = normalize_id(id)?;
        if let Some(session) = self.in_memory(&id) {
            owned_by(&session, user)?;
            return Ok(session);
        }
        if !self.leaving.wait(&id, LEAVING_WAIT) {
            return Err(ToolError::new(
                ErrorCode::Internal,
                format!(
                    "session {id} is still leaving this host's memory (its activity being \
                     saved, its lease given up) after {} s: the store is slow or unreachable; \
                     retry",
                    LEAVING_WAIT.as_secs()
                ),
            ));
        }
        // No room in memory for another of the user's sessions: refused before anything is
        // read or created (the same check, with eviction, is made again when it is inserted).
        self.room_for(user)?;
        // Not in memory: load or create it without holding the registry's lock, so that one
        // session's disk work (a creation fsyncs) does not hold up every other request. Two
        // opens of the same session may race here; the store lets only one create it, and the
        // first to insert it below is the one every caller gets.
        let meta = match self.store.load(&id) {
            Ok(Some(meta)) => meta,
            Err(StoreError::Invalid(why)) => {
                warn!(
                    "session {id}: {why}; refused to {user} (it is never re-created over): \
                     repair the file, or delete the session"
                );
                return Err(ToolError::new(
                    ErrorCode::Internal,
                    format!(
                        "session {id} cannot be opened: its metadata (session.toml, or its row \
                         in PostgreSQL) is corrupt; the server's operator must repair it (the \
                         server's log says what is wrong)"
                    ),
                ));
            }
            Ok(None) if !create => {
                return Err(ToolError::new(
                    ErrorCode::NotFound,
                    format!("there is no session {id}"),
                ));
            }
            // Gone because it is being deleted (its rows went a moment ago): not made again on
            // disk, which the delete would then leave behind as an empty session.
            Ok(None) if self.being_deleted(&id) => return Err(being_deleted(&id)),
            Ok(None) => {
                let meta = fresh_meta(&id, user);
                let count = || self.store.count_sessions(user).map_err(store_error);
                let _creating = Creating::start(&self.creating, user, count, self.max_stored)?
                    .map_err(|stored| {
                        ToolError::new(
                            ErrorCode::LimitExceeded,
                            format!(
                                "you have {stored} sessions stored, this server's limit \
                                 (server.max_sessions_per_user); reuse one, or have old ones \
                                 deleted (`monad-server session delete ID`, `session gc`)"
                            ),
                        )
                    })?;
                match self.store.create(&meta) {
                    Ok(()) => meta,
                    // Created meanwhile by a racing open: use what it made.
                    Err(e) => match self.store.load(&id) {
                        Ok(Some(meta)) => meta,
                        _ => {
                            return Err(ToolError::new(
                                ErrorCode::Internal,
                                format!("cannot create session {id}: {e}"),
                            ));
                        }
                    },
                }
            }
            Err(e) => return Err(store_error(e)),
        };
        if meta.owner != user {
            return Err(not_yours(&id));
        }
        let file = self.store.config_text(&id).map_err(store_error)?;
        let settings = self
            .layers
            .session(
                file.as_ref()
                    .map(|(name, text)| (name.as_str(), text.as_str())),
            )
            .map_err(|e| ToolError::new(ErrorCode::Internal, format!("bad configuration: {e}")))?;
        let primary = PrimaryWorkspace::new(
            self.sessions_dir.join(&id).join("workspace"),
            settings.limits.clone(),
            settings.exec.clone(),
        )
        .in_group_of(self.groups.clone(), &meta.owner)
        .with_connection_budgets(self.connections.clone(), &meta.owner);
        let now = Instant::now();
        let (kept, focus) = kept_folders(&meta);
        let session = Arc::new(Session {
            id: meta.id.clone(),
            owner: meta.owner.clone(),
            created_at: meta.created_at.clone(),
            primary: Arc::new(primary),
            settings,
            meta: Mutex::new(meta),
            activity: Mutex::new(Activity {
                last_used: now,
                last_saved: now,
                dirty: false,
            }),
            attached: Mutex::new(kept),
            changes: tokio::sync::watch::channel(0).0,
            processes: Mutex::new(Vec::new()),
            focus: tokio::sync::watch::Sender::new(focus),
            hosts: Mutex::new(Vec::new()),
            recorder: self.recorder.clone(),
            read_at_epoch: tokio::sync::Mutex::new(None),
        });
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if self.being_deleted(&id) {
            return Err(being_deleted(&id));
        }
        if let Some(loaded) = sessions.get(&id) {
            // Loaded meanwhile by a racing open: every caller gets the one in memory.
            let loaded = loaded.clone();
            drop(sessions);
            owned_by(&loaded, user)?;
            return Ok(loaded);
        }
        if self.leaving.contains(&id) {
            // Loaded, then dropped again, by others while this open read the store: what it
            // read may be older than what is being saved. Read again once it has left.
            drop(sessions);
            return self.open_or(&id, user, create);
        }
        let evicted = match Self::evictable(&sessions, user, self.max_in_memory) {
            Ok(None) => None,
            Ok(Some(victim)) => self.take_out(&mut sessions, &victim),
            Err(()) => return Err(self.no_room()),
        };
        sessions.insert(id, session.clone());
        drop(sessions);
        if let Some(evicted) = evicted {
            self.let_go(&evicted);
        }
        Ok(session)
    }

    /// Refuses when `user` has the most sessions in memory they may, all of them in use.
    fn room_for(&self, user: &str) -> Result<(), ToolError> {
        let sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        Self::evictable(&sessions, user, self.max_in_memory)
            .map(|_| ())
            .map_err(|()| self.no_room())
    }

    /// Whether `user` may have one more session in memory: `Ok(None)` with room to spare,
    /// `Ok(Some(id))` when their least recently used session that is not in use must go to make
    /// room, `Err` when there is none such.
    fn evictable(
        sessions: &HashMap<String, Arc<Session>>,
        user: &str,
        max: usize,
    ) -> Result<Option<String>, ()> {
        let mine: Vec<&Arc<Session>> = sessions.values().filter(|s| s.owner == user).collect();
        if mine.len() < max {
            return Ok(None);
        }
        mine.into_iter()
            .filter(|s| !s.in_use())
            .min_by_key(|s| s.last_used())
            .map(|s| Some(s.id.clone()))
            .ok_or(())
    }

    fn no_room(&self) -> ToolError {
        ToolError::new(
            ErrorCode::LimitExceeded,
            format!(
                "you have {} sessions in use at once, this server's limit \
                 (server.max_sessions_in_memory_per_user); detach folders and end agents' \
                 connections to sessions you no longer need, then retry",
                self.max_in_memory
            ),
        )
    }

    /// The session, when it is in memory.
    fn in_memory(&self, id: &str) -> Option<Arc<Session>> {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// The session a request means: the one it names (binding the device to it, when there
    /// is one), else the one the device is bound to, else the user's default. MCP over HTTP
    /// has no device.
    pub fn resolve(
        &self,
        requested: Option<&str>,
        user: &str,
        device: Option<&DeviceId>,
    ) -> Result<Arc<Session>, ToolError> {
        match requested {
            Some(id) => {
                // `default` names the caller's own default: the well-known session for the
                // user who first used it, a session of their own for everyone else.
                // A corrupt `default` stays named, so that opening it says what is wrong.
                let id = match id {
                    DEFAULT_SESSION if self.stored_owner_of(DEFAULT_SESSION).is_ok() => {
                        self.default_of(user)?
                    }
                    // Not an id: a unique prefix of one of the user's sessions (as docker and
                    // git take them).
                    id if normalize_id(id).is_err() => self.by_prefix(id, user)?,
                    id => id.to_owned(),
                };
                let session = self.open(&id, user)?;
                if let Some(device) = device {
                    self.bind(user, device, &session.id);
                    let mut recent = self.recent_binds.lock().unwrap_or_else(|p| p.into_inner());
                    // Full: what no longer answers goes first, then this user's own; others'
                    // stay (a user reconnecting with ever new device ids emptied it for every
                    // user, whose next calls all went to the store). Still full, this one is
                    // not kept: its next lookup asks the store, as it would have.
                    if recent.len() >= self.recent_binds_max {
                        recent.retain(|_, (bound, at)| {
                            bound.strong_count() > 0 && at.elapsed() < RECENT_BIND
                        });
                    }
                    if recent.len() >= self.recent_binds_max {
                        recent.retain(|(owner, _), _| owner != user);
                    }
                    if recent.len() < self.recent_binds_max {
                        recent.insert(
                            (user.to_owned(), device.as_str().to_owned()),
                            (Arc::downgrade(&session), Instant::now()),
                        );
                    }
                }
                Ok(session)
            }
            None => {
                let id = self.bound(user, device)?;
                self.open(&id, user)
            }
        }
    }

    /// What [`Registry::resolve`] answers, when it can be answered from memory without a
    /// write: `requested` is a session's full id (or `default` while the caller's is loaded;
    /// not a prefix), the session is in memory, and the device (if any) was bound to it here
    /// within the hour. `None` when the
    /// store must be asked (then call [`Registry::resolve`] off the async workers).
    pub fn resolve_in_memory(
        &self,
        requested: Option<&str>,
        user: &str,
        device: Option<&DeviceId>,
    ) -> Option<Result<Arc<Session>, ToolError>> {
        let id = requested?;
        let session = self.in_memory(id)?;
        if id == DEFAULT_SESSION && session.owner != user {
            // `default` of another user: this user's own default is the store's to find.
            return None;
        }
        if let Err(e) = owned_by(&session, user) {
            return Some(Err(e));
        }
        if let Some(device) = device {
            let recent = self.recent_binds.lock().unwrap_or_else(|p| p.into_inner());
            let (bound, at) = recent.get(&(user.to_owned(), device.as_str().to_owned()))?;
            let current = bound.upgrade().is_some_and(|b| Arc::ptr_eq(&b, &session));
            if !current || at.elapsed() >= RECENT_BIND {
                return None;
            }
        }
        Some(Ok(session))
    }

    /// The id of `user`'s one session whose id starts with `prefix`; refused when none or
    /// several do.
    pub fn by_prefix(&self, prefix: &str, user: &str) -> Result<String, ToolError> {
        let (owned, _) = self.owned(user)?;
        let ids: Vec<String> = owned.iter().map(|m| m.id.clone()).collect();
        let by_id = match_prefix(prefix, &ids).map(str::to_owned);
        let Err(e) = &by_id else {
            return by_id;
        };
        if e.code != ErrorCode::NotFound {
            return by_id;
        }
        // No id is or starts with it: the name a session was given (`sessions --new --name`),
        // when one session of the user's has it.
        let named: Vec<&SessionMeta> = owned
            .iter()
            .filter(|m| m.name.as_deref() == Some(prefix))
            .collect();
        match named.as_slice() {
            [] => by_id,
            [one] => Ok(one.id.clone()),
            several => Err(ToolError::new(
                ErrorCode::InvalidArguments,
                format!(
                    "`{}` is the name of {} sessions ({}): give the id",
                    monad_protocol::text::printable(prefix),
                    several.len(),
                    several
                        .iter()
                        .take(5)
                        .map(|m| m.id.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        }
    }

    /// Creates a new session with a fresh UUID.
    pub fn create(&self, user: &str) -> Result<Arc<Session>, ToolError> {
        self.open(&uuid::Uuid::new_v4().to_string(), user)
    }

    /// The session a request without one means: the one `user` last used from the device (when
    /// it still exists and is theirs), else the user's default. The well-known `default` is the
    /// default of the user who first used it; every other user gets a default of their own, a
    /// session created on first need and kept in the store's per-user defaults (which no device
    /// id can name), so `monad-client attach DIR` works for each person on a shared server.
    pub fn bound(&self, user: &str, device: Option<&DeviceId>) -> Result<String, ToolError> {
        if let Some(device) = device
            && let Ok(Some(id)) = self.store.bound_session(user, device.as_str())
            && self.owner_of(&id).as_deref() == Some(user)
        {
            return Ok(id);
        }
        self.default_of(user)
    }

    /// The id `user` means by `id` without creating anything: `default` is the user's own
    /// default (the well-known `default` when it is theirs, else the one of their own kept for
    /// them; `None` when they have none yet), any other id is itself. For reads over HTTP,
    /// where `default` must not name another user's session.
    pub fn existing_id(&self, id: &str, user: &str) -> Option<String> {
        if id != DEFAULT_SESSION {
            return Some(id.to_owned());
        }
        match self.stored_owner_of(DEFAULT_SESSION) {
            Ok(Some(owner)) if owner == user => return Some(DEFAULT_SESSION.to_owned()),
            Ok(None) => return None,
            Ok(Some(_)) | Err(_) => {}
        }
        self.store
            .default_session(user)
            .ok()
            .flatten()
            .filter(|own| self.owner_of(own).as_deref() == Some(user))
    }

    /// The session `user` names by `requested` (an id, a unique prefix of one, or `default`),
    /// opened only if it exists, and binding no device: for a request that acts on a session
    /// without going to work in it (`detach`), which must neither create one nor move the
    /// device's unnamed calls there.
    pub fn open_existing(&self, requested: &str, user: &str) -> Result<Arc<Session>, ToolError> {
        if let Some(Ok(id)) = self
            .existing_id(requested, user)
            .map(|id| normalize_id(&id))
        {
            match self.open_or(&id, user, false) {
                Err(e) if e.code == ErrorCode::NotFound => {}
                opened => return opened,
            }
        }
        self.open_or(&self.by_prefix(requested, user)?, user, false)
    }

    /// The session `user` means by `id`, opened: `default` is their own default (created on
    /// first need, as [`Registry::resolve`] takes it), any other id exactly that session
    /// ([`Registry::open`]). For the HTTP fronts, which bind no device.
    pub fn open_own(&self, id: &str, user: &str) -> Result<Arc<Session>, ToolError> {
        if id == DEFAULT_SESSION {
            return self.resolve(Some(id), user, None);
        }
        self.open(id, user)
    }

    /// The user's default session: the well-known `default` when it is theirs or nobody's yet,
    /// else a session of their own, created on first need.
    fn default_of(&self, user: &str) -> Result<String, ToolError> {
        // A `default` whose metadata cannot be read is nobody's to take: the user gets their own.
        match self.stored_owner_of(DEFAULT_SESSION) {
            Ok(None) => return Ok(DEFAULT_SESSION.to_owned()),
            Ok(Some(owner)) if owner == user => return Ok(DEFAULT_SESSION.to_owned()),
            Ok(Some(_)) | Err(_) => {}
        }
        if let Ok(Some(id)) = self.store.default_session(user)
            && self.owner_of(&id).as_deref() == Some(user)
        {
            return Ok(id);
        }
        let own = self.create(user)?;
        if let Err(e) = self.store.set_default_session(user, &own.id) {
            warn!("cannot keep {} as the default of {user}: {e}", own.id);
        }
        Ok(own.id.clone())
    }

    /// The owner of a session, when it exists and can be read.
    fn owner_of(&self, id: &str) -> Option<String> {
        self.stored_owner_of(id).ok().flatten()
    }

    /// The owner of a session: `None` when it does not exist, an error when its metadata
    /// cannot be read.
    fn stored_owner_of(&self, id: &str) -> Result<Option<String>, StoreError> {
        if let Some(session) = self
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
        {
            return Ok(Some(session.owner.clone()));
        }
        Ok(self.store.load(id)?.map(|m| m.owner))
    }

    /// Binds `user`'s device to a session (a no-op when it already is).
    pub fn bind(&self, user: &str, device: &DeviceId, session: &str) {
        if let Err(e) = self.store.bind(user, device.as_str(), session) {
            warn!("cannot bind device {device} of {user} to {session}: {e}");
        }
    }

    /// The sessions `user` owns, most recently active first.
    pub fn list(&self, user: &str) -> Result<Vec<SessionInfo>, ToolError> {
        let (owned, live) = self.owned(user)?;
        Ok(owned.into_iter().map(|m| info_of(m, &live)).collect())
    }

    /// One page of the sessions `user` owns, most recently active first (ties by id): `limit`
    /// (1 to 100) sessions after the position the token `next` names, and the token of the
    /// page after this one (absent on the last).
    pub fn list_page(
        &self,
        user: &str,
        limit: usize,
        next: Option<&str>,
    ) -> Result<(Vec<SessionInfo>, Option<String>), ToolError> {
        if !(1..=100).contains(&limit) {
            return Err(ToolError::new(
                ErrorCode::InvalidArguments,
                format!("limit {limit} is out of range: 1 to 100"),
            ));
        }
        let after = next
            .map(crate::store::decode_cursor)
            .transpose()
            .map_err(store_error)?;
        let (owned, live) = self.owned(user)?;
        let start = match &after {
            Some((last_active, id)) => owned.partition_point(|m| {
                (std::cmp::Reverse(m.last_active.as_str()), m.id.as_str())
                    <= (std::cmp::Reverse(last_active.as_str()), id.as_str())
            }),
            None => 0,
        };
        let more = owned.len() > start + limit;
        let page: Vec<SessionMeta> = owned.into_iter().skip(start).take(limit).collect();
        let token = page
            .last()
            .filter(|_| more)
            .map(|m| crate::store::encode_cursor(&m.last_active, &m.id));
        Ok((page.into_iter().map(|m| info_of(m, &live)).collect(), token))
    }

    /// The metadata of the sessions `user` owns, with the activity of loaded sessions, most
    /// recently active first (ties by id); and the loaded sessions.
    /// A store that cannot be read is an error: read as "no sessions", a database outage
    /// listed none (exit 0), and a prefix matched none ("no session starts with").
    fn owned(&self, user: &str) -> Result<Owned, ToolError> {
        let stored = self.store.owner_sessions(user).map_err(store_error)?;
        let live = self
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut owned: Vec<SessionMeta> = stored
            .into_iter()
            .filter(|m| m.owner == user)
            .map(|m| match live.get(&m.id) {
                Some(session) => session.meta(),
                None => m,
            })
            .collect();
        owned.sort_by(|a, b| b.last_active.cmp(&a.last_active).then(a.id.cmp(&b.id)));
        Ok((owned, live))
    }

    /// Deletes a session with its workspace, history, artifacts, bindings and its place in
    /// workspace records. Blocking: it waits for the recorder to write what it holds (see
    /// [`Registry::with_recorder`]), then for the store.
    pub fn delete(&self, id: &str) -> Result<(), ToolError> {
        self.delete_unused(id, None)
    }

    /// [`Registry::delete`]; with `max_age`, only while the session is still unused for that
    /// long (`session gc` and the auto-purge, which listed it as such before): one used since
    /// it was listed is kept ([`ErrorCode::Denied`]). Its age is looked at again where no call
    /// can use it meanwhile: in memory under the registry's lock, else in the store once it is
    /// marked as being deleted (no open loads it from then on).
    fn delete_unused(&self, id: &str, max_age: Option<Duration>) -> Result<(), ToolError> {
        let id = normalize_id(id)?;
        let used_since = || {
            ToolError::new(
                ErrorCode::Denied,
                format!("session {id} was used since it was found unused: kept"),
            )
        };
        let still_old =
            |meta: &SessionMeta, max_age| inactive_since(&meta.last_active, &cutoff_of(max_age));
        // Looked at in the store first too, before it is marked (which refuses its opens): a
        // session used since it was listed is kept without that.
        if let Some(max_age) = max_age
            && self.in_memory(&id).is_none()
            && let Ok(Some(meta)) = self.store.load(&id)
            && still_old(&meta, max_age) != Age::Old
        {
            return Err(used_since());
        }
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(session) = sessions.get(&id) {
            if session.in_use() {
                return Err(ToolError::new(
                    ErrorCode::Denied,
                    format!(
                        "session {id} is in use (a folder is attached, an agent is connected to \
                         it, or a background command runs in it): detach and stop those first"
                    ),
                ));
            }
            if let Some(max_age) = max_age
                && still_old(&session.meta(), max_age) != Age::Old
            {
                return Err(used_since());
            }
        }
        let loaded = sessions.remove(&id).is_some();
        // Marked under the registry's lock: from here until its rows are gone, no open puts it
        // back in memory.
        self.deleting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone());
        drop(sessions);
        let unmark = || {
            self.deleting
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id)
        };
        // One leaving memory (an idle unload, an eviction) saves its activity on the way out:
        // deleted after that save, never before it, which would write the session back.
        if !self.leaving.wait(&id, LEAVING_WAIT) {
            unmark();
            return Err(ToolError::new(
                ErrorCode::Internal,
                format!(
                    "session {id} is still leaving this host's memory (its activity being \
                     saved) after {} s: the store is slow or unreachable; nothing was deleted, \
                     retry",
                    LEAVING_WAIT.as_secs()
                ),
            ));
        }
        // What its last calls sent the recorder is written first, then deleted with the rest.
        if let Some(recorder) = &self.recorder {
            recorder.flush();
        }
        // Not in memory when it was marked: its age as the store has it now, saved by whatever
        // used it since it was listed (and left memory again).
        if let Some(max_age) = max_age
            && !loaded
        {
            let recent = match self.store.load(&id) {
                Ok(Some(meta)) => still_old(&meta, max_age) != Age::Old,
                Ok(None) => false,
                Err(e) => {
                    unmark();
                    return Err(store_error(e));
                }
            };
            if recent {
                unmark();
                return Err(used_since());
            }
        }
        // The session first (a delete the store refuses, fenced by another host, say, leaves
        // it whole, its bindings and default too), then what names it. When the session is
        // gone already, what names it goes all the same: a delete cut short before (a crash;
        // the file store also sweeps what such a delete left at its next start) named it
        // for good otherwise.
        let deleted = (|| {
            let gone = self.store.delete(&id);
            if matches!(gone, Ok(()) | Err(StoreError::NotFound(_))) {
                self.store.unbind_session(&id)?;
                self.store.forget_session(&id)?;
            }
            gone
        })();
        unmark();
        // It left memory: its lease goes too, as when it unloads. After a delete the store has
        // forgotten it already; after a refused one (fenced, the database down) this host must
        // not keep renewing a lease on a session it no longer serves.
        if let Some(cluster) = &self.cluster {
            cluster.release(&id);
        }
        deleted.map_err(store_error)
    }

    /// The sessions unused for `max_age` (never a user's default, never one in use), as `session gc`
    /// would delete them now; their metadata with the in-memory `last_active`.
    pub fn unused_for(&self, max_age: Duration) -> Result<Vec<SessionMeta>, ToolError> {
        let cutoff = cutoff_of(max_age);
        // Loaded sessions: in use (kept), or their in-memory metadata. Asked under the lock,
        // where the registry's reference is the only one this adds.
        let live: HashMap<String, Option<SessionMeta>> = self
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(id, s)| (id.clone(), (!s.in_use()).then(|| s.meta())))
            .collect();
        let mut unused = Vec::new();
        // Each user's default, looked up once per owner of an old session: a user's default
        // is where their unnamed calls and notes go, whoever else first used `default`.
        let mut defaults: HashMap<String, Option<String>> = HashMap::new();
        for meta in self.store.all_sessions().map_err(store_error)? {
            let meta = match live.get(&meta.id) {
                Some(None) => continue,
                Some(Some(loaded)) => loaded.clone(),
                None => meta,
            };
            if meta.id == DEFAULT_SESSION {
                continue;
            }
            match inactive_since(&meta.last_active, &cutoff) {
                Age::Old => {
                    let default = match defaults.get(&meta.owner) {
                        Some(default) => default.clone(),
                        None => {
                            let default = self
                                .store
                                .default_session(&meta.owner)
                                .map_err(store_error)?;
                            defaults.insert(meta.owner.clone(), default.clone());
                            default
                        }
                    };
                    if default.as_deref() != Some(meta.id.as_str()) {
                        unused.push(meta);
                    }
                }
                Age::Recent => {}
                // An age that cannot be read is no age: kept, for the operator to look at.
                Age::Unreadable => warn!(
                    "session {}: its last activity `{}` is not a time; it is never deleted for \
                     its age (repair the record, or delete the session by id)",
                    meta.id,
                    monad_protocol::text::printable(&meta.last_active)
                ),
            }
        }
        unused.sort_by(|a, b| a.last_active.cmp(&b.last_active).then(a.id.cmp(&b.id)));
        Ok(unused)
    }

    /// Deletes every session unused for `max_age` (never a user's default, never one in use);
    /// returns their ids.
    pub fn gc(&self, max_age: Duration) -> Result<Vec<String>, ToolError> {
        let mut deleted = Vec::new();
        for meta in self.unused_for(max_age)? {
            match self.delete_unused(&meta.id, Some(max_age)) {
                Ok(()) => deleted.push(meta.id),
                // In use by now: kept, whatever its age says.
                Err(e) if e.code == ErrorCode::Denied => {}
                Err(e) => return Err(e),
            }
        }
        Ok(deleted)
    }

    /// One auto-purge pass (`[retention] max_age_days`): deletes the sessions unused for
    /// `purge.max_age` (as [`Registry::gc`]: never a user's default, never one in use, so never one
    /// with a call in flight), then the workspace records inactive that long that no remaining
    /// session uses and no attached folder names, oldest first, `purge.max_per_pass` of them in
    /// all at most. Blocking (store work): run it off the async workers.
    pub fn purge(&self, purge: &Purge) -> Result<Purged, ToolError> {
        let mut done = Purged::default();
        let mut budget = purge.max_per_pass;
        for meta in self.unused_for(purge.max_age)? {
            if budget == 0 {
                done.more = true;
                return Ok(done);
            }
            match self.delete_unused(&meta.id, Some(purge.max_age)) {
                Ok(()) => {
                    budget -= 1;
                    done.sessions.push(meta);
                }
                // In use by now, or gone meanwhile: kept (or nothing to do).
                Err(e) if matches!(e.code, ErrorCode::Denied | ErrorCode::NotFound) => {}
                Err(e) => {
                    warn!(
                        "auto-purge: cannot delete session {}: {}",
                        meta.id, e.message
                    );
                }
            }
        }
        let cutoff = cutoff_of(purge.max_age);
        let attached = self.attached_records();
        let mut records = self.store.records(None).map_err(store_error)?;
        records.sort_by(|a, b| a.last_active.cmp(&b.last_active).then(a.id.cmp(&b.id)));
        for record in records {
            if inactive_since(&record.last_active, &cutoff) != Age::Old
                || attached.contains(&record.id)
                || self.record_in_use(&record.id)?
            {
                continue;
            }
            if budget == 0 {
                done.more = true;
                return Ok(done);
            }
            match self.store.delete_record(&record.id) {
                Ok(()) => {
                    budget -= 1;
                    done.records.push(record);
                }
                Err(StoreError::NotFound(_)) => {}
                Err(e) => warn!(
                    "auto-purge: cannot delete workspace record {}: {e}",
                    record.id
                ),
            }
        }
        Ok(done)
    }

    /// The workspace records of the folders attached to loaded sessions.
    fn attached_records(&self) -> std::collections::HashSet<String> {
        let sessions: Vec<Arc<Session>> = self
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        sessions
            .iter()
            .flat_map(|s| {
                s.attached
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .filter_map(|a| a.record.clone())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Whether a session that still exists is listed in a workspace record.
    fn record_in_use(&self, record: &str) -> Result<bool, ToolError> {
        let mut next = None;
        loop {
            let page = match self.store.record_sessions(record, 100, next.as_deref()) {
                Ok(page) => page,
                Err(StoreError::NotFound(_)) => return Ok(false),
                Err(e) => return Err(store_error(e)),
            };
            for s in &page.items {
                match self.store.load(&s.session) {
                    Ok(None) => {}
                    // Exists, or cannot be read (kept, as the session is).
                    Ok(Some(_)) | Err(_) => return Ok(true),
                }
            }
            match page.next {
                Some(token) => next = Some(token),
                None => return Ok(false),
            }
        }
    }

    /// Drops from memory the sessions idle for `max_idle` that have no folder online; the
    /// metadata of those with unsaved activity is saved (after the registry's lock is released:
    /// saving is an fsync, and requests wait on that lock). Returns how many were dropped.
    pub fn unload_idle(&self, max_idle: Duration) -> usize {
        let dropped: Vec<Arc<Session>> = {
            let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
            // A session some request holds (the registry's reference is the only other one) is
            // in use even when idle: an `attach` between opening the session and registering on
            // it must not find it dropped from memory.
            let idle: Vec<String> = sessions
                .values()
                .filter(|s| s.idle() >= max_idle && !s.in_use())
                .map(|s| s.id.clone())
                .collect();
            idle.iter()
                .filter_map(|id| self.take_out(&mut sessions, id))
                .collect()
        };
        for session in &dropped {
            self.let_go(session);
        }
        dropped.len()
    }

    /// Drops session `id` from memory (`sessions`, the registry's map, locked) to leave: an
    /// open of it waits until [`Registry::let_go`] has let it go.
    fn take_out(
        &self,
        sessions: &mut HashMap<String, Arc<Session>>,
        id: &str,
    ) -> Option<Arc<Session>> {
        let session = sessions.remove(id)?;
        self.leaving.start(id);
        Some(session)
    }

    /// What a session taken out of memory ([`Registry::take_out`]) leaves behind: its unsaved
    /// activity saved, then its lease given up (several hosts), so that another host may serve
    /// it at once rather than after this host renewed the lease of a session it no longer has,
    /// for as long as it runs. Then an open of it may load it again.
    fn let_go(&self, session: &Session) {
        // The newest state saved here, while the lease is still this host's: a snapshot the
        // recorder still held (a focus just changed) saved after the release would be a
        // bystander's, which does not write the session's folders and focus.
        let queued = self
            .recorder
            .as_ref()
            .and_then(|recorder| recorder.take_meta(&session.id));
        let newest = session.unsaved().or_else(|| queued.map(|_| session.meta()));
        if let Some(meta) = newest
            && let Err(e) = self.store.save(&meta)
        {
            warn!("cannot save session {}: {e}", session.id);
        }
        if let Some(cluster) = &self.cluster {
            cluster.release(&session.id);
        }
        self.leaving.done(&session.id);
    }

    /// Lets `user`'s session `id` go from this host, when another host asks for it (a folder
    /// is attaching there: [`crate::cluster::Cluster::take_for_attach`]): it leaves memory, its
    /// unsaved activity saved, and its lease is given up, so that the asking host takes it at
    /// once. A session not in memory here has nothing to let go. Refused (`denied`, saying
    /// what) while something uses it here ([`Session::kept_by`]). Decided and taken out of
    /// memory under the registry's lock, so that no request takes the session meanwhile; its
    /// activity saved and its lease given up after ([`Registry::let_go`]), while a request for
    /// it waits, then finds it gone, loads it again and asks the database for its lease, which
    /// the asking host holds by then or takes after it. (Saved under the lock, every lookup of
    /// every session here waited for the database, up to its time-out.) True when the session
    /// was here to let go.
    pub fn give_up(&self, id: &str, user: &str) -> Result<bool, ToolError> {
        let session = {
            let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
            let Some(session) = sessions.get(id) else {
                return Ok(false);
            };
            owned_by(session, user)?;
            if let Some(why) = session.kept_by() {
                return Err(ToolError::new(ErrorCode::Denied, why));
            }
            self.take_out(&mut sessions, id)
        };
        if let Some(session) = session {
            self.let_go(&session);
        }
        Ok(true)
    }

    /// The connections of the folders attached into session `id` and online, when it is in
    /// memory: not those of folders shared into it from another session (an MCP host's roots),
    /// which that session's attachment carries.
    pub fn online_links(&self, id: &str) -> Vec<ClientLink> {
        let Some(session) = self.in_memory(id) else {
            return Vec::new();
        };
        let online = session.online_links();
        let links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        online
            .into_iter()
            .filter(|l| links.live.get(&l.generation).is_some_and(|x| x.home == id))
            .collect()
    }

    /// Reads the record of `session` again after this host took its lease (several hosts):
    /// [`Session::refresh`]. A session deleted meanwhile leaves memory unsaved (its copy saved
    /// would make it again) and is not found.
    pub fn refresh(&self, session: &Arc<Session>) -> Result<(), ToolError> {
        // A snapshot queued before the take is this host's older copy: written now, as the
        // holder's, it would replace the record read below.
        if let Some(recorder) = &self.recorder {
            recorder.take_meta(&session.id);
        }
        match self.store.load(&session.id) {
            Ok(Some(stored)) => {
                session.refresh(stored);
                Ok(())
            }
            Ok(None) => {
                let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
                if sessions
                    .get(&session.id)
                    .is_some_and(|loaded| Arc::ptr_eq(loaded, session))
                {
                    sessions.remove(&session.id);
                }
                drop(sessions);
                if let Some(cluster) = &self.cluster {
                    cluster.release(&session.id);
                }
                Err(ToolError::new(
                    ErrorCode::NotFound,
                    format!("there is no session {}: it was deleted", session.id),
                ))
            }
            Err(e) => Err(store_error(e)),
        }
    }

    /// Saves the metadata of every loaded session with unsaved activity (on shutdown).
    pub fn flush(&self) {
        self.flush_each(|| {});
    }

    /// [`Registry::flush`], calling `saved` after each session's save (done or failed).
    pub fn flush_each(&self, mut saved: impl FnMut()) {
        let sessions = self
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for session in sessions.values() {
            self.save_unsaved(session);
            saved();
        }
    }

    /// Saves the sessions whose snapshots `held` the recorder did not save
    /// ([`crate::recorder::Recorder::abandon_within`]), calling `saved` after each: a loaded
    /// session's metadata as it is now (newer than its snapshot), an unloaded one's snapshot.
    pub fn save_held(&self, held: Vec<SessionMeta>, mut saved: impl FnMut()) {
        for snapshot in held {
            let loaded = self
                .sessions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&snapshot.id)
                .cloned();
            let meta = loaded.map_or(snapshot, |session| {
                let _ = session.unsaved();
                session.meta()
            });
            if let Err(e) = self.store.save(&meta) {
                warn!("cannot save session {}: {e}", meta.id);
            }
            saved();
        }
    }

    fn save_unsaved(&self, session: &Session) {
        if let Some(meta) = session.unsaved()
            && let Err(e) = self.store.save(&meta)
        {
            warn!("cannot save session {}: {e}", session.id);
        }
    }

    /// The auto-purge's settings (global `[retention]`), when it is on.
    pub fn purge_settings(&self) -> Option<Purge> {
        self.layers.global().retention.purge()
    }

    /// How long a session may sit idle before it is dropped from memory (global setting).
    pub fn idle_limit(&self) -> Duration {
        Duration::from_secs(
            self.layers
                .global()
                .retention
                .idle_unload_hours
                .saturating_mul(3600),
        )
    }

    /// How many sessions are in memory.
    pub fn loaded(&self) -> usize {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }
}

/// The auto-purge's settings (`[retention]`, see [`crate::settings::Retention::purge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Purge {
    /// Sessions and records inactive this long go.
    pub max_age: Duration,
    /// How often a pass runs.
    pub every: Duration,
    /// Deletions per pass at most.
    pub max_per_pass: usize,
}

/// What one auto-purge pass deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Purged {
    /// The sessions (their metadata as it was).
    pub sessions: Vec<SessionMeta>,
    /// The workspace records.
    pub records: Vec<crate::store::WorkspaceRecord>,
    /// Whether the pass stopped at its bound with more to delete.
    pub more: bool,
}

/// What a last-activity time says against a cutoff (both RFC 3339 UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Age {
    /// At or before the cutoff (times have whole seconds: an age of 0 takes what was used this
    /// second too).
    Old,
    /// After it.
    Recent,
    /// Not a time this server writes (`YYYY-MM-DDTHH:MM:SS`, optional fraction, `Z` or
    /// `+00:00`): never taken for old.
    Unreadable,
}

/// Whether `last_active` is at or before `cutoff` (as [`cutoff_of`] writes it).
pub fn inactive_since(last_active: &str, cutoff: &str) -> Age {
    let b = last_active.as_bytes();
    let digits = |range: std::ops::Range<usize>| -> Option<u32> {
        let part = b.get(range)?;
        if part.iter().all(u8::is_ascii_digit) {
            std::str::from_utf8(part).ok()?.parse().ok()
        } else {
            None
        }
    };
    let fields = (|| {
        let (year, month, day) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
        let (hour, minute, second) = (digits(11..13)?, digits(14..16)?, digits(17..19)?);
        let separators = b.get(4) == Some(&b'-')
            && b.get(7) == Some(&b'-')
            && matches!(b.get(10), Some(b'T' | b't'))
            && b.get(13) == Some(&b':')
            && b.get(16) == Some(&b':');
        let mut rest = &last_active[19..];
        if let Some(fraction) = rest.strip_prefix('.') {
            let end = fraction
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(fraction.len());
            if end == 0 {
                return None;
            }
            rest = &fraction[end..];
        }
        let utc = matches!(rest, "Z" | "z" | "+00:00");
        let ranges = year >= 1970
            && (1..=12).contains(&month)
            && (1..=31).contains(&day)
            && hour < 24
            && minute < 60
            && second <= 60;
        (separators && utc && ranges).then_some(())
    })();
    match fields {
        None => Age::Unreadable,
        // Same shape: the first 19 characters sort as the instants do.
        Some(()) if last_active[..19] <= *cutoff.get(..19).unwrap_or(cutoff) => Age::Old,
        Some(()) => Age::Recent,
    }
}

/// `max_age` before now, RFC 3339 UTC to the second (the Unix epoch when that is before it).
pub fn cutoff_of(max_age: Duration) -> String {
    let secs = std::time::SystemTime::now()
        .checked_sub(max_age)
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    crate::fsutil::rfc3339(secs)
}

/// The running server's auto-purge: a [`Registry::purge`] pass at once and then every
/// `purge.every`, each on the blocking pool, what it deleted logged. Runs until aborted.
pub async fn run_purge(state: Arc<crate::state::State>, purge: Purge) {
    tracing::info!(
        "auto-purge on: sessions and workspace records inactive for {} s go (retention.max_age_days)",
        purge.max_age.as_secs()
    );
    let mut tick = tokio::time::interval(purge.every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let state = state.clone();
        let pass = tokio::task::spawn_blocking(move || state.registry.purge(&purge)).await;
        match pass {
            Ok(Ok(purged)) => {
                for meta in &purged.sessions {
                    tracing::info!(
                        session = %meta.id,
                        owner = %meta.owner,
                        last_active = %meta.last_active,
                        "auto-purge: deleted an inactive session"
                    );
                }
                for record in &purged.records {
                    tracing::info!(
                        record = %record.id,
                        user = %record.user,
                        last_active = %record.last_active,
                        "auto-purge: deleted an inactive workspace record"
                    );
                }
                if purged.more {
                    tracing::info!(
                        "auto-purge: {} deleted this pass, its bound (retention.purge_max_per_pass); \
                         the rest go on the next",
                        purge.max_per_pass
                    );
                }
            }
            Ok(Err(e)) => warn!("auto-purge: {}", e.message),
            Err(e) => warn!("auto-purge: the pass failed: {e}"),
        }
    }
}

/// One creation under way, counted per user until dropped.
struct Creating<'a> {
    creating: &'a Mutex<HashMap<String, usize>>,
    user: String,
}

impl<'a> Creating<'a> {
    /// Counts a creation for `user`, or gives back how many sessions they have stored when
    /// those (`count`, counted under the map's lock so that a creation ending meanwhile is
    /// counted once) and the creations under way reach `max`.
    fn start(
        creating: &'a Mutex<HashMap<String, usize>>,
        user: &str,
        count: impl FnOnce() -> Result<usize, ToolError>,
        max: usize,
    ) -> Result<Result<Creating<'a>, usize>, ToolError> {
        let mut map = creating.lock().unwrap_or_else(|p| p.into_inner());
        let stored = count()?;
        let under_way = map.get(user).copied().unwrap_or(0);
        if stored.saturating_add(under_way) >= max {
            return Ok(Err(stored));
        }
        map.insert(user.to_owned(), under_way + 1);
        Ok(Ok(Creating {
            creating,
            user: user.to_owned(),
        }))
    }
}

impl Drop for Creating<'_> {
    fn drop(&mut self) {
        let mut map = self.creating.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.user) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.user);
            }
        }
    }
}

/// A session as listed: from memory when it is loaded (with its attached folders), else from
/// its metadata.
fn info_of(meta: SessionMeta, live: &HashMap<String, Arc<Session>>) -> SessionInfo {
    match live.get(&meta.id) {
        Some(session) => session.info(),
        None => SessionInfo {
            // Its settings (a session may have its own `[exec]`) are not read for a listing.
            workspaces: vec![primary_info(&meta.id, None)],
            id: meta.id,
            owner: meta.owner,
            created_at: meta.created_at,
            last_active: meta.last_active,
            name: meta.name,
        },
    }
}

/// The primary workspace of session `id` as listed; `network` is what its commands get.
fn primary_info(id: &str, network: Option<String>) -> WorkspaceInfo {
    WorkspaceInfo {
        name: "primary".into(),
        uri: format!("server:/sessions/{id}"),
        trust: Trust::Full,
        host: Host::Server,
        online: true,
        tools: ToolName::WORKSPACE_TOOLS.to_vec(),
        network,
    }
}

/// A user's sessions' metadata, most recently active first, and the sessions in memory.
type Owned = (Vec<SessionMeta>, HashMap<String, Arc<Session>>);

/// A store error as the wire error an agent sees.
pub(crate) fn store_error(e: StoreError) -> ToolError {
    match e {
        StoreError::NotFound(what) => {
            ToolError::new(ErrorCode::NotFound, format!("{what} does not exist"))
        }
        StoreError::Invalid(why) => ToolError::new(ErrorCode::InvalidArguments, why),
        e @ StoreError::Fenced { .. } => ToolError::new(ErrorCode::Denied, e.to_string()),
        StoreError::Full(why) => ToolError::new(ErrorCode::LimitExceeded, why),
        other => ToolError::new(ErrorCode::Internal, other.to_string()),
    }
}

fn being_deleted(id: &str) -> ToolError {
    ToolError::new(
        ErrorCode::NotFound,
        format!("session {id} is being deleted"),
    )
}

fn not_yours(id: &str) -> ToolError {
    ToolError::new(
        ErrorCode::Unauthorized,
        format!("session `{id}` belongs to another user"),
    )
}

fn owned_by(session: &Session, user: &str) -> Result<(), ToolError> {
    if session.owner == user {
        Ok(())
    } else {
        Err(not_yours(&session.id))
    }
}

/// The metadata of a session `user` creates now.
fn fresh_meta(id: &str, user: &str) -> SessionMeta {
    let now = now_rfc3339();
    SessionMeta {
        id: id.to_owned(),
        name: None,
        owner: user.to_owned(),
        created_at: now.clone(),
        last_active: now,
        provider: None,
        model: None,
        focus: None,
        folders: Vec::new(),
    }
}

/// The one session id of `ids` that starts with `prefix` (an exact match wins); refused when
/// none or several do, naming them ([`match_id_prefix`]).
pub fn match_prefix<'a>(prefix: &str, ids: &'a [String]) -> Result<&'a str, ToolError> {
    match_id_prefix(
        "session",
        "`monad-client sessions` and `monad-server session list` list them",
        prefix,
        ids,
    )
}

/// The one id of `ids` that starts with `prefix` (an exact match wins), as docker and git take
/// ids; refused when none or several do, naming them. `what` is what the ids name (`session`),
/// and `listed` says where to find them.
pub fn match_id_prefix<'a>(
    what: &str,
    listed: &str,
    prefix: &str,
    ids: &'a [String],
) -> Result<&'a str, ToolError> {
    if let Some(exact) = ids.iter().find(|id| *id == prefix) {
        return Ok(exact);
    }
    let matches: Vec<&String> = if prefix.is_empty() {
        Vec::new()
    } else {
        ids.iter().filter(|id| id.starts_with(prefix)).collect()
    };
    match matches.as_slice() {
        [one] => Ok(one),
        [] => Err(ToolError::new(
            ErrorCode::NotFound,
            format!(
                "{what} `{}` does not exist: no {what} id is or starts with it ({listed})",
                monad_protocol::text::printable(prefix)
            ),
        )),
        several => Err(ToolError::new(
            ErrorCode::InvalidArguments,
            format!(
                "`{}` is the start of {} {what} ids ({}): give more of it",
                monad_protocol::text::printable(prefix),
                several.len(),
                several
                    .iter()
                    .take(5)
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
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
pub(crate) mod tests {
    use super::*;
    use crate::executor::link::{Conn, memory};
    use crate::store::FsStore;

    /// A folder named `name` of device `d1` or `d2` at `path`, offline (no client).
    fn folder_of(name: &str, device: &str, path: &str) -> Attached {
        Attached {
            name: name.into(),
            uri: format!("{device}:{path}"),
            trust: Trust::Restricted,
            tools: vec![ToolName::ReadFile, ToolName::RunCommand],
            device_id: DeviceId::parse(match device {
                "d1" => "00000000-0000-4000-8000-0000000000d1",
                _ => "00000000-0000-4000-8000-0000000000d2",
            })
            .unwrap(),
            path: path.into(),
            record: None,
            folder: None,
            network: None,
            link: None,
        }
    }

    /// The URI and record workspace `name` of `s` has now, as a call started there has them.
    fn uri_in(s: &Session, name: &str) -> (String, Option<String>) {
        s.workspaces()
            .into_iter()
            .find(|w| w.info.name == name)
            .map(|w| (w.info.uri, w.record))
            .unwrap_or_default()
    }

    fn registry(dir: &Path) -> Registry {
        Registry::new(dir, Arc::new(FsStore::new(dir)), Layers::default())
    }

    /// Writes the `config.toml` of session `id` under data dir `dir` that refuses folders
    /// attached with full trust (`attach.allow_full_trust = false`).
    pub(crate) fn refusing_full_trust(dir: &Path, id: &str) {
        let session = dir.join("sessions").join(id);
        std::fs::create_dir_all(&session).unwrap();
        std::fs::write(
            session.join("config.toml"),
            "[attach]\nallow_full_trust = false\n",
        )
        .unwrap();
    }

    /// A live attachment of the folder `~/two` of `ana`'s laptop into session `home`, of
    /// `generation` and with `trust`, noted in `reg`; the receiver hears it being taken over.
    fn live_folder(
        reg: &Registry,
        home: &str,
        generation: u64,
        trust: Trust,
    ) -> (
        Attached,
        tokio::sync::mpsc::UnboundedReceiver<String>,
        memory::Peer,
    ) {
        live_folder_at(reg, home, generation, trust, None)
    }

    /// [`live_folder`], its absolute path on the laptop `folder` (what a host's roots match).
    pub(crate) fn live_folder_at(
        reg: &Registry,
        home: &str,
        generation: u64,
        trust: Trust,
        folder: Option<&str>,
    ) -> (
        Attached,
        tokio::sync::mpsc::UnboundedReceiver<String>,
        memory::Peer,
    ) {
        let (conn, peer) = memory::pair();
        let (kick, kicked) = tokio::sync::mpsc::unbounded_channel();
        let folder = Attached {
            name: "two".into(),
            uri: "laptop:~/two".into(),
            trust,
            tools: ToolName::ALL.to_vec(),
            device_id: DeviceId::parse("00000000-0000-4000-8000-000000000001").unwrap(),
            path: "~/two".into(),
            record: None,
            folder: folder.map(str::to_owned),
            network: None,
            link: Some(ClientLink {
                conn: Conn::Memory(conn),
                attachment: 1,
                generation,
                minor: monad_protocol::wire::PROTOCOL_MINOR,
                kick,
            }),
        };
        drop(reg.link_attached("ana", home, &folder));
        (folder, kicked, peer)
    }

    /// The generation of the link session `s` carries the folder `~/two` over: `None` when it
    /// does not list it, `Some(None)` offline.
    fn carried(s: &Session) -> Option<Option<u64>> {
        s.listed_link(|a| a.path == "~/two")
    }

    /// A folder's own attach into `session`, as the server makes it.
    fn own_attach(reg: &Registry, session: &Session, folder: &Attached) {
        reg.attach_own(session, folder.clone(), None, false)
            .unwrap();
        reg.share_again(folder, session);
    }

    /// A folder shared into another session comes back there when it attaches again, whichever
    /// of the old link's end and the new attach comes first; a landing's share of an older link
    /// never replaces a newer one; a session whose owner detached the folder by name is left
    /// alone; and no share, or share back, stops an attachment that still serves its own
    /// session.
    #[tokio::test]
    async fn a_folder_attached_again_is_shared_back_only_where_an_earlier_share_left_it() {
        const HOST: &str = "00000000-0000-4000-8000-00000000b001";
        const OWN: &str = "00000000-0000-4000-8000-00000000b002";
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path());
        let home = reg.open("default", "ana").unwrap();
        let host = reg.open(HOST, "ana").unwrap();
        let (first, _, _p1) = live_folder(&reg, "default", 1, Trust::Restricted);
        own_attach(&reg, &home, &first);
        assert!(reg.share(&first, &host).is_some());
        assert_eq!(carried(&host), Some(Some(1)));

        // The new attach first, into the same session: the share moves to the new link at
        // once (the old one was just taken over); a landing that saw the old link after that is
        // too late, and refused; the old link's end leaves it alone.
        let (second, _, _p2) = live_folder(&reg, "default", 2, Trust::Restricted);
        own_attach(&reg, &home, &second);
        assert_eq!(carried(&host), Some(Some(2)));
        assert!(reg.share(&first, &host).is_none());
        assert_eq!(carried(&host), Some(Some(2)));
        reg.detach_everywhere(&home, 1);
        assert_eq!(
            (carried(&home), carried(&host)),
            (Some(Some(2)), Some(Some(2)))
        );

        // The new attach first, into another session: the host's session keeps the link that
        // still serves until it ends (nothing is taken over), then gets the new one.
        const ELSEWHERE: &str = "00000000-0000-4000-8000-00000000b003";
        let elsewhere = reg.open(ELSEWHERE, "ana").unwrap();
        let (third, _, _p3) = live_folder(&reg, ELSEWHERE, 3, Trust::Restricted);
        own_attach(&reg, &elsewhere, &third);
        assert_eq!(carried(&host), Some(Some(2)));
        reg.detach_everywhere(&home, 2);
        assert_eq!(carried(&host), Some(Some(3)));
        reg.detach_everywhere(&elsewhere, 3);

        // The old link's end first, the new attach after.
        assert_eq!(carried(&host), Some(None));
        let (fourth, _, _p4) = live_folder(&reg, "default", 4, Trust::Restricted);
        own_attach(&reg, &home, &fourth);
        assert_eq!(carried(&host), Some(Some(4)));

        // Detached there by name while offline: not brought back.
        reg.detach_everywhere(&home, 4);
        host.forget("two", "detached").unwrap();
        let (fifth, mut fifth_kicked, _p5) = live_folder(&reg, "default", 5, Trust::Restricted);
        own_attach(&reg, &home, &fifth);
        assert_eq!(carried(&host), None);

        // A session that had the folder shared in gets an attach of its own: the shared link
        // is let go of, and the attachment it belongs to keeps serving its session.
        let own = reg.open(OWN, "ana").unwrap();
        assert!(reg.share(&fifth, &own).is_some());
        let (mine, mut mine_kicked, _p6) = live_folder(&reg, OWN, 6, Trust::Restricted);
        // One refused (`--name primary`) changes nothing there.
        assert!(
            reg.attach_own(&own, mine.clone(), Some("primary"), true)
                .is_err()
        );
        assert_eq!(carried(&own), Some(Some(5)));
        own_attach(&reg, &own, &mine);
        assert_eq!(
            (carried(&own), carried(&home)),
            (Some(Some(6)), Some(Some(5)))
        );
        assert!(
            fifth_kicked.try_recv().is_err(),
            "the shared attachment was stopped"
        );
        // The folder attached again into the first session: the second keeps its own link.
        let (seventh, mut seventh_kicked, _p7) = live_folder(&reg, "default", 7, Trust::Restricted);
        own_attach(&reg, &home, &seventh);
        reg.detach_everywhere(&home, 5);
        assert_eq!(
            (carried(&own), carried(&home)),
            (Some(Some(6)), Some(Some(7)))
        );
        assert!(
            mine_kicked.try_recv().is_err(),
            "its own attach was taken over"
        );

        // Its own attach ends: the session gets the link that serves on elsewhere, though it is
        // not the newest there ever was.
        reg.detach_everywhere(&own, 6);
        assert_eq!(carried(&own), Some(Some(7)));
        // Detached by name there: the attachment it came from is not stopped.
        reg.forget(&own, "two", "detached by name").unwrap();
        assert_eq!((carried(&own), carried(&home)), (None, Some(Some(7))));
        assert!(
            seventh_kicked.try_recv().is_err(),
            "the shared attachment was stopped"
        );
        // A landing's share never replaces a link that serves its own session.
        let (eighth, mut eighth_kicked, _p8) = live_folder(&reg, OWN, 8, Trust::Restricted);
        own_attach(&reg, &own, &eighth);
        assert!(reg.share(&seventh, &own).is_none());
        assert_eq!(carried(&own), Some(Some(8)));
        assert!(
            eighth_kicked.try_recv().is_err(),
            "its own attach was taken over"
        );

        // Two attaches into one session racing: the second takes the first over there, and
        // the first's share back, late, takes nothing from the second.
        let (ninth, _, _p9) = live_folder(&reg, "default", 9, Trust::Restricted);
        let (tenth, mut tenth_kicked, _p10) = live_folder(&reg, "default", 10, Trust::Restricted);
        reg.detach_everywhere(&home, 7);
        let shared_in = reg.open(HOST, "ana").unwrap();
        reg.attach_own(&home, ninth.clone(), None, false).unwrap();
        assert!(reg.share(&ninth, &shared_in).is_some());
        reg.attach_own(&home, tenth.clone(), None, false).unwrap();
        reg.share_again(&tenth, &home);
        reg.share_again(&ninth, &home);
        assert_eq!(
            (carried(&home), carried(&shared_in)),
            (Some(Some(10)), Some(Some(10)))
        );
        assert!(
            tenth_kicked.try_recv().is_err(),
            "the attach that won was stopped"
        );
    }

    /// A folder attached with full trust is not shared into a session whose settings refuse
    /// such folders, as its own attach there would be refused.
    #[tokio::test]
    async fn a_full_trust_folder_is_not_shared_into_a_session_that_refuses_full_trust() {
        const LOCKED: &str = "00000000-0000-4000-8000-00000000b004";
        let dir = tempfile::tempdir().unwrap();
        refusing_full_trust(dir.path(), LOCKED);
        let reg = registry(dir.path());
        let home = reg.open("default", "ana").unwrap();
        let locked = reg.open(LOCKED, "ana").unwrap();
        assert!(!locked.settings.attach.allow_full_trust);
        let open = reg
            .open("00000000-0000-4000-8000-00000000b003", "ana")
            .unwrap();
        let (full, _, _p) = live_folder(&reg, "default", 1, Trust::Full);
        home.attach(full.clone(), None);
        assert!(reg.share(&full, &locked).is_none());
        assert_eq!(carried(&locked), None);
        assert!(reg.share(&full, &open).is_some());
        let (restricted, _, _p2) = live_folder(&reg, "default", 2, Trust::Restricted);
        home.attach(restricted.clone(), None);
        assert!(reg.share(&restricted, &locked).is_some());
        // Left offline there, it takes the newest live attachment it can: not a full-trust
        // one, newer as it is.
        const ELSEWHERE: &str = "00000000-0000-4000-8000-00000000b005";
        let elsewhere = reg.open(ELSEWHERE, "ana").unwrap();
        let (other, _, _p3) = live_folder(&reg, ELSEWHERE, 3, Trust::Restricted);
        reg.attach_own(&elsewhere, other, None, false).unwrap();
        let (newest, _, _p4) =
            live_folder(&reg, "00000000-0000-4000-8000-00000000b003", 4, Trust::Full);
        reg.attach_own(&open, newest, None, false).unwrap();
        reg.detach_everywhere(&home, 2);
        assert_eq!(carried(&locked), Some(Some(3)));
    }

    #[tokio::test]
    async fn past_the_most_a_session_lists_a_new_folder_takes_the_oldest_offline_ones_place() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path());
        let session = reg.open("default", "ana").unwrap();
        let offline = |i: usize| Attached {
            name: format!("f{i}"),
            uri: format!("laptop:~/f{i}"),
            trust: Trust::Restricted,
            tools: ToolName::ALL.to_vec(),
            device_id: DeviceId::parse("00000000-0000-4000-8000-000000000001").unwrap(),
            path: format!("~/f{i}"),
            record: None,
            folder: None,
            network: None,
            link: None,
        };
        // The oldest is the focus, offline now (its client went away).
        let (two, _kicked, _peer) = live_folder(&reg, "default", 1, Trust::Restricted);
        session.attach(two, None);
        session.set_focus("two").unwrap();
        session.detach(1);
        for i in 1..MAX_FOLDERS {
            session.attach(offline(i), None);
        }
        // The next oldest offline one goes.
        session.attach(offline(MAX_FOLDERS), None);
        let names: Vec<String> = session
            .workspaces()
            .into_iter()
            .map(|w| w.info.name)
            .collect();
        assert_eq!(
            names.len(),
            MAX_FOLDERS + 1,
            "the primary and {MAX_FOLDERS} folders"
        );
        assert!(names.contains(&"two".to_owned()), "the focus stays");
        assert_eq!(session.focus().as_deref(), Some("two"));
        assert!(
            !names.contains(&"f1".to_owned()),
            "the oldest offline one went"
        );
        assert!(names.contains(&format!("f{MAX_FOLDERS}")));
        // Each attach of another path was kept without end: never more than the most.
        for i in MAX_FOLDERS + 1..MAX_FOLDERS * 3 {
            session.attach(offline(i), None);
        }
        assert_eq!(session.workspaces().len(), MAX_FOLDERS + 1);
    }

    /// The roots registry's lock is one user's: another user's landing does not wait behind
    /// it (one lock of every user's held all of them up behind one user's store work), the same
    /// user's does.
    #[test]
    fn the_roots_registry_is_locked_per_user() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path());
        let ana = reg.folders_of("ana");
        let _held = ana.lock().unwrap();
        assert!(
            Arc::ptr_eq(&ana, &reg.folders_of("ana")),
            "one lock per user"
        );
        assert!(
            reg.folders_of("ben").try_lock().is_ok(),
            "another user's is free while ana's is held"
        );
        assert!(reg.folders_of("ana").try_lock().is_err());
    }

    /// Regression: the bindings answered from memory were all forgotten once 65,536 were kept,
    /// so one user reconnecting with ever new device ids sent every user's next calls to the
    /// store. Full, what no longer answers goes first, then the binding user's own.
    #[test]
    fn one_users_many_devices_do_not_empty_the_others_bindings_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let mut reg = registry(dir.path());
        reg.recent_binds_max = 3;
        let device = |n: u32| DeviceId::parse(&format!("00000000-0000-4000-8000-{n:012}")).unwrap();
        let ana = "00000000-0000-4000-8000-00000000a001";
        let ben = "00000000-0000-4000-8000-00000000b001";
        let _ana_session = reg.resolve(Some(ana), "ana", Some(&device(1))).unwrap();
        let _ben_session = reg.resolve(Some(ben), "ben", Some(&device(2))).unwrap();
        for n in 10..20 {
            reg.resolve(Some(ben), "ben", Some(&device(n))).unwrap();
        }
        assert!(
            reg.resolve_in_memory(Some(ana), "ana", Some(&device(1)))
                .is_some(),
            "ana's binding is still answered from memory"
        );
        assert!(reg.recent_binds.lock().unwrap().len() <= 3);
        // Ben's latest is kept.
        assert!(
            reg.resolve_in_memory(Some(ben), "ben", Some(&device(19)))
                .is_some()
        );
    }

    #[test]
    fn a_loaded_session_bound_to_the_device_is_resolved_from_memory_and_nothing_else_is() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path());
        let id = "00000000-0000-4000-8000-00000000a001";
        let dev = DeviceId::parse("00000000-0000-4000-8000-000000000001").unwrap();
        let other = DeviceId::parse("00000000-0000-4000-8000-000000000002").unwrap();
        // Not loaded yet: the store must be asked.
        assert!(reg.resolve_in_memory(Some(id), "ana", Some(&dev)).is_none());
        let s = reg.resolve(Some(id), "ana", Some(&dev)).unwrap();
        let again = reg.resolve_in_memory(Some(id), "ana", Some(&dev));
        assert!(Arc::ptr_eq(&s, &again.unwrap().unwrap()));
        // Without a device there is nothing to bind.
        assert!(reg.resolve_in_memory(Some(id), "ana", None).is_some());
        // Another device of the same user was never bound to it here: the store decides.
        assert!(
            reg.resolve_in_memory(Some(id), "ana", Some(&other))
                .is_none()
        );
        // Another user is refused, from memory as from the store.
        let err = reg
            .resolve_in_memory(Some(id), "ben", None)
            .unwrap()
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Unauthorized);
        // `default` is answered from memory for the user whose it is, once loaded; another
        // user's `default` is a session of their own, which the store finds.
        assert!(
            reg.resolve_in_memory(Some("default"), "ana", None)
                .is_none()
        );
        let default = reg.resolve(Some("default"), "ana", Some(&dev)).unwrap();
        let again = reg.resolve_in_memory(Some("default"), "ana", Some(&dev));
        assert!(Arc::ptr_eq(&default, &again.unwrap().unwrap()));
        assert!(
            reg.resolve_in_memory(Some("default"), "ben", None)
                .is_none()
        );
        let ben = reg.resolve(Some("default"), "ben", None).unwrap();
        assert_ne!(ben.id, "default");
        // A prefix and no session at all always go to the store.
        assert!(reg.resolve_in_memory(Some(&id[..8]), "ana", None).is_none());
        assert!(reg.resolve_in_memory(None, "ana", Some(&dev)).is_none());
        // Deleted, then opened again under the same id: a new session, bound afresh.
        drop(s);
        reg.delete(id).unwrap();
        reg.open(id, "ana").unwrap();
        assert!(reg.resolve_in_memory(Some(id), "ana", Some(&dev)).is_none());
    }

    #[test]
    fn a_session_remembers_where_its_processes_run_and_forgets_ended_ones_first() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path());
        let s = reg.resolve(Some("default"), "ana", None).unwrap();
        s.attach(folder_of("lap", "d1", "~/lap"), None);
        let started = |id: &str, workspace: &str| {
            let result = monad_protocol::wire::ToolResult::from(serde_json::json!({"process": id}));
            let (uri, record) = uri_in(&s, workspace);
            s.note_process(
                ToolName::RunCommand,
                &result,
                workspace,
                &uri,
                record.as_deref(),
            );
        };
        let ended = |id: &str, workspace: &str| {
            let result = serde_json::json!({"process": id, "running": false}).into();
            let (uri, record) = uri_in(&s, workspace);
            s.note_process(
                ToolName::ProcessRead,
                &result,
                workspace,
                &uri,
                record.as_deref(),
            );
        };
        let p = |i: usize| format!("proc-{:08x}", 0x100 + i);
        let (server, build) = ("proc-0000000a", "proc-0000000b");
        started(server, "lap");
        started(build, "primary");
        // Another workspace's result cannot take it over, nor end it; an id that no sandbox
        // makes is not kept.
        started(build, "lap");
        ended(build, "lap");
        started("build", "lap");
        assert_eq!(s.process_workspace("build"), None);
        assert_eq!(s.process_workspaces(), ["lap", "primary"]);
        // Read to its end: still found by its id, no longer a workspace to list.
        ended(build, "primary");
        assert_eq!(s.process_workspace(build).as_deref(), Some("primary"));
        assert_eq!(s.process_workspaces(), ["lap"]);
        // Ended ones go before the oldest still kept, however many ran since.
        for i in 0..MAX_REMEMBERED_PROCESSES {
            started(&p(i), "primary");
            ended(&p(i), "primary");
        }
        assert_eq!(s.process_workspace(server).as_deref(), Some("lap"));
        assert_eq!(s.process_workspace(build), None);
        assert_eq!(s.process_workspace(&p(0)), None);
        let last = p(MAX_REMEMBERED_PROCESSES - 1);
        assert_eq!(s.process_workspace(&last).as_deref(), Some("primary"));
    }

    #[test]
    fn a_folder_s_processes_follow_its_new_name_and_leave_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path());
        let s = reg.open("default", "ana").unwrap();
        let folder = |device: &str, path: &str| folder_of("lap", device, path);
        let started_in = |id: &str, workspace: &str, (uri, record): &(String, Option<String>)| {
            let result = monad_protocol::wire::ToolResult::from(serde_json::json!({"process": id}));
            s.note_process(
                ToolName::RunCommand,
                &result,
                workspace,
                uri,
                record.as_deref(),
            );
        };
        let started = |id: &str, workspace: &str| started_in(id, workspace, &uri_in(&s, workspace));
        assert_eq!(s.attach(folder("d1", "~/a"), None).name, "lap");
        started("proc-0000000a", "lap");
        // Renamed by its own attach: the process is found in the folder by its new name.
        s.attach_exact(folder("d1", "~/a"), "work").unwrap();
        assert_eq!(
            s.process_workspace("proc-0000000a").as_deref(),
            Some("work")
        );
        started("proc-0000000b", "work");
        // Renamed while a call ran there: the process it started is found by the new name.
        let before = uri_in(&s, "work");
        s.attach_exact(folder("d1", "~/a"), "job").unwrap();
        started_in("proc-0000000f", "work", &before);
        assert_eq!(s.process_workspace("proc-0000000f").as_deref(), Some("job"));
        s.attach_exact(folder("d1", "~/a"), "work").unwrap();
        // Detached by name, then another folder takes the name: it gets none of them, nor the
        // process of a call that started in the first folder and ends only now.
        let before = uri_in(&s, "work");
        s.forget("work", "detached").unwrap();
        s.attach_exact(folder("d2", "~/b"), "work").unwrap();
        started_in("proc-0000000d", "work", &before);
        assert_eq!(s.process_workspace("proc-0000000a"), None);
        assert_eq!(s.process_workspace("proc-0000000b"), None);
        assert_eq!(s.process_workspace("proc-0000000d"), None);
        assert!(s.process_workspaces().is_empty());
        // Nor does a folder of another machine with the same host name, at the same path: the
        // same URI, another device's workspace record.
        let of_device = |device: &str, record: &str| Attached {
            uri: "host:~/p".into(),
            record: Some(record.into()),
            ..folder_of("same", device, "~/p")
        };
        s.attach_exact(of_device("d1", "rec-1"), "same").unwrap();
        let before = uri_in(&s, "same");
        s.forget("same", "detached").unwrap();
        s.attach_exact(of_device("d2", "rec-2"), "same").unwrap();
        assert_eq!(uri_in(&s, "same").0, before.0, "the same URI");
        started_in("proc-0000000e", "same", &before);
        assert_eq!(s.process_workspace("proc-0000000e"), None);
        s.forget("same", "detached").unwrap();
        // An offline folder that leaves the list for a new one takes its processes with it.
        started("proc-0000000c", "work");
        assert_eq!(s.attach(folder("d1", "~/c"), None).name, "lap");
        for i in 0..MAX_FOLDERS {
            s.attach(folder("d1", &format!("~/more/{i}")), None);
        }
        let names: Vec<String> = s.workspaces().into_iter().map(|w| w.info.name).collect();
        assert!(!names.contains(&"work".to_owned()), "{names:?}");
        assert_eq!(s.process_workspace("proc-0000000c"), None);
    }

    #[test]
    fn an_age_is_old_at_or_before_the_cutoff_and_an_unreadable_one_is_never_old() {
        let cutoff = "2026-01-10T00:00:00Z";
        for old in [
            "2026-01-10T00:00:00Z",
            "2020-01-01T00:00:00Z",
            "2026-01-09T23:59:59.999Z",
            "2026-01-09T12:00:00+00:00",
        ] {
            assert_eq!(inactive_since(old, cutoff), Age::Old, "{old}");
        }
        for recent in ["2026-01-10T00:00:01Z", "2027-01-01T00:00:00z"] {
            assert_eq!(inactive_since(recent, cutoff), Age::Recent, "{recent}");
        }
        for bad in [
            "",
            "last tuesday",
            "2026-01-09",
            "2026-01-09T00:00:00",
            "2026-01-09T00:00:00+02:00",
            "2026-13-09T00:00:00Z",
            "2026-01-09T24:00:00Z",
            "0000-01-01T00:00:00Z",
            "2026-01-09T00:00:00.Z",
            "2026-01-09T00:00:0é",
            "2026-01-09 00:00:00Z",
        ] {
            assert_eq!(inactive_since(bad, cutoff), Age::Unreadable, "{bad:?}");
        }
    }

    #[test]
    fn sessions_are_created_reused_and_owned() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path());
        let s = reg.open("default", "ana").unwrap();
        assert!(dir.path().join("sessions/default/workspace").is_dir());
        assert!(dir.path().join("sessions/default/session.toml").is_file());
        assert!(dir.path().join("sessions/default/session.md").is_file());
        assert!(Arc::ptr_eq(&s, &reg.open("default", "ana").unwrap()));
        let err = reg.open("default", "ben").unwrap_err();
        assert_eq!(err.code, ErrorCode::Unauthorized);
        // After a restart (a new registry), ownership still holds.
        let reg2 = registry(dir.path());
        assert_eq!(
            reg2.open("default", "ben").unwrap_err().code,
            ErrorCode::Unauthorized
        );
        assert_eq!(reg2.list("ana").unwrap().len(), 1);
        assert!(reg2.list("ben").unwrap().is_empty());
    }

    #[test]
    fn racing_opens_of_a_new_session_all_get_the_same_one() {
        let dir = tempfile::tempdir().unwrap();
        let registry = registry(dir.path());
        let id = "aaaaaaaa-0000-4000-8000-0000000000aa";
        let barrier = std::sync::Barrier::new(8);
        let opened: Vec<Result<Arc<Session>, ToolError>> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..8)
                .map(|i| {
                    let (registry, barrier) = (&registry, &barrier);
                    scope.spawn(move || {
                        barrier.wait();
                        registry.open(id, if i < 4 { "ana" } else { "bo" })
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let winners: Vec<&Arc<Session>> = opened.iter().filter_map(|r| r.as_ref().ok()).collect();
        let owner = winners[0].owner.clone();
        for session in &winners {
            assert!(Arc::ptr_eq(session, winners[0]), "one session in memory");
            assert_eq!(session.owner, owner);
        }
        // Exactly the first creator's callers get it; the other user's are refused.
        assert_eq!(winners.len(), 4, "{opened:?}");
        for refused in opened.iter().filter_map(|r| r.as_ref().err()) {
            assert!(refused.message.contains("another user"), "{refused}");
        }
        let on_disk = registry.store.load(id).unwrap().unwrap();
        assert_eq!(on_disk.owner, owner);
    }

    #[test]
    fn every_user_gets_a_default_of_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path());
        let dev =
            |n: u8| DeviceId::parse(&format!("00000000-0000-4000-8000-0000000000{n:02x}")).unwrap();
        let ana = reg.resolve(None, "ana", Some(&dev(1))).unwrap();
        assert_eq!(
            ana.id, "default",
            "the first user gets the well-known default"
        );
        let ben = reg.resolve(None, "ben", Some(&dev(2))).unwrap();
        assert_ne!(ben.id, "default");
        assert_eq!(ben.owner, "ben");
        // Stable: the same default next time, from any device, and after a restart.
        assert_eq!(reg.resolve(None, "ben", Some(&dev(3))).unwrap().id, ben.id);
        let again = registry(dir.path());
        assert_eq!(again.resolve(None, "ben", None).unwrap().id, ben.id);
        // A device id another user bound (to their own session) means nothing to ben.
        reg.bind("ana", &dev(4), &ana.id);
        assert_eq!(reg.resolve(None, "ben", Some(&dev(4))).unwrap().id, ben.id);
        assert_eq!(reg.resolve(None, "ana", Some(&dev(4))).unwrap().id, ana.id);
        // Naming `default` means one's own default, never another user's.
        assert_eq!(
            reg.resolve(Some("default"), "ben", Some(&dev(5)))
                .unwrap()
                .id,
            ben.id
        );
        assert_eq!(
            reg.resolve(Some("default"), "ana", None).unwrap().id,
            "default"
        );
        assert_eq!(
            reg.open("default", "ben").unwrap_err().code,
            ErrorCode::Unauthorized
        );
    }

    #[test]
    fn a_user_over_the_memory_bound_loses_their_least_recently_used_idle_session() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path()).with_quotas(2, 100);
        let id = |n: u8| format!("00000000-0000-4000-8000-0000000000{n:02x}");
        let held = reg.open(&id(1), "ana").unwrap();
        reg.open(&id(2), "ana").unwrap();
        reg.open(&id(3), "ana").unwrap();
        let loaded = |reg: &Registry| {
            let mut ids: Vec<String> = reg.sessions.lock().unwrap().keys().cloned().collect();
            ids.sort();
            ids
        };
        // 2 went (1 is held), not 1; ben's sessions are his own count.
        assert_eq!(loaded(&reg), [id(1), id(3)]);
        reg.open(&id(4), "ben").unwrap();
        reg.open(&id(5), "ben").unwrap();
        assert_eq!(loaded(&reg).len(), 4);
        // Every session of ana's in use: refused, saying what to do.
        let other = reg.open(&id(3), "ana").unwrap();
        let err = reg.open(&id(6), "ana").unwrap_err();
        assert_eq!(err.code, ErrorCode::LimitExceeded);
        assert!(
            err.message.contains("max_sessions_in_memory_per_user"),
            "{err}"
        );
        drop((held, other));
        reg.open(&id(6), "ana").unwrap();
        assert!(
            reg.open(&id(2), "ana").is_ok(),
            "an evicted session loads again"
        );
    }

    #[test]
    fn a_user_over_the_stored_bound_cannot_create_more() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path()).with_quotas(100, 3);
        let ids: Vec<String> = (0..3)
            .map(|_| reg.create("ana").unwrap().id.clone())
            .collect();
        let err = reg.create("ana").unwrap_err();
        assert_eq!(err.code, ErrorCode::LimitExceeded);
        assert!(err.message.contains("max_sessions_per_user"), "{err}");
        for id in &ids {
            reg.open(id, "ana").unwrap();
        }
        reg.create("ben").unwrap();
        // Racing creations do not pass the bound together.
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path()).with_quotas(100, 5);
        let made = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..12)
                .map(|_| scope.spawn(|| reg.create("ana").is_ok()))
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().unwrap())
                .filter(|ok| *ok)
                .count()
        });
        assert_eq!(made, 5);
        assert_eq!(reg.store().count_sessions("ana").unwrap(), 5);
    }

    #[test]
    fn a_session_that_is_only_listed_or_looked_at_opens_no_directory() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path());
        let s = reg.open("default", "ana").unwrap();
        s.info();
        reg.list("ana").unwrap();
        assert!(!s.primary.is_open());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let sandbox = runtime.block_on(s.primary.sandbox()).unwrap();
        assert!(s.primary.is_open());
        let again = runtime.block_on(s.primary.sandbox()).unwrap();
        assert!(Arc::ptr_eq(&sandbox, &again), "opened once");
    }

    #[test]
    fn session_ids_must_be_default_or_uuids() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path());
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
        let fresh = reg.create("ana").unwrap();
        assert!(uuid::Uuid::parse_str(&fresh.id).is_ok());
    }

    #[test]
    fn a_session_is_given_up_to_another_host_only_by_its_owner_and_while_nothing_uses_it() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path());
        let s = reg.create("ana").unwrap();
        let id = s.id.clone();
        // Held by a request: kept, saying why.
        let kept = reg.give_up(&id, "ana").unwrap_err();
        assert_eq!(kept.code, ErrorCode::Denied);
        assert!(kept.message.contains("request is using it"), "{kept:?}");
        // Another user's: refused, kept.
        drop(s);
        assert_eq!(
            reg.give_up(&id, "bob").unwrap_err().code,
            ErrorCode::Unauthorized
        );
        assert_eq!(reg.loaded(), 1);
        // Followed by a watcher (an MCP host): kept.
        let watcher = reg.open(&id, "ana").unwrap().subscribe();
        let kept = reg.give_up(&id, "ana").unwrap_err();
        assert!(kept.message.contains("follows its workspaces"), "{kept:?}");
        drop(watcher);
        // Unused: it leaves memory, and stays in the store; not in memory, nothing to do.
        assert!(reg.give_up(&id, "ana").unwrap());
        assert_eq!(reg.loaded(), 0);
        assert!(!reg.give_up(&id, "ana").unwrap());
        assert!(reg.list("ana").unwrap().iter().any(|info| info.id == id));
    }

    /// A session dropped from memory is let go (its activity saved; with several hosts, its
    /// lease given up) after the registry's lock is released: an open of it meanwhile waits,
    /// then reads what was saved. Before, it loaded the session at once, without the activity
    /// being saved, and a call was routed here on the lease about to be given up.
    /// A session of ana's with activity not saved yet (saves come once a minute), taken out of
    /// memory as an unload's first half does, under the registry's lock: its id, its activity,
    /// and it leaving ([`Registry::let_go`] ends that).
    fn leaving_with_unsaved_activity(reg: &Registry) -> (String, String, Arc<Session>) {
        let session = reg.create("ana").unwrap();
        let id = session.id.clone();
        // Activity a second after the creation.
        std::thread::sleep(Duration::from_millis(1100));
        assert!(session.touch().is_none());
        let active = session.meta().last_active;
        drop(session);
        let leaving = {
            let mut sessions = reg.sessions.lock().unwrap();
            reg.take_out(&mut sessions, &id).unwrap()
        };
        (id, active, leaving)
    }

    #[test]
    fn an_open_of_a_session_leaving_memory_waits_until_it_has_left() {
        let dir = tempfile::tempdir().unwrap();
        let reg = Arc::new(registry(dir.path()));
        let (id, active, leaving) = leaving_with_unsaved_activity(&reg);
        let opener = std::thread::spawn({
            let (reg, id) = (reg.clone(), id.clone());
            move || reg.open(&id, "ana").unwrap().meta().last_active
        });
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !opener.is_finished(),
            "the open waits for the session to leave"
        );
        reg.let_go(&leaving);
        assert_eq!(
            opener.join().unwrap(),
            active,
            "loaded again with the activity saved on its way out"
        );
        // Not leaving any more: opened at once.
        assert!(reg.leaving.wait(&id, Duration::ZERO));
    }

    /// Regression: `sessions use alpha` said no session `alpha` exists, while `sessions` listed
    /// one of that name: a name that is no id's start names the one session that has it.
    #[test]
    fn a_sessions_name_finds_it_when_one_has_it() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path());
        let alpha = reg.create("ana").unwrap();
        alpha.set_name("alpha".into());
        let dup1 = reg.create("ana").unwrap();
        dup1.set_name("dup".into());
        let dup2 = reg.create("ana").unwrap();
        dup2.set_name("dup".into());
        let bobs = reg.create("bob").unwrap();
        bobs.set_name("theirs".into());
        assert_eq!(reg.open_existing("alpha", "ana").unwrap().id, alpha.id);
        let e = reg.open_existing("dup", "ana").unwrap_err();
        assert!(e.message.contains("is the name of 2 sessions"), "{e}");
        assert_eq!(
            reg.open_existing("theirs", "ana").unwrap_err().code,
            ErrorCode::NotFound
        );
        // An id's start still wins.
        let start = &alpha.id[..8];
        assert_eq!(reg.open_existing(start, "ana").unwrap().id, alpha.id);
    }

    /// Regression: a delete while the session left memory (an idle unload) went ahead at
    /// once, and the unload's save of its activity then wrote the deleted session back.
    #[test]
    fn a_delete_of_a_session_leaving_memory_waits_for_its_save() {
        let dir = tempfile::tempdir().unwrap();
        let reg = Arc::new(registry(dir.path()));
        let (id, _, leaving) = leaving_with_unsaved_activity(&reg);
        let deleter = std::thread::spawn({
            let (reg, id) = (reg.clone(), id.clone());
            move || reg.delete(&id)
        });
        std::thread::sleep(Duration::from_millis(200));
        reg.let_go(&leaving);
        deleter.join().unwrap().unwrap();
        assert!(reg.store().load(&id).unwrap().is_none(), "written back");
        assert!(!dir.path().join("sessions").join(&id).exists());
    }

    #[test]
    fn bindings_gc_delete_and_unloading() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path());
        let dev = DeviceId::parse("00000000-0000-4000-8000-000000000001").unwrap();
        assert_eq!(reg.bound("ana", Some(&dev)).unwrap(), "default");
        let s = reg.create("ana").unwrap();
        reg.bind("ana", &dev, &s.id);
        assert_eq!(reg.bound("ana", Some(&dev)).unwrap(), s.id);
        reg.open("default", "ana").unwrap();
        // A session a caller still holds (a request between opening it and using it) stays.
        assert_eq!(reg.unload_idle(Duration::ZERO), 1);
        assert_eq!(reg.loaded(), 1);
        let id = s.id.clone();
        drop(s);
        assert_eq!(reg.unload_idle(Duration::ZERO), 1);
        assert_eq!(reg.loaded(), 0);
        assert_eq!(
            reg.list("ana").unwrap().len(),
            2,
            "unloaded sessions stay on disk"
        );
        // Another user's default is a session of their own (the well-known `default` is
        // ana's): no gc or purge takes it either (it did, and their notes went with it).
        let bos_default = reg.bound("bo", None).unwrap();
        assert_ne!(bos_default, "default");
        reg.open(&bos_default, "bo").unwrap();
        assert_eq!(reg.unload_idle(Duration::ZERO), 1);
        // Nothing is older than a day; everything but the defaults is older than "now".
        assert!(reg.gc(Duration::from_secs(86_400)).unwrap().is_empty());
        std::thread::sleep(Duration::from_millis(1100));
        let deleted = reg.gc(Duration::ZERO).unwrap();
        assert_eq!(deleted, vec![id.clone()]);
        assert_eq!(
            reg.bound("bo", None).unwrap(),
            bos_default,
            "bo's default stays"
        );
        assert_eq!(
            reg.bound("ana", Some(&dev)).unwrap(),
            "default",
            "the binding went with the session"
        );
        assert!(!dir.path().join("sessions").join(&id).exists());
        assert!(
            dir.path().join("sessions/default").exists(),
            "never default"
        );
        reg.delete("default").unwrap();
        assert!(reg.list("ana").unwrap().is_empty());
    }

    /// Regression: an open of a session whose delete had removed its rows but not finished
    /// created it again on disk (empty), then was refused as "being deleted": the delete left
    /// that empty session behind. It is not created while its delete runs.
    #[test]
    fn an_open_during_a_delete_does_not_create_the_session_again() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path());
        let id = "4b7f3d2e-9c1a-4e5b-8f6d-2a3b4c5d6e7f";
        // Its rows gone, its delete not done: as `delete` leaves it between the two.
        reg.deleting.lock().unwrap().insert(id.to_owned());
        let refused = reg.open(id, "ana").unwrap_err();
        assert_eq!(refused.code, ErrorCode::NotFound, "{refused:?}");
        assert!(refused.message.contains("being deleted"), "{refused:?}");
        assert!(reg.store.load(id).unwrap().is_none(), "not created again");
        reg.deleting.lock().unwrap().remove(id);
        reg.open(id, "ana").unwrap();
        assert!(
            reg.store.load(id).unwrap().is_some(),
            "created once its delete is done"
        );
    }

    /// Regression: `session gc` and the auto-purge listed the sessions unused for their age,
    /// then deleted them one by one without looking again: one used after the listing (files
    /// written, a conversation) went all the same, and came back empty at its next call. Its
    /// age is looked at again when it is deleted: in memory, or in the store.
    #[test]
    fn gc_keeps_a_session_used_after_it_was_found_unused() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path());
        let month = Duration::from_secs(30 * 86_400);
        let s = reg.create("ana").unwrap();
        let id = s.id.clone();
        let aged = |reg: &Registry| {
            let mut meta = reg.store.load(&id).unwrap().unwrap();
            meta.last_active = "2025-01-01T00:00:00Z".into();
            reg.store.save(&meta).unwrap();
        };
        drop(s);
        assert_eq!(reg.unload_idle(Duration::ZERO), 1);
        aged(&reg);
        let listed: Vec<String> = reg
            .unused_for(month)
            .unwrap()
            .into_iter()
            .map(|m| m.id)
            .collect();
        assert_eq!(listed, std::slice::from_ref(&id));
        // Used in memory since: kept.
        let used = reg.open(&id, "ana").unwrap();
        if let Some(meta) = used.touch() {
            reg.store.save(&meta).unwrap();
        }
        drop(used);
        let kept = reg.delete_unused(&id, Some(month)).unwrap_err();
        assert_eq!(kept.code, ErrorCode::Denied, "{kept:?}");
        assert!(reg.store.load(&id).unwrap().is_some());
        // Used, and gone from memory again (its activity saved): kept, by the store's word.
        assert_eq!(reg.unload_idle(Duration::ZERO), 1);
        let kept = reg.delete_unused(&id, Some(month)).unwrap_err();
        assert_eq!(kept.code, ErrorCode::Denied, "{kept:?}");
        assert!(reg.store.load(&id).unwrap().is_some());
        // Opened again: it was not left marked as being deleted.
        drop(reg.open(&id, "ana").unwrap());
        assert_eq!(reg.unload_idle(Duration::ZERO), 1);
        // Still unused: deleted.
        aged(&reg);
        reg.delete_unused(&id, Some(month)).unwrap();
        assert!(reg.store.load(&id).unwrap().is_none());
    }

    /// A delete the store refuses (here its directory's parent made immutable, which binds
    /// root too) leaves the session whole, its devices bound; a delete of a session already
    /// gone (one cut short by a crash before) unbinds what still names it.
    #[test]
    fn a_refused_delete_keeps_the_bindings_and_a_delete_of_a_gone_session_drops_them() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path());
        let dev = DeviceId::parse("00000000-0000-4000-8000-000000000002").unwrap();
        let s = reg.create("ana").unwrap();
        reg.bind("ana", &dev, &s.id);
        let id = s.id.clone();
        drop(s);
        assert_eq!(reg.unload_idle(Duration::ZERO), 1);
        let sessions = dir.path().join("sessions");
        let chattr = |flag: &str| {
            std::process::Command::new("chattr")
                .arg(flag)
                .arg(&sessions)
                .status()
                .unwrap()
                .success()
        };
        assert!(
            chattr("+i"),
            "this test sets the immutable flag (root, on ext4 or the like)"
        );
        let refused = reg.delete(&id);
        assert!(chattr("-i"));
        assert!(refused.is_err(), "the store could not remove it");
        assert_eq!(reg.store().devices_bound_to(&id).unwrap(), 1);
        // Gone as a crash after the removal would leave it: the binding is still there.
        std::fs::remove_dir_all(sessions.join(&id)).unwrap();
        assert_eq!(reg.delete(&id).unwrap_err().code, ErrorCode::NotFound);
        assert_eq!(reg.store().devices_bound_to(&id).unwrap(), 0);
    }

    /// A call's records still in the recorder when its session is deleted (its metadata's last
    /// use, sent as the call ended) must not put the session back once they are written.
    #[test]
    fn records_still_in_the_recorder_do_not_bring_a_deleted_session_back() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(FsStore::new(dir.path()));
        let recorder = crate::recorder::Recorder::start(store.clone());
        let reg = Registry::new(dir.path(), store.clone(), Layers::default())
            .with_recorder(recorder.clone());
        let s = reg.create("ana").unwrap();
        let id = s.id.clone();
        let meta = s.meta();
        drop(s);
        // As a call's end does: the session's metadata to the recorder, which gathers it for
        // a while before writing.
        recorder.save_meta(meta);
        reg.delete(&id).unwrap();
        recorder.flush();
        assert!(
            store.load(&id).unwrap().is_none(),
            "the deleted session came back"
        );
        assert!(!dir.path().join("sessions").join(&id).exists());
    }

    #[test]
    fn session_lists_page_by_recent_activity() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path());
        for i in 0..45u64 {
            let s = reg.create("ana").unwrap();
            let mut meta = s.meta();
            // Many ties on purpose.
            meta.last_active = crate::fsutil::rfc3339(1_700_000_000 + i % 6);
            reg.store().save(&meta).unwrap();
        }
        reg.create("ben").unwrap();
        assert_eq!(reg.unload_idle(Duration::ZERO), 46);
        let busy = reg.create("ana").unwrap();
        busy.touch();
        let all = reg.list("ana").unwrap();
        assert_eq!(all.len(), 46);
        assert_eq!(all[0].id, busy.id, "live activity counts");
        for limit in [1, 7, 46, 100] {
            let mut walked = Vec::new();
            let mut next = None;
            loop {
                let (page, token) = reg.list_page("ana", limit, next.as_deref()).unwrap();
                assert!(page.len() <= limit);
                walked.extend(page);
                match token {
                    Some(token) => next = Some(token),
                    None => break,
                }
            }
            assert_eq!(walked, all, "limit {limit}");
        }
        for (limit, token) in [(0, None), (101, None), (5, Some("zz")), (5, Some("00"))] {
            assert_eq!(
                reg.list_page("ana", limit, token).unwrap_err().code,
                ErrorCode::InvalidArguments
            );
        }
    }

    #[test]
    fn attach_names_are_unique_and_reconnects_keep_theirs() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path());
        let s = reg.open("default", "ana").unwrap();
        let folder = |device: &str, path: &str| folder_of("monad", device, path);
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

    #[test]
    fn the_focus_must_be_a_workspace_of_the_session_that_is_online() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry(dir.path());
        let s = reg.open("default", "ana").unwrap();
        assert_eq!(s.focus(), None);
        s.attach(
            Attached {
                name: "lap".into(),
                uri: "laptop:~/lap".into(),
                trust: Trust::Restricted,
                tools: vec![ToolName::ReadFile],
                device_id: DeviceId::parse("00000000-0000-4000-8000-0000000000d1").unwrap(),
                path: "~/lap".into(),
                record: None,
                folder: None,
                network: None,
                link: None,
            },
            None,
        );
        let err = s.set_focus("nope").unwrap_err();
        assert_eq!(err.code, ErrorCode::WorkspaceNotFound);
        // Offline (no client connected): refused, and nothing changes.
        let err = s.set_focus("lap").unwrap_err();
        assert_eq!(err.code, ErrorCode::WorkspaceDisconnected);
        assert_eq!(s.focus(), None);
        let mut changes = s.subscribe();
        changes.mark_unchanged();
        s.set_focus(&s.primary_uri()).unwrap();
        assert_eq!(
            s.focus().as_deref(),
            Some("primary"),
            "by URI, kept by name"
        );
        assert!(changes.has_changed().unwrap(), "watchers hear of it");
        s.clear_focus();
        assert_eq!(s.focus(), None);
    }

    #[test]
    fn short_names_keep_no_bidi_format_or_invisible_characters() {
        for (raw, name) in [
            ("invoice\u{202e}txt.exe", "invoicetxt.exe"),
            ("a\u{200b}b\u{2066}c\u{ad}d", "abcd"),
            ("report\u{fe0f}", "report"),
            ("x\u{34f}\u{3164}\u{e0100}\u{e0001}y", "xy"),
            ("\u{feff}\u{202e}", "folder"),
            ("tab\tline\nend", "tablineend"),
            ("a/b:c\\d", "abcd"),
            ("projet é 漢字", "projet é 漢字"),
        ] {
            assert_eq!(sanitize_name(raw), name, "{raw:?}");
        }
    }
}
