//! A project's own toolchain inside the sandbox: a virtualenv made in the workspace, pytest
//! installed into it from wheels the operator made readable (`extra_read_paths`), and the tests
//! run with the venv first in `PATH`, all without network.

use std::path::PathBuf;

use monad_sandbox::{ExecPolicy, Limits};

use super::support::{Fixture, run};

/// Wheels of pytest and its dependencies: `$MONAD_TEST_WHEELS`, else `target/wheels` (made by
/// `.ci/run`).
fn wheels() -> Option<PathBuf> {
    let dir = std::env::var_os("MONAD_TEST_WHEELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/wheels"));
    let has_pytest = std::fs::read_dir(&dir)
        .ok()?
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("pytest-"));
    has_pytest.then(|| dir.canonicalize().unwrap())
}

#[test]
fn a_project_venv_installs_and_runs_pytest_offline() {
    let Some(wheels) = wheels() else {
        let why = "no pytest wheels (run scripts/test, or `pip download -d target/wheels pytest`, \
                   or set MONAD_TEST_WHEELS)";
        // scripts/test installs the wheels and sets MONAD_TEST_REQUIRE_PEERS: there, a missing
        // wheel is a failure, not a skip.
        assert!(
            std::env::var_os("MONAD_TEST_REQUIRE_PEERS").is_none(),
            "a_project_venv_installs_and_runs_pytest_offline did not run: {why}"
        );
        eprintln!("SKIPPED a_project_venv_installs_and_runs_pytest_offline: {why}");
        return;
    };
    let fx = Fixture::with(
        Limits::default(),
        ExecPolicy {
            extra_read_paths: vec![wheels.clone()],
            ..Default::default()
        },
    );
    fx.put(
        "test_sums.py",
        "def add(a, b):\n    return a + b\n\n\ndef test_add():\n    assert add(2, 2) == 4\n",
    );
    let out = run(&fx, &["python3", "-m", "venv", ".venv"]);
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    let out = run(
        &fx,
        &[
            ".venv/bin/pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-index",
            "--find-links",
            wheels.to_str().unwrap(),
            "pytest",
        ],
    );
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    // `pytest` by its bare name: the workspace's venv comes first in PATH.
    let out = run(&fx, &["pytest", "-q", "-p", "no:cacheprovider"]);
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    assert!(out.stdout.contains("1 passed"), "{out:?}");
    let out = run(&fx, &["sh", "-c", "echo $VIRTUAL_ENV; command -v python"]);
    let root = fx.root().canonicalize().unwrap();
    assert_eq!(
        out.stdout,
        format!("{0}/.venv\n{0}/.venv/bin/python\n", root.display()),
        "{out:?}"
    );
}
