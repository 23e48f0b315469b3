//! `run_command`: positive controls and confinement.

use monad_protocol::tools::RunCommandArgs;

use super::support::{Fixture, SECRET, runtime};

fn run(fx: &Fixture, argv: &[&str]) -> monad_protocol::tools::RunCommandResult {
    let args = RunCommandArgs {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: None,
        timeout_ms: Some(10_000),
        stdin: None,
        workspace: None,
    };
    runtime().block_on(fx.sandbox.run_command(&args)).unwrap()
}

#[test]
fn echo_runs_inside_the_sandbox() {
    let fx = Fixture::new();
    let out = run(&fx, &["echo", "hello"]);
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    assert_eq!(out.stdout, "hello\n");
    assert_eq!(out.sandbox, "landlock");
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
