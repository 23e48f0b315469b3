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
//!   workspace nor writable) makes it [`ProgramSite::Outside`], or [`ProgramSite::Shared`] when
//!   a user other than this one and root can change it or a directory on its way.
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

/// What the names a command runs are found among, as far as a call can change it: the `PATH`
/// commands get, and every entry of its directories in the workspace, where commands may write
/// or where other users may ([`changeable_by`]) (its name, and the inode, size, times and mode of what it is or, through a link
/// wherever it leads, of the file it leads to). A rule for one command keeps it
/// ([`crate::approval::Rule::Command`]): "always" on `sh -c 'make test'` does not cover a `make`
/// an agent put first in the `PATH` later, nor a program of `node_modules/.bin` written over
/// since.
///
/// What the command itself opens (a script it is given, a Makefile) cannot be pinned so; the
/// owner is told that "always" covers whatever those hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Lookup {
    /// The directories of the `PATH` a call can change, in its order, as shown to the owner
    /// (relative to the root for the workspace's).
    pub changeable: Vec<String>,
    /// SHA-256 of the `PATH` and of those directories' entries; random when one holds more
    /// than [`Lookup::MAX_ENTRIES`], so that the rule is never met again.
    digest: [u8; 32],
    /// True when a directory was too large to pin (see `digest`).
    pub too_large: bool,
}

impl Lookup {
    /// The most entries read in one changeable directory to pin a lookup.
    pub const MAX_ENTRIES: usize = 20_000;

    /// The changeable directories, each in backticks, escaped (safe to print).
    pub fn shown_dirs(&self) -> String {
        let dirs: Vec<_> = self
            .changeable
            .iter()
            .map(|d| format!("`{}`", printable_name(d)))
            .collect();
        dirs.join(", ")
    }
}

/// How names are looked up for a command in `sandbox` now ([`Lookup`]).
pub fn lookup(sandbox: &Sandbox) -> Lookup {
    use ring::digest::{Context, SHA256};
    let places = Places::of(sandbox);
    let me = nix::unistd::geteuid().as_raw();
    let (path_env, _) = command_path(sandbox.jail(), sandbox.exec_policy());
    let mut digest = Context::new(&SHA256);
    digest.update(path_env.as_bytes());
    let mut changeable = Vec::new();
    let mut entries = Vec::new();
    let mut over = false;
    for dir in path_env
        .split(':')
        .map(Path::new)
        .filter(|d| d.is_absolute())
    {
        let listed = if let Ok(rel) = dir.strip_prefix(&places.root) {
            changeable.push(rel.to_string_lossy().into_owned());
            // Listed through the jail: a link on the directory's way is followed only inside
            // the workspace.
            let rel = if rel.as_os_str().is_empty() {
                Path::new(".")
            } else {
                rel
            };
            entries_of(sandbox.jail().dir(), rel, dir, &mut entries)
        } else if places.writable(dir) || dir.ancestors().any(|d| changeable_by(d, me).is_some()) {
            changeable.push(dir.to_string_lossy().into_owned());
            Dir::open_ambient_dir(dir, ambient_authority()).map_or(Listed::Missing, |handle| {
                entries_of(&handle, Path::new("."), dir, &mut entries)
            })
        } else {
            continue;
        };
        digest.update(&[0, listed as u8]);
        for entry in entries.drain(..) {
            digest.update(&entry);
        }
        if listed == Listed::TooMany {
            over = true;
        }
    }
    let mut pin = [0u8; 32];
    if over {
        // Never the same twice: the rule that keeps it is never met again.
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut pin);
    } else {
        pin.copy_from_slice(digest.finish().as_ref());
    }
    Lookup {
        changeable,
        digest: pin,
        too_large: over,
    }
}

/// How a directory of the `PATH` was read for a [`Lookup`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Listed {
    Read = 1,
    Missing = 2,
    TooMany = 3,
}

/// Appends to `out`, sorted by name, one record for each entry of `dir` in `base` (`absolute`
/// on the system): its name and what it is, followed through links as running it would, by its
/// absolute path (a link in `node_modules/.bin` may lead anywhere: to a script of the folder's,
/// to `~/.local/pipx/...`); a link that leads nowhere, as itself.
fn entries_of(base: &Dir, dir: &Path, absolute: &Path, out: &mut Vec<Vec<u8>>) -> Listed {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let Ok(read) = base.read_dir(dir) else {
        return Listed::Missing;
    };
    for entry in read {
        if out.len() >= Lookup::MAX_ENTRIES {
            return Listed::TooMany;
        }
        let Ok(entry) = entry else {
            continue;
        };
        let name = entry.file_name();
        let mut record = name.as_bytes().to_vec();
        record.push(0);
        let path = absolute.join(&name);
        let meta = std::fs::metadata(&path).or_else(|_| std::fs::symlink_metadata(&path));
        match meta {
            Ok(m) => {
                for n in [
                    m.dev(),
                    m.ino(),
                    m.size(),
                    u64::from(m.mode()),
                    m.mtime() as u64,
                    m.mtime_nsec() as u64,
                    m.ctime() as u64,
                    m.ctime_nsec() as u64,
                ] {
                    record.extend_from_slice(&n.to_le_bytes());
                }
            }
            Err(_) => record.push(0xff),
        }
        out.push(record);
    }
    out.sort_unstable();
    Listed::Read
}

/// Where a command runs and what it runs, as far as "always" is concerned: what a rule for one
/// command keeps, and what is looked at again once its owner has answered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandPlace {
    /// Where its program (`argv[0]`) is found ([`locate`]).
    pub site: ProgramSite,
    /// Where its directory really is, when a link on its `cwd`'s way makes it another place
    /// ([`Sandbox::directory_elsewhere`]).
    pub runs_in: Option<String>,
    /// How the names it runs are found ([`lookup`]).
    pub lookup: Lookup,
}

/// Where a command's program is found, as far as "always" is concerned.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub enum ProgramSite {
    /// Found at this path, in a directory commands may read but not write, outside the
    /// workspace: no call can change what it is.
    Outside(String),
    /// In the workspace, at this path (as given, or where a name was found: its toolchain
    /// directories, `.venv/bin`, `node_modules/.bin`, ..., relative to the root). A call that
    /// writes files can change what it does.
    Workspace(String),
    /// Found at this path (the first field), outside the workspace in a directory commands may
    /// read but not write, where someone other than this user and root can change what it is
    /// (the second field says who and where, escaped): no call can, but "always" covers
    /// whatever it holds when it runs.
    Shared(String, String),
    /// Anywhere else, or not known: a directory commands may write, a path the sandbox cannot
    /// run, a program not found.
    #[default]
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
            ProgramSite::Shared(path, who) => format!(
                "{}, which others can change ({who}), so it runs whatever that file holds then",
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
    /// and the file its links end at are beneath directories commands may read and not write,
    /// [`ProgramSite::Shared`] when another user can change one of them ([`changeable_by`]).
    fn outside(&self, path: &Path) -> ProgramSite {
        if self.writable(path) || !self.readable(path) {
            return ProgramSite::Other;
        }
        // The operator's directories, not the workspace: their links are followed by the
        // system, as `exec` would.
        match std::fs::canonicalize(path) {
            Ok(real) if !self.writable(&real) && self.readable(&real) => {
                let shown = path.to_string_lossy().into_owned();
                let me = nix::unistd::geteuid().as_raw();
                let places = real.ancestors().chain(path.ancestors().skip(1));
                match places.filter_map(|p| changeable_by(p, me)).next() {
                    Some(who) => ProgramSite::Shared(shown, who),
                    None => ProgramSite::Outside(shown),
                }
            }
            _ => ProgramSite::Other,
        }
    }
}

/// Who other than the user `me` and root can change what `place` is, in words (escaped), or
/// `None`: its owner, when another user; every user, when it is writable by all, or its group
/// (but root's), when by its group, and it is a file or a directory without the sticky bit (in
/// one with it, only an entry's owner may replace it, and the entry is looked at in turn). A
/// program found so can be rewritten by someone the folder's owner never approved, so "always"
/// on it is said to cover whatever it holds ([`ProgramSite::Shared`]). Followed through links:
/// `place` is the file a program's path leads to, or a directory on its way.
fn changeable_by(place: &Path, me: u32) -> Option<String> {
    changeable_by_any_but(place, me, private_group(me))
}

/// [`changeable_by`], with `own_group` (the user's private group: [`private_group`]) taken as
/// the user's own, as root's group is.
fn changeable_by_any_but(place: &Path, me: u32, own_group: Option<u32>) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(place).ok()?;
    let shown = printable_name(&place.to_string_lossy()).into_owned();
    let sticky = meta.is_dir() && meta.mode() & 0o1000 != 0;
    if meta.uid() != 0 && meta.uid() != me {
        Some(format!("`{shown}` belongs to user {}", meta.uid()))
    } else if meta.mode() & 0o002 != 0 && !sticky {
        Some(format!("every user may write `{shown}`"))
    } else if meta.mode() & 0o020 != 0
        && !sticky
        && meta.gid() != 0
        && Some(meta.gid()) != own_group
    {
        Some(format!("group {} may write `{shown}`", meta.gid()))
    } else {
        None
    }
}

/// The group of user `uid` alone, when it has one: its primary group, named as the user, with
/// no other member listed. Debian, Ubuntu and Fedora make one for every user (user private
/// groups) with a umask of 002, so that a user's own programs are writable by their group:
/// a group no one else is in, which gives no one else anything. Looked up once per process.
fn private_group(uid: u32) -> Option<u32> {
    use nix::unistd::{Group, Uid, User};
    static FOUND: std::sync::OnceLock<(u32, Option<u32>)> = std::sync::OnceLock::new();
    let look_up = || {
        let user = User::from_uid(Uid::from_raw(uid)).ok()??;
        let group = Group::from_gid(user.gid).ok()??;
        let listed_alone = group.name == user.name && group.mem.iter().all(|m| *m == user.name);
        // `/etc/group` lists a group's secondary members only: a user whose primary group it
        // is (`useradd -g alice bob`) is in it too. Only the passwd file can say so; names a
        // directory service adds are not enumerated, and are not looked for.
        (listed_alone && !primary_of_another(group.gid.as_raw(), uid)).then_some(group.gid.as_raw())
    };
    match FOUND.get_or_init(|| (uid, look_up())) {
        (found_for, group) if *found_for == uid => *group,
        _ => look_up(),
    }
}

/// Whether `/etc/passwd` names a user other than `uid` whose primary group is `gid`; true
/// when it cannot be read (the group is then not taken as the user's alone).
fn primary_of_another(gid: u32, uid: u32) -> bool {
    let Ok(passwd) = std::fs::read_to_string("/etc/passwd") else {
        return true;
    };
    passwd.lines().any(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        matches!(
            (fields.get(2).and_then(|u| u.parse::<u32>().ok()), fields.get(3).and_then(|g| g.parse::<u32>().ok())),
            (Some(u), Some(g)) if g == gid && u != uid
        )
    })
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

    /// Under user private groups (a umask of 002), a user's own programs are writable by a
    /// group only they are in: that said "group 1000 may write" of every one, and narrowed
    /// "always" on them for nothing. Another group's write bit still counts.
    #[test]
    fn a_users_own_private_group_is_not_others() {
        // root's group is named as root and has no other member.
        assert_eq!(private_group(0), Some(0));
        // A group another user has as primary (in /etc/passwd, not in /etc/group's member
        // list) is not one's own: root's group, seen from another uid.
        assert!(primary_of_another(0, 54_321));
        assert!(!primary_of_another(0, 0));
        let dir = tempfile::tempdir().unwrap();
        let tool = dir.path().join("tool");
        executable(&tool);
        std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o775))
            .unwrap();
        std::os::unix::fs::chown(&tool, Some(0), Some(4_321)).unwrap();
        assert_eq!(changeable_by_any_but(&tool, 0, Some(4_321)), None);
        let said = changeable_by_any_but(&tool, 0, Some(4_322)).unwrap();
        assert!(said.starts_with("group 4321 may write"), "{said}");
        assert!(changeable_by_any_but(&tool, 0, None).is_some());
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

    /// A `PATH` directory of the folder's too large to read whole is not pinned: each lookup is
    /// another, so that "always" on a command there is asked about again rather than covering
    /// what was not read.
    #[test]
    fn a_path_directory_too_large_to_read_is_never_the_same_twice() {
        let dir = tempfile::tempdir().unwrap();
        let sb = sandbox(dir.path(), ExecPolicy::default());
        let bin = dir.path().join("node_modules/.bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("tool"), "").unwrap();
        let first = lookup(&sb);
        assert!(!first.too_large);
        assert_eq!(first.changeable, ["node_modules/.bin"]);
        assert_eq!(lookup(&sb), first);
        for i in 0..Lookup::MAX_ENTRIES {
            std::fs::write(bin.join(format!("t{i}")), "").unwrap();
        }
        let large = lookup(&sb);
        assert!(large.too_large);
        assert_ne!(lookup(&sb), large);
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

    /// Regression: a program in a directory commands may only read, but that another user may
    /// write (or that belongs to one), was [`ProgramSite::Outside`]: "always" on it covered
    /// whatever that user put there next, and said nothing of it. Now it is
    /// [`ProgramSite::Shared`], the prompt says who can change it, and such a `PATH` directory
    /// is pinned as the workspace's are.
    #[test]
    fn a_program_another_user_can_change_is_said_to_be_so() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let tool = tools.path().join("tool");
        executable(&tool);
        let exec = ExecPolicy {
            extra_read_paths: vec![tools.path().to_path_buf()],
            path_env: format!("{}:/usr/bin:/bin", tools.path().display()),
            ..ExecPolicy::default()
        };
        let sb = sandbox(dir.path(), exec);
        let mode = |path: &Path, mode: u32| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        let absolute = tool.to_string_lossy().into_owned();
        assert_eq!(locate(&sb, "tool"), ProgramSite::Outside(absolute.clone()));
        assert!(lookup(&sb).changeable.is_empty());

        // Anyone may write its directory.
        mode(tools.path(), 0o777);
        let site = locate(&sb, "tool");
        let ProgramSite::Shared(path, who) = &site else {
            panic!("{site:?}")
        };
        assert_eq!(path, &absolute);
        assert!(who.starts_with("every user may write `"), "{who}");
        assert!(
            site.shown().contains("which others can change"),
            "{}",
            site.shown()
        );
        assert_eq!(locate(&sb, &absolute), site, "by its path too");
        let pinned = lookup(&sb);
        assert_eq!(pinned.changeable, [tools.path().to_string_lossy()]);
        std::fs::write(tools.path().join("cat"), "").unwrap();
        assert_ne!(
            lookup(&sb),
            pinned,
            "a program put first in the PATH is a new lookup"
        );
        std::fs::remove_file(tools.path().join("cat")).unwrap();

        // With the sticky bit, only the entry's owner (root here) may replace it.
        mode(tools.path(), 0o1777);
        assert_eq!(locate(&sb, "tool"), ProgramSite::Outside(absolute.clone()));
        // Its group may write it (not root's group).
        mode(tools.path(), 0o755);
        mode(&tool, 0o775);
        std::os::unix::fs::chown(&tool, None, Some(4_321)).unwrap();
        let site = locate(&sb, "tool");
        assert!(
            matches!(&site, ProgramSite::Shared(_, who) if who.starts_with("group 4321 may write")),
            "{site:?}"
        );
        // Another user owns it.
        mode(&tool, 0o755);
        std::os::unix::fs::chown(&tool, Some(4_321), Some(0)).unwrap();
        let site = locate(&sb, "tool");
        assert!(
            matches!(&site, ProgramSite::Shared(_, who) if who.ends_with("belongs to user 4321")),
            "{site:?}"
        );
        // "always" on it is one command, said to cover whatever the file holds.
        let rule = crate::approval::Rule::of(
            monad_protocol::tools::ToolName::RunCommand,
            &serde_json::json!({"argv": ["tool"]}),
            &CommandPlace {
                site,
                runs_in: None,
                lookup: lookup(&sb),
            },
        );
        let said = rule.describe();
        assert!(
            said.starts_with("exactly this command")
                && said.contains("others can change that file")
                && said.contains("covers whatever it holds when it runs"),
            "{said}"
        );

        // A PATH directory whose parent others may write (they can put another in its place)
        // is pinned too, even while it does not exist.
        let parent = tempfile::tempdir().unwrap();
        mode(parent.path(), 0o777);
        let exec = ExecPolicy {
            extra_read_paths: vec![parent.path().to_path_buf()],
            path_env: format!("{}/bin:/usr/bin:/bin", parent.path().display()),
            ..ExecPolicy::default()
        };
        let sb = sandbox(dir.path(), exec);
        let before = lookup(&sb);
        assert_eq!(
            before.changeable,
            [parent.path().join("bin").to_string_lossy()]
        );
        executable(&parent.path().join("bin/make"));
        assert_ne!(
            lookup(&sb),
            before,
            "a make put first in the PATH is a new lookup"
        );
    }
}
