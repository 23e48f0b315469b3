//! What runs between `fork` and `exec`: the sandbox's `unsafe` code, beside one call that sets a
//! thread's scheduling policy (`sched`).
//!
//! `Command::pre_exec` runs a closure in the forked child of a multi-threaded process, where only
//! async-signal-safe work is allowed: system calls, no allocation, no locks. Everything the
//! closure needs (rlimits, the landlock ruleset, the seccomp filter, the mount options, the
//! command's stack) is computed in the parent as a [`Spec`]; the child only makes system calls
//! with it.
//!
//! The forked child (the *supervisor*, the process the caller's `Child` handle names) turns into
//! a small process tree, so that everything a command starts ends with it:
//!
//! ```text
//! namespaced                                  fallback (no user namespaces)
//! supervisor   (joins the workspace's user,   supervisor   (a child subreaper)
//!   │           IPC and network namespaces,     └─ command  (own process group)
//!   │           makes PID and mount ones)
//!   └─ init    (pid 1: mounts a private
//!       │       /dev/shm and a read-only
//!       │       /proc, reaps)
//!       └─ command (own session)
//! ```
//!
//! - The supervisor forwards the signals it gets (`TERM`, `INT`, `HUP`, ...) to the command's
//!   process group, and on [`KILL_TREE`] kills the whole tree. It exits as the command did (same
//!   exit code, or killed by the same signal), so the caller sees the command's status.
//! - Supervisor and init are copies of the caller's memory: they are made undumpable at once
//!   (no core file, no `ptrace`, no `/proc/<pid>/mem`, environ or descriptors for anyone but
//!   root), and the command's process closes (on `exec`) every descriptor but its standard ones.
//! - Namespaced: when init exits (after the command), or is killed, the kernel kills every
//!   process left in the PID namespace: a `setsid` or double-forked child cannot outlive it.
//!   Init dies with the supervisor (`PR_SET_PDEATHSIG`), so killing the supervisor kills all.
//! - Fallback: orphans are re-parented to the supervisor (a subreaper); when the command ends,
//!   the supervisor kills every process it finds among its children until none is left.
//! - The command itself: its own session (or group), privileges dropped ([`Identity`], every
//!   capability set cleared, securebits locked), `no_new_privs`, landlock, then seccomp, then its
//!   rlimits, then `exec`. Anything that fails stops the spawn with a [`Failed`] stage and the
//!   errno of the system call (see [`pack`]), which `spawn_error` turns into a clear message; the
//!   program never runs half-confined.
//!
//! A workspace's shared namespaces are made by another child, the *maker* ([`spawn_maker`]),
//! which sends them to the parent over a socket and exits.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use nix::libc::{self, c_int};

use super::Rlimits;

/// What failed in a child before `exec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failed {
    /// landlock was not fully enforced.
    Landlock = 1,
    /// The seccomp filter could not be installed.
    Seccomp,
    /// The namespaces could not be joined or made.
    Namespaces,
    /// The command's view of the filesystem (masks, binds, read-only mounts) could not be made.
    View,
    /// The command's user could not be taken on.
    Identity,
    /// A capability set could not be cleared.
    Capabilities,
    /// The working directory could not be entered.
    Cwd,
    /// An rlimit could not be set.
    Limits,
    /// The process tree could not be set up (subreaper, pipes, the init process).
    Tree,
    /// The supervisor could not join its user's process group (a cgroup: [`super::cgroup`]).
    Group,
}

impl Failed {
    /// Every step, in the order a spawn takes them.
    pub(crate) const ALL: [Failed; 10] = [
        Failed::Group,
        Failed::Landlock,
        Failed::Seccomp,
        Failed::Namespaces,
        Failed::View,
        Failed::Identity,
        Failed::Capabilities,
        Failed::Cwd,
        Failed::Limits,
        Failed::Tree,
    ];

    fn from_code(code: i32) -> Option<Failed> {
        Failed::ALL.into_iter().find(|f| *f as i32 == code)
    }
}

/// Packs what failed and the errno of the system call that failed (0: none did, a check did)
/// into the one `i32` that the spawn's error pipe (and the start pipe) carries: `execve`'s own
/// errors are plain errno values, always below `1 << 16`.
pub(crate) fn pack(what: Failed, errno: c_int) -> i32 {
    ((what as i32) << 16) | (errno & 0xffff)
}

/// What [`pack`] packed: `Ok((what, errno))`, or `Err(errno)` for a plain errno (`execve`'s).
pub(crate) fn unpack(code: i32) -> Result<(Failed, i32), i32> {
    match Failed::from_code(code >> 16) {
        Some(what) => Ok((what, code & 0xffff)),
        None => Err(code),
    }
}

/// The signal that asks a supervisor to kill its whole tree at once (the last real-time signal;
/// the C library keeps the first ones for itself).
pub(crate) const KILL_TREE: c_int = 64;

/// The signals a supervisor passes on to the command.
const FORWARDED: [c_int; 9] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
    libc::SIGCONT,
    libc::SIGALRM,
];

/// Securebits for the command: root's special treatment off and locked, no capabilities kept
/// over a uid change or raised as ambient (`SECBIT_NOROOT`, `SECBIT_NO_CAP_AMBIENT_RAISE` and
/// every `_LOCKED` bit, with `SECBIT_NO_SETUID_FIXUP` and `SECBIT_KEEP_CAPS` locked off).
const SECUREBITS: libc::c_ulong = 0b1110_1011;

/// `struct landlock_path_beneath_attr`, packed as the kernel declares it.
#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}
/// `LANDLOCK_RULE_PATH_BENEATH`.
const LANDLOCK_RULE_PATH_BENEATH: libc::c_long = 1;
/// `LANDLOCK_CREATE_RULESET_VERSION`.
const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;

/// The user a command runs as, when the caller is root.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Identity {
    /// Its uid.
    pub uid: libc::uid_t,
    /// Its gid (its only group).
    pub gid: libc::gid_t,
}

/// How the namespaces are made: the workspace's own user, IPC and network namespaces (see
/// [`SharedSpec`]) are joined, and the PID and mount namespaces are the command's own.
#[derive(Debug)]
pub(crate) struct Namespaces {
    /// The workspace's user namespace.
    pub user: RawFd,
    /// The workspace's IPC namespace (System V IPC, POSIX message queues).
    pub ipc: RawFd,
    /// The workspace's network namespace (only a loopback), unless commands get the host's.
    pub net: Option<RawFd>,
    /// Options of the private `/dev/shm` (`size=...,mode=1777`), NUL-terminated.
    pub shm_options: std::ffi::CString,
    /// What the command sees of the filesystem besides the read-only rest (see
    /// [`Bind`]), in mount order (parents first).
    pub binds: Vec<Bind>,
    /// Directories the command's user may not search, on the way to a bound path: each gets an
    /// empty `tmpfs` holding just the way down to what is bound under it.
    pub masks: Vec<std::ffi::CString>,
    /// The workspace's root as a path, with its device and inode to check that the path still
    /// names it, and the working directory relative to it (`.` for the root).
    pub root: std::ffi::CString,
    pub root_id: (u64, u64),
    pub cwd: std::ffi::CString,
}

/// A path bound over itself in the command's mount namespace: the directories it may write
/// (the workspace, its temporary directory, the operator's `extra_write_paths`), which stay
/// writable when the rest is mounted read-only, and the directories it may read that lie under
/// a mask (opened before the mask hides them, bound back once the way down is made).
#[derive(Debug, Clone)]
pub(crate) struct Bind {
    /// Its canonical path.
    pub target: std::ffi::CString,
    /// The path of the plan (or the workspace's root) it was made from: the landlock rule for
    /// it was made on that path.
    pub from: std::path::PathBuf,
    /// The device and inode the parent found there for this spawn (the very directory its
    /// landlock rule names): the child binds it only if the path still leads there.
    pub id: (u64, u64),
    pub writable: bool,
    pub dir: bool,
    /// Under a mask: the way down to `target` is made first.
    pub masked: bool,
}

impl Bind {
    /// Neither writable nor under a mask: a part of a writable bind made read-only again (git's
    /// own files in the workspace), mounted after it.
    fn read_only_within(&self) -> bool {
        !self.writable && !self.masked
    }
}

/// Memory a process runs on from its start to `exec`: mapped apart, with a page below it that
/// faults, so that running out of it kills that process instead of writing over its parent's
/// memory.
struct Stack {
    base: *mut libc::c_void,
    len: usize,
}

impl Stack {
    fn new(size: usize) -> std::io::Result<Stack> {
        // SAFETY: sysconf, mmap, mprotect and munmap on a mapping made here and owned by the
        // value returned.
        unsafe {
            let page = match libc::sysconf(libc::_SC_PAGESIZE) {
                n if n > 0 => n as usize,
                _ => 4096,
            };
            let len = size.div_ceil(page) * page + page;
            let base = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE,
                -1,
                0,
            );
            if base == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error());
            }
            if libc::mprotect(base, page, libc::PROT_NONE) == -1 {
                let err = std::io::Error::last_os_error();
                libc::munmap(base, len);
                return Err(err);
            }
            Ok(Stack { base, len })
        }
    }

    /// Its top (a stack grows down), aligned for any call.
    fn top(&self) -> *mut libc::c_void {
        ((self.base as usize + self.len) & !0xf) as *mut libc::c_void
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping made by `Stack::new`, unmapped once; a child still running on it
        // has a copy of it (fork) or has run `exec` (the parent waits for that).
        unsafe {
            libc::munmap(self.base, self.len);
        }
    }
}

/// The program, its arguments and environment as the C arrays `execvp` takes, the stack the
/// command's process runs on until then, and where it reports a failure.
pub(crate) struct Exec {
    pub program: std::ffi::CString,
    _argv: Vec<std::ffi::CString>,
    _envp: Vec<std::ffi::CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    envp_ptrs: Vec<*const libc::c_char>,
    stack: Stack,
    /// Write end of the pipe the parent reads after the spawn: closed by `exec` (the command
    /// runs), or given the packed failure (see [`pack`]).
    pub status: OwnedFd,
}

// SAFETY: the raw pointers point into the `CString`s owned alongside them, which are never
// changed; the stack is only used by the one child process that runs on it.
unsafe impl Send for Exec {}
unsafe impl Sync for Exec {}

impl std::fmt::Debug for Exec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exec")
            .field("program", &self.program)
            .finish_non_exhaustive()
    }
}

/// Stack the command's process needs between its start and `exec`, besides what `execvp` takes
/// for a script without `#!` (a copy of the argument pointers, see [`Exec::new`]).
const COMMAND_STACK: usize = 256 * 1024;

/// Why a command could not be prepared.
#[derive(Debug)]
pub(crate) enum PrepareError {
    /// The program, an argument or the environment holds a NUL byte.
    Nul,
    /// No memory for its stack.
    Stack(std::io::Error),
}

impl Exec {
    /// Prepares `program` with `argv` (its first element included) and `env`; `status` is the
    /// write end of the parent's status pipe.
    pub fn new(
        program: &str,
        argv: &[String],
        env: &[(String, String)],
        status: OwnedFd,
    ) -> Result<Exec, PrepareError> {
        let argv: Vec<std::ffi::CString> = argv
            .iter()
            .map(|a| std::ffi::CString::new(a.as_bytes()))
            .collect::<Result<_, _>>()
            .map_err(|_| PrepareError::Nul)?;
        let envp: Vec<std::ffi::CString> = env
            .iter()
            .map(|(k, v)| std::ffi::CString::new(format!("{k}={v}")))
            .collect::<Result<_, _>>()
            .map_err(|_| PrepareError::Nul)?;
        let pointers = |list: &[std::ffi::CString]| {
            list.iter()
                .map(|c| c.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect::<Vec<_>>()
        };
        // glibc's `execvp` runs a program without `#!` with `/bin/sh`, building that argv (two
        // pointers more than this one) on the stack, as `posix_spawn` sizes its stack for.
        let script_argv = (argv.len() + 2) * std::mem::size_of::<*const libc::c_char>();
        let stack = Stack::new(COMMAND_STACK + script_argv).map_err(PrepareError::Stack)?;
        Ok(Exec {
            program: std::ffi::CString::new(program).map_err(|_| PrepareError::Nul)?,
            argv_ptrs: pointers(&argv),
            envp_ptrs: pointers(&envp),
            _argv: argv,
            _envp: envp,
            stack,
            status,
        })
    }
}

/// Everything the child needs, computed in the parent.
#[derive(Debug)]
pub(crate) struct Spec {
    pub rlimits: Rlimits,
    /// `RLIMIT_NPROC` for the command: in its user namespace, or (as root, without namespaces)
    /// for its workspace's own user.
    pub nproc: Option<u64>,
    /// `cgroup.procs` of the cgroups of the command's user's process group that the supervisor
    /// joins before anything else, and of those the command's own process joins just before
    /// `exec` (-1: none; see [`super::cgroup`]); open in the parent until the spawn returns.
    pub group: [RawFd; super::cgroup::MAX_MEMBERS],
    pub command_group: [RawFd; super::cgroup::MAX_MEMBERS],
    /// The working directory, opened through the jail.
    pub cwd: OwnedFd,
    /// Who the command runs as, when not as the caller (the caller is root).
    pub identity: Option<Identity>,
    /// `None`: the fallback tree.
    pub namespaces: Option<Namespaces>,
    /// The landlock ruleset; `None` only when the operator allowed unsandboxed commands.
    pub ruleset: Option<OwnedFd>,
    /// Access rights for the private `/proc` and `/dev/shm` (added to the ruleset in the child,
    /// since those mounts exist only there).
    pub proc_access: u64,
    pub shm_access: u64,
    pub filter: Option<Vec<libc::sock_filter>>,
    /// The calling process: the supervisor kills its tree when this one is gone.
    pub parent: libc::pid_t,
    /// What the command's process executes, prepared here: it runs on its own stack in its
    /// parent's memory until `exec` (see [`start_command`]).
    pub exec: Exec,
    /// The highest capability number this kernel knows.
    pub cap_last: u32,
}

/// Makes `command` run [`run`] with `spec` in its child, between `fork` and `exec`.
pub(crate) fn install(command: &mut tokio::process::Command, spec: Spec) {
    // SAFETY: the closure runs between fork and exec and calls `run`, which makes system calls
    // only, on data prepared in the parent (see its documentation).
    unsafe {
        command.pre_exec(move || run(&spec));
    }
}

/// Takes ownership of a descriptor the kernel just handed over (`SCM_RIGHTS`).
pub(crate) fn received(fd: RawFd) -> OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: only called on descriptors just received, which nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Runs in the forked child (see the module documentation). Returns only with an error, or in
/// the process that goes on to `exec` the command.
///
/// # Safety
///
/// Must be called between `fork` and `exec` (from `pre_exec`), where only async-signal-safe code
/// may run: it makes system calls on data prepared in the parent and never allocates.
unsafe fn run(spec: &Spec) -> std::io::Result<()> {
    // SAFETY: every call below is a plain system call on valid pointers to stack or parent-made
    // data that outlives it.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::sigprocmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
        // Counted with every other command of its user from here on, and all it starts with it.
        join(&spec.group)?;
        // A copy of the caller's memory: nobody but root may read it, and it never dumps core.
        // The command's own limits are set just before its `exec` (set here, the descriptor
        // limit would refuse the pipes this tree needs when the caller holds many).
        check(
            libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0).into(),
            Failed::Tree,
        )?;
        let no_core = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        check(
            libc::setrlimit(libc::RLIMIT_CORE, &no_core).into(),
            Failed::Limits,
        )?;
        // Nothing here is dropped: the child must not free memory, nor close what it does not
        // own (the parent's descriptors are closed by `exec`, or die with the process).
        match &spec.namespaces {
            Some(ns) => namespaced(spec, ns),
            None => fallback(spec),
        }
    }
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The failure `what`, with the errno of the system call that just failed.
fn fail(what: Failed) -> std::io::Error {
    fail_with(what, errno())
}

fn fail_with(what: Failed, errno: c_int) -> std::io::Error {
    std::io::Error::from_raw_os_error(pack(what, errno))
}

/// `Err(fail(what))` when a system call returned -1.
fn check(rc: libc::c_long, what: Failed) -> std::io::Result<()> {
    if rc == -1 { Err(fail(what)) } else { Ok(()) }
}

/// `fork` as a plain system call: unlike the C library's, it runs no `pthread_atfork` handlers
/// (which may take locks another thread held). The child must only make system calls.
unsafe fn raw_fork() -> libc::pid_t {
    unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0, 0, 0, 0) as _ }
}

unsafe fn namespaced(spec: &Spec, ns: &Namespaces) -> std::io::Result<()> {
    unsafe {
        if let Some(identity) = spec.identity {
            // Root's part, in a mount namespace of its own: the view is built while the way to
            // every path can still be walked (the command's user may not search a directory on
            // it: a 0700 data dir). The command's own namespaces, made next as that user, get a
            // copy of it in which these mounts are locked.
            check(libc::unshare(libc::CLONE_NEWNS).into(), Failed::View)?;
            make_private()?;
            mount_view(ns)?;
            become_user(identity)?;
        }
        enter_cwd(&spec.cwd)?;
        // The workspace's user namespace (its owner may join it: this user) and network.
        check(
            libc::setns(ns.user, libc::CLONE_NEWUSER).into(),
            Failed::Namespaces,
        )?;
        check(
            libc::setns(ns.ipc, libc::CLONE_NEWIPC).into(),
            Failed::Namespaces,
        )?;
        if let Some(net) = ns.net {
            check(
                libc::setns(net, libc::CLONE_NEWNET).into(),
                Failed::Namespaces,
            )?;
        }
        let flags = libc::CLONE_NEWPID | libc::CLONE_NEWNS;
        check(libc::unshare(flags).into(), Failed::Namespaces)?;
        let (status_r, status_w) = pipe()?;
        let (life_r, life_w) = pipe()?;
        match raw_fork() {
            -1 => Err(fail(Failed::Tree)),
            0 => {
                libc::close(status_r);
                libc::close(life_w);
                let failed = match init(spec, ns, status_w, life_r) {
                    Err(e) => e.raw_os_error().unwrap_or(libc::EIO),
                    Ok(never) => match never {},
                };
                // Init is not the process `pre_exec` runs in: its failure goes to the command's
                // status pipe, and it ends.
                let bytes = failed.to_ne_bytes();
                libc::write(
                    spec.exec.status.as_raw_fd(),
                    bytes.as_ptr().cast(),
                    bytes.len(),
                );
                libc::_exit(127)
            }
            init_pid => {
                close_all_but(&[status_r, life_w]);
                supervise_namespace(init_pid, status_r, spec.parent)
            }
        }
    }
}

/// What it takes to make a workspace's shared namespaces (see [`spawn_maker`]).
#[derive(Debug)]
pub(crate) struct SharedSpec {
    /// Who the workspace's commands run as, when not as the caller (the caller is root).
    pub identity: Option<Identity>,
    /// A network namespace too (else commands get the host's network).
    pub net: bool,
    /// `uid_map` and `gid_map` (the user mapped to itself), written by the maker itself when
    /// it runs as the caller; as root the caller writes them (see [`spawn_maker`]).
    pub uid_map: Vec<u8>,
    pub gid_map: Vec<u8>,
    /// Where the proxy of `network = "allowlist"` listens inside the network namespace.
    pub proxy_port: Option<u16>,
    /// The maker's end of a `SOCK_SEQPACKET` pair (see [`spawn_maker`]).
    pub to: OwnedFd,
}

/// Where the maker stopped (see [`spawn_maker`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MakerStage {
    /// Taking on the commands' user.
    Identity = 1,
    /// `unshare(CLONE_NEWUSER)`.
    User,
    /// Writing its own `setgroups`, `uid_map`, `gid_map` (the caller's, as root: see
    /// [`spawn_maker`]).
    Maps,
    /// `unshare` of the IPC, PID and network namespaces.
    Namespaces,
    /// A mount namespace and a `tmpfs` mounted in it: some kernels (AppArmor's restriction of
    /// unprivileged user namespaces) let a user namespace be made but not used.
    Mount,
    /// Opening the namespaces to send them.
    Open,
    /// The loopback and the proxy's socket in the network namespace.
    Network,
}

impl MakerStage {
    pub(crate) fn from_byte(byte: u8) -> Option<MakerStage> {
        [
            MakerStage::Identity,
            MakerStage::User,
            MakerStage::Maps,
            MakerStage::Namespaces,
            MakerStage::Mount,
            MakerStage::Open,
            MakerStage::Network,
        ]
        .into_iter()
        .find(|s| *s as u8 == byte)
    }
}

/// Messages on the maker's socket: the maker made its user namespace and, running as the
/// commands' user, waits for the caller to write its maps ...
pub(crate) const MAKER_MAP_ME: u8 = b'U';
/// ... which the caller did (any other answer, or none, ends the maker);
pub(crate) const MAKER_GO_ON: u8 = b'G';
/// the namespaces (`SCM_RIGHTS`, in this order: user, IPC, network, proxy socket);
pub(crate) const MAKER_DONE: u8 = b'F';
/// a failure: this byte, the [`MakerStage`], and the errno (4 bytes, native order).
pub(crate) const MAKER_FAILED: u8 = b'E';

/// Starts the maker: a child that makes a workspace's shared namespaces, sends them over
/// `spec.to` and exits. It closes every other descriptor first. As the commands' user (the
/// caller is root) it stays undumpable for its whole life, so no process of that user can read
/// its memory (a copy of the caller's) or take its descriptors; the caller writes its uid and
/// gid maps, as `newuidmap` does, when it says [`MAKER_MAP_ME`]. Returns its pid; the caller
/// must reap it.
pub(crate) fn spawn_maker(spec: &SharedSpec) -> std::io::Result<libc::pid_t> {
    // SAFETY: signals are blocked around the fork, so no handler of the caller's runs in the
    // child; the child runs `make_shared` (system calls only, on data prepared in the parent,
    // no allocation) and exits without returning.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut before: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut before);
        let pid = raw_fork();
        if pid == 0 {
            make_shared(spec)
        }
        let err = std::io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
        if pid == -1 { Err(err) } else { Ok(pid) }
    }
}

/// Reports a failure at `stage` to the caller and ends the maker.
unsafe fn maker_failed(to: RawFd, stage: MakerStage, errno: c_int) -> ! {
    unsafe {
        let mut message = [0u8; 6];
        message[0] = MAKER_FAILED;
        message[1] = stage as u8;
        message[2..].copy_from_slice(&errno.to_ne_bytes());
        libc::send(
            to,
            message.as_ptr().cast(),
            message.len(),
            libc::MSG_NOSIGNAL,
        );
        libc::_exit(1)
    }
}

/// The maker (see [`spawn_maker`]).
unsafe fn make_shared(spec: &SharedSpec) -> ! {
    unsafe {
        let to = spec.to.as_raw_fd();
        close_all_but(&[to]);
        let step = |rc: c_int, stage: MakerStage| {
            if rc == -1 {
                maker_failed(to, stage, errno());
            }
        };
        if let Some(identity) = spec.identity {
            if become_user(identity).is_err() {
                maker_failed(to, MakerStage::Identity, errno());
            }
            // The uid change made it undumpable; it stays so.
            step(
                libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0),
                MakerStage::Identity,
            );
        }
        step(libc::unshare(libc::CLONE_NEWUSER), MakerStage::User);
        if spec.identity.is_some() {
            let asked = [MAKER_MAP_ME];
            if libc::send(to, asked.as_ptr().cast(), 1, libc::MSG_NOSIGNAL) != 1 {
                libc::_exit(1);
            }
            let mut answer = [0u8; 1];
            if libc::recv(to, answer.as_mut_ptr().cast(), 1, 0) != 1 || answer[0] != MAKER_GO_ON {
                libc::_exit(1);
            }
        } else {
            for (path, bytes) in [
                (c"/proc/self/setgroups", &b"deny"[..]),
                (c"/proc/self/uid_map", &spec.uid_map[..]),
                (c"/proc/self/gid_map", &spec.gid_map[..]),
            ] {
                if let Err(errno) = write_file(path, bytes) {
                    maker_failed(to, MakerStage::Maps, errno);
                }
            }
        }
        let mut flags = libc::CLONE_NEWIPC | libc::CLONE_NEWPID;
        if spec.net {
            flags |= libc::CLONE_NEWNET;
        }
        step(libc::unshare(flags), MakerStage::Namespaces);
        step(libc::unshare(libc::CLONE_NEWNS), MakerStage::Mount);
        step(
            libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ),
            MakerStage::Mount,
        );
        step(
            libc::mount(
                c"tmpfs".as_ptr(),
                c"/dev/shm".as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                c"size=4k".as_ptr().cast(),
            ),
            MakerStage::Mount,
        );
        let mut fds = [-1 as RawFd; 4];
        let mut count = 0;
        for path in [
            c"/proc/self/ns/user",
            c"/proc/self/ns/ipc",
            c"/proc/self/ns/net",
        ] {
            if path == c"/proc/self/ns/net" && !spec.net {
                continue;
            }
            let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            step(fd, MakerStage::Open);
            fds[count] = fd;
            count += 1;
        }
        if spec.net
            && let Err(errno) = loopback_up()
        {
            maker_failed(to, MakerStage::Network, errno);
        }
        if let Some(port) = spec.proxy_port {
            match proxy_listener(port) {
                Ok(fd) => {
                    fds[count] = fd;
                    count += 1;
                }
                Err(errno) => maker_failed(to, MakerStage::Network, errno),
            }
        }
        if !send_fds(to, MAKER_DONE, &fds[..count]) {
            libc::_exit(1);
        }
        libc::_exit(0);
    }
}

/// Pid 1 of the new PID namespace: makes the private mounts, starts the command, then reaps
/// until the command exits and reports its status to the supervisor.
unsafe fn init(
    spec: &Spec,
    ns: &Namespaces,
    status_w: RawFd,
    life_r: RawFd,
) -> std::io::Result<std::convert::Infallible> {
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        // The supervisor may have died before the line above: then its end of the pipe is
        // closed, and this process must not go on by itself.
        let mut poll = libc::pollfd {
            fd: life_r,
            events: libc::POLLIN,
            revents: 0,
        };
        if libc::poll(&mut poll, 1, 0) != 0 {
            libc::_exit(1);
        }
        libc::close(life_r);
        let mut mounted = Mounted::default();
        make_private()?;
        if spec.identity.is_none() {
            // An ordinary user builds the view here, in the namespace it owns.
            mount_view(ns)?;
        }
        {
            mounted.shm = libc::mount(
                c"tmpfs".as_ptr(),
                c"/dev/shm".as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                ns.shm_options.as_ptr().cast(),
            ) == 0;
            // Read-only, and showing only the processes the command may trace: its own, not
            // this init (a copy of the caller, whose command line may hold a password).
            let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_RDONLY;
            mounted.proc = [c"hidepid=invisible", c"hidepid=2"].iter().any(|options| {
                libc::mount(
                    c"proc".as_ptr(),
                    c"/proc".as_ptr(),
                    c"proc".as_ptr(),
                    flags,
                    options.as_ptr().cast(),
                ) == 0
            });
        }
        let command_pid = start_command(spec, mounted, Some(ns), &[status_w])?;
        close_all_but(&[status_w]);
        reap_as_init(command_pid, status_w)
    }
}

/// What the command's process gets from the process that starts it.
struct CommandStart<'a> {
    spec: &'a Spec,
    mounted: Mounted,
    namespaces: Option<&'a Namespaces>,
    /// Descriptors of the starting process the command must not keep (at most two).
    close: [RawFd; 2],
}

/// Starts the command's process with `clone(CLONE_VM | CLONE_VFORK)`, as `posix_spawn` does: it
/// runs on its own stack in this process's memory, and this process waits until it has called
/// `exec` (or died). A `fork` would copy the caller's whole address space, a few hundred
/// microseconds for a server, only for `exec` to throw the copy away. Returns its pid.
unsafe fn start_command(
    spec: &Spec,
    mounted: Mounted,
    namespaces: Option<&Namespaces>,
    close: &[RawFd],
) -> std::io::Result<libc::pid_t> {
    unsafe {
        let mut start = CommandStart {
            spec,
            mounted,
            namespaces,
            close: [-1; 2],
        };
        for (slot, fd) in start.close.iter_mut().zip(close) {
            *slot = *fd;
        }
        let pid = libc::clone(
            run_command,
            spec.exec.stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&mut start as *mut CommandStart<'_>).cast(),
        );
        if pid == -1 {
            return Err(fail(Failed::Tree));
        }
        Ok(pid)
    }
}

unsafe extern "C" {
    static mut environ: *const *const libc::c_char;
}

/// The command's process: confine it, then `execvp` (which looks the program up in the `PATH`
/// of the environment it gets, and runs a script without `#!` with `/bin/sh`). On any failure,
/// what failed goes to the parent's status pipe and the process exits.
extern "C" fn run_command(arg: *mut libc::c_void) -> c_int {
    // SAFETY: `arg` is the `CommandStart` of `start_command`, alive while its caller waits for
    // this process to exec or exit (CLONE_VFORK). Only system calls follow; `environ` is
    // written in the shared memory of a process that never reads it again.
    unsafe {
        let start = &*(arg as *const CommandStart<'_>);
        for fd in start.close {
            if fd >= 0 {
                libc::close(fd);
            }
        }
        let spec = start.spec;
        let exec = &spec.exec;
        let failed = match command(spec, start.mounted, start.namespaces)
            .and_then(|()| last_before_exec(spec))
        {
            Err(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Ok(()) => {
                environ = exec.envp_ptrs.as_ptr();
                libc::execvp(exec.program.as_ptr(), exec.argv_ptrs.as_ptr());
                errno()
            }
        };
        let bytes = failed.to_ne_bytes();
        libc::write(exec.status.as_raw_fd(), bytes.as_ptr().cast(), bytes.len());
        libc::_exit(127)
    }
}

/// Just before `exec`: every descriptor but the standard ones is closed by it (whatever the
/// caller holds without `O_CLOEXEC`, as inherited from what started it), and the command's
/// rlimits take effect (no more descriptors are needed here).
unsafe fn last_before_exec(spec: &Spec) -> std::io::Result<()> {
    unsafe {
        // The memory bound of its user's commands: the command and what it starts, not its
        // supervisor and init (see `cgroup::Member`). The descriptors were opened by the server,
        // whose rights the kernel checks.
        join(&spec.command_group)?;
        if libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC as libc::c_uint,
        ) == -1
        {
            // Kernels before 5.11 (only without landlock ABI 3): one by one.
            let mut limit: libc::rlimit = std::mem::zeroed();
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
            for fd in 3..limit.rlim_cur.min(1 << 20) as c_int {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            }
        }
        spec.rlimits
            .apply()
            .map_err(|e| fail_with(Failed::Limits, e as c_int))?;
        if let Some(n) = spec.nproc {
            let limit = libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            };
            check(
                libc::setrlimit(libc::RLIMIT_NPROC, &limit).into(),
                Failed::Limits,
            )?;
        }
        Ok(())
    }
}

/// Joins each cgroup of `procs` (its `cgroup.procs`, open for writing; -1: none).
unsafe fn join(procs: &[RawFd]) -> std::io::Result<()> {
    for &fd in procs {
        // SAFETY: a write of a static byte to a descriptor, which the caller holds open.
        if fd >= 0 && unsafe { libc::write(fd, c"0".as_ptr().cast(), 1) } != 1 {
            return Err(fail(Failed::Group));
        }
    }
    Ok(())
}

/// The private mounts that init managed to make.
#[derive(Debug, Clone, Copy, Default)]
struct Mounted {
    proc: bool,
    shm: bool,
}

/// Makes every mount of this (new) mount namespace private: nothing mounted here propagates
/// back.
unsafe fn make_private() -> std::io::Result<()> {
    unsafe {
        let rc = libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        );
        check(rc.into(), Failed::View)
    }
}

/// Mounts the masks and the binds, then everything read-only but the writable binds (which
/// lose set-uid programs and devices): landlock decides what a command may open, but not
/// whether it may change the mode, owner or times of a file it owns; a read-only mount refuses
/// that outside the workspace.
unsafe fn mount_view(ns: &Namespaces) -> std::io::Result<()> {
    unsafe {
        // Opened in this namespace (a bind's source must be), before any mask hides them.
        let mut fds = [-1 as RawFd; MAX_BINDS];
        if ns.binds.len() > MAX_BINDS {
            return Err(fail_with(Failed::View, libc::E2BIG));
        }
        for (fd, bind) in fds.iter_mut().zip(&ns.binds) {
            *fd = libc::open(bind.target.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
            if *fd == -1 {
                return Err(fail(Failed::View));
            }
        }
        // Each must be the directory the parent found there (the one its landlock rule names),
        // not one swapped in since.
        for (&fd, bind) in fds.iter().zip(&ns.binds) {
            if !is_at(fd, bind.id) {
                return Err(fail_with(Failed::View, 0));
            }
        }
        for mask in &ns.masks {
            let rc = libc::mount(
                c"tmpfs".as_ptr(),
                mask.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                c"mode=0755,size=1m".as_ptr().cast(),
            );
            check(rc.into(), Failed::View)?;
        }
        // Each place is looked up again after the masks and the binds before it (it may lie on
        // them), and never by a path the kernel resolves twice: a command of the same workspace
        // can swap a directory of it (`.git`) for a link to `/` at any moment, and what is
        // mounted or made writable must be the place checked.
        for (&fd, bind) in fds.iter().zip(&ns.binds) {
            if bind.masked {
                make_way(&bind.target, bind.dir)?;
            }
            // Under a mask the place is one `make_way` made on the mask's own file system;
            // elsewhere it is the directory the parent found.
            let place = open_place(&bind.target, (!bind.masked).then_some(bind.id))?;
            let (mut source, mut target) = ([0u8; 32], [0u8; 32]);
            fd_path(fd, &mut source);
            fd_path(place, &mut target);
            let rc = libc::mount(
                source.as_ptr().cast(),
                target.as_ptr().cast(),
                std::ptr::null(),
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            );
            libc::close(fd);
            libc::close(place);
            check(rc.into(), Failed::View)?;
        }
        // The host's /proc goes read-only with the rest; init mounts the namespace's own over it.
        set_mount_attr(libc::AT_FDCWD, c"/", AT_RECURSIVE, MOUNT_ATTR_RDONLY, 0)?;
        for bind in ns.binds.iter().filter(|b| b.writable) {
            let (set, clear) = (MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, MOUNT_ATTR_RDONLY);
            // The bind's own root (what it binds is the directory the parent found): the
            // kernel refuses a place that is not the root of a mount.
            let bound = open_place(&bind.target, Some(bind.id))?;
            // Mounts inside it that were read-only before stay so: in a user namespace of its
            // own their flag is locked; without one (as root) the parent listed them, bound
            // over themselves below (`read_only_mounts_within`), and made read-only again.
            let done = set_bound_attr(bound, AT_RECURSIVE, set, clear)
                .or_else(|_| set_bound_attr(bound, 0, set, clear));
            libc::close(bound);
            done?;
        }
        // What the writable binds made writable again that must not be.
        for bind in ns.binds.iter().filter(|b| b.read_only_within()) {
            let bound = open_place(&bind.target, Some(bind.id))?;
            let done = set_bound_attr(bound, 0, MOUNT_ATTR_RDONLY, 0);
            libc::close(bound);
            done?;
        }
        Ok(())
    }
}

/// Opens `path` (`O_PATH`) without following a symbolic link anywhere on it (every path of a
/// command's view is canonical: a link on one is one a command swapped in), and, given `id`,
/// checks that it is that device and inode.
unsafe fn open_place(path: &CStr, id: Option<(u64, u64)>) -> std::io::Result<RawFd> {
    unsafe {
        let fd = openat2(libc::AT_FDCWD, path, libc::O_PATH, RESOLVE_NO_SYMLINKS);
        if fd < 0 {
            return Err(fail(Failed::View));
        }
        if id.is_some_and(|id| !is_at(fd, id)) {
            libc::close(fd);
            return Err(fail_with(Failed::View, 0));
        }
        Ok(fd)
    }
}

/// Whether `fd` is the file of device and inode `id` (false when it cannot be looked at).
unsafe fn is_at(fd: RawFd, id: (u64, u64)) -> bool {
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd, &mut st) == 0 && (st.st_dev as u64, st.st_ino as u64) == id
    }
}

/// `openat2(dirfd, path, flags | O_CLOEXEC, resolve)`: the descriptor, or -1 (errno set).
unsafe fn openat2(dirfd: RawFd, path: &CStr, flags: c_int, resolve: u64) -> RawFd {
    unsafe {
        let how = OpenHow {
            flags: (flags | libc::O_CLOEXEC) as u64,
            mode: 0,
            resolve,
        };
        let fd = libc::syscall(
            libc::SYS_openat2,
            dirfd,
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        );
        if fd < 0 { -1 } else { fd as RawFd }
    }
}

/// Most paths bound into one command's view.
pub(crate) const MAX_BINDS: usize = 32;

/// Writes `/proc/self/fd/<fd>` and a NUL into `out`.
fn fd_path(fd: RawFd, out: &mut [u8; 32]) {
    const PREFIX: &[u8] = b"/proc/self/fd/";
    out[..PREFIX.len()].copy_from_slice(PREFIX);
    let mut digits = [0u8; 10];
    let mut n = fd.max(0) as u32;
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        out[PREFIX.len() + i] = digits[len - 1 - i];
    }
    out[PREFIX.len() + len] = 0;
}

/// Creates the directories down to `target` inside a mask (and `target` itself: a directory,
/// or an empty file to bind a file over), without allocating: each prefix is copied into a
/// buffer on the stack. Each is made in its parent as opened without following a link
/// ([`open_place`]): the way may lie on a bind a command can write (a path under
/// `extra_write_paths`), where it could swap a directory for a link and have this, as root,
/// make a directory or a file wherever the link leads.
unsafe fn make_way(target: &CStr, dir: bool) -> std::io::Result<()> {
    unsafe {
        let bytes = target.to_bytes();
        let mut buf = [0u8; 4096];
        if bytes.len() >= buf.len() {
            return Err(fail_with(Failed::View, libc::ENAMETOOLONG));
        }
        // Where the current component starts (after its `/`).
        let mut start = 1;
        for end in 1..=bytes.len() {
            let last = end == bytes.len();
            if !last && bytes[end] != b'/' {
                continue;
            }
            if end == start {
                start = end + 1;
                continue; // `//`
            }
            // The parent: the prefix before this component (`/` for the first).
            let parent_len = (start - 1).max(1);
            buf[..parent_len].copy_from_slice(&bytes[..parent_len]);
            buf[parent_len] = 0;
            let parent = open_place(
                CStr::from_bytes_with_nul_unchecked(&buf[..=parent_len]),
                None,
            )?;
            buf[..end - start].copy_from_slice(&bytes[start..end]);
            buf[end - start] = 0;
            let name = buf.as_ptr().cast::<libc::c_char>();
            let made = if last && !dir {
                // Made, never opened: what is there already (a FIFO would block an open, a file
                // root may not write would refuse it) is looked at by `open_place` after.
                libc::mknodat(parent, name, libc::S_IFREG | 0o644, 0) == 0
                    || errno() == libc::EEXIST
            } else {
                libc::mkdirat(parent, name, 0o755) == 0 || errno() == libc::EEXIST
            };
            let err = errno();
            libc::close(parent);
            if !made {
                return Err(fail_with(Failed::View, err));
            }
            start = end + 1;
        }
        Ok(())
    }
}
/// `struct mount_attr`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const AT_RECURSIVE: c_int = 0x8000;

/// `mount_setattr` on the mount at `path` from `dirfd` (`AT_FDCWD` with a path, or a mount's
/// root descriptor with `""` and `AT_EMPTY_PATH`).
unsafe fn set_mount_attr(
    dirfd: c_int,
    path: &CStr,
    flags: c_int,
    set: u64,
    clear: u64,
) -> std::io::Result<()> {
    unsafe {
        let attr = MountAttr {
            attr_set: set,
            attr_clr: clear,
            propagation: 0,
            userns_fd: 0,
        };
        let rc = libc::syscall(
            libc::SYS_mount_setattr,
            dirfd,
            path.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        );
        check(rc, Failed::View)
    }
}

/// [`set_mount_attr`] on the mount whose root `fd` is.
unsafe fn set_bound_attr(fd: RawFd, flags: c_int, set: u64, clear: u64) -> std::io::Result<()> {
    unsafe { set_mount_attr(fd, c"", flags | libc::AT_EMPTY_PATH, set, clear) }
}

/// `struct open_how`.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}
const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE_BENEATH: u64 = 0x08;

/// Enters the working directory through the namespace's own mounts (the read-write bind of the
/// workspace): the workspace's root by its path, checked to be the same directory, then the
/// working directory beneath it, resolved by the kernel without leaving it.
unsafe fn enter_cwd_in_namespace(ns: &Namespaces) -> std::io::Result<()> {
    unsafe {
        let root = libc::open(
            ns.root.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        );
        if root == -1 {
            return Err(fail(Failed::Cwd));
        }
        if !is_at(root, ns.root_id) {
            libc::close(root);
            return Err(fail_with(Failed::Cwd, 0));
        }
        let dir = openat2(
            root,
            &ns.cwd,
            libc::O_PATH | libc::O_DIRECTORY,
            RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
        );
        libc::close(root);
        if dir < 0 {
            return Err(fail(Failed::Cwd));
        }
        let rc = libc::fchdir(dir);
        let err = errno();
        libc::close(dir);
        if rc == -1 {
            return Err(fail_with(Failed::Cwd, err));
        }
        Ok(())
    }
}

/// The command's process, from its fork to `exec`: drop privileges and confine it.
unsafe fn command(
    spec: &Spec,
    mounted: Mounted,
    namespaces: Option<&Namespaces>,
) -> std::io::Result<()> {
    unsafe {
        if namespaces.is_some() {
            // Its own session: signals for the command go to this group; nothing it starts can
            // take the supervisor's group with it.
            libc::setsid();
        } else {
            libc::setpgid(0, 0);
            let supervisor = libc::getppid();
            if let Some(identity) = spec.identity {
                // Root's last act as root: no capability can come back (bounding set,
                // securebits), then the uid change clears the rest.
                drop_bounding_set(spec.cap_last)?;
                check(
                    libc::prctl(libc::PR_SET_SECUREBITS, SECUREBITS, 0, 0, 0).into(),
                    Failed::Capabilities,
                )?;
                become_user(identity)?;
                enter_cwd(&spec.cwd)?;
            } else {
                enter_cwd(&spec.cwd)?;
            }
            // Dies with the supervisor (set after the uid change, which would clear it).
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            if libc::getppid() != supervisor {
                libc::_exit(1);
            }
        }
        clear_capabilities(spec.cap_last)?;
        if let Some(ns) = namespaces {
            enter_cwd_in_namespace(ns)?;
        }
        let empty: libc::sigset_t = {
            let mut set = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            set
        };
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        confine(spec, mounted)
    }
}

/// `no_new_privs`, landlock (with rules for the private mounts), seccomp.
unsafe fn confine(spec: &Spec, mounted: Mounted) -> std::io::Result<()> {
    unsafe {
        check(
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0).into(),
            Failed::Landlock,
        )?;
        if let Some(ruleset) = &spec.ruleset {
            let ruleset = ruleset.as_raw_fd();
            if mounted.proc {
                add_rule(ruleset, c"/proc", spec.proc_access)?;
            }
            if mounted.shm {
                add_rule(ruleset, c"/dev/shm", spec.shm_access)?;
            }
            let rc = libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0);
            check(rc, Failed::Landlock)?;
        }
        if let Some(filter) = &spec.filter {
            let len =
                u16::try_from(filter.len()).map_err(|_| fail_with(Failed::Seccomp, libc::E2BIG))?;
            let program = libc::sock_fprog {
                len,
                // The kernel copies the program and never writes through this pointer.
                filter: filter.as_ptr().cast_mut(),
            };
            let rc = libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER as libc::c_ulong,
                &program as *const libc::sock_fprog,
            );
            check(rc.into(), Failed::Seccomp)?;
        }
        Ok(())
    }
}

unsafe fn add_rule(ruleset: RawFd, path: &CStr, access: u64) -> std::io::Result<()> {
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
        if fd == -1 {
            return Err(fail(Failed::Landlock));
        }
        let attr = PathBeneathAttr {
            allowed_access: access,
            parent_fd: fd,
        };
        let rc = libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset,
            LANDLOCK_RULE_PATH_BENEATH,
            &attr as *const PathBeneathAttr,
            0,
        );
        libc::close(fd);
        check(rc, Failed::Landlock)
    }
}

/// setgroups (none), setresgid, setresuid, as raw system calls: the C library's wrappers would
/// try to change every thread it knows of, and in the command's process (which runs in its
/// parent's memory) its list of threads is not this process's.
unsafe fn become_user(identity: Identity) -> std::io::Result<()> {
    unsafe {
        let Identity { uid, gid } = identity;
        check(
            libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()),
            Failed::Identity,
        )?;
        check(
            libc::syscall(libc::SYS_setresgid, gid, gid, gid),
            Failed::Identity,
        )?;
        check(
            libc::syscall(libc::SYS_setresuid, uid, uid, uid),
            Failed::Identity,
        )
    }
}

unsafe fn enter_cwd(cwd: &OwnedFd) -> std::io::Result<()> {
    unsafe {
        if libc::fchdir(cwd.as_raw_fd()) == -1 {
            return Err(fail(Failed::Cwd));
        }
        Ok(())
    }
}

unsafe fn drop_bounding_set(cap_last: u32) -> std::io::Result<()> {
    unsafe {
        for cap in 0..=cap_last {
            let rc = libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0);
            check(rc.into(), Failed::Capabilities)?;
        }
        Ok(())
    }
}

/// Clears every capability set and locks the securebits. The bounding set and securebits need
/// `CAP_SETPCAP`: a process without it (an ordinary user, no user namespace) has no
/// capabilities to lose, and `no_new_privs` keeps it from gaining any, so `EPERM` there is not
/// an error. The effective, permitted, inheritable and ambient sets are checked empty.
unsafe fn clear_capabilities(cap_last: u32) -> std::io::Result<()> {
    unsafe {
        for cap in 0..=cap_last {
            let rc = libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0);
            if rc == -1 && errno() != libc::EPERM {
                return Err(fail(Failed::Capabilities));
            }
        }
        let current = libc::prctl(libc::PR_GET_SECUREBITS, 0, 0, 0, 0);
        if current != SECUREBITS as c_int {
            let rc = libc::prctl(libc::PR_SET_SECUREBITS, SECUREBITS, 0, 0, 0);
            if rc == -1 && errno() != libc::EPERM {
                return Err(fail(Failed::Capabilities));
            }
        }
        let rc = libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        );
        check(rc.into(), Failed::Capabilities)?;
        let mut header = CapHeader {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let none = [CapData::default(); 2];
        let rc = libc::syscall(
            libc::SYS_capset,
            &mut header as *mut CapHeader,
            none.as_ptr(),
        );
        check(rc, Failed::Capabilities)?;
        let mut now = [CapData {
            effective: u32::MAX,
            permitted: u32::MAX,
            inheritable: u32::MAX,
        }; 2];
        let rc = libc::syscall(
            libc::SYS_capget,
            &mut header as *mut CapHeader,
            now.as_mut_ptr(),
        );
        check(rc, Failed::Capabilities)?;
        if now
            .iter()
            .any(|d| d.effective | d.permitted | d.inheritable != 0)
        {
            return Err(fail(Failed::Capabilities));
        }
        Ok(())
    }
}

/// `_LINUX_CAPABILITY_VERSION_3`.
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// `struct __user_cap_header_struct`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: c_int,
}

/// `struct __user_cap_data_struct`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Writes `bytes` to `path` in one `write`; `Err` with the errno.
unsafe fn write_file(path: &CStr, bytes: &[u8]) -> Result<(), c_int> {
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd == -1 {
            return Err(errno());
        }
        let written = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        let err = errno();
        libc::close(fd);
        if written != bytes.len() as isize {
            return Err(if written == -1 { err } else { libc::EIO });
        }
        Ok(())
    }
}

/// Brings up `lo` in the new network namespace (it starts down); `Err` with the errno.
unsafe fn loopback_up() -> Result<(), c_int> {
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd == -1 {
            return Err(errno());
        }
        let mut request: libc::ifreq = std::mem::zeroed();
        for (to, from) in request.ifr_name.iter_mut().zip(b"lo\0") {
            *to = *from as libc::c_char;
        }
        let mut rc = libc::ioctl(fd, libc::SIOCGIFFLAGS as _, &mut request);
        if rc == 0 {
            request.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            rc = libc::ioctl(fd, libc::SIOCSIFFLAGS as _, &request);
        }
        let err = errno();
        libc::close(fd);
        if rc == -1 { Err(err) } else { Ok(()) }
    }
}

/// The proxy's listening socket on `127.0.0.1:port`, made inside the new network namespace:
/// the parent accepts connections from commands on it, from outside the namespace.
unsafe fn proxy_listener(port: u16) -> Result<RawFd, c_int> {
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd == -1 {
            return Err(errno());
        }
        let address = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
            },
            sin_zero: [0; 8],
        };
        let listening = libc::bind(
            fd,
            (&address as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        ) == 0
            && libc::listen(fd, 128) == 0;
        if !listening {
            return Err(errno());
        }
        Ok(fd)
    }
}

/// Room for one `SCM_RIGHTS` message carrying up to four descriptors, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct FourFds([u8; 32]);

/// Sends the one byte `tag` with `fds` (`SCM_RIGHTS`).
unsafe fn send_fds(to: RawFd, tag: u8, fds: &[RawFd]) -> bool {
    unsafe {
        let mut byte = [tag];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut control = FourFds([0; 32]);
        let data = std::mem::size_of_val(fds) as u32;
        let space = libc::CMSG_SPACE(data) as usize;
        if fds.len() > 4 || space > control.0.len() {
            return false;
        }
        let mut message: libc::msghdr = std::mem::zeroed();
        message.msg_iov = &mut iov;
        message.msg_iovlen = 1;
        message.msg_control = control.0.as_mut_ptr().cast();
        message.msg_controllen = space as _;
        let header = libc::CMSG_FIRSTHDR(&message);
        if header.is_null() {
            return false;
        }
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(data) as _;
        let out = libc::CMSG_DATA(header).cast::<c_int>();
        for (i, fd) in fds.iter().enumerate() {
            std::ptr::write_unaligned(out.add(i), *fd);
        }
        libc::sendmsg(to, &message, libc::MSG_NOSIGNAL) == 1
    }
}

unsafe fn pipe() -> std::io::Result<(RawFd, RawFd)> {
    unsafe {
        let mut fds = [0 as c_int; 2];
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) == -1 {
            return Err(fail(Failed::Tree));
        }
        Ok((fds[0], fds[1]))
    }
}

/// Closes every descriptor but `keep` (which holds at most two). The standard streams go too:
/// only the command holds the output pipes, so they end when the command's tree has ended.
unsafe fn close_all_but(keep: &[RawFd]) {
    unsafe {
        let mut keep_sorted = [RawFd::MAX; 2];
        for (slot, fd) in keep_sorted.iter_mut().zip(keep) {
            *slot = *fd;
        }
        keep_sorted.sort_unstable();
        let mut from: libc::c_uint = 0;
        for fd in keep_sorted {
            if fd == RawFd::MAX {
                break;
            }
            if fd as libc::c_uint > from {
                close_range(from, fd as libc::c_uint - 1);
            }
            from = fd as libc::c_uint + 1;
        }
        close_range(from, libc::c_uint::MAX);
    }
}

unsafe fn close_range(first: libc::c_uint, last: libc::c_uint) {
    unsafe {
        if libc::syscall(libc::SYS_close_range, first, last, 0) == -1 {
            // Kernels before 5.9: one by one, up to the descriptor limit.
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
            let end = (limit.rlim_cur.min(1 << 20) as libc::c_uint).min(last.saturating_add(1));
            for fd in first..end {
                libc::close(fd as c_int);
            }
        }
    }
}

fn signal_set(signals: &[c_int]) -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &signal in signals {
            libc::sigaddset(&mut set, signal);
        }
        set
    }
}

/// The namespaced supervisor's loop: forwards signals to init (which passes them to the
/// command), kills init on [`KILL_TREE`] or when the caller is gone, and exits as the command
/// did once init is gone.
unsafe fn supervise_namespace(init: libc::pid_t, status_r: RawFd, parent: libc::pid_t) -> ! {
    unsafe {
        let mut watched = [0; FORWARDED.len() + 2];
        watched[..FORWARDED.len()].copy_from_slice(&FORWARDED);
        watched[FORWARDED.len()] = libc::SIGCHLD;
        watched[FORWARDED.len() + 1] = KILL_TREE;
        let set = signal_set(&watched);
        loop {
            let signal = wait_signal(&set);
            // Looked at whatever woke it: signals that keep coming must not hide it.
            if libc::getppid() != parent {
                libc::kill(init, libc::SIGKILL);
            }
            match signal {
                None => {}
                Some((libc::SIGCHLD, _)) => {
                    let mut status = 0;
                    if libc::waitpid(init, &mut status, libc::WNOHANG) == init {
                        let mut reported = [0u8; 4];
                        let n = libc::read(status_r, reported.as_mut_ptr().cast(), 4);
                        if n == 4 {
                            status = c_int::from_ne_bytes(reported);
                        }
                        exit_like(status);
                    }
                }
                Some((KILL_TREE, _)) => {
                    libc::kill(init, libc::SIGKILL);
                }
                Some((signal, _)) => {
                    libc::kill(init, signal);
                }
            }
        }
    }
}

/// Init's loop: reaps every process of the namespace, passes signals to the command's group,
/// and exits (taking the namespace with it) once the command has exited, after telling the
/// supervisor how.
unsafe fn reap_as_init(command: libc::pid_t, status_w: RawFd) -> ! {
    unsafe {
        let mut watched = [0; FORWARDED.len() + 1];
        watched[..FORWARDED.len()].copy_from_slice(&FORWARDED);
        watched[FORWARDED.len()] = libc::SIGCHLD;
        let set = signal_set(&watched);
        loop {
            match wait_signal(&set) {
                Some((libc::SIGCHLD, _)) | None => loop {
                    let mut status = 0;
                    let pid = libc::waitpid(-1, &mut status, libc::WNOHANG);
                    if pid <= 0 {
                        break;
                    }
                    if pid == command {
                        let bytes = status.to_ne_bytes();
                        libc::write(status_w, bytes.as_ptr().cast(), 4);
                        libc::_exit(0);
                    }
                },
                Some((signal, _)) => {
                    libc::kill(-command, signal);
                }
            }
        }
    }
}

/// The fallback supervisor's loop: a child subreaper, so every orphan of the command's tree
/// becomes its child; when the command ends, or on [`KILL_TREE`], or when the caller is gone,
/// it kills every process left and exits as the command did.
unsafe fn supervise_fallback(command: libc::pid_t, parent: libc::pid_t) -> ! {
    unsafe {
        let mut watched = [0; FORWARDED.len() + 2];
        watched[..FORWARDED.len()].copy_from_slice(&FORWARDED);
        watched[FORWARDED.len()] = libc::SIGCHLD;
        watched[FORWARDED.len() + 1] = KILL_TREE;
        let set = signal_set(&watched);
        let me = libc::getpid();
        loop {
            let signal = wait_signal(&set);
            // Looked at whatever woke it: each orphan of the command that ends is a SIGCHLD
            // here, and a tree whose orphans end more than once a second kept a supervisor
            // that looked only after a quiet second from ever finding its caller gone.
            if libc::getppid() != parent {
                // The command is not reaped yet: its group's id is still its own.
                libc::kill(-command, libc::SIGKILL);
                kill_descendants();
                libc::_exit(128 + libc::SIGKILL);
            }
            match signal {
                None => {}
                Some((libc::SIGCHLD, _)) => loop {
                    // Looked at, not reaped: while the command is a zombie its pid, and with it
                    // its process group's id, cannot be taken by another process.
                    let mut info: libc::siginfo_t = std::mem::zeroed();
                    let options = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
                    if libc::waitid(libc::P_ALL, 0, &mut info, options) == -1 {
                        break;
                    }
                    let pid = info.si_pid();
                    if pid <= 0 {
                        break;
                    }
                    if pid == command {
                        libc::kill(-command, libc::SIGKILL);
                        let mut status = 0;
                        libc::waitpid(command, &mut status, 0);
                        kill_descendants();
                        exit_like(status);
                    }
                    let mut status = 0;
                    libc::waitpid(pid, &mut status, 0);
                },
                Some((KILL_TREE, _)) => {
                    libc::kill(-command, libc::SIGKILL);
                    kill_descendants();
                    exit_like(libc::SIGKILL);
                }
                Some((signal, sender)) if sender != me => {
                    libc::kill(-command, signal);
                }
                Some(_) => {}
            }
        }
    }
}

/// Kills every child of this process (orphans of the command's tree, re-parented here) and
/// reaps them, until there is none left: each round kills every child listed, then reaps as
/// many (each of them dies, being killed), so that what their deaths re-parent here is found by
/// the next round. A round costs one pass over the children, however many there are.
unsafe fn kill_descendants() {
    unsafe {
        loop {
            let listed = kill_children();
            let mut status = 0;
            match listed {
                Some(0) | None => {
                    // None listed (or no list): reap what is dead, and end when no child is left.
                    match libc::waitpid(-1, &mut status, libc::WNOHANG) {
                        -1 if errno() == libc::EINTR => {}
                        -1 => return,
                        0 if listed.is_none() => return,
                        _ => {}
                    }
                }
                Some(mut left) => {
                    while left > 0 {
                        match libc::waitpid(-1, &mut status, 0) {
                            -1 if errno() == libc::EINTR => {}
                            -1 => return,
                            _ => left -= 1,
                        }
                    }
                }
            }
        }
    }
}

/// SIGKILL to every pid listed in `/proc/thread-self/children`, read to its end; how many were
/// listed, or `None` when the list cannot be read.
unsafe fn kill_children() -> Option<usize> {
    unsafe {
        let fd = libc::open(
            c"/proc/thread-self/children".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if fd == -1 {
            return None;
        }
        let mut listed = 0;
        let mut pid: libc::pid_t = 0;
        let mut buf = [0u8; 4096];
        loop {
            let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
            if n == -1 && errno() == libc::EINTR {
                continue;
            }
            if n <= 0 {
                break;
            }
            for &b in &buf[..n as usize] {
                if b.is_ascii_digit() {
                    pid = pid
                        .saturating_mul(10)
                        .saturating_add(libc::pid_t::from(b - b'0'));
                } else {
                    if pid > 0 {
                        libc::kill(pid, libc::SIGKILL);
                        listed += 1;
                    }
                    pid = 0;
                }
            }
        }
        libc::close(fd);
        if pid > 0 {
            libc::kill(pid, libc::SIGKILL);
            listed += 1;
        }
        Some(listed)
    }
}

/// Waits up to a second for one of `set`: the signal and its sender, or `None` on time-out.
unsafe fn wait_signal(set: &libc::sigset_t) -> Option<(c_int, libc::pid_t)> {
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let timeout = libc::timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        let signal = libc::sigtimedwait(set, &mut info, &timeout);
        (signal > 0).then(|| (signal, info.si_pid()))
    }
}

/// Exits the way `status` (a `waitpid` status, or a bare signal number for "killed by it")
/// says: with its exit code, or killed by its signal (this process is undumpable: a signal
/// that would dump core does not).
unsafe fn exit_like(status: c_int) -> ! {
    unsafe {
        let signal = if libc::WIFEXITED(status) {
            libc::_exit(libc::WEXITSTATUS(status));
        } else if libc::WIFSIGNALED(status) {
            libc::WTERMSIG(status)
        } else {
            status
        };
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(signal, &action, std::ptr::null_mut());
        let only = signal_set(&[signal]);
        libc::sigprocmask(libc::SIG_UNBLOCK, &only, std::ptr::null_mut());
        libc::kill(libc::getpid(), signal);
        libc::_exit(128 + signal);
    }
}

unsafe fn fallback(spec: &Spec) -> std::io::Result<()> {
    unsafe {
        check(
            libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0).into(),
            Failed::Tree,
        )?;
        let command_pid = start_command(spec, Mounted::default(), None, &[])?;
        close_all_but(&[]);
        supervise_fallback(command_pid, spec.parent)
    }
}

/// A pidfd for `pid` (which must be a child not reaped yet): signals sent through it can never
/// reach another process that reused the pid.
pub(crate) fn pidfd_open(pid: libc::pid_t) -> std::io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: a plain system call; on success the kernel hands over a new descriptor.
    unsafe {
        let fd = libc::syscall(libc::SYS_pidfd_open, pid, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(fd as RawFd))
    }
}

/// Asks supervisor `pid`, a child of this process not reaped yet (so its pid is still its own),
/// to end its tree ([`KILL_TREE`], a real-time signal, which nix's `Signal` does not name:
/// through it, nothing was sent and the tree ran on unwatched). For a supervisor that could not
/// be held by a pidfd.
pub(crate) fn kill_tree_unwatched(pid: libc::pid_t) {
    // SAFETY: a plain system call.
    unsafe {
        libc::kill(pid, KILL_TREE);
    }
}

/// Sends `signal` to the process behind `pidfd`.
pub(crate) fn pidfd_signal(pidfd: &OwnedFd, signal: c_int) -> std::io::Result<()> {
    // SAFETY: a plain system call on a descriptor we own; no siginfo is passed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The landlock ABI version this kernel enforces, asked without making a ruleset (no
/// descriptor, no memory: nothing that can fail for a passing reason); `None` when landlock is
/// not built in, not enabled, or refused to this process.
pub(crate) fn landlock_version() -> Option<i32> {
    // SAFETY: `landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)` only returns a
    // number.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    (version > 0).then_some(version as i32)
}
