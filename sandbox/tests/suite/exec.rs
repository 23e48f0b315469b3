//! `run_command`: positive controls, limits, and confinement of real processes.

use monad_protocol::ErrorCode;
use monad_protocol::tools::{RunCommandArgs, RunCommandResult};
use monad_sandbox::{Limits, SandboxError};

use super::support::{Fixture, SECRET, runtime};

fn args(argv: &[&str]) -> RunCommandArgs {
    RunCommandArgs {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: None,
        timeout_ms: Some(20_000),
        stdin: None,
        workspace: None,
    }
}

fn try_run(fx: &Fixture, args: &RunCommandArgs) -> Result<RunCommandResult, SandboxError> {
    runtime().block_on(fx.sandbox.run_command(args))
}

fn run(fx: &Fixture, argv: &[&str]) -> RunCommandResult {
    try_run(fx, &args(argv)).unwrap()
}

fn sh(fx: &Fixture, script: &str) -> RunCommandResult {
    run(fx, &["sh", "-c", script])
}

/// True once `pid` is gone or a zombie (killed, waiting for its reaper). SIGKILL is delivered
/// asynchronously, so this polls for up to five seconds instead of sleeping a fixed time.
fn dies(pid: i32) -> bool {
    (0..500).any(|_| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let done = stat.is_empty() || stat.contains(") Z ");
        if !done {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        done
    })
}

#[test]
fn echo_runs_inside_the_sandbox() {
    let fx = Fixture::new();
    let out = run(&fx, &["echo", "hello"]);
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    assert_eq!(out.stdout, "hello\n");
    assert_eq!(out.sandbox, "landlock");
    assert!(!out.timed_out);
}

#[test]
fn exit_codes_stderr_and_signals_are_reported() {
    let fx = Fixture::new();
    let out = sh(&fx, "echo out; echo err >&2; exit 3");
    assert_eq!(
        (out.exit_code, out.stdout.as_str(), out.stderr.as_str()),
        (Some(3), "out\n", "err\n")
    );
    let out = sh(&fx, "kill -9 $$");
    assert_eq!((out.exit_code, out.signal), (None, Some(9)), "{out:?}");
}

#[test]
fn commands_read_and_write_inside_the_workspace_and_its_cwd() {
    let fx = Fixture::new();
    fx.put("src/in.txt", "input\n");
    let mut a = args(&["sh", "-c", "cat in.txt && echo made > out.txt && pwd"]);
    a.cwd = Some("src".into());
    let out = try_run(&fx, &a).unwrap();
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    let root = fx.root().canonicalize().unwrap();
    assert_eq!(out.stdout, format!("input\n{}/src\n", root.display()));
    assert_eq!(fx.read("src/out.txt"), "made\n");
}

#[test]
fn stdin_is_passed_and_absent_stdin_is_empty() {
    let fx = Fixture::new();
    let mut a = args(&["cat"]);
    a.stdin = Some("fed in\n".into());
    assert_eq!(try_run(&fx, &a).unwrap().stdout, "fed in\n");
    let out = run(&fx, &["cat"]);
    assert_eq!((out.exit_code, out.stdout.as_str()), (Some(0), ""));
}

#[test]
fn the_environment_is_scrubbed() {
    let fx = Fixture::new();
    let out = run(&fx, &["env"]);
    let keys: Vec<&str> = out
        .stdout
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .collect();
    // cargo gives this test process CARGO_* variables; none may reach the command.
    assert!(std::env::vars().any(|(k, _)| k.starts_with("CARGO")));
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        ["HOME", "LANG", "PATH", "PWD", "TERM", "TMPDIR"],
        "{}",
        out.stdout
    );
}

#[test]
fn the_private_temp_dir_is_writable_and_removed_afterwards() {
    let fx = Fixture::new();
    let out = sh(
        &fx,
        "echo t > \"$TMPDIR/t\" && cat \"$TMPDIR/t\" && echo \"$TMPDIR\"",
    );
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    let tmpdir = out.stdout.lines().nth(1).unwrap().to_owned();
    assert!(
        !std::path::Path::new(&tmpdir).exists(),
        "{tmpdir} was left behind"
    );
}

#[test]
fn a_timeout_kills_the_whole_process_group() {
    let fx = Fixture::new();
    // The grandchild writes its pid, then sleeps; after the kill it must be gone.
    let mut a = args(&["sh", "-c", "sleep 30 & echo $! > bg.pid; wait"]);
    a.timeout_ms = Some(500);
    let out = try_run(&fx, &a).unwrap();
    assert!(out.timed_out, "{out:?}");
    assert_eq!(out.signal, Some(9));
    assert!(out.duration_ms < 10_000, "{out:?}");
    let pid: i32 = fx.read("bg.pid").trim().parse().unwrap();
    assert!(dies(pid), "background process {pid} survived the timeout");
}

#[test]
fn background_processes_are_killed_when_the_command_ends() {
    let fx = Fixture::new();
    let out = sh(&fx, "sleep 30 > /dev/null 2>&1 & echo $! > bg.pid");
    assert_eq!(out.exit_code, Some(0));
    let pid: i32 = fx.read("bg.pid").trim().parse().unwrap();
    assert!(dies(pid), "background process {pid} survived its command");
}

#[test]
fn output_is_capped_and_the_rest_drained() {
    let limits = Limits {
        output_max_bytes: 1000,
        ..Limits::default()
    };
    let fx = Fixture::with_limits(limits);
    let out = sh(&fx, "head -c 5000000 /dev/zero | tr '\\0' a; echo done >&2");
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    assert_eq!(out.stdout.len(), 1000);
    assert!(out.stdout_truncated && !out.stderr_truncated);
    assert_eq!(out.stderr, "done\n");
}

#[test]
fn bad_arguments_are_refused_before_anything_runs() {
    let fx = Fixture::new();
    let cases: Vec<(RunCommandArgs, ErrorCode)> = vec![
        (args(&[]), ErrorCode::InvalidArguments),
        (args(&[""]), ErrorCode::InvalidArguments),
        (args(&["echo", "a\0b"]), ErrorCode::InvalidArguments),
        (
            RunCommandArgs {
                timeout_ms: Some(0),
                ..args(&["true"])
            },
            ErrorCode::InvalidArguments,
        ),
        (
            RunCommandArgs {
                timeout_ms: Some(u64::MAX),
                ..args(&["true"])
            },
            ErrorCode::InvalidArguments,
        ),
        (
            RunCommandArgs {
                cwd: Some("../outside".into()),
                ..args(&["true"])
            },
            ErrorCode::OutsideWorkspace,
        ),
        (
            RunCommandArgs {
                cwd: Some("missing".into()),
                ..args(&["true"])
            },
            ErrorCode::NotFound,
        ),
        (args(&["no-such-program-anywhere"]), ErrorCode::NotFound),
    ];
    for (a, code) in cases {
        let err = try_run(&fx, &a).unwrap_err();
        assert_eq!(err.code(), code, "{:?}: {err}", a.argv);
    }
}

#[test]
fn programs_outside_the_allowed_directories_cannot_be_executed() {
    let fx = Fixture::new();
    // A copy of a real program outside the root and outside the system directories.
    let outside_prog = fx.outside().join("mytrue");
    std::fs::copy("/bin/true", &outside_prog).unwrap();
    let err = try_run(&fx, &args(&[outside_prog.to_str().unwrap()])).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArguments, "{err}");
    assert!(err.to_string().contains("cannot be executed"), "{err}");
    // The same program inside the workspace runs.
    std::fs::copy("/bin/true", fx.root().join("mytrue")).unwrap();
    assert_eq!(run(&fx, &["./mytrue"]).exit_code, Some(0));
}

#[test]
fn cat_of_an_outside_file_is_denied() {
    let fx = Fixture::new();
    let secret = fx.outside().join("secret.txt");
    let out = run(&fx, &["cat", secret.to_str().unwrap()]);
    assert_ne!(out.exit_code, Some(0), "{out:?}");
    assert!(!out.stdout.contains(SECRET.trim()));
    assert!(out.stderr.contains("Permission denied"), "{out:?}");
}

#[test]
fn landlock_is_enforced_at_abi_3_or_newer() {
    let abi = monad_sandbox::exec::landlock_abi().expect("landlock is available on this kernel");
    println!("landlock ABI enforced by this kernel: {abi:?}");
    assert!(abi >= landlock::ABI::V3, "{abi:?}");
}

#[test]
fn cancelling_the_call_kills_the_whole_process_group() {
    let fx = Fixture::new();
    let a = args(&["sh", "-c", "sleep 30 & echo $! > bg.pid; wait"]);
    let rt = runtime();
    let pid_file = fx.root().join("bg.pid");
    rt.block_on(async {
        let call = fx.sandbox.run_command(&a);
        tokio::pin!(call);
        // Drive the call until the background process has announced itself, then drop it.
        loop {
            tokio::select! {
                _ = &mut call => panic!("the command finished by itself"),
                _ = tokio::time::sleep(std::time::Duration::from_millis(20)) => {}
            }
            if std::fs::read_to_string(&pid_file).is_ok_and(|s| s.ends_with('\n')) {
                break;
            }
        }
    });
    let pid: i32 = fx.read("bg.pid").trim().parse().unwrap();
    assert!(
        dies(pid),
        "background process {pid} survived the cancelled call"
    );
}
