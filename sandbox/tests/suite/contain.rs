//! What a command is, besides its files: its user and capabilities, the metadata it can change,
//! its processes, memory, shared memory and `/proc`. Adversarial, run as root in CI (as Monad
//! may be): each attack is what a command did before commands were contained.

use std::os::unix::fs::PermissionsExt;

use monad_sandbox::{ExecPolicy, Limits, NamespacePolicy};

use super::support::{COMMAND_UID, Fixture, SECRET, run, sh};

const PYTHON: &str = "/usr/bin/python3";

fn root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn without_namespaces() -> ExecPolicy {
    ExecPolicy {
        namespaces: NamespacePolicy::Off,
        ..Default::default()
    }
}

/// The `Name:\tvalue` lines of `/proc/self/status` as the command sees them.
fn status_field(status: &str, name: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in {status}"))
        .trim()
        .to_owned()
}

#[test]
fn commands_run_without_root_and_without_any_capability() {
    let fx = Fixture::new();
    let out = sh(
        &fx,
        "cat /proc/self/status; python3 -c 'import ctypes; print(\"securebits\", \
         ctypes.CDLL(None).prctl(27, 0, 0, 0, 0))'",
    );
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    let status = &out.stdout;
    if root() {
        assert_eq!(
            status_field(status, "Uid"),
            format!("{COMMAND_UID}\t{COMMAND_UID}\t{COMMAND_UID}\t{COMMAND_UID}")
        );
        assert!(!status_field(status, "Gid").starts_with("0\t"), "{status}");
        assert_eq!(status_field(status, "Groups"), "", "no supplementary group");
    }
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(status_field(status, set), "0000000000000000", "{set}");
    }
    assert_eq!(status_field(status, "NoNewPrivs"), "1");
    assert_eq!(status_field(status, "Seccomp"), "2");
    // NOROOT, NO_SETUID_FIXUP and KEEP_CAPS locked off, NO_CAP_AMBIENT_RAISE, all locked.
    assert!(status.contains("securebits 235"), "{status}");
}

#[test]
fn without_namespaces_commands_still_run_without_root_or_capabilities() {
    let fx = Fixture::with(Limits::default(), without_namespaces());
    // No private /proc here: the answer comes from the kernel directly.
    let out = run(
        &fx,
        &[
            PYTHON,
            "-c",
            "import ctypes, os\n\
             libc = ctypes.CDLL(None)\n\
             print(os.getuid(), os.geteuid(), os.getgid(), os.getgroups())\n\
             print('bounding', [c for c in range(41) if libc.prctl(23, c, 0, 0, 0) == 1])\n\
             class H(ctypes.Structure): _fields_ = [('v', ctypes.c_uint32), ('p', ctypes.c_int)]\n\
             class D(ctypes.Structure): _fields_ = [('e', ctypes.c_uint32), ('p', ctypes.c_uint32), ('i', ctypes.c_uint32)]\n\
             h = H(0x20080522, 0); d = (D * 2)()\n\
             libc.capget(ctypes.byref(h), d)\n\
             print('sets', [x for s in d for x in (s.e, s.p, s.i)])\n",
        ],
    );
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    let mut lines = out.stdout.lines();
    if root() {
        assert_eq!(lines.next(), Some("65534 65534 65534 []"), "{out:?}");
        assert_eq!(lines.next(), Some("bounding []"), "{out:?}");
    } else {
        lines.next();
        lines.next();
    }
    assert_eq!(lines.next(), Some("sets [0, 0, 0, 0, 0, 0]"), "{out:?}");
}

/// Modes, owners and times of files outside the workspace: a root-owned system file (before,
/// run as root, a command set its set-uid bit: a local root exploit for anyone) and a file of
/// the command's own user outside the workspace (another session's workspace, say).
#[test]
fn metadata_outside_the_workspace_cannot_be_changed() {
    let fx = Fixture::new();
    let theirs = fx.outside().join("theirs.txt");
    std::fs::write(&theirs, "another workspace's file\n").unwrap();
    super::support::give_to_command_user(&theirs);
    let snapshot = || {
        use std::os::unix::fs::MetadataExt;
        ["secret.txt", "theirs.txt"].map(|name| {
            let m = std::fs::metadata(fx.outside().join(name)).unwrap();
            (m.mode(), m.uid(), m.gid(), m.mtime(), m.atime())
        })
    };
    let before = snapshot();
    let outside = fx.outside().display().to_string();
    for target in [
        format!("{outside}/secret.txt"),
        format!("{outside}/theirs.txt"),
    ] {
        for (what, script) in [
            ("chmod", format!("chmod 4777 '{target}'")),
            (
                "chown",
                format!("chown {COMMAND_UID}:{COMMAND_UID} '{target}'"),
            ),
            ("touch", format!("touch -d @0 '{target}'")),
            ("touch -a", format!("touch -a -d @0 '{target}'")),
        ] {
            let out = sh(&fx, &script);
            assert_ne!(out.exit_code, Some(0), "{what} {target}: {out:?}");
        }
    }
    // The same through a path relative to the working directory, which climbs out.
    let out = sh(
        &fx,
        "chmod 0777 ../outside/theirs.txt; touch -d @0 ../outside/theirs.txt",
    );
    assert_ne!(out.exit_code, Some(0), "{out:?}");
    assert_eq!(snapshot(), before, "metadata outside the workspace changed");
    // Inside, the same calls work.
    fx.put("mine.txt", "x");
    let out = sh(
        &fx,
        "chmod 0600 mine.txt && touch -d @0 mine.txt && stat -c %a mine.txt",
    );
    assert_eq!(out.stdout, "600\n", "{out:?}");
}

#[test]
fn a_set_uid_program_gives_nothing() {
    if !root() {
        eprintln!(
            "SKIPPED a_set_uid_program_gives_nothing: only root can make a set-uid-root program"
        );
        return;
    }
    let fx = Fixture::new();
    let program = fx.root().join("suid-id");
    std::fs::copy("/usr/bin/id", &program).unwrap();
    std::os::unix::fs::lchown(&program, Some(0), Some(0)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let out = run(&fx, &["./suid-id", "-u"]);
    assert_eq!(out.stdout.trim(), COMMAND_UID.to_string(), "{out:?}");
    let bare = Fixture::with(Limits::default(), without_namespaces());
    std::fs::copy("/usr/bin/id", bare.root().join("suid-id")).unwrap();
    std::os::unix::fs::lchown(bare.root().join("suid-id"), Some(0), Some(0)).unwrap();
    std::fs::set_permissions(
        bare.root().join("suid-id"),
        std::fs::Permissions::from_mode(0o4755),
    )
    .unwrap();
    let out = run(&bare, &["./suid-id", "-u"]);
    assert_eq!(out.stdout.trim(), COMMAND_UID.to_string(), "{out:?}");
}

/// A command cannot leave a set-user-ID or set-group-ID program in the workspace: outside the
/// sandbox (where the folder's mount is not `nosuid`) anyone who runs it would act as the
/// folder's owner. Every way of setting the bits is refused; the other mode bits still work.
#[test]
fn a_command_cannot_leave_a_set_uid_or_set_gid_program_behind() {
    let script = r#"
import os, errno
def attempt(name, f):
    try:
        f()
        print(name, 'done')
    except OSError as e:
        print(name, errno.errorcode[e.errno])
open('plain', 'w').close()
attempt('chmod', lambda: os.chmod('plain', 0o4755))
attempt('chmod-g', lambda: os.chmod('plain', 0o2755))
fd = os.open('plain', os.O_RDONLY)
attempt('fchmod', lambda: os.fchmod(fd, 0o6755))
attempt('fchmodat', lambda: os.chmod('plain', 0o4700, dir_fd=os.open('.', os.O_RDONLY)))
attempt('open-creat', lambda: os.close(os.open('made', os.O_CREAT | os.O_WRONLY, 0o4755)))
attempt('openat-creat', lambda: os.close(os.open('made2', os.O_CREAT | os.O_WRONLY, 0o2755, dir_fd=os.open('.', os.O_RDONLY))))
attempt('mknod', lambda: os.mknod('node', 0o100000 | 0o4755))
attempt('chmod-x', lambda: os.chmod('plain', 0o755))
attempt('open-read', lambda: os.close(os.open('plain', os.O_RDONLY, 0o7777)))
for name in ['plain', 'made', 'made2', 'node']:
    try:
        print(name, oct(os.stat(name).st_mode & 0o7777))
    except FileNotFoundError:
        print(name, 'absent')
"#;
    for policy in [ExecPolicy::default(), without_namespaces()] {
        let fx = Fixture::with(Limits::default(), policy.clone());
        let out = run(&fx, &[PYTHON, "-c", script]);
        assert_eq!(out.exit_code, Some(0), "{out:?}");
        let said: Vec<&str> = out.stdout.lines().collect();
        assert_eq!(
            said,
            [
                "chmod EPERM",
                "chmod-g EPERM",
                "fchmod EPERM",
                "fchmodat EPERM",
                "open-creat EPERM",
                "openat-creat EPERM",
                "mknod EPERM",
                "chmod-x done",
                "open-read done",
                "plain 0o755",
                "made absent",
                "made2 absent",
                "node absent",
            ],
            "{policy:?}: {out:?}"
        );
        for left in std::fs::read_dir(fx.root()).unwrap() {
            let mode = left.unwrap().metadata().unwrap().permissions().mode();
            assert_eq!(mode & 0o6000, 0, "{mode:o}");
        }
        let out = run(
            &fx,
            &["sh", "-c", "cp /usr/bin/id ./myid && chmod 6755 ./myid"],
        );
        assert_ne!(out.exit_code, Some(0), "{out:?}");
        let mode = std::fs::metadata(fx.root().join("myid"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o6000, 0, "{mode:o}");
    }
}

#[test]
fn raw_packet_and_netlink_sockets_are_refused() {
    let script = r#"
import socket, errno
for name, args in [('raw', (socket.AF_INET, socket.SOCK_RAW, 1)),
                   ('raw6', (socket.AF_INET6, socket.SOCK_RAW, 58)),
                   ('packet', (socket.AF_PACKET, socket.SOCK_RAW, 0)),
                   ('netlink', (socket.AF_NETLINK, socket.SOCK_RAW, 0)),
                   ('netlink-dgram', (socket.AF_NETLINK, socket.SOCK_DGRAM, 0))]:
    try:
        socket.socket(*args)
        print(name, 'opened')
    except OSError as e:
        print(name, errno.errorcode[e.errno])
"#;
    for policy in [
        ExecPolicy::default(),
        ExecPolicy {
            network: monad_sandbox::NetworkMode::Host,
            ..Default::default()
        },
        without_namespaces(),
    ] {
        let fx = Fixture::with(Limits::default(), policy.clone());
        let out = run(&fx, &[PYTHON, "-c", script]);
        assert_eq!(out.exit_code, Some(0), "{out:?}");
        assert!(!out.stdout.contains("opened"), "{policy:?}: {}", out.stdout);
        assert_eq!(out.stdout.lines().count(), 5, "{out:?}");
    }
}

#[test]
fn the_process_limit_holds() {
    let fx = Fixture::with(
        Limits::default(),
        ExecPolicy {
            max_processes: 16,
            ..Default::default()
        },
    );
    let out = run(
        &fx,
        &[
            PYTHON,
            "-c",
            r#"
import os, time
made, refused = 0, 0
for _ in range(40):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        made += 1
    except BlockingIOError:
        refused += 1
print(made, refused)
"#,
        ],
    );
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    let counts: Vec<u32> = out
        .stdout
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert!(
        counts[0] < 16 && counts[1] > 0,
        "made {}, refused {}",
        counts[0],
        counts[1]
    );
}

#[test]
fn the_memory_limit_holds() {
    let fx = Fixture::with(
        Limits::default(),
        ExecPolicy {
            max_memory_bytes: 256 * 1024 * 1024,
            ..Default::default()
        },
    );
    let out = run(
        &fx,
        &[
            PYTHON,
            "-c",
            "b = bytearray(512 * 1024 * 1024); print('got it')",
        ],
    );
    assert_ne!(out.exit_code, Some(0), "{out:?}");
    assert!(out.stderr.contains("MemoryError"), "{out:?}");
}

#[test]
fn multiprocessing_works_on_a_private_dev_shm() {
    let fx = Fixture::new();
    let out = run(
        &fx,
        &[
            PYTHON,
            "-c",
            r#"
import multiprocessing as mp
def square(x):
    return x * x
if __name__ == '__main__':
    with mp.Pool(2) as pool:
        print(pool.map(square, range(5)))
    lock = mp.Lock(); lock.acquire(); lock.release()
    open('/dev/shm/mine', 'w').write('x')
    print('ok')
"#,
        ],
    );
    assert_eq!(out.stdout, "[0, 1, 4, 9, 16]\nok\n", "{out:?}");
    assert!(
        !std::path::Path::new("/dev/shm/mine").exists(),
        "the command wrote the host's /dev/shm"
    );
    // And the next command has a /dev/shm of its own.
    let out = sh(&fx, "ls -A /dev/shm");
    assert_eq!(
        (out.exit_code, out.stdout.as_str()),
        (Some(0), ""),
        "{out:?}"
    );
}

#[test]
fn proc_shows_only_the_commands_own_processes() {
    let fx = Fixture::new();
    let out = sh(
        &fx,
        "ls /proc | grep -E '^[0-9]+$' | sort -n | tr '\\n' ' '",
    );
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    let pids: Vec<u32> = out
        .stdout
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    // The shell and the pipeline: a handful of small pids, none of the host's, and not its
    // init (pid 1, a copy of Monad).
    assert!(pids.len() <= 6 && pids.iter().all(|p| *p < 20), "{pids:?}");
    assert!(!pids.is_empty() && !pids.contains(&1), "{pids:?}");
    // What /proc gives is read-only.
    let out = sh(&fx, "echo 1000 > /proc/self/oom_score_adj");
    assert_ne!(out.exit_code, Some(0), "{out:?}");
}

/// As root, commands run as another user, who may not search the directories on the way to the
/// workspace (a server's data directory is 0700): the command's view masks them, so the
/// workspace, `HOME` and a toolchain listed in `extra_read_paths` under such a directory still
/// work, and nothing else in it shows.
#[test]
fn a_workspace_under_directories_its_user_cannot_search_still_works() {
    use std::os::unix::fs::PermissionsExt;
    let fx = Fixture::new();
    let tools = fx.outside().join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    std::fs::write(
        tools.join("hello"),
        "#!/bin/sh\necho hello from the toolchain\n",
    )
    .unwrap();
    std::fs::set_permissions(tools.join("hello"), std::fs::Permissions::from_mode(0o755)).unwrap();
    for dir in [fx.tmp.path(), &fx.outside()] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let sandbox = std::sync::Arc::new(
        monad_sandbox::Sandbox::open(
            &fx.root(),
            Limits::default(),
            ExecPolicy {
                extra_read_paths: vec![tools.clone()],
                ..Default::default()
            },
        )
        .unwrap(),
    );
    let script = format!(
        "cd \"$HOME\" && echo ok > viahome && cat \"$PWD/viahome\" && '{}/hello' && \
         cat '{}/secret.txt'",
        tools.display(),
        fx.outside().display()
    );
    let out = super::support::runtime()
        .block_on(sandbox.run_command(&super::support::args(&["sh", "-c", &script])))
        .unwrap();
    assert_eq!(out.stdout, "ok\nhello from the toolchain\n", "{out:?}");
    assert_ne!(out.exit_code, Some(0), "the secret is not there: {out:?}");
    assert_eq!(fx.read("viahome"), "ok\n");
}

/// A descriptor Monad holds without `O_CLOEXEC` (as from whatever started it) never reaches a
/// command, with or without namespaces: before, `cat <&N` printed a file outside the workspace.
#[test]
fn descriptors_monad_holds_never_reach_a_command() {
    for policy in [ExecPolicy::default(), without_namespaces()] {
        let fx = Fixture::with(Limits::default(), policy.clone());
        let held = nix::fcntl::open(
            &fx.outside().join("secret.txt"),
            nix::fcntl::OFlag::O_RDONLY,
            nix::sys::stat::Mode::empty(),
        )
        .unwrap();
        let n = std::os::fd::AsRawFd::as_raw_fd(&held);
        let out = sh(&fx, &format!("cat <&{n}"));
        assert!(
            !out.stdout.contains(SECRET.trim()),
            "{policy:?}: fd {n} reached the command: {out:?}"
        );
        assert_ne!(out.exit_code, Some(0), "{out:?}");
    }
}

/// glibc's `execvp` runs a script without `#!` with `/bin/sh`, building its argv on the stack
/// of the command's process (which runs in its parent's memory until `exec`): tens of thousands
/// of arguments used to overflow that stack into the parent's memory (`/bin/sh: cannot open
/// 0\x06...`). They must simply work.
#[test]
fn a_script_without_shebang_runs_with_tens_of_thousands_of_arguments() {
    for policy in [ExecPolicy::default(), without_namespaces()] {
        let fx = Fixture::with(Limits::default(), policy.clone());
        fx.put("script", "echo ran with \"$#\" arguments\n");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            fx.root().join("script"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        for n in [40_000usize, 100_000] {
            let mut a = super::support::args(&["./script"]);
            a.argv.extend(std::iter::repeat_n(String::new(), n));
            let out = super::support::try_run(&fx, &a).unwrap();
            assert_eq!(
                (out.exit_code, out.stdout.as_str(), out.stderr.as_str()),
                (Some(0), format!("ran with {n} arguments\n").as_str(), ""),
                "{policy:?}"
            );
        }
    }
}

/// The folder-owner rule took the group from the owner's passwd entry or the folder's group,
/// and a folder owned by `4321:0` (no passwd entry) ran commands with gid 0.
#[test]
fn commands_never_run_with_gid_0() {
    if !root() {
        eprintln!("SKIPPED commands_never_run_with_gid_0: only root can give a folder to group 0");
        return;
    }
    for policy in [ExecPolicy::default(), without_namespaces()] {
        let fx = Fixture::with(Limits::default(), policy.clone());
        std::os::unix::fs::lchown(fx.root(), Some(4321), Some(0)).unwrap();
        match super::support::try_run(&fx, &super::support::args(&["id"])) {
            Ok(out) => {
                assert_eq!(out.exit_code, Some(0), "{out:?}");
                assert!(!out.stdout.contains("gid=0"), "{policy:?}: {}", out.stdout);
                assert!(!out.stdout.contains("(root)"), "{policy:?}: {}", out.stdout);
            }
            Err(e) => {
                assert_eq!(
                    e.code(),
                    monad_protocol::ErrorCode::SandboxUnavailable,
                    "{e}"
                );
                assert!(e.to_string().contains("gid 0"), "{e}");
            }
        }
    }
}

/// A server with more descriptors open than a command may have (`max_open_files`) still runs
/// commands: the limit used to be set before the sandbox made its own pipes, which then failed
/// with `EMFILE`.
#[test]
fn a_server_holding_many_descriptors_still_runs_commands() {
    let policy = ExecPolicy {
        max_open_files: 8,
        ..Default::default()
    };
    // Every descriptor below 40 in use, whatever else this process holds.
    let held: Vec<std::fs::File> = (0..40)
        .map(|_| std::fs::File::open("/dev/null").unwrap())
        .collect();
    let fallback = ExecPolicy {
        namespaces: NamespacePolicy::Off,
        ..policy.clone()
    };
    for policy in [policy, fallback] {
        let fx = Fixture::with(Limits::default(), policy.clone());
        let out = sh(&fx, "ulimit -n; echo ran");
        assert_eq!(
            (out.exit_code, out.stdout.as_str()),
            (Some(0), "8\nran\n"),
            "{policy:?}: {out:?}"
        );
    }
    drop(held);
}

/// `/proc` in a command's namespaces is read-only and shows only the command's own processes:
/// not its init, whose command line is the server's (which may hold a password).
#[test]
fn proc_is_read_only_and_hides_the_servers_command_line() {
    let fx = Fixture::new();
    let me = std::fs::read(format!("/proc/{}/cmdline", std::process::id())).unwrap();
    let me = String::from_utf8_lossy(&me).replace('\0', " ");
    let out = sh(
        &fx,
        "cat /proc/1/cmdline; echo; ls /proc/1 >/dev/null 2>&1 && echo pid-1-visible; \
         grep ' /proc ' /proc/self/mountinfo",
    );
    assert!(!out.stdout.contains(me.trim()), "{out:?}");
    assert!(!out.stdout.contains("pid-1-visible"), "{out:?}");
    let mount = out.stdout.lines().last().unwrap_or_default();
    let options: Vec<&str> = mount
        .split_whitespace()
        .nth(5)
        .unwrap_or("")
        .split(',')
        .collect();
    assert!(options.contains(&"ro"), "/proc is not read-only: {mount}");
}

/// Whether `pid` runs (is not a zombie, nor gone).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().to_owned())
        })
        .is_some_and(|rest| !rest.starts_with('Z'))
}

/// A grandchild, re-parented to the fallback's supervisor, kills it (`kill-result` says how
/// that went, `grandchild-pid` who it is) and stays; the command waits for the result.
const SUPERVISOR_KILLER: &str = r#"
import os, time
def put(name, text):
    with open(name + ".part", "w") as f:
        f.write(text)
    os.rename(name + ".part", name)
middle = os.fork()
if middle == 0:
    os.setsid()
    me = os.getpid()
    if os.fork() == 0:
        while os.getppid() == me:
            time.sleep(0.001)
        put("grandchild-pid", str(os.getpid()))
        try:
            os.kill(os.getppid(), 9)
            put("kill-result", "killed")
        except OSError as e:
            put("kill-result", type(e).__name__)
        time.sleep(120)
    os._exit(0)
os.waitpid(middle, 0)
while not os.path.exists("kill-result"):
    time.sleep(0.001)
print(open("kill-result").read())
"#;

/// Without namespaces, as an ordinary user, the supervisor runs as the command's own user: only
/// landlock's signal scope (ABI 6, Linux 6.12) keeps the command from killing it, after which
/// what the command started lives on (only the command itself dies with its supervisor). Such
/// commands are refused where the scope is missing; where it is there, the kill fails and
/// nothing survives. Run as `nobody` in a process of its own, with the ABI held at 5, then at
/// the kernel's.
#[test]
fn an_ordinary_users_command_cannot_kill_its_supervisor_and_leave_survivors() {
    super::support::in_own_process(
        "suite::contain::own_process_supervisor_killer",
        root().then_some(COMMAND_UID),
    );
}

#[test]
#[ignore = "run by an_ordinary_users_command_cannot_kill_its_supervisor_and_leave_survivors"]
fn own_process_supervisor_killer() {
    if !super::support::in_own_process_now() {
        return;
    }
    assert!(!root(), "runs as an ordinary user");
    for at_most in [Some(5), None] {
        monad_sandbox::exec::pretend_landlock_abi_at_most(at_most);
        let fx = Fixture::with(Limits::default(), without_namespaces());
        let result = super::support::try_run(
            &fx,
            &super::support::args(&[PYTHON, "-c", SUPERVISOR_KILLER]),
        );
        let survivor = std::fs::read_to_string(fx.root().join("grandchild-pid"))
            .ok()
            .and_then(|p| p.parse::<i32>().ok())
            .filter(|pid| running(*pid));
        if let Some(pid) = survivor {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        assert_eq!(
            survivor, None,
            "ABI at most {at_most:?}: the grandchild outlived its command: {result:?}"
        );
        match (at_most, result) {
            (Some(_), Err(e)) => {
                assert_eq!(
                    e.code(),
                    monad_protocol::ErrorCode::SandboxUnavailable,
                    "{e}"
                );
                let message = e.to_string();
                assert!(
                    message.contains("6.12") && message.contains("namespaces"),
                    "the refusal names the way out: {message}"
                );
            }
            (Some(_), Ok(out)) => panic!("ran without landlock's signal scope: {out:?}"),
            (None, Ok(out)) => assert_eq!(out.stdout, "PermissionError\n", "{out:?}"),
            (None, Err(e)) => panic!("refused with the kernel's own ABI: {e}"),
        }
    }
}

/// The landlock probe ran once and kept its answer, even when it failed for a passing reason
/// (no descriptor free): with `allow_unsandboxed_exec`, every later command then ran without
/// landlock or seccomp.
#[test]
fn a_passing_failure_of_the_landlock_probe_is_not_kept() {
    super::support::in_own_process("suite::contain::own_process_landlock_probe", None);
}

#[test]
#[ignore = "run by a_passing_failure_of_the_landlock_probe_is_not_kept"]
fn own_process_landlock_probe() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if !super::support::in_own_process_now() {
        return;
    }
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    // Descriptors 0, 1 and 2 are open: none can be opened now.
    setrlimit(Resource::RLIMIT_NOFILE, 3, hard).unwrap();
    assert!(
        std::fs::File::open("/dev/null").is_err(),
        "no descriptor is free"
    );
    let probed = monad_sandbox::exec::landlock_abi();
    setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
    let fx = Fixture::with(
        Limits::default(),
        ExecPolicy {
            allow_unsandboxed_exec: true,
            ..Default::default()
        },
    );
    let out = sh(&fx, &format!("cat '{}/secret.txt'", fx.outside().display()));
    assert_eq!(out.sandbox, "landlock", "probed: {probed:?}, then: {out:?}");
    assert!(!out.stdout.contains(SECRET.trim()), "{out:?}");
}

/// Where the operator let commands run without landlock (`allow_unsandboxed_exec`, on a kernel
/// whose landlock is too old) and commands have no namespaces, `network = "off"` is still kept:
/// the seccomp filter refuses sockets (it was dropped with landlock, and the command reached a
/// server on the host's loopback while the owner's prompt said "no network"). Run in a process of
/// its own, with the ABI held at 1.
#[test]
fn without_landlock_network_off_still_holds() {
    super::support::in_own_process("suite::contain::own_process_unsandboxed_network", None);
}

#[test]
#[ignore = "run by without_landlock_network_off_still_holds"]
fn own_process_unsandboxed_network() {
    if !super::support::in_own_process_now() {
        return;
    }
    monad_sandbox::exec::pretend_landlock_abi_at_most(Some(1));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let fx = Fixture::with(
        Limits::default(),
        ExecPolicy {
            allow_unsandboxed_exec: true,
            ..without_namespaces()
        },
    );
    let out = run(
        &fx,
        &[
            PYTHON,
            "-c",
            &format!(
                "import socket\n\
                 try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=5)\n    \
                 print('connected')\n\
                 except OSError as e:\n    print('refused', e.errno)"
            ),
        ],
    );
    assert_eq!(out.sandbox, "none", "ran without landlock: {out:?}");
    assert!(out.stdout.starts_with("refused"), "{out:?}");
}

/// The lowest descriptor limit under which exactly `spare` descriptors can still be opened.
fn limit_leaving(spare: usize) -> u64 {
    let open: std::collections::BTreeSet<u64> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    (0..).filter(|fd| !open.contains(fd)).nth(spare).unwrap()
}

/// A failure to make a workspace's namespaces for a passing reason (no descriptor free, at each
/// step in turn) fails that command, and never switches every later command to the fallback.
#[test]
fn a_passing_failure_never_turns_namespaces_off() {
    if !root() {
        eprintln!("SKIPPED a_passing_failure_never_turns_namespaces_off: CI runs it as root");
        return;
    }
    super::support::in_own_process("suite::contain::own_process_namespace_failures", None);
}

#[test]
#[ignore = "run by a_passing_failure_never_turns_namespaces_off"]
fn own_process_namespace_failures() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if !super::support::in_own_process_now() {
        return;
    }
    let rt = super::support::runtime();
    let run = |fx: &Fixture, script: &str| {
        rt.block_on(
            fx.sandbox
                .run_command(&super::support::args(&["sh", "-c", script])),
        )
    };
    // Probe landlock and start what runs commands with descriptors to spare (without touching
    // namespaces).
    assert!(monad_sandbox::exec::landlock_abi().is_some());
    let warm = Fixture::with(Limits::default(), without_namespaces());
    assert_eq!(run(&warm, "true").unwrap().exit_code, Some(0));
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    for spare in 0..40 {
        let fx = Fixture::new();
        setrlimit(Resource::RLIMIT_NOFILE, limit_leaving(spare), hard).unwrap();
        let result = run(&fx, "true");
        setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
        drop(fx);
        // In its PID namespace the shell is pid 2 (after its init); in the fallback it is not.
        let out = run(&Fixture::new(), "echo $$").unwrap();
        assert_eq!(
            out.stdout, "2\n",
            "{spare} descriptors to spare gave {result:?}, and then commands ran without \
             namespaces"
        );
    }
}

/// Watches, as `nobody`, the direct children of process `argv[1]` until `argv[2]` exists:
/// prints what it could take from any of them (its environment, a descriptor).
const MAKER_WATCHER: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
parent, stop = sys.argv[1], sys.argv[2]
print("watching", flush=True)
found = []
while not found and not os.path.exists(stop):
    try:
        tids = os.listdir(f"/proc/{parent}/task")
    except OSError:
        break
    for tid in tids:
        try:
            kids = open(f"/proc/{parent}/task/{tid}/children").read().split()
        except OSError:
            continue
        for pid in kids:
            if int(pid) == os.getpid():
                continue
            try:
                if open(f"/proc/{pid}/environ", "rb").read():
                    found.append(f"the environment of {pid}")
            except OSError:
                pass
            pidfd = libc.syscall(434, int(pid), 0)
            if pidfd < 0:
                continue
            for n in range(0, 64):
                fd = libc.syscall(438, pidfd, n, 0)
                if fd >= 0:
                    found.append(f"descriptor {n} of {pid}: {os.readlink(f'/proc/self/fd/{fd}')}")
                    os.close(fd)
            os.close(pidfd)
print("\n".join(found), flush=True)
"#;

/// The process that makes a workspace's namespaces is a copy of Monad (its memory, its
/// descriptors) running as the commands' user: it used to be dumpable for its whole life, so
/// any process of that user could read its environment and take its descriptors
/// (`pidfd_getfd`), a root server's included.
#[test]
fn the_namespace_maker_shows_nothing_of_monad_to_the_commands_user() {
    if !root() {
        eprintln!(
            "SKIPPED the_namespace_maker_shows_nothing_of_monad_to_the_commands_user: as an \
             ordinary user the maker is that user, like Monad itself"
        );
        return;
    }
    super::support::in_own_process("suite::contain::own_process_maker_watch", None);
}

#[test]
#[ignore = "run by the_namespace_maker_shows_nothing_of_monad_to_the_commands_user"]
fn own_process_maker_watch() {
    use std::io::BufRead;
    if !super::support::in_own_process_now() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let stop = dir.path().join("stop");
    let mut watcher = std::process::Command::new("setpriv")
        .args([
            format!("--reuid={COMMAND_UID}"),
            format!("--regid={COMMAND_UID}"),
            "--clear-groups".into(),
            PYTHON.into(),
            "-c".into(),
            MAKER_WATCHER.into(),
            std::process::id().to_string(),
            stop.display().to_string(),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(watcher.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "watching");
    for _ in 0..40 {
        // A workspace of its own each time: each makes its namespaces.
        let fx = Fixture::new();
        assert_eq!(run(&fx, &["true"]).exit_code, Some(0));
        if watcher.try_wait().unwrap().is_some() {
            break;
        }
    }
    std::fs::write(&stop, "").unwrap();
    watcher.wait().unwrap();
    let seen: Vec<String> = lines
        .map_while(Result::ok)
        .filter(|l| !l.is_empty())
        .collect();
    assert!(seen.is_empty(), "as the commands' user: {seen:#?}");
}

/// git runs what `.git/config` names (`core.fsmonitor`, a pager, aliases) and its hooks,
/// outside any sandbox, the next time the folder's owner runs it. In its namespaces a command
/// may write the rest of `.git` (so that `git commit` works) but not those.
#[test]
fn a_command_cannot_change_what_git_runs_but_can_commit() {
    let fx = Fixture::new();
    let setup = sh(
        &fx,
        "git init -q . && git -c user.name=a -c user.email=a@b commit -q --allow-empty -m one \
         && ls .git/config .git/hooks >/dev/null && echo ready",
    );
    assert_eq!(setup.stdout, "ready\n", "{setup:?}");
    let before = std::fs::read_to_string(fx.root().join(".git/config")).unwrap();
    let attack = sh(
        &fx,
        r##"
try() { if ( eval "$1" ) 2>/dev/null; then echo "$2 done"; else echo "$2 refused"; fi; }
try 'echo "[core] fsmonitor = touch /tmp/pwned" >> .git/config' append
try 'git config core.fsmonitor "touch /tmp/pwned"' git-config
try 'cp .git/config c && mv -f c .git/config' rename
try 'printf "#!/bin/sh\nid\n" > .git/hooks/pre-commit' hook
try 'rm -rf .git/hooks' remove-hooks
try 'mv .git .git.old' move-git
try 'echo x > .git/description' other-file
try 'echo more > f && git add f && git -c user.name=a -c user.email=a@b commit -q -m two' commit
"##,
    );
    assert_eq!(
        attack.stdout,
        "append refused\ngit-config refused\nrename refused\nhook refused\nremove-hooks \
         refused\nmove-git refused\nother-file done\ncommit done\n",
        "{attack:?}"
    );
    // git reads its config and hooks from the directory `.git/commondir` names: a copy of
    // `.git` with a config of the command's choosing. The file goes when the command ends.
    let redirect = sh(
        &fx,
        "rm -rf g && mkdir g && cp -a .git/. g/ && git config -f g/config core.fsmonitor \
         'touch /tmp/pwned' && echo ../g > .git/commondir && git rev-parse --git-common-dir",
    );
    assert!(redirect.stdout.ends_with("/root/g\n"), "{redirect:?}");
    assert!(
        redirect
            .stderr
            .contains("made .git/commondir, which would make git read its config"),
        "{redirect:?}"
    );
    assert!(!fx.root().join(".git/commondir").exists());
    // The same for the config git reads when `extensions.worktreeConfig` is on, and for a
    // `commondir` made a directory (git then fails on every run).
    let more = sh(
        &fx,
        "printf '[core]\\n\\tfsmonitor = x\\n' > .git/config.worktree && mkdir .git/commondir",
    );
    assert!(
        more.stderr.contains("made .git/config.worktree")
            && more.stderr.contains("made .git/commondir"),
        "{more:?}"
    );
    assert!(!fx.root().join(".git/config.worktree").exists());
    assert!(!fx.root().join(".git/commondir").exists());
    // One that was there before is kept as it is.
    std::fs::write(fx.root().join(".git/commondir"), ".\n").unwrap();
    let rewrite = sh(&fx, "echo ../g > .git/commondir || echo refused");
    assert_eq!(rewrite.stdout, "refused\n", "{rewrite:?}");
    assert_eq!(
        std::fs::read_to_string(fx.root().join(".git/commondir")).unwrap(),
        ".\n"
    );
    assert_eq!(
        std::fs::read_to_string(fx.root().join(".git/config")).unwrap(),
        before
    );
    assert!(!fx.root().join(".git/hooks/pre-commit").exists());
    assert!(fx.root().join(".git/hooks").is_dir());
}
