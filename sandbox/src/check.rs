//! [`Sandbox::check`]: whether a call can run at all, answered before anyone is asked to approve
//! it.
//!
//! A prompt for a call that cannot run wastes the user's attention and teaches them to answer
//! without reading. So before a restricted workspace asks, the call's arguments are parsed into
//! their typed form (which refuses unknown fields and wrong types) and checked through the jail:
//! the paths exist (or, for a write, can be written), an edit's `old_string` occurs exactly as
//! required, a command's working directory exists and its program exists and is executable
//! where the sandbox can run it. Checking changes nothing and is cheap: a few `stat`s through
//! directory handles (and, for writes and edits, reading the file the preview diffs).
//!
//! A command's program is looked up the way the sandbox will run it, through directory handles
//! only: a name without `/` in each directory of the sandbox's `PATH`
//! ([`ExecPolicy::path_env`](crate::ExecPolicy::path_env)); a relative path through the jail
//! from `cwd`; an absolute path inside the workspace through the jail; any other absolute path
//! only beneath the directories commands may read ([`SYSTEM_READ_DIRS`],
//! [`ExecPolicy::extra_read_paths`](crate::ExecPolicy::extra_read_paths), and the writable
//! [`ExecPolicy::extra_write_paths`](crate::ExecPolicy::extra_write_paths)). Those directories
//! come from the operator and are opened with [`Dir::open_ambient_dir`]; the program's path is
//! then walked one component at a time relative to such a handle, and symbolic links on the way
//! (`/bin/python3 -> python3.12`, `/usr/bin/awk -> /etc/alternatives/awk`, a virtualenv's
//! `bin/python -> /usr/bin/python3`) are followed by hand, each target again only beneath one
//! of those directories. No path from a tool argument is ever handed to `std::fs`.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use cap_std::ambient_authority;
use cap_std::fs::{Dir, PermissionsExt};
use monad_protocol::ToolName;
use monad_protocol::tools::{
    GlobArgs, ListDirArgs, ProcessKillArgs, ProcessListArgs, ProcessReadArgs, ProcessWriteArgs,
    ReadFileArgs, RunCommandArgs, SearchArgs, StatArgs,
};
use serde::de::DeserializeOwned;

use crate::exec::SYSTEM_READ_DIRS;
use crate::{Sandbox, SandboxError};

/// Symbolic links followed at most while looking up a program (the kernel's own limit).
const MAX_LINKS: usize = 40;

impl Sandbox {
    /// Checks that `tool` with `args` can run here, without running it or changing anything:
    /// the arguments parse into the tool's typed arguments, and what they name exists and is
    /// usable through the jail (see the module documentation). The error is the one the call
    /// itself would fail with (`invalid_arguments`, `not_found`, `no_match`,
    /// `outside_workspace`, `wrong_file_type`, ...).
    pub fn check(&self, tool: ToolName, args: &serde_json::Value) -> Result<(), SandboxError> {
        match tool {
            ToolName::ReadFile => {
                let args: ReadFileArgs = parse(tool, args)?;
                crate::fs::open_for_read(&self.jail, &args).map(drop)
            }
            ToolName::ListDir => {
                let args: ListDirArgs = parse(tool, args)?;
                crate::fs::open_for_list(&self.jail, &self.limits, &args).map(drop)
            }
            ToolName::Stat => {
                let args: StatArgs = parse(tool, args)?;
                let path = self.jail.resolve(&args.path)?;
                self.jail
                    .dir()
                    .symlink_metadata(path.rel())
                    .map(drop)
                    .map_err(|e| SandboxError::from_io("stat", path.given(), e))
            }
            ToolName::Search => {
                let args: SearchArgs = parse(tool, args)?;
                if args.max_results == Some(0) {
                    return Err(SandboxError::InvalidArguments(
                        "`max_results` must be at least 1".into(),
                    ));
                }
                crate::walk::matcher(&args)?;
                if let Some(glob) = &args.glob {
                    ignore::overrides::OverrideBuilder::new("/")
                        .add(glob)
                        .map_err(crate::walk::invalid_glob)?;
                }
                self.check_exists(args.path.as_deref())
            }
            ToolName::Glob => {
                let args: GlobArgs = parse(tool, args)?;
                globset::GlobBuilder::new(&args.pattern)
                    .literal_separator(true)
                    .build()
                    .map_err(crate::walk::invalid_glob)?;
                self.check_exists(args.path.as_deref())
            }
            ToolName::WriteFile | ToolName::EditFile => {
                crate::fs::check_write(&self.jail, &self.limits, tool, args)
            }
            ToolName::RunCommand => {
                let args: RunCommandArgs = parse(tool, args)?;
                self.check_command(&args)
            }
            // The process tools name a process this workspace keeps, in a state they can act
            // on (the same checks as the calls themselves).
            ToolName::ProcessRead => {
                let args: ProcessReadArgs = parse(tool, args)?;
                self.processes.check_exists(&args.process)
            }
            ToolName::ProcessWrite => {
                let args: ProcessWriteArgs = parse(tool, args)?;
                self.processes.check_writable(&args.process)
            }
            ToolName::ProcessKill => {
                let args: ProcessKillArgs = parse(tool, args)?;
                crate::exec::parse_signal(args.signal.as_deref())?;
                self.processes.check_running(&args.process)
            }
            ToolName::ProcessList => parse::<ProcessListArgs>(tool, args).map(drop),
            ToolName::Workspaces | ToolName::MemoryStore | ToolName::MemoryRecall => {
                Err(SandboxError::InvalidArguments(format!(
                    "`{tool}` is a session tool, not a workspace tool"
                )))
            }
        }
    }

    /// [`Sandbox::check`] from async code. On a root on a local disk the check runs right here:
    /// it is a few `stat`s and opens, which take microseconds, less than the two thread
    /// hand-offs of tokio's blocking pool (see [`Sandbox::call`] on small reads). Writes and
    /// edits (which read the file they replace), checks of a call whose `path` or `cwd` goes
    /// into a mount inside the root ([`Sandbox::beyond_a_mount`]), and every check of a root
    /// elsewhere (NFS, SMB, FUSE, ...), run on the blocking pool.
    pub async fn check_async(
        self: &Arc<Self>,
        tool: ToolName,
        args: &serde_json::Value,
    ) -> Result<(), SandboxError> {
        let reads_files = matches!(tool, ToolName::WriteFile | ToolName::EditFile);
        let beyond = || {
            ["path", "cwd"]
                .iter()
                .filter_map(|key| args.get(*key).and_then(serde_json::Value::as_str))
                .any(|path| self.beyond_a_mount(path))
        };
        if self.local_device.is_some() && !reads_files && !beyond() {
            return self.check(tool, args);
        }
        let this = Arc::clone(self);
        let args = args.clone();
        tokio::task::spawn_blocking(move || this.check(tool, &args))
            .await
            .map_err(|e| SandboxError::Io {
                op: "check",
                path: String::new(),
                source: std::io::Error::other(e.to_string()),
            })?
    }

    /// Whether `path` (the root when absent) exists inside the root.
    fn check_exists(&self, path: Option<&str>) -> Result<(), SandboxError> {
        let path = self.jail.resolve(path.unwrap_or(""))?;
        self.jail
            .dir()
            .metadata(path.rel())
            .map(drop)
            .map_err(|e| SandboxError::from_io("stat", path.given(), e))
    }

    fn check_command(&self, args: &RunCommandArgs) -> Result<(), SandboxError> {
        let validated = crate::exec::process::validate(args, &self.limits, &self.exec)?;
        if validated.background {
            self.processes.check_room()?;
        }
        let program = crate::exec::check_argv(&args.argv)?;
        let cwd = self.jail.resolve(args.cwd.as_deref().unwrap_or(""))?;
        self.jail.open_dir(&cwd)?;
        let lookup = Lookup::new(self);
        if !program.contains('/') {
            let (path_env, _) = crate::exec::command_path(&self.jail, &self.exec);
            for dir in path_env.split(':').filter(|d| d.starts_with('/')) {
                if lookup
                    .executable(&Path::new(dir).join(program), program)
                    .is_ok()
                {
                    return Ok(());
                }
            }
            return Err(SandboxError::NotFound(format!(
                "program `{}` is not found in the sandbox's PATH ({path_env}){}",
                crate::error::shown(program),
                crate::exec::lossy_hint(program)
            )));
        }
        let path = match crate::exec::program_path(&self.jail, &cwd, program)? {
            Some(inside) => self.jail.root_path().join(inside),
            None => PathBuf::from(program),
        };
        lookup.executable(&path, program)
    }
}

/// A tool's arguments as its type, or an argument error written for a model.
pub(crate) fn parse<A: DeserializeOwned>(
    tool: ToolName,
    args: &serde_json::Value,
) -> Result<A, SandboxError> {
    tool.decode_args_ref(args)
        .map_err(SandboxError::InvalidArguments)
}

/// The directories a command's program may be in, each as a handle: the workspace (through the
/// jail's own handle), then the operator's readable directories (opened when first needed).
struct Lookup<'a> {
    sandbox: &'a Sandbox,
    /// Operator-given directories commands may read and execute from.
    readable: Vec<PathBuf>,
}

impl<'a> Lookup<'a> {
    fn new(sandbox: &'a Sandbox) -> Lookup<'a> {
        let mut readable: Vec<PathBuf> = SYSTEM_READ_DIRS.iter().map(PathBuf::from).collect();
        readable.extend(sandbox.exec.extra_read_paths.iter().cloned());
        readable.extend(sandbox.exec.extra_write_paths.iter().cloned());
        Lookup { sandbox, readable }
    }

    /// The base that holds `path` (the deepest one) and its handle.
    fn base_of(&self, path: &Path) -> Result<Option<(PathBuf, Dir)>, SandboxError> {
        let root = self.sandbox.jail.root_path();
        if path.starts_with(root) {
            let dir = self
                .sandbox
                .jail
                .dir()
                .try_clone()
                .map_err(|e| SandboxError::from_io("open", &root.to_string_lossy(), e))?;
            return Ok(Some((root.to_path_buf(), dir)));
        }
        let Some(base) = self
            .readable
            .iter()
            .filter(|b| b.is_absolute() && path.starts_with(b))
            .max_by_key(|b| b.components().count())
        else {
            return Ok(None);
        };
        // Ambient authority on an operator-given directory, never on the tool's path.
        match Dir::open_ambient_dir(base, ambient_authority()) {
            Ok(dir) => Ok(Some((base.clone(), dir))),
            Err(_) => Ok(None),
        }
    }

    /// Whether `path` (absolute) names an executable regular file the sandbox can run: walked
    /// from a base's handle one component at a time, links followed by hand, and a `..` taken
    /// as the kernel takes it, from where the links before it led (the names walked hold none).
    fn executable(&self, path: &Path, given: &str) -> Result<(), SandboxError> {
        let not_found = || crate::exec::program_not_found(given);
        if !path.is_absolute() {
            return Err(not_found());
        }
        let mut path = path.to_path_buf();
        for _ in 0..MAX_LINKS {
            let Some((base, dir)) = self.base_of(&path)? else {
                return Err(not_found());
            };
            let rel = path.strip_prefix(&base).map_err(|_| not_found())?;
            let parts: Vec<Component<'_>> = rel.components().collect();
            let mut walked = PathBuf::new();
            let mut next = None;
            for (i, part) in parts.iter().enumerate() {
                let part = match part {
                    Component::Normal(name) => *name,
                    Component::ParentDir => {
                        if walked.pop() {
                            continue;
                        }
                        // Above the base: on from its parent, whichever base holds that.
                        next = Some(above_base(&base, &parts[i + 1..]));
                        break;
                    }
                    _ => continue,
                };
                let here = walked.join(part);
                let meta = match dir.symlink_metadata(&here) {
                    Ok(meta) => meta,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_found()),
                    Err(e) if e.raw_os_error() == Some(nix::libc::ENOTDIR) => {
                        return Err(not_found());
                    }
                    Err(e) => return Err(SandboxError::from_io("look up", given, e)),
                };
                let last = i + 1 == parts.len();
                if meta.file_type().is_symlink() {
                    let target = dir
                        .read_link_contents(&here)
                        .map_err(|e| SandboxError::from_io("look up", given, e))?;
                    let rest: PathBuf = parts[i + 1..].iter().collect();
                    // Not folded: a `..` in it climbs from where a link before it leads.
                    next = Some(if target.is_absolute() {
                        target.join(rest)
                    } else {
                        base.join(&walked).join(target).join(rest)
                    });
                    break;
                }
                if !last {
                    if !meta.is_dir() {
                        return Err(not_found());
                    }
                    walked = here;
                    continue;
                }
                if meta.is_dir() {
                    return Err(SandboxError::WrongFileType {
                        path: given.to_owned(),
                        what: "is a directory, not a program",
                    });
                }
                if !meta.is_file() {
                    return Err(SandboxError::WrongFileType {
                        path: given.to_owned(),
                        what: "is not a regular file",
                    });
                }
                if meta.permissions().mode() & 0o111 == 0 {
                    return Err(SandboxError::WrongFileType {
                        path: given.to_owned(),
                        what: "is not executable (no execute permission)",
                    });
                }
                return Ok(());
            }
            match next {
                Some(resolved) => path = resolved,
                // The path is a base directory itself.
                None => {
                    return Err(SandboxError::WrongFileType {
                        path: given.to_owned(),
                        what: "is a directory, not a program",
                    });
                }
            }
        }
        Err(SandboxError::LinkLoop(given.to_owned()))
    }
}

/// Where a path that climbs above `base` by a `..` goes on, `rest` the components after that
/// `..`: from `base`'s parent, the `..`s that lead `rest` climbing `base`'s own path as text (the
/// root's path is canonical; an operator's directory is taken as given).
fn above_base(base: &Path, rest: &[Component<'_>]) -> PathBuf {
    let mut above = base.parent().unwrap_or(base).to_path_buf();
    let mut rest = rest.iter().peekable();
    while let Some(c) = rest.next_if(|c| matches!(c, Component::ParentDir | Component::CurDir)) {
        if *c == Component::ParentDir {
            above.pop();
        }
    }
    above.join(rest.collect::<PathBuf>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ExecPolicy, Limits};
    use serde_json::json;

    #[test]
    fn a_climb_above_a_base_goes_on_from_its_parent_and_stops_at_the_root() {
        let rest = |s: &'static str| Path::new(s).components().collect::<Vec<_>>();
        let root = Path::new("/w/root");
        assert_eq!(above_base(root, &rest("x")), PathBuf::from("/w/x"));
        assert_eq!(
            above_base(root, &rest("../.././usr/bin")),
            PathBuf::from("/usr/bin")
        );
        assert_eq!(
            above_base(Path::new("/"), &rest("../x")),
            PathBuf::from("/x")
        );
    }

    fn sandbox(files: &[(&str, &str, u32)]) -> (tempfile::TempDir, Sandbox) {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        for (path, content, mode) in files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, content).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(*mode)).unwrap();
        }
        let sandbox = Sandbox::open(dir.path(), Limits::default(), ExecPolicy::default()).unwrap();
        (dir, sandbox)
    }

    fn code(result: Result<(), SandboxError>) -> Option<monad_protocol::ErrorCode> {
        result.err().map(|e| e.code())
    }

    #[test]
    fn programs_are_found_in_path_in_the_workspace_and_through_links() {
        use monad_protocol::ErrorCode::*;
        let (dir, sb) = sandbox(&[("bin/tool", "#!/bin/sh\n", 0o755), ("data.txt", "", 0o644)]);
        std::os::unix::fs::symlink("/bin/sh", dir.path().join("bin/shell")).unwrap();
        std::os::unix::fs::symlink("tool", dir.path().join("bin/alias")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("bin/passwd")).unwrap();
        let run = |argv: serde_json::Value, cwd: Option<&str>| {
            code(sb.check(ToolName::RunCommand, &json!({"argv": argv, "cwd": cwd})))
        };
        assert_eq!(run(json!(["sh", "-c", "true"]), None), None);
        assert_eq!(run(json!(["/bin/sh"]), None), None);
        assert_eq!(run(json!(["/usr/bin/env"]), None), None);
        assert_eq!(run(json!(["./bin/tool"]), None), None);
        assert_eq!(run(json!(["./tool"]), Some("bin")), None);
        assert_eq!(run(json!(["bin/alias"]), None), None);
        assert_eq!(
            run(json!(["bin/shell"]), None),
            None,
            "a link out to /bin/sh"
        );
        let absolute = dir.path().join("bin/tool").to_string_lossy().into_owned();
        assert_eq!(run(json!([absolute]), None), None);
        assert_eq!(
            run(json!(["no-such-program-anywhere"]), None),
            Some(NotFound)
        );
        assert_eq!(run(json!(["./missing"]), None), Some(NotFound));
        assert_eq!(run(json!(["/opt/monad-none/x"]), None), Some(NotFound));
        assert_eq!(
            run(json!(["/home"]), None),
            Some(NotFound),
            "not a readable dir"
        );
        assert_eq!(run(json!(["./data.txt"]), None), Some(WrongFileType));
        assert_eq!(run(json!(["bin/passwd"]), None), Some(WrongFileType));
        assert_eq!(run(json!(["/usr/bin"]), None), Some(WrongFileType));
        assert_eq!(run(json!(["../../bin/sh"]), None), Some(OutsideWorkspace));
        assert_eq!(run(json!(["true"]), Some("missing")), Some(NotFound));
        assert_eq!(run(json!([]), None), Some(InvalidArguments));
        assert_eq!(run(json!([""]), None), Some(InvalidArguments));
        assert_eq!(run(json!(["tr\u{0}ue"]), None), Some(InvalidArguments));
    }

    #[test]
    fn a_link_loop_is_refused_not_followed_forever() {
        let (dir, sb) = sandbox(&[]);
        std::os::unix::fs::symlink("b", dir.path().join("a")).unwrap();
        std::os::unix::fs::symlink("a", dir.path().join("b")).unwrap();
        assert_eq!(
            code(sb.check(ToolName::RunCommand, &json!({"argv": ["./a"]}))),
            Some(monad_protocol::ErrorCode::WrongFileType)
        );
    }

    #[test]
    fn arguments_are_parsed_and_checked_per_tool() {
        use monad_protocol::ErrorCode::*;
        let (_dir, sb) = sandbox(&[("a.txt", "one one\n", 0o644)]);
        let check = |tool, args: serde_json::Value| code(sb.check(tool, &args));
        assert_eq!(check(ToolName::ReadFile, json!({"path": "a.txt"})), None);
        assert_eq!(check(ToolName::ReadFile, json!({})), Some(InvalidArguments));
        assert_eq!(
            check(ToolName::ReadFile, json!({"path": "a.txt", "x": 1})),
            Some(InvalidArguments)
        );
        assert_eq!(
            check(ToolName::ReadFile, json!({"path": "../a"})),
            Some(OutsideWorkspace)
        );
        assert_eq!(
            check(ToolName::Stat, json!({"path": "nope"})),
            Some(NotFound)
        );
        assert_eq!(
            check(ToolName::ListDir, json!({"depth": 0})),
            Some(InvalidArguments)
        );
        assert_eq!(
            check(ToolName::Search, json!({"pattern": "["})),
            Some(InvalidArguments)
        );
        assert_eq!(
            check(ToolName::Search, json!({"pattern": "a", "path": "nope"})),
            Some(NotFound)
        );
        assert_eq!(
            check(ToolName::Glob, json!({"pattern": "a{"})),
            Some(InvalidArguments)
        );
        assert_eq!(
            check(
                ToolName::EditFile,
                json!({"path": "a.txt", "old_string": "one", "new_string": "two"})
            ),
            Some(NoMatch)
        );
        assert_eq!(
            check(
                ToolName::EditFile,
                json!({"path": "a.txt", "old_string": "one", "new_string": "two", "replace_all": true})
            ),
            None
        );
        assert_eq!(
            check(
                ToolName::WriteFile,
                json!({"path": "new/b.txt", "content": "x", "create_parents": true})
            ),
            None
        );
        assert_eq!(
            check(
                ToolName::WriteFile,
                json!({"path": "new/b.txt", "content": "x"})
            ),
            None
        );
        assert_eq!(
            check(
                ToolName::WriteFile,
                json!({"path": "new/b.txt", "content": "x", "create_parents": false})
            ),
            Some(NotFound)
        );
        assert_eq!(
            check(ToolName::ProcessWrite, json!({"process": "p"})),
            Some(InvalidArguments)
        );
        assert_eq!(
            check(
                ToolName::ProcessKill,
                json!({"process": "p", "signal": "TERM"})
            ),
            Some(NotFound),
            "no such process"
        );
        assert_eq!(
            check(
                ToolName::ProcessKill,
                json!({"process": "p", "signal": "STOP"})
            ),
            Some(InvalidArguments)
        );
        assert_eq!(
            check(ToolName::MemoryStore, json!({})),
            Some(InvalidArguments)
        );
        assert!(
            !_dir.path().join("new").exists(),
            "checking creates nothing"
        );
    }
}
