//! One bound on the processes of all of a user's commands, whatever workspace runs them: a
//! cgroup with a `pids.max` per user.
//!
//! `RLIMIT_NPROC` (`[exec] max_processes`) counts per uid, and each primary workspace's commands
//! run as a user of their own, so it bounds one workspace: a user with many sessions could start
//! a thousand processes in each, take every process id of the host, and leave other users'
//! commands failing to `fork`. The pids controller counts every process and thread of a cgroup
//! and of the cgroups under it, whatever their uids, and a `fork` past its `pids.max` fails with
//! `EAGAIN` (moving a process in never fails).
//!
//! A server makes one directory of its own ([`ProcessGroups`], `monad-<pid>-<n>`) and one cgroup
//! in it per user whose commands run ([`ProcessGroup`], `user-<name>`). A command's supervisor
//! joins its user's cgroup first thing after `fork`, by writing `0` to the cgroup's
//! `cgroup.procs` (opened by the parent: see [`super::child`]), before it starts anything, so
//! that all the command starts is counted.
//!
//! Where the directory goes:
//! - cgroup v1 (a `pids` hierarchy mounted on its own): under the server's cgroup there.
//! - cgroup v2: under the server's cgroup, when the pids controller can be given to the cgroups
//!   under it, which needs it to hold no process (the root of a cgroup namespace, as in a
//!   container, may); else under a cgroup the operator names (`[server] process_cgroup`), such
//!   as a systemd service's with `Delegate=pids` and `DelegateSubgroup=` (the service's processes
//!   then live in the subgroup, and its own cgroup can have the controller enabled below it).
//!
//! Hand-written rather than with the `cgroups-rs` crate: it is a handful of reads and writes of
//! files, which that crate wraps in a few dozen modules and dependencies.

use std::collections::HashMap;
use std::fs;
use std::io::Write as _;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Which cgroup filesystem a directory is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    /// A `pids` hierarchy of cgroup v1.
    V1,
    /// The unified hierarchy.
    V2,
}

/// A server's directory of per-user process groups, each bounded to the same `pids.max`.
/// Dropped, it removes the groups that hold no process, and itself when it can.
#[derive(Debug)]
pub struct ProcessGroups {
    dir: PathBuf,
    version: Version,
    max_per_user: u64,
    users: Mutex<HashMap<String, Arc<ProcessGroup>>>,
}

/// One user's cgroup: the commands that join it share its `pids.max`.
#[derive(Debug)]
pub struct ProcessGroup {
    dir: PathBuf,
    /// Its `cgroup.procs`, open for writing (close-on-exec): a command's supervisor writes `0`
    /// to it to join.
    procs: OwnedFd,
    max: u64,
}

/// Numbers the directories of one process's [`ProcessGroups`] (a test process makes many).
static NEXT: AtomicU64 = AtomicU64::new(1);

/// The prefix of a server's directory: `monad-<pid>-<n>`.
const PREFIX: &str = "monad-";

impl ProcessGroups {
    /// Makes this server's directory of process groups, each user's bounded to `max_per_user`
    /// processes and threads, under `under` (a cgroup directory), or when `None` under the
    /// server's own cgroup of the pids controller. Directories left by servers that are gone
    /// are removed first. `Err` says why the bound cannot be had here, for the operator.
    pub fn create(max_per_user: u64, under: Option<&Path>) -> Result<ProcessGroups, String> {
        let (parent, version) = match under {
            Some(dir) => {
                let version = if dir.join("cgroup.subtree_control").exists() {
                    Version::V2
                } else if dir.join("cgroup.procs").exists() {
                    Version::V1
                } else {
                    return Err(format!("{} is not a cgroup directory", dir.display()));
                };
                (dir.to_path_buf(), version)
            }
            None => {
                let read = |path: &str| {
                    fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))
                };
                locate(&read("/proc/self/cgroup")?, &read("/proc/self/mountinfo")?)?
            }
        };
        sweep(&parent);
        if version == Version::V2 {
            give_pids_below(&parent).map_err(|e| {
                format!(
                    "the pids controller cannot be enabled for the cgroups under {} ({e}){}",
                    parent.display(),
                    if under.is_none() {
                        "; that is the server's own cgroup, which cannot have it while it holds \
                         the server's processes: name a cgroup for the commands in [server] \
                         process_cgroup (with systemd: `Delegate=pids` and \
                         `DelegateSubgroup=server` in the unit, and the unit's cgroup here)"
                    } else {
                        ""
                    }
                )
            })?;
        }
        let name = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let dir = parent.join(name);
        fs::create_dir(&dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        let groups = ProcessGroups {
            dir,
            version,
            max_per_user,
            users: Mutex::new(HashMap::new()),
        };
        if version == Version::V2 {
            give_pids_below(&groups.dir)
                .map_err(|e| format!("cannot enable pids in {}: {e}", groups.dir.display()))?;
        }
        Ok(groups)
    }

    /// This server's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The bound of each user's group.
    pub fn max_per_user(&self) -> u64 {
        self.max_per_user
    }

    /// `user`'s group, made on first use; later calls share it.
    pub fn for_user(&self, user: &str) -> std::io::Result<Arc<ProcessGroup>> {
        let mut users = self.users.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(group) = users.get(user) {
            return Ok(group.clone());
        }
        let name = group_name(user).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("the user name `{user}` is too long for a process group"),
            )
        })?;
        let dir = self.dir.join(name);
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        fs::write(dir.join("pids.max"), self.max_per_user.to_string())?;
        let procs = fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::libc::O_CLOEXEC)
            .open(dir.join("cgroup.procs"))?;
        let group = Arc::new(ProcessGroup {
            dir,
            procs: procs.into(),
            max: self.max_per_user,
        });
        users.insert(user.to_owned(), group.clone());
        Ok(group)
    }
}

impl Drop for ProcessGroups {
    fn drop(&mut self) {
        remove_tree(&self.dir);
        tracing::debug!(dir = %self.dir.display(), version = ?self.version, "process groups gone");
    }
}

impl ProcessGroup {
    /// The group's cgroup directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Processes and threads the group may have at once.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Processes and threads in the group now; `None` when the kernel's file cannot be read.
    pub fn current(&self) -> Option<u64> {
        fs::read_to_string(self.dir.join("pids.current"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// How many times a `fork` in the group failed at its bound (`pids.events`' `max`).
    pub(crate) fn refusals(&self) -> Option<u64> {
        let events = fs::read_to_string(self.dir.join("pids.events")).ok()?;
        events
            .lines()
            .find_map(|line| line.strip_prefix("max "))?
            .trim()
            .parse()
            .ok()
    }

    /// Its `cgroup.procs`, open for writing.
    pub(crate) fn procs(&self) -> RawFd {
        self.procs.as_raw_fd()
    }
}

/// The directory name of `user`'s group: `user-<name>` for a name of letters, digits, `.`, `_`
/// and `-` (as Monad's user names are), else `hex-` and the name's bytes in hex; `None` for a
/// name of more than 64 bytes.
fn group_name(user: &str) -> Option<String> {
    if user.len() > 64 {
        return None;
    }
    let plain = !user.is_empty()
        && user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    Some(if plain {
        format!("user-{user}")
    } else {
        let hex: String = user.bytes().map(|b| format!("{b:02x}")).collect();
        format!("hex-{hex}")
    })
}

/// Makes the pids controller available to the cgroups under `dir` (cgroup v2).
fn give_pids_below(dir: &Path) -> std::io::Result<()> {
    let control = dir.join("cgroup.subtree_control");
    let enabled = fs::read_to_string(&control)?;
    if enabled.split_whitespace().any(|c| c == "pids") {
        return Ok(());
    }
    let mut file = fs::OpenOptions::new().write(true).open(&control)?;
    file.write_all(b"+pids")
}

/// Removes `dir`'s sub-directories, then `dir`, where they hold no process (the kernel refuses
/// the others, which stay).
fn remove_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = fs::remove_dir(entry.path());
            }
        }
    }
    let _ = fs::remove_dir(dir);
}

/// Removes the directories under `parent` of servers whose process is gone (killed before they
/// could remove them).
fn sweep(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|n| n.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<i32>().ok())
        else {
            continue;
        };
        let gone = matches!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
            Err(nix::errno::Errno::ESRCH)
        );
        if gone {
            remove_tree(&entry.path());
        }
    }
}

/// Where this process's cgroup of the pids controller is, from `/proc/self/cgroup` and
/// `/proc/self/mountinfo`: a `pids` hierarchy of cgroup v1 if there is one, else the unified
/// hierarchy.
fn locate(cgroups: &str, mountinfo: &str) -> Result<(PathBuf, Version), String> {
    let entries = cgroups.lines().filter_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        Some((controllers, path))
    });
    let mut unified = None;
    for (controllers, path) in entries {
        if controllers.split(',').any(|c| c == "pids") {
            let mount = mount_of(mountinfo, |fs, options| {
                fs == "cgroup" && options.split(',').any(|o| o == "pids")
            })
            .ok_or("the pids hierarchy of cgroup v1 is not mounted")?;
            return Ok((within(&mount, path), Version::V1));
        }
        if controllers.is_empty() {
            unified = Some(path);
        }
    }
    let path = unified.ok_or("this process is in no cgroup of the pids controller")?;
    let mount = mount_of(mountinfo, |fs, _| fs == "cgroup2").ok_or("cgroup v2 is not mounted")?;
    let dir = within(&mount, path);
    let controllers = fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
    if !controllers.split_whitespace().any(|c| c == "pids") {
        return Err(format!(
            "the pids controller is not available in {} (cgroup v2)",
            dir.display()
        ));
    }
    Ok((dir, Version::V2))
}

/// A mount of the cgroup filesystems: the path of the hierarchy it shows, and where.
struct Mount {
    root: PathBuf,
    at: PathBuf,
}

/// The first mount in `mountinfo` whose filesystem type and super options pass `wanted`.
fn mount_of(mountinfo: &str, wanted: impl Fn(&str, &str) -> bool) -> Option<Mount> {
    mountinfo.lines().find_map(|line| {
        let (mount, filesystem) = line.split_once(" - ")?;
        let mut fields = mount.split(' ');
        let (root, at) = (fields.nth(3)?, fields.next()?);
        let mut filesystem = filesystem.split(' ');
        let (kind, options) = (filesystem.next()?, filesystem.nth(1).unwrap_or(""));
        wanted(kind, options).then(|| Mount {
            root: PathBuf::from(unescape(root)),
            at: PathBuf::from(unescape(at)),
        })
    })
}

/// `mountinfo`'s octal escapes (`\040` for a space) decoded.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|digits| {
            let text = std::str::from_utf8(digits).ok()?;
            u8::from_str_radix(text, 8).ok()
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The directory of cgroup `path` (as `/proc/self/cgroup` names it) under `mount`.
fn within(mount: &Mount, path: &str) -> PathBuf {
    let path = Path::new(path);
    let relative = path.strip_prefix(&mount.root).unwrap_or(path);
    mount
        .at
        .join(relative.strip_prefix("/").unwrap_or(relative))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTS_V1: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw";

    #[test]
    fn a_pids_hierarchy_of_cgroup_v1_is_found_before_the_unified_one() {
        let cgroups = "9:name=systemd:/\n8:pids:/user.slice/x\n4:memory:/m\n0::/u\n";
        let (dir, version) = locate(cgroups, MOUNTS_V1).unwrap();
        assert_eq!(
            (dir, version),
            (
                PathBuf::from("/sys/fs/cgroup/pids/user.slice/x"),
                Version::V1
            )
        );
        // Listed with other controllers, and mounted at a root of its own (a container's).
        let mounts = "39 31 0:36 /ctr /sys/fs/cgroup/cpu\\054pids rw - cgroup cgroup rw,cpu,pids";
        let (dir, _) = locate("3:cpu,pids:/ctr/job\n", mounts).unwrap();
        assert_eq!(dir, PathBuf::from("/sys/fs/cgroup/cpu,pids/job"));
        let err = locate("8:pids:/\n", "1 0 0:1 / / rw - ext4 /dev/vda rw").unwrap_err();
        assert!(err.contains("not mounted"), "{err}");
    }

    #[test]
    fn without_cgroup_v1_the_unified_hierarchy_needs_the_pids_controller() {
        let mounts = "30 23 0:27 / /nowhere/cgroup rw - cgroup2 cgroup2 rw";
        let err = locate("0::/system.slice/monad.service\n", mounts).unwrap_err();
        assert!(
            err.contains("/nowhere/cgroup/system.slice/monad.service") && err.contains("v2"),
            "{err}"
        );
        let err = locate("0::/\n", "1 0 0:1 / / rw - ext4 /dev/vda rw").unwrap_err();
        assert!(err.contains("not mounted"), "{err}");
        assert!(locate("", MOUNTS_V1).is_err());
    }

    #[test]
    fn a_user_name_becomes_a_directory_name_and_nothing_else() {
        assert_eq!(group_name("ben.o_k-1").unwrap(), "user-ben.o_k-1");
        for odd in ["", "../x", "a/b", "é"] {
            let name = group_name(odd).unwrap();
            assert!(name.starts_with("hex-") && !name.contains('/'), "{name}");
        }
        // Never the name of another user's group.
        assert_ne!(group_name("c3a9"), group_name("é"));
        assert_ne!(group_name(""), group_name("x"));
        assert_eq!(group_name(&"a".repeat(65)), None);
    }

    /// Makes groups under this process's own cgroup: `None` (said loudly) where that cannot
    /// be done, which is only when not running as root.
    fn groups(max: u64) -> Option<ProcessGroups> {
        match ProcessGroups::create(max, None) {
            Ok(groups) => Some(groups),
            Err(why) if !nix::unistd::geteuid().is_root() => {
                eprintln!("SKIPPED: process groups need root here: {why}");
                None
            }
            Err(why) => panic!("process groups as root: {why}"),
        }
    }

    #[test]
    fn a_users_group_is_bounded_and_the_directory_goes_with_its_server() {
        let Some(groups) = groups(77) else { return };
        let dir = groups.dir().to_path_buf();
        let ben = groups.for_user("ben").unwrap();
        assert!(Arc::ptr_eq(&ben, &groups.for_user("ben").unwrap()));
        assert_eq!(ben.dir(), dir.join("user-ben"));
        let max = fs::read_to_string(ben.dir().join("pids.max")).unwrap();
        assert_eq!(max.trim(), "77");
        assert_eq!(ben.current(), Some(0));
        assert_eq!(ben.refusals(), Some(0));
        drop(ben);
        drop(groups);
        assert!(!dir.exists(), "{} is left", dir.display());
    }

    #[test]
    fn the_directory_of_a_server_that_is_gone_is_swept_and_a_live_ones_is_not() {
        let Some(live) = groups(10) else { return };
        let parent = live.dir().parent().unwrap().to_path_buf();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let left = parent.join(format!("{PREFIX}{dead}-1"));
        fs::create_dir(&left).unwrap();
        fs::create_dir(left.join("user-ben")).unwrap();
        let again = groups(10).unwrap();
        assert!(!left.exists(), "{} was not swept", left.display());
        assert!(live.dir().exists() && again.dir().exists());
    }

    #[test]
    fn escapes_of_mountinfo_are_decoded() {
        assert_eq!(unescape("/a\\040b\\134c"), "/a b\\c");
        assert_eq!(unescape("/trailing\\04"), "/trailing\\04");
    }
}
