//! Where a command's program will be found ([`locate`]), so that "always" can say what it covers
//! and never covers a file the agent can change ([`crate::approval::Rule::of`]).
//!
//! The lookup follows the sandbox's own ([`monad_sandbox::Sandbox::check`]), but only to tell
//! three places apart, and it errs towards [`ProgramSite::Workspace`] and
//! [`ProgramSite::Other`], which give the narrowest rule:
//!
//! - a path with a `/`: relative paths are resolved in the workspace; an absolute path is in the
//!   workspace when the jail takes it, outside when it is beneath a directory commands may read
//!   and not one they may write, anything else otherwise;
//! - a name: each directory of the `PATH` commands get
//!   ([`monad_sandbox::exec::command_path`]: the workspace's toolchain directories first), in
//!   order. A workspace directory that holds anything by that name makes it
//!   [`ProgramSite::Workspace`]; a directory commands may write that holds it makes it
//!   [`ProgramSite::Other`]; the first directory commands may only read that holds an executable
//!   file by that name (its links followed, and the file they end at also neither in the
//!   workspace nor writable) makes it [`ProgramSite::Outside`].
//!
//! Directories outside the workspace come from the operator (`path_env`, `extra_read_paths`,
//! `extra_write_paths`) and are opened with [`Dir::open_ambient_dir`]; the name is looked up
//! through that handle, and inside the workspace through the jail.

use std::path::{Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::{Dir, PermissionsExt};
use monad_protocol::text::printable_name;
use monad_sandbox::Sandbox;
use monad_sandbox::exec::{SYSTEM_READ_DIRS, command_path};

/// Where a command's program is found, as far as "always" is concerned.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ProgramSite {
    /// Found at this path, in a directory commands may read but not write, outside the
    /// workspace: no call can change what it is.
    Outside(String),
    /// In the workspace, at this path (as given, or where a name was found: its toolchain
    /// directories, `.venv/bin`, `node_modules/.bin`, ..., relative to the root). A call that
    /// writes files can change what it does.
    Workspace(String),
    /// Anywhere else, or not known: a directory commands may write, a path the sandbox cannot
    /// run, a program not found.
    Other,
}

/// Where `program` (`argv[0]`) will be found in `sandbox`.
pub fn locate(sandbox: &Sandbox, program: &str) -> ProgramSite {
    let places = Places::of(sandbox);
    if program.contains('/') {
        // A path the jail takes is in the workspace (`./x`, `bin/x`, an absolute path inside
        // it); a relative one it refuses climbs out (`../../bin/sh`): not the workspace's.
        if sandbox.jail().resolve(program).is_ok() {
            return ProgramSite::Workspace(program.to_owned());
        }
        if !program.starts_with('/') {
            return ProgramSite::Other;
        }
        return places.outside(Path::new(program));
    }
    if program.is_empty() || program == "." || program == ".." {
        return ProgramSite::Other;
    }
    let (path_env, _) = command_path(sandbox.jail(), sandbox.exec_policy());
    for dir in path_env
        .split(':')
        .map(Path::new)
        .filter(|d| d.is_absolute())
    {
        if let Ok(rel) = dir.strip_prefix(&places.root) {
            if sandbox
                .jail()
                .dir()
                .symlink_metadata(rel.join(program))
                .is_ok()
            {
                let found = rel.join(program).to_string_lossy().into_owned();
                return ProgramSite::Workspace(found);
            }
            continue;
        }
        let writable = places.writable(dir);
        if !writable && !places.readable(dir) {
            continue; // the sandbox cannot run anything from there
        }
        let Ok(handle) = Dir::open_ambient_dir(dir, ambient_authority()) else {
            continue;
        };
        if writable {
            if handle.symlink_metadata(program).is_ok() {
                return ProgramSite::Other;
            }
            continue;
        }
        // Followed through links, as running it would.
        let runnable = handle
            .metadata(program)
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
        if runnable {
            return places.outside(&dir.join(program));
        }
    }
    ProgramSite::Other
}

impl ProgramSite {
    /// Where `program` runs from, in words, for the approval prompt (escaped: safe to print).
    pub fn shown(&self) -> String {
        match self {
            ProgramSite::Outside(path) => printable_name(path).into_owned(),
            ProgramSite::Workspace(path) => format!(
                "{} in this folder: a file an agent can write, so it runs whatever that file \
                 holds then",
                printable_name(path)
            ),
            ProgramSite::Other => "not from a system directory commands can only read (a \
                                   directory they may write, or not found)"
                .into(),
        }
    }
}

/// The directories that decide a site.
struct Places {
    root: PathBuf,
    read: Vec<PathBuf>,
    write: Vec<PathBuf>,
}

impl Places {
    fn of(sandbox: &Sandbox) -> Places {
        let exec = sandbox.exec_policy();
        let mut read: Vec<PathBuf> = SYSTEM_READ_DIRS.iter().map(PathBuf::from).collect();
        read.extend(exec.extra_read_paths.iter().cloned());
        Places {
            root: sandbox.jail().root_path().to_path_buf(),
            read,
            write: exec.extra_write_paths.clone(),
        }
    }

    fn readable(&self, path: &Path) -> bool {
        self.read
            .iter()
            .any(|d| d.is_absolute() && path.starts_with(d))
    }

    fn writable(&self, path: &Path) -> bool {
        path.starts_with(&self.root)
            || self
                .write
                .iter()
                .any(|d| d.is_absolute() && path.starts_with(d))
    }

    /// `path` (absolute, outside the workspace) as a site: [`ProgramSite::Outside`] when it
    /// and the file its links end at are beneath directories commands may read and not write.
    fn outside(&self, path: &Path) -> ProgramSite {
        if self.writable(path) || !self.readable(path) {
            return ProgramSite::Other;
        }
        // The operator's directories, not the workspace: their links are followed by the
        // system, as `exec` would.
        match std::fs::canonicalize(path) {
            Ok(real) if !self.writable(&real) && self.readable(&real) => {
                ProgramSite::Outside(path.to_string_lossy().into_owned())
            }
            _ => ProgramSite::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use monad_sandbox::{ExecPolicy, Limits};

    fn sandbox(dir: &Path, exec: ExecPolicy) -> Sandbox {
        Sandbox::open(dir, Limits::default(), exec).unwrap()
    }

    fn executable(path: &Path) {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn system_programs_are_outside_and_workspace_ones_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let sb = sandbox(dir.path(), ExecPolicy::default());
        assert!(
            matches!(locate(&sb, "ls"), ProgramSite::Outside(p) if p.ends_with("/ls")),
            "{:?}",
            locate(&sb, "ls")
        );
        assert!(matches!(locate(&sb, "/bin/ls"), ProgramSite::Outside(_)));
        assert_eq!(
            locate(&sb, "./test.sh"),
            ProgramSite::Workspace("./test.sh".into())
        );
        assert_eq!(locate(&sb, "bin/x"), ProgramSite::Workspace("bin/x".into()));
        let inside = dir.path().join("x").to_string_lossy().into_owned();
        assert_eq!(locate(&sb, &inside), ProgramSite::Workspace(inside.clone()));
        assert_eq!(locate(&sb, "no-such-program-anywhere"), ProgramSite::Other);
        assert_eq!(locate(&sb, "../../bin/sh"), ProgramSite::Other);
        assert_eq!(locate(&sb, "/opt/monad-none/x"), ProgramSite::Other);
        assert_eq!(locate(&sb, ".."), ProgramSite::Other);
        // A workspace toolchain directory that holds the name comes first, executable or not.
        executable(&dir.path().join("node_modules/.bin/ls"));
        let ls = locate(&sb, "ls");
        assert_eq!(ls, ProgramSite::Workspace("node_modules/.bin/ls".into()));
        assert!(
            ls.shown()
                .starts_with("node_modules/.bin/ls in this folder"),
            "{}",
            ls.shown()
        );
        std::fs::create_dir_all(dir.path().join(".venv/bin")).unwrap();
        std::fs::write(dir.path().join(".venv/bin/cat"), "").unwrap();
        assert_eq!(
            locate(&sb, "cat"),
            ProgramSite::Workspace(".venv/bin/cat".into())
        );
    }

    #[test]
    fn a_directory_commands_may_write_is_never_outside() {
        let dir = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        executable(&tools.path().join("ls"));
        let exec = ExecPolicy {
            extra_write_paths: vec![tools.path().to_path_buf()],
            path_env: format!("{}:/usr/bin:/bin", tools.path().display()),
            ..ExecPolicy::default()
        };
        let sb = sandbox(dir.path(), exec);
        assert_eq!(locate(&sb, "ls"), ProgramSite::Other);
        let absolute = tools.path().join("ls").to_string_lossy().into_owned();
        assert_eq!(locate(&sb, &absolute), ProgramSite::Other);
        // Not there: the next directory decides.
        assert!(matches!(locate(&sb, "cat"), ProgramSite::Outside(_)));
    }
}
