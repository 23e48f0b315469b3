//! Bounds on the processes, the memory and the processor time of all of a user's commands
//! together, whatever workspace runs them: cgroups per user, with a `pids.max`, a memory bound,
//! and a group of the `cpu` controller (an equal share per user, and a ceiling when asked).
//!
//! `RLIMIT_NPROC` (`[exec] max_processes`) counts per uid, and each primary workspace's commands
//! run as a user of their own, so it bounds one workspace: a user with many sessions could start
//! a thousand processes in each, take every process id of the host, and leave other users'
//! commands failing to `fork`; and nothing bounded their memory together. The pids controller
//! counts every process and thread of a cgroup and of the cgroups under it, whatever their uids,
//! and a `fork` past its `pids.max` fails with `EAGAIN` (moving a process in never fails); past
//! a memory bound the kernel reclaims, then kills the largest process in the cgroup.
//!
//! A server makes one directory of its own per hierarchy ([`ProcessGroups`],
//! `monad-<pid namespace>-<pid>-<n>`) and cgroups in it per user whose commands run
//! ([`ProcessGroup`], `user-<name>`, see `Member`). A command's supervisor joins its user's
//! process bound first thing after `fork`, before it starts anything, so that all the command
//! starts is counted; the command's own process joins the memory bound just before `exec`, so
//! that the kernel, out of memory there, kills a command, never a supervisor. Each joins by
//! writing `0` to a `cgroup.procs` the server opened (see [`super::child`]).
//!
//! Where the directory goes:
//! - cgroup v1 (a hierarchy per controller): under the server's cgroup in each.
//! - cgroup v2: under the server's cgroup, when the controllers can be given to the cgroups
//!   under it, which needs it to hold no process (only the hierarchy's real root is exempt);
//!   else under a cgroup the operator names (`[server] process_cgroup`), such as a systemd
//!   service's with `Delegate=pids memory cpu` and `DelegateSubgroup=` (the service's processes then
//!   live in the subgroup, and its own cgroup can have the controllers enabled below it).
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
    /// A hierarchy of cgroup v1 (one or a few controllers mounted on their own).
    V1,
    /// The unified hierarchy.
    V2,
}

/// A controller that bounds a user's commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Controller {
    /// Processes and threads (`pids.max`).
    Pids,
    /// Memory (`memory.max`; cgroup v1's `memory.limit_in_bytes`).
    Memory,
    /// Processor time: each user's group is one entity of equal weight to the scheduler (so a
    /// thousand busy processes of one user get the share one of another user gets), with a
    /// ceiling when asked (`cpu.max`; cgroup v1's `cpu.cfs_quota_us`).
    Cpu,
}

impl Controller {
    fn name(self) -> &'static str {
        match self {
            Controller::Pids => "pids",
            Controller::Memory => "memory",
            Controller::Cpu => "cpu",
        }
    }

    /// The file that holds its bound.
    fn limit_file(self, version: Version) -> &'static str {
        match (self, version) {
            (Controller::Pids, _) => "pids.max",
            (Controller::Memory, Version::V1) => "memory.limit_in_bytes",
            (Controller::Memory, Version::V2) => "memory.max",
            (Controller::Cpu, Version::V1) => "cpu.shares",
            (Controller::Cpu, Version::V2) => "cpu.weight",
        }
    }

    /// The setting that sets it, for messages.
    fn setting(self) -> &'static str {
        match self {
            Controller::Pids => "server.max_processes_per_user",
            Controller::Memory => "server.max_memory_per_user",
            Controller::Cpu => "server.max_cpu_percent_per_user",
        }
    }

    /// Why its bound cannot be had, for the operator.
    fn missing(self, why: &str) -> String {
        format!("{} ({}): {why}", self.setting(), self.name())
    }
}

/// What each user's commands may have at once, together; 0 leaves a bound out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bounds {
    /// Processes and threads.
    pub processes: u64,
    /// Bytes of memory (what the processes use, their shared memory and the page cache of the
    /// files they touch); past it the kernel reclaims, then kills one of the user's processes.
    pub memory_bytes: u64,
    /// Processor time: `None` leaves it to the scheduler's share per thread; `Some(0)` gives
    /// each user's commands together an equal share (one user's thousand busy processes get
    /// what another user's one does, when both want more than there is); `Some(percent)` the
    /// same with a ceiling, in percent of one CPU (150: one and a half).
    pub cpu_percent: Option<u64>,
}

impl Bounds {
    /// The controllers these bounds need, each with its bound (the processor's: its ceiling,
    /// 0 for none).
    fn wanted(self) -> Vec<(Controller, u64)> {
        let mut wanted: Vec<(Controller, u64)> = [
            (Controller::Pids, self.processes),
            (Controller::Memory, self.memory_bytes),
        ]
        .into_iter()
        .filter(|(_, bound)| *bound > 0)
        .collect();
        wanted.extend(self.cpu_percent.map(|percent| (Controller::Cpu, percent)));
        wanted
    }
}

/// The scheduler's period for a processor ceiling, in microseconds (the kernel's default).
const CPU_PERIOD_US: u64 = 100_000;

/// Sets a processor ceiling of `percent` of one CPU on cgroup `dir` (0: none).
fn limit_cpu(dir: &Path, version: Version, percent: u64) -> std::io::Result<()> {
    if percent == 0 {
        return Ok(());
    }
    // At least the kernel's smallest quota (1 ms a period).
    let quota = (percent.saturating_mul(CPU_PERIOD_US) / 100).max(1_000);
    match version {
        Version::V1 => {
            fs::write(dir.join("cpu.cfs_period_us"), CPU_PERIOD_US.to_string())?;
            fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string())
        }
        Version::V2 => fs::write(dir.join("cpu.max"), format!("{quota} {CPU_PERIOD_US}")),
    }
}

/// A server's directories of per-user groups (one per cgroup hierarchy its controllers are in:
/// one on cgroup v2, one per controller on cgroup v1). Dropped, it removes the groups that hold
/// no process, and its directories when it can.
#[derive(Debug)]
pub struct ProcessGroups {
    trees: Vec<Tree>,
    /// The bounds that could not be had, each with why (for the operator).
    missing: Vec<String>,
    users: Mutex<HashMap<String, Arc<ProcessGroup>>>,
}

/// This server's directory in one hierarchy, and the controllers it bounds there.
#[derive(Debug)]
struct Tree {
    dir: PathBuf,
    version: Version,
    controllers: Vec<(Controller, u64)>,
}

/// One user's cgroups: the commands that join them share their bounds.
#[derive(Debug)]
pub struct ProcessGroup {
    /// One per hierarchy.
    members: Vec<Member>,
}

/// A user's cgroups in one hierarchy: `user-<name>`, which holds the process bound, and, when
/// the hierarchy has both controllers, `user-<name>/tree` (the supervisors and inits) and
/// `user-<name>/command` (the commands, which hold the memory bound).
///
/// A command's supervisor and init are copies of the server's memory, charged to the server:
/// in the cgroup whose memory runs out they would count as large, and the kernel, which kills
/// the largest process there, would kill a supervisor (and so another command of the user)
/// rather than the command that took the memory. So the supervisor joins the process bound
/// first thing, and the command's own process joins the memory bound just before `exec`.
#[derive(Debug)]
struct Member {
    /// `user-<name>`.
    dir: PathBuf,
    version: Version,
    controllers: Vec<(Controller, u64)>,
    /// The directory whose `memory.events` (or `memory.oom_control`) counts the kills.
    memory_dir: Option<PathBuf>,
    /// `cgroup.procs` the supervisor joins, and the one the command joins, open for writing
    /// (close-on-exec): each writes `0` to join.
    supervisor: Option<OwnedFd>,
    command: Option<OwnedFd>,
}

/// Most hierarchies a user's group spans (pids, memory and cpu on cgroup v1).
pub(crate) const MAX_MEMBERS: usize = 3;

/// Numbers the directories of one process's [`ProcessGroups`] (a test process makes many).
static NEXT: AtomicU64 = AtomicU64::new(1);

/// The prefix of a server's directory: `monad-<pid namespace>-<pid>-<n>`.
const PREFIX: &str = "monad-";

impl ProcessGroups {
    /// Makes this server's directories of per-user groups with `bounds`, under `under` (a
    /// cgroup directory), or when `None` under the server's own cgroup of each controller.
    /// Directories left by servers that are gone are removed first. `Err` says why, for the
    /// operator, when `under` is no cgroup or no bound can be had at all; a bound that cannot
    /// be had while another can (on cgroup v1, a named cgroup is in one hierarchy: of pids or
    /// of memory) is left out and listed by [`ProcessGroups::missing`].
    pub fn create(bounds: Bounds, under: Option<&Path>) -> Result<ProcessGroups, String> {
        let wanted = bounds.wanted();
        if wanted.is_empty() {
            return Err("no bound asked for".into());
        }
        let under = match under {
            Some(dir) => {
                let (dir, version) = named(dir)?;
                Under::Named(dir, version)
            }
            None => {
                let read = |path: &str| {
                    fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))
                };
                Under::Own {
                    cgroups: read("/proc/self/cgroup")?,
                    mountinfo: read("/proc/self/mountinfo")?,
                }
            }
        };
        // Where each hierarchy's directory goes (`dir`: the parent), with its controllers.
        let mut places: Vec<Tree> = Vec::new();
        let mut missing = Vec::new();
        for (controller, bound) in wanted {
            match under.place(controller) {
                Ok((dir, version)) => match places.iter_mut().find(|place| place.dir == dir) {
                    Some(place) => place.controllers.push((controller, bound)),
                    None => places.push(Tree {
                        dir,
                        version,
                        controllers: vec![(controller, bound)],
                    }),
                },
                Err(why) => missing.push(controller.missing(&why)),
            }
        }
        let own = matches!(under, Under::Own { .. });
        let mut trees = Vec::new();
        for mut place in places {
            let mut made = make_dir(&place, own);
            // On cgroup v2 the processor shares a place with the others: one it cannot have
            // there (a service delegated `pids memory` only) leaves it out, not them.
            let with_cpu = place.controllers.iter().any(|(c, _)| *c == Controller::Cpu);
            if let Err(why) = made.clone()
                && with_cpu
                && place.controllers.len() > 1
            {
                let all = place.controllers.clone();
                place.controllers.retain(|(c, _)| *c != Controller::Cpu);
                made = make_dir(&place, own);
                if made.is_ok() {
                    missing.push(Controller::Cpu.missing(&why));
                } else {
                    place.controllers = all;
                }
            }
            match made {
                Ok(dir) => {
                    let mut tree = Tree { dir, ..place };
                    if let Err(why) = tree.try_cpu_ceiling() {
                        missing.push(format!(
                            "{} (its ceiling; each user keeps an equal share): {why}",
                            Controller::Cpu.setting()
                        ));
                    }
                    trees.push(tree);
                }
                Err(why) => missing.extend(place.controllers.iter().map(|(c, _)| c.missing(&why))),
            }
        }
        let groups = ProcessGroups {
            trees,
            missing,
            users: Mutex::new(HashMap::new()),
        };
        if groups.trees.is_empty() {
            return Err(groups.missing.join("; "));
        }
        Ok(groups)
    }

    /// This server's directories, for a person: `DIR and DIR`.
    pub fn shown(&self) -> String {
        let dirs: Vec<String> = self.dirs().map(|d| d.display().to_string()).collect();
        dirs.join(" and ")
    }

    /// This server's directories, one per hierarchy.
    pub fn dirs(&self) -> impl Iterator<Item = &Path> {
        self.trees.iter().map(|tree| tree.dir.as_path())
    }

    /// The bounds that could not be had, each with why.
    pub fn missing(&self) -> &[String] {
        &self.missing
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
        let mut members = Vec::new();
        for tree in &self.trees {
            members.push(tree.member(&name)?);
        }
        let group = Arc::new(ProcessGroup { members });
        users.insert(user.to_owned(), group.clone());
        Ok(group)
    }
}

impl Tree {
    /// Sets the processor's ceiling, if any, on a cgroup made for the purpose and removed: a
    /// ceiling the kernel refuses (cgroup v1 refuses one above its parent's; a kernel without
    /// CFS bandwidth control has no such file) is dropped here, at the start, with the reason,
    /// rather than failing every command of every user. The equal share stays.
    fn try_cpu_ceiling(&mut self) -> Result<(), String> {
        let Some(at) = self
            .controllers
            .iter()
            .position(|(c, percent)| *c == Controller::Cpu && *percent > 0)
        else {
            return Ok(());
        };
        let probe = self.dir.join("cpu-ceiling-probe");
        let tried = fs::create_dir(&probe)
            .and_then(|()| limit_cpu(&probe, self.version, self.controllers[at].1));
        let _ = fs::remove_dir(&probe);
        tried.map_err(|e| {
            self.controllers[at].1 = 0;
            format!("the kernel refuses it in {}: {e}", self.dir.display())
        })
    }

    /// `name`'s cgroups in this hierarchy, made (or found) with their bounds.
    fn member(&self, name: &str) -> std::io::Result<Member> {
        let made = |dir: &Path| match fs::create_dir(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
            _ => Ok(()),
        };
        let procs = |dir: &Path| {
            fs::OpenOptions::new()
                .write(true)
                .custom_flags(nix::libc::O_CLOEXEC)
                .open(dir.join("cgroup.procs"))
                .map(OwnedFd::from)
        };
        let bound = |controller| {
            self.controllers
                .iter()
                .find(|(c, _)| *c == controller)
                .map(|(_, bound)| *bound)
        };
        let dir = self.dir.join(name);
        made(&dir)?;
        if let Some(percent) = bound(Controller::Cpu) {
            limit_cpu(&dir, self.version, percent)?;
        }
        if let Some(max) = bound(Controller::Pids) {
            fs::write(
                dir.join(Controller::Pids.limit_file(self.version)),
                max.to_string(),
            )?;
        }
        let (supervisor, command, memory_dir) =
            match (bound(Controller::Pids), bound(Controller::Memory)) {
                (Some(_), Some(memory)) => {
                    if self.version == Version::V2 {
                        give_below(&dir, Controller::Memory)?;
                    }
                    let (tree, command) = (dir.join("tree"), dir.join("command"));
                    made(&tree)?;
                    made(&command)?;
                    limit_memory(&command, self.version, memory)?;
                    (Some(procs(&tree)?), Some(procs(&command)?), Some(command))
                }
                (Some(_), None) => (Some(procs(&dir)?), None, None),
                (None, Some(memory)) => {
                    limit_memory(&dir, self.version, memory)?;
                    (None, Some(procs(&dir)?), Some(dir.clone()))
                }
                // The processor alone (its own hierarchy, on cgroup v1): the supervisor joins,
                // and all the command starts is in it.
                (None, None) if bound(Controller::Cpu).is_some() => {
                    (Some(procs(&dir)?), None, None)
                }
                (None, None) => (None, None, None),
            };
        Ok(Member {
            dir,
            version: self.version,
            controllers: self.controllers.clone(),
            memory_dir,
            supervisor,
            command,
        })
    }
}

/// Bounds the memory of cgroup `dir` to `bytes`, swap included where the kernel accounts it
/// (so that the bound is not passed by swapping out).
fn limit_memory(dir: &Path, version: Version, bytes: u64) -> std::io::Result<()> {
    fs::write(
        dir.join(Controller::Memory.limit_file(version)),
        bytes.to_string(),
    )?;
    let (swap, value) = match version {
        // Memory and swap together, so: as much as memory alone.
        Version::V1 => ("memory.memsw.limit_in_bytes", bytes.to_string()),
        Version::V2 => ("memory.swap.max", "0".to_owned()),
    };
    let swap = dir.join(swap);
    if swap.exists() {
        fs::write(swap, value)?;
    }
    Ok(())
}

/// Where a server makes its directories: under the cgroup the operator named, or under its own
/// cgroup of each controller (from `/proc/self/cgroup` and `/proc/self/mountinfo`).
enum Under {
    Named(PathBuf, Version),
    Own { cgroups: String, mountinfo: String },
}

impl Under {
    /// The cgroup under which `controller`'s directory goes, and its version.
    fn place(&self, controller: Controller) -> Result<(PathBuf, Version), String> {
        match self {
            Under::Named(dir, version) => Ok((dir.clone(), *version)),
            Under::Own { cgroups, mountinfo } => locate(cgroups, mountinfo, controller),
        }
    }
}

/// A cgroup directory the operator named, and its version.
fn named(dir: &Path) -> Result<(PathBuf, Version), String> {
    if dir.join("cgroup.subtree_control").exists() {
        Ok((dir.to_path_buf(), Version::V2))
    } else if dir.join("cgroup.procs").exists() {
        Ok((dir.to_path_buf(), Version::V1))
    } else {
        Err(format!("{} is not a cgroup directory", dir.display()))
    }
}

/// Makes this server's directory under `place.dir` with `place.controllers` (given to the
/// cgroups under it, on cgroup v2). `own`: `place.dir` is the server's own cgroup.
fn make_dir(place: &Tree, own: bool) -> Result<PathBuf, String> {
    let (parent, version) = (&place.dir, place.version);
    sweep(parent);
    if version == Version::V2 {
        for (controller, _) in &place.controllers {
            give_below(parent, *controller).map_err(|e| {
                format!(
                    "the {} controller cannot be enabled for the cgroups under {} ({e}){}",
                    controller.name(),
                    parent.display(),
                    if own {
                        "; that is the server's own cgroup, which cannot have it while it holds \
                         the server's processes: name a cgroup for the commands in [server] \
                         process_cgroup (with systemd: `Delegate=pids memory cpu` and \
                         `DelegateSubgroup=server` in the unit, and the unit's cgroup here)"
                    } else {
                        ""
                    }
                )
            })?;
        }
    }
    let dir = loop {
        let name = format!(
            "{PREFIX}{}-{}-{}",
            pid_namespace(),
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let dir = parent.join(name);
        match fs::create_dir(&dir) {
            Ok(()) => break dir,
            // Left by a process of this number that is gone, and still holding processes.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("cannot make {}: {e}", dir.display())),
        }
    };
    // Removed again if a controller cannot be had there.
    let made = RemovedUnlessKept(Some(&dir));
    for (controller, _) in &place.controllers {
        if version == Version::V2 {
            give_below(&dir, *controller).map_err(|e| {
                format!(
                    "cannot enable {} in {}: {e}",
                    controller.name(),
                    dir.display()
                )
            })?;
        }
        // A hierarchy without the controller has no such file (a named cgroup of another
        // hierarchy, on cgroup v1).
        if !dir.join(controller.limit_file(version)).exists() {
            return Err(format!(
                "{} has no {} controller",
                parent.display(),
                controller.name()
            ));
        }
    }
    made.keep();
    Ok(dir)
}

/// A directory just made, removed when this is dropped unless it is kept.
struct RemovedUnlessKept<'a>(Option<&'a Path>);

impl RemovedUnlessKept<'_> {
    fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for RemovedUnlessKept<'_> {
    fn drop(&mut self) {
        if let Some(dir) = self.0 {
            let _ = fs::remove_dir(dir);
        }
    }
}

impl Drop for ProcessGroups {
    fn drop(&mut self) {
        for tree in &self.trees {
            remove_tree(&tree.dir);
        }
    }
}

impl ProcessGroup {
    /// The cgroups that bound `controller`, with the bound.
    fn member(&self, controller: Controller) -> Option<(&Member, u64)> {
        self.members.iter().find_map(|member| {
            let (_, bound) = member.controllers.iter().find(|(c, _)| *c == controller)?;
            Some((member, *bound))
        })
    }

    /// The group's cgroup directories, one per hierarchy.
    pub fn dirs(&self) -> impl Iterator<Item = &Path> {
        self.members.iter().map(|member| member.dir.as_path())
    }

    /// Processes and threads the group may have at once; `None` when it bounds none.
    pub fn max_processes(&self) -> Option<u64> {
        self.member(Controller::Pids).map(|(_, bound)| bound)
    }

    /// Processes and threads in the group now; `None` when it bounds none, or the kernel's
    /// file cannot be read.
    pub fn processes(&self) -> Option<u64> {
        let (member, _) = self.member(Controller::Pids)?;
        read_number(&member.dir.join("pids.current"))
    }

    /// How many times a `fork` in the group failed at its bound (`pids.events`' `max`).
    pub(crate) fn refusals(&self) -> Option<u64> {
        let (member, _) = self.member(Controller::Pids)?;
        counter(&member.dir.join("pids.events"), "max")
    }

    /// Bytes of memory the group's commands may use; `None` when it bounds none.
    pub fn max_memory(&self) -> Option<u64> {
        self.member(Controller::Memory).map(|(_, bound)| bound)
    }

    /// How many of the group's commands' processes the kernel killed for want of memory, and
    /// how many times the group reached its memory bound (cgroup v2's `oom` event): a kill
    /// counted with no new time at the bound was the host's, not the bound's. On cgroup v1 the
    /// two are the kills.
    pub fn memory_events(&self) -> Option<(u64, u64)> {
        let (member, _) = self.member(Controller::Memory)?;
        let dir = member.memory_dir.as_ref()?;
        match member.version {
            // No count there tells the bound's kills from the host's (`memory.failcnt` stays
            // 0 when the kernel kills at the bound with swap accounted): every kill counts.
            Version::V1 => {
                let kills = counter(&dir.join("memory.oom_control"), "oom_kill")?;
                Some((kills, kills))
            }
            Version::V2 => {
                let events = fs::read_to_string(dir.join("memory.events")).ok()?;
                Some((count(&events, "oom_kill")?, count(&events, "oom")?))
            }
        }
    }

    /// The `cgroup.procs` a command's supervisor writes to, open for writing; -1 for none.
    pub(crate) fn supervisor_joins(&self) -> [RawFd; MAX_MEMBERS] {
        joins(self.members.iter().map(|m| m.supervisor.as_ref()))
    }

    /// The `cgroup.procs` a command's own process writes to just before `exec`; -1 for none.
    pub(crate) fn command_joins(&self) -> [RawFd; MAX_MEMBERS] {
        joins(self.members.iter().map(|m| m.command.as_ref()))
    }
}

/// The descriptors of `fds`, -1 for none, as an array the child can read without allocating.
fn joins<'a>(fds: impl Iterator<Item = Option<&'a OwnedFd>>) -> [RawFd; MAX_MEMBERS] {
    let mut out = [-1; MAX_MEMBERS];
    for (slot, fd) in out.iter_mut().zip(fds.flatten()) {
        *slot = fd.as_raw_fd();
    }
    out
}

/// The number a kernel file holds.
fn read_number(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The count named `key` in a kernel file of `key value` lines.
fn counter(path: &Path, key: &str) -> Option<u64> {
    count(&fs::read_to_string(path).ok()?, key)
}

/// The count named `key` in `key value` lines.
fn count(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        (name == key).then(|| value.trim().parse().ok())?
    })
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

/// Makes `controller` available to the cgroups under `dir` (cgroup v2).
fn give_below(dir: &Path, controller: Controller) -> std::io::Result<()> {
    let control = dir.join("cgroup.subtree_control");
    let enabled = fs::read_to_string(&control)?;
    if enabled.split_whitespace().any(|c| c == controller.name()) {
        return Ok(());
    }
    let mut file = fs::OpenOptions::new().write(true).open(&control)?;
    file.write_all(format!("+{}", controller.name()).as_bytes())
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

/// This process's PID namespace (its inode): servers in other namespaces cannot be asked
/// whether they live, so their directories are left alone.
fn pid_namespace() -> u64 {
    fs::metadata("/proc/self/ns/pid").map_or(0, |m| std::os::unix::fs::MetadataExt::ino(&m))
}

/// Removes the directories under `parent` of servers of this PID namespace whose process is
/// gone (killed before they could remove them).
fn sweep(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    let namespace = pid_namespace().to_string();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|n| n.strip_prefix(namespace.as_str()))
            .and_then(|n| n.strip_prefix('-'))
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

/// Where this process's cgroup of `controller` is, from `/proc/self/cgroup` and
/// `/proc/self/mountinfo`: in a hierarchy of cgroup v1 that has it if there is one, else in the
/// unified hierarchy.
fn locate(
    cgroups: &str,
    mountinfo: &str,
    controller: Controller,
) -> Result<(PathBuf, Version), String> {
    let name = controller.name();
    let entries = cgroups.lines().filter_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        Some((controllers, path))
    });
    let mut unified = None;
    for (controllers, path) in entries {
        if controllers.split(',').any(|c| c == name) {
            let mount = mount_of(mountinfo, path, |fs, options| {
                fs == "cgroup" && options.split(',').any(|o| o == name)
            })
            .ok_or_else(|| format!("the {name} hierarchy of cgroup v1 is not mounted"))?;
            return Ok((within(&mount, path), Version::V1));
        }
        if controllers.is_empty() {
            unified = Some(path);
        }
    }
    let path =
        unified.ok_or_else(|| format!("this process is in no cgroup of the {name} controller"))?;
    let mount =
        mount_of(mountinfo, path, |fs, _| fs == "cgroup2").ok_or("cgroup v2 is not mounted")?;
    let dir = within(&mount, path);
    let controllers = fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
    if !controllers.split_whitespace().any(|c| c == name) {
        return Err(format!(
            "the {name} controller is not available in {} (cgroup v2)",
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

/// The mount in `mountinfo` whose filesystem type and super options pass `wanted` and that
/// shows cgroup `path` (its root holds it), else the first that passes.
fn mount_of(mountinfo: &str, path: &str, wanted: impl Fn(&str, &str) -> bool) -> Option<Mount> {
    let mounts: Vec<Mount> = mountinfo
        .lines()
        .filter_map(|line| {
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
        .collect();
    let shows = mounts
        .iter()
        .position(|mount| Path::new(path).starts_with(&mount.root));
    let mut mounts = mounts;
    match shows {
        Some(at) => Some(mounts.swap_remove(at)),
        None => mounts.into_iter().next(),
    }
}

/// `mountinfo`'s octal escapes (`\040` for a space) decoded ([`super::unescape_octal`]).
fn unescape(field: &str) -> String {
    String::from_utf8_lossy(&super::unescape_octal(field)).into_owned()
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
        let (dir, version) = locate(cgroups, MOUNTS_V1, Controller::Pids).unwrap();
        assert_eq!(
            (dir, version),
            (
                PathBuf::from("/sys/fs/cgroup/pids/user.slice/x"),
                Version::V1
            )
        );
        // Each controller in its own hierarchy.
        let (dir, _) = locate(cgroups, MOUNTS_V1, Controller::Memory).unwrap();
        assert_eq!(dir, PathBuf::from("/sys/fs/cgroup/memory/m"));
        // Listed with other controllers, and mounted at a root of its own (a container's).
        let mounts = "39 31 0:36 /ctr /sys/fs/cgroup/cpu\\054pids rw - cgroup cgroup rw,cpu,pids";
        let (dir, _) = locate("3:cpu,pids:/ctr/job\n", mounts, Controller::Pids).unwrap();
        assert_eq!(dir, PathBuf::from("/sys/fs/cgroup/cpu,pids/job"));
        let err = locate(
            "8:pids:/\n",
            "1 0 0:1 / / rw - ext4 /dev/vda rw",
            Controller::Pids,
        )
        .unwrap_err();
        assert!(err.contains("not mounted"), "{err}");
    }

    #[test]
    fn without_cgroup_v1_the_unified_hierarchy_needs_the_pids_controller() {
        let mounts = "30 23 0:27 / /nowhere/cgroup rw - cgroup2 cgroup2 rw";
        let err = locate("0::/system.slice/monad.service\n", mounts, Controller::Pids).unwrap_err();
        assert!(
            err.contains("/nowhere/cgroup/system.slice/monad.service") && err.contains("v2"),
            "{err}"
        );
        let err = locate(
            "0::/\n",
            "1 0 0:1 / / rw - ext4 /dev/vda rw",
            Controller::Memory,
        )
        .unwrap_err();
        assert!(err.contains("not mounted"), "{err}");
        assert!(locate("", MOUNTS_V1, Controller::Pids).is_err());
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

    /// Makes groups under this process's own cgroups: `None` (said loudly) where that cannot
    /// be done: not as root, or on cgroup v2 from a cgroup that holds processes (a systemd
    /// session's). As root with cgroup v1's pids hierarchy, as where the suite runs, it must.
    fn groups(processes: u64, memory_bytes: u64) -> Option<ProcessGroups> {
        let bounds = Bounds {
            processes,
            memory_bytes,
            cpu_percent: Some(0),
        };
        match ProcessGroups::create(bounds, None) {
            Ok(groups) => Some(groups),
            Err(why)
                if !nix::unistd::geteuid().is_root()
                    || !Path::new("/sys/fs/cgroup/pids/cgroup.procs").exists() =>
            {
                eprintln!("SKIPPED: no process groups here (root, and cgroup v1): {why}");
                None
            }
            Err(why) => panic!("process groups as root: {why}"),
        }
    }

    #[test]
    fn a_users_group_is_bounded_and_the_directory_goes_with_its_server() {
        let Some(both) = groups(77, 64 << 20) else {
            return;
        };
        assert_eq!(both.missing(), [] as [String; 0], "this machine has both");
        let dirs: Vec<PathBuf> = both.dirs().map(Path::to_path_buf).collect();
        let ben = both.for_user("ben").unwrap();
        assert!(Arc::ptr_eq(&ben, &both.for_user("ben").unwrap()));
        let bens: Vec<PathBuf> = ben.dirs().map(Path::to_path_buf).collect();
        assert!(bens.iter().all(|d| d.ends_with("user-ben")), "{bens:?}");
        assert!(
            bens.iter()
                .all(|d| dirs.contains(&d.parent().unwrap().to_path_buf()))
        );
        assert_eq!(ben.max_processes(), Some(77));
        assert_eq!(ben.max_memory(), Some(64 << 20));
        assert_eq!(ben.processes(), Some(0));
        assert_eq!(ben.refusals(), Some(0));
        assert_eq!(ben.memory_events(), Some((0, 0)));
        assert!(
            ben.member(Controller::Cpu).is_some(),
            "the processor is grouped too"
        );
        // The supervisor joins the process bound (and the processor's group where that is a
        // hierarchy of its own, on cgroup v1), the command the memory bound.
        let cpu_apart = ben
            .member(Controller::Cpu)
            .is_some_and(|(member, _)| member.controllers.len() == 1);
        let joined = |fds: [RawFd; MAX_MEMBERS]| fds.iter().filter(|fd| **fd >= 0).count();
        assert_eq!(
            (joined(ben.supervisor_joins()), joined(ben.command_joins())),
            (1 + usize::from(cpu_apart), 1)
        );
        drop(ben);
        drop(both);
        for dir in dirs {
            assert!(!dir.exists(), "{} is left", dir.display());
        }
        // Only the bound asked for.
        let Some(pids) = groups(5, 0) else { return };
        let ben = pids.for_user("ben").unwrap();
        assert_eq!((ben.max_processes(), ben.max_memory()), (Some(5), None));
    }

    /// A processor ceiling the kernel refuses (here: past the largest quota it takes) is
    /// dropped at the start, saying why, and the user's group is still made, with its equal
    /// share: it failed at each user's first command, and so every command of every user.
    #[test]
    fn a_processor_ceiling_the_kernel_refuses_is_dropped_at_the_start() {
        if groups(10, 0).is_none() {
            return;
        }
        let bounds = Bounds {
            processes: 10,
            memory_bytes: 0,
            cpu_percent: Some(u64::MAX / 4),
        };
        let groups = ProcessGroups::create(bounds, None).expect("the groups");
        assert!(
            groups
                .missing()
                .iter()
                .any(|why| why.contains("max_cpu_percent_per_user (its ceiling")),
            "{:?}",
            groups.missing()
        );
        let ben = groups.for_user("ben").expect("the user's group is made");
        assert!(
            ben.member(Controller::Cpu)
                .is_some_and(|(_, ceiling)| ceiling == 0)
        );
        // One the kernel takes is kept.
        let bounds = Bounds {
            cpu_percent: Some(150),
            ..bounds
        };
        let groups = ProcessGroups::create(bounds, None).expect("the groups");
        assert_eq!(groups.missing(), [] as [String; 0]);
        let ben = groups.for_user("ben").expect("the user's group");
        assert!(
            ben.member(Controller::Cpu)
                .is_some_and(|(_, ceiling)| ceiling == 150)
        );
    }

    #[test]
    fn the_directory_of_a_server_that_is_gone_is_swept_and_a_live_ones_is_not() {
        let Some(live) = groups(10, 0) else { return };
        let own = live.dirs().next().unwrap();
        let parent = own.parent().unwrap().to_path_buf();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let left = parent.join(format!("{PREFIX}{}-{dead}-1", pid_namespace()));
        // Another PID namespace's, which cannot be asked about: left alone.
        let other = parent.join(format!("{PREFIX}1-{dead}-1"));
        fs::create_dir(&other).unwrap();
        fs::create_dir(&left).unwrap();
        fs::create_dir(left.join("user-ben")).unwrap();
        let again = groups(10, 0).unwrap();
        assert!(!left.exists(), "{} was not swept", left.display());
        assert!(other.exists());
        fs::remove_dir(&other).unwrap();
        assert!(own.exists() && again.dirs().all(Path::exists));
    }

    /// A command's supervisor joins the process bound and the command the memory bound, with
    /// namespaces and in the fallback: the memory bound's cgroup holds the command alone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_commands_supervisor_and_the_command_join_their_bounds_with_namespaces_and_without() {
        use crate::{ExecPolicy, Limits, NamespacePolicy, Sandbox};
        let Some(groups) = groups(64, 256 << 20) else {
            return;
        };
        let groups = Arc::new(groups);
        let ben = groups.for_user("ben").unwrap();
        let procs = |controller| {
            let (member, _) = ben.member(controller).unwrap();
            let dir = match controller {
                Controller::Pids | Controller::Cpu => &member.dir,
                Controller::Memory => member.memory_dir.as_ref().unwrap(),
            };
            let text = fs::read_to_string(dir.join("cgroup.procs")).unwrap();
            text.lines().map(str::to_owned).collect::<Vec<_>>()
        };
        for namespaces in [NamespacePolicy::Auto, NamespacePolicy::Off] {
            let root = tempfile::tempdir().unwrap();
            let exec = ExecPolicy {
                namespaces,
                ..ExecPolicy::default()
            };
            crate::exec::give_to_command_user(root.path(), &exec).unwrap();
            let sandbox = Sandbox::open(root.path(), Limits::default(), exec)
                .unwrap()
                .in_process_group(groups.clone(), "ben");
            let args = crate::RunCommandArgs {
                argv: ["sleep", "30"].map(String::from).to_vec(),
                background: Some(true),
                ..Default::default()
            };
            let ran = sandbox.run_command(&args).await.unwrap();
            assert!(ran.process.is_some(), "{namespaces:?}: {ran:?}");
            // The supervisor (and init) in the process bound, the command alone in the memory
            // bound.
            assert!(!procs(Controller::Pids).is_empty(), "{namespaces:?}");
            // Where the processor has a hierarchy of its own (cgroup v1), the supervisor joins
            // the user's group there too, and all it starts with it.
            if ben
                .member(Controller::Cpu)
                .is_some_and(|(m, _)| m.controllers.len() == 1)
            {
                assert!(!procs(Controller::Cpu).is_empty(), "{namespaces:?}");
            }
            let commands = procs(Controller::Memory);
            assert_eq!(commands.len(), 1, "{namespaces:?}: {commands:?}");
            let comm = fs::read_to_string(format!("/proc/{}/comm", commands[0])).unwrap();
            assert_eq!(comm.trim(), "sleep", "{namespaces:?}");
            drop(sandbox);
        }
    }

    #[test]
    fn escapes_of_mountinfo_are_decoded() {
        assert_eq!(unescape("/a\\040b\\134c"), "/a b\\c");
        assert_eq!(unescape("/trailing\\04"), "/trailing\\04");
    }
}
