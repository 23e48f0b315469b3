//! `run_command`: a program run in its own process group, confined by landlock and rlimits.
//!
//! The policy (which paths, which rights, which limits) is computed in the parent as plain data
//! ([`SandboxPlan`]) and the landlock ruleset is built there too; the child only applies it, in
//! `pre_exec`, between `fork` and `exec`: `setrlimit`, `fchdir` into the working directory
//! (opened through the jail, so no path race), `PR_SET_NO_NEW_PRIVS` and
//! `landlock_restrict_self`. Anything less than full enforcement fails the spawn: the program
//! never runs half-confined. The calling process is never restricted.
//!
//! This is the one module with `unsafe` code: `CommandExt::pre_exec` is unsafe because the
//! closure runs in a forked child of a multi-threaded process, where only async-signal-safe
//! work is allowed. The closure makes system calls only; it allocates nothing on its success path.

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
    let ruleset = match landlock_abi() {
        Some(abi) if abi >= MIN_ABI => Some(plan.ruleset(jail, abi).map_err(|e| {
            SandboxError::SandboxUnavailable(format!("the landlock ruleset failed: {e}"))
        })?),
        Some(abi) if !policy.allow_unsandboxed_exec => {
            return Err(SandboxError::SandboxUnavailable(format!(
                "the kernel's landlock ABI {abi:?} is older than {MIN_ABI:?}"
            )));
        }
        None if !policy.allow_unsandboxed_exec => {
            return Err(SandboxError::SandboxUnavailable(
                "landlock is not available in this kernel".into(),
            ));
        }
        _ => None,
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
    // neither allocates nor takes locks on its success path. The ruleset and the directory
    // descriptor were created in the parent and stay alive until `spawn` returns.
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
                    _ => {
                        return Err(std::io::Error::from_raw_os_error(
                            nix::libc::ENOTRECOVERABLE,
                        ));
                    }
                }
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
    })
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
        Some(nix::libc::ENOENT) => SandboxError::NotFound(format!(
            "program `{program}` was not found (looked up in the sandbox's PATH when it has no \
             slash)"
        )),
        Some(nix::libc::EACCES) => SandboxError::InvalidArguments(format!(
            "`{program}` cannot be executed here: it is not executable, or it lies outside the \
             workspace and the system directories the sandbox allows"
        )),
        Some(nix::libc::ENOTRECOVERABLE) => SandboxError::SandboxUnavailable(
            "the kernel did not fully enforce the landlock ruleset".into(),
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
}
