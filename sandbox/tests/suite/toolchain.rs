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

/// Regression: an entry of the operator's `PATH` that is not absolute (`~/.cargo/bin`, written
/// as a shell would expand it, or an empty one) was searched from the command's own directory,
/// inside the workspace: `ls` ran the workspace's `~/.cargo/bin/ls`, while the owner was told
/// (and a remembered rule kept) that `ls` is `/usr/bin/ls`. Such entries are left out.
#[test]
fn a_path_entry_that_is_not_absolute_is_not_searched_in_the_workspace() {
    use std::os::unix::fs::PermissionsExt;
    for (path_env, env_path) in [
        ("~/.cargo/bin:/usr/bin:/bin", None),
        (":/usr/bin:/bin", None),
        ("/usr/bin:/bin", Some("~/.cargo/bin::/usr/bin:/bin")),
        // Nothing absolute: no PATH at all would be the current directory too.
        ("~/.cargo/bin", None),
        ("/usr/bin:/bin", Some("~/.cargo/bin")),
    ] {
        let fx = Fixture::with(
            Limits::default(),
            ExecPolicy {
                path_env: path_env.to_owned(),
                env: env_path
                    .map(|p| [("PATH".to_owned(), p.to_owned())].into())
                    .unwrap_or_default(),
                ..Default::default()
            },
        );
        for shadow in ["~/.cargo/bin/ls", "ls"] {
            fx.put(shadow, "#!/bin/sh\necho shadow\n");
            let file = fx.root().join(shadow);
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        // A toolchain directory of the workspace's, which comes first.
        std::fs::create_dir_all(fx.root().join(".venv/bin")).unwrap();
        if env_path.unwrap_or(path_env).contains("/usr/bin") {
            let out = run(&fx, &["ls"]);
            assert_eq!(out.exit_code, Some(0), "{path_env}: {out:?}");
            assert!(!out.stdout.contains("shadow"), "{path_env}: {out:?}");
        }
        // Through a shell, which looks the name up in the PATH it was given.
        let out = run(&fx, &["/bin/sh", "-c", "ls; echo \"[$PATH]\""]);
        assert!(
            !out.stdout.contains("shadow"),
            "{path_env} {env_path:?}: {out:?}"
        );
        let path = out.stdout.lines().last().unwrap_or_default();
        let path = path.trim_start_matches('[').trim_end_matches(']');
        assert!(
            !path.is_empty() && path.split(':').all(|d| d.starts_with('/')),
            "{path_env} {env_path:?}: {out:?}"
        );
    }
}
