//! Shared fixtures: a workspace root beside an "outside" directory, both in one temp dir.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use monad_protocol::tools::{RunCommandArgs, RunCommandResult};
use monad_sandbox::{ExecPolicy, Limits, Sandbox, SandboxError};

/// `run_command` arguments for `argv`, with a 20 s time limit.
pub fn args(argv: &[&str]) -> RunCommandArgs {
    RunCommandArgs {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        timeout_ms: Some(20_000),
        ..Default::default()
    }
}

pub fn try_run(fx: &Fixture, args: &RunCommandArgs) -> Result<RunCommandResult, SandboxError> {
    runtime().block_on(fx.sandbox.run_command(args))
}

pub fn run(fx: &Fixture, argv: &[&str]) -> RunCommandResult {
    try_run(fx, &args(argv)).unwrap()
}

pub fn sh(fx: &Fixture, script: &str) -> RunCommandResult {
    run(fx, &["sh", "-c", script])
}

/// A temp dir holding `root/` (the workspace) and `outside/` (what must never be touched),
/// plus `root_evil/`, a sibling whose name has the root as a string prefix.
pub struct Fixture {
    pub tmp: tempfile::TempDir,
    pub sandbox: Arc<Sandbox>,
}

/// The secret every escape test tries to reach.
pub const SECRET: &str = "top secret outside the root\n";

impl Fixture {
    pub fn new() -> Fixture {
        Fixture::with_limits(Limits::default())
    }

    pub fn with_limits(limits: Limits) -> Fixture {
        Fixture::with(limits, ExecPolicy::default())
    }

    pub fn with(limits: Limits, exec: ExecPolicy) -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        for dir in ["root", "outside", "root_evil"] {
            std::fs::create_dir(tmp.path().join(dir)).unwrap();
        }
        std::fs::write(tmp.path().join("outside/secret.txt"), SECRET).unwrap();
        std::fs::write(tmp.path().join("root_evil/secret.txt"), SECRET).unwrap();
        // Run as root (as CI does), commands run as `nobody`: the workspace is theirs (the way
        // to it, a 0700 temporary directory, is not: the sandbox masks it).
        give_to_command_user(&tmp.path().join("root"));
        let sandbox = Sandbox::open(&tmp.path().join("root"), limits, exec).unwrap();
        Fixture {
            tmp,
            sandbox: Arc::new(sandbox),
        }
    }

    /// A workspace made the way a server makes a session's primary workspace: a folder root
    /// owns, given to the user its commands run as ([`monad_sandbox::exec::give_to_command_user`]).
    pub fn primary(exec: ExecPolicy) -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        for dir in ["root", "outside", "root_evil"] {
            std::fs::create_dir(tmp.path().join(dir)).unwrap();
        }
        std::fs::write(tmp.path().join("outside/secret.txt"), SECRET).unwrap();
        std::fs::write(tmp.path().join("root_evil/secret.txt"), SECRET).unwrap();
        monad_sandbox::exec::give_to_command_user(&tmp.path().join("root"), &exec).unwrap();
        let sandbox = Sandbox::open(&tmp.path().join("root"), Limits::default(), exec).unwrap();
        Fixture {
            tmp,
            sandbox: Arc::new(sandbox),
        }
    }

    /// The owner of the workspace's folder.
    pub fn owner(&self) -> u32 {
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(self.root()).unwrap())
    }

    pub fn root(&self) -> PathBuf {
        self.tmp.path().join("root")
    }

    pub fn outside(&self) -> PathBuf {
        self.tmp.path().join("outside")
    }

    /// Writes a file inside the root (test setup uses std::fs on fixed paths, never tool input).
    pub fn put(&self, rel: &str, content: &str) {
        let path = self.root().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
        give_to_command_user(&self.root());
    }

    /// Writes a file inside the root, owned like the root itself (as Monad's own tools do).
    pub fn put_owned(&self, rel: &str, content: &str) {
        let path = self.root().join(rel);
        std::fs::write(&path, content).unwrap();
        let owner = std::fs::metadata(self.root()).unwrap();
        use std::os::unix::fs::MetadataExt;
        std::os::unix::fs::lchown(&path, Some(owner.uid()), Some(owner.gid())).unwrap();
    }

    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.root().join(rel)).unwrap()
    }

    pub fn symlink(&self, target: impl AsRef<Path>, link: &str) {
        let path = self.root().join(link);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, path).unwrap();
        give_to_command_user(&self.root());
    }

    /// A snapshot of everything outside the root (names, contents), to compare after an attack.
    pub fn outside_snapshot(&self) -> Vec<(PathBuf, Vec<u8>)> {
        let mut out = Vec::new();
        for dir in ["outside", "root_evil"] {
            snapshot(&self.tmp.path().join(dir), &mut out);
        }
        out.sort();
        out
    }
}

/// The user commands run as when the tests run as root (`nobody`, as the sandbox picks for a
/// folder that root owns).
pub const COMMAND_UID: u32 = 65534;

/// Gives `dir` and everything in it to [`COMMAND_UID`] when the tests run as root (fixed test
/// paths, never tool input). Does nothing otherwise.
pub fn give_to_command_user(dir: &Path) {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    std::os::unix::fs::lchown(dir, Some(COMMAND_UID), Some(COMMAND_UID)).unwrap();
    if !std::fs::symlink_metadata(dir).unwrap().is_dir() {
        return;
    }
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        give_to_command_user(&path);
    }
}

fn snapshot(dir: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            out.push((path.clone(), Vec::new()));
            snapshot(&path, out);
        } else if kind.is_symlink() {
            out.push((
                path.clone(),
                std::fs::read_link(&path)
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes(),
            ));
        } else if kind.is_file() {
            out.push((path.clone(), std::fs::read(&path).unwrap()));
        } else {
            // A FIFO, device or socket: reading it could block; its presence is what counts.
            out.push((path.clone(), b"<special file>".to_vec()));
        }
    }
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

impl Fixture {
    /// Replaces `{tmp}`, `{root}` and `{outside}` in a path template with the fixture's paths.
    pub fn expand(&self, template: &str) -> String {
        template
            .replace("{tmp}", &self.tmp.path().to_string_lossy())
            .replace("{root}", &self.root().to_string_lossy())
            .replace("{outside}", &self.outside().to_string_lossy())
    }

    /// A snapshot of everything inside the root, like [`Fixture::outside_snapshot`].
    pub fn root_snapshot(&self) -> Vec<(PathBuf, Vec<u8>)> {
        let mut out = Vec::new();
        snapshot(&self.root(), &mut out);
        out.sort();
        out
    }

    /// Makes a FIFO inside the root.
    pub fn fifo(&self, rel: &str) {
        let mode = nix::sys::stat::Mode::from_bits_truncate(0o644);
        nix::unistd::mkfifo(&self.root().join(rel), mode).unwrap();
    }

    /// Makes a character (`block == false`) or block device node inside the root.
    pub fn device(&self, rel: &str, block: bool, major: u64, minor: u64) {
        use nix::sys::stat::{Mode, SFlag, makedev, mknod};
        let kind = if block {
            SFlag::S_IFBLK
        } else {
            SFlag::S_IFCHR
        };
        let path = self.root().join(rel);
        mknod(
            &path,
            kind,
            Mode::from_bits_truncate(0o666),
            makedev(major, minor),
        )
        .unwrap();
    }

    /// Makes a Unix socket inside the root (the file stays after the listener is dropped).
    pub fn socket(&self, rel: &str) {
        std::os::unix::net::UnixListener::bind(self.root().join(rel)).unwrap();
    }

    /// Regular files inside the root (links not followed, special files skipped) whose content
    /// contains `needle`: where a leak into the workspace would show.
    pub fn root_files_containing(&self, needle: &str) -> Vec<PathBuf> {
        let mut found = Vec::new();
        let mut dirs = vec![self.root()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let entry = entry.unwrap();
                let kind = entry.file_type().unwrap();
                if kind.is_dir() {
                    dirs.push(entry.path());
                } else if kind.is_file() {
                    let bytes = std::fs::read(entry.path()).unwrap();
                    if String::from_utf8_lossy(&bytes).contains(needle) {
                        found.push(entry.path());
                    }
                }
            }
        }
        found
    }
}

/// Set in a process started by [`in_own_process`].
const OWN_PROCESS: &str = "MONAD_SANDBOX_TEST_OWN_PROCESS";

/// Whether this process was started by [`in_own_process`]: a test that only makes sense there
/// returns at once otherwise.
pub fn in_own_process_now() -> bool {
    std::env::var_os(OWN_PROCESS).is_some()
}

/// Runs the test `name` (its path in this binary, `suite::module::test`) alone in a process of
/// its own, as `uid` when given (with `setpriv`, groups cleared), and checks that it ran and
/// passed. For tests that change what is process-wide (rlimits, what the sandbox probed once) or
/// that need an ordinary user; the test itself is `#[ignore]`d and checks
/// [`in_own_process_now`].
pub fn in_own_process(name: &str, uid: Option<u32>) {
    let exe = std::env::current_exe().unwrap();
    let mut command = match uid {
        Some(uid) => {
            let mut c = std::process::Command::new("setpriv");
            c.arg(format!("--reuid={uid}"))
                .arg(format!("--regid={uid}"))
                .arg("--clear-groups")
                .arg(&exe);
            c
        }
        None => std::process::Command::new(&exe),
    };
    let out = command
        .args([
            name,
            "--exact",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(OWN_PROCESS, "1")
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed"),
        "{name} in a process of its own: {}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
}

/// [`in_own_process`] as an ordinary user, whom file modes bind (as `nobody` when this process
/// is root; as itself otherwise).
pub fn as_ordinary_user(name: &str) {
    in_own_process(
        name,
        nix::unistd::geteuid().is_root().then_some(COMMAND_UID),
    );
}

/// In the body of a test [`as_ordinary_user`] runs: whether this is that process (a test run
/// otherwise returns at once), checked to be an ordinary user's.
pub fn is_ordinary_users_own_process() -> bool {
    if !in_own_process_now() {
        return false;
    }
    assert!(
        !nix::unistd::geteuid().is_root(),
        "runs as an ordinary user"
    );
    true
}

/// Processes on the host (not zombies) whose command line is exactly `argv`, by pid.
pub fn processes_running(argv: &[&str]) -> Vec<i32> {
    let want: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let dir = entry.path();
        if std::fs::read(dir.join("cmdline")).ok().as_deref() != Some(want.as_slice()) {
            continue;
        }
        let state = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
        let zombie = state
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        if !zombie {
            found.push(pid);
        }
    }
    found
}
