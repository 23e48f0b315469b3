//! `run_command`: a program run in its own process group, confined by landlock, a seccomp filter
//! and rlimits.
//!
//! The policy (which paths, which rights, which limits) is computed in the parent as plain data
//! ([`SandboxPlan`]); the landlock ruleset and the seccomp filter ([`seccomp_filter`]) are built
//! there too. The child only applies them, in `pre_exec`, between `fork` and `exec`: `setrlimit`,
//! `fchdir` into the working directory (opened through the jail, so no path race),
//! `PR_SET_NO_NEW_PRIVS`, `landlock_restrict_self` and `PR_SET_SECCOMP`. Anything less than full
//! enforcement fails the spawn: the program never runs half-confined. The calling process is
//! never restricted.
//!
//! This is the one module with `unsafe` code: `CommandExt::pre_exec` is unsafe because the
//! closure runs in a forked child of a multi-threaded process, where only async-signal-safe
//! work is allowed, and `prctl` is called through `libc`. The closure makes system calls only; it
//! allocates nothing on its success path.

use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope,
};
use monad_protocol::tools::{RunCommandArgs, RunCommandResult};
use nix::libc;
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::error::SandboxError;
use crate::jail::Jail;
use crate::limits::{ExecPolicy, Limits};

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

/// The oldest landlock ABI Monad accepts: ABI 3 is the first that controls `truncate(2)`, without
/// which a command could empty any file outside the workspace.
const MIN_ABI: ABI = ABI::V3;

/// Grace given to output readers after the program and its group are gone.
const DRAIN_GRACE: Duration = Duration::from_millis(500);

/// errno the child reports when landlock is not fully enforced. Neither this nor
/// [`SECCOMP_FAILED`] is ever returned by `execve`, so [`spawn_error`] can tell them apart.
const LANDLOCK_FAILED: i32 = libc::ENOTRECOVERABLE;
/// errno the child reports when the seccomp filter could not be installed.
const SECCOMP_FAILED: i32 = libc::EOWNERDEAD;

/// The audit architecture (`AUDIT_ARCH_*` in `linux/audit.h`) whose system calls the seccomp
/// filter knows, or `None` where commands cannot be sandboxed.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: Option<u32> = Some(0xc000_003e); // AUDIT_ARCH_X86_64
#[cfg(all(target_arch = "aarch64", target_endian = "little"))]
const AUDIT_ARCH: Option<u32> = Some(0xc000_00b7); // AUDIT_ARCH_AARCH64
#[cfg(not(any(
    target_arch = "x86_64",
    all(target_arch = "aarch64", target_endian = "little")
)))]
const AUDIT_ARCH: Option<u32> = None;

/// On x86_64, x32 system calls share the architecture but have this bit set in their number;
/// they would bypass a filter written for x86_64 numbers.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: Option<u32> = Some(0x4000_0000);
#[cfg(not(target_arch = "x86_64"))]
const X32_SYSCALL_BIT: Option<u32> = None;

/// The seccomp filter every sandboxed command runs under, as classic BPF over
/// `struct seccomp_data`; `None` on architectures it does not know (commands are then refused
/// like on a kernel without landlock). Built in the parent; the child only hands it to `prctl`.
///
/// landlock (up to ABI 7) does not control connecting to a filesystem Unix socket, so any socket
/// the user can write to (an ssh-agent, the D-Bus bus, `docker.sock`) would be a way out. The
/// filter closes that by refusing to create Unix sockets at all:
///
/// 1. a system call of another architecture (the i386 entry of an x86_64 kernel) kills the
///    process, and so does an x32 call on x86_64: their numbers mean other calls;
/// 2. `socket(AF_UNIX, ...)` fails with `EACCES`, and so does every `socket()` when
///    `allow_network` is false ([`ExecPolicy::allow_network`]);
/// 3. `socketpair` fails with `EACCES` unless the type is `SOCK_STREAM` or `SOCK_SEQPACKET`: a
///    datagram socketpair's socket can `sendto` (or `connect` to) any datagram socket by path
///    (`SOCK_RAW` is a datagram socket for `AF_UNIX`). Stream and seqpacket pairs are connected to
///    each other for good and reach nothing else;
/// 4. `io_uring_setup`, `io_uring_enter` and `io_uring_register` fail with `EPERM`: io_uring
///    creates and connects sockets without the `socket` system call;
/// 5. everything else is allowed (landlock, rlimits and the process group do the rest).
pub fn seccomp_filter(allow_network: bool) -> Option<Vec<libc::sock_filter>> {
    use std::mem::offset_of;

    let arch = AUDIT_ARCH?;
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | code | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let load = |offset: usize| stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, offset as u32);
    let ret = |action: u32| stmt(libc::BPF_RET | libc::BPF_K, action);
    // The low 32 bits of an argument (both supported architectures are little-endian); the
    // kernel reads `int` arguments from those bits only, so the high ones cannot hide a value.
    let arg = |n: usize| offset_of!(libc::seccomp_data, args) + 8 * n;
    let nr = |sys: libc::c_long| sys as u32;
    let kill = libc::SECCOMP_RET_KILL_PROCESS;
    let allow = libc::SECCOMP_RET_ALLOW;
    let eacces = libc::SECCOMP_RET_ERRNO | libc::EACCES as u32;
    let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;

    let mut filter = vec![
        load(offset_of!(libc::seccomp_data, arch)),
        jump(libc::BPF_JEQ, arch, 1, 0),
        ret(kill),
        load(offset_of!(libc::seccomp_data, nr)),
    ];
    if let Some(x32) = X32_SYSCALL_BIT {
        filter.extend([jump(libc::BPF_JGE, x32, 0, 1), ret(kill)]);
    }
    // Offsets below are relative to the first instruction of this block.
    filter.extend([
        // 0..=5: dispatch on the system call number.
        jump(libc::BPF_JEQ, nr(libc::SYS_io_uring_setup), 5, 0), // -> 6
        jump(libc::BPF_JEQ, nr(libc::SYS_io_uring_enter), 4, 0), // -> 6
        jump(libc::BPF_JEQ, nr(libc::SYS_io_uring_register), 3, 0), // -> 6
        jump(libc::BPF_JEQ, nr(libc::SYS_socket), 3, 0),         // -> 7
        jump(libc::BPF_JEQ, nr(libc::SYS_socketpair), 4, 0),     // -> 9
        ret(allow),
        // 6: io_uring.
        ret(eperm),
        // 7: socket(domain, type, protocol): refused for AF_UNIX, and for every domain when
        // the network is not allowed.
        load(arg(0)),
        jump(
            libc::BPF_JEQ,
            libc::AF_UNIX as u32,
            4,
            if allow_network { 5 } else { 4 },
        ), // -> 13, 14 (or 13)
        // 9: socketpair(domain, type, protocol, sv); the type without SOCK_NONBLOCK/CLOEXEC.
        load(arg(1)),
        stmt(libc::BPF_ALU | libc::BPF_AND | libc::BPF_K, 0xf),
        jump(libc::BPF_JEQ, libc::SOCK_STREAM as u32, 2, 0), // -> 14
        jump(libc::BPF_JEQ, libc::SOCK_SEQPACKET as u32, 1, 0), // -> 14
        // 13, 14.
        ret(eacces),
        ret(allow),
    ]);
    Some(filter)
}

/// The landlock ABI this kernel enforces, probed once. `None` when landlock is unavailable.
pub fn landlock_abi() -> Option<ABI> {
    static ABI_CACHE: OnceLock<Option<ABI>> = OnceLock::new();
    *ABI_CACHE.get_or_init(|| {
        // Restricting a throwaway thread is the crate's way of reporting the kernel's ABI;
        // landlock restricts only the calling thread, so the rest of the process is untouched.
        std::thread::spawn(|| {
            let status = Ruleset::default()
                .handle_access(AccessFs::Execute)
                .ok()?
                .create()
                .ok()?
                .restrict_self()
                .ok()?;
            match ABI::from(status.landlock) {
                ABI::Unsupported => None,
                abi => Some(abi),
            }
        })
        .join()
        .ok()
        .flatten()
    })
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
    /// `RLIMIT_CPU` in seconds.
    pub cpu_seconds: u64,
}

impl SandboxPlan {
    /// The plan for a command in `jail`, with `tmp` as its private temporary directory.
    pub fn new(jail: &Jail, policy: &ExecPolicy, tmp: PathBuf, timeout: Duration) -> SandboxPlan {
        let root = jail.root_path().to_string_lossy().into_owned();
        let mut env = vec![
            ("PATH".to_owned(), policy.path_env.clone()),
            ("HOME".to_owned(), root.clone()),
            ("PWD".to_owned(), root),
            ("TMPDIR".to_owned(), tmp.to_string_lossy().into_owned()),
            ("LANG".to_owned(), "C.UTF-8".to_owned()),
            ("TERM".to_owned(), "dumb".to_owned()),
        ];
        for (key, value) in &policy.env {
            env.retain(|(k, _)| k != key);
            env.push((key.clone(), value.clone()));
        }
        let mut read_dirs: Vec<PathBuf> = SYSTEM_READ_DIRS.iter().map(PathBuf::from).collect();
        read_dirs.extend(policy.extra_read_paths.iter().cloned());
        let mut write_dirs = vec![tmp];
        write_dirs.extend(policy.extra_write_paths.iter().cloned());
        SandboxPlan {
            read_dirs,
            write_dirs,
            devices: DEVICE_FILES.iter().map(PathBuf::from).collect(),
            env,
            cpu_seconds: timeout.as_secs() + 1,
        }
    }

    /// Builds the landlock ruleset: every filesystem right the ABI knows is handled (so denied
    /// unless granted), the workspace and write dirs get all of them, the read dirs read and
    /// execute, the devices read and write; signals and abstract sockets are scoped to the
    /// sandbox where the ABI can. Missing system directories (no `/lib32` here) are skipped.
    fn ruleset(&self, jail: &Jail, abi: ABI) -> Result<RulesetCreated, landlock::RulesetError> {
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
        let mut created = ruleset
            .create()?
            .add_rule(PathBeneath::new(jail.dir(), all))?;
        for (paths, access) in [
            (&self.write_dirs, all),
            (&self.read_dirs, read),
            (&self.devices, device),
        ] {
            for path in paths {
                let Ok(fd) = PathFd::new(path) else { continue };
                let access = if std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
                    access & AccessFs::from_file(abi)
                } else {
                    access
                };
                created = created.add_rule(PathBeneath::new(fd, access))?;
            }
        }
        Ok(created)
    }
}

/// Rlimits to set in the child, resolved against the current hard limits in the parent.
#[derive(Debug, Clone, Copy)]
struct Rlimits {
    cpu: u64,
    core: u64,
    nofile: u64,
    fsize: u64,
    address_space: Option<u64>,
}

impl Rlimits {
    fn new(policy: &ExecPolicy, cpu_seconds: u64) -> Rlimits {
        let cap = |resource, want: u64| match getrlimit(resource) {
            Ok((_, hard)) => want.min(hard),
            Err(_) => want,
        };
        Rlimits {
            cpu: cap(Resource::RLIMIT_CPU, cpu_seconds),
            core: 0,
            nofile: cap(Resource::RLIMIT_NOFILE, policy.max_open_files),
            fsize: cap(Resource::RLIMIT_FSIZE, policy.max_file_bytes),
            address_space: (policy.max_memory_bytes > 0)
                .then(|| cap(Resource::RLIMIT_AS, policy.max_memory_bytes)),
        }
    }

    /// Async-signal-safe: system calls only.
    fn apply(&self) -> nix::Result<()> {
        setrlimit(Resource::RLIMIT_CPU, self.cpu, self.cpu)?;
        setrlimit(Resource::RLIMIT_CORE, self.core, self.core)?;
        setrlimit(Resource::RLIMIT_NOFILE, self.nofile, self.nofile)?;
        setrlimit(Resource::RLIMIT_FSIZE, self.fsize, self.fsize)?;
        if let Some(bytes) = self.address_space {
            setrlimit(Resource::RLIMIT_AS, bytes, bytes)?;
        }
        Ok(())
    }
}

/// Captured output of one stream: kept up to a cap, the rest read and dropped.
#[derive(Default)]
struct Captured {
    bytes: Vec<u8>,
    truncated: bool,
}

async fn capture(mut pipe: impl AsyncRead + Unpin, cap: usize, into: Arc<Mutex<Captured>>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut captured = into.lock().unwrap_or_else(|p| p.into_inner());
        let room = cap.saturating_sub(captured.bytes.len());
        if n > room {
            captured.truncated = true;
        }
        captured.bytes.extend_from_slice(&buf[..n.min(room)]);
    }
}

fn take_output(captured: &Arc<Mutex<Captured>>) -> (String, bool) {
    let captured = captured.lock().unwrap_or_else(|p| p.into_inner());
    (
        String::from_utf8_lossy(&captured.bytes).into_owned(),
        captured.truncated,
    )
}

pub(crate) async fn run_command(
    jail: &Jail,
    limits: &Limits,
    policy: &ExecPolicy,
    args: &RunCommandArgs,
) -> Result<RunCommandResult, SandboxError> {
    let Some(program) = args.argv.first() else {
        return Err(SandboxError::InvalidArguments(
            "`argv` is empty; give the program and its arguments".into(),
        ));
    };
    if program.is_empty() {
        return Err(SandboxError::InvalidArguments(
            "`argv[0]` is empty; name a program".into(),
        ));
    }
    if args.argv.iter().any(|a| a.contains('\0')) {
        return Err(SandboxError::InvalidArguments(
            "`argv` contains a NUL byte".into(),
        ));
    }
    let timeout_ms = args.timeout_ms.unwrap_or(limits.command_default_timeout_ms);
    if timeout_ms == 0 || timeout_ms > limits.command_max_timeout_ms {
        return Err(SandboxError::InvalidArguments(format!(
            "`timeout_ms` must be between 1 and {}",
            limits.command_max_timeout_ms
        )));
    }
    let timeout = Duration::from_millis(timeout_ms);
    let cwd_path = jail.resolve(args.cwd.as_deref().unwrap_or(""))?;
    let cwd: OwnedFd = jail.open_dir(&cwd_path)?.into();

    let tmp = tempfile::Builder::new()
        .prefix("monad-exec-")
        .tempdir()
        .map_err(|e| SandboxError::Io {
            op: "create temporary directory for",
            path: program.clone(),
            source: e,
        })?;
    let plan = SandboxPlan::new(jail, policy, tmp.path().to_path_buf(), timeout);
    // Both or neither: the landlock ruleset and the seccomp filter are one sandbox.
    if policy.network == crate::NetworkMode::Allowlist {
        return Err(SandboxError::SandboxUnavailable(
            "`network = \"allowlist\"` is not supported yet".into(),
        ));
    }
    let allow_network = policy.network == crate::NetworkMode::Host;
    let (ruleset, filter) = match (landlock_abi(), seccomp_filter(allow_network)) {
        (Some(abi), Some(filter)) if abi >= MIN_ABI => {
            let ruleset = plan.ruleset(jail, abi).map_err(|e| {
                SandboxError::SandboxUnavailable(format!("the landlock ruleset failed: {e}"))
            })?;
            (Some(ruleset), Some(filter))
        }
        _ if policy.allow_unsandboxed_exec => (None, None),
        (None, _) => {
            return Err(SandboxError::SandboxUnavailable(
                "landlock is not available in this kernel".into(),
            ));
        }
        (Some(abi), Some(_)) => {
            return Err(SandboxError::SandboxUnavailable(format!(
                "the kernel's landlock ABI {abi:?} is older than {MIN_ABI:?}"
            )));
        }
        (Some(_), None) => {
            return Err(SandboxError::SandboxUnavailable(format!(
                "commands are sandboxed on x86_64 and aarch64 only, not on {}: there is no \
                 seccomp filter for this architecture",
                std::env::consts::ARCH
            )));
        }
    };
    let sandbox = if ruleset.is_some() {
        "landlock"
    } else {
        "none"
    };
    let rlimits = Rlimits::new(policy, plan.cpu_seconds);

    let mut command = tokio::process::Command::new(program);
    command
        .args(&args.argv[1..])
        .env_clear()
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .process_group(0)
        .stdin(if args.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut ruleset = ruleset;
    // SAFETY: the closure runs between fork and exec. It makes system calls only (setrlimit,
    // fchdir, prctl, landlock_restrict_self) and builds errors from raw errno values, so it
    // neither allocates nor takes locks on its success path. The ruleset, the seccomp filter and
    // the directory descriptor were created in the parent and stay alive until `spawn` returns;
    // the filter is only borrowed here, never freed in the child.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || {
            rlimits.apply().map_err(std::io::Error::from)?;
            nix::unistd::fchdir(&cwd).map_err(std::io::Error::from)?;
            if let Some(ruleset) = ruleset.take() {
                match ruleset.restrict_self() {
                    Ok(status)
                        if status.ruleset == RulesetStatus::FullyEnforced
                            && status.no_new_privs => {}
                    _ => return Err(std::io::Error::from_raw_os_error(LANDLOCK_FAILED)),
                }
            }
            if let Some(filter) = &filter {
                install_seccomp_filter(filter)
                    .map_err(|_| std::io::Error::from_raw_os_error(SECCOMP_FAILED))?;
            }
            Ok(())
        });
    }

    let started = Instant::now();
    let mut child = command.spawn().map_err(|e| spawn_error(program, e))?;
    let pgid = child.id().map(|id| Pid::from_raw(id as i32));
    // If this future is dropped (the call was cancelled), the whole group dies with it.
    let mut group = GroupGuard(pgid);

    let stdout = Arc::new(Mutex::new(Captured::default()));
    let stderr = Arc::new(Mutex::new(Captured::default()));
    let mut readers = tokio::task::JoinSet::new();
    if let Some(pipe) = child.stdout.take() {
        readers.spawn(capture(pipe, limits.output_max_bytes, stdout.clone()));
    }
    if let Some(pipe) = child.stderr.take() {
        readers.spawn(capture(pipe, limits.output_max_bytes, stderr.clone()));
    }
    if let (Some(mut pipe), Some(input)) = (child.stdin.take(), args.stdin.clone()) {
        readers.spawn(async move {
            // A program that does not read its input closes the pipe: not an error.
            let _ = pipe.write_all(input.as_bytes()).await;
        });
    }

    let (status, timed_out) = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(status) => (status, false),
        Err(_) => {
            // The leader is not reaped yet, so its process group id cannot have been reused.
            group.kill();
            (child.wait().await, true)
        }
    };
    // Anything the program left running in its group goes too.
    group.kill();
    group.0 = None;
    let duration = started.elapsed();
    // Readers end when the last writer of each pipe is gone; a process that left the group
    // (setsid) may keep one open, so they get a short grace and are then abandoned.
    let _ = tokio::time::timeout(DRAIN_GRACE, async {
        while readers.join_next().await.is_some() {}
    })
    .await;
    readers.abort_all();
    let status = status.map_err(|e| SandboxError::Io {
        op: "wait for",
        path: program.clone(),
        source: e,
    })?;
    let (stdout, stdout_truncated) = take_output(&stdout);
    let (stderr, stderr_truncated) = take_output(&stderr);
    drop(tmp);
    Ok(RunCommandResult {
        exit_code: status.code(),
        signal: status.signal(),
        timed_out,
        stdout,
        stderr,
        stdout_truncated,
        stderr_truncated,
        duration_ms: duration.as_millis() as u64,
        sandbox: sandbox.to_owned(),
        process: None,
        network: Vec::new(),
    })
}

/// Installs `filter` for the calling thread and its descendants: `PR_SET_NO_NEW_PRIVS` first
/// (landlock's `restrict_self` already set it; it is required for an unprivileged filter, so it
/// is set again rather than assumed), then `PR_SET_SECCOMP`. Async-signal-safe: two system calls,
/// no allocation. An error is the errno of the call that failed.
fn install_seccomp_filter(filter: &[libc::sock_filter]) -> nix::Result<()> {
    let len = u16::try_from(filter.len()).map_err(|_| nix::errno::Errno::EINVAL)?;
    let program = libc::sock_fprog {
        len,
        // The kernel copies the program and never writes through this pointer.
        filter: filter.as_ptr().cast_mut(),
    };
    // prctl is variadic; every argument is passed as the `unsigned long` the kernel reads.
    let one: libc::c_ulong = 1;
    let zero: libc::c_ulong = 0;
    // SAFETY: plain integer arguments.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, one, zero, zero, zero) };
    nix::errno::Errno::result(rc)?;
    // SAFETY: `program` points at `len` valid instructions, both alive for the whole call.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER as libc::c_ulong,
            &program as *const libc::sock_fprog,
        )
    };
    nix::errno::Errno::result(rc).map(drop)
}

/// Kills a process group with `SIGKILL` when told to, and when dropped while still armed.
struct GroupGuard(Option<Pid>);

impl GroupGuard {
    fn kill(&self) {
        if let Some(pgid) = self.0 {
            // ESRCH (the group is already gone) is the normal case after a clean exit.
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spawn_error(program: &str, err: std::io::Error) -> SandboxError {
    match err.raw_os_error() {
        Some(libc::ENOENT) => SandboxError::NotFound(format!(
            "program `{program}` was not found (looked up in the sandbox's PATH when it has no \
             slash)"
        )),
        Some(libc::EACCES) => SandboxError::InvalidArguments(format!(
            "`{program}` cannot be executed here: it is not executable, or it lies outside the \
             workspace and the system directories the sandbox allows"
        )),
        Some(LANDLOCK_FAILED) => SandboxError::SandboxUnavailable(
            "the kernel did not fully enforce the landlock ruleset".into(),
        ),
        Some(SECCOMP_FAILED) => SandboxError::SandboxUnavailable(
            "the kernel refused the seccomp filter that keeps commands away from Unix sockets"
                .into(),
        ),
        _ => SandboxError::Io {
            op: "start",
            path: program.to_owned(),
            source: err,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_scrubs_the_environment_and_lets_the_operator_override() {
        let tmp = tempfile::tempdir().unwrap();
        let jail = Jail::open_ambient(tmp.path()).unwrap();
        let policy = ExecPolicy {
            env: [("LANG", "en_GB.UTF-8"), ("CI", "1")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            ..ExecPolicy::default()
        };
        let plan = SandboxPlan::new(&jail, &policy, "/tmp/x".into(), Duration::from_secs(5));
        let keys: Vec<&str> = plan.env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            ["PATH", "HOME", "PWD", "TMPDIR", "TERM", "CI", "LANG"]
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
        assert_eq!(plan.cpu_seconds, 6);
    }

    /// Runs a classic-BPF seccomp program the way the kernel would, for the instructions the
    /// filter uses; panics on anything else (an unknown opcode, a jump or load out of range).
    fn evaluate(filter: &[libc::sock_filter], nr: i64, arch: u32, args: [u64; 6]) -> u32 {
        let mut data = Vec::with_capacity(std::mem::size_of::<libc::seccomp_data>());
        data.extend_from_slice(&(nr as i32).to_ne_bytes());
        data.extend_from_slice(&arch.to_ne_bytes());
        data.extend_from_slice(&0u64.to_ne_bytes());
        for arg in args {
            data.extend_from_slice(&arg.to_ne_bytes());
        }
        assert_eq!(data.len(), std::mem::size_of::<libc::seccomp_data>());
        let (mut pc, mut a) = (0usize, 0u32);
        loop {
            let ins = filter[pc];
            let code = u32::from(ins.code);
            let (jt, jf) = (usize::from(ins.jt), usize::from(ins.jf));
            pc += 1;
            match code {
                c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => {
                    let at = ins.k as usize;
                    assert!(at.is_multiple_of(4), "unaligned load at {}", pc - 1);
                    a = u32::from_ne_bytes(data[at..at + 4].try_into().unwrap());
                }
                c if c == libc::BPF_ALU | libc::BPF_AND | libc::BPF_K => a &= ins.k,
                c if c == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K => {
                    pc += if a == ins.k { jt } else { jf };
                }
                c if c == libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K => {
                    pc += if a >= ins.k { jt } else { jf };
                }
                c if c == libc::BPF_RET | libc::BPF_K => return ins.k,
                c => panic!("unexpected opcode {c:#x} at {}", pc - 1),
            }
        }
    }

    #[test]
    fn a_sandbox_that_fails_in_the_child_is_reported_as_unavailable() {
        use monad_protocol::ErrorCode;
        for errno in [LANDLOCK_FAILED, SECCOMP_FAILED] {
            let err = spawn_error("x", std::io::Error::from_raw_os_error(errno));
            assert_eq!(err.code(), ErrorCode::SandboxUnavailable, "{err}");
        }
        assert!(
            spawn_error("x", std::io::Error::from_raw_os_error(SECCOMP_FAILED))
                .to_string()
                .contains("seccomp")
        );
    }

    #[test]
    fn the_seccomp_filter_is_well_formed() {
        for allow_network in [true, false] {
            let Some(filter) = seccomp_filter(allow_network) else {
                assert!(AUDIT_ARCH.is_none());
                return;
            };
            check_well_formed(&filter);
        }
    }

    fn check_well_formed(filter: &[libc::sock_filter]) {
        assert!(filter.len() < 64, "{} instructions", filter.len());
        // What the kernel's checker requires: jumps land inside the program, loads are aligned
        // and inside `struct seccomp_data`, the last instruction returns.
        let ret = (libc::BPF_RET | libc::BPF_K) as u16;
        assert_eq!(filter.last().map(|i| i.code), Some(ret));
        for (pc, ins) in filter.iter().enumerate() {
            if u32::from(ins.code) & 0x07 == libc::BPF_JMP {
                let furthest = pc + 1 + usize::from(ins.jt.max(ins.jf));
                assert!(furthest < filter.len(), "jump out of range at {pc}");
            }
            if u32::from(ins.code) == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS {
                let at = ins.k as usize;
                assert!(
                    at.is_multiple_of(4) && at + 4 <= std::mem::size_of::<libc::seccomp_data>()
                );
            }
        }
        // It starts by checking the architecture, before looking at any system call number.
        assert_eq!(
            (filter[0].code, filter[0].k),
            ((libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16, 4)
        );
        assert_eq!(filter[1].k, AUDIT_ARCH.unwrap());
        assert_eq!(filter[2].k, libc::SECCOMP_RET_KILL_PROCESS);
    }

    #[test]
    fn the_seccomp_filter_refuses_unix_sockets_and_io_uring_only() {
        let Some(filter) = seccomp_filter(true) else {
            return;
        };
        let arch = AUDIT_ARCH.unwrap();
        let run = |nr: libc::c_long, args: [u64; 6]| evaluate(&filter, nr, arch, args);
        let kill = libc::SECCOMP_RET_KILL_PROCESS;
        let allow = libc::SECCOMP_RET_ALLOW;
        let eacces = libc::SECCOMP_RET_ERRNO | libc::EACCES as u32;
        let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        let unix = libc::AF_UNIX as u64;
        let flags = (libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK) as u64;
        let stream = libc::SOCK_STREAM as u64;
        let dgram = libc::SOCK_DGRAM as u64;
        let seqpacket = libc::SOCK_SEQPACKET as u64;
        let raw = libc::SOCK_RAW as u64;

        // Another architecture's system calls are killed whatever their number.
        for foreign in [0x4000_0003u32, 0xc000_003e ^ 0xc000_00b7 ^ arch, 0] {
            assert_eq!(evaluate(&filter, libc::SYS_read, foreign, [0; 6]), kill);
            assert_eq!(
                evaluate(&filter, libc::SYS_socket, foreign, [unix, 1, 0, 0, 0, 0]),
                kill
            );
        }
        if let Some(x32) = X32_SYSCALL_BIT {
            let x32 = libc::c_long::from(x32);
            assert_eq!(
                run(x32 | libc::SYS_socket, [unix, stream, 0, 0, 0, 0]),
                kill
            );
            assert_eq!(run(x32, [0; 6]), kill);
        }

        // socket(AF_UNIX, ...) is refused whatever the type and whatever the high bits say.
        for args in [
            [unix, stream, 0, 0, 0, 0],
            [unix, dgram | flags, 0, 0, 0, 0],
            [unix, seqpacket, 0, 0, 0, 0],
            [unix | 0xffff_ffff_0000_0000, stream, 0, 0, 0, 0],
        ] {
            assert_eq!(run(libc::SYS_socket, args), eacces, "{args:?}");
        }
        for domain in [libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK] {
            let args = [domain as u64, stream, 0, 0, 0, 0];
            assert_eq!(run(libc::SYS_socket, args), allow, "{args:?}");
        }
        // 0x1_0000_0001 is AF_INET-sized in the high half and AF_UNIX in the low: refused.
        assert_eq!(
            run(libc::SYS_socket, [0x1_0000_0001, stream, 0, 0, 0, 0]),
            eacces
        );

        // socketpair: stream and seqpacket pairs are fine, datagram pairs are not.
        for (ty, want) in [
            (stream, allow),
            (stream | flags, allow),
            (seqpacket | flags, allow),
            (dgram, eacces),
            (dgram | flags, eacces),
            (raw, eacces),
            (0, eacces),
            (0xffff_ffff_0000_0000 | stream, allow),
        ] {
            assert_eq!(
                run(libc::SYS_socketpair, [unix, ty, 0, 0, 0, 0]),
                want,
                "{ty:#x}"
            );
        }

        for nr in [
            libc::SYS_io_uring_setup,
            libc::SYS_io_uring_enter,
            libc::SYS_io_uring_register,
        ] {
            assert_eq!(run(nr, [8, 0, 0, 0, 0, 0]), eperm, "{nr}");
        }
        for nr in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_openat,
            libc::SYS_execve,
            libc::SYS_connect,
            libc::SYS_sendto,
            libc::SYS_prctl,
            libc::SYS_clone,
        ] {
            assert_eq!(run(nr, [unix, dgram, 0, 0, 0, 0]), allow, "{nr}");
        }
    }

    #[test]
    fn without_network_every_socket_is_refused_and_nothing_else_changes() {
        let (Some(open), Some(closed)) = (seccomp_filter(true), seccomp_filter(false)) else {
            return;
        };
        let arch = AUDIT_ARCH.unwrap();
        let eacces = libc::SECCOMP_RET_ERRNO | libc::EACCES as u32;
        let allow = libc::SECCOMP_RET_ALLOW;
        let stream = libc::SOCK_STREAM as u64;
        let dgram = libc::SOCK_DGRAM as u64;
        for domain in [
            libc::AF_INET,
            libc::AF_INET6,
            libc::AF_NETLINK,
            libc::AF_PACKET,
            libc::AF_UNIX,
        ] {
            for ty in [stream, dgram, libc::SOCK_RAW as u64] {
                let args = [domain as u64, ty, 0, 0, 0, 0];
                assert_eq!(
                    evaluate(&closed, libc::SYS_socket, arch, args),
                    eacces,
                    "{args:?}"
                );
            }
        }
        // Every other call is judged as with the network allowed.
        let unix = libc::AF_UNIX as u64;
        for (nr, args) in [
            (libc::SYS_socketpair, [unix, stream, 0, 0, 0, 0]),
            (libc::SYS_socketpair, [unix, dgram, 0, 0, 0, 0]),
            (libc::SYS_io_uring_setup, [8, 0, 0, 0, 0, 0]),
            (libc::SYS_read, [0; 6]),
            (libc::SYS_connect, [3, 0, 0, 0, 0, 0]),
        ] {
            assert_eq!(
                evaluate(&closed, nr, arch, args),
                evaluate(&open, nr, arch, args),
                "{nr} {args:?}"
            );
        }
        assert_eq!(
            evaluate(
                &open,
                libc::SYS_socket,
                arch,
                [libc::AF_INET as u64, stream, 0, 0, 0, 0]
            ),
            allow
        );
    }
}
