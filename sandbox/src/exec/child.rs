//! What runs between `fork` and `exec`: the only `unsafe` code of the sandbox.
//!
//! `Command::pre_exec` runs a closure in the forked child of a multi-threaded process, where only
//! async-signal-safe work is allowed: system calls, no allocation, no locks. Everything the
//! closure needs (rlimits, the landlock ruleset, the seccomp filter, the uid map text, the mount
//! options) is computed in the parent as a [`Spec`]; the child only makes system calls with it.
//!
//! The forked child (the *supervisor*, the process the caller's `Child` handle names) turns into
//! a small process tree, so that everything a command starts ends with it:
//!
//! ```text
//! namespaced                                  fallback (no user namespaces)
//! supervisor   (new user, pid, mount, ipc,    supervisor   (a child subreaper)
//!   │           and network namespaces)         └─ command  (own process group)
//!   └─ init    (pid 1: mounts a private
//!       │       /dev/shm and /proc, reaps)
//!       └─ command (own session)
//! ```
//!
//! - The supervisor forwards the signals it gets (`TERM`, `INT`, `HUP`, ...) to the command's
//!   process group, and on [`KILL_TREE`] kills the whole tree. It exits as the command did (same
//!   exit code, or killed by the same signal), so the caller sees the command's status.
//! - Namespaced: when init exits (after the command), or is killed, the kernel kills every
//!   process left in the PID namespace: a `setsid` or double-forked child cannot outlive it.
//!   Init dies with the supervisor (`PR_SET_PDEATHSIG`), so killing the supervisor kills all.
//! - Fallback: orphans are re-parented to the supervisor (a subreaper); when the command ends,
//!   the supervisor kills every process it finds among its children until none is left.
//! - The command itself: its own session (or group), privileges dropped ([`Identity`], every
//!   capability set cleared, securebits locked), `no_new_privs`, landlock, then seccomp, then
//!   `exec`. Anything that fails stops the spawn with one of the errno values below, which
//!   `spawn_error` turns into a clear message; the program never runs half-confined.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use nix::libc::{self, c_int};

use super::Rlimits;

/// errno the child reports when landlock is not fully enforced. None of these is ever returned
/// by `execve`, so `spawn_error` can tell them apart.
pub(crate) const LANDLOCK_FAILED: i32 = libc::ENOTRECOVERABLE;
/// errno the child reports when the seccomp filter could not be installed.
pub(crate) const SECCOMP_FAILED: i32 = libc::EOWNERDEAD;
/// errno the child reports when the namespaces could not be set up.
pub(crate) const NAMESPACES_FAILED: i32 = libc::EUCLEAN;
/// errno the child reports when the command's view of the filesystem (masks, binds, read-only
/// mounts) could not be made.
pub(crate) const VIEW_FAILED: i32 = libc::ENAVAIL;
/// errno the child reports when it could not take on the command's user.
pub(crate) const IDENTITY_FAILED: i32 = libc::ENOTUNIQ;
/// errno the child reports when a capability set could not be cleared.
pub(crate) const CAPABILITIES_FAILED: i32 = libc::EBADE;
/// errno the child reports when the command's user may not enter its working directory.
pub(crate) const CWD_DENIED: i32 = libc::EREMCHG;

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

/// The user a command runs as, when the caller is root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// Its uid.
    pub uid: libc::uid_t,
    /// Its gid (its only group).
    pub gid: libc::gid_t,
}

/// How the namespaces are made: the workspace's own user and network namespaces (see
/// [`Shared`]) are joined, and the PID, mount, IPC and UTS namespaces are the command's own.
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
    pub writable: bool,
    pub dir: bool,
    /// Under a mask: the way down to `target` is made first.
    pub masked: bool,
}

/// The program, its arguments and environment as the C arrays `execvp` takes, the stack the
/// command's process runs on until then, and where it reports a failure.
pub(crate) struct Exec {
    pub program: std::ffi::CString,
    _argv: Vec<std::ffi::CString>,
    _envp: Vec<std::ffi::CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    envp_ptrs: Vec<*const libc::c_char>,
    /// Memory for it, never initialized (a stack needs no zeroes).
    stack: std::cell::UnsafeCell<Vec<std::mem::MaybeUninit<u8>>>,
    /// Write end of the pipe the parent reads after the spawn: closed by `exec` (the command
    /// runs), or given the errno of what failed.
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

/// Stack of the command's process between its start and `exec`.
const COMMAND_STACK: usize = 256 * 1024;

impl Exec {
    /// Prepares `program` with `argv` (its first element included) and `env`; `status` is the
    /// write end of the parent's status pipe.
    pub fn new(
        program: &str,
        argv: &[String],
        env: &[(String, String)],
        status: OwnedFd,
    ) -> Result<Exec, std::ffi::NulError> {
        let argv: Vec<std::ffi::CString> = argv
            .iter()
            .map(|a| std::ffi::CString::new(a.as_bytes()))
            .collect::<Result<_, _>>()?;
        let envp: Vec<std::ffi::CString> = env
            .iter()
            .map(|(k, v)| std::ffi::CString::new(format!("{k}={v}")))
            .collect::<Result<_, _>>()?;
        let pointers = |list: &[std::ffi::CString]| {
            list.iter()
                .map(|c| c.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect::<Vec<_>>()
        };
        Ok(Exec {
            program: std::ffi::CString::new(program)?,
            argv_ptrs: pointers(&argv),
            envp_ptrs: pointers(&envp),
            _argv: argv,
            _envp: envp,
            stack: std::cell::UnsafeCell::new(Vec::with_capacity(COMMAND_STACK)),
            status,
        })
    }
}

/// Everything the child needs, computed in the parent.
#[derive(Debug)]
pub(crate) struct Spec {
    pub rlimits: Rlimits,
    /// `RLIMIT_NPROC` for the command (namespaced only: counted per user namespace there).
    pub nproc: Option<u64>,
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
        spec.rlimits.apply().map_err(std::io::Error::from)?;
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

fn fail(code: c_int) -> std::io::Error {
    std::io::Error::from_raw_os_error(code)
}

/// `Err(fail(code))` when a system call returned -1.
fn check(rc: libc::c_long, code: c_int) -> std::io::Result<()> {
    if rc == -1 { Err(fail(code)) } else { Ok(()) }
}

unsafe fn namespaced(spec: &Spec, ns: &Namespaces) -> std::io::Result<()> {
    unsafe {
        if let Some(identity) = spec.identity {
            // Root's part, in a mount namespace of its own: the view is built while the way to
            // every path can still be walked (the command's user may not search a directory on
            // it: a 0700 data dir). The command's own namespaces, made next as that user, get a
            // copy of it in which these mounts are locked.
            check(libc::unshare(libc::CLONE_NEWNS).into(), NAMESPACES_FAILED)?;
            make_private()?;
            mount_view(ns)?;
            become_user(identity)?;
        }
        enter_cwd(&spec.cwd)?;
        // The workspace's user namespace (its owner may join it: this user) and network.
        check(
            libc::setns(ns.user, libc::CLONE_NEWUSER).into(),
            NAMESPACES_FAILED,
        )?;
        check(
            libc::setns(ns.ipc, libc::CLONE_NEWIPC).into(),
            NAMESPACES_FAILED,
        )?;
        if let Some(net) = ns.net {
            check(
                libc::setns(net, libc::CLONE_NEWNET).into(),
                NAMESPACES_FAILED,
            )?;
        }
        let flags = libc::CLONE_NEWPID | libc::CLONE_NEWNS;
        check(libc::unshare(flags).into(), NAMESPACES_FAILED)?;
        let (status_r, status_w) = pipe()?;
        let (life_r, life_w) = pipe()?;
        match libc::fork() {
            -1 => Err(std::io::Error::last_os_error()),
            0 => {
                libc::close(status_r);
                libc::close(life_w);
                init(spec, ns, status_w, life_r)
            }
            init_pid => {
                close_all_but(&[status_r, life_w]);
                supervise_namespace(init_pid, status_r, spec.parent)
            }
        }
    }
}

/// What it takes to make a workspace's shared namespaces (see [`install_shared`]).
#[derive(Debug)]
pub(crate) struct SharedSpec {
    /// Who the workspace's commands run as, when not as the caller.
    pub identity: Option<Identity>,
    /// A network namespace too (else commands get the host's network).
    pub net: bool,
    /// `uid_map` and `gid_map`: the user mapped to itself.
    pub uid_map: Vec<u8>,
    pub gid_map: Vec<u8>,
    /// Where the proxy of `network = "allowlist"` listens inside the network namespace.
    pub proxy_port: Option<u16>,
    /// Where the namespaces' descriptors (and the proxy's socket) go.
    pub to: OwnedFd,
}

/// Makes `command`'s child create a workspace's shared namespaces and send them to the parent
/// (`SCM_RIGHTS`, in this order: user, IPC, network, proxy socket), then exit without running
/// the program: the namespaces live on in the descriptors.
pub(crate) fn install_shared(command: &mut std::process::Command, spec: SharedSpec) {
    // SAFETY: the closure runs between fork and exec and makes system calls only, on data
    // prepared in the parent; it never returns when it succeeds.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(command, move || make_shared(&spec));
    }
}

unsafe fn make_shared(spec: &SharedSpec) -> std::io::Result<()> {
    unsafe {
        if let Some(identity) = spec.identity {
            become_user(identity)?;
            // A uid change makes the process undumpable, and then its /proc files belong to
            // root: it could not write its own uid_map.
            check(
                libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0).into(),
                IDENTITY_FAILED,
            )?;
        }
        let mut flags = libc::CLONE_NEWUSER | libc::CLONE_NEWIPC;
        if spec.net {
            flags |= libc::CLONE_NEWNET;
        }
        check(libc::unshare(flags).into(), NAMESPACES_FAILED)?;
        write_file(c"/proc/self/setgroups", b"deny")?;
        write_file(c"/proc/self/uid_map", &spec.uid_map)?;
        write_file(c"/proc/self/gid_map", &spec.gid_map)?;
        // Whether the namespace gives what commands need: some kernels (AppArmor's restriction
        // of unprivileged user namespaces) let one be made but not used to mount anything.
        check(libc::unshare(libc::CLONE_NEWNS).into(), NAMESPACES_FAILED)?;
        let rc = libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        );
        check(rc.into(), NAMESPACES_FAILED)?;
        let rc = libc::mount(
            c"tmpfs".as_ptr(),
            c"/dev/shm".as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            c"size=4k".as_ptr().cast(),
        );
        check(rc.into(), NAMESPACES_FAILED)?;
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
            if fd == -1 {
                return Err(fail(NAMESPACES_FAILED));
            }
            fds[count] = fd;
            count += 1;
        }
        if spec.net {
            loopback_up()?;
        }
        if let Some(port) = spec.proxy_port {
            fds[count] = proxy_listener(port)?;
            count += 1;
        }
        if !send_fds(spec.to.as_raw_fd(), &fds[..count]) {
            return Err(fail(NAMESPACES_FAILED));
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
) -> std::io::Result<()> {
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
            mounted.proc = libc::mount(
                c"proc".as_ptr(),
                c"/proc".as_ptr(),
                c"proc".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            ) == 0;
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
        let stack = &mut *spec.exec.stack.get();
        // The stack grows down; its top, aligned for any call.
        let memory = stack.spare_capacity_mut();
        let top = (memory.as_mut_ptr().add(memory.len()) as usize & !0xf) as *mut libc::c_void;
        let pid = libc::clone(
            run_command,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&mut start as *mut CommandStart<'_>).cast(),
        );
        if pid == -1 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(pid)
    }
}

unsafe extern "C" {
    static mut environ: *const *const libc::c_char;
}

/// The command's process: confine it, then `execvp` (which looks the program up in the `PATH`
/// of the environment it gets, and runs a script without `#!` with `/bin/sh`). On any failure,
/// its errno goes to the parent's status pipe and the process exits.
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
        let failed = match command(spec, start.mounted, start.namespaces) {
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
        check(rc.into(), VIEW_FAILED)
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
            return Err(fail(VIEW_FAILED));
        }
        for (fd, bind) in fds.iter_mut().zip(&ns.binds) {
            *fd = libc::open(bind.target.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
            if *fd == -1 {
                return Err(fail(VIEW_FAILED));
            }
        }
        // The workspace must be the directory the parent opened, not one swapped in.
        for (&fd, bind) in fds.iter().zip(&ns.binds) {
            let mut st: libc::stat = std::mem::zeroed();
            if bind.target.as_c_str() == ns.root.as_c_str()
                && (libc::fstat(fd, &mut st) != 0
                    || (st.st_dev as u64, st.st_ino as u64) != ns.root_id)
            {
                return Err(fail(VIEW_FAILED));
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
            check(rc.into(), VIEW_FAILED)?;
        }
        for (&fd, bind) in fds.iter().zip(&ns.binds) {
            if bind.masked {
                make_way(&bind.target, bind.dir)?;
            }
            let mut source = [0u8; 32];
            fd_path(fd, &mut source);
            let rc = libc::mount(
                source.as_ptr().cast(),
                bind.target.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            );
            libc::close(fd);
            check(rc.into(), VIEW_FAILED)?;
        }
        set_mount_attr(c"/", AT_RECURSIVE, MOUNT_ATTR_RDONLY, 0)?;
        // Not /proc: the supervisor still writes its uid map there, and a fresh /proc for the
        // new PID namespace goes over it (landlock keeps commands out of the old one).
        set_mount_attr(c"/proc", 0, 0, MOUNT_ATTR_RDONLY)?;
        for bind in ns.binds.iter().filter(|b| b.writable) {
            let (set, clear) = (MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, MOUNT_ATTR_RDONLY);
            // Mounts inside it that were read-only before stay so (their flag is locked).
            if set_mount_attr(&bind.target, AT_RECURSIVE, set, clear).is_err() {
                set_mount_attr(&bind.target, 0, set, clear)?;
            }
        }
        Ok(())
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
/// buffer on the stack.
unsafe fn make_way(target: &CStr, dir: bool) -> std::io::Result<()> {
    unsafe {
        let bytes = target.to_bytes();
        let mut buf = [0u8; 4096];
        if bytes.len() >= buf.len() {
            return Err(fail(VIEW_FAILED));
        }
        for end in 1..=bytes.len() {
            let last = end == bytes.len();
            if !last && bytes[end] != b'/' {
                continue;
            }
            buf[..end].copy_from_slice(&bytes[..end]);
            buf[end] = 0;
            let path = buf.as_ptr().cast::<libc::c_char>();
            if last && !dir {
                let fd = libc::open(
                    path,
                    libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                    0o644,
                );
                if fd == -1 {
                    return Err(fail(VIEW_FAILED));
                }
                libc::close(fd);
            } else if libc::mkdir(path, 0o755) == -1 && errno() != libc::EEXIST {
                return Err(fail(VIEW_FAILED));
            }
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

unsafe fn set_mount_attr(path: &CStr, flags: c_int, set: u64, clear: u64) -> std::io::Result<()> {
    unsafe {
        let attr = MountAttr {
            attr_set: set,
            attr_clr: clear,
            propagation: 0,
            userns_fd: 0,
        };
        let rc = libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        );
        check(rc, VIEW_FAILED)
    }
}

/// `struct open_how`.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}
const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
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
            return Err(match errno() {
                libc::EACCES | libc::EPERM => fail(CWD_DENIED),
                _ => fail(NAMESPACES_FAILED),
            });
        }
        let mut st: libc::stat = std::mem::zeroed();
        let same =
            libc::fstat(root, &mut st) == 0 && (st.st_dev as u64, st.st_ino as u64) == ns.root_id;
        if !same {
            libc::close(root);
            return Err(fail(NAMESPACES_FAILED));
        }
        let how = OpenHow {
            flags: (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64,
            mode: 0,
            resolve: RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
        };
        let dir = libc::syscall(
            libc::SYS_openat2,
            root,
            ns.cwd.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        );
        libc::close(root);
        if dir < 0 {
            return Err(match errno() {
                libc::EACCES | libc::EPERM => fail(CWD_DENIED),
                other => fail(other),
            });
        }
        let rc = libc::fchdir(dir as c_int);
        let err = errno();
        libc::close(dir as c_int);
        if rc == -1 {
            return Err(match err {
                libc::EACCES | libc::EPERM => fail(CWD_DENIED),
                other => fail(other),
            });
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
            if let Some(n) = spec.nproc {
                let limit = libc::rlimit {
                    rlim_cur: n,
                    rlim_max: n,
                };
                check(
                    libc::setrlimit(libc::RLIMIT_NPROC, &limit).into(),
                    libc::EINVAL,
                )?;
            }
        } else {
            libc::setpgid(0, 0);
            let supervisor = libc::getppid();
            if let Some(identity) = spec.identity {
                // Root's last act as root: no capability can come back (bounding set,
                // securebits), then the uid change clears the rest.
                drop_bounding_set(spec.cap_last)?;
                check(
                    libc::prctl(libc::PR_SET_SECUREBITS, SECUREBITS, 0, 0, 0).into(),
                    CAPABILITIES_FAILED,
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
            LANDLOCK_FAILED,
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
            check(rc, LANDLOCK_FAILED)?;
        }
        if let Some(filter) = &spec.filter {
            let len = u16::try_from(filter.len()).map_err(|_| fail(SECCOMP_FAILED))?;
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
            check(rc.into(), SECCOMP_FAILED)?;
        }
        Ok(())
    }
}

unsafe fn add_rule(ruleset: RawFd, path: &CStr, access: u64) -> std::io::Result<()> {
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
        if fd == -1 {
            return Err(fail(LANDLOCK_FAILED));
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
        check(rc, LANDLOCK_FAILED)
    }
}

/// setgroups (none), setresgid, setresuid.
/// setgroups (none), setresgid, setresuid, as raw system calls: the C library's wrappers would
/// try to change every thread it knows of, and in the command's process (which runs in its
/// parent's memory) its list of threads is not this process's.
unsafe fn become_user(identity: Identity) -> std::io::Result<()> {
    unsafe {
        let Identity { uid, gid } = identity;
        check(
            libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()),
            IDENTITY_FAILED,
        )?;
        check(
            libc::syscall(libc::SYS_setresgid, gid, gid, gid),
            IDENTITY_FAILED,
        )?;
        check(
            libc::syscall(libc::SYS_setresuid, uid, uid, uid),
            IDENTITY_FAILED,
        )
    }
}

unsafe fn enter_cwd(cwd: &OwnedFd) -> std::io::Result<()> {
    unsafe {
        if libc::fchdir(cwd.as_raw_fd()) == -1 {
            return Err(match errno() {
                libc::EACCES | libc::EPERM => fail(CWD_DENIED),
                other => fail(other),
            });
        }
        Ok(())
    }
}

unsafe fn drop_bounding_set(cap_last: u32) -> std::io::Result<()> {
    unsafe {
        for cap in 0..=cap_last {
            let rc = libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0);
            check(rc.into(), CAPABILITIES_FAILED)?;
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
                return Err(fail(CAPABILITIES_FAILED));
            }
        }
        let current = libc::prctl(libc::PR_GET_SECUREBITS, 0, 0, 0, 0);
        if current != SECUREBITS as c_int {
            let rc = libc::prctl(libc::PR_SET_SECUREBITS, SECUREBITS, 0, 0, 0);
            if rc == -1 && errno() != libc::EPERM {
                return Err(fail(CAPABILITIES_FAILED));
            }
        }
        let rc = libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        );
        check(rc.into(), CAPABILITIES_FAILED)?;
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
        check(rc, CAPABILITIES_FAILED)?;
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
        check(rc, CAPABILITIES_FAILED)?;
        if now
            .iter()
            .any(|d| d.effective | d.permitted | d.inheritable != 0)
        {
            return Err(fail(CAPABILITIES_FAILED));
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

unsafe fn write_file(path: &CStr, bytes: &[u8]) -> std::io::Result<()> {
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd == -1 {
            return Err(fail(NAMESPACES_FAILED));
        }
        let written = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        libc::close(fd);
        if written != bytes.len() as isize {
            return Err(fail(NAMESPACES_FAILED));
        }
        Ok(())
    }
}

/// Brings up `lo` in the new network namespace (it starts down).
unsafe fn loopback_up() -> std::io::Result<()> {
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd == -1 {
            return Err(fail(NAMESPACES_FAILED));
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
        libc::close(fd);
        check(rc.into(), NAMESPACES_FAILED)
    }
}

/// The proxy's listening socket on `127.0.0.1:port`, made inside the new network namespace:
/// the parent accepts connections from commands on it, from outside the namespace.
unsafe fn proxy_listener(port: u16) -> std::io::Result<RawFd> {
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd == -1 {
            return Err(fail(NAMESPACES_FAILED));
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
            return Err(fail(NAMESPACES_FAILED));
        }
        Ok(fd)
    }
}

/// Room for one `SCM_RIGHTS` message carrying up to four descriptors, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct FourFds([u8; 32]);

unsafe fn send_fds(to: RawFd, fds: &[RawFd]) -> bool {
    unsafe {
        let mut byte = [0u8; 1];
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
            return Err(std::io::Error::last_os_error());
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
            // Kernels before 5.9: one by one, up to the descriptor limit set above.
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
            let end = (limit.rlim_cur.min(65_536) as libc::c_uint).min(last.saturating_add(1));
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
            match wait_signal(&set) {
                None => {
                    if libc::getppid() != parent {
                        libc::kill(init, libc::SIGKILL);
                    }
                }
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
            match wait_signal(&set) {
                None => {
                    if libc::getppid() != parent {
                        kill_descendants(command);
                        libc::_exit(128 + libc::SIGKILL);
                    }
                }
                Some((libc::SIGCHLD, _)) => loop {
                    let mut status = 0;
                    let pid = libc::waitpid(-1, &mut status, libc::WNOHANG);
                    if pid <= 0 {
                        break;
                    }
                    if pid == command {
                        kill_descendants(command);
                        exit_like(status);
                    }
                },
                Some((KILL_TREE, _)) => {
                    kill_descendants(command);
                    exit_like(libc::SIGKILL);
                }
                Some((signal, sender)) => {
                    if sender != me {
                        libc::kill(-command, signal);
                    }
                }
            }
        }
    }
}

/// Kills the command's group, then every child of this process (orphans re-parented here) until
/// there is none left: each round kills what is there and reaps one, so children of killed
/// processes, re-parented in turn, are found by the next round.
unsafe fn kill_descendants(command: libc::pid_t) {
    unsafe {
        libc::kill(-command, libc::SIGKILL);
        loop {
            kill_children();
            let mut status = 0;
            if libc::waitpid(-1, &mut status, 0) == -1 && errno() == libc::ECHILD {
                return;
            }
        }
    }
}

/// SIGKILL to every pid listed in `/proc/thread-self/children`.
unsafe fn kill_children() {
    unsafe {
        let fd = libc::open(
            c"/proc/thread-self/children".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if fd == -1 {
            return;
        }
        let mut buf = [0u8; 4096];
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        let mut pid: libc::pid_t = 0;
        for &b in &buf[..n.max(0) as usize] {
            if b.is_ascii_digit() {
                pid = pid
                    .saturating_mul(10)
                    .saturating_add(libc::pid_t::from(b - b'0'));
            } else {
                if pid > 0 {
                    libc::kill(pid, libc::SIGKILL);
                }
                pid = 0;
            }
        }
        if pid > 0 {
            libc::kill(pid, libc::SIGKILL);
        }
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
/// says: with its exit code, or killed by its signal.
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
            NAMESPACES_FAILED,
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
