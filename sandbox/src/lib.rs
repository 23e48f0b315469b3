//! Monad's sandbox: the jail every tool call runs in, on the server and on attached clients.
//!
//! - [`Jail`] holds a workspace root as an open [`cap_std::fs::Dir`]. Its constructor,
//!   [`Jail::open_ambient`], is the only place a path is opened with ambient authority; every
//!   path from a tool argument is checked by [`Jail::resolve`] and opened through the handle, so
//!   `..`, absolute paths, symbolic links and magic links cannot lead outside the root, even when
//!   another process swaps links while a call runs.
//! - [`Sandbox`] is a jail plus its [`Limits`] and [`ExecPolicy`]; it runs the workspace tools
//!   (`read_file`, `list_dir`, `stat`, `search`, `glob`, `write_file`, `edit_file`,
//!   `run_command`), typed through [`monad_protocol::tools`] or by name with JSON through
//!   [`Sandbox::call`].
//! - Commands run under landlock, applied in the child only, with rlimits, a scrubbed
//!   environment, a time limit that kills the whole process group and capped output
//!   (see [`exec`]). A kernel that cannot enforce landlock refuses commands unless the operator
//!   set [`ExecPolicy::allow_unsandboxed_exec`].
//!
//! - [`Sandbox::check`] says whether a call can run at all (its arguments parse, what they name
//!   exists, a command's program can be run), without running it, so that nobody is asked to
//!   approve a call that cannot run.
//!
//! Errors are [`SandboxError`]s; [`SandboxError::to_tool_error`] turns one into the wire error.
#![deny(missing_docs)]

mod cancel;
mod check;
mod decode;
mod error;
pub mod exec;
mod fs;
mod jail;
mod limits;
mod netlog;
#[allow(unsafe_code)]
mod sched;
mod seen;
#[allow(unsafe_code)]
pub mod signals;
mod walk;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use monad_protocol::ToolName;
use monad_protocol::tools::{
    EditFileArgs, GlobArgs, GlobResult, ListDirArgs, ListDirResult, ProcessKillArgs,
    ProcessListArgs, ProcessReadArgs, ProcessWriteArgs, ReadFileArgs, ReadFileResult,
    RunCommandArgs, RunCommandResult, SearchArgs, SearchResult, StatArgs, StatResult,
    WriteFileArgs, WriteResult,
};
use monad_protocol::wire::ToolResult;
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use error::{EscapeReason, SandboxError};
pub use fs::Preview;
pub use jail::{Jail, JailPath};
pub use limits::{ExecPolicy, Limits, NamespacePolicy, NetworkMode};
pub use netlog::{
    AUDIT_PER_SECOND, AuditAllowance, MAX_FOR_ANSWER, MAX_FOR_AUDIT, NetworkAudit, NetworkBatch,
};
pub use sched::{is_background, run_as_background};
pub use walk::SEARCH_LINE_MAX;

/// A workspace's jail with its limits and command policy: what runs the workspace tools.
#[derive(Debug)]
pub struct Sandbox {
    jail: Jail,
    limits: Limits,
    exec: ExecPolicy,
    /// The root's device, when the root is on a local disk: small reads of files on that same
    /// device may run on the calling task.
    local_device: Option<u64>,
    /// Whether the root's filesystem reports a directory's size in bytes of its entries, so
    /// that small one-level listings may run on the calling task ([`INLINE_LIST_MAX`]).
    lists_inline: bool,
    /// Listings answered on the calling task ([`Sandbox::inline_listings`]).
    inline_listings: AtomicU64,
    /// Background processes (dropped with the sandbox: they are killed).
    processes: exec::process::Table,
    /// Held by each write and edit from its read of the file to its rename: calls run in
    /// parallel (an MCP host sends several at once), and two edits of one file that both read
    /// it first would each replace it with their own change alone, the second losing the first.
    writes: std::sync::Mutex<()>,
    /// What the tools last saw of each file they read or wrote: a `write_file` of one changed
    /// since is refused.
    seen: seen::Seen,
    /// The process groups (cgroups) of the server's users and the user whose group the
    /// commands join, bounded with every other command of that user ([`exec::cgroup`]).
    groups: Option<(Arc<exec::cgroup::ProcessGroups>, String)>,
}

/// Largest file [`Sandbox::call`] reads on the calling task rather than on tokio's blocking pool
/// (see [`Sandbox::call`]).
pub const INLINE_READ_MAX: u64 = 64 * 1024;

/// Largest directory (in the bytes its file system reports as its size) that a one-level
/// [`Sandbox::call`] of `list_dir` lists on the calling task rather than on tokio's blocking
/// pool. On ext4 a directory of 1,000 entries with 13-byte names is 36 KiB; on tmpfs, 20 bytes
/// an entry.
pub const INLINE_LIST_MAX: u64 = 64 * 1024;

/// Whether a filesystem of this kind is known to be a local disk (or memory), where opening and
/// reading a small file takes microseconds. Network and user-space filesystems (NFS,
/// SMB, FUSE, ...) and anything unknown are not: a read there can stall for as long as the
/// network does.
fn on_local_disk(kind: nix::sys::statfs::FsType) -> bool {
    use nix::sys::statfs::{BTRFS_SUPER_MAGIC, OVERLAYFS_SUPER_MAGIC};
    /// ZFS, which nix has no constant for.
    const ZFS_SUPER_MAGIC: u64 = 0x2fc1_2fc1;
    lists_by_size(kind)
        || [BTRFS_SUPER_MAGIC, OVERLAYFS_SUPER_MAGIC].contains(&kind)
        || kind.0 as u64 == ZFS_SUPER_MAGIC
}

/// Whether a local filesystem's directory size grows with the bytes of its entries (ext4 in
/// blocks, XFS, f2fs; tmpfs 20 bytes an entry), so that [`INLINE_LIST_MAX`] bounds the entries a
/// listing on the calling task reads. Not overlayfs (the size is the upper layer's only: a
/// merged directory of 100,000 entries can report 4 KiB), btrfs (twice the names' bytes: 16,000
/// two-byte names fit) or ZFS (the entry count: 65,000 fit).
fn lists_by_size(kind: nix::sys::statfs::FsType) -> bool {
    use nix::sys::statfs::{EXT4_SUPER_MAGIC, F2FS_SUPER_MAGIC, TMPFS_MAGIC, XFS_SUPER_MAGIC};
    [
        EXT4_SUPER_MAGIC, // also ext2 and ext3
        XFS_SUPER_MAGIC,
        F2FS_SUPER_MAGIC,
        TMPFS_MAGIC,
    ]
    .contains(&kind)
}

/// The kind of filesystem `fd` is on; `None` when `fstatfs` fails.
fn filesystem(fd: impl std::os::fd::AsFd) -> Option<nix::sys::statfs::FsType> {
    nix::sys::statfs::fstatfs(fd)
        .ok()
        .map(|stat| stat.filesystem_type())
}

impl Sandbox {
    /// Opens `root` as a workspace (see [`Jail::open_ambient`] on ambient authority).
    pub fn open(root: &Path, limits: Limits, exec: ExecPolicy) -> std::io::Result<Sandbox> {
        limits
            .check()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let jail = Jail::open_ambient(root)?;
        // Unknown (`fstatfs` failed) counts as neither.
        let kind = filesystem(jail.dir());
        let lists_inline = kind.is_some_and(lists_by_size);
        let local_device = if kind.is_some_and(on_local_disk) {
            Some(cap_std::fs::MetadataExt::dev(&jail.dir().dir_metadata()?))
        } else {
            None
        };
        Ok(Sandbox {
            local_device,
            lists_inline,
            inline_listings: AtomicU64::new(0),
            processes: exec::process::Table::new(exec.max_background),
            writes: std::sync::Mutex::new(()),
            seen: seen::Seen::default(),
            groups: None,
            jail,
            limits,
            exec,
        })
    }

    /// Runs the commands in `user`'s group of `groups` (see [`exec::cgroup`]), made at the
    /// first command; a command is refused while it cannot be made.
    pub fn in_process_group(
        mut self,
        groups: Arc<exec::cgroup::ProcessGroups>,
        user: &str,
    ) -> Sandbox {
        self.groups = Some((groups, user.to_owned()));
        self
    }

    /// Bounds the connections through its network proxy with every other of `user`'s
    /// workspaces' (see [`exec::ConnectionBudgets`]).
    pub fn with_connection_budget(
        mut self,
        budgets: &exec::ConnectionBudgets,
        user: &str,
    ) -> Sandbox {
        self.processes.shared.budget = Some(budgets.of(user));
        self
    }

    /// The jail.
    pub fn jail(&self) -> &Jail {
        &self.jail
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// `read_file`: lines of a text file, capped in lines and bytes.
    pub fn read_file(&self, args: &ReadFileArgs) -> Result<ReadFileResult, SandboxError> {
        fs::read_opened(self.open_read(args)?, &self.limits, args)
    }

    /// Opens the file `read_file` reads, and notes what it is as what the tools saw there (a
    /// later `write_file` of it is refused if it changes meanwhile: [`seen`]).
    fn open_read(&self, args: &ReadFileArgs) -> Result<fs::OpenedFile, SandboxError> {
        let opened = fs::open_for_read(&self.jail, args)?;
        opened.note_in(&self.seen);
        Ok(opened)
    }

    /// `list_dir`: a directory's entries, sorted, to a depth, capped.
    pub fn list_dir(&self, args: &ListDirArgs) -> Result<ListDirResult, SandboxError> {
        fs::list_dir(&self.jail, &self.limits, args)
    }

    /// `stat`: one path's kind, size, mode and time; links described, not followed.
    pub fn stat(&self, args: &StatArgs) -> Result<StatResult, SandboxError> {
        fs::stat(&self.jail, args)
    }

    /// `search`: regex search over files, honouring `.gitignore`, capped.
    pub fn search(&self, args: &SearchArgs) -> Result<SearchResult, SandboxError> {
        walk::search(&self.jail, &self.limits, args)
    }

    /// `glob`: paths matching a glob, honouring `.gitignore`, capped.
    pub fn glob(&self, args: &GlobArgs) -> Result<GlobResult, SandboxError> {
        walk::glob(&self.jail, &self.limits, args)
    }

    /// `write_file`: atomic create or replace, with a diff.
    pub fn write_file(&self, args: &WriteFileArgs) -> Result<WriteResult, SandboxError> {
        let _one_at_a_time = self.writing();
        fs::write_file(&self.jail, &self.limits, &self.seen, args, None)
    }

    /// The write lock ([`Sandbox::writes`]); a write that panicked left nothing half done that
    /// the next one must not see (the file is replaced by a rename or not at all).
    fn writing(&self) -> std::sync::MutexGuard<'_, ()> {
        self.writes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `write_file` or `edit_file` as its owner approved it, from async code: `approved` is the
    /// [`Sandbox::preview`] the prompt showed. A write creates only the directories it said the
    /// write would create; either replaces only the version of the file (or its absence) the
    /// diff was made from. If the folder changed while the prompt waited, it writes nothing and
    /// fails ([`SandboxError::Unapproved`] for a directory, [`SandboxError::Changed`] for the
    /// file). Other tools are refused: they have no preview.
    pub async fn call_approved(
        self: &Arc<Self>,
        tool: ToolName,
        args: serde_json::Value,
        approved: Preview,
    ) -> Result<serde_json::Value, SandboxError> {
        let written = match tool {
            ToolName::WriteFile => {
                let args: WriteFileArgs = parse_args(tool, args)?;
                self.on_blocking_pool(move |this| {
                    let _one_at_a_time = this.writing();
                    fs::write_file(&this.jail, &this.limits, &this.seen, &args, Some(&approved))
                })
                .await?
            }
            ToolName::EditFile => {
                let args: EditFileArgs = parse_args(tool, args)?;
                self.on_blocking_pool(move |this| {
                    let _one_at_a_time = this.writing();
                    fs::edit_file(&this.jail, &this.limits, &this.seen, &args, Some(&approved))
                })
                .await?
            }
            _ => {
                return Err(SandboxError::InvalidArguments(format!(
                    "`{tool}` has no preview to be approved by"
                )));
            }
        };
        to_json(written)
    }

    /// `edit_file`: a unique (or every) replacement, atomic, with a diff.
    pub fn edit_file(&self, args: &EditFileArgs) -> Result<WriteResult, SandboxError> {
        let _one_at_a_time = self.writing();
        fs::edit_file(&self.jail, &self.limits, &self.seen, args, None)
    }

    /// What a `write_file` or `edit_file` call would do, without doing it (for approval
    /// prompts): its whole unified diff (not cut at the diff cap) and the directories a write
    /// would create first; `None` for other tools, the error the call would fail with for a
    /// write or edit that cannot be made.
    pub fn preview(
        &self,
        tool: ToolName,
        args: &serde_json::Value,
    ) -> Result<Option<Preview>, SandboxError> {
        fs::preview(&self.jail, &self.limits, &self.seen, tool, args)
    }

    /// Where a command run in the directory `cwd` really runs, relative to the root (`.` for the
    /// root), when a symbolic link on the way makes it another place than `cwd` says (`out`
    /// where `out` leads to `.`): what the owner approving the command must be shown. `None`
    /// when it is where it says, or cannot be found (the command then fails on it).
    pub fn directory_elsewhere(&self, cwd: &str) -> Option<String> {
        let resolved = self.jail.resolve(cwd).ok()?;
        let real = self.jail.dir().canonicalize(resolved.rel()).ok()?;
        if real == resolved.rel() {
            return None;
        }
        Some(if real.as_os_str().is_empty() {
            ".".to_owned()
        } else {
            real.to_string_lossy().into_owned()
        })
    }

    /// Whether `path` names something that exists inside the root (links are not followed at
    /// the last component), or leads out of the root through a link on its way (or round a
    /// loop of links): such a path is there, and a call routed here says why it is refused,
    /// where "absent from every workspace" would send the model looking elsewhere. Used for
    /// routing probes; reveals nothing but that.
    pub fn exists(&self, path: &str) -> bool {
        let resolved = match self.jail.resolve(path) {
            Ok(resolved) => resolved,
            // A name spelled with U+FFFD that reads as several here is here: the call says why
            // it cannot go on, rather than going to another workspace.
            Err(SandboxError::Unspellable(_)) => return true,
            Err(_) => return false,
        };
        match self.jail.dir().symlink_metadata(resolved.rel()) {
            Ok(_) => true,
            Err(e) => matches!(
                SandboxError::from_io("look up", path, e),
                SandboxError::Escape { .. } | SandboxError::LinkLoop(_)
            ),
        }
    }

    /// [`Sandbox::exists`] from async code: right here on a root on a local disk (the lookup's
    /// `stat`s take less than the two thread hand-offs of tokio's blocking pool), else, or
    /// when the path goes into a mount inside the root ([`Sandbox::beyond_a_mount`]), on the
    /// blocking pool, as [`Sandbox::check_async`] does. An error only when the pool's task
    /// failed: the answer is then unknown, not "no".
    pub async fn exists_async(self: &Arc<Self>, path: &str) -> Result<bool, SandboxError> {
        if self.local_device.is_some() && !self.beyond_a_mount(path) {
            return Ok(self.exists(path));
        }
        let path = path.to_owned();
        self.on_blocking_pool(move |this| Ok(this.exists(&path)))
            .await
    }

    /// Whether `path` (as a tool names it) is looked up across a mount inside the root: an
    /// NFS share, a FUSE or autofs mount in a folder on a local disk, whose lookups block for
    /// as long as its server does not answer. A call on such a path runs on the blocking pool,
    /// never on the calling task (an attached client has one thread: a share whose server went
    /// away froze its prompts, its other calls and its Ctrl-C). Asked of the kernel without
    /// entering the mount (`openat2` with `RESOLVE_NO_XDEV` stops at its edge, one system call);
    /// a path that cannot be resolved so for another reason is left to the call, which says
    /// why.
    pub fn beyond_a_mount(&self, path: &str) -> bool {
        #[cfg(target_os = "linux")]
        {
            use rustix::fs::{Mode, OFlags, ResolveFlags, openat2};
            let Ok(resolved) = self.jail.resolve(path) else {
                return false;
            };
            let rel = match resolved.rel() {
                rel if rel.as_os_str().is_empty() => Path::new("."),
                rel => rel,
            };
            let looked_up = openat2(
                self.jail.dir(),
                rel,
                OFlags::PATH | OFlags::CLOEXEC,
                Mode::empty(),
                ResolveFlags::BENEATH | ResolveFlags::NO_XDEV | ResolveFlags::NO_MAGICLINKS,
            );
            matches!(looked_up, Err(rustix::io::Errno::XDEV))
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = path;
            false
        }
    }

    /// The command policy in force.
    pub fn exec_policy(&self) -> &ExecPolicy {
        &self.exec
    }

    /// `run_command`: a sandboxed program, with a time limit and capped output; in the
    /// background when asked (see [`exec`]).
    pub async fn run_command(
        &self,
        args: &RunCommandArgs,
    ) -> Result<RunCommandResult, SandboxError> {
        exec::process::run(
            &self.limits,
            &self.exec,
            &self.processes,
            args,
            None,
            |cpu_limit, pipe_stdin| {
                std::future::ready(self.start_command(args, cpu_limit, pipe_stdin))
            },
        )
        .await
    }

    /// Whether the workspace keeps background process `id` (running, exited with output not
    /// read, or read to its end and still told of).
    pub fn keeps_process(&self, id: &str) -> bool {
        self.processes.keeps(id)
    }

    /// Whether background process `id` of this workspace is still running.
    pub fn runs_process(&self, id: &str) -> bool {
        self.processes.runs(id)
    }

    /// The error a process tool answers for a process this workspace does not keep: the same
    /// whether there never was one or it is someone else's.
    pub fn no_such_process(id: &str) -> SandboxError {
        exec::process::not_kept(id)
    }

    /// Kills every background process of this workspace (each whole tree) and forgets them,
    /// unread output included, as if the workspace were new; returns how many there were.
    pub fn end_processes(&self) -> usize {
        self.processes.end_all()
    }

    /// The connections its commands ask the network proxy for (`network = "allowlist"`), as
    /// they happen, for one reader: the audit log. `None` after the first call. Connections
    /// are kept for the reader from this call on (at most [`MAX_FOR_AUDIT`] waiting; more are
    /// counted, see [`NetworkBatch::dropped`]); it ends when the sandbox is dropped and what was
    /// left is read.
    pub fn take_network_audit(&self) -> Option<NetworkAudit> {
        self.processes.shared.network.audit()
    }

    /// Whether this workspace keeps a background process: one that still runs, or one that
    /// exited with output not read yet (`process_read` gives it, then it goes).
    pub fn has_processes(&self) -> bool {
        self.processes.any()
    }

    /// Runs a workspace tool by name with JSON arguments and returns its JSON result. File tools
    /// run on tokio's blocking pool, except small reads and listings of a local disk (see
    /// [`INLINE_READ_MAX`] and [`INLINE_LIST_MAX`]). Session-level tools (`workspaces`,
    /// `memory_*`) are not workspace tools and are refused here.
    pub async fn call(
        self: &Arc<Self>,
        tool: ToolName,
        args: serde_json::Value,
    ) -> Result<serde_json::Value, SandboxError> {
        self.call_with_progress(tool, args, None).await
    }

    /// [`Sandbox::call`], with `progress` told how a long foreground command is going (every
    /// few seconds: how long it has run and its latest output line).
    pub async fn call_with_progress(
        self: &Arc<Self>,
        tool: ToolName,
        args: serde_json::Value,
        progress: Option<&exec::process::Progress<'_>>,
    ) -> Result<serde_json::Value, SandboxError> {
        self.call_encoded(tool, args, progress).await
    }

    /// [`Sandbox::call_with_progress`], with the result as a [`ToolResult`] to send on: JSON
    /// text, encoded straight from the tool's typed result rather than through a
    /// `serde_json::Value` first (a 1,000-entry listing: 27 µs against 83 µs), except a
    /// `read_file`'s, which stays a tree so that a large `content` can be taken out of it and
    /// sent as a body (`Outcome::split_body`).
    pub async fn call_for_wire(
        self: &Arc<Self>,
        tool: ToolName,
        args: serde_json::Value,
        progress: Option<&exec::process::Progress<'_>>,
    ) -> Result<ToolResult, SandboxError> {
        self.call_encoded(tool, args, progress).await
    }

    async fn call_encoded<E: Encoded>(
        self: &Arc<Self>,
        tool: ToolName,
        args: serde_json::Value,
        progress: Option<&exec::process::Progress<'_>>,
    ) -> Result<E, SandboxError> {
        match tool {
            ToolName::ReadFile => {
                let args: ReadFileArgs = parse_args(tool, args)?;
                let mut result = self.read_file_async(args).await?;
                // The content is moved into the JSON value, not copied: a 64 MiB read would
                // otherwise be copied once more here.
                let content = std::mem::take(&mut result.content);
                let mut value = to_json(result)?;
                value["content"] = serde_json::Value::String(content);
                Ok(E::from(value))
            }
            ToolName::ListDir => {
                let args: ListDirArgs = parse_args(tool, args)?;
                E::encode(self.list_dir_async(args).await?)
            }
            ToolName::Stat => self.blocking(tool, args, Sandbox::stat).await,
            ToolName::Search => self.blocking(tool, args, Sandbox::search).await,
            ToolName::Glob => self.blocking(tool, args, Sandbox::glob).await,
            ToolName::WriteFile => self.blocking(tool, args, Sandbox::write_file).await,
            ToolName::EditFile => self.blocking(tool, args, Sandbox::edit_file).await,
            ToolName::RunCommand => {
                let args: RunCommandArgs = parse_args(tool, args)?;
                // Starting forks, and a workspace's first command makes its shared namespaces
                // (waiting for their maker, bounded by its time-out): on the blocking pool, not
                // on the calling task, which may be the only thread an attached folder has.
                let to_start = args.clone();
                let start = |cpu_limit, pipe_stdin| {
                    self.on_blocking_pool(move |this| {
                        this.start_command(&to_start, cpu_limit, pipe_stdin)
                    })
                };
                let result = exec::process::run(
                    &self.limits,
                    &self.exec,
                    &self.processes,
                    &args,
                    progress,
                    start,
                )
                .await?;
                E::encode(result)
            }
            ToolName::ProcessRead => {
                let args: ProcessReadArgs = parse_args(tool, args)?;
                E::encode(exec::process::read(&self.processes, &args).await?)
            }
            ToolName::ProcessWrite => {
                let args: ProcessWriteArgs = parse_args(tool, args)?;
                E::encode(exec::process::write(&self.processes, &args).await?)
            }
            ToolName::ProcessKill => {
                let args: ProcessKillArgs = parse_args(tool, args)?;
                E::encode(exec::process::kill(&self.processes, &args)?)
            }
            ToolName::ProcessList => {
                let _: ProcessListArgs = parse_args(tool, args)?;
                E::encode(exec::process::list(&self.processes))
            }
            ToolName::Workspaces | ToolName::MemoryStore | ToolName::MemoryRecall => {
                Err(SandboxError::InvalidArguments(format!(
                    "`{tool}` is a session tool, not a workspace tool"
                )))
            }
        }
    }

    /// `read_file` from async code. When the root is on a local disk, the file is opened right
    /// here, and read here too when it is at most [`INLINE_READ_MAX`] bytes and on the root's
    /// own filesystem (not on a mount inside the root): from the page cache that takes a few
    /// microseconds, less than the two thread hand-offs of tokio's blocking pool (about 40 µs of
    /// a 270 µs remote read, `docs/benchmarks.md`); a cold read holds the task for one disk
    /// access. Other reads, reads of a path in a mount inside the root
    /// ([`Sandbox::beyond_a_mount`]), and every read of a root elsewhere (NFS, SMB, FUSE, ...),
    /// run on the blocking pool.
    async fn read_file_async(
        self: &Arc<Self>,
        args: ReadFileArgs,
    ) -> Result<ReadFileResult, SandboxError> {
        let local = self
            .local_device
            .filter(|_| !self.beyond_a_mount(&args.path));
        let Some(root_device) = local else {
            return self
                .on_blocking_pool(move |this| this.read_file(&args))
                .await;
        };
        let opened = self.open_read(&args)?;
        if opened.size() <= INLINE_READ_MAX && opened.device() == root_device {
            return fs::read_opened(opened, &self.limits, &args);
        }
        self.on_blocking_pool(move |this| fs::read_opened(opened, &this.limits, &args))
            .await
    }

    /// `list_dir` from async code, like [`Sandbox::read_file_async`]: a one-level listing of a
    /// root on ext4, XFS, f2fs or tmpfs (where a directory's size grows with its entries' bytes)
    /// opens the directory right here, and lists it here too when it is on the root's own
    /// filesystem and its size is at most [`INLINE_LIST_MAX`]: up to about 2,000–3,000 entries,
    /// a few hundred microseconds from the page cache (cold, up to 16 blocks read), less than
    /// the blocking pool's two hand-offs add to a remote listing (`docs/benchmarks.md`, the
    /// seventh round). If an entry's kind is not in the directory (`DT_UNKNOWN`), the listing
    /// starts again on the pool, where each such entry is looked at. Deeper listings, larger
    /// directories, and every listing of a root elsewhere (overlayfs, whose size counts only
    /// its upper layer; btrfs and ZFS, where it allows far more entries; NFS, FUSE, ...) run
    /// on the pool, as does a listing of a path in a mount inside the root
    /// ([`Sandbox::beyond_a_mount`]).
    async fn list_dir_async(
        self: &Arc<Self>,
        args: ListDirArgs,
    ) -> Result<ListDirResult, SandboxError> {
        let inline = self.lists_inline
            && args.depth.unwrap_or(1) == 1
            && !self.beyond_a_mount(args.path.as_deref().unwrap_or("."));
        let Some(root_device) = self.local_device.filter(|_| inline) else {
            return self
                .on_blocking_pool(move |this| this.list_dir(&args))
                .await;
        };
        let opened = fs::open_for_list(&self.jail, &self.limits, &args)?;
        if opened.size() > INLINE_LIST_MAX || opened.device() != root_device {
            return self
                .on_blocking_pool(move |this| fs::list_opened(opened, &this.limits, &args))
                .await;
        }
        match fs::list_inline(opened, &self.limits, &args)? {
            Some(listed) => {
                self.inline_listings.fetch_add(1, Ordering::Relaxed);
                Ok(listed)
            }
            None => {
                self.on_blocking_pool(move |this| this.list_dir(&args))
                    .await
            }
        }
    }

    /// How many `list_dir` calls were answered on the calling task since the sandbox opened
    /// (for tests: which path a listing took).
    #[doc(hidden)]
    pub fn inline_listings(&self) -> u64 {
        self.inline_listings.load(Ordering::Relaxed)
    }

    /// Starts a command in this workspace (see [`exec::start`]): blocking, it forks and, for
    /// the workspace's first command, waits for its shared namespaces to be made.
    fn start_command(
        &self,
        args: &RunCommandArgs,
        cpu_limit: Option<std::time::Duration>,
        pipe_stdin: bool,
    ) -> Result<exec::Started, SandboxError> {
        let group = match &self.groups {
            None => None,
            Some((groups, user)) => Some(groups.for_user(user).map_err(|e| {
                SandboxError::SandboxUnavailable(format!(
                    "commands here are bounded with the other commands of their user, and that \
                     bound (cgroups under {}) could not be set up: {e}",
                    groups.shown()
                ))
            })?),
        };
        exec::start(
            &self.jail,
            &self.exec,
            &self.processes.shared,
            args,
            cpu_limit,
            pipe_stdin,
            group.as_ref(),
        )
    }

    async fn on_blocking_pool<R: Send + 'static>(
        self: &Arc<Self>,
        run: impl FnOnce(&Sandbox) -> Result<R, SandboxError> + Send + 'static,
    ) -> Result<R, SandboxError> {
        let this = Arc::clone(self);
        // Dropped with this future: a job whose call was cancelled stops where it looks.
        let job = cancel::Job::default();
        let flag = job.flag();
        let result =
            tokio::task::spawn_blocking(move || cancel::Job::run(flag, || run(&this))).await;
        drop(job);
        result.map_err(|e| SandboxError::Io {
            op: "run",
            path: String::new(),
            source: std::io::Error::other(e.to_string()),
        })?
    }

    async fn blocking<A, R, E: Encoded>(
        self: &Arc<Self>,
        tool: ToolName,
        args: serde_json::Value,
        run: fn(&Sandbox, &A) -> Result<R, SandboxError>,
    ) -> Result<E, SandboxError>
    where
        A: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
    {
        E::encode(self.run_blocking(tool, args, run).await?)
    }

    async fn run_blocking<A, R>(
        self: &Arc<Self>,
        tool: ToolName,
        args: serde_json::Value,
        run: fn(&Sandbox, &A) -> Result<R, SandboxError>,
    ) -> Result<R, SandboxError>
    where
        A: DeserializeOwned + Send + 'static,
        R: Send + 'static,
    {
        let args: A = parse_args(tool, args)?;
        self.on_blocking_pool(move |this| run(this, &args)).await
    }
}

fn parse_args<A: DeserializeOwned>(
    tool: ToolName,
    args: serde_json::Value,
) -> Result<A, SandboxError> {
    // By value: a write's content is moved into its arguments, not copied.
    tool.decode_args(args)
        .map_err(SandboxError::InvalidArguments)
}

fn to_json<R: Serialize>(result: R) -> Result<serde_json::Value, SandboxError> {
    serde_json::to_value(result).map_err(encoding_failed)
}

fn encoding_failed(e: serde_json::Error) -> SandboxError {
    SandboxError::Io {
        op: "encode result of",
        path: String::new(),
        source: std::io::Error::other(e),
    }
}

/// What a tool's result is encoded as: a tree, or a [`ToolResult`] to send on.
trait Encoded: From<serde_json::Value> {
    fn encode<R: Serialize>(result: R) -> Result<Self, SandboxError>;
}

impl Encoded for serde_json::Value {
    fn encode<R: Serialize>(result: R) -> Result<Self, SandboxError> {
        to_json(result)
    }
}

impl Encoded for ToolResult {
    fn encode<R: Serialize>(result: R) -> Result<Self, SandboxError> {
        serde_json::value::to_raw_value(&result)
            .map(ToolResult::from)
            .map_err(encoding_failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a blocking job ran on after the call it worked for was cancelled (a search
    /// of a large tree kept its thread and memory for many seconds after its client went,
    /// while the call's slot was free again): dropping the future now tells the job, which
    /// stops where it looks.
    #[tokio::test]
    async fn a_blocking_job_is_told_when_its_call_is_cancelled() {
        let dir = tempfile::tempdir().unwrap();
        let sandbox =
            Arc::new(Sandbox::open(dir.path(), Limits::default(), ExecPolicy::default()).unwrap());
        let (started, ready) = std::sync::mpsc::channel();
        let (ended, gone) = std::sync::mpsc::channel();
        let job = sandbox.on_blocking_pool(move |_| {
            let _ = started.send(());
            let begun = std::time::Instant::now();
            while !cancel::cancelled() && begun.elapsed() < std::time::Duration::from_secs(20) {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            let _ = ended.send(cancel::cancelled());
            Ok(())
        });
        // Polled until the job runs, then dropped, as a cancelled call's future is.
        let _ = tokio::time::timeout(std::time::Duration::from_millis(200), job).await;
        ready.recv().unwrap();
        let told = gone
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the job stopped");
        assert!(told, "it stopped because it was told");
        assert!(!cancel::cancelled(), "no flag outside a job");
        // A walk looks before each entry: a cancelled search searches nothing more.
        for i in 0..20 {
            std::fs::write(dir.path().join(format!("f{i}.txt")), "needle\n").unwrap();
        }
        let args: SearchArgs =
            serde_json::from_value(serde_json::json!({"pattern": "needle"})).unwrap();
        assert_eq!(sandbox.search(&args).unwrap().files_searched, 20);
        let stopped = cancel::Job::run(Arc::new(true.into()), || sandbox.search(&args));
        assert_eq!(stopped.unwrap().files_searched, 0);
    }

    #[test]
    fn kernel_filesystems_are_not_local_disks() {
        let proc = std::fs::File::open("/proc/self/status").unwrap();
        let proc = filesystem(&proc).expect("/proc's filesystem");
        assert!(!on_local_disk(proc) && !lists_by_size(proc));
        let sys = std::fs::File::open("/sys/kernel").unwrap();
        let sys = filesystem(&sys).expect("/sys's filesystem");
        assert!(!on_local_disk(sys) && !lists_by_size(sys));
    }
}
