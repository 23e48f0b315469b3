//! Who commands run as when Monad runs as root, and what other users of the host can reach of
//! them. Adversarial: each attack is what a process on the host (or a command) could do before.

use std::os::unix::fs::MetadataExt;

use monad_protocol::ToolName;
use monad_protocol::tools::RunCommandResult;
use monad_sandbox::{ExecPolicy, Limits, NamespacePolicy, Sandbox};
use serde_json::json;

use super::support::{COMMAND_UID, Fixture, run, runtime, sh};

/// The range workspaces' own users come from unless `[exec] uid_range` says otherwise.
const DEFAULT_RANGE: std::ops::RangeInclusive<u32> = 1_879_048_192..=2_147_352_575;

fn root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn skipped(test: &str) -> bool {
    if !root() {
        eprintln!("SKIPPED {test}: only a root Monad gives commands users of their own");
    }
    !root()
}

/// Runs `script` as `nobody` (a host daemon, or any process of the shared user), outside any
/// sandbox; returns its exit code and output.
fn as_nobody(script: &str) -> (Option<i32>, String) {
    let out = std::process::Command::new("setpriv")
        .args([
            format!("--reuid={COMMAND_UID}"),
            format!("--regid={COMMAND_UID}"),
            "--clear-groups".into(),
            "sh".into(),
            "-c".into(),
            script.into(),
        ])
        .current_dir("/")
        .output()
        .unwrap();
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn each_primary_workspace_gets_a_user_of_its_own() {
    if skipped("each_primary_workspace_gets_a_user_of_its_own") {
        return;
    }
    let a = Fixture::primary(ExecPolicy::default());
    let b = Fixture::primary(ExecPolicy::default());
    let (ua, ub) = (a.owner(), b.owner());
    assert_ne!(ua, ub, "two workspaces share a user");
    for uid in [ua, ub] {
        assert!(DEFAULT_RANGE.contains(&uid), "{uid} is outside the range");
        assert!(
            nix::unistd::User::from_uid(uid.into()).unwrap().is_none(),
            "{uid} is a user of the system"
        );
    }
    let out = sh(&a, "id -u; id -g; id -G");
    assert_eq!(out.stdout, format!("{ua}\n{ua}\n{ua}\n"), "{out:?}");
    // Stable: giving the folder again, or opening it again (a restart), keeps its user.
    monad_sandbox::exec::give_to_command_user(&a.root(), &ExecPolicy::default()).unwrap();
    assert_eq!(a.owner(), ua);
    let again = Sandbox::open(&a.root(), Limits::default(), ExecPolicy::default()).unwrap();
    let out = runtime()
        .block_on(again.run_command(&super::support::args(&["id", "-u"])))
        .unwrap();
    assert_eq!(out.stdout, format!("{ua}\n"));
}

/// Before, a server's workspaces all ran as `nobody`: any process of that user on the host (a
/// daemon, another session's command) could read and write a running command's workspace
/// through `/proc/<pid>/cwd`.
#[test]
fn a_host_process_of_another_user_cannot_reach_a_running_commands_workspace() {
    if skipped("a_host_process_of_another_user_cannot_reach_a_running_commands_workspace") {
        return;
    }
    for policy in [
        ExecPolicy::default(),
        ExecPolicy {
            namespaces: NamespacePolicy::Off,
            ..Default::default()
        },
    ] {
        let fx = Fixture::primary(policy.clone());
        fx.put_owned("private.txt", "session data\n");
        let rt = runtime();
        let mark = format!("6{}.5", std::process::id());
        let started: RunCommandResult = serde_json::from_value(
            rt.block_on(fx.sandbox.call(
                ToolName::RunCommand,
                json!({"argv": ["sleep", mark], "background": true}),
            ))
            .unwrap(),
        )
        .unwrap();
        let process = started.process.unwrap();
        // Its process on the host, once it has run `exec` (the call returned after it did).
        let pid = super::support::processes_running(&["sleep", &mark])[0];
        let (code, said) = as_nobody(&format!(
            "cat /proc/{pid}/cwd/private.txt; echo planted > /proc/{pid}/cwd/planted"
        ));
        let _ = rt.block_on(fx.sandbox.call(
            ToolName::ProcessKill,
            json!({"process": process, "signal": "KILL"}),
        ));
        assert_ne!(code, Some(0), "{policy:?}: {said}");
        assert!(!said.contains("session data"), "{policy:?}: {said}");
        assert!(!fx.root().join("planted").exists(), "{policy:?}: {said}");
    }
}

/// A folder root owns (attached by a root client) ran its commands as `nobody`, the user every
/// such folder and many daemons share; now it gets a user of its own for as long as it is open.
#[test]
fn a_root_owned_folder_runs_as_a_user_of_its_own() {
    if skipped("a_root_owned_folder_runs_as_a_user_of_its_own") {
        return;
    }
    let open = || {
        let dir = tempfile::tempdir().unwrap();
        let sandbox = Sandbox::open(dir.path(), Limits::default(), ExecPolicy::default()).unwrap();
        (dir, sandbox)
    };
    let id = |sandbox: &Sandbox| -> u32 {
        let out = runtime()
            .block_on(sandbox.run_command(&super::support::args(&["id", "-u"])))
            .unwrap();
        assert_eq!(out.exit_code, Some(0), "{out:?}");
        out.stdout.trim().parse().unwrap()
    };
    let (_a, a) = open();
    let (_b, b) = open();
    let ua = id(&a);
    assert!(DEFAULT_RANGE.contains(&ua), "{ua}");
    assert_eq!(id(&a), ua, "the same user for every command of the folder");
    assert_ne!(id(&b), ua, "two folders share a user");
}

/// A primary workspace an older Monad gave to `nobody` gets a user of its own, with what its
/// commands made in it.
#[test]
fn a_workspace_given_to_nobody_before_gets_a_user_of_its_own() {
    if skipped("a_workspace_given_to_nobody_before_gets_a_user_of_its_own") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("workspace");
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::write(root.join("src/made.txt"), "made by a command\n").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
    super::support::give_to_command_user(&root);
    monad_sandbox::exec::give_to_command_user(&root, &ExecPolicy::default()).unwrap();
    let uid = std::fs::metadata(&root).unwrap().uid();
    assert!(DEFAULT_RANGE.contains(&uid), "{uid}");
    for path in ["src", "src/made.txt", "link"] {
        let meta = std::fs::symlink_metadata(root.join(path)).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (uid, uid), "{path}");
    }
    assert_eq!(
        std::fs::metadata("/etc/passwd").unwrap().uid(),
        0,
        "a link is not followed"
    );
    // An operator who names the user keeps it.
    let named = tempfile::tempdir().unwrap();
    super::support::give_to_command_user(named.path());
    let policy = ExecPolicy {
        user: Some("nobody".into()),
        ..Default::default()
    };
    monad_sandbox::exec::give_to_command_user(named.path(), &policy).unwrap();
    assert_eq!(std::fs::metadata(named.path()).unwrap().uid(), COMMAND_UID);
}

/// The workspace's temporary directory sat in `/tmp`, owned by the commands' user, who could
/// swap it for a link: the next command's writable bind and landlock rule then went where the
/// link pointed. Run as that user on the host, outside any sandbox.
#[test]
fn the_temporary_directory_cannot_be_swapped_by_the_commands_user() {
    if skipped("the_temporary_directory_cannot_be_swapped_by_the_commands_user") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    for policy in [
        ExecPolicy::default(),
        ExecPolicy {
            namespaces: NamespacePolicy::Off,
            ..Default::default()
        },
    ] {
        let fx = Fixture::with(Limits::default(), policy.clone());
        let out = sh(&fx, "echo \"$TMPDIR\"");
        let tmpdir = out.stdout.trim().to_owned();
        assert!(tmpdir.starts_with('/'), "{out:?}");
        // What the attacker wants the command to reach: a directory its user may write anyway,
        // outside the command's sandbox.
        let victim = tempfile::tempdir().unwrap();
        std::fs::set_permissions(victim.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let target = victim.path().join("tmp");
        std::fs::create_dir(&target).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::write(target.join("secret.txt"), "the victim's secret\n").unwrap();
        let (_, said) = as_nobody(&format!(
            "t='{tmpdir}'; p=$(dirname \"$t\"); \
             mv \"$t\" \"$t.gone\" && ln -s '{}' \"$t\" && echo swapped the directory; \
             mv \"$p\" \"$p.gone\" && ln -s '{}' \"$p\" && echo swapped its parent; true",
            target.display(),
            victim.path().display()
        ));
        let out = sh(
            &fx,
            "cat \"$TMPDIR/secret.txt\"; echo pwned > \"$TMPDIR/pwned\"; echo \"$TMPDIR\"",
        );
        let parent = std::path::Path::new(&tmpdir)
            .parent()
            .unwrap()
            .to_path_buf();
        for moved in [
            format!("{tmpdir}.gone"),
            format!("{}.gone", parent.display()),
        ] {
            let _ = std::fs::remove_dir_all(moved);
        }
        assert!(
            !out.stdout.contains("the victim's secret"),
            "{policy:?}: {said} {out:?}"
        );
        assert!(!target.join("pwned").exists(), "{policy:?}: {said} {out:?}");
    }
}

#[test]
fn commands_of_an_attached_folder_still_run_as_its_owner() {
    let fx = Fixture::new();
    let out = run(&fx, &["id", "-u"]);
    let want = if root() {
        COMMAND_UID
    } else {
        nix::unistd::geteuid().as_raw()
    };
    assert_eq!(out.stdout, format!("{want}\n"), "{out:?}");
}
