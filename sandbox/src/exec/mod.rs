//! `run_command` and background processes: programs confined by namespaces, an unprivileged
//! identity, landlock, a seccomp filter and rlimits, whose whole process tree ends with them.
//!
//! The policy is computed in the parent as plain data ([`SandboxPlan`]: paths and rights, the
//! environment, who the command runs as, which namespaces, which sockets); the landlock ruleset
//! and the seccomp filter ([`seccomp::filter`]) are built there too. The child only applies them,
//! between `fork` and `exec` ([`child`], the one module with `unsafe` code). Anything less than
//! full enforcement fails the spawn: the program never runs half-confined. The calling process is
//! never restricted.
//!
//! - [`process`]: every command is a [`process::Proc`] whose output is pumped into buffers by a
//!   task; a foreground `run_command` waits for it, a background one (or one still running after
//!   `background_after_ms`) is kept in the workspace's [`process::Table`] for `process_read`,
//!   `process_write`, `process_kill` and `process_list`.
//! - [`netpolicy`] decides which destinations `network = "allowlist"` lets through (pure), and
//!   [`proxy`] is the HTTP CONNECT and SOCKS5 proxy that enforces it.
//! - [`cgroup`] bounds the processes of all of a user's commands together, whatever workspace
//!   runs them.

pub mod cgroup;
#[allow(unsafe_code)]
pub(crate) mod child;
pub mod netpolicy;
pub(crate) mod process;
pub use process::WRITE_TOOK;
pub(crate) mod proxy;
pub mod seccomp;
mod shared;
pub(crate) mod users;

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

pub use child::Identity;
use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreatedAttr, Scope,
};
use monad_protocol::tools::RunCommandArgs;
use nix::libc;
use nix::sys::resource::{Resource, getrlimit, setrlimit};
pub use proxy::ConnectionBudgets;
pub use seccomp::Sockets;

use crate::error::SandboxError;
use crate::jail::{Jail, JailPath};
use crate::limits::{ExecPolicy, NamespacePolicy, NetworkMode};

/// Directories a sandboxed program may read and execute from.
pub const SYSTEM_READ_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];

/// Device files a sandboxed program may read and write.
pub const DEVICE_FILES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

/// The loopback port, inside a command's own network namespace, where Monad's proxy listens
/// when `network = "allowlist"`.
pub const PROXY_PORT: u16 = 3128;

/// The oldest landlock ABI Monad accepts: ABI 3 is the first that controls `truncate(2)`, without
/// which a command could empty any file outside the workspace.
const MIN_ABI: ABI = ABI::V3;

/// What the operator can do where commands cannot be sandboxed at all.
const UNSANDBOXED_HINT: &str = "; the operator can set `allow_unsandboxed_exec = true` to run \
                                them without a sandbox";

/// The user an older Monad ran commands as when Monad ran as root and nothing else was said
/// (now: a user of the workspace's own, see [`users`]).
const FALLBACK_USER: &str = "nobody";

/// The newest landlock ABI commands are sandboxed with, as an `i32` (`0`: the kernel's).
static ABI_AT_MOST: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Makes this process sandbox commands as if the kernel's landlock ABI were at most `version`
/// (`None`: the kernel's own). For tests, in a process of their own, of what Monad does on an
/// older kernel: it can only take away what such a kernel would not have.
#[doc(hidden)]
pub fn pretend_landlock_abi_at_most(version: Option<u8>) {
    ABI_AT_MOST.store(version.map_or(0, i32::from), Ordering::Relaxed);
}

/// The landlock ABI this kernel enforces. `None` when landlock is unavailable.
pub fn landlock_abi() -> Option<ABI> {
    let at_most = ABI_AT_MOST.load(Ordering::Relaxed);
    kernel_landlock_abi().map(|abi| match at_most {
        0 => abi,
        limit => abi.min(ABI::from(limit)),
    })
}

/// The kernel's own answer (one system call that needs no descriptor and no memory, so it
/// cannot fail for a passing reason); a version, once known, is kept.
fn kernel_landlock_abi() -> Option<ABI> {
    static VERSION: OnceLock<i32> = OnceLock::new();
    if let Some(version) = VERSION.get() {
        return Some(ABI::from(*version));
    }
    let version = child::landlock_version()?;
    Some(ABI::from(*VERSION.get_or_init(|| version)))
}

/// What this process knows of the kernel's namespaces, for `namespaces = "auto"`: decided once,
/// by the first workspace whose namespaces were made ([`AVAILABLE`]) or whose maker the kernel
/// refused for good ([`REFUSED`], see `shared::refusal`). A failure for any other reason (no
/// descriptor or memory free, the maker killed) fails that command only and decides nothing.
static NAMESPACES: AtomicU8 = AtomicU8::new(UNKNOWN);
const UNKNOWN: u8 = 0;
const AVAILABLE: u8 = 1;
const REFUSED: u8 = 2;

/// How a command is isolated, as decided for one spawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Isolation {
    /// In namespaces of its own (else the fallback tree).
    pub namespaced: bool,
    /// Who it runs as, when not as the caller.
    pub identity: Option<Identity>,
}

/// What a command's sandbox allows, as data: computed by [`SandboxPlan::new`], applied in the
/// child. Unit tests inspect it directly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxPlan {
    /// Directories readable (and executable) besides the workspace.
    pub read_dirs: Vec<PathBuf>,
    /// Directories readable and writable besides the workspace (the private temp dir first).
    pub write_dirs: Vec<PathBuf>,
    /// Device files readable and writable.
    pub devices: Vec<PathBuf>,
    /// The environment the program gets; nothing else from the caller's leaks through.
    pub env: Vec<(String, String)>,
    /// `RLIMIT_CPU` in seconds, when the command has a time limit.
    pub cpu_seconds: Option<u64>,
    /// How it is isolated.
    pub isolation: Isolation,
    /// Which `socket()` calls the seccomp filter lets through.
    pub sockets: Sockets,
    /// A network namespace of its own (namespaced, unless `network = "host"`).
    pub own_network: bool,
    /// The loopback port of Monad's proxy inside the command's network namespace
    /// (`network = "allowlist"`).
    pub proxy_port: Option<u16>,
    /// landlock refuses every TCP bind and connect (ABI 4 and later): the second layer of
    /// `network = "off"` where there is no network namespace.
    pub deny_tcp: bool,
}

impl SandboxPlan {
    /// The plan for a command in `jail`, with `tmp` as its private temporary directory.
    /// `Err` when the policy cannot be enforced with this isolation (`network = "allowlist"`
    /// without a network namespace).
    pub fn new(
        jail: &Jail,
        policy: &ExecPolicy,
        tmp: PathBuf,
        timeout: Option<Duration>,
        isolation: Isolation,
    ) -> Result<SandboxPlan, SandboxError> {
        let root = jail.root_path().to_string_lossy().into_owned();
        let (path, venv) = command_path(jail, policy);
        let mut env = vec![
            ("PATH".to_owned(), path),
            ("HOME".to_owned(), root.clone()),
            ("PWD".to_owned(), root),
            ("TMPDIR".to_owned(), tmp.to_string_lossy().into_owned()),
            ("LANG".to_owned(), "C.UTF-8".to_owned()),
            ("TERM".to_owned(), "dumb".to_owned()),
        ];
        if let Some(venv) = venv {
            env.push(("VIRTUAL_ENV".to_owned(), venv));
        }
        // git refuses a repository its user does not own ("dubious ownership"), and a command
        // may run as a user of its own in a folder another owns (root's, attached by root).
        // The workspace is the command's to work in, and whatever its `.git` would run, runs
        // in this same sandbox: it is declared safe, through git's environment (the operator's
        // `[exec] env`, applied below, may say otherwise).
        for (key, value) in [
            ("GIT_CONFIG_COUNT", "1".to_owned()),
            ("GIT_CONFIG_KEY_0", "safe.directory".to_owned()),
            (
                "GIT_CONFIG_VALUE_0",
                jail.root_path().to_string_lossy().into_owned(),
            ),
        ] {
            env.push((key.to_owned(), value));
        }
        let (sockets, own_network, proxy_port, deny_tcp) =
            match (policy.network, isolation.namespaced) {
                (NetworkMode::Host, _) => (Sockets::Inet, false, None, false),
                (NetworkMode::Off, true) => (Sockets::Inet, true, None, false),
                (NetworkMode::Off, false) => (Sockets::None, false, None, true),
                (NetworkMode::Allowlist, true) => (Sockets::Inet, true, Some(PROXY_PORT), false),
                (NetworkMode::Allowlist, false) => {
                    return Err(SandboxError::SandboxUnavailable(
                        "`network = \"allowlist\"` needs a network namespace of the command's \
                         own, and this kernel (or its configuration) refuses user namespaces; \
                         use `network = \"off\"` or `\"host\"`"
                            .into(),
                    ));
                }
            };
        if let Some(port) = proxy_port {
            let http = format!("http://127.0.0.1:{port}");
            let socks = format!("socks5h://127.0.0.1:{port}");
            for (key, value) in [
                ("HTTP_PROXY", &http),
                ("HTTPS_PROXY", &http),
                ("http_proxy", &http),
                ("https_proxy", &http),
                ("ALL_PROXY", &socks),
                ("all_proxy", &socks),
            ] {
                env.push((key.to_owned(), value.clone()));
            }
            for key in ["NO_PROXY", "no_proxy"] {
                env.push((key.to_owned(), "localhost,127.0.0.1,::1".to_owned()));
            }
            // Node's own fetch ignores the proxy variables unless told.
            env.push(("NODE_USE_ENV_PROXY".to_owned(), "1".to_owned()));
        }
        // `PATH` is the operator's already, its absolute entries only (`command_path`).
        for (key, value) in policy.env.iter().filter(|(key, _)| *key != "PATH") {
            env.retain(|(k, _)| k != key);
            env.push((key.clone(), value.clone()));
        }
        let mut read_dirs: Vec<PathBuf> = SYSTEM_READ_DIRS.iter().map(PathBuf::from).collect();
        read_dirs.extend(policy.extra_read_paths.iter().cloned());
        let mut write_dirs = vec![tmp];
        write_dirs.extend(policy.extra_write_paths.iter().cloned());
        Ok(SandboxPlan {
            read_dirs,
            write_dirs,
            devices: DEVICE_FILES.iter().map(PathBuf::from).collect(),
            env,
            cpu_seconds: timeout.map(cpu_seconds),
            isolation,
            sockets,
            own_network,
            proxy_port,
            deny_tcp,
        })
    }

    /// Builds the landlock ruleset: every filesystem right the ABI knows is handled (so denied
    /// unless granted), the workspace and write dirs get all of them, the read dirs read and
    /// execute, the devices read and write; signals and abstract sockets are scoped to the
    /// sandbox where the ABI can; TCP bind and connect are handled without any rule when
    /// [`SandboxPlan::deny_tcp`] (and the ABI has them). Missing system directories (no
    /// `/lib32` here) are skipped.
    fn ruleset(&self, jail: &Jail, abi: ABI) -> Result<(OwnedFd, Vec<PathId>), String> {
        let (ruleset, ids) = self.build_ruleset(jail, abi).map_err(|e| e.to_string())?;
        Ok((ruleset.ok_or("the kernel gave no ruleset")?, ids))
    }

    /// The ruleset, and the device and inode of each path it has a rule for (each opened once,
    /// for its rule and for this).
    fn build_ruleset(
        &self,
        jail: &Jail,
        abi: ABI,
    ) -> Result<(Option<OwnedFd>, Vec<PathId>), landlock::RulesetError> {
        use std::os::fd::AsFd;
        let all = AccessFs::from_all(abi);
        let read = AccessFs::from_read(abi);
        let device = (AccessFs::ReadFile | AccessFs::WriteFile) & AccessFs::from_file(abi);
        let mut ruleset = Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(all)?;
        let scopes = Scope::from_all(abi);
        if !scopes.is_empty() {
            ruleset = ruleset.scope(scopes)?;
        }
        let tcp = AccessNet::from_all(abi);
        if self.deny_tcp && !tcp.is_empty() {
            ruleset = ruleset.handle_access(tcp)?;
        }
        let mut created = ruleset
            .create()?
            .add_rule(PathBeneath::new(jail.dir(), all))?;
        let mut ids = Vec::new();
        for (paths, access) in [
            (&self.write_dirs, all),
            (&self.read_dirs, read),
            (&self.devices, device),
        ] {
            for path in paths {
                let Ok(fd) = PathFd::new(path) else { continue };
                let Ok(stat) = nix::sys::stat::fstat(fd.as_fd()) else {
                    continue;
                };
                ids.push((path.clone(), (stat.st_dev, stat.st_ino)));
                let is_file = stat.st_mode & libc::S_IFMT == libc::S_IFREG;
                let access = if is_file {
                    access & AccessFs::from_file(abi)
                } else {
                    access
                };
                created = created.add_rule(PathBeneath::new(fd, access))?;
            }
        }
        Ok((created.into(), ids))
    }
}

/// A path of a plan with the device and inode it led to.
type PathId = (PathBuf, (u64, u64));

/// Toolchain directories inside a workspace, put first in a command's `PATH` when they exist (a
/// virtualenv also sets `VIRTUAL_ENV`).
pub const TOOLCHAIN_DIRS: &[&str] = &[".venv/bin", "venv/bin", "node_modules/.bin"];

/// The `PATH` commands in `jail` get (the operator's `env.PATH` when set, else the workspace's
/// toolchain directories that exist, then `path_env`), and the virtualenv it puts first, if any.
///
/// The operator's entries that are not absolute paths are left out: `execvp` (and a shell)
/// would look for a program in them from the command's own directory, inside the workspace
/// (`~/.cargo/bin`, as a shell would have expanded it, or an empty entry), so `ls` would run a
/// file of the workspace's while the owner is told, and a remembered rule keeps, that it is
/// `/usr/bin/ls`. No entry is ever empty, and a `PATH` left with none is [`NO_PATH`] (an empty
/// `PATH` is the current directory's too).
pub fn command_path(jail: &Jail, policy: &ExecPolicy) -> (String, Option<String>) {
    let absolute = |path: &str| {
        path.split(':')
            .filter(|dir| dir.starts_with('/'))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let joined = |dirs: Vec<String>| {
        if dirs.is_empty() {
            NO_PATH.to_owned()
        } else {
            dirs.join(":")
        }
    };
    if let Some(path) = policy.env.get("PATH") {
        return (joined(absolute(path)), None);
    }
    let root = jail.root_path().to_string_lossy();
    let mut dirs = Vec::new();
    let mut venv = None;
    for dir in TOOLCHAIN_DIRS {
        if jail.dir().is_dir(dir) {
            dirs.push(format!("{root}/{dir}"));
            if let Some(env) = dir.strip_suffix("/bin").filter(|d| d.ends_with("venv")) {
                venv.get_or_insert(format!("{root}/{env}"));
            }
        }
    }
    dirs.extend(absolute(&policy.path_env));
    (joined(dirs), venv)
}

/// The `PATH` of a command whose operator named no absolute directory: one that finds nothing.
pub const NO_PATH: &str = "/nonexistent";

/// Rlimits to set in the child, resolved against the current hard limits in the parent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rlimits {
    cpu: Option<u64>,
    core: u64,
    nofile: u64,
    fsize: u64,
    address_space: Option<u64>,
}

/// The `RLIMIT_CPU` that backs a wall-clock limit of `timeout`, a second over it on every core.
/// The kernel counts the CPU time of all of a process's threads: a parallel compiler or `zstd
/// -T0` on eight cores spends eight CPU seconds a second, and a limit of the time limit alone
/// killed it (`SIGKILL`, shown as "Killed") an eighth of the way to its time-out.
fn cpu_seconds(timeout: Duration) -> u64 {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get) as u64;
    (timeout.as_secs() + 1).saturating_mul(cores)
}

impl Rlimits {
    fn new(policy: &ExecPolicy, cpu_seconds: Option<u64>) -> Rlimits {
        let cap = |resource, want: u64| match getrlimit(resource) {
            Ok((_, hard)) => want.min(hard),
            Err(_) => want,
        };
        Rlimits {
            cpu: cpu_seconds.map(|s| cap(Resource::RLIMIT_CPU, s)),
            core: 0,
            nofile: cap(Resource::RLIMIT_NOFILE, policy.max_open_files),
            fsize: cap(Resource::RLIMIT_FSIZE, policy.max_file_bytes),
            address_space: (policy.max_memory_bytes > 0)
                .then(|| cap(Resource::RLIMIT_AS, policy.max_memory_bytes)),
        }
    }

    /// Async-signal-safe: system calls only.
    pub(crate) fn apply(&self) -> nix::Result<()> {
        if let Some(cpu) = self.cpu {
            setrlimit(Resource::RLIMIT_CPU, cpu, cpu)?;
        }
        setrlimit(Resource::RLIMIT_CORE, self.core, self.core)?;
        setrlimit(Resource::RLIMIT_NOFILE, self.nofile, self.nofile)?;
        setrlimit(Resource::RLIMIT_FSIZE, self.fsize, self.fsize)?;
        if let Some(bytes) = self.address_space {
            setrlimit(Resource::RLIMIT_AS, bytes, bytes)?;
        }
        Ok(())
    }
}

/// Who a command in `jail` runs as: `None` (as the caller) unless the caller is root; then the
/// operator's `user`, else the owner of the workspace's folder when that is not root (with its
/// group, never group 0), else a user of the workspace's own ([`users`], kept in `slot` while
/// the workspace is open). Never root.
pub(crate) fn identity(
    jail: &Jail,
    policy: &ExecPolicy,
    slot: &shared::Slot,
) -> Result<Option<Identity>, SandboxError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    if let Some(user) = &policy.user {
        return named_identity(user).map(Some);
    }
    let meta = jail.dir().dir_metadata().map_err(|e| SandboxError::Io {
        op: "inspect",
        path: jail.root_path().display().to_string(),
        source: e,
    })?;
    let owner = cap_std::fs::MetadataExt::uid(&meta);
    if owner == 0 {
        return slot
            .own_user(|| users::allocate(jail.root_path(), policy.uid_range))
            .map(Some);
    }
    let entry = nix::unistd::User::from_uid(owner.into()).ok().flatten();
    let gid = entry
        .as_ref()
        .map(|u| u.gid.as_raw())
        .unwrap_or_else(|| cap_std::fs::MetadataExt::gid(&meta));
    if gid == 0 {
        let from = if entry.is_some() {
            "that user's entry"
        } else {
            "the folder's group"
        };
        return Err(SandboxError::SandboxUnavailable(format!(
            "commands here would run as the folder's owner, uid {owner}, with gid 0 (root's \
             group, from {from}); commands never run with gid 0: give the folder a group other \
             than root, or set [exec] user"
        )));
    }
    Ok(Some(Identity { uid: owner, gid }))
}

/// The identity of a user name (or numeric uid) from the operator's configuration.
fn named_identity(user: &str) -> Result<Identity, SandboxError> {
    let found = match user.parse::<u32>() {
        Ok(uid) => nix::unistd::User::from_uid(uid.into())
            .ok()
            .flatten()
            .map(|u| Identity {
                uid,
                gid: u.gid.as_raw(),
            })
            .or(Some(Identity { uid, gid: uid })),
        Err(_) => nix::unistd::User::from_name(user)
            .ok()
            .flatten()
            .map(|u| Identity {
                uid: u.uid.as_raw(),
                gid: u.gid.as_raw(),
            }),
    };
    match found {
        // The well-known nobody exists nearly everywhere; where it does not, its usual ids.
        None if user == FALLBACK_USER => Ok(Identity {
            uid: 65534,
            gid: 65534,
        }),
        None => Err(SandboxError::SandboxUnavailable(format!(
            "commands would run as user `{user}` ([exec] user), which does not exist"
        ))),
        Some(identity) if identity.uid == 0 || identity.gid == 0 => {
            Err(SandboxError::SandboxUnavailable(format!(
                "[exec] user = `{user}` is root (uid or gid 0); commands never run as root: \
                 name an unprivileged user"
            )))
        }
        Some(identity) => Ok(identity),
    }
}

/// Gives a primary workspace's folder to the user its commands will run as, when the server
/// runs as root: the commands (unprivileged) must be able to write it. A folder root owns goes
/// to `[exec] user`, else to a user of its own ([`users`]); with no `[exec] user`, a folder an
/// older Monad gave to `nobody` goes, with what in it belongs to `nobody`, to a user of its own
/// too. Does nothing otherwise (the folder keeps its owner, whose user its commands run as).
pub fn give_to_command_user(root: &std::path::Path, policy: &ExecPolicy) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    if !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    let owner = std::fs::symlink_metadata(root)?.uid();
    let unavailable = |e: SandboxError| std::io::Error::other(e.to_string());
    if let Some(user) = &policy.user {
        if owner != 0 {
            return Ok(());
        }
        let who = named_identity(user).map_err(unavailable)?;
        return std::os::unix::fs::lchown(root, Some(who.uid), Some(who.gid));
    }
    let nobody = named_identity(FALLBACK_USER).map_or(65534, |who| who.uid);
    if owner != 0 && owner != nobody {
        return Ok(());
    }
    let canonical = std::fs::canonicalize(root)?;
    let who = users::allocate(&canonical, policy.uid_range).map_err(unavailable)?;
    if owner == 0 {
        std::os::unix::fs::lchown(root, Some(who.uid), Some(who.gid))
    } else {
        tracing::info!(
            "{} belonged to the shared user `{FALLBACK_USER}`; it now has a user of its own, \
             uid {}",
            root.display(),
            who.uid
        );
        users::give_tree(root, nobody, who)
    }
}

/// The isolation for the next command under `policy`.
fn isolation(policy: &ExecPolicy, identity: Option<Identity>) -> Isolation {
    let namespaced = match policy.namespaces {
        NamespacePolicy::Off => false,
        NamespacePolicy::Required => true,
        NamespacePolicy::Auto => NAMESPACES.load(Ordering::Relaxed) != REFUSED,
    };
    Isolation {
        namespaced,
        identity,
    }
}

/// A started command: its supervisor, pipes and what must live as long as it does.
pub(crate) struct Started {
    pub child: tokio::process::Child,
    pub supervisor: process::Supervisor,
    /// The workspace's temporary directory, kept while the command runs.
    pub tmp: std::sync::Arc<shared::TmpDir>,
    /// The workspace's shared namespaces it runs in.
    pub shared: Option<std::sync::Arc<shared::Shared>>,
    /// `landlock`, or `none` when the operator allowed unsandboxed commands here.
    pub sandbox: &'static str,
    /// Ends the tree if this is dropped before the command ended (a call cancelled while it
    /// waited for `exec`); the task driving the command disarms it once the command ended.
    pub guard: process::TreeGuard,
    /// Read end of the start pipe (see [`Started::started`]).
    status: OwnedFd,
    isolation: Isolation,
    /// The process group it was started in, to tell a failure to start at its bound.
    bound: Option<Bound>,
    /// Removes what the command made of git's [`GIT_REDIRECTS`] when it ended.
    pub git: Option<GitGuard>,
}

/// The program of `argv`, or why `argv` cannot be run: empty, an empty program, a NUL byte.
pub(crate) fn check_argv(argv: &[String]) -> Result<&str, SandboxError> {
    let Some(program) = argv.first() else {
        return Err(SandboxError::InvalidArguments(
            "`argv` is empty; give the program and its arguments".into(),
        ));
    };
    if program.is_empty() {
        return Err(SandboxError::InvalidArguments(
            "`argv[0]` is empty; name a program".into(),
        ));
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(SandboxError::InvalidArguments(
            "`argv` contains a NUL byte".into(),
        ));
    }
    Ok(program)
}

/// For a program not found whose name holds U+FFFD: what that character is, and how to run a
/// program whose name is not UTF-8; nothing for any other.
pub(crate) fn lossy_hint(program: &str) -> &'static str {
    if program.contains('\u{FFFD}') {
        " (`\u{FFFD}` stands for bytes of a name that are not UTF-8, as a listing shows them, \
         which a program's name as spelled cannot hold: name such a program by a shell glob with \
         `*` where `\u{FFFD}` stands and the directory it is in, such as `sh -c '/dir/name*'`)"
    } else {
        ""
    }
}

/// What a program named by a path (it holds a `/`) that names no program is told.
pub(crate) fn program_not_found(program: &str) -> SandboxError {
    SandboxError::NotFound(format!(
        "program `{}` does not exist where commands can run it (the workspace, the \
         system's directories and the ones the operator added){}",
        crate::error::shown(program),
        lossy_hint(program)
    ))
}

/// What a program spelled with U+FFFD that names nothing so is told (`hint`: why, first).
fn unspellable_program(program: &str, hint: &str) -> String {
    // The spelled parts quoted for the shell, `*` left bare between them.
    let pattern = program
        .split('\u{FFFD}')
        .map(|part| {
            if part.is_empty() {
                String::new()
            } else {
                monad_protocol::text::shell_words(&[part])
            }
        })
        .collect::<Vec<_>>()
        .join("*");
    format!(
        "`argv[0]` `{}` names no program as spelled: {hint}`\u{FFFD}` stands for bytes \
         of a name that are not UTF-8, as a listing shows them, and a command's program is run by \
         the name as spelled, which cannot hold them; run it through a shell glob with `*` where \
         `\u{FFFD}` stands, such as `{}`",
        crate::error::shown(program),
        monad_protocol::text::shell_words(&["sh", "-c", &pattern])
    )
}

/// The program `argv[0]` names when it is a path (it holds a `/`), relative to the root, as
/// `exec` takes it: spelled, from the command's working directory `cwd` (its own bytes, as the
/// command runs there); `None` for an absolute path that is not inside the workspace. A `..`
/// climbs as the kernel climbs, from where the links before it lead ([`Jail::climbed`]), be
/// they in `cwd` or in the program's own path (`bin/link/../x`). A path spelled with U+FFFD
/// that names nothing so, where every other tool would take a name that is not UTF-8 for it
/// ([`Jail::resolve`]), is refused, saying how to run that one: `exec` would only say "not
/// found". The one rule for the check before approval and the run.
pub(crate) fn program_path(
    jail: &Jail,
    cwd: &JailPath,
    program: &str,
) -> Result<Option<std::path::PathBuf>, SandboxError> {
    let absolute = std::path::Path::new(program).is_absolute();
    let named = |e| match e {
        SandboxError::Escape { reason, .. } => SandboxError::Escape {
            path: program.to_owned(),
            reason,
        },
        other => other,
    };
    let (from, rest) = if absolute {
        let root = jail.resolve("")?;
        match jail.strip_root(program) {
            // Inside, unless its `..`s climb out of it as text.
            Some(rest) if Jail::spelled_from(&root, rest).is_ok() => (root, rest),
            // Outside: looked up as any path outside.
            _ => return Ok(None),
        }
    } else {
        (cwd.clone(), program)
    };
    let (from, rest) = match jail.climbed(&from, rest, program) {
        Ok(Some(climbed)) => climbed,
        Ok(None) => (from, rest),
        // A name spelled with U+FFFD on the way up: `exec` takes it as spelled, as below.
        Err(SandboxError::NotFound(_)) if program.contains('\u{FFFD}') => {
            return Err(SandboxError::Unspellable(unspellable_program(program, "")));
        }
        Err(e) => return Err(named(e)),
    };
    let spelled = Jail::spelled_from(&from, rest).map_err(named)?;
    let at = if spelled.as_os_str().is_empty() {
        std::path::Path::new(".")
    } else {
        &spelled
    };
    if !program.contains('\u{FFFD}') || jail.dir().symlink_metadata(at).is_ok() {
        return Ok(Some(spelled));
    }
    match jail.resolve_from(&from, rest) {
        Ok(found) if found.rel() == at => Ok(Some(spelled)),
        Ok(_) => Err(SandboxError::Unspellable(unspellable_program(program, ""))),
        Err(SandboxError::Unspellable(_)) => Err(SandboxError::Unspellable(unspellable_program(
            program,
            "more than one name reads as it does (a glob matches them all: narrow it, or list \
             them first), and ",
        ))),
        Err(e) => Err(named(e)),
    }
}

/// Checks `args` and starts the command (see the module documentation). `timeout`: its time
/// limit, if any (for `RLIMIT_CPU`; the caller enforces the wall-clock limit).
pub(crate) fn start(
    jail: &Jail,
    policy: &ExecPolicy,
    slot: &shared::Slot,
    args: &RunCommandArgs,
    timeout: Option<Duration>,
    pipe_stdin: bool,
    group: Option<&Arc<cgroup::ProcessGroup>>,
) -> Result<Started, SandboxError> {
    check_argv(&args.argv)?;
    let identity = identity(jail, policy, slot)?;
    let first = isolation(policy, identity);
    let bound = group.map(|group| Bound::new(group.clone()));
    let bound = bound.as_ref();
    let try_spawn = |isolation| {
        spawn(
            jail, policy, slot, args, timeout, pipe_stdin, isolation, bound,
        )
    };
    match try_spawn(first) {
        Err(SpawnFailure::Namespaces(why))
            if first.namespaced && policy.namespaces == NamespacePolicy::Auto =>
        {
            match NAMESPACES.compare_exchange(
                UNKNOWN,
                REFUSED,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => tracing::warn!(
                    "commands run without namespaces of their own from now on: {why} \
                     (see [exec] namespaces in docs/operations.md)"
                ),
                Err(REFUSED) => {}
                // They were made before: whatever this is, it is no refusal of the kernel's.
                Err(_) => return Err(SpawnFailure::Namespaces(why).into_error()),
            }
            let fallback = Isolation {
                namespaced: false,
                identity,
            };
            try_spawn(fallback).map_err(|e| e.into_error())
        }
        other => other.map_err(|e| e.into_error()),
    }
}

/// The process group of a command's user (see [`cgroup`]), and its counts when the command
/// started: a fork refused at its bound since, or a process killed for want of memory since.
#[derive(Debug, Clone)]
pub(crate) struct Bound {
    group: Arc<cgroup::ProcessGroup>,
    refusals: Option<u64>,
    memory_events: Option<(u64, u64)>,
}

impl Bound {
    fn new(group: Arc<cgroup::ProcessGroup>) -> Bound {
        Bound {
            refusals: group.refusals(),
            memory_events: group.memory_events(),
            group,
        }
    }

    /// Whether the group refused a fork at its bound since the command started.
    fn refused_since(&self) -> bool {
        let before = self.refusals;
        before.is_some_and(|before| self.group.refusals().is_some_and(|now| now > before))
    }

    /// Whether the kernel killed a process of the group's commands at its memory bound since
    /// the command started (a kill, and the bound reached).
    fn killed_at_memory_bound(&self) -> bool {
        let (Some((kills, reached)), Some((kills_now, reached_now))) =
            (self.memory_events, self.group.memory_events())
        else {
            return false;
        };
        kills_now > kills && reached_now > reached
    }

    /// Why a command could not start, when it was the bound.
    fn refusal(&self) -> SandboxError {
        let now = self
            .group
            .processes()
            .map(|n| format!("{n} processes and threads"))
            .unwrap_or_else(|| "as many processes and threads as they may".into());
        let max = self.group.max_processes().unwrap_or_default();
        SandboxError::LimitExceeded(format!(
            "this user's commands on this server have {now}, and may have {max} at once over \
             all their sessions (server.max_processes_per_user); end some (process_list and \
             process_kill, in each session), then retry"
        ))
    }
}

/// Why a spawn failed: the namespaces (the caller may fall back), or anything else.
enum SpawnFailure {
    Namespaces(String),
    Other(SandboxError),
}

impl SpawnFailure {
    fn into_error(self) -> SandboxError {
        match self {
            SpawnFailure::Namespaces(why) => SandboxError::SandboxUnavailable(format!(
                "the kernel refused the namespaces commands run in: {why} ([exec] namespaces = \
                 \"required\"; \"auto\" falls back to running without them)"
            )),
            SpawnFailure::Other(e) => e,
        }
    }
}

impl From<SandboxError> for SpawnFailure {
    fn from(e: SandboxError) -> Self {
        SpawnFailure::Other(e)
    }
}

#[allow(clippy::too_many_arguments)]
fn spawn(
    jail: &Jail,
    policy: &ExecPolicy,
    slot: &shared::Slot,
    args: &RunCommandArgs,
    timeout: Option<Duration>,
    pipe_stdin: bool,
    isolation: Isolation,
    bound: Option<&Bound>,
) -> Result<Started, SpawnFailure> {
    let program = &args.argv[0];
    let cwd_path = jail.resolve(args.cwd.as_deref().unwrap_or(""))?;
    // The working directory first, as the check takes it: a missing one is said as itself.
    let cwd: OwnedFd = jail.open_dir(&cwd_path)?.into();
    if program.contains('/') {
        program_path(jail, &cwd_path, program)?;
    }
    let tmp = slot
        .tmp_dir(isolation.identity)
        .map_err(|e| SandboxError::Io {
            op: "create the temporary directory for",
            path: program.clone(),
            source: e,
        })?;
    let plan = SandboxPlan::new(jail, policy, tmp.path().to_path_buf(), timeout, isolation)?;
    // The sandbox is the landlock ruleset and the seccomp filter together. Where the operator
    // let commands run without landlock, the filter still keeps what the network policy
    // promises: without a network namespace it refuses every socket (`network = "off"`), and
    // with one it refuses Unix sockets, io_uring and namespaces of their own, by which a
    // command would reach past its namespace (a resolver's socket, D-Bus, `docker.sock`). Only
    // `network = "host"` runs without it. A command it cannot hold to "off" is refused rather
    // than run with the network its owner was told it would not have.
    let (ruleset, filter, abi) = match (landlock_abi(), seccomp::filter(plan.sockets)) {
        (Some(abi), Some(filter)) if abi >= MIN_ABI => {
            let (ruleset, ids) = plan.ruleset(jail, abi).map_err(|e| {
                SandboxError::SandboxUnavailable(format!("the landlock ruleset failed: {e}"))
            })?;
            (Some((ruleset, ids)), Some(filter), Some(abi))
        }
        (_, None) if policy.allow_unsandboxed_exec && plan.sockets == seccomp::Sockets::None => {
            return Err(SandboxError::SandboxUnavailable(format!(
                "`network = \"off\"` cannot be kept here: commands have no network namespace \
                 of their own, and there is no seccomp filter for {} to refuse their sockets; \
                 allow user namespaces, or set `network = \"host\"` to run commands with the \
                 host's network",
                std::env::consts::ARCH
            ))
            .into());
        }
        (_, filter) if policy.allow_unsandboxed_exec => (
            None,
            filter.filter(|_| policy.network != NetworkMode::Host),
            None,
        ),
        (None, _) => {
            return Err(SandboxError::SandboxUnavailable(format!(
                "landlock is not available in this kernel{UNSANDBOXED_HINT}"
            ))
            .into());
        }
        (Some(abi), Some(_)) => {
            return Err(SandboxError::SandboxUnavailable(format!(
                "the kernel's landlock ABI {abi:?} is older than {MIN_ABI:?}{UNSANDBOXED_HINT}"
            ))
            .into());
        }
        (Some(_), None) => {
            return Err(SandboxError::SandboxUnavailable(format!(
                "commands are sandboxed on x86_64 and aarch64 only, not on {}: there is no \
                 seccomp filter for this architecture{UNSANDBOXED_HINT}",
                std::env::consts::ARCH
            ))
            .into());
        }
    };
    let (ruleset, ids) = ruleset.unzip();
    let ids = ids.unwrap_or_default();
    if let Some(abi) = abi
        && !isolation.namespaced
        && isolation.identity.is_none()
        && abi < ABI::V6
    {
        return Err(SandboxError::SandboxUnavailable(format!(
            "without namespaces of their own, commands run as Monad's own user, and only \
             landlock's signal scope (ABI 6, Linux 6.12 or later; this kernel has {abi:?}) keeps \
             a command from killing the process that ends everything it started; run a newer \
             kernel, or let commands have namespaces (allow unprivileged user namespaces, or \
             run Monad as root; see [exec] namespaces)"
        ))
        .into());
    }
    let sandbox = if ruleset.is_some() {
        "landlock"
    } else {
        "none"
    };
    let cstring = |path: &std::path::Path| {
        std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| {
            SandboxError::SandboxUnavailable(format!(
                "the path {} holds a NUL byte",
                crate::error::shown(&path.to_string_lossy())
            ))
        })
    };
    let root_meta = jail.dir().dir_metadata().map_err(|e| SandboxError::Io {
        op: "inspect the workspace of",
        path: program.clone(),
        source: e,
    })?;
    let root_id = (
        cap_std::fs::MetadataExt::dev(&root_meta),
        cap_std::fs::MetadataExt::ino(&root_meta),
    );
    let cwd_rel = match cwd_path.rel().as_os_str() {
        rel if rel.is_empty() => std::ffi::CString::from(c"."),
        rel => cstring(std::path::Path::new(rel))?,
    };
    let (binds, masks) = if isolation.namespaced {
        let view = || {
            slot.view(jail.root_path(), isolation.identity, || {
                view(jail, &plan, isolation.identity)
            })
        };
        let (mut binds, masks) = view()?;
        let (mut binds, masks) = if with_ids(&mut binds, &ids, jail.root_path(), root_id).is_err() {
            // A path of the view changed since it was made: make it again.
            slot.forget_view();
            let (mut fresh, masks) = view()?;
            with_ids(&mut fresh, &ids, jail.root_path(), root_id).map_err(|path| {
                SandboxError::SandboxUnavailable(format!(
                    "{} changed while the command's view of the filesystem was made",
                    crate::error::shown(&path.to_string_lossy())
                ))
            })?;
            (fresh, masks)
        } else {
            (binds, masks)
        };
        // Looked at for each command: a repository may be made or cloned between two.
        binds.extend(git_protections(jail));
        // And the read-only mounts a writable bind holds or lies in: they may come and go too.
        // Only as root: in a user namespace of the view's own their flags are locked already.
        let read_only = if nix::unistd::geteuid().is_root() {
            read_only_mounts_within(&mut binds, &masks, &mounts_of_this_process())
        } else {
            Vec::new()
        };
        if binds.len() + read_only.len() > child::MAX_BINDS {
            return Err(SandboxError::SandboxUnavailable(format!(
                "the workspace holds {} read-only mounts: a command's view keeps at most {} \
                 read-only within what it may write",
                read_only.len(),
                child::MAX_BINDS.saturating_sub(binds.len())
            ))
            .into());
        }
        binds.extend(read_only);
        (binds, masks)
    } else {
        (Vec::new(), Vec::new())
    };
    let root = cstring(jail.root_path())?;
    let shared = if isolation.namespaced {
        match slot.get(policy, isolation.identity) {
            Ok(shared) => {
                let _ = NAMESPACES.compare_exchange(
                    UNKNOWN,
                    AVAILABLE,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                Some(shared)
            }
            Err(shared::Failure::Refused(why)) => return Err(SpawnFailure::Namespaces(why)),
            Err(shared::Failure::Other(e)) => return Err(e.into()),
        }
    } else {
        None
    };
    let namespaces = shared.as_ref().map(|shared| child::Namespaces {
        user: shared.user.as_raw_fd(),
        ipc: shared.ipc.as_raw_fd(),
        net: shared.net.as_ref().map(|net| net.as_raw_fd()),
        binds,
        masks,
        root,
        root_id,
        cwd: cwd_rel,
        shm_options: std::ffi::CString::new(format!(
            "size={},mode=1777",
            policy.shm_max_bytes.max(4096)
        ))
        .expect("no NUL in numbers"),
    });
    let (proc_access, shm_access) = abi
        .map(|abi| {
            (
                (AccessFs::ReadFile | AccessFs::ReadDir).bits(),
                AccessFs::from_all(abi).bits(),
            )
        })
        .unwrap_or((0, 0));
    let (status_read, status_write) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| SandboxError::Io {
            op: "make the start pipe of",
            path: program.clone(),
            source: e.into(),
        })?;
    let exec =
        child::Exec::new(program, &args.argv, &plan.env, status_write).map_err(|e| match e {
            child::PrepareError::Nul => {
                SandboxError::InvalidArguments("`argv` or the environment holds a NUL byte".into())
            }
            child::PrepareError::Stack(source) => SandboxError::Io {
                op: "make the stack of",
                path: program.clone(),
                source,
            },
        })?;
    // Counted per user: in the workspace's user namespace, or (as root, without namespaces)
    // for the workspace's own user. Never for Monad's own user, whose other processes count.
    let nproc = (policy.max_processes > 0
        && (isolation.namespaced || isolation.identity.is_some()))
    .then_some(policy.max_processes);
    let spec = child::Spec {
        rlimits: Rlimits::new(policy, plan.cpu_seconds),
        nproc,
        group: bound.map_or([-1; cgroup::MAX_MEMBERS], |bound| {
            bound.group.supervisor_joins()
        }),
        command_group: bound.map_or([-1; cgroup::MAX_MEMBERS], |bound| {
            bound.group.command_joins()
        }),
        cwd,
        identity: isolation.identity,
        namespaces,
        ruleset,
        proc_access,
        shm_access,
        filter,
        parent: nix::unistd::getpid().as_raw(),
        cap_last: cap_last(),
        exec,
    };

    let mut command = tokio::process::Command::new(program);
    command
        .args(&args.argv[1..])
        .env_clear()
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .process_group(0)
        .stdin(if pipe_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Ended through its supervisor (see `process::Supervisor`), which takes the whole tree.
        .kill_on_drop(false);
    child::install(&mut command, spec);
    // Opened before the command starts, so that what it makes is seen at its end.
    let git = GitGuard::of(jail);
    let spawned = command.spawn();
    // The closure (and with it this process's copy of the start pipe's write end) goes now, so
    // that the pipe ends when the command's process has run `exec`.
    drop(command);
    let child = match spawned {
        Ok(child) => child,
        Err(e) => return Err(spawn_error(program, e, isolation, bound).into()),
    };
    let pid = child.id().ok_or_else(|| SandboxError::Io {
        op: "start",
        path: program.clone(),
        source: std::io::Error::other("the command exited before it could be watched"),
    })?;
    let supervisor =
        process::Supervisor::new(pid, isolation.namespaced).map_err(|e| SandboxError::Io {
            op: "start",
            path: program.clone(),
            source: std::io::Error::new(
                e.kind(),
                format!("the command's supervisor could not be held (pidfd_open): {e}"),
            ),
        })?;
    Ok(Started {
        child,
        guard: process::TreeGuard::armed(supervisor.clone()),
        supervisor,
        tmp,
        shared,
        sandbox,
        status: status_read,
        isolation,
        bound: bound.cloned(),
        git,
    })
}

/// Gives each bind the device and inode its landlock rule was made on (the workspace's root:
/// `root_id`); `Err` with the first path of the view for which there is none.
fn with_ids(
    binds: &mut [child::Bind],
    ids: &[PathId],
    root: &std::path::Path,
    root_id: (u64, u64),
) -> Result<(), PathBuf> {
    for bind in binds {
        bind.id = if bind.from == root {
            root_id
        } else {
            ids.iter()
                .find(|(path, _)| *path == bind.from)
                .map(|(_, id)| *id)
                .ok_or_else(|| bind.from.clone())?
        };
    }
    Ok(())
}

impl Started {
    /// Whether the kernel killed a process of its user's commands at their memory bound since
    /// it started.
    pub(crate) fn killed_at_memory_bound(&self) -> bool {
        self.bound
            .as_ref()
            .is_some_and(Bound::killed_at_memory_bound)
    }

    /// Waits (bounded) until the command's process has run `exec`: `Err` with what failed
    /// before, when it did not (the tree is then ended).
    pub(crate) async fn started(&mut self, program: &str) -> Result<(), SandboxError> {
        let io = |e: std::io::Error| SandboxError::Io {
            op: "start",
            path: program.to_owned(),
            source: e,
        };
        let status = self.status.try_clone().map_err(io)?;
        let mut pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(status).map_err(io)?;
        let read = async {
            let mut bytes = Vec::with_capacity(4);
            let _ = tokio::io::AsyncReadExt::read_to_end(&mut pipe, &mut bytes).await;
            <[u8; 4]>::try_from(bytes.as_slice())
                .ok()
                .map(i32::from_ne_bytes)
        };
        let errno = tokio::time::timeout(START_TIMEOUT, read)
            .await
            .unwrap_or(Some(libc::ETIMEDOUT));
        let Some(errno) = errno else {
            return Ok(());
        };
        let _ = process::end(&mut self.child, &self.supervisor).await;
        self.guard.disarm();
        Err(spawn_error(
            program,
            std::io::Error::from_raw_os_error(errno),
            self.isolation,
            self.bound.as_ref(),
        ))
    }
}

/// Longest a command's process may take from its start to `exec`.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// What a namespaced command sees besides the read-only rest: binds of the directories it may
/// write (the workspace first) and of those it may read that lie under a directory its user
/// cannot search, and the masks over such directories ([`masks_for`]). Paths are canonical;
/// missing ones are skipped.
fn view(
    jail: &Jail,
    plan: &SandboxPlan,
    identity: Option<Identity>,
) -> Result<(Vec<child::Bind>, Vec<std::ffi::CString>), SandboxError> {
    // Each canonical path, whether it is writable, and the path of the plan it comes from.
    let root = jail.root_path().to_path_buf();
    let mut wanted: Vec<(PathBuf, bool, PathBuf)> = vec![(root.clone(), true, root)];
    for (dirs, writable) in [(&plan.write_dirs, true), (&plan.read_dirs, false)] {
        for dir in dirs {
            if let Ok(canonical) = std::fs::canonicalize(dir)
                && !wanted.iter().any(|(p, _, _)| *p == canonical)
            {
                wanted.push((canonical, writable, dir.clone()));
            }
        }
    }
    let searchable = |dir: &std::path::Path| match identity {
        None => true,
        Some(who) => std::fs::metadata(dir).is_ok_and(|m| {
            use std::os::unix::fs::MetadataExt;
            let bit = if m.uid() == who.uid {
                0o100
            } else if m.gid() == who.gid {
                0o010
            } else {
                0o001
            };
            m.mode() & bit != 0
        }),
    };
    let paths: Vec<&std::path::Path> = wanted.iter().map(|(p, _, _)| p.as_path()).collect();
    let masks = masks_for(&paths, searchable);
    let under_mask = |path: &std::path::Path| masks.iter().any(|m| path.starts_with(m));
    let mut binds = Vec::new();
    for (path, writable, from) in wanted {
        let masked = under_mask(&path);
        if !writable && !masked {
            continue;
        }
        let dir = std::fs::metadata(&path).is_ok_and(|m| m.is_dir());
        let target = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| {
            SandboxError::InvalidArguments(format!(
                "{} holds a NUL",
                crate::error::shown(&path.to_string_lossy())
            ))
        })?;
        binds.push((
            path,
            child::Bind {
                target,
                from,
                // Filled in for each spawn (see `with_ids`).
                id: (0, 0),
                writable,
                dir,
                masked,
            },
        ));
    }
    // Parents before what lies under them.
    binds.sort_by_key(|(path, _)| path.components().count());
    // Room is kept for git's own files, bound for each command after these.
    if binds.len() + GIT_BINDS > child::MAX_BINDS {
        return Err(SandboxError::SandboxUnavailable(format!(
            "a command may see at most {} extra paths ([exec] extra_read_paths and \
             extra_write_paths)",
            child::MAX_BINDS - GIT_BINDS
        )));
    }
    let masks = masks
        .iter()
        .map(|m| std::ffi::CString::new(m.as_os_str().as_encoded_bytes()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| SandboxError::InvalidArguments("a path holds a NUL".into()))?;
    Ok((binds.into_iter().map(|(_, b)| b).collect(), masks))
}

/// The mount points of this process's mount namespace, each with whether its own flags make it
/// read-only (`/proc/self/mountinfo`; none when it cannot be read, as where `/proc` is not
/// mounted).
fn mounts_of_this_process() -> Vec<(PathBuf, bool)> {
    match std::fs::read_to_string("/proc/self/mountinfo") {
        Ok(table) => mount_points(&table),
        Err(e) => {
            // Once: it is read for every command.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!(
                    "cannot read /proc/self/mountinfo ({e}): read-only mounts in a workspace \
                     may be writable to its commands"
                )
            });
            Vec::new()
        }
    }
}

/// The mount points a `/proc/<pid>/mountinfo` table lists, in its order (a mount stacked on
/// another at one place comes after it), each with whether it is read-only: each line's fifth
/// field (the mount point, spaces and the like written as `\ooo`), and whether its sixth (the
/// mount's own options) holds `ro`.
fn mount_points(table: &str) -> Vec<(PathBuf, bool)> {
    table
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let point = fields.nth(4)?;
            let options = fields.next()?;
            let point = PathBuf::from(std::ffi::OsString::from_vec(unescape_octal(point)));
            Some((point, options.split(',').any(|o| o == "ro")))
        })
        .collect()
}

/// A `/proc/<pid>/mountinfo` field with its octal escapes (`\040` for a space) undone.
fn unescape_octal(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let code = bytes
            .get(i + 1..i + 4)
            .filter(|_| bytes[i] == b'\\')
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        match code {
            Some(b) => {
                out.push(b);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

/// What must stay read-only in the command's view of what it may write. A writable bind is made
/// writable with every mount under it, and where the view is made without a user namespace of
/// its own (a server or client running as root) the mounts' own read-only flags are not locked:
/// a folder mounted read-only became writable to commands. So a writable bind that lies in a
/// read-only mount (a workspace on a container's `:ro` volume) is made read-only itself, and the
/// read-only mounts strictly inside one (of `mounts`, this namespace's, the top one at each
/// place) are returned, each to be bound over itself and made read-only again. Each is checked
/// in the child to be the mount found here; one under a mask is left out (the mask hides the
/// way to it).
fn read_only_mounts_within(
    binds: &mut [child::Bind],
    masks: &[std::ffi::CString],
    mounts: &[(PathBuf, bool)],
) -> Vec<child::Bind> {
    use std::os::unix::fs::MetadataExt;
    let as_path = |c: &std::ffi::CString| PathBuf::from(std::ffi::OsStr::from_bytes(c.as_bytes()));
    let masks: Vec<PathBuf> = masks.iter().map(as_path).collect();
    // The top mount at each place: the last listed there.
    let top: std::collections::HashMap<&PathBuf, bool> =
        mounts.iter().map(|(point, ro)| (point, *ro)).collect();
    let mut kept: Vec<PathBuf> = Vec::new();
    for bind in binds.iter_mut().filter(|b| b.writable) {
        let writable = as_path(&bind.target);
        let lies_in = top
            .iter()
            .filter(|(point, _)| writable.starts_with(point))
            .max_by_key(|(point, _)| point.components().count());
        if lies_in.is_some_and(|(_, ro)| *ro) {
            bind.writable = false;
            continue;
        }
        kept.extend(
            top.iter()
                .filter(|&(point, &ro)| ro && point.starts_with(&writable) && **point != writable)
                .map(|(point, _)| (*point).clone()),
        );
    }
    kept.retain(|point| !masks.iter().any(|m| point.starts_with(m)));
    // Outer mounts before the ones inside them; each once.
    kept.sort_by(|a, b| (a.components().count(), a).cmp(&(b.components().count(), b)));
    kept.dedup();
    kept.into_iter()
        .filter_map(|point| {
            let meta = std::fs::metadata(&point).ok()?;
            Some(child::Bind {
                target: std::ffi::CString::new(point.as_os_str().as_bytes()).ok()?,
                from: point,
                id: (meta.dev(), meta.ino()),
                writable: false,
                dir: meta.is_dir(),
                masked: false,
            })
        })
        .collect()
}

/// How many paths [`git_protections`] may bind.
const GIT_BINDS: usize = 5;

/// git's own files that name programs git runs outside any sandbox (`.git/config`: its fsmonitor,
/// pager and aliases; `.git/hooks`; and, when they are there, the [`GIT_REDIRECTS`]), bound
/// read-only over themselves in a namespaced command's view, after the workspace and after
/// `.git` itself, bound over itself: the command may still
/// write the rest of `.git` (`git commit` does), but writing these fails with `EROFS`, and
/// renaming over them, or renaming or replacing `.git` (with a copy whose config it wrote), with
/// `EBUSY`. landlock could not do it, since it cannot take a part out of a tree it grants. Only a
/// real `.git` directory at the root, and only what is there now (a regular file, a directory;
/// never a link); each is checked again in the child to be what was found here. One of the
/// [`GIT_REDIRECTS`] the command makes is taken away when it ends ([`GitGuard`]).
fn git_protections(jail: &Jail) -> Vec<child::Bind> {
    use cap_std::fs::MetadataExt;
    const PROTECTED: [(&str, bool, bool); GIT_BINDS] = [
        (".git", true, true),
        (".git/config", false, false),
        (".git/hooks", true, false),
        (".git/commondir", false, false),
        (".git/config.worktree", false, false),
    ];
    let Ok(git) = jail.dir().symlink_metadata(".git") else {
        return Vec::new();
    };
    if !git.file_type().is_dir() {
        return Vec::new();
    }
    let mut protected = Vec::new();
    for (rel, dir, writable) in PROTECTED {
        let Ok(meta) = jail.dir().symlink_metadata(rel) else {
            continue;
        };
        let kind = meta.file_type();
        if (dir && !kind.is_dir()) || (!dir && !kind.is_file()) {
            continue;
        }
        let path = jail.root_path().join(rel);
        let Ok(target) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
            continue;
        };
        protected.push(child::Bind {
            target,
            from: path,
            id: (meta.dev(), meta.ino()),
            writable,
            dir,
            masked: false,
        });
    }
    protected
}

/// Files in `.git` that git reads config (and so programs it runs outside any sandbox, when the
/// folder's owner next runs it) from, that git itself makes only elsewhere or on the config's
/// say: `commondir` names the directory git reads its config and hooks from (git makes one only
/// in a linked worktree's git directory); `config.worktree` is read when the config turns
/// `extensions.worktreeConfig` on. Watched by [`GitGuard`], bound read-only when there
/// ([`git_protections`]).
const GIT_REDIRECTS: [&str; 2] = ["commondir", "config.worktree"];

/// Watches over [`GIT_REDIRECTS`] in `.git` at the workspace's root while a command runs, in or
/// out of namespaces: one the command made (say, a `commondir` naming a copy of `.git` with a
/// config of its choosing elsewhere in the workspace) is removed when the command ends, and said
/// on its standard error; or when the guard goes without that (the command's task dropped, the
/// process shutting down), all the same. One that was there before is bound read-only in
/// namespaces ([`git_protections`]).
pub(crate) struct GitGuard {
    /// The workspace's `.git` directory, as opened when the command started.
    git: cap_std::fs::Dir,
    /// Those of [`GIT_REDIRECTS`] that were not there then.
    watched: Vec<&'static str>,
}

impl GitGuard {
    /// A guard over `jail`'s `.git`, when it is a directory that lacks one of [`GIT_REDIRECTS`].
    fn of(jail: &Jail) -> Option<GitGuard> {
        let git = cap_fs_ext::DirExt::open_dir_nofollow(jail.dir(), ".git").ok()?;
        let watched: Vec<&'static str> = GIT_REDIRECTS
            .into_iter()
            .filter(|name| git.symlink_metadata(name).is_err())
            .collect();
        (!watched.is_empty()).then_some(GitGuard { git, watched })
    }

    /// Removes what the command made of [`GIT_REDIRECTS`] (a file, a link, a directory) and
    /// says what was done, or why it could not be. Once: a second call looks at nothing.
    pub(crate) fn check(&mut self) -> Option<String> {
        let mut said = String::new();
        for name in std::mem::take(&mut self.watched) {
            let Ok(meta) = self.git.symlink_metadata(name) else {
                continue;
            };
            let removed = if meta.is_dir() {
                self.git.remove_dir_all(name)
            } else {
                self.git.remove_file(name)
            };
            let what = format!(
                "the command made .git/{name}, which would make git read its config and hooks \
                 (programs it runs outside any sandbox) from elsewhere, or fail"
            );
            said.push_str(&match removed {
                Ok(()) => format!("monad: {what}; it was removed\n"),
                Err(e) => format!("monad: {what}; it could not be removed ({e}): remove it\n"),
            });
        }
        (!said.is_empty()).then_some(said)
    }
}

impl Drop for GitGuard {
    fn drop(&mut self) {
        // Only when `check` was not made (the command's task dropped).
        if let Some(said) = self.check() {
            tracing::warn!("{}", said.trim_end());
        }
    }
}

/// The directories to mask so that `paths` can be reached: for each path, its highest strict
/// ancestor that `searchable` says no to (not `/`); none under another. Pure, for tests.
pub fn masks_for(
    paths: &[&std::path::Path],
    searchable: impl Fn(&std::path::Path) -> bool,
) -> Vec<PathBuf> {
    let mut masks: Vec<PathBuf> = Vec::new();
    for path in paths {
        let blocked = path
            .ancestors()
            .skip(1)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .filter(|a| a.parent().is_some())
            .find(|a| !searchable(a));
        if let Some(blocked) = blocked
            && !masks.iter().any(|m| blocked.starts_with(m))
        {
            masks.retain(|m| !m.starts_with(blocked));
            masks.push(blocked.to_path_buf());
        }
    }
    masks.sort();
    masks
}

/// The highest capability number this kernel knows (`/proc/sys/kernel/cap_last_cap`), read once.
fn cap_last() -> u32 {
    static LAST: OnceLock<u32> = OnceLock::new();
    *LAST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(63)
    })
}

/// Why a command could not start, from the error its spawn or its start pipe gave; `bound`: its
/// user's process group, whose bound is named when a fork failed at it.
fn spawn_error(
    program: &str,
    err: std::io::Error,
    isolation: Isolation,
    bound: Option<&Bound>,
) -> SandboxError {
    use child::Failed;
    let user = isolation
        .identity
        .map(|who| format!("uid {}", who.uid))
        .unwrap_or_else(|| "the command's user".into());
    let Some(code) = err.raw_os_error() else {
        return SandboxError::Io {
            op: "start",
            path: program.to_owned(),
            source: err,
        };
    };
    let (what, errno) = match child::unpack(code) {
        Ok(failed) => failed,
        // `execve`'s own, said as the check before approval says it.
        Err(libc::ENOENT | libc::ENOTDIR) if program.contains('/') => {
            return program_not_found(program);
        }
        Err(libc::ENOENT) => {
            return SandboxError::NotFound(format!(
                "program `{}` is not found in the sandbox's PATH{}",
                crate::error::shown(program),
                lossy_hint(program)
            ));
        }
        Err(libc::EACCES) => {
            return SandboxError::InvalidArguments(format!(
                "`{}` cannot be executed here: it is not executable, or it lies outside \
                 the workspace and the system directories the sandbox allows",
                crate::error::shown(program)
            ));
        }
        Err(errno) => {
            return SandboxError::Io {
                op: "start",
                path: program.to_owned(),
                source: std::io::Error::from_raw_os_error(errno),
            };
        }
    };
    if errno == libc::EAGAIN
        && let Some(bound) = bound.filter(|bound| bound.refused_since())
    {
        return bound.refusal();
    }
    // What the system call said, when one failed (0: a check failed).
    let said = match errno {
        0 => String::new(),
        errno => format!(" ({})", std::io::Error::from_raw_os_error(errno)),
    };
    let message = match (what, errno) {
        (Failed::Cwd, libc::EACCES | libc::EPERM) => format!(
            "commands here run as {user} (Monad runs as root, and commands never do), and that \
             user cannot enter the working directory; give the folder to that user, or set \
             [exec] user to one that can"
        ),
        (Failed::Cwd, 0) => "the workspace's folder changed while the command started".into(),
        (Failed::Cwd, _) => format!("the working directory could not be entered{said}"),
        (Failed::Landlock, _) => {
            format!("the kernel did not fully enforce the landlock ruleset{said}")
        }
        (Failed::Seccomp, _) => format!(
            "the kernel refused the seccomp filter that keeps commands away from sockets and \
             namespaces{said}"
        ),
        (Failed::Namespaces, _) => format!(
            "the command could not join or make its namespaces{said}; the next command tries \
             again"
        ),
        (Failed::View, 0) => "a path of the command's view of the filesystem changed while \
                              it was mounted (it is made again for the next command)"
            .into(),
        (Failed::View, _) => format!(
            "the command's view of the filesystem (the workspace and temporary directory bound \
             writable, the rest read-only) could not be mounted{said}"
        ),
        (Failed::Identity, _) => {
            format!("the command could not take on its unprivileged user ({user}){said}")
        }
        (Failed::Capabilities, _) => {
            format!("the command's capabilities could not all be cleared{said}")
        }
        (Failed::Limits, _) => format!("the command's rlimits could not be set{said}"),
        (Failed::Tree, _) => format!(
            "the process tree that ends everything the command starts could not be made{said}"
        ),
        (Failed::Group, _) => format!(
            "the command could not join the process group (a cgroup) that bounds its user's \
             processes{said}"
        ),
    };
    SandboxError::SandboxUnavailable(message)
}

/// Parses a signal name for `process_kill` (`TERM`, `SIGTERM`, `term`, ...).
pub(crate) fn parse_signal(name: Option<&str>) -> Result<(c_signal, &'static str), SandboxError> {
    let name = name.unwrap_or("TERM").trim();
    let bare = name
        .strip_prefix("SIG")
        .or_else(|| name.strip_prefix("sig"))
        .unwrap_or(name)
        .to_ascii_uppercase();
    let found = [
        (libc::SIGTERM, "TERM"),
        (libc::SIGINT, "INT"),
        (libc::SIGHUP, "HUP"),
        (libc::SIGQUIT, "QUIT"),
        (libc::SIGUSR1, "USR1"),
        (libc::SIGUSR2, "USR2"),
        (libc::SIGKILL, "KILL"),
    ]
    .into_iter()
    .find(|(_, n)| *n == bare);
    found.ok_or_else(|| {
        SandboxError::InvalidArguments(format!(
            "signal `{}` is not one of TERM, INT, HUP, QUIT, USR1, USR2, KILL",
            crate::error::shown(name)
        ))
    })
}

/// A signal number.
#[allow(non_camel_case_types)]
pub(crate) type c_signal = libc::c_int;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_only_mounts_are_read_from_mountinfo_and_kept_only_inside_writable_binds() {
        let table = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 8:1 /ref /work/proj/ref ro,relatime shared:2 - ext4 /dev/sda1 rw
41 22 8:1 /x /work/proj/my\\040docs ro shared:3 - ext4 /dev/sda1 rw
42 22 8:1 /y /work/proj/data rw,nosuid shared:4 - ext4 /dev/sda1 ro
bad line
";
        assert_eq!(
            mount_points(table),
            [
                (PathBuf::from("/"), false),
                (PathBuf::from("/work/proj/ref"), true),
                (PathBuf::from("/work/proj/my docs"), true),
                (PathBuf::from("/work/proj/data"), false),
            ],
            "the mount's own options decide, not the file system's"
        );
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("proj");
        let other = dir.path().join("other");
        let volume = dir.path().join("volume");
        for made in [
            root.join("ref/deeper"),
            root.join("hidden/ro"),
            other.clone(),
            volume.join("ws"),
            root.join("stacked"),
        ] {
            std::fs::create_dir_all(made).unwrap();
        }
        let bind = |path: &std::path::Path, writable| child::Bind {
            target: std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap(),
            from: path.to_path_buf(),
            id: (0, 0),
            writable,
            dir: true,
            masked: false,
        };
        let mut binds = [
            bind(&root, true),
            bind(&other, false),
            bind(&volume.join("ws"), true),
        ];
        let mask = std::ffi::CString::new(root.join("hidden").as_os_str().as_bytes()).unwrap();
        let found = read_only_mounts_within(
            &mut binds,
            &[mask],
            &[
                (PathBuf::from("/"), false),
                (root.join("ref/deeper"), true),
                (root.clone(), false),
                (other.clone(), true),
                (root.join("ref"), true),
                (root.join("gone"), true),
                (root.join("hidden/ro"), true),
                // Read-only, then covered by a writable mount: the top one decides.
                (root.join("stacked"), true),
                (root.join("stacked"), false),
                // A workspace lying in a read-only mount stays read-only itself.
                (volume.clone(), true),
            ],
        );
        let targets: Vec<&std::path::Path> = found.iter().map(|b| b.from.as_path()).collect();
        assert_eq!(targets, [root.join("ref"), root.join("ref/deeper")]);
        assert!(found.iter().all(|b| !b.writable && !b.masked && b.dir));
        assert_eq!(
            binds.map(|b| b.writable),
            [true, false, false],
            "a workspace lying in a read-only mount is read-only itself"
        );
    }

    fn plan(policy: &ExecPolicy, namespaced: bool) -> Result<SandboxPlan, SandboxError> {
        let tmp = tempfile::tempdir().unwrap();
        let jail = Jail::open_ambient(tmp.path()).unwrap();
        SandboxPlan::new(
            &jail,
            policy,
            "/tmp/x".into(),
            Some(Duration::from_secs(5)),
            Isolation {
                namespaced,
                identity: None,
            },
        )
    }

    #[test]
    fn plan_scrubs_the_environment_and_lets_the_operator_override() {
        let policy = ExecPolicy {
            env: [("LANG", "en_GB.UTF-8"), ("CI", "1")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            ..ExecPolicy::default()
        };
        let plan = plan(&policy, true).unwrap();
        let keys: Vec<&str> = plan.env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "PATH",
                "HOME",
                "PWD",
                "TMPDIR",
                "TERM",
                "GIT_CONFIG_COUNT",
                "GIT_CONFIG_KEY_0",
                "GIT_CONFIG_VALUE_0",
                "CI",
                "LANG"
            ]
        );
        assert!(plan.env.contains(&("LANG".into(), "en_GB.UTF-8".into())));
        assert_eq!(plan.write_dirs, [PathBuf::from("/tmp/x")]);
        assert!(plan.read_dirs.contains(&PathBuf::from("/usr")));
        assert!(
            !plan
                .read_dirs
                .iter()
                .any(|p| p.starts_with("/proc") || p.starts_with("/home"))
        );
        // The time limit (5 s) and a second, on every core: a process's threads share it.
        let cores = std::thread::available_parallelism().unwrap().get() as u64;
        assert_eq!(plan.cpu_seconds, Some(6 * cores));
    }

    #[test]
    fn the_network_mode_decides_namespaces_sockets_and_the_proxy() {
        let with = |network, namespaced| {
            plan(
                &ExecPolicy {
                    network,
                    ..ExecPolicy::default()
                },
                namespaced,
            )
        };
        let off = with(NetworkMode::Off, true).unwrap();
        assert_eq!(
            (off.sockets, off.own_network, off.proxy_port, off.deny_tcp),
            (Sockets::Inet, true, None, false)
        );
        let off = with(NetworkMode::Off, false).unwrap();
        assert_eq!(
            (off.sockets, off.own_network, off.deny_tcp),
            (Sockets::None, false, true),
            "without a network namespace, off means no socket at all"
        );
        let host = with(NetworkMode::Host, true).unwrap();
        assert_eq!((host.sockets, host.own_network), (Sockets::Inet, false));
        let listed = with(NetworkMode::Allowlist, true).unwrap();
        assert_eq!(listed.proxy_port, Some(PROXY_PORT));
        assert!(listed.own_network);
        assert!(listed.env.contains(&(
            "HTTPS_PROXY".into(),
            format!("http://127.0.0.1:{PROXY_PORT}")
        )));
        let err = with(NetworkMode::Allowlist, false).unwrap_err();
        assert_eq!(
            err.code(),
            monad_protocol::ErrorCode::SandboxUnavailable,
            "fails closed: {err}"
        );
    }

    #[test]
    fn a_workspace_toolchain_comes_first_in_path() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join(".venv/bin")).unwrap();
        std::fs::create_dir_all(tmp.path().join("node_modules/.bin")).unwrap();
        let jail = Jail::open_ambient(tmp.path()).unwrap();
        let plan = SandboxPlan::new(
            &jail,
            &ExecPolicy::default(),
            "/tmp/x".into(),
            None,
            Isolation {
                namespaced: true,
                identity: None,
            },
        )
        .unwrap();
        let root = jail.root_path().display().to_string();
        let path = &plan.env.iter().find(|(k, _)| k == "PATH").unwrap().1;
        assert!(
            path.starts_with(&format!("{root}/.venv/bin:{root}/node_modules/.bin:/usr")),
            "{path}"
        );
        assert!(
            plan.env
                .contains(&("VIRTUAL_ENV".into(), format!("{root}/.venv")))
        );
        assert_eq!(plan.cpu_seconds, None, "no time limit, no CPU limit");
    }

    #[test]
    fn a_sandbox_that_fails_in_the_child_is_reported_as_unavailable() {
        use monad_protocol::ErrorCode;
        let isolation = Isolation {
            namespaced: true,
            identity: Some(Identity {
                uid: 65534,
                gid: 65534,
            }),
        };
        use child::Failed;
        for what in Failed::ALL {
            let packed = child::pack(what, libc::EMFILE);
            assert_eq!(child::unpack(packed), Ok((what, libc::EMFILE)));
            let err = spawn_error(
                "x",
                std::io::Error::from_raw_os_error(packed),
                isolation,
                None,
            );
            assert_eq!(err.code(), ErrorCode::SandboxUnavailable, "{err}");
            assert!(err.to_string().contains("Too many open files"), "{err}");
        }
        let cwd = spawn_error(
            "x",
            std::io::Error::from_raw_os_error(child::pack(Failed::Cwd, libc::EACCES)),
            isolation,
            None,
        );
        assert!(cwd.to_string().contains("uid 65534"), "{cwd}");
        // `execve`'s own errors are plain errno values.
        assert_eq!(child::unpack(libc::ENOENT), Err(libc::ENOENT));
        let missing = spawn_error(
            "x",
            std::io::Error::from_raw_os_error(libc::ENOENT),
            isolation,
            None,
        );
        assert_eq!(missing.code(), ErrorCode::NotFound);
    }

    #[test]
    fn masks_cover_the_highest_directory_a_user_cannot_search() {
        use std::path::Path;
        let closed = [Path::new("/root"), Path::new("/data/private")];
        let searchable = |p: &Path| !closed.contains(&p);
        let paths = [
            Path::new("/root/.local/share/monad/sessions/a/workspace"),
            Path::new("/root/.cargo"),
            Path::new("/data/private/x/y"),
            Path::new("/data/open"),
            Path::new("/tmp/monad-exec-1"),
        ];
        assert_eq!(
            masks_for(&paths, searchable),
            [PathBuf::from("/data/private"), PathBuf::from("/root")]
        );
        // A closed path itself is no ancestor: binding it would not let anyone in.
        assert!(masks_for(&[Path::new("/root")], searchable).is_empty());
        assert!(masks_for(&paths, |_| true).is_empty());
    }

    #[test]
    fn root_is_never_the_command_user() {
        assert!(named_identity("root").is_err());
        assert!(named_identity("0").is_err());
        assert!(named_identity("no-such-user-here").is_err());
        assert_eq!(named_identity("nobody").unwrap().uid, 65534);
    }

    #[test]
    fn signals_parse_with_or_without_their_prefix() {
        assert_eq!(parse_signal(None).unwrap(), (libc::SIGTERM, "TERM"));
        assert_eq!(parse_signal(Some("sigint")).unwrap().1, "INT");
        assert_eq!(parse_signal(Some("KILL")).unwrap().0, libc::SIGKILL);
        assert!(parse_signal(Some("STOP")).is_err());
        assert!(parse_signal(Some("9")).is_err());
    }
}
