//! What a command is, besides its files: its user and capabilities, the metadata it can change,
//! its processes, memory, shared memory and `/proc`. Adversarial, run as root in CI (as Monad
//! may be): each attack is what a command did before commands were contained.

use monad_sandbox::{ExecPolicy, Limits, NamespacePolicy};

use super::support::{COMMAND_UID, Fixture, run, sh};

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
    // Init, the shell and the pipeline: a handful of small pids, none of the host's.
    assert!(pids.len() <= 6 && pids.iter().all(|p| *p < 20), "{pids:?}");
    assert!(pids.contains(&1), "{pids:?}");
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
